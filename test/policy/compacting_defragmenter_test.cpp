// SPDX-License-Identifier: Apache-2.0
// compacting_defragmenter over a small reference arena with `allocate_at`: holes opened with the
// fewest bytes copied, sliding, compaction releasing segments, content kept through every move,
// locked and raw blocks never moving, and a spill reclaimer that compacts before it spills.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/movable.hpp>
#include <alloy/policy/compacting_defragmenter.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>

#include <alloy/policy/best_fit_arena.hpp>

#include "policy/defrag_test_arena.hpp"
#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::handle;
using alloy::testing::checking_upstream;
using alloy::testing::defrag_test_arena;
using alloy::testing::fill_pattern;
using alloy::testing::has_pattern;

namespace {

using defrag = alloy::compacting_defragmenter<defrag_test_arena>;
using best_fit_defrag = alloy::compacting_defragmenter<alloy::best_fit_arena<checking_upstream>>;

/// Raw frees the defragmenter refuses are counted in its `misuses()`; this handler only keeps a
/// workload's deliberate ones off stderr.
void quietly(alloy::misuse, alloy::block, void*) noexcept {}

defrag make_defrag(std::vector<std::size_t> segments) {
  return defrag{defrag_test_arena{std::move(segments)}, {.on_misuse = quietly}};
}

/// A best_fit_arena of a fixed capacity under the defragmenter.
best_fit_defrag make_best_fit_defrag(std::size_t capacity) {
  return best_fit_defrag{alloy::best_fit_arena<checking_upstream>{checking_upstream{},
                                                                  {.initial_size = capacity, .maximum_size = capacity}},
                         {.on_misuse = quietly}};
}

void check_arena(const defrag_test_arena& arena) { BOOST_TEST(arena.errors().empty()); }
template <class U>
void check_arena(const alloy::best_fit_arena<U>& arena) {
  BOOST_TEST(arena.check_invariants());
  BOOST_TEST(arena.misuses().total() == 0u);
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

/// Movable blocks of the given sizes, allocated in order (so at increasing addresses in a fresh
/// arena), each filled with the pattern of its index.
std::vector<handle> allocate_in_order(defrag& a, const std::vector<std::size_t>& sizes) {
  std::vector<handle> hs;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    hs.push_back(a.allocate_movable(sizes[i]));
    BOOST_REQUIRE(hs.back());
    fill(a, hs.back(), i);
  }
  return hs;
}

}  // namespace

namespace recipes {
// The defragmenter as a raw allocator over a growing best_fit_arena.
struct defrag_best_fit {
  template <class U>
  using type = alloy::compacting_defragmenter<alloy::best_fit_arena<U>>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{alloy::best_fit_arena<U>{std::move(up)}};
  }
};
}  // namespace recipes

BOOST_AUTO_TEST_SUITE(compacting_defragmenter)

BOOST_AUTO_TEST_CASE(conformance_over_best_fit_arena) { alloy::testing::conformance_suite<recipes::defrag_best_fit>(); }

BOOST_AUTO_TEST_CASE(concepts) {
  static_assert(alloy::placement_arena<defrag_test_arena>);
  static_assert(alloy::movable_allocator<defrag>);
  static_assert(alloy::movable_counting_allocator<defrag>);
  static_assert(alloy::introspectable_allocator<defrag>);
  static_assert(alloy::releasing_allocator<defrag>);
  static_assert(alloy::reserving_allocator<defrag>);
  static_assert(alloy::owning_allocator<defrag>);
}

// 16 blocks of 256 B fill a 4 KiB segment; every other one is freed: 2 KiB free in 256 B holes.
// A 1 KiB request needs a window of four pieces; the cheapest holds two blocks (512 B), which move
// to holes outside it.
BOOST_AUTO_TEST_CASE(opens_a_hole_moving_two_blocks) {
  auto a = make_defrag({4096});
  std::vector<handle> hs = allocate_in_order(a, std::vector<std::size_t>(16, 256));
  for (std::size_t i = 1; i < 16; i += 2) a.deallocate(hs[i]);
  BOOST_TEST(a.arena().free_bytes() == 2048u);
  BOOST_TEST(a.arena().largest_free() == 256u);

  const alloy::block raw = a.allocate(1024, 256);
  BOOST_REQUIRE(raw);
  fill_pattern(raw, 1000);
  const auto c = a.movable_statistics();
  BOOST_TEST(c.num_defragmentations == 1u);
  BOOST_TEST(c.num_moves == 2u);
  BOOST_TEST(c.bytes_defragged == 512u);
  BOOST_TEST(c.bytes_inactive == 8u * 256u);
  for (std::size_t i = 0; i < 16; i += 2) BOOST_TEST(intact(a, hs[i], i));
  BOOST_TEST(has_pattern(raw, 1000));
  BOOST_TEST(a.arena().errors().empty());
  a.deallocate(raw);
  for (std::size_t i = 0; i < 16; i += 2) a.deallocate(hs[i]);
  BOOST_TEST(a.arena().free_bytes() == 4096u);
}

// The window with the fewest bytes is chosen: moving the small block B (256 B), not the large A.
//   A 1024 mov | free | B 256 mov | free | C 256 raw | free | D 256 mov | free | E 1024 raw | free
BOOST_AUTO_TEST_CASE(chooses_the_window_that_copies_least) {
  auto a = make_defrag({4096});
  const handle A = a.allocate_movable(1024);
  const handle t4 = a.allocate_movable(256);
  const handle B = a.allocate_movable(256);
  const handle t6 = a.allocate_movable(256);
  const alloy::block C = a.allocate(256, 256);
  const handle t8 = a.allocate_movable(256);
  const handle D = a.allocate_movable(200);
  const handle t10 = a.allocate_movable(256);
  const alloy::block E = a.allocate(1024, 256);
  const handle t15 = a.allocate_movable(256);
  BOOST_REQUIRE(A && B && C && D && E && t15);
  BOOST_TEST(a.arena().free_bytes() == 0u);
  fill(a, A, 1);
  fill(a, B, 2);
  fill(a, D, 4);
  fill_pattern(C, 3);
  fill_pattern(E, 5);
  for (handle t : {t4, t6, t8, t10, t15}) a.deallocate(t);
  const void* where_A = a.address_of(A);

  const alloy::block r = a.allocate(768, 256);
  BOOST_REQUIRE(r);
  const auto c = a.movable_statistics();
  BOOST_TEST_MESSAGE("moves " << c.num_moves << " bytes " << c.bytes_defragged << " defrags "
                              << c.num_defragmentations);
  BOOST_TEST(c.num_moves == 1u);
  BOOST_TEST(c.bytes_defragged == 200u, "the cheapest window holds only D (200 B)");
  BOOST_TEST(a.address_of(A) == where_A);
  BOOST_TEST(intact(a, A, 1));
  BOOST_TEST(intact(a, B, 2));
  BOOST_TEST(intact(a, D, 4));
  BOOST_TEST(has_pattern(C, 3));
  BOOST_TEST(has_pattern(E, 5));
  a.deallocate(r);
  a.deallocate(C);
  a.deallocate(E);
  for (handle h : {A, B, D}) a.deallocate(h);
}

BOOST_AUTO_TEST_CASE(locked_and_raw_blocks_never_move) {
  auto a = make_defrag({4096});
  std::vector<handle> hs = allocate_in_order(a, std::vector<std::size_t>(16, 256));
  for (std::size_t i = 1; i < 16; i += 2) a.deallocate(hs[i]);
  std::vector<void*> pinned;
  for (std::size_t i = 0; i < 16; i += 2) pinned.push_back(a.lock(hs[i]));
  BOOST_TEST(!a.allocate(512, 256), "every window holds a locked block");
  BOOST_TEST(!a.allocate_movable(512));
  BOOST_TEST(a.movable_statistics().num_moves == 0u);
  BOOST_TEST(a.movable_statistics().bytes_active == 8u * 256u);
  BOOST_TEST(a.movable_statistics().peak_bytes_active == 8u * 256u);
  for (std::size_t i = 0; i < 16; i += 2) {
    BOOST_TEST(a.lock(hs[i]) == pinned[i / 2]);
    BOOST_TEST(has_pattern({pinned[i / 2], 256}, i));
    a.unlock(hs[i]);
    a.unlock(hs[i]);
  }
  BOOST_TEST(a.movable_statistics().bytes_active == 0u);
  for (std::size_t i = 0; i < 16; i += 2) a.deallocate(hs[i]);
}

// No window's blocks fit elsewhere (every one holds a 768 B block, the holes are 256 B): the
// defragmenter consolidates. Pieces: m768 f m768 f m768 f m1024. The cheapest pivot is after the
// first block: the second and third blocks slide up (by 512 and 256 B, overlapping their old
// places), the first and last stay: 1536 B copied, where sliding everything down would copy 2560.
BOOST_AUTO_TEST_CASE(slides_when_no_window_can_be_relocated) {
  auto a = make_defrag({4096});
  std::vector<handle> hs = allocate_in_order(a, {768, 256, 768, 256, 768, 256, 1024});
  a.deallocate(hs[1]);
  a.deallocate(hs[3]);
  a.deallocate(hs[5]);
  BOOST_TEST(a.arena().free_bytes() == 768u);
  const alloy::block r = a.allocate(768, 256);
  BOOST_REQUIRE(r);
  const auto c = a.movable_statistics();
  BOOST_TEST(c.num_defragmentations == 1u);
  BOOST_TEST(c.num_moves == 2u);
  BOOST_TEST(c.bytes_defragged == 768u + 768u);
  BOOST_TEST(r.ptr == static_cast<const char*>(a.address_of(hs[0])) + 768,
             "the hole opens right after the first block");
  for (std::size_t i : {0u, 2u, 4u, 6u}) BOOST_TEST(intact(a, hs[i], i));
  a.deallocate(r);
  for (std::size_t i : {0u, 2u, 4u, 6u}) a.deallocate(hs[i]);
  BOOST_TEST(a.arena().errors().empty());
}

BOOST_AUTO_TEST_CASE(compact_packs_and_releases_segments) {
  auto a = make_defrag({4096, 4096});
  std::vector<handle> hs = allocate_in_order(a, std::vector<std::size_t>(32, 256));
  // Low segment: keep the even blocks; high segment: keep four blocks.
  for (std::size_t i = 1; i < 16; i += 2) a.deallocate(hs[i]);
  for (std::size_t i = 16; i < 32; ++i) {
    if (i % 4 != 1) a.deallocate(hs[i]);
  }
  BOOST_TEST(a.reserved_bytes() == 8192u);
  const std::size_t moved = a.compact();
  BOOST_TEST(moved > 0u);
  BOOST_TEST(a.reserved_bytes() == 4096u, "the emptied segment goes back to the upstream");
  BOOST_TEST(a.arena().free_pieces() == 1u);
  BOOST_TEST(a.arena().largest_free() == 1024u, "12 blocks of 256 B packed, the rest one hole");
  const auto c = a.movable_statistics();
  BOOST_TEST(c.num_defragmentations == 1u);
  BOOST_TEST(c.bytes_defragged == moved);
  for (std::size_t i = 0; i < 32; ++i) {
    if ((i < 16 && i % 2 == 0) || (i >= 16 && i % 4 == 1)) {
      BOOST_TEST(intact(a, hs[i], i));
      a.deallocate(hs[i]);
    }
  }
  BOOST_TEST(a.compact() == 0u);
  BOOST_TEST(a.reserved_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(bad_input) {
  auto a = make_defrag({4096});
  const handle h = a.allocate_movable(100);
  BOOST_CHECK_THROW(a.unlock(h), alloy::logic_error);
  a.lock(h);
  BOOST_CHECK_THROW(a.deallocate(h), alloy::logic_error);
  a.unlock(h);
  a.deallocate(h);
  BOOST_CHECK_THROW(a.lock(h), alloy::logic_error);
  BOOST_CHECK_THROW(a.deallocate(h), alloy::logic_error);
  BOOST_CHECK_THROW(a.lock(handle{}), alloy::logic_error);
  BOOST_TEST(a.movable_statistics().bytes_inactive == 0u);
  BOOST_TEST(a.arena().free_bytes() == 4096u);
  BOOST_TEST(!a.allocate(64, 3));
  BOOST_TEST(!a.allocate(SIZE_MAX - 3, 256));
}

namespace {
struct refusals {
  std::vector<std::pair<alloy::misuse, alloy::block>> seen;
  static void record(alloy::misuse kind, alloy::block b, void* self) noexcept {
    static_cast<refusals*>(self)->seen.emplace_back(kind, b);  // test code: the few pushes fit
  }
};
}  // namespace

// A raw free at a movable block's address, before and after a move, unlocked and locked: refused
// and passed to the handler; the old address after a move is the arena's again.
BOOST_AUTO_TEST_CASE(raw_frees_at_movable_addresses_are_refused) {
  refusals r;
  best_fit_defrag a{
      alloy::best_fit_arena<checking_upstream>{checking_upstream{}, {.initial_size = 4096, .maximum_size = 4096}},
      {.on_misuse = refusals::record, .misuse_context = &r}};
  const handle first = a.allocate_movable(1024);
  const handle second = a.allocate_movable(1024);
  BOOST_REQUIRE(first);
  BOOST_REQUIRE(second);
  fill(a, second, 2);
  void* before = const_cast<void*>(a.address_of(second));
  a.deallocate(alloy::block{before, 1024});
  BOOST_TEST(!a.try_deallocate(alloy::block{before, 1024}));
  BOOST_TEST((a.free_misuse({before, 1024}) == alloy::misuse::foreign_pointer));
  BOOST_TEST(r.seen.size() == 2u);
  BOOST_TEST((r.seen.at(0).first == alloy::misuse::foreign_pointer));
  BOOST_TEST(r.seen.at(0).second.ptr == before);
  a.deallocate(first);
  // 3 KiB asked for with 3 KiB free in two holes: the second block moves down
  const alloy::block raw = a.allocate(3072, 256);
  BOOST_REQUIRE(static_cast<bool>(raw));
  const void* after = a.address_of(second);
  BOOST_TEST(after != before, "the block moved");
  BOOST_TEST(intact(a, second, 2));
  void* locked = a.lock(second);
  BOOST_TEST(!a.try_deallocate(alloy::block{locked, 1024}), "locked");
  a.unlock(second);
  BOOST_TEST((a.free_misuse({before, 1024}) == a.arena().free_misuse({before, 1024})), "the old place is the arena's");
  BOOST_TEST(a.misuses().foreign_pointers == 3u);
  BOOST_TEST(r.seen.size() == 3u);
  BOOST_TEST(intact(a, second, 2));
  BOOST_TEST(a.try_deallocate(raw));
  a.deallocate(second);
  check_arena(a.arena());
  BOOST_TEST(a.arena().free_bytes() == 4096u);
}

BOOST_AUTO_TEST_CASE(introspection_reports_active_and_inactive) {
  auto a = make_defrag({4096});
  const handle x = a.allocate_movable(256);
  const handle y = a.allocate_movable(256);
  const alloy::block r = a.allocate(256, 8);
  a.lock(x);
  std::size_t active = 0, inactive = 0, allocated = 0, free = 0;
  a.for_each_block([&](const alloy::block_info& info) {
    switch (info.state) {
      case alloy::block_state::active: ++active; break;
      case alloy::block_state::inactive: ++inactive; break;
      case alloy::block_state::allocated: ++allocated; break;
      case alloy::block_state::free: ++free; break;
      case alloy::block_state::unmapped:
      case alloy::block_state::offloaded: BOOST_ERROR("a defragmenter has no unmapped or offloaded blocks"); break;
    }
  });
  BOOST_TEST(active == 1u);
  BOOST_TEST(inactive == 1u);
  BOOST_TEST(allocated == 1u);
  BOOST_TEST(free == 1u);
  a.unlock(x);
  a.deallocate(x);
  a.deallocate(y);
  a.deallocate(r);
}

// A spill reclaimer over a defragmenting arena compacts before it spills.
BOOST_AUTO_TEST_CASE(reclaimer_compacts_before_spilling) {
  using stack = alloy::host_spill_reclaimer<defrag, checking_upstream>;
  stack a{make_defrag({4096}), checking_upstream{}};
  static_assert(stack::device_is_movable);
  std::vector<handle> hs;
  for (std::uint64_t i = 0; i < 16; ++i) {
    hs.push_back(a.allocate_movable(256));
    fill(a, hs.back(), i);
  }
  for (std::size_t i = 1; i < 16; i += 2) a.deallocate(hs[i]);
  const handle big = a.allocate_movable(1024);
  BOOST_REQUIRE(big);
  fill(a, big, 100);
  auto c = a.movable_statistics();
  BOOST_TEST(c.num_defragmentations == 1u);
  BOOST_TEST(c.bytes_defragged == 512u);
  BOOST_TEST(c.num_spills == 0u, "compaction first");
  // 1 KiB free now; 2 KiB cannot be had by compaction: no block >= 2 KiB, so a full reclaim.
  const handle huge = a.allocate_movable(2048);
  BOOST_REQUIRE(huge);
  fill(a, huge, 200);
  c = a.movable_statistics();
  BOOST_TEST(c.num_single_reclaims == 0u);
  BOOST_TEST(c.num_full_reclaims == 1u);
  BOOST_TEST(c.bytes_reclaimed == 8u * 256u + 1024u);
  for (std::size_t i = 0; i < 16; i += 2) BOOST_TEST(intact(a, hs[i], i));
  BOOST_TEST(intact(a, big, 100));
  BOOST_TEST(intact(a, huge, 200));
  for (std::size_t i = 0; i < 16; i += 2) a.deallocate(hs[i]);
  a.deallocate(big);
  a.deallocate(huge);
  BOOST_TEST(a.device().arena().free_bytes() == 4096u);
  BOOST_TEST(a.host().records()->live_count() == 0u);
}

// All blocks movable and unlocked: a request is served exactly when its footprint fits in the
// free bytes. Content is checked on every lock.
template <class Make>
void movable_only_workload(Make make) {
  for (std::uint64_t seed : {11u, 12u}) {
    auto a = make();
    std::mt19937_64 rng(seed);
    std::vector<std::pair<handle, std::uint64_t>> live;
    std::uint64_t next_id = 1;
    std::size_t served = 0, refused = 0;
    for (int op = 0; op < 4000; ++op) {
      if (live.empty() || rng() % 100 < 55) {
        const std::size_t bytes = 1 + rng() % (std::size_t{1} << (8 + rng() % 9));  // up to 64 KiB
        const std::size_t footprint = a.arena().chunk_size(bytes);
        const bool fits = footprint <= a.arena().free_bytes();
        const handle h = a.allocate_movable(bytes);
        BOOST_TEST(static_cast<bool>(h) == fits,
                   "request of " << bytes << " with " << a.arena().free_bytes() << " free");
        if (!h) {
          ++refused;
          continue;
        }
        ++served;
        fill(a, h, next_id);
        live.push_back({h, next_id++});
      } else {
        const std::size_t i = rng() % live.size();
        BOOST_TEST(intact(a, live[i].first, live[i].second));
        a.deallocate(live[i].first);
        live[i] = live.back();
        live.pop_back();
      }
    }
    BOOST_TEST(refused > 0u);
    BOOST_TEST_MESSAGE("seed " << seed << ": served " << served << ", refused " << refused << ", moved "
                               << a.movable_statistics().bytes_defragged << " B in "
                               << a.movable_statistics().num_defragmentations << " defragmentations");
    for (auto& [h, id] : live) {
      BOOST_TEST(intact(a, h, id));
      a.deallocate(h);
    }
    check_arena(a.arena());
  }
}

BOOST_AUTO_TEST_CASE(movable_only_workload_serves_whatever_fits) {
  movable_only_workload([] { return make_defrag({1_MiB}); });
}
BOOST_AUTO_TEST_CASE(movable_only_workload_over_best_fit_arena) {
  movable_only_workload([] { return make_best_fit_defrag(1_MiB); });
}

// Mixed workload: raw blocks, locked blocks, compactions; every pattern intact, locked addresses
// fixed, raw blocks untouched.
template <class Make>
void mixed_workload(Make make) {
  for (std::uint64_t seed : {21u, 22u, 23u}) {
    std::shared_ptr<alloy::testing::ledger> records;
    {
      auto a = make();
      records = alloy::find<checking_upstream>(a).records();
      std::mt19937_64 rng(seed);
      struct live {
        handle h;
        std::uint64_t id;
        void* locked;
      };
      std::vector<live> blocks;
      std::vector<std::pair<alloy::block, std::uint64_t>> raws;
      std::uint64_t next_id = 1;
      std::size_t raw_frees = 0;
      for (int op = 0; op < 6000; ++op) {
        const int what = static_cast<int>(rng() % 100);
        if (what < 35 || blocks.empty()) {
          const handle h = a.allocate_movable(1 + rng() % (std::size_t{1} << (6 + rng() % 10)));
          if (!h) continue;
          fill(a, h, next_id);
          blocks.push_back({h, next_id++, nullptr});
        } else if (what < 55) {
          live& l = blocks[rng() % blocks.size()];
          if (l.locked) {
            BOOST_TEST(a.lock(l.h) == l.locked, "a locked block moved");
            a.unlock(l.h);
            BOOST_TEST(has_pattern({l.locked, a.size_of(l.h)}, l.id));
            a.unlock(l.h);
            l.locked = nullptr;
          } else if (rng() % 5 == 0) {
            l.locked = a.lock(l.h);
          } else {
            BOOST_TEST(intact(a, l.h, l.id));
            // A raw free at its address, wherever moves put it: refused.
            const alloy::block raw{const_cast<void*>(a.address_of(l.h)), a.size_of(l.h)};
            if constexpr (alloy::free_screening_allocator<decltype(a)>)
              BOOST_TEST((a.free_misuse(raw) == alloy::misuse::foreign_pointer));
            if (rng() % 4 == 0) {
              a.deallocate(raw);
              ++raw_frees;
            }
          }
        } else if (what < 80) {
          const std::size_t i = rng() % blocks.size();
          if (blocks[i].locked) a.unlock(blocks[i].h);
          a.deallocate(blocks[i].h);
          blocks[i] = blocks.back();
          blocks.pop_back();
        } else if (what < 88) {
          const alloy::block b = a.allocate(1 + rng() % 8192, std::size_t{1} << (rng() % 10));
          if (b) {
            fill_pattern(b, 1'000'000 + next_id);
            raws.push_back({b, 1'000'000 + next_id++});
          }
        } else if (what < 97) {
          if (!raws.empty()) {
            const std::size_t i = rng() % raws.size();
            BOOST_TEST(has_pattern(raws[i].first, raws[i].second), "a raw block changed");
            a.deallocate(raws[i].first);
            raws[i] = raws.back();
            raws.pop_back();
          }
        } else {
          a.compact();
        }
      }
      const auto c = a.movable_statistics();
      BOOST_TEST(c.num_moves > 0u);
      BOOST_TEST(raw_frees > 0u);
      BOOST_TEST(a.misuses().foreign_pointers == raw_frees);
      BOOST_TEST_MESSAGE("seed " << seed << ": " << c.num_defragmentations << " defragmentations, " << c.num_moves
                                 << " moves, " << c.bytes_defragged << " B");
      for (live& l : blocks) {
        if (l.locked) {
          BOOST_TEST(has_pattern({l.locked, a.size_of(l.h)}, l.id));
          a.unlock(l.h);
        }
        BOOST_TEST(intact(a, l.h, l.id));
        a.deallocate(l.h);
      }
      for (auto& [b, id] : raws) {
        BOOST_TEST(has_pattern(b, id));
        a.deallocate(b);
      }
      check_arena(a.arena());
      BOOST_TEST(a.arena().free_bytes() == a.reserved_bytes());
    }
    BOOST_TEST(records->live_count() == 0u);
    BOOST_TEST(records->errors.empty());
  }
}

BOOST_AUTO_TEST_CASE(mixed_workload_keeps_content) {
  mixed_workload([] { return make_defrag({512_KiB, 512_KiB}); });
}
BOOST_AUTO_TEST_CASE(mixed_workload_over_best_fit_arena) {
  mixed_workload([] { return make_best_fit_defrag(1_MiB); });
}

// The host twin of the GPU test's scenario (movable_gpu_test.cu), over best_fit_arena.
BOOST_AUTO_TEST_CASE(gpu_scenario_on_the_host) {
  auto a = make_best_fit_defrag(64_MiB);
  std::vector<handle> hs;
  for (std::uint64_t i = 0; i < 16; ++i) {
    hs.push_back(a.allocate_movable(4_MiB));
    BOOST_REQUIRE(hs.back());
    fill(a, hs.back(), i);
  }
  for (std::size_t i = 1; i < 16; i += 2) a.deallocate(hs[i]);
  const alloy::block raw = a.allocate(16_MiB, 256);
  BOOST_REQUIRE(raw);
  BOOST_TEST(a.movable_statistics().bytes_defragged == 8_MiB);
  const alloy::block raw2 = a.allocate(16_MiB, 256);
  BOOST_REQUIRE(raw2);
  for (std::size_t i = 0; i < 16; i += 2) {
    BOOST_TEST(intact(a, hs[i], i));
    a.deallocate(hs[i]);
  }
  a.deallocate(raw);
  a.deallocate(raw2);
  BOOST_TEST(a.arena().free_bytes() == 64_MiB);
  BOOST_TEST(a.arena().check_invariants());
}

BOOST_AUTO_TEST_CASE(counters_count_a_rescued_request_as_a_retry) {
  auto a = make_best_fit_defrag(4096);
  std::vector<handle> hs;
  for (int i = 0; i < 16; ++i) hs.push_back(a.allocate_movable(256));
  for (std::size_t i = 1; i < 16; i += 2) a.deallocate(hs[i]);
  const alloy::block r = a.allocate(1024, 256);
  BOOST_REQUIRE(r);
  BOOST_TEST(a.arena().counters().num_ooms >= 1u);
  BOOST_TEST(a.counters().num_ooms == 0u);
  BOOST_TEST(a.counters().num_alloc_retries == a.arena().counters().num_alloc_retries + 1);
  BOOST_TEST(!a.allocate(2048, 256));  // 1 KiB free: a real OOM, counted once
  BOOST_TEST(a.counters().num_ooms == 1u);
  a.deallocate(r);
  for (std::size_t i = 0; i < 16; i += 2) a.deallocate(hs[i]);
}

BOOST_AUTO_TEST_CASE(best_fit_arena_allocate_at) {
  alloy::best_fit_arena<checking_upstream> arena{checking_upstream{}, {.initial_size = 64_KiB, .maximum_size = 64_KiB}};
  const alloy::block first = arena.allocate(1000, 256);
  BOOST_REQUIRE(first);
  char* base = static_cast<char*>(first.ptr);
  BOOST_TEST(arena.chunk_size(1000) == 1024u);
  BOOST_TEST(!arena.allocate_at(base, 100), "not free");
  BOOST_TEST(!arena.allocate_at(base + 4096 + 1, 100), "not a multiple of the rounding");
  BOOST_TEST(!arena.allocate_at(base + 64_KiB - 256, 512), "past the end of the free chunk");
  const alloy::block mid = arena.allocate_at(base + 8192, 3000);
  BOOST_REQUIRE(mid);
  BOOST_TEST(mid.ptr == base + 8192);
  BOOST_TEST(mid.size == 3000u);
  BOOST_TEST(arena.check_invariants());
  BOOST_TEST(arena.free_bytes() == 64_KiB - 1024 - 3072);
  BOOST_TEST(!arena.allocate_at(base + 8192 + 2048, 10), "inside an allocated chunk");
  const alloy::block next = arena.allocate_at(base + 8192 + 3072, 1);
  BOOST_REQUIRE(next);
  BOOST_TEST(arena.check_invariants());
  arena.deallocate(mid);
  arena.deallocate(next);
  arena.deallocate(first);
  BOOST_TEST(arena.check_invariants());
  BOOST_TEST(arena.largest_free_block() == 64_KiB);
}

BOOST_AUTO_TEST_SUITE_END()
