// SPDX-License-Identifier: Apache-2.0
// README: "A composition" (docs/design.md#building-blocks), compiled by nvcc. Runs on a GPU;
// without one it says so.
#include <alloy/adaptor/thrust.hpp>
#include <alloy/alloy.hpp>
#include <alloy/memory_stats.hpp>

#include <iostream>
#include <thrust/device_vector.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

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
  using device = alloy::cuda_async_upstream;
  using small = alloy::size_class_pool<device>;  // <= 1 MiB
  using large = alloy::best_fit_arena<device>;
  using heap = alloy::segregator<1_MiB, small, large>;
  using alloc_t = alloy::synchronized<alloy::stats<heap>>;  // lock, then count
  alloc_t alloc;
  {
    using key_alloc = alloy::thrust_allocator<int, alloc_t>;
    thrust::device_vector<int, key_alloc> keys(1 << 24, 0, key_alloc{alloc});
    thrust::sequence(keys.begin(), keys.end(), 1 << 24, -1);
    thrust::sort(alloy::thrust_policy(alloc, stream), keys.begin(), keys.end());
  }
  std::cout << alloy::memory_summary(alloc);
  // --- end of snippet ---

  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}
