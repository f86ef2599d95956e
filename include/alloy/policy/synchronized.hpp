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
///   composition pays for one lock, at its outermost layer.
/// - Under the lock: everything `Inner` does, except the upstream call of a growth when `Inner`
///   can plan one (`growth_planning_allocator`: `best_fit_arena` and `size_class_pool` over a
///   `thread_safe_upstream` such as `cuda_malloc_upstream`, `cuda_async_upstream` or
///   `host_upstream`, and every wrapper or composite of them: `default_allocator`,
///   `caching_allocator`, `stats<...>` of them). There `allocate` takes the lock to serve the
///   request from cache or plan the segment or slab (no upstream call), releases it for the
///   upstream call (`cudaMalloc`: milliseconds, while other threads allocate and free from the
///   cache), and takes it again to adopt the segment and allocate (another thread that grew
///   meanwhile just leaves more cache; limits hold, nothing leaks). A segment the part does not
///   adopt goes back to the upstream after the lock is released. When that call fails, the
///   part's answer runs the same way (a smaller segment, then its free segments taken off its
///   books under the lock, freed without it, and the call again). Still under the lock: a
///   growth that `Inner` does not plan (host metadata, the last resorts after a failure),
///   `allocate_keeping_cache`, stream-ordered and movable calls,
///   and every free (a free never calls the upstream, except through `release()`). `release()`
///   takes the lock to take the free segments off `Inner`'s books (up to 32 at a time) and
///   returns them to the upstream (`cudaFree`) without it, when `Inner` can detach them
///   (`detaching_release_allocator`: the same parts as above and every wrapper or composite of
///   them, `stats<default_allocator<...>>` included).
///   Over a `virtual_arena` or `virtual_allocator` whose backend is `thread_safe_vmm`
///   (`vmm_ref<synchronized_vmm<V>>`) a growth's creates and maps (`cuMemCreate`, `cuMemMap`) run
///   the same way without the lock: the chunk is carved and its new granules marked pending under
///   it, mapped without it, committed under it again; `release()` unmaps and releases the free
///   granules without it. Still under the lock there: the trims of a free or an allocate, the
///   fallback after a failed create or map, tagged requests, and `virtual_allocator`'s small
///   requests (a new slab's granule). Over a backend that is not thread safe every call stays
///   under the lock.
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
