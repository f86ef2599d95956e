// SPDX-License-Identifier: Apache-2.0
// snapshot_picture: replays an RMM trace through stats<default_allocator<host_upstream>>, stops at
// a given fraction of the events (default: at the peak of bytes in use), and writes the heap's
// snapshot as SVG and JSON plus the memory summary. Used to make docs/snapshot.svg:
//
//   snapshot_picture TRACE.rmm.csv.gz out.svg [out.json] [stop-fraction]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/showcase.hpp>
#include <alloy/snapshot.hpp>

#include "replay/rmm_trace.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TRACE out.svg [out.json] [stop-fraction]\n", argv[0]);
    return 2;
  }
  const alloy::bench::rmm_trace trace = alloy::bench::read_rmm_trace(argv[1]);
  const double fraction = argc > 4 ? std::atof(argv[4]) : -1.0;

  alloy::stats<alloy::default_allocator<alloy::host_upstream>> alloc;
  std::vector<alloy::block> blocks(trace.allocations);
  // First pass (when stopping at the peak): find the event after which bytes in use peak.
  std::size_t stop = trace.events.size();
  if (fraction < 0) {
    std::size_t live = 0, peak = 0;
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      const auto& e = trace.events[i];
      if (e.action == alloy::bench::trace_action::allocate) live += e.size;
      if (e.action == alloy::bench::trace_action::free) live -= e.size;
      if (live > peak) peak = live, stop = i + 1;
    }
  } else {
    stop = static_cast<std::size_t>(fraction * static_cast<double>(trace.events.size()));
  }
  for (std::size_t i = 0; i < stop; ++i) {
    const auto& e = trace.events[i];
    if (e.action == alloy::bench::trace_action::allocate) {
      blocks[e.allocation] = alloc.allocate(e.size, 256);
    } else if (e.action == alloy::bench::trace_action::free) {
      alloc.deallocate(blocks[e.allocation]);
      blocks[e.allocation] = {};
    }
  }
  const alloy::memory_snapshot snap = alloy::snapshot(alloc);
  std::ofstream(argv[2]) << snap.to_svg();
  if (argc > 3) std::ofstream(argv[3]) << snap.to_json();
  std::cout << trace.name << ": stopped after " << stop << " of " << trace.events.size() << " events\n"
            << alloy::memory_summary(alloc);
  for (const alloy::block& b : blocks)
    if (b) alloc.deallocate(b);
  return 0;
}
