// SPDX-License-Identifier: Apache-2.0
// test/support/bad_input_cases.hpp: the bad-input matrix (support/bad_input.hpp) over every
// composition and decorator stack the tests know, and through the std::pmr edge. Included by
// test/bad_input_test.cpp (ALLOY_CHECKED=1, as every test) and test/bad_input_unchecked_test.cpp
// (ALLOY_CHECKED=0): the answers must be the same in both builds.
#pragma once

#include <fstream>
#include <limits>
#include <memory_resource>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <alloy/adaptor/pmr.hpp>
#include <alloy/alloy.hpp>
#include <alloy/host_stream.hpp>
#include <alloy/policy/compacting_defragmenter.hpp>
#include <alloy/policy/granule_segregator.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>
#include <alloy/policy/sharded.hpp>
#include <alloy/policy/stream_ordered.hpp>
#include <alloy/showcase.hpp>
#include <alloy/vmm/host_vmm.hpp>

#include "support/bad_input.hpp"

namespace bad_input_recipes {

using namespace alloy::literals;
template <class U>
using arena = alloy::best_fit_arena<U>;
template <class U>
using pool = alloy::size_class_pool<U>;
template <class U>
using heap = alloy::segregator<1_MiB, pool<U>, arena<U>>;
template <class U>
using reclaimer_t = alloy::host_spill_reclaimer<arena<U>, U>;
template <class U>
using defragmenter_t = alloy::compacting_defragmenter<arena<U>>;
template <class U>
using movable_stack_t = alloy::host_spill_reclaimer<defragmenter_t<U>, U>;
template <class U>
using fallback_t = alloy::fallback<alloy::limited<arena<U>>, arena<U>>;
template <class U>
using ordered_arena_t = alloy::stream_ordered<arena<U>, alloy::host_stream*>;
template <class U>
using ordered_heap_t = alloy::stream_ordered<heap<U>, alloy::host_stream*>;
template <class U>
using ordered_caching_t = alloy::stream_ordered<alloy::caching_allocator<U>, alloy::host_stream*>;

inline std::ostream& null_sink() {
  static std::ofstream sink("/dev/null");  // test code: a static is fine here
  return sink;
}

// clang-format off: each recipe is a struct opened and closed by these macros, which clang-format cannot see
#define ALLOY_BAD_INPUT_RECIPE(NAME, TYPE, ...)  \
  struct NAME {                                  \
    template <class U>                           \
    using type = TYPE;                           \
    template <class U>                           \
    static type<U> make(U up) {                  \
      return __VA_ARGS__;                        \
    }
#define ALLOY_BAD_INPUT_RECIPE_END };

// The engines and the compositions made of them.
ALLOY_BAD_INPUT_RECIPE(best_fit_arena, arena<U>, type<U>{up})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(size_class_pool, pool<U>, type<U>{up})
  static constexpr std::size_t largest = 1_MiB;
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(segregator, heap<U>, type<U>{pool<U>{up}, arena<U>{up}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(default_allocator, alloy::default_allocator<U>, type<U>{up})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(caching_allocator, alloy::caching_allocator<U>, type<U>{up})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(compacting_defragmenter, alloy::compacting_defragmenter<arena<U>>, type<U>{arena<U>{up}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(host_spill_reclaimer, reclaimer_t<U>, type<U>{arena<U>{up}, up})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(movable_stack, movable_stack_t<U>, type<U>{defragmenter_t<U>{arena<U>{up}}, up})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(fallback, fallback_t<U>,
                       type<U>{alloy::limited<arena<U>>{arena<U>{up}, {.bytes_limit = 4_MiB}}, arena<U>{up}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(stream_ordered, ordered_arena_t<U>, type<U>{arena<U>{up}})
ALLOY_BAD_INPUT_RECIPE_END
// Two shards (and, without a `stats<>` inside, thread caches): a small bad free must be refused
// before it reaches a cache, where no engine would check it.
ALLOY_BAD_INPUT_RECIPE(sharded_default, alloy::sharded<alloy::default_allocator<U>>,
                       type<U>{[up](std::size_t) { return alloy::default_allocator<U>{up}; }, {.shards = 2}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(sharded_stats_default, alloy::sharded<alloy::stats<alloy::default_allocator<U>>>,
                       type<U>{[up](std::size_t) { return alloy::stats<alloy::default_allocator<U>>{
                                   alloy::default_allocator<U>{up}}; },
                               {.shards = 2}})
ALLOY_BAD_INPUT_RECIPE_END
// caching_allocator's part for 10 MiB and more rounds chunks to 2 MiB and must still tell a wrong
// size inside the rounding.
ALLOY_BAD_INPUT_RECIPE(quantum_arena, arena<U>, type<U>{up, {.size_quantum = 2_MiB}})
ALLOY_BAD_INPUT_RECIPE_END

// On virtual memory: `make` takes a `vmm_ref<host_vmm>`.
struct virtual_arena {
  template <class V>
  static auto make(V vmm) { return alloy::virtual_arena<V>{vmm}; }
};
struct virtual_allocator {
  template <class V>
  static auto make(V vmm) { return alloy::virtual_allocator<V>{vmm}; }
};
struct stats_virtual_allocator {
  template <class V>
  static auto make(V vmm) { return alloy::stats<alloy::virtual_allocator<V>>{alloy::virtual_allocator<V>{vmm}}; }
};
// liballoy's `virtual` composition.
struct stats_stream_ordered_virtual {
  template <class V>
  static auto make(V vmm) {
    using ordered = alloy::stream_ordered<alloy::virtual_allocator<V>, alloy::host_stream*>;
    return alloy::stats<ordered>{ordered{alloy::virtual_allocator<V>{vmm}}};
  }
};
struct granule_segregator {
  template <class V>
  static auto make(V vmm) {
    using part = alloy::virtual_arena<V>;
    return alloy::granule_segregator<256_KiB, part, part>{part{vmm}, part{vmm}};
  }
};

// The decorators, over each engine and in stacks.
ALLOY_BAD_INPUT_RECIPE(stats_arena, alloy::stats<arena<U>>, type<U>{arena<U>{up}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(stats_pool, alloy::stats<pool<U>>, type<U>{pool<U>{up}})
  static constexpr std::size_t largest = 1_MiB;
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(stats_default_allocator, alloy::stats<alloy::default_allocator<U>>,
                       type<U>{alloy::default_allocator<U>{up}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(limited_arena, alloy::limited<arena<U>>, type<U>{arena<U>{up}, {.bytes_limit = 64_MiB}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(limited_pool, alloy::limited<pool<U>>, type<U>{pool<U>{up}, {.bytes_limit = 1_MiB}})
  static constexpr std::size_t largest = 1_MiB;
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(tracked_arena, alloy::tracked<arena<U>>, type<U>{arena<U>{up}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(tracked_pool, alloy::tracked<pool<U>>, type<U>{pool<U>{up}})
  static constexpr std::size_t largest = 1_MiB;
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(logged_arena, alloy::logged<arena<U>>, type<U>{arena<U>{up}, null_sink()})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(stats_compacting_defragmenter, alloy::stats<defragmenter_t<U>>,
                       type<U>{defragmenter_t<U>{arena<U>{up}}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(stats_host_spill_reclaimer, alloy::stats<reclaimer_t<U>>,
                       type<U>{reclaimer_t<U>{arena<U>{up}, up}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(stats_movable_stack, alloy::stats<movable_stack_t<U>>,
                       type<U>{movable_stack_t<U>{defragmenter_t<U>{arena<U>{up}}, up}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(limited_compacting_defragmenter, alloy::limited<defragmenter_t<U>>,
                       type<U>{defragmenter_t<U>{arena<U>{up}}, {.bytes_limit = 64_MiB}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(limited_host_spill_reclaimer, alloy::limited<reclaimer_t<U>>,
                       type<U>{reclaimer_t<U>{arena<U>{up}, up}, {.bytes_limit = 64_MiB}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(limited_movable_stack, alloy::limited<movable_stack_t<U>>,
                       type<U>{movable_stack_t<U>{defragmenter_t<U>{arena<U>{up}}, up}, {.bytes_limit = 64_MiB}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(tracked_movable_stack, alloy::tracked<movable_stack_t<U>>,
                       type<U>{movable_stack_t<U>{defragmenter_t<U>{arena<U>{up}}, up}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(logged_movable_stack, alloy::logged<movable_stack_t<U>>,
                       type<U>{movable_stack_t<U>{defragmenter_t<U>{arena<U>{up}}, up}, null_sink()})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(synchronized_stats_movable_stack, alloy::synchronized<alloy::stats<movable_stack_t<U>>>,
                       type<U>{alloy::stats<movable_stack_t<U>>{
                           movable_stack_t<U>{defragmenter_t<U>{arena<U>{up}}, up}}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(synchronized_stats_default, alloy::synchronized<alloy::stats<alloy::default_allocator<U>>>,
                       type<U>{alloy::stats<alloy::default_allocator<U>>{alloy::default_allocator<U>{up}}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(stats_limited_arena, alloy::stats<alloy::limited<arena<U>>>,
                       type<U>{alloy::limited<arena<U>>{arena<U>{up}, {.bytes_limit = 64_MiB}}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(limited_stats_caching, alloy::limited<alloy::stats<alloy::caching_allocator<U>>>,
                       type<U>{alloy::stats<alloy::caching_allocator<U>>{alloy::caching_allocator<U>{up}},
                               {.bytes_limit = 128_MiB}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(stats_stream_ordered_heap, alloy::stats<ordered_heap_t<U>>,
                       type<U>{ordered_heap_t<U>{heap<U>{pool<U>{up}, arena<U>{up}}}})
ALLOY_BAD_INPUT_RECIPE_END
// liballoy's `caching` composition.
ALLOY_BAD_INPUT_RECIPE(stats_stream_ordered_caching, alloy::stats<ordered_caching_t<U>>,
                       type<U>{ordered_caching_t<U>{alloy::caching_allocator<U>{up}}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(synchronized_tracked_stats_heap, alloy::synchronized<alloy::tracked<alloy::stats<heap<U>>>>,
                       type<U>{alloy::tracked<alloy::stats<heap<U>>>{
                           alloy::stats<heap<U>>{heap<U>{pool<U>{up}, arena<U>{up}}}}})
ALLOY_BAD_INPUT_RECIPE_END
ALLOY_BAD_INPUT_RECIPE(logged_tracked_limited_stats_default,
                       alloy::logged<alloy::tracked<alloy::limited<alloy::stats<alloy::default_allocator<U>>>>>,
                       type<U>{alloy::tracked<alloy::limited<alloy::stats<alloy::default_allocator<U>>>>{
                                   alloy::limited<alloy::stats<alloy::default_allocator<U>>>{
                                       alloy::stats<alloy::default_allocator<U>>{alloy::default_allocator<U>{up}},
                                       {.bytes_limit = 64_MiB}}},
                               null_sink()})
ALLOY_BAD_INPUT_RECIPE_END

#undef ALLOY_BAD_INPUT_RECIPE
#undef ALLOY_BAD_INPUT_RECIPE_END
// clang-format on

}  // namespace bad_input_recipes

namespace alloy::testing {

/// The std::pmr edge: bad arguments throw and change nothing; bad frees through `deallocate`
/// (which cannot report) are refused below and change nothing; a container still works.
template <class A>
void check_bad_input_through_pmr(A& a, const std::string& name) {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  alloy::pmr_resource resource{a};
  void* witness = resource.allocate(1000, 64);
  fill_pattern({witness, 1000}, 9);
  const observation base = observe(a);
  // Through volatiles: compilers warn of an alignment or a size they can see is impossible, and
  // that is the point.
  const volatile std::size_t odd_alignment = 3;
  BOOST_CHECK_THROW((void)resource.allocate(64, odd_alignment), alloy::logic_error);
  expect_observation(base, observe(a), 0, 0, name + ": pmr allocate(64, 3)");
  const volatile std::size_t huge = max - 8;
  BOOST_CHECK_THROW((void)resource.allocate(huge, 8), std::bad_alloc);
  expect_observation(base, observe(a), 0, 0, name + ": pmr allocate(SIZE_MAX - 8, 8)");
  void* p = resource.allocate(5000, 64);
  const observation live = observe(a);
  resource.deallocate(static_cast<char*>(p) + 16, 5000, 64);
  expect_observation(live, observe(a), 0, 0, name + ": pmr interior free");
  resource.deallocate(p, 4999, 64);
  expect_observation(live, observe(a), 0, 0, name + ": pmr wrong-size free");
  int on_stack = 0;
  resource.deallocate(&on_stack, sizeof on_stack, alignof(int));
  expect_observation(live, observe(a), 0, 0, name + ": pmr foreign free");
  resource.deallocate(p, 5000, 64);
  expect_observation(base, observe(a), 1, 1, name + ": pmr valid free");
  resource.deallocate(p, 5000, 64);
  expect_observation(base, observe(a), 1, 1, name + ": pmr double free");
  {
    std::pmr::vector<int> v{&resource};
    for (int i = 0; i < 1000; ++i) v.push_back(i);
    BOOST_TEST(v[999] == 999);
  }
  BOOST_TEST(has_pattern({witness, 1000}, 9), name << ": the witness lost its content");
  resource.deallocate(witness, 1000, 64);
  const observation end = observe(a);
  for (const char* key : {"bytes_in_use", "stats.bytes_in_use", "allocation.all.current", "limited.bytes_in_use",
                          "tracked.outstanding_count"}) {
    if (const auto found = end.find(key); found != end.end()) BOOST_TEST(found->second == 0, name << ": " << key);
  }
}

}  // namespace alloy::testing

#define ALLOY_BAD_INPUT_CASE(R) \
  BOOST_AUTO_TEST_CASE(R) { alloy::testing::bad_input_suite<bad_input_recipes::R>(#R); }

namespace alloy::testing {

/// The matrix over a composition on virtual memory (`Recipe::make(vmm_ref<host_vmm>)`, real
/// memory): at the end every physical piece, mapping and address range is back with the backend.
template <class Recipe>
void bad_input_on_virtual_memory(const std::string& name) {
  alloy::host_vmm device;
  {
    auto a = Recipe::make(alloy::vmm_ref<alloy::host_vmm>{device});
    check_bad_input_matrix(a, name, std::numeric_limits<std::size_t>::max());
  }
  const auto& calls = device.calls();
  BOOST_TEST(calls.creates == calls.releases, name << ": physical pieces left");
  BOOST_TEST(calls.maps == calls.unmaps, name << ": mappings left");
  BOOST_TEST(calls.reserves == calls.unreserves, name << ": address ranges left");
}

}  // namespace alloy::testing

#define ALLOY_BAD_INPUT_VIRTUAL_CASE(R) \
  BOOST_AUTO_TEST_CASE(R) { alloy::testing::bad_input_on_virtual_memory<bad_input_recipes::R>(#R); }

#define ALLOY_BAD_INPUT_PMR_CASE(R)                                             \
  BOOST_AUTO_TEST_CASE(pmr_##R) {                                               \
    std::shared_ptr<alloy::testing::ledger> records;                            \
    {                                                                           \
      auto a = bad_input_recipes::R::make(alloy::testing::checking_upstream{}); \
      records = alloy::find<alloy::testing::checking_upstream>(a).records();    \
      alloy::testing::check_bad_input_through_pmr(a, "pmr over " #R);           \
    }                                                                           \
    BOOST_TEST(records->live_count() == 0u);                                    \
    BOOST_TEST(records->errors.empty());                                        \
  }

// Every case, in the suite the including file opens.
#define ALLOY_BAD_INPUT_ALL_CASES                            \
  ALLOY_BAD_INPUT_CASE(best_fit_arena)                       \
  ALLOY_BAD_INPUT_CASE(size_class_pool)                      \
  ALLOY_BAD_INPUT_CASE(segregator)                           \
  ALLOY_BAD_INPUT_CASE(default_allocator)                    \
  ALLOY_BAD_INPUT_CASE(caching_allocator)                    \
  ALLOY_BAD_INPUT_CASE(compacting_defragmenter)              \
  ALLOY_BAD_INPUT_CASE(host_spill_reclaimer)                 \
  ALLOY_BAD_INPUT_CASE(movable_stack)                        \
  ALLOY_BAD_INPUT_CASE(fallback)                             \
  ALLOY_BAD_INPUT_CASE(stream_ordered)                       \
  ALLOY_BAD_INPUT_CASE(sharded_stats_default)                \
  ALLOY_BAD_INPUT_CASE(quantum_arena)                        \
  ALLOY_BAD_INPUT_CASE(stats_arena)                          \
  ALLOY_BAD_INPUT_CASE(stats_pool)                           \
  ALLOY_BAD_INPUT_CASE(stats_default_allocator)              \
  ALLOY_BAD_INPUT_CASE(limited_arena)                        \
  ALLOY_BAD_INPUT_CASE(limited_pool)                         \
  ALLOY_BAD_INPUT_CASE(tracked_arena)                        \
  ALLOY_BAD_INPUT_CASE(tracked_pool)                         \
  ALLOY_BAD_INPUT_CASE(logged_arena)                         \
  ALLOY_BAD_INPUT_CASE(stats_compacting_defragmenter)        \
  ALLOY_BAD_INPUT_CASE(stats_host_spill_reclaimer)           \
  ALLOY_BAD_INPUT_CASE(stats_movable_stack)                  \
  ALLOY_BAD_INPUT_CASE(limited_compacting_defragmenter)      \
  ALLOY_BAD_INPUT_CASE(limited_host_spill_reclaimer)         \
  ALLOY_BAD_INPUT_CASE(limited_movable_stack)                \
  ALLOY_BAD_INPUT_CASE(tracked_movable_stack)                \
  ALLOY_BAD_INPUT_CASE(logged_movable_stack)                 \
  ALLOY_BAD_INPUT_CASE(synchronized_stats_movable_stack)     \
  ALLOY_BAD_INPUT_CASE(synchronized_stats_default)           \
  ALLOY_BAD_INPUT_CASE(stats_limited_arena)                  \
  ALLOY_BAD_INPUT_CASE(limited_stats_caching)                \
  ALLOY_BAD_INPUT_CASE(stats_stream_ordered_heap)            \
  ALLOY_BAD_INPUT_CASE(stats_stream_ordered_caching)         \
  ALLOY_BAD_INPUT_CASE(synchronized_tracked_stats_heap)      \
  ALLOY_BAD_INPUT_CASE(logged_tracked_limited_stats_default) \
  ALLOY_BAD_INPUT_PMR_CASE(stats_default_allocator)          \
  ALLOY_BAD_INPUT_PMR_CASE(limited_arena)                    \
  ALLOY_BAD_INPUT_PMR_CASE(synchronized_tracked_stats_heap)  \
  ALLOY_BAD_INPUT_PMR_CASE(stats_movable_stack)              \
  ALLOY_BAD_INPUT_VIRTUAL_CASE(virtual_arena)                \
  ALLOY_BAD_INPUT_VIRTUAL_CASE(virtual_allocator)            \
  ALLOY_BAD_INPUT_VIRTUAL_CASE(stats_virtual_allocator)      \
  ALLOY_BAD_INPUT_VIRTUAL_CASE(stats_stream_ordered_virtual) \
  ALLOY_BAD_INPUT_VIRTUAL_CASE(granule_segregator)

// The cases only checked builds answer as the others: `sharded`'s thread caches take small frees
// without an engine's lookup, and only `ALLOY_CHECKED` records the blocks they hand out
// (docs/design.md#errors).
#define ALLOY_BAD_INPUT_CHECKED_CASES ALLOY_BAD_INPUT_CASE(sharded_default)
