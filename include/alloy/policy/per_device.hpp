// SPDX-License-Identifier: Apache-2.0
// alloy/policy/per_device.hpp: one composition per device, in a registry the user owns
// (docs/design.md#devices).
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <alloy/block.hpp>
#include <alloy/concepts.hpp>
#include <alloy/detail/address_table.hpp>
#include <alloy/device.hpp>
#include <alloy/error.hpp>

namespace alloy {

/// `per_device<A, Context>` keeps one composition `A` per device and serves each thread from its
/// current device's, as PyTorch keeps one allocator per device (docs/design.md#devices).
///
/// - Strategy: `per_device<A> devices{{0, 1}, [](int d) { return A{...}; }}` calls the factory once
///   per device with that device current (`basic_scoped_device<Context>`) and builds each `A` in
///   place (it need not be movable). `allocate` serves from the calling thread's current device's
///   `A` (an empty block when that device is not in the registry); `deallocate` goes to the `A`
///   that owns the block, whatever device is current; every call into an `A` runs with its device
///   current. The owner is found by `A::owns` when `A` has it (the current device's first), else
///   in a map of live blocks to devices and sizes kept here behind a mutex.
/// - Complexity: `allocate`, one `Context::get` and `A`'s allocate (plus, without `owns`, a map
///   insert under the lock); a free, up to one `owns` per device (two device switches each one
///   not current), or a map lookup under the lock, then `A`'s free on its device.
/// - Failure: noexcept calls; a free no device owns is refused and counted (`refused_frees()`),
///   and so, without `owns`, is one whose size is not the block's (the map keeps it live).
///   Throwing edges: the constructor (`alloy::logic_error` for a negative or repeated device or
///   one that cannot be made current; what the factory throws), `on(d)` and `current()` for a
///   device not in the registry (`try_on(d)` returns null instead).
/// - Thread safety: the registry is fixed at construction; calls from several threads are safe
///   exactly when `A`'s are (`synchronized<A>`, `sharded<A>`); the live-block map has its lock.
/// - Memory kind: `A`'s. Capabilities, each when `A` has it: `try_deallocate`, `free_misuse`,
///   `release()` (every device, each with its device current), stream-ordered calls (allocation on
///   the calling thread's current device, as the plain call, whatever the stream's device; the free
///   to the owner). `owns` always (from `A::owns` or the map). Statistics are per device:
///   `memory_stats(devices.on(d))`, `memory_summary`, `snapshot` as for any composition.
/// - Not copyable or movable.
template <allocator A, device_context Context = default_device_context>
class per_device {
 public:
  static constexpr bool host_accessible = A::host_accessible;
  static constexpr bool device_accessible = A::device_accessible;
  using inner_type = A;
  using context_type = Context;
  /// Whether owners are found by `A::owns` (else by the map of live blocks).
  static constexpr bool finds_owner_by_owns = owning_allocator<A>;

  /// Builds `make(d)` for each device `d` of `devices`, with `d` current.
  template <class Make>
    requires std::same_as<std::invoke_result_t<Make&, int>, A>
  per_device(std::vector<int> devices, Make make) {
    for (std::size_t i = 0; i < devices.size(); ++i) {
      const int d = devices[i];
      if (d < 0) throw logic_error("per_device: device " + std::to_string(d) + " is negative");
      if (std::find(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(i), d) !=
          devices.begin() + static_cast<std::ptrdiff_t>(i))
        throw logic_error("per_device: device " + std::to_string(d) + " is listed twice");
    }
    parts_.reserve(devices.size());
    try {
      for (const int d : devices) {
        const basic_scoped_device<Context> on{d};
        if (!on)
          throw logic_error("per_device: device " + std::to_string(d) + " cannot be made current (error " +
                            std::to_string(on.status()) + ")");
        parts_.push_back({d, std::unique_ptr<A>(new A(make(d)))});
        if (static_cast<std::size_t>(d) >= slot_of_.size()) slot_of_.resize(static_cast<std::size_t>(d) + 1, none);
        slot_of_[static_cast<std::size_t>(d)] = static_cast<int>(parts_.size() - 1);
      }
    } catch (...) {
      destroy_parts();
      throw;
    }
  }
  per_device(const per_device&) = delete;
  per_device& operator=(const per_device&) = delete;
  /// Destroys each `A` with its device current (its memory goes back to that device).
  ~per_device() { destroy_parts(); }

  // ---- the registry ----------------------------------------------------------------------------

  /// The devices, in the order given at construction.
  std::vector<int> devices() const {
    std::vector<int> out;
    out.reserve(parts_.size());
    for (const auto& p : parts_) out.push_back(p.device);
    return out;
  }
  std::size_t size() const noexcept { return parts_.size(); }
  bool contains(int device) const noexcept { return slot(device) != none; }

  /// Device `device`'s composition, or null when it is not in the registry.
  A* try_on(int device) noexcept {
    const int s = slot(device);
    return s == none ? nullptr : parts_[static_cast<std::size_t>(s)].part.get();
  }
  const A* try_on(int device) const noexcept { return const_cast<per_device*>(this)->try_on(device); }
  /// Device `device`'s composition; `alloy::logic_error` when it is not in the registry.
  A& on(int device) {
    if (A* a = try_on(device)) return *a;
    throw logic_error("per_device: device " + std::to_string(device) + " is not in the registry");
  }
  const A& on(int device) const { return const_cast<per_device*>(this)->on(device); }
  /// The calling thread's current device's composition (`on(current device)`).
  A& current() { return on(current_device<Context>()); }
  const A& current() const { return on(current_device<Context>()); }

  /// The device whose composition owns `b` (-1: none, or an empty block).
  int device_of(block b) const noexcept {
    const int s = owner_slot(b);
    return s == none ? -1 : parts_[static_cast<std::size_t>(s)].device;
  }
  /// Frees that no device owned (ignored by `deallocate`, refused by `try_deallocate`).
  std::size_t refused_frees() const noexcept { return refused_.load(std::memory_order_relaxed); }

  // ---- the allocator ---------------------------------------------------------------------------

  /// From the calling thread's current device's composition (already current: no switch).
  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_with([&](A& a) noexcept { return a.allocate(bytes, alignment); });
  }
  void deallocate(block b) noexcept {
    (void)free_with(b, [](A& a, block x) noexcept { a.deallocate(x); });
  }

  /// As `deallocate`; false when no device owns `b` or its owner refused the free.
  bool try_deallocate(block b) noexcept
    requires checked_deallocating_allocator<A>
  {
    return free_with(b, [](A& a, block x) noexcept { return a.try_deallocate(x); });
  }

  /// What `try_deallocate(b)` would refuse `b` as: a foreign pointer when no device owns it (and,
  /// without `A::owns`, a wrong size when the size is not the live block's), else its owner's
  /// answer, asked with the owner's device current.
  misuse free_misuse(block b) const noexcept
    requires free_screening_allocator<A>
  {
    if (!b) return misuse::none;
    int s = none;
    if constexpr (finds_owner_by_owns) {
      s = owner_slot(b);
    } else {
      const std::lock_guard lock(live_lock_);
      const live_block* live = live_.find(b.ptr);
      if (live != nullptr && live->size != b.size) return misuse::wrong_size;
      if (live != nullptr) s = live->slot;
    }
    if (s == none) return misuse::foreign_pointer;
    const entry& p = parts_[static_cast<std::size_t>(s)];
    const basic_scoped_device<Context> on{p.device};
    return p.part->free_misuse(b);
  }

  /// Stream-ordered allocation from the calling thread's current device's composition.
  template <class Stream>
    requires stream_ordered_allocator<A, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    return allocate_with([&](A& a) noexcept { return a.allocate(bytes, alignment, stream); });
  }
  /// Stream-ordered free, by the owner of `b`, with its device current.
  template <class Stream>
    requires stream_ordered_allocator<A, Stream>
  void deallocate(block b, Stream stream) noexcept {
    (void)free_with(b, [&](A& a, block x) noexcept { a.deallocate(x, stream); });
  }
  template <class Stream>
    requires checked_stream_deallocating_allocator<A, Stream>
  bool try_deallocate(block b, Stream stream) noexcept {
    return free_with(b, [&](A& a, block x) noexcept { return a.try_deallocate(x, stream); });
  }

  /// Whether some device's composition owns `b`.
  bool owns(block b) const noexcept { return owner_slot(b) != none; }

  /// `release()` on every device, each with its device current.
  void release() noexcept
    requires releasing_allocator<A>
  {
    for (auto& p : parts_) {
      const basic_scoped_device<Context> on{p.device};
      if (on) p.part->release();
    }
  }

 private:
  static constexpr int none = -1;

  struct entry {
    int device;
    std::unique_ptr<A> part;
  };

  int slot(int device) const noexcept {
    if (device < 0 || static_cast<std::size_t>(device) >= slot_of_.size()) return none;
    return slot_of_[static_cast<std::size_t>(device)];
  }

  template <class Call>
  block allocate_with(Call call) noexcept {
    const int s = slot(current_device<Context>());
    if (s == none) return {};
    A& a = *parts_[static_cast<std::size_t>(s)].part;
    const block b = call(a);  // its device is current
    if constexpr (!finds_owner_by_owns) {
      if (b) {
        const std::lock_guard lock(live_lock_);
        if (live_block* stale = live_.find(b.ptr)) {
          *stale = {s, b.size};
        } else if (!live_.add(b.ptr, {s, b.size})) {  // no room to remember it: not handed out
          a.deallocate(b);
          return {};
        }
      }
    }
    return b;
  }

  /// Frees `b` through `call(A&, block)` on its owner with the owner's device current; the
  /// result is `call`'s (true for a `void` call), false when no device owns `b`.
  template <class Call>
  bool free_with(block b, Call call) noexcept {
    if (!b) return true;
    int s = none;
    if constexpr (finds_owner_by_owns) {
      s = owner_slot(b);
    } else {
      const std::lock_guard lock(live_lock_);
      if (const live_block* live = live_.find(b.ptr); live != nullptr && live->size == b.size) {
        s = live->slot;
        live_.remove(b.ptr);  // before the free: the address may be handed out again at once
      }
    }
    if (s == none) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    entry& p = parts_[static_cast<std::size_t>(s)];
    const basic_scoped_device<Context> on{p.device};
    if constexpr (std::is_void_v<std::invoke_result_t<Call&, A&, block>>) {
      call(*p.part, b);
      return true;
    } else {
      const bool accepted = call(*p.part, b);
      if constexpr (!finds_owner_by_owns) {
        if (!accepted) {  // refused (a wrong size, say): the block stays live
          const std::lock_guard lock(live_lock_);
          if (!live_.contains(b.ptr)) (void)live_.add(b.ptr, {s, b.size});
        }
      }
      return accepted;
    }
  }

  /// The slot whose composition owns `b` (`none`: no device's, or an empty block).
  int owner_slot(block b) const noexcept {
    if (!b) return none;
    if constexpr (finds_owner_by_owns) {
      const int here = slot(current_device<Context>());
      if (here != none && parts_[static_cast<std::size_t>(here)].part->owns(b)) return here;
      for (std::size_t s = 0; s < parts_.size(); ++s) {
        if (static_cast<int>(s) == here) continue;
        const basic_scoped_device<Context> on{parts_[s].device};
        if (on && parts_[s].part->owns(b)) return static_cast<int>(s);
      }
      return none;
    } else {
      const std::lock_guard lock(live_lock_);
      const live_block* live = live_.find(b.ptr);
      return live == nullptr ? none : live->slot;
    }
  }

  void destroy_parts() noexcept {
    while (!parts_.empty()) {
      entry& p = parts_.back();
      {
        const basic_scoped_device<Context> on{p.device};
        p.part.reset();
      }
      parts_.pop_back();
    }
  }

  std::vector<entry> parts_;
  std::vector<int> slot_of_;  ///< by device: index into `parts_`, or `none`
  mutable std::mutex live_lock_;
  /// A live block's slot and size (a free of another size is refused here: `A` may not check).
  struct live_block {
    int slot = none;
    std::size_t size = 0;
  };
  detail::address_table<live_block> live_;  ///< live blocks, when `A` has no `owns`
  std::atomic<std::size_t> refused_{0};
};

}  // namespace alloy
