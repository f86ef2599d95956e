// SPDX-License-Identifier: Apache-2.0
// alloy/cuda_info.hpp: how much memory each CUDA device has, and which has the most free
// (fastai's `gpu_mem_get*`, PyTorch's `torch.cuda.mem_get_info`).
//
//   alloy::cuda::device_memory m = alloy::cuda::memory_info(0);   // {total, free, used} in bytes
//   int best = alloy::cuda::device_with_most_free_memory();
//
// Errors: a device id that does not exist throws `alloy::logic_error` naming the id and how many
// devices there are; no usable device at all (no GPU, or no driver) throws `alloy::cuda_error`
// with the status `cudaGetDeviceCount` gave (`memory_info_all()` then returns an empty list); any
// other failed CUDA call throws `alloy::cuda_error` naming the call. The current device of the
// calling thread is left as it was.
#pragma once

#include <alloy/config.hpp>

#if ALLOY_HAS_CUDA

#  include <cstddef>
#  include <string>
#  include <vector>

#  include <cuda_runtime_api.h>

#  include <alloy/detail/cuda.hpp>
#  include <alloy/error.hpp>

namespace alloy::cuda {

/// Memory of one device, in bytes, as the driver reports it (all processes together).
struct device_memory {
  int device = 0;
  std::size_t total = 0;
  std::size_t free = 0;
  std::size_t used = 0;  ///< total - free
};

namespace detail {

/// Whether a status means "there is no usable device here" rather than a failure.
inline bool means_no_device(cudaError_t status) noexcept {
  return status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver;
}

/// Devices present: 0 when there is no device or no driver; throws for any other failure.
inline int device_count(cudaError_t* no_device_status = nullptr) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (!means_no_device(status))
      ::alloy::detail::throw_cuda_error(status, "cudaGetDeviceCount(&count)", __FILE__, __LINE__);
    if (no_device_status != nullptr) *no_device_status = status;
    return 0;
  }
  if (no_device_status != nullptr) *no_device_status = count == 0 ? cudaErrorNoDevice : cudaSuccess;
  return count;
}

[[noreturn]] inline void throw_no_device(cudaError_t status) {
  throw cuda_error(static_cast<int>(status), cudaGetErrorName(status), "cudaGetDeviceCount (no CUDA device present)",
                   __FILE__, __LINE__);
}

/// Makes `device` current for its lifetime, then restores the previous one.
class device_guard {
 public:
  explicit device_guard(int device) {
    ALLOY_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device) ALLOY_CUDA_TRY(cudaSetDevice(device));
    device_ = device;
  }
  ~device_guard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = 0;
  int device_ = 0;
};

inline device_memory query(int device) {
  device_guard guard(device);
  device_memory m;
  m.device = device;
  ALLOY_CUDA_TRY(cudaMemGetInfo(&m.free, &m.total));
  m.used = m.total - m.free;
  return m;
}

}  // namespace detail

/// Total, free and used memory of `device`.
inline device_memory memory_info(int device) {
  cudaError_t no_device = cudaSuccess;
  const int count = detail::device_count(&no_device);
  if (count == 0) detail::throw_no_device(no_device);
  if (device < 0 || device >= count)
    throw alloy::logic_error("invalid CUDA device id " + std::to_string(device) + ": " + std::to_string(count) +
                             " device" + (count == 1 ? "" : "s") + " present (ids 0 to " + std::to_string(count - 1) +
                             ")");
  return detail::query(device);
}

/// `memory_info` of every device, in id order; empty when there is no device.
inline std::vector<device_memory> memory_info_all() {
  const int count = detail::device_count();
  std::vector<device_memory> all;
  all.reserve(static_cast<std::size_t>(count));
  for (int d = 0; d < count; ++d) all.push_back(detail::query(d));
  return all;
}

/// The id of the device with the most free memory (the lowest id among equals).
inline int device_with_most_free_memory() {
  cudaError_t no_device = cudaSuccess;
  const int count = detail::device_count(&no_device);
  if (count == 0) detail::throw_no_device(no_device);
  int best = 0;
  std::size_t best_free = 0;
  for (int d = 0; d < count; ++d) {
    const device_memory m = detail::query(d);
    if (d == 0 || m.free > best_free) best = d, best_free = m.free;
  }
  return best;
}

}  // namespace alloy::cuda

#endif  // ALLOY_HAS_CUDA
