// SPDX-License-Identifier: Apache-2.0
// stream_ordered: conformance, the stream contract checked with host streams that really run work
// late (gated tasks, a randomized 4-stream model test with content checks), record_use, the
// single-stream fast path, the upstream-failure path, and 1/2/4-stream replays of PyTorch traces.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include <alloy/host_stream.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/segregator.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/stream_ordered.hpp>
#include <alloy/policy/synchronized.hpp>

#include "replay/simulated_device.hpp"
#include "replay/trace_reader.hpp"
#include "support/conformance.hpp"
#include "support/sanitizers.hpp"

using namespace alloy::literals;
using namespace std::chrono_literals;
using alloy::block;
using alloy::host_stream;
using alloy::testing::checking_upstream;

namespace {

using alloy::testing::under_tsan;

template <class U>
using arena_over = alloy::best_fit_arena<U>;
template <class U>
using ordered_arena = alloy::stream_ordered<arena_over<U>, host_stream*>;

/// A gate a host-stream task waits on, so the test decides when "device work" finishes.
struct gate {
  std::promise<void> opened;
  std::shared_future<void> signal = opened.get_future().share();
  void open() { opened.set_value(); }
  auto waiter() const {
    return [s = signal] { s.wait(); };
  }
};

bool all_bytes(const void* p, std::size_t n, unsigned char value) {
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (bytes[i] != value) return false;
  return true;
}

/// An upstream that counts segments given back before a stream's writer finished.
struct watched_upstream {
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  checking_upstream under{};
  std::shared_ptr<std::atomic<bool>> writer_done;
  std::shared_ptr<int> early_returns = std::make_shared<int>(0);
  block allocate(std::size_t n, std::size_t a) noexcept { return under.allocate(n, a); }
  void deallocate(block b) noexcept {
    if (!writer_done->load()) ++*early_returns;
    under.deallocate(b);
  }
};

}  // namespace

namespace recipes {

struct ordered_arena_recipe {
  template <class U>
  using type = alloy::stream_ordered<alloy::best_fit_arena<U>, host_stream*>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{alloy::best_fit_arena<U>{up}};
  }
};

struct ordered_heap_recipe {
  template <class U>
  using heap = alloy::segregator<1_MiB, alloy::size_class_pool<U>, alloy::best_fit_arena<U>>;
  template <class U>
  using type = alloy::stream_ordered<heap<U>, host_stream*>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{heap<U>{alloy::size_class_pool<U>{up}, alloy::best_fit_arena<U>{up}}};
  }
};

}  // namespace recipes

BOOST_AUTO_TEST_SUITE(stream_ordered_policy)

using all_recipes = std::tuple<recipes::ordered_arena_recipe, recipes::ordered_heap_recipe>;
BOOST_AUTO_TEST_CASE_TEMPLATE(conformance, Recipe, all_recipes) {
  if constexpr (under_tsan) {
    BOOST_TEST_MESSAGE("skipped under ThreadSanitizer: single-threaded, and run in the other builds");
    return;
  }
  alloy::testing::conformance_suite<Recipe>();
}

BOOST_AUTO_TEST_CASE(capabilities) {
  using A = ordered_arena<checking_upstream>;
  static_assert(alloy::stream_ordered_allocator<A, host_stream*>);
  static_assert(alloy::use_recording_allocator<A, host_stream*>);
  static_assert(alloy::releasing_allocator<A> && alloy::reserving_allocator<A> && alloy::owning_allocator<A>);
  static_assert(alloy::introspectable_allocator<A> && alloy::counting_allocator<A>);
  static_assert(A::host_accessible && !A::device_accessible);
  // Composites pass the stream calls and record_use on.
  using S = alloy::synchronized<alloy::stats<A>>;
  static_assert(alloy::stream_ordered_allocator<S, host_stream*>);
  static_assert(alloy::use_recording_allocator<S, host_stream*>);
  // The policy needs an inner part that can promise not to release while allocating.
  static_assert(alloy::cache_keeping_allocator<arena_over<checking_upstream>>);
  static_assert(alloy::cache_keeping_allocator<alloy::size_class_pool<checking_upstream>>);
  static_assert(!alloy::cache_keeping_allocator<checking_upstream>);
  static_assert(alloy::stream<host_stream*>);

  // Through both composites, a use on a second stream reaches the policy: it leaves the
  // single-stream path, waiting once for the first stream.
  host_stream a, b;
  S shared{alloy::stats<A>{A{arena_over<checking_upstream>{checking_upstream{}}}}};
  const block x = shared.allocate(4096, 256, &a);
  alloy::record_use(shared, x, &b);
  const auto& policy = shared.inner().inner();
  BOOST_TEST(policy.order_counters().host_synchronizations == 1u);
  shared.deallocate(x, &a);
  BOOST_TEST(policy.order_counters().events_recorded == 2u, "one event on the freeing stream, one on the user");
}

// The core promise: memory freed on A and handed to B is used by B only after A's work on it is
// done, and the host does not wait for that.
BOOST_AUTO_TEST_CASE(reuse_on_another_stream_waits_on_the_device_side) {
  host_stream a, b;
  checking_upstream up;
  {
    ordered_arena<checking_upstream> alloc{
        arena_over<checking_upstream>{up, {.initial_size = 1_MiB, .maximum_size = 1_MiB}}};
    const block warm = alloc.allocate(256, 256, &b);  // two streams from here on
    alloc.deallocate(warm, &b);

    const block x = alloc.allocate(64_KiB, 256, &a);
    gate done_writing;
    a.enqueue(done_writing.waiter());
    a.enqueue([x] { std::memset(x.ptr, 0xA1, x.size); });
    alloc.deallocate(x, &a);  // enqueued, not finished: legal

    const auto before = alloc.order_counters();
    const block y = alloc.allocate(64_KiB, 256, &b);  // returns while A is still gated
    BOOST_REQUIRE(y.ptr == x.ptr);
    std::atomic<bool> b_ran{false};
    bool saw_a_pattern = false;
    b.enqueue([&, y] {
      saw_a_pattern = all_bytes(y.ptr, y.size, 0xA1);
      b_ran = true;
    });
    std::this_thread::sleep_for(20ms);
    BOOST_TEST(!b_ran.load(), "B's work ran before A's work on the same memory was done");
    BOOST_TEST(alloc.order_counters().stream_waits == before.stream_waits + 1);
    BOOST_TEST(alloc.order_counters().host_synchronizations == before.host_synchronizations);
    done_writing.open();
    b.synchronize();
    BOOST_TEST(saw_a_pattern);
    alloc.deallocate(y, &b);
    BOOST_TEST(alloc.pending_ranges() >= 1u);
  }
  BOOST_TEST(up.records()->live.empty());
  BOOST_TEST(up.records()->errors.empty());
}

BOOST_AUTO_TEST_CASE(reuse_on_the_same_stream_needs_no_wait) {
  host_stream a, b;
  ordered_arena<checking_upstream> alloc{arena_over<checking_upstream>{checking_upstream{}, {.initial_size = 1_MiB}}};
  alloc.deallocate(alloc.allocate(256, 256, &b), &b);  // tracking on
  gate g;
  a.enqueue(g.waiter());
  const block x = alloc.allocate(4096, 256, &a);
  alloc.deallocate(x, &a);
  const auto before = alloc.order_counters();
  const block y = alloc.allocate(4096, 256, &a);
  BOOST_TEST(y.ptr == x.ptr);
  BOOST_TEST(alloc.order_counters().stream_waits == before.stream_waits);
  BOOST_TEST(alloc.order_counters().host_synchronizations == before.host_synchronizations);
  g.open();
  alloc.deallocate(y, &a);
}

// A block used on C as well as on A: its reuse on B waits for C's use, and so does the reuse on
// A after B hands it back (A never touched it, but C did).
BOOST_AUTO_TEST_CASE(record_use_holds_reuse_until_every_stream_is_done) {
  host_stream a, b, c;
  ordered_arena<checking_upstream> alloc{
      arena_over<checking_upstream>{checking_upstream{}, {.initial_size = 1_MiB, .maximum_size = 1_MiB}}};
  const block x = alloc.allocate(32_KiB, 256, &a);
  alloy::record_use(alloc, x, &c);
  gate c_done;
  c.enqueue(c_done.waiter());
  c.enqueue([x] { std::memset(x.ptr, 0xC3, x.size); });
  alloc.deallocate(x, &a);

  std::atomic<bool> b_ran{false}, a_ran{false};
  bool b_saw_c = false, a_saw_c = false;
  const std::size_t syncs = alloc.order_counters().host_synchronizations;  // C's arrival: one
  const block on_b = alloc.allocate(32_KiB, 256, &b);
  BOOST_REQUIRE(on_b.ptr == x.ptr);
  b.enqueue([&, on_b] {
    b_saw_c = all_bytes(on_b.ptr, on_b.size, 0xC3);
    b_ran = true;
  });
  alloc.deallocate(on_b, &b);
  const block on_a = alloc.allocate(32_KiB, 256, &a);
  BOOST_REQUIRE(on_a.ptr == x.ptr);
  a.enqueue([&, on_a] {
    a_saw_c = all_bytes(on_a.ptr, on_a.size, 0xC3);
    a_ran = true;
  });
  std::this_thread::sleep_for(20ms);
  BOOST_TEST(!b_ran.load(), "B reused the block while C was still using it");
  BOOST_TEST(!a_ran.load(), "A reused the block while C (through B) was still using it");
  BOOST_TEST(alloc.order_counters().host_synchronizations == syncs);
  c_done.open();
  a.synchronize();
  b.synchronize();
  BOOST_TEST(b_saw_c);
  BOOST_TEST(a_saw_c);
  alloc.deallocate(on_a, &a);
}

// record_use of a block the arena does not hold is refused and counted: stored, the use would
// outlive the call (nothing frees that address) and make a block later placed there wait on it.
BOOST_AUTO_TEST_CASE(record_use_refuses_a_foreign_block) {
  host_stream a, c;
  ordered_arena<checking_upstream> alloc{
      arena_over<checking_upstream>{checking_upstream{}, {.initial_size = 1_MiB, .maximum_size = 1_MiB}}};
  std::vector<std::byte> elsewhere(4096);
  alloy::record_use(alloc, block{elsewhere.data(), elsewhere.size()}, &c);
  BOOST_TEST(alloc.misuses().foreign_pointers == 1u);
  alloy::record_use(alloc, block{}, &c);  // a null block names no memory: nothing to refuse
  BOOST_TEST(alloc.misuses().total() == 1u);
  const block x = alloc.allocate(4_KiB, 256, &a);
  alloy::record_use(alloc, x, &c);  // its own block is taken as before
  BOOST_TEST(alloc.misuses().total() == 1u);
  alloc.deallocate(x, &a);
  c.synchronize();
  alloc.release();
  BOOST_TEST(alloc.inner().reserved_bytes() == 0u);
}

// While one stream is used, nothing is recorded; the second stream costs one host wait.
BOOST_AUTO_TEST_CASE(single_stream_fast_path) {
  host_stream a, b;
  ordered_arena<checking_upstream> alloc{arena_over<checking_upstream>{checking_upstream{}}};
  std::vector<block> blocks;
  for (std::size_t round = 0; round < 100; ++round) {
    blocks.push_back(alloc.allocate(1000 + 64 * round, 256, &a));
    if (round % 3 == 0) {
      alloc.deallocate(blocks.front(), &a);
      blocks.erase(blocks.begin());
    }
  }
  BOOST_TEST(alloc.order_counters().events_recorded == 0u);
  BOOST_TEST(alloc.order_counters().host_synchronizations == 0u);
  BOOST_TEST(alloc.pending_ranges() == 0u);
  const block other = alloc.allocate(512, 256, &b);
  BOOST_TEST(alloc.order_counters().host_synchronizations == 1u);
  alloc.deallocate(other, &b);
  BOOST_TEST(alloc.order_counters().events_recorded == 1u);
  for (const block blk : blocks) alloc.deallocate(blk, &a);
  BOOST_TEST(alloc.order_counters().events_recorded == 1u + blocks.size());
}

// When the inner arena must give memory back to grow, the host first waits for the stream work
// on that memory: no segment reaches the upstream while a stream still writes to it.
BOOST_AUTO_TEST_CASE(upstream_failure_waits_before_memory_goes_back) {
  auto writer_done = std::make_shared<std::atomic<bool>>(false);
  watched_upstream up{.writer_done = writer_done};
  host_stream a, b;
  using arena_t = arena_over<watched_upstream>;
  alloy::stream_ordered<arena_t, host_stream*> alloc{
      arena_t{up, {.maximum_size = 1_MiB, .growth = alloy::best_fit_growth::fixed, .growth_size = 512_KiB}}};
  alloc.deallocate(alloc.allocate(256, 256, &b), &b);  // tracking on
  const block x = alloc.allocate(400_KiB, 256, &a);    // fills the first 512 KiB segment
  gate g;
  a.enqueue(g.waiter());
  a.enqueue([x, writer_done] {
    std::memset(x.ptr, 0x5A, x.size);
    writer_done->store(true);
  });
  alloc.deallocate(x, &a);
  std::thread opener([&] {
    std::this_thread::sleep_for(30ms);
    g.open();
  });
  const auto syncs = alloc.order_counters().host_synchronizations;
  const block big = alloc.allocate(1_MiB, 256, &b);  // only fits once the free segment is gone
  opener.join();
  BOOST_TEST(static_cast<bool>(big));
  BOOST_TEST(*up.early_returns == 0);
  BOOST_TEST(alloc.order_counters().host_synchronizations == syncs + 1);
  BOOST_TEST(alloc.inner().counters().num_ooms == 0u, "the no-release attempt is not an OOM");
  alloc.deallocate(big, &b);
}

// PyTorch's num_sync_all_streams, from a stream_ordered part under stats<>: the host waits for
// every stream only on release() and on the slow path, and memory_stats counts exactly those.
BOOST_AUTO_TEST_CASE(memory_stats_counts_waits_for_all_streams) {
  using arena_t = arena_over<checking_upstream>;
  using A = alloy::stats<alloy::stream_ordered<arena_t, host_stream*>>;
  host_stream a, b;
  A alloc{alloy::stream_ordered<arena_t, host_stream*>{arena_t{
      checking_upstream{}, {.maximum_size = 1_MiB, .growth = alloy::best_fit_growth::fixed, .growth_size = 512_KiB}}}};
  const auto syncs = [&] { return alloy::memory_stats(alloc).at("num_sync_all_streams"); };
  const auto& policy = alloc.inner();
  BOOST_TEST(syncs() == 0);
  alloc.deallocate(alloc.allocate(4096, 256, &a), &a);
  alloc.release();  // one stream: waits for it
  BOOST_TEST(syncs() == 1);
  const block x = alloc.allocate(4096, 256, &b);  // a second stream: one host wait, not for all
  alloc.deallocate(x, &b);
  BOOST_TEST(syncs() == 1);
  BOOST_TEST(policy.order_counters().host_synchronizations == 2u);
  const block big = alloc.allocate(400_KiB, 256, &a);  // fits the cached segment: no wait
  BOOST_TEST(syncs() == 1);
  const block bigger = alloc.allocate(500_KiB, 256, &a);  // the cache is in use: a new segment
  BOOST_TEST(static_cast<bool>(bigger));
  BOOST_TEST(syncs() == 1);
  alloc.deallocate(big, &a);
  alloc.deallocate(bigger, &a);
  const block whole = alloc.allocate(1_MiB, 256, &b);  // only after both segments go back
  BOOST_TEST(static_cast<bool>(whole));
  BOOST_TEST(syncs() == 2);
  alloc.deallocate(whole, &b);
  alloc.release();
  BOOST_TEST(syncs() == 3);
  BOOST_TEST(policy.order_counters().all_stream_synchronizations == 3u);
}

// Thousands of random rounds over 4 streams. Every allocation's work checks that the memory holds
// what its previous owners' work left (a shadow kept by the host at enqueue time), then writes its
// own pattern slowly; readers on other streams (record_use) check it too. Wrong ordering shows up
// as a content mismatch; the same workload without ordering is run as a control.
template <bool Ordered, class Alloc>
std::size_t random_stream_rounds(Alloc& alloc, std::uintptr_t base, std::size_t capacity, int rounds) {
  constexpr std::size_t streams = 4;
  std::vector<std::unique_ptr<host_stream>> s;
  for (std::size_t i = 0; i < streams; ++i) s.push_back(std::make_unique<host_stream>());
  std::vector<std::int16_t> shadow(capacity, -1);  // expected byte, -1 unknown
  std::atomic<std::size_t> mismatches{0};
  struct live_block {
    block b;
    std::size_t owner;
  };
  std::vector<live_block> live;
  std::mt19937_64 rng(2026);
  auto expected_of = [&](block b) {
    const std::size_t off = reinterpret_cast<std::uintptr_t>(b.ptr) - base;
    return std::vector<std::int16_t>(shadow.data() + off, shadow.data() + off + b.size);
  };
  auto checker = [&mismatches](block b, std::vector<std::int16_t> expected) {
    return [&mismatches, b, expected = std::move(expected)] {
      const auto* bytes = static_cast<const unsigned char*>(b.ptr);
      for (std::size_t i = 0; i < b.size; ++i) {
        if (expected[i] >= 0 && bytes[i] != static_cast<unsigned char>(expected[i])) {
          mismatches.fetch_add(1);
          return;
        }
      }
    };
  };
  for (int round = 0; round < rounds; ++round) {
    const std::size_t on = rng() % streams;
    const bool allocate = live.size() < 8 || (live.size() < 48 && rng() % 2 == 0);
    if (allocate) {
      const std::size_t bytes = 256 + rng() % (24 * 1024);
      block b;
      if constexpr (Ordered) {
        b = alloc.allocate(bytes, 256, s[on].get());
      } else {
        b = alloc.allocate(bytes, 256);
      }
      if (!b) continue;
      const auto pattern = static_cast<unsigned char>(1 + round % 251);
      s[on]->enqueue(checker(b, expected_of(b)));
      s[on]->enqueue([b, pattern] {
        auto* memory = static_cast<unsigned char*>(b.ptr);
        for (std::size_t i = 0; i < b.size; i += 4096) {
          std::memset(memory + i, pattern, std::min<std::size_t>(4096, b.size - i));
          std::this_thread::yield();
        }
      });
      const std::size_t off = reinterpret_cast<std::uintptr_t>(b.ptr) - base;
      std::fill(shadow.data() + off, shadow.data() + off + b.size, pattern);
      live.push_back({b, on});
    } else {
      const std::size_t pick = rng() % live.size();
      const live_block victim = live[pick];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
      if (rng() % 4 == 0) {  // another stream reads it before the free
        const std::size_t reader = (victim.owner + 1 + rng() % (streams - 1)) % streams;
        if constexpr (Ordered) alloy::record_use(alloc, victim.b, s[reader].get());
        alloy::host_event written;
        alloy::stream_traits<host_stream*>::record(written, s[victim.owner].get());
        alloy::stream_traits<host_stream*>::wait(s[reader].get(), written);
        s[reader]->enqueue(checker(victim.b, expected_of(victim.b)));
      }
      if constexpr (Ordered) {
        alloc.deallocate(victim.b, s[victim.owner].get());
      } else {
        alloc.deallocate(victim.b);  // the control: freed with no ordering at all
      }
    }
  }
  for (auto& stream : s) stream->synchronize();
  for (const live_block& l : live) alloc.deallocate(l.b);
  return mismatches.load();
}

BOOST_AUTO_TEST_CASE(randomized_four_streams_keep_content_right) {
  checking_upstream up;
  {
    constexpr std::size_t capacity = 1_MiB;
    ordered_arena<checking_upstream> alloc{
        arena_over<checking_upstream>{up, {.initial_size = capacity, .maximum_size = capacity}}};
    std::uintptr_t base = 0;
    alloc.for_each_block([&](const alloy::block_info& info) { base = reinterpret_cast<std::uintptr_t>(info.segment); });
    BOOST_REQUIRE(base != 0);
    const std::size_t mismatches = random_stream_rounds<true>(alloc, base, capacity, 4000);
    BOOST_TEST(mismatches == 0u);
    BOOST_TEST(alloc.order_counters().stream_waits + alloc.order_counters().host_synchronizations > 100u,
               "the workload should have reused memory across streams");
    BOOST_TEST(alloc.inner().check_invariants());
  }
  BOOST_TEST(up.records()->live.empty());
  BOOST_TEST(up.records()->errors.empty());
}

// The control: the same workload freeing with no ordering corrupts content, so the test above
// can fail. (Not under ThreadSanitizer: the control's races are real and TSan would report them.)
BOOST_AUTO_TEST_CASE(randomized_control_without_ordering_is_caught) {
  if constexpr (under_tsan) {
    BOOST_TEST_MESSAGE("skipped under ThreadSanitizer: the control races on purpose");
    return;
  }
  constexpr std::size_t capacity = 1_MiB;
  arena_over<checking_upstream> alloc{checking_upstream{}, {.initial_size = capacity, .maximum_size = capacity}};
  std::uintptr_t base = 0;
  alloc.for_each_block([&](const alloy::block_info& info) { base = reinterpret_cast<std::uintptr_t>(info.segment); });
  BOOST_TEST(random_stream_rounds<false>(alloc, base, capacity, 4000) > 0u);
}

// Two- and four-stream versions of the shipped PyTorch traces (allocation i on stream i mod N,
// freed on its stream) over a simulated 80 GiB device: every request the one-stream replay served
// is served, and frees coalesce whatever the stream, so peak reserved stays that of one stream.
BOOST_AUTO_TEST_CASE(pytorch_traces_on_two_and_four_streams) {
  const std::filesystem::path dir = std::filesystem::path(ALLOY_TRACE_DIR) / "pytorch";
  if (!std::filesystem::is_directory(dir)) {
    BOOST_TEST_MESSAGE("skipped: no traces at " << dir.string());
    return;
  }
  using alloy::replay::device_upstream;
  using alloy::replay::simulated_device;
  std::size_t traces = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".gz") continue;
    const alloy::bench::rmm_trace trace = alloy::bench::read_trace(entry.path().string());
    std::size_t peak_single = 0;
    std::vector<bool> served_single;
    for (std::size_t streams : {1u, 2u, 4u}) {
      simulated_device device(80_GiB);
      std::vector<std::unique_ptr<host_stream>> s;
      for (std::size_t i = 0; i < streams; ++i) s.push_back(std::make_unique<host_stream>());
      alloy::stream_ordered<arena_over<device_upstream>, host_stream*> alloc{
          arena_over<device_upstream>{device_upstream{device}}};
      std::vector<block> blocks(trace.allocations);
      std::vector<bool> served(trace.allocations, false);
      for (const auto& e : trace.events) {
        if (e.action == alloy::bench::trace_action::allocate) {
          blocks[e.allocation] = alloc.allocate(e.size, 256, s[e.allocation % streams].get());
          served[e.allocation] = static_cast<bool>(blocks[e.allocation]);
        } else if (e.action == alloy::bench::trace_action::free && blocks[e.allocation]) {
          alloc.deallocate(blocks[e.allocation], s[e.allocation % streams].get());
          blocks[e.allocation] = {};
        }
      }
      for (const block b : blocks)
        if (b) alloc.deallocate(b, s[0].get());
      if (streams == 1) {
        peak_single = device.peak_reserved();
        served_single = served;
        continue;
      }
      std::size_t lost = 0;
      for (std::size_t i = 0; i < served.size(); ++i) lost += served_single[i] && !served[i];
      BOOST_TEST(lost == 0u, trace.name << " on " << streams << " streams");
      BOOST_TEST_MESSAGE(trace.name << ": " << streams << " streams: peak reserved / one stream = "
                                    << static_cast<double>(device.peak_reserved()) / static_cast<double>(peak_single));
      BOOST_TEST(device.peak_reserved() == peak_single, trace.name << " on " << streams << " streams");
    }
    ++traces;
  }
  BOOST_TEST(traces > 0u);
}

BOOST_AUTO_TEST_SUITE_END()
