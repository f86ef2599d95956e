// SPDX-License-Identifier: Apache-2.0
// alloy/error.hpp: the exceptions thrown at the edges of a composition.
//
// Nothing inside a composition throws: policies return an empty block. The adaptors (Thrust,
// std::pmr, cuda::mr) and the explicit throwing helpers turn that into one of these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>
#if __has_include(<source_location>)
#  include <source_location>
#endif

namespace alloy {

#if defined(__cpp_lib_source_location)
using source_location = std::source_location;
#else
/// Where a call was made, for toolchains whose standard library lacks `std::source_location`
/// (libstdc++ 12 under clang 14): the same builtins, captured as default arguments.
struct source_location {
  static constexpr source_location current(const char* file = __builtin_FILE(), int line = __builtin_LINE(),
                                           const char* function = __builtin_FUNCTION()) noexcept {
    source_location at;
    at.file_ = file;
    at.line_ = line;
    at.function_ = function;
    return at;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr unsigned line() const noexcept { return static_cast<unsigned>(line_); }
  constexpr unsigned column() const noexcept { return 0; }
  constexpr const char* function_name() const noexcept { return function_; }

 private:
  const char* file_ = "";
  int line_ = 0;
  const char* function_ = "";
};
#endif

/// What an allocator knew about itself when a request failed. Fields it cannot know are zero.
struct oom_report {
  std::size_t requested = 0;           ///< bytes the caller asked for
  std::size_t alignment = 0;           ///< alignment the caller asked for
  std::size_t limit = 0;               ///< bytes_limit or bytes_reservable_limit; 0 = none known
  std::size_t in_use = 0;              ///< bytes handed out and not yet given back
  std::size_t reserved = 0;            ///< bytes taken from the upstream
  std::size_t largest_free_block = 0;  ///< biggest request the reserved memory could serve now
  double fragmentation = 0.0;          ///< 1 - largest free block / free bytes
};

namespace detail {

inline std::string format_bytes(std::size_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%zu B", bytes);
  } else {
    std::snprintf(text, sizeof text, "%.2f %s", value, units[unit]);
  }
  return text;
}

inline std::string describe(const oom_report& r) {
  std::string text = "alloy: out of memory: tried to allocate " + format_bytes(r.requested);
  if (r.alignment > 1) text += " (alignment " + std::to_string(r.alignment) + ")";
  text += "; limit " + (r.limit ? format_bytes(r.limit) : std::string("none"));
  text += ", in use " + format_bytes(r.in_use);
  text += ", reserved " + format_bytes(r.reserved);
  text += ", largest free block " + format_bytes(r.largest_free_block);
  char frag[32];
  std::snprintf(frag, sizeof frag, "%.1f%%", r.fragmentation * 100.0);
  text += ", fragmentation ";
  text += frag;
  return text;
}

inline std::string where(const alloy::source_location& at) {
  return std::string(at.file_name()) + ":" + std::to_string(at.line());
}

}  // namespace detail

/// Thrown by an edge when a composition could not serve a request. `what()` answers the questions
/// every user asks after an OOM: how much, against what limit, how much was in use and reserved,
/// the largest free block and the fragmentation.
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(const oom_report& report) : report_(report), message_(detail::describe(report)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  const oom_report& report() const noexcept { return report_; }

 private:
  oom_report report_;
  std::string message_;
};

/// A misuse of the API (bad alignment, foreign pointer, double free ...), with file and line.
class logic_error : public std::logic_error {
 public:
  explicit logic_error(const std::string& what, alloy::source_location at = alloy::source_location::current())
      : std::logic_error("alloy: " + what + " (" + detail::where(at) + ")") {}
};

/// A CUDA call failed for a reason other than lack of memory. Names the call, file and line.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(int code, const std::string& error_name, const std::string& call, const char* file, int line)
      : std::runtime_error("alloy: CUDA call " + call + " failed with " + error_name + " (" + std::to_string(code) +
                           ") at " + file + ":" + std::to_string(line)),
        code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

}  // namespace alloy
