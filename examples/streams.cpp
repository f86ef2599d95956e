// SPDX-License-Identifier: Apache-2.0
// Stream-ordered allocation, shown with alloy::host_stream (an in-order work queue on its own
// thread) so it runs anywhere; with CUDA, use cudaStream_t as the stream type instead.
#include <cstdio>
#include <cstring>

#include <alloy/alloy.hpp>
#include <alloy/host_stream.hpp>
#include <alloy/policy/stream_ordered.hpp>

int main() {
  using namespace alloy::literals;
  alloy::host_stream copy_stream, compute_stream;

  using arena = alloy::best_fit_arena<alloy::host_upstream>;
  alloy::stream_ordered<arena, alloy::host_stream*> alloc{arena{alloy::host_upstream{}}};

  alloy::block staging = alloc.allocate(1_MiB, 256, &copy_stream);
  copy_stream.enqueue([staging] { std::memset(staging.ptr, 1, staging.size); });
  alloy::host_event copied;  // cudaEventRecord + cudaStreamWaitEvent, for host streams
  alloy::stream_traits<alloy::host_stream*>::record(copied, &copy_stream);
  alloy::stream_traits<alloy::host_stream*>::wait(&compute_stream, copied);
  alloy::record_use(alloc, staging, &compute_stream);  // compute_stream reads it too
  compute_stream.enqueue([staging] { std::printf("first byte %d\n", static_cast<const char*>(staging.ptr)[0]); });
  alloc.deallocate(staging, &copy_stream);  // at once: the work is only enqueued

  // Same memory, other stream: compute_stream waits (on its own side) for both earlier uses.
  alloy::block result = alloc.allocate(1_MiB, 256, &compute_stream);
  compute_stream.enqueue([result] { std::memset(result.ptr, 2, result.size); });
  alloc.deallocate(result, &compute_stream);
  compute_stream.synchronize();

  const alloy::stream_order_counters& c = alloc.order_counters();
  std::printf("events %zu, stream waits %zu, host synchronizations %zu\n", c.events_recorded, c.stream_waits,
              c.host_synchronizations);
  return result.ptr == staging.ptr ? 0 : 1;
}
