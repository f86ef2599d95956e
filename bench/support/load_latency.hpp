// SPDX-License-Identifier: Apache-2.0
// bench/support/load_latency.hpp: what one dependent random load costs on this machine, by
// working-set size, for reading the live-set sweep of random_allocations.
//
// At 10^5 live blocks an allocator's bookkeeping outgrows the caches, and every lookup that
// depends on the one before (address table -> chunk -> neighbour) pays this latency in full. The
// build VMs differ a lot here (one kept the arena's 8 MB of bookkeeping at 10^5 in its L3,
// another pays DRAM latency and nested page walks beyond 4 MB), so the sweep's figures mean
// little without this line.
//
// A pointer chase through one random cycle over cache-line slots in memory from `operator new`
// (4 KiB pages unless the system makes huge ones): each load's address comes from the previous
// load, so nothing overlaps. Timed on this thread's CPU clock, as the pairs are.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "support/pairs_workload.hpp"

namespace alloy::bench {

/// CPU ns per dependent load over a random cycle of `bytes` of cache lines.
inline double dependent_load_ns(std::size_t bytes, std::size_t loads = 4'000'000) {
  struct alignas(64) line {
    std::uint32_t next;
  };
  const std::size_t n = bytes / sizeof(line);
  if (n < 2) return 0;
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin() + 1, order.end(), std::mt19937_64(n));  // one cycle through every line
  std::vector<line> lines(n);
  for (std::size_t i = 0; i < n; ++i) lines[order[i]].next = order[(i + 1) % n];
  std::uint32_t at = 0;
  for (std::size_t i = 0; i < n; ++i) at = lines[at].next;  // warm: pages faulted in, caches filled
  const auto start = thread_cpu_clock::now();
  for (std::size_t i = 0; i < loads; ++i) at = lines[at].next;
  const auto stop = thread_cpu_clock::now();
  benchmark::DoNotOptimize(at);
  return std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(loads);
}

/// The working-set sizes the sweep's context line reports, with the latency of each.
inline std::vector<std::pair<std::size_t, double>> load_latency_profile() {
  std::vector<std::pair<std::size_t, double>> profile;
  for (std::size_t kib : {64u, 512u, 2048u, 4096u, 8192u, 32768u})
    profile.emplace_back(kib, dependent_load_ns(kib << 10));
  return profile;
}

}  // namespace alloy::bench
