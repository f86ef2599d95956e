// SPDX-License-Identifier: Apache-2.0
// tools/replay/rmm_trace.hpp: reads allocation logs in RAPIDS RMM's CSV format, for the replay
// tool (alloy-replay), the replay benchmarks and the tests that replay the shipped traces.
//
//   Thread,Time,Action,Pointer,Size,Stream
//   1,23:00:53.858957,allocate,0x737a54000000,154389504,0
//   1,23:00:53.861002,free,0x737a54000000,154389504,0
//   1,23:00:53.861100,allocate failure,(nil),99999999999,0
//
// Plain or gzip-compressed files (zlib reads both). Actions: `allocate`, `free`,
// `allocate failure` (kept as events: a replay tries the request again). The stream column is hex
// without `0x`, as RMM writes it (RMM's own replay reads it as decimal). The pointer only pairs a
// free with its allocate: the reader numbers the allocations 0, 1, 2, ... and gives every free the
// number of the allocate it undoes, so a replayer keeps a `std::vector<block>` indexed by that
// number. A free's size is read (it must be a number) but not compared: the replay frees the block
// its allocate made, as the logged program did.
//
// Bad input: a malformed row (wrong field count, unknown action, bad number), a free of a pointer
// that is not live, an allocate of a pointer that is still live, a file that ends in the middle of
// a row or of its compressed stream. With `bad_rows::stop` (the default) the first one throws
// `std::runtime_error` "FILE:LINE: what"; with `bad_rows::skip` each one is recorded in
// `rmm_trace::problems` (and passed to `trace_read_options::report`) and reading goes on: the row
// is dropped, except an allocate of a live pointer, which first frees the old allocation (its free
// was evidently lost).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
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

/// One bad row that was skipped (or, in `stop` mode, the one that stopped the reading).
struct trace_problem {
  std::size_t line = 0;  ///< 1-based line in the file; 0 when the problem is the whole file
  std::string message;
};

struct rmm_trace {
  std::string name;
  std::vector<trace_event> events;
  std::size_t allocations = 0;          ///< allocate events (numbers 0 .. allocations-1)
  std::size_t failures = 0;             ///< allocate failure events
  std::size_t peak_live_bytes = 0;      ///< most bytes live at once, as recorded
  std::size_t unfreed = 0;              ///< allocations never freed in the file
  std::string format = "rmm";           ///< what the file was: "rmm" or "minimalloc"
  double size_factor = 1;               ///< every size multiplied by this since reading (`resize_trace`)
  std::size_t lines = 0;                ///< lines read
  std::vector<trace_problem> problems;  ///< rows skipped (`bad_rows::skip`), at most `max_problems_kept`
  std::size_t problem_count = 0;        ///< all of them, kept or not
};

/// What a reader does with a bad row: stop with an exception (default) or record it and go on.
enum class bad_rows : std::uint8_t { stop, skip };

struct trace_read_options {
  bad_rows on_bad_row = bad_rows::stop;
  /// Called for every problem as it is found (skip mode), with the file name and the problem.
  std::function<void(const std::string& name, const trace_problem&)> report{};
  std::size_t max_problems_kept = 1000;
};

/// "NAME:LINE: message", the form every reader error takes.
inline std::string describe(const std::string& name, const trace_problem& p) {
  return name + ":" + std::to_string(p.line) + ": " + p.message;
}

namespace detail {

/// Thrown inside the readers for one bad row; the caller turns it into a stop or a skip.
struct bad_row {
  std::string message;
};

[[noreturn]] inline void trace_error(const std::string& name, std::size_t line, const std::string& what) {
  throw std::runtime_error(describe(name, {line, what}));
}

/// Records a problem (skip mode) or throws it (stop mode).
inline void trace_problem_found(rmm_trace& trace, const trace_read_options& opts, std::size_t line,
                                std::string message) {
  if (opts.on_bad_row == bad_rows::stop) trace_error(trace.name, line, message);
  trace_problem p{line, std::move(message)};
  if (opts.report) opts.report(trace.name, p);
  ++trace.problem_count;
  if (trace.problems.size() < opts.max_problems_kept) trace.problems.push_back(std::move(p));
}

inline std::uint64_t parse_unsigned(std::string_view text, int base, const char* field) {
  if (base == 16 && text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) text.remove_prefix(2);
  if (text.empty()) throw bad_row{std::string("empty ") + field};
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
      throw bad_row{std::string("bad ") + field + " '" + std::string(text) + "'"};
    }
    if (value > (UINT64_MAX - static_cast<std::uint64_t>(digit)) / static_cast<std::uint64_t>(base))
      throw bad_row{std::string(field) + " out of range '" + std::string(text) + "'"};
    value = value * static_cast<std::uint64_t>(base) + static_cast<std::uint64_t>(digit);
  }
  return value;
}

/// Splits `line` at commas into at most `max` fields; returns how many fields the line has.
inline std::size_t split_fields(std::string_view line, std::string_view* field, std::size_t max) {
  std::size_t count = 0;
  for (std::string_view rest = line;; ++count) {
    const std::size_t comma = rest.find(',');
    if (count < max) field[count] = rest.substr(0, comma);
    if (comma == std::string_view::npos) return count + 1;
    rest.remove_prefix(comma + 1);
  }
}

/// Walks the lines of `text`: `f(line_number, line, last_without_newline)` for every line that is
/// not empty (a trailing '\r' removed). Returns the number of lines.
template <class F>
std::size_t for_each_line(std::string_view text, F&& f) {
  std::size_t number = 0;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    const bool unterminated = end == std::string_view::npos;
    text.remove_prefix(unterminated ? text.size() : end + 1);
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) f(number, line, unterminated);
  }
  return number;
}

/// The text of a file, plain or gzip-compressed ("-" = standard input). A compressed stream that
/// ends early or is corrupt leaves what could be read in `text` and the reason in `error`.
struct file_text {
  std::string text;
  std::string error;
};

inline file_text read_file_text(const std::string& path) {
  gzFile file = path == "-" ? gzdopen(0, "rb") : gzopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error(path + ": cannot open");
  file_text out;
  char buffer[1 << 16];
  for (;;) {
    const int n = gzread(file, buffer, sizeof buffer);
    if (n > 0) out.text.append(buffer, static_cast<std::size_t>(n));
    if (n > 0) continue;
    int code = Z_OK;  // the end: clean, or a stream cut short (Z_BUF_ERROR) or corrupt
    const char* message = gzerror(file, &code);
    if (n < 0 || (code != Z_OK && code != Z_STREAM_END) || !gzeof(file))
      out.error = message != nullptr && *message != '\0' ? message : "read error";
    break;
  }
  gzclose(file);
  return out;
}

/// The number of the line that `text`'s last byte is on (1-based), for "after line N" messages.
inline std::size_t last_line_number(std::string_view text) {
  std::size_t lines = 0;
  for (const char c : text) lines += c == '\n';
  return lines + (!text.empty() && text.back() != '\n');
}

}  // namespace detail

/// Parses the text of an RMM log (header line first). `name` is used in messages.
inline rmm_trace parse_rmm_trace(std::string_view text, std::string name, const trace_read_options& opts) {
  rmm_trace trace;
  trace.name = std::move(name);
  std::unordered_map<std::uint64_t, std::size_t> live;  // pointer -> allocation number
  std::vector<std::size_t> sizes;                       // allocation number -> size
  std::size_t live_bytes = 0;
  bool header_seen = false;
  auto free_allocation = [&](std::size_t allocation, const trace_event& like) {
    trace_event event = like;
    event.action = trace_action::free;
    event.allocation = allocation;
    event.size = sizes[allocation];
    live_bytes -= sizes[allocation];
    trace.events.push_back(event);
  };
  trace.lines = detail::for_each_line(text, [&](std::size_t line_number, std::string_view line, bool unterminated) {
    if (!header_seen) {
      if (line != "Thread,Time,Action,Pointer,Size,Stream")
        detail::trace_error(trace.name, line_number, "expected the header Thread,Time,Action,Pointer,Size,Stream");
      header_seen = true;
      return;
    }
    try {
      std::string_view field[6];
      const std::size_t count = detail::split_fields(line, field, 6);
      if (count != 6) throw detail::bad_row{"expected 6 fields, found " + std::to_string(count)};
      trace_event event;
      event.thread = detail::parse_unsigned(field[0], 10, "thread");
      event.size = static_cast<std::size_t>(detail::parse_unsigned(field[4], 10, "size"));
      event.stream = detail::parse_unsigned(field[5], 16, "stream");
      const std::string_view action = field[2];
      if (action == "allocate failure") {
        event.action = trace_action::allocate_failure;
        ++trace.failures;
      } else if (action == "allocate" || action == "free") {
        const std::uint64_t pointer = detail::parse_unsigned(field[3], 16, "pointer");
        if (action == "allocate") {
          event.action = trace_action::allocate;
          if (const auto old = live.find(pointer); old != live.end()) {
            const std::size_t lost = old->second;
            live.erase(old);
            detail::trace_problem_found(
                trace, opts, line_number,
                "allocate of pointer " + std::string(field[3]) + " already live (its free is missing; freed here)");
            free_allocation(lost, event);  // skip mode only: stop mode has thrown
          }
          event.allocation = trace.allocations++;
          live.emplace(pointer, event.allocation);
          sizes.push_back(event.size);
          live_bytes += event.size;
          if (live_bytes > trace.peak_live_bytes) trace.peak_live_bytes = live_bytes;
        } else {
          event.action = trace_action::free;
          const auto found = live.find(pointer);
          if (found == live.end())
            throw detail::bad_row{"free of pointer " + std::string(field[3]) + " that is not live"};
          event.allocation = found->second;
          live.erase(found);
          live_bytes -= sizes[event.allocation];
        }
      } else {
        throw detail::bad_row{"unknown action '" + std::string(action) + "'"};
      }
      trace.events.push_back(event);
    } catch (const detail::bad_row& bad) {
      std::string message = bad.message;
      if (unterminated) message = "truncated row (the file ends in the middle of it): " + message;
      detail::trace_problem_found(trace, opts, line_number, std::move(message));
    }
  });
  if (!header_seen) detail::trace_error(trace.name, trace.lines, "empty file (no header)");
  trace.unfreed = live.size();
  return trace;
}

/// Parses the text of an RMM log; the first bad row throws.
inline rmm_trace parse_rmm_trace(std::string_view text, std::string name = "trace") {
  return parse_rmm_trace(text, std::move(name), trace_read_options{});
}

/// Reads a compressed file's text, turning a stream that ends early into a problem (thrown in stop
/// mode; in skip mode recorded by `record`, and the partial last line dropped).
template <class Record>
std::string read_trace_text(const std::string& path, const trace_read_options& opts, Record&& record) {
  detail::file_text file = detail::read_file_text(path);
  if (file.error.empty()) return std::move(file.text);
  const std::size_t line = detail::last_line_number(file.text);
  trace_problem p{line, "the file is truncated or corrupt after this line (zlib: " + file.error + ")"};
  if (opts.on_bad_row == bad_rows::stop) throw std::runtime_error(describe(path, p));
  const std::size_t cut = file.text.rfind('\n');
  file.text.resize(cut == std::string::npos ? 0 : cut + 1);
  record(std::move(p));
  return std::move(file.text);
}

/// Reads and parses an RMM log file, plain or gzip-compressed ("-" = standard input).
inline rmm_trace read_rmm_trace(const std::string& path, const trace_read_options& opts) {
  std::vector<trace_problem> early;
  const std::string text = read_trace_text(path, opts, [&](trace_problem p) { early.push_back(std::move(p)); });
  rmm_trace trace = parse_rmm_trace(text, path, opts);
  for (trace_problem& p : early) {
    if (opts.report) opts.report(path, p);
    ++trace.problem_count;
    trace.problems.push_back(std::move(p));
  }
  return trace;
}

/// Reads and parses an RMM log file; the first bad row throws.
inline rmm_trace read_rmm_trace(const std::string& path) { return read_rmm_trace(path, trace_read_options{}); }

}  // namespace alloy::bench
