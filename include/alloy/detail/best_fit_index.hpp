// alloy/detail/best_fit_index.hpp: the bookkeeping of `best_fit_arena`, kept apart from the policy
// so that a compacting defragmenter can reuse it.
//
// - `best_fit_chunk`: one piece of a segment (a node of a pool indexed by 32-bit numbers).
// - `best_fit_free_index`: the free chunks, ordered for best fit. Chunks smaller than
//   `exact_bins` rounding units sit in one list per exact size, with a three-level bitmap of the
//   non-empty lists (the next non-empty list above any size is found in O(1)); larger chunks sit
//   in a treap keyed by (size, address), O(log n) expected per operation.
// - `best_fit_address_map`: allocated chunks by address, an open-addressing hash table with
//   linear probing and backward-shift deletion (no tombstones), O(1) expected.
//
// None of these allocate on their hot paths: the pool and the table grow only in `reserve` calls,
// which the arena makes before it changes anything.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace alloy::detail {

inline constexpr std::uint32_t best_fit_npos = 0xFFFFFFFFu;

/// One piece of one segment. `prev`/`next` are the address neighbours within the segment
/// (`best_fit_npos` at the segment's ends); `left`/`right` link a free chunk into its exact-size
/// list (as previous/next) or into the treap (as children).
struct best_fit_chunk {
  std::uintptr_t addr = 0;
  std::size_t size = 0;       ///< bytes the chunk spans (a multiple of the rounding)
  std::size_t requested = 0;  ///< bytes the caller asked for (allocated chunks)
  std::uint32_t prev = best_fit_npos;
  std::uint32_t next = best_fit_npos;
  std::uint32_t left = best_fit_npos;
  std::uint32_t right = best_fit_npos;
  std::uint32_t priority = 0;
  bool free = true;
};

/// A pool of chunk nodes addressed by index, with an intrusive free list (through `next`).
class best_fit_chunk_pool {
 public:
  best_fit_chunk& operator[](std::uint32_t i) noexcept { return nodes_[i]; }
  const best_fit_chunk& operator[](std::uint32_t i) const noexcept { return nodes_[i]; }

  /// Makes sure `n` more nodes can be taken without allocating. May throw std::bad_alloc.
  void reserve(std::size_t n) {
    if (spare_ + (nodes_.capacity() - nodes_.size()) >= n) return;
    nodes_.reserve(nodes_.capacity() < 64 ? 64 + n : nodes_.capacity() * 2 + n);
  }
  /// A fresh node; `reserve` must have made room.
  std::uint32_t take() noexcept {
    if (spare_head_ != best_fit_npos) {
      const std::uint32_t i = spare_head_;
      spare_head_ = nodes_[i].next;
      --spare_;
      nodes_[i] = best_fit_chunk{};
      return i;
    }
    nodes_.emplace_back();  // capacity was reserved: does not throw
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }
  void give(std::uint32_t i) noexcept {
    nodes_[i].next = spare_head_;
    spare_head_ = i;
    ++spare_;
  }
  std::size_t live() const noexcept { return nodes_.size() - spare_; }
  void clear() noexcept {
    nodes_.clear();
    spare_head_ = best_fit_npos;
    spare_ = 0;
  }

 private:
  std::vector<best_fit_chunk> nodes_;
  std::uint32_t spare_head_ = best_fit_npos;
  std::size_t spare_ = 0;
};

/// The free chunks of an arena, for best fit (smallest chunk at least as big as asked; among equal
/// sizes in the treap, the lowest address).
class best_fit_free_index {
 public:
  static constexpr std::size_t exact_bins = std::size_t{1} << 14;  ///< sizes in rounding units

  best_fit_free_index() = default;
  explicit best_fit_free_index(unsigned rounding_shift) : shift_(rounding_shift), heads_(exact_bins, best_fit_npos) {}

  /// Adds free chunk `c` (its size must not change while it is in the index).
  [[gnu::always_inline]] void insert(best_fit_chunk_pool& pool, std::uint32_t c) noexcept {
    best_fit_chunk& node = pool[c];
    const std::size_t units = node.size >> shift_;
    ++count_;
    if (units < exact_bins) [[likely]] {
      node.left = best_fit_npos;
      node.right = heads_[units];
      if (node.right != best_fit_npos) pool[node.right].left = c;
      heads_[units] = c;
      set_bit(units);
    } else {
      insert_tree(pool, c);
    }
  }

  /// Removes free chunk `c`.
  [[gnu::always_inline]] void erase(best_fit_chunk_pool& pool, std::uint32_t c) noexcept {
    best_fit_chunk& node = pool[c];
    const std::size_t units = node.size >> shift_;
    --count_;
    if (units < exact_bins) [[likely]] {
      if (node.left != best_fit_npos) {
        pool[node.left].right = node.right;
      } else {
        heads_[units] = node.right;
        if (node.right == best_fit_npos) clear_bit(units);
      }
      if (node.right != best_fit_npos) pool[node.right].left = node.left;
      node.left = node.right = best_fit_npos;
    } else {
      erase_tree(pool, c);
    }
  }

  /// The smallest free chunk of at least `size` bytes, or `best_fit_npos`.
  std::uint32_t best_fit(const best_fit_chunk_pool& pool, std::size_t size) const noexcept {
    const std::size_t units = (size >> shift_) + ((size & ((std::size_t{1} << shift_) - 1)) != 0);
    if (units < exact_bins) {
      const std::size_t bin = find_next(units);
      if (bin != exact_bins) return heads_[bin];
    }
    std::uint32_t best = best_fit_npos;
    for (std::uint32_t t = root_; t != best_fit_npos;) {
      if (pool[t].size >= size) {
        best = t;
        t = pool[t].left;
      } else {
        t = pool[t].right;
      }
    }
    return best;
  }

  /// The largest free chunk, or `best_fit_npos`.
  std::uint32_t largest(const best_fit_chunk_pool& pool) const noexcept {
    if (root_ != best_fit_npos) {
      std::uint32_t t = root_;
      while (pool[t].right != best_fit_npos) t = pool[t].right;
      return t;
    }
    if (top_ == 0) return best_fit_npos;
    const std::size_t i1 = 63 - static_cast<std::size_t>(std::countl_zero(top_));
    const std::size_t i0 = i1 * 64 + 63 - static_cast<std::size_t>(std::countl_zero(mid_[i1]));
    const std::size_t bin = i0 * 64 + 63 - static_cast<std::size_t>(std::countl_zero(low_[i0]));
    return heads_[bin];
  }

  std::size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }

 private:
  static constexpr std::size_t low_words = exact_bins / 64;   // 256
  static constexpr std::size_t mid_words = low_words / 64;    // 4

  void set_bit(std::size_t bin) noexcept {
    const std::size_t i0 = bin >> 6;
    low_[i0] |= std::uint64_t{1} << (bin & 63);
    mid_[i0 >> 6] |= std::uint64_t{1} << (i0 & 63);
    top_ |= std::uint64_t{1} << (i0 >> 6);
  }
  void clear_bit(std::size_t bin) noexcept {
    const std::size_t i0 = bin >> 6;
    low_[i0] &= ~(std::uint64_t{1} << (bin & 63));
    if (low_[i0] != 0) return;
    mid_[i0 >> 6] &= ~(std::uint64_t{1} << (i0 & 63));
    if (mid_[i0 >> 6] != 0) return;
    top_ &= ~(std::uint64_t{1} << (i0 >> 6));
  }
  /// The first non-empty bin at or above `bin`, or `exact_bins`.
  std::size_t find_next(std::size_t bin) const noexcept {
    std::size_t i0 = bin >> 6;
    std::uint64_t bits = low_[i0] & (~std::uint64_t{0} << (bin & 63));
    if (bits != 0) return (i0 << 6) + static_cast<std::size_t>(std::countr_zero(bits));
    ++i0;  // the next low word that has bits
    if (i0 >= low_words) return exact_bins;
    std::size_t i1 = i0 >> 6;
    bits = mid_[i1] & (~std::uint64_t{0} << (i0 & 63));
    if (bits == 0) {
      ++i1;
      if (i1 >= mid_words) return exact_bins;
      const std::uint64_t top = top_ & (~std::uint64_t{0} << i1);
      if (top == 0) return exact_bins;
      i1 = static_cast<std::size_t>(std::countr_zero(top));
      bits = mid_[i1];
    }
    i0 = (i1 << 6) + static_cast<std::size_t>(std::countr_zero(bits));
    return (i0 << 6) + static_cast<std::size_t>(std::countr_zero(low_[i0]));
  }

  [[gnu::noinline]] void insert_tree(best_fit_chunk_pool& pool, std::uint32_t c) noexcept {
    best_fit_chunk& node = pool[c];
    node.priority = next_priority();
    node.left = node.right = best_fit_npos;
    auto [l, r] = split(pool, root_, node.size, node.addr);
    root_ = merge(pool, merge(pool, l, c), r);
  }
  [[gnu::noinline]] void erase_tree(best_fit_chunk_pool& pool, std::uint32_t c) noexcept {
    root_ = erase_from(pool, root_, c);
    pool[c].left = pool[c].right = best_fit_npos;
  }

  std::uint32_t next_priority() noexcept {  // xorshift32
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 17;
    rng_ ^= rng_ << 5;
    return rng_;
  }
  static bool less(const best_fit_chunk& a, std::size_t size, std::uintptr_t addr) noexcept {
    return a.size < size || (a.size == size && a.addr < addr);
  }
  /// Splits treap `t` into keys < (size, addr) and keys >= (size, addr).
  static std::pair<std::uint32_t, std::uint32_t> split(best_fit_chunk_pool& pool, std::uint32_t t, std::size_t size,
                                                       std::uintptr_t addr) noexcept {
    if (t == best_fit_npos) return {best_fit_npos, best_fit_npos};
    if (less(pool[t], size, addr)) {
      auto [l, r] = split(pool, pool[t].right, size, addr);
      pool[t].right = l;
      return {t, r};
    }
    auto [l, r] = split(pool, pool[t].left, size, addr);
    pool[t].left = r;
    return {l, t};
  }
  static std::uint32_t merge(best_fit_chunk_pool& pool, std::uint32_t a, std::uint32_t b) noexcept {
    if (a == best_fit_npos) return b;
    if (b == best_fit_npos) return a;
    if (pool[a].priority > pool[b].priority) {
      pool[a].right = merge(pool, pool[a].right, b);
      return a;
    }
    pool[b].left = merge(pool, a, pool[b].left);
    return b;
  }
  static std::uint32_t erase_from(best_fit_chunk_pool& pool, std::uint32_t t, std::uint32_t c) noexcept {
    if (t == c) return merge(pool, pool[t].left, pool[t].right);
    if (less(pool[t], pool[c].size, pool[c].addr)) {
      pool[t].right = erase_from(pool, pool[t].right, c);
    } else {
      pool[t].left = erase_from(pool, pool[t].left, c);
    }
    return t;
  }

  unsigned shift_ = 0;
  std::vector<std::uint32_t> heads_;
  std::uint64_t low_[low_words] = {};
  std::uint64_t mid_[mid_words] = {};
  std::uint64_t top_ = 0;
  std::uint32_t root_ = best_fit_npos;
  std::uint32_t rng_ = 0x9E3779B9u;
  std::size_t count_ = 0;
};

/// Allocated chunks by address: an open-addressing hash table (linear probing, backward-shift
/// deletion, load at most 1/2). Address 0 marks an empty slot.
class best_fit_address_map {
 public:
  /// Makes sure one more entry fits without allocating. May throw std::bad_alloc.
  void reserve_one() {
    if ((count_ + 1) * 2 <= slots_.size()) return;
    rehash(slots_.empty() ? 64 : slots_.size() * 2);
  }
  void insert(std::uintptr_t key, std::uint32_t value) noexcept {
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++count_;
  }
  std::uint32_t find(std::uintptr_t key) const noexcept {
    const std::size_t i = find_slot(key);
    return i == npos_slot ? best_fit_npos : slots_[i].value;
  }
  static constexpr std::size_t npos_slot = static_cast<std::size_t>(-1);
  /// The slot holding `key`, or `npos_slot`.
  std::size_t find_slot(std::uintptr_t key) const noexcept {
    if (slots_.empty()) return npos_slot;
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return i;
      if (slots_[i].key == 0) return npos_slot;
    }
  }
  std::uint32_t value_at(std::size_t i) const noexcept { return slots_[i].value; }
  /// Removes `key`, which must be present.
  void erase(std::uintptr_t key) noexcept { erase_slot(find_slot(key)); }
  /// Removes the entry in `slot` (from `find_slot`).
  void erase_slot(std::size_t i) noexcept {
    // Backward shift: pull later entries of the probe run into the hole when that keeps them
    // reachable from their home slot.
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (slots_[j].key == 0) break;
      const std::size_t h = home(slots_[j].key);
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {};
    --count_;
  }
  std::size_t size() const noexcept { return count_; }
  void clear() noexcept {
    for (slot& s : slots_) s = {};
    count_ = 0;
  }

 private:
  struct slot {
    std::uintptr_t key = 0;
    std::uint32_t value = best_fit_npos;
  };
  std::size_t home(std::uintptr_t key) const noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  void rehash(std::size_t capacity) {
    std::vector<slot> old(capacity);
    old.swap(slots_);
    mask_ = capacity - 1;
    shift_ = 64u - static_cast<unsigned>(std::countr_zero(capacity));
    count_ = 0;
    for (const slot& s : old)
      if (s.key != 0) insert(s.key, s.value);
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t count_ = 0;
};

}  // namespace alloy::detail
