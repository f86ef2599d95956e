# SPDX-License-Identifier: Apache-2.0
"""alloy's allocators for PyTorch and CuPy, and their statistics, from Python.

A pure-Python package over liballoy (alloy/capi.h) through ctypes; torch and cupy are imported
only by ``alloy.torch`` and ``alloy.cupy`` when called. One allocator per device, configured once
per process (``configure``, or the environment variable ALLOY_CONF read at first use)::

    import alloy, torch
    alloy.torch.install("composition:virtual,capacity:0.9")   # before the first CUDA tensor
    ...                                                        # train as usual
    print(alloy.memory_summary())
    alloy.dump_snapshot("snapshot.pickle")                     # open in pytorch.org/memory_viz

``device=None`` means torch.cuda.current_device() once torch has initialised CUDA, else 0.
The contract: (docs/design.md#c-library-and-python).
"""

import collections
import operator
import os
import pickle
import reprlib
import sys

from . import _lib

__all__ = [
    "configure",
    "configuration",
    "device_count",
    "memory_stats",
    "memory_summary",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "release_graph_pools",
    "record_memory_history",
    "snapshot",
    "dump_snapshot",
    "statistics",
    "last_oom",
    "gpu_mem_get",
    "GPUMemory",
    "get_num_allocs",
    "get_bytes_in_use",
    "get_peak_bytes_in_use",
    "get_largest_alloc_size",
    "get_bytes_limit",
    "get_bytes_reserved",
    "get_peak_bytes_reserved",
    "get_bytes_reservable_limit",
    "get_bytes_inactive",
    "get_bytes_active",
    "get_peak_bytes_active",
    "get_bytes_reclaimed",
    "get_num_single_reclaims",
    "get_num_full_reclaims",
]


def _fail(what, code):
    """Raises the library's last error: ValueError for a bad key or value, else RuntimeError."""
    message = f"{what}: {_lib.last_error()}"
    raise (ValueError if code in (_lib.UNKNOWN_KEY, _lib.BAD_VALUE) else RuntimeError)(message)


def _checked(function, *args):
    """Calls one of liballoy's functions that returns nothing, raising the error it set."""
    function(*args)
    code = _lib.lib().alloy_last_error_code()
    if code != _lib.OK:
        _fail(function.__name__, code)


def _entry(key, value):
    # One key:value of a dict configuration; a comma or colon would smuggle in another entry.
    entry = f"{key}:{value}"
    if any(mark in f"{key}{value}" for mark in ",:"):
        raise ValueError(f"alloy.configure: {entry!r}: a key or value holds ',' or ':'")
    return entry


def configure(conf=None):
    """Configures alloy before its first use, as PYTORCH_CUDA_ALLOC_CONF does PyTorch's allocator.

    ``conf`` is a string ("composition:virtual,capacity:8GiB,history:10000") or a dict of the
    same keys; None means the defaults. Until alloy serves its first call, a later configure()
    replaces an earlier one; after it, RuntimeError (configuration is once per process).
    ValueError names an unknown key or a bad value; TypeError, a ``conf`` of another type.
    """
    if isinstance(conf, dict):
        conf = ",".join(_entry(key, value) for key, value in conf.items())
    if conf is not None and not isinstance(conf, str):
        raise TypeError(f"alloy.configure: conf is a str or a dict, not {type(conf).__name__}")
    if conf is not None and "\0" in conf:  # C would read only up to it
        raise ValueError("alloy.configure: embedded null character in conf")
    code = _lib.lib().alloy_configure(None if conf is None else conf.encode())
    if code != _lib.OK:
        _fail(f"alloy.configure({reprlib.repr(conf)})", code)


def configuration():
    """The configuration in force, normalized ("backend:cuda,composition:virtual,...")."""
    value = _lib.lib().alloy_configuration()
    if not value:  # the library cannot start
        _fail("alloy.configuration()", _lib.lib().alloy_last_error_code())
    return value.decode()


def device_count():
    """Devices alloy serves (CUDA's, or backend:host's simulated ones)."""
    count = _lib.lib().alloy_device_count()
    if count < 0:  # a bad ALLOY_CONF, or no CUDA
        _fail("alloy cannot start", _lib.lib().alloy_last_error_code())
    return count


def _device_index(device):
    if device is None:
        framework = sys.modules.get("torch")
        initialised = framework is not None and framework.cuda.is_initialized()
        device = framework.cuda.current_device() if initialised else 0
    elif isinstance(device, str):  # "cuda:1", as torch accepts
        kind, _, index = device.partition(":")
        if kind != "cuda" or (index and not (index.isascii() and index.isdigit())):
            raise ValueError(f"alloy: {device!r} is not a CUDA device")
        return _device_index(int(index) if index else None)
    elif isinstance(getattr(device, "type", None), str):  # torch.device
        if device.type != "cuda":
            raise ValueError(f"alloy: {device!r} is not a CUDA device")
        return _device_index(device.index)
    if isinstance(device, bool):
        raise TypeError("alloy: a device is an index, not a bool")
    try:
        device = operator.index(device)
    except TypeError:
        raise TypeError(
            f"alloy: a device is an int, 'cuda:N' or a torch.device, not {type(device).__name__}"
        ) from None
    count = device_count()
    if not 0 <= device < count:
        raise ValueError(f"alloy: device {device} out of range: alloy serves {count} device(s)")
    return device


def _flat(value, prefix=""):
    if not isinstance(value, dict):
        return {prefix: value}
    flat = {}
    for key, inner in value.items():
        flat.update(_flat(inner, f"{prefix}.{key}" if prefix else key))
    return flat


def memory_stats(device=None):
    """The statistics of torch.cuda.memory_stats(), keyed exactly as PyTorch does, sorted."""
    stats = _flat(_lib.json_text(_lib.lib().alloy_memory_stats_json, _device_index(device)))
    return collections.OrderedDict(sorted((key, int(value)) for key, value in stats.items()))


def memory_summary(device=None, abbreviated=False):
    """A table like torch.cuda.memory_summary() (``abbreviated`` is accepted and ignored)."""
    return _lib.text(_lib.lib().alloy_memory_summary, _device_index(device))


def reset_peak_memory_stats(device=None):
    _checked(_lib.lib().alloy_reset_peak, _device_index(device))


def reset_accumulated_memory_stats(device=None):
    _checked(_lib.lib().alloy_reset_accumulated, _device_index(device))


def release_graph_pools(device=None):
    """Gives back the private pools of the CUDA graphs captured through alloy on a device.

    PyTorch does not tell a pluggable allocator when a graph is destroyed, so the memory a graph
    captured (blocks it freed inside the capture included, which its replays reuse) stays its own
    until this call: make it once those graphs will not be replayed again.
    """
    _checked(_lib.lib().alloy_release_graph_pools, _device_index(device))


MAX_HISTORY = 1 << 28  # events a device keeps at most


def record_memory_history(max_entries=MAX_HISTORY):
    """From now on every device keeps its last ``max_entries`` allocation events for snapshot()
    (the ``history`` key sets it from the start); 0 stops and drops those kept. alloy's
    torch.cuda.memory._record_memory_history(), which alloy.torch.patch_memory_api() routes here."""
    name = "alloy.record_memory_history"
    if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 0:
        raise ValueError(f"{name}: max_entries is a count, not {max_entries!r}")
    if max_entries > MAX_HISTORY:  # ctypes would wrap it
        raise ValueError(f"{name}: at most {MAX_HISTORY} events, not {max_entries}")
    _checked(_lib.lib().alloy_record_history, max_entries)


def snapshot():
    """Every device's segments, blocks and history as torch.cuda.memory._snapshot() gives them."""
    return _lib.json_text(_lib.lib().alloy_snapshot_json)


def dump_snapshot(path="dump_snapshot.pickle"):
    """Pickles snapshot() (protocol 4) for pytorch.org/memory_viz and torch/cuda/_memory_viz.py."""
    if not isinstance(path, (str, bytes, os.PathLike)):  # open() would take an int as a descriptor
        raise TypeError(
            f"alloy.dump_snapshot: path is a str or os.PathLike, not {type(path).__name__}"
        )
    state = snapshot()
    with open(path, "wb") as file:
        pickle.dump(state, file, protocol=4)


def statistics(device=None):
    """alloy's own statistics (TensorFlow's and Large Model Support's names, device memory)."""
    return _lib.json_text(_lib.lib().alloy_statistics_json, _device_index(device))


def last_oom(device=None):
    """Why the device's last request failed ("" if none has)."""
    return (_lib.lib().alloy_last_oom(_device_index(device)) or b"").decode()


GPUMemory = collections.namedtuple("GPUMemory", ["total", "free", "used"])


def gpu_mem_get(id=None):
    """fastai's gpu_mem_get: the device's total, free and used memory in MB."""
    stats = statistics(id)
    total, free = stats["device_total_bytes"], stats["device_free_bytes"]
    return GPUMemory(total >> 20, free >> 20, (total - free) >> 20)


# TensorFlow Large Model Support's statistics, by device.
def get_num_allocs(gpu_id=None):
    return statistics(gpu_id)["num_allocs"]


def get_bytes_in_use(gpu_id=None):
    return statistics(gpu_id)["bytes_in_use"]


def get_peak_bytes_in_use(gpu_id=None):
    return statistics(gpu_id)["peak_bytes_in_use"]


def get_largest_alloc_size(gpu_id=None):
    return statistics(gpu_id)["largest_alloc_size"]


def get_bytes_limit(gpu_id=None):
    return statistics(gpu_id)["bytes_limit"]


def get_bytes_reserved(gpu_id=None):
    return statistics(gpu_id)["bytes_reserved"]


def get_peak_bytes_reserved(gpu_id=None):
    return statistics(gpu_id)["peak_bytes_reserved"]


def get_bytes_reservable_limit(gpu_id=None):
    return statistics(gpu_id)["bytes_reservable_limit"]


def get_bytes_inactive(gpu_id=None):
    return statistics(gpu_id)["bytes_inactive"]


def get_bytes_active(gpu_id=None):
    return statistics(gpu_id)["bytes_active"]


def get_peak_bytes_active(gpu_id=None):
    return statistics(gpu_id)["peak_bytes_active"]


def get_bytes_reclaimed(gpu_id=None):
    return statistics(gpu_id)["bytes_reclaimed"]


def get_num_single_reclaims(gpu_id=None):
    return statistics(gpu_id)["num_single_reclaims"]


def get_num_full_reclaims(gpu_id=None):
    return statistics(gpu_id)["num_full_reclaims"]


from . import cupy, torch  # noqa: E402  (neither imports its framework until called)
