# Cross toolchain for 64-bit Arm Linux with Debian's cross compiler (gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross). Test programs run through qemu-user (qemu-aarch64), which finds the
# Arm dynamic loader and libc under /usr/aarch64-linux-gnu. Used by scripts/test-aarch64.sh:
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(FA_CROSS_TRIPLE aarch64-linux-gnu)
set(FA_CROSS_SYSROOT /usr/${FA_CROSS_TRIPLE})

set(CMAKE_C_COMPILER ${FA_CROSS_TRIPLE}-gcc)
set(CMAKE_FIND_ROOT_PATH ${FA_CROSS_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# add_test() commands run under qemu-aarch64 (ctest prepends this to the target's path).
find_program(FA_QEMU_AARCH64 qemu-aarch64)
if(FA_QEMU_AARCH64)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${FA_QEMU_AARCH64} -L ${FA_CROSS_SYSROOT})
endif()
