/* SPDX-License-Identifier: MIT */
/*
 * test_sizes.c — shapes at the edges of the integer types: huge but valid bounds and batches,
 * zero-element calls, stride-0 (broadcast) inputs, caches near INT32_MAX positions, and the
 * KV cache's "nothing written on error" contract. Every size the library computes must be
 * checked (src/size.h): a call either runs, or returns a clear status having written nothing —
 * never wraps a size, corrupts the heap or does O(B) work for no element. Run under
 * ASan + UBSan (`make asan`), where any wrap or overflow aborts the test.
 */
#define _GNU_SOURCE /* RLIMIT_AS */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "flashattn.h"
#include "reference/attention_ref.h"
#include "test.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define FA_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FA_TEST_ASAN 1
#endif
#endif

static float scratch_f[4096]; /* the storage behind stride-0 (broadcast) inputs */
static int32_t zeros_i[16];

/* A CPU view of any shape whose every stride is 0: one element (or none) of real memory. */
static fa_tensor broadcast(void *data, fa_dtype dtype, int ndim, const int64_t *shape) {
    fa_tensor t = {.data = data, .dtype = dtype, .device = FA_DEVICE_CPU, .ndim = ndim};
    for (int i = 0; i < ndim; i++)
        t.shape[i] = shape[i];
    return t;
}

/* An empty view: no data, any shape with a zero. */
static fa_tensor none(fa_dtype dtype, int ndim, const int64_t *shape) {
    return broadcast(NULL, dtype, ndim, shape);
}

/* Issue 46, defect 1: max_seqlen_q is only an upper bound. With 2^62 (and one query against
 * 2,000 keys, so the keys are split) the forward planned its split partials from g · 2^62 rows,
 * which wrapped: malloc(0), then the workers wrote past it. */
static void test_varlen_huge_bounds(void) {
    const int64_t H = 2, Hk = 1, D = 16;
    const int32_t lens_q[] = {1, 3, 0}, lens_k[] = {2000, 1500, 7};
    const int64_t B = 3;
    int32_t cu_q[4] = {0}, cu_k[4] = {0};
    for (int b = 0; b < B; b++)
        cu_q[b + 1] = cu_q[b] + lens_q[b], cu_k[b + 1] = cu_k[b] + lens_k[b];
    const int64_t tq = cu_q[B], tk = cu_k[B];
    const int64_t bounds[][2] = {{(int64_t)1 << 62, (int64_t)1 << 62},
                                 {INT64_MAX, INT64_MAX},
                                 {(int64_t)1 << 31, 2000},
                                 {3, (int64_t)1 << 40}};
    for (size_t c = 0; c < sizeof bounds / sizeof *bounds; c++)
        for (int causal = 0; causal < 2; causal++) {
            CASE_BEGIN("varlen max_seqlen_q=%lld max_seqlen_k=%lld causal=%d",
                       (long long)bounds[c][0], (long long)bounds[c][1], causal);
            float *q = malloc(sizeof(float) * tq * H * D), *k = malloc(sizeof(float) * tk * Hk * D);
            float *v = malloc(sizeof(float) * tk * Hk * D), *o = malloc(sizeof(float) * tq * H * D);
            float *lse = malloc(sizeof(float) * H * tq);
            REQUIRE(q && k && v && o && lse);
            for (int64_t i = 0; i < tq * H * D; i++)
                q[i] = (float)tu_normal();
            for (int64_t i = 0; i < tk * Hk * D; i++)
                k[i] = (float)tu_normal(), v[i] = (float)tu_normal();
            memset(o, 0xA5, sizeof(float) * tq * H * D);
            memset(lse, 0xA5, sizeof(float) * H * tq);
            const int64_t qs[3] = {tq, H, D}, ks[3] = {tk, Hk, D}, ls[2] = {H, tq}, cs = B + 1;
            fa_tensor tq_ = fa_tensor_contiguous(q, FA_DTYPE_F32, 3, qs);
            fa_tensor tk_ = fa_tensor_contiguous(k, FA_DTYPE_F32, 3, ks);
            fa_tensor tv_ = fa_tensor_contiguous(v, FA_DTYPE_F32, 3, ks);
            fa_tensor to_ = fa_tensor_contiguous(o, FA_DTYPE_F32, 3, qs);
            fa_tensor tl_ = fa_tensor_contiguous(lse, FA_DTYPE_F32, 2, ls);
            fa_tensor tcq = fa_tensor_contiguous(cu_q, FA_DTYPE_I32, 1, &cs);
            fa_tensor tck = fa_tensor_contiguous(cu_k, FA_DTYPE_I32, 1, &cs);
            fa_params p;
            fa_params_init(&p);
            p.causal = causal;
            fa_status st = fa_varlen_forward(NULL, &p, &tq_, &tk_, &tv_, &tcq, &tck, bounds[c][0],
                                             bounds[c][1], &to_, &tl_);
            CHECK_MSG(st == FA_OK, "status %s: %s", fa_status_name(st), fa_last_error_message());
            for (int64_t b = 0; st == FA_OK && b < B; b++) { /* each sequence against fp64 */
                const int64_t sq = lens_q[b], sk = lens_k[b];
                ref_problem rp = {.B = 1,
                                  .Sq = sq,
                                  .Sk = sk,
                                  .H = H,
                                  .Hk = Hk,
                                  .D = D,
                                  .scale = 1.0 / sqrt((double)D),
                                  .causal = causal,
                                  .window_left = -1,
                                  .window_right = -1};
                double *dq = malloc(sizeof(double) * (sq * H * D + 1));
                double *dk = malloc(sizeof(double) * sk * Hk * D),
                       *dv = malloc(sizeof(double) * sk * Hk * D);
                double *ro = malloc(sizeof(double) * (sq * H * D + 1)),
                       *rl = malloc(sizeof(double) * (H * sq + 1));
                double *got = malloc(sizeof(double) * (sq * H * D + 1)),
                       *gl = malloc(sizeof(double) * (H * sq + 1));
                REQUIRE(dq && dk && dv && ro && rl && got && gl);
                for (int64_t i = 0; i < sq * H * D; i++)
                    dq[i] = q[cu_q[b] * H * D + i], got[i] = o[cu_q[b] * H * D + i];
                for (int64_t i = 0; i < sk * Hk * D; i++)
                    dk[i] = k[cu_k[b] * Hk * D + i], dv[i] = v[cu_k[b] * Hk * D + i];
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < sq; i++)
                        gl[h * sq + i] = lse[h * tq + cu_q[b] + i];
                ref_attention_forward(&rp, dq, dk, dv, ro, rl);
                CHECK(tu_check_attention(FA_DTYPE_F32, 1, sq, H, D, got, ro, NULL, gl, rl, NULL,
                                         NULL, NULL));
                free(dq), free(dk), free(dv), free(ro), free(rl), free(got), free(gl);
            }
            free(q), free(k), free(v), free(o), free(lse);
            CASE_END();
        }
}

/* Issue 46, defects 2 and 3: calls with no output element return at once, whatever the other
 * sizes (B = 2^60 + 1 wrapped 4·B·sizeof(int32) in the KV cache; B = 2^28 took 58 s and 6.3 GB;
 * a stride-0 cu_seqlens of 2^61 offsets wrapped its copy's size). */
static void test_zero_elements(void) {
    const int64_t huge[] = {(int64_t)1 << 28, ((int64_t)1 << 60) + 1, (int64_t)1 << 62,
                            INT64_MAX / 2};
    for (size_t c = 0; c < sizeof huge / sizeof *huge; c++) {
        const int64_t B = huge[c];
        CASE_BEGIN("zero elements, B = %lld", (long long)B);
        const int64_t q0[4] = {B, 0, 2, 8}, k4[4] = {B, 5, 1, 8}, l0[3] = {B, 2, 0};
        fa_tensor q = none(FA_DTYPE_F32, 4, q0), o = none(FA_DTYPE_F32, 4, q0);
        fa_tensor lse = none(FA_DTYPE_F32, 3, l0);
        fa_tensor k = broadcast(scratch_f, FA_DTYPE_F32, 4, k4);
        fa_tensor v = broadcast(scratch_f, FA_DTYPE_F32, 4, k4);
        fa_status st = fa_forward(NULL, NULL, &q, &k, &v, &o, &lse);
        CHECK_MSG(st == FA_OK, "fa_forward: %s: %s", fa_status_name(st), fa_last_error_message());

        /* backward: Sq = Sk = 0, so dq, dk and dv are empty too */
        const int64_t k0[4] = {B, 0, 1, 8};
        fa_tensor ke = none(FA_DTYPE_F32, 4, k0), ve = none(FA_DTYPE_F32, 4, k0);
        fa_tensor dq = none(FA_DTYPE_F32, 4, q0), dout = none(FA_DTYPE_F32, 4, q0);
        fa_tensor dk = none(FA_DTYPE_F32, 4, k0), dv = none(FA_DTYPE_F32, 4, k0);
        st = fa_backward(NULL, NULL, &q, &ke, &ve, &o, &dout, &lse, &dq, &dk, &dv);
        CHECK_MSG(st == FA_OK, "fa_backward: %s: %s", fa_status_name(st), fa_last_error_message());

        /* varlen: a stride-0 cu_seqlens of B + 1 zeros over no rows */
        const int64_t n = B < ((int64_t)1 << 61) ? B + 1 : (int64_t)1 << 61;
        const int64_t qv[3] = {0, 2, 8}, kv3[3] = {0, 1, 8}, lv[2] = {2, 0};
        fa_tensor vq = none(FA_DTYPE_F32, 3, qv), vo = none(FA_DTYPE_F32, 3, qv);
        fa_tensor vk = none(FA_DTYPE_F32, 3, kv3), vv = none(FA_DTYPE_F32, 3, kv3);
        fa_tensor vl = none(FA_DTYPE_F32, 2, lv);
        fa_tensor cu = broadcast(zeros_i, FA_DTYPE_I32, 1, &n);
        st = fa_varlen_forward(NULL, NULL, &vq, &vk, &vv, &cu, &cu, (int64_t)1 << 62, 0, &vo, &vl);
        CHECK_MSG(st == FA_OK, "fa_varlen_forward: %s: %s", fa_status_name(st),
                  fa_last_error_message());
        st = fa_varlen_backward(NULL, NULL, &vq, &vk, &vv, &vo, &vo, &vl, &cu, &cu, 0, 0, &vq, &vk,
                                &vv);
        /* dq aliases q here, but neither has an element: nothing is read or written */
        CHECK_MSG(st == FA_OK, "fa_varlen_backward: %s: %s", fa_status_name(st),
                  fa_last_error_message());

        /* KV cache: q (B, 0, 1, 1) over a stride-0 cache of B rows, with and without per-batch
         * lengths */
        const int64_t qk[4] = {B, 0, 1, 1}, ck[4] = {B, 4, 1, 1};
        fa_tensor kq = none(FA_DTYPE_F32, 4, qk), ko = none(FA_DTYPE_F32, 4, qk);
        fa_kvcache kv;
        fa_kvcache_init(&kv);
        kv.k_cache = broadcast(scratch_f, FA_DTYPE_F32, 4, ck);
        kv.v_cache = broadcast(scratch_f, FA_DTYPE_F32, 4, ck);
        st = fa_forward_kvcache(NULL, NULL, &kq, &kv, &ko, NULL);
        CHECK_MSG(st == FA_OK, "fa_forward_kvcache: %s: %s", fa_status_name(st),
                  fa_last_error_message());
        kv.cache_seqlens = broadcast(zeros_i, FA_DTYPE_I32, 1, &B);
        st = fa_forward_kvcache(NULL, NULL, &kq, &kv, &ko, NULL);
        CHECK_MSG(st == FA_OK, "fa_forward_kvcache with cache_seqlens: %s: %s", fa_status_name(st),
                  fa_last_error_message());
        CASE_END();
    }
}

/* A stride-0 cu_seqlens of 2^61 offsets over a real row: its copy (2 · (B + 1) int32) cannot
 * be allocated — a clear FA_ERR_NO_MEMORY with nothing written, not a wrapped malloc. */
static void test_huge_cu_seqlens(void) {
    CASE_BEGIN("varlen, stride-0 cu_seqlens of 2^61 offsets, one row");
    float q[8], o[8], lse[2];
    for (int i = 0; i < 8; i++)
        q[i] = (float)tu_normal();
    memset(o, 0xA5, sizeof o);
    memset(lse, 0xA5, sizeof lse);
    unsigned char o0[sizeof o], l0[sizeof lse];
    memcpy(o0, o, sizeof o), memcpy(l0, lse, sizeof lse);
    const int64_t qs[3] = {1, 2, 4}, ls[2] = {2, 1}, n = (int64_t)1 << 61;
    fa_tensor tq = fa_tensor_contiguous(q, FA_DTYPE_F32, 3, qs);
    fa_tensor to = fa_tensor_contiguous(o, FA_DTYPE_F32, 3, qs);
    fa_tensor tl = fa_tensor_contiguous(lse, FA_DTYPE_F32, 2, ls);
    fa_tensor cu = broadcast(zeros_i, FA_DTYPE_I32, 1, &n);
    const fa_status st = fa_varlen_forward(NULL, NULL, &tq, &tq, &tq, &cu, &cu, 1, 1, &to, &tl);
    CHECK_MSG(st == FA_ERR_NO_MEMORY, "status %s: %s", fa_status_name(st), fa_last_error_message());
    CHECK(tu_contains_word(fa_last_error_message(), "cu_seqlens"));
    CHECK(memcmp(o, o0, sizeof o) == 0 && memcmp(lse, l0, sizeof lse) == 0);
    CASE_END();
}

/* fa_tensor_contiguous of shapes whose product overflows int64: the strides must not wrap into
 * a view that passes validation. */
static void test_contiguous_overflow(void) {
    CASE_BEGIN("fa_tensor_contiguous with a product beyond int64");
    const int64_t big = (int64_t)1 << 40, qs[4] = {big, big, big, 1}, ks[4] = {1, 1, 1, 1};
    fa_tensor q = fa_tensor_contiguous(scratch_f, FA_DTYPE_F32, 4, qs);
    CHECK(q.stride[0] > 0 && q.stride[1] == big && q.stride[2] == 1);
    fa_tensor k = fa_tensor_contiguous(scratch_f, FA_DTYPE_F32, 4, ks);
    fa_tensor o = q;
    const fa_status st = fa_forward(NULL, NULL, &q, &k, &k, &o, NULL);
    CHECK_MSG(st == FA_ERR_STRIDE, "status %s: %s", fa_status_name(st), fa_last_error_message());
    CASE_END();
}

/* One (B = 1) contiguous-cache problem, fp32, D = 4, H = Hk = 1. */
typedef struct kvprob {
    float *q, *o, *kc, *vc, *kn, *vn;
    int32_t *seqlens;
    fa_tensor tq, to;
    fa_kvcache kv;
} kvprob;

/* Issue 46, "nothing written on error": fa_forward_kvcache appended k_new/v_new, then failed to
 * allocate the forward's scratch and returned FA_ERR_NO_MEMORY with the cache changed. Here the
 * address space is capped so that the validation's small allocations succeed and the forward's
 * scratch (about 10 MB a thread for 4096 query heads of D = 256) cannot. */
static void test_kvcache_no_memory_writes_nothing(void) {
#if defined(FA_TEST_ASAN)
    printf("SKIP kvcache out of memory: RLIMIT_AS and ASan's shadow memory do not mix\n");
#else
    if (tu_emulated()) { /* qemu-user maps the guest's memory itself, past its RLIMIT_AS */
        printf("SKIP kvcache out of memory: RLIMIT_AS is not enforced under emulation\n");
        return;
    }
    CASE_BEGIN("kvcache: the forward's scratch cannot be allocated, the cache stays as it was");
    enum { H = 4096, D = 256, S = 8 };
    fa_context *ctx = NULL;
    fa_context_options opts;
    fa_context_options_init(&opts);
    opts.num_threads = 1;
    REQUIRE(fa_context_create(&opts, &ctx) == FA_OK);
    const size_t nq = (size_t)H * D, nc = (size_t)S * D;
    float *q = malloc(nq * sizeof *q), *o = malloc(nq * sizeof *o);
    float *kc = malloc(nc * sizeof *kc), *vc = malloc(nc * sizeof *vc),
          *kn = malloc(D * sizeof *kn);
    unsigned char *snap = malloc(2 * nc * sizeof(float));
    REQUIRE(q && o && kc && vc && kn && snap);
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)tu_normal();
    for (size_t i = 0; i < nc; i++)
        kc[i] = (float)tu_normal(), vc[i] = (float)tu_normal();
    for (int i = 0; i < D; i++)
        kn[i] = 1000.0f + (float)i;
    memcpy(snap, kc, nc * sizeof(float)), memcpy(snap + nc * sizeof(float), vc, nc * sizeof(float));
    int32_t seqlens[1] = {3};
    const int64_t qs[4] = {1, 1, H, D}, cs[4] = {1, S, 1, D}, ns[4] = {1, 1, 1, D}, one = 1;
    fa_tensor tq = fa_tensor_contiguous(q, FA_DTYPE_F32, 4, qs);
    fa_tensor to = fa_tensor_contiguous(o, FA_DTYPE_F32, 4, qs);
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = fa_tensor_contiguous(kc, FA_DTYPE_F32, 4, cs);
    kv.v_cache = fa_tensor_contiguous(vc, FA_DTYPE_F32, 4, cs);
    kv.k_new = fa_tensor_contiguous(kn, FA_DTYPE_F32, 4, ns);
    kv.v_new = fa_tensor_contiguous(kn, FA_DTYPE_F32, 4, ns);
    kv.cache_seqlens = fa_tensor_contiguous(seqlens, FA_DTYPE_I32, 1, &one);

    struct rlimit old, cap;
    REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    REQUIRE(f && fscanf(f, "%ld", &pages) == 1);
    fclose(f);
    cap = old;
    cap.rlim_cur = (rlim_t)pages * 4096 + ((rlim_t)4 << 20); /* 4 MiB more than in use now */
    REQUIRE(setrlimit(RLIMIT_AS, &cap) == 0);
    const fa_status st = fa_forward_kvcache(ctx, NULL, &tq, &kv, &to, NULL);
    setrlimit(RLIMIT_AS, &old);
    CHECK_MSG(st == FA_ERR_NO_MEMORY, "status %s: %s", fa_status_name(st), fa_last_error_message());
    CHECK_MSG(memcmp(snap, kc, nc * sizeof(float)) == 0 &&
                  memcmp(snap + nc * sizeof(float), vc, nc * sizeof(float)) == 0,
              "the cache was written by a call that failed");
    CHECK(seqlens[0] == 3);
    /* with the memory back, the same call appends */
    CHECK(fa_forward_kvcache(ctx, NULL, &tq, &kv, &to, NULL) == FA_OK);
    CHECK(kc[3 * D + 5] == 1005.0f);
    free(q), free(o), free(kc), free(vc), free(kn), free(snap);
    fa_context_destroy(ctx);
    CASE_END();
#endif
}

/* A cache position past INT32_MAX (cache_seqlens + S_new > 2^31 - 1) returned FA_OK having
 * attended over nothing (the length wrapped): refused, nothing written. The cache is paged with
 * every page table entry on one page, so 2^31 positions take 4 MiB. */
static void test_kvcache_int32_positions(void) {
    CASE_BEGIN("kvcache: cache_seqlens + S_new beyond INT32_MAX");
    enum { PAGE = 1 << 20 };
    const int64_t pages_per_row = ((int64_t)1 << 31) / PAGE + 2;
    float *kc = calloc(PAGE, sizeof(float)), *vc = calloc(PAGE, sizeof(float));
    int32_t *bt = calloc((size_t)pages_per_row, sizeof(int32_t));
    REQUIRE(kc && vc && bt);
    float q[1] = {0.5f}, o[1] = {-7.0f}, kn[1] = {3.0f};
    int32_t seqlens[1] = {INT32_MAX};
    const int64_t qs[4] = {1, 1, 1, 1}, cs[4] = {1, PAGE, 1, 1}, bs[2] = {1, pages_per_row},
                  one = 1;
    fa_tensor tq = fa_tensor_contiguous(q, FA_DTYPE_F32, 4, qs);
    fa_tensor to = fa_tensor_contiguous(o, FA_DTYPE_F32, 4, qs);
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = fa_tensor_contiguous(kc, FA_DTYPE_F32, 4, cs);
    kv.v_cache = fa_tensor_contiguous(vc, FA_DTYPE_F32, 4, cs);
    kv.k_new = fa_tensor_contiguous(kn, FA_DTYPE_F32, 4, qs);
    kv.v_new = fa_tensor_contiguous(kn, FA_DTYPE_F32, 4, qs);
    kv.block_table = fa_tensor_contiguous(bt, FA_DTYPE_I32, 2, bs);
    kv.cache_seqlens = fa_tensor_contiguous(seqlens, FA_DTYPE_I32, 1, &one);
    fa_status st = fa_forward_kvcache(NULL, NULL, &tq, &kv, &to, NULL);
    CHECK_MSG(st == FA_ERR_VALUE, "status %s: %s", fa_status_name(st), fa_last_error_message());
    CHECK(strstr(fa_last_error_message(), "kv.cache_seqlens[0]") != NULL);
    CHECK(o[0] == -7.0f);
    int untouched = 1;
    for (int i = 0; i < PAGE; i++)
        untouched &= kc[i] == 0.0f && vc[i] == 0.0f;
    CHECK_MSG(untouched, "the cache was written by a refused call");
    free(kc), free(vc), free(bt);
    CASE_END();
}

/* Appends that would write cache memory another batch of the call uses are refused: two
 * batches on one page (both appending), or a page one batch appends to that another batch's
 * table also lists. A read-only page shared by both (a common prefix) is fine. */
static void test_kvcache_shared_pages(void) {
    enum { PAGE = 4, NPAGES = 6, D = 2 };
    /* batch 0 pages {0, 1, 2}, batch 1 pages {0, 3, x}: page 0 is a shared prefix */
    const struct {
        const char *name;
        int32_t bt[2][3], seqlens[2];
        fa_status want;
    } cases[] = {
        {"shared prefix page, appends to own pages", {{0, 1, 2}, {0, 3, 4}}, {5, 6}, FA_OK},
        {"both append to one page", {{0, 1, 2}, {0, 1, 4}}, {5, 6}, FA_ERR_VALUE},
        {"append to a page the other reads", {{0, 3, 2}, {0, 3, 4}}, {5, 9}, FA_ERR_VALUE},
        {"append into the shared prefix", {{0, 1, 2}, {0, 3, 4}}, {2, 6}, FA_ERR_VALUE},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        CASE_BEGIN("kvcache paged append: %s", cases[c].name);
        float kc[NPAGES * PAGE * D], vc[NPAGES * PAGE * D], q[2 * D], o[2 * D], kn[2 * D];
        for (int i = 0; i < NPAGES * PAGE * D; i++)
            kc[i] = (float)tu_normal(), vc[i] = kc[i];
        for (int i = 0; i < 2 * D; i++)
            q[i] = (float)tu_normal(), kn[i] = 100.0f + (float)i;
        float k0[sizeof kc / sizeof *kc];
        memcpy(k0, kc, sizeof kc);
        memset(o, 0xA5, sizeof o);
        int32_t bt[2][3], seqlens[2];
        memcpy(bt, cases[c].bt, sizeof bt), memcpy(seqlens, cases[c].seqlens, sizeof seqlens);
        const int64_t qs[4] = {2, 1, 1, D}, cs[4] = {NPAGES, PAGE, 1, D}, bs[2] = {2, 3}, two = 2;
        fa_tensor tq = fa_tensor_contiguous(q, FA_DTYPE_F32, 4, qs);
        fa_tensor to = fa_tensor_contiguous(o, FA_DTYPE_F32, 4, qs);
        fa_kvcache kv;
        fa_kvcache_init(&kv);
        kv.k_cache = fa_tensor_contiguous(kc, FA_DTYPE_F32, 4, cs);
        kv.v_cache = fa_tensor_contiguous(vc, FA_DTYPE_F32, 4, cs);
        kv.k_new = fa_tensor_contiguous(kn, FA_DTYPE_F32, 4, qs);
        kv.v_new = fa_tensor_contiguous(kn, FA_DTYPE_F32, 4, qs);
        kv.block_table = fa_tensor_contiguous(bt, FA_DTYPE_I32, 2, bs);
        kv.cache_seqlens = fa_tensor_contiguous(seqlens, FA_DTYPE_I32, 1, &two);
        const fa_status st = fa_forward_kvcache(NULL, NULL, &tq, &kv, &to, NULL);
        CHECK_MSG(st == cases[c].want, "status %s, expected %s: %s", fa_status_name(st),
                  fa_status_name(cases[c].want), fa_last_error_message());
        if (cases[c].want != FA_OK) {
            CHECK(strstr(fa_last_error_message(), "kv.block_table") != NULL);
            CHECK_MSG(memcmp(k0, kc, sizeof kc) == 0, "the cache was written by a refused call");
        } else {
            /* batch b's new key sits at position seqlens[b] of its pages */
            for (int b = 0; b < 2; b++) {
                const int32_t pos = seqlens[b], pg = bt[b][pos / PAGE];
                CHECK(kc[(pg * PAGE + pos % PAGE) * D] == kn[b * D]);
            }
        }
        CASE_END();
    }
}

/* Duplicate cache_batch_idx rows are found in linear time (the check was quadratic: 15 s at
 * B = 200,000; at 2,000,000 it would take over half an hour, past this test's timeout). */
static void test_kvcache_batch_idx_many(void) {
    const int64_t B = 2000000;
    CASE_BEGIN("kvcache: %lld batches with distinct cache_batch_idx, then one duplicate",
               (long long)B);
    int32_t *idx = malloc((size_t)B * sizeof *idx);
    float *kc = calloc((size_t)B, sizeof *kc), *vc = calloc((size_t)B, sizeof *vc);
    REQUIRE(idx && kc && vc);
    for (int64_t b = 0; b < B; b++)
        idx[b] = (int32_t)(B - 1 - b);
    const int64_t qs[4] = {B, 0, 1, 1}, cs[4] = {B, 1, 1, 1}, ns[4] = {B, 1, 1, 1};
    fa_tensor tq = none(FA_DTYPE_F32, 4, qs), to = none(FA_DTYPE_F32, 4, qs);
    float one_f = 2.5f;
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = fa_tensor_contiguous(kc, FA_DTYPE_F32, 4, cs);
    kv.v_cache = fa_tensor_contiguous(vc, FA_DTYPE_F32, 4, cs);
    kv.k_new = broadcast(&one_f, FA_DTYPE_F32, 4, ns);
    kv.v_new = broadcast(&one_f, FA_DTYPE_F32, 4, ns);
    kv.cache_seqlens = broadcast(zeros_i, FA_DTYPE_I32, 1, &B);
    kv.cache_batch_idx = fa_tensor_contiguous(idx, FA_DTYPE_I32, 1, &B);
    fa_status st = fa_forward_kvcache(NULL, NULL, &tq, &kv, &to, NULL);
    CHECK_MSG(st == FA_OK, "status %s: %s", fa_status_name(st), fa_last_error_message());
    CHECK(kc[0] == 2.5f && kc[B - 1] == 2.5f && vc[B / 2] == 2.5f);
    memset(kc, 0, (size_t)B * sizeof *kc);
    idx[B - 1] = idx[7]; /* batches 7 and B - 1 on one row */
    st = fa_forward_kvcache(NULL, NULL, &tq, &kv, &to, NULL);
    CHECK_MSG(st == FA_ERR_VALUE, "status %s: %s", fa_status_name(st), fa_last_error_message());
    char want[96];
    snprintf(want, sizeof want, "kv.cache_batch_idx[7] = [%lld]", (long long)(B - 1));
    CHECK_MSG(strstr(fa_last_error_message(), want) != NULL, "message: %s",
              fa_last_error_message());
    CHECK(kc[0] == 0.0f && kc[B - 8] == 0.0f);
    free(idx), free(kc), free(vc);
    CASE_END();
}

/* Non-finite ALiBi slopes are refused on every entry point (issue 46, numerical semantics). */
static void test_alibi_nonfinite(void) {
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int kind = 0; kind < 3; kind++)
        for (int per_batch = 0; per_batch < 2; per_batch++) {
            CASE_BEGIN("ALiBi slope %g, %s", (double)bad[kind], per_batch ? "(B, H)" : "(H)");
            enum { B = 2, S = 3, H = 2, D = 4, N = B * S * H * D };
            float q[N], o[N], lse[B * H * S], slopes[B * H] = {0.5f, 0.25f, 0.125f, 1.0f};
            for (int i = 0; i < N; i++)
                q[i] = (float)tu_normal();
            slopes[per_batch ? 3 : 1] = bad[kind];
            memset(o, 0xA5, sizeof o);
            memset(lse, 0xA5, sizeof lse);
            float o0[N];
            memcpy(o0, o, sizeof o);
            const int64_t qs[4] = {B, S, H, D}, ls[3] = {B, H, S}, as[2] = {B, H}, ah = H;
            fa_tensor tq = fa_tensor_contiguous(q, FA_DTYPE_F32, 4, qs);
            fa_tensor to = fa_tensor_contiguous(o, FA_DTYPE_F32, 4, qs);
            fa_tensor tl = fa_tensor_contiguous(lse, FA_DTYPE_F32, 3, ls);
            fa_params p;
            fa_params_init(&p);
            p.alibi_slopes = per_batch ? fa_tensor_contiguous(slopes, FA_DTYPE_F32, 2, as)
                                       : fa_tensor_contiguous(slopes, FA_DTYPE_F32, 1, &ah);
            const char *want = per_batch ? "params.alibi_slopes[1, 1]" : "params.alibi_slopes[1]";
            fa_status st = fa_forward(NULL, &p, &tq, &tq, &tq, &to, &tl);
            CHECK_MSG(st == FA_ERR_VALUE && strstr(fa_last_error_message(), want),
                      "fa_forward: %s: %s", fa_status_name(st), fa_last_error_message());
            CHECK(memcmp(o, o0, sizeof o) == 0);
            fa_kvcache kv;
            fa_kvcache_init(&kv);
            kv.k_cache = tq, kv.v_cache = tq;
            st = fa_forward_kvcache(NULL, &p, &tq, &kv, &to, NULL);
            CHECK_MSG(st == FA_ERR_VALUE && strstr(fa_last_error_message(), want),
                      "fa_forward_kvcache: %s: %s", fa_status_name(st), fa_last_error_message());
            CHECK(memcmp(o, o0, sizeof o) == 0);
            /* the backward reads the slopes too */
            float dq[N], dk[N], dv[N];
            memset(dq, 0xA5, sizeof dq);
            memcpy(dk, dq, sizeof dq), memcpy(dv, dq, sizeof dq);
            fa_tensor tdq = fa_tensor_contiguous(dq, FA_DTYPE_F32, 4, qs);
            fa_tensor tdk = fa_tensor_contiguous(dk, FA_DTYPE_F32, 4, qs);
            fa_tensor tdv = fa_tensor_contiguous(dv, FA_DTYPE_F32, 4, qs);
            for (int i = 0; i < B * H * S; i++)
                lse[i] = 1.0f;
            st = fa_backward(NULL, &p, &tq, &tq, &tq, &tq, &tq, &tl, &tdq, &tdk, &tdv);
            CHECK_MSG(st == FA_ERR_VALUE && strstr(fa_last_error_message(), want),
                      "fa_backward: %s: %s", fa_status_name(st), fa_last_error_message());
            CHECK(memcmp(dq, o0, sizeof dq) == 0 && memcmp(dk, o0, sizeof dk) == 0);
            CASE_END();
        }
}

/* a · b, or a alone where the product overflows int64. */
static int64_t fa_size_or(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? a : r;
}

/* A sweep of random shapes with huge dimensions, every tensor empty or stride-0: each call
 * returns at once with FA_OK or a validation status, and never a wrapped size (UBSan). */
static void test_sweep(void) {
    CASE_BEGIN("sweep: 3000 huge or zero-element shapes on every entry point");
    long ok = 0, refused = 0;
    for (int it = 0; it < 3000; it++) {
        int64_t d[6]; /* B, Sq, Sk, H, Hk, D: sizes of every magnitude, H a multiple of Hk */
        for (int i = 0; i < 5; i++) {
            const int r = (int)tu_randint(0, 4);
            d[i] = r == 0   ? 1
                   : r == 1 ? tu_randint(2, 9)
                   : r == 2 ? (int64_t)1 << tu_randint(20, 62)
                   : r == 3 ? INT64_MAX >> tu_randint(0, 3)
                            : tu_randint(10, 1000);
        }
        d[3] = fa_size_or(d[4], d[3] % 7 + 1); /* H = Hk · g, when it fits */
        const int64_t dims[] = {1, 7, 64, 256, 257, (int64_t)1 << 40};
        d[5] = dims[tu_randint(0, 5)];
        d[1 + (int)tu_randint(0, 1)] = 0; /* Sq or Sk has no element, or B below */
        if (it % 3 == 0)
            d[0] = 0;
        const int64_t qs[4] = {d[0], d[1], d[3], d[5]}, ks[4] = {d[0], d[2], d[4], d[5]};
        const int64_t ls[3] = {d[0], d[3], d[1]};
        const fa_dtype dt = tu_randint(0, 1) ? FA_DTYPE_F32 : FA_DTYPE_BF16;
        fa_tensor q = broadcast(scratch_f, dt, 4, qs), k = broadcast(scratch_f, dt, 4, ks);
        fa_tensor o = none(dt, 4, qs), lse = none(FA_DTYPE_F32, 3, ls);
        fa_tensor dk = none(dt, 4, ks);
        const int empty_q = d[0] == 0 || d[1] == 0, empty_k = d[0] == 0 || d[2] == 0;
        fa_params p;
        fa_params_init(&p);
        p.causal = it & 1;
        p.window_left = it % 5 == 0 ? 3 : -1;
        if (!empty_q)
            continue;  /* out would need real memory */
        fa_kvcache kv; /* a cache of d[2] positions, no append */
        fa_kvcache_init(&kv);
        kv.k_cache = k, kv.v_cache = k;
        for (int call = 0; call < 3; call++) {
            if (call == 2 && !empty_k)
                break; /* the backward writes dk: Sk must be empty too */
            const fa_status st =
                call == 0   ? fa_forward(NULL, &p, &q, &k, &k, &o, &lse)
                : call == 1 ? fa_forward_kvcache(NULL, &p, &q, &kv, &o, &lse)
                            : fa_backward(NULL, &p, &q, &k, &k, &q, &q, &lse, &o, &dk, &dk);
            if (st == FA_OK)
                ok++;
            else
                refused++;
            if (st == FA_ERR_NO_MEMORY || st == FA_ERR_INTERNAL)
                CHECK_MSG(0, "call %d on B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld D=%lld: %s: %s",
                          call, (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3],
                          (long long)d[4], (long long)d[5], fa_status_name(st),
                          fa_last_error_message());
        }
    }
    printf("  sweep: %ld calls returned FA_OK, %ld were refused by validation\n", ok, refused);
    CHECK(ok > refused); /* most shapes are valid: only D outside 1..256 is refused */
    CASE_END();
}

/* With arguments, only the tests named (e.g. `test_sizes zero_elements sweep`). */
int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"varlen_huge_bounds", test_varlen_huge_bounds},
        {"zero_elements", test_zero_elements},
        {"huge_cu_seqlens", test_huge_cu_seqlens},
        {"contiguous_overflow", test_contiguous_overflow},
        {"kvcache_no_memory", test_kvcache_no_memory_writes_nothing},
        {"kvcache_int32_positions", test_kvcache_int32_positions},
        {"kvcache_shared_pages", test_kvcache_shared_pages},
        {"kvcache_batch_idx_many", test_kvcache_batch_idx_many},
        {"alibi_nonfinite", test_alibi_nonfinite},
        {"sweep", test_sweep},
    };
    tu_seed_init("test_sizes");
    for (size_t t = 0; t < sizeof tests / sizeof *tests; t++) {
        int run = argc < 2;
        for (int a = 1; a < argc; a++)
            run |= strcmp(argv[a], tests[t].name) == 0;
        if (run)
            tests[t].fn();
    }
    return TEST_REPORT();
}
