# SPDX-License-Identifier: Apache-2.0
"""The Python package over liballoy on backend:host (two simulated devices, no CUDA call).

Allocations go through the very entry points PyTorch and CuPy call (alloy_torch_malloc/free,
alloy_cupy_malloc/free); the statistics, summary, snapshot and errors are read through the
package. ALLOY_TEST_COMPOSITION picks the composition (virtual by default); CTest runs each.
"""

import ctypes
import os
import pickle
import random
import tempfile
import unittest

from support import (
    TORCH_STAT_ARRAYS,
    TF_NAMES,
    TORCH_MEMORY_STATS_KEYS,
    _lib,
    alloy,
    cupy_free,
    cupy_malloc,
    lib,
    run_python,
    torch_free,
    torch_malloc,
)
import snapshot_check

COMPOSITION = os.environ.get("ALLOY_TEST_COMPOSITION", "virtual")
CAPACITY = 64 << 20
DEVICES = 2
ARRAYS = TORCH_STAT_ARRAYS


def setUpModule():
    alloy.configure(
        f"backend:host,devices:{DEVICES},composition:{COMPOSITION},"
        f"capacity:{CAPACITY},history:1000000"
    )
    alloy.device_count()  # starts the library: later configure() calls are refused


def delta(before, after):
    return {key: after[key] - before[key] for key in before}


def fill(pointer, size, byte):
    ctypes.memset(pointer, byte, size)


def intact(pointer, size, byte):
    return ctypes.string_at(pointer, size).count(bytes([byte])) == size


class Statistics(unittest.TestCase):
    def tearDown(self):
        for device in range(DEVICES):
            self.assertEqual(
                alloy.memory_stats(device)["allocation.all.current"],
                0,
                "a test left allocations live",
            )

    def test_configuration_is_the_one_given(self):
        conf = alloy.configuration()
        for part in ("backend:host", f"devices:{DEVICES}", f"composition:{COMPOSITION}"):
            self.assertIn(part, conf)
        self.assertEqual(alloy.device_count(), DEVICES)

    def test_keys_are_pytorchs_and_values_ints(self):
        for device in range(DEVICES):
            stats = alloy.memory_stats(device)
            self.assertEqual(set(stats), TORCH_MEMORY_STATS_KEYS)
            self.assertEqual(list(stats), sorted(stats))
            for key, value in stats.items():
                self.assertIs(type(value), int, key)
                # PyTorch reports "no maximum" as SIZE_MAX read as a signed number: -1.
                self.assertGreaterEqual(value, -1 if key == "max_split_size" else 0, key)
            statistics = alloy.statistics(device)
            for name in TF_NAMES + ("device_total_bytes", "device_free_bytes", "num_bad_frees"):
                self.assertIn(name, statistics)
                self.assertEqual(
                    getattr(alloy, f"get_{name}", lambda d: statistics[name])(device),
                    statistics[name],
                )

    def test_known_allocations_exactly(self):
        sizes = [1, 512, 4096, 1_000_000, 3 << 20, (3 << 20) + 7]
        before = alloy.memory_stats(0)
        other_before = alloy.memory_stats(1)
        tf_before = alloy.statistics(0)
        pointers = [torch_malloc(size) for size in sizes]
        self.assertTrue(all(pointers))
        self.assertEqual(len(set(pointers)), len(sizes))
        for i, (pointer, size) in enumerate(zip(pointers, sizes)):
            fill(pointer, size, 0x10 + i)
        for i, (pointer, size) in enumerate(zip(pointers, sizes)):
            self.assertTrue(intact(pointer, size, 0x10 + i), "allocations overlap")

        held = alloy.memory_stats(0)
        change = delta(before, held)
        self.assertEqual(change["allocation.all.current"], len(sizes))
        self.assertEqual(change["allocation.all.allocated"], len(sizes))
        self.assertEqual(change["active.all.current"], len(sizes))
        self.assertEqual(change["requested_bytes.all.current"], sum(sizes))
        self.assertEqual(change["requested_bytes.all.allocated"], sum(sizes))
        self.assertGreaterEqual(change["allocated_bytes.all.current"], sum(sizes))
        self.assertEqual(
            held["allocation.all.peak"],
            max(before["allocation.all.peak"], before["allocation.all.current"] + len(sizes)),
        )
        self.assertEqual(alloy.memory_stats(1), other_before, "device 1 moved")

        # The snapshot tells the same: every pointer a block of its requested size, and the
        # device's totals those of its segments and blocks.
        blocks = {
            block["address"]: block
            for segment in alloy.snapshot()["segments"]
            if segment["device"] == 0
            for block in segment["blocks"]
        }
        for pointer, size in zip(pointers, sizes):
            self.assertEqual(blocks[pointer]["state"], "active_allocated")
            self.assertEqual(blocks[pointer]["requested_size"], size)
        tf = delta(tf_before, alloy.statistics(0))
        self.assertEqual(tf["num_allocs"], len(sizes))
        self.assertEqual(tf["bytes_in_use"], change["allocated_bytes.all.current"])
        self.assertGreaterEqual(alloy.get_largest_alloc_size(0), (3 << 20) + 7)
        self.assertEqual(alloy.get_bytes_in_use(0), held["allocated_bytes.all.current"])
        self.assertEqual(alloy.get_bytes_reserved(0), held["reserved_bytes.all.current"])

        for pointer, size in zip(pointers, sizes):
            torch_free(pointer, size)
        after = delta(before, alloy.memory_stats(0))
        for stat in ("allocation", "active", "allocated_bytes", "requested_bytes"):
            self.assertEqual(after[f"{stat}.all.current"], 0, stat)
            self.assertEqual(after[f"{stat}.all.freed"], after[f"{stat}.all.allocated"], stat)
        self.assertEqual(after["allocation.all.freed"], len(sizes))

    def test_allocated_bytes_are_the_bytes_asked(self):
        """alloy hands out blocks of the size asked (rounding stays inside the composition), so
        allocated_bytes and requested_bytes both count what was asked; the snapshot's blocks
        show the rounded sizes, and their requested_size what was asked."""
        sizes = [1, 1_000_000, (3 << 20) + 7]
        before = alloy.memory_stats(0)
        pointers = [torch_malloc(size) for size in sizes]
        try:
            change = delta(before, alloy.memory_stats(0))
            blocks = {
                block["address"]: block
                for segment in alloy.snapshot()["segments"]
                if segment["device"] == 0
                for block in segment["blocks"]
            }
            self.assertEqual(change["requested_bytes.all.current"], sum(sizes))
            self.assertEqual(change["allocated_bytes.all.current"], sum(sizes))
            self.assertEqual([blocks[p]["requested_size"] for p in pointers], sizes)
            for pointer, size in zip(pointers, sizes):
                self.assertGreaterEqual(blocks[pointer]["size"], size)
        finally:
            for pointer, size in zip(pointers, sizes):
                torch_free(pointer, size)

    def test_cupy_entry_points_count_alike(self):
        before = alloy.memory_stats(1)
        sizes = [256, 70_000, 2 << 20]
        pointers = [cupy_malloc(size, 1) for size in sizes]
        self.assertTrue(all(pointers))
        for i, (pointer, size) in enumerate(zip(pointers, sizes)):
            fill(pointer, size, 0x60 + i)
        change = delta(before, alloy.memory_stats(1))
        self.assertEqual(change["allocation.all.current"], 3)
        self.assertEqual(change["requested_bytes.all.current"], sum(sizes))
        for i, (pointer, size) in enumerate(zip(pointers, sizes)):
            self.assertTrue(intact(pointer, size, 0x60 + i))
            cupy_free(pointer, 1)
        change = delta(before, alloy.memory_stats(1))
        self.assertEqual(change["allocation.all.current"], 0)
        self.assertEqual(change["requested_bytes.all.current"], 0)

    def test_stats_agree_with_the_snapshot_and_themselves(self):
        held = [torch_malloc(size, 1) for size in (100, 5000, 2 << 20, 700_000)]
        try:
            stats, state = alloy.memory_stats(1), alloy.snapshot()
            segments = [s for s in state["segments"] if s["device"] == 1]
            blocks = [b for s in segments for b in s["blocks"]]
            self.assertEqual(
                stats["reserved_bytes.all.current"], sum(s["total_size"] for s in segments)
            )
            if not any(s.get("is_expandable") for s in segments):  # else counted by mapping
                self.assertEqual(stats["segment.all.current"], len(segments))
            self.assertEqual(
                stats["allocated_bytes.all.current"],
                sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
            )
            self.assertEqual(
                stats["allocation.all.current"],
                sum(b["state"] == "active_allocated" for b in blocks),
            )
            for stat in ARRAYS:
                for metric in ("current", "allocated", "freed"):
                    self.assertEqual(
                        stats[f"{stat}.small_pool.{metric}"] + stats[f"{stat}.large_pool.{metric}"],
                        stats[f"{stat}.all.{metric}"],
                        f"{stat}.{metric}",
                    )
                for pool in ("all", "small_pool", "large_pool"):
                    self.assertGreaterEqual(
                        stats[f"{stat}.{pool}.peak"], stats[f"{stat}.{pool}.current"]
                    )
            self.assertGreaterEqual(
                stats["reserved_bytes.all.current"], stats["allocated_bytes.all.current"]
            )
        finally:
            for pointer, size in zip(held, (100, 5000, 2 << 20, 700_000)):
                torch_free(pointer, size, 1)

    def test_graph_pools_on_the_host(self):
        """Host streams never capture: no private pool is ever made, and releasing them is a
        harmless call on any valid device, a ValueError on an invalid one."""
        for device in range(alloy.device_count()):
            alloy.release_graph_pools(device)
            figures = alloy.statistics(device)
            self.assertEqual(
                (figures["graph_pools"], figures["graph_pool_live_bytes"], figures["graph_pool_free_bytes"]),
                (0, 0, 0),
            )
        with self.assertRaises(ValueError):
            alloy.release_graph_pools(alloy.device_count())

    def test_reset_peak_and_accumulated(self):
        pointer = torch_malloc(3 << 20)
        torch_free(pointer, 3 << 20)
        alloy.reset_peak_memory_stats(0)
        stats = alloy.memory_stats(0)
        for stat in ARRAYS:
            self.assertEqual(stats[f"{stat}.all.peak"], stats[f"{stat}.all.current"], stat)
        alloy.reset_accumulated_memory_stats(0)
        stats = alloy.memory_stats(0)
        for stat in ARRAYS:
            self.assertEqual(stats[f"{stat}.all.allocated"], 0, stat)
            self.assertEqual(stats[f"{stat}.all.freed"], 0, stat)
        self.assertEqual(stats["num_ooms"], 0)
        self.assertEqual(stats["num_alloc_retries"], 0)

    def test_freed_small_blocks_do_not_read_as_fragmentation(self):
        code = (
            "import alloy, json\nfrom alloy import _lib\nlib = _lib.lib()\n"
            "pointers = [lib.alloy_torch_malloc(1000, 0, None) for _ in range(50)]\n"
            "for p in pointers: lib.alloy_torch_free(p, 1000, 0, None)\n"
            "print(json.dumps(alloy.statistics(0)))"
        )
        stats, result = run_python(code, conf=f"backend:host,composition:{COMPOSITION}")
        self.assertIsNotNone(stats, result.stderr)
        self.assertEqual(stats["bytes_in_use"], 0)
        self.assertGreater(stats["bytes_reserved"], 0)
        # What the heap holds is whole free slabs (and, for virtual, free granules of the arena).
        self.assertLess(stats["fragmentation"], 0.05)

    def test_random_model(self):
        """Random mallocs and frees on both devices and three streams, against a model."""
        rng = random.Random(20261206)
        live = {device: {} for device in range(DEVICES)}  # pointer -> (size, stream, byte)
        start = {device: alloy.memory_stats(device) for device in range(DEVICES)}
        counts = {device: [0, 0, 0, 0] for device in range(DEVICES)}  # mallocs, frees, peaks
        for step in range(400):
            device = rng.randrange(DEVICES)
            mine = live[device]
            if mine and (rng.random() < 0.45 or sum(s for s, _, _ in mine.values()) > 40 << 20):
                pointer = rng.choice(list(mine))
                size, stream_key, byte = mine.pop(pointer)
                self.assertTrue(intact(pointer, size, byte), f"step {step}: block overwritten")
                torch_free(pointer, size, device, stream_key)
                counts[device][1] += 1
            else:
                size = rng.choice(
                    [
                        rng.randrange(1, 4096),
                        rng.randrange(4096, 1 << 20),
                        rng.randrange(1 << 20, 5 << 20),
                    ]
                )
                stream_key = rng.choice([0x51, 0x52, 0x53])
                pointer = torch_malloc(size, device, stream_key)
                self.assertTrue(pointer, f"step {step}: {alloy.last_oom(device)}")
                byte = rng.randrange(256)
                fill(pointer, size, byte)
                mine[pointer] = (size, stream_key, byte)
                counts[device][0] += 1
            counts[device][2] = max(counts[device][2], len(mine))
            requested = sum(s for s, _, _ in mine.values())
            counts[device][3] = max(counts[device][3], requested)
            stats = alloy.memory_stats(device)
            change = delta(start[device], stats)
            self.assertEqual(change["allocation.all.current"], len(mine))
            self.assertEqual(change["allocation.all.allocated"], counts[device][0])
            self.assertEqual(change["allocation.all.freed"], counts[device][1])
            self.assertEqual(change["requested_bytes.all.current"], requested)
            self.assertGreaterEqual(stats["allocation.all.peak"], counts[device][2])
            self.assertGreaterEqual(stats["requested_bytes.all.peak"], counts[device][3])
            self.assertGreaterEqual(change["allocated_bytes.all.current"], requested)
            self.assertGreaterEqual(
                stats["reserved_bytes.all.current"], stats["allocated_bytes.all.current"]
            )
            for stat in ARRAYS:
                self.assertEqual(
                    change[f"{stat}.all.current"],
                    change[f"{stat}.all.allocated"] - change[f"{stat}.all.freed"],
                    f"step {step}: {stat}",
                )
            if step % 50 == 0:
                snapshot_check.check_structure(alloy.snapshot(), DEVICES)
        for device, mine in live.items():
            for pointer, (size, stream_key, byte) in mine.items():
                self.assertTrue(intact(pointer, size, byte))
                torch_free(pointer, size, device, stream_key)


class Snapshot(unittest.TestCase):
    def test_structure_and_history_replay(self):
        held = [
            (torch_malloc(size, device), size, device)
            for device, size in ((0, 10), (1, 3 << 20), (0, 1 << 20), (1, 64))
        ]
        pointer, size, device = held.pop(1)
        torch_free(pointer, size, device)
        torch_malloc(1 << 40, 0)  # an oom in the history
        state = alloy.snapshot()
        try:
            snapshot_check.check(state, DEVICES, complete=True)
            actions = {event["action"] for trace in state["device_traces"] for event in trace}
            self.assertTrue({"alloc", "oom"} <= actions, actions)
            self.assertTrue(actions & {"segment_alloc", "segment_map"}, actions)
            self.assertTrue(actions & {"free_requested", "free_completed"}, actions)
        finally:
            for pointer, size, device in held:
                torch_free(pointer, size, device)
        snapshot_check.check(alloy.snapshot(), DEVICES, complete=True)

    def test_dump_loads_with_the_standard_library(self):
        pointer = torch_malloc(12345)
        try:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "snapshot.pickle")
                alloy.dump_snapshot(path)
                with open(path, "rb") as file:
                    data = file.read()
                self.assertEqual(data[:2], b"\x80\x04", "pickle protocol 4")
                loaded = pickle.loads(data)
            self.assertEqual(loaded, alloy.snapshot())
            snapshot_check.check(loaded, DEVICES)
        finally:
            torch_free(pointer, 12345)

    def test_the_checker_finds_a_broken_history(self):
        pointer = torch_malloc(777)
        try:
            state = alloy.snapshot()
        finally:
            torch_free(pointer, 777)
        trace = state["device_traces"][0]
        index = max(
            i for i, e in enumerate(trace) if e["action"] == "alloc" and e["addr"] == pointer
        )
        forgotten = dict(
            state, device_traces=[trace[:index] + trace[index + 1 :]] + state["device_traces"][1:]
        )
        with self.assertRaises(snapshot_check.SnapshotError):
            snapshot_check.check(forgotten, DEVICES)
        segment = next(s for s in state["segments"] if s["device"] == 0)
        shrunk = dict(segment, total_size=segment["total_size"] + 1)
        with self.assertRaises(snapshot_check.SnapshotError):
            snapshot_check.check_structure(dict(state, segments=[shrunk]), DEVICES)


class TorchHooks(unittest.TestCase):
    """The hooks alloy.torch.install() gives PyTorch, called as PyTorch calls them."""

    def test_init_with_the_device_count(self):
        lib().alloy_torch_init(DEVICES)
        self.assertEqual(lib().alloy_last_error_code(), _lib.OK)
        lib().alloy_torch_init(DEVICES + 1)
        self.assertEqual(lib().alloy_last_error_code(), _lib.BAD_DEVICE)
        self.assertIn(str(DEVICES + 1), _lib.last_error())

    def test_memory_fraction_limits_the_device(self):
        set_fraction = lib().alloy_torch_set_memory_fraction
        set_fraction(0.5, 1)  # backend:host's device memory is its capacity
        self.assertEqual(lib().alloy_last_error_code(), _lib.OK)
        try:
            self.assertFalse(torch_malloc(40 << 20, 1))
            self.assertIn("limit 32.00 MiB", alloy.last_oom(1))
            pointer = torch_malloc(20 << 20, 1)
            self.assertTrue(pointer)
            torch_free(pointer, 20 << 20, 1)
            for fraction, device, code in (
                (1.5, 1, _lib.BAD_VALUE),
                (-0.1, 1, _lib.BAD_VALUE),
                (0.5, DEVICES, _lib.BAD_DEVICE),
            ):
                set_fraction(fraction, device)
                self.assertEqual(lib().alloy_last_error_code(), code, (fraction, device))
            self.assertFalse(torch_malloc(40 << 20, 1), "a refused fraction changed the limit")
        finally:
            set_fraction(1.0, 1)
        pointer = torch_malloc(40 << 20, 1)
        self.assertTrue(pointer, alloy.last_oom(1))
        torch_free(pointer, 40 << 20, 1)

    def test_empty_cache_gives_back_what_nothing_uses(self):
        pointers = [torch_malloc(size) for size in (3 << 20, 5000, 9 << 20)]
        for pointer, size in zip(pointers, (3 << 20, 5000, 9 << 20)):
            torch_free(pointer, size)
        before = alloy.memory_stats(0)
        self.assertEqual(before["allocation.all.current"], 0)
        lib().alloy_torch_empty_cache()
        after = alloy.memory_stats(0)
        self.assertEqual(after["reserved_bytes.all.current"], 0)
        self.assertEqual(after["segment.all.current"], 0)
        if before["reserved_bytes.all.current"]:
            self.assertGreater(after["num_device_free"], before["num_device_free"])
        self.assertEqual(alloy.get_bytes_reserved(0), 0)

    def test_record_stream(self):
        pointer = torch_malloc(4096, 0, 0x51)
        lib().alloy_torch_record_stream(pointer, ctypes.c_void_p(0x52))
        self.assertEqual(lib().alloy_last_error_code(), _lib.OK)
        torch_free(pointer, 4096, 0, 0x51)
        self.assertEqual(alloy.memory_stats(0)["allocation.all.current"], 0)
        lib().alloy_torch_record_stream(pointer, ctypes.c_void_p(0x52))
        self.assertEqual(lib().alloy_last_error_code(), _lib.BAD_POINTER)


class PatchedTorchApi(unittest.TestCase):
    """What alloy.torch.patch_memory_api() puts in torch.cuda's place (torch itself not needed)."""

    def test_replacements_answer_from_alloy(self):
        replacements = alloy.torch._replacements()
        pointer = torch_malloc(5000, 1)
        try:
            stats = alloy.memory_stats(1)
            self.assertEqual(replacements["memory_stats"](1), stats)
            self.assertEqual(replacements["memory_stats"](device_index=1), stats)
            self.assertEqual(
                alloy._flat(replacements["memory_stats_as_nested_dict"](1)), dict(stats)
            )
            for name, key in (
                ("memory_allocated", "allocated_bytes.all.current"),
                ("max_memory_allocated", "allocated_bytes.all.peak"),
                ("memory_reserved", "reserved_bytes.all.current"),
                ("max_memory_reserved", "reserved_bytes.all.peak"),
            ):
                self.assertEqual(replacements[name]("cuda:1"), stats[key], name)
            self.assertEqual(
                replacements["memory_summary"](1, abbreviated=True), alloy.memory_summary(1)
            )
            state = alloy.snapshot()
            self.assertEqual(replacements["_snapshot"](), state)
            self.assertEqual(replacements["memory_snapshot"](), state["segments"])
        finally:
            torch_free(pointer, 5000, 1)
        replacements["reset_peak_memory_stats"](1)
        stats = alloy.memory_stats(1)
        self.assertEqual(stats["requested_bytes.all.peak"], stats["requested_bytes.all.current"])
        with self.assertRaises(ValueError):
            replacements["memory_allocated"](DEVICES)


class Summary(unittest.TestCase):
    def test_summary_reads_like_pytorchs(self):
        pointer = torch_malloc(5 << 20)
        try:
            text = alloy.memory_summary(0)
        finally:
            torch_free(pointer, 5 << 20)
        self.assertGreater(len(text.splitlines()), 5)
        for row in ("Allocated memory", "Requested memory", "Reserved memory", "Allocations"):
            self.assertIn(row, text)
        self.assertNotEqual(alloy.memory_summary(0), alloy.memory_summary(1) + "x")


class BadInput(unittest.TestCase):
    def refused(self, call, code):
        """Runs `call`, checks that it set the error `code` and left both devices' statistics as
        they were, and returns how many bad frees each device counted."""
        before = [alloy.memory_stats(d) for d in range(DEVICES)]
        bad = [alloy.statistics(d)["num_bad_frees"] for d in range(DEVICES)]
        call()
        self.assertEqual(lib().alloy_last_error_code(), code)  # before any other call
        if code != _lib.OK:
            self.assertTrue(_lib.last_error())
        self.assertEqual([alloy.memory_stats(d) for d in range(DEVICES)], before)
        return [alloy.statistics(d)["num_bad_frees"] - b for d, b in enumerate(bad)]

    def test_device_out_of_range(self):
        for call in (
            alloy.memory_stats,
            alloy.memory_summary,
            alloy.statistics,
            alloy.last_oom,
            alloy.reset_peak_memory_stats,
            alloy.reset_accumulated_memory_stats,
            alloy.gpu_mem_get,
            alloy.get_bytes_in_use,
            alloy.get_num_allocs,
        ):
            for device in (DEVICES, -1, 99, "cuda:7", "cpu"):
                with self.assertRaises(ValueError, msg=f"{call.__name__}({device!r})"):
                    call(device)
        with self.assertRaises(TypeError):
            alloy.memory_stats(True)
        for function in (
            lib().alloy_memory_stats_json,
            lib().alloy_statistics_json,
            lib().alloy_memory_summary,
        ):
            self.assertEqual(function(DEVICES, None, 0), 0)
            self.assertEqual(lib().alloy_last_error_code(), _lib.BAD_DEVICE)
            self.assertTrue(_lib.last_error())
        for device in (DEVICES, -1):
            refused = self.refused(
                lambda: self.assertFalse(torch_malloc(64, device)), _lib.BAD_DEVICE
            )
            self.assertEqual(refused, [0, 0])
            refused = self.refused(
                lambda: self.assertFalse(cupy_malloc(64, device)), _lib.BAD_DEVICE
            )
            self.assertEqual(refused, [0, 0])

    def test_free_of_a_pointer_never_given(self):
        stranger = ctypes.create_string_buffer(64)
        stranger = ctypes.addressof(stranger)
        self.assertEqual(self.refused(lambda: torch_free(stranger, 64), _lib.BAD_POINTER), [1, 0])
        self.assertEqual(self.refused(lambda: cupy_free(0x7000_1000, 1), _lib.BAD_POINTER), [0, 1])
        self.assertEqual(self.refused(lambda: torch_free(stranger, 64, 5), _lib.BAD_DEVICE), [0, 0])

    def test_double_free(self):
        pointer = torch_malloc(4096)
        torch_free(pointer, 4096)
        self.assertEqual(self.refused(lambda: torch_free(pointer, 4096), _lib.BAD_POINTER), [1, 0])
        pointer = cupy_malloc(100, 1)
        cupy_free(pointer, 1)
        self.assertEqual(self.refused(lambda: cupy_free(pointer, 1), _lib.BAD_POINTER), [0, 1])

    def test_free_with_the_wrong_device(self):
        pointer = torch_malloc(3000, 0)
        fill(pointer, 3000, 0xAB)
        self.assertEqual(
            self.refused(lambda: torch_free(pointer, 3000, 1), _lib.BAD_POINTER), [0, 1]
        )
        self.assertTrue(intact(pointer, 3000, 0xAB), "a refused free touched the block")
        torch_free(pointer, 3000, 0)
        pointer = cupy_malloc(10, 0)
        self.assertEqual(self.refused(lambda: cupy_free(pointer, 1), _lib.BAD_POINTER), [0, 1])
        cupy_free(pointer, 0)

    def test_out_of_memory(self):
        before = alloy.memory_stats(0)
        self.assertEqual(alloy.last_oom(1), "")
        self.assertFalse(torch_malloc(CAPACITY + 1, 0))
        why = alloy.last_oom(0)
        for part in (
            "out of memory",
            "64.00 MiB",
            "limit",
            "in use",
            "reserved",
            "largest free",
            "fragmentation",
            "device 0",
        ):
            self.assertIn(part, why)
        self.assertEqual(alloy.last_oom(1), "")
        after = alloy.memory_stats(0)
        self.assertEqual(after["num_ooms"], before["num_ooms"] + 1)
        self.assertEqual(after["allocation.all.current"], before["allocation.all.current"])
        self.assertFalse(torch_malloc(2**64 - 1, 0))
        self.assertFalse(cupy_malloc(2**63, 0))
        self.assertEqual(alloy.memory_stats(0)["num_ooms"], before["num_ooms"] + 3)
        # Memory is still served after the failures.
        pointer = torch_malloc(1 << 20)
        self.assertTrue(pointer)
        torch_free(pointer, 1 << 20)

    def test_configure_after_use(self):
        with self.assertRaisesRegex(RuntimeError, "configure"):
            alloy.configure("backend:host")

    def test_configure_refuses_what_the_library_would_misread(self):
        for conf in (5, b"backend:host", ["backend:host"]):
            with self.assertRaisesRegex(TypeError, "str or a dict", msg=repr(conf)):
                alloy.configure(conf)
        with self.assertRaisesRegex(ValueError, "null"):  # C would stop reading at the NUL
            alloy.configure("composition:caching\0,colour:blue")
        with self.assertRaisesRegex(ValueError, "','"):  # one value smuggling in another key
            alloy.configure({"capacity": "1GiB,backend:cuda"})

    def test_device_arguments_of_the_wrong_kind(self):
        class Device:  # what alloy reads of a torch.device
            def __init__(self, kind, index):
                self.type, self.index = kind, index

        for device in ("cuda:\u00b2", "cuda:\uff11", Device("cpu", 0)):
            with self.assertRaisesRegex(ValueError, "not a CUDA device", msg=repr(device)):
                alloy.memory_stats(device)
        self.assertEqual(alloy.memory_stats(Device("cuda", 1)), alloy.memory_stats(1))
        for device in (1.0, [0], object()):
            with self.assertRaisesRegex(TypeError, "^alloy: a device is", msg=repr(device)):
                alloy.memory_stats(device)

    def test_a_refused_text_call_raises_with_the_librarys_message(self):
        with self.assertRaisesRegex(ValueError, "out of range"):
            _lib.text(lib().alloy_memory_stats_json, DEVICES)

    def test_dump_snapshot_takes_a_path_not_a_descriptor(self):
        read, write = os.pipe()
        try:
            with self.assertRaises(TypeError):
                alloy.dump_snapshot(write)
            os.fstat(write)  # still open
        finally:
            os.close(read)
            os.close(write)

    def test_a_library_that_cannot_start_says_why_everywhere(self):
        """A bad ALLOY_CONF (here not even UTF-8) fails the start: every call says why, and a
        later configure() says the configuration was read already."""
        code = (
            "import alloy, json\n"
            "out = []\n"
            "for call in (alloy.device_count, alloy.configuration, alloy.snapshot,\n"
            "             lambda: alloy.configure('backend:host')):\n"
            "    try:\n"
            "        out.append(['returned', repr(call())])\n"
            "    except Exception as e:\n"
            "        out.append([type(e).__name__, str(e)])\n"
            "print(json.dumps(out))"
        )
        value, result = run_python(code, conf=os.fsdecode(b"backend:host,capacity:\xff"))
        self.assertEqual(result.returncode, 0, result.stderr)
        for kind, message in value[:3]:
            self.assertEqual(kind, "ValueError", message)
            self.assertIn("capacity", message)
        self.assertEqual(value[3][0], "RuntimeError")
        self.assertIn("could not start", value[3][1])

    def test_gpu_mem_get(self):
        memory = alloy.gpu_mem_get(0)
        statistics = alloy.statistics(0)
        self.assertEqual(memory.total, statistics["device_total_bytes"] >> 20)
        self.assertEqual(memory.free, statistics["device_free_bytes"] >> 20)
        self.assertIn(memory.total - memory.free - memory.used, (0, 1))


if __name__ == "__main__":
    unittest.main()
