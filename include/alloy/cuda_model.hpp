// SPDX-License-Identifier: Apache-2.0
// alloy/cuda_model.hpp: a host model of the CUDA runtime calls alloy makes, with stream capture.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <alloy/block.hpp>
#include <alloy/stream.hpp>
#include <alloy/vmm/virtual_memory.hpp>

namespace alloy::cuda_model {

/// CUDA's error codes for the calls the model answers (the values of `cudaError_t`).
enum class error : int {
  success = 0,
  invalid_value = 1,
  memory_allocation = 2,
  invalid_device = 101,
  invalid_resource_handle = 400,
  illegal_state = 401,
  not_ready = 600,
  stream_capture_unsupported = 900,
  stream_capture_invalidated = 901,
  stream_capture_merge = 902,
  stream_capture_unmatched = 903,
  stream_capture_unjoined = 904,
  stream_capture_isolation = 905,
  captured_event = 907,
  stream_capture_wrong_thread = 908,
};

/// `cudaEventWaitExternal`.
inline constexpr unsigned wait_external_flag = 1;

class runtime;

/// Handles, as `cudaStream_t`, `cudaEvent_t` and `cudaGraphExec_t` are: values naming an object
/// of a `runtime`. A default-constructed event is "not created yet" (see `stream_traits`).
struct stream_t {
  runtime* rt = nullptr;
  std::uint32_t id = 0;
  friend bool operator==(const stream_t&, const stream_t&) = default;
};
struct event_t {
  runtime* rt = nullptr;
  std::uint32_t id = 0;
};
struct graph_t {
  runtime* rt = nullptr;
  std::uint32_t id = 0;
  explicit operator bool() const noexcept { return rt != nullptr; }
};

/// One call the model found illegal (or a use of memory it must not see used).
struct violation {
  std::string call;
  error code = error::success;
  std::string why;
};

/// `runtime`: devices, streams, events, stream capture and memory, answering each call as the
/// CUDA runtime documents it, so that code written against CUDA's rules is tested on the host.
///
/// - Work: `use(s, p, n)` enqueues a kernel on `s` touching `[p, p + n)`; the device runs nothing
///   until `run(s)` / `run_all()` (or a synchronization) says so, honouring stream waits, so tests
///   choose when work finishes. Events mark positions in a stream.
/// - Capture: `begin_capture(s, mode)` (ids from 1; modes and the prohibition of "unsafe" calls
///   as CUDA documents them, per calling thread with `exchange_capture_mode`), streams joined by
///   waiting on a captured event, `end_capture` giving a graph, or `stream_capture_invalidated`,
///   `_unjoined`, `_unmatched`, `_wrong_thread`. Forbidden: querying or synchronizing a capturing
///   stream or a captured event (the capture is invalidated), unsafe calls (`malloc`, `free`, the
///   event and stream queries and synchronizations, the vmm calls) while a capture prohibits
///   them, a captured wait on an event from outside without `wait_external_flag` (isolation),
///   merging captures. A graph remembers the memory its kernels touch; launching it uses it.
/// - Every illegal call is recorded (`violations()`), and so is memory misuse the model sees:
///   work outside graphs touching memory a live graph uses, memory of a live graph freed or
///   unmapped, work touching memory not allocated, handles of another device or destroyed.
/// - Thread safety: every call may be made from any thread (one lock). No globals: a test owns
///   its runtime, and handles point to it.
class runtime {
 public:
  explicit runtime(int devices = 1, std::size_t memory_per_device = std::size_t{1} << 30)
      : devices_(static_cast<std::size_t>(devices), device_state{memory_per_device, 0}) {
    streams_.push_back({});  // id 0: not a stream
    events_.push_back({});
    graphs_.push_back({});
  }
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;
  ~runtime() {
    for (auto& [at, a] : allocations_) ::operator delete(reinterpret_cast<void*>(at), std::align_val_t{256});
    for (auto& [at, r] : reservations_) ::operator delete(reinterpret_cast<void*>(at), std::align_val_t{granularity});
  }

  static constexpr std::size_t granularity = std::size_t{2} << 20;

  // ---- devices -----------------------------------------------------------------------------------
  error get_device(int* d) {
    std::lock_guard lock(mutex_);
    *d = me().device;
    return error::success;
  }
  error set_device(int d) {
    std::lock_guard lock(mutex_);
    if (d < 0 || static_cast<std::size_t>(d) >= devices_.size())
      return fail("cudaSetDevice", error::invalid_device, "no such device");
    me().device = d;
    return error::success;
  }
  /// `cudaThreadExchangeStreamCaptureMode`.
  error exchange_capture_mode(capture_mode* mode) {
    std::lock_guard lock(mutex_);
    std::swap(me().mode, *mode);
    return error::success;
  }

  // ---- streams and events ------------------------------------------------------------------------
  error stream_create(stream_t* s) {
    std::lock_guard lock(mutex_);
    streams_.push_back({});
    streams_.back().device = me().device;
    *s = {this, static_cast<std::uint32_t>(streams_.size() - 1)};
    return error::success;
  }
  error stream_destroy(stream_t s) {
    std::lock_guard lock(mutex_);
    stream_state* st = find(s, "cudaStreamDestroy");
    if (st == nullptr) return error::invalid_resource_handle;
    run_to(s.id, st->tail);
    st->destroyed = true;
    return error::success;
  }
  error stream_query(stream_t s) {
    std::lock_guard lock(mutex_);
    stream_state* st = find(s, "cudaStreamQuery");
    if (st == nullptr) return error::invalid_resource_handle;
    if (st->capture != 0)
      return invalidate(st->capture, "cudaStreamQuery", error::stream_capture_unsupported, "the stream is capturing");
    if (const error e = unsafe("cudaStreamQuery"); e != error::success) return e;
    return st->done >= st->tail ? error::success : error::not_ready;
  }
  error stream_synchronize(stream_t s) {
    std::lock_guard lock(mutex_);
    stream_state* st = find(s, "cudaStreamSynchronize");
    if (st == nullptr) return error::invalid_resource_handle;
    if (st->capture != 0)
      return invalidate(st->capture, "cudaStreamSynchronize", error::stream_capture_unsupported,
                        "the stream is capturing");
    if (const error e = unsafe("cudaStreamSynchronize"); e != error::success) return e;
    ++synchronizations_;
    run_to(s.id, st->tail);
    return error::success;
  }
  error device_synchronize() {
    std::lock_guard lock(mutex_);
    for (const unsigned long long id : active_captures_) {
      if (const capture_state_& c = captures_[id]; c.device == me().device)
        return invalidate(id, "cudaDeviceSynchronize", error::stream_capture_unsupported,
                          "a stream of the device is capturing");
    }
    if (const error e = unsafe("cudaDeviceSynchronize"); e != error::success) return e;
    ++synchronizations_;
    for (std::uint32_t i = 1; i < streams_.size(); ++i) {
      if (streams_[i].device == me().device) run_to(i, streams_[i].tail);
    }
    return error::success;
  }
  error event_create(event_t* e) {
    std::lock_guard lock(mutex_);
    events_.push_back({});
    events_.back().device = me().device;
    *e = {this, static_cast<std::uint32_t>(events_.size() - 1)};
    return error::success;
  }
  error event_destroy(event_t e) {
    std::lock_guard lock(mutex_);
    event_state* ev = find(e, "cudaEventDestroy");
    if (ev == nullptr) return error::invalid_resource_handle;
    ev->destroyed = true;
    return error::success;
  }
  error event_record(event_t e, stream_t s) {
    std::lock_guard lock(mutex_);
    event_state* ev = find(e, "cudaEventRecord");
    stream_state* st = find(s, "cudaEventRecord");
    if (ev == nullptr || st == nullptr) return error::invalid_resource_handle;
    if (ev->device != st->device)
      return fail("cudaEventRecord", error::invalid_resource_handle, "event and stream on different devices");
    if (st->capture != 0) {
      ev->capture = st->capture;
      ev->clock = st->clock;
      ev->clock[s.id] = st->ops;
      return error::success;
    }
    ev->capture = 0;
    ev->recorded = true;
    ev->stream = s.id;
    ev->position = st->tail;
    return error::success;
  }
  error event_query(event_t e) {
    std::lock_guard lock(mutex_);
    event_state* ev = find(e, "cudaEventQuery");
    if (ev == nullptr) return error::invalid_resource_handle;
    if (const error c = captured(*ev, "cudaEventQuery"); c != error::success) return c;
    if (const error u = unsafe("cudaEventQuery"); u != error::success) return u;
    ++queries_;
    return !ev->recorded || streams_[ev->stream].done >= ev->position ? error::success : error::not_ready;
  }
  error event_synchronize(event_t e) {
    std::lock_guard lock(mutex_);
    event_state* ev = find(e, "cudaEventSynchronize");
    if (ev == nullptr) return error::invalid_resource_handle;
    if (const error c = captured(*ev, "cudaEventSynchronize"); c != error::success) return c;
    if (const error u = unsafe("cudaEventSynchronize"); u != error::success) return u;
    ++synchronizations_;
    if (ev->recorded) run_to(ev->stream, ev->position);
    return error::success;
  }
  /// `cudaStreamWaitEvent(s, e, flags)`.
  error stream_wait_event(stream_t s, event_t e, unsigned flags) {
    std::lock_guard lock(mutex_);
    event_state* ev = find(e, "cudaStreamWaitEvent");
    stream_state* st = find(s, "cudaStreamWaitEvent");
    if (ev == nullptr || st == nullptr) return error::invalid_resource_handle;
    const bool event_captured = ev->capture != 0 && captures_[ev->capture].active;
    if (st->capture != 0) {
      if (event_captured && ev->capture != st->capture) {
        invalidate(ev->capture, "cudaStreamWaitEvent", error::stream_capture_merge, "");
        return invalidate(st->capture, "cudaStreamWaitEvent", error::stream_capture_merge,
                          "the wait would merge two captures");
      }
      if (event_captured) {
        for (auto& [stream, ops] : ev->clock) st->clock[stream] = std::max(st->clock[stream], ops);
        ++st->ops;
        return error::success;
      }
      if ((flags & wait_external_flag) == 0 && ev->recorded) {
        return invalidate(st->capture, "cudaStreamWaitEvent", error::stream_capture_isolation,
                          "a captured wait on an event from outside the capture without cudaEventWaitExternal");
      }
      ++st->ops;
      ++external_waits_;
      return error::success;
    }
    if (event_captured) {  // joins the capture
      capture_state_& c = captures_[ev->capture];
      st->capture = ev->capture;
      st->clock = ev->clock;
      st->ops = 1;
      c.streams.push_back(s.id);
      return error::success;
    }
    if (ev->recorded) st->waits.push_back({st->tail, ev->stream, ev->position});
    return error::success;
  }

  // ---- capture -----------------------------------------------------------------------------------
  error begin_capture(stream_t s, capture_mode mode) {
    std::lock_guard lock(mutex_);
    stream_state* st = find(s, "cudaStreamBeginCapture");
    if (st == nullptr) return error::invalid_resource_handle;
    if (st->capture != 0)
      return fail("cudaStreamBeginCapture", error::illegal_state, "the stream is already capturing");
    const unsigned long long id = next_capture_++;
    capture_state_& c = captures_[id];
    c.active = true;
    active_captures_.insert(id);
    c.mode = mode;
    c.origin = s.id;
    c.device = st->device;
    c.thread = std::this_thread::get_id();
    c.streams.push_back(s.id);
    st->capture = id;
    st->clock.clear();
    st->ops = 0;
    return error::success;
  }
  /// `cudaStreamEndCapture` (and instantiation: the graph returned can be launched).
  error end_capture(stream_t s, graph_t* g) {
    std::lock_guard lock(mutex_);
    *g = {};
    stream_state* st = find(s, "cudaStreamEndCapture");
    if (st == nullptr) return error::invalid_resource_handle;
    if (st->capture == 0) return fail("cudaStreamEndCapture", error::illegal_state, "the stream is not capturing");
    const unsigned long long id = st->capture;
    capture_state_& c = captures_[id];
    if (c.origin != s.id)
      return invalidate(id, "cudaStreamEndCapture", error::stream_capture_unmatched,
                        "not the stream the capture began on");
    if (c.mode != capture_mode::relaxed && c.thread != std::this_thread::get_id()) {
      return invalidate(id, "cudaStreamEndCapture", error::stream_capture_wrong_thread, "");
    }
    error result = c.invalidated ? error::stream_capture_invalidated : error::success;
    for (const std::uint32_t other : c.streams) {
      if (other != s.id && streams_[other].ops > st->clock[other] && result == error::success) {
        result = fail("cudaStreamEndCapture", error::stream_capture_unjoined,
                      "a stream joined to the capture was not joined back");
      }
      streams_[other].capture = 0;
    }
    c.active = false;
    active_captures_.erase(id);
    if (result != error::success) return result;
    graphs_.push_back({id, std::move(c.touched), false});
    *g = {this, static_cast<std::uint32_t>(graphs_.size() - 1)};
    live_graphs_.insert(g->id);
    return error::success;
  }
  /// `cudaStreamGetCaptureInfo` (the mode too, which CUDA does not report).
  error get_capture_info(stream_t s, capture_state* out) {
    std::lock_guard lock(mutex_);
    ++probes_;
    stream_state* st = find(s, "cudaStreamGetCaptureInfo");
    if (st == nullptr) return error::invalid_resource_handle;
    *out = {};
    if (st->capture == 0) return error::success;
    const capture_state_& c = captures_[st->capture];
    *out = {c.invalidated ? capture_state::status::invalidated : capture_state::status::active, c.mode, st->capture};
    return error::success;
  }
  /// Launches `g` on `s`: its kernels touch the memory they touched when captured.
  error graph_launch(graph_t g, stream_t s) {
    std::lock_guard lock(mutex_);
    stream_state* st = find(s, "cudaGraphLaunch");
    if (st == nullptr || g.rt != this || g.id >= graphs_.size() || graphs_[g.id].destroyed) {
      return fail("cudaGraphLaunch", error::invalid_resource_handle, "no such graph");
    }
    for (const auto& [at, n] : graphs_[g.id].touched) {
      if (!allocated(at, n))
        fail("cudaGraphLaunch", error::invalid_value, "a graph touches memory that is no longer allocated");
    }
    ++st->tail;
    ++launches_;
    return error::success;
  }
  error graph_destroy(graph_t g) {
    std::lock_guard lock(mutex_);
    if (g.rt != this || g.id >= graphs_.size() || graphs_[g.id].destroyed) {
      return fail("cudaGraphDestroy", error::invalid_resource_handle, "no such graph");
    }
    graphs_[g.id].destroyed = true;
    graphs_[g.id].touched.clear();
    live_graphs_.erase(g.id);
    return error::success;
  }

  // ---- work --------------------------------------------------------------------------------------
  /// A kernel on `s` touching `[p, p + n)`; captured when `s` is capturing.
  error use(stream_t s, const void* p, std::size_t n) {
    std::lock_guard lock(mutex_);
    stream_state* st = find(s, "kernel launch");
    if (st == nullptr) return error::invalid_resource_handle;
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    if (!allocated(at, n))
      return fail("kernel launch", error::invalid_value, "the kernel touches memory that is not allocated");
    if (st->capture != 0) {
      captures_[st->capture].touched.emplace_back(at, n);
      ++st->ops;
      return error::success;
    }
    if (const std::uint32_t graph = graph_touching(at, n); graph != 0) {
      return fail("kernel launch", error::invalid_value, "work outside graphs touches memory a live graph uses");
    }
    ++st->tail;
    return error::success;
  }
  /// The device runs the work on `s` (and what it waits for).
  void run(stream_t s) {
    std::lock_guard lock(mutex_);
    if (s.id != 0 && s.id < streams_.size()) run_to(s.id, streams_[s.id].tail);
  }
  void run_all() {
    std::lock_guard lock(mutex_);
    for (std::uint32_t i = 1; i < streams_.size(); ++i) run_to(i, streams_[i].tail);
  }

  // ---- memory ------------------------------------------------------------------------------------
  error malloc(void** p, std::size_t n) {
    std::lock_guard lock(mutex_);
    *p = nullptr;
    if (const error e = unsafe("cudaMalloc"); e != error::success) return e;
    return take(p, n, "cudaMalloc");
  }
  error free(void* p) {
    std::lock_guard lock(mutex_);
    if (p == nullptr) return error::success;
    if (const error e = unsafe("cudaFree"); e != error::success) return e;
    return give("cudaFree", p);
  }
  /// `cudaMallocAsync`: a graph node when `s` is capturing (the memory is taken at once).
  error malloc_async(void** p, std::size_t n, stream_t s) {
    std::lock_guard lock(mutex_);
    *p = nullptr;
    stream_state* st = find(s, "cudaMallocAsync");
    if (st == nullptr) return error::invalid_resource_handle;
    if (st->capture != 0) ++st->ops;
    return take(p, n, "cudaMallocAsync");
  }
  error free_async(void* p, stream_t s) {
    std::lock_guard lock(mutex_);
    stream_state* st = find(s, "cudaFreeAsync");
    if (st == nullptr) return error::invalid_resource_handle;
    if (st->capture != 0) {
      ++st->ops;
      return error::success;  // a free node: the memory goes when the graph runs (the model keeps it)
    }
    return give("cudaFreeAsync", p);
  }
  /// The model's virtual memory, as the driver's `cuMemCreate`, `cuMemRelease`,
  /// `cuMemAddressReserve`, `cuMemAddressFree`, `cuMemMap` (+ `cuMemSetAccess`) and `cuMemUnmap`.
  error mem_create(std::uint64_t* handle, std::size_t n) {
    std::lock_guard lock(mutex_);
    *handle = 0;
    if (const error e = unsafe("cuMemCreate"); e != error::success) return e;
    if (n == 0 || n % granularity != 0)
      return fail("cuMemCreate", error::invalid_value, "size not a multiple of the granularity");
    device_state& d = devices_[static_cast<std::size_t>(me().device)];
    if (d.used + n > d.capacity) return error::memory_allocation;
    d.used += n;
    *handle = next_handle_++;
    pieces_[*handle] = {n, me().device, false};
    return error::success;
  }
  error mem_release(std::uint64_t handle) {
    std::lock_guard lock(mutex_);
    if (const error e = unsafe("cuMemRelease"); e != error::success) return e;
    const auto it = pieces_.find(handle);
    if (it == pieces_.end()) return fail("cuMemRelease", error::invalid_value, "no such physical memory");
    if (it->second.mapped) return fail("cuMemRelease", error::invalid_value, "the memory is still mapped");
    devices_[static_cast<std::size_t>(it->second.device)].used -= it->second.size;
    pieces_.erase(it);
    return error::success;
  }
  error mem_address_reserve(void** p, std::size_t n) {
    std::lock_guard lock(mutex_);
    *p = nullptr;
    if (n == 0 || n % granularity != 0)
      return fail("cuMemAddressReserve", error::invalid_value, "size not a multiple of the granularity");
    try {
      *p = ::operator new(n, std::align_val_t{granularity});
      reservations_[reinterpret_cast<std::uintptr_t>(*p)] = n;
    } catch (const std::bad_alloc&) {
      return error::memory_allocation;
    }
    return error::success;
  }
  error mem_address_free(void* p, std::size_t n) {
    std::lock_guard lock(mutex_);
    const auto it = reservations_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == reservations_.end() || it->second != n)
      return fail("cuMemAddressFree", error::invalid_value, "no such reservation");
    const auto lo = allocations_.lower_bound(it->first);
    if (lo != allocations_.end() && lo->first < it->first + n)
      return fail("cuMemAddressFree", error::invalid_value, "memory is still mapped there");
    ::operator delete(p, std::align_val_t{granularity});
    reservations_.erase(it);
    return error::success;
  }
  error mem_map(void* at, std::uint64_t handle) {
    std::lock_guard lock(mutex_);
    if (const error e = unsafe("cuMemMap"); e != error::success) return e;
    const auto it = pieces_.find(handle);
    if (it == pieces_.end() || it->second.mapped)
      return fail("cuMemMap", error::invalid_value, "no such physical memory, or mapped");
    it->second.mapped = true;
    allocations_[reinterpret_cast<std::uintptr_t>(at)] = {it->second.size, handle, it->second.device};
    return error::success;
  }
  error mem_unmap(void* at, std::size_t n) {
    std::lock_guard lock(mutex_);
    if (const error e = unsafe("cuMemUnmap"); e != error::success) return e;
    const auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(at));
    if (it == allocations_.end() || it->second.handle == 0 || it->second.size != n) {
      return fail("cuMemUnmap", error::invalid_value, "nothing mapped there");
    }
    if (graph_touching(it->first, n) != 0) fail("cuMemUnmap", error::invalid_value, "memory of a live graph unmapped");
    pieces_[it->second.handle].mapped = false;
    allocations_.erase(it);
    return error::success;
  }

  // ---- what the model saw ------------------------------------------------------------------------
  std::vector<violation> violations() const {
    std::lock_guard lock(mutex_);
    return violations_;
  }
  bool clean() const {
    std::lock_guard lock(mutex_);
    return violations_.empty();
  }
  /// "call: why (code)" of the first violation, or "" when there is none.
  std::string first_violation() const {
    std::lock_guard lock(mutex_);
    if (violations_.empty()) return {};
    const violation& v = violations_.front();
    return v.call + ": " + v.why + " (error " + std::to_string(static_cast<int>(v.code)) + ")";
  }
  /// Forgets the violations seen so far (for tests that make illegal calls on purpose).
  std::vector<violation> take_violations() {
    std::lock_guard lock(mutex_);
    return std::exchange(violations_, {});
  }
  std::size_t event_queries() const { return locked(queries_); }
  std::size_t synchronizations() const { return locked(synchronizations_); }
  std::size_t capture_probes() const { return locked(probes_); }
  std::size_t external_waits() const { return locked(external_waits_); }
  std::size_t launches() const { return locked(launches_); }
  /// Bytes allocated (`malloc`, `malloc_async`, mapped) on device `d`.
  std::size_t bytes_in_use(int d = 0) const { return locked(devices_[static_cast<std::size_t>(d)].used); }
  /// Whether any live graph touches `[p, p + n)`.
  bool graph_uses(const void* p, std::size_t n) const {
    std::lock_guard lock(mutex_);
    return graph_touching(reinterpret_cast<std::uintptr_t>(p), n) != 0;
  }
  /// Whether the stream has work not yet run.
  bool busy(stream_t s) const {
    std::lock_guard lock(mutex_);
    return streams_[s.id].done < streams_[s.id].tail;
  }
  int device_of(stream_t s) const { return locked(streams_[s.id].device); }
  int device_of(event_t e) const { return locked(events_[e.id].device); }

 private:
  struct wait_on {
    std::uint64_t at;  ///< work from this position on waits
    std::uint32_t stream;
    std::uint64_t position;
  };
  struct stream_state {
    int device = 0;
    bool destroyed = false;
    std::uint64_t tail = 0;  ///< work enqueued (positions 1..tail)
    std::uint64_t done = 0;  ///< work run
    std::vector<wait_on> waits;
    unsigned long long capture = 0;
    std::uint64_t ops = 0;                         ///< captured operations
    std::map<std::uint32_t, std::uint64_t> clock;  ///< captured operations of each stream ordered before
  };
  struct event_state {
    int device = 0;
    bool destroyed = false;
    bool recorded = false;
    std::uint32_t stream = 0;
    std::uint64_t position = 0;
    unsigned long long capture = 0;  ///< last recorded in this capture
    std::map<std::uint32_t, std::uint64_t> clock;
  };
  struct capture_state_ {
    bool active = false;
    bool invalidated = false;
    capture_mode mode = capture_mode::global;
    std::uint32_t origin = 0;
    int device = 0;
    std::thread::id thread;
    std::vector<std::uint32_t> streams;
    std::vector<std::pair<std::uintptr_t, std::size_t>> touched;
  };
  struct graph_state {
    unsigned long long capture = 0;
    std::vector<std::pair<std::uintptr_t, std::size_t>> touched;
    bool destroyed = false;
  };
  struct thread_state {
    int device = 0;
    capture_mode mode = capture_mode::global;
  };
  struct device_state {
    std::size_t capacity;
    std::size_t used;
  };
  struct allocation {
    std::size_t size = 0;
    std::uint64_t handle = 0;  ///< vmm piece mapped there; 0: malloc
    int device = 0;
  };
  struct piece {
    std::size_t size = 0;
    int device = 0;
    bool mapped = false;
  };

  template <class T>
  T locked(const T& value) const {
    std::lock_guard lock(mutex_);
    return value;
  }

  thread_state& me() { return threads_[std::this_thread::get_id()]; }

  error fail(const char* call, error code, const char* why) {
    violations_.push_back({call, code, why});
    return code;
  }
  error invalidate(unsigned long long capture, const char* call, error code, const char* why) {
    captures_[capture].invalidated = true;
    return fail(call, code, why);
  }

  stream_state* find(stream_t s, const char* call) {
    if (s.rt != this || s.id == 0 || s.id >= streams_.size() || streams_[s.id].destroyed) {
      fail(call, error::invalid_resource_handle, "no such stream");
      return nullptr;
    }
    return &streams_[s.id];
  }
  event_state* find(event_t e, const char* call) {
    if (e.rt != this || e.id == 0 || e.id >= events_.size() || events_[e.id].destroyed) {
      fail(call, error::invalid_resource_handle, "no such event");
      return nullptr;
    }
    return &events_[e.id];
  }

  /// Querying or synchronizing an event last recorded in a capture still running.
  error captured(const event_state& ev, const char* call) {
    if (ev.capture == 0 || !captures_[ev.capture].active) return error::success;
    return invalidate(ev.capture, call, error::captured_event, "the event was recorded in a capture still running");
  }

  /// A "potentially unsafe" call: refused (and the capture that forbids it invalidated) when the
  /// calling thread has a capture not begun relaxed, or, in the global interaction mode, when
  /// another thread has a capture begun global.
  error unsafe(const char* call) {
    const thread_state& t = me();
    const std::thread::id self = std::this_thread::get_id();
    for (const unsigned long long id : active_captures_) {
      const capture_state_& c = captures_[id];
      const bool own = c.thread == self && c.mode != capture_mode::relaxed && t.mode != capture_mode::relaxed;
      const bool other = c.thread != self && c.mode == capture_mode::global && t.mode == capture_mode::global;
      if (own || other)
        return invalidate(id, call, error::stream_capture_unsupported, "an unsafe call while a capture forbids it");
    }
    return error::success;
  }

  void run_to(std::uint32_t s, std::uint64_t position) {
    stream_state& st = streams_[s];
    if (st.done >= position) return;
    for (const wait_on& w : st.waits) {
      if (w.at < position && w.stream != s) run_to(w.stream, w.position);
    }
    st.done = std::max(st.done, std::min(position, st.tail));
    std::erase_if(st.waits, [&](const wait_on& w) { return w.at < st.done; });
  }

  /// Whether [at, at + n) lies in one allocation, or in mappings that adjoin (virtual memory).
  bool allocated(std::uintptr_t at, std::size_t n) const {
    auto it = allocations_.upper_bound(at);
    if (it == allocations_.begin()) return false;
    --it;
    while (at + n > it->first + it->second.size) {
      const auto next = std::next(it);
      if (it->second.handle == 0 || next == allocations_.end() || next->second.handle == 0 ||
          next->first != it->first + it->second.size)
        return false;
      it = next;
    }
    return true;
  }
  std::uint32_t graph_touching(std::uintptr_t at, std::size_t n) const {
    for (const std::uint32_t g : live_graphs_) {
      for (const auto& [lo, size] : graphs_[g].touched) {
        if (lo < at + n && at < lo + size) return g;
      }
    }
    for (const unsigned long long id : active_captures_) {  // a capture running will be a graph
      const capture_state_& c = captures_.at(id);
      for (const auto& [lo, size] : c.touched) {
        if (lo < at + n && at < lo + size) return ~std::uint32_t{0};
      }
    }
    return 0;
  }

  error take(void** p, std::size_t n, const char* call) {
    device_state& d = devices_[static_cast<std::size_t>(me().device)];
    const std::size_t rounded = (std::max<std::size_t>(n, 1) + 255) / 256 * 256;
    if (d.used + rounded > d.capacity) return error::memory_allocation;
    try {
      *p = ::operator new(rounded, std::align_val_t{256});
      allocations_[reinterpret_cast<std::uintptr_t>(*p)] = {rounded, 0, me().device};
    } catch (const std::bad_alloc&) {
      return fail(call, error::memory_allocation, "host memory ran out");
    }
    d.used += rounded;
    return error::success;
  }
  error give(const char* call, void* p) {
    const auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == allocations_.end() || it->second.handle != 0)
      return fail(call, error::invalid_value, "not an allocation");
    if (graph_touching(it->first, it->second.size) != 0)
      fail(call, error::invalid_value, "memory of a live graph given back");
    devices_[static_cast<std::size_t>(it->second.device)].used -= it->second.size;
    ::operator delete(p, std::align_val_t{256});
    allocations_.erase(it);
    return error::success;
  }

  mutable std::mutex mutex_;
  std::vector<device_state> devices_;
  std::unordered_map<std::thread::id, thread_state> threads_;
  std::vector<stream_state> streams_;
  std::vector<event_state> events_;
  std::map<unsigned long long, capture_state_> captures_;
  std::set<unsigned long long> active_captures_;  ///< captures begun and not ended
  std::vector<graph_state> graphs_;
  std::set<std::uint32_t> live_graphs_;  ///< graphs not destroyed, in creation order
  std::map<std::uintptr_t, allocation> allocations_;
  std::map<std::uintptr_t, std::size_t> reservations_;
  std::map<std::uint64_t, piece> pieces_;
  std::vector<violation> violations_;
  unsigned long long next_capture_ = 1;
  std::uint64_t next_handle_ = 1;
  std::size_t queries_ = 0;
  std::size_t synchronizations_ = 0;
  std::size_t probes_ = 0;
  std::size_t external_waits_ = 0;
  std::size_t launches_ = 0;
};

/// Makes device `d` current on the calling thread for the scope, as `alloy::scoped_device` does
/// for CUDA (no call when it already is).
class device_scope {
 public:
  device_scope(runtime& rt, int d) : rt_(rt) {
    rt_.get_device(&previous_);
    restore_ = previous_ != d;
    if (restore_) rt_.set_device(d);
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
    if (restore_) rt_.set_device(previous_);
  }

 private:
  runtime& rt_;
  int previous_ = 0;
  bool restore_ = false;
};

/// `cudaMalloc` / `cudaFree` of the model, bound to a device (the current one at construction):
/// an upstream, as `cuda_malloc_upstream` is.
class malloc_upstream {
 public:
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
  static constexpr bool thread_safe = true;

  explicit malloc_upstream(runtime& rt) : rt_(&rt) { rt.get_device(&device_); }
  malloc_upstream(runtime& rt, int device) : rt_(&rt), device_(device) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (alignment > 256 || (alignment & (alignment - 1)) != 0) return {};
    try {
      device_scope on(*rt_, device_);
      void* p = nullptr;
      if (rt_->malloc(&p, bytes) != error::success) return {};
      return {p, bytes};
    } catch (...) {
      return {};
    }
  }
  void deallocate(block b) noexcept {
    try {
      device_scope on(*rt_, device_);
      (void)rt_->free(b.ptr);
    } catch (...) {}
  }
  int device() const noexcept { return device_; }
  friend bool operator==(const malloc_upstream&, const malloc_upstream&) = default;

 private:
  runtime* rt_;
  int device_ = 0;
};

/// `cudaMallocAsync` / `cudaFreeAsync` of the model on one stream, as `cuda_async_upstream` is:
/// capturable (inside a capture they become graph nodes, which the model allows in every mode).
class async_upstream {
 public:
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
  static constexpr bool thread_safe = true;

  async_upstream(runtime& rt, stream_t stream) : rt_(&rt), stream_(stream) {}
  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (alignment > 256 || (alignment & (alignment - 1)) != 0) return {};
    try {
      device_scope on(*rt_, rt_->device_of(stream_));
      void* p = nullptr;
      return rt_->malloc_async(&p, bytes, stream_) == error::success ? block{p, bytes} : block{};
    } catch (...) {
      return {};
    }
  }
  void deallocate(block b) noexcept {
    try {
      (void)rt_->free_async(b.ptr, stream_);
    } catch (...) {}
  }
  friend bool operator==(const async_upstream&, const async_upstream&) = default;

 private:
  runtime* rt_;
  stream_t stream_;
};

/// The model's virtual memory (`cuMemCreate`, `cuMemMap`, ... on one device): a
/// `virtual_memory` backend, as `cuda_vmm` is. Unlike `cuda_vmm`, it does not synchronize before
/// an unmap: the model does not run work, it checks that no live graph uses what is unmapped.
class vmm {
 public:
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;

  explicit vmm(runtime& rt, std::size_t capacity = std::size_t{1} << 30) : rt_(&rt), capacity_(capacity) {
    rt.get_device(&device_);
  }
  std::size_t granularity() const noexcept { return runtime::granularity; }
  address_range reserve(std::size_t bytes) noexcept {
    void* p = nullptr;
    return call([&] { return rt_->mem_address_reserve(&p, bytes); }) ? address_range{p, bytes} : address_range{};
  }
  void unreserve(address_range range) noexcept {
    (void)call([&] { return rt_->mem_address_free(range.ptr, range.size); });
  }
  physical_memory create(std::size_t bytes) noexcept {
    if (physical_ + bytes > capacity_) return {};
    std::uint64_t handle = 0;
    if (!call([&] { return rt_->mem_create(&handle, bytes); })) return {};
    physical_ += bytes;
    return {handle, bytes};
  }
  void release(physical_memory piece) noexcept {
    if (call([&] { return rt_->mem_release(piece.id); })) physical_ -= piece.size;
  }
  bool map(void* at, physical_memory piece) noexcept {
    return call([&] { return rt_->mem_map(at, piece.id); });
  }
  void unmap(void* at, std::size_t bytes) noexcept {
    (void)call([&] { return rt_->mem_unmap(at, bytes); });
  }
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t physical_bytes() const noexcept { return physical_; }

 private:
  template <class F>
  bool call(F&& f) noexcept {
    try {
      device_scope on(*rt_, device_);
      return f() == error::success;
    } catch (...) {
      return false;
    }
  }
  runtime* rt_;
  std::size_t capacity_;
  std::size_t physical_ = 0;
  int device_ = 0;
};

}  // namespace alloy::cuda_model

namespace alloy {

/// The model's streams, written exactly as `stream_traits<cudaStream_t>` is (the same fallbacks),
/// so that what a test sees of the model is what CUDA would see. An event is created at its
/// first record, on the stream's device.
template <>
struct stream_traits<cuda_model::stream_t> {
  using event_type = cuda_model::event_t;
  using error = cuda_model::error;

  static bool create(event_type&) noexcept { return true; }
  static void destroy(event_type& e) noexcept {
    if (e.rt != nullptr) guard([&] { return e.rt->event_destroy(e); });
    e = {};
  }
  static bool record(event_type& e, cuda_model::stream_t s) noexcept {
    return guard([&] {
      if (e.rt == nullptr) {
        cuda_model::device_scope on(*s.rt, s.rt->device_of(s));
        if (const error r = s.rt->event_create(&e); r != error::success) return r;
      }
      return s.rt->event_record(e, s);
    });
  }
  static bool wait(cuda_model::stream_t s, const event_type& e) noexcept {
    return e.rt == nullptr || guard([&] { return s.rt->stream_wait_event(s, e, 0); });
  }
  static bool ready(const event_type& e) noexcept {
    if (e.rt == nullptr) return true;
    error status = error::success;
    guard([&] { return status = e.rt->event_query(e); });
    if (status == error::success) return true;
    if (status != error::not_ready) {
      synchronize(e);
      return true;
    }
    return false;
  }
  static void synchronize(const event_type& e) noexcept {
    if (e.rt != nullptr && !guard([&] { return e.rt->event_synchronize(e); })) {
      guard([&] { return e.rt->device_synchronize(); });
    }
  }
  static void synchronize(cuda_model::stream_t s) noexcept {
    if (!guard([&] { return s.rt->stream_synchronize(s); })) guard([&] { return s.rt->device_synchronize(); });
  }
  static capture_state capture(cuda_model::stream_t s) noexcept {
    capture_state out{};
    if (!guard([&] { return s.rt->get_capture_info(s, &out); })) return {capture_state::status::invalidated, {}, 0};
    return out;
  }
  static bool wait_external(cuda_model::stream_t s, const event_type& e) noexcept {
    return e.rt == nullptr || guard([&] { return s.rt->stream_wait_event(s, e, cuda_model::wait_external_flag); });
  }

 private:
  template <class F>
  static bool guard(F&& f) noexcept {
    try {
      return f() == error::success;
    } catch (...) {  // the model's own bookkeeping ran out of memory
      return false;
    }
  }
};

}  // namespace alloy
