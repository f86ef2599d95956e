// SPDX-License-Identifier: Apache-2.0
// alloy/detail/granule_set.hpp: the 256-byte granules where an allocator's blocks started, asked
// without a lock on every free (sharded's thread caches refuse a block of another allocator).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>

namespace alloy::detail {

/// A set of 256-byte granules of the address space: a bit per granule, in one bitmap per 4 GiB
/// span that holds any (2 MiB of zeroed memory from `calloc`, whose pages the system provides
/// only once written: 4 KiB per 8 MiB where granules were added), found through a table of 256
/// spans (linear probing from the span's low bits; 1 TiB of spans in all).
///
/// - `contains` is a few loads, from any thread at any time, without a lock; `add` of a granule
///   not yet in the set takes a mutex. A granule added is seen by every thread that learnt of it
///   through any synchronisation (bitmaps and bits are published with release stores).
/// - Granules are never removed and a span's bitmap never moves: a caller may keep the span it
///   asked last in a `span_memo` and skip the table while it asks about that span.
/// - When every slot holds another span, or memory for a bitmap runs out, the set gives up: from
///   then on it contains every granule of the spans it does not hold ("maybe", never a wrong "no").
/// - Not movable.
class granule_set {
 public:
  static constexpr unsigned granule_shift = 8;
  static constexpr unsigned span_shift = 32;
  static constexpr std::size_t span_slots = 256;

  granule_set() = default;
  granule_set(const granule_set&) = delete;
  granule_set& operator=(const granule_set&) = delete;
  ~granule_set() {
    for (span& s : spans_) std::free(s.bits.load(std::memory_order_relaxed));
  }

  /// The span a caller asked last and its bitmap (one per thread: not shared).
  struct span_memo {
    std::uintptr_t key = ~std::uintptr_t{0};
    std::uint64_t* bits = nullptr;
  };

  /// Whether the granule of `p` was added.
  bool contains(const void* p) const noexcept {
    span_memo memo;
    return contains(p, memo);
  }
  /// As above, through `memo` (the table is read only when `p` lies in another span).
  bool contains(const void* p, span_memo& memo) const noexcept {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
    if (a >> span_shift != memo.key && !find(a >> span_shift, memo)) [[unlikely]]
      return gave_up_.load(std::memory_order_acquire);
    return (word(memo.bits, a).load(std::memory_order_acquire) >> (a >> granule_shift & 63) & 1) != 0;
  }

  /// Adds the granule of `p`.
  void add(const void* p) noexcept {
    span_memo memo;
    add(p, memo);
  }
  /// As above, through `memo`.
  void add(const void* p, span_memo& memo) noexcept {
    if (!contains(p, memo)) [[unlikely]]
      add_new(p);
  }
  /// Whether the set gave up on a span (see above).
  bool gave_up() const noexcept { return gave_up_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uintptr_t no_span = ~std::uintptr_t{0};  ///< above every span index

  /// Finds span `key` and keeps it in `memo`; false when the set has none of its granules.
  bool find(std::uintptr_t key, span_memo& memo) const noexcept {
    for (std::size_t n = 0, i = key % span_slots; n < span_slots; ++n, i = (i + 1) % span_slots) {
      const std::uintptr_t k = spans_[i].key.load(std::memory_order_acquire);
      if (k == key) {
        memo = {key, spans_[i].bits.load(std::memory_order_relaxed)};
        return true;
      }
      if (k == no_span) return false;
    }
    return false;
  }
  static constexpr std::size_t words = std::size_t{1} << (span_shift - granule_shift - 6);

  struct span {
    std::atomic<std::uintptr_t> key{no_span};
    std::atomic<std::uint64_t*> bits{nullptr};
  };

  static std::atomic_ref<std::uint64_t> word(std::uint64_t* bits, std::uintptr_t a) noexcept {
    return std::atomic_ref<std::uint64_t>(bits[(a >> (granule_shift + 6)) % words]);
  }
  static std::uint64_t bit_of(std::uintptr_t a) noexcept { return std::uint64_t{1} << (a >> granule_shift & 63); }

  [[gnu::noinline]] void add_new(const void* p) noexcept {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t key = a >> span_shift;
    std::lock_guard guard(lock_);
    for (std::size_t n = 0, i = key % span_slots; n < span_slots; ++n, i = (i + 1) % span_slots) {
      span& s = spans_[i];
      const std::uintptr_t k = s.key.load(std::memory_order_relaxed);
      if (k == no_span) {
        auto* bits = static_cast<std::uint64_t*>(std::calloc(words, sizeof(std::uint64_t)));
        if (bits == nullptr) break;
        s.bits.store(bits, std::memory_order_relaxed);
        s.key.store(key, std::memory_order_release);
      } else if (k != key) {
        continue;
      }
      word(s.bits.load(std::memory_order_relaxed), a).fetch_or(bit_of(a), std::memory_order_release);
      return;
    }
    gave_up_.store(true, std::memory_order_release);
  }

  span spans_[span_slots];
  std::atomic<bool> gave_up_{false};
  std::mutex lock_;
};

}  // namespace alloy::detail
