// SPDX-License-Identifier: Apache-2.0
// virtual_allocator (showcase.hpp): the pool and the arena share one owned virtual_arena; the
// statistics count it once; capacity runs out, frees, and serves again; a randomized run against
// a model of what is in use; the conformance routine on real memory (host_vmm); and its replay
// in alloy-replay matching a direct run.
#include <boost/test/unit_test.hpp>

#include <alloy/literals.hpp>
#include <alloy/showcase.hpp>
#include <alloy/vmm/host_vmm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "replay/compositions.hpp"
#include "replay/simulated_vm.hpp"
#include "support/conformance.hpp"

namespace {

using namespace alloy::literals;
using alloy::replay::simulated_vm_device;
using sim_vm = simulated_vm_device::backend;
using sim_allocator = alloy::virtual_allocator<sim_vm>;
using host_allocator = alloy::virtual_allocator<alloy::host_vmm>;

static_assert(alloy::allocator<sim_allocator>);
static_assert(alloy::owning_allocator<sim_allocator>);
static_assert(alloy::releasing_allocator<sim_allocator>);
static_assert(alloy::reserving_allocator<sim_allocator>);
static_assert(alloy::counting_allocator<sim_allocator>);
static_assert(alloy::introspectable_allocator<sim_allocator>);
static_assert(alloy::checked_deallocating_allocator<sim_allocator>);
static_assert(!alloy::composite<sim_allocator>, "no parts(): a walker would count the arena and its slabs twice");
static_assert(sim_allocator::device_accessible && !sim_allocator::host_accessible);
static_assert(host_allocator::host_accessible);

/// What the allocator should count as in use for a request: the pool's class size up to the
/// threshold (natural alignment), the arena's rounding (256) above.
std::size_t occupied(std::size_t bytes) {
  if (bytes <= sim_allocator::threshold)
    return sim_allocator::small_type::class_size(sim_allocator::small_type::class_index(bytes));
  return (bytes + 255) / 256 * 256;
}

/// Statistics against the device's own books: reserved = mapped = physical, calls = the device's.
void check_books(const sim_allocator& a, const simulated_vm_device& d) {
  BOOST_TEST(a.reserved_bytes() == d.physical_bytes());
  BOOST_TEST(a.mapped_bytes() == d.mapped());
  const alloy::allocator_counters c = a.counters();
  BOOST_TEST(c.num_device_alloc == d.allocations());
  BOOST_TEST(c.num_device_free == d.deallocations());
  BOOST_TEST(c.num_maps == d.maps());
  BOOST_TEST(c.num_unmaps == d.unmaps());
  BOOST_TEST(d.faults() == 0u, d.first_fault());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(virtual_allocator_suite)

BOOST_AUTO_TEST_CASE(one_arena_counted_once) {
  simulated_vm_device d;
  sim_allocator a{sim_vm{d}};
  const alloy::block small = a.allocate(100, 16);
  const alloy::block large = a.allocate(1_MiB + 1, 256);
  BOOST_TEST_REQUIRE((small && large));
  BOOST_TEST(a.small().owns(small));
  BOOST_TEST(!a.small().owns(large));
  BOOST_TEST(a.owns(small));  // the slab is a chunk of the arena
  BOOST_TEST(a.owns(large));
  BOOST_TEST(a.bytes_in_use() == occupied(100) + occupied(1_MiB + 1));
  BOOST_TEST(a.requested_bytes() == 100 + 1_MiB + 1);
  BOOST_TEST(a.arena().bytes_in_use() == a.small().reserved_bytes() + occupied(1_MiB + 1), "the slab is in the arena");
  BOOST_TEST(a.reserved_bytes() == 6_MiB, "64 KiB slab + 1 MiB chunk: one granule and two ahead of a small heap");
  BOOST_TEST(a.counters().num_maps == 1u, "mapped once");
  check_books(a, d);
  std::size_t chunks = 0, bytes = 0, total = 0;
  const void* previous = nullptr;
  bool in_order = true;
  a.for_each_block([&](const alloy::block_info& info) {
    if (info.state == alloy::block_state::allocated) ++chunks, bytes += info.size;
    total += info.size;
    in_order = in_order && info.ptr > previous;
    previous = info.ptr;
  });
  BOOST_TEST(chunks == 2u, "the small block (in its slab) and the large one");
  BOOST_TEST(bytes == a.bytes_in_use());
  BOOST_TEST(in_order);
  BOOST_TEST(total == a.arena().used_address_space(), "the pieces tile the used part of the reserved range");
  a.deallocate(small);
  a.deallocate(large);
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(a.requested_bytes() == 0u);
  BOOST_TEST(a.reserved_bytes() == 6_MiB, "kept below the release threshold");
  a.release();
  BOOST_TEST(a.reserved_bytes() == 0u);
  BOOST_TEST(a.small().reserved_bytes() == 0u);
  check_books(a, d);
  BOOST_TEST(a.counters().num_ooms == 0u);
}

BOOST_AUTO_TEST_CASE(bad_frees_are_refused_with_every_figure_unchanged) {
  simulated_vm_device d;
  sim_allocator a{sim_vm{d}};
  const alloy::block s = a.allocate(100, 256), l = a.allocate(1_MiB, 256);
  BOOST_TEST_REQUIRE((s && l));
  const std::size_t in_use = a.bytes_in_use(), requested = a.requested_bytes(), reserved = a.reserved_bytes();
  int x = 0;
  const alloy::block bad[] = {{&x, 4},
                              {static_cast<char*>(s.ptr) + 16, 100},     // interior, in a slab
                              {s.ptr, 99},                               // wrong size
                              {static_cast<char*>(l.ptr) + 256, 1_MiB},  // interior, in the arena
                              {l.ptr, 2_MiB}};                           // wrong size, large
  for (const alloy::block& b : bad) {
    BOOST_TEST(!a.try_deallocate(b));
    BOOST_TEST(a.bytes_in_use() == in_use);
    BOOST_TEST(a.requested_bytes() == requested);
    BOOST_TEST(a.reserved_bytes() == reserved);
  }
  BOOST_TEST(a.try_deallocate(s));
  BOOST_TEST(!a.try_deallocate(s), "twice");
  BOOST_TEST(a.try_deallocate(l));
  BOOST_TEST(!a.try_deallocate(l), "twice");
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(a.requested_bytes() == 0u);
  check_books(a, d);
}

// A pool slab is an arena chunk of the slab's size, so a free of {slab base, slab bytes} above the
// threshold (a large block freed twice after a slab took its place) matched it exactly, and the
// arena took the slab back from under the pool's live blocks. Found by compositions_fuzz. Sizes a
// slab has had go to the pool; any other size to the arena, which refuses it as a wrong size.
BOOST_AUTO_TEST_CASE(a_large_free_on_a_pool_slab_is_refused) {
  static_assert(host_allocator::threshold == 128_KiB, "the sizes below: slabs of 256 KiB lie above it");
  host_allocator a{alloy::host_vmm{{.capacity = 256_MiB}}};
  // 16 KiB blocks: 4 fill the class's first slab (64 KiB), 8 its second (128 KiB), the 13th opens
  // its third (256 KiB, above the threshold).
  std::vector<alloy::block> small;
  for (int i = 0; i < 13; ++i) small.push_back(a.allocate(16'000, 256));
  for (const alloy::block& b : small) BOOST_REQUIRE(b);
  const alloy::block first_of_third_slab = small[12];
  std::memset(first_of_third_slab.ptr, 0x5a, first_of_third_slab.size);
  const std::size_t in_use = a.bytes_in_use(), requested = a.requested_bytes(), mapped = a.mapped_bytes();
  const std::size_t pool_misuses = a.small().misuse_count();
  const alloy::misuse_counts arena_misuses = a.arena().misuses();
  BOOST_TEST(a.small().may_hold_slab_of(64_KiB));
  BOOST_TEST(a.small().may_hold_slab_of(128_KiB));
  BOOST_TEST(a.small().may_hold_slab_of(256_KiB));
  BOOST_TEST(!a.small().may_hold_slab_of(256_KiB + 256), "no slab had it (nor its hash bit)");
  BOOST_TEST(!a.small().may_hold_slab_of(512_KiB), "no slab had it (nor its bit 19)");
  for (const std::size_t bytes : {256_KiB, 256_KiB + 256, 512_KiB}) {
    const alloy::block bad{first_of_third_slab.ptr, bytes};
    BOOST_TEST(!a.try_deallocate(bad), bytes << " bytes on the slab");
    a.deallocate(bad);
  }
  BOOST_TEST(a.small().misuse_count() == pool_misuses + 2, "the pool refuses a slab's size as a wrong size");
  BOOST_TEST(a.arena().misuses().wrong_sizes == arena_misuses.wrong_sizes + 4, "the arena the sizes no slab had");
  BOOST_TEST(a.bytes_in_use() == in_use);
  BOOST_TEST(a.requested_bytes() == requested);
  BOOST_TEST(a.mapped_bytes() == mapped);
  const alloy::block large = a.allocate(256_KiB, 256);  // would have taken the slab's place
  BOOST_REQUIRE(large);
  std::memset(large.ptr, 0xa5, large.size);
  const auto* p = static_cast<const unsigned char*>(first_of_third_slab.ptr);
  BOOST_TEST(std::all_of(p, p + first_of_third_slab.size, [](unsigned char c) { return c == 0x5a; }));
  a.deallocate(large);
  for (const alloy::block& b : small) BOOST_TEST(a.try_deallocate(b));
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(a.arena().check_invariants());
}

// A small request the pool cannot align goes to the arena; while it lives, the pool's own
// blocks must still be freed by the pool (the arena owns the slabs' addresses too). Found at
// integration: the segregator asked the arena, which refused the pool's block as a wrong size.
BOOST_AUTO_TEST_CASE(pool_blocks_free_while_a_redirected_block_lives) {
  host_allocator a{alloy::host_vmm{{.capacity = 256_MiB}}};
  const alloy::block redirected = a.allocate(64, 1_MiB);  // no class of the pool aligns to 1 MiB
  BOOST_REQUIRE(redirected);
  std::vector<alloy::block> small;
  for (std::size_t bytes : {16u, 1000u, 4096u, 60'000u}) small.push_back(a.allocate(bytes, 16));
  for (const alloy::block& b : small) BOOST_REQUIRE(b);
  const std::size_t in_use_with_small = a.bytes_in_use();
  for (const alloy::block& b : small) BOOST_TEST(a.try_deallocate(b), "the pool takes back " << b.size << " bytes");
  BOOST_TEST(a.bytes_in_use() < in_use_with_small);
  BOOST_TEST(a.try_deallocate(redirected), "the arena takes back the redirected block");
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(a.requested_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(capacity_runs_out_then_serves_again) {
  simulated_vm_device d(8_MiB);
  sim_allocator a{sim_vm{d}};
  std::vector<alloy::block> live;
  for (int i = 0; i < 4; ++i) live.push_back(a.allocate(2_MiB, 256));
  for (const auto& b : live) BOOST_TEST_REQUIRE(static_cast<bool>(b));
  BOOST_TEST(!a.allocate(1, 256), "every granule holds a live block");
  BOOST_TEST(!a.allocate(2_MiB, 256));
  BOOST_TEST(a.counters().num_ooms == 2u);
  // Bad requests and a tag that is not resident fail without being out of memory.
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  for (const std::size_t bytes : {std::size_t{64}, 2_MiB}) {
    BOOST_TEST(!a.allocate(bytes, 0));
    BOOST_TEST(!a.allocate(bytes, 3));
  }
  BOOST_TEST(!a.allocate(max, 8));
  BOOST_TEST(!a.allocate(max - 100, 1_MiB));
  BOOST_TEST((a.discard(alloy::tag{5}) == alloy::offload_status::done));
  BOOST_TEST(!a.allocate(64, 8, alloy::tag{5}));
  BOOST_TEST(a.counters().num_ooms == 2u);
  a.deallocate(live[1]);
  a.deallocate(live[2]);                            // kept mapped (below the threshold) ...
  const alloy::block big = a.allocate(4_MiB, 256);  // ... and a hole of two granules serves this
  BOOST_TEST_REQUIRE(static_cast<bool>(big));
  a.deallocate(big);
  a.deallocate(live[0]);
  a.deallocate(live[3]);
  // Free granules anywhere give their pages to a request elsewhere (stitching): 8 MiB in one piece.
  const alloy::block all = a.allocate(8_MiB, 256);
  BOOST_TEST(static_cast<bool>(all));
  a.deallocate(all);
  std::vector<alloy::block> small;
  for (int i = 0; i < 1000; ++i) small.push_back(a.allocate(4_KiB, 256));  // small requests use slabs of the arena
  for (const auto& b : small) BOOST_TEST_REQUIRE(static_cast<bool>(b));
  for (const auto& b : small) a.deallocate(b);
  BOOST_TEST(a.bytes_in_use() == 0u);
  check_books(a, d);
  BOOST_TEST(a.counters().num_ooms == 2u);
}

BOOST_AUTO_TEST_CASE(empty_slabs_go_back_before_a_large_request_fails) {
  simulated_vm_device d(8_MiB);
  sim_allocator a{sim_vm{d}};
  std::vector<alloy::block> small;
  for (int i = 0; i < 1000; ++i) small.push_back(a.allocate(4_KiB, 256));  // about 4 MiB of slabs
  for (const auto& b : small) BOOST_TEST_REQUIRE(static_cast<bool>(b));
  for (const auto& b : small) a.deallocate(b);
  const std::size_t slabs = a.small().reserved_bytes();
  BOOST_TEST_REQUIRE(slabs >= 3_MiB, "the pool keeps its empty slabs while nothing presses");
  // The whole device in one block: only when the pool's empty slabs go back to the arena first.
  const alloy::block all = a.allocate(8_MiB, 256);
  BOOST_TEST_REQUIRE(static_cast<bool>(all));
  BOOST_TEST(a.small().reserved_bytes() == 0u);
  BOOST_TEST(a.counters().num_ooms == 0u);
  // A request that cannot be served even so fails cleanly, counted once.
  BOOST_TEST(!a.allocate(4_KiB, 256));
  BOOST_TEST(a.counters().num_ooms == 1u);
  a.deallocate(all);
  BOOST_TEST(a.bytes_in_use() == 0u);
  check_books(a, d);
}

// A tagged block whose best-fit place shares a granule with the piece mapped ahead of tag 0's heap
// goes just past that piece, not to the top of the reservation (where the granule table would
// have covered the whole terabyte: hundreds of MiB of bookkeeping for 64 KiB granules).
BOOST_AUTO_TEST_CASE(a_tagged_block_stays_beside_the_heap) {
  constexpr std::size_t granularity = 64_KiB;
  host_allocator a{alloy::host_vmm{{.granularity = granularity}}};
  const alloy::block small = a.allocate(1000, 16);
  const alloy::block tagged = a.allocate(100'000, 256, alloy::tag{1});
  const alloy::block other = a.allocate(1000, 256, alloy::tag{2});
  BOOST_TEST_REQUIRE((small && tagged && other));
  BOOST_TEST(a.arena().used_address_space() <= 16 * granularity, a.arena().used_address_space()
                                                                     << " bytes in use of the range");
  BOOST_TEST(a.arena().check_invariants());
  std::memset(tagged.ptr, 0x5a, tagged.size);
  BOOST_TEST((a.offload(alloy::tag{1}) == alloy::offload_status::done));
  BOOST_TEST((a.restore(alloy::tag{1}) == alloy::offload_status::done));
  BOOST_TEST(static_cast<const unsigned char*>(tagged.ptr)[tagged.size - 1] == 0x5a);
  for (const alloy::block& b : {small, tagged, other}) a.deallocate(b);
  BOOST_TEST(a.bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(moving_keeps_the_arena_in_place) {
  simulated_vm_device d;
  sim_allocator a{sim_vm{d}};
  const alloy::block s = a.allocate(512, 256), l = a.allocate(3_MiB, 256);
  const auto* arena = &a.arena();
  sim_allocator b{std::move(a)};
  BOOST_TEST(&b.arena() == arena);
  BOOST_TEST(b.small().owns(s));
  b.deallocate(s);
  b.deallocate(l);
  BOOST_TEST(b.bytes_in_use() == 0u);
  const alloy::block again = b.allocate(512, 256);
  BOOST_TEST(static_cast<bool>(again));
  b.deallocate(again);
  check_books(b, d);
}

BOOST_AUTO_TEST_CASE(randomized_against_a_model) {
  for (const unsigned seed : {1u, 2u, 3u}) {
    BOOST_TEST_CONTEXT("seed " << seed) {
      simulated_vm_device d(256_MiB);
      sim_allocator a{sim_vm{d}};
      std::mt19937_64 rng(seed);
      std::uniform_real_distribution<double> log_size(0.0, 24.0);
      struct live_block {
        alloy::block b;
        std::size_t occupied;
      };
      std::vector<live_block> live;
      std::size_t in_use = 0, requested = 0, ooms = 0;
      bool books_ok = true;
      for (int i = 0; i < 200'000; ++i) {
        if (!live.empty() && (rng() % 2 == 0 || live.size() > 400)) {
          const std::size_t k = rng() % live.size();
          a.deallocate(live[k].b);
          in_use -= live[k].occupied;
          requested -= live[k].b.size;
          live[k] = live.back();
          live.pop_back();
        } else {
          const auto bytes = static_cast<std::size_t>(std::exp2(log_size(rng)));
          const alloy::block b = a.allocate(bytes, 256);
          if (!b) {
            ++ooms;
          } else {
            books_ok = books_ok && reinterpret_cast<std::uintptr_t>(b.ptr) % 256 == 0 && d.holds(b.ptr, bytes);
            live.push_back({b, occupied(bytes)});
            in_use += occupied(bytes);
            requested += bytes;
          }
        }
        if (i % 997 == 0) {
          BOOST_TEST_REQUIRE(a.bytes_in_use() == in_use);
          BOOST_TEST_REQUIRE(a.requested_bytes() == requested);
          BOOST_TEST_REQUIRE(a.reserved_bytes() == d.physical_bytes());
          BOOST_TEST_REQUIRE(a.reserved_bytes() <= 256_MiB);
        }
      }
      BOOST_TEST(books_ok, "every block aligned and mapped");
      BOOST_TEST(a.counters().num_ooms == ooms);
      BOOST_TEST(ooms > 0u, "the workload should meet the capacity");
      for (const auto& l : live) a.deallocate(l.b);
      BOOST_TEST(a.bytes_in_use() == 0u);
      a.release();
      BOOST_TEST(a.reserved_bytes() == 0u);
      check_books(a, d);
    }
  }
}

BOOST_AUTO_TEST_CASE(conformance_on_real_memory) {
  for (const std::size_t granularity : {64_KiB, 2_MiB}) {
    BOOST_TEST_CONTEXT("granularity " << granularity) {
      host_allocator a{alloy::host_vmm{{.granularity = granularity}}};
      alloy::testing::check_conformance(
          a, {.max_size = 64_MiB, .random_ops = 10'000, .random_max_size = 4_MiB, .random_max_live = 128});
      BOOST_TEST(a.bytes_in_use() == 0u);
      BOOST_TEST(a.arena().check_invariants());
    }
  }
}

BOOST_AUTO_TEST_CASE(replay_matches_a_direct_run) {
  // alloy-replay's virtual_allocator entry against the same requests made directly.
  std::string csv = "Thread,Time,Action,Pointer,Size,Stream\n";
  std::mt19937_64 rng(11);
  std::vector<std::pair<int, std::size_t>> live;
  std::vector<std::pair<bool, std::size_t>> ops;  // (allocate, size) / (free, index of allocation)
  int next = 0;
  for (int i = 0; i < 3000; ++i) {
    if (!live.empty() && rng() % 2) {
      const std::size_t k = rng() % live.size();
      csv += "1,0,free," + std::to_string(0x1000 + live[k].first) + "," + std::to_string(live[k].second) + ",0\n";
      ops.push_back({false, static_cast<std::size_t>(live[k].first)});
      live[k] = live.back();
      live.pop_back();
    } else {
      const auto bytes = static_cast<std::size_t>(std::exp2(8 + static_cast<double>(rng() % 1500) / 100));
      csv += "1,0,allocate," + std::to_string(0x1000 + next) + "," + std::to_string(bytes) + ",0\n";
      ops.push_back({true, bytes});
      live.push_back({next++, bytes});
    }
  }
  const auto trace = alloy::bench::parse_rmm_trace(csv, "direct");
  std::size_t peak_physical = 0, maps = 0;
  {
    simulated_vm_device d;
    sim_allocator a{sim_vm{d}};
    std::vector<alloy::block> blocks;
    for (const auto& [alloc, n] : ops) {
      if (alloc) {
        blocks.push_back(a.allocate(n, 256));
      } else {
        a.deallocate(blocks[n]);
      }
    }
    peak_physical = d.peak_reserved();
    maps = d.map_calls();
  }
  const auto all = alloy::replay::compositions();
  const auto entry = std::find_if(all.begin(), all.end(), [](const auto& c) { return c.name == "virtual_allocator"; });
  BOOST_TEST_REQUIRE((entry != all.end()));
  BOOST_TEST(entry->virtual_memory);
  alloy::replay::devices devices;
  const auto r = entry->run(trace, devices, {.repetitions = 1});
  BOOST_TEST(r.faults == 0u, r.first_fault);
  BOOST_TEST(r.virtual_memory);
  BOOST_TEST(r.failed == 0u);
  BOOST_TEST(r.peak_reserved == peak_physical);
  BOOST_TEST(r.map_calls == maps);
  BOOST_TEST(r.peak_in_use == trace.peak_live_bytes);
  BOOST_TEST(r.leaked == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
