// SPDX-License-Identifier: Apache-2.0
// bench/virtual_memory/placement_model.hpp, whose figures bench/README.md quotes as evidence that
// the peak-mapped targets are out of reach of other online placements: against a plain model
// (live blocks in a map), every policy must hand out blocks that never overlap, count exactly the
// granules live blocks touch, and keep books that add up; and each policy must choose the chunk
// and the place it says it chooses.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "../../bench/virtual_memory/placement_model.hpp"

using alloy::bench::placement;
using alloy::bench::placement_model;
using alloy::bench::segregated_placement_model;

namespace {

constexpr std::size_t granule = 2u << 20;
constexpr std::size_t rounding = 256;
std::size_t rounded(std::size_t bytes) {
  return (std::max<std::size_t>(bytes, 1) + rounding - 1) / rounding * rounding;
}

/// Random allocations and frees (sizes log-uniform, 1 B to 8 MiB) through `model`, checked against
/// the live blocks after every step.
template <class Model>
void check_against_live_blocks(Model model, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(0, 23);
  std::map<std::uint64_t, std::size_t> live;  // offset -> rounded size
  std::vector<std::pair<std::uint64_t, std::size_t>> handles;
  for (int step = 0; step < 6000; ++step) {
    if (!handles.empty() && (rng() % 100 < 45 || handles.size() > 300)) {
      const std::size_t i = rng() % handles.size();
      model.deallocate(handles[i].first, handles[i].second);
      live.erase(handles[i].first);
      handles[i] = handles.back();
      handles.pop_back();
    } else {
      const auto bytes = static_cast<std::size_t>(std::exp2(log_size(rng)));
      const std::uint64_t at = model.allocate(bytes);
      BOOST_TEST_REQUIRE(at % rounding == 0);
      const auto next = live.lower_bound(at);
      if (next != live.end()) BOOST_TEST_REQUIRE(at + rounded(bytes) <= next->first);  // no overlap above
      if (next != live.begin()) {
        const auto before = std::prev(next);
        BOOST_TEST_REQUIRE(before->first + before->second <= at);  // nor below
      }
      live.emplace(at, rounded(bytes));
      handles.emplace_back(at, bytes);
    }
    std::set<std::uint64_t> touched;
    for (const auto& [at, size] : live)
      for (std::uint64_t g = at / granule; g <= (at + size - 1) / granule; ++g) touched.insert(g);
    BOOST_TEST_REQUIRE(model.touched_granules() == touched.size());
  }
  BOOST_TEST(model.consistent());
  for (const auto& [at, bytes] : handles) model.deallocate(at, bytes);
  BOOST_TEST(model.touched_granules() == 0u);
  BOOST_TEST(model.consistent());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(placement_models)

BOOST_AUTO_TEST_CASE(every_policy_places_without_overlap_and_counts_granules_exactly) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    for (const placement p :
         {placement::best_fit, placement::best_fit_granules, placement::first_fit, placement::fewest_new_granules}) {
      BOOST_TEST_CONTEXT("policy " << static_cast<int>(p) << ", seed " << seed) {
        check_against_live_blocks(placement_model{p, granule}, seed);
        check_against_live_blocks(segregated_placement_model{p, 64u << 10, granule}, seed);
      }
    }
  }
}

// Free chunks of 3 KiB at 0 and of 1 KiB at 8 KiB (the blocks between stay live): best fit takes
// the 1 KiB chunk for a 1 KiB block, first fit the lower one.
BOOST_AUTO_TEST_CASE(best_fit_takes_the_smallest_chunk_first_fit_the_lowest) {
  for (const placement p : {placement::best_fit, placement::first_fit}) {
    placement_model m{p, granule};
    const std::uint64_t a = m.allocate(3 << 10), b = m.allocate(5 << 10), c = m.allocate(1 << 10);
    (void)m.allocate(1 << 10);
    BOOST_TEST(a == 0u);
    BOOST_TEST(b == 3u << 10);
    BOOST_TEST(c == 8u << 10);
    m.deallocate(a, 3 << 10);
    m.deallocate(c, 1 << 10);
    BOOST_TEST(m.allocate(1 << 10) == (p == placement::best_fit ? 8u << 10 : 0u));
    BOOST_TEST(m.consistent());
  }
}

// A free granule of its own ([2, 4) MiB) and a larger hole over granules live blocks touch
// ([4.5, 7.5) MiB, between blocks in granules 2 and 3): for 1.25 MiB best fit takes the smaller
// chunk and adds a granule; fewest new granules takes the larger one and adds none.
BOOST_AUTO_TEST_CASE(fewest_new_granules_prefers_touched_granules_to_a_smaller_chunk) {
  placement_model fewest{placement::fewest_new_granules, granule}, best{placement::best_fit, granule};
  for (placement_model* m : {&fewest, &best}) {
    BOOST_TEST(m->allocate(2 << 20) == 0u);              // [0, 2 MiB): granule 0
    const std::uint64_t alone = m->allocate(2 << 20);    // [2, 4 MiB): granule 1, freed below
    BOOST_TEST(m->allocate(512 << 10) == 4u << 20);      // [4, 4.5 MiB): granule 2
    const std::uint64_t between = m->allocate(3 << 20);  // [4.5, 7.5 MiB), freed below
    BOOST_TEST(m->allocate(512 << 10) == 15u << 19);     // [7.5, 8 MiB): granule 3
    m->deallocate(alone, 2 << 20);
    m->deallocate(between, 3 << 20);
    BOOST_TEST(alone == 2u << 20);
    BOOST_TEST(between == 9u << 19);
    BOOST_TEST(m->touched_granules() == 3u);  // granules 0, 2 and 3
  }
  BOOST_TEST(best.allocate(5 << 18) == 2u << 20);
  BOOST_TEST(best.touched_granules() == 4u);
  BOOST_TEST(fewest.allocate(5 << 18) == 9u << 19);
  BOOST_TEST(fewest.touched_granules() == 3u);
  BOOST_TEST(fewest.consistent());
  BOOST_TEST(best.consistent());
}

// When a hole and the top add no granule either, the hole: the range stays low.
BOOST_AUTO_TEST_CASE(fewest_new_granules_fills_a_hole_before_the_top_on_a_tie) {
  placement_model m{placement::fewest_new_granules, granule};
  const std::uint64_t hole = m.allocate(512 << 10);  // [0, 512 KiB), freed below
  (void)m.allocate(512 << 10);                       // [512 KiB, 1 MiB): granule 0 stays touched
  m.deallocate(hole, 512 << 10);
  BOOST_TEST(m.allocate(256 << 10) == 0u);  // not the top at 1 MiB, in granule 0 too
  BOOST_TEST(m.consistent());
}

// A block of at most a granule goes to the back of best fit's chunk with the granule rule when its
// front would add a granule and its back would not.
BOOST_AUTO_TEST_CASE(granule_rule_puts_a_small_block_where_it_adds_no_granule) {
  placement_model m{placement::best_fit_granules, granule};
  const std::uint64_t first = m.allocate(3 << 20);  // [0, 3 MiB): granules 0-1
  (void)m.allocate(1 << 20);                        // [3 MiB, 4 MiB): granule 1
  const std::uint64_t hole = m.allocate(4 << 20);   // [4 MiB, 8 MiB): granules 2-3
  (void)m.allocate(1 << 20);                        // [8 MiB, 9 MiB): granule 4
  m.deallocate(hole, 4 << 20);                      // granules 2 and 3 untouched
  m.deallocate(first, 3 << 20);                     // granule 0 untouched, granule 1 still touched
  // Best fit's chunk for 1 MiB is the hole [0, 3 MiB); its front adds granule 0, its back
  // [2 MiB, 3 MiB) lies in granule 1, touched: the back.
  BOOST_TEST(m.allocate(1 << 20) == 2u << 20);
  BOOST_TEST(m.touched_granules() == 2u);
  BOOST_TEST(m.consistent());
}

// Small and large blocks never share a granule when kept apart.
BOOST_AUTO_TEST_CASE(segregated_ranges_keep_small_blocks_off_large_blocks_granules) {
  segregated_placement_model m{placement::best_fit, 64u << 10, granule};
  const std::uint64_t large = m.allocate(3 << 20), small = m.allocate(4 << 10);
  BOOST_TEST(small / granule != large / granule);
  BOOST_TEST(small / granule != (large + (3 << 20) - 1) / granule);
  BOOST_TEST(m.touched_granules() == 3u);  // two for the large block, one for the small one
  BOOST_TEST(m.consistent());
}

BOOST_AUTO_TEST_SUITE_END()
