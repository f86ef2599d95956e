// SPDX-License-Identifier: Apache-2.0
// alloy/upstream/managed_upstream.hpp
#pragma once

#include <alloy/detail/cuda.hpp>

namespace alloy {

namespace detail {
struct managed_upstream_calls {
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = true;
  static constexpr const char* allocate_call = "cudaMallocManaged";
  static constexpr const char* free_call = "cudaFree";
  static cudaError_t allocate(void** ptr, std::size_t bytes) noexcept {
    return cudaMallocManaged(ptr, bytes, cudaMemAttachGlobal);
  }
  static cudaError_t free(void* ptr) noexcept { return cudaFree(ptr); }
};
}  // namespace detail

/// Unified (managed) memory from `cudaMallocManaged(..., cudaMemAttachGlobal)` / `cudaFree`:
/// accessible from the host and every device; pages migrate on demand.
///
/// Alignment up to `max_alignment` (256 B); the device, zero bytes, failures and thread safety as
/// `cuda_malloc_upstream`.
class managed_upstream : public detail::basic_cuda_upstream<detail::managed_upstream_calls> {
 public:
  using basic_cuda_upstream::basic_cuda_upstream;
};

}  // namespace alloy
