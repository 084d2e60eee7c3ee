# The libcuda.so.1 stand-in that hands XLA's allocations to the lake
# (cc/shim/README.md), its tests over the fake GPU, and the CUDA backend's link
# needs. Included by CMakeLists.txt after the libraries are defined.

# The CUDA backend (cc/vmm/cuda_driver.cc, in jaxlake_vmm) opens the driver
# with dlopen.
target_link_libraries(jaxlake_vmm PUBLIC ${CMAKE_DL_LIBS})

set(jaxlake_shim_supported OFF)
if(CMAKE_SYSTEM_NAME STREQUAL "Linux" AND
   CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(jaxlake_shim_supported ON)
endif()
option(JAXLAKE_BUILD_SHIM "Build the libcuda.so.1 shim (x86-64 Linux only)"
       ${jaxlake_shim_supported})
if(JAXLAKE_BUILD_SHIM AND NOT jaxlake_shim_supported)
  message(FATAL_ERROR "JAXLAKE_BUILD_SHIM: the shim supports x86-64 Linux "
                      "only, not ${CMAKE_SYSTEM_NAME}/${CMAKE_SYSTEM_PROCESSOR}")
endif()

if(JAXLAKE_BUILD_SHIM)
  # The entry points defined in C++ (cc/shim/hooks.cc) are the rows of
  # cc/shim/hooked.inc; every other name of the symbol list gets a generated
  # forwarding trampoline.
  set(jaxlake_shim_hooked "${PROJECT_SOURCE_DIR}/cc/shim/hooked.inc")
  set(jaxlake_shim_symbols "${PROJECT_SOURCE_DIR}/cc/shim/cuda_symbols.txt")
  set(jaxlake_shim_forward
      "${CMAKE_CURRENT_BINARY_DIR}/generated/cc/shim/cuda_forward.cc")
  add_custom_command(
    OUTPUT "${jaxlake_shim_forward}"
    COMMAND "${CMAKE_COMMAND}" "-DSYMBOLS=${jaxlake_shim_symbols}"
            "-DHOOKED=${jaxlake_shim_hooked}"
            "-DOUTPUT=${jaxlake_shim_forward}"
            -P "${PROJECT_SOURCE_DIR}/cc/shim/gen_trampolines.cmake"
    DEPENDS "${jaxlake_shim_symbols}" "${jaxlake_shim_hooked}"
            "${PROJECT_SOURCE_DIR}/cc/shim/gen_trampolines.cmake"
    COMMENT "Generating the CUDA shim's forwarding trampolines"
    VERBATIM)

  add_library(jaxlake_shim SHARED ${JAXLAKE_SHIM_SOURCES}
                                  "${jaxlake_shim_forward}")
  target_link_libraries(jaxlake_shim PRIVATE jaxlake_lake jaxlake_vmm
                        ${CMAKE_DL_LIBS} Threads::Threads)
  if(DEFINED SKBUILD_PROJECT_VERSION)
    set(jaxlake_shim_version "${SKBUILD_PROJECT_VERSION}")
  else()
    set(jaxlake_shim_version "dev")
  endif()
  target_compile_definitions(jaxlake_shim PRIVATE
    JAXLAKE_SHIM_VERSION="${jaxlake_shim_version}")
  # The file is libcuda.so.1 with that SONAME, so that once it is loaded a
  # dlopen("libcuda.so.1") returns it. Only the driver names and the
  # jaxlake_shim_* API are exported: the project's code is hidden, the
  # static libraries' symbols are made local (--exclude-libs), and the
  # version script keeps everything else (template instances) local too.
  set_target_properties(jaxlake_shim PROPERTIES
    PREFIX "" OUTPUT_NAME "libcuda" SUFFIX ".so.1" NO_SONAME ON
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/jaxlake_shim")
  set(jaxlake_shim_exports "${PROJECT_SOURCE_DIR}/cc/shim/exports.map")
  target_link_options(jaxlake_shim PRIVATE
    "LINKER:-soname,libcuda.so.1" "LINKER:--exclude-libs,ALL"
    "LINKER:--version-script=${jaxlake_shim_exports}")
  set_property(TARGET jaxlake_shim APPEND PROPERTY
    LINK_DEPENDS "${jaxlake_shim_exports}")
  # No undefined symbols (except in sanitizer builds, whose runtime the
  # executable provides).
  if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
    target_link_options(jaxlake_shim PRIVATE "LINKER:-z,defs")
  endif()
  jaxlake_warnings(jaxlake_shim)

  if(JAXLAKE_BUILD_PYTHON)
    install(TARGETS jaxlake_shim LIBRARY DESTINATION jaxlake/_lib)
  endif()

  # The fake GPU (cc/fakegpu/README.md): one library that `jaxlake run
  # --fake-gpu` links under the names of NVIDIA's driver, NVML, runtime,
  # cuDNN, cuBLAS(Lt), NCCL, cuFFT, CUPTI, cuSPARSE and cuSOLVER. Its own
  # calls between those libraries bind inside it (-Bsymbolic), not to the
  # shim's driver names. No LTO: the weak stubs of stubs.cc and the
  # implemented entry points are the same symbols with other signatures.
  add_library(jaxlake_fakegpu SHARED ${JAXLAKE_FAKEGPU_SOURCES})
  target_link_libraries(jaxlake_fakegpu PRIVATE jaxlake_vmm ${CMAKE_DL_LIBS}
                        Threads::Threads)
  set_target_properties(jaxlake_fakegpu PROPERTIES
    OUTPUT_NAME "jaxlake_fakegpu"
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    INTERPROCEDURAL_OPTIMIZATION OFF INTERPROCEDURAL_OPTIMIZATION_RELEASE OFF
    INTERPROCEDURAL_OPTIMIZATION_RELWITHDEBINFO OFF
    LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/jaxlake_shim")
  target_link_options(jaxlake_fakegpu PRIVATE "LINKER:-Bsymbolic"
                      "LINKER:--exclude-libs,ALL")
  if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
    target_link_options(jaxlake_fakegpu PRIVATE "LINKER:-z,defs")
  endif()
  jaxlake_warnings(jaxlake_fakegpu)
  if(JAXLAKE_BUILD_PYTHON)
    install(TARGETS jaxlake_fakegpu LIBRARY DESTINATION jaxlake/_lib)
  endif()

  if(JAXLAKE_BUILD_TESTS)
    enable_testing()
    # The shim's tests run over the fake GPU, loaded by path as the real
    # driver (its control API: cc/fakegpu/control.h).
    # The CUDA backend itself over the fake GPU.
    add_executable(cuda_driver_test tests/shim/cuda_driver_test.cc)
    target_link_libraries(cuda_driver_test PRIVATE jaxlake_lake jaxlake_vmm)
    target_compile_definitions(cuda_driver_test PRIVATE
      JAXLAKE_FAKEGPU_PATH="$<TARGET_FILE:jaxlake_fakegpu>")
    add_dependencies(cuda_driver_test jaxlake_fakegpu)
    jaxlake_warnings(cuda_driver_test)
    add_test(NAME cuda_driver_test COMMAND cuda_driver_test)
    set_tests_properties(cuda_driver_test PROPERTIES TIMEOUT 120)
    # The driver conformance suite (tests/cc/driver_suite.h) over it.
    add_executable(cuda_conformance_test tests/shim/cuda_conformance_test.cc)
    target_link_libraries(cuda_conformance_test PRIVATE jaxlake_vmm)
    target_compile_definitions(cuda_conformance_test PRIVATE
      JAXLAKE_FAKEGPU_PATH="$<TARGET_FILE:jaxlake_fakegpu>")
    add_dependencies(cuda_conformance_test jaxlake_fakegpu)
    jaxlake_warnings(cuda_conformance_test)
    add_test(NAME cuda_conformance_test COMMAND cuda_conformance_test)
    set_tests_properties(cuda_conformance_test PROPERTIES TIMEOUT 120)

    add_executable(shim_test tests/shim/shim_test.cc
      tests/shim/shim_hooks_test.cc tests/shim/shim_capture_test.cc
      tests/shim/shim_pressure_test.cc)
    target_include_directories(shim_test PRIVATE "${PROJECT_SOURCE_DIR}")
    target_link_libraries(shim_test PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
    target_compile_definitions(shim_test PRIVATE
      JAXLAKE_SHIM_PATH="$<TARGET_FILE:jaxlake_shim>"
      JAXLAKE_FAKEGPU_PATH="$<TARGET_FILE:jaxlake_fakegpu>"
      JAXLAKE_SYMBOLS_PATH="${jaxlake_shim_symbols}")
    add_dependencies(shim_test jaxlake_shim jaxlake_fakegpu)
    jaxlake_warnings(shim_test)
    # The shim reads its options once, at load: each configuration is a
    # process of its own. The default run sets a 64 MiB capacity itself.
    add_test(NAME shim_test COMMAND shim_test)
    # The other configurations run the tests that do not need the lake.
    set(jaxlake_shim_forward_tests first_call configuration dlopen
        every_listed unhooked missing get_proc_address forwarded
        memory_outside)
    add_test(NAME shim_test_hooks_off
             COMMAND shim_test ${jaxlake_shim_forward_tests})
    add_test(NAME shim_test_bad_option
             COMMAND shim_test ${jaxlake_shim_forward_tests})
    # No capacity: the lake may take the whole device.
    set(jaxlake_shim_whole_device_tests capacity_follows beyond_what
        memory_pressure)
    add_test(NAME shim_test_whole_device
             COMMAND shim_test ${jaxlake_shim_whole_device_tests})
    # A driver with cuInit alone: the names it lacks (the fake GPU has all).
    add_library(jaxlake_bare_driver SHARED tests/shim/bare_driver.cc)
    target_include_directories(jaxlake_bare_driver PRIVATE
      "${PROJECT_SOURCE_DIR}")
    set_target_properties(jaxlake_bare_driver PROPERTIES
      OUTPUT_NAME "bare_driver" CXX_VISIBILITY_PRESET hidden
      LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/jaxlake_bare_driver")
    jaxlake_warnings(jaxlake_bare_driver)
    add_dependencies(shim_test jaxlake_bare_driver)
    add_test(NAME shim_test_bare_driver COMMAND shim_test missing)
    set_tests_properties(shim_test_bare_driver PROPERTIES ENVIRONMENT
      "JAXLAKE_REAL_LIBCUDA=$<TARGET_FILE:jaxlake_bare_driver>")
    set_tests_properties(shim_test_hooks_off PROPERTIES
      ENVIRONMENT "JAXLAKE_SHIM_HOOKS=0")
    set_tests_properties(shim_test_bad_option PROPERTIES
      ENVIRONMENT "JAXLAKE_CAPACITY=64MiB")
    set_tests_properties(shim_test_whole_device PROPERTIES
      ENVIRONMENT "JAXLAKE_CAPACITY=0")
    set_tests_properties(shim_test shim_test_hooks_off shim_test_bad_option
                         shim_test_bare_driver shim_test_whole_device
                         PROPERTIES TIMEOUT 120)
  endif()
endif()
