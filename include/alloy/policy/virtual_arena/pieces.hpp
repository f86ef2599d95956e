// SPDX-License-Identifier: Apache-2.0
// alloy/policy/virtual_arena/pieces.hpp: the physical pieces behind `virtual_arena`'s granules:
// every create, map, unmap and release it makes, block-sized pieces, frontier growth, and making
// room when the device runs short.
// Member definitions only: the class, with every declaration and its contract, is in
// alloy/policy/virtual_arena.hpp, which includes this file.
#pragma once

#include <alloy/policy/virtual_arena.hpp>

namespace alloy {

template <virtual_memory Vmm>
bool virtual_arena<Vmm>::map_new_granules(std::size_t first, std::size_t last, bool may_release, std::size_t to_map,
                                          std::uintptr_t start, std::size_t rounded) noexcept {
  if (!may_release) trim_due_ = true;  // maps without trimming first: the next free trims
  // What the backend could give at most if every free mapped granule went back (and a release
  // in flight finished): when even that is too little, fail now and keep the cache.
  if (to_map > headroom_granules() && !(wait_for_release() && to_map <= headroom_granules())) {
    (void)drop_user(first, last);  // nothing mapped yet
    return false;
  }
  // The granules about to be mapped count against what is kept free: trimmed first, so that
  // mapped memory never passes what the live chunks touch plus what a free may keep.
  if (may_release) trim(kept_free_bytes_before_map(to_map));
  if (opts_.frontier_growth_divisor != 0 && map_with_granules_ahead(first, last, to_map)) return true;
  bool retried = false;
  if (map_chunk_granules(first, last, start, rounded, may_release, to_map, retried) == map_result::mapped) return true;
  (void)drop_user(first, last);  // what it mapped is unmapped already
  return false;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::map_with_granules_ahead(std::size_t first, std::size_t last,
                                                        std::size_t to_map) noexcept {
  const std::size_t ahead = granules_ahead(first, last, to_map);
  if (ahead == 0) return false;
  const std::size_t from = last + 1 - to_map, n = to_map + ahead;
  if (map_whole_run(from, n) != map_result::mapped) return false;
  for (std::size_t g = from; g < from + n; ++g) granules_[g].fresh = false;
  free_mapped_ += ahead;
  return true;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::granules_ahead(std::size_t first, std::size_t last,
                                                      std::size_t to_map) noexcept {
  if (opts_.frontier_growth_divisor == 0 || tags_in_use_ || pending_plans_ != 0 || batch_.active) return 0;
  // How many fit ahead first (arithmetic): once the heap is past 1/16 of the capacity nothing
  // does, and the frontier's scan of the mapped table below is skipped.
  std::size_t ahead = (mapped_ + to_map) / opts_.frontier_growth_divisor;
  if (ahead < opts_.frontier_growth_min_granules) ahead = small_heap_granules_ahead(ahead, to_map);
  if (ahead == 0) return 0;
  // Only while the backend holds little: such pieces then total at most 1/16 of its capacity,
  // all that they can keep from going back under pressure.
  const std::size_t room = granules_within_share<16>();
  ahead = std::min({ahead, room > to_map ? room - to_map : 0, granule_of(end_) - (last + 1)});
  if (ahead == 0) return 0;
  const std::size_t from = granules_[first].piece != 0 ? first + 1 : first;
  if (from > last || to_map != last + 1 - from || mapped_bits_.count(last + 1, granules_.size()) != 0) return 0;
  return cover_granules(last + 1 + ahead) ? ahead : 0;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::small_heap_granules_ahead(std::size_t ahead, std::size_t to_map) const noexcept {
  const std::size_t least = opts_.frontier_growth_min_granules, room = granules_within_share<small_heap_share>();
  return least <= room && to_map <= room - least ? least : ahead;
}

template <virtual_memory Vmm>
inline auto virtual_arena<Vmm>::map_chunk_granules(std::size_t first, std::size_t last, std::uintptr_t start,
                                                   std::size_t rounded, bool may_release, std::size_t& to_map,
                                                   bool& retried) noexcept -> map_result {
  const auto [run_from, run_to] = whole_run_span(first, last, start, rounded);
  bool whole_runs = run_from < run_to;
  const auto unmapped = [this](std::size_t g) { return granules_[g].piece == 0 && !granules_[g].pending; };
  const auto fail = [&](map_result why) {
    for (std::size_t g = first; g <= last; ++g)
      if (granules_[g].fresh) unmap_piece(g);  // a block-sized piece lies inside [first, last]
    return why;
  };
  for (std::size_t g = first; g <= last; ++g) {
    if (!unmapped(g)) continue;
    if (whole_runs && g >= run_from && g < run_to) {
      std::size_t end = g + 1;
      while (end < run_to && unmapped(end)) ++end;
      if (end - g > 1) {
        map_result run = map_whole_run(g, end - g);
        if (run != map_result::mapped && may_release && make_room(to_map, retried)) run = map_whole_run(g, end - g);
        if (run == map_result::mapped) {
          to_map -= end - g;
          g = end - 1;
          continue;
        }
        // Short of memory with nothing to give back (allocate_keeping_cache): granule by granule
        // would only map what fits and fail the same way.
        if (run == map_result::no_memory && !may_release) return fail(map_result::no_memory);
        whole_runs = false;  // the rest granule by granule, releasing free ones when the capacity needs it
      }
    }
    physical_memory piece = vmm_.create(opts_.granularity);
    while (!piece) {
      if (!may_release || !make_room(to_map, retried)) return fail(map_result::no_memory);
      piece = vmm_.create(opts_.granularity);
    }
    ++counters_.num_device_alloc;
    if (!vmm_.map(granule_address(g), piece)) {
      vmm_.release(piece);
      ++counters_.num_device_free;
      return fail(map_result::map_failed);
    }
    ++counters_.num_maps;
    set_piece_run(g, 1, piece.id, true);
    --to_map;
  }
  for (std::size_t g = first; g <= last; ++g) granules_[g].fresh = false;
  return map_result::mapped;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::make_room(std::size_t to_map, bool& retried) noexcept {
  if (wait_for_release()) return true;
  if (free_mapped_ == 0) return false;
  if (!retried) {
    retried = true;
    ++counters_.num_alloc_retries;
  }
  return trim_count(std::min(free_mapped_, to_map)) != 0;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::release_pieces_partly_reused(std::uintptr_t start, std::size_t rounded) noexcept {
  const std::size_t first = granule_of(start), last = granule_of(start + rounded - 1);
  // Most blocks meet no such piece: told by the touched bits and the table, without a call.
  if (!maybe_in_free_piece(first) && !maybe_in_free_piece(last)) [[likely]]
    return;
  release_free_pieces_partly_reused(start, rounded, first, last);
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::maybe_in_free_piece(std::size_t g) const noexcept {
  return g < granules_.size() && !touched(g) && in_block_sized_piece(g);
}

template <virtual_memory Vmm>
void virtual_arena<Vmm>::release_free_pieces_partly_reused(std::uintptr_t start, std::size_t rounded, std::size_t first,
                                                           std::size_t last) noexcept {
  const std::size_t capacity = vmm_.capacity(), held = vmm_.physical_bytes();  // the backend's getters: calls
  const bool held_much = held > capacity / 2;
  if (!held_much && (opts_.piece_leftover_share == 0 || held <= capacity / leftover_held_share)) return;
  // Below half, only a piece of which more than 1/share of the capacity would stay free.
  const std::size_t most_left = held_much ? 0 : (capacity / opts_.piece_leftover_share) >> granule_shift_;
  for (const std::size_t g : {first, last}) {
    if (!in_block_sized_piece(g)) continue;
    const std::size_t from = granules_[g].piece_first, n = granules_[g].piece_granules;
    if (!held_much && n - (std::min(from + n, last + 1) - std::max(from, first)) <= most_left) continue;
    const auto piece_start = reinterpret_cast<std::uintptr_t>(granule_address(from));
    const auto piece_end = reinterpret_cast<std::uintptr_t>(granule_address(from + n));
    if ((piece_start >= start && piece_end <= start + rounded) || piece_in_use(g)) continue;
    unlist_free_piece(g);
    (void)unmap_piece(g);
  }
}

template <virtual_memory Vmm>
inline std::pair<std::size_t, std::size_t> virtual_arena<Vmm>::whole_run_span(std::size_t first, std::size_t last,
                                                                              std::uintptr_t start,
                                                                              std::size_t rounded) const noexcept {
  if (!opts_.block_sized_pieces || last == first) return {0, 0};
  if (edges_join_run(last + 1 - first)) return {first, last + 1};
  const std::uintptr_t in_granule = opts_.granularity - 1;
  return {(start & in_granule) != 0 ? first + 1 : first, ((start + rounded) & in_granule) != 0 ? last : last + 1};
}

template <virtual_memory Vmm>
inline auto virtual_arena<Vmm>::map_whole_run(std::size_t g, std::size_t n) noexcept -> map_result {
  const physical_memory piece = vmm_.create(n << granule_shift_);
  if (!piece) return map_result::no_memory;
  ++counters_.num_device_alloc;
  if (!vmm_.map(granule_address(g), piece)) {
    vmm_.release(piece);
    ++counters_.num_device_free;
    return map_result::map_failed;
  }
  ++counters_.num_maps;
  set_piece_run(g, n, piece.id, true);
  return map_result::mapped;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::unmap_piece(std::size_t g) noexcept {
  const std::size_t first = granules_[g].piece_first, n = granules_[g].piece_granules;
  vmm_.unmap(granule_address(first), n << granule_shift_);
  vmm_.release(physical_memory{granules_[first].piece, n << granule_shift_});
  clear_piece_run(first, n);
  ++counters_.num_unmaps;
  ++counters_.num_device_free;
  return n;
}

}  // namespace alloy
