// SPDX-License-Identifier: Apache-2.0
// alloy/policy/best_fit_arena.hpp
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <new>
#include <tuple>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/best_fit_index.hpp>
#include <alloy/misuse.hpp>

namespace alloy {

/// How a `best_fit_arena` sizes the segments it takes from its upstream.
enum class best_fit_growth : std::uint8_t {
  doubling,  ///< `growth_size`, then twice the previous segment, up to `max_growth_size` (as TF's BFC)
  fixed,     ///< every segment `growth_size`
};

/// A misuse `best_fit_arena::deallocate` detected and ignored: the shared vocabulary of
/// `alloy/misuse.hpp` (the arena reports double_free, foreign_pointer and wrong_size).
using arena_misuse = misuse;
/// Called on every misuse (see `best_fit_arena::options::on_misuse`).
using arena_misuse_handler = misuse_handler;
/// Counts of the misuses a `best_fit_arena` detected.
using arena_misuse_counts = misuse_counts;

/// `best_fit_arena<Upstream>`: a coalescing best-fit arena (the large-block engine,
/// docs/design.md#building-blocks).
///
/// - Strategy: takes *segments* from `Upstream` and splits them into *chunks*. A request is
///   rounded up to a multiple of `size_quantum` (default `rounding`) and served by the smallest
///   free chunk that holds it (among equal sizes the most recently freed below 16,384 units, the
///   lowest address above); the rest is split off. A freed chunk merges at once with its free
///   neighbours in the segment. Larger power-of-two alignments are served by splitting off the
///   padding in front. When nothing fits a segment is taken (`growth`: doubling from
///   `growth_size` to `max_growth_size`, or fixed), within `maximum_size`; only wholly free
///   segments go back. `max_split_size` (as PyTorch's) keeps small requests off larger free
///   chunks. All metadata lives in host memory; the managed memory is never touched, so device
///   memory works.
/// - Complexity: allocate O(1) below 16,384 rounding units (4 MiB at the default), O(log n)
///   expected above (n = free chunks); deallocate O(1) expected plus that re-indexing; a new
///   segment O(segments); `owns` O(log segments); `for_each_block` O(chunks). After warm-up no
///   call allocates host memory.
/// - Failure: an empty block (`num_ooms`) after trying the preferred segment size, then the
///   request's size, then oversize chunks, then releasing every wholly free segment and retrying
///   once. A bad alignment or a size whose rounding overflows fails at once, not counted. Bad
///   frees (double, foreign, interior, wrong size) are ignored, counted in `misuses()` and passed
///   to `options::on_misuse` (docs/design.md#errors); a stale free of an address handed out again
///   with the same size cannot be told from a valid one.
/// - Thread safety: none (wrap in `synchronized` or `sharded`). Movable, not copyable; a
///   moved-from arena may only be destroyed or assigned to. Destruction returns every segment.
/// - Memory kind: the upstream's. Capabilities: `owns`, `release`, `reserved_bytes`, `counters`,
///   `for_each_block`, `bytes_in_use` (rounded, so reserved = in use + free), `requested_bytes`,
///   `free_bytes`, `largest_free_block`, `bytes_reservable_limit`, `try_deallocate`, `free_misuse`,
///   `allocate_at` and `chunk_size` (for `compacting_defragmenter`), `allocate_keeping_cache` and
///   `allocate_cached` (for `stream_ordered`), `check_invariants`; over a `thread_safe_upstream`, planned growth and
///   `release_detached`, so that `synchronized` and `sharded` call the upstream without their lock
///   (docs/design.md#threads). Zero bytes: a chunk of `size_quantum` bytes, returned with size 0.
/// - Defaults chosen by measurement: bench/README.md#current-results
template <allocator Upstream>
class best_fit_arena {
 public:
  static constexpr bool host_accessible = Upstream::host_accessible;
  static constexpr bool device_accessible = Upstream::device_accessible;
  /// Every power of two: alignment is served inside the arena, whatever `Upstream` promises (the
  /// edges read this to tell a bad alignment from an out-of-memory).
  static constexpr std::size_t max_alignment = std::numeric_limits<std::size_t>::max();

  struct options {
    /// Bytes taken at construction as one segment (at the first request when that fails); 0
    /// (default): none. With `initial_size == maximum_size` the arena has a fixed capacity.
    std::size_t initial_size = 0;
    /// Cap on reserved bytes, rounded down to a multiple of `rounding`; default: none.
    std::size_t maximum_size = std::numeric_limits<std::size_t>::max();
    /// How segments grow: `doubling` (default) from `growth_size` up to `max_growth_size`, or
    /// `fixed` at `growth_size`; a segment is never smaller than the request.
    best_fit_growth growth = best_fit_growth::doubling;
    std::size_t growth_size = std::size_t{2} << 20;       ///< first (doubling) or every (fixed) segment
    std::size_t max_growth_size = std::size_t{16} << 20;  ///< doubling stops here
    std::size_t rounding = 256;                           ///< a power of two (others round up to one)
    /// Chunk sizes are multiples of this (PyTorch's kRoundLarge: fewer distinct sizes, more
    /// reuse), while each block keeps the size its caller asked for, so that a free at another
    /// size is still refused (`quantizer` cannot tell). A power of two; below `rounding` (default
    /// 0): `rounding`.
    std::size_t size_quantum = 0;
    /// Free chunks above this are *oversize* (PyTorch's `max_split_size_mb`): a request of at most
    /// this size splits one only when the arena cannot grow, a larger one takes it whole when less
    /// than this would be left over. Default: no limit.
    std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
    arena_misuse_handler on_misuse = nullptr;  ///< called on each misuse detected by deallocate
    void* misuse_context = nullptr;            ///< passed to `on_misuse`
  };

  best_fit_arena() : best_fit_arena(Upstream{}) {}
  explicit best_fit_arena(Upstream upstream, options opts = {})
      : upstream_(std::move(upstream)),
        opts_(normalised(opts)),
        rounding_shift_(detail::log2_of_power_of_two(opts_.rounding)),
        index_(rounding_shift_),
        map_(rounding_shift_) {
    next_growth_ = opts_.growth_size;
    if (opts_.initial_size != 0) {
      try {
        pool_.reserve(4);
        segments_.reserve(4);
      } catch (const std::bad_alloc&) {
        return;
      }
      const std::size_t size = detail::round_up(std::min(opts_.initial_size, opts_.maximum_size), opts_.rounding);
      if (size != 0 && size <= opts_.maximum_size) take_segment(size);
    }
  }

  best_fit_arena(const best_fit_arena&) = delete;
  best_fit_arena& operator=(const best_fit_arena&) = delete;
  best_fit_arena(best_fit_arena&& other) noexcept
      : upstream_(std::move(other.upstream_)),
        opts_(other.opts_),
        rounding_shift_(other.rounding_shift_),
        index_(std::move(other.index_)),
        pool_(std::move(other.pool_)),
        map_(std::move(other.map_)),
        segments_(std::move(other.segments_)),
        next_growth_(other.next_growth_),
        reserved_(other.reserved_),
        in_use_(other.in_use_),
        requested_(other.requested_),
        counters_(other.counters_),
        misuses_(other.misuses_) {
    other.forget();
  }
  best_fit_arena& operator=(best_fit_arena&& other) noexcept {
    if (this != &other) {
      return_all_segments();
      upstream_ = std::move(other.upstream_);
      opts_ = other.opts_;
      rounding_shift_ = other.rounding_shift_;
      index_ = std::move(other.index_);
      pool_ = std::move(other.pool_);
      map_ = std::move(other.map_);
      segments_ = std::move(other.segments_);
      next_growth_ = other.next_growth_;
      reserved_ = other.reserved_;
      in_use_ = other.in_use_;
      requested_ = other.requested_;
      counters_ = other.counters_;
      misuses_ = other.misuses_;
      other.forget();
    }
    return *this;
  }
  ~best_fit_arena() { return_all_segments(); }

  // ---- the allocator ---------------------------------------------------------------------------

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_impl(bytes, alignment, detail::growth_mode::releasing);
  }
  /// As `allocate`, but an upstream failure is not answered by releasing free segments and
  /// retrying: the request fails instead, not counted as an OOM (for `stream_ordered`, whose
  /// free memory may still be in use on a stream; it then waits and calls `allocate`).
  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_impl(bytes, alignment, detail::growth_mode::keeping_cache);
  }
  /// A block from the free chunks only (`cache_serving_allocator`): no segment taken, none given
  /// back, a failure not counted (for `stream_ordered` under a CUDA graph's capture).
  block allocate_cached(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_impl(bytes, alignment, detail::growth_mode::without_upstream);
  }

  /// Planned growth (`growth_planning_allocator`, over a `thread_safe_upstream` only): a block
  /// when a free chunk serves the request; else an empty block, the arena unchanged, with `plan`
  /// set to the segment `allocate` would take first (the preferred size, within
  /// `maximum_size`; on failure the request's own size, then the free segments released and that
  /// size again), or left empty when the request needs more than plain upstream calls (the
  /// caller then calls `allocate`).
  block allocate_or_plan(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept
    requires thread_safe_upstream<Upstream>
  {
    return allocate_impl(bytes, alignment, detail::growth_mode::releasing, &plan);
  }
  /// Adopts `plan.got` as a new segment (a free chunk: cache, whatever happened meanwhile),
  /// unless that would pass `maximum_size` or host metadata cannot grow (it is then left in
  /// `plan.got` for the caller to give back, counted as taken and given back), then allocates as
  /// `allocate` does; after the caller's release-and-retry (`plan.retried`) without calling the
  /// upstream again (the last resorts only).
  block allocate_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept
    requires thread_safe_upstream<Upstream>
  {
    if (plan.got) adopt_segment(plan, chunk_size(bytes));
    if (plan.retried) [[unlikely]] {
      ++counters_.num_alloc_retries;
      return allocate_impl(bytes, alignment, detail::growth_mode::cache_only);
    }
    return allocate_impl(bytes, alignment, detail::growth_mode::releasing);
  }

 private:
  [[gnu::always_inline]] block allocate_impl(std::size_t bytes, std::size_t alignment, detail::growth_mode mode,
                                             growth_plan* plan = nullptr) noexcept {
    if (!detail::is_power_of_two(alignment)) return {};
    const std::size_t rounded = chunk_size(bytes);
    if (rounded == 0) return {};
    std::size_t need = rounded;  // what a chunk must span to hold the request at any address
    if (alignment > opts_.rounding) {
      if (rounded > std::numeric_limits<std::size_t>::max() - alignment) return {};
      need = rounded + alignment - opts_.rounding;
    }
    if (!reserve_metadata()) [[unlikely]] {
      if (plan == nullptr) ++counters_.num_ooms;  // else the caller calls allocate
      return {};
    }
    std::uint32_t c = find_fit(rounded, need, alignment);
    if (c == detail::best_fit_npos) {
      if (plan != nullptr) {
        plan_growth(rounded, need, *plan);
        return {};
      }
      c = grow_for(rounded, need, mode);
    }
    if (c == detail::best_fit_npos) {
      // keeping_cache: the caller retries with release; without_upstream: not a failure yet
      if (mode == detail::growth_mode::releasing || mode == detail::growth_mode::cache_only) ++counters_.num_ooms;
      return {};
    }
    std::uintptr_t start = pool_[c].addr;
    if (alignment > opts_.rounding) start = (start + (alignment - 1)) & ~static_cast<std::uintptr_t>(alignment - 1);
    return carve(c, start, rounded, bytes, true);
  }

 public:
  void deallocate(block b) noexcept { (void)try_deallocate(b); }

  /// Checked deallocation (`checked_deallocating_allocator`): frees `b` and returns true when it
  /// is a live block of this arena (or empty); returns false for a misuse, which is ignored and
  /// reported as `deallocate` describes.
  bool try_deallocate(block b) noexcept {
    if (b.ptr == nullptr) return true;
    const auto addr = reinterpret_cast<std::uintptr_t>(b.ptr);
    std::uint32_t c = map_.take(pool_, addr);
    if (c == detail::best_fit_npos) [[unlikely]] {
      report(classify_unknown(addr), b);
      return false;
    }
    if (pool_[c].requested() != b.size) [[unlikely]] {
      map_.insert(addr, c);  // it stays allocated (the entry just freed makes room)
      report(arena_misuse::wrong_size, b);
      return false;
    }
    detail::best_fit_chunk& node = pool_[c];
    in_use_ -= node.size();
    requested_ -= node.requested();
    node.set_free(node.size());
    // Merge with the free neighbours (the lower chunk survives a merge); the node's own links say
    // which are free.
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
    // The merged chunk's neighbours are allocated (or absent): they learn that it is free.
    const detail::best_fit_chunk& merged = pool_[c];
    pool_[merged.prev()].set_next(c, true);
    pool_[merged.next()].set_prev(c, true);
    index_.insert(pool_, c);
    return true;
  }

  /// What `try_deallocate(b)` would refuse `b` as now, or `none` (`free_screening_allocator`):
  /// O(1) for a live block, a bad one as its refused free costs.
  misuse free_misuse(block b) const noexcept {
    if (b.ptr == nullptr) return misuse::none;
    const auto addr = reinterpret_cast<std::uintptr_t>(b.ptr);
    const std::uint32_t c = map_.find(pool_, addr);
    if (c == detail::best_fit_npos) return classify_unknown(addr);
    return pool_[c].requested() == b.size ? misuse::none : misuse::wrong_size;
  }

  // ---- placement, for compacting_defragmenter (alloy::placement_arena) --------------------------

  /// The bytes a block of `bytes` spans in the arena (`bytes` rounded up to `size_quantum`; 0
  /// when that overflows).
  std::size_t chunk_size(std::size_t bytes) const noexcept {
    return detail::round_up(bytes == 0 ? 1 : bytes, opts_.size_quantum);
  }

  /// Carves a block of `bytes` starting exactly at `where`: succeeds only when `where` is a
  /// multiple of `rounding` and the block's `chunk_size` lies inside one free chunk (free bytes
  /// before and after it stay free chunks; `max_split_size` does not apply). An empty block
  /// otherwise, with the arena unchanged. O(chunks of that segment). For the defragmenter, which
  /// moves blocks to places it chose.
  block allocate_at(void* where, std::size_t bytes) noexcept {
    const std::size_t rounded = chunk_size(bytes);
    const auto addr = reinterpret_cast<std::uintptr_t>(where);
    if (rounded == 0 || (addr & (opts_.rounding - 1)) != 0) return {};
    const std::size_t s = segment_of(addr);
    if (s == npos_segment) return {};
    if (!reserve_metadata()) return {};
    std::uint32_t c = segments_[s].first;
    while (c != none && pool_[c].addr + pool_[c].size() <= addr) c = pool_[c].next();
    if (c == none || !pool_[c].free()) return {};
    if (rounded > pool_[c].addr + pool_[c].size() - addr) return {};
    return carve(c, addr, rounded, bytes, false);
  }

  // ---- capabilities ----------------------------------------------------------------------------

  /// Whether the block's address lies inside one of this arena's segments.
  bool owns(block b) const noexcept { return segment_of(reinterpret_cast<std::uintptr_t>(b.ptr)) != npos_segment; }

  /// Returns every wholly free segment to the upstream; returns how many bytes went back.
  std::size_t release() noexcept {
    return release_segments([this](block taken) { upstream_.deallocate(taken); });
  }
  /// `release()` without the upstream calls: the wholly free segments leave the books into `out`
  /// (`detaching_release_allocator`); false when `out` filled before every one did.
  bool release_detached(detached_segments& out) noexcept
    requires thread_safe_upstream<Upstream>
  {
    bool all = true;
    release_segments([&](block taken) { out.add(upstream_, taken); },
                     [&] {
                       all = !out.full();
                       return all;
                     });
    return all;
  }

  std::size_t reserved_bytes() const noexcept { return reserved_; }
  allocator_counters counters() const noexcept { return counters_; }

  /// Calls `visit(const block_info&)` for every chunk: segments in address order, chunks in
  /// address order. Allocated chunks report their rounded extent as `size` and what was asked as
  /// `requested`.
  template <class F>
  void for_each_block(F&& visit) const {
    for (const segment& s : segments_) {
      for (std::uint32_t c = s.first; c != none; c = pool_[c].next()) {
        const detail::best_fit_chunk& node = pool_[c];
        visit(block_info{.segment = reinterpret_cast<const void*>(s.base),
                         .segment_size = s.size,
                         .ptr = reinterpret_cast<const void*>(node.addr),
                         .size = node.size(),
                         .requested = node.free() ? 0 : node.requested(),
                         .state = node.free() ? block_state::free : block_state::allocated});
      }
    }
  }

  /// Rounded bytes of the allocated chunks (so `reserved_bytes() == bytes_in_use() + free_bytes()`).
  std::size_t bytes_in_use() const noexcept { return in_use_; }
  /// Bytes the callers of the live blocks asked for.
  std::size_t requested_bytes() const noexcept { return requested_; }
  std::size_t free_bytes() const noexcept { return reserved_ - in_use_; }
  /// The largest free chunk (the biggest request at alignment <= rounding served without growing).
  std::size_t largest_free_block() const noexcept {
    const std::uint32_t c = index_.largest(pool_);
    return c == detail::best_fit_npos ? 0 : pool_[c].size();
  }
  /// `options::maximum_size` (SIZE_MAX when unbounded).
  std::size_t bytes_reservable_limit() const noexcept {
    constexpr std::size_t unbounded = std::numeric_limits<std::size_t>::max();
    return opts_.maximum_size == (unbounded & ~(opts_.rounding - 1)) ? unbounded : opts_.maximum_size;
  }
  std::size_t segment_count() const noexcept { return segments_.size(); }
  std::size_t free_chunk_count() const noexcept { return index_.size(); }
  std::size_t allocated_chunk_count() const noexcept { return map_.size(); }
  arena_misuse_counts misuses() const noexcept { return misuses_; }
  const options& get_options() const noexcept { return opts_; }

  /// Verifies every invariant of the bookkeeping in O(chunks): chunks tile each segment, no two
  /// free neighbours, every free chunk indexed and every allocated one mapped, sums agree.
  bool check_invariants() const noexcept {
    std::size_t reserved = 0, in_use = 0, requested = 0, free_chunks = 0, allocated = 0;
    std::uintptr_t previous_end = 0;
    for (const segment& s : segments_) {
      if (s.base < previous_end) return false;
      previous_end = s.base + s.size;
      reserved += s.size;
      std::uintptr_t at = s.base;
      std::uint32_t before = none;
      for (std::uint32_t c = s.first; c != none; c = pool_[c].next()) {
        const detail::best_fit_chunk& node = pool_[c];
        if (node.addr != at || node.prev() != before || node.size() == 0) return false;
        if ((node.size() & (opts_.rounding - 1)) != 0) return false;
        // The links' flags tell the neighbours' states.
        if (node.prev_free() != (before != none && pool_[before].free())) return false;
        if (node.next_free() != (node.next() != none && pool_[node.next()].free())) return false;
        if (node.free()) {
          if (before != none && pool_[before].free()) return false;
          ++free_chunks;
        } else {
          if (map_.find(pool_, node.addr) != c) return false;
          in_use += node.size();
          requested += node.requested();
          ++allocated;
        }
        at += node.size();
        before = c;
      }
      if (at != s.base + s.size) return false;
    }
    if (reserved != reserved_ || in_use != in_use_ || requested != requested_) return false;
    if (free_chunks != index_.size() || allocated != map_.size()) return false;
    return pool_.live() == free_chunks + allocated;
  }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }
  auto parts() noexcept { return std::tie(upstream_); }
  auto parts() const noexcept { return std::tie(upstream_); }

 private:
  struct segment {
    std::uintptr_t base;
    std::size_t size;
    std::uint32_t first;  ///< the lowest chunk; it survives every merge, so it never changes
    block taken;          ///< what the upstream handed out (it may start before `base`)
  };
  static constexpr std::size_t npos_segment = static_cast<std::size_t>(-1);
  static constexpr std::uint32_t none = detail::best_fit_chunk::none;  ///< no address neighbour

  /// The largest alignment `Upstream` promises (`max_alignment` when it declares one).
  static constexpr std::size_t upstream_alignment() noexcept {
    if constexpr (requires { Upstream::max_alignment; }) {
      return Upstream::max_alignment;
    } else {
      return std::numeric_limits<std::size_t>::max();
    }
  }

  static options normalised(options o) noexcept {
    o.rounding = detail::power_of_two_at_least(o.rounding);
    o.size_quantum = std::max(detail::power_of_two_at_least(o.size_quantum), o.rounding);
    o.maximum_size &= ~(o.rounding - 1);  // every segment is a whole number of rounding units
    if (o.growth_size == 0) o.growth_size = o.rounding;
    if (o.max_growth_size < o.growth_size) o.max_growth_size = o.growth_size;
    return o;
  }

  /// Makes room for what one allocation may add to the bookkeeping (three nodes: a new segment's,
  /// the block's when padding keeps the chunk's, the rest's; one map entry), before anything
  /// changes. False when host memory ran out.
  bool reserve_metadata() noexcept {
    if (pool_.available() >= 3 && !map_.full()) [[likely]]
      return true;
    return grow_metadata();
  }
  [[gnu::noinline]] bool grow_metadata() noexcept {
    try {
      pool_.reserve(3);
      map_.reserve_one();
      return true;
    } catch (const std::bad_alloc&) {
      return false;
    }
  }

  /// The best free chunk for a request, or npos when none may serve it. Forced inline: with
  /// several callers of `allocate_impl` the compiler would otherwise call it on the hot path.
  [[gnu::always_inline]] std::uint32_t find_fit(std::size_t rounded, std::size_t need,
                                                std::size_t alignment) const noexcept {
    std::uint32_t c = index_.best_fit(pool_, rounded);
    if (c == detail::best_fit_npos) return c;
    if (alignment > opts_.rounding && !fits_aligned(c, rounded, alignment)) {
      c = index_.best_fit(pool_, need);
      if (c == detail::best_fit_npos) return c;
    }
    if (pool_[c].size() > opts_.max_split_size && rounded <= opts_.max_split_size) return detail::best_fit_npos;
    return c;
  }
  bool fits_aligned(std::uint32_t c, std::size_t rounded, std::size_t alignment) const noexcept {
    const detail::best_fit_chunk& node = pool_[c];
    const std::uintptr_t start = (node.addr + (alignment - 1)) & ~static_cast<std::uintptr_t>(alignment - 1);
    return start - node.addr <= node.size() - rounded;
  }

  /// The segment size a growth for a request asks for first, and whether taking it advances the
  /// doubling.
  std::size_t preferred_growth(std::size_t rounded, std::size_t need, bool& advances) const noexcept {
    const std::size_t max_split = opts_.max_split_size;
    std::size_t preferred = need;
    advances = false;
    if (rounded > max_split) {
      preferred = need;  // oversize requests get a segment of their own size (as PyTorch)
    } else if (opts_.growth == best_fit_growth::fixed) {
      preferred = std::max(need, opts_.growth_size);
    } else {
      preferred = std::max(need, next_growth_);
      advances = true;
    }
    if (rounded <= max_split && max_split != std::numeric_limits<std::size_t>::max())
      preferred = std::min(preferred, std::max(need, detail::round_up(max_split, opts_.rounding)));
    return std::max(detail::round_up(preferred, opts_.rounding), need);
  }

  /// Fills `plan` with the segment `grow_for` would ask for first, when one plain upstream call
  /// can give it (within `maximum_size`, at an alignment the upstream promises).
  [[gnu::noinline]] void plan_growth(std::size_t rounded, std::size_t need, growth_plan& plan) noexcept {
    if (opts_.rounding > upstream_alignment()) return;  // segments may need a second call to align
    const std::size_t room = opts_.maximum_size - reserved_;
    if (need > room) return;
    bool advances = false;
    const std::size_t preferred = std::min(preferred_growth(rounded, need, advances), room);
    if constexpr (thread_safe_upstream<Upstream>)
      plan = growth_plan::of(upstream_, preferred, opts_.rounding, *this, need);
  }

  /// Makes `plan.got` a segment (see `allocate_planned`); `rounded` is the request's size.
  [[gnu::noinline]] void adopt_segment(growth_plan& plan, std::size_t rounded) noexcept {
    const std::size_t size = plan.bytes;
    const auto base = reinterpret_cast<std::uintptr_t>(plan.got.ptr);
    bool fits = (base & (opts_.rounding - 1)) == 0 && size <= opts_.maximum_size - reserved_ && reserve_metadata();
    if (fits) {
      try {
        detail::reserve_room(segments_, segments_.size() + 1);
      } catch (const std::bad_alloc&) {
        fits = false;
      }
    }
    ++counters_.num_device_alloc;
    if (!fits) {
      ++counters_.num_device_free;  // the caller gives it back
      return;
    }
    index_segment(plan.got, base, size);
    plan.got = {};
    bool advances = false;
    (void)preferred_growth(rounded, rounded, advances);
    if (advances && size >= next_growth_ && next_growth_ < opts_.max_growth_size)
      next_growth_ = next_growth_ > opts_.max_growth_size / 2 ? opts_.max_growth_size : next_growth_ * 2;
  }

  /// Grows the arena for a request that found no chunk; returns the chunk to serve it from.
  /// Takes every wholly free segment off the books and hands its upstream block to `give`, while
  /// `more()` says there is room; returns the bytes taken.
  template <class Give, class More = bool (*)()>
  std::size_t release_segments(Give give, More more = [] { return true; }) noexcept {
    std::size_t released = 0;
    for (std::size_t i = segments_.size(); i-- > 0;) {
      segment& s = segments_[i];
      const detail::best_fit_chunk& first = pool_[s.first];
      if (!first.free() || first.size() != s.size) continue;
      if (!more()) break;
      index_.erase(pool_, s.first);
      pool_.give(s.first);
      give(s.taken);
      ++counters_.num_device_free;
      reserved_ -= s.size;
      released += s.size;
      s.size = 0;  // gone: removed below in one pass, not one erase (a shift of the rest) each
    }
    if (released != 0) std::erase_if(segments_, [](const segment& s) { return s.size == 0; });
    return released;
  }
  [[gnu::noinline]] std::uint32_t grow_for(std::size_t rounded, std::size_t need, detail::growth_mode mode) noexcept {
    const std::size_t max_split = opts_.max_split_size;
    bool advances = false;
    const std::size_t preferred = preferred_growth(rounded, need, advances);

    bool upstream_failed = false;
    std::uint32_t c = detail::best_fit_npos;
    if (mode != detail::growth_mode::cache_only && mode != detail::growth_mode::without_upstream)
      c = grow_by(preferred, need, upstream_failed);
    if (c != detail::best_fit_npos) {
      if (advances && next_growth_ < opts_.max_growth_size)
        next_growth_ = next_growth_ > opts_.max_growth_size / 2 ? opts_.max_growth_size : next_growth_ * 2;
      return c;
    }
    // Last resort for a small request: an oversize chunk, split after all.
    if (rounded <= max_split && max_split != std::numeric_limits<std::size_t>::max()) {
      c = index_.best_fit(pool_, need);
      if (c != detail::best_fit_npos) return c;
    }
    if (mode != detail::growth_mode::releasing) return detail::best_fit_npos;
    const std::size_t released = release();
    if (released == 0 && !upstream_failed) return detail::best_fit_npos;
    ++counters_.num_alloc_retries;
    bool ignored = false;
    return grow_by(need, need, ignored);
  }

  /// Takes a segment of `preferred` bytes, else of `need` bytes, within the maximum size.
  std::uint32_t grow_by(std::size_t preferred, std::size_t need, bool& upstream_failed) noexcept {
    const std::size_t room = opts_.maximum_size - reserved_;
    if (need > room) return detail::best_fit_npos;
    preferred = std::min(preferred, room);
    try {
      detail::reserve_room(segments_, segments_.size() + 1);
    } catch (const std::bad_alloc&) {
      return detail::best_fit_npos;
    }
    std::uint32_t c = take_segment(preferred);
    if (c == detail::best_fit_npos) {
      upstream_failed = true;
      if (preferred > need) c = take_segment(need);
    }
    return c;
  }

  /// Asks the upstream for one segment and indexes it as one free chunk. Room for one segment
  /// record and one node must have been reserved.
  std::uint32_t take_segment(std::size_t size) noexcept {
    // Segments start on a multiple of `rounding`. An upstream that promises less (CUDA's calls
    // guarantee 256 B) is asked for what it can promise; when the segment it hands out falls
    // short, it goes back and one `rounding - promised` bytes longer is taken and aligned inside.
    const std::size_t promised = std::min(opts_.rounding, upstream_alignment());
    block got = upstream_.allocate(size, promised);
    if (!got) return detail::best_fit_npos;
    auto base = reinterpret_cast<std::uintptr_t>(got.ptr);
    if ((base & (opts_.rounding - 1)) != 0) {
      upstream_.deallocate(got);
      ++counters_.num_device_alloc;
      ++counters_.num_device_free;
      const std::size_t padded = size + (opts_.rounding - promised);
      if (promised != opts_.rounding && padded > size) got = upstream_.allocate(padded, promised);
      else got = {};  // an upstream that ignored the alignment it was asked for: unusable
      if (!got) return detail::best_fit_npos;
      base = detail::round_up(reinterpret_cast<std::uintptr_t>(got.ptr), opts_.rounding);
      if (base - reinterpret_cast<std::uintptr_t>(got.ptr) > opts_.rounding - promised) {
        upstream_.deallocate(got);  // not even aligned to what it promised
        ++counters_.num_device_alloc;
        ++counters_.num_device_free;
        return detail::best_fit_npos;
      }
    }
    ++counters_.num_device_alloc;
    return index_segment(got, base, size);
  }

  /// Indexes a segment the upstream handed out (`got`, starting at `base`, aligned, `size` bytes)
  /// as one free chunk. Room for one segment record and one node must have been reserved.
  std::uint32_t index_segment(block got, std::uintptr_t base, std::size_t size) noexcept {
    const std::uint32_t c = pool_.take();
    detail::best_fit_chunk& node = pool_[c];
    node.addr = base;
    node.set_prev(none, false);
    node.set_next(none, false);
    node.set_free(size);
    const auto at = std::lower_bound(segments_.begin(), segments_.end(), base,
                                     [](const segment& s, std::uintptr_t a) { return s.base < a; });
    segments_.insert(at, segment{base, size, c, got});
    reserved_ += size;
    index_.insert(pool_, c);
    return c;
  }

  /// Hands out free chunk `c` for a request whose block starts at `start` (inside `c`, with
  /// `rounded` bytes room): the bytes in front stay a free chunk, the rest behind becomes one
  /// (unless `max_split_size` keeps an oversize chunk whole, when `may_keep_whole`).
  [[gnu::always_inline]] block carve(std::uint32_t c, std::uintptr_t start, std::size_t rounded, std::size_t bytes,
                                     bool may_keep_whole) noexcept {
    index_.erase(pool_, c);
    // c's neighbours are allocated (or absent): free chunks never touch.
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
      pool_[before].set_next(b, false);  // b is c: its own link back to `before` stays as it is
    }
    const std::size_t size = pool_[b].size();
    const std::size_t leftover = size - rounded;
    const std::size_t max_split = opts_.max_split_size;
    if (leftover != 0 && !(may_keep_whole && size > max_split && rounded > max_split && leftover <= max_split)) {
      const std::uint32_t rest = pool_.take();
      pool_[rest].addr = start + rounded;
      pool_[rest].set_free(leftover);
      pool_[b].set_size(rounded);
      link(b, false, rest, true);
      link(rest, true, after, false);
      index_.insert(pool_, rest);
    } else {
      link(b, false, after, false);
    }
    detail::best_fit_chunk& node = pool_[b];
    node.set_allocated(bytes);
    in_use_ += node.size();
    requested_ += bytes;
    map_.insert(start, b);
    return {reinterpret_cast<void*>(start), bytes};
  }

  /// Makes `second` the address neighbour after `first`, each link saying whether the other is free.
  void link(std::uint32_t first, bool first_free, std::uint32_t second, bool second_free) noexcept {
    pool_[first].set_next(second, second_free);
    pool_[second].set_prev(first, first_free);
  }

  /// Merges the free chunk after `c` into `c` (both free and out of the index). The chunk after
  /// the merged one is allocated or absent; its link back is left to the caller.
  void absorb_next(std::uint32_t c) noexcept {
    detail::best_fit_chunk& node = pool_[c];
    const std::uint32_t n = node.next();
    node.set_size(node.size() + pool_[n].size());
    node.set_next(pool_[n].next(), false);
    pool_.give(n);
  }

  std::size_t segment_of(std::uintptr_t addr) const noexcept {
    auto at = std::upper_bound(segments_.begin(), segments_.end(), addr,
                               [](std::uintptr_t a, const segment& s) { return a < s.base; });
    if (at == segments_.begin()) return npos_segment;
    --at;
    if (addr - at->base >= at->size) return npos_segment;
    return static_cast<std::size_t>(at - segments_.begin());
  }

  /// Why a freed pointer is not a live block (the slow path of misuse).
  [[gnu::cold]] arena_misuse classify_unknown(std::uintptr_t addr) const noexcept {
    const std::size_t s = segment_of(addr);
    if (s == npos_segment) return arena_misuse::foreign_pointer;
    for (std::uint32_t c = segments_[s].first; c != none; c = pool_[c].next()) {
      if (pool_[c].addr == addr) return pool_[c].free() ? arena_misuse::double_free : arena_misuse::foreign_pointer;
      if (pool_[c].addr > addr) break;
    }
    return arena_misuse::foreign_pointer;
  }

  [[gnu::cold]] void report(arena_misuse kind, block b) noexcept {
    detail::report_misuse(misuses_, kind, b, opts_.on_misuse, opts_.misuse_context, "best_fit_arena");
  }

  void return_all_segments() noexcept {
    for (const segment& s : segments_) {
      upstream_.deallocate(s.taken);
      ++counters_.num_device_free;
    }
    segments_.clear();
    pool_.clear();
    map_.clear();
    reserved_ = in_use_ = requested_ = 0;
  }
  void forget() noexcept {
    segments_.clear();
    pool_.clear();
    map_.clear();
    reserved_ = in_use_ = requested_ = 0;
  }

  Upstream upstream_{};
  options opts_{};
  unsigned rounding_shift_ = 8;  ///< log2 of `rounding`
  detail::best_fit_free_index index_;
  detail::best_fit_chunk_pool pool_;
  detail::best_fit_address_map map_;
  std::vector<segment> segments_;
  std::size_t next_growth_ = 0;
  std::size_t reserved_ = 0;
  std::size_t in_use_ = 0;
  std::size_t requested_ = 0;
  allocator_counters counters_{};
  arena_misuse_counts misuses_{};
};

}  // namespace alloy
