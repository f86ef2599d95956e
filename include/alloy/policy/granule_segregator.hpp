// SPDX-License-Identifier: Apache-2.0
// alloy/policy/granule_segregator.hpp
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <tuple>
#include <type_traits>
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
/// A heap whose release rule a composite can share with another (`virtual_arena`): it reports
/// the bytes of granules its live blocks touch and those mapped and free, releases free ones down
/// to a limit, and asks a hook, before it maps, for the most free bytes it may keep.
template <class A>
concept release_sharing_allocator = allocator<A> && requires(A& a, const A& c, std::size_t n) {
  { c.touched_bytes() } -> std::convertible_to<std::size_t>;
  { c.free_mapped_bytes() } -> std::convertible_to<std::size_t>;
  { a.release_free_beyond(n) } -> std::convertible_to<std::size_t>;
  a.set_free_keep_limit(typename A::free_keep_limit{});
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
/// - Strategy: a request of at most `Threshold` bytes goes to `Small`, unless `Small` would add a
///   granule for it and `Large` would not; a larger one goes to `Large`. When the chosen part
///   fails the other is tried; when both fail, both `release()` and the request is routed once
///   more. Frees go by address (`Small.owns`). Parts that share their release rule
///   (`release_sharing_allocator`) keep free granules only up to the most bytes their live blocks
///   touched at once, together: before a part maps, the other releases what is beyond the room
///   left, so mapped bytes never pass that peak.
/// - Complexity: a small request that fits in `Small`'s held granules, one search there
///   (`allocate_in_held_granules`); else also `Large`'s `granules_added` (O(1) in `virtual_arena`).
///   Metadata: the shared peak, one word.
/// - Failure: an empty block when both parts fail, also after releasing. `allocate_keeping_cache`,
///   tagged and stream-ordered calls never release.
/// - Thread safety: none (wrap in `synchronized`). Copies and moves point the parts' limits at
///   the heap that holds them.
/// - Memory kind: what both parts share. Capabilities: those of `detail::two_parts`, each when
///   both parts have it (`owns`, `release`, the byte figures as sums, introspection,
///   `try_deallocate`, `free_misuse`, stream-ordered calls, `allocate_keeping_cache`,
///   `allocate_cached`, `record_use`, tags, `serves`); not limits or movable handles. Planned
///   growth answers with no plan (which part serves depends on the heap at the time). To `stats<>`
///   it is no size segregator (a small block may lie in `Large`), so no pools by size.
/// - Defaults chosen by measurement: bench/README.md#virtual-memory
template <std::size_t Threshold, owning_allocator Small, allocator Large>
  requires granule_reporting_allocator<Small> && granule_reporting_allocator<Large>
class granule_segregator : public detail::two_parts<granule_segregator<Threshold, Small, Large>, Small, Large> {
  using base = detail::two_parts<granule_segregator<Threshold, Small, Large>, Small, Large>;

 public:
  static constexpr bool host_accessible = detail::all_host_accessible<Small, Large>;
  static constexpr bool device_accessible = detail::all_device_accessible<Small, Large>;
  static constexpr std::size_t small_threshold = Threshold;

  granule_segregator()
    requires std::default_initializable<Small> && std::default_initializable<Large>
  {
    share_release_rule();
  }
  granule_segregator(Small small, Large large) : small_(std::move(small)), large_(std::move(large)) {
    share_release_rule();
  }
  // The parts' keep limits point at this object: a copy or a move sets its own.
  granule_segregator(const granule_segregator& other)
    requires std::copy_constructible<Small> && std::copy_constructible<Large>
      : small_(other.small_), large_(other.large_), peak_touched_(other.peak_touched_) {
    share_release_rule();
  }
  granule_segregator(granule_segregator&& other) noexcept(std::is_nothrow_move_constructible_v<Small> &&
                                                          std::is_nothrow_move_constructible_v<Large>)
      : small_(std::move(other.small_)), large_(std::move(other.large_)), peak_touched_(other.peak_touched_) {
    share_release_rule();
  }
  // Assigned parts keep the limits they had, which point here.
  granule_segregator& operator=(const granule_segregator&) = default;
  granule_segregator& operator=(granule_segregator&&) = default;
  ~granule_segregator() = default;

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
    if (base::current_tag_refused()) [[unlikely]]
      return base::refused_with_current_tag([&](auto& part) { return part.allocate(bytes, alignment); });
    if (const block b = allocate_routed(bytes, alignment)) return b;
    // Both failed. A part gives its free granules back only when its own request needs them, so
    // those the other part keeps may be what this request lacks: both release, then one more try.
    if constexpr (requires {
                    { small_.release() } -> std::convertible_to<std::size_t>;
                    { large_.release() } -> std::convertible_to<std::size_t>;
                  }) {
      const std::size_t released = small_.release() + large_.release();
      restart_peak();
      if (released != 0) return allocate_routed(bytes, alignment);
    }
    return {};
  }

  /// Both parts' `release()`; the shared peak restarts from what their live blocks touch.
  void release() noexcept
    requires releasing_allocator<Small> && releasing_allocator<Large>
  {
    base::release();
    restart_peak();
  }
  bool release_detached(detached_segments& out) noexcept
    requires detaching_release_allocator<Small> && detaching_release_allocator<Large>
  {
    const bool done = base::release_detached(out);
    restart_peak();
    return done;
  }

  /// Whether the parts keep their free granules by one rule (both `release_sharing_allocator`).
  static constexpr bool shares_release_rule = release_sharing_allocator<Small> && release_sharing_allocator<Large>;
  /// With a shared release rule: the most bytes of granules the parts' live blocks have touched at
  /// once, since construction or the last `release()` (0 without).
  std::size_t peak_touched_bytes() const noexcept { return peak_touched_; }

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
    note_touched_peak();  // a free may end a peak
    return (small_.owns(b) ? call(small_) : call(large_)) != detail::free_outcome::refused;
  }

  // ---- the shared release rule (the class comment's strategy) ----------------------------------

  void share_release_rule() noexcept {
    if constexpr (shares_release_rule) {
      small_.set_free_keep_limit({&free_bytes_kept, this});
      large_.set_free_keep_limit({&free_bytes_kept, this});
    }
  }
  static std::size_t free_bytes_kept(void* context, const void* arena, std::size_t about_to_map) noexcept
    requires shares_release_rule
  {
    auto& self = *static_cast<granule_segregator*>(context);
    if (arena == &self.small_) return self.free_bytes_kept_beside(self.large_, about_to_map);
    return self.free_bytes_kept_beside(self.small_, about_to_map);
  }
  /// What the part that maps `about_to_map` bytes may keep free, once `other` kept no more than
  /// the room under the shared peak.
  template <class Other>
  std::size_t free_bytes_kept_beside(Other& other, std::size_t about_to_map) noexcept {
    const std::size_t touched = touched_together() + about_to_map;
    peak_touched_ = std::max(peak_touched_, touched);
    const std::size_t room = peak_touched_ - touched;
    if (other.free_mapped_bytes() > room) (void)other.release_free_beyond(room);
    return room - std::min(room, other.free_mapped_bytes());
  }
  std::size_t touched_together() const noexcept
    requires shares_release_rule
  {
    return small_.touched_bytes() + large_.touched_bytes();
  }
  void note_touched_peak() noexcept {
    if constexpr (shares_release_rule) peak_touched_ = std::max(peak_touched_, touched_together());
  }
  void restart_peak() noexcept {
    if constexpr (shares_release_rule) peak_touched_ = touched_together();
  }
  template <class Self, class Call>
  static decltype(auto) route_to_holder(Self& self, block b, Call call) {
    return self.small_.owns(b) ? call(self.small_) : call(self.large_);
  }

  Small small_{};
  Large large_{};
  std::size_t peak_touched_ = 0;  ///< with a shared release rule, see `peak_touched_bytes`
};

}  // namespace alloy
