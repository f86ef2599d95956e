// SPDX-License-Identifier: Apache-2.0
// A segregator serves every (size, alignment) one of its parts can. A request of
// at most the threshold whose alignment the small part cannot serve goes to the large part, and
// its free, which carries only the pointer and the size, finds the large part again. Checked with
// fill patterns (no overlap, content intact) and exact per-part figures against a model.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <alloy/alloy.hpp>

using namespace alloy::literals;

namespace {

using pool = alloy::size_class_pool<alloy::host_upstream>;
using arena = alloy::best_fit_arena<alloy::host_upstream>;
using heap = alloy::segregator<1_MiB, pool, arena>;  // the example heap of docs/design.md#building-blocks

struct live_block {
  alloy::block b;
  std::size_t alignment;
  unsigned char fill;
  bool redirected;
};

void fill(const live_block& l) { std::memset(l.b.ptr, l.fill, l.b.size); }
bool intact(const live_block& l) {
  const auto* p = static_cast<const unsigned char*>(l.b.ptr);
  for (std::size_t i = 0; i < l.b.size; ++i)
    if (p[i] != l.fill) return false;
  return true;
}

/// Whether the pool serves (bytes, alignment) by its contract (size_class_pool's class comment).
bool pool_serves(std::size_t bytes, std::size_t alignment) {
  if (alignment <= pool::natural_alignment) return bytes <= pool::max_size();
  return alignment <= pool::max_size() &&
         std::max<std::size_t>(bytes, 1) + alignment - pool::natural_alignment <= pool::max_size();
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_issue_reproduction_is_served_by_the_large_part) {
  heap h;
  const alloy::block b = h.allocate(1_MiB, 512);
  BOOST_REQUIRE(b);
  BOOST_TEST(b.size == 1_MiB);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(b.ptr) % 512 == 0u);
  BOOST_TEST(h.large().owns(b));
  BOOST_TEST(!h.small().owns(b));
  BOOST_TEST(h.redirected_blocks() == 1u);
  BOOST_TEST(h.large().requested_bytes() == 1_MiB);
  std::memset(b.ptr, 0x5a, b.size);
  BOOST_TEST(h.try_deallocate(b));
  BOOST_TEST(h.redirected_blocks() == 0u);
  BOOST_TEST(h.large().requested_bytes() == 0u);
  BOOST_TEST(h.small().requested_bytes() == 0u);
  // A double free of it is refused and changes nothing: with no redirected block live it is
  // routed by its size, to the pool, which does not know the pointer.
  BOOST_TEST(!h.try_deallocate(b));
  BOOST_TEST(h.small().misuses().foreign_pointers == 1u);
  BOOST_TEST(h.redirected_blocks() == 0u);
  BOOST_TEST(h.large().requested_bytes() == 0u);
  // While another redirected block lives, the same double free reaches the arena, which refuses
  // it too, and the count of redirected blocks stays.
  const alloy::block other = h.allocate(4096, 1_MiB);
  BOOST_REQUIRE(other);
  BOOST_TEST(h.redirected_blocks() == 1u);
  BOOST_TEST(!h.try_deallocate(b));
  BOOST_TEST(h.redirected_blocks() == 1u);
  BOOST_TEST(h.large().misuses().total() == 1u);
  BOOST_TEST(h.try_deallocate(other));
  BOOST_TEST(h.redirected_blocks() == 0u);
  // What the pool serves still goes to the pool.
  const alloy::block small = h.allocate(1_MiB - 256, 256);
  BOOST_TEST(h.small().owns(small));
  BOOST_TEST(h.redirected_blocks() == 0u);
  h.deallocate(small);
  BOOST_TEST(h.small().requested_bytes() == 0u);
}

namespace {
/// A small part that says what it serves (`serves`): nothing aligned above 256.
struct aligned_to_256_only {
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  arena inner;
  bool serves(std::size_t, std::size_t alignment) const noexcept { return alignment <= 256; }
  alloy::block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return serves(bytes, alignment) ? inner.allocate(bytes, alignment) : alloy::block{};
  }
  void deallocate(alloy::block b) noexcept { inner.deallocate(b); }
  bool try_deallocate(alloy::block b) noexcept { return inner.try_deallocate(b); }
};
static_assert(alloy::request_screening_allocator<alloy::synchronized<alloy::limited<aligned_to_256_only>>>);
}  // namespace

// A part's own `serves` decides, and it is passed on by the wrappers around it.
BOOST_AUTO_TEST_CASE(a_part_that_screens_its_requests_through_wrappers) {
  alloy::segregator<64_KiB, alloy::synchronized<alloy::limited<aligned_to_256_only>>, arena> h;
  const alloy::block a = h.allocate(100, 256);
  const alloy::block b = h.allocate(100, 512);
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(b);
  BOOST_TEST(h.small().inner().bytes_in_use() == 100u);
  BOOST_TEST(h.large().requested_bytes() == 100u);
  BOOST_TEST(h.redirected_blocks() == 1u);
  BOOST_TEST(h.try_deallocate(b));
  BOOST_TEST(h.try_deallocate(a));
  BOOST_TEST(h.large().requested_bytes() == 0u);
  BOOST_TEST(h.small().inner().bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(without_owns_on_the_large_part_nothing_is_redirected) {
  // host_upstream cannot say which blocks are its own, so a redirected block's free could not be
  // routed: the request fails as before.
  alloy::segregator<1_MiB, pool, alloy::host_upstream> h;
  BOOST_TEST(!h.allocate(1_MiB, 512));
  const alloy::block b = h.allocate(2_MiB, 512);
  BOOST_TEST(static_cast<bool>(b));
  h.deallocate(b);
}

BOOST_AUTO_TEST_CASE(model_based_routing_with_fill_patterns) {
  heap h;
  std::mt19937_64 rng(183);
  std::vector<live_block> live;
  std::size_t small_bytes = 0, large_bytes = 0, redirected = 0, total_redirected = 0;
  for (int step = 0; step < 3000; ++step) {
    if (live.size() < 60 && (live.empty() || rng() % 2 == 0)) {
      // Sizes around the threshold and below, alignments up to 2 MiB.
      std::size_t bytes;
      switch (rng() % 3) {
        case 0: bytes = rng() % 4096; break;
        case 1: bytes = 1_MiB - rng() % 65536; break;
        default: bytes = 1 + rng() % (2_MiB); break;
      }
      const std::size_t alignment = std::size_t{1} << (rng() % 22);
      const alloy::block b = h.allocate(bytes, alignment);
      BOOST_REQUIRE_MESSAGE(b, "every request one part can serve is served: " << bytes << " at " << alignment);
      BOOST_REQUIRE(b.size == bytes);
      BOOST_REQUIRE(reinterpret_cast<std::uintptr_t>(b.ptr) % alignment == 0u);
      const bool small_size = bytes <= 1_MiB;
      const bool to_large = !small_size || !pool_serves(bytes, alignment);
      BOOST_REQUIRE(to_large == h.large().owns(b));
      live_block l{b, alignment, static_cast<unsigned char>(rng()), small_size && to_large};
      if (l.b.size != 0) fill(l);
      (to_large ? large_bytes : small_bytes) += bytes;
      if (l.redirected) ++redirected, ++total_redirected;
      live.push_back(l);
    } else {
      const std::size_t i = rng() % live.size();
      const live_block l = live[i];
      BOOST_REQUIRE_MESSAGE(intact(l), "content of a live block changed: overlap");
      BOOST_REQUIRE(h.try_deallocate(l.b));
      (l.redirected || l.b.size > 1_MiB ? large_bytes : small_bytes) -= l.b.size;
      if (l.redirected) --redirected;
      live[i] = live.back();
      live.pop_back();
    }
    BOOST_REQUIRE(h.small().requested_bytes() == small_bytes);
    BOOST_REQUIRE(h.large().requested_bytes() == large_bytes);
    BOOST_REQUIRE(h.redirected_blocks() == redirected);
  }
  for (const live_block& l : live) {
    BOOST_REQUIRE(intact(l));
    h.deallocate(l.b);
  }
  BOOST_TEST(h.small().requested_bytes() == 0u);
  BOOST_TEST(h.large().requested_bytes() == 0u);
  BOOST_TEST(h.redirected_blocks() == 0u);
  BOOST_TEST(h.small().misuses().total() == 0u);
  BOOST_TEST(h.large().misuses().total() == 0u);
  BOOST_TEST(total_redirected > 50u);
}
