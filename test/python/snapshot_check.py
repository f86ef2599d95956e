# SPDX-License-Identifier: Apache-2.0
"""Checks a snapshot in the schema of torch.cuda.memory._snapshot() the way memory_viz reads it.

Structure: every segment is covered by its blocks, in address order, without gap or overlap;
its allocated_size and active_size are its blocks'; segments of a device do not overlap.
History: pytorch.org/memory_viz draws a past moment by starting from the snapshot's live
blocks and mapped segments and undoing the device's trace from its last event back to that
moment. check() undoes every event so, and fails where an event cannot be undone (an `alloc`
of a block that is not live, a `segment_alloc` under a live block ...). With the whole history
kept, undoing all of it must leave nothing mapped and nothing live.
"""

ACTIONS = {
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
}
BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}


class SnapshotError(AssertionError):
    pass


def _require(condition, message):
    if not condition:
        raise SnapshotError(message)


def check_structure(snapshot, device_count):
    _require(isinstance(snapshot.get("segments"), list), "no list of segments")
    traces = snapshot.get("device_traces")
    _require(
        isinstance(traces, list) and len(traces) == device_count,
        f"device_traces must list {device_count} devices",
    )
    by_device = {}
    for segment in snapshot["segments"]:
        where = f"segment at {segment.get('address')}"
        for key in (
            "device",
            "address",
            "total_size",
            "stream",
            "segment_type",
            "allocated_size",
            "active_size",
            "blocks",
        ):
            _require(key in segment, f"{where}: no {key}")
        _require(0 <= segment["device"] < device_count, f"{where}: device out of range")
        _require(segment["segment_type"] in ("small", "large"), f"{where}: bad segment_type")
        _require(segment["blocks"], f"{where}: no blocks")
        address, allocated, active = segment["address"], 0, 0
        for block in segment["blocks"]:
            _require(
                block["address"] == address,
                f"{where}: block at {block['address']}, expected {address} (gap or overlap)",
            )
            _require(block["size"] > 0, f"{where}: empty block at {address}")
            _require(block["state"] in BLOCK_STATES, f"{where}: bad state {block['state']!r}")
            if block["state"] != "inactive":
                _require(
                    0 < block["requested_size"] <= block["size"],
                    f"{where}: block at {address} asked {block['requested_size']}, "
                    f"holds {block['size']}",
                )
                active += block["size"]
                if block["state"] == "active_allocated":
                    allocated += block["size"]
            address += block["size"]
        _require(
            address == segment["address"] + segment["total_size"],
            f"{where}: blocks sum to {address - segment['address']}, "
            f"total_size is {segment['total_size']}",
        )
        _require(
            segment["allocated_size"] == allocated,
            f"{where}: allocated_size {segment['allocated_size']}, blocks say {allocated}",
        )
        _require(
            segment["active_size"] == active,
            f"{where}: active_size {segment['active_size']}, blocks say {active}",
        )
        by_device.setdefault(segment["device"], []).append(segment)
    for segments in by_device.values():
        segments.sort(key=lambda s: s["address"])
        for before, after in zip(segments, segments[1:]):
            _require(
                before["address"] + before["total_size"] <= after["address"],
                f"segments at {before['address']} and {after['address']} overlap",
            )


class _Memory:
    """One device's mapped ranges and live blocks while its history is undone."""

    def __init__(self):
        self.mapped = []  # disjoint [start, end) ranges, in no order
        self.live = {}  # address -> [size as the trace gives it, free requested?]

    def covered(self, start, end):
        return any(s <= start and end <= e for s, e in self.mapped)

    def map(self, start, end, event):
        _require(
            all(end <= s or e <= start for s, e in self.mapped),
            f"{event}: [{start}, {end}) overlaps mapped memory",
        )
        self.mapped.append((start, end))

    def unmap(self, start, end, event):
        for i, (s, e) in enumerate(self.mapped):
            if s <= start and end <= e:
                del self.mapped[i]
                self.mapped += [r for r in ((s, start), (end, e)) if r[0] < r[1]]
                break
        else:
            raise SnapshotError(f"{event}: [{start}, {end}) is not mapped")
        inside = [a for a, (size, _) in self.live.items() if a < end and start < a + size]
        _require(not inside, f"{event}: live blocks at {inside} inside [{start}, {end})")


def check_history(snapshot, device, complete):
    """Undoes the device's trace from the snapshot's state; see the module's comment."""
    memory = _Memory()
    for segment in snapshot["segments"]:
        if segment["device"] == device:
            memory.map(segment["address"], segment["address"] + segment["total_size"], "snapshot")
            for block in segment["blocks"]:
                if block["state"] != "inactive":
                    memory.live[block["address"]] = [
                        block["requested_size"],
                        block["state"] == "active_pending_free",
                    ]
    trace = snapshot["device_traces"][device]
    for index in range(len(trace) - 1, -1, -1):
        event = trace[index]
        action = event.get("action")
        name = f"device {device} event {index} ({action})"
        _require(action in ACTIONS, f"{name}: unknown action")
        if action == "snapshot":
            continue
        _require(isinstance(event.get("size"), int) and event["size"] >= 0, f"{name}: no size")
        if action == "oom":
            _require("device_free" in event, f"{name}: no device_free")
            continue
        address, size = event["addr"], event["size"]
        block = memory.live.get(address)
        if action == "alloc":
            _require(block is not None and not block[1], f"{name}: block {address} not live")
            _require(block[0] == size, f"{name}: size {size}, the block asked {block[0]}")
            del memory.live[address]
        elif action == "free_requested":
            _require(block is not None and block[1], f"{name}: block {address} not being freed")
            _require(block[0] == size, f"{name}: size {size}, the block asked {block[0]}")
            block[1] = False
        elif action == "free_completed":
            _require(block is None, f"{name}: block {address} live at once")
            _require(memory.covered(address, address + size), f"{name}: block outside segments")
            overlap = [
                a for a, (s, _) in memory.live.items() if a < address + size and address < a + s
            ]
            _require(not overlap, f"{name}: block overlaps live blocks at {overlap}")
            memory.live[address] = [size, True]
        elif action in ("segment_free", "segment_unmap"):
            memory.map(address, address + size, name)
        else:  # segment_alloc, segment_map
            memory.unmap(address, address + size, name)
    if complete:
        _require(
            not memory.live,
            f"device {device}: blocks {sorted(memory.live)} live before history began",
        )
        _require(not memory.mapped, f"device {device}: memory mapped before history began")
    return memory


def check(snapshot, device_count, complete=True):
    check_structure(snapshot, device_count)
    for device in range(device_count):
        check_history(snapshot, device, complete)
