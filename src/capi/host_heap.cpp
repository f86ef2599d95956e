// SPDX-License-Identifier: Apache-2.0
// src/capi/host_heap.cpp: backend:host, host memory standing in for devices, so that the C
// interface is tested on machines without a GPU. It makes no CUDA call.
#include <alloy/vmm/host_vmm.hpp>

#include "device_heap.hpp"

namespace alloy::capi {

/// A stream handle of the host backend: an opaque key. Host memory has no queued work, so every
/// event is complete at once; the ordering logic of `stream_ordered` still runs (pending ranges,
/// recorded uses), which is what the tests exercise.
struct key_stream {
  void* key = nullptr;
  friend bool operator==(const key_stream&, const key_stream&) noexcept = default;
};

}  // namespace alloy::capi

template <>
struct alloy::stream_traits<alloy::capi::key_stream> {
  struct event_type {};
  static bool create(event_type&) noexcept { return true; }
  static void destroy(event_type&) noexcept {}
  static bool record(event_type&, alloy::capi::key_stream) noexcept { return true; }
  static bool wait(alloy::capi::key_stream, const event_type&) noexcept { return true; }
  static bool ready(const event_type&) noexcept { return true; }
  static void synchronize(const event_type&) noexcept {}
  static void synchronize(alloy::capi::key_stream) noexcept {}
};

namespace alloy::capi {

std::unique_ptr<device_heap> make_host_heap(const config& c, int /*device*/, std::size_t limit) {
  // Host memory has no limit of its own: the device's limit is the backend's capacity too.
  struct backend : host_vmm {
    explicit backend(std::size_t bytes) : host_vmm(options{.capacity = bytes}) {}
  };
  switch (c.composition) {
    case composition_kind::virtual_memory: {
      using heap_t = virtual_allocator<capped_vmm<host_vmm>>;
      return std::make_unique<heap_of<heap_t, key_stream, backend>>(
          c.history, limit, true, [](device_state* s, backend* b) { return heap_t{capped_vmm<host_vmm>{b, s}}; });
    }
    case composition_kind::default_heap: {
      using heap_t = default_allocator<capped_upstream<host_upstream>>;
      return std::make_unique<heap_of<heap_t, key_stream>>(c.history, limit, false, [](device_state* s, no_backend*) {
        return heap_t{capped_upstream<host_upstream>{s}};
      });
    }
    case composition_kind::caching: {
      using heap_t = caching_allocator<capped_upstream<host_upstream>>;
      return std::make_unique<heap_of<heap_t, key_stream>>(c.history, limit, false, [](device_state* s, no_backend*) {
        return heap_t{capped_upstream<host_upstream>{s}};
      });
    }
  }
  return nullptr;
}

}  // namespace alloy::capi
