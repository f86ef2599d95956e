// SPDX-License-Identifier: Apache-2.0
// bench/support/slot_workload.hpp: a workload as a list of slot operations (allocate a size into a
// slot, or free what a slot holds), made from W1's pairs or from a trace, for the GPU replays
// (virtual_memory_gpu, rmm_peers_gpu), which run every peer over the same list.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "replay/trace_reader.hpp"
#include "support/pairs_workload.hpp"

namespace alloy::bench {

/// One operation of a workload: allocate `size` into `slot`, or free what `slot` holds.
struct operation {
  std::uint32_t slot;
  std::size_t size;  // 0: free
};

struct slot_workload {
  std::vector<operation> setup;  // untimed (W1's first live set)
  std::vector<operation> timed;
  std::size_t slots = 0;
  std::size_t peak_live = 0;
};

inline slot_workload from_pairs(const workload& w) {
  slot_workload out;
  out.slots = w.initial.size();
  out.peak_live = w.peak_live;
  for (std::size_t i = 0; i < w.initial.size(); ++i) out.setup.push_back({static_cast<std::uint32_t>(i), w.initial[i]});
  for (std::size_t i = 0; i < w.pairs(); ++i) {
    out.timed.push_back({w.victim[i], 0});
    out.timed.push_back({w.victim[i], w.size[i]});
  }
  return out;
}

/// A trace's allocations and frees; a request of 0 bytes counts as 1.
inline slot_workload from_trace(const rmm_trace& t) {
  slot_workload out;
  out.slots = t.allocations;
  std::size_t live = 0;
  for (const trace_event& e : t.events) {
    if (e.action == trace_action::allocate) {
      out.timed.push_back({static_cast<std::uint32_t>(e.allocation), std::max<std::size_t>(e.size, 1)});
      live += std::max<std::size_t>(e.size, 1);
      out.peak_live = std::max(out.peak_live, live);
    } else if (e.action == trace_action::free) {
      out.timed.push_back({static_cast<std::uint32_t>(e.allocation), 0});
      live -= std::max<std::size_t>(e.size, 1);
    }
  }
  return out;
}

}  // namespace alloy::bench
