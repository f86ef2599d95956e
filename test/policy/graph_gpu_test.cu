// SPDX-License-Identifier: Apache-2.0
// A CUDA graph that allocates and frees through synchronized<stats<stream_ordered<best_fit_arena>>>
// into a private pool, captured in the global mode (so CUDA itself invalidates the capture if alloy
// makes a forbidden call), replayed 100 times with its contents checked each time, while work
// outside the graph allocates from the same composition on another stream and never gets the
// pool's addresses. Labelled `gpu`; skips, saying why, without a device.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/stream_ordered.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/showcase.hpp>
#include <alloy/vmm/cuda_vmm.hpp>

#include "support/gpu.hpp"

using namespace alloy::literals;

namespace {

using arena = alloy::best_fit_arena<alloy::cuda_malloc_upstream>;
using vheap = alloy::virtual_allocator<alloy::cuda_vmm>;
template <class Heap>
using composition_over = alloy::synchronized<alloy::stats<alloy::stream_ordered<Heap, cudaStream_t>>>;
static_assert(alloy::capturable_stream<cudaStream_t>);
static_assert(alloy::graph_pooling_allocator<composition_over<arena>, cudaStream_t>);
static_assert(alloy::graph_pooling_allocator<composition_over<vheap>, cudaStream_t>);
// served from what they hold under a global capture, which forbids cudaMalloc and cuMemMap
static_assert(alloy::cache_serving_allocator<arena> && alloy::cache_serving_allocator<vheap>);

constexpr std::size_t n = 1 << 20;  // 4 MiB of uint32 per block

__global__ void next_round(unsigned* round) { ++*round; }
__global__ void fill(std::uint32_t* data, const unsigned* round, std::uint32_t salt) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] = static_cast<std::uint32_t>(i) * 2654435761u + *round * 7u + salt;
}
__global__ void transform(const std::uint32_t* in, std::uint32_t* out) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = in[i] ^ 0x5a5a5a5au;
}
__global__ void check(const std::uint32_t* data, const unsigned* round, std::uint32_t salt, std::uint32_t mask,
                      unsigned* bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const std::uint32_t want = (static_cast<std::uint32_t>(i) * 2654435761u + *round * 7u + salt) ^ mask;
    if (data[i] != want) atomicAdd(bad, 1u);
  }
}

bool overlaps(const alloy::block& a, const std::vector<alloy::block>& set) {
  const auto lo = reinterpret_cast<std::uintptr_t>(a.ptr);
  for (const alloy::block& b : set) {
    const auto blo = reinterpret_cast<std::uintptr_t>(b.ptr);
    if (lo < blo + b.size && blo < lo + a.size) return true;
  }
  return false;
}

/// A graph that allocates, fills, transforms, frees and reuses through `alloc` (warm), replayed 100
/// times with work outside it on another stream from the same composition; every replay's content
/// is checked on the device.
template <class Composition>
void replay_100_times(Composition& alloc) {
  cudaStream_t s = nullptr, other = nullptr;
  ALLOY_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ALLOY_CUDA_TRY(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  unsigned* counters = nullptr;  // [0] round, [1] mismatches
  ALLOY_CUDA_TRY(cudaMallocManaged(&counters, 2 * sizeof(unsigned)));
  counters[0] = counters[1] = 0;
  alloy::graph_pool pool;

  std::vector<alloy::block> pool_blocks;
  cudaGraph_t graph = nullptr;
  ALLOY_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s));
  const alloy::block a = alloc.allocate(n * 4, 256, s);
  const alloy::block b = alloc.allocate(n * 4, 256, s);
  BOOST_REQUIRE((a && b));
  next_round<<<1, 1, 0, s>>>(counters);
  fill<<<256, 256, 0, s>>>(static_cast<std::uint32_t*>(a.ptr), counters, 1);
  transform<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(a.ptr), static_cast<std::uint32_t*>(b.ptr));
  alloc.deallocate(a, s);
  const alloy::block c = alloc.allocate(n * 4, 256, s);  // may reuse a's memory, later in the graph
  BOOST_REQUIRE(c);
  fill<<<256, 256, 0, s>>>(static_cast<std::uint32_t*>(c.ptr), counters, 2);
  check<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(b.ptr), counters, 1, 0x5a5a5a5au, counters + 1);
  check<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(c.ptr), counters, 2, 0u, counters + 1);
  alloc.deallocate(b, s);
  alloc.deallocate(c, s);
  ALLOY_CUDA_TRY(cudaStreamEndCapture(s, &graph));  // fails if alloy made a forbidden call
  alloc.end_allocate_to_pool(pool);
  pool_blocks = {a, b, c};
  cudaGraphExec_t exec = nullptr;
  ALLOY_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));

  for (int replay = 0; replay < 100; ++replay) {
    ALLOY_CUDA_TRY(cudaGraphLaunch(exec, s));
    // work outside the graph, on another stream, from the same composition
    const alloy::block o = alloc.allocate(n * 4, 256, other);
    BOOST_REQUIRE(o);
    BOOST_TEST(!overlaps(o, pool_blocks));
    ALLOY_CUDA_TRY(cudaMemsetAsync(o.ptr, 0xff, o.size, other));
    alloc.deallocate(o, other);
  }
  ALLOY_CUDA_TRY(cudaStreamSynchronize(s));
  ALLOY_CUDA_TRY(cudaStreamSynchronize(other));
  BOOST_TEST(counters[0] == 100u);
  BOOST_TEST(counters[1] == 0u);

  ALLOY_CUDA_TRY(cudaGraphExecDestroy(exec));
  ALLOY_CUDA_TRY(cudaGraphDestroy(graph));
  alloc.release_pool(pool);
  BOOST_TEST(alloc.pool_figures().pools == 0u);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  cudaFree(counters);
  cudaStreamDestroy(s);
  cudaStreamDestroy(other);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(graph_gpu)

BOOST_AUTO_TEST_CASE(captured_allocations_replayed_100_times, ALLOY_GPU_TEST) {
  // A warm cache: the global capture mode forbids cudaMalloc, so the graph is served from it.
  composition_over<arena> alloc{alloy::stats<alloy::stream_ordered<arena, cudaStream_t>>{
      alloy::stream_ordered<arena, cudaStream_t>{arena{{}, {.initial_size = 64_MiB}}}}};
  replay_100_times(alloc);
}

BOOST_AUTO_TEST_CASE(captured_allocations_replayed_100_times_over_virtual_allocator, ALLOY_GPU_TEST) {
  // Warm: blocks as large as the graph's mapped once and freed (granules stay mapped).
  composition_over<vheap> alloc{alloy::stats<alloy::stream_ordered<vheap, cudaStream_t>>{
      alloy::stream_ordered<vheap, cudaStream_t>{vheap{alloy::cuda_vmm{}}}}};
  std::vector<alloy::block> warm;
  for (int i = 0; i < 4; ++i) warm.push_back(alloc.allocate(n * 4, 256));
  for (const alloy::block b : warm) alloc.deallocate(b);
  replay_100_times(alloc);
}

BOOST_AUTO_TEST_SUITE_END()
