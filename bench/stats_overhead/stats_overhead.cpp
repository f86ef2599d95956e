// stats_overhead: what stats<> adds to the time per allocate+deallocate pair (issue 5: at most 10%
// on W1 over default_allocator), measured in the same run, the two runs interleaved so that drift
// on a shared machine hits both alike.
//
// W1 (issue 3): 1,000 live blocks, sizes log-uniform from 256 B to 4 MiB, alignment 256, then a
// million pairs, each freeing a random live block and allocating a fresh size in its place. The
// memory comes from anonymous mmap (MAP_NORESERVE) and is never touched. Time: thread CPU time
// of the million pairs. Compositions: default_allocator and best_fit_arena, each bare and under
// stats<> (and stats<> with a memory_trace alive, which must cost nothing more).
//
//   stats_overhead [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <alloy/memory_stats.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/showcase.hpp>

namespace {

constexpr std::size_t pairs = 1'000'000;
constexpr std::size_t live = 1'000;
constexpr std::size_t alignment = 256;
constexpr int rounds = 7;

/// Address space from mmap; costs nothing until touched.
class mmap_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  alloy::block allocate(std::size_t bytes, std::size_t align) noexcept {
    if (align > 4096) return {};
    void* p = mmap(nullptr, bytes == 0 ? 1 : bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? alloy::block{} : alloy::block{p, bytes};
  }
  void deallocate(alloy::block b) noexcept { munmap(b.ptr, b.size == 0 ? 1 : b.size); }
  friend bool operator==(const mmap_upstream&, const mmap_upstream&) noexcept { return true; }
};

struct workload {
  std::vector<std::size_t> initial;
  std::vector<std::uint32_t> victim;
  std::vector<std::size_t> size;
};

workload make_workload() {
  workload w;
  std::mt19937_64 rng(20261122 + live);
  std::uniform_real_distribution<double> log_size(8.0, 22.0);
  auto draw = [&] { return static_cast<std::size_t>(std::exp2(log_size(rng))); };
  for (std::size_t i = 0; i < live; ++i) w.initial.push_back(draw());
  w.victim.resize(pairs);
  w.size.resize(pairs);
  for (std::size_t i = 0; i < pairs; ++i) {
    w.victim[i] = static_cast<std::uint32_t>(rng() % live);
    w.size[i] = draw();
  }
  return w;
}

double thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

/// One run of W1 through a fresh `A`; CPU ns per pair.
template <class A>
double run(const workload& w) {
  A a;
  std::vector<alloy::block> blocks(live);
  for (std::size_t i = 0; i < live; ++i) blocks[i] = a.allocate(w.initial[i], alignment);
  const double start = thread_cpu_ns();
  for (std::size_t i = 0; i < pairs; ++i) {
    const std::uint32_t v = w.victim[i];
    a.deallocate(blocks[v]);
    blocks[v] = a.allocate(w.size[i], alignment);
    benchmark::DoNotOptimize(blocks[v]);
  }
  const double stop = thread_cpu_ns();
  for (const alloy::block& b : blocks) a.deallocate(b);
  return (stop - start) / static_cast<double>(pairs);
}

/// The same with a memory_trace alive over the stats<> allocator.
template <class A>
double run_traced(const workload& w) {
  A a;
  alloy::memory_trace trace{a, {.silent = true}};
  std::vector<alloy::block> blocks(live);
  for (std::size_t i = 0; i < live; ++i) blocks[i] = a.allocate(w.initial[i], alignment);
  const double start = thread_cpu_ns();
  for (std::size_t i = 0; i < pairs; ++i) {
    const std::uint32_t v = w.victim[i];
    a.deallocate(blocks[v]);
    blocks[v] = a.allocate(w.size[i], alignment);
    benchmark::DoNotOptimize(blocks[v]);
  }
  const double stop = thread_cpu_ns();
  benchmark::DoNotOptimize(trace.peak_delta());
  for (const alloy::block& b : blocks) a.deallocate(b);
  return (stop - start) / static_cast<double>(pairs);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
  const workload w = make_workload();
  for (auto _ : state) {
    std::vector<double> bare, stats, traced;
    run<Bare>(w);  // warm up the page tables and caches
    for (int r = 0; r < rounds; ++r) {  // interleaved: drift hits all three alike
      bare.push_back(run<Bare>(w));
      stats.push_back(run<with_stats>(w));
      traced.push_back(run_traced<with_stats>(w));
    }
    const result out{name, median(bare), median(stats), median(traced)};
    state.SetIterationTime(out.stats * static_cast<double>(pairs) * 1e-9);
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
  std::printf("\nstats<> overhead on W1 (median of %d interleaved rounds, %zu pairs, CPU ns per pair)\n", rounds, pairs);
  std::printf("%-20s %10s %10s %10s %10s %12s\n", "composition", "bare", "stats<>", "+trace", "overhead", "with trace");
  for (const result& r : results())
    std::printf("%-20s %10.1f %10.1f %10.1f %9.1f%% %11.1f%%\n", r.name.c_str(), r.bare, r.stats, r.traced,
                100.0 * (r.stats / r.bare - 1.0), 100.0 * (r.traced / r.bare - 1.0));
  return 0;
}
