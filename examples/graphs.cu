// SPDX-License-Identifier: Apache-2.0
// README "CUDA graphs": alloy's calls are not yet safe while a stream is being captured, so a
// graph's memory is allocated before the capture and freed after its last launch. Compiled by
// nvcc; runs on a GPU, and without one says so.
#include <alloy/alloy.hpp>
#include <alloy/showcase.hpp>

#include <cstddef>
#include <cstdio>

__global__ void scale(float* data, std::size_t n, float by) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    data[i] *= by;
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device here: nothing to run\n");
    return 0;
  }
  cudaStream_t stream{};
  cudaStreamCreate(&stream);

  // --- the README snippet ---
  alloy::default_allocator<alloy::cuda_malloc_upstream> alloc;
  const std::size_t n = std::size_t{1} << 20;
  const alloy::block data = alloc.allocate(n * sizeof(float), 256);  // before the capture
  if (!data) return 1;
  cudaMemsetAsync(data.ptr, 0, data.size, stream);

  cudaGraph_t graph{};
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);  // no allocator call until the end
  scale<<<256, 256, 0, stream>>>(static_cast<float*>(data.ptr), n, 2.0f);
  cudaStreamEndCapture(stream, &graph);
  cudaGraphExec_t exec{};
  cudaGraphInstantiate(&exec, graph, 0);
  for (int i = 0; i < 10; ++i) cudaGraphLaunch(exec, stream);
  cudaStreamSynchronize(stream);
  alloc.deallocate(data);  // after the last launch
  // --- end of snippet ---

  const cudaError_t status = cudaGetLastError();
  std::printf("ten launches of a captured graph: %s\n", cudaGetErrorString(status));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return status == cudaSuccess ? 0 : 1;
}
