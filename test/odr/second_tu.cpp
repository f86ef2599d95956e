// SPDX-License-Identifier: Apache-2.0
// The second translation unit of odr_test: every public header again, and the same templates and
// inline functions used through other members, so that any header that defines something
// without `inline` (or a template whose instantiations differ between units) breaks the link or
// the test in odr_test.cpp.
#include "all_headers.hpp"

namespace odr_check {

alloy::block allocate_in_second(arena_t& a, std::size_t bytes) { return a.allocate(bytes, 256); }
void free_in_second(arena_t& a, alloy::block b) { a.deallocate(b); }
alloy::block allocate_in_second(caching_t& a, std::size_t bytes) { return a.allocate(bytes, 512); }
void free_in_second(caching_t& a, alloy::block b) { a.deallocate(b); }
alloy::block allocate_in_second(quantized_t& a, std::size_t bytes) { return a.allocate(bytes, 64); }
bool free_in_second(quantized_t& a, alloy::block b) { return a.try_deallocate(b); }
std::size_t round_up_in_second(std::size_t n, std::size_t to) { return alloy::detail::round_up(n, to); }
std::size_t num_allocs_in_second(const arena_t& a) { return a.statistics().num_allocs; }

}  // namespace odr_check
