// SPDX-License-Identifier: Apache-2.0
// src/capi/cuda_heap.cpp: backend:cuda, the heaps of real devices and the runtime calls liballoy
// makes itself. Built without CUDA, every function reports the backend unavailable.
#include <alloy/config.hpp>

#include "cuda_runtime_calls.hpp"
#include "device_heap.hpp"

#if ALLOY_HAS_CUDA
#  include <cuda_runtime_api.h>

#  include <alloy/upstream/cuda_malloc_upstream.hpp>
#  include <alloy/vmm/cuda_vmm.hpp>
#endif

namespace alloy::capi {

#if ALLOY_HAS_CUDA

namespace {
std::string error_text(const char* call, cudaError_t status) {
  cudaGetLastError();  // clear a sticky error, so the next call starts clean
  return std::string(call) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}
}  // namespace

int cuda_device_count(std::string& why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    why = error_text("cudaGetDeviceCount", status);
    return 0;
  }
  if (count == 0) why = "no CUDA device";
  return count;
}

bool cuda_memory_info(int device, std::size_t& free_bytes, std::size_t& total_bytes, std::string& why) {
  const device_guard on_device(true, device);
  const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (status != cudaSuccess) {
    why = error_text("cudaMemGetInfo", status);
    return false;
  }
  return true;
}

device_guard::device_guard(bool active, int device) noexcept {
  if (!active) return;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (current == device) return;
  if (cudaSetDevice(device) == cudaSuccess) {
    previous_ = current;
  } else {
    cudaGetLastError();
  }
}

device_guard::~device_guard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

// Under a capture CUDA does not say the mode, so stream_ordered assumes the global one and serves
// the capture only from what the composition holds (`allocate_cached`: no cudaMalloc, no map).
static_assert(cache_serving_allocator<default_allocator<capped_upstream<cuda_malloc_upstream>>>);
static_assert(cache_serving_allocator<caching_allocator<capped_upstream<cuda_malloc_upstream>>>);
static_assert(cache_serving_allocator<virtual_allocator<capped_vmm<cuda_vmm>>>);

std::unique_ptr<device_heap> make_cuda_heap(const config& c, int device, std::size_t limit, std::string& why) {
  // The backend owns the device's virtual memory; its capacity is the device's limit when one is
  // set (0: the device's memory).
  struct backend : cuda_vmm {
    static options for_device(int d, std::size_t bytes) {
      return {.device = d, .capacity = bytes == std::numeric_limits<std::size_t>::max() ? 0 : bytes};
    }
    backend(int d, std::size_t bytes) : cuda_vmm(for_device(d, bytes)) {}
  };
  // heap_of builds its backend from the limit alone; the device is current while it does.
  struct current_device_backend : backend {
    explicit current_device_backend(std::size_t bytes) : backend(-1, bytes) {}
  };
  switch (c.composition) {
    case composition_kind::virtual_memory: {
      {
        const cuda_vmm probe{cuda_vmm::options{.device = device}};
        if (!probe.valid()) {
          const auto& e = probe.last_error();
          why = std::string("CUDA virtual memory unavailable: ") + (e.call != nullptr ? e.call : "?") + " failed (" +
                (e.name != nullptr ? e.name : "?") + ")";
          return nullptr;
        }
      }
      using heap_t = virtual_allocator<capped_vmm<cuda_vmm>>;
      auto heap = std::make_unique<heap_of<heap_t, cudaStream_t, current_device_backend>>(
          c.history, limit, true,
          [](device_state* s, current_device_backend* b) { return heap_t{capped_vmm<cuda_vmm>{b, s}}; });
      return heap;
    }
    case composition_kind::default_heap: {
      using heap_t = default_allocator<capped_upstream<cuda_malloc_upstream>>;
      return std::make_unique<heap_of<heap_t, cudaStream_t>>(c.history, limit, false, [](device_state* s, no_backend*) {
        return heap_t{capped_upstream<cuda_malloc_upstream>{s}};
      });
    }
    case composition_kind::caching: {
      using heap_t = caching_allocator<capped_upstream<cuda_malloc_upstream>>;
      return std::make_unique<heap_of<heap_t, cudaStream_t>>(c.history, limit, false, [](device_state* s, no_backend*) {
        return heap_t{capped_upstream<cuda_malloc_upstream>{s}};
      });
    }
  }
  why = "unknown composition";
  return nullptr;
}

#else

int cuda_device_count(std::string& why) {
  why = "liballoy was built without CUDA (use backend:host)";
  return 0;
}
bool cuda_memory_info(int, std::size_t&, std::size_t&, std::string& why) {
  why = "liballoy was built without CUDA";
  return false;
}
device_guard::device_guard(bool, int) noexcept {}
device_guard::~device_guard() = default;
std::unique_ptr<device_heap> make_cuda_heap(const config&, int, std::size_t, std::string& why) {
  why = "liballoy was built without CUDA";
  return nullptr;
}

#endif

}  // namespace alloy::capi
