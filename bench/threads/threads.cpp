// SPDX-License-Identifier: Apache-2.0
// Threads: free+allocate pairs on 1, 2, 4 and 8 threads at once, through allocators
// shared by every thread, against the limit of one unshared allocator per thread.
//
// Workloads, each thread with its own requests (its own seed):
//   - W2: a live set of 1,000 blocks, sizes log-uniform 256 B-64 KiB, then pairs, each freeing a
//     random live block and allocating a fresh size in its place (bench/support/pairs_workload.hpp);
//   - W1: the same with sizes 256 B-4 MiB;
//   - producer/consumer: every block is freed by another thread than the one that allocated it.
//     Thread t allocates W2's sizes and passes each block through a ring (1,024 slots, one
//     producer, one consumer, indices published every 16 blocks) to thread t+1, which frees it;
//     before the timed part each ring is
//     filled with 512 blocks, so about 512 blocks per thread are live. On one thread the ring
//     leads back to the thread itself (blocks freed first in, first out, by their own thread).
// Alignment 256 everywhere; the memory is never touched.
//
// Allocators, all over one counted mmap source per run (bench/support/shared_space.hpp):
//   - limit: one `default_allocator` per thread, nothing shared (what this machine can do; no
//     producer/consumer, a block cannot go to another thread's allocator);
//   - sharded: `alloy::sharded<default_allocator>`, default options (one shard per hardware
//     thread, thread caches on);
//   - sharded_nocache: the same with `thread_cache = 0` (every call takes its shard's lock);
//   - synchronized: `alloy::synchronized<default_allocator>`, one lock around everything;
//   - std_pmr_sync_pool: `std::pmr::synchronized_pool_resource`, largest_required_pool_block
//     64 KiB (W2, producer/consumer) or 4 MiB (W1) (libstdc++ 12);
//   - thrust_sync_pool: `thrust::mr::synchronized_pool_resource`, alignment 256, largest block as
//     for std::pmr;
//   - malloc: glibc's `aligned_alloc`/`free` (per-thread arenas and caches; time only).
// Figures: million pairs per second, all threads together (pairs ÷ wall time from the start
// signal to the last thread's end; wall time, since waiting for a lock is the point; on one thread
// also per second of the thread's CPU time, which other work on the machine disturbs less, and
// which the one-thread target is checked on), median of
// the repetitions, which interleave allocators and thread counts; each allocator's 2-thread ÷
// 1-thread throughput; ratios against the best synchronized peer (synchronized, std::pmr,
// thrust) and against malloc at the same thread count; and peak reserved ÷ peak live, where peak
// live is the sum of the threads' own peaks (at least the true peak of all threads together, so
// a ratio is if anything too low, the same way at every thread count). The targets
// (bench/README.md#threads) are checked at the end.
//
//   threads
//   threads --quick   # one repetition (a look, not a figure)
//   threads [--quick] W1 sharded   # one scenario (name contains W1), the limit, the peers and
//                                  # the allocators whose names contain "sharded"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <memory_resource>
#include <string>
#include <thread>
#include <vector>

#include <thrust/mr/sync_pool.h>

#include <alloy/policy/sharded.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/showcase.hpp>

#include "support/pairs_workload.hpp"
#include "support/shared_space.hpp"
#include "support/thread_pairs.hpp"

namespace {

using namespace alloy::bench;
using wall_clock = std::chrono::steady_clock;

constexpr std::size_t alignment = 256;
// Pairs per thread: enough that a timed part lasts tens of milliseconds, well above the
// scheduler's time slices, so that a busy machine's threads get to run side by side.
constexpr std::size_t small_pairs = 1'000'000;  // W2, producer/consumer
constexpr std::size_t large_pairs = 400'000;    // W1
constexpr int thread_counts[] = {1, 2, 4, 8};
constexpr int max_threads = 8;

using U = shared_counting_upstream;
using D = alloy::default_allocator<U>;

using scenario = thread_scenario;
using mode = thread_mode;
using rates = thread_rates;

std::vector<scenario> scenarios() { return thread_scenarios(max_threads, small_pairs, large_pairs); }

// ---- the contenders ------------------------------------------------------------------------------

struct limit_env {
  std::vector<std::unique_ptr<D>> per_thread;
  limit_env(shared_space& s, const scenario&) {
    for (int t = 0; t < max_threads; ++t) per_thread.push_back(std::make_unique<D>(U{&s}));
  }
  alloy::block allocate(int t, std::size_t bytes) noexcept {
    return per_thread[static_cast<std::size_t>(t)]->allocate(bytes, alignment);
  }
  void deallocate(int t, alloy::block b) noexcept { per_thread[static_cast<std::size_t>(t)]->deallocate(b); }
};

template <bool Cache>
struct sharded_env {
  alloy::sharded<D> a;
  sharded_env(shared_space& s, const scenario&)
      : a([&s](std::size_t) { return D{U{&s}}; },
          alloy::sharded<D>::options{.thread_cache = Cache ? std::size_t{128} << 10 : 0}) {}
  alloy::block allocate(int, std::size_t bytes) noexcept { return a.allocate(bytes, alignment); }
  void deallocate(int, alloy::block b) noexcept { a.deallocate(b); }
};

struct synchronized_env {
  alloy::synchronized<D> a;
  synchronized_env(shared_space& s, const scenario&) : a(D{U{&s}}) {}
  alloy::block allocate(int, std::size_t bytes) noexcept { return a.allocate(bytes, alignment); }
  void deallocate(int, alloy::block b) noexcept { a.deallocate(b); }
};

struct pmr_env {
  shared_counting_pmr_resource upstream;
  std::pmr::synchronized_pool_resource pool;
  pmr_env(shared_space& s, const scenario& sc)
      : upstream(&s), pool({.max_blocks_per_chunk = 0, .largest_required_pool_block = sc.largest_pooled}, &upstream) {}
  alloy::block allocate(int, std::size_t bytes) { return {pool.allocate(bytes, alignment), bytes}; }
  void deallocate(int, alloy::block b) { pool.deallocate(b.ptr, b.size, alignment); }
};

struct thrust_env {
  using pool_t = thrust::mr::synchronized_pool_resource<shared_counting_thrust_resource>;
  shared_counting_thrust_resource upstream;
  pool_t pool;
  static thrust::mr::pool_options options(const scenario& sc) {
    thrust::mr::pool_options opts = pool_t::get_default_options();
    opts.alignment = alignment;
    opts.largest_block_size = sc.largest_pooled;
    return opts;
  }
  thrust_env(shared_space& s, const scenario& sc) : upstream(&s), pool(&upstream, options(sc)) {}
  alloy::block allocate(int, std::size_t bytes) { return {pool.allocate(bytes, alignment), bytes}; }
  void deallocate(int, alloy::block b) { pool.deallocate(b.ptr, b.size, alignment); }
};

struct malloc_env {
  malloc_env(shared_space&, const scenario&) {}
  alloy::block allocate(int, std::size_t bytes) noexcept {
    return {std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment), bytes};
  }
  void deallocate(int, alloy::block b) noexcept { std::free(b.ptr); }
};

struct contender {
  std::string name;
  bool counts_space;       // draws from the counted source (malloc does not)
  bool cross_thread;       // may free a block on another thread than the one that allocated it
  bool synchronized_peer;  // one of the peers the targets compare against
  // Runs `threads` threads of `sc` through a fresh allocator; returns M pairs/s and fills
  // `peak_reserved`.
  std::function<rates(const scenario&, int threads, std::size_t& peak_reserved)> run;
};

template <class Env>
contender make(std::string name, bool counts, bool cross, bool peer) {
  return {name, counts, cross, peer, [name](const scenario& sc, int threads, std::size_t& peak) {
            shared_space s;
            rates rate;
            {
              Env env(s, sc);
              rate = run_threads(env, sc, threads, "threads", name.c_str());
            }
            peak = s.peak.load();
            return rate;
          }};
}

std::vector<contender> contenders() {
  std::vector<contender> c;
  c.push_back(make<limit_env>("limit", true, false, false));
  c.push_back(make<sharded_env<true>>("sharded", true, true, false));
  c.push_back(make<sharded_env<false>>("sharded_nocache", true, true, false));
  c.push_back(make<synchronized_env>("synchronized", true, true, true));
  c.push_back(make<pmr_env>("std_pmr_sync_pool", true, true, true));
  c.push_back(make<thrust_env>("thrust_sync_pool", true, true, true));
  c.push_back(make<malloc_env>("malloc", false, true, false));
  return c;
}

// ---- results -------------------------------------------------------------------------------------

struct figures {
  std::map<int, std::vector<double>> rate;      // per thread count: M pairs/s of each repetition
  std::map<int, std::vector<double>> reserved;  // per thread count: peak reserved / peak live
  std::map<int, std::vector<double>> cpu_rate;  // per thread count: M pairs per CPU second
};
using table = std::map<std::string, figures>;  // per allocator

double med(const figures& f, const std::map<int, std::vector<double>> figures::* what, int threads) {
  const auto found = (f.*what).find(threads);
  return found == (f.*what).end() ? 0.0 : median(found->second);
}

double peak_live(const scenario& sc, int threads) {
  std::size_t sum = 0;
  for (int t = 0; t < threads; ++t) sum += sc.per_thread[static_cast<std::size_t>(t)].peak_live;
  return static_cast<double>(sum);
}

/// The best of the synchronized peers at `threads` (M pairs/s) and its name.
std::pair<double, std::string> best_peer(const table& tab, const std::vector<contender>& cs, int threads) {
  std::pair<double, std::string> best{0.0, "-"};
  for (const contender& c : cs) {
    if (!c.synchronized_peer || !tab.count(c.name)) continue;
    const double r = med(tab.at(c.name), &figures::rate, threads);
    if (r > best.first) best = {r, c.name};
  }
  return best;
}

void print_table(const scenario& sc, const table& tab, const std::vector<contender>& cs, int reps) {
  std::printf("\n%s: %s; %zu pairs per thread, alignment %zu; median of %d\n", sc.name.c_str(),
              sc.how == mode::producer_consumer
                  ? "W2 sizes, every block freed by the next thread (512 in flight per ring)"
                  : "1,000 live blocks per thread",
              sc.per_thread[0].pairs(), alignment, reps);
  std::printf(
      "M pairs/s (all threads)      1T      2T      4T      8T   2T/1T | 1T per CPU s | vs best sync peer: 1T    2T    "
      "4T    8T | "
      "vs malloc 2T | reserved/live 1T    4T  4T/1T\n");
  for (const contender& c : cs) {
    if (!tab.count(c.name)) continue;
    const figures& f = tab.at(c.name);
    std::printf("%-24s", c.name.c_str());
    for (int t : thread_counts) std::printf(" %7.2f", med(f, &figures::rate, t));
    std::printf(" %6.2fx |      %7.2f |                   ", med(f, &figures::rate, 2) / med(f, &figures::rate, 1),
                med(f, &figures::cpu_rate, 1));
    for (int t : thread_counts) std::printf(" %5.2f", med(f, &figures::rate, t) / best_peer(tab, cs, t).first);
    const double m2 = tab.count("malloc") ? med(tab.at("malloc"), &figures::rate, 2) : 0.0;
    std::printf(" |      %6.2fx |", m2 > 0 ? med(f, &figures::rate, 2) / m2 : 0.0);
    if (c.counts_space && sc.how == mode::own_live_set) {
      const double r1 = med(f, &figures::reserved, 1), r4 = med(f, &figures::reserved, 4);
      std::printf("          %6.3f %6.3f %5.2fx\n", r1, r4, r4 / r1);
    } else {
      std::printf("               -      -      -\n");
    }
  }
  std::printf("best synchronized peer:");
  for (int t : thread_counts) std::printf(" %dT %s", t, best_peer(tab, cs, t).second.c_str());
  std::printf("\n");
}

void print_targets(const std::vector<scenario>& scs, const std::map<std::string, table>& all,
                   const std::vector<contender>& cs) {
  std::printf("\nTargets, from this run (sharded = sharded<default_allocator>, default options):\n");
  auto verdict = [](bool met) { return met ? "met" : "NOT met"; };
  for (const scenario& sc : scs) {
    const table& tab = all.at(sc.name);
    if (!tab.count("sharded")) continue;
    const figures& s = tab.at("sharded");
    const double s1 = med(s, &figures::rate, 1), s2 = med(s, &figures::rate, 2);
    const auto peer2 = best_peer(tab, cs, 2);
    if (sc.how == mode::own_live_set) {
      const figures& l = tab.at("limit");
      const double l1 = med(l, &figures::rate, 1), l2 = med(l, &figures::rate, 2);
      const double scaling = (s2 / s1) / (l2 / l1);
      std::printf("  %s: 2T/1T %.2fx vs the limit's %.2fx = %.2f (>= 0.9: %s)\n", sc.name.c_str(), s2 / s1, l2 / l1,
                  scaling, verdict(scaling >= 0.9));
      // The same against what one thread does per CPU second, which does not depend on how much
      // of a core the one-thread run happened to get on a busy machine.
      const double s_cpu1 = med(s, &figures::cpu_rate, 1), l_cpu1 = med(l, &figures::cpu_rate, 1);
      const double scaling_cpu = (s2 / s_cpu1) / (l2 / l_cpu1);
      std::printf("  %s: 2T / 1T per CPU second %.2fx vs the limit's %.2fx = %.2f (>= 0.9: %s)\n", sc.name.c_str(),
                  s2 / s_cpu1, l2 / l_cpu1, scaling_cpu, verdict(scaling_cpu >= 0.9));
      std::printf("  %s: at 2T %.2f M pairs/s vs best synchronized peer %s %.2f = %.2fx (>= 2: %s)\n", sc.name.c_str(),
                  s2, peer2.second.c_str(), peer2.first, s2 / peer2.first, verdict(s2 / peer2.first >= 2));
      const double c1 = med(s, &figures::cpu_rate, 1), lc1 = med(l, &figures::cpu_rate, 1);
      std::printf(
          "  %s: 1T time vs a bare default_allocator (the limit at 1T), thread CPU time = %.2fx (<= 1.1: %s); "
          "wall time %.2fx\n",
          sc.name.c_str(), lc1 / c1, verdict(lc1 / c1 <= 1.1), l1 / s1);
      const double r1 = med(s, &figures::reserved, 1), r4 = med(s, &figures::reserved, 4);
      std::printf("  %s: peak reserved/peak live 4T %.3f vs 1T %.3f = %.2fx (<= 1.25: %s)\n", sc.name.c_str(), r4, r1,
                  r4 / r1, verdict(r4 / r1 <= 1.25));
    } else {
      double best_any = peer2.first;
      std::string best_name = peer2.second;
      if (tab.count("malloc") && med(tab.at("malloc"), &figures::rate, 2) > best_any) {
        best_any = med(tab.at("malloc"), &figures::rate, 2);
        best_name = "malloc";
      }
      for (int t : {2, 4, 8}) {
        double best_t = best_peer(tab, cs, t).first;
        std::string name_t = best_peer(tab, cs, t).second;
        if (tab.count("malloc") && med(tab.at("malloc"), &figures::rate, t) > best_t) {
          best_t = med(tab.at("malloc"), &figures::rate, t);
          name_t = "malloc";
        }
        const double r = med(s, &figures::rate, t) / best_t;
        std::printf("  %s: at %dT %.2f M pairs/s vs best peer %s %.2f = %.2fx (>= 1.5: %s)\n", sc.name.c_str(), t,
                    med(s, &figures::rate, t), name_t.c_str(), best_t, r, verdict(r >= 1.5));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int arg = 1;
  const bool quick = argc > arg && std::strcmp(argv[arg], "--quick") == 0;
  if (quick) ++arg;
  const std::string only_scenario = argc > arg ? argv[arg++] : "";
  const std::string only_allocator = argc > arg ? argv[arg++] : "";
  const int reps = quick ? 1 : 3;
  auto scs = scenarios();
  std::erase_if(scs, [&](const scenario& sc) { return sc.name.find(only_scenario) == std::string::npos; });
  auto cs = contenders();
  std::erase_if(cs, [&](const contender& c) {
    return c.name.find(only_allocator) == std::string::npos && c.name != "limit" && !c.synchronized_peer;
  });
  std::map<std::string, table> all;
  std::printf("threads: %u hardware threads; %d repetitions\n", std::thread::hardware_concurrency(), reps);
  const auto begin = wall_clock::now();
  for (const scenario& sc : scs) {
    table& tab = all[sc.name];
    for (int r = 0; r < reps; ++r) {
      for (int threads : thread_counts) {
        for (const contender& c : cs) {
          if (sc.how == mode::producer_consumer && !c.cross_thread) continue;
          std::size_t peak = 0;
          const rates rate = c.run(sc, threads, peak);
          tab[c.name].rate[threads].push_back(rate.wall);
          tab[c.name].cpu_rate[threads].push_back(rate.cpu);
          if (c.counts_space) {
            tab[c.name].reserved[threads].push_back(static_cast<double>(peak) / peak_live(sc, threads));
          }
        }
      }
    }
    print_table(sc, tab, cs, reps);
    std::fflush(stdout);
  }
  print_targets(scs, all, cs);
  std::printf("\n(%.0f s)\n", std::chrono::duration<double>(wall_clock::now() - begin).count());
  return 0;
}
