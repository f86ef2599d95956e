// SPDX-License-Identifier: Apache-2.0
// alloy/snapshot.hpp: every segment and block of a composition, as data, JSON and a picture.
//
//   alloy::memory_snapshot snap = alloy::snapshot(alloc);
//   std::ofstream("heap.svg") << snap.to_svg();     // a segment map: fragmentation at a glance
//   std::ofstream("heap.json") << snap.to_json();
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/error.hpp>
#include <alloy/policy/stats.hpp>

namespace alloy {

/// The state of a composition's memory at one moment: its segments in address order, each with
/// its pieces (blocks in use and free pieces) in address order. Built by `alloy::snapshot(a)`.
struct memory_snapshot {
  struct piece {
    std::uintptr_t address = 0;
    std::size_t size = 0;       ///< bytes the piece occupies (after rounding)
    std::size_t requested = 0;  ///< bytes the caller asked for; 0 for free pieces
    block_state state = block_state::free;
  };
  struct segment {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    std::string pool;  ///< "small" or "large" under a segregator; empty otherwise
    std::vector<piece> blocks;

    std::size_t free_bytes() const noexcept {
      std::size_t n = 0;
      for (const piece& p : blocks)
        if (p.state == block_state::free) n += p.size;
      return n;
    }
  };

  std::vector<segment> segments;

  std::size_t reserved_bytes() const noexcept {
    std::size_t n = 0;
    for (const segment& s : segments) {
      n += s.size;
      for (const piece& p : s.blocks)
        if (p.state == block_state::unmapped || p.state == block_state::offloaded)
          n -= p.size;  // no memory: not reserved
    }
    return n;
  }
  std::size_t free_bytes() const noexcept {
    std::size_t n = 0;
    for (const segment& s : segments) n += s.free_bytes();
    return n;
  }
  /// Bytes of pieces in use (rounded sizes).
  std::size_t used_bytes() const noexcept {
    std::size_t n = 0;
    for (const segment& s : segments)
      for (const piece& p : s.blocks)
        if (p.state != block_state::free && p.state != block_state::unmapped && p.state != block_state::offloaded)
          n += p.size;
    return n;
  }
  std::size_t requested_bytes() const noexcept {
    std::size_t n = 0;
    for (const segment& s : segments)
      for (const piece& p : s.blocks) n += p.requested;
    return n;
  }
  std::size_t largest_free_block() const noexcept {
    std::size_t n = 0;
    for (const segment& s : segments)
      for (const piece& p : s.blocks)
        if (p.state == block_state::free) n = std::max(n, p.size);
    return n;
  }
  /// 1 - largest free block / free bytes (0 when nothing is free).
  double fragmentation() const noexcept {
    const std::size_t free = free_bytes();
    return free == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free_block()) / static_cast<double>(free);
  }

  /// `{"totals": {...}, "segments": [{"address": "0x...", "size": n, "pool": "...", "blocks":
  /// [{"address": "0x...", "size": n, "requested": n, "state": s}]}]}`, where `s` is one of free,
  /// allocated, active, inactive, unmapped, offloaded.
  std::string to_json() const;

  /// An SVG segment map: one bar per segment (each drawn full width, its size in the label), its
  /// pieces in address order coloured by state; free space trapped between blocks in use (what
  /// fragmentation is) stands out in red against the grey of wholly free segments; the lighter
  /// end of a block is the rounding beyond the requested size.
  std::string to_svg() const;
};

inline const char* to_string(block_state s) noexcept {
  switch (s) {
    case block_state::free: return "free";
    case block_state::allocated: return "allocated";
    case block_state::active: return "active";
    case block_state::inactive: return "inactive";
    case block_state::unmapped: return "unmapped";
    case block_state::offloaded: return "offloaded";
  }
  return "unknown";
}

namespace detail {

inline std::string hex_address(std::uintptr_t a) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(a));
  return text;
}

template <class A>
void add_snapshot_pieces(const A& a, const char* pool, std::vector<memory_snapshot::segment>& out) {
  a.for_each_block([&](const block_info& info) {
    const auto seg = reinterpret_cast<std::uintptr_t>(info.segment);
    if (out.empty() || out.back().address != seg || out.back().pool != pool)
      out.push_back({seg, info.segment_size, pool, {}});
    out.back().blocks.push_back({reinterpret_cast<std::uintptr_t>(info.ptr), info.size, info.requested, info.state});
  });
}

template <class A>
void take_snapshot(A& a, std::vector<memory_snapshot::segment>& out) {
  if constexpr (requires { a.with_lock([](auto&) {}); }) {
    a.with_lock([&](auto& inner) { take_snapshot(inner, out); });
  } else {
    using T = std::remove_cvref_t<A>;
    constexpr bool pools = any_part<is_segregator, T>();
    if constexpr (pools) {
      using seg_type = first_part_t<all_parts, segregator_match, T>;
      using Small = std::remove_cvref_t<decltype(std::declval<seg_type&>().small())>;
      using Large = std::remove_cvref_t<decltype(std::declval<seg_type&>().large())>;
      if constexpr (introspectable_allocator<Small> && introspectable_allocator<Large>) {
        // Through the lock of a synchronized<> on the way (stats<synchronized<segregator>>).
        with_first_part_locked<all_parts, segregator_match>(a, [&](auto& seg) {
          add_snapshot_pieces(seg.small(), "small", out);
          add_snapshot_pieces(seg.large(), "large", out);
        });
        return;
      }
    }
    if constexpr (introspectable_allocator<T>) add_snapshot_pieces(a, "", out);
  }
}

inline std::string svg_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
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

}  // namespace detail

/// Every segment and block of `a` (which must be introspectable, or contain a `synchronized<>`
/// over an introspectable composition). Under a segregator-shaped part whose sides are
/// introspectable, segments are labelled with their pool.
template <class A>
memory_snapshot snapshot(A& a) {
  memory_snapshot snap;
  detail::take_snapshot(a, snap.segments);
  return snap;
}

inline std::string memory_snapshot::to_json() const {
  std::string out = "{\n  \"totals\": {";
  char frag[32];
  std::snprintf(frag, sizeof frag, "%.6f", fragmentation());
  out += "\"segments\": " + std::to_string(segments.size()) +
         ", \"reserved_bytes\": " + std::to_string(reserved_bytes()) +
         ", \"used_bytes\": " + std::to_string(used_bytes()) +
         ", \"requested_bytes\": " + std::to_string(requested_bytes()) +
         ", \"free_bytes\": " + std::to_string(free_bytes()) +
         ", \"largest_free_block\": " + std::to_string(largest_free_block()) + ", \"fragmentation\": " + frag +
         "},\n  \"segments\": [";
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const segment& s = segments[i];
    out += i == 0 ? "\n" : ",\n";
    out += "    {\"address\": \"" + detail::hex_address(s.address) + "\", \"size\": " + std::to_string(s.size) +
           ", \"pool\": \"" + s.pool + "\", \"blocks\": [";
    for (std::size_t j = 0; j < s.blocks.size(); ++j) {
      const piece& p = s.blocks[j];
      out += j == 0 ? "\n" : ",\n";
      out += "      {\"address\": \"" + detail::hex_address(p.address) + "\", \"size\": " + std::to_string(p.size) +
             ", \"requested\": " + std::to_string(p.requested) + ", \"state\": \"" + to_string(p.state) + "\"}";
    }
    out += s.blocks.empty() ? "]}" : "\n    ]}";
  }
  out += segments.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

inline std::string memory_snapshot::to_svg() const {
  constexpr double width = 960, label_width = 250, bar_x = label_width + 10, bar_width = width - bar_x - 20;
  constexpr double header = 96, row = 26, bar_height = 16;
  const double height = header + row * static_cast<double>(std::max<std::size_t>(segments.size(), 1)) + 20;
  struct colour {
    const char* fill;
    const char* light;
  };
  auto colour_of = [](block_state s, bool trapped) -> colour {
    switch (s) {
      case block_state::allocated: return {"#2f6db5", "#9fbfe6"};
      case block_state::active: return {"#23985a", "#9fdcb9"};
      case block_state::inactive: return {"#d9912a", "#f0cc95"};
      case block_state::unmapped: return {"#ffffff", "#ffffff"};   // addresses only: no memory
      case block_state::offloaded: return {"#b9a6d9", "#e2d9f0"};  // live, on the host or dropped
      case block_state::free: break;
    }
    return trapped ? colour{"#e8514a", "#e8514a"} : colour{"#d5d5d5", "#d5d5d5"};
  };
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
                width, height, width, height);
  out += buf;
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::snprintf(buf, sizeof buf,
                "<text x=\"10\" y=\"22\" font-size=\"16\" font-weight=\"bold\">alloy memory snapshot: %zu "
                "segment%s</text>\n",
                segments.size(), segments.size() == 1 ? "" : "s");
  out += buf;
  std::snprintf(buf, sizeof buf,
                "<text x=\"10\" y=\"42\">reserved %s, in use %s (requested %s), free %s, largest free block %s, "
                "fragmentation %.1f%%</text>\n",
                detail::format_bytes(reserved_bytes()).c_str(), detail::format_bytes(used_bytes()).c_str(),
                detail::format_bytes(requested_bytes()).c_str(), detail::format_bytes(free_bytes()).c_str(),
                detail::format_bytes(largest_free_block()).c_str(), fragmentation() * 100.0);
  out += buf;
  // Legend.
  const std::pair<const char*, const char*> legend[] = {{"#2f6db5", "allocated"},
                                                        {"#9fbfe6", "rounding"},
                                                        {"#23985a", "active (locked)"},
                                                        {"#d9912a", "inactive (unlocked)"},
                                                        {"#e8514a", "free, trapped between blocks"},
                                                        {"#d5d5d5", "free segment"},
                                                        {"#ffffff", "unmapped"}};
  double lx = 10;
  for (const auto& [fill, name] : legend) {
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.1f\" y=\"56\" width=\"14\" height=\"14\" fill=\"%s\" stroke=\"#555\" "
                  "stroke-width=\"0.5\"/><text x=\"%.1f\" y=\"68\">%s</text>\n",
                  lx, fill, lx + 18, name);
    out += buf;
    lx += 18 + 7.0 * static_cast<double>(std::string(name).size()) + 18;
  }
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const segment& s = segments[i];
    const double y = header + row * static_cast<double>(i);
    auto holds_block = [](const piece& p) { return p.state != block_state::free && p.state != block_state::unmapped; };
    const bool used = std::any_of(s.blocks.begin(), s.blocks.end(), holds_block);
    const double free_share = s.size ? 100.0 * static_cast<double>(s.free_bytes()) / static_cast<double>(s.size) : 0;
    const auto in_use = static_cast<std::size_t>(std::count_if(s.blocks.begin(), s.blocks.end(), holds_block));
    std::snprintf(buf, sizeof buf, "<text x=\"10\" y=\"%.1f\">%s%s%s%s: %zu in use, %.0f%% free</text>\n", y + 12.5,
                  s.pool.empty() ? "" : "[", s.pool.c_str(), s.pool.empty() ? "" : "] ",
                  detail::format_bytes(s.size).c_str(), in_use, free_share);
    out += buf;
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"#f4f4f4\" stroke=\"#444\" "
                  "stroke-width=\"0.8\"><title>segment %s, %s</title></rect>\n",
                  bar_x, y, bar_width, bar_height, detail::hex_address(s.address).c_str(),
                  detail::format_bytes(s.size).c_str());
    out += buf;
    if (s.size == 0) continue;
    const double scale = bar_width / static_cast<double>(s.size);
    for (const piece& p : s.blocks) {
      const double x = bar_x + static_cast<double>(p.address - s.address) * scale;
      const double w = std::max(static_cast<double>(p.size) * scale, 0.6);
      const colour c = colour_of(p.state, used);
      const std::string tip = detail::hex_address(p.address) + ": " + to_string(p.state) + ", " +
                              detail::format_bytes(p.size) +
                              (!holds_block(p) ? "" : " (requested " + detail::format_bytes(p.requested) + ")");
      std::snprintf(
          buf, sizeof buf,
          "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s><title>%s</title></rect>\n", x, y,
          w, bar_height, c.fill, w > 3 ? " stroke=\"white\" stroke-width=\"0.6\"" : "",
          detail::svg_escape(tip).c_str());
      out += buf;
      if (holds_block(p) && p.requested < p.size && w > 2) {
        const double rx = x + static_cast<double>(p.requested) * scale;
        const double rw = static_cast<double>(p.size - p.requested) * scale;
        if (rw >= 0.5) {
          std::snprintf(buf, sizeof buf, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/>\n",
                        rx, y + 0.3, rw, bar_height - 0.6, c.light);
          out += buf;
        }
      }
    }
  }
  out += "</svg>\n";
  return out;
}

}  // namespace alloy
