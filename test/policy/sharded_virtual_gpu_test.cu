// SPDX-License-Identifier: Apache-2.0
// Threads on one device: sharded<virtual_allocator> over one synchronized cuda_vmm, four threads
// each stamping, checking and freeing random blocks on its own stream. Growths above 64 KiB are
// planned: their creates and maps run outside the shards' locks, so real driver calls of several
// threads overlap (the host suites run this path over host_vmm only). No block may lose its
// content, and everything goes back. Labelled `gpu`; skips, saying why, without a device.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/policy/sharded.hpp>
#include <alloy/showcase.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>

#include "support/device_pattern.cuh"
#include "support/gpu.hpp"

namespace {

using backend_t = alloy::synchronized_vmm<alloy::cuda_vmm>;
using shard_t = alloy::virtual_allocator<alloy::vmm_ref<backend_t>>;
static_assert(alloy::thread_safe_vmm<alloy::vmm_ref<backend_t>>);
static_assert(alloy::growth_planning_allocator<shard_t>);

struct thread_result {
  unsigned failed_allocations = 0, cuda_errors = 0;
  std::size_t served = 0;
};

/// One thread's work: up to 64 blocks live, 4 B-8 MiB log-uniform; each stamped when allocated
/// and checked (the stream waited for) before it is freed, so that no other thread can get it
/// while a kernel of this one still uses it.
void thread_work(alloy::sharded<shard_t>& a, unsigned* wrong, std::uint32_t t, thread_result& out) {
  cudaStream_t stream{};
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    ++out.cuda_errors;
    return;
  }
  struct live {
    alloy::block b;
    std::uint32_t seed;
  };
  std::mt19937_64 rng(t + 1);
  std::uniform_real_distribution<double> log_size(2.0, 23.0);
  std::vector<live> blocks;
  std::uint32_t next = (t << 24) + 1;
  auto check_and_free = [&](std::size_t i) {
    const live l = blocks[i];
    alloy::testing::count_wrong_kernel<<<32, 256, 0, stream>>>(static_cast<const std::uint32_t*>(l.b.ptr), l.b.size / 4,
                                                               l.seed, wrong);
    if (cudaStreamSynchronize(stream) != cudaSuccess) ++out.cuda_errors;
    a.deallocate(l.b);
    blocks[i] = blocks.back();
    blocks.pop_back();
  };
  for (int op = 0; op < 1500; ++op) {
    if (blocks.empty() || (blocks.size() < 64 && rng() % 2 == 0)) {
      const auto bytes = static_cast<std::size_t>(std::exp2(log_size(rng)));
      const alloy::block b = a.allocate(bytes, 256);
      if (!b) {
        ++out.failed_allocations;
        continue;
      }
      ++out.served;
      alloy::testing::fill_kernel<<<32, 256, 0, stream>>>(static_cast<std::uint32_t*>(b.ptr), bytes / 4, next);
      blocks.push_back({b, next++});
    } else {
      check_and_free(rng() % blocks.size());
    }
  }
  while (!blocks.empty()) check_and_free(blocks.size() - 1);
  if (cudaStreamDestroy(stream) != cudaSuccess) ++out.cuda_errors;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sharded_virtual_gpu)

BOOST_AUTO_TEST_CASE(four_threads_map_and_use_one_device, ALLOY_GPU_TEST) {
  backend_t backend{alloy::cuda_vmm{}};
  BOOST_REQUIRE(backend.backend().valid());
  unsigned* wrong = nullptr;
  ALLOY_CUDA_TRY(cudaMalloc(&wrong, sizeof(unsigned)));
  ALLOY_CUDA_TRY(cudaMemset(wrong, 0, sizeof(unsigned)));
  thread_result results[4];
  {
    alloy::sharded<shard_t> a([&](std::size_t) { return shard_t{alloy::vmm_ref<backend_t>{backend}}; }, {.shards = 4});
    std::vector<std::thread> threads;
    for (std::uint32_t t = 0; t < 4; ++t) threads.emplace_back([&, t] { thread_work(a, wrong, t, results[t]); });
    for (std::thread& th : threads) th.join();
    ALLOY_CUDA_TRY(cudaDeviceSynchronize());
    BOOST_TEST(a.bytes_in_use() == 0u);
    BOOST_TEST(a.counters().num_maps > 0u);
    a.release();
    BOOST_TEST(a.reserved_bytes() == 0u);
  }
  unsigned wrong_words = 0;
  ALLOY_CUDA_TRY(cudaMemcpy(&wrong_words, wrong, sizeof(unsigned), cudaMemcpyDeviceToHost));
  ALLOY_CUDA_TRY(cudaFree(wrong));
  BOOST_TEST(wrong_words == 0u, "blocks lost their content");
  for (const thread_result& r : results) {
    BOOST_TEST(r.failed_allocations == 0u);
    BOOST_TEST(r.cuda_errors == 0u);
    BOOST_TEST(r.served > 500u);
  }
  BOOST_TEST(backend.physical_bytes() == 0u, "every granule went back");
  BOOST_TEST(!backend.backend().last_error());
}

BOOST_AUTO_TEST_SUITE_END()
