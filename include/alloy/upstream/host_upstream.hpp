// SPDX-License-Identifier: Apache-2.0
// alloy/upstream/host_upstream.hpp
#pragma once

#include <cstddef>
#include <cstdlib>

#include <alloy/block.hpp>
#include <alloy/detail/align.hpp>

namespace alloy {

/// Host memory from the C library's aligned allocator.
///
/// - Strategy: one `std::aligned_alloc` per request, `std::free` per release. A block does not
///   carry its alignment and aligned `operator delete` needs it, so the C library pair is used.
/// - Alignment: any power of two; the effective alignment is at least `alignof(std::max_align_t)`.
///   Anything else yields an empty block.
/// - Zero bytes: a unique minimal allocation, returned as a block of size 0.
/// - Failure: an empty block; sizes near SIZE_MAX do not overflow.
/// - Thread safety: safe (it has no state). Memory kind: host only.
class host_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  /// Safe to call from several threads at once (`thread_safe_upstream`).
  static constexpr bool thread_safe = true;

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::is_power_of_two(alignment)) return {};
    if (alignment < alignof(std::max_align_t)) alignment = alignof(std::max_align_t);
    const std::size_t rounded = detail::round_up(bytes == 0 ? 1 : bytes, alignment);
    if (rounded == 0) return {};
    return {std::aligned_alloc(alignment, rounded), bytes};
  }

  void deallocate(block b) noexcept { std::free(b.ptr); }

  friend bool operator==(const host_upstream&, const host_upstream&) noexcept { return true; }
};

}  // namespace alloy
