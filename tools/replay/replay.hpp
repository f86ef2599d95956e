// tools/replay/replay.hpp: replays a trace through one allocator over a simulated device and
// measures what alloy-replay reports.
//
// A *replay target* wraps an allocator in the shape the loop needs (see `replay_target`): a token
// per live allocation (a block, a movable handle, a pointer), `allocate(bytes)` that returns an
// empty token on failure, `deallocate(token, bytes)`, and the bytes it moved. The loop:
//
// - `allocate`: asks the target; a failure is counted and the allocation's later free skipped.
// - `free`: gives the allocation back (when it was served).
// - `allocate failure` (failed in the recorded run): asks again; if it is served now, it is
//   freed at once (the recorded program got nothing and went on), otherwise counted as failed.
// - Allocations the trace never frees are freed after the timed loop, then the allocator is
//   destroyed; whatever the device still holds then is reported as leaked.
//
// Figures (all exact, none sampled): ns per operation (the timed loop's wall time ÷ events, the
// median over `repetitions` fresh replays), peak in use (most bytes of served requests live at
// once), peak reserved (the device's own count, so it sees reservations inside a call), upstream
// calls, failed requests, bytes moved (defragmentation), and a series of in-use and reserved bytes
// over the trace for the chart (per bucket of events, the maximum of each).
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "replay/simulated_device.hpp"
#include "replay/rmm_trace.hpp"

namespace alloy::replay {

template <class T>
concept replay_target = requires(T& t, const T& ct, typename T::token tok, std::size_t n) {
  { t.allocate(n) } -> std::same_as<typename T::token>;
  t.deallocate(tok, n);
  { static_cast<bool>(tok) };
  { ct.bytes_moved() } -> std::convertible_to<std::size_t>;
};

struct replay_options {
  std::size_t alignment = 256;   ///< alignment of every request
  std::size_t capacity = unlimited;
  int repetitions = 1;           ///< timed replays per composition (figures from the first)
  std::size_t series_points = 600;  ///< points of the in-use / reserved series (at most)
  /// Called now and then with the fraction of the current replay done (0..1); may be empty.
  std::function<void(double)> progress{};
};

/// In-use and reserved bytes after event `event` (each the maximum over its bucket of events).
struct series_point {
  std::size_t event = 0;
  std::size_t in_use = 0;
  std::size_t reserved = 0;
};

struct replay_result {
  std::string composition;
  std::size_t operations = 0;        ///< events replayed (allocate, free, allocate failure)
  double ns_per_op = 0;              ///< median over the repetitions
  std::vector<double> ns_per_op_runs;
  std::size_t requests = 0;          ///< allocate and allocate-failure events
  std::size_t served = 0;            ///< requests served
  std::size_t failed = 0;            ///< requests that failed
  std::size_t peak_in_use = 0;       ///< bytes of served requests live at once, at most
  std::size_t peak_reserved = 0;     ///< bytes held from the device at once, at most
  std::size_t end_in_use = 0;        ///< at the end of the trace
  std::size_t end_reserved = 0;      ///< at the end of the trace
  std::size_t upstream_allocs = 0;   ///< device allocations during the trace
  std::size_t upstream_frees = 0;    ///< device deallocations during the trace
  std::size_t upstream_refusals = 0; ///< device requests refused (capacity) during the trace
  std::size_t bytes_moved = 0;       ///< bytes copied to move blocks (defragmentation)
  std::size_t leaked = 0;            ///< bytes the device still held after the allocator was gone
  double reserved_over_live = 0;     ///< peak reserved ÷ the trace's peak live bytes
  std::vector<series_point> series;

  std::size_t upstream_calls() const noexcept { return upstream_allocs + upstream_frees; }
};

namespace detail {

/// Collects the per-bucket maxima of the series.
class series_builder {
 public:
  series_builder(std::size_t events, std::size_t points)
      : bucket_(std::max<std::size_t>(1, (events + std::max<std::size_t>(points, 1) - 1) / std::max<std::size_t>(points, 1))) {
    series_.reserve(events / bucket_ + 2);
  }
  void observe(std::size_t event, std::size_t in_use, std::size_t reserved) noexcept {
    current_.in_use = std::max(current_.in_use, in_use);
    current_.reserved = std::max(current_.reserved, reserved);
    if (++count_ == bucket_) close(event);
  }
  std::vector<series_point> finish(std::size_t last_event) {
    if (count_ != 0) close(last_event);
    return std::move(series_);
  }

 private:
  void close(std::size_t event) noexcept {
    current_.event = event;
    series_.push_back(current_);
    current_ = {};
    count_ = 0;
  }
  std::size_t bucket_;
  std::size_t count_ = 0;
  series_point current_{};
  std::vector<series_point> series_;
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace detail

/// One replay of `trace` through a fresh target made by `make()` over `device` (which is reset
/// first). Fills `figures` (with the series) when it is not null. Returns ns per operation.
template <class Make>
double replay_once(const bench::rmm_trace& trace, simulated_device& device, Make&& make, const replay_options& opts,
                   replay_result* figures) {
  using bench::trace_action;
  device.reset();
  double ns = 0;
  {
    auto target = make();
    static_assert(replay_target<decltype(target)>);
    using token = typename decltype(target)::token;
    std::vector<token> live(trace.allocations);
    const std::size_t events = trace.events.size();
    detail::series_builder series(events, opts.series_points);  // in every run, so that runs cost the same
    std::size_t in_use = 0, peak_in_use = 0, failed = 0, served = 0, requests = 0;
    const std::size_t tick = 1 << 14;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < events; ++i) {
      const bench::trace_event& e = trace.events[i];
      if (e.action == trace_action::free) {
        token& t = live[e.allocation];
        if (t) {
          target.deallocate(t, e.size);
          t = token{};
          in_use -= e.size;
        }
      } else {
        ++requests;
        token t = target.allocate(e.size);
        if (t) {
          ++served;
          in_use += e.size;
          peak_in_use = std::max(peak_in_use, in_use);
          if (e.action == trace_action::allocate) {
            live[e.allocation] = t;
          } else {
            target.deallocate(t, e.size);
            in_use -= e.size;
          }
        } else {
          ++failed;
        }
      }
      series.observe(i, in_use, device.reserved());
      if (opts.progress && (i + 1) % tick == 0) opts.progress(static_cast<double>(i + 1) / static_cast<double>(events));
    }
    const auto stop = std::chrono::steady_clock::now();
    ns = std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(std::max<std::size_t>(events, 1));
    if (figures != nullptr) {
      replay_result& r = *figures;
      r.operations = events;
      r.requests = requests;
      r.served = served;
      r.failed = failed;
      r.peak_in_use = peak_in_use;
      r.peak_reserved = device.peak_reserved();
      r.end_in_use = in_use;
      r.end_reserved = device.reserved();
      r.upstream_allocs = device.allocations();
      r.upstream_frees = device.deallocations();
      r.upstream_refusals = device.refusals();
      r.bytes_moved = target.bytes_moved();
      r.reserved_over_live = static_cast<double>(r.peak_reserved) /
                             static_cast<double>(std::max<std::size_t>(trace.peak_live_bytes, 1));
      r.series = series.finish(events == 0 ? 0 : events - 1);
    }
    for (const bench::trace_event& e : trace.events) {  // what the trace never freed
      if (e.action == trace_action::allocate && live[e.allocation]) {
        target.deallocate(live[e.allocation], e.size);
        live[e.allocation] = token{};
      }
    }
  }
  if (figures != nullptr) figures->leaked = device.reserved();
  return ns;
}

/// Replays `trace` `opts.repetitions` times through fresh targets; figures from the first.
template <class Make>
replay_result replay(const bench::rmm_trace& trace, simulated_device& device, Make&& make, const replay_options& opts,
                     std::string name) {
  replay_result r;
  r.composition = std::move(name);
  const int runs = std::max(1, opts.repetitions);
  replay_options each = opts;
  for (int i = 0; i < runs; ++i) {
    if (opts.progress) each.progress = [&, i](double f) { opts.progress((i + f) / runs); };
    r.ns_per_op_runs.push_back(replay_once(trace, device, make, each, i == 0 ? &r : nullptr));
  }
  r.ns_per_op = detail::median(r.ns_per_op_runs);
  return r;
}

}  // namespace alloy::replay
