// SPDX-License-Identifier: Apache-2.0
// bench/support/thread_pairs.hpp: free+allocate pairs on N threads at once through one allocator,
// as bench/threads and rmm_threads_gpu run them: W2 and W1 (each thread its own live set and
// requests) and producer/consumer (every block freed by the next thread, passed through a ring).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include <alloy/block.hpp>

#include "support/pairs_workload.hpp"

namespace alloy::bench {

enum class thread_mode { own_live_set, producer_consumer };

struct thread_scenario {
  std::string name;
  thread_mode how;
  std::size_t largest_pooled;        // the std::pmr and thrust pools' largest pooled block
  std::vector<workload> per_thread;  // thread t's requests
};

/// W2 (1,000 live, 256 B-64 KiB, `small_pairs` pairs a thread), W1 (256 B-4 MiB, `large_pairs`)
/// and producer/consumer (W2's requests), for up to `threads` threads, each with its own seed.
inline std::vector<thread_scenario> thread_scenarios(int threads, std::size_t small_pairs, std::size_t large_pairs) {
  std::vector<thread_scenario> out;
  out.push_back({"W2", thread_mode::own_live_set, std::size_t{64} << 10, {}});
  out.push_back({"W1", thread_mode::own_live_set, std::size_t{4} << 20, {}});
  out.push_back({"producer/consumer", thread_mode::producer_consumer, std::size_t{64} << 10, {}});
  for (int t = 0; t < threads; ++t) {
    const auto seed = static_cast<std::uint64_t>(20261124 + t);
    out[0].per_thread.push_back(make_workload(
        {.live_blocks = 1'000, .pairs = small_pairs, .log2_smallest = 8, .log2_largest = 16, .seed = seed}));
    out[1].per_thread.push_back(make_workload(
        {.live_blocks = 1'000, .pairs = large_pairs, .log2_smallest = 8, .log2_largest = 22, .seed = seed}));
  }
  out[2].per_thread = out[0].per_thread;
  return out;
}

/// One producer, one consumer; 1,024 blocks. Each side publishes its index every 16 blocks (and
/// whenever it would wait), and reads the other's again only when the ring looks full (empty), so
/// that moving blocks between threads costs little next to the allocators: a cache line of slots
/// and one index per 16 blocks.
struct block_ring {
  static constexpr std::size_t capacity = 1024;
  static constexpr std::size_t batch = 16;
  alignas(64) std::atomic<std::size_t> head{0};  // next to pop, as published by the consumer
  std::size_t head_local = 0;                    // the consumer's own
  std::size_t tail_seen = 0;                     // the consumer's copy of `tail`
  alignas(64) std::atomic<std::size_t> tail{0};  // next to push, as published by the producer
  std::size_t tail_local = 0;                    // the producer's own
  std::size_t head_seen = 0;                     // the producer's copy of `head`
  alignas(64) block slots[capacity];

  bool push(block b) noexcept {
    if (tail_local - head_seen == capacity) {
      publish_tail();
      head_seen = head.load(std::memory_order_acquire);
      if (tail_local - head_seen == capacity) return false;
    }
    slots[tail_local++ % capacity] = b;
    if (tail_local % batch == 0) publish_tail();
    return true;
  }
  bool pop(block& b) noexcept {
    if (head_local == tail_seen) {
      publish_head();
      tail_seen = tail.load(std::memory_order_acquire);
      if (head_local == tail_seen) return false;
    }
    b = slots[head_local++ % capacity];
    if (head_local % batch == 0) publish_head();
    return true;
  }
  void publish_tail() noexcept { tail.store(tail_local, std::memory_order_release); }
  void publish_head() noexcept { head.store(head_local, std::memory_order_release); }
};

struct thread_rates {
  double wall = 0;  // M pairs/s, all threads together, from the start signal to the last thread's end
  double cpu = 0;   // M pairs per CPU second of the threads (their CPU time added up)
};

/// Runs `threads` threads of `sc` over `env` (`allocate(thread, bytes)`, `deallocate(thread,
/// block)`). A refused request ends the program, naming `program` and `name`: the figures would
/// mean nothing.
template <class Env>
thread_rates run_threads(Env& env, const thread_scenario& sc, int threads, const char* program, const char* name) {
  using wall_clock = std::chrono::steady_clock;
  std::atomic<int> ready{0}, done{0};
  std::atomic<bool> go{false};
  std::vector<wall_clock::time_point> finish(static_cast<std::size_t>(threads));
  std::vector<double> cpu_seconds(static_cast<std::size_t>(threads));
  std::vector<std::unique_ptr<block_ring>> rings;
  if (sc.how == thread_mode::producer_consumer) {
    for (int t = 0; t < threads; ++t) rings.push_back(std::make_unique<block_ring>());
  }
  const auto wait_for = [](std::atomic<int>& counter, int n) {
    while (counter.load(std::memory_order_acquire) < n) std::this_thread::yield();
  };
  const auto seconds_since = [](thread_cpu_clock::time_point start) {
    return std::chrono::duration<double>(thread_cpu_clock::now() - start).count();
  };

  auto body = [&](int t) {
    const workload& w = sc.per_thread[static_cast<std::size_t>(t)];
    auto allocate = [&](std::size_t bytes) {
      const block b = env.allocate(t, bytes);
      if (!b) {
        std::fprintf(stderr, "%s: %s failed a request; the figures would mean nothing\n", program, name);
        std::abort();
      }
      return b;
    };
    if (sc.how == thread_mode::own_live_set) {
      std::vector<block> held(w.initial.size());
      for (std::size_t i = 0; i < held.size(); ++i) held[i] = allocate(w.initial[i]);
      ready.fetch_add(1, std::memory_order_release);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const auto cpu_start = thread_cpu_clock::now();
      for (std::size_t i = 0; i < w.pairs(); ++i) {
        const std::uint32_t v = w.victim[i];
        env.deallocate(t, held[v]);
        held[v] = allocate(w.size[i]);
        benchmark::DoNotOptimize(held[v]);
      }
      finish[static_cast<std::size_t>(t)] = wall_clock::now();
      cpu_seconds[static_cast<std::size_t>(t)] = seconds_since(cpu_start);
      done.fetch_add(1, std::memory_order_release);
      wait_for(done, threads);  // nobody frees its live set while others are timed
      for (const block& b : held) env.deallocate(t, b);
    } else {
      block_ring& out = *rings[static_cast<std::size_t>(t)];
      block_ring& in = *rings[static_cast<std::size_t>((t + threads - 1) % threads)];
      for (std::size_t i = 0; i < block_ring::capacity / 2; ++i) out.push(allocate(w.initial[i]));
      out.publish_tail();
      ready.fetch_add(1, std::memory_order_release);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const auto cpu_start = thread_cpu_clock::now();
      block b;
      for (std::size_t i = 0; i < w.pairs(); ++i) {
        const block mine = allocate(w.size[i]);
        while (!out.push(mine)) {
          if (in.pop(b)) {
            env.deallocate(t, b);
          } else {
            std::this_thread::yield();
          }
        }
        if (in.pop(b)) env.deallocate(t, b);
      }
      out.publish_tail();
      finish[static_cast<std::size_t>(t)] = wall_clock::now();
      cpu_seconds[static_cast<std::size_t>(t)] = seconds_since(cpu_start);
      done.fetch_add(1, std::memory_order_release);
      // Keep consuming until every producer is done (a producer with a full ring waits for us).
      while (done.load(std::memory_order_acquire) < threads) {
        if (in.pop(b)) {
          env.deallocate(t, b);
        } else {
          std::this_thread::yield();
        }
      }
      while (in.pop(b)) env.deallocate(t, b);  // what is left, freed by its consumer
    }
  };

  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(body, t);
  wait_for(ready, threads);
  const auto start = wall_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  const auto end = *std::max_element(finish.begin(), finish.end());
  const double seconds = std::chrono::duration<double>(end - start).count();
  double cpu = 0;
  for (double c : cpu_seconds) cpu += c;
  const double pairs = static_cast<double>(sc.per_thread[0].pairs()) * threads;
  return {pairs / seconds * 1e-6, pairs / cpu * 1e-6};
}

}  // namespace alloy::bench
