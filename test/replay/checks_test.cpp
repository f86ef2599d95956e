// SPDX-License-Identifier: Apache-2.0
// alloy-replay's checks of what compositions return, its simulated device with
// virtual memory, and the --min-capacity search.
#include <boost/test/unit_test.hpp>

#include <alloy/literals.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "replay/compositions.hpp"
#include "replay/min_capacity.hpp"
#include "replay/replay.hpp"
#include "replay/simulated_vm.hpp"
#include "replay/trace_reader.hpp"

namespace {

using namespace alloy::literals;
using alloy::replay::simulated_device;
using alloy::replay::simulated_vm_device;

/// A target that answers the n-th request (counting from 0) wrongly in the way given, the others
/// from the device as they should be.
enum class wrong { none, misaligned, outside, overlapping, inside_too_small };
class lying_target {
 public:
  using token = alloy::block;
  lying_target(simulated_device& d, std::size_t liar, wrong how) : device_(&d), liar_(liar), how_(how) {}
  token allocate(std::size_t bytes) noexcept {
    const std::size_t n = count_++;
    void* p = device_->allocate(bytes, 256);
    if (p == nullptr) return {};
    if (n == 0) first_ = p;
    if (n != liar_) return {p, bytes};
    switch (how_) {
      case wrong::none: return {p, bytes};
      case wrong::misaligned: return {static_cast<char*>(p) + 16, bytes};
      case wrong::outside: return {reinterpret_cast<void*>(std::uintptr_t{0x1000}), bytes};
      case wrong::overlapping: return {first_, bytes};  // inside the live first block
      case wrong::inside_too_small: {                   // a real block, but only half the size asked
        device_->deallocate(p, bytes);
        void* q = device_->allocate(bytes / 2, 256);
        return {q, bytes};
      }
    }
    return {};
  }
  void deallocate(token, std::size_t) noexcept {}  // the device's blocks are forgotten at reset
  static const void* address(const token& b) noexcept { return b.ptr; }
  std::size_t bytes_moved() const noexcept { return 0; }

 private:
  simulated_device* device_;
  std::size_t liar_;
  wrong how_;
  std::size_t count_ = 0;
  void* first_ = nullptr;
};

const alloy::bench::rmm_trace& three_blocks() {
  static const auto trace = alloy::bench::parse_rmm_trace(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0,allocate,0x1000,1000000,0\n"
      "1,0,allocate,0x2000,4096,0\n"
      "1,0,allocate,0x3000,8192,0\n"
      "1,0,free,0x2000,4096,0\n"
      "1,0,free,0x1000,1000000,0\n"
      "1,0,free,0x3000,8192,0\n",
      "three");
  return trace;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(replay_checks)

BOOST_AUTO_TEST_CASE(every_kind_of_wrong_answer_is_a_fault_not_a_served_request) {
  const struct {
    wrong how;
    std::size_t liar;
    const char* says;
  } cases[] = {{wrong::misaligned, 1, "misaligned"},
               {wrong::outside, 2, "not inside memory the device handed out"},
               {wrong::overlapping, 1, "overlaps a live block"},
               {wrong::inside_too_small, 2, "not inside memory the device handed out"}};
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.says) {
      simulated_device device;
      const auto r = alloy::replay::replay(
          three_blocks(), device, [&] { return lying_target{device, c.liar, c.how}; }, {.repetitions = 1}, "liar");
      BOOST_TEST(r.faults == 1u);
      BOOST_TEST(r.served == 2u);
      BOOST_TEST(r.failed == 0u);
      BOOST_TEST(!r.served_all());
      BOOST_TEST(r.first_fault.find(c.says) != std::string::npos, r.first_fault);
      BOOST_TEST(r.first_fault.find("event " + std::to_string(c.liar + 1) + ":") == 0u, r.first_fault);
      BOOST_TEST(r.ns_per_op_runs.size() == 1u);  // the timed run is not checked
    }
  }
  simulated_device device;
  const auto honest = alloy::replay::replay(
      three_blocks(), device, [&] { return lying_target{device, 0, wrong::none}; }, {.repetitions = 0}, "honest");
  BOOST_TEST(honest.faults == 0u);
  BOOST_TEST(honest.served == 3u);
  BOOST_TEST(honest.served_all());
  BOOST_TEST(honest.ns_per_op_runs.empty());
}

BOOST_AUTO_TEST_CASE(device_refuses_a_foreign_free_while_checking) {
  simulated_device device;
  device.set_checking(true);
  void* p = device.allocate(1000, 256);
  BOOST_TEST(device.holds(p, 1000));
  BOOST_TEST(!device.holds(static_cast<char*>(p) + 1, 1000));
  int x = 0;
  device.deallocate(&x, 4);
  device.deallocate(p, 999);  // the wrong size
  BOOST_TEST(device.faults() == 2u);
  BOOST_TEST(device.reserved() == 1000u);
  device.deallocate(p, 1000);
  BOOST_TEST(device.reserved() == 0u);
  device.deallocate(p, 1000);  // twice
  BOOST_TEST(device.faults() == 3u);
  BOOST_TEST(device.first_fault().find("never handed out") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(vm_device_keeps_the_books_of_a_driver) {
  simulated_vm_device vm(6_MiB);
  auto backend = simulated_vm_device::backend{vm};
  BOOST_TEST(backend.granularity() == 2_MiB);
  const alloy::address_range a = backend.reserve(64_MiB);
  BOOST_TEST_REQUIRE(static_cast<bool>(a));
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(a.ptr) % 2_MiB == 0u);
  const alloy::address_range b = backend.reserve(8_MiB);  // right after: an arena grows in place
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(b.ptr) == reinterpret_cast<std::uintptr_t>(a.ptr) + 64_MiB);
  BOOST_TEST(!backend.reserve(3_MiB));  // not a multiple of the granularity

  const alloy::physical_memory p1 = backend.create(2_MiB), p2 = backend.create(4_MiB);
  BOOST_TEST_REQUIRE((p1 && p2));
  BOOST_TEST(!backend.create(2_MiB));  // 8 MiB > 6 MiB
  BOOST_TEST(vm.refusals() == 1u);
  BOOST_TEST(backend.physical_bytes() == 6_MiB);
  char* base = static_cast<char*>(a.ptr);
  BOOST_TEST(backend.map(base + 2_MiB, p2));
  BOOST_TEST(backend.map(base, p1));
  BOOST_TEST(vm.holds(base, 6_MiB));  // two maps side by side
  BOOST_TEST(vm.holds(base + 5_MiB, 1_MiB));
  BOOST_TEST(!vm.holds(base + 5_MiB, 1_MiB + 1));
  BOOST_TEST(!vm.holds(base - 1, 2));
  BOOST_TEST(vm.faults() == 0u);

  // What a driver refuses: each refused, recorded, nothing changed.
  BOOST_TEST(!backend.map(base + 8_MiB, p1));      // mapped already
  backend.unmap(base, 6_MiB);                      // not one map
  backend.release(p1);                             // still mapped
  backend.unreserve(a);                            // something mapped in it
  const alloy::physical_memory p3 = vm.create(0);  // not a multiple
  BOOST_TEST(!p3);
  BOOST_TEST(vm.faults() == 5u);
  BOOST_TEST(vm.first_fault() == "map of a piece that is mapped already");
  BOOST_TEST(vm.mapped() == 6_MiB);

  backend.unmap(base, 2_MiB);
  backend.unmap(base + 2_MiB, 4_MiB);
  backend.release(p1);
  backend.release(p2);
  backend.unreserve(b);
  backend.unreserve(a);
  BOOST_TEST(vm.faults() == 5u);
  BOOST_TEST(vm.maps() == 2u);
  BOOST_TEST(vm.unmaps() == 2u);
  BOOST_TEST(vm.map_calls() == 4u);
  BOOST_TEST(vm.allocations() == 2u);
  BOOST_TEST(vm.deallocations() == 2u);
  BOOST_TEST(vm.peak_reserved() == 6_MiB);
  BOOST_TEST(vm.reserved() == 0u);
  BOOST_TEST(backend.reserve(72_MiB).ptr == a.ptr);  // every address free again, merged
  vm.reset();
  BOOST_TEST(vm.map_calls() == 0u);
  BOOST_TEST(vm.faults() == 0u);
}

BOOST_AUTO_TEST_CASE(vm_device_refuses_a_stale_piece_whose_slot_was_reused) {
  simulated_vm_device vm(4_MiB);
  auto backend = simulated_vm_device::backend{vm};
  const alloy::address_range a = backend.reserve(8_MiB);
  BOOST_TEST_REQUIRE(static_cast<bool>(a));
  char* base = static_cast<char*>(a.ptr);
  const alloy::physical_memory old = backend.create(2_MiB);
  BOOST_TEST_REQUIRE(static_cast<bool>(old));
  backend.release(old);
  const alloy::physical_memory fresh = backend.create(2_MiB);  // the released piece's books, reused
  BOOST_TEST_REQUIRE(static_cast<bool>(fresh));
  BOOST_TEST(fresh.id != old.id);
  BOOST_TEST(!backend.map(base, old));  // the old id names nothing now
  backend.release(old);
  BOOST_TEST(vm.faults() == 2u);
  BOOST_TEST(vm.first_fault() == "map of a piece that does not exist");
  BOOST_TEST(vm.physical_bytes() == 2_MiB);  // the fresh piece is untouched
  BOOST_TEST(backend.map(base + 2_MiB, fresh));
  BOOST_TEST(!vm.holds(base, 2_MiB));
  BOOST_TEST(vm.holds(base + 2_MiB, 2_MiB));
  backend.unmap(base + 2_MiB, 2_MiB);
  backend.release(fresh);
  backend.unreserve(a);
  BOOST_TEST(vm.faults() == 2u);
  BOOST_TEST(vm.reserved() == 0u);

  vm.reset();  // every piece gone, the books kept: ids from before stay unknown
  const alloy::address_range again = backend.reserve(8_MiB);
  const alloy::physical_memory after_reset = backend.create(2_MiB);
  BOOST_TEST_REQUIRE((again && after_reset));
  BOOST_TEST((after_reset.id != old.id && after_reset.id != fresh.id));
  BOOST_TEST(!backend.map(again.ptr, fresh));
  BOOST_TEST(vm.faults() == 1u);
  BOOST_TEST(backend.map(again.ptr, after_reset));
  backend.unmap(again.ptr, 2_MiB);
  backend.release(after_reset);
  backend.unreserve(again);
  BOOST_TEST(vm.faults() == 1u);
}

BOOST_AUTO_TEST_CASE(min_capacity_finds_the_threshold_to_half_a_percent) {
  const auto& trace = three_blocks();  // peak live 1,012,288 bytes
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    const std::size_t need = trace.peak_live_bytes + rng() % (std::size_t{1} << (10 + i % 30));
    std::size_t calls = 0;
    const auto m = alloy::replay::find_min_capacity(trace, [&](std::size_t capacity) {
      ++calls;
      alloy::replay::replay_result r;
      r.failed_allocations = capacity >= need ? 0 : 1;
      return r;
    });
    BOOST_TEST_REQUIRE(m.found);
    BOOST_TEST(m.capacity >= need);
    BOOST_TEST(static_cast<double>(m.capacity) <= static_cast<double>(need) / 0.995 + 1);
    BOOST_TEST(m.non_monotone_at == 0u);
    BOOST_TEST(m.replays == calls);
    BOOST_TEST(m.over_live == static_cast<double>(m.capacity) / static_cast<double>(trace.peak_live_bytes));
  }
  // A composition that fails between two capacities that pass is caught by the probes.
  const std::size_t need = 2 * trace.peak_live_bytes;
  const auto m = alloy::replay::find_min_capacity(trace, [&](std::size_t capacity) {
    alloy::replay::replay_result r;
    const bool hole = capacity > need + need / 70 && capacity < need + need / 25;  // fails 1.015x .. 1.04x
    r.failed_allocations = capacity >= need && !hole ? 0 : 1;
    return r;
  });
  BOOST_TEST(m.found);
  BOOST_TEST(m.non_monotone_at != 0u);
  // Nothing up to the limit: not found.
  const auto none = alloy::replay::find_min_capacity(trace, [](std::size_t) {
    alloy::replay::replay_result r;
    r.faults = 1;
    return r;
  });
  BOOST_TEST(!none.found);
}

BOOST_AUTO_TEST_CASE(the_first_failed_allocation_is_reported_with_what_was_held_then) {
  const auto trace = alloy::bench::parse_rmm_trace(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0,allocate,0x1000,3000000,0\n"
      "1,0,allocate,0x2000,5000000,0\n"
      "1,0,allocate,0x3000,2000000,0\n"  // 10 MB: fails on a 9 MB device
      "1,0,free,0x1000,3000000,0\n"
      "1,0,allocate,0x4000,1500000,0\n"
      "1,0,allocate,0x5000,4000000,0\n"  // fails too: only the first is reported
      "1,0,free,0x2000,5000000,0\n",
      "two failures");
  // Each request straight from the device: what fails is what the device cannot hold.
  using device_target = alloy::replay::raw_target<alloy::replay::device_upstream>;
  simulated_device device(9'000'000);
  const auto r = alloy::replay::replay(
      trace, device, [&] { return device_target{alloy::replay::device_upstream{device}, 256}; }, {.repetitions = 0},
      "device");
  BOOST_TEST(r.failed == 2u);
  BOOST_TEST(r.first_failed.event == 3u);  // 1-based, as `first_fault` counts
  BOOST_TEST(r.first_failed.bytes == 2'000'000u);
  BOOST_TEST(r.first_failed.in_use == 8'000'000u);
  BOOST_TEST(r.first_failed.reserved == 8'000'000u);
  // Served everything: none reported.
  simulated_device roomy;
  const auto all = alloy::replay::replay(
      trace, roomy, [&] { return device_target{alloy::replay::device_upstream{roomy}, 256}; }, {.repetitions = 0},
      "device");
  BOOST_TEST(all.failed == 0u);
  BOOST_TEST(all.first_failed.event == 0u);
}

BOOST_AUTO_TEST_CASE(min_capacity_of_real_compositions_passes_and_a_little_less_fails) {
  const auto trace = alloy::bench::parse_rmm_trace(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0,allocate,0x1000,3000000,0\n"
      "1,0,allocate,0x2000,5000000,0\n"
      "1,0,free,0x1000,3000000,0\n"
      "1,0,allocate,0x3000,4000000,0\n"  // the 3 MB hole is too small: a segment arena needs more
      "1,0,free,0x2000,5000000,0\n"
      "1,0,free,0x3000,4000000,0\n",
      "hole");
  alloy::replay::devices device;
  for (const auto& c : alloy::replay::compositions()) {
    if (c.needs_capacity) continue;
    BOOST_TEST_CONTEXT(c.name) {
      auto run = [&](std::size_t capacity) {
        device.set_capacity(capacity);
        return c.run(trace, device, {.capacity = capacity, .repetitions = 0});
      };
      const auto m = alloy::replay::find_min_capacity(trace, run);
      BOOST_TEST_REQUIRE(m.found);
      BOOST_TEST(m.capacity >= trace.peak_live_bytes);
      BOOST_TEST(run(m.capacity).served_all());
      BOOST_TEST(m.at_capacity.served_all());
      if (m.capacity > trace.peak_live_bytes)
        BOOST_TEST(!run(static_cast<std::size_t>(static_cast<double>(m.capacity) * 0.99)).served_all());
      BOOST_TEST(m.at_capacity.faults == 0u);
      // The largest capacity the search saw fail lies just below, with its first failed allocation.
      // (The search starts at peak live: something failed exactly when more was needed.)
      BOOST_TEST((m.largest_failing != 0) == (m.capacity > trace.peak_live_bytes));
      if (m.largest_failing != 0) {
        BOOST_TEST(m.largest_failing < m.capacity);
        BOOST_TEST(static_cast<double>(m.capacity - m.largest_failing) <= 0.005 * static_cast<double>(m.capacity) + 1);
        const auto below = run(m.largest_failing);
        BOOST_TEST(!below.served_all());
        BOOST_TEST(below.first_failed.event == m.failed_there.event);
        BOOST_TEST(below.first_failed.reserved == m.failed_there.reserved);
        BOOST_TEST_REQUIRE(m.failed_there.event >= 1u);
        BOOST_TEST_REQUIRE(m.failed_there.event <= trace.events.size());
        const auto& e = trace.events[m.failed_there.event - 1];
        BOOST_TEST((e.action == alloy::bench::trace_action::allocate));
        BOOST_TEST(m.failed_there.bytes == e.size);
        BOOST_TEST(m.failed_there.reserved <= m.largest_failing);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(warm_replays_go_over_the_trace_twice_through_one_target) {
  // A target that counts its calls: each timed replay with `warm` makes twice the calls of one
  // without, on one target; the checked replay (the figures) goes over the trace once.
  struct counting_target {
    using token = alloy::block;
    simulated_device* device;
    std::size_t* allocations;
    token allocate(std::size_t bytes) noexcept {
      ++*allocations;
      return {device->allocate(bytes, 256), bytes};
    }
    void deallocate(token b, std::size_t bytes) noexcept { device->deallocate(b.ptr, bytes); }
    static const void* address(const token& b) noexcept { return b.ptr; }
    std::size_t bytes_moved() const noexcept { return 0; }
  };
  for (const bool warm : {false, true}) {
    BOOST_TEST_CONTEXT("warm " << warm) {
      simulated_device device;
      std::size_t allocations = 0, targets = 0;
      const auto r = alloy::replay::replay(
          three_blocks(), device,
          [&] {
            ++targets;
            return counting_target{&device, &allocations};
          },
          {.repetitions = 2, .warm = warm}, "counting");
      BOOST_TEST(targets == 3u);
      BOOST_TEST(allocations == (warm ? 3u + 2 * 6u : 3u + 2 * 3u));
      BOOST_TEST(r.served == 3u);
      BOOST_TEST(r.faults == 0u);
      BOOST_TEST(r.leaked == 0u);
      BOOST_TEST(r.ns_per_op_runs.size() == 2u);
      BOOST_TEST(r.warm_ns_per_op_runs.size() == (warm ? 2u : 0u));
      BOOST_TEST((r.warm_ns_per_op > 0) == warm);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
