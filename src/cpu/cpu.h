/* SPDX-License-Identifier: MIT */
/*
 * cpu.h — the CPU backend's entry points, called by api.c after validation.
 */
#ifndef FA_CPU_H
#define FA_CPU_H

#include "../internal.h"
#include "../problem.h"
#include "kernels/kernels.h"

/* The microkernel set in use (chosen once per process) and a note on how it was chosen
 * ("" or why FA_CPU_ISA was not honoured). */
const fa__cpu_kernels *fa__cpu_kernels_get(void);
const char *fa__cpu_kernels_note(void);

/* The names of the kernel sets compiled in, e.g. "ref avx2 avx512". */
const char *fa__cpu_kernels_compiled(void);

/* Attention forward on the CPU. Writes out (and lse) for every row of every batch, and for
 * varlen also the rows outside every sequence (0 and -inf). Returns FA_OK or FA_ERR_NO_MEMORY,
 * in which case nothing has been written. */
fa_status fa__cpu_forward(fa_context *ctx, const fa__problem *p);

/* Attention backward on the CPU: dq, dk, dv for every row (varlen rows outside every sequence
 * get zeros). Returns FA_OK or FA_ERR_NO_MEMORY, in which case nothing has been written. */
fa_status fa__cpu_backward(fa_context *ctx, const fa__problem *p);

#endif /* FA_CPU_H */
