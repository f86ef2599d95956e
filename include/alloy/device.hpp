// SPDX-License-Identifier: Apache-2.0
// alloy/device.hpp: the calling thread's current device, and `scoped_device`, which makes a
// device current for a scope (docs/design.md#devices).
#pragma once

#include <concepts>

#include <alloy/config.hpp>
#include <alloy/simulated_devices.hpp>

#if ALLOY_HAS_CUDA
#  include <cuda_runtime_api.h>
#endif

namespace alloy {

/// A device context: where the calling thread's current device is kept. Static and noexcept:
/// `C::get(device)` returns 0 and sets `device` to the calling thread's current device, or
/// returns an error code; `C::set(device)` returns 0 when `device` is current now, or an error
/// code (nothing changed). `cuda_devices` (the CUDA runtime) and `simulated_devices` (tests).
template <class C>
concept device_context = requires(int& out, int device) {
  { C::get(out) } noexcept -> std::same_as<int>;
  { C::set(device) } noexcept -> std::same_as<int>;
};

#if ALLOY_HAS_CUDA
/// The CUDA runtime's current device (`cudaGetDevice` / `cudaSetDevice`). A failure is returned
/// as its `cudaError_t` and cleared from the runtime (`cudaGetLastError`), never thrown.
struct cuda_devices {
  static int get(int& device) noexcept { return checked(cudaGetDevice(&device)); }
  static int set(int device) noexcept { return checked(cudaSetDevice(device)); }

 private:
  static int checked(cudaError_t status) noexcept {
    if (status == cudaSuccess) return 0;
    cudaGetLastError();
    return static_cast<int>(status);
  }
};
/// The context `scoped_device` and `per_device` use: CUDA's in CUDA builds.
using default_device_context = cuda_devices;
#else
/// The context `scoped_device` and `per_device` use: simulated devices without CUDA.
using default_device_context = simulated_devices;
#endif

/// `basic_scoped_device<Context>` makes a device current for the calling thread until the end of
/// the scope, then makes the caller's device current again.
///
/// - Strategy: one `get`; when the device asked for is already current, nothing more (no `set`,
///   no restore); otherwise one `set` now and one at the end. A negative device (-1: "unbound",
///   a part not labelled with a device) makes no call at all.
/// - Complexity: at most three context calls. Not copyable or movable (it belongs to a scope).
/// - Failure: `ok()` is false and `status()` the context's error code (a `cudaError_t` for
///   `cuda_devices`) when the device could not be made current; the current device is then
///   unchanged and nothing is restored. Never throws; a failed restore is cleared and ignored.
/// - Thread safety: it changes the calling thread's current device only.
template <device_context Context>
class basic_scoped_device {
 public:
  using context_type = Context;

  explicit basic_scoped_device(int device) noexcept {
    if (device < 0) return;
    status_ = Context::get(previous_);
    if (status_ == 0 && previous_ == device) return;
    if (status_ != 0) previous_ = -1;
    status_ = Context::set(device);
    switched_ = status_ == 0 && previous_ >= 0;
  }
  basic_scoped_device(const basic_scoped_device&) = delete;
  basic_scoped_device& operator=(const basic_scoped_device&) = delete;
  ~basic_scoped_device() {
    if (switched_) (void)Context::set(previous_);
  }

  /// Whether the device asked for is current (always, for a negative device).
  bool ok() const noexcept { return status_ == 0; }
  explicit operator bool() const noexcept { return ok(); }
  /// 0, or the context's error code of the failed call.
  int status() const noexcept { return status_; }
  /// Whether the guard changed the current device (and will restore `previous()`).
  bool switched() const noexcept { return switched_; }
  /// The caller's device, as read at construction (-1: not read, or it could not be).
  int previous() const noexcept { return previous_; }

 private:
  int previous_ = -1;
  int status_ = 0;
  bool switched_ = false;
};

/// `alloy::scoped_device guard{d}`: `d` is the calling thread's current device until the guard
/// ends (CUDA's devices in CUDA builds, `simulated_devices` otherwise).
using scoped_device = basic_scoped_device<default_device_context>;

/// The calling thread's current device in `Context` (-1 when it could not be had).
template <device_context Context = default_device_context>
int current_device() noexcept {
  int device = -1;
  return Context::get(device) == 0 ? device : -1;
}

}  // namespace alloy
