/* SPDX-License-Identifier: MIT */
/*
 * mma_kind.h — the tensor-core kernels' input kinds (their template argument kIn), shared by
 * cuda/mma.cuh and the warp emulator's stand-in for it (tests/cuda_emu/mma.cuh):
 *   FA_IN_F16       fp16, mma.sync m16n8k16 (sm_80 and later)
 *   FA_IN_BF16      bf16, mma.sync m16n8k16 (sm_80 and later)
 *   FA_IN_F16_SM75  fp16 on Turing's instructions: each m16n8k16 as two m16n8k8, f16x2 packed
 *                   by two cvt.rn.f16.f32 (sm_75 and later). Turing has no bf16 tensor cores:
 *                   bf16 takes the fp32 kernels there.
 * A kind's kernels are chosen from the device's compute capability (plugin.cu); on sm_80 and
 * later FA_CUDA_KERNELS=sm75 runs the Turing kind instead, so a newer GPU tests its code.
 */
#ifndef FA_CUDA_MMA_KIND_H
#define FA_CUDA_MMA_KIND_H

enum { FA_IN_F16 = 0, FA_IN_BF16 = 1, FA_IN_F16_SM75 = 2 };

/* Is kind k bf16 (else fp16)? */
#define FA_IN_IS_BF16(k) ((k) == FA_IN_BF16)

#endif /* FA_CUDA_MMA_KIND_H */
