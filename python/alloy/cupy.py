# SPDX-License-Identifier: Apache-2.0
"""alloy as CuPy's allocator (cupy.cuda.memory.CFunctionAllocator over alloy_cupy_malloc/free)."""

import alloy
from . import _lib

_installed = None


def install(conf=None):
    """Makes alloy CuPy's device allocator (cupy.cuda.set_allocator), on every device.

    ``conf`` configures alloy first (see alloy.configure). CuPy's CFunctionAllocator hands a
    NULL from malloc on as a pointer; this raises cupy's OutOfMemoryError instead, with alloy's
    explanation. Returns the allocating function given to CuPy.
    """
    global _installed
    import cupy

    if conf is not None:
        alloy.configure(conf)
    alloy.device_count()
    library = _lib.lib()
    functions = cupy.cuda.memory.CFunctionAllocator(
        0, _lib.address("alloy_cupy_malloc"), _lib.address("alloy_cupy_free"), library
    )

    def malloc(size):
        pointer = functions.malloc(size)
        if size and not pointer.ptr:
            device = cupy.cuda.runtime.getDevice()
            stats = alloy.statistics(device)
            error = cupy.cuda.memory.OutOfMemoryError(
                size, stats["bytes_in_use"], stats["bytes_limit"]
            )
            error.args = (f"{error.args[0]} alloy: {alloy.last_oom(device)}",)
            raise error
        return pointer

    cupy.cuda.set_allocator(malloc)
    _installed = malloc
    return malloc
