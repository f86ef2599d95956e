// SPDX-License-Identifier: Apache-2.0
// segregator: conformance over several splits, routing exact at the threshold, capabilities
// passed on only when both sides have them, failing sides, and a model-based randomized test.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/limited.hpp>
#include <alloy/policy/segregator.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/upstream/host_upstream.hpp>

#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;
using alloy::testing::failing_upstream;

namespace {

/// A checking upstream with stream-ordered calls (the stream is an int; it only checks routing).
class streamed_upstream : public checking_upstream {
 public:
  using checking_upstream::allocate;
  using checking_upstream::deallocate;
  alloy::block allocate(std::size_t bytes, std::size_t alignment, int stream) noexcept {
    last_stream = stream;
    return allocate(bytes, alignment);
  }
  void deallocate(alloy::block b, int stream) noexcept {
    last_stream = stream;
    deallocate(b);
  }
  int last_stream = -1;
};

}  // namespace

namespace recipes {

// The pool beside the bare upstream (large requests go straight through).
struct pool_and_upstream {
  template <class U>
  using type = alloy::segregator<1_MiB, alloy::size_class_pool<U>, U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{alloy::size_class_pool<U>{up}, up};
  }
  static alloy::testing::conformance_options options() { return {.max_size = 64_MiB, .random_max_size = 4_MiB}; }
};

// The heap of docs/design.md#building-blocks: the pool up to 1 MiB, the arena above.
struct pool_and_arena {
  template <class U>
  using type = alloy::segregator<1_MiB, alloy::size_class_pool<U>, alloy::best_fit_arena<U>>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{alloy::size_class_pool<U>{up}, alloy::best_fit_arena<U>{up}};
  }
  static alloy::testing::conformance_options options() { return {.max_size = 64_MiB, .random_max_size = 8_MiB}; }
};

// A small threshold, a limited large side, nested segregators. The smallest side has classes up
// to 16 KiB, above its threshold, so that alignments up to 4 KiB fit (see size_class_pool).
struct nested {
  template <class U>
  using small_pool = alloy::size_class_pool<U, alloy::power2_classes<4, 256, 16_KiB>>;
  template <class U>
  using type =
      alloy::segregator<4_KiB, small_pool<U>, alloy::segregator<1_MiB, alloy::size_class_pool<U>, alloy::limited<U>>>;
  template <class U>
  static type<U> make(U up) {
    using large = alloy::segregator<1_MiB, alloy::size_class_pool<U>, alloy::limited<U>>;
    return type<U>{small_pool<U>{up, {.slab_size = 64_KiB}},
                   large{alloy::size_class_pool<U>{up}, alloy::limited<U>{up, {.bytes_limit = 2_GiB}}}};
  }
  static alloy::testing::conformance_options options() { return {.max_size = 64_MiB}; }
};

}  // namespace recipes

BOOST_AUTO_TEST_SUITE(segregator)

using all_recipes = std::tuple<recipes::pool_and_upstream, recipes::pool_and_arena>;

BOOST_AUTO_TEST_CASE_TEMPLATE(conformance, Recipe, all_recipes) { alloy::testing::conformance_suite<Recipe>(); }

// The failure matrix of the nested split adds nothing the two above do not cover (and costs
// seconds): conformance and the leak check only.
BOOST_AUTO_TEST_CASE(conformance_nested) { alloy::testing::conformance_suite_checked<recipes::nested>(); }

BOOST_AUTO_TEST_CASE(routing_is_exact_at_the_threshold) {
  using seg = alloy::segregator<1000, checking_upstream, checking_upstream>;
  static_assert(seg::threshold == 1000);
  static_assert(seg::is_small(1000) && !seg::is_small(1001) && seg::is_small(0));
  seg s{checking_upstream{}, checking_upstream{}};
  const auto small = s.small().records();
  const auto large = s.large().records();
  const alloy::block a = s.allocate(1000, 8);
  BOOST_TEST(small->live_count() == 1u);
  BOOST_TEST(large->live_count() == 0u);
  const alloy::block b = s.allocate(1001, 8);
  BOOST_TEST(small->live_count() == 1u);
  BOOST_TEST(large->live_count() == 1u);
  const alloy::block c = s.allocate(0, 8);
  BOOST_TEST(small->live_count() == 2u);
  BOOST_TEST(s.owns(a));
  BOOST_TEST(s.owns(b));
  s.deallocate(b);
  BOOST_TEST(large->live_count() == 0u);
  s.deallocate(a);
  s.deallocate(c);
  BOOST_TEST(small->live_count() == 0u);
  BOOST_TEST(small->errors.empty());
  BOOST_TEST(large->errors.empty());
}

BOOST_AUTO_TEST_CASE(routing_with_the_pool_and_the_arena) {
  using pool_t = alloy::size_class_pool<checking_upstream>;
  using arena_t = alloy::best_fit_arena<checking_upstream>;
  alloy::segregator<1_MiB, pool_t, arena_t> s{pool_t{checking_upstream{}}, arena_t{checking_upstream{}}};
  const alloy::block at = s.allocate(1_MiB, 256);
  const alloy::block above = s.allocate(1_MiB + 1, 256);
  BOOST_REQUIRE(at);
  BOOST_REQUIRE(above);
  BOOST_TEST(s.small().owns(at));
  BOOST_TEST(!s.large().owns(at));
  BOOST_TEST(s.large().owns(above));
  BOOST_TEST(!s.small().owns(above));
  BOOST_TEST(s.small().bytes_in_use() == 1_MiB);
  BOOST_TEST(s.bytes_in_use() == s.small().bytes_in_use() + s.large().bytes_in_use());
  BOOST_TEST(s.requested_bytes() == 2_MiB + 1);
  BOOST_TEST(s.reserved_bytes() == s.small().reserved_bytes() + s.large().reserved_bytes());
  const alloy::allocator_counters sum = s.counters();
  BOOST_TEST(sum.num_device_alloc == s.small().counters().num_device_alloc + s.large().counters().num_device_alloc);
  std::size_t allocated = 0;
  s.for_each_block([&](const alloy::block_info& info) { allocated += info.state == alloy::block_state::allocated; });
  BOOST_TEST(allocated == 2u);
  s.deallocate(above);
  s.deallocate(at);
  BOOST_TEST(s.bytes_in_use() == 0u);
  BOOST_TEST(s.small().misuse_count() == 0u);
  s.release();
  BOOST_TEST(s.reserved_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(capabilities_only_when_both_sides_have_them) {
  using pool_t = alloy::size_class_pool<checking_upstream>;
  using arena_t = alloy::best_fit_arena<checking_upstream>;
  using full = alloy::segregator<1_MiB, pool_t, arena_t>;
  static_assert(alloy::owning_allocator<full> && alloy::releasing_allocator<full> && alloy::reserving_allocator<full> &&
                alloy::counting_allocator<full> && alloy::introspectable_allocator<full>);
  static_assert(!alloy::stream_ordered_allocator<full, int>);
  using half = alloy::segregator<1_MiB, pool_t, checking_upstream>;
  static_assert(alloy::owning_allocator<half>);
  static_assert(!alloy::releasing_allocator<half> && !alloy::reserving_allocator<half> &&
                !alloy::counting_allocator<half> && !alloy::introspectable_allocator<half>);
  using no_owns = alloy::segregator<1_MiB, pool_t, alloy::host_upstream>;
  static_assert(alloy::allocator<no_owns> && !alloy::owning_allocator<no_owns>);
  using streamed = alloy::segregator<100, streamed_upstream, streamed_upstream>;
  static_assert(alloy::stream_ordered_allocator<streamed, int>);
  static_assert(!alloy::stream_ordered_allocator<alloy::segregator<100, streamed_upstream, checking_upstream>, int>);
  static_assert(full::host_accessible && !full::device_accessible);

  streamed s;
  const alloy::block a = s.allocate(100, 8, 7);
  BOOST_TEST(s.small().last_stream == 7);
  BOOST_TEST(s.large().last_stream == -1);
  const alloy::block b = s.allocate(101, 8, 9);
  BOOST_TEST(s.large().last_stream == 9);
  s.deallocate(a, 3);
  s.deallocate(b, 4);
  BOOST_TEST(s.small().last_stream == 3);
  BOOST_TEST(s.large().last_stream == 4);
  BOOST_TEST(s.small().records()->live_count() == 0u);
  BOOST_TEST(s.large().records()->live_count() == 0u);
}

BOOST_AUTO_TEST_CASE(a_failing_side_fails_alone) {
  using pool_t = alloy::size_class_pool<failing_upstream>;
  failing_upstream large_up{{.fail_from = 0}};
  alloy::segregator<1_MiB, pool_t, failing_upstream> s{pool_t{failing_upstream{}}, large_up};
  BOOST_TEST(!s.allocate(2_MiB, 256));
  const alloy::block small = s.allocate(1_MiB, 256);
  BOOST_TEST(static_cast<bool>(small), "the small side is not affected");
  s.deallocate(small);
  large_up.set_options({});
  const alloy::block large = s.allocate(2_MiB, 256);
  BOOST_TEST(static_cast<bool>(large));
  s.deallocate(large);
  BOOST_TEST(large_up.records()->live_count() == 0u);

  // And the other way round: the pool's upstream fails, large requests still succeed.
  failing_upstream small_up{{.fail_from = 0}};
  alloy::segregator<1_MiB, pool_t, failing_upstream> t{pool_t{small_up}, failing_upstream{}};
  BOOST_TEST(!t.allocate(10, 256));
  BOOST_TEST(t.small().counters().num_ooms == 1u);
  const alloy::block big = t.allocate(1_MiB + 1, 256);
  BOOST_TEST(static_cast<bool>(big));
  t.deallocate(big);
}

BOOST_AUTO_TEST_CASE(model_based_randomized) {
  using pool_t = alloy::size_class_pool<checking_upstream>;
  using arena_t = alloy::best_fit_arena<checking_upstream>;
  for (std::uint64_t seed : {11u, 12u}) {
    checking_upstream up;
    const auto records = up.records();
    alloy::segregator<64_KiB, pool_t, arena_t> s{pool_t{up, {.initial_slab_size = 64_KiB}}, arena_t{up}};
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> log_size(0.0, std::log2(4.0 * 1024 * 1024));
    std::map<const char*, alloy::testing::live_block> live;
    std::vector<const char*> order;
    std::uint64_t next_id = 1;
    std::size_t requested = 0;
    for (std::size_t op = 0; op < 300'000; ++op) {
      const bool grow = order.empty() || (order.size() < 300 && rng() % 2 == 0);
      if (grow) {
        const std::size_t bytes = static_cast<std::size_t>(std::exp2(log_size(rng))) - 1;
        const std::size_t alignment = std::size_t{1} << (rng() % 9);
        const alloy::block b = s.allocate(bytes, alignment);
        BOOST_REQUIRE(b);
        BOOST_REQUIRE(alloy::detail::is_aligned(b.ptr, alignment));
        BOOST_REQUIRE(s.small().owns(b) == (bytes <= 64_KiB));
        const char* p = static_cast<const char*>(b.ptr);
        const auto next = live.lower_bound(p);
        BOOST_REQUIRE((next == live.end() || p + std::max<std::size_t>(bytes, 1) <= next->first));
        if (next != live.begin()) {
          const auto prev = std::prev(next);
          BOOST_REQUIRE(prev->first + std::max<std::size_t>(prev->second.b.size, 1) <= p);
        }
        const alloy::block head{b.ptr, std::min<std::size_t>(bytes, 256)};
        alloy::testing::fill_pattern(head, next_id);
        live.emplace(p, alloy::testing::live_block{b, next_id++, alignment});
        order.push_back(p);
        requested += bytes;
      } else {
        const std::size_t victim = rng() % order.size();
        const auto it = live.find(order[victim]);
        const alloy::block b = it->second.b;
        BOOST_REQUIRE(alloy::testing::has_pattern({b.ptr, std::min<std::size_t>(b.size, 256)}, it->second.id));
        s.deallocate(b);
        requested -= b.size;
        live.erase(it);
        order[victim] = order.back();
        order.pop_back();
      }
      if (op % 10'000 == 0) {
        BOOST_TEST(s.requested_bytes() == requested);
        BOOST_TEST(s.reserved_bytes() == records->live_bytes);
        s.release();
        BOOST_TEST(s.reserved_bytes() == records->live_bytes);
      }
    }
    for (const auto& [p, l] : live) s.deallocate(l.b);
    BOOST_TEST(s.bytes_in_use() == 0u);
    s.release();
    BOOST_TEST(s.reserved_bytes() == 0u);
    BOOST_TEST(records->live_count() == 0u);
    BOOST_TEST(records->errors.empty());
  }
}

BOOST_AUTO_TEST_SUITE_END()
