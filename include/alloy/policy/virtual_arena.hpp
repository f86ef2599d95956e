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

/// `virtual_arena<Vmm>`: a coalescing best-fit heap on virtual memory that gives fragmented
/// memory back (docs/design.md#virtual-memory).
///
/// - Strategy: one long range of addresses is reserved from the backend (`address_space`) and
///   split into *chunks* as `best_fit_arena` splits a segment: a request is rounded up to a
///   multiple of `rounding` (default 256 B) and served by the smallest free chunk that holds it
///   (same index, same ties), the rest split off; a freed chunk merges at once with its free
///   address neighbours. Where inside that chunk the block goes is chosen by granules: when its
///   front would add granules, the front and the front moved to a granule boundary (and, for a
///   block of at most a granule, the back and the back moved to one) are compared, fewest
///   granules no live chunk touches first, then (blocks of whole granules, and of 3/4 of a
///   granule up to one) fewest granules spanned, then fewest unmapped (O(granules of the block /
///   64), only when granules are added): memory already held is used first, and such a block
///   does not straddle one granule more than it must. There is one range, so no boundary ever
///   keeps two free chunks apart.
///   At first the whole range is one free chunk; it is the largest, so best fit takes it last and
///   the used part of the range grows upward from its start. When nothing fits, the arena
///   reserves more addresses and keeps them only when they lie right after its range (it grows in
///   place); otherwise that request fails.
/// - Physical memory comes per *granule* (`granularity`, default the backend's: 2 MiB on GPUs):
///   every granule an allocated chunk touches is mapped, one physical piece per granule, so
///   that any wholly free granule anywhere can go back. A granule whose last allocated chunk
///   goes is *free mapped*: kept (ready for the next chunk there, no driver call) while free
///   mapped granules total at most the largest of `release_threshold` bytes (default 0),
///   1/`release_threshold_divisor` of the granules live chunks touch (default: no share) and,
///   with `keep_up_to_peak` (default), what keeps mapped granules within the most that live
///   chunks have touched at once since construction or the last `release()`. Beyond that the one
///   freed longest ago is unmapped and released (least recently freed first; a hot granule
///   stays). An allocate that needs new granules applies the same rule first, so mapped bytes
///   never pass the granules live chunks touch plus what is kept: memory the heap held a moment
///   ago stays for the next request, a heap at its steady state makes almost no driver calls,
///   and with the defaults the peak mapped is the peak of the touched granules. With
///   `release_threshold = keep_all` (`virtual_allocator`'s) nothing is unmapped until the device
///   runs short or `release()`, and no list is kept: those find the free mapped granules by a
///   scan (highest address first), so that allocations and frees do no list work per granule.
/// - Block-sized pieces (`block_sized_pieces`, with `keep_all` only; `virtual_allocator`'s): the
///   unmapped granules a block covers whole are mapped as one piece a run, an edge granule it
///   covers in part as a piece of its own (a neighbour may come to share it; with frontier
///   growth, while the backend holds at most 1/64 of its capacity, the run takes it too). A
///   driver takes about as long for a piece of many granules as for one, so a large block costs
///   one create and one map instead of one per 2 MiB. Such a piece goes back only whole: while a
///   chunk touches any of its granules, the free ones stay mapped (`stranded_free_bytes`;
///   `release()` and pressure skip them). So that they do not pin memory where it runs short,
///   once more than half of the capacity is held a block that would not cover a wholly free piece
///   whole (using some of its granules, or ending inside one, which a neighbour may then share)
///   releases it first and maps its own. A piece serves one tag at a time (see tags).
/// - Frontier growth (`frontier_growth_divisor`, with block-sized pieces; `virtual_allocator`'s:
///   1/32): a block whose unmapped granules end the used range maps 1/divisor of the mapped
///   granules more in its piece, while the backend then holds at most 1/16 of its capacity (a
///   heap too small for that to be `frontier_growth_min_granules`, 2, maps that many while the
///   backend holds at most 1/128: the small traces' first pass then makes 19-54 % fewer calls,
///   silmont fp32 and medium_128 inference 0.91-0.99x `default_allocator`'s time on an H200
///   instead of 1.21-1.68x). Each
///   such create adds about 1/divisor of the heap, so a growing heap makes at most about divisor
///   creates at its top each time it doubles (once 1/divisor of it is a granule), instead of one
///   or two a block (a fresh process's first pass pays each on a GPU); the granules ahead serve
///   the next blocks that grow the heap, and cost at most 1/divisor of the mapped bytes mapped
///   and not yet used. Such pieces go back only whole; made below 1/16 of the capacity, they
///   total at most that, so under pressure the rest of the heap is in block-sized pieces. Not for
///   tagged chunks or `restore` (those map block-sized pieces). A planned growth maps granules
///   ahead too when no other growth or release batch is pending; a chunk carved over them, held
///   by the plan and not handed out, keeps other placements off until its commit frees it.
/// - Driver calls (each one a backend call): an allocate maps the granules of its chunk that are
///   not mapped (a `create` and a `map` each, or each run with block-sized pieces, with granules
///   ahead at the frontier under frontier growth; none when its granules are mapped already), after
///   unmapping the oldest free granules the rule no longer keeps; a deallocate unmaps and
///   releases the granules the rule no longer keeps (an `unmap` and a `release` each);
///   `release()` does that for every free mapped granule (a whole piece at a time); growth calls
///   `reserve`; `offload` and `discard` unmap a tag's pieces and `restore` maps them again (see
///   tags). Nothing else calls the backend.
/// - Capacity pressure: when `create` fails, free mapped granules anywhere in the heap are
///   unmapped and released (oldest first, with `keep_all` highest first; as many as the request
///   still needs, more if that was not enough) and `create` retried (`num_alloc_retries`; a
///   block-sized run is retried whole once, then granule by granule):
///   physical pages are fungible, a hole's pages serve a request elsewhere. When best fit's place
///   needs more new granules than the backend can give even so, every free chunk is tried (front
///   and back, each also on a granule boundary) for the place that adds the fewest granules no
///   live chunk touches (O(chunks), only then; counted as a retry). A request fails (empty block,
///   `num_ooms`) only when the granules of live chunks plus those the request needs exceed what
///   the backend can give (with block-sized pieces: plus the stranded free granules), and then at
///   once, without releasing the cache, when `capacity()` alone shows it. On failure everything is
///   undone: granules mapped for the request are unmapped and
///   released, nothing is carved. `allocate_keeping_cache` never releases free mapped granules to
///   retry, nor maps granule by granule a run whose create the backend refused.
/// - Metadata (host memory only; the managed memory is never touched): the chunk nodes, free index
///   and address map of `best_fit_arena` (detail/best_fit_index.hpp), a table of 32-byte granule
///   records (piece, its first granule and length, tag, links of the least recently freed list),
///   a 4-byte count per granule of the allocated chunks that begin there plus those that end
///   there, and two bit tables (mapped; touched by an allocated chunk), up to the highest granule
///   ever used. Only a block's first and last granule can be shared with another chunk, so those
///   two carry counts and the granules strictly inside it are marked in the bit tables; an
///   allocate and a free read and write the counts and the bit tables, not the records (without
///   tags and lists). They grow geometrically, before anything changes; after warm-up no call
///   allocates host memory. The granule tables have room for the first 16,384 granules from the
///   start (576 KiB of host addresses, pages touched only as the heap reaches them), so that a
///   cold heap does not reallocate and copy them as it grows.
/// - Complexity: as `best_fit_arena` for the chunk work (O(1) below 16384 rounding units,
///   O(log n) above), plus O(1 + granules the chunk touches / 64) for the mapping counts (a word
///   of the bit tables per 64 granules; one record each only for the granules put on or taken
///   off the least-recently-freed list, and none with `keep_all`) and one backend call per
///   granule mapped or unmapped. `for_each_block`, `largest_free_block` and `check_invariants`
///   are O(chunks + granules).
/// - Alignment: any power of two (larger than `rounding` by splitting off the padding in front,
///   which stays free and unmapped unless a neighbour needs its granule). Zero bytes: a unique
///   chunk of `rounding` bytes, returned with size 0.
/// - Misuse (docs/design.md#errors), as `best_fit_arena`: double, foreign and interior frees and a
///   wrong size are ignored, counted in `misuses()` and passed to `options::on_misuse`
///   (ALLOY_CHECKED builds print a line when there is no handler; alloy/misuse.hpp).
///   `try_deallocate` says whether a free was accepted, so that decorators count only accepted
///   frees.
/// - Capabilities: `owns` (the address lies in the reserved range), `release`, `reserved_bytes`
///   (= mapped bytes), `counters` (`num_device_alloc`/`num_device_free` = physical pieces created
///   and released, `num_maps`, `num_unmaps`, `num_ooms`, `num_alloc_retries`), `for_each_block`
///   (one segment, the used part of the reserved range; allocated chunks (`block_state::offloaded`
///   while their tag is offloaded or discarded: not in `bytes_in_use`), free bytes in mapped granules as
///   `block_state::free`, free bytes in unmapped granules as `block_state::unmapped`), and
///   `bytes_in_use`, `requested_bytes`, `free_bytes` (mapped and not in use, so reserved = in
///   use + free), `largest_free_block` (the largest free mapped run), `bytes_reservable_limit`
///   (the backend's capacity), `mapped_bytes`, `free_mapped_bytes`, `stranded_free_bytes`, `address_space`,
///   `allocate_keeping_cache`, `check_invariants`; for `granule_segregator`, `granules_added`
///   (the granules an allocate made now would add to those live chunks touch, O(1) as best fit),
///   `allocate_in_held_granules` (an allocate that serves only when that is 0), and for the
///   release rule it shares, `touched_bytes`, `release_free_beyond` (free granules released down
///   to a limit) and `set_free_keep_limit` (a hook an allocation that maps granules asks first
///   how much free memory the arena may keep). Not (yet)
///   `allocate_at` / `chunk_size` for a compacting defragmenter.
/// - Tags and offload (docs/design.md#offload, issue 21): every chunk carries a `tag` (per call, or
///   the current tag that `scoped_tag` sets). A granule's record holds the tag of the chunks that
///   touch it; chunks of different tags never share a granule: when best fit's chunk would put
///   the block in a granule a live chunk of another tag touches, the request is served instead
///   from the free chunk right after the tag's last block when it fits there, else from a free
///   chunk holding whole free granules (start rounded up to a granule). Only the
///   first and last granule of a block can be shared, so the check is O(1), and it is skipped
///   until a tag other than 0 was used. Block-sized pieces are made for every tag, and a block
///   whose first or last granule lies in a piece that chunks of another tag use goes elsewhere
///   too (the free chunks are scanned when the whole free granules found lie in one): its
///   interior granules are free, so it touches such a piece only by covering it whole, and the
///   chunks on a piece have one tag; a wholly free piece takes any tag. Offloading a tag unmaps
///   its pieces whole, free granules too, and never a piece another tag uses. `offload(t)`
///   copies the requested bytes of each live chunk of `t` to one host buffer (pinned
///   `cudaMallocHost` over a device-only backend,
///   `operator new` over host memory, or `options::host_allocate`) through `copy_engine`, then
///   unmaps and releases the tag's granules; `discard(t)` only unmaps; `restore(t)` maps them
///   again at the same addresses, in the pieces `allocate` would make for each live chunk (one a
///   run with block-sized pieces), releasing free mapped granules if it must, and copies back.
///   Free chunks are never copied. While a tag is not resident, allocations with it fail (empty
///   block, counted); freeing its blocks is allowed (the range is freed and not restored). Every
///   failure (host allocation, create, map, copy) leaves the tag as it was: these calls return
///   an `offload_status`. O(chunks + granules) each; the host buffer and one 24-byte record per
///   live chunk are the only host memory they take. Measured 2026-11-24 (the W1-like run below,
///   seeds 1-2, three runs each): untagged 169-178 ns/pair before and after tags (the check is
///   skipped); four tags drawn at random per request, the worst case, 2.2-3.9 us/pair and mapped
///   2.6x live (4x before a block was first tried right after its tag's last block, in the free
///   chunk there, before whole free granules are taken): tags are meant for groups allocated
///   apart (weights, cache, activations), where the rounding costs about a granule per run of a
///   tag. Offload copies exactly the requested bytes of the live chunks (copied ÷ live = 1.0 in
///   the randomized test). A sleep / wake cycle of `virtual_allocator` (`bench/virtual_memory
///   offload`, about 1.1 GiB in 103-109 blocks of two tags, three seeds): 176-180 creates + maps to
///   restore, 88-90 unmaps to offload, against 1,084-1,110 and 542-555 with a piece per granule.
/// - Destruction unmaps and releases every granule, live blocks or not, and gives the addresses
///   back. Thread safety: none (wrap in `synchronized`). Movable, not copyable; a moved-from arena
///   may only be destroyed or assigned to. Several arenas share one backend (and its capacity)
///   through `vmm_ref`.
/// - Planned growth (`growth_planning_allocator`, over a `thread_safe_vmm` only, such as
///   `vmm_ref<synchronized_vmm<V>>`): so that `synchronized` and `sharded` create and map new
///   granules without their lock. Under the lock, `allocate_or_plan` places the block as
///   `allocate` does, trims what the release rule no longer keeps, carves the chunk (not yet in
///   use: not in `bytes_in_use`, a free of its address is a misuse, `for_each_block` shows it
///   unmapped) and marks its unmapped granules *pending*; without the lock `plan.fetch()` creates
///   and maps them, in the pieces `allocate` would make, granules ahead included (touching only
///   a record the arena owns and reuses, and the backend); under the lock again
///   `allocate_planned` adds them to the books and hands the block out. Meanwhile no placement
///   touches a pending granule: a block whose first or last granule is pending goes to whole
///   free granules instead (O(1) check, only while a growth is pending), so two threads never
///   map one granule. When a create or map failed, the granules mapped are kept as free mapped
///   ones, the chunk is freed and the request served as `allocate` serves it, under the lock
///   (the release-and-retry under pressure is a last resort). Likewise `release()`
///   (`release_detached`): free mapped granules leave the books under the lock, marked releasing,
///   and are unmapped and released without it; a placement that needs one waits (holding the lock)
///   until its batch is done. Still under the lock: the trims of a free or an allocate,
///   address-range growth, tagged requests (no plan is made once a tag other than 0 was used or
///   any tag offloaded). Tested by test/policy/virtual_unlocked_growth_test.cpp (a gated map and
///   a gated unmap, granules ahead at the frontier, a model with four growths pending and
///   detached releases, a failure at every call index, threads; under ThreadSanitizer too) and
///   compositions_fuzz (`synchronized<virtual_allocator>`).
/// - Today's figures (alloy-replay, the 15 shipped traces, 2 MiB granules, bench/README.md
///   "Virtual memory"; ratios and call counts are deterministic): smallest device ÷ peak live
///   1.000-1.098 (geometric mean 1.019); with the defaults and no limit, peak mapped ÷ peak live
///   is the peak of the granules live chunks touch: 1.000-1.021 on the PyTorch traces but the two
///   silmont ones (1.098, 1.079; placements told every lifetime reach their granule bounds, 1.008
///   and 1.016: the rest is placing without knowing when blocks go) and 1.006-1.011 on
///   MiniMalloc, at 80-459 map + unmap calls per 1,000 operations on PyTorch and 8,300-20,200
///   on MiniMalloc (blocks of hundreds of MiB that move: each granule mapped where the block
///   lands). W1 (bench/virtual_memory, five seeds):
///   about 1.5x default_allocator's time a pair, mapped ÷ live 1.118-1.149 (fifteen seeds
///   1.109-1.154), 0.001 map calls per pair. Each map or unmap
///   is a system call over `host_vmm` and a driver call on a GPU (an H200: create + map about
///   36 us a piece whatever its size, unmap + release 27 us; a larger `granularity` makes fewer
///   of them, bench/README.md "On a real device"); what no release rule removes is the free
///   bytes in granules a live chunk also touches. Block-sized
///   pieces with `keep_all` (`virtual_allocator`'s; `bench/virtual_memory pieces`): 35.6 map +
///   unmap calls per 1,000 operations on a replay without a limit against 240 (geometric mean
///   over the traces; synthetic traces of six seeds, sixteenth session, 9.7 against 170), for
///   the same smallest device, 1.018x peak live (worst 1.098; MiniMalloc 1.008-1.012); at that
///   device 286 calls per 1,000 operations (a run retried whole under pressure; granule by
///   granule after a failed run, 585 when measured). With frontier growth of 1/32
///   (`virtual_allocator`'s), edge granules in the run below 1/64 of the capacity and two
///   granules ahead of a small heap below 1/128: 15.5 calls without a limit (18.0 at an 80 GiB
///   capacity; synthetic traces of eight seeds 4.8), every smallest device the same, peak mapped
///   without a limit 1.245x peak live against 1.231 (synthetic traces of six seeds 1.045 against
///   1.018).
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
    /// Addresses reserved at construction. 0: four times the backend's capacity, at least 1 GiB
    /// and at most 1 TiB (addresses are plentiful; best fit rarely needs more than twice the
    /// live bytes). When the backend refuses that many, an eighth is tried; when that fails too,
    /// every allocation tries again. The range grows in place when the system gives the
    /// addresses right after it.
    std::size_t address_space = 0;
    /// Bytes per physical piece; 0: the backend's. Otherwise rounded up to a power of two and to a
    /// multiple of the backend's.
    std::size_t granularity = 0;
    /// Free mapped bytes always kept for reuse before the least recently freed granule is
    /// unmapped (as `cudaMemPoolAttrReleaseThreshold`, whose default is 0 too). 0: with
    /// `keep_up_to_peak` below it needs the least memory for as few calls (bench/README.md).
    std::size_t release_threshold = 0;
    /// A free also keeps free mapped granules up to (bytes of the granules live chunks touch) ÷
    /// this (0, the default: no share). A share grows with the heap where a fixed threshold does
    /// not, but it comes on top of the touched granules: it can raise the peak mapped by 1/this.
    std::size_t release_threshold_divisor = 0;
    /// A free also keeps free mapped granules while the mapped granules stay within the most
    /// that live chunks have touched at once since construction or the last `release()`: what
    /// the heap held a moment ago its next requests need, and holding it never raises the peak
    /// mapped above the peak of the touched granules, the least any release rule reaches with
    /// this placement. Over the shipped traces and W1 it keeps the peak mapped at that least
    /// and makes fewer map + unmap calls than the 1/32 share it replaced as the default, which
    /// added up to 3 % to the peak (bench/README.md, Virtual memory). Off: only the threshold
    /// and the share decide.
    bool keep_up_to_peak = true;
    /// With `release_threshold = keep_all` only: the unmapped granules a block covers whole are
    /// mapped as one physical piece a run (one create and one map, where a GPU's driver takes
    /// about as long for a piece of many granules as for one: bench/README.md, "On a real
    /// device"), an edge granule it covers in part as its own (but see `frontier_growth_divisor`).
    /// A piece goes back only whole (see the class comment). Measured over the shipped traces:
    /// 35.5 map + unmap calls per 1,000 operations without a limit instead of 239 (geometric
    /// mean), for the same smallest device (1.023x peak live). For the chunks of every tag
    /// (`restore` maps them so too); planned growth maps the same runs.
    bool block_sized_pieces = false;
    /// With `block_sized_pieces` only: a block that maps new granules at the top of the used
    /// range maps 1/this of the mapped granules more in the same piece, while the backend then
    /// holds at most 1/16 of its capacity: a growing heap makes at most this many creates at its
    /// top each time it doubles, not one or two a block, and the free granules ahead serve the
    /// next blocks that grow the heap.
    /// Such a piece goes back only whole; together they hold at most 1/16 of the capacity, so
    /// pressure finds the rest in block-sized pieces. Not 0 also lets a block's run take the edge
    /// granules it covers in part while the backend holds at most 1/64 of its capacity: one piece
    /// where there were up to three (18.4 calls per 1,000 operations against 20.2 over the traces,
    /// the same smallest devices; bench/README.md, twentieth session). 0: off (`virtual_allocator`:
    /// 32, chosen in bench/README.md, "What changed on 2026-11-27 (fifteenth session)").
    std::size_t frontier_growth_divisor = 0;
    /// With `frontier_growth_divisor` only: a heap so small that 1/divisor of it is fewer granules
    /// maps this many ahead, while the backend then holds at most 1/128 of its capacity (so that
    /// such pieces, which go back only whole, pin little where memory runs short). Without it a
    /// heap under divisor granules (64 MiB at 1/32) maps nothing ahead and pays a create and a
    /// map for nearly every block that grows it: 2 takes the calls of the small PyTorch traces
    /// down by 19-54 %, 18.4 -> 15.5 per 1,000 operations over the traces without a limit, with
    /// the same peak mapped and smallest devices (bench/README.md, twenty-first session). 0: none.
    std::size_t frontier_growth_min_granules = 2;
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
        shift_(log2(opts_.rounding)),
        gshift_(log2(opts_.granularity)),
        index_(shift_),
        map_(shift_) {
    reserve_initial();
  }

  virtual_arena(const virtual_arena&) = delete;
  virtual_arena& operator=(const virtual_arena&) = delete;
  virtual_arena(virtual_arena&& other) noexcept
      : vmm_(std::move(other.vmm_)), opts_(other.opts_), shift_(other.shift_), gshift_(other.gshift_) {
    take_state(other);
  }
  virtual_arena& operator=(virtual_arena&& other) noexcept {
    if (this != &other) {
      give_everything_back();
      vmm_ = std::move(other.vmm_);
      opts_ = other.opts_;
      shift_ = other.shift_;
      gshift_ = other.gshift_;
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

 private:
  /// Frees allocated chunk `c` at `addr` (taken off the address map): merged with its free
  /// neighbours; its granules lose a user, those left with none are free mapped, then trimmed.
  void free_chunk(std::uint32_t c, std::uintptr_t addr) noexcept;
  /// Frees chunk `c` at `addr` (taken off the address map; not counted in use) without the
  /// counts: merged with its free neighbours, its granules lose a user.
  [[gnu::always_inline]] void merge_free(std::uint32_t c, std::uintptr_t addr) noexcept;

 public:
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
  /// is in flight, it releases the rest `release()`'s way. The
  /// caller gives a batch back before its own next call on the arena (a call that needed its
  /// granules would wait for itself), as `detached_segments::give_back_all` does.
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
  std::size_t reserved_bytes() const noexcept { return mapped_ << gshift_; }
  std::size_t mapped_bytes() const noexcept { return mapped_ << gshift_; }
  /// Bytes of granules mapped with no allocated chunk touching them (what `release()` frees).
  std::size_t free_mapped_bytes() const noexcept { return free_mapped_ << gshift_; }
  /// Bytes of the mapped granules that allocated chunks touch (`mapped_bytes() -
  /// free_mapped_bytes()`).
  std::size_t touched_bytes() const noexcept { return touched_granules() << gshift_; }
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
    return std::min<std::size_t>(granules_.size() << gshift_, end_ - base_);
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
  struct tag_record {
    tag_state state = tag_state::resident;
    std::byte* host = nullptr;
    std::size_t host_bytes = 0;
    std::size_t in_use = 0;  ///< rounded bytes of its live chunks while not resident
    std::vector<saved_chunk> chunks;
  };

  static unsigned log2(std::size_t power_of_two) noexcept {
    unsigned s = 0;
    while ((std::size_t{1} << s) < power_of_two) ++s;
    return s;
  }
  static std::size_t power_of_two_at_least(std::size_t n) noexcept {
    std::size_t p = 1;
    while (p < n && p <= (std::numeric_limits<std::size_t>::max() >> 1)) p <<= 1;
    return p;
  }
  static options normalised(options o, const Vmm& vmm) noexcept;

  void reserve_initial() noexcept;

  /// With `plan` (`allocate_or_plan`): granules to map are planned instead, and a failure is not
  /// counted (the caller calls `allocate`). With `only_held` (`allocate_in_held_granules`, no tags
  /// in use, no growth pending): an empty block, nothing changed and nothing counted, when the
  /// block would add a granule to those live chunks touch.
  [[gnu::always_inline]] block allocate_impl(std::size_t bytes, std::size_t alignment, bool may_release,
                                             std::uint16_t t, growth_plan* plan = nullptr,
                                             bool only_held = false) noexcept;
  /// The last resort before a request fails for want of physical memory: best fit's chunk needed
  /// more new granules than the backend can give, so every free chunk is tried (its front and
  /// back, each also on a granule boundary) for the place that adds the fewest granules no live
  /// chunk touches; the block goes there when those fit. O(chunks), only on this path.
  [[gnu::cold]] [[gnu::noinline]] block allocate_on_fewest_new_granules(std::size_t rounded, std::size_t bytes,
                                                                        std::size_t alignment, std::uint16_t t,
                                                                        bool may_release,
                                                                        std::uintptr_t tried) noexcept;

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
  /// there leaves the chunk's front a hole (measured: smaller devices and fewer splits without,
  /// bench/README.md).
  /// Nor is it tried in the last chunk (the untouched rest of the range): blocks stay low.
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
  [[gnu::noinline]] std::uintptr_t placement_among(std::uint32_t c, std::uintptr_t front, std::size_t rounded,
                                                   std::size_t alignment) const noexcept;

  std::size_t granule_of(std::uintptr_t addr) const noexcept { return (addr - base_) >> gshift_; }
  /// Whether an allocated chunk touches granule `g` (in the table).
  bool touched(std::size_t g) const noexcept { return touched_bits_.test(g); }
  /// Records granules [first, first + n) as mapped to the piece `id` (`fresh`: by the allocation
  /// under way). The bit table and the count change once per piece: counted granule by granule,
  /// in memory, they were half of the samples of mapping a run.
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
  std::size_t headroom_granules() const noexcept { return headroom() >> gshift_; }
  void* granule_address(std::size_t g) const noexcept { return reinterpret_cast<void*>(base_ + (g << gshift_)); }

  /// Room for what one allocation adds: three nodes (front padding, the rest, a growth), one
  /// address-map entry. False when host memory ran out.
  bool reserve_metadata() noexcept;
  [[gnu::noinline]] bool grow_metadata() noexcept;
  /// Room in the granule table for `n` granules, reserved when the range is: host addresses, whose
  /// pages are touched only as the table covers more. A cold heap's table then grows without being
  /// reallocated and copied at each doubling, which with the fresh pages the copies faulted in
  /// took about 5 % of a cold replay's time on MiniMalloc (tools/ab-time, bench/README.md).
  /// Without the room (host memory short), growth reallocates as before.
  void reserve_granule_table(std::size_t n) noexcept;
  /// Makes the granule table cover granules [0, n).
  bool cover_granules(std::size_t n) noexcept;
  [[gnu::noinline]] bool grow_granule_table(std::size_t n) noexcept;

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

  [[gnu::always_inline]] std::uint32_t find_fit(std::size_t rounded, std::size_t need,
                                                std::size_t alignment) const noexcept;
  bool fits_aligned(std::uint32_t c, std::size_t rounded, std::size_t alignment) const noexcept;

  /// Nothing fits: reserve more addresses, kept only when they extend the range in place.
  [[gnu::noinline]] std::uint32_t grow_for(std::size_t rounded, std::size_t need, std::size_t alignment) noexcept;

  /// Counts the new chunk among the users of granules [first, last] (free mapped ones are in use
  /// again); returns how many have no physical piece (`map_new_granules` maps them, or a plan;
  /// `drop_user` undoes this). The block lies in a free chunk, so a chunk touching its
  /// first or last granule ends there (`ends_` counts them), and no chunk touches the granules
  /// strictly inside it: those are counted and marked a word of the bit tables per 64 granules.
  /// The last granule is counted even when it is the first (`ends_` 2 for a chunk on one
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
    return held < bound ? (bound - held) >> gshift_ : 0;
  }
  /// 1/64 (`edge_share`) moved MiniMalloc A and B's smallest devices up a step (pieces made while
  /// the heap was small pinned their free granules where memory ran short); 1/128 moved none.
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
  /// reused as it is, without a driver call (bench/README.md measures both).
  void release_pieces_partly_reused(std::uintptr_t start, std::size_t rounded) noexcept;
  /// Whether granule `g` may lie in a wholly free block-sized piece: none if a live chunk touches
  /// `g` (its piece is in use).
  bool maybe_in_free_piece(std::size_t g) const noexcept;
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
  /// 1/`edge_share` of its capacity, so that such pieces total at most that. (At 1/16, frontier
  /// growth's bound, a piece pinned so cost MiniMalloc C's smallest device 1.027 against 1.012; at
  /// 1/64 no trace's changed: bench/README.md, twentieth session.)
  bool edges_join_run(std::size_t granules) const noexcept {
    return opts_.frontier_growth_divisor != 0 && granules <= granules_within_share<edge_share>();
  }
  static constexpr std::size_t edge_share = 64;
  /// Maps granules [g, g + n) (none mapped) with one piece; on failure nothing changed, and the
  /// result says whether the create or the map failed.
  map_result map_whole_run(std::size_t g, std::size_t n) noexcept;

  /// Unmaps and releases the piece mapped at granule `g`, every granule it spans; returns how many.
  std::size_t unmap_piece(std::size_t g) noexcept;

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

  /// Hands out free chunk `c` for a request whose block starts at `start` (inside `c`, with
  /// `rounded` bytes room): the bytes in front stay a free chunk, the rest behind becomes one.
  [[gnu::always_inline]] block carve(std::uint32_t c, std::uintptr_t start, std::size_t rounded,
                                     std::size_t bytes) noexcept;

  void link(std::uint32_t first, bool first_free, std::uint32_t second, bool second_free) noexcept {
    pool_[first].set_next(second, second_free);
    pool_[second].set_prev(first, first_free);
  }
  void absorb_next(std::uint32_t c) noexcept;

  /// Walks the range as `for_each_block` reports it: visit(address, size, requested, state).
  template <class F>
  void for_each_piece(F&& visit) const;

  [[gnu::cold]] misuse classify_unknown(std::uintptr_t addr) const noexcept;

  [[gnu::cold]] void report(misuse kind, block b) noexcept {
    detail::report_misuse(misuses_, kind, b, opts_.on_misuse, opts_.misuse_context, "virtual_arena");
  }

  /// Unmaps and releases every granule and gives every address back.
  void give_everything_back() noexcept;
  void forget() noexcept;
  void take_state(virtual_arena& other) noexcept;

  Vmm vmm_;
  options opts_{};
  free_keep_limit keep_limit_{};  ///< the object's, not moved with its contents
  unsigned shift_ = 8;
  unsigned gshift_ = 21;
  detail::best_fit_free_index index_;
  detail::best_fit_chunk_pool pool_;
  detail::best_fit_address_map map_;
  std::vector<address_range> ranges_;  ///< what the backend reserved, contiguous, in address order
  std::vector<granule> granules_;      ///< granules [0, highest ever used], from `base_`
  /// By granule: allocated chunks whose first granule it is plus those whose last granule it is
  /// (`add_user`). Apart from the records, so that an allocate and a free touch 4 bytes a granule
  /// and the bit tables, not 32-byte records (with the branch `add_user` drops, W1 3-4 % faster).
  std::vector<std::uint32_t> ends_;
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
