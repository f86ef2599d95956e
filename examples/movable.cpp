// SPDX-License-Identifier: Apache-2.0
// README "Movable memory": a full "device" serves a request by compacting its heap, then by
// spilling an idle buffer to host memory; the buffer comes back, intact, when it is locked.
#include <cstdio>
#include <cstring>

#include <alloy/alloy.hpp>

using namespace alloy::literals;

int main() {
  // A 16 MiB "device" that compacts (host memory here; cuda_malloc_upstream on a GPU), over
  // host memory that takes the spills.
  using arena = alloy::best_fit_arena<alloy::host_upstream>;
  using device = alloy::compacting_defragmenter<arena>;
  alloy::host_spill_reclaimer<device, alloy::host_upstream> alloc{
      device{arena{{}, {.initial_size = 16_MiB, .maximum_size = 16_MiB}}}};

  alloy::movable_buffer a{alloc, 4_MiB}, b{alloc, 4_MiB}, c{alloc, 4_MiB}, x{alloc, 4_MiB};
  std::memset(a.lock().data(), 'a', a.size());  // a view is a lock; it ends with the view
  b.reset();
  x.reset();  // 8 MiB free, in two holes of 4 MiB: a | free | c | free
  {
    auto view = c.lock();                   // locked: c stays where it is, whatever happens
    alloy::movable_buffer d{alloc, 8_MiB};  // compaction moves a to open 8 MiB: free | c | a
    alloy::movable_buffer e{alloc, 4_MiB};  // nothing free, nothing to compact: a goes to host
  }
  auto view = a.lock();  // back on the device, content intact
  const alloy::movable_counters s = alloc.movable_statistics();
  std::printf("moved %zu MiB, spilled %zu MiB\n", s.bytes_defragged >> 20, s.bytes_reclaimed >> 20);
  const auto* p = static_cast<const unsigned char*>(view.data());
  const bool intact = p[0] == 'a' && std::memcmp(p, p + 1, a.size() - 1) == 0;
  return intact && s.bytes_defragged == 4_MiB && s.bytes_reclaimed == 4_MiB && s.num_restores == 1 ? 0 : 1;
}
