// SPDX-License-Identifier: Apache-2.0
// test/support/sanitizers.hpp: what the tests need to know about the sanitizer they run under.
#pragma once

namespace alloy::testing {

/// Whether ThreadSanitizer instruments this build (every access checked, 5-15x slower): threaded
/// tests shorten their runs under it.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool under_tsan = true;
#elif defined(__has_feature)
#  if __has_feature(thread_sanitizer)
inline constexpr bool under_tsan = true;
#  else
inline constexpr bool under_tsan = false;
#  endif
#else
inline constexpr bool under_tsan = false;
#endif

}  // namespace alloy::testing
