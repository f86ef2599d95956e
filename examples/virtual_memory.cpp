// SPDX-License-Identifier: Apache-2.0
// README "Virtual memory": holes give their pages back. On a device of 64 MiB, eight free holes
// of 4 MiB serve one request of 32 MiB through virtual memory; a best-fit arena holding the same
// 64 MiB as one segment cannot serve it.
#include <cstdio>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/showcase.hpp>

using namespace alloy::literals;

/// Fills a device with sixteen 4 MiB blocks, frees every other one, then asks for 32 MiB.
template <class Heap>
bool serves_32_mib_after_fragmenting(Heap& heap) {
  std::vector<alloy::block> blocks;
  for (std::size_t i = 0; i < 16; ++i) blocks.push_back(heap.allocate(4_MiB, 256));
  for (std::size_t i = 0; i < 16; i += 2) heap.deallocate(blocks[i]);  // 32 MiB free, in 4 MiB holes
  const alloy::block big = heap.allocate(32_MiB, 256);
  const bool served = static_cast<bool>(big);
  heap.deallocate(big);
  for (std::size_t i = 1; i < 16; i += 2) heap.deallocate(blocks[i]);
  return served;
}

int main() {
  // 64 MiB of physical memory in 2 MiB granules (cuda_vmm on a GPU; host_vmm is the same on the host).
  alloy::virtual_arena<alloy::host_vmm> heap{alloy::host_vmm{{.capacity = 64_MiB}}};
  alloy::best_fit_arena<alloy::host_upstream> fixed{{}, {.initial_size = 64_MiB, .maximum_size = 64_MiB}};

  const bool virtual_served = serves_32_mib_after_fragmenting(heap);  // holes unmapped, pages mapped again
  const bool fixed_served = serves_32_mib_after_fragmenting(fixed);   // largest hole: 4 MiB
  std::printf("32 MiB after fragmenting 64 MiB: virtual_arena %s, best_fit_arena %s\n",
              virtual_served ? "served" : "failed", fixed_served ? "served" : "failed");

  // The recommended composition on virtual memory: a size-class pool whose slabs come from the arena.
  alloy::virtual_allocator<alloy::host_vmm> alloc{alloy::host_vmm{{.capacity = 256_MiB}}};
  const alloy::block small = alloc.allocate(1_KiB, 256), large = alloc.allocate(10_MiB, 256);
  std::printf("virtual_allocator: %zu bytes in use, %zu MiB mapped\n", alloc.bytes_in_use(),
              alloc.reserved_bytes() >> 20);
  alloc.deallocate(small);
  alloc.deallocate(large);
  return virtual_served && !fixed_served && alloc.bytes_in_use() == 0 ? 0 : 1;
}
