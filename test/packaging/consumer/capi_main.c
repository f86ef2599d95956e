/* SPDX-License-Identifier: Apache-2.0 */
/* A C consumer of liballoy (alloy::capi): alloy/capi.h is C, and the library serves it. */
#include <stdio.h>

#include <alloy/capi.h>

int main(void) {
  if (alloy_configure("backend:host,devices:2,capacity:64MiB") != 0) return 1;
  void* p = alloy_torch_malloc(1000, 1, (cudaStream_t)0);
  if (p == NULL || alloy_device_count() != 2) return 1;
  alloy_torch_free(p, 1000, 1, (cudaStream_t)0);
  if (alloy_torch_malloc((size_t)1 << 40, 0, (cudaStream_t)0) != NULL || alloy_last_oom(0)[0] == '\0') return 1;
  printf("capi consumer: ok (%s)\n", alloy_configuration());
  return 0;
}
