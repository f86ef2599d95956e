# SPDX-License-Identifier: Apache-2.0
"""alloy as PyTorch's CUDA allocator: globally, as a MemPool, and behind torch.cuda's statistics.

PyTorch takes a foreign allocator through CUDAPluggableAllocator (torch/cuda/memory.py): the
malloc and free functions of a shared library, plus hooks set on the allocator object before
it is made current (torch/csrc/cuda/Module.cpp): set_init_fn (called with the device count when
CUDA initialises), set_reset_fn (torch.cuda.empty_cache), set_memory_fraction_fn
(torch.cuda.set_per_process_memory_fraction) and set_record_stream_fn (Tensor.record_stream).
All four are set. Not set: set_base_alloc_fn, which serves only CUDA IPC of tensors (PyTorch
refuses that for every pluggable allocator: "does not yet support shareIpcHandle"), and the
graph-pool hooks, whose std::function arguments no C function can take. So alloy gives each
capture it sees a private pool of its own (docs/design.md#c-library-and-python), kept until
alloy.release_graph_pools(); while a capture runs, every composition serves it only from what
it holds (no cudaMalloc, no new mapping), and a request that needs more fails (an out-of-memory
error that ends the capture): warm the cache, as PyTorch's warm-up iterations do.

Out of memory: PyTorch does not check the pointer a pluggable allocator's malloc returns, so the
global swap uses alloy_torch_malloc_or_throw, whose C++ exception PyTorch turns into a
RuntimeError with alloy's explanation. A MemPool's segments use alloy_torch_malloc, whose NULL
PyTorch's caching allocator checks (it then frees its cache and retries, as with cudaMalloc).
"""

import alloy
from . import _lib

_installed = None  # the CUDAPluggableAllocator made current by install()
_patched = {}  # (module, name) -> the function patch_memory_api() replaced


def _pluggable(malloc="alloy_torch_malloc_or_throw"):
    import torch

    allocator = torch.cuda.memory.CUDAPluggableAllocator(_lib.path(), malloc, "alloy_torch_free")
    hooks = allocator.allocator()
    hooks.set_init_fn(_lib.address("alloy_torch_init"))
    hooks.set_reset_fn(_lib.address("alloy_torch_empty_cache"))
    hooks.set_memory_fraction_fn(_lib.address("alloy_torch_set_memory_fraction"))
    hooks.set_record_stream_fn(_lib.address("alloy_torch_record_stream"))
    return allocator


def install(conf=None):
    """Makes alloy PyTorch's CUDA allocator for the whole process (once, before CUDA is used).

    ``conf`` configures alloy first (see alloy.configure); None keeps ALLOY_CONF or the defaults.
    RuntimeError when PyTorch has already initialised CUDA (and so its own allocator), or when
    alloy is installed already. Returns the CUDAPluggableAllocator.
    """
    global _installed
    import torch

    if _installed is not None:
        raise RuntimeError("alloy.torch.install: alloy is PyTorch's allocator already")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "alloy.torch.install: PyTorch has initialised CUDA and its own allocator already; "
            "install alloy before the first CUDA tensor or call (right after import torch)"
        )
    if conf is not None:
        alloy.configure(conf)
    alloy.device_count()  # starts the library: a bad ALLOY_CONF or no CUDA is reported here
    allocator = _pluggable()
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as error:
        if "initialized" not in str(error):
            raise
        raise RuntimeError(
            "alloy.torch.install: PyTorch's current allocator is initialised already (another "
            f"allocator was installed, or CUDA was used): {error}"
        ) from error
    _installed = allocator
    return allocator


def mem_pool(conf=None, **options):
    """A torch.cuda.MemPool whose segments come from alloy (PyTorch's caching allocator stays).

    Use it as PyTorch documents: ``with torch.cuda.use_mem_pool(pool): ...``. ``conf`` as for
    install(); ``options`` go to MemPool (use_on_oom, no_split).
    """
    import torch

    if conf is not None:
        alloy.configure(conf)
    alloy.device_count()
    return torch.cuda.MemPool(_pluggable("alloy_torch_malloc").allocator(), **options)


def _by_device(function):
    # torch.cuda's functions take `device`, torch.accelerator's `device_index`.
    def by_device(device=None, device_index=None, **_ignored):
        return function(device if device_index is None else device_index)

    by_device.__name__ = function.__name__
    return by_device


def _reader(key):
    return lambda device: alloy.memory_stats(device)[key]


def _nested_stats(device):
    nested = {}
    for key, value in alloy.memory_stats(device).items():
        *path, leaf = key.split(".")
        place = nested
        for part in path:
            place = place.setdefault(part, {})
        place[leaf] = value
    return nested


def _dump_snapshot(filename="dump_snapshot.pickle", *args, **kwargs):
    alloy.dump_snapshot(filename)


def _record_memory_history(enabled="all", *args, max_entries=alloy.MAX_HISTORY, **kwargs):
    # enabled: "all" (or the legacy True) records; None, "state" (no history) or False stops.
    # Call stacks are not recorded; PyTorch's default max_entries (sys.maxsize) means alloy's most.
    max_entries = kwargs.get("trace_alloc_max_entries", max_entries)  # the legacy keyword
    if kwargs.get("clear_history"):
        alloy.record_memory_history(0)
    on = enabled not in (None, False, "state")
    alloy.record_memory_history(min(max_entries, alloy.MAX_HISTORY) if on else 0)


def _replacements():
    return {
        "memory_stats": _by_device(alloy.memory_stats),
        "memory_stats_as_nested_dict": _by_device(_nested_stats),
        "memory_summary": _by_device(alloy.memory_summary),
        "memory_allocated": _by_device(_reader("allocated_bytes.all.current")),
        "max_memory_allocated": _by_device(_reader("allocated_bytes.all.peak")),
        "memory_reserved": _by_device(_reader("reserved_bytes.all.current")),
        "max_memory_reserved": _by_device(_reader("reserved_bytes.all.peak")),
        "reset_peak_memory_stats": _by_device(alloy.reset_peak_memory_stats),
        "reset_accumulated_memory_stats": _by_device(alloy.reset_accumulated_memory_stats),
        "memory_snapshot": lambda *args, **kwargs: alloy.snapshot()["segments"],
        "_snapshot": lambda *args, **kwargs: alloy.snapshot(),
        "_dump_snapshot": _dump_snapshot,
        "_record_memory_history": _record_memory_history,
    }


def patch_memory_api():
    """Makes torch.cuda's memory statistics answer from alloy.

    With a pluggable allocator, torch.cuda.memory_stats(), memory_allocated(), memory_summary(),
    memory_snapshot() ... raise ("CUDAPluggableAllocator does not yet support getDeviceStats",
    pytorch#133281). This replaces them in torch.cuda, torch.cuda.memory and torch.accelerator
    (where it has them) by alloy's, keyed exactly as PyTorch's. unpatch_memory_api() undoes it.
    """
    import torch

    modules = [torch.cuda, torch.cuda.memory, getattr(torch, "accelerator", None)]
    for name, function in _replacements().items():
        for module in modules:
            if module is not None and hasattr(module, name) and (module, name) not in _patched:
                _patched[(module, name)] = getattr(module, name)
                setattr(module, name, function)


def unpatch_memory_api():
    """Gives torch back the functions patch_memory_api() replaced."""
    while _patched:
        (module, name), function = _patched.popitem()
        setattr(module, name, function)
