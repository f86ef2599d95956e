// SPDX-License-Identifier: Apache-2.0
// alloy/policy/compacting_defragmenter.hpp
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/movable_bookkeeping.hpp>
#include <alloy/movable.hpp>

namespace alloy {

/// An arena the defragmenter can place blocks in: introspection (segments and pieces in address
/// order, docs/design.md#concepts) plus `allocate_at(where, bytes)`, which carves a block of
/// `bytes` starting exactly at `where` and succeeds (non-empty block) only when the whole footprint
/// of the block lies inside one free piece. Optionally `chunk_size(bytes)`: the footprint a block
/// of `bytes` takes (the arena's rounding); without it the defragmenter assumes `bytes` rounded up
/// to 256. The arena must keep its bookkeeping outside the blocks (a freed block's bytes stay as
/// they were until the place is handed out again), and free neighbours must be coalesced.
template <class A>
concept placement_arena = introspectable_allocator<A> && requires(A& a, void* where, std::size_t bytes) {
  { a.allocate_at(where, bytes) } noexcept -> std::same_as<block>;
};

/// `compacting_defragmenter<Arena>` gives an arena movable blocks and, when a request fails although
/// the arena has enough free bytes (they are split into holes too small), moves unlocked movable
/// blocks to open a hole, copying as few bytes as it can.
///
/// - Strategy: movable blocks (`allocate_movable`, `lock`, `unlock`, `deallocate(handle)`; rules in
///   `alloy/movable.hpp`) are always resident; locked and raw blocks never move. To open a hole, a
///   *window* (adjacent pieces of one segment, none raw or locked, spanning the request) costs the
///   bytes of its movable blocks; windows are tried cheapest first (at most `max_attempts`), each
///   block planned best fit into free pieces outside the window, and the first that fits is carried
///   out. No plan that moves each block at most once copies fewer bytes than the cheapest window.
///   When consolidating copies no more, the blocks of one run (between raw or locked blocks) slide
///   toward its ends around the cheapest pivot, leaving one hole; so with nothing in the way a
///   request fits whenever one segment's free bytes suffice. `compact()` packs later segments into
///   earlier holes, slides every segment down and releases the emptied ones.
/// - Complexity: a failed request, O(n) windows found in O(n), each plan O(n log n); consolidating
///   O(n); `compact()` O(n·h) for n pieces and h holes. Moves copy through the copy engine.
///   Metadata: a handle table and a set of the blocks' addresses on the host (about 60 B per
///   movable block) and O(n) temporary host memory while opening a hole; nothing is written into
///   managed memory.
/// - Failure: noexcept allocation paths; a move whose placement or copy fails is undone and leaves
///   the block intact (except an overlapping slide of device memory whose copy fails: the device
///   is then broken, and the copy engine holds the error). The destructor frees every movable
///   block still alive.
/// - Thread safety: none. Move-only.
/// - Memory kind: `Arena`'s, which must have `allocate_at` (`placement_arena`; `best_fit_arena`
///   has it). Capabilities: `movable_statistics()` (`num_defragmentations`, `bytes_defragged`,
///   `num_moves`, `bytes_active`, `bytes_inactive`) and those of `Arena` (`owns`, `release`,
///   `reserved_bytes`, `bytes_reservable_limit`, introspection with movable pieces shown
///   `active`/`inactive`, `counters()`, where a failure a defragmentation made good counts as a
///   retry, not an OOM); checked frees (`try_deallocate` and `free_misuse` of a raw block when the
///   arena has them, and `try_deallocate` of a handle: false on a refusal, nothing changed). A raw
///   free at a movable block's address is refused in every build (`misuses()`, `on_misuse`).
template <placement_arena Arena>
class compacting_defragmenter {
 public:
  static constexpr bool host_accessible = Arena::host_accessible;
  static constexpr bool device_accessible = Arena::device_accessible;

  struct options {
    std::size_t max_attempts = 16;       ///< windows planned per failed request before consolidating
    bool consolidate = true;             ///< consolidate a run when no window is cheaper (see above)
    copy_engine::options copy = {};      ///< the stream moves copy on
    misuse_handler on_misuse = nullptr;  ///< called on each raw free refused here
    void* misuse_context = nullptr;      ///< passed to `on_misuse`
  };

  compacting_defragmenter() = default;
  explicit compacting_defragmenter(Arena arena) : arena_(std::move(arena)) {}
  compacting_defragmenter(Arena arena, options opts) : arena_(std::move(arena)), options_(opts), copier_(opts.copy) {}

  compacting_defragmenter(compacting_defragmenter&&) = default;
  compacting_defragmenter& operator=(compacting_defragmenter&& other) noexcept {
    if (this != &other) {
      free_all();
      arena_ = std::move(other.arena_);
      table_ = std::move(other.table_);
      addresses_ = std::move(other.addresses_);
      options_ = other.options_;
      copier_ = other.copier_;
      counters_ = other.counters_;
      rescues_ = other.rescues_;
      misuses_ = other.misuses_;
    }
    return *this;
  }
  compacting_defragmenter(const compacting_defragmenter&) = delete;
  compacting_defragmenter& operator=(const compacting_defragmenter&) = delete;
  ~compacting_defragmenter() { free_all(); }

  // ---- raw blocks: never moved ---------------------------------------------------------------

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const block b = arena_.allocate(bytes, alignment)) return b;
    return rescue(bytes, alignment);
  }
  /// A raw free; one at a movable block's address is refused (counted in `misuses()`).
  void deallocate(block b) noexcept {
    if (detail::refuse_movable_address(addresses_, misuses_, b, options_, who)) return;
    arena_.deallocate(b);
  }
  /// The arena's checked free: false, nothing changed, when it or this refuses `b` as misuse.
  bool try_deallocate(block b) noexcept
    requires checked_deallocating_allocator<Arena>
  {
    if (detail::refuse_movable_address(addresses_, misuses_, b, options_, who)) return false;
    return arena_.try_deallocate(b);
  }
  /// What a raw free of `b` would be refused as: a movable block's address, or the arena's answer.
  misuse free_misuse(block b) const noexcept
    requires free_screening_allocator<Arena>
  {
    if (b.ptr != nullptr && addresses_.contains(b.ptr)) return misuse::foreign_pointer;
    return arena_.free_misuse(b);
  }
  /// Raw frees of a movable block's address refused here; the arena counts its own refusals.
  misuse_counts misuses() const noexcept { return misuses_; }

  // ---- movable blocks ------------------------------------------------------------------------

  handle allocate_movable(std::size_t bytes) noexcept {
    block b = arena_.allocate(bytes, movable_alignment);
    if (!b) b = rescue(bytes, movable_alignment);
    if (!b) return {};
    if (!addresses_.add(b.ptr)) {
      arena_.deallocate(b);
      return {};
    }
    const handle h = table_.insert(entry{b, 0});
    if (!h) {
      addresses_.remove(b.ptr);
      arena_.deallocate(b);
      return {};
    }
    counters_.bytes_inactive += bytes;
    return h;
  }

  /// The block's address, fixed until the last `unlock` (never nullptr for a live handle).
  void* lock(handle h) {
    entry& e = detail::entry_or_throw(table_, h, "lock");
    if (e.locks++ == 0) detail::note_locked(counters_, e.b.size);
    return e.b.ptr;
  }

  void unlock(handle h) {
    entry& e = detail::entry_or_throw(table_, h, "unlock");
    detail::check_locked(e.locks, h);
    if (--e.locks == 0) detail::note_unlocked(counters_, e.b.size);
  }

  void deallocate(handle h) {
    entry& e = detail::entry_or_throw(table_, h, "deallocate");
    detail::check_unlocked(e.locks, h);
    free_movable(h, e);
  }
  /// As `deallocate(h)`, but a handle it would throw for (empty, unknown, stale, another
  /// allocator's, locked) is refused with false, nothing changed.
  bool try_deallocate(handle h) noexcept {
    entry* e = table_.find(h);
    if (e == nullptr || e->locks > 0) return false;
    free_movable(h, *e);
    return true;
  }

  // ---- defragmentation -----------------------------------------------------------------------

  /// Packs the unlocked movable blocks towards the lowest addresses, then releases the segments
  /// that became wholly free (when the arena can). Returns the bytes moved.
  std::size_t compact() noexcept {
    const std::size_t moved = pack(true);
    if (moved > 0) ++counters_.num_defragmentations;
    if constexpr (releasing_allocator<Arena>) arena_.release();
    return moved;
  }

  /// Opens a hole for `bytes` at `alignment` if the free bytes suffice, moving as few bytes as
  /// it can (see the class comment). Returns whether it moved anything.
  bool defragment(std::size_t bytes, std::size_t alignment = movable_alignment) noexcept {
    return open_hole(bytes, alignment);
  }

  // ---- questions about handles (empty/unknown/stale handles: false, 0, nullptr) --------------

  std::size_t size_of(handle h) const noexcept {
    const entry* e = table_.find(h);
    return e ? e->b.size : 0;
  }
  bool is_resident(handle h) const noexcept { return table_.find(h) != nullptr; }
  bool is_locked(handle h) const noexcept {
    const entry* e = table_.find(h);
    return e && e->locks > 0;
  }
  bool is_live(handle h) const noexcept { return table_.find(h) != nullptr; }
  /// Where the block is now (it may move while unlocked; for tests and pictures).
  const void* address_of(handle h) const noexcept {
    const entry* e = table_.find(h);
    return e ? e->b.ptr : nullptr;
  }
  std::size_t movable_count() const noexcept { return table_.size(); }

  // ---- counters and capabilities -------------------------------------------------------------

  movable_counters movable_statistics() const noexcept { return counters_; }
  void reset_movable_peak() noexcept { counters_.peak_bytes_active = counters_.bytes_active; }

  bool owns(block b) const noexcept
    requires owning_allocator<Arena>
  {
    return arena_.owns(b);
  }
  void release() noexcept
    requires releasing_allocator<Arena>
  {
    arena_.release();
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<Arena>
  {
    return arena_.reserved_bytes();
  }
  /// The arena's counters, as if each request were one call: failures of the arena that a
  /// defragmentation then made good are not OOMs but `num_alloc_retries`.
  allocator_counters counters() const noexcept
    requires counting_allocator<Arena>
  {
    return rescues_.adjust(arena_.counters());
  }
  /// The arena's cap on reserved bytes, when it has one.
  std::size_t bytes_reservable_limit() const noexcept
    requires requires(const Arena& a) { a.bytes_reservable_limit(); }
  {
    return arena_.bytes_reservable_limit();
  }
  /// The arena's pieces, with pieces holding movable blocks reported `active` or `inactive`.
  template <class F>
  void for_each_block(F&& visit) const {
    detail::for_each_block_showing_movable(
        arena_, [&](auto note) { table_.for_each([&](handle, const entry& e) { note(e.b.ptr, e.locks > 0); }); },
        visit);
  }

  const options& get_options() const noexcept { return options_; }
  Arena& arena() noexcept { return arena_; }
  const Arena& arena() const noexcept { return arena_; }
  Arena& inner() noexcept { return arena_; }
  const Arena& inner() const noexcept { return arena_; }
  auto parts() noexcept { return std::tie(arena_); }
  auto parts() const noexcept { return std::tie(arena_); }

 private:
  struct entry {
    block b{};
    std::uint32_t locks = 0;
  };

  enum class kind : std::uint8_t { free, fixed, movable };
  struct piece {
    char* ptr;
    std::size_t size;
    std::size_t segment;  // index of the segment, in address order
    kind k;
    std::uint64_t id;   // the handle of a movable piece
    std::size_t bytes;  // the bytes a move of it copies (its requested size)
  };

  std::size_t footprint(std::size_t bytes) const noexcept {
    if constexpr (requires { arena_.chunk_size(bytes); }) {
      return arena_.chunk_size(bytes);
    } else {
      return detail::round_up(bytes == 0 ? 1 : bytes, movable_alignment);
    }
  }

  /// Every piece of the arena, in address order, classified; movable = unlocked movable block.
  std::vector<piece> snapshot() const {
    struct info_of {
      std::uint64_t id;
      std::size_t bytes;
      bool locked;
    };
    std::unordered_map<const void*, info_of> movable;
    movable.reserve(table_.size());
    table_.for_each([&](handle h, const entry& e) { movable.emplace(e.b.ptr, info_of{h.id, e.b.size, e.locks > 0}); });
    std::vector<piece> pieces;
    const void* segment = nullptr;
    std::size_t segment_index = 0;
    arena_.for_each_block([&](const block_info& info) {
      if (!pieces.empty() && info.segment != segment) ++segment_index;
      segment = info.segment;
      piece p{static_cast<char*>(const_cast<void*>(info.ptr)), info.size, segment_index, kind::fixed, 0, 0};
      if (info.state == block_state::free) {
        p.k = kind::free;
      } else if (const auto found = movable.find(info.ptr); found != movable.end() && !found->second.locked) {
        p.k = kind::movable;
        p.id = found->second.id;
        p.bytes = found->second.bytes;
      }
      pieces.push_back(p);
    });
    return pieces;
  }

  void free_movable(handle h, entry& e) noexcept {
    counters_.bytes_inactive -= e.b.size;
    addresses_.remove(e.b.ptr);
    arena_.deallocate(e.b);
    table_.erase(h);
  }

  /// Moves the unlocked movable block `id` to `where` (inside a free piece). False, with the block
  /// where it was, when the arena refuses the place or the copy fails.
  bool move(std::uint64_t id, char* where) noexcept {
    entry* e = table_.find(handle{id});
    if (e == nullptr || e->locks > 0) return false;
    const block moved = arena_.allocate_at(where, e->b.size);
    if (!moved) return false;
    if (!copier_.template copy_between<Arena, Arena>(moved.ptr, e->b.ptr, e->b.size)) {
      arena_.deallocate(moved);
      return false;
    }
    arena_.deallocate(e->b);
    addresses_.move(e->b.ptr, moved.ptr);
    e->b = moved;
    counters_.bytes_defragged += moved.size;
    ++counters_.num_moves;
    return true;
  }

  /// After the arena failed a request: defragment and retry, keeping the counters honest.
  block rescue(std::size_t bytes, std::size_t alignment) noexcept {
    return rescues_.rescue(arena_, [&] { return defragment_and_retry(bytes, alignment); });
  }

  block defragment_and_retry(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::is_power_of_two(alignment)) return {};
    std::size_t free_bytes = 0;
    arena_.for_each_block([&](const block_info& info) {
      if (info.state == block_state::free) free_bytes += info.size;
    });
    const std::size_t need = footprint(bytes);
    if (need == 0 || free_bytes < need) return {};  // not fragmentation: really out of memory
    if (open_hole(bytes, alignment)) {
      if (const block b = arena_.allocate(bytes, alignment)) return b;
    }
    // A window plan cut short (the arena refused a place): consolidate what is left.
    if (options_.consolidate && consolidate(bytes, alignment)) return arena_.allocate(bytes, alignment);
    return {};
  }

  bool open_hole(std::size_t bytes, std::size_t alignment) noexcept {
    try {
      return open_hole_or_throw(bytes, alignment);
    } catch (...) {  // out of host memory for the plan: nothing was moved
      return false;
    }
  }

  bool open_hole_or_throw(std::size_t bytes, std::size_t alignment) {
    const std::vector<piece> pieces = snapshot();
    const std::size_t need = footprint(bytes);
    if (need == 0 || !detail::is_power_of_two(alignment)) return false;
    struct window {
      std::size_t cost, first, last;  // pieces [first, last)
    };
    std::vector<window> windows;
    const auto end_of = [&](std::size_t i) { return pieces[i].ptr + pieces[i].size; };
    const auto cost_of = [&](std::size_t i) { return pieces[i].k == kind::movable ? pieces[i].bytes : 0; };
    for (std::size_t s = 0; s < pieces.size();) {
      if (pieces[s].k == kind::fixed) {
        ++s;
        continue;
      }
      std::size_t e = s;  // the run [s, e) of free and movable pieces of one segment
      while (e < pieces.size() && pieces[e].k != kind::fixed && pieces[e].segment == pieces[s].segment) ++e;
      std::size_t j = s, cost = 0, count = 0;  // window [i, j): bytes and number of its movable blocks
      for (std::size_t i = s; i < e; ++i) {
        if (j < i) {
          j = i;
          cost = count = 0;
        }
        const auto start = reinterpret_cast<std::uintptr_t>(pieces[i].ptr);
        const std::uintptr_t aligned = (start + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
        const auto spans = [&] { return j > i && reinterpret_cast<std::uintptr_t>(end_of(j - 1)) >= aligned + need; };
        while (j < e && !spans()) {
          cost += cost_of(j);
          count += pieces[j++].k == kind::movable ? std::size_t{1} : std::size_t{0};
        }
        if (spans() && count > 0) windows.push_back({cost, i, j});
        if (j > i) {
          cost -= cost_of(i);
          count -= pieces[i].k == kind::movable ? std::size_t{1} : std::size_t{0};
        }
      }
      s = e;
    }
    std::sort(windows.begin(), windows.end(), [](const window& l, const window& r) { return l.cost < r.cost; });
    const consolidation fallback =
        options_.consolidate ? plan_consolidation(pieces, bytes, alignment) : consolidation{};

    std::vector<std::pair<std::uint64_t, char*>> plan;
    std::vector<std::pair<std::size_t, std::uint64_t>> blocks;  // (footprint, id)
    for (std::size_t attempt = 0; attempt < windows.size() && attempt < options_.max_attempts; ++attempt) {
      const window& w = windows[attempt];
      if (fallback.cost != static_cast<std::size_t>(-1) && w.cost >= fallback.cost) break;  // consolidating is cheaper
      std::multimap<std::size_t, char*> holes;  // size -> start, outside the window
      for (std::size_t i = 0; i < pieces.size(); ++i) {
        if (pieces[i].k == kind::free && (i < w.first || i >= w.last)) holes.emplace(pieces[i].size, pieces[i].ptr);
      }
      blocks.clear();
      for (std::size_t i = w.first; i < w.last; ++i) {
        if (pieces[i].k == kind::movable) blocks.push_back({footprint(pieces[i].bytes), pieces[i].id});
      }
      std::sort(blocks.begin(), blocks.end(), [](const auto& l, const auto& r) { return l.first > r.first; });
      plan.clear();
      bool placed_all = true;
      for (const auto& [size, id] : blocks) {
        const auto hole = holes.lower_bound(size);
        if (hole == holes.end()) {
          placed_all = false;
          break;
        }
        plan.push_back({id, hole->second});
        const std::size_t left = hole->first - size;
        char* rest = hole->second + size;
        holes.erase(hole);
        if (left > 0) holes.emplace(left, rest);
      }
      if (!placed_all) continue;
      bool moved_any = false;
      for (const auto& [id, where] : plan) {
        if (!move(id, where)) break;
        moved_any = true;
      }
      if (moved_any) ++counters_.num_defragmentations;
      return moved_any;
    }
    return carry_out(pieces, fallback);
  }

  /// Packing: blocks of later segments first fit into holes of earlier segments (when
  /// `evacuate`), then every segment is slid together. Returns the bytes moved.
  std::size_t pack(bool evacuate) noexcept {
    std::size_t moved = 0;
    try {
      if (evacuate) moved += evacuate_segments();
      moved += slide();
    } catch (...) {  // out of host memory for a snapshot: stop; every block is intact
    }
    return moved;
  }

  /// Moves blocks into the lowest-addressed hole of an earlier segment that fits them.
  std::size_t evacuate_segments() {
    const std::vector<piece> pieces = snapshot();
    struct hole {
      std::size_t segment;
      char* ptr;
      std::size_t size;
    };
    std::vector<hole> holes;
    for (const piece& p : pieces) {
      if (p.k == kind::free) holes.push_back({p.segment, p.ptr, p.size});
    }
    std::size_t moved = 0;
    for (const piece& p : pieces) {
      if (p.k != kind::movable) continue;
      const std::size_t bytes = table_.find(handle{p.id})->b.size;
      const std::size_t size = footprint(bytes);
      for (hole& h : holes) {
        if (h.segment >= p.segment) break;
        if (h.size < size) continue;
        if (move(p.id, h.ptr)) {
          h.ptr += size;
          h.size -= size;
          moved += bytes;
        }
        break;
      }
    }
    return moved;
  }

  /// Slides every unlocked movable block down to the end of the piece before it that stays (a raw
  /// or locked block, a block already slid, or the segment's start): afterwards each segment's
  /// free bytes form one hole after each fixed piece and one at its end.
  std::size_t slide() {
    const std::vector<piece> pieces = snapshot();
    std::size_t moved = 0;
    char* cursor = nullptr;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const piece& p = pieces[i];
      if (i == 0 || p.segment != pieces[i - 1].segment) cursor = p.ptr;
      if (p.k == kind::free) continue;
      if (p.k == kind::fixed) {
        cursor = p.ptr + p.size;
        continue;
      }
      const std::size_t bytes = table_.find(handle{p.id})->b.size;
      if (cursor < p.ptr && slide_block(p.id, cursor)) {
        moved += bytes;
        cursor += footprint(bytes);
      } else {
        cursor = p.ptr + p.size;
      }
    }
    return moved;
  }

  /// Moves block `id` to `target`, below or above it, where everything between the block and its
  /// new place is free; the two ranges may overlap.
  bool slide_block(std::uint64_t id, char* target) noexcept {
    entry* e = table_.find(handle{id});
    const block old = e->b;
    const std::size_t size = footprint(old.size);
    char* from = static_cast<char*>(old.ptr);
    const std::size_t distance = static_cast<std::size_t>(target < from ? from - target : target - from);
    if (distance >= size) return move(id, target);
    arena_.deallocate(old);  // the arena keeps its bookkeeping outside the block: content stays
    const block moved = arena_.allocate_at(target, old.size);
    if (!moved) {
      e->b = arena_.allocate_at(old.ptr, old.size);  // back where it was (that place is free)
      return false;
    }
    copier_.template move_within<Arena::host_accessible>(moved.ptr, old.ptr, old.size);
    addresses_.move(old.ptr, moved.ptr);
    e->b = moved;
    counters_.bytes_defragged += old.size;
    ++counters_.num_moves;
    return true;
  }

  /// The fallback when no window can be relocated: within one run of pieces between raw or
  /// locked blocks (or segment ends) whose free bytes suffice, the blocks left of a pivot slide
  /// down and those right of it slide up, so the run's free bytes become one hole at the pivot.
  /// The run and pivot are those that copy the fewest bytes (O(n) with prefix sums). True when
  /// it moved anything.
  bool consolidate(std::size_t bytes, std::size_t alignment) noexcept {
    try {
      return consolidate_or_throw(bytes, alignment);
    } catch (...) {  // out of host memory for the snapshot: nothing was moved
      return false;
    }
  }

  struct consolidation {
    std::size_t cost = static_cast<std::size_t>(-1);  // -1: no run has enough free bytes
    std::size_t first = 0, last = 0, pivot = 0;       // the run [first, last) and the pivot
  };

  /// The run and pivot whose consolidation copies the fewest bytes.
  consolidation plan_consolidation(const std::vector<piece>& pieces, std::size_t bytes, std::size_t alignment) const {
    const std::size_t need = footprint(bytes) + (alignment > movable_alignment ? alignment - movable_alignment : 0);
    consolidation best;
    for (std::size_t s = 0; s < pieces.size();) {
      if (pieces[s].k == kind::fixed) {
        ++s;
        continue;
      }
      std::size_t e = s, free = 0;
      while (e < pieces.size() && pieces[e].k != kind::fixed && pieces[e].segment == pieces[s].segment) {
        if (pieces[e].k == kind::free) free += pieces[e].size;
        ++e;
      }
      if (free >= need) {
        // left(p): bytes of blocks in [s, p) after the run's first free piece (they slide down);
        // right(p): bytes of blocks in [p, e) before the run's last free piece (they slide up).
        std::size_t first_free = e, last_free = s;
        for (std::size_t i = s; i < e; ++i) {
          if (pieces[i].k == kind::free) {
            if (first_free == e) first_free = i;
            last_free = i;
          }
        }
        std::size_t right = 0;
        for (std::size_t i = s; i < last_free; ++i) right += pieces[i].k == kind::movable ? pieces[i].bytes : 0;
        std::size_t left = 0;
        for (std::size_t p = s; p <= e; ++p) {
          if (left + right < best.cost) best = {left + right, s, e, p};
          if (p == e) break;
          if (pieces[p].k == kind::movable) {
            if (p > first_free) left += pieces[p].bytes;
            if (p < last_free) right -= pieces[p].bytes;
          }
        }
      }
      s = e;
    }
    return best;
  }

  bool consolidate_or_throw(std::size_t bytes, std::size_t alignment) {
    const std::vector<piece> pieces = snapshot();
    return carry_out(pieces, plan_consolidation(pieces, bytes, alignment));
  }

  bool carry_out(const std::vector<piece>& pieces, const consolidation& plan) noexcept {
    const std::size_t best_cost = plan.cost, best_first = plan.first, best_last = plan.last, best_pivot = plan.pivot;
    if (best_cost == static_cast<std::size_t>(-1) || best_cost == 0) return false;
    bool moved = false;
    // Left part: slide down from the run's start.
    char* cursor = pieces[best_first].ptr;
    for (std::size_t i = best_first; i < best_pivot; ++i) {
      const piece& p = pieces[i];
      if (p.k != kind::movable) continue;
      if (cursor < p.ptr && slide_block(p.id, cursor)) {
        moved = true;
        cursor += footprint(p.bytes);
      } else {
        cursor = p.ptr + p.size;
      }
    }
    // Right part: slide up to the run's end.
    cursor = pieces[best_last - 1].ptr + pieces[best_last - 1].size;
    for (std::size_t i = best_last; i-- > best_pivot;) {
      const piece& p = pieces[i];
      if (p.k != kind::movable) continue;
      char* target = cursor - footprint(p.bytes);
      if (target > p.ptr && slide_block(p.id, target)) {
        moved = true;
        cursor = target;
      } else {
        cursor = p.ptr;
      }
    }
    if (moved) ++counters_.num_defragmentations;
    return moved;
  }

  void free_all() noexcept {
    table_.for_each([&](handle, entry& e) { arena_.deallocate(e.b); });
    table_ = {};
    addresses_.clear();
  }

  static constexpr const char* who = "compacting_defragmenter";

  Arena arena_{};
  detail::handle_table<entry> table_{};
  detail::movable_addresses addresses_{};  // where the movable blocks lie
  options options_{};
  copy_engine copier_{};
  movable_counters counters_{};
  detail::rescue_tally rescues_{};  // requests served after a defragmentation
  misuse_counts misuses_{};
};

}  // namespace alloy
