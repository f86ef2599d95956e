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
#  include <chrono>
#  include <cmath>
#  include <cstdio>
#  include <cstdlib>
#  include <exception>
#  include <optional>
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

#  include "replay/trace_reader.hpp"
#  include "support/pairs_workload.hpp"
#  include "support/slot_workload.hpp"

// RMM's headers need the CCCL its wheel ships, newer than the toolkit's: cmake/alloy-rmm.cmake
// puts it first on the include path.
static_assert(CCCL_VERSION >= 3005000, "RMM's CCCL must come before the toolkit's on the include path");

namespace {

using namespace alloy;
using clock_type = std::chrono::steady_clock;
constexpr std::size_t alignment = 256;

using bench::from_pairs;
using bench::from_trace;
using bench::operation;
using workload = bench::slot_workload;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "rmm_peers_gpu: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

std::size_t device_taken() {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

std::size_t half_of_free() {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free / 2 / alignment * alignment;
}

std::size_t round_down(std::size_t bytes) { return bytes / alignment * alignment; }

/// A peer: `allocate(bytes) -> block` (empty when refused), `deallocate(block)`, `finish()`
/// (waits for the device, gives back what it can). Its `capacity` constructor, where it has one,
/// caps the device memory it takes.
template <class A>
struct alloy_peer {
  A a;
  alloy_peer() : a{} {}
  explicit alloy_peer(A inner) : a(std::move(inner)) {}
  block allocate(std::size_t n) { return a.allocate(n, alignment); }
  void deallocate(block b) { a.deallocate(b); }
  void finish() { a.release(); }
};

struct default_peer : alloy_peer<default_allocator<cuda_malloc_upstream>> {};

struct default_capped_peer : alloy_peer<default_allocator<limited<cuda_malloc_upstream>>> {
  explicit default_capped_peer(std::size_t capacity)
      : alloy_peer{default_allocator<limited<cuda_malloc_upstream>>{
            limited<cuda_malloc_upstream>{cuda_malloc_upstream{}, {.bytes_limit = capacity}}}} {}
};

struct virtual_peer : alloy_peer<virtual_allocator<cuda_vmm>> {};

struct virtual_capped_peer : alloy_peer<virtual_allocator<cuda_vmm>> {
  static cuda_vmm::options with(std::size_t capacity) {
    cuda_vmm::options o;
    o.capacity = capacity;
    return o;
  }
  explicit virtual_capped_peer(std::size_t capacity)
      : alloy_peer{virtual_allocator<cuda_vmm>{cuda_vmm{with(capacity)}}} {}
};

struct cuda_async_peer {
  cudaMemPool_t pool{};
  cudaStream_t stream{};
  cuda_async_peer() {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location = {cudaMemLocationTypeDevice, device};
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    std::uint64_t unlimited = ~std::uint64_t{0};
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &unlimited), "release threshold");
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  cuda_async_peer(const cuda_async_peer&) = delete;
  cuda_async_peer& operator=(const cuda_async_peer&) = delete;
  ~cuda_async_peer() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    cudaMemPoolDestroy(pool);
  }
  block allocate(std::size_t n) {
    void* p = nullptr;
    if (cudaMallocFromPoolAsync(&p, n, pool, stream) != cudaSuccess) return {};
    return {p, n};
  }
  void deallocate(block b) { check(cudaFreeAsync(b.ptr, stream), "cudaFreeAsync"); }
  void finish() { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
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

struct figures {
  double cold = 0, warm = 0, memory = 0;
  std::size_t failed = 0;
};

/// Runs `w` once (cold) or twice (cold, then warm) on `peer`; with `sample`, the peak of
/// cudaMemGetInfo beyond `baseline` after every request.
template <class Peer>
figures run_on(Peer& peer, const workload& w, bool sample, bool warm, std::size_t baseline) {
  figures f;
  std::size_t peak = 0;
  std::vector<block> held(w.slots);
  auto apply = [&](const operation& op) {
    if (op.size == 0) {
      if (held[op.slot]) peer.deallocate(held[op.slot]);
      held[op.slot] = {};
      return;
    }
    if (held[op.slot]) peer.deallocate(held[op.slot]);  // a trace's slot reused without a free
    held[op.slot] = peer.allocate(op.size);
    if (!held[op.slot]) ++f.failed;
    if (sample) peak = std::max(peak, device_taken() - baseline);
  };
  auto pass = [&] {
    for (const operation& op : w.setup) apply(op);
    const auto start = clock_type::now();
    for (const operation& op : w.timed) apply(op);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // what was queued counts too
    const auto stop = clock_type::now();
    for (block& b : held) {
      if (b) peer.deallocate(b);
      b = {};
    }
    return std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(w.timed.size());
  };
  f.cold = pass();
  if (warm) f.warm = pass();
  peer.finish();
  f.memory = static_cast<double>(peak) / static_cast<double>(std::max<std::size_t>(w.peak_live, 1));
  return f;
}

template <class Peer>
figures run_once(const workload& w, bool sample) {
  const std::size_t baseline = device_taken();
  Peer peer;
  return run_on(peer, w, sample, true, baseline);
}

struct peer_kind {
  const char* name;
  figures (*run)(const workload&, bool sample);
};

constexpr peer_kind peers[] = {
    {"cudaMallocAsync", run_once<cuda_async_peer>},        {"default_allocator", run_once<default_peer>},
    {"virtual_allocator", run_once<virtual_peer>},         {"rmm pool, 50 %", run_once<rmm_pool_peer>},
    {"rmm pool, grows", run_once<rmm_pool_grows_peer>},    {"rmm arena", run_once<rmm_arena_peer>},
    {"rmm binning over pool", run_once<rmm_binning_peer>}, {"rmm cuda_async", run_once<rmm_async_peer>},
};
constexpr std::size_t peer_count = std::size(peers);

/// Per peer, the logs of its ratios to default_allocator over the workloads (time: the median of
/// each round's ratio, the two having run side by side; device memory: the sampled runs').
struct ratio_logs {
  std::vector<double> cold[peer_count], warm[peer_count], memory[peer_count];
};
constexpr std::size_t default_index = 1;

void row(const std::string& name, const workload& w, int rounds, ratio_logs& logs) {
  std::vector<figures> runs[peer_count];
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < peer_count; ++i) {
      const std::size_t k = (i + static_cast<std::size_t>(r)) % peer_count;
      runs[k].push_back(peers[k].run(w, false));
    }
  }
  double memory[peer_count] = {};
  for (std::size_t k = 0; k < peer_count; ++k) {
    std::vector<double> cold, warm;
    std::size_t failed = 0;
    for (const figures& f : runs[k]) {
      cold.push_back(f.cold);
      warm.push_back(f.warm);
      failed = std::max(failed, f.failed);
    }
    const figures sampled = peers[k].run(w, true);
    failed = std::max(failed, sampled.failed);
    char live[32] = "";
    if (k == 0) std::snprintf(live, sizeof live, "%.1f MiB", static_cast<double>(w.peak_live) / (1 << 20));
    std::printf("| %s | %s | %s | %.0f | %.0f | %.3f |", k == 0 ? name.c_str() : "", live, peers[k].name,
                bench::median(cold), bench::median(warm), sampled.memory);
    if (failed != 0) std::printf(" %zu requests failed", failed);
    std::printf("\n");
    memory[k] = sampled.memory;
  }
  for (std::size_t k = 0; k < peer_count; ++k) {
    std::vector<double> cold, warm;
    for (std::size_t r = 0; r < runs[k].size(); ++r) {
      cold.push_back(runs[k][r].cold / runs[default_index][r].cold);
      warm.push_back(runs[k][r].warm / runs[default_index][r].warm);
    }
    logs.cold[k].push_back(std::log(bench::median(cold)));
    logs.warm[k].push_back(std::log(bench::median(warm)));
    if (memory[k] > 0 && memory[default_index] > 0)
      logs.memory[k].push_back(std::log(memory[k] / memory[default_index]));
  }
  std::fflush(stdout);
}

void summary(const ratio_logs& logs) {
  const auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : std::exp(sum / static_cast<double>(v.size()));
  };
  std::printf(
      "\nEach peer ÷ default_allocator, geometric mean over the workloads\n\n"
      "| peer | time cold | time warm | device memory |\n|---|---:|---:|---:|\n");
  for (std::size_t k = 0; k < peer_count; ++k) {
    std::printf("| %s | %.2f | %.2f | %.2f |\n", peers[k].name, mean(logs.cold[k]), mean(logs.warm[k]),
                mean(logs.memory[k]));
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
  std::vector<double> logs[std::size(kinds)];
  for (int i = 0; i < argc; ++i) {
    const bench::rmm_trace t = bench::read_trace(argv[i]);
    const workload w = from_trace(t);
    std::printf("| %s | %.1f MiB |", t.name.c_str(), static_cast<double>(w.peak_live) / (1 << 20));
    for (std::size_t k = 0; k < std::size(kinds); ++k) {
      const double r = kinds[k].search(w);
      if (r > 0) {
        std::printf(" %.3f |", r);
        logs[k].push_back(std::log(r));
      } else {
        std::printf(" - |");
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("| geometric mean | |");
  for (const std::vector<double>& l : logs) {
    double sum = 0;
    for (double x : l) sum += x;
    std::printf(l.empty() ? " - |" : " %.3f |", l.empty() ? 0.0 : std::exp(sum / static_cast<double>(l.size())));
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  if (argc > 2 && std::string(argv[1]) == "--rounds") {
    rounds = std::max(1, std::atoi(argv[2]));
    argc -= 2;
    argv += 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("rmm_peers_gpu: no CUDA device here; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  check(cudaFree(nullptr), "context");
  std::printf("device: %s, %.1f GiB; RMM %s\n\n", prop.name, static_cast<double>(prop.totalGlobalMem) / (1 << 30),
              ALLOY_RMM_VERSION_STRING);
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "w1") {
    const int seeds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 10;
    const std::size_t pairs = argc > 3 ? static_cast<std::size_t>(std::atoll(argv[3])) : 100'000;
    const int first_seed = argc > 4 ? std::atoi(argv[4]) : 0;
    header(rounds);
    ratio_logs logs;
    for (int s = first_seed; s < first_seed + seeds; ++s) {
      bench::workload_params p = bench::w1_params();
      p.seed += 1000 * static_cast<std::uint64_t>(s);
      p.pairs = pairs;
      row("W1 seed " + std::to_string(p.seed), from_pairs(bench::make_workload(p)), rounds, logs);
    }
    summary(logs);
    return 0;
  }
  if (what == "traces" && argc > 2) {
    header(rounds);
    ratio_logs logs;
    for (int i = 2; i < argc; ++i) {
      const bench::rmm_trace t = bench::read_trace(argv[i]);
      row(t.name, from_trace(t), rounds, logs);
    }
    summary(logs);
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
