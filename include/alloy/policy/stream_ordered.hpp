// SPDX-License-Identifier: Apache-2.0
// alloy/policy/stream_ordered.hpp
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/detail/forwarding.hpp>
#include <alloy/graph_pool.hpp>
#include <alloy/misuse.hpp>
#include <alloy/stream.hpp>

namespace alloy {

/// What `stream_ordered` did to keep streams apart (for tests, benchmarks and tuning).
struct stream_order_counters {
  std::size_t events_recorded = 0;        ///< events recorded at stream frees (and recorded uses)
  std::size_t stream_waits = 0;           ///< device-side waits: a stream reused memory of another
  std::size_t host_synchronizations = 0;  ///< the slow path: the host waited for stream work
  /// Of those, waits for every stream's pending frees at once (before memory goes back to the
  /// upstream: on `release()`, or when `Inner` could serve a request only by releasing); PyTorch's
  /// `num_sync_all_streams`, which `alloy::memory_stats` reports from this.
  std::size_t all_stream_synchronizations = 0;
  std::size_t capture_refusals = 0;  ///< requests failed because a capture forbade the upstream or a wait
  std::size_t deferred_frees = 0;    ///< frees of blocks from before a capture, kept until it ended
};

/// `stream_ordered<Inner, Stream>` gives `Inner` (a `best_fit_arena`, a `size_class_pool`, or a
/// composite of them) the stream-ordered calls of docs/design.md#concepts, safe by construction.
///
/// - Stream contract (as RMM's): memory from `allocate(bytes, alignment, s)` is ready for work
///   enqueued on `s` after the call. `deallocate(block, s)` may be called once the last work using
///   the block is *enqueued* on `s`: later work on `s` reuses it at once, another stream `t` only
///   after waiting on an event recorded at the free (a device-side wait; the host never blocks on
///   this path). A block used on other streams too is named with `alloy::record_use(alloc, block,
///   stream)` (PyTorch's `record_stream`, enforced by events). The stream-less `allocate` returns
///   memory ready on every stream and the host; the stream-less `deallocate` means no work still
///   uses the block.
/// - Strategy: a freed block goes straight back to `Inner` and coalesces whatever stream freed it,
///   so several streams need no more memory than one (per-stream free lists fragment, rmm#2039).
///   Behind stays a map of *pending ranges* (freed on a stream, with the events recorded then); a
///   stream handed memory that overlaps other streams' pending ranges waits on their events. Only
///   when `Inner` cannot serve without giving memory back (`allocate_keeping_cache` fails) does
///   the host synchronize every pending event, after which `allocate` may release and retry.
///   While every call uses one stream, no events are recorded and no ranges kept.
/// - Requirements: `Inner` is `cache_keeping_allocator`, so that no memory reaches the upstream
///   while a stream may still use it; `release()` and destruction synchronize first. Do not
///   release `Inner` behind this policy's back.
/// - Complexity: one stream, that of `Inner`; several, O(log r) per call for r pending ranges plus
///   one event record per free (complete ranges are pruned when the map doubles).
/// - Failure: as `Inner`. When an event cannot be created, recorded or waited on, or host metadata
///   cannot grow, the host synchronizes instead: slower, never unsafe. A free `Inner` refuses
///   (checked frees) records no pending range, and `try_deallocate` (both forms) says so; frees
///   that do not reach `Inner` at once (under a capture, of a pool's block) are checked here
///   (asking `Inner`'s `free_misuse` when it has it) and refused bad (`misuses()`).
/// - CUDA graphs (a `capturable_stream`; docs/design.md#cuda-graphs): each call probes its stream
///   once; while a capture is known, no event is queried or synchronized, `Inner` grows only in
///   the relaxed mode (else it serves from its cache or the request fails), nothing is released,
///   frees of earlier blocks wait for the capture's end (any free reaches `Inner`, which may give
///   memory back, only after the strict captures), and the capture's blocks stay in a pool:
///   its own, or a `graph_pool` (`begin_allocate_to_pool`, `end_allocate_to_pool`, `release_pool`).
/// - Thread safety: none (wrap in `synchronized`). Movable, not copyable.
/// - Memory kind: `Inner`'s. Capabilities: the queries of `Inner` (`release` and
///   `release_detached` synchronize first), checked frees when `Inner` has them, `record_use`,
///   `order_counters()`; tags and offload when `Inner` has them (the current tag tags the
///   stream-ordered allocations), but no per-call tag or `free_misuse` (its waiting frees).
/// - Defaults chosen by measurement: bench/README.md#streams
template <cache_keeping_allocator Inner, stream Stream>
class stream_ordered : public detail::forwards_queries<stream_ordered<Inner, Stream>, Inner> {
  using traits = stream_traits<Stream>;
  using event_type = typename traits::event_type;
  using book = detail::capture_book<Stream>;
  static constexpr bool capturable = capturable_stream<Stream>;

 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;

  stream_ordered() = default;
  explicit stream_ordered(Inner inner) : inner_(std::move(inner)) {}
  stream_ordered(const stream_ordered&) = delete;
  stream_ordered& operator=(const stream_ordered&) = delete;
  stream_ordered(stream_ordered&& other) noexcept
      : inner_(std::move(other.inner_)),
        mode_(std::exchange(other.mode_, mode::unused)),
        sole_(other.sole_),
        pending_(std::move(other.pending_)),
        slots_(std::move(other.slots_)),
        free_slots_(std::move(other.free_slots_)),
        uses_(std::move(other.uses_)),
        prune_at_(other.prune_at_),
        counters_(other.counters_),
        misuses_(other.misuses_),
        book_(std::move(other.book_)),
        held_back_(std::move(other.held_back_)) {
    other.pending_.clear();
    other.slots_.clear();
    other.free_slots_.clear();
    other.uses_.clear();
  }
  stream_ordered& operator=(stream_ordered&&) = delete;
  ~stream_ordered() {
    synchronize_all();
    release_held_back();
    for (event_slot& s : slots_) {
      if (s.created) traits::destroy(s.event);
    }
  }

  // ---- the allocator ---------------------------------------------------------------------------

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if constexpr (capturable) {
      if (!book_.captures.empty()) {
        settle(nullptr, {});
        if (quiet()) return allocate_quietly(bytes, alignment, nullptr);
      }
    }
    if (mode_ == mode::single) start_tracking();
    const block b = allocate_inner(bytes, alignment);
    if (b && mode_ == mode::tracking) claim(b, nullptr);
    return b;
  }
  void deallocate(block b) noexcept { (void)free_block(b, nullptr); }
  /// Checked deallocation, when `Inner` has it: false (and nothing recorded) for a free `Inner`
  /// refused as misuse.
  bool try_deallocate(block b) noexcept
    requires checked_deallocating_allocator<Inner>
  {
    return free_block(b, nullptr);
  }

  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    if constexpr (capturable) {
      const capture_state cs = traits::capture(stream);
      if (cs.capturing() || !book_.captures.empty()) [[unlikely]]
        return allocate_aware(bytes, alignment, stream, cs);
    }
    return allocate_ordered(bytes, alignment, stream);
  }
  void deallocate(block b, Stream stream) noexcept { (void)free_block(b, &stream); }
  bool try_deallocate(block b, Stream stream) noexcept
    requires checked_deallocating_allocator<Inner>
  {
    return free_block(b, &stream);
  }

  /// `b` (a live block from this allocator) is also used by work enqueued on `stream`; when it is
  /// freed, it is not reused until that work is done too. Throws `std::bad_alloc` if the use
  /// cannot be stored (nothing changes then). A block that is not live at that size (asked of
  /// `Inner` when it has `free_misuse`, else only whether an `Inner` with `owns` holds it) is
  /// refused and counted in `misuses()`: its use would be kept until that address is freed.
  void record_use(block b, Stream stream) {
    if (const misuse bad = use_misuse(b); bad != misuse::none) {
      (void)refused(bad, b);
      return;
    }
    if constexpr (capturable) {
      const capture_state cs = traits::capture(stream);
      if (cs.capturing() || !book_.captures.empty()) {
        settle(&stream, cs);
        if ((cs.capturing() || quiet()) && !note_quietly(stream)) return;
      }
    }
    note(stream);
    if (mode_ != mode::tracking || b.ptr == nullptr) return;  // one stream: order is enough
    std::vector<Stream>& streams = uses_[b.ptr];
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  }

  /// Synchronizes with every pending stream free, then releases `Inner`'s cached memory.
  void release() noexcept
    requires releasing_allocator<Inner>
  {
    if (!may_synchronize()) return;
    synchronize_all();
    inner_.release();
  }
  /// As `release()`, in two phases (`detaching_release_allocator`): each call synchronizes first.
  bool release_detached(detached_segments& out) noexcept
    requires detaching_release_allocator<Inner>
  {
    if (!may_synchronize()) return true;
    synchronize_all();
    return inner_.release_detached(out);
  }

  /// Not passed on: a free waiting for its stream's work or a capture's end, or a graph pool's
  /// free block, is free to its caller but live to `Inner`.
  misuse free_misuse(block) const noexcept = delete;

  const stream_order_counters& order_counters() const noexcept { return counters_; }
  /// Bad frees refused here, not by `Inner`: a graph pool's block freed twice or at another size;
  /// under a capture, a block freed again while its free waits for the capture's end, or one
  /// `Inner` does not own; and `record_use` of a block `Inner` does not own. `Inner` counts the
  /// others.
  misuse_counts misuses() const noexcept { return misuses_; }
  /// Address ranges freed on a stream whose events were not yet seen complete.
  std::size_t pending_ranges() const noexcept { return pending_.size(); }

  // ---- CUDA graphs ------------------------------------------------------------------------------

  /// Routes the allocations of the capture running on `stream` to `pool` (until
  /// `end_allocate_to_pool`). False when `stream` is not capturing, or metadata cannot grow.
  bool begin_allocate_to_pool(graph_pool& pool, Stream stream) noexcept
    requires capturable_stream<Stream>
  {
    const capture_state cs = traits::capture(stream);
    settle(&stream, cs);
    if (!cs.capturing()) return false;
    try {
      typename book::capture* c = capture_for(cs, stream);
      if (c == nullptr) return false;
      typename book::pool& p = book_.pools[book::user_pool(pool)];
      if (p.released) {  // in use again: its waiting release is cancelled
        p.released = false;
        --book_.released_waiting;
      }
      c->pool = book::user_pool(pool);
      return true;
    } catch (const std::bad_alloc&) {
      return false;
    }
  }
  /// Later allocations of the captures routed to `pool` go to their own pools again.
  void end_allocate_to_pool(graph_pool& pool) noexcept
    requires capturable_stream<Stream>
  {
    for (typename book::capture& c : book_.captures) {
      if (c.pool == book::user_pool(pool)) c.pool = book::own_pool(c.id);
    }
  }
  /// No graph of `pool` will run again (its last launch is complete): its free blocks become free
  /// for everyone, and its live blocks when they are freed. While a capture that is routed to the
  /// pool or took a block of it runs, the pool stays as it is (routing included) until every such
  /// capture has ended; `begin_allocate_to_pool` meanwhile cancels the release.
  void release_pool(graph_pool& pool) noexcept
    requires capturable_stream<Stream>
  {
    const typename book::key key = book::user_pool(pool);
    if (!book_.captures.empty()) settle(nullptr, {});
    if (const auto p = book_.pools.find(key); p != book_.pools.end() && book_.hold_release(key)) {
      if (!p->second.released) ++book_.released_waiting;
      p->second.released = true;
      return;
    }
    end_allocate_to_pool(pool);
    drop_pool(key);
  }
  /// What the private pools hold.
  graph_pool_figures pool_figures() const noexcept {
    alloy::graph_pool_figures f;
    for (const auto& [key, p] : book_.pools) {
      if (p.live_bytes + p.free_bytes == 0) continue;
      ++f.pools;
      f.live_bytes += p.live_bytes;
      f.free_bytes += p.free_bytes;
    }
    f.deferred = book_.deferred.size() + held_back_.size();
    return f;
  }

  Inner& inner() noexcept { return inner_; }
  const Inner& inner() const noexcept { return inner_; }
  auto parts() noexcept { return std::tie(inner_); }

 private:
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();

  enum class mode : std::uint8_t {
    unused,    ///< no stream call yet
    single,    ///< every stream call so far used `sole_`
    tracking,  ///< several streams: pending ranges and events
  };

  /// An event recorded on `stream`; slots of one free are chained through `next`, the head
  /// counts the pending ranges that refer to the chain.
  struct event_slot {
    event_type event{};
    Stream stream{};
    std::uint32_t next = none;
    std::uint32_t refs = 0;
    bool created = false;
    bool complete = false;  ///< seen complete (the head's flag covers the chain)
  };
  struct pending_range {
    std::uintptr_t end;
    std::uint32_t events;  ///< head slot
  };

  void note(Stream stream) noexcept {
    if (mode_ == mode::unused) {
      mode_ = mode::single;
      sole_ = stream;
    } else if (mode_ == mode::single && !(stream == sole_)) {
      start_tracking();
    }
  }

  /// Leaves the single-stream fast path: the one stream's frees were not tracked, so its work is
  /// waited for once.
  void start_tracking() noexcept {
    if (mode_ == mode::single) {
      traits::synchronize(sole_);
      ++counters_.host_synchronizations;
    }
    mode_ = mode::tracking;
  }

  /// A free, on `*stream` or (null) of a block no stream work uses any more. Over an `Inner` that
  /// checks its frees, a refused free records nothing: the block was not this allocator's, or
  /// not live, and its range must not be held back.
  bool free_block(block b, const Stream* stream) noexcept {
    if constexpr (capturable) {
      capture_state cs{};
      if (stream != nullptr) cs = traits::capture(*stream);
      if (cs.capturing() || !book_.captures.empty() || !book_.blocks.empty()) [[unlikely]]
        return free_aware(b, stream, cs);
    }
    return free_now(b, stream);
  }

  /// `allocate` on a stream, outside captures.
  block allocate_ordered(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    note(stream);
    const block b = allocate_inner(bytes, alignment);
    if (b && mode_ == mode::tracking) claim(b, &stream);
    return b;
  }
  /// `allocate` on a stream while a capture runs (on it, or one alloy knows of elsewhere).
  [[gnu::noinline]] block allocate_aware(std::size_t bytes, std::size_t alignment, Stream stream,
                                         capture_state cs) noexcept {
    settle(&stream, cs);
    if (cs.capturing()) return allocate_captured(bytes, alignment, stream, cs);
    if (quiet()) return allocate_quietly(bytes, alignment, &stream);
    return allocate_ordered(bytes, alignment, stream);
  }
  /// A free while a capture runs, or of a block that may be a pool's.
  [[gnu::noinline]] bool free_aware(block b, const Stream* stream, capture_state cs) noexcept {
    if (cs.capturing() || !book_.captures.empty()) settle(stream, cs);
    if (const auto found = book_.blocks.find(b.ptr); found != book_.blocks.end()) {
      if (const misuse bad = pooled_misuse(found->second, b); bad != misuse::none) return refused(bad, b);
      if (found->second.pool != book::ordinary) return pool_free(found->second, b, stream, cs.capturing() ? cs.id : 0);
      b.size = found->second.size;  // a pool's block that left it: freed at the size `Inner` gave
      book_.blocks.erase(found);
    }
    if (cs.capturing()) return defer(b, *stream, cs);
    return free_now(b, stream);
  }

  bool free_now(block b, const Stream* stream) noexcept {
    if (stream != nullptr) {
      if constexpr (capturable) {
        if (quiet() && !note_quietly(*stream)) return defer(b, *stream, capture_of(sole_));
      }
      note(*stream);
    }
    const bool track = stream != nullptr && mode_ == mode::tracking && b.ptr != nullptr && b.size != 0;
    if (strict_capture_known()) [[unlikely]] {
      if (!hold_back(b)) return false;
      if (track) remember(b, *stream);
    } else if constexpr (checked_deallocating_allocator<Inner>) {
      if (!inner_.try_deallocate(b)) return false;
      if (track) remember(b, *stream);  // nothing ran between the free and this record
    } else {
      if (track) remember(b, *stream);
      inner_.deallocate(b);
    }
    if (!uses_.empty()) uses_.erase(b.ptr);
    return true;
  }

  block allocate_inner(std::size_t bytes, std::size_t alignment) noexcept {
    if (const block b = inner_.allocate_keeping_cache(bytes, alignment)) return b;
    // Inner would have to give memory back to its upstream: only safe when no stream work is left.
    synchronize_all();
    return inner_.allocate(bytes, alignment);
  }

  /// Orders the new owner `stream` (or the host, when null) after every pending free that
  /// overlaps `b`, and forgets the overlapped parts of those ranges.
  void claim(block b, const Stream* stream) noexcept {
    if (pending_.empty() || b.size == 0) return;
    const auto lo = reinterpret_cast<std::uintptr_t>(b.ptr);
    claim_range(lo, lo + b.size, stream, true);
  }
  /// Forgets the pending ranges over `[lo, hi)`, keeping the parts outside; first orders `stream`
  /// (or the host) after them when `order`.
  void claim_range(std::uintptr_t lo, std::uintptr_t hi, const Stream* stream, bool order) noexcept {
    auto it = pending_.upper_bound(lo);
    if (it != pending_.begin() && std::prev(it)->second.end > lo) --it;
    while (it != pending_.end() && it->first < hi) {
      const std::uintptr_t start = it->first;
      const pending_range range = it->second;
      if (order) order_after(range.events, stream);
      it = pending_.erase(it);
      // Keep the parts outside `b`; they share the events. Insertion failing just forgets them
      // after synchronizing, which is safe.
      if (start < lo) keep_piece(start, lo, range.events);
      if (range.end > hi) it = keep_piece(hi, range.end, range.events);
      drop_ref(range.events);
    }
  }

  typename std::map<std::uintptr_t, pending_range>::iterator keep_piece(std::uintptr_t start, std::uintptr_t end,
                                                                        std::uint32_t events) noexcept {
    try {
      const auto [it, inserted] = pending_.emplace(start, pending_range{end, events});
      ++slots_[events].refs;
      return std::next(it);
    } catch (const std::bad_alloc&) {
      synchronize_chain(events);
      return pending_.lower_bound(end);
    }
  }

  void order_after(std::uint32_t head, const Stream* stream) noexcept {
    if (slots_[head].complete) return;
    bool all_complete = true;
    for (std::uint32_t s = head; s != none; s = slots_[s].next) {
      event_slot& slot = slots_[s];
      if (stream != nullptr && slot.stream == *stream) {
        all_complete = false;  // ordered by the stream itself, but not known complete
        continue;
      }
      if (traits::ready(slot.event)) continue;
      if (stream != nullptr && traits::wait(*stream, slot.event)) {
        ++counters_.stream_waits;
      } else {
        traits::synchronize(slot.event);
        ++counters_.host_synchronizations;
      }
      all_complete = false;
    }
    if (all_complete) slots_[head].complete = true;
  }

  /// Records the free of `b` on `stream` (and on the streams of its recorded uses).
  void remember(block b, Stream stream) noexcept {
    std::uint32_t head = record(stream, none);
    if (const auto found = uses_.find(b.ptr); found != uses_.end()) {
      for (const Stream& other : found->second) {
        if (!(other == stream)) head = record(other, head);
      }
    }
    if (head == none) return;  // every recording fell back to a host synchronization
    const auto lo = reinterpret_cast<std::uintptr_t>(b.ptr);
    const std::uintptr_t hi = lo + b.size;
    // Nothing pending overlaps a live block, unless the caller freed it twice; then forget the
    // older ranges (the free is a misuse `Inner` reports).
    claim_quietly(lo, hi);
    slots_[head].refs = 1;
    try {
      pending_.emplace(lo, pending_range{hi, head});
    } catch (const std::bad_alloc&) {
      slots_[head].refs = 0;
      synchronize_chain(head);
      free_chain(head);
      return;
    }
    if (pending_.size() >= prune_at_ && !quiet()) prune();
  }

  /// Records an event on `stream` in a fresh slot chained before `next`; on failure the host
  /// waits for `stream` and the chain is returned unchanged.
  std::uint32_t record(Stream stream, std::uint32_t next) noexcept {
    const std::uint32_t s = take_slot();
    if (s != none && traits::record(slots_[s].event, stream)) {
      ++counters_.events_recorded;
      event_slot& slot = slots_[s];
      slot.stream = stream;
      slot.next = next;
      slot.refs = 0;
      slot.complete = false;
      return s;
    }
    if (s != none) free_slots_.push_back(s);
    traits::synchronize(stream);
    ++counters_.host_synchronizations;
    return next;
  }

  std::uint32_t take_slot() noexcept {
    if (free_slots_.empty()) {
      try {
        slots_.emplace_back();
        free_slots_.reserve(slots_.capacity());  // so giving slots back cannot throw
      } catch (const std::bad_alloc&) {
        if (slots_.size() > free_slots_.capacity()) slots_.pop_back();
        return none;
      }
      free_slots_.push_back(static_cast<std::uint32_t>(slots_.size() - 1));
    }
    const std::uint32_t s = free_slots_.back();
    event_slot& slot = slots_[s];
    if (!slot.created) {
      if (!traits::create(slot.event)) return none;  // stays in the free list
      slot.created = true;
    }
    free_slots_.pop_back();
    return s;
  }

  /// Ranges over a block being freed: older frees of it (a double free `Inner` reports), or the
  /// range that stands for everything free when tracking started under a capture.
  void claim_quietly(std::uintptr_t lo, std::uintptr_t hi) noexcept { claim_range(lo, hi, nullptr, false); }

  void drop_ref(std::uint32_t head) noexcept {
    if (--slots_[head].refs == 0) free_chain(head);
  }
  void free_chain(std::uint32_t head) noexcept {
    for (std::uint32_t s = head; s != none;) {
      const std::uint32_t next = slots_[s].next;
      slots_[s].next = none;
      free_slots_.push_back(s);  // capacity reserved in take_slot
      s = next;
    }
  }

  bool chain_complete(std::uint32_t head) noexcept {
    if (slots_[head].complete) return true;
    for (std::uint32_t s = head; s != none; s = slots_[s].next) {
      if (!traits::ready(slots_[s].event)) return false;
    }
    slots_[head].complete = true;
    return true;
  }
  void synchronize_chain(std::uint32_t head) noexcept {
    if (slots_[head].complete) return;
    for (std::uint32_t s = head; s != none; s = slots_[s].next) traits::synchronize(slots_[s].event);
    slots_[head].complete = true;
  }

  /// Drops the ranges whose events are all complete; the next prune waits until the map doubles.
  void prune() noexcept {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (chain_complete(it->second.events)) {
        drop_ref(it->second.events);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    prune_at_ = std::max<std::size_t>(min_prune, 2 * pending_.size());
  }

  /// The host waits for every pending free (or for the one stream, before tracking started).
  void synchronize_all() noexcept {
    if (mode_ == mode::single) {
      traits::synchronize(sole_);
      ++counters_.host_synchronizations;
      ++counters_.all_stream_synchronizations;
      return;
    }
    if (pending_.empty()) return;
    for (auto& [start, range] : pending_) {
      synchronize_chain(range.events);
      drop_ref(range.events);
    }
    pending_.clear();
    ++counters_.host_synchronizations;
    ++counters_.all_stream_synchronizations;
  }

  // ---- captures (docs/design.md#cuda-graphs) -----------------------------------------------------

  /// A capture is known: no event is queried or synchronized, nothing released.
  bool quiet() const noexcept {
    if constexpr (capturable) return !book_.captures.empty();
    else return false;
  }
  bool may_synchronize() noexcept {
    if constexpr (capturable) {
      if (!book_.captures.empty()) settle(nullptr, {});
    }
    return !quiet();
  }
  block refuse() noexcept {
    ++counters_.capture_refusals;
    return {};
  }

  /// `note` without a host wait: a second stream starts tracking with every free byte ordered
  /// after the first stream's work so far (one range over all addresses, with an event). False
  /// when that stream is capturing (its event could not be waited on outside the capture).
  bool note_quietly(Stream stream) noexcept {
    if (mode_ == mode::unused) {
      mode_ = mode::single;
      sole_ = stream;
    }
    if (mode_ != mode::single || stream == sole_) return true;
    if (capture_of(sole_).capturing()) return false;
    const std::uint32_t s = take_slot();
    if (s == none) return false;
    if (!traits::record(slots_[s].event, sole_)) {
      free_slots_.push_back(s);
      return false;
    }
    ++counters_.events_recorded;
    slots_[s] = {std::move(slots_[s].event), sole_, none, 1, true, false};
    try {
      pending_.emplace(0, pending_range{std::numeric_limits<std::uintptr_t>::max(), s});
    } catch (const std::bad_alloc&) {
      slots_[s].refs = 0;
      free_chain(s);
      return false;
    }
    mode_ = mode::tracking;
    return true;
  }

  /// Memory `Inner` has cached: its upstream only when every known capture is relaxed. Otherwise
  /// `allocate_cached`, which makes no upstream call; an `Inner` without it serves nothing then.
  block cached(std::size_t bytes, std::size_t alignment) noexcept {
    if (!strict_capture_known()) return inner_.allocate_keeping_cache(bytes, alignment);
    if constexpr (cache_serving_allocator<Inner>) {
      return inner_.allocate_cached(bytes, alignment);
    } else {
      return {};
    }
  }

  /// Orders `stream` after the pending frees over `b` without asking whether they are done (a
  /// capture records a wait on an event from outside it), then forgets them. False (nothing
  /// changed) when a wait failed.
  bool claim_without_query(block b, Stream stream, bool capturing) noexcept {
    if (pending_.empty() || b.size == 0) return true;
    const auto lo = reinterpret_cast<std::uintptr_t>(b.ptr);
    const std::uintptr_t hi = lo + b.size;
    auto it = pending_.upper_bound(lo);
    if (it != pending_.begin() && std::prev(it)->second.end > lo) --it;
    for (; it != pending_.end() && it->first < hi; ++it) {
      if (slots_[it->second.events].complete) continue;
      for (std::uint32_t s = it->second.events; s != none; s = slots_[s].next) {
        if (slots_[s].stream == stream) continue;
        bool waited = false;
        if constexpr (capturable) {
          waited = capturing ? traits::wait_external(stream, slots_[s].event) : traits::wait(stream, slots_[s].event);
        }
        if (!waited) return false;
        ++counters_.stream_waits;
      }
    }
    claim_range(lo, hi, nullptr, false);
    return true;
  }
  bool pending_incomplete(block b) const noexcept {
    if (pending_.empty() || b.size == 0) return false;
    const auto lo = reinterpret_cast<std::uintptr_t>(b.ptr);
    auto it = pending_.upper_bound(lo);
    if (it != pending_.begin() && std::prev(it)->second.end > lo) --it;
    for (; it != pending_.end() && it->first < lo + b.size; ++it) {
      if (!slots_[it->second.events].complete) return true;
    }
    return false;
  }

  /// An allocation outside any capture while one is known (on `*stream`, or for the host).
  block allocate_quietly(std::size_t bytes, std::size_t alignment, const Stream* stream) noexcept {
    if (stream != nullptr ? !note_quietly(*stream) : mode_ == mode::single) return refuse();
    const block b = cached(bytes, alignment);
    if (!b) return refuse();
    if (mode_ == mode::tracking) {
      const bool ordered = stream != nullptr ? claim_without_query(b, *stream, false) : !pending_incomplete(b);
      if (!ordered) {
        give_back_unused(b);
        return refuse();
      }
      if (stream == nullptr)
        claim_range(reinterpret_cast<std::uintptr_t>(b.ptr), reinterpret_cast<std::uintptr_t>(b.ptr) + b.size, nullptr,
                    false);
    }
    return b;
  }

  typename book::capture* capture_for(capture_state cs, Stream stream) {
    if (typename book::capture* c = book_.find(cs.id)) return c;
    book_.captures.push_back(
        {cs.id, stream, cs.mode, cs.state == capture_state::status::invalidated, book::own_pool(cs.id), {}});
    return &book_.captures.back();
  }

  /// An allocation inside the capture `cs` running on `stream`: from its pool's free blocks, else
  /// from `Inner`'s cache (ordered after other streams' frees by waits the graph records).
  block allocate_captured(std::size_t bytes, std::size_t alignment, Stream stream, capture_state cs) noexcept {
    try {
      typename book::capture* c = capture_for(cs, stream);
      if (cs.state == capture_state::status::invalidated) c->invalidated = true;
      if (!note_quietly(stream)) return refuse();
      typename book::pool& pool = book_.pools[c->pool];
      if (const block b = book_.take(pool, *c, bytes, alignment, stream)) return b;
      const block b = cached(bytes, alignment);
      if (!b) return refuse();
      try {
        book_.blocks.emplace(b.ptr, typename book::pooled{b.size, b.size, c->pool, 1, c->id, 0, stream, false, false});
        if (c->pool != book::own_pool(c->id)) c->taken.push_back(b.ptr);
      } catch (const std::bad_alloc&) {
        book_.blocks.erase(b.ptr);
        give_back_unused(b);
        return refuse();
      }
      if (mode_ == mode::tracking && !claim_without_query(b, stream, true)) {
        book_.blocks.erase(b.ptr);
        if (!c->taken.empty() && c->taken.back() == b.ptr) c->taken.pop_back();
        give_back_unused(b);
        return refuse();
      }
      pool.live_bytes += b.size;
      return b;
    } catch (const std::bad_alloc&) {
      return refuse();
    }
  }

  /// A free of a block of a private pool: it stays in the pool.
  bool pool_free(typename book::pooled& pb, block b, const Stream* stream, unsigned long long capture) noexcept {
    typename book::pool& pool = book_.pools[pb.pool];
    pb.free = true;
    pb.freed_in = capture;
    pb.freed_on_stream = stream != nullptr;
    if (stream != nullptr) pb.stream = *stream;
    pool.live_bytes -= pb.size;
    pool.free_bytes += pb.size;
    try {
      pool.free.emplace(pb.size, b.ptr);
    } catch (const std::bad_alloc&) {
      // not reused by the pool; `drop_pool` still finds it
    }
    if (!uses_.empty()) uses_.erase(b.ptr);
    return true;
  }

  /// A capture that forbids unsafe calls (global, or thread-local on a thread alloy cannot tell) is
  /// known: a block goes to `Inner` only after it, since `Inner`'s free may give memory back to
  /// its upstream (an unmap, a cudaFree), which would invalidate the capture.
  bool strict_capture_known() const noexcept {
    if constexpr (capturable) {
      for (const typename book::capture& c : book_.captures)
        if (c.mode != capture_mode::relaxed) return true;
    }
    return false;
  }
  /// A free kept from `Inner` while `strict_capture_known()`, unless it is bad (as `defer`).
  bool hold_back(block b) noexcept {
    if (b.ptr == nullptr) return true;
    if (const misuse bad = bad_deferred_free(b); bad != misuse::none) return refused(bad, b);
    keep_aside(b);
    return true;
  }
  void keep_aside(block b) noexcept {
    try {
      held_back_.push_back(b);
    } catch (const std::bad_alloc&) {
      // the block stays out of use: safe, lost to this allocator
    }
  }
  /// A block `Inner` gave that goes back unused (or after a graph's use): at once, or after the
  /// captures that forbid `Inner`'s giving back.
  void give_back_unused(block b) noexcept {
    if (strict_capture_known()) [[unlikely]] {
      keep_aside(b);
      return;
    }
    inner_.deallocate(b);
  }
  void release_held_back() noexcept {
    std::vector<block> held = std::move(held_back_);
    held_back_.clear();
    for (const block& b : held) {
      if constexpr (checked_deallocating_allocator<Inner>) {
        (void)inner_.try_deallocate(b);  // a bad free `Inner` refuses, and counts
      } else {
        inner_.deallocate(b);
      }
    }
  }

  /// A free of a block from before the capture `cs`: kept until it ends, unless it is bad (asked
  /// of `Inner` when it has `free_misuse`; else an interior or wrong-size free is seen bad only
  /// when it reaches `Inner`).
  bool defer(block b, Stream stream, capture_state cs) noexcept {
    if (b.ptr == nullptr) return true;
    if (const misuse bad = bad_deferred_free(b); bad != misuse::none) return refused(bad, b);
    try {
      (void)capture_for(cs, stream);
      book_.deferred.push_back({b, stream, cs.id});
      ++counters_.deferred_frees;
    } catch (const std::bad_alloc&) {
      // the block stays out of use: safe, lost to this allocator
    }
    return true;
  }

  /// Whether `b` was freed and its free waits for a capture's end before it reaches `Inner`.
  bool waits_for_inner(block b) const noexcept {
    for (const typename book::deferred_free& d : book_.deferred) {
      if (d.b.ptr == b.ptr) return true;
    }
    for (const block& h : held_back_) {
      if (h.ptr == b.ptr) return true;
    }
    return false;
  }
  /// What is wrong with freeing `b`, a block the books know (a pool's, or one that was).
  static misuse pooled_misuse(const typename book::pooled& p, block b) noexcept {
    if (p.free) return misuse::double_free;  // only a pool keeps free blocks
    return b.size == p.handed ? misuse::none : misuse::wrong_size;
  }
  /// Why `record_use(b)` is refused, or `none`.
  misuse use_misuse(block b) const noexcept {
    if (b.ptr == nullptr) return misuse::none;
    if (const auto found = book_.blocks.find(b.ptr); found != book_.blocks.end())
      return pooled_misuse(found->second, b);
    return bad_deferred_free(b);
  }

  misuse bad_deferred_free(block b) const noexcept {
    if (waits_for_inner(b)) return misuse::double_free;  // (a waiting block is one `Inner` owns)
    if constexpr (free_screening_allocator<Inner>) {
      return inner_.free_misuse(b);  // names a foreign pointer too: no `owns` first
    } else {
      if constexpr (owning_allocator<Inner>) {
        if (!inner_.owns(b)) return misuse::foreign_pointer;
      }
      return misuse::none;  // an interior or wrong-size free: `Inner` refuses it when it gets it
    }
  }
  [[gnu::cold]] bool refused(misuse kind, block b) noexcept {
    detail::report_misuse(misuses_, kind, b, nullptr, nullptr, "stream_ordered");
    return false;
  }

  /// Finishes the captures seen ended (the probe of one of their streams no longer names them).
  void settle(const Stream* current, capture_state cs) noexcept {
    if (settling_) return;
    if (current != nullptr && cs.capturing()) {
      try {
        (void)capture_for(cs, *current);  // known before anything ended is finished
      } catch (const std::bad_alloc&) {
        return;  // finished at a later call
      }
    }
    settling_ = true;
    for (std::size_t i = 0; i < book_.captures.size();) {
      typename book::capture& c = book_.captures[i];
      const capture_state now = current != nullptr && c.stream == *current ? cs : capture_of(c.stream);
      if (now.capturing() && now.id == c.id) {
        if (now.state == capture_state::status::invalidated) c.invalidated = true;
        ++i;
        continue;
      }
      typename book::capture ended = std::move(c);
      book_.captures.erase(book_.captures.begin() + static_cast<std::ptrdiff_t>(i));
      finish(ended);
      i = 0;  // finishing may have deferred frees to captures seen again
    }
    settling_ = false;
    if (book_.released_waiting != 0 && !book_.release_held()) {
      for (auto it = book_.pools.begin(); it != book_.pools.end();) {
        const typename book::key key = it->first;
        const bool released = it->second.released;
        ++it;  // drop_pool erases only `key`'s entry
        if (released) drop_pool(key);
      }
    }
    if (!strict_capture_known()) release_held_back();
  }
  void finish(typename book::capture& ended) noexcept {
    if (ended.invalidated) unwind(ended);
    drop_pool(book::own_pool(ended.id));
    std::vector<typename book::deferred_free> mine;
    for (std::size_t i = 0; i < book_.deferred.size();) {
      if (book_.deferred[i].capture == ended.id) {
        try {
          mine.push_back(book_.deferred[i]);
        } catch (const std::bad_alloc&) {
          ++i;  // stays deferred, under a capture that ended: never freed, never unsafe
          continue;
        }
        book_.deferred[i] = book_.deferred.back();
        book_.deferred.pop_back();
      } else {
        ++i;
      }
    }
    for (typename book::deferred_free& d : mine) {
      const capture_state now = capture_of(d.stream);
      if (now.capturing()) (void)defer(d.b, d.stream, now);
      else (void)free_now(d.b, &d.stream);
    }
  }
  /// An aborted capture's blocks of a user pool that no other capture took leave the pool.
  void unwind(typename book::capture& ended) noexcept {
    for (void* p : ended.taken) {
      const auto found = book_.blocks.find(p);
      if (found == book_.blocks.end() || found->second.pool == book::ordinary) continue;
      typename book::pooled& pb = found->second;
      if (--pb.takers != 0) continue;
      typename book::pool& pool = book_.pools[pb.pool];
      if (pb.free) {
        const auto [lo, hi] = pool.free.equal_range(pb.size);
        for (auto it = lo; it != hi; ++it) {
          if (it->second == p) {
            pool.free.erase(it);
            break;
          }
        }
        pool.free_bytes -= pb.size;
        const typename book::pooled gone = pb;
        book_.blocks.erase(found);
        give_back_pooled(p, gone);
      } else {
        pool.live_bytes -= pb.size;
        pb.pool = book::ordinary;  // an ordinary block from now on
      }
    }
  }
  /// A pool's free blocks go back to `Inner`, its live blocks become ordinary.
  void drop_pool(typename book::key key) noexcept {
    const auto pool = book_.pools.find(key);
    if (pool == book_.pools.end()) return;
    if (pool->second.released) --book_.released_waiting;
    for (auto it = book_.blocks.begin(); it != book_.blocks.end();) {
      if (it->second.pool != key) {
        ++it;
        continue;
      }
      if (!it->second.free) {
        it->second.pool = book::ordinary;  // an ordinary block from now on
        ++it;
        continue;
      }
      void* p = it->first;
      const typename book::pooled pb = it->second;
      it = book_.blocks.erase(it);
      give_back_pooled(p, pb);
    }
    book_.pools.erase(pool);
  }
  void give_back_pooled(void* p, const typename book::pooled& pb) noexcept {
    const block b{p, pb.size};
    if (pb.freed_on_stream && pb.freed_in == 0) {
      // freed outside graphs on a stream: ordered as any free there (after its capture, if any)
      if (const capture_state now = capture_of(pb.stream); now.capturing()) (void)defer(b, pb.stream, now);
      else (void)free_now(b, &pb.stream);
    } else {
      give_back_unused(b);  // last used by a graph, whose launches are complete
    }
  }

  static constexpr std::size_t min_prune = 64;

  Inner inner_;
  mode mode_ = mode::unused;
  Stream sole_{};
  std::map<std::uintptr_t, pending_range> pending_;
  std::vector<event_slot> slots_;
  std::vector<std::uint32_t> free_slots_;
  std::unordered_map<void*, std::vector<Stream>> uses_;  // record_use, by block address
  std::size_t prune_at_ = min_prune;
  stream_order_counters counters_;
  misuse_counts misuses_{};
  book book_;
  std::vector<block> held_back_;  // frees kept from `Inner` while a strict capture is known
  bool settling_ = false;
};

/// `alloy::record_use(alloc, block, stream)`: `block` is used by work on `stream` as well as on
/// the stream it was allocated on; it is not reused until that work is done too. Available when
/// the composition has a `stream_ordered` part that can reach the block.
template <class A, class Stream>
  requires use_recording_allocator<A, Stream>
void record_use(A& alloc, block b, Stream stream) {
  alloc.record_use(b, stream);
}

}  // namespace alloy
