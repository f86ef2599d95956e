// SPDX-License-Identifier: Apache-2.0
// alloy/find.hpp: reach a part of a composition by its type.
//
//   auto& arena = alloy::find<alloy::best_fit_arena<alloy::host_upstream>>(alloc);
//   auto& arena = alloy::find<alloy::best_fit_arena>(alloc);   // any best_fit_arena<...>
//
// The search is depth first through `parts()` (outermost first) and resolved at compile time: a
// composition that has no such part does not compile.
#pragma once

#include <array>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include <alloy/concepts.hpp>

namespace alloy {

namespace detail {

template <class A>
using parts_t = decltype(std::declval<A&>().parts());

template <class A, class Match>
constexpr bool contains_part() {
  if constexpr (Match::template test<A>) {
    return true;
  } else if constexpr (composite<A>) {
    using parts = parts_t<A>;
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (contains_part<std::remove_cvref_t<std::tuple_element_t<I, parts>>, Match>() || ...);
    }(std::make_index_sequence<std::tuple_size_v<parts>>{});
  } else {
    return false;
  }
}

template <class Match, class A>
constexpr decltype(auto) find_part(A& a) {
  if constexpr (Match::template test<std::remove_cv_t<A>>) {
    return (a);
  } else {
    auto parts = a.parts();
    using parts_type = decltype(parts);
    constexpr std::size_t index = []<std::size_t... I>(std::index_sequence<I...>) {
      constexpr std::array<bool, sizeof...(I)> holds{
          contains_part<std::remove_cvref_t<std::tuple_element_t<I, parts_type>>, Match>()...};
      for (std::size_t i = 0; i < holds.size(); ++i)
        if (holds[i]) return i;
      return holds.size();
    }(std::make_index_sequence<std::tuple_size_v<parts_type>>{});
    return find_part<Match>(std::get<index>(parts));
  }
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
