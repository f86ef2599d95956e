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
///   (checked frees) records no pending range, and `try_deallocate` (both forms) says so.
/// - Thread safety: none (wrap in `synchronized`). Movable, not copyable.
/// - Memory kind: `Inner`'s. Capabilities: the queries of `Inner` (`release` and
///   `release_detached` synchronize first), checked frees when `Inner` has them, `record_use`,
///   `order_counters()`; tags and offload when `Inner` has them (the current tag tags the
///   stream-ordered allocations), but no per-call tag.
/// - Defaults chosen by measurement: bench/README.md#streams
template <cache_keeping_allocator Inner, stream Stream>
class stream_ordered : public detail::forwards_queries<stream_ordered<Inner, Stream>, Inner> {
  using traits = stream_traits<Stream>;
  using event_type = typename traits::event_type;

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
        counters_(other.counters_) {
    other.pending_.clear();
    other.slots_.clear();
    other.free_slots_.clear();
    other.uses_.clear();
  }
  stream_ordered& operator=(stream_ordered&&) = delete;
  ~stream_ordered() {
    synchronize_all();
    for (event_slot& s : slots_) {
      if (s.created) traits::destroy(s.event);
    }
  }

  // ---- the allocator ---------------------------------------------------------------------------

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
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
    note(stream);
    const block b = allocate_inner(bytes, alignment);
    if (b && mode_ == mode::tracking) claim(b, &stream);
    return b;
  }
  void deallocate(block b, Stream stream) noexcept { (void)free_block(b, &stream); }
  bool try_deallocate(block b, Stream stream) noexcept
    requires checked_deallocating_allocator<Inner>
  {
    return free_block(b, &stream);
  }

  /// `b` (a live block from this allocator) is also used by work enqueued on `stream`; when it is
  /// freed, it is not reused until that work is done too. Throws `std::bad_alloc` if the use
  /// cannot be stored (nothing changes then).
  void record_use(block b, Stream stream) {
    note(stream);
    if (mode_ != mode::tracking || b.ptr == nullptr) return;  // one stream: order is enough
    std::vector<Stream>& streams = uses_[b.ptr];
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  }

  /// Synchronizes with every pending stream free, then releases `Inner`'s cached memory.
  void release() noexcept
    requires releasing_allocator<Inner>
  {
    synchronize_all();
    inner_.release();
  }
  /// As `release()`, in two phases (`detaching_release_allocator`): each call synchronizes first.
  bool release_detached(detached_segments& out) noexcept
    requires detaching_release_allocator<Inner>
  {
    synchronize_all();
    return inner_.release_detached(out);
  }

  const stream_order_counters& order_counters() const noexcept { return counters_; }
  /// Address ranges freed on a stream whose events were not yet seen complete.
  std::size_t pending_ranges() const noexcept { return pending_.size(); }

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
    if (stream != nullptr) note(*stream);
    const bool track = stream != nullptr && mode_ == mode::tracking && b.ptr != nullptr && b.size != 0;
    if constexpr (checked_deallocating_allocator<Inner>) {
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
    const std::uintptr_t hi = lo + b.size;
    auto it = pending_.upper_bound(lo);
    if (it != pending_.begin() && std::prev(it)->second.end > lo) --it;
    while (it != pending_.end() && it->first < hi) {
      const std::uintptr_t start = it->first;
      const pending_range range = it->second;
      order_after(range.events, stream);
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
    if (pending_.size() >= prune_at_) prune();
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

  void claim_quietly(std::uintptr_t lo, std::uintptr_t hi) noexcept {
    auto it = pending_.upper_bound(lo);
    if (it != pending_.begin() && std::prev(it)->second.end > lo) --it;
    while (it != pending_.end() && it->first < hi) {
      synchronize_chain(it->second.events);
      drop_ref(it->second.events);
      it = pending_.erase(it);
    }
  }

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
