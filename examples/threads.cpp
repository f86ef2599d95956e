// SPDX-License-Identifier: Apache-2.0
// README "Threads": sharded<> gives each thread its own shard, and a block may be freed by any
// thread. Four threads allocate; each frees its own blocks and those its neighbour handed over.
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/showcase.hpp>

using namespace alloy::literals;

int main() {
  using alloc_t = alloy::sharded<alloy::default_allocator<alloy::host_upstream>>;
  alloc_t alloc{{.shards = 4}};  // four default_allocators, each behind its own lock

  std::mutex handed_lock;
  std::vector<alloy::block> handed;  // blocks one thread allocated for another to free
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&alloc, &handed, &handed_lock, t] {
      for (int i = 0; i < 20'000; ++i) {
        const alloy::block mine = alloc.allocate(64 + 64 * static_cast<std::size_t>((i * 7 + t) % 512), 16);
        if (i % 4 == 0) {
          std::lock_guard lock(handed_lock);
          handed.push_back(mine);  // freed below by whichever thread takes it
        } else {
          alloc.deallocate(mine);
        }
        if (i % 8 == 1) {
          std::lock_guard lock(handed_lock);
          if (!handed.empty()) {
            alloc.deallocate(handed.back());  // often another thread's block
            handed.pop_back();
          }
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  for (const alloy::block& b : handed) alloc.deallocate(b);
  alloc.flush_thread_caches();  // cached small blocks back to their shards
  std::printf("%zu shards, %zu bytes in use after every free\n", alloc.shard_count(), alloc.bytes_in_use());
  return alloc.bytes_in_use() == 0 ? 0 : 1;
}
