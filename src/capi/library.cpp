// SPDX-License-Identifier: Apache-2.0
// src/capi/library.cpp: liballoy's entry points (alloy/capi.h). One heap per device, each behind
// its own lock; a table of live blocks per device checks every free before the heap sees it, so
// a bad free from a foreign caller is refused and counted, never a crash.
#include <alloy/capi.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include <alloy/detail/address_table.hpp>

#include "config.hpp"
#include "cuda_runtime_calls.hpp"
#include "device_heap.hpp"
#include "json.hpp"

namespace alloy::capi {
namespace {

// One device: its heap (made at first use), the blocks it handed out, its misuse count and its
// last out-of-memory explanation (a fixed buffer, so a pointer to it stays valid).
struct device_slot {
  std::mutex lock;
  std::unique_ptr<device_heap> heap;
  std::string heap_error;                   ///< why the heap could not be made
  detail::address_table<std::size_t> live;  ///< the blocks handed out, with the bytes asked for
  std::size_t bad_frees = 0;
  /// Failed first attempts the library retried after giving the cache back: the composition
  /// counted each as an out-of-memory, PyTorch counts it as a retry (`num_alloc_retries`).
  std::size_t retried = 0;
  std::size_t total_bytes = 0;  ///< the device's memory
  std::size_t limit = std::numeric_limits<std::size_t>::max();
  char last_oom[1024] = {};
};

struct library {
  std::mutex start_lock;
  std::atomic<bool> started{false};
  bool configured = false;  ///< alloy_configure was called (ALLOY_CONF is then not read)
  config conf;
  int status = ALLOY_OK;  ///< why the library could not start, if it could not
  std::string status_message;
  std::string conf_text;
  int device_count = 0;
  std::unique_ptr<device_slot[]> devices;
  /// Events each device keeps: the `history` key's, then `alloy_record_history`'s.
  std::atomic<std::size_t> history{0};
};

// The library's one instance: liballoy is a process-wide allocator, as PyTorch's is.
library the_library;

thread_local std::string t_error;
thread_local int t_error_code = ALLOY_OK;
// The calling thread's copy of an out-of-memory explanation: what alloy_last_oom returns and
// alloy_torch_malloc_or_throw throws, read while other threads may write the device's.
thread_local char t_oom[sizeof device_slot::last_oom];

void set_error(int code, std::string message) {  // code: never ALLOY_OK
  t_error_code = code;
  t_error = std::move(message);
}
void clear_error() {
  if (t_error_code == ALLOY_OK) return;  // the message is empty too: most calls touch only the code
  t_error_code = ALLOY_OK;
  t_error.clear();
}

std::size_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

bool start_once();

// Starts the library on first use: the configuration (ALLOY_CONF unless alloy_configure set one)
// and the count of devices. Heaps are made per device later, at their first use. Clears the
// calling thread's error: each call's error is its own, never an earlier call's.
inline bool start() {
  const library& lib = the_library;
  if (lib.started.load(std::memory_order_acquire) && lib.status == ALLOY_OK) [[likely]] {
    clear_error();
    return true;
  }
  return start_once();
}

// `start` on the first call, or once the library could not start.
[[gnu::noinline]] bool start_once() {
  library& lib = the_library;
  if (lib.started.load(std::memory_order_acquire)) {
    set_error(lib.status, lib.status_message);
    return false;
  }
  std::lock_guard guard(lib.start_lock);
  if (!lib.started.load(std::memory_order_relaxed)) {
    if (!lib.configured) {
      const char* env = std::getenv("ALLOY_CONF");
      config_error error;
      if (env != nullptr && !parse_config(env, lib.conf, error)) {
        lib.status = error.status;
        lib.status_message = error.message + " (in ALLOY_CONF)";
      }
    }
    if (lib.status == ALLOY_OK) {
      if (lib.conf.backend == backend_kind::host) {
        lib.device_count = lib.conf.devices;
      } else {
        std::string why;
        lib.device_count = cuda_device_count(why);
        if (lib.device_count <= 0) {
          lib.status = ALLOY_ERROR_UNAVAILABLE;
          lib.status_message = "alloy: the CUDA backend cannot start: " + why;
          lib.device_count = 0;
        }
      }
    }
    if (lib.device_count > 0) lib.devices = std::make_unique<device_slot[]>(static_cast<std::size_t>(lib.device_count));
    lib.conf_text = lib.conf.to_string();
    lib.history.store(lib.conf.history, std::memory_order_relaxed);
    lib.started.store(true, std::memory_order_release);
  }
  if (lib.status == ALLOY_OK) {
    clear_error();
    return true;
  }
  set_error(lib.status, lib.status_message);
  return false;
}

device_slot* slot_of(int device) {
  if (!start()) return nullptr;
  if (device < 0 || device >= the_library.device_count) {
    set_error(ALLOY_ERROR_BAD_DEVICE, "alloy: device " + std::to_string(device) + " out of range (" +
                                          std::to_string(the_library.device_count) + " device(s))");
    return nullptr;
  }
  return &the_library.devices[static_cast<std::size_t>(device)];
}

std::size_t limit_for(const config& c, std::size_t total) {
  if (c.capacity_bytes != 0) return c.capacity_bytes;
  if (c.capacity_fraction != 0.0) return static_cast<std::size_t>(c.capacity_fraction * static_cast<double>(total));
  return std::numeric_limits<std::size_t>::max();
}

// The device's heap, made at first use; call with the slot's lock held.
device_heap* heap_of_slot(device_slot& slot, int device) {
  if (slot.heap) return slot.heap.get();
  if (!slot.heap_error.empty()) {
    set_error(ALLOY_ERROR_UNAVAILABLE, slot.heap_error);
    return nullptr;
  }
  const config& c = the_library.conf;
  try {
    if (c.backend == backend_kind::host) {
      slot.total_bytes = c.capacity_bytes != 0 ? c.capacity_bytes : host_memory_bytes();
      slot.limit = std::min(slot.limit, limit_for(c, slot.total_bytes));
      slot.heap = make_host_heap(c, device, slot.limit);
    } else {
      std::string why;
      std::size_t free_bytes = 0;
      if (!cuda_memory_info(device, free_bytes, slot.total_bytes, why)) {
        slot.heap_error = "alloy: device " + std::to_string(device) + ": " + why;
      } else {
        slot.limit = std::min(slot.limit, limit_for(c, slot.total_bytes));
        slot.heap = make_cuda_heap(c, device, slot.limit, why);
        if (!slot.heap) slot.heap_error = "alloy: device " + std::to_string(device) + ": " + why;
      }
    }
  } catch (const std::exception& e) {
    slot.heap_error = std::string("alloy: device ") + std::to_string(device) + ": " + e.what();
  }
  if (!slot.heap) {
    set_error(ALLOY_ERROR_UNAVAILABLE, slot.heap_error);
    return nullptr;
  }
  slot.heap->state().events.keep(the_library.history.load(std::memory_order_relaxed));
  return slot.heap.get();
}

std::uintptr_t key(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Device memory free now: the driver's answer on CUDA, the device's memory less what the heap
// took on the host backend.
std::size_t device_free_bytes(const device_slot& slot, const device_state& state, int device) {
  if (the_library.conf.backend == backend_kind::cuda) {
    std::size_t free_bytes = 0;
    std::size_t total = 0;
    std::string why;
    return cuda_memory_info(device, free_bytes, total, why) ? free_bytes : 0;
  }
  return slot.total_bytes > state.taken ? slot.total_bytes - state.taken : 0;
}

void* allocate(int device, std::size_t size, void* stream) {
  device_slot* slot = slot_of(device);
  if (slot == nullptr) return nullptr;
  const device_guard on_device(the_library.conf.backend == backend_kind::cuda, device);
  std::lock_guard guard(slot->lock);
  device_heap* heap = heap_of_slot(*slot, device);
  if (heap == nullptr) return nullptr;
  device_state& state = heap->state();
  state.stream = key(stream);
  block b = heap->allocate(size, stream);
  if (!b && size <= state.limit) {
    // As PyTorch does before it reports out of memory: give every cached byte back and retry
    // once (the composition's own retry may have released one part's cache, not another's).
    ++slot->retried;
    heap->release();
    b = heap->allocate(size, stream);
  }
  if (b) {
    if (!slot->live.add(b.ptr, size)) {
      heap->deallocate(b, stream);  // no room to remember it: as if the device had none
      b = {};
    }
  }
  if (!b) {
    std::string why;
    try {
      oom_report report = heap->explain(size);
      if (report.limit == 0 && state.limit != std::numeric_limits<std::size_t>::max()) report.limit = state.limit;
      why = detail::describe(report) + " on device " + std::to_string(device);
    } catch (...) {
      why = "alloy: out of memory on device " + std::to_string(device);
    }
    std::snprintf(slot->last_oom, sizeof slot->last_oom, "%s", why.c_str());
    std::memcpy(t_oom, slot->last_oom, sizeof t_oom);
    state.events.add("oom", 0, size, key(stream), device_free_bytes(*slot, state, device));
    return nullptr;
  }
  state.events.add("alloc", key(b.ptr), size, key(stream));
  return b.ptr;
}

// Which other device, if any, holds `ptr` live (for the message of a free with the wrong device).
int owner_elsewhere(void* ptr, int device) {
  for (int d = 0; d < the_library.device_count; ++d) {
    if (d == device) continue;
    device_slot& other = the_library.devices[static_cast<std::size_t>(d)];
    std::lock_guard guard(other.lock);
    if (other.live.contains(ptr)) return d;
  }
  return -1;
}

// Frees `ptr` on `device`; `size` is checked when `check_size` (PyTorch passes it, CuPy does not).
void free_block(void* ptr, std::size_t size, bool check_size, int device, void* stream) {
  if (ptr == nullptr) {  // nothing, as free(NULL)
    clear_error();
    return;
  }
  device_slot* slot = slot_of(device);
  if (slot == nullptr) return;
  const device_guard on_device(the_library.conf.backend == backend_kind::cuda, device);
  std::string refusal;
  {
    std::lock_guard guard(slot->lock);
    std::size_t* asked = slot->live.find(ptr);
    if (asked != nullptr && check_size && *asked != size) {
      ++slot->bad_frees;
      refusal = "alloy: free of " + std::to_string(key(ptr)) + " with size " + std::to_string(size) +
                ", allocated with size " + std::to_string(*asked) + " (refused)";
    } else if (asked != nullptr) {
      device_heap* heap = slot->heap.get();
      void* on = stream;
      const block b{ptr, *asked};
      device_state& state = heap->state();
      state.stream = key(on);
      state.events.add("free_requested", key(ptr), b.size, key(on));
      if (!heap->deallocate(b, on)) {
        ++slot->bad_frees;
        refusal = "alloy: the allocator refused the free of " + std::to_string(key(ptr));
      } else {
        state.events.add("free_completed", key(ptr), b.size, key(on));
        slot->live.remove_found(asked);  // the table is as `find` left it
        // The thread's error was cleared when the call began (`start`).
        return;
      }
    } else {
      ++slot->bad_frees;
    }
  }
  if (refusal.empty()) {
    const int owner = owner_elsewhere(ptr, device);
    refusal = owner >= 0 ? "alloy: free of " + std::to_string(key(ptr)) + " on device " + std::to_string(device) +
                               ", but it belongs to device " + std::to_string(owner) + " (refused)"
                         : "alloy: free of " + std::to_string(key(ptr)) + ", which is not a live block of device " +
                               std::to_string(device) + " (a double free or a foreign pointer; refused)";
  }
  set_error(ALLOY_ERROR_BAD_POINTER, refusal);
}

// Copies `text` into the caller's buffer as capi.h says; returns the whole length.
std::size_t copy_out(const std::string& text, char* buffer, std::size_t capacity) {
  if (buffer != nullptr && capacity > 0) {
    const std::size_t n = std::min(text.size(), capacity - 1);
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return text.size();
}

template <class F>
std::size_t text_of_device(int device, char* buffer, std::size_t capacity, F&& make) {
  device_slot* slot = slot_of(device);
  if (slot == nullptr) return 0;
  std::string text;
  try {
    const device_guard on_device(the_library.conf.backend == backend_kind::cuda, device);
    std::lock_guard guard(slot->lock);
    device_heap* heap = heap_of_slot(*slot, device);
    if (heap == nullptr) return 0;
    text = make(*slot, *heap);
  } catch (const std::exception& e) {
    set_error(ALLOY_ERROR_UNAVAILABLE, std::string("alloy: ") + e.what());
    return 0;
  }
  clear_error();
  return copy_out(text, buffer, capacity);
}

std::string statistics_json(device_slot& slot, device_heap& heap, int device) {
  const alloy::statistics s = heap.statistics();
  json_object out;
  out.add("num_allocs", s.num_allocs);
  out.add("bytes_in_use", s.bytes_in_use);
  out.add("peak_bytes_in_use", s.peak_bytes_in_use);
  out.add("largest_alloc_size", s.largest_alloc_size);
  const std::size_t limit = slot.limit == std::numeric_limits<std::size_t>::max() ? 0 : slot.limit;
  out.add("bytes_limit", s.bytes_limit != 0 ? s.bytes_limit : limit);
  out.add("bytes_reserved", s.bytes_reserved);
  out.add("peak_bytes_reserved", s.peak_bytes_reserved);
  out.add("bytes_reservable_limit", s.bytes_reservable_limit != 0 ? s.bytes_reservable_limit : limit);
  out.add("bytes_inactive", s.bytes_inactive);
  out.add("bytes_active", s.bytes_active);
  out.add("peak_bytes_active", s.peak_bytes_active);
  out.add("bytes_reclaimed", s.bytes_reclaimed);
  out.add("num_single_reclaims", s.num_single_reclaims);
  out.add("num_full_reclaims", s.num_full_reclaims);
  out.add("num_defragmentations", s.num_defragmentations);
  out.add("bytes_defragged", s.bytes_defragged);
  out.add("requested_bytes", s.requested_bytes);
  out.add("largest_free_block", s.largest_free_block);
  out.add("fragmentation", s.fragmentation);
  out.add("num_alloc_retries", s.num_alloc_retries + slot.retried);
  out.add("num_ooms", s.num_ooms - std::min(s.num_ooms, slot.retried));
  out.add("num_device_alloc", s.num_device_alloc);
  out.add("num_device_free", s.num_device_free);
  out.add("num_bad_frees", slot.bad_frees);
  const graph_pool_figures graphs = heap.graph_pools();
  out.add("graph_pools", graphs.pools);
  out.add("graph_pool_live_bytes", graphs.live_bytes);
  out.add("graph_pool_free_bytes", graphs.free_bytes);
  out.add("device_total_bytes", slot.total_bytes);
  out.add("device_free_bytes", device_free_bytes(slot, heap.state(), device));
  return out.str();
}

}  // namespace
}  // namespace alloy::capi

using namespace alloy::capi;

extern "C" {

int alloy_configure(const char* conf) {
  library& lib = the_library;
  config parsed;
  config_error error;
  if (!parse_config(conf == nullptr ? "" : conf, parsed, error)) {
    set_error(error.status, error.message);
    return error.status;
  }
  std::lock_guard guard(lib.start_lock);
  if (lib.started.load(std::memory_order_acquire)) {
    set_error(
        ALLOY_ERROR_ALREADY_CONFIGURED,
        lib.status == ALLOY_OK
            ? "alloy: already configured and in use (" + lib.conf_text + "); configure before the first allocation"
            : "alloy: configuration is read once, at the first call, and the library could not start then (" +
                  lib.status_message + ")");
    return ALLOY_ERROR_ALREADY_CONFIGURED;
  }
  lib.conf = parsed;
  lib.configured = true;
  clear_error();
  return ALLOY_OK;
}

const char* alloy_configuration(void) { return start() ? the_library.conf_text.c_str() : ""; }

const char* alloy_last_error(void) { return t_error.c_str(); }
int alloy_last_error_code(void) { return t_error_code; }

int alloy_device_count(void) { return start() ? the_library.device_count : -1; }

void* alloy_torch_malloc(size_t size, int device, cudaStream_t stream) { return allocate(device, size, stream); }

namespace {
/// What alloy_torch_malloc_or_throw throws: std::bad_alloc with alloy's explanation.
class capi_out_of_memory : public std::bad_alloc {
 public:
  explicit capi_out_of_memory(std::string why) : why_(std::move(why)) {}
  const char* what() const noexcept override { return why_.c_str(); }

 private:
  std::string why_;
};
}  // namespace

void* alloy_torch_malloc_or_throw(size_t size, int device, cudaStream_t stream) {
  void* p = allocate(device, size, stream);
  if (p == nullptr) throw capi_out_of_memory(t_error_code != ALLOY_OK ? t_error : std::string(t_oom));
  return p;
}

void alloy_torch_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  free_block(ptr, size, true, device, stream);
}

void alloy_torch_init(int device_count) {
  if (!start()) return;
  if (device_count != the_library.device_count) {
    set_error(ALLOY_ERROR_BAD_DEVICE, "alloy: PyTorch counts " + std::to_string(device_count) + " device(s), alloy " +
                                          std::to_string(the_library.device_count));
  }
}

void alloy_torch_empty_cache(void) {
  if (!start()) return;
  for (int d = 0; d < the_library.device_count; ++d) {
    device_slot& slot = the_library.devices[static_cast<std::size_t>(d)];
    const device_guard on_device(the_library.conf.backend == backend_kind::cuda, d);
    std::lock_guard guard(slot.lock);
    if (slot.heap) slot.heap->release();
  }
}

void alloy_torch_set_memory_fraction(double fraction, int device) {
  device_slot* slot = slot_of(device);
  if (slot == nullptr) return;
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    char shown[32] = {};  // the shortest text that reads back as `fraction` (1.0000001, not 1.000000)
    std::to_chars(shown, shown + sizeof shown - 1, fraction);
    set_error(ALLOY_ERROR_BAD_VALUE, std::string("alloy: memory fraction ") + shown + " is not within [0, 1]");
    return;
  }
  const device_guard on_device(the_library.conf.backend == backend_kind::cuda, device);
  std::lock_guard guard(slot->lock);
  device_heap* heap = heap_of_slot(*slot, device);
  if (heap == nullptr) return;
  slot->limit = static_cast<std::size_t>(fraction * static_cast<double>(slot->total_bytes));
  heap->state().limit = slot->limit;
  clear_error();
}

void alloy_torch_record_stream(void* ptr, cudaStream_t stream) {
  if (!start() || ptr == nullptr) return;
  for (int d = 0; d < the_library.device_count; ++d) {
    device_slot& slot = the_library.devices[static_cast<std::size_t>(d)];
    const device_guard on_device(the_library.conf.backend == backend_kind::cuda, d);
    std::lock_guard guard(slot.lock);
    const std::size_t* asked = slot.live.find(ptr);
    if (asked == nullptr) continue;
    slot.heap->record_use({ptr, *asked}, stream);
    clear_error();
    return;
  }
  set_error(ALLOY_ERROR_BAD_POINTER, "alloy: record_stream of " + std::to_string(key(ptr)) + ", not a live block");
}

void* alloy_cupy_malloc(void* /*param*/, size_t size, int device) { return allocate(device, size, nullptr); }

void alloy_cupy_free(void* /*param*/, void* ptr, int device) { free_block(ptr, 0, false, device, nullptr); }

size_t alloy_memory_stats_json(int device, char* buffer, size_t capacity) {
  return text_of_device(device, buffer, capacity, [](device_slot& slot, device_heap& heap) {
    std::map<std::string, std::int64_t> stats = heap.memory_stats();
    // The library's own retries (see device_slot::retried), counted as PyTorch counts them.
    const auto retried = static_cast<std::int64_t>(slot.retried);
    stats["num_alloc_retries"] += retried;
    stats["num_ooms"] -= std::min(stats["num_ooms"], retried);
    json_object out;
    for (const auto& [name, value] : stats) out.add(name, value);
    return out.str();
  });
}

size_t alloy_statistics_json(int device, char* buffer, size_t capacity) {
  return text_of_device(device, buffer, capacity,
                        [device](device_slot& slot, device_heap& heap) { return statistics_json(slot, heap, device); });
}

size_t alloy_memory_summary(int device, char* buffer, size_t capacity) {
  return text_of_device(device, buffer, capacity, [](device_slot&, device_heap& heap) { return heap.summary(); });
}

size_t alloy_snapshot_json(char* buffer, size_t capacity) {
  if (!start()) return 0;
  std::string text;
  try {
    snapshot_writer writer;
    for (int d = 0; d < the_library.device_count; ++d) {
      device_slot& slot = the_library.devices[static_cast<std::size_t>(d)];
      const device_guard on_device(the_library.conf.backend == backend_kind::cuda, d);
      std::lock_guard guard(slot.lock);
      device_heap* heap = heap_of_slot(slot, d);
      if (heap == nullptr) return 0;
      writer.add_device(d, heap->picture(), heap->state().events.events());
    }
    text = writer.str();
  } catch (const std::exception& e) {
    set_error(ALLOY_ERROR_UNAVAILABLE, std::string("alloy: ") + e.what());
    return 0;
  }
  clear_error();
  return copy_out(text, buffer, capacity);
}

void alloy_record_history(size_t max_entries) {
  if (!start()) return;
  if (max_entries > max_history) {
    set_error(ALLOY_ERROR_BAD_VALUE, "alloy: record_history of " + std::to_string(max_entries) + " events; at most " +
                                         std::to_string(max_history));
    return;
  }
  // Stored before the devices are visited: a heap made meanwhile reads it under its slot's lock.
  the_library.history.store(max_entries, std::memory_order_relaxed);
  for (int d = 0; d < the_library.device_count; ++d) {
    device_slot& slot = the_library.devices[static_cast<std::size_t>(d)];
    std::lock_guard guard(slot.lock);
    if (slot.heap) slot.heap->state().events.keep(max_entries);
  }
  clear_error();
}

void alloy_reset_peak(int device) {
  text_of_device(device, nullptr, 0, [](device_slot&, device_heap& heap) {
    heap.reset_peak();
    return std::string();
  });
}

void alloy_release_graph_pools(int device) {
  text_of_device(device, nullptr, 0, [](device_slot&, device_heap& heap) {
    heap.release_graph_pools();
    return std::string();
  });
}

void alloy_reset_accumulated(int device) {
  text_of_device(device, nullptr, 0, [](device_slot& slot, device_heap& heap) {
    heap.reset_accumulated();
    slot.retried = 0;
    slot.bad_frees = 0;
    return std::string();
  });
}

const char* alloy_last_oom(int device) {
  device_slot* slot = slot_of(device);
  if (slot == nullptr) return "";
  std::lock_guard guard(slot->lock);
  std::memcpy(t_oom, slot->last_oom, sizeof t_oom);
  return t_oom;
}

}  // extern "C"
