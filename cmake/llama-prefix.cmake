# Finds llama.cpp (>= 0.7) and ggml. Two cases:
#  - MOESTREAM_PREFIX exists (Debian 12: sid's packages extracted by scripts/setup-deps.sh):
#    find the prefix's llama-config.cmake / ggml-config.cmake, and link every executable so
#    that it runs under the prefix's own glibc (see docs/seam.md, "Linking").
#  - otherwise: a distribution with llama.cpp >= 0.7 installed system-wide, plain find_package.
# Exposes: moestream_link_llama(target) for executables, MOESTREAM_GGML_BACKEND_DIR.
# The prefix's multiarch directory is the compiler's target: x86_64-linux-gnu natively on
# amd64, aarch64-linux-gnu natively on arm64 or with cmake/aarch64-linux-gnu.cmake.
set(_triplet "${CMAKE_LIBRARY_ARCHITECTURE}")
if(NOT _triplet)
  set(_triplet "${CMAKE_SYSTEM_PROCESSOR}-linux-gnu")
endif()
if(EXISTS "${MOESTREAM_PREFIX}/usr/lib/${_triplet}/cmake/llama/llama-config.cmake")
  set(_lib "${MOESTREAM_PREFIX}/usr/lib/${_triplet}")
  find_package(llama 0.7 REQUIRED CONFIG PATHS "${_lib}/cmake/llama" NO_DEFAULT_PATH)
  set(MOESTREAM_USING_PREFIX ON)
  set(MOESTREAM_GGML_BACKEND_DIR "${_lib}/ggml/backends0")
  # The prefix glibc's dynamic loader (ld-linux-x86-64.so.2, ld-linux-aarch64.so.1, ...).
  file(GLOB _ld "${_lib}/ld-linux*.so.*")
  list(LENGTH _ld _n_ld)
  if(NOT _n_ld EQUAL 1)
    message(FATAL_ERROR "moestream: want one dynamic loader ld-linux*.so.* in ${_lib}, found: ${_ld} "
                        "(re-run scripts/setup-deps.sh)")
  endif()
  # libllama carries its own RUNPATH, so every library must be a direct NEEDED of the
  # executable (--no-as-needed); the host linker cannot check glibc 2.43 symbol versions.
  set(MOESTREAM_PREFIX_LINK_OPTIONS
      -Wl,--no-as-needed -Wl,--allow-shlib-undefined -Wl,--disable-new-dtags
      -Wl,-rpath,${_lib} -Wl,-rpath,${_lib}/llama
      -Wl,--dynamic-linker=${_ld})
  message(STATUS "moestream: llama.cpp ${llama_VERSION} from private prefix ${MOESTREAM_PREFIX}")
else()
  find_package(llama 0.7 REQUIRED)
  set(MOESTREAM_USING_PREFIX OFF)
  set(MOESTREAM_GGML_BACKEND_DIR "")
  set(MOESTREAM_PREFIX_LINK_OPTIONS "")
  message(STATUS "moestream: system llama.cpp ${llama_VERSION}")
endif()

function(moestream_link_llama target)
  target_link_libraries(${target} PRIVATE llama ggml::ggml ggml::ggml-base)
  target_link_options(${target} PRIVATE ${MOESTREAM_PREFIX_LINK_OPTIONS})
endfunction()
