// SPDX-License-Identifier: Apache-2.0
// The bad-input matrix (test/support/bad_input.hpp) in an unchecked build: this
// program is compiled with ALLOY_CHECKED=0 (the suite-wide definition is replaced before anything
// is included; it is a program of its own, so no inline function is compiled both ways). Every
// answer must be the one the checked build gives: the misuse checks of docs/design.md#errors that
// the engines make are on in every build.
#undef ALLOY_CHECKED
#define ALLOY_CHECKED 0

#include "support/bad_input_cases.hpp"

static_assert(ALLOY_CHECKED == 0, "this program tests the unchecked build");

BOOST_AUTO_TEST_SUITE(bad_input_unchecked)
ALLOY_BAD_INPUT_ALL_CASES

// `sharded`'s thread caches take a small free without an engine's lookup; in every build they
// refuse one at an address no cached block has (docs/design.md#errors), so an interior pointer
// never reaches a cache to be handed out again.
BOOST_AUTO_TEST_CASE(sharded_cache_refuses_misaligned_small_frees) {
  using namespace alloy::literals;
  using inner = alloy::default_allocator<alloy::testing::checking_upstream>;
  const alloy::testing::checking_upstream up;
  {
    alloy::sharded<inner> a{[&](std::size_t) { return inner{up}; }, {.shards = 2}};
    const alloy::block b = a.allocate(1000, 16);
    BOOST_REQUIRE(b);
    alloy::testing::fill_pattern(b, 7);
    auto* p = static_cast<char*>(b.ptr);
    int on_stack = 0;
    for (const alloy::block bad : {alloy::block{p + 1, 999}, alloy::block{p + 16, 984}, alloy::block{p + 128, 872},
                                   alloy::block{&on_stack, sizeof on_stack}}) {
      if ((reinterpret_cast<std::uintptr_t>(bad.ptr) & 255) == 0) continue;  // the stack may be so aligned
      const std::size_t refused = a.refused_frees();
      BOOST_TEST(!a.try_deallocate(bad));
      BOOST_TEST(a.refused_frees() == refused + 1);
    }
    std::vector<alloy::block> later;
    for (int i = 0; i < 64; ++i) {
      const alloy::block c = a.allocate(1000, 16);
      BOOST_REQUIRE(c);
      const auto at = reinterpret_cast<std::uintptr_t>(c.ptr), start = reinterpret_cast<std::uintptr_t>(b.ptr);
      BOOST_TEST((at + c.size <= start || start + b.size <= at), "a block overlapping a live one was handed out");
      later.push_back(c);
    }
    BOOST_TEST(alloy::testing::has_pattern(b, 7));
    for (const alloy::block c : later) a.deallocate(c);
    a.deallocate(b);
  }
  BOOST_TEST(up.records()->live_count() == 0u);
}

// Without the checked build's record, a second free of the block freed last to the thread's cache
// for its size is still refused: taken, the block would be handed out twice.
BOOST_AUTO_TEST_CASE(sharded_cache_refuses_a_small_block_freed_twice_at_once) {
  using inner = alloy::default_allocator<alloy::testing::checking_upstream>;
  const alloy::testing::checking_upstream up;
  {
    alloy::sharded<inner> a{[&](std::size_t) { return inner{up}; }, {.shards = 2}};
    for (const std::size_t bytes : {std::size_t{256}, std::size_t{1000}, std::size_t{40000}}) {
      const alloy::block b = a.allocate(bytes, 256);
      BOOST_REQUIRE(b);
      a.deallocate(b);
      const std::size_t refused = a.refused_frees();
      BOOST_TEST(!a.try_deallocate(b), bytes << " bytes: the second free was taken");
      BOOST_TEST(a.refused_frees() == refused + 1);
      const alloy::block c = a.allocate(bytes, 256), d = a.allocate(bytes, 256);
      BOOST_REQUIRE((c && d));
      BOOST_TEST(c.ptr != d.ptr, bytes << " bytes: one block handed out twice");
      a.deallocate(c);
      a.deallocate(d);
    }
  }
  BOOST_TEST(up.records()->live_count() == 0u);
}

// Nor does a cache take another allocator's small block (256-aligned, of a cached size): no small
// block this allocator handed out ever started there.
BOOST_AUTO_TEST_CASE(sharded_cache_refuses_another_allocators_small_block) {
  using inner = alloy::default_allocator<alloy::testing::checking_upstream>;
  const alloy::testing::checking_upstream up, elsewhere_up;
  {
    alloy::sharded<inner> a{[&](std::size_t) { return inner{up}; }, {.shards = 2}};
    alloy::sharded<inner> b{[&](std::size_t) { return inner{elsewhere_up}; }, {.shards = 1}};
    alignas(256) static unsigned char elsewhere[1 << 16];
    std::vector<alloy::block> mine, theirs;
    for (std::size_t i = 0; i < 64; ++i) {
      mine.push_back(a.allocate(256 + i * 512, 256));
      theirs.push_back(b.allocate(256 + i * 512, 256));
      BOOST_REQUIRE(mine.back() && theirs.back());
    }
    for (const alloy::block x : theirs) BOOST_TEST(!a.try_deallocate(x));
    BOOST_TEST(!a.try_deallocate(alloy::block{elsewhere, 300}));
    BOOST_TEST(a.refused_frees() == theirs.size() + 1);
    for (const alloy::block x : mine) BOOST_TEST(a.try_deallocate(x));  // its own go to the caches
    std::vector<alloy::block> again;
    for (std::size_t round = 0; round < 2; ++round) {  // past the blocks just cached: none refused
      for (std::size_t i = 0; i < 64; ++i) {
        const alloy::block x = a.allocate(256 + i * 512, 256);
        BOOST_REQUIRE(x);
        BOOST_TEST(x.ptr != static_cast<void*>(elsewhere));
        for (const alloy::block t : theirs) BOOST_TEST_REQUIRE(x.ptr != t.ptr);
        again.push_back(x);
      }
    }
    for (const alloy::block x : again) a.deallocate(x);
    for (const alloy::block x : theirs) b.deallocate(x);
    BOOST_TEST(a.refused_frees() == theirs.size() + 1);
    BOOST_TEST(b.refused_frees() == 0u);
  }
  BOOST_TEST(up.records()->live_count() == 0u);
  BOOST_TEST(elsewhere_up.records()->live_count() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
