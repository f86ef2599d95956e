// SPDX-License-Identifier: Apache-2.0
// README "Offload": an RL-style step on one device. The model weights (tag 1) go to host memory,
// the KV cache (tag 2) is dropped, training takes the whole device, then both come back at the
// same addresses: every pointer held elsewhere (kernels, CUDA graphs, tensors) stays valid, and
// the weights hold the same bytes. The arena is used as a program would hold it, shared by threads
// and counted: tags and offload pass through `synchronized` and `stats` (any wrapper).
#include <cstdio>
#include <cstring>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/tag.hpp>

using namespace alloy::literals;

/// Writes byte i + 1 into layer i; returns the layers' addresses.
std::vector<void*> fill(const std::vector<alloy::block>& layers) {
  std::vector<void*> at;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    std::memset(layers[i].ptr, int(i + 1), layers[i].size);
    at.push_back(layers[i].ptr);
  }
  return at;
}

/// Whether the layers are where they were and hold what `fill` wrote.
bool same(const std::vector<alloy::block>& layers, const std::vector<void*>& at) {
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].ptr != at[i]) return false;
    for (std::size_t b = 0; b < layers[i].size; ++b)
      if (static_cast<const unsigned char*>(layers[i].ptr)[b] != i + 1) return false;
  }
  return true;
}

int main() {
  // 64 MiB of physical memory in 2 MiB granules (cuda_vmm on a GPU; host_vmm is the same on the host).
  using arena = alloy::virtual_arena<alloy::host_vmm>;
  alloy::synchronized<alloy::stats<arena>> heap{alloy::stats<arena>{arena{alloy::host_vmm{{.capacity = 64_MiB}}}}};
  constexpr alloy::tag weights{1}, kv_cache{2}, training{3};

  std::vector<alloy::block> layers;
  {
    alloy::scoped_tag guard{heap, weights};  // code that knows no tags is tagged from outside
    for (int i = 0; i < 8; ++i) layers.push_back(heap.allocate(3_MiB, 256));
  }
  const alloy::block cache = heap.allocate(16_MiB, 256, kv_cache);
  const std::vector<void*> before = fill(layers);

  const bool slept = heap.offload(weights) == alloy::offload_status::done &&  // weights to the host
                     heap.discard(kv_cache) == alloy::offload_status::done;   // the cache dropped
  const alloy::block step = heap.allocate(60_MiB, 256, training);             // would not fit beside them
  heap.deallocate(step);
  const bool woke = heap.restore(weights) == alloy::offload_status::done &&  // same addresses, same bytes
                    heap.restore(kv_cache) == alloy::offload_status::done;

  const bool intact = same(layers, before);
  const alloy::offload_statistics s = heap.offload_stats();
  const alloy::statistics counted = heap.with_lock([](auto& st) { return st.statistics(); });
  std::printf("offload: %s, training 60 MiB: %s, restore: %s, weights intact at the same addresses: %s\n",
              slept ? "done" : "failed", step ? "served" : "failed", woke ? "done" : "failed", intact ? "yes" : "no");
  std::printf("reclaimed %zu MiB in %zu single reclaims, %zu MiB copied to the host and back\n",
              s.bytes_reclaimed >> 20, s.num_single_reclaims, s.bytes_copied_back >> 20);
  std::printf("stats<>: %zu MiB in use, %zu MiB reserved (peak %zu MiB), %zu MiB reclaimed\n",
              counted.bytes_in_use >> 20, counted.bytes_reserved >> 20, counted.peak_bytes_reserved >> 20,
              counted.bytes_reclaimed >> 20);
  for (const alloy::block& b : layers) heap.deallocate(b);
  heap.deallocate(cache);
  return slept && step && woke && intact ? 0 : 1;
}
