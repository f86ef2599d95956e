// SPDX-License-Identifier: Apache-2.0
// bench/support/shared_space.hpp: counting_upstream.hpp's counted mmap source, for several
// threads at once.
//
// `shared_space` counts bytes reserved, their peak and the upstream calls with atomics (the peak
// by compare-exchange), so allocators used by several threads, or one allocator per thread, can
// draw from one counted source. Upstream calls are rare next to allocations (a slab or a segment
// serves many), so the atomics cost nothing the timed pairs would see. Three faces, as in
// counting_upstream.hpp: `shared_counting_upstream` (alloy), `shared_counting_pmr_resource`
// (std::pmr) and `shared_counting_thrust_resource` (thrust::mr).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory_resource>
#include <new>

#include <thrust/mr/memory_resource.h>

#include <alloy/block.hpp>

#include "support/counting_upstream.hpp"

namespace alloy::bench {

struct shared_space {
  std::atomic<std::size_t> reserved{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<std::size_t> calls{0};

  void* map(std::size_t bytes) noexcept {
    void* p = map_pages(bytes);
    if (p == nullptr) return nullptr;
    const std::size_t now = reserved.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::size_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
    calls.fetch_add(1, std::memory_order_relaxed);
    return p;
  }
  void unmap(void* p, std::size_t bytes) noexcept {
    unmap_pages(p, bytes);
    reserved.fetch_sub(bytes, std::memory_order_relaxed);
  }
};

/// The alloy face (page-aligned memory, so alignment up to a page).
class shared_counting_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  /// Safe from several threads (atomics): `synchronized` and `sharded` call it without their
  /// locks for a planned growth, as they call `cudaMalloc`.
  static constexpr bool thread_safe = true;
  explicit shared_counting_upstream(shared_space* s) : space_(s) {}
  block allocate(std::size_t bytes, std::size_t align) noexcept {
    if (align > 4096) return {};
    void* p = space_->map(bytes);
    return p == nullptr ? block{} : block{p, bytes};
  }
  void deallocate(block b) noexcept { space_->unmap(b.ptr, b.size); }

 private:
  shared_space* space_;
};

/// The std::pmr face.
class shared_counting_pmr_resource final : public std::pmr::memory_resource {
 public:
  explicit shared_counting_pmr_resource(shared_space* s) : space_(s) {}

 private:
  void* do_allocate(std::size_t bytes, std::size_t) override {
    void* p = space_->map(bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { space_->unmap(p, bytes); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
  shared_space* space_;
};

/// The thrust::mr face.
class shared_counting_thrust_resource final : public thrust::mr::memory_resource<> {
 public:
  explicit shared_counting_thrust_resource(shared_space* s) : space_(s) {}
  void* do_allocate(std::size_t bytes, std::size_t) override {
    void* p = space_->map(bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { space_->unmap(p, bytes); }

 private:
  shared_space* space_;
};

}  // namespace alloy::bench
