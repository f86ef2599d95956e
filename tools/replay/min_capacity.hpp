// SPDX-License-Identifier: Apache-2.0
// tools/replay/min_capacity.hpp: the smallest device on which a composition serves a whole trace
// ("how big a GPU do I need"), found by replaying it at one capacity after another.
//
// A capacity *passes* when the checked replay at it serves every request of the trace (those
// that failed when recorded aside: they are asked again, but may fail) without a fault. The
// search assumes that passing is monotone in the capacity (a composition that serves the trace on
// a device serves it on any larger one). That holds for the policies here as far as we know but
// is not a theorem (a cache trimmed at another moment places later blocks elsewhere), so the
// result is checked, not assumed: the capacity returned is one whose replay passed, and a few
// larger ones are replayed too (`probes`); one that fails is reported (`non_monotone_at`).
//
// Search: the trace's peak live bytes first (no device can serve it with less); if that fails,
// doubling up to a bound found that passes (at most 2^50 bytes, else `found` is false), then
// bisection until the bracket is within `precision` (0.5 %) of its upper end.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "replay/replay.hpp"
#include "replay/rmm_trace.hpp"
#include "replay/simulated_vm.hpp"

namespace alloy::replay {

struct min_capacity_result {
  bool found = false;               ///< some capacity up to 2^50 bytes served the trace
  std::size_t capacity = 0;         ///< the smallest that passed (to `precision`)
  double over_live = 0;             ///< capacity ÷ the trace's peak live bytes
  replay_result at_capacity;        ///< the checked replay at `capacity`
  std::size_t replays = 0;          ///< replays the search took (probes included)
  std::vector<double> probes;       ///< factors above `capacity` replayed to check monotonicity
  std::size_t non_monotone_at = 0;  ///< a larger capacity that failed (0: none did)
  /// The largest capacity the search saw fail (0: none), and the first allocation that failed
  /// there: why the trace needs more than that.
  std::size_t largest_failing = 0;
  failed_allocation failed_there{};
};

struct min_capacity_options {
  double precision = 0.005;
  std::vector<double> probes = {1.01, 1.02, 1.05, 1.10};
  std::size_t limit = std::size_t{1} << 50;
};

/// Finds the smallest capacity at which `run(capacity)` (a checked replay) serves everything.
inline min_capacity_result find_min_capacity(const bench::rmm_trace& trace,
                                             const std::function<replay_result(std::size_t)>& run,
                                             const min_capacity_options& opts = {}) {
  min_capacity_result out;
  auto passes = [&](std::size_t capacity, replay_result* keep) {
    ++out.replays;
    replay_result r = run(capacity);
    const bool ok = r.served_all();
    if (keep == nullptr) return ok;  // a probe
    if (ok) {
      *keep = std::move(r);
    } else {  // a step of the search: each failure lies above the ones before
      out.largest_failing = capacity;
      out.failed_there = r.first_failed;
    }
    return ok;
  };
  const std::size_t live = std::max<std::size_t>(trace.peak_live_bytes, 1);
  std::size_t lo = 0, hi = live;  // lo fails (0: not known to), hi is tried next
  replay_result best;
  if (!passes(hi, &best)) {
    lo = hi;
    for (;;) {
      if (hi > opts.limit / 2) return out;  // not found below the limit
      hi *= 2;
      if (passes(hi, &best)) break;
      lo = hi;
    }
    while (static_cast<double>(hi - lo) > opts.precision * static_cast<double>(hi)) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (passes(mid, &best)) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
  }
  out.found = true;
  out.capacity = hi;
  out.over_live = static_cast<double>(hi) / static_cast<double>(live);
  out.at_capacity = std::move(best);
  for (const double f : opts.probes) {
    const auto c = static_cast<std::size_t>(static_cast<double>(hi) * f);
    out.probes.push_back(f);
    if (!passes(c, nullptr) && out.non_monotone_at == 0) out.non_monotone_at = c;
  }
  return out;
}

}  // namespace alloy::replay
