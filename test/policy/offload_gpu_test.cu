// SPDX-License-Identifier: Apache-2.0
// virtual_arena<cuda_vmm> offload on a real device: blocks of two tags written by a kernel,
// the weights offloaded to pinned host memory (cudaMallocHost, copied by copy_engine's
// cudaMemcpyAsync), the cache discarded, the device memory taken by a third tag, then both
// restored at the same addresses and the weights read back. Labelled `gpu`; skips, saying why,
// when no device is present.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

#include <alloy/detail/cuda.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/tag.hpp>
#include <alloy/vmm/cuda_vmm.hpp>

#include "support/device_pattern.cuh"
#include "support/gpu.hpp"

using alloy::testing::device_holds_pattern;
using alloy::testing::fill_on_device;

BOOST_AUTO_TEST_SUITE(offload_gpu)

BOOST_AUTO_TEST_CASE(offload_discard_restore_on_the_device, ALLOY_GPU_TEST) {
  alloy::cuda_vmm v;
  BOOST_REQUIRE_MESSAGE(v.valid(), "cuda_vmm could not start: " << (v.last_error().call ? v.last_error().call : ""));
  const std::size_t g = v.granularity();
  alloy::virtual_arena<alloy::cuda_vmm> a{std::move(v), {.release_threshold = 0}};
  constexpr alloy::tag weights{1}, cache{2}, training{3};
  std::vector<alloy::block> w, c;
  for (std::uint32_t i = 0; i < 6; ++i) w.push_back(a.allocate(g + 4096 * i + 100, 256, weights));
  for (std::uint32_t i = 0; i < 3; ++i) c.push_back(a.allocate(g / 2, 256, cache));
  for (std::uint32_t i = 0; i < w.size(); ++i) fill_on_device(w[i], 10 + i);
  for (const alloy::block& b : w) BOOST_REQUIRE(b.ptr != nullptr);
  const std::size_t physical = a.vmm().physical_bytes();
  const std::size_t w_mapped = a.mapped_bytes(weights), c_mapped = a.mapped_bytes(cache);

  BOOST_TEST((a.offload(weights) == alloy::offload_status::done));
  BOOST_TEST((a.discard(cache) == alloy::offload_status::done));
  BOOST_TEST(a.vmm().physical_bytes() == physical - w_mapped - c_mapped);
  BOOST_TEST(a.offload_stats().bytes_on_host == a.host_bytes(weights));
  // Another tag takes the freed memory and writes over it.
  const alloy::block t = a.allocate(w_mapped + c_mapped, g, training);
  BOOST_REQUIRE(t.ptr != nullptr);
  fill_on_device(t, 99);
  a.deallocate(t);

  BOOST_TEST((a.restore(weights) == alloy::offload_status::done));
  BOOST_TEST((a.restore(cache) == alloy::offload_status::done));
  for (std::uint32_t i = 0; i < w.size(); ++i) BOOST_TEST(device_holds_pattern(w[i], 10 + i), "weight block " << i);
  BOOST_TEST(a.offload_stats().bytes_copied_back == a.offload_stats().bytes_copied_to_host);
  BOOST_TEST(a.check_invariants());
  for (const alloy::block& b : w) a.deallocate(b);
  for (const alloy::block& b : c) a.deallocate(b);
}

BOOST_AUTO_TEST_SUITE_END()
