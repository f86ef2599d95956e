# SPDX-License-Identifier: Apache-2.0
"""What alloy would need for your own PyTorch program, from a memory snapshot of it.

    python -m alloy.replay SNAPSHOT.pickle [--device N] [--composition virtual,default,caching]

The snapshot is what ``torch.cuda.memory._dump_snapshot()`` writes after
``torch.cuda.memory._record_memory_history()``. Its allocations and frees are replayed through
liballoy's compositions, and for each the report gives the device memory it held at its peak and
the smallest device that serves the whole recording, beside the peak live bytes and what
PyTorch's allocator had reserved. No GPU is needed: the replay runs on ``backend:host``, host
memory standing in for the device with the GPU's 2 MiB granule, and it never touches the memory,
so the recording of an 80 GiB model replays on a laptop.

From Python::

    from alloy import replay
    trace = replay.load_snapshot("snapshot.pickle")
    print(replay.smallest_device(trace, "virtual").capacity / trace.peak_live)

What is replayed: the device's ``alloc`` and ``free_requested`` events (``free_completed`` when
there are none) with the sizes PyTorch recorded (its requests rounded up to 512 bytes), each on
its stream. Blocks that lived through the whole recording (weights, optimizer state: live when
the snapshot was taken, absent from the trace) and blocks freed during it but allocated before
are allocated first, the former in address order. Recorded ``oom`` events are counted, not
replayed. liballoy is configured once per process, so every replay runs in a child interpreter.
"""

import argparse
import array
import collections
import concurrent.futures
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile

COMPOSITIONS = ("virtual", "default", "caching")
_DESCRIPTIONS = {"virtual": "alloy's default", "caching": "PyTorch's layout"}
_ALLOC, _FREE = 0, 1
_UNCAPPED = 1 << 40  # "no limit": 1 TiB, or 16 times the peak live bytes when that is more


class PlainDataUnpickler(pickle.Unpickler):
    """Loads plain data only: every class, function and persistent id is refused, so that a
    malicious file is rejected instead of run (a snapshot is dicts, lists, strings, numbers)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a memory snapshot holds plain data only"
        )

    def persistent_load(self, pid):
        raise pickle.UnpicklingError(
            "refusing a persistent id: a memory snapshot holds plain data only"
        )


def read_snapshot(source):
    """The snapshot as plain data, from a path, bytes (gzipped or not) or a dict already loaded."""
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as file:
            source = file.read()
    if not isinstance(source, (bytes, bytearray)):
        raise TypeError(f"a snapshot is a path, bytes or a dict, not {type(source).__name__}")
    if source[:2] == b"\x1f\x8b":
        import gzip

        source = gzip.decompress(source)
    return PlainDataUnpickler(io.BytesIO(source)).load()


Event = collections.namedtuple("Event", ["action", "addr", "size", "stream", "time_us", "index"])
Event.__doc__ = """One event of a device's trace: action is "alloc", "free" or "oom"; time_us is
None when the snapshot has no times; index is the event's place in the device's trace."""


def trace_events(snapshot, device=0):
    """(events, early): the device's alloc, free and oom events in order, and the free events of
    blocks allocated before the recording (in the order of their frees). A free is a
    ``free_requested`` event, or ``free_completed``/``free`` when the trace has none of those."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError(
            "no 'device_traces' in this file: record the snapshot with "
            "torch.cuda.memory._record_memory_history() before torch.cuda.memory._dump_snapshot()"
        )
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or not 0 <= device < len(traces):
        count = len(traces) if isinstance(traces, list) else 0
        raise ValueError(f"no trace for device {device} (the snapshot has {count} device traces)")
    raw = traces[device]
    if not isinstance(raw, list):
        raise ValueError(f"device {device}'s trace is not a list of events")
    for index, e in enumerate(raw):
        if not isinstance(e, dict):
            raise ValueError(f"event {index} of device {device}'s trace is not a dict")
    has_free_requested = any(e.get("action") == "free_requested" for e in raw)
    free_actions = {"free_requested"} if has_free_requested else {"free_completed", "free"}
    events, early, live = [], [], set()
    for index, e in enumerate(raw):
        action = e.get("action")
        at = e.get("time_us")
        event = Event(action, e.get("addr", 0), e.get("size", 0), e.get("stream", 0), at, index)
        if action in ("alloc", "oom") or action in free_actions:
            _check_event(event, device)
        if action == "alloc":
            live.add(event.addr)
        elif action in free_actions:
            event = event._replace(action="free")
            if event.addr in live:
                live.discard(event.addr)
            else:
                early.append(event)
        elif action != "oom":
            continue
        events.append(event)
    return events, early


def _is_count(value, bits=64):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < (1 << bits)


def _check_event(event, device):
    # Streams are handles (pointers) and may read negative; sizes below 2^63, as torch's are.
    if not (_is_count(event.addr) and _is_count(event.size, 63) and isinstance(event.stream, int)):
        raise ValueError(
            f"event {event.index} of device {device}'s trace ({event.action}) needs whole numbers "
            f"for addr, size and stream, not {event.addr!r}, {event.size!r}, {event.stream!r}"
        )


def _segments(snapshot, device):
    """The snapshot's segments on `device`, each checked: a dict with whole numbers for its device
    and total size, and a list of dicts for its blocks."""
    segments = snapshot.get("segments", [])
    if not isinstance(segments, list):
        raise ValueError(f"the snapshot's segments are not a list ({type(segments).__name__})")
    mine = []
    for index, s in enumerate(segments):
        if not isinstance(s, dict):
            raise ValueError(f"segment {index} of the snapshot is not a dict")
        on, size, blocks = s.get("device", 0), s.get("total_size", 0), s.get("blocks", [])
        if not (_is_count(on) and _is_count(size)):
            raise ValueError(
                f"segment {index} of the snapshot needs whole numbers for device and total_size, "
                f"not {on!r}, {size!r}"
            )
        if not (isinstance(blocks, list) and all(isinstance(b, dict) for b in blocks)):
            raise ValueError(f"segment {index} of the snapshot: its blocks are not a list of dicts")
        if on == device:
            mine.append(s)
    return mine


def _reserved(segments, device, raw_events):
    """(reserved when the snapshot was taken, peak reserved over the recording or None when the
    trace has no segment events) of PyTorch's allocator on `device`."""
    at_end = sum(s.get("total_size", 0) for s in segments)
    grows = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    changes = []
    for index, e in enumerate(raw_events):
        if e.get("action") in grows:
            size = e.get("size", 0)
            if not _is_count(size, 63):
                raise ValueError(
                    f"event {index} of device {device}'s trace ({e['action']}) needs a whole "
                    f"number for size, not {size!r}"
                )
            changes.append(grows[e["action"]] * size)
    if not changes:
        return at_end, None
    peak = reserved = at_end
    for change in reversed(changes):  # walk back from the end
        reserved -= change
        peak = max(peak, reserved)
    return at_end, peak


class Trace:
    """A device's allocations from a snapshot, ready to replay.

    Attributes: ``ops`` (flat array of kind, slot, size, stream per operation), ``slots``,
    ``allocations``, ``frees``, ``streams``, ``peak_live`` (bytes), ``throughout`` (blocks live
    through the whole recording, as (count, bytes)), ``ooms_recorded``, ``pytorch_reserved``
    (bytes PyTorch's allocator held when the snapshot was taken) and ``pytorch_peak_reserved``
    (its peak over the recording, None when the trace has no segment events).
    """

    def __init__(self, snapshot, device=0, name="snapshot"):
        events, early = trace_events(snapshot, device)
        seen = {e.addr for e in events if e.action != "oom"}
        segments = _segments(snapshot, device)
        throughout = [
            (b.get("address"), b.get("size"))
            for s in segments
            for b in s.get("blocks", [])
            if b.get("state") == "active_allocated" and b.get("address") not in seen
        ]
        for addr, size in throughout:
            if not (_is_count(addr) and _is_count(size, 63)):
                raise ValueError(
                    f"a block of the snapshot's segments has address {addr!r}, size {size!r}"
                )
        throughout.sort()
        self.name, self.device = name, device
        self.ops = array.array("Q")
        self.allocations = self.frees = self.ooms_recorded = self.peak_live = live_bytes = 0
        self.throughout = (len(throughout), sum(size for _, size in throughout))
        slot_of, free_slots, self.slots, streams = {}, [], 0, set()

        def allocate(addr, size, stream):
            nonlocal live_bytes
            if addr in slot_of:  # allocated twice without a free: keep the first
                return
            slot = free_slots.pop() if free_slots else self.slots
            self.slots = max(self.slots, slot + 1)
            slot_of[addr] = (slot, size)
            self.ops.extend((_ALLOC, slot, size, stream & 0xFFFFFFFFFFFFFFFF))
            self.allocations += 1
            live_bytes += size
            self.peak_live = max(self.peak_live, live_bytes)
            streams.add(stream)

        for addr, size in throughout:
            allocate(addr, size, 0)
        for e in early:
            allocate(e.addr, e.size, e.stream)
        for e in events:
            if e.action == "alloc":
                allocate(e.addr, e.size, e.stream)
            elif e.action == "free" and e.addr in slot_of:
                slot, size = slot_of.pop(e.addr)
                self.ops.extend((_FREE, slot, size, e.stream & 0xFFFFFFFFFFFFFFFF))
                self.frees += 1
                live_bytes -= size
                free_slots.append(slot)
            elif e.action == "oom":
                self.ooms_recorded += 1
        self.streams = len(streams)
        raw = snapshot["device_traces"][device]
        self.pytorch_reserved, self.pytorch_peak_reserved = _reserved(segments, device, raw)


def load_snapshot(source, device=0):
    """The Trace of one device of a snapshot: a path, bytes, or the dict that
    torch.cuda.memory._snapshot() returns. ValueError when it holds no trace for that device or a
    malformed one; pickle.UnpicklingError when the file is no plain-data pickle."""
    name = (
        os.path.basename(os.fspath(source))
        if isinstance(source, (str, os.PathLike))
        else "snapshot"
    )
    return Trace(read_snapshot(source), device, name)


Result = collections.namedtuple(
    "Result", ["served", "failed_at", "failed_size", "oom", "peak_reserved", "peak_in_use"]
)
Result.__doc__ = """One replay: whether every allocation was served; else the index (among the
operations) and size of the first that failed and alloy's explanation; the peak device memory
the composition held and the peak bytes in use."""


def replay(trace, composition="virtual", capacity=None, stop_at_failure=False):
    """Replays `trace` through liballoy's `composition` on a device of `capacity` bytes (None: no
    limit) in a child interpreter; returns a Result. RuntimeError when the child fails."""
    if composition not in COMPOSITIONS:
        raise ValueError(
            f"alloy.replay: composition is one of {', '.join(COMPOSITIONS)}, not {composition!r}"
        )
    if capacity is None:
        capacity = max(_UNCAPPED, 16 * trace.peak_live)
    conf = f"backend:host,composition:{composition},capacity:{max(int(capacity), 2)}"
    with tempfile.NamedTemporaryFile(prefix="alloy-replay-", suffix=".ops") as ops:
        trace.ops.tofile(ops)
        ops.flush()
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)
        environment = dict(os.environ, PYTHONPATH=path)
        environment.pop("ALLOY_CONF", None)
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "from alloy import replay; replay._serve()",
                conf,
                ops.name,
                str(trace.slots),
                "1" if stop_at_failure else "0",
            ],
            env=environment,
            capture_output=True,
            text=True,
        )
    lines = child.stdout.strip().splitlines()
    if child.returncode != 0 or not lines:
        raise RuntimeError(f"alloy.replay: the replay of {conf} failed: {child.stderr.strip()}")
    return Result(**json.loads(lines[-1]))


def _serve():
    """The child's side of replay(): argv is conf, operations file, slots, stop at failure."""
    import alloy
    from alloy import _lib

    conf, path, slots, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    ops = array.array("Q")
    with open(path, "rb") as file:
        ops.frombytes(file.read())
    alloy.configure(conf)
    lib = _lib.lib()
    malloc, free = lib.alloy_torch_malloc, lib.alloy_torch_free
    pointers = [None] * slots
    failed = None
    for index in range(0, len(ops), 4):
        kind, slot, size, stream = ops[index : index + 4]
        if kind == _ALLOC:
            pointer = malloc(size, 0, stream)
            if not pointer:
                if lib.alloy_last_error_code() != _lib.OK:
                    raise RuntimeError(f"alloy_torch_malloc: {_lib.last_error()}")
                if failed is None:
                    failed = (index // 4, size, alloy.last_oom(0))
                if stop:
                    break
            pointers[slot] = pointer
        elif pointers[slot]:  # not when its allocation failed
            free(pointers[slot], size, 0, stream)
            pointers[slot] = None
    stats = alloy.statistics(0)
    if stats["num_bad_frees"]:  # refused frees are counted: one check here, none per free
        raise RuntimeError(f"alloy.replay: liballoy refused {stats['num_bad_frees']} frees")
    print(
        json.dumps(
            {
                "served": failed is None,
                "failed_at": failed and failed[0],
                "failed_size": failed and failed[1],
                "oom": failed[2] if failed else "",
                "peak_reserved": stats["peak_bytes_reserved"],
                "peak_in_use": stats["peak_bytes_in_use"],
            }
        )
    )


Search = collections.namedtuple("Search", ["capacity", "largest_failing", "oom", "replays"])
Search.__doc__ = """The smallest device found (bytes; None when nothing up to 2^50 served the
trace), the largest capacity seen to fail (0 when none did) with alloy's explanation there, and
how many replays the search took."""


def smallest_device(trace, composition="virtual", precision=0.005, upper=None):
    """The smallest device on which `composition` serves the whole trace, to `precision`.

    Starts at the peak live bytes (no device serves the trace with less). The bracket's upper end
    is `upper` when it serves the trace (the peak the composition held without a limit is a good
    guess), else found by doubling; then bisection until the bracket is within `precision` of its
    upper end. It assumes that a device that serves the trace, any larger one serves too; the
    capacity it returns is one whose replay served everything."""
    replays, oom = 0, ""

    def serves(capacity):
        nonlocal replays, oom
        replays += 1
        result = replay(trace, composition, capacity, stop_at_failure=True)
        if not result.served:
            oom = result.oom  # each failure is the bracket's new lower end: oom is lo's
        return result.served

    lo = max(trace.peak_live, 2)
    if serves(lo):
        return Search(lo, 0, "", replays)
    hi = None
    if upper is not None and upper > lo:
        if serves(upper):
            hi = upper
        else:
            lo = upper
    if hi is None:
        hi = lo
        while True:
            if hi > (1 << 50) // 2:
                return Search(None, lo, oom, replays)
            hi *= 2
            if serves(hi):
                break
            lo = hi
    while hi - lo > precision * hi:
        middle = lo + (hi - lo) // 2
        if serves(middle):
            hi = middle
        else:
            lo = middle
    return Search(hi, lo, oom, replays)


def report(trace, compositions=COMPOSITIONS, precision=0.005):
    """Replays `trace` through each composition without a limit, then searches its smallest
    device from the peak it held (compositions in parallel); returns {composition: (Result,
    Search)}."""

    def one(composition):
        uncapped = replay(trace, composition)
        upper = uncapped.peak_reserved if uncapped.served else None
        return uncapped, smallest_device(trace, composition, precision, upper)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(compositions) or 1) as pool:
        futures = {c: pool.submit(one, c) for c in compositions}
        return {c: futures[c].result() for c in compositions}


def _table(trace, results, precision):
    live = max(trace.peak_live, 1)

    def cell(size):
        return (
            f"{size / (1 << 30):9.2f} GiB {size / live:7.3f}x" if size is not None else f"{'-':>22}"
        )

    if trace.pytorch_peak_reserved is not None:
        pytorch, held = "PyTorch (peak reserved)", trace.pytorch_peak_reserved
    else:
        pytorch, held = "PyTorch (reserved at the snapshot)", trace.pytorch_reserved
    lines = [
        f"alloy.replay: {trace.name}, device {trace.device}: {trace.allocations:,} allocations, "
        f"{trace.frees:,} frees, {trace.streams} stream(s)",
        f"  {trace.throughout[0]:,} blocks ({trace.throughout[1] / (1 << 30):.2f} GiB) "
        "live throughout"
        + (
            f"; {trace.ooms_recorded} out-of-memory events recorded, not replayed"
            if trace.ooms_recorded
            else ""
        ),
        "",
        f"  {'':36}{'peak held':>22}   {'smallest device':>22}",
        f"  {'peak live':36}{cell(trace.peak_live)}",
        f"  {pytorch:36}{cell(held)}",
    ]
    for composition, (uncapped, search) in results.items():
        label = f"alloy {composition}" + (
            f" ({_DESCRIPTIONS[composition]})" if composition in _DESCRIPTIONS else ""
        )
        peak = cell(uncapped.peak_reserved if uncapped.served else None)
        need = cell(search.capacity) if search.capacity else f"{'over 1 PiB':>22}"
        lines.append(f"  {label:36}{peak}   {need}")
    lines += [
        "",
        "  Each figure is device memory and its ratio to the peak live bytes. PyTorch's is from",
        "  the snapshot; alloy's are replays through liballoy on host memory standing in for the",
        "  device (2 MiB granules); the smallest device that serves the whole recording is found",
        f"  to {precision:.1%}.",
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m alloy.replay",
        description="How much device memory alloy would need for a PyTorch program, from a memory "
        "snapshot of it (torch.cuda.memory._dump_snapshot).",
    )
    parser.add_argument("snapshot", help="the .pickle file (gzipped or not)")
    parser.add_argument("--device", type=int, default=0, help="which device's trace (default 0)")
    parser.add_argument(
        "--composition",
        default=",".join(COMPOSITIONS),
        help=f"compositions to replay, comma-separated (default {','.join(COMPOSITIONS)})",
    )
    parser.add_argument(
        "--precision", type=float, default=0.005, help="of the smallest device (default 0.005)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    compositions = [c.strip() for c in args.composition.split(",") if c.strip()]
    unknown = [c for c in compositions if c not in COMPOSITIONS]
    if unknown or not compositions:
        parser.error(
            f"--composition: one or more of {', '.join(COMPOSITIONS)}, not {args.composition!r}"
        )
    if not 0 < args.precision < 1:
        parser.error("--precision: a fraction between 0 and 1")
    try:
        trace = load_snapshot(args.snapshot, args.device)
    except (
        OSError,
        EOFError,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        pickle.UnpicklingError,
    ) as error:
        print(f"alloy.replay: {args.snapshot}: {error}", file=sys.stderr)
        return 1
    if sys.stderr.isatty():  # a large recording takes a while: say what is going on
        operations = trace.allocations + trace.frees
        print(
            f"alloy.replay: {operations:,} operations through {', '.join(compositions)} ...",
            file=sys.stderr,
            flush=True,
        )
    try:
        results = report(trace, compositions, args.precision)
    except (OSError, RuntimeError) as error:
        print(f"alloy.replay: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    "snapshot": trace.name,
                    "device": trace.device,
                    "peak_live": trace.peak_live,
                    "allocations": trace.allocations,
                    "frees": trace.frees,
                    "throughout_blocks": trace.throughout[0],
                    "throughout_bytes": trace.throughout[1],
                    "pytorch_reserved": trace.pytorch_reserved,
                    "pytorch_peak_reserved": trace.pytorch_peak_reserved,
                    "compositions": {
                        c: {
                            "peak_reserved": r.peak_reserved if r.served else None,
                            "smallest_device": s.capacity,
                            "largest_failing": s.largest_failing,
                            "replays": s.replays,
                        }
                        for c, (r, s) in results.items()
                    },
                },
                indent=2,
            )
        )
    else:
        print(_table(trace, results, args.precision))
    return 0


if __name__ == "__main__":
    sys.exit(main())
