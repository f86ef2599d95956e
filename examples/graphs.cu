// SPDX-License-Identifier: Apache-2.0
// README "CUDA graphs": a graph that allocates and frees inside its capture, through a
// stream-ordered composition with a private pool, replayed while other work allocates from the
// same composition. Compiled by nvcc; runs on a GPU, and without one says so.
#include <alloy/alloy.hpp>

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
  using namespace alloy::literals;
  cudaStream_t stream{};
  cudaStreamCreate(&stream);
  const std::size_t n = std::size_t{1} << 20;

  // --- the README snippet ---
  using arena = alloy::best_fit_arena<alloy::cuda_malloc_upstream>;
  alloy::stream_ordered<arena, cudaStream_t> alloc{arena{{}, {.initial_size = 64_MiB}}};  // a warm cache
  alloy::graph_pool pool;  // the graph's addresses: nobody else's until release_pool

  cudaGraph_t graph{};
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
  alloc.begin_allocate_to_pool(pool, stream);
  alloy::block scratch = alloc.allocate(n * sizeof(float), 256, stream);  // no cudaMalloc under capture
  scale<<<256, 256, 0, stream>>>(static_cast<float*>(scratch.ptr), n, 2.0f);
  alloc.deallocate(scratch, stream);  // back to the pool, for this graph's later allocations
  cudaStreamEndCapture(stream, &graph);
  alloc.end_allocate_to_pool(pool);

  cudaGraphExec_t exec{};
  cudaGraphInstantiate(&exec, graph, 0);
  for (int i = 0; i < 10; ++i) cudaGraphLaunch(exec, stream);
  cudaStreamSynchronize(stream);
  cudaGraphExecDestroy(exec);
  alloc.release_pool(pool);  // after the last launch: the pool's memory is everyone's again
  // --- end of snippet ---

  const cudaError_t status = cudaGetLastError();
  std::printf("ten launches of a graph that allocates: %s\n", cudaGetErrorString(status));
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return status == cudaSuccess ? 0 : 1;
}
