# SPDX-License-Identifier: Apache-2.0
# Settings for alloy's own tests, examples and benchmarks (never applied to consumers).

# nvcc for the .cu files, when present.
set(ALLOY_NVCC OFF)
if(ALLOY_ENABLE_NVCC AND ALLOY_WITH_CUDA AND NOT ALLOY_SANITIZE AND NOT ALLOY_SANITIZE_THREAD AND NOT ALLOY_FUZZ)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # H100/H200; one architecture keeps the build short
    endif()
    enable_language(CUDA)
    set(ALLOY_NVCC ON)
  endif()
endif()
message(STATUS "alloy: CUDA toolkit ${ALLOY_WITH_CUDA}, nvcc builds ${ALLOY_NVCC}, sanitizers ${ALLOY_SANITIZE}")

# A Thrust target on Thrust's host backend, so Thrust code paths run for real without a GPU.
set(ALLOY_THRUST_HOST OFF)
if(ALLOY_WITH_CUDA)
  find_package(Thrust CONFIG HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake")
  if(Thrust_FOUND)
    thrust_create_target(alloy_thrust_host HOST CPP DEVICE CPP)
    set(ALLOY_THRUST_HOST ON)
  endif()
endif()

add_library(alloy_dev_flags INTERFACE)
target_compile_options(alloy_dev_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror=return-type>
  # CMake 3.25 has no CUDA20 dialect for nvcc 13, so the flag is spelled out.
  $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr -Xcompiler=-Wall>)
if(ALLOY_WERROR)
  # The project's own targets only (tests, benchmarks, examples, tools): users' flags are theirs.
  target_compile_options(alloy_dev_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wshadow -Wconversion -Wsign-conversion -Werror>)
endif()
if(ALLOY_SANITIZE_THREAD)
  target_compile_options(alloy_dev_flags INTERFACE -fsanitize=thread -fno-omit-frame-pointer)
  target_link_options(alloy_dev_flags INTERFACE -fsanitize=thread)
endif()
if(ALLOY_FUZZ AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "alloy: ALLOY_FUZZ needs clang (configure with CC=clang CXX=clang++)")
endif()
if(ALLOY_SANITIZE OR ALLOY_FUZZ)
  # The libFuzzer target adds its own instrumentation (test/fuzz/).
  # A target with the property ALLOY_UBSAN_NO_NULL keeps UBSan's null check off (see test/).
  target_compile_options(alloy_dev_flags INTERFACE
    -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
    $<$<BOOL:$<TARGET_PROPERTY:ALLOY_UBSAN_NO_NULL>>:-fno-sanitize=null>)
  target_link_options(alloy_dev_flags INTERFACE -fsanitize=address,undefined)
endif()
