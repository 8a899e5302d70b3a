# SPDX-License-Identifier: MIT
# emu_kernel.cmake — makes the emulator's copy of cuda/fwd_mma.cu (cmake -DSRC=... -DDST=... -P):
# the kernel's `extern __shared__` array becomes emu.h's checked handle and its <<<>>> launch an
# emu::launch call; nothing else changes. Fails if either is not found exactly once, so a
# change to those lines in the kernel shows here instead of testing a stale copy.
file(READ "${SRC}" text)
set(decl "extern __shared__ __align__(128) unsigned char smem[];")
string(REGEX MATCHALL "extern __shared__" decls "${text}")
string(REGEX MATCHALL "<<<" launches "${text}")
list(LENGTH decls ndecl)
list(LENGTH launches nlaunch)
string(FIND "${text}" "${decl}" at)
if(NOT ndecl EQUAL 1 OR NOT nlaunch EQUAL 1 OR at EQUAL -1)
    message(FATAL_ERROR "emu_kernel.cmake: ${SRC} should have one `${decl}` (found ${ndecl} "
                        "extern __shared__) and one <<<>>> launch (found ${nlaunch})")
endif()
string(REPLACE "${decl}" "EMU_SMEM_DECL;" text "${text}")
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*<[^<>]*>)<<<([^>]*)>>>\\(([^)]*)\\)"
       "EMU_LAUNCH(\\1, \\2, \\3)" text "${text}")
string(FIND "${text}" "<<<" left)
if(NOT left EQUAL -1)
    message(FATAL_ERROR "emu_kernel.cmake: the launch in ${SRC} is not of the form "
                        "kernel<...><<<...>>>(...)")
endif()
file(WRITE "${DST}"
     "/* Generated from ${SRC} by tests/cuda_emu/emu_kernel.cmake: do not edit. */\n${text}")
