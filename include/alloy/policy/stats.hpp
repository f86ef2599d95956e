// SPDX-License-Identifier: Apache-2.0
// alloy/policy/stats.hpp
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/edge.hpp>
#include <alloy/detail/figures.hpp>
#include <alloy/detail/forwarding.hpp>
#include <alloy/detail/walk.hpp>
#include <alloy/error.hpp>
#include <alloy/find.hpp>
#include <alloy/movable.hpp>
#include <alloy/statistics.hpp>

namespace alloy {

namespace detail {

// ---- what stats<> knows of a composition by its types alone ----------------------------------

/// Whether some part of `A` (itself included) satisfies the trait `Pred` (types only: nothing is
/// read, so no lock is needed).
template <template <class> class Pred, class A>
constexpr bool any_part() {
  return contains<all_parts, matches<Pred>, A>();
}

template <class A>
struct is_reserving : std::bool_constant<reserving_allocator<A>> {};
template <class A>
struct is_segregator : std::bool_constant<segregator_shaped<A>> {};

/// Whether both sides of the first segregator-shaped part of `Inner` are introspectable (then
/// the free pieces are counted per pool).
template <bool HasPools, class Inner>
struct pool_sides {
  static constexpr bool introspectable = false;
};
template <class Inner>
struct pool_sides<true, Inner> {
  using seg = first_part_t<all_parts, segregator_match, Inner>;
  static constexpr bool introspectable =
      introspectable_allocator<std::remove_cvref_t<decltype(std::declval<seg&>().small())>> &&
      introspectable_allocator<std::remove_cvref_t<decltype(std::declval<seg&>().large())>>;
};

// ---- the counters every stats<> keeps, independent of Inner ----------------------------------

class stats_core;

/// The state of one `memory_trace`, registered with the `stats_core` it watches.
struct trace_state {
  stats_core* core = nullptr;
  std::int64_t start = 0;        ///< bytes in use at start/reset
  std::int64_t peak = 0;         ///< exact peak of bytes in use since start/reset (flushed)
  std::int64_t last_in_use = 0;  ///< bytes in use when the allocator went away
  bool running = false;
};

/// Counters of `stats<>` that do not depend on the inner allocator, and the registry of live
/// traces. Traces get exact peaks without polling: the core keeps one running maximum of the bytes
/// in use since the last trace event (`epoch_peak`); at every event (a trace starting, resetting,
/// stopping or being read) the maximum is folded into every running trace and restarted. The hot
/// path pays one comparison, however many traces are alive.
class stats_core {
 public:
  stats_core() = default;
  stats_core(stats_core&& other) noexcept { *this = std::move(other); }
  stats_core& operator=(stats_core&& other) noexcept {
    if (this == &other) return *this;
    detach_traces();
    allocation = other.allocation;
    bytes = other.bytes;
    reserved = other.reserved;
    segment = other.segment;
    oversize = other.oversize;
    oversize_segments = other.oversize_segments;
    inactive_split = other.inactive_split;
    inactive_split_bytes = other.inactive_split_bytes;
    largest_alloc = other.largest_alloc;
    num_ooms = other.num_ooms;
    epoch_peak = other.epoch_peak;
    last_reserved = other.last_reserved;
    baseline_counters = other.baseline_counters;
    baseline_movable = other.baseline_movable;
    traces = std::move(other.traces);
    other.traces.clear();
    for (trace_state* t : traces) t->core = this;
    return *this;
  }
  stats_core(const stats_core&) = delete;
  stats_core& operator=(const stats_core&) = delete;
  ~stats_core() { detach_traces(); }

  // Hot path.
  void on_allocate(std::size_t p, std::int64_t size) noexcept {
    allocation[0].increase(1);
    bytes[0].increase(size);
    if (p != 0) {
      allocation[p].increase(1);
      bytes[p].increase(size);
    }
    if (size > largest_alloc) largest_alloc = size;
    if (bytes[0].current > epoch_peak) epoch_peak = bytes[0].current;
  }
  void on_deallocate(std::size_t p, std::int64_t size) noexcept {
    allocation[0].decrease(1);
    bytes[0].decrease(size);
    if (p != 0) {
      allocation[p].decrease(1);
      bytes[p].decrease(size);
    }
  }

  std::int64_t in_use() const noexcept { return bytes[0].current; }

  // Traces.
  void attach(trace_state* t) {
    flush();
    traces.push_back(t);
    t->core = this;
  }
  void detach(trace_state* t) noexcept {
    flush();
    traces.erase(std::remove(traces.begin(), traces.end(), t), traces.end());
    t->core = nullptr;
  }
  /// Folds the running maximum into every running trace and restarts it.
  void flush() noexcept {
    for (trace_state* t : traces)
      if (t->running && epoch_peak > t->peak) t->peak = epoch_peak;
    epoch_peak = bytes[0].current;
  }

  void reset_peak() noexcept {
    for (stat_array* a : {&allocation, &bytes, &reserved, &segment, &inactive_split, &inactive_split_bytes})
      for (stat& s : *a) s.reset_peak();
    oversize.reset_peak();
    oversize_segments.reset_peak();
    largest_alloc = 0;
  }
  void reset_accumulated() noexcept {
    for (stat_array* a : {&allocation, &bytes, &reserved, &segment, &inactive_split, &inactive_split_bytes})
      for (stat& s : *a) s.reset_accumulated();
    oversize.reset_accumulated();
    oversize_segments.reset_accumulated();
    num_ooms = 0;
  }

  stat_array allocation{};            ///< live blocks (PyTorch `allocation` and `active`)
  stat_array bytes{};                 ///< their sizes (PyTorch `allocated_bytes`, `requested_bytes`, `active_bytes`)
  stat_array reserved{};              ///< bytes reserved, observed after every call
  stat_array segment{};               ///< segments held, observed when reserved bytes change
  stat oversize{};                    ///< live requests above max_split_size
  stat oversize_segments{};           ///< segments above max_split_size, observed at queries
  stat_array inactive_split{};        ///< free pieces of partly used segments, observed at queries
  stat_array inactive_split_bytes{};  ///< their bytes, observed at queries
  std::int64_t largest_alloc = 0;
  std::size_t num_ooms = 0;
  std::int64_t epoch_peak = 0;
  std::size_t last_reserved = 0;
  allocator_counters baseline_counters{};  ///< inner counters at the last reset_accumulated()
  movable_counters baseline_movable{};     ///< inner movable counters at the last reset_accumulated()
  std::vector<trace_state*> traces;

 private:
  void detach_traces() noexcept {
    flush();
    for (trace_state* t : traces) t->core = nullptr, t->last_in_use = bytes[0].current;
    traces.clear();
  }
};

/// One reading of a `stats<>` part, taken with one refresh: what `memory_stats` and
/// `memory_summary` print, as typed data.
struct stats_reading {
  alloy::statistics statistics{};
  stat_array allocation{};              ///< PyTorch `allocation` and `active`
  stat_array bytes{};                   ///< PyTorch `allocated_bytes`, `active_bytes`, `requested_bytes`
  stat_array reserved{};                ///< PyTorch `reserved_bytes`
  stat_array segment{};                 ///< PyTorch `segment`
  stat_array inactive_split{};          ///< PyTorch `inactive_split`
  stat_array inactive_split_bytes{};    ///< PyTorch `inactive_split_bytes`
  stat oversize{};                      ///< PyTorch `oversize_allocations`
  stat oversize_segments{};             ///< PyTorch `oversize_segments`
  allocator_counters accumulated{};     ///< upstream counters since `reset_accumulated()`
  allocator_counters inner_counters{};  ///< `Inner`'s own counters (maps and unmaps), when it counts
  std::size_t num_ooms = 0;
  std::size_t max_split = std::numeric_limits<std::size_t>::max();  ///< SIZE_MAX: none
  std::size_t all_stream_synchronizations = 0;                      ///< of the stream-ordered parts inside
  bool pools = false;                                               ///< small and large pools (a segregator inside)
};

}  // namespace detail

/// `stats<Inner>` counts everything docs/design.md#statistics names, exactly, and keeps scoped
/// traces.
///
/// - Strategy: every call is forwarded to `Inner`; on the way back a handful of counters are
///   updated (live blocks and bytes, in total and per pool, their peaks, the largest request) and
///   `Inner`'s reserved bytes read (one O(1) call), so the reserved peak is exact. A block's size
///   is the size its caller asked for (docs/design.md#concepts), so `bytes_in_use`,
///   `requested_bytes` and PyTorch's `allocated_bytes` and `active_bytes` are equal. Everything
///   else comes from `Inner`'s typed figures (`detail::figures_of`), read through every wrapper's
///   guard (under a `synchronized<>` inside, nothing is read without its lock): reserved bytes,
///   counters, movable and offload statistics, limits, and introspection (`largest_free_block`,
///   `fragmentation`, PyTorch's `inactive_split*`), at query time only. With a segregator inside,
///   requests count in `small_pool` or `large_pool` by its threshold; else all in `large_pool`.
/// - `reset_peak()` sets every peak to the current value (PyTorch's `reset_peak_memory_stats`);
///   `reset_accumulated()` restarts the totals (`reset_accumulated_memory_stats`).
/// - Traces: any number of `alloy::memory_trace`s (alloy/memory_stats.hpp), each with an exact
///   peak, one comparison per allocation; they follow a move and must not outlive the allocator.
/// - Complexity: O(1) added to each call, no map, no heap allocation, no lock; a query that needs
///   introspection walks the blocks once.
/// - Failure: `Inner`'s. A free is counted only when the part below accepted it (checked frees:
///   `try_deallocate`); over a part that cannot tell, only when it could be a live block's, so no
///   figure goes below zero. Failed requests count in `num_ooms`, but for an alignment that is no
///   power of two.
/// - Thread safety: none (wrap in `synchronized`; read statistics under its `with_lock`).
/// - Memory kind: `Inner`'s. Capabilities: exactly those of `Inner` (`detail::decorates`), counted
///   like plain calls (a handle's free only when `Inner` took it), plus `bytes_in_use` and
///   `oom_report_for`. Tags and offload
///   (docs/design.md#offload): a tagged allocation counts as a plain one (refused for an
///   offloaded tag: an OOM here); after `offload`, `discard`, `restore` and `offload_all` the
///   reserved bytes are read again; a block of an offloaded tag stays in `bytes_in_use` until
///   freed, and the snapshot shows it as offloaded.
template <allocator Inner>
class stats : public detail::decorates<stats<Inner>, Inner> {
  using decorated = detail::decorates<stats<Inner>, Inner>;

 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;
  /// Whether requests are split into small and large pools (a segregator-shaped part exists).
  static constexpr bool has_pools = detail::any_part<detail::is_segregator, Inner>();

  struct options {
    bool introspect = true;  ///< walk the blocks at query time (free space, inactive_split)
  };

  stats() { init(); }
  explicit stats(Inner inner, options opts = {}) : inner_(std::move(inner)), options_(opts) { init(); }

  // ---- allocation ------------------------------------------------------------------------------

  // allocate, deallocate, try_deallocate, allocate_keeping_cache and the stream-ordered calls come
  // from `detail::decorates`, through on_allocate and on_free below.
  using decorated::deallocate;
  using decorated::try_deallocate;

  // ---- movable blocks (when Inner has them) ----------------------------------------------------

  handle allocate_movable(std::size_t bytes) noexcept(noexcept(std::declval<Inner&>().allocate_movable(std::size_t{})))
    requires movable_allocator<Inner>
  {
    const handle h = inner_.allocate_movable(bytes);
    if constexpr (sized_movable_allocator<Inner>) {
      if (h) {
        core_.on_allocate(pool_of(bytes), static_cast<std::int64_t>(bytes));
        count_oversize(bytes);
      } else {
        ++core_.num_ooms;
      }
    }
    check_reserved();
    return h;
  }
  void* lock(handle h)
    requires movable_allocator<Inner>
  {
    void* p = inner_.lock(h);
    check_reserved();
    return p;
  }
  void unlock(handle h)
    requires movable_allocator<Inner>
  {
    inner_.unlock(h);
  }
  void deallocate(handle h)
    requires movable_allocator<Inner>
  {
    if constexpr (sized_movable_allocator<Inner>) {
      const bool live = handle_is_live(h);
      const std::size_t size = inner_.size_of(h);
      inner_.deallocate(h);  // throws for a bad handle, before anything is counted
      if (live) uncounted(block{nullptr, size}, true);
    } else {
      inner_.deallocate(h);
    }
    check_reserved();
  }
  /// As `deallocate(h)`, counted only when `Inner` accepted the free (false: refused, nothing
  /// changed here or below).
  bool try_deallocate(handle h) noexcept
    requires detail::has_try_deallocate_handle<Inner>
  {
    bool accepted;
    if constexpr (sized_movable_allocator<Inner>) {
      std::size_t size = 0;
      try {
        size = inner_.size_of(h);
      } catch (...) {  // a size_of that throws for a bad handle: the free below refuses it too
      }
      accepted = inner_.try_deallocate(h);
      if (accepted) uncounted(block{nullptr, size}, true);
    } else {
      accepted = inner_.try_deallocate(h);
    }
    check_reserved();
    return accepted;
  }
  std::size_t size_of(handle h) const
    requires sized_movable_allocator<Inner>
  {
    return inner_.size_of(h);
  }
  auto movable_statistics() const noexcept
    requires detail::has_movable_statistics<Inner>
  {
    return inner_.movable_statistics();
  }
  void reset_movable_peak() noexcept
    requires detail::has_reset_movable_peak<Inner>
  {
    inner_.reset_movable_peak();
  }
  bool is_live(handle h) const noexcept
    requires detail::has_is_live<Inner>
  {
    return inner_.is_live(h);
  }

  // ---- capabilities of Inner -------------------------------------------------------------------

  void release() noexcept
    requires releasing_allocator<Inner>
  {
    inner_.release();
    check_reserved();
  }
  /// As `release()`, in two phases (`detaching_release_allocator`): a lock around this object is
  /// not held while the detached segments go back.
  bool release_detached(detached_segments& out) noexcept
    requires detaching_release_allocator<Inner>
  {
    const bool done = inner_.release_detached(out);
    check_reserved();
    return done;
  }

  // ---- statistics --------------------------------------------------------------------------------

  /// Bytes of live blocks (the sizes callers asked for).
  std::size_t bytes_in_use() const noexcept { return static_cast<std::size_t>(core_.in_use()); }

  /// Every field of docs/design.md#statistics. O(1), plus one walk over the blocks when `Inner` is
  /// introspectable and `options::introspect` is on.
  alloy::statistics statistics() const { return statistics_from(refresh()); }

  /// Everything `memory_stats` and `memory_summary` print, from one refresh. Internal; use those.
  detail::stats_reading reading() const {
    const detail::figures f = refresh();
    detail::stats_reading r;
    r.statistics = statistics_from(f);
    const auto& c = core_;
    r.allocation = c.allocation;
    r.bytes = c.bytes;
    r.reserved = c.reserved;
    r.segment = c.segment;
    r.inactive_split = c.inactive_split;
    r.inactive_split_bytes = c.inactive_split_bytes;
    r.oversize = c.oversize;
    r.oversize_segments = c.oversize_segments;
    r.accumulated = accumulated_from(f);
    if constexpr (counting_allocator<Inner>) r.inner_counters = f.all.counters;
    r.num_ooms = c.num_ooms;
    r.max_split = max_split_;
    r.all_stream_synchronizations = f.all_stream_synchronizations;
    r.pools = has_pools;
    return r;
  }

 private:
  alloy::statistics statistics_from(const detail::figures& f) const {
    alloy::statistics s;
    const auto& c = core_;
    s.num_allocs = static_cast<std::size_t>(c.allocation[0].allocated);
    s.bytes_in_use = static_cast<std::size_t>(c.bytes[0].current);
    s.peak_bytes_in_use = static_cast<std::size_t>(c.bytes[0].peak);
    s.largest_alloc_size = static_cast<std::size_t>(c.largest_alloc);
    s.requested_bytes = s.bytes_in_use;
    s.bytes_limit = f.bytes_limit;
    s.bytes_reservable_limit = f.reservable_limit;
    s.bytes_reserved = static_cast<std::size_t>(c.reserved[0].current);
    s.peak_bytes_reserved = static_cast<std::size_t>(c.reserved[0].peak);
    if (f.knows_movable || f.knows_offload) {
      const movable_counters m = movable_of(f);
      const movable_counters& b = c.baseline_movable;
      s.bytes_active = m.bytes_active;
      s.bytes_inactive = m.bytes_inactive;
      s.peak_bytes_active = m.peak_bytes_active;
      s.bytes_reclaimed = m.bytes_reclaimed - b.bytes_reclaimed;
      s.num_single_reclaims = m.num_single_reclaims - b.num_single_reclaims;
      s.num_full_reclaims = m.num_full_reclaims - b.num_full_reclaims;
      s.num_defragmentations = m.num_defragmentations - b.num_defragmentations;
      s.bytes_defragged = m.bytes_defragged - b.bytes_defragged;
    }
    const allocator_counters k = accumulated_from(f);
    s.num_alloc_retries = k.num_alloc_retries;
    s.num_device_alloc = k.num_device_alloc;
    s.num_device_free = k.num_device_free;
    s.num_ooms = c.num_ooms;
    if constexpr (introspectable_allocator<Inner>) {
      if (options_.introspect) {
        const detail::free_space space = detail::measure_free_space(inner_);
        s.largest_free_block = space.largest;
        s.fragmentation = space.fragmentation();
      }
    }
    return s;
  }

 public:
  /// The counters behind `alloy::memory_stats` (refreshed). Internal; use `alloy::memory_stats`.
  const detail::stats_core& core() const {
    refresh();
    return core_;
  }
  detail::stats_core& trace_registry() noexcept { return core_; }

  /// Upstream counters since the last `reset_accumulated()`.
  allocator_counters accumulated_counters() const noexcept { return accumulated_from(detail::figures_of(inner_)); }

  /// The largest request size for which a part said it does not split blocks; SIZE_MAX if none.
  std::size_t max_split_size() const noexcept { return max_split_; }

  /// Every peak restarts from the current value (PyTorch `reset_peak_memory_stats`), the movable
  /// peaks of the parts below too (`detail::reset_movable_peaks`: through composites and locks).
  void reset_peak() noexcept {
    refresh_reserved();
    core_.reset_peak();
    detail::reset_movable_peaks(inner_);
  }
  /// Totals restart from zero (PyTorch `reset_accumulated_memory_stats`).
  void reset_accumulated() noexcept {
    const detail::figures f = refresh_reserved();
    core_.reset_accumulated();
    core_.baseline_counters = f.all.counters;
    core_.baseline_movable = movable_of(f);
  }

  /// What `alloy::out_of_memory` reports when a request of `bytes` failed (the edges ask).
  oom_report oom_report_for(std::size_t bytes, std::size_t alignment) const {
    const alloy::statistics s = statistics();
    oom_report r{.requested = bytes, .alignment = alignment};
    r.limit = s.bytes_limit != 0 ? s.bytes_limit : s.bytes_reservable_limit;
    r.in_use = s.bytes_in_use;
    r.reserved = s.bytes_reserved;
    r.largest_free_block = s.largest_free_block;
    r.fragmentation = s.fragmentation;
    return r;
  }

  const options& get_options() const noexcept { return options_; }
  Inner& inner() noexcept { return inner_; }
  const Inner& inner() const noexcept { return inner_; }
  auto parts() noexcept { return std::tie(inner_); }
  auto parts() const noexcept { return std::tie(inner_); }

 private:
  friend decorated;
  friend class detail::forwards_queries<stats, Inner>;

  // The guard hook of the forwarded calls: a call that may change the part (`offload`,
  // `discard`, `restore`, `offload_all`, `record_use`) is followed by a look at the reserved
  // bytes, so that the reserved figures and their peak stay exact when an offload unmaps memory.
  template <class F>
  decltype(auto) guarded(F&& f) {
    if constexpr (std::is_void_v<decltype(f(inner_))>) {
      f(inner_);
      check_reserved();
    } else {
      auto result = f(inner_);
      check_reserved();
      return result;
    }
  }
  template <class F>
  decltype(auto) guarded(F&& f) const {
    return std::forward<F>(f)(inner_);
  }

  template <class Call, class GiveBack, class... Stream>
  block on_allocate(std::size_t bytes, std::size_t alignment, Call call, GiveBack, detail::allocation_kind kind,
                    Stream...) noexcept {
    const block b = call(bytes);
    // A failure here is not an OOM yet: the caller (`stream_ordered`) retries with `allocate`.
    if (!b && kind == detail::allocation_kind::keeping_cache) return b;
    // Nor is a bad argument: an alignment that is no power of two (docs/design.md#errors). A size
    // no memory could hold counts, as PyTorch counts it.
    if (!b && !detail::is_power_of_two(alignment)) {
      check_reserved();
      return b;
    }
    return counted(b, bytes);
  }
  template <class Call, class... Stream>
  bool on_free(block b, Call call, Stream...) noexcept {
    const detail::free_outcome outcome = call(b);
    if (outcome == detail::free_outcome::refused) return false;
    if (outcome == detail::free_outcome::accepted || could_be_live(b)) uncounted(b);
    check_reserved();
    return true;
  }
  /// Whether an unchecked free could be a live block's (else counting it would go below zero).
  bool could_be_live(block b) const noexcept {
    const std::size_t p = pool_of(b.size);
    const auto size = static_cast<std::int64_t>(b.size);
    return core_.allocation[0].current > 0 && core_.bytes[0].current >= size &&
           (p == 0 || (core_.allocation[p].current > 0 && core_.bytes[p].current >= size));
  }

  static constexpr bool knows_reserved = detail::any_part<detail::is_reserving, Inner>();
  static constexpr bool knows_max_split = detail::any_part<detail::has_max_split_size, Inner>();

  void init() noexcept {
    const detail::figures f = refresh_reserved();
    if constexpr (knows_max_split) {
      max_split_ = f.max_split == 0 ? std::numeric_limits<std::size_t>::max() : f.max_split;
    }
  }

  /// Upstream counters of `f` since the last `reset_accumulated()`.
  allocator_counters accumulated_from(const detail::figures& f) const noexcept {
    allocator_counters k{};
    if (f.all.knows_counters) {
      const allocator_counters& b = core_.baseline_counters;
      k.num_device_alloc = f.all.counters.num_device_alloc - b.num_device_alloc;
      k.num_device_free = f.all.counters.num_device_free - b.num_device_free;
      k.num_alloc_retries = f.all.counters.num_alloc_retries - b.num_alloc_retries;
      k.num_ooms = f.all.counters.num_ooms - b.num_ooms;
    }
    return k;
  }

  /// The movable parts' counters with the offloading parts' reclaims added (LMS's fields).
  static movable_counters movable_of(const detail::figures& f) noexcept {
    movable_counters sum = f.movable;
    sum.bytes_reclaimed += f.offload.bytes_reclaimed;
    sum.num_single_reclaims += f.offload.num_single_reclaims;
    sum.num_full_reclaims += f.offload.num_full_reclaims;
    sum.bytes_restored += f.offload.bytes_copied_back;
    sum.num_restores += f.offload.num_restores;
    return sum;
  }

  std::size_t pool_of(std::size_t bytes) const noexcept {
    if constexpr (has_pools) {
      using seg = detail::first_part_t<detail::all_parts, detail::segregator_match, Inner>;
      return bytes <= static_cast<std::size_t>(seg::threshold) ? 1 : 2;
    } else {
      return 0;  // one pool: `all`, reported as large_pool as well
    }
  }

  block counted(block b, std::size_t bytes) noexcept {
    if (b) {
      core_.on_allocate(pool_of(bytes), static_cast<std::int64_t>(b.size));
      count_oversize(b.size);
    } else {
      ++core_.num_ooms;
    }
    check_reserved();
    return b;
  }
  void uncounted(block b, bool live = false) noexcept {
    if (!b && !live) return;
    core_.on_deallocate(pool_of(b.size), static_cast<std::int64_t>(b.size));
    uncount_oversize(b.size);
  }
  void count_oversize(std::size_t size) noexcept {
    if constexpr (knows_max_split) {
      if (size > max_split_) core_.oversize.increase(1);
    }
  }
  void uncount_oversize(std::size_t size) noexcept {
    if constexpr (knows_max_split) {
      if (size > max_split_) core_.oversize.decrease(1);
    }
  }
  bool handle_is_live(handle h) const noexcept {
    if constexpr (requires { inner_.is_live(h); }) {
      return inner_.is_live(h);
    } else {
      return static_cast<bool>(h);
    }
  }

  void check_reserved() noexcept {
    if constexpr (knows_reserved) {
      if (reserved_now() != core_.last_reserved) refresh_reserved();
    }
  }
  /// The reserved bytes below, asked of `Inner` (one O(1) call on the hot path when it has them).
  std::size_t reserved_now() const noexcept {
    if constexpr (reserving_allocator<Inner>) {
      return static_cast<std::size_t>(inner_.reserved_bytes());
    } else {
      return detail::figures_of(inner_).all.reserved;
    }
  }

  /// Asks `Inner` for its figures and observes the reserved bytes and segments, overall and per
  /// pool (rare: they changed, or a query).
  detail::figures refresh_reserved(const detail::figures_request& request = {}) const noexcept {
    const detail::figures f = detail::figures_of(inner_, request);
    auto& c = core_;
    if (f.all.knows_reserved) {
      c.last_reserved = f.all.reserved;
      c.reserved[0].observe(static_cast<std::int64_t>(c.last_reserved));
    }
    if (f.all.knows_counters) c.segment[0].observe(segments_of(f.all.counters));
    if constexpr (has_pools) {
      for (std::size_t p = 1; p <= 2; ++p) {
        const detail::pool_figures& side = f.pools[p - 1];
        if (side.knows_reserved) c.reserved[p].observe(static_cast<std::int64_t>(side.reserved));
        if (side.knows_counters) c.segment[p].observe(segments_of(side.counters));
      }
    }
    return f;
  }
  static std::int64_t segments_of(const allocator_counters& k) noexcept {
    return static_cast<std::int64_t>(k.num_device_alloc - k.num_device_free);
  }

  /// Brings the observed statistics up to date (reserved, segments, inactive splits) and returns
  /// the figures they came from.
  detail::figures refresh() const {
    detail::figures_request request;
    if constexpr (introspectable_allocator<Inner>) request = {.blocks = options_.introspect, .max_split = max_split_};
    const detail::figures f = refresh_reserved(request);
    if constexpr (introspectable_allocator<Inner>) {
      if (!options_.introspect) return f;
      std::array<detail::block_figures, 3> pieces{};
      if constexpr (pools_introspectable) {
        pieces[1] = f.pools[0].blocks;
        pieces[2] = f.pools[1].blocks;
        pieces[0] = pieces[1];
        pieces[0] += pieces[2];
      } else {
        pieces[0] = f.all.blocks;
      }
      for (std::size_t p = 0; p < (has_pools ? 3 : 1); ++p) {
        core_.inactive_split[p].observe(pieces[p].inactive_splits);
        core_.inactive_split_bytes[p].observe(pieces[p].inactive_split_bytes);
      }
      core_.oversize_segments.observe(pieces[0].oversize_segments);
    }
    return f;
  }

  static constexpr bool pools_introspectable = detail::pool_sides<has_pools, Inner>::introspectable;

  Inner inner_{};
  options options_{};
  std::size_t max_split_ = std::numeric_limits<std::size_t>::max();
  mutable detail::stats_core core_{};
};

}  // namespace alloy
