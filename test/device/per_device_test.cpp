// SPDX-License-Identifier: Apache-2.0
// per_device over simulated devices. Each device's composition sits on an upstream (or a
// virtual-memory backend) that checks, at every call, that its device is the calling thread's
// current one, and counts the calls that were not. Directed cases: the registry (on, current,
// try_on, bad devices refused), the factory called with its device current, allocations from
// the current device's composition, a free with another device current reaching the owner
// (found by owns, or by the map of live blocks when the composition has no owns), exact
// statistics per device (statistics_of, memory_stats, memory_summary, snapshot), release() on
// every device, checked frees, stream-ordered calls over host streams, virtual_allocator over
// host_vmm. Randomized: 4 threads, each switching its current device at random, allocating,
// filling every block with a pattern, and freeing its own blocks and other threads' (with any
// device current); patterns checked at every free, owners checked by device_of, statistics
// exact per device at the end, no call on a wrong device.
#include <boost/test/unit_test.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <alloy/device.hpp>
#include <alloy/error.hpp>
#include <alloy/host_stream.hpp>
#include <alloy/literals.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/per_device.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/stream_ordered.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/policy/tracked.hpp>
#include <alloy/showcase.hpp>
#include <alloy/simulated_devices.hpp>
#include <alloy/snapshot.hpp>
#include <alloy/upstream/host_upstream.hpp>
#include <alloy/vmm/host_vmm.hpp>

#include "support/sanitizers.hpp"

using namespace alloy::literals;

namespace {

using sim = alloy::simulated_devices;

/// What the parts of one device saw: calls, and calls made while another device was current.
struct device_log {
  std::atomic<std::size_t> calls{0};
  std::atomic<std::size_t> wrong_device{0};
  std::atomic<std::size_t> allocations{0};
  std::atomic<std::size_t> frees{0};

  void check(int device) noexcept {
    calls.fetch_add(1, std::memory_order_relaxed);
    if (sim::current() != device) wrong_device.fetch_add(1, std::memory_order_relaxed);
  }
};

/// Host memory from a `host_upstream` labelled with `device`; every call checks first that the
/// device is already current (the label would make it so, and hide a caller that did not).
class device_checked_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  static constexpr bool thread_safe = true;

  device_checked_upstream(int device, std::shared_ptr<device_log> log)
      : inner_({.device = device}), device_(device), log_(std::move(log)) {}

  alloy::block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    log_->check(device_);
    const alloy::block b = inner_.allocate(bytes, alignment);
    if (b) log_->allocations.fetch_add(1, std::memory_order_relaxed);
    return b;
  }
  void deallocate(alloy::block b) noexcept {
    log_->check(device_);
    if (b) log_->frees.fetch_add(1, std::memory_order_relaxed);
    inner_.deallocate(b);
  }

 private:
  alloy::host_upstream inner_;
  int device_;
  std::shared_ptr<device_log> log_;
};

/// A `host_vmm` labelled with `device`, checking at every call that the device is current.
class device_checked_vmm {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;

  device_checked_vmm(int device, std::shared_ptr<device_log> log)
      : inner_({.granularity = 64_KiB, .device = device}), device_(device), log_(std::move(log)) {}

  std::size_t granularity() const noexcept { return inner_.granularity(); }
  std::size_t capacity() const noexcept { return inner_.capacity(); }
  std::size_t physical_bytes() const noexcept { return inner_.physical_bytes(); }
  alloy::address_range reserve(std::size_t bytes) noexcept {
    log_->check(device_);
    return inner_.reserve(bytes);
  }
  void unreserve(alloy::address_range range) noexcept {
    log_->check(device_);
    inner_.unreserve(range);
  }
  alloy::physical_memory create(std::size_t bytes) noexcept {
    log_->check(device_);
    const alloy::physical_memory piece = inner_.create(bytes);
    if (piece) log_->allocations.fetch_add(1, std::memory_order_relaxed);
    return piece;
  }
  void release(alloy::physical_memory piece) noexcept {
    log_->check(device_);
    if (piece) log_->frees.fetch_add(1, std::memory_order_relaxed);
    inner_.release(piece);
  }
  bool map(void* at, alloy::physical_memory piece) noexcept {
    log_->check(device_);
    return inner_.map(at, piece);
  }
  void unmap(void* at, std::size_t bytes) noexcept {
    log_->check(device_);
    inner_.unmap(at, bytes);
  }

 private:
  alloy::host_vmm inner_;
  int device_;
  std::shared_ptr<device_log> log_;
};

/// One log per simulated device.
struct logs {
  std::array<std::shared_ptr<device_log>, sim::count> of{};
  logs() {
    for (auto& l : of) l = std::make_shared<device_log>();
  }
  const std::shared_ptr<device_log>& operator[](int d) const { return of[static_cast<std::size_t>(d)]; }
  std::size_t wrong() const {
    std::size_t n = 0;
    for (const auto& l : of) n += l->wrong_device.load();
    return n;
  }
};

void fill(alloy::block b, std::uint8_t seed) {
  auto* p = static_cast<std::uint8_t*>(b.ptr);
  for (std::size_t i = 0; i < b.size; ++i) p[i] = static_cast<std::uint8_t>(seed + i * 31);
}
bool intact(alloy::block b, std::uint8_t seed) {
  const auto* p = static_cast<const std::uint8_t*>(b.ptr);
  for (std::size_t i = 0; i < b.size; ++i)
    if (p[i] != static_cast<std::uint8_t>(seed + i * 31)) return false;
  return true;
}

void start_on(int d) { BOOST_REQUIRE(sim::set(d) == 0); }

using checked_default = alloy::default_allocator<device_checked_upstream>;
using stats_default = alloy::stats<checked_default>;

}  // namespace

BOOST_AUTO_TEST_CASE(the_registry) {
  logs seen;
  std::vector<int> made_on;
  start_on(2);
  alloy::per_device<stats_default, sim> devices{{0, 1, 3}, [&](int d) {
                                                  made_on.push_back(sim::current());
                                                  return stats_default{checked_default{{d, seen[d]}}};
                                                }};
  BOOST_TEST(made_on == (std::vector<int>{0, 1, 3}), "each factory call runs with its device current");
  BOOST_TEST(sim::current() == 2, "and the caller's device is current again");
  BOOST_TEST(devices.devices() == (std::vector<int>{0, 1, 3}));
  BOOST_TEST(devices.size() == 3u);
  BOOST_TEST(devices.contains(3));
  BOOST_TEST(!devices.contains(2));
  BOOST_TEST(devices.try_on(2) == nullptr);
  BOOST_TEST(devices.try_on(-1) == nullptr);
  BOOST_TEST(devices.try_on(1) == &devices.on(1));
  BOOST_CHECK_THROW(devices.on(2), alloy::logic_error);
  BOOST_CHECK_THROW(devices.on(100), alloy::logic_error);
  BOOST_CHECK_THROW(devices.current(), alloy::logic_error);
  BOOST_TEST(!devices.allocate(64, 8), "the current device is not in the registry: an empty block");
  start_on(3);
  BOOST_TEST(&devices.current() == &devices.on(3));

  const auto make = [&](int d) { return stats_default{checked_default{{d, seen[d]}}}; };
  using registry = alloy::per_device<stats_default, sim>;
  BOOST_CHECK_THROW((registry{{0, 1, 0}, make}), alloy::logic_error);
  BOOST_CHECK_THROW((registry{{-1}, make}), alloy::logic_error);
  BOOST_CHECK_THROW((registry{{1, sim::count}, make}), alloy::logic_error);  // cannot be made current
  BOOST_TEST(sim::current() == 3);
  int built = 0;
  BOOST_CHECK_THROW((registry{{0, 1, 2},
                              [&](int d) {
                                if (d == 2) throw std::runtime_error("factory failed");
                                ++built;
                                return make(d);
                              }}),
                    std::runtime_error);
  BOOST_TEST(built == 2);
  BOOST_TEST(seen.wrong() == 0u);
}

BOOST_AUTO_TEST_CASE(frees_reach_the_owner_and_statistics_stay_per_device) {
  logs seen;
  {
    alloy::per_device<stats_default, sim> devices{{0, 1, 3},
                                                  [&](int d) { return stats_default{checked_default{{d, seen[d]}}}; }};
    static_assert(decltype(devices)::finds_owner_by_owns);
    static_assert(alloy::allocator<decltype(devices)>);
    static_assert(decltype(devices)::host_accessible && !decltype(devices)::device_accessible);

    start_on(1);
    std::vector<alloy::block> on_one;
    for (const std::size_t n : {100u, 5000u, 70000u, 3u << 20}) {
      on_one.push_back(devices.allocate(n, 64));
      BOOST_REQUIRE(static_cast<bool>(on_one.back()));
      fill(on_one.back(), 1);
    }
    start_on(3);
    const alloy::block on_three = devices.allocate(200, 16);
    BOOST_REQUIRE(static_cast<bool>(on_three));
    fill(on_three, 3);

    BOOST_TEST(devices.device_of(on_one[2]) == 1);
    BOOST_TEST(devices.device_of(on_three) == 3);
    BOOST_TEST(devices.device_of(alloy::block{}) == -1);
    int foreign = 0;
    BOOST_TEST(devices.device_of(alloy::block{&foreign, sizeof foreign}) == -1);
    BOOST_TEST(devices.owns(on_three));

    const std::size_t on_one_bytes = 100 + 5000 + 70000 + (3u << 20);
    BOOST_TEST(alloy::statistics_of(devices.on(1)).bytes_in_use == on_one_bytes);
    BOOST_TEST(alloy::statistics_of(devices.on(1)).num_allocs == 4u);
    BOOST_TEST(alloy::statistics_of(devices.on(3)).bytes_in_use == 200u);
    BOOST_TEST(alloy::statistics_of(devices.on(0)).num_allocs == 0u);
    auto one = alloy::memory_stats(devices.on(1));
    BOOST_TEST(one["allocated_bytes.all.current"] == static_cast<std::int64_t>(on_one_bytes));
    BOOST_TEST(one["allocation.all.current"] == 4);
    BOOST_TEST(alloy::memory_stats(devices.on(3))["allocated_bytes.all.current"] == 200);
    BOOST_TEST(alloy::memory_stats(devices.on(0))["reserved_bytes.all.current"] == 0);
    BOOST_TEST(alloy::memory_summary(devices.on(1)).find("Allocated memory") != std::string::npos);
    const alloy::memory_snapshot snap = alloy::snapshot(devices.on(1));
    std::size_t requested = 0;
    for (const auto& s : snap.segments)
      for (const auto& p : s.blocks)
        if (p.state == alloy::block_state::allocated) requested += p.requested;
    BOOST_TEST(requested == on_one_bytes, "the snapshot of device 1 shows device 1's blocks, all of them");
    BOOST_TEST(alloy::snapshot(devices.on(0)).segments.empty());

    // Device 3 is current; device 1's blocks go back to device 1's composition, on device 1.
    for (const alloy::block b : on_one) {
      BOOST_TEST(intact(b, 1));
      devices.deallocate(b);
    }
    BOOST_TEST(sim::current() == 3);
    BOOST_TEST(alloy::statistics_of(devices.on(1)).bytes_in_use == 0u);
    BOOST_TEST(alloy::statistics_of(devices.on(3)).bytes_in_use == 200u, "device 3 untouched");
    BOOST_TEST(devices.refused_frees() == 0u);
    devices.deallocate(alloy::block{&foreign, sizeof foreign});
    BOOST_TEST(devices.refused_frees() == 1u, "a block no device owns is refused");

    // release() gives each device's cached segments back, on that device.
    const std::size_t freed_before = seen[1]->frees.load();
    devices.release();
    BOOST_TEST(seen[1]->frees.load() > freed_before);
    BOOST_TEST(seen[1]->allocations.load() == seen[1]->frees.load(), "device 1 holds nothing");
    BOOST_TEST(intact(on_three, 3));
    start_on(0);
    devices.deallocate(on_three);
    BOOST_TEST(alloy::statistics_of(devices.on(3)).bytes_in_use == 0u);
  }
  for (int d : {0, 1, 3})
    BOOST_TEST(seen[d]->allocations.load() == seen[d]->frees.load(), "device " << d << " gave all back");
  BOOST_TEST(seen[1]->calls.load() > 0u);
  BOOST_TEST(seen[3]->calls.load() > 0u);
  BOOST_TEST(seen.wrong() == 0u, "every upstream call ran on its device");
}

BOOST_AUTO_TEST_CASE(without_owns_the_registry_remembers_the_owner) {
  using bare = alloy::stats<device_checked_upstream>;
  logs seen;
  alloy::per_device<bare, sim> devices{{0, 2, 5}, [&](int d) { return bare{device_checked_upstream{d, seen[d]}}; }};
  static_assert(!decltype(devices)::finds_owner_by_owns);
  std::vector<std::pair<alloy::block, int>> live;
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    const int d = std::array{0, 2, 5}[rng() % 3];
    start_on(d);
    const alloy::block b = devices.allocate(1 + rng() % 3000, 8);
    BOOST_REQUIRE(static_cast<bool>(b));
    fill(b, static_cast<std::uint8_t>(d));
    live.emplace_back(b, d);
  }
  start_on(5);
  const alloy::block zero = devices.allocate(0, 8);
  BOOST_TEST(static_cast<bool>(zero), "zero bytes: a unique block, as the upstream gives it");
  BOOST_TEST(devices.device_of(zero) == 5);
  start_on(2);
  devices.deallocate(zero);
  std::size_t frees_seen = 0;
  for (const auto& [b, d] : live) {
    BOOST_TEST(devices.device_of(b) == d);
    start_on(static_cast<int>(rng() % sim::count));  // any device current, registered or not
    BOOST_TEST(intact(b, static_cast<std::uint8_t>(d)));
    devices.deallocate(b);
    ++frees_seen;
    BOOST_TEST(devices.device_of(b) == -1, "forgotten once freed");
  }
  for (int d : {0, 2, 5}) {
    BOOST_TEST(alloy::statistics_of(devices.on(d)).bytes_in_use == 0u);
    BOOST_TEST(seen[d]->allocations.load() == seen[d]->frees.load());
  }
  BOOST_TEST(alloy::statistics_of(devices.on(0)).num_allocs + alloy::statistics_of(devices.on(2)).num_allocs +
                 alloy::statistics_of(devices.on(5)).num_allocs ==
             frees_seen + 1);
  BOOST_TEST(devices.refused_frees() == 0u);
  devices.deallocate(live.front().first);
  BOOST_TEST(devices.refused_frees() == 1u, "a double free is refused: the block is no longer live");
  BOOST_TEST(seen.wrong() == 0u);
}

BOOST_AUTO_TEST_CASE(without_owns_a_free_of_another_size_is_refused_and_the_block_stays_live) {
  // tracked<> over an upstream refuses such a free without saying so: the registry must not
  // forget the block, or its valid free would be refused and the block leaked.
  using bare = alloy::tracked<device_checked_upstream>;
  logs seen;
  alloy::per_device<bare, sim> devices{{0, 3}, [&](int d) { return bare{device_checked_upstream{d, seen[d]}}; }};
  static_assert(!decltype(devices)::finds_owner_by_owns);
  start_on(3);
  const alloy::block b = devices.allocate(1000, 8);
  BOOST_REQUIRE(static_cast<bool>(b));
  start_on(0);
  devices.deallocate(alloy::block{b.ptr, 999});
  devices.deallocate(alloy::block{b.ptr, 0});
  BOOST_TEST(devices.refused_frees() == 2u);
  BOOST_TEST(devices.device_of(b) == 3, "still live");
  BOOST_TEST(devices.on(3).outstanding_count() == 1u);
  devices.deallocate(b);
  BOOST_TEST(devices.refused_frees() == 2u);
  BOOST_TEST(devices.device_of(b) == -1);
  BOOST_TEST(devices.on(3).outstanding_count() == 0u);
  BOOST_TEST(seen[3]->allocations.load() == seen[3]->frees.load());
  BOOST_TEST(seen.wrong() == 0u);
}

BOOST_AUTO_TEST_CASE(checked_frees_pass_through) {
  using arena = alloy::best_fit_arena<device_checked_upstream>;
  logs seen;
  alloy::per_device<arena, sim> devices{{1, 4}, [&](int d) { return arena{device_checked_upstream{d, seen[d]}}; }};
  static_assert(alloy::checked_deallocating_allocator<decltype(devices)>);
  start_on(4);
  const alloy::block b = devices.allocate(1000, 256);
  BOOST_REQUIRE(static_cast<bool>(b));
  start_on(1);
  static_assert(alloy::free_screening_allocator<decltype(devices)>);
  BOOST_TEST((devices.free_misuse(b) == alloy::misuse::none));
  BOOST_TEST((devices.free_misuse({b.ptr, b.size + 1}) == alloy::misuse::wrong_size), "asked of the owner");
  BOOST_TEST((devices.free_misuse({static_cast<char*>(b.ptr) + 256, 8}) == alloy::misuse::foreign_pointer));
  int on_stack = 0;
  BOOST_TEST((devices.free_misuse({&on_stack, sizeof on_stack}) == alloy::misuse::foreign_pointer), "no owner");
  BOOST_TEST(!devices.try_deallocate(alloy::block{b.ptr, b.size + 1}), "a wrong size is refused by the owner");
  BOOST_TEST(devices.device_of(b) == 4, "still live");
  BOOST_TEST(devices.try_deallocate(b));
  BOOST_TEST((devices.free_misuse(b) != alloy::misuse::none), "freed: no owner holds it live");
  BOOST_TEST(!devices.try_deallocate(b), "a double free is refused");
  BOOST_TEST(seen.wrong() == 0u);
}

namespace {
/// An arena that checks its frees and answers `free_misuse`, but has no `owns`: per_device finds
/// the owner in its map of live blocks.
struct screening_without_owns {
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  alloy::best_fit_arena<device_checked_upstream> arena;
  alloy::block allocate(std::size_t bytes, std::size_t alignment) noexcept { return arena.allocate(bytes, alignment); }
  void deallocate(alloy::block b) noexcept { arena.deallocate(b); }
  bool try_deallocate(alloy::block b) noexcept { return arena.try_deallocate(b); }
  alloy::misuse free_misuse(alloy::block b) const noexcept { return arena.free_misuse(b); }
};
}  // namespace

BOOST_AUTO_TEST_CASE(free_misuse_without_owns_asks_the_map_then_the_owner) {
  logs seen;
  alloy::per_device<screening_without_owns, sim> devices{
      {0, 2}, [&](int d) {
        return screening_without_owns{
            alloy::best_fit_arena<device_checked_upstream>{device_checked_upstream{d, seen[d]}}};
      }};
  static_assert(!decltype(devices)::finds_owner_by_owns);
  static_assert(alloy::free_screening_allocator<decltype(devices)>);
  start_on(2);
  const alloy::block b = devices.allocate(1000, 256);
  BOOST_REQUIRE(static_cast<bool>(b));
  start_on(0);
  BOOST_TEST((devices.free_misuse(b) == alloy::misuse::none));
  BOOST_TEST((devices.free_misuse({b.ptr, 999}) == alloy::misuse::wrong_size), "the map keeps the size");
  BOOST_TEST((devices.free_misuse({static_cast<char*>(b.ptr) + 256, 8}) == alloy::misuse::foreign_pointer));
  BOOST_TEST(devices.try_deallocate(b));
  BOOST_TEST((devices.free_misuse(b) == alloy::misuse::foreign_pointer), "freed: not in the map");
  BOOST_TEST(devices.refused_frees() == 0u, "free_misuse refuses nothing");
  BOOST_TEST(seen.wrong() == 0u);
}

BOOST_AUTO_TEST_CASE(stream_ordered_calls_go_by_current_device_and_owner) {
  using ordered = alloy::stream_ordered<stats_default, alloy::host_stream*>;
  logs seen;
  alloy::host_stream s0, s1;
  alloy::per_device<ordered, sim> devices{{0, 1},
                                          [&](int d) { return ordered{stats_default{checked_default{{d, seen[d]}}}}; }};
  start_on(1);
  const alloy::block b = devices.allocate(4096, 256, &s1);
  BOOST_REQUIRE(static_cast<bool>(b));
  fill(b, 9);
  BOOST_TEST(devices.device_of(b) == 1);
  start_on(0);
  devices.deallocate(b, &s0);  // device 0 current, another stream: device 1's part orders it
  s0.synchronize();
  s1.synchronize();
  BOOST_TEST(alloy::statistics_of(devices.on(1)).bytes_in_use == 0u);
  BOOST_TEST(alloy::statistics_of(devices.on(1)).num_allocs == 1u);
  BOOST_TEST(alloy::statistics_of(devices.on(0)).num_allocs == 0u);
  BOOST_TEST(seen.wrong() == 0u);
}

BOOST_AUTO_TEST_CASE(virtual_allocators_map_on_their_device) {
  using vm = alloy::virtual_allocator<device_checked_vmm>;
  logs seen;
  {
    alloy::per_device<vm, sim> devices{{2, 6}, [&](int d) { return vm{device_checked_vmm{d, seen[d]}}; }};
    std::vector<std::pair<alloy::block, int>> live;
    for (int round = 0; round < 40; ++round) {
      const int d = round % 2 == 0 ? 2 : 6;
      start_on(d);
      const std::size_t n = round % 5 == 0 ? std::size_t{3} << 20 : 100 + 997 * static_cast<std::size_t>(round);
      const alloy::block b = devices.allocate(n, 256);
      BOOST_REQUIRE(static_cast<bool>(b));
      fill(b, static_cast<std::uint8_t>(round));
      live.emplace_back(b, round);
    }
    BOOST_TEST(seen[2]->allocations.load() > 0u, "device 2's backend created memory");
    BOOST_TEST(seen[6]->allocations.load() > 0u);
    start_on(0);  // not in the registry
    for (const auto& [b, round] : live) {
      BOOST_TEST(devices.device_of(b) == (round % 2 == 0 ? 2 : 6));
      BOOST_TEST(intact(b, static_cast<std::uint8_t>(round)));
      devices.deallocate(b);
    }
    devices.release();
  }
  BOOST_TEST(seen[2]->allocations.load() == seen[2]->frees.load());
  BOOST_TEST(seen[6]->allocations.load() == seen[6]->frees.load());
  BOOST_TEST(seen.wrong() == 0u, "every backend call ran on its device");
}

namespace {

/// The randomized run: `threads` threads over `devices` (whose parts are thread safe), each
/// switching its current device at random (an unregistered one now and then), allocating and
/// filling, freeing its own blocks and other threads' from any device. Returns the allocations
/// served by each device.
template <class Registry>
std::array<std::size_t, sim::count> run_threads(Registry& devices, const std::vector<int>& ids,
                                                std::size_t operations) {
  struct live_block {
    alloy::block b;
    int device;
    std::uint8_t seed;
  };
  constexpr int threads = 4;
  std::mutex handover_lock;
  std::deque<live_block> handover;
  std::array<std::atomic<std::size_t>, sim::count> served{};
  std::atomic<std::size_t> errors{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + static_cast<unsigned>(t));
      std::vector<live_block> mine;
      const auto free_one = [&](live_block x) {
        (void)sim::set(static_cast<int>(rng() % sim::count));
        if (devices.device_of(x.b) != x.device) errors.fetch_add(1);
        if (!intact(x.b, x.seed)) errors.fetch_add(1);
        devices.deallocate(x.b);
      };
      for (std::size_t i = 0; i < operations / threads; ++i) {
        const unsigned op = static_cast<unsigned>(rng() % 10);
        if (op < 5 || mine.empty()) {
          const int d = rng() % 16 == 0 ? 7 : ids[rng() % ids.size()];
          (void)sim::set(d);
          const std::size_t n = rng() % 8 == 0 ? 1 + rng() % (256u << 10) : 1 + rng() % 2048;
          const std::size_t alignment = std::size_t{8} << (rng() % 6);
          const alloy::block b = devices.allocate(n, alignment);
          if (d == 7) {
            if (b) errors.fetch_add(1);  // not in the registry: nothing served
            continue;
          }
          if (!b || b.size != n || reinterpret_cast<std::uintptr_t>(b.ptr) % alignment != 0) {
            errors.fetch_add(1);
            continue;
          }
          served[static_cast<std::size_t>(d)].fetch_add(1);
          const auto seed = static_cast<std::uint8_t>(rng());
          fill(b, seed);
          if (rng() % 4 == 0) {
            const std::lock_guard lock(handover_lock);
            handover.push_back({b, d, seed});
          } else {
            mine.push_back({b, d, seed});
          }
        } else if (op < 7) {
          std::vector<live_block> taken;
          {
            const std::lock_guard lock(handover_lock);
            for (int k = 0; k < 2 && !handover.empty(); ++k) {
              taken.push_back(handover.front());
              handover.pop_front();
            }
          }
          for (const auto& x : taken) free_one(x);
        } else {
          const std::size_t k = rng() % mine.size();
          std::swap(mine[k], mine.back());
          free_one(mine.back());
          mine.pop_back();
        }
      }
      for (const auto& x : mine) free_one(x);
    });
  }
  for (auto& th : pool) th.join();
  for (const auto& x : handover) {
    if (!intact(x.b, x.seed)) errors.fetch_add(1);
    devices.deallocate(x.b);
  }
  BOOST_TEST(errors.load() == 0u, "patterns intact, owners right, nothing served off the registry");
  std::array<std::size_t, sim::count> out{};
  for (std::size_t d = 0; d < out.size(); ++d) out[d] = served[d].load();
  return out;
}

constexpr std::size_t random_operations = alloy::testing::under_tsan ? 20'000 : 200'000;

}  // namespace

BOOST_AUTO_TEST_CASE(threads_switching_devices_found_by_owns) {
  using part = alloy::synchronized<stats_default>;
  logs seen;
  const std::vector<int> ids{0, 1, 2, 3};
  std::array<std::size_t, sim::count> served{};
  {
    alloy::per_device<part, sim> devices{ids,
                                         [&](int d) { return part{stats_default{checked_default{{d, seen[d]}}}}; }};
    served = run_threads(devices, ids, random_operations);
    for (const int d : ids) {
      const alloy::statistics s = alloy::statistics_of(devices.on(d));
      BOOST_TEST(s.num_allocs == served[static_cast<std::size_t>(d)], "device " << d << ": every allocation counted");
      BOOST_TEST(s.bytes_in_use == 0u);
      BOOST_TEST(served[static_cast<std::size_t>(d)] > 0u);
    }
    BOOST_TEST(devices.refused_frees() == 0u);
  }
  for (const int d : ids) BOOST_TEST(seen[d]->allocations.load() == seen[d]->frees.load());
  BOOST_TEST(seen.wrong() == 0u, "every upstream call ran on its device");
}

BOOST_AUTO_TEST_CASE(threads_switching_devices_found_by_the_map) {
  using part = alloy::synchronized<alloy::stats<device_checked_upstream>>;
  logs seen;
  const std::vector<int> ids{1, 4, 6};
  std::array<std::size_t, sim::count> served{};
  {
    alloy::per_device<part, sim> devices{
        ids, [&](int d) { return part{alloy::stats<device_checked_upstream>{device_checked_upstream{d, seen[d]}}}; }};
    static_assert(!decltype(devices)::finds_owner_by_owns);
    served = run_threads(devices, ids, random_operations);
    for (const int d : ids) {
      const alloy::statistics s = alloy::statistics_of(devices.on(d));
      BOOST_TEST(s.num_allocs == served[static_cast<std::size_t>(d)]);
      BOOST_TEST(s.bytes_in_use == 0u);
      BOOST_TEST(seen[d]->allocations.load() == served[static_cast<std::size_t>(d)]);
    }
    BOOST_TEST(devices.refused_frees() == 0u);
  }
  for (const int d : ids) BOOST_TEST(seen[d]->allocations.load() == seen[d]->frees.load());
  BOOST_TEST(seen.wrong() == 0u);
}
