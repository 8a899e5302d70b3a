/* SPDX-License-Identifier: MIT */
// cuda_runtime.h (emulated) — what the kernel copy and cuda/kernels.h take from the CUDA
// runtime comes from emu.h; found ahead of any real CUDA include folder.
#include "emu.h"
