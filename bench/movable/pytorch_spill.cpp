// SPDX-License-Identifier: Apache-2.0
// The PyTorch traces replayed into a "device" of 60% of each trace's peak live bytes
// (`limited<host_upstream>`): (a) raw blocks, failing when the device is full; (b) under
// host_spill_reclaimer, every block movable: locked while it is used (at its allocation and just
// before its free, the last use of a tensor), unlocked in between, so idle blocks spill to host
// memory and come back when used.
//
// Figures: requests served and failed, bytes spilled (bytes_reclaimed) and restored, single and
// full reclaims, replay time. A table is printed after the Google Benchmark output.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/movable.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>

#include "replay/rmm_trace.hpp"

namespace {

using device_t = alloy::limited<alloy::host_upstream>;
using reclaimer_t = alloy::host_spill_reclaimer<device_t, alloy::host_upstream>;

struct outcome {
  std::size_t requests = 0, served = 0, failed = 0, lock_failures = 0;
  alloy::movable_counters counters{};
};

struct row {
  std::size_t peak_live = 0, capacity = 0, too_big = 0;  // too_big: requests larger than the capacity
  outcome raw, spill;
};

outcome replay_raw(const alloy::bench::rmm_trace& trace, std::size_t capacity) {
  outcome o;
  device_t device{alloy::host_upstream{}, {.bytes_limit = capacity}};
  std::vector<alloy::block> blocks(trace.allocations);
  for (const auto& e : trace.events) {
    if (e.action == alloy::bench::trace_action::allocate) {
      ++o.requests;
      blocks[e.allocation] = device.allocate(e.size, 256);
      ++(blocks[e.allocation] ? o.served : o.failed);
    } else if (e.action == alloy::bench::trace_action::free) {
      if (blocks[e.allocation]) device.deallocate(blocks[e.allocation]);
      blocks[e.allocation] = {};
    }
  }
  for (const alloy::block& b : blocks) {
    if (b) device.deallocate(b);
  }
  return o;
}

outcome replay_spill(const alloy::bench::rmm_trace& trace, std::size_t capacity) {
  outcome o;
  reclaimer_t alloc{device_t{alloy::host_upstream{}, {.bytes_limit = capacity}}, alloy::host_upstream{}};
  std::vector<alloy::handle> handles(trace.allocations);
  for (const auto& e : trace.events) {
    if (e.action == alloy::bench::trace_action::allocate) {
      ++o.requests;
      const alloy::handle h = alloc.allocate_movable(e.size);
      handles[e.allocation] = h;
      if (!h) {
        ++o.failed;
        continue;
      }
      ++o.served;
      if (alloc.lock(h) == nullptr) {  // first use
        ++o.lock_failures;
      } else {
        alloc.unlock(h);
      }
    } else if (e.action == alloy::bench::trace_action::free) {
      const alloy::handle h = handles[e.allocation];
      if (!h) continue;
      if (alloc.lock(h) == nullptr) {  // last use
        ++o.lock_failures;
      } else {
        alloc.unlock(h);
      }
      alloc.deallocate(h);
      handles[e.allocation] = {};
    }
  }
  for (alloy::handle h : handles) {
    if (h) alloc.deallocate(h);
  }
  o.counters = alloc.movable_statistics();
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::map<std::string, row> rows;
  std::map<std::string, alloy::bench::rmm_trace> traces;
  const std::filesystem::path dir = std::filesystem::path(ALLOY_TRACE_DIR) / "pytorch";
  if (!std::filesystem::is_directory(dir)) {
    std::printf("pytorch_spill: no traces in %s; nothing to replay\n", dir.c_str());
    return 0;
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (file.find(".rmm.csv") == std::string::npos) continue;
    const std::string name =
        file.substr(0, file.find('_')) + file.substr(file.rfind("__") + 1, file.find(".rmm") - file.rfind("__") - 1);
    traces.emplace(name, alloy::bench::read_rmm_trace(entry.path().string()));
  }
  for (auto& [name, trace] : traces) {
    row& r = rows[name];
    r.peak_live = trace.peak_live_bytes;
    r.capacity = trace.peak_live_bytes / 10 * 6;
    for (const auto& e : trace.events)
      r.too_big += e.action == alloy::bench::trace_action::allocate && e.size > r.capacity;
    const alloy::bench::rmm_trace* t = &trace;
    row* out = &r;
    benchmark::RegisterBenchmark(("pytorch/" + name + "/limited").c_str(),
                                 [t, out](benchmark::State& state) {
                                   for (auto _ : state) out->raw = replay_raw(*t, out->capacity);
                                   state.counters["failed"] = static_cast<double>(out->raw.failed);
                                 })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
    benchmark::RegisterBenchmark(
        ("pytorch/" + name + "/spill_reclaimer").c_str(),
        [t, out](benchmark::State& state) {
          for (auto _ : state) out->spill = replay_spill(*t, out->capacity);
          state.counters["failed"] = static_cast<double>(out->spill.failed);
          state.counters["MiB_spilled"] = static_cast<double>(out->spill.counters.bytes_reclaimed) / (1 << 20);
          state.counters["MiB_restored"] = static_cast<double>(out->spill.counters.bytes_restored) / (1 << 20);
        })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  std::printf("\nPyTorch traces, device capacity 60%% of peak live, blocks locked at allocation and before free\n");
  std::printf("%-44s %8s %9s %9s | %-17s | %-17s %10s %10s %7s %7s %6s\n", "trace", "requests", "peak MiB", "cap MiB",
              "limited alone", "+ spill reclaimer", "MiB spill", "MiB rest.", "single", "full", "> cap");
  std::printf("%-44s %8s %9s %9s | %8s %8s | %8s %8s\n", "", "", "", "", "served", "failed", "served", "failed");
  for (const auto& [name, r] : rows) {
    const alloy::movable_counters& c = r.spill.counters;
    std::printf("%-44s %8zu %9.1f %9.1f | %8zu %8zu | %8zu %8zu %10.1f %10.1f %7zu %7zu %6zu\n", name.c_str(),
                r.raw.requests, static_cast<double>(r.peak_live) / (1 << 20),
                static_cast<double>(r.capacity) / (1 << 20), r.raw.served, r.raw.failed, r.spill.served,
                r.spill.failed + r.spill.lock_failures, static_cast<double>(c.bytes_reclaimed) / (1 << 20),
                static_cast<double>(c.bytes_restored) / (1 << 20), c.num_single_reclaims, c.num_full_reclaims,
                r.too_big);
  }
  std::printf("(> cap: requests larger than the whole capacity, which no policy can serve)\n");
  return 0;
}
