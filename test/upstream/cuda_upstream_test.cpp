// SPDX-License-Identifier: Apache-2.0
// The CUDA upstreams from host code. Without a device, every call must fail cleanly: an empty
// block, the error kept with the call, file and line, and the edge throwing alloy::cuda_error.
// With a device, the same calls must succeed. Either way the assertions are real.
#include <boost/test/unit_test.hpp>

#include <string>

#include <alloy/adaptor/cuda_mr.hpp>
#include <alloy/alloy.hpp>

namespace {
bool device_present() {
  int devices = 0;
  const bool ok = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();
  return ok;
}

template <class Upstream>
void check_upstream(const char* allocate_call) {
  Upstream up;
  BOOST_TEST(!up.allocate(64, 3), "a bad alignment is refused before CUDA is called");
  BOOST_TEST(!up.allocate(64, 512), "alignments above 256 B are not supported");
  BOOST_TEST(!up.last_error());
  const alloy::block b = up.allocate(1000, 256);
  if (device_present()) {
    BOOST_TEST(static_cast<bool>(b));
    BOOST_TEST(b.size == 1000u);
    BOOST_TEST(alloy::detail::is_aligned(b.ptr, 256));
    up.deallocate(b);
    BOOST_TEST(!up.last_error());
  } else {
    BOOST_TEST(!b, "without a device no CUDA allocation can succeed");
    BOOST_TEST(static_cast<bool>(up.last_error()), "the failure is kept for the edge");
    BOOST_TEST(std::string(up.last_error().call) == allocate_call);
    BOOST_TEST(std::string(up.last_error().file).find("cuda") != std::string::npos);
    BOOST_TEST(up.last_error().line > 0);
    const alloy::cuda_error error = up.last_error().to_exception();
    BOOST_TEST(std::string(error.what()).find(allocate_call) != std::string::npos, error.what());
    up.clear_error();
    BOOST_TEST(!up.last_error());
  }
}
}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_upstreams)

BOOST_AUTO_TEST_CASE(cuda_malloc_upstream) { check_upstream<alloy::cuda_malloc_upstream>("cudaMalloc"); }
BOOST_AUTO_TEST_CASE(pinned_host_upstream) { check_upstream<alloy::pinned_host_upstream>("cudaMallocHost"); }
BOOST_AUTO_TEST_CASE(managed_upstream) { check_upstream<alloy::managed_upstream>("cudaMallocManaged"); }

BOOST_AUTO_TEST_CASE(cuda_async_upstream) {
  alloy::cuda_async_upstream up;
  BOOST_TEST(!up.allocate(64, 3));
  const alloy::block b = up.allocate(1000, 256, cudaStream_t{});
  if (device_present()) {
    BOOST_TEST(static_cast<bool>(b));
    up.deallocate(b, cudaStream_t{});
  } else {
    BOOST_TEST(!b);
    BOOST_TEST(static_cast<bool>(up.last_error()));
    BOOST_TEST(std::string(up.last_error().call) == "cudaMallocAsync(&ptr, taken, stream)");
  }
}

BOOST_AUTO_TEST_CASE(edges_throw_cuda_error_not_out_of_memory,
                     *boost::unit_test::precondition([](auto) { return !device_present(); })) {
  // Without a device the failure is not a lack of memory, and the edge must say what it was.
  alloy::limited<alloy::cuda_malloc_upstream> alloc;
  alloy::cuda_resource resource{alloc};
  try {
    (void)resource.allocate(4096, 256);
    BOOST_FAIL("expected alloy::cuda_error");
  } catch (const alloy::cuda_error& error) {
    const std::string what = error.what();
    BOOST_TEST(what.find("cudaMalloc") != std::string::npos, what);
    BOOST_TEST(what.find("alloy/detail/cuda.hpp:") != std::string::npos, what);
  }
  BOOST_TEST(!alloc.inner().last_error(), "the edge clears the error it reported");
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
