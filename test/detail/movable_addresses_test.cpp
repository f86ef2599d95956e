// SPDX-License-Identifier: Apache-2.0
// The set of movable blocks' addresses behind the defragmenter's and the reclaimer's refusal of a
// raw free at a movable address, against a std::set: adds, removes (by backward shift), moves and
// lookups at random over few addresses (long probe runs that wrap the table), growth, clearing,
// and a moved-from set.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <utility>

#include <alloy/detail/movable_bookkeeping.hpp>

using alloy::detail::movable_addresses;

namespace {

const void* address(std::uint64_t i) { return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(i) * 256); }

bool same(const movable_addresses& set, const std::set<const void*>& model, std::uint64_t range) {
  for (std::uint64_t i = 1; i <= range; ++i) {
    if (set.contains(address(i)) != model.contains(address(i))) return false;
  }
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(movable_addresses_set)

BOOST_AUTO_TEST_CASE(matches_a_std_set) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    for (const std::uint64_t range : {std::uint64_t{40}, std::uint64_t{3000}}) {
      movable_addresses set;
      std::set<const void*> model;
      std::mt19937_64 rng(seed);
      for (int op = 0; op < 200000; ++op) {
        const void* p = address(1 + rng() % range);
        switch (rng() % 4) {
          case 0:
            if (!model.contains(p)) {
              BOOST_REQUIRE(set.add(p));
              model.insert(p);
            }
            break;
          case 1:
            set.remove(p);  // absent ones too: nothing changes
            model.erase(p);
            break;
          case 2: {
            const void* to = address(1 + rng() % range);
            if (model.contains(p) && !model.contains(to)) {
              set.move(p, to);
              model.erase(p);
              model.insert(to);
            }
            break;
          }
          default: BOOST_REQUIRE_MESSAGE(set.contains(p) == model.contains(p), "seed " << seed << ", operation " << op);
        }
        if (op % 50000 == 49999) {
          BOOST_REQUIRE(same(set, model, range));
          if (rng() % 2 == 0) {
            set.clear();
            model.clear();
          }
        }
      }
      BOOST_TEST(same(set, model, range));
    }
  }
}

BOOST_AUTO_TEST_CASE(moving_an_absent_address_adds_nothing) {
  movable_addresses set;
  BOOST_TEST(!set.contains(address(1)));
  set.move(address(1), address(2));
  BOOST_TEST(!set.contains(address(2)));
  BOOST_REQUIRE(set.add(address(1)));
  set.move(address(3), address(4));
  BOOST_TEST(set.contains(address(1)));
  BOOST_TEST(!set.contains(address(4)));
}

BOOST_AUTO_TEST_CASE(a_moved_from_set_is_empty) {
  movable_addresses set;
  for (std::uint64_t i = 1; i <= 100; ++i) BOOST_REQUIRE(set.add(address(i)));
  movable_addresses taken(std::move(set));
  BOOST_TEST(taken.contains(address(50)));
  BOOST_TEST(!set.contains(address(50)));  // NOLINT(bugprone-use-after-move): valid and empty
  BOOST_REQUIRE(set.add(address(7)));
  BOOST_TEST(set.contains(address(7)));
  movable_addresses assigned;
  assigned = std::move(taken);
  BOOST_TEST(assigned.contains(address(100)));
  BOOST_TEST(!taken.contains(address(100)));  // NOLINT(bugprone-use-after-move)
}

BOOST_AUTO_TEST_SUITE_END()
