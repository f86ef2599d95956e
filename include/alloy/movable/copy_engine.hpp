// SPDX-License-Identifier: Apache-2.0
// alloy/movable/copy_engine.hpp: copies between two allocators' memory (memcpy, or cudaMemcpyAsync + synchronize).
// (Part of alloy/movable.hpp, which includes every part; the handle rules are there.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/edge.hpp>
#include <alloy/error.hpp>

#if ALLOY_HAS_CUDA
#  include <alloy/detail/cuda.hpp>
#endif

namespace alloy {

/// Copies bytes between two allocators' memory, keeping every bit.
///
/// - `copy<DstHost, SrcHost>(dst, src, bytes)`: `std::memcpy` when both sides are host-accessible;
///   otherwise (CUDA builds only) `cudaMemcpyAsync(..., cudaMemcpyDefault, stream)` followed by
///   `cudaStreamSynchronize(stream)`, so the copy is complete when it returns. Without CUDA a
///   copy that needs the device does not compile. The regions must not overlap (the movable
///   policies always copy into a freshly allocated block).
/// - Failure: returns false (a CUDA error is kept in `last_error()`, the runtime's sticky error
///   cleared); the destination's content is then unspecified, the source's untouched.
/// - `options::stream`: the stream copies run on (default: the legacy default stream).
/// - Counts the bytes it copied (`bytes_copied()`). Thread safety: none.
class copy_engine {
 public:
#if ALLOY_HAS_CUDA
  using stream_type = cudaStream_t;
#else
  using stream_type = std::nullptr_t;
#endif

  struct options {
    stream_type stream = nullptr;
  };

  copy_engine() = default;
  explicit copy_engine(options opts) noexcept : stream_(opts.stream) {}

  template <bool DstHost, bool SrcHost>
  bool copy(void* dst, const void* src, std::size_t bytes) noexcept {
    if (bytes == 0) return true;
    if constexpr (DstHost && SrcHost) {
      std::memcpy(dst, src, bytes);
    } else {
#if ALLOY_HAS_CUDA
      if (!synchronized_after(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_))) return false;
#else
      static_assert(DstHost && SrcHost, "alloy: copying device memory needs the CUDA runtime (ALLOY_HAS_CUDA)");
#endif
    }
    bytes_copied_ += bytes;
    return true;
  }

  /// Moves `bytes` from `src` to `dst` within one allocator's memory, the two ranges possibly
  /// overlapping: `std::memmove` on the host; on the device, chunks of `|src - dst|` bytes (no
  /// chunk overlaps its own source) copied front to back when moving down and back to front when
  /// moving up, then one synchronisation. On a failed device copy the content of the block is
  /// lost (the device is then in an unrecoverable state).
  template <bool Host>
  bool move_within(void* dst, const void* src, std::size_t bytes) noexcept {
    if (bytes == 0 || dst == src) return true;
    if constexpr (Host) {
      std::memmove(dst, src, bytes);
    } else {
#if ALLOY_HAS_CUDA
      auto* d = static_cast<char*>(dst);
      const auto* s = static_cast<const char*>(src);
      const bool down = d < s;
      const std::size_t step = down ? static_cast<std::size_t>(s - d) : static_cast<std::size_t>(d - s);
      cudaError_t status = cudaSuccess;
      for (std::size_t done = 0; done < bytes && status == cudaSuccess; done += step) {
        const std::size_t n = bytes - done < step ? bytes - done : step;
        const std::size_t at = down ? done : bytes - done - n;
        status = cudaMemcpyAsync(d + at, s + at, n, cudaMemcpyDefault, stream_);
      }
      if (!synchronized_after(status)) return false;
#else
      static_assert(Host, "alloy: moving device memory needs the CUDA runtime (ALLOY_HAS_CUDA)");
#endif
    }
    bytes_copied_ += bytes;
    return true;
  }

  /// Copies between memory of allocator kinds `To` and `From`.
  template <class To, class From>
  bool copy_between(void* dst, const void* src, std::size_t bytes) noexcept {
    return copy<To::host_accessible, From::host_accessible>(dst, src, bytes);
  }

  std::size_t bytes_copied() const noexcept { return bytes_copied_; }
  stream_type stream() const noexcept { return stream_; }
#if ALLOY_HAS_CUDA
  const cuda_status& last_error() const noexcept { return last_error_; }
#endif

 private:
#if ALLOY_HAS_CUDA
  /// Waits for the copies queued on the stream when `status` (of the last one queued) is a
  /// success; false, with the error kept in `last_error()`, when either failed.
  bool synchronized_after(cudaError_t status) noexcept {
    if (status == cudaSuccess) status = cudaStreamSynchronize(stream_);
    if (status == cudaSuccess) return true;
    cudaGetLastError();
    last_error_ = {status, "cudaMemcpyAsync/cudaStreamSynchronize", __FILE__, __LINE__};
    return false;
  }
#endif

  stream_type stream_ = nullptr;
  std::size_t bytes_copied_ = 0;
#if ALLOY_HAS_CUDA
  cuda_status last_error_{};
#endif
};

/// A movable block owned by RAII: allocated on construction, deallocated on destruction.
///
///   alloy::movable_buffer buf{alloc, 1_MiB};
///   { auto view = buf.lock(); kernel<<<...>>>(view.data()); }   // unlocked when view dies
///
/// - Construction throws `alloy::out_of_memory` when the allocator cannot serve the request;
///   `lock()` throws it when a spilled block cannot be brought back; the message describes the
///   allocator the buffer refers to (its limit, bytes in use and reserved, largest free block).
///   Bad use of the handle (see the handle rules above) throws `alloy::logic_error` from the
///   allocator, and a refused operation changes nothing: `reset()` or a move assignment while a
///   view is alive throws and the buffer still owns its block.
/// - Views nest (each one is one lock); every view must be gone before its buffer is destroyed
///   (deallocating a locked handle is an error). Buffers and views are move-only.
/// - The allocator must outlive the buffer.

}  // namespace alloy
