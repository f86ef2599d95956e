// alloy/policy/limited.hpp
#pragma once

#include <cstddef>
#include <limits>
#include <tuple>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/passes_on.hpp>

namespace alloy {

/// `limited<Inner>` puts a hard cap on the bytes in use.
///
/// - Strategy: counts the bytes of every live block (the sizes callers asked for, as DESIGN §2
///   defines a block's size) and refuses, with an empty block, any request that would take the
///   count past `bytes_limit`. The refusal happens before `Inner` is asked, so `Inner` is left
///   untouched. A request the inner allocator fails is not counted.
/// - Options: `bytes_limit` (default: no limit); `set_bytes_limit()` changes it at run time
///   (lowering it below the bytes in use refuses new requests until enough are freed).
/// - Capabilities: exactly those of `Inner`; stream-ordered calls are counted the same way.
///   `counters()` adds the refusals to `Inner`'s `num_ooms` (to a caller they are out-of-memory
///   failures). Movable handles are not passed on: the cap is on raw blocks, so put `limited`
///   under a `host_spill_reclaimer`, as its device side, to give movable memory a capacity.
/// - Thread safety: none (wrap in `synchronized`). Metadata: three counters.
template <allocator Inner>
class limited : public detail::passes_on_capabilities<limited<Inner>, Inner> {
 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;

  struct options {
    std::size_t bytes_limit = std::numeric_limits<std::size_t>::max();
  };

  limited() = default;
  explicit limited(Inner inner, options opts = {}) : inner_(std::move(inner)), limit_(opts.bytes_limit) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!fits(bytes)) return refuse();
    return count(inner_.allocate(bytes, alignment));
  }
  void deallocate(block b) noexcept {
    if (b) in_use_ -= b.size;
    inner_.deallocate(b);
  }

  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  block allocate(std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    if (!fits(bytes)) return refuse();
    return count(inner_.allocate(bytes, alignment, stream));
  }
  template <class Stream>
    requires stream_ordered_allocator<Inner, Stream>
  void deallocate(block b, Stream stream) noexcept {
    if (b) in_use_ -= b.size;
    inner_.deallocate(b, stream);
  }

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
  bool fits(std::size_t bytes) const noexcept { return in_use_ <= limit_ && bytes <= limit_ - in_use_; }
  block refuse() noexcept {
    ++refused_;
    return {};
  }
  block count(block b) noexcept {
    if (b) in_use_ += b.size;
    return b;
  }

  Inner inner_{};
  std::size_t limit_ = std::numeric_limits<std::size_t>::max();
  std::size_t in_use_ = 0;
  std::size_t refused_ = 0;
};

}  // namespace alloy
