// SPDX-License-Identifier: Apache-2.0
// tools/replay/report.hpp: what alloy-replay prints and writes, from its replay results: a table
// for the terminal, JSON for programs, Markdown for bench/README.md, and an SVG chart of reserved
// and in-use bytes over the trace, one line per composition.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "replay/min_capacity.hpp"
#include "replay/replay.hpp"
#include "replay/rmm_trace.hpp"

namespace alloy::replay {

/// One trace and what every composition did with it.
struct trace_report {
  std::string path;
  const bench::rmm_trace* trace = nullptr;
  std::vector<replay_result> results;
  /// With --min-capacity: the search for each composition, in the order of `results` (which then
  /// hold the replays at the base capacity).
  std::vector<min_capacity_result> min_capacity{};
};

/// The settings every report states.
struct report_settings {
  std::size_t capacity = unlimited;
  std::size_t alignment = 256;
  int repetitions = 1;
};

// ---- formatting ------------------------------------------------------------------------------------

/// "512 B", "64.0 KiB", "4.94 GiB": three significant digits, binary units.
inline std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 5) bytes /= 1024, ++u;
  char text[32];
  if (u == 0) {
    std::snprintf(text, sizeof text, "%.0f B", bytes);
  } else {
    std::snprintf(text, sizeof text, bytes >= 100 ? "%.0f %s" : bytes >= 10 ? "%.1f %s" : "%.2f %s", bytes, units[u]);
  }
  return text;
}

inline std::string format_capacity(std::size_t capacity) {
  return capacity == unlimited ? "unlimited" : format_bytes(static_cast<double>(capacity));
}

/// 1234567 -> "1,234,567".
inline std::string format_count(std::size_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

inline std::string format_fixed(double v, int decimals) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", decimals, v);
  return text;
}

/// A factor as written ("0.75", "1", "1.5"): six significant digits, no trailing zeros.
inline std::string format_factor(double v) {
  char text[48];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

/// Calls per 1,000 operations of the trace.
inline double per_thousand_ops(std::size_t calls, const replay_result& x) {
  return 1000.0 * static_cast<double>(calls) / static_cast<double>(std::max<std::size_t>(x.operations, 1));
}

/// "12.3" map + unmap calls per 1,000 operations, "n.a." for a composition without virtual memory.
inline std::string map_calls_cell(const replay_result& x) {
  return x.virtual_memory ? format_fixed(per_thousand_ops(x.map_calls, x), 1) : std::string("n.a.");
}

/// What went wrong, for a composition that answered wrongly: "FAULT (n): the first".
inline std::string fault_text(const replay_result& x) {
  return "FAULT (" + format_count(x.faults) + (x.faults == 1 ? " wrong answer): " : " wrong answers): ") +
         x.first_fault;
}

/// "event 1,784: 9.77 MiB asked with 234 MiB in use, 266 MiB reserved".
inline std::string failed_allocation_text(const failed_allocation& f) {
  return "event " + format_count(f.event) + ": " + format_bytes(static_cast<double>(f.bytes)) + " asked with " +
         format_bytes(static_cast<double>(f.in_use)) + " in use, " + format_bytes(static_cast<double>(f.reserved)) +
         " reserved";
}

/// The file name without its folders and its trace extensions.
inline std::string display_name(const std::string& path) {
  if (path == "-") return "stdin";
  std::string n = std::filesystem::path(path).filename().string();
  for (const char* ext : {".gz", ".csv", ".rmm", ".events"}) {
    if (n.size() > std::string(ext).size() && n.ends_with(ext)) n.resize(n.size() - std::string(ext).size());
  }
  return n;
}

/// One line about the trace: its events, requests, failures, peak live, never freed.
inline std::string describe_trace(const bench::rmm_trace& t) {
  std::ostringstream s;
  s << format_count(t.events.size()) << " events (" << t.format;
  if (t.size_factor != 1) s << ", sizes x" << format_factor(t.size_factor);
  s << "): " << format_count(t.allocations) << " allocations, " << format_count(t.failures)
    << " failed when recorded, peak live " << format_bytes(static_cast<double>(t.peak_live_bytes)) << ", "
    << format_count(t.unfreed) << " never freed";
  if (t.problem_count != 0) s << "; " << format_count(t.problem_count) << " bad rows skipped";
  return s.str();
}

// ---- terminal table ---------------------------------------------------------------------------------

inline void print_table(std::ostream& out, const trace_report& r, const report_settings& s) {
  out << display_name(r.path) << "\n  " << describe_trace(*r.trace) << "\n  device capacity "
      << format_capacity(s.capacity) << ", alignment " << s.alignment << "; ns/op is the median of " << s.repetitions
      << (s.repetitions == 1 ? " replay" : " replays") << "\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-26s %9s %12s %14s %10s %10s %9s %8s %11s\n", "composition", "ns/op",
                "peak in use", "peak reserved", "reserved/", "upstream", "map calls", "failed", "moved");
  out << line;
  std::snprintf(line, sizeof line, "  %-26s %9s %12s %14s %10s %10s %9s %8s %11s\n", "", "", "", "", "peak live",
                "calls", "/1k ops", "requests", "");
  out << line;
  for (const replay_result& x : r.results) {
    std::snprintf(line, sizeof line, "  %-26s %9s %12s %14s %10.3f %10s %9s %8s %11s", x.composition.c_str(),
                  x.ns_per_op_runs.empty() ? "-" : format_fixed(x.ns_per_op, 1).c_str(),
                  format_bytes(static_cast<double>(x.peak_in_use)).c_str(),
                  format_bytes(static_cast<double>(x.peak_reserved)).c_str(), x.reserved_over_live,
                  format_count(x.upstream_calls()).c_str(), map_calls_cell(x).c_str(), format_count(x.failed).c_str(),
                  format_bytes(static_cast<double>(x.bytes_moved)).c_str());
    out << line;
    if (!x.warm_ns_per_op_runs.empty()) out << "  (warm " << format_fixed(x.warm_ns_per_op, 1) << " ns/op)";
    if (x.leaked != 0) out << "  (leaked " << format_bytes(static_cast<double>(x.leaked)) << ")";
    out << '\n';
    if (x.faults != 0) out << "    " << fault_text(x) << '\n';
    if (x.first_failed.event != 0)
      out << "    first failed allocation: " << failed_allocation_text(x.first_failed) << '\n';
  }
  out << '\n';
}

/// The --min-capacity table: per composition, the smallest capacity that served the trace and
/// what the replay at it did; map and upstream calls per 1,000 operations at the base capacity.
inline void print_min_capacity_table(std::ostream& out, const trace_report& r, const report_settings& s) {
  out << display_name(r.path) << "\n  " << describe_trace(*r.trace)
      << "\n  smallest device capacity that serves every request (to 0.5 %); calls per 1,000 operations at capacity "
      << format_capacity(s.capacity) << "\n\n";
  char line[320];
  std::snprintf(line, sizeof line, "  %-26s %12s %10s %10s %10s %10s %10s  %s\n", "composition", "min capacity",
                "/ peak", "reserved /", "mapped /", "map calls", "upstream", "replays");
  out << line;
  std::snprintf(line, sizeof line, "  %-26s %12s %10s %10s %10s %10s %10s\n", "", "", "live", "live", "live", "/1k ops",
                "/1k ops");
  out << line;
  for (std::size_t k = 0; k < r.results.size() && k < r.min_capacity.size(); ++k) {
    const replay_result& x = r.results[k];
    const min_capacity_result& m = r.min_capacity[k];
    std::snprintf(line, sizeof line, "  %-26s %12s %10s %10.3f %10s %10s %10.1f  %zu", x.composition.c_str(),
                  m.found ? format_bytes(static_cast<double>(m.capacity)).c_str() : "none",
                  m.found ? format_fixed(m.over_live, 3).c_str() : "-", x.reserved_over_live,
                  x.virtual_memory
                      ? format_fixed(static_cast<double>(x.peak_mapped) /
                                         static_cast<double>(std::max<std::size_t>(r.trace->peak_live_bytes, 1)),
                                     3)
                            .c_str()
                      : "n.a.",
                  map_calls_cell(x).c_str(), per_thousand_ops(x.upstream_calls(), x), m.replays);
    out << line;
    if (m.non_monotone_at != 0)
      out << "  (not monotone: fails at " << format_bytes(static_cast<double>(m.non_monotone_at)) << ")";
    out << '\n';
    if (x.faults != 0) out << "    " << fault_text(x) << '\n';
    if (m.largest_failing != 0 && m.failed_there.event != 0)
      out << "    at " << format_bytes(static_cast<double>(m.largest_failing))
          << ", first failed allocation: " << failed_allocation_text(m.failed_there) << '\n';
  }
  out << '\n';
}

// ---- JSON ---------------------------------------------------------------------------------------------

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += esc;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

/// {"event": ..., "bytes": ..., "in_use": ..., "reserved": ...}, or null when none failed.
inline std::string failed_allocation_json(const failed_allocation& f) {
  if (f.event == 0) return "null";
  return "{\"event\": " + std::to_string(f.event) + ", \"bytes\": " + std::to_string(f.bytes) +
         ", \"in_use\": " + std::to_string(f.in_use) + ", \"reserved\": " + std::to_string(f.reserved) + "}";
}

inline void write_json(std::ostream& out, const std::vector<trace_report>& reports, const report_settings& s) {
  out << "{\n  \"tool\": \"alloy-replay\",\n  \"capacity\": ";
  if (s.capacity == unlimited) {
    out << "null";
  } else {
    out << s.capacity;
  }
  out << ",\n  \"alignment\": " << s.alignment << ",\n  \"repetitions\": " << s.repetitions << ",\n  \"traces\": [";
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const trace_report& r = reports[i];
    const bench::rmm_trace& t = *r.trace;
    out << (i ? "," : "") << "\n    {\n      \"path\": " << json_string(r.path)
        << ",\n      \"name\": " << json_string(display_name(r.path))
        << ",\n      \"format\": " << json_string(t.format)
        << ",\n      \"size_factor\": " << format_factor(t.size_factor) << ",\n      \"events\": " << t.events.size()
        << ",\n      \"allocations\": " << t.allocations << ",\n      \"recorded_failures\": " << t.failures
        << ",\n      \"peak_live_bytes\": " << t.peak_live_bytes << ",\n      \"never_freed\": " << t.unfreed
        << ",\n      \"bad_rows\": " << t.problem_count << ",\n      \"problems\": [";
    for (std::size_t p = 0; p < t.problems.size(); ++p)
      out << (p ? ", " : "") << "{\"line\": " << t.problems[p].line
          << ", \"message\": " << json_string(t.problems[p].message) << "}";
    out << "],\n      \"results\": [";
    for (std::size_t k = 0; k < r.results.size(); ++k) {
      const replay_result& x = r.results[k];
      out << (k ? "," : "") << "\n        {\"composition\": " << json_string(x.composition)
          << ", \"ns_per_op\": " << format_fixed(x.ns_per_op, 2) << ", \"ns_per_op_runs\": [";
      for (std::size_t n = 0; n < x.ns_per_op_runs.size(); ++n)
        out << (n ? ", " : "") << format_fixed(x.ns_per_op_runs[n], 2);
      out << "], \"warm_ns_per_op\": " << format_fixed(x.warm_ns_per_op, 2) << ", \"warm_ns_per_op_runs\": [";
      for (std::size_t n = 0; n < x.warm_ns_per_op_runs.size(); ++n)
        out << (n ? ", " : "") << format_fixed(x.warm_ns_per_op_runs[n], 2);
      out << "], \"operations\": " << x.operations << ", \"requests\": " << x.requests << ", \"served\": " << x.served
          << ", \"failed_requests\": " << x.failed << ", \"peak_in_use\": " << x.peak_in_use
          << ", \"peak_reserved\": " << x.peak_reserved
          << ", \"reserved_over_live\": " << format_fixed(x.reserved_over_live, 4)
          << ", \"end_in_use\": " << x.end_in_use << ", \"end_reserved\": " << x.end_reserved
          << ", \"upstream_allocs\": " << x.upstream_allocs << ", \"upstream_frees\": " << x.upstream_frees
          << ", \"upstream_refusals\": " << x.upstream_refusals << ", \"bytes_moved\": " << x.bytes_moved
          << ", \"leaked\": " << x.leaked << ", \"virtual_memory\": " << (x.virtual_memory ? "true" : "false")
          << ", \"map_calls\": " << x.map_calls
          << ", \"map_calls_per_1000_ops\": " << format_fixed(per_thousand_ops(x.map_calls, x), 3)
          << ", \"upstream_calls_per_1000_ops\": " << format_fixed(per_thousand_ops(x.upstream_calls(), x), 3)
          << ", \"peak_mapped\": " << x.peak_mapped << ", \"faults\": " << x.faults
          << ", \"first_fault\": " << (x.faults != 0 ? json_string(x.first_fault) : std::string("null"))
          << ", \"first_failed_allocation\": " << failed_allocation_json(x.first_failed)
          << ", \"served_all\": " << (x.served_all() ? "true" : "false");
      if (k < r.min_capacity.size()) {
        const min_capacity_result& m = r.min_capacity[k];
        out << ",\n         \"min_capacity\": {\"found\": " << (m.found ? "true" : "false") << ", \"capacity\": ";
        if (m.found) {
          out << m.capacity << ", \"over_peak_live\": " << format_fixed(m.over_live, 4)
              << ", \"map_calls_per_1000_ops\": "
              << format_fixed(per_thousand_ops(m.at_capacity.map_calls, m.at_capacity), 3)
              << ", \"upstream_calls_per_1000_ops\": "
              << format_fixed(per_thousand_ops(m.at_capacity.upstream_calls(), m.at_capacity), 3);
        } else {
          out << "null";
        }
        out << ", \"replays\": " << m.replays << ", \"probes\": [";
        for (std::size_t p = 0; p < m.probes.size(); ++p) out << (p ? ", " : "") << format_fixed(m.probes[p], 3);
        out << "], \"non_monotone_at\": ";
        if (m.non_monotone_at != 0) {
          out << m.non_monotone_at;
        } else {
          out << "null";
        }
        out << ", \"largest_failing_capacity\": "
            << (m.largest_failing != 0 ? std::to_string(m.largest_failing) : std::string("null"))
            << ", \"first_failed_allocation_there\": " << failed_allocation_json(m.failed_there);
        out << '}';
      }
      out << ",\n         \"series\": {\"event\": [";
      for (std::size_t p = 0; p < x.series.size(); ++p) out << (p ? "," : "") << x.series[p].event;
      out << "], \"in_use\": [";
      for (std::size_t p = 0; p < x.series.size(); ++p) out << (p ? "," : "") << x.series[p].in_use;
      out << "], \"reserved\": [";
      for (std::size_t p = 0; p < x.series.size(); ++p) out << (p ? "," : "") << x.series[p].reserved;
      out << "]}}";
    }
    out << "\n      ]\n    }";
  }
  out << "\n  ]\n}\n";
}

// ---- Markdown -------------------------------------------------------------------------------------

/// A ratio cell: "1.035", with the failed requests when there were any.
inline std::string ratio_cell(const replay_result& x) {
  if (x.faults != 0) return "FAULT (" + format_count(x.faults) + ")";
  std::string cell = format_fixed(x.reserved_over_live, 3);
  if (x.failed != 0) cell += " (" + format_count(x.failed) + " failed)";
  return cell;
}

/// The summary table (peak reserved ÷ peak live, one row per trace) and one details table per trace.
inline void write_markdown(std::ostream& out, const std::vector<trace_report>& reports, const report_settings& s) {
  if (reports.empty()) return;
  const std::vector<replay_result>& first = reports.front().results;
  out << "Peak reserved ÷ peak live (device capacity " << format_capacity(s.capacity) << ", alignment " << s.alignment
      << "; failed requests in brackets):\n\n| trace | events | peak live |";
  for (const replay_result& x : first) out << ' ' << x.composition << " |";
  out << "\n|---|---:|---:|";
  for (std::size_t i = 0; i < first.size(); ++i) out << "---:|";
  out << '\n';
  for (const trace_report& r : reports) {
    out << "| " << display_name(r.path) << " | " << format_count(r.trace->events.size()) << " | "
        << format_bytes(static_cast<double>(r.trace->peak_live_bytes)) << " |";
    for (const replay_result& x : r.results) out << ' ' << ratio_cell(x) << " |";
    out << '\n';
  }
  out << "\nEvery figure, per trace (ns/op: median of " << s.repetitions
      << "; upstream calls: device allocations + frees):\n\n";
  for (const trace_report& r : reports) {
    out << "<details><summary>" << display_name(r.path) << "</summary>\n\n"
        << describe_trace(*r.trace)
        << ".\n\n| composition | ns/op | peak in use | peak reserved | reserved ÷ live | upstream calls | map calls | "
           "failed | moved |\n"
        << "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const replay_result& x : r.results) {
      out << "| " << x.composition << " | "
          << (x.ns_per_op_runs.empty() ? std::string("-") : format_fixed(x.ns_per_op, 1)) << " | "
          << format_bytes(static_cast<double>(x.peak_in_use)) << " | "
          << format_bytes(static_cast<double>(x.peak_reserved)) << " | " << format_fixed(x.reserved_over_live, 3)
          << " | " << format_count(x.upstream_calls()) << " | "
          << (x.virtual_memory ? format_count(x.map_calls) : std::string("n.a.")) << " | " << format_count(x.failed)
          << " | " << format_bytes(static_cast<double>(x.bytes_moved)) << " |\n";
    }
    for (const replay_result& x : r.results)
      if (x.faults != 0) out << "\n" << x.composition << ": " << fault_text(x) << '\n';
    out << "\n</details>\n\n";
  }
}

/// The --min-capacity tables: the smallest capacity ÷ peak live per trace and composition (with
/// the geometric mean, the worst and how many traces are within 1.05), the driver calls per 1,000
/// operations and peak reserved ÷ peak live at the base capacity.
inline void write_min_capacity_markdown(std::ostream& out, const std::vector<trace_report>& reports,
                                        const report_settings& s) {
  if (reports.empty()) return;
  const std::vector<replay_result>& first = reports.front().results;
  auto header = [&] {
    out << "| trace | peak live |";
    for (const replay_result& x : first) out << ' ' << x.composition << " |";
    out << "\n|---|---:|";
    for (std::size_t i = 0; i < first.size(); ++i) out << "---:|";
    out << '\n';
  };
  auto row_start = [&](const trace_report& r) {
    out << "| " << display_name(r.path) << " | " << format_bytes(static_cast<double>(r.trace->peak_live_bytes)) << " |";
  };
  out << "Smallest device capacity at which every request is served, ÷ the trace's peak live bytes (to 0.5 %; "
         "virtual compositions on 2 MiB granules; \"none\": not up to 1 PiB; a failed monotonicity probe is marked "
         "*):\n\n";
  header();
  std::vector<double> log_sum(first.size(), 0), worst(first.size(), 0);
  std::vector<std::size_t> count(first.size(), 0), within(first.size(), 0);
  for (const trace_report& r : reports) {
    row_start(r);
    for (std::size_t k = 0; k < r.results.size(); ++k) {
      const min_capacity_result* m = k < r.min_capacity.size() ? &r.min_capacity[k] : nullptr;
      if (m == nullptr || !m->found) {
        out << " none |";
        continue;
      }
      out << ' ' << format_fixed(m->over_live, 3) << (m->non_monotone_at != 0 ? "*" : "") << " |";
      if (k < first.size()) {
        log_sum[k] += std::log(m->over_live);
        worst[k] = std::max(worst[k], m->over_live);
        ++count[k];
        within[k] += m->over_live <= 1.05 ? 1 : 0;
      }
    }
    out << '\n';
  }
  out << "| geometric mean | |";
  for (std::size_t k = 0; k < first.size(); ++k)
    out << ' ' << (count[k] ? format_fixed(std::exp(log_sum[k] / static_cast<double>(count[k])), 3) : std::string("-"))
        << " |";
  out << "\n| worst | |";
  for (std::size_t k = 0; k < first.size(); ++k)
    out << ' ' << (count[k] ? format_fixed(worst[k], 3) : std::string("-")) << " |";
  out << "\n| traces ≤ 1.05 | |";
  for (std::size_t k = 0; k < first.size(); ++k) out << ' ' << within[k] << " / " << reports.size() << " |";
  out << "\n\nDriver calls per 1,000 operations at capacity " << format_capacity(s.capacity)
      << ": map + unmap calls for the virtual compositions (each a driver call of microseconds on a GPU; "
         "creates and releases of physical memory come on top, one each per granule mapped and unmapped), "
         "upstream calls (device allocations + frees) for the others:\n\n";
  header();
  for (const trace_report& r : reports) {
    row_start(r);
    for (const replay_result& x : r.results)
      out << ' ' << format_fixed(per_thousand_ops(x.virtual_memory ? x.map_calls : x.upstream_calls(), x), 1) << " |";
    out << '\n';
  }
  out << "\nPeak reserved ÷ peak live at capacity " << format_capacity(s.capacity)
      << " (virtual compositions: peak physical bytes = peak mapped):\n\n";
  header();
  for (const trace_report& r : reports) {
    row_start(r);
    for (const replay_result& x : r.results) out << ' ' << ratio_cell(x) << " |";
    out << '\n';
  }
  out << '\n';
}

// ---- SVG --------------------------------------------------------------------------------------------

namespace detail {

inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// A round step for about `ticks` ticks over [0, max] bytes: 1, 2, 5, 10, 20, 50, 100, 200 or
/// 500 times B, KiB, MiB, GiB or TiB.
inline double nice_byte_step(double max, int ticks) {
  const double raw = max / ticks;
  double unit = 1;
  while (unit * 1024 <= raw) unit *= 1024;
  for (double m : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0})
    if (m * unit >= raw) return m * unit;
  return 1024 * unit;
}

/// A tick's label in the unit of the step: "1200 MiB" rather than "1.17 GiB".
inline std::string tick_label(double bytes, double step) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double unit = 1;
  while (unit * 1024 <= step && u < 5) unit *= 1024, ++u;
  return format_fixed(bytes / unit, 0) + " " + units[u];
}

/// A round step for about `ticks` ticks over [0, max]: 1, 2 or 5 times a power of 10.
inline double nice_step(double max, int ticks) {
  const double raw = std::max(max / ticks, 1.0);
  double base = 1;
  while (base * 10 <= raw) base *= 10;
  for (double m : {1.0, 2.0, 5.0})
    if (m * base >= raw) return m * base;
  return 10 * base;
}

}  // namespace detail

/// Reserved bytes (solid) of every composition over the trace, and the bytes in use (grey area;
/// a dashed line for a composition that failed requests, whose in-use bytes differ).
inline void write_svg(std::ostream& out, const trace_report& r, const report_settings& s) {
  static const char* const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                        "#b07aa1", "#ff9da7", "#9c755f", "#79706e", "#17becf", "#1f3a93"};
  constexpr std::size_t colours = sizeof palette / sizeof palette[0];
  const double width = 1100, height = 520, left = 80, right = 350, top = 56, bottom = 52;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  const double events = static_cast<double>(std::max<std::size_t>(r.trace->events.size(), 1));
  double ymax = 1;
  for (const replay_result& x : r.results)
    for (const series_point& p : x.series)
      ymax = std::max({ymax, static_cast<double>(p.reserved), static_cast<double>(p.in_use)});
  const bool show_capacity = s.capacity != unlimited && static_cast<double>(s.capacity) <= ymax * 1.25;
  if (show_capacity) ymax = std::max(ymax, static_cast<double>(s.capacity));
  const double step = detail::nice_byte_step(ymax, 6);
  ymax = std::ceil(ymax / step) * step;
  auto px = [&](double event) { return left + plot_w * (event + 1) / events; };
  auto py = [&](double bytes) { return top + plot_h * (1 - bytes / ymax); };
  auto num = [](double v) { return format_fixed(v, 1); };

  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << ' ' << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << left << "\" y=\"22\" font-size=\"15\" font-weight=\"bold\">"
      << detail::xml_escape(display_name(r.path)) << "</text>\n"
      << "<text x=\"" << left
      << "\" y=\"40\" fill=\"#555\">alloy-replay: bytes reserved from the device (lines) and in use "
      << "(grey) over the trace; device capacity " << detail::xml_escape(format_capacity(s.capacity)) << "</text>\n";
  // Grid and axes.
  for (double y = 0; y <= ymax + step / 2; y += step) {
    out << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << num(py(y)) << "\" y2=\"" << num(py(y))
        << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << left - 6 << "\" y=\"" << num(py(y) + 4)
        << "\" text-anchor=\"end\" fill=\"#555\">" << detail::tick_label(y, step) << "</text>\n";
  }
  const double xstep = detail::nice_step(events, 6);
  for (double x = 0; x <= events; x += xstep) {
    out << "<text x=\"" << num(left + plot_w * x / events) << "\" y=\"" << top + plot_h + 18
        << "\" text-anchor=\"middle\" fill=\"#555\">" << format_count(static_cast<std::size_t>(x)) << "</text>\n";
  }
  out << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << height - 12
      << "\" text-anchor=\"middle\" fill=\"#555\">event</text>\n"
      << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\"" << plot_h
      << "\" fill=\"none\" stroke=\"#999\"/>\n";
  if (show_capacity) {
    out << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\""
        << num(py(static_cast<double>(s.capacity))) << "\" y2=\"" << num(py(static_cast<double>(s.capacity)))
        << "\" stroke=\"#d62728\" stroke-dasharray=\"6 4\"/>\n<text x=\"" << left + plot_w - 4 << "\" y=\""
        << num(py(static_cast<double>(s.capacity)) - 5) << "\" text-anchor=\"end\" fill=\"#d62728\">capacity</text>\n";
  }
  // In use: the area of the first composition that served everything (else the first).
  const replay_result* demand = r.results.empty() ? nullptr : &r.results.front();
  for (const replay_result& x : r.results)
    if (x.failed == 0) {
      demand = &x;
      break;
    }
  if (demand != nullptr && !demand->series.empty()) {
    out << "<polygon fill=\"#d9d9d9\" stroke=\"none\" points=\"" << num(px(-1)) << ',' << num(py(0));
    for (const series_point& p : demand->series)
      out << ' ' << num(px(static_cast<double>(p.event))) << ',' << num(py(static_cast<double>(p.in_use)));
    out << ' ' << num(px(static_cast<double>(demand->series.back().event))) << ',' << num(py(0)) << "\"/>\n";
  }
  for (std::size_t k = 0; k < r.results.size(); ++k) {
    const replay_result& x = r.results[k];
    const char* colour = palette[k % colours];
    if (x.failed != 0 && &x != demand) {
      out << "<polyline fill=\"none\" stroke=\"" << colour
          << "\" stroke-width=\"1\" stroke-dasharray=\"4 3\" points=\"";
      for (const series_point& p : x.series)
        out << num(px(static_cast<double>(p.event))) << ',' << num(py(static_cast<double>(p.in_use))) << ' ';
      out << "\"/>\n";
    }
    out << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.6\" points=\"";
    for (const series_point& p : x.series)
      out << num(px(static_cast<double>(p.event))) << ',' << num(py(static_cast<double>(p.reserved))) << ' ';
    out << "\"/>\n";
  }
  // Legend: colour, name, peak reserved ÷ peak live, failures.
  const double lx = left + plot_w + 16;
  double ly = top + 6;
  out << "<text x=\"" << lx << "\" y=\"" << ly << "\" font-weight=\"bold\">reserved ÷ peak live</text>\n";
  ly += 20;
  for (std::size_t k = 0; k < r.results.size(); ++k, ly += 20) {
    const replay_result& x = r.results[k];
    out << "<line x1=\"" << lx << "\" x2=\"" << lx + 22 << "\" y1=\"" << ly - 4 << "\" y2=\"" << ly - 4
        << "\" stroke=\"" << palette[k % colours] << "\" stroke-width=\"3\"/>\n<text x=\"" << lx + 28 << "\" y=\"" << ly
        << "\">" << detail::xml_escape(x.composition) << "  " << format_fixed(x.reserved_over_live, 3);
    if (x.failed != 0) out << ", " << format_count(x.failed) << " failed";
    out << "</text>\n";
  }
  out << "<rect x=\"" << lx << "\" y=\"" << ly - 12 << "\" width=\"22\" height=\"10\" fill=\"#d9d9d9\"/>\n<text x=\""
      << lx + 28 << "\" y=\"" << ly - 2 << "\">in use (peak "
      << format_bytes(static_cast<double>(r.trace->peak_live_bytes)) << ")</text>\n</svg>\n";
}

}  // namespace alloy::replay
