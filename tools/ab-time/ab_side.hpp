// SPDX-License-Identifier: Apache-2.0
// tools/ab-time/ab_side.hpp: what one side of an A/B timing exports (ab_side.cpp, compiled once per
// tree into a shared object) and the driver (ab_driver.cpp) calls. Plain C, so that the two
// objects and the driver share no C++ types.
#pragma once

extern "C" {

/// One replay's figures. The behaviour figures (served, device calls, peak bytes, faults) come
/// from a checked run and say whether the two sides did the same thing.
struct alloy_ab_figures {
  double cold_ns_per_op;  ///< a fresh allocator (timed runs only)
  double warm_ns_per_op;  ///< the same allocator over the trace again (timed runs only)
  unsigned long long served;
  unsigned long long device_calls;  ///< map + unmap calls, or upstream allocations + frees
  unsigned long long peak_bytes;    ///< peak mapped, or peak reserved
  unsigned long long faults;        ///< wrong answers the checked replay found (overlaps, misalignment ...)
};

/// Replays the trace at `path` (read once per side and kept) through `composition`
/// ("virtual_allocator", "virtual_arena" or "default_allocator"): checked (behaviour figures) when
/// `checked` is non-zero, else timed. 0 on success; -1 for an unknown composition, -2 when the
/// trace cannot be read (the reason on stderr).
int alloy_ab_replay(const char* path, const char* composition, int checked, alloy_ab_figures* out);

/// W1 (bench/support/pairs_workload.hpp, seed `w1_params().seed + 1000 * seed_index`): ns per
/// free + allocate pair in `cold_ns_per_op`, the device's figures beside it. 0 on success, -1 for
/// an unknown composition.
int alloy_ab_w1(unsigned seed_index, const char* composition, alloy_ab_figures* out);
}
