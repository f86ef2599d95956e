// SPDX-License-Identifier: Apache-2.0
// alloy-demo: the main job of the Quick start. Composes alloy's two recommended layouts,
// replays a real allocation trace through each (a PyTorch training step from ../shared/traces
// when present, else a synthetic training loop), and prints what they did side by side with
// what the bare upstream would have done: `default_allocator` (the fastest, over cudaMalloc) and
// `virtual_allocator` (the smallest device, over CUDA's virtual memory): upstream and map calls,
// time, the memory each held, and the default one's statistics table.
//
//   alloy-demo [trace.rmm.csv[.gz]]
//
// On a machine with a CUDA device the memory is device memory (cudaMalloc, and the driver's
// virtual memory management for virtual_allocator); without one it is host memory (host_upstream
// and host_vmm, memfd pages mapped 2 MiB at a time), and the demo says so. The replay never
// touches the memory, so a trace that peaks at gigabytes runs anywhere (host pages that are never
// written are never committed).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/showcase.hpp>

#ifdef ALLOY_DEMO_HAS_ZLIB
#  include <replay/rmm_trace.hpp>
#endif

using namespace alloy::literals;

namespace {

/// One operation of the workload: allocate `size` bytes as allocation `index`, or free it.
struct op {
  bool allocate;
  std::size_t index;
  std::size_t size;
};

struct workload {
  std::string name;
  std::vector<op> ops;
  std::size_t allocations = 0;
};

/// A synthetic training loop: weights that live throughout, activations that pile up in the
/// forward pass and go in the backward pass, and small temporaries.
workload synthetic_training_loop() {
  workload w{"synthetic training loop (20 steps, 24 layers)", {}, 0};
  std::mt19937_64 rng(2026);
  std::uniform_int_distribution<std::size_t> small(256, 512_KiB);
  auto allocate = [&](std::size_t size) {
    w.ops.push_back({true, w.allocations, size});
    return w.allocations++;
  };
  std::vector<std::size_t> weights;
  for (std::size_t layer = 0; layer < 24; ++layer) weights.push_back(allocate(16_MiB + layer * 4_KiB));
  for (int step = 0; step < 20; ++step) {
    std::vector<std::pair<std::size_t, std::size_t>> activations;
    for (int layer = 0; layer < 24; ++layer) {
      const std::size_t size = 8_MiB + (rng() % 64) * 64_KiB;
      activations.emplace_back(allocate(size), size);
      const std::size_t temp_size = small(rng);
      const std::size_t temp = allocate(temp_size);
      w.ops.push_back({false, temp, temp_size});
    }
    for (auto it = activations.rbegin(); it != activations.rend(); ++it)
      w.ops.push_back({false, it->first, it->second});
  }
  for (std::size_t i = 0; i < weights.size(); ++i) w.ops.push_back({false, weights[i], 16_MiB + i * 4_KiB});
  return w;
}

#ifdef ALLOY_DEMO_HAS_ZLIB
workload from_trace(const std::string& path) {
  const alloy::bench::rmm_trace trace = alloy::bench::read_rmm_trace(path);
  workload w{std::filesystem::path(path).filename().string(), {}, trace.allocations};
  for (const auto& e : trace.events) {
    if (e.action == alloy::bench::trace_action::allocate) w.ops.push_back({true, e.allocation, e.size});
    if (e.action == alloy::bench::trace_action::free) w.ops.push_back({false, e.allocation, e.size});
  }
  return w;
}
#endif

workload choose_workload(int argc, char** argv) {
#ifdef ALLOY_DEMO_HAS_ZLIB
  if (argc > 1) return from_trace(argv[1]);
  const std::filesystem::path shipped =
      std::filesystem::path(ALLOY_TRACE_DIR) / "pytorch" / "bcrafton__assignment2-systems__memory_snapshot.rmm.csv.gz";
  if (std::filesystem::exists(shipped)) return from_trace(shipped.string());
#else
  (void)argc, (void)argv;
#endif
  return synthetic_training_loop();
}

struct replay_result {
  double ns_per_op = 0;
  std::size_t failed = 0;
  std::size_t peak_live = 0;
};

/// Replays `w` through `a`; blocks still live at the end are freed afterwards.
template <class A>
replay_result replay(A& a, const workload& w) {
  std::vector<alloy::block> live(w.allocations);
  replay_result r;
  std::size_t in_use = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const op& o : w.ops) {
    if (o.allocate) {
      live[o.index] = a.allocate(o.size, 256);
      if (!live[o.index]) {
        ++r.failed;
        continue;
      }
      in_use += o.size;
      r.peak_live = std::max(r.peak_live, in_use);
    } else if (live[o.index]) {
      a.deallocate(live[o.index]);
      live[o.index] = {};
      in_use -= o.size;
    }
  }
  const auto stop = std::chrono::steady_clock::now();
  r.ns_per_op = std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(w.ops.size());
  for (alloy::block& b : live)
    if (b) a.deallocate(b);
  return r;
}

/// Counts what reaches the upstream, for the comparison with the bare upstream.
template <class Upstream>
struct counting {
  static constexpr bool host_accessible = Upstream::host_accessible;
  static constexpr bool device_accessible = Upstream::device_accessible;
  Upstream up{};
  std::size_t* calls = nullptr;
  alloy::block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    ++*calls;
    return up.allocate(bytes, alignment);
  }
  void deallocate(alloy::block b) noexcept {
    ++*calls;
    up.deallocate(b);
  }
};

/// Peak bytes `a` holds from its upstream while `w` runs through it (a second, untimed replay).
template <class A>
std::size_t peak_reserved(A& a, const workload& w) {
  std::vector<alloy::block> live(w.allocations);
  std::size_t peak = 0;
  for (const op& o : w.ops) {
    if (o.allocate) {
      live[o.index] = a.allocate(o.size, 256);
    } else if (live[o.index]) {
      a.deallocate(live[o.index]);
      live[o.index] = {};
    }
    peak = std::max(peak, a.reserved_bytes());
  }
  for (alloy::block& b : live)
    if (b) a.deallocate(b);
  return peak;
}

template <class Upstream, class Vmm>
int run(const char* memory, const workload& w, Upstream upstream, Vmm vmm) {
  alloy::stats<alloy::default_allocator<Upstream>> alloc{alloy::default_allocator<Upstream>{upstream}};
  alloy::virtual_allocator<Vmm> virt{std::move(vmm)};

  std::size_t bare_calls = 0;
  counting<Upstream> bare{upstream, &bare_calls};
  const replay_result plain = replay(bare, w);
  const replay_result ours = replay(alloc, w);
  const replay_result virtual_run = replay(virt, w);
  const alloy::statistics s = alloc.statistics();
  const alloy::allocator_counters vc = virt.counters();
  virt.release();  // the peak again, from nothing mapped
  const std::size_t virt_peak = peak_reserved(virt, w);
  const auto ratio = [](std::size_t reserved, std::size_t in_use) {
    return in_use ? static_cast<double>(reserved) / static_cast<double>(in_use) : 0.0;
  };

  std::printf("alloy demo\n");
  std::printf("  memory      : %s\n", memory);
  std::printf("  default     : stats<default_allocator> (pool <= 64 KiB, best_fit_arena above)\n");
  std::printf("  virtual     : virtual_allocator (pool <= 128 KiB on a virtual_arena, %s granules)\n",
              alloy::detail::format_bytes(virt.arena().granularity()).c_str());
  std::printf("  workload    : %s, %zu operations\n\n", w.name.c_str(), w.ops.size());
  std::printf("  %-28s %14s %14s %14s\n", "", "bare upstream", "default", "virtual");
  std::printf("  %-28s %14zu %14zu %14zu\n", "upstream calls", bare_calls, s.num_device_alloc + s.num_device_free,
              vc.num_device_alloc + vc.num_device_free);
  std::printf("  %-28s %14s %14s %14zu\n", "map + unmap calls", "-", "-", vc.num_maps + vc.num_unmaps);
  std::printf("  %-28s %14.0f %14.0f %14.0f\n", "ns per operation", plain.ns_per_op, ours.ns_per_op,
              virtual_run.ns_per_op);
  std::printf("  %-28s %14zu %14zu %14zu\n", "failed requests", plain.failed, ours.failed, virtual_run.failed);
  std::printf("  %-28s %14s %14s %14s\n", "peak in use", alloy::detail::format_bytes(plain.peak_live).c_str(),
              alloy::detail::format_bytes(s.peak_bytes_in_use).c_str(),
              alloy::detail::format_bytes(virtual_run.peak_live).c_str());
  std::printf(
      "  %-28s %14s %14s %14s\n", "peak reserved (mapped)", alloy::detail::format_bytes(plain.peak_live).c_str(),
      alloy::detail::format_bytes(s.peak_bytes_reserved).c_str(), alloy::detail::format_bytes(virt_peak).c_str());
  std::printf("  %-28s %14.3f %14.3f %14.3f\n\n", "peak reserved / peak in use", 1.0,
              ratio(s.peak_bytes_reserved, s.peak_bytes_in_use), ratio(virt_peak, virtual_run.peak_live));
  std::printf(
      "  virtual_allocator maps 2 MiB granules where it needs memory and, when the device runs short,\n"
      "  unmaps free granules anywhere: the smallest device that serves a trace is near its peak in use\n"
      "  (alloy-replay --min-capacity; bench/README.md). default_allocator is the faster of the two.\n\n");
  std::printf("%s\n", alloy::memory_summary(alloc).c_str());
  return ours.failed <= plain.failed && virtual_run.failed <= plain.failed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  workload w;
  try {
    w = choose_workload(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "alloy-demo: %s\n", e.what());
    return 2;
  }
#if ALLOY_HAS_CUDA
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  cudaGetLastError();
  if (status == cudaSuccess && devices > 0)
    return run("CUDA device 0 (cudaMalloc; the driver's virtual memory)", w, alloy::cuda_malloc_upstream{},
               alloy::cuda_vmm{});
  const std::string why = std::string("host memory: no CUDA device here (") + cudaGetErrorName(status) + ")";
  return run(why.c_str(), w, alloy::host_upstream{}, alloy::host_vmm{});
#else
  return run("host memory: built without the CUDA toolkit", w, alloy::host_upstream{}, alloy::host_vmm{});
#endif
}
