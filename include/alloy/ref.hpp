// alloy/ref.hpp: a non-owning handle to an allocator, for parts shared by two owners.
#pragma once

#include <cstddef>
#include <memory>
#include <tuple>

#include <alloy/concepts.hpp>

namespace alloy {

/// `ref<A>` refers to an allocator owned elsewhere and forwards every call to it, so one stateful
/// allocator (a device pool, say) can be the upstream of two compositions. It has exactly the
/// capabilities of `A`. The referred allocator must outlive the ref. Not synchronized: share a
/// `synchronized<...>` if two threads use it.
template <allocator A>
class ref {
 public:
  static constexpr bool host_accessible = A::host_accessible;
  static constexpr bool device_accessible = A::device_accessible;

  explicit ref(A& target) noexcept : target_(std::addressof(target)) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept { return target_->allocate(bytes, alignment); }
  void deallocate(block b) noexcept { target_->deallocate(b); }

  template <class Stream>
    requires stream_ordered_allocator<A, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    return target_->allocate(bytes, alignment, stream);
  }
  template <class Stream>
    requires stream_ordered_allocator<A, Stream>
  void deallocate(block b, Stream stream) noexcept {
    target_->deallocate(b, stream);
  }

  bool owns(block b) const noexcept
    requires owning_allocator<A>
  {
    return target_->owns(b);
  }
  void release() noexcept
    requires releasing_allocator<A>
  {
    target_->release();
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<A>
  {
    return target_->reserved_bytes();
  }
  template <class F>
    requires introspectable_allocator<A>
  void for_each_block(F&& visit) const {
    target_->for_each_block(visit);
  }

  A& get() const noexcept { return *target_; }
  auto parts() const noexcept { return std::tie(*target_); }
  friend bool operator==(const ref& l, const ref& r) noexcept { return l.target_ == r.target_; }

 private:
  A* target_;
};

}  // namespace alloy
