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
  std::size_t granules_added(std::size_t bytes, std::size_t alignment) const noexcept {
    const std::size_t rounded = detail::round_up(bytes == 0 ? 1 : bytes, opts_.rounding);
    if (rounded == 0 || !detail::is_power_of_two(alignment)) return 0;  // allocate refuses it
    const std::size_t all = (rounded >> gshift_) + ((rounded & (opts_.granularity - 1)) != 0);
    if (ranges_.empty() ||
        (alignment > opts_.rounding && rounded > std::numeric_limits<std::size_t>::max() - alignment))
      return all;
    const std::size_t need = alignment > opts_.rounding ? rounded + alignment - opts_.rounding : rounded;
    const std::uint32_t c = find_fit(rounded, need, alignment);
    if (c == detail::best_fit_npos) return all;  // new addresses hold no live chunk
    return cost_at(place_in(c, rounded, alignment), rounded).untouched;
  }
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
    requires thread_safe_vmm<Vmm>
  {
    if (current_tag_.value != 0 || tags_in_use_ || !tags_.empty()) [[unlikely]]
      return {};
    return allocate_impl(bytes, alignment, true, 0, &plan);
  }
  /// Commits a plan of `allocate_or_plan`: the granules mapped without the lock join the books
  /// and the block is handed out; when a create or map failed (or the tag went offloaded
  /// meanwhile), what was mapped is kept as free mapped granules, the chunk is freed, and the
  /// request is served as `allocate` serves it (free granules released and the create retried
  /// under the lock: a last resort).
  block allocate_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept
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

  // ---- tags and offload ------------------------------------------------------------------------

  tag current_tag() const noexcept { return current_tag_; }
  void set_current_tag(tag t) noexcept { current_tag_ = t; }

  tag_state state(tag t) const noexcept { return t.value < tags_.size() ? tags_[t.value].state : tag_state::resident; }
  /// Bytes of the tag's host copy (0 unless offloaded).
  std::size_t host_bytes(tag t) const noexcept { return t.value < tags_.size() ? tags_[t.value].host_bytes : 0; }
  /// Mapped bytes of the pieces the tag's live chunks touch, free granules in them too: what
  /// offload/discard unmap (a piece goes back only whole). O(granules).
  std::size_t mapped_bytes(tag t) const noexcept {
    std::size_t n = 0;
    for (std::size_t g = 0; g < granules_.size(); ++g) {  // the pieces `unmap_tag` takes, each once
      const granule& r = granules_[g];
      if (!touched(g) || r.tag != t.value || r.piece == 0) continue;
      n += r.piece_granules;
      g = r.piece_first + r.piece_granules - 1;
    }
    return n << gshift_;
  }
  /// Requested bytes of the tag's live chunks. O(chunks).
  std::size_t live_bytes(tag t) const noexcept {
    std::size_t n = 0;
    for (std::uint32_t c = head_; c != none; c = pool_[c].next())
      if (!pool_[c].free() && granules_[granule_of(pool_[c].addr)].tag == t.value) n += pool_[c].requested();
    return n;
  }
  const offload_statistics& offload_stats() const noexcept { return offload_stats_; }
  /// The copy engine's last CUDA error (after `copy_failed`).
  const copy_engine& copier() const noexcept { return copier_; }

  /// Copies the live bytes of `t` to host memory, then unmaps and releases its granules.
  offload_status offload(tag t) noexcept { return offload_impl(t.value, true, true); }
  /// Unmaps and releases the granules of `t` without copying (`restore` maps fresh memory).
  offload_status discard(tag t) noexcept { return offload_impl(t.value, false, true); }
  /// Offloads every resident tag with live chunks (one full reclaim when any was). Stops at the
  /// first failure and returns it (tags offloaded before stay offloaded).
  offload_status offload_all() noexcept {
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
  /// Maps the granules of an offloaded or discarded tag again, at the same addresses, and copies
  /// the host copy back (free mapped granules are released when the capacity needs it). On
  /// failure nothing is mapped and the host copy is kept: it can be retried.
  offload_status restore(tag t) noexcept {
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
      const map_result mapped = map_chunk_granules(first, granule_of(node.addr + node.size() - 1), node.addr,
                                                   node.size(), true, to_map, retried);
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

  void deallocate(block b) noexcept { (void)try_deallocate(b); }

  /// Checked deallocation (`checked_deallocating_allocator`): frees `b` and returns true when it
  /// is a live block of this arena (or empty); returns false for a misuse, which is ignored and
  /// reported as the class comment describes.
  bool try_deallocate(block b) noexcept {
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

 private:
  /// Frees allocated chunk `c` at `addr` (taken off the address map): merged with its free
  /// neighbours; its granules lose a user, those left with none are free mapped, then trimmed.
  void free_chunk(std::uint32_t c, std::uintptr_t addr) noexcept {
    const detail::best_fit_chunk& node = pool_[c];
    in_use_ -= node.size();
    requested_ -= node.requested();
    merge_free(c, addr);
  }
  /// Frees chunk `c` at `addr` (taken off the address map; not counted in use) without the
  /// counts: merged with its free neighbours, its granules lose a user.
  [[gnu::always_inline]] void merge_free(std::uint32_t c, std::uintptr_t addr) noexcept {
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

  /// Unmaps and releases free mapped granules, least recently freed first (with `keep_all` the
  /// highest), until at most `keep_bytes` of them stay, and no more than the release rule keeps;
  /// returns how many bytes went back (fewer when the rest lie in block-sized pieces in use).
  std::size_t release_free_beyond(std::size_t keep_bytes) noexcept {
    finish_release_batch();
    const std::size_t before = free_mapped_;
    trim(std::min(keep_bytes, kept_free_bytes()));
    return (before - free_mapped_) << gshift_;
  }

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
  std::size_t stranded_free_bytes() const noexcept {
    std::size_t n = 0;
    for (std::size_t g = 0; g < granules_.size(); ++g) {
      const granule& r = granules_[g];
      if (r.piece == 0 || touched(g) || r.piece_granules < 2) continue;
      n += piece_in_use(g);
    }
    return n << gshift_;
  }
  allocator_counters counters() const noexcept { return counters_; }

  /// Calls `visit(const block_info&)` for every piece of the used part of the reserved range
  /// (`used_address_space()`: up to the end of the highest granule ever mapped) in address order:
  /// allocated chunks (rounded extent, requested size), then the free chunks split where their
  /// granules change between mapped (`block_state::free`) and unmapped (`block_state::unmapped`).
  /// One segment: that used part. The untouched addresses above it are left out, so that a
  /// snapshot draws the heap, not a terabyte of reservation.
  template <class F>
  void for_each_block(F&& visit) const {
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
  std::size_t largest_free_block() const noexcept {
    std::size_t largest = 0;
    for_each_piece([&](std::uintptr_t, std::size_t size, std::size_t, block_state state) {
      if (state == block_state::free) largest = std::max(largest, size);
    });
    return largest;
  }
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
  bool check_invariants() const noexcept {
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
      if (ends_[g] != ends[g] || touched(g) != live || mapped_bits_.test(g) != (r.piece != 0) || r.fresh) return false;
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
  static options normalised(options o, const Vmm& vmm) noexcept {
    if (o.rounding == 0) o.rounding = 1;
    o.rounding = power_of_two_at_least(o.rounding);
    const std::size_t backend = std::max<std::size_t>(vmm.granularity(), 1);
    std::size_t g = o.granularity == 0 ? backend : o.granularity;
    g = power_of_two_at_least(std::max(g, backend));
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

  void reserve_initial() noexcept {
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
    reserve_granule_table(std::min(usable >> gshift_, initial_granule_table));
    const std::uint32_t c = pool_.take();
    detail::best_fit_chunk& node = pool_[c];
    node.addr = base_;
    node.set_prev(none, false);
    node.set_next(none, false);
    node.set_free(usable);
    head_ = tail_ = c;
    index_.insert(pool_, c);
  }

  /// With `plan` (`allocate_or_plan`): granules to map are planned instead, and a failure is not
  /// counted (the caller calls `allocate`). With `only_held` (`allocate_in_held_granules`, no tags
  /// in use, no growth pending): an empty block, nothing changed and nothing counted, when the
  /// block would add a granule to those live chunks touch.
  [[gnu::always_inline]] block allocate_impl(std::size_t bytes, std::size_t alignment, bool may_release,
                                             std::uint16_t t, growth_plan* plan = nullptr,
                                             bool only_held = false) noexcept {
    if (!detail::is_power_of_two(alignment)) return {};
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
      if (plan == nullptr) ++counters_.num_ooms;
      return {};
    }
    std::uint32_t c = find_fit(rounded, need, alignment);
    if (c == detail::best_fit_npos) {
      if (only_held) return {};  // new addresses hold no live chunk
      c = grow_for(rounded, need, alignment);
    }
    if (c == detail::best_fit_npos) {
      if (plan == nullptr) ++counters_.num_ooms;
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
          if (plan == nullptr) ++counters_.num_ooms;
          return {};
        }
        const std::size_t step = std::max(alignment, opts_.granularity);
        start = (pool_[c].addr + (step - 1)) & ~static_cast<std::uintptr_t>(step - 1);
      }
    }
    const std::size_t first = granule_of(start), last = granule_of(start + rounded - 1);
    if (batch_.active) [[unlikely]]
      wait_if_releasing(first, last);
    if (!cover_granules(last + 1)) [[unlikely]] {
      if (plan == nullptr && may_release) ++counters_.num_ooms;
      return {};
    }
    if (opts_.block_sized_pieces) release_pieces_partly_reused(start, rounded);
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
  /// The last resort before a request fails for want of physical memory: best fit's chunk needed
  /// more new granules than the backend can give, so every free chunk is tried (its front and
  /// back, each also on a granule boundary) for the place that adds the fewest granules no live
  /// chunk touches; the block goes there when those fit. O(chunks), only on this path.
  [[gnu::cold]] [[gnu::noinline]] block allocate_on_fewest_new_granules(std::size_t rounded, std::size_t bytes,
                                                                        std::size_t alignment, std::uint16_t t,
                                                                        bool may_release,
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

  /// A granule a planned growth maps outside the lock (no placement may touch it meanwhile).
  bool pending_granule(std::size_t g) const noexcept { return g < granules_.size() && granules_[g].pending; }
  /// Whether the allocated chunk at `addr` belongs to a planned growth not committed yet (its block,
  /// or the chunk that holds its granules ahead).
  bool pending_chunk(std::uintptr_t addr) const noexcept {
    for (const auto& m : plans_)
      if (m->active && (m->start == addr || (m->ahead_bytes != 0 && m->ahead_at == addr))) return true;
    return false;
  }
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
  void finish_release_batch() noexcept {
    if (!batch_.active || batch_.remaining.load(std::memory_order_acquire) != 0) return;
    for (std::size_t i = 0; i < batch_.count; ++i)
      for (std::size_t g = batch_.entries[i].first; g < batch_.entries[i].first + batch_.entries[i].granules; ++g)
        granules_[g].releasing = false;
    batch_.active = false;
  }
  /// Waits (the caller's lock held) until the batch in flight is unmapped, then closes it; false
  /// when there was none. Its thread needs no lock for that, so this ends.
  bool wait_for_release() noexcept {
    if (!batch_.active) return false;
    for (std::size_t left; (left = batch_.remaining.load(std::memory_order_acquire)) != 0;)
      batch_.remaining.wait(left, std::memory_order_acquire);
    finish_release_batch();
    return true;
  }
  /// A block on granules [first, last] must not map a granule still being released.
  void wait_if_releasing(std::size_t first, std::size_t last) noexcept {
    for (std::size_t g = first; g <= last && g < granules_.size(); ++g) {
      if (granules_[g].releasing) {
        wait_for_release();
        return;
      }
    }
  }
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
      m->runs[runs++] = {base_ + (from << gshift_), to_map + ahead, 0};
      m->ahead_at = base_ + ((last + 1) << gshift_);
      m->ahead_bytes = ahead << gshift_;
      to_map += ahead;
    } else {
      const auto [run_from, run_to] = whole_run_span(first, last, start, rounded);
      for (std::size_t g = first; g <= last; ++g) {
        if (granules_[g].piece != 0) continue;
        std::size_t end = g + 1;
        if (g >= run_from && g < run_to)
          while (end < run_to && granules_[end].piece == 0) ++end;
        for (std::size_t i = g; i < end; ++i) granules_[i].pending = true;
        m->runs[runs++] = {base_ + (g << gshift_), end - g, 0};
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
    plan.bytes = to_map << gshift_;
    plan.alignment = opts_.granularity;
    plan.upstream = m;
    plan.take = &planned_mapping::map_all;
    plan.give = [](void*, block) noexcept {};  // `allocate_planned` adopts or frees everything
    return {};
  }
  /// Frontier growth for a planned growth whose block (carved, on granules [first, last]) ends the
  /// used range: carves a chunk over the granules ahead from the free chunk after the block (the
  /// range's last), held by the plan and not counted in use, and returns how many; 0 when none go
  /// ahead or host memory for the chunk ran out.
  std::size_t plan_granules_ahead(std::size_t first, std::size_t last, std::size_t to_map) noexcept {
    const std::size_t ahead = granules_ahead(first, last, to_map);
    if (ahead == 0 || !reserve_metadata()) return 0;
    // Nothing past the block is touched (no granule there is mapped or pending), so it is free.
    const std::uintptr_t at = base_ + ((last + 1) << gshift_);
    const std::size_t bytes = ahead << gshift_;
    if (!pool_[tail_].free() || pool_[tail_].addr > at || at + bytes > end_) return 0;
    (void)carve(tail_, at, bytes, bytes);
    in_use_ -= bytes;
    requested_ -= bytes;
    (void)add_user(last + 1, last + ahead, 0);
    return ahead;
  }
  /// A record not in use, sized for `n` granules; null when host memory ran out.
  planned_mapping* idle_record(std::size_t n) noexcept {
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
  placement_cost cost_at(std::uintptr_t start, std::size_t rounded) const noexcept {
    const std::size_t first = granule_of(start), last = granule_of(start + rounded - 1);
    // Granules spanned count for blocks of whole granules and for blocks of 3/4 of a granule up to
    // one: such a block leaves a quarter of a granule or less beside it, so packing it end to end
    // gains little, while one straddling a boundary holds two granules once its neighbours go.
    // Smaller blocks packed end to end fill granules better than moved to a boundary (measured on
    // the traces, rescaled traces and synthetic ones; bench/README.md).
    const bool span_counts = (rounded & (opts_.granularity - 1)) == 0 ||
                             (rounded < opts_.granularity && rounded >= opts_.granularity - opts_.granularity / 4);
    placement_cost cost{0, span_counts ? last - first + 1 : 0, not_counted};
    const auto untouched = [&](std::size_t g) { return std::size_t{g >= granules_.size() || !touched(g)}; };
    cost.untouched = untouched(first) + (last > first ? untouched(last) + (last - first - 1) : 0);
    return cost;
  }
  [[gnu::always_inline]] std::size_t count_unmapped(std::uintptr_t start, std::size_t rounded) const noexcept {
    const std::size_t first = granule_of(start), last = granule_of(start + rounded - 1);
    const std::size_t known = std::min(last + 1, granules_.size());
    std::size_t n = last + 1 > known ? last + 1 - std::max(first, known) : 0;
    if (mapped_ == granules_.size()) return n;  // every granule of the table is mapped
    n += detail::count_bits(first, known, [this](std::size_t w) { return ~mapped_bits_.word(w); });
    return n;
  }
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
                              std::size_t alignment) const noexcept {
    const std::size_t first = granule_of(front), last = granule_of(front + rounded - 1);
    if (last < granules_.size() && touched(first) && touched(last) && last - first <= 1) [[likely]]
      return front;  // within granules live chunks touch: nothing to gain
    // A block over a granule has one other candidate, the front moved to a granule boundary: when
    // that is the front itself or does not fit the chunk, the comparison has nothing to compare
    // (the same answer without it; traces about 2 % faster, tools/ab-time).
    if (rounded > opts_.granularity) {
      const std::uintptr_t moved = up_to_granule(front, alignment);
      if (moved == front || moved + rounded > pool_[c].addr + pool_[c].size()) return front;
    }
    return placement_among(c, front, rounded, alignment);
  }
  /// Where in free chunk `c` (best fit's) a block goes: its front, aligned, unless `placement_in`
  /// finds a place that adds fewer granules.
  std::uintptr_t place_in(std::uint32_t c, std::size_t rounded, std::size_t alignment) const noexcept {
    std::uintptr_t start = pool_[c].addr;
    if (alignment > opts_.rounding) start = (start + (alignment - 1)) & ~static_cast<std::uintptr_t>(alignment - 1);
    return pool_[c].size() != rounded ? placement_in(c, start, rounded, alignment) : start;
  }
  /// `at` moved up to the next boundary of a granule (of `alignment`, when that is larger).
  std::uintptr_t up_to_granule(std::uintptr_t at, std::size_t alignment) const noexcept {
    const std::uintptr_t mask = std::max(alignment, opts_.granularity) - 1;
    return (at + mask) & ~mask;
  }
  [[gnu::noinline]] std::uintptr_t placement_among(std::uint32_t c, std::uintptr_t front, std::size_t rounded,
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
    // Inlined: called out of line it was about 25 instructions of call a candidate, 4 % of silmont
    // fp32's replay (callgrind).
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

  std::size_t granule_of(std::uintptr_t addr) const noexcept { return (addr - base_) >> gshift_; }
  /// Whether an allocated chunk touches granule `g` (in the table).
  bool touched(std::size_t g) const noexcept { return touched_bits_.test(g); }
  /// Records granules [first, first + n) as mapped to the piece `id` (`fresh`: by the allocation
  /// under way). The bit table and the count change once per piece: counted granule by granule,
  /// in memory, they were half of the samples of mapping a run.
  void set_piece_run(std::size_t first, std::size_t n, std::uint64_t id, bool fresh) noexcept {
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
  /// Records the piece on granules [first, first + n) as unmapped (`set_piece_run` undone).
  void clear_piece_run(std::size_t first, std::size_t n) noexcept {
    for (std::size_t g = first; g < first + n; ++g) {
      granules_[g].piece = 0;
      granules_[g].fresh = false;
    }
    mapped_bits_.reset(first, first + n);
    mapped_ -= n;
  }
  /// Whether mapped granule `g` lies in a block-sized piece (one that spans several granules).
  bool in_block_sized_piece(std::size_t g) const noexcept {
    return g < granules_.size() && granules_[g].piece != 0 && granules_[g].piece_granules > 1;
  }
  /// Whether a live chunk touches any granule of the piece mapped at granule `g`.
  bool piece_in_use(std::size_t g) const noexcept {
    const granule& r = granules_[g];
    return touched_bits_.count(r.piece_first, r.piece_first + r.piece_granules) != 0;
  }
  /// Takes the granules of the piece mapped at granule `g`, which no live chunk touches, off the
  /// free books (before the piece goes back or is handed on).
  void unlist_free_piece(std::size_t g) noexcept {
    const std::size_t first = granules_[g].piece_first, n = granules_[g].piece_granules;
    for (std::size_t i = first; i < first + n; ++i) unlist(i);
  }
  /// What the backend could give at most if every free mapped granule went back.
  std::size_t headroom() const noexcept {
    const std::size_t committed = vmm_.physical_bytes() - std::min(vmm_.physical_bytes(), free_mapped_ << gshift_);
    return vmm_.capacity() > committed ? vmm_.capacity() - committed : 0;
  }
  /// `headroom()` in whole granules.
  std::size_t headroom_granules() const noexcept { return headroom() >> gshift_; }
  void* granule_address(std::size_t g) const noexcept { return reinterpret_cast<void*>(base_ + (g << gshift_)); }

  /// Room for what one allocation adds: three nodes (front padding, the rest, a growth), one
  /// address-map entry. False when host memory ran out.
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
  /// Room in the granule table for `n` granules, reserved when the range is: host addresses, whose
  /// pages are touched only as the table covers more. A cold heap's table then grows without being
  /// reallocated and copied at each doubling, which with the fresh pages the copies faulted in
  /// took about 5 % of a cold replay's time on MiniMalloc (tools/ab-time, bench/README.md).
  /// Without the room (host memory short), growth reallocates as before.
  void reserve_granule_table(std::size_t n) noexcept {
    try {
      granules_.reserve(n);
      ends_.reserve(n);
      mapped_bits_.reserve(n);
      touched_bits_.reserve(n);
    } catch (const std::bad_alloc&) {}
  }
  /// Makes the granule table cover granules [0, n).
  bool cover_granules(std::size_t n) noexcept {
    if (n <= granules_.size()) [[likely]]
      return true;
    return grow_granule_table(n);
  }
  [[gnu::noinline]] bool grow_granule_table(std::size_t n) noexcept {
    try {
      detail::reserve_room(granules_, n);
      detail::reserve_room(ends_, n);
      mapped_bits_.reserve(n);
      touched_bits_.reserve(n);
      mapped_bits_.resize(n);  // nothing throws from here
      touched_bits_.resize(n);
      granules_.resize(n);
      ends_.resize(n);
      return true;
    } catch (const std::bad_alloc&) {
      return false;
    }
  }

  /// Whether a chunk of tag `t` must not touch granule `g`: a live chunk of another tag touches
  /// it, or it lies in a block-sized piece that chunks of another tag use. Offloading a tag
  /// unmaps its pieces whole, so a piece serves one tag at a time; a wholly free piece serves any
  /// (a block's granules strictly inside it are free, so a block whose first and last granule
  /// pass this check covers any other piece it meets whole).
  bool foreign(std::size_t g, std::uint16_t t) const noexcept {
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
  /// The free chunk right after the tag's last block, when the block fits there without touching
  /// a granule of another tag (keeps a tag's small blocks together instead of taking a granule
  /// each). {npos, 0} otherwise.
  [[gnu::cold]] std::pair<std::uint32_t, std::uintptr_t> beside_own_tag(std::uint16_t t, std::size_t rounded,
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
    if (start - pool_[n].addr > pool_[n].size() || pool_[n].size() - (start - pool_[n].addr) < rounded)
      return none_found;
    if (foreign(granule_of(start), t) || foreign(granule_of(start + rounded - 1), t)) return none_found;
    return {n, start};
  }
  /// A free chunk holding whole free granules for the block (from a granule boundary, or the
  /// alignment's when coarser): no chunk of another tag can share them.
  [[gnu::cold]] std::uint32_t find_isolated(std::size_t rounded, std::size_t alignment) noexcept {
    const std::size_t step = std::max(alignment, opts_.granularity);
    const std::size_t span = detail::round_up(rounded, opts_.granularity);
    if (span == 0 || span > std::numeric_limits<std::size_t>::max() - step) return detail::best_fit_npos;
    const std::size_t need = span + step - opts_.rounding;
    std::uint32_t c = index_.best_fit(pool_, need);
    if (c == detail::best_fit_npos) c = grow_for(need, need, opts_.rounding);
    return c;
  }

  offload_status offload_impl(std::uint16_t t, bool copy, bool single) noexcept {
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
    offload_stats_.bytes_reclaimed += unmapped << gshift_;
    ++(copy ? offload_stats_.num_offloads : offload_stats_.num_discards);
    if (single) ++offload_stats_.num_single_reclaims;
    return offload_status::done;
  }
  /// Unmaps and releases every mapped granule a live chunk of tag `t` touches; returns how many.
  std::size_t unmap_tag(std::uint16_t t) noexcept {
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
  /// A chunk of an offloaded tag is freed: its saved bytes are not copied back.
  [[gnu::cold]] void forget_saved(std::uint16_t t, std::uintptr_t addr, std::size_t size) noexcept {
    if (t >= tags_.size()) return;
    tags_[t].in_use -= size;
    offloaded_in_use_ -= size;
    std::vector<saved_chunk>& v = tags_[t].chunks;
    const auto it =
        std::lower_bound(v.begin(), v.end(), addr, [](const saved_chunk& s, std::uintptr_t a) { return s.addr < a; });
    if (it != v.end() && it->addr == addr) it->live = false;
  }
  void* host_allocate(std::size_t bytes) noexcept {
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
  void host_deallocate(void* p, std::size_t bytes) noexcept {
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
  void drop_host_copy(tag_record& rec) noexcept {
    host_deallocate(rec.host, rec.host_bytes);
    offload_stats_.bytes_on_host -= rec.host_bytes;
    rec.host = nullptr;
    rec.host_bytes = 0;
    rec.chunks.clear();
  }

  [[gnu::always_inline]] std::uint32_t find_fit(std::size_t rounded, std::size_t need,
                                                std::size_t alignment) const noexcept {
    std::uint32_t c = index_.best_fit(pool_, rounded);
    if (c == detail::best_fit_npos) return c;
    if (alignment > opts_.rounding && !fits_aligned(c, rounded, alignment)) c = index_.best_fit(pool_, need);
    return c;
  }
  bool fits_aligned(std::uint32_t c, std::size_t rounded, std::size_t alignment) const noexcept {
    const detail::best_fit_chunk& node = pool_[c];
    const std::uintptr_t start = (node.addr + (alignment - 1)) & ~static_cast<std::uintptr_t>(alignment - 1);
    return start - node.addr <= node.size() - rounded;
  }

  /// Nothing fits: reserve more addresses, kept only when they extend the range in place.
  [[gnu::noinline]] std::uint32_t grow_for(std::size_t rounded, std::size_t need, std::size_t alignment) noexcept {
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

  /// Counts the new chunk among the users of granules [first, last] (free mapped ones are in use
  /// again); returns how many have no physical piece (`map_new_granules` maps them, or a plan;
  /// `drop_user` undoes this). The block lies in a free chunk, so a chunk touching its
  /// first or last granule ends there (`ends_` counts them), and no chunk touches the granules
  /// strictly inside it: those are counted and marked a word of the bit tables per 64 granules.
  /// The last granule is counted even when it is the first (`ends_` 2 for a chunk on one
  /// granule): whether a block crosses a granule boundary is as random as its size, and a branch
  /// on it mispredicts.
  [[gnu::always_inline]] std::size_t add_user(std::size_t first, std::size_t last, std::uint16_t t) noexcept {
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
  /// `add_user` at its first or last granule `g`; a missing piece counts in `to_map` when
  /// `distinct` (not the first granule again).
  [[gnu::always_inline]] void add_end_user(std::size_t g, std::uint16_t t, std::size_t& to_map, std::size_t& reused,
                                           bool distinct) noexcept {
    const bool mapped = mapped_bits_.test(g);
    to_map += static_cast<std::size_t>(distinct & !mapped);
    if (ends_[g]++ != 0) return;
    if (tags_in_use_) [[unlikely]]  // else every tag is 0 already
      granules_[g].tag = t;
    touched_bits_.set(g);
    if (!mapped) return;
    ++reused;  // free mapped until now: in use again
    if (lists_free_granules()) unlink(g);
  }
  /// Takes an allocated chunk's user off granules [first, last] (freed, or its allocation undone):
  /// the granules strictly inside it, and its first and last when no other chunk ends there, are
  /// untouched again; those mapped are free mapped (listed newest, in address order). Returns how
  /// many.
  [[gnu::always_inline]] std::size_t drop_user(std::size_t first, std::size_t last) noexcept {
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
    freed += drop_end_user(last);  // the first again for a chunk on one granule (`ends_` 2)
    free_mapped_ += freed;
    return freed;
  }
  /// `drop_user` at its first or last granule: 1 when that leaves it free mapped.
  [[gnu::always_inline]] std::size_t drop_end_user(std::size_t g) noexcept {
    if (--ends_[g] != 0) return 0;
    touched_bits_.reset(g);
    if (!mapped_bits_.test(g)) return 0;
    if (lists_free_granules()) link_newest(g);
    return 1;
  }
  enum class map_result { mapped, no_memory, map_failed };
  /// The driver calls of an allocate: `to_map` granules of [first, last] have no physical piece.
  [[gnu::noinline]] bool map_new_granules(std::size_t first, std::size_t last, bool may_release, std::size_t to_map,
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
    if (map_chunk_granules(first, last, start, rounded, may_release, to_map, retried) == map_result::mapped)
      return true;
    (void)drop_user(first, last);  // what it mapped is unmapped already
    return false;
  }
  /// Frontier growth (`frontier_growth_divisor`): when granules [first, last] end the used range
  /// and the `to_map` unmapped ones are its last, maps them and the granules ahead
  /// (`granules_ahead`) as one piece; those ahead are free mapped. False, nothing changed, when
  /// none go ahead or the create or map failed (the caller then maps the block's own pieces).
  bool map_with_granules_ahead(std::size_t first, std::size_t last, std::size_t to_map) noexcept {
    const std::size_t ahead = granules_ahead(first, last, to_map);
    if (ahead == 0) return false;
    const std::size_t from = last + 1 - to_map, n = to_map + ahead;
    if (map_whole_run(from, n) != map_result::mapped) return false;
    for (std::size_t g = from; g < from + n; ++g) granules_[g].fresh = false;
    free_mapped_ += ahead;
    return true;
  }
  /// How many granules frontier growth maps ahead of a block on granules [first, last] whose
  /// `to_map` unmapped granules are its last and end the used range: 1/divisor of the mapped
  /// granules (for a small heap `small_heap_granules_ahead`), while the backend then holds at most
  /// 1/16 of its capacity, within the reserved range. 0 when the block is not at the frontier,
  /// nothing fits ahead, or tags, a planned growth or a release batch are about (their granules
  /// could lie ahead); the granule table covers them when not 0.
  std::size_t granules_ahead(std::size_t first, std::size_t last, std::size_t to_map) noexcept {
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
  /// `frontier_growth_min_granules` for a heap whose 1/divisor (`ahead`) is fewer, while the
  /// backend then holds at most 1/`small_heap_share` of its capacity; `ahead` otherwise. Only
  /// small heaps ask, so the backend's getters stay off the path of a large one.
  std::size_t small_heap_granules_ahead(std::size_t ahead, std::size_t to_map) const noexcept {
    const std::size_t least = opts_.frontier_growth_min_granules, room = granules_within_share<small_heap_share>();
    return least <= room && to_map <= room - least ? least : ahead;
  }
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
                                bool may_release, std::size_t& to_map, bool& retried) noexcept {
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

  /// Makes room for `to_map` granules the backend would not create: waits for a release batch in
  /// flight, else unmaps free pieces (oldest first, with `keep_all` highest first) and counts the
  /// request's first retry. False when nothing could go back (what is left lies in block-sized
  /// pieces still in use).
  bool make_room(std::size_t to_map, bool& retried) noexcept {
    if (wait_for_release()) return true;
    if (free_mapped_ == 0) return false;
    if (!retried) {
      retried = true;
      ++counters_.num_alloc_retries;
    }
    return trim_count(std::min(free_mapped_, to_map)) != 0;
  }
  /// Once more than half of the backend's capacity is held, a wholly free block-sized piece that
  /// a block at `start` (`rounded` bytes) would not cover whole goes back first: the rest of it,
  /// or, when the block ends inside its edge granule, all of it while a neighbour shares that
  /// granule, would stay mapped, stranded, and memory may run short. Below that the piece is
  /// reused as it is, without a driver call (bench/README.md measures both).
  void release_pieces_partly_reused(std::uintptr_t start, std::size_t rounded) noexcept {
    const std::size_t first = granule_of(start), last = granule_of(start + rounded - 1);
    // Most blocks meet no such piece: told by the touched bits and the table, without a call.
    if (!maybe_in_free_piece(first) && !maybe_in_free_piece(last)) [[likely]]
      return;
    release_free_pieces_partly_reused(start, rounded, first, last);
  }
  /// Whether granule `g` may lie in a wholly free block-sized piece: none if a live chunk touches
  /// `g` (its piece is in use).
  bool maybe_in_free_piece(std::size_t g) const noexcept {
    return g < granules_.size() && !touched(g) && in_block_sized_piece(g);
  }
  [[gnu::noinline]] void release_free_pieces_partly_reused(std::uintptr_t start, std::size_t rounded, std::size_t first,
                                                           std::size_t last) noexcept {
    if (vmm_.physical_bytes() <= vmm_.capacity() / 2) return;  // the backend's getters: calls
    for (const std::size_t g : {first, last}) {
      if (!in_block_sized_piece(g)) continue;
      const std::size_t from = granules_[g].piece_first, n = granules_[g].piece_granules;
      const auto piece_start = reinterpret_cast<std::uintptr_t>(granule_address(from));
      const auto piece_end = reinterpret_cast<std::uintptr_t>(granule_address(from + n));
      if ((piece_start >= start && piece_end <= start + rounded) || piece_in_use(g)) continue;
      unlist_free_piece(g);
      (void)unmap_piece(g);
    }
  }
  /// The granules of a block at `start` (`rounded` bytes on granules [first, last]) whose unmapped
  /// runs take one piece each: those it covers whole, [from, to), and its edge granules too when
  /// `edges_join_run`; empty without block-sized pieces and for a block on one granule.
  std::pair<std::size_t, std::size_t> whole_run_span(std::size_t first, std::size_t last, std::uintptr_t start,
                                                     std::size_t rounded) const noexcept {
    if (!opts_.block_sized_pieces || last == first) return {0, 0};
    if (edges_join_run(last + 1 - first)) return {first, last + 1};
    const std::uintptr_t in_granule = opts_.granularity - 1;
    return {(start & in_granule) != 0 ? first + 1 : first, ((start + rounded) & in_granule) != 0 ? last : last + 1};
  }
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
  map_result map_whole_run(std::size_t g, std::size_t n) noexcept {
    const physical_memory piece = vmm_.create(n << gshift_);
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

  /// Unmaps and releases the piece mapped at granule `g`, every granule it spans; returns how many.
  std::size_t unmap_piece(std::size_t g) noexcept {
    const std::size_t first = granules_[g].piece_first, n = granules_[g].piece_granules;
    vmm_.unmap(granule_address(first), n << gshift_);
    vmm_.release(physical_memory{granules_[first].piece, n << gshift_});
    clear_piece_run(first, n);
    ++counters_.num_unmaps;
    ++counters_.num_device_free;
    return n;
  }

  // The least-recently-freed list of free mapped granules: freed at the newest end, unmapped
  // from the oldest. With `keep_all` there is no list: nothing goes back until the device runs
  // short or `release()`, and then the free mapped granules are found by a scan (highest address
  // first), so that allocations and frees do no list work per granule.
  bool lists_free_granules() const noexcept { return opts_.release_threshold != keep_all; }
  void unlist(std::size_t g) noexcept {
    --free_mapped_;
    if (lists_free_granules()) unlink(g);
  }
  void link_newest(std::size_t g) noexcept {
    granule& r = granules_[g];
    r.older = newest_;
    r.newer = no_granule;
    if (newest_ != no_granule) granules_[newest_].newer = static_cast<std::uint32_t>(g);
    else oldest_ = static_cast<std::uint32_t>(g);
    newest_ = static_cast<std::uint32_t>(g);
  }
  void unlink(std::size_t g) noexcept {
    granule& r = granules_[g];
    if (r.older != no_granule) granules_[r.older].newer = r.newer;
    else oldest_ = r.newer;
    if (r.newer != no_granule) granules_[r.newer].older = r.older;
    else newest_ = r.older;
    r.older = r.newer = no_granule;
  }
  /// Takes free mapped pieces off the books, the first to go back first, until `n` granules
  /// went (or none is left), and hands each to `take(first granule, granules)`, which unmaps it
  /// or passes it on; returns how many granules went. A block-sized piece goes only whole, when
  /// no chunk touches any of its granules (those exist with `keep_all` only: no list).
  template <class F>
  std::size_t take_free(std::size_t n, F&& take) noexcept {
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
  /// Free mapped bytes kept: the most of `release_threshold`, a share of the granules live chunks
  /// touch (`release_threshold_divisor`) and what stays under the most granules touched at once
  /// (`keep_up_to_peak`), counting `about_to_map` granules as touched.
  std::size_t kept_free_bytes(std::size_t about_to_map = 0) const noexcept {
    const std::size_t touched = touched_granules() + about_to_map;
    const std::size_t touched_bytes = touched << gshift_;
    const std::size_t below_peak = opts_.keep_up_to_peak ? (std::max(peak_touched_, touched) - touched) << gshift_ : 0;
    if (opts_.release_threshold_divisor == 0) return std::max(opts_.release_threshold, below_peak);
    return std::max({opts_.release_threshold, touched_bytes / opts_.release_threshold_divisor, below_peak});
  }
  /// What is kept as `to_map` granules are about to be mapped: the rule's, within the limit a
  /// composite set (`set_free_keep_limit`).
  std::size_t kept_free_bytes_before_map(std::size_t to_map) noexcept {
    const std::size_t own = kept_free_bytes(to_map);
    if (keep_limit_.bytes == nullptr) [[likely]]
      return own;
    return std::min(own, keep_limit_.bytes(keep_limit_.context, this, to_map << gshift_));
  }
  /// Mapped granules that are not free mapped: those allocated chunks touch.
  std::size_t touched_granules() const noexcept { return mapped_ - free_mapped_; }
  void note_touched_peak() noexcept { peak_touched_ = std::max(peak_touched_, touched_granules()); }
  /// Unmaps the least recently freed granules until at most `keep_bytes` of free mapped remain.
  void trim(std::size_t keep_bytes) noexcept {
    const std::size_t keep = keep_bytes >> gshift_;
    if (free_mapped_ > keep) trim_count(free_mapped_ - keep);
    trim_due_ = false;
  }
  /// Unmaps the least recently freed granules (with `keep_all` the highest) until `n` went;
  /// returns how many went (fewer when the rest lie in block-sized pieces still in use).
  std::size_t trim_count(std::size_t n) noexcept {
    return take_free(n, [&](std::size_t g, std::size_t) { (void)unmap_piece(g); });
  }

  /// Hands out free chunk `c` for a request whose block starts at `start` (inside `c`, with
  /// `rounded` bytes room): the bytes in front stay a free chunk, the rest behind becomes one.
  [[gnu::always_inline]] block carve(std::uint32_t c, std::uintptr_t start, std::size_t rounded,
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

  void link(std::uint32_t first, bool first_free, std::uint32_t second, bool second_free) noexcept {
    pool_[first].set_next(second, second_free);
    pool_[second].set_prev(first, first_free);
  }
  void absorb_next(std::uint32_t c) noexcept {
    detail::best_fit_chunk& node = pool_[c];
    const std::uint32_t n = node.next();
    node.set_size(node.size() + pool_[n].size());
    node.set_next(pool_[n].next(), false);
    if (n == tail_) tail_ = c;
    pool_.give(n);
  }

  /// Walks the range as `for_each_block` reports it: visit(address, size, requested, state).
  template <class F>
  void for_each_piece(F&& visit) const {
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
        while (g < granules_.size() && (granules_[g].piece != 0) == mapped && base_ + (g << gshift_) < end) ++g;
        const std::uintptr_t run_end =
            g >= granules_.size() && !mapped ? end : std::min<std::uintptr_t>(end, base_ + (g << gshift_));
        visit(at, run_end - at, 0, mapped ? block_state::free : block_state::unmapped);
        at = run_end;
      }
    }
  }

  [[gnu::cold]] misuse classify_unknown(std::uintptr_t addr) const noexcept {
    if (addr < base_ || addr >= end_) return misuse::foreign_pointer;
    for (std::uint32_t c = head_; c != none; c = pool_[c].next()) {
      if (pool_[c].addr == addr) return pool_[c].free() ? misuse::double_free : misuse::foreign_pointer;
      if (pool_[c].addr > addr) break;
    }
    return misuse::foreign_pointer;
  }

  [[gnu::cold]] void report(misuse kind, block b) noexcept {
    detail::report_misuse(misuses_, kind, b, opts_.on_misuse, opts_.misuse_context, "virtual_arena");
  }

  /// Unmaps and releases every granule and gives every address back.
  void give_everything_back() noexcept {
    for (tag_record& rec : tags_) drop_host_copy(rec);
    for (std::size_t g = 0; g < granules_.size(); ++g)
      if (granules_[g].piece != 0) unmap_piece(g);
    for (const address_range& r : ranges_) vmm_.unreserve(r);
    forget();
  }
  void forget() noexcept {
    ranges_.clear();
    granules_.clear();
    ends_.clear();
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
  void take_state(virtual_arena& other) noexcept {
    index_ = std::move(other.index_);
    pool_ = std::move(other.pool_);
    map_ = std::move(other.map_);
    ranges_ = std::move(other.ranges_);
    granules_ = std::move(other.granules_);
    ends_ = std::move(other.ends_);
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
