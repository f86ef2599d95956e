// SPDX-License-Identifier: Apache-2.0
// stats_overhead: what stats<> adds to the time per allocate+deallocate pair (the target: at most
// 10% on W1 over default_allocator), measured in the same run, the two runs interleaved so that
// drift on a shared machine hits both alike.
//
// W1: 1,000 live blocks, sizes log-uniform from 256 B to 4 MiB, alignment 256, then a
// million pairs, each freeing a random live block and allocating a fresh size in its place. The
// memory comes from anonymous mmap (MAP_NORESERVE) and is never touched. Time: thread CPU time
// of the million pairs. Compositions: default_allocator and best_fit_arena, each bare and under
// stats<> (and stats<> with a memory_trace alive, which must cost nothing more).
//
//   stats_overhead [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <vector>

#include <alloy/memory_stats.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/showcase.hpp>

#include "support/counting_upstream.hpp"
#include "support/pairs_workload.hpp"

namespace {

using namespace alloy::bench;

constexpr std::size_t alignment = 256;
constexpr int rounds = 7;

/// One run of W1 through a fresh `A`; CPU ns per pair.
template <class A>
double run(const workload& w) {
  A a;
  return run_pairs_on<thread_cpu_clock>(w, a, alignment);
}

/// The same with a memory_trace alive over the stats<> allocator.
template <class A>
double run_traced(const workload& w) {
  A a;
  alloy::memory_trace trace{a, {.silent = true}};
  const double ns = run_pairs_on<thread_cpu_clock>(w, a, alignment);
  benchmark::DoNotOptimize(trace.peak_delta());
  return ns;
}

struct result {
  std::string name;
  double bare = 0, stats = 0, traced = 0;
};
std::vector<result>& results() {
  static std::vector<result> r;  // bench program only
  return r;
}

template <class Bare>
void overhead(benchmark::State& state, const char* name) {
  using with_stats = alloy::stats<Bare>;
  const workload w = make_workload(w1_params());
  for (auto _ : state) {
    std::vector<double> bare, stats, traced;
    run<Bare>(w);                       // warm up the page tables and caches
    for (int r = 0; r < rounds; ++r) {  // interleaved: drift hits all three alike
      bare.push_back(run<Bare>(w));
      stats.push_back(run<with_stats>(w));
      traced.push_back(run_traced<with_stats>(w));
    }
    const result out{name, median(bare), median(stats), median(traced)};
    state.SetIterationTime(out.stats * static_cast<double>(w.pairs()) * 1e-9);
    state.counters["bare_ns_per_pair"] = out.bare;
    state.counters["stats_ns_per_pair"] = out.stats;
    state.counters["traced_ns_per_pair"] = out.traced;
    state.counters["overhead_pct"] = 100.0 * (out.stats / out.bare - 1.0);
    results().push_back(out);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("W1/default_allocator", overhead<alloy::default_allocator<mmap_upstream>>,
                               "default_allocator")
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("W1/best_fit_arena", overhead<alloy::best_fit_arena<mmap_upstream>>, "best_fit_arena")
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\nstats<> overhead on W1 (median of %d interleaved rounds, %zu pairs, CPU ns per pair)\n", rounds,
              w1_params().pairs);
  std::printf("%-20s %10s %10s %10s %10s %12s\n", "composition", "bare", "stats<>", "+trace", "overhead", "with trace");
  for (const result& r : results())
    std::printf("%-20s %10.1f %10.1f %10.1f %9.1f%% %11.1f%%\n", r.name.c_str(), r.bare, r.stats, r.traced,
                100.0 * (r.stats / r.bare - 1.0), 100.0 * (r.traced / r.bare - 1.0));
  return 0;
}
