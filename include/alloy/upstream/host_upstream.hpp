// SPDX-License-Identifier: Apache-2.0
// alloy/upstream/host_upstream.hpp
#pragma once

#include <cstddef>
#include <cstdlib>

#include <alloy/block.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/device.hpp>

namespace alloy {

/// Host memory from the C library's aligned allocator.
///
/// - Strategy: one `std::aligned_alloc` per request, `std::free` per release. A block does not
///   carry its alignment and aligned `operator delete` needs it, so the C library pair is used.
/// - Alignment: any power of two; the effective alignment is at least `alignof(std::max_align_t)`.
///   Anything else yields an empty block.
/// - Zero bytes: a unique minimal allocation, returned as a block of size 0.
/// - Failure: an empty block; sizes near SIZE_MAX do not overflow.
/// - Device label (`options::device`, tests): each call runs with that simulated device current
///   (`basic_scoped_device<simulated_devices>`; out of range: an empty block). -1: none, no call.
/// - Thread safety: safe (its one member never changes). Memory kind: host only.
class host_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  /// Safe to call from several threads at once (`thread_safe_upstream`).
  static constexpr bool thread_safe = true;

  struct options {
    int device = -1;  ///< simulated device the calls run on (tests); -1: none
  };

  host_upstream() noexcept = default;
  explicit host_upstream(options opts) noexcept : device_(opts.device) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    const basic_scoped_device<simulated_devices> on{device_};
    if (!on || !detail::is_power_of_two(alignment)) return {};
    if (alignment < alignof(std::max_align_t)) alignment = alignof(std::max_align_t);
    const std::size_t rounded = detail::round_up(bytes == 0 ? 1 : bytes, alignment);
    if (rounded == 0) return {};
    return {std::aligned_alloc(alignment, rounded), bytes};
  }

  void deallocate(block b) noexcept {
    const basic_scoped_device<simulated_devices> on{device_};
    std::free(b.ptr);
  }

  /// The device label (-1: none).
  int device() const noexcept { return device_; }

  friend bool operator==(const host_upstream& l, const host_upstream& r) noexcept { return l.device_ == r.device_; }

 private:
  int device_ = -1;
};

}  // namespace alloy
