// SPDX-License-Identifier: Apache-2.0
// test/odr/all_headers.hpp: every public header but the Thrust adaptor (which needs Thrust), for
// the two translation units of odr_test. Keep in step with include/alloy (test/headers globs it).
#pragma once

#include <alloy/adaptor/cuda_mr.hpp>
#include <alloy/adaptor/pmr.hpp>
#include <alloy/alloy.hpp>
#include <alloy/block.hpp>
#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/cuda_info.hpp>
#include <alloy/cuda_model.hpp>
#include <alloy/device.hpp>
#include <alloy/error.hpp>
#include <alloy/find.hpp>
#include <alloy/graph_pool.hpp>
#include <alloy/host_stream.hpp>
#include <alloy/literals.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/misuse.hpp>
#include <alloy/movable.hpp>
#include <alloy/movable/buffer.hpp>
#include <alloy/movable/copy_engine.hpp>
#include <alloy/movable/counters.hpp>
#include <alloy/movable/handle_table.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/compacting_defragmenter.hpp>
#include <alloy/policy/fallback.hpp>
#include <alloy/policy/granule_segregator.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>
#include <alloy/policy/limited.hpp>
#include <alloy/policy/logged.hpp>
#include <alloy/policy/per_device.hpp>
#include <alloy/policy/quantizer.hpp>
#include <alloy/policy/segregator.hpp>
#include <alloy/policy/sharded.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/stream_ordered.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/policy/tracked.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/ref.hpp>
#include <alloy/showcase.hpp>
#include <alloy/simulated_devices.hpp>
#include <alloy/snapshot.hpp>
#include <alloy/statistics.hpp>
#include <alloy/stream.hpp>
#include <alloy/tag.hpp>
#include <alloy/upstream/cuda_async_upstream.hpp>
#include <alloy/upstream/cuda_malloc_upstream.hpp>
#include <alloy/upstream/host_upstream.hpp>
#include <alloy/upstream/managed_upstream.hpp>
#include <alloy/upstream/null_upstream.hpp>
#include <alloy/upstream/pinned_host_upstream.hpp>
#include <alloy/vmm/cuda_vmm.hpp>
#include <alloy/vmm/host_vmm.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>
#include <alloy/vmm/virtual_memory.hpp>

#include <cstddef>

#include <alloy/detail/align.hpp>

namespace odr_check {

using arena_t = alloy::stats<alloy::best_fit_arena<alloy::host_upstream>>;
using caching_t = alloy::caching_allocator<alloy::host_upstream>;
using quantized_t = alloy::quantizer<alloy::size_class_pool<alloy::host_upstream>, 1024>;

// Defined in second_tu.cpp: each uses the same inline functions and templates as odr_test.cpp,
// instantiated there too, so the linker must fold them into one definition.
alloy::block allocate_in_second(arena_t& a, std::size_t bytes);
void free_in_second(arena_t& a, alloy::block b);
alloy::block allocate_in_second(caching_t& a, std::size_t bytes);
void free_in_second(caching_t& a, alloy::block b);
alloy::block allocate_in_second(quantized_t& a, std::size_t bytes);
bool free_in_second(quantized_t& a, alloy::block b);
std::size_t round_up_in_second(std::size_t n, std::size_t to);
std::size_t num_allocs_in_second(const arena_t& a);

}  // namespace odr_check
