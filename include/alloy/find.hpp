// SPDX-License-Identifier: Apache-2.0
// alloy/find.hpp: reach a part of a composition by its type.
//
//   auto& arena = alloy::find<alloy::best_fit_arena<alloy::host_upstream>>(alloc);
//   auto& arena = alloy::find<alloy::best_fit_arena>(alloc);   // any best_fit_arena<...>
//
// The search is depth first through `parts()` (outermost first, the walker of detail/walk.hpp)
// and resolved at compile time: a composition that has no such part does not compile.
#pragma once

#include <array>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/walk.hpp>

namespace alloy {

namespace detail {

/// The tuple of references a composite's `parts()` returns.
template <class A>
using parts_t = parts_below_t<all_parts, A>;

/// Whether `A` (itself included) has a part for which `Match::test` holds: the walker's rule
/// over every part (`detail::all_parts`), resolved at compile time.
template <class A, class Match>
constexpr bool contains_part() {
  return contains<all_parts, Match, A>();
}

/// The first such part of `a`, depth first, outermost first.
template <class Match, class A>
constexpr decltype(auto) find_part(A& a) {
  return first_part<all_parts, Match>(a);
}

template <class P>
struct same_type {
  template <class A>
  static constexpr bool test = std::is_same_v<A, P>;
};

template <class A, template <class...> class Template>
inline constexpr bool is_specialization_of = false;
template <template <class...> class Template, class... Args>
inline constexpr bool is_specialization_of<Template<Args...>, Template> = true;

template <template <class...> class Template>
struct specialization_of {
  template <class A>
  static constexpr bool test = is_specialization_of<A, Template>;
};

}  // namespace detail

/// Whether composition `A` has a part of type `P` (itself included).
template <class P, class A>
inline constexpr bool has_part = detail::contains_part<std::remove_cvref_t<A>, detail::same_type<P>>();

/// The first part of type `P` in `a` (depth first, outermost first; `a` itself if it is a `P`).
template <class P, class A>
  requires has_part<P, A>
constexpr decltype(auto) find(A& a) {
  return detail::find_part<detail::same_type<P>>(a);
}

/// The first part of `a` that is some specialization of `Template` (`find<best_fit_arena>(a)`).
template <template <class...> class Template, class A>
  requires(detail::contains_part<std::remove_cvref_t<A>, detail::specialization_of<Template>>())
constexpr decltype(auto) find(A& a) {
  return detail::find_part<detail::specialization_of<Template>>(a);
}

}  // namespace alloy
