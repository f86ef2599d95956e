// SPDX-License-Identifier: Apache-2.0
// Host bookkeeping grows geometrically: a long run of growths (new segments, new slabs) makes
// O(log n) host allocations for the arena's and the pool's vectors, not one per growth. This
// program replaces the global operator new to count them; the upstreams use aligned_alloc and
// are not counted.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/upstream/host_upstream.hpp>

namespace {
std::atomic<std::size_t> news{0};

void* counted_new(std::size_t bytes, std::size_t alignment) {
  ++news;
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;  // aligned_alloc's rule
  if (void* p = alignment <= alignof(std::max_align_t)
                    ? std::malloc(bytes == 0 ? 1 : bytes)
                    : std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded))
    return p;
  throw std::bad_alloc();
}

/// Host allocations made while `f` runs.
template <class F>
std::size_t allocations_during(F&& f) {
  const std::size_t before = news.load();
  f();
  return news.load() - before;
}
}  // namespace

void* operator new(std::size_t bytes) { return counted_new(bytes, alignof(std::max_align_t)); }
void* operator new[](std::size_t bytes) { return counted_new(bytes, alignof(std::max_align_t)); }
void* operator new(std::size_t bytes, std::align_val_t a) { return counted_new(bytes, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t bytes, std::align_val_t a) { return counted_new(bytes, static_cast<std::size_t>(a)); }
// GCC, inlining these replacements, warns that free() meets operator new's memory: it does not see
// that both are replaced here, as a pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

BOOST_AUTO_TEST_SUITE(metadata_growth)

// Each request needs a segment of its own (fixed growth of exactly the request). Reserving room
// for "one more segment" used to reallocate the segment table every time.
BOOST_AUTO_TEST_CASE(arena_segments_grow_geometrically) {
  constexpr std::size_t segments = 10'000;
  alloy::best_fit_arena<alloy::host_upstream> arena{alloy::host_upstream{},
                                                    {.growth = alloy::best_fit_growth::fixed, .growth_size = 4096}};
  std::vector<alloy::block> held;
  held.reserve(segments);
  const std::size_t made = allocations_during([&] {
    for (std::size_t i = 0; i < segments; ++i) held.push_back(arena.allocate(4096, 256));
  });
  BOOST_TEST(arena.segment_count() == segments);
  for (const alloy::block& b : held) BOOST_TEST_REQUIRE(static_cast<bool>(b));
  // The node pool (from 64 nodes), the address table (from 16 buckets; a rehash allocates two
  // vectors) and the segment table (from 4) each double at most a dozen times: 42 allocations.
  BOOST_TEST(made <= 64u, made << " host allocations for " << segments << " segments");
  for (const alloy::block& b : held) arena.deallocate(b);
  BOOST_TEST(arena.check_invariants());
  BOOST_TEST(arena.release() == segments * 4096);
  BOOST_TEST(arena.reserved_bytes() == 0u);
}

// Each slab holds 16 blocks; a slab needs its own table of requested sizes (one allocation),
// and nothing else per slab: the class's free stack and the list of slab ids grow geometrically.
BOOST_AUTO_TEST_CASE(pool_slabs_grow_geometrically) {
  constexpr std::size_t blocks = 32'000;
  alloy::size_class_pool<alloy::host_upstream> pool{alloy::host_upstream{}, {.slab_size = 4096}};
  std::vector<alloy::block> held;
  held.reserve(blocks);
  const std::size_t made = allocations_during([&] {
    for (std::size_t i = 0; i < blocks; ++i) held.push_back(pool.allocate(256, 256));
  });
  const std::size_t slabs = pool.slab_count();
  BOOST_TEST(slabs == blocks / 16);
  for (const alloy::block& b : held) BOOST_TEST_REQUIRE(static_cast<bool>(b));
  BOOST_TEST(made <= slabs + 64, made << " host allocations for " << slabs << " slabs");
  for (const alloy::block& b : held) pool.deallocate(b);
  pool.release();
  BOOST_TEST(pool.reserved_bytes() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
