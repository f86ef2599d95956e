// SPDX-License-Identifier: Apache-2.0
// alloy/policy/limited.hpp
#pragma once

#include <cstddef>
#include <limits>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/forwarding.hpp>

namespace alloy {

/// `limited<Inner>` puts a hard cap on the bytes in use.
///
/// - Strategy: counts the bytes of every live block (the sizes callers asked for, as
///   docs/design.md#concepts defines a block's size) and refuses, with an empty block, any request
///   that would take the count past `bytes_limit`. The refusal happens before `Inner` is asked, so
///   `Inner` is left untouched. A request the inner allocator fails is not counted.
/// - Frees are counted only when `Inner` accepted them: over a part with checked frees
///   (`try_deallocate`, e.g. `best_fit_arena`) a double, foreign, interior or wrong-size free
///   changes nothing here. Over a part that cannot tell, the free is passed on and counted unless
///   it is larger than the bytes in use (which would make the count wrap), so the count never
///   underflows, though a bad free of a smaller size still lowers it.
/// - Options: `bytes_limit` (default: no limit); `set_bytes_limit()` changes it at run time
///   (lowering it below the bytes in use refuses new requests until enough are freed).
/// - Capabilities: exactly those of `Inner` (`detail::decorates`: keeping-cache, stream-ordered
///   and checked frees counted the same way, the queries passed on), plus `bytes_in_use` and
///   `bytes_limit`, its own. `counters()` adds the refusals to `Inner`'s `num_ooms` (to a caller
///   they are out-of-memory failures). Movable handles are not passed on: the cap is on raw
///   blocks, so put `limited` under a `host_spill_reclaimer`, as its device side, to give movable
///   memory a capacity. Tags (`allocate(bytes, alignment, tag)`, `scoped_tag`) and offload are
///   passed on; a block of an offloaded tag still counts until it is freed (the cap is on the
///   blocks the caller holds, not on the memory behind them), and an allocation the part refuses
///   for its offloaded tag is neither counted nor a refusal of the limit.
/// - Thread safety: none (wrap in `synchronized`). Metadata: three counters.
template <allocator Inner>
class limited : public detail::decorates<limited<Inner>, Inner> {
 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;

  struct options {
    std::size_t bytes_limit = std::numeric_limits<std::size_t>::max();
  };

  limited() = default;
  explicit limited(Inner inner, options opts = {}) : inner_(std::move(inner)), limit_(opts.bytes_limit) {}

  allocator_counters counters() const noexcept
    requires counting_allocator<Inner>
  {
    allocator_counters c = inner_.counters();
    c.num_ooms += refused_;
    return c;
  }

  std::size_t bytes_limit() const noexcept { return limit_; }
  std::size_t bytes_in_use() const noexcept { return in_use_; }
  /// Requests refused because they would have passed the limit.
  std::size_t num_refused() const noexcept { return refused_; }
  void set_bytes_limit(std::size_t limit) noexcept { limit_ = limit; }

  Inner& inner() noexcept { return inner_; }
  const Inner& inner() const noexcept { return inner_; }
  auto parts() noexcept { return std::tie(inner_); }
  auto parts() const noexcept { return std::tie(inner_); }

 private:
  friend class detail::decorates<limited, Inner>;

  template <class Call, class GiveBack, class... Stream>
  block on_allocate(std::size_t bytes, std::size_t, Call call, GiveBack, detail::allocation_kind kind,
                    Stream...) noexcept {
    if (!(in_use_ <= limit_ && bytes <= limit_ - in_use_)) {
      // A keeping-cache or planning attempt is followed by a plain call, which counts the refusal.
      if (kind != detail::allocation_kind::keeping_cache) ++refused_;
      return {};
    }
    const block b = call(bytes);
    if (b) in_use_ += b.size;
    return b;
  }
  template <class Call, class... Stream>
  bool on_free(block b, Call call, Stream...) noexcept {
    const detail::free_outcome outcome = call(b);
    if (outcome == detail::free_outcome::refused) return false;
    // An unchecked free larger than what is in use cannot be a live block's: not counted.
    if (b && b.size <= in_use_) in_use_ -= b.size;
    return true;
  }

  Inner inner_{};
  std::size_t limit_ = std::numeric_limits<std::size_t>::max();
  std::size_t in_use_ = 0;
  std::size_t refused_ = 0;
};

}  // namespace alloy
