// Compositions on real traces (issue 4): every trace in ../shared/traces replayed through the
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
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <thrust/mr/disjoint_pool.h>
#include <thrust/mr/memory_resource.h>
#include <thrust/mr/new.h>

#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/segregator.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/showcase.hpp>

#include "support/rmm_trace.hpp"

namespace {

using namespace alloy::literals;
constexpr std::size_t alignment = 256;

struct space {
  std::size_t reserved = 0;
  std::size_t peak = 0;
  std::size_t calls = 0;
};

void* map_bytes(space& s, std::size_t bytes) {
  void* p = mmap(nullptr, bytes == 0 ? 1 : bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  s.reserved += bytes;
  s.peak = std::max(s.peak, s.reserved);
  ++s.calls;
  return p;
}
void unmap_bytes(space& s, void* p, std::size_t bytes) {
  munmap(p, bytes == 0 ? 1 : bytes);
  s.reserved -= bytes;
}

class counting_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  explicit counting_upstream(space* s = nullptr) : space_(s) {}
  alloy::block allocate(std::size_t bytes, std::size_t align) noexcept {
    if (align > 4096) return {};
    void* p = map_bytes(*space_, bytes);
    return p == nullptr ? alloy::block{} : alloy::block{p, bytes};
  }
  void deallocate(alloy::block b) noexcept { unmap_bytes(*space_, b.ptr, b.size); }

 private:
  space* space_;
};

class counting_thrust_resource final : public thrust::mr::memory_resource<> {
 public:
  explicit counting_thrust_resource(space* s) : space_(s) {}
  void* do_allocate(std::size_t bytes, std::size_t) override {
    void* p = map_bytes(*space_, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { unmap_bytes(*space_, p, bytes); }

 private:
  space* space_;
};

using U = counting_upstream;

// The candidates: the arena alone; the pool (2 MiB slabs, classes to 1 MiB) up to 1 MiB beside the
// arena; the pool up to 16 KiB / 64 KiB / 256 KiB with slabs from 64 KiB doubling to 2 MiB beside
// the arena; default_allocator (64 KiB, slabs from 64 KiB doubling to 256 KiB); caching_allocator.
using arena_only = alloy::best_fit_arena<U>;
using seg_1m = alloy::segregator<1_MiB, alloy::size_class_pool<U>, alloy::best_fit_arena<U>>;

// A pool up to T (classes to 2T, first slabs 64 KiB doubling to 2 MiB) beside the arena.
template <std::size_t T>
using seg_grow = alloy::segregator<T, alloy::size_class_pool<U, alloy::power2_classes<4, 256, 2 * T>>, alloy::best_fit_arena<U>>;
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
  return {std::move(name), [make](const alloy::bench::rmm_trace& t, space& s, std::size_t& failed, std::size_t& leftover) {
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
  c.push_back(make_candidate<seg_1m>("seg1M_pool2M", [](U u) {
    return seg_1m{alloy::size_class_pool<U>{u}, alloy::best_fit_arena<U>{u}};
  }));
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
  for (const char* cut : {".rmm.csv.gz", ".rmm.csv", "_memory_snapshot", "__assignment2-systems__results", "__assignment2-systems_"}) {
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

constexpr std::size_t w1_live = 1000;
constexpr std::size_t w1_pairs = 1'000'000;
constexpr int w1_repetitions = 5;

struct w1_workload {
  std::vector<std::size_t> initial;
  std::vector<std::uint32_t> victim;
  std::vector<std::size_t> size;
  std::size_t peak_live = 0;
};

w1_workload make_w1() {
  w1_workload w;
  std::mt19937_64 rng(20261122 + w1_live);
  std::uniform_real_distribution<double> log_size(8.0, 22.0);
  auto draw = [&] { return static_cast<std::size_t>(std::exp2(log_size(rng))); };
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < w1_live; ++i) bytes += w.initial.emplace_back(draw());
  std::vector<std::size_t> current = w.initial;
  w.peak_live = bytes;
  for (std::size_t i = 0; i < w1_pairs; ++i) {
    w.victim.push_back(static_cast<std::uint32_t>(rng() % w1_live));
    w.size.push_back(draw());
    bytes = bytes - current[w.victim.back()] + w.size.back();
    current[w.victim.back()] = w.size.back();
    w.peak_live = std::max(w.peak_live, bytes);
  }
  return w;
}

template <class Alloc, class Dealloc>
double run_w1(const w1_workload& w, Alloc&& alloc, Dealloc&& dealloc) {
  std::vector<void*> ptr(w1_live);
  std::vector<std::size_t> sz = w.initial;
  for (std::size_t i = 0; i < w1_live; ++i) ptr[i] = alloc(sz[i]);
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < w1_pairs; ++i) {
    const std::uint32_t v = w.victim[i];
    dealloc(ptr[v], sz[v]);
    sz[v] = w.size[i];
    ptr[v] = alloc(sz[v]);
    if (ptr[v] == nullptr) std::abort();
  }
  const auto stop = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < w1_live; ++i) dealloc(ptr[i], sz[i]);
  return std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(w1_pairs);
}

template <class A, class Make>
void w1_alloy(const w1_workload& w, const char* name, Make make, std::map<std::string, std::pair<std::vector<double>, double>>& out) {
  for (int r = 0; r < w1_repetitions; ++r) {
    space s;
    double ns;
    {
      A a = make(U{&s});
      ns = run_w1(
          w, [&](std::size_t bytes) { return a.allocate(bytes, alignment).ptr; },
          [&](void* p, std::size_t bytes) { a.deallocate({p, bytes}); });
    }
    out[name].first.push_back(ns);
    out[name].second = static_cast<double>(s.peak) / static_cast<double>(w.peak_live);
  }
}

template <std::size_t Largest>
void w1_disjoint(const w1_workload& w, const char* name, std::map<std::string, std::pair<std::vector<double>, double>>& out) {
  using pool_t =
      thrust::mr::disjoint_unsynchronized_pool_resource<counting_thrust_resource, thrust::mr::new_delete_resource>;
  for (int r = 0; r < w1_repetitions; ++r) {
    space s;
    double ns;
    {
      counting_thrust_resource upstream{&s};
      thrust::mr::new_delete_resource bookkeeper;
      auto opts = pool_t::get_default_options();
      opts.alignment = alignment;
      opts.largest_block_size = Largest;
      pool_t pool{&upstream, &bookkeeper, opts};
      ns = run_w1(
          w, [&](std::size_t bytes) { return pool.allocate(bytes, alignment); },
          [&](void* p, std::size_t bytes) { pool.deallocate(p, bytes, alignment); });
    }
    out[name].first.push_back(ns);
    out[name].second = static_cast<double>(s.peak) / static_cast<double>(w.peak_live);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void w1_table() {
  const w1_workload w = make_w1();
  std::map<std::string, std::pair<std::vector<double>, double>> out;
  w1_disjoint<1_MiB>(w, "thrust_disjoint_1MiB", out);
  w1_disjoint<4_MiB>(w, "thrust_disjoint_4MiB", out);
  w1_alloy<alloy::default_allocator<U>>(w, "default_allocator", [](U u) { return alloy::default_allocator<U>{u}; }, out);
  w1_alloy<alloy::caching_allocator<U>>(w, "caching_allocator", [](U u) { return alloy::caching_allocator<U>{u}; }, out);
  w1_alloy<arena_only>(w, "arena", [](U u) { return arena_only{u}; }, out);
  w1_alloy<seg_1m>(w, "seg1M_pool2M", [](U u) { return seg_1m{alloy::size_class_pool<U>{u}, alloy::best_fit_arena<U>{u}}; }, out);
  w1_alloy<seg_grow<16_KiB>>(w, "seg16K_grow", make_seg_grow<16_KiB>, out);
  w1_alloy<seg_grow<256_KiB>>(w, "seg256K_grow", make_seg_grow<256_KiB>, out);
  w1_alloy<seg_grow<64_KiB>>(w, "seg64K_grow2M", make_seg_grow<64_KiB>, out);
  const double d1 = median(out["thrust_disjoint_1MiB"].first);
  const double d4 = median(out["thrust_disjoint_4MiB"].first);
  std::printf("W1: %zu live, 256 B-4 MiB log-uniform, %zu pairs, alignment %zu, median of %d (ratios in this run)\n",
              w1_live, w1_pairs, alignment, w1_repetitions);
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
