// SPDX-License-Identifier: Apache-2.0
// alloy/detail/best_fit_index.hpp: the bookkeeping of `best_fit_arena`, kept apart from the policy.
//
// - `best_fit_chunk`: one piece of a segment, 32 bytes (two to a cache line), a node of a pool
//   indexed by 32-bit numbers.
// - `best_fit_free_index`: the free chunks, ordered for best fit. Chunks smaller than
//   `exact_bins` rounding units sit in one list per exact size, with a two-level bitmap of the
//   non-empty lists (the next non-empty list above any size is found in O(1), scanning at most
//   four summary words); larger chunks sit in a treap keyed by (size, address), O(log n)
//   expected per operation.
// - `best_fit_address_map`: allocated chunks by address, a hash table of cache-line buckets of
//   eight entries, O(1) expected.
//
// A free and an allocate cost the arena what they cost here: cache misses on these structures
// and branches whose outcome is as good as random (is the neighbour free? does the chunk head its
// list?). So the structures are small (two nodes to a cache line, eight map entries to one), a
// free decides its merges from its own node's links, the lists end in a node that absorbs writes
// instead of a test, and the bitmap is kept without branches. None of them allocate on their hot
// paths: the pool and the table grow only in `reserve` calls, which the arena makes before it
// changes anything.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#  include <emmintrin.h>
#endif

namespace alloy::detail {

inline constexpr std::uint32_t best_fit_npos = 0xFFFFFFFFu;

/// One piece of one segment. Its address neighbours within the segment are linked (node 0, the
/// pool's list end, stands for "none" at the segment's ends), and each link also says whether that
/// neighbour is free: a free decides whether to merge from the chunk's own node, without waiting
/// for the neighbours' cache lines, and a chunk whose state changes tells its neighbours with a
/// plain store (the value is known, nothing is read). The last two words are shared by the two
/// states: a free chunk keeps its links in the free index there (`left`/`right`: previous and
/// next in its exact-size list, or its children in the treap); an allocated one keeps the bytes
/// its caller asked for, low half in `left`, high half in `right`.
struct best_fit_chunk {
  static constexpr std::uint32_t none = 0;  ///< no neighbour (the pool's node 0)

  std::uintptr_t addr = 0;

  std::uint32_t prev() const noexcept { return prev_ & index_mask; }
  std::uint32_t next() const noexcept { return next_ & index_mask; }
  bool prev_free() const noexcept { return (prev_ & free_link) != 0; }  ///< the chunk before is free
  bool next_free() const noexcept { return (next_ & free_link) != 0; }  ///< the chunk after is free
  void set_prev(std::uint32_t c, bool is_free) noexcept { prev_ = c | (is_free ? free_link : 0); }
  void set_next(std::uint32_t c, bool is_free) noexcept { next_ = c | (is_free ? free_link : 0); }

  std::size_t size() const noexcept { return size_and_state_ & ~free_bit; }  ///< a multiple of the rounding
  bool free() const noexcept { return (size_and_state_ & free_bit) != 0; }
  void set_size(std::size_t bytes) noexcept { size_and_state_ = bytes | (size_and_state_ & free_bit); }
  void set_free(std::size_t bytes) noexcept { size_and_state_ = bytes | free_bit; }
  void set_allocated(std::size_t requested) noexcept {
    size_and_state_ &= ~free_bit;
    left = static_cast<std::uint32_t>(requested);
    right = static_cast<std::uint32_t>(static_cast<std::uint64_t>(requested) >> 32);
  }
  std::size_t requested() const noexcept {  ///< allocated chunks only
    return static_cast<std::size_t>((static_cast<std::uint64_t>(right) << 32) | left);
  }

 private:
  // Node numbers stay below 2^31 (64 GiB of nodes), so the top bit of a link is the flag.
  static constexpr std::uint32_t free_link = std::uint32_t{1} << 31;
  static constexpr std::uint32_t index_mask = free_link - 1;
  // Sizes never reach 2^63 bytes (no upstream hands out half the address space), so the top bit
  // of the size says whether the chunk is free.
  static constexpr std::size_t free_bit = std::size_t{1} << 63;
  std::uint32_t prev_ = none;
  std::uint32_t next_ = none;
  std::size_t size_and_state_ = free_bit;

 public:
  std::uint32_t left = best_fit_npos;
  std::uint32_t right = best_fit_npos;
};
static_assert(sizeof(best_fit_chunk) == 32);

/// A pool of chunk nodes addressed by index, with an intrusive free list (through `left`). A node
/// given back is the first taken again, while it is still in the cache. Node 0 is never handed
/// out: it ends the free index's lists and stands for a missing address neighbour, so links to it
/// are written without tests for the end (it absorbs them; nothing reads them).
class best_fit_chunk_pool {
 public:
  static constexpr std::uint32_t list_end = best_fit_chunk::none;
  static constexpr std::size_t max_nodes = std::size_t{1} << 31;

  best_fit_chunk_pool() = default;
  best_fit_chunk& operator[](std::uint32_t i) noexcept { return nodes_[i]; }
  const best_fit_chunk& operator[](std::uint32_t i) const noexcept { return nodes_[i]; }

  /// Nodes `take` can hand out without allocating.
  std::size_t available() const noexcept { return available_; }
  /// Makes sure `n` more nodes can be taken without allocating. May throw std::bad_alloc, also
  /// when node numbers would need more than 31 bits (the links keep a flag in the top bit).
  void reserve(std::size_t n) {
    if (available_ >= n) [[likely]]
      return;
    if (nodes_.size() + n > max_nodes) throw std::bad_alloc();
    nodes_.reserve(std::min(nodes_.capacity() < 64 ? 64 + n : nodes_.capacity() * 2 + n, max_nodes));
    if (nodes_.empty()) nodes_.emplace_back();  // the list end
    available_ = spare_ + (nodes_.capacity() - nodes_.size());
  }
  /// A node whose every field the caller sets; `reserve` must have made room.
  std::uint32_t take() noexcept {
    --available_;
    if (spare_head_ != best_fit_npos) {
      const std::uint32_t i = spare_head_;
      spare_head_ = nodes_[i].left;
      --spare_;
      return i;
    }
    nodes_.emplace_back();  // capacity was reserved: does not throw
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }
  void give(std::uint32_t i) noexcept {
    nodes_[i].left = spare_head_;
    spare_head_ = i;
    ++spare_;
    ++available_;
  }
  std::size_t live() const noexcept { return nodes_.empty() ? 0 : nodes_.size() - 1 - spare_; }
  void clear() noexcept {
    nodes_.resize(nodes_.empty() ? 0 : 1);
    spare_head_ = best_fit_npos;
    spare_ = 0;
    available_ = nodes_.capacity() - nodes_.size();
  }

 private:
  std::vector<best_fit_chunk> nodes_;
  std::uint32_t spare_head_ = best_fit_npos;
  std::size_t spare_ = 0;
  std::size_t available_ = 0;  ///< spare nodes plus unused capacity
};

/// The free chunks of an arena, for best fit (smallest chunk at least as big as asked; among equal
/// sizes in the treap, the lowest address).
class best_fit_free_index {
 public:
  static constexpr std::size_t exact_bins = std::size_t{1} << 14;  ///< sizes in rounding units
  static constexpr std::uint32_t list_end = best_fit_chunk_pool::list_end;

  best_fit_free_index() = default;
  explicit best_fit_free_index(unsigned rounding_shift) : shift_(rounding_shift), heads_(exact_bins, list_end) {}

  /// Adds free chunk `c` (its size must not change while it is in the index).
  [[gnu::always_inline]] void insert(best_fit_chunk_pool& pool, std::uint32_t c) noexcept {
    best_fit_chunk& node = pool[c];
    const std::size_t units = node.size() >> shift_;
    ++count_;
    if (units < exact_bins) [[likely]] {
      const std::uint32_t head = heads_[units];
      node.left = list_end;
      node.right = head;
      pool[head].left = c;  // the list end's links are written, never read
      heads_[units] = c;
      set_bit(units);
    } else {
      insert_tree(pool, c);
    }
  }

  /// Removes free chunk `c`.
  [[gnu::always_inline]] void erase(best_fit_chunk_pool& pool, std::uint32_t c) noexcept {
    const best_fit_chunk& node = pool[c];
    const std::size_t units = node.size() >> shift_;
    --count_;
    if (units < exact_bins) [[likely]] {
      const std::uint32_t left = node.left;
      const std::uint32_t right = node.right;
      // Whether `c` heads its list is as good as random, so no branch on it.
      std::uint32_t& before = left == list_end ? heads_[units] : pool[left].right;
      before = right;
      pool[right].left = left;
      clear_bit_if_empty(units);
    } else {
      erase_tree(pool, c);
    }
  }

  /// The smallest free chunk of at least `size` bytes (a multiple of the rounding), or
  /// `best_fit_npos`.
  [[gnu::always_inline]] std::uint32_t best_fit(const best_fit_chunk_pool& pool, std::size_t size) const noexcept {
    const std::size_t units = size >> shift_;
    if (units < exact_bins) [[likely]] {
      const std::size_t bin = find_next(units);
      if (bin != exact_bins) return heads_[bin];
    }
    return best_fit_tree(pool, size);
  }

  /// The largest free chunk, or `best_fit_npos`.
  std::uint32_t largest(const best_fit_chunk_pool& pool) const noexcept {
    if (root_ != best_fit_npos) {
      std::uint32_t t = root_;
      while (pool[t].right != best_fit_npos) t = pool[t].right;
      return t;
    }
    for (std::size_t i1 = summary_words; i1-- > 0;) {
      if (summary_[i1] == 0) continue;
      const std::size_t i0 = i1 * 64 + 63 - static_cast<std::size_t>(std::countl_zero(summary_[i1]));
      const std::size_t bin = i0 * 64 + 63 - static_cast<std::size_t>(std::countl_zero(low_[i0]));
      return heads_[bin];
    }
    return best_fit_npos;
  }

  std::size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }

 private:
  // Two levels: a bit per bin in `low_`, a bit per non-zero `low_` word in `summary_`. A third
  // level would make `find_next` loop-free but costs every insert and erase a word more.
  static constexpr std::size_t low_words = exact_bins / 64;     // 256
  static constexpr std::size_t summary_words = low_words / 64;  // 4

  void set_bit(std::size_t bin) noexcept {
    const std::size_t i0 = bin >> 6;
    low_[i0] |= std::uint64_t{1} << (bin & 63);
    summary_[i0 >> 6] |= std::uint64_t{1} << (i0 & 63);
  }
  /// Keeps the bitmap true after a removal from list `bin`, without branches.
  void clear_bit_if_empty(std::size_t bin) noexcept {
    const std::size_t i0 = bin >> 6;
    low_[i0] &= ~(std::uint64_t{heads_[bin] == list_end} << (bin & 63));
    summary_[i0 >> 6] &= ~(std::uint64_t{low_[i0] == 0} << (i0 & 63));
  }
  /// The first non-empty bin at or above `bin`, or `exact_bins`.
  std::size_t find_next(std::size_t bin) const noexcept {
    std::size_t i0 = bin >> 6;
    const std::uint64_t bits = low_[i0] & (~std::uint64_t{0} << (bin & 63));
    if (bits != 0) return (i0 << 6) + static_cast<std::size_t>(std::countr_zero(bits));
    ++i0;  // the next low word that has bits
    if (i0 >= low_words) return exact_bins;
    std::size_t i1 = i0 >> 6;
    std::uint64_t words = summary_[i1] & (~std::uint64_t{0} << (i0 & 63));
    while (words == 0) {
      if (++i1 == summary_words) return exact_bins;
      words = summary_[i1];
    }
    i0 = (i1 << 6) + static_cast<std::size_t>(std::countr_zero(words));
    return (i0 << 6) + static_cast<std::size_t>(std::countr_zero(low_[i0]));
  }

  [[gnu::noinline]] std::uint32_t best_fit_tree(const best_fit_chunk_pool& pool, std::size_t size) const noexcept {
    std::uint32_t best = best_fit_npos;
    for (std::uint32_t t = root_; t != best_fit_npos;) {
      if (pool[t].size() >= size) {
        best = t;
        t = pool[t].left;
      } else {
        t = pool[t].right;
      }
    }
    return best;
  }
  [[gnu::noinline]] void insert_tree(best_fit_chunk_pool& pool, std::uint32_t c) noexcept {
    best_fit_chunk& node = pool[c];
    node.left = node.right = best_fit_npos;
    auto [l, r] = split(pool, root_, node.size(), node.addr);
    root_ = merge(pool, merge(pool, l, c), r);
  }
  [[gnu::noinline]] void erase_tree(best_fit_chunk_pool& pool, std::uint32_t c) noexcept {
    root_ = erase_from(pool, root_, c);
  }

  /// A treap needs priorities independent of the keys; a mix of the node's number serves and
  /// costs no room in the node.
  static std::uint32_t priority(std::uint32_t c) noexcept {
    std::uint32_t x = c * 0x9E3779B9u;
    x ^= x >> 16;
    return x * 0x85EBCA6Bu;
  }
  static bool less(const best_fit_chunk& a, std::size_t size, std::uintptr_t addr) noexcept {
    return a.size() < size || (a.size() == size && a.addr < addr);
  }
  /// Splits treap `t` into keys < (size, addr) and keys >= (size, addr).
  static std::pair<std::uint32_t, std::uint32_t> split(best_fit_chunk_pool& pool, std::uint32_t t, std::size_t size,
                                                       std::uintptr_t addr) noexcept {
    if (t == best_fit_npos) return {best_fit_npos, best_fit_npos};
    if (less(pool[t], size, addr)) {
      auto [l, r] = split(pool, pool[t].right, size, addr);
      pool[t].right = (l);
      return {t, r};
    }
    auto [l, r] = split(pool, pool[t].left, size, addr);
    pool[t].left = (r);
    return {l, t};
  }
  static std::uint32_t merge(best_fit_chunk_pool& pool, std::uint32_t a, std::uint32_t b) noexcept {
    if (a == best_fit_npos) return b;
    if (b == best_fit_npos) return a;
    if (priority(a) > priority(b)) {
      pool[a].right = (merge(pool, pool[a].right, b));
      return a;
    }
    pool[b].left = (merge(pool, a, pool[b].left));
    return b;
  }
  static std::uint32_t erase_from(best_fit_chunk_pool& pool, std::uint32_t t, std::uint32_t c) noexcept {
    if (t == c) return merge(pool, pool[t].left, pool[t].right);
    if (less(pool[t], pool[c].size(), pool[c].addr)) {
      pool[t].right = (erase_from(pool, pool[t].right, c));
    } else {
      pool[t].left = (erase_from(pool, pool[t].left, c));
    }
    return t;
  }

  unsigned shift_ = 0;
  std::vector<std::uint32_t> heads_;
  std::uint64_t low_[low_words] = {};
  std::uint64_t summary_[summary_words] = {};
  std::uint32_t root_ = best_fit_npos;
  std::size_t count_ = 0;
};

/// Allocated chunks by address: a hash table of 64-byte buckets, each holding up to eight
/// entries of a chunk number and a 32-bit tag of its address (the address in rounding units,
/// truncated); equal tags are told apart by the chunk's own address, read from the node the
/// caller needs next anyway. An entry lives in its home bucket unless that was full when it came
/// (then in the next bucket with room, and every bucket passed counts it as overflow, so a search
/// stops at the first bucket without overflow). Buckets are at most half full on average, so an
/// entry almost always sits at home: a lookup, an insert and an erase each read one cache line and
/// take branches the processor predicts (linear probing over single slots mispredicts often).
class best_fit_address_map {
 public:
  best_fit_address_map() = default;
  explicit best_fit_address_map(unsigned rounding_shift) : key_shift_(rounding_shift) {}

  /// Makes sure one more entry fits without allocating. May throw std::bad_alloc.
  void reserve_one() {
    if (!full()) [[likely]]
      return;
    rehash(buckets_.empty() ? 16 : buckets_.size() * 2);
  }
  /// Whether `reserve_one` would have to grow the table (it keeps buckets half full at most).
  bool full() const noexcept { return count_ >= limit_; }
  void insert(std::uintptr_t key, std::uint32_t chunk) noexcept { place(tag_of(key), chunk); }

  /// The chunk that starts at `key`, or `best_fit_npos`.
  std::uint32_t find(const best_fit_chunk_pool& pool, std::uintptr_t key) const noexcept {
    const position at = locate(pool, key);
    return at.bucket == npos_bucket ? best_fit_npos : buckets_[at.bucket].chunks[at.lane];
  }
  /// Removes the chunk that starts at `key` and returns it, or `best_fit_npos` when none does.
  std::uint32_t take(const best_fit_chunk_pool& pool, std::uintptr_t key) noexcept {
    const position at = locate(pool, key);
    if (at.bucket == npos_bucket) [[unlikely]]
      return best_fit_npos;
    bucket& in = buckets_[at.bucket];
    const std::uint32_t c = in.chunks[at.lane];
    in.chunks[at.lane] = best_fit_npos;
    for (std::size_t b = at.home; b != at.bucket; b = (b + 1) & mask_) --overflow_[b];
    --count_;
    return c;
  }
  std::size_t size() const noexcept { return count_; }
  void clear() noexcept {
    for (bucket& b : buckets_) b = bucket{};
    for (std::uint32_t& o : overflow_) o = 0;
    count_ = 0;
  }

 private:
  static constexpr unsigned lanes = 8;
  static constexpr std::size_t npos_bucket = static_cast<std::size_t>(-1);
  struct position {
    std::size_t bucket;  ///< `npos_bucket`: not found
    unsigned lane;
    std::size_t home;
  };
  struct alignas(64) bucket {
    std::uint32_t tags[lanes] = {};
    std::uint32_t chunks[lanes] = {best_fit_npos, best_fit_npos, best_fit_npos, best_fit_npos,
                                   best_fit_npos, best_fit_npos, best_fit_npos, best_fit_npos};
    unsigned matching(std::uint32_t tag) const noexcept { return lanes_equal(tags, tag); }
    unsigned empty() const noexcept { return lanes_equal(chunks, best_fit_npos); }
    /// A bit per lane of `words` equal to `value`, without branches.
    static unsigned lanes_equal(const std::uint32_t (&words)[lanes], std::uint32_t value) noexcept {
#if defined(__SSE2__)
      const __m128i v = _mm_set1_epi32(static_cast<int>(value));
      const __m128i lo = _mm_cmpeq_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(words)), v);
      const __m128i hi = _mm_cmpeq_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(words + 4)), v);
      return static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(lo))) |
             static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(hi))) << 4;
#else
      unsigned m = 0;
      for (unsigned k = 0; k < lanes; ++k) m |= static_cast<unsigned>(words[k] == value) << k;
      return m;
#endif
    }
  };
  std::uint32_t tag_of(std::uintptr_t key) const noexcept { return static_cast<std::uint32_t>(key >> key_shift_); }
  std::size_t home(std::uint32_t tag) const noexcept {
    return static_cast<std::size_t>((std::uint64_t{tag} * 0x9E3779B97F4A7C15ull) >> shift_);  // < bucket count
  }
  position locate(const best_fit_chunk_pool& pool, std::uintptr_t key) const noexcept {
    if (buckets_.empty()) return {npos_bucket, 0, 0};
    const std::uint32_t tag = tag_of(key);
    const std::size_t first = home(tag);
    for (std::size_t b = first;; b = (b + 1) & mask_) {
      const bucket& in = buckets_[b];
      for (unsigned m = in.matching(tag); m != 0; m &= m - 1) {
        const unsigned lane = static_cast<unsigned>(std::countr_zero(m));
        const std::uint32_t c = in.chunks[lane];
        if (c != best_fit_npos && pool[c].addr == key) [[likely]]
          return {b, lane, first};
      }
      if (overflow_[b] == 0) [[likely]]
        return {npos_bucket, 0, 0};
    }
  }
  void place(std::uint32_t tag, std::uint32_t chunk) noexcept {
    for (std::size_t b = home(tag);; b = (b + 1) & mask_) {
      bucket& in = buckets_[b];
      if (const unsigned room = in.empty(); room != 0) [[likely]] {
        const unsigned lane = static_cast<unsigned>(std::countr_zero(room));
        in.tags[lane] = tag;
        in.chunks[lane] = chunk;
        ++count_;
        return;
      }
      ++overflow_[b];
    }
  }
  void rehash(std::size_t bucket_count) {
    std::vector<bucket> old(bucket_count);
    std::vector<std::uint32_t> overflow(bucket_count, 0);
    old.swap(buckets_);
    overflow.swap(overflow_);
    mask_ = bucket_count - 1;
    shift_ = 64u - static_cast<unsigned>(std::countr_zero(bucket_count));
    limit_ = bucket_count * lanes / 2;
    count_ = 0;
    for (const bucket& b : old)
      for (unsigned k = 0; k < lanes; ++k)
        if (b.chunks[k] != best_fit_npos) place(b.tags[k], b.chunks[k]);
  }

  std::vector<bucket> buckets_;
  std::vector<std::uint32_t> overflow_;  ///< per bucket: entries that passed it, full, for a later bucket
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  unsigned key_shift_ = 0;
  std::size_t count_ = 0;
  std::size_t limit_ = 0;  ///< entries that fit before `reserve_one` doubles the table
};

}  // namespace alloy::detail
