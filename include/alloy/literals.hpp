// SPDX-License-Identifier: Apache-2.0
// alloy/literals.hpp: byte-size literals, `64_MiB` instead of `64u << 20`.
#pragma once

#include <cstddef>

namespace alloy::literals {

constexpr std::size_t operator""_KiB(unsigned long long n) noexcept { return static_cast<std::size_t>(n) << 10; }
constexpr std::size_t operator""_MiB(unsigned long long n) noexcept { return static_cast<std::size_t>(n) << 20; }
constexpr std::size_t operator""_GiB(unsigned long long n) noexcept { return static_cast<std::size_t>(n) << 30; }

}  // namespace alloy::literals
