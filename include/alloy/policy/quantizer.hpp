// SPDX-License-Identifier: Apache-2.0
// alloy/policy/quantizer.hpp
#pragma once

#include <cstddef>
#include <cstdio>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/address_table.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/forwarding.hpp>

namespace alloy {

/// `quantizer<Inner, Rounding>` rounds every request up to a multiple of `Rounding` before passing
/// it to `Inner` (Phobos's `Quantizer`; PyTorch's kRoundLarge in `caching_allocator`).
///
/// - Strategy: `allocate(n)` asks `Inner` for `round_up(n, Rounding)` bytes and hands back a block
///   of the `n` bytes asked for (docs/design.md#concepts: a block's size is what the caller asked
///   for). A free rebuilds the rounded block from the size and passes that on, so `Inner` always
///   sees the sizes it served. Rounding fewer distinct sizes lets `Inner` reuse freed blocks for
///   later requests of nearby sizes, at the price of the slack (under `Rounding` bytes per block).
/// - `Rounding` must be a power of two (checked at compile time). A request whose rounded size
///   overflows `std::size_t` fails with an empty block; `Inner` is not asked.
/// - `requested_bytes()` counts what callers asked for and still hold. Frees are counted only when
///   `Inner` accepted them (over a part with `try_deallocate`, e.g. `best_fit_arena`, a double,
///   foreign, interior or wrong-size free changes nothing here, except, unless `ALLOY_CHECKED`, a
///   wrong size that rounds to the block's rounded size: `Inner` sees a valid free. Checked builds
///   keep each caller's size and refuse that too; `best_fit_arena::options::size_quantum` rounds
///   as this does and keeps it in every build); over
///   a part that cannot tell, a free is counted unless it is larger than the count (which would
///   make it wrap).
/// - Capabilities: exactly those of `Inner` (`detail::decorates`: keeping-cache, stream-ordered
///   and checked frees and `free_misuse` rounded the same way, the queries passed on), plus `requested_bytes`, its
///   own. Movable handles are not passed on (a handle's size is not rounded).
/// - Complexity: O(1) on top of `Inner`. Metadata: one counter (checked builds: a table of the live
///   blocks' sizes, `detail::address_table`).
/// - Thread safety: none (wrap in `synchronized`).
template <allocator Inner, std::size_t Rounding>
class quantizer : public detail::decorates<quantizer<Inner, Rounding>, Inner> {
  static_assert(detail::is_power_of_two(Rounding), "quantizer: Rounding must be a power of two");

 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;
  static constexpr std::size_t rounding = Rounding;

  quantizer() = default;
  explicit quantizer(Inner inner) : inner_(std::move(inner)) {}

  std::size_t requested_bytes() const noexcept { return requested_; }
  /// What `Inner` would refuse the free of `b` as, rounded as a free of it is.
  misuse free_misuse(block b) const noexcept
    requires free_screening_allocator<Inner>
  {
    if (!b) return misuse::none;
    if constexpr (ALLOY_CHECKED) {
      if (const std::size_t* asked = asked_.find(b.ptr); asked != nullptr && *asked != b.size)
        return misuse::wrong_size;
    }
    return inner_.free_misuse({b.ptr, detail::round_up(b.size, Rounding)});
  }

  Inner& inner() noexcept { return inner_; }
  const Inner& inner() const noexcept { return inner_; }
  auto parts() noexcept { return std::tie(inner_); }
  auto parts() const noexcept { return std::tie(inner_); }

 private:
  friend class detail::decorates<quantizer, Inner>;

  template <class Call, class GiveBack, class... Stream>
  block on_allocate(std::size_t bytes, std::size_t, Call call, GiveBack give_back, detail::allocation_kind,
                    Stream...) noexcept {
    const std::size_t rounded = detail::round_up(bytes, Rounding);
    if (rounded == 0 && bytes != 0) return {};  // rounding overflowed
    const block b = call(rounded);
    if (!b) return {};
    if constexpr (ALLOY_CHECKED) {
      if (std::size_t* asked = asked_.find(b.ptr)) {
        *asked = bytes;  // the address was freed past this decorator
      } else if (!asked_.add(b.ptr, bytes)) {
        give_back(b);
        return {};
      }
    }
    requested_ += bytes;
    return {b.ptr, bytes};
  }
  template <class Call, class... Stream>
  bool on_free(block b, Call call, Stream...) noexcept {
    if (!b) return true;
    if constexpr (ALLOY_CHECKED) {
      if (const std::size_t* asked = asked_.find(b.ptr); asked != nullptr && *asked != b.size) [[unlikely]] {
        std::fprintf(stderr, "alloy::quantizer: refused a free of %zu bytes at %p, allocated with %zu bytes\n", b.size,
                     b.ptr, *asked);
        return false;
      }
    }
    if (call(block{b.ptr, detail::round_up(b.size, Rounding)}) == detail::free_outcome::refused) return false;
    if constexpr (ALLOY_CHECKED) asked_.remove(b.ptr);
    if (b.size <= requested_) requested_ -= b.size;  // an unchecked bad free must not wrap
    return true;
  }

  Inner inner_{};
  std::size_t requested_ = 0;
  detail::address_table<std::size_t> asked_;  ///< checked builds: each live block's size as asked
};

}  // namespace alloy
