// SPDX-License-Identifier: Apache-2.0
// alloy/alloy.hpp: the core, the upstreams and every policy; no adaptor (docs/design.md#adaptors).
#pragma once

#include <alloy/block.hpp>
#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/device.hpp>
#include <alloy/error.hpp>
#include <alloy/find.hpp>
#include <alloy/host_stream.hpp>
#include <alloy/literals.hpp>
#include <alloy/movable.hpp>
#include <alloy/ref.hpp>
#include <alloy/simulated_devices.hpp>
#include <alloy/statistics.hpp>
#include <alloy/stream.hpp>

#include <alloy/upstream/host_upstream.hpp>
#include <alloy/upstream/null_upstream.hpp>
#include <alloy/vmm/host_vmm.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>
#include <alloy/vmm/virtual_memory.hpp>
#if ALLOY_HAS_CUDA
#  include <alloy/cuda_info.hpp>
#  include <alloy/upstream/cuda_async_upstream.hpp>
#  include <alloy/upstream/cuda_malloc_upstream.hpp>
#  include <alloy/upstream/managed_upstream.hpp>
#  include <alloy/upstream/pinned_host_upstream.hpp>
#  include <alloy/vmm/cuda_vmm.hpp>
#endif

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

#include <alloy/memory_stats.hpp>
#include <alloy/snapshot.hpp>
