// SPDX-License-Identifier: Apache-2.0
// alloy/policy/synchronized.hpp
#pragma once

#include <cstddef>
#include <mutex>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/forwarding.hpp>

namespace alloy {

/// `synchronized<Inner, Mutex>` makes a composition safe to share between threads.
///
/// - Strategy: every call takes `Mutex` (a `std::mutex` unless given) and forwards to `Inner`. It
///   is the one place locking happens: every other policy is unsynchronized and says so, so a
///   composition pays for one lock, at its outermost layer. When `Inner` plans its growth
///   (`growth_planning_allocator`: `best_fit_arena`, `size_class_pool` and their compositions
///   over a `thread_safe_upstream`; `virtual_arena` and `virtual_allocator` over a
///   `thread_safe_vmm`), `allocate` serves or plans under the lock, makes the upstream call
///   (`cudaMalloc`, or creates and maps) without it, and adopts the result under it again. When
///   `Inner` detaches its release (`detaching_release_allocator`), `release()` takes the free
///   segments or granules off the books under the lock and gives them back without it.
/// - Still under the lock: every free, a growth `Inner` does not plan (host metadata, the last
///   resorts after a failure, a virtual arena's trims, `virtual_allocator`'s new slabs),
///   `allocate_keeping_cache`, `allocate_cached`, tagged, stream-ordered and movable calls; over an upstream that is
///   not thread safe, every call (docs/design.md#threads).
/// - Complexity: `Inner`'s, plus one lock and unlock per call (two or three for a planned growth).
/// - Failure: as `Inner`; the mutex's own failure (`std::system_error`) ends the program, since
///   the allocation calls are noexcept.
/// - Thread safety: every call, from any thread. `with_lock(f)` runs `f(inner())` under the lock,
///   for several calls that must be atomic (a consistent read of statistics, say); `inner()`
///   itself is unlocked. Not movable or copyable (the mutex is not).
/// - Memory kind: `Inner`'s. Capabilities: exactly those of `Inner` (every entry of
///   `detail::capability`), each one locked: `detail::forwards_everything` takes the lock in its
///   guard hook, so a capability added there is locked here too.
template <allocator Inner, class Mutex = std::mutex>
class synchronized : public detail::forwards_everything<synchronized<Inner, Mutex>, Inner> {
 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;

  synchronized() = default;
  explicit synchronized(Inner inner) : inner_(std::move(inner)) {}

  /// `Inner::allocate` under the lock, except for a planned growth's upstream call (see above).
  [[gnu::always_inline]] block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return detail::allocate_growing_unlocked(mutex_, inner_, bytes, alignment);
  }
  using detail::forwards_everything<synchronized<Inner, Mutex>, Inner>::allocate;

  /// `Inner::release()` under the lock, except the upstream's frees when `Inner` detaches its
  /// free segments (`detaching_release_allocator`): taken off its books under the lock, up to
  /// `detached_segments::capacity` at a time, and returned to the upstream without it.
  void release() noexcept
    requires releasing_allocator<Inner>
  {
    if constexpr (detaching_release_allocator<Inner>) {
      detached_segments::give_back_all([&](detached_segments& out) {
        std::lock_guard lock(mutex_);
        return inner_.release_detached(out);
      });
    } else {
      std::lock_guard lock(mutex_);
      inner_.release();
    }
  }

  /// Runs `f(inner())` with the lock held and returns what it returns.
  template <class F>
  decltype(auto) with_lock(F&& f) {
    std::lock_guard lock(mutex_);
    return std::forward<F>(f)(inner_);
  }

  Inner& inner() noexcept { return inner_; }
  const Inner& inner() const noexcept { return inner_; }
  auto parts() noexcept { return std::tie(inner_); }
  auto parts() const noexcept { return std::tie(inner_); }

 private:
  friend class detail::forwards_queries<synchronized, Inner>;

  // The guard hook: every forwarded call runs under the lock.
  template <class F>
  decltype(auto) guarded(F&& f) {
    std::lock_guard lock(mutex_);
    return std::forward<F>(f)(inner_);
  }
  template <class F>
  decltype(auto) guarded(F&& f) const {
    std::lock_guard lock(mutex_);
    return std::forward<F>(f)(inner_);
  }

  Inner inner_{};
  mutable Mutex mutex_;
};

}  // namespace alloy
