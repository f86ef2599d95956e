// SPDX-License-Identifier: Apache-2.0
// alloy/policy/virtual_arena.hpp
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/best_fit_index.hpp>
#include <alloy/detail/bit_table.hpp>
#include <alloy/misuse.hpp>
#include <alloy/movable.hpp>
#include <alloy/tag.hpp>
#include <alloy/vmm/virtual_memory.hpp>

namespace alloy {

/// `virtual_arena<Vmm>`: a coalescing best-fit heap on one range of virtual addresses that maps
/// physical memory per granule and gives back the granules no live block touches
/// (docs/design.md#virtual-memory).
///
/// - Strategy: the range is split into chunks as `best_fit_arena` splits a segment (requests
///   rounded to `rounding`, the smallest free chunk that fits, free neighbours merged at once).
///   Inside that chunk the block goes where it adds the fewest granules no live chunk touches,
///   then spans the fewest granules, then needs the fewest unmapped ones. Every granule a live
///   chunk touches is mapped; one whose last chunk goes stays mapped while the release rule keeps
///   it (`release_threshold`, `release_threshold_divisor`, `keep_up_to_peak`), else the least
///   recently freed goes back. `block_sized_pieces` maps the granules a block covers whole as one
///   piece; `frontier_growth_divisor` maps granules ahead at the top of a growing heap.
/// - Complexity: as `best_fit_arena` for the chunks (O(1) below 16,384 rounding units, O(log n)
///   above), plus O(1 + granules of the block / 64) for the granule books and one backend call
///   per piece mapped or unmapped; after warm-up no call allocates host memory. The walks
///   (`for_each_block`, `largest_free_block`, `check_invariants`) and the offload calls are
///   O(chunks + granules).
/// - Failure: an empty block (`num_ooms`) when the granules live chunks touch plus those the
///   request needs exceed what the backend can give; short of that, free mapped granules are
///   released and the create retried, then every free chunk is tried for a place that adds fewer
///   granules. A failed call leaves nothing mapped or carved. Bad frees (double, foreign,
///   interior, wrong size) are ignored, counted in `misuses()` and passed to `options::on_misuse`
///   (docs/design.md#errors). The offload calls return an `offload_status`: anything but `done`
///   changed nothing.
/// - Thread safety: none (wrap in `synchronized` or `sharded`). Movable, not copyable; several
///   arenas share one backend through `vmm_ref`. Destruction gives every granule and address back.
/// - Memory kind: the backend's. Capabilities: `try_deallocate`, `free_misuse`, `owns`, `release`,
///   `counters`, `for_each_block`, the byte figures (`reserved_bytes` = mapped),
///   `largest_free_block`, `bytes_reservable_limit`, `allocate_keeping_cache`, `allocate_cached`,
///   tags and offload, planned growth, and for `granule_segregator` `granules_added`,
///   `allocate_in_held_granules`, `release_free_beyond`, `set_free_keep_limit`.
///   Alignment: any power of two. Zero bytes: a chunk of `rounding` bytes, returned with size 0.
/// - Tags and offload (docs/design.md#offload): chunks of different tags never share a granule.
///   `offload(t)` copies the tag's live bytes to host memory and unmaps its pieces, `discard(t)`
///   only unmaps, `restore(t)` maps them again at the same addresses and copies back.
/// - Planned growth and detached release (docs/design.md#threads), over a `thread_safe_vmm`:
///   `allocate_or_plan`, `allocate_planned` and `release_detached` let `synchronized` and
///   `sharded` make the backend calls without their lock.
/// - Defaults chosen by measurement: bench/README.md#virtual-memory
template <virtual_memory Vmm>
class virtual_arena {
 public:
  static constexpr bool host_accessible = Vmm::host_accessible;
  static constexpr bool device_accessible = Vmm::device_accessible;
  /// Every power of two: alignment is served inside the arena (the edges read this to tell a
  /// bad alignment from an out-of-memory).
  static constexpr std::size_t max_alignment = std::numeric_limits<std::size_t>::max();
  /// A `release_threshold` that keeps every free mapped granule until the device runs short or
  /// `release()` (`virtual_allocator`'s): frees then skip working out what to trim.
  static constexpr std::size_t keep_all = std::numeric_limits<std::size_t>::max();

  struct options {
    /// Addresses reserved at construction; 0 (default): four times the backend's capacity, at
    /// least 1 GiB and at most 1 TiB. When the backend refuses that many, an eighth is tried; the
    /// range grows in place when the addresses right after it are free.
    std::size_t address_space = 0;
    /// Bytes per granule, the unit of physical memory; 0 (default): the backend's. Rounded up to a
    /// power of two and to a multiple of the backend's.
    std::size_t granularity = 0;
    /// Free mapped bytes always kept for reuse (as `cudaMemPoolAttrReleaseThreshold`); default 0.
    /// `keep_all` keeps every free mapped granule until `release()` or the device runs short.
    std::size_t release_threshold = 0;
    /// Also keeps free mapped granules up to 1/this of the granules live chunks touch; 0
    /// (default): no share.
    std::size_t release_threshold_divisor = 0;
    /// Also keeps free mapped granules while the mapped ones stay within the most that live chunks
    /// touched at once since construction or `release()`, so the peak mapped stays the peak
    /// touched. Default on.
    bool keep_up_to_peak = true;
    /// With `release_threshold = keep_all` only: the unmapped granules a block covers whole are
    /// mapped as one piece a run (one create and one map), an edge granule it covers in part as a
    /// piece of its own. A piece goes back only whole. Default off (`virtual_allocator`: on).
    bool block_sized_pieces = false;
    /// With `block_sized_pieces` only: a block that maps new granules at the top of the used range
    /// maps 1/this of the mapped granules more in its piece while the backend holds at most 1/16
    /// of its capacity, and a block's run takes its edge granules while it holds at most 1/64.
    /// 0 (default): off (`virtual_allocator`: 32).
    std::size_t frontier_growth_divisor = 0;
    /// With `frontier_growth_divisor` only: a heap so small that 1/divisor of it is fewer granules
    /// maps this many ahead, while the backend holds at most 1/128 of its capacity. Default 2.
    std::size_t frontier_growth_min_granules = 2;
    /// With `block_sized_pieces` only: once the backend holds more than 1/8 of its capacity, a
    /// wholly free piece that a block would reuse only in part goes back first when more than
    /// 1/this of the capacity of it would stay free (a piece goes back only whole: that part would
    /// be stranded when memory runs short). 0 (default): only once more than half of the capacity
    /// is held (`virtual_allocator`: 4096).
    std::size_t piece_leftover_share = 0;
    std::size_t rounding = 256;          ///< a power of two (others round up to one)
    misuse_handler on_misuse = nullptr;  ///< called on each misuse detected by deallocate
    void* misuse_context = nullptr;      ///< passed to `on_misuse`
    /// Host memory for offloaded copies; null: pinned `cudaMallocHost` over a device-only
    /// backend (CUDA builds), `operator new` otherwise. Returns null when it fails.
    void* (*host_allocate)(std::size_t bytes, void* context) = nullptr;
    void (*host_deallocate)(void* p, std::size_t bytes, void* context) = nullptr;
    void* host_context = nullptr;
  };

  virtual_arena() : virtual_arena(Vmm{}) {}
  explicit virtual_arena(Vmm vmm, options opts = {})
      : vmm_(std::move(vmm)),
        opts_(normalised(opts, vmm_)),
        rounding_shift_(detail::log2_of_power_of_two(opts_.rounding)),
        granule_shift_(detail::log2_of_power_of_two(opts_.granularity)),
        index_(rounding_shift_),
        map_(rounding_shift_) {
    reserve_initial();
  }

  virtual_arena(const virtual_arena&) = delete;
  virtual_arena& operator=(const virtual_arena&) = delete;
  virtual_arena(virtual_arena&& other) noexcept
      : vmm_(std::move(other.vmm_)),
        opts_(other.opts_),
        rounding_shift_(other.rounding_shift_),
        granule_shift_(other.granule_shift_) {
    take_state(other);
  }
  virtual_arena& operator=(virtual_arena&& other) noexcept {
    if (this != &other) {
      give_everything_back();
      vmm_ = std::move(other.vmm_);
      opts_ = other.opts_;
      rounding_shift_ = other.rounding_shift_;
      granule_shift_ = other.granule_shift_;
      take_state(other);
    }
    return *this;
  }
  ~virtual_arena() { give_everything_back(); }

  // ---- the allocator ---------------------------------------------------------------------------

  /// Allocates with the current tag (`scoped_tag`; tag{0} unless set).
  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_impl(bytes, alignment, true, current_tag_.value);
  }
  /// Allocates with tag `t`; an empty block when `t` is offloaded or discarded.
  block allocate(std::size_t bytes, std::size_t alignment, tag t) noexcept {
    return allocate_impl(bytes, alignment, true, t.value);
  }
  /// Granules an `allocate(bytes, alignment)` made now would add to those live chunks touch: 0
  /// when it would fit in memory the arena holds for live chunks already. Places the block as
  /// `allocate` does (best fit, then the granule rule; tags and pending growth aside), changes
  /// nothing. O(1) below 16384 rounding units, O(log n) above.
  std::size_t granules_added(std::size_t bytes, std::size_t alignment) const noexcept;
  /// `allocate` only where the block adds no granule to those live chunks touch (what
  /// `granules_added` answers 0 for); else an empty block, nothing changed, not counted as a
  /// failure. One search instead of `granules_added` then `allocate`. While tags other than 0 are
  /// in use or a planned growth is pending, it asks `granules_added` first, then `allocate` (which
  /// may move a block off another tag's granules, onto new ones).
  block allocate_in_held_granules(std::size_t bytes, std::size_t alignment) noexcept {
    if (tags_in_use_ || current_tag_.value != 0 || pending_plans_ != 0) [[unlikely]]
      return granules_added(bytes, alignment) == 0 ? allocate(bytes, alignment) : block{};
    return allocate_impl(bytes, alignment, true, current_tag_.value, nullptr, true);
  }
  /// As `allocate`, but a failed `create` is not answered by releasing free mapped granules and
  /// retrying: the request fails instead, not counted as an OOM (for `stream_ordered`).
  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_impl(bytes, alignment, false, current_tag_.value);
  }
  /// A block on granules already mapped (`cache_serving_allocator`): no create, map, unmap or
  /// reserve, a failure not counted (for `stream_ordered` under a CUDA graph's capture). Tag 0
  /// only, while no other tag is in use.
  block allocate_cached(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_impl(bytes, alignment, false, current_tag_.value, nullptr, false, true);
  }

  /// Planned growth (`growth_planning_allocator`, over a `thread_safe_vmm` only), so that
  /// `synchronized` and `sharded` create and map physical memory without their lock: a block when
  /// the request's granules are mapped already; else, when it needs new granules, an empty block
  /// and `plan` filled: the chunk is carved and its unmapped granules marked *pending* (no other
  /// placement touches them until the commit), and `plan.fetch()` makes the creates and maps
  /// without the lock. `plan` stays empty (the caller calls `allocate`) when no address range
  /// holds the request, when the capacity cannot hold the granules even with the cache released,
  /// when host metadata cannot grow, and with tags (`current_tag()` not 0, or any tag ever used,
  /// offloaded or discarded).
  block allocate_or_plan(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept
    requires thread_safe_vmm<Vmm>;
  /// Commits a plan of `allocate_or_plan`: the granules mapped without the lock join the books
  /// and the block is handed out; when a create or map failed (or the tag went offloaded
  /// meanwhile), what was mapped is kept as free mapped granules, the chunk is freed, and the
  /// request is served as `allocate` serves it (free granules released and the create retried
  /// under the lock: a last resort).
  block allocate_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept
    requires thread_safe_vmm<Vmm>;

  // ---- tags and offload ------------------------------------------------------------------------

  tag current_tag() const noexcept { return current_tag_; }
  void set_current_tag(tag t) noexcept { current_tag_ = t; }

  tag_state state(tag t) const noexcept { return t.value < tags_.size() ? tags_[t.value].state : tag_state::resident; }
  /// Bytes of the tag's host copy (0 unless offloaded).
  std::size_t host_bytes(tag t) const noexcept { return t.value < tags_.size() ? tags_[t.value].host_bytes : 0; }
  /// Mapped bytes of the pieces the tag's live chunks touch, free granules in them too: what
  /// offload/discard unmap (a piece goes back only whole). O(granules).
  std::size_t mapped_bytes(tag t) const noexcept;
  /// Requested bytes of the tag's live chunks. O(chunks).
  std::size_t live_bytes(tag t) const noexcept;
  const offload_statistics& offload_stats() const noexcept { return offload_stats_; }
  /// The copy engine's last CUDA error (after `copy_failed`).
  const copy_engine& copier() const noexcept { return copier_; }

  /// Copies the live bytes of `t` to host memory, then unmaps and releases its granules.
  offload_status offload(tag t) noexcept { return offload_impl(t.value, true, true); }
  /// Unmaps and releases the granules of `t` without copying (`restore` maps fresh memory).
  offload_status discard(tag t) noexcept { return offload_impl(t.value, false, true); }
  /// Offloads every resident tag with live chunks (one full reclaim when any was). Stops at the
  /// first failure and returns it (tags offloaded before stay offloaded).
  offload_status offload_all() noexcept;
  /// Maps the granules of an offloaded or discarded tag again, at the same addresses, and copies
  /// the host copy back (free mapped granules are released when the capacity needs it). On
  /// failure nothing is mapped and the host copy is kept: it can be retried.
  offload_status restore(tag t) noexcept;

  void deallocate(block b) noexcept { (void)try_deallocate(b); }

  /// Checked deallocation (`checked_deallocating_allocator`): frees `b` and returns true when it
  /// is a live block of this arena (or empty); returns false for a misuse, which is ignored and
  /// reported as the class comment describes.
  bool try_deallocate(block b) noexcept;
  /// What `try_deallocate(b)` would refuse `b` as now, or `none` (`free_screening_allocator`):
  /// O(1) for a live block, a bad one as its refused free costs.
  misuse free_misuse(block b) const noexcept {
    if (b.ptr == nullptr) return misuse::none;
    const auto addr = reinterpret_cast<std::uintptr_t>(b.ptr);
    const std::uint32_t c = map_.find(pool_, addr);
    if (c == detail::best_fit_npos) return classify_unknown(addr);
    if (pool_[c].requested() != b.size) return misuse::wrong_size;
    if (pending_plans_ != 0 && pending_chunk(addr)) return misuse::foreign_pointer;  // planned, not handed out
    return misuse::none;
  }

  // ---- capabilities ----------------------------------------------------------------------------

  /// Whether the block's address lies in the reserved range.
  bool owns(block b) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(b.ptr);
    return a >= base_ && a < end_;
  }

  /// Unmaps and releases every free mapped granule; returns how many bytes went back.
  std::size_t release() noexcept {
    const std::size_t released = release_free_beyond(0);
    peak_touched_ = touched_granules();
    return released;
  }

  /// `release()` without the backend's unmaps and releases (`detaching_release_allocator`, over a
  /// `thread_safe_vmm`), so that `synchronized` and `sharded` return memory without their lock:
  /// up to `detached_segments::capacity` free mapped granules leave the books into `out` (counted
  /// as unmapped and released) and are marked releasing; `out.give_back()` makes the calls. A
  /// placement that needs a releasing granule meanwhile waits (holding the caller's lock) until the
  /// batch's calls are done, as does a request the capacity cannot serve before they are. Returns
  /// false while it took any (the caller calls again, which closes the batch), true when none was
  /// left (but granules stranded in block-sized pieces still in use); while another thread's batch
  /// is in flight, it releases the rest `release()`'s way. The caller gives a batch back before
  /// its own next call on the arena (a call that needed its granules would wait for itself), as
  /// `detached_segments::give_back_all` does.
  bool release_detached(detached_segments& out) noexcept
    requires thread_safe_vmm<Vmm>;

  /// Unmaps and releases free mapped granules, least recently freed first (with `keep_all` the
  /// highest), until at most `keep_bytes` of them stay, and no more than the release rule keeps;
  /// returns how many bytes went back (fewer when the rest lie in block-sized pieces in use).
  std::size_t release_free_beyond(std::size_t keep_bytes) noexcept;

  /// A say in what stays mapped, for a composite of arenas on one backend (`granule_segregator`):
  /// before an allocation (or a planned growth) maps granules, the arena asks `bytes(context,
  /// arena, about_to_map)` for the most free mapped bytes it may keep and keeps the least of that
  /// and what its own rule keeps (`restore` and `allocate_keeping_cache` do not ask, as they do
  /// not trim). The call may release other arenas' free granules, not this one's. A setting of the
  /// object, not of its contents: a move does not carry it (an arena moved into keeps its own;
  /// one constructed by a move has none).
  struct free_keep_limit {
    std::size_t (*bytes)(void* context, const void* arena, std::size_t about_to_map) noexcept = nullptr;
    void* context = nullptr;
  };
  void set_free_keep_limit(free_keep_limit limit) noexcept { keep_limit_ = limit; }

  /// Mapped bytes (granules with physical memory behind them).
  std::size_t reserved_bytes() const noexcept { return mapped_ << granule_shift_; }
  std::size_t mapped_bytes() const noexcept { return mapped_ << granule_shift_; }
  /// Bytes of granules mapped with no allocated chunk touching them (what `release()` frees).
  std::size_t free_mapped_bytes() const noexcept { return free_mapped_ << granule_shift_; }
  /// Bytes of the mapped granules that allocated chunks touch (`mapped_bytes() -
  /// free_mapped_bytes()`).
  std::size_t touched_bytes() const noexcept { return touched_granules() << granule_shift_; }
  /// Free mapped bytes in block-sized pieces a live chunk still touches elsewhere: neither
  /// `release()` nor capacity pressure can give them back until that chunk goes (0 without
  /// `block_sized_pieces`). O(granules).
  std::size_t stranded_free_bytes() const noexcept;
  allocator_counters counters() const noexcept { return counters_; }

  /// Calls `visit(const block_info&)` for every piece of the used part of the reserved range
  /// (`used_address_space()`: up to the end of the highest granule ever mapped) in address order:
  /// allocated chunks (rounded extent, requested size), then the free chunks split where their
  /// granules change between mapped (`block_state::free`) and unmapped (`block_state::unmapped`).
  /// One segment: that used part. The untouched addresses above it are left out, so that a
  /// snapshot draws the heap, not a terabyte of reservation.
  template <class F>
  void for_each_block(F&& visit) const;

  /// Rounded bytes of the allocated chunks (so `reserved_bytes() == bytes_in_use() + free_bytes()`).
  /// Excludes the chunks of offloaded or discarded tags (`offloaded_bytes()`): no memory behind them.
  std::size_t bytes_in_use() const noexcept { return in_use_ - offloaded_in_use_; }
  /// Rounded bytes of the live chunks of offloaded or discarded tags.
  std::size_t offloaded_bytes() const noexcept { return offloaded_in_use_; }
  std::size_t requested_bytes() const noexcept { return requested_; }
  /// Mapped bytes not in allocated chunks.
  std::size_t free_bytes() const noexcept { return reserved_bytes() - bytes_in_use(); }
  /// The largest run of free mapped bytes (the largest request at alignment <= rounding that
  /// could be served without a backend call, if best fit chose it). O(chunks + granules).
  std::size_t largest_free_block() const noexcept;
  /// The backend's capacity: mapped bytes never exceed it (SIZE_MAX when unlimited; shared with
  /// other users of the backend).
  std::size_t bytes_reservable_limit() const noexcept { return vmm_.capacity(); }
  /// Bytes of addresses reserved.
  std::size_t address_space() const noexcept { return end_ - base_; }
  /// Bytes of the reserved range up to the end of the highest granule ever mapped (what
  /// `for_each_block` reports).
  std::size_t used_address_space() const noexcept {
    return std::min<std::size_t>(granules_.size() << granule_shift_, end_ - base_);
  }
  std::size_t granularity() const noexcept { return opts_.granularity; }
  std::size_t free_chunk_count() const noexcept { return index_.size(); }
  std::size_t allocated_chunk_count() const noexcept { return map_.size(); }
  misuse_counts misuses() const noexcept { return misuses_; }
  const options& get_options() const noexcept { return opts_; }

  /// Verifies every invariant in O(chunks + granules): chunks tile the range, no two free
  /// neighbours, index and map complete, sums agree; every granule an allocated chunk touches is
  /// mapped, marked touched, with the right count of chunks ending in it; the free mapped granules
  /// are exactly those on the least-recently-freed list; mapped and free mapped counts agree.
  bool check_invariants() const noexcept;

  Vmm& vmm() noexcept { return vmm_; }
  const Vmm& vmm() const noexcept { return vmm_; }

 private:
  static constexpr std::uint32_t none = detail::best_fit_chunk::none;
  static constexpr std::uint32_t no_granule = 0xFFFFFFFFu;
  static constexpr std::size_t max_granules = std::size_t{0xFFFFFFF0u};
  /// Granules the table has room for from the start (32 GiB at 2 MiB; 576 KiB of host addresses).
  static constexpr std::size_t initial_granule_table = 16384;
  /// One granule of the range.
  struct granule {
    std::uint64_t piece = 0;           ///< the backend's id of the physical piece mapped here; 0: unmapped
    std::uint32_t piece_first = 0;     ///< the piece's first granule (while mapped)
    std::uint32_t piece_granules = 0;  ///< how many granules the piece spans (while mapped; > 1: block-sized)
    std::uint32_t older = no_granule;  ///< least-recently-freed list (free mapped granules only)
    std::uint32_t newer = no_granule;
    bool fresh : 1 = false;      ///< mapped by the allocation under way (undone if it fails)
    bool pending : 1 = false;    ///< a planned growth maps it outside the lock (unmapped in the books until its commit)
    bool releasing : 1 = false;  ///< detached by `release_detached`: unmapped outside the lock, not reused until then
    std::uint16_t tag = 0;       ///< the tag of the chunks touching it (meaningful while live != 0)
  };
  /// One live chunk of an offloaded tag and where its bytes are in the host copy.
  struct saved_chunk {
    std::uintptr_t addr = 0;
    std::size_t bytes = 0;
    std::size_t offset = 0;
    bool live = true;  ///< false once freed while offloaded: not copied back
  };
  /// A tag's state and, while offloaded, its host copy and the live chunks saved in it.
  struct tag_record {
    tag_state state = tag_state::resident;
    std::byte* host = nullptr;
    std::size_t host_bytes = 0;
    std::size_t in_use = 0;  ///< rounded bytes of its live chunks while not resident
    std::vector<saved_chunk> chunks;
  };
  static options normalised(options o, const Vmm& vmm) noexcept;
  void reserve_initial() noexcept;

  // ---- chunks and placement (virtual_arena/placement.hpp) --------------------------------------
  /// With `plan` (`allocate_or_plan`): granules to map are planned instead, and a failure is not
  /// counted (the caller calls `allocate`). With `only_held` (`allocate_in_held_granules`, no tags
  /// in use, no growth pending): an empty block, nothing changed and nothing counted, when the
  /// block would add a granule to those live chunks touch.
  /// With `cached_only` (`allocate_cached`): a place on mapped granules only (best fit's, else
  /// `allocate_on_mapped_granules`), no backend call, no piece given back; else an empty block,
  /// nothing changed and nothing counted.
  [[gnu::always_inline]] block allocate_impl(std::size_t bytes, std::size_t alignment, bool may_release,
                                             std::uint16_t t, growth_plan* plan = nullptr, bool only_held = false,
                                             bool cached_only = false) noexcept;
  /// The last resort before a request fails for want of physical memory, and a tagged block's
  /// when its usual places share a granule with another tag: every free chunk is tried (its front
  /// and back, each also on a granule boundary, and with tags the front past other tags' pieces)
  /// for the place that adds the fewest granules no live chunk touches, the lowest of equals; the
  /// block goes there when those fit. O(chunks), only on this path.
  [[gnu::cold]] [[gnu::noinline]] block allocate_on_fewest_new_granules(std::size_t rounded, std::size_t bytes,
                                                                        std::size_t alignment, std::uint16_t t,
                                                                        bool may_release,
                                                                        std::uintptr_t tried) noexcept;
  /// The first start in free chunk `node`, on a `coarse + 1` boundary, past the block-sized pieces
  /// of other tags at its front (a piece mapped ahead of a tag's heap); 0 when a live chunk of
  /// another tag is in the way. Else the last chunk's back would be the only place left: the top
  /// of the reservation, with a granule table spanning all of it.
  std::uintptr_t past_foreign_pieces(const detail::best_fit_chunk& node, std::uint16_t t,
                                     std::uintptr_t coarse) const noexcept;
  /// `allocate_cached` when best fit's place needs a granule mapped: the first free chunk's front or
  /// back, or run of whole granules inside it, that lies on mapped granules only; else an empty
  /// block. O(chunks + granules), only on this path.
  [[gnu::cold]] [[gnu::noinline]] block allocate_on_mapped_granules(std::size_t rounded, std::size_t bytes,
                                                                    std::size_t alignment) noexcept;
  /// What placing a block on granules [first, last] costs, compared in this order: granules no
  /// live chunk touches yet (physical memory the block adds), granules spanned (a block that
  /// straddles one more granule than it must keeps it after its neighbours go), granules
  /// without a physical piece (driver calls now).
  struct placement_cost {
    std::size_t untouched = 0, spanned = 0, unmapped = 0;
    bool operator<(const placement_cost& o) const noexcept {
      return std::tie(untouched, spanned, unmapped) < std::tie(o.untouched, o.spanned, o.unmapped);
    }
  };
  static constexpr std::size_t not_counted = std::numeric_limits<std::size_t>::max();
  /// The cost of a block at `start` inside a free chunk, O(1): granules strictly inside the block
  /// lie inside the free chunk, so no live chunk touches them; only its first and last granule
  /// can be shared. Unmapped granules are counted only when needed (`count_unmapped`).
  placement_cost cost_at(std::uintptr_t start, std::size_t rounded) const noexcept;
  [[gnu::always_inline]] std::size_t count_unmapped(std::uintptr_t start, std::size_t rounded) const noexcept;
  /// Where in free chunk `c` the block goes. Best fit's place is its front (`front`); when that
  /// adds granules, its front and back ends, each also moved to a granule boundary, are compared
  /// by `placement_cost` and the cheapest taken (the earliest of equals): a block uses granules
  /// live chunks already touch before untouched ones, does not straddle a granule it need not
  /// (a block of whole granules, or of nearly one, placed off a boundary holds one more), and
  /// uses free mapped granules before unmapped ones. The back is tried only for a block of at
  /// most a granule, which may fit in the granule the next live chunk touches; a larger block
  /// there would leave the chunk's front a hole. Nor is it tried in the last chunk (the untouched
  /// rest of the range): blocks stay low.
  std::uintptr_t placement_in(std::uint32_t c, std::uintptr_t front, std::size_t rounded,
                              std::size_t alignment) const noexcept;
  /// Where in free chunk `c` (best fit's) a block goes: its front, aligned, unless `placement_in`
  /// finds a place that adds fewer granules.
  std::uintptr_t place_in(std::uint32_t c, std::size_t rounded, std::size_t alignment) const noexcept;
  /// `at` moved up to the next boundary of a granule (of `alignment`, when that is larger).
  std::uintptr_t up_to_granule(std::uintptr_t at, std::size_t alignment) const noexcept {
    const std::uintptr_t mask = std::max(alignment, opts_.granularity) - 1;
    return (at + mask) & ~mask;
  }
  /// `placement_in`'s comparison: the front, the front on a granule boundary and, for a block of at
  /// most a granule, the back and the back on a boundary, by `placement_cost`.
  [[gnu::noinline]] std::uintptr_t placement_among(std::uint32_t c, std::uintptr_t front, std::size_t rounded,
                                                   std::size_t alignment) const noexcept;
  /// Best fit's free chunk for `rounded` bytes at `alignment` (one of `need` bytes, the padding
  /// included, when the smallest cannot be aligned); npos when none holds it.
  [[gnu::always_inline]] std::uint32_t find_fit(std::size_t rounded, std::size_t need,
                                                std::size_t alignment) const noexcept;
  /// Whether free chunk `c` holds `rounded` bytes from its first address aligned to `alignment`.
  bool fits_aligned(std::uint32_t c, std::size_t rounded, std::size_t alignment) const noexcept;
  /// Nothing fits: reserve more addresses, kept only when they extend the range in place.
  [[gnu::noinline]] std::uint32_t grow_for(std::size_t rounded, std::size_t need, std::size_t alignment) noexcept;
  /// Hands out free chunk `c` for a request whose block starts at `start` (inside `c`, with
  /// `rounded` bytes room): the bytes in front stay a free chunk, the rest behind becomes one.
  [[gnu::always_inline]] block carve(std::uint32_t c, std::uintptr_t start, std::size_t rounded,
                                     std::size_t bytes) noexcept;
  void link(std::uint32_t first, bool first_free, std::uint32_t second, bool second_free) noexcept {
    pool_[first].set_next(second, second_free);
    pool_[second].set_prev(first, first_free);
  }
  /// Merges the chunk after `c` into `c` (both free, the index already updated).
  void absorb_next(std::uint32_t c) noexcept;
  /// Frees allocated chunk `c` at `addr` (taken off the address map): merged with its free
  /// neighbours; its granules lose a user, those left with none are free mapped, then trimmed.
  void free_chunk(std::uint32_t c, std::uintptr_t addr) noexcept;
  /// Frees chunk `c` at `addr` (taken off the address map; not counted in use) without the
  /// counts: merged with its free neighbours, its granules lose a user.
  [[gnu::always_inline]] void merge_free(std::uint32_t c, std::uintptr_t addr) noexcept;
  /// Why a free of an address that starts no allocated chunk is refused: a double free when a free
  /// chunk starts there, else a foreign (or interior) pointer.
  [[gnu::cold]] misuse classify_unknown(std::uintptr_t addr) const noexcept;
  [[gnu::cold]] void report(misuse kind, block b) noexcept {
    detail::report_misuse(misuses_, kind, b, opts_.on_misuse, opts_.misuse_context, "virtual_arena");
  }

  // ---- the granule books (virtual_arena/granules.hpp) ------------------------------------------
  std::size_t granule_of(std::uintptr_t addr) const noexcept { return (addr - base_) >> granule_shift_; }
  /// Whether an allocated chunk touches granule `g` (in the table).
  bool touched(std::size_t g) const noexcept { return touched_bits_.test(g); }
  /// Records granules [first, first + n) as mapped to the piece `id` (`fresh`: by the allocation
  /// under way). The bit table and the count change once per piece, not granule by granule.
  void set_piece_run(std::size_t first, std::size_t n, std::uint64_t id, bool fresh) noexcept;
  /// Records the piece on granules [first, first + n) as unmapped (`set_piece_run` undone).
  void clear_piece_run(std::size_t first, std::size_t n) noexcept;
  /// Whether mapped granule `g` lies in a block-sized piece (one that spans several granules).
  bool in_block_sized_piece(std::size_t g) const noexcept {
    return g < granules_.size() && granules_[g].piece != 0 && granules_[g].piece_granules > 1;
  }
  /// Whether a live chunk touches any granule of the piece mapped at granule `g`.
  bool piece_in_use(std::size_t g) const noexcept;
  /// Takes the granules of the piece mapped at granule `g`, which no live chunk touches, off the
  /// free books (before the piece goes back or is handed on).
  void unlist_free_piece(std::size_t g) noexcept;
  /// What the backend could give at most if every free mapped granule went back.
  std::size_t headroom() const noexcept;
  /// `headroom()` in whole granules.
  std::size_t headroom_granules() const noexcept { return headroom() >> granule_shift_; }
  void* granule_address(std::size_t g) const noexcept { return reinterpret_cast<void*>(base_ + (g << granule_shift_)); }
  /// Room for what one allocation adds: three nodes (front padding, the rest, a growth), one
  /// address-map entry. False when host memory ran out.
  bool reserve_metadata() noexcept;
  [[gnu::noinline]] bool grow_metadata() noexcept;
  /// Room in the granule table for `n` granules, reserved when the range is: host addresses, whose
  /// pages are touched only as the table covers more. A cold heap's table then grows without being
  /// reallocated and copied (and fresh pages faulted in) at each doubling. Without the room (host
  /// memory short), growth reallocates.
  void reserve_granule_table(std::size_t n) noexcept;
  /// Makes the granule table cover granules [0, n).
  bool cover_granules(std::size_t n) noexcept;
  [[gnu::noinline]] bool grow_granule_table(std::size_t n) noexcept;
  /// Counts the new chunk among the users of granules [first, last] (free mapped ones are in use
  /// again); returns how many have no physical piece (`map_new_granules` maps them, or a plan;
  /// `drop_user` undoes this). The block lies in a free chunk, so a chunk touching its
  /// first or last granule ends there (`chunk_ends_` counts them), and no chunk touches the granules
  /// strictly inside it: those are counted and marked a word of the bit tables per 64 granules.
  /// The last granule is counted even when it is the first (`chunk_ends_` 2 for a chunk on one
  /// granule): whether a block crosses a granule boundary is as random as its size, and a branch
  /// on it mispredicts.
  [[gnu::always_inline]] std::size_t add_user(std::size_t first, std::size_t last, std::uint16_t t) noexcept;
  /// `add_user` at its first or last granule `g`; a missing piece counts in `to_map` when
  /// `distinct` (not the first granule again).
  [[gnu::always_inline]] void add_end_user(std::size_t g, std::uint16_t t, std::size_t& to_map, std::size_t& reused,
                                           bool distinct) noexcept;
  /// Takes an allocated chunk's user off granules [first, last] (freed, or its allocation undone):
  /// the granules strictly inside it, and its first and last when no other chunk ends there, are
  /// untouched again; those mapped are free mapped (listed newest, in address order). Returns how
  /// many.
  [[gnu::always_inline]] std::size_t drop_user(std::size_t first, std::size_t last) noexcept;
  /// `drop_user` at its first or last granule: 1 when that leaves it free mapped.
  [[gnu::always_inline]] std::size_t drop_end_user(std::size_t g) noexcept;
  // The least-recently-freed list of free mapped granules: freed at the newest end, unmapped
  // from the oldest. With `keep_all` there is no list: nothing goes back until the device runs
  // short or `release()`, and then the free mapped granules are found by a scan (highest address
  // first), so that allocations and frees do no list work per granule.
  bool lists_free_granules() const noexcept { return opts_.release_threshold != keep_all; }
  void unlist(std::size_t g) noexcept;
  void link_newest(std::size_t g) noexcept;
  void unlink(std::size_t g) noexcept;
  /// Takes free mapped pieces off the books, the first to go back first, until `n` granules
  /// went (or none is left), and hands each to `take(first granule, granules)`, which unmaps it
  /// or passes it on; returns how many granules went. A block-sized piece goes only whole, when
  /// no chunk touches any of its granules (those exist with `keep_all` only: no list).
  template <class F>
  std::size_t take_free(std::size_t n, F&& take) noexcept;
  /// Free mapped bytes kept: the most of `release_threshold`, a share of the granules live chunks
  /// touch (`release_threshold_divisor`) and what stays under the most granules touched at once
  /// (`keep_up_to_peak`), counting `about_to_map` granules as touched.
  std::size_t kept_free_bytes(std::size_t about_to_map = 0) const noexcept;
  /// What is kept as `to_map` granules are about to be mapped: the rule's, within the limit a
  /// composite set (`set_free_keep_limit`).
  std::size_t kept_free_bytes_before_map(std::size_t to_map) noexcept;
  /// Mapped granules that are not free mapped: those allocated chunks touch.
  std::size_t touched_granules() const noexcept { return mapped_ - free_mapped_; }
  void note_touched_peak() noexcept { peak_touched_ = std::max(peak_touched_, touched_granules()); }
  /// Unmaps the least recently freed granules until at most `keep_bytes` of free mapped remain.
  void trim(std::size_t keep_bytes) noexcept;
  /// Unmaps the least recently freed granules (with `keep_all` the highest) until `n` went;
  /// returns how many went (fewer when the rest lie in block-sized pieces still in use).
  std::size_t trim_count(std::size_t n) noexcept;

  // ---- physical pieces (virtual_arena/pieces.hpp) ----------------------------------------------
  enum class map_result { mapped, no_memory, map_failed };
  /// The driver calls of an allocate: `to_map` granules of [first, last] have no physical piece.
  [[gnu::noinline]] bool map_new_granules(std::size_t first, std::size_t last, bool may_release, std::size_t to_map,
                                          std::uintptr_t start, std::size_t rounded) noexcept;
  /// Frontier growth (`frontier_growth_divisor`): when granules [first, last] end the used range
  /// and the `to_map` unmapped ones are its last, maps them and the granules ahead
  /// (`granules_ahead`) as one piece; those ahead are free mapped. False, nothing changed, when
  /// none go ahead or the create or map failed (the caller then maps the block's own pieces).
  bool map_with_granules_ahead(std::size_t first, std::size_t last, std::size_t to_map) noexcept;
  /// How many granules frontier growth maps ahead of a block on granules [first, last] whose
  /// `to_map` unmapped granules are its last and end the used range: 1/divisor of the mapped
  /// granules (for a small heap `small_heap_granules_ahead`), while the backend then holds at most
  /// 1/16 of its capacity, within the reserved range. 0 when the block is not at the frontier,
  /// nothing fits ahead, or tags, a planned growth or a release batch are about (their granules
  /// could lie ahead); the granule table covers them when not 0.
  std::size_t granules_ahead(std::size_t first, std::size_t last, std::size_t to_map) noexcept;
  /// `frontier_growth_min_granules` for a heap whose 1/divisor (`ahead`) is fewer, while the
  /// backend then holds at most 1/`small_heap_share` of its capacity; `ahead` otherwise. Only
  /// small heaps ask, so the backend's getters stay off the path of a large one.
  std::size_t small_heap_granules_ahead(std::size_t ahead, std::size_t to_map) const noexcept;
  /// How many granules the backend can still create while it holds at most 1/`Share` of its
  /// capacity (the shares it is asked for: frontier growth's 16, `small_heap_share` below and
  /// `edge_share`).
  template <std::size_t Share>
  std::size_t granules_within_share() const noexcept {
    const std::size_t bound = vmm_.capacity() / Share, held = vmm_.physical_bytes();
    return held < bound ? (bound - held) >> granule_shift_ : 0;
  }
  /// Small enough that the pieces made while the heap was small do not pin free granules where
  /// memory runs short (the smallest device needed stays as without them).
  static constexpr std::size_t small_heap_share = 128;
  /// Maps the `to_map` unmapped granules of a chunk at `start` (`rounded` bytes on granules
  /// [first, last]), as `allocate` and `restore` do. Block-sized pieces: the unmapped granules it
  /// covers whole take one create and one map a run; an edge granule it covers in part gets its
  /// own piece, since a neighbour may come to share it and would then pin the run (unless
  /// `edges_join_run`: the run spans it too). The device short: with `may_release`, free pieces
  /// go back (`make_room`) and a run is tried once more, then granule by granule; without, a run
  /// whose create failed fails the call. On failure what it mapped is unmapped again, and the
  /// result says whether memory or a map failed.
  map_result map_chunk_granules(std::size_t first, std::size_t last, std::uintptr_t start, std::size_t rounded,
                                bool may_release, std::size_t& to_map, bool& retried) noexcept;
  /// Makes room for `to_map` granules the backend would not create: waits for a release batch in
  /// flight, else unmaps free pieces (oldest first, with `keep_all` highest first) and counts the
  /// request's first retry. False when nothing could go back (what is left lies in block-sized
  /// pieces still in use).
  bool make_room(std::size_t to_map, bool& retried) noexcept;
  /// Once more than half of the backend's capacity is held, a wholly free block-sized piece that
  /// a block at `start` (`rounded` bytes) would not cover whole goes back first: the rest of it,
  /// or, when the block ends inside its edge granule, all of it while a neighbour shares that
  /// granule, would stay mapped, stranded, and memory may run short. Below that the piece is
  /// reused as it is, without a driver call, unless more than 1/`piece_leftover_share` of the
  /// capacity of it would stay free while more than 1/`leftover_held_share` is held.
  void release_pieces_partly_reused(std::uintptr_t start, std::size_t rounded) noexcept;
  /// Whether granule `g` may lie in a wholly free block-sized piece: none if a live chunk touches
  /// `g` (its piece is in use).
  bool maybe_in_free_piece(std::size_t g) const noexcept;
  /// Below this share of the capacity held, no piece goes back for `piece_leftover_share`: a heap
  /// that small seldom comes to need the granules a piece strands, and calls are saved.
  static constexpr std::size_t leftover_held_share = 8;
  [[gnu::noinline]] void release_free_pieces_partly_reused(std::uintptr_t start, std::size_t rounded, std::size_t first,
                                                           std::size_t last) noexcept;
  /// The granules of a block at `start` (`rounded` bytes on granules [first, last]) whose unmapped
  /// runs take one piece each: those it covers whole, [from, to), and its edge granules too when
  /// `edges_join_run`; empty without block-sized pieces and for a block on one granule.
  std::pair<std::size_t, std::size_t> whole_run_span(std::size_t first, std::size_t last, std::uintptr_t start,
                                                     std::size_t rounded) const noexcept;
  /// An edge granule a block covers in part gets a piece of its own, since a neighbour may come to
  /// share it and would then pin the block's run after the block goes. While the backend holds
  /// little, that costs calls for nothing: with frontier growth, a block's run takes its edge
  /// granules too while the backend, with the block's `granules`, then holds at most
  /// 1/`edge_share` of its capacity, so that such pieces total at most that (a larger share lets
  /// pinned pieces raise the smallest device needed).
  bool edges_join_run(std::size_t granules) const noexcept {
    return opts_.frontier_growth_divisor != 0 && granules <= granules_within_share<edge_share>();
  }
  static constexpr std::size_t edge_share = 64;
  /// Maps granules [g, g + n) (none mapped) with one piece; on failure nothing changed, and the
  /// result says whether the create or the map failed.
  map_result map_whole_run(std::size_t g, std::size_t n) noexcept;
  /// Unmaps and releases the piece mapped at granule `g`, every granule it spans; returns how many.
  std::size_t unmap_piece(std::size_t g) noexcept;

  // ---- planned growth and detached release (virtual_arena/planned_growth.hpp) ------------------
  /// A granule a planned growth maps outside the lock (no placement may touch it meanwhile).
  bool pending_granule(std::size_t g) const noexcept { return g < granules_.size() && granules_[g].pending; }
  /// Whether the allocated chunk at `addr` belongs to a planned growth not committed yet (its block,
  /// or the chunk that holds its granules ahead).
  bool pending_chunk(std::uintptr_t addr) const noexcept;
  /// Pieces `release_detached` took off the books, unmapped and released by `give` (the
  /// caller's `detached_segments::give_back`, no lock held; `block::size` carries the entry).
  struct release_batch {
    static constexpr std::size_t capacity = detached_segments::capacity;
    struct entry {
      std::uint64_t piece = 0;
      std::uint32_t first = 0, granules = 0;
    };
    Vmm* vmm = nullptr;
    std::size_t granularity = 0;
    entry entries[capacity]{};
    std::size_t count = 0;
    std::atomic<std::size_t> remaining{0};  ///< calls not yet made
    bool active = false;                    ///< its granules are marked releasing

    static void give(void* self, block b) noexcept {
      release_batch& batch = *static_cast<release_batch*>(self);
      const entry& e = batch.entries[b.size];
      batch.vmm->unmap(b.ptr, e.granules * batch.granularity);
      batch.vmm->release(physical_memory{e.piece, e.granules * batch.granularity});
      if (batch.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) batch.remaining.notify_all();
    }
    std::size_t granules_releasing() const noexcept {
      std::size_t n = 0;
      for (std::size_t i = 0; i < count; ++i) n += entries[i].granules;
      return n;
    }
  };
  /// Closes a release batch whose calls are done: its granules are plain unmapped ones again.
  void finish_release_batch() noexcept;
  /// Waits (the caller's lock held) until the batch in flight is unmapped, then closes it; false
  /// when there was none. Its thread needs no lock for that, so this ends.
  bool wait_for_release() noexcept;
  /// A block on granules [first, last] must not map a granule still being released.
  void wait_if_releasing(std::size_t first, std::size_t last) noexcept;
  /// Physical memory a planned growth creates and maps without the lock (`plan.fetch()` runs
  /// `map_all`); the arena owns these records and reuses them, so that after warm-up a growth
  /// allocates no host memory.
  struct planned_mapping {
    /// Pending granules mapped with one piece: a granule each, or with block-sized pieces a run
    /// the block covers whole (the rule of `map_new_granules`), or its granules at the frontier
    /// and those ahead.
    struct run {
      std::uintptr_t at = 0;
      std::size_t granules = 0;
      std::uint64_t piece = 0;  ///< what was mapped there (the first `mapped` runs)
    };
    Vmm* vmm = nullptr;
    std::size_t granularity = 0;
    std::vector<run> runs;
    std::size_t mapped = 0;        ///< runs mapped
    std::size_t map_failures = 0;  ///< pieces created whose map failed (released at once)
    std::uintptr_t start = 0;      ///< the carved chunk
    std::size_t rounded = 0, bytes = 0;
    /// Frontier growth: the chunk carved over the granules ahead of the block (the last run maps
    /// them too) and held by the plan, so that no other placement uses them before the commit
    /// frees it.
    std::uintptr_t ahead_at = 0;
    std::size_t ahead_bytes = 0;  ///< 0: none
    std::uint16_t tag = 0;
    bool active = false;

    /// The backend calls, in order, stopping at the first failure (no lock held: only this record
    /// and the thread-safe backend are touched). The block when every granule was mapped.
    static block map_all(void* self, std::size_t, std::size_t) noexcept {
      planned_mapping& m = *static_cast<planned_mapping*>(self);
      for (; m.mapped < m.runs.size(); ++m.mapped) {
        run& r = m.runs[m.mapped];
        const physical_memory piece = m.vmm->create(r.granules * m.granularity);
        if (!piece) break;
        if (!m.vmm->map(reinterpret_cast<void*>(r.at), piece)) {
          m.vmm->release(piece);
          ++m.map_failures;
          break;
        }
        r.piece = piece.id;
      }
      return m.mapped == m.runs.size() ? block{reinterpret_cast<void*>(m.start), m.bytes} : block{};
    }
  };
  /// `allocate_or_plan`'s growth: the block at `start` in free chunk `c` needs `to_map` granules
  /// of [first, last] mapped (the users already counted). Carves the chunk (not counted in use
  /// until the commit), marks those granules pending and fills `plan`; or, when the capacity
  /// cannot hold them or host memory for the record runs out, undoes the users and leaves `plan`
  /// empty. Returns an empty block either way.
  [[gnu::noinline]] block plan_mapping(growth_plan& plan, std::uint32_t c, std::uintptr_t start, std::size_t rounded,
                                       std::size_t bytes, std::size_t first, std::size_t last,
                                       std::size_t to_map) noexcept;
  /// Frontier growth for a planned growth whose block (carved, on granules [first, last]) ends the
  /// used range: carves a chunk over the granules ahead from the free chunk after the block (the
  /// range's last), held by the plan and not counted in use, and returns how many; 0 when none go
  /// ahead or host memory for the chunk ran out.
  std::size_t plan_granules_ahead(std::size_t first, std::size_t last, std::size_t to_map) noexcept;
  /// A record not in use, sized for `n` granules; null when host memory ran out.
  planned_mapping* idle_record(std::size_t n) noexcept;

  // ---- tags and offload (virtual_arena/tags.hpp) -----------------------------------------------
  /// Whether a chunk of tag `t` must not touch granule `g`: a live chunk of another tag touches
  /// it, or it lies in a block-sized piece that chunks of another tag use. Offloading a tag
  /// unmaps its pieces whole, so a piece serves one tag at a time; a wholly free piece serves any
  /// (a block's granules strictly inside it are free, so a block whose first and last granule
  /// pass this check covers any other piece it meets whole).
  bool foreign(std::size_t g, std::uint16_t t) const noexcept;
  /// The free chunk right after the tag's last block, when the block fits there without touching
  /// a granule of another tag (keeps a tag's small blocks together instead of taking a granule
  /// each). {npos, 0} otherwise.
  [[gnu::cold]] std::pair<std::uint32_t, std::uintptr_t> beside_own_tag(std::uint16_t t, std::size_t rounded,
                                                                        std::size_t alignment) noexcept;
  /// A free chunk holding whole free granules for the block (from a granule boundary, or the
  /// alignment's when coarser): no chunk of another tag can share them.
  [[gnu::cold]] std::uint32_t find_isolated(std::size_t rounded, std::size_t alignment) noexcept;
  offload_status offload_impl(std::uint16_t t, bool copy, bool single) noexcept;
  /// Unmaps and releases every mapped granule a live chunk of tag `t` touches; returns how many.
  std::size_t unmap_tag(std::uint16_t t) noexcept;
  /// A chunk of an offloaded tag is freed: its saved bytes are not copied back.
  [[gnu::cold]] void forget_saved(std::uint16_t t, std::uintptr_t addr, std::size_t size) noexcept;
  void* host_allocate(std::size_t bytes) noexcept;
  void host_deallocate(void* p, std::size_t bytes) noexcept;
  void drop_host_copy(tag_record& rec) noexcept;

  // ---- walks, move and destruction (virtual_arena/state.hpp) -----------------------------------
  /// Walks the range as `for_each_block` reports it: visit(address, size, requested, state).
  template <class F>
  void for_each_piece(F&& visit) const;
  /// Unmaps and releases every granule and gives every address back.
  void give_everything_back() noexcept;
  void forget() noexcept;
  void take_state(virtual_arena& other) noexcept;

  // ---- data ------------------------------------------------------------------------------------
  Vmm vmm_;
  options opts_{};
  free_keep_limit keep_limit_{};  ///< the object's, not moved with its contents
  unsigned rounding_shift_ = 8;   ///< log2 of `rounding`
  unsigned granule_shift_ = 21;   ///< log2 of `granularity`
  detail::best_fit_free_index index_;
  detail::best_fit_chunk_pool pool_;
  detail::best_fit_address_map map_;
  std::vector<address_range> ranges_;  ///< what the backend reserved, contiguous, in address order
  std::vector<granule> granules_;      ///< granules [0, highest ever used], from `base_`
  /// By granule: allocated chunks whose first granule it is plus those whose last granule it is
  /// (`add_user`). Apart from the records, so that an allocate and a free touch 4 bytes a granule
  /// and the bit tables, not 32-byte records.
  std::vector<std::uint32_t> chunk_ends_;
  detail::bit_table mapped_bits_;   ///< by granule: a physical piece is mapped (piece != 0)
  detail::bit_table touched_bits_;  ///< by granule: an allocated chunk touches it
  std::uintptr_t base_ = 0;
  std::uintptr_t end_ = 0;           ///< end of the usable range (whole granules)
  std::uintptr_t reserved_end_ = 0;  ///< end of the last reservation (growth must start here)
  std::uint32_t head_ = none;        ///< the chunk at `base_` (it survives every merge)
  std::uint32_t tail_ = none;        ///< the chunk that ends at `end_`
  std::uint32_t oldest_ = no_granule;
  std::uint32_t newest_ = no_granule;
  std::size_t mapped_ = 0;        ///< granules mapped
  std::size_t free_mapped_ = 0;   ///< of which no allocated chunk touches (on the list)
  std::size_t peak_touched_ = 0;  ///< most granules touched at once since release(), as of a free
  std::size_t in_use_ = 0;
  std::size_t requested_ = 0;
  allocator_counters counters_{};
  misuse_counts misuses_{};
  std::vector<tag_record> tags_;             ///< by tag value; empty until a tag was offloaded or discarded
  std::size_t offloaded_in_use_ = 0;         ///< rounded bytes of live chunks of tags not resident
  std::vector<std::uintptr_t> last_of_tag_;  ///< by tag: the address of its last block (a hint; 0: none)
  bool tags_in_use_ = false;                 ///< a tag other than 0 was ever allocated with (else no granule check)
  bool trim_due_ = false;  ///< free mapped granules may pass what the rule keeps (a map or offload skipped the trim)
  std::vector<std::unique_ptr<planned_mapping>> plans_;  ///< planned growths' records (stable addresses, reused)
  std::size_t pending_plans_ = 0;                        ///< of which planned and not committed yet
  release_batch batch_;  ///< `release_detached`'s granules in flight (not moved: idle when the arena moves)
  tag current_tag_{};
  offload_statistics offload_stats_{};
  copy_engine copier_{};
};

}  // namespace alloy

// The member definitions, by subject.
#include <alloy/policy/virtual_arena/granules.hpp>
#include <alloy/policy/virtual_arena/pieces.hpp>
#include <alloy/policy/virtual_arena/placement.hpp>
#include <alloy/policy/virtual_arena/planned_growth.hpp>
#include <alloy/policy/virtual_arena/state.hpp>
#include <alloy/policy/virtual_arena/tags.hpp>
