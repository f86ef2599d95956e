// SPDX-License-Identifier: Apache-2.0
// src/capi/device_heap.hpp: one device's allocator in liballoy, behind a small virtual interface so
// the C entry points need not know which composition or backend serves the device.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <alloy/alloy.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/showcase.hpp>
#include <alloy/snapshot.hpp>

#include "capture_pools.hpp"
#include "config.hpp"

namespace alloy::capi {

/// One entry of a device's allocation history, as PyTorch's snapshot `device_traces` hold them.
/// `action` is one of alloc, free_requested, free_completed, segment_alloc, segment_free,
/// segment_map, segment_unmap, oom. Sizes of alloc and free events are the bytes asked for.
struct trace_event {
  const char* action = "";
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
  std::int64_t time_us = 0;
  std::size_t device_free = 0;  ///< oom events: device memory free at the failure
};

/// The last `keep` events of one device (none when `keep` is 0; `keep` may change at any time).
/// Thread-safe (a source may write from a planned growth made outside the device's lock).
class history {
 public:
  explicit history(std::size_t keep) : keep_(keep) {}
  /// From now on keeps the last `n` events: the oldest beyond them are dropped at once (all for 0).
  void keep(std::size_t n) noexcept {
    std::lock_guard guard(lock_);
    keep_.store(n, std::memory_order_relaxed);
    if (n == 0) {
      events_.clear();  // no allocation: a new, empty deque would make one
    } else {
      while (events_.size() > n) events_.pop_front();
    }
  }
  /// Inline up to the test of `keep`, so that with history off an event costs a load, no call.
  void add(const char* action, std::uintptr_t addr, std::size_t size, std::uintptr_t stream,
           std::size_t device_free = 0) noexcept {
    if (keep_.load(std::memory_order_relaxed) != 0) [[unlikely]]
      add_kept(action, addr, size, stream, device_free);
  }
  /// A copy of the events, oldest first.
  std::deque<trace_event> events() const {
    std::lock_guard guard(lock_);
    return events_;
  }

 private:
  [[gnu::noinline]] void add_kept(const char* action, std::uintptr_t addr, std::size_t size, std::uintptr_t stream,
                                  std::size_t device_free) noexcept {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const std::int64_t time_us = std::chrono::duration_cast<std::chrono::microseconds>(now).count();
    std::lock_guard guard(lock_);
    const std::size_t keep = keep_.load(std::memory_order_relaxed);
    if (keep == 0) return;
    try {
      while (events_.size() >= keep) events_.pop_front();
      events_.push_back({action, addr, size, stream, time_us, device_free});
    } catch (...) {
      // History is best effort: a host allocation failure drops the event, never the request.
    }
  }

  std::atomic<std::size_t> keep_;  // written under lock_, read without it to skip a call when 0
  mutable std::mutex lock_;
  std::deque<trace_event> events_;
};

/// What the memory sources of one device share: the limit on device memory (PyTorch's memory
/// fraction, or the `capacity` key), the bytes taken from the device, and the history, into
/// which the sources write segment events. The heap's calls run under the device's lock; the
/// counts are atomic so that an upstream call made outside it stays exact.
struct device_state {
  std::atomic<std::size_t> limit{std::numeric_limits<std::size_t>::max()};
  std::atomic<std::size_t> taken{0};      ///< bytes of device memory taken (segments, or physical memory)
  std::atomic<std::uintptr_t> stream{0};  ///< the stream of the call in progress, for segment events
  history events;

  explicit device_state(std::size_t keep) : events(keep) {}
  bool fits(std::size_t bytes) const noexcept {
    const std::size_t cap = limit.load(std::memory_order_relaxed);
    return bytes <= cap && taken.load(std::memory_order_relaxed) <= cap - bytes;
  }
  /// Counts `bytes` as taken if they fit under the limit (false, nothing counted, if not).
  bool take(std::size_t bytes) noexcept {
    const std::size_t cap = limit.load(std::memory_order_relaxed);
    std::size_t now = taken.load(std::memory_order_relaxed);
    do {
      if (bytes > cap || now > cap - bytes) return false;
    } while (!taken.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
    return true;
  }
  void give(std::size_t bytes) noexcept { taken.fetch_sub(bytes, std::memory_order_relaxed); }
};

/// An upstream that takes from `Upstream` no more than the device's limit and writes
/// segment_alloc / segment_free events. Thread-safe when `Upstream` is, so that the compositions
/// over it can plan their growth (`growth_planning_allocator`), which `stream_ordered` needs to
/// serve a CUDA graph's capture from what is cached.
template <class Upstream>
class capped_upstream {
 public:
  static constexpr bool host_accessible = Upstream::host_accessible;
  static constexpr bool device_accessible = Upstream::device_accessible;
  static constexpr bool thread_safe = thread_safe_upstream<Upstream>;

  explicit capped_upstream(device_state* state) noexcept : state_(state) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!state_->take(bytes)) return {};
    const block b = upstream_.allocate(bytes, alignment);
    if (!b) {
      state_->give(bytes);
      return {};
    }
    state_->events.add("segment_alloc", reinterpret_cast<std::uintptr_t>(b.ptr), bytes,
                       state_->stream.load(std::memory_order_relaxed));
    return b;
  }
  void deallocate(block b) noexcept {
    state_->events.add("segment_free", reinterpret_cast<std::uintptr_t>(b.ptr), b.size,
                       state_->stream.load(std::memory_order_relaxed));
    upstream_.deallocate(b);
    state_->give(b.size);
  }
  friend bool operator==(const capped_upstream& a, const capped_upstream& b) noexcept { return a.state_ == b.state_; }

 private:
  Upstream upstream_{};
  device_state* state_;
};

/// A virtual-memory backend that creates no more physical memory than the device's limit and
/// writes segment_map / segment_unmap events; the backend itself is owned by the heap.
template <class Vmm>
class capped_vmm {
 public:
  static constexpr bool host_accessible = Vmm::host_accessible;
  static constexpr bool device_accessible = Vmm::device_accessible;

  capped_vmm(Vmm* vmm, device_state* state) noexcept : vmm_(vmm), state_(state) {}

  std::size_t granularity() const noexcept { return vmm_->granularity(); }
  address_range reserve(std::size_t bytes) noexcept { return vmm_->reserve(bytes); }
  void unreserve(address_range range) noexcept { vmm_->unreserve(range); }
  physical_memory create(std::size_t bytes) noexcept {
    if (!state_->take(bytes)) return {};
    const physical_memory piece = vmm_->create(bytes);
    if (!piece) {
      state_->give(bytes);
    } else if (piece.size != bytes) {
      piece.size > bytes ? (void)state_->taken.fetch_add(piece.size - bytes) : state_->give(bytes - piece.size);
    }
    return piece;
  }
  void release(physical_memory piece) noexcept {
    vmm_->release(piece);
    state_->give(piece.size);
  }
  bool map(void* at, physical_memory piece) noexcept {
    const bool mapped = vmm_->map(at, piece);
    if (mapped)
      state_->events.add("segment_map", reinterpret_cast<std::uintptr_t>(at), piece.size,
                         state_->stream.load(std::memory_order_relaxed));
    return mapped;
  }
  void unmap(void* at, std::size_t bytes) noexcept {
    state_->events.add("segment_unmap", reinterpret_cast<std::uintptr_t>(at), bytes,
                       state_->stream.load(std::memory_order_relaxed));
    vmm_->unmap(at, bytes);
  }
  std::size_t capacity() const noexcept { return std::min(vmm_->capacity(), state_->limit.load()); }
  std::size_t physical_bytes() const noexcept { return vmm_->physical_bytes(); }

 private:
  Vmm* vmm_;
  device_state* state_;
};

/// A segment of a snapshot in PyTorch's terms: `expandable` for the mapped runs of a virtual arena.
struct heap_picture {
  memory_snapshot snapshot;
  bool expandable = false;
};

/// One device's allocator. Not thread-safe: the library calls it under the device's lock.
class device_heap {
 public:
  virtual ~device_heap() = default;
  /// `stream` is an opaque stream handle (a `cudaStream_t` on the CUDA backend).
  virtual block allocate(std::size_t bytes, void* stream) noexcept = 0;
  /// False when the composition refused the free as misuse.
  virtual bool deallocate(block b, void* stream) noexcept = 0;
  virtual void record_use(block b, void* stream) noexcept = 0;
  virtual void release() noexcept = 0;
  virtual std::map<std::string, std::int64_t> memory_stats() = 0;
  virtual alloy::statistics statistics() = 0;
  virtual std::string summary() = 0;
  virtual heap_picture picture() = 0;
  virtual void reset_peak() noexcept = 0;
  virtual void reset_accumulated() noexcept = 0;
  virtual oom_report explain(std::size_t bytes) = 0;
  /// Gives back the private pools of the CUDA graphs captured through this heap whose captures
  /// have ended (`capture_pools`); none on a backend whose streams cannot capture.
  virtual void release_graph_pools() noexcept = 0;
  /// Private pools kept for captured graphs, and their bytes (live and free).
  virtual graph_pool_figures graph_pools() const noexcept = 0;

  device_state& state() noexcept { return state_; }

 protected:
  device_heap(std::size_t keep, std::size_t limit) : state_(keep) { state_.limit = limit; }
  device_state state_;
};

/// The requests liballoy serves all get this alignment (what `cudaMalloc` guarantees).
inline constexpr std::size_t request_alignment = 256;

/// A heap whose sources own nothing (upstreams that hold no state of their own).
struct no_backend {
  explicit no_backend(std::size_t /*limit*/) noexcept {}
};

/// `device_heap` over the composition `stats<stream_ordered<Heap, Stream>>`. `Backend` is what the
/// heap's sources refer to and the heap owns (a virtual-memory backend), built from the limit;
/// `make(state, backend)` builds the heap, whose sources point into both.
template <class Heap, class Stream, class Backend = no_backend>
class heap_of final : public device_heap {
 public:
  using composition = stats<stream_ordered<Heap, Stream>>;

  template <class Make>
  heap_of(std::size_t keep, std::size_t limit, bool expandable, Make&& make)
      : device_heap(keep, limit),
        expandable_(expandable),
        backend_(limit),
        alloc_(stream_ordered<Heap, Stream>{make(&state_, &backend_)}) {}

  block allocate(std::size_t bytes, void* stream) noexcept override {
    graph_pools_.route(alloc_, to_stream(stream));
    return alloc_.allocate(bytes, request_alignment, to_stream(stream));
  }
  bool deallocate(block b, void* stream) noexcept override { return alloc_.try_deallocate(b, to_stream(stream)); }
  void record_use(block b, void* stream) noexcept override {
    try {
      alloy::record_use(alloc_, b, to_stream(stream));
    } catch (...) {
      // record_use needs host memory for its list of streams; without it nothing is recorded,
      // which is what PyTorch does when it cannot grow its own (the caller synchronizes).
    }
  }
  void release() noexcept override { alloc_.release(); }
  // PyTorch's key list exactly: the `stats<>` part's map, without `alloy::memory_stats`'s graph-pool
  // keys (the pools are in the statistics JSON: `graph_pools`, ...).
  std::map<std::string, std::int64_t> memory_stats() override {
    return detail::with_stats(alloc_, [](auto& s) { return detail::memory_stats_of(s); });
  }
  alloy::statistics statistics() override { return alloc_.statistics(); }
  std::string summary() override { return alloy::memory_summary(alloc_); }
  heap_picture picture() override {
    // The virtual composition's picture is its arena's, each slab shown as the pool's blocks.
    return {alloy::snapshot(alloc_), expandable_};
  }
  void reset_peak() noexcept override { alloc_.reset_peak(); }
  void reset_accumulated() noexcept override { alloc_.reset_accumulated(); }
  oom_report explain(std::size_t bytes) override { return detail::make_oom_report(alloc_, bytes, request_alignment); }
  void release_graph_pools() noexcept override { graph_pools_.release_closed(alloc_); }
  graph_pool_figures graph_pools() const noexcept override {
    if constexpr (graph_pooling_allocator<composition, Stream>) {
      graph_pool_figures f = alloc_.pool_figures();
      f.pools = graph_pools_.size();
      return f;
    } else {
      return {};
    }
  }

 private:
  static Stream to_stream(void* stream) noexcept {
    if constexpr (std::is_pointer_v<Stream>) {
      return static_cast<Stream>(stream);
    } else {
      return Stream{stream};
    }
  }

  bool expandable_;
  Backend backend_;                                 // before alloc_: the heap refers to it until its end
  capture_pools<composition, Stream> graph_pools_;  // before alloc_: it names the pools by address
  composition alloc_;
};

/// Builds one device's heap for the configuration (`device` is the CUDA ordinal or the simulated
/// device's index). Null when the backend cannot serve the device; `why` then says why.
std::unique_ptr<device_heap> make_host_heap(const config& c, int device, std::size_t limit);
std::unique_ptr<device_heap> make_cuda_heap(const config& c, int device, std::size_t limit, std::string& why);

}  // namespace alloy::capi
