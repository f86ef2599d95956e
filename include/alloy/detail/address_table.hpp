// SPDX-License-Identifier: Apache-2.0
// alloy/detail/address_table.hpp: a table keyed by block address, for the bookkeeping that must
// find a block by its pointer on every free (the movable policies' resident blocks, liballoy's
// live blocks, sharded's small blocks and quantizer's sizes in checked builds).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace alloy::detail {

/// The value of an `address_table` used as a set.
struct no_value {};

/// Addresses (never null) and a `Value` for each: open addressing with linear probing, at most
/// half full, deletion by backward shift. Memory is allocated only when the table grows (doubling);
/// lookups, removals and moves never allocate, and the noexcept calls report a failed growth as
/// false instead of throwing. Chosen over node-based sets by measurement (bench/HISTORY.md,
/// 2026-12-07). Not thread-safe. A moved-from table is empty and usable; a copy (which allocates)
/// is independent of its original.
template <class Value = no_value>
class address_table {
  static_assert(std::is_nothrow_default_constructible_v<Value> && std::is_nothrow_copy_assignable_v<Value>);

 public:
  address_table() = default;
  address_table(const address_table&) = default;
  address_table& operator=(const address_table&) = default;
  address_table(address_table&& other) noexcept
      : slots_(std::move(other.slots_)), count_(std::exchange(other.count_, 0)), shift_(other.shift_) {
    other.slots_.clear();
  }
  address_table& operator=(address_table&& other) noexcept {
    slots_ = std::move(other.slots_);
    other.slots_.clear();
    count_ = std::exchange(other.count_, 0);
    shift_ = other.shift_;
    return *this;
  }

  std::size_t size() const noexcept { return count_; }

  /// Adds `p`, which must not be in the table; false when memory for it ran out (nothing changed).
  bool add(const void* p, Value value = {}) noexcept {
    if ((count_ + 1) * 2 > slots_.size() && !grow()) return false;
    place({p, value});
    ++count_;
    return true;
  }
  /// Removes `p` and says whether it was there.
  bool remove(const void* p) noexcept {
    const std::size_t at = index_of(p);
    if (at == absent) return false;
    erase_at(at);
    return true;
  }
  /// Removes the entry whose value `found` (from `find`, the table unchanged since) points to,
  /// without probing again.
  void remove_found(const Value* found) noexcept {
    const auto offset = reinterpret_cast<const char*>(found) - reinterpret_cast<const char*>(slots_.data());
    erase_at(static_cast<std::size_t>(offset) / sizeof(entry));
  }
  /// The entry at `from` now lies at `to`, with its value (no allocation: as many entries as
  /// before); nothing happens when `from` is absent.
  void move(const void* from, const void* to) noexcept {
    const std::size_t at = index_of(from);
    if (at == absent) return;
    const Value value = slots_[at].value;
    erase_at(at);
    place({to, value});
    ++count_;
  }
  bool contains(const void* p) const noexcept { return index_of(p) != absent; }
  /// `p`'s value, or null when `p` is absent; valid until the table changes.
  Value* find(const void* p) noexcept {
    const std::size_t at = index_of(p);
    return at == absent ? nullptr : &slots_[at].value;
  }
  const Value* find(const void* p) const noexcept {
    const std::size_t at = index_of(p);
    return at == absent ? nullptr : &slots_[at].value;
  }
  /// Empties the table and gives its memory back.
  void clear() noexcept {
    std::vector<entry>().swap(slots_);
    count_ = 0;
  }

 private:
  struct entry {
    const void* key = nullptr;  ///< null: an empty slot
    [[no_unique_address]] Value value{};
  };
  static_assert(!std::is_empty_v<Value> || sizeof(entry) == sizeof(const void*), "a set's slot is one pointer");
  static constexpr std::size_t absent = ~std::size_t{0};

  // Fibonacci hashing of the address without its low bits (blocks are at least 16-byte aligned).
  std::size_t home(const void* p) const noexcept {
    const std::uint64_t x = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p) >> 4);
    return static_cast<std::size_t>((x * 0x9E37'79B9'7F4A'7C15u) >> shift_);
  }
  std::size_t index_of(const void* p) const noexcept {
    if (count_ == 0 || p == nullptr) return absent;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = home(p); slots_[i].key != nullptr; i = (i + 1) & mask) {
      if (slots_[i].key == p) return i;
    }
    return absent;
  }
  void place(entry e) noexcept {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = home(e.key);
    while (slots_[i].key != nullptr) i = (i + 1) & mask;
    slots_[i] = e;
  }
  // Later entries of the run move back into the hole unless that would put them before home.
  void erase_at(std::size_t hole) noexcept {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t j = (hole + 1) & mask; slots_[j].key != nullptr; j = (j + 1) & mask) {
      if (((j - home(slots_[j].key)) & mask) >= ((j - hole) & mask)) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = entry{};
    --count_;
  }
  bool grow() noexcept {
    std::vector<entry> old;
    try {
      old.assign(slots_.empty() ? 16 : slots_.size() * 2, entry{});
    } catch (...) {
      return false;
    }
    old.swap(slots_);
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(slots_.size()));
    for (const entry& e : old) {
      if (e.key != nullptr) place(e);
    }
    return true;
  }

  std::vector<entry> slots_;  ///< a power of two of them
  std::size_t count_ = 0;
  unsigned shift_ = 64;
};

}  // namespace alloy::detail
