// SPDX-License-Identifier: Apache-2.0
// alloy/upstream/null_upstream.hpp
#pragma once

#include <cstddef>

#include <alloy/block.hpp>

namespace alloy {

/// An upstream that never has memory: every `allocate` yields an empty block.
///
/// Useful as the end of a `fallback` chain, as the upstream of a fixed-capacity arena that must
/// never grow, and in tests. It owns nothing, so `deallocate` of anything but an empty block is
/// a caller's bug; it is ignored. Both memory kinds, so it fits under any composition.
class null_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = true;

  block allocate(std::size_t, std::size_t) noexcept { return {}; }
  void deallocate(block) noexcept {}
  bool owns(block) const noexcept { return false; }

  friend bool operator==(const null_upstream&, const null_upstream&) noexcept { return true; }
};

}  // namespace alloy
