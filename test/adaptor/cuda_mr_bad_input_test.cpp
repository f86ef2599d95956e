// SPDX-License-Identifier: Apache-2.0
// The bad-input matrix (test/support/bad_input.hpp) through the CCCL `cuda::mr` edge, over host
// compositions: `cuda_resource` and a type-erased `resource_ref` to it throw for bad arguments and
// out-of-memory without changing anything, and bad frees handed to them are refused below and
// change no statistic, limit or leak report. The stream calls need a CUDA device
// (test/adaptor/cuda_mr_test.cpp checks their types); these are the synchronous ones.
#include <boost/test/unit_test.hpp>

#include <limits>
#include <memory>
#include <string>

#include <alloy/adaptor/cuda_mr.hpp>
#include <alloy/alloy.hpp>
#include <alloy/showcase.hpp>

#include "support/bad_input.hpp"
#include "support/edge_cases.hpp"

using namespace alloy::literals;
using alloy::testing::expect_observation;
using alloy::testing::observation;
using alloy::testing::observe;

namespace {

// The synchronous calls, under the names of the installed CCCL (3.1 renamed them).
template <class R>
void* allocate_now(R& r, std::size_t bytes, std::size_t alignment) {
  if constexpr (requires { r.allocate_sync(bytes, alignment); }) {
    return r.allocate_sync(bytes, alignment);
  } else {
    return r.allocate(bytes, alignment);
  }
}
template <class R>
void deallocate_now(R& r, void* p, std::size_t bytes, std::size_t alignment) {
  if constexpr (requires { r.deallocate_sync(p, bytes, alignment); }) {
    r.deallocate_sync(p, bytes, alignment);
  } else {
    r.deallocate(p, bytes, alignment);
  }
}

template <class R, class A>
void check_through(R& resource, A& a, const std::string& name) {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  void* witness = allocate_now(resource, 1000, 64);
  alloy::testing::fill_pattern({witness, 1000}, 13);
  const observation base = observe(a);
  BOOST_CHECK_THROW((void)allocate_now(resource, 64, 3), alloy::logic_error);
  expect_observation(base, observe(a), 0, 0, name + ": allocate(64, 3)");
  BOOST_CHECK_THROW((void)allocate_now(resource, 64, 0), alloy::logic_error);
  expect_observation(base, observe(a), 0, 0, name + ": allocate(64, 0)");
  BOOST_CHECK_THROW((void)allocate_now(resource, max - 8, 8), std::bad_alloc);
  expect_observation(base, observe(a), 0, 0, name + ": allocate(SIZE_MAX - 8, 8)");

  void* p = allocate_now(resource, 5000, 256);
  const observation live = observe(a);
  deallocate_now(resource, static_cast<char*>(p) + 256, 5000, 256);
  expect_observation(live, observe(a), 0, 0, name + ": interior free");
  deallocate_now(resource, p, 4999, 256);
  expect_observation(live, observe(a), 0, 0, name + ": wrong-size free (smaller)");
  deallocate_now(resource, p, 12_MiB, 256);
  expect_observation(live, observe(a), 0, 0, name + ": wrong-size free (larger)");
  alignas(256) static unsigned char elsewhere[4096];
  deallocate_now(resource, elsewhere, sizeof elsewhere, 256);
  expect_observation(live, observe(a), 0, 0, name + ": foreign free");
  deallocate_now(resource, p, 5000, 256);
  expect_observation(base, observe(a), 1, 1, name + ": valid free");
  deallocate_now(resource, p, 5000, 256);
  expect_observation(base, observe(a), 1, 1, name + ": double free");

  // Zero bytes: a pointer of its own, freed as any other.
  void* z1 = allocate_now(resource, 0, 256);
  void* z2 = allocate_now(resource, 0, 256);
  BOOST_TEST((z1 != nullptr && z2 != nullptr && z1 != z2), name << ": zero bytes");
  deallocate_now(resource, z1, 0, 256);
  deallocate_now(resource, z2, 0, 256);
  expect_observation(base, observe(a), 3, 3, name + ": zero-byte blocks freed");

  // A large block, freed once well and then again.
  void* big = allocate_now(resource, 12_MiB + 7, 256);
  const observation held = observe(a);
  deallocate_now(resource, big, 12_MiB + 6, 256);
  expect_observation(held, observe(a), 0, 0, name + ": 12 MiB block, wrong-size free");
  deallocate_now(resource, big, 12_MiB + 7, 256);
  deallocate_now(resource, big, 12_MiB + 7, 256);
  expect_observation(base, observe(a), 4, 4, name + ": 12 MiB block freed, then again");

  BOOST_TEST(alloy::testing::has_pattern({witness, 1000}, 13), name << ": the witness lost its content");
  deallocate_now(resource, witness, 1000, 64);
  const observation end = observe(a);
  for (const char* key : {"bytes_in_use", "stats.bytes_in_use", "allocation.all.current", "limited.bytes_in_use",
                          "tracked.outstanding_count"}) {
    if (const auto found = end.find(key); found != end.end()) BOOST_TEST(found->second == 0, name << ": " << key);
  }
}

template <class A>
void check_through_cuda_mr(A& a, const std::string& name) {
  alloy::cuda_resource resource{a};
  check_through(resource, a, name + ", cuda_resource");
  cuda::mr::resource_ref<cuda::mr::host_accessible> ref{resource};
  check_through(ref, a, name + ", resource_ref");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_mr_bad_input)

ALLOY_EDGE_BAD_INPUT_CASES(check_through_cuda_mr)

BOOST_AUTO_TEST_SUITE_END()
