# SPDX-License-Identifier: Apache-2.0
"""Finds liballoy, declares its C functions for ctypes, and reads its texts.

The library is looked for, in this order (the first that exists is loaded; ALLOY_LIBRARY, when
set, is the only place tried):

1. ``ALLOY_LIBRARY``: a path to liballoy.so.
2. Beside the package: ``alloy/liballoy.so``, then ``<prefix>/lib/liballoy.so`` for a package
   installed in ``<prefix>/lib/python3.X/site-packages/alloy`` (``cmake --install`` puts the
   library in ``<prefix>/lib``; ``pip install --prefix <prefix> ./python`` puts the package there).
3. The build tree, when the package runs from a clone: the newest ``build*/**/liballoy.so``.
4. ``ctypes.util.find_library("alloy")`` (LD_LIBRARY_PATH, ldconfig's cache).
"""

import ctypes
import ctypes.util
import json
import os
import threading
from ctypes import POINTER, c_char, c_char_p, c_double, c_int, c_size_t, c_void_p
from pathlib import Path

# enum alloy_status of alloy/capi.h
OK, UNKNOWN_KEY, BAD_VALUE, ALREADY_CONFIGURED, BAD_DEVICE, BAD_POINTER, UNAVAILABLE = range(7)

_TEXT = (c_int, POINTER(c_char), c_size_t)
_PROTOTYPES = {
    "alloy_configure": (c_int, c_char_p),
    "alloy_configuration": (c_char_p,),
    "alloy_last_error": (c_char_p,),
    "alloy_last_error_code": (c_int,),
    "alloy_device_count": (c_int,),
    "alloy_torch_malloc": (c_void_p, c_size_t, c_int, c_void_p),
    "alloy_torch_free": (None, c_void_p, c_size_t, c_int, c_void_p),
    "alloy_torch_init": (None, c_int),
    "alloy_torch_empty_cache": (None,),
    "alloy_torch_set_memory_fraction": (None, c_double, c_int),
    "alloy_torch_record_stream": (None, c_void_p, c_void_p),
    "alloy_cupy_malloc": (c_void_p, c_void_p, c_size_t, c_int),
    "alloy_cupy_free": (None, c_void_p, c_void_p, c_int),
    "alloy_memory_stats_json": (c_size_t,) + _TEXT,
    "alloy_statistics_json": (c_size_t,) + _TEXT,
    "alloy_memory_summary": (c_size_t,) + _TEXT,
    "alloy_snapshot_json": (c_size_t, POINTER(c_char), c_size_t),
    "alloy_reset_peak": (None, c_int),
    "alloy_record_history": (None, c_size_t),
    "alloy_reset_accumulated": (None, c_int),
    "alloy_release_graph_pools": (None, c_int),
    "alloy_last_oom": (c_char_p, c_int),
}

_lock = threading.Lock()
_loaded = None  # (path, ctypes.CDLL)


def candidates():
    """The places looked at, in order, as (where it came from, path) pairs."""
    explicit = os.environ.get("ALLOY_LIBRARY")
    if explicit:
        return [("ALLOY_LIBRARY", Path(explicit))]
    here = Path(__file__).resolve().parent
    found = [("inside the package", here / "liballoy.so")]
    if here.parent.name in ("site-packages", "dist-packages"):
        found.append(("the install prefix's lib/", here.parents[2] / "liballoy.so"))
    clone = here.parents[1]
    if (clone / "include" / "alloy" / "capi.h").is_file():
        built = sorted(clone.glob("build*/**/liballoy.so"), key=lambda p: p.stat().st_mtime)
        found += [("the build tree", p) for p in reversed(built)]
    system = ctypes.util.find_library("alloy")
    if system:
        found.append(("ctypes.util.find_library('alloy')", Path(system)))
    return found


def load():
    """(path, CDLL) of liballoy, loaded once; OSError naming every place tried when absent."""
    global _loaded
    with _lock:
        if _loaded is None:
            tried = []
            for origin, path in candidates():
                # find_library gives a bare soname, which the loader resolves itself.
                if path.is_file() or origin.startswith("ctypes"):
                    lib = ctypes.CDLL(str(path))
                    for name, (restype, *argtypes) in _PROTOTYPES.items():
                        function = getattr(lib, name)
                        function.restype, function.argtypes = restype, argtypes
                    _loaded = (str(path), lib)
                    break
                tried.append(f"{path} ({origin})")
            else:
                if "ALLOY_LIBRARY" not in os.environ:
                    tried.append("ctypes.util.find_library('alloy'): nothing")
                raise OSError(
                    "alloy: liballoy.so not found; build it (cmake --build <build> --target "
                    "alloy_capi) or set ALLOY_LIBRARY to its path. Tried: " + "; ".join(tried)
                )
        return _loaded


def lib():
    return load()[1]


def path():
    """The file loaded, as CUDAPluggableAllocator wants it."""
    return load()[0]


def address(name):
    """The address of one of liballoy's functions, as PyTorch's and CuPy's hooks take it."""
    return ctypes.cast(getattr(lib(), name), c_void_p).value


def last_error():
    # The message may quote bytes of a configuration that are not UTF-8 (ALLOY_CONF is any bytes).
    return lib().alloy_last_error().decode(errors="replace")


def text(function, *args):
    """The whole text a sizing function writes (it may grow between the two calls); ValueError or
    RuntimeError, with the library's message, when the function refused the call (a text is
    never empty)."""
    needed = function(*args, None, 0)
    if needed == 0:
        code = lib().alloy_last_error_code()
        bad_input = code in (UNKNOWN_KEY, BAD_VALUE, BAD_DEVICE)
        raise (ValueError if bad_input else RuntimeError)(f"{function.__name__}: {last_error()}")
    while True:
        buffer = ctypes.create_string_buffer(needed + 1)
        length = function(*args, buffer, needed + 1)
        if length <= needed:
            return buffer.raw[:length].decode()
        needed = length


def json_text(function, *args):
    return json.loads(text(function, *args))
