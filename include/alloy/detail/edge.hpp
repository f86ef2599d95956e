// SPDX-License-Identifier: Apache-2.0
// alloy/detail/edge.hpp: the throwing layer the adaptors share (docs/design.md#adaptors).
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
#include <alloy/detail/walk.hpp>
#include <alloy/error.hpp>

namespace alloy::detail {

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

/// Calls `f(part)` for every part of `a` that requests draw on (the walker's `drawn_parts` rule:
/// all of a composite's parts, but only the device side of a part with a device and a host side,
/// `host_spill_reclaimer`, whose host memory holds spilled blocks).
template <class A, class F>
void for_each_drawn_part(A& a, F&& f) {
  for_each_part_below<drawn_parts>(a, f);
}

/// Bytes in use as the outermost part that counts them says, or the sum over the drawn parts
/// of a composite that does not (a segregator's two sides); false when nothing counts them.
template <class A>
bool bytes_in_use_of(A& a, std::size_t& out) {
  if constexpr (reports_bytes_in_use<A>) {
    out = a.bytes_in_use();
    return true;
  } else {
    bool any = false;
    std::size_t sum = 0;
    for_each_drawn_part(a, [&](auto& part) {
      std::size_t part_in_use = 0;
      if (bytes_in_use_of(part, part_in_use)) sum += part_in_use, any = true;
    });
    out = sum;
    return any;
  }
}

/// Bytes reserved, the same way (`reserved_bytes()`).
template <class A>
bool reserved_bytes_of(A& a, std::size_t& out) {
  if constexpr (reserving_allocator<A>) {
    out = a.reserved_bytes();
    return true;
  } else {
    bool any = false;
    std::size_t sum = 0;
    for_each_drawn_part(a, [&](auto& part) {
      std::size_t part_reserved = 0;
      if (reserved_bytes_of(part, part_reserved)) sum += part_reserved, any = true;
    });
    out = sum;
    return any;
  }
}

/// Free space, the same way (introspection), summed over parts.
template <class A>
void free_space_of(A& a, free_space& out) {
  if constexpr (introspectable_allocator<A>) {
    const free_space space = measure_free_space(a);
    out.free_bytes += space.free_bytes;
    out.largest = std::max(out.largest, space.largest);
  } else {
    for_each_drawn_part(a, [&](auto& part) { free_space_of(part, out); });
  }
}

/// The smallest `bytes_limit()` or `bytes_reservable_limit()` of `a` and its drawn parts; 0 when
/// none is set.
template <class A>
std::size_t smallest_limit_of(A& a) {
  std::size_t best = 0;
  auto consider = [&](std::size_t limit) {
    if (limit != 0 && limit != static_cast<std::size_t>(-1) && (best == 0 || limit < best)) best = limit;
  };
  if constexpr (reports_bytes_limit<A>) consider(a.bytes_limit());
  if constexpr (reports_bytes_reservable_limit<A>) consider(a.bytes_reservable_limit());
  for_each_drawn_part(a, [&](auto& part) { consider(smallest_limit_of(part)); });
  return best;
}

/// Whether `A` wraps exactly one part (and is not a device/host pair) with a `stats<>`
/// (`oom_report_for`) somewhere down that chain of single parts.
template <class A>
constexpr bool decorates_a_reporter() {
  if constexpr (composite<A> && !device_host_pair<A>) {
    using parts_type = std::remove_cvref_t<parts_below_t<all_parts, A>>;
    if constexpr (std::tuple_size_v<parts_type> == 1) {
      using part = std::remove_reference_t<std::tuple_element_t<0, parts_type>>;
      return requires(part& p) { p.oom_report_for(std::size_t{}, std::size_t{}); } || decorates_a_reporter<part>();
    } else {
      return false;
    }
  } else {
    return false;
  }
}

/// What the composition the user holds can say about itself after failing a request of `bytes`.
/// A `stats<>` answers for everything below it (`oom_report_for`), also under decorators that
/// count nothing of their own; otherwise in use and reserved come from the outermost part that
/// counts them (summed over the sides of a composite that does not), the limit is the smallest
/// of any part, and the free space is measured by introspection.
template <class A>
oom_report make_oom_report(A& a, std::size_t bytes, std::size_t alignment) {
  if constexpr (requires { a.oom_report_for(bytes, alignment); }) {
    return a.oom_report_for(bytes, alignment);
  } else if constexpr (decorates_a_reporter<A>()) {
    // A decorator (synchronized<>, limited<>, logged<>, ...): what it wraps says the most; the
    // decorator adds its own limit, and its own count of bytes in use when it keeps one.
    oom_report report = make_oom_report(std::get<0>(a.parts()), bytes, alignment);
    if (const std::size_t limit = smallest_limit_of(a); limit != 0 && (report.limit == 0 || limit < report.limit))
      report.limit = limit;
    if constexpr (reports_bytes_in_use<A>) report.in_use = a.bytes_in_use();
    return report;
  } else {
    oom_report report{.requested = bytes, .alignment = alignment};
    report.limit = smallest_limit_of(a);
    bytes_in_use_of(a, report.in_use);
    reserved_bytes_of(a, report.reserved);
    free_space space;
    free_space_of(a, space);
    report.largest_free_block = space.largest;
    report.fragmentation = space.fragmentation();
    return report;
  }
}

/// A part that says the largest alignment it serves: a function, or a static member.
template <class A>
concept reports_max_alignment = requires(const A& a) {
  { a.max_alignment() } -> std::convertible_to<std::size_t>;
};
template <class A>
concept declares_max_alignment = requires {
  { A::max_alignment } -> std::convertible_to<std::size_t>;
};

/// The largest alignment `a` can serve: `max_alignment` (a static member or a function) where a
/// part declares one; for a composite that does not, the largest of its drawn parts' (a
/// composition serves an alignment one of its parts can); unbounded otherwise.
template <class A>
std::size_t max_alignment_of(A& a) {
  if constexpr (reports_max_alignment<A>) {
    return a.max_alignment();
  } else if constexpr (declares_max_alignment<A>) {
    return A::max_alignment;
  } else if constexpr (device_host_pair<A> || composite<A>) {
    std::size_t best = 0;
    for_each_drawn_part(a, [&](auto& part) { best = std::max(best, max_alignment_of(part)); });
    return best == 0 ? static_cast<std::size_t>(-1) : best;
  } else {
    return static_cast<std::size_t>(-1);
  }
}

/// A part that keeps the CUDA error of a call that could not throw (`cuda_upstream`, `cuda_vmm`).
template <class A>
concept holds_cuda_error = requires(A& a) {
  a.last_error();
  a.clear_error();
};

/// Throws the pending CUDA error of any part of `a`, clearing it, if there is one.
template <class A>
void throw_pending_cuda_error(A& a) {
  auto check = [](auto& part) {
    if constexpr (holds_cuda_error<std::remove_cvref_t<decltype(part)>>) {
      if (part.last_error()) {
        auto error = part.last_error().to_exception();
        part.clear_error();
        throw error;
      }
    }
  };
  visit_each_part<all_parts>(a, check);
}

inline void check_alignment(std::size_t alignment) {
  if (!is_power_of_two(alignment))
    throw alloy::logic_error("alignment " + std::to_string(alignment) + " is not a power of two");
}

/// A bad alignment is a bad argument (`alloy::logic_error`), not an out-of-memory: not a power
/// of two, or more than the composition can ever serve (`max_alignment_of`), with that maximum.
template <class A>
void check_alignment(A& a, std::size_t alignment) {
  check_alignment(alignment);
  if (const std::size_t most = max_alignment_of(a); alignment > most) {
    throw alloy::logic_error("alignment " + std::to_string(alignment) +
                             " is not supported by this composition (at most " + std::to_string(most) + ")");
  }
}

/// After a failed request: when the composition says (`serves`) it takes this size at a smaller
/// alignment but not at this one, the alignment is the cause, a bad argument: `logic_error`
/// naming the largest alignment it takes at this size.
template <class A>
void check_alignment_for_size(A& a, std::size_t bytes, std::size_t alignment) {
  if constexpr (request_screening_allocator<A>) {
    if (alignment <= 1 || a.serves(bytes, alignment) || !a.serves(bytes, 1)) return;
    std::size_t most = alignment / 2;
    while (most > 1 && !a.serves(bytes, most)) most /= 2;
    throw alloy::logic_error("alignment " + std::to_string(alignment) + " is not supported by this composition for " +
                             std::to_string(bytes) + " bytes (at most " + std::to_string(most) + ")");
  } else {
    (void)a, (void)bytes, (void)alignment;
  }
}

/// The throwing allocate every edge uses: checks the arguments, allocates, and reports failure.
template <class A>
block allocate_or_throw(A& a, std::size_t bytes, std::size_t alignment) {
  check_alignment(a, alignment);
  const block b = a.allocate(bytes, alignment);
  if (!b) {
    throw_pending_cuda_error(a);
    check_alignment_for_size(a, bytes, alignment);
    throw out_of_memory(make_oom_report(a, bytes, alignment));
  }
  return b;
}

template <class A, class Stream>
block allocate_or_throw(A& a, std::size_t bytes, std::size_t alignment, Stream stream) {
  check_alignment(a, alignment);
  const block b = a.allocate(bytes, alignment, stream);
  if (!b) {
    throw_pending_cuda_error(a);
    check_alignment_for_size(a, bytes, alignment);
    throw out_of_memory(make_oom_report(a, bytes, alignment));
  }
  return b;
}

}  // namespace alloy::detail
