/* SPDX-License-Identifier: MIT */
/*
 * verify.h — what `flashattn verify`'s files share (verify.c, verify_kv.c): where a case runs,
 * the forward tolerances, and the KV-cache cases.
 */
#ifndef FA_TOOLS_VERIFY_H
#define FA_TOOLS_VERIFY_H

#include "../cli/cli.h"
#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* Where a case runs: the CPU, or CUDA device `index`, where inputs are copied and outputs
 * (poison included) copied in and back out. */
typedef struct backend {
    int cuda;
    int32_t index;
    void *dev[12]; /* the backward places 9 tensors */
    int ndev;
} backend;

/* t itself on the CPU; on CUDA a device copy of its `bytes` bytes. */
fa_tensor place(backend *be, fa_tensor t, size_t bytes);
/* Copies an output placed on the device back to `host`. */
void fetch(const backend *be, void *host, const fa_tensor *t, size_t bytes);
/* Frees the device copies. */
void release(backend *be);

/* The forward's tolerances (max abs error) for dtype t, given max|ref out| and max|ref lse|. */
void verify_tolerance(fa_dtype t, double max_ref_out, double max_ref_lse, double *tol_out,
                      double *tol_lse);

/* The KV-cache cases on CUDA device dev (verify_kv.c); returns how many failed, and the number
 * of cases in *ncases. */
size_t verify_kvcache_cases(int32_t dev, cli_rng *rng, int quiet, size_t *ncases);

#endif /* FA_TOOLS_VERIFY_H */
