// SPDX-License-Identifier: Apache-2.0
// bench/streams/stream_replay.cpp: the shipped PyTorch traces replayed on 1, 2 and 4 streams
// (allocation i on stream i mod N, freed on its stream) over a simulated 80 GiB device, through
//   - alloy:     stream_ordered<best_fit_arena>: frees coalesce at once whatever the stream; only
//                the ordering (events) is kept per stream;
//   - per-stream: one best_fit_arena per stream, the layout of PyTorch's caching allocator and of
//                RMM's per-stream free lists without stealing: a stream's free memory serves only
//                that stream.
// Prints peak reserved ÷ peak live for each, and what the ordering cost (events, device-side
// waits, host synchronizations). The streams are alloy::host_streams with no work enqueued, so
// events complete almost at once: waits are counted only for events still pending, as on a GPU
// that keeps up with the host.
//
// Then the cost of the capture probe (docs/design.md#cuda-graphs): the same replays timed through
// `host_stream*` (a capturable stream: every call probes, and the capture bookkeeping is compiled
// in) and through a stream type without the probe (those paths compiled out), interleaved in one
// run, best of 30 each.
#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <alloy/host_stream.hpp>
#include <alloy/literals.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/stream_ordered.hpp>

#include "replay/simulated_device.hpp"
#include "replay/trace_reader.hpp"

using namespace alloy::literals;
using alloy::block;
using alloy::host_stream;
using alloy::replay::device_upstream;
using alloy::replay::simulated_device;
using arena_t = alloy::best_fit_arena<device_upstream>;

/// A host stream without the capture probe: `stream_ordered` compiles its capture paths out.
struct unprobed {
  host_stream* s = nullptr;
  friend bool operator==(const unprobed&, const unprobed&) = default;
};
template <>
struct alloy::stream_traits<unprobed> {
  using base = stream_traits<host_stream*>;
  using event_type = base::event_type;
  static bool create(event_type& e) noexcept { return base::create(e); }
  static void destroy(event_type& e) noexcept { base::destroy(e); }
  static bool record(event_type& e, unprobed s) noexcept { return base::record(e, s.s); }
  static bool wait(unprobed s, const event_type& e) noexcept { return base::wait(s.s, e); }
  static bool ready(const event_type& e) noexcept { return base::ready(e); }
  static void synchronize(const event_type& e) noexcept { base::synchronize(e); }
  static void synchronize(unprobed s) noexcept { base::synchronize(s.s); }
};
static_assert(alloy::capturable_stream<host_stream*> && !alloy::capturable_stream<unprobed>);

namespace {

struct outcome {
  std::size_t peak_reserved = 0;
  std::size_t failed = 0;
  alloy::stream_order_counters order{};
};

/// Replays `trace` with `allocate(bytes, stream_index)` / `deallocate(block, stream_index)`.
template <class Allocate, class Deallocate>
std::size_t replay(const alloy::bench::rmm_trace& trace, std::size_t streams, Allocate&& allocate,
                   Deallocate&& deallocate) {
  std::vector<block> blocks(trace.allocations);
  std::size_t failed = 0;
  for (const auto& e : trace.events) {
    const std::size_t s = e.allocation % streams;
    if (e.action == alloy::bench::trace_action::allocate) {
      blocks[e.allocation] = allocate(e.size, s);
      failed += !blocks[e.allocation];
    } else if (e.action == alloy::bench::trace_action::free && blocks[e.allocation]) {
      deallocate(blocks[e.allocation], s);
      blocks[e.allocation] = {};
    }
  }
  for (std::size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i]) deallocate(blocks[i], i % streams);
  return failed;
}

outcome run_alloy(const alloy::bench::rmm_trace& trace, std::size_t streams) {
  simulated_device device(80_GiB);
  std::vector<std::unique_ptr<host_stream>> s;
  for (std::size_t i = 0; i < streams; ++i) s.push_back(std::make_unique<host_stream>());
  outcome out;
  {
    alloy::stream_ordered<arena_t, host_stream*> alloc{arena_t{device_upstream{device}}};
    out.failed = replay(
        trace, streams, [&](std::size_t n, std::size_t i) { return alloc.allocate(n, 256, s[i].get()); },
        [&](block b, std::size_t i) { alloc.deallocate(b, s[i].get()); });
    out.order = alloc.order_counters();
  }
  out.peak_reserved = device.peak_reserved();
  return out;
}

/// Nanoseconds per call of one replay through `stream_ordered<arena_t, S>`.
template <class S>
double time_alloy(const alloy::bench::rmm_trace& trace, std::vector<std::unique_ptr<host_stream>>& s) {
  simulated_device device(80_GiB);
  alloy::stream_ordered<arena_t, S> alloc{arena_t{device_upstream{device}}};
  const auto stream = [&](std::size_t i) {
    if constexpr (std::same_as<S, unprobed>) return unprobed{s[i].get()};
    else return s[i].get();
  };
  const auto start = std::chrono::steady_clock::now();
  (void)replay(
      trace, s.size(), [&](std::size_t n, std::size_t i) { return alloc.allocate(n, 256, stream(i)); },
      [&](block b, std::size_t i) { alloc.deallocate(b, stream(i)); });
  const auto stop = std::chrono::steady_clock::now();
  for (auto& x : s) x->synchronize();
  return std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(trace.events.size());
}

outcome run_per_stream(const alloy::bench::rmm_trace& trace, std::size_t streams) {
  simulated_device device(80_GiB);
  outcome out;
  {
    std::vector<arena_t> arenas;
    for (std::size_t i = 0; i < streams; ++i) arenas.emplace_back(device_upstream{device});
    out.failed = replay(
        trace, streams, [&](std::size_t n, std::size_t i) { return arenas[i].allocate(n, 256); },
        [&](block b, std::size_t i) { arenas[i].deallocate(b); });
  }
  out.peak_reserved = device.peak_reserved();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : std::filesystem::path(ALLOY_TRACE_DIR) / "pytorch";
  if (!std::filesystem::is_directory(dir)) {
    std::fprintf(stderr, "stream_replay: no traces at %s\n", dir.c_str());
    return 1;
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".gz" || entry.path().extension() == ".csv") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::printf("peak reserved / peak live, allocation i on stream i mod N (80 GiB simulated device)\n\n");
  std::printf(
      "| trace | streams | alloy stream_ordered | per-stream arenas | per-stream / alloy | events | waits | host syncs "
      "| failed (alloy / per-stream) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& file : files) {
    const alloy::bench::rmm_trace trace = alloy::bench::read_trace(file.string());
    std::string name = file.filename().string();
    name = name.substr(0, name.find(".rmm.csv"));
    const double live = static_cast<double>(std::max<std::size_t>(trace.peak_live_bytes, 1));
    for (std::size_t streams : {1u, 2u, 4u}) {
      const outcome a = run_alloy(trace, streams);
      const outcome p = run_per_stream(trace, streams);
      std::printf("| %s | %zu | %.3f | %.3f | %.3f | %zu | %zu | %zu | %zu / %zu |\n", name.c_str(), streams,
                  static_cast<double>(a.peak_reserved) / live, static_cast<double>(p.peak_reserved) / live,
                  static_cast<double>(p.peak_reserved) / static_cast<double>(a.peak_reserved), a.order.events_recorded,
                  a.order.stream_waits, a.order.host_synchronizations, a.failed, p.failed);
    }
  }
  std::printf("\ncapture probe: ns per call, best of 30, interleaved\n\n");
  std::printf("| trace | streams | with probe | without | with / without |\n|---|---:|---:|---:|---:|\n");
  double sum_ratio = 0;
  std::size_t rows = 0;
  for (const auto& file : files) {
    const alloy::bench::rmm_trace trace = alloy::bench::read_trace(file.string());
    std::string name = file.filename().string();
    name = name.substr(0, name.find(".rmm.csv"));
    for (std::size_t streams : {1u, 2u, 4u}) {
      std::vector<std::unique_ptr<host_stream>> s;
      for (std::size_t i = 0; i < streams; ++i) s.push_back(std::make_unique<host_stream>());
      double with = 1e300, without = 1e300;
      for (int r = 0; r < 30; ++r) {
        if (r % 2 == 0) {  // alternating which goes first
          with = std::min(with, time_alloy<host_stream*>(trace, s));
          without = std::min(without, time_alloy<unprobed>(trace, s));
        } else {
          without = std::min(without, time_alloy<unprobed>(trace, s));
          with = std::min(with, time_alloy<host_stream*>(trace, s));
        }
      }
      std::printf("| %s | %zu | %.1f | %.1f | %.3f |\n", name.c_str(), streams, with, without, with / without);
      sum_ratio += with / without;
      ++rows;
    }
  }
  std::printf("\nmean with / without: %.3f\n", sum_ratio / static_cast<double>(std::max<std::size_t>(rows, 1)));
  return 0;
}
