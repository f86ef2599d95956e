// SPDX-License-Identifier: Apache-2.0
// alloy/detail/bit_table.hpp: a growable table of bits with range operations a word (64 bits)
// at a time, so that work over a run of n bits costs n / 64 steps (virtual_arena's granules).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <alloy/detail/align.hpp>

namespace alloy::detail {

/// Set bits of `x`. x86-64 without `-mpopcnt` has no instruction for it and std::popcount calls
/// libgcc there, slow on a hot path; the arithmetic below is a dozen inline operations.
constexpr unsigned popcount(std::uint64_t x) noexcept {
#if defined(__x86_64__) && !defined(__POPCNT__)
  x -= (x >> 1) & 0x5555555555555555u;
  x = (x & 0x3333333333333333u) + ((x >> 2) & 0x3333333333333333u);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Fu;
  return static_cast<unsigned>((x * 0x0101010101010101u) >> 56);
#else
  return static_cast<unsigned>(std::popcount(x));
#endif
}

/// The bits of word `w` that lie in [first, end) (first < end, and the word overlaps the range).
[[gnu::always_inline]] constexpr std::uint64_t bits_in_range(std::size_t w, std::size_t first,
                                                             std::size_t end) noexcept {
  const std::size_t lo = w * 64;
  std::uint64_t mask = ~std::uint64_t{0};
  if (first > lo) mask &= ~std::uint64_t{0} << (first - lo);
  if (end - lo < 64) mask &= (std::uint64_t{1} << (end - lo)) - 1;
  return mask;
}

/// How many bits of [first, end) are set in the words `word(w)` gives (combinations of tables).
/// Inline for a range within one word (most of virtual_arena's blocks), a loop beyond.
template <class Word>
[[gnu::always_inline]] inline std::size_t count_bits(std::size_t first, std::size_t end, Word&& word) noexcept {
  if (first >= end) return 0;
  const std::size_t w0 = first / 64, w1 = (end - 1) / 64;
  if (w0 == w1) {
    const std::uint64_t mask = bits_in_range(w0, first, end), bits = word(w0) & mask;
    return bits == 0 ? 0 : bits == mask ? end - first : popcount(bits);
  }
  std::size_t n = 0;
  for (std::size_t w = w0; w <= w1; ++w) {
    const std::uint64_t bits = word(w) & bits_in_range(w, first, end);
    if (bits != 0) n += popcount(bits);
  }
  return n;
}

/// Calls `visit(i)` for every bit i of [first, end) set in `word(w)`, lowest first. Each word is
/// read once before its bits are visited, so `visit` may change the bit it is given.
template <class Word, class Visit>
void for_each_bit(std::size_t first, std::size_t end, Word&& word, Visit&& visit) {
  if (first >= end) return;
  for (std::size_t w = first / 64; w <= (end - 1) / 64; ++w)
    for (std::uint64_t bits = word(w) & bits_in_range(w, first, end); bits != 0; bits &= bits - 1)
      visit(w * 64 + static_cast<std::size_t>(std::countr_zero(bits)));
}

/// As `for_each_bit`, highest first, while `visit(i)` returns true.
template <class Word, class Visit>
void for_each_bit_descending(std::size_t first, std::size_t end, Word&& word, Visit&& visit) {
  if (first >= end) return;
  for (std::size_t w = (end - 1) / 64 + 1; w-- > first / 64;) {
    for (std::uint64_t bits = word(w) & bits_in_range(w, first, end); bits != 0;) {
      const unsigned top = 63u - static_cast<unsigned>(std::countl_zero(bits));
      if (!visit(w * 64 + top)) return;
      bits &= ~(std::uint64_t{1} << top);
    }
  }
}

/// A table of bits [0, size()), all clear when added.
class bit_table {
 public:
  std::size_t size() const noexcept { return size_; }
  /// Room for `bits` bits (geometric growth), so that `resize` up to that cannot throw. May throw
  /// std::bad_alloc.
  void reserve(std::size_t bits) { reserve_room(words_, (bits + 63) / 64); }
  /// Grows or shrinks to `bits`; bits added are clear. May throw std::bad_alloc (beyond what
  /// `reserve` made room for) before anything changed.
  void resize(std::size_t bits) {
    const std::size_t words = (bits + 63) / 64;
    reserve(bits);
    if (bits < size_ && bits % 64 != 0) {
      words_[bits / 64] &= bits_in_range(bits / 64, 0, bits);  // cleared bits stay clear
      for (std::size_t w = bits / 64 + 1; w < words_.size(); ++w) words_[w] = 0;
    }
    words_.resize(words, 0);
    size_ = bits;
  }
  void clear() noexcept {
    words_.clear();
    size_ = 0;
  }
  std::uint64_t word(std::size_t w) const noexcept { return words_[w]; }
  bool test(std::size_t i) const noexcept { return (words_[i / 64] >> (i % 64) & 1u) != 0; }
  void set(std::size_t i) noexcept { words_[i / 64] |= std::uint64_t{1} << (i % 64); }
  void reset(std::size_t i) noexcept { words_[i / 64] &= ~(std::uint64_t{1} << (i % 64)); }
  /// Sets, clears or counts bits [first, end) (below `size()`).
  void set(std::size_t first, std::size_t end) noexcept {
    if (first >= end) return;
    for (std::size_t w = first / 64; w <= (end - 1) / 64; ++w) words_[w] |= bits_in_range(w, first, end);
  }
  void reset(std::size_t first, std::size_t end) noexcept {
    if (first >= end) return;
    for (std::size_t w = first / 64; w <= (end - 1) / 64; ++w) words_[w] &= ~bits_in_range(w, first, end);
  }
  [[gnu::always_inline]] std::size_t count(std::size_t first, std::size_t end) const noexcept {
    return count_bits(first, end, [this](std::size_t w) { return words_[w]; });
  }

 private:
  std::vector<std::uint64_t> words_;
  std::size_t size_ = 0;
};

}  // namespace alloy::detail
