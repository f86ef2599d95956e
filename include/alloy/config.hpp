// SPDX-License-Identifier: Apache-2.0
// alloy/config.hpp: build switches and the one place that decides whether CUDA is in reach.
#pragma once

// ALLOY_CHECKED turns on the checks that cost time on the hot path (double free, wrong-size free,
// freeing a foreign pointer; docs/design.md#errors). On by default in debug builds; define it to 0
// or 1 to force.
#ifndef ALLOY_CHECKED
#  ifdef NDEBUG
#    define ALLOY_CHECKED 0
#  else
#    define ALLOY_CHECKED 1
#  endif
#endif

// ALLOY_HAS_CUDA is 1 when the CUDA runtime headers are reachable. Every policy compiles without
// them; only the CUDA upstreams, the copy engine's device path and the device helpers need them.
#ifndef ALLOY_HAS_CUDA
#  if __has_include(<cuda_runtime_api.h>)
#    define ALLOY_HAS_CUDA 1
#  else
#    define ALLOY_HAS_CUDA 0
#  endif
#endif

#define ALLOY_VERSION_MAJOR 0
#define ALLOY_VERSION_MINOR 1
#define ALLOY_VERSION_PATCH 0
