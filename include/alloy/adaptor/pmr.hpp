// SPDX-License-Identifier: Apache-2.0
// alloy/adaptor/pmr.hpp: alloy and std::pmr, both ways.
//
//   alloy::pmr_resource mr{alloc};                    // an alloy composition as a memory_resource
//   std::pmr::vector<int> v{&mr};
//
//   alloy::best_fit_arena<alloy::pmr_upstream> a{alloy::pmr_upstream{&some_resource}};
#pragma once

#include <cstddef>
#include <memory>
#include <memory_resource>
#include <new>

#include <alloy/block.hpp>
#include <alloy/concepts.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/edge.hpp>

namespace alloy {

/// `pmr_resource<A>`: a `std::pmr::memory_resource` over an allocator the user owns.
///
/// - Holds `A&`: statistics and state stay in the one allocator, which must outlive the resource.
/// - Only for host-accessible compositions (std::pmr containers touch their memory on the host);
///   a device-only composition does not compile.
/// - `allocate` throws `alloy::out_of_memory` (what the composition knows about itself) when the
///   composition fails, `alloy::cuda_error` when a CUDA part failed for another reason, and
///   `alloy::logic_error` for an alignment that is not a power of two or is larger than the
///   composition can ever serve (the message gives that maximum: the largest `max_alignment`
///   its parts declare, see `detail::max_alignment_of`).
/// - `deallocate` rebuilds the block from the pointer and size it is given (sized deallocation).
/// - Two resources are equal when they refer to the same allocator.
template <allocator A>
class pmr_resource final : public std::pmr::memory_resource {
  static_assert(A::host_accessible,
                "alloy::pmr_resource: this composition is not host-accessible, and std::pmr containers "
                "use their memory on the host");

 public:
  explicit pmr_resource(A& alloc) noexcept : alloc_(std::addressof(alloc)) {}

  A& get_allocator() const noexcept { return *alloc_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    return detail::allocate_or_throw(*alloc_, bytes, alignment).ptr;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { alloc_->deallocate(block{p, bytes}); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    const auto* same = dynamic_cast<const pmr_resource*>(&other);
    return same != nullptr && same->alloc_ == alloc_;
  }

  A* alloc_;
};

template <allocator A>
pmr_resource(A&) -> pmr_resource<A>;

/// `pmr_upstream`: any `std::pmr::memory_resource*` as an alloy upstream (host memory).
///
/// - Alignment: every request is made with `options::alignment` (256 B by default) so that the
///   matching `deallocate`, which a block does not tell the alignment of, can repeat it;
///   requests for more than that yield an empty block.
/// - Zero bytes: one byte is asked for, so the block has a unique address.
/// - Failure: whatever the resource throws becomes an empty block. A resource that returns
///   memory less aligned than asked (libstdc++'s pool resources do, for alignments above their
///   block size) gets it back at once, and the request fails: a block is never misaligned.
/// - Lives here and not in `upstream/` because it needs `<memory_resource>`
///   (docs/design.md#adaptors).
class pmr_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;

  struct options {
    std::size_t alignment = 256;
  };

  pmr_upstream() noexcept : resource_(std::pmr::get_default_resource()) {}
  explicit pmr_upstream(std::pmr::memory_resource* resource) noexcept : resource_(resource) {}
  pmr_upstream(std::pmr::memory_resource* resource, options opts) noexcept
      : resource_(resource), alignment_(opts.alignment) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::is_power_of_two(alignment) || alignment > alignment_) return {};
    const std::size_t taken = bytes == 0 ? 1 : bytes;
    // libstdc++'s aligned operator new rounds the size up without an overflow check and then
    // "succeeds" for sizes near SIZE_MAX; never pass on a request that cannot be rounded.
    if (detail::round_up(taken, alignment_) == 0) return {};
    void* p = nullptr;
    try {
      p = resource_->allocate(taken, alignment_);
    } catch (...) {
      return {};
    }
    if (!detail::is_aligned(p, alignment_)) {  // some resources ignore large alignments
      resource_->deallocate(p, taken, alignment_);
      return {};
    }
    return {p, bytes};
  }
  void deallocate(block b) noexcept {
    if (b) resource_->deallocate(b.ptr, b.size == 0 ? 1 : b.size, alignment_);
  }

  std::pmr::memory_resource* resource() const noexcept { return resource_; }
  /// The largest alignment served (`options::alignment`).
  std::size_t max_alignment() const noexcept { return alignment_; }
  friend bool operator==(const pmr_upstream& l, const pmr_upstream& r) noexcept {
    return l.resource_->is_equal(*r.resource_) && l.alignment_ == r.alignment_;
  }

 private:
  std::pmr::memory_resource* resource_;
  std::size_t alignment_ = 256;
};

}  // namespace alloy
