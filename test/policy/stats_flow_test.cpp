// SPDX-License-Identifier: Apache-2.0
// Statistics flow one way: composites add up their parts' figures
// (`detail::figures_of`), and `stats<>` asks only its inner part, so over a `synchronized<>` it
// reads nothing below the lock without holding it. Exact figures on scripted sequences.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include <alloy/alloy.hpp>
#include <alloy/detail/figures.hpp>
#include <alloy/literals.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/fallback.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>
#include <alloy/policy/limited.hpp>
#include <alloy/policy/segregator.hpp>
#include <alloy/policy/sharded.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/snapshot.hpp>

#include "../support/checking_upstream.hpp"
#include "stats_toys.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;
using alloy::testing::toy_arena;

namespace {

/// A mutex that records whether it is held (one thread: the test's). Locking it twice would be
/// a deadlock with a real mutex, so that is recorded too.
struct recording_mutex {
  static inline int held = 0;
  static inline int relocks = 0;
  void lock() noexcept {
    if (held != 0) ++relocks;
    ++held;
  }
  void unlock() noexcept { --held; }
};

/// `toy_arena` whose every query counts the times it was read while `recording_mutex` was not
/// held: what `stats<>` reads below a `synchronized<..., recording_mutex>`.
class watched_arena : public toy_arena<checking_upstream> {
  using base = toy_arena<checking_upstream>;

 public:
  static inline int unlocked_reads = 0;
  static inline int reads = 0;
  static inline bool watching = true;  ///< off while the unlocked reference composition runs

  using base::base;
  watched_arena() = default;
  watched_arena(watched_arena&&) noexcept = default;

  std::size_t reserved_bytes() const noexcept { return seen(), base::reserved_bytes(); }
  alloy::allocator_counters counters() const noexcept { return seen(), base::counters(); }
  std::size_t max_split_size() const noexcept { return seen(), base::max_split_size(); }
  std::size_t bytes_reservable_limit() const noexcept { return seen(), std::size_t{64} << 20; }
  template <class F>
  void for_each_block(F&& visit) const {
    seen();
    base::for_each_block(visit);
  }

 private:
  static void seen() noexcept {
    if (!watching) return;
    ++reads;
    if (recording_mutex::held == 0) ++unlocked_reads;
  }
};

using seg_t = alloy::segregator<64_KiB, watched_arena, watched_arena>;

seg_t make_segregator() {
  return seg_t{watched_arena{checking_upstream{}, {.segment_size = 256_KiB}},
               watched_arena{checking_upstream{}, {.segment_size = 4_MiB, .max_split = 8_MiB}}};
}

/// The script of `scripted_sequence_two_pools` (stats_test.cpp): two blocks in each pool, one of
/// each freed, one oversize block in its own segment.
template <class A>
void run_script(A& a) {
  const alloy::block s1 = a.allocate(100, 16);
  const alloy::block s2 = a.allocate(64_KiB, 16);
  const alloy::block l1 = a.allocate(64_KiB + 1, 16);
  const alloy::block l2 = a.allocate(10_MiB, 256);
  BOOST_REQUIRE((s1 && s2 && l1 && l2));
  a.deallocate(s1);
  a.deallocate(l2);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(stats_flow)

// Old stats<> walked parts() itself: it read the segregator's sides (pools) and the arenas' max
// split size below the synchronized<> without its lock. Now every read goes through the lock.
BOOST_AUTO_TEST_CASE(stats_reads_below_a_synchronized_only_under_its_lock) {
  using locked_t = alloy::synchronized<seg_t, recording_mutex>;
  watched_arena::unlocked_reads = watched_arena::reads = 0;
  recording_mutex::relocks = 0;
  alloy::stats<locked_t> a{locked_t{make_segregator()}};
  static_assert(alloy::stats<locked_t>::has_pools, "pools are seen through the synchronized<>");
  run_script(a);

  // The same script without the lock: the figures must be exactly the same.
  watched_arena::watching = false;
  alloy::stats<seg_t> reference{make_segregator()};
  run_script(reference);
  const std::map<std::string, std::int64_t> expected = alloy::memory_stats(reference);
  const alloy::statistics r = reference.statistics();
  const std::string reference_summary = alloy::memory_summary(reference);
  watched_arena::watching = true;

  const std::map<std::string, std::int64_t> got = alloy::memory_stats(a);
  BOOST_TEST(got == expected);
  // A few of them by hand (see stats_test.cpp's two-pool script).
  BOOST_TEST(got.at("reserved_bytes.all.current") == static_cast<std::int64_t>(256_KiB + 14_MiB));
  BOOST_TEST(got.at("reserved_bytes.small_pool.current") == static_cast<std::int64_t>(256_KiB));
  BOOST_TEST(got.at("reserved_bytes.large_pool.current") == static_cast<std::int64_t>(14_MiB));
  BOOST_TEST(got.at("segment.small_pool.current") == 1);
  BOOST_TEST(got.at("segment.large_pool.current") == 2);
  BOOST_TEST(got.at("inactive_split.small_pool.current") == 2);
  BOOST_TEST(got.at("inactive_split.large_pool.current") == 1);
  BOOST_TEST(got.at("oversize_segments.current") == 1);
  BOOST_TEST(got.at("oversize_allocations.allocated") == 1);
  BOOST_TEST(got.at("max_split_size") == static_cast<std::int64_t>(8_MiB));

  const alloy::statistics s = a.statistics();
  BOOST_TEST(s.bytes_reserved == 256_KiB + 14_MiB);
  BOOST_TEST(s.peak_bytes_reserved == r.peak_bytes_reserved);
  BOOST_TEST(s.largest_free_block == 10_MiB);
  BOOST_TEST(s.largest_free_block == r.largest_free_block);
  BOOST_TEST(s.fragmentation == r.fragmentation);
  BOOST_TEST(s.num_device_alloc == 3u);
  BOOST_TEST(s.bytes_reservable_limit == 64_MiB);  // each side's; the smallest
  BOOST_TEST(alloy::memory_summary(a) == reference_summary);

  const alloy::memory_snapshot snap = alloy::snapshot(a);
  BOOST_TEST(snap.segments.size() == 3u);  // S1 in the small pool; L1 and L2 in the large one
  a.reset_peak();
  a.reset_accumulated();
  const alloy::statistics after = a.statistics();
  BOOST_TEST(after.num_device_alloc == 0u);
  BOOST_TEST(after.peak_bytes_reserved == 256_KiB + 14_MiB);

  BOOST_TEST(watched_arena::reads > 0, "the test watches something");
  BOOST_TEST(watched_arena::unlocked_reads == 0, "stats<> read below the lock without holding it");
  BOOST_TEST(recording_mutex::relocks == 0);
  BOOST_TEST(recording_mutex::held == 0);
}

// Composites add up their parts' figures: counters and reserved bytes are sums, limits the
// smallest, the pools are the segregator's sides, and the first part on each path that reports
// a figure answers for what is below it.
BOOST_AUTO_TEST_CASE(figures_add_up_through_composites) {
  using arena_t = toy_arena<checking_upstream>;
  using fb_t = alloy::fallback<arena_t, alloy::limited<arena_t>>;
  fb_t fb{arena_t{checking_upstream{}, {.segment_size = 1_MiB, .capacity = 1_MiB, .max_split = 4_MiB}},
          alloy::limited<arena_t>{arena_t{checking_upstream{}, {.segment_size = 2_MiB, .max_split = 2_MiB}},
                                  {.bytes_limit = 3_MiB}}};
  const alloy::block a = fb.allocate(512_KiB, 256);   // primary: its one segment
  const alloy::block b = fb.allocate(768_KiB, 256);   // primary full (capacity): secondary
  const alloy::block c = fb.allocate(1536_KiB, 256);  // secondary: a second 2 MiB segment
  BOOST_REQUIRE((a && b && c));

  const alloy::detail::figures f = alloy::detail::figures_of(fb, {.blocks = true, .max_split = 1_MiB});
  BOOST_TEST(f.all.knows_reserved);
  BOOST_TEST(f.all.reserved == 1_MiB + 4_MiB);
  BOOST_TEST(f.all.counters.num_device_alloc == 3u);
  BOOST_TEST(f.all.counters.num_device_free == 0u);
  BOOST_TEST(f.max_split == 2_MiB);      // the smaller of 4 and 2 MiB
  BOOST_TEST(f.bytes_limit == 3_MiB);    // limited's own
  BOOST_TEST(f.reservable_limit == 0u);  // no part has one
  BOOST_TEST(!f.has_pools);
  BOOST_TEST(f.all.blocks.known);
  // Free pieces: primary [512 KiB used | 512 KiB free]; the secondary's two 2 MiB segments
  // [768 KiB used | 1280 KiB free] and [1536 KiB used | 512 KiB free]. Above 1 MiB: those two.
  BOOST_TEST(f.all.blocks.inactive_splits == 3);
  BOOST_TEST(f.all.blocks.inactive_split_bytes == static_cast<std::int64_t>(512_KiB + 1280_KiB + 512_KiB));
  BOOST_TEST(f.all.blocks.oversize_segments == 2);
  fb.deallocate(c);
  fb.deallocate(b);
  fb.deallocate(a);  // the segments stay (reserved, counted) until release()

  // The segregator over them: its pools are its sides.
  using seg2_t = alloy::segregator<1_MiB, arena_t, fb_t>;
  seg2_t seg{arena_t{checking_upstream{}, {.segment_size = 256_KiB}}, std::move(fb)};
  const alloy::block d = seg.allocate(1000, 16);
  BOOST_REQUIRE(d);
  const alloy::detail::figures g = alloy::detail::figures_of(seg);
  BOOST_TEST(g.has_pools);
  BOOST_TEST(g.pools[0].reserved == 256_KiB);
  BOOST_TEST(g.pools[0].counters.num_device_alloc == 1u);
  BOOST_TEST(g.pools[1].reserved == 5_MiB);
  BOOST_TEST(g.pools[1].counters.num_device_alloc == 3u);
  BOOST_TEST(g.all.reserved == 256_KiB + 5_MiB);
  BOOST_TEST(g.bytes_limit == 3_MiB);
  BOOST_TEST(g.max_split == 2_MiB);

  // Two paths add up with `+=`: counters summed, limits the smallest set one.
  alloy::detail::figures sum = f;
  sum += g;
  BOOST_TEST(sum.all.reserved == 1_MiB + 4_MiB + 256_KiB + 5_MiB);
  BOOST_TEST(sum.all.counters.num_device_alloc == 7u);
  BOOST_TEST(sum.bytes_limit == 3_MiB);
  BOOST_TEST(sum.has_pools);

  seg.deallocate(d);
}

// sharded<> passes the figures on through its guard: each shard's, under its lock, added up with
// `figures::operator+=` (counter types add up).
BOOST_AUTO_TEST_CASE(sharded_figures_add_up_over_its_shards) {
  using arena_t = alloy::best_fit_arena<checking_upstream>;
  using sharded_t = alloy::sharded<arena_t>;
  alloy::stats<sharded_t> a{sharded_t{[](std::size_t i) {
                                        arena_t::options o;
                                        o.initial_size = (i + 1) * 1_MiB;  // one segment each: 1, 2, 3 MiB
                                        return arena_t{checking_upstream{}, o};
                                      },
                                      {.shards = 3, .thread_cache = 0}}};
  const alloy::statistics s = a.statistics();
  BOOST_TEST(s.bytes_reserved == 6_MiB);
  BOOST_TEST(s.peak_bytes_reserved == 6_MiB);
  BOOST_TEST(s.num_device_alloc == 3u);
  BOOST_TEST(s.num_device_free == 0u);
  const std::map<std::string, std::int64_t> m = alloy::memory_stats(a);
  BOOST_TEST(m.at("segment.all.current") == 3);
  BOOST_TEST(m.at("reserved_bytes.all.current") == static_cast<std::int64_t>(6_MiB));
  const alloy::block b = a.allocate(100, 16);  // this thread's shard: no new segment
  BOOST_REQUIRE(b);
  BOOST_TEST(a.statistics().num_device_alloc == 3u);
  a.deallocate(b);
  const alloy::detail::figures f = alloy::detail::figures_of(a.inner());
  BOOST_TEST(f.all.reserved == 6_MiB);
  BOOST_TEST(f.all.counters.num_device_alloc == 3u);
}

// reset_peak() restarts the movable peak of every movable part below it, past a lock and the
// two-part composites (which do not pass `reset_movable_peak` on as a capability: their parts
// may differ); the figure read is their peaks added up.
BOOST_AUTO_TEST_CASE(reset_peak_reaches_movable_parts_below_composites) {
  using device_t = alloy::limited<checking_upstream>;
  using reclaimer_t = alloy::host_spill_reclaimer<device_t, alloy::host_upstream>;
  auto reclaimer = [] { return reclaimer_t{device_t{checking_upstream{}, {.bytes_limit = 4_MiB}}}; };
  // Locks each part's handle and unlocks it: each part's peak of locked bytes is its handle's size.
  auto lock_each = [](auto& first, auto& second) {
    const alloy::handle h1 = first.allocate_movable(400_KiB);
    const alloy::handle h2 = second.allocate_movable(300_KiB);
    BOOST_REQUIRE((h1 && h2));
    BOOST_REQUIRE(first.lock(h1) != nullptr);
    BOOST_REQUIRE(second.lock(h2) != nullptr);
    first.unlock(h1);
    second.unlock(h2);
    return std::pair{h1, h2};
  };

  using segregator_t = alloy::segregator<350_KiB, reclaimer_t, reclaimer_t>;
  using locked_t = alloy::synchronized<segregator_t, recording_mutex>;  // std::mutex does not move
  alloy::stats<locked_t> seg{locked_t{segregator_t{reclaimer(), reclaimer()}}};
  static_assert(!alloy::detail::has_reset_movable_peak<segregator_t>);
  auto [small, large] = alloy::find<segregator_t>(seg).parts();
  const auto [s1, s2] = lock_each(large, small);
  BOOST_TEST(seg.statistics().peak_bytes_active == 700_KiB);
  BOOST_TEST(seg.statistics().bytes_active == 0u);
  seg.reset_peak();
  BOOST_TEST(small.movable_statistics().peak_bytes_active == 0u);
  BOOST_TEST(large.movable_statistics().peak_bytes_active == 0u);
  BOOST_TEST(seg.statistics().peak_bytes_active == 0u);
  BOOST_TEST(recording_mutex::relocks == 0);
  large.deallocate(s1);
  small.deallocate(s2);

  using fallback_t = alloy::fallback<reclaimer_t, reclaimer_t>;
  alloy::stats<fallback_t> fb{fallback_t{reclaimer(), reclaimer()}};
  auto [primary, secondary] = fb.inner().parts();
  const auto [f1, f2] = lock_each(primary, secondary);
  BOOST_REQUIRE(primary.lock(f1) != nullptr);  // locked again: the current value the peak restarts from
  fb.reset_peak();
  BOOST_TEST(primary.movable_statistics().peak_bytes_active == 400_KiB);
  BOOST_TEST(secondary.movable_statistics().peak_bytes_active == 0u);
  BOOST_TEST(fb.statistics().peak_bytes_active == 400_KiB);
  primary.unlock(f1);
  primary.deallocate(f1);
  secondary.deallocate(f2);
}

BOOST_AUTO_TEST_SUITE_END()
