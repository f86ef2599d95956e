// SPDX-License-Identifier: Apache-2.0
// test/policy/stats_toys.hpp: small, obviously correct allocators with every capability stats<>
// reads (reserved bytes, counters, introspection, stream-ordered calls, max_split_size) and a
// segregator-shaped router, so the statistics can be checked against hand-computed values
// whatever the real arena and pools do.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/literals.hpp>

namespace alloy::testing {

/// First fit over segments of `segment_size` (or one segment of its own for a bigger request),
/// pieces rounded to 256 B, free neighbours coalesced, empty segments given back on `release()`.
template <class Upstream>
class toy_arena {
 public:
  static constexpr bool host_accessible = Upstream::host_accessible;
  static constexpr bool device_accessible = Upstream::device_accessible;
  static constexpr std::size_t rounding = 256;
  static constexpr std::size_t segment_alignment = 4096;

  struct options {
    std::size_t segment_size = 1u << 20;
    std::size_t capacity = std::numeric_limits<std::size_t>::max();  ///< most bytes reserved at once
    std::size_t max_split = std::numeric_limits<std::size_t>::max();
  };

  toy_arena() = default;
  explicit toy_arena(Upstream up, options opts = {}) : upstream_(std::move(up)), options_(opts) {}
  toy_arena(toy_arena&& other) noexcept
      : upstream_(std::move(other.upstream_)),
        options_(other.options_),
        segments_(std::move(other.segments_)),
        reserved_(other.reserved_),
        counters_(other.counters_),
        stream_calls_(other.stream_calls_) {
    other.segments_.clear();
    other.reserved_ = 0;
  }
  toy_arena& operator=(toy_arena&&) = delete;
  ~toy_arena() {
    for (segment& s : segments_) upstream_.deallocate(s.memory);
  }

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::is_power_of_two(alignment) || alignment > segment_alignment) return fail();
    const std::size_t rounded = detail::round_up(bytes == 0 ? 1 : bytes, rounding);
    if (rounded == 0) return fail();
    try {
      for (segment& s : segments_)
        if (void* p = place(s, rounded, bytes, alignment)) return {p, bytes};
      const std::size_t size = std::max(options_.segment_size, detail::round_up(rounded, segment_alignment));
      if (size == 0 || size > options_.capacity - std::min(options_.capacity, reserved_)) return fail();
      const block memory = upstream_.allocate(size, segment_alignment);
      if (!memory) return fail();
      ++counters_.num_device_alloc;
      reserved_ += size;
      segments_.push_back(segment{memory, size, {{0, piece{size, 0, false}}}});
      return {place(segments_.back(), rounded, bytes, alignment), bytes};
    } catch (...) {
      return fail();
    }
  }

  void deallocate(block b) noexcept {
    if (!b) return;
    for (segment& s : segments_) {
      const auto base = reinterpret_cast<std::uintptr_t>(s.memory.ptr);
      const auto p = reinterpret_cast<std::uintptr_t>(b.ptr);
      if (p < base || p >= base + s.size) continue;
      auto it = s.pieces.find(p - base);
      if (it == s.pieces.end() || !it->second.used) return;
      it->second.used = false;
      it->second.requested = 0;
      auto next = std::next(it);
      if (next != s.pieces.end() && !next->second.used) {
        it->second.size += next->second.size;
        s.pieces.erase(next);
      }
      if (it != s.pieces.begin()) {
        auto prev = std::prev(it);
        if (!prev->second.used) {
          prev->second.size += it->second.size;
          s.pieces.erase(it);
        }
      }
      return;
    }
  }

  block allocate(std::size_t bytes, std::size_t alignment, int stream) noexcept {
    stream_calls_ += static_cast<std::size_t>(stream >= 0);
    return allocate(bytes, alignment);
  }
  void deallocate(block b, int stream) noexcept {
    stream_calls_ += static_cast<std::size_t>(stream >= 0);
    deallocate(b);
  }

  bool owns(block b) const noexcept {
    const auto p = reinterpret_cast<std::uintptr_t>(b.ptr);
    for (const segment& s : segments_) {
      const auto base = reinterpret_cast<std::uintptr_t>(s.memory.ptr);
      if (p >= base && p < base + s.size) return true;
    }
    return false;
  }
  void release() noexcept {
    std::erase_if(segments_, [&](segment& s) {
      if (s.pieces.size() != 1 || s.pieces.begin()->second.used) return false;
      upstream_.deallocate(s.memory);
      reserved_ -= s.size;
      ++counters_.num_device_free;
      return true;
    });
  }
  std::size_t reserved_bytes() const noexcept { return reserved_; }
  allocator_counters counters() const noexcept { return counters_; }
  std::size_t max_split_size() const noexcept { return options_.max_split; }
  template <class F>
  void for_each_block(F&& visit) const {
    std::vector<const segment*> sorted;
    for (const segment& s : segments_) sorted.push_back(&s);
    std::sort(sorted.begin(), sorted.end(), [](auto l, auto r) { return l->memory.ptr < r->memory.ptr; });
    for (const segment* s : sorted) {
      for (const auto& [offset, p] : s->pieces) {
        visit(block_info{s->memory.ptr, s->size, static_cast<char*>(s->memory.ptr) + offset, p.size, p.requested,
                         p.used ? block_state::allocated : block_state::free});
      }
    }
  }

  std::size_t stream_calls() const noexcept { return stream_calls_; }
  Upstream& upstream() noexcept { return upstream_; }
  auto parts() noexcept { return std::tie(upstream_); }
  auto parts() const noexcept { return std::tie(upstream_); }

 private:
  struct piece {
    std::size_t size;
    std::size_t requested;
    bool used;
  };
  struct segment {
    block memory;
    std::size_t size;
    std::map<std::size_t, piece> pieces;  // by offset
  };

  block fail() noexcept {
    ++counters_.num_ooms;
    return {};
  }

  static void* place(segment& s, std::size_t rounded, std::size_t requested, std::size_t alignment) {
    const auto base = reinterpret_cast<std::uintptr_t>(s.memory.ptr);
    for (auto it = s.pieces.begin(); it != s.pieces.end(); ++it) {
      if (it->second.used) continue;
      const std::size_t offset = it->first;
      const std::size_t aligned = detail::round_up(base + offset, alignment) - base;
      const std::size_t pad = aligned - offset;
      if (pad + rounded > it->second.size) continue;
      const std::size_t rest = it->second.size - pad - rounded;
      if (pad > 0) {
        it->second.size = pad;
        s.pieces.emplace(aligned, piece{rounded, requested, true});
      } else {
        it->second = piece{rounded, requested, true};
      }
      if (rest > 0) s.pieces.emplace(aligned + rounded, piece{rest, 0, false});
      return reinterpret_cast<void*>(base + aligned);
    }
    return nullptr;
  }

  Upstream upstream_{};
  options options_{};
  std::vector<segment> segments_;
  std::size_t reserved_ = 0;
  allocator_counters counters_{};
  std::size_t stream_calls_ = 0;
};

/// Routes requests of at most `Threshold` bytes to `Small`, larger ones to `Large`; shaped like
/// `segregator<Threshold, Small, Large>` (small(), large(), threshold).
template <std::size_t Threshold, class Small, class Large>
class toy_segregator {
 public:
  static constexpr bool host_accessible = Small::host_accessible && Large::host_accessible;
  static constexpr bool device_accessible = Small::device_accessible && Large::device_accessible;
  static constexpr std::size_t threshold = Threshold;

  toy_segregator() = default;
  toy_segregator(Small s, Large l) : small_(std::move(s)), large_(std::move(l)) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return bytes <= Threshold ? small_.allocate(bytes, alignment) : large_.allocate(bytes, alignment);
  }
  void deallocate(block b) noexcept {
    if (b.size <= Threshold) {
      small_.deallocate(b);
    } else {
      large_.deallocate(b);
    }
  }
  bool owns(block b) const noexcept
    requires owning_allocator<Small> && owning_allocator<Large>
  {
    return small_.owns(b) || large_.owns(b);
  }
  void release() noexcept
    requires releasing_allocator<Small> && releasing_allocator<Large>
  {
    small_.release();
    large_.release();
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<Small> && reserving_allocator<Large>
  {
    return small_.reserved_bytes() + large_.reserved_bytes();
  }
  allocator_counters counters() const noexcept
    requires counting_allocator<Small> && counting_allocator<Large>
  {
    const allocator_counters s = small_.counters(), l = large_.counters();
    return {s.num_device_alloc + l.num_device_alloc, s.num_device_free + l.num_device_free,
            s.num_alloc_retries + l.num_alloc_retries, s.num_ooms + l.num_ooms};
  }
  template <class F>
    requires introspectable_allocator<Small> && introspectable_allocator<Large>
  void for_each_block(F&& visit) const {
    small_.for_each_block(visit);
    large_.for_each_block(visit);
  }

  Small& small() noexcept { return small_; }
  const Small& small() const noexcept { return small_; }
  Large& large() noexcept { return large_; }
  const Large& large() const noexcept { return large_; }
  auto parts() noexcept { return std::tie(small_, large_); }
  auto parts() const noexcept { return std::tie(small_, large_); }

 private:
  Small small_{};
  Large large_{};
};

}  // namespace alloy::testing
