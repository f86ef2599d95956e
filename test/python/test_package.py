# SPDX-License-Identifier: Apache-2.0
"""The package as users get it: `pip install ./python` (offline), where it finds liballoy, and
that it imports without torch or cupy."""

import ctypes.util
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest
from pathlib import Path

from support import CLONE, _lib, run_python

LIBRARY = Path(_lib.path()).resolve()
FIND_AND_REPORT = (
    "import alloy, json\nfrom alloy import _lib\n"
    "print(json.dumps([alloy.__file__, _lib.path(), alloy.device_count()]))"
)
HAS_PIP = importlib.util.find_spec("pip") is not None
REPLAY_ONE_BLOCK = (  # alloy.replay's child interpreters find the same package and library
    "import json\nfrom alloy import replay\n"
    "trace = replay.Trace({'device_traces': [[{'action': 'alloc', 'addr': 1, 'size': 4096}]]})\n"
    "result = replay.replay(trace, 'default')\n"
    "print(json.dumps([replay.__file__, result.served, result.peak_in_use]))"
)


def pip_install(*where):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--no-warn-script-location",
            "--quiet",
            *where,
            str(CLONE / "python"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )


class Package(unittest.TestCase):
    def test_imports_without_torch_or_cupy(self):
        value, result = run_python(
            "import sys, json, alloy, alloy.torch, alloy.cupy\n"
            "print(json.dumps(sorted({'torch', 'cupy'} & set(sys.modules))))"
        )
        self.assertEqual(value, [], result.stderr)

    @unittest.skipIf(importlib.util.find_spec("torch"), "torch is installed here")
    def test_torch_install_without_torch_says_so(self):
        _, result = run_python("import alloy\nalloy.torch.install()", conf="backend:host")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("No module named 'torch'", result.stderr)

    @unittest.skipIf(importlib.util.find_spec("cupy"), "cupy is installed here")
    def test_cupy_install_without_cupy_says_so(self):
        _, result = run_python("import alloy\nalloy.cupy.install()", conf="backend:host")
        self.assertIn("No module named 'cupy'", result.stderr)

    def test_alloy_library_names_the_file(self):
        _, result = run_python(
            "import alloy\nalloy.device_count()", env={"ALLOY_LIBRARY": "/nowhere/liballoy.so"}
        )
        self.assertIn("OSError", result.stderr)
        self.assertIn("/nowhere/liballoy.so", result.stderr)

    @unittest.skipIf(ctypes.util.find_library("alloy"), "a liballoy is installed system-wide")
    def test_no_library_anywhere_lists_what_was_tried(self):
        with tempfile.TemporaryDirectory() as folder:
            shutil.copytree(CLONE / "python" / "alloy", Path(folder) / "alloy")
            _, result = run_python(
                "import alloy\nalloy.device_count()", path=folder, unset=("ALLOY_LIBRARY",)
            )
        self.assertIn("liballoy.so not found", result.stderr)
        self.assertIn(str(Path(folder).resolve() / "alloy" / "liballoy.so"), result.stderr)
        self.assertIn("find_library", result.stderr)

    def test_the_build_tree_is_found_from_the_clone(self):
        if not any(CLONE.glob("build*/**/liballoy.so")):
            self.skipTest("liballoy.so is not under the clone's build folders")
        value, result = run_python(FIND_AND_REPORT, conf="backend:host", unset=("ALLOY_LIBRARY",))
        self.assertIsNotNone(value, result.stderr)
        self.assertTrue(Path(value[1]).resolve().is_relative_to(CLONE), value[1])

    @unittest.skipUnless(HAS_PIP, "pip is not installed")
    def test_pip_install_target_with_the_library_inside_the_package(self):
        with tempfile.TemporaryDirectory() as folder:
            pip_install("--target", folder)
            (Path(folder) / "alloy" / "liballoy.so").symlink_to(LIBRARY)
            value, result = run_python(
                FIND_AND_REPORT,
                conf="backend:host,devices:2",
                path=folder,
                unset=("ALLOY_LIBRARY",),
            )
            self.assertIsNotNone(value, result.stderr)
            self.assertEqual(Path(value[0]).parent, Path(folder) / "alloy")
            self.assertEqual(value[1], str(Path(folder).resolve() / "alloy" / "liballoy.so"))
            self.assertEqual(value[2], 2)
            value, result = run_python(REPLAY_ONE_BLOCK, path=folder, unset=("ALLOY_LIBRARY",))
            self.assertIsNotNone(value, result.stderr)
            self.assertEqual(Path(value[0]).parent, Path(folder) / "alloy")
            self.assertEqual(value[1:], [True, 4096])

    @unittest.skipUnless(HAS_PIP, "pip is not installed")
    def test_pip_install_prefix_beside_cmake_installs_lib(self):
        with tempfile.TemporaryDirectory() as prefix:
            pip_install("--prefix", prefix)
            purelib = sysconfig.get_path("purelib", vars={"base": prefix, "platbase": prefix})
            lib = Path(purelib).parents[1]  # prefix/lib (above python3.X/site-packages)
            (lib / "liballoy.so").symlink_to(LIBRARY)
            value, result = run_python(
                FIND_AND_REPORT, conf="backend:host", path=purelib, unset=("ALLOY_LIBRARY",)
            )
            self.assertIsNotNone(value, result.stderr)
            self.assertEqual(Path(value[0]).parent, Path(purelib) / "alloy")
            self.assertEqual(Path(value[1]), lib.resolve() / "liballoy.so")


if __name__ == "__main__":
    unittest.main()
