# SPDX-License-Identifier: MIT
# emu_kernel.cmake — makes the emulator's copy of a cuda/*.cu file (cmake -DSRC=... -DDST=... -P):
#   extern __shared__ __align__(128) unsigned char smem[];   ->  emu.h's checked handle
#   kernel<<<grid, block, smem, stream>>>(args)               ->  kernel ^ emu::LaunchCfg{...}(args)
# and nothing else. Fails if a file has no launch, or an extern __shared__ array of another
# form, so a change to those lines shows here instead of testing a stale or half-made copy.
file(READ "${SRC}" text)
set(decl "extern __shared__ __align__(128) unsigned char smem[];")
string(REGEX MATCHALL "extern __shared__" decls "${text}")
string(REGEX MATCHALL "<<<" launches "${text}")
string(REGEX MATCHALL ">>>" ends "${text}")
list(LENGTH decls ndecl)
list(LENGTH launches nlaunch)
list(LENGTH ends nend)
string(FIND "${text}" "${decl}" at)
if(nlaunch EQUAL 0 OR NOT nlaunch EQUAL nend OR ndecl GREATER 1 OR (ndecl EQUAL 1 AND at EQUAL -1))
    message(FATAL_ERROR "emu_kernel.cmake: ${SRC}: want <<<...>>> launches (found ${nlaunch} "
                        "<<< and ${nend} >>>) and at most one `${decl}` (found ${ndecl} "
                        "extern __shared__)")
endif()
string(REPLACE "${decl}" "EMU_SMEM_DECL;" text "${text}")
string(REPLACE "<<<" " ^ emu::LaunchCfg{" text "${text}")
string(REPLACE ">>>" "}" text "${text}")
file(WRITE "${DST}"
     "/* Generated from ${SRC} by tests/cuda_emu/emu_kernel.cmake: do not edit. */\n${text}")
