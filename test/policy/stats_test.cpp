// SPDX-License-Identifier: Apache-2.0
// stats<>: every field and PyTorch key on scripted sequences, invariants under random workloads,
// traces against a brute-force reference, the summary, the snapshot, the OOM report, and the
// conformance suite.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/detail/edge.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/showcase.hpp>
#include <alloy/snapshot.hpp>

#include "policy/stats_toys.hpp"
#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;
using alloy::testing::toy_arena;
using alloy::testing::toy_segregator;
using stat_map = std::map<std::string, std::int64_t>;

namespace {

/// PyTorch's `torch.cuda.memory_stats()` keys, as PyTorch returns them (the C++ allocator's
/// DeviceStats flattened by torch/cuda/memory.py): nine statistics by three pools by four
/// metrics, the event counters, max_split_size and the two oversize statistics.
std::set<std::string> pytorch_keys() {
  std::set<std::string> keys;
  for (const char* stat : {"allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                           "active_bytes", "inactive_split_bytes", "requested_bytes"})
    for (const char* pool : {"all", "large_pool", "small_pool"})
      for (const char* metric : {"current", "peak", "allocated", "freed"})
        keys.insert(std::string(stat) + "." + pool + "." + metric);
  for (const char* key : {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                          "num_device_free", "max_split_size"})
    keys.insert(key);
  for (const char* stat : {"oversize_allocations", "oversize_segments"})
    for (const char* metric : {"current", "peak", "allocated", "freed"}) keys.insert(std::string(stat) + "." + metric);
  return keys;
}

/// Every key zero but `max_split_size` (-1: none), to be filled with the expected non-zero values.
stat_map zero_stats() {
  stat_map m;
  for (const std::string& k : pytorch_keys()) m[k] = 0;
  m["max_split_size"] = -1;
  return m;
}

void set_stat(stat_map& m, const std::string& prefix, std::int64_t current, std::int64_t peak, std::int64_t allocated,
              std::int64_t freed) {
  m[prefix + ".current"] = current;
  m[prefix + ".peak"] = peak;
  m[prefix + ".allocated"] = allocated;
  m[prefix + ".freed"] = freed;
}

/// Sets `stat.{all,large_pool}` (one pool, no segregator).
void set_one_pool(stat_map& m, const std::string& stat, std::int64_t current, std::int64_t peak, std::int64_t allocated,
                  std::int64_t freed) {
  set_stat(m, stat + ".all", current, peak, allocated, freed);
  set_stat(m, stat + ".large_pool", current, peak, allocated, freed);
}

void check_maps_equal(const stat_map& got, const stat_map& expected) {
  BOOST_TEST(got.size() == expected.size());
  for (const auto& [key, value] : expected) {
    const auto found = got.find(key);
    BOOST_TEST_CONTEXT("key " << key) {
      BOOST_TEST_REQUIRE((found != got.end()));
      BOOST_TEST(found->second == value);
    }
  }
}

using arena_t = toy_arena<checking_upstream>;

}  // namespace

BOOST_AUTO_TEST_SUITE(stats_policy)

BOOST_AUTO_TEST_CASE(memory_stats_has_exactly_pytorchs_keys) {
  alloy::stats<alloy::host_upstream> plain;
  alloy::stats<arena_t> arena;
  alloy::stats<toy_segregator<1_MiB, arena_t, arena_t>> pools;
  for (const stat_map& m : {alloy::memory_stats(plain), alloy::memory_stats(arena), alloy::memory_stats(pools)}) {
    std::set<std::string> keys;
    for (const auto& entry : m) keys.insert(entry.first);
    BOOST_TEST((keys == pytorch_keys()));
    BOOST_TEST(keys.size() == 9u * 3 * 4 + 6 + 2 * 4);
  }
}

// A fresh allocator reports zero everywhere.
BOOST_AUTO_TEST_CASE(fresh_allocator_is_all_zero) {
  alloy::stats<arena_t> a;
  check_maps_equal(alloy::memory_stats(a), zero_stats());
  const alloy::statistics s = a.statistics();
  BOOST_TEST(s.num_allocs == 0u);
  BOOST_TEST(s.bytes_in_use == 0u);
  BOOST_TEST(s.bytes_reserved == 0u);
  BOOST_TEST(s.fragmentation == 0.0);
}

// One pool (no segregator), an arena with 1 MiB segments and 256-byte rounding. Every field and
// every key, hand-computed.
BOOST_AUTO_TEST_CASE(scripted_sequence_one_pool) {
  alloy::stats<alloy::limited<arena_t>> a{
      alloy::limited<arena_t>{arena_t{checking_upstream{}, {.capacity = 4_MiB}}, {.bytes_limit = 3_MiB + 512_KiB}}};
  const alloy::block x = a.allocate(1000, 8);      // segment 1 (1 MiB): piece [0, 1024)
  const alloy::block y = a.allocate(300_KiB, 64);  // segment 1: [1024, 1024 + 300 KiB)
  const alloy::block z = a.allocate(2_MiB, 256);   // segment 2 (2 MiB), all of it
  BOOST_REQUIRE((x && y && z));
  a.deallocate(x);
  BOOST_TEST(!a.allocate(2_MiB, 8), "past the limit of limited<>");  // refused by limited<>
  const alloy::block w = a.allocate(200_KiB + 1, 8);                 // segment 1, after y
  BOOST_REQUIRE(w);
  const std::int64_t seg1 = 1_MiB, seg2 = 2_MiB;
  const std::int64_t w_size = 200_KiB + 1;

  alloy::statistics s = a.statistics();
  BOOST_TEST(s.num_allocs == 4u);
  BOOST_TEST(s.bytes_in_use == 300_KiB + 2_MiB + w_size);
  BOOST_TEST(s.peak_bytes_in_use == 300_KiB + 2_MiB + w_size);
  BOOST_TEST(s.largest_alloc_size == 2_MiB);
  BOOST_TEST(s.bytes_limit == 3_MiB + 512_KiB);
  BOOST_TEST(s.bytes_reserved == 3_MiB);
  BOOST_TEST(s.peak_bytes_reserved == 3_MiB);
  BOOST_TEST(s.bytes_reservable_limit == 0u);
  BOOST_TEST(s.bytes_inactive == 0u);
  BOOST_TEST(s.bytes_active == 0u);
  BOOST_TEST(s.peak_bytes_active == 0u);
  BOOST_TEST(s.bytes_reclaimed == 0u);
  BOOST_TEST(s.num_single_reclaims == 0u);
  BOOST_TEST(s.num_full_reclaims == 0u);
  BOOST_TEST(s.num_defragmentations == 0u);
  BOOST_TEST(s.bytes_defragged == 0u);
  BOOST_TEST(s.requested_bytes == s.bytes_in_use);
  // Segment 1 holds: free [0, 1024), y, w (rounded to 200 KiB + 256), free tail.
  const std::int64_t w_rounded = 200_KiB + 256;
  const std::int64_t tail = seg1 - 1024 - 300_KiB - w_rounded;
  BOOST_TEST(s.largest_free_block == static_cast<std::size_t>(tail));
  BOOST_TEST(s.fragmentation == 1.0 - static_cast<double>(tail) / static_cast<double>(tail + 1024),
             boost::test_tools::tolerance(1e-12));
  BOOST_TEST(s.num_alloc_retries == 0u);
  BOOST_TEST(s.num_ooms == 1u);
  BOOST_TEST(s.num_device_alloc == 2u);
  BOOST_TEST(s.num_device_free == 0u);

  stat_map expected = zero_stats();
  set_one_pool(expected, "allocation", 3, 3, 4, 1);
  set_one_pool(expected, "active", 3, 3, 4, 1);
  const std::int64_t in_use = 300_KiB + 2_MiB + w_size;
  const std::int64_t peak = in_use;  // x was freed before w came: 1000 + 300 KiB + 2 MiB < in_use
  for (const char* k : {"allocated_bytes", "active_bytes", "requested_bytes"})
    set_one_pool(expected, k, in_use, peak, in_use + 1000, 1000);
  set_one_pool(expected, "segment", 2, 2, 2, 0);
  set_one_pool(expected, "reserved_bytes", seg1 + seg2, seg1 + seg2, seg1 + seg2, 0);
  set_one_pool(expected, "inactive_split", 2, 2, 2, 0);
  set_one_pool(expected, "inactive_split_bytes", 1024 + tail, 1024 + tail, 1024 + tail, 0);
  expected["num_ooms"] = 1;
  expected["num_device_alloc"] = 2;
  check_maps_equal(alloy::memory_stats(a), expected);

  // Free everything and release: segments go back, inactive splits disappear.
  a.deallocate(y);
  a.deallocate(z);
  a.deallocate(alloy::block{nullptr, 0});  // an empty block is not counted
  a.deallocate(w);
  a.release();
  s = a.statistics();
  BOOST_TEST(s.bytes_in_use == 0u);
  BOOST_TEST(s.bytes_reserved == 0u);
  BOOST_TEST(s.peak_bytes_reserved == 3_MiB);
  BOOST_TEST(s.num_device_free == 2u);
  BOOST_TEST(s.largest_free_block == 0u);
  BOOST_TEST(s.fragmentation == 0.0);
  expected = zero_stats();
  set_one_pool(expected, "allocation", 0, 3, 4, 4);
  set_one_pool(expected, "active", 0, 3, 4, 4);
  for (const char* k : {"allocated_bytes", "active_bytes", "requested_bytes"})
    set_one_pool(expected, k, 0, peak, in_use + 1000, in_use + 1000);
  set_one_pool(expected, "segment", 0, 2, 2, 2);
  set_one_pool(expected, "reserved_bytes", 0, seg1 + seg2, seg1 + seg2, seg1 + seg2);
  // Observed at queries: 2 pieces went away.
  set_one_pool(expected, "inactive_split", 0, 2, 2, 2);
  set_one_pool(expected, "inactive_split_bytes", 0, 1024 + tail, 1024 + tail, 1024 + tail);
  expected["num_ooms"] = 1;
  expected["num_device_alloc"] = 2;
  expected["num_device_free"] = 2;
  check_maps_equal(alloy::memory_stats(a), expected);

  // reset_peak: peaks drop to current; reset_accumulated: totals restart.
  a.reset_peak();
  a.reset_accumulated();
  expected = zero_stats();
  check_maps_equal(alloy::memory_stats(a), expected);
  s = a.statistics();
  BOOST_TEST(s.num_allocs == 0u);
  BOOST_TEST(s.peak_bytes_in_use == 0u);
  BOOST_TEST(s.largest_alloc_size == 0u);
  BOOST_TEST(s.peak_bytes_reserved == 0u);
  BOOST_TEST(s.num_ooms == 0u);
  BOOST_TEST(s.num_device_alloc == 0u);
  BOOST_TEST(s.num_device_free == 0u);
}

// Two pools under a segregator-shaped part: small requests (<= 64 KiB) go to an arena of 256 KiB
// segments, large ones to an arena of 4 MiB segments.
BOOST_AUTO_TEST_CASE(scripted_sequence_two_pools) {
  using seg_t = toy_segregator<64_KiB, arena_t, arena_t>;
  alloy::stats<seg_t> a{seg_t{arena_t{checking_upstream{}, {.segment_size = 256_KiB}},
                              arena_t{checking_upstream{}, {.segment_size = 4_MiB, .max_split = 8_MiB}}}};
  static_assert(alloy::stats<seg_t>::has_pools);
  const alloy::block s1 = a.allocate(100, 16);         // small: 256 in segment S1
  const alloy::block s2 = a.allocate(64_KiB, 16);      // small: 64 KiB in S1
  const alloy::block l1 = a.allocate(64_KiB + 1, 16);  // large: 64 KiB + 256 in L1
  const alloy::block l2 = a.allocate(10_MiB, 256);     // large: own 10 MiB segment L2, oversize
  BOOST_REQUIRE((s1 && s2 && l1 && l2));
  a.deallocate(s1);
  a.deallocate(l2);

  stat_map expected = zero_stats();
  expected["max_split_size"] = 8_MiB;
  // allocation / active
  for (const char* k : {"allocation", "active"}) {
    set_stat(expected, std::string(k) + ".all", 2, 4, 4, 2);
    set_stat(expected, std::string(k) + ".small_pool", 1, 2, 2, 1);
    set_stat(expected, std::string(k) + ".large_pool", 1, 2, 2, 1);
  }
  const std::int64_t small_total = 100 + 64_KiB, large_total = 64_KiB + 1 + 10_MiB;
  for (const char* k : {"allocated_bytes", "active_bytes", "requested_bytes"}) {
    set_stat(expected, std::string(k) + ".all", 64_KiB + 64_KiB + 1, small_total + large_total,
             small_total + large_total, 100 + 10_MiB);
    set_stat(expected, std::string(k) + ".small_pool", 64_KiB, small_total, small_total, 100);
    set_stat(expected, std::string(k) + ".large_pool", 64_KiB + 1, large_total, large_total, 10_MiB);
  }
  set_stat(expected, "segment.all", 3, 3, 3, 0);
  set_stat(expected, "segment.small_pool", 1, 1, 1, 0);
  set_stat(expected, "segment.large_pool", 2, 2, 2, 0);
  set_stat(expected, "reserved_bytes.all", 256_KiB + 14_MiB, 256_KiB + 14_MiB, 256_KiB + 14_MiB, 0);
  set_stat(expected, "reserved_bytes.small_pool", 256_KiB, 256_KiB, 256_KiB, 0);
  set_stat(expected, "reserved_bytes.large_pool", 14_MiB, 14_MiB, 14_MiB, 0);
  // S1: free [0, 256), s2, free tail: 2 split pieces. L1: l1, free tail: 1. L2 wholly free: 0.
  const std::int64_t s_free = 256 + (256_KiB - 256 - 64_KiB), l_free = 4_MiB - (64_KiB + 256);
  set_stat(expected, "inactive_split.all", 3, 3, 3, 0);
  set_stat(expected, "inactive_split.small_pool", 2, 2, 2, 0);
  set_stat(expected, "inactive_split.large_pool", 1, 1, 1, 0);
  set_stat(expected, "inactive_split_bytes.all", s_free + l_free, s_free + l_free, s_free + l_free, 0);
  set_stat(expected, "inactive_split_bytes.small_pool", s_free, s_free, s_free, 0);
  set_stat(expected, "inactive_split_bytes.large_pool", l_free, l_free, l_free, 0);
  set_stat(expected, "oversize_allocations", 0, 1, 1, 1);
  set_stat(expected, "oversize_segments", 1, 1, 1, 0);  // L2 (10 MiB > 8 MiB), still held
  expected["num_device_alloc"] = 3;
  check_maps_equal(alloy::memory_stats(a), expected);

  const alloy::statistics st = a.statistics();
  BOOST_TEST(st.largest_free_block == 10_MiB);  // L2, wholly free
  BOOST_TEST(st.largest_alloc_size == 10_MiB);
  BOOST_TEST(st.bytes_reserved == 256_KiB + 14_MiB);

  const std::string summary = alloy::memory_summary(a);
  BOOST_TEST_MESSAGE(summary);
  BOOST_TEST(summary.find("from small pool") != std::string::npos);
  BOOST_TEST(summary.find("Allocated memory") != std::string::npos);
  BOOST_TEST(summary.find("Reserved segments") != std::string::npos);
  BOOST_TEST(summary.find("Reservable limit: none") != std::string::npos, "unbounded arenas have no limit");
  BOOST_TEST(st.bytes_reservable_limit == 0u);
  a.release();  // L2 goes back: the oversize segment is gone, seen at the next query
  const stat_map after = alloy::memory_stats(a);
  BOOST_TEST(after.at("oversize_segments.current") == 0);
  BOOST_TEST(after.at("oversize_segments.peak") == 1);
  BOOST_TEST(after.at("oversize_segments.freed") == 1);
  a.deallocate(s2);
  a.deallocate(l1);
}

// The OOM report and the edge's exception: how much, limit, in use, reserved, largest free block,
// fragmentation.
BOOST_AUTO_TEST_CASE(out_of_memory_explains_why) {
  alloy::stats<alloy::limited<arena_t>> a{alloy::limited<arena_t>{arena_t{}, {.bytes_limit = 2_MiB}}};
  const alloy::block x = a.allocate(512_KiB, 256);
  const alloy::block y = a.allocate(256_KiB, 256);
  a.deallocate(x);  // segment: free 512 KiB, y, free 256 KiB
  try {
    alloy::detail::allocate_or_throw(a, 3_MiB, 256);
    BOOST_FAIL("expected out_of_memory");
  } catch (const alloy::out_of_memory& e) {
    const alloy::oom_report& r = e.report();
    BOOST_TEST(r.requested == 3_MiB);
    BOOST_TEST(r.alignment == 256u);
    BOOST_TEST(r.limit == 2_MiB);
    BOOST_TEST(r.in_use == 256_KiB);
    BOOST_TEST(r.reserved == 1_MiB);
    BOOST_TEST(r.largest_free_block == 512_KiB);
    BOOST_TEST(r.fragmentation == 1.0 - 512.0 / 768.0, boost::test_tools::tolerance(1e-12));
    const std::string what = e.what();
    BOOST_TEST(what.find("3.00 MiB") != std::string::npos);
    BOOST_TEST(what.find("limit 2.00 MiB") != std::string::npos);
    BOOST_TEST(what.find("in use 256.00 KiB") != std::string::npos);
    BOOST_TEST(what.find("reserved 1.00 MiB") != std::string::npos);
    BOOST_TEST(what.find("largest free block 512.00 KiB") != std::string::npos);
    BOOST_TEST(what.find("fragmentation 33.3%") != std::string::npos);
  }
  BOOST_TEST(a.statistics().num_ooms == 1u);
  a.deallocate(y);
}

// A bad alignment is a bad argument, not an OOM; a size no memory could hold counts, as in PyTorch.
BOOST_AUTO_TEST_CASE(what_counts_as_out_of_memory) {
  alloy::stats<alloy::limited<arena_t>> a{alloy::limited<arena_t>{arena_t{}, {.bytes_limit = 2_MiB}}};
  for (const std::size_t alignment : {0u, 3u, 1000u}) BOOST_TEST(!a.allocate(64, alignment));
  BOOST_TEST(a.statistics().num_ooms == 0u);
  BOOST_TEST(!a.allocate(std::numeric_limits<std::size_t>::max(), 8));
  BOOST_TEST(!a.allocate(3_MiB, 256));  // past the limit
  BOOST_TEST(a.statistics().num_ooms == 2u);
  BOOST_TEST(a.statistics().num_allocs == 0u);
}

// Stream-ordered calls are forwarded and counted like the others.
BOOST_AUTO_TEST_CASE(stream_ordered_calls_are_counted) {
  alloy::stats<arena_t> a;
  static_assert(alloy::stream_ordered_allocator<alloy::stats<arena_t>, int>);
  static_assert(!alloy::stream_ordered_allocator<alloy::stats<alloy::host_upstream>, int>);
  const alloy::block b = a.allocate(5000, 256, 7);
  BOOST_REQUIRE(b);
  BOOST_TEST(a.bytes_in_use() == 5000u);
  BOOST_TEST(alloy::memory_stats(a)["allocation.all.current"] == 1);
  a.deallocate(b, 7);
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(a.inner().stream_calls() == 2u);
  BOOST_TEST(a.statistics().num_allocs == 1u);
}

// Capabilities pass through exactly.
BOOST_AUTO_TEST_CASE(capabilities_pass_through) {
  using S = alloy::stats<arena_t>;
  static_assert(alloy::owning_allocator<S> && alloy::releasing_allocator<S> && alloy::reserving_allocator<S> &&
                alloy::introspectable_allocator<S> && alloy::counting_allocator<S>);
  using P = alloy::stats<alloy::host_upstream>;
  static_assert(!alloy::owning_allocator<P> && !alloy::releasing_allocator<P> && !alloy::reserving_allocator<P> &&
                !alloy::introspectable_allocator<P> && !alloy::counting_allocator<P> && !alloy::movable_allocator<P>);
  using M = alloy::stats<alloy::host_spill_reclaimer<arena_t, alloy::host_upstream>>;
  static_assert(alloy::movable_allocator<M> && alloy::movable_counting_allocator<M>);
  static_assert(alloy::has_part<arena_t, alloy::stats<alloy::limited<arena_t>>>);
}

// Movable blocks: counted in use; active/inactive/reclaim fields come from the movable part.
BOOST_AUTO_TEST_CASE(movable_blocks_and_lms_fields) {
  // (A raw checking upstream as the device: host_spill_reclaimer's introspection over a raw
  // introspectable device does not compile at the time of writing.)
  using device_t = alloy::limited<checking_upstream>;
  using reclaimer_t = alloy::host_spill_reclaimer<device_t, alloy::host_upstream>;
  alloy::stats<reclaimer_t> a{
      reclaimer_t{device_t{checking_upstream{}, {.bytes_limit = 1_MiB}}, alloy::host_upstream{}}};
  const alloy::handle h1 = a.allocate_movable(400_KiB);
  const alloy::handle h2 = a.allocate_movable(300_KiB);
  BOOST_REQUIRE((h1 && h2));
  void* p1 = a.lock(h1);
  BOOST_REQUIRE(p1 != nullptr);
  alloy::statistics s = a.statistics();
  BOOST_TEST(s.num_allocs == 2u);
  BOOST_TEST(s.bytes_in_use == 700_KiB);
  BOOST_TEST(s.bytes_active == 400_KiB);
  BOOST_TEST(s.peak_bytes_active == 400_KiB);
  BOOST_TEST(s.bytes_inactive == 300_KiB);
  a.unlock(h1);
  // 350 KiB do not fit under the 1 MiB limit: h1, the smallest unlocked block that suffices, is
  // spilled to host (a single reclaim).
  const alloy::block raw = a.allocate(350_KiB, 256);
  BOOST_REQUIRE(raw);
  s = a.statistics();
  BOOST_TEST(s.num_single_reclaims == 1u);
  BOOST_TEST(s.bytes_reclaimed == 400_KiB);
  BOOST_TEST(s.bytes_active == 0u);
  BOOST_TEST(s.peak_bytes_active == 400_KiB);
  BOOST_TEST(s.bytes_in_use == 1050_KiB);
  BOOST_TEST(s.bytes_inactive == 300_KiB);
  a.reset_peak();
  BOOST_TEST(a.statistics().peak_bytes_active == 0u);
  a.reset_accumulated();
  BOOST_TEST(a.statistics().bytes_reclaimed == 0u);
  BOOST_TEST(a.statistics().num_single_reclaims == 0u);
  a.deallocate(raw);
  a.deallocate(h1);
  a.deallocate(h2);
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_CHECK_THROW(a.deallocate(h2), alloy::logic_error);  // stale handle: nothing counted
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(alloy::memory_stats(a)["allocation.all.freed"] == 3);
}

// ---- randomized invariants ------------------------------------------------------------------

template <class A>
void check_invariants(A& a, const std::vector<alloy::block>& live, std::size_t true_peak) {
  std::size_t sum = 0;
  for (const alloy::block& b : live) sum += b.size;
  const alloy::statistics s = a.statistics();
  BOOST_TEST(s.bytes_in_use == sum);
  BOOST_TEST(s.requested_bytes == sum);
  BOOST_TEST(s.peak_bytes_in_use == true_peak);
  BOOST_TEST(s.peak_bytes_in_use >= s.bytes_in_use);
  BOOST_TEST(s.peak_bytes_reserved >= s.bytes_reserved);
  BOOST_TEST(s.bytes_reserved >= s.bytes_in_use);
  BOOST_TEST(s.bytes_reserved == a.reserved_bytes());
  BOOST_TEST(s.largest_free_block <= s.bytes_reserved - s.bytes_in_use);
  BOOST_TEST((s.fragmentation >= 0.0 && s.fragmentation < 1.0));
  const stat_map m = alloy::memory_stats(a);
  for (const auto& [key, value] : m) {
    const auto dot = key.rfind(".current");
    if (dot == std::string::npos || dot + 8 != key.size()) continue;
    const std::string prefix = key.substr(0, dot);
    BOOST_TEST_CONTEXT("statistic " << prefix) {
      BOOST_TEST(m.at(prefix + ".allocated") - m.at(prefix + ".freed") == value);
      BOOST_TEST(m.at(prefix + ".peak") >= value);
      BOOST_TEST(value >= 0);
    }
  }
  for (const char* pool : {"all", "small_pool", "large_pool"}) {
    const std::string p = pool;
    BOOST_TEST(m.at("reserved_bytes." + p + ".current") >= m.at("allocated_bytes." + p + ".current"));
    BOOST_TEST(m.at("segment." + p + ".current") <= m.at("reserved_bytes." + p + ".current"));
  }
  BOOST_TEST(m.at("allocated_bytes.all.current") ==
             m.at("allocated_bytes.small_pool.current") + m.at("allocated_bytes.large_pool.current"));
  BOOST_TEST(m.at("allocation.all.current") == static_cast<std::int64_t>(live.size()));
  BOOST_TEST(m.at("reserved_bytes.all.current") ==
             m.at("reserved_bytes.small_pool.current") + m.at("reserved_bytes.large_pool.current"));
  BOOST_TEST(m.at("segment.all.current") == m.at("num_device_alloc") - m.at("num_device_free"));
}

template <class A>
void random_workload(A& a, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<alloy::block> live;
  std::size_t in_use = 0, peak = 0;
  for (int op = 0; op < 6000; ++op) {
    const int dice = static_cast<int>(rng() % 100);
    if (dice < 55 && live.size() < 200) {
      const std::size_t bytes = static_cast<std::size_t>(std::exp2(std::uniform_real_distribution<>(0, 22)(rng)));
      const alloy::block b = a.allocate(bytes, std::size_t{1} << (rng() % 9));
      if (b) {
        live.push_back(b);
        in_use += b.size;
        peak = std::max(peak, in_use);
      }
    } else if (dice < 98 && !live.empty()) {
      const std::size_t victim = rng() % live.size();
      in_use -= live[victim].size;
      a.deallocate(live[victim]);
      live[victim] = live.back();
      live.pop_back();
    } else {
      a.release();
    }
    if (op % 97 == 0) check_invariants(a, live, peak);
  }
  check_invariants(a, live, peak);
  for (const alloy::block& b : live) a.deallocate(b);
  live.clear();
  a.release();
  check_invariants(a, live, peak);
  BOOST_TEST(a.statistics().bytes_reserved == 0u);
}

BOOST_AUTO_TEST_CASE(randomized_invariants_one_pool) {
  alloy::stats<arena_t> a{arena_t{checking_upstream{}, {.segment_size = 2_MiB, .capacity = 96_MiB}}};
  random_workload(a, 1);
}

BOOST_AUTO_TEST_CASE(randomized_invariants_two_pools) {
  using seg_t = toy_segregator<1_MiB, arena_t, arena_t>;
  alloy::stats<seg_t> a{seg_t{arena_t{checking_upstream{}, {.segment_size = 2_MiB, .capacity = 32_MiB}},
                              arena_t{checking_upstream{}, {.segment_size = 20_MiB, .capacity = 96_MiB}}}};
  random_workload(a, 2);
}

// The same over the real arena, segregator and pool, when they are there.
BOOST_AUTO_TEST_CASE(randomized_invariants_best_fit_arena) {
  using real_arena = alloy::best_fit_arena<checking_upstream>;
  alloy::stats<real_arena> a{real_arena{checking_upstream{}, {.max_split_size = 4_MiB}}};
  random_workload(a, 3);
  BOOST_TEST(alloy::memory_stats(a)["max_split_size"] == static_cast<std::int64_t>(4_MiB));
  BOOST_TEST(alloy::memory_stats(a)["oversize_allocations.allocated"] == 0);  // none above 4 MiB
}

BOOST_AUTO_TEST_CASE(randomized_invariants_default_allocator) {
  using heap = alloy::default_allocator<checking_upstream>;
  static_assert(alloy::stats<heap>::has_pools, "default_allocator is a segregator");
  alloy::stats<heap> a;
  random_workload(a, 4);
  const stat_map m = alloy::memory_stats(a);
  BOOST_TEST(m.at("allocation.small_pool.allocated") > 0);
  BOOST_TEST(m.at("allocation.large_pool.allocated") > 0);
  BOOST_TEST(m.at("segment.small_pool.allocated") > 0);
  BOOST_TEST(m.at("segment.large_pool.allocated") > 0);
}

BOOST_AUTO_TEST_CASE(statistics_agree_with_the_arena) {
  using real_arena = alloy::best_fit_arena<checking_upstream>;
  alloy::stats<real_arena> a;
  std::vector<alloy::block> live;
  for (int i = 0; i < 64; ++i) live.push_back(a.allocate(1000 + 3000 * static_cast<std::size_t>(i), 256));
  for (std::size_t i = 0; i < live.size(); i += 3) a.deallocate(live[i]);
  const alloy::statistics s = a.statistics();
  BOOST_TEST(s.bytes_reserved == a.inner().reserved_bytes());
  BOOST_TEST(s.requested_bytes == a.inner().requested_bytes());
  BOOST_TEST(s.largest_free_block == a.inner().largest_free_block());
  BOOST_TEST(s.num_device_alloc == a.inner().counters().num_device_alloc);
  BOOST_TEST(s.fragmentation > 0.0);
  const alloy::memory_snapshot snap = alloy::snapshot(a);
  BOOST_TEST(snap.used_bytes() == a.inner().bytes_in_use());
  BOOST_TEST(snap.free_bytes() == a.inner().free_bytes());
  for (std::size_t i = 0; i < live.size(); ++i)
    if (i % 3 != 0) a.deallocate(live[i]);
}

// ---- traces -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(trace_is_fastais_gpumemtrace) {
  alloy::stats<alloy::host_upstream> a;
  std::ostringstream out;
  alloy::memory_trace t{a, {.ctx = "fit", .out = &out}};
  const alloy::block x = a.allocate(10_MiB, 256);
  const alloy::block y = a.allocate(5_MiB, 256);
  a.deallocate(y);
  BOOST_TEST(t.used_delta() == static_cast<std::int64_t>(10_MiB));
  BOOST_TEST(t.peak_delta() == static_cast<std::int64_t>(5_MiB));  // 15 - 0 - 10
  t.report("step 1");
  BOOST_TEST(out.str() == "\xE2\x96\xB3Used Peaked MB:     10      5 (fit: step 1)\n");
  t.report_and_reset();
  BOOST_TEST(t.used_delta() == 0);
  BOOST_TEST(t.peak_delta() == 0);
  a.deallocate(x);  // net negative: peak_delta counts the blip above the start, no subtraction
  const alloy::block z = a.allocate(1_MiB, 256);
  BOOST_TEST(t.used_delta() == -static_cast<std::int64_t>(9_MiB));
  BOOST_TEST(t.peak_delta() == 0);
  t.stop();
  a.deallocate(z);
  BOOST_TEST(t.used_delta() == -static_cast<std::int64_t>(9_MiB), "frozen after stop()");
  t.silent();
  t.report("not printed");
  t.silent(false);
  t.report();
  BOOST_TEST(out.str().find("not printed") == std::string::npos);
  BOOST_TEST(out.str().find("\xE2\x96\xB3Used Peaked MB:     10      5 (fit)\n") != std::string::npos);
  BOOST_TEST(out.str().find("    -9      0 (fit)\n") != std::string::npos);
  t.start();
  BOOST_TEST(t.used_delta() == 0);
}

// MiB figures of a thousand and more are grouped with commas, as fastai prints them; negative
// ones too. (The memory is never touched: host pages that are not written cost nothing.)
BOOST_AUTO_TEST_CASE(trace_report_groups_thousands) {
  alloy::stats<alloy::host_upstream> a;
  std::ostringstream out;
  alloy::memory_trace t{a, {.out = &out}};
  const alloy::block big = a.allocate(1234_MiB, 256);
  BOOST_REQUIRE(big);
  t.report_and_reset();
  a.deallocate(big);
  t.report();
  BOOST_TEST(out.str() ==
             "\xE2\x96\xB3Used Peaked MB:  1,234      0\n"
             "\xE2\x96\xB3Used Peaked MB: -1,234      0\n");
}

// Nested and overlapping traces, started, reset, stopped and destroyed at random, against a
// brute-force reference that looks at every step.
BOOST_AUTO_TEST_CASE(traces_against_brute_force) {
  using synced = alloy::synchronized<alloy::stats<alloy::host_upstream>>;  // traces find stats through the lock
  synced a;
  struct reference {
    std::int64_t start = 0, peak = 0, used = 0, peaked = 0;
    bool running = true;
    void freeze(std::int64_t now) {
      used = now - start;
      peaked = peak - start;
      if (peaked < 0) {
        peaked = 0;
      } else if (used > 0) {
        peaked -= used;
      }
    }
  };
  std::mt19937_64 rng(7);
  std::vector<std::unique_ptr<alloy::memory_trace>> traces;
  std::vector<reference> refs;
  std::vector<alloy::block> live;
  std::int64_t in_use = 0;
  std::size_t checks = 0;
  for (int op = 0; op < 20000; ++op) {
    const int dice = static_cast<int>(rng() % 100);
    if (dice < 45) {
      const alloy::block b = a.allocate(1 + rng() % 100'000, 8);
      live.push_back(b);
      in_use += static_cast<std::int64_t>(b.size);
    } else if (dice < 88) {
      if (live.empty()) continue;
      const std::size_t v = rng() % live.size();
      in_use -= static_cast<std::int64_t>(live[v].size);
      a.deallocate(live[v]);
      live[v] = live.back();
      live.pop_back();
    } else if (dice < 91 && traces.size() < 12) {
      traces.push_back(std::make_unique<alloy::memory_trace>(a, alloy::memory_trace::options{.silent = true}));
      refs.push_back({in_use, in_use, 0, 0, true});
    } else if (!traces.empty()) {
      const std::size_t i = rng() % traces.size();
      const int what = dice % 5;
      if (what == 0) {
        traces.erase(traces.begin() + static_cast<std::ptrdiff_t>(i));
        refs.erase(refs.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (what == 1) {
        traces[i]->reset();  // as fastai: a stopped trace keeps its frozen deltas
        refs[i].start = refs[i].peak = in_use;
      } else if (what == 2) {
        traces[i]->stop();
        if (refs[i].running) refs[i].freeze(in_use);
        refs[i].running = false;
      } else if (what == 3) {
        traces[i]->start();
        refs[i] = {in_use, in_use, 0, 0, true};
      } else {
        const auto [used, peaked] = traces[i]->data();
        if (refs[i].running) refs[i].freeze(in_use);
        BOOST_TEST(used == refs[i].used);
        BOOST_TEST(peaked == refs[i].peaked);
        ++checks;
      }
    }
    for (reference& r : refs)
      if (r.running) r.peak = std::max(r.peak, in_use);
  }
  for (std::size_t i = 0; i < traces.size(); ++i) {
    if (refs[i].running) refs[i].freeze(in_use);
    BOOST_TEST(traces[i]->used_delta() == refs[i].used);
    BOOST_TEST(traces[i]->peak_delta() == refs[i].peaked);
  }
  BOOST_TEST(checks > 100u);
  for (const alloy::block& b : live) a.deallocate(b);
}

BOOST_AUTO_TEST_CASE(traces_follow_a_moved_allocator_and_survive_its_end) {
  auto a = std::make_unique<alloy::stats<alloy::host_upstream>>();
  alloy::memory_trace t{*a};
  const alloy::block x = a->allocate(1_MiB, 8);
  alloy::stats<alloy::host_upstream> moved = std::move(*a);
  a.reset();
  const alloy::block y = moved.allocate(2_MiB, 8);
  moved.deallocate(y);
  BOOST_TEST(t.used_delta() == static_cast<std::int64_t>(1_MiB));
  BOOST_TEST(t.peak_delta() == static_cast<std::int64_t>(2_MiB));
  moved.deallocate(x);
  {
    alloy::stats<alloy::host_upstream> gone;
    alloy::memory_trace orphan{gone};
    const alloy::block z = gone.allocate(100, 8);
    gone.deallocate(z);
    // `gone` ends after `orphan` here; the other order is checked below.
  }
  alloy::memory_trace* orphan = nullptr;
  {
    alloy::stats<alloy::host_upstream> gone;
    orphan = new alloy::memory_trace{gone};
    const alloy::block z = gone.allocate(4096, 8);
    gone.deallocate(z);
  }
  BOOST_TEST(orphan->peak_delta() == 4096);
  delete orphan;
}

// ---- snapshot -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(snapshot_json_and_svg) {
  using seg_t = toy_segregator<64_KiB, arena_t, arena_t>;
  alloy::stats<seg_t> a{seg_t{arena_t{checking_upstream{}, {.segment_size = 512_KiB}},
                              arena_t{checking_upstream{}, {.segment_size = 8_MiB}}}};
  std::mt19937_64 rng(11);
  std::vector<alloy::block> live;
  // A fragmented heap: many blocks, every other one freed.
  for (int i = 0; i < 160; ++i) {
    const std::size_t bytes = i % 4 == 0 ? 256 + rng() % 60_KiB : 64_KiB + rng() % 700_KiB;
    live.push_back(a.allocate(bytes, 256));
  }
  for (std::size_t i = 0; i < live.size(); i += 2) a.deallocate(live[i]);
  const alloy::block big = a.allocate(12_MiB, 256);  // one segment of its own, full
  const alloy::memory_snapshot snap = alloy::snapshot(a);
  const alloy::statistics s = a.statistics();
  BOOST_TEST(snap.reserved_bytes() == s.bytes_reserved);
  BOOST_TEST(snap.largest_free_block() == s.largest_free_block);
  BOOST_TEST(snap.fragmentation() == s.fragmentation, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(snap.requested_bytes() == s.requested_bytes);
  std::size_t blocks = 0;
  for (const auto& seg : snap.segments) {
    BOOST_TEST((seg.pool == "small" || seg.pool == "large"));
    std::uintptr_t next = seg.address;
    for (const auto& p : seg.blocks) {
      BOOST_TEST(p.address == next, "pieces tile their segment");
      next += p.size;
      if (p.state != alloy::block_state::free) ++blocks;
    }
    BOOST_TEST(next == seg.address + seg.size);
  }
  BOOST_TEST(blocks == 81u);
  const std::string json = snap.to_json();
  BOOST_TEST(json.find("\"segments\": [") != std::string::npos);
  BOOST_TEST(json.find("\"state\": \"allocated\"") != std::string::npos);
  BOOST_TEST(json.find("\"requested\": 12582912") != std::string::npos);
  const std::string svg = snap.to_svg();
  BOOST_TEST(svg.rfind("<svg", 0) == 0u);
  BOOST_TEST(svg.find("</svg>") != std::string::npos);
  BOOST_TEST(svg.find("free, trapped between blocks") != std::string::npos);
  if (const char* path = std::getenv("ALLOY_SNAPSHOT_SVG")) std::ofstream(path) << svg;
  if (const char* path = std::getenv("ALLOY_SNAPSHOT_JSON")) std::ofstream(path) << json;
  for (std::size_t i = 1; i < live.size(); i += 2) a.deallocate(live[i]);
  a.deallocate(big);
  a.release();
  BOOST_TEST(alloy::snapshot(a).segments.empty());
}

BOOST_AUTO_TEST_CASE(snapshot_through_synchronized_and_empty_json) {
  alloy::synchronized<alloy::stats<arena_t>> a;
  const alloy::block b = a.allocate(1000, 8);
  const alloy::memory_snapshot snap = alloy::snapshot(a);
  BOOST_REQUIRE(snap.segments.size() == 1u);
  BOOST_TEST(snap.segments[0].pool == "");
  BOOST_TEST(snap.segments[0].blocks.size() == 2u);
  BOOST_TEST(snap.segments[0].blocks[0].requested == 1000u);
  a.deallocate(b);
  BOOST_TEST(alloy::statistics_of(a).num_allocs == 1u);
  BOOST_TEST(alloy::memory_snapshot{}.to_json().find("\"segments\": []") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the conformance suite ------------------------------------------------------------------

namespace recipes {

// stats<> adds nothing size-specific: requests up to 64 MiB keep the program short.
struct stats_plain {
  template <class U>
  using type = alloy::stats<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up)};
  }
  static alloy::testing::conformance_options options() { return {.max_size = 64_MiB}; }
};

struct stats_arena {
  template <class U>
  using type = alloy::stats<toy_arena<U>>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{toy_arena<U>{std::move(up), {.segment_size = 4_MiB}}};
  }
  static alloy::testing::conformance_options options() { return {.max_size = 64_MiB, .random_ops = 5'000}; }
};

struct stats_pools {
  template <class U>
  using type = alloy::stats<toy_segregator<64_KiB, U, toy_arena<U>>>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{toy_segregator<64_KiB, U, toy_arena<U>>{up, toy_arena<U>{up, {.segment_size = 8_MiB}}}};
  }
  static alloy::testing::conformance_options options() { return {.max_size = 64_MiB, .random_ops = 5'000}; }
};

}  // namespace recipes

using stats_recipes = std::tuple<recipes::stats_plain, recipes::stats_arena, recipes::stats_pools>;

BOOST_AUTO_TEST_SUITE(stats_conformance)

BOOST_AUTO_TEST_CASE_TEMPLATE(conformance, Recipe, stats_recipes) {
  alloy::testing::conformance_suite<Recipe>();
  // And the statistics agree with the work done: after the suite, nothing is in use.
  auto a = Recipe::make(checking_upstream{});
  alloy::testing::check_random_workload(a, alloy::testing::options_of<Recipe>());
  const alloy::statistics s = a.statistics();
  BOOST_TEST(s.bytes_in_use == 0u);
  BOOST_TEST(s.num_allocs > 0u);
  const stat_map m = alloy::memory_stats(a);
  BOOST_TEST(m.at("allocation.all.allocated") == m.at("allocation.all.freed"));
}

BOOST_AUTO_TEST_SUITE_END()
