// SPDX-License-Identifier: Apache-2.0
// A consumer of alloy: composes an allocator, uses it, and says so.
#include <cstdio>

#include <alloy/alloy.hpp>

int main() {
  using namespace alloy::literals;
  alloy::limited<alloy::host_upstream> alloc{alloy::host_upstream{}, {.bytes_limit = 1_MiB}};
  const alloy::block b = alloc.allocate(4096, 256);
  if (!b || alloc.bytes_in_use() != 4096 || alloc.allocate(2_MiB, 256)) return 1;
  alloc.deallocate(b);
  std::printf("consumer: ok (alloy %d.%d.%d)\n", ALLOY_VERSION_MAJOR, ALLOY_VERSION_MINOR, ALLOY_VERSION_PATCH);
  return alloc.bytes_in_use() == 0 ? 0 : 1;
}
