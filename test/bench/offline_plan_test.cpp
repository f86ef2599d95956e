// SPDX-License-Identifier: Apache-2.0
// bench/virtual_memory/offline_plan.hpp, whose figures bench/README.md quotes as what a placement
// that knows every lifetime reaches: blocks live at the same time never overlap, the granules it
// reports are those its blocks touch (recounted here from the offsets), never fewer than the
// granule bound, and on a hand-made heap it reaches that bound where online best fit cannot.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "../../bench/virtual_memory/offline_plan.hpp"
#include "../../bench/virtual_memory/placement_model.hpp"

using alloy::bench::block_lifetime;
using alloy::bench::offline_plan;

namespace {

constexpr std::size_t granule = 2u << 20;
constexpr std::size_t rounding = 256;
constexpr std::size_t mib = 1u << 20;
std::size_t rounded(std::size_t bytes) {
  return (std::max<std::size_t>(bytes, 1) + rounding - 1) / rounding * rounding;
}

/// The most granules the blocks touch at once, and the most bytes live at once, counted from the
/// offsets alone.
struct recount {
  std::size_t peak_granules = 0, peak_live = 0;
};
recount recount_of(const std::vector<block_lifetime>& blocks, const offline_plan& plan) {
  std::size_t end = 0;
  for (const block_lifetime& b : blocks) end = std::max(end, b.end);
  recount r;
  for (std::size_t t = 0; t < end; ++t) {
    std::set<std::uint64_t> touched;
    std::size_t live = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].first > t || t >= blocks[i].end) continue;
      const std::uint64_t at = plan.offset(i), n = rounded(blocks[i].bytes);
      for (std::uint64_t g = at / granule; g <= (at + n - 1) / granule; ++g) touched.insert(g);
      live += n;
    }
    r.peak_granules = std::max(r.peak_granules, touched.size());
    r.peak_live = std::max(r.peak_live, live);
  }
  return r;
}

/// Blocks of random sizes (log-uniform, 1 B to 8 MiB) and lifetimes (a few to a few hundred
/// operations) over `operations`.
std::vector<block_lifetime> random_blocks(std::uint64_t seed, std::size_t count, std::size_t operations) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(0, 23), log_life(1, 8);
  std::vector<block_lifetime> blocks;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t first = rng() % operations;
    const auto life = static_cast<std::size_t>(std::exp2(log_life(rng)));
    blocks.push_back({first, std::min(operations, first + life), static_cast<std::size_t>(std::exp2(log_size(rng)))});
  }
  return blocks;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(offline_plan_suite)

BOOST_AUTO_TEST_CASE(live_blocks_never_overlap_and_the_granules_are_counted_exactly) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<block_lifetime> blocks = random_blocks(seed, 300, 400);
    const offline_plan plan(blocks, granule, rounding);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      BOOST_TEST_REQUIRE(plan.offset(i) % rounding == 0);
      for (std::size_t j = i + 1; j < blocks.size(); ++j) {
        const bool live_together = blocks[i].first < blocks[j].end && blocks[j].first < blocks[i].end;
        const bool apart = plan.offset(i) + rounded(blocks[i].bytes) <= plan.offset(j) ||
                           plan.offset(j) + rounded(blocks[j].bytes) <= plan.offset(i);
        BOOST_TEST_REQUIRE((!live_together || apart), "blocks " << i << " and " << j << " overlap, seed " << seed);
      }
    }
    const recount r = recount_of(blocks, plan);
    BOOST_TEST(plan.peak_touched_granules() == r.peak_granules);
    BOOST_TEST(plan.peak_live_bytes() == r.peak_live);
    BOOST_TEST(plan.peak_touched_granules() >= (r.peak_live + granule - 1) / granule);  // the granule bound
  }
}

// Three blocks of 1 MiB, the middle one short-lived, then one of 2 MiB once it is gone. Online
// best fit puts the three side by side, the 2 MiB block does not fit in the middle one's hole and
// goes above: it straddles a granule the third holds, 3 granules for 4 MiB. Knowing that the
// 2 MiB block comes, the plan puts it at the start, the two long-lived blocks in the next granule
// and the short one where the 2 MiB block comes later: 2 granules, the granule bound. (Placed
// before the third, the short one would take the granule the third needs: longer-lived first.)
BOOST_AUTO_TEST_CASE(knowing_the_lifetimes_reaches_the_granule_bound_where_best_fit_does_not) {
  const std::vector<block_lifetime> blocks{
      {0, 6, 1 * mib},  // A
      {1, 3, 1 * mib},  // B, freed before D comes
      {2, 6, 1 * mib},  // C
      {4, 6, 2 * mib},  // D
  };
  const offline_plan plan(blocks, granule, rounding);
  BOOST_TEST(plan.offset(3) == 0u);       // D first, at the start
  BOOST_TEST(plan.offset(0) == 2 * mib);  // A beside it
  BOOST_TEST(plan.offset(2) == 3 * mib);  // C after A, in the same granule
  BOOST_TEST(plan.offset(1) == 0u);       // B where D comes later
  BOOST_TEST(plan.peak_touched_granules() == 2u);
  BOOST_TEST(recount_of(blocks, plan).peak_granules == 2u);

  alloy::bench::placement_model online(alloy::bench::placement::best_fit, granule, rounding);
  const std::uint64_t a = online.allocate(1 * mib), b = online.allocate(1 * mib), c = online.allocate(1 * mib);
  online.deallocate(b, 1 * mib);
  const std::uint64_t d = online.allocate(2 * mib);
  BOOST_TEST(a == 0u);
  BOOST_TEST(c == 2 * mib);
  BOOST_TEST(d == 3 * mib);
  BOOST_TEST(online.touched_granules() == 3u);
}

// A block never live (freed as it was allocated) touches nothing and takes no room.
BOOST_AUTO_TEST_CASE(a_block_never_live_touches_nothing) {
  const std::vector<block_lifetime> blocks{{0, 2, 3 * mib}, {1, 1, 8 * mib}};
  const offline_plan plan(blocks, granule, rounding);
  BOOST_TEST(plan.peak_touched_granules() == 2u);
  BOOST_TEST(plan.peak_live_bytes() == 3 * mib);
}

BOOST_AUTO_TEST_SUITE_END()
