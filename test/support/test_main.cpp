// SPDX-License-Identifier: Apache-2.0
// The main of every alloy test program (Boost.Test, shared library).
#define BOOST_TEST_MODULE alloy
#include <boost/test/unit_test.hpp>
