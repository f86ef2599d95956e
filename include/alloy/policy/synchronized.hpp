// alloy/policy/synchronized.hpp
#pragma once

#include <cstddef>
#include <mutex>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>

namespace alloy {

/// `synchronized<Inner, Mutex>` makes a composition safe to share between threads.
///
/// - Strategy: every call takes `Mutex` (a `std::mutex` unless given) for its whole duration and
///   forwards to `Inner`. It is the one place locking happens: every other policy is
///   unsynchronized and says so, so a composition pays for one lock, at its outermost layer.
/// - Capabilities: exactly those of `Inner`, each one locked.
/// - `with_lock(f)` runs `f(inner())` under the lock, for several calls that must be atomic (a
///   consistent read of statistics, say). `inner()` itself is unlocked.
/// - Failure: as `Inner`; the mutex's own failure (`std::system_error`) ends the program, since
///   the allocation calls are noexcept.
/// - Not movable or copyable (the mutex is not).
template <allocator Inner, class Mutex = std::mutex>
class synchronized {
 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;

  synchronized() = default;
  explicit synchronized(Inner inner) : inner_(std::move(inner)) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    std::lock_guard lock(mutex_);
    return inner_.allocate(bytes, alignment);
  }
  void deallocate(block b) noexcept {
    std::lock_guard lock(mutex_);
    inner_.deallocate(b);
  }

  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_keeping_allocator<Inner>
  {
    std::lock_guard lock(mutex_);
    return inner_.allocate_keeping_cache(bytes, alignment);
  }
  template <class Stream>
    requires use_recording_allocator<Inner, Stream>
  void record_use(block b, Stream stream) {
    std::lock_guard lock(mutex_);
    inner_.record_use(b, stream);
  }

  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    std::lock_guard lock(mutex_);
    return inner_.allocate(bytes, alignment, stream);
  }
  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  void deallocate(block b, Stream stream) noexcept {
    std::lock_guard lock(mutex_);
    inner_.deallocate(b, stream);
  }

  bool owns(block b) const noexcept
    requires owning_allocator<Inner>
  {
    std::lock_guard lock(mutex_);
    return inner_.owns(b);
  }
  void release() noexcept
    requires releasing_allocator<Inner>
  {
    std::lock_guard lock(mutex_);
    inner_.release();
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<Inner>
  {
    std::lock_guard lock(mutex_);
    return inner_.reserved_bytes();
  }
  template <class F>
    requires introspectable_allocator<Inner>
  void for_each_block(F&& visit) const {
    std::lock_guard lock(mutex_);
    inner_.for_each_block(visit);
  }

  // Movable blocks (DESIGN §4), each call locked, when `Inner` has them.
  handle allocate_movable(std::size_t bytes) noexcept(noexcept(std::declval<Inner&>().allocate_movable(bytes)))
    requires movable_allocator<Inner>
  {
    std::lock_guard lock(mutex_);
    return inner_.allocate_movable(bytes);
  }
  void* lock(handle h)
    requires movable_allocator<Inner>
  {
    std::lock_guard lock(mutex_);
    return inner_.lock(h);
  }
  void unlock(handle h)
    requires movable_allocator<Inner>
  {
    std::lock_guard lock(mutex_);
    inner_.unlock(h);
  }
  void deallocate(handle h)
    requires movable_allocator<Inner>
  {
    std::lock_guard lock(mutex_);
    inner_.deallocate(h);
  }
  std::size_t size_of(handle h) const
    requires movable_allocator<Inner> && requires(const Inner& i) { i.size_of(h); }
  {
    std::lock_guard lock(mutex_);
    return inner_.size_of(h);
  }
  auto movable_statistics() const noexcept
    requires requires(const Inner& i) { i.movable_statistics(); }
  {
    std::lock_guard lock(mutex_);
    return inner_.movable_statistics();
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
  Inner inner_{};
  mutable Mutex mutex_;
};

}  // namespace alloy
