// SPDX-License-Identifier: Apache-2.0
// alloy/policy/logged.hpp
#pragma once

#include <chrono>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include <alloy/concepts.hpp>
#include <alloy/detail/forwarding.hpp>
#include <alloy/error.hpp>

#if defined(__linux__)
#  include <sys/syscall.h>
#  include <unistd.h>
#endif

namespace alloy {

namespace detail {

/// The OS thread id on Linux (what RMM's logs show), a hash of `std::thread::id` elsewhere.
inline std::uint64_t log_thread_id() noexcept {
#if defined(__linux__)
  return static_cast<std::uint64_t>(::syscall(SYS_gettid));
#else
  return static_cast<std::uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
#endif
}

/// A stream value as the log writes it: the handle's bits, in hex without `0x`.
template <class Stream>
std::uint64_t stream_bits(Stream stream) noexcept {
  if constexpr (std::is_pointer_v<Stream>) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(stream));
  } else if constexpr (std::is_integral_v<Stream> || std::is_enum_v<Stream>) {
    return static_cast<std::uint64_t>(stream);
  } else if constexpr (requires { stream.get(); }) {
    return stream_bits(stream.get());
  } else {
    return 0;
  }
}

}  // namespace detail

/// `logged<Inner>` writes every allocation and deallocation as one line of RAPIDS RMM's log CSV,
/// the format RMM's replay benchmark and alloy's replay tool read:
///
///     Thread,Time,Action,Pointer,Size,Stream
///     4711,09:12:03.123456,allocate,0x7f3a54000000,1048576,0
///     4711,09:12:03.123501,free,0x7f3a54000000,1048576,0
///     4711,09:12:03.124002,allocate failure,(nil),1099511627776,0
///
/// - Columns: OS thread id; local wall-clock time `HH:MM:SS.microseconds`; `allocate`, `free` or
///   `allocate failure`; the pointer in hex (`(nil)` for a failure); the size the caller asked
///   for, in decimal; the stream in hex without `0x` (`0` for the calls without a stream). The
///   header is written once, when the logger is constructed. Freeing an empty block is not logged.
/// - Sinks: a file path (created or truncated; `alloy::logic_error` when it cannot be opened) or
///   a `std::ostream` the caller owns and keeps alive. The default-constructed logger writes to
///   `std::clog`. `options::flush_every_line` flushes after each line (for logs that must survive
///   a crash; slower).
/// - Frees: a free the part below refused as misuse (it has `try_deallocate`, and said no) is not
///   logged, so that a log always replays; over a part that cannot tell, every free of a
///   non-empty block is logged. A free is written after the part took it.
/// - Capabilities: exactly those of `Inner` (`detail::decorates`: keeping-cache and stream-ordered
///   calls are logged, the latter with their stream, a failed keeping-cache call is not (its
///   caller retries); checked frees; the queries passed on),
///   except movable handles (the CSV has no action for them).
/// - Failure: the allocation calls stay noexcept; a line that cannot be written (a stream in a
///   failed state) is lost, the allocation is not affected.
/// - Thread safety: none (wrap in `synchronized`). Move-only when it owns its file.
template <allocator Inner>
class logged : public detail::decorates<logged<Inner>, Inner> {
 public:
  static constexpr bool host_accessible = Inner::host_accessible;
  static constexpr bool device_accessible = Inner::device_accessible;

  struct options {
    bool flush_every_line = false;
  };

  static constexpr const char* header = "Thread,Time,Action,Pointer,Size,Stream";

  logged() : out_(&std::clog) { write_header(); }
  logged(Inner inner, std::ostream& out, options opts = {}) : inner_(std::move(inner)), out_(&out), options_(opts) {
    write_header();
  }
  logged(Inner inner, const std::string& path, options opts = {})
      : inner_(std::move(inner)),
        file_(std::make_unique<std::ofstream>(path, std::ios::out | std::ios::trunc)),
        options_(opts) {
    if (!*file_) throw alloy::logic_error("cannot open log file " + path);
    out_ = file_.get();
    write_header();
  }

  /// Flushes the log.
  void flush() noexcept {
    try {
      out_->flush();
    } catch (...) {}
  }
  std::ostream& stream() noexcept { return *out_; }

  Inner& inner() noexcept { return inner_; }
  const Inner& inner() const noexcept { return inner_; }
  auto parts() noexcept { return std::tie(inner_); }
  auto parts() const noexcept { return std::tie(inner_); }

 private:
  friend class detail::decorates<logged, Inner>;

  template <class Call, class GiveBack, class... Stream>
  block on_allocate(std::size_t bytes, std::size_t, Call call, GiveBack, detail::allocation_kind kind,
                    Stream... stream) noexcept {
    const block b = call(bytes);
    // A failed allocate_keeping_cache is not a failure yet: its caller retries with allocate.
    if (b || kind != detail::allocation_kind::keeping_cache)
      log_allocate(b, bytes, (std::uint64_t{0} + ... + detail::stream_bits(stream)));
    return b;
  }
  template <class Call, class... Stream>
  bool on_free(block b, Call call, Stream... stream) noexcept {
    // The address is logged as a number taken before the free: the pointer is not used after it.
    const auto address = reinterpret_cast<std::uintptr_t>(b.ptr);
    if (call(b) == detail::free_outcome::refused) return false;
    if (b) log_line("free", address, b.size, (std::uint64_t{0} + ... + detail::stream_bits(stream)));
    return true;
  }

  void write_header() {
    *out_ << header << '\n';
    if (options_.flush_every_line) out_->flush();
  }
  void log_allocate(block b, std::size_t bytes, std::uint64_t stream) noexcept {
    if (b) {
      log_line("allocate", reinterpret_cast<std::uintptr_t>(b.ptr), b.size, stream);
    } else {
      log_line("allocate failure", 0, bytes, stream);
    }
  }
  void log_line(const char* action, std::uintptr_t address, std::size_t size, std::uint64_t stream) noexcept {
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1'000'000;
    std::tm local{};
    localtime_r(&seconds, &local);
    char pointer[32];
    if (address == 0) {
      std::snprintf(pointer, sizeof pointer, "(nil)");
    } else {
      std::snprintf(pointer, sizeof pointer, "0x%" PRIxPTR, address);
    }
    char line[192];
    const int n = std::snprintf(line, sizeof line, "%" PRIu64 ",%02d:%02d:%02d.%06lld,%s,%s,%zu,%" PRIx64 "\n",
                                detail::log_thread_id(), local.tm_hour, local.tm_min, local.tm_sec,
                                static_cast<long long>(micros), action, pointer, size, stream);
    try {
      out_->write(line, n);
      if (options_.flush_every_line) out_->flush();
    } catch (...) {  // a stream set to throw: the line is lost, the allocation is not
    }
  }

  Inner inner_{};
  std::unique_ptr<std::ofstream> file_;
  std::ostream* out_ = nullptr;
  options options_{};
};

}  // namespace alloy
