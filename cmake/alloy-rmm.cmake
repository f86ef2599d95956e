# SPDX-License-Identifier: Apache-2.0
# RMM (the RAPIDS Memory Manager) as an optional peer of the GPU benchmarks, never required.
# Found where scripts/fetch-rmm unpacks the librmm-cu13 and rapids-logger wheels (.deps/rmm) or
# under ALLOY_RMM_ROOT (a cache variable or the environment), by the wheel's CMake config
# (lib64/cmake/rmm/rmm-config.cmake) and its version file. Defines the target alloy_rmm and sets
# ALLOY_HAS_RMM; without RMM nothing changes.
#
# The config's find_package(rmm) is not called: the project has already imported the toolkit's
# CCCL (CCCL::* targets, global; CUDA 13.0 ships CCCL 3.0.1), while RMM 26.10 needs the CCCL it
# ships (3.5, under include/rapids) and would import the same target names again. alloy_rmm therefore names the
# wheel's parts itself: its CCCL first on the include path (ahead of the toolkit's, for every
# file that links it), RMM's and rapids-logger's headers, librmm.so and librapids_logger.so, and
# the definitions RMM's config puts on CCCL.
set(ALLOY_RMM_ROOT "$ENV{ALLOY_RMM_ROOT}" CACHE PATH "Where the librmm and rapids_logger wheels are unpacked")
set(ALLOY_HAS_RMM OFF)
set(alloy_rmm_hints ${ALLOY_RMM_ROOT} ${PROJECT_SOURCE_DIR}/.deps/rmm)
find_path(ALLOY_RMM_CONFIG_DIR rmm-config.cmake HINTS ${alloy_rmm_hints}
          PATH_SUFFIXES librmm/lib64/cmake/rmm lib64/cmake/rmm lib/cmake/rmm NO_DEFAULT_PATH)
find_path(ALLOY_RAPIDS_LOGGER_CONFIG_DIR rapids_logger-config.cmake HINTS ${alloy_rmm_hints}
          PATH_SUFFIXES rapids_logger/lib64/cmake/rapids_logger lib64/cmake/rapids_logger NO_DEFAULT_PATH)
if(NOT ALLOY_RMM_CONFIG_DIR OR NOT ALLOY_RAPIDS_LOGGER_CONFIG_DIR OR NOT ALLOY_NVCC)
  if(ALLOY_RMM_ROOT)
    message(WARNING "alloy: ALLOY_RMM_ROOT=${ALLOY_RMM_ROOT} holds no usable RMM (or no nvcc); the RMM peers are off")
  endif()
  return()
endif()

get_filename_component(alloy_rmm_prefix "${ALLOY_RMM_CONFIG_DIR}/../../.." ABSOLUTE)
get_filename_component(alloy_logger_prefix "${ALLOY_RAPIDS_LOGGER_CONFIG_DIR}/../../.." ABSOLUTE)
function(alloy_rmm_version out)  # the version file's variables stay in here
  set(PACKAGE_FIND_VERSION 0)
  include(${ALLOY_RMM_CONFIG_DIR}/rmm-config-version.cmake)
  set(${out} ${PACKAGE_VERSION} PARENT_SCOPE)
endfunction()
alloy_rmm_version(ALLOY_RMM_VERSION)
find_library(ALLOY_RMM_LIBRARY rmm HINTS ${alloy_rmm_prefix}/lib64 NO_DEFAULT_PATH)
find_library(ALLOY_RAPIDS_LOGGER_LIBRARY rapids_logger HINTS ${alloy_logger_prefix}/lib64 NO_DEFAULT_PATH)
if(NOT ALLOY_RMM_LIBRARY OR NOT ALLOY_RAPIDS_LOGGER_LIBRARY OR NOT EXISTS ${alloy_rmm_prefix}/include/rapids/cuda)
  message(WARNING "alloy: RMM's config is at ${ALLOY_RMM_CONFIG_DIR} but librmm.so, librapids_logger.so or its CCCL is not; the RMM peers are off")
  return()
endif()

add_library(alloy_rmm INTERFACE)
target_include_directories(alloy_rmm SYSTEM BEFORE INTERFACE ${alloy_rmm_prefix}/include/rapids
                           ${alloy_rmm_prefix}/include ${alloy_logger_prefix}/include)
target_link_libraries(alloy_rmm INTERFACE ${ALLOY_RMM_LIBRARY} ${ALLOY_RAPIDS_LOGGER_LIBRARY} CUDA::cudart)
target_compile_definitions(alloy_rmm INTERFACE ALLOY_HAS_RMM=1 ALLOY_RMM_VERSION_STRING="${ALLOY_RMM_VERSION}"
                           CUB_DISABLE_NAMESPACE_MAGIC CUB_IGNORE_NAMESPACE_MAGIC_ERROR
                           THRUST_DISABLE_ABI_NAMESPACE THRUST_IGNORE_ABI_NAMESPACE_ERROR CCCL_DISABLE_PDL)
# The programs find librmm.so and librapids_logger.so where they were found here.
set_target_properties(alloy_rmm PROPERTIES INTERFACE_LINK_OPTIONS
                      "LINKER:-rpath,${alloy_rmm_prefix}/lib64:${alloy_logger_prefix}/lib64")
set(ALLOY_HAS_RMM ON)
message(STATUS "alloy: RMM ${ALLOY_RMM_VERSION} found at ${alloy_rmm_prefix}: the GPU benchmarks' RMM peers are on")
