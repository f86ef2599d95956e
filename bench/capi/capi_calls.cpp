// SPDX-License-Identifier: Apache-2.0
// liballoy's calls, as PyTorch makes them, against the same composition called directly in C++:
// what the C interface costs (its lock, its table of live blocks, the stream-ordered layer), and
// how the compositions compare behind it. Workload W1 (a live set of 1,000 blocks, sizes
// log-uniform from 256 B to 4 MiB; each step frees a random block and allocates a new one), on
// one thread and on two threads (each on its own device, and both on one device).
//
//   ALLOY_CONF=backend:host,devices:2,composition:virtual build/release/bench/capi_calls
//
// ALLOY_CONF picks the composition of the C interface (backend:host with two devices when unset);
// the direct peers are the three compositions behind synchronized<stats<...>>.
#include <benchmark/benchmark.h>

#include <alloy/alloy.hpp>
#include <alloy/capi.h>
#include <alloy/showcase.hpp>
#include <alloy/vmm/host_vmm.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr std::size_t live_blocks = 1000;

struct sizes {
  std::mt19937_64 rng;
  std::uniform_real_distribution<double> log_size{std::log2(256.0), std::log2(4194304.0)};
  explicit sizes(std::uint64_t seed) : rng(seed) {}
  std::size_t next() { return static_cast<std::size_t>(std::exp2(log_size(rng))); }
};

struct live {
  void* ptr;
  std::size_t size;
};

void configure_once() {
  static const bool configured = [] {
    if (std::getenv("ALLOY_CONF") == nullptr) alloy_configure("backend:host,devices:2");
    return true;
  }();
  (void)configured;
}

// W1 through alloy_torch_malloc / alloy_torch_free. Threads: range(0) = 1 puts each thread on its
// own device, 0 all threads on device 0.
void capi_w1(benchmark::State& state) {
  configure_once();
  const int device = state.range(0) != 0 ? state.thread_index() % std::max(alloy_device_count(), 1) : 0;
  auto* stream = reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(state.thread_index() + 1));
  sizes gen(42 + static_cast<std::uint64_t>(state.thread_index()));
  std::vector<live> blocks;
  for (std::size_t i = 0; i < live_blocks; ++i) {
    const std::size_t n = gen.next();
    blocks.push_back({alloy_torch_malloc(n, device, stream), n});
  }
  for (auto _ : state) {
    live& victim = blocks[gen.rng() % blocks.size()];
    alloy_torch_free(victim.ptr, victim.size, device, stream);
    victim.size = gen.next();
    victim.ptr = alloy_torch_malloc(victim.size, device, stream);
    if (victim.ptr == nullptr) state.SkipWithError(alloy_last_oom(device));
  }
  for (const live& b : blocks) alloy_torch_free(b.ptr, b.size, device, stream);
  if (state.thread_index() == 0) state.SetLabel(alloy_configuration());
}

template <class A>
void direct_w1(benchmark::State& state, A& alloc) {
  sizes gen(42 + static_cast<std::uint64_t>(state.thread_index()));
  std::vector<alloy::block> blocks;
  for (std::size_t i = 0; i < live_blocks; ++i) blocks.push_back(alloc.allocate(gen.next(), 256));
  for (auto _ : state) {
    alloy::block& victim = blocks[gen.rng() % blocks.size()];
    alloc.deallocate(victim);
    victim = alloc.allocate(gen.next(), 256);
    if (!victim) state.SkipWithError("out of memory");
  }
  for (const alloy::block& b : blocks) alloc.deallocate(b);
}

void direct_default(benchmark::State& state) {
  static alloy::synchronized<alloy::stats<alloy::default_allocator<alloy::host_upstream>>> alloc;
  direct_w1(state, alloc);
}
void direct_caching(benchmark::State& state) {
  static alloy::synchronized<alloy::stats<alloy::caching_allocator<alloy::host_upstream>>> alloc;
  direct_w1(state, alloc);
}
void direct_virtual(benchmark::State& state) {
  static alloy::synchronized<alloy::stats<alloy::virtual_allocator<alloy::host_vmm>>> alloc;
  direct_w1(state, alloc);
}

}  // namespace

BENCHMARK(capi_w1)->ArgName("own_device")->Arg(0)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(capi_w1)->ArgName("own_device")->Arg(1)->Threads(2)->UseRealTime();
BENCHMARK(direct_default)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(direct_caching)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(direct_virtual)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK_MAIN();
