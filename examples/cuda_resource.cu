// SPDX-License-Identifier: Apache-2.0
// CCCL's cuda::mr over an alloy composition (README "Adaptors").
#include <alloy/adaptor/cuda_mr.hpp>
#include <alloy/alloy.hpp>

#include <cstdio>

int main() {
  cudaStream_t stream{};
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    std::printf("no CUDA device here: nothing to run\n");
    return 0;
  }

  using alloc_t = alloy::limited<alloy::cuda_async_upstream>;
  alloc_t alloc;
  alloy::cuda_resource resource{alloc};
  static_assert(cuda::mr::async_resource_with<alloy::cuda_resource<alloc_t>, cuda::mr::device_accessible>);

  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{resource};
  void* p = ref.allocate_async(1 << 20, 256, ::cuda::stream_ref{stream});  // ordered on stream
  ref.deallocate_async(p, 1 << 20, 256, ::cuda::stream_ref{stream});

  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  std::printf("%zu bytes in use\n", alloc.bytes_in_use());
}
