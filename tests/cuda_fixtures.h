/* cuda_fixtures.h - what the CUDA test files (tests/test_cuda_*.c) share: a context and the
   reason a test skips without a device, host buffers with their device copies, random
   fills, a case runner that puts one varlen batch through a CUDA layer and a CPU layer of
   the same descriptor and compares them, and libcuda's graph calls, opened by the tests
   themselves (the library exposes none).

       attn_test_log log;
       attn_context *ctx = cu_ctx(&log);
       cu_case c;
       CU_SKIP_IF_NO_GPU(ctx);                // no device: ctx destroyed, the test SKIPs
       memset(&c, 0, sizeof c);
       c.heads = 32; c.kv_heads = 8; c.head = 128; c.dt = c.kv_dt = ATTN_DTYPE_BF16;
       c.block = 16; c.causal = 1;
       cu_random_reqs(&c, 70, 900);           // decodes and chunked prefills
       EXPECT_EQ_INT(cu_run_case(ctx, &c, __LINE__), 0);
       attn_context_destroy(ctx);

   The random draws are one stream (cu_rand) shared by every CUDA test, so what a test
   draws depends on the tests run before it. Include after attn.h, attn_test.h and
   fixtures.h; the implementation is compiled where ATTN_TEST_IMPLEMENTATION is defined
   (tests/main.c). */
#ifndef ATTN_TEST_CUDA_FIXTURES_H
#define ATTN_TEST_CUDA_FIXTURES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- contexts, buffers, random fills ------------------------------------------------- */

/* A context of 2 threads logging INFO and above into log. */
attn_context *cu_ctx(attn_test_log *log);
/* NULL when a CUDA device is here, else the reason. */
const char *cu_unavailable(attn_context *ctx);
/* Ends the test as skipped, with the reason, where no CUDA device is here (ctx destroyed). */
#define CU_SKIP_IF_NO_GPU(ctx)                       \
    do {                                             \
        const char *why_ = cu_unavailable(ctx);      \
        if (why_) {                                  \
            attn_context_destroy(ctx);               \
            SKIP(why_);                              \
        }                                            \
    } while (0)

/* The CUDA tests' one stream of random draws; cu_uniform is in [-0.5, 0.5). */
unsigned cu_rand(void);
float cu_uniform(void);
/* n elements of p (f32, f16 or bf16) in [-scale / 2, scale / 2); element i read as f32. */
void cu_fill(void *p, attn_dtype dt, size_t n, float scale);
float cu_get(const void *p, attn_dtype dt, size_t i);

/* A host buffer and its device copy. */
typedef struct cu_buf {
    void *host, *dev;
    size_t bytes;
} cu_buf;
/* 1 when both copies are allocated (the host one zeroed). */
int cu_buf_make(attn_context *ctx, cu_buf *b, size_t bytes);
void cu_buf_free(attn_context *ctx, cu_buf *b);
/* The host copy to the device, the device copy to dst; 1 on success. */
int cu_up(attn_context *ctx, cu_buf *b);
int cu_down(attn_context *ctx, cu_buf *b, void *dst);
/* A contiguous tensor of ndim dims (a, b, c), on the device where cuda is set. */
attn_tensor cu_tensor(void *data, attn_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int cuda);

/* ---- one batch on both backends ------------------------------------------------------ */

typedef struct cu_case {
    int heads, kv_heads, head, block;
    attn_dtype dt, kv_dt;
    int causal, window, alibi, lse;
    attn_causal batch_causal; /* the batch's own setting (DEFAULT: the layer's) */
    float softcap;
    int nreq, qlen[8], ctxlen[8];
    attn_backend_id backend; /* AUTO: the selector's choice (cu_auto_backend) */
    /* 8-bit caches (kv_dt fp8 / int8): per-token-head scales, or per-tensor scales given to
       the CUDA layer as device pointers (the CPU layer takes the values) */
    int pth, scale_ptr;
    int sinks; /* attention sinks: host floats for the CPU layer, the same in device memory for the CUDA one */
    int prefix; /* cascade: every request's first `prefix` tokens are request 0's blocks (a multiple of
                   block, at most every context), the CUDA metadata built with common_prefix_len =
                   prefix, the CPU's with 0 (the reference computes every row over its own keys) */
} cu_case;

/* What the selector picks for a CUDA layer: CUDA_SM90 (the wgmma prefill) on compute
   capability 9.0 within its scope, else CUDA. */
attn_backend_id cu_auto_backend(attn_context *ctx, const attn_layer_desc *d);
/* Whether the record skipped backend id with a reason that contains word. */
int cu_skip_reason(const attn_selection *s, attn_backend_id id, const char *word);
/* A random varlen batch for case c: 1-6 requests, the first half decodes (the others now and
   then), the rest 1..max_q new tokens, contexts below max_ctx (non-causal prefills: below
   50, the masks' edge cases without long all-visible rows). */
void cu_random_reqs(cu_case *c, int max_q, int max_ctx);
/* Fills every slot of a host cache of the layer's shape through the CPU layer's cache write:
   random k/v of dtype dt in [-1, 1), stored as the library stores them (8-bit caches: their
   codes and scales). 1 on success. */
int cu_fill_by_write(attn_layer *cpu, void *cache, attn_dtype kv_dt, int ndim, const int64_t *shape,
                     attn_dtype dt, int num_blocks, int block, int kv_heads, int head);
/* Runs one case on both backends; returns the number of mismatches reported (each named
   at the caller's file and line). */
int cu_run_case_at(attn_context *ctx, const cu_case *c, const char *file, int line);
#define cu_run_case(ctx, c, line) cu_run_case_at((ctx), (c), __FILE__, (line))

/* ---- libcuda's graph and stream calls ------------------------------------------------- */

typedef int (*cu_fn_stream_create)(void **, unsigned);
typedef int (*cu_fn_stream_destroy)(void *);
typedef int (*cu_fn_begin)(void *, int);
typedef int (*cu_fn_end)(void *, void **);
typedef int (*cu_fn_instantiate)(void **, void *, unsigned long long);
typedef int (*cu_fn_launch)(void *, void *);
typedef int (*cu_fn_destroy)(void *);
typedef int (*cu_fn_sync)(void *);
typedef int (*cu_fn_retain)(void **, int);
typedef int (*cu_fn_set)(void *);
typedef int (*cu_fn_release)(int);

/* A symbol of libcuda (NULL if absent). CU_LOAD(var, type, name) loads name into var, and
   into the caller's `missing` where it is absent, from the caller's `lib`. */
void *cu_sym(void *lib, const char *name);
#define CU_LOAD(var, type, name)                                 \
    do {                                                         \
        void *s_ = cu_sym(lib, name);                            \
        memcpy(&var, &s_, sizeof var);                           \
        if (!s_) missing = name;                                 \
    } while (0)

/* libcuda's graph calls, opened by the test itself (the library exposes none), and a
   stream of the device's primary context made current on this thread (the library works
   in that context). */
typedef struct cu_graph_api {
    void *lib, *pctx, *stream;
    cu_fn_stream_create stream_create;
    cu_fn_stream_destroy stream_destroy;
    cu_fn_begin begin;
    cu_fn_end end;
    cu_fn_instantiate instantiate;
    cu_fn_launch launch;
    cu_fn_destroy exec_destroy, graph_destroy;
    cu_fn_sync sync;
    cu_fn_retain retain;
    cu_fn_set set_current;
    cu_fn_release release;
} cu_graph_api;

/* 0: ready; 1: libcuda cannot be opened here (the caller skips); -1: a failure, reported. */
int cu_graph_open(cu_graph_api *g);
/* The stream and the primary context's reference (libcuda stays open: g->lib). */
void cu_graph_close(cu_graph_api *g);
/* The same layer on the CPU (d as given, device CPU) and on the GPU, and a metadata of md
   for each: the graph tests' CPU reference beside the captured GPU calls. 0 on a failure
   (reported); what was created is left for the caller's cleanup. */
int cu_layer_pair(attn_context *ctx, attn_layer_desc *d, const attn_metadata_desc *md, attn_layer **cpu,
                  attn_layer **gpu, attn_metadata **mc, attn_metadata **mg);

#endif

#if defined(ATTN_TEST_IMPLEMENTATION) && !defined(ATTN_TEST_CUDA_FIXTURES_IMPLEMENTED)
#define ATTN_TEST_CUDA_FIXTURES_IMPLEMENTED
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

attn_context *cu_ctx(attn_test_log *log) {
    attn_context *ctx = attn_test_context(log, ATTN_LOG_LEVEL_INFO, 2);
    return ctx;
}

const char *cu_unavailable(attn_context *ctx) {
    static attn_platform p;
    if (!ctx || attn_platform_get(ctx, &p) != ATTN_OK) return "no context";
    if (p.kind != ATTN_PLATFORM_CUDA) return p.cuda_reason;
    if (p.cuda_capability_major < 8) return "compute capability below 8.0";
    if (!p.nvrtc_version) return p.nvrtc_reason;
    return NULL;
}

static unsigned cu_rand_state = 12345u;
unsigned cu_rand(void) {
    cu_rand_state = cu_rand_state * 1664525u + 1013904223u;
    return cu_rand_state >> 8;
}
float cu_uniform(void) { return (float)(cu_rand() & 0xffff) / 65536.0f - 0.5f; }

void cu_fill(void *p, attn_dtype dt, size_t n, float scale) {
    size_t i;
    for (i = 0; i < n; i++) {
        float x = cu_uniform() * scale;
        if (dt == ATTN_DTYPE_F32) ((float *)p)[i] = x;
        else if (dt == ATTN_DTYPE_F16) ((uint16_t *)p)[i] = attn_f32_to_f16(x);
        else ((uint16_t *)p)[i] = attn_f32_to_bf16(x);
    }
}

float cu_get(const void *p, attn_dtype dt, size_t i) {
    if (dt == ATTN_DTYPE_F32) return ((const float *)p)[i];
    if (dt == ATTN_DTYPE_F16) return attn_f16_to_f32(((const uint16_t *)p)[i]);
    return attn_bf16_to_f32(((const uint16_t *)p)[i]);
}

int cu_buf_make(attn_context *ctx, cu_buf *b, size_t bytes) {
    b->bytes = bytes;
    b->host = calloc(1, bytes);
    b->dev = NULL;
    return b->host && attn_cuda_malloc(ctx, bytes, &b->dev) == ATTN_OK;
}
void cu_buf_free(attn_context *ctx, cu_buf *b) {
    free(b->host);
    attn_cuda_free(ctx, b->dev);
    b->host = b->dev = NULL;
}
int cu_up(attn_context *ctx, cu_buf *b) {
    return attn_cuda_memcpy(ctx, b->dev, b->host, b->bytes, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK;
}
int cu_down(attn_context *ctx, cu_buf *b, void *dst) {
    return attn_cuda_memcpy(ctx, dst, b->dev, b->bytes, ATTN_COPY_DEVICE_TO_HOST, NULL) == ATTN_OK;
}

attn_tensor cu_tensor(void *data, attn_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int cuda) {
    int64_t shape[3];
    attn_tensor t;
    shape[0] = a; shape[1] = b; shape[2] = c;
    t = attn_tensor_make(data, dt, ndim, shape);
    if (cuda) t.device.kind = ATTN_DEVICE_CUDA;
    return t;
}

attn_backend_id cu_auto_backend(attn_context *ctx, const attn_layer_desc *d) {
    attn_platform p;
    attn_dtype kv = d->kv_cache_dtype == ATTN_DTYPE_AUTO ? d->dtype : d->kv_cache_dtype; /* AUTO: the layer's */
    attn_platform_get(ctx, &p);
    return p.cuda_capability_major == 9 && p.cuda_capability_minor == 0 && d->dtype == kv &&
                   d->dtype != ATTN_DTYPE_F32 && (d->head_size == 64 || d->head_size == 128) &&
                   d->logits_soft_cap == 0.0f && !d->alibi_slopes
               ? ATTN_BACKEND_CUDA_SM90
               : ATTN_BACKEND_CUDA;
}

int cu_skip_reason(const attn_selection *s, attn_backend_id id, const char *word) {
    int i;
    for (i = 0; i < s->num_skipped; i++)
        if (s->skipped[i].backend == id && strstr(s->skipped[i].reason, word)) return 1;
    return 0;
}

void cu_random_reqs(cu_case *c, int max_q, int max_ctx) {
    int r;
    c->nreq = 1 + (int)(cu_rand() % 6);
    for (r = 0; r < c->nreq; r++) {
        int decode = r < c->nreq / 2 || (cu_rand() % 3 == 0);
        c->qlen[r] = decode ? 1 : 1 + (int)(cu_rand() % (unsigned)max_q);
        c->ctxlen[r] = (int)(cu_rand() % (unsigned)max_ctx);
        if ((c->batch_causal ? c->batch_causal == ATTN_CAUSAL_NO : !c->causal) && c->qlen[r] > 1)
            c->ctxlen[r] = c->ctxlen[r] % 50;
    }
}

int cu_fill_by_write(attn_layer *cpu, void *cache, attn_dtype kv_dt, int ndim, const int64_t *shape,
                            attn_dtype dt, int num_blocks, int block, int kv_heads, int head) {
    const int64_t all = (int64_t)num_blocks * block;
    const size_t n = (size_t)all * (size_t)kv_heads * (size_t)head;
    void *hk = malloc(n * attn_dtype_size(dt)), *hv = malloc(n * attn_dtype_size(dt));
    int64_t *hs = (int64_t *)malloc((size_t)all * 8), s;
    int ok = hk && hv && hs;
    if (ok) {
        attn_tensor tk = cu_tensor(hk, dt, 3, all, kv_heads, head, 0), tv = cu_tensor(hv, dt, 3, all, kv_heads, head, 0);
        attn_tensor tc = attn_tensor_make(cache, kv_dt, ndim, shape);
        cu_fill(hk, dt, n, 2.0f);
        cu_fill(hv, dt, n, 2.0f);
        for (s = 0; s < all; s++) hs[s] = s;
        ok = attn_reshape_and_cache(cpu, &tk, &tv, &tc, ATTN_TEST_SLOTS(hs, (int)all), NULL) == ATTN_OK;
    }
    free(hk); free(hv); free(hs);
    return ok;
}

int cu_run_case_at(attn_context *ctx, const cu_case *c, const char *file, int line) {
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    attn_batch b;
    int32_t qsl[9], seq[8], *bt = NULL;
    int64_t *slots = NULL;
    int r, i, ntok = 0, maxq = 0, maxs = 0, nb = 0, stride = 0, bad = 0;
    float slopes[64];
    size_t esz = attn_dtype_size(c->dt), ksz = attn_dtype_size(c->kv_dt);
    const int q8 = attn_test_is_8bit(c->kv_dt);
    const float scales[2] = {1.0f / 64.0f, 1.0f / 32.0f}; /* per-tensor k, v: values in +-1 use the fp8 range */
    cu_buf q, k, v, kv, out, lse, dscale, dsinks;
    float sinks[64];
    float *ref_out = NULL, *ref_lse = NULL, *got_lse = NULL;
    void *got_out = NULL, *cpu_out = NULL;
    int64_t cache_shape[ATTN_MAX_DIMS];
    int ndim = 0;
    memset(&q, 0, sizeof q); memset(&k, 0, sizeof k); memset(&v, 0, sizeof v);
    memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out); memset(&lse, 0, sizeof lse);
    memset(&dscale, 0, sizeof dscale); memset(&dsinks, 0, sizeof dsinks);
    memset(&d, 0, sizeof d);
    d.num_heads = c->heads; d.num_kv_heads = c->kv_heads; d.head_size = c->head;
    d.dtype = c->dt; d.kv_cache_dtype = c->kv_dt; d.block_size = c->block;
    d.causal = c->causal ? ATTN_CAUSAL_YES : ATTN_CAUSAL_NO;
    d.sliding_window = c->window;
    d.logits_soft_cap = c->softcap;
    for (i = 0; i < c->heads && i < 64; i++) slopes[i] = -0.05f * (float)(i + 1) / (float)c->heads;
    if (c->alibi) d.alibi_slopes = slopes;
    if (c->sinks) { /* around the logits, one head in 7 far above them */
        for (i = 0; i < c->heads && i < 64; i++) sinks[i] = i % 7 == 3 ? 12.0f : 6.0f * cu_uniform() + 1.0f;
        d.sinks = sinks;
    }
    if (q8 && c->pth) d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
    else if (q8) { d.k_scale.value = scales[0]; d.v_scale.value = scales[1]; }
    qsl[0] = 0;
    for (r = 0; r < c->nreq; r++) {
        qsl[r + 1] = qsl[r] + c->qlen[r];
        seq[r] = c->ctxlen[r] + c->qlen[r];
        maxq = c->qlen[r] > maxq ? c->qlen[r] : maxq;
        maxs = seq[r] > maxs ? seq[r] : maxs;
        stride = (seq[r] + c->block - 1) / c->block > stride ? (seq[r] + c->block - 1) / c->block : stride;
    }
    ntok = qsl[c->nreq];
    nb = c->nreq * stride + 3;
    bt = (int32_t *)malloc((size_t)c->nreq * (size_t)stride * 4);
    slots = (int64_t *)malloc((size_t)ntok * 8 + 8);
    if (!bt || !slots) { bad++; goto done; }
    { /* shuffled distinct blocks */
        int *perm = (int *)malloc((size_t)nb * sizeof(int));
        if (!perm) { bad++; goto done; }
        for (i = 0; i < nb; i++) perm[i] = i;
        for (i = nb - 1; i > 0; i--) { int j = (int)(cu_rand() % (unsigned)(i + 1)), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
        for (i = 0; i < c->nreq * stride; i++) bt[i] = perm[i];
        free(perm);
        for (r = 1; r < c->nreq; r++) /* the shared prefix */
            for (i = 0; i < c->prefix / c->block; i++) bt[r * stride + i] = bt[i];
    }
    for (r = 0; r < c->nreq; r++)
        for (i = 0; i < c->qlen[r]; i++) {
            int pos = c->ctxlen[r] + i;
            slots[qsl[r] + i] = (int64_t)bt[r * stride + pos / c->block] * c->block + pos % c->block;
        }
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = stride;
    b.slot_mapping = slots; b.num_reqs = c->nreq; b.num_actual_tokens = ntok;
    b.max_query_len = maxq; b.max_seq_len = maxs;
    b.causal = c->batch_causal;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = c->nreq + 2; md.max_num_tokens = ntok + 8; md.max_blocks_per_req = stride + 1;
    md.num_blocks = nb;
    if (attn_layer_create(ctx, &d, NULL, &cpu) != ATTN_OK) { bad++; goto done; }
    d.device = ATTN_DEVICE_CUDA;
    if (q8 && !c->pth && c->scale_ptr) { /* the CUDA layer reads its scales from device memory */
        if (!cu_buf_make(ctx, &dscale, sizeof scales)) { bad++; goto done; }
        memcpy(dscale.host, scales, sizeof scales);
        if (!cu_up(ctx, &dscale)) { bad++; goto done; }
        d.k_scale.ptr = (const float *)dscale.dev;
        d.v_scale.ptr = (const float *)dscale.dev + 1;
        d.k_scale.device = d.v_scale.device = ATTN_DEVICE_CUDA;
    }
    if (c->sinks) { /* the CUDA layer reads its sinks from device memory */
        if (!cu_buf_make(ctx, &dsinks, (size_t)c->heads * 4)) { bad++; goto done; }
        memcpy(dsinks.host, sinks, (size_t)c->heads * 4);
        if (!cu_up(ctx, &dsinks)) { bad++; goto done; }
        d.sinks = (const float *)dsinks.dev;
    }
    {
        attn_select_request req;
        attn_backend_id want = c->backend ? c->backend : cu_auto_backend(ctx, &d);
        memset(&req, 0, sizeof req);
        req.backend = c->backend;
        if (attn_layer_create(ctx, &d, &req, &gpu) != ATTN_OK) {
            attn_test_fail(file, line, "CUDA layer: %s", attn_context_last_error(ctx));
            bad++;
            goto done;
        }
        if (attn_layer_backend(gpu) != attn_backend_get(want)) {
            attn_test_fail(file, line, "the CUDA layer got backend %s, expected %s", attn_layer_backend(gpu)->name,
                           attn_backend_name(want));
            bad++;
            goto done;
        }
    }
    if (attn_metadata_create(cpu, &md, &mc) != ATTN_OK || attn_metadata_create(gpu, &md, &mg) != ATTN_OK ||
        attn_metadata_build(mc, 0, &b, 0) != ATTN_OK || attn_metadata_build(mg, c->prefix, &b, 0) != ATTN_OK) {
        attn_test_fail(file, line, "metadata: %s", attn_context_last_error(ctx));
        bad++;
        goto done;
    }
    attn_layer_kv_cache_shape(cpu, nb, cache_shape, &ndim);
    if (!cu_buf_make(ctx, &q, (size_t)(ntok + 2) * c->heads * c->head * esz) ||
        !cu_buf_make(ctx, &k, (size_t)ntok * c->kv_heads * c->head * esz) ||
        !cu_buf_make(ctx, &v, (size_t)ntok * c->kv_heads * c->head * esz) ||
        !cu_buf_make(ctx, &kv, (size_t)nb * 2 * c->block * c->kv_heads * cache_shape[4] * ksz) ||
        !cu_buf_make(ctx, &out, (size_t)(ntok + 2) * c->heads * c->head * esz) ||
        !cu_buf_make(ctx, &lse, (size_t)(ntok + 2) * c->heads * 4)) {
        attn_test_fail(file, line, "device buffers: %s", attn_context_last_error(ctx));
        bad++;
        goto done;
    }
    cu_fill(q.host, c->dt, q.bytes / esz, 2.0f);
    cu_fill(k.host, c->dt, k.bytes / esz, 2.0f);
    cu_fill(v.host, c->dt, v.bytes / esz, 2.0f);
    if (!q8) {
        cu_fill(kv.host, c->kv_dt, kv.bytes / ksz, 2.0f); /* the context already cached */
    } else if (!cu_fill_by_write(cpu, kv.host, c->kv_dt, ndim, cache_shape, c->dt, nb, c->block, c->kv_heads,
                                 c->head)) { /* codes (and scales) as the CPU's cache write makes them */
        attn_test_fail(file, line, "8-bit cache fill: %s", attn_context_last_error(ctx));
        bad++;
        goto done;
    }
    memset(out.host, 0xff, out.bytes);                  /* NaN poison */
    memset(lse.host, 0xff, lse.bytes);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &k) || !cu_up(ctx, &v) || !cu_up(ctx, &kv) || !cu_up(ctx, &out) ||
        !cu_up(ctx, &lse)) { bad++; goto done; }
    {
        attn_tensor tq = cu_tensor(q.host, c->dt, 3, ntok + 2, c->heads, c->head, 0);
        attn_tensor tk = cu_tensor(k.host, c->dt, 3, ntok, c->kv_heads, c->head, 0);
        attn_tensor tv = cu_tensor(v.host, c->dt, 3, ntok, c->kv_heads, c->head, 0);
        attn_tensor to = cu_tensor(out.host, c->dt, 3, ntok + 2, c->heads, c->head, 0);
        attn_tensor tl = cu_tensor(lse.host, ATTN_DTYPE_F32, 2, ntok + 2, c->heads, 0, 0);
        attn_tensor tc = attn_tensor_make(kv.host, c->kv_dt, ndim, cache_shape);
        attn_tensor gq = cu_tensor(q.dev, c->dt, 3, ntok + 2, c->heads, c->head, 1);
        attn_tensor gk = cu_tensor(k.dev, c->dt, 3, ntok, c->kv_heads, c->head, 1);
        attn_tensor gv = cu_tensor(v.dev, c->dt, 3, ntok, c->kv_heads, c->head, 1);
        attn_tensor go = cu_tensor(out.dev, c->dt, 3, ntok + 2, c->heads, c->head, 1);
        attn_tensor gl = cu_tensor(lse.dev, ATTN_DTYPE_F32, 2, ntok + 2, c->heads, 0, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, c->kv_dt, ndim, cache_shape);
        size_t nout = (size_t)(ntok + 2) * c->heads * c->head, nl = (size_t)(ntok + 2) * c->heads;
        gc.device.kind = ATTN_DEVICE_CUDA;
        cpu_out = malloc(out.bytes);
        got_out = malloc(out.bytes);
        got_lse = (float *)malloc(lse.bytes);
        ref_lse = (float *)malloc(lse.bytes);
        if (!cpu_out || !got_out || !got_lse || !ref_lse) { bad++; goto done; }
        if (attn_layer_forward(gpu, mg, &gq, &gk, &gv, &gc, &go, c->lse ? &gl : NULL, NULL) != ATTN_OK) {
            attn_test_fail(file, line, "CUDA forward: %s", attn_context_last_error(ctx));
            bad++;
            goto done;
        }
        if (attn_layer_forward(cpu, mc, &tq, &tk, &tv, &tc, &to, c->lse ? &tl : NULL, NULL) != ATTN_OK) {
            bad++;
            goto done;
        }
        memcpy(cpu_out, out.host, out.bytes);
        memcpy(ref_lse, lse.host, lse.bytes);
        if (!cu_down(ctx, &out, got_out) || !cu_down(ctx, &lse, got_lse)) {
            attn_test_fail(file, line, "copy back: %s", attn_context_last_error(ctx));
            bad++;
            goto done;
        }
        {
            /* 8-bit caches: both read the same dequantized values; the GPU's Q and P are f16 */
            double tol_abs = c->dt == ATTN_DTYPE_F32 ? (q8 ? 4e-3 : 2e-4) : c->dt == ATTN_DTYPE_F16 ? 4e-3 : 3e-2;
            size_t x;
            for (x = 0; x < nout && bad < 4; x++) {
                float a = cu_get(cpu_out, c->dt, x), g = cu_get(got_out, c->dt, x);
                size_t row = x / (size_t)c->head;
                if (row >= (size_t)ntok * c->heads) { /* padding rows: untouched */
                    if (g == g) { attn_test_fail(file, line, "padding out[%zu] written (%g)", x, g); bad++; }
                    continue;
                }
                if (!(fabs((double)a - (double)g) <= tol_abs + 1e-2 * fabs((double)a))) {
                    attn_test_fail(file, line, "out[%zu] (token %zu, head %zu): cpu %g, cuda %g", x,
                                   row / c->heads, row % c->heads, a, g);
                    if (getenv("ATTN_TEST_8BIT_DEBUG") && bad == 0) {
                        size_t y;
                        printf("  row %zu cpu:", row);
                        for (y = row * c->head; y < row * c->head + 32; y++) printf(" %.3f", cu_get(cpu_out, c->dt, y));
                        printf("\n  row %zu gpu:", row);
                        for (y = row * c->head; y < row * c->head + 32; y++) printf(" %.3f", cu_get(got_out, c->dt, y));
                        printf("\n");
                    }
                    bad++;
                }
            }
            for (x = 0; c->lse && x < (size_t)ntok * c->heads && bad < 4; x++)
                if (!(fabs((double)ref_lse[x] - (double)got_lse[x]) <= 1e-3 + 1e-3 * fabs((double)ref_lse[x])) &&
                    !(isinf(ref_lse[x]) && ref_lse[x] == got_lse[x])) {
                    attn_test_fail(file, line, "lse[%zu]: cpu %g, cuda %g", x, ref_lse[x], got_lse[x]);
                    bad++;
                }
            (void)nl;
        }
        /* the cache written by both paths is the same, bit for bit */
        {
            void *gcache = malloc(kv.bytes);
            if (gcache && cu_down(ctx, &kv, gcache) && memcmp(gcache, kv.host, kv.bytes) != 0) {
                attn_test_fail(file, line, "the CUDA cache write differs from the CPU one");
                bad++;
            }
            free(gcache);
        }
    }
done:
    free(cpu_out); free(got_out); free(got_lse); free(ref_lse); free(ref_out);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &k); cu_buf_free(ctx, &v); cu_buf_free(ctx, &kv);
    cu_buf_free(ctx, &out); cu_buf_free(ctx, &lse); cu_buf_free(ctx, &dscale); cu_buf_free(ctx, &dsinks);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    free(bt); free(slots);
    return bad;
}

void *cu_sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    return p;
}

int cu_layer_pair(attn_context *ctx, attn_layer_desc *d, const attn_metadata_desc *md, attn_layer **cpu,
                         attn_layer **gpu, attn_metadata **mc, attn_metadata **mg) {
    d->device = ATTN_DEVICE_CPU;
    EXPECT_OK(attn_layer_create(ctx, d, NULL, cpu));
    d->device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, d, NULL, gpu));
    return *cpu && *gpu && attn_metadata_create(*cpu, md, mc) == ATTN_OK && attn_metadata_create(*gpu, md, mg) == ATTN_OK;
}

int cu_graph_open(cu_graph_api *g) {
    const char *missing = NULL;
    void *lib;
    memset(g, 0, sizeof *g);
    lib = g->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 1;
    CU_LOAD(g->stream_create, cu_fn_stream_create, "cuStreamCreate");
    CU_LOAD(g->stream_destroy, cu_fn_stream_destroy, "cuStreamDestroy_v2");
    CU_LOAD(g->begin, cu_fn_begin, "cuStreamBeginCapture_v2");
    CU_LOAD(g->end, cu_fn_end, "cuStreamEndCapture");
    CU_LOAD(g->instantiate, cu_fn_instantiate, "cuGraphInstantiateWithFlags");
    CU_LOAD(g->launch, cu_fn_launch, "cuGraphLaunch");
    CU_LOAD(g->exec_destroy, cu_fn_destroy, "cuGraphExecDestroy");
    CU_LOAD(g->graph_destroy, cu_fn_destroy, "cuGraphDestroy");
    CU_LOAD(g->sync, cu_fn_sync, "cuStreamSynchronize");
    CU_LOAD(g->retain, cu_fn_retain, "cuDevicePrimaryCtxRetain");
    CU_LOAD(g->set_current, cu_fn_set, "cuCtxSetCurrent");
    CU_LOAD(g->release, cu_fn_release, "cuDevicePrimaryCtxRelease_v2");
    if (missing) {
        attn_test_fail(__FILE__, __LINE__, "libcuda lacks %s", missing);
        return -1;
    }
    if (g->retain(&g->pctx, 0) != 0 || g->set_current(g->pctx) != 0 || g->stream_create(&g->stream, 1) != 0) {
        attn_test_fail(__FILE__, __LINE__, "cannot make a stream");
        return -1;
    }
    return 0;
}

void cu_graph_close(cu_graph_api *g) {
    if (g->stream) g->stream_destroy(g->stream);
    if (g->pctx && g->release) g->release(0);
    g->stream = g->pctx = NULL;
}

#endif
