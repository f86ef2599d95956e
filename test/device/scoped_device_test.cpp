// SPDX-License-Identifier: Apache-2.0
// scoped_device over simulated devices: it makes the device current and restores the caller's,
// makes no call when the device already is current (counted), nests, and refuses a device out of
// range without changing anything. Host upstreams and host_vmm labelled with a device run each
// call on it (counted switches, the current device after each call unchanged); unlabelled ones
// make no call. The CUDA upstreams keep the device they are given, compare by it, and report a
// device that cannot be made current as the call `cudaSetDevice` (with or without a GPU).
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <string>
#include <thread>

#include <alloy/device.hpp>
#include <alloy/literals.hpp>
#include <alloy/simulated_devices.hpp>
#include <alloy/upstream/host_upstream.hpp>
#include <alloy/vmm/host_vmm.hpp>
#if ALLOY_HAS_CUDA
#  include <alloy/upstream/cuda_async_upstream.hpp>
#  include <alloy/upstream/cuda_malloc_upstream.hpp>
#  include <alloy/upstream/managed_upstream.hpp>
#  include <alloy/upstream/pinned_host_upstream.hpp>
#  include <alloy/vmm/cuda_vmm.hpp>
#endif

using namespace alloy::literals;

namespace {

using sim = alloy::simulated_devices;
using sim_guard = alloy::basic_scoped_device<sim>;

/// Starts a test with device `d` current and no call counted.
void start_on(int d) {
  BOOST_REQUIRE(sim::set(d) == 0);
  sim::reset_calls();
}

}  // namespace

BOOST_AUTO_TEST_CASE(switches_and_restores) {
  start_on(1);
  {
    const sim_guard guard{5};
    BOOST_TEST(guard.ok());
    BOOST_TEST(guard.switched());
    BOOST_TEST(guard.previous() == 1);
    BOOST_TEST(sim::current() == 5);
    {
      const sim_guard inner{2};
      BOOST_TEST(sim::current() == 2);
    }
    BOOST_TEST(sim::current() == 5, "the inner guard restores the outer one's device");
  }
  BOOST_TEST(sim::current() == 1, "the caller's device is current again");
  // Two guards, each a get, a set and a restoring set.
  BOOST_TEST(sim::calls().gets == 2u);
  BOOST_TEST(sim::calls().sets == 4u);
}

BOOST_AUTO_TEST_CASE(no_call_when_already_current) {
  start_on(3);
  for (int i = 0; i < 10; ++i) {
    const sim_guard guard{3};
    BOOST_TEST(guard.ok());
    BOOST_TEST(!guard.switched());
  }
  BOOST_TEST(sim::calls().gets == 10u, "one read each");
  BOOST_TEST(sim::calls().sets == 0u, "no set when the device already is current");
  {
    const sim_guard unbound{-1};
    BOOST_TEST(unbound.ok());
  }
  BOOST_TEST(sim::calls().gets == 10u, "a negative device (unbound) makes no call at all");
  BOOST_TEST(sim::current() == 3);
}

BOOST_AUTO_TEST_CASE(a_device_out_of_range_is_refused) {
  start_on(2);
  {
    const sim_guard guard{sim::count};
    BOOST_TEST(!guard.ok());
    BOOST_TEST(!static_cast<bool>(guard));
    BOOST_TEST(guard.status() == sim::invalid_device);
    BOOST_TEST(!guard.switched());
    BOOST_TEST(sim::current() == 2, "nothing changed");
  }
  BOOST_TEST(sim::current() == 2, "and nothing is restored");
  BOOST_TEST(sim::calls().refused == 1u);
  BOOST_TEST(sim::calls().sets == 0u);
}

BOOST_AUTO_TEST_CASE(each_thread_has_its_own_current_device) {
  start_on(4);
  int seen_first = -1;
  int seen_after = -1;
  std::thread other([&] {
    seen_first = sim::current();
    const sim_guard guard{6};
    seen_after = sim::current();
  });
  other.join();
  BOOST_TEST(seen_first == 0, "a new thread starts on device 0, as in CUDA");
  BOOST_TEST(seen_after == 6);
  BOOST_TEST(sim::current() == 4, "another thread's switch leaves this thread's device alone");
}

BOOST_AUTO_TEST_CASE(labelled_host_upstream_runs_each_call_on_its_device) {
  alloy::host_upstream labelled{{.device = 3}};
  BOOST_TEST(labelled.device() == 3);
  start_on(0);
  const alloy::block b = labelled.allocate(1000, 64);
  BOOST_REQUIRE(static_cast<bool>(b));
  std::memset(b.ptr, 0x5a, b.size);
  labelled.deallocate(b);
  BOOST_TEST(sim::current() == 0);
  BOOST_TEST(sim::calls().sets == 4u, "two calls, each switched to device 3 and back");
  start_on(3);
  labelled.deallocate(labelled.allocate(10, 8));
  BOOST_TEST(sim::calls().sets == 0u, "already on its device: no switch");

  alloy::host_upstream plain;
  BOOST_TEST(plain.device() == -1);
  plain.deallocate(plain.allocate(10, 8));
  BOOST_TEST(sim::calls().gets == 2u, "an unlabelled upstream makes no device call");

  alloy::host_upstream out_of_range{{.device = sim::count}};
  BOOST_TEST(!out_of_range.allocate(10, 8), "a device that cannot be made current: an empty block");

  BOOST_TEST((plain == alloy::host_upstream{}));
  BOOST_TEST((labelled == alloy::host_upstream{{.device = 3}}));
  BOOST_TEST(!(labelled == plain));
  BOOST_TEST(!(labelled == alloy::host_upstream{{.device = 2}}));
}

BOOST_AUTO_TEST_CASE(labelled_host_vmm_runs_each_call_on_its_device) {
  alloy::host_vmm vmm{{.granularity = 64_KiB, .device = 5}};
  BOOST_TEST(vmm.device() == 5);
  start_on(1);
  const alloy::address_range range = vmm.reserve(128_KiB);
  BOOST_REQUIRE(static_cast<bool>(range));
  const alloy::physical_memory piece = vmm.create(64_KiB);
  BOOST_REQUIRE(static_cast<bool>(piece));
  BOOST_REQUIRE(vmm.map(range.ptr, piece));
  std::memset(range.ptr, 0x3c, 64_KiB);
  BOOST_TEST(static_cast<unsigned char*>(range.ptr)[64_KiB - 1] == 0x3c);
  vmm.unmap(range.ptr, 64_KiB);
  vmm.release(piece);
  vmm.unreserve(range);
  BOOST_TEST(sim::current() == 1);
  BOOST_TEST(sim::calls().sets == 12u, "six calls, each on device 5 and back");

  alloy::host_vmm refused{{.granularity = 64_KiB, .device = sim::count + 1}};
  BOOST_TEST(!refused.reserve(64_KiB));
  BOOST_TEST(!refused.create(64_KiB), "every call fails when its device cannot be made current");
  BOOST_TEST(refused.physical_bytes() == 0u);
  BOOST_TEST(refused.calls().failures == 2u);
}

#if ALLOY_HAS_CUDA
BOOST_AUTO_TEST_CASE(cuda_upstreams_keep_their_device) {
  // A device given explicitly is kept as given (no CUDA call at construction).
  const alloy::cuda_malloc_upstream on_two{{.device = 2}};
  BOOST_TEST(on_two.device() == 2);
  BOOST_TEST((on_two == alloy::cuda_malloc_upstream{{.device = 2}}));
  BOOST_TEST(!(on_two == alloy::cuda_malloc_upstream{{.device = 1}}));
  BOOST_TEST(alloy::pinned_host_upstream{{.device = 1}}.device() == 1);
  BOOST_TEST(alloy::managed_upstream{{.device = 3}}.device() == 3);
  const alloy::cuda_async_upstream async_on_one{{.device = 1}};
  BOOST_TEST(async_on_one.device() == 1);
  BOOST_TEST(!(async_on_one == alloy::cuda_async_upstream{{.device = 0}}));

  // Device 1000 exists nowhere: the switch fails before any allocation call, with a GPU or not.
  alloy::cuda_malloc_upstream nowhere{{.device = 1000}};
  BOOST_TEST(!nowhere.allocate(256, 256));
  BOOST_REQUIRE(static_cast<bool>(nowhere.last_error()));
  BOOST_TEST(std::string(nowhere.last_error().call) == "cudaSetDevice");
  alloy::cuda_async_upstream async_nowhere{{.device = 1000}};
  BOOST_TEST(!async_nowhere.allocate(256, 256));
  BOOST_REQUIRE(static_cast<bool>(async_nowhere.last_error()));
  BOOST_TEST(std::string(async_nowhere.last_error().call) == "cudaSetDevice");

  // The current device at construction: -1 when none can be had, else a real ordinal.
  int count = 0;
  const bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  const alloy::cuda_malloc_upstream current;
  if (present) {
    BOOST_TEST(current.device() == alloy::current_device());
  } else {
    BOOST_TEST(current.device() == -1, "no device: unbound, and its calls fail as before");
  }
  alloy::cuda_vmm vmm{{.device = 1000}};
  BOOST_TEST(!vmm.valid());
}
#endif
