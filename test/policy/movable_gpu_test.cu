// SPDX-License-Identifier: Apache-2.0
// The device side of movable memory: the copy engine's cudaMemcpyAsync path (every direction, and
// the overlapping move used by sliding), and host_spill_reclaimer spilling device memory to pinned
// host memory and back. Labelled `gpu`; skips, saying why, without a device.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/movable.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/compacting_defragmenter.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>

#include "support/gpu.hpp"

using namespace alloy::literals;
using alloy::handle;

namespace {

__global__ void fill_kernel(std::uint32_t* data, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] = static_cast<std::uint32_t>(i) * 2654435761u + seed;
}

void fill_device(void* p, std::size_t bytes, std::uint32_t seed) {
  fill_kernel<<<64, 256>>>(static_cast<std::uint32_t*>(p), bytes / 4, seed);
  ALLOY_CUDA_TRY(cudaDeviceSynchronize());
}

bool device_holds(const void* p, std::size_t bytes, std::uint32_t seed) {
  std::vector<std::uint32_t> host(bytes / 4);
  ALLOY_CUDA_TRY(cudaMemcpy(host.data(), p, host.size() * 4, cudaMemcpyDefault));
  for (std::size_t i = 0; i < host.size(); ++i)
    if (host[i] != static_cast<std::uint32_t>(i) * 2654435761u + seed) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(movable_gpu)

BOOST_AUTO_TEST_CASE(copy_engine_device_paths, ALLOY_GPU_TEST) {
  constexpr std::size_t bytes = 4_MiB;
  void* a = nullptr;
  void* b = nullptr;
  ALLOY_CUDA_TRY(cudaMalloc(&a, bytes));
  ALLOY_CUDA_TRY(cudaMalloc(&b, bytes));
  std::vector<std::uint32_t> host(bytes / 4);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint32_t>(i) * 2654435761u + 7;

  alloy::copy_engine engine;
  BOOST_TEST((engine.copy<false, true>(a, host.data(), bytes)));  // host -> device
  BOOST_TEST(device_holds(a, bytes, 7));
  BOOST_TEST((engine.copy<false, false>(b, a, bytes)));  // device -> device
  BOOST_TEST(device_holds(b, bytes, 7));
  std::vector<std::uint32_t> back(bytes / 4);
  BOOST_TEST((engine.copy<true, false>(back.data(), b, bytes)));  // device -> host
  BOOST_TEST((back == host));
  BOOST_TEST(engine.bytes_copied() == 3 * bytes);

  // Overlapping move down by 1 KiB, as a slide does.
  fill_device(a, bytes, 9);
  BOOST_TEST(engine.move_within<false>(a, static_cast<char*>(a) + 1024, bytes - 1024));
  std::vector<std::uint32_t> moved((bytes - 1024) / 4);
  ALLOY_CUDA_TRY(cudaMemcpy(moved.data(), a, bytes - 1024, cudaMemcpyDeviceToHost));
  bool ok = true;
  for (std::size_t i = 0; i < moved.size(); ++i)
    ok = ok && moved[i] == static_cast<std::uint32_t>(i + 256) * 2654435761u + 9;
  BOOST_TEST(ok);
  // And up by 3 KiB.
  fill_device(a, bytes, 10);
  BOOST_TEST(engine.move_within<false>(static_cast<char*>(a) + 3072, a, bytes - 3072));
  ALLOY_CUDA_TRY(cudaMemcpy(moved.data(), static_cast<char*>(a) + 3072, bytes - 3072, cudaMemcpyDeviceToHost));
  ok = true;
  for (std::size_t i = 0; i < (bytes - 3072) / 4; ++i)
    ok = ok && moved[i] == static_cast<std::uint32_t>(i) * 2654435761u + 10;
  BOOST_TEST(ok);
  BOOST_TEST(!engine.last_error());
  ALLOY_CUDA_TRY(cudaFree(a));
  ALLOY_CUDA_TRY(cudaFree(b));
}

BOOST_AUTO_TEST_CASE(reclaimer_spills_device_memory_to_pinned_host, ALLOY_GPU_TEST) {
  using device = alloy::limited<alloy::cuda_malloc_upstream>;
  alloy::host_spill_reclaimer<device, alloy::pinned_host_upstream> a{
      device{alloy::cuda_malloc_upstream{}, {.bytes_limit = 64_MiB}}, alloy::pinned_host_upstream{}};
  std::vector<handle> hs;
  for (std::uint32_t i = 0; i < 12; ++i) {  // 12 x 8 MiB through a 64 MiB device
    const handle h = a.allocate_movable(8_MiB);
    BOOST_REQUIRE(h);
    void* p = a.lock(h);
    BOOST_REQUIRE(p);
    fill_device(p, 8_MiB, i);
    a.unlock(h);
    hs.push_back(h);
  }
  BOOST_TEST(a.movable_statistics().num_spills >= 4u);
  for (std::uint32_t i = 0; i < hs.size(); ++i) {
    void* p = a.lock(hs[i]);
    BOOST_REQUIRE(p);
    BOOST_TEST(device_holds(p, 8_MiB, i));
    a.unlock(hs[i]);
  }
  for (handle h : hs) a.deallocate(h);
  BOOST_TEST(a.device().bytes_in_use() == 0u);
}

// Device memory moved by the defragmenter: windows relocated with cudaMemcpyAsync, and a
// consolidation whose slides overlap (copied in steps on the device).
BOOST_AUTO_TEST_CASE(defragmenter_moves_device_memory, ALLOY_GPU_TEST) {
  using arena = alloy::best_fit_arena<alloy::cuda_malloc_upstream>;
  alloy::compacting_defragmenter<arena> a{
      arena{alloy::cuda_malloc_upstream{}, {.initial_size = 64_MiB, .maximum_size = 64_MiB}}};
  std::vector<handle> hs;
  for (std::uint32_t i = 0; i < 16; ++i) {
    hs.push_back(a.allocate_movable(4_MiB));
    BOOST_REQUIRE(hs.back());
    fill_device(a.lock(hs.back()), 4_MiB, i);
    a.unlock(hs.back());
  }
  for (std::uint32_t i = 1; i < 16; i += 2) a.deallocate(hs[i]);
  const alloy::block raw = a.allocate(16_MiB, 256);  // a window: two blocks move
  BOOST_REQUIRE(raw);
  BOOST_TEST(a.movable_statistics().bytes_defragged == 8_MiB);
  const alloy::block raw2 = a.allocate(16_MiB, 256);  // what is left is 16 MiB in 4 MiB holes
  BOOST_REQUIRE(raw2);
  for (std::uint32_t i = 0; i < 16; i += 2) {
    BOOST_TEST(device_holds(a.lock(hs[i]), 4_MiB, i));
    a.unlock(hs[i]);
    a.deallocate(hs[i]);
  }
  a.deallocate(raw);
  a.deallocate(raw2);
  BOOST_TEST(a.arena().free_bytes() == 64_MiB);
}

BOOST_AUTO_TEST_SUITE_END()
