// SPDX-License-Identifier: Apache-2.0
// alloy/policy/virtual_arena/placement.hpp: `virtual_arena`'s chunks and where a block goes: best
// fit over the free chunks, the place inside the chosen chunk that adds the fewest granules, growth
// of the address range, carving and merging chunks, and the checked free.
// Member definitions only: the class, with every declaration and its contract, is in
// alloy/policy/virtual_arena.hpp, which includes this file.
#pragma once

#include <alloy/policy/virtual_arena.hpp>

namespace alloy {

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::granules_added(std::size_t bytes, std::size_t alignment) const noexcept {
  const std::size_t rounded = detail::round_up(bytes == 0 ? 1 : bytes, opts_.rounding);
  if (rounded == 0 || !detail::is_power_of_two(alignment)) return 0;  // allocate refuses it
  const std::size_t all = (rounded >> granule_shift_) + ((rounded & (opts_.granularity - 1)) != 0);
  if (ranges_.empty() || (alignment > opts_.rounding && rounded > std::numeric_limits<std::size_t>::max() - alignment))
    return all;
  const std::size_t need = alignment > opts_.rounding ? rounded + alignment - opts_.rounding : rounded;
  const std::uint32_t c = find_fit(rounded, need, alignment);
  if (c == detail::best_fit_npos) return all;  // new addresses hold no live chunk
  return cost_at(place_in(c, rounded, alignment), rounded).untouched;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::try_deallocate(block b) noexcept {
  if (b.ptr == nullptr) return true;
  const auto addr = reinterpret_cast<std::uintptr_t>(b.ptr);
  std::uint32_t c = map_.take(pool_, addr);
  if (c == detail::best_fit_npos) [[unlikely]] {
    report(classify_unknown(addr), b);
    return false;
  }
  if (pool_[c].requested() != b.size || (pending_plans_ != 0 && pending_chunk(addr))) [[unlikely]] {
    map_.insert(addr, c);  // it stays allocated (the entry just freed makes room)
    report(pool_[c].requested() != b.size ? misuse::wrong_size : misuse::foreign_pointer,
           b);  // pending: not handed out
    return false;
  }
  if (offloaded_in_use_ != 0 && granules_[granule_of(addr)].piece == 0) [[unlikely]]
    forget_saved(granules_[granule_of(addr)].tag, addr, pool_[c].size());  // an offloaded tag's
  free_chunk(c, addr);
  return true;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::free_chunk(std::uint32_t c, std::uintptr_t addr) noexcept {
  const detail::best_fit_chunk& node = pool_[c];
  in_use_ -= node.size();
  requested_ -= node.requested();
  merge_free(c, addr);
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::merge_free(std::uint32_t c, std::uintptr_t addr) noexcept {
  note_touched_peak();  // a peak of the granules touched ends with a free
  detail::best_fit_chunk& node = pool_[c];
  const std::size_t size = node.size();
  node.set_free(size);
  if (node.next_free()) {
    index_.erase(pool_, node.next());
    absorb_next(c);
  }
  if (pool_[c].prev_free()) {
    const std::uint32_t p = pool_[c].prev();
    index_.erase(pool_, p);
    absorb_next(p);
    c = p;
  }
  const detail::best_fit_chunk& merged = pool_[c];
  pool_[merged.prev()].set_next(c, true);
  pool_[merged.next()].set_prev(c, true);
  index_.insert(pool_, c);
  // The chunk's granules lose one user; those left with none are free mapped, then trimmed.
  const std::size_t freed = drop_user(granule_of(addr), granule_of(addr + size - 1));
  // With no granule freed, what is kept can only have grown (the peak may have), so there is
  // nothing to trim unless a call that skips the trim left too many (`trim_due_`).
  if ((freed != 0 || trim_due_) && lists_free_granules()) trim(kept_free_bytes());
}

template <virtual_memory Vmm>
inline auto virtual_arena<Vmm>::normalised(options o, const Vmm& vmm) noexcept -> options {
  if (o.rounding == 0) o.rounding = 1;
  o.rounding = detail::power_of_two_at_least(o.rounding);
  const std::size_t backend = std::max<std::size_t>(vmm.granularity(), 1);
  std::size_t g = o.granularity == 0 ? backend : o.granularity;
  g = detail::power_of_two_at_least(std::max(g, backend));
  if (g % backend != 0) g = backend;  // a backend granularity that is no power of two: use it
  o.granularity = g;
  if (o.rounding > g) o.rounding = g;
  if (o.release_threshold != keep_all) o.block_sized_pieces = false;  // the release rule goes granule by granule
  if (!o.block_sized_pieces) o.frontier_growth_divisor = 0;
  if (o.address_space == 0) {
    constexpr std::size_t lowest = std::size_t{1} << 30, highest = std::size_t{1} << 40;
    const std::size_t capacity = vmm.capacity();
    o.address_space = capacity > highest / 4 ? highest : std::max(lowest, capacity * 4);
  }
  if (o.address_space / g > max_granules) o.address_space = max_granules * g;
  o.address_space = std::max(detail::round_up(o.address_space, g), g);
  if (o.address_space == 0) o.address_space = max_granules * g;  // rounding overflowed
  return o;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::reserve_initial() noexcept {
  try {
    pool_.reserve(4);
    detail::reserve_room(ranges_, 4);
  } catch (const std::bad_alloc&) {
    return;
  }
  // A granularity coarser than the backend's: reserve one granule more and start on a multiple.
  const std::size_t slack = opts_.granularity - std::min(opts_.granularity, vmm_.granularity());
  address_range r = vmm_.reserve(opts_.address_space + slack);
  if (!r && opts_.address_space / 8 >= opts_.granularity) {
    // The system would not give that many addresses (a limited address space, a GPU driver's
    // own limit): an eighth, which still grows in place when it can.
    r = vmm_.reserve(detail::round_up(opts_.address_space / 8, opts_.granularity) + slack);
  }
  if (!r) return;
  const auto raw = reinterpret_cast<std::uintptr_t>(r.ptr);
  const std::uintptr_t aligned = detail::round_up(raw, opts_.granularity);
  if (aligned == 0 || aligned - raw >= r.size || r.size - (aligned - raw) < opts_.granularity) {
    vmm_.unreserve(r);
    return;
  }
  ranges_.push_back(r);
  base_ = aligned;
  reserved_end_ = raw + r.size;
  const std::size_t usable = (reserved_end_ - base_) & ~(opts_.granularity - 1);
  end_ = base_ + usable;
  reserve_granule_table(std::min(usable >> granule_shift_, initial_granule_table));
  const std::uint32_t c = pool_.take();
  detail::best_fit_chunk& node = pool_[c];
  node.addr = base_;
  node.set_prev(none, false);
  node.set_next(none, false);
  node.set_free(usable);
  head_ = tail_ = c;
  index_.insert(pool_, c);
}

template <virtual_memory Vmm>
inline block virtual_arena<Vmm>::allocate_impl(std::size_t bytes, std::size_t alignment, bool may_release,
                                               std::uint16_t t, growth_plan* plan, bool only_held,
                                               bool cached_only) noexcept {
  if (!detail::is_power_of_two(alignment)) return {};
  if (cached_only && (t != 0 || tags_in_use_ || ranges_.empty())) return {};
  if (t < tags_.size() && tags_[t].state != tag_state::resident) [[unlikely]] {
    ++offload_stats_.num_refused_allocations;
    return {};
  }
  if (t != 0) tags_in_use_ = true;
  const std::size_t rounded = detail::round_up(bytes == 0 ? 1 : bytes, opts_.rounding);
  if (rounded == 0) return {};
  std::size_t need = rounded;
  if (alignment > opts_.rounding) {
    if (rounded > std::numeric_limits<std::size_t>::max() - alignment) return {};
    need = rounded + alignment - opts_.rounding;
  }
  if (ranges_.empty()) reserve_initial();
  if (ranges_.empty() || !reserve_metadata()) [[unlikely]] {
    if (plan == nullptr && !cached_only) ++counters_.num_ooms;
    return {};
  }
  std::uint32_t c = find_fit(rounded, need, alignment);
  if (c == detail::best_fit_npos) {
    if (only_held || cached_only) return {};  // new addresses hold no live chunk, nor mapped granules
    c = grow_for(rounded, need, alignment);
  }
  if (c == detail::best_fit_npos) {
    if (plan == nullptr && !cached_only) ++counters_.num_ooms;
    return {};
  }
  std::uintptr_t start = place_in(c, rounded, alignment);
  if (only_held && cost_at(start, rounded).untouched != 0) return {};
  if (tags_in_use_) [[unlikely]] {
    if (foreign(granule_of(start), t) || foreign(granule_of(start + rounded - 1), t)) {
      std::tie(c, start) = beside_own_tag(t, rounded, alignment);
      if (c == detail::best_fit_npos) {
        c = find_isolated(rounded, alignment);
        if (c == detail::best_fit_npos) {
          ++counters_.num_ooms;
          return {};
        }
        const std::size_t step = std::max(alignment, opts_.granularity);
        start = (pool_[c].addr + (step - 1)) & ~static_cast<std::uintptr_t>(step - 1);
        // Whole free granules of a block-sized piece part in use: every free chunk is tried.
        if (foreign(granule_of(start), t) || foreign(granule_of(start + rounded - 1), t)) [[unlikely]] {
          const block b = allocate_on_fewest_new_granules(rounded, bytes, alignment, t, may_release, 0);
          if (!b && may_release) ++counters_.num_ooms;
          if (b && t < last_of_tag_.size()) last_of_tag_[t] = reinterpret_cast<std::uintptr_t>(b.ptr);
          return b;
        }
      }
    }
    if (t < last_of_tag_.size()) last_of_tag_[t] = start;  // where the next block of the tag looks first
  }
  if (pending_plans_ != 0) [[unlikely]] {
    // Another thread's growth maps a granule this block would share: whole free granules instead.
    if (pending_granule(granule_of(start)) || pending_granule(granule_of(start + rounded - 1))) {
      c = find_isolated(rounded, alignment);
      if (c == detail::best_fit_npos) {
        if (plan == nullptr && !cached_only) ++counters_.num_ooms;
        return {};
      }
      const std::size_t step = std::max(alignment, opts_.granularity);
      start = (pool_[c].addr + (step - 1)) & ~static_cast<std::uintptr_t>(step - 1);
    }
  }
  const std::size_t first = granule_of(start), last = granule_of(start + rounded - 1);
  if (batch_.active) [[unlikely]]
    wait_if_releasing(first, last);
  if (cached_only && (last >= granules_.size() || count_unmapped(start, rounded) != 0)) [[unlikely]]
    return allocate_on_mapped_granules(rounded, bytes, alignment);
  if (!cover_granules(last + 1)) [[unlikely]] {
    if (plan == nullptr && may_release) ++counters_.num_ooms;
    return {};
  }
  if (opts_.block_sized_pieces && !cached_only) release_pieces_partly_reused(start, rounded);
  if (const std::size_t to_map = add_user(first, last, t); to_map != 0) {
    if (plan != nullptr) return plan_mapping(*plan, c, start, rounded, bytes, first, last, to_map);
    if (!map_new_granules(first, last, may_release, to_map, start, rounded)) {
      if (const block b = allocate_on_fewest_new_granules(rounded, bytes, alignment, t, may_release, start); b.ptr)
        return b;
      if (may_release) ++counters_.num_ooms;
      return {};
    }
  }
  return carve(c, start, rounded, bytes);
}

template <virtual_memory Vmm>
block virtual_arena<Vmm>::allocate_on_fewest_new_granules(std::size_t rounded, std::size_t bytes, std::size_t alignment,
                                                          std::uint16_t t, bool may_release,
                                                          std::uintptr_t tried) noexcept {
  const std::uintptr_t fine = std::max(alignment, opts_.rounding) - 1;
  const std::uintptr_t coarse = std::max(alignment, opts_.granularity) - 1;
  std::uint32_t best_chunk = detail::best_fit_npos;
  std::uintptr_t best = 0;
  placement_cost best_cost{not_counted, not_counted, not_counted};
  for (std::uint32_t c = head_; c != none; c = pool_[c].next()) {
    const detail::best_fit_chunk& node = pool_[c];
    if (!node.free() || node.size() < rounded) continue;
    const std::uintptr_t last_start = node.addr + (node.size() - rounded);
    const auto consider = [&](std::uintptr_t start) {
      if (start < node.addr || start > last_start) return;
      const std::size_t first = granule_of(start), last = granule_of(start + rounded - 1);
      if (tags_in_use_ && (foreign(first, t) || foreign(last, t))) return;
      if (pending_plans_ != 0 && (pending_granule(first) || pending_granule(last))) return;
      const placement_cost cost = cost_at(start, rounded);
      if (cost < best_cost) {
        best_chunk = c;
        best = start;
        best_cost = cost;
      }
    };
    consider((node.addr + fine) & ~fine);
    consider((node.addr + coarse) & ~coarse);
    if (tags_in_use_) consider(past_foreign_pieces(node, t, coarse));
    consider(last_start & ~fine);
    consider(last_start & ~coarse);
  }
  if (best_chunk == detail::best_fit_npos || best == tried || best_cost.untouched > headroom_granules()) return {};
  const std::size_t first = granule_of(best), last = granule_of(best + rounded - 1);
  if (batch_.active) wait_if_releasing(first, last);
  if (!cover_granules(last + 1)) return {};
  if (opts_.block_sized_pieces) release_pieces_partly_reused(best, rounded);
  if (const std::size_t to_map = add_user(first, last, t); to_map != 0)
    if (!map_new_granules(first, last, may_release, to_map, best, rounded)) return {};
  ++counters_.num_alloc_retries;
  return carve(best_chunk, best, rounded, bytes);
}

template <virtual_memory Vmm>
std::uintptr_t virtual_arena<Vmm>::past_foreign_pieces(const detail::best_fit_chunk& node, std::uint16_t t,
                                                       std::uintptr_t coarse) const noexcept {
  std::uintptr_t start = (node.addr + coarse) & ~coarse;
  for (std::size_t g = granule_of(start); start < node.addr + node.size() && foreign(g, t); g = granule_of(start)) {
    if (touched(g) || !in_block_sized_piece(g)) return 0;  // a live chunk of another tag: no piece to pass
    const granule& r = granules_[g];
    start = (base_ + (std::uintptr_t{r.piece_first + r.piece_granules} << granule_shift_) + coarse) & ~coarse;
  }
  return start;
}

template <virtual_memory Vmm>
block virtual_arena<Vmm>::allocate_on_mapped_granules(std::size_t rounded, std::size_t bytes,
                                                      std::size_t alignment) noexcept {
  const std::uintptr_t fine = std::max(alignment, opts_.rounding) - 1;
  for (std::uint32_t c = head_; c != none; c = pool_[c].next()) {
    const detail::best_fit_chunk& node = pool_[c];
    if (!node.free() || node.size() < rounded) continue;
    const std::uintptr_t last_start = node.addr + (node.size() - rounded);
    const auto take = [&](std::uintptr_t start) {
      (void)add_user(granule_of(start), granule_of(start + rounded - 1), 0);  // nothing to map
      return carve(c, start, rounded, bytes);
    };
    for (const std::uintptr_t start : {(node.addr + fine) & ~fine, last_start & ~fine}) {
      if (start < node.addr || start > last_start) continue;
      if (granule_of(start + rounded - 1) >= granules_.size() || count_unmapped(start, rounded) != 0)
        continue;  // pending granules count as unmapped too
      return take(start);
    }
    // Inside the chunk: the first run of whole mapped granules long enough (a block of a free
    // chunk's middle, which best fit never picks).
    if (alignment > opts_.granularity) continue;
    const std::size_t wanted = (rounded + opts_.granularity - 1) / opts_.granularity;
    std::size_t g = granule_of(node.addr);
    if (granule_address(g) < reinterpret_cast<void*>(node.addr)) ++g;
    const std::size_t end = std::min(granule_of(node.addr + node.size()), granules_.size());
    for (std::size_t run = 0; g < end; ++g) {
      run = granules_[g].piece != 0 ? run + 1 : 0;
      if (run == wanted) return take(reinterpret_cast<std::uintptr_t>(granule_address(g + 1 - wanted)));
    }
  }
  return {};
}

template <virtual_memory Vmm>
inline auto virtual_arena<Vmm>::cost_at(std::uintptr_t start, std::size_t rounded) const noexcept -> placement_cost {
  const std::size_t first = granule_of(start), last = granule_of(start + rounded - 1);
  // Granules spanned count for blocks of whole granules and for blocks of 3/4 of a granule up to
  // one: such a block leaves a quarter of a granule or less beside it, so packing it end to end
  // gains little, while one straddling a boundary holds two granules once its neighbours go.
  // Smaller blocks packed end to end fill granules better than moved to a boundary.
  const bool span_counts = (rounded & (opts_.granularity - 1)) == 0 ||
                           (rounded < opts_.granularity && rounded >= opts_.granularity - opts_.granularity / 4);
  placement_cost cost{0, span_counts ? last - first + 1 : 0, not_counted};
  const auto untouched = [&](std::size_t g) { return std::size_t{g >= granules_.size() || !touched(g)}; };
  cost.untouched = untouched(first) + (last > first ? untouched(last) + (last - first - 1) : 0);
  return cost;
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::count_unmapped(std::uintptr_t start, std::size_t rounded) const noexcept {
  const std::size_t first = granule_of(start), last = granule_of(start + rounded - 1);
  const std::size_t known = std::min(last + 1, granules_.size());
  std::size_t n = last + 1 > known ? last + 1 - std::max(first, known) : 0;
  if (mapped_ == granules_.size()) return n;  // every granule of the table is mapped
  n += detail::count_bits(first, known, [this](std::size_t w) { return ~mapped_bits_.word(w); });
  return n;
}

template <virtual_memory Vmm>
inline std::uintptr_t virtual_arena<Vmm>::placement_in(std::uint32_t c, std::uintptr_t front, std::size_t rounded,
                                                       std::size_t alignment) const noexcept {
  const std::size_t first = granule_of(front), last = granule_of(front + rounded - 1);
  if (last < granules_.size() && touched(first) && touched(last) && last - first <= 1) [[likely]]
    return front;  // within granules live chunks touch: nothing to gain
  // A block over a granule has one other candidate, the front moved to a granule boundary: when
  // that is the front itself or does not fit the chunk, the comparison has nothing to compare
  // (the same answer without it, sooner).
  if (rounded > opts_.granularity) {
    const std::uintptr_t moved = up_to_granule(front, alignment);
    if (moved == front || moved + rounded > pool_[c].addr + pool_[c].size()) return front;
  }
  return placement_among(c, front, rounded, alignment);
}

template <virtual_memory Vmm>
inline std::uintptr_t virtual_arena<Vmm>::place_in(std::uint32_t c, std::size_t rounded,
                                                   std::size_t alignment) const noexcept {
  std::uintptr_t start = pool_[c].addr;
  if (alignment > opts_.rounding) start = (start + (alignment - 1)) & ~static_cast<std::uintptr_t>(alignment - 1);
  return pool_[c].size() != rounded ? placement_in(c, start, rounded, alignment) : start;
}

template <virtual_memory Vmm>
std::uintptr_t virtual_arena<Vmm>::placement_among(std::uint32_t c, std::uintptr_t front, std::size_t rounded,
                                                   std::size_t alignment) const noexcept {
  placement_cost at_front = cost_at(front, rounded);
  if (at_front.untouched == 0) {
    at_front.unmapped = count_unmapped(front, rounded);
    if (at_front.unmapped == 0) return front;
  }
  const std::uintptr_t chunk_end = pool_[c].addr + pool_[c].size();
  const std::uintptr_t on_granule = std::max(alignment, opts_.granularity) - 1;
  std::uintptr_t best = front;
  placement_cost best_cost = at_front;
  // Inlined: a call per candidate costs more than the comparison itself.
  const auto consider = [&](std::uintptr_t start) __attribute__((always_inline)) {
    if (start < pool_[c].addr || start > chunk_end - rounded || start == best) return;
    placement_cost cost = cost_at(start, rounded);
    if (std::tie(cost.untouched, cost.spanned) == std::tie(best_cost.untouched, best_cost.spanned)) {
      if (best_cost.unmapped == not_counted) best_cost.unmapped = count_unmapped(best, rounded);
      cost.unmapped = count_unmapped(start, rounded);
    }
    if (cost < best_cost) {
      best = start;
      best_cost = cost;
    }
  };
  const std::uintptr_t front_on_granule = up_to_granule(front, alignment);
  if (front_on_granule >= front) consider(front_on_granule);
  if (c != tail_ && rounded <= opts_.granularity) {
    const std::uintptr_t back =
        (chunk_end - rounded) & ~static_cast<std::uintptr_t>(std::max(alignment, opts_.rounding) - 1);
    consider(back);
    consider(back & ~on_granule);
  }
  return best;
}

template <virtual_memory Vmm>
inline std::uint32_t virtual_arena<Vmm>::find_fit(std::size_t rounded, std::size_t need,
                                                  std::size_t alignment) const noexcept {
  std::uint32_t c = index_.best_fit(pool_, rounded);
  if (c == detail::best_fit_npos) return c;
  if (alignment > opts_.rounding && !fits_aligned(c, rounded, alignment)) c = index_.best_fit(pool_, need);
  return c;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::fits_aligned(std::uint32_t c, std::size_t rounded,
                                             std::size_t alignment) const noexcept {
  const detail::best_fit_chunk& node = pool_[c];
  const std::uintptr_t start = (node.addr + (alignment - 1)) & ~static_cast<std::uintptr_t>(alignment - 1);
  return start - node.addr <= node.size() - rounded;
}

template <virtual_memory Vmm>
std::uint32_t virtual_arena<Vmm>::grow_for(std::size_t rounded, std::size_t need, std::size_t alignment) noexcept {
  const std::size_t g = opts_.granularity;
  const std::size_t want = detail::round_up(need, g);
  if (want == 0 || want / g > max_granules - (end_ - base_) / g) return detail::best_fit_npos;
  try {
    detail::reserve_room(ranges_, ranges_.size() + 1);
  } catch (const std::bad_alloc&) {
    return detail::best_fit_npos;
  }
  const address_range r = vmm_.reserve(want);
  if (!r) return detail::best_fit_npos;
  if (reinterpret_cast<std::uintptr_t>(r.ptr) != reserved_end_) {
    vmm_.unreserve(r);
    return detail::best_fit_npos;
  }
  ranges_.push_back(r);
  reserved_end_ += r.size;
  const std::uintptr_t new_end = base_ + ((reserved_end_ - base_) & ~(g - 1));
  const std::size_t added = new_end - end_;
  if (added == 0) return detail::best_fit_npos;
  if (pool_[tail_].free()) {
    index_.erase(pool_, tail_);
    pool_[tail_].set_size(pool_[tail_].size() + added);
    index_.insert(pool_, tail_);
  } else {
    const std::uint32_t c = pool_.take();
    pool_[c].addr = end_;
    pool_[c].set_free(added);
    link(tail_, false, c, true);
    pool_[c].set_next(none, false);
    tail_ = c;
    index_.insert(pool_, c);
  }
  end_ = new_end;
  return find_fit(rounded, need, alignment);
}

template <virtual_memory Vmm>
inline block virtual_arena<Vmm>::carve(std::uint32_t c, std::uintptr_t start, std::size_t rounded,
                                       std::size_t bytes) noexcept {
  index_.erase(pool_, c);
  const std::uint32_t before = pool_[c].prev();
  const std::uint32_t after = pool_[c].next();
  std::uint32_t b = c;
  if (start != pool_[c].addr) {  // the padding in front stays a free chunk, in its node
    const std::size_t front = start - pool_[c].addr;
    b = pool_.take();
    pool_[b].addr = start;
    pool_[b].set_free(pool_[c].size() - front);
    pool_[c].set_size(front);
    index_.insert(pool_, c);
    link(c, true, b, false);
  } else {
    pool_[before].set_next(b, false);
  }
  const std::size_t leftover = pool_[b].size() - rounded;
  std::uint32_t last = b;
  if (leftover != 0) {
    const std::uint32_t rest = pool_.take();
    pool_[rest].addr = start + rounded;
    pool_[rest].set_free(leftover);
    pool_[b].set_size(rounded);
    link(b, false, rest, true);
    link(rest, true, after, false);
    index_.insert(pool_, rest);
    last = rest;
  } else {
    link(b, false, after, false);
  }
  if (after == none) tail_ = last;
  detail::best_fit_chunk& node = pool_[b];
  node.set_allocated(bytes);
  in_use_ += node.size();
  requested_ += bytes;
  map_.insert(start, b);
  return {reinterpret_cast<void*>(start), bytes};
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::absorb_next(std::uint32_t c) noexcept {
  detail::best_fit_chunk& node = pool_[c];
  const std::uint32_t n = node.next();
  node.set_size(node.size() + pool_[n].size());
  node.set_next(pool_[n].next(), false);
  if (n == tail_) tail_ = c;
  pool_.give(n);
}

template <virtual_memory Vmm>
inline misuse virtual_arena<Vmm>::classify_unknown(std::uintptr_t addr) const noexcept {
  if (addr < base_ || addr >= end_) return misuse::foreign_pointer;
  for (std::uint32_t c = head_; c != none; c = pool_[c].next()) {
    if (pool_[c].addr == addr) return pool_[c].free() ? misuse::double_free : misuse::foreign_pointer;
    if (pool_[c].addr > addr) break;
  }
  return misuse::foreign_pointer;
}

}  // namespace alloy
