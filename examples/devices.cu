// SPDX-License-Identifier: Apache-2.0
// README "Devices": one composition per device in a registry the program owns, compiled by nvcc.
// Runs on a machine with two GPUs or more; with fewer it says so.
#include <alloy/alloy.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/showcase.hpp>

#include <iostream>

namespace {

void two_devices() {
  using namespace alloy::literals;
  using alloc_t = alloy::synchronized<alloy::stats<alloy::virtual_allocator<alloy::cuda_vmm>>>;
  alloy::per_device<alloc_t> devices{{0, 1}, [](int) { return alloc_t{}; }};  // each on its device

  alloy::block b = devices.allocate(64_MiB, 256);  // from the current device's composition
  {
    alloy::scoped_device on{1};  // another device current: the free still reaches b's owner
    devices.deallocate(b);
  }
  std::cout << alloy::memory_summary(devices.on(0));  // statistics by device
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) {
    std::cout << "fewer than two CUDA devices here: nothing to run\n";
    return 0;
  }
  two_devices();
  return 0;
}
