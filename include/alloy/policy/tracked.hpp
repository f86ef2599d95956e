// SPDX-License-Identifier: Apache-2.0
// alloy/policy/tracked.hpp
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/detail/forwarding.hpp>
#include <alloy/error.hpp>

#if __has_include(<execinfo.h>)
#  include <execinfo.h>
#  define ALLOY_HAS_BACKTRACE 1
#else
#  define ALLOY_HAS_BACKTRACE 0
#endif

namespace alloy {

/// One allocation `tracked<>` holds as outstanding.
struct tracked_allocation {
  void* ptr = nullptr;
  std::size_t size = 0;         ///< bytes the caller asked for
  std::uint64_t sequence = 0;   ///< 0 for the first allocation the tracker saw, then 1, 2 ...
  std::vector<void*> frames{};  ///< return addresses of the allocating call stack (when captured)

  /// The call stack, one frame a line, symbolised as well as the C library can (`-rdynamic`
  /// helps); empty when no stack was captured.
  std::string stack() const {
    std::string out;
#if ALLOY_HAS_BACKTRACE
    if (frames.empty()) return out;
    char** symbols = ::backtrace_symbols(frames.data(), static_cast<int>(frames.size()));
    for (std::size_t i = 0; i < frames.size(); ++i) {
      char address[32];
      std::snprintf(address, sizeof address, "%p", frames[i]);
      out += "    #" + std::to_string(i) + " " + (symbols != nullptr ? std::string(symbols[i]) : std::string(address)) +
             "\n";
    }
    std::free(symbols);
#endif
    return out;
  }
};

/// `tracked<Inner>` remembers every outstanding allocation, for leak reports.
///
/// - Strategy: a hash map from pointer to `tracked_allocation` (size, sequence number, and, when
///   `options::capture_stacks` is on, up to `options::max_frames` return addresses taken with
///   glibc's `backtrace`; off by default: it costs microseconds per call). Metadata lives on the
///   host, one map entry per live block.
/// - Questions: `outstanding_count()`, `outstanding_bytes()`, `outstanding()` (oldest first),
///   `leak_report()` (a readable list with call stacks), `unknown_frees()` (frees of a pointer the
///   tracker does not hold as outstanding, or with another size than it was allocated with).
/// - Bad frees: a free the tracker does not recognise is passed on to `Inner` only when `Inner`
///   checks its frees (`try_deallocate`), and forgets nothing unless `Inner` accepted it (a block
///   allocated below the tracker, which `Inner` accepts, is counted in `unknown_frees()` too).
///   Over a part that cannot tell, the tracker refuses such a free itself (it is not passed on):
///   every block it handed out is in its map, with its size.
/// - Capabilities: exactly those of `Inner` (`detail::decorates`: keeping-cache and stream-ordered
///   calls tracked the same way, checked frees, the queries passed on) except movable handles.
/// - Failure: noexcept. When the map cannot grow (out of host memory) the request is given back
///   to `Inner` and fails with an empty block, so every block handed out is tracked.
/// - The tracker does not free outstanding blocks when destroyed: it reports them, `Inner` (and
///   its own leak checks) decides. Thread safety: none (wrap in `synchronized`).
template <allocator Inner>
class tracked : public detail::decorates<tracked<Inner>, Inner> {
 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;

  struct options {
    bool capture_stacks = false;  ///< record the allocating call stack of every block
    std::size_t max_frames = 32;  ///< frames kept per stack
  };

  tracked() = default;
  explicit tracked(Inner inner, options opts = {}) : inner_(std::move(inner)), options_(opts) {}

  // ---- questions -------------------------------------------------------------------------------

  std::size_t outstanding_count() const noexcept { return live_.size(); }
  std::size_t outstanding_bytes() const noexcept { return live_bytes_; }
  std::size_t unknown_frees() const noexcept { return unknown_frees_; }
  /// Whether `ptr` is an outstanding allocation of this tracker.
  bool is_outstanding(const void* ptr) const noexcept { return live_.count(const_cast<void*>(ptr)) != 0; }

  /// Every outstanding allocation, oldest first.
  std::vector<tracked_allocation> outstanding() const {
    std::vector<tracked_allocation> all;
    all.reserve(live_.size());
    for (const auto& entry : live_) all.push_back(entry.second);
    std::sort(all.begin(), all.end(),
              [](const tracked_allocation& l, const tracked_allocation& r) { return l.sequence < r.sequence; });
    return all;
  }

  /// "N outstanding allocations, B bytes", then one line per allocation (oldest first, at most
  /// `max_entries`), each followed by its call stack when one was captured. Empty when nothing is
  /// outstanding.
  std::string leak_report(std::size_t max_entries = 100) const {
    if (live_.empty()) return {};
    std::string out = "alloy: " + std::to_string(live_.size()) + " outstanding allocation" +
                      (live_.size() == 1 ? "" : "s") + ", " + detail::format_bytes(live_bytes_) + " (" +
                      std::to_string(live_bytes_) + " bytes)\n";
    const std::vector<tracked_allocation> all = outstanding();
    for (std::size_t i = 0; i < all.size() && i < max_entries; ++i) {
      char line[96];
      std::snprintf(line, sizeof line, "  #%llu %p, %zu bytes\n", static_cast<unsigned long long>(all[i].sequence),
                    all[i].ptr, all[i].size);
      out += line;
      out += all[i].stack();
    }
    if (all.size() > max_entries) out += "  ... and " + std::to_string(all.size() - max_entries) + " more\n";
    return out;
  }

  const options& get_options() const noexcept { return options_; }
  Inner& inner() noexcept { return inner_; }
  const Inner& inner() const noexcept { return inner_; }
  auto parts() noexcept { return std::tie(inner_); }
  auto parts() const noexcept { return std::tie(inner_); }

 private:
  friend class detail::decorates<tracked, Inner>;

  template <class Call, class GiveBack, class... Stream>
  block on_allocate(std::size_t bytes, std::size_t, Call call, GiveBack give_back, detail::allocation_kind,
                    Stream...) noexcept {
    return remember(call(bytes), give_back);
  }
  template <class Call, class... Stream>
  bool on_free(block b, Call call, Stream...) noexcept {
    constexpr bool inner_checks = sizeof...(Stream) == 0
                                      ? checked_deallocating_allocator<Inner>
                                      : (checked_stream_deallocating_allocator<Inner, Stream> && ...);
    if (!b) return call(b) != detail::free_outcome::refused;
    const auto found = live_.find(b.ptr);
    const bool known = found != live_.end() && found->second.size == b.size;
    if (!known && !inner_checks) {  // nobody below could refuse it: refused here
      ++unknown_frees_;
      return false;
    }
    if (call(b) == detail::free_outcome::refused) {
      if (!known) ++unknown_frees_;
      return false;
    }
    if (known) {
      live_bytes_ -= found->second.size;
      live_.erase(found);
    } else {
      ++unknown_frees_;
    }
    return true;
  }

  template <class GiveBack>
  block remember(block b, GiveBack give_back) noexcept {
    if (!b) return b;
    try {
      tracked_allocation record{b.ptr, b.size, next_sequence_, {}};
#if ALLOY_HAS_BACKTRACE
      if (options_.capture_stacks && options_.max_frames > 0) {
        record.frames.resize(options_.max_frames + 1);
        const int n = ::backtrace(record.frames.data(), static_cast<int>(record.frames.size()));
        // Drop this frame (remember itself); keep the caller's.
        record.frames.erase(record.frames.begin());
        record.frames.resize(n > 0 ? static_cast<std::size_t>(n - 1) : 0);
      }
#endif
      live_.insert_or_assign(b.ptr, std::move(record));
    } catch (...) {
      give_back(b);
      return {};
    }
    ++next_sequence_;
    live_bytes_ += b.size;
    return b;
  }
  Inner inner_{};
  options options_{};
  std::unordered_map<void*, tracked_allocation> live_;
  std::size_t live_bytes_ = 0;
  std::uint64_t next_sequence_ = 0;
  std::size_t unknown_frees_ = 0;
};

}  // namespace alloy
