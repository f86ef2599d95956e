// SPDX-License-Identifier: Apache-2.0
// The table keyed by address behind the movable policies' refusal of a raw free at a movable
// address, liballoy's live blocks, and sharded's and quantizer's checked records, against a
// std::map: adds, removes (by backward shift, by address or of what a lookup found), moves and
// lookups of values at random over few addresses (long probe runs that wrap the table), growth,
// clearing, a moved-from table and a copy; a set removing what a lookup found.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <utility>

#include <alloy/detail/address_table.hpp>
#include <alloy/detail/movable_bookkeeping.hpp>

using alloy::detail::address_table;

namespace {

const void* address(std::uint64_t i) { return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(i) * 256); }

bool same(const address_table<std::uint64_t>& table, const std::map<const void*, std::uint64_t>& model,
          std::uint64_t range) {
  if (table.size() != model.size()) return false;
  for (std::uint64_t i = 1; i <= range; ++i) {
    const auto found = model.find(address(i));
    const std::uint64_t* value = table.find(address(i));
    if ((value == nullptr) != (found == model.end())) return false;
    if (value != nullptr && *value != found->second) return false;
  }
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(address_tables)

BOOST_AUTO_TEST_CASE(matches_a_std_map) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    for (const std::uint64_t range : {std::uint64_t{40}, std::uint64_t{3000}}) {
      address_table<std::uint64_t> table;
      std::map<const void*, std::uint64_t> model;
      std::mt19937_64 rng(seed);
      for (int op = 0; op < 200000; ++op) {
        const void* p = address(1 + rng() % range);
        switch (rng() % 5) {
          case 0:
            if (!model.contains(p)) {
              const std::uint64_t value = rng();
              BOOST_REQUIRE(table.add(p, value));
              model.emplace(p, value);
            }
            break;
          case 1:  // absent ones too: nothing changes
            if (std::uint64_t* value = table.find(p); value != nullptr && rng() % 2 == 0) {
              table.remove_found(value);  // what find found, without a second probe
              model.erase(p);
            } else {
              BOOST_REQUIRE_EQUAL(table.remove(p), model.erase(p) == 1);
            }
            break;
          case 2: {
            const void* to = address(1 + rng() % range);
            if (!model.contains(to)) {
              table.move(p, to);  // an absent `p` too: nothing changes
              if (const auto found = model.find(p); found != model.end()) {
                model.emplace(to, found->second);
                model.erase(found);
              }
            }
            break;
          }
          case 3:
            if (std::uint64_t* value = table.find(p)) {
              *value = rng();
              model[p] = *value;
            }
            break;
          default:
            BOOST_REQUIRE_MESSAGE(table.contains(p) == model.contains(p), "seed " << seed << ", operation " << op);
        }
        if (op % 50000 == 49999) {
          BOOST_REQUIRE(same(table, model, range));
          if (rng() % 2 == 0) {
            table.clear();
            model.clear();
          }
        }
      }
      BOOST_TEST(same(table, model, range));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_set_removes_what_find_found) {
  address_table<> set;
  for (std::uint64_t i = 1; i <= 100; ++i) BOOST_REQUIRE(set.add(address(i)));
  for (std::uint64_t i = 1; i <= 100; i += 3) set.remove_found(set.find(address(i)));
  for (std::uint64_t i = 1; i <= 100; ++i) BOOST_TEST(set.contains(address(i)) == (i % 3 != 1), i);
  BOOST_TEST(set.size() == 66u);
}

BOOST_AUTO_TEST_CASE(moving_an_absent_address_adds_nothing) {
  alloy::detail::movable_addresses set;
  BOOST_TEST(!set.contains(address(1)));
  set.move(address(1), address(2));
  BOOST_TEST(!set.contains(address(2)));
  BOOST_REQUIRE(set.add(address(1)));
  set.move(address(3), address(4));
  BOOST_TEST(set.contains(address(1)));
  BOOST_TEST(!set.contains(address(4)));
  BOOST_TEST(set.size() == 1U);
  BOOST_TEST(!set.contains(nullptr));
}

BOOST_AUTO_TEST_CASE(a_moved_from_table_is_empty) {
  address_table<std::uint64_t> table;
  for (std::uint64_t i = 1; i <= 100; ++i) BOOST_REQUIRE(table.add(address(i), i));
  address_table<std::uint64_t> taken(std::move(table));
  BOOST_TEST(*taken.find(address(50)) == 50U);
  BOOST_TEST(!table.contains(address(50)));  // NOLINT(bugprone-use-after-move): valid and empty
  BOOST_TEST(table.size() == 0U);            // NOLINT(bugprone-use-after-move)
  BOOST_REQUIRE(table.add(address(7), 7));
  BOOST_TEST(table.contains(address(7)));
  address_table<std::uint64_t> assigned;
  assigned = std::move(taken);
  BOOST_TEST(*assigned.find(address(100)) == 100U);
  BOOST_TEST(!taken.contains(address(100)));  // NOLINT(bugprone-use-after-move)
}

BOOST_AUTO_TEST_CASE(a_copy_is_independent) {
  address_table<std::uint64_t> table;
  for (std::uint64_t i = 1; i <= 100; ++i) BOOST_REQUIRE(table.add(address(i), i));
  address_table<std::uint64_t> copy(table);
  BOOST_REQUIRE(copy.remove(address(50)));
  *copy.find(address(60)) = 600;
  BOOST_TEST(*table.find(address(50)) == 50U);
  BOOST_TEST(*table.find(address(60)) == 60U);
  BOOST_TEST(table.size() == 100U);
  BOOST_TEST(copy.size() == 99U);
  address_table<std::uint64_t> assigned;
  assigned = copy;
  BOOST_TEST(!assigned.contains(address(50)));
  BOOST_TEST(*assigned.find(address(60)) == 600U);
}

BOOST_AUTO_TEST_SUITE_END()
