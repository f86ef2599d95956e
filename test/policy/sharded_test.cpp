// SPDX-License-Identifier: Apache-2.0
// sharded: the conformance routine (with and without thread caches), the failure matrix, and a
// multi-threaded randomized test: 4 threads, 10^6 operations in all (fewer under ThreadSanitizer,
// see `total_operations`; there the single-threaded cases are skipped), a quarter of the blocks
// freed by another thread than the one that allocated them (handed over through a locked queue),
// a fill pattern on every block checked when it is freed, and exact statistics at the end,
// through `sharded<stats<...>>`, `synchronized<stats<sharded<...>>>` and the shards' own
// counters; stream-ordered calls through the shards (a free from another thread reaches the
// owner and keeps the stream order: a directed case and a 2-thread, 2-stream one with content
// checks on the streams); movable handles made, spilled, checked and freed across threads; and
// shards of virtual_arena over one host_vmm sharing its physical
// capacity.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <alloy/error.hpp>
#include <alloy/host_stream.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>
#include <alloy/policy/limited.hpp>
#include <alloy/policy/sharded.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/stream_ordered.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/showcase.hpp>
#include <alloy/upstream/host_upstream.hpp>
#include <alloy/vmm/host_vmm.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>

#include "support/conformance.hpp"
#include "support/sanitizers.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;
using alloy::testing::failing_upstream;
using alloy::testing::ledger;

namespace {

using alloy::testing::under_tsan;

/// 10^6 operations over 4 threads; under ThreadSanitizer (every access checked, 5-15x slower)
/// 2 * 10^5, so that the TSan stage stays near a minute.
constexpr std::size_t total_operations = under_tsan ? 200'000 : 1'000'000;
constexpr int worker_threads = 4;

/// The single-threaded cases (conformance, failure matrix) take two minutes under ThreadSanitizer
/// and have no threads for it to look at: there they are skipped, saying so; the release and
/// ASan/UBSan runs cover them.
boost::test_tools::assertion_result not_under_tsan(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result result(!under_tsan);
  result.message() << "single-threaded: left to the release and ASan/UBSan runs";
  return result;
}

/// `checking_upstream` with a lock: shards call their upstreams from several threads at once.
class locked_checking_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  alloy::block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    std::lock_guard lock(*mutex_);
    return inner_.allocate(bytes, alignment);
  }
  void deallocate(alloy::block b) noexcept {
    std::lock_guard lock(*mutex_);
    inner_.deallocate(b);
  }
  const std::shared_ptr<ledger>& records() const noexcept { return inner_.records(); }

 private:
  checking_upstream inner_{};
  std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
};

template <class U>
using dflt = alloy::default_allocator<U>;

void check_ledger(const ledger& records) {
  BOOST_TEST(records.live_count() == 0u, "the composition leaked " << records.live_count() << " upstream blocks");
  BOOST_TEST(records.errors.empty(), "upstream saw misuse: " << (records.errors.empty() ? "" : records.errors[0]));
  BOOST_TEST(records.allocations == records.deallocations);
}

// ---- fill patterns that ThreadSanitizer checks as ranges (memset / memcmp) ----------------------

struct item {
  alloy::block b;
  std::uint64_t id = 0;
};

unsigned char body_byte(std::uint64_t id) noexcept { return static_cast<unsigned char>(id * 131 % 251 + 1); }

/// The id in the first and the last 8 bytes (the last inverted), a byte of the id in between.
void fill(const item& it) noexcept {
  auto* p = static_cast<unsigned char*>(it.b.ptr);
  const std::size_t n = it.b.size;
  if (n < 16) {
    std::memset(p, body_byte(it.id), n);
    return;
  }
  const std::uint64_t head = it.id, tail = ~it.id;
  std::memcpy(p, &head, 8);
  std::memset(p + 8, body_byte(it.id), n - 16);
  std::memcpy(p + n - 8, &tail, 8);
}
bool intact(const item& it) noexcept {
  const auto* p = static_cast<const unsigned char*>(it.b.ptr);
  const std::size_t n = it.b.size;
  auto uniform = [&](const unsigned char* from, std::size_t len) {
    return len == 0 || (from[0] == body_byte(it.id) && std::memcmp(from, from + 1, len - 1) == 0);
  };
  if (n < 16) return uniform(p, n);
  std::uint64_t head = 0, tail = 0;
  std::memcpy(&head, p, 8);
  std::memcpy(&tail, p + n - 8, 8);
  return head == it.id && tail == ~it.id && uniform(p + 8, n - 16);
}

// ---- the multi-threaded workload -----------------------------------------------------------------

struct thread_totals {
  std::size_t allocations = 0;    // successful
  std::size_t failures = 0;       // empty blocks
  std::size_t handed_over = 0;    // blocks put in the queue
  std::size_t freed_foreign = 0;  // blocks taken from the queue and freed
  std::size_t largest = 0;        // largest successful request
  std::size_t bad_patterns = 0;   // blocks whose pattern was damaged when freed
  std::size_t misaligned = 0;
};

struct handover_queue {
  std::mutex mutex;
  std::deque<item> blocks;
};

std::size_t draw_size(std::mt19937_64& rng) {
  const auto r = rng() % 100;
  const double top = r < 80 ? 14 : r < 95 ? 18 : 21;  // to 16 KiB, 256 KiB, 2 MiB
  std::uniform_real_distribution<double> log_size(0, top);
  return static_cast<std::size_t>(std::exp2(log_size(rng))) - 1;
}

/// One worker: allocations, frees of its own blocks, blocks handed to the queue, blocks taken
/// from the queue and freed (most of them allocated by another thread).
template <class A>
thread_totals work(A& a, handover_queue& queue, int t, std::size_t operations) {
  std::mt19937_64 rng(20261124 + static_cast<std::uint64_t>(t));
  std::vector<item> live;
  thread_totals out;
  std::uint64_t next_id = (static_cast<std::uint64_t>(t) + 1) << 40;
  auto free_checked = [&](const item& it) {
    if (!intact(it)) ++out.bad_patterns;
    a.deallocate(it.b);
  };
  for (std::size_t op = 0; op < operations; ++op) {
    const auto r = rng() % 100;
    if (live.size() < 32 || (r < 46 && live.size() < 400)) {
      const std::size_t bytes = draw_size(rng);
      const std::size_t alignment = rng() % 4 == 0 ? std::size_t{1} << (rng() % 13) : 256;
      const alloy::block b = a.allocate(bytes, alignment);
      if (!b) {
        ++out.failures;
        continue;
      }
      if (b.size != bytes || !alloy::detail::is_aligned(b.ptr, alignment)) ++out.misaligned;
      ++out.allocations;
      out.largest = std::max(out.largest, bytes);
      const item it{b, next_id++};
      fill(it);
      live.push_back(it);
    } else if (r < 76) {
      const std::size_t v = rng() % live.size();
      free_checked(live[v]);
      live[v] = live.back();
      live.pop_back();
    } else if (r < 88) {
      const std::size_t v = rng() % live.size();
      {
        std::lock_guard lock(queue.mutex);
        queue.blocks.push_back(live[v]);
      }
      ++out.handed_over;
      live[v] = live.back();
      live.pop_back();
    } else {
      item it;
      {
        std::lock_guard lock(queue.mutex);
        if (queue.blocks.empty()) continue;
        it = queue.blocks.front();
        queue.blocks.pop_front();
      }
      free_checked(it);
      ++out.freed_foreign;
    }
  }
  for (const item& it : live) free_checked(it);
  return out;
}

/// Runs the workload on `worker_threads` threads, then frees what is left in the queue from this
/// thread; returns the totals added up.
template <class A>
thread_totals run_workers(A& a) {
  handover_queue queue;
  std::vector<thread_totals> totals(worker_threads);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < worker_threads; ++t) {
      threads.emplace_back(
          [&, t] { totals[static_cast<std::size_t>(t)] = work(a, queue, t, total_operations / worker_threads); });
    }
  }
  thread_totals sum;
  for (const thread_totals& t : totals) {
    sum.allocations += t.allocations;
    sum.failures += t.failures;
    sum.handed_over += t.handed_over;
    sum.freed_foreign += t.freed_foreign;
    sum.largest = std::max(sum.largest, t.largest);
    sum.bad_patterns += t.bad_patterns;
    sum.misaligned += t.misaligned;
  }
  for (const item& it : queue.blocks) {
    if (!intact(it)) ++sum.bad_patterns;
    a.deallocate(it.b);
  }
  BOOST_TEST_MESSAGE("  " << sum.allocations << " allocations, " << sum.handed_over << " handed over, "
                          << sum.freed_foreign << " freed by the thread that took them, " << queue.blocks.size()
                          << " left in the queue");
  BOOST_TEST(sum.failures == 0u);
  BOOST_TEST(sum.bad_patterns == 0u, "blocks overlapped or were written by someone else");
  BOOST_TEST(sum.misaligned == 0u);
  BOOST_TEST(sum.handed_over > total_operations / 20, "too few blocks crossed threads");
  return sum;
}

}  // namespace

// ---- conformance ---------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(conformance_without_thread_cache, *boost::unit_test::precondition(not_under_tsan)) {
  std::shared_ptr<ledger> records;
  {
    checking_upstream up;
    records = up.records();
    alloy::sharded<dflt<checking_upstream>> a{[&](std::size_t) { return dflt<checking_upstream>{up}; },
                                              {.shards = 3, .thread_cache = 0}};
    alloy::testing::check_conformance(a);
    BOOST_TEST(a.refused_frees() == 0u);
  }
  check_ledger(*records);
  {
    checking_upstream up;
    records = up.records();
    using arena = alloy::best_fit_arena<checking_upstream>;
    alloy::sharded<arena> a{[&](std::size_t) { return arena{up}; }, {.shards = 2, .thread_cache = 0}};
    alloy::testing::check_conformance(a);
  }
  check_ledger(*records);
}

BOOST_AUTO_TEST_CASE(conformance_with_thread_cache, *boost::unit_test::precondition(not_under_tsan)) {
  std::shared_ptr<ledger> records;
  {
    checking_upstream up;
    records = up.records();
    alloy::sharded<dflt<checking_upstream>> a{[&](std::size_t) { return dflt<checking_upstream>{up}; }, {.shards = 2}};
    const alloy::testing::conformance_options opts;
    alloy::testing::check_sizes_and_alignments(a, opts);
    alloy::testing::check_zero_size(a);
    alloy::testing::check_bad_arguments(a, opts);
    alloy::testing::check_owns(a);
    alloy::testing::check_random_workload(a, opts);
    // Cached blocks are in use as far as the shards can tell: give the cache back first.
    std::size_t in_use = 0;
    a.for_each_block([&](const alloy::block_info& info) { in_use += info.state != alloy::block_state::free; });
    BOOST_TEST(in_use > 0u, "the thread cache keeps blocks");
    a.flush_thread_cache();
    alloy::testing::check_after_everything_freed(a, opts);
    BOOST_TEST(a.refused_frees() == 0u);
  }
  check_ledger(*records);
}

BOOST_AUTO_TEST_CASE(failure_matrix, *boost::unit_test::precondition(not_under_tsan)) {
  using alloc = alloy::sharded<dflt<failing_upstream>>;
  std::size_t total_calls = 0;
  {
    failing_upstream up;
    alloc a{[&](std::size_t) { return dflt<failing_upstream>{up}; }, {.shards = 2}};
    BOOST_TEST(alloy::testing::failure_workload(a) == 0u);
    total_calls = up.calls();
  }
  BOOST_TEST(total_calls > 0u);
  for (std::size_t k = 0; k <= total_calls; ++k) {
    for (bool from_k_on : {false, true}) {
      failing_upstream::options fail;
      if (from_k_on) {
        fail.fail_from = k;
      } else {
        fail.fail_at = {k};
      }
      failing_upstream up{fail};
      const std::shared_ptr<ledger> records = up.records();
      {
        alloc a{[&](std::size_t) { return dflt<failing_upstream>{up}; }, {.shards = 2}};
        alloy::testing::failure_workload(a);
        a.flush_thread_cache();
        a.release();
        BOOST_TEST(a.reserved_bytes() == 0u);
      }
      BOOST_TEST(records->live_count() == 0u, "leak with upstream failing at call " << k << (from_k_on ? " on" : ""));
      BOOST_TEST(records->errors.empty());
    }
  }
}

// ---- threads -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(threads_with_thread_caches) {
  locked_checking_upstream up;
  using inner = dflt<locked_checking_upstream>;
  {
    // Three shards for four threads: two threads share one.
    alloy::sharded<inner> a{[&](std::size_t) { return inner{up}; }, {.shards = 3}};
    run_workers(a);
    a.flush_thread_caches();
    std::size_t in_use = 0;
    a.for_each_block([&](const alloy::block_info& info) { in_use += info.state != alloy::block_state::free; });
    BOOST_TEST(in_use == 0u);
    BOOST_TEST(a.bytes_in_use() == 0u);
    BOOST_TEST(a.refused_frees() == 0u);
    a.release();
    BOOST_TEST(a.reserved_bytes() == 0u);
    const alloy::allocator_counters c = a.counters();
    BOOST_TEST(c.num_device_alloc > 0u);
    BOOST_TEST(c.num_device_alloc == c.num_device_free);
    BOOST_TEST(c.num_ooms == 0u);
  }
  check_ledger(*up.records());
}

BOOST_AUTO_TEST_CASE(threads_sharded_over_stats) {
  locked_checking_upstream up;
  using inner = alloy::stats<dflt<locked_checking_upstream>>;
  {
    alloy::sharded<inner> a{[&](std::size_t) { return inner{dflt<locked_checking_upstream>{up}}; }, {.shards = 4}};
    const thread_totals t = run_workers(a);
    const alloy::statistics s = a.statistics();
    BOOST_TEST(s.num_allocs == t.allocations);
    BOOST_TEST(s.bytes_in_use == 0u);
    BOOST_TEST(s.requested_bytes == 0u);
    BOOST_TEST(s.largest_alloc_size == t.largest);
    BOOST_TEST(s.num_ooms == 0u);
    BOOST_TEST(s.bytes_reserved > 0u);
    BOOST_TEST(s.peak_bytes_in_use > 0u);
    a.release();
    const alloy::statistics after = a.statistics();
    BOOST_TEST(after.bytes_reserved == 0u);
    BOOST_TEST(after.num_device_alloc == after.num_device_free);
    BOOST_TEST(a.refused_frees() == 0u);
  }
  check_ledger(*up.records());
}

BOOST_AUTO_TEST_CASE(threads_stats_over_sharded) {
  locked_checking_upstream up;
  using inner = dflt<locked_checking_upstream>;
  using shards = alloy::sharded<inner>;
  {
    // stats<> is not synchronized: the lock around it serialises the counting, while the shards
    // below still see four threads (and their caches).
    alloy::synchronized<alloy::stats<shards>> a{
        alloy::stats<shards>{shards{[&](std::size_t) { return inner{up}; }, {.shards = 2}}}};
    const thread_totals t = run_workers(a);
    a.with_lock([&](alloy::stats<shards>& st) {
      const alloy::statistics s = st.statistics();
      BOOST_TEST(s.num_allocs == t.allocations);
      BOOST_TEST(s.bytes_in_use == 0u);
      BOOST_TEST(s.requested_bytes == 0u);
      BOOST_TEST(s.largest_alloc_size == t.largest);
      BOOST_TEST(s.num_ooms == 0u);
      st.inner().flush_thread_caches();
      st.release();
      const alloy::statistics after = st.statistics();
      BOOST_TEST(after.bytes_reserved == 0u);
      BOOST_TEST(after.peak_bytes_reserved >= s.bytes_reserved);
      BOOST_TEST(after.num_device_alloc == after.num_device_free);
    });
  }
  check_ledger(*up.records());
}

/// A `std::mutex` that counts every `lock()` of every instance (test only).
std::atomic<std::size_t> counted_mutex_locks{0};
struct counted_mutex {
  void lock() {
    counted_mutex_locks.fetch_add(1, std::memory_order_relaxed);
    mutex.lock();
  }
  void unlock() { mutex.unlock(); }
  std::mutex mutex;
};

// The thread a shard was first given to holds it without its mutex while it works alone; the
// first other thread that needs the shard (here: frees of the owner's blocks, while the owner
// keeps allocating and freeing) closes that way for good, and both then take the mutex. Fill
// patterns, exact statistics and the upstream's ledger check that nothing was shared unsafely.
BOOST_AUTO_TEST_CASE(owner_works_without_the_mutex_until_another_thread_needs_its_shard) {
  locked_checking_upstream up;
  using inner = alloy::stats<dflt<locked_checking_upstream>>;  // no thread cache: every call holds a shard
  constexpr std::size_t alone_operations = under_tsan ? 4'000 : 40'000;
  constexpr std::size_t shared_operations = under_tsan ? 20'000 : 200'000;
  {
    alloy::sharded<inner, counted_mutex> a{[&](std::size_t) { return inner{dflt<locked_checking_upstream>{up}}; },
                                           {.shards = 2}};
    handover_queue queue;
    std::atomic<bool> owner_done{false};
    std::latch alone_done(1);
    std::size_t allocations = 0, bad_patterns = 0, locks_alone = 0;           // the owner's
    std::size_t freed_by_other = 0, bad_patterns_other = 0, locks_after = 0;  // the other thread's
    std::mt19937_64 rng(20261124);
    std::vector<item> live;
    std::uint64_t next_id = 1;
    auto step = [&](bool hand_over) {
      const auto r = rng() % 100;
      if (live.size() < 16 || (r < 50 && live.size() < 300)) {
        const std::size_t bytes = draw_size(rng);
        const alloy::block b = a.allocate(bytes, 256);
        if (!b) return;
        ++allocations;
        live.push_back(item{b, next_id++});
        fill(live.back());
        return;
      }
      const std::size_t v = rng() % live.size();
      if (hand_over && r < 75) {
        std::lock_guard lock(queue.mutex);
        queue.blocks.push_back(live[v]);
      } else {
        if (!intact(live[v])) ++bad_patterns;
        a.deallocate(live[v].b);
      }
      live[v] = live.back();
      live.pop_back();
    };
    std::jthread owner([&] {
      // The object's first caller: shard 0's owner.
      for (std::size_t op = 0; op < alone_operations; ++op) step(false);
      locks_alone = counted_mutex_locks.load();
      alone_done.count_down();
      for (std::size_t op = 0; op < shared_operations; ++op) step(true);
      for (const item& it : live) {
        if (!intact(it)) ++bad_patterns;
        a.deallocate(it.b);
      }
      owner_done.store(true);
    });
    std::jthread other([&] {
      alone_done.wait();
      const std::size_t before = counted_mutex_locks.load();
      // Frees of the owner's blocks (shard 0), while the owner keeps working on it.
      for (bool last = false; !last;) {
        last = owner_done.load();
        std::deque<item> taken;
        {
          std::lock_guard lock(queue.mutex);
          taken.swap(queue.blocks);
        }
        for (const item& it : taken) {
          if (!intact(it)) ++bad_patterns_other;
          a.deallocate(it.b);
          ++freed_by_other;
        }
        if (taken.empty()) std::this_thread::yield();
      }
      locks_after = counted_mutex_locks.load() - before;
    });
    owner.join();
    other.join();
    BOOST_TEST(locks_alone == 0u, "the owner took a mutex while it worked alone");
    BOOST_TEST(locks_after > shared_operations / 10, "after another thread came, the mutex was not taken");
    BOOST_TEST(freed_by_other > shared_operations / 10);
    BOOST_TEST(bad_patterns + bad_patterns_other == 0u, "blocks overlapped or were written by someone else");
    const alloy::statistics s = a.statistics();
    BOOST_TEST(s.num_allocs == allocations);
    BOOST_TEST(s.bytes_in_use == 0u);
    BOOST_TEST(s.num_ooms == 0u);
    BOOST_TEST(a.refused_frees() == 0u);
    a.release();
    BOOST_TEST(a.statistics().bytes_reserved == 0u);
  }
  check_ledger(*up.records());
}

// stats<sharded<...>> on one thread, against a model: every figure exact, peaks included.
BOOST_AUTO_TEST_CASE(stats_over_sharded_model) {
  checking_upstream up;
  using inner = dflt<checking_upstream>;
  using shards = alloy::sharded<inner>;
  alloy::stats<shards> a{shards{[&](std::size_t) { return inner{up}; }, {.shards = 3}}};
  std::mt19937_64 rng(7);
  std::vector<alloy::block> live;
  std::size_t in_use = 0, peak = 0, allocs = 0, largest = 0;
  for (int op = 0; op < 20'000; ++op) {
    if (live.empty() || rng() % 2 == 0) {
      const std::size_t bytes = draw_size(rng);
      const alloy::block b = a.allocate(bytes, 256);
      BOOST_REQUIRE(b);
      live.push_back(b);
      in_use += bytes;
      peak = std::max(peak, in_use);
      largest = std::max(largest, bytes);
      ++allocs;
    } else {
      const std::size_t v = rng() % live.size();
      a.deallocate(live[v]);
      in_use -= live[v].size;
      live[v] = live.back();
      live.pop_back();
    }
  }
  alloy::statistics s = a.statistics();
  BOOST_TEST(s.num_allocs == allocs);
  BOOST_TEST(s.bytes_in_use == in_use);
  BOOST_TEST(s.requested_bytes == in_use);
  BOOST_TEST(s.peak_bytes_in_use == peak);
  BOOST_TEST(s.largest_alloc_size == largest);
  BOOST_TEST(s.bytes_reserved == a.inner().reserved_bytes());
  for (const alloy::block& b : live) a.deallocate(b);
  a.inner().flush_thread_cache();
  a.release();
  s = a.statistics();
  BOOST_TEST(s.bytes_in_use == 0u);
  BOOST_TEST(s.bytes_reserved == 0u);
  BOOST_TEST(s.peak_bytes_reserved > 0u);
  BOOST_TEST(s.num_device_alloc == s.num_device_free);
}

// More threads than the table has entries: the later ones share shards by a hash of their id and
// have no cache; everything still works.
BOOST_AUTO_TEST_CASE(more_threads_than_table_entries) {
  locked_checking_upstream up;
  using inner = dflt<locked_checking_upstream>;
  using shards = alloy::sharded<inner>;
  {
    shards a{[&](std::size_t) { return inner{up}; }, {.shards = 2}};
    constexpr int n = static_cast<int>(shards::thread_slots) + 8;
    std::latch all_started(n);
    std::vector<std::size_t> bad(n, 0);
    {
      std::vector<std::jthread> threads;
      for (int t = 0; t < n; ++t) {
        threads.emplace_back([&, t] {
          all_started.arrive_and_wait();  // every thread alive at once: n distinct ids
          std::vector<item> mine;
          for (std::uint64_t i = 0; i < 50; ++i) {
            const alloy::block b = a.allocate(100 + i * 997 % 70'000, 256);
            if (!b) {
              ++bad[static_cast<std::size_t>(t)];
              continue;
            }
            mine.push_back({b, (static_cast<std::uint64_t>(t) << 32) + i});
            fill(mine.back());
          }
          for (const item& it : mine) {
            if (!intact(it)) ++bad[static_cast<std::size_t>(t)];
            a.deallocate(it.b);
          }
        });
      }
    }
    BOOST_TEST(std::count(bad.begin(), bad.end(), 0u) == n);
    a.flush_thread_caches();
    a.release();
    BOOST_TEST(a.reserved_bytes() == 0u);
    BOOST_TEST(a.refused_frees() == 0u);
  }
  check_ledger(*up.records());
}

// A free nobody owns is refused, counted, and changes nothing.
// A type walk does not see into `sharded`; it says its parts' max split size itself, so the
// statistics above it count oversize requests as they do without the shards.
BOOST_AUTO_TEST_CASE(stats_over_sharded_know_the_max_split_size) {
  using caching = alloy::caching_allocator<alloy::host_upstream>;
  const caching::options opts{.max_split_size = 1_MiB};
  alloy::stats<alloy::sharded<caching>> shards{
      alloy::sharded<caching>([&](std::size_t) { return caching{alloy::host_upstream{}, opts}; }, {.shards = 2})};
  alloy::stats<caching> alone{caching{alloy::host_upstream{}, opts}};
  BOOST_TEST(shards.inner().max_split_size() == 1_MiB);
  auto script = [](auto& a) {
    const alloy::block big = a.allocate(4_MiB, 256), small = a.allocate(100_KiB, 256);
    const alloy::block bigger = a.allocate(3_MiB, 256);
    a.deallocate(big);
    a.deallocate(small);
    return bigger;
  };
  const alloy::block x = script(shards), y = script(alone);
  const auto got = alloy::memory_stats(shards), expected = alloy::memory_stats(alone);
  BOOST_TEST(got.at("max_split_size") == static_cast<std::int64_t>(1_MiB));
  BOOST_TEST(got.at("oversize_allocations.allocated") == 2);
  BOOST_TEST(got.at("oversize_allocations.current") == 1);
  for (const char* key : {"max_split_size", "oversize_allocations.allocated", "oversize_allocations.current",
                          "oversize_allocations.peak", "oversize_allocations.freed"}) {
    BOOST_TEST(got.at(key) == expected.at(key), key);
  }
  shards.deallocate(x);
  alone.deallocate(y);
}

BOOST_AUTO_TEST_CASE(foreign_free_is_refused) {
  checking_upstream up;
  using inner = dflt<checking_upstream>;
  alloy::sharded<inner> a{[&](std::size_t) { return inner{up}; }, {.shards = 2, .thread_cache = 0}};
  alignas(256) static unsigned char elsewhere[1 << 20];
  const alloy::block kept = a.allocate(5000, 256);
  BOOST_REQUIRE(kept);
  a.deallocate(alloy::block{elsewhere, 300});
  a.deallocate(alloy::block{elsewhere, 500'000});
  BOOST_TEST(a.refused_frees() == 2u);
  a.deallocate(kept);
  a.release();
  BOOST_TEST(a.reserved_bytes() == 0u);
}

// ---- stream-ordered calls -------------------------------------------------------------------------

namespace {

using alloy::host_stream;
using ordered_arena = alloy::stream_ordered<alloy::best_fit_arena<locked_checking_upstream>, host_stream*>;
using ordered_shards = alloy::sharded<ordered_arena>;

/// Two shards of a stream-ordered 1 MiB arena each (thread caches on: stream calls go past them).
ordered_shards make_ordered_shards(const locked_checking_upstream& up) {
  return ordered_shards(
      [&](std::size_t) {
        return ordered_arena{
            alloy::best_fit_arena<locked_checking_upstream>{up, {.initial_size = 1_MiB, .maximum_size = 1_MiB}}};
      },
      {.shards = 2});
}

/// Runs `f` on a thread of its own and waits for it.
template <class F>
void on_new_thread(F f) {
  std::jthread t(f);
}

std::size_t shard_bytes_in_use(ordered_shards& a, std::size_t i) {
  return a.with_shard(i, [](ordered_arena& in) { return in.bytes_in_use(); });
}

}  // namespace

// A block allocated on stream A by one thread and freed on A by another goes back to the shard
// that handed it out, and its reuse on stream B from there waits, on B, for A's work on it.
BOOST_AUTO_TEST_CASE(stream_ordered_free_from_another_thread_reaches_the_owner_and_keeps_the_order) {
  using namespace std::chrono_literals;
  locked_checking_upstream up;
  {
    ordered_shards alloc = make_ordered_shards(up);
    host_stream a, b;
    const std::size_t mine = alloc.my_shard();
    alloc.deallocate(alloc.allocate(256, 256, &b), &b);  // two streams seen: events from here on
    const alloy::block x = alloc.allocate(200_KiB, 256, &a);
    BOOST_REQUIRE(x);
    BOOST_TEST(shard_bytes_in_use(alloc, mine) == 200_KiB);
    std::promise<void> gate;
    a.enqueue([g = gate.get_future().share()] { g.wait(); });
    a.enqueue([x] { std::memset(x.ptr, 0xA1, x.size); });
    std::size_t other = 0;
    on_new_thread([&] {
      other = alloc.my_shard();
      alloc.deallocate(x, &a);  // from the other shard's thread: to the owner
    });
    BOOST_TEST(other != mine);
    BOOST_TEST(shard_bytes_in_use(alloc, mine) == 0u);
    BOOST_TEST(shard_bytes_in_use(alloc, other) == 0u);
    BOOST_TEST(alloc.refused_frees() == 0u);
    const std::size_t waits =
        alloc.with_shard(mine, [](ordered_arena& in) { return in.order_counters().stream_waits; });

    const alloy::block y = alloc.allocate(200_KiB, 256, &b);  // returns while A's work waits
    BOOST_REQUIRE(y.ptr == x.ptr);
    BOOST_TEST(alloc.with_shard(mine, [](ordered_arena& in) { return in.order_counters().stream_waits; }) == waits + 1);
    std::atomic<bool> b_ran{false};
    bool saw_a_pattern = false;
    b.enqueue([&, y] {
      saw_a_pattern = std::all_of(static_cast<unsigned char*>(y.ptr), static_cast<unsigned char*>(y.ptr) + y.size,
                                  [](unsigned char c) { return c == 0xA1; });
      b_ran = true;
    });
    std::this_thread::sleep_for(20ms);
    BOOST_TEST(!b_ran.load(), "B's work ran before A's work on the same memory was done");
    gate.set_value();
    b.synchronize();
    BOOST_TEST(saw_a_pattern);

    alignas(256) static unsigned char elsewhere[4096];
    BOOST_TEST(!alloc.try_deallocate(alloy::block{elsewhere, 4096}, &b), "no shard owns it");
    BOOST_TEST(alloc.refused_frees() == 1u);
    BOOST_TEST(alloc.try_deallocate(y, &b));
    a.synchronize();
    b.synchronize();
  }
  BOOST_TEST(up.records()->live.empty());
  BOOST_TEST(up.records()->errors.empty());
}

// record_use reaches the shard that owns the block, whichever thread calls it; a block no shard
// owns is refused and counted by a shard, as stream_ordered itself refuses it, and stores nothing.
BOOST_AUTO_TEST_CASE(record_use_reaches_the_owner_and_a_foreign_block_is_refused) {
  locked_checking_upstream up;
  {
    ordered_shards alloc = make_ordered_shards(up);
    host_stream a, c;
    const std::size_t mine = alloc.my_shard();
    const alloy::block x = alloc.allocate(200_KiB, 256, &a);
    BOOST_REQUIRE(x);
    const auto misuses = [&] {
      std::size_t total = 0;
      for (std::size_t i = 0; i < 2; ++i)
        total += alloc.with_shard(i, [](ordered_arena& in) { return in.misuses().total(); });
      return total;
    };
    const auto recorded = [&](std::size_t i) {
      return alloc.with_shard(i, [](ordered_arena& in) { return in.order_counters().host_synchronizations; });
    };
    std::size_t other = 0;
    on_new_thread([&] {
      other = alloc.my_shard();
      alloy::record_use(alloc, x, &c);  // another thread names a use on a third stream
    });
    BOOST_TEST(other != mine);
    BOOST_TEST(recorded(mine) == 1u, "the owner left its single-stream path for the use");
    BOOST_TEST(recorded(other) == 0u);
    BOOST_TEST(misuses() == 0u);

    alignas(256) static unsigned char elsewhere[4096];
    alloy::record_use(alloc, alloy::block{elsewhere, 4096}, &c);
    BOOST_TEST(misuses() == 1u, "a block no shard owns is refused and counted");
    alloc.deallocate(x, &a);
    a.synchronize();
    c.synchronize();
    alloc.release();
    BOOST_TEST(shard_bytes_in_use(alloc, mine) == 0u);
  }
  BOOST_TEST(up.records()->live.empty());
  BOOST_TEST(up.records()->errors.empty());
}

// Two threads allocate on either of two streams (each block filled by its stream's work) and hand
// every block to the other thread, which enqueues a check of the fill on the block's stream and
// frees it there: a block reused on the other stream before that check ran would fail it.
BOOST_AUTO_TEST_CASE(stream_ordered_blocks_freed_by_the_other_thread_keep_their_content) {
  constexpr int operations = under_tsan ? 3000 : 20000;
  locked_checking_upstream up;
  {
    ordered_shards alloc = make_ordered_shards(up);
    host_stream streams[2];
    struct handed {
      alloy::block b;
      int stream;
      unsigned char pattern;
    };
    std::mutex queue_mutex;
    std::deque<handed> queues[2];
    std::atomic<std::size_t> mismatches{0}, failed{0};
    std::atomic<int> finished{0};
    std::latch start(2);
    // Each thread makes `operations` blocks; a request the full shards refuse waits for the other
    // thread's frees. A thread that made all of its blocks frees what it is handed until both did.
    auto worker = [&](int me) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(2026 + me));
      int made = 0;
      start.arrive_and_wait();
      for (;;) {
        handed h{};
        bool have = false;
        {
          std::lock_guard lock(queue_mutex);
          if (!queues[me].empty() && (made == operations || queues[me].size() > 24 || rng() % 2 == 0)) {
            h = queues[me].front();
            queues[me].pop_front();
            have = true;
          }
        }
        if (have) {
          streams[h.stream].enqueue([&mismatches, h] {
            const auto* p = static_cast<const unsigned char*>(h.b.ptr);
            if (!std::all_of(p, p + h.b.size, [&](unsigned char c) { return c == h.pattern; })) mismatches.fetch_add(1);
          });
          alloc.deallocate(h.b, &streams[h.stream]);
          continue;
        }
        if (made == operations) {
          if (finished.load() == 2) return;
          std::this_thread::yield();
          continue;
        }
        const int on = static_cast<int>(rng() % 2);
        const std::size_t bytes = 256 + rng() % (40 * 1024);
        const alloy::block b = alloc.allocate(bytes, 256, &streams[on]);
        if (!b) {  // the shards are full: the other thread frees
          failed.fetch_add(1);
          std::this_thread::yield();
          continue;
        }
        const auto pattern = static_cast<unsigned char>(1 + (made * 2 + me) % 251);
        streams[on].enqueue([b, pattern] { std::memset(b.ptr, pattern, b.size); });
        {
          std::lock_guard lock(queue_mutex);
          queues[1 - me].push_back({b, on, pattern});
        }
        if (++made == operations) finished.fetch_add(1);
      }
    };
    { std::jthread t0(worker, 0), t1(worker, 1); }
    for (auto& q : queues) {
      for (const handed& h : q) alloc.deallocate(h.b, &streams[h.stream]);
    }
    for (auto& s : streams) s.synchronize();
    BOOST_TEST(mismatches.load() == 0u);
    BOOST_TEST_MESSAGE("requests refused while the shards were full: " << failed.load());
    BOOST_TEST(alloc.refused_frees() == 0u);
    std::size_t waits = 0;
    for (std::size_t i = 0; i < alloc.shard_count(); ++i) {
      BOOST_TEST(shard_bytes_in_use(alloc, i) == 0u);
      waits += alloc.with_shard(i, [](ordered_arena& in) { return in.order_counters().stream_waits; });
    }
    BOOST_TEST(waits > 10u, "blocks should have been reused across the streams");
  }
  BOOST_TEST(up.records()->live.empty());
  BOOST_TEST(up.records()->errors.empty());
}

// ---- movable handles -------------------------------------------------------------------------------

namespace {

/// A reclaimer whose device is a 256 KiB `limited` arena: handles spill to the host and come back.
using spilling =
    alloy::host_spill_reclaimer<alloy::limited<alloy::best_fit_arena<locked_checking_upstream>>, alloy::host_upstream>;

spilling make_spilling(const locked_checking_upstream& up) {
  using arena = alloy::best_fit_arena<locked_checking_upstream>;
  return spilling{
      alloy::limited<arena>{arena{up, {.initial_size = 1_MiB, .maximum_size = 1_MiB}}, {.bytes_limit = 256_KiB}},
      alloy::host_upstream{}};
}

}  // namespace

// Three threads make movable blocks on their shards (more than the shards' devices hold, so
// blocks spill), fill them, and hand them round: each thread locks, checks, unlocks and frees
// blocks another thread made. A handle names its shard; contents survive the spills; the shards'
// counters add up to exact totals.
BOOST_AUTO_TEST_CASE(movable_handles_reach_their_shard_from_any_thread) {
  constexpr int threads = 3, per_thread = under_tsan ? 60 : 200;
  locked_checking_upstream up;
  {
    alloy::sharded<spilling> alloc([&](std::size_t) { return make_spilling(up); }, {.shards = threads});
    std::mutex made_mutex;
    std::vector<std::vector<alloy::handle>> made(threads);
    std::atomic<std::size_t> wrong_shard{0}, bad_content{0}, refused{0};
    std::latch all_made(threads);
    auto worker = [&](int me) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(77 + me));
      const std::size_t shard = alloc.my_shard();
      std::vector<alloy::handle> mine;
      for (int i = 0; i < per_thread; ++i) {
        const alloy::handle h = alloc.allocate_movable(1024 + rng() % (12 * 1024));
        if (!h) {
          refused.fetch_add(1);
          continue;
        }
        if (h.id % threads != shard) wrong_shard.fetch_add(1);
        void* p = alloc.lock(h);
        if (p == nullptr) {
          bad_content.fetch_add(1);
          continue;
        }
        alloy::testing::fill_pattern({p, alloc.size_of(h)}, h.id);
        alloc.unlock(h);
        mine.push_back(h);
      }
      {
        std::lock_guard lock(made_mutex);
        made[static_cast<std::size_t>(me)] = std::move(mine);
      }
      all_made.arrive_and_wait();
      // The next thread's blocks, checked and freed from here.
      const std::vector<alloy::handle>& theirs = made[static_cast<std::size_t>((me + 1) % threads)];
      for (const alloy::handle h : theirs) {
        void* p = alloc.lock(h);
        if (p == nullptr || !alloy::testing::has_pattern({p, alloc.size_of(h)}, h.id)) bad_content.fetch_add(1);
        if (p != nullptr) alloc.unlock(h);
        alloc.deallocate(h);
        if (alloc.is_live(h)) bad_content.fetch_add(1);
      }
    };
    {
      std::vector<std::jthread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
    }
    BOOST_TEST(refused.load() == 0u);
    BOOST_TEST(wrong_shard.load() == 0u, "a handle did not name the shard of the thread that made it");
    BOOST_TEST(bad_content.load() == 0u);
    const alloy::movable_counters c = alloc.movable_statistics();
    BOOST_TEST(c.num_spills > 0u, "the devices should have been too small to hold every block");
    BOOST_TEST(c.num_restores > 0u);
    BOOST_TEST(c.bytes_active == 0u);
    BOOST_TEST(c.bytes_inactive == 0u);
    BOOST_TEST(c.bytes_spilled == 0u);
    std::size_t spills = 0;
    for (std::size_t i = 0; i < alloc.shard_count(); ++i) {
      spills += alloc.with_shard(i, [](spilling& in) {
        BOOST_TEST(in.movable_count() == 0u);
        return in.movable_statistics().num_spills;
      });
    }
    BOOST_TEST(spills == c.num_spills);
    BOOST_TEST(!alloc.is_live(alloy::handle{}));
    BOOST_CHECK_THROW(alloc.lock(alloy::handle{}), alloy::logic_error);  // as the shard says
  }
  BOOST_TEST(up.records()->live.empty());
  BOOST_TEST(up.records()->errors.empty());
}

// ---- one physical pool -----------------------------------------------------------------------------

namespace {

/// Shards call the one backend from their threads at once: through `synchronized_vmm`.
using shared_backend = alloy::synchronized_vmm<alloy::host_vmm>;
static_assert(alloy::virtual_memory<shared_backend>);
using shared_arena = alloy::virtual_arena<alloy::vmm_ref<shared_backend>>;

}  // namespace

/// Four threads at once, each allocating and freeing its own blocks through `Sharded` (four
/// shards over one `synchronized_vmm` of `capacity`): contents stay intact, the backend never
/// holds more than its capacity, and everything goes back at the end. Failures are expected
/// (the threads compete for the capacity) and counted, not asserted on, inside the threads.
template <class Sharded>
void hammer_one_physical_pool(Sharded& a, shared_backend& backend, std::size_t capacity) {
  constexpr int threads = 4, ops = 4'000;
  std::atomic<int> corrupt{0}, over_capacity{0}, served{0}, failed{0};
  {
    std::vector<std::jthread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::mt19937_64 rng(0x5eed + static_cast<std::uint64_t>(t));
        std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(512.0 * 1024));
        std::vector<item> live;
        std::uint64_t next_id = static_cast<std::uint64_t>(t) << 40;
        for (int i = 0; i < ops; ++i) {
          if (live.empty() || rng() % 5 < 3) {  // more allocations than frees: the capacity runs out
            const auto bytes = static_cast<std::size_t>(std::exp(log_size(rng)));
            const alloy::block b = a.allocate(bytes, 256);
            if (!b) {
              ++failed;
              continue;
            }
            ++served;
            live.push_back({b, next_id++});
            fill(live.back());
          } else {
            const std::size_t k = rng() % live.size();
            if (!intact(live[k])) ++corrupt;
            a.deallocate(live[k].b);
            live[k] = live.back();
            live.pop_back();
          }
          if (backend.physical_bytes() > capacity) ++over_capacity;
        }
        for (const item& it : live) {
          if (!intact(it)) ++corrupt;
          a.deallocate(it.b);
        }
      });
    }
  }
  BOOST_TEST_MESSAGE("one physical pool: " << served.load() << " served, " << failed.load() << " failed");
  BOOST_TEST(corrupt.load() == 0);
  BOOST_TEST(over_capacity.load() == 0);
  BOOST_TEST(served.load() > threads * ops / 4, "served " << served.load() << ", failed " << failed.load());
  a.release();
  BOOST_TEST(a.refused_frees() == 0u);
  BOOST_TEST(a.reserved_bytes() == 0u);
  BOOST_TEST(backend.physical_bytes() == 0u);
}

// Threads call one backend at once through their shards (`synchronized_vmm`; TSan checks it).
BOOST_AUTO_TEST_CASE(shards_map_from_their_threads_at_once) {
  constexpr std::size_t capacity = 24_MiB;
  {
    shared_backend backend{alloy::host_vmm{{.capacity = capacity, .granularity = 64_KiB}}};
    alloy::sharded<shared_arena> a{[&](std::size_t) { return shared_arena{alloy::vmm_ref<shared_backend>{backend}}; },
                                   {.shards = 4, .thread_cache = 0}};
    hammer_one_physical_pool(a, backend, capacity);
  }
  {
    using shared_allocator = alloy::virtual_allocator<alloy::vmm_ref<shared_backend>>;
    shared_backend backend{alloy::host_vmm{{.capacity = capacity, .granularity = 64_KiB}}};
    alloy::sharded<shared_allocator> a{
        [&](std::size_t) { return shared_allocator{alloy::vmm_ref<shared_backend>{backend}}; }, {.shards = 4}};
    hammer_one_physical_pool(a, backend, capacity);
  }
}

// Two shards over one 64 MiB backend: memory one shard's thread has freed serves the other's.
BOOST_AUTO_TEST_CASE(shards_share_one_physical_pool) {
  for (const std::size_t threshold : {std::size_t{0}, std::size_t{32} << 20}) {
    BOOST_TEST_CONTEXT("release_threshold " << threshold) {
      shared_backend backend{alloy::host_vmm{{.capacity = 64_MiB}}};
      alloy::sharded<shared_arena> a{[&](std::size_t) {
                                       return shared_arena{alloy::vmm_ref<shared_backend>{backend},
                                                           {.release_threshold = threshold, .keep_up_to_peak = false}};
                                     },
                                     {.shards = 2, .thread_cache = 0}};
      auto take = [&](std::size_t pieces, std::vector<item>& out, std::uint64_t first_id) {
        for (std::size_t i = 0; i < pieces; ++i) {
          const alloy::block b = a.allocate(8_MiB, 256);
          if (!b) return false;
          out.push_back({b, first_id + i});
          fill(out.back());
        }
        return true;
      };
      std::vector<item> first, second;
      std::size_t first_shard = 9, second_shard = 9;
      // The first thread to call gets shard 0; it takes 48 MiB, frees them, and stays alive
      // (parked) so that the second thread cannot get its id, and with it its shard.
      std::latch first_done(1), second_done(1);
      std::jthread first_thread([&] {
        first_shard = a.my_shard();
        BOOST_TEST(take(6, first, 100));
        for (const item& it : first) BOOST_TEST(intact(it));
        for (const item& it : first) a.deallocate(it.b);
        first.clear();
        first_done.count_down();
        second_done.wait();
      });
      first_done.wait();
      BOOST_TEST(backend.physical_bytes() == std::min<std::size_t>(threshold, 48_MiB));
      on_new_thread([&] {  // the second: shard 1; its 48 MiB fit, from its shard or the other's
        second_shard = a.my_shard();
        BOOST_TEST(take(6, second, 200));
      });
      second_done.count_down();
      first_thread.join();
      BOOST_TEST(first_shard == 0u);
      BOOST_TEST(second_shard == 1u);
      BOOST_TEST(backend.physical_bytes() <= 64_MiB);
      // With 48 MiB live, 24 MiB more cannot fit in 64 MiB, whichever shard is asked.
      on_new_thread([&] {
        std::vector<item> more;
        BOOST_TEST(!take(3, more, 300));
        BOOST_TEST(more.size() == 2u);
        for (const item& it : more) a.deallocate(it.b);
      });
      for (const item& it : second) BOOST_TEST(intact(it));
      for (const item& it : second) a.deallocate(it.b);
      a.release();
      BOOST_TEST(backend.physical_bytes() == 0u);
      BOOST_TEST(a.reserved_bytes() == 0u);
      BOOST_TEST(a.refused_frees() == 0u);
    }
  }
}
