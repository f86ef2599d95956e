// SPDX-License-Identifier: Apache-2.0
// host_upstream and null_upstream, through the conformance routine and on their own.
#include <boost/test/unit_test.hpp>

#include <limits>

#include <alloy/alloy.hpp>

#include "support/conformance.hpp"

BOOST_AUTO_TEST_SUITE(upstream)

BOOST_AUTO_TEST_CASE(host_upstream_conforms) {
  alloy::host_upstream up;
  alloy::testing::check_conformance(up);
}

BOOST_AUTO_TEST_CASE(host_upstream_honours_large_alignments) {
  alloy::host_upstream up;
  for (std::size_t alignment = 8192; alignment <= (std::size_t{1} << 21); alignment *= 4) {
    const alloy::block b = up.allocate(100, alignment);
    BOOST_REQUIRE(b);
    BOOST_TEST(alloy::detail::is_aligned(b.ptr, alignment));
    up.deallocate(b);
  }
}

BOOST_AUTO_TEST_CASE(null_upstream_never_has_memory) {
  alloy::null_upstream up;
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{1} << 30}) BOOST_TEST(!up.allocate(bytes, 256));
  int x = 0;
  BOOST_TEST(!up.owns(alloy::block{&x, 1}));
  up.deallocate({});  // an empty block is fine
}

BOOST_AUTO_TEST_SUITE_END()
