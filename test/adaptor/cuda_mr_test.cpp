// SPDX-License-Identifier: Apache-2.0
// cuda::mr over alloy: the concepts and properties are checked at compile time for the installed
// CCCL; the calls run for real over host-accessible compositions.
#include <boost/test/unit_test.hpp>

#include <string>

#include <alloy/adaptor/cuda_mr.hpp>
#include <alloy/alloy.hpp>

#include "support/checking_upstream.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;

namespace {
using host_alloc = alloy::limited<checking_upstream>;
using host_resource = alloy::cuda_resource<host_alloc>;
using device_resource = alloy::cuda_resource<alloy::limited<alloy::cuda_malloc_upstream>>;
using async_device_resource = alloy::cuda_resource<alloy::cuda_async_upstream>;
using pinned_resource = alloy::cuda_resource<alloy::pinned_host_upstream>;

#if CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION == 0
static_assert(cuda::mr::resource_with<device_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::async_resource_with<device_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::async_resource_with<async_device_resource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::resource_with<device_resource, cuda::mr::host_accessible>);
static_assert(cuda::mr::async_resource_with<pinned_resource, cuda::mr::device_accessible, cuda::mr::host_accessible>);
static_assert(cuda::mr::async_resource_with<host_resource, cuda::mr::host_accessible>);
static_assert(!cuda::mr::resource_with<host_resource, cuda::mr::device_accessible>);
#else
static_assert(cuda::mr::synchronous_resource_with<device_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<device_resource, cuda::mr::device_accessible>);
#endif
}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_mr)

BOOST_AUTO_TEST_CASE(resource_calls_reach_the_composition) {
  host_alloc alloc;
  const auto records = alloc.inner().records();
  host_resource resource{alloc};
  void* p = resource.allocate(1000, 256);
  BOOST_TEST(alloy::detail::is_aligned(p, 256));
  BOOST_TEST(alloc.bytes_in_use() == 1000u);
  resource.deallocate(p, 1000, 256);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  BOOST_TEST(records->errors.empty());
  BOOST_TEST((resource == host_resource{alloc}));
  host_alloc other;
  BOOST_TEST((resource != host_resource{other}));
  BOOST_CHECK_THROW((void)resource.allocate(10, 24), alloy::logic_error);
}

BOOST_AUTO_TEST_CASE(a_resource_ref_erases_the_type) {
  host_alloc alloc;
  host_resource resource{alloc};
  cuda::mr::async_resource_ref<cuda::mr::host_accessible> ref{resource};
  void* p = ref.allocate(4096, 256);
  BOOST_TEST(alloc.bytes_in_use() == 4096u);
  ref.deallocate(p, 4096, 256);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_CASE(out_of_memory_is_reported_as_such) {
  host_alloc alloc{checking_upstream{}, {.bytes_limit = 1_MiB}};
  host_resource resource{alloc};
  BOOST_CHECK_THROW((void)resource.allocate(2_MiB, 256), alloy::out_of_memory);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
