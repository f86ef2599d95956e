// SPDX-License-Identifier: Apache-2.0
// alloy/detail/passes_on.hpp: the former name of the queries base (see detail/forwarding.hpp).
#pragma once

#include <alloy/detail/forwarding.hpp>

namespace alloy::detail {

/// Base (CRTP) of policies whose non-allocating capabilities are their inner part's, passed on
/// untouched; now `forwards_queries` (detail/forwarding.hpp), kept under this name for policies
/// written against it.
template <class Derived, class Inner>
using passes_on_capabilities = forwards_queries<Derived, Inner>;

}  // namespace alloy::detail
