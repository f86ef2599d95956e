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
/// - Strategy: every call takes `Mutex` (a `std::mutex` unless given) for its whole duration and
///   forwards to `Inner`. It is the one place locking happens: every other policy is
///   unsynchronized and says so, so a composition pays for one lock, at its outermost layer.
/// - Capabilities: exactly those of `Inner` (every entry of `detail::capability`: queries such as
///   `counters()` and `bytes_in_use()`, checked frees, keeping-cache, stream-ordered and movable
///   calls), each one locked. They are passed on by `detail::forwards_everything`, with the lock
///   taken in its guard hook, so a capability added there is locked here too.
/// - `with_lock(f)` runs `f(inner())` under the lock, for several calls that must be atomic (a
///   consistent read of statistics, say). `inner()` itself is unlocked.
/// - Failure: as `Inner`; the mutex's own failure (`std::system_error`) ends the program, since
///   the allocation calls are noexcept.
/// - Not movable or copyable (the mutex is not).
template <allocator Inner, class Mutex = std::mutex>
class synchronized : public detail::forwards_everything<synchronized<Inner, Mutex>, Inner> {
 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;

  synchronized() = default;
  explicit synchronized(Inner inner) : inner_(std::move(inner)) {}

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
