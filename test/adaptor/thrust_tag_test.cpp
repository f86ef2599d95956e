// SPDX-License-Identifier: Apache-2.0
// A Thrust container tagged from outside: a thrust::device_vector (Thrust's host
// backend) whose alloy::thrust_allocator draws from synchronized<stats<virtual_arena>> is built
// inside a scoped_tag on that allocator, offloaded and restored through the decorators with the
// same data pointer and content; a sort through thrust_policy draws its scratch memory in the
// scope, and a container of the scope is refused while the tag is discarded.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <ostream>
#include <vector>

#include <thrust/device_vector.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <alloy/adaptor/thrust.hpp>
#include <alloy/error.hpp>
#include <alloy/literals.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/tag.hpp>
#include <alloy/vmm/host_vmm.hpp>

#include "support/tag_printing.hpp"

using namespace alloy::literals;

static_assert(THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP, "these tests run Thrust's host backend");

namespace {
using arena = alloy::virtual_arena<alloy::host_vmm>;
using heap_t = alloy::synchronized<alloy::stats<arena>>;
}  // namespace

BOOST_AUTO_TEST_CASE(a_thrust_vector_is_tagged_from_outside_through_the_decorators) {
  heap_t heap{alloy::stats<arena>{arena{alloy::host_vmm{{.granularity = 64_KiB}}, {.release_threshold = 0}}}};
  const arena& inner = heap.inner().inner();
  using allocator_t = alloy::thrust_allocator<std::uint64_t, heap_t>;
  constexpr std::size_t n = 200000;
  {
    alloy::scoped_tag guard{heap, alloy::tag{5}};
    thrust::device_vector<std::uint64_t, allocator_t> weights(n, 0, allocator_t{heap});
    thrust::sequence(weights.begin(), weights.end(), std::uint64_t{11}, std::uint64_t{7});
    BOOST_TEST(inner.live_bytes(alloy::tag{5}) == n * sizeof(std::uint64_t));
    BOOST_TEST(inner.live_bytes(alloy::tag{0}) == 0u);
    const std::uint64_t* before = thrust::raw_pointer_cast(weights.data());
    const std::size_t mapped = inner.mapped_bytes(alloy::tag{5});
    BOOST_TEST(heap.offload(alloy::tag{5}) == alloy::offload_status::done);
    BOOST_TEST(heap.reserved_bytes() == 0u);  // release threshold 0: nothing else mapped
    BOOST_TEST(heap.with_lock([](auto& s) { return s.statistics().bytes_reclaimed; }) == mapped);
    BOOST_TEST(heap.restore(alloy::tag{5}) == alloy::offload_status::done);
    BOOST_TEST(thrust::raw_pointer_cast(weights.data()) == before);
    bool same = true;
    for (std::size_t i = 0; i < n; ++i) same = same && before[i] == 11 + 7 * i;
    BOOST_TEST(same);
    // A sort's scratch memory comes through thrust_policy from the same allocator, under the
    // same scoped_tag; while tag 5 is discarded, a container of the scope cannot get memory
    // (refused by the arena, thrown by the adaptor as out of memory, counted).
    const std::size_t allocs_before = heap.with_lock([](auto& s) { return s.statistics().num_allocs; });
    thrust::sort(alloy::thrust_policy(heap), weights.begin(), weights.end(), thrust::greater<std::uint64_t>());
    BOOST_TEST(weights.front() == 11 + 7 * (n - 1));
    BOOST_TEST(heap.with_lock([](auto& s) { return s.statistics().num_allocs; }) > allocs_before);
    BOOST_TEST(heap.discard(alloy::tag{5}) == alloy::offload_status::done);
    const std::size_t refused = inner.offload_stats().num_refused_allocations;
    BOOST_CHECK_THROW((thrust::device_vector<std::uint64_t, allocator_t>(4, 0, allocator_t{heap})),
                      alloy::out_of_memory);
    BOOST_TEST(inner.offload_stats().num_refused_allocations == refused + 1);
    BOOST_TEST(heap.restore(alloy::tag{5}) == alloy::offload_status::done);
  }
  BOOST_TEST(heap.current_tag().value == 0u);
  BOOST_TEST(heap.bytes_in_use() == 0u);
  BOOST_TEST(inner.check_invariants());
}
