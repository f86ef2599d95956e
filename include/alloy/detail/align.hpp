// SPDX-License-Identifier: Apache-2.0
// alloy/detail/align.hpp: overflow-safe rounding and alignment arithmetic, and geometric
// reservation for the bookkeeping vectors.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace alloy::detail {

/// Without `std::has_single_bit`, which GCC compiles to a call to libgcc's popcount unless the
/// target has POPCNT.
constexpr bool is_power_of_two(std::size_t n) noexcept { return n != 0 && (n & (n - 1)) == 0; }

/// The least power of two >= `n` (1 for 0; the largest power of two when none fits).
constexpr std::size_t power_of_two_at_least(std::size_t n) noexcept {
  std::size_t p = 1;
  while (p < n && p <= (std::numeric_limits<std::size_t>::max() >> 1)) p <<= 1;
  return p;
}

/// The exponent of a power of two (of the least power of two >= `n` for any other `n`).
constexpr unsigned log2_of_power_of_two(std::size_t n) noexcept {
  unsigned s = 0;
  while (s + 1 < std::numeric_limits<std::size_t>::digits && (std::size_t{1} << s) < n) ++s;
  return s;
}

/// Rounds `n` up to a multiple of the power of two `to`. Returns 0 when the result would not fit
/// in size_t, so callers near SIZE_MAX see a failure instead of a wrapped-around small size.
constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  if (n > std::numeric_limits<std::size_t>::max() - (to - 1)) return 0;
  return (n + to - 1) & ~(to - 1);
}

inline bool is_aligned(const void* p, std::size_t alignment) noexcept {
  return (reinterpret_cast<std::uintptr_t>(p) & (alignment - 1)) == 0;
}

/// Makes room for `n` elements in vector `v` so that later insertions up to `n` cannot throw,
/// growing at least geometrically: `reserve` allocates exactly what it is asked for, so "room
/// for one more" before every insertion would copy the whole vector each time. May throw
/// std::bad_alloc, as `reserve` does.
template <class Vector>
void reserve_room(Vector& v, std::size_t n) {
  if (n <= v.capacity()) return;
  v.reserve(std::max(n, std::min(v.capacity() * 2, v.max_size())));
}

}  // namespace alloy::detail
