// SPDX-License-Identifier: Apache-2.0
// alloy/movable/counters.hpp: movable_alignment, the counters of the movable policies and their concepts.
// (Part of alloy/movable.hpp, which includes every part; the handle rules are there.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/edge.hpp>
#include <alloy/error.hpp>

namespace alloy {

/// Alignment of every movable block (what every CUDA allocation call guarantees).
inline constexpr std::size_t movable_alignment = 256;

/// What the movable policies count, with the meanings of IBM Large Model Support's statistics.
/// "Active" = locked movable blocks, "inactive" = unlocked movable blocks resident on the device.
/// Sizes are the sizes callers asked for. `stats<>` reads these (`movable_statistics()`).
struct movable_counters {
  std::size_t bytes_active = 0;          ///< now: bytes of locked movable blocks
  std::size_t peak_bytes_active = 0;     ///< peak of bytes_active (reset with reset_movable_peak())
  std::size_t bytes_inactive = 0;        ///< now: bytes of unlocked movable blocks on the device
  std::size_t bytes_spilled = 0;         ///< now: bytes of movable blocks held in host memory
  std::size_t bytes_reclaimed = 0;       ///< total: bytes spilled to host to serve requests
  std::size_t num_single_reclaims = 0;   ///< total: reclaims that spilled one chosen block
  std::size_t num_full_reclaims = 0;     ///< total: reclaims that spilled every unlocked block
  std::size_t num_spills = 0;            ///< total: blocks spilled to host
  std::size_t bytes_restored = 0;        ///< total: bytes brought back to the device by lock
  std::size_t num_restores = 0;          ///< total: blocks brought back to the device by lock
  std::size_t num_defragmentations = 0;  ///< total: defragmentations (hole openings and compact())
  std::size_t bytes_defragged = 0;       ///< total: bytes copied by defragmentation
  std::size_t num_moves = 0;             ///< total: blocks moved by defragmentation

  /// Adds another part's counters (statistics report the sum over a composition's parts).
  movable_counters& operator+=(const movable_counters& o) noexcept {
    bytes_active += o.bytes_active;
    peak_bytes_active += o.peak_bytes_active;
    bytes_inactive += o.bytes_inactive;
    bytes_spilled += o.bytes_spilled;
    bytes_reclaimed += o.bytes_reclaimed;
    num_single_reclaims += o.num_single_reclaims;
    num_full_reclaims += o.num_full_reclaims;
    num_spills += o.num_spills;
    bytes_restored += o.bytes_restored;
    num_restores += o.num_restores;
    num_defragmentations += o.num_defragmentations;
    bytes_defragged += o.bytes_defragged;
    num_moves += o.num_moves;
    return *this;
  }
  friend bool operator==(const movable_counters&, const movable_counters&) = default;
};

/// A movable allocator that keeps `movable_counters` (`movable_statistics()`).
template <class A>
concept movable_counting_allocator = movable_allocator<A> && requires(const A& a) {
  { a.movable_statistics() } noexcept -> std::same_as<movable_counters>;
};

/// A movable allocator that can say how big a handle's block is (every alloy movable policy).
template <class A>
concept sized_movable_allocator = movable_allocator<A> && requires(const A& a, handle h) {
  { a.size_of(h) } -> std::convertible_to<std::size_t>;
};

namespace detail {

inline void note_active(movable_counters& c, std::size_t bytes) noexcept {
  c.bytes_active += bytes;
  if (c.bytes_active > c.peak_bytes_active) c.peak_bytes_active = c.bytes_active;
}

}  // namespace detail

}  // namespace alloy
