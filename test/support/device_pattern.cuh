// SPDX-License-Identifier: Apache-2.0
// test/support/device_pattern.cuh: a seeded pattern written and checked on the device, so GPU
// tests see a block's content survive (or an overlap spoil it). For .cu tests only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include <alloy/block.hpp>
#include <alloy/detail/cuda.hpp>

namespace alloy::testing {

/// Word i of the pattern with `seed`.
__host__ __device__ inline std::uint32_t pattern_word(std::size_t i, std::uint32_t seed) {
  return static_cast<std::uint32_t>(i) * 2654435761u + seed;
}

/// Writes the pattern over `n` words (a grid-stride loop).
static __global__ void fill_kernel(std::uint32_t* data, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] = pattern_word(i, seed);
}

/// Adds to `*wrong` the words of `n` that do not hold the pattern (atomically: any stream).
static __global__ void count_wrong_kernel(const std::uint32_t* data, std::size_t n, std::uint32_t seed,
                                          unsigned* wrong) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (data[i] != pattern_word(i, seed)) atomicAdd(wrong, 1u);
}

/// Fills device block `b` with the pattern and waits for it.
inline void fill_on_device(block b, std::uint32_t seed) {
  fill_kernel<<<64, 256>>>(static_cast<std::uint32_t*>(b.ptr), b.size / 4, seed);
  ALLOY_CUDA_TRY(cudaGetLastError());
  ALLOY_CUDA_TRY(cudaDeviceSynchronize());
}

/// Whether device block `b` holds the pattern with `seed` (copied to the host to compare).
inline bool device_holds_pattern(block b, std::uint32_t seed) {
  const std::size_t n = b.size / sizeof(std::uint32_t);
  std::vector<std::uint32_t> host(n);
  ALLOY_CUDA_TRY(cudaMemcpy(host.data(), b.ptr, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
  for (std::size_t i = 0; i < n; ++i)
    if (host[i] != pattern_word(i, seed)) return false;
  return true;
}

}  // namespace alloy::testing
