// SPDX-License-Identifier: Apache-2.0
// alloy/detail/figures.hpp: what a composition says about itself for `stats<>`, as typed data
// (statistics flow one way).
//
// `figures_of(part)` answers for a part and everything below it. Each field comes from the first
// part on each path below that reports it (its own capability: `reserved_bytes()`, `counters()`,
// `movable_statistics()`, ...), added up over the paths (`figures::operator+=`: sums, and the
// smallest of the limits). A wrapper answers through its guard (`forwards_queries::figures_below`:
// `synchronized` locks, `sharded` adds up its shards under their locks), so `stats<>` asks only
// its inner part and never reads below a lock without it.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <type_traits>

#include <alloy/concepts.hpp>
#include <alloy/detail/walk.hpp>
#include <alloy/movable/counters.hpp>
#include <alloy/tag.hpp>

namespace alloy::detail {

/// A part that routes by size the way `segregator<Threshold, Small, Large>` does (detected by
/// shape, so any such policy gives the statistics its small and large pools).
template <class A>
concept segregator_shaped = requires(A& a) {
  a.small();
  a.large();
  { A::threshold } -> std::convertible_to<std::size_t>;
};

struct segregator_match {
  template <class A>
  static constexpr bool test = segregator_shaped<A>;
};

/// A part that says the largest request it splits blocks for: `max_split_size()`, or
/// `get_options().max_split_size` (`best_fit_arena`).
template <class A>
concept reports_max_split_size = requires(const A& a) {
  { a.max_split_size() } -> std::convertible_to<std::size_t>;
} || requires(const A& a) {
  { a.get_options().max_split_size } -> std::convertible_to<std::size_t>;
};

template <class A>
std::size_t max_split_of(const A& a) noexcept {
  if constexpr (requires { a.max_split_size(); }) {
    return a.max_split_size();
  } else {
    return a.get_options().max_split_size;
  }
}

/// A part that offloads tagged memory (`virtual_arena`, `virtual_allocator`).
template <class A>
concept reports_offload_stats = requires(const A& a) { a.offload_stats(); };

/// A stream-ordered part (`stream_ordered<>`): it knows how often the host waited for all streams.
template <class A>
concept reports_stream_order = requires(const A& a) { a.order_counters().all_stream_synchronizations; };

struct figures_request;
struct figures;
/// A wrapper that answers for everything below it, through its guard (`forwards_queries`).
template <class A>
concept answers_figures_below = requires(const A& a, const figures_request& request) {
  { a.figures_below(request) } -> std::same_as<figures>;
};

/// What `figures_of` is asked for: the free pieces need a walk over the blocks (query time only),
/// and the segments above `max_split` are counted there.
struct figures_request {
  bool blocks = false;
  std::size_t max_split = std::numeric_limits<std::size_t>::max();
};

/// Free pieces, from introspection (`for_each_block`).
struct block_figures {
  std::int64_t inactive_splits = 0;       ///< free pieces of segments that also hold live blocks
  std::int64_t inactive_split_bytes = 0;  ///< their bytes
  std::int64_t oversize_segments = 0;     ///< segments above the request's `max_split`
  bool known = false;

  block_figures& operator+=(const block_figures& o) noexcept {
    inactive_splits += o.inactive_splits;
    inactive_split_bytes += o.inactive_split_bytes;
    oversize_segments += o.oversize_segments;
    known = known || o.known;
    return *this;
  }
};

/// The figures of one pool (one side of a segregator).
struct pool_figures {
  std::size_t reserved = 0;
  allocator_counters counters{};
  block_figures blocks{};
  bool knows_reserved = false;
  bool knows_counters = false;

  pool_figures& operator+=(const pool_figures& o) noexcept {
    reserved += o.reserved;
    counters += o.counters;
    blocks += o.blocks;
    knows_reserved = knows_reserved || o.knows_reserved;
    knows_counters = knows_counters || o.knows_counters;
    return *this;
  }
};

/// The smallest limit that is set (0 and SIZE_MAX mean none); 0 when none is.
inline std::size_t smallest_limit(std::size_t a, std::size_t b) noexcept {
  auto set = [](std::size_t x) { return x != 0 && x != std::numeric_limits<std::size_t>::max(); };
  if (!set(a)) return set(b) ? b : 0;
  if (!set(b)) return a;
  return std::min(a, b);
}

/// Everything `stats<>` reads from the composition below it. A `known` flag is false when no
/// part reports that field (the figure is then zero, as `alloy::statistics` says).
struct figures {
  pool_figures all{};                           ///< reserved bytes, upstream counters, free pieces
  movable_counters movable{};                   ///< `movable_statistics()` of the movable parts
  offload_statistics offload{};                 ///< `offload_stats()` of the offloading parts
  std::size_t bytes_limit = 0;                  ///< smallest `bytes_limit()`; 0 = none
  std::size_t reservable_limit = 0;             ///< smallest `bytes_reservable_limit()`; 0 = none
  std::size_t max_split = 0;                    ///< smallest max split size; 0 = none
  std::size_t all_stream_synchronizations = 0;  ///< of the stream-ordered parts
  std::array<pool_figures, 2> pools{};          ///< small and large pool of the first segregator
  bool knows_movable = false;
  bool knows_offload = false;
  bool has_pools = false;

  /// Another path's figures: counters add up, limits keep the smallest; the pools are those of
  /// the first path that has them.
  figures& operator+=(const figures& o) noexcept {
    all += o.all;
    movable += o.movable;
    offload += o.offload;
    bytes_limit = smallest_limit(bytes_limit, o.bytes_limit);
    reservable_limit = smallest_limit(reservable_limit, o.reservable_limit);
    max_split = smallest_limit(max_split, o.max_split);
    all_stream_synchronizations += o.all_stream_synchronizations;
    if (!has_pools && o.has_pools) pools = o.pools, has_pools = true;
    knows_movable = knows_movable || o.knows_movable;
    knows_offload = knows_offload || o.knows_offload;
    return *this;
  }
};

/// Free pieces of segments that also hold blocks in use (PyTorch's "inactive split"), and the
/// segments larger than `max_split` (PyTorch's "oversize segments").
template <introspectable_allocator A>
block_figures measure_blocks(const A& a, std::size_t max_split) {
  block_figures out;
  out.known = true;
  const void* segment = nullptr;
  std::int64_t seg_count = 0, seg_bytes = 0;
  bool seg_used = false;
  auto close = [&] {
    if (seg_used) out.inactive_splits += seg_count, out.inactive_split_bytes += seg_bytes;
    seg_count = seg_bytes = 0;
    seg_used = false;
  };
  a.for_each_block([&](const block_info& info) {
    if (info.segment != segment) {
      close();
      segment = info.segment;
      if (info.segment_size > max_split) ++out.oversize_segments;
    }
    if (info.state == block_state::free) {
      ++seg_count;
      seg_bytes += static_cast<std::int64_t>(info.size);
    } else if (info.state != block_state::unmapped) {  // addresses without memory hold nothing
      seg_used = true;
    }
  });
  close();
  return out;
}

/// The figures of `a` and everything below it. A part that answers for what is below it
/// (`figures_below(request)`: the wrappers, through their guard) is asked; any other composite adds up
/// its parts' figures. Then the part's own capabilities take precedence over what is below it:
/// the first part on each path that reports a figure answers for that path. A segregator-shaped
/// part gives its two sides as the pools.
template <class A>
figures figures_of(const A& a, const figures_request& request = {}) {
  figures f;
  if constexpr (answers_figures_below<A>) {
    f = a.figures_below(request);
  } else if constexpr (segregator_shaped<A>) {
    // Its two sides are its pools; its blocks are theirs (small's, then large's), walked once.
    const figures small = figures_of(a.small(), request);
    const figures large = figures_of(a.large(), request);
    f = small;
    f += large;
    f.pools = {small.all, large.all};
    f.has_pools = true;
    if (!(small.all.blocks.known && large.all.blocks.known)) f.all.blocks = {};
  } else {
    for_each_part_below<all_parts>(a, [&](const auto& part) { f += figures_of(part, request); });
  }
  if constexpr (reserving_allocator<A>) {
    f.all.reserved = static_cast<std::size_t>(a.reserved_bytes());
    f.all.knows_reserved = true;
  }
  if constexpr (counting_allocator<A>) {
    f.all.counters = a.counters();
    f.all.knows_counters = true;
  }
  // A wrapper's blocks and a segregator's come from below (the same blocks, walked once).
  if constexpr (introspectable_allocator<A> && !segregator_shaped<A> && !answers_figures_below<A>) {
    if (request.blocks) f.all.blocks = measure_blocks(a, request.max_split);
  }
  if constexpr (has_movable_statistics<A>) {
    f.movable = a.movable_statistics();
    f.knows_movable = true;
  }
  if constexpr (reports_offload_stats<A>) {
    f.offload = offload_statistics(a.offload_stats());
    f.knows_offload = true;
  }
  if constexpr (reports_bytes_limit<A>) f.bytes_limit = smallest_limit(a.bytes_limit(), 0);
  if constexpr (reports_bytes_reservable_limit<A>) f.reservable_limit = smallest_limit(a.bytes_reservable_limit(), 0);
  if constexpr (reports_max_split_size<A>) f.max_split = smallest_limit(max_split_of(a), 0);
  if constexpr (reports_stream_order<A>) f.all_stream_synchronizations = a.order_counters().all_stream_synchronizations;
  return f;
}

/// Restarts the movable peak that `figures_of(a).movable` reads: that of the first part on each
/// path below `a` (itself included) with `reset_movable_peak()`. A wrapper is reached through its
/// guard (`reset_movable_peaks_below()`), any other composite through its parts, so
/// `stats<>::reset_peak()` reaches a reclaimer below a `segregator` or a `synchronized` too.
template <class A>
void reset_movable_peaks(A& a) noexcept {
  if constexpr (has_reset_movable_peak<A>) {
    a.reset_movable_peak();
  } else if constexpr (requires { a.reset_movable_peaks_below(); }) {
    a.reset_movable_peaks_below();
  } else {
    for_each_part_below<all_parts>(a, [](auto& part) { reset_movable_peaks(part); });
  }
}

/// The trait of `reports_max_split_size`, for the type walks (`matches`).
template <class A>
struct has_max_split_size : std::bool_constant<reports_max_split_size<A>> {};

/// Whether some part of `A` (itself included) satisfies the trait `Pred` (types only).
template <template <class> class Pred>
struct matches {
  template <class A>
  static constexpr bool test = Pred<A>::value;
};

}  // namespace alloy::detail
