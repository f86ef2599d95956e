// SPDX-License-Identifier: Apache-2.0
// alloy/memory_stats.hpp: PyTorch's `memory_stats()` and `memory_summary()`, and fastai's
// `GPUMemTrace`, over any composition that has a `stats<>` part (docs/design.md#statistics).
//
//   alloy::synchronized<alloy::stats<heap>> alloc;
//   auto stats = alloy::memory_stats(alloc);            // std::map<std::string, std::int64_t>
//   std::cout << alloy::memory_summary(alloc);
//   alloy::memory_trace trace{alloc};                   // exact scoped peak, no polling thread
//   ... ; trace.report("forward");                      // "△Used Peaked MB:     12      3 (forward)"
//
// The composition is searched for its first `stats<>` part (depth first). A `synchronized<>` met on
// the way is locked for the query (`with_lock`), so statistics are read consistently.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/walk.hpp>
#include <alloy/error.hpp>
#include <alloy/graph_pool.hpp>
#include <alloy/policy/stats.hpp>

namespace alloy {

namespace detail {

/// A composition that keeps private graph pools (`pool_figures()`, whatever its streams).
template <class A>
concept reports_graph_pools = requires(const A& a) {
  { a.pool_figures() } noexcept -> std::same_as<graph_pool_figures>;
};

/// The graph-pool keys of `memory_stats` (alloy's; PyTorch reports its pools per segment only).
inline void put_graph_pools(std::map<std::string, std::int64_t>& out, const graph_pool_figures& f) {
  out["graph_pools.count"] = static_cast<std::int64_t>(f.pools);
  out["graph_pools.allocated_bytes"] = static_cast<std::int64_t>(f.live_bytes);
  out["graph_pools.reserved_bytes"] = static_cast<std::int64_t>(f.live_bytes + f.free_bytes);
  out["graph_pools.deferred_frees"] = static_cast<std::int64_t>(f.deferred);
}

template <class A>
concept stats_shaped = requires(A& a) {
  a.trace_registry();
  a.core();
  a.statistics();
};

struct stats_match {
  template <class A>
  static constexpr bool test = stats_shaped<A>;
};

template <class A>
inline constexpr bool contains_stats = contains<all_parts, stats_match, A>();

/// Calls `f(s)` on the first `stats<>` part of `a` (the walker, every part), holding the lock of
/// every `synchronized<>` on the way, and returns what `f` returns.
template <class A, class F>
decltype(auto) with_stats(A& a, F&& f) {
  return with_first_part_locked<all_parts, stats_match>(a, std::forward<F>(f));
}

/// The PyTorch names of the statistics arrays, in PyTorch's order.
inline constexpr const char* stat_names[] = {
    "allocation",      "segment",        "active",       "inactive_split",
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
    "requested_bytes"};
inline constexpr const char* pool_names[] = {"all", "small_pool", "large_pool"};

inline void put_stat(std::map<std::string, std::int64_t>& out, const std::string& prefix, const stat& s) {
  out[prefix + ".current"] = s.current;
  out[prefix + ".peak"] = s.peak;
  out[prefix + ".allocated"] = s.allocated;
  out[prefix + ".freed"] = s.freed;
}

/// A statistic as a pool shows it: without a segregator there is one pool, `all`, reported as
/// `large_pool` too (`small_pool` is zero).
inline stat pool_stat(const stat_array& a, std::size_t p, bool pools) noexcept {
  return pools ? a[p] : (p == 1 ? stat{} : a[0]);
}

/// The statistics arrays in PyTorch's order (`stat_names`).
inline std::array<const stat_array*, 9> stat_arrays(const stats_reading& r) noexcept {
  return {&r.allocation, &r.segment, &r.allocation,           &r.inactive_split, &r.bytes,
          &r.reserved,   &r.bytes,   &r.inactive_split_bytes, &r.bytes};
}

inline std::int64_t max_split_key(std::size_t max_split) noexcept {
  return max_split == static_cast<std::size_t>(-1) ? -1 : static_cast<std::int64_t>(max_split);
}

inline std::map<std::string, std::int64_t> make_memory_stats(const stats_reading& r) {
  std::map<std::string, std::int64_t> out;
  const auto arrays = stat_arrays(r);
  for (std::size_t i = 0; i < std::size(stat_names); ++i)
    for (std::size_t p = 0; p < 3; ++p)
      put_stat(out, std::string(stat_names[i]) + "." + pool_names[p], pool_stat(*arrays[i], p, r.pools));
  out["num_alloc_retries"] = static_cast<std::int64_t>(r.accumulated.num_alloc_retries);
  out["num_ooms"] = static_cast<std::int64_t>(r.num_ooms);
  out["num_sync_all_streams"] = static_cast<std::int64_t>(r.all_stream_synchronizations);
  out["num_device_alloc"] = static_cast<std::int64_t>(r.accumulated.num_device_alloc);
  out["num_device_free"] = static_cast<std::int64_t>(r.accumulated.num_device_free);
  out["max_split_size"] = max_split_key(r.max_split);
  put_stat(out, "oversize_allocations", r.oversize);
  put_stat(out, "oversize_segments", r.oversize_segments);
  return out;
}

/// PyTorch's `memory_stats()` map of the `stats<>` part `s` (its lock held by the caller).
template <class S>
std::map<std::string, std::int64_t> memory_stats_of(S& s) {
  return make_memory_stats(s.reading());
}

}  // namespace detail

/// PyTorch's `torch.cuda.memory_stats()` for the first `stats<>` part of `a`: every key PyTorch
/// returns, named as PyTorch names them:
/// `{allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes, active_bytes,
/// inactive_split_bytes, requested_bytes}.{all, small_pool, large_pool}.{current, peak, allocated,
/// freed}`, `num_alloc_retries`, `num_ooms`, `num_sync_all_streams`, `num_device_alloc`,
/// `num_device_free`, `max_split_size` (-1 when no part splits blocks with a limit),
/// `oversize_allocations.*` and `oversize_segments.*`. See `stats<>` for where each comes from;
/// `active*` equal `allocation`/`allocated_bytes` (a block is active from allocate to deallocate),
/// `requested_bytes` equal `allocated_bytes` (block sizes are requested sizes),
/// `num_sync_all_streams` counts the times a `stream_ordered` part inside the `stats<>` part made
/// the host wait for every stream (since construction: `reset_accumulated()` does not reset it;
/// zero without such a part), and `oversize_segments` counts the segments larger than
/// `max_split_size`, observed at queries (so its peak and totals are lower bounds).
///
/// A composition with private CUDA graph pools (a `stream_ordered` part) adds
/// `graph_pools.{count, allocated_bytes, reserved_bytes, deferred_frees}`: pools holding memory,
/// the bytes of their live blocks, those plus the free blocks kept for their graphs (both already
/// counted in `allocated_bytes` and `reserved_bytes` above: graph memory apart, not extra), and
/// frees of earlier blocks waiting for a capture's end.
template <class A>
  requires detail::contains_stats<A>
std::map<std::string, std::int64_t> memory_stats(A& a) {
  std::map<std::string, std::int64_t> out = detail::with_stats(a, [](auto& s) { return detail::memory_stats_of(s); });
  if constexpr (detail::reports_graph_pools<A>) detail::put_graph_pools(out, a.pool_figures());
  return out;
}

/// `statistics()` of the first `stats<>` part of `a` (locked when a `synchronized<>` is on the way).
template <class A>
  requires detail::contains_stats<A>
alloy::statistics statistics_of(A& a) {
  return detail::with_stats(a, [](auto& s) { return s.statistics(); });
}

namespace detail {

inline std::string summary_bytes(std::int64_t n) {
  const bool negative = n < 0;
  double v = static_cast<double>(negative ? -n : n);
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  // Like PyTorch: stay in a unit until the number would need more than four digits.
  while (v >= 1024.0 * 10 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%s%.0f %s", negative ? "-" : "", v, units[u]);
  return text;
}

inline std::string summary_count(std::int64_t n) {
  char text[32];
  if (n >= 1'000'000 || n <= -1'000'000) {
    std::snprintf(text, sizeof text, "%.0fK", static_cast<double>(n) / 1000.0);
  } else {
    std::snprintf(text, sizeof text, "%lld", static_cast<long long>(n));
  }
  return text;
}

/// What a summary says about virtual memory (alloy::virtual_arena and the like): map and unmap
/// calls, and reserved addresses with no memory behind them. Empty for other compositions.
struct virtual_memory_summary {
  std::size_t maps = 0;
  std::size_t unmaps = 0;
  std::size_t unmapped_bytes = 0;
  std::size_t offloaded_bytes = 0;  ///< live blocks of offloaded or discarded tags (virtual_arena offload)
  bool any = false;
};

/// The virtual-memory lines of a summary: map and unmap calls from `Inner`'s counters (as read in
/// `r`), unmapped and offloaded pieces from the blocks `s` passes on.
template <class S>
virtual_memory_summary virtual_memory_of(S& s, const stats_reading& r) {
  virtual_memory_summary v;
  v.maps = r.inner_counters.num_maps;
  v.unmaps = r.inner_counters.num_unmaps;
  if constexpr (introspectable_allocator<S>) {
    s.for_each_block([&](const block_info& info) {
      if (info.state == block_state::unmapped) {
        v.unmapped_bytes += info.size;
        v.any = true;
      } else if (info.state == block_state::offloaded) {
        v.offloaded_bytes += info.size;
        v.any = true;
      }
    });
  }
  v.any = v.any || v.maps != 0 || v.unmaps != 0;
  return v;
}
template <class S>
virtual_memory_summary virtual_memory_of(S& s) {
  return virtual_memory_of(s, s.reading());
}

/// The summary table, from one typed reading (nothing is read back from the `memory_stats` map).
inline std::string make_memory_summary(const stats_reading& r, const virtual_memory_summary& vm = {},
                                       const graph_pool_figures* graph_pools = nullptr) {
  const alloy::statistics& s = r.statistics;
  const bool pools = r.pools;
  constexpr std::size_t width = 79;
  const std::string rule_double = "|" + std::string(width - 2, '=') + "|\n";
  const std::string rule_single = "|" + std::string(width - 2, '-') + "|\n";
  std::string out;
  auto centered = [&](const std::string& text) {
    const std::size_t pad = text.size() < width - 2 ? width - 2 - text.size() : 0;
    const std::size_t left = pad / 2;
    const std::size_t right = pad - left;
    out += "|" + std::string(left, ' ') + text + std::string(right, ' ') + "|\n";
  };
  auto two = [&](const std::string& left, const std::string& right) {
    char line[160];
    std::snprintf(line, sizeof line, "| %-36s| %-38s|\n", left.c_str(), right.c_str());
    out += line;
  };
  auto row = [&](const char* label, const std::string& c, const std::string& p, const std::string& a,
                 const std::string& f) {
    char line[200];
    std::snprintf(line, sizeof line, "| %-26s| %10s | %10s | %10s | %10s |\n", label, c.c_str(), p.c_str(), a.c_str(),
                  f.c_str());
    out += line;
  };
  auto metric = [&](const char* label, const stat_array& a, bool bytes) {
    for (std::size_t p = 0; p < (pools ? 3 : 1); ++p) {
      const stat st = pool_stat(a, p, pools);
      auto text = [&](std::int64_t v) { return bytes ? summary_bytes(v) : summary_count(v); };
      row(p == 0   ? label
          : p == 1 ? "      from small pool"
                   : "      from large pool",
          text(st.current), text(st.peak), text(st.allocated), text(st.freed));
    }
    out += rule_single;
  };

  out += rule_double;
  centered("alloy memory summary");
  out += rule_single;
  two("Out of memory: " + std::to_string(r.num_ooms),
      "Upstream retries: " + std::to_string(r.accumulated.num_alloc_retries));
  two("Upstream allocs: " + std::to_string(r.accumulated.num_device_alloc),
      "Upstream frees: " + std::to_string(r.accumulated.num_device_free));
  out += rule_double;
  row("Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed");
  out += rule_single;
  metric("Allocated memory", r.bytes, true);
  metric("Active memory", r.bytes, true);
  metric("Requested memory", r.bytes, true);
  metric("Reserved memory", r.reserved, true);
  metric("Non-releasable memory", r.inactive_split_bytes, true);
  metric("Allocations", r.allocation, false);
  metric("Active allocs", r.allocation, false);
  metric("Reserved segments", r.segment, false);
  metric("Non-releasable allocs", r.inactive_split, false);
  row("Oversize allocations", summary_count(r.oversize.current), summary_count(r.oversize.peak),
      summary_count(r.oversize.allocated), summary_count(r.oversize.freed));
  out += rule_double;
  char frag[32];
  std::snprintf(frag, sizeof frag, "%.1f%%", s.fragmentation * 100.0);
  two("Bytes limit: " + (s.bytes_limit ? format_bytes(s.bytes_limit) : std::string("none")),
      "Reservable limit: " + (s.bytes_reservable_limit ? format_bytes(s.bytes_reservable_limit) : std::string("none")));
  two("Largest free block: " + format_bytes(s.largest_free_block), std::string("Fragmentation: ") + frag);
  two("Largest allocation: " + format_bytes(s.largest_alloc_size),
      "Max split size: " + (max_split_key(r.max_split) < 0
                                ? std::string("none")
                                : format_bytes(static_cast<std::size_t>(max_split_key(r.max_split)))));
  if (vm.any) {
    two("Map calls: " + std::to_string(vm.maps), "Unmap calls: " + std::to_string(vm.unmaps));
    two("Mapped memory: " + format_bytes(s.bytes_reserved), "Unmapped addresses: " + format_bytes(vm.unmapped_bytes));
    if (vm.offloaded_bytes != 0) two("Offloaded blocks: " + format_bytes(vm.offloaded_bytes), "");
  }
  if (graph_pools != nullptr && (graph_pools->pools != 0 || graph_pools->deferred != 0)) {
    two("Graph pools: " + std::to_string(graph_pools->pools),
        "Deferred frees: " + std::to_string(graph_pools->deferred));
    two("Graph memory: " + format_bytes(graph_pools->live_bytes + graph_pools->free_bytes),
        "Of it allocated: " + format_bytes(graph_pools->live_bytes));
  }
  if (s.bytes_active || s.bytes_inactive || s.peak_bytes_active || s.bytes_reclaimed || s.num_defragmentations) {
    two("Active (locked): " + format_bytes(s.bytes_active), "Inactive (unlocked): " + format_bytes(s.bytes_inactive));
    two("Peak active: " + format_bytes(s.peak_bytes_active), "Reclaimed: " + format_bytes(s.bytes_reclaimed));
    two("Reclaims single/full: " + std::to_string(s.num_single_reclaims) + "/" + std::to_string(s.num_full_reclaims),
        "Defrags: " + std::to_string(s.num_defragmentations) + ", " + format_bytes(s.bytes_defragged));
  }
  out += rule_double;
  return out;
}

}  // namespace detail

/// A readable table of the statistics of the first `stats<>` part of `a`, after PyTorch's
/// `torch.cuda.memory_summary()`: current, peak, total allocated and total freed of memory,
/// blocks and segments, per pool when there are pools, then limits, free space, virtual memory,
/// graph pools and movable memory.
template <class A>
  requires detail::contains_stats<A>
std::string memory_summary(A& a) {
  graph_pool_figures graph_pools{};
  if constexpr (detail::reports_graph_pools<A>) graph_pools = a.pool_figures();
  return detail::with_stats(a, [&](auto& s) {
    const detail::stats_reading r = s.reading();  // refreshed once
    return detail::make_memory_summary(r, detail::virtual_memory_of(s, r), &graph_pools);
  });
}

/// `memory_trace::options` (outside the class so that it can be a default argument of the
/// constructor under every compiler).
struct memory_trace_options {
  bool silent = false;             ///< no report at all (fastai's `silent`)
  std::string ctx{};               ///< note printed with every report (fastai's `ctx`)
  std::ostream* out = &std::cout;  ///< where reports go
};

/// fastai's `GPUMemTrace`, exactly, over the bytes in use of a `stats<>` allocator.
///
/// - `used_delta()`: bytes in use now minus at the start (or the last `reset()`); may be negative.
/// - `peak_delta()`: the blip above the net change: `peak - start - max(used_delta, 0)`, where
///   `peak` is the exact maximum of the bytes in use since the start (no polling: `stats<>` keeps
///   a running maximum it folds into every live trace at each trace event).
/// - `start()` (done by the constructor) and `reset()` restart both deltas; `stop()` freezes them
///   (later calls return the frozen values until the next `start()`).
/// - `report(note)` writes `△Used Peaked MB: <used> <peaked>` in whole MiB, followed by
///   ` (ctx: note)` / ` (ctx)` / ` (note)` as fastai does, to the stream of the options
///   (`std::cout` by default), unless silent. `report_and_reset(note)` reports, then resets.
/// - Any number of traces may be alive on one allocator, nested or overlapping.
/// - Not copyable or movable. The allocator must outlive the trace (a trace of an allocator that
///   is gone keeps its last values). Trace calls are not synchronized with allocations made by
///   other threads: call them from the thread that allocates, or while it is quiet.
class memory_trace {
 public:
  using options = memory_trace_options;

  template <class A>
    requires detail::contains_stats<A>
  explicit memory_trace(A& alloc, options opts = {}) : options_(std::move(opts)) {
    detail::with_stats(alloc, [&](auto& s) { s.trace_registry().attach(&state_); });
    start();
  }
  memory_trace(const memory_trace&) = delete;
  memory_trace& operator=(const memory_trace&) = delete;
  ~memory_trace() {
    if (state_.core != nullptr) state_.core->detach(&state_);
  }

  /// Starts (or restarts) tracing from the bytes in use now.
  void start() noexcept {
    state_.running = true;
    reset();
  }
  /// Both deltas restart from the bytes in use now.
  void reset() noexcept {
    if (state_.core != nullptr) {
      state_.core->flush();
      state_.start = state_.core->in_use();
    }
    state_.peak = state_.start;
  }
  /// Freezes the deltas.
  void stop() noexcept {
    if (state_.running) compute();
    state_.running = false;
  }

  std::int64_t used_delta() noexcept { return data().first; }
  std::int64_t peak_delta() noexcept { return data().second; }
  /// `{used_delta, peak_delta}` (fastai's `data()`).
  std::pair<std::int64_t, std::int64_t> data() noexcept {
    if (state_.running) compute();
    return {used_, peaked_};
  }
  bool running() const noexcept { return state_.running; }

  void silent(bool silent = true) noexcept { options_.silent = silent; }
  bool is_silent() const noexcept { return options_.silent; }

  /// `△Used Peaked MB: <used> <peaked>` (whole MiB, fastai's format).
  std::string to_string() {
    const auto [used, peaked] = data();
    return "\xE2\x96\xB3Used Peaked MB: " + mib(used) + " " + mib(peaked);
  }
  void report(std::string_view note = {}) {
    if (options_.silent || options_.out == nullptr) return;
    *options_.out << to_string() << context(note) << '\n';
  }
  void report_and_reset(std::string_view note = {}) {
    report(note);
    reset();
  }

 private:
  void compute() noexcept {
    if (state_.core != nullptr) {
      state_.core->flush();
      used_ = state_.core->in_use() - state_.start;
    } else {
      used_ = state_.last_in_use - state_.start;
    }
    std::int64_t peaked = state_.peak - state_.start;
    if (peaked < 0) {
      peaked = 0;
    } else if (used_ > 0) {
      peaked -= used_;
    }
    peaked_ = peaked;
  }
  std::string context(std::string_view note) const {
    std::string parts = options_.ctx;
    if (!note.empty()) parts += (parts.empty() ? "" : ": ") + std::string(note);
    return parts.empty() ? std::string() : " (" + parts + ")";
  }
  /// Whole MiB, truncated toward zero, at least 6 wide, with thousands separators.
  static std::string mib(std::int64_t bytes) {
    const std::int64_t m = bytes / (std::int64_t{1} << 20);
    const std::string digits = std::to_string(m < 0 ? -m : m);
    std::string grouped = m < 0 ? "-" : "";
    for (std::size_t i = 0; i < digits.size(); ++i) {
      if (i != 0 && (digits.size() - i) % 3 == 0) grouped += ',';
      grouped += digits[i];
    }
    if (grouped.size() < 6) grouped.insert(grouped.begin(), 6 - grouped.size(), ' ');
    return grouped;
  }

  options options_;
  detail::trace_state state_{};
  std::int64_t used_ = 0;
  std::int64_t peaked_ = 0;
};

}  // namespace alloy
