/* SPDX-License-Identifier: MIT */
// cuda_runtime.h (emulated) — what the copies of cuda/*.cu and cuda/kernels.h take from the
// CUDA runtime comes from emu.h and emu_runtime.h; found ahead of any real CUDA include folder.
#include "emu_runtime.h"
