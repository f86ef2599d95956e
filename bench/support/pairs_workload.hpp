// SPDX-License-Identifier: Apache-2.0
// bench/support/pairs_workload.hpp: the free+allocate pairs of workloads W1 and W2,
// and the loop that times them.
//
// A live set of blocks with sizes log-uniform between two powers of two, then pairs, each freeing
// a random live block and allocating a fresh random size in its place. The memory is never
// touched. The requests are drawn up front from a fixed seed, so every allocator in a run, and
// every run, sees the same ones; only the pairs are timed.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include <alloy/block.hpp>
#include <alloy/concepts.hpp>

namespace alloy::bench {

struct workload_params {
  std::size_t live_blocks = 0;
  std::size_t pairs = 0;
  double log2_smallest = 0;  // sizes are 2^x, x uniform in [log2_smallest, log2_largest)
  double log2_largest = 0;
  std::uint64_t seed = 0;
};

/// W1: 256 B .. 4 MiB, a million pairs; 1,000 live blocks, or the live-set sweep's other sizes.
/// The seed depends on the live count, as it always has, so figures stay comparable across runs.
inline workload_params w1_params(std::size_t live_blocks = 1'000) {
  return {.live_blocks = live_blocks,
          .pairs = 1'000'000,
          .log2_smallest = 8,
          .log2_largest = 22,
          .seed = 20261122 + live_blocks};
}

struct workload {
  std::vector<std::size_t> initial;   // sizes of the first live set
  std::vector<std::uint32_t> victim;  // per pair: which live slot is freed and refilled
  std::vector<std::size_t> size;      // per pair: the new size
  std::size_t peak_live = 0;          // most bytes the live blocks asked for at once
  std::size_t pairs() const noexcept { return victim.size(); }
};

inline workload make_workload(const workload_params& p) {
  workload w;
  std::mt19937_64 rng(p.seed);
  std::uniform_real_distribution<double> log_size(p.log2_smallest, p.log2_largest);
  auto draw = [&] { return static_cast<std::size_t>(std::exp2(log_size(rng))); };
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < p.live_blocks; ++i) bytes += w.initial.emplace_back(draw());
  std::vector<std::size_t> current = w.initial;
  w.peak_live = bytes;
  w.victim.resize(p.pairs);
  w.size.resize(p.pairs);
  for (std::size_t i = 0; i < p.pairs; ++i) {
    w.victim[i] = static_cast<std::uint32_t>(rng() % p.live_blocks);
    w.size[i] = draw();
    bytes = bytes - current[w.victim[i]] + w.size[i];
    current[w.victim[i]] = w.size[i];
    w.peak_live = std::max(w.peak_live, bytes);
  }
  return w;
}

/// This thread's CPU time as a std::chrono clock: on a shared machine, wall time also counts
/// other people's work.
struct thread_cpu_clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<thread_cpu_clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return time_point{std::chrono::seconds{t.tv_sec} + std::chrono::nanoseconds{t.tv_nsec}};
  }
};

/// Runs `w` through `allocate(bytes) -> alloy::block` and `deallocate(alloy::block)`; returns ns
/// per pair on `Clock`, pairs only. Faces that take a size back get it from the block, which
/// holds the size asked for. The slots are blocks, not bare pointers, on purpose: on a pointer
/// DoNotOptimize uses the "+m,r" asm form, which GCC 12 at -O1 and above compiled wrongly here
/// (best_fit_arena saw frees of the wrong sizes); on a block it uses "+m".
template <class Clock, class Allocate, class Deallocate>
double run_pairs(const workload& w, Allocate&& allocate, Deallocate&& deallocate) {
  std::vector<block> held(w.initial.size());
  for (std::size_t i = 0; i < held.size(); ++i) held[i] = allocate(w.initial[i]);
  const auto start = Clock::now();
  for (std::size_t i = 0; i < w.pairs(); ++i) {
    const std::uint32_t v = w.victim[i];
    deallocate(held[v]);
    held[v] = allocate(w.size[i]);
    benchmark::DoNotOptimize(held[v]);
  }
  const auto stop = Clock::now();
  for (const block& b : held) deallocate(b);
  return std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(w.pairs());
}

/// `run_pairs` on an alloy allocator, or on a memory resource with `allocate(bytes, alignment)`
/// and `deallocate(p, bytes, alignment)` (std::pmr, thrust::mr); every request at `alignment`.
template <class Clock, class A>
double run_pairs_on(const workload& w, A& a, std::size_t alignment) {
  if constexpr (allocator<A>) {
    return run_pairs<Clock>(
        w, [&](std::size_t bytes) { return a.allocate(bytes, alignment); }, [&](block b) { a.deallocate(b); });
  } else {
    return run_pairs<Clock>(
        w, [&](std::size_t bytes) { return block{a.allocate(bytes, alignment), bytes}; },
        [&](block b) { a.deallocate(b.ptr, b.size, alignment); });
  }
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace alloy::bench
