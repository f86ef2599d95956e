// SPDX-License-Identifier: Apache-2.0
// README: "A first example": the recommended composition under a kernel and Thrust, compiled by
// nvcc. Runs on a GPU (the composition that fits the device too); without one it says so.
#include <alloy/adaptor/thrust.hpp>
#include <alloy/alloy.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/showcase.hpp>

#include <cstddef>
#include <iostream>
#include <thrust/device_vector.h>
#include <thrust/sort.h>

__global__ void fill(float* data, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    data[i] = static_cast<float>(n - i);
}

namespace {

/// The snippet's Thrust part over another composition: whatever `alloc_t` is, the code is the same.
template <class alloc_t>
void sort_with(alloc_t& alloc, cudaStream_t stream) {
  using float_alloc = alloy::thrust_allocator<float, alloc_t>;
  thrust::device_vector<float, float_alloc> keys(1 << 24, 1.0f, float_alloc{alloc});
  thrust::sort(alloy::thrust_policy(alloc, stream), keys.begin(), keys.end());
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::cout << "no CUDA device here: nothing to run\n";
    return 0;
  }
  cudaStream_t stream{};
  cudaStreamCreate(&stream);

  // --- the README snippet ---
  using namespace alloy::literals;
  using alloc_t = alloy::stats<alloy::default_allocator<alloy::cuda_malloc_upstream>>;
  alloc_t alloc;  // a program that must fit its device: alloy::virtual_allocator<alloy::cuda_vmm>

  if (alloy::block buffer = alloc.allocate(64_MiB, 256)) {  // noexcept: an empty block when out of memory
    fill<<<1024, 256, 0, stream>>>(static_cast<float*>(buffer.ptr), buffer.size / sizeof(float));
    cudaStreamSynchronize(stream);
    alloc.deallocate(buffer);  // the block as it was handed out
  }
  {
    using float_alloc = alloy::thrust_allocator<float, alloc_t>;  // the edges throw alloy::out_of_memory
    thrust::device_vector<float, float_alloc> keys(1 << 24, 1.0f, float_alloc{alloc});
    thrust::sort(alloy::thrust_policy(alloc, stream), keys.begin(), keys.end());  // scratch from alloc
  }
  std::cout << alloy::memory_summary(alloc);  // PyTorch's memory_summary() table
  // --- end of snippet ---

  // The same on CUDA's virtual memory, as the comment above says.
  alloy::stats<alloy::virtual_allocator<alloy::cuda_vmm>> fitted;
  sort_with(fitted, stream);
  std::cout << alloy::memory_summary(fitted);

  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}
