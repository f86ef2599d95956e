// SPDX-License-Identifier: Apache-2.0
// Workload W2: small blocks. A live set of 1,000 blocks, sizes log-uniform from 256 B to
// 64 KiB, alignment 256; then a million pairs, each freeing a random live block and allocating a
// new one of a fresh random size in its place. The memory is never touched by the workload.
//
// Allocators, each over the same counting upstream (anonymous mmap with MAP_NORESERVE: address
// space that costs nothing until a page is written; it counts bytes reserved, their peak and the
// calls):
//   - alloy::size_class_pool, default options (2 MiB slabs, classes 256 B .. 1 MiB, 4 per octave);
//   - alloy::size_class_pool with 64 KiB first slabs doubling up to 2 MiB (fewer idle bytes);
//   - std::pmr::unsynchronized_pool_resource, largest_required_pool_block 64 KiB;
//   - thrust::mr::unsynchronized_pool_resource, alignment 256, largest block 64 KiB;
//   - thrust::mr::disjoint_unsynchronized_pool_resource, alignment 256, largest block 64 KiB
//     (bookkeeping from new/delete);
//   - plain malloc/free (aligned_alloc), time only, as context.
// Figures per run: ns per pair (the timed part is the million pairs only), peak reserved ÷ peak
// live, upstream calls. Each is repeated; the table printed after Google Benchmark's output gives
// medians and the ratio of each allocator's time against the fastest peer's in the same process.
//
//   small_blocks
//   small_blocks --benchmark_filter=size_class_pool
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory_resource>
#include <string>
#include <vector>

#include <thrust/mr/pool.h>

#include <alloy/policy/size_class_pool.hpp>

#include "support/counting_upstream.hpp"
#include "support/pairs_workload.hpp"

namespace {

using namespace alloy::bench;

constexpr std::size_t alignment = 256;
constexpr std::size_t largest = std::size_t{64} << 10;
constexpr int repetitions = 7;
constexpr workload_params w2 = {
    .live_blocks = 1'000, .pairs = 1'000'000, .log2_smallest = 8, .log2_largest = 16, .seed = 20261122};

struct sample {
  std::vector<double> ns_per_pair;
  double reserved_over_live = 0;  // 0: not measured
  std::size_t upstream_calls = 0;
};

/// Everything one run of the program measures; lives in main (no globals).
struct bench_state {
  workload w = make_workload(w2);
  std::map<std::string, sample> results;
};

void record(benchmark::State& state, bench_state& b, const std::string& name, double ns, const space* s) {
  state.SetIterationTime(ns * static_cast<double>(b.w.pairs()) * 1e-9);
  state.counters["ns_per_pair"] = ns;
  sample& out = b.results[name];
  out.ns_per_pair.push_back(ns);
  if (s != nullptr) {
    const double ratio = static_cast<double>(s->peak) / static_cast<double>(b.w.peak_live);
    state.counters["reserved_over_live"] = ratio;
    state.counters["upstream_calls"] = static_cast<double>(s->calls);
    out.reserved_over_live = ratio;
    out.upstream_calls = s->calls;
  }
}

// ---- the contenders ---------------------------------------------------------------------------------

/// W2 has been timed in wall time from the start; kept so that its figures stay comparable.
using wall_clock = std::chrono::steady_clock;

/// One run per iteration: `run_one(space&)` builds a fresh allocator over a counted upstream,
/// runs the workload through it and returns ns per pair; the figures are recorded once it is gone.
template <class RunOne>
void measure(benchmark::State& state, bench_state& b, const std::string& name, RunOne run_one) {
  for (auto _ : state) {
    space s;
    const double ns = run_one(s);
    record(state, b, name, ns, &s);
  }
}

template <bool Growing>
void size_class_pool(benchmark::State& state, bench_state* b) {
  using pool_t = alloy::size_class_pool<counting_upstream>;
  measure(state, *b, Growing ? "size_class_pool_64K" : "size_class_pool", [&](space& s) {
    pool_t::options opts;
    if (Growing) opts.initial_slab_size = std::size_t{64} << 10;
    pool_t pool{counting_upstream{&s}, opts};
    const double ns = run_pairs_on<wall_clock>(b->w, pool, alignment);
    if (pool.misuse_count() != 0 || pool.counters().num_ooms != 0) state.SkipWithError("pool failed");
    return ns;
  });
}

void pmr_pool(benchmark::State& state, bench_state* b) {
  measure(state, *b, "std_pmr_pool", [&](space& s) {
    counting_pmr_resource upstream{&s};
    std::pmr::unsynchronized_pool_resource pool{{.max_blocks_per_chunk = 0, .largest_required_pool_block = largest},
                                                &upstream};
    return run_pairs_on<wall_clock>(b->w, pool, alignment);
  });
}

void thrust_pool(benchmark::State& state, bench_state* b) {
  using pool_t = thrust::mr::unsynchronized_pool_resource<counting_thrust_resource>;
  measure(state, *b, "thrust_pool", [&](space& s) {
    counting_thrust_resource upstream{&s};
    auto opts = pool_t::get_default_options();
    opts.alignment = alignment;
    opts.largest_block_size = largest;
    pool_t pool{&upstream, opts};
    return run_pairs_on<wall_clock>(b->w, pool, alignment);
  });
}

void thrust_disjoint_pool(benchmark::State& state, bench_state* b) {
  measure(state, *b, "thrust_disjoint_pool", [&](space& s) {
    counted_thrust_disjoint_pool peer{&s, alignment, largest};
    return run_pairs_on<wall_clock>(b->w, peer.pool, alignment);
  });
}

/// Time only: no upstream to count.
void plain_malloc(benchmark::State& state, bench_state* b) {
  for (auto _ : state) {
    const double ns = run_pairs<wall_clock>(
        b->w,
        [&](std::size_t bytes) {
          return alloy::block{std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment), bytes};
        },
        [&](alloy::block blk) { std::free(blk.ptr); });
    record(state, *b, "malloc", ns, nullptr);
  }
}

void print_summary(const bench_state& b) {
  const char* peers[] = {"std_pmr_pool", "thrust_pool", "thrust_disjoint_pool"};
  std::string fastest;
  double fastest_ns = 0;
  for (const char* peer : peers) {
    const auto found = b.results.find(peer);
    if (found == b.results.end()) continue;
    const double ns = median(found->second.ns_per_pair);
    if (fastest.empty() || ns < fastest_ns) fastest = peer, fastest_ns = ns;
  }
  std::printf(
      "\nW2 summary: %zu live, sizes log-uniform 256 B-64 KiB, %zu pairs, alignment %zu; median of %d "
      "repetitions; ratios in this run\n",
      w2.live_blocks, w2.pairs, alignment, repetitions);
  std::printf("fastest peer: %s\n", fastest.empty() ? "-" : fastest.c_str());
  std::printf("%-22s %10s %16s %16s %15s\n", "allocator", "ns/pair", "speed-up vs peer", "reserved/live",
              "upstream calls");
  for (const auto& [name, s] : b.results) {
    const double ns = median(s.ns_per_pair);
    char speedup[32] = "-";
    if (!fastest.empty()) std::snprintf(speedup, sizeof speedup, "%.2fx", fastest_ns / ns);
    char ratio[32] = "-";
    if (s.reserved_over_live > 0) std::snprintf(ratio, sizeof ratio, "%.3f", s.reserved_over_live);
    char calls[32] = "-";
    if (s.reserved_over_live > 0) std::snprintf(calls, sizeof calls, "%zu", s.upstream_calls);
    std::printf("%-22s %10.1f %16s %16s %15s\n", name.c_str(), ns, speedup, ratio, calls);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench_state state;
  auto configure = [](benchmark::internal::Benchmark* b) {
    b->Iterations(1)->Repetitions(repetitions)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  configure(benchmark::RegisterBenchmark("W2/size_class_pool", size_class_pool<false>, &state));
  configure(benchmark::RegisterBenchmark("W2/size_class_pool_64K", size_class_pool<true>, &state));
  configure(benchmark::RegisterBenchmark("W2/std_pmr_pool", pmr_pool, &state));
  configure(benchmark::RegisterBenchmark("W2/thrust_pool", thrust_pool, &state));
  configure(benchmark::RegisterBenchmark("W2/thrust_disjoint_pool", thrust_disjoint_pool, &state));
  configure(benchmark::RegisterBenchmark("W2/malloc", plain_malloc, &state));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary(state);
  return 0;
}
