/* SPDX-License-Identifier: Apache-2.0 */
/* alloy/capi.h: liballoy, alloy's C interface for PyTorch, CuPy and other foreign callers.
 *
 * One allocator per device, configured once by a string in the style of PYTORCH_CUDA_ALLOC_CONF
 * ("composition:virtual,capacity:8GiB"), read from the environment variable ALLOY_CONF at the
 * first call or set by alloy_configure() before it. Keys:
 *   composition  virtual (default: virtual_allocator on CUDA virtual memory), default, caching
 *   capacity     device memory at most: bytes with a unit (512MiB, 8GiB, 1.5GB), a whole number
 *                of bytes above 1, or a fraction of the device above 0 (0.75, 1); absent: the
 *                device's memory
 *   history      allocation events kept per device for snapshots; 0 (default) = off; changed
 *                later by alloy_record_history
 *   backend      cuda (default) or host: host memory and N simulated devices, no CUDA call at
 *                all, stream handles are opaque keys (for tests on machines without a GPU)
 *   devices      with backend:host, how many simulated devices (default 1)
 * Keys and units are case-insensitive, spaces around keys and values are ignored, and so are empty
 * entries (",,"); a key given twice takes its last value.
 *
 * Every call is thread-safe. Stream-ordered as PyTorch expects: a block freed on its stream is
 * reused by that stream at once, and by other streams only after the streams named by
 * alloy_torch_record_stream are past its last use. Nothing here throws or aborts: a bad call is
 * refused and counted (alloy_last_error says why), and out of memory is a NULL result
 * (alloy_last_oom says why). Every call but alloy_last_error and alloy_last_error_code sets the
 * calling thread's error: ALLOY_OK when it succeeded. Only the functions below are exported. */
#ifndef ALLOY_CAPI_H
#define ALLOY_CAPI_H

#include <stddef.h>

#if defined(_WIN32)
#  define ALLOY_CAPI_EXPORT
#else
#  define ALLOY_CAPI_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA runtime's stream handle, declared exactly as <driver_types.h> does, so that this
 * header needs no CUDA header (a repeated identical typedef is valid C11 and C++). */
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

/* Result codes of alloy_configure (and alloy_last_error_code). */
enum alloy_status {
  ALLOY_OK = 0,
  ALLOY_ERROR_UNKNOWN_KEY = 1,        /* a configuration key alloy does not know */
  ALLOY_ERROR_BAD_VALUE = 2,          /* a value that cannot be read, or out of range */
  ALLOY_ERROR_ALREADY_CONFIGURED = 3, /* the library has started (or could not): configure first */
  ALLOY_ERROR_BAD_DEVICE = 4,         /* a device index out of range */
  ALLOY_ERROR_BAD_POINTER = 5,        /* a pointer not live on that device, or a wrong size */
  ALLOY_ERROR_UNAVAILABLE = 6         /* the backend cannot start (no CUDA driver or device) */
};

/* ---- configuration and errors ---------------------------------------------------------------- */

/* Sets the configuration before first use (0 on success; else an alloy_status, and
 * alloy_last_error names the bad key or value). A NULL or empty string means the defaults. Until
 * the library starts (at the first call of a function other than alloy_configure,
 * alloy_last_error and alloy_last_error_code), a later call replaces an earlier one; after it,
 * ALLOY_ERROR_ALREADY_CONFIGURED, even when the library could not start. */
ALLOY_CAPI_EXPORT int alloy_configure(const char* conf);
/* The configuration the library started with, normalized ("backend:cuda,composition:virtual,..."),
 * starting it if it has not started; "" if it cannot start (alloy_last_error says why). The
 * history it names is the one at the start (alloy_record_history may have changed it since). */
ALLOY_CAPI_EXPORT const char* alloy_configuration(void);
/* Why the calling thread's last call failed ("" if it did not); valid until that thread's next call. */
ALLOY_CAPI_EXPORT const char* alloy_last_error(void);
/* The calling thread's last call's error (an alloy_status; ALLOY_OK if it succeeded). */
ALLOY_CAPI_EXPORT int alloy_last_error_code(void);
/* Devices served (the CUDA device count, or backend:host's `devices`); -1 if the backend cannot start. */
ALLOY_CAPI_EXPORT int alloy_device_count(void);

/* ---- PyTorch's CUDAPluggableAllocator, exactly its types --------------------------------------
 * Size 0 gives a valid block of its own (freed as any other). NULL: out of memory (alloy_last_oom
 * says why, alloy_last_error_code is ALLOY_OK), or a refused call (a bad device, a backend that
 * cannot start: alloy_last_error says why). */

ALLOY_CAPI_EXPORT void* alloy_torch_malloc(size_t size, int device, cudaStream_t stream);
#ifdef __cplusplus
/* As alloy_torch_malloc, but out of memory throws a C++ exception derived from std::bad_alloc
 * whose what() is alloy_last_oom's explanation, instead of returning NULL (a refused call throws
 * it too, with alloy_last_error's message). This is the entry point to give
 * torch.cuda.memory.CUDAPluggableAllocator: PyTorch does not check the pointer its allocation
 * function returns, and turns the exception into a Python RuntimeError. Call it only from C++
 * frames that let exceptions through (never through ctypes or a C caller). */
ALLOY_CAPI_EXPORT void* alloy_torch_malloc_or_throw(size_t size, int device, cudaStream_t stream);
#endif
/* `size` and `device` are the allocation's; `stream` is the one the block's last use was enqueued
 * on (PyTorch passes the allocating stream; other streams that used it are named by
 * alloy_torch_record_stream). A free of NULL does nothing. A pointer not live on `device` (never
 * given, interior, freed already, another device's) or a wrong size is refused, counted
 * (num_bad_frees) and changes nothing: ALLOY_ERROR_BAD_POINTER. */
ALLOY_CAPI_EXPORT void alloy_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);
ALLOY_CAPI_EXPORT void alloy_torch_init(int device_count);
ALLOY_CAPI_EXPORT void alloy_torch_empty_cache(void);
/* Limits the device to `fraction` (0 to 1) of its memory, at once; anything else (NaN included) is
 * refused with ALLOY_ERROR_BAD_VALUE and changes nothing. */
ALLOY_CAPI_EXPORT void alloy_torch_set_memory_fraction(double fraction, int device);
/* NULL does nothing; a pointer that is not a live block: ALLOY_ERROR_BAD_POINTER. */
ALLOY_CAPI_EXPORT void alloy_torch_record_stream(void* ptr, cudaStream_t stream);

/* ---- CuPy's CFunctionAllocator (no size, no stream: the legacy default stream) -------------- */

ALLOY_CAPI_EXPORT void* alloy_cupy_malloc(void* param, size_t size, int device);
ALLOY_CAPI_EXPORT void alloy_cupy_free(void* param, void* ptr, int device);

/* ---- statistics, summary, snapshot ----------------------------------------------------------
 * The text functions write at most `capacity` bytes including a terminating NUL and return the
 * length of the whole text (without the NUL), so a call with capacity 0 asks for the size. On a
 * bad device they return 0 and set alloy_last_error. */

/* A JSON object keyed exactly as torch.cuda.memory_stats(). */
ALLOY_CAPI_EXPORT size_t alloy_memory_stats_json(int device, char* buffer, size_t capacity);
/* A JSON object of alloy::statistics (TensorFlow's and Large Model Support's names:
 * num_allocs, bytes_in_use, peak_bytes_in_use, ...), plus device memory
 * (device_total_bytes, device_free_bytes) and num_bad_frees. */
ALLOY_CAPI_EXPORT size_t alloy_statistics_json(int device, char* buffer, size_t capacity);
/* A text table like torch.cuda.memory_summary(). */
ALLOY_CAPI_EXPORT size_t alloy_memory_summary(int device, char* buffer, size_t capacity);
/* Every device's segments and blocks, and the allocation history when `history` is on, in the
 * schema of torch.cuda.memory._snapshot(), as JSON. */
ALLOY_CAPI_EXPORT size_t alloy_snapshot_json(char* buffer, size_t capacity);
ALLOY_CAPI_EXPORT void alloy_reset_peak(int device);
/* From now on every device keeps its last `max_entries` allocation events for alloy_snapshot_json,
 * as the history key does from the start (torch.cuda.memory._record_memory_history); fewer than
 * are kept drops the oldest, and 0 stops and drops them all. Above 268435456:
 * ALLOY_ERROR_BAD_VALUE, nothing changes. */
ALLOY_CAPI_EXPORT void alloy_record_history(size_t max_entries);
/* CUDA graphs: PyTorch tells a pluggable allocator neither when a capture begins nor when its graph
 * is destroyed, so the first allocation on a capturing stream gives that capture a private pool,
 * which keeps the graph's memory (blocks freed inside the capture included, which its replays
 * reuse) from all other work. This gives back the pools of every ended capture on `device`: call
 * it once none of those graphs will be replayed again. */
ALLOY_CAPI_EXPORT void alloy_release_graph_pools(int device);
/* Zeroes the device's accumulated counts (torch.cuda.reset_accumulated_memory_stats: the num_*
 * and allocated/freed totals, num_bad_frees too); current and peak figures stay. */
ALLOY_CAPI_EXPORT void alloy_reset_accumulated(int device);
/* Why the device's last request failed (asked, limit, in use, reserved, largest free block,
 * fragmentation); "" if none has, or for a bad device. A copy, valid until the calling thread's
 * next call. */
ALLOY_CAPI_EXPORT const char* alloy_last_oom(int device);

#ifdef __cplusplus
}
#endif

#endif /* ALLOY_CAPI_H */
