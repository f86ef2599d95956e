// SPDX-License-Identifier: Apache-2.0
// alloy::pmr_resource hands memory to host code, so a device-only composition must not compile.
#include <alloy/adaptor/pmr.hpp>
#include <alloy/alloy.hpp>

namespace {
// A device-only upstream (the memory kind is all that matters here; it is never called).
struct device_only_upstream {
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
  alloy::block allocate(std::size_t, std::size_t) noexcept { return {}; }
  void deallocate(alloy::block) noexcept {}
};
}  // namespace

int main() {
#ifdef ALLOY_COMPILE_FAIL_CONTROL
  alloy::limited<alloy::host_upstream> alloc;
#else
  alloy::limited<device_only_upstream> alloc;
#endif
  alloy::pmr_resource resource{alloc};
  return resource.is_equal(resource) ? 0 : 1;
}
