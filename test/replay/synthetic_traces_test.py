#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tests scripts/synthetic-traces: the same seed gives the same files and another seed others,
every allocation is freed once with the size it was asked with, the sizes are those of the
documented shapes, and alloy-replay reads every kind and serves it through the compositions.

    synthetic_traces_test.py GENERATOR ALLOY_REPLAY
"""

import filecmp
import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from checking import check, finish  # noqa: E402 (after the line above)


def events(path):
    with open(path) as f:
        header = f.readline().strip()
        rows = [line.strip().split(",") for line in f]
    return header, rows


def main():
    generator, replay = sys.argv[1], sys.argv[2]
    kinds = ["varseq", "recompute", "lora", "moe", "kvcache", "large"]
    # A large-block trace is a few dozen blocks of 64 MiB-1 GiB: few events by design.
    least_events = {"large": 50}
    with tempfile.TemporaryDirectory() as tmp:
        a, b, c = (os.path.join(tmp, n) for n in "abc")
        for seed, out in ((5, a), (5, b), (6, c)):
            r = subprocess.run([generator, "--seed", str(seed), "-o", out], capture_output=True, text=True)
            check(r.returncode == 0, f"seed {seed} generates", r.stderr)
        names = sorted(os.listdir(a))
        check(names == sorted(f"{k}_seed5.rmm.csv" for k in kinds), "one file per kind", " ".join(names))
        same = all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names)
        check(same, "the same seed gives the same files")
        differ = [k for k in kinds
                  if events(os.path.join(a, f"{k}_seed5.rmm.csv"))[1] != events(os.path.join(c, f"{k}_seed6.rmm.csv"))[1]]
        check(differ == kinds, "another seed gives other traces of every kind", " ".join(differ))

        for name in names:
            header, rows = events(os.path.join(a, name))
            live, wrong, peak, in_use = {}, [], 0, 0
            for row in rows:
                action, address, size = row[2], row[3], int(row[4])
                if action == "allocate":
                    if address in live or size <= 0:
                        wrong.append(row)
                    live[address] = size
                    in_use += size
                    peak = max(peak, in_use)
                elif live.pop(address, None) != size:
                    wrong.append(row)
                else:
                    in_use -= size
            least = least_events.get(name.split("_seed")[0], 1000)
            check(header == "Thread,Time,Action,Pointer,Size,Stream" and not wrong and not live and len(rows) > least,
                  f"{name}: every allocation freed once with its size ({len(rows)} events, peak {peak / 2**30:.2f} GiB)",
                  f"{len(wrong)} wrong rows, first {wrong[:1]}; {len(live)} never freed")

        # Shapes: the first layer of varseq allocates its weights (12 d^2 fp16, d = 1024) first.
        _, rows = events(os.path.join(a, "varseq_seed5.rmm.csv"))
        check(int(rows[0][4]) == 12 * 1024 * 1024 * 2, "varseq starts with a layer's fp16 weights", rows[0][4])

        r = subprocess.run(
            [replay, "--no-progress", "-q", "--min-capacity", "--compositions", "default_allocator,virtual_allocator",
             "--json", os.path.join(tmp, "min.json")] + [os.path.join(a, n) for n in names],
            capture_output=True, text=True)
        check(r.returncode == 0, "alloy-replay --min-capacity reads every kind", r.stderr[-2000:])
        if r.returncode == 0:
            with open(os.path.join(tmp, "min.json")) as f:
                traces = json.load(f)["traces"]
            served = [(t["name"], x["composition"]) for t in traces for x in t["results"]
                      if x["min_capacity"]["found"] and x["faults"] == 0]
            check(len(served) == 2 * len(kinds), "every trace is served by both compositions, without a fault",
                  json.dumps(traces)[:1500])
    return finish()


if __name__ == "__main__":
    sys.exit(main())
