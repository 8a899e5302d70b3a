/* SPDX-License-Identifier: MIT */
// cuda.h (emulated) — the two driver types cuda/plugin.cu names; it never calls the driver here
// (emu_runtime.h offers no driver entry points).
#pragma once
typedef struct CUctx_st *CUcontext;
typedef int CUresult;
#define CUDA_SUCCESS 0
