// SPDX-License-Identifier: Apache-2.0
// The bit table behind virtual_arena's granule bookkeeping, against a vector<bool>: range sets,
// clears and counts, visits in both directions over a combination of two tables, growth and
// shrinking, on random ranges that start and end inside words, on word boundaries and across many.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <alloy/detail/bit_table.hpp>

using alloy::detail::bit_table;

namespace {

/// A range [first, end) of [0, n]: often on a word boundary, sometimes empty, sometimes long.
std::pair<std::size_t, std::size_t> random_range(std::mt19937_64& rng, std::size_t n) {
  const auto pick = [&] {
    const std::size_t at = rng() % (n + 1);
    return rng() % 4 == 0 ? at / 64 * 64 : at;
  };
  std::size_t a = pick(), b = pick();
  if (a > b) std::swap(a, b);
  return {a, b};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(bit_table_suite)

BOOST_AUTO_TEST_CASE(range_operations_agree_with_a_vector_of_bool) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    bit_table a, b;
    std::vector<bool> ma, mb;
    for (int step = 0; step < 20000; ++step) {
      if (step % 500 == 0) {  // grow (mostly) or shrink both
        const std::size_t n = rng() % 8 == 0 ? rng() % (ma.size() + 1) : ma.size() + rng() % 300;
        a.resize(n);
        b.resize(n);
        ma.resize(n, false);
        mb.resize(n, false);
        BOOST_REQUIRE(a.size() == n);
      }
      const std::size_t n = ma.size();
      const auto [first, end] = random_range(rng, n);
      bit_table& t = rng() % 2 == 0 ? a : b;
      std::vector<bool>& m = &t == &a ? ma : mb;
      switch (rng() % 3) {
        case 0:
          t.set(first, end);
          for (std::size_t i = first; i < end; ++i) m[i] = true;
          break;
        case 1:
          t.reset(first, end);
          for (std::size_t i = first; i < end; ++i) m[i] = false;
          break;
        default:
          if (n != 0) {
            const std::size_t i = rng() % n;
            rng() % 2 == 0 ? t.set(i) : t.reset(i);
            m[i] = t.test(i);
          }
      }
      // Counts, and visits of `a and not b` both ways, over another random range.
      const auto [lo, hi] = random_range(rng, n);
      std::size_t want = 0;
      std::vector<std::size_t> ascending;
      for (std::size_t i = lo; i < hi; ++i) {
        want += ma[i];
        if (ma[i] && !mb[i]) ascending.push_back(i);
      }
      BOOST_REQUIRE(a.count(lo, hi) == want);
      const auto a_not_b = [&](std::size_t w) { return a.word(w) & ~b.word(w); };
      BOOST_REQUIRE(alloy::detail::count_bits(lo, hi, a_not_b) == ascending.size());
      std::vector<std::size_t> seen;
      alloy::detail::for_each_bit(lo, hi, a_not_b, [&](std::size_t i) { seen.push_back(i); });
      BOOST_REQUIRE(seen == ascending);
      const std::size_t stop_after = rng() % (ascending.size() + 2);
      seen.clear();
      alloy::detail::for_each_bit_descending(lo, hi, a_not_b, [&](std::size_t i) {
        seen.push_back(i);
        return seen.size() < stop_after;
      });
      std::vector<std::size_t> descending(ascending.rbegin(), ascending.rend());
      if (descending.size() > stop_after) descending.resize(std::max<std::size_t>(stop_after, 1));
      BOOST_REQUIRE(seen == descending);
    }
    for (std::size_t i = 0; i < ma.size(); ++i) BOOST_REQUIRE(a.test(i) == ma[i]);
  }
}

BOOST_AUTO_TEST_CASE(bits_cleared_by_shrinking_stay_clear_when_grown_again) {
  bit_table t;
  t.resize(200);
  t.set(0, 200);
  t.resize(70);
  BOOST_TEST(t.count(0, 70) == 70u);
  t.resize(300);
  BOOST_TEST(t.count(0, 300) == 70u);
  BOOST_TEST(!t.test(70));
  t.clear();
  BOOST_TEST(t.size() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
