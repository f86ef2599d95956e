// SPDX-License-Identifier: Apache-2.0
// tools/replay/trace_reader.hpp: every input alloy-replay reads, turned into one `rmm_trace`
// (allocate / free / allocate-failure events with allocation numbers; see rmm_trace.hpp).
//
// - RMM log CSV, plain or gzipped (rmm_trace.hpp).
// - MiniMalloc instances: `id,lower,upper,size`, one buffer live over the time steps
//   [lower, upper). Each buffer becomes an allocate at `lower` and a free at `upper`; at equal
//   times frees come before allocations, then buffers in id order (the order of the shipped
//   `*.events.rmm.csv` files). `scale` multiplies every size (those files use 1024). Extra
//   columns (MiniMalloc's optional `alignment`, `gaps`) are ignored.
// - PyTorch snapshot pickles are recognised and refused with the command that converts them
//   (scripts/snapshot-to-rmm-csv): unpickling belongs in Python, with every class refused.
//
// `read_trace` tells the formats apart by the first line. Bad rows follow
// `trace_read_options::on_bad_row`, as in the RMM reader: "FILE:LINE: what".
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "replay/rmm_trace.hpp"

namespace alloy::bench {

struct minimalloc_options {
  std::size_t scale = 1;  ///< every size is multiplied by this
};

/// Parses a MiniMalloc instance (`id,lower,upper,size` header first). `name` is used in messages.
inline rmm_trace parse_minimalloc(std::string_view text, std::string name, const trace_read_options& opts = {},
                                  minimalloc_options mm = {}) {
  rmm_trace trace;
  trace.name = std::move(name);
  trace.format = "minimalloc";
  struct buffer {
    std::uint64_t id, lower, upper;
    std::size_t size;
  };
  std::vector<buffer> buffers;
  std::unordered_set<std::uint64_t> ids;
  int column[4] = {-1, -1, -1, -1};  // id, lower, upper, size -> column index
  std::size_t columns = 0;
  bool header_seen = false;
  trace.lines = detail::for_each_line(text, [&](std::size_t line_number, std::string_view line, bool unterminated) {
    if (!header_seen) {
      std::string_view field[16];
      columns = detail::split_fields(line, field, 16);
      static constexpr std::string_view names[4] = {"id", "lower", "upper", "size"};
      for (std::size_t c = 0; c < std::min<std::size_t>(columns, 16); ++c)
        for (int k = 0; k < 4; ++k)
          if (field[c] == names[k]) column[k] = static_cast<int>(c);
      if (std::count(std::begin(column), std::end(column), -1) != 0)
        detail::trace_error(trace.name, line_number, "expected a MiniMalloc header with columns id,lower,upper,size");
      header_seen = true;
      return;
    }
    try {
      std::string_view field[16];
      const std::size_t count = detail::split_fields(line, field, 16);
      if (count != columns)
        throw detail::bad_row{"expected " + std::to_string(columns) + " fields, found " + std::to_string(count)};
      buffer b{};
      b.id = detail::parse_unsigned(field[column[0]], 10, "id");
      b.lower = detail::parse_unsigned(field[column[1]], 10, "lower");
      b.upper = detail::parse_unsigned(field[column[2]], 10, "upper");
      const std::uint64_t size = detail::parse_unsigned(field[column[3]], 10, "size");
      if (mm.scale != 0 && size > std::numeric_limits<std::size_t>::max() / mm.scale)
        throw detail::bad_row{"size times the scale is out of range"};
      b.size = static_cast<std::size_t>(size) * mm.scale;
      if (b.lower >= b.upper)
        throw detail::bad_row{"empty lifetime: lower " + std::to_string(b.lower) + " is not below upper " +
                              std::to_string(b.upper)};
      if (!ids.insert(b.id).second) throw detail::bad_row{"duplicate id " + std::to_string(b.id)};
      buffers.push_back(b);
    } catch (const detail::bad_row& bad) {
      std::string message = bad.message;
      if (unterminated) message = "truncated row (the file ends in the middle of it): " + message;
      detail::trace_problem_found(trace, opts, line_number, std::move(message));
    }
  });
  if (!header_seen) detail::trace_error(trace.name, trace.lines, "empty file (no header)");

  // Events in time order; at equal times frees first, then by id.
  struct point {
    std::uint64_t time;
    bool allocate;
    std::uint64_t id;
    std::size_t index;
  };
  std::vector<point> points;
  points.reserve(buffers.size() * 2);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    points.push_back({buffers[i].lower, true, buffers[i].id, i});
    points.push_back({buffers[i].upper, false, buffers[i].id, i});
  }
  std::sort(points.begin(), points.end(), [](const point& a, const point& b) {
    return std::tie(a.time, a.allocate, a.id) < std::tie(b.time, b.allocate, b.id);
  });
  std::vector<std::size_t> number(buffers.size());
  std::size_t live = 0;
  trace.events.reserve(points.size());
  for (const point& p : points) {
    trace_event e;
    e.thread = 1;
    e.size = buffers[p.index].size;
    if (p.allocate) {
      e.action = trace_action::allocate;
      e.allocation = number[p.index] = trace.allocations++;
      live += e.size;
      trace.peak_live_bytes = std::max(trace.peak_live_bytes, live);
    } else {
      e.action = trace_action::free;
      e.allocation = number[p.index];
      live -= e.size;
    }
    trace.events.push_back(e);
  }
  return trace;
}

/// What a file holds, from its first bytes.
enum class trace_format : std::uint8_t { rmm, minimalloc, pytorch_pickle, unknown };

inline trace_format detect_format(std::string_view text) {
  if (!text.empty() && static_cast<unsigned char>(text[0]) == 0x80) return trace_format::pytorch_pickle;
  const std::size_t end = text.find_first_of("\r\n");
  const std::string_view first = text.substr(0, end);
  if (first == "Thread,Time,Action,Pointer,Size,Stream") return trace_format::rmm;
  if (first.starts_with("id,") || first.find(",lower,") != std::string_view::npos) return trace_format::minimalloc;
  return trace_format::unknown;
}

/// Reads any supported trace file ("-" = standard input), telling the format from its first line.
inline rmm_trace read_trace(const std::string& path, const trace_read_options& opts = {}, minimalloc_options mm = {}) {
  std::vector<trace_problem> early;
  const std::string text = read_trace_text(path, opts, [&](trace_problem p) { early.push_back(std::move(p)); });
  rmm_trace trace;
  switch (detect_format(text)) {
    case trace_format::rmm: trace = parse_rmm_trace(text, path, opts); break;
    case trace_format::minimalloc: trace = parse_minimalloc(text, path, opts, mm); break;
    case trace_format::pytorch_pickle:
      throw std::runtime_error(path +
                               ": a Python pickle (a PyTorch memory snapshot?); convert it first with "
                               "snapshot-to-rmm-csv (scripts/snapshot-to-rmm-csv in alloy's source, installed "
                               "beside alloy-replay):\n  snapshot-to-rmm-csv " +
                               path + " | alloy-replay [options] -");
    case trace_format::unknown:
      if (text.empty()) throw std::runtime_error(describe(path, {0, "empty file (no header)"}));
      throw std::runtime_error(
          describe(path, {1,
                          "unknown format: expected RMM's header Thread,Time,Action,Pointer,Size,Stream or "
                          "MiniMalloc's id,lower,upper,size"}));
  }
  for (trace_problem& p : early) {
    if (opts.report) opts.report(path, p);
    ++trace.problem_count;
    trace.problems.push_back(std::move(p));
  }
  return trace;
}

/// Multiplies every size of `trace` by `factor` (rounded down, at least one byte) and recomputes
/// its peak live bytes: the same order and lifetimes with another model's tensor sizes, so that a
/// figure can be checked on traces nobody tuned it to (`alloy-replay --resize`). Equal sizes stay
/// equal, so each free still names its allocation's size. Throws `std::invalid_argument` for a
/// factor that is not a positive finite number and `std::out_of_range` when a size or the live
/// bytes would pass 2^62, the trace then unchanged.
inline void resize_trace(rmm_trace& trace, double factor) {
  if (!(factor > 0) || !std::isfinite(factor))
    throw std::invalid_argument("resize_trace: the factor must be a positive finite number");
  constexpr long double limit = 0x1p62L;
  const auto resized = [factor](std::size_t bytes) {
    const long double r = std::floor(static_cast<long double>(bytes) * static_cast<long double>(factor));
    if (r >= limit) throw std::out_of_range("resize_trace: a size times the factor passes 2^62 bytes");
    return std::max<std::size_t>(1, static_cast<std::size_t>(r));
  };
  std::vector<trace_event> events = trace.events;
  std::vector<std::size_t> sizes(trace.allocations);
  std::size_t live = 0, peak = 0;
  for (trace_event& e : events) {
    e.size = resized(e.size);
    if (e.action == trace_action::allocate) {
      sizes[e.allocation] = e.size;
      live += e.size;
      if (static_cast<long double>(live) >= limit)
        throw std::out_of_range("resize_trace: the live bytes pass 2^62 bytes");
      peak = std::max(peak, live);
    } else if (e.action == trace_action::free) {
      live -= sizes[e.allocation];
    }
  }
  trace.events = std::move(events);
  trace.peak_live_bytes = peak;
  trace.size_factor *= factor;
}

}  // namespace alloy::bench
