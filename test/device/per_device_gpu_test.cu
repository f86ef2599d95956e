// SPDX-License-Identifier: Apache-2.0
// Devices on real GPUs, every device present (one or several): scoped_device switches and
// restores cudaGetDevice's answer and makes no switch when the device is current; a CUDA
// upstream bound to a device allocates there whatever device is current; per_device over
// cudaMalloc compositions and over virtual_allocator<cuda_vmm> serves each device from its own
// composition (cudaPointerGetAttributes names the device of every block), a free with another
// device current reaches the owner, contents survive (cudaMemset on the block's device, read
// back at the free), statistics stay per device; stream_traits records an event on a stream of
// another device than the current one. Labelled `gpu`; skips, saying why, without a device.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/showcase.hpp>

#include "support/gpu.hpp"

using namespace alloy::literals;

namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();
  return n;
}

int current() {
  int d = -1;
  ALLOY_CUDA_TRY(cudaGetDevice(&d));
  return d;
}

std::vector<int> all_devices() {
  std::vector<int> ids;
  for (int d = 0; d < device_count(); ++d) ids.push_back(d);
  return ids;
}

/// The device CUDA says `p` lives on.
int device_of_pointer(const void* p) {
  cudaPointerAttributes attributes{};
  ALLOY_CUDA_TRY(cudaPointerGetAttributes(&attributes, p));
  return attributes.device;
}

struct live {
  alloy::block b;
  int device;
  unsigned char value;
};

/// Fills `b` with `value` on the current device and waits.
void stamp(alloy::block b, unsigned char value) {
  ALLOY_CUDA_TRY(cudaMemset(b.ptr, value, b.size));
  ALLOY_CUDA_TRY(cudaDeviceSynchronize());
}

bool intact(const live& x) {
  std::vector<unsigned char> host(x.b.size);
  ALLOY_CUDA_TRY(cudaMemcpy(host.data(), x.b.ptr, x.b.size, cudaMemcpyDefault));
  for (const unsigned char c : host)
    if (c != x.value) return false;
  return true;
}

/// On every device in turn: allocations made with that device current land there; then each
/// block is freed with the next device current, and its owner takes it back.
template <class Registry>
void allocate_everywhere_free_elsewhere(Registry& devices) {
  const std::vector<int> ids = devices.devices();
  std::mt19937 rng(11);
  std::vector<live> blocks;
  for (int round = 0; round < 3; ++round) {
    for (const int d : ids) {
      ALLOY_CUDA_TRY(cudaSetDevice(d));
      for (int i = 0; i < 20; ++i) {
        const std::size_t n = i % 7 == 0 ? (std::size_t{1} << 20) + rng() % (8u << 20) : 1 + rng() % (64u << 10);
        const alloy::block b = devices.allocate(n, 256);
        BOOST_REQUIRE_MESSAGE(b, "allocate(" << n << ") on device " << d);
        BOOST_TEST(device_of_pointer(b.ptr) == d, "CUDA puts the block on the current device's composition's device");
        BOOST_TEST(devices.device_of(b) == d);
        const auto value = static_cast<unsigned char>(1 + rng() % 250);
        stamp(b, value);
        blocks.push_back({b, d, value});
      }
    }
  }
  for (const live& x : blocks) {
    const int other = ids[(static_cast<std::size_t>(x.device) + 1) % ids.size()];
    ALLOY_CUDA_TRY(cudaSetDevice(other));
    BOOST_TEST(intact(x));
    devices.deallocate(x.b);
    BOOST_TEST(current() == other, "the free left the caller's device current");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(scoped_device_switches_and_restores, ALLOY_GPU_TEST) {
  const int n = device_count();
  ALLOY_CUDA_TRY(cudaSetDevice(0));
  for (int d = 0; d < n; ++d) {
    {
      const alloy::scoped_device guard{d};
      BOOST_TEST(guard.ok());
      BOOST_TEST(guard.switched() == (d != 0));
      BOOST_TEST(current() == d);
    }
    BOOST_TEST(current() == 0);
  }
  const alloy::scoped_device nowhere{n};
  BOOST_TEST(!nowhere.ok(), "a device that does not exist is refused");
  BOOST_TEST(nowhere.status() == static_cast<int>(cudaErrorInvalidDevice));
  BOOST_TEST(current() == 0);
  BOOST_TEST(cudaGetLastError() == cudaSuccess, "and the runtime's error is cleared");
}

BOOST_AUTO_TEST_CASE(an_upstream_bound_to_a_device_allocates_there, ALLOY_GPU_TEST) {
  const int n = device_count();
  for (int d = 0; d < n; ++d) {
    alloy::cuda_malloc_upstream up{{.device = d}};
    alloy::cuda_async_upstream async{{.device = d}};
    alloy::managed_upstream managed{{.device = d}};
    ALLOY_CUDA_TRY(cudaSetDevice((d + 1) % n));
    const alloy::block b = up.allocate(1_MiB, 256);
    const alloy::block c = async.allocate(1_MiB, 256);
    const alloy::block m = managed.allocate(4096, 256);
    BOOST_REQUIRE(b);
    BOOST_REQUIRE(c);
    BOOST_REQUIRE(m);
    BOOST_TEST(device_of_pointer(b.ptr) == d);
    BOOST_TEST(device_of_pointer(c.ptr) == d);
    BOOST_TEST(current() == (d + 1) % n, "the caller's device is current again");
    up.deallocate(b);
    async.deallocate(c);
    managed.deallocate(m);
    BOOST_TEST(!up.last_error());
    BOOST_TEST(!async.last_error());
    BOOST_TEST(!managed.last_error());
  }
}

BOOST_AUTO_TEST_CASE(per_device_over_cuda_malloc, ALLOY_GPU_TEST) {
  using part = alloy::synchronized<alloy::stats<alloy::default_allocator<alloy::cuda_malloc_upstream>>>;
  alloy::per_device<part> devices{all_devices(), [](int d) {
                                    BOOST_TEST(current() == d, "the factory runs with its device current");
                                    return part{alloy::stats<alloy::default_allocator<alloy::cuda_malloc_upstream>>{}};
                                  }};
  allocate_everywhere_free_elsewhere(devices);
  for (const int d : devices.devices()) {
    const alloy::statistics s = alloy::statistics_of(devices.on(d));
    BOOST_TEST(s.bytes_in_use == 0u);
    BOOST_TEST(s.num_allocs == 60u, "device " << d << " served its own 60 requests");
    BOOST_TEST(alloy::memory_stats(devices.on(d))["allocation.all.allocated"] == 60);
  }
  devices.release();
  for (const int d : devices.devices()) BOOST_TEST(alloy::statistics_of(devices.on(d)).bytes_reserved == 0u);
}

BOOST_AUTO_TEST_CASE(per_device_over_virtual_memory, ALLOY_GPU_TEST) {
  using part = alloy::virtual_allocator<alloy::cuda_vmm>;
  alloy::per_device<part> devices{all_devices(), [](int d) {
                                    alloy::cuda_vmm vmm;
                                    BOOST_TEST(vmm.device() == d);
                                    BOOST_TEST(vmm.valid());
                                    return part{std::move(vmm)};
                                  }};
  allocate_everywhere_free_elsewhere(devices);
  devices.release();
}

BOOST_AUTO_TEST_CASE(events_are_recorded_on_the_stream_device, ALLOY_GPU_TEST) {
  using traits = alloy::stream_traits<cudaStream_t>;
  const int n = device_count();
  const int last = n - 1;
  ALLOY_CUDA_TRY(cudaSetDevice(last));
  cudaStream_t stream = nullptr;
  ALLOY_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ALLOY_CUDA_TRY(cudaSetDevice(0));
  cudaEvent_t event = nullptr;
  BOOST_REQUIRE(traits::create(event));  // on device 0
  BOOST_TEST(traits::record(event, stream), "recorded on the stream's device (made again there if need be)");
  BOOST_TEST(current() == 0);
  traits::synchronize(event);
  BOOST_TEST(traits::ready(event));
  BOOST_TEST(traits::wait(stream, event));
  traits::synchronize(stream);
  traits::destroy(event);
  ALLOY_CUDA_TRY(cudaStreamDestroy(stream));
}
