// SPDX-License-Identifier: Apache-2.0
// tools/ab-time/ab_side.cpp: one side of an A/B timing. tools/ab-time/ab-time compiles this file
// twice, against the headers of two trees, into shared objects with hidden symbols; the driver
// loads both into one process and replays in turns, so that both sides see the same machine.
// The replay loop and the compositions are alloy-replay's (tools/replay), as the published
// figures' are.
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include "ab_side.hpp"
#include "replay/compositions.hpp"
#include "replay/trace_reader.hpp"
#include "support/pairs_workload.hpp"

namespace {

using namespace alloy;
using namespace alloy::replay;

enum class which { unknown, virtual_allocator, virtual_arena, virtual_arena_pair, default_allocator };

which parse(std::string_view name) {
  if (name == "virtual_allocator") return which::virtual_allocator;
  if (name == "virtual_arena") return which::virtual_arena;
  if (name == "virtual_arena_pair") return which::virtual_arena_pair;
  if (name == "default_allocator") return which::default_allocator;
  return which::unknown;
}

devices& the_devices() {
  static devices d;
  return d;
}

/// Calls `f` with a function that makes a fresh target of composition `w` on its device.
template <class F>
void with_target(which w, F&& f) {
  devices& d = the_devices();
  switch (w) {
    case which::virtual_allocator:
      f(d.vm, [&] { return raw_target<virtual_allocator_t>{virtual_allocator_t{vm_t{d.vm}}, 256}; });
      break;
    case which::virtual_arena:
      f(d.vm, [&] { return raw_target<virtual_arena_t>{virtual_arena_t{vm_t{d.vm}}, 256}; });
      break;
    case which::virtual_arena_pair:
      f(d.vm, [&] {
        return raw_target<virtual_arena_pair_t>{
            virtual_arena_pair_t{virtual_arena_t{vm_t{d.vm}}, virtual_arena_t{vm_t{d.vm}}}, 256};
      });
      break;
    case which::default_allocator:
      f(d.segments, [&] { return raw_target<default_t>{make_default(upstream_t{d.segments}), 256}; });
      break;
    case which::unknown: break;
  }
}

const bench::rmm_trace* trace_at(const char* path) {
  static std::map<std::string, std::unique_ptr<bench::rmm_trace>> read;
  auto [at, fresh] = read.try_emplace(path);
  if (fresh) {
    try {
      at->second = std::make_unique<bench::rmm_trace>(bench::read_trace(path));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ab_side: %s: %s\n", path, e.what());
    }
  }
  return at->second.get();
}

template <class Device>
void device_figures(const Device& d, alloy_ab_figures& out) {
  if constexpr (std::is_same_v<Device, simulated_vm_device>) {
    out.device_calls = d.map_calls();
    out.peak_bytes = d.peak_mapped();
  } else {
    out.device_calls = d.allocations() + d.deallocations();
    out.peak_bytes = d.peak_reserved();
  }
}

}  // namespace

extern "C" [[gnu::visibility("default")]] int alloy_ab_replay(const char* path, const char* composition, int checked,
                                                              alloy_ab_figures* out) {
  const which w = parse(composition);
  if (w == which::unknown) return -1;
  const bench::rmm_trace* trace = trace_at(path);
  if (trace == nullptr) return -2;
  *out = {};
  with_target(w, [&](auto& device, auto make) {
    const replay_options opts{};
    if (checked != 0) {
      replay_result r;
      (void)replay_once(*trace, device, make, opts, &r);
      out->served = r.served;
      out->device_calls = r.map_calls != 0 ? r.map_calls : r.upstream_calls();
      out->peak_bytes = r.virtual_memory ? r.peak_mapped : r.peak_reserved;
      out->faults = r.faults;
    } else {
      out->cold_ns_per_op = replay_once(*trace, device, make, opts, nullptr, &out->warm_ns_per_op);
    }
  });
  return 0;
}

extern "C" [[gnu::visibility("default")]] int alloy_ab_w1(unsigned seed_index, const char* composition,
                                                          alloy_ab_figures* out) {
  const which w = parse(composition);
  if (w == which::unknown) return -1;
  static std::map<unsigned, bench::workload> made;
  auto [at, fresh] = made.try_emplace(seed_index);
  if (fresh) {
    bench::workload_params p = bench::w1_params();
    p.seed += 1000 * static_cast<std::uint64_t>(seed_index);
    at->second = bench::make_workload(p);
  }
  *out = {};
  with_target(w, [&](auto& device, auto make) {
    device.reset();
    {
      auto target = make();
      out->cold_ns_per_op = bench::run_pairs_on<bench::thread_cpu_clock>(at->second, target.allocator(), 256);
    }
    out->served = at->second.pairs();
    device_figures(device, *out);
  });
  return 0;
}
