// alloy/detail/passes_on.hpp: the optional capabilities a decorator passes on unchanged.
#pragma once

#include <cstddef>

#include <alloy/block.hpp>
#include <alloy/concepts.hpp>

namespace alloy::detail {

/// Base (CRTP) of decorators whose optional capabilities are their inner part's, passed on
/// untouched: `owns`, `release`, `reserved_bytes`, `for_each_block`, `record_use` and `counters`. Each member
/// exists only when `Inner` has the capability (a wrapper passes on only what its part has); a
/// decorator that changes one declares its own, which hides the one here. `Derived` provides
/// `inner()`.
template <class Derived, class Inner>
class passes_on_capabilities {
 public:
  bool owns(block b) const noexcept
    requires owning_allocator<Inner>
  {
    return part().owns(b);
  }
  void release() noexcept
    requires releasing_allocator<Inner>
  {
    part().release();
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<Inner>
  {
    return part().reserved_bytes();
  }
  template <class F>
    requires introspectable_allocator<Inner>
  void for_each_block(F&& visit) const {
    part().for_each_block(visit);
  }
  template <class Stream>
    requires use_recording_allocator<Inner, Stream>
  void record_use(block b, Stream stream) {
    part().record_use(b, stream);
  }
  allocator_counters counters() const noexcept
    requires counting_allocator<Inner>
  {
    return part().counters();
  }

 private:
  Inner& part() noexcept { return static_cast<Derived&>(*this).inner(); }
  const Inner& part() const noexcept { return static_cast<const Derived&>(*this).inner(); }
};

}  // namespace alloy::detail
