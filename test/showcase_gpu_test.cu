// SPDX-License-Identifier: Apache-2.0
// size_class_pool, segregator and the showcase compositions over real device memory
// (cudaMalloc and cudaMallocAsync upstreams, which guarantee only 256 B alignment) and
// virtual_allocator over cuda_vmm, with and without capacity pressure: every block
// written by a kernel and read back intact, nothing left on the device after release().
// Labelled `gpu`; skips, saying why, without a device.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/showcase.hpp>

#include "support/gpu.hpp"

using namespace alloy::literals;

namespace {

__global__ void stamp_kernel(std::uint32_t* data, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] = static_cast<std::uint32_t>(i) * 2654435761u + seed;
}

__global__ void check_kernel(const std::uint32_t* data, std::size_t n, std::uint32_t seed, unsigned* bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (data[i] != static_cast<std::uint32_t>(i) * 2654435761u + seed) atomicAdd(bad, 1u);
}

struct live {
  alloy::block b;
  std::uint32_t seed;
};

/// Random sizes (log-uniform up to `max_size`), alignments up to `max_alignment`; every block
/// stamped on the device when allocated and checked on the device when freed.
template <class A>
void device_workload(A& a, std::size_t max_size, std::size_t max_alignment, std::uint64_t seed) {
  unsigned* bad = nullptr;
  ALLOY_CUDA_TRY(cudaMallocManaged(&bad, sizeof(unsigned)));
  *bad = 0;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(0.0, std::log2(static_cast<double>(max_size)));
  std::vector<live> blocks;
  std::uint32_t next = 1;
  for (int op = 0; op < 3000; ++op) {
    if (blocks.empty() || (blocks.size() < 200 && rng() % 2 == 0)) {
      const std::size_t bytes = static_cast<std::size_t>(std::exp2(log_size(rng)));
      const std::size_t alignment = std::size_t{1} << (rng() % (1 + static_cast<int>(std::log2(max_alignment))));
      const alloy::block b = a.allocate(bytes, alignment);
      BOOST_REQUIRE_MESSAGE(b, "allocate(" << bytes << ", " << alignment << ") failed");
      BOOST_REQUIRE(alloy::detail::is_aligned(b.ptr, alignment));
      stamp_kernel<<<32, 256>>>(static_cast<std::uint32_t*>(b.ptr), bytes / 4, next);
      blocks.push_back({b, next++});
    } else {
      const std::size_t victim = rng() % blocks.size();
      const live l = blocks[victim];
      check_kernel<<<32, 256>>>(static_cast<const std::uint32_t*>(l.b.ptr), l.b.size / 4, l.seed, bad);
      a.deallocate(l.b);  // stream order: the next kernel that reuses it runs after the check
      blocks[victim] = blocks.back();
      blocks.pop_back();
    }
  }
  for (const live& l : blocks) {
    check_kernel<<<32, 256>>>(static_cast<const std::uint32_t*>(l.b.ptr), l.b.size / 4, l.seed, bad);
    a.deallocate(l.b);
  }
  ALLOY_CUDA_TRY(cudaDeviceSynchronize());
  BOOST_TEST(*bad == 0u, "blocks lost their content");
  ALLOY_CUDA_TRY(cudaFree(bad));
  BOOST_TEST(a.bytes_in_use() == 0u);
  a.release();
  BOOST_TEST(a.reserved_bytes() == 0u);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(showcase_gpu)

BOOST_AUTO_TEST_CASE(size_class_pool_on_cuda_malloc, ALLOY_GPU_TEST) {
  alloy::size_class_pool<alloy::cuda_malloc_upstream> pool;
  device_workload(pool, 512_KiB, 4096, 1);  // alignments above 256 through the slack path
  BOOST_TEST(pool.misuse_count() == 0u);
  BOOST_TEST(pool.counters().num_device_alloc == pool.counters().num_device_free);
}

BOOST_AUTO_TEST_CASE(default_allocator_on_cuda_malloc, ALLOY_GPU_TEST) {
  alloy::default_allocator<alloy::cuda_malloc_upstream> a;
  device_workload(a, 64_MiB, 4096, 2);
}

BOOST_AUTO_TEST_CASE(caching_allocator_on_cuda_malloc, ALLOY_GPU_TEST) {
  alloy::caching_allocator<alloy::cuda_malloc_upstream> a;
  device_workload(a, 64_MiB, 4096, 3);
  BOOST_TEST(a.counters().num_ooms == 0u);
}

BOOST_AUTO_TEST_CASE(caching_allocator_on_cuda_async, ALLOY_GPU_TEST) {
  alloy::caching_allocator<alloy::cuda_async_upstream> a;
  device_workload(a, 64_MiB, 4096, 4);
}

BOOST_AUTO_TEST_CASE(virtual_allocator_on_cuda_vmm, ALLOY_GPU_TEST) {
  alloy::virtual_allocator<alloy::cuda_vmm> a;
  BOOST_REQUIRE_MESSAGE(a.arena().vmm().valid(), "cuda_vmm could not start");
  device_workload(a, 64_MiB, 4096, 6);
  BOOST_TEST(a.counters().num_ooms == 0u);
  BOOST_TEST(a.counters().num_maps > 0u);
  BOOST_TEST(a.arena().vmm().physical_bytes() == 0u, "release() gives every granule back");
}

// Seed 5 peaks at 250 MiB live; at 280 MiB of device the arena must unmap free granules where
// they lie to serve it (the same run over host_vmm with 2 MiB granules: 37 unmaps with
// block-sized pieces, 4 with a piece per granule, no request refused), and the blocks beside them
// keep their content.
BOOST_AUTO_TEST_CASE(virtual_allocator_on_cuda_vmm_under_pressure, ALLOY_GPU_TEST) {
  alloy::virtual_allocator<alloy::cuda_vmm> a{alloy::cuda_vmm{{.capacity = 280_MiB}}};
  BOOST_REQUIRE_MESSAGE(a.arena().vmm().valid(), "cuda_vmm could not start");
  BOOST_REQUIRE(a.arena().vmm().granularity() == 2_MiB);
  device_workload(a, 64_MiB, 4096, 5);
  BOOST_TEST(a.counters().num_ooms == 0u);
  BOOST_TEST(a.counters().num_unmaps > 0u, "the capacity was never reached");
  BOOST_TEST(!a.arena().vmm().last_error());
}

BOOST_AUTO_TEST_SUITE_END()
