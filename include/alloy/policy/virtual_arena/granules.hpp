// SPDX-License-Identifier: Apache-2.0
// alloy/policy/virtual_arena/granules.hpp: the books `virtual_arena` keeps per granule: how many
// chunks begin or end in each, the mapped and touched bit tables, the least-recently-freed list,
// and the release rule that decides how many free mapped granules stay.
// Member definitions only: the class, with every declaration and its contract, is in
// alloy/policy/virtual_arena.hpp, which includes this file.
#pragma once

#include <alloy/policy/virtual_arena.hpp>

namespace alloy {

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::release_free_beyond(std::size_t keep_bytes) noexcept {
  finish_release_batch();
  const std::size_t before = free_mapped_;
  trim(std::min(keep_bytes, kept_free_bytes()));
  return (before - free_mapped_) << granule_shift_;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::stranded_free_bytes() const noexcept {
  std::size_t n = 0;
  for (std::size_t g = 0; g < granules_.size(); ++g) {
    const granule& r = granules_[g];
    if (r.piece == 0 || touched(g) || r.piece_granules < 2) continue;
    n += piece_in_use(g);
  }
  return n << granule_shift_;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::set_piece_run(std::size_t first, std::size_t n, std::uint64_t id, bool fresh) noexcept {
  for (std::size_t g = first; g < first + n; ++g) {
    granule& r = granules_[g];
    r.piece = id;
    r.piece_first = static_cast<std::uint32_t>(first);
    r.piece_granules = static_cast<std::uint32_t>(n);
    r.fresh = fresh;
  }
  mapped_bits_.set(first, first + n);
  mapped_ += n;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::clear_piece_run(std::size_t first, std::size_t n) noexcept {
  for (std::size_t g = first; g < first + n; ++g) {
    granules_[g].piece = 0;
    granules_[g].fresh = false;
  }
  mapped_bits_.reset(first, first + n);
  mapped_ -= n;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::piece_in_use(std::size_t g) const noexcept {
  const granule& r = granules_[g];
  return touched_bits_.count(r.piece_first, r.piece_first + r.piece_granules) != 0;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::unlist_free_piece(std::size_t g) noexcept {
  const std::size_t first = granules_[g].piece_first, n = granules_[g].piece_granules;
  for (std::size_t i = first; i < first + n; ++i) unlist(i);
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::headroom() const noexcept {
  const std::size_t committed = vmm_.physical_bytes() - std::min(vmm_.physical_bytes(), free_mapped_ << granule_shift_);
  return vmm_.capacity() > committed ? vmm_.capacity() - committed : 0;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::reserve_metadata() noexcept {
  if (pool_.available() >= 3 && !map_.full()) [[likely]]
    return true;
  return grow_metadata();
}

template <virtual_memory Vmm>
bool virtual_arena<Vmm>::grow_metadata() noexcept {
  try {
    pool_.reserve(3);
    map_.reserve_one();
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::reserve_granule_table(std::size_t n) noexcept {
  try {
    granules_.reserve(n);
    chunk_ends_.reserve(n);
    mapped_bits_.reserve(n);
    touched_bits_.reserve(n);
  } catch (const std::bad_alloc&) {}
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::cover_granules(std::size_t n) noexcept {
  if (n <= granules_.size()) [[likely]]
    return true;
  return grow_granule_table(n);
}

template <virtual_memory Vmm>
bool virtual_arena<Vmm>::grow_granule_table(std::size_t n) noexcept {
  try {
    detail::reserve_room(granules_, n);
    detail::reserve_room(chunk_ends_, n);
    mapped_bits_.reserve(n);
    touched_bits_.reserve(n);
    mapped_bits_.resize(n);  // nothing throws from here
    touched_bits_.resize(n);
    granules_.resize(n);
    chunk_ends_.resize(n);
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::add_user(std::size_t first, std::size_t last, std::uint16_t t) noexcept {
  std::size_t to_map = 0, reused = 0;
  add_end_user(first, t, to_map, reused, true);
  if (last - first > 1) {
    const std::size_t from = first + 1;
    const std::size_t mapped = mapped_bits_.count(from, last);
    to_map += last - from - mapped;
    reused += mapped;
    if (mapped != 0 && lists_free_granules())
      detail::for_each_bit(
          from, last, [this](std::size_t w) { return mapped_bits_.word(w); }, [this](std::size_t g) { unlink(g); });
    if (tags_in_use_) [[unlikely]]  // else every tag is 0 already
      for (std::size_t g = from; g < last; ++g) granules_[g].tag = t;
    touched_bits_.set(from, last);
  }
  add_end_user(last, t, to_map, reused, last != first);
  free_mapped_ -= reused;
  return to_map;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::add_end_user(std::size_t g, std::uint16_t t, std::size_t& to_map, std::size_t& reused,
                                             bool distinct) noexcept {
  const bool mapped = mapped_bits_.test(g);
  to_map += static_cast<std::size_t>(distinct & !mapped);
  if (chunk_ends_[g]++ != 0) return;
  if (tags_in_use_) [[unlikely]]  // else every tag is 0 already
    granules_[g].tag = t;
  touched_bits_.set(g);
  if (!mapped) return;
  ++reused;  // free mapped until now: in use again
  if (lists_free_granules()) unlink(g);
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::drop_user(std::size_t first, std::size_t last) noexcept {
  std::size_t freed = drop_end_user(first);
  if (last - first > 1) {
    const std::size_t from = first + 1;
    const std::size_t mapped = mapped_bits_.count(from, last);
    if (mapped != 0 && lists_free_granules())
      detail::for_each_bit(
          from, last, [this](std::size_t w) { return mapped_bits_.word(w); },
          [this](std::size_t g) { link_newest(g); });
    touched_bits_.reset(from, last);
    freed += mapped;
  }
  freed += drop_end_user(last);  // the first again for a chunk on one granule (`chunk_ends_` 2)
  free_mapped_ += freed;
  return freed;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::drop_end_user(std::size_t g) noexcept {
  if (--chunk_ends_[g] != 0) return 0;
  touched_bits_.reset(g);
  if (!mapped_bits_.test(g)) return 0;
  if (lists_free_granules()) link_newest(g);
  return 1;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::unlist(std::size_t g) noexcept {
  --free_mapped_;
  if (lists_free_granules()) unlink(g);
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::link_newest(std::size_t g) noexcept {
  granule& r = granules_[g];
  r.older = newest_;
  r.newer = no_granule;
  if (newest_ != no_granule) granules_[newest_].newer = static_cast<std::uint32_t>(g);
  else oldest_ = static_cast<std::uint32_t>(g);
  newest_ = static_cast<std::uint32_t>(g);
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::unlink(std::size_t g) noexcept {
  granule& r = granules_[g];
  if (r.older != no_granule) granules_[r.older].newer = r.newer;
  else oldest_ = r.newer;
  if (r.newer != no_granule) granules_[r.newer].older = r.older;
  else newest_ = r.older;
  r.older = r.newer = no_granule;
}

template <virtual_memory Vmm>
template <class F>
inline std::size_t virtual_arena<Vmm>::take_free(std::size_t n, F&& take) noexcept {
  std::size_t taken = 0;
  if (lists_free_granules()) {
    for (; taken < n && oldest_ != no_granule; ++taken) {
      const std::uint32_t g = oldest_;
      unlist(g);
      take(g, std::size_t{1});
    }
    return taken;
  }
  if (n == 0 || free_mapped_ == 0) return 0;
  const auto free_mapped = [this](std::size_t w) { return mapped_bits_.word(w) & ~touched_bits_.word(w); };
  detail::for_each_bit_descending(0, granules_.size(), free_mapped, [&](std::size_t g) {
    const granule& r = granules_[g];
    if (r.piece == 0) return true;  // went with its piece a moment ago (the scan read the word before)
    const std::size_t first = r.piece_first, granules = r.piece_granules;
    if (granules > 1 && piece_in_use(g)) return true;
    unlist_free_piece(g);
    take(first, granules);
    taken += granules;
    return taken < n && free_mapped_ != 0;
  });
  return taken;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::kept_free_bytes(std::size_t about_to_map) const noexcept {
  const std::size_t touched = touched_granules() + about_to_map;
  const std::size_t touched_bytes = touched << granule_shift_;
  const std::size_t below_peak =
      opts_.keep_up_to_peak ? (std::max(peak_touched_, touched) - touched) << granule_shift_ : 0;
  if (opts_.release_threshold_divisor == 0) return std::max(opts_.release_threshold, below_peak);
  return std::max({opts_.release_threshold, touched_bytes / opts_.release_threshold_divisor, below_peak});
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::kept_free_bytes_before_map(std::size_t to_map) noexcept {
  const std::size_t own = kept_free_bytes(to_map);
  if (keep_limit_.bytes == nullptr) [[likely]]
    return own;
  return std::min(own, keep_limit_.bytes(keep_limit_.context, this, to_map << granule_shift_));
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::trim(std::size_t keep_bytes) noexcept {
  const std::size_t keep = keep_bytes >> granule_shift_;
  if (free_mapped_ > keep) trim_count(free_mapped_ - keep);
  trim_due_ = false;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::trim_count(std::size_t n) noexcept {
  return take_free(n, [&](std::size_t g, std::size_t) { (void)unmap_piece(g); });
}

}  // namespace alloy
