// SPDX-License-Identifier: Apache-2.0
// alloy/showcase.hpp: ready-made compositions of the building blocks, to use as they are or to
// copy and change.
//
//   alloy::caching_allocator<alloy::cuda_malloc_upstream> torch_like;   // PyTorch's layout
//   alloy::default_allocator<alloy::cuda_async_upstream> alloc;         // what we recommend
//
// Each is a class derived from the `segregator` it is made of, so it has that segregator's
// capabilities, accessors (`small()`, `large()`) and `parts()`; statistics see its small and large
// pools. Like every policy, none is synchronized: wrap it in `synchronized<>` to share it.
// The upstream is copied into every part; pass `alloy::ref<U>` for an upstream with state that
// must stay in one place.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/forwarding.hpp>
#include <alloy/literals.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/quantizer.hpp>
#include <alloy/policy/segregator.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/ref.hpp>

namespace alloy {

// ---- caching_allocator ------------------------------------------------------------------------

/// Knobs of `caching_allocator`, with PyTorch's values as defaults.
struct caching_options {
  /// Free blocks above this size are not split for smaller requests (PyTorch's
  /// `max_split_size_mb`, in bytes); applies to both large-block arenas. Default: no limit.
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  std::size_t small_slab_size = std::size_t{2} << 20;      ///< PyTorch's kSmallBuffer
  std::size_t large_segment_size = std::size_t{20} << 20;  ///< PyTorch's kLargeBuffer
};

namespace detail {

/// Another name of `quantizer`, kept so that existing code compiles.
template <allocator Inner, std::size_t Rounding>
using round_up_requests = quantizer<Inner, Rounding>;

/// The small pool of `caching_allocator`: classes from 512 B (PyTorch's kMinBlockSize) with four
/// steps per octave. Classes go to 2 MiB, above the 1 MiB threshold, so that requests near 1 MiB
/// with an alignment above 256 still fit (see `size_class_pool`).
template <class Upstream>
using caching_small_t = size_class_pool<Upstream, power2_classes<4, 512, (std::size_t{2} << 20)>>;
template <class Upstream>
using caching_large_t = segregator<(std::size_t{10} << 20) - 1, best_fit_arena<Upstream>, best_fit_arena<Upstream>>;
template <class Upstream>
using caching_base_t = segregator<(std::size_t{1} << 20), caching_small_t<Upstream>, caching_large_t<Upstream>>;
}  // namespace detail

/// `caching_allocator<Upstream>`: PyTorch's documented CUDA caching allocator layout, made of our
/// blocks.
///
/// - Requests of at most 1 MiB (PyTorch's small pool) come from a `size_class_pool` with 2 MiB
///   slabs (kSmallBuffer) and classes from 512 B (kMinBlockSize) with four steps per octave.
/// - Requests above 1 MiB and below 10 MiB (kMinLargeAlloc) come from a `best_fit_arena` that
///   grows by 20 MiB segments (kLargeBuffer).
/// - Requests of 10 MiB and more come from a second `best_fit_arena` whose chunks are multiples
///   of 2 MiB (kRoundLarge, its `size_quantum`) and that takes segments of exactly that size when
///   nothing cached fits.
/// - Both arenas round chunks to 256 B, not PyTorch's 512: an arena takes its segments aligned
///   to its rounding, and the CUDA upstreams guarantee 256.
/// - `max_split_size` (PyTorch's `max_split_size_mb`) applies to both arenas.
///
/// Differences from PyTorch, by construction: the small pool serves fixed size classes from
/// per-class slabs (O(1)) where PyTorch splits 2 MiB segments best fit; the two large ranges
/// keep separate segments (PyTorch lets a big cached segment serve a mid-size request); nothing
/// is stream-ordered (no per-stream pools, no events) and nothing is synchronized. On upstream
/// failure each part releases its own wholly free slabs or segments and retries once
/// (PyTorch frees every cached block of the device); call `release()` to return every cached
/// byte. Memory kind: the upstream's.
template <allocator Upstream>
class caching_allocator : public detail::caching_base_t<Upstream> {
  using base = detail::caching_base_t<Upstream>;
  using small_t = detail::caching_small_t<Upstream>;
  using large_t = detail::caching_large_t<Upstream>;
  using arena_t = best_fit_arena<Upstream>;

 public:
  using options = caching_options;

  caching_allocator() : caching_allocator(Upstream{}) {}
  explicit caching_allocator(Upstream upstream, options opts = {})
      : base(small_t{upstream, {.slab_size = opts.small_slab_size}},
             large_t{arena_t{upstream,
                             {.growth = best_fit_growth::fixed,
                              .growth_size = opts.large_segment_size,
                              .max_split_size = opts.max_split_size}},
                     arena_t{upstream,
                             {.growth = best_fit_growth::fixed,
                              .growth_size = std::size_t{2} << 20,
                              .size_quantum = std::size_t{2} << 20,
                              .max_split_size = opts.max_split_size}}}) {}
};

// ---- default_allocator ------------------------------------------------------------------------

namespace detail {
template <class Upstream>
using default_small_t = size_class_pool<Upstream, power2_classes<4, 256, (std::size_t{128} << 10)>>;
template <class Upstream>
using default_base_t = segregator<(std::size_t{64} << 10), default_small_t<Upstream>, best_fit_arena<Upstream>>;
}  // namespace detail

/// `default_allocator<Upstream>`: the composition we recommend when nothing is known about the
/// workload.
///
///   segregator<64 KiB, size_class_pool<U, power2_classes<4, 256, 128 KiB>> (slabs of 64 KiB
///              first, doubling to 256 KiB),
///              best_fit_arena<U> (its default options)>
///
/// - Strategy: the arena carries the bytes (best fit with coalescing holds the least memory); the
///   pool carries the count (small requests are the many, served in O(1) without cutting the
///   arena's segments into slivers). Slabs stop doubling at 256 KiB, which bounds the idle space
///   of the big classes; over `cudaMalloc`, where each slab is a driver call,
///   `options::small.slab_size = 2 MiB` trades that space for fewer calls. Classes go to 128 KiB,
///   above the threshold, so that requests near 64 KiB with alignments up to 64 KiB still fit the
///   pool (see `size_class_pool`).
/// - Complexity: O(1) for requests up to 64 KiB, the arena's for the rest.
/// - Failure: an empty block when the part a request goes to cannot serve it; bad frees are
///   refused by the part that holds the address (docs/design.md#errors).
/// - Thread safety: none (wrap in `synchronized` or `sharded`). Over a `thread_safe_upstream` (the
///   CUDA runtime's, `host_upstream`) its growth is planned (`growth_planning_allocator`), so that
///   those wrappers call `cudaMalloc` without their lock.
/// - Memory kind: the upstream's. Capabilities: the segregator's.
/// - Defaults chosen by measurement: bench/README.md#current-results
template <allocator Upstream>
class default_allocator : public detail::default_base_t<Upstream> {
  using base = detail::default_base_t<Upstream>;
  using small_t = detail::default_small_t<Upstream>;
  using arena_t = best_fit_arena<Upstream>;

 public:
  struct options {
    typename small_t::options small{.slab_size = std::size_t{256} << 10, .initial_slab_size = std::size_t{64} << 10};
    typename arena_t::options large{};
  };

  default_allocator() : default_allocator(Upstream{}) {}
  explicit default_allocator(Upstream upstream) : default_allocator(std::move(upstream), options{}) {}
  default_allocator(Upstream upstream, options opts)
      : base(small_t{upstream, opts.small}, arena_t{upstream, opts.large}) {}
};

// ---- virtual_allocator ------------------------------------------------------------------------

namespace detail {
inline constexpr std::size_t virtual_largest_class = std::size_t{256} << 10;
template <class Vmm>
using virtual_small_t = size_class_pool<ref<virtual_arena<Vmm>>, power2_classes<4, 256, virtual_largest_class>>;
template <class Vmm>
using virtual_heap_t = segregator<(std::size_t{128} << 10), virtual_small_t<Vmm>, ref<virtual_arena<Vmm>>>;
}  // namespace detail

/// `virtual_allocator<Vmm>`: the composition we recommend on virtual memory
/// (docs/design.md#virtual-memory), for programs that must fit a device: small requests from a
/// size-class pool whose slabs come from the same virtual arena, the rest from the arena.
///
///   virtual_arena<Vmm> (owned, one) <- ref <- segregator<128 KiB,
///                                               size_class_pool<ref, power2_classes<4, 256, 256 KiB>>
///                                               (slabs of 64 KiB first, doubling to 256 KiB),
///                                               ref (requests above 128 KiB)>
///
/// - Strategy: the arena keeps free granules mapped until the device runs short or `release()`
///   (`keep_all`), maps a block's new granules as one piece and grows a piece ahead at the top of
///   the heap (`block_sized_pieces`, `frontier_growth_divisor = 32`), and gives a free piece back
///   before a block reuses it in part (`piece_leftover_share = 4096`): few driver calls for about
///   the smallest device. Set `options::arena` to `{}` to give memory back to other processes
///   sooner. Tag 0 is served as above, any other tag straight by the arena, so no slab mixes tags
///   and `offload`, `discard`, `restore` work per tag (offloading tag 0 takes the slabs with it).
/// - Complexity: the pool's (O(1)) for small requests, the arena's for the rest; a slab is one
///   arena allocation.
/// - Failure: an empty block, after the pool's wholly free slabs went back to the arena and the
///   request was tried again. Bad frees (docs/design.md#errors) are refused by the part that holds
///   the address and counted in its `misuses()`; a free above 128 KiB inside a pool slab goes to
///   the pool, so the arena never frees a slab from under the pool's blocks.
/// - Thread safety: none (wrap in `synchronized` or `sharded`). Movable (the arena is owned through
///   a stable pointer), not assignable.
/// - Memory kind: the backend's. Statistics count the arena once: `reserved_bytes()` = the arena's
///   mapped bytes; `counters()` = the arena's physical calls plus the pool's retries;
///   `bytes_in_use()` = the pool's blocks plus the arena's chunks that are not slabs;
///   `for_each_block` = the arena's picture with each slab shown as the pool's blocks. `small()`
///   and `arena()` give the parts (no `parts()`, so no walker counts the slabs twice).
/// - Capabilities: `try_deallocate`, `free_misuse`, `owns`, `release` (free slabs to the arena, then free
///   granules to the backend), `reserved_bytes`, `mapped_bytes`, `counters`, `bytes_in_use`,
///   `requested_bytes`, `for_each_block`, `allocate_keeping_cache` and `allocate_cached` (for
///   `stream_ordered`), tags and offload; over a `thread_safe_vmm`, planned
///   growth above 128 KiB and `release_detached` (docs/design.md#threads).
/// - Defaults chosen by measurement: bench/README.md#virtual-memory
template <virtual_memory Vmm>
class virtual_allocator {
 public:
  using arena_type = virtual_arena<Vmm>;
  using small_type = detail::virtual_small_t<Vmm>;
  using heap_type = detail::virtual_heap_t<Vmm>;
  static constexpr std::size_t threshold = heap_type::threshold;
  static constexpr bool host_accessible = Vmm::host_accessible;
  static constexpr bool device_accessible = Vmm::device_accessible;

  struct options {
    /// Default: free granules stay mapped until the device runs short or `release()`, a block's
    /// run of new granules is one physical piece, with granules ahead at the top of the heap, and a
    /// free piece that a block would reuse only in part goes back first.
    typename arena_type::options arena{.release_threshold = arena_type::keep_all,
                                       .block_sized_pieces = true,
                                       .frontier_growth_divisor = 32,
                                       .piece_leftover_share = 4096};
    typename small_type::options small{.slab_size = std::size_t{256} << 10, .initial_slab_size = std::size_t{64} << 10};
  };

  virtual_allocator() : virtual_allocator(Vmm{}) {}
  explicit virtual_allocator(Vmm vmm) : virtual_allocator(std::move(vmm), options{}) {}
  virtual_allocator(Vmm vmm, options opts)
      : arena_(std::make_unique<arena_type>(std::move(vmm), opts.arena)),
        heap_(small_type{ref<arena_type>{*arena_}, opts.small}, ref<arena_type>{*arena_}) {}
  virtual_allocator(virtual_allocator&&) noexcept = default;  // the arena stays where it is
  virtual_allocator& operator=(virtual_allocator&&) = delete;
  // The pool (a member of heap_, declared after arena_) gives its slabs back before the arena goes.
  ~virtual_allocator() = default;

  /// Allocates with the current tag (`scoped_tag{alloc, t}`; tag{0} unless set).
  block allocate(std::size_t bytes, std::size_t alignment) noexcept { return allocate(bytes, alignment, current_tag_); }
  /// Tag 0 goes through the pool (its slabs are tag 0); any other tag straight to the arena, so
  /// that no slab mixes tags (a small tagged block then takes a chunk of the arena).
  block allocate(std::size_t bytes, std::size_t alignment, tag t) noexcept {
    const std::size_t arena_ooms = arena_->counters().num_ooms;
    block b;
    if (t.value == 0 && arena_->state(t) == tag_state::resident) [[likely]] {
      b = heap_.allocate(bytes, alignment);
      if (!b && release_empty_slabs()) b = heap_.allocate(bytes, alignment);
    } else {
      // Another tag, or tag 0 while offloaded (the pool's slabs are unmapped then): the arena
      // serves it or refuses it and counts the refusal.
      b = arena_->allocate(bytes, alignment, t);
      if (b && b.size <= threshold) tagged_small_ = true;
    }
    if (!b) count_oom(arena_ooms);
    return b;
  }
  /// As `allocate`, but nothing cached is given back to serve it (no free granule unmapped, no
  /// empty slab released): the request fails instead, not counted as an OOM. This makes the
  /// composition `stream_ordered`'s `Inner`. Tagged requests (`current_tag()` not 0) fail here.
  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept {
    if (current_tag_.value != 0 || arena_->state(current_tag_) != tag_state::resident) return {};
    return heap_.allocate_keeping_cache(bytes, alignment);
  }
  /// From the pool's free slots or the arena's mapped granules only (`cache_serving_allocator`):
  /// no slab taken, no granule mapped or unmapped, a failure not counted as an OOM.
  block allocate_cached(std::size_t bytes, std::size_t alignment) noexcept {
    if (current_tag_.value != 0 || arena_->state(current_tag_) != tag_state::resident) return {};
    return heap_.allocate_cached(bytes, alignment);
  }
  /// Planned growth (`growth_planning_allocator`, over a `thread_safe_vmm`): requests above
  /// `threshold` plan their creates and maps as the arena does (`virtual_arena::allocate_or_plan`),
  /// so that `synchronized` and `sharded` make them without their lock; small requests are served
  /// at once (a new slab's granule is still mapped under the lock: one granule per 64-256 KiB slab).
  block allocate_or_plan(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept
    requires growth_planning_allocator<arena_type>
  {
    if (current_tag_.value != 0) [[unlikely]]
      return {};  // the caller calls allocate
    if (bytes <= threshold)
      return arena_->state(current_tag_) == tag_state::resident ? heap_.allocate(bytes, alignment) : block{};
    return arena_->allocate_or_plan(bytes, alignment, plan);
  }
  block allocate_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept
    requires growth_planning_allocator<arena_type>
  {
    const std::size_t arena_ooms = arena_->counters().num_ooms;
    block b = arena_->allocate_planned(plan, bytes, alignment);
    if (!b && release_empty_slabs()) b = arena_->allocate(bytes, alignment);
    if (!b) count_oom(arena_ooms);
    return b;
  }
  void deallocate(block b) noexcept {
    if (b.ptr != nullptr && not_where_its_size_goes(b)) [[unlikely]] {
      (void)try_deallocate_elsewhere(b);
      return;
    }
    heap_.deallocate(b);
  }
  /// Checked deallocation: false (nothing changed) for a block that is not live here — foreign,
  /// interior, double or of the wrong size, as the pool or the arena detects it.
  bool try_deallocate(block b) noexcept
    requires checked_deallocating_allocator<heap_type>
  {
    if (b.ptr != nullptr && not_where_its_size_goes(b)) [[unlikely]]
      return try_deallocate_elsewhere(b);
    return heap_.try_deallocate(b);
  }
  /// What `try_deallocate(b)` would refuse `b` as now, or `none` (`free_screening_allocator`).
  misuse free_misuse(block b) const noexcept
    requires free_screening_allocator<heap_type>
  {
    if (b.ptr != nullptr && not_where_its_size_goes(b)) [[unlikely]]
      return b.size <= threshold ? arena_->free_misuse(b) : heap_.small().free_misuse(b);
    return heap_.free_misuse(b);
  }

  // Tags and offload (virtual_arena's, alloy/tag.hpp): the pool's slabs are tag 0.
  tag current_tag() const noexcept { return current_tag_; }
  void set_current_tag(tag t) noexcept { current_tag_ = t; }
  offload_status offload(tag t) noexcept { return arena_->offload(t); }
  offload_status discard(tag t) noexcept { return arena_->discard(t); }
  offload_status restore(tag t) noexcept { return arena_->restore(t); }
  tag_state state(tag t) const noexcept { return arena_->state(t); }
  const offload_statistics& offload_stats() const noexcept { return arena_->offload_stats(); }
  offload_status offload_all() noexcept { return arena_->offload_all(); }
  /// Per-tag figures, the arena's: for tag 0 the pool's slabs count as its live chunks.
  std::size_t host_bytes(tag t) const noexcept { return arena_->host_bytes(t); }
  std::size_t mapped_bytes(tag t) const noexcept { return arena_->mapped_bytes(t); }
  std::size_t live_bytes(tag t) const noexcept { return arena_->live_bytes(t); }

  bool owns(block b) const noexcept { return arena_->owns(b); }
  /// Gives the pool's wholly free slabs to the arena, then every free mapped granule back.
  void release() noexcept {
    heap_.small().release();
    arena_->release();
  }
  /// `release()` with the arena's unmaps and releases left to the caller, without its lock
  /// (`detaching_release_allocator`, over a `thread_safe_vmm`: `virtual_arena::release_detached`).
  bool release_detached(detached_segments& out) noexcept
    requires detaching_release_allocator<arena_type>
  {
    heap_.small().release();
    return arena_->release_detached(out);
  }

  std::size_t reserved_bytes() const noexcept { return arena_->reserved_bytes(); }
  std::size_t mapped_bytes() const noexcept { return arena_->mapped_bytes(); }
  allocator_counters counters() const noexcept {
    allocator_counters c = arena_->counters();
    c.num_alloc_retries += heap_.small().counters().num_alloc_retries;
    c.num_ooms = ooms_;
    return c;
  }
  std::size_t bytes_in_use() const noexcept {
    // While tag 0 is not resident the arena counts none of its chunks, the slabs among them.
    if (arena_->state(tag{0}) != tag_state::resident) [[unlikely]]
      return arena_->bytes_in_use();
    const small_type& s = heap_.small();
    return arena_->bytes_in_use() - s.reserved_bytes() + s.bytes_in_use();
  }
  std::size_t requested_bytes() const noexcept {
    const small_type& s = heap_.small();
    return arena_->requested_bytes() - s.reserved_bytes() + s.requested_bytes();
  }
  /// The arena's range, its slabs shown as the pool's blocks (a slab with no live block is free
  /// memory to the caller, not an allocation). Allocates host memory for the pool's picture.
  template <class F>
  void for_each_block(F&& visit) const {
    std::vector<block_info> pool;
    heap_.small().for_each_block([&](const block_info& info) { pool.push_back(info); });
    std::sort(pool.begin(), pool.end(), [](const block_info& l, const block_info& r) { return l.ptr < r.ptr; });
    auto next = pool.begin();
    arena_->for_each_block([&](const block_info& piece) {
      const auto* start = static_cast<const std::byte*>(piece.ptr);
      if (piece.state != block_state::allocated || !heap_.small().owns(block{const_cast<std::byte*>(start), 1})) {
        visit(piece);
        return;
      }
      const std::byte* at = start;  // the slab's blocks, gaps between them free
      const auto free_up_to = [&](const std::byte* end) {
        if (end > at)
          visit(block_info{piece.segment, piece.segment_size, at, static_cast<std::size_t>(end - at), 0,
                           block_state::free});
      };
      while (next != pool.end() && static_cast<const std::byte*>(next->ptr) < start + piece.size) {
        block_info info = *next++;
        const auto* p = static_cast<const std::byte*>(info.ptr);
        if (p < start) continue;
        free_up_to(p);
        info.segment = piece.segment;
        info.segment_size = piece.segment_size;
        visit(info);
        at = p + info.size;
      }
      free_up_to(start + piece.size);
    });
  }

  small_type& small() noexcept { return heap_.small(); }
  const small_type& small() const noexcept { return heap_.small(); }
  arena_type& arena() noexcept { return *arena_; }
  const arena_type& arena() const noexcept { return *arena_; }

 private:
  /// Whether a free does not go where the segregator sends its size: a small block of a tag other
  /// than 0 lives in the arena; a large size on a pool slab is the pool's to refuse, since the
  /// slab is an arena chunk of the slab's bytes, which the arena would take back from under the
  /// pool's live blocks (a large block freed twice after a slab took its place). Only a slab's
  /// size can match a slab, so large frees of sizes the pool's filter says no slab had skip the
  /// look-up.
  bool not_where_its_size_goes(block b) const noexcept {
    if (b.size <= threshold) return tagged_small_ && !heap_.small().owns(b);
    return heap_.small().may_hold_slab_of(b.size) && heap_.small().owns(b);
  }
  bool try_deallocate_elsewhere(block b) noexcept {
    return b.size <= threshold ? arena_->try_deallocate(b) : heap_.small().try_deallocate(b);
  }

  /// A request failed: an OOM when the arena ran out of memory during it (not for an alignment
  /// that is no power of two, a size no rounding holds, or a tag that is not resident).
  void count_oom(std::size_t arena_ooms_before) noexcept {
    if (arena_->counters().num_ooms != arena_ooms_before) ++ooms_;
  }
  /// A request failed: the pool's wholly free slabs go back to the arena, where they merge with
  /// their neighbours and their granules can be unmapped for the retry. True when any went.
  [[gnu::cold]] bool release_empty_slabs() noexcept {
    const std::size_t before = heap_.small().reserved_bytes();
    heap_.small().release();
    return heap_.small().reserved_bytes() != before;
  }

  std::unique_ptr<arena_type> arena_;
  heap_type heap_;
  std::size_t ooms_ = 0;
  tag current_tag_{};
  bool tagged_small_ =
      false;  ///< a tagged block of at most `threshold` bytes came from the arena (frees check the pool)
};

}  // namespace alloy
