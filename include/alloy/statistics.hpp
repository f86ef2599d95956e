// SPDX-License-Identifier: Apache-2.0
// alloy/statistics.hpp: the statistics vocabulary (docs/design.md#statistics): `statistics`,
// PyTorch's `stat` and its pool breakdown. Kept by `stats<>` (alloy/policy/stats.hpp), which
// includes this.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace alloy {

/// The statistics of a `stats<>` allocator (docs/design.md#statistics), with the meanings of
/// TensorFlow's and IBM Large Model Support's. Sizes in bytes. "Now" fields are current values,
/// "peak" ones the exact maximum since construction or the last `reset_peak()`, "total" ones count
/// since construction or the last `reset_accumulated()`. A field the composition cannot know is
/// zero.
struct statistics {
  std::size_t num_allocs = 0;              ///< total: successful allocations (raw and movable)
  std::size_t bytes_in_use = 0;            ///< now: bytes of live blocks (their sizes: what was asked)
  std::size_t peak_bytes_in_use = 0;       ///< peak of bytes_in_use
  std::size_t largest_alloc_size = 0;      ///< peak: largest single allocation
  std::size_t bytes_limit = 0;             ///< smallest `bytes_limit()` of any part; 0 = none
  std::size_t bytes_reserved = 0;          ///< now: bytes taken from the upstream (reserving parts)
  std::size_t peak_bytes_reserved = 0;     ///< peak of bytes_reserved (exact: read after every call)
  std::size_t bytes_reservable_limit = 0;  ///< `bytes_reservable_limit()` of a part; 0 = none
  std::size_t bytes_inactive = 0;          ///< now: unlocked movable blocks on the device
  std::size_t bytes_active = 0;            ///< now: locked movable blocks
  std::size_t peak_bytes_active = 0;       ///< peak of bytes_active
  std::size_t bytes_reclaimed = 0;         ///< total: bytes spilled to host to serve requests
  std::size_t num_single_reclaims = 0;     ///< total: reclaims that spilled one block
  std::size_t num_full_reclaims = 0;       ///< total: reclaims that spilled every unlocked block
  std::size_t num_defragmentations = 0;    ///< total: defragmentations
  std::size_t bytes_defragged = 0;         ///< total: bytes copied by defragmentation
  std::size_t requested_bytes = 0;         ///< now: bytes callers asked for, before any rounding
  std::size_t largest_free_block = 0;      ///< now: largest free piece (introspection)
  double fragmentation = 0.0;              ///< now: 1 - largest free block / free bytes (introspection)
  std::size_t num_alloc_retries = 0;       ///< total: failed upstream calls retried after a release
  std::size_t num_ooms = 0;                ///< total: requests this allocator could not serve
  std::size_t num_device_alloc = 0;        ///< total: upstream allocations (segments, slabs)
  std::size_t num_device_free = 0;         ///< total: upstream deallocations
};

/// One statistic as PyTorch keeps it: now, peak, total increase and total decrease.
struct stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t n) noexcept {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t n) noexcept {
    current -= n;
    freed += n;
  }
  /// Moves to `value`, counting the change as an increase or a decrease.
  void observe(std::int64_t value) noexcept {
    if (value > current) {
      increase(value - current);
    } else if (value < current) {
      decrease(current - value);
    }
  }
  void reset_peak() noexcept { peak = current; }
  void reset_accumulated() noexcept { allocated = freed = 0; }
  friend bool operator==(const stat&, const stat&) = default;
};

/// PyTorch's pool breakdown: `all`, `small_pool`, `large_pool` (indices into a `stat_array`).
enum class pool : std::uint8_t { all = 0, small = 1, large = 2 };
using stat_array = std::array<stat, 3>;

}  // namespace alloy
