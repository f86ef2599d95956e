// SPDX-License-Identifier: Apache-2.0
// src/capi/cuda_runtime_calls.hpp: the few CUDA runtime calls liballoy makes itself (the heaps make
// the rest). Without CUDA they report that the backend is unavailable.
#pragma once

#include <cstddef>
#include <string>

namespace alloy::capi {

/// CUDA devices present; 0 with `why` filled when the runtime or driver cannot say.
int cuda_device_count(std::string& why);
/// `cudaMemGetInfo` on `device`; false with `why` filled on failure.
bool cuda_memory_info(int device, std::size_t& free_bytes, std::size_t& total_bytes, std::string& why);

/// Makes `device` current for its scope when `active`, and restores the caller's device; no call
/// when it already is.
class device_guard {
 public:
  device_guard(bool active, int device) noexcept;
  ~device_guard();
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace alloy::capi
