// bench/support/rmm_trace.hpp: reads allocation logs in RAPIDS RMM's CSV format, for the replay
// benchmarks and the tests that replay the shipped traces.
//
//   Thread,Time,Action,Pointer,Size,Stream
//   1,23:00:53.858957,allocate,0x737a54000000,154389504,0
//   1,23:00:53.861002,free,0x737a54000000,154389504,0
//   1,23:00:53.861100,allocate failure,(nil),99999999999,0
//
// Plain or gzip-compressed files (zlib reads both). Actions: `allocate`, `free`,
// `allocate failure`. The pointer only pairs a free with its allocate: `read_rmm_trace` numbers
// the allocations 0, 1, 2, ... and gives every free the number of the allocate it undoes, so a
// replayer keeps a `std::vector<block>` indexed by that number. Anything malformed (wrong field
// count, unknown action, bad number, a free of a pointer that is not live, an allocate of a
// pointer that is still live) throws `std::runtime_error` naming the file and line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <zlib.h>

namespace alloy::bench {

enum class trace_action : std::uint8_t { allocate, free, allocate_failure };

struct trace_event {
  trace_action action = trace_action::allocate;
  std::size_t size = 0;        ///< bytes asked for (as logged)
  std::size_t allocation = 0;  ///< allocate / free: the allocation's number; failure: unused
  std::uint64_t stream = 0;    ///< stream handle as logged (0 = default stream)
  std::uint64_t thread = 0;
};

struct rmm_trace {
  std::string name;
  std::vector<trace_event> events;
  std::size_t allocations = 0;      ///< allocate events (numbers 0 .. allocations-1)
  std::size_t failures = 0;         ///< allocate failure events
  std::size_t peak_live_bytes = 0;  ///< most bytes live at once, as recorded
  std::size_t unfreed = 0;          ///< allocations never freed in the file
};

namespace detail {

[[noreturn]] inline void trace_error(const std::string& name, std::size_t line, const std::string& what) {
  throw std::runtime_error(name + ":" + std::to_string(line) + ": " + what);
}

inline std::uint64_t parse_unsigned(std::string_view text, int base, const std::string& name, std::size_t line,
                                    const char* field) {
  if (base == 16 && text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) text.remove_prefix(2);
  if (text.empty()) trace_error(name, line, std::string("empty ") + field);
  std::uint64_t value = 0;
  for (const char ch : text) {
    int digit;
    if (ch >= '0' && ch <= '9') {
      digit = ch - '0';
    } else if (base == 16 && ch >= 'a' && ch <= 'f') {
      digit = ch - 'a' + 10;
    } else if (base == 16 && ch >= 'A' && ch <= 'F') {
      digit = ch - 'A' + 10;
    } else {
      trace_error(name, line, std::string("bad ") + field + " '" + std::string(text) + "'");
    }
    if (value > (UINT64_MAX - static_cast<std::uint64_t>(digit)) / static_cast<std::uint64_t>(base))
      trace_error(name, line, std::string(field) + " out of range '" + std::string(text) + "'");
    value = value * static_cast<std::uint64_t>(base) + static_cast<std::uint64_t>(digit);
  }
  return value;
}

}  // namespace detail

/// Parses the text of an RMM log (header line first). `name` is used in error messages.
inline rmm_trace parse_rmm_trace(std::string_view text, std::string name = "trace") {
  rmm_trace trace;
  trace.name = std::move(name);
  std::unordered_map<std::uint64_t, std::size_t> live;  // pointer -> allocation number
  std::vector<std::size_t> sizes;                       // allocation number -> size
  std::size_t live_bytes = 0;
  std::size_t line_number = 0;
  bool header_seen = false;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (!header_seen) {
      if (line != "Thread,Time,Action,Pointer,Size,Stream")
        detail::trace_error(trace.name, line_number, "expected the header Thread,Time,Action,Pointer,Size,Stream");
      header_seen = true;
      continue;
    }
    std::string_view field[6];
    std::size_t count = 0;
    for (std::string_view rest = line;; ++count) {
      const std::size_t comma = rest.find(',');
      if (count < 6) field[count] = rest.substr(0, comma);
      if (comma == std::string_view::npos) {
        ++count;
        break;
      }
      rest.remove_prefix(comma + 1);
    }
    if (count != 6)
      detail::trace_error(trace.name, line_number, "expected 6 fields, found " + std::to_string(count));
    trace_event event;
    event.thread = detail::parse_unsigned(field[0], 10, trace.name, line_number, "thread");
    event.size = static_cast<std::size_t>(detail::parse_unsigned(field[4], 10, trace.name, line_number, "size"));
    event.stream = detail::parse_unsigned(field[5], 16, trace.name, line_number, "stream");
    const std::string_view action = field[2];
    if (action == "allocate failure") {
      event.action = trace_action::allocate_failure;
      ++trace.failures;
    } else {
      const std::uint64_t pointer = detail::parse_unsigned(field[3], 16, trace.name, line_number, "pointer");
      if (action == "allocate") {
        event.action = trace_action::allocate;
        event.allocation = trace.allocations++;
        if (!live.emplace(pointer, event.allocation).second)
          detail::trace_error(trace.name, line_number, "allocate of pointer " + std::string(field[3]) + " already live");
        sizes.push_back(event.size);
        live_bytes += event.size;
        if (live_bytes > trace.peak_live_bytes) trace.peak_live_bytes = live_bytes;
      } else if (action == "free") {
        event.action = trace_action::free;
        const auto found = live.find(pointer);
        if (found == live.end())
          detail::trace_error(trace.name, line_number, "free of pointer " + std::string(field[3]) + " that is not live");
        event.allocation = found->second;
        live.erase(found);
        live_bytes -= sizes[event.allocation];
      } else {
        detail::trace_error(trace.name, line_number, "unknown action '" + std::string(action) + "'");
      }
    }
    trace.events.push_back(event);
  }
  if (!header_seen) detail::trace_error(trace.name, line_number, "empty file (no header)");
  trace.unfreed = live.size();
  return trace;
}

/// Reads and parses an RMM log file, plain or gzip-compressed.
inline rmm_trace read_rmm_trace(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error(path + ": cannot open");
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const int n = gzread(file, buffer, sizeof buffer);
    if (n < 0) {
      int code = 0;
      const std::string message = gzerror(file, &code);
      gzclose(file);
      throw std::runtime_error(path + ": read error: " + message);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  gzclose(file);
  return parse_rmm_trace(text, path);
}

}  // namespace alloy::bench
