// SPDX-License-Identifier: Apache-2.0
// alloy/upstream/cuda_malloc_upstream.hpp
#pragma once

#include <alloy/detail/cuda.hpp>

namespace alloy {

namespace detail {
struct cuda_malloc_upstream_calls {
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
  static constexpr const char* allocate_call = "cudaMalloc";
  static constexpr const char* free_call = "cudaFree";
  static cudaError_t allocate(void** ptr, std::size_t bytes) noexcept { return cudaMalloc(ptr, bytes); }
  static cudaError_t free(void* ptr) noexcept { return cudaFree(ptr); }
};
}  // namespace detail

/// Device memory from `cudaMalloc` / `cudaFree` on its device (`options::device`, default the
/// current one at construction; every call runs with it current: `detail::basic_cuda_upstream`).
///
/// - Alignment: powers of two up to `max_alignment` (256 B, what `cudaMalloc` guarantees);
///   anything else yields an empty block.
/// - Zero bytes: one byte is taken so the block has a unique address; its size reads 0.
/// - Failure: `cudaErrorMemoryAllocation` is a normal event: the sticky error is cleared and an
///   empty block returned. Any other error is also cleared, returned as an empty block, and kept
///   in `last_error()` (call, file, line) so the edge throws `alloy::cuda_error` instead of
///   `alloy::out_of_memory`.
/// - Thread safety: as the CUDA runtime (safe); `last_error()` too (`detail::cuda_error_slot`).
/// - Memory kind: device only.
class cuda_malloc_upstream : public detail::basic_cuda_upstream<detail::cuda_malloc_upstream_calls> {
 public:
  using basic_cuda_upstream::basic_cuda_upstream;
};

}  // namespace alloy
