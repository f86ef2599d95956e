// SPDX-License-Identifier: Apache-2.0
// RMM's memory resources beside alloy's compositions on a real device: the replay of
// virtual_memory_gpu (W1, alloy-replay's trace files) with RMM as peers, and the smallest device
// that serves each trace. Built only when RMM is found (cmake/alloy-rmm.cmake: scripts/fetch-rmm
// or ALLOY_RMM_ROOT). Needs a CUDA device; without one it says so and exits 0.
//
//   rmm_peers_gpu w1 [SEEDS [PAIRS [FIRST]]]  # W1 (1,000 live, 256 B-4 MiB): SEEDS seeds (10) from
//                                             # seed number FIRST (0), PAIRS pairs (100,000)
//   rmm_peers_gpu traces TRACE...             # alloy-replay's trace files (RMM CSV, MiniMalloc)
//   rmm_peers_gpu min-capacity TRACE...       # the smallest device that serves each trace
//   rmm_peers_gpu --rounds N w1|traces ...    # N rounds of the peers' turns (default 5)
//
// Peers, one process, one device, each on a fresh resource per run, requests on the default
// stream, alignment 256:
//   cudaMallocAsync               its own memory pool, release threshold unlimited
//   default_allocator             alloy's pooled composition over cudaMalloc
//   virtual_allocator             alloy's composition over cuda_vmm (its defaults)
//   rmm pool, 50 %                rmm::mr::pool_memory_resource over cuda_memory_resource, initial
//                                 size half the free device memory (as RMM's users set it:
//                                 rmm::percent_of_free_device_memory(50)), no maximum
//   rmm pool, grows               the same with initial size 0: grows as requests need
//   rmm arena                     rmm::mr::arena_memory_resource over cuda_memory_resource, its
//                                 default arena (half the free device memory)
//   rmm binning over pool         rmm::mr::binning_memory_resource(pool 50 %, 2^18, 2^22): fixed-size
//                                 bins of 256 KiB-4 MiB, larger requests to the pool (RMM's docs)
//   rmm cuda_async                rmm::mr::cuda_async_memory_resource, its defaults
// Figures as virtual_memory_gpu's: ns per operation of a cold pass (a fresh resource) and of a
// warm one (the same workload again, all blocks of the first pass freed), the median over the
// rounds (each round runs every peer once, starting one peer later each round), and device memory
// ÷ peak live (the peak of what cudaMemGetInfo says is taken beyond the baseline, sampled after
// every request of an untimed run); then each peer ÷ default_allocator, the geometric mean over
// the workloads (time: the median of the rounds' paired ratios).
//
// min-capacity: for each trace and each capped peer, the smallest capacity at which one pass
// serves every request, found by doubling from the trace's peak live bytes, then bisection to
// 1 %; printed ÷ peak live. The capacities: default_allocator over limited<cuda_malloc_upstream>
// (bytes_limit), virtual_allocator over cuda_vmm (options.capacity), RMM's pool with initial and
// maximum size the capacity (a device of that size, all of it the pool's), RMM's arena with arena
// size the capacity.
#if ALLOY_HAS_RMM
#  include <algorithm>
#  include <cstdio>
#  include <cstdlib>
#  include <exception>
#  include <span>
#  include <string>
#  include <vector>

#  include <cuda/std/version>
#  include <cuda_runtime_api.h>

#  include <rmm/mr/arena_memory_resource.hpp>
#  include <rmm/mr/binning_memory_resource.hpp>
#  include <rmm/mr/cuda_async_memory_resource.hpp>
#  include <rmm/mr/cuda_memory_resource.hpp>
#  include <rmm/mr/pool_memory_resource.hpp>

#  include <alloy/policy/limited.hpp>
#  include <alloy/showcase.hpp>
#  include <alloy/upstream/cuda_malloc_upstream.hpp>
#  include <alloy/vmm/cuda_vmm.hpp>

#  include "support/gpu_replay.hpp"

// RMM's headers need the CCCL its wheel ships, newer than the toolkit's: cmake/alloy-rmm.cmake
// puts it first on the include path.
static_assert(CCCL_VERSION >= 3005000, "RMM's CCCL must come before the toolkit's on the include path");

namespace {

using namespace alloy;
using namespace alloy::bench::gpu;

std::size_t half_of_free() {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free / 2 / alignment * alignment;
}

std::size_t round_down(std::size_t bytes) { return bytes / alignment * alignment; }

// A peer's `capacity` constructor, where it has one, caps the device memory it takes.

using default_peer = alloy_peer<default_allocator<cuda_malloc_upstream>>;

struct default_capped_peer : alloy_peer<default_allocator<limited<cuda_malloc_upstream>>> {
  explicit default_capped_peer(std::size_t capacity)
      : alloy_peer{default_allocator<limited<cuda_malloc_upstream>>{
            limited<cuda_malloc_upstream>{cuda_malloc_upstream{}, {.bytes_limit = capacity}}}} {}
};

using virtual_peer = alloy_peer<virtual_allocator<cuda_vmm>>;

struct virtual_capped_peer : alloy_peer<virtual_allocator<cuda_vmm>> {
  static cuda_vmm::options with(std::size_t capacity) {
    cuda_vmm::options o;
    o.capacity = capacity;
    return o;
  }
  explicit virtual_capped_peer(std::size_t capacity)
      : alloy_peer{virtual_allocator<cuda_vmm>{cuda_vmm{with(capacity)}}} {}
};

/// Any RMM resource, called as its users call it: stream-ordered on the default stream; a
/// refusal (rmm::out_of_memory, rmm::bad_alloc) is an empty block.
template <class R>
struct rmm_peer {
  R r;
  explicit rmm_peer(R resource) : r(std::move(resource)) {}
  block allocate(std::size_t n) {
    try {
      return {r.allocate(cuda::stream_ref{cudaStream_t{}}, n, alignment), n};
    } catch (const std::exception&) {
      return {};
    }
  }
  void deallocate(block b) { r.deallocate(cuda::stream_ref{cudaStream_t{}}, b.ptr, b.size, alignment); }
  void finish() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
};

struct rmm_pool_peer : rmm_peer<rmm::mr::pool_memory_resource> {
  rmm_pool_peer() : rmm_peer{rmm::mr::pool_memory_resource{rmm::mr::cuda_memory_resource{}, half_of_free()}} {}
  explicit rmm_pool_peer(std::size_t capacity)
      : rmm_peer{rmm::mr::pool_memory_resource{rmm::mr::cuda_memory_resource{}, round_down(capacity),
                                               round_down(capacity)}} {}
};

struct rmm_pool_grows_peer : rmm_peer<rmm::mr::pool_memory_resource> {
  rmm_pool_grows_peer() : rmm_peer{rmm::mr::pool_memory_resource{rmm::mr::cuda_memory_resource{}, 0}} {}
};

struct rmm_arena_peer : rmm_peer<rmm::mr::arena_memory_resource> {
  rmm_arena_peer() : rmm_peer{rmm::mr::arena_memory_resource{rmm::mr::cuda_memory_resource{}}} {}
  explicit rmm_arena_peer(std::size_t capacity)
      : rmm_peer{rmm::mr::arena_memory_resource{rmm::mr::cuda_memory_resource{}, round_down(capacity)}} {}
};

struct rmm_binning_peer : rmm_peer<rmm::mr::binning_memory_resource> {
  rmm_binning_peer()
      : rmm_peer{rmm::mr::binning_memory_resource{
            rmm::mr::pool_memory_resource{rmm::mr::cuda_memory_resource{}, half_of_free()}, 18, 22}} {}
};

struct rmm_async_peer : rmm_peer<rmm::mr::cuda_async_memory_resource> {
  rmm_async_peer() : rmm_peer{rmm::mr::cuda_async_memory_resource{}} {}
};

constexpr peer_kind peers[] = {
    {"cudaMallocAsync", run_once<cuda_async_peer>},        {"default_allocator", run_once<default_peer>},
    {"virtual_allocator", run_once<virtual_peer>},         {"rmm pool, 50 %", run_once<rmm_pool_peer>},
    {"rmm pool, grows", run_once<rmm_pool_grows_peer>},    {"rmm arena", run_once<rmm_arena_peer>},
    {"rmm binning over pool", run_once<rmm_binning_peer>}, {"rmm cuda_async", run_once<rmm_async_peer>},
};
constexpr std::size_t peer_count = std::size(peers);

/// Per peer, its ratios to default_allocator over the workloads (time: the median of each round's
/// ratio, the two having run side by side; device memory: the sampled runs').
struct ratios {
  std::vector<double> cold[peer_count], warm[peer_count], memory[peer_count];
};
constexpr std::size_t default_index = 1;

void row(const std::string& name, const workload& w, int rounds, ratios& logs) {
  const measured m = measure(peers, w, rounds);
  for (std::size_t k = 0; k < peer_count; ++k) {
    const figures& f = m.median[k];
    char live[32] = "";
    if (k == 0) std::snprintf(live, sizeof live, "%.1f MiB", static_cast<double>(w.peak_live) / (1 << 20));
    std::printf("| %s | %s | %s | %.0f | %.0f | %.3f |", k == 0 ? name.c_str() : "", live, peers[k].name, f.cold,
                f.warm, f.memory);
    if (f.failed != 0) std::printf(" %zu requests failed", f.failed);
    std::printf("\n");
  }
  const double base_memory = m.median[default_index].memory;
  for (std::size_t k = 0; k < peer_count; ++k) {
    logs.cold[k].push_back(paired_ratio(m.runs[k], m.runs[default_index], &figures::cold));
    logs.warm[k].push_back(paired_ratio(m.runs[k], m.runs[default_index], &figures::warm));
    if (m.median[k].memory > 0 && base_memory > 0) logs.memory[k].push_back(m.median[k].memory / base_memory);
  }
  std::fflush(stdout);
}

void summary(const ratios& logs) {
  std::printf(
      "\nEach peer ÷ default_allocator, geometric mean over the workloads\n\n"
      "| peer | time cold | time warm | device memory |\n|---|---:|---:|---:|\n");
  for (std::size_t k = 0; k < peer_count; ++k) {
    std::printf("| %s | %.2f | %.2f | %.2f |\n", peers[k].name, geomean(logs.cold[k]), geomean(logs.warm[k]),
                geomean(logs.memory[k]));
  }
}

void header(int rounds) {
  std::printf(
      "%d rounds; RMM's pool and arena take half the free device memory up front (their users' "
      "setting), so their device memory ÷ peak live is that, not what the workload needed\n\n"
      "| workload | peak live | peer | ns/op cold | ns/op warm | device memory ÷ peak live |\n"
      "|---|---:|---|---:|---:|---:|\n",
      rounds);
}

/// Whether one pass of `w` on a `Peer` capped at `capacity` serves every request.
template <class Peer>
bool serves(const workload& w, std::size_t capacity) {
  try {
    Peer peer(capacity);
    return run_on(peer, w, false, false, 0).failed == 0;
  } catch (const std::exception&) {  // the capacity could not be set up (RMM's constructors throw)
    return false;
  }
}

/// The smallest capacity (to 1 %) at which `serves<Peer>` holds, ÷ peak live; 0 if none up to
/// the device's free memory.
template <class Peer>
double min_capacity(const workload& w) {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  const std::size_t live = std::max<std::size_t>(w.peak_live, alignment);
  std::size_t lo = 0, hi = live;
  while (!serves<Peer>(w, hi)) {
    lo = hi;
    if (hi > free / 2) return 0;
    hi *= 2;
  }
  while (hi - lo > hi / 100) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (serves<Peer>(w, mid)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return static_cast<double>(hi) / static_cast<double>(live);
}

int min_capacities(int argc, char** argv) {
  struct capped {
    const char* name;
    double (*search)(const workload&);
  };
  const capped kinds[] = {
      {"default_allocator", min_capacity<default_capped_peer>},
      {"virtual_allocator", min_capacity<virtual_capped_peer>},
      {"rmm pool", min_capacity<rmm_pool_peer>},
      {"rmm arena", min_capacity<rmm_arena_peer>},
  };
  std::printf(
      "The smallest device that serves each trace (to 1 %%), ÷ peak live; - : none up to half the free memory\n\n"
      "| trace | peak live |");
  for (const capped& k : kinds) std::printf(" %s |", k.name);
  std::printf("\n|---|---:|");
  for (std::size_t i = 0; i < std::size(kinds); ++i) std::printf("---:|");
  std::printf("\n");
  std::vector<double> found[std::size(kinds)];
  for (int i = 0; i < argc; ++i) {
    const bench::rmm_trace t = bench::read_trace(argv[i]);
    const workload w = from_trace(t);
    std::printf("| %s | %.1f MiB |", t.name.c_str(), static_cast<double>(w.peak_live) / (1 << 20));
    for (std::size_t k = 0; k < std::size(kinds); ++k) {
      const double r = kinds[k].search(w);
      if (r > 0) {
        std::printf(" %.3f |", r);
        found[k].push_back(r);
      } else {
        std::printf(" - |");
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("| geometric mean | |");
  for (const std::vector<double>& f : found) std::printf(f.empty() ? " - |" : " %.3f |", geomean(f));
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  program = "rmm_peers_gpu";
  int rounds = 5;
  if (argc > 2 && std::string(argv[1]) == "--rounds") {
    rounds = std::max(1, std::atoi(argv[2]));
    argc -= 2;
    argv += 2;
  }
  if (!open_device("; RMM " ALLOY_RMM_VERSION_STRING)) return 0;
  const std::string what = argc > 1 ? argv[1] : "";
  const std::span<char*> args(argv + 1, static_cast<std::size_t>(argc - 1));
  if (names_workloads(args)) {
    header(rounds);
    ratios r;
    for_each_workload(args, 10, [&](const std::string& name, const workload& w) { row(name, w, rounds, r); });
    summary(r);
    return 0;
  }
  if (what == "min-capacity" && argc > 2) return min_capacities(argc - 2, argv + 2);
  std::fprintf(stderr,
               "usage: rmm_peers_gpu [--rounds N] w1 [SEEDS [PAIRS [FIRST_SEED]]] | traces TRACE... | min-capacity "
               "TRACE...\n");
  return 2;
}
#else
#  include <cstdio>
int main() {
  std::printf("rmm_peers_gpu: built without RMM (scripts/fetch-rmm, then configure again); nothing measured\n");
  return 0;
}
#endif
