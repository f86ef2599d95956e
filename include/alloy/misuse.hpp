// SPDX-License-Identifier: Apache-2.0
// alloy/misuse.hpp: the one vocabulary every policy uses for a refused `deallocate`
// (docs/design.md#errors).
//
// A policy that can tell a bad free (`best_fit_arena`, `size_class_pool`) ignores it, leaves
// itself as it was, counts it in a `misuse_counts`, and passes it to the `misuse_handler` in its
// options; with no handler, `ALLOY_CHECKED` builds print one line to stderr. The same kinds, the
// same handler type and the same counts for every policy, so one handler serves a whole
// composition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include <alloy/block.hpp>
#include <alloy/config.hpp>

namespace alloy {

/// What was wrong with a refused `deallocate`.
enum class misuse : std::uint8_t {
  none,             ///< nothing refused yet (a `last_misuse()` before the first)
  double_free,      ///< the pointer starts a block that is not allocated (freed twice, never handed out)
  foreign_pointer,  ///< the pointer is not where a block of this allocator starts (foreign or interior)
  wrong_size,       ///< the size is not the size the block was allocated with
};

/// Called on every refused deallocate, with the block as the caller passed it.
using misuse_handler = void (*)(misuse kind, block b, void* context) noexcept;

/// How many refused deallocates of each kind a policy saw.
struct misuse_counts {
  std::size_t double_frees = 0;
  std::size_t foreign_pointers = 0;
  std::size_t wrong_sizes = 0;
  std::size_t total() const noexcept { return double_frees + foreign_pointers + wrong_sizes; }
  void add(misuse kind) noexcept {
    switch (kind) {
      case misuse::double_free: ++double_frees; break;
      case misuse::foreign_pointer: ++foreign_pointers; break;
      case misuse::wrong_size: ++wrong_sizes; break;
      case misuse::none: break;
    }
  }
  friend bool operator==(const misuse_counts&, const misuse_counts&) = default;
};

/// Words for a misuse kind, for messages.
constexpr const char* describe(misuse kind) noexcept {
  switch (kind) {
    case misuse::double_free: return "double free (the block is not allocated)";
    case misuse::foreign_pointer: return "free of a pointer it did not hand out (foreign or interior)";
    case misuse::wrong_size: return "free with the wrong size";
    case misuse::none: break;
  }
  return "no misuse";
}

namespace detail {

/// Counts `kind` and tells the handler, or (checked builds, no handler) stderr. `who` names the
/// policy in the printed line.
[[gnu::cold]] inline void report_misuse(misuse_counts& counts, misuse kind, block b, misuse_handler handler,
                                        void* context, const char* who) noexcept {
  counts.add(kind);
  if (handler != nullptr) {
    handler(kind, b, context);
  } else if (ALLOY_CHECKED) {
    std::fprintf(stderr, "alloy: %s: %s (%p, %zu bytes); ignored\n", who, describe(kind), b.ptr, b.size);
  }
}

}  // namespace detail
}  // namespace alloy
