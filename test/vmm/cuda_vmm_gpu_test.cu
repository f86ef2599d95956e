// SPDX-License-Identifier: Apache-2.0
// cuda_vmm on a real device: reserve / create / map, device writes read back, unmap, capacity
// refusal, and a virtual_arena<cuda_vmm> whose blocks keep their content while neighbouring
// granules are unmapped and mapped again. Every test is labelled `gpu` and skips, saying why,
// when no device is present.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include <alloy/detail/cuda.hpp>
#include <alloy/literals.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/vmm/cuda_vmm.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>

#include "support/device_pattern.cuh"
#include "support/gpu.hpp"

using namespace alloy::literals;

static_assert(alloy::virtual_memory<alloy::cuda_vmm>);
static_assert(alloy::virtual_memory<alloy::vmm_ref<alloy::synchronized_vmm<alloy::cuda_vmm>>>);

namespace {

using alloy::testing::device_holds_pattern;
using alloy::testing::fill_on_device;

bool device_holds_byte(const void* p, std::size_t n, unsigned char value) {
  std::vector<unsigned char> host(n);
  ALLOY_CUDA_TRY(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost));
  for (unsigned char c : host)
    if (c != value) return false;
  return true;
}

/// Waits about `cycles` clock ticks, then writes `value` over `n` words: work still queued on
/// memory when the host moves on.
__global__ void late_write_kernel(std::uint32_t* data, std::size_t n, long long cycles, std::uint32_t value) {
  const long long start = clock64();
  while (clock64() - start < cycles) {}
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) data[i] = value;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_vmm_gpu)

// cuMemUnmap does not wait for queued work as cudaFree does; cuda_vmm::unmap must, or a kernel
// still using a block freed in stream order faults (cudaErrorIllegalAddress, seen on an H200).
BOOST_AUTO_TEST_CASE(unmap_waits_for_queued_work, ALLOY_GPU_TEST) {
  alloy::cuda_vmm v;
  BOOST_REQUIRE(v.valid());
  const std::size_t g = v.granularity();
  const alloy::address_range r = v.reserve(g);
  BOOST_REQUIRE(r);
  const alloy::physical_memory piece = v.create(g);
  BOOST_REQUIRE(piece);
  BOOST_REQUIRE(v.map(r.ptr, piece));
  late_write_kernel<<<8, 256>>>(static_cast<std::uint32_t*>(r.ptr), g / 4, 200'000'000, 7u);  // ~0.1 s
  ALLOY_CUDA_TRY(cudaGetLastError());
  v.unmap(r.ptr, g);  // the kernel is still spinning
  BOOST_TEST(cudaDeviceSynchronize() == cudaSuccess, "the kernel lost its memory under it");
  v.release(piece);
  v.unreserve(r);
  BOOST_TEST(!v.last_error());
}

BOOST_AUTO_TEST_CASE(reserve_create_map_write_read_unmap, ALLOY_GPU_TEST) {
  alloy::cuda_vmm v;
  BOOST_REQUIRE_MESSAGE(v.valid(), "cuda_vmm could not start: " << (v.last_error().call ? v.last_error().call : ""));
  const std::size_t g = v.granularity();
  BOOST_TEST(alloy::detail::is_power_of_two(g));
  BOOST_TEST(v.capacity() > g);
  const alloy::address_range r = v.reserve(8 * g);
  BOOST_REQUIRE(r);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(r.ptr) % g == 0u);
  const alloy::physical_memory piece = v.create(2 * g);
  BOOST_REQUIRE(piece);
  BOOST_TEST(v.physical_bytes() == 2 * g);
  void* at = static_cast<char*>(r.ptr) + 3 * g;
  BOOST_REQUIRE(v.map(at, piece));
  ALLOY_CUDA_TRY(cudaMemset(at, 0x5A, piece.size));
  ALLOY_CUDA_TRY(cudaDeviceSynchronize());
  BOOST_TEST(device_holds_byte(at, piece.size, 0x5A));
  // Unmapped and mapped at another place: the same physical memory, the same content.
  v.unmap(at, piece.size);
  void* again = static_cast<char*>(r.ptr) + 6 * g;
  BOOST_REQUIRE(v.map(again, piece));
  BOOST_TEST(device_holds_byte(again, piece.size, 0x5A));
  v.unmap(again, piece.size);
  v.release(piece);
  v.unreserve(r);
  BOOST_TEST(v.physical_bytes() == 0u);
  BOOST_TEST(!v.last_error(), "unexpected failure in " << (v.last_error().call ? v.last_error().call : ""));
  BOOST_TEST(v.calls().maps == 2u);
  BOOST_TEST(v.calls().unmaps == 2u);
}

BOOST_AUTO_TEST_CASE(capacity_refusal, ALLOY_GPU_TEST) {
  alloy::cuda_vmm probe;
  BOOST_REQUIRE(probe.valid());
  const std::size_t g = probe.granularity();
  alloy::cuda_vmm v{{.capacity = 3 * g}};
  BOOST_TEST(v.capacity() == 3 * g);
  const alloy::physical_memory a = v.create(2 * g);
  BOOST_REQUIRE(a);
  BOOST_TEST(!v.create(2 * g), "past the capacity");
  const alloy::physical_memory b = v.create(1);
  BOOST_REQUIRE(b);
  BOOST_TEST(b.size == g);
  BOOST_TEST(!v.create(1));
  v.release(a);
  v.release(b);
  BOOST_TEST(v.physical_bytes() == 0u);
  BOOST_TEST(!v.last_error(), "a capacity refusal is no error");
  BOOST_TEST(!v.reserve(0));
}

BOOST_AUTO_TEST_CASE(virtual_arena_keeps_content_across_unmaps, ALLOY_GPU_TEST) {
  alloy::cuda_vmm probe;
  BOOST_REQUIRE(probe.valid());
  const std::size_t g = probe.granularity();
  // Nothing kept free: every granule whose last chunk goes is unmapped at once (the defaults keep
  // up to the peak of the granules touched, and the zeros checked at the end would not hold).
  alloy::virtual_arena<alloy::cuda_vmm> a{
      alloy::cuda_vmm{{.capacity = 256 * g}},
      {.release_threshold = 0, .release_threshold_divisor = 0, .keep_up_to_peak = false}};
  std::mt19937_64 rng(5);
  struct live {
    alloy::block b;
    std::uint32_t seed;
  };
  std::vector<live> blocks;
  std::uint32_t next = 1;
  auto grow = [&](std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t bytes = (std::size_t{4} << (rng() % 20)) + 4 * (rng() % 1000);  // 4 B .. 2 MiB and more
      const alloy::block b = a.allocate(bytes, 256);
      BOOST_REQUIRE(b);
      fill_on_device(b, next);
      blocks.push_back({b, next++});
    }
  };
  grow(200);
  for (int round = 0; round < 6; ++round) {
    for (std::size_t i = blocks.size(); i-- > 0;) {
      if ((i + static_cast<std::size_t>(round)) % 2 == 0) {
        a.deallocate(blocks[i].b);
        blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    grow(blocks.size());
    ALLOY_CUDA_TRY(cudaDeviceSynchronize());
    for (const live& l : blocks)
      BOOST_TEST(device_holds_pattern(l.b, l.seed), "block " << l.seed << " lost its content");
    BOOST_TEST(a.check_invariants());
  }
  BOOST_TEST(a.counters().num_unmaps > 0u);
  BOOST_TEST(a.reserved_bytes() == a.mapped_bytes());
  BOOST_TEST(a.vmm().physical_bytes() == a.mapped_bytes());
  // Capacity: more than 256 granules at once cannot be served.
  BOOST_TEST(!a.allocate(257 * g, 256));
  for (const live& l : blocks) a.deallocate(l.b);
  BOOST_TEST(a.reserved_bytes() == 0u);
  BOOST_TEST(a.vmm().physical_bytes() == 0u);
  BOOST_TEST(!a.vmm().last_error());
}

BOOST_AUTO_TEST_SUITE_END()
