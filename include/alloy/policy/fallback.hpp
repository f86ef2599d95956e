// SPDX-License-Identifier: Apache-2.0
// alloy/policy/fallback.hpp
#pragma once

#include <cstddef>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/forwarding.hpp>

namespace alloy {

/// `fallback<Primary, Secondary>` tries `Primary`, and `Secondary` when `Primary` fails.
///
/// - Routing of frees: a block goes back to `Primary` if `Primary.owns(block)`, else to
///   `Secondary`; so `Primary` must have `owns` (checked at compile time).
/// - Capabilities: those of `detail::two_parts`, each only when both parts have it: `owns`,
///   `release`, `reserved_bytes`, `counters` (the sums), `bytes_in_use` and `requested_bytes`
///   (the sums), introspection, checked frees (`try_deallocate`, `free_misuse`), stream-ordered calls,
///   `allocate_keeping_cache`, `allocate_cached`, `record_use`, `serves` and planned growth (`Primary`'s growth is
///   planned; `Secondary` is then called plainly, under the caller's lock, when `Primary` fails for
///   good). Not limits or movable handles. Memory kind: what both parts share.
/// - Statistics (`detail::figures_of`, what `stats<>` reads): its parts' figures added up
///   (counters and reserved bytes summed, the smallest limit and max split size), also when only
///   one part reports a figure.
/// - Failure: an empty block when both fail; a failed `Primary` is not retried.
/// - Thread safety: none (wrap in `synchronized`). Metadata: none of its own.
template <owning_allocator Primary, allocator Secondary>
class fallback : public detail::two_parts<fallback<Primary, Secondary>, Primary, Secondary> {
  using base = detail::two_parts<fallback<Primary, Secondary>, Primary, Secondary>;

 public:
  static constexpr bool host_accessible = detail::all_host_accessible<Primary, Secondary>;
  static constexpr bool device_accessible = detail::all_device_accessible<Primary, Secondary>;

  fallback() = default;
  fallback(Primary primary, Secondary secondary) : primary_(std::move(primary)), secondary_(std::move(secondary)) {}

  Primary& primary() noexcept { return primary_; }
  const Primary& primary() const noexcept { return primary_; }
  Secondary& secondary() noexcept { return secondary_; }
  const Secondary& secondary() const noexcept { return secondary_; }
  auto parts() noexcept { return std::tie(primary_, secondary_); }
  auto parts() const noexcept { return std::tie(primary_, secondary_); }

  /// Whether either part takes the request (`request_screening_allocator`, when both have it).
  bool serves(std::size_t bytes, std::size_t alignment) const noexcept
    requires request_screening_allocator<Primary> && request_screening_allocator<Secondary>
  {
    return primary_.serves(bytes, alignment) || secondary_.serves(bytes, alignment);
  }

 private:
  friend base;

  Primary& first_part() noexcept { return primary_; }
  const Primary& first_part() const noexcept { return primary_; }
  Secondary& second_part() noexcept { return secondary_; }
  const Secondary& second_part() const noexcept { return secondary_; }

  template <class Call>
  block route_allocation(std::size_t, std::size_t, Call call) noexcept {
    if (const block b = call(primary_)) return b;
    return call(secondary_);
  }
  // A planned growth is `Primary`'s only: when `Primary` can neither serve nor plan, the caller
  // falls back to `allocate` (both parts, the whole answer); `Secondary` is asked only once `Primary`
  // has failed for good.
  block route_planning(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept {
    return primary_.allocate_or_plan(bytes, alignment, plan);
  }
  block route_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept {
    if (const block b = primary_.allocate_planned(plan, bytes, alignment)) return b;
    return secondary_.allocate(bytes, alignment);
  }

  template <class Call>
  bool route_free(block b, Call call) noexcept {
    return (primary_.owns(b) ? call(primary_) : call(secondary_)) != detail::free_outcome::refused;
  }
  template <class Self, class Call>
  static decltype(auto) route_to_holder(Self& self, block b, Call call) {
    return self.primary_.owns(b) ? call(self.primary_) : call(self.secondary_);
  }

  Primary primary_{};
  Secondary secondary_{};
};

}  // namespace alloy
