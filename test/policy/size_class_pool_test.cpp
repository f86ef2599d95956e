// SPDX-License-Identifier: Apache-2.0
// size_class_pool: class layout, conformance, a model-based randomized test, slab handling,
// failing upstreams and misuse.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include <alloy/detail/edge.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/upstream/host_upstream.hpp>

#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;
using alloy::testing::failing_upstream;

namespace {

template <class Classes>
std::vector<std::size_t> all_sizes() {
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < Classes::count; ++i) sizes.push_back(Classes::size(i));
  return sizes;
}

/// The smallest class >= bytes, by linear search (the reference for `index`).
template <class Classes>
std::size_t reference_index(std::size_t bytes) {
  for (std::size_t i = 0; i < Classes::count; ++i) {
    if (Classes::size(i) >= bytes) return i;
  }
  return Classes::count;
}

template <class Classes>
void check_index_exhaustively() {
  for (std::size_t bytes = 0; bytes <= Classes::max_size; ++bytes) {
    if (Classes::index(bytes) != reference_index<Classes>(bytes)) {
      BOOST_TEST(Classes::index(bytes) == reference_index<Classes>(bytes), "index(" << bytes << ")");
      return;
    }
  }
}

}  // namespace

namespace recipes {

// The default layout (classes up to 1 MiB): conformance within its range.
struct pool_default {
  template <class U>
  using type = alloy::size_class_pool<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up)};
  }
  static alloy::testing::conformance_options options() {
    return {.max_size = 1_MiB, .random_max_size = 512_KiB};  // 512 KiB + alignment slack fits 1 MiB
  }
};

// Classes up to 64 MiB and small first slabs: the whole suite, failure matrix included.
struct pool_wide {
  template <class U>
  using type = alloy::size_class_pool<U, alloy::power2_classes<4, 256, 64_MiB>>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up), {.slab_size = 4_MiB, .initial_slab_size = 64_KiB}};
  }
  static alloy::testing::conformance_options options() { return {.max_size = 64_MiB}; }
};

}  // namespace recipes

BOOST_AUTO_TEST_SUITE(size_class_pool)

// ---- class layout ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(default_layout_exact) {
  using classes = alloy::power2_classes<>;
  const std::vector<std::size_t> sizes = all_sizes<classes>();
  const std::vector<std::size_t> head = {256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120};
  BOOST_TEST(std::vector<std::size_t>(sizes.begin(), sizes.begin() + 13) == head, boost::test_tools::per_element());
  const std::vector<std::size_t> tail = {512_KiB, 640_KiB, 768_KiB, 896_KiB, 1_MiB};
  BOOST_TEST(std::vector<std::size_t>(sizes.end() - 5, sizes.end()) == tail, boost::test_tools::per_element());
  BOOST_TEST(classes::count == 44u);  // 256; 512, 768; then 4 per octave from 1 KiB to 512 KiB; 1 MiB
  for (std::size_t s : sizes) BOOST_TEST(s % 256 == 0u);
  BOOST_TEST(std::is_sorted(sizes.begin(), sizes.end()));
  BOOST_TEST(classes::index(0) == 0u);
  BOOST_TEST(classes::index(1) == 0u);
  BOOST_TEST(classes::index(256) == 0u);
  BOOST_TEST(classes::index(257) == 1u);
  BOOST_TEST(classes::size(classes::index(1024)) == 1024u);
  BOOST_TEST(classes::size(classes::index(1025)) == 1280u);
  BOOST_TEST(classes::size(classes::index(1280)) == 1280u);
  BOOST_TEST(classes::size(classes::index(1281)) == 1536u);
  BOOST_TEST(classes::size(classes::index(1792)) == 1792u);
  BOOST_TEST(classes::size(classes::index(1793)) == 2048u);
  BOOST_TEST(classes::size(classes::index(1_MiB)) == 1_MiB);
  BOOST_TEST(classes::index(1_MiB) == classes::count - 1);
  check_index_exhaustively<classes>();
}

BOOST_AUTO_TEST_CASE(other_layouts_exact) {
  using plain = alloy::power2_classes<1, 256, 4096>;
  BOOST_TEST(all_sizes<plain>() == (std::vector<std::size_t>{256, 512, 1024, 2048, 4096}),
             boost::test_tools::per_element());
  using two = alloy::power2_classes<2, 512, 8192>;
  BOOST_TEST(all_sizes<two>() == (std::vector<std::size_t>{512, 1024, 1536, 2048, 3072, 4096, 6144, 8192}),
             boost::test_tools::per_element());
  using eight = alloy::power2_classes<8, 256, 4096>;
  BOOST_TEST(all_sizes<eight>() == (std::vector<std::size_t>{256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2304, 2560,
                                                             2816, 3072, 3328, 3584, 3840, 4096}),
             boost::test_tools::per_element());
  check_index_exhaustively<plain>();
  check_index_exhaustively<two>();
  check_index_exhaustively<eight>();
  check_index_exhaustively<alloy::power2_classes<16, 256, 256_KiB>>();
  using wide = alloy::power2_classes<4, 256, 64_MiB>;
  for (std::size_t bytes : {64_MiB, 64_MiB - 1, 48_MiB + 1, 40_MiB, 2_MiB + 5, 33_MiB}) {
    BOOST_TEST(wide::index(bytes) == reference_index<wide>(bytes), bytes);
  }
}

// ---- conformance -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(conformance_default_classes) {
  alloy::testing::conformance_suite_checked<recipes::pool_default>();
}

BOOST_AUTO_TEST_CASE(conformance_wide_classes) { alloy::testing::conformance_suite<recipes::pool_wide>(); }

// ---- behaviour ---------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(requests_above_the_largest_class_fail) {
  alloy::size_class_pool<checking_upstream> pool;
  BOOST_TEST(!pool.allocate(1_MiB + 1, 256));
  BOOST_TEST(!pool.allocate(1_MiB - 255, 512), "alignment slack takes it past the largest class");
  BOOST_TEST(!pool.allocate(100, 2_MiB));
  BOOST_TEST(pool.counters().num_ooms == 0u, "a refusal by contract is not an OOM");
  BOOST_TEST(pool.reserved_bytes() == 0u);
  const alloy::block b = pool.allocate(1_MiB, 1);
  BOOST_REQUIRE(b);
  pool.deallocate(b);
}

BOOST_AUTO_TEST_CASE(slabs_are_whole_numbers_of_blocks) {
  alloy::size_class_pool<checking_upstream> pool;
  const auto& records = *pool.upstream().records();
  const alloy::block a = pool.allocate(700_KiB, 256);  // class 768 KiB: two per 2 MiB -> 1.5 MiB slab
  BOOST_REQUIRE(a);
  BOOST_TEST(pool.reserved_bytes() == 1536_KiB);
  BOOST_TEST(records.live_bytes == 1536_KiB);
  const alloy::block b = pool.allocate(300, 256);  // class 512: 4096 per 2 MiB
  BOOST_REQUIRE(b);
  BOOST_TEST(pool.reserved_bytes() == 1536_KiB + 2_MiB);
  BOOST_TEST(pool.slab_count() == 2u);
  BOOST_TEST(pool.counters().num_device_alloc == 2u);
  pool.deallocate(a);
  pool.deallocate(b);
  BOOST_TEST(pool.reserved_bytes() == 1536_KiB + 2_MiB, "free slabs are cached until release()");
  pool.release();
  BOOST_TEST(pool.reserved_bytes() == 0u);
  BOOST_TEST(records.live_count() == 0u);
  BOOST_TEST(pool.counters().num_device_free == 2u);
}

// The filter a composition sharing the upstream asks before it looks a block up among the slabs
// (virtual_allocator): never "no" for a size a slab had, "no" for most others.
BOOST_AUTO_TEST_CASE(slab_size_filter_knows_every_slab_size_taken) {
  alloy::size_class_pool<checking_upstream> pool;
  BOOST_TEST(!pool.may_hold_slab_of(2_MiB), "no slab yet");
  const alloy::block a = pool.allocate(700_KiB, 256);  // a slab of 1.5 MiB
  const alloy::block b = pool.allocate(300, 256);      // a slab of 2 MiB
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(b);
  BOOST_TEST(pool.may_hold_slab_of(1536_KiB));
  BOOST_TEST(pool.may_hold_slab_of(2_MiB));
  std::size_t maybe = 0, sizes = 0;
  for (std::size_t bytes = 256; bytes <= 2_MiB + 256; bytes += 256) {
    if (bytes == 1536_KiB || bytes == 2_MiB) continue;
    ++sizes;
    if (pool.may_hold_slab_of(bytes)) ++maybe;
  }
  BOOST_TEST(maybe * 16 < sizes, maybe << " of " << sizes << " other sizes pass the filter (two of its 64 bits set)");
  BOOST_TEST(!pool.may_hold_slab_of(2_MiB + 1), "a bit no slab size has");
  BOOST_TEST(!pool.may_hold_slab_of(4_MiB), "a bit no slab size has");
  pool.deallocate(a);
  pool.deallocate(b);
  pool.release();
  const alloy::size_class_pool<checking_upstream> moved{std::move(pool)};
  BOOST_TEST(moved.may_hold_slab_of(2_MiB), "the filter is never cleared, and moves with the pool");
}

BOOST_AUTO_TEST_CASE(slabs_grow_from_initial_size) {
  using pool_t = alloy::size_class_pool<checking_upstream>;
  pool_t pool{checking_upstream{}, {.slab_size = 256_KiB, .initial_slab_size = 8_KiB}};
  const auto records = pool.upstream().records();
  std::vector<alloy::block> blocks;
  // Class 1024: slabs of 8, 16, 32, ..., 256 KiB (8, 16, 32, ..., 256 blocks).
  std::vector<std::size_t> expected_reserved;
  std::size_t reserved = 0;
  for (std::size_t slab = 8_KiB; slab <= 256_KiB; slab *= 2) {
    for (std::size_t i = 0; i < slab / 1024; ++i) blocks.push_back(pool.allocate(1000, 256));
    reserved += slab;
    BOOST_TEST(pool.reserved_bytes() == reserved);
  }
  blocks.push_back(pool.allocate(1000, 256));
  BOOST_TEST(pool.reserved_bytes() == reserved + 256_KiB, "growth stops at slab_size");
  const alloy::size_class_usage use = pool.usage(pool_t::class_index(1000));
  BOOST_TEST(use.class_size == 1024u);
  BOOST_TEST(use.blocks_in_use == blocks.size());
  BOOST_TEST(use.requested_bytes == 1000 * blocks.size());
  BOOST_TEST(use.rounded_bytes == 1024 * blocks.size());
  BOOST_TEST(use.internal_waste() == 24 * blocks.size());
  BOOST_TEST(use.slabs == 7u);
  BOOST_TEST(use.reserved_bytes == pool.reserved_bytes());
  BOOST_TEST(pool.bytes_in_use() == use.rounded_bytes);
  BOOST_TEST(pool.requested_bytes() == use.requested_bytes);
  for (const alloy::block& b : blocks) pool.deallocate(b);
  BOOST_TEST(pool.bytes_in_use() == 0u);
  pool.release();
  BOOST_TEST(records->live_count() == 0u);
}

BOOST_AUTO_TEST_CASE(freed_blocks_are_reused_most_recent_first) {
  alloy::size_class_pool<checking_upstream> pool;
  const alloy::block a = pool.allocate(1000, 256);
  const alloy::block b = pool.allocate(1000, 256);
  BOOST_TEST(static_cast<char*>(b.ptr) - static_cast<char*>(a.ptr) == 1024);
  pool.deallocate(a);
  const alloy::block c = pool.allocate(900, 256);  // same class
  BOOST_TEST(c.ptr == a.ptr);
  BOOST_TEST(c.size == 900u);
  pool.deallocate(b);
  pool.deallocate(c);
  BOOST_TEST(pool.counters().num_device_alloc == 1u);
}

BOOST_AUTO_TEST_CASE(large_alignments) {
  alloy::size_class_pool<checking_upstream> pool;
  std::vector<alloy::testing::live_block> live;
  std::uint64_t id = 1;
  for (std::size_t alignment = 512; alignment <= 64_KiB; alignment *= 2) {
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{300}, alignment, 3 * alignment + 1}) {
      const alloy::block b = pool.allocate(bytes, alignment);
      BOOST_REQUIRE(b);
      BOOST_TEST(alloy::detail::is_aligned(b.ptr, alignment));
      BOOST_TEST(pool.owns(b));
      alloy::testing::fill_pattern(b, id);
      live.push_back({b, id++, alignment});
    }
  }
  BOOST_TEST(!alloy::testing::any_overlap(live));
  alloy::testing::give_back(pool, live);
  BOOST_TEST(pool.bytes_in_use() == 0u);
  BOOST_TEST(pool.misuse_count() == 0u);
  pool.release();
  BOOST_TEST(pool.reserved_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(introspection_reports_every_block) {
  alloy::size_class_pool<checking_upstream> pool{checking_upstream{}, {.slab_size = 64_KiB}};
  const alloy::block a = pool.allocate(1000, 256);
  const alloy::block b = pool.allocate(10, 256);
  std::size_t pieces = 0, allocated = 0, bytes = 0;
  std::set<const void*> segments;
  const void* last = nullptr;
  bool ordered = true;
  pool.for_each_block([&](const alloy::block_info& info) {
    ++pieces;
    bytes += info.size;
    segments.insert(info.segment);
    if (info.segment == last) {
    } else if (last != nullptr && info.segment < last) {
      ordered = false;
    }
    last = info.segment;
    if (info.state == alloy::block_state::allocated) {
      ++allocated;
      BOOST_TEST((info.ptr == a.ptr || info.ptr == b.ptr));
      BOOST_TEST(info.requested == (info.ptr == a.ptr ? 1000u : 10u));
      BOOST_TEST(info.size == (info.ptr == a.ptr ? 1024u : 256u));
    }
  });
  BOOST_TEST(ordered);
  BOOST_TEST(segments.size() == 2u);
  BOOST_TEST(pieces == 64u + 256u);
  BOOST_TEST(allocated == 2u);
  BOOST_TEST(bytes == pool.reserved_bytes());
  pool.deallocate(a);
  // A wholly free slab reads as one free block (it goes back whole before a request fails), so
  // the largest free block is the slab, not one of its slots.
  std::vector<alloy::block_info> seen;
  pool.for_each_block([&](const alloy::block_info& info) {
    if (info.segment == a.ptr) seen.push_back(info);
  });
  BOOST_TEST_REQUIRE(seen.size() == 1u);
  BOOST_TEST(seen[0].ptr == a.ptr);
  BOOST_TEST(seen[0].size == 64_KiB);
  BOOST_TEST(seen[0].segment_size == 64_KiB);
  BOOST_TEST((seen[0].state == alloy::block_state::free));
  const alloy::detail::free_space space = alloy::detail::measure_free_space(pool);
  BOOST_TEST(space.largest == 64_KiB);
  BOOST_TEST(space.free_bytes == pool.reserved_bytes() - 256u);
  pool.deallocate(b);
}

// ---- failing upstreams -------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(failing_upstream_gives_empty_blocks_and_counts) {
  failing_upstream up{{.fail_from = 0}};
  alloy::size_class_pool<failing_upstream> pool{up};
  BOOST_TEST(!pool.allocate(100, 256));
  BOOST_TEST(pool.counters().num_ooms == 1u);
  BOOST_TEST(pool.counters().num_alloc_retries == 1u);
  BOOST_TEST(up.calls() == 2u, "one retry after releasing");
  up.set_options({});
  const alloy::block b = pool.allocate(100, 256);
  BOOST_REQUIRE(b);
  BOOST_TEST(pool.counters().num_device_alloc == 1u);
  pool.deallocate(b);
}

BOOST_AUTO_TEST_CASE(allocate_keeping_cache_never_releases) {
  failing_upstream up;
  alloy::size_class_pool<failing_upstream> pool{up};
  const auto records = up.records();
  const alloy::block a = pool.allocate_keeping_cache(5000, 256);
  BOOST_REQUIRE(a);
  pool.deallocate(a);  // a wholly free slab
  up.set_options({.fail_from = up.calls()});
  BOOST_TEST(!pool.allocate_keeping_cache(100, 256));  // needs a slab of another class
  BOOST_TEST(pool.slab_count() == 1u);
  BOOST_TEST(records->live_count() == 1u);
  BOOST_TEST(pool.counters().num_alloc_retries == 0u);
  BOOST_TEST(pool.counters().num_ooms == 0u);
  const alloy::block again = pool.allocate_keeping_cache(5000, 256);  // its own class: cached
  BOOST_TEST(again.ptr == a.ptr);
  pool.deallocate(again);
  pool.release();
  BOOST_TEST(records->live_count() == 0u);
}

BOOST_AUTO_TEST_CASE(failing_upstream_releases_free_slabs_and_retries) {
  failing_upstream up;
  alloy::size_class_pool<failing_upstream> pool{up};
  const auto records = up.records();
  const alloy::block a = pool.allocate(5000, 256);  // class 5120: one slab
  BOOST_REQUIRE(a);
  pool.deallocate(a);  // the slab is now wholly free, but cached
  up.set_options({.fail_at = {up.calls()}});
  const alloy::block b = pool.allocate(100, 256);  // class 256 needs a slab: fails, release, retry
  BOOST_REQUIRE(b);
  BOOST_TEST(pool.counters().num_alloc_retries == 1u);
  BOOST_TEST(pool.counters().num_device_free == 1u);
  BOOST_TEST(pool.counters().num_ooms == 0u);
  BOOST_TEST(pool.slab_count() == 1u);
  BOOST_TEST(records->live_count() == 1u);
  // The class whose slab went must take a fresh one.
  const alloy::block c = pool.allocate(5000, 256);
  BOOST_REQUIRE(c);
  BOOST_TEST(pool.slab_count() == 2u);
  pool.deallocate(b);
  pool.deallocate(c);
  pool.release();
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

// ---- misuse (tests build with ALLOY_CHECKED=1) ------------------------------------------------

namespace {
void count_misuse(alloy::pool_misuse, alloy::block, void* context) noexcept { ++*static_cast<std::size_t*>(context); }
}  // namespace

BOOST_AUTO_TEST_CASE(misuse_is_refused_and_leaves_the_pool_consistent) {
  std::size_t reported = 0;
  using pool_t = alloy::size_class_pool<checking_upstream>;
  pool_t pool{checking_upstream{}, {.on_misuse = count_misuse, .misuse_context = &reported}};
  const alloy::block a = pool.allocate(1000, 256);
  const alloy::block b = pool.allocate(1000, 256);
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(b);
  int on_stack = 0;
  pool.deallocate({&on_stack, sizeof on_stack});
  BOOST_TEST((pool.last_misuse() == alloy::pool_misuse::foreign_pointer));
  pool.deallocate({a.ptr, 999});
  BOOST_TEST((pool.last_misuse() == alloy::pool_misuse::wrong_size));
  pool.deallocate({a.ptr, 2000});  // another class
  BOOST_TEST((pool.last_misuse() == alloy::pool_misuse::wrong_size));
  pool.deallocate({static_cast<char*>(a.ptr) + 512, 1000});  // inside a block, not at its start
  BOOST_TEST((pool.last_misuse() == alloy::pool_misuse::foreign_pointer));
  pool.deallocate(a);
  BOOST_TEST(pool.misuse_count() == 4u);
  pool.deallocate(a);  // double free
  BOOST_TEST((pool.last_misuse() == alloy::pool_misuse::double_free));
  BOOST_TEST(pool.misuse_count() == 5u);
  BOOST_TEST(reported == 5u);
  BOOST_TEST(pool.bytes_in_use() == 1024u, "refused frees change nothing");
  BOOST_TEST(pool.requested_bytes() == 1000u);
  // Still consistent: a is handed out once more, b keeps its place.
  const alloy::block c = pool.allocate(1000, 256);
  const alloy::block d = pool.allocate(1000, 256);
  BOOST_TEST(c.ptr == a.ptr);
  BOOST_TEST(d.ptr != a.ptr);
  BOOST_TEST(d.ptr != b.ptr);
  pool.deallocate(b);
  pool.deallocate(c);
  pool.deallocate(d);
  BOOST_TEST(pool.misuse_count() == 5u);
  pool.release();
  BOOST_TEST(pool.reserved_bytes() == 0u);
}

// An interior pointer is refused, not taken for a block start that leaves room for the size
// (which would hand the live block out again).
BOOST_AUTO_TEST_CASE(an_interior_pointer_is_refused_and_the_block_stays_live) {
  std::size_t reported = 0;
  alloy::size_class_pool<checking_upstream> pool{checking_upstream{},
                                                 {.on_misuse = count_misuse, .misuse_context = &reported}};
  const alloy::block d = pool.allocate(100, 16);
  BOOST_REQUIRE(d);
  pool.deallocate({static_cast<char*>(d.ptr) + 16, 100});
  BOOST_TEST((pool.last_misuse() == alloy::pool_misuse::foreign_pointer));
  BOOST_TEST(pool.misuses().foreign_pointers == 1u);
  BOOST_TEST(reported == 1u);
  BOOST_TEST(pool.bytes_in_use() == 256u);
  const alloy::block e = pool.allocate(100, 16);
  BOOST_TEST(e.ptr != d.ptr, "the live block must not be handed out again");
  pool.deallocate(e);
  pool.deallocate(d);
  BOOST_TEST(pool.misuse_count() == 1u);
  BOOST_TEST(pool.bytes_in_use() == 0u);
}

// Every pointer that is not a live block's start, at every 16-byte step of the slots around live
// blocks of every alignment from 1 to 64 KiB, is refused; the blocks' own frees are accepted.
BOOST_AUTO_TEST_CASE(every_interior_pointer_of_every_alignment_is_refused) {
  std::size_t reported = 0;
  alloy::size_class_pool<checking_upstream> pool{checking_upstream{},
                                                 {.on_misuse = count_misuse, .misuse_context = &reported}};
  std::mt19937_64 rng(18);
  std::vector<alloy::block> live;
  std::size_t expected_refusals = 0;
  for (int round = 0; round < 300; ++round) {
    const std::size_t alignment = std::size_t{1} << std::uniform_int_distribution<int>(0, 16)(rng);
    const std::size_t bytes = std::uniform_int_distribution<std::size_t>(0, 3000)(rng);
    const alloy::block b = pool.allocate(bytes, alignment);
    BOOST_REQUIRE(b);
    BOOST_REQUIRE(alloy::detail::is_aligned(b.ptr, alignment));
    live.push_back(b);
    // A few interior pointers of this block, and one step before it (inside its slot or the
    // previous one), each with the block's own size.
    for (std::size_t step : {std::size_t{16}, std::size_t{256}, std::size_t{240}}) {
      if (step >= std::max<std::size_t>(b.size, 1)) continue;
      pool.deallocate({static_cast<char*>(b.ptr) + step, b.size});
      ++expected_refusals;
    }
    pool.deallocate({static_cast<char*>(b.ptr) - 16, b.size});
    ++expected_refusals;
    if (b.size > 0) {
      pool.deallocate({b.ptr, b.size - 1});  // wrong size
      ++expected_refusals;
    }
    BOOST_REQUIRE(pool.misuse_count() == expected_refusals);
    if (round % 3 == 2) {  // free one at random, validly
      const std::size_t at = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      pool.deallocate(live[at]);
      BOOST_REQUIRE(pool.misuse_count() == expected_refusals);
      pool.deallocate(live[at]);  // and once more: a double free
      ++expected_refusals;
      BOOST_REQUIRE((pool.last_misuse() == alloy::pool_misuse::double_free));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }
  BOOST_TEST(reported == expected_refusals);
  // No live block was disturbed: every one is freed exactly once without a refusal.
  std::size_t requested = 0;
  for (const alloy::block& b : live) requested += b.size;
  BOOST_TEST(pool.requested_bytes() == requested);
  for (const alloy::block& b : live) pool.deallocate(b);
  BOOST_TEST(pool.misuse_count() == expected_refusals);
  BOOST_TEST(pool.bytes_in_use() == 0u);
  BOOST_TEST(pool.requested_bytes() == 0u);
}

// ---- model-based randomized test ---------------------------------------------------------------

namespace {

// Patterns on the head and tail of each block (whole blocks are checked by the conformance
// suite); keeps a million operations fast under the sanitizers.
constexpr std::size_t stripe = 64;

void stamp(alloy::block b, std::uint64_t id) {
  if (b.size <= 2 * stripe) return alloy::testing::fill_pattern(b, id);
  alloy::testing::fill_pattern({b.ptr, stripe}, id);
  alloy::testing::fill_pattern({static_cast<char*>(b.ptr) + b.size - stripe, stripe}, ~id);
}
bool stamped(alloy::block b, std::uint64_t id) {
  if (b.size <= 2 * stripe) return alloy::testing::has_pattern(b, id);
  return alloy::testing::has_pattern({b.ptr, stripe}, id) &&
         alloy::testing::has_pattern({static_cast<char*>(b.ptr) + b.size - stripe, stripe}, ~id);
}

struct model_block {
  alloy::block b;
  std::uint64_t id;
};

template <class Pool>
void check_against_model(const Pool& pool, const std::map<const char*, model_block>& live,
                         const alloy::testing::ledger& records) {
  std::size_t in_use = 0, requested = 0;
  for (const auto& [p, m] : live) {
    requested += m.b.size;
    in_use += Pool::class_size(Pool::class_index(m.b.size));  // alignment <= 256 in this test
  }
  BOOST_TEST(pool.bytes_in_use() == in_use);
  BOOST_TEST(pool.requested_bytes() == requested);
  BOOST_TEST(pool.reserved_bytes() == records.live_bytes);
  std::size_t allocated = 0, pieces_bytes = 0, found = 0;
  pool.for_each_block([&](const alloy::block_info& info) {
    pieces_bytes += info.size;
    if (info.state != alloy::block_state::allocated) return;
    ++allocated;
    const auto it = live.find(static_cast<const char*>(info.ptr));
    if (it != live.end() && it->second.b.size == info.requested) ++found;
  });
  BOOST_TEST(allocated == live.size());
  BOOST_TEST(found == live.size());
  BOOST_TEST(pieces_bytes == pool.reserved_bytes());
}

}  // namespace

BOOST_AUTO_TEST_CASE(model_based_randomized) {
  using pool_t = alloy::size_class_pool<checking_upstream, alloy::power2_classes<4, 256, 256_KiB>>;
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    pool_t pool{checking_upstream{}, {.slab_size = 512_KiB, .initial_slab_size = 16_KiB}};
    const auto records = pool.upstream().records();
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> log_size(0.0, std::log2(256.0 * 1024));
    std::map<const char*, model_block> live;  // by address: overlap checks with neighbours
    std::vector<const char*> order;           // for picking random victims
    std::uint64_t next_id = 1;
    std::size_t target_live = 500;
    constexpr std::size_t ops = 400'000;
    for (std::size_t op = 0; op < ops; ++op) {
      if (op % 50'000 == 0) target_live = 1 + rng() % 2000;  // swings make slabs go wholly free
      const bool grow = order.empty() || (order.size() < target_live ? rng() % 4 != 0 : rng() % 4 == 0);
      if (grow) {
        const std::size_t bytes = rng() % 64 == 0 ? 0 : static_cast<std::size_t>(std::exp2(log_size(rng)));
        const std::size_t alignment = std::size_t{1} << (rng() % 9);
        const alloy::block b = pool.allocate(bytes, alignment);
        BOOST_REQUIRE(b);
        BOOST_REQUIRE(b.size == bytes);
        BOOST_REQUIRE(alloy::detail::is_aligned(b.ptr, alignment));
        const char* p = static_cast<const char*>(b.ptr);
        const auto next = live.lower_bound(p);
        BOOST_REQUIRE((next == live.end() || p + std::max<std::size_t>(bytes, 1) <= next->first));
        if (next != live.begin()) {
          const auto prev = std::prev(next);
          BOOST_REQUIRE(prev->first + std::max<std::size_t>(prev->second.b.size, 1) <= p);
        }
        stamp(b, next_id);
        live.emplace(p, model_block{b, next_id++});
        order.push_back(p);
      } else {
        const std::size_t victim = rng() % order.size();
        const auto it = live.find(order[victim]);
        BOOST_REQUIRE(stamped(it->second.b, it->second.id));
        pool.deallocate(it->second.b);
        live.erase(it);
        order[victim] = order.back();
        order.pop_back();
      }
      if (op % 20'000 == 0) {
        check_against_model(pool, live, *records);
        pool.release();
        // After release every slab holds at least one live block.
        std::map<const void*, std::size_t> live_per_slab;
        pool.for_each_block([&](const alloy::block_info& info) {
          live_per_slab[info.segment] += info.state == alloy::block_state::allocated;
        });
        for (const auto& [slab, n] : live_per_slab) BOOST_TEST(n > 0u, "a wholly free slab survived release()");
        check_against_model(pool, live, *records);
      }
    }
    for (const auto& [p, m] : live) {
      BOOST_TEST(stamped(m.b, m.id));
      pool.deallocate(m.b);
    }
    BOOST_TEST(pool.bytes_in_use() == 0u);
    BOOST_TEST(pool.misuse_count() == 0u);
    pool.release();
    BOOST_TEST(pool.reserved_bytes() == 0u);
    BOOST_TEST(records->live_count() == 0u);
    BOOST_TEST(records->errors.empty());
    BOOST_TEST(pool.counters().num_device_alloc == pool.counters().num_device_free);
  }
}

BOOST_AUTO_TEST_CASE(moved_pool_keeps_its_slabs) {
  alloy::size_class_pool<checking_upstream> first;
  const auto records = first.upstream().records();
  const alloy::block a = first.allocate(1000, 256);
  alloy::size_class_pool<checking_upstream> second{std::move(first)};
  BOOST_TEST(second.owns(a));
  second.deallocate(a);
  BOOST_TEST(second.bytes_in_use() == 0u);
  second.release();
  BOOST_TEST(records->live_count() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
