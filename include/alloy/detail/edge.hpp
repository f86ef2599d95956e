// alloy/detail/edge.hpp: the throwing layer the adaptors share (DESIGN §6).
//
// The core returns empty blocks; an edge turns that into `alloy::cuda_error` when some CUDA part
// of the composition recorded a real error, else into `alloy::out_of_memory` carrying everything
// the composition can say about itself.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/error.hpp>

namespace alloy::detail {

/// Calls `f(part)` for `a` and every part below it, outermost first, depth first.
template <class A, class F>
void visit_parts(A& a, F& f) {
  f(a);
  if constexpr (composite<A>) {
    std::apply([&](auto&... part) { (visit_parts(part, f), ...); }, a.parts());
  }
}

/// Free bytes and the largest free piece, from introspection.
struct free_space {
  std::size_t free_bytes = 0;
  std::size_t largest = 0;
  double fragmentation() const noexcept {
    return free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(largest) / static_cast<double>(free_bytes);
  }
};

template <introspectable_allocator A>
free_space measure_free_space(const A& a) {
  free_space space;
  a.for_each_block([&](const block_info& info) {
    if (info.state == block_state::free) {
      space.free_bytes += info.size;
      space.largest = std::max(space.largest, info.size);
    }
  });
  return space;
}

/// What the composition can say about itself after failing a request of `bytes`.
template <class A>
oom_report make_oom_report(A& a, std::size_t bytes, std::size_t alignment) {
  oom_report report{.requested = bytes, .alignment = alignment};
  bool have_in_use = false, have_reserved = false, have_free = false;
  auto inspect = [&]<class P>(P& part) {
    if constexpr (requires { part.oom_report_for(bytes, alignment); }) {
      if (!have_in_use) {  // a part that knows everything (stats<>) answers for what it covers
        const oom_report inner = part.oom_report_for(bytes, alignment);
        report = inner;
        have_in_use = have_reserved = have_free = true;
      }
    }
    if constexpr (requires { part.bytes_limit(); }) {
      const std::size_t limit = part.bytes_limit();
      if (limit != 0 && limit != static_cast<std::size_t>(-1) && (report.limit == 0 || limit < report.limit))
        report.limit = limit;
    }
    if constexpr (requires { part.bytes_in_use(); }) {
      if (!have_in_use) report.in_use = part.bytes_in_use(), have_in_use = true;
    }
    if constexpr (reserving_allocator<P>) {
      if (!have_reserved) report.reserved = part.reserved_bytes(), have_reserved = true;
    }
    if constexpr (introspectable_allocator<P>) {
      if (!have_free) {
        const free_space space = measure_free_space(part);
        report.largest_free_block = space.largest;
        report.fragmentation = space.fragmentation();
        have_free = true;
      }
    }
  };
  visit_parts(a, inspect);
  return report;
}

/// Throws the pending CUDA error of any part of `a`, clearing it, if there is one.
template <class A>
void throw_pending_cuda_error(A& a) {
  auto check = [](auto& part) {
    if constexpr (requires { part.last_error(); part.clear_error(); }) {
      if (part.last_error()) {
        auto error = part.last_error().to_exception();
        part.clear_error();
        throw error;
      }
    }
  };
  visit_parts(a, check);
}

inline void check_alignment(std::size_t alignment) {
  if (!is_power_of_two(alignment))
    throw alloy::logic_error("alignment " + std::to_string(alignment) + " is not a power of two");
}

/// The throwing allocate every edge uses: checks the arguments, allocates, and reports failure.
template <class A>
block allocate_or_throw(A& a, std::size_t bytes, std::size_t alignment) {
  check_alignment(alignment);
  const block b = a.allocate(bytes, alignment);
  if (!b) {
    throw_pending_cuda_error(a);
    throw out_of_memory(make_oom_report(a, bytes, alignment));
  }
  return b;
}

template <class A, class Stream>
block allocate_or_throw(A& a, std::size_t bytes, std::size_t alignment, Stream stream) {
  check_alignment(alignment);
  const block b = a.allocate(bytes, alignment, stream);
  if (!b) {
    throw_pending_cuda_error(a);
    throw out_of_memory(make_oom_report(a, bytes, alignment));
  }
  return b;
}

}  // namespace alloy::detail
