# SPDX-License-Identifier: Apache-2.0
"""alloy.configure and ALLOY_CONF, each case in a fresh interpreter (configuration is once per
process)."""

import unittest

from support import run_python

PRELUDE = "import alloy, json\n"


class Configure(unittest.TestCase):
    def run_ok(self, code, conf=None):
        value, result = run_python(PRELUDE + code, conf)
        self.assertEqual(result.returncode, 0, result.stderr)
        return value

    def test_alloy_conf_is_read_at_first_use(self):
        value = self.run_ok(
            "print(json.dumps([alloy.device_count(), alloy.configuration()]))",
            conf="backend:host,devices:3",
        )
        self.assertEqual(value[0], 3)
        self.assertIn("devices:3", value[1])
        self.assertIn("backend:host", value[1])

    def test_configure_by_string_and_by_dict(self):
        value = self.run_ok(
            "alloy.configure('backend:host,devices:2,composition:default')\n"
            "print(json.dumps([alloy.device_count(), alloy.configuration()]))"
        )
        self.assertEqual(value[0], 2)
        self.assertIn("composition:default", value[1])
        value = self.run_ok(
            "alloy.configure({'backend': 'host', 'devices': 4})\n"
            "print(json.dumps(alloy.device_count()))"
        )
        self.assertEqual(value, 4)

    def test_history_turned_on_and_off_after_the_start(self):
        # As torch.cuda.memory._record_memory_history() does it once alloy.torch patched it, on a
        # library configured without history.
        value = self.run_ok(
            "import sys, alloy.torch\n"
            "from alloy import _lib\n"
            "record = alloy.torch._replacements()['_record_memory_history']\n"
            "lib, out = _lib.lib(), {}\n"
            "def pair(size, device):\n"
            "    p = lib.alloy_torch_malloc(size, device, None)\n"
            "    lib.alloy_torch_free(p, size, device, None)\n"
            "    return p\n"
            "def traces():\n"
            "    return alloy.snapshot()['device_traces']\n"
            "pair(5000, 1)\n"
            "out['off'] = traces()\n"
            "record(max_entries=3)\n"
            "p = pair(7000, 1)\n"
            "newest = traces()[1][-1]\n"
            "out['three'] = [len(t) for t in traces()]\n"
            "out['newest'] = [newest['action'], newest['addr'] == p, newest['size']]\n"
            "record(None)\n"
            "pair(7000, 1)\n"
            "out['none'] = traces()\n"
            "record(max_entries=sys.maxsize)\n"
            "pair(8000, 0)\n"
            "out['default'] = [len(t) for t in traces()]\n"
            "record('state')\n"
            "out['state'] = traces()\n"
            "out['refused'] = []\n"
            "for bad in (-1, 1.5, True, alloy.MAX_HISTORY + 1, 1 << 64):\n"
            "    try:\n"
            "        alloy.record_memory_history(bad)\n"
            "    except ValueError:\n"
            "        out['refused'].append(repr(bad))\n"
            "print(json.dumps(out))",
            conf="backend:host,devices:2",
        )
        self.assertEqual(value["off"], [[], []])
        self.assertEqual(value["three"], [0, 3])  # device 0 kept nothing, device 1 its last three
        self.assertEqual(value["newest"], ["free_completed", True, 7000])
        self.assertEqual(value["none"], [[], []])
        self.assertEqual(value["default"][1], 0)
        self.assertGreaterEqual(value["default"][0], 2)  # the alloc and the free, at least
        self.assertEqual(value["state"], [[], []])
        self.assertEqual(len(value["refused"]), 5, value["refused"])

    def test_unknown_key_names_it_and_leaves_alloy_unconfigured(self):
        value = self.run_ok(
            "try:\n    alloy.configure('backend:host,colour:blue')\n"
            "except ValueError as e:\n    message = str(e)\n"
            "alloy.configure('backend:host,devices:2')\n"
            "print(json.dumps([message, alloy.device_count()]))"
        )
        self.assertIn("colour", value[0])
        self.assertEqual(value[1], 2)

    def test_bad_values_name_them(self):
        for conf, named in (
            ("capacity:lots", "lots"),
            ("composition:nonsense", "nonsense"),
            ("backend:quantum", "quantum"),
            ("history:-3", "-3"),
            ("devices:many", "many"),
            ("backend", "backend"),
        ):
            value = self.run_ok(
                f"try:\n    alloy.configure('{conf}')\n    print(json.dumps(None))\n"
                "except ValueError as e:\n    print(json.dumps(str(e)))"
            )
            self.assertIsNotNone(value, f"{conf} accepted")
            self.assertIn(named, value, conf)

    def test_configure_twice_before_use_the_last_wins(self):
        value = self.run_ok(
            "alloy.configure('backend:host,devices:3')\n"
            "alloy.configure('backend:host,devices:2')\n"
            "print(json.dumps(alloy.device_count()))"
        )
        self.assertEqual(value, 2)

    def test_configure_after_use(self):
        value = self.run_ok(
            "alloy.memory_stats(0)\n"
            "try:\n    alloy.configure('backend:host,devices:2')\n    print(json.dumps(None))\n"
            "except RuntimeError as e:\n    print(json.dumps([str(e), alloy.device_count()]))",
            conf="backend:host",
        )
        self.assertIsNotNone(value)
        self.assertEqual(value[1], 1, "a refused configuration changed the library")

    def test_a_bad_alloy_conf_is_reported_at_first_use(self):
        value, result = run_python(
            PRELUDE + "try:\n    alloy.device_count()\n    print(json.dumps(None))\n"
            "except (RuntimeError, ValueError) as e:\n    print(json.dumps(str(e)))",
            conf="backend:host,colour:blue",
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(value and "colour" in value, value)


if __name__ == "__main__":
    unittest.main()
