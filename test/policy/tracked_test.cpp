// SPDX-License-Identifier: Apache-2.0
// tracked<>: outstanding allocations, leak reports, call stacks; conformance.
#include <boost/test/unit_test.hpp>

#include <random>
#include <set>
#include <string>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/tracked.hpp>

#include "policy/stats_toys.hpp"
#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;

namespace {

// Not inlined, so it shows up in the captured call stack.
[[gnu::noinline]] alloy::block allocate_from_a_named_function(alloy::tracked<alloy::host_upstream>& a) {
  alloy::block b = a.allocate(777, 8);
  asm volatile("" ::: "memory");
  return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tracked_policy)

BOOST_AUTO_TEST_CASE(outstanding_allocations_match_a_reference) {
  alloy::tracked<checking_upstream> a;
  std::mt19937_64 rng(9);
  std::vector<alloy::block> live;
  std::size_t bytes = 0;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      const alloy::block b = a.allocate(rng() % 10'000, 16);
      BOOST_REQUIRE(b);
      live.push_back(b);
      bytes += b.size;
    } else {
      const std::size_t v = rng() % live.size();
      bytes -= live[v].size;
      a.deallocate(live[v]);
      live[v] = live.back();
      live.pop_back();
    }
    if (i % 500 == 0) {
      BOOST_TEST(a.outstanding_count() == live.size());
      BOOST_TEST(a.outstanding_bytes() == bytes);
    }
  }
  const auto outstanding = a.outstanding();
  BOOST_TEST(outstanding.size() == live.size());
  std::set<void*> expected, got;
  for (const auto& b : live) expected.insert(b.ptr);
  for (const auto& o : outstanding) got.insert(o.ptr);
  BOOST_TEST((expected == got));
  for (std::size_t i = 1; i < outstanding.size(); ++i)
    BOOST_TEST(outstanding[i - 1].sequence < outstanding[i].sequence);
  for (const auto& b : live) {
    BOOST_TEST(a.is_outstanding(b.ptr));
    a.deallocate(b);
  }
  BOOST_TEST(a.outstanding_count() == 0u);
  BOOST_TEST(a.outstanding_bytes() == 0u);
  BOOST_TEST(a.leak_report().empty());
  BOOST_TEST(a.unknown_frees() == 0u);
}

BOOST_AUTO_TEST_CASE(leak_report_names_every_leak) {
  alloy::tracked<alloy::host_upstream> a;
  const alloy::block x = a.allocate(100, 8);
  const alloy::block y = a.allocate(2_MiB, 256);
  const std::string report = a.leak_report();
  BOOST_TEST_MESSAGE(report);
  BOOST_TEST(report.find("2 outstanding allocations") != std::string::npos);
  BOOST_TEST(report.find("100 bytes") != std::string::npos);
  BOOST_TEST(report.find("2097152 bytes") != std::string::npos);
  BOOST_TEST(a.leak_report(1).find("... and 1 more") != std::string::npos);
  BOOST_TEST(a.outstanding()[0].frames.empty(), "no stacks unless asked");
  a.deallocate(x);
  a.deallocate(y);
  // A free of a pointer the tracker did not hand out is counted and passed on.
  int not_mine = 0;
  alloy::tracked<alloy::null_upstream> n;
  n.deallocate(alloy::block{&not_mine, sizeof not_mine});
  BOOST_TEST(n.unknown_frees() == 1u);
  BOOST_TEST(!n.allocate(10, 8));
  BOOST_TEST(n.outstanding_count() == 0u);
}

BOOST_AUTO_TEST_CASE(call_stacks_when_asked) {
  alloy::tracked<alloy::host_upstream> a{alloy::host_upstream{}, {.capture_stacks = true, .max_frames = 16}};
  const alloy::block b = allocate_from_a_named_function(a);
  const auto outstanding = a.outstanding();
  BOOST_REQUIRE(outstanding.size() == 1u);
#if ALLOY_HAS_BACKTRACE
  BOOST_TEST(!outstanding[0].frames.empty());
  BOOST_TEST(outstanding[0].frames.size() <= 16u);
  const std::string stack = outstanding[0].stack();
  BOOST_TEST_MESSAGE(stack);
  BOOST_TEST(stack.find("#0") != std::string::npos);
  BOOST_TEST(a.leak_report().find("#0") != std::string::npos);
#endif
  a.deallocate(b);
}

BOOST_AUTO_TEST_CASE(capabilities_pass_through) {
  using arena_t = alloy::testing::toy_arena<checking_upstream>;
  using T = alloy::tracked<arena_t>;
  static_assert(alloy::owning_allocator<T> && alloy::releasing_allocator<T> && alloy::reserving_allocator<T> &&
                alloy::introspectable_allocator<T> && alloy::counting_allocator<T> &&
                alloy::stream_ordered_allocator<T, int>);
  alloy::stats<T> s;
  const alloy::block b = s.allocate(1000, 8, 3);
  BOOST_TEST(s.inner().outstanding_count() == 1u);
  s.deallocate(b, 3);
  BOOST_TEST(s.inner().outstanding_count() == 0u);
  BOOST_TEST(s.statistics().num_allocs == 1u);
}

BOOST_AUTO_TEST_SUITE_END()

namespace recipes {

struct tracked_recipe {
  template <class U>
  using type = alloy::tracked<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up), {.capture_stacks = true}};
  }
  static alloy::testing::conformance_options options() { return {.max_size = 64_MiB}; }
};

}  // namespace recipes

BOOST_AUTO_TEST_SUITE(tracked_conformance)
BOOST_AUTO_TEST_CASE(conformance) { alloy::testing::conformance_suite<recipes::tracked_recipe>(); }
BOOST_AUTO_TEST_SUITE_END()
