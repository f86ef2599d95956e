// SPDX-License-Identifier: Apache-2.0
// A decorator counts a free only when the part below accepted it. The plain
// cases exactly, the same through synchronized<stats<>> and stream_ordered, the decorators
// over a part that cannot tell (they must never go below zero), and a randomized model of a
// decorator stack fed valid and bad frees (double, foreign, interior, wrong size), checked exactly
// after every step.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <alloy/adaptor/pmr.hpp>
#include <alloy/alloy.hpp>
#include <alloy/host_stream.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/showcase.hpp>

using namespace alloy::literals;
using arena = alloy::best_fit_arena<alloy::host_upstream>;

namespace {

/// Counts the misuses the arena reports instead of printing them.
struct misuse_log {
  std::size_t count = 0;
  static void record(alloy::arena_misuse, alloy::block, void* context) noexcept {
    ++static_cast<misuse_log*>(context)->count;
  }
};
arena quiet_arena(misuse_log& log) {
  return arena{alloy::host_upstream{}, {.on_misuse = &misuse_log::record, .misuse_context = &log}};
}

/// An arena behind a part that cannot tell a bad free from a good one (no `try_deallocate`): the
/// decorators above must rely on what they know themselves.
struct unchecked_arena {
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  arena inner;
  std::size_t frees_seen = 0;
  alloy::block allocate(std::size_t bytes, std::size_t alignment) noexcept { return inner.allocate(bytes, alignment); }
  void deallocate(alloy::block b) noexcept {
    ++frees_seen;
    inner.deallocate(b);
  }
};
static_assert(!alloy::checked_deallocating_allocator<unchecked_arena>);
static_assert(alloy::checked_deallocating_allocator<alloy::stats<alloy::limited<alloy::tracked<arena>>>>);

}  // namespace

// ---- the plain cases ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(limited_serves_again_after_a_double_free) {
  misuse_log log;
  alloy::limited<arena> a{quiet_arena(log), {.bytes_limit = 64_MiB}};
  const alloy::block b = a.allocate(100, 16);
  a.deallocate(b);
  a.deallocate(b);
  BOOST_TEST(log.count == 1u);
  BOOST_TEST(a.bytes_in_use() == 0u);
  const alloy::block again = a.allocate(100, 16);
  BOOST_TEST(static_cast<bool>(again));
  BOOST_TEST(a.bytes_in_use() == 100u);
  BOOST_TEST(a.num_refused() == 0u);
  a.deallocate(again);
  BOOST_TEST(a.bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(stats_ignores_a_foreign_free) {
  misuse_log log;
  alloy::stats<arena> s{quiet_arena(log)};
  int x = 0;
  s.deallocate({&x, 4});
  BOOST_TEST(log.count == 1u);
  BOOST_TEST(s.statistics().bytes_in_use == 0u);
  const auto m = alloy::memory_stats(s);
  BOOST_TEST(m.at("allocation.all.current") == 0);
  BOOST_TEST(m.at("allocation.all.freed") == 0);
  BOOST_TEST(m.at("allocated_bytes.all.current") == 0);
}

BOOST_AUTO_TEST_CASE(tracked_keeps_a_block_freed_with_the_wrong_size) {
  misuse_log log;
  alloy::tracked<arena> t{quiet_arena(log)};
  const alloy::block c = t.allocate(100, 16);
  t.deallocate({c.ptr, 99});
  BOOST_TEST(log.count == 1u);
  BOOST_TEST(t.is_outstanding(c.ptr));
  BOOST_TEST(t.outstanding_bytes() == 100u);
  BOOST_TEST(t.leak_report().find("100 bytes") != std::string::npos);
  BOOST_TEST(t.unknown_frees() == 1u);
  t.deallocate(c);
  BOOST_TEST(t.outstanding_count() == 0u);
  BOOST_TEST(t.inner().bytes_in_use() == 0u);
}

// ---- the same through synchronized, stream_ordered, logged and the rounding layer ---------------

BOOST_AUTO_TEST_CASE(synchronized_stats_counts_only_accepted_frees) {
  misuse_log log;
  alloy::synchronized<alloy::stats<arena>> s{alloy::stats<arena>{quiet_arena(log)}};
  static_assert(alloy::checked_deallocating_allocator<decltype(s)>);
  const alloy::block a = s.allocate(1000, 64);
  const alloy::block b = s.allocate(3000, 64);
  int x = 0;
  s.deallocate(a);
  s.deallocate(a);                                       // double
  s.deallocate({&x, 4});                                 // foreign
  s.deallocate({static_cast<char*>(b.ptr) + 256, 100});  // interior
  s.deallocate({b.ptr, 2999});                           // wrong size
  BOOST_TEST(!s.try_deallocate(a));
  BOOST_TEST(log.count == 5u);
  const alloy::statistics st = s.with_lock([](auto& inner) { return inner.statistics(); });
  BOOST_TEST(st.bytes_in_use == 3000u);
  BOOST_TEST(st.num_allocs == 2u);
  const auto m = s.with_lock([](auto& inner) { return alloy::memory_stats(inner); });
  BOOST_TEST(m.at("allocation.all.current") == 1);
  BOOST_TEST(m.at("allocation.all.freed") == 1);
  BOOST_TEST(s.try_deallocate(b));
  BOOST_TEST(s.with_lock([](auto& inner) { return inner.bytes_in_use(); }) == 0u);
}

BOOST_AUTO_TEST_CASE(stream_ordered_records_no_range_for_a_refused_free) {
  using ordered = alloy::stream_ordered<arena, alloy::host_stream*>;
  misuse_log log;
  alloy::host_stream one, two;
  alloy::stats<ordered> s{ordered{quiet_arena(log)}};
  static_assert(alloy::checked_stream_deallocating_allocator<decltype(s), alloy::host_stream*>);
  const alloy::block a = s.allocate(1000, 256, &one);
  const alloy::block b = s.allocate(1000, 256, &two);  // a second stream: ranges are tracked
  s.deallocate(a, &one);
  const std::size_t pending = s.inner().pending_ranges();
  s.deallocate(a, &two);  // double free on another stream
  BOOST_TEST(!s.try_deallocate(a, &one));
  BOOST_TEST(s.inner().pending_ranges() == pending);
  BOOST_TEST(log.count == 2u);
  BOOST_TEST(s.bytes_in_use() == 1000u);
  BOOST_TEST(s.statistics().num_allocs == 2u);
  BOOST_TEST(s.try_deallocate(b, &two));
  BOOST_TEST(s.bytes_in_use() == 0u);
  one.synchronize();
  two.synchronize();
}

BOOST_AUTO_TEST_CASE(logged_writes_no_line_for_a_refused_free) {
  misuse_log log;
  std::ostringstream out;
  alloy::logged<arena> l{quiet_arena(log), out};
  const alloy::block a = l.allocate(100, 16);
  l.deallocate(a);
  l.deallocate(a);
  l.deallocate({a.ptr, 7});
  BOOST_TEST(log.count == 2u);
  const std::string text = out.str();
  std::size_t frees = 0;
  for (std::size_t at = text.find(",free,"); at != std::string::npos; at = text.find(",free,", at + 1)) ++frees;
  BOOST_TEST(frees == 1u, text);
}

BOOST_AUTO_TEST_CASE(caching_allocator_rounding_layer_counts_only_accepted_frees) {
  alloy::caching_allocator<alloy::host_upstream> c;
  const alloy::block big = c.allocate(30_MiB + 5, 256);  // the rounded, huge-request side
  BOOST_REQUIRE(big);
  BOOST_TEST(c.requested_bytes() == 30_MiB + 5);
  c.deallocate(big);
  c.deallocate(big);
  c.deallocate({big.ptr, 30_MiB + 6});
  BOOST_TEST(c.requested_bytes() == 0u);
  const alloy::block again = c.allocate(30_MiB + 5, 256);
  BOOST_TEST(c.requested_bytes() == 30_MiB + 5);
  c.deallocate(again);
  BOOST_TEST(c.requested_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(pmr_resource_over_stats_counts_only_accepted_frees) {
  misuse_log log;
  alloy::stats<arena> s{quiet_arena(log)};
  alloy::pmr_resource mr{s};
  void* p = mr.allocate(100, 16);
  mr.deallocate(p, 100, 16);
  mr.deallocate(p, 100, 16);  // double
  void* q = mr.allocate(200, 16);
  mr.deallocate(q, 199, 16);  // wrong size
  BOOST_TEST(log.count == 2u);
  BOOST_TEST(s.statistics().bytes_in_use == 200u);
  BOOST_TEST(alloy::memory_stats(s).at("allocation.all.current") == 1);
  mr.deallocate(q, 200, 16);
  BOOST_TEST(s.statistics().bytes_in_use == 0u);
}

// ---- over a part that cannot tell ---------------------------------------------------------------

BOOST_AUTO_TEST_CASE(decorators_never_go_below_zero_over_an_unchecked_part) {
  int x = 0;
  {
    alloy::limited<unchecked_arena> a;
    const alloy::block b = a.allocate(100, 16);
    a.deallocate(b);
    a.deallocate(b);  // passed on (the part cannot refuse it for us), not counted: 100 > 0 in use
    BOOST_TEST(a.bytes_in_use() == 0u);
    BOOST_TEST(static_cast<bool>(a.allocate(100, 16)));
    BOOST_TEST(a.bytes_in_use() == 100u);
  }
  {
    alloy::stats<unchecked_arena> s;
    s.deallocate({&x, 4});
    BOOST_TEST(s.statistics().bytes_in_use == 0u);
    BOOST_TEST(alloy::memory_stats(s).at("allocation.all.current") == 0);
    const alloy::block b = s.allocate(10, 8);
    s.deallocate({b.ptr, 11});  // larger than what is in use: not counted
    BOOST_TEST(s.statistics().bytes_in_use == 10u);
  }
  {
    alloy::tracked<unchecked_arena> t;
    const alloy::block c = t.allocate(100, 16);
    t.deallocate({c.ptr, 99});  // refused by the tracker itself, not passed on
    t.deallocate({&x, 4});
    BOOST_TEST(t.inner().frees_seen == 0u);
    BOOST_TEST(t.unknown_frees() == 2u);
    BOOST_TEST(t.is_outstanding(c.ptr));
    t.deallocate(c);
    BOOST_TEST(t.inner().frees_seen == 1u);
    t.deallocate(c);  // double: the tracker no longer holds it
    BOOST_TEST(t.inner().frees_seen == 1u);
    BOOST_TEST(t.inner().inner.bytes_in_use() == 0u);
  }
}

// ---- a randomized model ---------------------------------------------------------------------------

// stats<limited<tracked<logged<arena>>>> under synchronized: valid allocations and frees mixed with
// every kind of bad free; after each step every figure equals the model's and the arena counted
// exactly the bad frees.
BOOST_AUTO_TEST_CASE(model_based_bad_frees_through_a_decorator_stack) {
  using stack = alloy::stats<alloy::limited<alloy::tracked<alloy::logged<arena>>>>;
  misuse_log log;
  std::ostringstream csv;
  alloy::synchronized<stack> alloc{stack{alloy::limited<alloy::tracked<alloy::logged<arena>>>{
      alloy::tracked<alloy::logged<arena>>{alloy::logged<arena>{quiet_arena(log), csv}}, {.bytes_limit = 256_MiB}}}};
  std::mt19937_64 rng(18);
  std::vector<alloy::block> live, dead;
  std::size_t live_bytes = 0, allocs = 0, bad = 0, frees = 0;
  int foreign = 0;
  for (int step = 0; step < 4000; ++step) {
    const unsigned action = static_cast<unsigned>(rng() % 10);
    if (action < 4 || live.empty()) {
      const std::size_t bytes = 1 + rng() % 20000;
      const alloy::block b = alloc.allocate(bytes, std::size_t{1} << (rng() % 9));
      BOOST_REQUIRE(b);
      live.push_back(b);
      live_bytes += bytes;
      ++allocs;
    } else if (action < 7) {
      const std::size_t i = rng() % live.size();
      BOOST_REQUIRE(alloc.try_deallocate(live[i]));
      live_bytes -= live[i].size;
      dead.push_back(live[i]);
      live[i] = live.back();
      live.pop_back();
      ++frees;
    } else {
      const alloy::block victim = live[rng() % live.size()];
      alloy::block bad_free;
      switch (action) {
        case 7:  // a double free, unless that address is live again
          if (dead.empty()) continue;
          bad_free = dead[rng() % dead.size()];
          if (alloc.with_lock([&](auto& s) { return s.inner().inner().is_outstanding(bad_free.ptr); })) continue;
          break;
        case 8:
          bad_free = rng() % 2 ? alloy::block{&foreign, sizeof foreign}
                               : alloy::block{static_cast<char*>(victim.ptr) + 1 + rng() % 16, 8};
          break;
        default: bad_free = {victim.ptr, victim.size + 1 + rng() % 100}; break;
      }
      BOOST_REQUIRE(!alloc.try_deallocate(bad_free));
      ++bad;
    }
    const bool exact = alloc.with_lock([&](stack& s) {
      const auto& core = s.core();
      const auto& lim = s.inner();
      const auto& trk = lim.inner();
      return s.bytes_in_use() == live_bytes && core.allocation[0].current == static_cast<std::int64_t>(live.size()) &&
             core.allocation[0].allocated == static_cast<std::int64_t>(allocs) &&
             core.allocation[0].freed == static_cast<std::int64_t>(frees) && lim.bytes_in_use() == live_bytes &&
             trk.outstanding_count() == live.size() && trk.outstanding_bytes() == live_bytes &&
             trk.inner().inner().requested_bytes() == live_bytes;
    });
    BOOST_REQUIRE_MESSAGE(exact, "figures differ from the model at step " << step);
    BOOST_REQUIRE(log.count == bad);
  }
  std::size_t logged_frees = 0;
  const std::string text = csv.str();
  for (std::size_t at = text.find(",free,"); at != std::string::npos; at = text.find(",free,", at + 1)) ++logged_frees;
  BOOST_TEST(logged_frees == frees);
  BOOST_TEST(bad > 500u);
  for (const alloy::block& b : live) alloc.deallocate(b);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}
