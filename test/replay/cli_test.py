#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
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

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from checking import check, finish  # noqa: E402 (after the line above)


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
        first = arena["first_failed_allocation"]
        check(first is not None and 1 <= first["event"] <= 60 and first["bytes"] % 300_000 == 0
              and first["bytes"] + first["reserved"] > 8 << 20 and first["in_use"] <= first["reserved"] <= 8 << 20,
              "JSON: the first failed allocation, with what was held then", json.dumps(first))
        check(all((x["first_failed_allocation"] is None) == (x["served_all"] or x["faults"] > 0) for x in results.values()),
              "JSON: a first failed allocation exactly when an allocation failed",
              json.dumps([(x["composition"], x["served_all"], x["first_failed_allocation"]) for x in results.values()]))
        check(r.stdout.count("first failed allocation: event ") == sum(x["first_failed_allocation"] is not None for x in results.values()) > 0,
              "the table: a line for each composition's first failed allocation", r.stdout)
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

        check(all(x["warm_ns_per_op_runs"] == [] and x["warm_ns_per_op"] == 0 for x in results.values()),
              "JSON: no warm figures unless asked")
        r = run("--repeat", "2", "--warm", "--compositions", "default_allocator,virtual_allocator", "--json", out_json, good)
        with open(out_json) as f:
            warm = {x["composition"]: x for x in json.load(f)["traces"][0]["results"]}
        check(r.returncode == 0 and r.stdout.count("(warm ") == 2 and all(len(x["warm_ns_per_op_runs"]) == 2 and x["warm_ns_per_op"] > 0
              and x["leaked"] == 0 for x in warm.values()), "--warm: a second timed pass per replay, in the table and JSON",
              r.stdout + json.dumps(warm)[:400])

        # --min-capacity: the smallest device per composition, in the table, JSON and Markdown.
        out_json2, out_md2 = os.path.join(tmp, "m.json"), os.path.join(tmp, "m.md")
        r = run("--min-capacity", "--compositions", "alloy,peers", "--json", out_json2, "--markdown", out_md2, good)
        check(r.returncode == 0 and "min capacity" in r.stdout, "--min-capacity replays and prints its table", r.stderr + r.stdout)
        with open(out_json2) as f:
            data = json.load(f)
        trace = data["traces"][0]
        found = [x["min_capacity"] for x in trace["results"]]
        check(len(found) >= 7 and all(m["found"] and m["over_peak_live"] >= 1.0 and m["capacity"] >= trace["peak_live_bytes"]
                                      and m["replays"] >= 5 for m in found),
              "JSON: every composition's minimum capacity, at least the peak live bytes", json.dumps(found)[:600])
        check(all(x["ns_per_op_runs"] == [] and "map_calls_per_1000_ops" in x and "upstream_calls_per_1000_ops" in x
                  for x in trace["results"]), "JSON: no timed runs in this mode; calls per 1,000 operations")
        check(all((m["largest_failing_capacity"] is None) == (m["capacity"] == trace["peak_live_bytes"])
                  and (m["largest_failing_capacity"] is None or m["largest_failing_capacity"] < m["capacity"])
                  and (m["first_failed_allocation_there"] is None) == (m["largest_failing_capacity"] is None) for m in found),
              "JSON: the largest capacity the search saw fail, and its first failed allocation", json.dumps(found)[:600])
        check(r.stdout.count(", first failed allocation: event ") == sum(m["largest_failing_capacity"] is not None for m in found),
              "the table: why a little less does not do, per composition", r.stdout)
        # At its peak reserved bytes without a limit, a composition runs as without one: the minimum is
        # at most that (to the search's 0.5 %).
        check(all(x["min_capacity"]["capacity"] <= x["peak_reserved"] / 0.995 + 1 for x in trace["results"]),
              "JSON: no minimum above the peak reserved without a limit",
              json.dumps([(x["composition"], x["peak_reserved"], x["min_capacity"]["capacity"]) for x in trace["results"]]))
        with open(out_md2) as f:
            md = f.read()
        check("Smallest device capacity" in md and "| geometric mean |" in md and "| good |" in md and "per 1,000 operations" in md,
              "Markdown: the minimum-capacity tables", md[:400])
        virtual = {x["composition"]: x for x in trace["results"] if x["virtual_memory"]}
        check(set(virtual) == {"virtual_arena", "virtual_allocator", "virtual_arena_pair"} and all(
                  x["faults"] == 0 and x["map_calls"] > 0 and x["peak_mapped"] >= trace["peak_live_bytes"]
                  and x["peak_reserved"] % (2 << 20) == 0 for x in virtual.values()),
              "JSON: the virtual compositions on 2 MiB granules, their map calls counted", json.dumps(list(virtual.values()))[:600])
        check(all(not x["virtual_memory"] and x["map_calls"] == 0 for x in trace["results"] if x["composition"] not in virtual),
              "JSON: no map calls for the others")
        r = run("--min-capacity", "--svg", out_svg, good)
        check(r.returncode == 2 and "--min-capacity" in r.stderr, "usage error: --svg with --min-capacity", r.stderr)

        # --resize: every size times the factor, the peak live bytes recomputed, said in the table and JSON.
        r = run("--resize", "0.5", "--capacity", "8GiB", "--repeat", "1", "--compositions", "default_allocator,virtual_allocator",
                "--json", out_json, good)
        with open(out_json) as f:
            halved = json.load(f)["traces"][0]
        check(r.returncode == 0 and "(rmm, sizes x0.5)" in r.stdout, "--resize replays and says so", r.stderr + r.stdout)
        check(halved["size_factor"] == 0.5 and trace["size_factor"] == 1 and halved["events"] == trace["events"]
              and 2 * halved["peak_live_bytes"] == trace["peak_live_bytes"],
              "JSON: the factor, the same events, half the peak live bytes", json.dumps(halved)[:300])
        check(all(x["peak_in_use"] == halved["peak_live_bytes"] and x["failed_requests"] == 1 for x in halved["results"]),
              "JSON: the halved sizes were asked (the recorded failure, 46 GiB halved, fails on 8 GiB)",
              json.dumps([(x["peak_in_use"], x["failed_requests"]) for x in halved["results"]]))

        # A peer's wrong answer is a fault, not a served request; a size that is
        # no multiple of 8 above 1 MiB reaches thrust's pool as one (its descriptor stays aligned:
        # under the sanitizers this run is the regression test of a misaligned store).
        if "thrust_pool" in run("--list").stdout:
            huge = os.path.join(tmp, "huge.csv")
            with open(huge, "w") as f:
                f.write(header + "1,0,allocate,0x1000,1000,0\n1,0,allocate,0x2000,18446744073709551610,0\n"
                        "1,0,free,0x1000,1000,0\n1,0,allocate,0x3000,1048579,0\n1,0,allocate,0x4000,4,0\n")
            r = run("--compositions", "peers", "--json", out_json, huge)
            with open(out_json) as f:
                results = {x["composition"]: x for x in json.load(f)["traces"][0]["results"]}
            tp = results["thrust_pool"]
            check(r.returncode == 3 and "thrust_pool: FAULT (1 wrong answer): event 2:" in r.stderr and "FAULT" in r.stdout,
                  "a peer's wrong answer: exit status 3, named on standard error and in the table", r.stderr + r.stdout)
            check(tp["faults"] == 1 and "not asked" in tp["first_fault"] and tp["served"] == 3 and not tp["served_all"]
                  and tp["peak_in_use"] < 2 << 20, "JSON: the fault counted apart from the served requests", json.dumps(tp)[:500])
            check(all(x["faults"] == 0 and x["failed_requests"] == 1 and x["served"] == 3
                      for name, x in results.items() if name != "thrust_pool"),
                  "the other peers refuse the huge request and serve the rest, aligned", json.dumps(results)[:800])
            unaligned = os.path.join(tmp, "unaligned.csv")
            with open(unaligned, "w") as f:
                f.write(header + "".join(f"1,0,allocate,{0x1000 + i * 0x100:#x},{(1 << 20) + 1 + 3 * i},0\n" for i in range(50))
                        + "".join(f"1,0,free,{0x1000 + i * 0x100:#x},{(1 << 20) + 1 + 3 * i},0\n" for i in range(0, 50, 3)))
            r = run("--compositions", "thrust_pool", "--json", out_json, unaligned)
            with open(out_json) as f:
                tp = json.load(f)["traces"][0]["results"][0]
            check(r.returncode == 0 and tp["faults"] == 0 and tp["served"] == 50, "thrust's pool serves sizes above 1 MiB that are "
                  "no multiple of 8", r.stderr)
        else:
            print("skip  the thrust::mr peers: alloy-replay was built without Thrust")

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
            (["--resize", "0", good], "--resize: '0' is not a positive number"),
            (["--resize=-2", good], "--resize: '-2' is not a positive number"),
            (["--resize", "1.5x", good], "--resize: '1.5x' is not a positive number"),
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

    return finish()


if __name__ == "__main__":
    sys.exit(main())
