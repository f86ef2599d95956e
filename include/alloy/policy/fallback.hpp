// alloy/policy/fallback.hpp
#pragma once

#include <cstddef>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>

namespace alloy {

/// `fallback<Primary, Secondary>` tries `Primary`, and `Secondary` when `Primary` fails.
///
/// - Routing of frees: a block goes back to `Primary` if `Primary.owns(block)`, else to
///   `Secondary`; so `Primary` must have `owns` (checked at compile time).
/// - Capabilities: `owns`, `release`, `reserved_bytes`, introspection, stream-ordered calls,
///   `allocate_keeping_cache` and `record_use`, only when both parts have them. Memory kind: what both parts share.
/// - Failure: an empty block when both fail; a failed `Primary` is not retried.
/// - Thread safety: none (wrap in `synchronized`). Metadata: none of its own.
template <owning_allocator Primary, allocator Secondary>
class fallback {
 public:
  static constexpr bool host_accessible = detail::all_host_accessible<Primary, Secondary>;
  static constexpr bool device_accessible = detail::all_device_accessible<Primary, Secondary>;

  fallback() = default;
  fallback(Primary primary, Secondary secondary) : primary_(std::move(primary)), secondary_(std::move(secondary)) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const block b = primary_.allocate(bytes, alignment)) return b;
    return secondary_.allocate(bytes, alignment);
  }
  void deallocate(block b) noexcept {
    if (primary_.owns(b)) {
      primary_.deallocate(b);
    } else {
      secondary_.deallocate(b);
    }
  }

  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_keeping_allocator<Primary> && cache_keeping_allocator<Secondary>
  {
    if (const block b = primary_.allocate_keeping_cache(bytes, alignment)) return b;
    return secondary_.allocate_keeping_cache(bytes, alignment);
  }

  template <class Stream>
    requires use_recording_allocator<Primary, Stream> && use_recording_allocator<Secondary, Stream>
  void record_use(block b, Stream stream) {
    if (primary_.owns(b)) {
      primary_.record_use(b, stream);
    } else {
      secondary_.record_use(b, stream);
    }
  }

  template <class Stream>
    requires stream_ordered_allocator<Primary, Stream> && stream_ordered_allocator<Secondary, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    if (const block b = primary_.allocate(bytes, alignment, stream)) return b;
    return secondary_.allocate(bytes, alignment, stream);
  }
  template <class Stream>
    requires stream_ordered_allocator<Primary, Stream> && stream_ordered_allocator<Secondary, Stream>
  void deallocate(block b, Stream stream) noexcept {
    if (primary_.owns(b)) {
      primary_.deallocate(b, stream);
    } else {
      secondary_.deallocate(b, stream);
    }
  }

  bool owns(block b) const noexcept
    requires owning_allocator<Secondary>
  {
    return primary_.owns(b) || secondary_.owns(b);
  }
  void release() noexcept
    requires releasing_allocator<Primary> && releasing_allocator<Secondary>
  {
    primary_.release();
    secondary_.release();
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<Primary> && reserving_allocator<Secondary>
  {
    return primary_.reserved_bytes() + secondary_.reserved_bytes();
  }
  template <class F>
    requires introspectable_allocator<Primary> && introspectable_allocator<Secondary>
  void for_each_block(F&& visit) const {
    primary_.for_each_block(visit);
    secondary_.for_each_block(visit);
  }

  Primary& primary() noexcept { return primary_; }
  const Primary& primary() const noexcept { return primary_; }
  Secondary& secondary() noexcept { return secondary_; }
  const Secondary& secondary() const noexcept { return secondary_; }
  auto parts() noexcept { return std::tie(primary_, secondary_); }
  auto parts() const noexcept { return std::tie(primary_, secondary_); }

 private:
  Primary primary_{};
  Secondary secondary_{};
};

}  // namespace alloy
