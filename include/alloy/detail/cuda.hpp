// SPDX-License-Identifier: Apache-2.0
// alloy/detail/cuda.hpp: CUDA error handling shared by the CUDA upstreams and helpers.
#pragma once

#include <alloy/config.hpp>

#if ALLOY_HAS_CUDA

#  include <atomic>
#  include <thread>

#  include <cuda_runtime_api.h>

#  include <alloy/error.hpp>

namespace alloy {

/// A failed CUDA call remembered by a noexcept part until an edge reports it.
struct cuda_status {
  cudaError_t code = cudaSuccess;
  const char* call = nullptr;
  const char* file = nullptr;
  int line = 0;

  explicit operator bool() const noexcept { return code != cudaSuccess; }
  cuda_error to_exception() const {
    return cuda_error(static_cast<int>(code), cudaGetErrorName(code), call, file, line);
  }
};

namespace detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a sticky error so the next call starts clean
  throw cuda_error(static_cast<int>(code), cudaGetErrorName(code), call, file, line);
}

/// Base of the CUDA upstreams: keeps the last non-OOM failure for the edges (`last_error()`).
/// Out of memory is a normal event and is not kept; either way the runtime's error is cleared.
/// Synchronized: a failing call on one thread may record while another thread reads or clears
/// (the upstreams are `thread_safe`); the status sits behind a spin flag that only failures,
/// reads and clears take, so a successful call pays nothing. `last_error()` returns a copy.
class cuda_error_slot {
 public:
  cuda_error_slot() = default;
  cuda_error_slot(const cuda_error_slot& other) noexcept : last_error_(other.last_error()) {}
  cuda_error_slot& operator=(const cuda_error_slot& other) noexcept {
    if (this != &other) set(other.last_error());
    return *this;
  }
  ~cuda_error_slot() = default;

  cuda_status last_error() const noexcept {
    hold();
    const cuda_status status = last_error_;
    busy_.clear(std::memory_order_release);
    return status;
  }
  void clear_error() noexcept { set({}); }

 protected:
  void record(cudaError_t code, const char* call, const char* file, int line) noexcept {
    cudaGetLastError();
    if (code != cudaErrorMemoryAllocation) set({code, call, file, line});
  }

 private:
  void hold() const noexcept {
    while (busy_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  }
  void set(const cuda_status& status) noexcept {
    hold();
    last_error_ = status;
    busy_.clear(std::memory_order_release);
  }

  mutable std::atomic_flag busy_{};  // clear (C++20); held for a few stores or loads
  cuda_status last_error_{};
};

}  // namespace detail
}  // namespace alloy

/// Calls a CUDA runtime function and throws `alloy::cuda_error` naming the call, file and line
/// if it fails. For throwing code only; noexcept parts record into a `cuda_error_slot` instead.
#  define ALLOY_CUDA_TRY(call)                                                            \
    do {                                                                                  \
      const cudaError_t alloy_cuda_status_ = (call);                                      \
      if (alloy_cuda_status_ != cudaSuccess)                                              \
        ::alloy::detail::throw_cuda_error(alloy_cuda_status_, #call, __FILE__, __LINE__); \
    } while (false)

/// Inside a noexcept upstream: on failure, record it and return an empty block.
#  define ALLOY_CUDA_OR_EMPTY(call)                                  \
    do {                                                             \
      const cudaError_t alloy_cuda_status_ = (call);                 \
      if (alloy_cuda_status_ != cudaSuccess) {                       \
        this->record(alloy_cuda_status_, #call, __FILE__, __LINE__); \
        return {};                                                   \
      }                                                              \
    } while (false)

/// Inside a noexcept deallocate: on failure, record it (nothing else can be done there).
#  define ALLOY_CUDA_OR_RECORD(call)                                                                      \
    do {                                                                                                  \
      const cudaError_t alloy_cuda_status_ = (call);                                                      \
      if (alloy_cuda_status_ != cudaSuccess) this->record(alloy_cuda_status_, #call, __FILE__, __LINE__); \
    } while (false)

#endif  // ALLOY_HAS_CUDA

#if ALLOY_HAS_CUDA

#  include <cstddef>

#  include <alloy/block.hpp>
#  include <alloy/detail/align.hpp>
#  include <alloy/device.hpp>

namespace alloy::detail {

/// The device a CUDA part is bound to: `device` when not negative, else the calling thread's
/// current one (-1 when none can be had: no CUDA device; its calls then fail as they would).
inline int resolve_device(int device) noexcept { return device >= 0 ? device : current_device<cuda_devices>(); }

/// The synchronous CUDA upstreams differ only in their allocate and free calls; `Calls` names
/// them (`allocate`, `free`, their spellings for error messages, and the memory kind). Bound to
/// a device (`options::device`; -1: the current one at construction): every call runs with it
/// current (`scoped_device`: no runtime call when it already is); a device that cannot be made
/// current fails the allocation, kept in `last_error()` as the call `cudaSetDevice`.
template <class Calls>
class basic_cuda_upstream : public cuda_error_slot {
 public:
  struct options {
    int device = -1;  ///< CUDA device ordinal; -1: the current device at construction
  };
  static constexpr bool host_accessible = Calls::host_accessible;
  static constexpr bool device_accessible = Calls::device_accessible;
  static constexpr std::size_t max_alignment = 256;  // what every CUDA allocation call guarantees
  /// The runtime's calls may run on several threads at once (`thread_safe_upstream`); so may
  /// `last_error()` and `clear_error()` (synchronized: `cuda_error_slot`).
  static constexpr bool thread_safe = true;

  basic_cuda_upstream() noexcept : basic_cuda_upstream(options{}) {}
  explicit basic_cuda_upstream(options opts) noexcept : device_(resolve_device(opts.device)) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!is_power_of_two(alignment) || alignment > max_alignment) return {};
    const basic_scoped_device<cuda_devices> on{device_};
    if (!on) {
      record(static_cast<cudaError_t>(on.status()), "cudaSetDevice", __FILE__, __LINE__);
      return {};
    }
    void* ptr = nullptr;
    const cudaError_t status = Calls::allocate(&ptr, bytes == 0 ? 1 : bytes);
    if (status != cudaSuccess) {
      record(status, Calls::allocate_call, __FILE__, __LINE__);
      return {};
    }
    return {ptr, bytes};
  }

  void deallocate(block b) noexcept {
    if (!b) return;
    const basic_scoped_device<cuda_devices> on{device_};
    if (!on) record(static_cast<cudaError_t>(on.status()), "cudaSetDevice", __FILE__, __LINE__);
    const cudaError_t status = Calls::free(b.ptr);  // tried anyway: the runtime may still take it
    if (status != cudaSuccess) record(status, Calls::free_call, __FILE__, __LINE__);
  }

  /// The device every call runs on (-1: none could be had at construction).
  int device() const noexcept { return device_; }

  /// Equal when bound to the same device: either frees what the other allocated.
  friend bool operator==(const basic_cuda_upstream& l, const basic_cuda_upstream& r) noexcept {
    return l.device_ == r.device_;
  }

 private:
  int device_ = -1;
};

}  // namespace alloy::detail

#endif  // ALLOY_HAS_CUDA
