// SPDX-License-Identifier: Apache-2.0
// The bad-input matrix (test/support/bad_input.hpp) in an unchecked build: this
// program is compiled with ALLOY_CHECKED=0 (the suite-wide definition is replaced before anything
// is included; it is a program of its own, so no inline function is compiled both ways). Every
// answer must be the one the checked build gives: the misuse checks of docs/design.md#errors that
// the engines make are on in every build.
#undef ALLOY_CHECKED
#define ALLOY_CHECKED 0

#include "support/bad_input_cases.hpp"

static_assert(ALLOY_CHECKED == 0, "this program tests the unchecked build");

BOOST_AUTO_TEST_SUITE(bad_input_unchecked)
ALLOY_BAD_INPUT_ALL_CASES
BOOST_AUTO_TEST_SUITE_END()
