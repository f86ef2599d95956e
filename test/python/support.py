# SPDX-License-Identifier: Apache-2.0
"""What the Python tests share: the package from the clone, liballoy's raw calls, PyTorch's keys."""

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

CLONE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(CLONE / "python"))

import alloy  # noqa: E402
from alloy import _lib  # noqa: E402

# torch.cuda.memory_stats()'s keys, as torch/csrc/cuda/Module.cpp (THCPModule_memoryStats) builds
# them: nine statistics by pool and metric, two oversize ones by metric, six counters.
TORCH_STAT_ARRAYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
TORCH_MEMORY_STATS_KEYS = frozenset(
    [
        f"{stat}.{pool}.{metric}"
        for stat in TORCH_STAT_ARRAYS
        for pool in ("all", "small_pool", "large_pool")
        for metric in ("current", "peak", "allocated", "freed")
    ]
    + [
        f"{stat}.{metric}"
        for stat in ("oversize_allocations", "oversize_segments")
        for metric in ("current", "peak", "allocated", "freed")
    ]
    + [
        "num_alloc_retries",
        "num_ooms",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
        "max_split_size",
    ]
)

# The statistics by device of TensorFlow Large Model Support, as alloy.get_<name>(gpu_id).
TF_NAMES = (
    "num_allocs",
    "bytes_in_use",
    "peak_bytes_in_use",
    "largest_alloc_size",
    "bytes_limit",
    "bytes_reserved",
    "peak_bytes_reserved",
    "bytes_reservable_limit",
    "bytes_inactive",
    "bytes_active",
    "peak_bytes_active",
    "bytes_reclaimed",
    "num_single_reclaims",
    "num_full_reclaims",
)


def lib():
    return _lib.lib()


def stream(key):
    """backend:host takes any pointer-sized value as a stream handle."""
    return ctypes.c_void_p(key)


def torch_malloc(size, device=0, stream_key=0x51):
    return lib().alloy_torch_malloc(size, device, stream(stream_key))


def torch_free(pointer, size, device=0, stream_key=0x51):
    lib().alloy_torch_free(pointer, size, device, stream(stream_key))


def cupy_malloc(size, device=0):
    return lib().alloy_cupy_malloc(None, size, device)


def cupy_free(pointer, device=0):
    lib().alloy_cupy_free(None, pointer, device)


def run_python(code, conf=None, env=None, path=None, unset=()):
    """Runs `code` in a fresh interpreter (alloy is configured once per process) that imports
    alloy from `path` (the clone's python/ by default); its last stdout line is JSON. Returns
    (that value, the whole result)."""
    environment = dict(
        os.environ, PYTHONPATH=str(path or CLONE / "python"), PYTHONDONTWRITEBYTECODE="1"
    )
    for name in ("ALLOY_CONF",) + tuple(unset):
        environment.pop(name, None)
    if conf is not None:
        environment["ALLOY_CONF"] = conf
    environment.update(env or {})
    result = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120
    )
    lines = result.stdout.strip().splitlines()
    value = json.loads(lines[-1]) if result.returncode == 0 and lines else None
    return value, result
