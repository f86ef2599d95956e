// SPDX-License-Identifier: Apache-2.0
// alloy/adaptor/thrust.hpp: alloy compositions under Thrust.
//
//   thrust::sort(alloy::thrust_policy(alloc, stream), keys.begin(), keys.end());  // scratch memory
//   thrust::device_vector<int, alloy::thrust_allocator<int, Alloc>> v(n, alloy::thrust_allocator<int, Alloc>{alloc});
//   alloy::thrust_resource mr{alloc};                                             // thrust::mr
//
// Every adaptor refers to an allocator the user owns (it holds `A*`), which must outlive it.
// Under nvcc with Thrust's CUDA system the policy is `thrust::cuda::par(alloc).on(stream)`; when
// Thrust is built for a host backend (THRUST_DEVICE_SYSTEM_CPP, OMP, TBB) it is that system's
// `par(alloc)`, and the composition must then be host-accessible, since host code touches it.
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <type_traits>

#include <nv/target>
#include <thrust/device_ptr.h>
#include <thrust/device_reference.h>
#include <thrust/execution_policy.h>
#include <thrust/mr/memory_resource.h>

#include <alloy/block.hpp>
#include <alloy/concepts.hpp>
#include <alloy/detail/edge.hpp>
#include <alloy/error.hpp>

namespace alloy {

namespace detail {

inline constexpr bool thrust_runs_on_cuda = THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA;

template <class A>
constexpr void check_thrust_memory_kind() {
  static_assert(thrust_runs_on_cuda || A::host_accessible,
                "alloy: Thrust is built for a host backend here, so its memory must be host-accessible");
  static_assert(!thrust_runs_on_cuda || A::device_accessible,
                "alloy: Thrust runs on CUDA here, so its memory must be device-accessible");
}

/// Alignment of every Thrust request: what cudaMalloc guarantees, so coalescing is unaffected.
inline constexpr std::size_t thrust_alignment = 256;

/// No stream: the allocator's plain calls are used.
struct no_stream {};

/// The allocator Thrust's algorithms draw their temporary storage from (Thrust's
/// "custom temporary allocation" protocol: `char* allocate(n)`, `deallocate(p, n)`). With a
/// stream and a composition that is stream-ordered over that stream type, the stream-ordered
/// calls are used, so scratch memory is ordered on the algorithm's stream.
template <allocator A, class Stream = no_stream>
class thrust_scratch_allocator {
 public:
  using value_type = char;

  explicit thrust_scratch_allocator(A& alloc, Stream stream = {}) noexcept
      : alloc_(std::addressof(alloc)), stream_(stream) {}

  char* allocate(std::ptrdiff_t n) {
    const auto bytes = static_cast<std::size_t>(n);
    if constexpr (stream_ordered_allocator<A, Stream>) {
      return static_cast<char*>(allocate_or_throw(*alloc_, bytes, thrust_alignment, stream_).ptr);
    } else {
      return static_cast<char*>(allocate_or_throw(*alloc_, bytes, thrust_alignment).ptr);
    }
  }
  void deallocate(char* p, std::size_t n) noexcept {
    if constexpr (stream_ordered_allocator<A, Stream>) {
      alloc_->deallocate(block{p, n}, stream_);
    } else {
      alloc_->deallocate(block{p, n});
    }
  }

  A& get_allocator() const noexcept { return *alloc_; }
  friend bool operator==(const thrust_scratch_allocator& l, const thrust_scratch_allocator& r) noexcept {
    return l.alloc_ == r.alloc_;
  }

 private:
  A* alloc_;
  Stream stream_;
};

}  // namespace detail

/// A Thrust execution policy whose temporary storage comes from `alloc`.
template <allocator A>
auto thrust_policy(A& alloc) {
  detail::check_thrust_memory_kind<A>();
  return thrust::device(detail::thrust_scratch_allocator<A>{alloc});
}

/// The same, ordered on `stream`: under CUDA, `thrust::cuda::par(alloc).on(stream)`. On a host
/// backend the algorithm runs synchronously on the calling thread and the stream only orders the
/// composition's stream-ordered calls, if it has them.
template <allocator A, class Stream>
auto thrust_policy(A& alloc, Stream stream) {
  detail::check_thrust_memory_kind<A>();
  // Passed as an rvalue: Thrust keeps an lvalue allocator by reference, which would dangle.
  using scratch = detail::thrust_scratch_allocator<A, Stream>;
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  return thrust::cuda::par(scratch{alloc, stream}).on(stream);
#else
  return thrust::device(scratch{alloc, stream});
#endif
}

/// `thrust_allocator<T, A>`: a standard allocator of `T` in Thrust's device space, for
/// `thrust::device_vector<T, thrust_allocator<T, A>>` and friends. Pointers are
/// `thrust::device_ptr<T>`; every request is 256-byte aligned (or `alignof(T)` if larger).
/// Failure throws `alloy::out_of_memory`. Allocators compare equal when they share `A`.
template <class T, allocator A>
class thrust_allocator {
 public:
  using value_type = T;
  using pointer = thrust::device_ptr<T>;
  using const_pointer = thrust::device_ptr<const T>;
  using reference = thrust::device_reference<T>;
  using const_reference = thrust::device_reference<const T>;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;
  template <class U>
  struct rebind {
    using other = thrust_allocator<U, A>;
  };

  explicit thrust_allocator(A& alloc) noexcept : alloc_(std::addressof(alloc)) {
    detail::check_thrust_memory_kind<A>();
  }
  template <class U>
  thrust_allocator(const thrust_allocator<U, A>& other) noexcept : alloc_(std::addressof(other.get_allocator())) {}

  pointer allocate(size_type n) {
    if (n > std::numeric_limits<size_type>::max() / sizeof(T)) {  // n * sizeof(T) overflows: SIZE_MAX asked
      detail::check_alignment(*alloc_, alignment);
      throw out_of_memory(detail::make_oom_report(*alloc_, std::numeric_limits<size_type>::max(), alignment));
    }
    return pointer(static_cast<T*>(detail::allocate_or_throw(*alloc_, n * sizeof(T), alignment).ptr));
  }
  void deallocate(pointer p, size_type n) noexcept {
    alloc_->deallocate(block{thrust::raw_pointer_cast(p), n * sizeof(T)});
  }

  A& get_allocator() const noexcept { return *alloc_; }
  template <class U>
  friend bool operator==(const thrust_allocator& l, const thrust_allocator<U, A>& r) noexcept {
    return l.alloc_ == std::addressof(r.get_allocator());
  }

 private:
  static constexpr std::size_t alignment = alignof(T) > detail::thrust_alignment ? alignof(T)
                                                                                 : detail::thrust_alignment;
  A* alloc_;
};

/// `thrust_resource<A>`: a `thrust::mr::memory_resource<>` over `alloc`, for `thrust::mr`
/// allocators and pools. Throws as the other edges do; equal when it refers to the same `A`.
template <allocator A>
class thrust_resource final : public thrust::mr::memory_resource<> {
 public:
  explicit thrust_resource(A& alloc) noexcept : alloc_(std::addressof(alloc)) {}

  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    return detail::allocate_or_throw(*alloc_, bytes, alignment).ptr;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { alloc_->deallocate(block{p, bytes}); }
  // Thrust declares this __host__ __device__; RTTI exists only on the host.
  // clang-format off: the specifiers behind #ifdef would otherwise split the declaration
#ifdef __CUDACC__
  __host__ __device__
#endif
  bool do_is_equal(const thrust::mr::memory_resource<>& other) const noexcept override {
    NV_IF_TARGET(NV_IS_HOST, (return refers_to_same_allocator(other);), (return this == &other;))
  }
  // clang-format on

  A& get_allocator() const noexcept { return *alloc_; }

 private:
  bool refers_to_same_allocator(const thrust::mr::memory_resource<>& other) const noexcept {
    const auto* same = dynamic_cast<const thrust_resource*>(&other);
    return same != nullptr && same->alloc_ == alloc_;
  }

  A* alloc_;
};

template <allocator A>
thrust_resource(A&) -> thrust_resource<A>;

}  // namespace alloy
