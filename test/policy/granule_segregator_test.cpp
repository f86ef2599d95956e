// SPDX-License-Identifier: Apache-2.0
// granule_segregator over two virtual_arenas sharing one host_vmm: the routing rule on hand-made
// heaps, `virtual_arena::granules_added` against what the allocation then adds (randomized), the
// other part serving when the chosen one fails, a randomized run with fill patterns (no overlap,
// content intact) and exact figures against a model, and the release rule the parts share (by
// hand and randomized: never more mapped than the parts touched together at their peak).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <alloy/alloy.hpp>

#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::testing::fill_pattern;
using alloy::testing::has_pattern;
using alloy::testing::live_block;

namespace {

using vmm = alloy::vmm_ref<alloy::host_vmm>;
using arena = alloy::virtual_arena<vmm>;
using heap = alloy::granule_segregator<16_KiB, arena, arena>;

constexpr std::size_t granule = 64_KiB;
/// Every granule unmapped once no chunk touches it: mapped bytes are the granules live chunks touch.
const arena::options at_once{.release_threshold = 0, .release_threshold_divisor = 0, .keep_up_to_peak = false};

alloy::host_vmm device(std::size_t capacity = alloy::host_vmm::options{}.capacity) {
  return alloy::host_vmm{{.capacity = capacity, .granularity = granule}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_small_block_goes_where_it_adds_no_granule) {
  alloy::host_vmm d = device();
  heap h{arena{vmm{d}, at_once}, arena{vmm{d}, at_once}};
  // Empty heap: both parts would add a granule, so the small part serves.
  const alloy::block first = h.allocate(4_KiB, 256);
  BOOST_REQUIRE(first);
  BOOST_TEST(h.small_part().owns(first));
  // A large block on one granule and a half: 28 KiB of its second granule stay free, touched.
  const alloy::block large = h.allocate(100_KiB, 256);
  BOOST_REQUIRE(large);
  BOOST_TEST(h.large_part().owns(large));
  BOOST_TEST(h.large_part().mapped_bytes() == 2 * granule);
  // The small part's granule has room: small blocks stay there while it lasts.
  std::vector<alloy::block> small;
  for (int i = 0; i < 3; ++i) {
    small.push_back(h.allocate(16_KiB, 256));
    BOOST_REQUIRE(small.back());
    BOOST_TEST(h.small_part().owns(small.back()));
  }
  BOOST_TEST(h.small_part().mapped_bytes() == granule);
  // Now the small part would add a granule and the large part would not: the large part serves.
  BOOST_TEST(h.small_part().granules_added(16_KiB, 256) == 1u);
  BOOST_TEST(h.large_part().granules_added(16_KiB, 256) == 0u);
  BOOST_TEST(h.goes_to_large(16_KiB, 256));
  // The other allocating calls take the same route (`route_allocation`, not the one search).
  const alloy::block keeping = h.allocate_keeping_cache(16_KiB, 256);
  BOOST_REQUIRE(keeping);
  BOOST_TEST(h.large_part().owns(keeping));
  h.deallocate(keeping);
  const alloy::block beside_large = h.allocate(16_KiB, 256);
  BOOST_REQUIRE(beside_large);
  BOOST_TEST(h.large_part().owns(beside_large));
  BOOST_TEST(h.large_part().mapped_bytes() == 2 * granule);  // nothing added
  // 12 KiB are left there: the next 16 KiB block would add a granule in either part, so it goes
  // to the small part.
  BOOST_TEST(h.large_part().granules_added(16_KiB, 256) == 1u);
  const alloy::block next = h.allocate(16_KiB, 256);
  BOOST_REQUIRE(next);
  BOOST_TEST(h.small_part().owns(next));
  BOOST_TEST(h.small_part().mapped_bytes() == 2 * granule);
  // Frees find their part by address, whatever the size.
  BOOST_TEST(h.try_deallocate(beside_large));
  BOOST_TEST(h.large_part().bytes_in_use() == 100_KiB);
  BOOST_TEST(h.try_deallocate(large));
  BOOST_TEST(h.large_part().mapped_bytes() == 0u);
  BOOST_TEST(!h.try_deallocate(large));  // a double free is refused, counted by the arena
  BOOST_TEST(h.large_part().misuses().total() == 1u);
  for (const alloy::block& b : small) h.deallocate(b);
  h.deallocate(next);
  h.deallocate(first);
  BOOST_TEST(h.bytes_in_use() == 0u);
  BOOST_TEST(h.reserved_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(a_large_block_always_goes_to_the_large_part) {
  alloy::host_vmm d = device();
  heap h{arena{vmm{d}, at_once}, arena{vmm{d}, at_once}};
  const alloy::block small = h.allocate(1_KiB, 256);  // the small part now has 63 KiB free, touched
  BOOST_REQUIRE(small);
  BOOST_TEST(h.small_part().granules_added(20_KiB, 256) == 0u);
  const alloy::block b = h.allocate(20_KiB, 256);
  BOOST_REQUIRE(b);
  BOOST_TEST(h.large_part().owns(b));
  h.deallocate(b);
  h.deallocate(small);
}

// What `granules_added` says is what the allocation then adds: over at-once arenas mapped bytes
// are the granules live chunks touch, so the change in them is the answer; and
// `allocate_in_held_granules` serves exactly when it says none, changing nothing otherwise. Sizes
// from 1 byte to four granules, alignments up to two granules, random frees.
BOOST_AUTO_TEST_CASE(granules_added_is_what_the_allocation_adds) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    alloy::host_vmm d = device();
    arena a{vmm{d}, at_once};
    std::mt19937_64 rng(seed);
    std::vector<alloy::block> live;
    std::size_t checked = 0;
    for (int step = 0; step < 20000; ++step) {
      if (!live.empty() && rng() % 2 == 0) {
        const std::size_t i = rng() % live.size();
        a.deallocate(live[i]);
        live[i] = live.back();
        live.pop_back();
        continue;
      }
      const std::size_t bytes = rng() % 8 == 0 ? rng() % (4 * granule) : 1 + rng() % (granule / 4);
      const std::size_t alignment = std::size_t{1} << (rng() % 18);
      const std::size_t predicted = a.granules_added(bytes, alignment);
      const std::size_t before = a.mapped_bytes(), in_use = a.bytes_in_use();
      if (rng() % 2 == 0) {  // only where it adds none: a block exactly when none is predicted
        const alloy::block held = a.allocate_in_held_granules(bytes, alignment);
        BOOST_REQUIRE_EQUAL(static_cast<bool>(held), predicted == 0);
        BOOST_REQUIRE_EQUAL(a.mapped_bytes(), before);
        if (!held) {
          BOOST_REQUIRE_EQUAL(a.bytes_in_use(), in_use);  // nothing changed
          continue;
        }
        BOOST_REQUIRE(reinterpret_cast<std::uintptr_t>(held.ptr) % alignment == 0u);
        ++checked;
        live.push_back(held);
        continue;
      }
      const alloy::block b = a.allocate(bytes, alignment);
      BOOST_REQUIRE(b);
      BOOST_REQUIRE_EQUAL((a.mapped_bytes() - before) / granule, predicted);
      ++checked;
      live.push_back(b);
    }
    for (const alloy::block& b : live) a.deallocate(b);
    BOOST_TEST(a.mapped_bytes() == 0u);
    BOOST_TEST(checked > 5000u);
  }
}

// The part the rule picks cannot create a granule (the capacity is held by the other part's free
// mapped granules, which that part keeps): the other part serves from them.
BOOST_AUTO_TEST_CASE(the_other_part_serves_when_the_chosen_one_fails) {
  alloy::host_vmm d = device(2 * granule);
  const arena::options keep{.release_threshold = 1_MiB};
  heap h{arena{vmm{d}, keep}, arena{vmm{d}, keep}};
  const alloy::block large = h.allocate(2 * granule, 256);
  BOOST_REQUIRE(large);
  h.deallocate(large);  // two granules stay mapped in the large part, free
  BOOST_TEST(h.large_part().free_mapped_bytes() == 2 * granule);
  // Free mapped granules are not touched by a live chunk: both parts would add one.
  BOOST_TEST(!h.goes_to_large(4_KiB, 256));
  const alloy::block b = h.allocate(4_KiB, 256);
  BOOST_REQUIRE(b);
  BOOST_TEST(h.large_part().owns(b));
  BOOST_TEST(h.small_part().mapped_bytes() == 0u);
  BOOST_TEST(d.physical_bytes() == 2 * granule);
  h.deallocate(b);
  // Both parts refuse what the capacity cannot hold: before the empty block they gave their free
  // granules back (what one keeps may be what the other needs), nothing else changed.
  BOOST_TEST(!h.allocate(3 * granule, 256));
  BOOST_TEST(d.physical_bytes() == 0u);
  BOOST_TEST(h.large_part().free_mapped_bytes() == 0u);
  BOOST_TEST(h.bytes_in_use() == 0u);
  BOOST_TEST(h.small_part().check_invariants());
  BOOST_TEST(h.large_part().check_invariants());
}

// A part unmaps its own free granules when its request needs them, not the other part's: when
// both fail, the composite has both release and routes the request once more.
BOOST_AUTO_TEST_CASE(granules_one_part_keeps_serve_the_other_after_both_fail) {
  alloy::host_vmm d = device(4 * granule);
  heap h{arena{vmm{d}}, arena{vmm{d}}};  // the defaults: each keeps up to its own peak
  std::vector<alloy::block> small;
  for (int i = 0; i < 8; ++i) {  // two granules of 16 KiB blocks in the small part
    small.push_back(h.allocate(16_KiB, 256));
    BOOST_REQUIRE(small.back());
    BOOST_REQUIRE(h.small_part().owns(small.back()));
  }
  const alloy::block two = h.allocate(2 * granule, 256);
  BOOST_REQUIRE(two);
  BOOST_REQUIRE(h.large_part().owns(two));
  for (const alloy::block& b : small) h.deallocate(b);
  h.deallocate(two);
  BOOST_TEST(h.small_part().free_mapped_bytes() == 2 * granule);  // each keeps its peak
  BOOST_TEST(h.large_part().free_mapped_bytes() == 2 * granule);
  // Three granules: either part alone has its own two and no room on the device; both fail,
  // release, and the request is routed again.
  const alloy::block three = h.allocate(3 * granule, 256);
  BOOST_REQUIRE(three);
  BOOST_TEST(h.large_part().owns(three));
  BOOST_TEST(h.small_part().mapped_bytes() == 0u);
  BOOST_TEST(d.physical_bytes() == 3 * granule);
  fill_pattern(three, 7);
  BOOST_TEST(has_pattern(three, 7));
  h.deallocate(three);
  h.release();
  BOOST_TEST(d.physical_bytes() == 0u);
  BOOST_TEST(h.small_part().check_invariants());
  BOOST_TEST(h.large_part().check_invariants());
}

// Random requests (small, around the threshold, large) and frees through the composite, capacity
// limited so that requests fail at times: every block filled with its own pattern and checked
// when freed, no two overlapping, the figures against a model, and at the end nothing held.
BOOST_AUTO_TEST_CASE(random_runs_keep_contents_and_figures) {
  std::size_t failed_in_all = 0;
  for (const std::uint64_t seed : {11u, 12u}) {
    alloy::host_vmm d = device(96 * granule);
    heap h{arena{vmm{d}}, arena{vmm{d}}};
    std::mt19937_64 rng(seed);
    std::vector<live_block> live;
    std::size_t requested = 0, failed = 0, in_small = 0, in_large = 0;
    for (int step = 0; step < 30000; ++step) {
      if (!live.empty() && (rng() % 2 == 0 || live.size() > 300)) {
        const std::size_t i = rng() % live.size();
        BOOST_REQUIRE(has_pattern(live[i].b, live[i].id));
        BOOST_REQUIRE(h.try_deallocate(live[i].b));
        requested -= live[i].b.size;
        live[i] = live.back();
        live.pop_back();
        continue;
      }
      const unsigned kind = static_cast<unsigned>(rng() % 3);
      const std::size_t bytes = kind == 0   ? 1 + rng() % 4_KiB
                                : kind == 1 ? 8_KiB + rng() % 16_KiB
                                            : 1 + rng() % (3 * granule);
      const alloy::block b = h.allocate(bytes, 256);
      if (!b) {
        ++failed;
        continue;
      }
      BOOST_REQUIRE(b.size == bytes);
      BOOST_REQUIRE(reinterpret_cast<std::uintptr_t>(b.ptr) % 256 == 0u);
      BOOST_REQUIRE(h.small_part().owns(b) != h.large_part().owns(b));
      ++(h.small_part().owns(b) ? in_small : in_large);
      live.push_back({b, static_cast<std::uint64_t>(step), 256});
      fill_pattern(b, live.back().id);
      if (step % 1000 == 0) BOOST_REQUIRE(!alloy::testing::any_overlap(live));
      requested += bytes;
      BOOST_REQUIRE(h.requested_bytes() == requested);
      BOOST_REQUIRE(h.reserved_bytes() == d.physical_bytes());
    }
    BOOST_TEST(!alloy::testing::any_overlap(live));
    for (const live_block& l : live) {
      BOOST_REQUIRE(has_pattern(l.b, l.id));
      h.deallocate(l.b);
    }
    BOOST_TEST(h.requested_bytes() == 0u);
    BOOST_TEST_MESSAGE("seed " << seed << ": " << in_small << " blocks from the small part, " << in_large
                               << " from the large one, " << failed << " requests failed");
    failed_in_all += failed;
    BOOST_TEST(in_small > 1000u);
    BOOST_TEST(in_large > 1000u);
    h.release();
    BOOST_TEST(d.physical_bytes() == 0u);
    BOOST_TEST(h.small_part().check_invariants());
    BOOST_TEST(h.large_part().check_invariants());
  }
  BOOST_TEST(failed_in_all > 0u);  // the capacity ran short: both parts were tried
}

// ---- the shared release rule ----------------------------------------------------------------

static_assert(heap::shares_release_rule);

// Each arena alone keeps free granules up to the peak of its own touched granules; together they
// keep them up to the peak of the granules both touched at once. Run on a heap moved twice (the
// parts' keep limits point at the heap that holds them).
BOOST_AUTO_TEST_CASE(the_parts_keep_free_granules_up_to_the_peak_they_touched_together) {
  alloy::host_vmm d = device();
  heap first{arena{vmm{d}}, arena{vmm{d}}};  // the defaults: keep up to the peak
  heap moved{std::move(first)};
  heap h{arena{vmm{d}}, arena{vmm{d}}};
  h = std::move(moved);
  std::vector<alloy::block> small;
  for (int i = 0; i < 4; ++i) {  // one granule of 16 KiB blocks in the small part
    small.push_back(h.allocate(16_KiB, 256));
    BOOST_REQUIRE(small.back());
    BOOST_REQUIRE(h.small_part().owns(small.back()));
  }
  for (const alloy::block& b : small) h.deallocate(b);
  BOOST_TEST(h.small_part().free_mapped_bytes() == granule);  // its own peak keeps it
  // Two granules in the large part: the peak together becomes two granules, touched by the large
  // block alone, so the small part's free granule goes before they are mapped (alone, each
  // keeping up to its own peak: three granules mapped).
  const alloy::block two = h.allocate(2 * granule, 256);
  BOOST_REQUIRE(two);
  BOOST_REQUIRE(h.large_part().owns(two));
  BOOST_TEST(h.small_part().mapped_bytes() == 0u);
  BOOST_TEST(d.physical_bytes() == 2 * granule);
  BOOST_TEST(h.peak_touched_bytes() == 2 * granule);
  h.deallocate(two);
  BOOST_TEST(h.large_part().free_mapped_bytes() == 2 * granule);  // the peak keeps both
  // A small block needs a granule of the small part (the large part's are free, not held): one
  // granule is touched, the peak is two, so the large part releases one of its two (least
  // recently freed first) and the small part keeps none.
  const alloy::block one = h.allocate(16_KiB, 256);
  BOOST_REQUIRE(one);
  BOOST_REQUIRE(h.small_part().owns(one));
  BOOST_TEST(h.large_part().free_mapped_bytes() == granule);
  BOOST_TEST(h.small_part().free_mapped_bytes() == 0u);
  BOOST_TEST(d.physical_bytes() == 2 * granule);
  // release() gives back the free granules and starts the peak again from what is touched.
  h.release();
  BOOST_TEST(d.physical_bytes() == granule);
  BOOST_TEST(h.peak_touched_bytes() == granule);
  h.deallocate(one);
  h.release();
  BOOST_TEST(d.physical_bytes() == 0u);
  BOOST_TEST(h.small_part().check_invariants());
  BOOST_TEST(h.large_part().check_invariants());
}

// Random phases of mostly small and mostly large requests, so that the parts peak at different
// times: after every call the device holds no more than the most granules the parts touched
// together (each part alone keeps up to its own peak, which passes that: the steps where it
// would are counted), and the heap's peak is that figure.
BOOST_AUTO_TEST_CASE(random_runs_map_no_more_than_the_parts_touched_together_at_their_peak) {
  for (const std::uint64_t seed : {21u, 22u, 23u}) {
    alloy::host_vmm d = device();
    heap h{arena{vmm{d}}, arena{vmm{d}}};
    std::mt19937_64 rng(seed);
    std::vector<alloy::block> live;
    std::size_t peak_together = 0, peaks_apart = 0, kept_steps = 0;
    std::size_t small_peak = 0, large_peak = 0;
    const auto touched = [&] { return h.small_part().touched_bytes() + h.large_part().touched_bytes(); };
    const auto check = [&] {
      peak_together = std::max(peak_together, touched());
      small_peak = std::max(small_peak, h.small_part().touched_bytes());
      large_peak = std::max(large_peak, h.large_part().touched_bytes());
      peaks_apart = std::max(peaks_apart, small_peak + large_peak);
      BOOST_REQUIRE_LE(d.physical_bytes(), peak_together);
      BOOST_REQUIRE_EQUAL(h.reserved_bytes(), d.physical_bytes());
      kept_steps += h.small_part().free_mapped_bytes() + h.large_part().free_mapped_bytes() != 0;
    };
    for (int step = 0; step < 40000; ++step) {
      const bool small_phase = (step / 2000) % 2 == 0;
      const std::size_t target = (step / 1000) % 3 == 0 ? 40 : 120;  // live blocks swell and shrink
      if (!live.empty() && (live.size() > target || rng() % 2 == 0)) {
        const std::size_t i = rng() % live.size();
        h.deallocate(live[i]);
        live[i] = live.back();
        live.pop_back();
      } else {
        const bool small = small_phase ? rng() % 8 != 0 : rng() % 8 == 0;
        const std::size_t bytes = small ? 1 + rng() % 16_KiB : 16_KiB + 1 + rng() % (4 * granule);
        const alloy::block b = h.allocate(bytes, 256);
        BOOST_REQUIRE(b);
        live.push_back(b);
      }
      check();
    }
    for (const alloy::block& b : live) {
      h.deallocate(b);
      check();
    }
    BOOST_TEST(h.peak_touched_bytes() == peak_together);
    BOOST_TEST_MESSAGE("seed " << seed << ": peak touched together " << peak_together / granule << " granules, apart "
                               << peaks_apart / granule << "; free granules kept after " << kept_steps << " calls");
    BOOST_TEST(kept_steps > 10000u);          // the rule keeps granules
    BOOST_TEST(peaks_apart > peak_together);  // each part's own peak would have let it keep more
    h.release();
    BOOST_TEST(d.physical_bytes() == 0u);
    BOOST_TEST(h.small_part().check_invariants());
    BOOST_TEST(h.large_part().check_invariants());
  }
}

// Planned growth answers with no plan, so `synchronized` calls `allocate` under its lock.
BOOST_AUTO_TEST_CASE(synchronized_allocates_under_its_lock) {
  using shared = alloy::vmm_ref<alloy::synchronized_vmm<alloy::host_vmm>>;
  using shared_arena = alloy::virtual_arena<shared>;
  alloy::synchronized_vmm<alloy::host_vmm> d{device()};
  alloy::synchronized<alloy::granule_segregator<16_KiB, shared_arena, shared_arena>> h{
      {shared_arena{shared{d}}, shared_arena{shared{d}}}};
  static_assert(alloy::growth_planning_allocator<alloy::granule_segregator<16_KiB, shared_arena, shared_arena>>);
  const alloy::block a = h.allocate(4_KiB, 256), b = h.allocate(100_KiB, 256);
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(b);
  BOOST_TEST(h.reserved_bytes() == 3 * granule);
  h.deallocate(a);
  h.deallocate(b);
}

// The class comment's example, as written there.
BOOST_AUTO_TEST_CASE(the_class_comment_example_compiles_and_serves) {
  using namespace alloy;
  using arena = virtual_arena<vmm_ref<host_vmm>>;
  host_vmm device{{.capacity = 1_GiB}};
  granule_segregator<256_KiB, arena, arena> heap{arena{vmm_ref{device}}, arena{vmm_ref{device}}};
  const block small = heap.allocate(1_KiB, 256), large = heap.allocate(8_MiB, 256);
  BOOST_REQUIRE(small);
  BOOST_REQUIRE(large);
  BOOST_TEST(heap.small_part().owns(small));
  BOOST_TEST(heap.large_part().owns(large));
  heap.deallocate(small);
  heap.deallocate(large);
}
