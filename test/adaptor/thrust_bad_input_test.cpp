// SPDX-License-Identifier: Apache-2.0
// The bad-input matrix (test/support/bad_input.hpp) through the Thrust edges, on
// Thrust's host backend: thrust_resource and thrust_allocator throw for bad arguments and
// out-of-memory without changing anything, and bad frees handed to them are refused below and
// change no statistic, limit or leak report.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

#include <thrust/device_vector.h>
#include <thrust/sort.h>

#include <alloy/adaptor/thrust.hpp>
#include <alloy/alloy.hpp>
#include <alloy/showcase.hpp>

#include "support/bad_input.hpp"
#include "support/edge_cases.hpp"

using alloy::testing::expect_observation;
using alloy::testing::observation;
using alloy::testing::observe;

namespace {

template <class A>
void check_bad_input_through_thrust(A& a, const std::string& name) {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  alloy::thrust_resource resource{a};
  void* witness = resource.allocate(1000, 64);
  alloy::testing::fill_pattern({witness, 1000}, 11);
  const observation base = observe(a);
  BOOST_CHECK_THROW((void)resource.allocate(64, 3), alloy::logic_error);
  expect_observation(base, observe(a), 0, 0, name + ": thrust_resource allocate(64, 3)");
  BOOST_CHECK_THROW((void)resource.allocate(max - 8, 8), std::bad_alloc);
  expect_observation(base, observe(a), 0, 0, name + ": thrust_resource allocate(SIZE_MAX - 8, 8)");
  void* p = resource.allocate(5000, 64);
  const observation live = observe(a);
  resource.deallocate(static_cast<char*>(p) + 16, 5000, 64);
  expect_observation(live, observe(a), 0, 0, name + ": thrust_resource interior free");
  resource.deallocate(p, 4999, 64);
  expect_observation(live, observe(a), 0, 0, name + ": thrust_resource wrong-size free");
  int on_stack = 0;
  resource.deallocate(&on_stack, sizeof on_stack, alignof(int));
  expect_observation(live, observe(a), 0, 0, name + ": thrust_resource foreign free");
  resource.deallocate(p, 5000, 64);
  expect_observation(base, observe(a), 1, 1, name + ": thrust_resource valid free");
  resource.deallocate(p, 5000, 64);
  expect_observation(base, observe(a), 1, 1, name + ": thrust_resource double free");

  alloy::thrust_allocator<int, A> ints{a};
  BOOST_CHECK_THROW((void)ints.allocate(max / 2), alloy::out_of_memory);  // n * sizeof(int) overflows
  expect_observation(base, observe(a), 1, 1, name + ": thrust_allocator overflow");
  auto q = ints.allocate(100);
  const observation held = observe(a);
  ints.deallocate(q, 99);  // wrong size
  expect_observation(held, observe(a), 0, 0, name + ": thrust_allocator wrong-size free");
  ints.deallocate(q + 1, 99);  // interior
  expect_observation(held, observe(a), 0, 0, name + ": thrust_allocator interior free");
  ints.deallocate(q, 100);
  expect_observation(base, observe(a), 2, 2, name + ": thrust_allocator valid free");
  {
    thrust::device_vector<int, alloy::thrust_allocator<int, A>> keys(10'000, 0, ints);
    for (std::size_t i = 0; i < 10'000; ++i) keys[i] = static_cast<int>(10'000 - i);  // at most 10,000
    thrust::sort(alloy::thrust_policy(a), keys.begin(), keys.end());
    BOOST_TEST(keys[0] == 1);
  }
  BOOST_TEST(alloy::testing::has_pattern({witness, 1000}, 11), name << ": the witness lost its content");
  resource.deallocate(witness, 1000, 64);
  const observation end = observe(a);
  for (const char* key : {"bytes_in_use", "stats.bytes_in_use", "allocation.all.current", "limited.bytes_in_use",
                          "tracked.outstanding_count"}) {
    if (const auto found = end.find(key); found != end.end()) BOOST_TEST(found->second == 0, name << ": " << key);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(thrust_bad_input)

ALLOY_EDGE_BAD_INPUT_CASES(check_bad_input_through_thrust)

BOOST_AUTO_TEST_SUITE_END()
