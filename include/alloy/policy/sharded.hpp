// SPDX-License-Identifier: Apache-2.0
// alloy/policy/sharded.hpp
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/address_table.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/forwarding.hpp>
#include <alloy/detail/granule_set.hpp>
#include <alloy/detail/owner_gate.hpp>
#include <alloy/policy/size_class_pool.hpp>

namespace alloy {

namespace detail {

/// Whether an allocator keeps `alloy::statistics` (a `stats<>` outermost).
template <class A>
concept keeps_statistics = requires(const A& a) { a.statistics(); };

/// One thread's cache of small blocks: per size class a stack of at most `per_class` pointers.
/// Touched only by the thread the slot belongs to (and by `sharded` when no thread uses it).
template <std::size_t Classes, std::size_t PerClass>
struct alignas(64) thread_block_cache {
  std::uint32_t count[Classes] = {};
  void* blocks[Classes][PerClass];
};

/// Checked builds: the small blocks a `sharded` with thread caches has handed out, each with the
/// size its caller asked for, so that a bad small free is refused before it reaches a cache,
/// where no shard would check it.
class handed_out_blocks {
 public:
  /// Records `b`; false when host memory ran out.
  bool add(block b) noexcept {
    const std::lock_guard lock(mutex_);
    return !sizes_.contains(b.ptr) && sizes_.add(b.ptr, b.size);
  }
  /// Forgets `b` and says true when it was recorded at exactly its size; false, changing nothing,
  /// otherwise (a double, foreign, interior or wrong-size free).
  bool take(block b) noexcept {
    const std::lock_guard lock(mutex_);
    const std::size_t* size = sizes_.find(b.ptr);
    if (size == nullptr || *size != b.size) return false;
    sizes_.remove(b.ptr);
    return true;
  }

 private:
  std::mutex mutex_;
  address_table<std::size_t> sizes_;
};

/// A thread's entry in a `sharded` object's table: the thread, its shard, its cache.
template <class Cache>
struct alignas(64) thread_slot {
  std::atomic<std::thread::id> thread{};
  std::size_t shard = 0;
  std::size_t flush_hint = 0;  ///< the shard that took the thread's last flushed blocks
  Cache* cache = nullptr;
};

}  // namespace detail

/// `sharded<Inner, Mutex>` keeps several independent `Inner`s (shards), each behind its own lock,
/// so that threads allocating at the same time do not wait for one another
/// (docs/design.md#threads).
///
/// - Strategy: each thread gets a shard, round-robin in the order threads first call, through a
///   table of 64 entries in the object (no thread-local or global state). A thread allocates from
///   its shard, then from the others in turn. Requests of at most 64 KiB go through the thread's
///   cache (`options::thread_cache`), which refills and flushes half a class under one lock. A
///   free goes to its thread's cache or to the shard that owns the block (found by a table of the
///   shard's recent blocks, else by `Inner::owns`). A shard's first thread holds it through a gate
///   (`detail::owner_gate`) until another thread needs it, then everyone takes `Mutex`. Over an
///   `Inner` with planned growth or detached release, the upstream calls run without the lock.
/// - Complexity: a cached request or free, O(1) without a lock; a refill or flush, up to 16
///   `Inner` calls under one lock per shard; an uncached request, `Inner`'s allocate under one
///   lock (more when shards fail); an uncached free, `owns` and `deallocate` under the owner's
///   lock (an `owns` and a lock for each shard asked before it).
/// - Failure: an empty block when every shard fails. A free no shard owns, or that its owner
///   refuses, is refused and counted (`refused_frees()`), as is a small free at an address no
///   cached block has (not a multiple of 256, or where no small block it handed out ever
///   started: another allocator's block) or of the block last freed to the thread's cache for
///   its size. Checked builds (`ALLOY_CHECKED`) record every small block handed out, under one
///   lock, and refuse any small free that is not of one at its size.
/// - Thread safety: every call, from any thread; `flush_thread_caches()` only while no other
///   thread uses the object. Movable (not while in use), not copyable.
/// - Memory kind: `Inner`'s. Host memory: the table in the object, 32 KiB of recent blocks per
///   shard, a cache of about 7 KiB per thread, made on its first call, and where small blocks
///   started (`detail::granule_set`: 4 KiB, and up to 2 MiB per 4 GiB span holding small blocks,
///   usually 4 KiB per 8 MiB of them). Cached blocks count as in use in the shards, at most
///   `thread_cache` bytes per class and thread; `release()` first gives back the calling thread's
///   cache.
/// - Capabilities, each when `Inner` has it: the queries (answered by every shard under its lock
///   and added up), `try_deallocate`, `allocate_keeping_cache`, `allocate_cached`, `statistics()` (peaks summed: an
///   upper bound), tags and offload (every shard; all or nothing for `offload` and `discard`),
///   stream-ordered calls, `release_detached`, movable handles (the handle names its shard) and
///   `max_split_size`; every capability but planned growth, which it uses inside, and
///   `free_misuse` (a block in a thread's cache is free, yet live to its shard). `Inner` must
///   have `owns`. Exact statistics: `stats<sharded<...>>` (serialised) or `sharded<stats<...>>`.
/// - Shards of `virtual_arena` over one `vmm_ref<synchronized_vmm<V>>` share one physical pool:
///   memory one shard unmapped serves another.
/// - Defaults chosen by measurement: bench/README.md#threads
template <allocator Inner, class Mutex = std::mutex>
class sharded : public detail::forwards_queries<sharded<Inner, Mutex>, Inner> {
  using queries = detail::forwards_queries<sharded<Inner, Mutex>, Inner>;

 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;

  /// Requests up to this size go through the thread caches (when on).
  static constexpr std::size_t cached_size_limit = std::size_t{64} << 10;
  /// Alignment of every block taken for a cache.
  static constexpr std::size_t cache_alignment = 256;
  /// Entries of the thread table.
  static constexpr std::size_t thread_slots = 64;

  struct options {
    std::size_t shards = 0;  ///< number of shards; 0 (default): `std::thread::hardware_concurrency()`
    /// Bytes each thread may cache per size class; 0: no cache. Default 128 KiB, but 0 over an
    /// `Inner` that keeps statistics (cached blocks would count as in use) and always 0 over a
    /// tagging `Inner` (a cached block has no tag).
    std::size_t thread_cache = detail::keeps_statistics<Inner> || tag_holding<Inner> ? 0 : std::size_t{128} << 10;
  };

  sharded() : sharded(options{}) {}
  explicit sharded(options opts) : sharded([](std::size_t) { return Inner{}; }, opts) {}
  /// Builds shard `i` as `make(i)` (parts are not copyable: each shard is made, not copied).
  template <class Make>
    requires std::is_invocable_r_v<Inner, Make&, std::size_t>
  explicit sharded(Make make, options opts = {}) {
    if constexpr (offloading_allocator<Inner>) tags_apart_.reset(new std::atomic<std::uint64_t>[tag_words] {});
    caching_ = opts.thread_cache != 0 && !tag_holding<Inner>;
    cached_below_ = caching_ ? cached_size_limit + 1 : 0;
    if (caching_) starts_ = std::make_unique<detail::granule_set>();  // before the shards: may throw
    if constexpr (ALLOY_CHECKED) {
      if (caching_) handed_out_ = std::make_unique<detail::handed_out_blocks>();
    }
    shard_count_ = opts.shards != 0 ? opts.shards : std::max<std::size_t>(1, std::thread::hardware_concurrency());
    shards_ = static_cast<shard*>(::operator new(sizeof(shard) * shard_count_, std::align_val_t{alignof(shard)}));
    std::size_t built = 0;
    try {
      for (; built < shard_count_; ++built) new (shards_ + built) shard(make, built);
    } catch (...) {
      destroy_shards(built);
      throw;
    }
    for (std::size_t c = 0; c < classes::count; ++c) {
      const std::size_t keep = std::min<std::size_t>(per_class_max, opts.thread_cache / classes::size(c));
      capacity_[c] = static_cast<std::uint32_t>(keep >= 2 ? keep : 0);
    }
  }
  /// Takes the shards, the thread table and the caches; `other` is left with no shard and must
  /// only be destroyed. Neither object may be in use by another thread meanwhile.
  sharded(sharded&& other) noexcept
      : shards_(std::exchange(other.shards_, nullptr)),
        shard_count_(std::exchange(other.shard_count_, 0)),
        caching_(other.caching_),
        cached_below_(other.cached_below_),
        next_shard_(other.next_shard_.load(std::memory_order_relaxed)),
        refused_(other.refused_.load(std::memory_order_relaxed)),
        starts_(std::move(other.starts_)),
        handed_out_(std::move(other.handed_out_)),
        tags_apart_(std::move(other.tags_apart_)),
        apart_count_(other.apart_count_.load(std::memory_order_relaxed)),
        current_tag_(other.current_tag_.load(std::memory_order_relaxed)) {
    std::copy(std::begin(other.capacity_), std::end(other.capacity_), capacity_);
    for (std::size_t i = 0; i < thread_slots; ++i) {
      slots_[i].thread.store(other.slots_[i].thread.load(std::memory_order_relaxed), std::memory_order_relaxed);
      slots_[i].shard = other.slots_[i].shard;
      slots_[i].flush_hint = other.slots_[i].flush_hint;
      slots_[i].cache = std::exchange(other.slots_[i].cache, nullptr);
    }
  }
  sharded(const sharded&) = delete;
  sharded& operator=(const sharded&) = delete;
  sharded& operator=(sharded&&) = delete;
  ~sharded() {
    if (shards_ == nullptr) return;
    flush_thread_caches();
    for (auto& s : slots_) delete s.cache;
    destroy_shards(shard_count_);
  }

  [[gnu::always_inline]] block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    const auto call = [](Inner& in, std::size_t n, std::size_t a) { return in.allocate(n, a); };
    if (current_tag_apart()) [[unlikely]]
      return refused_with_current_tag(bytes, alignment, call);
    slot* me = my_slot();
    if (is_cached_size(bytes) && detail::is_power_of_two(alignment)) {
      const std::size_t c = classes::index(bytes);
      if (me != nullptr && me->cache != nullptr && alignment <= cache_alignment && capacity_[c] != 0) {
        cache& k = *me->cache;
        if (k.count[c] == 0) refill(me->shard, index_of(me), k, c);
        if (k.count[c] == 0) return {};
        const block b{k.blocks[c][--k.count[c]], bytes};
        if (!handed_out(b)) [[unlikely]] {
          ++k.count[c];
          return {};
        }
        return b;
      }
    }
    return allocate_direct<true>(shard_of(me), index_of(me), bytes, alignment, call);
  }
  [[gnu::always_inline]] void deallocate(block b) noexcept { (void)free_block(b); }
  /// As `deallocate`; false when the free was refused (see Failure above: no shard owns the
  /// block, its owner refused it, or a small free the caches refuse).
  bool try_deallocate(block b) noexcept
    requires checked_deallocating_allocator<Inner>
  {
    return free_block(b);
  }
  /// As `allocate`, through `Inner::allocate_keeping_cache`, past the thread cache.
  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_keeping_allocator<Inner>
  {
    const auto call = [](Inner& in, std::size_t n, std::size_t a) { return in.allocate_keeping_cache(n, a); };
    if (current_tag_apart()) [[unlikely]]
      return refused_with_current_tag(bytes, alignment, call);
    const slot* me = my_slot();
    return allocate_direct<false>(shard_of(me), index_of(me), bytes, alignment, call);
  }
  /// As `allocate_keeping_cache`, through `Inner::allocate_cached`: no shard's upstream is called.
  block allocate_cached(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_serving_allocator<Inner>
  {
    const auto call = [](Inner& in, std::size_t n, std::size_t a) { return in.allocate_cached(n, a); };
    if (current_tag_apart()) [[unlikely]]
      return refused_with_current_tag(bytes, alignment, call);
    const slot* me = my_slot();
    return allocate_direct<false>(shard_of(me), index_of(me), bytes, alignment, call);
  }
  /// As `allocate`, through `Inner`'s stream-ordered allocate, past the thread cache (a cached
  /// block has no stream): the thread's shard, then the others in turn.
  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    const auto call = [stream](Inner& in, std::size_t n, std::size_t a) { return in.allocate(n, a, stream); };
    if (current_tag_apart()) [[unlikely]]
      return refused_with_current_tag(bytes, alignment, call);
    const slot* me = my_slot();
    return allocate_direct<false>(shard_of(me), index_of(me), bytes, alignment, call);
  }
  /// A stream-ordered free, from any thread, to the shard that owns the block (never a cache).
  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  void deallocate(block b, Stream stream) noexcept {
    (void)try_deallocate_ordered(b, stream);
  }
  /// As `deallocate(b, stream)`; false when no shard owns the block or its owner refused it.
  template <class Stream>
    requires checked_stream_deallocating_allocator<Inner, Stream>
  bool try_deallocate(block b, Stream stream) noexcept {
    return try_deallocate_ordered(b, stream);
  }

  // ---- movable handles (docs/design.md#movable-memory), each naming its shard ------------------
  // A handle is made by the thread's shard (or the others in turn) and carries the shard's index
  // in its id (`id = inner id * shards + shard`; the same id with one shard), so that any thread's
  // lock, unlock or free reaches the shard that owns it, under that shard's lock, without a
  // search. Spills and compactions stay within a shard.

  /// A movable block from the thread's shard, or from the others in turn; empty when none can.
  handle allocate_movable(std::size_t bytes) noexcept(noexcept(std::declval<Inner&>().allocate_movable(bytes)))
    requires movable_allocator<Inner>
  {
    const slot* me = my_slot();
    const std::size_t first = shard_of(me), caller = index_of(me);
    for (std::size_t n = 0; n < shard_count_; ++n) {
      const std::size_t i = shard_after(first, n);
      shard_lock lock(shards_[i], caller);
      const handle h = shards_[i].inner.allocate_movable(bytes);
      if (!h) continue;
      if (h.id > (std::numeric_limits<std::uint64_t>::max() - i) / shard_count_) [[unlikely]] {
        shards_[i].inner.deallocate(h);  // its id cannot carry the shard: never in practice
        continue;
      }
      return handle{h.id * shard_count_ + i};
    }
    return {};
  }
  void* lock(handle h)
    requires movable_allocator<Inner>
  {
    return on_owner(h, [](Inner& in, handle x) { return in.lock(x); });
  }
  void unlock(handle h)
    requires movable_allocator<Inner>
  {
    on_owner(h, [](Inner& in, handle x) { in.unlock(x); });
  }
  void deallocate(handle h)
    requires movable_allocator<Inner>
  {
    on_owner(h, [](Inner& in, handle x) { in.deallocate(x); });
  }
  bool try_deallocate(handle h) noexcept
    requires detail::has_try_deallocate_handle<Inner>
  {
    return on_owner(h, [](Inner& in, handle x) noexcept { return in.try_deallocate(x); });
  }
  std::size_t size_of(handle h) const
    requires detail::has_size_of<Inner>
  {
    return on_owner(h, [](const Inner& in, handle x) { return static_cast<std::size_t>(in.size_of(x)); });
  }
  bool is_live(handle h) const noexcept
    requires detail::has_is_live<Inner>
  {
    return on_owner(h, [](const Inner& in, handle x) { return static_cast<bool>(in.is_live(x)); });
  }
  /// The shards' counters added up (the peak: the sum of the shards' peaks, an upper bound).
  auto movable_statistics() const noexcept
    requires detail::has_movable_statistics<Inner>
  {
    using result = decltype(std::declval<const Inner&>().movable_statistics());
    result sum{};
    const std::size_t caller = caller_index();
    for (std::size_t i = 0; i < shard_count_; ++i) {
      shard_lock lock(shards_[i], caller);
      sum += shards_[i].inner.movable_statistics();
    }
    return sum;
  }
  void reset_movable_peak() noexcept
    requires detail::has_reset_movable_peak<Inner>
  {
    const std::size_t caller = caller_index();
    for (std::size_t i = 0; i < shard_count_; ++i) {
      shard_lock lock(shards_[i], caller);
      shards_[i].inner.reset_movable_peak();
    }
  }

  // ---- tags and offload (docs/design.md#offload), over every shard -----------------------------
  // A tag is one thing to the caller: its blocks are in every shard, so each call below reaches
  // every shard (under its lock), combined as `detail::offload_parts` says: offload and discard
  // all or nothing (the shards done are restored when one fails), restore shard by shard (the
  // first failure returned, a retry completes it), `state` resident only when every shard is.
  // `offload_stats()` and the per-tag figures are the shards' added up (one offload here is one
  // per shard in `num_offloads`). There is no thread cache over a tagging `Inner`: a cached block
  // has no tag. A tag is resident only when every shard holds it so (`state`); shards hold it
  // apart (some resident, some not) after a failed undo or a restore that stopped halfway, and
  // then a request of it fails, as one of a tag that is offloaded everywhere does, also where the
  // thread's shard holds it resident (it would break the promise that an offloaded tag takes
  // nothing). Which tags are apart is noted after each `offload`, `discard`, `restore` and
  // `offload_all` here (a bit per tag; a request reads one counter while no tag is apart, and the
  // current tag this object set); a shard changed through `with_shard` is seen at the tag's next
  // call here. Such a request is handed to a shard that does not hold the tag resident, which
  // refuses it and counts it (`num_refused_allocations`), as one arena would.

  /// Allocates with tag `t` from the thread's shard (or the others in turn).
  block allocate(std::size_t bytes, std::size_t alignment, tag t) noexcept
    requires detail::has_tagged_allocate<Inner>
  {
    const auto call = [t](Inner& in, std::size_t n, std::size_t a) { return in.allocate(n, a, t); };
    if constexpr (offloading_allocator<Inner>) {
      if (tag_apart(t)) [[unlikely]]
        return refused_by_a_shard(t, bytes, alignment, call);
    }
    const slot* me = my_slot();
    return allocate_direct<false>(shard_of(me), index_of(me), bytes, alignment, call);
  }
  /// Shard 0's (every shard gets the same from `set_current_tag`).
  tag current_tag() const noexcept
    requires tag_holding<Inner>
  {
    shard_lock lock(shards_[0], caller_index());
    return shards_[0].inner.current_tag();
  }
  /// Sets the current tag of every shard (plain allocations of every thread take it).
  void set_current_tag(tag t) noexcept
    requires tag_holding<Inner>
  {
    queries::set_current_tag(t);
    current_tag_.store(t.value, std::memory_order_relaxed);
  }
  offload_status offload(tag t) noexcept
    requires offloading_allocator<Inner>
  {
    const offload_status s = detail::offload_parts(shard_count_, each_shard(), t, true);
    note_agreement(t);
    return s;
  }
  offload_status discard(tag t) noexcept
    requires offloading_allocator<Inner>
  {
    const offload_status s = detail::offload_parts(shard_count_, each_shard(), t, false);
    note_agreement(t);
    return s;
  }
  offload_status restore(tag t) noexcept
    requires offloading_allocator<Inner>
  {
    const offload_status s = detail::restore_parts(shard_count_, each_shard(), t);
    note_agreement(t);
    return s;
  }
  tag_state state(tag t) const noexcept
    requires offloading_allocator<Inner>
  {
    return detail::tag_state_of_parts(shard_count_, each_shard(), t);
  }
  offload_status offload_all() noexcept
    requires detail::has_offload_all<Inner>
  {
    const offload_status s = detail::offload_all_parts(shard_count_, each_shard());
    if constexpr (offloading_allocator<Inner>) note_agreement_of_every_tag();
    return s;
  }
  /// Whether the shards hold tag `t` apart: resident in some, not in others (a request of it fails).
  bool tag_apart(tag t) const noexcept
    requires offloading_allocator<Inner>
  {
    return apart_count_.load(std::memory_order_relaxed) != 0 &&
           (tags_apart_[t.value / 64].load(std::memory_order_relaxed) >> (t.value % 64) & 1) != 0;
  }

  // ---- capabilities of Inner, over every shard -------------------------------------------------
  // The queries of `Inner` (owns, release, reserved_bytes, counters, for_each_block, bytes_in_use,
  // requested_bytes, limits) come from `detail::forwards_queries`, whose guard hook (`guarded`,
  // below) runs the query on every shard under its lock and adds the answers up. The ones here
  // change it: a block's shard is found first, or the thread's cache is given back first.

  /// Not passed on: a small block in a thread's cache is free to its caller but live to its shard.
  misuse free_misuse(block) const noexcept = delete;
  /// Whether a shard owns the block (small blocks are asked at their class size).
  bool owns(block b) const noexcept
    requires owning_allocator<Inner>
  {
    return queries::owns(inner_block(b));
  }
  /// Gives the calling thread's cache back to the shards, then releases every shard.
  void release() noexcept
    requires releasing_allocator<Inner>
  {
    flush_thread_cache();
    if constexpr (detaching_release_allocator<Inner>) {
      // The free segments leave each shard's books under its lock, up to 32 at a time, and go
      // back to the upstream without it.
      const std::size_t caller = caller_index();
      for (std::size_t i = 0; i < shard_count_; ++i) {
        detached_segments::give_back_all([&](detached_segments& out) {
          shard_lock lock(shards_[i], caller);
          return shards_[i].inner.release_detached(out);
        });
      }
    } else {
      queries::release();
    }
  }
  /// `release()` in two phases (`detaching_release_allocator`), for a lock or wrapper around this
  /// object: the calling thread's cache goes back, then each shard in turn detaches its free
  /// segments into `out` under its own lock; false when `out` filled first (call again).
  bool release_detached(detached_segments& out) noexcept
    requires detaching_release_allocator<Inner>
  {
    flush_thread_cache();
    const std::size_t caller = caller_index();
    for (std::size_t i = 0; i < shard_count_; ++i) {
      shard_lock lock(shards_[i], caller);
      if (!shards_[i].inner.release_detached(out)) return false;
    }
    return true;
  }
  /// `Inner::record_use` on the shard that owns the block; a block no shard owns goes to the
  /// first shard, which refuses it as its own `record_use` does (counted in its `misuses()`).
  template <class Stream>
    requires use_recording_allocator<Inner, Stream>
  void record_use(block b, Stream stream) {
    const block inner = inner_block(b);
    const std::size_t caller = caller_index();
    for (std::size_t i = 0; i < shard_count_; ++i) {
      shard_lock lock(shards_[i], caller);
      if (shards_[i].inner.owns(inner)) return shards_[i].inner.record_use(inner, stream);
    }
    shard_lock lock(shards_[0], caller);
    shards_[0].inner.record_use(inner, stream);
  }
  /// The shards' statistics added up: counts and current values exactly; peaks as the sum of the
  /// shards' peaks (an upper bound of the true peak); largest sizes and fragmentation the largest.
  auto statistics() const
    requires detail::keeps_statistics<Inner>
  {
    using result = decltype(std::declval<const Inner&>().statistics());
    result sum{};
    const std::size_t caller = caller_index();
    for (std::size_t i = 0; i < shard_count_; ++i) {
      result s;
      {
        shard_lock lock(shards_[i], caller);
        s = shards_[i].inner.statistics();
      }
      sum.num_allocs += s.num_allocs;
      sum.bytes_in_use += s.bytes_in_use;
      sum.peak_bytes_in_use += s.peak_bytes_in_use;
      sum.largest_alloc_size = std::max(sum.largest_alloc_size, s.largest_alloc_size);
      sum.bytes_limit += s.bytes_limit;
      sum.bytes_reserved += s.bytes_reserved;
      sum.peak_bytes_reserved += s.peak_bytes_reserved;
      sum.bytes_reservable_limit += s.bytes_reservable_limit;
      sum.bytes_inactive += s.bytes_inactive;
      sum.bytes_active += s.bytes_active;
      sum.peak_bytes_active += s.peak_bytes_active;
      sum.bytes_reclaimed += s.bytes_reclaimed;
      sum.num_single_reclaims += s.num_single_reclaims;
      sum.num_full_reclaims += s.num_full_reclaims;
      sum.num_defragmentations += s.num_defragmentations;
      sum.bytes_defragged += s.bytes_defragged;
      sum.requested_bytes += s.requested_bytes;
      sum.largest_free_block = std::max(sum.largest_free_block, s.largest_free_block);
      sum.fragmentation = std::max(sum.fragmentation, s.fragmentation);
      sum.num_alloc_retries += s.num_alloc_retries;
      sum.num_ooms += s.num_ooms;
      sum.num_device_alloc += s.num_device_alloc;
      sum.num_device_free += s.num_device_free;
    }
    return sum;
  }

  /// The smallest max split size of the parts below (every shard has the same parts), so that
  /// `stats<sharded<caching_allocator>>` counts oversize requests as `stats<caching_allocator>`
  /// does. A type walk cannot see through `sharded` (it has no `parts()`), so it says this itself.
  std::size_t max_split_size() const noexcept
    requires(detail::contains<detail::all_parts, detail::matches<detail::has_max_split_size>, Inner>())
  {
    shard_lock lock(shards_[0], caller_index());
    const std::size_t smallest = detail::figures_of(shards_[0].inner).max_split;
    return smallest == 0 ? std::numeric_limits<std::size_t>::max() : smallest;
  }

  // ---- sharded's own ---------------------------------------------------------------------------

  /// Gives the calling thread's cached blocks back to their shards.
  void flush_thread_cache() noexcept {
    if (slot* me = my_slot(false); me != nullptr && me->cache != nullptr) flush_all(*me, *me->cache, index_of(me));
  }
  /// Gives every thread's cached blocks back. Only while no other thread uses this object.
  void flush_thread_caches() noexcept {
    const std::size_t caller = caller_index();
    for (auto& s : slots_) {
      if (s.cache != nullptr) flush_all(s, *s.cache, caller);
    }
  }

  std::size_t shard_count() const noexcept { return shard_count_; }
  /// Runs `f(shard)` with shard `i`'s lock held and returns what it returns.
  template <class F>
  decltype(auto) with_shard(std::size_t i, F&& f) {
    shard_lock lock(shards_[i], caller_index());
    return std::forward<F>(f)(shards_[i].inner);
  }
  /// The shard the calling thread allocates from first.
  std::size_t my_shard() noexcept { return shard_of(my_slot()); }
  /// Frees refused (see Failure above).
  std::size_t refused_frees() const noexcept { return refused_.load(std::memory_order_relaxed); }

 private:
  using classes = power2_classes<4, 256, cached_size_limit>;
  static constexpr std::size_t per_class_max = 32;
  using cache = detail::thread_block_cache<classes::count, per_class_max>;
  using slot = detail::thread_slot<cache>;

  static constexpr std::size_t recent_entries = 4096;
  static std::size_t recent_index(const void* p) noexcept {
    return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(p) >> 8) * 0x9E3779B97F4A7C15ull >>
                                    52);  // 12 bits
  }

  struct alignas(64) shard {
    template <class Make>
    shard(Make& make, std::size_t i) : inner(make(i)) {}
    mutable Mutex mutex;
    /// The owner's way in while no other thread has needed the shard (`shard_lock`).
    mutable detail::owner_gate gate;
    /// The slot of the thread the shard was first given to (`no_owner` before that).
    std::atomic<std::size_t> owner{no_owner};
    Inner inner;
    /// Blocks this shard handed out past the caches, by a hash of the address (a later one may
    /// take an earlier one's entry): an entry holding a block's address means the block is live
    /// and this shard's, so its free needs no `owns`. Set and cleared under `mutex`.
    void* recent[recent_entries] = {};
  };

  /// The slot index of a thread with none (more than `thread_slots` threads), and of no owner.
  static constexpr std::size_t no_slot = thread_slots, no_owner = thread_slots + 1;

  /// Holds a shard for the calling thread (`caller`: its slot's index), as a `std::lock_guard`
  /// on its `mutex` would. The thread the shard was first given to holds it through the shard's
  /// `gate` instead (no call, and where the platform allows no atomic read-modify-write either)
  /// for as long as no other thread has needed the shard: a thread working alone, or each thread
  /// on its own shard, pays no mutex. The first other thread to need the shard shuts the gate for
  /// good (waiting, if need be, for the owner to leave it); from then on every thread, the owner
  /// too, takes the mutex. Either way one thread at a time holds the shard, and a holder sees
  /// everything the one before it did.
  class shard_lock {
   public:
    shard_lock(const shard& s, std::size_t caller) noexcept : shard_(s) {
      if (caller == s.owner.load(std::memory_order_relaxed)) {
        if (s.gate.enter()) {
          gated_ = true;
          return;
        }
      } else {
        s.gate.close();
      }
      s.mutex.lock();
    }
    shard_lock(const shard_lock&) = delete;
    shard_lock& operator=(const shard_lock&) = delete;
    ~shard_lock() {
      if (gated_) {
        shard_.gate.leave();
      } else {
        shard_.mutex.unlock();
      }
    }

   private:
    const shard& shard_;
    bool gated_ = false;
  };

  /// `f(inner, inner handle)` on the shard a handle's id names, under its lock; that shard
  /// answers a handle it did not make as the part's rules say (the empty handle goes to shard 0).
  template <class Self, class F>
  static decltype(auto) on_owner_of(Self& self, handle h, F& f) {
    const std::size_t i = h ? static_cast<std::size_t>(h.id % self.shard_count_) : 0;
    const handle inner{h.id / self.shard_count_};
    shard_lock lock(self.shards_[i], self.caller_index());
    return f(self.shards_[i].inner, inner);
  }
  template <class F>
  decltype(auto) on_owner(handle h, F f) {
    return on_owner_of(*this, h, f);
  }
  template <class F>
  decltype(auto) on_owner(handle h, F f) const {
    return on_owner_of(*this, h, f);
  }

  void destroy_shards(std::size_t n) noexcept {
    for (std::size_t i = n; i-- > 0;) shards_[i].~shard();
    ::operator delete(shards_, std::align_val_t{alignof(shard)});
    shards_ = nullptr;
  }

  /// The calling thread's entry, claimed on its first call (when `claim`); null when the table
  /// is full (or the thread has none and `claim` is false).
  [[gnu::always_inline]] slot* my_slot(bool claim = true) noexcept {
    const std::thread::id me = std::this_thread::get_id();
    const std::size_t h = mix(me) >> 58;  // 6 bits: 64 slots
    if (slots_[h].thread.load(std::memory_order_acquire) == me) [[likely]]
      return &slots_[h];
    return find_slot(me, h, claim);
  }
  /// `my_slot` past its first probe.
  [[gnu::noinline]] slot* find_slot(std::thread::id me, std::size_t h, bool claim) noexcept {
    for (std::size_t probe = 0; probe < thread_slots; ++probe) {
      slot& s = slots_[(h + probe) % thread_slots];
      std::thread::id seen = s.thread.load(std::memory_order_acquire);
      if (seen == me) return &s;
      if (seen == std::thread::id{} && !claim) return nullptr;
      if (seen == std::thread::id{} && s.thread.compare_exchange_strong(seen, me, std::memory_order_acq_rel)) {
        const std::size_t ticket = next_shard_.fetch_add(1, std::memory_order_relaxed);
        s.shard = ticket % shard_count_;
        s.flush_hint = s.shard;
        // The first thread given a shard owns it (`shard_lock`); only it stores `owner`.
        if (ticket < shard_count_) shards_[s.shard].owner.store(index_of(&s), std::memory_order_relaxed);
        if (caching_ && s.cache == nullptr) s.cache = new (std::nothrow) cache;
        return &s;
      }
      if (seen == me) return &s;
    }
    return nullptr;
  }
  std::size_t index_of(const slot* s) const noexcept {
    return s != nullptr ? static_cast<std::size_t>(s - slots_) : no_slot;
  }
  /// The calling thread's slot index, looked up (never claimed); `no_slot` when it has none.
  std::size_t caller_index() const noexcept {
    const std::thread::id me = std::this_thread::get_id();
    const std::size_t h = mix(me) >> 58;
    for (std::size_t probe = 0; probe < thread_slots; ++probe) {
      const std::size_t i = (h + probe) % thread_slots;
      const std::thread::id seen = slots_[i].thread.load(std::memory_order_acquire);
      if (seen == me) return i;
      if (seen == std::thread::id{}) break;  // a thread claims the first free entry it probes
    }
    return no_slot;
  }
  /// Shard `first + n`, wrapped (both below `shard_count_`), without a division.
  std::size_t shard_after(std::size_t first, std::size_t n) const noexcept {
    const std::size_t i = first + n;
    return i < shard_count_ ? i : i - shard_count_;
  }
  std::size_t shard_of(const slot* s) const noexcept {
    if (s != nullptr) return s->shard;
    return (mix(std::this_thread::get_id()) >> 32) % shard_count_;
  }
  /// A thread id, mixed: its bits when it is a word (libstdc++, libc++: the pthread_t), whose
  /// multiply-shift is cheaper than `std::hash`'s out-of-line byte hash; else `std::hash`.
  static std::uint64_t mix(std::thread::id id) noexcept {
    std::uint64_t bits = 0;
    if constexpr (sizeof(std::thread::id) == sizeof(std::uint64_t) && std::is_trivially_copyable_v<std::thread::id>) {
      bits = std::bit_cast<std::uint64_t>(id);
    } else {
      bits = std::hash<std::thread::id>{}(id);
    }
    return bits * 0x9E3779B97F4A7C15ull;
  }

  friend class detail::forwards_queries<sharded, Inner>;

  // The guard hook of the forwarded queries: `f` runs on every shard under its lock; answers are
  // combined as "any" (owns), added up (sizes, counters), or not at all (release, visits).
  template <class F>
  decltype(auto) guarded(F&& f) {
    return over_shards(*this, f);
  }
  template <class F>
  decltype(auto) guarded(F&& f) const {
    return over_shards(*this, f);
  }
  template <class Self, class F>
  static auto over_shards(Self& self, F& f) {
    using result = decltype(f(self.shards_[0].inner));
    const std::size_t caller = self.caller_index();
    if constexpr (std::is_void_v<result>) {
      for (std::size_t i = 0; i < self.shard_count_; ++i) {
        shard_lock lock(self.shards_[i], caller);
        f(self.shards_[i].inner);
      }
    } else if constexpr (std::same_as<result, bool>) {
      for (std::size_t i = 0; i < self.shard_count_; ++i) {
        shard_lock lock(self.shards_[i], caller);
        if (f(self.shards_[i].inner)) return true;
      }
      return false;
    } else {
      result sum{};
      for (std::size_t i = 0; i < self.shard_count_; ++i) {
        shard_lock lock(self.shards_[i], caller);
        sum += f(self.shards_[i].inner);
      }
      return sum;
    }
  }

  bool is_cached_size(std::size_t bytes) const noexcept { return bytes < cached_below_; }
  /// `f(shard i's Inner)` under the shard's lock, as `detail::offload_parts` visits parts.
  auto each_shard() const noexcept {
    return [this, caller = caller_index()](std::size_t i, auto&& f) {
      shard_lock lock(shards_[i], caller);
      return f(shards_[i].inner);
    };
  }

  // ---- which tags the shards hold apart ("tags and offload" above) -----------------------------

  static constexpr std::size_t tag_words = (std::size_t{std::numeric_limits<std::uint16_t>::max()} + 1) / 64;
  /// A plain request takes the current tag: refused while the shards hold it apart.
  bool current_tag_apart() const noexcept {
    if constexpr (offloading_allocator<Inner> && tag_holding<Inner>) {
      return tag_apart(tag{current_tag_.load(std::memory_order_relaxed)});
    } else {
      return false;
    }
  }
  /// A request of tag `t`, which the shards hold apart, handed to the first shard that does not
  /// hold `t` resident: it refuses the request and counts it. (None: restored meanwhile; empty.)
  template <class Call>
  block refused_by_a_shard(tag t, std::size_t bytes, std::size_t alignment, Call call) noexcept {
    const std::size_t caller = caller_index();
    for (std::size_t i = 0; i < shard_count_; ++i) {
      shard_lock lock(shards_[i], caller);
      if (shards_[i].inner.state(t) != tag_state::resident) return call(shards_[i].inner, bytes, alignment);
    }
    return {};
  }
  template <class Call>
  block refused_with_current_tag(std::size_t bytes, std::size_t alignment, Call call) noexcept {
    if constexpr (offloading_allocator<Inner> && tag_holding<Inner>) {
      return refused_by_a_shard(tag{current_tag_.load(std::memory_order_relaxed)}, bytes, alignment, call);
    } else {
      (void)bytes, (void)alignment, (void)call;
      return {};
    }
  }
  /// Sets tag `v`'s bit, keeping the count of tags apart (a read-modify-write of the bit alone:
  /// calls for other tags may set their bits in the same word at once).
  void set_apart(std::size_t v, bool apart) noexcept {
    const std::uint64_t bit = std::uint64_t{1} << (v % 64);
    std::atomic<std::uint64_t>& word = tags_apart_[v / 64];
    if (apart) {
      if ((word.fetch_or(bit, std::memory_order_relaxed) & bit) == 0)
        apart_count_.fetch_add(1, std::memory_order_relaxed);
    } else if ((word.fetch_and(~bit, std::memory_order_relaxed) & bit) != 0) {
      apart_count_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  /// After a call that may have changed tag `t` in some shards: whether they now hold it apart.
  void note_agreement(tag t) noexcept {
    bool some_resident = false, some_not = false;
    const std::size_t caller = caller_index();
    for (std::size_t i = 0; i < shard_count_; ++i) {
      shard_lock lock(shards_[i], caller);
      (shards_[i].inner.state(t) == tag_state::resident ? some_resident : some_not) = true;
    }
    set_apart(t.value, some_resident && some_not);
  }
  /// After `offload_all`, which reaches every tag: the same for each, every shard asked once.
  void note_agreement_of_every_tag() noexcept {
    std::uint64_t resident[tag_words] = {}, not_resident[tag_words] = {};
    const std::size_t caller = caller_index();
    for (std::size_t i = 0; i < shard_count_; ++i) {
      shard_lock lock(shards_[i], caller);
      for (std::size_t v = 0; v < tag_words * 64; ++v) {
        const bool here = shards_[i].inner.state(tag{static_cast<std::uint16_t>(v)}) == tag_state::resident;
        (here ? resident : not_resident)[v / 64] |= std::uint64_t{1} << (v % 64);
      }
    }
    for (std::size_t w = 0; w < tag_words; ++w) {
      const std::uint64_t apart = resident[w] & not_resident[w];
      const std::uint64_t changed = apart ^ tags_apart_[w].load(std::memory_order_relaxed);
      for (std::size_t k = 0; k < 64; ++k)
        if ((changed >> k & 1) != 0) set_apart(w * 64 + k, (apart >> k & 1) != 0);
    }
  }
  /// The block as the shard knows it: small blocks (when caching) at their class size.
  block inner_block(block b) const noexcept {
    return is_cached_size(b.size) ? block{b.ptr, classes::size(classes::index(b.size))} : b;
  }

  /// One block from shard `first`, or from the others in turn, through `call(inner, bytes,
  /// alignment)`; small requests (when caching) at their class size and alignment 256 or more,
  /// as the caches hold them, so that any thread's cache may take the block back. A plain
  /// allocate (`Plain`) over an `Inner` that plans its growth makes the upstream call without
  /// the shard's lock (`planned_growth`).
  template <bool Plain, class Call>
  block allocate_direct(std::size_t first, std::size_t caller, std::size_t bytes, std::size_t alignment,
                        Call call) noexcept {
    const block b = allocate_from_shards<Plain>(first, caller, bytes, alignment, call);
    if (b) note_start(b);
    if (!b || handed_out(b)) [[likely]]
      return b;
    (void)free_to_owner(b, [](Inner& in, block x) { return detail::free_in(in, x); });
    return {};
  }
  template <bool Plain, class Call>
  block allocate_from_shards(std::size_t first, std::size_t caller, std::size_t bytes, std::size_t alignment,
                             Call call) noexcept;
  /// Adds the start of a small block handed out to `starts_`.
  void note_start(block b) noexcept {
    if (is_cached_size(b.size)) starts_->add(b.ptr);
  }
  /// Checked builds: records a small block handed out (false when host memory ran out).
  bool handed_out(block b) noexcept {
    if constexpr (ALLOY_CHECKED) {
      if (is_cached_size(b.size)) return handed_out_->add(b);
    }
    return true;
  }
  /// Whether a free of `b` may go on to a cache or a shard; refuses it (counted) when not: a
  /// small block at an address no cached block has (not 256-aligned, or where no small block
  /// handed out ever started), or, in checked builds, one not handed out at that size.
  bool may_free(block b) noexcept {
    if (!is_cached_size(b.size) || b.ptr == nullptr) return true;
    bool ok = (reinterpret_cast<std::uintptr_t>(b.ptr) & (cache_alignment - 1)) == 0 && starts_->contains(b.ptr);
    if constexpr (ALLOY_CHECKED) ok = ok && handed_out_->take(b);
    if (!ok) [[unlikely]]
      refuse(b);
    return ok;
  }
  template <class Stream>
  bool try_deallocate_ordered(block b, Stream stream) noexcept {
    if (!may_free(b)) return false;
    return free_to_owner(b, [stream](Inner& in, block x) { return detail::free_in(in, x, stream); });
  }
  /// `b` handed out by shard `s` (its lock held), remembered for its free; as the caller sees it.
  block remembered(shard& s, block b, std::size_t bytes) noexcept {
    if (shard_count_ > 1) s.recent[recent_index(b.ptr)] = b.ptr;
    return block{b.ptr, bytes};
  }
  /// The rest of a growth planned under `s`'s lock (not held now): the upstream call, then the
  /// adoption and allocation under the lock, then the give-back of what was not adopted.
  [[gnu::noinline]] block grow_unlocked(shard& s, std::size_t caller, growth_plan& plan, std::size_t bytes,
                                        std::size_t alignment) noexcept
    requires growth_planning_allocator<Inner>;

  /// A free from any thread: small blocks to the thread's cache, others to their shard. Inlined,
  /// with the shard's path out of line, so that a free to the cache costs no call.
  [[gnu::always_inline]] bool free_block(block b) noexcept;
  /// Frees `b` (not through a cache) in the shard that owns it, through `free(inner, block)`
  /// (a `detail::free_outcome`): the thread's own shard when it remembers handing the block out,
  /// else each shard in turn asked `owns`.
  template <class Free>
  bool free_to_owner(block b, Free free, slot* me) noexcept;
  template <class Free>
  bool free_to_owner(block b, Free free) noexcept;

  /// Gives back `n` blocks of `bytes` each to the shards that own them, the shard `first` asked
  /// first, one lock per shard (`ptrs` is reordered); returns how many were not taken (no shard
  /// owns them, or the owner refused them), each reported.
  std::size_t give_back(std::size_t first, std::size_t caller, std::size_t bytes, void** ptrs, std::size_t n,
                        std::size_t* taker = nullptr) noexcept;
  /// As above, each free through `free(inner, block)` (a `detail::free_outcome`).
  template <class Free>
  std::size_t give_back(std::size_t first, std::size_t caller, std::size_t bytes, void** ptrs, std::size_t n,
                        std::size_t* taker, Free free) noexcept;

  /// Fills half of class `c`'s capacity from shard `first` (or one block from any shard).
  void refill(std::size_t first, std::size_t caller, cache& k, std::size_t c) noexcept;

  /// Gives the `n` oldest blocks of class `c` back, asking first the shard that took the thread's
  /// last flush (blocks freed by a consumer thread mostly belong to one producer's shard).
  /// `caller`: the calling thread's slot index (not always `me`'s: `flush_thread_caches`).
  void flush(slot& me, cache& k, std::size_t c, std::uint32_t n, std::size_t caller) noexcept;
  void flush_all(slot& me, cache& k, std::size_t caller) noexcept;

  [[gnu::cold, gnu::noinline]] void refuse(block b) noexcept {
    refused_.fetch_add(1, std::memory_order_relaxed);
    if constexpr (ALLOY_CHECKED) {
      std::fprintf(stderr, "alloy::sharded: refused a free of %zu bytes at %p (not a live block of that size)\n",
                   b.size, b.ptr);
    }
  }

  static_assert(owning_allocator<Inner>, "sharded routes frees by Inner::owns");

  shard* shards_ = nullptr;
  std::size_t shard_count_ = 0;
  bool caching_ = false;
  std::size_t cached_below_ = 0;  ///< sizes below it go through the caches: one test on every path
  std::uint32_t capacity_[classes::count] = {};
  alignas(64) std::atomic<std::size_t> next_shard_{0};
  std::atomic<std::size_t> refused_{0};
  /// With thread caches: where small blocks handed out started (`may_free`).
  std::unique_ptr<detail::granule_set> starts_;
  /// Checked builds with thread caches: every small block handed out (`may_free`).
  std::unique_ptr<detail::handed_out_blocks> handed_out_;
  slot slots_[thread_slots];
  /// Over an offloading `Inner`: a bit per tag the shards hold apart, their count, and the current
  /// tag `set_current_tag` gave every shard (for plain requests).
  std::unique_ptr<std::atomic<std::uint64_t>[]> tags_apart_;
  std::atomic<std::uint32_t> apart_count_{0};
  std::atomic<std::uint16_t> current_tag_{0};
};

}  // namespace alloy

// The member definitions of request and free routing.
#include <alloy/policy/sharded/routing.hpp>
