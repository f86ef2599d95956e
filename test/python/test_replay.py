# SPDX-License-Identifier: Apache-2.0
"""alloy.replay: a PyTorch memory snapshot replayed through liballoy (backend:host) in child
interpreters. The snapshot's rules on hand-made snapshots, exact peaks on random ones checked
against a model, the smallest-device search's bracket, the command line, and the shipped
snapshots against the RMM CSVs converted from them (ALLOY_TRACE_DIR)."""

import gzip
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from support import CLONE, alloy  # noqa: F401  (support puts the clone's package first)
from alloy import replay

MiB = 1 << 20


def event(action, addr, size, stream=0, time_us=None):
    e = {"action": action, "addr": addr, "size": size, "stream": stream}
    if time_us is not None:
        e["time_us"] = time_us
    return e


def segment(address, total, blocks, device=0):
    return {"device": device, "address": address, "total_size": total, "blocks": blocks}


def random_snapshot(seed, operations=600, streams=3):
    """A snapshot of random allocations and frees on several streams, with blocks live throughout
    and blocks freed in the trace but allocated before it; returns (snapshot, model peak live)."""
    rng = random.Random(seed)
    sizes = lambda: rng.choice((512, 512 * rng.randint(1, 2048), MiB * rng.randint(1, 64)))  # noqa
    throughout = [(0x10_0000_0000 + i * (1 << 30), sizes()) for i in range(rng.randint(1, 6))]
    before = [(0x20_0000_0000 + i * (1 << 30), sizes()) for i in range(rng.randint(1, 6))]
    live = dict(before)
    live_bytes = sum(size for _, size in throughout) + sum(live.values())
    peak, events, next_addr = live_bytes, [], 0x30_0000_0000
    for _ in range(operations):
        if live and rng.random() < 0.45:
            addr = rng.choice(sorted(live))
            size = live.pop(addr)
            stream = rng.randrange(streams)
            events.append(event("free_requested", addr, size, stream))
            events.append(event("free_completed", addr, size, stream))
            live_bytes -= size
        else:
            size = sizes()
            events.append(event("alloc", next_addr, size, rng.randrange(streams)))
            live[next_addr] = size
            next_addr += 1 << 30
            live_bytes += size
            peak = max(peak, live_bytes)
    blocks = [{"address": a, "size": s, "state": "active_allocated"} for a, s in throughout]
    blocks += [{"address": a, "size": s, "state": "active_allocated"} for a, s in live.items()]
    snapshot = {"segments": [segment(0x10_0000_0000, 1 << 44, blocks)], "device_traces": [events]}
    return snapshot, peak


class Rules(unittest.TestCase):
    def test_a_made_snapshot(self):
        snapshot = {
            "segments": [
                segment(
                    0x1000_0000,
                    8 * MiB,
                    [
                        {"address": 0x1000_0000, "size": MiB, "state": "active_allocated"},
                        {"address": 0x1010_0000, "size": 2 * MiB, "state": "active_allocated"},
                        {"address": 0x1030_0000, "size": MiB, "state": "inactive"},
                    ],
                ),
                segment(0x9000_0000, 4 * MiB, [], device=1),  # another device's
            ],
            "device_traces": [
                [
                    event("segment_alloc", 0x1000_0000, 8 * MiB),
                    event("alloc", 0x1010_0000, 2 * MiB, stream=7),
                    event("free_requested", 0x2000_0000, 3 * MiB),  # allocated before
                    event("free_completed", 0x2000_0000, 3 * MiB),
                    event("oom", 0, 1 << 40),
                    event("segment_free", 0x2000_0000, 16 * MiB),
                ]
            ],
        }
        trace = replay.Trace(snapshot)
        self.assertEqual(trace.throughout, (1, MiB))  # 0x1010_0000 is the trace's own
        self.assertEqual((trace.allocations, trace.frees, trace.ooms_recorded), (3, 1, 1))
        self.assertEqual(trace.streams, 2)
        self.assertEqual(trace.peak_live, 6 * MiB)  # 1 throughout + 3 before, then 2 more
        self.assertEqual(trace.pytorch_reserved, 8 * MiB)
        self.assertEqual(trace.pytorch_peak_reserved, 24 * MiB)  # 16 freed at the end, 8 kept
        events, early = replay.trace_events(snapshot)
        self.assertEqual([e.action for e in events], ["alloc", "free", "oom"])
        self.assertEqual([(e.addr, e.index) for e in early], [(0x2000_0000, 2)])

    def test_free_completed_when_no_free_requested(self):
        snapshot = {
            "device_traces": [[event("alloc", 16, 512), event("free_completed", 16, 512)]],
        }
        trace = replay.Trace(snapshot)
        self.assertEqual((trace.allocations, trace.frees, trace.peak_live), (1, 1, 512))
        self.assertIsNone(trace.pytorch_peak_reserved)

    def test_bad_snapshots(self):
        with self.assertRaisesRegex(ValueError, "_record_memory_history"):
            replay.Trace({"segments": []})
        with self.assertRaisesRegex(ValueError, "no trace for device 3"):
            replay.Trace({"device_traces": [[]]}, device=3)
        with self.assertRaisesRegex(pickle.UnpicklingError, "refusing"):
            replay.read_snapshot(pickle.dumps(Path("x")))
        with self.assertRaisesRegex(TypeError, "path, bytes or a dict"):
            replay.read_snapshot(5)
        for bad in (event("alloc", 16, -1), event("alloc", "16", 512), event("oom", 0, 1.5), 7):
            with self.assertRaisesRegex(ValueError, "event 1 of device 0's trace"):
                replay.Trace({"device_traces": [[event("alloc", 8, 512), bad]]})
        block = {"address": 64, "size": None, "state": "active_allocated"}
        with self.assertRaisesRegex(ValueError, "address 64, size None"):
            replay.Trace({"segments": [segment(0, MiB, [block])], "device_traces": [[]]})
        malformed = [  # each a ValueError naming what is wrong, never a TypeError
            ("segments are not a list", {"segments": 5}),
            ("segment 1 of the snapshot is not a dict", {"segments": [segment(0, MiB, []), 3]}),
            ("segment 0 .* blocks are not a list", {"segments": [segment(0, MiB, 7)]}),
            ("segment 0 .* blocks are not a list", {"segments": [segment(0, MiB, [block, 7])]}),
            ("device and total_size, not '0', 1", {"segments": [segment(0, 1, [], device="0")]}),
            ("device and total_size, not 0, 'x'", {"segments": [segment(0, "x", [])]}),
        ]
        for message, snapshot in malformed:
            with self.assertRaisesRegex(ValueError, message):
                replay.Trace(dict(snapshot, device_traces=[[]]))
        with self.assertRaisesRegex(ValueError, "device 0's trace is not a list"):
            replay.Trace({"device_traces": [5]})
        grows_by_half = [event("alloc", 8, 512), event("segment_map", 0, 0.5)]
        with self.assertRaisesRegex(ValueError, r"event 1 .*\(segment_map\) .* not 0.5"):
            replay.Trace({"device_traces": [grows_by_half]})
        with self.assertRaisesRegex(ValueError, "composition is one of"):
            replay.replay(replay.Trace({"device_traces": [[]]}), "cuda")


class Replays(unittest.TestCase):
    def test_peaks_are_exact_on_random_snapshots(self):
        for seed in (11, 12, 13):
            snapshot, peak = random_snapshot(seed)
            trace = replay.Trace(snapshot)
            self.assertEqual(trace.peak_live, peak, f"seed {seed}")
            for composition in replay.COMPOSITIONS:
                with self.subTest(seed=seed, composition=composition):
                    result = replay.replay(trace, composition)
                    self.assertTrue(result.served, result.oom)
                    self.assertEqual(result.peak_in_use, peak)
                    self.assertGreaterEqual(result.peak_reserved, peak)

    def test_the_smallest_device_is_bracketed(self):
        for seed, composition in ((21, "virtual"), (22, "default"), (23, "caching")):
            with self.subTest(seed=seed, composition=composition):
                trace = replay.Trace(random_snapshot(seed, operations=300)[0])
                search = replay.smallest_device(trace, composition, precision=0.01)
                held = replay.replay(trace, composition).peak_reserved
                hinted = replay.smallest_device(trace, composition, precision=0.01, upper=held)
                self.assertLessEqual(hinted.replays, search.replays)
                self.assertGreaterEqual(hinted.capacity, trace.peak_live)
                self.assertTrue(replay.replay(trace, composition, hinted.capacity).served)
                self.assertGreaterEqual(search.capacity, trace.peak_live)
                self.assertTrue(replay.replay(trace, composition, search.capacity).served)
                if search.largest_failing:
                    self.assertLessEqual(
                        search.capacity - search.largest_failing, 0.01 * search.capacity
                    )
                    failed = replay.replay(trace, composition, search.largest_failing)
                    self.assertFalse(failed.served)
                    self.assertIn("out of memory", search.oom.lower() + failed.oom.lower())
                    self.assertLess(failed.failed_at, len(trace.ops) // 4)

    def test_a_device_below_the_peak_fails(self):
        trace = replay.Trace(random_snapshot(31, operations=200)[0])
        result = replay.replay(trace, "virtual", trace.peak_live // 2)
        self.assertFalse(result.served)
        self.assertGreater(result.failed_size, 0)
        self.assertTrue(result.oom)


class CommandLine(unittest.TestCase):
    def run_cli(self, *args):
        environment = dict(os.environ, PYTHONPATH=str(CLONE / "python"))
        return subprocess.run(
            [sys.executable, "-m", "alloy.replay", *args],
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def test_table_json_and_errors(self):
        snapshot, peak = random_snapshot(41, operations=200)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.pickle.gz")
            with gzip.open(path, "wb") as file:
                pickle.dump(snapshot, file, protocol=4)
            table = self.run_cli(path)
            self.assertEqual(table.returncode, 0, table.stderr)
            self.assertIn("model.pickle.gz, device 0", table.stdout)
            for row in ("peak live", "PyTorch (reserved at the snapshot)", "alloy virtual"):
                self.assertIn(row, table.stdout)
            figures = self.run_cli("--json", "--composition", "virtual", path)
            self.assertEqual(figures.returncode, 0, figures.stderr)
            value = json.loads(figures.stdout)
            self.assertEqual(value["peak_live"], peak)
            self.assertEqual(list(value["compositions"]), ["virtual"])
            self.assertGreaterEqual(value["compositions"]["virtual"]["smallest_device"], peak)

            evil = os.path.join(tmp, "evil.pickle")
            with open(evil, "wb") as file:
                pickle.dump(Path("/"), file)
            refused = self.run_cli(evil)
            self.assertEqual(refused.returncode, 1)
            self.assertIn("refusing to load", refused.stderr)
            no_trace = os.path.join(tmp, "no_trace.pickle")
            with open(no_trace, "wb") as file:
                pickle.dump({"segments": []}, file)
            self.assertIn("_record_memory_history", self.run_cli(no_trace).stderr)
            self.assertEqual(self.run_cli(os.path.join(tmp, "missing.pickle")).returncode, 1)
            self.assertEqual(self.run_cli("--composition", "cuda", path).returncode, 2)
            self.assertEqual(self.run_cli("--precision", "0", path).returncode, 2)


TRACES = Path(os.environ.get("ALLOY_TRACE_DIR", CLONE.parent / "shared" / "traces"))
SHIPPED = sorted((TRACES / "pytorch-snapshots").glob("*.pickle"))


def csv_peak_live(path):
    live, size_of, peak = 0, {}, 0
    with gzip.open(path, "rt") as file:
        next(file)
        for line in file:
            _, _, action, pointer, size, _ = line.rstrip("\n").split(",")
            if action == "allocate":
                size_of[pointer] = int(size)
                live += int(size)
                peak = max(peak, live)
            elif action == "free":
                live -= size_of.pop(pointer)
    return peak


@unittest.skipUnless(SHIPPED, f"no PyTorch snapshots in {TRACES / 'pytorch-snapshots'}")
class ShippedSnapshots(unittest.TestCase):
    def test_the_replay_matches_the_converted_trace(self):
        for path in SHIPPED:
            with self.subTest(snapshot=path.name):
                trace = replay.load_snapshot(path)
                converted = TRACES / "pytorch" / path.name.replace(".pickle", ".rmm.csv.gz")
                # The blocks live throughout are the only ones the CSV lacks.
                self.assertEqual(trace.peak_live - trace.throughout[1], csv_peak_live(converted))
                result = replay.replay(trace, "virtual")
                self.assertTrue(result.served, result.oom)
                self.assertEqual(result.peak_in_use, trace.peak_live)

    def test_the_readme_example_runs(self):
        example = CLONE / "examples" / "replay_snapshot.py"
        environment = dict(os.environ, PYTHONPATH=str(CLONE / "python"))
        result = subprocess.run(
            [sys.executable, str(example), str(SHIPPED[0])],
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(
            result.stdout, r"^alloy needs \d+\.\d{3}x .* PyTorch had reserved \d+\.\d{3}x"
        )


if __name__ == "__main__":
    unittest.main()
