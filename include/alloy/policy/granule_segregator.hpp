// SPDX-License-Identifier: Apache-2.0
// alloy/policy/granule_segregator.hpp
#pragma once

#include <concepts>
#include <cstddef>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/forwarding.hpp>

namespace alloy {

/// A heap on virtual memory that says how many granules (physical pieces) an allocation made now
/// would add to those its live blocks hold, without making it (`virtual_arena::granules_added`).
template <class A>
concept granule_reporting_allocator = allocator<A> && requires(const A& a, std::size_t n) {
  { a.granules_added(n, n) } -> std::convertible_to<std::size_t>;
};
/// A heap that allocates only where the block adds no granule, else returns an empty block with
/// nothing changed (`virtual_arena::allocate_in_held_granules`): one search where
/// `granules_added` and then `allocate` make two.
template <class A>
concept held_granule_allocator = allocator<A> && requires(A& a, std::size_t n) {
  { a.allocate_in_held_granules(n, n) } -> std::same_as<block>;
};

/// `granule_segregator<Threshold, Small, Large>`: small blocks in a heap of their own, so that
/// they do not hold the granules of large blocks that are gone, unless that costs a granule. Made
/// for two `virtual_arena`s over one backend (`vmm_ref`): a granule is unmapped only when no live
/// block touches it, and a small block in the hole a large one left keeps its granule mapped.
///
///     using arena = virtual_arena<vmm_ref<host_vmm>>;
///     host_vmm device{{.capacity = 1_GiB}};
///     granule_segregator<256_KiB, arena, arena> heap{arena{vmm_ref{device}}, arena{vmm_ref{device}}};
///
/// - Routing: a request of at most `Threshold` bytes goes to `Small`, unless `Small` would add a
///   granule for it and `Large` would not (it fits in a granule `Large`'s live blocks hold
///   already); a larger one goes to `Large`. When the chosen part fails, the other is tried;
///   when both fail, `allocate` has both `release()` their free granules and routes the request
///   once more (a `virtual_arena` short of memory unmaps its own free granules, not the other
///   part's, which may be what the request lacks). A small request that fits in `Small`'s held
///   granules costs one search there (`allocate_in_held_granules`, when `Small` has it; else
///   `granules_added` and `allocate`); else `Large`'s `granules_added` too (O(1) in
///   `virtual_arena`).
/// - Routing of frees: by address, `Small.owns(b)`, so a block may have come from either part.
/// - Today's figures (two `virtual_arena`s with default options under `granule_segregator<256
///   KiB>`, alloy-replay's `virtual_arena_pair`; 2 MiB granules; bench/README.md): peak mapped ÷
///   peak live at no limit on W1 1.083-1.127 over its five seeds against one arena's 1.118-1.149
///   (fifteen seeds: mean 1.093, 1.063-1.127, eleven within 1.10; one arena 1.133, 1.109-1.154);
///   on the 15 traces the same as one arena but medium_128 inference, a granule more (1.059 of 34
///   MiB); the smallest device the same on all 15. Over 127 traces nobody tuned to (the PyTorch
///   ones resized, synthetic ones, MiniMalloc at 768 B a unit) the smallest device is 6 better, 9
///   worse than one arena's by 1-2 granules (geometric mean 1.0371 against 1.0372), the peak
///   mapped at no limit 2 better, 17 worse (1.0397 against 1.0373): up to two granules on the
///   smallest traces, where one arena maps new granules while the other keeps free ones up to
///   its own peak (the pair's touched granules peak as one arena's). Time (twenty-seventh
///   session): a W1 pair about 1.2x one arena's (12 % more instructions: the routing, two heaps'
///   metadata in the cache), the traces 1.04x cold and 1.05x warm. Small blocks always apart
///   instead cost silmont fp32 a granule (1.143 against 1.079).
/// - Capabilities: those of `detail::two_parts`, each only when both parts have it: `owns`,
///   `release`, `reserved_bytes`, `counters`, `bytes_in_use` and `requested_bytes` (the sums),
///   introspection, checked frees (`try_deallocate`), stream-ordered calls,
///   `allocate_keeping_cache`, `record_use`, tags, `serves`. Planned growth answers with no plan
///   (the caller then calls `allocate` under its lock): which part serves depends on the heap
///   at the time, and the plan's two phases must reach one part. Not limits or movable handles.
///   Memory kind: what both parts share.
/// - Statistics: its parts' figures added up (as `fallback`); it is not a size segregator to
///   `stats<>` (a small-sized block may lie in `Large`), so no pools by size.
/// - Failure: an empty block when both parts fail, also after releasing (their free granules
///   are then gone, where one `virtual_arena` keeps its own when releasing would not be enough:
///   the composite cannot tell beforehand). The other calls (`allocate_keeping_cache`, tagged,
///   stream-ordered) never release. Thread safety: none (wrap in `synchronized`).
///   Metadata: none of its own.
template <std::size_t Threshold, owning_allocator Small, allocator Large>
  requires granule_reporting_allocator<Small> && granule_reporting_allocator<Large>
class granule_segregator : public detail::two_parts<granule_segregator<Threshold, Small, Large>, Small, Large> {
  using base = detail::two_parts<granule_segregator<Threshold, Small, Large>, Small, Large>;

 public:
  static constexpr bool host_accessible = detail::all_host_accessible<Small, Large>;
  static constexpr bool device_accessible = detail::all_device_accessible<Small, Large>;
  static constexpr std::size_t small_threshold = Threshold;

  granule_segregator() = default;
  granule_segregator(Small small, Large large) : small_(std::move(small)), large_(std::move(large)) {}

  /// Whether either part takes the request (`request_screening_allocator`, when both have it).
  bool serves(std::size_t bytes, std::size_t alignment) const noexcept
    requires request_screening_allocator<Small> && request_screening_allocator<Large>
  {
    return small_.serves(bytes, alignment) || large_.serves(bytes, alignment);
  }

  Small& small_part() noexcept { return small_; }
  const Small& small_part() const noexcept { return small_; }
  Large& large_part() noexcept { return large_; }
  const Large& large_part() const noexcept { return large_; }
  auto parts() noexcept { return std::tie(small_, large_); }
  auto parts() const noexcept { return std::tie(small_, large_); }

  using base::allocate;
  /// Routed as the class comment says. With `Small`'s `allocate_in_held_granules` (virtual_arena)
  /// a small request that fits in `Small`'s held granules costs one search there.
  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const block b = allocate_routed(bytes, alignment)) return b;
    // Both failed. A part gives its free granules back only when its own request needs them, so
    // those the other part keeps may be what this request lacks: both release, then one more try.
    if constexpr (requires {
                    { small_.release() } -> std::convertible_to<std::size_t>;
                    { large_.release() } -> std::convertible_to<std::size_t>;
                  }) {
      if (small_.release() + large_.release() != 0) return allocate_routed(bytes, alignment);
    }
    return {};
  }

  /// Whether a request goes to `Large` first: it is larger than `Threshold`, or `Small` would add
  /// a granule for it and `Large` would not.
  bool goes_to_large(std::size_t bytes, std::size_t alignment) const noexcept {
    return bytes > Threshold ||
           (small_.granules_added(bytes, alignment) != 0 && large_.granules_added(bytes, alignment) == 0);
  }

 private:
  friend base;

  Small& first_part() noexcept { return small_; }
  const Small& first_part() const noexcept { return small_; }
  Large& second_part() noexcept { return large_; }
  const Large& second_part() const noexcept { return large_; }

  block allocate_routed(std::size_t bytes, std::size_t alignment) noexcept {
    if constexpr (held_granule_allocator<Small>) {
      if (bytes <= Threshold) {
        if (const block b = small_.allocate_in_held_granules(bytes, alignment)) return b;
        if (large_.granules_added(bytes, alignment) == 0)
          if (const block b = large_.allocate(bytes, alignment)) return b;
        if (const block b = small_.allocate(bytes, alignment)) return b;
        return large_.allocate(bytes, alignment);
      }
    }
    return route_allocation(bytes, alignment, [&](auto& part) { return part.allocate(bytes, alignment); });
  }
  template <class Call>
  block route_allocation(std::size_t bytes, std::size_t alignment, Call call) noexcept {
    if (goes_to_large(bytes, alignment)) {
      if (const block b = call(large_)) return b;
      return call(small_);
    }
    if (const block b = call(small_)) return b;
    return call(large_);
  }
  // No plan: the part that would serve depends on the heap when the request is placed.
  block route_planning(std::size_t, std::size_t, growth_plan&) noexcept { return {}; }
  block route_planned(growth_plan&, std::size_t, std::size_t) noexcept { return {}; }

  template <class Call>
  bool route_free(block b, Call call) noexcept {
    return (small_.owns(b) ? call(small_) : call(large_)) != detail::free_outcome::refused;
  }
  template <class Call>
  void route_use(block b, Call call) {
    if (small_.owns(b)) {
      call(small_);
    } else {
      call(large_);
    }
  }

  Small small_{};
  Large large_{};
};

}  // namespace alloy
