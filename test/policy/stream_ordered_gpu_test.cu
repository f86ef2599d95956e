// SPDX-License-Identifier: Apache-2.0
// stream_ordered over CUDA streams and events: a slow kernel writes a block on stream A, the block
// is freed on A and reallocated on B at once, and a kernel on B checks it held A's pattern; the
// cuda_resource adaptor's allocate_async takes the same path. Labelled `gpu`; skips, saying why,
// without a device.
#include <boost/test/unit_test.hpp>

#include <cstdint>

#include <cuda/stream_ref>

#include <alloy/adaptor/cuda_mr.hpp>
#include <alloy/alloy.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/stream_ordered.hpp>

#include "support/gpu.hpp"

using namespace alloy::literals;

namespace {

using ordered_device = alloy::stream_ordered<alloy::best_fit_arena<alloy::cuda_malloc_upstream>, cudaStream_t>;
static_assert(alloy::stream<cudaStream_t>);
static_assert(alloy::stream_ordered_allocator<ordered_device, cudaStream_t>);

// Spins for a while before writing, so the host runs far ahead of stream A.
__global__ void slow_fill(std::uint32_t* data, std::size_t n, std::uint32_t value, long long spin) {
  const long long start = clock64();
  while (clock64() - start < spin) {}
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) data[i] = value;
}

__global__ void count_mismatches(const std::uint32_t* data, std::size_t n, std::uint32_t value, unsigned* bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (data[i] != value) atomicAdd(bad, 1u);
}

struct streams {
  cudaStream_t a = nullptr, b = nullptr;
  streams() {
    ALLOY_CUDA_TRY(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    ALLOY_CUDA_TRY(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  }
  ~streams() {
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(stream_ordered_gpu)

BOOST_AUTO_TEST_CASE(freed_on_a_reused_on_b_after_a, ALLOY_GPU_TEST) {
  streams s;
  unsigned* bad = nullptr;
  ALLOY_CUDA_TRY(cudaMallocManaged(&bad, sizeof(unsigned)));
  *bad = 0;
  ordered_device alloc{alloy::best_fit_arena<alloy::cuda_malloc_upstream>{{}, {.initial_size = 64_MiB}}};
  constexpr std::size_t bytes = 16_MiB;
  for (std::uint32_t round = 1; round <= 20; ++round) {
    const alloy::block x = alloc.allocate(bytes, 256, s.a);
    BOOST_REQUIRE(x);
    slow_fill<<<256, 256, 0, s.a>>>(static_cast<std::uint32_t*>(x.ptr), bytes / 4, round, 2'000'000);
    alloc.deallocate(x, s.a);
    const alloy::block y = alloc.allocate(bytes, 256, s.b);
    BOOST_REQUIRE(y.ptr == x.ptr);
    count_mismatches<<<256, 256, 0, s.b>>>(static_cast<const std::uint32_t*>(y.ptr), bytes / 4, round, bad);
    alloc.deallocate(y, s.b);
  }
  ALLOY_CUDA_TRY(cudaDeviceSynchronize());
  BOOST_TEST(*bad == 0u);
  BOOST_TEST(alloc.order_counters().stream_waits > 0u);
  cudaFree(bad);
}

BOOST_AUTO_TEST_CASE(cuda_resource_allocate_async_is_stream_ordered, ALLOY_GPU_TEST) {
  streams s;
  ordered_device alloc;
  alloy::cuda_resource<ordered_device> mr{alloc};
  void* p = mr.allocate_async(1_MiB, 256, ::cuda::stream_ref{s.a});
  mr.deallocate_async(p, 1_MiB, 256, ::cuda::stream_ref{s.a});
  void* q = mr.allocate_async(1_MiB, 256, ::cuda::stream_ref{s.b});
  BOOST_TEST(q == p);
  mr.deallocate_async(q, 1_MiB, 256, ::cuda::stream_ref{s.b});
  ALLOY_CUDA_TRY(cudaDeviceSynchronize());
  BOOST_TEST(alloc.order_counters().host_synchronizations == 1u);  // B's arrival, once
}

BOOST_AUTO_TEST_SUITE_END()
