#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A real training loop under PyTorch's allocator and alloy's, a fresh process for each.

A GPT-2-small-sized transformer (transformers' GPT2Config, random weights, random tokens), AdamW,
bf16 autocast, a sequence length drawn per step (seeded, the same in every configuration):

  native             PyTorch's caching allocator
  native-expandable  the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  alloy-virtual      alloy.torch.install("composition:virtual")     (alloy is PyTorch's allocator)
  alloy-default      alloy.torch.install("composition:default")
  alloy-mempool      PyTorch's allocator, its segments from alloy (alloy.torch.mem_pool)

For each: peak reserved / peak allocated, the median step time, and the largest batch (at the
longest sequence) that trains a few steps under the same cap on device memory
(set_per_process_memory_fraction for PyTorch, alloy's capacity for alloy), found by doubling then
bisection within a time bound. Then the checks: torch.cuda.memory_stats() after
alloy.torch.patch_memory_api() against alloy.memory_stats(), and its memory history turned on for
one step and off again; a CUDA graph captured and replayed with alloy installed; CuPy arrays
allocated and freed through alloy, its statistics checked.
Last, the prediction: the native run trains the same steps again with PyTorch's memory history
recorded, and `alloy.replay` replays that snapshot on the host; its figures stand beside what the
alloy runs measured.

Prints markdown tables (device, date, versions) and writes them to $OUT/gpu-check.md when OUT is
set. torch, transformers and cupy are imported only in the worker processes; --dry-run runs
without a GPU (nothing is imported) and shows the tables with every GPU part marked skipped.
"""

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLONE = Path(__file__).resolve().parents[2]
CONFIGS = {
    "native": ("PyTorch native", None),
    "native-expandable": ("PyTorch native, expandable_segments:True", None),
    "alloy-virtual": ("alloy virtual, installed", "composition:virtual"),
    "alloy-default": ("alloy default, installed", "composition:default"),
    "alloy-mempool": ("alloy virtual, as a MemPool", "composition:virtual"),
}
MARK = "@@alloy "  # a worker's result lines start so


# ---- the worker: one configuration in its own process -------------------------------------------


def emit(**record):
    print(MARK + json.dumps(record), flush=True)


class Worker:
    def __init__(self, args):
        self.args, self.name = args, args.worker
        self.cap = args.cap_gib << 30
        self.uses_alloy = self.name.startswith("alloy")
        if self.uses_alloy:
            sys.path.insert(0, str(CLONE / "python"))
            import alloy

            self.alloy = alloy
            conf = f"{CONFIGS[self.name][1]},capacity:{self.cap}"
            if self.name == "alloy-mempool":
                self.pool = alloy.torch.mem_pool(conf)
            else:
                alloy.torch.install(conf)  # before torch touches CUDA
        import torch

        self.torch = torch
        self.device = torch.device("cuda", 0)
        if not self.uses_alloy:
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.cap / total), 0)
        self.routing = None
        if self.name == "alloy-mempool":
            # Every thread's allocations (autograd's too) to the pool, not just this thread's.
            begin = getattr(torch._C, "_cuda_beginAllocateToPool", None)
            if begin is not None:
                begin(0, self.pool.id)
                self.routing = "all threads"
            else:
                self.context = torch.cuda.use_mem_pool(self.pool)
                self.context.__enter__()
                self.routing = "this thread (use_mem_pool)"

    def build(self):
        torch = self.torch
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        config = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)
        self.model = GPT2LMHeadModel(config).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.vocab = config.vocab_size
        self.generator = torch.Generator(device=self.device).manual_seed(1)

    def step(self, batch, length):
        torch = self.torch
        tokens = torch.randint(
            0, self.vocab, (batch, length), device=self.device, generator=self.generator
        )
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def oom_count(self):
        return self.alloy.memory_stats(0)["num_ooms"] if self.uses_alloy else 0

    def peaks(self):
        torch = self.torch
        if self.uses_alloy and self.name != "alloy-mempool":
            stats = self.alloy.memory_stats(0)
            return stats["reserved_bytes.all.peak"], stats["allocated_bytes.all.peak"]
        reserved, allocated = torch.cuda.max_memory_reserved(0), torch.cuda.max_memory_allocated(0)
        if self.name == "alloy-mempool":  # device memory is what alloy took
            reserved = self.alloy.memory_stats(0)["reserved_bytes.all.peak"]
        return reserved, allocated

    def train(self):
        torch = self.torch
        rng = random.Random(self.args.seed)
        lengths = [rng.randint(64, 1024) for _ in range(self.args.steps)]
        times = []
        for length in lengths:
            torch.cuda.synchronize()
            start = time.perf_counter()
            loss = self.step(self.args.batch, length)
            loss.item()
            times.append(time.perf_counter() - start)
        reserved, allocated = self.peaks()
        emit(
            kind="train",
            device=torch.cuda.get_device_name(0),
            torch=torch.__version__,
            cuda=torch.version.cuda,
            steps=len(times),
            batch=self.args.batch,
            median_ms=1000 * statistics.median(times[3:]),
            last_loss=float(loss.item()),
            peak_reserved=reserved,
            peak_allocated=allocated,
            routing=self.routing,
            keys=sorted((self.alloy if self.uses_alloy else torch.cuda).memory_stats(0)),
        )
        if self.args.snapshot:
            self.record_snapshot(lengths)

    def record_snapshot(self, lengths):
        """The same steps again with the memory history on (no stack traces), dumped for
        alloy.replay; the timed steps above ran without it."""
        torch = self.torch
        try:
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(enabled="all", context=None)
            for length in lengths:
                self.step(self.args.batch, length).item()
            torch.cuda.synchronize()
            torch.cuda.memory._dump_snapshot(self.args.snapshot)
            torch.cuda.memory._record_memory_history(enabled=None)
            emit(kind="snapshot", path=self.args.snapshot, steps=len(lengths), why="")
        except Exception as error:
            why = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
            emit(kind="snapshot", path="", steps=0, why=why)

    def check_patched_api(self):
        torch, alloy = self.torch, self.alloy
        try:
            torch.cuda.memory_stats(0)
            before = "answered"
        except Exception as error:  # what a pluggable allocator gives today
            before = f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"
        alloy.torch.patch_memory_api()
        live_bytes, ours = 0, {"requested_bytes.all.current": 0}
        try:
            ours, theirs = alloy.memory_stats(0), torch.cuda.memory_stats(0)
            live = set()
            tensors = list(self.model.parameters()) + [p.grad for p in self.model.parameters()]
            tensors += [
                t
                for s in self.optimizer.state.values()
                for t in s.values()
                if torch.is_tensor(t) and t.is_cuda
            ]
            for tensor in tensors:
                if tensor is not None and tensor.untyped_storage().data_ptr() not in live:
                    live.add(tensor.untyped_storage().data_ptr())
                    live_bytes += tensor.untyped_storage().nbytes()
            checks = {
                "memory_stats equal": theirs == ours,
                "memory_allocated": torch.cuda.memory_allocated(0)
                == ours["allocated_bytes.all.current"],
                "max_memory_reserved": torch.cuda.max_memory_reserved(0)
                == ours["reserved_bytes.all.peak"],
                "requested >= live tensors": ours["requested_bytes.all.current"] >= live_bytes,
                "snapshot": len(torch.cuda.memory._snapshot()["segments"]) > 0,
                "summary": "Allocated memory" in torch.cuda.memory_summary(0),
            }
            checks.update(self.check_patched_history())
        except Exception as error:
            checks = {f"{type(error).__name__}: {str(error).splitlines()[0][:100]}": False}
        finally:
            alloy.torch.unpatch_memory_api()
        emit(
            kind="patch",
            before=before,
            checks=checks,
            live_bytes=live_bytes,
            requested=ours["requested_bytes.all.current"],
        )

    def check_patched_history(self):
        """torch.cuda.memory._record_memory_history, patched: on for one step, cut, then off."""
        torch = self.torch
        traces = lambda: torch.cuda.memory._snapshot()["device_traces"][0]  # noqa: E731
        torch.cuda.memory._record_memory_history(max_entries=1 << 20)
        try:
            self.step(1, 64).item()
            torch.cuda.synchronize()
            events = traces()
            torch.cuda.memory._record_memory_history(max_entries=8)  # keeps the newest eight
            cut = traces()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        actions = {event["action"] for event in events}
        return {
            "history on": {"alloc", "free_requested"} <= actions,
            "history cut": cut == events[-8:],
            "history off": len(traces()) == 0,
        }

    def bisect(self, low, high, deadline):
        """Largest batch at length 1024 that trains, doubling from `low` (trained) to a failure."""
        torch = self.torch
        while time.monotonic() < deadline:
            batch = low * 2 if high is None else (low + high) // 2
            if high is not None and batch <= low:
                break
            emit(kind="trying", batch=batch)
            ooms = self.oom_count()
            failure = None
            try:
                for _ in range(self.args.trial_steps):
                    self.step(batch, 1024).item()
                torch.cuda.synchronize()
            except torch.cuda.OutOfMemoryError as error:
                failure = f"OutOfMemoryError: {str(error).splitlines()[0][:80]}"
            except RuntimeError as error:
                failure = f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
            if failure is None and self.oom_count() > ooms:
                failure = "alloy returned NULL (an OOM PyTorch did not see)"
            self.optimizer.zero_grad(set_to_none=True)
            if failure is None:
                emit(kind="trial", batch=batch, ok=True)
                low = batch
                continue
            poisoned = "out of memory" not in failure.lower() or self.oom_count() > ooms
            emit(kind="trial", batch=batch, ok=False, why=failure, restart=poisoned)
            high = batch
            if poisoned:  # a NULL block or a CUDA error: this context cannot be trusted
                os._exit(3)
            torch.cuda.empty_cache()
        emit(kind="bisect-done", low=low, high=high)

    def check_graph(self):
        torch = self.torch
        try:
            net = torch.nn.Sequential(
                torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
            ).to(self.device)
            x = torch.randn(256, 1024, device=self.device)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    net(x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = net(x)
            results = []
            for _ in range(3):
                x.copy_(torch.randn_like(x))
                graph.replay()
                results.append(torch.allclose(y, net(x), rtol=1e-3, atol=1e-3))
            torch.cuda.synchronize()
            emit(
                kind="graph",
                ok=all(results),
                why="" if all(results) else "replay differs from eager",
            )
        except Exception as error:
            emit(
                kind="graph",
                ok=False,
                why=f"{type(error).__name__}: {str(error).splitlines()[0][:120]}",
            )

    def check_cupy(self):
        alloy = self.alloy
        try:
            import cupy

            alloy.cupy.install()
            before = alloy.memory_stats(0)
            sizes = [1000, 1 << 20, 37 << 20]  # multiples of 8: float64 arrays of exactly these
            arrays = [cupy.arange(size // 8, dtype=cupy.float64) for size in sizes]
            sums_ok = all(float(a.sum()) == len(a) * (len(a) - 1) / 2 for a in arrays)
            held = alloy.memory_stats(0)
            grew = held["requested_bytes.all.current"] - before["requested_bytes.all.current"]
            count = held["allocation.all.current"] - before["allocation.all.current"]
            del arrays
            cupy.cuda.Device(0).synchronize()
            after = alloy.memory_stats(0)
            back = after["allocation.all.current"] == before["allocation.all.current"]
            ok = sums_ok and count >= 3 and grew >= sum(sizes) and back
            emit(
                kind="cupy",
                ok=ok,
                why=f"+{count} allocations, +{grew} bytes requested, freed: {back}",
            )
        except Exception as error:
            emit(
                kind="cupy",
                ok=False,
                why=f"{type(error).__name__}: {str(error).splitlines()[0][:120]}",
            )


def worker_main(args):
    worker = Worker(args)
    if args.checks:  # the CUDA graph and CuPy, in a process of their own
        worker.check_graph()
        worker.check_cupy()
    else:
        train_and_search(worker, args)
    sys.stdout.flush()
    os._exit(0)  # no teardown: the results are out, and a pool or a NULL block may not unwind


def train_and_search(worker, args):
    worker.build()
    if args.bisect is None:
        worker.train()
        if worker.uses_alloy and worker.name != "alloy-mempool":
            worker.check_patched_api()
        low, high = args.batch, None
    else:
        worker.step(1, 64).item()  # the optimizer's state, as after training
        low, high = args.bisect
        high = None if high == 0 else high
    worker.bisect(low, high, time.monotonic() + args.bisect_seconds)


# ---- the driver: runs the workers and writes the tables -----------------------------------------


def run_worker(args, name, extra, env, timeout):
    command = [
        sys.executable,
        __file__,
        "--worker",
        name,
        "--cap-gib",
        str(args.cap_gib),
        "--steps",
        str(args.steps),
        "--batch",
        str(args.batch),
        "--seed",
        str(args.seed),
        "--trial-steps",
        str(args.trial_steps),
        *extra,
    ]
    environment = dict(os.environ, **env)
    started = time.monotonic()
    try:
        result = subprocess.run(
            command, env=environment, capture_output=True, text=True, timeout=timeout
        )
        output, code = result.stdout, result.returncode
        errors = result.stderr
    except subprocess.TimeoutExpired as expired:
        output = (
            expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        )
        code, errors = "timeout", ""
    records = [
        json.loads(line[len(MARK) :]) for line in output.splitlines() if line.startswith(MARK)
    ]
    tail = (errors.strip().splitlines()[-1:] or [f"exit {code}"])[0][:160]
    if records and records[-1]["kind"] == "trying":  # died inside a trial: that batch failed
        records.append(
            {
                "kind": "trial",
                "batch": records[-1]["batch"],
                "ok": False,
                "why": f"the process died (exit {code}): {tail}",
                "restart": True,
            }
        )
    elif code not in (0, 3) and not (records and records[-1].get("restart")):
        records.append({"kind": "died", "why": f"exit {code}: {tail}"})
    return records, time.monotonic() - started


def measure(args, name):
    env = (
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
        if name == "native-expandable"
        else {}
    )
    deadline = time.monotonic() + args.bisect_seconds + 40  # 40 s: start, build, train
    extra = ["--bisect-seconds", str(args.bisect_seconds)]
    if name == "native" and args.snapshot:
        extra += ["--snapshot", args.snapshot]
    records, _ = run_worker(args, name, extra, env, 240)
    while True:  # a worker that had to stop (a NULL block, a CUDA error) goes on in a new one
        trials = [r for r in records if r["kind"] == "trial"]
        done = any(r["kind"] in ("bisect-done", "died") for r in records)
        if done or not trials or trials[-1]["ok"] or time.monotonic() > deadline:
            break
        low = max([args.batch] + [r["batch"] for r in trials if r["ok"]])
        high = min(r["batch"] for r in trials if not r["ok"])
        left = int(deadline - time.monotonic()) - 15  # 15 s: start and build
        more, _ = run_worker(
            args,
            name,
            ["--bisect", str(low), str(high), "--bisect-seconds", str(max(5, left))],
            env,
            120,
        )
        records += more
    return records


def summarize(name, records):
    train = next((r for r in records if r["kind"] == "train"), None)
    trials = [r for r in records if r["kind"] == "trial"]
    died = [r["why"] for r in records if r["kind"] == "died"]
    row = {
        "name": name,
        "title": CONFIGS[name][0],
        "train": train,
        "died": died,
        "patch": next((r for r in records if r["kind"] == "patch"), None),
        "snapshot": next((r for r in records if r["kind"] == "snapshot"), None),
    }
    ok = [r["batch"] for r in trials if r["ok"]]
    bad = [r for r in trials if not r["ok"]]
    row["largest"] = max(ok) if ok else (train["batch"] if train else None)
    row["failed_at"] = min(r["batch"] for r in bad) if bad else None
    row["fail_why"] = min(bad, key=lambda r: r["batch"])["why"] if bad else ""
    return row


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def predict(rows):
    """alloy.replay over the native run's snapshot: (trace, {composition: (Result, Search)}), or
    (None, why not)."""
    native = next((r for r in rows if r["name"] == "native"), None)
    record = native and native.get("snapshot")
    if not record or not record["path"]:
        return None, (record["why"] if record else "the native run recorded no snapshot")
    sys.path.insert(0, str(CLONE / "python"))
    try:
        from alloy import replay

        trace = replay.load_snapshot(record["path"])
        return trace, replay.report(trace)
    except Exception as error:
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


def prediction_table(args, rows, prediction, dry_run_reason):
    lines = [
        "",
        f"Prediction: the native run's {args.steps} steps trained again with PyTorch's memory "
        "history recorded, the snapshot replayed on the host (`python -m alloy.replay`), beside "
        "the peaks the runs above measured.",
        "",
        "| composition | predicted peak held | predicted smallest device | measured peak reserved "
        "| measured ÷ predicted peak |",
        "|---|---|---|---|---|",
    ]
    measured_by = {"virtual": "alloy-virtual", "default": "alloy-default", "caching": "native"}
    if dry_run_reason:
        return lines + [f"| {c} | skipped | skipped | skipped | dry run |" for c in measured_by]
    trace, results = prediction
    if trace is None:
        return lines + [f"| - | - | - | - | {results} |"]
    train = {r["name"]: r["train"] for r in rows if r["train"]}
    lines.append(
        f"| peak live ({trace.allocations} allocations, {trace.throughout[0]} blocks live "
        f"throughout) | {gib(trace.peak_live)} | | native peak allocated "
        f"{gib(train['native']['peak_allocated']) if 'native' in train else '-'} | |"
    )
    for composition, (uncapped, search) in results.items():
        run = measured_by[composition]
        label = "caching (PyTorch's layout)" if composition == "caching" else composition
        held = gib(uncapped.peak_reserved) if uncapped.served else "fails"
        need = gib(search.capacity) if search.capacity else "over 1 PiB"
        if run in train and uncapped.served:
            measured = train[run]["peak_reserved"]
            mine = f"{CONFIGS[run][0]}: {gib(measured)}"
            ratio = f"{measured / uncapped.peak_reserved:.3f}"
        else:
            mine, ratio = f"{CONFIGS[run][0]}: not run", "-"
        lines.append(f"| {label} | {held} | {need} | {mine} | {ratio} |")
    return lines


def tables(args, header, rows, checks, dry_run_reason=None, prediction=None):
    lines = [f"# alloy GPU check ({'dry run' if dry_run_reason else 'GPU'})", ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    if dry_run_reason:
        lines.append(f"- GPU parts skipped: {dry_run_reason}")
    lines += [
        "",
        f"GPT-2 small (12 layers, 768 wide, 50257 tokens), AdamW, bf16 autocast, batch "
        f"{args.batch}, {args.steps} steps of lengths 64..1024 (seed {args.seed}); largest "
        f"batch at length 1024 under a {args.cap_gib} GiB cap, {args.trial_steps} steps a "
        "trial.",
        "",
        "| configuration | peak reserved | peak allocated | reserved / allocated | median step "
        "| largest batch | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if dry_run_reason:
            lines.append(
                f"| {row['title']} | skipped | skipped | skipped | skipped | skipped | dry run |"
            )
            continue
        train, notes = row["train"], list(row["died"])
        if train is None:
            lines.append(
                f"| {row['title']} | - | - | - | - | - | {'; '.join(notes) or 'no result'} |"
            )
            continue
        if row["failed_at"]:
            notes.append(f"{row['failed_at']} failed: {row['fail_why']}")
        else:
            notes.append("no failure within the time bound")
        if train.get("routing"):
            notes.append(f"pool routing: {train['routing']}")
        ratio = train["peak_reserved"] / train["peak_allocated"] if train["peak_allocated"] else 0
        lines.append(
            f"| {row['title']} | {gib(train['peak_reserved'])} | {gib(train['peak_allocated'])} "
            f"| {ratio:.3f} | {train['median_ms']:.1f} ms | {row['largest']} | {'; '.join(notes)} |"
        )
    lines += prediction_table(args, rows, prediction, dry_run_reason)
    lines += [
        "",
        "Peaks: PyTorch's own statistics for PyTorch; alloy.memory_stats() for alloy installed; for "
        "the MemPool, reserved is alloy's (the device memory taken) and allocated PyTorch's.",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    for check, (result, detail) in checks.items():
        lines.append(f"| {check} | {result} | {detail} |")
    return "\n".join(lines) + "\n"


def driver_main(args):
    names = [n for n in CONFIGS if not args.only or n in args.only]
    checks = {}
    if args.dry_run:
        reason = "no GPU here; torch, transformers and cupy are imported by the workers only"
        header = {
            "device": "none (dry run)",
            "date": datetime.date.today().isoformat(),
            "python": sys.version.split()[0],
            "torch": "not imported (dry run)",
        }
        rows = [{"title": CONFIGS[n][0]} for n in names]
        for check in (
            "memory_stats keys: PyTorch's = alloy's",
            "patch_memory_api (alloy virtual)",
            "patch_memory_api (alloy default)",
            "CUDA graph with alloy installed",
            "CuPy through alloy",
        ):
            checks[check] = ("skipped", "dry run")
        return tables(args, header, rows, checks, reason)

    header = {
        "device": "?",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": "?",
        "CUDA": "?",
        "python": sys.version.split()[0],
    }
    rows, keys = [], {}
    for name in names:
        print(f"alloy gpu-check: {name} ...", file=sys.stderr, flush=True)
        records = measure(args, name)
        rows.append(summarize(name, records))
        train = rows[-1]["train"]
        if train:
            header.update(device=train["device"], torch=train["torch"], CUDA=train["cuda"])
        if train and name in ("native", "alloy-virtual"):
            keys[name] = set(train["keys"])
        patch = rows[-1]["patch"]
        if patch:
            passed = all(patch["checks"].values())
            detail = ", ".join(
                f"{k}: {'ok' if v else 'FAILED'}" for k, v in patch["checks"].items()
            )
            checks[f"patch_memory_api ({CONFIGS[name][0]})"] = (
                "pass" if passed else "FAIL",
                f"before the patch: {patch['before']}; {detail}",
            )
    if len(keys) == 2:
        missing, extra = (
            keys["native"] - keys["alloy-virtual"],
            keys["alloy-virtual"] - keys["native"],
        )
        checks["memory_stats keys: PyTorch's = alloy's"] = (
            "pass" if not missing and not extra else "FAIL",
            (
                f"alloy lacks {sorted(missing)}, has besides {sorted(extra)}"
                if missing or extra
                else f"{len(keys['native'])} keys"
            ),
        )
    if not args.only or "alloy-virtual" in args.only:
        records, _ = run_worker(args, "alloy-virtual", ["--checks"], {}, 120)
        for kind, check in (
            ("graph", "CUDA graph with alloy installed"),
            ("cupy", "CuPy through alloy"),
        ):
            record = next((r for r in records if r["kind"] == kind), None)
            died = "; ".join(r["why"] for r in records if r["kind"] == "died")
            checks[check] = (
                ("pass" if record["ok"] else "FAIL", record["why"])
                if record
                else ("FAIL", died or "no result")
            )
    prediction = None
    if not args.only or "native" in args.only:
        print("alloy gpu-check: alloy.replay of the native run's snapshot ...", file=sys.stderr)
        prediction = predict(rows)
    return tables(args, header, rows, checks, prediction=prediction)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="no GPU: show the tables, GPU parts skipped"
    )
    parser.add_argument(
        "--only", nargs="*", choices=list(CONFIGS), help="configurations to run (all by default)"
    )
    parser.add_argument("--cap-gib", type=int, default=16, help="the cap on device memory (GiB)")
    parser.add_argument("--steps", type=int, default=32, help="timed training steps")
    parser.add_argument("--batch", type=int, default=8, help="batch of the timed steps")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--trial-steps", type=int, default=3, help="steps a batch must train")
    parser.add_argument("--bisect-seconds", type=int, default=20, help="time bound of the search")
    parser.add_argument(
        "--snapshot",
        default=os.path.join(tempfile.gettempdir(), "alloy-gpu-check-native.pickle"),
        help="where the native run dumps its snapshot for alloy.replay ('' for none)",
    )
    parser.add_argument("--worker", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--checks", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bisect", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)
    text = driver_main(args)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu-check.md").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
