// SPDX-License-Identifier: Apache-2.0
// alloy/detail/owner_gate.hpp: a lock's way in for the one thread that owns it, for as long as no
// other thread has needed it (sharded's shards: a thread working alone pays no mutex).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#if defined(__linux__)
#  include <linux/membarrier.h>
#  include <sys/syscall.h>
#  include <unistd.h>
#endif

namespace alloy::detail {

/// Whether `heavy_fence` can be used: Linux's `membarrier` with private expedited fences, the
/// process registered for them (once, on the first call). False elsewhere.
inline bool asymmetric_fences() noexcept {
#if defined(__linux__) && defined(__NR_membarrier)
  static const bool usable = [] {
    const long commands = ::syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    return commands > 0 && (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
           ::syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  }();
  return usable;
#else
  return false;
#endif
}

/// Makes every thread of the process that is running pass a full memory barrier before it
/// returns (a thread not running passes one when it is switched out). Retries until the kernel
/// does it: after a `fork` the child registers again, or falls back to the global command.
inline void heavy_fence() noexcept {
#if defined(__linux__) && defined(__NR_membarrier)
  for (;;) {
    if (::syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
    if (::syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 &&
        ::syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
      return;
    if (::syscall(__NR_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0) return;
    std::this_thread::yield();
  }
#endif
}

/// The owner's way past a lock: `enter` / `leave` around its work instead of the mutex, while
/// the gate is open. The first other thread to need the lock calls `close` before it takes the
/// mutex: the gate shuts for good, once the owner has left, and from then on the owner takes the
/// mutex too. A holder sees everything the one before it did (acquire / release on the gate).
///
/// - Where `asymmetric_fences()` holds, `enter` is a store, a compiler fence and a load, and
///   `close` pays a `heavy_fence` once: either the owner then sees the gate closing, or the closer
///   sees the owner inside and waits for it (the membarrier argument, as in user-space RCU).
/// - Elsewhere `enter` is a compare-exchange, about 1.2 ns more an entry in a tight loop and 1 ns
///   more a W1 pair of a lone thread through `sharded` (bench/threads/README.md).
/// - `enter` and `leave` only from the owner, never nested; `close` from any other thread.
class owner_gate {
 public:
  owner_gate() noexcept : owner_gate(asymmetric_fences()) {}
  /// `fenced`: use the fence pair (only where `asymmetric_fences()` holds), else compare-exchange.
  explicit owner_gate(bool fenced) noexcept : fenced_(fenced) {}
  owner_gate(const owner_gate&) = delete;
  owner_gate& operator=(const owner_gate&) = delete;

  /// The owner: true when it is inside (until `leave`), false when the gate is shut or shutting.
  [[gnu::always_inline]] bool enter() noexcept {
    if (fenced_) {
      inside_.store(true, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the owner's half of the fence pair
      if (state_.load(std::memory_order_relaxed) == open) return true;
      inside_.store(false, std::memory_order_release);
      return false;
    }
    std::uint32_t expected = open;
    return state_.load(std::memory_order_relaxed) == open &&
           state_.compare_exchange_strong(expected, held, std::memory_order_acquire, std::memory_order_relaxed);
  }
  [[gnu::always_inline]] void leave() noexcept {
    if (fenced_) {
      inside_.store(false, std::memory_order_release);
    } else {
      state_.store(open, std::memory_order_release);
    }
  }
  /// Any thread but the owner, before it takes the mutex: returns once the gate is shut and the
  /// owner out.
  [[gnu::always_inline]] void close() noexcept {
    if (state_.load(std::memory_order_acquire) != shut) [[unlikely]]
      close_slow();
  }

 private:
  static constexpr std::uint32_t open = 0, held = 1, closing = 2, shut = 3;

  [[gnu::noinline]] void close_slow() noexcept {
    if (fenced_) {
      std::uint32_t expected = open;
      state_.compare_exchange_strong(expected, closing, std::memory_order_seq_cst);
      heavy_fence();
      while (inside_.load(std::memory_order_acquire)) std::this_thread::yield();  // the owner is inside
      state_.store(shut, std::memory_order_release);
      return;
    }
    for (;;) {
      std::uint32_t seen = open;
      if (state_.compare_exchange_weak(seen, shut, std::memory_order_acq_rel, std::memory_order_acquire)) return;
      if (seen == shut) return;
      if (seen == held) std::this_thread::yield();  // the owner is inside: wait for it
    }
  }

  std::atomic<std::uint32_t> state_{open};
  std::atomic<bool> inside_{false};
  bool fenced_;
};

}  // namespace alloy::detail
