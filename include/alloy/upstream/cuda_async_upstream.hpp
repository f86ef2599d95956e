// SPDX-License-Identifier: Apache-2.0
// alloy/upstream/cuda_async_upstream.hpp
#pragma once

#include <cstddef>

#include <alloy/block.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/cuda.hpp>
#include <alloy/device.hpp>

namespace alloy {

/// Stream-ordered device memory from `cudaMallocAsync` / `cudaFreeAsync`, from the device's
/// default memory pool or from `options::pool` when one is given (the pool is not owned).
///
/// - Stream semantics: `allocate(bytes, alignment, stream)` returns memory ready for use on
///   `stream`; `deallocate(block, stream)` frees it once the work enqueued on `stream` before the
///   call is done, so the caller may free right after enqueueing its last use on that stream.
///   The stream-less calls use `options::stream` (the legacy default stream unless set);
///   `allocate` without a stream synchronizes that stream, so the memory is ready on any stream;
///   while that stream is capturing (a host wait would invalidate the capture) it fails instead.
/// - Alignment up to `max_alignment` (256 B); the device, zero bytes and failures as
///   `cuda_malloc_upstream` (every call runs with `options::device` current).
/// - Thread safety: as the CUDA runtime (safe); `last_error()` too (`detail::cuda_error_slot`).
/// - Memory kind: device only.
class cuda_async_upstream : public detail::cuda_error_slot {
 public:
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
  static constexpr std::size_t max_alignment = 256;
  /// As `cuda_malloc_upstream` (`thread_safe_upstream`).
  static constexpr bool thread_safe = true;

  struct options {
    cudaMemPool_t pool = nullptr;   ///< allocate from this pool; null = the device's default pool
    cudaStream_t stream = nullptr;  ///< stream for the stream-less calls
    int device = -1;                ///< CUDA device ordinal; -1: the current device at construction
  };

  cuda_async_upstream() noexcept : cuda_async_upstream(options{}) {}
  explicit cuda_async_upstream(const options& opts) noexcept : options_(opts) {
    options_.device = detail::resolve_device(opts.device);
  }

  block allocate(std::size_t bytes, std::size_t alignment, cudaStream_t stream) noexcept {
    if (!detail::is_power_of_two(alignment) || alignment > max_alignment) return {};
    const on_device on{options_.device};
    if (!on) {
      record(static_cast<cudaError_t>(on.status()), "cudaSetDevice", __FILE__, __LINE__);
      return {};
    }
    void* ptr = nullptr;
    const std::size_t taken = bytes == 0 ? 1 : bytes;
    if (options_.pool != nullptr) {
      ALLOY_CUDA_OR_EMPTY(cudaMallocFromPoolAsync(&ptr, taken, options_.pool, stream));
    } else {
      ALLOY_CUDA_OR_EMPTY(cudaMallocAsync(&ptr, taken, stream));
    }
    return {ptr, bytes};
  }

  void deallocate(block b, cudaStream_t stream) noexcept {
    if (!b) return;
    const on_device on{options_.device};
    if (!on) record(static_cast<cudaError_t>(on.status()), "cudaSetDevice", __FILE__, __LINE__);
    ALLOY_CUDA_OR_RECORD(cudaFreeAsync(b.ptr, stream));
  }

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    // One device scope for the probe, the allocation (whose own scope then makes no call) and the
    // synchronize.
    const on_device on{options_.device};
    if (!on) {
      record(static_cast<cudaError_t>(on.status()), "cudaSetDevice", __FILE__, __LINE__);
      return {};
    }
    // Memory ready on every stream needs a host wait, which would invalidate a capture running on
    // options.stream (or one the legacy stream is implicitly joined to): refused then instead.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const cudaError_t probe = cudaStreamIsCapturing(options_.stream, &capture);
    if (probe != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
      record(probe != cudaSuccess ? probe : cudaErrorStreamCaptureUnsupported,
             "cudaStreamIsCapturing(options.stream): a stream-less allocate needs a host wait", __FILE__, __LINE__);
      return {};
    }
    const block b = allocate(bytes, alignment, options_.stream);
    if (b) {
      const cudaError_t status = cudaStreamSynchronize(options_.stream);
      if (status != cudaSuccess) {
        record(status, "cudaStreamSynchronize(options.stream)", __FILE__, __LINE__);
        deallocate(b, options_.stream);
        return {};
      }
    }
    return b;
  }

  void deallocate(block b) noexcept { deallocate(b, options_.stream); }

  const options& get_options() const noexcept { return options_; }
  /// The device every call runs on (-1: none could be had at construction).
  int device() const noexcept { return options_.device; }

  friend bool operator==(const cuda_async_upstream& l, const cuda_async_upstream& r) noexcept {
    return l.options_.pool == r.options_.pool && l.options_.device == r.options_.device;
  }

 private:
  using on_device = basic_scoped_device<cuda_devices>;

  options options_{};
};

}  // namespace alloy
