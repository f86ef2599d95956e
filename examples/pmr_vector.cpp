// SPDX-License-Identifier: Apache-2.0
// std::pmr containers over an alloy composition (README "Adaptors").
#include <alloy/adaptor/pmr.hpp>
#include <alloy/alloy.hpp>

#include <cstdio>
#include <memory_resource>
#include <vector>

int main() {
  using namespace alloy::literals;
  alloy::limited<alloy::host_upstream> alloc{alloy::host_upstream{}, {.bytes_limit = 64_MiB}};
  alloy::pmr_resource resource{alloc};  // refers to alloc; alloc must outlive it

  std::pmr::vector<double> samples{&resource};
  for (int i = 0; i < 1000; ++i) samples.push_back(i * 0.5);
  std::printf("%zu samples, %zu bytes in use\n", samples.size(), alloc.bytes_in_use());

  try {
    std::pmr::vector<char> too_big(128_MiB, 0, &resource);
  } catch (const alloy::out_of_memory& oom) {
    std::printf("%s\n", oom.what());  // how much, the limit, in use, ...
  }
  return samples.size() == 1000 ? 0 : 1;
}
