// Workload W1 (issue 3): a live set of N blocks (N = 1,000 for W1), sizes log-uniform from 256 B to
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
#include <benchmark/benchmark.h>

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory_resource>
#include <random>
#include <string>
#include <vector>

#include <thrust/mr/disjoint_pool.h>
#include <thrust/mr/memory_resource.h>
#include <thrust/mr/new.h>

#include <alloy/policy/best_fit_arena.hpp>

namespace {

constexpr std::size_t pairs = 1'000'000;
constexpr std::size_t alignment = 256;
constexpr int repetitions = 5;

// ---- the counting upstream ------------------------------------------------------------------------

struct space {
  std::size_t reserved = 0;
  std::size_t peak = 0;
  std::size_t calls = 0;
};

void* map_bytes(space& s, std::size_t bytes) {
  void* p = mmap(nullptr, bytes == 0 ? 1 : bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  s.reserved += bytes;
  s.peak = std::max(s.peak, s.reserved);
  ++s.calls;
  return p;
}
void unmap_bytes(space& s, void* p, std::size_t bytes) {
  munmap(p, bytes == 0 ? 1 : bytes);
  s.reserved -= bytes;
}

/// The alloy face of the counting upstream (alignment up to a page).
class counting_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  explicit counting_upstream(space* s) : space_(s) {}
  alloy::block allocate(std::size_t bytes, std::size_t align) noexcept {
    if (align > 4096) return {};
    return {map_bytes(*space_, bytes), bytes};
  }
  void deallocate(alloy::block b) noexcept { unmap_bytes(*space_, b.ptr, b.size); }

 private:
  space* space_;
};

/// The std::pmr face.
class counting_pmr_resource final : public std::pmr::memory_resource {
 public:
  explicit counting_pmr_resource(space* s) : space_(s) {}

 private:
  void* do_allocate(std::size_t bytes, std::size_t) override {
    void* p = map_bytes(*space_, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { unmap_bytes(*space_, p, bytes); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
  space* space_;
};

/// The thrust::mr face.
class counting_thrust_resource final : public thrust::mr::memory_resource<> {
 public:
  explicit counting_thrust_resource(space* s) : space_(s) {}
  void* do_allocate(std::size_t bytes, std::size_t) override {
    void* p = map_bytes(*space_, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { unmap_bytes(*space_, p, bytes); }

 private:
  space* space_;
};

// ---- the workload ---------------------------------------------------------------------------------

struct workload {
  std::vector<std::size_t> initial;  // sizes of the first live set
  std::vector<std::uint32_t> victim;  // per pair: which live slot is freed and refilled
  std::vector<std::size_t> size;      // per pair: the new size
  std::size_t peak_live = 0;
};

const workload& make_workload(std::size_t live) {
  static std::map<std::size_t, workload> cache;  // bench program only
  auto found = cache.find(live);
  if (found != cache.end()) return found->second;
  workload w;
  std::mt19937_64 rng(20261122 + live);
  std::uniform_real_distribution<double> log_size(8.0, 22.0);  // 256 B .. 4 MiB
  auto draw = [&] { return static_cast<std::size_t>(std::exp2(log_size(rng))); };
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < live; ++i) {
    w.initial.push_back(draw());
    bytes += w.initial.back();
  }
  std::vector<std::size_t> current = w.initial;
  w.peak_live = bytes;
  w.victim.resize(pairs);
  w.size.resize(pairs);
  for (std::size_t i = 0; i < pairs; ++i) {
    w.victim[i] = static_cast<std::uint32_t>(rng() % live);
    w.size[i] = draw();
    bytes = bytes - current[w.victim[i]] + w.size[i];
    current[w.victim[i]] = w.size[i];
    w.peak_live = std::max(w.peak_live, bytes);
  }
  return cache.emplace(live, std::move(w)).first->second;
}

struct sample {
  std::vector<double> ns_per_pair;
  double reserved_over_live = 0;
};
std::map<std::string, std::map<std::size_t, sample>>& results() {
  static std::map<std::string, std::map<std::size_t, sample>> r;  // bench program only
  return r;
}

/// CPU time of this thread: the machine is shared, so wall time also counts other people's work.
double thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

/// Runs the workload through `alloc(bytes) -> void*` / `dealloc(p, bytes)`; returns CPU ns per pair.
template <class Alloc, class Dealloc>
double run(const workload& w, Alloc&& alloc, Dealloc&& dealloc) {
  const std::size_t live = w.initial.size();
  std::vector<void*> ptr(live);
  std::vector<std::size_t> sz = w.initial;
  for (std::size_t i = 0; i < live; ++i) ptr[i] = alloc(sz[i]);
  const double start = thread_cpu_ns();
  for (std::size_t i = 0; i < pairs; ++i) {
    const std::uint32_t v = w.victim[i];
    dealloc(ptr[v], sz[v]);
    sz[v] = w.size[i];
    ptr[v] = alloc(sz[v]);
    benchmark::DoNotOptimize(ptr[v]);
  }
  const double stop = thread_cpu_ns();
  for (std::size_t i = 0; i < live; ++i) dealloc(ptr[i], sz[i]);
  return (stop - start) / static_cast<double>(pairs);
}

void record(benchmark::State& state, const std::string& name, std::size_t live, double ns, const space& s,
            const workload& w) {
  state.SetIterationTime(ns * static_cast<double>(pairs) * 1e-9);
  const double ratio = static_cast<double>(s.peak) / static_cast<double>(w.peak_live);
  state.counters["ns_per_pair"] = ns;
  state.counters["reserved_over_live"] = ratio;
  state.counters["upstream_calls"] = static_cast<double>(s.calls);
  sample& out = results()[name][live];
  out.ns_per_pair.push_back(ns);
  out.reserved_over_live = ratio;
}

// ---- the contenders ---------------------------------------------------------------------------------

void best_fit_arena(benchmark::State& state) {
  const std::size_t live = static_cast<std::size_t>(state.range(0));
  const workload& w = make_workload(live);
  for (auto _ : state) {
    space s;
    double ns = 0;
    {
      alloy::best_fit_arena<counting_upstream> arena{counting_upstream{&s}};
      ns = run(
          w, [&](std::size_t bytes) { return arena.allocate(bytes, alignment).ptr; },
          [&](void* p, std::size_t bytes) { arena.deallocate({p, bytes}); });
      if (arena.misuses().total() != 0 || arena.counters().num_ooms != 0) state.SkipWithError("arena failed");
    }
    record(state, "best_fit_arena", live, ns, s, w);
  }
}

template <std::size_t LargestBlock>
void thrust_disjoint_pool(benchmark::State& state) {
  const std::size_t live = static_cast<std::size_t>(state.range(0));
  const workload& w = make_workload(live);
  for (auto _ : state) {
    space s;
    double ns = 0;
    {
      counting_thrust_resource upstream{&s};
      thrust::mr::new_delete_resource bookkeeper;
      auto opts = thrust::mr::disjoint_unsynchronized_pool_resource<counting_thrust_resource,
                                                                   thrust::mr::new_delete_resource>::get_default_options();
      opts.alignment = alignment;
      opts.largest_block_size = LargestBlock;
      thrust::mr::disjoint_unsynchronized_pool_resource<counting_thrust_resource, thrust::mr::new_delete_resource> pool{
          &upstream, &bookkeeper, opts};
      ns = run(
          w, [&](std::size_t bytes) { return pool.allocate(bytes, alignment); },
          [&](void* p, std::size_t bytes) { pool.deallocate(p, bytes, alignment); });
    }
    record(state, "thrust_disjoint_" + std::to_string(LargestBlock >> 20) + "MiB", live, ns, s, w);
  }
}

void pmr_pool(benchmark::State& state) {
  const std::size_t live = static_cast<std::size_t>(state.range(0));
  const workload& w = make_workload(live);
  for (auto _ : state) {
    space s;
    double ns = 0;
    {
      counting_pmr_resource upstream{&s};
      std::pmr::unsynchronized_pool_resource pool{{.max_blocks_per_chunk = 0, .largest_required_pool_block = 4 << 20},
                                                  &upstream};
      ns = run(
          w, [&](std::size_t bytes) { return pool.allocate(bytes, alignment); },
          [&](void* p, std::size_t bytes) { pool.deallocate(p, bytes, alignment); });
    }
    record(state, "std_pmr_pool_4MiB", live, ns, s, w);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void print_summary() {
  auto& r = results();
  std::printf("\nW1 summary (median of %d repetitions, %zu pairs, alignment %zu, CPU ns; ratios in this run)\n", repetitions,
              pairs, alignment);
  std::printf("%-22s %8s %10s %14s %14s %16s\n", "allocator", "live", "ns/pair", "vs disjoint1M", "vs disjoint4M",
              "reserved/live");
  for (const auto& [name, by_live] : r) {
    for (const auto& [live, s] : by_live) {
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
  const auto arena = r.find("best_fit_arena");
  if (arena != r.end() && arena->second.count(100) && arena->second.count(100000)) {
    std::printf("best_fit_arena time per pair, 10^5 live / 10^2 live: %.2fx\n",
                median(arena->second.at(100000).ns_per_pair) / median(arena->second.at(100).ns_per_pair));
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
