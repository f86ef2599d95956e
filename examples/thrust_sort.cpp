// SPDX-License-Identifier: Apache-2.0
// Thrust algorithms and containers over an alloy composition (README "Adaptors"). Built on Thrust's
// host backend; the same code under nvcc runs on the GPU (see composition.cu). The keys are
// positive: Thrust 3.0's host radix sort orders negative ints wrongly (NVIDIA/cccl#4919).
#include <alloy/adaptor/thrust.hpp>
#include <alloy/alloy.hpp>

#include <cstdio>
#include <thrust/device_vector.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

int main() {
  using alloc_t = alloy::limited<alloy::host_upstream>;
  alloc_t alloc;

  using int_alloc = alloy::thrust_allocator<int, alloc_t>;
  thrust::device_vector<int, int_alloc> keys(1 << 20, 0, int_alloc{alloc});  // storage from alloc
  thrust::sequence(keys.begin(), keys.end(), 1 << 20, -1);                   // 2^20, ..., 2, 1
  thrust::sort(alloy::thrust_policy(alloc), keys.begin(), keys.end());       // scratch from alloc

  std::printf("smallest key %d, %zu bytes in use\n", static_cast<int>(keys[0]), alloc.bytes_in_use());
  return keys[0] == 1 ? 0 : 1;
}
