// SPDX-License-Identifier: Apache-2.0
// virtual_arena over host_vmm (real memory): the conformance routine, content kept while
// neighbouring granules are unmapped and remapped, capacity exhausted and served again, stitching
// under capacity pressure, create / map / reserve failing at every call of a scripted run, bad
// input, a model-based randomized test of 10^6 operations for each of two seeds, and exact statistics.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <random>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <alloy/literals.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/snapshot.hpp>
#include <alloy/vmm/host_vmm.hpp>

#include "support/conformance.hpp"
#include "support/failing_vmm.hpp"
#include "support/sanitizers.hpp"

using namespace alloy::literals;
using alloy::block;
using alloy::host_vmm;
using alloy::virtual_arena;
using alloy::vmm_ref;
using alloy::testing::fill_pattern;
using alloy::testing::has_pattern;

using host_arena = virtual_arena<host_vmm>;
using shared_arena = virtual_arena<vmm_ref<host_vmm>>;

static_assert(alloy::allocator<host_arena>);
static_assert(alloy::owning_allocator<host_arena>);
static_assert(alloy::releasing_allocator<host_arena>);
static_assert(alloy::reserving_allocator<host_arena>);
static_assert(alloy::counting_allocator<host_arena>);
static_assert(alloy::introspectable_allocator<host_arena>);
static_assert(alloy::cache_keeping_allocator<host_arena>);
static_assert(alloy::checked_deallocating_allocator<host_arena>);
static_assert(host_arena::max_alignment == std::numeric_limits<std::size_t>::max());
static_assert(!std::is_copy_constructible_v<host_arena> && std::is_nothrow_move_constructible_v<host_arena>);

namespace {

/// Everything the backend was given came back: no physical memory, every map undone, every
/// range unreserved.
void check_backend_clean(const host_vmm& v) {
  BOOST_TEST(v.physical_bytes() == 0u);
  BOOST_TEST(v.calls().creates == v.calls().releases);
  BOOST_TEST(v.calls().maps == v.calls().unmaps);
  BOOST_TEST(v.calls().reserves == v.calls().unreserves);
}

/// Fills each block with a pattern of its own: 1, 2, ... in turn.
void fill_patterns(std::initializer_list<block> blocks) {
  std::uint64_t id = 1;
  for (const block& b : blocks) fill_pattern(b, id++);
}

/// Mapped granules, recounted from the blocks the arena reports (allocated pieces and free
/// pieces in mapped granules), must agree with what it says.
template <class A>
void check_reported_pieces(const A& a) {
  std::size_t allocated = 0, free_mapped = 0, unmapped = 0, total = 0;
  const void* segment = nullptr;
  std::uintptr_t expected = 0;
  bool tiled = true;
  a.for_each_block([&](const alloy::block_info& info) {
    if (segment == nullptr) {
      segment = info.segment;
      expected = reinterpret_cast<std::uintptr_t>(info.segment);
    }
    tiled = tiled && info.segment == segment && reinterpret_cast<std::uintptr_t>(info.ptr) == expected;
    expected += info.size;
    total += info.size;
    switch (info.state) {
      case alloy::block_state::allocated: allocated += info.size; break;
      case alloy::block_state::free: free_mapped += info.size; break;
      case alloy::block_state::unmapped: unmapped += info.size; break;
      default: tiled = false;
    }
  });
  BOOST_TEST(tiled, "pieces tile the used part of the reserved range in address order");
  BOOST_TEST(total == a.used_address_space());
  BOOST_TEST(a.used_address_space() <= a.address_space());
  BOOST_TEST(allocated == a.bytes_in_use());
  BOOST_TEST(free_mapped == a.free_bytes());
  BOOST_TEST(allocated + free_mapped == a.reserved_bytes());
  BOOST_TEST(unmapped == a.used_address_space() - a.reserved_bytes());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(virtual_arena_suite)

// ---- conformance ----------------------------------------------------------------------------------
//
// The conformance suite's recipes build a composition over a given (checking or failing)
// upstream; a virtual arena has none, so the routine itself runs here over each option set, the
// leak check is the backend's (nothing physical, every map and reservation undone), and the
// failure matrix is the backend one further down (failing_vmm).

BOOST_AUTO_TEST_CASE(conformance_over_host_vmm) {
  struct setting {
    std::size_t granularity;
    std::size_t threshold;
    std::size_t rounding;
  };
  for (const setting s :
       {setting{2_MiB, 0, 256}, setting{64_KiB, 8_MiB, 256}, setting{2_MiB, 64_MiB, 16}, setting{64_KiB, 1_MiB, 1}}) {
    BOOST_TEST_CONTEXT("granularity " << s.granularity << ", threshold " << s.threshold << ", rounding "
                                      << s.rounding) {
      host_vmm v{{.granularity = s.granularity}};
      {
        shared_arena a{vmm_ref<host_vmm>{v}, {.release_threshold = s.threshold, .rounding = s.rounding}};
        BOOST_TEST(a.granularity() == s.granularity);
        alloy::testing::check_conformance(a, {.random_ops = 10'000, .random_max_size = 4_MiB, .random_max_live = 128});
        BOOST_TEST(a.check_invariants());
        BOOST_TEST(a.reserved_bytes() == 0u);
        BOOST_TEST(a.misuses().total() == 0u);
      }
      check_backend_clean(v);
    }
  }
}

BOOST_AUTO_TEST_CASE(address_space_defaults_and_options) {
  host_arena unlimited{host_vmm{{.granularity = 64_KiB}}};
  BOOST_TEST(unlimited.address_space() == 1_GiB * 1024, "no capacity: 1 TiB of addresses");
  BOOST_TEST(unlimited.get_options().release_threshold == 0u);
  BOOST_TEST(unlimited.get_options().keep_up_to_peak);
  BOOST_TEST(unlimited.get_options().rounding == 256u);
  host_arena small{host_vmm{{.capacity = 16_MiB, .granularity = 64_KiB}}};
  BOOST_TEST(small.address_space() == 1_GiB, "at least 1 GiB");
  host_arena sized{host_vmm{{.capacity = 1_GiB, .granularity = 64_KiB}}};
  BOOST_TEST(sized.address_space() == 4_GiB, "four times the capacity");
  host_arena coarse{
      host_vmm{{.granularity = 64_KiB}},
      {.address_space = 100_MiB + 1, .granularity = 100_KiB, .release_threshold = 0, .keep_up_to_peak = false}};
  BOOST_TEST(coarse.granularity() == 128_KiB, "a power of two, a multiple of the backend's");
  BOOST_TEST(coarse.address_space() == 100_MiB + 128_KiB);
  const block b = coarse.allocate(1, 1);
  BOOST_REQUIRE(b);
  BOOST_TEST(coarse.reserved_bytes() == 128_KiB);
  BOOST_TEST(coarse.vmm().calls().creates == 1u);
  coarse.deallocate(b);
  BOOST_TEST(coarse.reserved_bytes() == 0u, "threshold 0: the granule goes at once");
}

// ---- content and mapping ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(content_survives_neighbours_unmapped_and_remapped) {
  host_vmm v{{.granularity = 64_KiB}};
  {
    // Every wholly free granule is unmapped at once (no threshold, no share of the touched ones).
    shared_arena a{vmm_ref<host_vmm>{v},
                   {.release_threshold = 0, .release_threshold_divisor = 0, .keep_up_to_peak = false}};
    std::mt19937_64 rng(17);
    std::vector<alloy::testing::live_block> live;
    std::uint64_t next_id = 1;
    auto grow = [&](std::size_t count) {
      for (std::size_t i = 0; i < count; ++i) {
        const std::size_t bytes = std::size_t{1} << (rng() % 19);  // 1 B .. 256 KiB
        const block b = a.allocate(bytes + rng() % 1000, 256);
        BOOST_REQUIRE(b);
        fill_pattern(b, next_id);
        live.push_back({b, next_id++, 256});
      }
    };
    grow(400);
    for (std::size_t round = 0; round < 20; ++round) {
      // Free every other block (in address order): their granules that hold nothing else go.
      std::sort(live.begin(), live.end(), [](const auto& l, const auto& r) { return l.b.ptr < r.b.ptr; });
      const std::size_t unmaps_before = a.counters().num_unmaps;
      std::vector<alloy::testing::live_block> kept;
      for (std::size_t i = 0; i < live.size(); ++i) {
        if ((i + round) % 2 == 0) {
          BOOST_TEST(has_pattern(live[i].b, live[i].id));
          a.deallocate(live[i].b);
        } else {
          kept.push_back(live[i]);
        }
      }
      live.swap(kept);
      BOOST_TEST(a.counters().num_unmaps > unmaps_before, "round " << round << " unmapped nothing");
      BOOST_TEST(a.check_invariants());
      const std::size_t maps_before = a.counters().num_maps;
      grow(live.size());  // the holes are served again: their granules are mapped anew
      BOOST_TEST(a.counters().num_maps > maps_before);
      BOOST_TEST(!alloy::testing::any_overlap(live));
      for (const auto& l : live) BOOST_TEST(has_pattern(l.b, l.id), "block " << l.id << " lost its content");
      BOOST_TEST(a.check_invariants());
      check_reported_pieces(a);
      BOOST_TEST(a.free_mapped_bytes() == 0u);
    }
    alloy::testing::give_back(a, live);
    BOOST_TEST(a.reserved_bytes() == 0u);
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(granules_are_shared_and_counted) {
  host_arena a{host_vmm{{.granularity = 64_KiB}}, {.release_threshold = 0, .keep_up_to_peak = false}};
  const block x = a.allocate(40_KiB, 256);  // granule 0
  const block y = a.allocate(40_KiB, 256);  // granules 0 and 1
  const block z = a.allocate(40_KiB, 256);  // granule 1
  BOOST_REQUIRE(x);
  BOOST_REQUIRE(y);
  BOOST_REQUIRE(z);
  BOOST_TEST(static_cast<char*>(y.ptr) == static_cast<char*>(x.ptr) + 40_KiB);
  BOOST_TEST(a.reserved_bytes() == 128_KiB);
  BOOST_TEST(a.counters().num_maps == 2u);
  a.deallocate(y);  // both granules still touched
  BOOST_TEST(a.reserved_bytes() == 128_KiB);
  BOOST_TEST(a.counters().num_unmaps == 0u);
  a.deallocate(x);  // granule 0 wholly free: gone at threshold 0
  BOOST_TEST(a.reserved_bytes() == 64_KiB);
  BOOST_TEST(a.counters().num_unmaps == 1u);
  std::memset(z.ptr, 0x5A, z.size);
  const block w = a.allocate(100_KiB, 256);  // best fit: the free 80 KiB before z is too small
  BOOST_REQUIRE(w);
  BOOST_TEST(static_cast<char*>(w.ptr) == static_cast<char*>(z.ptr) + 40_KiB);
  BOOST_TEST(a.check_invariants());
  BOOST_TEST(static_cast<unsigned char*>(z.ptr)[z.size - 1] == 0x5Au);
  a.deallocate(z);
  a.deallocate(w);
  BOOST_TEST(a.reserved_bytes() == 0u);
  BOOST_TEST(a.counters().num_maps == a.counters().num_unmaps);
  BOOST_TEST(a.counters().num_device_alloc == a.counters().num_device_free);
  BOOST_TEST(a.check_invariants());
}

// Where in its hole a block goes: a block of at most a granule may take the hole's back, inside
// the granule the next live block touches; a larger block takes the front, so that the hole is
// not split in two (bench/README.md measures the rule).
BOOST_AUTO_TEST_CASE(a_block_within_a_granule_may_take_the_back_of_its_hole_a_larger_one_the_front) {
  host_arena a{host_vmm{{.granularity = 64_KiB}},
               {.release_threshold = 0, .release_threshold_divisor = 0, .keep_up_to_peak = false}};
  const block first = a.allocate(64_KiB, 256);  // granule 0
  const block hole = a.allocate(160_KiB, 256);  // granules 1, 2 and the first half of 3
  const block next = a.allocate(32_KiB, 256);   // the second half of granule 3
  const block last = a.allocate(64_KiB, 256);   // granule 4: the hole is not the range's rest
  BOOST_REQUIRE(first && hole && next && last);
  // As void*: a failed check prints a pointer, not the memory behind a char* (maybe unmapped).
  const auto at = [base = static_cast<char*>(first.ptr)](std::size_t offset) -> void* { return base + offset; };
  BOOST_REQUIRE(next.ptr == at(224_KiB));
  fill_pattern(next, 1);
  a.deallocate(hole);  // granules 1 and 2 wholly free: unmapped at threshold 0
  BOOST_TEST(a.mapped_bytes() == 192_KiB);
  const std::size_t maps = a.counters().num_maps;
  // Half a granule: at the front it would touch granule 1, at the back it lies in granule 3.
  const block small = a.allocate(32_KiB, 256);
  BOOST_REQUIRE(small);
  BOOST_TEST(small.ptr == at(192_KiB));
  BOOST_TEST(a.counters().num_maps == maps, "no granule mapped");
  fill_pattern(small, 2);
  a.deallocate(small);
  // A granule and a half: the back (granules 2-3) would touch one untouched granule, the front
  // (1-2) touches two; it goes to the front all the same.
  const block large = a.allocate(96_KiB, 256);
  BOOST_REQUIRE(large);
  BOOST_TEST(large.ptr == at(64_KiB));
  BOOST_TEST(a.counters().num_maps == maps + 2);
  fill_pattern(large, 3);
  BOOST_TEST(has_pattern(next, 1));
  BOOST_TEST(a.check_invariants());
  for (const block& b : {first, large, next, last}) a.deallocate(b);
  BOOST_TEST(a.mapped_bytes() == 0u);
  BOOST_TEST(a.check_invariants());
}

BOOST_AUTO_TEST_CASE(block_sized_pieces_map_a_run_at_once_and_go_back_whole) {
  host_vmm v{{.granularity = 64_KiB}};
  {
    shared_arena a{vmm_ref<host_vmm>{v}, {.release_threshold = shared_arena::keep_all, .block_sized_pieces = true}};
    const block x = a.allocate(1_MiB, 64_KiB);  // granules 0-15, whole: one piece
    BOOST_REQUIRE(x);
    BOOST_TEST(a.counters().num_device_alloc == 1u);
    BOOST_TEST(a.counters().num_maps == 1u);
    BOOST_TEST(v.calls().creates == 1u);
    const block y = a.allocate(100_KiB, 256);  // granule 16 whole, 17 in part: a piece each
    BOOST_REQUIRE(y);
    BOOST_TEST(y.ptr == static_cast<char*>(x.ptr) + 1_MiB);
    BOOST_TEST(a.counters().num_maps == 3u);
    // Granule 17 (shared with y), 18-21 whole (one piece), 22 in part (its own: a neighbour may
    // come to share it).
    const block z = a.allocate(300_KiB, 256);
    BOOST_REQUIRE(z);
    BOOST_TEST(z.ptr == static_cast<char*>(y.ptr) + 100_KiB);
    BOOST_TEST(a.counters().num_maps == 5u);
    BOOST_TEST(a.counters().num_device_alloc == 5u);
    BOOST_TEST(a.reserved_bytes() == 23 * 64_KiB);
    fill_patterns({x, y, z});
    a.deallocate(x);
    BOOST_TEST(a.free_mapped_bytes() == 1_MiB);
    BOOST_TEST(a.stranded_free_bytes() == 0u);
    // Less than half the capacity held: the free piece serves a smaller block as it is, and the
    // rest of it cannot go back while that block lives.
    const block w = a.allocate(200_KiB, 256);  // 4 of the piece's granules
    BOOST_REQUIRE(w);
    BOOST_TEST((w.ptr >= x.ptr && static_cast<char*>(w.ptr) + w.size <= static_cast<char*>(x.ptr) + x.size));
    BOOST_TEST(a.counters().num_maps == 5u);
    BOOST_TEST(a.stranded_free_bytes() == 12 * 64_KiB);
    BOOST_TEST(a.free_mapped_bytes() == 12 * 64_KiB);
    BOOST_TEST(a.release() == 0u, "a piece goes back only whole");
    BOOST_TEST(a.counters().num_unmaps == 0u);
    BOOST_TEST(a.check_invariants());
    check_reported_pieces(a);
    a.deallocate(w);
    BOOST_TEST(a.stranded_free_bytes() == 0u);
    BOOST_TEST(a.release() == 1_MiB);
    BOOST_TEST(a.counters().num_unmaps == 1u);
    BOOST_TEST(has_pattern(y, 2));
    BOOST_TEST(has_pattern(z, 3));
    a.deallocate(y);
    a.deallocate(z);
    BOOST_TEST(a.release() == 7 * 64_KiB);
    BOOST_TEST(a.counters().num_unmaps == 5u);
    BOOST_TEST(a.counters().num_device_free == 5u);
    BOOST_TEST(a.check_invariants());
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(a_block_of_nearly_a_granule_goes_to_a_boundary_smaller_ones_pack_end_to_end) {
  // Threshold 0, nothing kept up to the peak: a granule goes as soon as it is free.
  host_arena a{host_vmm{{.granularity = 64_KiB}}, {.keep_up_to_peak = false}};
  const block x = a.allocate(40_KiB, 256);  // granule 0
  const block y = a.allocate(40_KiB, 256);  // under 3/4 of a granule: end to end, over granules 0 and 1
  const block z = a.allocate(56_KiB, 256);  // 3/4 or more: granule 2 rather than over 1 and 2 at 80 KiB
  const block w = a.allocate(44_KiB, 256);  // best fit: the 48 KiB left in granule 1, no new granule
  BOOST_REQUIRE((x && y && z && w));
  const auto offset = [&](const block& b) { return static_cast<char*>(b.ptr) - static_cast<char*>(x.ptr); };
  BOOST_TEST(offset(y) == 40 * 1024);
  BOOST_TEST(offset(z) == 128 * 1024);
  BOOST_TEST(offset(w) == 80 * 1024);
  BOOST_TEST(a.reserved_bytes() == 3 * 64_KiB);
  fill_patterns({x, y, z, w});
  BOOST_TEST(a.check_invariants());
  // With y and w gone, z holds one granule; straddling 1 and 2 it would have held two.
  a.deallocate(y);
  a.deallocate(w);
  BOOST_TEST(a.reserved_bytes() == 2 * 64_KiB);
  BOOST_TEST(has_pattern(x, 1));
  BOOST_TEST(has_pattern(z, 3));
  a.deallocate(x);
  a.deallocate(z);
  BOOST_TEST(a.reserved_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(frontier_growth_maps_granules_ahead_in_the_piece_while_the_device_holds_little) {
  host_vmm v{{.capacity = 64_MiB, .granularity = 64_KiB}};  // 1/16: 4 MiB, 64 granules
  {
    shared_arena a{
        vmm_ref<host_vmm>{v},
        {.release_threshold = shared_arena::keep_all, .block_sized_pieces = true, .frontier_growth_divisor = 4}};
    const block x = a.allocate(1_MiB, 64_KiB);  // granules 0-15 and 16/4 = 4 ahead: one piece
    BOOST_REQUIRE(x);
    BOOST_TEST(a.counters().num_maps == 1u);
    BOOST_TEST(v.calls().creates == 1u);
    BOOST_TEST(a.reserved_bytes() == 20 * 64_KiB);
    BOOST_TEST(a.free_mapped_bytes() == 4 * 64_KiB);
    BOOST_TEST(a.stranded_free_bytes() == 4 * 64_KiB);
    const block y = a.allocate(200_KiB, 256);  // granules 16-19, ahead already: no call
    BOOST_REQUIRE(y);
    BOOST_TEST(y.ptr == static_cast<char*>(x.ptr) + 1_MiB);
    BOOST_TEST(a.counters().num_maps == 1u);
    BOOST_TEST(a.free_mapped_bytes() == 0u);
    // A block of whole granules goes to the next boundary rather than span one more (19-35):
    // granules 20-35 and (20 + 16) / 4 = 9 ahead, one piece.
    const block z = a.allocate(1_MiB, 256);
    BOOST_REQUIRE(z);
    BOOST_TEST(z.ptr == static_cast<char*>(x.ptr) + 20 * 64_KiB);
    BOOST_TEST(a.counters().num_maps == 2u);
    BOOST_TEST(a.reserved_bytes() == 45 * 64_KiB);
    BOOST_TEST(a.free_mapped_bytes() == 9 * 64_KiB);
    // Granules 36-67: 36-44 mapped ahead, 45-67 new; with them 68 granules would be held, more
    // than 1/16 of the capacity: a block-sized piece of its own, nothing ahead.
    const block w = a.allocate(2_MiB, 64_KiB);
    BOOST_REQUIRE(w);
    BOOST_TEST(w.ptr == static_cast<char*>(x.ptr) + 36 * 64_KiB);
    BOOST_TEST(a.counters().num_maps == 3u);
    BOOST_TEST(a.reserved_bytes() == 68 * 64_KiB);
    BOOST_TEST(a.free_mapped_bytes() == 0u);
    fill_patterns({x, y, z, w});
    BOOST_TEST(a.check_invariants());
    check_reported_pieces(a);
    a.deallocate(y);
    BOOST_TEST(a.stranded_free_bytes() == 4 * 64_KiB, "granules 16-19, in x's piece");
    BOOST_TEST(a.release() == 0u, "pieces in use go back only whole");
    a.deallocate(x);
    BOOST_TEST(a.release() == 20 * 64_KiB, "the first piece, wholly free");
    a.deallocate(z);
    BOOST_TEST(a.release() == 0u);
    BOOST_TEST(a.stranded_free_bytes() == 16 * 64_KiB, "granules 20-35 of the second, which w shares");
    BOOST_TEST(has_pattern(w, 4));
    // 20 granules in the hole below w: at its front (0-19), all unmapped since the first piece
    // went back. They lie below mapped granules, so they take a run of their own and nothing
    // ahead. Granules 20-35 stay stranded: the hole's back would have reused them, but a block of
    // more than a granule does not go there (over the traces the front needs less memory).
    const block h = a.allocate(1_MiB + 256_KiB, 64_KiB);
    BOOST_REQUIRE(h);
    BOOST_TEST(h.ptr == x.ptr);
    BOOST_TEST(a.counters().num_maps == 4u);
    BOOST_TEST(a.stranded_free_bytes() == 16 * 64_KiB);
    BOOST_TEST(a.reserved_bytes() == 68 * 64_KiB);
    BOOST_TEST(a.check_invariants());
    a.deallocate(h);
    a.deallocate(w);
    BOOST_TEST(a.release() == 68 * 64_KiB);
    BOOST_TEST(a.counters().num_unmaps == 4u);
    BOOST_TEST(a.check_invariants());
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(a_small_heap_maps_two_granules_ahead_while_the_device_holds_very_little) {
  host_vmm v{{.capacity = 256_MiB, .granularity = 64_KiB}};  // 1/128: 2 MiB, 32 granules
  {
    shared_arena a{
        vmm_ref<host_vmm>{v},
        {.release_threshold = shared_arena::keep_all, .block_sized_pieces = true, .frontier_growth_divisor = 32}};
    BOOST_TEST(a.get_options().frontier_growth_min_granules == 2u);
    // Blocks of two granules each: 1/32 of the heap is no granule, so two go ahead, and every
    // other block finds its granules mapped.
    const block x = a.allocate(128_KiB, 256);  // granules 0-1, and 2-3 ahead: one piece
    BOOST_REQUIRE(x);
    BOOST_TEST(a.counters().num_maps == 1u);
    BOOST_TEST(a.reserved_bytes() == 4 * 64_KiB);
    BOOST_TEST(a.free_mapped_bytes() == 2 * 64_KiB);
    const block y = a.allocate(128_KiB, 256);  // 2-3: no call
    BOOST_REQUIRE(y);
    BOOST_TEST(y.ptr == static_cast<char*>(x.ptr) + 128_KiB);
    BOOST_TEST(a.counters().num_maps == 1u);
    const block z = a.allocate(128_KiB, 256);  // 4-5, and 6-7 ahead
    const block u = a.allocate(128_KiB, 256);  // 6-7: no call
    BOOST_REQUIRE(z);
    BOOST_REQUIRE(u);
    BOOST_TEST(a.counters().num_maps == 2u);
    BOOST_TEST(a.reserved_bytes() == 8 * 64_KiB);
    BOOST_TEST(a.free_mapped_bytes() == 0u);
    // 8-39: with two more, 42 granules would be held, more than 1/128 of the capacity, so only
    // 1/32 of the 40 mapped go ahead: one.
    const block w = a.allocate(2_MiB, 256);
    BOOST_REQUIRE(w);
    BOOST_TEST(w.ptr == static_cast<char*>(x.ptr) + 8 * 64_KiB);
    BOOST_TEST(a.counters().num_maps == 3u);
    BOOST_TEST(a.reserved_bytes() == 41 * 64_KiB);
    BOOST_TEST(a.free_mapped_bytes() == 64_KiB);
    fill_patterns({x, y, z, u, w});
    BOOST_TEST(a.check_invariants());
    check_reported_pieces(a);
    a.deallocate(x);
    BOOST_TEST(a.release() == 0u, "x's piece (0-3) holds y");
    BOOST_TEST(has_pattern(y, 2));
    a.deallocate(y);
    BOOST_TEST(a.release() == 4 * 64_KiB, "the first piece, wholly free");
    BOOST_TEST(has_pattern(z, 3));
    BOOST_TEST(has_pattern(u, 4));
    BOOST_TEST(has_pattern(w, 5));
    a.deallocate(z);
    a.deallocate(u);
    a.deallocate(w);
    BOOST_TEST(a.release() == 37 * 64_KiB);
    BOOST_TEST(a.counters().num_unmaps == 3u);
    BOOST_TEST(a.check_invariants());
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(edge_granules_join_the_run_while_the_device_holds_little) {
  host_vmm v{{.capacity = 256_MiB, .granularity = 64_KiB}};  // 1/64: 4 MiB, 64 granules
  {
    // Frontier growth on, but 1/1000 of a small heap is no granule and no minimum goes ahead:
    // the edge rule alone decides the pieces.
    shared_arena a{vmm_ref<host_vmm>{v},
                   {.release_threshold = shared_arena::keep_all,
                    .block_sized_pieces = true,
                    .frontier_growth_divisor = 1000,
                    .frontier_growth_min_granules = 0}};
    const block x = a.allocate(1_MiB, 64_KiB);  // granules 0-15, whole: one piece
    BOOST_REQUIRE(x);
    BOOST_TEST(a.counters().num_maps == 1u);
    const block y = a.allocate(100_KiB, 256);  // granule 16 whole, 17 in part: one piece (two without the rule)
    BOOST_REQUIRE(y);
    BOOST_TEST(y.ptr == static_cast<char*>(x.ptr) + 1_MiB);
    BOOST_TEST(a.counters().num_maps == 2u);
    const block z = a.allocate(300_KiB, 256);  // 17 (y's), 18-21 whole, 22 in part: one piece
    BOOST_REQUIRE(z);
    BOOST_TEST(z.ptr == static_cast<char*>(y.ptr) + 100_KiB);
    BOOST_TEST(a.counters().num_maps == 3u);
    BOOST_TEST(a.reserved_bytes() == 23 * 64_KiB);
    // 22 (z's), 23-69 whole, 70 in part: with them 71 granules would be held, more than 1/64 of
    // the capacity, so the edge gets its own piece again.
    const block w = a.allocate(3_MiB + 32_KiB, 256);
    BOOST_REQUIRE(w);
    BOOST_TEST(w.ptr == static_cast<char*>(z.ptr) + 300_KiB);
    BOOST_TEST(a.counters().num_maps == 5u);
    BOOST_TEST(a.counters().num_device_alloc == 5u);
    BOOST_TEST(a.reserved_bytes() == 71 * 64_KiB);
    fill_patterns({x, y, z, w});
    BOOST_TEST(a.check_invariants());
    check_reported_pieces(a);
    // What the rule costs: z's piece (18-22) is pinned by w, which shares its last granule.
    a.deallocate(z);
    BOOST_TEST(a.stranded_free_bytes() == 4 * 64_KiB, "granules 18-21");
    BOOST_TEST(a.mapped_bytes(alloy::tag{0}) == 71 * 64_KiB, "z's piece whole: what offloading the tag unmaps");
    BOOST_TEST(a.release() == 0u, "pieces in use go back only whole");
    BOOST_TEST(has_pattern(w, 4));
    a.deallocate(w);
    BOOST_TEST(a.release() == 53 * 64_KiB, "z's piece and w's two");
    BOOST_TEST(has_pattern(x, 1));
    BOOST_TEST(has_pattern(y, 2));
    a.deallocate(x);
    a.deallocate(y);
    BOOST_TEST(a.release() == 18 * 64_KiB);
    BOOST_TEST(a.counters().num_unmaps == 5u);
    BOOST_TEST(a.check_invariants());
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(block_sized_pieces_need_keep_all) {
  // With a release rule that trims granule by granule, pieces stay one granule each.
  host_arena a{host_vmm{{.granularity = 64_KiB}}, {.release_threshold = 1_MiB, .block_sized_pieces = true}};
  const block x = a.allocate(1_MiB, 64_KiB);
  BOOST_REQUIRE(x);
  BOOST_TEST(a.counters().num_maps == 16u);
  a.deallocate(x);
  BOOST_TEST(a.check_invariants());
}

BOOST_AUTO_TEST_CASE(block_sized_pieces_reused_in_part_go_back_first_past_half_the_capacity) {
  host_vmm v{{.capacity = 2_MiB, .granularity = 64_KiB}};
  {
    shared_arena a{vmm_ref<host_vmm>{v}, {.release_threshold = shared_arena::keep_all, .block_sized_pieces = true}};
    const block x = a.allocate(1_MiB, 64_KiB);   // one piece of 16 granules
    const block y = a.allocate(64_KiB, 64_KiB);  // granule 16: now more than half the capacity is held
    BOOST_REQUIRE(x);
    BOOST_REQUIRE(y);
    a.deallocate(x);
    // A block that would use 4 of the free piece's 16 granules: the piece goes back first, the
    // block maps its own (granules 0-2 whole in one piece, 3 in part apart).
    const block w = a.allocate(200_KiB, 256);
    BOOST_REQUIRE(w);
    BOOST_TEST(w.ptr == x.ptr);
    BOOST_TEST(a.counters().num_unmaps == 1u);
    BOOST_TEST(a.counters().num_maps == 4u);
    BOOST_TEST(a.stranded_free_bytes() == 0u);
    BOOST_TEST(a.reserved_bytes() == 5 * 64_KiB);
    BOOST_TEST(v.physical_bytes() == 5 * 64_KiB);
    // A block that covers a free piece whole reuses it, past half the capacity too.
    const block big = a.allocate(1_MiB, 64_KiB);
    BOOST_REQUIRE(big);
    a.deallocate(big);
    const std::size_t maps = a.counters().num_maps;
    const block again = a.allocate(1_MiB, 64_KiB);
    BOOST_TEST(again.ptr == big.ptr);
    BOOST_TEST(a.counters().num_maps == maps);
    BOOST_TEST(a.check_invariants());
    a.deallocate(again);
    // A block that touches every granule of the free piece but ends inside its last: the piece
    // goes back first (a neighbour sharing that granule would pin all 16), and the block maps its
    // 15 whole granules in one piece and the last apart.
    const std::size_t unmaps = a.counters().num_unmaps;
    const block most = a.allocate(1_MiB - 32_KiB, 64_KiB);
    BOOST_REQUIRE(most);
    BOOST_TEST(most.ptr == big.ptr);
    BOOST_TEST(a.counters().num_unmaps == unmaps + 1);
    BOOST_TEST(a.counters().num_maps == maps + 2);
    BOOST_TEST(v.physical_bytes() == 21 * 64_KiB);  // as before: w 4, y 1, these 16
    BOOST_TEST(a.check_invariants());
    a.deallocate(most);
    BOOST_TEST(a.stranded_free_bytes() == 0u);
    a.deallocate(w);
    a.deallocate(y);
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(block_sized_pieces_in_part_in_use_hold_their_memory_under_pressure) {
  host_vmm v{{.capacity = 4_MiB, .granularity = 64_KiB}};
  {
    shared_arena a{vmm_ref<host_vmm>{v}, {.release_threshold = shared_arena::keep_all, .block_sized_pieces = true}};
    const block x = a.allocate(1_MiB, 64_KiB);   // one piece of 16 granules
    const block y = a.allocate(64_KiB, 64_KiB);  // granule 16
    BOOST_REQUIRE(x);
    BOOST_REQUIRE(y);
    a.deallocate(x);
    const block w = a.allocate(64_KiB, 64_KiB);  // one granule of the free piece (a quarter held: reused)
    BOOST_REQUIRE(w);
    fill_pattern(w, 7);
    BOOST_TEST(a.stranded_free_bytes() == 15 * 64_KiB);
    // 48 granules more: 2 touched + 48 fit in 64, but 15 of the 17 held cannot go back.
    BOOST_TEST(!a.allocate(3_MiB, 64_KiB));
    BOOST_TEST(a.counters().num_ooms == 1u);
    BOOST_TEST(a.check_invariants());
    BOOST_TEST(v.physical_bytes() == 17 * 64_KiB, "what the failed request mapped went back");
    BOOST_TEST(has_pattern(w, 7));
    a.deallocate(w);  // the piece is wholly free: pressure can release it
    const alloy::allocator_counters before = a.counters();
    const block big = a.allocate(3_MiB, 64_KiB);
    BOOST_REQUIRE(big);
    // The run's create fails (17 + 48 granules > 64), the free piece goes back, and the run is
    // created again whole: one unmap, one map, one retry.
    BOOST_TEST(a.counters().num_alloc_retries - before.num_alloc_retries == 1u);
    BOOST_TEST(a.counters().num_unmaps - before.num_unmaps == 1u);
    BOOST_TEST(a.counters().num_maps - before.num_maps == 1u);
    BOOST_TEST(v.physical_bytes() == 49 * 64_KiB);
    BOOST_TEST(a.check_invariants());
    a.deallocate(big);
    a.deallocate(y);
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(release_threshold_keeps_the_most_recently_freed) {
  host_arena a{host_vmm{{.granularity = 64_KiB}}, {.release_threshold = 192_KiB, .keep_up_to_peak = false}};
  std::vector<block> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(a.allocate(64_KiB, 64_KiB));  // one granule each
    BOOST_REQUIRE(blocks.back());
  }
  BOOST_TEST(a.reserved_bytes() == 512_KiB);
  // Free granules 0, 2, 4, 6 in that order: three are kept, the oldest (0) goes.
  for (std::size_t i : {0u, 2u, 4u, 6u}) a.deallocate(blocks[i]);
  BOOST_TEST(a.free_mapped_bytes() == 192_KiB);
  BOOST_TEST(a.reserved_bytes() == 448_KiB);
  BOOST_TEST(a.counters().num_unmaps == 1u);
  std::size_t mapped_free_at_zero = 0;
  a.for_each_block([&](const alloy::block_info& info) {
    if (info.ptr == blocks[0].ptr) mapped_free_at_zero = info.state == alloy::block_state::unmapped ? 1 : 2;
  });
  BOOST_TEST(mapped_free_at_zero == 1u, "the least recently freed granule was unmapped");
  // A one-granule request takes a kept granule: no driver call.
  const std::size_t maps = a.counters().num_maps;
  const block again = a.allocate(64_KiB, 64_KiB);
  BOOST_REQUIRE(again);
  BOOST_TEST(a.counters().num_maps == maps);
  BOOST_TEST(a.free_mapped_bytes() == 128_KiB);
  BOOST_TEST(a.release() == 128_KiB);
  BOOST_TEST(a.free_mapped_bytes() == 0u);
  BOOST_TEST(a.reserved_bytes() == 320_KiB);
  BOOST_TEST(a.check_invariants());
}

BOOST_AUTO_TEST_CASE(release_threshold_divisor_keeps_a_share_of_the_touched_granules) {
  // Threshold 0, divisor 4: a free keeps floor(touched granules / 4) free mapped granules.
  host_arena a{host_vmm{{.granularity = 64_KiB}},
               {.release_threshold = 0, .release_threshold_divisor = 4, .keep_up_to_peak = false}};
  std::vector<block> blocks;
  for (int i = 0; i < 12; ++i) {
    blocks.push_back(a.allocate(64_KiB, 64_KiB));  // one granule each
    BOOST_REQUIRE(blocks.back());
  }
  struct step {
    int freed;
    std::size_t kept, unmaps;
  };
  // touched after each free: 11 -> keep 2, 10 -> 2, 9 -> 2, 8 -> 2, 7 -> 1, 6 -> 1.
  for (const step s : {step{0, 1, 0}, step{2, 2, 0}, step{4, 2, 1}, step{6, 2, 2}, step{8, 1, 4}, step{10, 1, 5}}) {
    a.deallocate(blocks[static_cast<std::size_t>(s.freed)]);
    BOOST_TEST(a.free_mapped_bytes() == s.kept * 64_KiB, "after freeing block " << s.freed);
    BOOST_TEST(a.counters().num_unmaps == s.unmaps, "after freeing block " << s.freed);
  }
  BOOST_TEST(a.reserved_bytes() == 7 * 64_KiB);
  // Divisor 0: only the threshold counts (0 here: every wholly free granule goes at once).
  host_arena b{host_vmm{{.granularity = 64_KiB}},
               {.release_threshold = 0, .release_threshold_divisor = 0, .keep_up_to_peak = false}};
  const block x = b.allocate(64_KiB, 64_KiB), y = b.allocate(64_KiB, 64_KiB);
  BOOST_REQUIRE(x);
  BOOST_REQUIRE(y);
  b.deallocate(x);
  BOOST_TEST(b.free_mapped_bytes() == 0u);
  BOOST_TEST(b.counters().num_unmaps == 1u);
  BOOST_TEST(a.check_invariants());
  BOOST_TEST(b.check_invariants());
}

BOOST_AUTO_TEST_CASE(keep_up_to_peak_holds_what_the_peak_needed_and_no_more) {
  // No threshold, no share: only the most granules touched at once (since construction or
  // release()) keeps granules. Here every block fills its granules, so that is the peak in use.
  host_arena a{host_vmm{{.granularity = 64_KiB}}, {.release_threshold = 0, .release_threshold_divisor = 0}};
  const block x = a.allocate(64_KiB, 64_KiB), y = a.allocate(64_KiB, 64_KiB), z = a.allocate(64_KiB, 64_KiB);
  BOOST_REQUIRE(x);
  BOOST_REQUIRE(y);
  BOOST_REQUIRE(z);
  a.deallocate(x);  // peak 3 granules, 2 touched: granule 0 stays mapped
  a.deallocate(z);  // 64 KiB touched: granules 0 and 2 stay mapped
  BOOST_TEST(a.free_mapped_bytes() == 128_KiB);
  BOOST_TEST(a.mapped_bytes() == 192_KiB);
  BOOST_TEST(a.counters().num_unmaps == 0u);
  // 128 KiB lands on granules 2-3 (best fit: the free chunk from granule 2 on). Granule 3 is
  // new, so granule 0 goes first: mapped never passes the peak, 192 KiB.
  const block w = a.allocate(128_KiB, 64_KiB);
  BOOST_REQUIRE(w);
  BOOST_TEST(w.ptr == z.ptr);
  BOOST_TEST(a.counters().num_maps == 4u);
  BOOST_TEST(a.counters().num_unmaps == 1u);
  BOOST_TEST(a.mapped_bytes() == 192_KiB);
  BOOST_TEST(a.free_mapped_bytes() == 0u);
  // A 64 KiB request takes no driver call while a kept granule is free (here after a free).
  a.deallocate(y);
  BOOST_TEST(a.free_mapped_bytes() == 64_KiB);
  const block v = a.allocate(64_KiB, 64_KiB);
  BOOST_REQUIRE(v);
  BOOST_TEST(a.counters().num_maps == 4u);
  // release() gives back every free granule and starts the peak again from what is touched.
  a.deallocate(v);
  BOOST_TEST(a.release() == 64_KiB);
  a.deallocate(w);  // peak 2 granules, nothing touched: both granules stay
  BOOST_TEST(a.free_mapped_bytes() == 128_KiB);
  BOOST_TEST(a.release() == 128_KiB);
  BOOST_TEST(a.mapped_bytes() == 0u);
  BOOST_TEST(a.counters().num_maps == a.counters().num_unmaps);
  BOOST_TEST(a.check_invariants());
}

// The peak that keeps granules is that of the granules touched, not of the bytes in use: blocks
// smaller than a granule, each on its own, keep a granule each after they go.
BOOST_AUTO_TEST_CASE(keep_up_to_peak_counts_touched_granules_not_bytes_in_use) {
  host_arena a{host_vmm{{.granularity = 64_KiB}}, {.release_threshold = 0, .release_threshold_divisor = 0}};
  std::vector<block> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(a.allocate(40_KiB, 64_KiB));  // a granule each: 160 KiB in use, 4 granules
    BOOST_REQUIRE(blocks.back());
  }
  BOOST_TEST(a.mapped_bytes() == 256_KiB);
  for (int i = 0; i < 3; ++i) a.deallocate(blocks[static_cast<std::size_t>(i)]);
  // The peak in use (160 KiB) would keep one granule beside the last block's; the peak touched
  // keeps all three.
  BOOST_TEST(a.free_mapped_bytes() == 192_KiB);
  BOOST_TEST(a.counters().num_unmaps == 0u);
  // Three more blocks take the kept granules: no driver call.
  for (int i = 0; i < 3; ++i) {
    blocks[static_cast<std::size_t>(i)] = a.allocate(40_KiB, 64_KiB);
    BOOST_REQUIRE(blocks[static_cast<std::size_t>(i)]);
  }
  BOOST_TEST(a.counters().num_maps == 4u);
  BOOST_TEST(a.free_mapped_bytes() == 0u);
  // A fifth block makes a peak of five granules: with every block gone, those five are kept.
  const block fifth = a.allocate(40_KiB, 64_KiB);
  BOOST_REQUIRE(fifth);
  for (const block& b : blocks) a.deallocate(b);
  a.deallocate(fifth);
  BOOST_TEST(a.mapped_bytes() == 320_KiB);
  BOOST_TEST(a.free_mapped_bytes() == 320_KiB);
  BOOST_TEST(a.release() == 320_KiB);
  BOOST_TEST(a.counters().num_maps == a.counters().num_unmaps);
  BOOST_TEST(a.check_invariants());
}

// Mapping without trimming first (allocate_keeping_cache) can leave more free mapped granules
// than the rule keeps: the next free trims them, also one that frees no granule itself.
BOOST_AUTO_TEST_CASE(a_free_trims_what_a_keeping_cache_allocation_left_over_the_rule) {
  host_arena a{host_vmm{{.granularity = 64_KiB}}, {.release_threshold = 0, .release_threshold_divisor = 0}};
  const block s1 = a.allocate(256, 256), s2 = a.allocate(256, 256);  // both in granule 0
  const block big = a.allocate(256_KiB, 64_KiB);                     // granules 1-4
  const block pin = a.allocate(64_KiB, 64_KiB);                      // granule 5: the hole stays one
  BOOST_REQUIRE((s1 && s2 && big && pin));
  BOOST_TEST(a.counters().num_maps == 6u);
  a.deallocate(big);  // a peak of 6 granules touched, 2 touched now: the four freed stay
  BOOST_TEST(a.free_mapped_bytes() == 256_KiB);
  BOOST_TEST(a.counters().num_unmaps == 0u);
  // 512 KiB does not fit the 256 KiB hole: eight new granules after the pin, nothing trimmed.
  const block wide = a.allocate_keeping_cache(512_KiB, 64_KiB);
  BOOST_REQUIRE(wide);
  BOOST_TEST(a.counters().num_maps == 14u);
  BOOST_TEST(a.free_mapped_bytes() == 256_KiB);
  // Granule 0 keeps s2, so this free frees no granule; the 10 granules touched are the peak, so
  // the rule keeps nothing: the four free granules go.
  a.deallocate(s1);
  BOOST_TEST(a.free_mapped_bytes() == 0u);
  BOOST_TEST(a.counters().num_unmaps == 4u);
  BOOST_TEST(a.check_invariants());
  a.deallocate(s2);
  a.deallocate(pin);
  a.deallocate(wide);
  a.release();
  BOOST_TEST(a.mapped_bytes() == 0u);
  BOOST_TEST(a.counters().num_maps == a.counters().num_unmaps);
}

// The two calls a composite shares its release rule through (granule_segregator): the free
// granules released down to a limit, least recently freed first, and the limit a hook sets on
// what is kept before granules are mapped, asked with the bytes about to be mapped.
BOOST_AUTO_TEST_CASE(release_free_beyond_and_the_free_keep_limit) {
  host_arena a{host_vmm{{.granularity = 64_KiB}}, {.release_threshold = 0, .release_threshold_divisor = 0}};
  std::vector<block> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(a.allocate(64_KiB, 64_KiB));  // granules 0-3
    BOOST_REQUIRE(blocks.back());
  }
  for (std::size_t i : {2u, 0u, 3u}) a.deallocate(blocks[i]);  // freed in this order, all kept
  BOOST_TEST(a.touched_bytes() == 64_KiB);
  BOOST_TEST(a.free_mapped_bytes() == 192_KiB);
  BOOST_TEST(a.release_free_beyond(64_KiB) == 128_KiB);  // granules 2 and 0 go, 3 stays
  BOOST_TEST(a.free_mapped_bytes() == 64_KiB);
  std::vector<alloy::block_state> states;
  a.for_each_block([&](const alloy::block_info& info) {
    if (info.size == 64_KiB) states.push_back(info.state);
  });
  using enum alloy::block_state;
  BOOST_TEST((states == std::vector{unmapped, allocated, unmapped, free}));
  BOOST_TEST(a.release_free_beyond(1_GiB) == 0u);  // a limit above what is kept releases nothing

  struct hook_calls {
    std::vector<std::size_t> about_to_map;
  } calls;
  a.set_free_keep_limit({[](void* context, const void*, std::size_t about_to_map) noexcept {
                           static_cast<hook_calls*>(context)->about_to_map.push_back(about_to_map);
                           return std::size_t{0};
                         },
                         &calls});
  // Best fit puts 64 KiB on granule 0 (the exact hole), unmapped: before mapping it the arena
  // asks the hook, with 64 KiB. Its own rule would keep granule 3 (4 granules touched at the
  // peak, 2 now); the hook's 0 keeps nothing.
  const std::size_t unmaps = a.counters().num_unmaps;
  const block on_zero = a.allocate(64_KiB, 64_KiB);
  BOOST_REQUIRE(on_zero);
  BOOST_TEST(on_zero.ptr == blocks[0].ptr);
  BOOST_TEST((calls.about_to_map == std::vector<std::size_t>{64_KiB}));
  BOOST_TEST(a.free_mapped_bytes() == 0u);
  BOOST_TEST(a.counters().num_unmaps == unmaps + 1);
  // Freed, granule 0 stays (the rule's; a free does not ask), and serves again without a map:
  // the hook is not asked.
  a.deallocate(on_zero);
  BOOST_TEST(a.free_mapped_bytes() == 64_KiB);
  const block again = a.allocate(64_KiB, 64_KiB);
  BOOST_REQUIRE(again);
  BOOST_TEST(calls.about_to_map.size() == 1u);
  a.deallocate(again);
  a.deallocate(blocks[1]);
  const std::size_t mapped = a.mapped_bytes();
  BOOST_TEST(a.release() == mapped);
  BOOST_TEST(a.counters().num_maps == a.counters().num_unmaps);
  BOOST_TEST(a.check_invariants());
}

// ---- capacity -----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(capacity_exhausted_freed_and_served_again) {
  host_vmm v{{.capacity = 1_MiB, .granularity = 64_KiB}};
  {
    shared_arena a{vmm_ref<host_vmm>{v}, {.release_threshold = 0, .keep_up_to_peak = false}};
    std::vector<block> blocks;
    BOOST_TEST(a.bytes_reservable_limit() == 1_MiB);
    for (int i = 0; i < 16; ++i) {
      blocks.push_back(a.allocate(64_KiB, 1));
      BOOST_REQUIRE(blocks.back());
      fill_pattern(blocks.back(), static_cast<std::uint64_t>(i));
    }
    BOOST_TEST(v.physical_bytes() == 1_MiB);
    BOOST_TEST(!a.allocate(1, 1), "the capacity is exhausted");
    BOOST_TEST(!a.allocate(64_KiB, 1));
    BOOST_TEST(a.counters().num_ooms == 2u);
    BOOST_TEST(a.counters().num_alloc_retries == 0u, "nothing to release: failed at once");
    BOOST_TEST(a.check_invariants());
    a.deallocate(blocks[5]);
    const block again = a.allocate(64_KiB, 1);
    BOOST_REQUIRE(again);
    BOOST_TEST(again.ptr == blocks[5].ptr, "best fit: the hole");
    blocks[5] = again;
    fill_pattern(again, 5);
    for (int i = 0; i < 16; ++i)
      BOOST_TEST(has_pattern(blocks[static_cast<std::size_t>(i)], static_cast<std::uint64_t>(i)));
    // A request larger than the capacity fails without touching the backend.
    const std::size_t creates = v.calls().creates;
    BOOST_TEST(!a.allocate(2_MiB, 1));
    BOOST_TEST(v.calls().creates == creates);
    for (const block& b : blocks) a.deallocate(b);
    BOOST_TEST(v.physical_bytes() == 0u);
    const block whole = a.allocate(1_MiB, 1);
    BOOST_REQUIRE(whole);
    a.deallocate(whole);
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(stitching_under_capacity_pressure) {
  host_vmm v{{.capacity = 1_MiB, .granularity = 64_KiB}};
  {
    // A large threshold: every free granule is kept until pressure needs it.
    shared_arena a{vmm_ref<host_vmm>{v}, {.release_threshold = 64_MiB}};
    std::vector<block> blocks;
    for (int i = 0; i < 16; ++i) {
      blocks.push_back(a.allocate(64_KiB, 1));
      BOOST_REQUIRE(blocks.back());
      fill_pattern(blocks.back(), static_cast<std::uint64_t>(i));
    }
    for (int i = 0; i < 16; i += 2) a.deallocate(blocks[static_cast<std::size_t>(i)]);
    BOOST_TEST(a.free_mapped_bytes() == 512_KiB);
    BOOST_TEST(a.reserved_bytes() == 1_MiB);
    BOOST_TEST(a.largest_free_block() == 64_KiB);
    // 512 KiB in one piece: no hole holds it, so it goes above them; its granules come from the
    // holes' physical memory (the holes are unmapped, their pages serve the new addresses).
    const block big = a.allocate(512_KiB, 1);
    BOOST_REQUIRE(big);
    BOOST_TEST(static_cast<char*>(big.ptr) >= static_cast<char*>(blocks[15].ptr) + 64_KiB);
    fill_pattern(big, 99);
    BOOST_TEST(a.counters().num_alloc_retries == 1u);
    BOOST_TEST(a.counters().num_ooms == 0u);
    BOOST_TEST(a.counters().num_device_alloc == 24u);
    BOOST_TEST(a.counters().num_device_free == 8u);
    BOOST_TEST(a.counters().num_maps == 24u);
    BOOST_TEST(a.counters().num_unmaps == 8u);
    BOOST_TEST(a.free_mapped_bytes() == 0u);
    BOOST_TEST(v.physical_bytes() == 1_MiB);
    for (int i = 1; i < 16; i += 2)
      BOOST_TEST(has_pattern(blocks[static_cast<std::size_t>(i)], static_cast<std::uint64_t>(i)));
    BOOST_TEST(has_pattern(big, 99));
    BOOST_TEST(a.check_invariants());
    check_reported_pieces(a);
    // Live 1 MiB: nothing more fits, and the failure leaves everything as it was.
    BOOST_TEST(!a.allocate(1, 1));
    BOOST_TEST(a.counters().num_ooms == 1u);
    BOOST_TEST(a.check_invariants());
    // allocate_keeping_cache never releases free granules to retry.
    a.deallocate(blocks[1]);
    BOOST_TEST(a.free_mapped_bytes() == 64_KiB);
    BOOST_TEST(!a.allocate_keeping_cache(128_KiB, 1));
    BOOST_TEST(a.free_mapped_bytes() == 64_KiB);
    BOOST_TEST(a.counters().num_ooms == 1u, "a keeping-cache failure is not an OOM");
    BOOST_TEST(a.check_invariants());
    a.deallocate(big);
    for (int i = 3; i < 16; i += 2) a.deallocate(blocks[static_cast<std::size_t>(i)]);
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(arenas_share_one_backend_capacity) {
  host_vmm v{{.capacity = 512_KiB, .granularity = 64_KiB}};
  {
    shared_arena one{vmm_ref<host_vmm>{v}, {.release_threshold = 1_MiB}};
    shared_arena two{vmm_ref<host_vmm>{v}, {.release_threshold = 1_MiB}};
    const block a = one.allocate(256_KiB, 1);
    const block b = two.allocate(192_KiB, 1);
    BOOST_REQUIRE(a);
    BOOST_REQUIRE(b);
    BOOST_TEST(!two.allocate(128_KiB, 1), "the other arena holds the rest");
    one.deallocate(a);  // kept free mapped in `one`: `two` cannot take it ...
    BOOST_TEST(!two.allocate(128_KiB, 1));
    BOOST_TEST(one.release() == 256_KiB);  // ... until `one` gives it back
    const block c = two.allocate(128_KiB, 1);
    BOOST_REQUIRE(c);
    two.deallocate(b);
    two.deallocate(c);
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(a_request_best_fit_cannot_map_goes_where_it_adds_no_granule) {
  // Granules of 64 KiB, five of capacity. Layout, in granules from the arena's start:
  //   A [0, 0.5)  free [0.5, 2)  C [2, 3)  free [3, 4)  E [4, 5)
  // With g1 and g3 unmapped and the other arena holding the two granules left, a request of half
  // a granule fits best in [3, 4) (the smaller hole), which needs g3 mapped: no capacity. The last
  // resort tries every free chunk and serves it at 0.5, in g0 beside A: no new granule.
  host_vmm v{{.capacity = 320_KiB, .granularity = 64_KiB}};
  {
    const shared_arena::options unmap_at_once{
        .release_threshold = 0, .release_threshold_divisor = 0, .keep_up_to_peak = false};
    shared_arena a{vmm_ref<host_vmm>{v}, unmap_at_once};
    shared_arena other{vmm_ref<host_vmm>{v}, unmap_at_once};
    const block front = a.allocate(32_KiB, 1);
    const block hole1 = a.allocate(96_KiB, 1);
    const block c = a.allocate(64_KiB, 1);
    const block hole2 = a.allocate(64_KiB, 1);
    const block e = a.allocate(64_KiB, 1);
    BOOST_REQUIRE(front && hole1 && c && hole2 && e);
    char* const base = static_cast<char*>(front.ptr);
    BOOST_REQUIRE(hole1.ptr == base + 32_KiB);
    BOOST_REQUIRE(c.ptr == base + 128_KiB);
    BOOST_REQUIRE(hole2.ptr == base + 192_KiB);
    BOOST_REQUIRE(e.ptr == base + 256_KiB);
    fill_pattern(front, 1);
    fill_pattern(c, 3);
    fill_pattern(e, 5);
    a.deallocate(hole1);
    a.deallocate(hole2);
    BOOST_TEST(a.mapped_bytes() == 192_KiB, "g1 and g3 went back at the frees");
    const block filler = other.allocate(128_KiB, 1);
    BOOST_REQUIRE(filler);
    BOOST_TEST(v.physical_bytes() == 320_KiB);

    const std::size_t creates = v.calls().creates;
    const block half = a.allocate(32_KiB, 1);
    BOOST_REQUIRE(half);
    BOOST_TEST(half.ptr == base + 32_KiB, "beside A, in the granule A touches");
    BOOST_TEST(v.calls().creates == creates, "no granule created");
    BOOST_TEST(a.counters().num_ooms == 0u);
    BOOST_TEST(a.counters().num_alloc_retries == 1u);
    fill_pattern(half, 2);
    BOOST_TEST(has_pattern(front, 1));
    BOOST_TEST(has_pattern(c, 3));
    BOOST_TEST(has_pattern(e, 5));
    BOOST_TEST(a.check_invariants());
    check_reported_pieces(a);
    // The rest of g0 is taken now; a whole granule still fits nowhere without a new one.
    BOOST_TEST(!a.allocate(64_KiB, 1));
    BOOST_TEST(a.counters().num_ooms == 1u);
    BOOST_TEST(a.check_invariants());
    for (const block& b : {front, half, c, e}) a.deallocate(b);
    other.deallocate(filler);
  }
  check_backend_clean(v);
}

// ---- failures of the backend --------------------------------------------------------------------------

namespace {

using failing = alloy::testing::failing_vmm<vmm_ref<host_vmm>>;

/// A scripted run: mixed sizes and alignments, frees, a release; invariants checked after every
/// call. Returns how many requests failed.
std::size_t scripted_run(virtual_arena<failing>& a) {
  static constexpr std::size_t sizes[] = {100, 384_KiB, 256, 70_KiB, 1152_KiB, 1, 64_KiB, 200_KiB, 4096, 256_KiB + 5};
  std::vector<alloy::testing::live_block> live;
  std::size_t failed = 0;
  for (std::uint64_t round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      const std::size_t alignment =
          i % 4 == 3 ? 64_KiB : 256;  // at most a granule: placement does not depend on where the range lies
      const block b = a.allocate(sizes[i], alignment);
      BOOST_TEST(a.check_invariants());
      if (!b) {
        ++failed;
        continue;
      }
      BOOST_TEST(b.size == sizes[i]);
      BOOST_TEST(alloy::detail::is_aligned(b.ptr, alignment));
      const std::uint64_t id = round * 100 + i;
      fill_pattern(b, id);
      live.push_back({b, id, alignment});
      if (i % 3 == 2) {
        std::vector<alloy::testing::live_block> one{live.front()};
        live.erase(live.begin());
        alloy::testing::give_back(a, one);
        BOOST_TEST(a.check_invariants());
      }
    }
    BOOST_TEST(!alloy::testing::any_overlap(live));
  }
  // Every other block (in address order) goes; its granules stay free mapped (the threshold is
  // large), so a request that fits no hole needs their physical memory: pressure.
  std::sort(live.begin(), live.end(), [](const auto& l, const auto& r) { return l.b.ptr < r.b.ptr; });
  std::vector<alloy::testing::live_block> kept;
  for (std::size_t i = 0; i < live.size(); ++i) {
    if (i % 2 == 0) {
      std::vector<alloy::testing::live_block> one{live[i]};
      alloy::testing::give_back(a, one);
    } else {
      kept.push_back(live[i]);
    }
  }
  live.swap(kept);
  BOOST_TEST(a.check_invariants());
  const block big = a.allocate(1536_KiB, 256);
  BOOST_TEST(a.check_invariants());
  if (big) {
    fill_pattern(big, 999);
    live.push_back({big, 999, 256});
  } else {
    ++failed;
  }
  alloy::testing::give_back(a, live);
  a.release();
  BOOST_TEST(a.reserved_bytes() == 0u);
  BOOST_TEST(a.check_invariants());
  return failed;
}

/// The scripted run with a create, a map or any call failing at each call index (and from it on):
/// the failures are counted as OOMs and everything goes back to the backend.
/// `capacity`: by default tight enough that the end of the run meets pressure (5 MiB; the run
/// peaks near it).
void fail_at_every_call(const virtual_arena<failing>::options& options, std::size_t capacity = 5_MiB) {
  auto make_backend = [capacity] { return host_vmm{{.capacity = capacity, .granularity = 64_KiB}}; };
  std::size_t total_calls = 0;
  {
    host_vmm v = make_backend();
    {
      virtual_arena<failing> a{failing{vmm_ref<host_vmm>{v}}, options};
      BOOST_TEST(scripted_run(a) == 0u, "the scripted run must succeed when nothing fails");
      total_calls = a.vmm().calls();
      if (capacity == 5_MiB)
        BOOST_TEST(a.counters().num_alloc_retries > 0u, "the run is meant to meet capacity pressure");
    }
    check_backend_clean(v);
  }
  // Enough call indices for the matrix below to mean something (frontier growth makes fewer).
  BOOST_TEST(total_calls > (options.frontier_growth_divisor == 0 ? 30u : 15u));
  for (unsigned kinds : {unsigned{failing::all}, unsigned{failing::creates}, unsigned{failing::maps}}) {
    for (std::size_t k = 0; k <= total_calls; ++k) {
      for (bool from_k_on : {false, true}) {
        failing::options fail{.kinds = kinds};
        if (from_k_on) {
          fail.fail_from = k;
        } else {
          fail.fail_at = {k};
        }
        host_vmm v = make_backend();
        {
          virtual_arena<failing> a{failing{vmm_ref<host_vmm>{v}, fail}, options};
          const std::size_t failed = scripted_run(a);
          if (a.vmm().failures() == 0) BOOST_TEST(failed == 0u);
          BOOST_TEST(a.counters().num_ooms == failed);
        }
        BOOST_TEST_CONTEXT("failing call " << k << (from_k_on ? " on" : "") << ", kinds " << kinds) {
          check_backend_clean(v);
        }
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(backend_failing_at_every_call) {
  fail_at_every_call({.address_space = 16_MiB, .release_threshold = 4_MiB});
}

// virtual_allocator's options: nothing trimmed, runs of granules mapped as one piece.
BOOST_AUTO_TEST_CASE(backend_failing_at_every_call_with_block_sized_pieces) {
  fail_at_every_call(
      {.address_space = 16_MiB, .release_threshold = virtual_arena<failing>::keep_all, .block_sized_pieces = true});
}

// Block-sized pieces with frontier growth, on a backend of 64 MiB (granules ahead while it holds
// at most 4 MiB, most of the run; no pressure): a failing create or map of a piece with granules
// ahead falls back to the block's own pieces.
BOOST_AUTO_TEST_CASE(backend_failing_at_every_call_with_frontier_growth) {
  fail_at_every_call({.address_space = 16_MiB,
                      .release_threshold = virtual_arena<failing>::keep_all,
                      .block_sized_pieces = true,
                      .frontier_growth_divisor = 2},
                     64_MiB);
}

// A run's create failing: `allocate` goes on granule by granule (it may release free pieces, and
// single granules may fit), `allocate_keeping_cache` (stream_ordered's first try, which releases
// nothing) fails at once: granule by granule it would map what fits and fail the same way.
BOOST_AUTO_TEST_CASE(a_run_the_device_refuses_fails_a_keeping_cache_allocation_at_once) {
  host_vmm v{{.granularity = 64_KiB}};
  {
    virtual_arena<failing> a{failing{vmm_ref<host_vmm>{v}, {.fail_at = {0, 1}, .kinds = failing::creates}},
                             {.release_threshold = virtual_arena<failing>::keep_all, .block_sized_pieces = true}};
    // Four whole granules at the start of the range: one run.
    BOOST_TEST(!a.allocate_keeping_cache(256_KiB, 64_KiB));
    BOOST_TEST(a.vmm().calls() == 1u, "the run's create, and no granule after it");
    BOOST_TEST(v.calls().creates == 0u);
    BOOST_TEST(v.physical_bytes() == 0u);
    BOOST_TEST(a.counters().num_ooms == 0u, "a keeping-cache failure is not an OOM");
    BOOST_TEST(a.check_invariants());

    const block b = a.allocate(256_KiB, 64_KiB);  // create 1 (the run) fails, 2-5 (granules) do not
    BOOST_REQUIRE(b);
    BOOST_TEST(a.vmm().calls() == 6u);
    BOOST_TEST(a.counters().num_device_alloc == 4u, "a piece per granule after the run failed");
    BOOST_TEST(a.counters().num_maps == 4u);
    BOOST_TEST(a.counters().num_ooms == 0u);
    fill_pattern(b, 7);
    BOOST_TEST(has_pattern(b, 7));
    BOOST_TEST(a.check_invariants());
    check_reported_pieces(a);

    const block c = a.allocate_keeping_cache(256_KiB, 64_KiB);  // nothing fails now: one run
    BOOST_REQUIRE(c);
    BOOST_TEST(a.counters().num_device_alloc == 5u);
    fill_pattern(c, 8);
    BOOST_TEST(has_pattern(b, 7));
    BOOST_TEST(has_pattern(c, 8));
    a.deallocate(b);
    a.deallocate(c);
    BOOST_TEST(a.check_invariants());
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(reserve_failing_at_construction_is_retried_later) {
  host_vmm v{{.granularity = 64_KiB}};
  {
    // Calls 0 and 1: the construction's reserve and its smaller second try; 2 and 3: the same
    // at the first allocation.
    virtual_arena<failing> a{failing{vmm_ref<host_vmm>{v}, {.fail_at = {0, 1, 2, 3}, .kinds = failing::reserves}}};
    BOOST_TEST(a.address_space() == 0u);
    BOOST_TEST(!a.owns(block{&v, 1}));
    BOOST_TEST(!a.allocate(100, 1), "the second reserve fails too");
    BOOST_TEST(a.counters().num_ooms == 1u);
    BOOST_TEST(a.check_invariants());
    const block b = a.allocate(100, 1);
    BOOST_REQUIRE(b);
    BOOST_TEST(a.owns(b));
    BOOST_TEST(a.address_space() == 1_GiB * 1024, "the full size when the backend gives it");
    BOOST_TEST(a.check_invariants());
    a.deallocate(b);
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(an_eighth_of_the_addresses_when_the_full_range_is_refused) {
  host_vmm v{{.granularity = 64_KiB}};
  {
    virtual_arena<failing> a{failing{vmm_ref<host_vmm>{v}, {.fail_at = {0}, .kinds = failing::reserves}},
                             {.address_space = 64_MiB}};
    BOOST_TEST(a.address_space() == 8_MiB);
    const block b = a.allocate(1_MiB, 1);
    BOOST_REQUIRE(b);
    fill_pattern(b, 1);
    BOOST_TEST(has_pattern(b, 1));
    a.deallocate(b);
    BOOST_TEST(a.check_invariants());
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(the_range_grows_in_place_or_the_request_fails) {
  host_vmm v{{.granularity = 64_KiB}};
  {
    shared_arena a{vmm_ref<host_vmm>{v}, {.address_space = 1_MiB}};
    const block first = a.allocate(768_KiB, 1);
    BOOST_REQUIRE(first);
    fill_pattern(first, 1);
    // Does not fit in the remaining 256 KiB: more addresses are reserved, kept only if they lie
    // right after the range. Either way the arena stays consistent.
    const block second = a.allocate(512_KiB, 1);
    if (second) {
      BOOST_TEST(a.address_space() > 1_MiB);
      BOOST_TEST(a.owns(second));
      fill_pattern(second, 2);
      BOOST_TEST(has_pattern(second, 2));
      a.deallocate(second);
    } else {
      BOOST_TEST(a.address_space() == 1_MiB);
      BOOST_TEST(a.counters().num_ooms == 1u);
    }
    BOOST_TEST(v.calls().reserves == v.calls().unreserves + (a.address_space() > 1_MiB ? 2u : 1u));
    BOOST_TEST(has_pattern(first, 1));
    BOOST_TEST(a.check_invariants());
    check_reported_pieces(a);
    a.deallocate(first);
  }
  check_backend_clean(v);
}

// ---- bad input (docs/design.md#errors) ---------------------------------------------------------------------------

namespace {

struct misuse_log {
  std::vector<alloy::misuse> kinds;
  static void record(alloy::misuse kind, block, void* context) noexcept {
    static_cast<misuse_log*>(context)->kinds.push_back(kind);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(bad_input_is_refused_and_leaves_the_arena_as_it_was) {
  misuse_log log;
  host_vmm v{{.granularity = 64_KiB}};
  {
    shared_arena a{
        vmm_ref<host_vmm>{v},
        {.release_threshold = 0, .keep_up_to_peak = false, .on_misuse = &misuse_log::record, .misuse_context = &log}};
    constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
    for (std::size_t bytes : {max, max - 1, max - 255, max / 2 + 1, max / 2, std::size_t{1} << 44})
      for (std::size_t alignment : {1u, 256u, 4096u, 1u << 20}) BOOST_TEST(!a.allocate(bytes, alignment));
    for (std::size_t alignment : {0u, 3u, 6u, 12u, 1000u, 4097u}) BOOST_TEST(!a.allocate(64, alignment));
    BOOST_TEST(v.physical_bytes() == 0u, "nothing was created for impossible requests");
    BOOST_TEST(a.check_invariants());

    const block zero1 = a.allocate(0, 1);
    const block zero2 = a.allocate(0, 1);
    BOOST_REQUIRE(zero1);
    BOOST_REQUIRE(zero2);
    BOOST_TEST(zero1.size == 0u);
    BOOST_TEST(zero1.ptr != zero2.ptr);
    const block b = a.allocate(1000, 64);
    BOOST_REQUIRE(b);
    fill_pattern(b, 5);
    const std::size_t mapped = a.reserved_bytes();

    BOOST_TEST(!a.try_deallocate(block{static_cast<char*>(b.ptr) + 512, 100}), "interior: refused");
    a.deallocate(block{static_cast<char*>(b.ptr) + 256, 100});  // interior
    int on_stack = 0;
    a.deallocate(block{&on_stack, sizeof on_stack});  // foreign
    a.deallocate(block{b.ptr, 999});                  // wrong size: stays allocated
    BOOST_TEST(has_pattern(b, 5));
    a.deallocate(b);
    a.deallocate(b);        // double
    a.deallocate(block{});  // null: nothing
    BOOST_TEST(log.kinds.size() == 5u);
    BOOST_TEST(a.misuses().foreign_pointers == 3u);
    BOOST_TEST(a.misuses().wrong_sizes == 1u);
    BOOST_TEST(a.misuses().double_frees == 1u);
    BOOST_TEST(a.reserved_bytes() <= mapped);
    BOOST_TEST(a.check_invariants());
    BOOST_TEST(a.try_deallocate(zero1));
    BOOST_TEST(a.try_deallocate(block{}));
    a.deallocate(zero2);
    BOOST_TEST(a.bytes_in_use() == 0u);
    BOOST_TEST(a.reserved_bytes() == 0u);
    BOOST_TEST(a.check_invariants());
  }
  check_backend_clean(v);
}

BOOST_AUTO_TEST_CASE(moves_hand_over_everything) {
  host_vmm v{{.granularity = 64_KiB}};
  {
    shared_arena a{vmm_ref<host_vmm>{v}, {.release_threshold = 0, .keep_up_to_peak = false}};
    const block b = a.allocate(300_KiB, 4096);
    BOOST_REQUIRE(b);
    fill_pattern(b, 3);
    shared_arena moved = std::move(a);
    BOOST_TEST(moved.owns(b));
    BOOST_TEST(!a.owns(b));
    BOOST_TEST(a.reserved_bytes() == 0u);
    BOOST_TEST(has_pattern(b, 3));
    shared_arena other{vmm_ref<host_vmm>{v}, {.release_threshold = 0, .keep_up_to_peak = false}};
    const block c = other.allocate(10, 1);
    BOOST_REQUIRE(c);
    other = std::move(moved);  // `other`'s own block and range go back
    BOOST_TEST(other.owns(b));
    BOOST_TEST(has_pattern(b, 3));
    BOOST_TEST(other.check_invariants());
    other.deallocate(b);
    BOOST_TEST(other.reserved_bytes() == 0u);
  }
  check_backend_clean(v);
}

// ---- the model-based randomized test ------------------------------------------------------------------

namespace {

/// What the arena must hold, kept independently: live blocks by address, and for each granule
/// how many live chunks touch it.
struct model {
  struct entry {
    block b;
    std::size_t chunk;  ///< rounded extent
    std::uint64_t id;
    bool filled;  ///< whole pattern written (else only the first and last word)
  };
  std::size_t rounding, g;
  std::uintptr_t base = 0;
  std::map<std::uintptr_t, entry> live;
  std::unordered_map<std::size_t, std::uint32_t> touched;  ///< granule -> live chunks touching it
  std::vector<std::uintptr_t> addresses;                   ///< for picking a victim at random

  std::size_t chunk_of(std::size_t bytes) const { return alloy::detail::round_up(bytes == 0 ? 1 : bytes, rounding); }
  void touch(std::uintptr_t at, std::size_t chunk, int by) {
    for (std::size_t k = (at - base) / g; k <= (at + chunk - 1 - base) / g; ++k) {
      std::uint32_t& n = touched[k];
      n = static_cast<std::uint32_t>(static_cast<int>(n) + by);
      if (n == 0) touched.erase(k);
    }
  }
  bool overlaps(std::uintptr_t at, std::size_t chunk) const {
    auto after = live.lower_bound(at);
    if (after != live.end() && after->first < at + chunk) return true;
    if (after != live.begin()) {
      auto before = std::prev(after);
      if (before->first + before->second.chunk > at) return true;
    }
    return false;
  }
};

void write_marks(const model::entry& e) {
  if (e.filled) {
    fill_pattern(e.b, e.id);
  } else if (e.b.size >= 16) {
    const std::uint64_t head = alloy::testing::pattern_word(e.id, 0), tail = alloy::testing::pattern_word(e.id, 1);
    std::memcpy(e.b.ptr, &head, 8);
    std::memcpy(static_cast<char*>(e.b.ptr) + e.b.size - 8, &tail, 8);
  }
}
bool marks_hold(const model::entry& e) {
  if (e.filled) return has_pattern(e.b, e.id);
  if (e.b.size < 16) return true;
  const std::uint64_t head = alloy::testing::pattern_word(e.id, 0), tail = alloy::testing::pattern_word(e.id, 1);
  return std::memcmp(e.b.ptr, &head, 8) == 0 && std::memcmp(static_cast<char*>(e.b.ptr) + e.b.size - 8, &tail, 8) == 0;
}

BOOST_AUTO_TEST_CASE(a_free_piece_reused_in_part_goes_back_first_when_much_of_it_would_stay_free) {
  host_vmm v{{.capacity = 16_MiB, .granularity = 64_KiB}};
  {
    // 1/32 of the capacity: a piece goes back first when more than 8 of its granules stay free,
    // while the backend holds more than 1/8 of it (2 MiB; 3 MiB below).
    shared_arena a{
        vmm_ref<host_vmm>{v},
        {.release_threshold = shared_arena::keep_all, .block_sized_pieces = true, .piece_leftover_share = 32}};
    const block x = a.allocate(1_MiB, 64_KiB);  // granules 0-15, one piece
    const block y = a.allocate(1_MiB, 64_KiB);  // 16-31
    const block u = a.allocate(1_MiB, 64_KiB);  // 32-47
    BOOST_REQUIRE((x && y && u));
    BOOST_TEST(a.counters().num_maps == 3u);
    fill_patterns({x, y, u});
    a.deallocate(y);
    // 10 of y's granules: 6 stay free, no more than 8, so the piece serves the block as it is,
    // without a driver call, and those 6 cannot go back while it lives.
    const block z = a.allocate(640_KiB, 64_KiB);
    BOOST_REQUIRE(z);
    BOOST_TEST(z.ptr == y.ptr);
    BOOST_TEST(a.counters().num_maps == 3u);
    BOOST_TEST(a.counters().num_unmaps == 0u);
    BOOST_TEST(a.stranded_free_bytes() == 6 * 64_KiB);
    a.deallocate(x);
    // 7 of x's granules (y's 6 free ones are too few): 9 would stay free, more than 8, so the
    // piece goes back first and the block maps a piece of its own.
    const block w = a.allocate(448_KiB, 64_KiB);
    BOOST_REQUIRE(w);
    BOOST_TEST(w.ptr == x.ptr);
    BOOST_TEST(a.counters().num_unmaps == 1u);
    BOOST_TEST(a.counters().num_maps == 4u);
    BOOST_TEST(a.stranded_free_bytes() == 6 * 64_KiB);
    BOOST_TEST(a.reserved_bytes() == 39 * 64_KiB);
    BOOST_TEST(a.check_invariants());
    check_reported_pieces(a);
    BOOST_TEST(has_pattern(u, 3));
    fill_patterns({w, z});
    BOOST_TEST(has_pattern(w, 1));
    BOOST_TEST(has_pattern(z, 2));
    a.deallocate(w);
    a.deallocate(z);
    a.deallocate(u);
    BOOST_TEST(a.release() == 39 * 64_KiB);
    BOOST_TEST(a.check_invariants());
  }
}

// The model run's checks, made tens of millions of times: Boost.Test is entered only when one
// fails (its bookkeeping per assertion was most of the run's time).
#define MODEL_REQUIRE(condition)                \
  do {                                          \
    if (!(condition)) BOOST_REQUIRE(condition); \
  } while (false)

/// `threshold`: the arena's release_threshold; `divisor` its release_threshold_divisor;
/// `up_to_peak` its keep_up_to_peak (free mapped granules kept: the most of the threshold, the
/// touched bytes ÷ divisor and the most granules touched at once since the last release() less
/// those touched now);
/// `block_sized` its block_sized_pieces (keep_all only), whose free granules in pieces still in
/// use (`stranded_free_bytes`) neither release() nor pressure can give back; `frontier_divisor` its
/// frontier_growth_divisor (with block_sized only); `leftover_share` its piece_leftover_share.
void run_model(std::uint64_t seed, std::size_t operations, std::size_t threshold = 4_MiB, std::size_t divisor = 32,
               bool up_to_peak = true, bool block_sized = false, std::size_t frontier_divisor = 0,
               std::size_t leftover_share = 0) {
  constexpr std::size_t g = 64_KiB;
  constexpr std::size_t capacity = 32_MiB;
  host_vmm v{{.capacity = capacity, .granularity = g}};
  {
    shared_arena a{vmm_ref<host_vmm>{v},
                   {.release_threshold = threshold,
                    .release_threshold_divisor = divisor,
                    .keep_up_to_peak = up_to_peak,
                    .block_sized_pieces = block_sized,
                    .frontier_growth_divisor = frontier_divisor,
                    .piece_leftover_share = leftover_share}};
    model m{.rounding = 256, .g = g, .base = 0, .live = {}, .touched = {}, .addresses = {}};
    m.base = reinterpret_cast<std::uintptr_t>([&] {
      const void* seg = nullptr;
      a.for_each_block([&](const alloy::block_info& i) { seg = i.segment; });
      return seg;
    }());
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> log_size(0.0, 18.0);  // 1 B .. 256 KiB, log-uniform
    std::uint64_t next_id = 1;
    std::size_t failures = 0, served = 0, checks = 0;
    std::size_t target_live = 300;
    std::size_t peak_touched = 0;  // granules; the most touched at once since the last release()
    auto check_accounting = [&] {
      // Mapped bytes == the granules live chunks touch + the free mapped granules kept.
      const std::size_t touched = m.touched.size() * g;
      MODEL_REQUIRE(a.mapped_bytes() == touched + a.free_mapped_bytes());
      const std::size_t share = divisor == 0 ? 0 : (touched / divisor) / g * g;
      const std::size_t peak = std::max(peak_touched * g, touched);
      const std::size_t below_peak = up_to_peak ? peak - touched : 0;
      MODEL_REQUIRE(a.free_mapped_bytes() <= std::max({threshold, share, below_peak}));
      const std::size_t with_threshold = touched + std::min(threshold, capacity);  // keep_all: no bound but capacity
      MODEL_REQUIRE(a.mapped_bytes() <= std::max({with_threshold, touched + share, up_to_peak ? peak : 0}));
      MODEL_REQUIRE(v.physical_bytes() == a.mapped_bytes());
      MODEL_REQUIRE(a.allocated_chunk_count() == m.live.size());
    };
    for (std::size_t op = 0; op < operations; ++op) {
      if (op % 100'000 == 0) target_live = 50 + rng() % 800;  // phases of growing and shrinking
      const bool grow = m.live.empty() || (m.live.size() < target_live ? rng() % 8 != 0 : rng() % 8 == 0);
      if (grow) {
        const std::size_t bytes =
            static_cast<std::size_t>(std::exp2(log_size(rng))) - 1 + (rng() % 32 == 0 ? 1_MiB : 0);
        const std::size_t alignment = rng() % 16 == 0 ? std::size_t{1} << (rng() % 18) : 256;
        const block b = a.allocate(bytes, alignment);
        const std::size_t chunk = m.chunk_of(bytes);
        if (!b) {
          ++failures;
          // Only when the granules of live chunks plus those this request needs (at most its
          // span plus two partial granules), and the free ones stranded in pieces in use,
          // exceed the capacity.
          MODEL_REQUIRE(m.touched.size() * g + a.stranded_free_bytes() + chunk + 2 * g > capacity);
          continue;
        }
        ++served;
        const auto at = reinterpret_cast<std::uintptr_t>(b.ptr);
        MODEL_REQUIRE(b.size == bytes);
        MODEL_REQUIRE(at % alignment == 0);
        MODEL_REQUIRE(!m.overlaps(at, chunk));
        model::entry e{b, chunk, next_id++, rng() % 16 == 0};
        write_marks(e);
        m.live.emplace(at, e);
        m.addresses.push_back(at);
        m.touch(at, chunk, +1);
      } else {
        const std::size_t pick = rng() % m.addresses.size();
        const std::uintptr_t at = m.addresses[pick];
        m.addresses[pick] = m.addresses.back();
        m.addresses.pop_back();
        const auto found = m.live.find(at);
        MODEL_REQUIRE(marks_hold(found->second));
        peak_touched = std::max(peak_touched, m.touched.size());  // a peak ends with a free
        a.deallocate(found->second.b);
        m.touch(at, found->second.chunk, -1);
        m.live.erase(found);
      }
      check_accounting();
      if (op % 50'000 == 0) {
        ++checks;
        MODEL_REQUIRE(a.check_invariants());
        for (const auto& [at, e] : m.live) MODEL_REQUIRE(marks_hold(e));
      }
      if (frontier_divisor != 0 && op % 50'000 == 25'000) {
        // Everything goes and is released, so that the heap grows from nothing again: the
        // frontier growth below 1/16 of the capacity happens many times a run.
        for (const auto& [at, e] : m.live) {
          MODEL_REQUIRE(marks_hold(e));
          peak_touched = std::max(peak_touched, m.touched.size());
          a.deallocate(e.b);
          m.touch(at, e.chunk, -1);
        }
        m.live.clear();
        m.addresses.clear();
        a.release();
        MODEL_REQUIRE(a.mapped_bytes() == 0u);
        peak_touched = 0;
        check_accounting();
      }
      if (op % 250'000 == 249'999) {
        a.release();
        MODEL_REQUIRE(a.free_mapped_bytes() == a.stranded_free_bytes());
        if (!block_sized) MODEL_REQUIRE(a.stranded_free_bytes() == 0u);
        peak_touched = m.touched.size();
        check_accounting();
      }
    }
    BOOST_TEST(a.check_invariants());
    BOOST_TEST(served > operations / 3);
    BOOST_TEST(failures > 0u, "the run is meant to reach the capacity sometimes");
    BOOST_TEST(a.counters().num_alloc_retries > 0u, "... and to stitch under pressure");
    BOOST_TEST_MESSAGE("seed " << seed << ": " << served << " served, " << failures << " refused, "
                               << a.counters().num_maps << " maps, " << a.counters().num_unmaps << " unmaps, "
                               << a.counters().num_alloc_retries << " retries, " << checks << " full checks");
    for (const auto& [at, e] : m.live) BOOST_TEST(marks_hold(e));
  }
  check_backend_clean(v);
}

}  // namespace

// Under AddressSanitizer a quarter of each million-operation run (every rule still crosses its
// periodic release, reaches the capacity and stitches); the shorter runs need their whole length.
constexpr std::size_t ops(std::size_t n) { return alloy::testing::under_asan ? n / 4 : n; }

BOOST_AUTO_TEST_CASE(model_based_randomized) {
  for (std::uint64_t seed : {1u, 2u}) run_model(seed, ops(1'000'000));
  // A threshold of 4 granules, below the share of 1/32 of up to 512 touched granules (16), and
  // the share turned off: both bounds hold exactly as the rule says.
  run_model(3, ops(1'000'000), 256_KiB, 32, false);
  run_model(4, 500'000, 256_KiB, 0, false);
  // The defaults: no threshold, no share, what stays under the peak of the touched granules.
  run_model(5, ops(1'000'000), 0, 0, true);
  // keep_all (virtual_allocator's): no list of free granules; the pressure and release() find
  // them by a scan.
  run_model(6, ops(1'000'000), host_arena::keep_all, 32, true);
  // virtual_allocator's: keep_all with block-sized pieces.
  run_model(7, ops(1'000'000), host_arena::keep_all, 32, true, true);
  // ... and frontier growth (a granule ahead for every two mapped, while the backend holds at
  // most 2 MiB; every 50,000 operations the heap is emptied and released, and grows again).
  run_model(8, ops(1'000'000), host_arena::keep_all, 32, true, true, 2);
  // ... and a free piece reused in part goes back first when more than 8 granules of it would
  // stay free (1/64 of 32 MiB), even while the backend holds little.
  run_model(9, 500'000, host_arena::keep_all, 32, true, true, 2, 64);
}

// ---- statistics ---------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(stats_report_mapped_bytes_and_driver_calls) {
  alloy::stats<host_arena> s{
      host_arena{host_vmm{{.granularity = 64_KiB}}, {.release_threshold = 64_KiB, .keep_up_to_peak = false}}};
  const block a = s.allocate(100_KiB, 256);     // granules 0, 1
  const block b = s.allocate(40_KiB, 256);      // granules 1, 2 (under 3/4 of one: packed end to end)
  const block c = s.allocate(200_KiB, 64_KiB);  // granules 3 .. 6 (aligned: 4 whole granules at 192 KiB)
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(b);
  BOOST_REQUIRE(c);
  alloy::statistics st = s.statistics();
  BOOST_TEST(st.bytes_reserved == 7 * 64_KiB);
  BOOST_TEST(st.num_device_alloc == 7u);
  BOOST_TEST(st.bytes_reservable_limit == 0u, "an unlimited backend: no limit");
  BOOST_TEST(st.num_device_free == 0u);
  s.deallocate(c);  // four granules free: one kept (threshold 64 KiB), three go
  st = s.statistics();
  BOOST_TEST(st.bytes_reserved == 4 * 64_KiB);
  BOOST_TEST(st.num_device_free == 3u);
  BOOST_TEST(st.peak_bytes_reserved == 7 * 64_KiB);
  BOOST_TEST(st.bytes_in_use == 140_KiB);
  const alloy::allocator_counters k = s.inner().counters();
  BOOST_TEST(k.num_maps == 7u);
  BOOST_TEST(k.num_unmaps == 3u);
  s.deallocate(a);  // granule 0 free: kept, the older kept one goes
  st = s.statistics();
  BOOST_TEST(st.bytes_reserved == 3 * 64_KiB);
  BOOST_TEST(s.inner().counters().num_unmaps == 4u);
  // Free bytes the introspection sees are mapped ones only: unmapped ranges are not free memory.
  BOOST_TEST(st.largest_free_block == 100_KiB);  // granules 0-1 mapped and free; past b only 52 KiB are mapped
  const alloy::memory_snapshot snap = alloy::snapshot(s);
  BOOST_TEST(snap.reserved_bytes() == 3 * 64_KiB);
  BOOST_TEST(snap.used_bytes() == alloy::detail::round_up(40_KiB, 256));
  BOOST_TEST(snap.to_svg().find("unmapped") != std::string::npos);
  const std::string summary = alloy::memory_summary(s);
  BOOST_TEST(summary.find("Map calls: 7") != std::string::npos, summary);
  BOOST_TEST(summary.find("Unmap calls: 4") != std::string::npos, summary);
  BOOST_TEST(summary.find("Mapped memory: 192") != std::string::npos, summary);
  BOOST_TEST(summary.find("Unmapped addresses: ") != std::string::npos, summary);
  s.deallocate(b);
  // Nothing allocated: the kept granule is free and releasable, not a split held by a block
  // (the unmapped addresses beside it hold nothing).
  BOOST_TEST(s.inner().free_mapped_bytes() == 64_KiB);
  BOOST_TEST(alloy::memory_stats(s).at("inactive_split_bytes.all.current") == 0);
  s.inner().release();
  st = s.statistics();
  BOOST_TEST(st.bytes_reserved == 0u);
  BOOST_TEST(st.num_device_alloc == st.num_device_free);
}

BOOST_AUTO_TEST_SUITE_END()
