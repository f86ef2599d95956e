// SPDX-License-Identifier: Apache-2.0
// alloy/upstream/pinned_host_upstream.hpp
#pragma once

#include <alloy/detail/cuda.hpp>

namespace alloy {

namespace detail {
struct pinned_host_upstream_calls {
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = true;
  static constexpr const char* allocate_call = "cudaMallocHost";
  static constexpr const char* free_call = "cudaFreeHost";
  static cudaError_t allocate(void** ptr, std::size_t bytes) noexcept { return cudaMallocHost(ptr, bytes); }
  static cudaError_t free(void* ptr) noexcept { return cudaFreeHost(ptr); }
};
}  // namespace detail

/// Page-locked host memory from `cudaMallocHost` / `cudaFreeHost`: host-accessible, and
/// device-accessible on every system with unified addressing (all current 64-bit platforms).
/// The target of host spills: copies to and from it run at full link speed.
///
/// Alignment up to `max_alignment` (256 B); the device (whose context the calls run in), zero
/// bytes, failures and thread safety as `cuda_malloc_upstream`.
class pinned_host_upstream : public detail::basic_cuda_upstream<detail::pinned_host_upstream_calls> {
 public:
  using basic_cuda_upstream::basic_cuda_upstream;
};

}  // namespace alloy
