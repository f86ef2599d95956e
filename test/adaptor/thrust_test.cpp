// SPDX-License-Identifier: Apache-2.0
// Thrust for real on its host backend (THRUST_DEVICE_SYSTEM_CPP): algorithms, device_vector and
// thrust::mr all draw their memory from alloy compositions.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <thrust/device_vector.h>
#include <thrust/host_vector.h>
#include <thrust/mr/allocator.h>
#include <thrust/mr/disjoint_pool.h>
#include <thrust/mr/new.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <alloy/adaptor/thrust.hpp>
#include <alloy/alloy.hpp>
#include <alloy/host_stream.hpp>
#include <alloy/policy/stream_ordered.hpp>

#include "support/checking_upstream.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;
using host_alloc = alloy::limited<checking_upstream>;

static_assert(THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP, "these tests run Thrust's host backend");

namespace {

std::vector<std::uint32_t> random_keys(std::size_t n) {
  std::mt19937 rng(7);
  std::vector<std::uint32_t> keys(n);
  for (auto& k : keys) k = static_cast<std::uint32_t>(rng());
  return keys;
}

/// A stream-ordered composition over a toy stream type: records which stream each call named.
struct recording_stream {
  int id;
};
struct stream_recording_alloc {
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  alloy::host_upstream up;
  std::vector<int> allocate_streams, deallocate_streams;
  std::size_t plain_calls = 0;
  alloy::block allocate(std::size_t n, std::size_t a) noexcept {
    ++plain_calls;
    return up.allocate(n, a);
  }
  void deallocate(alloy::block b) noexcept {
    ++plain_calls;
    up.deallocate(b);
  }
  alloy::block allocate(std::size_t n, std::size_t a, recording_stream s) noexcept {
    allocate_streams.push_back(s.id);
    return up.allocate(n, a);
  }
  void deallocate(alloy::block b, recording_stream s) noexcept {
    deallocate_streams.push_back(s.id);
    up.deallocate(b);
  }
};
static_assert(alloy::stream_ordered_allocator<stream_recording_alloc, recording_stream>);

}  // namespace

BOOST_AUTO_TEST_SUITE(thrust_adaptor)

BOOST_AUTO_TEST_CASE(sort_a_million_keys_with_scratch_from_alloy) {
  host_alloc alloc;
  const auto records = alloc.inner().records();
  auto keys = random_keys(1'000'000);
  auto expected = keys;
  std::sort(expected.begin(), expected.end());

  thrust::sort(alloy::thrust_policy(alloc), keys.data(), keys.data() + keys.size());

  BOOST_TEST(keys == expected);
  BOOST_TEST(records->allocations > 0u, "Thrust's scratch memory must come from our allocator");
  BOOST_TEST(records->peak_live_bytes >= keys.size() * sizeof(std::uint32_t),
             "a radix sort of 1M keys needs a key-sized buffer; peak was " << records->peak_live_bytes);
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty(), "Thrust frees with the size it allocated");
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(policy_with_a_stream_uses_the_stream_ordered_calls) {
  stream_recording_alloc alloc;
  auto keys = random_keys(100'000);
  thrust::sort(alloy::thrust_policy(alloc, recording_stream{7}), keys.begin(), keys.end());
  BOOST_TEST(std::is_sorted(keys.begin(), keys.end()));
  BOOST_TEST(!alloc.allocate_streams.empty());
  BOOST_TEST(alloc.allocate_streams.size() == alloc.deallocate_streams.size());
  BOOST_TEST(std::all_of(alloc.allocate_streams.begin(), alloc.allocate_streams.end(), [](int s) { return s == 7; }));
  BOOST_TEST(alloc.plain_calls == 0u);
}

// With a stream_ordered composition, the policy's scratch memory is ordered on its stream: sorts
// on two host streams share one arena, the second stream's arrival is waited for once, and the
// scratch frees are recorded as events from then on.
BOOST_AUTO_TEST_CASE(policy_on_host_streams_orders_scratch_memory) {
  using arena = alloy::best_fit_arena<checking_upstream>;
  checking_upstream up;
  {
    alloy::stream_ordered<arena, alloy::host_stream*> alloc{arena{up}};
    alloy::host_stream a, b;
    for (alloy::host_stream* s : {&a, &b, &a}) {
      auto keys = random_keys(100'000);
      thrust::sort(alloy::thrust_policy(alloc, s), keys.begin(), keys.end());
      BOOST_TEST(std::is_sorted(keys.begin(), keys.end()));
    }
    BOOST_TEST(alloc.order_counters().host_synchronizations == 1u);
    BOOST_TEST(alloc.order_counters().events_recorded > 0u);
    BOOST_TEST(alloc.inner().bytes_in_use() == 0u);
  }
  BOOST_TEST(up.records()->live.empty());
  BOOST_TEST(up.records()->errors.empty());
}

BOOST_AUTO_TEST_CASE(scratch_failure_throws_out_of_memory_and_leaks_nothing) {
  host_alloc alloc{checking_upstream{}, {.bytes_limit = 64_KiB}};
  const auto records = alloc.inner().records();
  auto keys = random_keys(1'000'000);
  BOOST_CHECK_THROW(thrust::sort(alloy::thrust_policy(alloc), keys.begin(), keys.end()), std::bad_alloc);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  BOOST_TEST(records->live_count() == 0u);
}

BOOST_AUTO_TEST_CASE(device_vector_with_thrust_allocator) {
  host_alloc alloc;
  const auto records = alloc.inner().records();
  {
    using allocator_t = alloy::thrust_allocator<int, host_alloc>;
    thrust::device_vector<int, allocator_t> v(100'000, 0, allocator_t{alloc});
    BOOST_TEST(alloc.bytes_in_use() == 100'000 * sizeof(int));
    BOOST_TEST(alloy::detail::is_aligned(thrust::raw_pointer_cast(v.data()), 256));
    thrust::sequence(v.begin(), v.end());
    thrust::sort(v.begin(), v.end(), thrust::greater<int>());
    BOOST_TEST(v.front() == 99'999);
    BOOST_TEST(thrust::reduce(v.begin(), v.end(), std::int64_t{0}) == std::int64_t{99'999} * 100'000 / 2);
    v.resize(300'000);  // reallocates through the allocator
    BOOST_TEST(alloc.bytes_in_use() == v.capacity() * sizeof(int));
    auto copy = v;  // the copy shares the allocator
    BOOST_TEST((copy.get_allocator() == v.get_allocator()));
  }
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

BOOST_AUTO_TEST_CASE(thrust_allocator_reports_failure) {
  host_alloc alloc{checking_upstream{}, {.bytes_limit = 1_MiB}};
  alloy::thrust_allocator<double, host_alloc> a{alloc};
  BOOST_CHECK_THROW(a.allocate(1'000'000), alloy::out_of_memory);
  BOOST_CHECK_THROW(a.allocate(std::size_t(-1) / 4), alloy::out_of_memory);  // n * sizeof(T) overflows
  alloy::thrust_allocator<char, host_alloc> rebound{a};
  BOOST_TEST((rebound == a));
}

// Over stats<limited<...>>, both failures (too much, and n * sizeof(T)
// overflowing) describe the allocator: its limit and what is in use.
BOOST_AUTO_TEST_CASE(thrust_allocator_out_of_memory_describes_the_allocator) {
  using alloc_t = alloy::stats<alloy::limited<checking_upstream>>;
  alloc_t alloc{alloy::limited<checking_upstream>{checking_upstream{}, {.bytes_limit = 1_MiB}}};
  alloy::thrust_allocator<int, alloc_t> a{alloc};
  auto held = a.allocate(1000);
  for (std::size_t n : {std::size_t{1} << 20, std::size_t(-1) / 2}) {
    try {
      (void)a.allocate(n);
      BOOST_FAIL("expected alloy::out_of_memory");
    } catch (const alloy::out_of_memory& oom) {
      const std::string what = oom.what();
      BOOST_TEST(what.find("limit 1.00 MiB") != std::string::npos, what);
      BOOST_TEST(what.find("in use 3.91 KiB") != std::string::npos, what);
      BOOST_TEST(oom.report().in_use == 4000u);
      BOOST_TEST(oom.report().limit == 1_MiB);
    }
  }
  a.deallocate(held, 1000);
  BOOST_TEST(alloc.statistics().bytes_in_use == 0u);
}

BOOST_AUTO_TEST_CASE(thrust_mr_containers_and_pools_over_thrust_resource) {
  host_alloc alloc;
  const auto records = alloc.inner().records();
  {
    alloy::thrust_resource resource{alloc};
    thrust::host_vector<int, thrust::mr::allocator<int, alloy::thrust_resource<host_alloc>>> v(
        50'000, 1, thrust::mr::allocator<int, alloy::thrust_resource<host_alloc>>(&resource));
    BOOST_TEST(alloc.bytes_in_use() >= 50'000 * sizeof(int));
    BOOST_TEST(thrust::reduce(v.begin(), v.end()) == 50'000);

    // A Thrust pool drawing its chunks from alloy.
    thrust::mr::disjoint_unsynchronized_pool_resource<alloy::thrust_resource<host_alloc>,
                                                      thrust::mr::new_delete_resource>
        pool(&resource, thrust::mr::get_global_resource<thrust::mr::new_delete_resource>());
    void* p = pool.allocate(1000, 256);
    BOOST_TEST(alloc.bytes_in_use() > 50'000 * sizeof(int));
    pool.deallocate(p, 1000, 256);
    pool.release();

    alloy::thrust_resource same{alloc};
    BOOST_TEST(resource.is_equal(same));
    BOOST_CHECK_THROW((void)resource.allocate(10, 5), alloy::logic_error);
  }
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

BOOST_AUTO_TEST_SUITE_END()
