// SPDX-License-Identifier: Apache-2.0
// Workload W1: a live set of N blocks (N = 1,000 for W1), sizes log-uniform from 256 B to
// 4 MiB, alignment 256; then a million pairs, each freeing a random live block and allocating a
// new one of a fresh random size in its place. The memory is never touched by the workload.
//
// Allocators, each over the same counting upstream (anonymous mmap with MAP_NORESERVE: address
// space that costs nothing until a page is written; it counts bytes reserved and their peak):
//   - alloy::best_fit_arena, default options;
//   - thrust::mr::disjoint_unsynchronized_pool_resource, alignment 256, largest block 1 MiB, and 4 MiB;
//   - std::pmr::unsynchronized_pool_resource, largest_required_pool_block 4 MiB.
// Figures per run: ns per pair (thread CPU time of the million pairs only; the machine is shared) and peak reserved ÷
// peak live. Each is repeated; the table printed after Google Benchmark's output gives medians
// and the ratios against the thrust disjoint pools measured in the same process.
//
//   random_allocations                       # W1 and the sweep over 10^2 .. 10^5 live blocks
//   random_allocations --benchmark_filter=/1000/   # W1 only
//
// After the sweep it prints each swept allocator's growth from 10^2 to 10^5 live blocks and what
// a dependent random load costs on this machine by working-set size (support/load_latency.hpp):
// at 10^5 the bookkeeping outgrows the caches, and that latency decides the figure.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory_resource>
#include <string>
#include <vector>

#include <alloy/policy/best_fit_arena.hpp>

#include "support/counting_upstream.hpp"
#include "support/load_latency.hpp"
#include "support/pairs_workload.hpp"

namespace {

using namespace alloy::bench;

constexpr std::size_t alignment = 256;
constexpr int repetitions = 5;

/// One workload per live-set size, made on first use and shared by all the contenders.
const workload& workload_for(std::size_t live) {
  static std::map<std::size_t, workload> cache;  // bench program only
  auto found = cache.find(live);
  if (found == cache.end()) found = cache.emplace(live, make_workload(w1_params(live))).first;
  return found->second;
}

struct sample {
  std::vector<double> ns_per_pair;
  double reserved_over_live = 0;
};
std::map<std::string, std::map<std::size_t, sample>>& results() {
  static std::map<std::string, std::map<std::size_t, sample>> r;  // bench program only
  return r;
}

void record(benchmark::State& state, const std::string& name, std::size_t live, double ns, const space& s,
            const workload& w) {
  state.SetIterationTime(ns * static_cast<double>(w.pairs()) * 1e-9);
  const double ratio = static_cast<double>(s.peak) / static_cast<double>(w.peak_live);
  state.counters["ns_per_pair"] = ns;
  state.counters["reserved_over_live"] = ratio;
  state.counters["upstream_calls"] = static_cast<double>(s.calls);
  sample& out = results()[name][live];
  out.ns_per_pair.push_back(ns);
  out.reserved_over_live = ratio;
}

// ---- the contenders ---------------------------------------------------------------------------------

/// One run per iteration: `run_one(space&, w)` builds a fresh allocator over a counted upstream,
/// runs `w` through it and returns ns per pair; the figures are recorded once it is gone.
template <class RunOne>
void measure(benchmark::State& state, const std::string& name, RunOne run_one) {
  const std::size_t live = static_cast<std::size_t>(state.range(0));
  const workload& w = workload_for(live);
  for (auto _ : state) {
    space s;
    const double ns = run_one(s, w);
    record(state, name, live, ns, s, w);
  }
}

void best_fit_arena(benchmark::State& state) {
  measure(state, "best_fit_arena", [&](space& s, const workload& w) {
    alloy::best_fit_arena<counting_upstream> arena{counting_upstream{&s}};
    const double ns = run_pairs_on<thread_cpu_clock>(w, arena, alignment);
    if (arena.misuses().total() != 0 || arena.counters().num_ooms != 0) state.SkipWithError("arena failed");
    return ns;
  });
}

template <std::size_t LargestBlock>
void thrust_disjoint_pool(benchmark::State& state) {
  measure(state, "thrust_disjoint_" + std::to_string(LargestBlock >> 20) + "MiB", [](space& s, const workload& w) {
    counted_thrust_disjoint_pool peer{&s, alignment, LargestBlock};
    return run_pairs_on<thread_cpu_clock>(w, peer.pool, alignment);
  });
}

void pmr_pool(benchmark::State& state) {
  measure(state, "std_pmr_pool_4MiB", [](space& s, const workload& w) {
    counting_pmr_resource upstream{&s};
    std::pmr::unsynchronized_pool_resource pool{{.max_blocks_per_chunk = 0, .largest_required_pool_block = 4 << 20},
                                                &upstream};
    return run_pairs_on<thread_cpu_clock>(w, pool, alignment);
  });
}

void print_summary() {
  auto& r = results();
  std::printf("\nW1 summary (median of %d repetitions, %zu pairs, alignment %zu, CPU ns; ratios in this run)\n",
              repetitions, w1_params().pairs, alignment);
  std::printf("%-22s %8s %10s %14s %14s %16s\n", "allocator", "live", "ns/pair", "vs disjoint1M", "vs disjoint4M",
              "reserved/live");
  for (const auto& [name, by_live] : r) {
    for (const auto& [live_count, s] : by_live) {
      const std::size_t live = live_count;  // a plain variable: clang 14 cannot capture a binding
      const double ns = median(s.ns_per_pair);
      auto ratio = [&](const char* peer) -> std::string {
        const auto p = r.find(peer);
        if (p == r.end() || p->second.count(live) == 0) return "-";
        char text[32];
        std::snprintf(text, sizeof text, "%.2fx", ns / median(p->second.at(live).ns_per_pair));
        return text;
      };
      std::printf("%-22s %8zu %10.1f %14s %14s %16.3f\n", name.c_str(), live, ns, ratio("thrust_disjoint_1MiB").c_str(),
                  ratio("thrust_disjoint_4MiB").c_str(), s.reserved_over_live);
    }
  }
  // The sweep's target is the arena's growth; the peers' growth in the same run says how much of
  // it is the machine's memory rather than the allocator.
  for (const auto& [name, by_live] : r) {
    if (by_live.count(100) == 0 || by_live.count(100000) == 0) continue;
    std::printf("%s time per pair, 10^5 live / 10^2 live: %.2fx\n", name.c_str(),
                median(by_live.at(100000).ns_per_pair) / median(by_live.at(100).ns_per_pair));
  }
  if (r.count("best_fit_arena") != 0 && r.at("best_fit_arena").count(100000) != 0) {
    std::printf("this machine, ns per dependent random load by working set:");
    for (const auto& [kib, ns] : load_latency_profile()) std::printf("  %zu KiB %.0f", kib, ns);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto configure = [](benchmark::internal::Benchmark* b, bool sweep) {
    if (sweep) {
      b->Arg(100)->Arg(1000)->Arg(10000)->Arg(100000);
    } else {
      b->Arg(1000);
    }
    b->Iterations(1)->Repetitions(repetitions)->UseManualTime()->Unit(benchmark::kMillisecond);
    b->ReportAggregatesOnly(false);
  };
  configure(benchmark::RegisterBenchmark("W1/best_fit_arena", best_fit_arena), true);
  configure(benchmark::RegisterBenchmark("W1/thrust_disjoint_1MiB", thrust_disjoint_pool<std::size_t{1} << 20>), false);
  configure(benchmark::RegisterBenchmark("W1/thrust_disjoint_4MiB", thrust_disjoint_pool<std::size_t{4} << 20>), true);
  configure(benchmark::RegisterBenchmark("W1/std_pmr_pool_4MiB", pmr_pool), true);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
