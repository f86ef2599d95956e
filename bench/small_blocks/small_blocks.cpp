// Workload W2 (issue 4): small blocks. A live set of 1,000 blocks, sizes log-uniform from 256 B to
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

#include <sys/mman.h>

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
#include <thrust/mr/pool.h>

#include <alloy/policy/size_class_pool.hpp>

namespace {

constexpr std::size_t live_blocks = 1'000;
constexpr std::size_t pairs = 1'000'000;
constexpr std::size_t alignment = 256;
constexpr std::size_t largest = std::size_t{64} << 10;
constexpr int repetitions = 7;

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

/// The alloy face of the counting upstream (page-aligned memory).
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
  std::vector<std::size_t> initial;   // sizes of the first live set
  std::vector<std::uint32_t> victim;  // per pair: which live slot is freed and refilled
  std::vector<std::size_t> size;      // per pair: the new size
  std::size_t peak_live = 0;
};

workload make_workload() {
  workload w;
  std::mt19937_64 rng(20261122);
  std::uniform_real_distribution<double> log_size(8.0, 16.0);  // 256 B .. 64 KiB
  auto draw = [&] { return static_cast<std::size_t>(std::exp2(log_size(rng))); };
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < live_blocks; ++i) {
    w.initial.push_back(draw());
    bytes += w.initial.back();
  }
  std::vector<std::size_t> current = w.initial;
  w.peak_live = bytes;
  w.victim.resize(pairs);
  w.size.resize(pairs);
  for (std::size_t i = 0; i < pairs; ++i) {
    w.victim[i] = static_cast<std::uint32_t>(rng() % live_blocks);
    w.size[i] = draw();
    bytes = bytes - current[w.victim[i]] + w.size[i];
    current[w.victim[i]] = w.size[i];
    w.peak_live = std::max(w.peak_live, bytes);
  }
  return w;
}

struct sample {
  std::vector<double> ns_per_pair;
  double reserved_over_live = 0;  // 0: not measured
  std::size_t upstream_calls = 0;
};

/// Everything one run of the program measures; lives in main (no globals).
struct bench_state {
  workload w = make_workload();
  std::map<std::string, sample> results;
};

/// Runs the workload through `alloc(bytes) -> void*` / `dealloc(p, bytes)`; returns ns per pair.
template <class Alloc, class Dealloc>
double run(const workload& w, Alloc&& alloc, Dealloc&& dealloc) {
  std::vector<void*> ptr(live_blocks);
  std::vector<std::size_t> sz = w.initial;
  for (std::size_t i = 0; i < live_blocks; ++i) ptr[i] = alloc(sz[i]);
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < pairs; ++i) {
    const std::uint32_t v = w.victim[i];
    dealloc(ptr[v], sz[v]);
    sz[v] = w.size[i];
    ptr[v] = alloc(sz[v]);
    benchmark::DoNotOptimize(ptr[v]);
  }
  const auto stop = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < live_blocks; ++i) dealloc(ptr[i], sz[i]);
  return std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(pairs);
}

void record(benchmark::State& state, bench_state& b, const std::string& name, double ns, const space* s) {
  state.SetIterationTime(ns * static_cast<double>(pairs) * 1e-9);
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

template <bool Growing>
void size_class_pool(benchmark::State& state, bench_state* b) {
  using pool_t = alloy::size_class_pool<counting_upstream>;
  for (auto _ : state) {
    space s;
    double ns = 0;
    {
      pool_t::options opts;
      if (Growing) opts.initial_slab_size = std::size_t{64} << 10;
      pool_t pool{counting_upstream{&s}, opts};
      ns = run(
          b->w, [&](std::size_t bytes) { return pool.allocate(bytes, alignment).ptr; },
          [&](void* p, std::size_t bytes) { pool.deallocate({p, bytes}); });
      if (pool.misuse_count() != 0 || pool.counters().num_ooms != 0) state.SkipWithError("pool failed");
    }
    record(state, *b, Growing ? "size_class_pool_64K" : "size_class_pool", ns, &s);
  }
}

void pmr_pool(benchmark::State& state, bench_state* b) {
  for (auto _ : state) {
    space s;
    double ns = 0;
    {
      counting_pmr_resource upstream{&s};
      std::pmr::unsynchronized_pool_resource pool{{.max_blocks_per_chunk = 0, .largest_required_pool_block = largest},
                                                  &upstream};
      ns = run(
          b->w, [&](std::size_t bytes) { return pool.allocate(bytes, alignment); },
          [&](void* p, std::size_t bytes) { pool.deallocate(p, bytes, alignment); });
    }
    record(state, *b, "std_pmr_pool", ns, &s);
  }
}

void thrust_pool(benchmark::State& state, bench_state* b) {
  using pool_t = thrust::mr::unsynchronized_pool_resource<counting_thrust_resource>;
  for (auto _ : state) {
    space s;
    double ns = 0;
    {
      counting_thrust_resource upstream{&s};
      auto opts = pool_t::get_default_options();
      opts.alignment = alignment;
      opts.largest_block_size = largest;
      pool_t pool{&upstream, opts};
      ns = run(
          b->w, [&](std::size_t bytes) { return pool.allocate(bytes, alignment); },
          [&](void* p, std::size_t bytes) { pool.deallocate(p, bytes, alignment); });
    }
    record(state, *b, "thrust_pool", ns, &s);
  }
}

void thrust_disjoint_pool(benchmark::State& state, bench_state* b) {
  using pool_t =
      thrust::mr::disjoint_unsynchronized_pool_resource<counting_thrust_resource, thrust::mr::new_delete_resource>;
  for (auto _ : state) {
    space s;
    double ns = 0;
    {
      counting_thrust_resource upstream{&s};
      thrust::mr::new_delete_resource bookkeeper;
      auto opts = pool_t::get_default_options();
      opts.alignment = alignment;
      opts.largest_block_size = largest;
      pool_t pool{&upstream, &bookkeeper, opts};
      ns = run(
          b->w, [&](std::size_t bytes) { return pool.allocate(bytes, alignment); },
          [&](void* p, std::size_t bytes) { pool.deallocate(p, bytes, alignment); });
    }
    record(state, *b, "thrust_disjoint_pool", ns, &s);
  }
}

void plain_malloc(benchmark::State& state, bench_state* b) {
  for (auto _ : state) {
    const double ns = run(
        b->w, [&](std::size_t bytes) { return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment); },
        [&](void* p, std::size_t) { std::free(p); });
    record(state, *b, "malloc", ns, nullptr);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
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
  std::printf("\nW2 summary: %zu live, sizes log-uniform 256 B-64 KiB, %zu pairs, alignment %zu; median of %d "
              "repetitions; ratios in this run\n",
              live_blocks, pairs, alignment, repetitions);
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
