// SPDX-License-Identifier: Apache-2.0
// alloy/stream.hpp: the small stream/event vocabulary stream-ordered allocation is written against.
#pragma once

#include <concepts>

#include <alloy/config.hpp>

#if ALLOY_HAS_CUDA
#  include <cuda_runtime_api.h>

#  include <alloy/device.hpp>
#endif

namespace alloy {

/// `stream_traits<S>` teaches alloy a stream type `S`: an in-order queue of work, with events
/// that mark a point in it. Specialized for `cudaStream_t` (in CUDA builds) and for
/// `alloy::host_stream` (`<alloy/host_stream.hpp>`), so the ordering logic of
/// `alloy::stream_ordered` runs for real on machines without a GPU.
///
/// A specialization provides, all `noexcept`:
/// - `event_type`, default-constructible and movable; `create(event&) -> bool`, `destroy(event&)`;
/// - `record(event&, S) -> bool`: the event now marks the end of the work enqueued on `S` so far
///   (re-recording an event does not affect waits already enqueued on it);
/// - `wait(S, const event&) -> bool`: work enqueued on `S` afterwards starts only after the event
///   (a wait on the stream's side, as `cudaStreamWaitEvent`; the host does not block);
/// - `ready(const event&) -> bool`: the work before the event is done (a non-blocking query);
/// - `synchronize(const event&)` and `synchronize(S)`: block the host until done.
/// A `false` from `create`, `record` or `wait` means the stream could not do it (a CUDA error);
/// callers then fall back to a host synchronization, which is always correct.
template <class S>
struct stream_traits;

/// How a stream capture restricts the calls of other code (CUDA's `cudaStreamCaptureMode`; the
/// same values). alloy treats a mode it cannot learn (CUDA does not report it) as `global`.
enum class capture_mode : unsigned char { global = 0, thread_local_ = 1, relaxed = 2 };

/// Whether a stream is being captured into a graph (CUDA's `cudaStreamCaptureStatus`), and by
/// which capture (`id`, unique while the process runs; 0 when none).
struct capture_state {
  enum class status : unsigned char { none = 0, active = 1, invalidated = 2 };
  status state = status::none;
  capture_mode mode = capture_mode::global;
  unsigned long long id = 0;
  bool capturing() const noexcept { return state != status::none; }
};

/// A stream type alloy can order memory on (see `stream_traits`).
template <class S>
concept stream =
    std::equality_comparable<S> && std::copyable<S> &&
    requires(S s, typename stream_traits<S>::event_type& e, const typename stream_traits<S>::event_type& ce) {
      { stream_traits<S>::create(e) } noexcept -> std::same_as<bool>;
      { stream_traits<S>::destroy(e) } noexcept;
      { stream_traits<S>::record(e, s) } noexcept -> std::same_as<bool>;
      { stream_traits<S>::wait(s, ce) } noexcept -> std::same_as<bool>;
      { stream_traits<S>::ready(ce) } noexcept -> std::same_as<bool>;
      { stream_traits<S>::synchronize(ce) } noexcept;
      { stream_traits<S>::synchronize(s) } noexcept;
    };

/// A stream type that can be captured into a graph: `stream_traits<S>` also has
/// `capture(S) -> capture_state` (a cheap probe, no synchronization) and
/// `wait_external(S, const event&) -> bool` (a wait that a capture records as a wait on an event
/// from outside it, `cudaEventWaitExternal`). A stream type without them never captures.
template <class S>
concept capturable_stream = stream<S> && requires(S s, const typename stream_traits<S>::event_type& ce) {
  { stream_traits<S>::capture(s) } noexcept -> std::same_as<capture_state>;
  { stream_traits<S>::wait_external(s, ce) } noexcept -> std::same_as<bool>;
};

/// The capture state of `s` (none for a stream type that never captures).
template <stream S>
capture_state capture_of(S s) noexcept {
  if constexpr (capturable_stream<S>) return stream_traits<S>::capture(s);
  else return capture_state{};
}

#if ALLOY_HAS_CUDA
/// CUDA streams and events. Events are created with `cudaEventDisableTiming` (the cheap kind).
/// A failing call is reported by its `false` result and its sticky error is cleared, so the
/// caller's fallback (a host synchronization) starts clean. Records and waits run with the
/// stream's device current (`cudaStreamGetDevice`; no switch when it already is); an event made
/// on another device than the stream's is made again on the stream's when a record refuses it
/// (docs/design.md#devices).
template <>
struct stream_traits<cudaStream_t> {
  using event_type = cudaEvent_t;

  static bool create(cudaEvent_t& e) noexcept { return ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  static void destroy(cudaEvent_t& e) noexcept {
    if (e != nullptr) ok(cudaEventDestroy(e));
    e = nullptr;
  }
  static bool record(cudaEvent_t& e, cudaStream_t s) noexcept {
    const basic_scoped_device<cuda_devices> on{device_of(s)};
    if (!on) return false;
    if (e != nullptr && ok(cudaEventRecord(e, s))) return true;
    destroy(e);  // made on another device (or lost): made again here, on the stream's
    return create(e) && ok(cudaEventRecord(e, s));
  }
  static bool wait(cudaStream_t s, const cudaEvent_t& e) noexcept {
    const basic_scoped_device<cuda_devices> on{device_of(s)};
    return on && ok(cudaStreamWaitEvent(s, e, 0));
  }
  static bool ready(const cudaEvent_t& e) noexcept {
    const cudaError_t status = cudaEventQuery(e);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) {
      cudaGetLastError();
      synchronize(e);  // an event we cannot query is treated as done once waited for
      return true;
    }
    return false;
  }
  // If even a synchronization fails, the whole device is waited for: the caller is about to hand
  // the memory out again and must not do so early.
  static void synchronize(const cudaEvent_t& e) noexcept {
    if (!ok(cudaEventSynchronize(e))) ok(cudaDeviceSynchronize());
  }
  static void synchronize(cudaStream_t s) noexcept {
    if (!ok(cudaStreamSynchronize(s))) ok(cudaDeviceSynchronize());
  }
  // Capture (capturable_stream): CUDA does not report a capture's mode, so it counts as global.
  static capture_state capture(cudaStream_t s) noexcept {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    if (!ok(cudaStreamGetCaptureInfo(s, &status, &id))) return {capture_state::status::invalidated, {}, 0};
    return {static_cast<capture_state::status>(status), capture_mode::global, id};
  }
  static bool wait_external(cudaStream_t s, const cudaEvent_t& e) noexcept {
    return ok(cudaStreamWaitEvent(s, e, cudaEventWaitExternal));
  }

 private:
  static bool ok(cudaError_t status) noexcept {
    if (status == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }
  /// The stream's device (-1: unknown, and then the calls run on the current one).
  static int device_of(cudaStream_t s) noexcept {
#  if CUDART_VERSION >= 12080
    int device = -1;
    return ok(cudaStreamGetDevice(s, &device)) ? device : -1;
#  else
    (void)s;
    return -1;
#  endif
  }
};
#endif

}  // namespace alloy
