// SPDX-License-Identifier: Apache-2.0
// virtual_arena tags and pointer-stable offload over host_vmm (real memory): tags
// never share a granule, scoped_tag, offload / discard / restore keeping addresses and content,
// exact physical accounting (another tag can use all that was freed), every misuse, host
// allocation / create / map failing at every call, a randomized model-based run of offload /
// restore / discard cycles of random tags with allocations and frees in between, and exact
// statistics.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory_resource>
#include <new>
#include <ostream>
#include <random>
#include <vector>

#include <alloy/adaptor/pmr.hpp>
#include <alloy/literals.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/showcase.hpp>
#include <alloy/snapshot.hpp>
#include <alloy/tag.hpp>
#include <alloy/vmm/host_vmm.hpp>

#include "support/conformance.hpp"
#include "support/failing_vmm.hpp"
#include "support/tag_printing.hpp"

using namespace alloy::literals;
using alloy::block;
using alloy::host_vmm;
using alloy::offload_status;
using alloy::scoped_tag;
using alloy::tag;
using alloy::tag_state;
using alloy::virtual_arena;
using alloy::testing::fill_pattern;
using alloy::testing::has_pattern;

using host_arena = virtual_arena<host_vmm>;

namespace {

constexpr std::size_t granule = 64_KiB;

/// A host allocator for the copies that fails the calls numbered in `fail_at` (0-based) or every
/// call from `fail_from` on, and counts what is outstanding.
struct failing_host {
  std::size_t calls = 0;
  std::size_t fail_at = static_cast<std::size_t>(-1);
  std::size_t fail_from = static_cast<std::size_t>(-1);
  std::size_t outstanding = 0;
  static void* allocate(std::size_t bytes, void* context) {
    auto& self = *static_cast<failing_host*>(context);
    const std::size_t call = self.calls++;
    if (call == self.fail_at || call >= self.fail_from) return nullptr;
    ++self.outstanding;
    return ::operator new(bytes, std::nothrow);
  }
  static void deallocate(void* p, std::size_t, void* context) {
    --static_cast<failing_host*>(context)->outstanding;
    ::operator delete(p);
  }
};

host_arena::options with_host(failing_host& h) {
  host_arena::options o;
  o.release_threshold = 0;
  o.keep_up_to_peak = false;
  o.host_allocate = &failing_host::allocate;
  o.host_deallocate = &failing_host::deallocate;
  o.host_context = &h;
  return o;
}

std::size_t granule_of(const host_arena& a, const void* p) {
  std::uintptr_t base = ~std::uintptr_t{0};
  a.for_each_block([&](const alloy::block_info& i) { base = reinterpret_cast<std::uintptr_t>(i.segment); });
  return (reinterpret_cast<std::uintptr_t>(p) - base) / a.granularity();
}

/// virtual_allocator's arena options: nothing trimmed, runs of granules in one piece.
template <class Arena = host_arena>
constexpr typename Arena::options block_sized{.release_threshold = Arena::keep_all, .block_sized_pieces = true};
using shared_arena = virtual_arena<alloy::vmm_ref<host_vmm>>;

}  // namespace

BOOST_AUTO_TEST_CASE(tags_never_share_a_granule) {
  for (const host_arena::options& options :
       {host_arena::options{.release_threshold = 0, .keep_up_to_peak = false}, block_sized<>}) {
    host_arena a{host_vmm{{.granularity = granule}}, options};
    std::vector<std::pair<block, std::uint16_t>> live;
    std::mt19937_64 rng{7};
    for (int i = 0; i < 2000; ++i) {
      if (!live.empty() && rng() % 3 == 0) {
        const std::size_t k = rng() % live.size();
        a.deallocate(live[k].first);
        live[k] = live.back();
        live.pop_back();
        continue;
      }
      const auto t = static_cast<std::uint16_t>(rng() % 4);
      const std::size_t bytes = 1 + rng() % (3 * granule);
      const std::size_t alignment = std::size_t{1} << (rng() % 18);
      const block b = a.allocate(bytes, alignment, tag{t});
      BOOST_REQUIRE(b.ptr != nullptr);
      BOOST_TEST(reinterpret_cast<std::uintptr_t>(b.ptr) % alignment == 0u);
      live.emplace_back(b, t);
    }
    BOOST_TEST(a.check_invariants());  // checks that every granule's chunks have one tag
    // And independently: no granule holds blocks of two tags.
    std::map<std::size_t, std::uint16_t> owner;
    for (const auto& [b, t] : live) {
      const std::size_t last =
          b.size == 0 ? granule_of(a, b.ptr) : granule_of(a, static_cast<char*>(b.ptr) + b.size - 1);
      for (std::size_t g = granule_of(a, b.ptr); g <= last; ++g) {
        const auto [it, fresh] = owner.emplace(g, t);
        BOOST_TEST((fresh || it->second == t), "granule " << g << " shared by tags " << it->second << " and " << t);
      }
    }
    for (const auto& [b, t] : live) a.deallocate(b);
    a.release();
    BOOST_TEST(a.mapped_bytes() == 0u);
  }
}

BOOST_AUTO_TEST_CASE(block_sized_pieces_keep_other_tags_out) {
  host_vmm v{{.granularity = granule}};
  {
    shared_arena a{alloy::vmm_ref<host_vmm>{v}, block_sized<shared_arena>};
    const block x = a.allocate(16 * granule, granule);  // one piece of 16 granules, tag 0
    const block y = a.allocate(granule, granule, tag{5});
    BOOST_REQUIRE(x);
    BOOST_REQUIRE(y);
    BOOST_TEST(y.ptr == static_cast<char*>(x.ptr) + 16 * granule);
    a.deallocate(x);
    const block w = a.allocate(granule, granule);  // tag 0 reuses a granule of the free piece
    BOOST_REQUIRE(w);
    BOOST_TEST(w.ptr == x.ptr);
    fill_pattern(w, 1);
    // A block of tag 5 that fits the rest of the piece goes elsewhere: offloading tag 5 must not
    // unmap a piece that tag 0's block uses.
    const block z = a.allocate(granule, granule, tag{5});
    BOOST_REQUIRE(z);
    BOOST_TEST((z.ptr < x.ptr || z.ptr >= static_cast<char*>(x.ptr) + 16 * granule));
    fill_pattern(z, 2);
    BOOST_TEST(a.check_invariants());
    const std::size_t physical = v.physical_bytes();
    BOOST_TEST(a.offload(tag{5}) == offload_status::done);
    BOOST_TEST(v.physical_bytes() == physical - 2 * granule);
    BOOST_TEST(has_pattern(w, 1));
    // Offloading tag 0 unmaps its piece whole, the 15 free granules with it.
    BOOST_TEST(a.offload(tag{0}) == offload_status::done);
    BOOST_TEST(v.physical_bytes() == 0u);
    BOOST_TEST(a.free_mapped_bytes() == 0u);
    BOOST_TEST(a.offload_stats().bytes_reclaimed == 18 * granule);
    BOOST_TEST(a.check_invariants());
    BOOST_TEST(a.restore(tag{0}) == offload_status::done);
    BOOST_TEST(a.restore(tag{5}) == offload_status::done);
    BOOST_TEST(v.physical_bytes() == 3 * granule, "restores map the granules the live chunks touch");
    BOOST_TEST(has_pattern(w, 1));
    BOOST_TEST(has_pattern(z, 2));
    BOOST_TEST(a.check_invariants());
    a.deallocate(w);
    a.deallocate(y);
    a.deallocate(z);
  }
  BOOST_TEST(v.physical_bytes() == 0u);
  BOOST_TEST(v.calls().maps == v.calls().unmaps);
}

BOOST_AUTO_TEST_CASE(every_tag_gets_block_sized_pieces_and_restores_map_them_so) {
  host_vmm v{{.granularity = granule}};
  {
    shared_arena a{alloy::vmm_ref<host_vmm>{v}, block_sized<shared_arena>};
    // Tag 1: eight whole granules, one piece. Tag 2: three and a half, its run and its edge.
    const block w = a.allocate(8 * granule, granule, tag{1});
    BOOST_REQUIRE(w);
    BOOST_TEST(v.calls().creates == 1u);
    BOOST_TEST(v.calls().maps == 1u);
    const block k = a.allocate(3 * granule + granule / 2, granule, tag{2});
    BOOST_REQUIRE(k);
    BOOST_TEST(v.calls().maps == 3u);
    fill_pattern(w, 1);
    fill_pattern(k, 2);
    BOOST_TEST(a.offload(tag{1}) == offload_status::done);
    BOOST_TEST(v.calls().unmaps == 1u);
    BOOST_TEST(v.physical_bytes() == 4 * granule);
    BOOST_TEST(a.restore(tag{1}) == offload_status::done);
    BOOST_TEST(v.calls().maps == 4u, "the eight granules come back as one piece");
    BOOST_TEST(v.calls().creates == 4u);
    BOOST_TEST(has_pattern(w, 1));
    BOOST_TEST(has_pattern(k, 2));
    BOOST_TEST(a.discard(tag{2}) == offload_status::done);
    BOOST_TEST(v.calls().unmaps == 3u);
    BOOST_TEST(a.restore(tag{2}) == offload_status::done);
    BOOST_TEST(v.calls().maps == 6u, "the run and the edge again");
    BOOST_TEST(v.physical_bytes() == 12 * granule);
    BOOST_TEST(a.check_invariants());

    // Tag 1's piece wholly free (kept mapped) takes another tag: best fit puts tag 3's granule in it.
    a.deallocate(w);
    const block x = a.allocate(granule, granule, tag{3});
    BOOST_REQUIRE(x);
    BOOST_TEST(x.ptr == w.ptr);
    BOOST_TEST(v.calls().maps == 6u, "reused as it is");
    fill_pattern(x, 3);
    // Now tag 3 uses the piece: tag 1 goes elsewhere, though the rest of the piece would fit it.
    const block y = a.allocate(granule, granule, tag{1});
    BOOST_REQUIRE(y);
    BOOST_TEST((y.ptr < w.ptr || y.ptr >= static_cast<char*>(w.ptr) + 8 * granule));
    fill_pattern(y, 4);
    BOOST_TEST(a.check_invariants());
    // Offloading tag 3 unmaps the piece whole, its seven free granules too, and nothing of tag 1.
    const std::size_t physical = v.physical_bytes();
    BOOST_TEST(a.offload(tag{3}) == offload_status::done);
    BOOST_TEST(v.physical_bytes() == physical - 8 * granule);
    BOOST_TEST(has_pattern(y, 4));
    BOOST_TEST(a.restore(tag{3}) == offload_status::done);
    BOOST_TEST(has_pattern(x, 3));
    BOOST_TEST(v.physical_bytes() == physical - 7 * granule);
    BOOST_TEST(a.check_invariants());
    a.deallocate(x);
    a.deallocate(y);
    a.deallocate(k);
    a.release();
  }
  BOOST_TEST(v.physical_bytes() == 0u);
  BOOST_TEST(v.calls().creates == v.calls().releases);
}

BOOST_AUTO_TEST_CASE(scoped_tag_sets_and_restores_the_current_tag) {
  host_arena a{host_vmm{{.granularity = granule}}, {.release_threshold = 0, .keep_up_to_peak = false}};
  BOOST_TEST(a.current_tag().value == 0u);
  block outer, inner;
  {
    scoped_tag weights{a, tag{1}};
    outer = a.allocate(1000, 8);  // untagged call: tagged from outside
    {
      scoped_tag cache{a, tag{2}};
      BOOST_TEST(a.current_tag().value == 2u);
      inner = a.allocate(1000, 8);
    }
    BOOST_TEST(a.current_tag().value == 1u);
  }
  BOOST_TEST(a.current_tag().value == 0u);
  BOOST_TEST(granule_of(a, outer.ptr) != granule_of(a, inner.ptr));
  BOOST_TEST(a.live_bytes(tag{1}) == 1000u);
  BOOST_TEST(a.live_bytes(tag{2}) == 1000u);
  BOOST_TEST(a.live_bytes(tag{0}) == 0u);
  a.deallocate(outer);
  a.deallocate(inner);
}

BOOST_AUTO_TEST_CASE(offload_restore_keeps_addresses_and_content_and_frees_exactly_the_tag) {
  // 16 granules of capacity: the weights take 6, the cache 4, the rest is free.
  host_vmm vmm{{.capacity = 16 * granule, .granularity = granule}};
  alloy::vmm_ref<host_vmm> ref{vmm};
  virtual_arena<alloy::vmm_ref<host_vmm>> a{ref, {.release_threshold = 0, .keep_up_to_peak = false}};
  std::vector<block> weights, cache;
  for (int i = 0; i < 6; ++i) weights.push_back(a.allocate(granule - 4096, 256, tag{1}));
  for (int i = 0; i < 4; ++i) cache.push_back(a.allocate(granule / 2 + 1000, 256, tag{2}));
  for (std::size_t i = 0; i < weights.size(); ++i) fill_pattern(weights[i], 100 + i);
  for (std::size_t i = 0; i < cache.size(); ++i) fill_pattern(cache[i], 200 + i);
  const std::size_t w_mapped = a.mapped_bytes(tag{1}), c_mapped = a.mapped_bytes(tag{2});
  BOOST_TEST(w_mapped == 6 * granule);
  const std::size_t physical = vmm.physical_bytes();

  BOOST_TEST(a.offload(tag{1}) == offload_status::done);
  BOOST_TEST(vmm.physical_bytes() == physical - w_mapped);
  BOOST_TEST(a.host_bytes(tag{1}) == 6 * (granule - 4096));  // live bytes, nothing more
  BOOST_TEST(a.discard(tag{2}) == offload_status::done);
  BOOST_TEST(vmm.physical_bytes() == physical - w_mapped - c_mapped);
  BOOST_TEST(a.state(tag{1}) == tag_state::offloaded);
  BOOST_TEST(a.state(tag{2}) == tag_state::discarded);
  BOOST_TEST(a.check_invariants());

  // Training takes the whole device: every granule of capacity.
  std::vector<block> training;
  for (;;) {
    const block b = a.allocate(granule, granule, tag{3});
    if (b.ptr == nullptr) break;
    training.push_back(b);
  }
  BOOST_TEST(vmm.physical_bytes() == vmm.capacity());
  BOOST_TEST(training.size() == 16u);
  // Restoring now fails cleanly: nothing half-mapped, can be retried.
  BOOST_TEST(a.restore(tag{1}) == offload_status::device_out_of_memory);
  BOOST_TEST(a.state(tag{1}) == tag_state::offloaded);
  BOOST_TEST(vmm.physical_bytes() == vmm.capacity());
  BOOST_TEST(a.check_invariants());
  for (const block& b : training) a.deallocate(b);

  BOOST_TEST(a.restore(tag{1}) == offload_status::done);
  BOOST_TEST(a.restore(tag{2}) == offload_status::done);
  for (std::size_t i = 0; i < weights.size(); ++i) BOOST_TEST(has_pattern(weights[i], 100 + i));
  BOOST_TEST(a.mapped_bytes(tag{1}) == w_mapped);
  BOOST_TEST(a.mapped_bytes(tag{2}) == c_mapped);
  BOOST_TEST(a.restore(tag{1}) == offload_status::already_resident);
  BOOST_TEST(a.check_invariants());
  const alloy::offload_statistics s = a.offload_stats();
  BOOST_TEST(s.bytes_reclaimed == w_mapped + c_mapped);
  BOOST_TEST(s.num_single_reclaims == 2u);
  BOOST_TEST(s.num_offloads == 1u);
  BOOST_TEST(s.num_discards == 1u);
  BOOST_TEST(s.num_restores == 2u);
  BOOST_TEST(s.bytes_on_host == 0u);
  BOOST_TEST(s.bytes_copied_to_host == 6 * (granule - 4096));
  BOOST_TEST(s.bytes_copied_back == 6 * (granule - 4096));
  for (const block& b : weights) a.deallocate(b);
  for (const block& b : cache) a.deallocate(b);
}

BOOST_AUTO_TEST_CASE(misuse_is_refused_and_leaves_the_tag_intact) {
  failing_host h;
  host_arena a{host_vmm{{.granularity = granule}}, with_host(h)};
  const block w1 = a.allocate(3000, 8, tag{1});
  const block w2 = a.allocate(5000, 8, tag{1});
  fill_pattern(w1, 1);
  fill_pattern(w2, 2);
  BOOST_TEST(a.restore(tag{1}) == offload_status::already_resident);

  h.fail_at = 0;  // the host copy cannot be allocated: the tag stays resident and intact
  BOOST_TEST(a.offload(tag{1}) == offload_status::host_out_of_memory);
  BOOST_TEST(a.state(tag{1}) == tag_state::resident);
  BOOST_TEST(has_pattern(w1, 1));
  BOOST_TEST(has_pattern(w2, 2));
  BOOST_TEST(a.check_invariants());

  BOOST_TEST(a.offload(tag{1}) == offload_status::done);
  BOOST_TEST(a.offload(tag{1}) == offload_status::not_resident);
  BOOST_TEST(a.discard(tag{1}) == offload_status::not_resident);
  BOOST_TEST(a.allocate(100, 8, tag{1}).ptr == nullptr);  // allocating with an offloaded tag
  {
    scoped_tag guard{a, tag{1}};
    BOOST_TEST(a.allocate(100, 8).ptr == nullptr);
  }
  BOOST_TEST(a.offload_stats().num_refused_allocations == 2u);
  a.deallocate(w1);  // allowed while offloaded: freed, not restored
  BOOST_TEST(a.check_invariants());
  BOOST_TEST(a.restore(tag{1}) == offload_status::done);
  BOOST_TEST(has_pattern(w2, 2));
  BOOST_TEST(a.offload_stats().bytes_copied_back == 5000u);
  BOOST_TEST(h.outstanding == 0u);
  a.deallocate(w2);
  BOOST_TEST(a.check_invariants());
  BOOST_TEST(a.bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(a_freed_offloaded_range_can_go_to_another_tag_and_is_not_overwritten) {
  host_arena a{host_vmm{{.granularity = granule}}, {.release_threshold = 0, .keep_up_to_peak = false}};
  const block w = a.allocate(2 * granule, granule, tag{1});
  fill_pattern(w, 1);
  BOOST_TEST(a.offload(tag{1}) == offload_status::done);
  a.deallocate(w);
  const block other = a.allocate(2 * granule, granule, tag{2});
  BOOST_TEST(other.ptr == w.ptr);  // the range went back to best fit
  fill_pattern(other, 9);
  BOOST_TEST(a.restore(tag{1}) == offload_status::done);
  BOOST_TEST(has_pattern(other, 9));
  BOOST_TEST(a.check_invariants());
  a.deallocate(other);
}

BOOST_AUTO_TEST_CASE(failures_at_every_call_leave_everything_intact) {
  // Host allocation, create and map fail at call k, for every k until a run passes untouched;
  // with a piece per granule and with block-sized pieces (blocks of up to three and a half
  // granules: restores map runs).
  for (const bool pieces : {false, true}) {
    for (int kind = 0; kind < 2; ++kind) {
      std::size_t absorbed_runs = 0, failed_calls = 0;
      for (std::size_t k = 0;; ++k) {
        failing_host h;
        using fvmm = alloy::testing::failing_vmm<alloy::vmm_ref<host_vmm>>;
        fvmm::options fo;
        fo.kinds = fvmm::creates | fvmm::maps;
        host_vmm vmm{{.capacity = 32 * granule, .granularity = granule}};
        fvmm backend{alloy::vmm_ref<host_vmm>{vmm}, fo};
        fvmm control = backend;  // shares the options and counts
        virtual_arena<fvmm>::options o;
        o.release_threshold = pieces ? virtual_arena<fvmm>::keep_all : 0;
        o.keep_up_to_peak = false;
        o.block_sized_pieces = pieces;
        o.host_allocate = &failing_host::allocate;
        o.host_deallocate = &failing_host::deallocate;
        o.host_context = &h;
        virtual_arena<fvmm> a{backend, o};
        std::vector<std::pair<block, std::uint64_t>> live;
        for (std::uint64_t i = 0; i < 12; ++i) {
          const block b =
              a.allocate(1000 + (pieces ? 20000 : 9000) * i, 256, tag{static_cast<std::uint16_t>(1 + i % 3)});
          BOOST_REQUIRE(b.ptr != nullptr);
          fill_pattern(b, i);
          live.emplace_back(b, i);
        }
        // From here on, call k of the chosen kind fails.
        if (kind == 0) h.fail_at = k;
        else control.set_options({.fail_at = {control.calls() + k}, .kinds = fo.kinds});
        const std::size_t failures_before = control.failures();
        std::size_t failed = 0;
        for (int round = 0; round < 2; ++round) {
          for (std::uint16_t t = 1; t <= 3; ++t) {
            const offload_status s = (t == 2 && round == 0) ? a.discard(tag{t}) : a.offload(tag{t});
            if (s != offload_status::done) {
              ++failed;
              BOOST_TEST(a.state(tag{t}) == tag_state::resident);
            }
            BOOST_TEST(a.check_invariants());
          }
          for (std::uint16_t t = 1; t <= 3; ++t) {
            if (a.state(tag{t}) == tag_state::resident) continue;
            const tag_state before = a.state(tag{t});
            offload_status s = a.restore(tag{t});
            if (s != offload_status::done) {
              ++failed;
              BOOST_TEST(a.state(tag{t}) == before);
              BOOST_TEST(a.mapped_bytes(tag{t}) == 0u);  // nothing half-mapped
              BOOST_TEST(a.check_invariants());
              s = a.restore(tag{t});  // the retry works (one failure injected)
            }
            BOOST_TEST(s == offload_status::done);
          }
          // Content of everything not discarded in round 0 is intact.
          for (const auto& [b, id] : live)
            if (round == 1 || id % 3 != 1)
              BOOST_TEST(has_pattern(b, id), "pieces " << pieces << " kind " << kind << " k " << k << " block " << id);
          for (const auto& [b, id] : live) fill_pattern(b, id);
        }
        for (const auto& [b, id] : live) a.deallocate(b);
        a.release();  // keep_all: the free granules stay mapped until then
        BOOST_TEST(a.check_invariants());
        BOOST_TEST(h.outstanding == 0u);
        BOOST_TEST(vmm.physical_bytes() == 0u);
        const bool injected = kind == 0 ? h.calls > k : control.failures() > failures_before;
        // One injected failure fails one call; with block-sized pieces a run whose create or map
        // failed is mapped granule by granule instead, and nothing fails.
        const bool absorbed = injected && pieces && kind == 1 && failed == 0;
        BOOST_TEST(failed == (injected && !absorbed ? 1u : 0u));
        absorbed_runs += absorbed;
        failed_calls += failed;
        if (!injected) break;
      }
      if (pieces && kind == 1) {
        BOOST_TEST(absorbed_runs > 0u, "runs fell back to granules");
        BOOST_TEST(failed_calls > 0u, "and single granules failed the call");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(randomized_cycles_of_random_tags) {
  // Seeds 1-2 with room; 3-4 on a device of 40 granules, where restores often fail and are
  // retried; 5-6 as 1 and 3 with virtual_allocator's options (block-sized pieces, nothing trimmed).
  for (const std::uint64_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    const bool roomy = seed <= 2 || seed == 5, pieces = seed >= 5;
    host_vmm vmm{{.capacity = (roomy ? 256 : 40) * granule, .granularity = granule}};
    alloy::vmm_ref<host_vmm> ref{vmm};
    shared_arena a{ref, pieces ? block_sized<shared_arena> : shared_arena::options{.release_threshold = 4 * granule}};
    constexpr std::uint16_t tags = 5;
    struct entry {
      block b;
      std::uint16_t t;
      std::uint64_t id;
    };
    std::vector<entry> live;
    std::mt19937_64 rng{seed};
    std::uint64_t next_id = 0;
    std::size_t checks = 0, max_ratio_excess = 0, refused_restores = 0;
    double worst_ratio = 0;
    for (int step = 0; step < 20000; ++step) {
      const auto op = rng() % 100;
      const auto t = static_cast<std::uint16_t>(rng() % tags);
      if (op < 50) {
        const block b = a.allocate(1 + rng() % (granule * 3 / 2), std::size_t{8} << (rng() % 8), tag{t});
        if (a.state(tag{t}) != tag_state::resident) {
          BOOST_TEST(b.ptr == nullptr);
          continue;
        }
        if (b.ptr == nullptr) continue;  // capacity
        fill_pattern(b, next_id);
        live.push_back({b, t, next_id++});
      } else if (op < 80) {
        if (live.empty()) continue;
        const std::size_t k = rng() % live.size();
        a.deallocate(live[k].b);
        live[k] = live.back();
        live.pop_back();
      } else if (op < 90) {
        const std::size_t physical = vmm.physical_bytes(), tag_mapped = a.mapped_bytes(tag{t});
        const std::size_t free_mapped = a.free_mapped_bytes();
        const std::size_t live_bytes = a.live_bytes(tag{t});
        const std::size_t copied = a.offload_stats().bytes_copied_to_host;
        const bool discard = rng() % 4 == 0;
        const tag_state before = a.state(tag{t});
        const offload_status s = discard ? a.discard(tag{t}) : a.offload(tag{t});
        if (before != tag_state::resident) {
          BOOST_TEST(s == offload_status::not_resident);
          continue;
        }
        BOOST_TEST(s == offload_status::done);
        // Exactly the tag's granules, and (block-sized pieces) the free granules of its pieces.
        const std::size_t with_pieces = free_mapped - a.free_mapped_bytes();
        BOOST_TEST(vmm.physical_bytes() == physical - tag_mapped - with_pieces);
        if (!pieces) BOOST_TEST(with_pieces == 0u);
        BOOST_TEST(a.mapped_bytes(tag{t}) == 0u);
        const std::size_t now_copied = a.offload_stats().bytes_copied_to_host - copied;
        BOOST_TEST(now_copied == (discard ? 0 : live_bytes));  // live bytes only, free chunks never
        if (!discard && live_bytes != 0) worst_ratio = std::max(worst_ratio, double(now_copied) / double(live_bytes));
        max_ratio_excess = std::max(max_ratio_excess, now_copied > live_bytes ? now_copied - live_bytes : 0);
      } else {
        if (a.state(tag{t}) == tag_state::resident) {
          BOOST_TEST(a.restore(tag{t}) == offload_status::already_resident);
          continue;
        }
        const bool discarded = a.state(tag{t}) == tag_state::discarded;
        const offload_status s = a.restore(tag{t});
        if (s == offload_status::device_out_of_memory) {
          BOOST_TEST(a.mapped_bytes(tag{t}) == 0u);  // nothing half-mapped
          BOOST_TEST(a.state(tag{t}) == (discarded ? tag_state::discarded : tag_state::offloaded));
          ++refused_restores;
          continue;
        }
        BOOST_TEST(s == offload_status::done);
        for (entry& e : live) {
          if (e.t != t) continue;
          if (discarded) fill_pattern(e.b, e.id);
          else BOOST_TEST(has_pattern(e.b, e.id), "seed " << seed << " step " << step << " block " << e.id);
          ++checks;
        }
      }
      if (step % 1000 == 0) BOOST_TEST(a.check_invariants());
    }
    BOOST_TEST(a.check_invariants());
    BOOST_TEST(checks > (roomy ? 1000u : 100u));
    BOOST_TEST(max_ratio_excess == 0u);
    BOOST_TEST_MESSAGE("seed " << seed << ": " << checks << " blocks checked after restores, worst copied/live "
                               << worst_ratio << ", offloads " << a.offload_stats().num_offloads << ", discards "
                               << a.offload_stats().num_discards << ", restores " << a.offload_stats().num_restores
                               << ", restores refused for capacity " << refused_restores);
    for (std::uint16_t t = 0; t < tags; ++t) (void)a.restore(tag{t});
    for (const entry& e : live) {
      if (a.state(tag{e.t}) == tag_state::resident) BOOST_TEST(true);
      a.deallocate(e.b);
    }
    BOOST_TEST(a.bytes_in_use() == 0u);
    BOOST_TEST(a.check_invariants());
  }
}

BOOST_AUTO_TEST_CASE(offload_all_is_one_full_reclaim) {
  host_arena a{host_vmm{{.granularity = granule}}, {.release_threshold = 0, .keep_up_to_peak = false}};
  std::vector<block> blocks;
  for (std::uint16_t t = 0; t < 4; ++t) blocks.push_back(a.allocate(10000 + t, 256, tag{t}));
  for (std::size_t i = 0; i < blocks.size(); ++i) fill_pattern(blocks[i], i);
  const std::size_t mapped = a.mapped_bytes();
  BOOST_TEST(a.offload_all() == offload_status::done);
  BOOST_TEST(a.mapped_bytes() == 0u);
  const alloy::offload_statistics s = a.offload_stats();
  BOOST_TEST(s.num_full_reclaims == 1u);
  BOOST_TEST(s.num_single_reclaims == 0u);
  BOOST_TEST(s.num_offloads == 4u);
  BOOST_TEST(s.bytes_reclaimed == mapped);
  BOOST_TEST(s.bytes_on_host == 4 * 10000u + 6u);
  for (std::uint16_t t = 0; t < 4; ++t) BOOST_TEST(a.restore(tag{t}) == offload_status::done);
  for (std::size_t i = 0; i < blocks.size(); ++i) BOOST_TEST(has_pattern(blocks[i], i));
  for (const block& b : blocks) a.deallocate(b);
}

BOOST_AUTO_TEST_CASE(virtual_allocator_passes_tags_through) {
  // Tag 0 goes through the size-class pool; tagged blocks, small ones too, come from the arena
  // directly, so no slab mixes tags and offload takes exactly the tag's blocks.
  alloy::virtual_allocator<host_vmm> a{host_vmm{{.capacity = 256_MiB}}};
  std::mt19937_64 rng{3};
  std::vector<std::pair<block, std::uint64_t>> untagged, tagged;
  for (std::uint64_t i = 0; i < 200; ++i) {
    const std::size_t bytes = 1 + rng() % (i % 2 == 0 ? 2000 : 300000);
    const block b = i % 3 == 0 ? a.allocate(bytes, 16, tag{1}) : a.allocate(bytes, 16);
    BOOST_REQUIRE(b.ptr != nullptr);
    fill_pattern(b, i);
    (i % 3 == 0 ? tagged : untagged).emplace_back(b, i);
  }
  {
    scoped_tag guard{a, tag{1}};
    const block b = a.allocate(100, 8);  // tagged from outside
    fill_pattern(b, 1000);
    tagged.emplace_back(b, 1000);
  }
  const std::size_t mapped = a.mapped_bytes(), tag_mapped = a.arena().mapped_bytes(tag{1});
  BOOST_TEST(tag_mapped > 0u);
  BOOST_TEST(a.offload(tag{1}) == offload_status::done);
  BOOST_TEST(a.mapped_bytes() == mapped - tag_mapped);
  for (const auto& [b, id] : untagged) BOOST_TEST(has_pattern(b, id));  // the pool's slabs stayed
  BOOST_TEST(a.allocate(100, 8, tag{1}).ptr == nullptr);
  BOOST_TEST(a.restore(tag{1}) == offload_status::done);
  for (const auto& [b, id] : tagged) BOOST_TEST(has_pattern(b, id));
  BOOST_TEST(a.offload_stats().num_offloads == 1u);
  for (const auto& [b, id] : tagged) BOOST_TEST(a.try_deallocate(b));
  for (const auto& [b, id] : untagged) BOOST_TEST(a.try_deallocate(b));
  BOOST_TEST(!a.try_deallocate(tagged.front().first));  // a double free is still caught
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(a.arena().check_invariants());
}

BOOST_AUTO_TEST_CASE(virtual_allocator_with_tag_0_offloaded_counts_no_bytes_in_use) {
  // The pool's slabs are tag 0: offloaded with it, its small blocks are no more in use than the
  // large ones, and a small free then changes nothing the figures show.
  alloy::virtual_allocator<host_vmm> a{host_vmm{{.granularity = granule}}};
  const block small1 = a.allocate(100, 8), small2 = a.allocate(200, 8), large = a.allocate(3_MiB, 256);
  const block other = a.allocate(5000, 8, tag{1});
  BOOST_REQUIRE((small1.ptr && small2.ptr && large.ptr && other.ptr));
  fill_pattern(small2, 2);
  fill_pattern(large, 3);
  fill_pattern(other, 4);
  const std::size_t in_use = a.bytes_in_use(), requested = a.requested_bytes();
  BOOST_TEST(a.offload(tag{0}) == offload_status::done);
  BOOST_TEST(a.bytes_in_use() == a.arena().bytes_in_use(), "only tag 1's block is in use");
  BOOST_TEST(a.bytes_in_use() < in_use);
  BOOST_TEST(a.requested_bytes() == requested);
  a.deallocate(small1);  // allowed while offloaded
  BOOST_TEST(a.bytes_in_use() == a.arena().bytes_in_use());
  BOOST_TEST(a.requested_bytes() == requested - 100);
  BOOST_TEST(a.allocate(100, 8).ptr == nullptr);
  BOOST_TEST(a.restore(tag{0}) == offload_status::done);
  BOOST_TEST(a.bytes_in_use() < in_use, "small1 went");
  BOOST_TEST(a.bytes_in_use() >= in_use - 1024);
  BOOST_TEST(has_pattern(small2, 2));
  BOOST_TEST(has_pattern(large, 3));
  BOOST_TEST(has_pattern(other, 4));
  for (const block b : {small2, large, other}) BOOST_TEST(a.try_deallocate(b));
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(a.arena().check_invariants());
}

BOOST_AUTO_TEST_CASE(introspection_shows_offloaded_ranges) {
  host_arena a{host_vmm{{.granularity = granule}}, {.release_threshold = 0, .keep_up_to_peak = false}};
  const block w = a.allocate(3 * granule + 1000, 256, tag{1});
  const block k = a.allocate(5000, 256, tag{0});
  const std::size_t w_rounded = 3 * granule + 1024, k_rounded = 5120;
  BOOST_TEST(a.offload(tag{1}) == offload_status::done);
  BOOST_TEST(a.bytes_in_use() == k_rounded);
  BOOST_TEST(a.offloaded_bytes() == w_rounded);
  BOOST_TEST(a.free_bytes() == a.reserved_bytes() - k_rounded);
  std::size_t offloaded = 0, allocated = 0, free = 0;
  a.for_each_block([&](const alloy::block_info& i) {
    if (i.state == alloy::block_state::offloaded) offloaded += i.size;
    if (i.state == alloy::block_state::allocated) allocated += i.size;
    if (i.state == alloy::block_state::free) free += i.size;
  });
  BOOST_TEST(offloaded == w_rounded);
  BOOST_TEST(allocated == k_rounded);
  BOOST_TEST(free == a.free_bytes());
  const alloy::memory_snapshot shot = alloy::snapshot(a);
  BOOST_TEST(shot.reserved_bytes() == a.reserved_bytes());
  BOOST_TEST(shot.used_bytes() == a.bytes_in_use());
  BOOST_TEST(shot.to_json().find("\"offloaded\"") != std::string::npos);
  {
    alloy::stats<host_arena> s{
        host_arena{host_vmm{{.granularity = granule}}, {.release_threshold = 0, .keep_up_to_peak = false}}};
    block x;
    {
      scoped_tag guard{s.inner(), tag{4}};  // a decorator on top: tagged from outside
      x = s.allocate(1000, 256);
    }
    BOOST_TEST(s.inner().offload(tag{4}) == offload_status::done);
    const std::string summary = alloy::memory_summary(s);
    BOOST_TEST(summary.find("Offloaded blocks: 1.0") != std::string::npos, summary);
    s.deallocate(x);
  }
  a.deallocate(w);  // freed while offloaded
  BOOST_TEST(a.offloaded_bytes() == 0u);
  BOOST_TEST(a.check_invariants());
  BOOST_TEST(a.restore(tag{1}) == offload_status::done);
  BOOST_TEST(a.bytes_in_use() == k_rounded);
  BOOST_TEST(a.mapped_bytes(tag{1}) == 0u);
  a.deallocate(k);
  BOOST_TEST(a.check_invariants());
}

BOOST_AUTO_TEST_CASE(a_pmr_container_is_tagged_from_outside) {
  host_arena a{host_vmm{{.granularity = granule}}, {.release_threshold = 0, .keep_up_to_peak = false}};
  alloy::pmr_resource resource{a};
  const block untagged = a.allocate(1000, 8);
  std::vector<std::uint32_t> expected;
  {
    scoped_tag guard{a, tag{7}};  // the container knows nothing of tags
    std::pmr::vector<std::uint32_t> weights{&resource};
    for (std::uint32_t i = 0; i < 100000; ++i) weights.push_back(i * 2654435761u);
    expected.assign(weights.begin(), weights.end());
    BOOST_TEST(a.live_bytes(tag{7}) >= weights.size() * sizeof(std::uint32_t));
    BOOST_TEST(a.live_bytes(tag{0}) == 1000u);
    const std::uint32_t* before = weights.data();
    BOOST_TEST(a.offload(tag{7}) == offload_status::done);
    BOOST_TEST(a.mapped_bytes(tag{7}) == 0u);
    BOOST_TEST(a.restore(tag{7}) == offload_status::done);
    BOOST_TEST(weights.data() == before);
    BOOST_TEST((std::vector<std::uint32_t>(weights.begin(), weights.end()) == expected));
  }
  a.deallocate(untagged);
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(a.check_invariants());
}

BOOST_AUTO_TEST_SUITE(offload_statistics_suite)

// stats<> reports offloads as LMS's reclaims: bytes unmapped, one tag a single reclaim, every tag
// a full one; reset_accumulated() starts them again from zero.
BOOST_AUTO_TEST_CASE(stats_reports_offloads_as_reclaims) {
  constexpr std::size_t granule = 64_KiB;
  alloy::stats<virtual_arena<host_vmm>> s{
      virtual_arena<host_vmm>{host_vmm{{.capacity = 4_MiB, .granularity = granule}}}};
  const block w = s.inner().allocate(3 * granule, 256, tag{1});  // three granules of tag 1
  const block c = s.inner().allocate(granule, 256, tag{2});      // one of tag 2
  BOOST_REQUIRE(w);
  BOOST_REQUIRE(c);
  BOOST_TEST(s.statistics().bytes_reclaimed == 0u);
  BOOST_TEST(s.inner().offload(tag{1}) == offload_status::done);
  alloy::statistics st = s.statistics();
  BOOST_TEST(st.bytes_reclaimed == 3 * granule);
  BOOST_TEST(st.num_single_reclaims == 1u);
  BOOST_TEST(st.num_full_reclaims == 0u);
  BOOST_TEST(s.inner().restore(tag{1}) == offload_status::done);
  s.reset_accumulated();
  BOOST_TEST(s.statistics().bytes_reclaimed == 0u);
  s.inner().offload_all();
  st = s.statistics();
  BOOST_TEST(st.bytes_reclaimed == 4 * granule);
  BOOST_TEST(st.num_full_reclaims == 1u);
  BOOST_TEST(s.inner().restore(tag{1}) == offload_status::done);
  BOOST_TEST(s.inner().restore(tag{2}) == offload_status::done);
  s.inner().deallocate(w);
  s.inner().deallocate(c);
}

BOOST_AUTO_TEST_SUITE_END()
