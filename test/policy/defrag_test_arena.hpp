// SPDX-License-Identifier: Apache-2.0
// test/policy/defrag_test_arena.hpp: a small, obviously correct arena with `allocate_at`, for
// testing compacting_defragmenter independently of best_fit_arena.
#pragma once

#include <cstddef>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/detail/align.hpp>

#include "support/checking_upstream.hpp"

namespace alloy::testing {

/// Fixed segments (sizes given at construction) from a checking upstream; chunks of multiples of
/// 256 bytes in a std::map by address; best fit by a linear scan; coalescing on free; `release()`
/// returns wholly free segments. Misuse (double free, foreign pointer, wrong size) is recorded in
/// `errors()`. Host memory only.
class defrag_test_arena {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  static constexpr std::size_t rounding = 256;

  defrag_test_arena() = default;
  explicit defrag_test_arena(std::vector<std::size_t> segment_sizes, checking_upstream up = {})
      : upstream_(std::move(up)) {
    for (std::size_t size : segment_sizes) {
      const block b = upstream_.allocate(size, 4096);
      if (!b) continue;
      segments_.push_back(b);
      chunks_.emplace(static_cast<char*>(b.ptr), chunk{size, 0, true, segments_.size() - 1});
    }
  }
  defrag_test_arena(defrag_test_arena&& other) noexcept
      : upstream_(other.upstream_),
        segments_(std::move(other.segments_)),
        chunks_(std::move(other.chunks_)),
        errors_(std::move(other.errors_)) {
    other.segments_.clear();
    other.chunks_.clear();
  }
  defrag_test_arena& operator=(defrag_test_arena&&) = delete;
  ~defrag_test_arena() {
    for (const block& b : segments_) {
      if (b) upstream_.deallocate(b);
    }
  }

  std::size_t chunk_size(std::size_t bytes) const noexcept {
    return detail::round_up(bytes == 0 ? 1 : bytes, rounding);
  }

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::is_power_of_two(alignment) || alignment > 4096) return {};
    const std::size_t size = chunk_size(bytes);
    if (size == 0) return {};
    auto best = chunks_.end();
    char* best_at = nullptr;
    for (auto it = chunks_.begin(); it != chunks_.end(); ++it) {
      if (!it->second.free) continue;
      char* at = align(it->first, alignment);
      const std::size_t pad = static_cast<std::size_t>(at - it->first);
      if (pad > it->second.size || it->second.size - pad < size) continue;
      if (best == chunks_.end() || it->second.size < best->second.size) {
        best = it;
        best_at = at;
      }
    }
    if (best == chunks_.end()) return {};
    return carve(best, best_at, size, bytes);
  }

  block allocate_at(void* where, std::size_t bytes) noexcept {
    const std::size_t size = chunk_size(bytes);
    char* at = static_cast<char*>(where);
    auto it = chunks_.upper_bound(at);
    if (size == 0 || it == chunks_.begin()) return {};
    --it;
    if (!it->second.free || at + size > it->first + it->second.size) return {};
    return carve(it, at, size, bytes);
  }

  void deallocate(block b) noexcept {
    auto it = chunks_.find(static_cast<char*>(b.ptr));
    if (it == chunks_.end() || it->second.free) {
      errors_.push_back("deallocate of a block the arena did not hand out");
      return;
    }
    if (it->second.requested != b.size) errors_.push_back("deallocate with the wrong size");
    it->second.free = true;
    it->second.requested = 0;
    const auto next = std::next(it);
    if (next != chunks_.end() && next->second.free && next->second.segment == it->second.segment &&
        it->first + it->second.size == next->first) {
      it->second.size += next->second.size;
      chunks_.erase(next);
    }
    if (it != chunks_.begin()) {
      const auto prev = std::prev(it);
      if (prev->second.free && prev->second.segment == it->second.segment &&
          prev->first + prev->second.size == it->first) {
        prev->second.size += it->second.size;
        chunks_.erase(it);
      }
    }
  }

  bool owns(block b) const noexcept {
    for (const block& s : segments_) {
      if (s && b.ptr >= s.ptr && static_cast<char*>(b.ptr) < static_cast<char*>(s.ptr) + s.size) return true;
    }
    return false;
  }

  void release() noexcept {
    for (auto it = chunks_.begin(); it != chunks_.end();) {
      block& s = segments_[it->second.segment];
      if (it->second.free && it->second.size == s.size) {
        upstream_.deallocate(s);
        s = {};
        it = chunks_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::size_t reserved_bytes() const noexcept {
    std::size_t total = 0;
    for (const block& s : segments_) total += s.size;
    return total;
  }

  template <class F>
  void for_each_block(F&& visit) const {
    for (const auto& [at, c] : chunks_) {
      const block& s = segments_[c.segment];
      visit(block_info{s.ptr, s.size, at, c.size, c.requested, c.free ? block_state::free : block_state::allocated});
    }
  }

  std::size_t free_bytes() const noexcept {
    std::size_t total = 0;
    for (const auto& [at, c] : chunks_) total += c.free ? c.size : 0;
    return total;
  }
  std::size_t largest_free() const noexcept {
    std::size_t largest = 0;
    for (const auto& [at, c] : chunks_) {
      if (c.free && c.size > largest) largest = c.size;
    }
    return largest;
  }
  std::size_t free_pieces() const noexcept {
    std::size_t n = 0;
    for (const auto& [at, c] : chunks_) n += c.free ? 1 : 0;
    return n;
  }
  const std::vector<std::string>& errors() const noexcept { return errors_; }
  const checking_upstream& upstream() const noexcept { return upstream_; }
  auto parts() noexcept { return std::tie(upstream_); }
  auto parts() const noexcept { return std::tie(upstream_); }

 private:
  struct chunk {
    std::size_t size;
    std::size_t requested;
    bool free;
    std::size_t segment;
  };

  static char* align(char* p, std::size_t alignment) noexcept {
    const auto v = reinterpret_cast<std::uintptr_t>(p);
    return reinterpret_cast<char*>((v + alignment - 1) & ~(std::uintptr_t{alignment} - 1));
  }

  block carve(std::map<char*, chunk>::iterator it, char* at, std::size_t size, std::size_t requested) noexcept {
    const chunk c = it->second;
    const std::size_t front = static_cast<std::size_t>(at - it->first);
    const std::size_t back = c.size - front - size;
    if (front > 0) {
      it->second.size = front;
    } else {
      chunks_.erase(it);
    }
    chunks_.emplace(at, chunk{size, requested, false, c.segment});
    if (back > 0) chunks_.emplace(at + size, chunk{back, 0, true, c.segment});
    return {at, requested};
  }

  checking_upstream upstream_{};
  std::vector<block> segments_;
  std::map<char*, chunk> chunks_;
  std::vector<std::string> errors_;
};

}  // namespace alloy::testing
