// SPDX-License-Identifier: Apache-2.0
// README "Statistics": TensorFlow's and PyTorch's numbers, fastai's memory trace, a summary
// table and a picture of the heap, from one stats<> decorator.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/showcase.hpp>
#include <alloy/snapshot.hpp>

using namespace alloy::literals;

int main() {
  alloy::stats<alloy::default_allocator<alloy::host_upstream>> alloc;

  alloy::memory_trace trace(alloc, {.ctx = "two buffers"});  // fastai's GPUMemTrace
  std::vector<alloy::block> blocks;
  for (std::size_t bytes : {3_MiB, 200_KiB, 5_MiB, 1_KiB}) blocks.push_back(alloc.allocate(bytes, 256));
  alloc.deallocate(blocks[0]);
  alloc.deallocate(blocks[2]);
  trace.report();  // used and peak deltas since the trace started

  const alloy::statistics s = alloc.statistics();  // TensorFlow's and LMS's names
  std::printf("num_allocs %zu, bytes_in_use %zu, peak %zu, reserved %zu, fragmentation %.2f\n", s.num_allocs,
              s.bytes_in_use, s.peak_bytes_in_use, s.bytes_reserved, s.fragmentation);

  auto pytorch = alloy::memory_stats(alloc);  // PyTorch's memory_stats() keys
  std::printf("allocated_bytes.large_pool.peak %lld\n",
              static_cast<long long>(pytorch["allocated_bytes.large_pool.peak"]));

  std::cout << alloy::memory_summary(alloc);                     // PyTorch's memory_summary()
  std::ofstream("heap.svg") << alloy::snapshot(alloc).to_svg();  // a segment map of the heap

  alloc.deallocate(blocks[1]);
  alloc.deallocate(blocks[3]);
  // What the example printed is also checked, so that the README stays true.
  const bool exact =
      s.num_allocs == 4 && s.bytes_in_use == 200_KiB + 1_KiB && s.peak_bytes_in_use == 8_MiB + 201_KiB &&
      pytorch["allocated_bytes.large_pool.peak"] == static_cast<long long>(8_MiB + 200_KiB);  // > 64 KiB: large
  return exact ? 0 : 1;
}
