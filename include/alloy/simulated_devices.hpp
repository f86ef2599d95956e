// SPDX-License-Identifier: Apache-2.0
// alloy/simulated_devices.hpp: devices simulated on the host, so that code bound to devices is
// tested without a GPU (docs/design.md#devices, docs/design.md#testing-without-a-gpu).
#pragma once

#include <cstddef>

namespace alloy {

/// A thread's calls to `simulated_devices`.
struct simulated_device_calls {
  std::size_t gets = 0;
  std::size_t sets = 0;     ///< successful sets, including one to the device already current
  std::size_t refused = 0;  ///< sets refused (device out of range)
};

namespace detail {
struct simulated_device_state {
  int current = 0;
  simulated_device_calls calls{};
};
/// Each thread's simulated current device: the one thread-local variable of alloy (see below).
inline thread_local simulated_device_state simulated_device_of_thread{};
}  // namespace detail

/// `simulated_devices`: the device context of `basic_scoped_device` for host-only tests: `count`
/// devices, numbered from 0, and a current one per thread, as the CUDA runtime keeps it.
///
/// - Strategy: each thread's current device (0 until it sets one, as in CUDA) and its call counts
///   are `thread_local`: the one piece of thread-local state in alloy (docs/design.md#style), so
///   that `scoped_device` keeps its CUDA spelling (`scoped_device guard{d}`, no object to pass)
///   in builds without CUDA and host upstreams labelled with a device can switch to it.
/// - `get(d)` reads the calling thread's device; `set(d)` makes `d` current, or refuses a device
///   outside `[0, count)` with `invalid_device` and changes nothing. `calls()` counts the calling
///   thread's gets, sets and refusals, so a test sees that a guard made no call.
/// - Complexity: O(1) each. Failure: an error code, never an exception.
/// - Thread safety: every call reads or writes only the calling thread's state.
struct simulated_devices {
  /// The number of simulated devices (out of range: `invalid_device`).
  static constexpr int count = 8;
  /// The error code of a refused `set` (the number `cudaErrorInvalidDevice` has in CUDA).
  static constexpr int invalid_device = 101;

  /// The calling thread's calls so far.
  using call_counts = simulated_device_calls;

  /// 0, with `device` the calling thread's current device.
  static int get(int& device) noexcept {
    ++state().calls.gets;
    device = state().current;
    return 0;
  }
  /// 0 when `device` is the calling thread's current device now; `invalid_device` otherwise.
  static int set(int device) noexcept {
    if (device < 0 || device >= count) {
      ++state().calls.refused;
      return invalid_device;
    }
    ++state().calls.sets;
    state().current = device;
    return 0;
  }
  /// The calling thread's current device (not counted as a call).
  static int current() noexcept { return state().current; }
  static call_counts calls() noexcept { return state().calls; }
  static void reset_calls() noexcept { state().calls = {}; }

 private:
  static detail::simulated_device_state& state() noexcept { return detail::simulated_device_of_thread; }
};

}  // namespace alloy
