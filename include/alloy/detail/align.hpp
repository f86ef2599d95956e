// alloy/detail/align.hpp: overflow-safe rounding and alignment arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace alloy::detail {

constexpr bool is_power_of_two(std::size_t n) noexcept { return n != 0 && (n & (n - 1)) == 0; }

/// Rounds `n` up to a multiple of the power of two `to`. Returns 0 when the result would not fit
/// in size_t, so callers near SIZE_MAX see a failure instead of a wrapped-around small size.
constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  if (n > std::numeric_limits<std::size_t>::max() - (to - 1)) return 0;
  return (n + to - 1) & ~(to - 1);
}

inline bool is_aligned(const void* p, std::size_t alignment) noexcept {
  return (reinterpret_cast<std::uintptr_t>(p) & (alignment - 1)) == 0;
}

}  // namespace alloy::detail
