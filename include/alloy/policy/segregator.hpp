// SPDX-License-Identifier: Apache-2.0
// alloy/policy/segregator.hpp
#pragma once

#include <concepts>
#include <cstddef>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/forwarding.hpp>

namespace alloy {

namespace detail {

/// A pool shaped as `size_class_pool`: a static `max_size()` and `natural_alignment`.
template <class Part>
concept size_class_shaped = requires {
  { Part::max_size() } -> std::convertible_to<std::size_t>;
  { Part::natural_alignment } -> std::convertible_to<std::size_t>;
};

/// Whether `part` takes a request of `bytes` at `alignment` at all, by its contract (before any
/// memory is sought). A part says so with `serves(bytes, alignment)`
/// (`request_screening_allocator`); a pool shaped as
/// `size_class_pool` (static `max_size()` and `natural_alignment`) follows that pool's documented
/// rule (an alignment A above the natural one needs `bytes + A - natural` bytes of a class);
/// any other part is assumed to take every request.
template <class Part>
constexpr bool serves_request(const Part& part, std::size_t bytes, std::size_t alignment) noexcept {
  if constexpr (request_screening_allocator<Part>) {
    return part.serves(bytes, alignment);
  } else if constexpr (size_class_shaped<Part>) {
    if (alignment <= Part::natural_alignment) return bytes <= Part::max_size();
    const std::size_t most = Part::max_size();
    return alignment <= most && bytes <= most &&
           (bytes == 0 ? 1 : bytes) + (alignment - Part::natural_alignment) <= most;
  } else {
    (void)part;
    return true;
  }
}

}  // namespace detail

/// `segregator<Threshold, Small, Large>` routes requests by size: up to and including
/// `Threshold` bytes to `Small`, larger ones to `Large` (the size-class pool splitter; Phobos's
/// Segregator). Statistics call the two sides `small_pool` and `large_pool`.
///
/// - Routing by (size, alignment): a request of at most `Threshold` bytes whose alignment `Small`
///   cannot serve at that size (see `detail::serves_request`: `segregator<1_MiB, size_class_pool,
///   best_fit_arena>` asked for 1 MiB at 512) goes to `Large` instead, when `Large` has `owns`,
///   so a composition serves every request one of its parts can. Without `owns` on `Large` such
///   a request fails, as before.
/// - Routing of frees: by `b.size`, the size the caller asked for (docs/design.md#concepts), with
///   the same rule; the alignment is not known at free time, so a small-sized block goes to `Large`
///   when blocks were sent there that way (`redirected_blocks()`, counted) and the block is not
///   `Small`'s (`!Small.owns(b)`; `Large.owns(b)` when `Small` cannot tell). While
///   none is live (the usual case) a free costs one comparison more than routing by size alone.
///   Statistics count a redirected block in the small pool (by its size) and its bytes in the
///   large pool's segments.
/// - Capabilities: those of `detail::two_parts`, each only when both parts have it: `owns`,
///   `release`, `reserved_bytes` (the sum), `counters` (the sums), `bytes_in_use` and
///   `requested_bytes` (the sums), introspection (`Small`'s blocks, then `Large`'s), checked frees
///   (`try_deallocate`, `free_misuse`), stream-ordered calls, `allocate_keeping_cache`,
///   `allocate_cached`, `record_use`, `serves` and planned growth (`allocate_or_plan` /
///   `allocate_planned`, routed as an allocation, so that `synchronized<default_allocator>` calls
///   the upstream outside its lock). Not limits or movable handles. Memory kind: what both parts
///   share.
/// - Statistics (`detail::figures_of`, what `stats<>` reads): its parts' figures added up
///   (counters and reserved bytes summed, the smallest limit and max split size), its two sides
///   as the pools, also when only one part reports a figure.
/// - Failure: an empty block when the chosen part fails; the other part is not tried.
/// - Thread safety: none (wrap in `synchronized`). Metadata: one counter; O(1) overhead.
template <std::size_t Threshold, allocator Small, allocator Large>
class segregator : public detail::two_parts<segregator<Threshold, Small, Large>, Small, Large> {
  using base = detail::two_parts<segregator<Threshold, Small, Large>, Small, Large>;

 public:
  static constexpr bool host_accessible = detail::all_host_accessible<Small, Large>;
  static constexpr bool device_accessible = detail::all_device_accessible<Small, Large>;
  static constexpr std::size_t threshold = Threshold;

  segregator() = default;
  segregator(Small small, Large large) : small_(std::move(small)), large_(std::move(large)) {}

  /// Whether a request (or a block) of `bytes` goes to `Small` by its size.
  static constexpr bool is_small(std::size_t bytes) noexcept { return bytes <= Threshold; }

  /// Whether a request goes to a part that takes it (`request_screening_allocator`, when both
  /// parts have it).
  bool serves(std::size_t bytes, std::size_t alignment) const noexcept
    requires request_screening_allocator<Small> && request_screening_allocator<Large>
  {
    if (!is_small(bytes)) return large_.serves(bytes, alignment);
    return small_.serves(bytes, alignment) || (can_redirect && large_.serves(bytes, alignment));
  }

  /// Live blocks of at most `Threshold` bytes that `Large` serves because `Small` could not serve
  /// their alignment.
  std::size_t redirected_blocks() const noexcept { return redirected_; }

  Small& small() noexcept { return small_; }
  const Small& small() const noexcept { return small_; }
  Large& large() noexcept { return large_; }
  const Large& large() const noexcept { return large_; }
  auto parts() noexcept { return std::tie(small_, large_); }
  auto parts() const noexcept { return std::tie(small_, large_); }

 private:
  friend base;
  static constexpr bool can_redirect = owning_allocator<Large>;

  /// Whether a small-sized block came from `Large`. `Small`'s word comes first where it can
  /// tell: when both sides draw from one arena (virtual_allocator, a shared `ref`), `Large` owns
  /// the small part's slabs too.
  bool redirected(block b) const noexcept {
    if constexpr (owning_allocator<Small>) {
      return !small_.owns(b);
    } else {
      return large_.owns(b);
    }
  }

  Small& first_part() noexcept { return small_; }
  const Small& first_part() const noexcept { return small_; }
  Large& second_part() noexcept { return large_; }
  const Large& second_part() const noexcept { return large_; }

  // Both phases of a planned growth take the same route (it depends on size and alignment only),
  // so the part that planned is the part that adopts.
  block route_planning(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept {
    return route_allocation(bytes, alignment,
                            [&](auto& part) { return part.allocate_or_plan(bytes, alignment, plan); });
  }
  block route_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept {
    return route_allocation(bytes, alignment,
                            [&](auto& part) { return part.allocate_planned(plan, bytes, alignment); });
  }

  template <class Call>
  block route_allocation(std::size_t bytes, std::size_t alignment, Call call) noexcept {
    if (!is_small(bytes)) return call(large_);
    if constexpr (can_redirect) {
      if (!detail::serves_request(small_, bytes, alignment)) [[unlikely]] {
        const block b = call(large_);
        if (b) ++redirected_;
        return b;
      }
    }
    return call(small_);
  }
  template <class Call>
  bool route_free(block b, Call call) noexcept {
    if (!is_small(b.size)) return call(large_) != detail::free_outcome::refused;
    if constexpr (can_redirect) {
      if (redirected_ != 0 && redirected(b)) [[unlikely]] {
        if (call(large_) == detail::free_outcome::refused) return false;
        --redirected_;
        return true;
      }
    }
    return call(small_) != detail::free_outcome::refused;
  }
  template <class Self, class Call>
  static decltype(auto) route_to_holder(Self& self, block b, Call call) {
    if (!is_small(b.size)) return call(self.large_);
    if constexpr (can_redirect) {
      if (self.redirected_ != 0 && self.redirected(b)) return call(self.large_);
    }
    return call(self.small_);
  }

  Small small_{};
  Large large_{};
  std::size_t redirected_ = 0;
};

}  // namespace alloy
