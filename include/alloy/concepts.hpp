// SPDX-License-Identifier: Apache-2.0
// alloy/concepts.hpp: the allocator concept and the optional capabilities a policy may have.
//
// The core contract (docs/design.md#concepts) is two noexcept calls: `allocate(bytes, alignment)`
// returning a `block` (empty on failure) and `deallocate(block)` taking it back exactly as handed
// out. Everything else is an optional capability, detected here and passed on by a composite only
// when every part it would forward to has it (Phobos's building blocks).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <alloy/block.hpp>
#include <alloy/misuse.hpp>
#include <alloy/tag.hpp>

namespace alloy {

/// Memory kind is static: every allocator says whether the host and the device can touch it.
template <class A>
concept memory_kind_aware = requires {
  { std::bool_constant<A::host_accessible>{} };
  { std::bool_constant<A::device_accessible>{} };
};

/// The allocator concept: noexcept allocate and sized deallocate, and a memory kind.
template <class A>
concept allocator = memory_kind_aware<A> && requires(A& a, block b, std::size_t bytes, std::size_t alignment) {
  { a.allocate(bytes, alignment) } noexcept -> std::same_as<block>;
  { a.deallocate(b) } noexcept;
};

/// Checked deallocation, `try_deallocate(block) noexcept -> bool`: frees the block and returns
/// true when it was a live block of this allocator (as handed out: same pointer, same size);
/// returns false, and changes nothing, when the free is refused as misuse (docs/design.md#errors: a
/// double free, a foreign or interior pointer, a wrong size). An empty block is accepted (there is
/// nothing to free; `deallocate` ignores it too). `deallocate(b)` behaves as
/// `(void)try_deallocate(b)`. Decorators that count (`stats`, `limited`, `tracked`, `logged`,
/// `round_up_requests`) count a free only when the part below accepted it; a part that cannot
/// tell (no `try_deallocate`) is trusted, within what the decorator itself can check.
/// Every policy that detects misuse should offer it (`best_fit_arena` does; composites and
/// wrappers pass it on when their parts have it).
template <class A>
concept checked_deallocating_allocator = allocator<A> && requires(A& a, block b) {
  { a.try_deallocate(b) } noexcept -> std::same_as<bool>;
};

/// `free_misuse(block) noexcept -> misuse`: what `try_deallocate(b)` would refuse `b` as now, or
/// `misuse::none` when it would accept it (an empty block, or a live block of this allocator at
/// the size it was handed out with), without freeing anything. `stream_ordered` asks it to refuse
/// at once a bad free that would otherwise wait for a capture's end, and `record_use` of anything
/// but a live block. The engines have it; wrappers pass it on, except those that keep freed blocks
/// themselves (`sharded`'s thread caches, `stream_ordered`'s pending and graph-pool frees).
template <class A>
concept free_screening_allocator = allocator<A> && requires(const A& a, block b) {
  { a.free_misuse(b) } noexcept -> std::same_as<misuse>;
};

/// The stream-ordered form of checked deallocation: `try_deallocate(block, stream) noexcept ->
/// bool`, with the meaning above (`stream_ordered` has it when its inner part has
/// `try_deallocate`).
template <class A, class Stream>
concept checked_stream_deallocating_allocator = allocator<A> && requires(A& a, block b, Stream stream) {
  { a.try_deallocate(b, stream) } noexcept -> std::same_as<bool>;
};

/// `serves(bytes, alignment) noexcept -> bool`: whether the allocator takes a request of that size
/// and alignment at all, by its contract (a size or alignment it never serves), before any memory
/// is sought; false means `allocate` would return an empty block without side effects. A
/// `segregator` sends a small request its small part does not serve to its large part (a
/// `size_class_pool` cannot align 1 MiB at 512 inside its largest class).
template <class A>
concept request_screening_allocator = allocator<A> && requires(const A& a, std::size_t bytes, std::size_t alignment) {
  { a.serves(bytes, alignment) } noexcept -> std::convertible_to<bool>;
};

/// `owns(block)`: whether a block came from this allocator (needed to route frees in `fallback`).
template <class A>
concept owning_allocator = allocator<A> && requires(const A& a, block b) {
  { a.owns(b) } noexcept -> std::same_as<bool>;
};

/// `release()`: give every cached byte that is not in use back to the upstream.
template <class A>
concept releasing_allocator = allocator<A> && requires(A& a) {
  { a.release() } noexcept;
};

/// Stream-ordered allocation over some stream type (a `cudaStream_t`, or a host stream in tests).
template <class A, class Stream>
concept stream_ordered_allocator =
    allocator<A> && requires(A& a, block b, std::size_t bytes, std::size_t alignment, Stream stream) {
      { a.allocate(bytes, alignment, stream) } noexcept -> std::same_as<block>;
      { a.deallocate(b, stream) } noexcept;
    };

/// `allocate_keeping_cache(bytes, alignment)`: as `allocate`, but when the upstream fails the
/// allocator fails too instead of giving cached free memory back to the upstream and retrying.
/// `stream_ordered` needs it: free memory may still be in use by work on a stream, and must not
/// reach the upstream before that work is done.
template <class A>
concept cache_keeping_allocator = allocator<A> && requires(A& a, std::size_t bytes, std::size_t alignment) {
  { a.allocate_keeping_cache(bytes, alignment) } noexcept -> std::same_as<block>;
};

/// `allocate_cached(bytes, alignment)`: a block from memory the allocator already holds, with no
/// call to its upstream or backend at all (no segment, slab, map or unmap), else an empty block
/// with nothing changed and nothing counted as a failure. `stream_ordered` needs it while a CUDA
/// graph is captured in a mode that forbids those calls (docs/design.md#cuda-graphs).
template <class A>
concept cache_serving_allocator = allocator<A> && requires(A& a, std::size_t bytes, std::size_t alignment) {
  { a.allocate_cached(bytes, alignment) } noexcept -> std::same_as<block>;
};

/// An upstream that may be called from several threads at once (`U::thread_safe` is true:
/// `host_upstream`, the CUDA runtime upstreams). Only over such an upstream may a policy offer
/// `growth_planning_allocator`, whose upstream call runs outside the caller's lock.
template <class U>
concept thread_safe_upstream = requires { requires static_cast<bool>(U::thread_safe); };

/// Segments (slabs) a policy took off its books under the caller's lock, to be returned to
/// their upstream after the lock is released (`detaching_release_allocator`). Holds at most
/// `capacity`; `give_back()` (no lock held) returns them and empties the list.
struct detached_segments {
  static constexpr std::size_t capacity = 32;
  struct entry {
    block taken{};
    void* upstream = nullptr;
    void (*give)(void*, block) noexcept = nullptr;
  };
  entry entries[capacity];
  std::size_t count = 0;

  bool full() const noexcept { return count == capacity; }
  /// `b` goes back through `up.deallocate(b)` in `give_back` (`count < capacity`).
  template <class Upstream>
  void add(Upstream& up, block b) noexcept {
    entries[count++] = {b, &up, [](void* u, block x) noexcept { static_cast<Upstream*>(u)->deallocate(x); }};
  }
  /// `b` goes back through `give(context, b)` in `give_back` (`count < capacity`).
  void add_call(void* context, block b, void (*give)(void*, block) noexcept) noexcept {
    entries[count++] = {b, context, give};
  }
  void give_back() noexcept {
    for (std::size_t i = 0; i < count; ++i) entries[i].give(entries[i].upstream, entries[i].taken);
    count = 0;
  }
  /// The caller's loop: `detach(out)` (which takes the caller's lock around the policy's
  /// `release_detached`), then `out.give_back()` without it, until `detach` says none is left.
  template <class Detach>
  static void give_back_all(Detach&& detach) noexcept {
    for (bool done = false; !done;) {
      detached_segments out;
      done = detach(out);
      out.give_back();
    }
  }
};

/// One upstream call a policy wants made for it (a new segment or slab), planned under a lock and
/// made outside it (`growth_planning_allocator`). Filled by the policy; `fetch(under_lock)` and
/// `give_back_unused()` are what the caller runs without its lock. Only `bytes` starts set (0: no
/// plan): a policy that plans assigns the whole struct (`of`, or `growth_plan{}` and then its
/// fields), so that the plan a caller declares on every allocation costs one store, not the
/// zeroing of the whole struct.
struct growth_plan {
  std::size_t bytes = 0;  ///< bytes to ask the upstream for; 0: no plan
  std::size_t alignment;  ///< alignment to ask for
  void* upstream;         ///< the policy's upstream (`thread_safe_upstream`)
  block (*take)(void*, std::size_t, std::size_t) noexcept;
  void (*give)(void*, block) noexcept;
  block got;  ///< what the upstream handed out (empty: not asked yet, or it failed)
  /// The policy's answer to a failed call, made here without the lock: a smaller segment that
  /// still serves (`min_bytes`, when below `bytes`), then the policy's wholly free segments
  /// detached (`detach(part, out)`, under the lock) and given back, and one more call.
  std::size_t min_bytes;
  void* part;
  bool (*detach)(void*, detached_segments&) noexcept;
  bool retried;  ///< the free segments went back and the call was made again

  explicit operator bool() const noexcept { return bytes != 0; }
  /// The upstream call (no lock held).
  void fetch() noexcept { got = take(upstream, bytes, alignment); }
  /// The upstream call and, when it fails and the policy said how, its release-and-retry (no
  /// lock held; `under_lock(f)` runs `f()` under the caller's lock and returns what it returns).
  /// Afterwards `allocate_planned` makes no upstream call when `retried`.
  template <class UnderLock>
  void fetch(UnderLock&& under_lock) noexcept {
    fetch();
    if (got || detach == nullptr) return;
    if (min_bytes != 0 && min_bytes < bytes) {
      bytes = min_bytes;
      fetch();
      if (got) return;
    }
    detached_segments::give_back_all(
        [&](detached_segments& out) { return under_lock([&] { return detach(part, out); }); });
    retried = true;
    fetch();
  }
  /// Returns what the policy did not adopt (no lock held).
  void give_back_unused() noexcept {
    if (got) give(upstream, got);
    got = {};
  }
  /// A plan for `up.allocate(bytes, alignment)`.
  template <class Upstream>
  static growth_plan of(Upstream& up, std::size_t bytes, std::size_t alignment) noexcept {
    growth_plan plan{};
    plan.bytes = bytes;
    plan.alignment = alignment;
    plan.upstream = &up;
    plan.take = [](void* u, std::size_t n, std::size_t a) noexcept {
      return static_cast<Upstream*>(u)->allocate(n, a);
    };
    plan.give = [](void* u, block b) noexcept { static_cast<Upstream*>(u)->deallocate(b); };
    return plan;
  }
  /// The same, and on failure `policy.release_detached` (see `fetch(under_lock)`).
  template <class Upstream, class Policy>
  static growth_plan of(Upstream& up, std::size_t bytes, std::size_t alignment, Policy& policy,
                        std::size_t min_bytes = 0) noexcept {
    growth_plan plan = of(up, bytes, alignment);
    plan.min_bytes = min_bytes;
    plan.part = &policy;
    plan.detach = [](void* p, detached_segments& out) noexcept {
      return static_cast<Policy*>(p)->release_detached(out);
    };
    return plan;
  }
};

namespace detail {
/// How far an allocation may go for memory: keep the cache (fail when the upstream fails), give
/// free segments back and retry, (the caller made the upstream calls) not call the upstream, or
/// (`allocate_cached`) not call the upstream and not count the failure.
enum class growth_mode : unsigned char { keeping_cache, releasing, cache_only, without_upstream };
}  // namespace detail

/// Growth in two phases, so that a lock need not be held across a slow upstream call
/// (`cudaMalloc` of a new segment or slab; docs/design.md#threads). Under the caller's lock:
/// `allocate_or_plan(bytes, alignment, plan)` returns a block when it can serve the request
/// without its upstream; otherwise it changes nothing and returns an empty block, with `plan`
/// filled when one upstream call would let it serve the request (else `plan` stays empty and the
/// caller calls `allocate`, which does everything as without a plan: last resorts, release and retry,
/// OOM). Without the lock: `plan.fetch(under_lock)`: the call and, when it fails, the policy's
/// answer (a smaller segment; its free segments detached under the lock and given back without
/// it; the call again). Under the lock again: `allocate_planned(plan, bytes, alignment)` adopts
/// `plan.got` (as cache, even when another thread grew meanwhile; not when a limit would be
/// passed) and then allocates as `allocate` does, except that after a release-and-retry
/// (`plan.retried`, counted in `num_alloc_retries`) it calls the upstream no more: what is free
/// serves, or the request fails. Without the lock: `plan.give_back_unused()`.
/// `detail::allocate_growing_unlocked` runs the whole sequence. Offered by `best_fit_arena` and
/// `size_class_pool` over a `thread_safe_upstream`, passed on by every wrapper and composite.
template <class A>
concept growth_planning_allocator =
    allocator<A> && requires(A& a, std::size_t bytes, std::size_t alignment, growth_plan& plan) {
      { a.allocate_or_plan(bytes, alignment, plan) } noexcept -> std::same_as<block>;
      { a.allocate_planned(plan, bytes, alignment) } noexcept -> std::same_as<block>;
    };

/// `release()` in two phases, so that a lock need not be held across the upstream's frees
/// (`cudaFree`; docs/design.md#threads). Under the caller's lock, `release_detached(out)` takes
/// wholly free segments off the policy's books (counters and reserved bytes as `release()` leaves
/// them) into `out`, and returns true when none is left, false when `out` filled first; without the
/// lock the caller runs `out.give_back()`, and repeats while the answer was false. Offered by
/// `best_fit_arena` and `size_class_pool` over a `thread_safe_upstream`, passed on by
/// `segregator` and `fallback` (both parts) and every wrapper (`stats<>` among them: a detached
/// segment is off the books it reads), used by `synchronized` and `sharded`.
template <class A>
concept detaching_release_allocator = allocator<A> && requires(A& a, detached_segments& out) {
  { a.release_detached(out) } noexcept -> std::same_as<bool>;
};

/// `record_use(block, stream)`: the block is used on `stream` too (see `alloy::record_use`).
template <class A, class Stream>
concept use_recording_allocator = allocator<A> && requires(A& a, block b, Stream stream) { a.record_use(b, stream); };

/// `reserved_bytes()`: bytes currently taken from the upstream, in O(1).
template <class A>
concept reserving_allocator = allocator<A> && requires(const A& a) {
  { a.reserved_bytes() } noexcept -> std::convertible_to<std::size_t>;
};

/// Traffic an allocator had with its upstream, and how its requests fared (for statistics).
struct allocator_counters {
  std::size_t num_device_alloc = 0;   ///< successful upstream allocations (segments, slabs taken)
  std::size_t num_device_free = 0;    ///< upstream deallocations (segments, slabs given back)
  std::size_t num_alloc_retries = 0;  ///< failed upstream calls retried after releasing cached memory
  std::size_t num_ooms = 0;           ///< requests this allocator could not serve
  std::size_t num_maps = 0;           ///< physical pieces mapped (virtual-memory parts; a driver call each)
  std::size_t num_unmaps = 0;         ///< physical pieces unmapped (virtual-memory parts)

  /// Adds another part's counters (composites report the sum of their parts').
  allocator_counters& operator+=(const allocator_counters& other) noexcept {
    num_device_alloc += other.num_device_alloc;
    num_device_free += other.num_device_free;
    num_alloc_retries += other.num_alloc_retries;
    num_ooms += other.num_ooms;
    num_maps += other.num_maps;
    num_unmaps += other.num_unmaps;
    return *this;
  }
  friend allocator_counters operator+(allocator_counters a, const allocator_counters& b) noexcept { return a += b; }
  friend bool operator==(const allocator_counters&, const allocator_counters&) = default;
};

/// `counters()`: the allocator keeps `allocator_counters` (composites add up their parts').
template <class A>
concept counting_allocator = allocator<A> && requires(const A& a) {
  { a.counters() } noexcept -> std::same_as<allocator_counters>;
};

/// The state of one piece of a segment, for statistics and pictures.
enum class block_state : std::uint8_t {
  free,       ///< cached, not handed out
  allocated,  ///< handed out as a raw block (never moves)
  active,     ///< a movable block that is locked (resident, pinned in place)
  inactive,   ///< a movable block that is unlocked (may be moved or spilled)
  unmapped,   ///< addresses reserved with no physical memory behind them (virtual memory; not reserved bytes)
  offloaded,  ///< allocated, its tag offloaded or discarded: no physical memory (not reserved, not in use)
};

/// One piece of one segment as introspection reports it.
struct block_info {
  const void* segment = nullptr;  ///< start of the segment taken from the upstream
  std::size_t segment_size = 0;   ///< bytes of that segment
  const void* ptr = nullptr;      ///< start of this piece
  std::size_t size = 0;           ///< bytes this piece occupies (after rounding)
  std::size_t requested = 0;      ///< bytes the caller asked for; 0 for free pieces
  block_state state = block_state::free;
};

/// Introspection: `for_each_block(f)` calls `f(const block_info&)` for every piece of every
/// segment, segments in address order and pieces in address order within a segment.
template <class A>
concept introspectable_allocator =
    allocator<A> && requires(const A& a, void (*visit)(const block_info&)) { a.for_each_block(visit); };

/// A movable block's name (docs/design.md#movable-memory). Zero is never a valid handle.
struct handle {
  std::uint64_t id = 0;
  explicit operator bool() const noexcept { return id != 0; }
  friend bool operator==(const handle&, const handle&) = default;
};

/// Movable memory: memory that may be spilled or compacted while nobody holds it locked.
template <class A>
concept movable_allocator = allocator<A> && requires(A& a, handle h, std::size_t bytes) {
  { a.allocate_movable(bytes) } -> std::same_as<handle>;
  { a.lock(h) } -> std::same_as<void*>;
  { a.unlock(h) };
  { a.deallocate(h) };
};

/// Tags (docs/design.md#offload, alloy/tag.hpp): `current_tag()` / `set_current_tag(tag)`
/// (`tag_holding`, what `scoped_tag` needs) and `allocate(bytes, alignment, tag) noexcept ->
/// block`, an allocation with that tag (empty while the tag is offloaded or discarded).
/// `virtual_arena`, `virtual_allocator` and every wrapper of them.
template <class A>
concept tagging_allocator =
    allocator<A> && tag_holding<A> && requires(A& a, std::size_t bytes, std::size_t alignment, tag t) {
      { a.allocate(bytes, alignment, t) } noexcept -> std::same_as<block>;
    };

/// Pointer-stable offload (docs/design.md#offload): `offload(tag)`, `discard(tag)`, `restore(tag)`
/// (each an `offload_status`; anything but `done` changed nothing), `state(tag)` and
/// `offload_stats()`. `virtual_arena`, `virtual_allocator` and every wrapper of them.
template <class A>
concept offloading_allocator = allocator<A> && requires(A& a, const A& c, tag t) {
  { a.offload(t) } noexcept -> std::same_as<offload_status>;
  { a.discard(t) } noexcept -> std::same_as<offload_status>;
  { a.restore(t) } noexcept -> std::same_as<offload_status>;
  { c.state(t) } noexcept -> std::same_as<tag_state>;
  { c.offload_stats() } noexcept -> std::convertible_to<offload_statistics>;
};

/// `offload_all()`: offloads every resident tag with live blocks (LMS's full reclaim).
template <class A>
concept offloading_all_allocator = offloading_allocator<A> && requires(A& a) {
  { a.offload_all() } noexcept -> std::same_as<offload_status>;
};

/// The per-tag figures of `virtual_arena`: `host_bytes(tag)` (its host copy), `mapped_bytes(tag)`
/// (mapped granules its live blocks touch), `live_bytes(tag)` (requested bytes of its live blocks).
template <class A>
concept tag_reporting_allocator = allocator<A> && requires(const A& c, tag t) {
  { c.host_bytes(t) } noexcept -> std::convertible_to<std::size_t>;
  { c.mapped_bytes(t) } noexcept -> std::convertible_to<std::size_t>;
  { c.live_bytes(t) } noexcept -> std::convertible_to<std::size_t>;
};

/// Composites expose their parts as a tuple of references through `parts()`; `find` and the
/// statistics walk compositions through it.
template <class A>
concept composite = requires(A& a) { a.parts(); };

namespace detail {
template <class... Parts>
inline constexpr bool all_host_accessible = (Parts::host_accessible && ...);
template <class... Parts>
inline constexpr bool all_device_accessible = (Parts::device_accessible && ...);
}  // namespace detail

}  // namespace alloy
