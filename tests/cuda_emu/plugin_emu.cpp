/* SPDX-License-Identifier: MIT */
// plugin_emu.cpp — the CUDA plug-in built from its own sources as a host library,
// libfa_cuda_emu_plugin.so: cuda/plugin.cu as it is, cuda/fwd_simple.cu, fwd_mma.cu,
// kvcache.cu, decode.cu, combine.cu, bwd_simple.cu and bwd_mma.cu as emu_kernel.cmake copies
// them (launches and the shared-memory array swapped for the emulator's). The same entry point
// and ABI handshake, one emulated device. ctest runs the GPU test suites (tests/test_cuda.c,
// test_cuda_backward.c, test_kvcache.c --cuda, test_combine) against it through FA_CUDA_PLUGIN,
// so the plug-in's host code and every kernel run without a GPU; FA_EMU_SM picks the emulated
// GPU (emu.h).
#include "emu_runtime.h"

#include "fwd_simple_emu.cu"

#include "fwd_mma_emu.cu"

#include "kvcache_emu.cu"

#include "decode_emu.cu"

#include "combine_emu.cu"

#include "bwd_simple_emu.cu"

/* last: its shared-memory array is a global, which the others' would shadow */
#include "bwd_mma_emu.cu"

/* The default build's code (CMakeLists.txt, CUDA 13): an emulated sm_70 has none */
#define FA_CUDA_ARCHS_STR "sm_75 sm_80 sm_90 sm_120 + PTX 80"
#include "plugin.cu" /* cuda/plugin.cu, unchanged */
