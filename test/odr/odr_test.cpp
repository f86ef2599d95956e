// SPDX-License-Identifier: Apache-2.0
// Two translation units (this one and second_tu.cpp) include every public header and are linked
// into one program (fmt's model): a non-inline definition in a header fails the link. Blocks are
// then allocated in one unit and freed in the other, through the same allocator objects, and the
// statistics must agree exactly, so both units' instantiations are the same code on the same data.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <random>
#include <vector>

#include "all_headers.hpp"

namespace {

template <class Alloc, class FreeHere>
void cross_unit_workload(Alloc& a, std::size_t max_bytes, FreeHere free_here) {
  std::mt19937_64 rng{20261124};
  std::vector<alloy::block> live;
  for (int step = 0; step < 2000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t bytes = 1 + rng() % max_bytes;
      const bool second = rng() % 2 == 0;
      const alloy::block b = second ? odr_check::allocate_in_second(a, bytes) : a.allocate(bytes, 256);
      BOOST_REQUIRE(b);
      BOOST_TEST(b.size == bytes);
      static_cast<unsigned char*>(b.ptr)[0] = static_cast<unsigned char>(step);
      static_cast<unsigned char*>(b.ptr)[bytes - 1] = static_cast<unsigned char>(step);
      live.push_back(b);
    } else {
      const std::size_t i = rng() % live.size();
      const alloy::block b = live[i];
      live[i] = live.back();
      live.pop_back();
      if (rng() % 2 == 0) {
        free_here(b);
      } else {
        odr_check::free_in_second(a, b);
      }
    }
  }
  for (const alloy::block b : live) odr_check::free_in_second(a, b);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(odr)

BOOST_AUTO_TEST_CASE(stats_over_an_arena_agrees_across_units) {
  odr_check::arena_t a;
  std::size_t here = 0;
  cross_unit_workload(a, 1 << 16, [&](alloy::block b) {
    a.deallocate(b);
    ++here;
  });
  const alloy::statistics s = a.statistics();
  BOOST_TEST(s.num_allocs == odr_check::num_allocs_in_second(a));
  BOOST_TEST(s.bytes_in_use == 0u);
  BOOST_TEST(a.inner().bytes_in_use() == 0u);
  BOOST_TEST(here > 0u);
}

BOOST_AUTO_TEST_CASE(caching_allocator_agrees_across_units) {
  odr_check::caching_t a;
  cross_unit_workload(a, 3 << 20, [&](alloy::block b) { a.deallocate(b); });
  BOOST_TEST(a.small().bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(quantizer_agrees_across_units) {
  odr_check::quantized_t a;
  cross_unit_workload(a, 4000, [&](alloy::block b) { BOOST_TEST(a.try_deallocate(b)); });
  BOOST_TEST(a.requested_bytes() == 0u);
  for (std::size_t n : {0u, 1u, 255u, 256u, 257u, 4097u})
    BOOST_TEST(odr_check::round_up_in_second(n, 256) == alloy::detail::round_up(n, 256));
}

BOOST_AUTO_TEST_SUITE_END()
