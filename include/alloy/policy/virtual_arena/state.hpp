// SPDX-License-Identifier: Apache-2.0
// alloy/policy/virtual_arena/state.hpp: walks over `virtual_arena`'s chunks and granules
// (`for_each_block`, `check_invariants`), and handing its whole state over (move) or back
// (destruction).
// Member definitions only: the class, with every declaration and its contract, is in
// alloy/policy/virtual_arena.hpp, which includes this file.
#pragma once

#include <alloy/policy/virtual_arena.hpp>

namespace alloy {

template <virtual_memory Vmm>
template <class F>
inline void virtual_arena<Vmm>::for_each_block(F&& visit) const {
  const std::uintptr_t used_end = base_ + used_address_space();
  for_each_piece([&](std::uintptr_t at, std::size_t size, std::size_t requested, block_state state) {
    if (at >= used_end) return;
    visit(block_info{.segment = reinterpret_cast<const void*>(base_),
                     .segment_size = used_end - base_,
                     .ptr = reinterpret_cast<const void*>(at),
                     .size = std::min<std::size_t>(size, used_end - at),
                     .requested = requested,
                     .state = state});
  });
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::largest_free_block() const noexcept {
  std::size_t largest = 0;
  for_each_piece([&](std::uintptr_t, std::size_t size, std::size_t, block_state state) {
    if (state == block_state::free) largest = std::max(largest, size);
  });
  return largest;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::check_invariants() const noexcept {
  if (ranges_.empty()) return head_ == none && mapped_ == 0 && map_.size() == 0;
  std::vector<std::uint32_t> users, ends;
  try {
    users.assign(granules_.size(), 0);
    ends.assign(granules_.size(), 0);
  } catch (const std::bad_alloc&) {
    return false;
  }
  std::size_t in_use = 0, requested = 0, free_chunks = 0, allocated = 0, offloaded_chunks = 0;
  std::uintptr_t at = base_;
  std::uint32_t before = none;
  std::uint32_t last = none;
  for (std::uint32_t c = head_; c != none; c = pool_[c].next()) {
    const detail::best_fit_chunk& node = pool_[c];
    if (node.addr != at || node.prev() != before || node.size() == 0) return false;
    if ((node.size() & (opts_.rounding - 1)) != 0) return false;
    if (node.prev_free() != (before != none && pool_[before].free())) return false;
    if (node.next_free() != (node.next() != none && pool_[node.next()].free())) return false;
    if (node.free()) {
      if (before != none && pool_[before].free()) return false;
      ++free_chunks;
    } else {
      if (map_.find(pool_, node.addr) != c) return false;
      const bool pending = pending_plans_ != 0 && pending_chunk(node.addr);
      if (!pending) {
        in_use += node.size();
        requested += node.requested();
      }
      ++allocated;
      const std::size_t g1 = granule_of(node.addr + node.size() - 1);
      if (g1 >= granules_.size()) return false;
      const std::uint16_t owner = granules_[granule_of(node.addr)].tag;
      for (std::size_t g = granule_of(node.addr); g <= g1; ++g) {
        ++users[g];
        if (granules_[g].tag != owner) return false;  // chunks of different tags never share a granule
      }
      ++ends[granule_of(node.addr)];
      ++ends[g1];  // the first granule twice for a chunk on one (`add_user`)
      if (!pending && granules_[granule_of(node.addr)].piece == 0) offloaded_chunks += node.size();
    }
    at += node.size();
    before = c;
    last = c;
  }
  if (at != end_ || last != tail_) return false;
  if (in_use != in_use_ || requested != requested_) return false;
  std::size_t offloaded = 0;
  for (const tag_record& rec : tags_) offloaded += rec.state == tag_state::resident ? 0 : rec.in_use;
  if (offloaded != offloaded_in_use_ || offloaded != offloaded_chunks) return false;
  if (free_chunks != index_.size() || allocated != map_.size()) return false;
  if (pool_.live() != free_chunks + allocated) return false;
  std::size_t mapped = 0, unused_mapped = 0, pending = 0, planned = 0, active = 0, releasing = 0;
  for (const auto& m : plans_) {
    if (!m->active) continue;
    ++active;
    for (const auto& run : m->runs) planned += run.granules;
  }
  if (active != pending_plans_) return false;
  if (touched_bits_.size() != granules_.size() || mapped_bits_.size() != granules_.size()) return false;
  for (std::size_t g = 0; g < granules_.size(); ++g) {
    const granule& r = granules_[g];
    const bool live = users[g] != 0;
    if (chunk_ends_[g] != ends[g] || touched(g) != live || mapped_bits_.test(g) != (r.piece != 0) || r.fresh)
      return false;
    if (r.piece != 0) {
      ++mapped;
      const std::size_t first = r.piece_first, n = r.piece_granules;
      if (n == 0 || first > g || g - first >= n || first + n > granules_.size()) return false;
      if (n > 1 && !opts_.block_sized_pieces) return false;
      if (g == first) {
        // The piece's granules all name it, and the chunks on it have one tag (offloading a
        // tag unmaps the piece whole).
        std::optional<std::uint16_t> owner;
        for (std::size_t i = first; i < first + n; ++i) {
          if (granules_[i].piece != r.piece || granules_[i].piece_first != first || granules_[i].piece_granules != n)
            return false;
          if (users[i] == 0) continue;
          if (owner && *owner != granules_[i].tag) return false;
          owner = granules_[i].tag;
        }
      }
    }
    if (r.pending && (!live || r.piece != 0 || ++pending > planned)) return false;
    if (r.releasing &&
        (live || r.piece != 0 || r.pending || !batch_.active || ++releasing > batch_.granules_releasing()))
      return false;
    if (live && r.piece == 0 && !r.pending && state(tag{r.tag}) == tag_state::resident) return false;
    if (live && r.piece != 0 && state(tag{r.tag}) != tag_state::resident) return false;
    if (!live && r.piece != 0) ++unused_mapped;
  }
  if (mapped != mapped_ || unused_mapped != free_mapped_ || pending != planned) return false;
  if (batch_.active && releasing != batch_.granules_releasing()) return false;
  if (!lists_free_granules()) return oldest_ == no_granule && newest_ == no_granule;
  std::size_t listed = 0;
  std::uint32_t previous = no_granule;
  for (std::uint32_t g = oldest_; g != no_granule; g = granules_[g].newer) {
    if (g >= granules_.size() || touched(g) || granules_[g].piece == 0) return false;
    if (granules_[g].older != previous || ++listed > free_mapped_) return false;
    previous = g;
  }
  return listed == free_mapped_ && previous == newest_;
}

template <virtual_memory Vmm>
template <class F>
inline void virtual_arena<Vmm>::for_each_piece(F&& visit) const {
  for (std::uint32_t c = head_; c != none; c = pool_[c].next()) {
    const detail::best_fit_chunk& node = pool_[c];
    if (!node.free() && pending_plans_ != 0 && pending_chunk(node.addr)) [[unlikely]] {
      visit(node.addr, node.size(), 0, block_state::unmapped);  // being mapped, not handed out yet
      continue;
    }
    if (!node.free()) {
      visit(node.addr, node.size(), node.requested(),
            granules_[granule_of(node.addr)].piece != 0 ? block_state::allocated : block_state::offloaded);
      continue;
    }
    const std::uintptr_t end = node.addr + node.size();
    for (std::uintptr_t at = node.addr; at < end;) {
      std::size_t g = granule_of(at);
      if (g >= granules_.size()) {
        visit(at, end - at, 0, block_state::unmapped);
        break;
      }
      const bool mapped = granules_[g].piece != 0;
      while (g < granules_.size() && (granules_[g].piece != 0) == mapped && base_ + (g << granule_shift_) < end) ++g;
      const std::uintptr_t run_end =
          g >= granules_.size() && !mapped ? end : std::min<std::uintptr_t>(end, base_ + (g << granule_shift_));
      visit(at, run_end - at, 0, mapped ? block_state::free : block_state::unmapped);
      at = run_end;
    }
  }
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::give_everything_back() noexcept {
  for (tag_record& rec : tags_) drop_host_copy(rec);
  for (std::size_t g = 0; g < granules_.size(); ++g)
    if (granules_[g].piece != 0) unmap_piece(g);
  for (const address_range& r : ranges_) vmm_.unreserve(r);
  forget();
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::forget() noexcept {
  ranges_.clear();
  granules_.clear();
  chunk_ends_.clear();
  mapped_bits_.clear();
  touched_bits_.clear();
  pool_.clear();
  map_.clear();
  index_ = detail::best_fit_free_index{};  // allocates nothing (a moved-from arena is only destroyed or assigned)
  base_ = end_ = reserved_end_ = 0;
  head_ = tail_ = none;
  oldest_ = newest_ = no_granule;
  mapped_ = free_mapped_ = peak_touched_ = in_use_ = requested_ = 0;
  tags_.clear();
  tags_in_use_ = false;
  offloaded_in_use_ = 0;
  last_of_tag_.clear();
  plans_.clear();
  pending_plans_ = 0;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::take_state(virtual_arena& other) noexcept {
  index_ = std::move(other.index_);
  pool_ = std::move(other.pool_);
  map_ = std::move(other.map_);
  ranges_ = std::move(other.ranges_);
  granules_ = std::move(other.granules_);
  chunk_ends_ = std::move(other.chunk_ends_);
  mapped_bits_ = std::move(other.mapped_bits_);
  touched_bits_ = std::move(other.touched_bits_);
  base_ = other.base_;
  end_ = other.end_;
  reserved_end_ = other.reserved_end_;
  head_ = other.head_;
  tail_ = other.tail_;
  oldest_ = other.oldest_;
  newest_ = other.newest_;
  mapped_ = other.mapped_;
  free_mapped_ = other.free_mapped_;
  peak_touched_ = other.peak_touched_;
  in_use_ = other.in_use_;
  requested_ = other.requested_;
  counters_ = other.counters_;
  misuses_ = other.misuses_;
  tags_ = std::move(other.tags_);
  tags_in_use_ = other.tags_in_use_;
  trim_due_ = other.trim_due_;
  last_of_tag_ = std::move(other.last_of_tag_);
  plans_ = std::move(other.plans_);  // a moved arena has no growth under way (it is not shared)
  pending_plans_ = other.pending_plans_;
  offloaded_in_use_ = other.offloaded_in_use_;
  current_tag_ = other.current_tag_;
  offload_stats_ = other.offload_stats_;
  copier_ = other.copier_;
  other.forget();
}

}  // namespace alloy
