// SPDX-License-Identifier: Apache-2.0
// alloy/policy/virtual_arena/tags.hpp: `virtual_arena`'s tags and pointer-stable offload: which
// granules a tag may share, offload, discard and restore, and the host copies.
// Member definitions only: the class, with every declaration and its contract, is in
// alloy/policy/virtual_arena.hpp, which includes this file.
#pragma once

#include <alloy/policy/virtual_arena.hpp>

namespace alloy {

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::mapped_bytes(tag t) const noexcept {
  std::size_t n = 0;
  for (std::size_t g = 0; g < granules_.size(); ++g) {  // the pieces `unmap_tag` takes, each once
    const granule& r = granules_[g];
    if (!touched(g) || r.tag != t.value || r.piece == 0) continue;
    n += r.piece_granules;
    g = r.piece_first + r.piece_granules - 1;
  }
  return n << granule_shift_;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::live_bytes(tag t) const noexcept {
  std::size_t n = 0;
  for (std::uint32_t c = head_; c != none; c = pool_[c].next())
    if (!pool_[c].free() && granules_[granule_of(pool_[c].addr)].tag == t.value) n += pool_[c].requested();
  return n;
}

template <virtual_memory Vmm>
inline offload_status virtual_arena<Vmm>::offload_all() noexcept {
  std::vector<std::uint16_t> seen;
  try {
    for (std::uint32_t c = head_; c != none; c = pool_[c].next()) {
      if (pool_[c].free()) continue;
      const std::uint16_t t = granules_[granule_of(pool_[c].addr)].tag;
      if (state(tag{t}) == tag_state::resident && std::find(seen.begin(), seen.end(), t) == seen.end())
        seen.push_back(t);
    }
  } catch (const std::bad_alloc&) {
    return offload_status::host_out_of_memory;
  }
  for (const std::uint16_t t : seen) {
    const offload_status s = offload_impl(t, true, false);
    if (s != offload_status::done) return s;
  }
  if (!seen.empty()) ++offload_stats_.num_full_reclaims;
  return offload_status::done;
}

template <virtual_memory Vmm>
inline offload_status virtual_arena<Vmm>::restore(tag t) noexcept {
  if (state(t) == tag_state::resident) return offload_status::already_resident;
  trim_due_ = true;  // granules touched again: the rule may keep fewer free ones
  tag_record& rec = tags_[t.value];
  std::size_t to_map = 0;
  for (std::size_t g = 0; g < granules_.size(); ++g)
    to_map += touched(g) && granules_[g].tag == t.value && granules_[g].piece == 0 && !granules_[g].pending;
  if (to_map > headroom_granules()) return offload_status::device_out_of_memory;
  // Each live chunk's granules in the pieces `allocate` makes (with block-sized pieces a run
  // per chunk, not a piece per granule), free pieces released when the capacity needs it.
  bool retried = true;  // a restore is no allocation: not counted in `num_alloc_retries`
  for (std::uint32_t c = head_; c != none; c = pool_[c].next()) {
    const detail::best_fit_chunk& node = pool_[c];
    const std::size_t first = granule_of(node.addr);
    if (node.free() || granules_[first].tag != t.value) continue;
    const map_result mapped = map_chunk_granules(first, granule_of(node.addr + node.size() - 1), node.addr, node.size(),
                                                 true, to_map, retried);
    if (mapped != map_result::mapped) {
      unmap_tag(t.value);
      return mapped == map_result::no_memory ? offload_status::device_out_of_memory : offload_status::map_failed;
    }
  }
  for (const saved_chunk& s : rec.chunks) {
    if (!s.live || s.bytes == 0) continue;
    if (!copier_.template copy<Vmm::host_accessible, true>(reinterpret_cast<void*>(s.addr), rec.host + s.offset,
                                                           s.bytes)) {
      unmap_tag(t.value);
      return offload_status::copy_failed;
    }
    offload_stats_.bytes_copied_back += s.bytes;
  }
  drop_host_copy(rec);
  offloaded_in_use_ -= rec.in_use;
  rec.in_use = 0;
  rec.state = tag_state::resident;
  ++offload_stats_.num_restores;
  return offload_status::done;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::foreign(std::size_t g, std::uint16_t t) const noexcept {
  if (g >= granules_.size()) return false;
  if (touched(g)) return granules_[g].tag != t;
  if (!in_block_sized_piece(g)) return false;
  bool other = false;
  const granule& r = granules_[g];
  detail::for_each_bit_descending(
      r.piece_first, r.piece_first + r.piece_granules, [this](std::size_t w) { return touched_bits_.word(w); },
      [&](std::size_t user) {
        other = granules_[user].tag != t;
        return false;  // the piece's chunks have one tag: the first found names it
      });
  return other;
}

template <virtual_memory Vmm>
inline std::pair<std::uint32_t, std::uintptr_t> virtual_arena<Vmm>::beside_own_tag(std::uint16_t t, std::size_t rounded,
                                                                                   std::size_t alignment) noexcept {
  const std::pair<std::uint32_t, std::uintptr_t> none_found{detail::best_fit_npos, 0};
  if (t >= last_of_tag_.size()) {
    try {
      last_of_tag_.resize(std::size_t{t} + 1, 0);
    } catch (const std::bad_alloc&) {}
    return none_found;
  }
  const std::uintptr_t hint = last_of_tag_[t];
  if (hint == 0) return none_found;
  const std::uint32_t c = map_.find(pool_, hint);
  if (c == detail::best_fit_npos || granules_[granule_of(hint)].tag != t) return none_found;
  const std::uint32_t n = pool_[c].next();
  if (n == none || !pool_[n].free()) return none_found;
  const std::uintptr_t start = (pool_[n].addr + (alignment - 1)) & ~static_cast<std::uintptr_t>(alignment - 1);
  if (start - pool_[n].addr > pool_[n].size() || pool_[n].size() - (start - pool_[n].addr) < rounded) return none_found;
  if (foreign(granule_of(start), t) || foreign(granule_of(start + rounded - 1), t)) return none_found;
  return {n, start};
}

template <virtual_memory Vmm>
inline std::uint32_t virtual_arena<Vmm>::find_isolated(std::size_t rounded, std::size_t alignment) noexcept {
  const std::size_t step = std::max(alignment, opts_.granularity);
  const std::size_t span = detail::round_up(rounded, opts_.granularity);
  if (span == 0 || span > std::numeric_limits<std::size_t>::max() - step) return detail::best_fit_npos;
  const std::size_t need = span + step - opts_.rounding;
  std::uint32_t c = index_.best_fit(pool_, need);
  if (c == detail::best_fit_npos) c = grow_for(need, need, opts_.rounding);
  return c;
}

template <virtual_memory Vmm>
inline offload_status virtual_arena<Vmm>::offload_impl(std::uint16_t t, bool copy, bool single) noexcept {
  if (t >= tags_.size()) {
    try {
      tags_.resize(std::size_t{t} + 1);
    } catch (const std::bad_alloc&) {
      return offload_status::host_out_of_memory;
    }
  }
  tag_record& rec = tags_[t];
  if (rec.state != tag_state::resident) return offload_status::not_resident;
  std::vector<saved_chunk> chunks;
  std::size_t total = 0, rounded = 0;
  try {
    for (std::uint32_t c = head_; c != none; c = pool_[c].next()) {
      const detail::best_fit_chunk& node = pool_[c];
      if (node.free() || granules_[granule_of(node.addr)].tag != t) continue;
      if (pending_plans_ != 0 && pending_chunk(node.addr)) continue;  // not handed out: its commit sees the tag gone
      rounded += node.size();
      if (!copy) continue;
      chunks.push_back(saved_chunk{node.addr, node.requested(), total, true});
      total += node.requested();
    }
  } catch (const std::bad_alloc&) {
    return offload_status::host_out_of_memory;
  }
  std::byte* host = nullptr;
  if (total != 0) {
    host = static_cast<std::byte*>(host_allocate(total));
    if (host == nullptr) return offload_status::host_out_of_memory;
    for (const saved_chunk& s : chunks) {
      if (s.bytes == 0) continue;
      if (!copier_.template copy<true, Vmm::host_accessible>(host + s.offset, reinterpret_cast<const void*>(s.addr),
                                                             s.bytes)) {
        host_deallocate(host, total);
        return offload_status::copy_failed;
      }
    }
    offload_stats_.bytes_copied_to_host += total;
  }
  note_touched_peak();
  const std::size_t unmapped = unmap_tag(t);
  trim_due_ = true;  // fewer granules touched: the rule may keep fewer free ones
  rec.state = copy ? tag_state::offloaded : tag_state::discarded;
  rec.host = host;
  rec.host_bytes = total;
  rec.chunks = std::move(chunks);
  rec.in_use = rounded;
  offloaded_in_use_ += rounded;
  offload_stats_.bytes_on_host += total;
  offload_stats_.bytes_reclaimed += unmapped << granule_shift_;
  ++(copy ? offload_stats_.num_offloads : offload_stats_.num_discards);
  if (single) ++offload_stats_.num_single_reclaims;
  return offload_status::done;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::unmap_tag(std::uint16_t t) noexcept {
  std::size_t n = 0;
  for (std::size_t g = 0; g < granules_.size(); ++g) {
    const granule& r = granules_[g];
    if (!touched(g) || r.tag != t || r.piece == 0) continue;
    // The chunks on a block-sized piece have one tag (`foreign`); its free granules go with it.
    for (std::size_t i = r.piece_first; i < r.piece_first + r.piece_granules; ++i)
      if (!touched(i)) unlist(i);
    n += unmap_piece(g);
  }
  return n;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::forget_saved(std::uint16_t t, std::uintptr_t addr, std::size_t size) noexcept {
  if (t >= tags_.size()) return;
  tags_[t].in_use -= size;
  offloaded_in_use_ -= size;
  std::vector<saved_chunk>& v = tags_[t].chunks;
  const auto it =
      std::lower_bound(v.begin(), v.end(), addr, [](const saved_chunk& s, std::uintptr_t a) { return s.addr < a; });
  if (it != v.end() && it->addr == addr) it->live = false;
}

template <virtual_memory Vmm>
inline void* virtual_arena<Vmm>::host_allocate(std::size_t bytes) noexcept {
  if (opts_.host_allocate != nullptr) return opts_.host_allocate(bytes, opts_.host_context);
  if constexpr (!Vmm::host_accessible) {
#if ALLOY_HAS_CUDA
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return p;
#endif
  }
  return ::operator new(bytes, std::nothrow);
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::host_deallocate(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (opts_.host_deallocate != nullptr) return opts_.host_deallocate(p, bytes, opts_.host_context);
  if constexpr (!Vmm::host_accessible) {
#if ALLOY_HAS_CUDA
    (void)cudaFreeHost(p);
    return;
#endif
  }
  ::operator delete(p);
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::drop_host_copy(tag_record& rec) noexcept {
  host_deallocate(rec.host, rec.host_bytes);
  offload_stats_.bytes_on_host -= rec.host_bytes;
  rec.host = nullptr;
  rec.host_bytes = 0;
  rec.chunks.clear();
}

}  // namespace alloy
