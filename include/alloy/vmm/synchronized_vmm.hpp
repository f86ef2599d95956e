// SPDX-License-Identifier: Apache-2.0
// alloy/vmm/synchronized_vmm.hpp
#pragma once

#include <concepts>
#include <cstddef>
#include <mutex>
#include <type_traits>
#include <utility>

#include <alloy/vmm/virtual_memory.hpp>

namespace alloy {

/// `synchronized_vmm<V, Mutex>`: a virtual-memory backend that several threads may call at once
/// (docs/design.md#threads: shards over one physical pool).
///
/// - What it is for: `host_vmm` is not synchronized, and `cuda_vmm` keeps its physical-byte
///   count in a plain member, while arenas in different shards of `sharded<>` call their backend
///   from their own threads under their own locks. Share one `synchronized_vmm` through
///   `vmm_ref` and the shards share its capacity safely:
///   `sharded<virtual_arena<vmm_ref<synchronized_vmm<host_vmm>>>>`.
/// - Under the lock: every call of the `virtual_memory` concept, one at a time (they are system
///   or driver calls, microseconds each, so the lock costs little beside them; nothing else is
///   done under it). `with_lock(f)` runs `f(backend)` under the lock for several calls or for what
///   the concept does not name (`calls()`, `last_error()`); `backend()` is unlocked.
/// - Cost: one lock per backend call, uncontended tens of nanoseconds beside calls that take
///   microseconds (a system call per map over `host_vmm`, a driver call over `cuda_vmm`).
/// - Failure: as `V`'s (every call is noexcept); the lock adds none.
/// - Owns its backend; not movable (the mutex stays where it is): construct it in place and
///   hand out `vmm_ref`s, which must not outlive it.
template <virtual_memory V, class Mutex = std::mutex>
class synchronized_vmm {
 public:
  static constexpr bool host_accessible = V::host_accessible;
  static constexpr bool device_accessible = V::device_accessible;
  static constexpr bool thread_safe = true;  ///< `thread_safe_vmm`: arenas over it map without their callers' locks

  synchronized_vmm()
    requires std::default_initializable<V>
  = default;
  explicit synchronized_vmm(V backend) noexcept(std::is_nothrow_move_constructible_v<V>)
      : backend_(std::move(backend)) {}
  synchronized_vmm(const synchronized_vmm&) = delete;
  synchronized_vmm& operator=(const synchronized_vmm&) = delete;

  std::size_t granularity() const noexcept {
    return with_lock([](const V& v) { return v.granularity(); });
  }
  address_range reserve(std::size_t bytes) noexcept {
    return with_lock([&](V& v) { return v.reserve(bytes); });
  }
  void unreserve(address_range range) noexcept {
    with_lock([&](V& v) { v.unreserve(range); });
  }
  physical_memory create(std::size_t bytes) noexcept {
    return with_lock([&](V& v) { return v.create(bytes); });
  }
  void release(physical_memory piece) noexcept {
    with_lock([&](V& v) { v.release(piece); });
  }
  bool map(void* at, physical_memory piece) noexcept {
    return with_lock([&](V& v) { return v.map(at, piece); });
  }
  void unmap(void* at, std::size_t bytes) noexcept {
    with_lock([&](V& v) { v.unmap(at, bytes); });
  }
  std::size_t capacity() const noexcept {
    return with_lock([](const V& v) { return v.capacity(); });
  }
  std::size_t physical_bytes() const noexcept {
    return with_lock([](const V& v) { return v.physical_bytes(); });
  }

  /// Runs `f(backend)` with the lock held and returns what it returns.
  template <class F>
  decltype(auto) with_lock(F&& f) {
    std::lock_guard lock(mutex_);
    return std::forward<F>(f)(backend_);
  }
  template <class F>
  decltype(auto) with_lock(F&& f) const {
    std::lock_guard lock(mutex_);
    return std::forward<F>(f)(backend_);
  }
  /// The backend itself, without the lock (for a single thread, or before sharing).
  V& backend() noexcept { return backend_; }
  const V& backend() const noexcept { return backend_; }

 private:
  V backend_;
  mutable Mutex mutex_;
};

}  // namespace alloy
