// alloy/policy/segregator.hpp
#pragma once

#include <concepts>
#include <cstddef>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>

namespace alloy {

/// `segregator<Threshold, Small, Large>` routes requests by size: up to and including
/// `Threshold` bytes to `Small`, larger ones to `Large` (the size-class pool splitter; Phobos's
/// Segregator). Statistics call the two sides `small_pool` and `large_pool`.
///
/// - Routing of frees: by `b.size`, the size the caller asked for (DESIGN §2), with the same
///   rule, so neither part needs `owns`. Alignment plays no part in routing: a request of at
///   most `Threshold` bytes that `Small` refuses for its alignment fails (it is not tried on
///   `Large`, or its free could not be routed).
/// - Capabilities: `owns`, `release`, `reserved_bytes` (the sum), `counters` (the sums),
///   `bytes_in_use` and `requested_bytes` (the sums), introspection (`Small`'s blocks, then `Large`'s) and
///   stream-ordered calls, `allocate_keeping_cache` and `record_use`, each only when both parts
///   have it. Memory kind: what both parts share.
/// - Failure: an empty block when the chosen part fails; the other part is not tried.
/// - Thread safety: none (wrap in `synchronized`). Metadata: none of its own; O(1) overhead.
template <std::size_t Threshold, allocator Small, allocator Large>
class segregator {
 public:
  static constexpr bool host_accessible = detail::all_host_accessible<Small, Large>;
  static constexpr bool device_accessible = detail::all_device_accessible<Small, Large>;
  static constexpr std::size_t threshold = Threshold;

  segregator() = default;
  segregator(Small small, Large large) : small_(std::move(small)), large_(std::move(large)) {}

  /// Whether a request (or a block) of `bytes` goes to `Small`.
  static constexpr bool is_small(std::size_t bytes) noexcept { return bytes <= Threshold; }

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return is_small(bytes) ? small_.allocate(bytes, alignment) : large_.allocate(bytes, alignment);
  }
  void deallocate(block b) noexcept {
    if (is_small(b.size)) {
      small_.deallocate(b);
    } else {
      large_.deallocate(b);
    }
  }

  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_keeping_allocator<Small> && cache_keeping_allocator<Large>
  {
    return is_small(bytes) ? small_.allocate_keeping_cache(bytes, alignment)
                           : large_.allocate_keeping_cache(bytes, alignment);
  }

  template <class Stream>
    requires use_recording_allocator<Small, Stream> && use_recording_allocator<Large, Stream>
  void record_use(block b, Stream stream) {
    if (is_small(b.size)) {
      small_.record_use(b, stream);
    } else {
      large_.record_use(b, stream);
    }
  }

  template <class Stream>
    requires stream_ordered_allocator<Small, Stream> && stream_ordered_allocator<Large, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    return is_small(bytes) ? small_.allocate(bytes, alignment, stream) : large_.allocate(bytes, alignment, stream);
  }
  template <class Stream>
    requires stream_ordered_allocator<Small, Stream> && stream_ordered_allocator<Large, Stream>
  void deallocate(block b, Stream stream) noexcept {
    if (is_small(b.size)) {
      small_.deallocate(b, stream);
    } else {
      large_.deallocate(b, stream);
    }
  }

  bool owns(block b) const noexcept
    requires owning_allocator<Small> && owning_allocator<Large>
  {
    return small_.owns(b) || large_.owns(b);
  }
  void release() noexcept
    requires releasing_allocator<Small> && releasing_allocator<Large>
  {
    small_.release();
    large_.release();
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<Small> && reserving_allocator<Large>
  {
    return small_.reserved_bytes() + large_.reserved_bytes();
  }
  allocator_counters counters() const noexcept
    requires counting_allocator<Small> && counting_allocator<Large>
  {
    return small_.counters() + large_.counters();
  }
  std::size_t bytes_in_use() const noexcept
    requires requires(const Small& s, const Large& l) {
      { s.bytes_in_use() } -> std::convertible_to<std::size_t>;
      { l.bytes_in_use() } -> std::convertible_to<std::size_t>;
    }
  {
    return small_.bytes_in_use() + large_.bytes_in_use();
  }
  std::size_t requested_bytes() const noexcept
    requires requires(const Small& s, const Large& l) {
      { s.requested_bytes() } -> std::convertible_to<std::size_t>;
      { l.requested_bytes() } -> std::convertible_to<std::size_t>;
    }
  {
    return small_.requested_bytes() + large_.requested_bytes();
  }
  template <class F>
    requires introspectable_allocator<Small> && introspectable_allocator<Large>
  void for_each_block(F&& visit) const {
    small_.for_each_block(visit);
    large_.for_each_block(visit);
  }

  Small& small() noexcept { return small_; }
  const Small& small() const noexcept { return small_; }
  Large& large() noexcept { return large_; }
  const Large& large() const noexcept { return large_; }
  auto parts() noexcept { return std::tie(small_, large_); }
  auto parts() const noexcept { return std::tie(small_, large_); }

 private:
  Small small_{};
  Large large_{};
};

}  // namespace alloy
