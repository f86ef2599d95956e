// SPDX-License-Identifier: Apache-2.0
// Virtual memory: how virtual_allocator was chosen, and W1 on it.
//
//   virtual_memory candidates [TRACE...]   # default: every trace in ../shared/traces
//   virtual_memory pieces [TRACE...]       # virtual_allocator's physical pieces: device and calls
//   virtual_memory w1 [SEEDS]              # default: 5 seeds
//   virtual_memory offload [SEEDS]         # default: 3 seeds
//   virtual_memory planned [TRACE...]      # synchronized over a thread-safe backend: the same calls?
//   virtual_memory placements [TRACE...]   # peak granules touched by other online placements
//
// All but `offload` run on alloy-replay's simulated devices (tools/replay): the virtual compositions on
// the device with virtual memory (2 MiB granules, physical memory counted, addresses never
// touched), default_allocator on the device of segments. Their calls cost host bookkeeping, not a
// driver's microseconds: the times compare the allocators' own work; the map calls are printed.
//
// candidates: for each candidate layout — the arena alone; a pool up to 16 KiB / 64 KiB / 256 KiB
// / 1 MiB with various slabs beside it, slabs from the same arena — and each release threshold,
// then pools up to 64 KiB and 128 KiB over virtual_allocator's own arena options,
// over every trace: the smallest device capacity ÷ peak live (alloy-replay --min-capacity's
// search; geometric mean, worst PyTorch trace, worst MiniMalloc instance), peak mapped ÷ peak live
// without a limit (geometric mean), map + unmap calls per 1,000 operations (arithmetic mean) and
// ns per operation (geometric mean of the medians of 3 replays).
//
// pieces: virtual_allocator with a physical piece per granule of 2-32 MiB and with block-sized
// pieces, without and with frontier growth (its default: 1/32), over every trace (or those named):
// the smallest device ÷ peak live, the map + unmap calls per 1,000 operations there and without a
// limit, and the peak mapped without a limit, per trace. On a GPU the calls are the time
// (bench/virtual_memory/virtual_memory_gpu.cu).
//
// w1: workload W1 (1,000 live blocks, 256 B-4 MiB log-uniform, a million free+allocate pairs,
// alignment 256) with several seeds: ns per pair (this thread's CPU time, median of 7 rounds in
// which the three take turns, one later each round), peak reserved (mapped) ÷ peak live, map
// calls per pair, for default_allocator, virtual_arena (default options) and virtual_allocator,
// and virtual_allocator's time ÷ default_allocator's (the median of each round's ratio);
// beside them the arena's peak mapped when every granule is unmapped as soon as no chunk touches
// it (no threshold, no share, not kept up to the peak): the granules live chunks touch, the least
// any release rule can map with this placement; and the peak mapped of virtual_arena_pair (two
// arenas, default options, under granule_segregator<256 KiB>; one run, not timed).
//
// offload: a sleep / wake cycle through virtual_allocator over host_vmm (real memory, 2 MiB
// granules, every call counted): about 512 MiB of weights (tag 1: matrices of 1-24 MiB and small
// vectors) and 48 key/value cache blocks of 8-16 MiB (tag 2) allocated, the weights offloaded
// and the cache discarded, both restored; the driver calls of each phase (creates + maps,
// unmaps), with block-sized pieces (the default) and with a piece per granule. On a GPU each call
// is microseconds (about 36 us a create + map on an H200), so they are the wake-up's time.
//
// planned: every trace (or those named) through virtual_allocator and through
// synchronized<virtual_allocator> over a thread-safe backend (`vmm_ref<synchronized_vmm<V>>`),
// whose growths are planned under the lock and mapped outside it, in one thread: map + unmap
// calls per 1,000 operations and peak mapped ÷ peak live without a limit. The two should make
// the same calls: threads are not to pay for the lock with more driver calls.
//
// placements: W1 over five seeds and every trace (or those named), the peak of the granules live
// blocks touch ÷ peak live, for virtual_arena (every granule unmapped once no chunk touches it:
// what it maps at the peak with its placement) and for a model heap (placement_model.hpp) placing
// the same requests by other online policies: best fit, best fit with the arena's granule rule,
// first fit, the fewest new granules over every free chunk, and best fit with blocks up to 64 KiB
// (or 256 KiB) in an address range of their own; and virtual_arena_pair (granule_segregator of two
// arenas, blocks up to 256 KiB apart unless that adds a granule). Beside them the granule bound
// (peak live rounded up to granules), and on the traces a placement told every lifetime beforehand
// (offline_plan.hpp; far too slow for W1's two million operations): the best placement lies
// between the granule bound and the least of the others. Whether the peak-mapped targets (1.05
// PyTorch, 1.10 W1) are within reach of another placement, and what the best one must waste.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <alloy/policy/synchronized.hpp>
#include <alloy/showcase.hpp>
#include <alloy/tag.hpp>
#include <alloy/vmm/host_vmm.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>

#include "replay/compositions.hpp"
#include "replay/min_capacity.hpp"
#include "replay/trace_reader.hpp"
#include "support/pairs_workload.hpp"
#include "support/sleep_wake_workload.hpp"
#include "virtual_memory/offline_plan.hpp"
#include "virtual_memory/placement_model.hpp"

namespace {

using namespace alloy;
using namespace alloy::literals;
using replay::simulated_vm_device;
using vm = simulated_vm_device::backend;
using arena_t = virtual_arena<vm>;
/// alloy-replay's virtual_arena_pair: small blocks (up to 256 KiB) in an arena of their own unless
/// that adds a granule the other would not.
using arena_pair_t = replay::virtual_arena_pair_t;
static_assert(std::is_same_v<arena_pair_t, granule_segregator<256_KiB, arena_t, arena_t>>);

/// The arena's options that unmap every granule as soon as no chunk touches it (no threshold, no
/// share, not kept up to the peak): its peak mapped is then the granules live chunks touch.
const arena_t::options unmap_at_once{.release_threshold = 0, .release_threshold_divisor = 0, .keep_up_to_peak = false};

/// A pool up to `T` (classes to 2T) whose slabs come from the owned arena, the arena above: the
/// shape of virtual_allocator with its threshold as a parameter.
template <std::size_t T>
class candidate {
 public:
  using small_t = size_class_pool<ref<arena_t>, power2_classes<4, 256, 2 * T>>;
  static constexpr bool host_accessible = false, device_accessible = true;
  candidate(vm v, arena_t::options ao, typename small_t::options so)
      : arena_(std::make_unique<arena_t>(v, ao)), heap_(small_t{ref<arena_t>{*arena_}, so}, ref<arena_t>{*arena_}) {}
  candidate(candidate&&) noexcept = default;
  block allocate(std::size_t n, std::size_t a) noexcept { return heap_.allocate(n, a); }
  void deallocate(block b) noexcept { heap_.deallocate(b); }

 private:
  std::unique_ptr<arena_t> arena_;
  segregator<T, small_t, ref<arena_t>> heap_;
};

/// The arena alone, by value.
class arena_alone {
 public:
  static constexpr bool host_accessible = false, device_accessible = true;
  arena_alone(vm v, arena_t::options ao) : arena_(v, ao) {}
  block allocate(std::size_t n, std::size_t a) noexcept { return arena_.allocate(n, a); }
  void deallocate(block b) noexcept { arena_.deallocate(b); }

 private:
  arena_t arena_;
};

struct variant {
  std::string name;
  std::function<replay::replay_result(const bench::rmm_trace&, simulated_vm_device&, const replay::replay_options&)>
      run;
};

template <class Make>
variant make_variant(std::string name, Make make) {
  return {name, [make, name](const bench::rmm_trace& t, simulated_vm_device& d, const replay::replay_options& o) {
            return replay::replay(
                t, d, [&] { return replay::raw_target<decltype(make(d))>{make(d), o.alignment}; }, o, name);
          }};
}

std::string mib(std::size_t bytes) { return bytes == ~std::size_t{0} ? "none" : std::to_string(bytes >> 20) + " MiB"; }

/// The traces named in `paths`, or every trace in ../shared/traces (their paths put in `paths`);
/// none (said why) when there are none.
std::vector<bench::rmm_trace> read_traces(std::vector<std::string>& paths) {
  if (paths.empty()) {
    const std::filesystem::path dir = ALLOY_TRACE_DIR;
    for (const char* sub : {"pytorch", "minimalloc"})
      if (std::filesystem::exists(dir / sub))
        for (const auto& e : std::filesystem::directory_iterator(dir / sub)) {
          const std::string p = e.path().string();
          if (p.ends_with(".rmm.csv.gz") || p.ends_with(".events.rmm.csv")) paths.push_back(p);
        }
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty()) std::fprintf(stderr, "virtual_memory: no traces under %s\n", ALLOY_TRACE_DIR);
  std::vector<bench::rmm_trace> traces;
  for (const auto& p : paths) traces.push_back(bench::read_trace(p));
  return traces;
}

int candidates(std::vector<std::string> paths) {
  const std::vector<bench::rmm_trace> traces = read_traces(paths);
  if (traces.empty()) return 1;
  std::vector<variant> vs;
  auto add_layouts = [&](std::size_t rt) {
    const arena_t::options ao{
        .release_threshold = rt, .release_threshold_divisor = 0, .keep_up_to_peak = false};  // the threshold alone
    const std::string r = ", threshold " + mib(rt);
    vs.push_back(make_variant("arena alone" + r, [ao](simulated_vm_device& d) { return arena_alone{vm{d}, ao}; }));
    vs.push_back(make_variant("pool<=16K, slabs 64K-256K" + r, [ao](simulated_vm_device& d) {
      return candidate<16_KiB>{vm{d}, ao, {.slab_size = 256_KiB, .initial_slab_size = 64_KiB}};
    }));
    vs.push_back(make_variant("pool<=64K, slabs 64K-256K" + r, [ao](simulated_vm_device& d) {
      return candidate<64_KiB>{vm{d}, ao, {.slab_size = 256_KiB, .initial_slab_size = 64_KiB}};
    }));
    vs.push_back(make_variant("pool<=64K, slabs 2M" + r, [ao](simulated_vm_device& d) {
      return candidate<64_KiB>{vm{d}, ao, {.slab_size = 2_MiB}};
    }));
    vs.push_back(make_variant("pool<=256K, slabs 256K-2M" + r, [ao](simulated_vm_device& d) {
      return candidate<256_KiB>{vm{d}, ao, {.slab_size = 2_MiB, .initial_slab_size = 256_KiB}};
    }));
    vs.push_back(make_variant("pool<=1M, slabs 2M" + r, [ao](simulated_vm_device& d) {
      return candidate<1_MiB>{vm{d}, ao, {.slab_size = 2_MiB}};
    }));
  };
  add_layouts(0);
  add_layouts(64_MiB);
  for (const std::size_t rt : {std::size_t{16} << 20, std::size_t{256} << 20, std::size_t{1} << 30, ~std::size_t{0}}) {
    const arena_t::options ao{.release_threshold = rt, .release_threshold_divisor = 0, .keep_up_to_peak = false};
    vs.push_back(make_variant("pool<=64K, slabs 64K-256K, threshold " + mib(rt), [ao](simulated_vm_device& d) {
      return candidate<64_KiB>{vm{d}, ao, {.slab_size = 256_KiB, .initial_slab_size = 64_KiB}};
    }));
  }
  // The arena's defaults: no threshold, no share, up to the peak of the granules live chunks touch.
  vs.push_back(make_variant("arena alone, default release (up to the peak touched)",
                            [](simulated_vm_device& d) { return arena_alone{vm{d}, arena_t::options{}}; }));
  vs.push_back(
      make_variant("pool<=64K, slabs 64K-256K, default release (up to the peak touched)", [](simulated_vm_device& d) {
        return candidate<64_KiB>{vm{d}, arena_t::options{}, {.slab_size = 256_KiB, .initial_slab_size = 64_KiB}};
      }));
  // virtual_allocator's own arena (free granules kept mapped, block-sized pieces, frontier growth):
  // its pool up to 64 KiB (as default_allocator's) and up to 128 KiB (as its own).
  const arena_t::options shipped = virtual_allocator<vm>::options{}.arena;
  vs.push_back(make_variant("pool<=64K, slabs 64K-256K, virtual_allocator's arena", [shipped](simulated_vm_device& d) {
    return candidate<64_KiB>{vm{d}, shipped, {.slab_size = 256_KiB, .initial_slab_size = 64_KiB}};
  }));
  vs.push_back(make_variant("pool<=128K, slabs 64K-256K, virtual_allocator's arena", [shipped](simulated_vm_device& d) {
    return candidate<128_KiB>{vm{d}, shipped, {.slab_size = 256_KiB, .initial_slab_size = 64_KiB}};
  }));
  std::printf("%zu traces, 2 MiB granules, alignment 256; min capacity to 0.5 %%\n\n", traces.size());
  std::printf(
      "| candidate | min capacity ÷ live, geo. mean | worst PyTorch | worst MiniMalloc | peak mapped ÷ live, no limit "
      "| "
      "map calls / 1k ops | ns/op |\n|---|---:|---:|---:|---:|---:|---:|\n");
  for (const variant& v : vs) {
    double log_min = 0, log_unlimited = 0, log_ns = 0, maps = 0, worst_pytorch = 0, worst_minimalloc = 0;
    for (std::size_t i = 0; i < traces.size(); ++i) {
      simulated_vm_device device;
      const replay::replay_result base = v.run(traces[i], device, {.repetitions = 3});
      const replay::min_capacity_result m = replay::find_min_capacity(traces[i], [&](std::size_t c) {
        device.set_capacity(c);
        return v.run(traces[i], device, {.capacity = c, .repetitions = 0});
      });
      log_min += std::log(m.over_live);
      log_unlimited += std::log(base.reserved_over_live);
      log_ns += std::log(base.ns_per_op);
      maps += 1000.0 * static_cast<double>(base.map_calls) / static_cast<double>(base.operations);
      double& worst = paths[i].find("minimalloc") != std::string::npos ? worst_minimalloc : worst_pytorch;
      worst = std::max(worst, m.over_live);
    }
    const double n = static_cast<double>(traces.size());
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.0f | %.1f |\n", v.name.c_str(), std::exp(log_min / n),
                worst_pytorch, worst_minimalloc, std::exp(log_unlimited / n), maps / n, std::exp(log_ns / n));
  }
  return 0;
}

/// pieces: virtual_allocator with one physical piece per granule of 2, 4, 8, 16 and 32 MiB
/// (`options.arena.granularity`, `block_sized_pieces` off; the device's granule stays 2 MiB), and
/// 2 MiB granules with block-sized pieces (a block's run of unmapped granules in one), without and
/// with frontier growth of 1/16 and 1/32 (the default) of the mapped granules. On a GPU a create
/// and a map cost about 36 us whatever the piece's size (virtual_memory_gpu calls, an H200), so the
/// calls are the time; this is what fewer of them cost in device memory. Each cell: the smallest
/// device ÷ peak live, the map + unmap calls per 1,000 operations there and those of a replay
/// without a limit (the first mapping of each piece: a cold run's calls), and that replay's peak
/// mapped ÷ peak live.
int pieces(std::vector<std::string> paths) {
  const std::vector<bench::rmm_trace> traces = read_traces(paths);
  if (traces.empty()) return 1;
  struct layout {
    std::string name;
    virtual_allocator<vm>::options options;
  };
  std::vector<layout> layouts;
  for (std::size_t p : {2_MiB, 4_MiB, 8_MiB, 16_MiB, 32_MiB}) {
    layouts.push_back({"a piece per " + mib(p), {}});
    layouts.back().options.arena.granularity = p;
    layouts.back().options.arena.block_sized_pieces = false;
  }
  for (const std::size_t divisor : {std::size_t{0}, std::size_t{16}, std::size_t{32}}) {
    layouts.push_back({divisor == 0    ? "block-sized pieces"
                       : divisor == 32 ? "frontier growth 1/32 (the default)"
                                       : "frontier growth 1/" + std::to_string(divisor),
                       {}});
    layouts.back().options.arena.frontier_growth_divisor = divisor;
  }
  std::printf(
      "virtual_allocator by physical piece size: smallest device ÷ peak live (to 0.5 %%), map + unmap calls "
      "per 1,000 operations at that device / without a limit; peak mapped ÷ peak live without a limit\n\n"
      "| trace | peak live |");
  for (const layout& l : layouts) std::printf(" %s |", l.name.c_str());
  std::printf("\n|---|---:|");
  for (std::size_t k = 0; k < layouts.size(); ++k) std::printf("---:|");
  std::printf("\n");
  std::vector<double> log_sum(layouts.size()), worst(layouts.size()), log_calls(layouts.size()),
      log_mapped(layouts.size());
  for (const bench::rmm_trace& t : traces) {
    std::printf("| %s | %.1f MiB |", std::filesystem::path(t.name).filename().c_str(),
                static_cast<double>(t.peak_live_bytes) / (1 << 20));
    for (std::size_t k = 0; k < layouts.size(); ++k) {
      const virtual_allocator<vm>::options o = layouts[k].options;
      const variant v = make_variant("pieces", [o](simulated_vm_device& d) { return virtual_allocator<vm>{vm{d}, o}; });
      simulated_vm_device device;
      const replay::replay_result unlimited = v.run(t, device, {.repetitions = 0});
      const replay::min_capacity_result m = replay::find_min_capacity(t, [&](std::size_t c) {
        device.set_capacity(c);
        return v.run(t, device, {.capacity = c, .repetitions = 0});
      });
      const auto per_1k = [](const replay::replay_result& r) {
        return 1000.0 * static_cast<double>(r.map_calls) / static_cast<double>(std::max<std::size_t>(r.operations, 1));
      };
      const double mapped =
          static_cast<double>(unlimited.peak_mapped) / static_cast<double>(std::max<std::size_t>(t.peak_live_bytes, 1));
      std::printf(" %.3f (%.0f / %.1f; %.3f) |", m.over_live, per_1k(m.at_capacity), per_1k(unlimited), mapped);
      log_sum[k] += std::log(m.over_live);
      log_mapped[k] += std::log(mapped);
      log_calls[k] += std::log(std::max(per_1k(unlimited), 0.01));
      worst[k] = std::max(worst[k], m.over_live);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  const double n = static_cast<double>(traces.size());
  std::printf("| geometric mean | |");
  for (std::size_t k = 0; k < layouts.size(); ++k)
    std::printf(" %.3f (%.1f without a limit; %.3f) |", std::exp(log_sum[k] / n), std::exp(log_calls[k] / n),
                std::exp(log_mapped[k] / n));
  std::printf("\n| worst | |");
  for (double w : worst) std::printf(" %.3f |", w);
  std::printf("\n");
  return 0;
}

constexpr std::size_t w1_rounds = 7;

int w1(int seeds) {
  using clock = bench::thread_cpu_clock;
  std::printf(
      "W1: 1,000 live, 256 B-4 MiB log-uniform, 1,000,000 pairs, alignment 256; ns/pair = this thread's CPU time, "
      "median of %zu rounds taking turns; virtual_allocator ÷ default: the median of each round's ratio\n\n",
      w1_rounds);
  std::printf(
      "| seed | default_allocator ns | reserved ÷ live | virtual_arena ns | map calls / pair | mapped ÷ live | "
      "virtual_allocator ns | map calls / pair | mapped ÷ live | virtual_allocator ÷ default | touched granules ÷ "
      "live (peak) | virtual_arena_pair mapped ÷ live |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<double> ratios;
  for (int s = 0; s < seeds; ++s) {
    bench::workload_params p = bench::w1_params();
    p.seed += 1000 * static_cast<std::uint64_t>(s);
    const bench::workload w = bench::make_workload(p);
    const double live = static_cast<double>(w.peak_live);
    std::vector<double> td, ta, tv, paired;
    double rd = 0, ra = 0, rv = 0, ma = 0, mv = 0;
    const auto run_default = [&] {
      replay::simulated_device d;
      default_allocator<replay::device_upstream> a{replay::device_upstream{d}};
      td.push_back(bench::run_pairs_on<clock>(w, a, 256));
      rd = static_cast<double>(d.peak_reserved()) / live;
    };
    const auto run_arena = [&] {
      simulated_vm_device d;
      arena_t a{vm{d}};
      ta.push_back(bench::run_pairs_on<clock>(w, a, 256));
      ra = static_cast<double>(d.peak_mapped()) / live;
      ma = static_cast<double>(d.map_calls()) / static_cast<double>(w.pairs());
    };
    const auto run_virtual = [&] {
      simulated_vm_device d;
      virtual_allocator<vm> a{vm{d}};
      tv.push_back(bench::run_pairs_on<clock>(w, a, 256));
      rv = static_cast<double>(d.peak_mapped()) / live;
      mv = static_cast<double>(d.map_calls()) / static_cast<double>(w.pairs());
    };
    const std::function<void()> runs[] = {run_default, run_arena, run_virtual};
    // In turns, one allocator later each round: the VM's drift falls on all three alike.
    for (std::size_t r = 0; r < w1_rounds; ++r) {
      for (std::size_t i = 0; i < std::size(runs); ++i) runs[(i + r) % std::size(runs)]();
      paired.push_back(tv.back() / td.back());
    }
    double touched = 0, pair = 0;  // deterministic: one run each
    {
      simulated_vm_device d;
      arena_t a{vm{d}, unmap_at_once};
      (void)bench::run_pairs_on<clock>(w, a, 256);
      touched = static_cast<double>(d.peak_mapped()) / live;
    }
    {
      simulated_vm_device d;
      arena_pair_t a{arena_t{vm{d}}, arena_t{vm{d}}};
      (void)bench::run_pairs_on<clock>(w, a, 256);
      pair = static_cast<double>(d.peak_mapped()) / live;
    }
    const double nd = bench::median(td), na = bench::median(ta), nv = bench::median(tv);
    const double ratio = bench::median(paired);
    ratios.push_back(ratio);
    std::printf("| %llu | %.1f | %.3f | %.1f | %.3f | %.3f | %.1f | %.3f | %.3f | %.2f | %.3f | %.3f |\n",
                static_cast<unsigned long long>(p.seed), nd, rd, na, ma, ra, nv, mv, rv, ratio, touched, pair);
  }
  std::printf("\nvirtual_allocator ÷ default_allocator, median over the seeds: %.2f\n", bench::median(ratios));
  return 0;
}

/// One sleep / wake cycle of `offload`'s workload and its calls; `ok` is false when a call did not
/// succeed or the weights did not come back intact.
struct offload_calls {
  std::size_t weight_blocks = 0, weight_bytes = 0, cache_blocks = 0, cache_bytes = 0;
  std::size_t allocate = 0, offload = 0, restore = 0;  // creates + maps, unmaps, creates + maps
  bool ok = false;
};
offload_calls sleep_and_wake(std::uint64_t seed, bool block_sized) {
  host_vmm backend{{.granularity = 2_MiB}};
  virtual_allocator<vmm_ref<host_vmm>>::options o;
  o.arena.block_sized_pieces = block_sized;
  virtual_allocator<vmm_ref<host_vmm>> a{vmm_ref<host_vmm>{backend}, o};
  const auto created_and_mapped = [&] { return backend.calls().creates + backend.calls().maps; };
  const bench::sleep_wake_sizes sizes = bench::sleep_wake_workload(seed);
  offload_calls r;
  std::vector<block> weights, cache;
  for (const std::size_t bytes : sizes.weights) {
    const block b = a.allocate(bytes, 256, tag{1});
    if (!b) return r;
    std::memset(b.ptr, static_cast<int>(weights.size() % 251), bytes);
    weights.push_back(b);
    r.weight_bytes += bytes;
  }
  for (const std::size_t bytes : sizes.cache) {
    const block b = a.allocate(bytes, 256, tag{2});
    if (!b) return r;
    cache.push_back(b);
    r.cache_bytes += bytes;
  }
  r.weight_blocks = weights.size();
  r.cache_blocks = cache.size();
  r.allocate = created_and_mapped();
  const std::size_t unmaps = backend.calls().unmaps;
  const bool slept = a.offload(tag{1}) == offload_status::done && a.discard(tag{2}) == offload_status::done;
  r.offload = backend.calls().unmaps - unmaps;
  const std::size_t before = created_and_mapped();
  const bool woke = slept && a.restore(tag{1}) == offload_status::done && a.restore(tag{2}) == offload_status::done;
  r.restore = created_and_mapped() - before;
  r.ok = woke;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(weights[i].ptr);
    const auto written = static_cast<unsigned char>(i % 251);
    r.ok = r.ok && std::all_of(p, p + weights[i].size, [written](unsigned char c) { return c == written; });
    a.deallocate(weights[i]);
  }
  for (const block& b : cache) a.deallocate(b);
  return r;
}

int offload(int seeds) {
  std::printf(
      "A sleep / wake cycle through virtual_allocator<host_vmm> (2 MiB granules): driver calls per phase, "
      "block-sized pieces (the default) / a piece per granule\n\n"
      "| seed | weights (tag 1) | key/value cache (tag 2) | allocate: creates + maps | offload + discard: unmaps | "
      "restore: creates + maps |\n|---:|---|---|---:|---:|---:|\n");
  for (int s = 1; s <= seeds; ++s) {
    const offload_calls pieces = sleep_and_wake(static_cast<std::uint64_t>(s), true);
    const offload_calls granules = sleep_and_wake(static_cast<std::uint64_t>(s), false);
    if (!pieces.ok || !granules.ok) {
      std::fprintf(stderr, "virtual_memory offload: seed %d: a call failed or the weights changed\n", s);
      return 1;
    }
    std::printf("| %d | %zu MiB in %zu blocks | %zu MiB in %zu blocks | %zu / %zu | %zu / %zu | %zu / %zu |\n", s,
                pieces.weight_bytes >> 20, pieces.weight_blocks, pieces.cache_bytes >> 20, pieces.cache_blocks,
                pieces.allocate, granules.allocate, pieces.offload, granules.offload, pieces.restore, granules.restore);
  }
  return 0;
}

int planned(std::vector<std::string> paths) {
  const std::vector<bench::rmm_trace> traces = read_traces(paths);
  if (traces.empty()) return 1;
  using shared_backend = synchronized_vmm<vm>;
  using planning = virtual_allocator<vmm_ref<shared_backend>>;
  static_assert(growth_planning_allocator<planning> && !growth_planning_allocator<virtual_allocator<vm>>);
  std::printf(
      "virtual_allocator alone and under synchronized over a thread-safe backend (growths planned, mapped "
      "outside the lock), one thread, no limit: map + unmap calls per 1,000 operations; peak mapped ÷ peak live\n\n"
      "| trace | alone: calls | mapped | synchronized: calls | mapped |\n|---|---:|---:|---:|---:|\n");
  const auto per_1k = [](const replay::replay_result& r) {
    return 1000.0 * static_cast<double>(r.map_calls) / static_cast<double>(std::max<std::size_t>(r.operations, 1));
  };
  const replay::replay_options o{.repetitions = 0};
  const variant alone = make_variant("alone", [](simulated_vm_device& d) { return virtual_allocator<vm>{vm{d}}; });
  double log_alone = 0, log_planned = 0;
  bool all_served = true;
  for (const bench::rmm_trace& t : traces) {
    const double live = static_cast<double>(std::max<std::size_t>(t.peak_live_bytes, 1));
    simulated_vm_device d1, d2;
    const replay::replay_result a = alone.run(t, d1, o);
    // `synchronized` does not move, as alloy-replay's targets do: it lives here, made when the
    // replay asks for its target (after the device's reset), and the target refers to it.
    std::optional<shared_backend> backend;
    std::optional<synchronized<planning>> locked;
    const replay::replay_result p = replay::replay(
        t, d2,
        [&] {
          locked.reset();  // before the backend it refers to
          backend.emplace(vm{d2});
          locked.emplace(planning{vmm_ref<shared_backend>{*backend}});
          return replay::raw_target<ref<synchronized<planning>>>{ref<synchronized<planning>>{*locked}, o.alignment};
        },
        o, "synchronized");
    std::printf("| %s | %.1f | %.3f | %.1f | %.3f |\n", std::filesystem::path(t.name).filename().c_str(), per_1k(a),
                static_cast<double>(a.peak_mapped) / live, per_1k(p), static_cast<double>(p.peak_mapped) / live);
    log_alone += std::log(std::max(per_1k(a), 0.01));
    log_planned += std::log(std::max(per_1k(p), 0.01));
    all_served = all_served && a.served_all() && p.served_all();
  }
  const double n = static_cast<double>(traces.size());
  std::printf("| geometric mean | %.1f | | %.1f | |\n", std::exp(log_alone / n), std::exp(log_planned / n));
  if (!all_served) std::printf("\nrequests failed or answers were wrong (none should be without a limit)\n");
  return all_served ? 0 : 1;
}

/// A workload as allocations and frees of numbered blocks, for the placement models.
struct placement_op {
  bool free = false;
  std::uint32_t id = 0;
  std::size_t bytes = 0;
};
std::vector<placement_op> ops_of(const bench::workload& w) {
  std::vector<placement_op> ops;
  std::vector<std::size_t> slot = w.initial;
  for (std::uint32_t i = 0; i < slot.size(); ++i) ops.push_back({false, i, slot[i]});
  for (std::size_t i = 0; i < w.pairs(); ++i) {
    const std::uint32_t v = w.victim[i];
    ops.push_back({true, v, slot[v]});
    ops.push_back({false, v, slot[v] = w.size[i]});
  }
  return ops;
}
/// A trace's events; a request the trace saw fail is allocated and freed at once (as the replay does).
std::vector<placement_op> ops_of(const bench::rmm_trace& t) {
  std::vector<placement_op> ops;
  const auto id = [](std::size_t n) { return static_cast<std::uint32_t>(n); };
  for (const bench::trace_event& e : t.events) {
    if (e.action == bench::trace_action::free) {
      ops.push_back({true, id(e.allocation), e.size});
    } else if (e.action == bench::trace_action::allocate) {
      ops.push_back({false, id(e.allocation), e.size});
    } else {
      ops.push_back({false, id(t.allocations), e.size});
      ops.push_back({true, id(t.allocations), e.size});
    }
  }
  return ops;
}
std::size_t ids_of(const std::vector<placement_op>& ops) {
  std::size_t n = 0;
  for (const placement_op& o : ops) n = std::max<std::size_t>(n, o.id + 1);
  return n;
}
/// Each block of `ops` with the operations it is live over (to the end when never freed).
std::vector<bench::block_lifetime> lifetimes_of(const std::vector<placement_op>& ops) {
  std::vector<bench::block_lifetime> blocks;
  std::vector<std::size_t> current(ids_of(ops));  // per id: its block now (ids are used again)
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].free) {
      blocks[current[ops[i].id]].end = i;
    } else {
      current[ops[i].id] = blocks.size();
      blocks.push_back({i, ops.size(), ops[i].bytes});
    }
  }
  return blocks;
}
/// Peak granules touched ÷ `peak_live` placing `ops` in `model`; 0 when its books did not add up.
template <class Model>
double peak_touched(Model model, const std::vector<placement_op>& ops, std::size_t peak_live, std::size_t granule) {
  std::vector<std::uint64_t> at(ids_of(ops));
  std::size_t peak = 0;
  for (const placement_op& o : ops) {
    if (o.free) model.deallocate(at[o.id], o.bytes);
    else at[o.id] = model.allocate(o.bytes);
    peak = std::max(peak, model.touched_granules());
  }
  if (!model.consistent()) return 0;
  return static_cast<double>(peak * granule) / static_cast<double>(peak_live);
}
/// The same for virtual_arena itself (or two under `granule_segregator`), every granule unmapped
/// once no chunk touches it.
template <class Heap = arena_t>
double arena_peak_touched(const std::vector<placement_op>& ops, std::size_t peak_live) {
  simulated_vm_device d;
  Heap a = [&] {
    if constexpr (std::is_same_v<Heap, arena_t>) return arena_t{vm{d}, unmap_at_once};
    else return Heap{arena_t{vm{d}, unmap_at_once}, arena_t{vm{d}, unmap_at_once}};
  }();
  std::vector<block> held(ids_of(ops));
  for (const placement_op& o : ops) {
    if (o.free) a.deallocate(held[o.id]);
    else if (held[o.id] = a.allocate(o.bytes, 256); !held[o.id]) return 0;
  }
  return static_cast<double>(d.peak_mapped()) / static_cast<double>(peak_live);
}

int placements(std::vector<std::string> paths) {
  constexpr std::size_t granule = 2_MiB;
  const std::vector<bench::rmm_trace> traces = read_traces(paths);
  std::printf(
      "Peak granules touched by live blocks ÷ peak live (2 MiB granules, requests rounded to 256 B): virtual_arena "
      "(unmapping every granule once no chunk touches it) and a model heap placing the same requests by other "
      "online policies (bench/virtual_memory/placement_model.hpp); W1: 1,000 live, 256 B-4 MiB, 1,000,000 "
      "pairs. Last, a placement told every block's lifetime beforehand (bench/virtual_memory/offline_plan.hpp; "
      "not run on W1, too slow there): the best placement lies between the granule bound and the least of the "
      "others\n\n"
      "| workload | peak live | granule bound | virtual_arena | best fit | best fit, granule rule | first fit | "
      "fewest new granules | up to 64 KiB apart | up to 256 KiB apart | virtual_arena_pair | knowing every "
      "lifetime |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  bool consistent = true;
  const auto row = [&](const std::string& name, const std::vector<placement_op>& ops, std::size_t peak_live,
                       bool plan) {
    using bench::placement;
    const double bound =
        static_cast<double>((peak_live + granule - 1) / granule * granule) / static_cast<double>(peak_live);
    const double figures[] = {
        arena_peak_touched(ops, peak_live),
        peak_touched(bench::placement_model{placement::best_fit, granule}, ops, peak_live, granule),
        peak_touched(bench::placement_model{placement::best_fit_granules, granule}, ops, peak_live, granule),
        peak_touched(bench::placement_model{placement::first_fit, granule}, ops, peak_live, granule),
        peak_touched(bench::placement_model{placement::fewest_new_granules, granule}, ops, peak_live, granule),
        peak_touched(bench::segregated_placement_model{placement::best_fit, 64_KiB, granule}, ops, peak_live, granule),
        peak_touched(bench::segregated_placement_model{placement::best_fit, 256_KiB, granule}, ops, peak_live, granule),
        arena_peak_touched<arena_pair_t>(ops, peak_live)};
    std::printf("| %s | %s | %.3f |", name.c_str(), mib(peak_live).c_str(), bound);
    for (const double f : figures) {
      consistent = consistent && f > 0;
      std::printf(" %.3f |", f);
    }
    if (plan) {
      const bench::offline_plan p(lifetimes_of(ops), granule);
      std::printf(" %.3f |", static_cast<double>(p.peak_touched_granules() * granule) / static_cast<double>(peak_live));
    } else {
      std::printf(" – |");
    }
    std::printf("\n");
    std::fflush(stdout);
  };
  for (int s = 0; s < 5; ++s) {
    bench::workload_params p = bench::w1_params();
    p.seed += 1000 * static_cast<std::uint64_t>(s);
    const bench::workload w = bench::make_workload(p);
    row("W1 seed " + std::to_string(p.seed), ops_of(w), w.peak_live, false);
  }
  for (const bench::rmm_trace& t : traces)
    row(std::filesystem::path(t.name).filename(), ops_of(t), t.peak_live_bytes, true);
  if (!consistent) std::printf("\na model's books did not add up, or the arena failed a request (0.000 above)\n");
  return consistent ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "candidates") return candidates(std::vector<std::string>(argv + 2, argv + argc));
  if (what == "pieces") return pieces(std::vector<std::string>(argv + 2, argv + argc));
  if (what == "w1") return w1(argc > 2 ? std::max(1, std::atoi(argv[2])) : 5);
  if (what == "offload") return offload(argc > 2 ? std::max(1, std::atoi(argv[2])) : 3);
  if (what == "planned") return planned(std::vector<std::string>(argv + 2, argv + argc));
  if (what == "placements") return placements(std::vector<std::string>(argv + 2, argv + argc));
  std::fprintf(
      stderr,
      "usage: virtual_memory candidates [TRACE...] | virtual_memory pieces [TRACE...] | virtual_memory w1 "
      "[SEEDS] | virtual_memory offload [SEEDS] | virtual_memory planned [TRACE...] | virtual_memory placements "
      "[TRACE...]\n");
  return 2;
}
