// SPDX-License-Identifier: Apache-2.0
// bench/virtual_memory/offline_plan.hpp: a placement that knows every block's lifetime, for
// `virtual_memory placements`.
//
// Where a peak-mapped target is out of reach at 2 MiB granules, this gives the bound: what
// the best placement must waste in partial granules. The granule bound (peak live rounded up to a
// granule) is a lower bound no placement beats; an online placement (virtual_arena, the models of
// placement_model.hpp) is an upper bound. This plan is a second upper bound, from a placement
// that is told every block's allocation and free beforehand, as a static planner (TFLite's greedy
// by size, MiniMalloc) is: where it reaches the granule bound, the best placement wastes nothing
// more, and what an online heap maps beyond it is the price of not knowing when blocks are freed.
// It is a heuristic, not a solver: where it stays above the granule bound the best placement lies
// between the two.
//
// Blocks go largest first (the longest-lived, then the earliest allocated, first among equals).
// A block may not overlap a placed block that is live at the same time; among the places next to
// those (right after one, right before one, either moved to a granule boundary) it takes the one
// whose highest count of touched granules over its lifetime is least, then the one ending in the
// lowest granule, then the lowest. Cost: O(blocks x (placed blocks + places x lifetime x granules
// the block spans)); seconds on traces of a few thousand events, too slow for W1's two million.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace alloy::bench {

/// A block of `bytes` live over the operations [`first`, `end`).
struct block_lifetime {
  std::size_t first = 0, end = 0;
  std::size_t bytes = 0;
};

class offline_plan {
 public:
  /// Plans `blocks`, rounded up to `rounding`, on `granule`-sized granules.
  offline_plan(const std::vector<block_lifetime>& blocks, std::size_t granule, std::size_t rounding = 256)
      : blocks_(blocks), granule_(granule) {
    for (block_lifetime& b : blocks_) {
      b.bytes = (std::max<std::size_t>(b.bytes, 1) + rounding - 1) / rounding * rounding;
      times_ = std::max(times_, b.end);
    }
    std::size_t peak = 0;
    {
      std::vector<std::int64_t> change(times_ + 1);
      for (const block_lifetime& b : blocks_) {
        change[b.first] += static_cast<std::int64_t>(b.bytes);
        change[b.end] -= static_cast<std::int64_t>(b.bytes);
      }
      std::int64_t live = 0;
      for (const std::int64_t c : change) peak = std::max(peak, static_cast<std::size_t>(live += c));
    }
    peak_live_ = peak;
    granules_ = 2 * (peak / granule_ + 1) + 64;
    users_.assign(times_ * granules_, 0);
    touched_.assign(times_, 0);
    offset_.assign(blocks_.size(), 0);
    std::vector<std::size_t> order(blocks_.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
      const block_lifetime &a = blocks_[x], &b = blocks_[y];
      if (a.bytes != b.bytes) return a.bytes > b.bytes;
      if (a.end - a.first != b.end - b.first) return a.end - a.first > b.end - b.first;
      return a.first < b.first;
    });
    for (const std::size_t i : order) place(i);
  }

  /// Where block `i` (in the order given) lies.
  std::uint64_t offset(std::size_t i) const noexcept { return offset_[i]; }
  /// The most granules live blocks touch at once under this plan.
  std::size_t peak_touched_granules() const noexcept {
    return touched_.empty() ? 0 : *std::max_element(touched_.begin(), touched_.end());
  }
  /// The most bytes live at once (rounded as the blocks were).
  std::size_t peak_live_bytes() const noexcept { return peak_live_; }

 private:
  void place(std::size_t i) {
    const block_lifetime& b = blocks_[i];
    if (b.first >= b.end) return;                                // never live: touches nothing
    std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;  // [start, end) of blocks live with it
    for (const std::size_t j : placed_) {
      const block_lifetime& o = blocks_[j];
      if (o.first < b.end && b.first < o.end) taken.emplace_back(offset_[j], offset_[j] + o.bytes);
    }
    const std::uint64_t n = b.bytes, g = granule_;
    std::set<std::uint64_t> places{0};
    const auto both_ends = [&](std::uint64_t at) {  // a block starting or ending at `at`
      places.insert(at);
      if (at >= n) places.insert(at - n);
    };
    for (const auto& [start, end] : taken) {
      for (const std::uint64_t at : {start, end, start / g * g, (end + g - 1) / g * g}) both_ends(at);
    }
    std::tuple<std::size_t, std::uint64_t, std::uint64_t> best{~std::size_t{0}, 0, 0};
    bool found = false;
    for (const std::uint64_t at : places) {
      const std::uint64_t first = at / g, last = (at + n - 1) / g;
      if (last >= granules_) continue;
      if (std::any_of(taken.begin(), taken.end(), [&](const auto& t) { return t.first < at + n && at < t.second; }))
        continue;
      // The tie-breaks are settled before the lifetime is read, so that a place that cannot win
      // stops as soon as its count reaches the best one's.
      const bool wins_ties = !found || std::tie(last, at) < std::tie(std::get<1>(best), std::get<2>(best));
      const std::size_t limit = found ? std::get<0>(best) : ~std::size_t{0};
      std::size_t most = 0;
      for (std::size_t t = b.first; t < b.end && (wins_ties ? most <= limit : most < limit); ++t) {
        const std::uint16_t* row = &users_[t * granules_];
        std::size_t added = 0;
        for (std::uint64_t k = first; k <= last; ++k) added += row[k] == 0 ? 1 : 0;
        most = std::max(most, touched_[t] + added);
      }
      if (!found || std::tie(most, last, at) < best) best = {most, last, at}, found = true;
    }
    if (!found) {  // every place lies beyond the range's granules: widen it and look again
      widen();
      place(i);
      return;
    }
    const std::uint64_t at = std::get<2>(best);
    offset_[i] = at;
    placed_.push_back(i);
    for (std::size_t t = b.first; t < b.end; ++t) {
      std::uint16_t* row = &users_[t * granules_];
      for (std::uint64_t k = at / g; k <= (at + n - 1) / g; ++k)
        if (row[k]++ == 0) ++touched_[t];
    }
  }

  void widen() {
    const std::size_t wider = 2 * granules_;
    std::vector<std::uint16_t> users(times_ * wider, 0);
    for (std::size_t t = 0; t < times_; ++t) std::copy_n(&users_[t * granules_], granules_, &users[t * wider]);
    users_ = std::move(users);
    granules_ = wider;
  }

  std::vector<block_lifetime> blocks_;
  std::size_t granule_;
  std::size_t times_ = 0, peak_live_ = 0, granules_ = 0;
  // Per operation and granule: live blocks touching it (at most granule / rounding: 8,192 at 2 MiB
  // and 256 B).
  std::vector<std::uint16_t> users_;
  std::vector<std::size_t> touched_;   // per operation: granules live blocks touch
  std::vector<std::uint64_t> offset_;  // per block
  std::vector<std::size_t> placed_;
};

}  // namespace alloy::bench
