// SPDX-License-Identifier: Apache-2.0
// std::pmr over alloy (pmr_resource) and alloy over std::pmr (pmr_upstream).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <memory_resource>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include <alloy/adaptor/pmr.hpp>
#include <alloy/alloy.hpp>
#include <alloy/detail/align.hpp>

#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;

BOOST_AUTO_TEST_SUITE(pmr)

BOOST_AUTO_TEST_CASE(pmr_vector_runs_on_an_alloy_composition) {
  alloy::limited<checking_upstream> alloc;
  const auto records = alloc.inner().records();
  {
    alloy::pmr_resource resource{alloc};
    std::pmr::vector<int> numbers{&resource};
    for (int i = 0; i < 100'000; ++i) numbers.push_back(100'000 - i);
    std::sort(numbers.begin(), numbers.end());
    BOOST_TEST(numbers.front() == 1);
    BOOST_TEST(numbers.back() == 100'000);
    BOOST_TEST(alloc.bytes_in_use() == numbers.capacity() * sizeof(int));
    std::pmr::vector<std::pmr::string> words{&resource};
    for (int i = 0; i < 1000; ++i) words.emplace_back(std::string(100, static_cast<char>('a' + i % 26)));
    BOOST_TEST(std::string_view(words[27]) == std::string(100, 'b'));
  }
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty(), "sized deallocation through std::pmr must match");
  BOOST_TEST(records->allocations > 10u);
}

BOOST_AUTO_TEST_CASE(resources_are_equal_when_they_share_the_allocator) {
  alloy::limited<alloy::host_upstream> a, b;
  alloy::pmr_resource ra1{a}, ra2{a}, rb{b};
  BOOST_TEST(ra1.is_equal(ra2));
  BOOST_TEST(!ra1.is_equal(rb));
  BOOST_TEST(!ra1.is_equal(*std::pmr::new_delete_resource()));
  BOOST_TEST(&ra1.get_allocator() == &a);
}

BOOST_AUTO_TEST_CASE(failure_throws_out_of_memory_with_the_limit) {
  alloy::limited<alloy::host_upstream> alloc{alloy::host_upstream{}, {.bytes_limit = 1_MiB}};
  alloy::pmr_resource resource{alloc};
  void* held = resource.allocate(768_KiB, 256);
  try {
    (void)resource.allocate(512_KiB, 256);
    BOOST_FAIL("expected alloy::out_of_memory");
  } catch (const alloy::out_of_memory& oom) {
    const std::string what = oom.what();
    BOOST_TEST(what.find("tried to allocate 512.00 KiB") != std::string::npos, what);
    BOOST_TEST(what.find("limit 1.00 MiB") != std::string::npos, what);
    BOOST_TEST(what.find("in use 768.00 KiB") != std::string::npos, what);
    BOOST_TEST(oom.report().in_use == 768_KiB);
  }
  // Through volatiles: compilers warn of an alignment or a size they can see is impossible, and
  // that is the point.
  const volatile std::size_t odd_alignment = 3;  // not a power of two
  BOOST_CHECK_THROW((void)resource.allocate(1, odd_alignment), alloy::logic_error);
  const volatile std::size_t huge = std::size_t(-1) - 8;
  BOOST_CHECK_THROW((void)resource.allocate(huge, 8), std::bad_alloc);
  resource.deallocate(held, 768_KiB, 256);
  BOOST_TEST(alloc.bytes_in_use() == 0u);  // consistent after every failure
  void* again = resource.allocate(1_MiB, 256);
  resource.deallocate(again, 1_MiB, 256);
}

// An alignment the composition can never serve is a bad argument whose message
// names the maximum, not an out-of-memory with nothing in use.
BOOST_AUTO_TEST_CASE(an_unsupported_alignment_says_so_and_gives_the_maximum) {
  alloy::size_class_pool<alloy::host_upstream> pool;  // alignments up to its largest class, 1 MiB
  alloy::pmr_resource resource{pool};
  try {
    (void)resource.allocate(64, 2_MiB);
    BOOST_FAIL("expected alloy::logic_error");
  } catch (const alloy::logic_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("alignment 2097152 is not supported") != std::string::npos, what);
    BOOST_TEST(what.find("at most 1048576") != std::string::npos, what);
  }
  try {  // within the maximum, but not at this size: the largest class cannot hold 1000 + 1 MiB - 256
    (void)resource.allocate(1000, 1_MiB);
    BOOST_FAIL("expected alloy::logic_error");
  } catch (const alloy::logic_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("alignment 1048576 is not supported by this composition for 1000 bytes") != std::string::npos,
               what);
    BOOST_TEST(what.find("at most 524288") != std::string::npos, what);
  }
  BOOST_CHECK_THROW((void)resource.allocate(2_MiB, 256), alloy::out_of_memory);  // too large: not the alignment
  void* p = resource.allocate(64, 1_MiB);                                        // the maximum itself is served
  BOOST_TEST(alloy::detail::is_aligned(p, 1_MiB));
  resource.deallocate(p, 64, 1_MiB);
  BOOST_TEST(pool.bytes_in_use() == 0u);
  BOOST_TEST(pool.misuse_count() == 0u);
  // pmr_upstream says what its resource is asked with; an arena over it aligns inside itself.
  alloy::limited<alloy::pmr_upstream> over_upstream{alloy::pmr_upstream{}};
  alloy::pmr_resource upstream_resource{over_upstream};
  BOOST_CHECK_THROW((void)upstream_resource.allocate(64, 512), alloy::logic_error);
  alloy::best_fit_arena<alloy::pmr_upstream> arena{alloy::pmr_upstream{}};
  alloy::pmr_resource arena_resource{arena};
  void* q = arena_resource.allocate(64, 1_MiB);
  BOOST_TEST(alloy::detail::is_aligned(q, 1_MiB));
  arena_resource.deallocate(q, 64, 1_MiB);
}

// The message gives the state of the composition the user holds, also when
// the part that counts is below a decorator that does not.
BOOST_AUTO_TEST_CASE(out_of_memory_describes_the_whole_composition) {
  using arena = alloy::best_fit_arena<alloy::host_upstream>;
  alloy::synchronized<alloy::limited<arena>> alloc{alloy::limited<arena>{arena{}, {.bytes_limit = 4_MiB}}};
  alloy::pmr_resource resource{alloc};
  void* held = resource.allocate(3_MiB, 256);
  try {
    (void)resource.allocate(2_MiB, 256);
    BOOST_FAIL("expected alloy::out_of_memory");
  } catch (const alloy::out_of_memory& oom) {
    BOOST_TEST(oom.report().limit == 4_MiB);
    BOOST_TEST(oom.report().in_use == 3_MiB);
    BOOST_TEST(oom.report().reserved == alloc.reserved_bytes());
    BOOST_TEST(oom.report().reserved >= 3_MiB);
  }
  resource.deallocate(held, 3_MiB, 256);
}

struct over_pmr {
  template <class U>
  using type = alloy::limited<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up)};
  }
};

BOOST_AUTO_TEST_CASE(pmr_upstream_serves_alloy_from_any_memory_resource) {
  alloy::pmr_upstream up{std::pmr::new_delete_resource()};
  alloy::testing::conformance_options opts;
  opts.max_alignment = 256;  // pmr_upstream makes every request with one alignment (256 B)
  opts.huge_requests = !alloy::testing::running_under_asan();
  alloy::testing::check_conformance(up, opts);
  BOOST_TEST(!up.allocate(64, 512), "alignments above the configured one are refused");
  alloy::pmr_upstream wide{std::pmr::new_delete_resource(), {.alignment = 4096}};
  const alloy::block b = wide.allocate(10, 4096);
  BOOST_TEST(alloy::detail::is_aligned(b.ptr, 4096));
  wide.deallocate(b);
  BOOST_TEST((alloy::pmr_upstream{} == alloy::pmr_upstream{std::pmr::get_default_resource()}));
}

BOOST_AUTO_TEST_CASE(pmr_upstream_never_hands_out_misaligned_memory) {
  // libstdc++'s pool resource ignores alignments above its block size for some sizes.
  std::pmr::unsynchronized_pool_resource pool;
  alloy::pmr_upstream up{&pool};
  std::size_t served = 0;
  for (std::size_t bytes = 1; bytes < 5000; bytes += 7) {
    const alloy::block b = up.allocate(bytes, 256);
    if (!b) continue;
    ++served;
    BOOST_TEST(alloy::detail::is_aligned(b.ptr, 256));
    up.deallocate(b);
  }
  BOOST_TEST(served > 0u);
}

BOOST_AUTO_TEST_CASE(pmr_upstream_turns_exceptions_into_empty_blocks) {
  alloy::pmr_upstream up{std::pmr::null_memory_resource()};
  BOOST_TEST(!up.allocate(16, 16));
}

BOOST_AUTO_TEST_SUITE_END()
