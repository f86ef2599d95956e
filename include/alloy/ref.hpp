// alloy/ref.hpp: a non-owning handle to an allocator, for parts shared by two owners.
#pragma once

#include <cstddef>
#include <memory>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/passes_on.hpp>

namespace alloy {

/// `ref<A>` refers to an allocator owned elsewhere and forwards every call to it, so one stateful
/// allocator (a device pool, say) can be the upstream of two compositions. It has exactly the
/// capabilities of `A`, movable handles included. The referred allocator must outlive the ref. Not synchronized: share a
/// `synchronized<...>` if two threads use it.
template <allocator A>
class ref : public detail::passes_on_capabilities<ref<A>, A> {
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

  // Movable blocks (DESIGN §4), when `A` has them.
  handle allocate_movable(std::size_t bytes) noexcept(noexcept(std::declval<A&>().allocate_movable(bytes)))
    requires movable_allocator<A>
  {
    return target_->allocate_movable(bytes);
  }
  void* lock(handle h)
    requires movable_allocator<A>
  {
    return target_->lock(h);
  }
  void unlock(handle h)
    requires movable_allocator<A>
  {
    target_->unlock(h);
  }
  void deallocate(handle h)
    requires movable_allocator<A>
  {
    target_->deallocate(h);
  }
  std::size_t size_of(handle h) const
    requires movable_allocator<A> && requires(const A& a) { a.size_of(h); }
  {
    return target_->size_of(h);
  }
  auto movable_statistics() const noexcept
    requires requires(const A& a) { a.movable_statistics(); }
  {
    return target_->movable_statistics();
  }

  A& inner() const noexcept { return *target_; }
  A& get() const noexcept { return *target_; }
  auto parts() const noexcept { return std::tie(*target_); }
  friend bool operator==(const ref& l, const ref& r) noexcept { return l.target_ == r.target_; }

 private:
  A* target_;
};

}  // namespace alloy
