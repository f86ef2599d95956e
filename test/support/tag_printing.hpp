// SPDX-License-Identifier: Apache-2.0
// test/support/tag_printing.hpp: Boost.Test prints tag states and offload results by name.
#pragma once

#include <ostream>

#include <alloy/tag.hpp>

namespace alloy {
inline std::ostream& operator<<(std::ostream& o, offload_status s) { return o << to_string(s); }
inline std::ostream& operator<<(std::ostream& o, tag_state s) { return o << to_string(s); }
}  // namespace alloy
