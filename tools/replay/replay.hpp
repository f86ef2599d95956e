// SPDX-License-Identifier: Apache-2.0
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
// Every served block is checked (in a first, untimed replay that gives every figure but the
// time): its address must be aligned as asked, lie inside what the device handed out (a live
// allocation of the device of segments; mapped memory of the virtual-memory device) and overlap
// no other live block. A block that fails is a *fault* of the composition, not a served request:
// counted in `faults`, the first one described in `first_fault`, the block neither used nor
// given back. What the device itself finds wrong (a free of an address it never gave out, a
// map over mapped memory ...) counts as a fault too. A movable block has no fixed address:
// only that it exists is checked. A target may also refuse to pass a request on (`cannot_ask`,
// for a peer known to corrupt memory on it): that is a fault too.
//
// Figures (all exact, none sampled): ns per operation (the timed loop's CPU time on this thread
// ÷ events, the median over `repetitions` fresh replays after the checked one; none when 0),
// peak in use (most bytes of served requests live at once), peak reserved (the device's own
// count, so it sees reservations inside a call), upstream calls, failed requests, bytes moved
// (defragmentation), and a series of in-use and reserved bytes over the trace for the chart (per
// bucket of events, the maximum of each).
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "replay/rmm_trace.hpp"
#include "replay/simulated_device.hpp"
#include "replay/simulated_vm.hpp"

namespace alloy::replay {

template <class T>
concept replay_target = requires(T& t, const T& ct, typename T::token tok, std::size_t n) {
  { t.allocate(n) } -> std::same_as<typename T::token>;
  t.deallocate(tok, n);
  { static_cast<bool>(tok) };
  { ct.bytes_moved() } -> std::convertible_to<std::size_t>;
};

struct replay_options {
  std::size_t alignment = 256;  ///< alignment of every request
  std::size_t capacity = unlimited;
  int repetitions = 1;  ///< timed replays per composition, after the checked one (0: none)
  /// Each timed replay goes over the trace a second time through the same target, timed apart:
  /// the warm figure (memory already mapped or held, as at a training loop's next step).
  bool warm = false;
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

/// The first `allocate` event of a checked replay that the composition could not serve, and what
/// it held then: with the request, in use and reserved show whether the device was full of live
/// bytes or of memory held around them (fragmentation, partly used granules).
struct failed_allocation {
  std::size_t event = 0;     ///< 1-based event number in the trace; 0: every allocation was served
  std::size_t bytes = 0;     ///< bytes asked for
  std::size_t in_use = 0;    ///< bytes of served requests live when it failed
  std::size_t reserved = 0;  ///< bytes held from the device when it failed (virtual memory: physical)
};

struct replay_result {
  std::string composition;
  std::size_t operations = 0;  ///< events replayed (allocate, free, allocate failure)
  double ns_per_op = 0;        ///< median over the repetitions
  std::vector<double> ns_per_op_runs;
  double warm_ns_per_op = 0;  ///< the second pass's, median (`replay_options::warm`; else 0)
  std::vector<double> warm_ns_per_op_runs;
  std::size_t requests = 0;           ///< allocate and allocate-failure events
  std::size_t served = 0;             ///< requests served
  std::size_t failed = 0;             ///< requests that failed
  std::size_t peak_in_use = 0;        ///< bytes of served requests live at once, at most
  std::size_t peak_reserved = 0;      ///< bytes held from the device at once, at most
  std::size_t end_in_use = 0;         ///< at the end of the trace
  std::size_t end_reserved = 0;       ///< at the end of the trace
  std::size_t upstream_allocs = 0;    ///< device allocations during the trace
  std::size_t upstream_frees = 0;     ///< device deallocations during the trace
  std::size_t upstream_refusals = 0;  ///< device requests refused (capacity) during the trace
  std::size_t bytes_moved = 0;        ///< bytes copied to move blocks (defragmentation)
  std::size_t leaked = 0;             ///< bytes the device still held after the allocator was gone
  double reserved_over_live = 0;      ///< peak reserved ÷ the trace's peak live bytes
  bool virtual_memory = false;        ///< ran on the virtual-memory device
  std::size_t map_calls = 0;          ///< map + unmap calls (virtual memory only)
  std::size_t peak_mapped = 0;        ///< bytes mapped at once, at most (virtual memory only)
  std::size_t faults = 0;             ///< wrong answers: blocks outside the device, misaligned, overlapping ...
  std::string first_fault;            ///< the first one, described
  failed_allocation first_failed{};   ///< the first `allocate` it could not serve (event 0: none)
  std::vector<series_point> series;

  std::size_t upstream_calls() const noexcept { return upstream_allocs + upstream_frees; }
  /// Served every request except those that failed when recorded (and no fault).
  bool served_all() const noexcept { return failed_allocations == 0 && faults == 0; }
  std::size_t failed_allocations = 0;  ///< failed requests among the trace's `allocate` events
};

namespace detail {

/// Collects the per-bucket maxima of the series.
class series_builder {
 public:
  series_builder(std::size_t events, std::size_t points)
      : bucket_(std::max<std::size_t>(
            1, (events + std::max<std::size_t>(points, 1) - 1) / std::max<std::size_t>(points, 1))) {
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

namespace detail {

/// The checks of a served block (the figures run only): aligned, inside the device, overlapping
/// no live block. Keeps the live blocks by address.
class block_checker {
 public:
  /// Empty when `[p, p + bytes)` is a good answer to a request of `bytes` at `alignment`;
  /// otherwise what is wrong with it. A good block is remembered as live.
  template <class Device>
  std::string check(const void* p, std::size_t bytes, std::size_t alignment, const Device& device) {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    std::ostringstream what;
    if (at % alignment != 0) {
      what << "misaligned (asked for " << alignment << "-byte alignment)";
    } else if (!device.holds(p, bytes)) {
      what << "not inside memory the device handed out";
    } else if (const auto [prev, next] = neighbours(at);
               (prev != live_.end() && prev->first + prev->second > at) ||
               (next != live_.end() && next->first < at + std::max<std::size_t>(bytes, 1))) {
      what << "overlaps a live block";
    } else {
      live_.emplace(at, std::max<std::size_t>(bytes, 1));
      return {};
    }
    std::ostringstream out;
    out << "answered a request of " << bytes << " bytes with " << p << ", " << what.str();
    return out.str();
  }
  void forget(const void* p) { live_.erase(reinterpret_cast<std::uintptr_t>(p)); }

 private:
  using map = std::map<std::uintptr_t, std::size_t>;
  std::pair<map::iterator, map::iterator> neighbours(std::uintptr_t at) {
    auto next = live_.lower_bound(at);
    auto prev = next == live_.begin() ? live_.end() : std::prev(next);
    return {prev, next};
  }
  map live_;  // base -> bytes (at least 1)
};

template <class Target, class Token>
const void* address_of(const Token& t) {
  if constexpr (requires { Target::address(t); }) {
    return Target::address(t);
  } else {
    return nullptr;  // a movable block: no fixed address
  }
}

}  // namespace detail

/// This thread's CPU time (as bench/support's thread_cpu_clock, which this tool does not include):
/// a replay's timed loop is a few microseconds to milliseconds, and on a shared machine wall time
/// also counts what other processes did meanwhile.
inline std::chrono::nanoseconds thread_cpu_now() noexcept {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::chrono::seconds{t.tv_sec} + std::chrono::nanoseconds{t.tv_nsec};
}

/// One replay of `trace` through a fresh target made by `make()` over `device` (which is reset
/// first). With `figures` (not null) every served block is checked and every figure filled in
/// (with the series); without, it is a timed run. Returns ns per operation. With `warm_ns`, the
/// trace is then replayed a second time through the same target, timed into `*warm_ns`.
template <class Device, class Make>
double replay_once(const bench::rmm_trace& trace, Device& device, Make&& make, const replay_options& opts,
                   replay_result* figures, double* warm_ns = nullptr) {
  using bench::trace_action;
  device.reset();
  const bool checked = figures != nullptr;
  device.set_checking(checked);
  double ns = 0;
  {
    auto target = make();
    using target_t = decltype(target);
    static_assert(replay_target<target_t>);
    using token = typename target_t::token;
    std::vector<token> live(trace.allocations);
    const std::size_t events = trace.events.size();
    detail::series_builder series(events, opts.series_points);  // in every run, so that runs cost the same
    detail::block_checker checker;
    std::size_t in_use = 0, peak_in_use = 0, failed = 0, failed_allocations = 0, served = 0, requests = 0, faults = 0;
    std::string first_fault;
    failed_allocation first_failed;
    const std::size_t tick = 1 << 14;
    // One pass over the events, timed; ns per operation. With a warm pass, each reports half of
    // the progress.
    const double share = warm_ns != nullptr ? 0.5 : 1.0;
    const auto pass = [&](detail::series_builder& observed, double progress_from) {
      const auto start = thread_cpu_now();
      for (std::size_t i = 0; i < events; ++i) {
        const bench::trace_event& e = trace.events[i];
        if (e.action == trace_action::free) {
          token& t = live[e.allocation];
          if (t) {
            if (checked) checker.forget(detail::address_of<target_t>(t));
            target.deallocate(t, e.size);
            t = token{};
            in_use -= e.size;
          }
        } else {
          ++requests;
          bool faulted = false;
          if constexpr (requires { target.cannot_ask(e.size); }) {
            if (const char* why = target.cannot_ask(e.size)) {  // asking would break the replay: its fault
              if (checked && faults++ == 0)
                first_fault =
                    "event " + std::to_string(i + 1) + ": a request of " + std::to_string(e.size) + " bytes " + why;
              if (!checked) ++failed;
              observed.observe(i, in_use, device.reserved());
              continue;
            }
          }
          token t = target.allocate(e.size);
          if (checked && t) {
            if (const void* p = detail::address_of<target_t>(t)) {
              std::string wrong = checker.check(p, e.size, opts.alignment, device);
              if (!wrong.empty()) {  // a fault: not served, not used, not given back
                if (faults++ == 0) first_fault = "event " + std::to_string(i + 1) + ": " + wrong;
                t = token{};
                faulted = true;
              }
            }
          }
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
          } else if (!faulted) {
            ++failed;
            if (e.action == trace_action::allocate) {
              if (checked && failed_allocations == 0) first_failed = {i + 1, e.size, in_use, device.reserved()};
              ++failed_allocations;
            }
          }
        }
        observed.observe(i, in_use, device.reserved());
        if (opts.progress && (i + 1) % tick == 0)
          opts.progress(progress_from + share * static_cast<double>(i + 1) / static_cast<double>(events));
      }
      const auto stop = thread_cpu_now();
      return std::chrono::duration<double, std::nano>(stop - start).count() /
             static_cast<double>(std::max<std::size_t>(events, 1));
    };
    // What the trace never freed is freed after each pass, untimed.
    const auto free_the_rest = [&] {
      for (const bench::trace_event& e : trace.events) {
        if (e.action == trace_action::allocate && live[e.allocation]) {
          target.deallocate(live[e.allocation], e.size);
          live[e.allocation] = token{};
        }
      }
      in_use = 0;
    };
    ns = pass(series, 0.0);
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
      r.failed_allocations = failed_allocations;
      r.virtual_memory = std::is_same_v<Device, simulated_vm_device>;
      r.map_calls = device.map_calls();
      if constexpr (std::is_same_v<Device, simulated_vm_device>) r.peak_mapped = device.peak_mapped();
      r.faults = faults;
      r.first_fault = std::move(first_fault);
      r.first_failed = first_failed;
      r.bytes_moved = target.bytes_moved();
      r.reserved_over_live =
          static_cast<double>(r.peak_reserved) / static_cast<double>(std::max<std::size_t>(trace.peak_live_bytes, 1));
      r.series = series.finish(events == 0 ? 0 : events - 1);
    }
    free_the_rest();
    if (warm_ns != nullptr) {  // the same allocator again, as a training loop's next step
      detail::series_builder warm_series(events, opts.series_points);
      *warm_ns = pass(warm_series, share);
      free_the_rest();
    }
  }
  if (figures != nullptr) {
    figures->leaked = device.reserved();
    if (device.faults() != 0) {  // what the device found wrong in the calls it got
      if (figures->faults == 0) figures->first_fault = "the device: " + device.first_fault();
      figures->faults += device.faults();
    }
  }
  return ns;
}

/// Replays `trace` once, checked, for the figures, then `opts.repetitions` times through fresh
/// targets for the time (ns/op: their median; 0 when there are none); with `opts.warm`, each timed
/// target replays the trace a second time too (`warm_ns_per_op`).
template <class Device, class Make>
replay_result replay(const bench::rmm_trace& trace, Device& device, Make&& make, const replay_options& opts,
                     std::string name) {
  replay_result r;
  r.composition = std::move(name);
  const int runs = 1 + std::max(0, opts.repetitions);
  replay_options each = opts;
  for (int i = 0; i < runs; ++i) {
    if (opts.progress) each.progress = [&, i](double f) { opts.progress((i + f) / runs); };
    double warm = 0;
    const double ns =
        replay_once(trace, device, make, each, i == 0 ? &r : nullptr, i != 0 && opts.warm ? &warm : nullptr);
    if (i == 0) continue;
    r.ns_per_op_runs.push_back(ns);
    if (opts.warm) r.warm_ns_per_op_runs.push_back(warm);
  }
  r.ns_per_op = detail::median(r.ns_per_op_runs);
  r.warm_ns_per_op = detail::median(r.warm_ns_per_op_runs);
  return r;
}

}  // namespace alloy::replay
