// SPDX-License-Identifier: Apache-2.0
// bench/support/sleep_wake_workload.hpp: the blocks of `virtual_memory offload` (host_vmm) and
// `virtual_memory_gpu offload` (cuda_vmm), an inference server's sleep / wake cycle.
//
// About 512 MiB of weights (tag 1): a quarter small vectors of 4-64 KiB, the rest matrices of
// 1-24 MiB; then 48 key/value cache blocks of 8, 12 or 16 MiB (tag 2). Drawn from the seed, so
// both benchmarks and every run see the same sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <alloy/literals.hpp>

namespace alloy::bench {

struct sleep_wake_sizes {
  std::vector<std::size_t> weights;  // tag 1
  std::vector<std::size_t> cache;    // tag 2
};

inline sleep_wake_sizes sleep_wake_workload(std::uint64_t seed) {
  using namespace alloy::literals;
  std::mt19937_64 rng{seed};
  sleep_wake_sizes s;
  std::size_t weight_bytes = 0;
  while (weight_bytes < 512_MiB) {
    const std::size_t bytes = rng() % 4 == 0 ? 4_KiB + rng() % 60_KiB : 1_MiB + rng() % 23_MiB;
    s.weights.push_back(bytes);
    weight_bytes += bytes;
  }
  for (int i = 0; i < 48; ++i) s.cache.push_back(8_MiB + (rng() % 3) * 4_MiB);
  return s;
}

}  // namespace alloy::bench
