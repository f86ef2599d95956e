// SPDX-License-Identifier: Apache-2.0
// Virtual memory on a real device: what bench/virtual_memory measures on simulated devices, with
// the driver's calls paid for. Needs a CUDA device; without one it says so and exits 0.
//
//   virtual_memory_gpu calls                       # what each driver call costs here, per 2 MiB granule
//   virtual_memory_gpu w1 [SEEDS [PAIRS [FIRST]]]  # W1 (1,000 live, 256 B-4 MiB): SEEDS seeds (3) from
//                                                  # seed number FIRST (0), PAIRS pairs (100,000)
//   virtual_memory_gpu traces TRACE...             # alloy-replay's trace files (RMM CSV, MiniMalloc)
//   virtual_memory_gpu offload [SEEDS]             # a sleep / wake cycle, default 3 seeds
//   virtual_memory_gpu --rounds N w1|traces ...    # N rounds of the peers' turns (default 7)
//
// Peers, one process, one device, each on a fresh allocator per run:
//   cudaMalloc per request   one cudaMalloc / cudaFree per request (cuda_malloc_upstream)
//   cudaMallocAsync          its own memory pool, release threshold unlimited (how frameworks run
//                            it), requests and frees on one stream, no synchronization
//   default_allocator        alloy's pooled composition over cudaMalloc
//   virtual_allocator        alloy's composition over cuda_vmm (cuMemCreate / cuMemMap, 2 MiB
//                            granules, block-sized pieces: a block's run of unmapped granules in
//                            one piece, with frontier growth: 1/32 of the mapped granules more,
//                            at least two while the device is at most 1/128 full, while it is
//                            at most 1/16 full), the same without frontier growth and with
//                            one piece per granule of 16 MiB (`options.arena.granularity`)
// Figures: ns per operation (wall clock, the driver's time included) of a cold pass (a fresh
// allocator) and of a warm one (the same workload again on the same allocator, all blocks of the
// first pass freed: a training loop's second step), device memory ÷ peak live (the peak of what
// cudaMemGetInfo says is taken beyond the baseline, sampled after every request of both passes in
// an untimed run; the driver's own rounding included) and driver calls per 1,000 operations of the
// cold pass where they are counted (virtual_allocator: cuMemCreate, cuMemMap, cuMemUnmap,
// cuMemRelease, each map's cuMemSetAccess not counted; default_allocator: cudaMalloc, cudaFree),
// then virtual_allocator's ratios to default_allocator over the workloads. The peers take turns:
// each of 7 rounds (`--rounds`) runs every peer once, starting one peer later each round, so that
// the machine's drift falls on all alike (W1's passes last milliseconds; run one after another, a
// peer's three runs and its neighbour's read 0.7-1.6x apart on an H200). Times are the median over
// the rounds, a ratio the median of its rounds' ratios; cudaMalloc per request, 100-1000x slower
// than the rest, is timed in the first round only.
//
// offload: `virtual_memory offload`'s sleep / wake cycle (bench/support/sleep_wake_workload.hpp)
// through virtual_allocator<cuda_vmm>: ms of each phase (allocate the weights, tag 1, and the
// cache, tag 2; offload the weights to pinned host memory, the arena's default over cuda_vmm;
// discard the cache; restore each) and the creates + maps of allocate and restore, with
// block-sized pieces and with a piece per 2 MiB granule; median of 3 cycles. Beside them, the
// copies alone: pinned host memory allocated and the weights' bytes copied out of one cudaMalloc,
// then back in and the host memory freed. Every weight byte is checked after the restore.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <alloy/showcase.hpp>
#include <alloy/upstream/cuda_malloc_upstream.hpp>
#include <alloy/vmm/cuda_vmm.hpp>

#include "support/gpu_replay.hpp"
#include "support/sleep_wake_workload.hpp"

namespace {

using namespace alloy;
using namespace alloy::bench::gpu;

/// One cudaMalloc / cudaFree per request, each counted as a driver call.
struct cuda_malloc_peer {
  cuda_malloc_upstream up;
  std::size_t calls = 0;
  block allocate(std::size_t n) {
    ++calls;
    return up.allocate(n, alignment);
  }
  void deallocate(block b) {
    ++calls;
    up.deallocate(b);
  }
  std::size_t driver_calls() const { return calls; }
  void finish() {}
};

using default_peer = alloy_peer<default_allocator<cuda_malloc_upstream>>;
using virtual_peer = alloy_peer<virtual_allocator<cuda_vmm>>;

/// virtual_allocator with block-sized pieces but no frontier growth.
struct virtual_no_frontier_peer : alloy_peer<virtual_allocator<cuda_vmm>> {
  virtual_no_frontier_peer() : alloy_peer{virtual_allocator<cuda_vmm>{cuda_vmm{}, options()}} {}
  static virtual_allocator<cuda_vmm>::options options() {
    virtual_allocator<cuda_vmm>::options o;
    o.arena.frontier_growth_divisor = 0;
    return o;
  }
};

/// virtual_allocator with one physical piece per granule of `MiB` (`options.arena.granularity`,
/// block-sized pieces off): the larger, the fewer driver calls (each create and map costs about
/// the same whatever its size), free memory given back a granule at a time.
template <std::size_t MiB>
struct virtual_granule_pieces_peer : alloy_peer<virtual_allocator<cuda_vmm>> {
  virtual_granule_pieces_peer() : alloy_peer{virtual_allocator<cuda_vmm>{cuda_vmm{}, options()}} {}
  static virtual_allocator<cuda_vmm>::options options() {
    virtual_allocator<cuda_vmm>::options o;
    o.arena.granularity = MiB << 20;
    o.arena.block_sized_pieces = false;
    return o;
  }
};

/// The peers in the order they are printed; `default_index` is the baseline of the ratios and
/// the three after it are virtual_allocator's variants.
constexpr peer_kind peers[] = {
    {"cudaMalloc per request", run_once<cuda_malloc_peer>, true, false},
    {"cudaMallocAsync", run_once<cuda_async_peer>, false, true},
    {"default_allocator", run_once<default_peer>, true, true},
    {"virtual_allocator", run_once<virtual_peer>, true, true},
    {"virtual_allocator, no frontier growth", run_once<virtual_no_frontier_peer>, true, true},
    {"virtual_allocator, a piece per 16 MiB granule", run_once<virtual_granule_pieces_peer<16>>, true, true},
};
constexpr std::size_t peer_count = std::size(peers), default_index = 2, variants = 3;

/// Ratios of virtual_allocator's variants to default_allocator, per workload: time the median
/// of each round's ratio (the two ran side by side), device memory the sampled runs'.
struct ratios {
  std::vector<double> cold[variants], warm[variants], memory[variants];
};

void header() {
  std::printf(
      "| workload | peak live | peer | ns/op cold | ns/op warm | device memory ÷ peak live | driver calls / 1k ops |\n"
      "|---|---:|---|---:|---:|---:|---:|\n");
}

void print(const std::string& workload, const std::string& live, const peer_kind& peer, const figures& f) {
  std::printf("| %s | %s | %s | %.0f | %.0f | %.3f | ", workload.c_str(), live.c_str(), peer.name, f.cold, f.warm,
              f.memory);
  if (peer.counts_calls) {
    std::printf("%.1f |", f.calls_per_1k);
  } else {
    std::printf("|");
  }
  if (f.failed != 0) std::printf(" %zu requests failed", f.failed);
  std::printf("\n");
}

void row(const std::string& name, const workload& w, int rounds, ratios& r) {
  char live[32];
  std::snprintf(live, sizeof live, "%.1f MiB", static_cast<double>(w.peak_live) / (1 << 20));
  const measured m = measure(peers, w, rounds);
  for (std::size_t k = 0; k < peer_count; ++k) print(k == 0 ? name : "", k == 0 ? live : "", peers[k], m.median[k]);
  for (std::size_t v = 0; v < variants; ++v) {
    const std::size_t k = default_index + 1 + v;
    r.cold[v].push_back(paired_ratio(m.runs[k], m.runs[default_index], &figures::cold));
    r.warm[v].push_back(paired_ratio(m.runs[k], m.runs[default_index], &figures::warm));
    r.memory[v].push_back(m.median[k].memory / m.median[default_index].memory);
  }
  std::fflush(stdout);
}

void summary(const ratios& r) {
  const auto spread = [](const std::vector<double>& v) {
    std::printf("%.2f (%.2f-%.2f)", geomean(v), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  };
  std::printf("\nvirtual_allocator ÷ default_allocator, geometric mean (range) over the workloads:\n");
  const char* pieces[] = {"block-sized pieces with frontier growth (default)", "no frontier growth",
                          "a piece per 16 MiB granule"};
  for (std::size_t k = 0; k < variants; ++k) {
    std::printf("- %s: time cold ", pieces[k]);
    spread(r.cold[k]);
    std::printf(", warm ");
    spread(r.warm[k]);
    std::printf(", device memory ");
    spread(r.memory[k]);
    std::printf("\n");
  }
}

/// Microseconds per call of `body(i)` for i in [0, n).
template <class F>
double us_per(std::size_t n, F&& body) {
  const auto start = clock_type::now();
  for (std::size_t i = 0; i < n; ++i) body(i);
  return std::chrono::duration<double, std::micro>(clock_type::now() - start).count() / static_cast<double>(n);
}

template <class Fn>
Fn driver_entry(const char* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found), symbol);
  return reinterpret_cast<Fn>(address);
}

/// What each call costs on this device, for `count` granules mapped side by side: cuda_vmm's
/// calls as the arena makes them, the driver's map and access calls apart, pieces of 16
/// granules, and cudaMalloc / cudaFree of the same sizes.
int calls(std::size_t count) {
  cuda_vmm v;
  if (!v.valid()) {
    std::printf("cuda_vmm could not start\n");
    return 1;
  }
  const std::size_t g = v.granularity();
  const address_range range = v.reserve(count * g);
  auto at = [&](std::size_t i) { return static_cast<char*>(range.ptr) + i * g; };
  std::vector<physical_memory> pieces(count);
  std::printf("granularity %zu KiB, %zu granules\n\n| call | µs per call | µs per granule |\n|---|---:|---:|\n",
              g >> 10, count);
  auto line = [](const char* what, double per_call, double granules_per_call) {
    std::printf("| %s | %.2f | %.2f |\n", what, per_call, per_call / granules_per_call);
  };
  line("cuda_vmm create (cuMemCreate, 1 granule)", us_per(count, [&](std::size_t i) { pieces[i] = v.create(g); }), 1);
  line("cuda_vmm map (cuMemMap + cuMemSetAccess)", us_per(count, [&](std::size_t i) { v.map(at(i), pieces[i]); }), 1);
  line("cudaDeviceSynchronize, device idle", us_per(count, [&](std::size_t) { cudaDeviceSynchronize(); }), 1);
  line("cuda_vmm unmap (cudaDeviceSynchronize + cuMemUnmap)", us_per(count, [&](std::size_t i) { v.unmap(at(i), g); }),
       1);
  line("cuda_vmm release (cuMemRelease)", us_per(count, [&](std::size_t i) { v.release(pieces[i]); }), 1);

  const auto map_raw = driver_entry<PFN_cuMemMap_v10020>("cuMemMap");
  const auto access_raw = driver_entry<PFN_cuMemSetAccess_v10020>("cuMemSetAccess");
  const auto unmap_raw = driver_entry<PFN_cuMemUnmap_v10020>("cuMemUnmap");
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  CUmemAccessDesc access{};
  access.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  auto ptr = [&](std::size_t i) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(at(i))); };
  for (std::size_t i = 0; i < count; ++i) pieces[i] = v.create(g);
  auto must = [](CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) {
      std::printf("%s failed: CUresult %d\n", what, static_cast<int>(r));
      std::exit(1);
    }
  };
  line("cuMemMap alone",
       us_per(count, [&](std::size_t i) { must(map_raw(ptr(i), g, 0, pieces[i].id, 0), "cuMemMap"); }), 1);
  line("cuMemSetAccess, 1 granule, first time",
       us_per(count, [&](std::size_t i) { must(access_raw(ptr(i), g, &access, 1), "cuMemSetAccess"); }), 1);
  line("cuMemSetAccess, 1 granule, again",
       us_per(count, [&](std::size_t i) { must(access_raw(ptr(i), g, &access, 1), "cuMemSetAccess"); }), 1);
  line("cuMemUnmap alone, device idle", us_per(count, [&](std::size_t i) { must(unmap_raw(ptr(i), g), "cuMemUnmap"); }),
       1);
  for (std::size_t i = 0; i < count; ++i) must(map_raw(ptr(i), g, 0, pieces[i].id, 0), "cuMemMap");
  line("cuMemSetAccess, 16 granules (16 mappings), first time",
       us_per(count / 16, [&](std::size_t i) { must(access_raw(ptr(16 * i), 16 * g, &access, 1), "cuMemSetAccess"); }),
       16);
  line("cuMemUnmap over 16 mappings in one call",
       us_per(count / 16, [&](std::size_t i) { must(unmap_raw(ptr(16 * i), 16 * g), "cuMemUnmap"); }), 16);
  for (std::size_t i = 0; i < count; ++i) v.release(pieces[i]);

  line("cuda_vmm create, 16 granules", us_per(count / 16, [&](std::size_t i) { pieces[i] = v.create(16 * g); }), 16);
  line("cuda_vmm map, 16 granules", us_per(count / 16, [&](std::size_t i) { v.map(at(16 * i), pieces[i]); }), 16);
  line("cuda_vmm unmap, 16 granules", us_per(count / 16, [&](std::size_t i) { v.unmap(at(16 * i), 16 * g); }), 16);
  line("cuda_vmm release, 16 granules", us_per(count / 16, [&](std::size_t i) { v.release(pieces[i]); }), 16);
  v.unreserve(range);

  std::vector<void*> p(count);
  line("cudaMalloc, 1 granule", us_per(count, [&](std::size_t i) { check(cudaMalloc(&p[i], g), "cudaMalloc"); }), 1);
  line("cudaFree, 1 granule", us_per(count, [&](std::size_t i) { check(cudaFree(p[i]), "cudaFree"); }), 1);
  line("cudaMalloc, 16 granules",
       us_per(count / 16, [&](std::size_t i) { check(cudaMalloc(&p[i], 16 * g), "cudaMalloc"); }), 16);
  line("cudaFree, 16 granules", us_per(count / 16, [&](std::size_t i) { check(cudaFree(p[i]), "cudaFree"); }), 16);
  if (v.last_error()) std::printf("\ncuda_vmm reported %s in %s\n", v.last_error().name, v.last_error().call);
  return 0;
}

/// Milliseconds of each phase of one sleep / wake cycle, and its creates + maps.
struct sleep_wake_times {
  double allocate = 0, offload = 0, discard = 0, restore_weights = 0, restore_cache = 0;
  std::size_t allocate_calls = 0, restore_calls = 0, weight_bytes = 0, cache_bytes = 0;
  bool ok = false;
};

double ms_since(clock_type::time_point start) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
}

sleep_wake_times sleep_and_wake_once(const bench::sleep_wake_sizes& sizes, bool block_sized) {
  virtual_allocator<cuda_vmm>::options o;
  o.arena.block_sized_pieces = block_sized;
  virtual_allocator<cuda_vmm> a{cuda_vmm{}, o};
  const auto created_and_mapped = [&] { return a.counters().num_device_alloc + a.counters().num_maps; };
  sleep_wake_times t;
  std::vector<block> weights, cache;
  auto start = clock_type::now();
  for (const std::size_t bytes : sizes.weights) weights.push_back(a.allocate(bytes, 256, tag{1}));
  for (const std::size_t bytes : sizes.cache) cache.push_back(a.allocate(bytes, 256, tag{2}));
  t.allocate = ms_since(start);
  t.allocate_calls = created_and_mapped();
  bool ok = std::all_of(weights.begin(), weights.end(), [](block b) { return b.ptr != nullptr; }) &&
            std::all_of(cache.begin(), cache.end(), [](block b) { return b.ptr != nullptr; });
  for (std::size_t i = 0; ok && i < weights.size(); ++i) {
    check(cudaMemset(weights[i].ptr, static_cast<int>(i % 251), weights[i].size), "cudaMemset");
    t.weight_bytes += weights[i].size;
  }
  for (const block& b : cache) t.cache_bytes += b.size;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto timed = [&](double& ms, auto&& call) {
    const auto begin = clock_type::now();
    ok = ok && call() == offload_status::done;
    ms = ms_since(begin);
  };
  timed(t.offload, [&] { return a.offload(tag{1}); });
  timed(t.discard, [&] { return a.discard(tag{2}); });
  const std::size_t before = created_and_mapped();
  timed(t.restore_weights, [&] { return a.restore(tag{1}); });
  timed(t.restore_cache, [&] { return a.restore(tag{2}); });
  t.restore_calls = created_and_mapped() - before;
  std::vector<unsigned char> back;
  for (std::size_t i = 0; ok && i < weights.size(); ++i) {
    back.resize(weights[i].size);
    check(cudaMemcpy(back.data(), weights[i].ptr, back.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    const auto written = static_cast<unsigned char>(i % 251);
    ok = std::all_of(back.begin(), back.end(), [written](unsigned char c) { return c == written; });
  }
  for (const block& b : weights)
    if (b) a.deallocate(b);
  for (const block& b : cache)
    if (b) a.deallocate(b);
  a.release();
  t.ok = ok;
  return t;
}

/// What an offload and a restore of `bytes` cost without the allocator, as the arena makes them
/// over cuda_vmm: pinned host memory allocated and the bytes copied out of one cudaMalloc, then
/// copied back in and the host memory freed; ms each.
std::pair<double, double> copies_alone(std::size_t bytes) {
  void* device = nullptr;
  check(cudaMalloc(&device, bytes), "cudaMalloc");
  check(cudaMemset(device, 7, bytes), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  void* host = nullptr;
  auto start = clock_type::now();
  check(cudaMallocHost(&host, bytes), "cudaMallocHost");
  check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  const double out = ms_since(start);
  start = clock_type::now();
  check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaFreeHost(host), "cudaFreeHost");
  const double in = ms_since(start);
  check(cudaFree(device), "cudaFree");
  return {out, in};
}

int offload(int seeds) {
  std::printf(
      "A sleep / wake cycle through virtual_allocator<cuda_vmm>: ms per phase (median of 3), block-sized "
      "pieces (the default) / a piece per 2 MiB granule\n\n"
      "| seed | weights (tag 1) | cache (tag 2) | allocate | creates + maps | offload weights | discard cache | "
      "restore weights | restore cache | creates + maps | copies alone: out / in |\n"
      "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int s = 1; s <= seeds; ++s) {
    const bench::sleep_wake_sizes sizes = bench::sleep_wake_workload(static_cast<std::uint64_t>(s));
    sleep_wake_times median[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<sleep_wake_times> runs;
      for (int r = 0; r < 3; ++r) runs.push_back(sleep_and_wake_once(sizes, k == 0));
      if (!std::all_of(runs.begin(), runs.end(), [](const sleep_wake_times& t) { return t.ok; })) {
        std::fprintf(stderr, "virtual_memory_gpu offload: seed %d: a call failed or the weights changed\n", s);
        return 1;
      }
      median[k] = runs.front();
      const auto phase = [&](double sleep_wake_times::* field) {
        std::vector<double> v;
        for (const sleep_wake_times& t : runs) v.push_back(t.*field);
        median[k].*field = bench::median(v);
      };
      for (auto field : {&sleep_wake_times::allocate, &sleep_wake_times::offload, &sleep_wake_times::discard,
                         &sleep_wake_times::restore_weights, &sleep_wake_times::restore_cache})
        phase(field);
    }
    const auto [out, in] = copies_alone(median[0].weight_bytes);
    const sleep_wake_times &p = median[0], &g = median[1];
    std::printf(
        "| %d | %zu MiB in %zu blocks | %zu MiB in %zu blocks | %.1f / %.1f | %zu / %zu | %.1f / %.1f | %.1f / %.1f | "
        "%.1f / %.1f | %.1f / %.1f | %zu / %zu | %.1f / %.1f |\n",
        s, p.weight_bytes >> 20, sizes.weights.size(), p.cache_bytes >> 20, sizes.cache.size(), p.allocate, g.allocate,
        p.allocate_calls, g.allocate_calls, p.offload, g.offload, p.discard, g.discard, p.restore_weights,
        g.restore_weights, p.restore_cache, g.restore_cache, p.restore_calls, g.restore_calls, out, in);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  program = "virtual_memory_gpu";
  int rounds = 7;
  if (argc > 2 && std::string(argv[1]) == "--rounds") {
    rounds = std::max(1, std::atoi(argv[2]));
    argc -= 2;
    argv += 2;
  }
  if (!open_device()) return 0;
  const std::string what = argc > 1 ? argv[1] : "";
  const std::span<char*> args(argv + 1, static_cast<std::size_t>(argc - 1));
  if (what == "calls") return calls(512);
  if (what == "offload") return offload(argc > 2 ? std::max(1, std::atoi(argv[2])) : 3);
  if (names_workloads(args)) {
    std::printf("%d rounds\n\n", rounds);
    header();
    ratios r;
    for_each_workload(args, 3, [&](const std::string& name, const workload& w) { row(name, w, rounds, r); });
    summary(r);
    return 0;
  }
  std::fprintf(stderr,
               "usage: virtual_memory_gpu [--rounds N] calls | w1 [SEEDS [PAIRS [FIRST_SEED]]] | traces TRACE... | "
               "offload [SEEDS]\n");
  return 2;
}
