#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tests scripts/snapshot-to-rmm-csv: the shipped PyTorch snapshot pickles convert to exactly the
shipped RMM CSV of the same run, and the converter's rules (free_requested, early frees, oom rows,
refused classes) on small hand-made snapshots.

    snapshot_converter_test.py CONVERTER TRACE_DIR

Prints "SKIPPED: ..." and exits 77 (CTest's skip code here) when the shipped traces are absent
and nothing else failed. Standard library only.
"""

import gzip
import importlib.machinery
import importlib.util
import io
import os
import pickle
import subprocess
import sys
import tempfile

failures = []


def check(condition, what):
    print(("ok    " if condition else "FAIL  ") + what)
    if not condition:
        failures.append(what)


def load_converter(path):
    loader = importlib.machinery.SourceFileLoader("snapshot_to_rmm_csv", path)
    spec = importlib.util.spec_from_loader("snapshot_to_rmm_csv", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def run(converter, *args, stdin=None):
    return subprocess.run([sys.executable, converter, *args], input=stdin, capture_output=True)


def main():
    converter, trace_dir = sys.argv[1], sys.argv[2]
    conv = load_converter(converter)

    # The rules, on a snapshot made here.
    snapshot = {
        "segments": [],
        "device_traces": [
            [
                {"action": "alloc", "addr": 0x1000, "size": 512, "stream": 0, "time_us": 1_000_000_123_456},
                {"action": "free_requested", "addr": 0x9000, "size": 4096, "stream": 0x7F, "time_us": 1_000_000_123_500},
                {"action": "free_completed", "addr": 0x9000, "size": 4096, "stream": 0x7F, "time_us": 1_000_000_123_501},
                {"action": "oom", "addr": 123, "size": 1 << 40, "stream": 0, "time_us": 1_000_000_123_600},
                {"action": "segment_alloc", "addr": 0xA000, "size": 1 << 21, "stream": 0, "time_us": 1_000_000_123_700},
                {"action": "free_requested", "addr": 0x1000, "size": 512, "stream": 0, "time_us": 1_000_000_123_800},
            ]
        ],
    }
    lines = conv.convert(snapshot)
    check(lines[0] == "Thread,Time,Action,Pointer,Size,Stream", "header")
    check(lines[1] == "1,13:46:40.123456,allocate,0x9000,4096,7f", "a block freed but allocated before the recording comes first")
    check(lines[2] == "1,13:46:40.123456,allocate,0x1000,512,0", "alloc -> allocate, UTC time of day")
    check(lines[3] == "1,13:46:40.123500,free,0x9000,4096,7f", "free_requested -> free, stream in hex")
    check(lines[4] == "1,13:46:40.123600,allocate failure,(nil),1099511627776,0", "oom -> allocate failure")
    check(len(lines) == 6, "free_completed and segment events left out")

    only_completed = {"device_traces": [[{"action": "alloc", "addr": 16, "size": 8, "stream": 0},
                                          {"action": "free_completed", "addr": 16, "size": 8, "stream": 0}]]}
    check(conv.convert(only_completed)[1:] == ["1,0,allocate,0x10,8,0", "1,1,free,0x10,8,0"],
          "free_completed used when there is no free_requested; event index without times")

    with tempfile.TemporaryDirectory() as tmp:
        evil = os.path.join(tmp, "evil.pickle")
        with open(evil, "wb") as f:
            f.write(pickle.dumps({"device_traces": [[]], "x": os.system}))  # would run code if trusted
        result = run(converter, evil)
        check(result.returncode == 1 and b"refusing to load" in result.stderr, "a pickle with a class is refused")
        no_trace = os.path.join(tmp, "segments.pickle")
        with open(no_trace, "wb") as f:
            pickle.dump({"segments": []}, f)
        result = run(converter, no_trace)
        check(result.returncode == 1 and b"_record_memory_history" in result.stderr,
              "a snapshot without a trace says how to record one")
        result = run(converter, os.path.join(tmp, "missing.pickle"))
        check(result.returncode == 1 and b"missing.pickle" in result.stderr, "a missing file is named")
        good = os.path.join(tmp, "small.pickle")
        with open(good, "wb") as f:
            pickle.dump(snapshot, f)
        out = os.path.join(tmp, "small.csv.gz")
        result = run(converter, good, "-o", out)
        with gzip.open(out, "rt") as f:
            check(result.returncode == 0 and f.read().splitlines() == lines, "-o FILE.gz writes gzip")
    try:
        conv.load_snapshot(pickle.dumps(io.BytesIO()))
        check(False, "load_snapshot refuses classes")
    except pickle.UnpicklingError:
        check(True, "load_snapshot refuses classes")

    # The shipped pickles against the shipped CSVs of the same runs.
    snapshots = os.path.join(trace_dir, "pytorch-snapshots")
    compared = 0
    if os.path.isdir(snapshots):
        for name in sorted(os.listdir(snapshots)):
            if not name.endswith(".pickle"):
                continue
            csv = os.path.join(trace_dir, "pytorch", name[: -len(".pickle")] + ".rmm.csv.gz")
            if not os.path.exists(csv):
                continue
            result = run(converter, os.path.join(snapshots, name))
            with gzip.open(csv, "rb") as f:
                expected = f.read()
            check(result.returncode == 0 and result.stdout == expected, f"{name} converts to the shipped CSV, byte for byte")
            compared += 1
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    if compared == 0:
        print(f"SKIPPED: no shipped snapshots with their CSVs under {trace_dir} (the shared trace folder is missing)")
        return 77
    print(f"all checks passed ({compared} shipped snapshots compared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
