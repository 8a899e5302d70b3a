/* SPDX-License-Identifier: MIT */
/*
 * verify_kv.c — `flashattn verify`'s KV-cache cases on a CUDA device: a decode step and a short
 * prefill through fa_forward_kvcache, appending new keys and values (rotated) in place, run on
 * the device and on the CPU backend from the same inputs. The CPU's KV cache is held to the
 * fp64 reference by the test suite (tests/test_kvcache.c); here the device must agree with it:
 *   the caches after the call, bit for bit (the append and its rotation are the CPU's
 *   arithmetic), and out and lse within verify's forward tolerances (verify.c), with the CPU's
 *   result in the reference's place.
 * One case keeps the int32 indices on the host, the others put them on the device.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/cli.h"
#include "flashattn.h"
#include "verify.h"

typedef struct kvcase {
    const char *name;
    fa_dtype dtype;
    int64_t B, Sq, H, Hk, D, S_new;
    int64_t page; /* 0: contiguous (B, 256, Hk, D); else pages of this many rows */
    int64_t rd;   /* rotary dim, 0 = none */
    int neox;     /* GPT-NeoX pairing (else interleaved) */
    int host_idx; /* the int32 indices on the host */
    int32_t lens[2];
} kvcase;

enum { KV_CAP = 256 }; /* positions per sequence */

/* clang-format off */
static const kvcase kvcases[] = {
    /* name          dtype          B Sq  H Hk   D new page  rd neox host lens */
    {"kv-decode",    FA_DTYPE_BF16, 2, 1, 8, 2, 128, 1,  16, 128, 1, 0, {200, 17}},
    {"kv-decode-p3", FA_DTYPE_F16,  2, 1, 4, 1,  64, 1,   3,  32, 0, 1, {100, 0}},
    {"kv-prefill",   FA_DTYPE_F16,  2, 9, 4, 2,  64, 9,   0,  64, 0, 0, {40, 120}},
    {"kv-fp32",      FA_DTYPE_F32,  2, 2, 2, 2,  40, 2, 256,  40, 1, 0, {5, 230}},
};
/* clang-format on */
#define NUM_KVCASES (sizeof kvcases / sizeof kvcases[0])

/* The buffers of one call: host copies, and device copies on the device side. */
typedef struct kvbufs {
    void *q, *kc, *vc, *kn, *vn, *out, *cos, *sin;
    float *lse;
    int32_t ints[2 * 2 + 2 * (KV_CAP + 2)]; /* cache_seqlens [B], then the block table */
} kvbufs;

static fa_tensor t4(void *data, fa_dtype t, int64_t a, int64_t b, int64_t c, int64_t d) {
    const int64_t s[4] = {a, b, c, d};
    return fa_tensor_contiguous(data, t, 4, s);
}

/* Runs case c on the CPU (cuda 0) or on CUDA device dev from the inputs in h (copied). The
 * caches, out and lse come back in r. */
static void kv_call(const kvcase *c, const kvbufs *h, int cuda, int32_t dev, kvbufs *r,
                    size_t sizes[8]) {
    backend be = {cuda, dev, {NULL}, 0};
    void *const src[8] = {h->q, h->kc, h->vc, h->kn, h->vn, h->out, h->cos, h->sin};
    void *dst[8] = {r->q, r->kc, r->vc, r->kn, r->vn, r->out, r->cos, r->sin};
    for (int i = 0; i < 8; i++)
        memcpy(dst[i], src[i], sizes[i]);
    memset(r->lse, 0xFF, sizeof(float) * (size_t)(c->B * c->H * c->Sq));
    memcpy(r->ints, h->ints, sizeof h->ints);
    const int64_t pages_per = c->page ? KV_CAP / c->page : 0, B = c->B;
    const int64_t rows = c->page ? B * pages_per + 1 : B, len = c->page ? c->page : KV_CAP;
    fa_tensor q = place(&be, t4(r->q, c->dtype, B, c->Sq, c->H, c->D), sizes[0]);
    fa_tensor out = place(&be, t4(r->out, c->dtype, B, c->Sq, c->H, c->D), sizes[5]);
    const int64_t ls[3] = {B, c->H, c->Sq}, rs[2] = {KV_CAP, c->rd / 2}, bts[2] = {B, pages_per};
    fa_tensor lse = place(&be, fa_tensor_contiguous(r->lse, FA_DTYPE_F32, 3, ls),
                          sizeof(float) * (size_t)(B * c->H * c->Sq));
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = place(&be, t4(r->kc, c->dtype, rows, len, c->Hk, c->D), sizes[1]);
    kv.v_cache = place(&be, t4(r->vc, c->dtype, rows, len, c->Hk, c->D), sizes[2]);
    kv.k_new = place(&be, t4(r->kn, c->dtype, B, c->S_new, c->Hk, c->D), sizes[3]);
    kv.v_new = place(&be, t4(r->vn, c->dtype, B, c->S_new, c->Hk, c->D), sizes[4]);
    kv.rotary_cos = place(&be, fa_tensor_contiguous(r->cos, c->dtype, 2, rs), sizes[6]);
    kv.rotary_sin = place(&be, fa_tensor_contiguous(r->sin, c->dtype, 2, rs), sizes[7]);
    kv.rotary_interleaved = !c->neox;
    backend *ib = c->host_idx ? &(backend){0, 0, {NULL}, 0} : &be;
    kv.cache_seqlens =
        place(ib, fa_tensor_contiguous(r->ints, FA_DTYPE_I32, 1, &B), sizeof(int32_t) * (size_t)B);
    if (c->page)
        kv.block_table = place(ib, fa_tensor_contiguous(r->ints + 2, FA_DTYPE_I32, 2, bts),
                               sizeof(int32_t) * (size_t)(B * pages_per));
    fa_params params;
    fa_params_init(&params);
    params.causal = 1;
    CLI_CHECK("fa_forward_kvcache", fa_forward_kvcache(NULL, &params, &q, &kv, &out, &lse));
    fetch(&be, r->kc, &kv.k_cache, sizes[1]);
    fetch(&be, r->vc, &kv.v_cache, sizes[2]);
    fetch(&be, r->out, &out, sizes[5]);
    fetch(&be, r->lse, &lse, sizeof(float) * (size_t)(B * c->H * c->Sq));
    release(&be);
}

static void kvbufs_alloc(kvbufs *b, const size_t sizes[8], size_t lse_n) {
    void **p[8] = {&b->q, &b->kc, &b->vc, &b->kn, &b->vn, &b->out, &b->cos, &b->sin};
    for (int i = 0; i < 8; i++)
        *p[i] = cli_xmalloc(sizes[i], "a KV-cache case");
    b->lse = cli_xmalloc(lse_n * sizeof(float), "a KV-cache case");
}

static void kvbufs_free(kvbufs *b) {
    void *p[9] = {b->q, b->kc, b->vc, b->kn, b->vn, b->out, b->cos, b->sin, b->lse};
    for (int i = 0; i < 9; i++)
        free(p[i]);
}

/* Case c on CUDA device dev against the CPU; returns 1 when it passes. */
static int kv_case(const kvcase *c, int32_t dev, cli_rng *rng, int quiet) {
    const fa_dtype t = c->dtype;
    const int64_t B = c->B, pages_per = c->page ? KV_CAP / c->page : 0;
    const int64_t crow = c->page ? (B * pages_per + 1) * c->page : B * KV_CAP;
    const size_t es = cli_dtype_size(t), nq = (size_t)(B * c->Sq * c->H * c->D);
    const size_t nc = (size_t)(crow * c->Hk * c->D), nn = (size_t)(B * c->S_new * c->Hk * c->D);
    const size_t nr = (size_t)(KV_CAP * (c->rd / 2)), nl = (size_t)(B * c->H * c->Sq);
    size_t sizes[8] = {nq * es, nc * es, nc * es, nn * es, nn * es, nq * es, nr * es, nr * es};
    kvbufs h, cpu, gpu;
    kvbufs_alloc(&h, sizes, nl);
    kvbufs_alloc(&cpu, sizes, nl);
    kvbufs_alloc(&gpu, sizes, nl);
    void *fill[5] = {h.q, h.kc, h.vc, h.kn, h.vn};
    const size_t nfill[5] = {nq, nc, nc, nn, nn};
    for (int i = 0; i < 5; i++)
        for (size_t e = 0; e < nfill[i]; e++)
            cli_store(fill[i], t, e, cli_rng_uniform(rng));
    memset(h.out, 0xFF, sizes[5]);
    for (int64_t pos = 0; pos < KV_CAP; pos++)
        for (int64_t k = 0; k < c->rd / 2; k++) {
            const double a = (double)pos * pow(10000.0, -2.0 * (double)k / (double)c->rd);
            cli_store(h.cos, t, (size_t)(pos * (c->rd / 2) + k), cos(a));
            cli_store(h.sin, t, (size_t)(pos * (c->rd / 2) + k), sin(a));
        }
    h.ints[0] = c->lens[0], h.ints[1] = c->lens[1];
    for (int64_t i = 0; i < B * pages_per; i++) /* a scattered permutation of the pages */
        h.ints[2 + i] = (int32_t)((i * 7 + 3) % (B * pages_per));
    kv_call(c, &h, 0, 0, &cpu, sizes);
    kv_call(c, &h, 1, dev, &gpu, sizes);

    const int caches_equal = !memcmp(cpu.kc, gpu.kc, sizes[1]) && !memcmp(cpu.vc, gpu.vc, sizes[2]);
    double err = 0.0, ref = 1.0, lerr = 0.0, lref = 1.0;
    for (size_t e = 0; e < nq; e++) {
        const double a = cli_load(gpu.out, t, e), b = cli_load(cpu.out, t, e);
        err = isnan(a - b) || fabs(a - b) > err ? (isnan(a - b) ? INFINITY : fabs(a - b)) : err;
        ref = fabs(b) > ref ? fabs(b) : ref;
    }
    for (size_t e = 0; e < nl; e++) {
        const double a = gpu.lse[e], b = cpu.lse[e];
        const double d = a == b ? 0.0 : fabs(a - b); /* -inf == -inf */
        lerr = isnan(d) || d > lerr ? (isnan(d) ? INFINITY : d) : lerr;
        lref = isfinite(b) && fabs(b) > lref ? fabs(b) : lref;
    }
    double tol_out, tol_lse;
    verify_tolerance(t, ref, lref, &tol_out, &tol_lse);
    const int pass = caches_equal && err <= tol_out && lerr <= tol_lse;
    char layout[32] = "contiguous";
    if (c->page)
        snprintf(layout, sizeof layout, "page=%lld", (long long)c->page);
    if (!quiet || !pass)
        printf("  %-14s %s B=%lld Sq=%lld H=%lld Hk=%lld D=%lld new=%lld %s rotary=%lld%s "
               "idx=%s: caches %s, out %9.2e (tol %7.1e), lse %9.2e (tol %7.1e)  %s\n",
               c->name, cli_dtype_name(t), (long long)B, (long long)c->Sq, (long long)c->H,
               (long long)c->Hk, (long long)c->D, (long long)c->S_new, layout, (long long)c->rd,
               c->neox ? " neox" : "", c->host_idx ? "host" : "device",
               caches_equal ? "equal" : "DIFFER", err, tol_out, lerr, tol_lse,
               pass ? "PASS" : "FAIL");
    kvbufs_free(&h);
    kvbufs_free(&cpu);
    kvbufs_free(&gpu);
    return pass;
}

size_t verify_kvcache_cases(int32_t dev, cli_rng *rng, int quiet, size_t *ncases) {
    size_t failed = 0;
    if (!quiet)
        printf("\nKV cache on cuda:%d: fa_forward_kvcache (append, rotary, causal) against the "
               "CPU backend on the same inputs\n",
               (int)dev);
    for (size_t i = 0; i < NUM_KVCASES; i++)
        failed += !kv_case(&kvcases[i], dev, rng, quiet);
    *ncases = NUM_KVCASES;
    return failed;
}
