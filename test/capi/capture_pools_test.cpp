// SPDX-License-Identifier: Apache-2.0
// liballoy's pools for graphs captured through it (src/capi/capture_pools.hpp), over the host model
// of the CUDA runtime: a capture that allocates and frees as PyTorch's torch.cuda.graph does (no
// call tells the allocator that a capture begins or ends) keeps its memory from the work that runs
// between its replays; without the pools the same sequence hands the graph's memory to that work,
// which the model reports; released pools give the memory back.
#include <boost/test/unit_test.hpp>

#include <alloy/cuda_model.hpp>
#include <alloy/literals.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/stream_ordered.hpp>
#include <alloy/showcase.hpp>

#include "capi/capture_pools.hpp"

using namespace alloy::literals;
namespace model = alloy::cuda_model;

namespace {

using arena = alloy::best_fit_arena<model::malloc_upstream>;

/// The heaps under test: a best-fit arena over `cudaMalloc`, and liballoy's `virtual` composition
/// (virtual_allocator) over the model's virtual memory.
struct over_arena {
  using heap = arena;
  static heap make(model::runtime& rt) { return heap{model::malloc_upstream{rt}, {.initial_size = 16_MiB}}; }
};
struct over_virtual_memory {
  using heap = alloy::virtual_allocator<model::vmm>;
  static heap make(model::runtime& rt) { return heap{model::vmm{rt, 256_MiB}}; }
};

template <class Over>
struct fixture_of {
  using composition = alloy::stats<alloy::stream_ordered<typename Over::heap, model::stream_t>>;
  model::runtime rt;
  model::stream_t capturing{};
  model::stream_t other{};
  composition alloc{alloy::stream_ordered<typename Over::heap, model::stream_t>{Over::make(rt)}};
  alloy::capi::capture_pools<composition, model::stream_t> pools;

  fixture_of() {
    BOOST_REQUIRE(rt.stream_create(&capturing) == model::error::success);
    BOOST_REQUIRE(rt.stream_create(&other) == model::error::success);
    const alloy::block warm = alloc.allocate(8_MiB, 256, capturing);  // the cache the capture uses
    BOOST_REQUIRE(warm);
    alloc.deallocate(warm, capturing);
    rt.run_all();
  }

  alloy::block allocate(std::size_t bytes, model::stream_t s, bool with_pools) {
    if (with_pools) pools.route(alloc, s);
    return alloc.allocate(bytes, 256, s);
  }

  /// A graph that allocates two scratch blocks, uses them, frees them inside the capture, and
  /// allocates and keeps an output block (where one of them was); then `launches` replays, each
  /// followed by work on another stream that allocates, uses and frees 1 MiB. Returns the graph.
  model::graph_t capture_and_replay(bool with_pools, int launches, alloy::block& output) {
    BOOST_REQUIRE(rt.begin_capture(capturing, alloy::capture_mode::global) == model::error::success);
    const alloy::block first = allocate(1_MiB, capturing, with_pools);
    const alloy::block second = allocate(1_MiB, capturing, with_pools);
    BOOST_REQUIRE((first && second));
    BOOST_REQUIRE(rt.use(capturing, first.ptr, first.size) == model::error::success);
    BOOST_REQUIRE(rt.use(capturing, second.ptr, second.size) == model::error::success);
    alloc.deallocate(first, capturing);
    alloc.deallocate(second, capturing);
    output = allocate(1_MiB, capturing, with_pools);  // in one of the scratch blocks' places
    BOOST_REQUIRE(output);
    BOOST_REQUIRE(rt.use(capturing, output.ptr, output.size) == model::error::success);
    model::graph_t graph{};
    BOOST_REQUIRE(rt.end_capture(capturing, &graph) == model::error::success);
    for (int i = 0; i < launches; ++i) {
      BOOST_REQUIRE(rt.graph_launch(graph, capturing) == model::error::success);
      const alloy::block work = allocate(1_MiB, other, with_pools);
      BOOST_REQUIRE(work);
      (void)rt.use(other, work.ptr, work.size);  // the model records a touch of a graph's memory
      alloc.deallocate(work, other);
      rt.run_all();
    }
    return graph;
  }
};
using fixture = fixture_of<over_arena>;
using virtual_fixture = fixture_of<over_virtual_memory>;

}  // namespace

BOOST_FIXTURE_TEST_CASE(without_pools_the_graphs_memory_reaches_other_work, fixture) {
  // The control: what liballoy would do without its pools, which the model must catch.
  alloy::block output;
  capture_and_replay(false, 3, output);
  BOOST_TEST(!rt.clean());
}

BOOST_FIXTURE_TEST_CASE(a_capture_keeps_its_memory_from_other_work_until_released, fixture) {
  alloy::block output;
  const model::graph_t graph = capture_and_replay(true, 5, output);
  BOOST_TEST(rt.clean(), rt.first_violation());
  BOOST_TEST(pools.size() == 1u);
  BOOST_TEST(alloc.pool_figures().free_bytes >= 1_MiB);  // the scratch block, kept for the replays

  // A second capture gets a pool of its own; the first stays.
  alloy::block output2;
  const model::graph_t graph2 = capture_and_replay(true, 2, output2);
  BOOST_TEST(rt.clean(), rt.first_violation());
  BOOST_TEST(pools.size() == 2u);

  // Once the graphs are gone, their pools go back: the memory serves everyone again.
  alloc.deallocate(output, capturing);
  alloc.deallocate(output2, capturing);
  BOOST_REQUIRE(rt.graph_destroy(graph) == model::error::success);
  BOOST_REQUIRE(rt.graph_destroy(graph2) == model::error::success);
  pools.release_closed(alloc);
  BOOST_TEST(pools.size() == 0u);
  BOOST_TEST(alloc.pool_figures().pools == 0u);
  rt.run_all();
  const alloy::block again = alloc.allocate(8_MiB, 256, other);
  BOOST_TEST(static_cast<bool>(again));
  alloc.deallocate(again, other);
  BOOST_TEST(rt.clean(), rt.first_violation());
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

BOOST_FIXTURE_TEST_CASE(a_running_capture_keeps_its_pool_through_a_release, fixture) {
  BOOST_REQUIRE(rt.begin_capture(capturing, alloy::capture_mode::global) == model::error::success);
  const alloy::block b = allocate(1_MiB, capturing, true);
  BOOST_REQUIRE(b);
  pools.release_closed(alloc);  // PyTorch's empty_cache during a capture, say
  BOOST_TEST(pools.size() == 1u);
  alloc.deallocate(b, capturing);
  model::graph_t graph{};
  BOOST_REQUIRE(rt.end_capture(capturing, &graph) == model::error::success);
  BOOST_REQUIRE(rt.graph_destroy(graph) == model::error::success);
  pools.release_closed(alloc);
  BOOST_TEST(pools.size() == 0u);
  BOOST_TEST(rt.clean(), rt.first_violation());
}

// liballoy's default composition, virtual_allocator: the capture is served from the granules the
// warm-up mapped (no create or map under the global capture, which the model would report), and
// its pool keeps the graph's memory from other work as over an arena.
BOOST_FIXTURE_TEST_CASE(the_virtual_composition_serves_a_capture_from_its_mapped_granules, virtual_fixture) {
  alloy::block output;
  const model::graph_t graph = capture_and_replay(true, 5, output);
  BOOST_TEST(rt.clean(), rt.first_violation());
  BOOST_TEST(alloc.inner().order_counters().capture_refusals == 0u);
  BOOST_TEST(pools.size() == 1u);
  alloc.deallocate(output, capturing);
  BOOST_REQUIRE(rt.graph_destroy(graph) == model::error::success);
  pools.release_closed(alloc);
  rt.run_all();
  BOOST_TEST(alloc.pool_figures().pools == 0u);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  BOOST_TEST(rt.clean(), rt.first_violation());
}
