// SPDX-License-Identifier: Apache-2.0
// alloy/detail/forwarding.hpp: the one way optional capabilities are passed on.
//
// Every optional capability is listed once, in `capability` below, with its test in
// `has_capability`. Four bases pass them on, each member existing exactly when the part has the
// capability (Phobos's rule: a wrapper has what its parts have):
//
// - `forwards_queries<Derived, Inner>`: the capabilities that neither allocate nor free (owns,
//   release, reserved bytes, counters, introspection, record_use, bytes in use, requested bytes,
//   limits, serves). Every call goes through `Derived::guarded(f)`, the guard hook, which runs
//   `f(inner)`; by default it calls `f(inner())`. `synchronized` takes its lock there, `ref`
//   follows its pointer, `sharded` visits its shards: that is all each of them adds.
// - `forwards_everything<Derived, Inner>`: the above plus every allocating call (plain,
//   keeping-cache, stream-ordered, checked frees, movable handles), all through the guard.
// - `decorates<Derived, Inner>`: the queries plus the allocating calls (plain, keeping-cache,
//   stream-ordered, checked frees) routed through two hooks of the decorator, `on_allocate` and
//   `on_free`, so that a counting decorator writes its accounting once and has exactly the
//   allocating calls its part has. `on_free` learns what the part below did with the free
//   (`free_outcome`): `accepted` or `refused` when the part checks its frees (`try_deallocate`),
//   `unchecked` when it cannot tell.
// - `two_parts<Derived, First, Second>` (`segregator`, `fallback`): the queries of both parts
//   combined (sums, both-or-either) and the allocating calls through the routing hooks
//   `route_allocation`, `route_free` and `route_to_holder`.
//
// Tags and offload (docs/design.md#offload) are capabilities like the others: `current_tag` /
// `set_current_tag` and `offload` / `discard` / `restore` / `state` / `offload_stats` /
// `offload_all` / the per-tag figures are queries (they neither allocate nor free a block), so
// they go through the guard (`synchronized` locks, `ref` follows, `sharded` reaches every shard);
// `allocate(bytes, alignment, tag)` is an allocating call (`decorates`: through `on_allocate`,
// counted exactly like a plain one). A decorator's own counts do not change on offload: a block
// of an offloaded tag is still the caller's until freed (`stats` bytes in use, `limited`'s
// count); the physical side (reserved = mapped bytes) falls, as the part reports it.
//
// The capability matrix test (test/capability_matrix_test.cpp) checks, for every wrapper and every
// entry of `capability`, that the wrapper has it exactly when its part has it.
#pragma once

#include <concepts>
#include <cstddef>
#include <mutex>
#include <type_traits>
#include <utility>

#include <alloy/block.hpp>
#include <alloy/concepts.hpp>
#include <alloy/detail/figures.hpp>
#include <alloy/graph_pool.hpp>

namespace alloy::detail {

// ---- the capabilities, listed once ---------------------------------------------------------------

// (`reports_bytes_in_use`, `reports_requested_bytes`, the limits and the movable figures:
// detail/walk.hpp.)
template <class A>
concept has_size_of = movable_allocator<A> && requires(const A& a, handle h) {
  { a.size_of(h) } -> std::convertible_to<std::size_t>;
};
/// Checked free of a handle: `try_deallocate(handle) noexcept -> bool`, false (nothing changed)
/// where `deallocate(handle)` would throw (empty, unknown, stale, another allocator's, locked).
template <class A>
concept has_try_deallocate_handle = movable_allocator<A> && requires(A& a, handle h) {
  { a.try_deallocate(h) } noexcept -> std::same_as<bool>;
};
template <class A>
concept has_is_live = requires(const A& a, handle h) {
  { a.is_live(h) } -> std::convertible_to<bool>;
};
template <class A>
concept has_tagged_allocate = requires(A& a, std::size_t bytes, std::size_t alignment, tag t) {
  { a.allocate(bytes, alignment, t) } noexcept -> std::same_as<block>;
};
template <class A>
concept has_offload_all = requires(A& a) {
  { a.offload_all() } noexcept -> std::same_as<offload_status>;
};

/// Every optional capability (docs/design.md#concepts and the informal ones the statistics read).
/// Adding one here means: give it a test in `has_capability`, pass it on in the bases below (and
/// raise `forwarded_capabilities`), and the capability matrix test checks every wrapper for it.
enum class capability : unsigned {
  owns,
  release,
  reserved_bytes,
  counters,
  for_each_block,
  record_use,
  bytes_in_use,
  requested_bytes,
  bytes_limit,
  bytes_reservable_limit,
  allocate_keeping_cache,
  try_deallocate,
  stream_ordered,
  try_deallocate_on_stream,
  movable,
  size_of,
  movable_statistics,
  reset_movable_peak,
  is_live,
  serves,
  planned_growth,     ///< `allocate_or_plan` + `allocate_planned` (growth_planning_allocator)
  current_tag,        ///< `current_tag` + `set_current_tag` (tag_holding: `scoped_tag` works)
  tagged_allocate,    ///< `allocate(bytes, alignment, tag)`
  offload,            ///< `offload`, `discard`, `restore`, `state`, `offload_stats` (offloading_allocator)
  offload_all,        ///< `offload_all()`
  tag_figures,        ///< `host_bytes(tag)`, `mapped_bytes(tag)`, `live_bytes(tag)` (tag_reporting_allocator)
  detaching_release,  ///< `release_detached(out)` (detaching_release_allocator)
  graph_pools,        ///< `begin_allocate_to_pool`, `end_allocate_to_pool`, `release_pool`, `pool_figures`
  try_free_handle,    ///< `try_deallocate(handle)` (has_try_deallocate_handle)
  allocate_cached,    ///< `allocate_cached` (cache_serving_allocator)
  free_misuse,        ///< `free_misuse(block)` (free_screening_allocator)
  count_              ///< not a capability: how many there are
};
inline constexpr unsigned capability_count = static_cast<unsigned>(capability::count_);

/// The capabilities the bases below pass on; a new entry in `capability` fails here until it is
/// passed on.
inline constexpr unsigned forwarded_capabilities = 31;
static_assert(capability_count == forwarded_capabilities,
              "a capability was added: pass it on in detail/forwarding.hpp, then raise forwarded_capabilities");

template <class>
inline constexpr bool no_such_capability = false;

/// Whether `A` has capability `C` (stream-ordered ones over `Stream`).
template <capability C, class A, class Stream>
constexpr bool has_capability() {
  if constexpr (C == capability::owns) return owning_allocator<A>;
  else if constexpr (C == capability::release) return releasing_allocator<A>;
  else if constexpr (C == capability::reserved_bytes) return reserving_allocator<A>;
  else if constexpr (C == capability::counters) return counting_allocator<A>;
  else if constexpr (C == capability::for_each_block) return introspectable_allocator<A>;
  else if constexpr (C == capability::record_use) return use_recording_allocator<A, Stream>;
  else if constexpr (C == capability::bytes_in_use) return reports_bytes_in_use<A>;
  else if constexpr (C == capability::requested_bytes) return reports_requested_bytes<A>;
  else if constexpr (C == capability::bytes_limit) return reports_bytes_limit<A>;
  else if constexpr (C == capability::bytes_reservable_limit) return reports_bytes_reservable_limit<A>;
  else if constexpr (C == capability::allocate_keeping_cache) return cache_keeping_allocator<A>;
  else if constexpr (C == capability::allocate_cached) return cache_serving_allocator<A>;
  else if constexpr (C == capability::try_deallocate) return checked_deallocating_allocator<A>;
  else if constexpr (C == capability::stream_ordered) return stream_ordered_allocator<A, Stream>;
  else if constexpr (C == capability::try_deallocate_on_stream) return checked_stream_deallocating_allocator<A, Stream>;
  else if constexpr (C == capability::movable) return movable_allocator<A>;
  else if constexpr (C == capability::size_of) return has_size_of<A>;
  else if constexpr (C == capability::movable_statistics) return has_movable_statistics<A>;
  else if constexpr (C == capability::reset_movable_peak) return has_reset_movable_peak<A>;
  else if constexpr (C == capability::is_live) return has_is_live<A>;
  else if constexpr (C == capability::serves) return request_screening_allocator<A>;
  else if constexpr (C == capability::planned_growth) return growth_planning_allocator<A>;
  else if constexpr (C == capability::current_tag) return tag_holding<A>;
  else if constexpr (C == capability::tagged_allocate) return has_tagged_allocate<A>;
  else if constexpr (C == capability::offload) return offloading_allocator<A>;
  else if constexpr (C == capability::offload_all) return has_offload_all<A>;
  else if constexpr (C == capability::tag_figures) return tag_reporting_allocator<A>;
  else if constexpr (C == capability::detaching_release) return detaching_release_allocator<A>;
  else if constexpr (C == capability::graph_pools) return graph_pooling_allocator<A, Stream>;
  else if constexpr (C == capability::try_free_handle) return has_try_deallocate_handle<A>;
  else if constexpr (C == capability::free_misuse) return free_screening_allocator<A>;
  else static_assert(no_such_capability<A>, "capability without a test in has_capability");
}

// ---- frees that say whether the part below accepted them ---------------------------------------

/// What became of a free passed to a part.
enum class free_outcome : unsigned char {
  accepted,   ///< the part freed a live block (it checks its frees)
  refused,    ///< the part refused it as misuse and changed nothing
  unchecked,  ///< the part cannot tell (no `try_deallocate`): it was passed on and trusted
};

/// Frees `b` in `part`, through `try_deallocate` when the part has it.
template <class Part>
free_outcome free_in(Part& part, block b) noexcept {
  if constexpr (checked_deallocating_allocator<Part>) {
    return part.try_deallocate(b) ? free_outcome::accepted : free_outcome::refused;
  } else {
    part.deallocate(b);
    return free_outcome::unchecked;
  }
}
template <class Part, class Stream>
free_outcome free_in(Part& part, block b, Stream stream) noexcept {
  if constexpr (checked_stream_deallocating_allocator<Part, Stream>) {
    return part.try_deallocate(b, stream) ? free_outcome::accepted : free_outcome::refused;
  } else {
    part.deallocate(b, stream);
    return free_outcome::unchecked;
  }
}

// ---- queries ------------------------------------------------------------------------------------

/// Passes on the capabilities that neither allocate nor free, each through `Derived::guarded`.
/// `Derived` provides `inner()`; it may define `guarded(f)` (and a const one) to run `f(inner)`
/// under a guard, and befriend this class if that hook is private.
template <class Derived, class Inner>
class forwards_queries {
 public:
  bool owns(block b) const noexcept
    requires owning_allocator<Inner>
  {
    return call([&](const auto& in) { return in.owns(b); });
  }
  misuse free_misuse(block b) const noexcept
    requires free_screening_allocator<Inner>
  {
    return call([&](const auto& in) { return in.free_misuse(b); });
  }
  void release() noexcept
    requires releasing_allocator<Inner>
  {
    call([](auto& in) { in.release(); });
  }
  /// Through the guard too: a lock around it is held while the segments leave the books, not
  /// while the caller gives them back.
  bool release_detached(detached_segments& out) noexcept
    requires detaching_release_allocator<Inner>
  {
    return call([&](auto& in) { return in.release_detached(out); });
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<Inner>
  {
    return call([](const auto& in) { return static_cast<std::size_t>(in.reserved_bytes()); });
  }
  allocator_counters counters() const noexcept
    requires counting_allocator<Inner>
  {
    return call([](const auto& in) { return in.counters(); });
  }
  template <class F>
    requires introspectable_allocator<Inner>
  void for_each_block(F&& visit) const {
    call([&](const auto& in) { in.for_each_block(visit); });
  }
  template <class Stream>
    requires use_recording_allocator<Inner, Stream>
  void record_use(block b, Stream stream) {
    call([&](auto& in) { in.record_use(b, stream); });
  }
  // Graph pools: every part (every shard) routes the capture; true when one could.
  template <class Stream>
    requires graph_pooling_allocator<Inner, Stream>
  bool begin_allocate_to_pool(graph_pool& pool, Stream stream) noexcept {
    return call([&](auto& in) { return in.begin_allocate_to_pool(pool, stream) ? 1u : 0u; }) != 0;
  }
  void end_allocate_to_pool(graph_pool& pool) noexcept
    requires requires(Inner& in, graph_pool& p) { in.end_allocate_to_pool(p); }
  {
    call([&](auto& in) { in.end_allocate_to_pool(pool); });
  }
  void release_pool(graph_pool& pool) noexcept
    requires requires(Inner& in, graph_pool& p) { in.release_pool(p); }
  {
    call([&](auto& in) { in.release_pool(pool); });
  }
  graph_pool_figures pool_figures() const noexcept
    requires requires(const Inner& in) { in.pool_figures(); }
  {
    return call([](const auto& in) { return in.pool_figures(); });
  }
  std::size_t bytes_in_use() const noexcept
    requires reports_bytes_in_use<Inner>
  {
    return call([](const auto& in) { return static_cast<std::size_t>(in.bytes_in_use()); });
  }
  std::size_t requested_bytes() const noexcept
    requires reports_requested_bytes<Inner>
  {
    return call([](const auto& in) { return static_cast<std::size_t>(in.requested_bytes()); });
  }
  std::size_t bytes_limit() const noexcept
    requires reports_bytes_limit<Inner>
  {
    return call([](const auto& in) { return static_cast<std::size_t>(in.bytes_limit()); });
  }
  std::size_t bytes_reservable_limit() const noexcept
    requires reports_bytes_reservable_limit<Inner>
  {
    return call([](const auto& in) { return static_cast<std::size_t>(in.bytes_reservable_limit()); });
  }
  bool serves(std::size_t bytes, std::size_t alignment) const noexcept
    requires request_screening_allocator<Inner>
  {
    return call([&](const auto& in) { return static_cast<bool>(in.serves(bytes, alignment)); });
  }
  /// What `stats<>` reads of everything below (`detail::figures_of`), taken through the guard:
  /// not a capability (every part has figures), so every wrapper has it.
  detail::figures figures_below(const figures_request& request) const {
    return call([&](const auto& in) { return figures_of(in, request); });
  }
  /// Restarts the movable peaks below (`detail::reset_movable_peaks`), through the guard: what
  /// `stats<>::reset_peak()` does to the figures above, so every wrapper has it too.
  void reset_movable_peaks_below() noexcept {
    call([](auto& in) { reset_movable_peaks(in); });
  }

  // Tags and offload (docs/design.md#offload): setting the current tag and offloading neither
  // allocate nor free a block, so they are passed on here, through the guard, with the queries.
  tag current_tag() const noexcept
    requires tag_holding<Inner>
  {
    return call([](const auto& in) { return in.current_tag(); });
  }
  void set_current_tag(tag t) noexcept
    requires tag_holding<Inner>
  {
    call([&](auto& in) { in.set_current_tag(t); });
  }
  offload_status offload(tag t) noexcept
    requires offloading_allocator<Inner>
  {
    return call([&](auto& in) { return in.offload(t); });
  }
  offload_status discard(tag t) noexcept
    requires offloading_allocator<Inner>
  {
    return call([&](auto& in) { return in.discard(t); });
  }
  offload_status restore(tag t) noexcept
    requires offloading_allocator<Inner>
  {
    return call([&](auto& in) { return in.restore(t); });
  }
  tag_state state(tag t) const noexcept
    requires offloading_allocator<Inner>
  {
    return call([&](const auto& in) { return in.state(t); });
  }
  /// A copy, taken under the guard.
  offload_statistics offload_stats() const noexcept
    requires offloading_allocator<Inner>
  {
    return call([](const auto& in) { return offload_statistics(in.offload_stats()); });
  }
  offload_status offload_all() noexcept
    requires has_offload_all<Inner>
  {
    return call([](auto& in) { return in.offload_all(); });
  }
  std::size_t host_bytes(tag t) const noexcept
    requires tag_reporting_allocator<Inner>
  {
    return call([&](const auto& in) { return static_cast<std::size_t>(in.host_bytes(t)); });
  }
  std::size_t mapped_bytes(tag t) const noexcept
    requires tag_reporting_allocator<Inner>
  {
    return call([&](const auto& in) { return static_cast<std::size_t>(in.mapped_bytes(t)); });
  }
  std::size_t live_bytes(tag t) const noexcept
    requires tag_reporting_allocator<Inner>
  {
    return call([&](const auto& in) { return static_cast<std::size_t>(in.live_bytes(t)); });
  }

 protected:
  /// The guard hook's default: no guard.
  template <class F>
  decltype(auto) guarded(F&& f) {
    return std::forward<F>(f)(static_cast<Derived&>(*this).inner());
  }
  template <class F>
  decltype(auto) guarded(F&& f) const {
    return std::forward<F>(f)(static_cast<const Derived&>(*this).inner());
  }

  template <class F>
  decltype(auto) call(F&& f) {
    return static_cast<Derived&>(*this).guarded(std::forward<F>(f));
  }
  template <class F>
  decltype(auto) call(F&& f) const {
    return static_cast<const Derived&>(*this).guarded(std::forward<F>(f));
  }
};

// ---- everything, for wrappers that change nothing (synchronized, ref, sharded) -------------------

/// Every capability of `Inner`, allocating calls included, each through `Derived::guarded`.
template <class Derived, class Inner>
class forwards_everything : public forwards_queries<Derived, Inner> {
  using base = forwards_queries<Derived, Inner>;
  using base::call;

 public:
  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return call([&](auto& in) { return in.allocate(bytes, alignment); });
  }
  block allocate(std::size_t bytes, std::size_t alignment, tag t) noexcept
    requires has_tagged_allocate<Inner>
  {
    return call([&](auto& in) { return in.allocate(bytes, alignment, t); });
  }
  void deallocate(block b) noexcept {
    call([&](auto& in) { in.deallocate(b); });
  }
  bool try_deallocate(block b) noexcept
    requires checked_deallocating_allocator<Inner>
  {
    return call([&](auto& in) { return in.try_deallocate(b); });
  }
  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_keeping_allocator<Inner>
  {
    return call([&](auto& in) { return in.allocate_keeping_cache(bytes, alignment); });
  }
  block allocate_cached(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_serving_allocator<Inner>
  {
    return call([&](auto& in) { return in.allocate_cached(bytes, alignment); });
  }
  block allocate_or_plan(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept
    requires growth_planning_allocator<Inner>
  {
    return call([&](auto& in) { return in.allocate_or_plan(bytes, alignment, plan); });
  }
  block allocate_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept
    requires growth_planning_allocator<Inner>
  {
    return call([&](auto& in) { return in.allocate_planned(plan, bytes, alignment); });
  }
  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    return call([&](auto& in) { return in.allocate(bytes, alignment, stream); });
  }
  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  void deallocate(block b, Stream stream) noexcept {
    call([&](auto& in) { in.deallocate(b, stream); });
  }
  template <class Stream>
    requires checked_stream_deallocating_allocator<Inner, Stream>
  bool try_deallocate(block b, Stream stream) noexcept {
    return call([&](auto& in) { return in.try_deallocate(b, stream); });
  }

  // Movable blocks (docs/design.md#movable-memory).
  handle allocate_movable(std::size_t bytes) noexcept(noexcept(std::declval<Inner&>().allocate_movable(bytes)))
    requires movable_allocator<Inner>
  {
    return call([&](auto& in) { return in.allocate_movable(bytes); });
  }
  void* lock(handle h)
    requires movable_allocator<Inner>
  {
    return call([&](auto& in) { return in.lock(h); });
  }
  void unlock(handle h)
    requires movable_allocator<Inner>
  {
    call([&](auto& in) { in.unlock(h); });
  }
  void deallocate(handle h)
    requires movable_allocator<Inner>
  {
    call([&](auto& in) { in.deallocate(h); });
  }
  bool try_deallocate(handle h) noexcept
    requires has_try_deallocate_handle<Inner>
  {
    return call([&](auto& in) { return in.try_deallocate(h); });
  }
  std::size_t size_of(handle h) const
    requires has_size_of<Inner>
  {
    return call([&](const auto& in) { return static_cast<std::size_t>(in.size_of(h)); });
  }
  bool is_live(handle h) const noexcept
    requires has_is_live<Inner>
  {
    return call([&](const auto& in) { return static_cast<bool>(in.is_live(h)); });
  }
  auto movable_statistics() const noexcept
    requires has_movable_statistics<Inner>
  {
    return call([](const auto& in) { return in.movable_statistics(); });
  }
  void reset_movable_peak() noexcept
    requires has_reset_movable_peak<Inner>
  {
    call([](auto& in) { in.reset_movable_peak(); });
  }
};

// ---- decorators: the allocating calls through two hooks ------------------------------------------

/// Which call an allocation came through (a decorator may treat them differently: a failed
/// `allocate_keeping_cache` is not an out-of-memory yet, the caller retries).
enum class allocation_kind : unsigned char { plain, keeping_cache, stream };

/// The queries of `Inner`, plus every allocating call `Inner` has, each routed through the
/// decorator's hooks:
///
///   template <class Call, class GiveBack, class... Stream>
///   block on_allocate(std::size_t bytes, std::size_t alignment, Call call, GiveBack give_back,
///                     allocation_kind kind, Stream... stream) noexcept;
///       `call(n)` asks Inner for `n` bytes (`bytes`, or what the decorator makes of it) and
///       returns Inner's block; `give_back(b)` frees such a block again the same way (for a
///       decorator that cannot keep it); the hook may refuse before asking.
///       `stream` is the stream of a stream-ordered call (none otherwise).
///   template <class Call, class... Stream> bool on_free(block b, Call call, Stream... stream) noexcept;
///       `call(b)` passes the free of a block (`b`, or Inner's form of it) to Inner and returns a
///       `free_outcome`; the hook may refuse without calling; it returns whether it accepted.
///
/// Movable handles are not passed on here: a decorator that handles them declares them itself.
template <class Derived, class Inner>
class decorates : public forwards_queries<Derived, Inner> {
 public:
  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    Inner& in = self().inner();
    return self().on_allocate(
        bytes, alignment, [&](std::size_t n) { return in.allocate(n, alignment); }, [&](block b) { in.deallocate(b); },
        allocation_kind::plain);
  }
  /// A tagged allocation is counted as a plain one (a refused one, its tag offloaded, as a
  /// failure); a block of an offloaded tag stays counted until it is freed.
  block allocate(std::size_t bytes, std::size_t alignment, tag t) noexcept
    requires has_tagged_allocate<Inner>
  {
    Inner& in = self().inner();
    return self().on_allocate(
        bytes, alignment, [&](std::size_t n) { return in.allocate(n, alignment, t); },
        [&](block b) { in.deallocate(b); }, allocation_kind::plain);
  }
  void deallocate(block b) noexcept { (void)free_through(b); }
  bool try_deallocate(block b) noexcept
    requires checked_deallocating_allocator<Inner>
  {
    return free_through(b);
  }
  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_keeping_allocator<Inner>
  {
    Inner& in = self().inner();
    return self().on_allocate(
        bytes, alignment, [&](std::size_t n) { return in.allocate_keeping_cache(n, alignment); },
        [&](block b) { in.deallocate(b); }, allocation_kind::keeping_cache);
  }
  /// Counted as `allocate_keeping_cache` is: an empty block is not a failure yet.
  block allocate_cached(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_serving_allocator<Inner>
  {
    Inner& in = self().inner();
    return self().on_allocate(
        bytes, alignment, [&](std::size_t n) { return in.allocate_cached(n, alignment); },
        [&](block b) { in.deallocate(b); }, allocation_kind::keeping_cache);
  }
  /// The planning phase is, to the decorator, a call that may fail without being a failure yet
  /// (`keeping_cache`): an empty block is followed by `allocate_planned` or `allocate`, which is
  /// counted.
  block allocate_or_plan(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept
    requires growth_planning_allocator<Inner>
  {
    Inner& in = self().inner();
    return self().on_allocate(
        bytes, alignment, [&](std::size_t n) { return in.allocate_or_plan(n, alignment, plan); },
        [&](block b) { in.deallocate(b); }, allocation_kind::keeping_cache);
  }
  block allocate_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept
    requires growth_planning_allocator<Inner>
  {
    Inner& in = self().inner();
    return self().on_allocate(
        bytes, alignment, [&](std::size_t n) { return in.allocate_planned(plan, n, alignment); },
        [&](block b) { in.deallocate(b); }, allocation_kind::plain);
  }
  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    Inner& in = self().inner();
    return self().on_allocate(
        bytes, alignment, [&](std::size_t n) { return in.allocate(n, alignment, stream); },
        [&](block b) { in.deallocate(b, stream); }, allocation_kind::stream, stream);
  }
  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  void deallocate(block b, Stream stream) noexcept {
    (void)free_through(b, stream);
  }
  template <class Stream>
    requires checked_stream_deallocating_allocator<Inner, Stream>
  bool try_deallocate(block b, Stream stream) noexcept {
    return free_through(b, stream);
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  bool free_through(block b) noexcept {
    Inner& in = self().inner();
    return self().on_free(b, [&](block inner_block) { return free_in(in, inner_block); });
  }
  template <class Stream>
  bool free_through(block b, Stream stream) noexcept {
    Inner& in = self().inner();
    return self().on_free(b, [&](block inner_block) { return free_in(in, inner_block, stream); }, stream);
  }
};

// ---- tags over several parts (two_parts, sharded) ------------------------------------------------

/// `offload`, `discard`, `restore`, `state` of an allocator made of `n` parts that each hold some
/// blocks of every tag (shards, or the two parts of a composite): the tag is one thing to the
/// caller, so each call reaches every part. `at(i, f)` runs `f(part i)` (under the part's guard)
/// and returns what it returns.
///
/// - `state(t)`: `resident` when every part is; else the first part's that is not (parts differ
///   only after a failed undo, below; `restore` then completes the tag).
/// - `offload(t)`, `discard(t)`: `not_resident`, nothing changed, unless every part is resident.
///   Then each part in turn; when part k fails, parts 0..k-1 are restored (an offload's content
///   comes back from the host copy; a discard's parts are mapped again, their content then
///   unspecified as after any discard) and part k's status is returned. The undo maps what was
///   unmapped a moment ago; should another user of a shared backend have taken that memory
///   meanwhile, the part stays offloaded (its content safe on the host), `state` says so, and
///   `restore(t)` brings it back.
/// - `restore(t)`: `already_resident` when every part is; else each part that is not, in turn;
///   the first failure is returned and the parts restored before it stay resident (restoring
///   again completes the rest: nothing is lost, nothing half-mapped within a part).
template <class At>
tag_state tag_state_of_parts(std::size_t n, At at, tag t) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const tag_state s = at(i, [&](const auto& part) { return part.state(t); });
    if (s != tag_state::resident) return s;
  }
  return tag_state::resident;
}
template <class At>
offload_status offload_parts(std::size_t n, At at, tag t, bool copy) noexcept {
  if (tag_state_of_parts(n, at, t) != tag_state::resident) return offload_status::not_resident;
  for (std::size_t i = 0; i < n; ++i) {
    const offload_status s = at(i, [&](auto& part) { return copy ? part.offload(t) : part.discard(t); });
    if (s == offload_status::done) continue;
    for (std::size_t j = 0; j < i; ++j) (void)at(j, [&](auto& part) { return part.restore(t); });
    return s;
  }
  return offload_status::done;
}
template <class At>
offload_status restore_parts(std::size_t n, At at, tag t) noexcept {
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) {
    if (at(i, [&](const auto& part) { return part.state(t); }) == tag_state::resident) continue;
    any = true;
    const offload_status s = at(i, [&](auto& part) { return part.restore(t); });
    if (s != offload_status::done) return s;
  }
  return any ? offload_status::done : offload_status::already_resident;
}
/// `offload_all()` of every part in turn, stopping at the first failure (as one arena's: the tags
/// offloaded before stay offloaded). Each part counts its own full reclaim.
template <class At>
offload_status offload_all_parts(std::size_t n, At at) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const offload_status s = at(i, [](auto& part) { return part.offload_all(); });
    if (s != offload_status::done) return s;
  }
  return offload_status::done;
}

// ---- two parts with a routing hook (segregator, fallback) ----------------------------------------

/// The capabilities of a composite of two parts: each exists when both parts have it. Queries
/// combine the parts (owns: either; release: both; reserved bytes, counters, bytes in use,
/// requested bytes: sums; blocks: `First`'s, then `Second`'s). Allocating calls go through the
/// composite's routing hooks:
///
///   template <class Call> block route_allocation(std::size_t bytes, std::size_t alignment, Call call);
///       `call(part)` asks one part; the hook picks which, and in what order.
///   template <class Call> bool route_free(block b, Call call);
///       `call(part)` frees in one part and returns a `free_outcome`; the hook picks the part and
///       returns whether the free was accepted (an `unchecked` free counts as accepted).
///   template <class Self, class Call> static decltype(auto) route_to_holder(Self& self, block b, Call call);
///       `call(part)` on the part of `self` (const or not) that holds `b`: for `record_use` and
///       `free_misuse`.
///   block route_planning(bytes, alignment, growth_plan& plan);
///   block route_planned(growth_plan& plan, bytes, alignment);
///       the two phases of `growth_planning_allocator`; the second must reach the part that
///       made the plan.
///
/// Limits (`bytes_limit`, `bytes_reservable_limit`) and movable handles are not combined: what
/// the limit of two parts is depends on the composite, and neither composite routes handles.
///
/// Tags (docs/design.md#offload) follow the same rule, each capability when both parts have it: the
/// current tag is set in both parts (read from the first); a tagged allocation goes through
/// `route_allocation` like a plain one; `offload`, `discard`, `restore`, `state`, `offload_all`
/// reach both parts as `offload_parts` and its neighbours above say; `offload_stats` and the
/// per-tag figures are sums. A request of a tag that is not resident (`state`) fails, as in one
/// part, also one the parts' routing would send to a part that holds the tag resident (parts
/// apart after a failed undo, or a restore that stopped halfway; found by the fuzzer): it is
/// handed to a part that does not hold the tag resident, which refuses it and counts it. A
/// composite of a tagging part and a part without tags has no tags: the second part's blocks
/// could not be offloaded with their tag, so the composite could not keep the promise. A
/// composite that routes tags itself (tag 0 to a pool, other tags to the arena:
/// `virtual_allocator`) declares them itself.
/// `Derived` provides `first()` and `second()`.
template <class Derived, class First, class Second>
class two_parts {
 public:
  bool owns(block b) const noexcept
    requires owning_allocator<First> && owning_allocator<Second>
  {
    return first().owns(b) || second().owns(b);
  }
  void release() noexcept
    requires releasing_allocator<First> && releasing_allocator<Second>
  {
    first().release();
    second().release();
  }
  /// The first part's free segments, then (room left) the second's.
  bool release_detached(detached_segments& out) noexcept
    requires detaching_release_allocator<First> && detaching_release_allocator<Second>
  {
    return first().release_detached(out) && second().release_detached(out);
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<First> && reserving_allocator<Second>
  {
    return first().reserved_bytes() + second().reserved_bytes();
  }
  allocator_counters counters() const noexcept
    requires counting_allocator<First> && counting_allocator<Second>
  {
    return first().counters() + second().counters();
  }
  std::size_t bytes_in_use() const noexcept
    requires reports_bytes_in_use<First> && reports_bytes_in_use<Second>
  {
    return first().bytes_in_use() + second().bytes_in_use();
  }
  std::size_t requested_bytes() const noexcept
    requires reports_requested_bytes<First> && reports_requested_bytes<Second>
  {
    return first().requested_bytes() + second().requested_bytes();
  }
  template <class F>
    requires introspectable_allocator<First> && introspectable_allocator<Second>
  void for_each_block(F&& visit) const {
    first().for_each_block(visit);
    second().for_each_block(visit);
  }

  tag current_tag() const noexcept
    requires tag_holding<First> && tag_holding<Second>
  {
    return first().current_tag();
  }
  void set_current_tag(tag t) noexcept
    requires tag_holding<First> && tag_holding<Second>
  {
    first().set_current_tag(t);
    second().set_current_tag(t);
  }
  offload_status offload(tag t) noexcept
    requires offloading_allocator<First> && offloading_allocator<Second>
  {
    return offload_parts(2, each_part(), t, true);
  }
  offload_status discard(tag t) noexcept
    requires offloading_allocator<First> && offloading_allocator<Second>
  {
    return offload_parts(2, each_part(), t, false);
  }
  offload_status restore(tag t) noexcept
    requires offloading_allocator<First> && offloading_allocator<Second>
  {
    return restore_parts(2, each_part(), t);
  }
  tag_state state(tag t) const noexcept
    requires offloading_allocator<First> && offloading_allocator<Second>
  {
    return tag_state_of_parts(2, each_part(), t);
  }
  offload_statistics offload_stats() const noexcept
    requires offloading_allocator<First> && offloading_allocator<Second>
  {
    offload_statistics sum(first().offload_stats());
    sum += second().offload_stats();
    return sum;
  }
  offload_status offload_all() noexcept
    requires has_offload_all<First> && has_offload_all<Second>
  {
    return offload_all_parts(2, each_part());
  }
  std::size_t host_bytes(tag t) const noexcept
    requires tag_reporting_allocator<First> && tag_reporting_allocator<Second>
  {
    return first().host_bytes(t) + second().host_bytes(t);
  }
  std::size_t mapped_bytes(tag t) const noexcept
    requires tag_reporting_allocator<First> && tag_reporting_allocator<Second>
  {
    return first().mapped_bytes(t) + second().mapped_bytes(t);
  }
  std::size_t live_bytes(tag t) const noexcept
    requires tag_reporting_allocator<First> && tag_reporting_allocator<Second>
  {
    return first().live_bytes(t) + second().live_bytes(t);
  }

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    const auto call = [&](auto& part) { return part.allocate(bytes, alignment); };
    if (current_tag_refused()) [[unlikely]]
      return refused_with_current_tag(call);
    return self().route_allocation(bytes, alignment, call);
  }
  block allocate(std::size_t bytes, std::size_t alignment, tag t) noexcept
    requires has_tagged_allocate<First> && has_tagged_allocate<Second>
  {
    const auto call = [&](auto& part) { return part.allocate(bytes, alignment, t); };
    if (tag_refused(t)) [[unlikely]]
      return refused_by_a_part(t, call);
    return self().route_allocation(bytes, alignment, call);
  }
  void deallocate(block b) noexcept {
    (void)self().route_free(b, [&](auto& part) { return free_in(part, b); });
  }
  bool try_deallocate(block b) noexcept
    requires checked_deallocating_allocator<First> && checked_deallocating_allocator<Second>
  {
    return self().route_free(b, [&](auto& part) { return free_in(part, b); });
  }
  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_keeping_allocator<First> && cache_keeping_allocator<Second>
  {
    const auto call = [&](auto& part) { return part.allocate_keeping_cache(bytes, alignment); };
    if (current_tag_refused()) [[unlikely]]
      return refused_with_current_tag(call);
    return self().route_allocation(bytes, alignment, call);
  }
  block allocate_cached(std::size_t bytes, std::size_t alignment) noexcept
    requires cache_serving_allocator<First> && cache_serving_allocator<Second>
  {
    const auto call = [&](auto& part) { return part.allocate_cached(bytes, alignment); };
    if (current_tag_refused()) [[unlikely]]
      return refused_with_current_tag(call);
    return self().route_allocation(bytes, alignment, call);
  }
  block allocate_or_plan(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept
    requires growth_planning_allocator<First> && growth_planning_allocator<Second>
  {
    return self().route_planning(bytes, alignment, plan);
  }
  block allocate_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept
    requires growth_planning_allocator<First> && growth_planning_allocator<Second>
  {
    return self().route_planned(plan, bytes, alignment);
  }
  template <class Stream>
    requires stream_ordered_allocator<First, Stream> && stream_ordered_allocator<Second, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    const auto call = [&](auto& part) { return part.allocate(bytes, alignment, stream); };
    if (current_tag_refused()) [[unlikely]]
      return refused_with_current_tag(call);
    return self().route_allocation(bytes, alignment, call);
  }
  template <class Stream>
    requires stream_ordered_allocator<First, Stream> && stream_ordered_allocator<Second, Stream>
  void deallocate(block b, Stream stream) noexcept {
    (void)self().route_free(b, [&](auto& part) { return free_in(part, b, stream); });
  }
  template <class Stream>
    requires checked_stream_deallocating_allocator<First, Stream> &&
             checked_stream_deallocating_allocator<Second, Stream>
  bool try_deallocate(block b, Stream stream) noexcept {
    return self().route_free(b, [&](auto& part) { return free_in(part, b, stream); });
  }
  template <class Stream>
    requires use_recording_allocator<First, Stream> && use_recording_allocator<Second, Stream>
  void record_use(block b, Stream stream) {
    Derived::route_to_holder(self(), b, [&](auto& part) { part.record_use(b, stream); });
  }
  misuse free_misuse(block b) const noexcept
    requires free_screening_allocator<First> && free_screening_allocator<Second>
  {
    return Derived::route_to_holder(static_cast<const Derived&>(*this), b,
                                    [&](const auto& part) { return part.free_misuse(b); });
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  const First& first() const noexcept { return static_cast<const Derived&>(*this).first_part(); }
  const Second& second() const noexcept { return static_cast<const Derived&>(*this).second_part(); }
  First& first() noexcept { return static_cast<Derived&>(*this).first_part(); }
  Second& second() noexcept { return static_cast<Derived&>(*this).second_part(); }

 protected:
  /// Whether a request of tag `t` must fail although a part would serve it: a tag that is not
  /// resident takes nothing, as in one part, also where the parts hold it apart (one resident, the
  /// other not: after a failed undo, or a restore that stopped halfway) and the request would
  /// reach the resident one. Two reads of a small table when tags are in use, one compare each
  /// when not: each part is asked directly, cheaper than `state`'s loop over the parts on a path
  /// every allocation takes.
  bool tag_refused(tag t) const noexcept {
    if constexpr (offloading_allocator<First> && offloading_allocator<Second>) {
      return first().state(t) != tag_state::resident || second().state(t) != tag_state::resident;
    } else {
      (void)t;
      return false;
    }
  }
  bool current_tag_refused() const noexcept {
    if constexpr (tag_holding<First> && tag_holding<Second>) {
      return tag_refused(current_tag());
    } else {
      return false;
    }
  }
  /// A request `tag_refused` turned down is handed to a part that does not hold `t` resident: it
  /// refuses it and counts it (`num_refused_allocations`), as one part would.
  template <class Call>
  block refused_by_a_part(tag t, Call call) noexcept {
    if constexpr (offloading_allocator<First> && offloading_allocator<Second>) {
      return first().state(t) != tag_state::resident ? call(first()) : call(second());
    } else {
      (void)t;
      (void)call;
      return {};
    }
  }
  template <class Call>
  block refused_with_current_tag(Call call) noexcept {
    if constexpr (tag_holding<First> && tag_holding<Second>) {
      return refused_by_a_part(current_tag(), call);
    } else {
      (void)call;
      return {};
    }
  }

 private:
  /// The parts as `offload_parts` visits them: `at(0, f)` is `f(first())`, `at(1, f)` `f(second())`.
  auto each_part() noexcept {
    return [this](std::size_t i, auto&& f) { return i == 0 ? f(first()) : f(second()); };
  }
  auto each_part() const noexcept {
    return [this](std::size_t i, auto&& f) { return i == 0 ? f(first()) : f(second()); };
  }
};

// ---- growth outside a lock ------------------------------------------------------------------------

/// The rest of a planned growth, `plan` made under `mutex` (now not held): the upstream call
/// (and, when it fails, the release-and-retry, detaching under the lock), then adoption and
/// allocation under the lock, then the give-back of what was not adopted.
template <class Mutex, class Inner>
[[gnu::noinline]] block finish_growth_unlocked(Mutex& mutex, Inner& inner, growth_plan& plan, std::size_t bytes,
                                               std::size_t alignment) noexcept {
  plan.fetch([&](auto&& f) {
    std::lock_guard lock(mutex);
    return f();
  });
  block b;
  {
    std::lock_guard lock(mutex);
    b = inner.allocate_planned(plan, bytes, alignment);
  }
  plan.give_back_unused();
  return b;
}

/// `inner.allocate(bytes, alignment)` with `mutex` held, except for the upstream call of a growth
/// when `Inner` can plan one (`growth_planning_allocator`): that call, and giving back a segment
/// that was not adopted, run without the lock. `Mutex` is locked and unlocked as a
/// `std::lock_guard` would. Inlined into the caller, the rest (`finish_growth_unlocked`) not, so
/// that the common path pays no call frame.
template <class Mutex, class Inner>
[[gnu::always_inline]] inline block allocate_growing_unlocked(Mutex& mutex, Inner& inner, std::size_t bytes,
                                                              std::size_t alignment) noexcept {
  if constexpr (growth_planning_allocator<Inner>) {
    growth_plan plan;
    {
      std::lock_guard lock(mutex);
      if (const block b = inner.allocate_or_plan(bytes, alignment, plan)) return b;
      if (!plan) [[unlikely]]
        return inner.allocate(bytes, alignment);
    }
    return finish_growth_unlocked(mutex, inner, plan, bytes, alignment);
  } else {
    std::lock_guard lock(mutex);
    return inner.allocate(bytes, alignment);
  }
}

}  // namespace alloy::detail
