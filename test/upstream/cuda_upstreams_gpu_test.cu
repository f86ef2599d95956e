// SPDX-License-Identifier: Apache-2.0
// The CUDA upstreams and the CUDA side of the adaptors on a real device. Every test here is
// labelled `gpu` and skips, saying why, when no device is present.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

#include <thrust/device_vector.h>
#include <thrust/sort.h>

#include <alloy/adaptor/cuda_mr.hpp>
#include <alloy/adaptor/thrust.hpp>
#include <alloy/alloy.hpp>

#include "support/conformance.hpp"
#include "support/device_pattern.cuh"
#include "support/gpu.hpp"

using namespace alloy::literals;

namespace {

using alloy::testing::device_holds_pattern;
using alloy::testing::fill_kernel;

template <class Upstream>
void device_round_trip(Upstream& up) {
  std::vector<alloy::block> blocks;
  for (std::uint32_t i = 0; i < 16; ++i) {
    const alloy::block b = up.allocate((i + 1) * 100'000 * sizeof(std::uint32_t), 256);
    BOOST_REQUIRE(b);
    BOOST_TEST(alloy::detail::is_aligned(b.ptr, 256));
    fill_kernel<<<64, 256>>>(static_cast<std::uint32_t*>(b.ptr), b.size / 4, i);
    blocks.push_back(b);
  }
  ALLOY_CUDA_TRY(cudaDeviceSynchronize());
  for (std::uint32_t i = 0; i < blocks.size(); ++i) BOOST_TEST(device_holds_pattern(blocks[i], i));
  for (const alloy::block& b : blocks) up.deallocate(b);
  BOOST_TEST(!up.last_error());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_gpu)

BOOST_AUTO_TEST_CASE(cuda_malloc_upstream_round_trip, ALLOY_GPU_TEST) {
  alloy::cuda_malloc_upstream up;
  device_round_trip(up);
}

BOOST_AUTO_TEST_CASE(out_of_memory_is_a_normal_event, ALLOY_GPU_TEST) {
  alloy::cuda_malloc_upstream up;
  BOOST_TEST(!up.allocate(std::size_t{1} << 50, 256), "a petabyte cannot be had");
  BOOST_TEST(!up.last_error(), "out of memory is not kept as an error");
  BOOST_TEST(cudaPeekAtLastError() == cudaSuccess, "the sticky error is cleared");
  const alloy::block b = up.allocate(1_MiB, 256);
  BOOST_TEST(static_cast<bool>(b), "the next request succeeds");
  up.deallocate(b);
}

BOOST_AUTO_TEST_CASE(cuda_async_upstream_on_a_stream, ALLOY_GPU_TEST) {
  cudaStream_t stream{};
  ALLOY_CUDA_TRY(cudaStreamCreate(&stream));
  alloy::cuda_async_upstream up{{.stream = stream}};
  device_round_trip(up);
  const alloy::block b = up.allocate(4_MiB, 256, stream);
  BOOST_REQUIRE(b);
  fill_kernel<<<64, 256, 0, stream>>>(static_cast<std::uint32_t*>(b.ptr), b.size / 4, 99);
  up.deallocate(b, stream);  // freed in stream order after the kernel
  ALLOY_CUDA_TRY(cudaStreamSynchronize(stream));
  ALLOY_CUDA_TRY(cudaStreamDestroy(stream));
}

// While its stream is capturing, the stream-less allocate (which needs a host wait) fails and the
// capture survives; the stream-ordered one becomes a graph node.
BOOST_AUTO_TEST_CASE(cuda_async_upstream_refuses_a_host_wait_under_capture, ALLOY_GPU_TEST) {
  cudaStream_t stream{};
  ALLOY_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  alloy::cuda_async_upstream up{{.stream = stream}};
  ALLOY_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  BOOST_TEST(!up.allocate(4096, 256));
  BOOST_TEST(up.last_error().code == cudaErrorStreamCaptureUnsupported);
  const alloy::block node = up.allocate(4096, 256, stream);
  BOOST_TEST(static_cast<bool>(node));
  up.deallocate(node, stream);
  cudaGraph_t graph = nullptr;
  ALLOY_CUDA_TRY(cudaStreamEndCapture(stream, &graph));  // fails if the capture was invalidated
  ALLOY_CUDA_TRY(cudaGraphDestroy(graph));
  const alloy::block after = up.allocate(4096, 256);
  BOOST_TEST(static_cast<bool>(after));
  up.deallocate(after);
  ALLOY_CUDA_TRY(cudaStreamSynchronize(stream));
  ALLOY_CUDA_TRY(cudaStreamDestroy(stream));
}

BOOST_AUTO_TEST_CASE(pinned_and_managed_memory_conform, ALLOY_GPU_TEST) {
  alloy::testing::conformance_options opts;
  opts.max_alignment = 256;
  opts.max_size = 64_MiB;
  alloy::pinned_host_upstream pinned;
  alloy::testing::check_conformance(pinned, opts);
  alloy::managed_upstream managed;
  alloy::testing::check_conformance(managed, opts);
  device_round_trip(managed);
}

BOOST_AUTO_TEST_CASE(thrust_on_cuda_draws_from_alloy, ALLOY_GPU_TEST) {
  using alloc_t = alloy::limited<alloy::cuda_async_upstream>;
  alloc_t alloc;
  cudaStream_t stream{};
  ALLOY_CUDA_TRY(cudaStreamCreate(&stream));
  {
    using vector_alloc = alloy::thrust_allocator<std::uint32_t, alloc_t>;
    thrust::device_vector<std::uint32_t, vector_alloc> keys(1'000'000, 0u, vector_alloc{alloc});
    fill_kernel<<<64, 256>>>(thrust::raw_pointer_cast(keys.data()), keys.size(), 5);
    const std::size_t before = alloc.bytes_in_use();
    thrust::sort(alloy::thrust_policy(alloc, stream), keys.begin(), keys.end());
    ALLOY_CUDA_TRY(cudaStreamSynchronize(stream));
    BOOST_TEST(alloc.bytes_in_use() == before, "scratch memory was given back");
    std::vector<std::uint32_t> host(keys.size());
    thrust::copy(keys.begin(), keys.end(), host.begin());
    BOOST_TEST(std::is_sorted(host.begin(), host.end()));
  }
  BOOST_TEST(alloc.bytes_in_use() == 0u);
  alloy::cuda_resource resource{alloc};
  void* p = resource.allocate_async(1_MiB, 256, ::cuda::stream_ref{stream});
  resource.deallocate_async(p, 1_MiB, 256, ::cuda::stream_ref{stream});
  ALLOY_CUDA_TRY(cudaStreamSynchronize(stream));
  ALLOY_CUDA_TRY(cudaStreamDestroy(stream));
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
