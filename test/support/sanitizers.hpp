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

/// Whether AddressSanitizer instruments this build (about 2-3x slower): the longest randomized
/// runs shorten under it too (the release build runs them whole).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool under_asan = true;
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
inline constexpr bool under_asan = true;
#  else
inline constexpr bool under_asan = false;
#  endif
#else
inline constexpr bool under_asan = false;
#endif

}  // namespace alloy::testing
