// SPDX-License-Identifier: Apache-2.0
// alloy/policy/virtual_arena/planned_growth.hpp: `virtual_arena`'s planned growth and detached
// release: the work a lock holder hands to `growth_plan::fetch()` and
// `detached_segments::give_back()`, so that creates, maps, unmaps and releases run without the lock
// of `synchronized` or `sharded`.
// Member definitions only: the class, with every declaration and its contract, is in
// alloy/policy/virtual_arena.hpp, which includes this file.
#pragma once

#include <alloy/policy/virtual_arena.hpp>

namespace alloy {

template <virtual_memory Vmm>
inline block virtual_arena<Vmm>::allocate_or_plan(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept
  requires thread_safe_vmm<Vmm>
{
  if (current_tag_.value != 0 || tags_in_use_ || !tags_.empty()) [[unlikely]]
    return {};
  return allocate_impl(bytes, alignment, true, 0, &plan);
}

template <virtual_memory Vmm>
inline block virtual_arena<Vmm>::allocate_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept
  requires thread_safe_vmm<Vmm>
{
  plan.got = {};
  planned_mapping& m = *static_cast<planned_mapping*>(plan.upstream);
  for (std::size_t i = 0; i < m.runs.size(); ++i) {
    const typename planned_mapping::run& run = m.runs[i];
    const std::size_t first = granule_of(run.at);
    const bool mapped = i < m.mapped;
    for (std::size_t g = first; g < first + run.granules; ++g) granules_[g].pending = false;
    if (mapped) set_piece_run(first, run.granules, run.piece, false);
    counters_.num_device_alloc += mapped;
    counters_.num_maps += mapped;
  }
  counters_.num_device_alloc += m.map_failures;  // created, not mapped, released at once
  counters_.num_device_free += m.map_failures;
  m.active = false;
  --pending_plans_;
  in_use_ += m.rounded;
  requested_ += m.bytes;
  if (m.ahead_bytes != 0) {  // the granules ahead are free (mapped unless the run failed)
    merge_free(map_.take(pool_, m.ahead_at), m.ahead_at);
    m.ahead_bytes = 0;
  }
  if (m.mapped == m.runs.size() && state(tag{m.tag}) == tag_state::resident) [[likely]]
    return {reinterpret_cast<void*>(m.start), m.bytes};
  free_chunk(map_.take(pool_, m.start), m.start);
  return allocate_impl(bytes, alignment, true, m.tag);
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::release_detached(detached_segments& out) noexcept
  requires thread_safe_vmm<Vmm>
{
  finish_release_batch();
  if (batch_.active || free_mapped_ == 0) {
    trim(0);
    peak_touched_ = touched_granules();
    return true;
  }
  batch_.vmm = &vmm_;
  batch_.granularity = opts_.granularity;
  batch_.count = 0;
  // At most one call per granule taken, so the batch's entries suffice.
  const std::size_t room = std::min(release_batch::capacity, detached_segments::capacity - out.count);
  const std::size_t taken = take_free(room, [&](std::size_t first, std::size_t granules) {
    batch_.entries[batch_.count] = {granules_[first].piece, static_cast<std::uint32_t>(first),
                                    static_cast<std::uint32_t>(granules)};
    out.add_call(&batch_, block{granule_address(first), batch_.count++}, &release_batch::give);
    clear_piece_run(first, granules);
    for (std::size_t g = first; g < first + granules; ++g) granules_[g].releasing = true;
    ++counters_.num_unmaps;
    ++counters_.num_device_free;
  });
  if (taken == 0 && room != 0) {  // what is left lies in block-sized pieces still in use
    peak_touched_ = touched_granules();
    return true;
  }
  batch_.remaining.store(batch_.count, std::memory_order_relaxed);
  batch_.active = true;
  return false;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::pending_chunk(std::uintptr_t addr) const noexcept {
  for (const auto& m : plans_)
    if (m->active && (m->start == addr || (m->ahead_bytes != 0 && m->ahead_at == addr))) return true;
  return false;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::finish_release_batch() noexcept {
  if (!batch_.active || batch_.remaining.load(std::memory_order_acquire) != 0) return;
  for (std::size_t i = 0; i < batch_.count; ++i)
    for (std::size_t g = batch_.entries[i].first; g < batch_.entries[i].first + batch_.entries[i].granules; ++g)
      granules_[g].releasing = false;
  batch_.active = false;
}

template <virtual_memory Vmm>
inline bool virtual_arena<Vmm>::wait_for_release() noexcept {
  if (!batch_.active) return false;
  for (std::size_t left; (left = batch_.remaining.load(std::memory_order_acquire)) != 0;)
    batch_.remaining.wait(left, std::memory_order_acquire);
  finish_release_batch();
  return true;
}

template <virtual_memory Vmm>
inline void virtual_arena<Vmm>::wait_if_releasing(std::size_t first, std::size_t last) noexcept {
  for (std::size_t g = first; g <= last && g < granules_.size(); ++g) {
    if (granules_[g].releasing) {
      wait_for_release();
      return;
    }
  }
}

template <virtual_memory Vmm>
block virtual_arena<Vmm>::plan_mapping(growth_plan& plan, std::uint32_t c, std::uintptr_t start, std::size_t rounded,
                                       std::size_t bytes, std::size_t first, std::size_t last,
                                       std::size_t to_map) noexcept {
  planned_mapping* m = to_map <= headroom_granules() ? idle_record(to_map) : nullptr;
  if (m == nullptr) {
    (void)drop_user(first, last);  // nothing mapped yet
    return {};
  }
  trim(kept_free_bytes_before_map(to_map));  // as `map_new_granules`: mapped memory stays within the rule
  (void)carve(c, start, rounded, bytes);
  in_use_ -= rounded;  // counted at the commit, when memory is behind it
  requested_ -= bytes;
  m->ahead_bytes = 0;
  std::size_t runs = 0;
  if (const std::size_t ahead = plan_granules_ahead(first, last, to_map); ahead != 0) {
    // Frontier growth, as `map_with_granules_ahead`: one run, the block's granules and those ahead.
    const std::size_t from = last + 1 - to_map;
    for (std::size_t g = from; g <= last + ahead; ++g) granules_[g].pending = true;
    m->runs[runs++] = {base_ + (from << granule_shift_), to_map + ahead, 0};
    m->ahead_at = base_ + ((last + 1) << granule_shift_);
    m->ahead_bytes = ahead << granule_shift_;
    to_map += ahead;
  } else {
    const auto [run_from, run_to] = whole_run_span(first, last, start, rounded);
    for (std::size_t g = first; g <= last; ++g) {
      if (granules_[g].piece != 0) continue;
      std::size_t end = g + 1;
      if (g >= run_from && g < run_to)
        while (end < run_to && granules_[end].piece == 0) ++end;
      for (std::size_t i = g; i < end; ++i) granules_[i].pending = true;
      m->runs[runs++] = {base_ + (g << granule_shift_), end - g, 0};
      g = end - 1;
    }
  }
  m->runs.resize(runs);
  m->start = start;
  m->rounded = rounded;
  m->bytes = bytes;
  m->tag = 0;
  m->mapped = m->map_failures = 0;
  m->active = true;
  ++pending_plans_;
  plan = growth_plan{};
  plan.bytes = to_map << granule_shift_;
  plan.alignment = opts_.granularity;
  plan.upstream = m;
  plan.take = &planned_mapping::map_all;
  plan.give = [](void*, block) noexcept {};  // `allocate_planned` adopts or frees everything
  return {};
}

template <virtual_memory Vmm>
inline std::size_t virtual_arena<Vmm>::plan_granules_ahead(std::size_t first, std::size_t last,
                                                           std::size_t to_map) noexcept {
  const std::size_t ahead = granules_ahead(first, last, to_map);
  if (ahead == 0 || !reserve_metadata()) return 0;
  // Nothing past the block is touched (no granule there is mapped or pending), so it is free.
  const std::uintptr_t at = base_ + ((last + 1) << granule_shift_);
  const std::size_t bytes = ahead << granule_shift_;
  if (!pool_[tail_].free() || pool_[tail_].addr > at || at + bytes > end_) return 0;
  (void)carve(tail_, at, bytes, bytes);
  in_use_ -= bytes;
  requested_ -= bytes;
  (void)add_user(last + 1, last + ahead, 0);
  return ahead;
}

template <virtual_memory Vmm>
inline auto virtual_arena<Vmm>::idle_record(std::size_t n) noexcept -> planned_mapping* {
  try {
    planned_mapping* m = nullptr;
    for (auto& r : plans_)
      if (!r->active) m = r.get();
    if (m == nullptr) {
      detail::reserve_room(plans_, plans_.size() + 1);
      plans_.push_back(std::make_unique<planned_mapping>());
      m = plans_.back().get();
    }
    m->vmm = &vmm_;
    m->granularity = opts_.granularity;
    m->runs.resize(n);
    return m;
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

}  // namespace alloy
