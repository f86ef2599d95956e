// SPDX-License-Identifier: Apache-2.0
// alloy/detail/walk.hpp: the one walk over a composition's parts, with a rule saying
// which parts are below a part. `find` (all parts, resolved at compile time), the edges (the
// parts requests draw on) and the statistics (`detail::figures_of`: all parts) go through it.
#pragma once

#include <concepts>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include <alloy/concepts.hpp>

namespace alloy::detail {

// ---- what a part reports (the informal capabilities every walker reads) -------------------------

template <class A>
concept reports_bytes_in_use = requires(const A& a) {
  { a.bytes_in_use() } -> std::convertible_to<std::size_t>;
};
template <class A>
concept reports_requested_bytes = requires(const A& a) {
  { a.requested_bytes() } -> std::convertible_to<std::size_t>;
};
template <class A>
concept reports_bytes_limit = requires(const A& a) {
  { a.bytes_limit() } -> std::convertible_to<std::size_t>;
};
template <class A>
concept reports_bytes_reservable_limit = requires(const A& a) {
  { a.bytes_reservable_limit() } -> std::convertible_to<std::size_t>;
};
template <class A>
concept has_movable_statistics = requires(const A& a) { a.movable_statistics(); };
template <class A>
concept has_reset_movable_peak = requires(A& a) { a.reset_movable_peak(); };

// ---- the walk -------------------------------------------------------------------------------------

/// A part with a device side and a host side (`host_spill_reclaimer`).
template <class A>
concept device_host_pair = requires(A& a) {
  a.device();
  a.host();
};

/// Rule: every part a composite names in `parts()`.
struct all_parts {
  template <class A>
  static auto below(A& a) noexcept {
    if constexpr (composite<A>) {
      return a.parts();
    } else {
      return std::tuple<>{};
    }
  }
};

/// Rule: the parts requests draw on: all of a composite's parts, but only the device side of a
/// device/host pair (its host memory holds spilled blocks, not what a request is served from).
struct drawn_parts {
  template <class A>
  static auto below(A& a) noexcept {
    if constexpr (device_host_pair<A>) {
      return std::tie(a.device());
    } else if constexpr (composite<A>) {
      return a.parts();
    } else {
      return std::tuple<>{};
    }
  }
};

/// The parts directly below `A` under `Rule`, as a tuple of references.
template <class Rule, class A>
using parts_below_t = decltype(Rule::below(std::declval<A&>()));

/// Calls `f(part)` for each part directly below `a` under `Rule`.
template <class Rule, class A, class F>
void for_each_part_below(A& a, F&& f) {
  std::apply([&](auto&... part) { (f(part), ...); }, Rule::below(a));
}

/// Calls `f(part)` for `a` and every part below it under `Rule`, outermost first, depth first.
template <class Rule, class A, class F>
void visit_each_part(A& a, F& f) {
  f(a);
  for_each_part_below<Rule>(a, [&](auto& part) { visit_each_part<Rule>(part, f); });
}

/// Whether `A` or a part below it under `Rule` satisfies `Match::test<part>` (types only).
template <class Rule, class Match, class A>
constexpr bool contains() {
  using T = std::remove_cvref_t<A>;
  if constexpr (Match::template test<T>) {
    return true;
  } else {
    using parts = parts_below_t<Rule, T>;
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (contains<Rule, Match, std::tuple_element_t<I, parts>>() || ...);
    }(std::make_index_sequence<std::tuple_size_v<parts>>{});
  }
}

/// Index of the first part directly below `A` that contains a `Match` (the size if none).
template <class Rule, class Match, class A>
constexpr std::size_t first_containing() {
  using parts = parts_below_t<Rule, std::remove_cv_t<A>>;
  return []<std::size_t... I>(std::index_sequence<I...>) {
    std::size_t found = sizeof...(I);
    ((found == sizeof...(I) && contains<Rule, Match, std::tuple_element_t<I, parts>>() ? void(found = I) : void()),
     ...);
    return found;
  }(std::make_index_sequence<std::tuple_size_v<parts>>{});
}

/// The first part of `a` (itself included) that satisfies `Match`, depth first, outermost first.
template <class Rule, class Match, class A>
constexpr decltype(auto) first_part(A& a) {
  if constexpr (Match::template test<std::remove_cv_t<A>>) {
    return (a);
  } else {
    return first_part<Rule, Match>(std::get<first_containing<Rule, Match, A>()>(Rule::below(a)));
  }
}

/// The type of that part (no object needed).
template <class Rule, class Match, class A>
using first_part_t = std::remove_cvref_t<decltype(first_part<Rule, Match>(std::declval<A&>()))>;

/// Calls `f(part)` on the first part of `a` that satisfies `Match`, holding the lock of every part
/// on the way that offers one (`with_lock`: `synchronized`), and returns what `f` returns.
template <class Rule, class Match, class A, class F>
decltype(auto) with_first_part_locked(A& a, F&& f) {
  if constexpr (Match::template test<std::remove_cv_t<A>>) {
    return std::forward<F>(f)(a);
  } else if constexpr (requires { a.with_lock([](auto&) {}); }) {
    return a.with_lock(
        [&](auto& inner) -> decltype(auto) { return with_first_part_locked<Rule, Match>(inner, std::forward<F>(f)); });
  } else {
    return with_first_part_locked<Rule, Match>(std::get<first_containing<Rule, Match, A>()>(Rule::below(a)),
                                               std::forward<F>(f));
  }
}

}  // namespace alloy::detail
