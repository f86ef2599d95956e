// SPDX-License-Identifier: Apache-2.0
// Stream capture and private graph pools, over the host model of the CUDA runtime
// (alloy/cuda_model.hpp): the model answering CUDA's rules itself; one test per call CUDA forbids
// under capture, which fails if stream_ordered ever makes it; graph pools (isolation, sharing,
// release, an aborted capture); `allocate_cached`, through which captures are served; graph pools
// in the statistics; randomized sequences of captures, allocations, frees, launches and pool
// releases on several streams, over a best-fit arena and over virtual_allocator, checked after
// every step; two threads, one capturing.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <alloy/cuda_model.hpp>
#include <alloy/literals.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/sharded.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/stream_ordered.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/showcase.hpp>

#include "support/sanitizers.hpp"

using namespace alloy::literals;
using alloy::block;
using alloy::capture_mode;
using alloy::graph_pool;
namespace model = alloy::cuda_model;
using model::error;
using model::stream_t;

namespace alloy::cuda_model {
inline std::ostream& boost_test_print_type(std::ostream& out, error e) { return out << static_cast<int>(e); }
}  // namespace alloy::cuda_model

namespace {

using arena = alloy::best_fit_arena<model::malloc_upstream>;
using ordered = alloy::stream_ordered<arena, stream_t>;

arena make_arena(model::runtime& rt, std::size_t initial = 0) {
  return arena{model::malloc_upstream{rt}, {.initial_size = initial, .growth_size = 1_MiB, .max_growth_size = 4_MiB}};
}

stream_t make_stream(model::runtime& rt) {
  stream_t s{};
  BOOST_REQUIRE(rt.stream_create(&s) == error::success);
  return s;
}

#define REQUIRE_CLEAN(rt) BOOST_REQUIRE_MESSAGE((rt).clean(), (rt).first_violation())

/// Fills the arena's cache, so that captures can be served without its upstream.
void warm(ordered& a, stream_t s, std::size_t bytes) {
  const block b = a.allocate(bytes, 256, s);
  BOOST_REQUIRE(b);
  a.deallocate(b, s);
}

}  // namespace

// ---- the model answers as CUDA does ----------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(model_rules)

BOOST_AUTO_TEST_CASE(captured_event_query_invalidates) {
  model::runtime rt;
  const stream_t s = make_stream(rt);
  model::event_t e{};
  BOOST_REQUIRE(rt.event_create(&e) == error::success);
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::relaxed) == error::success);
  BOOST_REQUIRE(rt.event_record(e, s) == error::success);
  BOOST_TEST(static_cast<int>(rt.event_query(e)) == 907);  // cudaErrorCapturedEvent
  BOOST_TEST(static_cast<int>(rt.stream_synchronize(s)) == 900);
  model::graph_t g{};
  BOOST_TEST(static_cast<int>(rt.end_capture(s, &g)) == 901);  // cudaErrorStreamCaptureInvalidated
  BOOST_TEST(!g);
  BOOST_TEST(rt.take_violations().size() == 2u);
}

BOOST_AUTO_TEST_CASE(unsafe_calls_by_mode) {
  model::runtime rt;
  const stream_t s = make_stream(rt);
  void* p = nullptr;
  for (const capture_mode mode : {capture_mode::global, capture_mode::thread_local_, capture_mode::relaxed}) {
    BOOST_REQUIRE(rt.begin_capture(s, mode) == error::success);
    const error own = rt.malloc(&p, 1024);
    BOOST_TEST((own == error::success) == (mode == capture_mode::relaxed));
    if (own == error::success) BOOST_REQUIRE(rt.free(p) == error::success);
    error other = error::success;  // another thread in the global interaction mode
    std::thread([&] {
      other = rt.malloc(&p, 1024);
      if (other == error::success) (void)rt.free(p);
    }).join();
    BOOST_TEST((other == error::success) == (mode != capture_mode::global));
    capture_mode relaxed = capture_mode::relaxed;  // a thread that exchanged its mode for relaxed
    error relaxed_other = error::success;
    std::thread([&] {
      (void)rt.exchange_capture_mode(&relaxed);
      relaxed_other = rt.malloc(&p, 1024);
      if (relaxed_other == error::success) (void)rt.free(p);
    }).join();
    BOOST_TEST(relaxed_other == error::success);
    model::graph_t g{};
    const error end = rt.end_capture(s, &g);
    BOOST_TEST((end == error::success) == (mode == capture_mode::relaxed));
    if (g) (void)rt.graph_destroy(g);
    (void)rt.take_violations();
  }
}

BOOST_AUTO_TEST_CASE(waits_join_isolate_and_order) {
  model::runtime rt;
  const stream_t a = make_stream(rt), b = make_stream(rt);
  model::event_t outside{}, inside{}, back{};
  BOOST_REQUIRE(rt.event_create(&outside) == error::success);
  BOOST_REQUIRE(rt.event_create(&inside) == error::success);
  BOOST_REQUIRE(rt.event_create(&back) == error::success);
  void* p = nullptr;
  BOOST_REQUIRE(rt.malloc(&p, 4096) == error::success);
  // ordering: b's work after a wait on a's event runs after a's work
  BOOST_REQUIRE(rt.use(a, p, 64) == error::success);
  BOOST_REQUIRE(rt.event_record(outside, a) == error::success);
  BOOST_REQUIRE(rt.stream_wait_event(b, outside, 0) == error::success);
  BOOST_REQUIRE(rt.use(b, p, 64) == error::success);
  BOOST_TEST(rt.busy(a));
  rt.run(b);
  BOOST_TEST(!rt.busy(a));
  // a captured wait on an event from outside: isolation, unless external
  BOOST_REQUIRE(rt.begin_capture(a, capture_mode::global) == error::success);
  BOOST_REQUIRE(rt.stream_wait_event(a, outside, model::wait_external_flag) == error::success);
  BOOST_TEST(rt.clean());
  BOOST_TEST(static_cast<int>(rt.stream_wait_event(a, outside, 0)) == 905);
  model::graph_t g{};
  BOOST_TEST(static_cast<int>(rt.end_capture(a, &g)) == 901);
  BOOST_TEST(rt.take_violations().size() == 1u);
  // a stream joined by waiting on a captured event must be joined back
  BOOST_REQUIRE(rt.begin_capture(a, capture_mode::global) == error::success);
  BOOST_REQUIRE(rt.event_record(inside, a) == error::success);
  BOOST_REQUIRE(rt.stream_wait_event(b, inside, 0) == error::success);
  {
    alloy::capture_state cs{};
    BOOST_REQUIRE(rt.get_capture_info(b, &cs) == error::success);
    BOOST_TEST(cs.capturing());
  }
  BOOST_REQUIRE(rt.use(b, p, 64) == error::success);
  BOOST_TEST(static_cast<int>(rt.end_capture(b, &g)) == 903);  // not the origin stream
  (void)rt.take_violations();
  BOOST_TEST(static_cast<int>(rt.end_capture(a, &g)) == 901);  // invalidated by the above
  BOOST_REQUIRE(rt.begin_capture(a, capture_mode::global) == error::success);
  BOOST_REQUIRE(rt.event_record(inside, a) == error::success);
  BOOST_REQUIRE(rt.stream_wait_event(b, inside, 0) == error::success);
  BOOST_REQUIRE(rt.use(b, p, 64) == error::success);
  BOOST_TEST(static_cast<int>(rt.end_capture(a, &g)) == 904);  // cudaErrorStreamCaptureUnjoined
  (void)rt.take_violations();
  BOOST_REQUIRE(rt.begin_capture(a, capture_mode::global) == error::success);
  BOOST_REQUIRE(rt.event_record(inside, a) == error::success);
  BOOST_REQUIRE(rt.stream_wait_event(b, inside, 0) == error::success);
  BOOST_REQUIRE(rt.use(b, p, 64) == error::success);
  BOOST_REQUIRE(rt.event_record(back, b) == error::success);
  BOOST_REQUIRE(rt.stream_wait_event(a, back, 0) == error::success);
  BOOST_REQUIRE(rt.end_capture(a, &g) == error::success);
  REQUIRE_CLEAN(rt);
  // the graph's memory: other work must not touch it, nor may it be freed, while the graph lives
  BOOST_TEST(rt.graph_uses(p, 1));
  BOOST_TEST(rt.use(a, p, 64) != error::success);
  BOOST_REQUIRE(rt.graph_launch(g, a) == error::success);
  BOOST_REQUIRE(rt.take_violations().size() == 1u);
  BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  BOOST_REQUIRE(rt.use(a, p, 64) == error::success);
  BOOST_REQUIRE(rt.free(p) == error::success);
  REQUIRE_CLEAN(rt);
}

BOOST_AUTO_TEST_CASE(devices_per_thread) {
  model::runtime rt(2);
  BOOST_REQUIRE(rt.set_device(1) == error::success);
  const stream_t s1 = make_stream(rt);
  int other = -1;
  std::thread([&] { (void)rt.get_device(&other); }).join();
  BOOST_TEST(other == 0);
  BOOST_REQUIRE(rt.set_device(0) == error::success);
  model::event_t e{};
  BOOST_REQUIRE(rt.event_create(&e) == error::success);
  BOOST_TEST(static_cast<int>(rt.event_record(e, s1)) == 400);  // event and stream on different devices
  (void)rt.take_violations();
  // the traits create an event on the stream's device
  alloy::stream_traits<stream_t>::event_type te{};
  BOOST_TEST(alloy::stream_traits<stream_t>::record(te, s1));
  BOOST_TEST(rt.device_of(te) == 1);
  BOOST_TEST(static_cast<int>(rt.set_device(2)) == 101);
  (void)rt.take_violations();
}

BOOST_AUTO_TEST_CASE(async_upstream_in_capture) {
  model::runtime rt;
  const stream_t s = make_stream(rt);
  model::async_upstream up{rt, s};
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  const block b = up.allocate(4096, 256);  // a graph node: legal in every mode
  BOOST_REQUIRE(b);
  BOOST_REQUIRE(rt.use(s, b.ptr, b.size) == error::success);
  up.deallocate(b);
  void* p = nullptr;
  BOOST_TEST(static_cast<int>(rt.malloc(&p, 4096)) == 900);  // cudaMalloc is not
  BOOST_TEST(rt.take_violations().size() == 1u);
  model::graph_t g{};
  BOOST_TEST(static_cast<int>(rt.end_capture(s, &g)) == 901);
  REQUIRE_CLEAN(rt);
}

BOOST_AUTO_TEST_CASE(model_vmm_backend) {
  model::runtime rt;
  model::vmm v{rt, 8_MiB};
  static_assert(alloy::virtual_memory<model::vmm>);
  const alloy::address_range r = v.reserve(4_MiB);
  BOOST_REQUIRE(r);
  const alloy::physical_memory m = v.create(2_MiB);
  BOOST_REQUIRE(m);
  BOOST_REQUIRE(v.map(r.ptr, m));
  const stream_t s = make_stream(rt);
  BOOST_REQUIRE(rt.use(s, r.ptr, 2_MiB) == error::success);
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  v.unmap(r.ptr, 2_MiB);  // forbidden while capturing (global): refused, capture invalidated
  BOOST_TEST(rt.take_violations().size() == 1u);
  model::graph_t g{};
  BOOST_TEST(static_cast<int>(rt.end_capture(s, &g)) == 901);
  v.unmap(r.ptr, 2_MiB);
  v.release(m);
  v.unreserve(r);
  BOOST_TEST(v.physical_bytes() == 0u);
  REQUIRE_CLEAN(rt);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- what stream_ordered must never do under capture ------------------------------------------------

BOOST_AUTO_TEST_SUITE(forbidden_calls)

// A pending free on another stream: outside capture the allocating stream queries its event; in a
// capture it must not (cudaErrorCapturedEvent / unsafe call), and waits as an external event.
BOOST_AUTO_TEST_CASE(no_event_query_in_capture) {
  model::runtime rt;
  const stream_t a = make_stream(rt), b = make_stream(rt);
  ordered alloc{make_arena(rt, 1_MiB)};
  const block first = alloc.allocate(4096, 256, a);
  (void)alloc.allocate(256, 256, b);  // two streams: tracking
  BOOST_REQUIRE(rt.use(a, first.ptr, first.size) == error::success);
  alloc.deallocate(first, a);  // pending on a, a's work not run
  const std::size_t queries = rt.event_queries();
  BOOST_REQUIRE(rt.begin_capture(b, capture_mode::global) == error::success);
  const block again = alloc.allocate(4096, 256, b);
  BOOST_TEST(again.ptr == first.ptr);  // best fit takes a's free block
  BOOST_TEST(rt.event_queries() == queries);
  BOOST_TEST(rt.external_waits() >= 1u);
  REQUIRE_CLEAN(rt);
  alloc.deallocate(again, b);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(b, &g) == error::success);
  REQUIRE_CLEAN(rt);
}

// The first call on a second stream synchronizes the first one outside capture; in a capture it
// must not (cudaStreamSynchronize under global capture).
BOOST_AUTO_TEST_CASE(no_synchronization_in_capture) {
  model::runtime rt;
  const stream_t a = make_stream(rt), b = make_stream(rt);
  ordered alloc{make_arena(rt, 1_MiB)};
  const block x = alloc.allocate(4096, 256, a);
  BOOST_REQUIRE(rt.use(a, x.ptr, x.size) == error::success);
  alloc.deallocate(x, a);
  const std::size_t syncs = rt.synchronizations();
  BOOST_REQUIRE(rt.begin_capture(b, capture_mode::global) == error::success);
  const block y = alloc.allocate(4096, 256, b);
  BOOST_REQUIRE(y);
  BOOST_TEST(rt.synchronizations() == syncs);
  BOOST_TEST(rt.external_waits() >= 1u);  // ordered after a's work by the graph, not the host
  REQUIRE_CLEAN(rt);
  alloc.deallocate(y, b);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(b, &g) == error::success);
  REQUIRE_CLEAN(rt);
}

// An empty cache: cudaMalloc is forbidden in the global and thread-local modes (the request
// fails cleanly), allowed in the relaxed one.
BOOST_AUTO_TEST_CASE(no_upstream_call_the_mode_forbids) {
  for (const capture_mode mode : {capture_mode::global, capture_mode::thread_local_, capture_mode::relaxed}) {
    model::runtime rt;
    const stream_t s = make_stream(rt);
    ordered alloc{make_arena(rt)};
    BOOST_REQUIRE(rt.begin_capture(s, mode) == error::success);
    const block b = alloc.allocate(4096, 256, s);
    BOOST_TEST(static_cast<bool>(b) == (mode == capture_mode::relaxed));
    BOOST_TEST(alloc.order_counters().capture_refusals == (mode == capture_mode::relaxed ? 0u : 1u));
    REQUIRE_CLEAN(rt);
    if (b) alloc.deallocate(b, s);
    model::graph_t g{};
    BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
    if (g) BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
    // served from the cache once it is warm
    warm(alloc, s, 64_KiB);
    BOOST_REQUIRE(rt.begin_capture(s, mode) == error::success);
    const block c = alloc.allocate(4096, 256, s);
    BOOST_TEST(static_cast<bool>(c));
    alloc.deallocate(c, s);
    BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
    BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
    REQUIRE_CLEAN(rt);
  }
}

// virtual_allocator under a global capture: served from its pool's slots and the arena's mapped
// granules (`allocate_cached`), with no create, map, unmap or reserve; a request that would map
// fails cleanly (counted as a capture refusal, not as an out-of-memory), and is served once the
// capture ended. The same through a stats<> decorator, whose counts stay exact.
BOOST_AUTO_TEST_CASE(virtual_allocator_serves_a_capture_from_mapped_granules) {
  using vheap = alloy::virtual_allocator<model::vmm>;
  using vordered = alloy::stream_ordered<alloy::stats<vheap>, stream_t>;
  static_assert(alloy::cache_serving_allocator<alloy::stats<vheap>>);
  model::runtime rt;
  const stream_t s = make_stream(rt);
  vordered alloc{alloy::stats<vheap>{vheap{model::vmm{rt, 256_MiB}}}};
  {  // warm: a large block (arena granules) and small ones (pool slabs), freed again
    const block big = alloc.allocate(6_MiB, 256, s), small = alloc.allocate(1000, 256, s);
    BOOST_REQUIRE((big && small));
    alloc.deallocate(big, s);
    alloc.deallocate(small, s);
  }
  auto& heap = alloc.inner();
  const std::size_t mapped = heap.inner().mapped_bytes();
  const auto counters = heap.inner().counters();
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  const block big = alloc.allocate(5_MiB, 256, s);
  const block small = alloc.allocate(800, 256, s);
  BOOST_TEST(static_cast<bool>(big));
  BOOST_TEST(static_cast<bool>(small));
  BOOST_TEST(!alloc.allocate(64_MiB, 256, s));  // would map: refused
  BOOST_TEST(alloc.order_counters().capture_refusals == 1u);
  REQUIRE_CLEAN(rt);
  BOOST_TEST(heap.inner().mapped_bytes() == mapped);
  BOOST_TEST(heap.inner().counters().num_maps == counters.num_maps);
  BOOST_TEST(heap.inner().counters().num_ooms == counters.num_ooms);
  BOOST_TEST(heap.statistics().num_ooms == 0u);
  BOOST_TEST(heap.bytes_in_use() == 5_MiB + 800);
  BOOST_REQUIRE(rt.use(s, big.ptr, big.size) == error::success);
  alloc.deallocate(small, s);
  alloc.deallocate(big, s);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
  BOOST_REQUIRE(rt.graph_launch(g, s) == error::success);
  rt.run_all();
  BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  const block after = alloc.allocate(64_MiB, 256, s);  // the capture ended: it maps
  BOOST_TEST(static_cast<bool>(after));
  alloc.deallocate(after, s);
  BOOST_TEST(heap.bytes_in_use() == 0u);
  REQUIRE_CLEAN(rt);
}

// `allocate_cached` of every policy that has it, and of compositions and decorators that pass it
// on, under a global capture (where the model fails any upstream call): a warm cache serves the
// request; a request for memory given back by `release()` (for a virtual arena: addresses it
// still knows, unmapped) gets an empty block, with no upstream call and no failure counted; once
// the capture ended, `allocate` takes it again.
template <class A, class Make>
void check_allocate_cached(const char* name, Make make, std::size_t warm_bytes, std::size_t too_large) {
  BOOST_TEST_CONTEXT(name) {
    model::runtime rt;
    const stream_t s = make_stream(rt);
    A a = make(rt);
    static_assert(alloy::cache_serving_allocator<A>);
    // `big` held once, then given back (for a virtual arena: addresses below `w`'s, unmapped)
    const block big = a.allocate(too_large, 256);
    const block w = a.allocate(warm_bytes, 256);
    BOOST_REQUIRE((big && w));
    a.deallocate(big);
    a.release();
    a.deallocate(w);  // kept: the cache
    const auto before = a.counters();
    BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
    const block served = a.allocate_cached(warm_bytes, 256);
    BOOST_TEST(served.ptr == w.ptr);
    BOOST_TEST(!a.allocate_cached(too_large, 256));
    REQUIRE_CLEAN(rt);  // no cudaMalloc, cuMemCreate, cuMemMap, cuMemUnmap or reserve
    BOOST_TEST(a.counters().num_ooms == before.num_ooms);
    BOOST_TEST(a.counters().num_device_alloc == before.num_device_alloc);
    model::graph_t g{};
    BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
    BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
    const block grown = a.allocate(too_large, 256);
    BOOST_TEST(static_cast<bool>(grown));
    a.deallocate(grown);
    a.deallocate(served);
    REQUIRE_CLEAN(rt);
  }
}

BOOST_AUTO_TEST_CASE(allocate_cached_makes_no_upstream_call) {
  using pool = alloy::size_class_pool<model::malloc_upstream>;
  using varena = alloy::virtual_arena<model::vmm>;
  using vheap = alloy::virtual_allocator<model::vmm>;
  using dheap = alloy::default_allocator<model::malloc_upstream>;
  check_allocate_cached<arena>("best_fit_arena", [](model::runtime& rt) { return make_arena(rt); }, 512_KiB, 8_MiB);
  check_allocate_cached<pool>(
      "size_class_pool", [](model::runtime& rt) { return pool{model::malloc_upstream{rt}}; }, 4096, 64_KiB);
  check_allocate_cached<varena>(
      "virtual_arena", [](model::runtime& rt) { return varena{model::vmm{rt, 256_MiB}}; }, 3_MiB, 64_MiB);
  check_allocate_cached<vheap>(
      "virtual_allocator (arena)", [](model::runtime& rt) { return vheap{model::vmm{rt, 256_MiB}}; }, 3_MiB, 64_MiB);
  check_allocate_cached<vheap>(
      "virtual_allocator (pool)", [](model::runtime& rt) { return vheap{model::vmm{rt, 256_MiB}}; }, 1000, 8_MiB);
  check_allocate_cached<alloy::stats<dheap>>(
      "stats<default_allocator>",
      [](model::runtime& rt) { return alloy::stats<dheap>{dheap{model::malloc_upstream{rt}}}; }, 1000, 64_MiB);
}

// release() under capture gives nothing back (cudaFree is forbidden, and the graph uses it).
BOOST_AUTO_TEST_CASE(no_memory_given_back_in_capture) {
  model::runtime rt;
  const stream_t s = make_stream(rt), t = make_stream(rt);
  ordered alloc{make_arena(rt)};
  const block one = alloc.allocate(1_MiB, 256, s), two = alloc.allocate(2_MiB, 256, s);  // two segments
  BOOST_REQUIRE((one && two));
  alloc.deallocate(one, s);
  alloc.deallocate(two, s);                         // both wholly free: a release outside capture would return them
  alloc.deallocate(alloc.allocate(64, 256, t), t);  // two streams: tracking
  const std::size_t held = rt.bytes_in_use();
  BOOST_REQUIRE(held > 0u);
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  const block b = alloc.allocate(1024, 256, s);
  BOOST_REQUIRE(b);
  alloc.release();
  BOOST_TEST(rt.bytes_in_use() == held);
  REQUIRE_CLEAN(rt);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
  BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  alloc.deallocate(b, s);
  alloc.release();  // the capture ended: now it goes
  BOOST_TEST(rt.bytes_in_use() == 0u);
  REQUIRE_CLEAN(rt);
}

// An arena that gives granules back on free: a free on another stream while a global capture runs,
// and the pool of a relaxed capture that ended, reach it only after that capture (an unmap during
// it would invalidate the graph).
BOOST_AUTO_TEST_CASE(no_give_back_through_a_free_in_capture) {
  using varena = alloy::virtual_arena<model::vmm>;
  model::runtime rt;
  const stream_t s1 = make_stream(rt), s2 = make_stream(rt);
  alloy::stream_ordered<varena, stream_t> alloc{
      varena{model::vmm{rt, 64_MiB}, {.release_threshold = 0, .keep_up_to_peak = false}}};
  const block w = alloc.allocate(4_MiB, 256, s1);
  BOOST_REQUIRE(w);
  alloc.deallocate(alloc.allocate(4096, 256, s1), s1);
  BOOST_REQUIRE(rt.begin_capture(s1, capture_mode::relaxed) == error::success);
  const block x = alloc.allocate(3_MiB, 256, s1);  // relaxed: may map
  BOOST_REQUIRE(x);
  BOOST_REQUIRE(rt.use(s1, x.ptr, x.size) == error::success);
  alloc.deallocate(x, s1);  // kept in the capture's pool
  model::graph_t g1{};
  BOOST_REQUIRE(rt.end_capture(s1, &g1) == error::success);
  BOOST_REQUIRE(rt.graph_destroy(g1) == error::success);
  const std::size_t mapped = alloc.inner().mapped_bytes();

  BOOST_REQUIRE(rt.begin_capture(s2, capture_mode::global) == error::success);
  const block y = alloc.allocate(4096, 256, s2);  // settles the relaxed capture: its pool goes back
  alloc.deallocate(w, s1);                        // outside the capture, on another stream
  BOOST_TEST(alloc.pool_figures().deferred >= 2u, "the pool's block and w wait for the capture's end");
  BOOST_TEST(alloc.inner().mapped_bytes() == mapped, "nothing unmapped during the global capture");
  REQUIRE_CLEAN(rt);
  if (y) {
    BOOST_REQUIRE(rt.use(s2, y.ptr, y.size) == error::success);
    alloc.deallocate(y, s2);
  }
  model::graph_t g2{};
  BOOST_REQUIRE(rt.end_capture(s2, &g2) == error::success);
  BOOST_REQUIRE(rt.graph_destroy(g2) == error::success);
  BOOST_REQUIRE(rt.stream_synchronize(s1) == error::success);
  alloc.deallocate(alloc.allocate(256, 256, s1), s1);  // the first call after the end settles it
  BOOST_TEST(alloc.pool_figures().deferred == 0u);
  BOOST_TEST(alloc.inner().bytes_in_use() == 0u);
  BOOST_TEST(alloc.inner().mapped_bytes() < mapped, "given back once the capture ended");
  REQUIRE_CLEAN(rt);
}

// The stream-less calls while a capture is known: no host wait either.
BOOST_AUTO_TEST_CASE(no_host_wait_from_streamless_calls_in_capture) {
  model::runtime rt;
  const stream_t a = make_stream(rt), b = make_stream(rt);
  ordered alloc{make_arena(rt, 1_MiB)};
  const block x = alloc.allocate(4096, 256, a);
  (void)alloc.allocate(256, 256, b);
  BOOST_REQUIRE(rt.use(a, x.ptr, x.size) == error::success);
  alloc.deallocate(x, a);  // pending, not complete
  BOOST_REQUIRE(rt.begin_capture(b, capture_mode::global) == error::success);
  const block y = alloc.allocate(64, 256, b);  // the capture is known now
  const std::size_t syncs = rt.synchronizations(), queries = rt.event_queries();
  const block h = alloc.allocate(4096, 256);  // would need a host wait for a's free: refused
  BOOST_TEST(h.ptr != x.ptr);
  if (h) alloc.deallocate(h);
  BOOST_TEST(rt.synchronizations() == syncs);
  BOOST_TEST(rt.event_queries() == queries);
  REQUIRE_CLEAN(rt);
  alloc.deallocate(y, b);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(b, &g) == error::success);
  REQUIRE_CLEAN(rt);
}

// Freeing a block from before the capture: deferred to the capture's end, not reused inside it.
BOOST_AUTO_TEST_CASE(frees_of_earlier_blocks_deferred) {
  model::runtime rt;
  const stream_t s = make_stream(rt);
  ordered alloc{make_arena(rt, 1_MiB)};
  const block before = alloc.allocate(4096, 256, s);
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  BOOST_REQUIRE(rt.use(s, before.ptr, before.size) == error::success);
  alloc.deallocate(before, s);
  BOOST_TEST(alloc.pool_figures().deferred == 1u);
  const block inside = alloc.allocate(4096, 256, s);
  BOOST_REQUIRE(inside);
  BOOST_TEST(inside.ptr != before.ptr);
  alloc.deallocate(inside, s);
  const block again = alloc.allocate(4096, 256, s);  // freed inside: reused inside
  BOOST_TEST(again.ptr == inside.ptr);
  alloc.deallocate(again, s);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
  BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  const block after = alloc.allocate(4096, 256, s);  // the first call after the end settles it
  BOOST_TEST(alloc.pool_figures().deferred == 0u);
  BOOST_TEST(alloc.order_counters().deferred_frees == 1u);
  BOOST_TEST((after.ptr == before.ptr || after.ptr == inside.ptr));
  alloc.deallocate(after, s);
  REQUIRE_CLEAN(rt);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- private pools ------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(graph_pools)

BOOST_AUTO_TEST_CASE(isolated_shared_released) {
  model::runtime rt;
  const stream_t s = make_stream(rt), other = make_stream(rt);
  alloy::synchronized<alloy::stats<ordered>> alloc{alloy::stats<ordered>{ordered{make_arena(rt, 1_MiB)}}};
  graph_pool pool;
  BOOST_TEST(!alloc.begin_allocate_to_pool(pool, s));  // not capturing
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s));
  const block a = alloc.allocate(8192, 256, s);
  const block b = alloc.allocate(4096, 256, s);
  BOOST_REQUIRE((a && b));
  BOOST_REQUIRE(rt.use(s, a.ptr, a.size) == error::success);
  BOOST_REQUIRE(rt.use(s, b.ptr, b.size) == error::success);
  alloc.deallocate(a, s);  // freed inside: stays in the pool
  model::graph_t g1{};
  BOOST_REQUIRE(rt.end_capture(s, &g1) == error::success);
  alloc.end_allocate_to_pool(pool);
  const alloy::graph_pool_figures f = alloc.pool_figures();
  BOOST_TEST(f.pools == 1u);
  BOOST_TEST(f.live_bytes == 4096u);
  BOOST_TEST(f.free_bytes == 8192u);
  // work outside the graph never gets the pool's addresses (the model checks every use)
  std::vector<block> outside;
  for (int i = 0; i < 16; ++i) {
    const block o = alloc.allocate(4096, 256, other);
    BOOST_REQUIRE(o);
    BOOST_TEST(!rt.graph_uses(o.ptr, o.size));
    BOOST_REQUIRE(rt.use(other, o.ptr, o.size) == error::success);
    outside.push_back(o);
  }
  BOOST_REQUIRE(rt.graph_launch(g1, s) == error::success);
  // a second graph shares the pool: it reuses the first one's freed block
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s));
  const block c = alloc.allocate(8192, 256, s);
  BOOST_TEST(c.ptr == a.ptr);
  alloc.deallocate(c, s);
  model::graph_t g2{};
  BOOST_REQUIRE(rt.end_capture(s, &g2) == error::success);
  alloc.end_allocate_to_pool(pool);
  alloc.deallocate(b, s);  // b freed outside the graph: still the pool's
  BOOST_TEST(alloc.pool_figures().live_bytes == 0u);
  for (const block o : outside) alloc.deallocate(o, other);
  const block d = alloc.allocate(8192, 256, other);
  BOOST_TEST(!rt.graph_uses(d.ptr, d.size));
  alloc.deallocate(d, other);
  REQUIRE_CLEAN(rt);
  // after the last launch: destroy the graphs, release the pool; its memory is everyone's
  rt.run_all();
  BOOST_REQUIRE(rt.graph_destroy(g1) == error::success);
  BOOST_REQUIRE(rt.graph_destroy(g2) == error::success);
  alloc.release_pool(pool);
  BOOST_TEST(alloc.pool_figures().pools == 0u);
  std::set<void*> seen;
  std::vector<block> all;
  for (int i = 0; i < 64; ++i) {
    const block o = alloc.allocate(8192, 256, s);
    if (!o) break;
    seen.insert(o.ptr);
    all.push_back(o);
  }
  BOOST_TEST(seen.count(a.ptr) == 1u);
  for (const block o : all) alloc.deallocate(o, s);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  REQUIRE_CLEAN(rt);
}

// Through sharded: every shard routes the capture; the pool's addresses stay out of other work.
BOOST_AUTO_TEST_CASE(through_sharded) {
  model::runtime rt;
  const stream_t s = make_stream(rt), other = make_stream(rt);
  alloy::sharded<ordered> alloc{[&](std::size_t) { return ordered{make_arena(rt, 1_MiB)}; }, {.shards = 2}};
  graph_pool pool;
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s));
  std::vector<block> captured;
  for (int i = 0; i < 8; ++i) {
    const block b = alloc.allocate(std::size_t{512} << i, 256, s);
    BOOST_REQUIRE(b);
    BOOST_REQUIRE(rt.use(s, b.ptr, b.size) == error::success);
    captured.push_back(b);
  }
  for (const block b : captured) alloc.deallocate(b, s);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
  alloc.end_allocate_to_pool(pool);
  BOOST_TEST(alloc.pool_figures().free_bytes == std::size_t{512} * 255);
  for (int i = 0; i < 200; ++i) {
    const block o = alloc.allocate(std::size_t{512} << (i % 8), 256, other);
    BOOST_REQUIRE(o);
    BOOST_REQUIRE(rt.use(other, o.ptr, o.size) == error::success);  // the model: never the graph's memory
    alloc.deallocate(o, other);
  }
  REQUIRE_CLEAN(rt);
  BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  alloc.release_pool(pool);
  BOOST_TEST(alloc.pool_figures().pools == 0u);
  REQUIRE_CLEAN(rt);
}

// memory_stats and memory_summary report the private pools apart: bytes live in them, bytes kept
// for their graphs, and deferred frees, through synchronized<stats<>> (whose lock the figures take).
BOOST_AUTO_TEST_CASE(statistics_report_graph_pools_apart) {
  model::runtime rt;
  const stream_t s = make_stream(rt);
  alloy::synchronized<alloy::stats<ordered>> alloc{alloy::stats<ordered>{ordered{make_arena(rt, 1_MiB)}}};
  const block before = alloc.allocate(1024, 256, s);  // freed inside the capture: deferred
  auto stats = alloy::memory_stats(alloc);
  BOOST_TEST(stats.at("graph_pools.count") == 0);
  BOOST_TEST(alloy::memory_summary(alloc).find("Graph pools") == std::string::npos);
  graph_pool pool;
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s));
  const block kept = alloc.allocate(4096, 256, s);
  const block scratch = alloc.allocate(8192, 256, s);
  alloc.deallocate(scratch, s);
  alloc.deallocate(before, s);
  stats = alloy::memory_stats(alloc);
  BOOST_TEST(stats.at("graph_pools.count") == 1);
  BOOST_TEST(stats.at("graph_pools.allocated_bytes") == 4096);
  BOOST_TEST(stats.at("graph_pools.reserved_bytes") == 4096 + 8192);
  BOOST_TEST(stats.at("graph_pools.deferred_frees") == 1);
  // in the totals too (stats<> counts a free when it is asked for, deferred or kept in a pool)
  BOOST_TEST(stats.at("allocated_bytes.all.current") == 4096);
  BOOST_TEST(stats.at("reserved_bytes.all.current") >= 4096 + 8192 + 1024);
  const std::string summary = alloy::memory_summary(alloc);
  BOOST_TEST(summary.find("Graph pools: 1") != std::string::npos, summary);
  BOOST_TEST(summary.find("Graph memory: 12.00 KiB") != std::string::npos, summary);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
  alloc.end_allocate_to_pool(pool);
  BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  alloc.deallocate(kept, s);
  alloc.release_pool(pool);
  stats = alloy::memory_stats(alloc);
  BOOST_TEST(stats.at("graph_pools.count") == 0);
  BOOST_TEST(stats.at("graph_pools.reserved_bytes") == 0);
  BOOST_TEST(stats.at("graph_pools.deferred_frees") == 0);
  BOOST_TEST(stats.at("allocated_bytes.all.current") == 0);
  REQUIRE_CLEAN(rt);
}

BOOST_AUTO_TEST_CASE(bad_frees_in_a_capture_and_of_pool_blocks_are_refused) {
  // Such frees do not reach the arena at once (deferred, or kept in a pool): they are checked
  // when made, so that the decorators above do not count a free the arena would refuse later.
  model::runtime rt;
  const stream_t s = make_stream(rt);
  alloy::stats<ordered> alloc{ordered{make_arena(rt, 1_MiB)}};
  const block before = alloc.allocate(4096, 256, s);
  BOOST_REQUIRE(before);
  std::memset(before.ptr, 0x5A, before.size);
  const auto intact = [&] {
    const auto* p = static_cast<const unsigned char*>(before.ptr);
    return std::all_of(p, p + before.size, [](unsigned char c) { return c == 0x5A; });
  };
  graph_pool pool;
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s));
  const auto in_use = [&] { return alloy::statistics_of(alloc).bytes_in_use; };
  int on_stack = 0;
  BOOST_TEST(!alloc.try_deallocate(block{&on_stack, sizeof on_stack}, s));
  BOOST_TEST(in_use() == 4096u);
  BOOST_TEST(intact());
  BOOST_TEST(alloc.try_deallocate(before, s));  // deferred
  BOOST_TEST(!alloc.try_deallocate(before, s));
  BOOST_TEST(alloc.inner().pool_figures().deferred == 1u);

  const block big = alloc.allocate(8192, 256, s);
  BOOST_REQUIRE(big);
  BOOST_TEST(!alloc.try_deallocate(block{big.ptr, 4096}, s));
  BOOST_TEST(alloc.try_deallocate(big, s));
  BOOST_TEST(!alloc.try_deallocate(big, s));
  const block reused = alloc.allocate(4096, 256, s);  // the pool's 8 KiB block, for 4 KiB
  BOOST_TEST(reused.ptr == big.ptr);
  BOOST_TEST(!alloc.try_deallocate(block{reused.ptr, 8192}, s), "the caller holds 4 KiB of it");
  BOOST_TEST(in_use() == 4096u);
  const alloy::misuse_counts m = alloc.inner().misuses();
  BOOST_TEST(m.foreign_pointers == 1u);
  BOOST_TEST(m.wrong_sizes == 2u);
  BOOST_TEST(m.double_frees == 2u);
  BOOST_TEST(alloc.inner().inner().misuses().total() == 0u, "none reached the arena");

  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
  alloc.end_allocate_to_pool(pool);
  BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  alloc.release_pool(pool);  // `reused` is an ordinary block now, still held at 4 KiB
  BOOST_TEST(!alloc.try_deallocate(block{reused.ptr, 8192}, s));
  BOOST_TEST(alloc.try_deallocate(reused, s));
  const block after = alloc.allocate(4096, 256, s);  // settles the capture: the deferred free runs
  BOOST_TEST(alloc.inner().pool_figures().deferred == 0u);
  BOOST_TEST(alloc.try_deallocate(after, s));
  BOOST_TEST(in_use() == 0u);
  BOOST_TEST(alloc.inner().inner().bytes_in_use() == 0u);
  BOOST_TEST(alloc.inner().inner().misuses().total() == 0u);
  REQUIRE_CLEAN(rt);
}

// An interior or wrong-size free of an earlier block, and `record_use` of one, under a capture:
// `Inner` says at once what it would refuse (`free_misuse`), so nothing waits for the capture's
// end and nothing is counted above.
template <class Inner>
void earlier_blocks_checked_in_a_capture(Inner inner, model::runtime& rt) {
  const stream_t s = make_stream(rt);
  const stream_t other = make_stream(rt);
  alloy::stats<alloy::stream_ordered<Inner, stream_t>> alloc{alloy::stream_ordered<Inner, stream_t>{std::move(inner)}};
  const block small = alloc.allocate(4096, 256, s);
  const block large = alloc.allocate(1_MiB, 256, s);
  BOOST_REQUIRE(small);
  BOOST_REQUIRE(large);
  const auto in_use = [&] { return alloy::statistics_of(alloc).bytes_in_use; };
  const std::size_t held = in_use();
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  for (const block b : {small, large}) {
    BOOST_TEST_CONTEXT(b.size << " bytes") {
      const block interior{static_cast<std::byte*>(b.ptr) + 256, 256};
      const block wrong_size{b.ptr, b.size + 4096};
      const alloy::misuse_counts m0 = alloc.inner().misuses();
      BOOST_TEST(!alloc.try_deallocate(interior, s));  // on the capturing stream: deferred if good
      BOOST_TEST(!alloc.try_deallocate(wrong_size, s));
      BOOST_TEST(!alloc.try_deallocate(interior));  // elsewhere: held back while a strict capture runs
      BOOST_TEST(!alloc.try_deallocate(wrong_size, other));
      alloy::record_use(alloc, interior, other);
      alloy::record_use(alloc, wrong_size, other);
      alloy::record_use(alloc, b, other);  // the block itself: kept
      const alloy::misuse_counts m = alloc.inner().misuses();
      BOOST_TEST(m.foreign_pointers - m0.foreign_pointers == 3u);
      BOOST_TEST(m.wrong_sizes - m0.wrong_sizes == 3u);
      BOOST_TEST(in_use() == held);
      BOOST_TEST(alloc.pool_figures().deferred == 0u);
    }
  }
  BOOST_TEST(alloc.try_deallocate(small, s));  // deferred
  BOOST_TEST(alloc.pool_figures().deferred == 1u);
  alloy::record_use(alloc, small, other);  // freed, the free waiting for the capture's end: refused
  BOOST_TEST(alloc.inner().misuses().double_frees == 1u);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
  BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  BOOST_TEST(alloc.try_deallocate(large, s));  // settles the capture: the deferred free runs
  BOOST_TEST(alloc.pool_figures().deferred == 0u);
  BOOST_TEST(in_use() == 0u);
  BOOST_TEST(alloc.inner().inner().bytes_in_use() == 0u);
  alloy::record_use(alloc, small, other);  // freed: refused
  BOOST_TEST(alloc.inner().misuses().double_frees == 2u);
  alloc.release();
  REQUIRE_CLEAN(rt);
}

BOOST_AUTO_TEST_CASE(interior_and_wrong_size_frees_of_earlier_blocks_are_refused_in_a_capture) {
  {
    model::runtime rt;
    earlier_blocks_checked_in_a_capture(make_arena(rt, 4_MiB), rt);
  }
  {
    model::runtime rt;
    earlier_blocks_checked_in_a_capture(alloy::virtual_allocator<model::vmm>{model::vmm{rt, 256_MiB}}, rt);
  }
}

BOOST_AUTO_TEST_CASE(aborted_capture_unwinds_its_pool) {
  model::runtime rt;
  const stream_t s = make_stream(rt);
  ordered alloc{make_arena(rt, 1_MiB)};
  graph_pool pool;
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::global) == error::success);
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s));
  const block kept = alloc.allocate(4096, 256, s);
  const block freed = alloc.allocate(8192, 256, s);
  alloc.deallocate(freed, s);
  BOOST_TEST(static_cast<int>(rt.stream_query(s)) == 900);  // the user's mistake: the capture is lost
  BOOST_REQUIRE(rt.take_violations().size() == 1u);
  const block more = alloc.allocate(256, 256, s);  // alloy sees it invalidated
  alloc.deallocate(more, s);
  model::graph_t g{};
  BOOST_TEST(static_cast<int>(rt.end_capture(s, &g)) == 901);
  alloc.end_allocate_to_pool(pool);
  const block next = alloc.allocate(8192, 256, s);  // settles: the pool is unwound
  BOOST_TEST(next.ptr == freed.ptr);
  BOOST_TEST(alloc.pool_figures().free_bytes == 0u);
  BOOST_TEST(alloc.pool_figures().live_bytes == 0u);  // `kept` is an ordinary block now
  alloc.deallocate(next, s);
  alloc.deallocate(kept, s);
  BOOST_TEST(alloc.inner().bytes_in_use() == 0u);
  REQUIRE_CLEAN(rt);
}

// A pool released while a capture routed to it still runs (too early: that capture's graph is one
// of the pool's) stays the pool it was until the capture has ended: in a relaxed capture, where
// blocks may reach the arena at once, other work still never gets its blocks, and the capture
// still allocates from it. A capture routed to it meanwhile cancels the release.
BOOST_AUTO_TEST_CASE(a_pool_released_while_its_capture_runs_waits_for_the_capture) {
  model::runtime rt;
  const stream_t s = make_stream(rt), s2 = make_stream(rt), other = make_stream(rt);
  ordered alloc{make_arena(rt, 1_MiB)};
  for (const stream_t x : {s, s2, other}) warm(alloc, x, 8192);  // every stream known before
  rt.run_all();
  graph_pool pool;
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::relaxed) == error::success);
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s));
  const block a = alloc.allocate(8192, 256, s);
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(rt.use(s, a.ptr, a.size) == error::success);
  alloc.deallocate(a, s);    // freed inside: the pool keeps it for the graph
  alloc.release_pool(pool);  // too early
  BOOST_TEST(alloc.pool_figures().pools == 1u);
  BOOST_TEST(alloc.pool_figures().free_bytes == 8192u);
  std::vector<block> outside;
  for (int i = 0; i < 32; ++i) {
    const block o = alloc.allocate(8192, 256, other);
    BOOST_REQUIRE(o);
    BOOST_TEST(o.ptr != a.ptr);
    BOOST_REQUIRE(rt.use(other, o.ptr, o.size) == error::success);
    outside.push_back(o);
  }
  const block again = alloc.allocate(8192, 256, s);  // still routed to the pool
  BOOST_TEST(again.ptr == a.ptr);
  alloc.deallocate(again, s);
  model::graph_t g{};
  BOOST_REQUIRE(rt.end_capture(s, &g) == error::success);
  BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  const block settles = alloc.allocate(256, 256, other);  // sees the capture ended: the pool goes
  BOOST_TEST(alloc.pool_figures().pools == 0u);
  BOOST_TEST(alloc.pool_figures().free_bytes == 0u);
  alloc.deallocate(settles, other);
  for (const block o : outside) alloc.deallocate(o, other);

  // Released while its capture runs, then routed to by a second capture: kept after both end.
  BOOST_REQUIRE(rt.begin_capture(s, capture_mode::relaxed) == error::success);
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s));
  const block b = alloc.allocate(4096, 256, s);
  BOOST_REQUIRE(b);
  alloc.deallocate(b, s);
  alloc.release_pool(pool);
  BOOST_REQUIRE(rt.begin_capture(s2, capture_mode::relaxed) == error::success);
  BOOST_REQUIRE(alloc.begin_allocate_to_pool(pool, s2));  // cancels the release
  model::graph_t g1{}, g2{};
  BOOST_REQUIRE(rt.end_capture(s, &g1) == error::success);
  BOOST_REQUIRE(rt.end_capture(s2, &g2) == error::success);
  alloc.end_allocate_to_pool(pool);
  const block settles2 = alloc.allocate(256, 256, other);
  BOOST_TEST(alloc.pool_figures().pools == 1u);
  BOOST_TEST(alloc.pool_figures().free_bytes == 4096u);
  alloc.deallocate(settles2, other);
  BOOST_REQUIRE(rt.graph_destroy(g1) == error::success);
  BOOST_REQUIRE(rt.graph_destroy(g2) == error::success);
  alloc.release_pool(pool);  // no capture runs: at once
  BOOST_TEST(alloc.pool_figures().pools == 0u);
  rt.run_all();
  alloc.release();
  BOOST_TEST(alloc.inner().bytes_in_use() == 0u);
  REQUIRE_CLEAN(rt);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- randomized sequences ------------------------------------------------------------------------

namespace {

/// The compositions the randomized run covers: a best-fit arena over `cudaMalloc` (requests of 16 B
/// to 128 KiB), and virtual_allocator over the model's virtual memory (16 B to 1 MiB, so that both
/// its pool and its arena serve).
struct over_arena {
  using inner = arena;
  static constexpr std::size_t largest_shift = 13;
  static inner make(model::runtime& rt) { return make_arena(rt); }
};
struct over_virtual_allocator {
  using inner = alloy::virtual_allocator<model::vmm>;
  static constexpr std::size_t largest_shift = 16;
  static inner make(model::runtime& rt) { return inner{model::vmm{rt, 256_MiB}}; }
};

/// Captures, allocations, frees, launches and pool releases at random on three streams; after
/// every step the model saw no illegal call, no work outside graphs touched a live graph's
/// memory, and no block handed out overlaps another live one or a live pool's memory.
template <class Over>
struct random_run {
  using ordered = alloy::stream_ordered<typename Over::inner, stream_t>;
  model::runtime rt;
  alloy::stats<ordered> alloc{ordered{Over::make(rt)}};
  std::vector<stream_t> streams;
  std::mt19937_64 rng;

  struct live_block {
    block b;
    stream_t s;
    bool in_pool = false;
    graph_pool* pool = nullptr;
  };
  std::vector<live_block> live;
  std::vector<std::unique_ptr<graph_pool>> pools;
  struct graph {
    model::graph_t g;
    graph_pool* pool;
    stream_t s;
  };
  std::vector<graph> graphs;
  struct capture {
    stream_t s;
    graph_pool* pool;
    std::set<void*> taken;  // pool addresses this capture took
  };
  std::optional<capture> running;
  /// Addresses each pool handed out, with how many captures took each (an aborted capture's
  /// share is unwound).
  std::map<graph_pool*, std::map<void*, int>> pool_addresses;
  /// What the run did (so a test that exercised nothing fails).
  std::size_t captured_allocations = 0, pooled_graphs = 0, aborts = 0, launches = 0, releases = 0, deferred = 0;
  std::size_t bad_calls = 0;

  explicit random_run(unsigned seed) : rng(seed) {
    for (int i = 0; i < 3; ++i) streams.push_back(make_stream(rt));
    warm_up();
  }
  void warm_up() {
    std::vector<block> w;
    for (int i = 0; i < 8; ++i) w.push_back(alloc.allocate(256_KiB, 256, streams[0]));
    for (const block b : w) alloc.deallocate(b, streams[0]);
  }
  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); }

  bool pool_has_graph(const graph_pool* p) const {
    return std::any_of(graphs.begin(), graphs.end(), [&](const graph& g) { return g.pool == p; }) ||
           (running && running->pool == p);
  }

  void check_block(const block b, const graph_pool* pool) {
    for (const live_block& l : live) {
      const auto lo = reinterpret_cast<std::uintptr_t>(l.b.ptr);
      const auto x = reinterpret_cast<std::uintptr_t>(b.ptr);
      if (x + b.size > lo && lo + l.b.size > x) BOOST_FAIL("a block overlaps a live block");
    }
    for (const auto& [p, addresses] : pool_addresses) {
      if (p == pool) continue;
      if (!pool_has_graph(p)) continue;
      if (addresses.count(b.ptr) != 0) BOOST_FAIL("an address of a live pool reached other work");
    }
  }

  /// While a capture runs, an interior or wrong-size free and `record_use` of the live block `l`:
  /// both refused at once (a free the capture would defer included), nothing counted.
  void try_bad_calls(const live_block& l) {
    const std::size_t in_use = alloc.bytes_in_use();
    const block bad = l.b.size >= 512 && pick(2) == 0 ? block{static_cast<std::byte*>(l.b.ptr) + 256, 256}
                                                      : block{l.b.ptr, l.b.size + 4096};
    BOOST_REQUIRE(!alloc.try_deallocate(bad, l.s));
    BOOST_REQUIRE(alloc.bytes_in_use() == in_use);
    const std::size_t refusals = alloc.inner().misuses().total();
    alloy::record_use(alloc, bad, l.s);
    BOOST_REQUIRE(alloc.inner().misuses().total() == refusals + 1);
    ++bad_calls;
  }

  void step() {
    const std::size_t what = pick(100);
    if (what < 35) {  // allocate (at most 512 blocks live, so that long runs stay linear)
      if (live.size() >= 512) return;
      const stream_t s = running && pick(3) != 0 ? running->s : streams[pick(streams.size())];
      const bool in_capture = running && s == running->s;
      const std::size_t bytes = std::size_t{1} << (4 + pick(Over::largest_shift + 1));
      const block b = alloc.allocate(bytes, 256, s);
      if (!b) return;
      check_block(b, in_capture ? running->pool : nullptr);
      BOOST_REQUIRE(rt.use(s, b.ptr, b.size) == error::success);
      live.push_back({b, s, in_capture && running->pool != nullptr, in_capture ? running->pool : nullptr});
      captured_allocations += in_capture;
      if (in_capture && running->pool != nullptr && running->taken.insert(b.ptr).second) {
        ++pool_addresses[running->pool][b.ptr];
      }
    } else if (what < 65) {  // free, on its stream (or the capture's, if its stream is capturing)
      if (live.empty()) return;
      const std::size_t i = pick(live.size());
      const live_block l = live[i];
      if (running && pick(256) == 0) try_bad_calls(l);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      alloc.deallocate(l.b, l.s);
    } else if (what < 72) {  // begin a capture
      if (running) return;
      const stream_t s = streams[pick(streams.size())];
      const capture_mode mode = static_cast<capture_mode>(pick(3));
      BOOST_REQUIRE(rt.begin_capture(s, mode) == error::success);
      graph_pool* pool = nullptr;
      if (pick(4) != 0) {
        if (pools.empty() || (pools.size() < 8 && pick(3) == 0)) pools.push_back(std::make_unique<graph_pool>());
        pool = pools[pick(pools.size())].get();
        BOOST_REQUIRE(alloc.begin_allocate_to_pool(*pool, s));
      }
      running = capture{s, pool, {}};
      if (pool == nullptr) {  // alloy learns of a capture at its first call on the capturing stream
        const block first = alloc.allocate(64, 256, s);
        if (first) alloc.deallocate(first, s);
      }
    } else if (what < 80) {  // end (or abort) the capture
      if (!running) return;
      const bool abort = pick(5) == 0;
      if (abort) {
        ++aborts;
        BOOST_REQUIRE(static_cast<int>(rt.stream_query(running->s)) == 900);
        BOOST_REQUIRE(rt.take_violations().size() == 1u);
        if (pick(2) == 0) {  // alloy sees the capture invalidated (and unwinds its pool share at the end)
          const block t = alloc.allocate(64, 256, running->s);
          if (t) alloc.deallocate(t, running->s);
        }
      }
      model::graph_t g{};
      const error e = rt.end_capture(running->s, &g);
      BOOST_REQUIRE_EQUAL(e, (abort ? error::stream_capture_invalidated : error::success));
      if (abort && running->pool != nullptr) {
        auto& addresses = pool_addresses[running->pool];
        for (void* p : running->taken) {
          if (--addresses[p] == 0) addresses.erase(p);
        }
      }
      if (running->pool != nullptr) alloc.end_allocate_to_pool(*running->pool);
      if (g) {
        if (running->pool != nullptr) {
          graphs.push_back({g, running->pool, running->s});
          ++pooled_graphs;
        } else {
          BOOST_REQUIRE(rt.graph_launch(g, running->s) == error::success);  // launched once, then gone
          rt.run(running->s);
          BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
        }
      }
      running.reset();
    } else if (what < 90) {  // launch a graph on its stream
      if (graphs.empty()) return;
      const graph& g = graphs[pick(graphs.size())];
      if (running && running->s == g.s) return;
      BOOST_REQUIRE(rt.graph_launch(g.g, g.s) == error::success);
      ++launches;
    } else if (what < 95) {  // the last launch of a pool's graphs: destroy them, release the pool
      if (pools.empty()) return;
      graph_pool* p = pools[pick(pools.size())].get();
      if (running && running->pool == p) return;
      rt.run_all();
      for (auto it = graphs.begin(); it != graphs.end();) {
        if (it->pool == p) {
          BOOST_REQUIRE(rt.graph_destroy(it->g) == error::success);
          it = graphs.erase(it);
        } else {
          ++it;
        }
      }
      alloc.release_pool(*p);
      ++releases;
      pool_addresses.erase(p);
      for (live_block& l : live) {
        if (l.pool == p) l.pool = nullptr;
      }
    } else {  // the device runs a stream's work
      rt.run(streams[pick(streams.size())]);
    }
  }

  void finish() {
    deferred = alloc.inner().order_counters().deferred_frees;
    if (running) {
      model::graph_t g{};
      BOOST_REQUIRE(rt.end_capture(running->s, &g) == error::success);
      if (running->pool != nullptr) alloc.end_allocate_to_pool(*running->pool);
      if (g) BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
      running.reset();
    }
    rt.run_all();
    for (const graph& g : graphs) BOOST_REQUIRE(rt.graph_destroy(g.g) == error::success);
    graphs.clear();
    for (const live_block& l : live) alloc.deallocate(l.b, l.s);
    live.clear();
    for (const auto& p : pools) alloc.release_pool(*p);
    alloc.release();
    REQUIRE_CLEAN(rt);
    BOOST_TEST(alloc.bytes_in_use() == 0u);
    BOOST_TEST(alloc.inner().inner().bytes_in_use() == 0u);
    BOOST_TEST(alloc.pool_figures().pools == 0u);
    BOOST_TEST(rt.bytes_in_use() == 0u);
  }
};

}  // namespace

/// Steps per seed: 100,000 (10,000 under ThreadSanitizer, which these one-thread runs do not
/// need), or `ALLOY_CAPTURE_STEPS` (the million-step runs CHANGELOG.md reports).
int capture_steps() {
  const char* v = std::getenv("ALLOY_CAPTURE_STEPS");
  if (const int steps = v != nullptr ? std::atoi(v) : 0; steps > 0) return steps;
  return alloy::testing::under_tsan ? 10'000 : 100'000;
}

template <class Over>
void randomized_captures() {
  const int steps = capture_steps();
  std::size_t bad_calls = 0;
  for (unsigned seed = 1; seed <= 12; ++seed) {
    BOOST_TEST_CONTEXT("seed " << seed) {
      random_run<Over> run(seed);
      for (int i = 0; i < steps; ++i) {
        run.step();
        if (!run.rt.clean()) BOOST_FAIL(run.rt.first_violation());  // a plain check: millions of steps
      }
      run.finish();
      BOOST_TEST(run.captured_allocations > 100u);
      BOOST_TEST(run.pooled_graphs > 10u);
      BOOST_TEST(run.aborts > 0u);
      BOOST_TEST(run.launches > 10u);
      BOOST_TEST(run.releases > 0u);
      BOOST_TEST(run.deferred > 0u);
      bad_calls += run.bad_calls;
      BOOST_TEST_MESSAGE("seed " << seed << ": " << run.captured_allocations << " allocations in captures, "
                                 << run.pooled_graphs << " pooled graphs, " << run.aborts << " aborted, "
                                 << run.launches << " launches, " << run.releases << " pool releases, " << run.deferred
                                 << " deferred frees, " << run.bad_calls << " bad frees in captures");
    }
  }
  BOOST_TEST(bad_calls > 0u);
}

BOOST_AUTO_TEST_CASE(randomized_captures_over_an_arena) { randomized_captures<over_arena>(); }
BOOST_AUTO_TEST_CASE(randomized_captures_over_virtual_allocator) { randomized_captures<over_virtual_allocator>(); }

// ---- two threads, one capturing ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(two_threads_one_capturing) {
  model::runtime rt;
  const stream_t a = make_stream(rt), b = make_stream(rt);
  alloy::synchronized<ordered> alloc{ordered{make_arena(rt)}};
  {
    std::vector<block> w;  // a warm cache: the other thread is served from it while the capture runs
    for (int i = 0; i < 8; ++i) w.push_back(alloc.allocate(256_KiB, 256, b));
    for (const block x : w) alloc.deallocate(x, b);
    alloc.deallocate(alloc.allocate(64, 256, a), a);
  }
  graph_pool pool;
  std::vector<model::graph_t> graphs;
  // Boost.Test's checks are not thread-safe: the threads count what went wrong, checked after.
  std::atomic<int> capture_failures{0}, other_failures{0};
  std::atomic<int> capture_allocations{0}, other_allocations{0};
  std::thread capturing([&] {
    for (int round = 0; round < 50; ++round) {
      if (rt.begin_capture(a, capture_mode::thread_local_) != error::success) ++capture_failures;
      if (!alloc.begin_allocate_to_pool(pool, a)) ++capture_failures;
      std::vector<block> mine;
      for (int i = 0; i < 8; ++i) {
        const block x = alloc.allocate(std::size_t{256} << (i % 6), 256, a);
        if (!x) continue;
        ++capture_allocations;
        if (rt.use(a, x.ptr, x.size) != error::success) ++capture_failures;
        mine.push_back(x);
      }
      for (const block x : mine) alloc.deallocate(x, a);
      model::graph_t g{};
      if (rt.end_capture(a, &g) != error::success) ++capture_failures;
      alloc.end_allocate_to_pool(pool);
      if (!g) continue;
      graphs.push_back(g);
      if (rt.graph_launch(g, a) != error::success) ++capture_failures;
    }
  });
  std::thread other([&] {
    std::mt19937 rng(7);
    std::vector<block> mine;
    for (int i = 0; i < 2000; ++i) {
      if (mine.empty() || rng() % 2 == 0) {
        const block x = alloc.allocate(std::size_t{256} << (rng() % 8), 256, b);
        if (!x) continue;
        ++other_allocations;
        if (rt.use(b, x.ptr, x.size) != error::success) ++other_failures;  // never a live graph's memory
        mine.push_back(x);
      } else {
        alloc.deallocate(mine.back(), b);
        mine.pop_back();
      }
    }
    for (const block x : mine) alloc.deallocate(x, b);
  });
  capturing.join();
  other.join();
  BOOST_TEST(capture_failures.load() == 0);
  BOOST_TEST(other_failures.load() == 0);
  BOOST_TEST(capture_allocations.load() > 0);
  BOOST_TEST(other_allocations.load() > 0);
  REQUIRE_CLEAN(rt);
  rt.run_all();
  for (const model::graph_t g : graphs) BOOST_REQUIRE(rt.graph_destroy(g) == error::success);
  alloc.release_pool(pool);
  alloc.release();
  BOOST_TEST(rt.bytes_in_use() == 0u);
  REQUIRE_CLEAN(rt);
}
