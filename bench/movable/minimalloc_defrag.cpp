// SPDX-License-Identifier: Apache-2.0
// The MiniMalloc "challenging" instances replayed online into a fixed capacity of 1 GiB (the
// instances' own capacity, sizes x1024): (a) best_fit_arena alone, raw blocks; (b) the same arena
// under compacting_defragmenter, every block movable and unlocked between its allocate and its
// free. Every instance fits the capacity (the solver proves it), so an allocator that can move
// blocks can serve every request; one that cannot fails when the free bytes are fragmented.
//
// Figures: requests served and failed, bytes moved by defragmentation next to the bytes
// allocated, replay time. A table is printed after the Google Benchmark output.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/movable.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/compacting_defragmenter.hpp>

#include "replay/rmm_trace.hpp"

using namespace alloy::literals;

namespace {

constexpr std::size_t capacity = 1_GiB;

using arena_t = alloy::best_fit_arena<alloy::host_upstream>;
using defrag_t = alloy::compacting_defragmenter<arena_t>;

arena_t make_arena() { return arena_t{alloy::host_upstream{}, {.initial_size = capacity, .maximum_size = capacity}}; }

struct outcome {
  std::size_t requests = 0;
  std::size_t served = 0;
  std::size_t failed = 0;
  std::size_t bytes_allocated = 0;  // bytes of the requests served
  std::size_t bytes_moved = 0;
  std::size_t defragmentations = 0;
  std::size_t moves = 0;
  double seconds = 0;
};

struct row {
  std::size_t peak_live = 0;
  outcome arena, defrag;
};

std::map<std::string, row>& table(std::map<std::string, row>* set = nullptr) {
  static std::map<std::string, row>* rows = nullptr;  // bench program only, never in the library
  if (set != nullptr) rows = set;
  return *rows;
}

outcome replay_arena(const alloy::bench::rmm_trace& trace) {
  outcome o;
  arena_t arena = make_arena();
  std::vector<alloy::block> blocks(trace.allocations);
  for (const auto& e : trace.events) {
    if (e.action == alloy::bench::trace_action::allocate) {
      ++o.requests;
      blocks[e.allocation] = arena.allocate(e.size, 256);
      if (blocks[e.allocation]) {
        ++o.served;
        o.bytes_allocated += e.size;
      } else {
        ++o.failed;
      }
    } else if (e.action == alloy::bench::trace_action::free) {
      if (blocks[e.allocation]) arena.deallocate(blocks[e.allocation]);
      blocks[e.allocation] = {};
    }
  }
  return o;
}

outcome replay_defrag(const alloy::bench::rmm_trace& trace) {
  outcome o;
  defrag_t alloc{make_arena()};
  std::vector<alloy::handle> handles(trace.allocations);
  for (const auto& e : trace.events) {
    if (e.action == alloy::bench::trace_action::allocate) {
      ++o.requests;
      handles[e.allocation] = alloc.allocate_movable(e.size);
      if (handles[e.allocation]) {
        ++o.served;
        o.bytes_allocated += e.size;
      } else {
        ++o.failed;
      }
    } else if (e.action == alloy::bench::trace_action::free) {
      if (handles[e.allocation]) alloc.deallocate(handles[e.allocation]);
      handles[e.allocation] = {};
    }
  }
  for (alloy::handle h : handles) {
    if (h) alloc.deallocate(h);
  }
  const alloy::movable_counters c = alloc.movable_statistics();
  o.bytes_moved = c.bytes_defragged;
  o.defragmentations = c.num_defragmentations;
  o.moves = c.num_moves;
  return o;
}

void report(benchmark::State& state, const outcome& o) {
  state.counters["served"] = static_cast<double>(o.served);
  state.counters["failed"] = static_cast<double>(o.failed);
  state.counters["MiB_moved"] = static_cast<double>(o.bytes_moved) / (1 << 20);
  state.counters["MiB_allocated"] = static_cast<double>(o.bytes_allocated) / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::map<std::string, row> rows;
  table(&rows);
  std::map<std::string, alloy::bench::rmm_trace> traces;
  const std::filesystem::path dir = std::filesystem::path(ALLOY_TRACE_DIR) / "minimalloc";
  if (!std::filesystem::is_directory(dir)) {
    std::printf("minimalloc_defrag: no traces in %s; nothing to replay\n", dir.c_str());
    return 0;
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (file.find(".x1024.events.rmm.csv") == std::string::npos) continue;
    const std::string name = file.substr(0, file.find('.'));
    traces.emplace(name, alloy::bench::read_rmm_trace(entry.path().string()));
  }
  for (auto& [name, trace] : traces) {
    rows[name].peak_live = trace.peak_live_bytes;
    const alloy::bench::rmm_trace* t = &trace;
    const std::string n = name;
    benchmark::RegisterBenchmark(("minimalloc/" + name + "/best_fit_arena").c_str(),
                                 [t, n](benchmark::State& state) {
                                   outcome o;
                                   for (auto _ : state) o = replay_arena(*t);
                                   report(state, o);
                                   o.seconds = 0;
                                   table()[n].arena = o;
                                 })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
    benchmark::RegisterBenchmark(("minimalloc/" + name + "/defragmenter").c_str(),
                                 [t, n](benchmark::State& state) {
                                   outcome o;
                                   for (auto _ : state) o = replay_defrag(*t);
                                   report(state, o);
                                   table()[n].defrag = o;
                                 })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  std::printf("\nMiniMalloc instances, capacity 1 GiB (sizes x1024), online replay\n");
  std::printf("%-9s %9s %9s | %-21s | %-21s %12s %12s %8s %7s\n", "instance", "requests", "peak live", "best_fit_arena",
              "+ defragmenter", "MiB alloc", "MiB moved", "moved %", "defrags");
  std::printf("%-9s %9s %9s | %10s %10s | %10s %10s\n", "", "", "MiB", "served", "failed", "served", "failed");
  for (const auto& [name, r] : rows) {
    const double alloc_mib = static_cast<double>(r.defrag.bytes_allocated) / (1 << 20);
    const double moved_mib = static_cast<double>(r.defrag.bytes_moved) / (1 << 20);
    std::printf("%-9s %9zu %9.1f | %10zu %10zu | %10zu %10zu %12.1f %12.1f %7.1f%% %7zu\n", name.c_str(),
                r.arena.requests, static_cast<double>(r.peak_live) / (1 << 20), r.arena.served, r.arena.failed,
                r.defrag.served, r.defrag.failed, alloc_mib, moved_mib,
                alloc_mib > 0 ? 100.0 * moved_mib / alloc_mib : 0.0, r.defrag.defragmentations);
  }
  return 0;
}
