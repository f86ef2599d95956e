# SPDX-License-Identifier: Apache-2.0
# liballoy's tests: the C interface over backend:host once per composition, and its exports.
# capture_pools_test includes the library's sources (src/capi) and needs no library.
if(TARGET capi_capture_pools_test)
  target_include_directories(capi_capture_pools_test PRIVATE ${PROJECT_SOURCE_DIR}/src)
endif()
if(NOT TARGET alloy_capi)
  if(TARGET capi_capi_test)
    set_target_properties(capi_capi_test PROPERTIES EXCLUDE_FROM_ALL ON)
    set_tests_properties(capi.capi_test PROPERTIES DISABLED ON)
  endif()
  return()
endif()
target_link_libraries(capi_capi_test PRIVATE alloy_capi)
set(alloy_capi_conf "backend:host,devices:3,capacity:256MiB,history:100000")
set_tests_properties(capi.capi_test PROPERTIES ENVIRONMENT "${ALLOY_TEST_ENV};ALLOY_CONF=${alloy_capi_conf},composition:virtual")
foreach(composition default caching)
  add_test(NAME capi.capi_test.${composition}
    COMMAND capi_capi_test --log_level=test_suite --report_level=short --color_output=false)
  set_tests_properties(capi.capi_test.${composition} PROPERTIES LABELS "host"
    ENVIRONMENT "${ALLOY_TEST_ENV};ALLOY_CONF=${alloy_capi_conf},composition:${composition}")
endforeach()
if(NOT ALLOY_SANITIZE AND NOT ALLOY_SANITIZE_THREAD)
  add_test(NAME capi.exports COMMAND ${CMAKE_COMMAND} -DLIBRARY=$<TARGET_FILE:alloy_capi>
    -DHEADER=${PROJECT_SOURCE_DIR}/include/alloy/capi.h -P ${CMAKE_CURRENT_SOURCE_DIR}/capi/check_exports.cmake)
  set_tests_properties(capi.exports PROPERTIES LABELS "host")
endif()
if(TARGET capi_capi_gpu_test)
  target_link_libraries(capi_capi_gpu_test PRIVATE alloy_capi)
  foreach(composition default caching)
    add_test(NAME capi.capi_gpu_test.${composition}
      COMMAND capi_capi_gpu_test --log_level=test_suite --report_level=short --color_output=false)
    set_tests_properties(capi.capi_gpu_test.${composition} PROPERTIES LABELS "gpu"
      SKIP_REGULAR_EXPRESSION "skipped because precondition failed"
      ENVIRONMENT "${ALLOY_TEST_ENV};ALLOY_CONF=composition:${composition},history:10000")
  endforeach()
endif()
