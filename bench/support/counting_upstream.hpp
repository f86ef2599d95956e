// SPDX-License-Identifier: Apache-2.0
// bench/support/counting_upstream.hpp: the upstream the host benchmarks measure space with.
//
// Anonymous mmap with MAP_NORESERVE: address space that costs nothing until a page is written
// (the workloads never write), so an allocator may reserve what it likes while `space` counts the
// bytes reserved, their peak and the upstream calls. One `space`, three faces, so that alloy's
// policies and their peers draw from the same counted source: `counting_upstream` (alloy's
// allocator concept), `counting_pmr_resource` (std::pmr) and `counting_thrust_resource`
// (thrust::mr). `counted_thrust_disjoint_pool` is the thrust peer on the thrust face.
// `mmap_upstream` is the same memory uncounted and stateless, for programs that only time and
// need a default-constructible upstream.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <memory_resource>
#include <new>

#include <thrust/mr/disjoint_pool.h>
#include <thrust/mr/memory_resource.h>
#include <thrust/mr/new.h>

#include <alloy/block.hpp>

namespace alloy::bench {

/// Pages from mmap; nullptr on failure. mmap takes no zero-length mapping, hence the 1.
inline void* map_pages(std::size_t bytes) noexcept {
  void* p =
      mmap(nullptr, bytes == 0 ? 1 : bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}
inline void unmap_pages(void* p, std::size_t bytes) noexcept { munmap(p, bytes == 0 ? 1 : bytes); }

/// What one allocator took from the upstream.
struct space {
  std::size_t reserved = 0;  // bytes held now
  std::size_t peak = 0;      // most bytes held at once
  std::size_t calls = 0;     // successful allocations
};

inline void* map_bytes(space& s, std::size_t bytes) noexcept {
  void* p = map_pages(bytes);
  if (p == nullptr) return nullptr;
  s.reserved += bytes;
  s.peak = std::max(s.peak, s.reserved);
  ++s.calls;
  return p;
}
inline void unmap_bytes(space& s, void* p, std::size_t bytes) noexcept {
  unmap_pages(p, bytes);
  s.reserved -= bytes;
}

/// The alloy face (page-aligned memory, so alignment up to a page).
class counting_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  explicit counting_upstream(space* s) : space_(s) {}
  block allocate(std::size_t bytes, std::size_t align) noexcept {
    if (align > 4096) return {};
    void* p = map_bytes(*space_, bytes);
    return p == nullptr ? block{} : block{p, bytes};
  }
  void deallocate(block b) noexcept { unmap_bytes(*space_, b.ptr, b.size); }

 private:
  space* space_;
};

/// The std::pmr face.
class counting_pmr_resource final : public std::pmr::memory_resource {
 public:
  explicit counting_pmr_resource(space* s) : space_(s) {}

 private:
  void* do_allocate(std::size_t bytes, std::size_t) override {
    void* p = map_bytes(*space_, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { unmap_bytes(*space_, p, bytes); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
  space* space_;
};

/// The thrust::mr face.
class counting_thrust_resource final : public thrust::mr::memory_resource<> {
 public:
  explicit counting_thrust_resource(space* s) : space_(s) {}
  void* do_allocate(std::size_t bytes, std::size_t) override {
    void* p = map_bytes(*space_, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { unmap_bytes(*space_, p, bytes); }

 private:
  space* space_;
};

/// The peer most tables compare against: thrust's disjoint pool over the thrust face, bookkeeping
/// from new/delete, alignment and largest pooled block set, other options default. Holds the
/// upstream and bookkeeper the pool points to, so it stays where it is built.
struct counted_thrust_disjoint_pool {
  using pool_type =
      thrust::mr::disjoint_unsynchronized_pool_resource<counting_thrust_resource, thrust::mr::new_delete_resource>;

  counted_thrust_disjoint_pool(space* s, std::size_t alignment, std::size_t largest_block)
      : upstream{s}, pool{&upstream, &bookkeeper, options(alignment, largest_block)} {}
  counted_thrust_disjoint_pool(const counted_thrust_disjoint_pool&) = delete;
  counted_thrust_disjoint_pool& operator=(const counted_thrust_disjoint_pool&) = delete;

  counting_thrust_resource upstream;
  thrust::mr::new_delete_resource bookkeeper;
  pool_type pool;

 private:
  static thrust::mr::pool_options options(std::size_t alignment, std::size_t largest_block) {
    thrust::mr::pool_options opts = pool_type::get_default_options();
    opts.alignment = alignment;
    opts.largest_block_size = largest_block;
    return opts;
  }
};

/// The same memory, uncounted.
class mmap_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  block allocate(std::size_t bytes, std::size_t align) noexcept {
    if (align > 4096) return {};
    void* p = map_pages(bytes);
    return p == nullptr ? block{} : block{p, bytes};
  }
  void deallocate(block b) noexcept { unmap_pages(b.ptr, b.size); }
  friend bool operator==(const mmap_upstream&, const mmap_upstream&) noexcept { return true; }
};

}  // namespace alloy::bench
