// SPDX-License-Identifier: Apache-2.0
// synchronized, limited and fallback: the conformance suite over each, and what each adds.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/showcase.hpp>

#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;

namespace recipes {

struct synchronized {
  template <class U>
  using type = alloy::synchronized<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up)};
  }
};

struct limited {
  template <class U>
  using type = alloy::limited<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up), {.bytes_limit = 1_GiB}};
  }
};

// Requests beyond 4 MiB in use spill over to plain host memory.
struct fallback {
  template <class U>
  using type = alloy::fallback<alloy::limited<U>, alloy::host_upstream>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{alloy::limited<U>{std::move(up), {.bytes_limit = 4_MiB}}, alloy::host_upstream{}};
  }
};

struct quantizer {
  template <class U>
  using type = alloy::quantizer<alloy::best_fit_arena<U>, 4096>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{alloy::best_fit_arena<U>{std::move(up)}};
  }
};

struct synchronized_limited_fallback {
  template <class U>
  using type = alloy::synchronized<alloy::limited<fallback::type<U>>>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{alloy::limited<fallback::type<U>>{fallback::make(std::move(up)), {.bytes_limit = 2_GiB}}};
  }
};

}  // namespace recipes

using all_recipes = std::tuple<recipes::synchronized, recipes::limited, recipes::fallback, recipes::quantizer,
                               recipes::synchronized_limited_fallback>;

BOOST_AUTO_TEST_SUITE(decorators)

BOOST_AUTO_TEST_CASE_TEMPLATE(conformance, Recipe, all_recipes) { alloy::testing::conformance_suite<Recipe>(); }

BOOST_AUTO_TEST_CASE(limited_refuses_past_the_limit_without_asking_inner) {
  alloy::limited<checking_upstream> alloc{checking_upstream{}, {.bytes_limit = 1000}};
  const auto& records = *alloy::find<checking_upstream>(alloc).records();
  const alloy::block a = alloc.allocate(600, 8);
  BOOST_REQUIRE(a);
  BOOST_TEST(alloc.bytes_in_use() == 600u);
  BOOST_TEST(!alloc.allocate(401, 8));
  BOOST_TEST(records.allocations == 1u, "a refused request never reaches the inner allocator");
  const alloy::block b = alloc.allocate(400, 8);  // exactly up to the limit
  BOOST_REQUIRE(b);
  BOOST_TEST(alloc.bytes_in_use() == 1000u);
  const alloy::block zero = alloc.allocate(0, 8);
  BOOST_TEST(static_cast<bool>(zero), "a zero-byte request fits even at the limit");
  alloc.deallocate(zero);
  alloc.set_bytes_limit(500);  // below what is in use: nothing new until enough is freed
  BOOST_TEST(!alloc.allocate(1, 8));
  alloc.deallocate(a);
  BOOST_TEST(alloc.bytes_in_use() == 400u);
  const alloy::block c = alloc.allocate(100, 8);
  BOOST_TEST(static_cast<bool>(c));
  BOOST_TEST(!alloc.allocate(1, 8));
  alloc.deallocate(b);
  alloc.deallocate(c);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  BOOST_TEST(!alloc.allocate(std::numeric_limits<std::size_t>::max(), 1));
  alloc.set_bytes_limit(std::numeric_limits<std::size_t>::max());
  BOOST_TEST(!alloc.allocate(std::numeric_limits<std::size_t>::max(), 1), "no overflow in the limit check");
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

// Under synchronized over a thread-safe upstream an allocation is planned first (a keeping-cache
// call) and then made plainly: a refusal is one refusal, not one per phase.
BOOST_AUTO_TEST_CASE(limited_counts_a_refusal_once_under_planned_growth) {
  using inner = alloy::limited<alloy::default_allocator<alloy::host_upstream>>;
  static_assert(alloy::growth_planning_allocator<inner>, "the planned path is the one under test");
  alloy::synchronized<inner> alloc{inner{alloy::default_allocator<alloy::host_upstream>{}, {.bytes_limit = 1000}}};
  const alloy::block a = alloc.allocate(800, 256);
  BOOST_REQUIRE(a);
  BOOST_TEST(!alloc.allocate(300, 256));
  BOOST_TEST(!alloc.allocate(std::size_t{8} << 20, 256));
  BOOST_TEST(alloc.inner().num_refused() == 2u);
  BOOST_TEST(alloc.counters().num_ooms == 2u);
  alloc.deallocate(a);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

// Refusals are out-of-memory failures to the caller, so counters() adds them to the inner
// part's num_ooms; the rest of the counters are the inner part's.
BOOST_AUTO_TEST_CASE(limited_counts_refusals_as_ooms) {
  using arena = alloy::best_fit_arena<checking_upstream>;
  alloy::limited<arena> alloc{arena{checking_upstream{}, {.initial_size = 4096}}, {.bytes_limit = 1000}};
  static_assert(alloy::counting_allocator<decltype(alloc)>);
  static_assert(alloy::introspectable_allocator<decltype(alloc)>);
  static_assert(alloy::reserving_allocator<decltype(alloc)>);
  const alloy::block a = alloc.allocate(800, 256);
  BOOST_REQUIRE(a);
  BOOST_TEST(!alloc.allocate(300, 256));
  BOOST_TEST(!alloc.allocate(500, 256));
  BOOST_TEST(alloc.num_refused() == 2u);
  const alloy::allocator_counters c = alloc.counters();
  BOOST_TEST(c.num_ooms == 2u);
  BOOST_TEST(c.num_device_alloc == alloc.inner().counters().num_device_alloc);
  BOOST_TEST(alloc.reserved_bytes() == alloc.inner().reserved_bytes());
  alloc.deallocate(a);
  alloc.release();
  BOOST_TEST(alloc.reserved_bytes() == 0u);
}

// The inner part sees only multiples of the rounding, callers the sizes they asked for;
// requested_bytes() follows a randomized model, and bad frees (the arena's refusals, and in checked
// builds a wrong size within the rounding) change nothing.
BOOST_AUTO_TEST_CASE(quantizer_rounds_what_inner_sees_and_counts_what_callers_asked) {
  using arena = alloy::best_fit_arena<checking_upstream>;
  alloy::quantizer<arena, 512> alloc{arena{checking_upstream{}}};
  static_assert(alloy::quantizer<arena, 512>::rounding == 512);
  std::mt19937_64 rng{20261124};
  std::vector<alloy::block> live;
  std::size_t model_requested = 0, model_rounded = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t bytes = 1 + rng() % 20'000;
      const alloy::block b = alloc.allocate(bytes, 256);
      BOOST_REQUIRE(b);
      BOOST_TEST(b.size == bytes);
      live.push_back(b);
      model_requested += bytes;
      model_rounded += (bytes + 511) / 512 * 512;
    } else {
      const std::size_t i = rng() % live.size();
      const alloy::block b = live[i];
      live[i] = live.back();
      live.pop_back();
      // A wrong-size free (a different multiple of 512) is refused by the arena: nothing moves.
      BOOST_TEST(!alloc.try_deallocate(alloy::block{b.ptr, b.size + 512}));
      // So is one of the same multiple (the tests' checked build keeps each caller's size; every
      // eighth free, as each refusal prints a line).
      if (step % 8 == 0) {
        const std::size_t near = b.size % 512 == 1 ? b.size + 1 : b.size - 1;
        BOOST_TEST(!alloc.try_deallocate(alloy::block{b.ptr, near}), b.size << " freed as " << near);
        BOOST_TEST((alloc.free_misuse(alloy::block{b.ptr, near}) == alloy::misuse::wrong_size));
      }
      BOOST_TEST(alloc.try_deallocate(b));
      BOOST_TEST(!alloc.try_deallocate(b), "a double free is refused");
      model_requested -= b.size;
      model_rounded -= (b.size + 511) / 512 * 512;
    }
    BOOST_TEST(alloc.requested_bytes() == model_requested);
    BOOST_TEST(alloc.inner().bytes_in_use() == model_rounded, "the arena sees the rounded sizes");
  }
  for (const alloy::block b : live) alloc.deallocate(b);
  BOOST_TEST(alloc.requested_bytes() == 0u);
  BOOST_TEST(alloc.inner().bytes_in_use() == 0u);
  BOOST_TEST(!alloc.allocate(std::numeric_limits<std::size_t>::max() - 10, 1), "rounding overflow fails");
  BOOST_TEST(alloc.requested_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(limited_does_not_count_what_inner_failed) {
  alloy::limited<alloy::null_upstream> alloc{alloy::null_upstream{}, {.bytes_limit = 1000}};
  BOOST_TEST(!alloc.allocate(10, 8));
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(fallback_routes_frees_to_the_owner) {
  using primary_t = alloy::limited<checking_upstream>;
  alloy::fallback<primary_t, checking_upstream> alloc{primary_t{checking_upstream{}, {.bytes_limit = 1_MiB}},
                                                      checking_upstream{}};
  const auto primary_records = alloc.primary().inner().records();
  const auto secondary_records = alloc.secondary().records();
  std::vector<alloy::block> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(alloc.allocate(256_KiB, 256));  // 4 fit in the primary
  BOOST_TEST(primary_records->live_count() == 4u);
  BOOST_TEST(secondary_records->live_count() == 6u);
  for (const alloy::block& b : blocks) BOOST_TEST(alloc.owns(b));
  for (const alloy::block& b : blocks) alloc.deallocate(b);
  BOOST_TEST(primary_records->live_count() == 0u);
  BOOST_TEST(secondary_records->live_count() == 0u);
  BOOST_TEST(primary_records->errors.empty());
  BOOST_TEST(secondary_records->errors.empty());
  BOOST_TEST(alloc.primary().bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(synchronized_is_safe_across_threads) {
  alloy::synchronized<alloy::limited<checking_upstream>> alloc;
  const auto records = alloc.inner().inner().records();
  constexpr std::uint64_t threads = 4;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> workers;
  for (std::uint64_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<alloy::testing::live_block> live;
      for (std::uint64_t op = 0; op < 20'000; ++op) {
        if (live.size() < 32 && (live.empty() || rng() % 2 == 0)) {
          const std::size_t bytes = 1 + rng() % 4096;
          const alloy::block b = alloc.allocate(bytes, 64);
          if (!b) continue;
          const std::uint64_t id = op * threads + t;
          alloy::testing::fill_pattern(b, id);
          live.push_back({b, id, 64});
        } else {
          const auto victim = live.begin() + static_cast<std::ptrdiff_t>(rng() % live.size());
          if (!alloy::testing::has_pattern(victim->b, victim->id)) ++corrupted;
          alloc.deallocate(victim->b);
          live.erase(victim);
        }
      }
      for (const auto& l : live) alloc.deallocate(l.b);
    });
  }
  for (auto& w : workers) w.join();
  BOOST_TEST(corrupted.load() == 0);
  BOOST_TEST(alloc.with_lock([](auto& inner) { return inner.bytes_in_use(); }) == 0u);
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

BOOST_AUTO_TEST_SUITE_END()
