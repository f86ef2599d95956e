// SPDX-License-Identifier: Apache-2.0
// alloy/adaptor/cuda_mr.hpp: an alloy composition as a CCCL `cuda::mr` resource.
//
//   alloy::cuda_resource mr{alloc};
//   cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{mr};
#pragma once

#include <alloy/config.hpp>

#ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#  define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif
#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cstddef>
#include <memory>

#include <alloy/block.hpp>
#include <alloy/concepts.hpp>
#include <alloy/detail/edge.hpp>

namespace alloy {

/// `cuda_resource<A>` satisfies `cuda::mr::resource` and `cuda::mr::async_resource`, with the
/// `device_accessible` / `host_accessible` properties of `A`'s memory kind, spelled for the
/// installed CCCL: 3.0 (`allocate`, `allocate_async`) or 3.1 and later (`allocate_sync`, and the
/// stream-first `allocate`).
///
/// - Holds `A&`; `A` must outlive the resource. Equal when referring to the same `A`.
/// - Stream semantics: when `A` is stream-ordered over `cudaStream_t`, the stream calls use it.
///   Otherwise the allocation is made at once (ready on every stream), and a stream deallocation
///   first waits for the stream, so memory is never reused while work on the stream may still
///   touch it.
/// - Failure throws `alloy::out_of_memory`, `alloy::cuda_error` or `alloy::logic_error`, as the
///   other edges do.
template <allocator A>
class cuda_resource {
  static constexpr bool ordered = stream_ordered_allocator<A, cudaStream_t>;

 public:
  static constexpr std::size_t default_alignment = 256;

  explicit cuda_resource(A& alloc) noexcept : alloc_(std::addressof(alloc)) {}

#if CCCL_MAJOR_VERSION > 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION >= 1)
  void* allocate_sync(std::size_t bytes, std::size_t alignment = default_alignment) {
    return allocate_now(bytes, alignment);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    alloc_->deallocate(block{p, bytes});
  }
  void* allocate(::cuda::stream_ref stream, std::size_t bytes, std::size_t alignment = default_alignment) {
    return allocate_on(bytes, alignment, stream);
  }
  void deallocate(::cuda::stream_ref stream, void* p, std::size_t bytes, std::size_t = default_alignment) {
    deallocate_on(p, bytes, stream);
  }
#else
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) {
    return allocate_now(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    alloc_->deallocate(block{p, bytes});
  }
  void* allocate_async(std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) {
    return allocate_on(bytes, alignment, stream);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t, ::cuda::stream_ref stream) {
    deallocate_on(p, bytes, stream);
  }
#endif

  A& get_allocator() const noexcept { return *alloc_; }
  bool operator==(const cuda_resource& other) const noexcept { return alloc_ == other.alloc_; }
  bool operator!=(const cuda_resource& other) const noexcept { return alloc_ != other.alloc_; }

  friend void get_property(const cuda_resource&, ::cuda::mr::device_accessible) noexcept
    requires(A::device_accessible)
  {}
  friend void get_property(const cuda_resource&, ::cuda::mr::host_accessible) noexcept
    requires(A::host_accessible)
  {}

 private:
  void* allocate_now(std::size_t bytes, std::size_t alignment) {
    return detail::allocate_or_throw(*alloc_, bytes, alignment).ptr;
  }
  void* allocate_on(std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) {
    if constexpr (ordered) {
      return detail::allocate_or_throw(*alloc_, bytes, alignment, stream.get()).ptr;
    } else {
      return allocate_now(bytes, alignment);
    }
  }
  void deallocate_on(void* p, std::size_t bytes, ::cuda::stream_ref stream) {
    if constexpr (ordered) {
      alloc_->deallocate(block{p, bytes}, stream.get());
    } else {
      stream.wait();  // the memory may still be in use by work enqueued on the stream
      alloc_->deallocate(block{p, bytes});
    }
  }

  A* alloc_;
};

template <allocator A>
cuda_resource(A&) -> cuda_resource<A>;

}  // namespace alloy
