/* Defects found from outside (issue 20): black-box tests written against the public API,
   each of which failed (or crashed) before its fix. Metadata shared between MLA layers of
   other widths, last-error messages of threads failing on one context, every reason of an
   explicit request, and the MLA calls' messages. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef ATTN_NO_THREADS
#include <pthread.h>
#endif

/* Deterministic values in [-1, 1) (never all zero). */
static float out_rand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static float *out_floats(size_t n, uint32_t seed) {
    float *p = (float *)malloc(n * sizeof *p);
    size_t i;
    if (p)
        for (i = 0; i < n; i++) p[i] = out_rand(&seed);
    return p;
}

/* Metadata for `layer` with just the capacity of one batch (nreq requests: query starts
   qsl, sequence lengths seq, block-table rows of `stride` ids, slots), built from it; NULL
   after a failure (reported). */
static attn_metadata *out_meta(attn_layer *layer, int nreq, const int32_t *qsl, const int32_t *seq,
                               const int32_t *table, int stride, const int64_t *slots, int64_t num_blocks) {
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch bt;
    int r;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = nreq;
    md.max_num_tokens = qsl[nreq];
    md.max_blocks_per_req = stride;
    md.num_blocks = num_blocks;
    memset(&bt, 0, sizeof bt);
    bt.query_start_loc = qsl;
    bt.seq_lens = seq;
    bt.block_table = table;
    bt.block_table_stride = stride;
    bt.slot_mapping = slots;
    bt.num_reqs = nreq;
    bt.num_actual_tokens = qsl[nreq];
    for (r = 0; r < nreq; r++) {
        if (qsl[r + 1] - qsl[r] > bt.max_query_len) bt.max_query_len = qsl[r + 1] - qsl[r];
        if (seq[r] > bt.max_seq_len) bt.max_seq_len = seq[r];
    }
    if (!layer) return NULL;
    EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    if (meta && attn_metadata_build(meta, 0, &bt, 0) != ATTN_OK) {
        attn_test_fail(__FILE__, __LINE__, "attn_metadata_build: %s", attn_context_last_error(attn_layer_context(layer)));
        attn_metadata_destroy(meta);
        meta = NULL;
    }
    return meta;
}

/* ---- 1. metadata shared between MLA layers of other qk_nope / v widths ---------------- */

#define OUT_MLA_H 16
#define OUT_MLA_D 576
#define OUT_MLA_R 512
#define OUT_MLA_P 64
#define OUT_MLA_T 40 /* 1 decode + 1 prefill of 39 tokens */
#define OUT_MLA_BLOCKS 8

static attn_layer *out_mla_layer(attn_context *ctx, int nope, int v) {
    attn_layer_desc d;
    attn_layer *layer = NULL;
    memset(&d, 0, sizeof d);
    d.num_heads = OUT_MLA_H;
    d.head_size = OUT_MLA_D;
    d.dtype = ATTN_DTYPE_F32;
    d.use_mla = 1;
    d.qk_nope_head_dim = nope;
    d.v_head_dim = v;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    return layer;
}

ATTN_TEST(out_mla_metadata_of_other_widths_is_refused) {
    attn_test_log log;
    attn_context *ctx = attn_test_context(&log, ATTN_LOG_LEVEL_NONE, 2);
    attn_layer *a, *b;
    attn_metadata *meta = NULL;
    int32_t qsl[3] = {0, 1, OUT_MLA_T}, seq[2] = {20, 39}, table[2 * 4];
    int64_t slots[OUT_MLA_T];
    int i;
    REQUIRE(ctx != NULL);
    a = out_mla_layer(ctx, 64, 64);
    b = out_mla_layer(ctx, 128, 128);
    for (i = 0; i < 8; i++) table[i] = i;
    for (i = 0; i < OUT_MLA_T; i++) slots[i] = i == 0 ? 19 : 64 + i - 1;
    meta = out_meta(a, 2, qsl, seq, table, 4, slots, OUT_MLA_BLOCKS);
    /* the fused call, forward_mha and forward_mqa of the 128-wide layer over the 64-wide
       layer's metadata: each refused, naming both widths, nothing written */
    if (meta && b) {
        size_t nq = (size_t)OUT_MLA_T * OUT_MLA_H;
        float *qn = out_floats(nq * 128, 1), *qp = out_floats(nq * OUT_MLA_P, 2);
        float *qh = out_floats(nq * (128 + OUT_MLA_P), 3);
        float *cache = out_floats((size_t)OUT_MLA_BLOCKS * 16 * OUT_MLA_D, 4);
        float *wuk = out_floats((size_t)OUT_MLA_H * 128 * OUT_MLA_R, 5);
        float *wuv = out_floats((size_t)OUT_MLA_H * OUT_MLA_R * 128, 6);
        float *out = (float *)malloc(nq * OUT_MLA_R * sizeof(float));
        int64_t sqn[3] = {OUT_MLA_T, OUT_MLA_H, 128}, sqp[3] = {OUT_MLA_T, OUT_MLA_H, OUT_MLA_P};
        int64_t sqh[3] = {OUT_MLA_T, OUT_MLA_H, 128 + OUT_MLA_P}, sqm[3] = {OUT_MLA_T, OUT_MLA_H, OUT_MLA_D};
        int64_t sc[3] = {OUT_MLA_BLOCKS, 16, OUT_MLA_D}, suk[3] = {OUT_MLA_H, 128, OUT_MLA_R};
        int64_t suv[3] = {OUT_MLA_H, OUT_MLA_R, 128}, so[3] = {OUT_MLA_T, OUT_MLA_H, 128};
        int64_t sol[3] = {OUT_MLA_T, OUT_MLA_H, OUT_MLA_R};
        attn_tensor tqn, tqp, tqh, tqm, tc, tuk, tuv, to, tol;
        const char *msg;
        if (!qn || !qp || !qh || !cache || !wuk || !wuv || !out) {
            EXPECT_TRUE(0);
        } else {
            tqn = attn_tensor_make(qn, ATTN_DTYPE_F32, 3, sqn);
            tqp = attn_tensor_make(qp, ATTN_DTYPE_F32, 3, sqp);
            tqh = attn_tensor_make(qh, ATTN_DTYPE_F32, 3, sqh);
            tqm = attn_tensor_make(qh, ATTN_DTYPE_F32, 3, sqm);
            tc = attn_tensor_make(cache, ATTN_DTYPE_F32, 3, sc);
            tuk = attn_tensor_make(wuk, ATTN_DTYPE_F32, 3, suk);
            tuv = attn_tensor_make(wuv, ATTN_DTYPE_F32, 3, suv);
            to = attn_tensor_make(out, ATTN_DTYPE_F32, 3, so);
            tol = attn_tensor_make(out, ATTN_DTYPE_F32, 3, sol);
            (void)tqm;
            memset(out, 0x7f, nq * OUT_MLA_R * sizeof(float));
            EXPECT_STATUS(attn_mla_forward(b, meta, &tqn, &tqp, NULL, NULL, &tc, &tuk, &tuv, &to, NULL),
                          ATTN_ERROR_INVALID_METADATA);
            msg = attn_context_last_error(ctx);
            EXPECT_TRUE(strstr(msg, "qk_nope_head_dim 64 (this layer: 128)") != NULL);
            EXPECT_TRUE(strstr(msg, "v_head_dim 64 (this layer: 128)") != NULL);
            EXPECT_TRUE(strstr(msg, "allowed:") != NULL);
            EXPECT_STATUS(attn_mla_forward_mha(b, meta, &tqh, &tc, &tuk, &tuv, &to, NULL, NULL),
                          ATTN_ERROR_INVALID_METADATA);
            EXPECT_TRUE(strstr(attn_context_last_error(ctx), "attn_mla_forward_mha") != NULL);
            EXPECT_STATUS(attn_mla_forward_mqa(b, meta, &tqm, NULL, &tc, &tol, NULL, NULL),
                          ATTN_ERROR_INVALID_METADATA);
            EXPECT_TRUE(attn_test_all_bytes(out, nq * OUT_MLA_R * sizeof(float), 0x7f));
            /* the layer that created it still runs over it */
            if (a) {
                int64_t sqn6[3] = {OUT_MLA_T, OUT_MLA_H, 64}, suk6[3] = {OUT_MLA_H, 64, OUT_MLA_R};
                int64_t suv6[3] = {OUT_MLA_H, OUT_MLA_R, 64}, so6[3] = {OUT_MLA_T, OUT_MLA_H, 64};
                attn_tensor tqn6 = attn_tensor_make(qn, ATTN_DTYPE_F32, 3, sqn6);
                attn_tensor tuk6 = attn_tensor_make(wuk, ATTN_DTYPE_F32, 3, suk6);
                attn_tensor tuv6 = attn_tensor_make(wuv, ATTN_DTYPE_F32, 3, suv6);
                attn_tensor to6 = attn_tensor_make(out, ATTN_DTYPE_F32, 3, so6);
                EXPECT_OK(attn_mla_forward(a, meta, &tqn6, &tqp, NULL, NULL, &tc, &tuk6, &tuv6, &to6, NULL));
                EXPECT_TRUE(out[0] == out[0] && !attn_test_all_bytes(out, 4, 0x7f));
            }
        }
        free(qn); free(qp); free(qh); free(cache); free(wuk); free(wuv); free(out);
    }
    attn_metadata_destroy(meta);
    attn_layer_destroy(a);
    attn_layer_destroy(b);
    attn_context_destroy(ctx);
}

/* ---- 2. threads failing on one context keep their own last error ---------------------- */

#ifndef ATTN_NO_THREADS
/* A hook that reads every line it gets (and keeps nothing: it may run on any thread). */
static void out_read_hook(void *user_data, attn_log_level level, attn_log_item item, const char *message) {
    volatile size_t n = strlen(message);
    (void)user_data; (void)level; (void)item; (void)n;
}

typedef struct out_fail_arg {
    attn_context *ctx;
    int id;
    int own;   /* every message this thread read named its own value */
    int fails; /* creates that failed as they should */
} out_fail_arg;

static void *out_fail_thread(void *p) {
    out_fail_arg *a = (out_fail_arg *)p;
    int k;
    a->own = 1;
    for (k = 0; k < 40; k++) {
        attn_layer_desc d;
        attn_layer *layer = NULL;
        char want[64];
        memset(&d, 0, sizeof d);
        d.num_heads = 8;
        d.head_size = 1000 + 8 * (a->id * 40 + k); /* out of range: a message per value */
        d.dtype = ATTN_DTYPE_F32;
        if (attn_layer_create(a->ctx, &d, NULL, &layer) != ATTN_OK) a->fails++;
        attn_layer_destroy(layer);
        snprintf(want, sizeof want, "head_size %d", d.head_size);
        if (!strstr(attn_context_last_error(a->ctx), want)) a->own = 0;
    }
    return NULL;
}
#endif

ATTN_TEST(out_threads_failing_on_one_context_keep_their_messages) {
#ifdef ATTN_NO_THREADS
    SKIP("built without threads (ATTN_NO_THREADS)");
#else
    attn_context_desc cd;
    attn_context *ctx = NULL;
    out_fail_arg args[8];
    pthread_t th[8];
    int i;
    memset(&cd, 0, sizeof cd);
    cd.log = out_read_hook; /* each ERROR line is formatted and read */
    cd.log_level = ATTN_LOG_LEVEL_ERROR;
    cd.num_threads = 1;
    EXPECT_OK(attn_context_create(&cd, &ctx));
    REQUIRE(ctx != NULL);
    memset(args, 0, sizeof args);
    for (i = 0; i < 8; i++) {
        args[i].ctx = ctx;
        args[i].id = i;
        pthread_create(&th[i], NULL, out_fail_thread, &args[i]);
    }
    for (i = 0; i < 8; i++) pthread_join(th[i], NULL);
    for (i = 0; i < 8; i++) {
        EXPECT_EQ_INT(args[i].fails, 40);
        EXPECT_TRUE(args[i].own);
    }
    /* this thread failed on nothing: its message on ctx is empty */
    EXPECT_TRUE(attn_context_last_error(ctx)[0] == 0);
    attn_context_destroy(ctx);
#endif
}

/* ---- 5. an explicit request that fails names every failing check -------------------- */

ATTN_TEST(out_explicit_request_lists_every_reason) {
    attn_test_log log;
    attn_context *ctx = attn_test_context(&log, ATTN_LOG_LEVEL_NONE, 1);
    attn_test_env env = attn_test_env_save("ATTN_BACKEND");
    attn_platform pf;
    attn_layer_desc d;
    attn_select_request rq;
    attn_selection sel;
    attn_layer *layer = NULL;
    const char *msg;
    REQUIRE(ctx != NULL);
    EXPECT_OK(attn_platform_get(ctx, &pf));
    memset(&d, 0, sizeof d);
    d.num_heads = 8;
    d.head_size = 128;
    d.dtype = ATTN_DTYPE_F16;
    /* ATTN_BACKEND=cuda for a CPU layer: where there is no GPU, the platform's reason comes
       first, then the device; with a GPU, the device */
    setenv("ATTN_BACKEND", "cuda", 1);
    memset(&rq, 0, sizeof rq);
    if (attn_backend_from_name("cuda", &rq.backend) != ATTN_OK) { /* ATTN_NO_CUDA: no such backend */
        EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNKNOWN_BACKEND);
    } else {
        EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_BACKEND_UNAVAILABLE);
        msg = attn_context_last_error(ctx);
        EXPECT_TRUE(strstr(msg, "attn_layer_desc.device") != NULL);
    }
    msg = attn_context_last_error(ctx);
    if (pf.kind != ATTN_PLATFORM_CUDA && rq.backend == ATTN_BACKEND_CUDA) {
        const char *plat = strstr(msg, pf.cuda_reason);
        EXPECT_TRUE(pf.cuda_reason[0] != 0);
        EXPECT_TRUE(plat != NULL);
        EXPECT_TRUE(plat && plat < strstr(msg, "attn_layer_desc.device"));
    }
    attn_test_env_restore(&env);
    /* code asks CPU for an MLA layer of head size 576: two failing checks, both named, in
       the error and in the record */
    d.use_mla = 1;
    d.num_heads = 16;
    d.head_size = 576;
    memset(&rq, 0, sizeof rq);
    rq.backend = ATTN_BACKEND_CPU;
    EXPECT_STATUS(attn_layer_create(ctx, &d, &rq, &layer), ATTN_ERROR_BACKEND_UNAVAILABLE);
    msg = attn_context_last_error(ctx);
    EXPECT_TRUE(strstr(msg, "the layer is MLA") != NULL);
    EXPECT_TRUE(strstr(msg, "head_size 576") != NULL);
    EXPECT_STATUS(attn_select_backend(ctx, &d, &rq, &sel), ATTN_ERROR_BACKEND_UNAVAILABLE);
    EXPECT_EQ_INT(sel.num_skipped, 1);
    EXPECT_TRUE(strstr(sel.skipped[0].reason, "the layer is MLA") != NULL);
    EXPECT_TRUE(strstr(sel.skipped[0].reason, "head_size 576") != NULL);
    EXPECT_TRUE(layer == NULL);
    attn_context_destroy(ctx);
}

/* ---- 6. the MLA calls' messages name the call and the MLA default ------------------- */

ATTN_TEST(out_mla_messages_name_the_call_and_the_mla_scale) {
    attn_test_log log;
    attn_context *ctx = attn_test_context(&log, ATTN_LOG_LEVEL_NONE, 1);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    float kscale = 0.5f;
    int32_t qsl[3] = {0, 1, 3}, seq[2] = {5, 2}, table[2] = {0, 1};
    int64_t slots[3] = {4, 16, 17};
    enum { H = 4, T = 3, R = 256, P = 64, N = 32, V = 32 };
    const char *msg;
    REQUIRE(ctx != NULL);
    memset(&d, 0, sizeof d);
    d.num_heads = H;
    d.head_size = R + P;
    d.dtype = ATTN_DTYPE_F32;
    d.use_mla = 1;
    d.qk_nope_head_dim = N;
    d.v_head_dim = V;
    d.scale = -1.0f;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    msg = attn_context_last_error(ctx);
    EXPECT_TRUE(strstr(msg, "1/sqrt(qk_nope_head_dim + qk_rope_head_dim)") != NULL);
    EXPECT_TRUE(strstr(msg, "1/sqrt(head_size)") == NULL);
    d.scale = 0.0f;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
    d.k_scale.ptr = &kscale;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    meta = out_meta(layer, 2, qsl, seq, table, 1, slots, 2);
    if (meta) {
        float *qn = out_floats((size_t)T * H * N, 11), *qp = out_floats((size_t)T * H * P, 12);
        float *kc = out_floats((size_t)T * R, 13), *kp = out_floats((size_t)T * P, 14);
        float *wuk = out_floats((size_t)H * N * R, 15), *wuv = out_floats((size_t)H * R * V, 16);
        float out[T * H * V];
        unsigned char cache[2 * 16 * (R + P)];
        int64_t sqn[3] = {T, H, N}, sqp[3] = {T, H, P}, skc[2] = {T, R}, skp[2] = {T, P};
        int64_t suk[3] = {H, N, R}, suv[3] = {H, R, V}, so[3] = {T, H, V}, sc[3] = {2, 16, R + P};
        attn_tensor tqn = attn_tensor_make(qn, ATTN_DTYPE_F32, 3, sqn), tqp = attn_tensor_make(qp, ATTN_DTYPE_F32, 3, sqp);
        attn_tensor tkc = attn_tensor_make(kc, ATTN_DTYPE_F32, 2, skc), tkp = attn_tensor_make(kp, ATTN_DTYPE_F32, 2, skp);
        attn_tensor tuk = attn_tensor_make(wuk, ATTN_DTYPE_F32, 3, suk), tuv = attn_tensor_make(wuv, ATTN_DTYPE_F32, 3, suv);
        attn_tensor to = attn_tensor_make(out, ATTN_DTYPE_F32, 3, so);
        attn_tensor tc = attn_tensor_make(cache, ATTN_DTYPE_FP8_E4M3, 3, sc);
        memset(cache, 0x11, sizeof cache);
        memset(out, 0x7f, sizeof out);
        kscale = -2.0f; /* a bad value at the call: refused by the call that was made */
        EXPECT_STATUS(attn_mla_forward(layer, meta, &tqn, &tqp, &tkc, &tkp, &tc, &tuk, &tuv, &to, NULL),
                      ATTN_ERROR_INVALID_VALUE);
        msg = attn_context_last_error(ctx);
        EXPECT_TRUE(strncmp(msg, "attn_mla_forward:", 17) == 0);
        EXPECT_TRUE(strstr(msg, "k_scale") != NULL);
        EXPECT_TRUE(attn_test_all_bytes(cache, sizeof cache, 0x11));
        EXPECT_TRUE(attn_test_all_bytes(out, sizeof out, 0x7f));
        kscale = 0.5f;
        EXPECT_OK(attn_mla_forward(layer, meta, &tqn, &tqp, &tkc, &tkp, &tc, &tuk, &tuv, &to, NULL));
        EXPECT_TRUE(!attn_test_all_bytes(out, sizeof out, 0x7f) && out[0] == out[0]);
        free(qn); free(qp); free(kc); free(kp); free(wuk); free(wuv);
    }
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* ---- issue 21: an ATTN_NO_CUDA build opens no CUDA library ------------------------------ */

static int out_opens;
static void *out_open(void *user_data, const char *soname) {
    (void)user_data; (void)soname;
    out_opens++;
    return NULL; /* nothing is found: the platform is CPU either way */
}

ATTN_TEST(out_no_cuda_build_opens_no_library) {
    attn_context_desc cd;
    attn_loader loader;
    attn_context *ctx = NULL;
    attn_platform pf;
    attn_layer_desc d;
    attn_layer *layer = NULL;
    memset(&cd, 0, sizeof cd);
    memset(&loader, 0, sizeof loader);
    loader.open = out_open;
    cd.loader = &loader;
    cd.log_level = ATTN_LOG_LEVEL_NONE;
    cd.num_threads = 1;
    out_opens = 0;
    REQUIRE_OK(attn_context_create(&cd, &ctx));
    memset(&d, 0, sizeof d);
    d.num_heads = 4;
    d.head_size = 64;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));      /* the selector walks every backend */
    EXPECT_OK(attn_platform_get(ctx, &pf));
    EXPECT_EQ_INT(pf.kind, ATTN_PLATFORM_CPU);
#ifdef ATTN_NO_CUDA
    EXPECT_EQ_INT(out_opens, 0);
    EXPECT_TRUE(strstr(pf.cuda_reason, "ATTN_NO_CUDA") != NULL);
    EXPECT_TRUE(strstr(pf.nvrtc_reason, "ATTN_NO_CUDA") != NULL);
    EXPECT_STATUS(attn_kernel_compile(ctx, "util.cu", "", "sm_80", NULL), ATTN_ERROR_PLATFORM);
#else
    EXPECT_TRUE(out_opens >= 2); /* the driver's sonames, then NVRTC's */
#endif
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* ---- issue 21: a backend's LSE base and graph level are acted on ------------------------ */

/* A CPU plugin whose kernels produce base-2 LSE: lse[t][h] = (t + 1 + h / 8) log2(e). */
static attn_status out_b2_forward(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                  const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                  attn_tensor *kv_cache, attn_tensor *out, attn_tensor *lse, void *stream) {
    int64_t t, h;
    (void)self; (void)layer; (void)q; (void)k; (void)v; (void)kv_cache; (void)stream;
    memset(out->data, 0, (size_t)out->shape[0] * (size_t)out->shape[1] * (size_t)out->shape[2] * sizeof(float));
    for (t = 0; lse && t < attn_metadata_batch(meta)->num_actual_tokens; t++)
        for (h = 0; h < lse->shape[1]; h++)
            ((float *)lse->data)[t * lse->shape[1] + h] = (float)((double)(t + 1) + (double)h / 8.0) * 1.4426950408889634f;
    return ATTN_OK;
}
static attn_status out_b2_write(const attn_backend *self, attn_layer *layer, const attn_tensor *key,
                                const attn_tensor *value, attn_tensor *kv_cache, const attn_tensor *slots,
                                void *stream) {
    (void)self; (void)layer; (void)key; (void)value; (void)kv_cache; (void)slots; (void)stream;
    return ATTN_OK;
}
static int out_b2_shape(const attn_backend *self, const attn_layer_desc *d, int64_t num_blocks,
                        int64_t shape[ATTN_MAX_DIMS]) {
    (void)self;
    shape[0] = num_blocks; shape[1] = 2; shape[2] = d->block_size; shape[3] = d->num_kv_heads; shape[4] = d->head_size;
    return 5;
}

ATTN_TEST(out_lse_base_and_graph_level_enforced) {
    static attn_backend plug, bad;
    attn_test_log log;
    attn_context *ctx;
    attn_layer_desc d;
    attn_select_request rq;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    int32_t qsl[3] = {0, 1, 3}, seq[2] = {1, 2}, table[2] = {0, 1};
    int64_t slots[3] = {0, 16, 17}, sq[3] = {3, 4, 16}, sl[2] = {3, 4}, sc[5] = {2, 2, 16, 4, 16};
    float q[3 * 4 * 16], out[3 * 4 * 16], lse[3 * 4], cache[2 * 2 * 16 * 4 * 16];
    attn_tensor tq, to, tl, tc;
    int t, h;
    memset(&plug, 0, sizeof plug);
    plug.name = "BASE2";
    plug.id = ATTN_BACKEND_CUSTOM;
    plug.device = ATTN_DEVICE_CPU;
    plug.dtypes = plug.kv_cache_dtypes = ATTN_DTYPE_BIT(ATTN_DTYPE_F32);
    plug.head_size_min = 8; plug.head_size_max = 256; plug.head_size_multiple = 8;
    plug.block_size_multiple = 16;
    plug.can_return_lse = 1;
    plug.lse_base = ATTN_LSE_BASE_2;
    plug.kv_cache_shape = out_b2_shape;
    plug.forward = out_b2_forward;
    plug.reshape_and_cache = out_b2_write;
    /* what registration refuses: a GPU backend in base 2, values outside the enums */
    bad = plug;
    bad.device = ATTN_DEVICE_CUDA;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, &bad), ATTN_ERROR_UNSUPPORTED);
    bad = plug;
    bad.lse_base = (attn_lse_base)7;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, &bad), ATTN_ERROR_INVALID_VALUE);
    bad = plug;
    bad.cuda_graph = (attn_cuda_graph_support)9;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, &bad), ATTN_ERROR_INVALID_VALUE);
    REQUIRE_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, &plug));
    ctx = attn_test_context(&log, ATTN_LOG_LEVEL_NONE, 1);
    memset(&d, 0, sizeof d);
    d.num_heads = 4; d.head_size = 16; d.dtype = ATTN_DTYPE_F32;
    memset(&rq, 0, sizeof rq);
    rq.backend = ATTN_BACKEND_CUSTOM;
    if (ctx) EXPECT_OK(attn_layer_create(ctx, &d, &rq, &layer));
    meta = out_meta(layer, 2, qsl, seq, table, 1, slots, 2);
    if (meta) {
        memset(q, 0, sizeof q);
        memset(cache, 0, sizeof cache);
        tq = attn_tensor_make(q, ATTN_DTYPE_F32, 3, sq);
        to = attn_tensor_make(out, ATTN_DTYPE_F32, 3, sq);
        tl = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, sl);
        tc = attn_tensor_make(cache, ATTN_DTYPE_F32, 5, sc);
        EXPECT_EQ_INT(attn_layer_selection(layer)->lse_base, ATTN_LSE_BASE_2);
        EXPECT_OK(attn_layer_forward(layer, meta, &tq, NULL, NULL, &tc, &to, &tl, NULL));
        for (t = 0; t < 3; t++) /* the caller gets base e */
            for (h = 0; h < 4; h++) EXPECT_NEAR(lse[t * 4 + h], (double)(t + 1) + (double)h / 8.0, 1e-5, 1e-6);
    }
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, NULL));
}

/* ---- issue 21: the cache writes take the slot mapping as a tensor ----------------------- */

ATTN_TEST(out_slot_mapping_tensor_checked) {
    attn_test_log log;
    attn_context *ctx = attn_test_context(&log, ATTN_LOG_LEVEL_NONE, 1);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    float k[4 * 2 * 16], cache[2 * 2 * 16 * 2 * 16];
    int64_t slots[8] = {0, 1, 2, 3, 4, 5, 6, 7}, sk[3] = {4, 2, 16}, sc[5] = {2, 2, 16, 2, 16}, two[2] = {2, 2};
    int32_t slots32[4] = {0, 1, 2, 3};
    attn_tensor tk, tc, sm;
    int i;
    REQUIRE(ctx != NULL);
    memset(&d, 0, sizeof d);
    d.num_heads = 2; d.head_size = 16; d.dtype = ATTN_DTYPE_F32;
    REQUIRE_OK(attn_layer_create(ctx, &d, NULL, &layer));
    for (i = 0; i < 4 * 2 * 16; i++) k[i] = (float)(i % 13) * 0.25f - 1.0f;
    memset(cache, 0x7f, sizeof cache);
    tk = attn_tensor_make(k, ATTN_DTYPE_F32, 3, sk);
    tc = attn_tensor_make(cache, ATTN_DTYPE_F32, 5, sc);
    /* slots of another element type (4-byte floats) */
    sm = attn_tensor_make(slots32, ATTN_DTYPE_F32, 1, sk);
    EXPECT_STATUS(attn_reshape_and_cache(layer, &tk, &tk, &tc, &sm, NULL), ATTN_ERROR_SHAPE_MISMATCH);
    /* two dimensions */
    sm = attn_tensor_make(slots, ATTN_DTYPE_INT64, 2, two);
    EXPECT_STATUS(attn_reshape_and_cache(layer, &tk, &tk, &tc, &sm, NULL), ATTN_ERROR_SHAPE_MISMATCH);
    /* every other slot (stride 2) */
    sm = attn_tensor_slots(slots, 4);
    sm.strides[0] = 2;
    EXPECT_STATUS(attn_reshape_and_cache(layer, &tk, &tk, &tc, &sm, NULL), ATTN_ERROR_SHAPE_MISMATCH);
    /* declared on a GPU for a CPU layer */
    sm = attn_tensor_slots(slots, 4);
    sm.device.kind = ATTN_DEVICE_CUDA;
    EXPECT_STATUS(attn_reshape_and_cache(layer, &tk, &tk, &tc, &sm, NULL), ATTN_ERROR_SHAPE_MISMATCH);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "slot_mapping") != NULL);
    /* more slots than key rows */
    sm = attn_tensor_slots(slots, 8);
    EXPECT_STATUS(attn_reshape_and_cache(layer, &tk, &tk, &tc, &sm, NULL), ATTN_ERROR_SHAPE_MISMATCH);
    EXPECT_TRUE(attn_test_all_bytes(cache, sizeof cache, 0x7f));
    /* and the write that is right */
    sm = attn_tensor_slots(slots, 4);
    EXPECT_OK(attn_reshape_and_cache(layer, &tk, &tk, &tc, &sm, NULL));
    EXPECT_TRUE(cache[0] == k[0] && cache[16] == k[16]); /* token 0, heads 0 and 1 */
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

void suite_outside(void) {
    ATTN_RUN(out_mla_metadata_of_other_widths_is_refused);
    ATTN_RUN(out_threads_failing_on_one_context_keep_their_messages);
    ATTN_RUN(out_explicit_request_lists_every_reason);
    ATTN_RUN(out_mla_messages_name_the_call_and_the_mla_scale);
    ATTN_RUN(out_no_cuda_build_opens_no_library);
    ATTN_RUN(out_lse_base_and_graph_level_enforced);
    ATTN_RUN(out_slot_mapping_tensor_checked);
}
