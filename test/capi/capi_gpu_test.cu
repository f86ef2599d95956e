// SPDX-License-Identifier: Apache-2.0
// liballoy on real devices, called as PyTorch calls it: every composition in turn is not possible
// in one process (the configuration is fixed at the first call), so this program serves the
// configuration CTest gives it (ALLOY_CONF; the virtual composition by default) on every device
// present: blocks allocated on two streams of each device, written by a kernel and checked, freed
// on their stream with another device current, statistics exact per device, and a request
// beyond the capacity answered with NULL and an explanation. Labelled `gpu`; skips, saying why,
// without a device.
#include <boost/test/unit_test.hpp>

#include <alloy/capi.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "support/gpu.hpp"

namespace {

__global__ void stamp(std::uint32_t* data, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] = static_cast<std::uint32_t>(i) * 2654435761u + seed;
}

__global__ void check(const std::uint32_t* data, std::size_t n, std::uint32_t seed, unsigned* bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (data[i] != static_cast<std::uint32_t>(i) * 2654435761u + seed) atomicAdd(bad, 1u);
}

double stat(int device, const std::string& key) {
  std::string text(alloy_memory_stats_json(device, nullptr, 0) + 1, '\0');
  alloy_memory_stats_json(device, text.data(), text.size());
  const std::size_t at = text.find("\"" + key + "\":");
  BOOST_REQUIRE(at != std::string::npos);
  return std::strtod(text.c_str() + at + key.size() + 3, nullptr);
}

struct live {
  void* ptr;
  std::size_t size;
  cudaStream_t stream;
  std::uint32_t seed;
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_device_serves_pytorch_calls_on_its_streams, ALLOY_GPU_TEST) {
  if (std::getenv("ALLOY_CONF") == nullptr) BOOST_REQUIRE(alloy_configure("composition:virtual,history:10000") == 0);
  int count = 0;
  BOOST_REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  BOOST_REQUIRE(alloy_device_count() == count);
  alloy_torch_init(count);
  for (int device = 0; device < count; ++device) {
    BOOST_TEST_MESSAGE("device " << device);
    BOOST_REQUIRE(cudaSetDevice(device) == cudaSuccess);
    cudaStream_t streams[2];
    for (cudaStream_t& s : streams) BOOST_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    unsigned* bad = nullptr;
    BOOST_REQUIRE(cudaMallocManaged(&bad, sizeof(unsigned)) == cudaSuccess);
    *bad = 0;
    const double before = stat(device, "allocated_bytes.all.current");
    std::mt19937_64 rng(static_cast<std::uint64_t>(device) + 5);
    std::vector<live> blocks;
    std::uint32_t seed = 1;
    for (int op = 0; op < 2000; ++op) {
      if (blocks.empty() || (blocks.size() < 100 && rng() % 2 == 0)) {
        const std::size_t size = (std::size_t{4} << (rng() % 24)) + 4 * (rng() % 1000);
        cudaStream_t s = streams[rng() % 2];
        void* p = alloy_torch_malloc(size, device, s);
        BOOST_REQUIRE_MESSAGE(p != nullptr, "malloc(" << size << ") failed: " << alloy_last_oom(device));
        cudaPointerAttributes attributes{};
        BOOST_REQUIRE(cudaPointerGetAttributes(&attributes, p) == cudaSuccess);
        BOOST_TEST(attributes.device == device);
        stamp<<<64, 256, 0, s>>>(static_cast<std::uint32_t*>(p), size / 4, seed);
        blocks.push_back({p, size, s, seed++});
      } else {
        const std::size_t victim = rng() % blocks.size();
        const live b = blocks[victim];
        check<<<64, 256, 0, b.stream>>>(static_cast<const std::uint32_t*>(b.ptr), b.size / 4, b.seed, bad);
        // PyTorch frees with whatever device is current; the free must reach the block's device.
        BOOST_REQUIRE(cudaSetDevice((device + 1) % count) == cudaSuccess);
        alloy_torch_free(b.ptr, b.size, device, b.stream);
        BOOST_REQUIRE(cudaSetDevice(device) == cudaSuccess);
        BOOST_TEST(alloy_last_error_code() == 0, alloy_last_error());
        blocks[victim] = blocks.back();
        blocks.pop_back();
      }
    }
    for (const live& b : blocks) {
      check<<<64, 256, 0, b.stream>>>(static_cast<const std::uint32_t*>(b.ptr), b.size / 4, b.seed, bad);
      alloy_torch_free(b.ptr, b.size, device, b.stream);
    }
    BOOST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    BOOST_TEST(*bad == 0u);
    BOOST_TEST(stat(device, "allocated_bytes.all.current") == before);
    // Far beyond the device: NULL, and the explanation names the device.
    BOOST_TEST(alloy_torch_malloc(std::size_t{1} << 50, device, streams[0]) == nullptr);
    BOOST_TEST(std::string(alloy_last_oom(device)).find("device " + std::to_string(device)) != std::string::npos);
    alloy_torch_empty_cache();
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    cudaFree(bad);
  }
}
