// SPDX-License-Identifier: Apache-2.0
#include "config.hpp"

#include <alloy/capi.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace alloy::capi {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A decimal number (digits, at most one point), no sign, no exponent: what a person writes.
bool parse_decimal(std::string_view s, double& out) {
  if (s.empty()) return false;
  bool point = false;
  bool digit = false;
  for (char c : s) {
    if (c == '.') {
      if (point) return false;
      point = true;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      digit = true;
    } else {
      return false;
    }
  }
  if (!digit) return false;
  out = std::strtod(std::string(s).c_str(), nullptr);
  return std::isfinite(out);
}

bool parse_count(std::string_view s, std::size_t& out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && end == s.data() + s.size();
}

// A key or value as a message quotes it: a very long one cut, so that the message stays readable.
std::string shown(std::string_view s) {
  std::size_t most = 64;
  if (s.size() <= most) return std::string(s);
  while (most > 0 && (static_cast<unsigned char>(s[most]) & 0xC0) == 0x80) --most;  // not inside a UTF-8 character
  return std::string(s.substr(0, most)) + "...";
}

void fail(config_error& error, int status, std::string message) {
  error.status = status;
  error.message = std::move(message);
}

}  // namespace

bool parse_bytes(std::string_view text, std::size_t& out) {
  text = trim(text);
  std::size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  double number = 0;
  if (!parse_decimal(text.substr(0, digits), number)) return false;
  const std::string unit = lower(trim(text.substr(digits)));
  struct named_unit {
    const char* name;
    double factor;
  };
  static constexpr named_unit units[] = {
      {"", 1.0},    {"b", 1.0},      {"kb", 1e3},        {"mb", 1e6},           {"gb", 1e9},
      {"tb", 1e12}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const named_unit& u : units) {
    if (unit != u.name) continue;
    const double bytes = std::floor(number * u.factor);
    if (bytes >= static_cast<double>(std::numeric_limits<std::size_t>::max())) return false;
    out = static_cast<std::size_t>(bytes);
    return true;
  }
  return false;
}

bool parse_config(std::string_view text, config& out, config_error& error) {
  config c;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view entry = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (entry.empty()) continue;
    const std::size_t colon = entry.find(':');
    if (colon == std::string_view::npos) {
      fail(error, ALLOY_ERROR_BAD_VALUE, "alloy: configuration entry '" + shown(entry) + "' has no value (key:value)");
      return false;
    }
    const std::string key = lower(trim(entry.substr(0, colon)));
    const std::string_view raw = trim(entry.substr(colon + 1));
    const std::string value = lower(raw);
    const auto bad = [&](const std::string& why) {
      fail(error, ALLOY_ERROR_BAD_VALUE, "alloy: bad value '" + shown(raw) + "' for " + key + ": " + why);
      return false;
    };
    if (key == "composition") {
      if (value == "virtual") c.composition = composition_kind::virtual_memory;
      else if (value == "default") c.composition = composition_kind::default_heap;
      else if (value == "caching") c.composition = composition_kind::caching;
      else return bad("expected virtual, default or caching");
    } else if (key == "backend") {
      if (value == "cuda") c.backend = backend_kind::cuda;
      else if (value == "host") c.backend = backend_kind::host;
      else return bad("expected cuda or host");
    } else if (key == "capacity") {
      double fraction = 0;
      std::size_t bytes = 0;
      // A plain number not above 1 is a fraction of the device; with a unit or above 1, bytes.
      if (parse_decimal(value, fraction) && fraction <= 1.0) {
        if (fraction <= 0.0) return bad("a fraction of the device must be above 0");
        c.capacity_fraction = fraction;
        c.capacity_bytes = 0;
      } else if (parse_decimal(value, fraction) && value.find('.') != std::string::npos) {
        // 1.5 is neither a fraction nor a count of bytes: most likely a unit was left out.
        return bad("a plain number above 1 counts bytes and must be whole; with a unit (1.5GiB) it may have a point");
      } else if (parse_bytes(value, bytes) && bytes > 0) {
        c.capacity_bytes = bytes;
        c.capacity_fraction = 0.0;
      } else {
        return bad("expected bytes with a unit (8GiB, 512MB) or a fraction of the device (0.8)");
      }
    } else if (key == "history") {
      std::size_t n = 0;
      if (!parse_count(value, n) || n > max_history) return bad("expected a count of events, 0 to 268435456");
      c.history = n;
    } else if (key == "devices") {
      std::size_t n = 0;
      if (!parse_count(value, n) || n < 1 || n > 64) return bad("expected a count of simulated devices, 1 to 64");
      c.devices = static_cast<int>(n);
      c.devices_given = true;
    } else {
      fail(error, ALLOY_ERROR_UNKNOWN_KEY,
           "alloy: unknown configuration key '" + shown(trim(entry.substr(0, colon))) +
               "' (known: composition, capacity, history, backend, devices)");
      return false;
    }
  }
  if (c.devices_given && c.backend != backend_kind::host) {
    fail(error, ALLOY_ERROR_BAD_VALUE,
         "alloy: bad value for devices: it applies to backend:host only (CUDA devices are counted)");
    return false;
  }
  out = c;
  return true;
}

std::string config::to_string() const {
  std::string s = std::string("backend:") + (backend == backend_kind::host ? "host" : "cuda");
  s += ",composition:";
  s += composition == composition_kind::virtual_memory ? "virtual"
       : composition == composition_kind::caching      ? "caching"
                                                       : "default";
  s += ",capacity:";
  if (capacity_bytes != 0) {
    s += std::to_string(capacity_bytes) + "B";
  } else if (capacity_fraction != 0.0) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", capacity_fraction);
    s += text;
  } else {
    s += "1";
  }
  s += ",history:" + std::to_string(history);
  if (backend == backend_kind::host) s += ",devices:" + std::to_string(devices);
  return s;
}

}  // namespace alloy::capi
