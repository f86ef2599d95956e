// SPDX-License-Identifier: Apache-2.0
// The bad-input matrix (test/support/bad_input.hpp) in a checked build
// (ALLOY_CHECKED=1, as every test): every bad input of docs/design.md#errors through every
// composition and decorator stack, statistics, limits and leak reports checked exactly after each.
// bad_input_unchecked_test.cpp runs the same cases with ALLOY_CHECKED=0, all but `sharded`'s with
// thread caches, whose checks of small frees are the checked build's.
#include "support/bad_input_cases.hpp"

BOOST_AUTO_TEST_SUITE(bad_input_checked)
ALLOY_BAD_INPUT_ALL_CASES
ALLOY_BAD_INPUT_CHECKED_CASES
BOOST_AUTO_TEST_SUITE_END()
