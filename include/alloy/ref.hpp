// SPDX-License-Identifier: Apache-2.0
// alloy/ref.hpp: a non-owning handle to an allocator, for parts shared by two owners.
#pragma once

#include <cstddef>
#include <memory>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/forwarding.hpp>

namespace alloy {

/// `ref<A>` refers to an allocator owned elsewhere and forwards every call to it, so one stateful
/// allocator (a device pool, say) can be the upstream of two compositions. It has exactly the
/// capabilities of `A` (every entry of `detail::capability`, movable handles and checked frees
/// included), passed on by `detail::forwards_everything` with the pointer followed in its guard
/// hook. The referred allocator must outlive the ref. Not synchronized: share a
/// `synchronized<...>` if two threads use it.
template <allocator A>
class ref : public detail::forwards_everything<ref<A>, A> {
 public:
  static constexpr bool host_accessible = A::host_accessible;
  static constexpr bool device_accessible = A::device_accessible;

  explicit ref(A& target) noexcept : target_(std::addressof(target)) {}

  A& inner() const noexcept { return *target_; }
  A& get() const noexcept { return *target_; }
  auto parts() const noexcept { return std::tie(*target_); }
  friend bool operator==(const ref& l, const ref& r) noexcept { return l.target_ == r.target_; }

 private:
  friend class detail::forwards_queries<ref, A>;

  // The guard hook: follow the pointer (a shared allocator is never const through a ref).
  template <class F>
  decltype(auto) guarded(F&& f) const {
    return std::forward<F>(f)(*target_);
  }

  A* target_;
};

}  // namespace alloy
