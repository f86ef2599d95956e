// SPDX-License-Identifier: Apache-2.0
// bench/virtual_memory/placement_model.hpp: a model heap that places blocks by one of several
// online policies and counts the granules live blocks touch, for `virtual_memory placements`.
//
// The targets: peak mapped ÷ peak live of at most 1.05 on the PyTorch traces and 1.10 on W1 at
// CUDA's 2 MiB granules. virtual_arena unmaps every granule no live chunk touches, so what it
// maps at the peak is set by where it put the blocks. This model answers whether another online
// placement (one that does not know when a block will be freed) would touch fewer granules: the
// same requests, rounded as the arena rounds them, placed in one address range by best fit, by
// first fit, by fewest new granules over every free chunk, or with small blocks in a range of
// their own. Addresses only; nothing is mapped or touched.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace alloy::bench {

enum class placement : std::uint8_t {
  best_fit,             ///< the smallest free chunk that holds the block (lowest address of equals), at its front
  best_fit_granules,    ///< best fit's chunk, the block at its front, back or a granule boundary: fewest new granules
  first_fit,            ///< the lowest free chunk that holds the block, at its front
  fewest_new_granules,  ///< every free chunk's front, back and boundaries: fewest new granules, then the smallest chunk
};

/// One address range from 0 up, free chunks coalesced, blocks rounded up to `rounding`; above the
/// highest block everything is free. Counts, per granule, the live blocks that touch it.
class placement_model {
 public:
  placement_model(placement policy, std::size_t granule, std::size_t rounding = 256)
      : policy_(policy), granule_(granule), rounding_(rounding) {}

  /// Places a block of `bytes` and returns its offset.
  std::uint64_t allocate(std::size_t bytes) {
    const std::uint64_t n = round(bytes);
    std::uint64_t chunk = 0, size = 0;
    bool found = false;
    switch (policy_) {
      case placement::best_fit:
      case placement::best_fit_granules:
        if (const auto it = by_size_.lower_bound({n, 0}); it != by_size_.end()) {
          std::tie(size, chunk) = *it;
          found = true;
        }
        break;
      case placement::first_fit:
        for (const auto& [at, s] : by_address_)
          if (s >= n) {
            chunk = at, size = s, found = true;
            break;
          }
        break;
      case placement::fewest_new_granules: {
        std::uint64_t best_new = new_granules(best_place(top_, 0, n, true), n);
        for (const auto& [at, s] : by_address_) {
          if (s < n) continue;
          // A free chunk before the top on a tie (the range stays low), the smaller of two chunks.
          const std::uint64_t added = new_granules(best_place(at, s, n, false), n);
          if (!found ? added <= best_new : added < best_new || (added == best_new && s < size)) {
            best_new = added, chunk = at, size = s, found = true;
          }
        }
        break;
      }
    }
    const bool by_granules = policy_ == placement::best_fit_granules || policy_ == placement::fewest_new_granules;
    std::uint64_t at = 0;
    if (found) {
      at = by_granules ? best_place(chunk, size, n, false) : chunk;
      erase(chunk, size);
      if (at > chunk) insert(chunk, at - chunk);
      if (at + n < chunk + size) insert(at + n, chunk + size - at - n);
    } else {
      at = by_granules ? best_place(top_, 0, n, true) : top_;
      if (at > top_) insert(top_, at - top_);
      top_ = at + n;
    }
    count(at, n, +1);
    live_ += n;
    return at;
  }

  /// Frees the block of `bytes` at `at` (as `allocate` returned it).
  void deallocate(std::uint64_t at, std::size_t bytes) {
    std::uint64_t n = round(bytes);
    count(at, n, -1);
    live_ -= n;
    if (const auto next = by_address_.find(at + n); next != by_address_.end()) {
      n += next->second;
      erase(next->first, next->second);
    }
    if (auto before = by_address_.lower_bound(at); before != by_address_.begin()) {
      --before;
      if (before->first + before->second == at) {
        at = before->first;
        n += before->second;
        erase(before->first, before->second);
      }
    }
    if (at + n == top_) top_ = at;
    else insert(at, n);
  }

  std::size_t touched_granules() const noexcept { return touched_; }
  /// Whether the books add up: free chunks and live blocks fill the range below the top exactly.
  bool consistent() const {
    std::uint64_t free_bytes = 0, end = 0;
    for (const auto& [at, s] : by_address_) {
      if (at < end) return false;  // overlapping free chunks
      free_bytes += s;
      end = at + s;
    }
    return end <= top_ && free_bytes + live_ == top_ && by_size_.size() == by_address_.size();
  }

 private:
  std::uint64_t round(std::size_t bytes) const noexcept {
    return (std::max<std::uint64_t>(bytes, 1) + rounding_ - 1) / rounding_ * rounding_;
  }
  void insert(std::uint64_t at, std::uint64_t size) {
    by_address_.emplace(at, size);
    by_size_.emplace(size, at);
  }
  void erase(std::uint64_t at, std::uint64_t size) {
    by_address_.erase(at);
    by_size_.erase({size, at});
  }
  bool touched(std::uint64_t g) const noexcept { return g < users_.size() && users_[g] != 0; }
  void count(std::uint64_t at, std::uint64_t n, int delta) {
    const std::uint64_t first = at / granule_, last = (at + n - 1) / granule_;
    if (last >= users_.size()) users_.resize(last + 1 + users_.size() / 2);
    for (std::uint64_t g = first; g <= last; ++g) {
      if (delta > 0 && users_[g]++ == 0) ++touched_;
      if (delta < 0 && --users_[g] == 0) --touched_;
    }
  }
  /// Granules a block of `n` at `at` adds: those no live block touches. Granules strictly inside
  /// a block lie in a free chunk, so only its first and last can be touched already.
  std::uint64_t new_granules(std::uint64_t at, std::uint64_t n) const noexcept {
    const std::uint64_t first = at / granule_, last = (at + n - 1) / granule_;
    return (touched(first) ? 0 : 1) + (last > first ? (touched(last) ? 0 : 1) + (last - first - 1) : 0);
  }
  /// Where in the free chunk [at, at + size) (to the end of the range when `top`) a block of `n`
  /// adds the fewest granules: its front, the front moved to a granule boundary and, for a block
  /// of at most a granule, the back and the back moved to a boundary (virtual_arena's candidates);
  /// the first of equals.
  std::uint64_t best_place(std::uint64_t at, std::uint64_t size, std::uint64_t n, bool top) const noexcept {
    std::uint64_t best = at, fewest = new_granules(at, n);
    const auto consider = [&](std::uint64_t start) {
      if (start < at || (!top && start + n > at + size)) return;
      if (const std::uint64_t added = new_granules(start, n); added < fewest) best = start, fewest = added;
    };
    if (fewest == 0) return best;
    consider((at + granule_ - 1) / granule_ * granule_);
    if (!top && n <= granule_) {
      const std::uint64_t back = (at + size - n) / rounding_ * rounding_;
      consider(back);
      consider(back / granule_ * granule_);
    }
    return best;
  }

  placement policy_;
  std::uint64_t granule_, rounding_;
  std::map<std::uint64_t, std::uint64_t> by_address_;          // free chunks below the top: start, size
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // the same: size, start
  std::uint64_t top_ = 0, live_ = 0;
  std::vector<std::uint32_t> users_;  // per granule: live blocks that touch it
  std::size_t touched_ = 0;
};

/// Blocks up to `threshold` in one model, larger ones in another, in address ranges of their own
/// (so that no granule holds both), each by `policy`.
class segregated_placement_model {
 public:
  segregated_placement_model(placement policy, std::size_t threshold, std::size_t granule)
      : small_(policy, granule), large_(policy, granule), threshold_(threshold) {}
  std::uint64_t allocate(std::size_t bytes) {
    return bytes <= threshold_ ? small_.allocate(bytes) : large_base + large_.allocate(bytes);
  }
  void deallocate(std::uint64_t at, std::size_t bytes) {
    if (bytes <= threshold_) small_.deallocate(at, bytes);
    else large_.deallocate(at - large_base, bytes);
  }
  std::size_t touched_granules() const noexcept { return small_.touched_granules() + large_.touched_granules(); }
  bool consistent() const { return small_.consistent() && large_.consistent(); }

 private:
  static constexpr std::uint64_t large_base = std::uint64_t{1} << 50;
  placement_model small_, large_;
  std::size_t threshold_;
};

}  // namespace alloy::bench
