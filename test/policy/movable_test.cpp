// SPDX-License-Identifier: Apache-2.0
// Movable memory: the handle rules, movable_buffer, the copy engine on the host, and
// host_spill_reclaimer (single and full reclaim, exact counters, content kept through spills).
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/movable.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/compacting_defragmenter.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>
#include <alloy/policy/stats.hpp>

#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::handle;
using alloy::testing::checking_upstream;
using alloy::testing::failing_upstream;
using alloy::testing::fill_pattern;
using alloy::testing::has_pattern;

namespace {

using tight_device = alloy::limited<checking_upstream>;
using reclaimer = alloy::host_spill_reclaimer<tight_device, checking_upstream>;

reclaimer make_reclaimer(std::size_t limit) {
  return reclaimer{tight_device{checking_upstream{}, {.bytes_limit = limit}}, checking_upstream{}};
}

template <class A>
void fill(A& a, handle h, std::uint64_t id) {
  void* p = a.lock(h);
  BOOST_REQUIRE(p != nullptr);
  fill_pattern({p, a.size_of(h)}, id);
  a.unlock(h);
}

template <class A>
bool intact(A& a, handle h, std::uint64_t id) {
  void* p = a.lock(h);
  if (p == nullptr) return false;
  const bool ok = has_pattern({p, a.size_of(h)}, id);
  a.unlock(h);
  return ok;
}

/// Raw frees a movable policy refuses are counted in its `misuses()`; this handler only keeps a
/// workload's deliberate ones off stderr.
void quietly(alloy::misuse, alloy::block, void*) noexcept {}

/// Whether a device side has nothing handed out.
template <class D>
bool nothing_in_use(const D& d) {
  if constexpr (requires { d.bytes_in_use(); }) {
    return d.bytes_in_use() == 0;
  } else {
    bool none = true;
    d.for_each_block([&](const alloy::block_info& info) { none = none && info.state == alloy::block_state::free; });
    return none;
  }
}

}  // namespace

namespace recipes {
// The reclaimer as a raw allocator: everything passes through to the device side.
struct reclaimer {
  template <class U>
  using type = alloy::host_spill_reclaimer<alloy::limited<U>, alloy::host_upstream>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{alloy::limited<U>{std::move(up), {.bytes_limit = 1_GiB}}, alloy::host_upstream{}};
  }
};
}  // namespace recipes

BOOST_AUTO_TEST_SUITE(movable)

BOOST_AUTO_TEST_CASE(concepts) {
  static_assert(alloy::movable_allocator<reclaimer>);
  static_assert(alloy::movable_counting_allocator<reclaimer>);
  static_assert(alloy::sized_movable_allocator<reclaimer>);
  static_assert(!alloy::movable_allocator<tight_device>);
  static_assert(alloy::owning_allocator<reclaimer>);
}

BOOST_AUTO_TEST_CASE(reclaimer_conformance_as_raw_allocator) {
  alloy::testing::conformance_suite<recipes::reclaimer>();
}

BOOST_AUTO_TEST_CASE(handles_are_distinct_and_stale_handles_are_refused) {
  auto a = make_reclaimer(1_MiB);
  const handle h1 = a.allocate_movable(100);
  BOOST_REQUIRE(h1);
  a.deallocate(h1);
  const handle h2 = a.allocate_movable(100);  // reuses the slot with a new generation
  BOOST_REQUIRE(h2);
  BOOST_TEST(h1.id != h2.id);
  BOOST_CHECK_THROW(a.lock(h1), alloy::logic_error);
  BOOST_TEST(!a.is_live(h1));
  BOOST_TEST(a.is_live(h2));
  a.deallocate(h2);
}

// Handles of another allocator name slots here too (the same indices and generations); they are
// refused, by every handle call, and the blocks here stay as they were. Slots are freed and reused
// at random so that generations differ too.
BOOST_AUTO_TEST_CASE(handles_of_another_allocator_are_refused) {
  std::mt19937_64 rng(20261206);
  auto a = make_reclaimer(64_MiB);
  auto b = make_reclaimer(64_MiB);
  std::vector<handle> mine, theirs, freed;
  for (int i = 0; i < 3000; ++i) {
    const bool first = rng() % 2 == 0;
    reclaimer& alloc = first ? a : b;
    std::vector<handle>& live = first ? mine : theirs;
    if (!live.empty() && rng() % 3 == 0) {
      const std::size_t victim = rng() % live.size();
      BOOST_TEST(alloc.try_deallocate(live[victim]));
      freed.push_back(live[victim]);
      live[victim] = live.back();
      live.pop_back();
    } else {
      const handle h = alloc.allocate_movable(rng() % 2000);
      BOOST_REQUIRE(h);
      live.push_back(h);
    }
  }
  for (const handle h : mine) fill(a, h, h.id);
  const auto before = a.movable_statistics();
  const std::size_t count = a.movable_count();
  for (const handle h : theirs) {
    BOOST_TEST(!a.is_live(h));
    BOOST_TEST(a.size_of(h) == 0u);
    BOOST_CHECK_THROW(a.lock(h), alloy::logic_error);
    BOOST_CHECK_THROW(a.deallocate(h), alloy::logic_error);
    BOOST_TEST(!a.try_deallocate(h));
  }
  for (const handle h : freed) {  // stale here, or another allocator's
    BOOST_TEST(!a.is_live(h));
    BOOST_CHECK_THROW(a.deallocate(h), alloy::logic_error);
    BOOST_TEST(!a.try_deallocate(h));
  }
  BOOST_TEST((a.movable_statistics() == before));
  BOOST_TEST(a.movable_count() == count);
  for (const handle h : mine) BOOST_TEST(intact(a, h, h.id));
  for (const handle h : mine) BOOST_TEST(a.try_deallocate(h));
  BOOST_TEST(a.movable_count() == 0u);
}

BOOST_AUTO_TEST_CASE(bad_input_throws_and_changes_nothing) {
  auto a = make_reclaimer(1_MiB);
  const handle h = a.allocate_movable(1000);
  BOOST_REQUIRE(h);
  fill(a, h, 7);
  const auto before = a.movable_statistics();

  BOOST_CHECK_THROW(a.lock(handle{}), alloy::logic_error);
  BOOST_CHECK_THROW(a.lock(handle{12345}), alloy::logic_error);
  BOOST_CHECK_THROW(a.unlock(h), alloy::logic_error);  // not locked
  BOOST_CHECK_THROW(a.deallocate(handle{}), alloy::logic_error);
  BOOST_TEST((a.movable_statistics() == before));

  void* p = a.lock(h);
  BOOST_REQUIRE(p);
  BOOST_CHECK_THROW(a.deallocate(h), alloy::logic_error);  // locked
  BOOST_TEST(a.is_live(h));
  a.unlock(h);
  BOOST_CHECK_THROW(a.unlock(h), alloy::logic_error);  // twice
  BOOST_TEST(intact(a, h, 7));

  a.deallocate(h);
  BOOST_CHECK_THROW(a.lock(h), alloy::logic_error);        // freed
  BOOST_CHECK_THROW(a.unlock(h), alloy::logic_error);      // freed
  BOOST_CHECK_THROW(a.deallocate(h), alloy::logic_error);  // double free
  try {
    a.lock(h);
  } catch (const alloy::logic_error& e) {
    BOOST_TEST(std::string(e.what()).find("deallocated") != std::string::npos, e.what());
  }
  const auto after = a.movable_statistics();
  BOOST_TEST(after.bytes_active == 0u);
  BOOST_TEST(after.bytes_inactive == 0u);
  BOOST_TEST(a.device().bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(locks_nest) {
  auto a = make_reclaimer(1_MiB);
  const handle h = a.allocate_movable(64);
  void* p1 = a.lock(h);
  void* p2 = a.lock(h);
  BOOST_TEST(p1 == p2);
  BOOST_TEST(a.movable_statistics().bytes_active == 64u);
  a.unlock(h);
  BOOST_TEST(a.is_locked(h));
  a.unlock(h);
  BOOST_TEST(!a.is_locked(h));
  BOOST_TEST(a.movable_statistics().bytes_inactive == 64u);
  a.deallocate(h);
}

BOOST_AUTO_TEST_CASE(zero_bytes) {
  auto a = make_reclaimer(1_MiB);
  const handle h = a.allocate_movable(0);
  BOOST_REQUIRE(h);
  BOOST_TEST(a.size_of(h) == 0u);
  BOOST_TEST(a.lock(h) != nullptr);
  a.unlock(h);
  BOOST_TEST(a.spill_all() == 0u);
  BOOST_TEST(!a.is_resident(h));
  BOOST_TEST(a.lock(h) != nullptr);
  a.unlock(h);
  a.deallocate(h);
}

// Of unlocked blocks of one size, a reclaim spills the one unlocked longest ago (a block never
// locked counts from its allocation), whatever their handles.
BOOST_AUTO_TEST_CASE(of_equal_sizes_the_block_idle_longest_is_spilled_first) {
  for (const bool reversed : {false, true}) {
    auto a = make_reclaimer(1000);
    std::vector<handle> hs;
    for (int i = 0; i < 4; ++i) {
      hs.push_back(a.allocate_movable(250));
      BOOST_REQUIRE(hs.back());
      fill(a, hs.back(), static_cast<std::uint64_t>(i));
    }
    // Touched in an order: idle longest first is then order[0], order[1], ...
    const std::vector<std::size_t> order =
        reversed ? std::vector<std::size_t>{3, 2, 1, 0} : std::vector<std::size_t>{1, 3, 0, 2};
    for (const std::size_t i : order) {
      (void)a.lock(hs[i]);
      a.unlock(hs[i]);
    }
    std::vector<handle> newer;
    for (std::size_t k = 0; k < order.size(); ++k) {
      newer.push_back(a.allocate_movable(250));  // needs one block's room
      BOOST_REQUIRE(newer.back());
      for (std::size_t j = 0; j < order.size(); ++j)
        BOOST_TEST(a.is_resident(hs[order[j]]) == (j > k), "after " << k + 1 << " spills, block " << order[j]);
    }
    BOOST_TEST(a.movable_statistics().num_single_reclaims == 4u);
    for (std::size_t i = 0; i < hs.size(); ++i) {
      a.deallocate(newer[i]);
      BOOST_TEST(intact(a, hs[i], i));
      a.deallocate(hs[i]);
    }
  }
}

// A scripted sequence with every counter computed by hand. Device limit 1000 bytes.
BOOST_AUTO_TEST_CASE(single_then_full_reclaim_exact_counters) {
  auto a = make_reclaimer(1000);
  const handle x = a.allocate_movable(400);
  const handle y = a.allocate_movable(300);
  const handle z = a.allocate_movable(300);
  BOOST_REQUIRE(x && y && z);
  fill(a, x, 1);
  fill(a, y, 2);
  fill(a, z, 3);
  auto c = a.movable_statistics();
  BOOST_TEST(c.bytes_inactive == 1000u);
  BOOST_TEST(c.num_single_reclaims == 0u);

  // 350 does not fit; the smallest unlocked block >= 350 is x (400): single reclaim of x.
  const handle w = a.allocate_movable(350);
  BOOST_REQUIRE(w);
  BOOST_TEST(!a.is_resident(x));
  BOOST_TEST(a.is_resident(y));
  BOOST_TEST(a.is_resident(z));
  c = a.movable_statistics();
  BOOST_TEST(c.num_single_reclaims == 1u);
  BOOST_TEST(c.num_full_reclaims == 0u);
  BOOST_TEST(c.bytes_reclaimed == 400u);
  BOOST_TEST(c.bytes_spilled == 400u);
  BOOST_TEST(c.bytes_inactive == 950u);
  BOOST_TEST(c.num_spills == 1u);

  // Lock y (active 300). A raw 600: no unlocked block >= 600, so a full reclaim spills z and w.
  void* py = a.lock(y);
  BOOST_REQUIRE(py);
  const alloy::block raw = a.allocate(600, 8);
  BOOST_REQUIRE(raw);
  fill_pattern(raw, 99);
  c = a.movable_statistics();
  BOOST_TEST(c.num_single_reclaims == 1u);
  BOOST_TEST(c.num_full_reclaims == 1u);
  BOOST_TEST(c.bytes_reclaimed == 400u + 300u + 350u);
  BOOST_TEST(c.bytes_spilled == 1050u);
  BOOST_TEST(c.bytes_active == 300u);
  BOOST_TEST(c.peak_bytes_active == 400u);  // fill() locked x
  BOOST_TEST(c.bytes_inactive == 0u);
  BOOST_TEST(c.num_spills == 3u);

  // Locking x (400) now cannot succeed: 900 in use, nothing unlocked on the device.
  BOOST_TEST(a.lock(x) == nullptr);
  BOOST_TEST(!a.is_resident(x));
  BOOST_TEST((a.movable_statistics() == c));

  // Free the raw block and lock x: restored, no reclaim needed.
  a.deallocate(raw);
  void* px = a.lock(x);
  BOOST_REQUIRE(px);
  BOOST_TEST(has_pattern({px, 400}, 1));
  c = a.movable_statistics();
  BOOST_TEST(c.bytes_restored == 400u);
  BOOST_TEST(c.num_restores == 1u);
  BOOST_TEST(c.bytes_active == 700u);
  BOOST_TEST(c.peak_bytes_active == 700u);
  BOOST_TEST(c.bytes_spilled == 650u);
  a.unlock(x);
  a.unlock(y);
  // In use: x 400 + y 300. Locking z (300) fits; locking w (350) then needs a reclaim: the
  // smallest unlocked block >= 350 is x (400), while z is locked.
  void* pz = a.lock(z);
  BOOST_REQUIRE(pz);
  void* pw = a.lock(w);
  BOOST_REQUIRE(pw);
  c = a.movable_statistics();
  BOOST_TEST(c.num_single_reclaims == 2u);
  BOOST_TEST(!a.is_resident(x));
  BOOST_TEST(a.is_resident(y));
  BOOST_TEST(c.bytes_reclaimed == 1050u + 400u);
  BOOST_TEST(c.num_restores == 3u);
  BOOST_TEST(c.bytes_restored == 400u + 300u + 350u);
  BOOST_TEST(c.bytes_active == 650u);
  BOOST_TEST(c.bytes_inactive == 300u);
  BOOST_TEST(c.bytes_spilled == 400u);
  a.unlock(z);
  a.unlock(w);
  BOOST_TEST(intact(a, x, 1));
  BOOST_TEST(intact(a, y, 2));
  BOOST_TEST(intact(a, z, 3));
  for (handle h : {x, y, z, w}) a.deallocate(h);
  c = a.movable_statistics();
  BOOST_TEST(c.bytes_active == 0u);
  BOOST_TEST(c.bytes_inactive == 0u);
  BOOST_TEST(c.bytes_spilled == 0u);
  BOOST_TEST(a.device().bytes_in_use() == 0u);
}

// Over an arena (introspection), the single block is the smallest whose eviction, merged with its
// free neighbours, holds the request. 4 KiB: x 1024 | y 256 | free 512 | z 1024 | w 1280.
BOOST_AUTO_TEST_CASE(single_reclaim_over_an_arena_picks_the_block_that_opens_the_hole) {
  using arena = alloy::best_fit_arena<checking_upstream>;
  alloy::host_spill_reclaimer<arena, checking_upstream> a{
      arena{checking_upstream{}, {.initial_size = 4096, .maximum_size = 4096}}, checking_upstream{}};
  const handle x = a.allocate_movable(1024);
  const handle y = a.allocate_movable(256);
  const handle t = a.allocate_movable(512);
  const handle z = a.allocate_movable(1024);
  const handle w = a.allocate_movable(1280);
  BOOST_REQUIRE(x && y && t && z && w);
  for (handle h : {x, y, z, w}) fill(a, h, h.id);
  a.deallocate(t);
  const handle r = a.allocate_movable(768);
  BOOST_REQUIRE(r);
  const auto c = a.movable_statistics();
  BOOST_TEST(c.num_single_reclaims == 1u);
  BOOST_TEST(c.num_full_reclaims == 0u);
  BOOST_TEST(c.bytes_reclaimed == 256u, "y (256 B) beside the 512 B hole suffices; size alone would spill 1 KiB");
  BOOST_TEST(!a.is_resident(y));
  // The arena failed the 768 B request once; the reclaim made it good: a retry, not an OOM.
  BOOST_TEST(a.device().counters().num_ooms == 1u);
  BOOST_TEST(a.counters().num_ooms == 0u);
  BOOST_TEST(a.counters().num_alloc_retries == a.device().counters().num_alloc_retries + 1);
  BOOST_TEST(!a.allocate_movable(8192));  // never fits: one OOM
  BOOST_TEST(a.counters().num_ooms == 1u);
  for (handle h : {x, y, z, w}) BOOST_TEST(intact(a, h, h.id));  // y comes back: another spill
  BOOST_TEST(a.device().check_invariants());
  BOOST_TEST(a.counters().num_ooms == 1u);
  for (handle h : {x, y, z, w, r}) a.deallocate(h);
  BOOST_TEST(a.device().free_bytes() == 4096u);
}

// Over a raw arena, introspection shows movable pieces as active (locked) or inactive (unlocked)
// and raw pieces as allocated; spilled blocks are not on the device, so they are not shown.
BOOST_AUTO_TEST_CASE(introspection_over_a_raw_arena_marks_movable_pieces) {
  using arena = alloy::best_fit_arena<checking_upstream>;
  alloy::host_spill_reclaimer<arena, checking_upstream> a{
      arena{checking_upstream{}, {.initial_size = 4096, .maximum_size = 4096}}, checking_upstream{}};
  static_assert(alloy::introspectable_allocator<decltype(a)>);
  const handle locked = a.allocate_movable(1024);
  const handle unlocked = a.allocate_movable(512);
  const alloy::block raw = a.allocate(256, 256);
  BOOST_REQUIRE(locked && unlocked && raw);
  void* const p = a.lock(locked);
  std::map<alloy::block_state, std::size_t> bytes;
  std::size_t pieces = 0;
  a.for_each_block([&](const alloy::block_info& info) {
    bytes[info.state] += info.size;
    ++pieces;
    if (info.ptr == p) BOOST_TEST((info.state == alloy::block_state::active));
    if (info.ptr == raw.ptr) BOOST_TEST((info.state == alloy::block_state::allocated));
  });
  BOOST_TEST(pieces == 4u);
  BOOST_TEST(bytes[alloy::block_state::active] == 1024u);
  BOOST_TEST(bytes[alloy::block_state::inactive] == 512u);
  BOOST_TEST(bytes[alloy::block_state::allocated] == 256u);
  BOOST_TEST(bytes[alloy::block_state::free] == 4096u - 1024 - 512 - 256);
  a.unlock(locked);
  a.deallocate(raw);
  a.deallocate(locked);
  a.deallocate(unlocked);
}

BOOST_AUTO_TEST_CASE(impossible_requests_spill_nothing) {
  auto a = make_reclaimer(1000);
  const handle x = a.allocate_movable(600);
  BOOST_REQUIRE(x);
  BOOST_TEST(!a.allocate_movable(1001), "more than the device's limit");
  BOOST_TEST(!a.allocate_movable(SIZE_MAX));
  BOOST_TEST(!a.allocate_movable(SIZE_MAX - 100));
  BOOST_TEST(!a.allocate(SIZE_MAX - 7, 256));
  BOOST_TEST(!a.allocate(500, 3), "bad alignment");
  BOOST_TEST(a.is_resident(x));
  BOOST_TEST(a.movable_statistics().num_spills == 0u);
  a.deallocate(x);
}

BOOST_AUTO_TEST_CASE(stats_reads_the_movable_counters) {
  alloy::stats<reclaimer> s{make_reclaimer(1000)};
  const handle x = s.allocate_movable(600);
  const handle y = s.allocate_movable(600);  // spills x
  BOOST_REQUIRE(x && y);
  void* p = s.lock(y);
  BOOST_REQUIRE(p);
  const auto st = s.statistics();
  BOOST_TEST(st.bytes_reclaimed == 600u);
  BOOST_TEST(st.num_single_reclaims == 1u);
  BOOST_TEST(st.num_full_reclaims == 0u);
  BOOST_TEST(st.bytes_active == 600u);
  BOOST_TEST(st.bytes_inactive == 0u);
  s.unlock(y);
  s.deallocate(x);
  s.deallocate(y);
}

BOOST_AUTO_TEST_CASE(synchronized_forwards_the_handle_calls) {
  alloy::synchronized<reclaimer> s{make_reclaimer(1000)};
  static_assert(alloy::movable_allocator<decltype(s)>);
  static_assert(alloy::movable_counting_allocator<decltype(s)>);
  static_assert(alloy::sized_movable_allocator<decltype(s)>);
  alloy::movable_buffer buf{s, 600};
  {
    auto view = buf.lock();
    fill_pattern({view.data(), view.size()}, 3);
  }
  alloy::movable_buffer other{s, 600};  // spills buf
  BOOST_TEST(s.movable_statistics().num_single_reclaims == 1u);
  BOOST_TEST(s.size_of(buf.get()) == 600u);
  other.reset();
  auto view = buf.lock();
  BOOST_TEST(has_pattern({view.data(), view.size()}, 3));
}

BOOST_AUTO_TEST_CASE(raw_requests_can_be_kept_from_reclaiming) {
  reclaimer a{
      tight_device{checking_upstream{}, {.bytes_limit = 1000}}, checking_upstream{}, {.reclaim_for_raw = false}};
  const handle h = a.allocate_movable(800);
  BOOST_TEST(!a.allocate(500, 8));
  BOOST_TEST(a.is_resident(h));
  BOOST_TEST(a.movable_statistics().num_spills == 0u);
  a.deallocate(h);
}

BOOST_AUTO_TEST_CASE(failing_host_side_loses_nothing) {
  using device = alloy::limited<checking_upstream>;
  alloy::host_spill_reclaimer<device, failing_upstream> a{device{checking_upstream{}, {.bytes_limit = 1000}},
                                                          failing_upstream{}};
  const handle x = a.allocate_movable(600);
  const handle y = a.allocate_movable(300);
  fill(a, x, 11);
  fill(a, y, 12);
  a.host().set_options({.fail_from = 0});  // the host side refuses everything from now on
  BOOST_TEST(!a.allocate_movable(500));
  BOOST_TEST(!a.allocate(500, 8));
  BOOST_TEST(a.is_resident(x));
  BOOST_TEST(a.is_resident(y));
  auto c = a.movable_statistics();
  BOOST_TEST(c.num_single_reclaims == 0u);
  BOOST_TEST(c.num_full_reclaims == 0u);
  BOOST_TEST(c.bytes_reclaimed == 0u);
  BOOST_TEST(intact(a, x, 11));
  BOOST_TEST(intact(a, y, 12));

  // No single candidate is >= 650. The full reclaim spills y (300), then the host side fails for
  // x: 600 stay in use, 650 does not fit, the request fails and nothing is lost.
  a.host().set_options({.fail_at = {a.host().calls() + 1}});
  BOOST_TEST(!a.allocate_movable(650));
  c = a.movable_statistics();
  BOOST_TEST(c.num_full_reclaims == 1u);
  BOOST_TEST(!a.is_resident(y));
  BOOST_TEST(a.is_resident(x));
  BOOST_TEST(intact(a, x, 11));
  BOOST_TEST(intact(a, y, 12));
  const auto records = a.host().records();
  a.deallocate(x);
  a.deallocate(y);
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

BOOST_AUTO_TEST_CASE(destructor_frees_resident_and_spilled_blocks) {
  std::shared_ptr<alloy::testing::ledger> dev, host;
  {
    auto a = make_reclaimer(1000);
    dev = alloy::find<checking_upstream>(a.device()).records();
    host = a.host().records();
    a.allocate_movable(500);
    const handle h = a.allocate_movable(400);
    a.lock(h);                // left locked on purpose
    a.allocate_movable(300);  // spills the 500
    BOOST_TEST(host->live_count() == 1u);
  }
  BOOST_TEST(dev->live_count() == 0u);
  BOOST_TEST(host->live_count() == 0u);
  BOOST_TEST(dev->errors.empty());
  BOOST_TEST(host->errors.empty());
}

BOOST_AUTO_TEST_CASE(movable_buffer_raii) {
  auto a = make_reclaimer(4096);
  {
    alloy::movable_buffer buf{a, 3000};
    BOOST_TEST(buf.size() == 3000u);
    {
      auto view = buf.lock();
      BOOST_REQUIRE(view.data());
      fill_pattern({view.data(), view.size()}, 5);
      auto inner = buf.lock();  // nests
      BOOST_TEST(inner.data() == view.data());
      BOOST_TEST(a.is_locked(buf.get()));
    }
    BOOST_TEST(!a.is_locked(buf.get()));
    BOOST_TEST(a.spill_all() == 3000u);
    {
      auto view = buf.lock();
      BOOST_TEST(has_pattern({view.data(), view.size()}, 5));
      auto moved = std::move(view);
      BOOST_TEST(!view);
      BOOST_TEST(moved.data() != nullptr);
    }
    BOOST_CHECK_THROW((alloy::movable_buffer{a, 5000}), alloy::out_of_memory);
    alloy::movable_buffer other = std::move(buf);
    BOOST_TEST(!buf);
    BOOST_TEST(a.movable_count() == 1u);
  }
  BOOST_TEST(a.movable_count() == 0u);
  BOOST_TEST(a.device().bytes_in_use() == 0u);
}

// A refused reset() (a view is alive) must not drop the handle first, which would leave the
// block allocated and unreachable. The buffer must still own it; the same for a move
// assignment into a buffer with a live view.
BOOST_AUTO_TEST_CASE(refused_operations_leave_the_buffer_owning_its_block) {
  auto a = make_reclaimer(8192);
  alloy::movable_buffer buf{a, 3000};
  const handle h = buf.get();
  {
    auto view = buf.lock();
    fill_pattern({view.data(), view.size()}, 61);
    BOOST_CHECK_THROW(buf.reset(), alloy::logic_error);
    BOOST_TEST(static_cast<bool>(buf));
    BOOST_TEST((buf.get() == h));
    BOOST_TEST(a.movable_count() == 1u);
    alloy::movable_buffer other{a, 1000};
    BOOST_CHECK_THROW(buf = std::move(other), alloy::logic_error);
    BOOST_TEST((buf.get() == h), "the refused assignment keeps the buffer's block");
    BOOST_TEST(static_cast<bool>(other), "and leaves the source as it was");
    BOOST_TEST(a.movable_count() == 2u);
  }
  BOOST_TEST(a.movable_count() == 1u);
  BOOST_TEST(intact(a, buf.get(), 61));
  buf.reset();  // no view now: accepted
  BOOST_TEST(!buf);
  BOOST_TEST(a.movable_count() == 0u);
  BOOST_TEST(a.device().bytes_in_use() == 0u);
}

// A movable_buffer's out-of-memory message describes the allocator it refers
// to, over the defragmenter and over the spill reclaimer (it used to say "limit none, in use 0 B,
// reserved 0 B").
BOOST_AUTO_TEST_CASE(movable_buffer_out_of_memory_describes_the_allocator) {
  using arena = alloy::best_fit_arena<checking_upstream>;
  using defrag = alloy::compacting_defragmenter<arena>;
  const auto check = [](auto& alloc) {
    alloy::movable_buffer held{alloc, 4_MiB};
    try {
      alloy::movable_buffer too_big{alloc, 64_MiB};
      BOOST_FAIL("expected alloy::out_of_memory");
    } catch (const alloy::out_of_memory& oom) {
      const std::string what = oom.what();
      BOOST_TEST(what.find("tried to allocate 64.00 MiB") != std::string::npos, what);
      BOOST_TEST(what.find("limit 16.00 MiB") != std::string::npos, what);
      BOOST_TEST(what.find("in use 4.00 MiB") != std::string::npos, what);
      BOOST_TEST(what.find("reserved 16.00 MiB") != std::string::npos, what);
      BOOST_TEST(what.find("largest free block 12.00 MiB") != std::string::npos, what);
      BOOST_TEST(oom.report().in_use == 4_MiB);
      BOOST_TEST(oom.report().reserved == 16_MiB);
    }
  };
  defrag d{arena{checking_upstream{}, {.initial_size = 16_MiB, .maximum_size = 16_MiB}}};
  check(d);
  alloy::host_spill_reclaimer<defrag, checking_upstream> r{
      defrag{arena{checking_upstream{}, {.initial_size = 16_MiB, .maximum_size = 16_MiB}}}, checking_upstream{}};
  check(r);
  BOOST_TEST(r.movable_statistics().num_spills == 0u, "64 MiB can never fit 16 MiB: nothing spilled");
}

// Over an unbounded device, a request its upstream cannot give even with
// everything spilled (2^50 bytes) used to spill the resident block first.
BOOST_AUTO_TEST_CASE(a_request_no_spill_can_serve_spills_nothing) {
  using arena = alloy::best_fit_arena<alloy::host_upstream>;
  alloy::host_spill_reclaimer<arena, alloy::host_upstream> r;
  const handle first = r.allocate_movable(100000);
  BOOST_REQUIRE(first);
  fill(r, first, 77);
  BOOST_TEST(!r.allocate_movable(std::size_t{1} << 50));
  BOOST_TEST(!r.allocate(std::size_t{1} << 50, 256));
  BOOST_TEST(r.is_resident(first));
  BOOST_TEST(r.movable_statistics().num_spills == 0u);
  BOOST_TEST(r.movable_statistics().num_single_reclaims == 0u);
  BOOST_TEST(r.movable_statistics().num_full_reclaims == 0u);
  BOOST_TEST(intact(r, first, 77));
  // A request that spilling can serve still spills: a fixed 1 MiB device, 600 KiB resident.
  alloy::host_spill_reclaimer<arena, alloy::host_upstream> tight{
      arena{alloy::host_upstream{}, {.initial_size = 1_MiB, .maximum_size = 1_MiB}}};
  const handle a = tight.allocate_movable(600_KiB);
  fill(tight, a, 78);
  const handle b = tight.allocate_movable(600_KiB);
  BOOST_TEST(static_cast<bool>(b));
  BOOST_TEST(tight.movable_statistics().num_spills == 1u);
  BOOST_TEST(intact(tight, a, 78));
  tight.deallocate(a);
  tight.deallocate(b);
  r.deallocate(first);
}

BOOST_AUTO_TEST_CASE(copy_engine_on_host) {
  alloy::copy_engine engine;
  std::vector<unsigned char> from(1000), to(1000);
  fill_pattern({from.data(), from.size()}, 3);
  BOOST_TEST((engine.copy<true, true>(to.data(), from.data(), to.size())));
  BOOST_TEST(has_pattern({to.data(), to.size()}, 3));
  BOOST_TEST(engine.bytes_copied() == 1000u);
  BOOST_TEST((engine.copy_between<alloy::host_upstream, alloy::host_upstream>(to.data(), from.data(), 0)));
}

// Random workload with a tight device: every block keeps its pattern through any sequence of
// spills, restores and locks; a locked block never moves; raw blocks never move.
template <class Make>
void random_workload(Make make) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    std::shared_ptr<alloy::testing::ledger> dev_records, host_records;
    {
      auto a = make();
      dev_records = alloy::find<checking_upstream>(a.device()).records();
      host_records = a.host().records();
      std::mt19937_64 rng(seed);
      struct live {
        handle h;
        std::uint64_t id;
        void* locked = nullptr;
      };
      std::vector<live> blocks;
      std::vector<std::pair<alloy::block, std::uint64_t>> raws;
      std::uint64_t next_id = 1;
      std::size_t failures = 0, lock_failures = 0, raw_frees = 0;
      for (int op = 0; op < 20000; ++op) {
        const int what = static_cast<int>(rng() % 100);
        if (what < 30 || blocks.empty()) {
          const std::size_t bytes = std::size_t{1} << (rng() % 18);  // up to 128 KiB
          const handle h = a.allocate_movable(bytes - rng() % bytes);
          if (!h) {
            ++failures;
            continue;
          }
          blocks.push_back({h, next_id++});
          fill(a, h, blocks.back().id);
        } else if (what < 55) {  // lock or unlock one
          live& l = blocks[rng() % blocks.size()];
          if (l.locked) {
            BOOST_TEST(a.lock(l.h) == l.locked, "a locked block moved");
            a.unlock(l.h);
            BOOST_TEST(has_pattern({l.locked, a.size_of(l.h)}, l.id));
            a.unlock(l.h);
            l.locked = nullptr;
          } else if (rng() % 4 == 0) {
            l.locked = a.lock(l.h);
            if (l.locked) BOOST_TEST(has_pattern({l.locked, a.size_of(l.h)}, l.id));
          } else if (void* p = a.lock(l.h)) {  // nullptr: the device is full of locked blocks
            BOOST_TEST(has_pattern({p, a.size_of(l.h)}, l.id), "block " << l.id << " lost its content");
            // A raw free at its address, wherever restores put it: refused.
            const alloy::block raw{p, a.size_of(l.h)};
            if constexpr (alloy::free_screening_allocator<decltype(a)>)
              BOOST_TEST((a.free_misuse(raw) == alloy::misuse::foreign_pointer));
            if (rng() % 8 == 0) {
              a.deallocate(raw);
              ++raw_frees;
            }
            a.unlock(l.h);
          } else {
            ++lock_failures;
          }
        } else if (what < 80) {  // free one
          const std::size_t i = rng() % blocks.size();
          if (blocks[i].locked) a.unlock(blocks[i].h);
          a.deallocate(blocks[i].h);
          blocks[i] = blocks.back();
          blocks.pop_back();
        } else if (what < 90) {  // raw traffic
          const std::size_t bytes = 1 + rng() % 65536;
          const alloy::block b = a.allocate(bytes, 256);
          if (b) {
            fill_pattern(b, 1'000'000 + next_id);
            raws.push_back({b, 1'000'000 + next_id++});
          }
        } else if (!raws.empty()) {
          const std::size_t i = rng() % raws.size();
          BOOST_TEST(has_pattern(raws[i].first, raws[i].second), "a raw block changed");
          a.deallocate(raws[i].first);
          raws[i] = raws.back();
          raws.pop_back();
        }
        if (op % 5000 == 0) {
          const auto c = a.movable_statistics();
          std::size_t active = 0, inactive = 0, spilled = 0;
          for (const live& l : blocks) {
            if (a.is_locked(l.h)) {
              active += a.size_of(l.h);
            } else if (a.is_resident(l.h)) {
              inactive += a.size_of(l.h);
            } else {
              spilled += a.size_of(l.h);
            }
          }
          BOOST_TEST(c.bytes_active == active);
          BOOST_TEST(c.bytes_inactive == inactive);
          BOOST_TEST(c.bytes_spilled == spilled);
        }
      }
      const auto c = a.movable_statistics();
      BOOST_TEST(c.num_spills > 100u, "the workload should spill (seed " << seed << ")");
      BOOST_TEST(c.num_single_reclaims > 0u);
      BOOST_TEST(c.num_full_reclaims > 0u);
      BOOST_TEST_MESSAGE("seed " << seed << ": spills " << c.num_spills << ", single " << c.num_single_reclaims
                                 << ", full " << c.num_full_reclaims << ", failures " << failures << ", lock failures "
                                 << lock_failures);
      // Raw blocks first, then every lock undone: each block can then be brought back.
      for (auto& [b, id] : raws) {
        BOOST_TEST(has_pattern(b, id));
        a.deallocate(b);
      }
      for (const live& l : blocks) {
        if (l.locked) {
          BOOST_TEST(has_pattern({l.locked, a.size_of(l.h)}, l.id));
          a.unlock(l.h);
        }
      }
      for (const live& l : blocks) {
        BOOST_TEST(intact(a, l.h, l.id), "block " << l.id << " lost its content");
        a.deallocate(l.h);
      }
      BOOST_TEST(nothing_in_use(a.device()));
      std::size_t refused = a.misuses().foreign_pointers;
      if constexpr (alloy::movable_allocator<std::remove_cvref_t<decltype(a.device())>>)
        refused += a.device().misuses().foreign_pointers;
      BOOST_TEST(raw_frees > 0u);
      BOOST_TEST(refused == raw_frees);
      a = make();  // move assignment frees what the old one held (nothing by now)
    }
    BOOST_TEST(dev_records->live_count() == 0u);
    BOOST_TEST(host_records->live_count() == 0u);
    BOOST_TEST(dev_records->errors.empty());
    BOOST_TEST(host_records->errors.empty());
  }
}

BOOST_AUTO_TEST_CASE(random_workload_keeps_content) {
  random_workload([] {
    return reclaimer{
        tight_device{checking_upstream{}, {.bytes_limit = 2_MiB}}, checking_upstream{}, {.on_misuse = quietly}};
  });
}

BOOST_AUTO_TEST_CASE(random_workload_over_an_arena_keeps_content) {
  using arena = alloy::best_fit_arena<checking_upstream>;
  random_workload([] {
    return alloy::host_spill_reclaimer<arena, checking_upstream>{
        arena{checking_upstream{}, {.initial_size = 2_MiB, .maximum_size = 2_MiB}},
        checking_upstream{},
        {.on_misuse = quietly}};
  });
}

BOOST_AUTO_TEST_CASE(random_workload_over_a_defragmenting_arena_keeps_content) {
  using arena = alloy::best_fit_arena<checking_upstream>;
  using defrag = alloy::compacting_defragmenter<arena>;
  random_workload([] {
    return alloy::host_spill_reclaimer<defrag, checking_upstream>{
        defrag{arena{checking_upstream{}, {.initial_size = 2_MiB, .maximum_size = 2_MiB}}, {.on_misuse = quietly}},
        checking_upstream{}};
  });
}

BOOST_AUTO_TEST_SUITE_END()
