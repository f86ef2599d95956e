// SPDX-License-Identifier: Apache-2.0
// alloy/vmm/cuda_vmm.hpp: the `virtual_memory` backend of a CUDA device, on the driver's virtual
// memory management (docs/design.md#virtual-memory).
#pragma once

#include <alloy/config.hpp>

#if ALLOY_HAS_CUDA && __has_include(<cuda.h>) && __has_include(<cudaTypedefs.h>)

#  include <cstddef>
#  include <cstdint>
#  include <limits>

#  include <cuda.h>  // the driver's types only: nothing here links libcuda
#  include <cudaTypedefs.h>
#  include <cuda_runtime_api.h>

#  include <alloy/detail/align.hpp>
#  include <alloy/device.hpp>
#  include <alloy/error.hpp>
#  include <alloy/vmm/virtual_memory.hpp>

namespace alloy {

/// A failed CUDA driver call remembered by `cuda_vmm` until an edge reports it (the driver-API
/// twin of `cuda_status`).
struct cuda_driver_status {
  CUresult code = CUDA_SUCCESS;
  const char* name = nullptr;  ///< the driver's name of the error, when it could be had
  const char* call = nullptr;
  const char* file = nullptr;
  int line = 0;

  explicit operator bool() const noexcept { return code != CUDA_SUCCESS; }
  cuda_error to_exception() const {
    return cuda_error(static_cast<int>(code), name != nullptr ? name : "CUresult", call != nullptr ? call : "?",
                      file != nullptr ? file : "?", line);
  }
};

/// `cuda_vmm`: device memory through the CUDA driver's virtual memory management, for one device.
///
/// - Entry points: `cuMemGetAllocationGranularity`, `cuMemAddressReserve`/`Free`, `cuMemCreate`/
///   `Release`, `cuMemMap`/`Unmap`, `cuMemSetAccess`, `cuDeviceGet`, `cuDeviceTotalMem` and
///   `cuGetErrorName` are looked up once, at construction, through the runtime's
///   `cudaGetDriverEntryPointByVersion` (ABI of CUDA 12.0), so nothing links `libcuda`.
/// - Physical memory: pinned device memory on the device (`options::device`, default the current
///   one), created in multiples of the driver's minimum granularity (2 MiB on current GPUs);
///   `capacity` limits the bytes created at once (default: the device's total memory). Every
///   driver and runtime call runs with that device current (`scoped_device`).
/// - `reserve` is `cuMemAddressReserve` aligned to the granularity, `map` is `cuMemMap` followed
///   by `cuMemSetAccess` (read and write for the device; undone if that fails), `unmap` is
///   `cudaDeviceSynchronize` on the device, then `cuMemUnmap`; `release` is `cuMemRelease`.
///   `cuMemUnmap` does not wait for work queued on the range as `cudaFree` does: a kernel still
///   reading a block freed in stream order would fault when its granule went.
///   Waiting makes an unmap cost what a `cudaFree` costs; `virtual_allocator` unmaps only when
///   the device runs short or on `release()`.
/// - Cost: each call is a driver call of about a `cudaMalloc`'s cost, nearly the same for a piece
///   of several granules as for one (`map` is mostly `cuMemSetAccess`, per mapping whatever its
///   size): bench/README.md#virtual-memory.
/// - Failure: every call is noexcept. `CUDA_ERROR_OUT_OF_MEMORY` is a normal event: an empty
///   result, nothing kept. Any other failure is an empty result too (or `false`) and is kept in
///   `last_error()` (the driver's code and name, the call, file and line) for the edges, as the
///   CUDA upstreams do. If the entry points cannot be had (no driver), `valid()` is false, the
///   reason is in `last_error()`, and every call fails.
/// - Thread safety: as the driver (safe), apart from `physical_bytes()`, `calls()` and
///   `last_error()`, which are plain members. Movable, not copyable (it keeps the physical-byte
///   count); several users share one through `vmm_ref<cuda_vmm>`, several threads through
///   `synchronized_vmm<cuda_vmm>`.
/// - Memory kind: device only.
class cuda_vmm {
 public:
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;

  struct options {
    int device = -1;           ///< CUDA device ordinal; -1: the current device at construction
    std::size_t capacity = 0;  ///< physical bytes at most; 0: the device's total memory
  };

  /// What the backend was asked (successful calls), for tests and statistics.
  struct call_counts {
    std::size_t creates = 0;
    std::size_t releases = 0;
    std::size_t maps = 0;
    std::size_t unmaps = 0;
    std::size_t reserves = 0;
    std::size_t unreserves = 0;
  };

  cuda_vmm() noexcept : cuda_vmm(options{}) {}
  explicit cuda_vmm(options opts) noexcept {
    device_ = opts.device;
    if (device_ < 0) {
      const cudaError_t got = cudaGetDevice(&device_);  // also starts the driver (cuInit)
      if (got != cudaSuccess) {
        cudaGetLastError();
        last_error_ = {static_cast<CUresult>(CUDA_ERROR_NOT_INITIALIZED), cudaGetErrorName(got), "cudaGetDevice",
                       __FILE__, __LINE__};
        return;
      }
    } else {
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess || opts.device >= count) {
        cudaGetLastError();
        last_error_ = {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "cudaGetDeviceCount", __FILE__,
                       __LINE__};
        return;
      }
    }
    const on_device on{device_};
    if (!entered(on)) return;
    if (!load_entry_points()) return;
    CUdevice dev = 0;
    if (!ok(fn_.device_get(&dev, device_), "cuDeviceGet", __LINE__)) return;
    prop_ = CUmemAllocationProp{};
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device_;
    access_ = CUmemAccessDesc{};
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    std::size_t g = 0;
    if (!ok(fn_.granularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity", __LINE__))
      return;
    if (!detail::is_power_of_two(g)) {
      last_error_ = {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "cuMemGetAllocationGranularity", __FILE__,
                     __LINE__};
      return;
    }
    granularity_ = g;
    capacity_ = opts.capacity;
    if (capacity_ == 0) {
      std::size_t total = 0;
      if (!ok(fn_.total_mem(&total, dev), "cuDeviceTotalMem", __LINE__)) return;
      capacity_ = total;
    }
    valid_ = true;
  }
  cuda_vmm(const cuda_vmm&) = delete;
  cuda_vmm& operator=(const cuda_vmm&) = delete;
  cuda_vmm(cuda_vmm&&) noexcept = default;
  cuda_vmm& operator=(cuda_vmm&&) noexcept = default;
  ~cuda_vmm() = default;

  // ---- the virtual_memory concept --------------------------------------------------------------

  /// The driver's minimum granularity (0 when `valid()` is false).
  std::size_t granularity() const noexcept { return granularity_; }
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t physical_bytes() const noexcept { return physical_; }

  address_range reserve(std::size_t bytes) noexcept {
    if (!valid_) return {};
    const on_device on{device_};
    if (!entered(on)) return {};
    const std::size_t size = detail::round_up(bytes, granularity_);
    if (size == 0) return {};
    CUdeviceptr ptr = 0;
    if (!ok(fn_.address_reserve(&ptr, size, granularity_, 0, 0), "cuMemAddressReserve", __LINE__)) return {};
    ++calls_.reserves;
    return {reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)), size};
  }

  void unreserve(address_range range) noexcept {
    if (!valid_ || !range) return;
    const on_device on{device_};
    (void)entered(on);  // kept; the call is tried anyway: it names what it gives back
    if (ok(fn_.address_free(address_of(range.ptr), range.size), "cuMemAddressFree", __LINE__)) ++calls_.unreserves;
  }

  physical_memory create(std::size_t bytes) noexcept {
    if (!valid_) return {};
    const on_device on{device_};
    if (!entered(on)) return {};
    const std::size_t size = detail::round_up(bytes, granularity_);
    if (size == 0 || size > capacity_ - physical_) return {};
    CUmemGenericAllocationHandle handle = 0;
    if (!ok(fn_.create(&handle, size, &prop_, 0), "cuMemCreate", __LINE__)) return {};
    if (handle == 0) {  // 0 means "none" to the concept: give it back and report it
      fn_.release(handle);
      last_error_ = {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "cuMemCreate (handle 0)", __FILE__, __LINE__};
      return {};
    }
    physical_ += size;
    ++calls_.creates;
    return {static_cast<std::uint64_t>(handle), size};
  }

  void release(physical_memory piece) noexcept {
    if (!valid_ || !piece) return;
    const on_device on{device_};
    (void)entered(on);  // kept; the call is tried anyway: it names what it gives back
    if (ok(fn_.release(static_cast<CUmemGenericAllocationHandle>(piece.id)), "cuMemRelease", __LINE__)) {
      physical_ -= piece.size;
      ++calls_.releases;
    }
  }

  bool map(void* at, physical_memory piece) noexcept {
    if (!valid_ || !piece || at == nullptr) return false;
    const on_device on{device_};
    if (!entered(on)) return false;
    const CUdeviceptr where = address_of(at);
    if (!ok(fn_.map(where, piece.size, 0, static_cast<CUmemGenericAllocationHandle>(piece.id), 0), "cuMemMap",
            __LINE__))
      return false;
    if (!ok(fn_.set_access(where, piece.size, &access_, 1), "cuMemSetAccess", __LINE__)) {
      fn_.unmap(where, piece.size);
      return false;
    }
    ++calls_.maps;
    return true;
  }

  void unmap(void* at, std::size_t bytes) noexcept {
    if (!valid_ || at == nullptr || bytes == 0) return;
    const on_device on{device_};
    (void)entered(on);  // kept; the call is tried anyway: it names what it gives back
    wait_for_device();  // on failure (a sticky error) the range goes anyway: nothing can use it
    if (ok(fn_.unmap(address_of(at), bytes), "cuMemUnmap", __LINE__)) ++calls_.unmaps;
  }

  // ---- beyond the concept ----------------------------------------------------------------------

  /// Whether the driver's entry points and the device's properties could be had.
  bool valid() const noexcept { return valid_; }
  int device() const noexcept { return device_; }
  const call_counts& calls() const noexcept { return calls_; }
  /// The last failure other than out of memory (empty when none).
  const cuda_driver_status& last_error() const noexcept { return last_error_; }
  void clear_error() noexcept {
    if (valid_) last_error_ = {};
  }

 private:
  struct entry_points {
    PFN_cuGetErrorName_v6000 error_name = nullptr;
    PFN_cuDeviceGet_v2000 device_get = nullptr;
    PFN_cuDeviceTotalMem_v3020 total_mem = nullptr;
    PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
    PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
    PFN_cuMemAddressFree_v10020 address_free = nullptr;
    PFN_cuMemCreate_v10020 create = nullptr;
    PFN_cuMemRelease_v10020 release = nullptr;
    PFN_cuMemMap_v10020 map = nullptr;
    PFN_cuMemUnmap_v10020 unmap = nullptr;
    PFN_cuMemSetAccess_v10020 set_access = nullptr;
  };

  static CUdeviceptr address_of(void* p) noexcept {
    return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
  }

  template <class Fn>
  bool load(const char* symbol, Fn& fn) noexcept {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t status = cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found);
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
      cudaGetLastError();
      last_error_ = {CUDA_ERROR_NOT_FOUND, status != cudaSuccess ? cudaGetErrorName(status) : "CUDA_ERROR_NOT_FOUND",
                     symbol, __FILE__, __LINE__};
      return false;
    }
    fn = reinterpret_cast<Fn>(address);
    return true;
  }
  bool load_entry_points() noexcept {
    return load("cuGetErrorName", fn_.error_name) && load("cuDeviceGet", fn_.device_get) &&
           load("cuDeviceTotalMem", fn_.total_mem) && load("cuMemGetAllocationGranularity", fn_.granularity) &&
           load("cuMemAddressReserve", fn_.address_reserve) && load("cuMemAddressFree", fn_.address_free) &&
           load("cuMemCreate", fn_.create) && load("cuMemRelease", fn_.release) && load("cuMemMap", fn_.map) &&
           load("cuMemUnmap", fn_.unmap) && load("cuMemSetAccess", fn_.set_access);
  }

  using on_device = basic_scoped_device<cuda_devices>;

  /// True when the guard made the device current; otherwise keeps why.
  bool entered(const on_device& on) noexcept {
    if (on) [[likely]]
      return true;
    last_error_ = {CUDA_ERROR_INVALID_DEVICE, cudaGetErrorName(static_cast<cudaError_t>(on.status())), "cudaSetDevice",
                   __FILE__, __LINE__};
    return false;
  }

  /// Waits until the device (current: the caller's guard) has finished all work queued so far,
  /// as `cudaFree` does. Failure is kept in `last_error()`.
  void wait_for_device() noexcept {
    const cudaError_t status = cudaDeviceSynchronize();
    if (status != cudaSuccess) {
      cudaGetLastError();
      last_error_ = {CUDA_ERROR_UNKNOWN, cudaGetErrorName(status), "cudaDeviceSynchronize", __FILE__, __LINE__};
    }
  }

  /// True when `code` is success; otherwise keeps it (unless it is out of memory, a normal event).
  bool ok(CUresult code, const char* call, int line) noexcept {
    if (code == CUDA_SUCCESS) [[likely]]
      return true;
    if (code != CUDA_ERROR_OUT_OF_MEMORY) {
      const char* name = nullptr;
      if (fn_.error_name == nullptr || fn_.error_name(code, &name) != CUDA_SUCCESS) name = nullptr;
      last_error_ = {code, name, call, __FILE__, line};
    }
    return false;
  }

  entry_points fn_{};
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  int device_ = 0;
  bool valid_ = false;
  std::size_t granularity_ = 0;
  std::size_t capacity_ = 0;
  std::size_t physical_ = 0;
  call_counts calls_{};
  cuda_driver_status last_error_{};
};

}  // namespace alloy

#endif  // ALLOY_HAS_CUDA
