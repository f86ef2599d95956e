// SPDX-License-Identifier: Apache-2.0
// The bookkeeping behind best_fit_arena, against simple models: the free index (exact-size lists,
// their bitmap and the treap above them) must always answer the true best fit and the largest
// chunk; the address map must find exactly what was entered, also when many addresses share a
// tag and a home bucket (overflow into later buckets, entries found past them, taken back).
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include <alloy/detail/best_fit_index.hpp>

using alloy::detail::best_fit_address_map;
using alloy::detail::best_fit_chunk_pool;
using alloy::detail::best_fit_free_index;
using alloy::detail::best_fit_npos;

namespace {

constexpr unsigned rounding_shift = 8;  // 256 B, the arena's default

/// A node of `pool` standing for a chunk at `addr` of `size` bytes.
std::uint32_t make_chunk(best_fit_chunk_pool& pool, std::uintptr_t addr, std::size_t size) {
  pool.reserve(1);
  const std::uint32_t c = pool.take();
  pool[c].addr = addr;
  pool[c].set_free(size);
  return c;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(best_fit_index)

BOOST_AUTO_TEST_CASE(free_index_answers_the_true_best_fit) {
  std::mt19937_64 rng(20261123);
  best_fit_chunk_pool pool;
  best_fit_free_index index(rounding_shift);
  std::set<std::pair<std::size_t, std::uint32_t>> model;  // (size, chunk)
  std::vector<std::uint32_t> in_index;
  const std::size_t top_units = best_fit_free_index::exact_bins * 2;  // half the sizes go to the treap
  std::uintptr_t next_addr = std::uintptr_t{1} << 32;
  for (int step = 0; step < 200'000; ++step) {
    const bool add = in_index.empty() || (rng() % 100) < 52;
    if (add) {
      // Sizes cluster on a few values so that lists hold several chunks and the treap equal keys.
      const std::size_t units = (rng() % 4 == 0) ? 1 + rng() % 8 : 1 + rng() % top_units;
      const std::uint32_t c = make_chunk(pool, next_addr, units << rounding_shift);
      next_addr += units << rounding_shift;
      index.insert(pool, c);
      model.insert({pool[c].size(), c});
      in_index.push_back(c);
    } else {
      const std::size_t at = rng() % in_index.size();
      const std::uint32_t c = in_index[at];
      in_index[at] = in_index.back();
      in_index.pop_back();
      index.erase(pool, c);
      model.erase({pool[c].size(), c});
      pool.give(c);
    }
    BOOST_TEST_REQUIRE(index.size() == model.size());
    // Any request size the arena asks for: a multiple of the rounding.
    const std::size_t asked = (1 + rng() % (top_units + 16)) << rounding_shift;
    const std::uint32_t got = index.best_fit(pool, asked);
    const auto truth = model.lower_bound({asked, 0});
    if (truth == model.end()) {
      BOOST_TEST_REQUIRE(got == best_fit_npos);
    } else {
      BOOST_TEST_REQUIRE(got != best_fit_npos);
      BOOST_TEST_REQUIRE(pool[got].size() == truth->first);  // the smallest that fits
      BOOST_TEST_REQUIRE(model.count({pool[got].size(), got}) == 1u);
    }
    const std::uint32_t largest = index.largest(pool);
    if (model.empty()) {
      BOOST_TEST_REQUIRE(largest == best_fit_npos);
    } else {
      BOOST_TEST_REQUIRE(largest != best_fit_npos);
      BOOST_TEST_REQUIRE(pool[largest].size() == std::prev(model.end())->first);
    }
  }
}

BOOST_AUTO_TEST_CASE(address_map_finds_what_was_entered_even_when_tags_collide) {
  std::mt19937_64 rng(7);
  best_fit_chunk_pool pool;
  best_fit_address_map map(rounding_shift);
  std::map<std::uintptr_t, std::uint32_t> model;
  // Addresses 2^40 apart have equal tags (the tag keeps 32 bits of the address in 256 B units),
  // so they share a home bucket: with 16 of them per tag, buckets overflow into their neighbours.
  auto address = [&] {
    const std::uintptr_t high = 1 + rng() % 16;
    const std::uintptr_t low = rng() % 64;
    return (high << 40) | (low << rounding_shift);
  };
  for (int step = 0; step < 100'000; ++step) {
    const std::uintptr_t key = address();
    const auto known = model.find(key);
    if (known == model.end()) {
      if (rng() % 4 == 0) {  // absent keys are not found and not taken
        BOOST_TEST_REQUIRE(map.find(pool, key) == best_fit_npos);
        BOOST_TEST_REQUIRE(map.take(pool, key) == best_fit_npos);
        continue;
      }
      const std::uint32_t c = make_chunk(pool, key, 256);
      map.reserve_one();
      map.insert(key, c);
      model.emplace(key, c);
    } else if (rng() % 2 == 0) {
      BOOST_TEST_REQUIRE(map.take(pool, key) == known->second);
      BOOST_TEST_REQUIRE(map.find(pool, key) == best_fit_npos);
      pool.give(known->second);
      model.erase(known);
    } else {
      BOOST_TEST_REQUIRE(map.find(pool, key) == known->second);
    }
    BOOST_TEST_REQUIRE(map.size() == model.size());
  }
  // Every entry is still reachable, wherever it overflowed to; taking all empties the map.
  for (const auto& [key, c] : model) BOOST_TEST_REQUIRE(map.find(pool, key) == c);
  for (const auto& [key, c] : model) BOOST_TEST_REQUIRE(map.take(pool, key) == c);
  BOOST_TEST(map.size() == 0u);
  for (const auto& [key, c] : model) BOOST_TEST_REQUIRE(map.find(pool, key) == best_fit_npos);
}

BOOST_AUTO_TEST_CASE(chunk_words_hold_either_links_or_the_requested_size) {
  best_fit_chunk_pool pool;
  const std::uint32_t c = make_chunk(pool, 4096, 1 << 20);
  BOOST_TEST(c != best_fit_chunk_pool::list_end);  // node 0 is never handed out
  BOOST_TEST(pool[c].free());
  const std::size_t big = (std::size_t{5} << 32) + 12345;  // both halves of the word matter
  pool[c].set_allocated(big);
  BOOST_TEST(!pool[c].free());
  BOOST_TEST(pool[c].size() == std::size_t{1} << 20);
  BOOST_TEST(pool[c].requested() == big);
  pool[c].set_size(std::size_t{3} << 20);
  BOOST_TEST(!pool[c].free());
  BOOST_TEST(pool[c].size() == std::size_t{3} << 20);
  pool[c].set_free(std::size_t{2} << 20);
  BOOST_TEST(pool[c].free());
  BOOST_TEST(pool[c].size() == std::size_t{2} << 20);
  BOOST_TEST(pool.live() == 1u);
  pool.give(c);
  BOOST_TEST(pool.live() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
