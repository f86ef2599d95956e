// SPDX-License-Identifier: Apache-2.0
// alloy/movable/handle_table.hpp: the table of slots that handles name, and the bad-handle error.
// (Part of alloy/movable.hpp, which includes every part; the handle rules are there.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/edge.hpp>
#include <alloy/error.hpp>
#include <alloy/movable/counters.hpp>

namespace alloy {
namespace detail {

/// Slots named by handles. A handle's id is `(generation << 32) | ((index + 1) ^ key)`: never
/// zero, and a slot's generation changes when it is freed, so a stale handle never finds the new
/// tenant. `key` is this table's own: a mix of the address of a byte the table holds from its first
/// handle to its end (unique among live tables; tables made side by side get keys far apart), so a
/// handle of another table names no live slot here (unless two keys agree in all but the few low
/// bits that index this table's slots: about one pair in 2^32 / slots).
/// Metadata: one `Entry` plus 8 bytes per slot, slots reused through a free list; O(1) everything.
template <class Entry>
class handle_table {
 public:
  /// Stores `e` and names it; an empty handle when memory for the table runs out.
  handle insert(Entry e) noexcept {
    try {
      if (!mark_) {
        mark_ = std::make_unique<char>();
        std::uint64_t x = reinterpret_cast<std::uintptr_t>(mark_.get());  // splitmix64's finalizer
        x = (x ^ (x >> 30)) * 0xBF58'476D'1CE4'E5B9u;
        x = (x ^ (x >> 27)) * 0x94D0'49BB'1331'11EBu;
        key_ = static_cast<std::uint32_t>((x ^ (x >> 31)) >> 32);
      }
      std::uint32_t index;
      if (!free_.empty()) {
        index = free_.back();
        free_.pop_back();
      } else {
        if (slots_.size() >= std::numeric_limits<std::uint32_t>::max() - 1) return {};
        slots_.emplace_back();
        index = static_cast<std::uint32_t>(slots_.size() - 1);
      }
      slot& s = slots_[index];
      s.entry = std::move(e);
      s.used = true;
      ++live_;
      return name(index);
    } catch (...) {
      return {};
    }
  }

  /// The entry `h` names, or nullptr when `h` is empty, unknown, stale or another table's.
  Entry* find(handle h) noexcept {
    const std::uint64_t low = (h.id & 0xFFFF'FFFFu) ^ key_;
    if (low == 0 || low > slots_.size()) return nullptr;
    slot& s = slots_[low - 1];
    if (!s.used || s.generation != static_cast<std::uint32_t>(h.id >> 32)) return nullptr;
    return &s.entry;
  }
  const Entry* find(handle h) const noexcept { return const_cast<handle_table*>(this)->find(h); }

  /// Forgets `h` (which must be live).
  void erase(handle h) noexcept {
    const std::uint32_t index = static_cast<std::uint32_t>(((h.id & 0xFFFF'FFFFu) ^ key_) - 1);
    slot& s = slots_[index];
    s.used = false;
    s.entry = Entry{};
    if (++s.generation == 0) s.generation = 1;
    --live_;
    try {
      free_.push_back(index);
    } catch (...) {  // the slot is simply not reused
    }
  }

  /// Calls `f(handle, Entry&)` for every live entry.
  template <class F>
  void for_each(F&& f) {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].used) f(name(static_cast<std::uint32_t>(i)), slots_[i].entry);
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].used) f(name(static_cast<std::uint32_t>(i)), slots_[i].entry);
    }
  }

  std::size_t size() const noexcept { return live_; }

 private:
  struct slot {
    Entry entry{};
    std::uint32_t generation = 1;
    bool used = false;
  };
  handle name(std::uint32_t index) const noexcept {
    return handle{(std::uint64_t{slots_[index].generation} << 32) | ((std::uint64_t{index} + 1) ^ key_)};
  }

  std::vector<slot> slots_;
  std::vector<std::uint32_t> free_;
  std::size_t live_ = 0;
  std::unique_ptr<char> mark_;  // its address makes `key_`
  std::uint32_t key_ = 0;
};

/// Finds a live entry or throws the logic error every handle call reports for bad handles.
template <class Table>
auto& entry_or_throw(Table& table, handle h, const char* call,
                     alloy::source_location at = alloy::source_location::current()) {
  auto* e = table.find(h);
  if (e == nullptr) {
    throw logic_error(std::string(call) + " of " + (h ? "an unknown or already deallocated" : "an empty") +
                          " handle (id " + std::to_string(h.id) + ")",
                      at);
  }
  return *e;
}

}  // namespace detail

}  // namespace alloy
