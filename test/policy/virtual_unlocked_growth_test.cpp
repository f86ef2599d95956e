// SPDX-License-Identifier: Apache-2.0
// Planned growth and detached release of virtual_arena and virtual_allocator
// (docs/design.md#threads): over a thread-safe backend, `synchronized` and `sharded` create and map
// physical memory, and `release()` unmaps and releases it, without their lock.
//
// - A gated backend blocks inside `map` until the test opens it: thread A's allocation needs new
//   granules and waits there; meanwhile another thread must allocate from mapped granules, fill,
//   check and free on the same object within a timeout (so a held lock fails the test instead of
//   hanging it). Over a backend that is not `thread_safe_vmm` the lock is still held, and the same
//   script sees the other thread wait: the test can fail. The same with a gate in `unmap` while
//   thread A runs `release()`; and a request on granules being released waits for their unmaps.
// - The two phases called directly: a pending chunk is not handed out twice, its granules are
//   avoided by other placements, a free of its address is a misuse; a growth at the frontier maps
//   granules ahead, held until its commit; a model-based randomized run keeps up to four growths
//   pending while it allocates, frees and releases around them (one run with frontier growth),
//   with creates and maps failing and a capacity limit, checking invariants, fill patterns and
//   overlap after every step and exact balances at the end.
// - Scripted failures: one create or map fails, at every call index of a script through
//   synchronized<stats<virtual_arena>>: each request is still served, statistics exact.
// - Threads: 4 threads over a small device with failing calls, blocks handed to other threads to
//   free, through synchronized<stats<virtual_allocator>> and sharded<virtual_arena>; fill
//   patterns, exact statistics and an empty backend at the end.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <alloy/policy/sharded.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/showcase.hpp>
#include <alloy/vmm/host_vmm.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>

#include "support/call_gate.hpp"
#include "support/conformance.hpp"
#include "support/failing_vmm.hpp"
#include "support/sanitizers.hpp"

using namespace std::chrono_literals;
using alloy::block;
using alloy::testing::fill_pattern;
using alloy::testing::has_pattern;
using alloy::testing::under_asan;
using alloy::testing::under_tsan;

namespace {

constexpr std::size_t granule = std::size_t{64} << 10;

/// What every copy of a `gated_vmm` shares: the backend (host memory, failures on chosen calls,
/// one lock around each call) and a gate in `map` and one in `unmap`.
struct vmm_state {
  using failing = alloy::testing::failing_vmm<alloy::host_vmm>;
  alloy::synchronized_vmm<failing> backend;
  alloy::testing::call_gate on_map, on_unmap;

  explicit vmm_state(std::size_t capacity, failing::options fail = {})
      : backend(failing(alloy::host_vmm({.capacity = capacity, .granularity = granule}), std::move(fail))) {}

  std::size_t maps() {
    return backend.with_lock([](failing& f) { return f.backend().calls().maps; });
  }
  alloy::host_vmm::call_counts calls() {
    return backend.with_lock([](failing& f) { return f.backend().calls(); });
  }
};

/// Host memory through a shared `vmm_state`; `thread_safe` as asked (false: the arena must keep
/// its caller's lock around every call, and does).
template <bool ThreadSafe>
class basic_gated_vmm {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  static constexpr bool thread_safe = ThreadSafe;

  explicit basic_gated_vmm(std::shared_ptr<vmm_state> s) : s_(std::move(s)) {}

  std::size_t granularity() const noexcept { return s_->backend.granularity(); }
  alloy::address_range reserve(std::size_t bytes) noexcept { return s_->backend.reserve(bytes); }
  void unreserve(alloy::address_range r) noexcept { s_->backend.unreserve(r); }
  alloy::physical_memory create(std::size_t bytes) noexcept { return s_->backend.create(bytes); }
  void release(alloy::physical_memory p) noexcept { s_->backend.release(p); }
  bool map(void* at, alloy::physical_memory p) noexcept {
    s_->on_map.pass();
    return s_->backend.map(at, p);
  }
  void unmap(void* at, std::size_t bytes) noexcept {
    s_->on_unmap.pass();
    s_->backend.unmap(at, bytes);
  }
  std::size_t capacity() const noexcept { return s_->backend.capacity(); }
  std::size_t physical_bytes() const noexcept { return s_->backend.physical_bytes(); }

 private:
  std::shared_ptr<vmm_state> s_;
};
using gated_vmm = basic_gated_vmm<true>;
using unsafe_gated_vmm = basic_gated_vmm<false>;

using arena = alloy::virtual_arena<gated_vmm>;
using valloc = alloy::virtual_allocator<gated_vmm>;

/// `virtual_allocator` whose small heap maps no granules ahead, so that a test's 1 MiB block
/// needs exactly its 16 granules (two ahead of the slab's would already hold some of them).
valloc valloc_mapping_nothing_ahead(std::shared_ptr<vmm_state> s) {
  valloc::options opts;
  opts.arena.frontier_growth_min_granules = 0;
  return valloc{gated_vmm{std::move(s)}, opts};
}

static_assert(alloy::thread_safe_vmm<gated_vmm> && !alloy::thread_safe_vmm<unsafe_gated_vmm>);
static_assert(alloy::thread_safe_vmm<alloy::vmm_ref<alloy::synchronized_vmm<alloy::host_vmm>>>);
static_assert(!alloy::thread_safe_vmm<alloy::host_vmm> && !alloy::thread_safe_vmm<alloy::vmm_ref<alloy::host_vmm>>);
static_assert(alloy::growth_planning_allocator<arena>);
static_assert(alloy::growth_planning_allocator<alloy::stats<arena>>);
static_assert(alloy::growth_planning_allocator<valloc>);
static_assert(
    alloy::growth_planning_allocator<alloy::virtual_arena<alloy::vmm_ref<alloy::synchronized_vmm<alloy::host_vmm>>>>);
static_assert(!alloy::growth_planning_allocator<alloy::virtual_arena<unsafe_gated_vmm>>);
static_assert(!alloy::growth_planning_allocator<alloy::virtual_arena<alloy::host_vmm>>);
static_assert(!alloy::growth_planning_allocator<alloy::virtual_allocator<alloy::host_vmm>>);

std::shared_ptr<vmm_state> device(std::size_t capacity = SIZE_MAX, vmm_state::failing::options fail = {}) {
  return std::make_shared<vmm_state>(capacity, std::move(fail));
}

// ---- another thread is not held up by a map in progress ------------------------------------------

/// The other thread's work while A is held in the backend: three rounds of an 8 KiB block (room in
/// granule 0, beside a kept 40 KiB block), filled, checked and freed.
template <class Alloc>
bool reuse_granule_zero(Alloc& alloc) {
  bool ok = true;
  for (std::uint64_t i = 0; i < 3; ++i) {
    const block b = alloc.allocate(8 << 10, 256);
    ok = ok && b;
    if (!b) continue;
    fill_pattern(b, 100 + i);
    ok = ok && has_pattern(b, 100 + i);
    alloc.deallocate(b);
  }
  return ok;
}

/// How long the other thread gets: long enough under ThreadSanitizer for it to finish when nothing
/// holds it; where the test expects it held, 3 s show that as well.
constexpr auto patience = under_tsan ? 20s : 3s;
constexpr auto patience_when_held = 3s;

/// Runs `in_a` on thread A, which must stop at gate `g`; meanwhile another thread runs
/// `reuse_granule_zero` on the same object. `while_held` runs once that thread finished or timed
/// out, A still held. Returns whether the other thread finished while A was held (A is let go and
/// joined either way).
template <class Alloc, class InA, class WhileHeld>
bool others_proceed_while_a_waits(Alloc& alloc, alloy::testing::call_gate& g, InA in_a, WhileHeld while_held,
                                  const char* a_never_arrived, std::chrono::seconds wait = patience) {
  g.arm();
  std::thread a(in_a);
  BOOST_TEST(g.wait_inside(10s), a_never_arrived);
  auto other = std::async(std::launch::async, [&] { return reuse_granule_zero(alloc); });
  const bool finished = other.wait_for(wait) == std::future_status::ready;
  while_held();
  g.let_go();
  a.join();
  BOOST_TEST(other.get(), "the other thread's blocks were wrong");
  return finished;
}

/// Thread A allocates 1 MiB (16 new granules; the gate holds it in its first map) while a 40 KiB
/// block keeps granule 0 mapped with room; another thread then allocates 8 KiB there three times,
/// fills, checks and frees. Returns whether that thread finished while A was held; checks that it
/// made no map and that A's block is whole, mapped in 16 pieces or, with block-sized pieces
/// (`in_one_piece`), in one.
template <class Alloc>
bool others_proceed_during_a_map(Alloc& alloc, vmm_state& s, bool in_one_piece = false,
                                 std::chrono::seconds wait = patience) {
  const block keep = alloc.allocate(40 << 10, 256);
  BOOST_REQUIRE(keep);
  fill_pattern(keep, 1);
  const std::size_t maps_before = s.maps();
  const std::size_t physical_before = s.backend.physical_bytes();

  block grown{};
  std::size_t maps_while_a_waited = 0;
  const bool finished = others_proceed_while_a_waits(
      alloc, s.on_map, [&] { grown = alloc.allocate(std::size_t{1} << 20, 256); },
      [&] { maps_while_a_waited = s.maps() - maps_before; }, "thread A never reached the backend's map", wait);
  BOOST_TEST(maps_while_a_waited == 0u, "the other thread mapped (its blocks belong in granule 0)");
  BOOST_REQUIRE(grown);
  fill_pattern(grown, 2);
  BOOST_TEST(has_pattern(grown, 2));
  BOOST_TEST(has_pattern(keep, 1));
  BOOST_TEST(s.backend.physical_bytes() - physical_before == 16 * granule, "A's 1 MiB maps exactly its 16 granules");
  BOOST_TEST(s.maps() - maps_before == (in_one_piece ? 1u : 16u));
  alloc.deallocate(grown);
  alloc.deallocate(keep);
  return finished;
}

BOOST_AUTO_TEST_CASE(synchronized_arena_serves_mapped_granules_while_a_growth_maps) {
  const auto s = device();
  {
    alloy::synchronized<alloy::stats<arena>> alloc{alloy::stats<arena>{arena{gated_vmm{s}}}};
    BOOST_TEST(others_proceed_during_a_map(alloc, *s),
               "an allocate from mapped granules waited for another thread's map");
    const alloy::statistics st = alloc.with_lock([](auto& in) { return in.statistics(); });
    BOOST_TEST(st.num_allocs == 5u);  // keep, A's, three by the other thread
    BOOST_TEST(st.num_ooms == 0u);
    BOOST_TEST(st.bytes_in_use == 0u);
    BOOST_TEST(st.num_device_alloc == 17u);  // granule 0, A's 16
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.inner().check_invariants(); }));
    BOOST_TEST(alloc.reserved_bytes() == s->backend.physical_bytes());
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(sharded_arena_serves_the_same_shard_while_a_growth_maps) {
  const auto s = device();
  {
    alloy::sharded<arena> alloc([&](std::size_t) { return arena{gated_vmm{s}}; }, {.shards = 1, .thread_cache = 0});
    BOOST_TEST(others_proceed_during_a_map(alloc, *s), "an allocate from mapped granules waited for the shard's map");
    BOOST_TEST(alloc.bytes_in_use() == 0u);
    BOOST_TEST(alloc.counters().num_device_alloc == 17u);
    BOOST_TEST(alloc.reserved_bytes() == s->backend.physical_bytes());
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(synchronized_virtual_allocator_serves_the_pool_while_a_large_growth_maps) {
  const auto s = device();
  {
    alloy::synchronized<valloc> alloc{valloc_mapping_nothing_ahead(s)};
    const block small = alloc.allocate(8 << 10, 256);  // a slab for the other thread's 8 KiB blocks
    BOOST_REQUIRE(small);
    alloc.deallocate(small);  // the slab stays
    BOOST_TEST(others_proceed_during_a_map(alloc, *s, true), "a pooled allocate waited for another thread's map");
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.bytes_in_use(); }) == 0u);
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.counters().num_ooms; }) == 0u);
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.arena().check_invariants(); }));
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

// The sensitivity check: over a backend that is not thread safe, the lock is held across the
// map as before, and the same script sees the other thread wait.
BOOST_AUTO_TEST_CASE(over_a_backend_that_is_not_thread_safe_the_lock_is_held_and_the_test_sees_it) {
  const auto s = device();
  {
    using unsafe_arena = alloy::virtual_arena<unsafe_gated_vmm>;
    alloy::synchronized<unsafe_arena> alloc{unsafe_arena{unsafe_gated_vmm{s}}};
    BOOST_TEST(!others_proceed_during_a_map(alloc, *s, false, patience_when_held));
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

// ---- release() unmaps without the lock ------------------------------------------------------------

/// Thread A releases 16 free mapped granules (the gate holds it in its first unmap) while a 40 KiB
/// block keeps granule 0 mapped with room; another thread then allocates 8 KiB there three times,
/// fills, checks and frees. Returns whether it finished while A was held; checks that exactly the
/// free granules were unmapped (one piece each, or with block-sized pieces, `in_one_piece`, the
/// 16 in one) and that the kept block is intact.
template <class Alloc, class FreeGranules>
bool others_proceed_during_a_release(Alloc& alloc, vmm_state& s, FreeGranules free_granules, bool in_one_piece = false,
                                     std::chrono::seconds wait = patience) {
  const block keep = alloc.allocate(40 << 10, 256);
  BOOST_REQUIRE(keep);
  fill_pattern(keep, 1);
  const block big = alloc.allocate(std::size_t{1} << 20, 256);  // 16 granules, most kept mapped once freed
  BOOST_REQUIRE(big);
  alloc.deallocate(big);
  const std::size_t unmaps_before = s.calls().unmaps;
  const std::size_t physical_before = s.backend.physical_bytes();
  const std::size_t to_release = free_granules();
  BOOST_TEST(to_release >= 15u);  // the arena's own rule may have unmapped one at the free

  const bool finished = others_proceed_while_a_waits(
      alloc, s.on_unmap, [&] { alloc.release(); }, [] {}, "thread A never reached the backend's unmap", wait);
  BOOST_TEST(physical_before - s.backend.physical_bytes() == to_release * granule,
             "release() unmaps exactly the free granules");
  BOOST_TEST(s.calls().unmaps - unmaps_before == (in_one_piece ? 1u : to_release));
  BOOST_TEST(has_pattern(keep, 1));
  alloc.deallocate(keep);
  return finished;
}

BOOST_AUTO_TEST_CASE(synchronized_arena_serves_mapped_granules_while_release_unmaps) {
  const auto s = device();
  {
    alloy::synchronized<alloy::stats<arena>> alloc{alloy::stats<arena>{arena{gated_vmm{s}}}};
    BOOST_TEST(others_proceed_during_a_release(
                   alloc, *s,
                   [&] { return alloc.with_lock([](auto& in) { return in.inner().free_mapped_bytes(); }) / granule; }),
               "an allocate from mapped granules waited for release()'s unmaps");
    const alloy::statistics st = alloc.with_lock([](auto& in) { return in.statistics(); });
    BOOST_TEST(st.num_device_alloc == 17u);  // granule 0, the 16 of the 1 MiB block
    BOOST_TEST(st.num_device_alloc - st.num_device_free == st.bytes_reserved / granule);
    BOOST_TEST(st.bytes_in_use == 0u);
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.inner().check_invariants(); }));
    BOOST_TEST(alloc.reserved_bytes() == s->backend.physical_bytes());
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(sharded_arena_serves_the_same_shard_while_release_unmaps) {
  const auto s = device();
  {
    alloy::sharded<arena> alloc([&](std::size_t) { return arena{gated_vmm{s}}; }, {.shards = 1, .thread_cache = 0});
    BOOST_TEST(others_proceed_during_a_release(alloc, *s, [&] { return alloc.reserved_bytes() / granule - 1; }),
               "an allocate from mapped granules waited for the shard's unmaps");  // all but granule 0
    BOOST_TEST(alloc.counters().num_maps - alloc.counters().num_unmaps == alloc.reserved_bytes() / granule);
    BOOST_TEST(alloc.reserved_bytes() == s->backend.physical_bytes());
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(synchronized_virtual_allocator_serves_the_pool_while_release_unmaps) {
  const auto s = device();
  {
    alloy::synchronized<valloc> alloc{valloc_mapping_nothing_ahead(s)};
    const block small = alloc.allocate(8 << 10, 256);  // a slab for the other thread's 8 KiB blocks
    BOOST_REQUIRE(small);
    BOOST_TEST(
        others_proceed_during_a_release(
            alloc, *s,
            [&] { return alloc.with_lock([](auto& in) { return in.arena().free_mapped_bytes(); }) / granule; }, true),
        "a pooled allocate waited for release()'s unmaps");
    alloc.deallocate(small);
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.arena().check_invariants(); }));
    BOOST_TEST(alloc.reserved_bytes() == s->backend.physical_bytes());
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(over_a_backend_that_is_not_thread_safe_release_holds_the_lock_and_the_test_sees_it) {
  const auto s = device();
  {
    using unsafe_arena = alloy::virtual_arena<unsafe_gated_vmm>;
    alloy::synchronized<unsafe_arena> alloc{unsafe_arena{unsafe_gated_vmm{s}}};
    BOOST_TEST(!others_proceed_during_a_release(
        alloc, *s, [&] { return alloc.reserved_bytes() / granule - 1; }, false, patience_when_held));
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

// A request that needs the granules being released waits until their unmaps are done (it holds
// the lock meanwhile; the releasing thread needs none), then maps them afresh.
BOOST_AUTO_TEST_CASE(a_placement_on_granules_being_released_waits_for_their_unmaps) {
  const auto s = device();
  {
    alloy::synchronized<arena> alloc{arena{gated_vmm{s}}};
    const block keep = alloc.allocate(40 << 10, 256);
    BOOST_REQUIRE(keep);
    const block big = alloc.allocate(std::size_t{1} << 20, 256);
    BOOST_REQUIRE(big);
    alloc.deallocate(big);  // granules 1-16 free mapped
    s->on_unmap.arm();
    std::thread a([&] { alloc.release(); });
    BOOST_TEST(s->on_unmap.wait_inside(10s));
    auto again = std::async(std::launch::async, [&] { return alloc.allocate(std::size_t{1} << 20, 256); });
    BOOST_TEST((again.wait_for(300ms) == std::future_status::timeout),
               "a placement mapped over a granule still being released");
    s->on_unmap.let_go();
    a.join();
    const block b = again.get();
    BOOST_REQUIRE(b);
    BOOST_TEST(b.ptr == big.ptr);  // the same place, mapped afresh
    fill_pattern(b, 6);
    BOOST_TEST(has_pattern(b, 6));
    const alloy::allocator_counters c = alloc.counters();
    BOOST_TEST(c.num_unmaps == 16u);
    BOOST_TEST(c.num_maps == 33u);  // granule 0, 16, 16 again
    BOOST_TEST(alloc.reserved_bytes() == 17 * granule);
    BOOST_TEST(alloc.reserved_bytes() == s->backend.physical_bytes());
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.check_invariants(); }));
    alloc.deallocate(b);
    alloc.deallocate(keep);
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

// ---- the two phases, called directly ---------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_pending_chunk_is_neither_shared_nor_freed_and_commits_whole) {
  const auto s = device();
  arena a{gated_vmm{s}};
  alloy::growth_plan plan;
  BOOST_TEST(!a.allocate_or_plan(100 << 10, 256, plan));
  BOOST_REQUIRE(static_cast<bool>(plan));
  BOOST_TEST(plan.bytes == 2 * granule);  // granules 0 and 1, neither mapped
  BOOST_TEST(a.check_invariants());
  BOOST_TEST(a.bytes_in_use() == 0u);  // nothing handed out, nothing mapped yet
  BOOST_TEST(a.reserved_bytes() == 0u);
  BOOST_TEST(s->maps() == 0u);

  // Best fit would put this right after the pending chunk, in its granule 1: whole free
  // granules instead.
  const block other = a.allocate(8 << 10, 256);
  BOOST_REQUIRE(other);
  fill_pattern(other, 3);

  plan.fetch();
  BOOST_REQUIRE(static_cast<bool>(plan.got));
  const block mine = a.allocate_planned(plan, 100 << 10, 256);
  plan.give_back_unused();
  BOOST_REQUIRE(mine);
  BOOST_TEST(mine.size == std::size_t{100} << 10);
  const auto m = reinterpret_cast<std::uintptr_t>(mine.ptr), o = reinterpret_cast<std::uintptr_t>(other.ptr);
  BOOST_TEST((o >= m + 2 * granule), "a block placed in a pending granule");
  BOOST_TEST(o % granule == 0u);
  fill_pattern(mine, 4);
  BOOST_TEST(has_pattern(other, 3));
  BOOST_TEST(a.check_invariants());
  BOOST_TEST(a.reserved_bytes() == 3 * granule);
  BOOST_TEST(a.bytes_in_use() == (std::size_t{100} << 10) + (8 << 10));
  BOOST_TEST(a.counters().num_maps == 3u);
  BOOST_TEST(a.counters().num_device_alloc == 3u);
  a.deallocate(mine);
  a.deallocate(other);
  BOOST_TEST(a.check_invariants());
}

BOOST_AUTO_TEST_CASE(freeing_a_pending_chunk_is_a_misuse) {
  const auto s = device();
  arena a{gated_vmm{s}};
  alloy::growth_plan plan;
  BOOST_TEST(!a.allocate_or_plan(100 << 10, 256, plan));
  BOOST_REQUIRE(static_cast<bool>(plan));
  // The pending chunk is the first piece of the range.
  const void* start = nullptr;
  a.for_each_block([&](const alloy::block_info& info) {
    if (start == nullptr) start = info.ptr;
  });
  BOOST_REQUIRE(start != nullptr);
  BOOST_TEST(!a.try_deallocate(block{const_cast<void*>(start), std::size_t{100} << 10}));
  BOOST_TEST(a.misuses().foreign_pointers == 1u);
  BOOST_TEST(a.check_invariants());
  plan.fetch();
  const block mine = a.allocate_planned(plan, 100 << 10, 256);
  BOOST_REQUIRE(mine);
  BOOST_TEST(mine.ptr == start);
  BOOST_TEST(a.try_deallocate(mine));
  BOOST_TEST(a.check_invariants());
}

BOOST_AUTO_TEST_CASE(a_failed_map_outside_the_lock_falls_back_to_the_locked_path) {
  // Calls numbered over creates and maps: 0 create, 1 map (fails) -> released; the commit frees
  // the chunk and allocates as `allocate` does: 2 create, 3 map, 4 create, 5 map.
  const auto s = device(SIZE_MAX, {.fail_at = {1}, .kinds = vmm_state::failing::creates | vmm_state::failing::maps});
  arena a{gated_vmm{s}};
  alloy::growth_plan plan;
  BOOST_TEST(!a.allocate_or_plan(100 << 10, 256, plan));
  BOOST_REQUIRE(static_cast<bool>(plan));
  plan.fetch();
  BOOST_TEST(!plan.got);
  const block b = a.allocate_planned(plan, 100 << 10, 256);
  plan.give_back_unused();
  BOOST_REQUIRE(b);
  fill_pattern(b, 5);
  BOOST_TEST(has_pattern(b, 5));
  BOOST_TEST(a.check_invariants());
  BOOST_TEST(a.counters().num_device_alloc == 3u);  // the failed map's piece, then two
  BOOST_TEST(a.counters().num_device_free == 1u);
  BOOST_TEST(a.counters().num_maps == 2u);
  BOOST_TEST(a.counters().num_ooms == 0u);
  BOOST_TEST(a.reserved_bytes() == s->backend.physical_bytes());
  a.deallocate(b);
}

/// Block-sized pieces (virtual_allocator's): a planned growth maps the pieces `allocate` would,
/// one for a run of granules the block covers whole and one for an edge it covers in part, and
/// a run whose create fails outside the lock is mapped under it.
BOOST_AUTO_TEST_CASE(a_planned_growth_maps_block_sized_pieces_as_allocate_does) {
  // Creates and maps numbered: 0 create, 1 map (granule 0); 2 create (4 granules, fails).
  const auto s = device(SIZE_MAX, {.fail_at = {2}, .kinds = vmm_state::failing::creates | vmm_state::failing::maps});
  arena a{gated_vmm{s}, {.release_threshold = arena::keep_all, .block_sized_pieces = true}};
  const block small = a.allocate(8 << 10, 256);  // granule 0, a piece of its own
  BOOST_REQUIRE(small);
  fill_pattern(small, 1);

  // Four whole granules: placed on a boundary (granules 1-4), one run, one piece.
  alloy::growth_plan plan;
  BOOST_TEST(!a.allocate_or_plan(4 * granule, 256, plan));
  BOOST_REQUIRE(static_cast<bool>(plan));
  BOOST_TEST(plan.bytes == 4 * granule);
  plan.fetch();  // the run's create fails: nothing mapped outside the lock
  BOOST_TEST(!plan.got);
  const block run = a.allocate_planned(plan, 4 * granule, 256);  // under the lock: one run again
  plan.give_back_unused();
  BOOST_REQUIRE(run);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(run.ptr) % granule == 0u);
  BOOST_TEST(a.counters().num_maps == 2u);  // granule 0, then the run of four
  BOOST_TEST(a.counters().num_device_alloc == 2u);
  BOOST_TEST(s->backend.with_lock([](auto& f) { return f.calls(); }) == 5u);  // the failed create among them

  // Three and a half granules after it (granules 5-8): the three it covers whole in one piece,
  // the edge granule it covers in part in another, both made outside the lock.
  BOOST_TEST(!a.allocate_or_plan(3 * granule + granule / 2, 256, plan));
  BOOST_REQUIRE(static_cast<bool>(plan));
  BOOST_TEST(plan.bytes == 4 * granule);
  plan.fetch();
  BOOST_REQUIRE(static_cast<bool>(plan.got));
  const block edged = a.allocate_planned(plan, 3 * granule + granule / 2, 256);
  plan.give_back_unused();
  BOOST_REQUIRE(edged);
  BOOST_TEST(a.counters().num_maps == 4u);
  BOOST_TEST(a.counters().num_device_alloc == 4u);
  BOOST_TEST(a.reserved_bytes() == 9 * granule);
  BOOST_TEST(a.check_invariants());
  fill_pattern(run, 2);
  fill_pattern(edged, 3);
  BOOST_TEST(has_pattern(small, 1));
  BOOST_TEST(has_pattern(run, 2));

  // Pieces go back whole: freeing the 3.5-granule block leaves both of its pieces free.
  a.deallocate(edged);
  BOOST_TEST(a.stranded_free_bytes() == 0u);
  BOOST_TEST(a.release() == 4 * granule);
  BOOST_TEST(a.counters().num_unmaps == 2u);
  BOOST_TEST(has_pattern(run, 2));
  a.deallocate(run);
  a.deallocate(small);
  BOOST_TEST(a.check_invariants());
}

BOOST_AUTO_TEST_CASE(a_planned_growth_at_the_frontier_maps_granules_ahead_as_allocate_does) {
  // Frontier growth with divisor 1 (as many granules ahead as are mapped) on a device of 256
  // granules: granules ahead while the backend then holds at most 16.
  const auto s = device(256 * granule);
  arena a{gated_vmm{s},
          {.release_threshold = arena::keep_all, .block_sized_pieces = true, .frontier_growth_divisor = 1}};
  const block small = a.allocate(8 << 10, 256);  // granule 0 and one ahead: one piece of two
  BOOST_REQUIRE(small);
  const auto base = reinterpret_cast<std::uintptr_t>(small.ptr);
  const auto at = [base](std::size_t g) { return reinterpret_cast<void*>(base + g * granule); };
  BOOST_TEST(a.mapped_bytes() == 2 * granule);
  fill_pattern(small, 1);

  // Four whole granules go on a boundary, on granules 1-4; 2-4 are new and end the used range, so
  // the plan maps them and 5 granules ahead (2 + 3 mapped then) as one run.
  alloy::growth_plan plan;
  BOOST_TEST(!a.allocate_or_plan(4 * granule, 256, plan));
  BOOST_REQUIRE(static_cast<bool>(plan));
  BOOST_TEST(plan.bytes == 8 * granule);
  BOOST_TEST(a.check_invariants());
  // Until the commit the granules ahead are held: another block goes past them (its own piece:
  // no granules ahead while a growth is pending).
  const block beyond = a.allocate(granule, 256);
  BOOST_REQUIRE(beyond);
  BOOST_TEST(beyond.ptr == at(10));
  BOOST_TEST(a.counters().num_maps == 2u);
  BOOST_TEST(a.check_invariants());
  plan.fetch();
  BOOST_REQUIRE(static_cast<bool>(plan.got));
  const block four = a.allocate_planned(plan, 4 * granule, 256);
  plan.give_back_unused();
  BOOST_REQUIRE(four);
  BOOST_TEST(four.ptr == at(1));
  BOOST_TEST(a.counters().num_maps == 3u);
  BOOST_TEST(a.counters().num_device_alloc == 3u);
  BOOST_TEST(a.mapped_bytes() == 11 * granule);
  BOOST_TEST(a.bytes_in_use() == 4 * granule + granule + (8 << 10));
  BOOST_TEST(a.check_invariants());

  // The granules ahead serve the next blocks without a driver call.
  const std::size_t creates = s->calls().creates;
  const block three = a.allocate(3 * granule, 256);
  BOOST_REQUIRE(three);
  BOOST_TEST(three.ptr == at(5));
  BOOST_TEST(s->calls().creates == creates);
  fill_pattern(four, 2);
  fill_pattern(three, 3);
  fill_pattern(beyond, 4);
  BOOST_TEST(has_pattern(small, 1));
  BOOST_TEST(has_pattern(four, 2));
  BOOST_TEST(a.check_invariants());

  for (const block& b : {small, four, three, beyond}) a.deallocate(b);
  BOOST_TEST(a.release() == 11 * granule);
  const alloy::allocator_counters c = a.counters();
  BOOST_TEST(c.num_device_alloc == c.num_device_free);
  BOOST_TEST(c.num_maps == c.num_unmaps);
  BOOST_TEST(a.check_invariants());
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

/// A live block with its pattern id.
struct live_block {
  block b;
  std::uint64_t id;
};

bool overlaps_any(const std::vector<live_block>& live, block b) {
  const auto s = reinterpret_cast<std::uintptr_t>(b.ptr);
  return std::any_of(live.begin(), live.end(), [&](const live_block& l) {
    const auto t = reinterpret_cast<std::uintptr_t>(l.b.ptr);
    return s < t + std::max<std::size_t>(l.b.size, 1) && t < s + std::max<std::size_t>(b.size, 1);
  });
}

/// The release rule of a model run.
enum class rule {
  keep_free,         ///< the arena's default release rule
  unmap_at_once,     ///< every wholly free granule is unmapped at once (many more growths)
  keep_all_in_runs,  ///< virtual_allocator's: nothing trimmed, block-sized pieces (released whole, detached too)
  frontier,          ///< keep_all_in_runs with frontier growth (1/2), on a device of 1024 granules
};

/// Up to four growths pending at once while the arena allocates, frees and releases around them,
/// up to 40 blocks live; creates and maps fail one call in eleven; the device holds 96 granules
/// (`rule::frontier`: 1024, so that granules go ahead while it holds up to 64).
void run_model(std::uint64_t seed, std::size_t steps, rule release_rule) {
  std::set<std::size_t> fail_at;
  for (std::size_t i = 5; i < 40 * steps; i += 11) fail_at.insert(i);
  const std::size_t capacity = (release_rule == rule::frontier ? 1024 : 96) * granule;
  const auto s =
      device(capacity, {.fail_at = fail_at, .kinds = vmm_state::failing::creates | vmm_state::failing::maps});
  {
    arena::options opts;
    if (release_rule == rule::unmap_at_once) {
      opts.release_threshold_divisor = 0;
      opts.keep_up_to_peak = false;
    } else if (release_rule == rule::keep_all_in_runs || release_rule == rule::frontier) {
      opts.release_threshold = arena::keep_all;
      opts.block_sized_pieces = true;
      if (release_rule == rule::frontier) opts.frontier_growth_divisor = 2;
    }
    arena a{gated_vmm{s}, opts};
    std::mt19937_64 rng(seed);
    std::vector<live_block> live;
    struct pending {
      alloy::growth_plan plan;
      std::size_t bytes, alignment;
    };
    std::vector<pending> waiting;
    std::uint64_t next_id = 1;
    std::size_t planned = 0, committed = 0, served = 0, failed = 0;
    std::size_t ahead = 0;  // plans that map more granules than their block can touch
    const auto size = [&] {
      const double e = std::uniform_real_distribution<double>(6.0, 19.0)(rng);  // 64 B - 512 KiB
      return static_cast<std::size_t>(std::exp2(e));
    };
    const auto alignment = [&] { return std::size_t{256} << (rng() % 4 == 0 ? rng() % 10 : 0); };
    const auto keep = [&](block b, std::size_t bytes, std::size_t al) {
      if (!b) {
        ++failed;
        return;
      }
      ++served;
      BOOST_TEST(b.size == bytes);
      BOOST_TEST(reinterpret_cast<std::uintptr_t>(b.ptr) % al == 0u);
      BOOST_TEST(!overlaps_any(live, b), "a block handed out twice (seed " << seed << ")");
      fill_pattern(b, next_id);
      live.push_back({b, next_id++});
    };
    for (std::size_t step = 0; step < steps; ++step) {
      const unsigned r = live.size() >= 40 ? 80 : static_cast<unsigned>(rng() % 100);
      if (r < 30 && waiting.size() < 4) {
        pending p{{}, size(), alignment()};
        const block b = a.allocate_or_plan(p.bytes, p.alignment, p.plan);
        if (b) {
          keep(b, p.bytes, p.alignment);
        } else if (p.plan) {
          ++planned;
          ahead += p.plan.bytes > (p.bytes / granule + 2) * granule;
          waiting.push_back(p);
        } else {
          keep(a.allocate(p.bytes, p.alignment), p.bytes, p.alignment);
        }
      } else if (r < 50 && !waiting.empty()) {
        const std::size_t i = rng() % waiting.size();
        pending p = waiting[i];
        waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
        p.plan.fetch();
        const block b = a.allocate_planned(p.plan, p.bytes, p.alignment);
        p.plan.give_back_unused();
        ++committed;
        keep(b, p.bytes, p.alignment);
      } else if (r < 60) {
        const std::size_t bytes = size(), al = alignment();
        keep(a.allocate(bytes, al), bytes, al);
      } else if (r < 97) {
        if (live.empty()) continue;
        const std::size_t i = rng() % live.size();
        BOOST_TEST(has_pattern(live[i].b, live[i].id),
                   "block " << live[i].id << " lost its content (seed " << seed << ")");
        BOOST_TEST(a.try_deallocate(live[i].b));
        live[i] = live.back();
        live.pop_back();
      } else if (r < 99) {
        a.release();
      } else {
        // release()'s two phases, as synchronized runs them (no growth can be pending on a batch's
        // granules in one thread: every call between detach and give-back would wait).
        alloy::detached_segments::give_back_all([&](alloy::detached_segments& out) {
          const bool done = a.release_detached(out);
          if (!a.check_invariants())
            BOOST_TEST(false, "invariants broken with a release batch out (seed " << seed << ")");
          return done;
        });
      }
      if (!a.check_invariants()) {
        BOOST_TEST(false, "invariants broken at step " << step << " (seed " << seed << ")");
        break;
      }
      // Creates and maps are made and committed in one step: every piece is mapped and counted.
      if (a.reserved_bytes() != s->backend.physical_bytes()) {
        BOOST_TEST(false, "mapped bytes differ from the backend's at step " << step);
        break;
      }
    }
    for (pending& p : waiting) {
      p.plan.fetch();
      keep(a.allocate_planned(p.plan, p.bytes, p.alignment), p.bytes, p.alignment);
      ++committed;
    }
    for (const live_block& l : live) {
      BOOST_TEST(has_pattern(l.b, l.id));
      a.deallocate(l.b);
    }
    BOOST_TEST(a.check_invariants());
    BOOST_TEST(a.bytes_in_use() == 0u);
    BOOST_TEST(a.requested_bytes() == 0u);
    BOOST_TEST(a.misuses().total() == 0u);
    a.release();
    BOOST_TEST(a.mapped_bytes() == 0u);
    const alloy::allocator_counters c = a.counters();
    BOOST_TEST(c.num_device_alloc == c.num_device_free);
    BOOST_TEST(c.num_maps == c.num_unmaps);
    BOOST_TEST(c.num_maps == s->calls().maps);
    BOOST_TEST(planned == committed);
    BOOST_TEST_MESSAGE("seed " << seed << ": " << planned << " planned (" << ahead << " with granules ahead), "
                               << served << " served, " << failed << " failed");
    BOOST_TEST(planned > steps / (release_rule == rule::unmap_at_once ? 20 : 200),
               "too few growths were planned to test anything");
    if (release_rule == rule::frontier) {
      BOOST_TEST(ahead > 0u, "no planned growth mapped granules ahead");
    } else {
      BOOST_TEST(failed > 0u, "the device never ran short");
    }
    BOOST_TEST(served > 10 * failed);
  }
  const alloy::host_vmm::call_counts calls = s->calls();
  BOOST_TEST(s->backend.physical_bytes() == 0u);
  BOOST_TEST(calls.creates == calls.releases);
  BOOST_TEST(calls.maps == calls.unmaps);
  BOOST_TEST(calls.reserves == calls.unreserves);
}

BOOST_AUTO_TEST_CASE(model_with_growths_pending_around_every_call) {
  for (std::uint64_t seed : {1u, 2u, 3u, 4u, 5u})
    run_model(seed,
              under_tsan   ? 20000
              : under_asan ? 60000
                           : 200000,
              seed == 1   ? rule::keep_free
              : seed == 4 ? rule::keep_all_in_runs
              : seed == 5 ? rule::frontier
                          : rule::unmap_at_once);
}

// ---- one failure at every call index -----------------------------------------------------------

/// A fixed script through synchronized<stats<virtual_arena>> (every growth planned and mapped
/// outside the lock) with call `fail_at` failing (creates and maps numbered together); returns
/// how many calls were numbered.
std::size_t run_script(std::size_t fail_at) {
  const auto s =
      device(SIZE_MAX, {.fail_at = {fail_at}, .kinds = vmm_state::failing::creates | vmm_state::failing::maps});
  std::size_t numbered = 0;
  {
    alloy::synchronized<alloy::stats<arena>> alloc{alloy::stats<arena>{arena{gated_vmm{s}}}};
    std::vector<live_block> live;
    std::uint64_t id = 1;
    const std::size_t sizes[] = {100 << 10, 3000, 700 << 10, 64 << 10, 40, 1 << 20, 200 << 10, 5 << 10};
    for (int round = 0; round < 3; ++round) {
      for (const std::size_t bytes : sizes) {
        const block b = alloc.allocate(bytes, 256);
        BOOST_TEST(static_cast<bool>(b), "allocate(" << bytes << ") failed with call " << fail_at << " failing");
        if (!b) continue;
        BOOST_TEST(!overlaps_any(live, b));
        fill_pattern(b, id);
        live.push_back({b, id++});
      }
      for (std::size_t i = static_cast<std::size_t>(round % 2); i < live.size(); i += 2) {
        BOOST_TEST(has_pattern(live[i].b, live[i].id));
        alloc.deallocate(live[i].b);
        live[i].b = {};
      }
      std::erase_if(live, [](const live_block& l) { return !l.b; });
      if (round == 1) alloc.release();
    }
    const alloy::statistics st = alloc.with_lock([](auto& in) { return in.statistics(); });
    BOOST_TEST(st.num_ooms == 0u);
    BOOST_TEST(st.num_allocs == 24u);
    BOOST_TEST(st.bytes_reserved == s->backend.physical_bytes());
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.inner().check_invariants(); }));
    for (const live_block& l : live) {
      BOOST_TEST(has_pattern(l.b, l.id));
      alloc.deallocate(l.b);
    }
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.bytes_in_use(); }) == 0u);
    numbered = s->backend.with_lock([](vmm_state::failing& f) { return f.calls(); });
  }
  const alloy::host_vmm::call_counts calls = s->calls();
  BOOST_TEST(s->backend.physical_bytes() == 0u);
  BOOST_TEST(calls.creates == calls.releases);
  BOOST_TEST(calls.maps == calls.unmaps);
  return numbered;
}

BOOST_AUTO_TEST_CASE(one_create_or_map_failure_at_every_call_index) {
  const std::size_t calls = run_script(SIZE_MAX);
  BOOST_TEST(calls > 20u);
  for (std::size_t k = 0; k <= calls; ++k) run_script(k);
}

// ---- threads ---------------------------------------------------------------------------------------

/// 4 threads, each keeping up to 24 blocks of 64 B - 512 KiB, filled (thread 0 also calls
/// `release()` now and then); a block is sometimes handed to the next thread (up to 32 waiting),
/// which checks and frees it; a device of 320 granules (about the most live at once) and one
/// create or map in thirteen failing, so that growths, failures and the locked fallback all
/// happen under load.
template <class Alloc>
void hammer(Alloc& alloc, std::size_t steps_per_thread, std::size_t& served, std::size_t& failed) {
  constexpr int threads = 4;
  std::mutex handoff_mutex;
  std::vector<std::vector<live_block>> handoff(threads);
  std::atomic<std::size_t> ok{0}, refused{0}, corrupt{0};
  std::atomic<std::uint64_t> ids{1};
  const auto run = [&](int me) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(me) * 7919 + 1);
    std::vector<live_block> live;
    const auto drop = [&](const live_block& l) {
      if (!has_pattern(l.b, l.id)) ++corrupt;
      alloc.deallocate(l.b);
    };
    for (std::size_t step = 0; step < steps_per_thread; ++step) {
      if (me == 0 && step % 4096 == 4095) alloc.release();  // unmaps beside the others' maps
      if (step % 64 == 0) {
        std::vector<live_block> mine;
        {
          std::lock_guard lock(handoff_mutex);
          mine.swap(handoff[static_cast<std::size_t>(me)]);
        }
        for (const live_block& l : mine) drop(l);
      }
      if (live.size() < 24 && rng() % 2 == 0) {
        const auto bytes = static_cast<std::size_t>(std::exp2(std::uniform_real_distribution<double>(6.0, 19.0)(rng)));
        const block b = alloc.allocate(bytes, 256);
        if (!b) {
          ++refused;
          continue;
        }
        ++ok;
        const std::uint64_t id = ids.fetch_add(1);
        fill_pattern(b, id);
        live.push_back({b, id});
      } else if (!live.empty()) {
        const std::size_t i = rng() % live.size();
        const live_block l = live[i];
        live[i] = live.back();
        live.pop_back();
        bool handed = false;
        if (rng() % 4 == 0) {
          std::lock_guard lock(handoff_mutex);
          auto& next = handoff[static_cast<std::size_t>((me + 1) % threads)];
          if (next.size() < 32) {  // bounded, so a thread descheduled for long does not hold everything
            next.push_back(l);
            handed = true;
          }
        }
        if (!handed) drop(l);
      }
    }
    for (const live_block& l : live) drop(l);
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(run, t);
  for (std::thread& t : pool) t.join();
  for (auto& h : handoff)
    for (const live_block& l : h) {
      if (!has_pattern(l.b, l.id)) ++corrupt;
      alloc.deallocate(l.b);
    }
  BOOST_TEST(corrupt.load() == 0u, "blocks lost their content");
  served = ok.load();
  failed = refused.load();
}

std::shared_ptr<vmm_state> failing_device() {
  std::set<std::size_t> fail_at;
  for (std::size_t i = 3; i < 2'000'000; i += 13) fail_at.insert(i);
  return device(320 * granule, {.fail_at = fail_at, .kinds = vmm_state::failing::creates | vmm_state::failing::maps});
}

BOOST_AUTO_TEST_CASE(threads_through_synchronized_stats_virtual_allocator) {
  const auto s = failing_device();
  {
    using inner = alloy::stats<valloc>;
    alloy::synchronized<inner> alloc{inner{valloc{gated_vmm{s}}}};
    std::size_t served = 0, failed = 0;
    hammer(alloc, under_tsan ? 10000 : under_asan ? 80000 : 250000, served, failed);
    const alloy::statistics st = alloc.with_lock([](auto& in) { return in.statistics(); });
    BOOST_TEST(st.num_allocs == served);
    BOOST_TEST(st.num_ooms == failed);
    BOOST_TEST(st.bytes_in_use == 0u);
    BOOST_TEST(served > failed);
    BOOST_TEST(alloc.with_lock([](auto& in) { return in.inner().arena().check_invariants(); }));
    BOOST_TEST(alloc.reserved_bytes() == s->backend.physical_bytes());
    alloc.release();
    BOOST_TEST(alloc.reserved_bytes() == 0u);
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
  const alloy::host_vmm::call_counts calls = s->calls();
  BOOST_TEST(calls.maps == calls.unmaps);
  BOOST_TEST(calls.creates == calls.releases);
}

BOOST_AUTO_TEST_CASE(threads_through_sharded_arenas_over_one_backend) {
  const auto s = failing_device();
  {
    alloy::sharded<arena> alloc([&](std::size_t) { return arena{gated_vmm{s}}; }, {.shards = 2, .thread_cache = 0});
    std::size_t served = 0, failed = 0;
    hammer(alloc, under_tsan ? 10000 : under_asan ? 80000 : 250000, served, failed);
    BOOST_TEST(served > failed);
    BOOST_TEST(alloc.bytes_in_use() == 0u);
    BOOST_TEST(alloc.reserved_bytes() == s->backend.physical_bytes());
    const alloy::allocator_counters c = alloc.counters();
    BOOST_TEST(c.num_maps - c.num_unmaps == alloc.reserved_bytes() / granule);
    BOOST_TEST(c.num_device_alloc - c.num_device_free == alloc.reserved_bytes() / granule);
    alloc.release();
    BOOST_TEST(alloc.reserved_bytes() == 0u);
  }
  BOOST_TEST(s->backend.physical_bytes() == 0u);
}

}  // namespace
