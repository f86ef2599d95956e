// SPDX-License-Identifier: Apache-2.0
// alloy/vmm/virtual_memory.hpp: the `virtual_memory` concept, what a virtual-memory backend offers
// (docs/design.md#virtual-memory).
//
// A backend separates addresses from physical memory, as CUDA's virtual memory management does
// (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemUnmap`, `cuMemRelease`): a policy
// reserves a long range of addresses once, then creates physical pieces in multiples of the
// granularity and maps them into the range where it needs memory, and unmaps and releases them
// when it does not. Physical memory is the limited resource (a backend's `capacity`); addresses
// are plentiful. Every call is noexcept; failure is an empty result, a normal event.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include <alloy/concepts.hpp>

namespace alloy {

/// Addresses reserved from a backend: no memory behind them until something is mapped there.
struct address_range {
  void* ptr = nullptr;
  std::size_t size = 0;
  explicit operator bool() const noexcept { return ptr != nullptr; }
};

/// A piece of physical memory a backend created: `size` bytes (a multiple of the granularity)
/// that can be mapped at one place at a time. `id` is the backend's name for it; 0 is never one.
struct physical_memory {
  std::uint64_t id = 0;
  std::size_t size = 0;
  explicit operator bool() const noexcept { return id != 0; }
};

/// A virtual-memory backend.
///
/// - `granularity()`: the unit of physical memory and of mapping (a power of two; 2 MiB on
///   today's GPUs). Sizes and addresses below are multiples of it.
/// - `reserve(bytes)`: a range of `bytes` addresses aligned to the granularity, or an empty
///   range; `unreserve(range)` gives back a whole range reserved before (nothing mapped in it).
/// - `create(bytes)`: physical memory, or an empty one when the backend's capacity or the
///   memory itself runs out; `release(piece)` gives it back (it must not be mapped).
/// - `map(at, piece)`: makes `[at, at + piece.size)` readable and writable memory backed by the
///   piece; false when it failed (nothing changed). `unmap(at, bytes)` undoes one whole map.
/// - `capacity()`: the most physical bytes that may exist at once; `physical_bytes()`: how many
///   exist now (created, not released).
/// - `host_accessible`, `device_accessible`: the memory kind, as every allocator has.
template <class V>
concept virtual_memory = memory_kind_aware<V> && requires(V& v, const V& cv, std::size_t bytes, void* at,
                                                          address_range range, physical_memory piece) {
  { cv.granularity() } noexcept -> std::same_as<std::size_t>;
  { v.reserve(bytes) } noexcept -> std::same_as<address_range>;
  { v.unreserve(range) } noexcept;
  { v.create(bytes) } noexcept -> std::same_as<physical_memory>;
  { v.release(piece) } noexcept;
  { v.map(at, piece) } noexcept -> std::same_as<bool>;
  { v.unmap(at, bytes) } noexcept;
  { cv.capacity() } noexcept -> std::same_as<std::size_t>;
  { cv.physical_bytes() } noexcept -> std::same_as<std::size_t>;
};

/// A backend that several threads may call at once (`V::thread_safe` is true: `synchronized_vmm`,
/// and `vmm_ref` of one). Only over such a backend does `virtual_arena` offer planned growth
/// (`growth_planning_allocator`), whose creates and maps run outside the caller's lock.
template <class V>
concept thread_safe_vmm = virtual_memory<V> && requires { requires static_cast<bool>(V::thread_safe); };

/// `vmm_ref<V>` refers to a backend owned elsewhere and forwards every call to it, so several
/// policies share one backend and its `capacity` (as `ref` does for allocators; backends are not
/// allocators). The backend must outlive the ref. Adds no synchronization: thread-safe exactly
/// when `V` is (`thread_safe_vmm`).
template <virtual_memory V>
class vmm_ref {
 public:
  static constexpr bool host_accessible = V::host_accessible;
  static constexpr bool device_accessible = V::device_accessible;
  static constexpr bool thread_safe = thread_safe_vmm<V>;

  explicit vmm_ref(V& target) noexcept : target_(&target) {}

  std::size_t granularity() const noexcept { return target_->granularity(); }
  address_range reserve(std::size_t bytes) noexcept { return target_->reserve(bytes); }
  void unreserve(address_range range) noexcept { target_->unreserve(range); }
  physical_memory create(std::size_t bytes) noexcept { return target_->create(bytes); }
  void release(physical_memory piece) noexcept { target_->release(piece); }
  bool map(void* at, physical_memory piece) noexcept { return target_->map(at, piece); }
  void unmap(void* at, std::size_t bytes) noexcept { target_->unmap(at, bytes); }
  std::size_t capacity() const noexcept { return target_->capacity(); }
  std::size_t physical_bytes() const noexcept { return target_->physical_bytes(); }

  V& get() const noexcept { return *target_; }
  friend bool operator==(const vmm_ref& l, const vmm_ref& r) noexcept { return l.target_ == r.target_; }

 private:
  V* target_;
};

}  // namespace alloy
