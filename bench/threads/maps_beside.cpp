// SPDX-License-Identifier: Apache-2.0
// Maps beside: how much a thread that maps and unmaps physical memory holds up another
// thread that only reuses memory, through one `synchronized<virtual_allocator<V>>`, when the
// backend calls run without the lock (a `thread_safe_vmm`: planned growth for the creates and
// maps, a detached release for the unmaps and releases) and when they run under it (the same
// backend declared not thread safe). Measured in the same run, alternating.
//
// - Thread A (the grower), in a loop: allocate 32 MiB (16 granules of 2 MiB: 16 creates and maps),
//   free it, `release()` (16 unmaps and releases): a program that empties its cache between
//   steps, as PyTorch's `empty_cache()` does.
// - Thread B (the reuser): free+allocate pairs of W2's sizes (256 B-64 KiB, 1,000 live), served by
//   the pool's slabs and the arena's mapped granules, never a map after its warm-up.
// - Backends: `synchronized_vmm<host_vmm>` (a map is an `mmap` system call, an unmap another, a
//   release a `fallocate` punch: microseconds), and the same with a modelled driver latency of
//   20 us slept in each create and each map (a `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` on a
//   GPU takes tens of microseconds; a model, said so in the output, not a device).
// - Figures: B's pairs per second of wall time while A runs, divided by B's alone (same
//   allocator, no A), and A's cycles per second; median of 5 alternated repetitions of 0.3 s.
//
//   maps_beside
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <alloy/policy/synchronized.hpp>
#include <alloy/showcase.hpp>
#include <alloy/vmm/host_vmm.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>

#include "support/pairs_workload.hpp"

namespace {

using namespace alloy::bench;
using wall_clock = std::chrono::steady_clock;

/// `synchronized_vmm<host_vmm>` with an optional sleep in each create and map (a driver's latency).
class shared_host_vmm {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;

  explicit shared_host_vmm(std::chrono::microseconds latency) : latency_(latency) {}

  std::size_t granularity() const noexcept { return backend_.granularity(); }
  alloy::address_range reserve(std::size_t bytes) noexcept { return backend_.reserve(bytes); }
  void unreserve(alloy::address_range r) noexcept { backend_.unreserve(r); }
  alloy::physical_memory create(std::size_t bytes) noexcept {
    wait();
    return backend_.create(bytes);
  }
  void release(alloy::physical_memory p) noexcept { backend_.release(p); }
  bool map(void* at, alloy::physical_memory p) noexcept {
    wait();
    return backend_.map(at, p);
  }
  void unmap(void* at, std::size_t bytes) noexcept { backend_.unmap(at, bytes); }
  std::size_t capacity() const noexcept { return backend_.capacity(); }
  std::size_t physical_bytes() const noexcept { return backend_.physical_bytes(); }

 private:
  void wait() const noexcept {
    if (latency_.count() != 0) std::this_thread::sleep_for(latency_);
  }
  alloy::synchronized_vmm<alloy::host_vmm> backend_;
  std::chrono::microseconds latency_;
};

/// A reference to the shared backend, thread safe or declared not to be (then the arena keeps the
/// caller's lock around every call).
template <bool ThreadSafe>
class backend_ref {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  static constexpr bool thread_safe = ThreadSafe;

  explicit backend_ref(shared_host_vmm& v) noexcept : v_(&v) {}
  std::size_t granularity() const noexcept { return v_->granularity(); }
  alloy::address_range reserve(std::size_t bytes) noexcept { return v_->reserve(bytes); }
  void unreserve(alloy::address_range r) noexcept { v_->unreserve(r); }
  alloy::physical_memory create(std::size_t bytes) noexcept { return v_->create(bytes); }
  void release(alloy::physical_memory p) noexcept { v_->release(p); }
  bool map(void* at, alloy::physical_memory p) noexcept { return v_->map(at, p); }
  void unmap(void* at, std::size_t bytes) noexcept { v_->unmap(at, bytes); }
  std::size_t capacity() const noexcept { return v_->capacity(); }
  std::size_t physical_bytes() const noexcept { return v_->physical_bytes(); }

 private:
  shared_host_vmm* v_;
};

static_assert(alloy::growth_planning_allocator<alloy::virtual_allocator<backend_ref<true>>>);
static_assert(!alloy::growth_planning_allocator<alloy::virtual_allocator<backend_ref<false>>>);

constexpr std::size_t alignment = 256;
constexpr std::size_t grower_bytes = std::size_t{32} << 20;
constexpr auto run_for = std::chrono::milliseconds(300);

struct result {
  double reuser_pairs_per_s = 0;
  double grower_cycles_per_s = 0;
};

/// One repetition: B's pairs for `run_for`, with A growing beside it or not.
template <bool ThreadSafe>
result run_once(std::chrono::microseconds latency, bool with_grower, const workload& w) {
  shared_host_vmm backend(latency);
  using inner = alloy::virtual_allocator<backend_ref<ThreadSafe>>;
  alloy::synchronized<inner> alloc{inner{backend_ref<ThreadSafe>{backend}}};
  std::vector<alloy::block> live;
  for (const std::size_t bytes : w.initial) live.push_back(alloc.allocate(bytes, alignment));
  std::atomic<bool> start{false}, stop{false};
  std::atomic<std::size_t> failures{0};
  std::size_t cycles = 0;
  std::thread grower;
  if (with_grower) {
    grower = std::thread([&] {
      while (!start.load(std::memory_order_acquire)) std::this_thread::yield();
      while (!stop.load(std::memory_order_relaxed)) {
        const alloy::block b = alloc.allocate(grower_bytes, alignment);
        if (!b) failures.fetch_add(1);
        alloc.deallocate(b);
        alloc.release();
        ++cycles;
      }
    });
  }
  std::size_t pairs = 0;
  start.store(true, std::memory_order_release);
  const auto t0 = wall_clock::now();
  while (wall_clock::now() - t0 < run_for) {
    for (std::size_t k = 0; k < 16; ++k, ++pairs) {
      const std::size_t i = pairs % w.pairs();
      alloy::block& slot = live[w.victim[i]];
      alloc.deallocate(slot);
      slot = alloc.allocate(w.size[i], alignment);
      if (!slot) failures.fetch_add(1);
    }
  }
  const double seconds = std::chrono::duration<double>(wall_clock::now() - t0).count();
  stop.store(true);
  if (grower.joinable()) grower.join();
  for (const alloy::block b : live) alloc.deallocate(b);
  if (failures.load() != 0) {
    std::fprintf(stderr, "maps_beside: %zu allocations failed; the figures would be wrong\n", failures.load());
    std::exit(1);
  }
  return {static_cast<double>(pairs) / seconds, static_cast<double>(cycles) / seconds};
}

}  // namespace

int main() {
  const workload w = make_workload(
      {.live_blocks = 1'000, .pairs = 1'000'000, .log2_smallest = 8, .log2_largest = 16, .seed = 20261125});
  constexpr int repetitions = 5;
  std::printf(
      "Thread B: W2 pairs (1,000 live, 256 B-64 KiB); thread A: allocate 32 MiB, free, release(), "
      "in a loop; one synchronized<virtual_allocator<V>>; wall time, median of %d x %lld ms\n\n",
      repetitions, static_cast<long long>(run_for.count()));
  std::printf(
      "| backend | backend calls | B alone, M pairs/s | B beside A, M pairs/s | B beside A ÷ alone | A cycles/s "
      "|\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  for (const auto latency : {std::chrono::microseconds(0), std::chrono::microseconds(20)}) {
    std::vector<double> alone[2], beside[2], cycles[2];
    for (int r = 0; r < repetitions; ++r) {
      // Alternated, so that drift on a shared machine hits both variants alike.
      const result a0 = run_once<false>(latency, false, w), a1 = run_once<true>(latency, false, w);
      const result b0 = run_once<false>(latency, true, w), b1 = run_once<true>(latency, true, w);
      alone[0].push_back(a0.reuser_pairs_per_s);
      alone[1].push_back(a1.reuser_pairs_per_s);
      beside[0].push_back(b0.reuser_pairs_per_s);
      beside[1].push_back(b1.reuser_pairs_per_s);
      cycles[0].push_back(b0.grower_cycles_per_s);
      cycles[1].push_back(b1.grower_cycles_per_s);
    }
    for (int v = 0; v < 2; ++v) {
      const double solo = median(alone[v]), with = median(beside[v]);
      std::printf("| host_vmm%s | %s | %.1f | %.1f | %.2f | %.0f |\n",
                  latency.count() != 0 ? " + 20 us per create and map (modelled)" : "",
                  v == 0 ? "under the lock" : "without the lock", solo / 1e6, with / 1e6, with / solo,
                  median(cycles[v]));
    }
  }
  return 0;
}
