// SPDX-License-Identifier: Apache-2.0
// The set of 256-byte granules behind sharded's refusal of another allocator's small block:
// against a std::set of granule numbers over random addresses (low, in one band, spread over 66
// spans of 4 GiB, near the top of the address space), a full table of spans (the set answers
// "maybe" for the others, and stays exact for its own), and read without a lock by three threads while a fourth adds granules over 40 spans
// (run under ThreadSanitizer too).
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <alloy/detail/granule_set.hpp>

using alloy::detail::granule_set;

namespace {

constexpr unsigned shift = granule_set::granule_shift;

const void* at(std::uint64_t a) { return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(a)); }

/// A granule number from one of four neighbourhoods: low granules, a band of 4,096 granules,
/// granules spread over 2^38 bytes (64 spans), and granules near the top of a 64-bit address space.
std::uint64_t random_granule(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: return rng() % 200;
    case 1: return (std::uint64_t{1} << 30) + rng() % 4096;
    case 2: return rng() % (std::uint64_t{1} << (38 - shift));
    default: return (~std::uint64_t{0} >> shift) - 1 - rng() % 4096;  // its next one too
  }
}

/// An address inside granule `g`.
const void* inside(std::uint64_t g, std::mt19937_64& rng) { return at((g << shift) + rng() % (1u << shift)); }

}  // namespace

BOOST_AUTO_TEST_SUITE(granule_sets)

BOOST_AUTO_TEST_CASE(matches_a_std_set) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    granule_set set;
    std::set<std::uint64_t> model;
    std::vector<std::uint64_t> asked;
    BOOST_TEST(!set.contains(at(0)));
    for (int step = 0; step < 4000; ++step) {
      const std::uint64_t g = random_granule(rng);
      set.add(inside(g, rng));
      model.insert(g);
      asked.push_back(g);
      asked.push_back(g + 1);
      asked.push_back(random_granule(rng));  // mostly never added
      if (step % 500 == 499) {
        for (const std::uint64_t a : asked) {
          BOOST_TEST_REQUIRE(set.contains(inside(a, rng)) == model.contains(a), "granule " << a << ", seed " << seed);
        }
        asked.clear();
      }
    }
    for (const std::uint64_t g : model) BOOST_TEST_REQUIRE(set.contains(at(g << shift)));
    BOOST_TEST(model.size() > 2500u);
  }
}

BOOST_AUTO_TEST_CASE(past_a_full_table_the_set_gives_up_on_other_spans) {
  granule_set set;
  constexpr unsigned span_shift = granule_set::span_shift;
  const auto in_span = [](std::uint64_t s, std::uint64_t offset) { return at((s << span_shift) + offset); };
  for (std::uint64_t s = 0; s < granule_set::span_slots; ++s) set.add(in_span(s, 512));
  BOOST_TEST(!set.gave_up());
  BOOST_TEST(!set.contains(in_span(granule_set::span_slots, 512)));
  set.add(in_span(granule_set::span_slots, 512));  // no slot left
  BOOST_TEST(set.gave_up());
  BOOST_TEST(set.contains(in_span(granule_set::span_slots, 512)));  // "maybe" from now on
  BOOST_TEST(set.contains(in_span(granule_set::span_slots + 7, 0)));
  for (std::uint64_t s = 0; s < granule_set::span_slots; ++s) {  // the spans it holds stay exact
    BOOST_TEST_REQUIRE(set.contains(in_span(s, 600)));
    BOOST_TEST_REQUIRE(!set.contains(in_span(s, 256)));
    set.add(in_span(s, 256));
    BOOST_TEST_REQUIRE(set.contains(in_span(s, 256)));
  }
}

BOOST_AUTO_TEST_CASE(readers_without_a_lock_see_every_granule_added_before) {
  granule_set set;
  constexpr std::uint64_t granules = 5'000;
  // 32 MiB apart: 40 spans, each new while the readers read.
  const auto granule_of = [](std::uint64_t i) { return (i * 977 % granules) * (std::uint64_t{1} << 17) + 11; };
  std::atomic<std::uint64_t> published{0};
  std::atomic<bool> wrong{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(r) + 7);
      std::uint64_t n = 0;
      while (n < granules) {
        n = published.load(std::memory_order_acquire);
        if (n == 0) continue;
        const std::uint64_t g = granule_of(rng() % n);
        if (!set.contains(inside(g, rng))) wrong = true;
        if (set.contains(inside(g + 1, rng))) wrong = true;  // never added
      }
    });
  }
  for (std::uint64_t i = 0; i < granules; ++i) {
    set.add(at(granule_of(i) << shift));
    published.store(i + 1, std::memory_order_release);
  }
  for (std::thread& t : readers) t.join();
  BOOST_TEST(!wrong.load());
}

BOOST_AUTO_TEST_SUITE_END()
