# cmake/aarch64-linux-gnu.cmake — CMake toolchain file: build moestream for arm64 Linux on an
# x86-64 Debian 12 machine with Debian's cross compiler (docs/arm64.md, "Cross build").
#
#   scripts/setup-deps.sh --arch arm64     # cross compiler, qemu-user-static, .deps/arm64/
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#
# Libraries come from two trees made by setup-deps.sh: .deps/arm64/prefix (Debian sid's arm64
# llama.cpp / ggml and their runtime, deps/debian.lock: the same layout as the native prefix,
# so cmake/llama-prefix.cmake links against it as it does natively) and .deps/arm64/host (arm64
# copies of the bookworm build libraries, deps/cross.lock: liburing, GoogleTest, cpp-httplib).
# Header-only libraries (nlohmann-json, CLI11) are the host's. The binaries run on the prefix's
# glibc through its loader (an absolute path into .deps/arm64/prefix), natively on an arm64
# machine that has the same tree, or here under qemu-aarch64 (scripts/arm64-gates.sh).
# Env knob (read here): MOESTREAM_DEPS_DIR (as setup-deps.sh; the trees are in its arm64/).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Test executables run (gtest_discover_tests, ctest) under Debian's user-mode emulator.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)

get_filename_component(_ms_repo "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
if(DEFINED ENV{MOESTREAM_DEPS_DIR} AND NOT "$ENV{MOESTREAM_DEPS_DIR}" STREQUAL "")
  set(_ms_deps "$ENV{MOESTREAM_DEPS_DIR}/arm64")
else()
  set(_ms_deps "${_ms_repo}/.deps/arm64")
endif()
set(MOESTREAM_PREFIX "${_ms_deps}/prefix" CACHE PATH "arm64 prefix (scripts/setup-deps.sh --arch arm64)")
set(MOESTREAM_CROSS_HOST "${_ms_deps}/host" CACHE PATH
    "arm64 copies of the bookworm build libraries (scripts/setup-deps.sh --arch arm64)")
if(NOT EXISTS "${MOESTREAM_CROSS_HOST}/usr/lib/aarch64-linux-gnu/liburing.a")
  message(FATAL_ERROR "moestream: ${MOESTREAM_CROSS_HOST} is incomplete: run scripts/setup-deps.sh --arch arm64")
endif()

# Libraries only from the arm64 trees and the cross toolchain's own; headers and CMake package
# files there first, then the host's (header-only packages).
set(CMAKE_FIND_ROOT_PATH "${MOESTREAM_CROSS_HOST}" "${MOESTREAM_PREFIX}" /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# Arch-specific headers (openssl's configuration.h, which cpp-httplib's header includes) live in
# the multiarch include directory, which the cross compiler does not search on its own.
set(CMAKE_C_FLAGS_INIT "-isystem ${MOESTREAM_CROSS_HOST}/usr/include/aarch64-linux-gnu -isystem ${MOESTREAM_CROSS_HOST}/usr/include")
set(CMAKE_CXX_FLAGS_INIT "${CMAKE_C_FLAGS_INIT}")
# pkg-config (cpp-httplib): the arm64 .pc files only, their paths inside the host tree.
set(ENV{PKG_CONFIG_LIBDIR} "${MOESTREAM_CROSS_HOST}/usr/lib/aarch64-linux-gnu/pkgconfig:${MOESTREAM_CROSS_HOST}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${MOESTREAM_CROSS_HOST}")
# cpp-httplib and brotli are shared libraries of the host tree: found there at run time too.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,-rpath,${MOESTREAM_CROSS_HOST}/usr/lib/aarch64-linux-gnu -Wl,-rpath-link,${MOESTREAM_PREFIX}/usr/lib/aarch64-linux-gnu")
