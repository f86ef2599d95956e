// SPDX-License-Identifier: Apache-2.0
// Threads on a real device, RMM beside alloy: bench/threads' free+allocate pairs on 1, 2, 4, 8
// and 16 threads at once through allocators of device memory shared by every thread, against one
// unshared allocator per thread. Built only when RMM is found (cmake/alloy-rmm.cmake). Needs a
// CUDA device; without one it says so and exits 0.
//
// Workloads, each thread with its own requests (its own seed; bench/support/pairs_workload.hpp):
//   - W2: a live set of 1,000 blocks, sizes log-uniform 256 B-64 KiB, then pairs, each freeing a
//     random live block and allocating a fresh size in its place (200,000 pairs a thread);
//   - W1: the same with sizes 256 B-4 MiB (50,000 pairs a thread);
//   - producer/consumer: W2's sizes, every block freed by the next thread (a ring of 1,024 slots
//     per thread, half filled before the timed part); on one thread the ring leads back to itself.
// Alignment 256; the memory is never touched.
//
// Allocators:
//   - limit: one default_allocator<cuda_malloc_upstream> per thread, nothing shared (no
//     producer/consumer: a block cannot go to another thread's allocator);
//   - sharded: alloy::sharded<default_allocator<cuda_malloc_upstream>>, default options;
//   - synchronized: alloy::synchronized<default_allocator<cuda_malloc_upstream>>;
//   - rmm pool: rmm::mr::thread_safe_resource_adaptor over pool_memory_resource over
//     cuda_memory_resource, initial size half the free device memory;
//   - rmm arena: thread_safe_resource_adaptor over arena_memory_resource (its default arena);
//   - rmm arena, bare: arena_memory_resource alone (it keeps an arena per thread and is safe to
//     share without the adaptor: how RMM meant it for threads);
//   - std_pmr_sync_pool: std::pmr::synchronized_pool_resource over host memory (its free lists
//     live in the blocks, so it cannot hand out device memory), largest pooled block 64 KiB (W2)
//     or 4 MiB (W1).
// RMM's resources are called stream-ordered, each thread on its per-thread default stream
// (cudaStreamPerThread), as RMM's multi-threaded users run them: the arena keeps an arena per
// thread only for that stream, and the pool a free list per stream. Figures: million pairs per
// second, all threads together (pairs ÷ wall time from the start signal to the last thread's
// end), the median of the repetitions (3; `--quick`: 1 and a quarter of the pairs), which
// interleave allocators and thread counts.
//
//   rmm_threads_gpu [--quick] [SCENARIO [ALLOCATOR]]   # names containing these
#if ALLOY_HAS_RMM
#  include <algorithm>
#  include <cstdio>
#  include <cstdlib>
#  include <exception>
#  include <functional>
#  include <memory>
#  include <memory_resource>
#  include <string>
#  include <thread>
#  include <vector>

#  include <cuda/std/version>
#  include <cuda_runtime_api.h>

#  include <rmm/mr/arena_memory_resource.hpp>
#  include <rmm/mr/cuda_memory_resource.hpp>
#  include <rmm/mr/pool_memory_resource.hpp>
#  include <rmm/mr/thread_safe_resource_adaptor.hpp>

#  include <alloy/policy/sharded.hpp>
#  include <alloy/policy/synchronized.hpp>
#  include <alloy/showcase.hpp>
#  include <alloy/upstream/cuda_malloc_upstream.hpp>

#  include "support/pairs_workload.hpp"
#  include "support/thread_pairs.hpp"

// RMM's headers need the CCCL its wheel ships, newer than the toolkit's: cmake/alloy-rmm.cmake
// puts it first on the include path.
static_assert(CCCL_VERSION >= 3005000, "RMM's CCCL must come before the toolkit's on the include path");

namespace {

using namespace alloy::bench;
using D = alloy::default_allocator<alloy::cuda_malloc_upstream>;

constexpr std::size_t alignment = 256;
constexpr int thread_counts[] = {1, 2, 4, 8, 16};
constexpr int max_threads = 16;

using scenario = thread_scenario;
using mode = thread_mode;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "rmm_threads_gpu: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// ---- the contenders ------------------------------------------------------------------------------

struct limit_env {
  std::vector<std::unique_ptr<D>> per_thread;
  explicit limit_env(const scenario&) {
    for (int t = 0; t < max_threads; ++t) per_thread.push_back(std::make_unique<D>(alloy::cuda_malloc_upstream{}));
  }
  alloy::block allocate(int t, std::size_t bytes) noexcept {
    return per_thread[static_cast<std::size_t>(t)]->allocate(bytes, alignment);
  }
  void deallocate(int t, alloy::block b) noexcept { per_thread[static_cast<std::size_t>(t)]->deallocate(b); }
};

struct sharded_env {
  alloy::sharded<D> a;
  explicit sharded_env(const scenario&)
      : a([](std::size_t) { return D{alloy::cuda_malloc_upstream{}}; }, alloy::sharded<D>::options{}) {}
  alloy::block allocate(int, std::size_t bytes) noexcept { return a.allocate(bytes, alignment); }
  void deallocate(int, alloy::block b) noexcept { a.deallocate(b); }
};

struct synchronized_env {
  alloy::synchronized<D> a;
  explicit synchronized_env(const scenario&) : a(D{alloy::cuda_malloc_upstream{}}) {}
  alloy::block allocate(int, std::size_t bytes) noexcept { return a.allocate(bytes, alignment); }
  void deallocate(int, alloy::block b) noexcept { a.deallocate(b); }
};

struct pmr_env {
  std::pmr::synchronized_pool_resource pool;
  explicit pmr_env(const scenario& sc)
      : pool({.max_blocks_per_chunk = 0, .largest_required_pool_block = sc.largest_pooled},
             std::pmr::new_delete_resource()) {}
  alloy::block allocate(int, std::size_t bytes) { return {pool.allocate(bytes, alignment), bytes}; }
  void deallocate(int, alloy::block b) { pool.deallocate(b.ptr, b.size, alignment); }
};

std::size_t half_of_free() {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free / 2 / alignment * alignment;
}

/// An RMM resource shared by every thread, stream-ordered on each thread's default stream.
template <class R>
struct rmm_env {
  R r;
  explicit rmm_env(R resource) : r(std::move(resource)) {}
  alloy::block allocate(int, std::size_t bytes) noexcept {
    try {
      return {r.allocate(cuda::stream_ref{cudaStreamPerThread}, bytes, alignment), bytes};
    } catch (const std::exception&) {
      return {};
    }
  }
  void deallocate(int, alloy::block b) noexcept {
    r.deallocate(cuda::stream_ref{cudaStreamPerThread}, b.ptr, b.size, alignment);
  }
};

struct rmm_pool_env : rmm_env<rmm::mr::thread_safe_resource_adaptor> {
  explicit rmm_pool_env(const scenario&)
      : rmm_env{rmm::mr::thread_safe_resource_adaptor{
            rmm::mr::pool_memory_resource{rmm::mr::cuda_memory_resource{}, half_of_free()}}} {}
};

struct rmm_arena_env : rmm_env<rmm::mr::thread_safe_resource_adaptor> {
  explicit rmm_arena_env(const scenario&)
      : rmm_env{
            rmm::mr::thread_safe_resource_adaptor{rmm::mr::arena_memory_resource{rmm::mr::cuda_memory_resource{}}}} {}
};

struct rmm_arena_bare_env : rmm_env<rmm::mr::arena_memory_resource> {
  explicit rmm_arena_bare_env(const scenario&)
      : rmm_env{rmm::mr::arena_memory_resource{rmm::mr::cuda_memory_resource{}}} {}
};

struct contender {
  std::string name;
  bool cross_thread;  // may free a block on another thread than the one that allocated it
  std::function<double(const scenario&, int threads)> run;
};

template <class Env>
contender make(std::string name, bool cross) {
  return {name, cross, [name](const scenario& sc, int threads) {
            double rate = 0;
            {
              Env env(sc);
              rate = run_threads(env, sc, threads, "rmm_threads_gpu", name.c_str()).wall;
            }
            check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
            return rate;
          }};
}

std::vector<contender> contenders() {
  return {make<limit_env>("limit (one per thread)", false),
          make<sharded_env>("sharded<default_allocator>", true),
          make<synchronized_env>("synchronized<default_allocator>", true),
          make<rmm_pool_env>("rmm pool, thread_safe", true),
          make<rmm_arena_env>("rmm arena, thread_safe", true),
          make<rmm_arena_bare_env>("rmm arena, bare", true),
          make<pmr_env>("std_pmr_sync_pool (host memory)", true)};
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick") {
      quick = true;
    } else {
      only.emplace_back(argv[i]);
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("rmm_threads_gpu: no CUDA device here; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  check(cudaFree(nullptr), "context");
  const int repetitions = quick ? 1 : 3;
  std::printf("device: %s; RMM %s; %u hardware threads; M pairs/s, all threads together, median of %d\n\n", prop.name,
              ALLOY_RMM_VERSION_STRING, std::thread::hardware_concurrency(), repetitions);
  const std::vector<scenario> all =
      thread_scenarios(max_threads, (quick ? 50'000 : 200'000), (quick ? 12'500 : 50'000));
  const std::vector<contender> cs = contenders();
  for (const scenario& sc : all) {
    if (only.size() > 0 && sc.name.find(only[0]) == std::string::npos) continue;
    std::vector<const contender*> chosen;
    for (const contender& c : cs) {
      if (sc.how == mode::producer_consumer && !c.cross_thread) continue;
      if (only.size() > 1 && c.name.find(only[1]) == std::string::npos && c.name.rfind("limit", 0) != 0) continue;
      chosen.push_back(&c);
    }
    std::vector<std::vector<std::vector<double>>> rates(chosen.size(),
                                                        std::vector<std::vector<double>>(std::size(thread_counts)));
    for (int r = 0; r < repetitions; ++r) {
      for (std::size_t t = 0; t < std::size(thread_counts); ++t) {
        for (std::size_t i = 0; i < chosen.size(); ++i) {
          const std::size_t k = (i + static_cast<std::size_t>(r)) % chosen.size();
          rates[k][t].push_back(chosen[k]->run(sc, thread_counts[t]));
        }
      }
    }
    std::printf("%s (%zu pairs a thread)\n\n| allocator |", sc.name.c_str(), sc.per_thread[0].pairs());
    for (int t : thread_counts) std::printf(" %dT |", t);
    std::printf(" 16T ÷ 1T |\n|---|");
    for (std::size_t t = 0; t <= std::size(thread_counts); ++t) std::printf("---:|");
    std::printf("\n");
    for (std::size_t k = 0; k < chosen.size(); ++k) {
      std::printf("| %s |", chosen[k]->name.c_str());
      for (const std::vector<double>& v : rates[k]) std::printf(" %.2f |", median(v));
      std::printf(" %.2f |\n", median(rates[k].back()) / median(rates[k].front()));
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
#else
#  include <cstdio>
int main() {
  std::printf("rmm_threads_gpu: built without RMM (scripts/fetch-rmm, then configure again); nothing measured\n");
  return 0;
}
#endif
