// SPDX-License-Identifier: Apache-2.0
// test/support/edge_cases.hpp: the compositions the edges' bad-input tests (Thrust, cuda::mr) run
// through, one test case each: `ALLOY_EDGE_BAD_INPUT_CASES(check)` defines them in the suite the
// including file opens, each calling `check(a, name)` on its composition over a
// `checking_upstream`; after it, the upstream must have seen no misuse and have every byte back.
#pragma once

#include <string>

#include <boost/test/unit_test.hpp>

#include <alloy/alloy.hpp>
#include <alloy/showcase.hpp>

#include "checking_upstream.hpp"

namespace alloy::testing::edge_cases {

using arena = best_fit_arena<checking_upstream>;

inline auto stats_limited_arena(const checking_upstream& up) {
  return stats<limited<arena>>{limited<arena>{arena{up}, {.bytes_limit = std::size_t{64} << 20}}};
}
inline auto tracked_default_allocator(const checking_upstream& up) {
  return tracked<default_allocator<checking_upstream>>{default_allocator<checking_upstream>{up}};
}
inline auto synchronized_stats_caching_allocator(const checking_upstream& up) {
  return synchronized<stats<caching_allocator<checking_upstream>>>{
      stats<caching_allocator<checking_upstream>>{caching_allocator<checking_upstream>{up}}};
}

/// `check(a, name)` on `make(up)`, then the upstream's account of it.
template <class Make, class Check>
void run(Make make, Check check, const std::string& name) {
  checking_upstream up;
  {
    auto a = make(up);
    check(a, name);
  }
  BOOST_TEST(up.records()->errors.empty(), name << ": upstream saw misuse");
  BOOST_TEST(up.records()->live_count() == 0u, name << ": upstream memory not given back");
}

}  // namespace alloy::testing::edge_cases

#define ALLOY_EDGE_BAD_INPUT_CASE(check, recipe, name)                                                     \
  BOOST_AUTO_TEST_CASE(recipe) {                                                                           \
    alloy::testing::edge_cases::run([](const auto& up) { return alloy::testing::edge_cases::recipe(up); }, \
                                    [](auto& a, const std::string& n) { check(a, n); }, name);             \
  }
#define ALLOY_EDGE_BAD_INPUT_CASES(check)                                                   \
  ALLOY_EDGE_BAD_INPUT_CASE(check, stats_limited_arena, "stats<limited<arena>>")            \
  ALLOY_EDGE_BAD_INPUT_CASE(check, tracked_default_allocator, "tracked<default_allocator>") \
  ALLOY_EDGE_BAD_INPUT_CASE(check, synchronized_stats_caching_allocator, "synchronized<stats<caching_allocator>>")
