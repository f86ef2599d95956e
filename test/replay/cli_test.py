#!/usr/bin/env python3
"""Tests the alloy-replay program from the outside: its outputs (table, JSON, Markdown, SVG), bad
input stopped or skipped with line numbers, usage errors, and a PyTorch snapshot piped through
the converter. Small traces made here, so it runs in about a second.

    cli_test.py ALLOY_REPLAY CONVERTER
"""

import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

failures = []


def check(condition, what, detail=""):
    print(("ok    " if condition else "FAIL  ") + what)
    if not condition:
        failures.append(what)
        if detail:
            print("      " + detail.replace("\n", "\n      "))


def main():
    replay, converter = sys.argv[1], sys.argv[2]

    def run(*args, stdin=None):
        r = subprocess.run([replay, "--no-progress", *args], input=stdin, capture_output=True, text=stdin is None or isinstance(stdin, str))
        return r

    header = "Thread,Time,Action,Pointer,Size,Stream\n"
    rows = [f"1,0,allocate,{0x1000 + i * 0x100:#x},{(i % 7 + 1) * 300_000},0" for i in range(40)]
    rows += [f"1,0,free,{0x1000 + i * 0x100:#x},{(i % 7 + 1) * 300_000},0" for i in range(0, 40, 2)]
    rows += ["1,0,allocate failure,(nil),99999999999,a0"]
    good_text = header + "\n".join(rows) + "\n"

    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "good.rmm.csv")
        with open(good, "w") as f:
            f.write(good_text)
        bad = os.path.join(tmp, "bad.csv")
        with open(bad, "w") as f:
            f.write(header + "1,0,allocate,0x10,100,0\n1,0,free,0x99,5,0\n1,0,allocate,0x20,7\n1,0,free,0x10,100,0\n")
        cut = os.path.join(tmp, "cut.csv.gz")
        many = [f"1,0,allocate,{0x100000 + i * 0x100:#x},256,0\n1,0,free,{0x100000 + i * 0x100:#x},256,0" for i in range(5000)]
        compressed = gzip.compress((header + "\n".join(many) + "\n").encode())
        with open(cut, "wb") as f:
            f.write(compressed[: len(compressed) // 2])

        # Outputs.
        out_json, out_md, out_svg = (os.path.join(tmp, n) for n in ("r.json", "r.md", "r.svg"))
        r = run("--capacity", "8MiB", "--repeat", "2", "--compositions", "all,whole_device_arena+defrag", "--json", out_json, "--markdown", out_md, "--svg", out_svg, good)
        check(r.returncode == 0, "a good trace replays", r.stderr)
        check("default_allocator" in r.stdout and "reserved/" in r.stdout and "whole_device_arena+defrag" in r.stdout,
              "the table lists every composition asked for", r.stdout)
        check("whole_device_arena " not in r.stdout, "whole_device_arena only when named")
        with open(out_json) as f:
            data = json.load(f)
        trace = data["traces"][0]
        results = {x["composition"]: x for x in trace["results"]}
        check(data["capacity"] == 8 << 20 and trace["events"] == 61 and trace["recorded_failures"] == 1,
              "JSON: settings and trace", json.dumps(trace)[:400])
        arena = results["best_fit_arena"]
        check(arena["failed_requests"] > 0 and arena["served"] + arena["failed_requests"] == arena["requests"] == 41,
              "JSON: a device of 8 MiB fails requests", json.dumps(arena)[:400])
        check(all(x["peak_reserved"] <= 8 << 20 for x in results.values()), "JSON: nobody reserves above the capacity")
        check(all(len(x["ns_per_op_runs"]) == 2 and x["leaked"] == 0 for x in results.values()),
              "JSON: two timed runs each, nothing leaked")
        check(all(len(x["series"]["reserved"]) == len(x["series"]["event"]) > 0 for x in results.values()),
              "JSON: series of reserved bytes")
        with open(out_md) as f:
            md = f.read()
        check("| good |" in md and "<details>" in md, "Markdown: summary and details", md[:300])
        root = ET.parse(out_svg).getroot()
        check(root.tag.endswith("svg") and len(root.findall("{http://www.w3.org/2000/svg}polyline")) >= len(results),
              "SVG: well-formed, a line per composition")

        # Bad input: stop (default) or skip, with the line numbers.
        r = run("--compositions", "best_fit_arena", bad)
        check(r.returncode == 1 and f"{bad}:3: free of pointer 0x99 that is not live" in r.stderr and "stopped" in r.stderr,
              "a bad row stops the replay with FILE:LINE", r.stderr)
        r = run("--compositions", "best_fit_arena", "--on-error=skip", bad)
        check(r.returncode == 0 and f"{bad}:3: free of pointer 0x99" in r.stderr and f"{bad}:4: expected 6 fields" in r.stderr
              and "(skipped)" in r.stderr and "best_fit_arena" in r.stdout and "2 bad rows skipped" in r.stdout,
              "--on-error=skip reports each bad row and goes on", r.stderr + r.stdout)
        r = run("--compositions", "best_fit_arena", cut)
        check(r.returncode == 1 and "truncated or corrupt" in r.stderr, "a truncated gzip file stops with a message", r.stderr)
        r = run("--compositions", "best_fit_arena", "--on-error", "skip", cut, good)
        check(r.returncode == 0 and "truncated" in r.stderr and r.stdout.count("best_fit_arena") == 2,
              "--on-error=skip replays what a truncated file holds, then the next trace", r.stderr)
        r = run(os.path.join(tmp, "missing.csv"))
        check(r.returncode == 1 and "missing.csv: cannot open" in r.stderr, "a missing file is named", r.stderr)

        # Usage errors.
        for args, what in (
            (["--capacity", "lots", good], "cannot read 'lots'"),
            (["--compositions", "nope", good], "unknown composition 'nope'"),
            (["--compositions", "whole_device_arena", good], "needs a device of finite capacity"),
            (["--svg", out_svg, good, good], "--svg draws one trace"),
            (["--frobnicate", good], "unknown option"),
            ([], "no trace given"),
        ):
            r = run(*args)
            check(r.returncode == 2 and what in r.stderr, f"usage error: {what}", r.stderr)
        r = run("--list")
        check(r.returncode == 0 and "std_pmr_pool" in r.stdout and "(peer)" in r.stdout, "--list")

        # A snapshot: refused with the command to convert it, then piped through the converter.
        snapshot = os.path.join(tmp, "snap.pickle")
        with open(snapshot, "wb") as f:
            pickle.dump({"device_traces": [[
                {"action": "alloc", "addr": 0x1000, "size": 1 << 20, "stream": 0, "time_us": 5},
                {"action": "alloc", "addr": 0x200000, "size": 512, "stream": 0, "time_us": 6},
                {"action": "free_requested", "addr": 0x1000, "size": 1 << 20, "stream": 0, "time_us": 7},
            ]]}, f)
        r = run(snapshot)
        check(r.returncode == 1 and "snapshot-to-rmm-csv" in r.stderr, "a pickle is refused with the converter's name", r.stderr)
        csv = subprocess.run([sys.executable, converter, snapshot], capture_output=True).stdout
        r = subprocess.run([replay, "--no-progress", "--compositions", "alloy", "--json", "-", "-q", "-"], input=csv,
                           capture_output=True)
        piped = json.loads(r.stdout)["traces"][0] if r.returncode == 0 else {}
        check(piped.get("events") == 3 and piped.get("peak_live_bytes") == (1 << 20) + 512,
              "converter | alloy-replay - : the snapshot replays", r.stderr.decode())

    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
