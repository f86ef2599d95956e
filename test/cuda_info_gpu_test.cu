// SPDX-License-Identifier: Apache-2.0
// alloy::cuda::memory_info on a real device: the numbers move when memory is taken. Labelled
// `gpu`; skipped, saying why, when no device is present.
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <alloy/cuda_info.hpp>

#include "support/gpu.hpp"

BOOST_AUTO_TEST_SUITE(cuda_info_gpu)

BOOST_AUTO_TEST_CASE(memory_info_sees_an_allocation, ALLOY_GPU_TEST) {
  const int device = alloy::cuda::device_with_most_free_memory();
  const alloy::cuda::device_memory before = alloy::cuda::memory_info(device);
  BOOST_TEST(before.total > 0u);
  BOOST_TEST(before.used == before.total - before.free);
  int previous = 0;
  ALLOY_CUDA_TRY(cudaGetDevice(&previous));
  ALLOY_CUDA_TRY(cudaSetDevice(device));
  void* p = nullptr;
  const std::size_t bytes = std::size_t{1} << 30;  // 1 GiB
  ALLOY_CUDA_TRY(cudaMalloc(&p, bytes));
  const alloy::cuda::device_memory during = alloy::cuda::memory_info(device);
  BOOST_TEST(during.used >= before.used + bytes - (std::size_t{64} << 20), "cudaMalloc shows as used");
  ALLOY_CUDA_TRY(cudaFree(p));
  ALLOY_CUDA_TRY(cudaSetDevice(previous));
  int now = -1;
  ALLOY_CUDA_TRY(cudaGetDevice(&now));
  BOOST_TEST(now == previous, "the current device is left as it was");
  const auto all = alloy::cuda::memory_info_all();
  BOOST_TEST(all.size() >= 1u);
  BOOST_CHECK_THROW(alloy::cuda::memory_info(static_cast<int>(all.size())), alloy::logic_error);
}

BOOST_AUTO_TEST_SUITE_END()
