// SPDX-License-Identifier: Apache-2.0
// src/capi/config.hpp: liballoy's configuration string ("composition:virtual,capacity:8GiB").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace alloy::capi {

/// Allocation events a device keeps for snapshots, at most (`history`, `alloy_record_history`).
inline constexpr std::size_t max_history = std::size_t{1} << 28;

enum class composition_kind { virtual_memory, default_heap, caching };
enum class backend_kind { cuda, host };

/// What `alloy_configure` / `ALLOY_CONF` set. `capacity_bytes` and `capacity_fraction` are
/// exclusive; both 0 means the device's memory.
struct config {
  composition_kind composition = composition_kind::virtual_memory;
  backend_kind backend = backend_kind::cuda;
  std::size_t capacity_bytes = 0;
  double capacity_fraction = 0.0;
  std::size_t history = 0;  ///< events kept per device; 0: off; at most `max_history`
  int devices = 1;          ///< simulated devices (backend host)
  bool devices_given = false;

  /// The configuration in the same syntax, every key spelled out.
  std::string to_string() const;
};

/// Why a configuration string was refused: the status of capi.h and a message naming the key or
/// value.
struct config_error {
  int status = 0;
  std::string message;
};

/// Parses `text` (NULL or empty: the defaults). On success returns true and fills `out`; else
/// fills `error` and leaves `out` as it was.
bool parse_config(std::string_view text, config& out, config_error& error);

/// Reads a byte count with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; case
/// insensitive; a decimal number allowed: "1.5GiB"). False when it is not one.
bool parse_bytes(std::string_view text, std::size_t& out);

}  // namespace alloy::capi
