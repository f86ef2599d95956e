// SPDX-License-Identifier: Apache-2.0
// bench/support/gpu_replay.hpp: the replay on a real device that virtual_memory_gpu and
// rmm_peers_gpu share: peers called through one shape, a workload run cold and warm on a fresh
// peer, the peers' turns over rounds, ratios, and the command line's workloads (W1, traces).
// CUDA runtime only; included by .cu programs.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <alloy/block.hpp>
#include <alloy/statistics.hpp>

#include "replay/trace_reader.hpp"
#include "support/pairs_workload.hpp"
#include "support/slot_workload.hpp"

namespace alloy::bench::gpu {

using clock_type = std::chrono::steady_clock;
using workload = slot_workload;

/// Every request's alignment, as frameworks ask for it.
inline constexpr std::size_t alignment = 256;

/// The program's name, which error messages start with (set by `main`).
inline const char* program = "gpu replay";

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", program, what, cudaGetErrorString(status));
    std::exit(1);
  }
}

/// Device memory taken by anyone, as cudaMemGetInfo says.
inline std::size_t device_taken() {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

/// A peer: `allocate(bytes) -> block` (empty when refused), `deallocate(block)`, `finish()` (waits
/// for the device, gives back what it can) and, where they are counted, `driver_calls()`.
template <class A>
struct alloy_peer {
  A a;
  alloy_peer() : a{} {}
  explicit alloy_peer(A inner) : a(std::move(inner)) {}
  block allocate(std::size_t n) { return a.allocate(n, alignment); }
  void deallocate(block b) { a.deallocate(b); }
  std::size_t driver_calls() const {
    const allocator_counters c = a.counters();
    return c.num_device_alloc + c.num_device_free + c.num_maps + c.num_unmaps;
  }
  void finish() { a.release(); }
};

/// cudaMallocAsync on its own memory pool, release threshold unlimited (how frameworks run it),
/// requests and frees on one stream, no synchronization. Its driver calls are the pool's own.
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

/// One run's figures: ns per operation of the cold pass and of the warm one, device memory ÷
/// peak live (sampled runs only), driver calls per 1,000 operations of the cold pass.
struct figures {
  double cold = 0, warm = 0, memory = 0, calls_per_1k = 0;
  std::size_t failed = 0;
};

/// Runs `w` on `peer` once (cold), or twice (cold, then warm: the same workload again, every block
/// of the first pass freed); with `sample`, the peak of device_taken() beyond `baseline` after every
/// request.
template <class Peer>
figures run_on(Peer& peer, const workload& w, bool sample, bool warm, std::size_t baseline) {
  figures f;
  std::size_t peak = 0;
  std::vector<block> held(w.slots);
  const auto apply = [&](const operation& op) {
    if (held[op.slot]) peer.deallocate(held[op.slot]);  // a free, or a slot reused without one
    held[op.slot] = {};
    if (op.size == 0) return;
    held[op.slot] = peer.allocate(op.size);
    if (!held[op.slot]) ++f.failed;
    if (sample) peak = std::max(peak, device_taken() - baseline);
  };
  const auto pass = [&] {
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
  constexpr bool counted = requires { peer.driver_calls(); };
  std::size_t calls_before = 0;
  if constexpr (counted) calls_before = peer.driver_calls();
  f.cold = pass();
  if constexpr (counted)
    f.calls_per_1k =
        1000.0 * static_cast<double>(peer.driver_calls() - calls_before) / static_cast<double>(w.timed.size());
  if (warm) f.warm = pass();
  peer.finish();
  f.memory = static_cast<double>(peak) / static_cast<double>(std::max<std::size_t>(w.peak_live, 1));
  return f;
}

/// `w` cold and warm on a fresh, default-constructed `Peer`.
template <class Peer>
figures run_once(const workload& w, bool sample) {
  const std::size_t baseline = device_taken();
  Peer peer;
  return run_on(peer, w, sample, true, baseline);
}

struct peer_kind {
  const char* name;
  figures (*run)(const workload&, bool sample);
  bool counts_calls = false;
  bool every_round = true;  // false: run in the first round only (a peer 100-1000x slower than the rest)
};

/// Each peer's runs, one a round, and its figures: times the median over the rounds, device
/// memory that of one untimed run with sampling.
struct measured {
  std::vector<std::vector<figures>> runs;
  std::vector<figures> median;
};

/// Every peer's figures on `w`: `rounds` rounds, each running every peer once on a fresh
/// allocator, starting one peer later each round, so that the machine's drift (its clocks, another
/// tenant) falls on every peer alike; then one untimed run each with device memory sampled.
inline measured measure(std::span<const peer_kind> peers, const workload& w, int rounds) {
  measured m;
  m.runs.resize(peers.size());
  m.median.resize(peers.size());
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < peers.size(); ++i) {
      const std::size_t k = (i + static_cast<std::size_t>(r)) % peers.size();
      if (peers[k].every_round || r == 0) m.runs[k].push_back(peers[k].run(w, false));
    }
  }
  for (std::size_t k = 0; k < peers.size(); ++k) {
    std::vector<double> cold, warm;
    figures& out = m.median[k];
    for (const figures& f : m.runs[k]) {
      cold.push_back(f.cold);
      warm.push_back(f.warm);
      out.failed = std::max(out.failed, f.failed);
    }
    const figures sampled = peers[k].run(w, true);
    out.cold = median(cold);
    out.warm = median(warm);
    out.calls_per_1k = m.runs[k].front().calls_per_1k;
    out.memory = sampled.memory;
    out.failed = std::max(out.failed, sampled.failed);
  }
  return m;
}

/// The median over the rounds of `runs`' figure ÷ `base`'s (the two ran side by side).
inline double paired_ratio(const std::vector<figures>& runs, const std::vector<figures>& base,
                           double figures::* field) {
  std::vector<double> r;
  for (std::size_t i = 0; i < runs.size() && i < base.size(); ++i) r.push_back(runs[i].*field / base[i].*field);
  return median(r);
}

inline double geomean(const std::vector<double>& v) {
  double log_sum = 0;
  for (double x : v) log_sum += std::log(x);
  return v.empty() ? 0.0 : std::exp(log_sum / static_cast<double>(v.size()));
}

/// Prints the device's name and memory (and `more`); false, saying so, when there is none.
inline bool open_device(const char* more = "") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device here; nothing measured\n", program);
    return false;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  check(cudaFree(nullptr), "context");
  std::printf("device: %s, %.1f GiB%s\n\n", prop.name, static_cast<double>(prop.totalGlobalMem) / (1 << 30), more);
  return true;
}

/// Whether the command line names workloads: `w1 [SEEDS [PAIRS [FIRST]]]` (W1, SEEDS seeds from
/// seed number FIRST, PAIRS pairs (100,000)) or `traces TRACE...` (alloy-replay's trace files).
inline bool names_workloads(std::span<char*> args) {
  const std::string what = args.empty() ? "" : args[0];
  return what == "w1" || (what == "traces" && args.size() > 1);
}

/// The workloads the command line names (`names_workloads`), each given to `row(name, workload)`.
template <class Row>
void for_each_workload(std::span<char*> args, int default_seeds, Row&& row) {
  if (!names_workloads(args)) return;
  if (std::string(args[0]) == "w1") {
    const int seeds = args.size() > 1 ? std::max(1, std::atoi(args[1])) : default_seeds;
    const std::size_t pairs = args.size() > 2 ? static_cast<std::size_t>(std::atoll(args[2])) : 100'000;
    const int first_seed = args.size() > 3 ? std::atoi(args[3]) : 0;
    for (int s = first_seed; s < first_seed + seeds; ++s) {
      workload_params p = w1_params();
      p.seed += 1000 * static_cast<std::uint64_t>(s);
      p.pairs = pairs;
      row("W1 seed " + std::to_string(p.seed), from_pairs(make_workload(p)));
    }
    return;
  }
  for (char* file : args.subspan(1)) {
    const rmm_trace t = read_trace(file);
    row(t.name, from_trace(t));
  }
}

}  // namespace alloy::bench::gpu
