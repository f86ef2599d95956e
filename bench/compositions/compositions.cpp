// SPDX-License-Identifier: Apache-2.0
// Compositions on real traces: every trace in ../shared/traces replayed through the
// ready-made compositions and the candidates for `default_allocator`, plus workload W1 (1,000
// live, sizes log-uniform 256 B .. 4 MiB, a million free+allocate pairs, alignment 256) through
// `default_allocator` against the thrust disjoint pool.
//
// Every allocator sits on a counting upstream (anonymous mmap with MAP_NORESERVE: address space
// that costs nothing until written; the replay never writes). Figures: peak reserved ÷ peak live
// per trace (peak live as replayed, at alignment 256), requests that failed, blocks left at the
// end that the trace never freed, ns per event, and for W1 ns per pair and peak reserved ÷ peak
// live with the ratio against the thrust disjoint pools in the same run.
//
//   compositions            # the traces table, then W1
//   compositions traces     # the traces only
//   compositions w1         # W1 only
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/segregator.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/showcase.hpp>

#include "replay/rmm_trace.hpp"
#include "support/counting_upstream.hpp"
#include "support/pairs_workload.hpp"

namespace {

using namespace alloy::bench;
using namespace alloy::literals;
constexpr std::size_t alignment = 256;

/// Wall time, as these tables have been timed from the start.
using wall_clock = std::chrono::steady_clock;

using U = counting_upstream;

// The candidates: the arena alone; the pool (2 MiB slabs, classes to 1 MiB) up to 1 MiB beside the
// arena; the pool up to 16 KiB / 64 KiB / 256 KiB with slabs from 64 KiB doubling to 2 MiB beside
// the arena; default_allocator (64 KiB, slabs from 64 KiB doubling to 256 KiB); caching_allocator.
using arena_only = alloy::best_fit_arena<U>;
using seg_1m = alloy::segregator<1_MiB, alloy::size_class_pool<U>, alloy::best_fit_arena<U>>;

// A pool up to T (classes to 2T, first slabs 64 KiB doubling to 2 MiB) beside the arena.
template <std::size_t T>
using seg_grow =
    alloy::segregator<T, alloy::size_class_pool<U, alloy::power2_classes<4, 256, 2 * T>>, alloy::best_fit_arena<U>>;
template <std::size_t T>
seg_grow<T> make_seg_grow(U u) {
  return seg_grow<T>{alloy::size_class_pool<U, alloy::power2_classes<4, 256, 2 * T>>{u, {.initial_slab_size = 64_KiB}},
                     alloy::best_fit_arena<U>{u}};
}

struct candidate {
  std::string name;
  // Replays through a fresh allocator over `s`; returns ns spent in allocator calls.
  std::function<double(const alloy::bench::rmm_trace&, space&, std::size_t& failed, std::size_t& leftover)> replay;
};

template <class A, class Make>
candidate make_candidate(std::string name, Make make) {
  return {std::move(name),
          [make](const alloy::bench::rmm_trace& t, space& s, std::size_t& failed, std::size_t& leftover) {
            A a = make(U{&s});
            std::vector<alloy::block> blocks(t.allocations);
            failed = 0;
            const auto start = std::chrono::steady_clock::now();
            for (const auto& e : t.events) {
              if (e.action == alloy::bench::trace_action::allocate) {
                blocks[e.allocation] = a.allocate(e.size, alignment);
                if (!blocks[e.allocation]) ++failed;
              } else if (e.action == alloy::bench::trace_action::free) {
                a.deallocate(blocks[e.allocation]);
                blocks[e.allocation] = {};
              }
            }
            const auto stop = std::chrono::steady_clock::now();
            leftover = 0;
            for (const alloy::block& b : blocks) {
              if (b) {
                ++leftover;
                a.deallocate(b);
              }
            }
            a.release();
            if (a.reserved_bytes() != 0) std::printf("!! kept %zu bytes after release\n", a.reserved_bytes());
            return std::chrono::duration<double, std::nano>(stop - start).count();
          }};
}

std::vector<candidate> candidates() {
  std::vector<candidate> c;
  c.push_back(make_candidate<arena_only>("arena", [](U u) { return arena_only{u}; }));
  c.push_back(make_candidate<seg_1m>(
      "seg1M_pool2M", [](U u) { return seg_1m{alloy::size_class_pool<U>{u}, alloy::best_fit_arena<U>{u}}; }));
  c.push_back(make_candidate<seg_grow<16_KiB>>("seg16K_grow", make_seg_grow<16_KiB>));
  c.push_back(make_candidate<seg_grow<256_KiB>>("seg256K_grow", make_seg_grow<256_KiB>));
  c.push_back(make_candidate<seg_grow<64_KiB>>("seg64K_grow2M", make_seg_grow<64_KiB>));
  c.push_back(make_candidate<alloy::default_allocator<U>>("default_allocator",
                                                          [](U u) { return alloy::default_allocator<U>{u}; }));
  c.push_back(make_candidate<alloy::caching_allocator<U>>("caching_allocator",
                                                          [](U u) { return alloy::caching_allocator<U>{u}; }));
  return c;
}

/// Peak live bytes of a trace as replayed (allocations that failed when recorded are not live).
std::size_t replayed_peak_live(const alloy::bench::rmm_trace& t) {
  std::vector<std::size_t> size(t.allocations, 0);
  std::size_t live = 0, peak = 0;
  for (const auto& e : t.events) {
    if (e.action == alloy::bench::trace_action::allocate) {
      size[e.allocation] = e.size;
      live += e.size;
      peak = std::max(peak, live);
    } else if (e.action == alloy::bench::trace_action::free) {
      live -= size[e.allocation];
    }
  }
  return peak;
}

std::vector<std::filesystem::path> trace_files() {
  std::vector<std::filesystem::path> files;
  for (const char* dir : {"pytorch", "minimalloc"}) {
    const std::filesystem::path d = std::filesystem::path(ALLOY_TRACE_DIR) / dir;
    if (!std::filesystem::is_directory(d)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(d)) {
      const std::string name = entry.path().filename().string();
      if (name.find(".rmm.csv") != std::string::npos) files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string short_name(const std::filesystem::path& p) {
  std::string n = p.filename().string();
  for (const char* cut :
       {".rmm.csv.gz", ".rmm.csv", "_memory_snapshot", "__assignment2-systems__results", "__assignment2-systems_"}) {
    const auto at = n.find(cut);
    if (at != std::string::npos) n.erase(at, std::strlen(cut));
  }
  return n;
}

void traces_table() {
  const auto cands = candidates();
  std::printf("Traces: peak reserved / peak live (alignment %zu; failed requests and never-freed blocks noted)\n",
              alignment);
  std::printf("%-40s %10s", "trace", "peak live");
  for (const auto& c : cands) std::printf(" %14s", c.name.c_str());
  std::printf("\n");
  std::map<std::string, std::vector<double>> ratios, ns;
  for (const auto& file : trace_files()) {
    const alloy::bench::rmm_trace t = alloy::bench::read_rmm_trace(file.string());
    const std::size_t peak_live = replayed_peak_live(t);
    std::printf("%-40s %9.1fM", short_name(file).c_str(), static_cast<double>(peak_live) / (1 << 20));
    for (const auto& c : cands) {
      space s;
      std::size_t failed = 0, leftover = 0;
      const double total_ns = c.replay(t, s, failed, leftover);
      const double ratio = static_cast<double>(s.peak) / static_cast<double>(std::max<std::size_t>(peak_live, 1));
      ratios[c.name].push_back(ratio);
      ns[c.name].push_back(total_ns / static_cast<double>(std::max<std::size_t>(t.events.size(), 1)));
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.3f%s", ratio, failed ? " FAIL" : "");
      std::printf(" %14s", cell);
      if (s.reserved != 0) std::printf("(leak %zu)", s.reserved);
    }
    std::printf("\n");
  }
  std::printf("%-40s %10s", "geometric mean", "");
  for (const auto& c : cands) {
    double log_sum = 0;
    for (double r : ratios[c.name]) log_sum += std::log(r);
    std::printf(" %14.3f", std::exp(log_sum / static_cast<double>(std::max<std::size_t>(ratios[c.name].size(), 1))));
  }
  std::printf("\n%-40s %10s", "worst", "");
  for (const auto& c : cands) std::printf(" %14.3f", *std::max_element(ratios[c.name].begin(), ratios[c.name].end()));
  std::printf("\n%-40s %10s", "mean ns per event", "");
  for (const auto& c : cands) {
    double sum = 0;
    for (double v : ns[c.name]) sum += v;
    std::printf(" %14.1f", sum / static_cast<double>(std::max<std::size_t>(ns[c.name].size(), 1)));
  }
  std::printf("\n\n");
}

// ---- W1 ------------------------------------------------------------------------------------------

constexpr int w1_repetitions = 5;

/// Per allocator: ns per pair of each repetition, and peak reserved / peak live.
using w1_results = std::map<std::string, std::pair<std::vector<double>, double>>;

/// `w1_repetitions` runs, each through a fresh allocator over a counted upstream that
/// `run_one(space&)` builds, runs `w` through and returns ns per pair for.
template <class RunOne>
void w1_measure(const workload& w, const char* name, w1_results& out, RunOne run_one) {
  for (int r = 0; r < w1_repetitions; ++r) {
    space s;
    out[name].first.push_back(run_one(s));
    out[name].second = static_cast<double>(s.peak) / static_cast<double>(w.peak_live);
  }
}

template <class A, class Make>
void w1_alloy(const workload& w, const char* name, Make make, w1_results& out) {
  w1_measure(w, name, out, [&](space& s) {
    A a = make(U{&s});
    return run_pairs<wall_clock>(
        w,
        [&](std::size_t bytes) {
          const alloy::block b = a.allocate(bytes, alignment);
          if (!b) std::abort();  // a failure would make the figures meaningless
          return b;
        },
        [&](alloy::block b) { a.deallocate(b); });
  });
}

template <std::size_t Largest>
void w1_disjoint(const workload& w, const char* name, w1_results& out) {
  w1_measure(w, name, out, [&](space& s) {
    counted_thrust_disjoint_pool peer{&s, alignment, Largest};
    return run_pairs_on<wall_clock>(w, peer.pool, alignment);
  });
}

void w1_table() {
  const workload_params params = w1_params();
  const workload w = make_workload(params);
  w1_results out;
  w1_disjoint<1_MiB>(w, "thrust_disjoint_1MiB", out);
  w1_disjoint<4_MiB>(w, "thrust_disjoint_4MiB", out);
  w1_alloy<alloy::default_allocator<U>>(
      w, "default_allocator", [](U u) { return alloy::default_allocator<U>{u}; }, out);
  w1_alloy<alloy::caching_allocator<U>>(
      w, "caching_allocator", [](U u) { return alloy::caching_allocator<U>{u}; }, out);
  w1_alloy<arena_only>(w, "arena", [](U u) { return arena_only{u}; }, out);
  w1_alloy<seg_1m>(
      w, "seg1M_pool2M", [](U u) { return seg_1m{alloy::size_class_pool<U>{u}, alloy::best_fit_arena<U>{u}}; }, out);
  w1_alloy<seg_grow<16_KiB>>(w, "seg16K_grow", make_seg_grow<16_KiB>, out);
  w1_alloy<seg_grow<256_KiB>>(w, "seg256K_grow", make_seg_grow<256_KiB>, out);
  w1_alloy<seg_grow<64_KiB>>(w, "seg64K_grow2M", make_seg_grow<64_KiB>, out);
  const double d1 = median(out["thrust_disjoint_1MiB"].first);
  const double d4 = median(out["thrust_disjoint_4MiB"].first);
  std::printf("W1: %zu live, 256 B-4 MiB log-uniform, %zu pairs, alignment %zu, median of %d (ratios in this run)\n",
              params.live_blocks, params.pairs, alignment, w1_repetitions);
  std::printf("%-22s %10s %14s %14s %14s\n", "allocator", "ns/pair", "vs disjoint1M", "vs disjoint4M", "reserved/live");
  for (const auto& [name, v] : out) {
    const double ns = median(v.first);
    std::printf("%-22s %10.1f %13.2fx %13.2fx %14.3f\n", name.c_str(), ns, ns / d1, ns / d4, v.second);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "all";
  if (what == "all" || what == "traces") traces_table();
  if (what == "all" || what == "w1") w1_table();
  return 0;
}
