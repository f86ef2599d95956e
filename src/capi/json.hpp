// SPDX-License-Identifier: Apache-2.0
// src/capi/json.hpp: the JSON liballoy writes: flat objects of numbers, and the snapshot in the
// schema of PyTorch's torch.cuda.memory._snapshot().
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <type_traits>
#include <vector>

#include "device_heap.hpp"

namespace alloy::capi {

/// A JSON object written field by field; keys are plain identifiers (nothing to escape).
class json_object {
 public:
  template <class T>
  void add(const std::string& name, T value) {
    text_ += text_.empty() ? "{" : ",";
    text_ += '"' + name + "\":";
    if constexpr (std::is_same_v<T, bool>) {
      text_ += value ? "true" : "false";
    } else if constexpr (std::is_floating_point_v<T>) {
      char number[40];
      std::snprintf(number, sizeof number, "%.17g", static_cast<double>(value));
      text_ += number;
    } else {
      text_ += std::to_string(value);
    }
  }
  void add_raw(const std::string& name, const std::string& json) {
    text_ += text_.empty() ? "{" : ",";
    text_ += '"' + name + "\":" + json;
  }
  void add_string(const std::string& name, const std::string& value) { add_raw(name, '"' + value + '"'); }
  std::string str() const { return text_.empty() ? "{}" : text_ + "}"; }

 private:
  std::string text_;
};

/// Writes every device's segments and history as PyTorch's snapshot: `segments` (each with its
/// blocks, contiguous and summing to the segment's `total_size`) and `device_traces` (one list of
/// events per device, oldest first).
class snapshot_writer {
 public:
  void add_device(int device, const heap_picture& picture, const std::deque<trace_event>& events) {
    for (const memory_snapshot::segment& s : picture.snapshot.segments) {
      if (picture.expandable) {
        add_mapped_runs(device, s);
      } else {
        add_segment(device, s, s.address, s.size, s.blocks);
      }
    }
    std::string trace = "[";
    for (const trace_event& e : events) {
      if (trace.size() > 1) trace += ',';
      json_object entry;
      entry.add_string("action", e.action);
      entry.add("addr", e.addr);
      entry.add("size", e.size);
      entry.add("stream", e.stream);
      entry.add("time_us", e.time_us);
      entry.add_raw("frames", "[]");
      trace += entry.str();
    }
    trace += ']';
    traces_.push_back(std::move(trace));
  }

  std::string str() const {
    std::string out = "{\"segments\":[" + segments_ + "],\"device_traces\":[";
    for (std::size_t i = 0; i < traces_.size(); ++i) out += (i ? "," : "") + traces_[i];
    return out + "]}";
  }

 private:
  using piece = memory_snapshot::piece;

  static bool holds_memory(const piece& p) noexcept {
    return p.state != block_state::unmapped && p.state != block_state::offloaded;
  }

  // A virtual arena is one range of addresses with physical memory mapped here and there: each
  // maximal run of mapped pieces is a segment, as PyTorch shows an expandable segment's mapped
  // part.
  void add_mapped_runs(int device, const memory_snapshot::segment& s) {
    std::vector<piece> run;
    std::uintptr_t start = 0;
    std::size_t size = 0;
    const auto flush = [&] {
      if (!run.empty()) add_segment(device, s, start, size, run, true);
      run.clear();
      size = 0;
    };
    for (const piece& p : s.blocks) {
      if (!holds_memory(p)) {
        flush();
        continue;
      }
      if (run.empty()) start = p.address;
      if (p.address != start + size) {  // a gap the picture did not report: a new run
        flush();
        start = p.address;
      }
      run.push_back(p);
      size += p.size;
    }
    flush();
  }

  // One segment; pieces outside [start, start + size) are dropped and gaps between pieces are
  // written as free blocks, so the blocks always tile the segment.
  void add_segment(int device, const memory_snapshot::segment& s, std::uintptr_t start, std::size_t size,
                   const std::vector<piece>& pieces, bool expandable = false) {
    std::string blocks = "[";
    std::size_t allocated = 0;
    std::size_t requested = 0;
    std::uintptr_t at = start;
    const auto block_json = [&](std::uintptr_t address, std::size_t bytes, std::size_t asked, bool live) {
      if (blocks.size() > 1) blocks += ',';
      json_object b;
      b.add("address", address);
      b.add("size", bytes);
      b.add("requested_size", asked);
      b.add_string("state", live ? "active_allocated" : "inactive");
      b.add_raw("frames", "[]");
      blocks += b.str();
    };
    for (const piece& p : pieces) {
      if (p.address < at || p.address + p.size > start + size || p.size == 0) continue;
      if (p.address > at) block_json(at, p.address - at, 0, false);
      const bool live = holds_memory(p) && p.state != block_state::free;
      block_json(p.address, p.size, live ? p.requested : 0, live);
      if (live) {
        allocated += p.size;
        requested += p.requested;
      }
      at = p.address + p.size;
    }
    if (at < start + size) block_json(at, start + size - at, 0, false);
    blocks += ']';
    json_object seg;
    seg.add("device", device);
    seg.add("address", start);
    seg.add("total_size", size);
    seg.add("allocated_size", allocated);
    seg.add("active_size", allocated);
    seg.add("requested_size", requested);
    seg.add("stream", 0);
    seg.add_string("segment_type", s.pool == "small" ? "small" : "large");
    seg.add_raw("segment_pool_id", "[0,0]");
    seg.add("is_expandable", expandable);
    seg.add_raw("frames", "[]");
    seg.add_raw("blocks", blocks);
    if (!segments_.empty()) segments_ += ',';
    segments_ += seg.str();
  }

  std::string segments_;
  std::vector<std::string> traces_;
};

}  // namespace alloy::capi
