// SPDX-License-Identifier: Apache-2.0
// test/support/gpu.hpp: the precondition GPU tests carry, so they skip visibly without a device.
#pragma once

#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

namespace alloy::testing {

/// True when a CUDA device is usable; otherwise says why, and Boost.Test reports the test as
/// skipped with that reason (CTest marks the program "Skipped").
inline boost::test_tools::assertion_result cuda_device_present(boost::unit_test::test_unit_id) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  cudaGetLastError();
  boost::test_tools::assertion_result present(status == cudaSuccess && devices > 0);
  present.message() << "no CUDA device here (cudaGetDeviceCount: " << cudaGetErrorName(status) << ", " << devices
                    << " devices)";
  return present;
}

}  // namespace alloy::testing

/// Decorators for a test that needs a GPU: labelled `gpu`, skipped with a reason without one.
#define ALLOY_GPU_TEST \
  *boost::unit_test::label("gpu") * boost::unit_test::precondition(alloy::testing::cuda_device_present)
