// SPDX-License-Identifier: Apache-2.0
// alloy/block.hpp: the unit every allocator hands out and takes back.
#pragma once

#include <cstddef>

namespace alloy {

/// A piece of memory: where it starts and how many bytes the caller asked for.
///
/// An empty block (null `ptr`) means "could not allocate". A request for zero bytes that
/// succeeds yields a block with a unique non-null `ptr` and `size == 0`; it must be given back
/// like any other. `size` is always the size the caller asked for, never the rounded size, so an
/// edge that is handed back only a pointer and a size can rebuild the block exactly.
struct block {
  void* ptr = nullptr;
  std::size_t size = 0;

  explicit operator bool() const noexcept { return ptr != nullptr; }
  friend bool operator==(const block&, const block&) = default;
};

}  // namespace alloy
