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
/// span that holds any (2 MiB of zeroed memory from `calloc`: when it maps fresh memory, as glibc
/// does for that size until the process frees a larger mapped block, a page costs memory only once
/// written, 4 KiB per 8 MiB where granules were added), found through a table of 256 spans
/// (linear probing from the span's low bits; 1 TiB of spans in all).
///
/// - `contains` is a few loads, from any thread at any time, without a lock; `add` of a granule
///   not yet in the set takes a mutex. A granule added is seen by every thread that learnt of it
///   through any synchronisation (bitmaps and bits are published with release stores).
/// - A span is found at its slot (its index modulo 256) unless another span took the slot first:
///   then the table is probed. Not remembering a thread's last span measured faster: the frees of
///   one program alternate between spans (a heap and mapped memory; a GPU's memory spans several),
///   and the branch on it mispredicted (bench/HISTORY.md, 2026-12-07).
/// - When every slot holds another span, or memory for a bitmap runs out, the set gives up: from
///   then on it contains every granule of the spans it does not hold ("maybe", never a wrong "no").
/// - Not movable.
class granule_set {
 public:
  static constexpr unsigned granule_shift = 8;
  static constexpr unsigned span_shift = 32;
  static constexpr std::size_t span_slots = 256;
  static_assert(sizeof(std::uintptr_t) == 8, "granule_set: 64-bit addresses (every CUDA platform's)");

  granule_set() = default;
  granule_set(const granule_set&) = delete;
  granule_set& operator=(const granule_set&) = delete;
  ~granule_set() {
    for (span& s : spans_) std::free(s.bits.load(std::memory_order_relaxed));
  }

  /// Whether the granule of `p` was added.
  bool contains(const void* p) const noexcept {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t key = a >> span_shift;
    const span& home = spans_[key % span_slots];
    if (home.key.load(std::memory_order_acquire) == key) [[likely]]
      return has(home.bits.load(std::memory_order_relaxed), a);
    std::uint64_t* bits = probed(key);
    return bits != nullptr ? has(bits, a) : gave_up_.load(std::memory_order_acquire);
  }

  /// Adds the granule of `p`.
  void add(const void* p) noexcept {
    if (!contains(p)) [[unlikely]]
      add_new(p);
  }
  /// Whether the set gave up on a span (see above).
  bool gave_up() const noexcept { return gave_up_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uintptr_t no_span = ~std::uintptr_t{0};  ///< above every span index

  /// The bitmap of span `key` past its home slot; null when the set has none of its granules.
  std::uint64_t* probed(std::uintptr_t key) const noexcept {
    for (std::size_t n = 0, i = key % span_slots; n < span_slots; ++n, i = (i + 1) % span_slots) {
      const std::uintptr_t k = spans_[i].key.load(std::memory_order_acquire);
      if (k == key) return spans_[i].bits.load(std::memory_order_relaxed);
      if (k == no_span) return nullptr;
    }
    return nullptr;
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
  static bool has(std::uint64_t* bits, std::uintptr_t a) noexcept {
    return (word(bits, a).load(std::memory_order_acquire) & bit_of(a)) != 0;
  }

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
