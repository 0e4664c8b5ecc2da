/* The CUDA backend through the public API, against the CPU backend on the same inputs:
   random varlen batches (decodes, chunked prefills with context), dtypes, head sizes, GQA,
   causal/window/soft cap/ALiBi, LSE, split-KV; cache writes bit-exact; the LSE merge; a CUDA
   graph captured once and replayed after new builds; bad input. Every test SKIPs (with the
   reason) where the platform has no CUDA device. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <time.h>
#ifndef ATTN_NO_THREADS
#include <pthread.h>
#endif

static attn_context *cu_ctx(attn_test_log *log) {
    attn_context *ctx = attn_test_context(log, ATTN_LOG_LEVEL_INFO, 2);
    return ctx;
}

/* NULL when a CUDA device is here, else the reason. */
static const char *cu_unavailable(attn_context *ctx) {
    static attn_platform p;
    if (!ctx || attn_platform_get(ctx, &p) != ATTN_OK) return "no context";
    if (p.kind != ATTN_PLATFORM_CUDA) return p.cuda_reason;
    if (p.cuda_capability_major < 8) return "compute capability below 8.0";
    if (!p.nvrtc_version) return p.nvrtc_reason;
    return NULL;
}

static unsigned cu_rand_state = 12345u;
static unsigned cu_rand(void) {
    cu_rand_state = cu_rand_state * 1664525u + 1013904223u;
    return cu_rand_state >> 8;
}
static float cu_uniform(void) { return (float)(cu_rand() & 0xffff) / 65536.0f - 0.5f; }

static void cu_fill(void *p, attn_dtype dt, size_t n, float scale) {
    size_t i;
    for (i = 0; i < n; i++) {
        float x = cu_uniform() * scale;
        if (dt == ATTN_DTYPE_F32) ((float *)p)[i] = x;
        else if (dt == ATTN_DTYPE_F16) ((uint16_t *)p)[i] = attn_f32_to_f16(x);
        else ((uint16_t *)p)[i] = attn_f32_to_bf16(x);
    }
}

static float cu_get(const void *p, attn_dtype dt, size_t i) {
    if (dt == ATTN_DTYPE_F32) return ((const float *)p)[i];
    if (dt == ATTN_DTYPE_F16) return attn_f16_to_f32(((const uint16_t *)p)[i]);
    return attn_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* A host buffer and its device copy. */
typedef struct cu_buf {
    void *host, *dev;
    size_t bytes;
} cu_buf;

static int cu_buf_make(attn_context *ctx, cu_buf *b, size_t bytes) {
    b->bytes = bytes;
    b->host = calloc(1, bytes);
    b->dev = NULL;
    return b->host && attn_cuda_malloc(ctx, bytes, &b->dev) == ATTN_OK;
}
static void cu_buf_free(attn_context *ctx, cu_buf *b) {
    free(b->host);
    attn_cuda_free(ctx, b->dev);
    b->host = b->dev = NULL;
}
static int cu_up(attn_context *ctx, cu_buf *b) {
    return attn_cuda_memcpy(ctx, b->dev, b->host, b->bytes, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK;
}
static int cu_down(attn_context *ctx, cu_buf *b, void *dst) {
    return attn_cuda_memcpy(ctx, dst, b->dev, b->bytes, ATTN_COPY_DEVICE_TO_HOST, NULL) == ATTN_OK;
}

static attn_tensor cu_tensor(void *data, attn_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int cuda) {
    int64_t shape[3];
    attn_tensor t;
    shape[0] = a; shape[1] = b; shape[2] = c;
    t = attn_tensor_make(data, dt, ndim, shape);
    if (cuda) t.device.kind = ATTN_DEVICE_CUDA;
    return t;
}

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
static attn_backend_id cu_auto_backend(attn_context *ctx, const attn_layer_desc *d) {
    attn_platform p;
    attn_dtype kv = d->kv_cache_dtype == ATTN_DTYPE_AUTO ? d->dtype : d->kv_cache_dtype; /* AUTO: the layer's */
    attn_platform_get(ctx, &p);
    return p.cuda_capability_major == 9 && p.cuda_capability_minor == 0 && d->dtype == kv &&
                   d->dtype != ATTN_DTYPE_F32 && (d->head_size == 64 || d->head_size == 128) &&
                   d->logits_soft_cap == 0.0f && !d->alibi_slopes
               ? ATTN_BACKEND_CUDA_SM90
               : ATTN_BACKEND_CUDA;
}

static int cu_skip_reason(const attn_selection *s, attn_backend_id id, const char *word) {
    int i;
    for (i = 0; i < s->num_skipped; i++)
        if (s->skipped[i].backend == id && strstr(s->skipped[i].reason, word)) return 1;
    return 0;
}

/* A random varlen batch for case c: 1-6 requests, the first half decodes (the others now and
   then), the rest 1..max_q new tokens, contexts below max_ctx (non-causal prefills: below
   50, the masks' edge cases without long all-visible rows). */
static void cu_random_reqs(cu_case *c, int max_q, int max_ctx) {
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

/* Fills every slot of a host cache of the layer's shape through the CPU layer's cache write:
   random k/v of dtype dt in [-1, 1), stored as the library stores them (8-bit caches: their
   codes and scales). 1 on success. */
static int cu_fill_by_write(attn_layer *cpu, void *cache, attn_dtype kv_dt, int ndim, const int64_t *shape,
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

/* Runs one case on both backends; returns the number of mismatches reported. */
static int cu_run_case(attn_context *ctx, const cu_case *c, int line) {
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
            attn_test_fail(__FILE__, line, "CUDA layer: %s", attn_context_last_error(ctx));
            bad++;
            goto done;
        }
        if (attn_layer_backend(gpu) != attn_backend_get(want)) {
            attn_test_fail(__FILE__, line, "the CUDA layer got backend %s, expected %s", attn_layer_backend(gpu)->name,
                           attn_backend_name(want));
            bad++;
            goto done;
        }
    }
    if (attn_metadata_create(cpu, &md, &mc) != ATTN_OK || attn_metadata_create(gpu, &md, &mg) != ATTN_OK ||
        attn_metadata_build(mc, 0, &b, 0) != ATTN_OK || attn_metadata_build(mg, c->prefix, &b, 0) != ATTN_OK) {
        attn_test_fail(__FILE__, line, "metadata: %s", attn_context_last_error(ctx));
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
        attn_test_fail(__FILE__, line, "device buffers: %s", attn_context_last_error(ctx));
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
        attn_test_fail(__FILE__, line, "8-bit cache fill: %s", attn_context_last_error(ctx));
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
            attn_test_fail(__FILE__, line, "CUDA forward: %s", attn_context_last_error(ctx));
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
            attn_test_fail(__FILE__, line, "copy back: %s", attn_context_last_error(ctx));
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
                    if (g == g) { attn_test_fail(__FILE__, line, "padding out[%zu] written (%g)", x, g); bad++; }
                    continue;
                }
                if (!(fabs((double)a - (double)g) <= tol_abs + 1e-2 * fabs((double)a))) {
                    attn_test_fail(__FILE__, line, "out[%zu] (token %zu, head %zu): cpu %g, cuda %g", x,
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
                    attn_test_fail(__FILE__, line, "lse[%zu]: cpu %g, cuda %g", x, ref_lse[x], got_lse[x]);
                    bad++;
                }
            (void)nl;
        }
        /* the cache written by both paths is the same, bit for bit */
        {
            void *gcache = malloc(kv.bytes);
            if (gcache && cu_down(ctx, &kv, gcache) && memcmp(gcache, kv.host, kv.bytes) != 0) {
                attn_test_fail(__FILE__, line, "the CUDA cache write differs from the CPU one");
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

#define CU_SKIP_IF_NO_GPU(ctx)                       \
    do {                                             \
        const char *why_ = cu_unavailable(ctx);      \
        if (why_) {                                  \
            attn_context_destroy(ctx);               \
            SKIP(why_);                              \
        }                                            \
    } while (0)

/* Cascade attention on CUDA and CUDA_SM90: decode and speculative batches whose requests
   share their first blocks, built with common_prefix_len (a prefix pass on the prefill
   tiles, joined where the decode tiles store each row), against the CPU computing every row
   over its own keys: GQA, MQA, large groups, f16/bf16/f32, 8-bit caches, sinks, soft cap,
   LSE, prefixes of one block to thousands of keys, suffixes split or not. The build logs
   CASCADE_PLANNED (DEBUG) exactly where the prefix pass runs: not with ALiBi, a window, a
   request longer than a decode tile, or one request. */
ATTN_TEST(cuda_cascade_matches_cpu) {
    attn_test_log log;
    attn_context *ctx = attn_test_context(&log, ATTN_LOG_LEVEL_DEBUG, 2);
    int k, r, fails = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    for (k = 0; k < 16; k++) {
        cu_case c;
        int planned, want = 1;
        memset(&c, 0, sizeof c);
        c.heads = k % 4 == 1 ? 8 : k % 4 == 2 ? 32 : 16;
        c.kv_heads = k % 4 == 1 ? 1 : k % 4 == 2 ? 2 : 4;
        c.head = k % 3 == 1 ? 64 : 128;
        c.block = k % 5 == 3 ? 32 : 16;
        c.dt = c.kv_dt = k % 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
        if (k == 5) c.dt = c.kv_dt = ATTN_DTYPE_F32;
        if (k == 6) { c.dt = ATTN_DTYPE_BF16; c.kv_dt = ATTN_DTYPE_FP8_E4M3; }
        if (k == 7) { c.dt = ATTN_DTYPE_F16; c.kv_dt = ATTN_DTYPE_INT8; c.pth = 1; }
        c.causal = 1;
        c.lse = k % 2 == 0;
        c.sinks = k % 3 == 0;
        c.softcap = k == 9 ? 30.0f : 0.0f;
        c.alibi = k == 10;     /* no prefix pass: the rows' positions are their own */
        c.window = k == 11 ? 200 : 0; /* no prefix pass */
        c.prefix = c.block * (k == 12 ? 1 : k == 13 ? 300 : 8 + k % 5);
        c.nreq = k == 14 ? 1 : 3 + (int)(cu_rand() % 6);
        for (r = 0; r < c.nreq; r++) {
            c.qlen[r] = k == 15 && r == 1 ? 40 : k == 4 && r % 2 ? 2 : 1; /* 15: a prefill tile, no pass */
            c.ctxlen[r] = c.prefix + (int)(cu_rand() % (k == 8 ? 3000u : 400u));
        }
        if (c.alibi || c.window || c.nreq == 1 || k == 15) want = 0;
        if (k == 4 && c.heads / c.kv_heads > 8) want = 0; /* 2 tokens need a decode tile of 2 */
        c.backend = (k & 8) ? ATTN_BACKEND_CUDA : 0; /* the selector's (CUDA_SM90 on an H100/H200) */
        attn_test_log_reset(&log);
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
        planned = log.by_item[ATTN_LOG_CASCADE_PLANNED] > 0;
        if (planned != want) {
            attn_test_fail(__FILE__, __LINE__, "case %d: the build %s the prefix pass (expected %s)", k,
                           planned ? "planned" : "did not plan", want ? "one" : "none");
            fails++;
        }
    }
    EXPECT_EQ_INT(fails, 0);
    attn_context_destroy(ctx);
}

ATTN_TEST(cuda_selected_for_device_layers) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_selection s;
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = 32; d.num_kv_heads = 8; d.head_size = 128; d.dtype = ATTN_DTYPE_BF16;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, cu_auto_backend(ctx, &d));
    EXPECT_EQ_INT(s.default_backend, s.resolved); /* the default is the first that fits the layer */
    EXPECT_EQ_INT(s.cuda_graph, ATTN_CUDA_GRAPH_ALWAYS);
    if (s.resolved == ATTN_BACKEND_CUDA) { /* not compute capability 9.0: the record says so */
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "compute capability"));
    }
    /* outside CUDA_SM90's scope: CUDA, and the record names what did not fit */
    d.logits_soft_cap = 30.0f;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    EXPECT_EQ_INT(s.default_backend, ATTN_BACKEND_CUDA);
    EXPECT_TRUE(strstr(s.log_line, ", default") != NULL);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "soft_cap"));
    d.logits_soft_cap = 0.0f;
    d.head_size = 96;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "64 or 128"));
    d.head_size = 128;
    d.kv_cache_dtype = ATTN_DTYPE_F16; /* q bf16, cache f16 */
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, s.device_capability == 90 ? "one 16-bit type"
                                                                                    : "compute capability"));
    /* an fp8 cache: CUDA reads it (the mma.sync kernels dequantize); CUDA_SM90's wgmma
       prefill takes 16-bit caches only, and its record says so */
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
    d.k_scale.value = d.v_scale.value = 1.0f;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    if (s.device_capability == 90) EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "kv_cache_dtype fp8_e4m3"));
    d.kv_cache_dtype = ATTN_DTYPE_INT8; /* per token and head */
    d.k_scale.value = d.v_scale.value = 0.0f;
    d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    d.head_size = 120; /* 8-bit caches on the GPU: head sizes in multiples of 16 */
    EXPECT_TRUE(attn_select_backend(ctx, &d, NULL, &s) != ATTN_OK);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA, "multiple of 16"));
    d.head_size = 512; /* WIDE HEADS: CUDA takes 512 with an 8-bit cache ... */
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    d.head_size = 272; /* ... and past 256 multiples of 32 only */
    EXPECT_TRUE(attn_select_backend(ctx, &d, NULL, &s) != ATTN_OK);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA, "of 32 from 288 to 512"));
    d.head_size = 512;
    d.kv_scale_kind = ATTN_KV_SCALE_PER_TENSOR;
    d.dtype = d.kv_cache_dtype = ATTN_DTYPE_F32; /* past 256: no FMA form */
    EXPECT_TRUE(attn_select_backend(ctx, &d, NULL, &s) != ATTN_OK);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA, "allowed past 256"));
    d.dtype = d.kv_cache_dtype = ATTN_DTYPE_BF16;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA); /* CUDA_SM90's record: 64 or 128 */
    if (s.device_capability == 90) EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "64 or 128"));
    d.head_size = 128;
    d.kv_cache_dtype = ATTN_DTYPE_AUTO;
    d.device = ATTN_DEVICE_CPU; /* CPU tensors on a GPU machine stay on the CPU */
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    attn_context_destroy(ctx);
}

/* A scale pointer's declared device is checked against the driver: device memory declared
   CPU, host memory declared CUDA — named errors at create. */
ATTN_TEST(cuda_fp8_scale_pointer_device_checked) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    void *dev = NULL;
    float host = 1.0f;
    CU_SKIP_IF_NO_GPU(ctx);
    EXPECT_OK(attn_cuda_malloc(ctx, 64, &dev));
    memset(&d, 0, sizeof d);
    d.num_heads = 8; d.num_kv_heads = 2; d.head_size = 64; d.dtype = ATTN_DTYPE_F16;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
    d.v_scale.value = 1.0f;
    d.k_scale.ptr = (const float *)dev; /* device memory, declared CPU (the default) */
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "CUDA device memory") != NULL);
    d.k_scale.ptr = &host; /* host memory: a CPU layer takes it */
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    attn_layer_destroy(layer);
    layer = NULL;
    d.device = ATTN_DEVICE_CUDA; d.k_scale.device = ATTN_DEVICE_CUDA; /* host memory declared CUDA */
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "host memory") != NULL);
    EXPECT_OK(attn_cuda_free(ctx, dev));
    attn_context_destroy(ctx);
}

ATTN_TEST(cuda_forward_matches_cpu) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    static const attn_dtype dts[3] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_F32};
    static const int heads[][3] = {{32, 8, 128}, {8, 8, 64}, {16, 2, 96}, {12, 1, 80}, {8, 2, 256}};
    int n, r, fails = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    for (n = 0; n < 24 && fails < 3; n++) {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = heads[n % 5][0]; c.kv_heads = heads[n % 5][1]; c.head = heads[n % 5][2];
        c.dt = dts[n % 3];
        c.kv_dt = (n % 7 == 6) ? ATTN_DTYPE_F32 : c.dt; /* a mixed-type case now and then */
        c.block = n % 4 == 3 ? 32 : 16;
        c.causal = n % 5 != 4;
        /* now and then a batch that overrides the layer: one layer serves both */
        if (n % 4 == 1) c.batch_causal = c.causal ? ATTN_CAUSAL_NO : ATTN_CAUSAL_YES;
        c.window = n % 6 == 2 ? 100 : 0;
        c.softcap = n % 6 == 3 ? 30.0f : 0.0f;
        c.alibi = n % 6 == 5;
        c.lse = n % 2 == 0;
        c.sinks = n % 3 == 1;
        cu_random_reqs(&c, 70, 900);
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    /* prefill-heavy batches within CUDA_SM90's scope (16-bit q = cache, head 64 or 128, no
       soft cap or ALiBi), by turns automatic (CUDA_SM90's wgmma prefill on compute
       capability 9.0, CUDA elsewhere) and forced to CUDA (the mma.sync prefill): several
       128-row tiles per request, windows, non-causal, groups 1 to 16 */
    for (n = 0; n < 16 && fails < 3; n++) {
        static const int shapes[][3] = {{32, 8, 128}, {8, 8, 64}, {16, 1, 128}, {12, 4, 64}, {6, 2, 128}};
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = shapes[n % 5][0]; c.kv_heads = shapes[n % 5][1]; c.head = shapes[n % 5][2];
        c.dt = c.kv_dt = n % 3 == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        /* block sizes that give the TMA prefill each box shape: a block per box (16, 32),
           16-row boxes (48: neither divides the 128-key tile), a tile per box (256) */
        c.block = n % 8 == 3 ? 32 : n % 8 == 5 ? 48 : n % 8 == 7 ? 256 : 16;
        c.causal = n % 5 != 4;
        c.window = n % 6 == 2 ? 150 : 0;
        c.lse = n % 2 == 0;
        c.sinks = n % 4 == 1;
        c.nreq = 1 + (int)(cu_rand() % 4);
        for (r = 0; r < c.nreq; r++) {
            c.qlen[r] = r == 0 ? 1 : 1 + (int)(cu_rand() % 300);
            c.ctxlen[r] = c.causal ? (int)(cu_rand() % 700) : (int)(cu_rand() % 40);
        }
        c.backend = n % 2 ? ATTN_BACKEND_CUDA : ATTN_BACKEND_AUTO;
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    /* one long decode alone: split-KV with the partial merge */
    {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = 32; c.kv_heads = 8; c.head = 128; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
        c.causal = 1; c.lse = 1; c.nreq = 1; c.qlen[0] = 1; c.ctxlen[0] = 8000;
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
        c.sinks = 1; /* the sink joins once, in the merge */
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    /* long decodes at the largest group that splits (16 query heads per KV head: a
       16-row tile, fused merge) and past it (32: a 32-row tile, which must not split) */
    for (n = 0; n < 2; n++) {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = n ? 32 : 16; c.kv_heads = 1; c.head = 128; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
        c.causal = 1; c.lse = 1; c.nreq = 3;
        c.qlen[0] = 1; c.ctxlen[0] = 6000;
        c.qlen[1] = 1; c.ctxlen[1] = 1500;
        c.qlen[2] = 40; c.ctxlen[2] = 700;
        c.sinks = n == 0;
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    /* a batch of more (request, KV head) tiles than the device has SMs: decode tiles take
       the default shape (smaller batches above run the wide one where the layer has it) */
    {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = 32; c.kv_heads = 32; c.head = 64; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
        c.causal = 1; c.lse = 1; c.nreq = 8;
        for (r = 0; r < 8; r++) { c.qlen[r] = r == 7 ? 20 : 1; c.ctxlen[r] = 200 + 170 * r; }
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    EXPECT_EQ_INT(fails, 0);
    attn_context_destroy(ctx);
}

/* Heads past 256 on the GPU (kernels/paged_attention.cu, WIDE HEADS: two warp groups split
   O's columns) against the CPU backend: 512 (Gemma-class), 384, 288 (halves of 144, an odd
   number of 16-column pairs); bf16/f16 caches, fp8 e4m3/e5m2 per tensor, int8 and e4m3 per
   token and head; decodes, speculative steps (4 tokens), chunked prefills, non-causal,
   long decodes that split (fused and separate merges), windows, soft cap, ALiBi, sinks,
   LSE, a cascade prefix. */
ATTN_TEST(cuda_wide_heads_match_cpu) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    static const int heads[][3] = {{8, 2, 512}, {16, 1, 512}, {4, 4, 512}, {12, 4, 384}, {8, 8, 288}, {32, 8, 512}};
    static const attn_dtype kdts[6] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2,
                                       ATTN_DTYPE_INT8, ATTN_DTYPE_FP8_E4M3};
    int n, r, fails = 0, cases = 24;
    CU_SKIP_IF_NO_GPU(ctx);
    if (getenv("ATTN_TEST_WIDE_CASES")) cases = atoi(getenv("ATTN_TEST_WIDE_CASES")); /* fewer under racecheck */
    for (n = 0; n < cases && fails < 3; n++) {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = heads[n % 6][0]; c.kv_heads = heads[n % 6][1]; c.head = heads[n % 6][2];
        c.kv_dt = kdts[(n / 2) % 6];
        c.dt = c.kv_dt == ATTN_DTYPE_F16 || n % 4 == 3 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        if (!attn_test_is_8bit(c.kv_dt)) c.kv_dt = c.dt; /* 16-bit: one type for both */
        c.pth = c.kv_dt == ATTN_DTYPE_INT8 || (n / 2) % 6 == 5;
        c.scale_ptr = n % 5 == 2;
        c.block = n % 4 == 3 ? 32 : 16;
        c.causal = n % 7 != 6;
        if (n % 5 == 1) c.batch_causal = c.causal ? ATTN_CAUSAL_NO : ATTN_CAUSAL_YES;
        c.window = n % 6 == 2 ? 150 : 0;
        c.softcap = n % 6 == 3 ? 30.0f : 0.0f;
        c.alibi = n % 6 == 5;
        c.lse = n % 2 == 0;
        c.sinks = n % 3 == 1;
        if (n % 8 == 4) { /* speculative steps: 4 tokens a request, decode tiles */
            c.nreq = 5;
            for (r = 0; r < c.nreq; r++) { c.qlen[r] = 4; c.ctxlen[r] = 100 + (int)(cu_rand() % 900); }
        } else if (n % 8 == 7) { /* one long decode: split-KV */
            c.nreq = 2; c.qlen[0] = 1; c.ctxlen[0] = 6000 + (int)(cu_rand() % 2000); c.qlen[1] = 1; c.ctxlen[1] = 300;
        } else {
            cu_random_reqs(&c, 90, 700);
        }
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    { /* a cascade: 6 decodes sharing a 40-block prefix */
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = 8; c.kv_heads = 2; c.head = 512; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
        c.causal = 1; c.lse = 1; c.sinks = 1; c.prefix = 640; c.nreq = 6;
        for (r = 0; r < c.nreq; r++) { c.qlen[r] = 1; c.ctxlen[r] = c.prefix + (int)(cu_rand() % 500); }
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    EXPECT_EQ_INT(fails, 0);
    attn_context_destroy(ctx);
}

/* 8-bit caches on the GPU against the CPU backend (which the CPU tests hold to float64 on
   the dequantized values and to the unquantized result within the stated bound): fp8 e4m3
   and e5m2 with per-tensor scales (values and device pointers), int8 and e4m3 with
   per-token-head scales; q bf16, f16, f32; decodes, chunked prefills, long splits; head
   sizes 64-256 (multiples of 32 and of 16 only); window, soft cap, ALiBi. The cache bytes each
   writes are compared bit for bit (the quantization is the CPU's). */
ATTN_TEST(cuda_forward_8bit_matches_cpu) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    static const attn_dtype qdts[3] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_F32};
    static const attn_dtype kdts[4] = {ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2, ATTN_DTYPE_INT8, ATTN_DTYPE_FP8_E4M3};
    static const int heads[][3] = {{32, 8, 128}, {8, 8, 64}, {16, 2, 112}, {12, 1, 80}, {8, 2, 256}, {4, 4, 96}};
    int n, fails = 0, cases = 28;
    CU_SKIP_IF_NO_GPU(ctx);
    if (getenv("ATTN_TEST_8BIT_CASES")) cases = atoi(getenv("ATTN_TEST_8BIT_CASES")); /* fewer under racecheck */
    if (getenv("ATTN_TEST_8BIT_DEBUG")) { /* one request of 1, 2, 17 keys: V alone, then the scores */
        static const int ctxs[4] = {0, 1, 16, 100};
        static const attn_dtype dk[3] = {ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2, ATTN_DTYPE_INT8};
        for (n = 0; n < 12; n++) {
            cu_case c;
            memset(&c, 0, sizeof c);
            c.heads = 4; c.kv_heads = 4; c.head = 128; c.dt = ATTN_DTYPE_BF16; c.kv_dt = dk[n / 4];
            c.pth = c.kv_dt == ATTN_DTYPE_INT8;
            c.block = 16; c.causal = 1; c.nreq = 1; c.qlen[0] = 1; c.ctxlen[0] = ctxs[n % 4];
            printf("debug case kv %s ctx %d\n", attn_dtype_name(c.kv_dt), c.ctxlen[0]);
            fails += cu_run_case(ctx, &c, __LINE__) > 0;
        }
        cases = 0;
    }
    for (n = 0; n < cases && fails < 3; n++) {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = heads[n % 6][0]; c.kv_heads = heads[n % 6][1]; c.head = heads[n % 6][2];
        c.dt = qdts[n % 3];
        c.kv_dt = kdts[n % 4];
        c.pth = n % 4 >= 2;                 /* int8 and the second e4m3: per token and head */
        c.scale_ptr = n % 8 == 1 || n % 8 == 4;
        c.block = n % 5 == 3 ? 32 : 16;
        c.causal = n % 7 != 6;
        c.window = n % 9 == 2 ? 100 : 0;
        c.softcap = n % 9 == 5 ? 30.0f : 0.0f;
        c.alibi = n % 9 == 7;
        c.lse = n % 2 == 0;
        c.sinks = n % 5 == 1 || n % 5 == 4;
        cu_random_reqs(&c, 90, 1200);
        if (n % 5 == 4) { c.nreq = 1; c.qlen[0] = 1; c.ctxlen[0] = 5000 + (int)(cu_rand() % 3000); } /* splits */
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    EXPECT_EQ_INT(fails, 0);
    attn_context_destroy(ctx);
}

/* A per-tensor scale in device memory that is not finite and > 0: the kernels cannot
   report it without a synchronisation, so they write nothing (cache and output unchanged);
   a good value written later is read by the next call. */
ATTN_TEST(cuda_fp8_bad_device_scale_writes_nothing) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md;
    attn_batch b;
    cu_buf q, kv, out, sc, k, v;
    int32_t qsl[2] = {0, 1}, seq[1] = {20}, bt[2] = {0, 1};
    int64_t slots[1] = {16 + 3}, shape[ATTN_MAX_DIMS]; /* position 19: block 1, row 3 */
    int ndim = 0;
    float bad = -1.0f, good[2] = {0.5f, 0.25f};
    unsigned char *before = NULL, *after = NULL;
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out);
    memset(&sc, 0, sizeof sc); memset(&k, 0, sizeof k); memset(&v, 0, sizeof v);
    memset(&d, 0, sizeof d);
    d.num_heads = 4; d.num_kv_heads = 2; d.head_size = 64; d.dtype = ATTN_DTYPE_BF16;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3; d.device = ATTN_DEVICE_CUDA; d.block_size = 16;
    EXPECT_TRUE(cu_buf_make(ctx, &sc, 8));
    memcpy(sc.host, &bad, 4);
    memcpy((char *)sc.host + 4, &good[1], 4);
    EXPECT_TRUE(cu_up(ctx, &sc));
    d.k_scale.ptr = (const float *)sc.dev; d.k_scale.device = ATTN_DEVICE_CUDA;
    d.v_scale.ptr = (const float *)sc.dev + 1; d.v_scale.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 2; md.num_blocks = 2;
    EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 2;
    b.slot_mapping = slots; b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 20;
    EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
    attn_layer_kv_cache_shape(layer, 2, shape, &ndim);
    EXPECT_TRUE(cu_buf_make(ctx, &q, 4 * 64 * 2) && cu_buf_make(ctx, &k, 2 * 64 * 2) && cu_buf_make(ctx, &v, 2 * 64 * 2) &&
                cu_buf_make(ctx, &kv, (size_t)2 * 2 * 16 * 2 * 64) && cu_buf_make(ctx, &out, 4 * 64 * 2));
    before = (unsigned char *)malloc(kv.bytes + out.bytes);
    after = (unsigned char *)malloc(kv.bytes + out.bytes);
    if (q.host && k.host && v.host && kv.host && out.host && before && after) {
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, 1, 4, 64, 1), gk = cu_tensor(k.dev, ATTN_DTYPE_BF16, 3, 1, 2, 64, 1);
        attn_tensor gv = cu_tensor(v.dev, ATTN_DTYPE_BF16, 3, 1, 2, 64, 1), go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, 1, 4, 64, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_FP8_E4M3, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        cu_fill(q.host, ATTN_DTYPE_BF16, 4 * 64, 2.0f);
        cu_fill(k.host, ATTN_DTYPE_BF16, 2 * 64, 2.0f);
        cu_fill(v.host, ATTN_DTYPE_BF16, 2 * 64, 2.0f);
        memset(kv.host, 0x11, kv.bytes);
        memset(out.host, 0x5a, out.bytes);
        EXPECT_TRUE(cu_up(ctx, &q) && cu_up(ctx, &k) && cu_up(ctx, &v) && cu_up(ctx, &kv) && cu_up(ctx, &out));
        memcpy(before, kv.host, kv.bytes);
        memcpy(before + kv.bytes, out.host, out.bytes);
        EXPECT_OK(attn_layer_forward(layer, meta, &gq, &gk, &gv, &gc, &go, NULL, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
        EXPECT_TRUE(cu_down(ctx, &kv, after) && cu_down(ctx, &out, after + kv.bytes));
        EXPECT_TRUE(memcmp(before, after, kv.bytes + out.bytes) == 0);
        memcpy(sc.host, &good[0], 4); /* a good scale: the same layer reads it at the next call */
        EXPECT_TRUE(cu_up(ctx, &sc));
        EXPECT_OK(attn_layer_forward(layer, meta, &gq, &gk, &gv, &gc, &go, NULL, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
        EXPECT_TRUE(cu_down(ctx, &kv, after) && cu_down(ctx, &out, after + kv.bytes));
        { /* the new token's K row: code(k / 0.5) */
            const unsigned char *row = after + ((size_t)(1 * 2 + 0) * 16 + 3) * 2 * 64; /* block 1, K, row 3, head 0 */
            int i, wrong = 0;
            for (i = 0; i < 64; i++)
                wrong += row[i] != attn_f32_to_fp8_e4m3(cu_get(k.host, ATTN_DTYPE_BF16, (size_t)i) / 0.5f);
            EXPECT_EQ_INT(wrong, 0);
        }
        EXPECT_TRUE(memcmp(before + kv.bytes, after + kv.bytes, out.bytes) != 0); /* out written */
    }
    free(before); free(after);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &k); cu_buf_free(ctx, &v); cu_buf_free(ctx, &kv);
    cu_buf_free(ctx, &out); cu_buf_free(ctx, &sc);
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* Host tensors given to a CUDA layer are refused, naming the tensor; nothing is written. */
ATTN_TEST(cuda_host_tensor_refused) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *gpu = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b;
    int32_t qsl[2] = {0, 1}, seq[1] = {1}, bt[1] = {0};
    int64_t slots[1] = {0}, shape[ATTN_MAX_DIMS];
    float host_q[64], host_out[64];
    void *dq = NULL, *dcache = NULL;
    int ndim = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = 4; d.num_kv_heads = 4; d.head_size = 16; d.dtype = ATTN_DTYPE_F32;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 1; md.num_blocks = 1;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 1;
    b.slot_mapping = slots; b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 1;
    if (gpu && attn_metadata_create(gpu, &md, &m) == ATTN_OK && attn_metadata_build(m, 0, &b, 0) == ATTN_OK &&
        attn_cuda_malloc(ctx, sizeof host_q, &dq) == ATTN_OK && attn_cuda_malloc(ctx, 4096, &dcache) == ATTN_OK) {
        attn_tensor q = cu_tensor(dq, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
        attn_tensor hout = cu_tensor(host_out, ATTN_DTYPE_F32, 3, 1, 4, 16, 0);
        attn_tensor hq = cu_tensor(host_q, ATTN_DTYPE_F32, 3, 1, 4, 16, 0);
        attn_tensor cache;
        attn_layer_kv_cache_shape(gpu, 1, shape, &ndim);
        cache = attn_tensor_make(dcache, ATTN_DTYPE_F32, ndim, shape);
        cache.device.kind = ATTN_DEVICE_CUDA;
        memset(host_out, 0x7f, sizeof host_out);
        attn_test_log_reset(&log);
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &hout, NULL, NULL), ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_TENSOR_DEVICE, ATTN_LOG_LEVEL_ERROR));
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "out.device") != NULL);
        EXPECT_TRUE(host_out[0] != host_out[0] || ((unsigned char *)host_out)[0] == 0x7f);
        EXPECT_STATUS(attn_layer_forward(gpu, m, &hq, NULL, NULL, &cache, &q, NULL, NULL), ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "q.device") != NULL);
        q.device.index = 1; /* another GPU than the context's */
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &q, NULL, NULL), ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "q.device.index is 1") != NULL);
        q.device.index = 0;
        cache.data = (char *)dcache + 8; /* a cache that does not start on 16 bytes: refused before any launch */
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &q, NULL, NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "not 16-byte aligned") != NULL);
        EXPECT_STATUS(attn_reshape_and_cache(gpu, &q, &q, &cache, ATTN_TEST_SLOTS(slots, 1), NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "kv_cache.data") != NULL);
    } else {
        EXPECT_TRUE(0);
    }
    attn_cuda_free(ctx, dq);
    attn_cuda_free(ctx, dcache);
    attn_metadata_destroy(m);
    attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
}

/* The merge of CUDA tensors runs on the GPU and agrees with the CPU merge. */
ATTN_TEST(cuda_merge_matches_cpu) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    enum { T = 37, H = 5, D = 72 };
    static float a[T * H * D], bb[T * H * D], la[T * H], lb[T * H], o_cpu[T * H * D], l_cpu[T * H];
    static float o_gpu[T * H * D], l_gpu[T * H];
    void *da = NULL, *db = NULL, *dla = NULL, *dlb = NULL, *dout = NULL, *dl = NULL;
    int i, bad = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    cu_fill(a, ATTN_DTYPE_F32, T * H * D, 4.0f);
    cu_fill(bb, ATTN_DTYPE_F32, T * H * D, 4.0f);
    cu_fill(la, ATTN_DTYPE_F32, T * H, 8.0f);
    cu_fill(lb, ATTN_DTYPE_F32, T * H, 8.0f);
    la[3] = -INFINITY; lb[4] = -INFINITY; la[5] = lb[5] = -INFINITY; la[6] = INFINITY; lb[7] = NAN;
    a[3 * D] = NAN;
    if (attn_cuda_malloc(ctx, sizeof a, &da) == ATTN_OK && attn_cuda_malloc(ctx, sizeof bb, &db) == ATTN_OK &&
        attn_cuda_malloc(ctx, sizeof la, &dla) == ATTN_OK && attn_cuda_malloc(ctx, sizeof lb, &dlb) == ATTN_OK &&
        attn_cuda_malloc(ctx, sizeof o_gpu, &dout) == ATTN_OK && attn_cuda_malloc(ctx, sizeof l_gpu, &dl) == ATTN_OK &&
        attn_cuda_memcpy(ctx, da, a, sizeof a, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK &&
        attn_cuda_memcpy(ctx, db, bb, sizeof bb, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK &&
        attn_cuda_memcpy(ctx, dla, la, sizeof la, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK &&
        attn_cuda_memcpy(ctx, dlb, lb, sizeof lb, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK) {
        attn_tensor ha = cu_tensor(a, ATTN_DTYPE_F32, 3, T, H, D, 0), hb = cu_tensor(bb, ATTN_DTYPE_F32, 3, T, H, D, 0);
        attn_tensor hla = cu_tensor(la, ATTN_DTYPE_F32, 2, T, H, 0, 0), hlb = cu_tensor(lb, ATTN_DTYPE_F32, 2, T, H, 0, 0);
        attn_tensor ho = cu_tensor(o_cpu, ATTN_DTYPE_F32, 3, T, H, D, 0), hl = cu_tensor(l_cpu, ATTN_DTYPE_F32, 2, T, H, 0, 0);
        attn_tensor ga = cu_tensor(da, ATTN_DTYPE_F32, 3, T, H, D, 1), gb = cu_tensor(db, ATTN_DTYPE_F32, 3, T, H, D, 1);
        attn_tensor gla = cu_tensor(dla, ATTN_DTYPE_F32, 2, T, H, 0, 1), glb = cu_tensor(dlb, ATTN_DTYPE_F32, 2, T, H, 0, 1);
        attn_tensor go = cu_tensor(dout, ATTN_DTYPE_F32, 3, T, H, D, 1), gl = cu_tensor(dl, ATTN_DTYPE_F32, 2, T, H, 0, 1);
        EXPECT_OK(attn_merge_attn_states(ctx, &ha, &hla, ATTN_LSE_BASE_E, &hb, &hlb, ATTN_LSE_BASE_2, &ho, &hl,
                                         ATTN_LSE_BASE_E, NULL));
        EXPECT_OK(attn_merge_attn_states(ctx, &ga, &gla, ATTN_LSE_BASE_E, &gb, &glb, ATTN_LSE_BASE_2, &go, &gl,
                                         ATTN_LSE_BASE_E, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
        EXPECT_OK(attn_cuda_memcpy(ctx, o_gpu, dout, sizeof o_gpu, ATTN_COPY_DEVICE_TO_HOST, NULL));
        EXPECT_OK(attn_cuda_memcpy(ctx, l_gpu, dl, sizeof l_gpu, ATTN_COPY_DEVICE_TO_HOST, NULL));
        for (i = 0; i < T * H * D && bad < 4; i++)
            if (!(fabsf(o_cpu[i] - o_gpu[i]) <= 1e-5f + 1e-5f * fabsf(o_cpu[i]))) {
                attn_test_fail(__FILE__, __LINE__, "merge out[%d]: cpu %g cuda %g", i, o_cpu[i], o_gpu[i]);
                bad++;
            }
        for (i = 0; i < T * H && bad < 4; i++)
            if (!(fabsf(l_cpu[i] - l_gpu[i]) <= 1e-5f + 1e-5f * fabsf(l_cpu[i])) && !(l_cpu[i] == l_gpu[i])) {
                attn_test_fail(__FILE__, __LINE__, "merge lse[%d]: cpu %g cuda %g", i, l_cpu[i], l_gpu[i]);
                bad++;
            }
    } else {
        EXPECT_TRUE(0);
    }
    attn_cuda_free(ctx, da); attn_cuda_free(ctx, db); attn_cuda_free(ctx, dla); attn_cuda_free(ctx, dlb);
    attn_cuda_free(ctx, dout); attn_cuda_free(ctx, dl);
    attn_context_destroy(ctx);
}

/* Two layers of one shape compile once (the context's kernel cache). */
ATTN_TEST(cuda_layers_share_compiled_variants) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *a = NULL, *b = NULL;
    int n0;
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = 16; d.num_kv_heads = 4; d.head_size = 128; d.dtype = ATTN_DTYPE_BF16;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &a));
    n0 = attn_kernel_compile_count(ctx);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &b));
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), n0);
    attn_layer_destroy(a);
    attn_layer_destroy(b);
    attn_context_destroy(ctx);
}

/* ---- ATTN_BATCH_INVARIANT: a request's rows do not depend on the rest of the batch ------- */

/* One long decode alone, then the same request first in a batch of 32 decodes (256
   (request, KV head) tiles): by default the first runs split (and, on sm_90, in the wide
   decode shape) and the second does not; with ATTN_BATCH_INVARIANT=1 both run the same
   tiles with no split, so its rows are bitwise equal. */
ATTN_TEST(cuda_batch_invariant_rows) {
    enum { H = 32, HKV = 8, D = 128, BS = 16, R = 32, MAXB = 192, NB = 512 }; /* rows share blocks: read only */
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_test_env saved;
    attn_layer_desc d;
    attn_layer *gpu = NULL;
    attn_metadata *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, kv, out;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, pass, i;
    static int32_t bt[R * MAXB];
    static uint16_t rows[2][H * D];
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out);
    CU_SKIP_IF_NO_GPU(ctx);
    saved = attn_test_env_save("ATTN_BATCH_INVARIANT");
    setenv("ATTN_BATCH_INVARIANT", "1", 1);
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = R; md.max_num_tokens = R; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!gpu || attn_metadata_create(gpu, &md, &mg) != ATTN_OK) goto done;
    attn_layer_kv_cache_shape(gpu, NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, (size_t)R * H * D * 2) || !cu_buf_make(ctx, &out, (size_t)R * H * D * 2) ||
        !cu_buf_make(ctx, &kv, (size_t)NB * 2 * BS * HKV * D * 2)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, (size_t)R * H * D, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, (size_t)NB * 2 * BS * HKV * D, 2.0f);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &kv)) goto done;
    for (i = 0; i < R * MAXB; i++) bt[i] = (int32_t)(((int64_t)i * 7919) % NB);
    for (pass = 0; pass < 2; pass++) {
        int32_t qsl[R + 1], seq[R];
        int nreq = pass ? R : 1, r;
        attn_batch b;
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, nreq, H, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, nreq, H, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        qsl[0] = 0;
        for (r = 0; r < nreq; r++) {
            qsl[r + 1] = r + 1;
            seq[r] = r == 0 ? 3000 : 300 + 50 * r; /* request 0: the one compared */
        }
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = nreq; b.num_actual_tokens = nreq; b.max_query_len = 1; b.max_seq_len = 3000;
        EXPECT_OK(attn_metadata_build(mg, 0, &b, 0));
        memset(out.host, 0xff, out.bytes);
        if (!cu_up(ctx, &out)) goto done;
        EXPECT_OK(attn_layer_forward(gpu, mg, &gq, NULL, NULL, &gc, &go, NULL, NULL));
        if (!cu_down(ctx, &out, out.host)) goto done;
        memcpy(rows[pass], out.host, sizeof rows[pass]); /* token 0 = request 0 */
    }
    for (i = 0; i < H * D; i++)
        if (rows[0][i] != rows[1][i] || rows[0][i] == 0xffff) {
            attn_test_fail(__FILE__, __LINE__, "ATTN_BATCH_INVARIANT=1: out[%d] alone 0x%04x, in a batch of %d 0x%04x",
                           i, rows[0][i], R, rows[1][i]);
            break;
        }
done:
    attn_test_env_restore(&saved);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out);
    attn_metadata_destroy(mg);
    attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
}

/* Metadata is shared by layers of one configuration (attn__metadata_fits), but a CUDA
   schedule also depends on the kernels the layer compiled: a bf16 layer's prefill tiles
   are 128 rows, a soft-capped one's 64. Forward with the other layer's metadata is refused
   by name, and writes nothing (neither out nor the cache). */
ATTN_TEST(cuda_metadata_of_other_kernels_refused) {
    enum { H = 32, HKV = 8, D = 128, BS = 16, T = 40, MAXB = 8, NB = 16 };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *plain = NULL, *capped = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    cu_buf q, kv, out, knew;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, i, changed = 0;
    int32_t qsl[2] = {0, T}, seq[1] = {T}, bt[MAXB];
    int64_t slots[T];
    attn_batch b;
    static unsigned char before[NB * 2 * BS * HKV * D * 2], after[NB * 2 * BS * HKV * D * 2];
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out); memset(&knew, 0, sizeof knew);
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    d.device = ATTN_DEVICE_CUDA;
    { /* both on CUDA: one backend, other kernels (a CUDA_SM90 layer's metadata is refused
         by a CUDA layer already for its backend) */
        attn_select_request req;
        memset(&req, 0, sizeof req);
        req.backend = ATTN_BACKEND_CUDA;
        EXPECT_OK(attn_layer_create(ctx, &d, &req, &plain));
        d.logits_soft_cap = 30.0f;
        EXPECT_OK(attn_layer_create(ctx, &d, &req, &capped));
    }
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = T; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!plain || !capped || attn_metadata_create(plain, &md, &m) != ATTN_OK) goto done;
    attn_layer_kv_cache_shape(plain, NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, (size_t)T * H * D * 2) || !cu_buf_make(ctx, &out, (size_t)T * H * D * 2) ||
        !cu_buf_make(ctx, &knew, (size_t)T * HKV * D * 2) || !cu_buf_make(ctx, &kv, sizeof before)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, (size_t)T * H * D, 2.0f);
    cu_fill(knew.host, ATTN_DTYPE_BF16, (size_t)T * HKV * D, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, sizeof before / 2, 2.0f);
    memset(out.host, 0xff, out.bytes);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &knew) || !cu_up(ctx, &kv) || !cu_up(ctx, &out)) goto done;
    memcpy(before, kv.host, sizeof before);
    for (i = 0; i < MAXB; i++) bt[i] = i;
    for (i = 0; i < T; i++) slots[i] = i;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
    b.slot_mapping = slots; b.num_reqs = 1; b.num_actual_tokens = T; b.max_query_len = T; b.max_seq_len = T;
    EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
    {
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, T, H, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, T, H, D, 1);
        attn_tensor gk = cu_tensor(knew.dev, ATTN_DTYPE_BF16, 3, T, HKV, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        EXPECT_EQ_INT(attn_layer_forward(capped, m, &gq, &gk, &gk, &gc, &go, NULL, NULL), ATTN_ERROR_INVALID_METADATA);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "prefill tiles") != NULL);
    }
    if (!cu_down(ctx, &kv, after) || !cu_down(ctx, &out, out.host)) goto done;
    changed = memcmp(before, after, sizeof before) != 0;
    for (i = 0; i < T * H * D && !changed; i++) changed = ((uint16_t *)out.host)[i] != 0xffff;
    EXPECT_EQ_INT(changed, 0);
done:
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out); cu_buf_free(ctx, &knew);
    attn_metadata_destroy(m);
    attn_layer_destroy(plain); attn_layer_destroy(capped);
    attn_context_destroy(ctx);
}

/* ---- CUDA graphs: capture one forward, replay it after new builds ------------------------ */

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

static void *cu_sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    return p;
}
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
/* The same layer on the CPU (d as given, device CPU) and on the GPU, and a metadata of md
   for each: the graph tests' CPU reference beside the captured GPU calls. 0 on a failure
   (reported); what was created is left for the caller's cleanup. */
static int cu_layer_pair(attn_context *ctx, attn_layer_desc *d, const attn_metadata_desc *md, attn_layer **cpu,
                         attn_layer **gpu, attn_metadata **mc, attn_metadata **mg) {
    d->device = ATTN_DEVICE_CPU;
    EXPECT_OK(attn_layer_create(ctx, d, NULL, cpu));
    d->device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, d, NULL, gpu));
    return *cpu && *gpu && attn_metadata_create(*cpu, md, mc) == ATTN_OK && attn_metadata_create(*gpu, md, mg) == ATTN_OK;
}

static int cu_graph_open(cu_graph_api *g) {
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

/* The stream and the primary context's reference (libcuda stays open: g->lib). */
static void cu_graph_close(cu_graph_api *g) {
    if (g->stream) g->stream_destroy(g->stream);
    if (g->pctx && g->release) g->release(0);
    g->stream = g->pctx = NULL;
}

/* Captures one forward of `gpu` on cg's stream (relaxed mode) into *graph / *exec; 1 on
   success. */
static int cu_capture_forward(cu_graph_api *cg, attn_layer *gpu, attn_metadata *mg, const attn_tensor *q,
                              attn_tensor *cache, attn_tensor *out, void **graph, void **exec) {
    EXPECT_EQ_INT(cg->begin(cg->stream, 2 /* relaxed */), 0);
    EXPECT_OK(attn_layer_forward(gpu, mg, q, NULL, NULL, cache, out, NULL, cg->stream));
    EXPECT_EQ_INT(cg->end(cg->stream, graph), 0);
    if (!*graph || cg->instantiate(exec, *graph, 0) != 0) {
        attn_test_fail(__FILE__, __LINE__, "graph capture / instantiate failed");
        return 0;
    }
    return 1;
}

/* NaN-poisons `out` on the device, replays `exec` and waits for it; 1 on success. */
/* One round of a graph test: the captured forward replayed into out (poisoned first), the
   CPU layer's forward on the host tensors into cpu_out, and the n bf16 outputs compared
   within atol + rtol |cpu| (the first differences named after `what`). Returns the
   failures, at most 4 (a replay or copy that fails counts one). */
static int cu_replay_matches_cpu(attn_context *ctx, cu_graph_api *cg, void *exec, cu_buf *out, attn_layer *cpu,
                                 attn_metadata *mc, const attn_tensor *hq, attn_tensor *hc, attn_tensor *ho,
                                 const uint16_t *cpu_out, uint16_t *gpu_out, int n, float atol, float rtol,
                                 const char *what) {
    int x, bad = 0;
    memset(out->host, 0xff, out->bytes);
    if (!cu_up(ctx, out)) return 1;
    EXPECT_EQ_INT(cg->launch(exec, cg->stream), 0);
    EXPECT_EQ_INT(cg->sync(cg->stream), 0);
    EXPECT_OK(attn_layer_forward(cpu, mc, hq, NULL, NULL, hc, ho, NULL, NULL));
    if (!cu_down(ctx, out, gpu_out)) return 1;
    for (x = 0; x < n && bad < 4; x++) {
        float a = attn_bf16_to_f32(cpu_out[x]), g = attn_bf16_to_f32(gpu_out[x]);
        if (!(fabsf(a - g) <= atol + rtol * fabsf(a))) {
            attn_test_fail(__FILE__, __LINE__, "%s out[%d]: cpu %g, graph replay %g", what, x, a, g);
            bad++;
        }
    }
    return bad;
}

ATTN_TEST(cuda_graph_replays_after_new_builds) {
    /* round 3 reaches 1750 keys; round 4 has 24 decodes, 192 (request, KV head) tiles: past
       the SM count, so on a device with the wide decode shape the graph captured on a
       wide build (round 0) replays the default shape's launch */
    enum { H = 32, HKV = 8, D = 128, BS = 16, MAXR = 24, MAXT = 32, MAXB = 112, NB = 8 * MAXB };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *graph = NULL, *exec = NULL;
    cu_graph_api cg;
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, kv, out;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, round, bad = 0;
    int32_t bt[MAXR * MAXB];
    static uint16_t cpu_out[MAXT * H * D], gpu_out[MAXT * H * D];
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out);
    CU_SKIP_IF_NO_GPU(ctx);
    switch (cu_graph_open(&cg)) {
    case 1: attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test");
    case -1: goto done;
    }
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = MAXR; md.max_num_tokens = MAXT; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!cu_layer_pair(ctx, &d, &md, &cpu, &gpu, &mc, &mg)) goto done;
    attn_layer_kv_cache_shape(gpu, NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, sizeof cpu_out) || !cu_buf_make(ctx, &out, sizeof cpu_out) ||
        !cu_buf_make(ctx, &kv, (size_t)NB * 2 * BS * HKV * D * 2)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, MAXT * H * D, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, (size_t)NB * 2 * BS * HKV * D, 2.0f);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &kv)) goto done;
    {
        int i;
        for (i = 0; i < MAXR * MAXB; i++) bt[i] = (i * 37) % NB;
    }
    for (round = 0; round < 7 && !bad; round++) {
        /* a new batch each round: decodes and a short prefill, other lengths; round 5 a
           cascade (8 decodes sharing 256 keys: the captured prefix pass, then the decode
           tiles' join), round 6 the same batch without it (a replay that joins nothing) */
        int32_t qsl[MAXR + 1], seq[MAXR];
        int nreq = round == 4 ? 24 : round >= 5 ? 8 : 2 + round, r, maxq = 0, maxs = 0;
        int prefix = round == 5 ? 256 : 0;
        attn_batch b;
        attn_tensor hq = cu_tensor(q.host, ATTN_DTYPE_BF16, 3, MAXT, H, D, 0);
        attn_tensor ho = cu_tensor(cpu_out, ATTN_DTYPE_BF16, 3, MAXT, H, D, 0);
        attn_tensor hc = attn_tensor_make(kv.host, ATTN_DTYPE_BF16, ndim, shape);
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, MAXT, H, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, MAXT, H, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        qsl[0] = 0;
        for (r = 0; r < nreq; r++) {
            /* the captured build (round 0) has decodes only, no split and no prefill tile:
               the graph must still hold every launch the later rounds need (a prefill of
               8..12 tokens is past the 4-token decode tile; 1750 keys split) */
            int ql = r == nreq - 1 && round > 0 && round < 4 ? 6 + 2 * round : 1;
            seq[r] = round == 4 ? 64 + 37 * r : round >= 5 ? 300 + 97 * r : 100 + 300 * r + 150 * round;
            if (round == 5) memcpy(bt + r * MAXB, bt, (size_t)(prefix / BS) * sizeof bt[0]);
            qsl[r + 1] = qsl[r] + ql;
            maxq = ql > maxq ? ql : maxq;
            maxs = seq[r] > maxs ? seq[r] : maxs;
        }
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = nreq; b.num_actual_tokens = qsl[nreq]; b.max_query_len = maxq; b.max_seq_len = maxs;
        b.stream = cg.stream;
        b.causal = round % 2 ? ATTN_CAUSAL_NO : ATTN_CAUSAL_DEFAULT; /* the graph follows the build */
        EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(mg, prefix, &b, 0));
        if (round == 0 && !cu_capture_forward(&cg, gpu, mg, &gq, &gc, &go, &graph, &exec)) { /* capture once */
            bad++;
            break;
        }
        {
            char what[32];
            snprintf(what, sizeof what, "round %d", round);
            bad += cu_replay_matches_cpu(ctx, &cg, exec, &out, cpu, mc, &hq, &hc, &ho, cpu_out, gpu_out, qsl[nreq] * H * D,
                                         3e-2f, 1e-2f, what);
        }
    }
    EXPECT_EQ_INT(bad, 0);
done:
    if (exec) cg.exec_destroy(exec);
    if (graph) cg.graph_destroy(graph);
    cu_graph_close(&cg);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (cg.lib) dlclose(cg.lib);
}

/* A cache write from device slots (vLLM's slot_mapping tensor) and a forward captured in
   one CUDA graph, replayed after new builds with new slots, keys and values written into the
   same device buffers: the cache bytes and the outputs follow, against the CPU layer doing
   the same from host slots. Then a device slot out of range: the write writes nothing. */
ATTN_TEST(cuda_graph_cache_write_from_device_slots) {
    enum { H = 8, HKV = 2, D = 64, BS = 16, MAXR = 4, MAXT = 8, MAXB = 8, NB = 40 };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *graph = NULL, *exec = NULL;
    cu_graph_api cg;
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, k, v, kv, out, sl;
    int64_t shape[ATTN_MAX_DIMS], one[1];
    int ndim = 0, round, bad = 0, x;
    int32_t bt[MAXR * MAXB];
    size_t cbytes = (size_t)NB * 2 * BS * HKV * D * 2;
    static uint16_t cpu_out[MAXT * H * D], gpu_out[MAXT * H * D];
    unsigned char *ref = NULL;
    memset(&q, 0, sizeof q); memset(&k, 0, sizeof k); memset(&v, 0, sizeof v);
    memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out); memset(&sl, 0, sizeof sl);
    CU_SKIP_IF_NO_GPU(ctx);
    switch (cu_graph_open(&cg)) {
    case 1: attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test");
    case -1: goto done;
    }
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = MAXR; md.max_num_tokens = MAXT; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!cu_layer_pair(ctx, &d, &md, &cpu, &gpu, &mc, &mg)) goto done;
    attn_layer_kv_cache_shape(gpu, NB, shape, &ndim);
    ref = (unsigned char *)malloc(cbytes);
    if (!ref || !cu_buf_make(ctx, &q, sizeof cpu_out) || !cu_buf_make(ctx, &out, sizeof cpu_out) ||
        !cu_buf_make(ctx, &k, (size_t)MAXT * HKV * D * 2) || !cu_buf_make(ctx, &v, (size_t)MAXT * HKV * D * 2) ||
        !cu_buf_make(ctx, &sl, MAXT * 8) || !cu_buf_make(ctx, &kv, cbytes)) goto done;
    cu_fill(kv.host, ATTN_DTYPE_BF16, cbytes / 2, 2.0f); /* every earlier token's K/V */
    memcpy(ref, kv.host, cbytes);
    if (!cu_up(ctx, &kv)) goto done;
    for (x = 0; x < MAXR * MAXB; x++) bt[x] = (x * 7 + 3) % NB; /* distinct blocks per request */
    for (round = 0; round < 4 && !bad; round++) {
        /* 4 requests: three decodes and (rounds 1, 3) a prefill of 5 tokens; every new
           token's slot from the block table */
        int32_t qsl[MAXR + 1], seq[MAXR];
        int64_t *hs = (int64_t *)sl.host;
        int r, t, maxq = 0, maxs = 0;
        attn_batch b;
        attn_tensor hq = cu_tensor(q.host, ATTN_DTYPE_BF16, 3, MAXT, H, D, 0);
        attn_tensor ho = cu_tensor(cpu_out, ATTN_DTYPE_BF16, 3, MAXT, H, D, 0);
        attn_tensor hc = attn_tensor_make(ref, ATTN_DTYPE_BF16, ndim, shape);
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, MAXT, H, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, MAXT, H, D, 1);
        attn_tensor gk = cu_tensor(k.dev, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 1);
        attn_tensor gv = cu_tensor(v.dev, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 1);
        attn_tensor hk = cu_tensor(k.host, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 0);
        attn_tensor hv = cu_tensor(v.host, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 0);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        attn_tensor gs;
        gc.device.kind = ATTN_DEVICE_CUDA;
        qsl[0] = 0;
        for (r = 0; r < MAXR; r++) {
            int ql = r == 3 && round % 2 ? 5 : 1;
            seq[r] = 20 + 9 * r + 13 * round;
            qsl[r + 1] = qsl[r] + ql;
            maxq = ql > maxq ? ql : maxq;
            maxs = seq[r] > maxs ? seq[r] : maxs;
            for (t = 0; t < ql; t++) {
                int pos = seq[r] - ql + t;
                hs[qsl[r] + t] = (int64_t)bt[r * MAXB + pos / BS] * BS + pos % BS;
            }
        }
        for (t = qsl[MAXR]; t < MAXT; t++) hs[t] = -1; /* the capacity's padding rows */
        one[0] = MAXT; /* the captured write covers the capacity; padding slots skip */
        gs = attn_tensor_make(sl.dev, ATTN_DTYPE_INT64, 1, one);
        gs.device.kind = ATTN_DEVICE_CUDA;
        cu_fill(q.host, ATTN_DTYPE_BF16, MAXT * H * D, 2.0f);
        cu_fill(k.host, ATTN_DTYPE_BF16, MAXT * HKV * D, 2.0f);
        cu_fill(v.host, ATTN_DTYPE_BF16, MAXT * HKV * D, 2.0f);
        if (!cu_up(ctx, &q) || !cu_up(ctx, &k) || !cu_up(ctx, &v) || !cu_up(ctx, &sl)) { bad++; break; }
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = MAXR; b.num_actual_tokens = qsl[MAXR]; b.max_query_len = maxq; b.max_seq_len = maxs;
        b.slot_mapping = hs;
        b.stream = cg.stream;
        EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(mg, 0, &b, 0));
        if (round == 0) { /* capture once: the write from the slot tensor, then the forward */
            EXPECT_EQ_INT(cg.begin(cg.stream, 2 /* relaxed */), 0);
            EXPECT_OK(attn_reshape_and_cache(gpu, &gk, &gv, &gc, &gs, cg.stream));
            EXPECT_OK(attn_layer_forward(gpu, mg, &gq, NULL, NULL, &gc, &go, NULL, cg.stream));
            EXPECT_EQ_INT(cg.end(cg.stream, &graph), 0);
            if (!graph || cg.instantiate(&exec, graph, 0) != 0) {
                attn_test_fail(__FILE__, __LINE__, "graph capture / instantiate failed");
                bad++;
                break;
            }
        }
        EXPECT_OK(attn_reshape_and_cache(cpu, &hk, &hv, &hc, ATTN_TEST_SLOTS(hs, qsl[MAXR]), NULL));
        {
            char what[32];
            snprintf(what, sizeof what, "round %d", round);
            bad += cu_replay_matches_cpu(ctx, &cg, exec, &out, cpu, mc, &hq, &hc, &ho, cpu_out, gpu_out,
                                         qsl[MAXR] * H * D, 3e-2f, 1e-2f, what);
        }
        if (cu_down(ctx, &kv, kv.host) && memcmp(kv.host, ref, cbytes) != 0) {
            attn_test_fail(__FILE__, __LINE__, "round %d: the cache written from device slots differs from the CPU's",
                           round);
            bad++;
        }
    }
    /* a slot out of range among good ones: no CTA writes (the cache keeps its bytes) */
    if (!bad) {
        int64_t *hs = (int64_t *)sl.host;
        attn_tensor gk = cu_tensor(k.dev, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 1);
        attn_tensor gv = cu_tensor(v.dev, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape), gs;
        gc.device.kind = ATTN_DEVICE_CUDA;
        for (x = 0; x < MAXT; x++) hs[x] = x;
        hs[MAXT - 1] = (int64_t)NB * BS; /* one past the last slot */
        one[0] = MAXT;
        gs = attn_tensor_make(sl.dev, ATTN_DTYPE_INT64, 1, one);
        gs.device.kind = ATTN_DEVICE_CUDA;
        cu_fill(k.host, ATTN_DTYPE_BF16, MAXT * HKV * D, 2.0f);
        EXPECT_TRUE(cu_up(ctx, &sl) && cu_up(ctx, &k));
        EXPECT_OK(attn_reshape_and_cache(gpu, &gk, &gv, &gc, &gs, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
        EXPECT_TRUE(cu_down(ctx, &kv, kv.host) && memcmp(kv.host, ref, cbytes) == 0);
    }
    EXPECT_EQ_INT(bad, 0);
done:
    if (exec) cg.exec_destroy(exec);
    if (graph) cg.graph_destroy(graph);
    cu_graph_close(&cg);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &k); cu_buf_free(ctx, &v); cu_buf_free(ctx, &kv);
    cu_buf_free(ctx, &out); cu_buf_free(ctx, &sl);
    free(ref);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (cg.lib) dlclose(cg.lib);
}

/* An fp8 layer whose scales and attention sinks are device floats (vLLM's k_scale / v_scale
   tensors, gpt-oss's sinks): a forward captured once in a CUDA graph and replayed after the
   scales and sinks change reads the new values (against a CPU layer reading host floats
   changed alike). */
ATTN_TEST(cuda_fp8_graph_replays_new_scales) {
    enum { H = 8, HKV = 2, D = 128, BS = 16, R = 3, MAXB = 16, NB = R * MAXB };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *graph = NULL, *exec = NULL;
    cu_graph_api cg;
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, kv, out, sc;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, round, bad = 0, i;
    int32_t bt[R * MAXB], qsl[R + 1] = {0, 1, 2, 3}, seq[R] = {100, 250, 17};
    float hs[2 + H] = {1.0f / 64, 1.0f / 32}; /* k_scale, v_scale, then the H sinks */
    static const float rounds[3][2] = {{1.0f / 64, 1.0f / 32}, {1.0f / 16, 1.0f / 128}, {0.5f, 0.75f}};
    static uint16_t cpu_out[R * H * D], gpu_out[R * H * D];
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out); memset(&sc, 0, sizeof sc);
    CU_SKIP_IF_NO_GPU(ctx);
    switch (cu_graph_open(&cg)) {
    case 1: attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test");
    case -1: goto done;
    }
    if (!cu_buf_make(ctx, &sc, sizeof hs)) goto done;
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
    d.k_scale.ptr = &hs[0]; d.v_scale.ptr = &hs[1]; /* the CPU layer: host floats */
    d.sinks = hs + 2;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &cpu));
    d.device = ATTN_DEVICE_CUDA; /* the CUDA layer: device floats */
    d.k_scale.ptr = (const float *)sc.dev; d.v_scale.ptr = (const float *)sc.dev + 1;
    d.k_scale.device = d.v_scale.device = ATTN_DEVICE_CUDA;
    d.sinks = (const float *)sc.dev + 2;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = R; md.max_num_tokens = R; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!cpu || !gpu || attn_metadata_create(cpu, &md, &mc) != ATTN_OK || attn_metadata_create(gpu, &md, &mg) != ATTN_OK)
        goto done;
    attn_layer_kv_cache_shape(gpu, NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, sizeof cpu_out) || !cu_buf_make(ctx, &out, sizeof cpu_out) ||
        !cu_buf_make(ctx, &kv, (size_t)NB * 2 * BS * HKV * D))
        goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, R * H * D, 2.0f);
    /* every slot's codes through the CPU cache write (scales 1/64, 1/32) */
    if (!cu_fill_by_write(cpu, kv.host, ATTN_DTYPE_FP8_E4M3, ndim, shape, ATTN_DTYPE_BF16, NB, BS, HKV, D) ||
        !cu_up(ctx, &q) || !cu_up(ctx, &kv))
        goto done;
    for (i = 0; i < R * MAXB; i++) bt[i] = (i * 7) % NB;
    {
        attn_batch b;
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = R; b.num_actual_tokens = R; b.max_query_len = 1; b.max_seq_len = 250;
        b.stream = cg.stream;
        EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(mg, 0, &b, 0));
    }
    for (round = 0; round < 3 && !bad; round++) {
        attn_tensor hq = cu_tensor(q.host, ATTN_DTYPE_BF16, 3, R, H, D, 0), ho = cu_tensor(cpu_out, ATTN_DTYPE_BF16, 3, R, H, D, 0);
        attn_tensor hc = attn_tensor_make(kv.host, ATTN_DTYPE_FP8_E4M3, ndim, shape);
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, R, H, D, 1), go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, R, H, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_FP8_E4M3, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        hs[0] = rounds[round][0]; hs[1] = rounds[round][1];
        for (i = 0; i < H; i++) hs[2 + i] = (float)(round * 3 - i) * 0.75f; /* new sinks each round */
        memcpy(sc.host, hs, sizeof hs);
        if (!cu_up(ctx, &sc)) { bad++; break; }
        if (round == 0 && !cu_capture_forward(&cg, gpu, mg, &gq, &gc, &go, &graph, &exec)) { /* capture once */
            bad++;
            break;
        }
        {
            char what[80];
            snprintf(what, sizeof what, "round %d (k_scale %g, v_scale %g)", round, (double)hs[0], (double)hs[1]);
            bad += cu_replay_matches_cpu(ctx, &cg, exec, &out, cpu, mc, &hq, &hc, &ho, cpu_out, gpu_out, R * H * D, 3e-2f,
                                         3e-2f, what);
        }
    }
    EXPECT_EQ_INT(bad, 0);
done:
    if (exec) cg.exec_destroy(exec);
    if (graph) cg.graph_destroy(graph);
    cu_graph_close(&cg);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out); cu_buf_free(ctx, &sc);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (cg.lib) dlclose(cg.lib);
}

/* ---- kernel cache on the GPU: many threads, damaged and unusable directories ---------------- */

/* A context whose kernels are kept in `dir` ("off": memory only), logging into log
   (an attn_test_log, reset here) or, with a hook of the caller's, into its user data. */
static attn_context *cu_ctx_dir(void *log, const char *dir, attn_log_fn hook) {
    attn_context_desc cd;
    attn_context *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    cd.log = hook ? hook : attn_test_log_hook;
    cd.log_user_data = log;
    cd.log_level = ATTN_LOG_LEVEL_INFO;
    cd.kernel_cache_dir = dir;
    if (attn_context_create(&cd, &ctx) != ATTN_OK) return NULL;
    if (log && !hook) attn_test_log_reset((attn_test_log *)log);
    return ctx;
}

/* A small mixed batch on a fresh pair of layers of ctx, CUDA against CPU; 0 = agreed. */
static int cu_small_case(attn_context *ctx, int line) {
    cu_case c;
    memset(&c, 0, sizeof c);
    c.heads = 16; c.kv_heads = 4; c.head = 128; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
    c.causal = 1; c.lse = 1; c.nreq = 3;
    c.qlen[0] = 1; c.ctxlen[0] = 300;
    c.qlen[1] = 1; c.ctxlen[1] = 1000;
    c.qlen[2] = 20; c.ctxlen[2] = 50;
    return cu_run_case(ctx, &c, line);
}

/* Damages every .cubin file of dir: truncated, garbage, one flipped byte, in turn. */
static int cu_damage_cache(const char *dir) {
    DIR *dd = opendir(dir);
    struct dirent *ent;
    int n = 0;
    if (!dd) return 0;
    while ((ent = readdir(dd)) != NULL) {
        char path[600];
        size_t k = strlen(ent->d_name);
        FILE *f;
        if (k <= 6 || strcmp(ent->d_name + k - 6, ".cubin") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        if (n % 3 == 0) { /* truncated: the first 100 bytes kept */
            char head[100];
            size_t got;
            if (!(f = fopen(path, "rb"))) continue;
            got = fread(head, 1, sizeof head, f);
            fclose(f);
            if (!(f = fopen(path, "wb"))) continue;
            fwrite(head, 1, got, f);
            fclose(f);
        } else if (n % 3 == 1) {
            int i;
            if (!(f = fopen(path, "wb"))) continue;
            for (i = 0; i < 5000; i++) fputc((i * 131) & 0xff, f);
            fclose(f);
        } else {
            long len;
            int ch;
            if (!(f = fopen(path, "r+b"))) continue;
            fseek(f, 0, SEEK_END);
            len = ftell(f);
            fseek(f, len / 2, SEEK_SET);
            ch = fgetc(f);
            fseek(f, len / 2, SEEK_SET);
            fputc(ch ^ 0x40, f);
            fclose(f);
        }
        n++;
    }
    closedir(dd);
    return n;
}

/* Damaged cache files are rebuilt (one WARN each, right results); an unusable directory
   keeps the kernels in memory (one WARN, right results). */
ATTN_TEST(cuda_kernel_cache_faults_survived) {
    attn_test_log log;
    char dir[128], cmd[200];
    attn_context *ctx;
    int damaged;
    FILE *f;
    snprintf(dir, sizeof dir, "/tmp/attn-cuda-kcache-%ld", (long)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* best effort */ }
    ctx = cu_ctx_dir(&log, dir, NULL);
    CU_SKIP_IF_NO_GPU(ctx);
    EXPECT_EQ_INT(cu_small_case(ctx, __LINE__), 0);
    EXPECT_EQ_INT(log.by_level[ATTN_LOG_LEVEL_WARN], 0);
    attn_context_destroy(ctx);
    damaged = cu_damage_cache(dir);
    EXPECT_TRUE(damaged >= 3); /* decode, prefill, cache write */
    ctx = cu_ctx_dir(&log, dir, NULL);
    EXPECT_EQ_INT(cu_small_case(ctx, __LINE__), 0);
    EXPECT_EQ_INT(log.by_item_level[ATTN_LOG_KERNEL_CACHE_FAULT][ATTN_LOG_LEVEL_WARN], damaged);
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), damaged);
    attn_context_destroy(ctx);
    /* rebuilt: read back with no compile and no warning */
    ctx = cu_ctx_dir(&log, dir, NULL);
    EXPECT_EQ_INT(cu_small_case(ctx, __LINE__), 0);
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), 0);
    EXPECT_EQ_INT(log.by_level[ATTN_LOG_LEVEL_WARN], 0);
    attn_context_destroy(ctx);
    if (system(cmd) != 0) { /* best effort */ }
    /* a file where the directory should be */
    f = fopen(dir, "w");
    if (f) fclose(f);
    ctx = cu_ctx_dir(&log, dir, NULL);
    EXPECT_EQ_INT(cu_small_case(ctx, __LINE__), 0);
    EXPECT_EQ_INT(log.by_item_level[ATTN_LOG_KERNEL_CACHE_FAULT][ATTN_LOG_LEVEL_WARN], 1);
    EXPECT_TRUE(attn_kernel_compile_count(ctx) >= 3);
    attn_context_destroy(ctx);
    remove(dir);
}

#ifndef ATTN_NO_THREADS
/* A log hook several threads may call at once: counts the compile lines. */
typedef struct cu_mt_log {
    pthread_mutex_t lock;
    int compiled, errors;
} cu_mt_log;
static void cu_mt_hook(void *user, attn_log_level level, attn_log_item item, const char *msg) {
    cu_mt_log *l = (cu_mt_log *)user;
    (void)msg;
    pthread_mutex_lock(&l->lock);
    l->compiled += item == ATTN_LOG_KERNEL_COMPILED;
    l->errors += level == ATTN_LOG_LEVEL_ERROR;
    pthread_mutex_unlock(&l->lock);
}

enum { MT_H = 16, MT_HKV = 4, MT_D = 128, MT_BS = 16, MT_REQS = 3, MT_STRIDE = 64, MT_NB = MT_REQS * MT_STRIDE };
typedef struct cu_mt_arg {
    attn_context *ctx;
    const attn_layer_desc *d;
    const attn_batch *b;
    const attn_metadata_desc *md;
    attn_tensor q, cache, out;
    attn_layer *layer;
    attn_status st;
    char err[512];
} cu_mt_arg;

static void *cu_mt_thread(void *varg) {
    cu_mt_arg *a = (cu_mt_arg *)varg;
    attn_metadata *m = NULL;
    a->st = attn_layer_create(a->ctx, a->d, NULL, &a->layer);
    if (a->st == ATTN_OK) a->st = attn_metadata_create(a->layer, a->md, &m);
    if (a->st == ATTN_OK) a->st = attn_metadata_build(m, 0, a->b, 0);
    if (a->st == ATTN_OK) a->st = attn_layer_forward(a->layer, m, &a->q, NULL, NULL, &a->cache, &a->out, NULL, NULL);
    if (a->st == ATTN_OK) a->st = attn_cuda_synchronize(a->ctx, NULL);
    if (a->st != ATTN_OK) snprintf(a->err, sizeof a->err, "%s", attn_context_last_error(a->ctx));
    attn_metadata_destroy(m);
    return NULL;
}
#endif

/* Eight threads creating the same CUDA layer at once: each variant compiles once, and
   every thread's layer computes what the CPU does. */
ATTN_TEST(cuda_threads_create_one_layer_compile_once) {
#ifdef ATTN_NO_THREADS
    SKIP("built without threads (ATTN_NO_THREADS)");
#else
    cu_mt_log log;
    attn_context *ctx;
    attn_layer_desc d;
    attn_layer *cpu = NULL;
    attn_metadata *mc = NULL;
    attn_metadata_desc md;
    attn_batch b;
    cu_mt_arg args[8];
    pthread_t th[8];
    int32_t qsl[MT_REQS + 1] = {0, 1, 2, 14}, seq[MT_REQS] = {700, 1000, 40}, bt[MT_REQS * MT_STRIDE];
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, i, x, bad = 0, ntok = 14;
    cu_buf q, kv, outs[8];
    static uint16_t ref[14 * MT_H * MT_D], got[14 * MT_H * MT_D];
    memset(&log, 0, sizeof log);
    pthread_mutex_init(&log.lock, NULL);
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(outs, 0, sizeof outs);
    ctx = cu_ctx_dir(&log, "off", cu_mt_hook);
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = MT_H; d.num_kv_heads = MT_HKV; d.head_size = MT_D; d.dtype = ATTN_DTYPE_BF16;
    d.block_size = MT_BS;
    for (i = 0; i < MT_REQS * MT_STRIDE; i++) bt[i] = (i * 53) % MT_NB;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MT_STRIDE;
    b.num_reqs = MT_REQS; b.num_actual_tokens = ntok; b.max_query_len = 12; b.max_seq_len = 1000;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = MT_REQS; md.max_num_tokens = ntok; md.max_blocks_per_req = MT_STRIDE; md.num_blocks = MT_NB;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &cpu));
    if (!cpu) goto done;
    attn_layer_kv_cache_shape(cpu, MT_NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, sizeof ref) || !cu_buf_make(ctx, &kv, (size_t)MT_NB * 2 * MT_BS * MT_HKV * MT_D * 2))
        goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, sizeof ref / 2, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, kv.bytes / 2, 2.0f);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &kv)) goto done;
    EXPECT_OK(attn_metadata_create(cpu, &md, &mc));
    EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
    {
        attn_tensor hq = cu_tensor(q.host, ATTN_DTYPE_BF16, 3, ntok, MT_H, MT_D, 0);
        attn_tensor ho = cu_tensor(ref, ATTN_DTYPE_BF16, 3, ntok, MT_H, MT_D, 0);
        attn_tensor hc = attn_tensor_make(kv.host, ATTN_DTYPE_BF16, ndim, shape);
        EXPECT_OK(attn_layer_forward(cpu, mc, &hq, NULL, NULL, &hc, &ho, NULL, NULL));
    }
    d.device = ATTN_DEVICE_CUDA;
    for (i = 0; i < 8; i++) {
        memset(&args[i], 0, sizeof args[i]);
        if (!cu_buf_make(ctx, &outs[i], sizeof ref)) goto done;
        memset(outs[i].host, 0xff, sizeof ref);
        if (!cu_up(ctx, &outs[i])) goto done;
        args[i].ctx = ctx; args[i].d = &d; args[i].b = &b; args[i].md = &md;
        args[i].q = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, ntok, MT_H, MT_D, 1);
        args[i].out = cu_tensor(outs[i].dev, ATTN_DTYPE_BF16, 3, ntok, MT_H, MT_D, 1);
        args[i].cache = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        args[i].cache.device.kind = ATTN_DEVICE_CUDA;
    }
    for (i = 0; i < 8; i++) pthread_create(&th[i], NULL, cu_mt_thread, &args[i]);
    for (i = 0; i < 8; i++) pthread_join(th[i], NULL);
    /* decode variant, prefill variant, cache write, and the wide decode variant where the
       device has the shared memory for it (sm_90+: 16 Q rows and 3 stages of 128 K and V
       rows, padded by 16 bytes, plus the row offsets): once each */
    {
        attn_platform pl;
        const int pitch = (MT_D + 8) * 2, wide_smem = 16 * pitch + 3 * 128 * 8 + 6 * 128 * pitch;
        int variants = 3;
        if (attn_platform_get(ctx, &pl) == ATTN_OK && pl.cuda_capability_major >= 9 &&
            pl.cuda_shared_per_block >= wide_smem)
            variants = 4;
        EXPECT_EQ_INT(log.compiled, variants);
        EXPECT_EQ_INT(attn_kernel_compile_count(ctx), variants);
    }
    EXPECT_EQ_INT(log.errors, 0);
    for (i = 0; i < 8; i++) {
        if (args[i].st != ATTN_OK) {
            attn_test_fail(__FILE__, __LINE__, "thread %d: %s: %s", i, attn_status_string(args[i].st), args[i].err);
            bad++;
            continue;
        }
        if (!cu_down(ctx, &outs[i], got)) { bad++; continue; }
        for (x = 0; x < ntok * MT_H * MT_D && bad < 4; x++) {
            float r = attn_bf16_to_f32(ref[x]), g = attn_bf16_to_f32(got[x]);
            if (!(fabsf(r - g) <= 3e-2f + 1e-2f * fabsf(r))) {
                attn_test_fail(__FILE__, __LINE__, "thread %d out[%d]: cpu %g, cuda %g", i, x, r, g);
                bad++;
            }
        }
    }
    EXPECT_EQ_INT(bad, 0);
done:
    for (i = 0; i < 8; i++) {
        if (args[i].layer) attn_layer_destroy(args[i].layer);
        cu_buf_free(ctx, &outs[i]);
    }
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv);
    attn_metadata_destroy(mc);
    attn_layer_destroy(cpu);
    attn_context_destroy(ctx);
    pthread_mutex_destroy(&log.lock);
#endif
}

/* ---- a stream of another CUDA context: refused by every call that takes one -------------- */

typedef int (*cu_fn_ctx_create)(void **, unsigned, int);
typedef int (*cu_fn_ctx_ptr)(void *);
typedef int (*cu_fn_ctx_pop)(void **);

ATTN_TEST(cuda_stream_of_another_context_refused) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *lib = NULL, *other = NULL, *stream = NULL, *popped = NULL, *dq = NULL, *dc = NULL, *dout = NULL;
    const char *missing = NULL;
    cu_fn_ctx_create ctx_create; cu_fn_ctx_ptr ctx_destroy, ctx_push; cu_fn_ctx_pop ctx_pop;
    cu_fn_stream_create stream_create; cu_fn_stream_destroy stream_destroy;
    attn_layer_desc d;
    attn_layer *gpu = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b;
    int32_t qsl[2] = {0, 1}, seq[1] = {5}, bt[1] = {0};
    int64_t slots[1] = {4}, shape[ATTN_MAX_DIMS];
    float host_out[64];
    int ndim = 0, n;
    CU_SKIP_IF_NO_GPU(ctx);
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test"); }
    CU_LOAD(ctx_create, cu_fn_ctx_create, "cuCtxCreate_v2");
    CU_LOAD(ctx_destroy, cu_fn_ctx_ptr, "cuCtxDestroy_v2");
    CU_LOAD(ctx_push, cu_fn_ctx_ptr, "cuCtxPushCurrent_v2");
    CU_LOAD(ctx_pop, cu_fn_ctx_pop, "cuCtxPopCurrent_v2");
    CU_LOAD(stream_create, cu_fn_stream_create, "cuStreamCreate");
    CU_LOAD(stream_destroy, cu_fn_stream_destroy, "cuStreamDestroy_v2");
    if (missing) { attn_test_fail(__FILE__, __LINE__, "libcuda lacks %s", missing); goto done; }
    /* a context of its own on device 0 (not the primary one), and a stream in it */
    if (ctx_create(&other, 0, 0) != 0 || stream_create(&stream, 1) != 0 || ctx_pop(&popped) != 0) {
        attn_test_fail(__FILE__, __LINE__, "cannot make a context and a stream");
        goto done;
    }
    memset(&d, 0, sizeof d);
    d.num_heads = 4; d.num_kv_heads = 4; d.head_size = 16; d.dtype = ATTN_DTYPE_F32; d.block_size = 16;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 1; md.num_blocks = 1;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 1;
    b.slot_mapping = slots; b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 5;
    if (!gpu || attn_metadata_create(gpu, &md, &m) != ATTN_OK || attn_cuda_malloc(ctx, 256, &dq) != ATTN_OK ||
        attn_cuda_malloc(ctx, 256, &dout) != ATTN_OK || attn_cuda_malloc(ctx, 4 * 2 * 16 * 64, &dc) != ATTN_OK) {
        EXPECT_TRUE(0);
        goto done;
    }
    {
        attn_tensor q = cu_tensor(dq, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
        attn_tensor out = cu_tensor(dout, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
        attn_tensor cache;
        attn_layer_kv_cache_shape(gpu, 1, shape, &ndim);
        cache = attn_tensor_make(dc, ATTN_DTYPE_F32, ndim, shape);
        cache.device.kind = ATTN_DEVICE_CUDA;
        for (n = 0; n < 64; n++) host_out[n] = 1.0f + (float)n;
        EXPECT_OK(attn_cuda_memcpy(ctx, dq, host_out, 256, ATTN_COPY_HOST_TO_DEVICE, NULL));
        EXPECT_OK(attn_cuda_memcpy(ctx, dc, host_out, 256, ATTN_COPY_HOST_TO_DEVICE, NULL));
        memset(host_out, 0x7f, sizeof host_out);
        EXPECT_OK(attn_cuda_memcpy(ctx, dout, host_out, 256, ATTN_COPY_HOST_TO_DEVICE, NULL));
        /* build with the foreign stream: refused, and the metadata stays unbuilt */
        b.stream = stream;
        attn_test_log_reset(&log);
        EXPECT_STATUS(attn_metadata_build(m, 0, &b, 0), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "another CUDA context") != NULL);
        EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_INVALID_ARGUMENT, ATTN_LOG_LEVEL_ERROR));
        b.stream = NULL;
        EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &out, NULL, stream), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "attn_layer_forward: stream") != NULL);
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, &q, &q, &cache, &out, NULL, stream), ATTN_ERROR_INVALID_VALUE);
        EXPECT_STATUS(attn_reshape_and_cache(gpu, &q, &q, &cache, ATTN_TEST_SLOTS(slots, 1), stream), ATTN_ERROR_INVALID_VALUE);
        EXPECT_STATUS(attn_cuda_memcpy(ctx, dout, dq, 256, ATTN_COPY_DEVICE_TO_DEVICE, stream), ATTN_ERROR_INVALID_VALUE);
        EXPECT_STATUS(attn_cuda_synchronize(ctx, stream), ATTN_ERROR_INVALID_VALUE);
        {
            attn_tensor o = cu_tensor(dout, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
            attn_tensor l = cu_tensor(dq, ATTN_DTYPE_F32, 2, 1, 4, 0, 1);
            attn_tensor l2 = cu_tensor((char *)dq + 64, ATTN_DTYPE_F32, 2, 1, 4, 0, 1);
            attn_tensor o2 = cu_tensor(dc, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
            EXPECT_STATUS(attn_merge_attn_states(ctx, &o, &l, ATTN_LSE_BASE_E, &o2, &l2, ATTN_LSE_BASE_E, &o, NULL,
                                                 ATTN_LSE_BASE_E, stream), ATTN_ERROR_INVALID_VALUE);
        }
        /* nothing was written: out and the cache hold what they held */
        {
            float back[64], cache_back[64];
            int same = 1;
            EXPECT_OK(attn_cuda_memcpy(ctx, back, dout, 256, ATTN_COPY_DEVICE_TO_HOST, NULL));
            EXPECT_OK(attn_cuda_memcpy(ctx, cache_back, dc, 256, ATTN_COPY_DEVICE_TO_HOST, NULL));
            for (n = 0; n < 64; n++) same &= memcmp(&back[n], &host_out[n], 4) == 0 && cache_back[n] == 1.0f + (float)n;
            EXPECT_TRUE(same);
        }
        /* and the same calls on the primary context's streams work */
        EXPECT_OK(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &out, NULL, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
    }
done:
    if (stream && other && ctx_push(other) == 0) {
        stream_destroy(stream);
        ctx_pop(&popped);
    }
    if (other) ctx_destroy(other);
    attn_cuda_free(ctx, dq); attn_cuda_free(ctx, dout); attn_cuda_free(ctx, dc);
    attn_metadata_destroy(m);
    attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (lib) dlclose(lib);
}

/* ---- MLA on the GPU: selection, graph capture, bad input ----------------------------------
   (the numerics of CUDA_MLA_SM90 against float64 and CPU_MLA: tests/test_mla_cuda.c, suite_cuda_mla) */

static attn_layer_desc cu_mla_desc(int H, attn_dtype dt, attn_device_kind dev) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.use_mla = 1; d.num_heads = H; d.head_size = 576; d.kv_lora_rank = 512; d.qk_rope_head_dim = 64;
    d.qk_nope_head_dim = 128; d.v_head_dim = 128; d.dtype = dt; d.block_size = 64; d.device = dev;
    return d;
}

/* An MLA layer on the device resolves to CUDA_MLA_SM90 on compute capability 9.0 (the record
   says so), elsewhere to nothing with CUDA_MLA_SM90's reason; f32 is outside its scope. */
ATTN_TEST(cuda_mla_selected_for_device_layers) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_selection s;
    attn_platform p;
    CU_SKIP_IF_NO_GPU(ctx);
    attn_platform_get(ctx, &p);
    d = cu_mla_desc(128, ATTN_DTYPE_BF16, ATTN_DEVICE_CUDA);
    memset(&s, 0, sizeof s);
    if (p.cuda_capability_major == 9 && p.cuda_capability_minor == 0 && p.cublas_version) {
        EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
        EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA_MLA_SM90);
        EXPECT_EQ_INT(s.default_backend, ATTN_BACKEND_CUDA_MLA_SM90);
        EXPECT_EQ_INT(s.cuda_graph, ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE);
        EXPECT_TRUE(s.can_return_lse);
    } else if (p.cublas_version) { /* the mma.sync fallback, and the record says why not the wgmma one */
        EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
        EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA_MLA);
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA_SM90, "compute capability"));
    } else {
        EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA, "cuBLAS"));
    }
    d.dtype = ATTN_DTYPE_F32; /* outside every GPU MLA scope: refused with the reason */
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA_SM90, ""));
    d = cu_mla_desc(16, ATTN_DTYPE_BF16, ATTN_DEVICE_CUDA);
    d.qk_nope_head_dim = 96; /* the prefill kernel takes 128 / 128 and 64 / 64 */
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
    if (p.cuda_capability_major == 9 && p.cuda_capability_minor == 0)
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA_SM90, "qk_nope_head_dim 96"));
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA, "qk_nope_head_dim 96"));
    if (p.cublas_version) { /* an fp8 latent: CUDA_MLA; the wgmma backend says why not */
        d = cu_mla_desc(16, ATTN_DTYPE_BF16, ATTN_DEVICE_CUDA);
        d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
        d.k_scale.value = 0.5f;
        memset(&s, 0, sizeof s);
        EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
        EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA_MLA);
        if (p.cuda_capability_major == 9 && p.cuda_capability_minor == 0)
            EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA_SM90, "fp8_e4m3"));
        d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD; /* latents: per tensor only */
        d.k_scale.value = 0.0f;
        memset(&s, 0, sizeof s);
        EXPECT_TRUE(attn_select_backend(ctx, &d, NULL, &s) != ATTN_OK);
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA, "PER_TOKEN_HEAD"));
    }
    d = cu_mla_desc(16, ATTN_DTYPE_BF16, ATTN_DEVICE_CPU); /* CPU tensors stay on the CPU */
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU_MLA);
    attn_context_destroy(ctx);
}

static int cu_mla_sm90(attn_context *ctx) {
    attn_platform p;
    attn_platform_get(ctx, &p);
    return p.cuda_capability_major == 9 && p.cuda_capability_minor == 0 && p.cublas_version;
}

/* forward_mqa and the fused call captured once into CUDA graphs and replayed after new
   builds of other decode batches (more and fewer requests, with and without splits), each
   against CPU_MLA on the same data; the fused graph (cuBLAS projections inside) replays
   batches of its captured token count. Outputs past the batch stay untouched. */
ATTN_TEST(cuda_mla_graph_replays_after_new_builds) {
    enum { H = 128, R = 512, P = 64, D = 576, N = 128, V = 128, BS = 64, MAXR = 24, MAXB = 40, NB = MAXR * MAXB };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *graph[2] = {NULL, NULL}, *exec[2] = {NULL, NULL};
    cu_graph_api cg;
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, qpe, qn, kv, out, wuk, wuv;
    int round, bad = 0, x;
    int32_t bt[MAXR * MAXB];
    static uint16_t cpu_out[MAXR * H * R], gpu_out[MAXR * H * R];
    memset(&q, 0, sizeof q); memset(&qpe, 0, sizeof qpe); memset(&qn, 0, sizeof qn); memset(&kv, 0, sizeof kv);
    memset(&out, 0, sizeof out); memset(&wuk, 0, sizeof wuk); memset(&wuv, 0, sizeof wuv);
    CU_SKIP_IF_NO_GPU(ctx);
    if (!cu_mla_sm90(ctx)) { attn_context_destroy(ctx); SKIP("CUDA_MLA_SM90 needs compute capability 9.0 and cuBLAS"); }
    switch (cu_graph_open(&cg)) {
    case 1: attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test");
    case -1: goto done;
    }
    d = cu_mla_desc(H, ATTN_DTYPE_BF16, ATTN_DEVICE_CPU);
    memset(&md, 0, sizeof md);
    md.max_num_reqs = MAXR; md.max_num_tokens = MAXR; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!cu_layer_pair(ctx, &d, &md, &cpu, &gpu, &mc, &mg)) goto done;
    if (!cu_buf_make(ctx, &q, (size_t)MAXR * H * R * 2) || !cu_buf_make(ctx, &qpe, (size_t)MAXR * H * P * 2) ||
        !cu_buf_make(ctx, &qn, (size_t)MAXR * H * N * 2) || !cu_buf_make(ctx, &out, sizeof gpu_out) ||
        !cu_buf_make(ctx, &kv, (size_t)NB * BS * D * 2) || !cu_buf_make(ctx, &wuk, (size_t)H * N * R * 2) ||
        !cu_buf_make(ctx, &wuv, (size_t)H * R * V * 2)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, (size_t)MAXR * H * R, 0.5f);
    cu_fill(qpe.host, ATTN_DTYPE_BF16, (size_t)MAXR * H * P, 2.0f);
    cu_fill(qn.host, ATTN_DTYPE_BF16, (size_t)MAXR * H * N, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, (size_t)NB * BS * D, 2.0f);
    cu_fill(wuk.host, ATTN_DTYPE_BF16, (size_t)H * N * R, 0.2f);
    cu_fill(wuv.host, ATTN_DTYPE_BF16, (size_t)H * R * V, 0.2f);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &qpe) || !cu_up(ctx, &qn) || !cu_up(ctx, &kv) || !cu_up(ctx, &wuk) ||
        !cu_up(ctx, &wuv)) goto done;
    for (x = 0; x < MAXR * MAXB; x++) bt[x] = (x * 37) % NB;
    for (round = 0; round < 6 && !bad; round++) {
        /* rounds 0, 2, 4: 8 decodes (the fused graph's token count); 1: 2 long decodes (many
           splits); 3: 24 decodes of a few hundred keys; 5: 1 decode of 2500 keys */
        static const int nreqs[6] = {8, 2, 8, 24, 8, 1};
        int32_t qsl[MAXR + 1], seq[MAXR];
        int nreq = nreqs[round], r, maxs = 0, g, T;
        attn_batch b;
        qsl[0] = 0;
        for (r = 0; r < nreq; r++) {
            seq[r] = nreq == 2 ? 2000 + 400 * r : nreq == 1 ? 2500 : 40 + (97 * r + 311 * round) % 900;
            qsl[r + 1] = r + 1;
            maxs = seq[r] > maxs ? seq[r] : maxs;
        }
        T = nreq;
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = nreq; b.num_actual_tokens = T; b.max_query_len = 1; b.max_seq_len = maxs;
        b.stream = cg.stream;
        EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(mg, 0, &b, 0));
        for (g = 0; g < 2 && !bad; g++) { /* 0: forward_mqa, 1: the fused call */
            const int W = g ? V : R;
            attn_tensor gq = cu_tensor(g ? qn.dev : q.dev, ATTN_DTYPE_BF16, 3, g ? T : MAXR, H, g ? N : R, 1);
            attn_tensor gp = cu_tensor(qpe.dev, ATTN_DTYPE_BF16, 3, g ? T : MAXR, H, P, 1);
            attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, g ? T : MAXR, H, W, 1);
            attn_tensor gc = cu_tensor(kv.dev, ATTN_DTYPE_BF16, 3, NB, BS, D, 1);
            attn_tensor gk = cu_tensor(wuk.dev, ATTN_DTYPE_BF16, 3, H, N, R, 1);
            attn_tensor gv = cu_tensor(wuv.dev, ATTN_DTYPE_BF16, 3, H, R, V, 1);
            attn_tensor hq = cu_tensor(g ? qn.host : q.host, ATTN_DTYPE_BF16, 3, T, H, g ? N : R, 0);
            attn_tensor hp = cu_tensor(qpe.host, ATTN_DTYPE_BF16, 3, T, H, P, 0);
            attn_tensor ho = cu_tensor(cpu_out, ATTN_DTYPE_BF16, 3, T, H, W, 0);
            attn_tensor hc = cu_tensor(kv.host, ATTN_DTYPE_BF16, 3, NB, BS, D, 0);
            attn_tensor hk = cu_tensor(wuk.host, ATTN_DTYPE_BF16, 3, H, N, R, 0);
            attn_tensor hv = cu_tensor(wuv.host, ATTN_DTYPE_BF16, 3, H, R, V, 0);
            double rms = 0;
            if (g == 1 && nreq != 8) continue;
            if (round == 0) { /* capture once */
                attn_status st;
                EXPECT_EQ_INT(cg.begin(cg.stream, 2 /* relaxed */), 0);
                if (!g) { /* the backend declares single-token decodes: a prefill call is refused, unrecorded */
                    attn_tensor gqh = cu_tensor(qn.dev, ATTN_DTYPE_BF16, 3, 1, H, N + P, 1);
                    attn_tensor goh = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, 1, H, V, 1);
                    EXPECT_STATUS(attn_mla_forward_mha(gpu, mg, &gqh, &gc, &gk, &gv, &goh, NULL, cg.stream),
                                  ATTN_ERROR_UNSUPPORTED);
                    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "UNIFORM_SINGLE_TOKEN_DECODE") != NULL);
                }
                st = g ? attn_mla_forward(gpu, mg, &gq, &gp, NULL, NULL, &gc, &gk, &gv, &go, cg.stream)
                       : attn_mla_forward_mqa(gpu, mg, &gq, &gp, &gc, &go, NULL, cg.stream);
                EXPECT_OK(st);
                EXPECT_EQ_INT(cg.end(cg.stream, &graph[g]), 0);
                if (!graph[g] || cg.instantiate(&exec[g], graph[g], 0) != 0) {
                    attn_test_fail(__FILE__, __LINE__, "graph %d capture / instantiate failed", g);
                    bad++;
                    break;
                }
            }
            memset(out.host, 0xff, out.bytes);
            if (!cu_up(ctx, &out)) { bad++; break; }
            EXPECT_EQ_INT(cg.launch(exec[g], cg.stream), 0);
            EXPECT_EQ_INT(cg.sync(cg.stream), 0);
            if (g) EXPECT_OK(attn_mla_forward(cpu, mc, &hq, &hp, NULL, NULL, &hc, &hk, &hv, &ho, NULL));
            else EXPECT_OK(attn_mla_forward_mqa(cpu, mc, &hq, &hp, &hc, &ho, NULL, NULL));
            if (!cu_down(ctx, &out, gpu_out)) { bad++; break; }
            for (x = 0; x < T * H * W; x++) rms += (double)attn_bf16_to_f32(cpu_out[x]) * attn_bf16_to_f32(cpu_out[x]);
            rms = sqrt(rms / (T * H * W)) + 1e-6;
            for (x = 0; x < T * H * W && bad < 4; x++) {
                float a = attn_bf16_to_f32(cpu_out[x]), o = attn_bf16_to_f32(gpu_out[x]);
                if (!(fabs(a - o) <= 4e-2 * rms + 2e-2 * fabs(a))) {
                    attn_test_fail(__FILE__, __LINE__, "round %d %s out[%d]: cpu %g, graph replay %g (rms %g)", round,
                                   g ? "fused" : "mqa", x, a, o, rms);
                    bad++;
                }
            }
            for (x = T * H * W; x < MAXR * H * W && bad < 4 && !g; x++)
                if (gpu_out[x] != 0xffff) {
                    attn_test_fail(__FILE__, __LINE__, "round %d: out past the batch written at %d", round, x);
                    bad++;
                }
        }
    }
    EXPECT_EQ_INT(bad, 0);
done:
    for (x = 0; x < 2; x++) {
        if (exec[x]) cg.exec_destroy(exec[x]);
        if (graph[x]) cg.graph_destroy(graph[x]);
    }
    cu_graph_close(&cg);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &qpe); cu_buf_free(ctx, &qn); cu_buf_free(ctx, &kv);
    cu_buf_free(ctx, &out); cu_buf_free(ctx, &wuk); cu_buf_free(ctx, &wuv);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (cg.lib) dlclose(cg.lib);
}

/* Rows the MLA kernels cannot copy in 16-byte pieces are refused by name, before anything
   is written (outputs unchanged). */
ATTN_TEST(cuda_mla_unaligned_rows_refused) {
    enum { H = 16, R = 512, D = 576, BS = 64, NB = 4 };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *gpu = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b;
    cu_buf q, kv, out;
    int32_t qsl[2] = {0, 1}, seq[1] = {100}, bt[4] = {0, 1, 2, 3};
    static uint16_t after[H * (R + 4) + 64];
    int x, changed = 0;
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out);
    CU_SKIP_IF_NO_GPU(ctx);
    if (!cu_mla_sm90(ctx)) { attn_context_destroy(ctx); SKIP("CUDA_MLA_SM90 needs compute capability 9.0 and cuBLAS"); }
    d = cu_mla_desc(H, ATTN_DTYPE_BF16, ATTN_DEVICE_CUDA);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 4; md.num_blocks = NB;
    if (!gpu || attn_metadata_create(gpu, &md, &m) != ATTN_OK) goto done;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 4;
    b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 100;
    EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
    if (!cu_buf_make(ctx, &q, (size_t)H * D * 2 + 64) || !cu_buf_make(ctx, &kv, (size_t)NB * BS * D * 2 + 64) ||
        !cu_buf_make(ctx, &out, sizeof after)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, (size_t)H * D, 1.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, (size_t)NB * BS * D, 1.0f);
    memset(out.host, 0xff, out.bytes);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &kv) || !cu_up(ctx, &out)) goto done;
    {
        attn_tensor gq = cu_tensor((char *)q.dev + 2, ATTN_DTYPE_BF16, 3, 1, H, D, 1); /* 2 bytes off */
        attn_tensor gc = cu_tensor(kv.dev, ATTN_DTYPE_BF16, 3, NB, BS, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, 1, H, R, 1);
        EXPECT_STATUS(attn_mla_forward_mqa(gpu, m, &gq, NULL, &gc, &go, NULL, NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "q rows are not 16-byte aligned") != NULL);
        gq.data = q.dev;
        go.strides[0] = (int64_t)H * (R + 4); go.strides[1] = R + 4; go.strides[2] = 1; /* 8-byte head stride */
        EXPECT_STATUS(attn_mla_forward_mqa(gpu, m, &gq, NULL, &gc, &go, NULL, NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "out_latent rows are not 16-byte aligned") != NULL);
        go.strides[0] = (int64_t)H * R; go.strides[1] = R;
        gc.data = (char *)kv.dev + 2; /* a cache 2 bytes off (the buffer has 64 to spare): refused before any launch */
        EXPECT_STATUS(attn_mla_forward_mqa(gpu, m, &gq, NULL, &gc, &go, NULL, NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "kv_cache.data") != NULL &&
                    strstr(attn_context_last_error(ctx), "16-byte aligned") != NULL);
    }
    if (!cu_down(ctx, &out, after)) goto done;
    for (x = 0; x < (int)(sizeof after / 2); x++) changed |= after[x] != 0xffff;
    EXPECT_EQ_INT(changed, 0);
done:
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out);
    attn_metadata_destroy(m);
    attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
}

/* ---- cache writes from host slots: the CPU's bytes, and no wait on other streams --------- */

typedef int (*cu_fn_host_func)(void *, void (*)(void *), void *);
typedef int (*cu_fn_query)(void *);

static void cu_sleep_800ms(void *p) {
    struct timespec ts;
    (void)p;
    ts.tv_sec = 0;
    ts.tv_nsec = 800000000L;
    nanosleep(&ts, NULL);
}

static double cu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A side stream (g.stream) and a busy one: `busy` runs a host function of 800 ms when
   asked (cu_busy_start), so a call that waited for the device would wait that long. */
typedef struct cu_busy {
    cu_graph_api g;
    void *busy;
    cu_fn_host_func host_func;
    cu_fn_query query;
} cu_busy;

static int cu_busy_open(cu_busy *b) {
    void *f, *q;
    memset(b, 0, sizeof *b);
    if (cu_graph_open(&b->g) != 0) return 0;
    f = dlsym(b->g.lib, "cuLaunchHostFunc");
    q = dlsym(b->g.lib, "cuStreamQuery");
    memcpy(&b->host_func, &f, sizeof f);
    memcpy(&b->query, &q, sizeof q);
    return f && q && b->g.stream_create(&b->busy, 1) == 0;
}
static void cu_busy_close(cu_busy *b) {
    if (b->busy) { b->g.sync(b->busy); b->g.stream_destroy(b->busy); }
    cu_graph_close(&b->g);
}

/* Runs `write` (a cache write on the side stream) while the busy stream sleeps: the call
   must return within 200 ms, with the busy stream still busy. */
#define CU_WRITE_WHILE_BUSY(b, write)                                                           \
    do {                                                                                        \
        double t0_, t1_;                                                                        \
        EXPECT_EQ_INT((b)->host_func((b)->busy, cu_sleep_800ms, NULL), 0);                      \
        t0_ = cu_now_ms();                                                                      \
        EXPECT_OK(write);                                                                       \
        t1_ = cu_now_ms();                                                                      \
        if (t1_ - t0_ > 200.0)                                                                  \
            attn_test_fail(__FILE__, __LINE__, "the cache write took %.0f ms while another "    \
                           "stream was busy (allowed: < 200)", t1_ - t0_);                      \
        EXPECT_EQ_INT((b)->query((b)->busy), 600 /* CUDA_ERROR_NOT_READY: still busy */);       \
        EXPECT_EQ_INT((b)->g.sync((b)->g.stream), 0);                                           \
        EXPECT_EQ_INT((b)->g.sync((b)->busy), 0);                                               \
    } while (0)

typedef struct cu_write_case {
    attn_dtype dt, kv_dt;
    int kv_heads, head, pth;
} cu_write_case;

ATTN_TEST(cuda_cache_writes_match_cpu) {
    static const cu_write_case cases[] = {
        {ATTN_DTYPE_F16, ATTN_DTYPE_F16, 8, 128, 0},
        {ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3, 4, 64, 0},
        {ATTN_DTYPE_F16, ATTN_DTYPE_INT8, 2, 128, 1},
        {ATTN_DTYPE_F32, ATTN_DTYPE_F16, 1, 80, 0},
    };
    enum { NTOK = 1000, BLOCKS = 80, BS = 16 }; /* three launches of host slots */
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    cu_busy bz;
    int64_t slots[NTOK], perm[BLOCKS * BS];
    void *dslots = NULL;
    size_t c;
    int i;
    CU_SKIP_IF_NO_GPU(ctx);
    if (!cu_busy_open(&bz)) {
        EXPECT_TRUE(0);
        cu_busy_close(&bz);
        attn_context_destroy(ctx);
        return;
    }
    for (i = 0; i < BLOCKS * BS; i++) perm[i] = i;
    for (i = BLOCKS * BS - 1; i > 0; i--) {
        int j = (int)(cu_rand() % (unsigned)(i + 1));
        int64_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    for (i = 0; i < NTOK; i++) slots[i] = i % 7 == 3 ? -1 : perm[i];
    if (attn_cuda_malloc(ctx, sizeof slots, &dslots) != ATTN_OK ||
        attn_cuda_memcpy(ctx, dslots, slots, sizeof slots, ATTN_COPY_HOST_TO_DEVICE, NULL) != ATTN_OK)
        EXPECT_TRUE(0);
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const cu_write_case *w = &cases[c];
        attn_layer_desc d;
        attn_layer *cpu = NULL, *gpu = NULL;
        int64_t shape[ATTN_MAX_DIMS];
        int ndim = 0;
        size_t n = (size_t)NTOK * w->kv_heads * w->head, cbytes;
        cu_buf k, v, kv;
        void *ref = NULL;
        memset(&k, 0, sizeof k); memset(&v, 0, sizeof v); memset(&kv, 0, sizeof kv);
        memset(&d, 0, sizeof d);
        d.num_heads = w->kv_heads * 2; d.num_kv_heads = w->kv_heads; d.head_size = w->head;
        d.dtype = w->dt; d.kv_cache_dtype = w->kv_dt; d.block_size = BS;
        if (w->pth) d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
        else if (attn_test_is_8bit(w->kv_dt)) { d.k_scale.value = 1.0f / 64.0f; d.v_scale.value = 1.0f / 32.0f; }
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &cpu));
        d.device = ATTN_DEVICE_CUDA;
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
        if (!cpu || !gpu || attn_layer_kv_cache_shape(gpu, BLOCKS, shape, &ndim) != ATTN_OK) {
            EXPECT_TRUE(0);
        } else {
            attn_tensor hk, hv, hc, dk, dv, dc;
            for (cbytes = attn_dtype_size(w->kv_dt), i = 0; i < ndim; i++) cbytes *= (size_t)shape[i];
            ref = malloc(cbytes);
            if (ref && cu_buf_make(ctx, &k, n * attn_dtype_size(w->dt)) && cu_buf_make(ctx, &v, n * attn_dtype_size(w->dt)) &&
                cu_buf_make(ctx, &kv, cbytes)) {
                cu_fill(k.host, w->dt, n, 2.0f);
                cu_fill(v.host, w->dt, n, 2.0f);
                memset(kv.host, 0x5a, cbytes);
                memset(ref, 0x5a, cbytes);
                EXPECT_TRUE(cu_up(ctx, &k) && cu_up(ctx, &v) && cu_up(ctx, &kv));
                hk = cu_tensor(k.host, w->dt, 3, NTOK, w->kv_heads, w->head, 0);
                hv = cu_tensor(v.host, w->dt, 3, NTOK, w->kv_heads, w->head, 0);
                hc = attn_tensor_make(ref, w->kv_dt, ndim, shape);
                dk = cu_tensor(k.dev, w->dt, 3, NTOK, w->kv_heads, w->head, 1);
                dv = cu_tensor(v.dev, w->dt, 3, NTOK, w->kv_heads, w->head, 1);
                dc = attn_tensor_make(kv.dev, w->kv_dt, ndim, shape);
                dc.device.kind = ATTN_DEVICE_CUDA;
                EXPECT_OK(attn_reshape_and_cache(cpu, &hk, &hv, &hc, ATTN_TEST_SLOTS(slots, NTOK), NULL));
                CU_WRITE_WHILE_BUSY(&bz, attn_reshape_and_cache(gpu, &dk, &dv, &dc, ATTN_TEST_SLOTS(slots, NTOK), bz.g.stream));
                EXPECT_TRUE(cu_down(ctx, &kv, kv.host));
                if (memcmp(kv.host, ref, cbytes) != 0) {
                    size_t at = 0;
                    while (((unsigned char *)kv.host)[at] == ((unsigned char *)ref)[at]) at++;
                    attn_test_fail(__FILE__, __LINE__, "case %d: the GPU cache differs from the CPU's at byte %zu of %zu",
                                   (int)c, at, cbytes);
                }
                /* the same from device slots (one checked launch) */
                if (dslots) {
                    attn_tensor ds = attn_tensor_slots((const int64_t *)dslots, NTOK);
                    ds.device.kind = ATTN_DEVICE_CUDA;
                    memset(kv.host, 0x5a, cbytes);
                    EXPECT_TRUE(cu_up(ctx, &kv));
                    CU_WRITE_WHILE_BUSY(&bz, attn_reshape_and_cache(gpu, &dk, &dv, &dc, &ds, bz.g.stream));
                    EXPECT_TRUE(cu_down(ctx, &kv, kv.host));
                    if (memcmp(kv.host, ref, cbytes) != 0)
                        attn_test_fail(__FILE__, __LINE__, "case %d: the cache written from device slots differs from "
                                       "the CPU's", (int)c);
                }
            } else {
                EXPECT_TRUE(0);
            }
        }
        free(ref);
        cu_buf_free(ctx, &k); cu_buf_free(ctx, &v); cu_buf_free(ctx, &kv);
        attn_layer_destroy(cpu);
        attn_layer_destroy(gpu);
    }
    /* the MLA latent write: bf16 and an fp8 latent */
    for (c = 0; c < 2; c++) {
        attn_layer_desc d;
        attn_layer *cpu = NULL, *gpu = NULL;
        const size_t cbytes = (size_t)BLOCKS * BS * 576 * (c ? 1 : 2);
        cu_buf kc, kp, kv;
        void *ref = malloc(cbytes);
        memset(&kc, 0, sizeof kc); memset(&kp, 0, sizeof kp); memset(&kv, 0, sizeof kv);
        memset(&d, 0, sizeof d);
        d.num_heads = 16; d.head_size = 576; d.dtype = ATTN_DTYPE_BF16; d.use_mla = 1; d.block_size = BS;
        if (c) { d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3; d.k_scale.value = 1.0f / 32.0f; }
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &cpu));
        d.device = ATTN_DEVICE_CUDA;
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
        if (ref && cpu && gpu && cu_buf_make(ctx, &kc, (size_t)NTOK * 512 * 2) && cu_buf_make(ctx, &kp, (size_t)NTOK * 64 * 2) &&
            cu_buf_make(ctx, &kv, cbytes)) {
            attn_dtype cdt = c ? ATTN_DTYPE_FP8_E4M3 : ATTN_DTYPE_BF16;
            attn_tensor hkc = cu_tensor(kc.host, ATTN_DTYPE_BF16, 2, NTOK, 512, 0, 0);
            attn_tensor hkp = cu_tensor(kp.host, ATTN_DTYPE_BF16, 2, NTOK, 64, 0, 0);
            attn_tensor dkc = cu_tensor(kc.dev, ATTN_DTYPE_BF16, 2, NTOK, 512, 0, 1);
            attn_tensor dkp = cu_tensor(kp.dev, ATTN_DTYPE_BF16, 2, NTOK, 64, 0, 1);
            attn_tensor hc = cu_tensor(ref, cdt, 3, BLOCKS, BS, 576, 0), dc = cu_tensor(kv.dev, cdt, 3, BLOCKS, BS, 576, 1);
            cu_fill(kc.host, ATTN_DTYPE_BF16, (size_t)NTOK * 512, 2.0f);
            cu_fill(kp.host, ATTN_DTYPE_BF16, (size_t)NTOK * 64, 2.0f);
            memset(kv.host, 0x5a, cbytes);
            memset(ref, 0x5a, cbytes);
            EXPECT_TRUE(cu_up(ctx, &kc) && cu_up(ctx, &kp) && cu_up(ctx, &kv));
            EXPECT_OK(attn_concat_and_cache_mla(cpu, &hkc, &hkp, &hc, ATTN_TEST_SLOTS(slots, NTOK), NULL));
            CU_WRITE_WHILE_BUSY(&bz, attn_concat_and_cache_mla(gpu, &dkc, &dkp, &dc, ATTN_TEST_SLOTS(slots, NTOK), bz.g.stream));
            EXPECT_TRUE(cu_down(ctx, &kv, kv.host));
            EXPECT_TRUE(memcmp(kv.host, ref, cbytes) == 0);
            if (dslots) { /* from device slots */
                attn_tensor ds = attn_tensor_slots((const int64_t *)dslots, NTOK);
                ds.device.kind = ATTN_DEVICE_CUDA;
                memset(kv.host, 0x5a, cbytes);
                EXPECT_TRUE(cu_up(ctx, &kv));
                CU_WRITE_WHILE_BUSY(&bz, attn_concat_and_cache_mla(gpu, &dkc, &dkp, &dc, &ds, bz.g.stream));
                EXPECT_TRUE(cu_down(ctx, &kv, kv.host));
                EXPECT_TRUE(memcmp(kv.host, ref, cbytes) == 0);
            }
        } else {
            EXPECT_TRUE(0);
        }
        free(ref);
        cu_buf_free(ctx, &kc); cu_buf_free(ctx, &kp); cu_buf_free(ctx, &kv);
        attn_layer_destroy(cpu);
        attn_layer_destroy(gpu);
    }
    cu_busy_close(&bz);
    attn_cuda_free(ctx, dslots);
    attn_context_destroy(ctx);
}

/* ATTN_KERNEL_DEFINES (the tuning seam): a layer created while it is set compiles its decode
   tiles with those defines (2 stages instead of 3 here) and still matches the CPU; its record
   shows the value; a malformed value is one WARN, nothing applied, an empty record. */
ATTN_TEST(cuda_kernel_defines_env) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_test_env env = attn_test_env_save("ATTN_KERNEL_DEFINES");
    attn_layer_desc d;
    attn_layer *layer = NULL;
    int n, fails = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    setenv("ATTN_KERNEL_DEFINES", "decode.KV_STAGES=2 decode.KV_TILE=64", 1);
    memset(&d, 0, sizeof d);
    d.num_heads = 32; d.num_kv_heads = 8; d.head_size = 128; d.dtype = ATTN_DTYPE_BF16; d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (layer) EXPECT_TRUE(strcmp(attn_layer_selection(layer)->kernel_defines, "decode.KV_STAGES=2 decode.KV_TILE=64") == 0);
    attn_layer_destroy(layer);
    layer = NULL;
    for (n = 0; n < 6 && fails < 2; n++) { /* decodes and short prefills through the tuned tiles */
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = 32; c.kv_heads = 8; c.head = 128; c.dt = c.kv_dt = n % 2 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        c.block = 16; c.causal = 1; c.lse = n % 2 == 0;
        cu_random_reqs(&c, 20, 1500);
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    EXPECT_EQ_INT(fails, 0);
    setenv("ATTN_KERNEL_DEFINES", "decode.KV STAGES=2", 1);
    attn_test_log_reset(&log);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_ENV_INVALID, ATTN_LOG_LEVEL_WARN));
    if (layer) EXPECT_TRUE(attn_layer_selection(layer)->kernel_defines[0] == 0);
    attn_layer_destroy(layer);
    attn_test_env_restore(&env);
    attn_context_destroy(ctx);
}

void suite_cuda(void) {
    ATTN_RUN(cuda_selected_for_device_layers);
    ATTN_RUN(cuda_cascade_matches_cpu);
    ATTN_RUN(cuda_fp8_scale_pointer_device_checked);
    ATTN_RUN(cuda_forward_8bit_matches_cpu);
    ATTN_RUN(cuda_wide_heads_match_cpu);
    ATTN_RUN(cuda_fp8_bad_device_scale_writes_nothing);
    ATTN_RUN(cuda_fp8_graph_replays_new_scales);
    ATTN_RUN(cuda_forward_matches_cpu);
    ATTN_RUN(cuda_kernel_defines_env);
    ATTN_RUN(cuda_host_tensor_refused);
    ATTN_RUN(cuda_cache_writes_match_cpu);
    ATTN_RUN(cuda_merge_matches_cpu);
    ATTN_RUN(cuda_layers_share_compiled_variants);
    ATTN_RUN(cuda_graph_replays_after_new_builds);
    ATTN_RUN(cuda_graph_cache_write_from_device_slots);
    ATTN_RUN(cuda_batch_invariant_rows);
    ATTN_RUN(cuda_metadata_of_other_kernels_refused);
    ATTN_RUN(cuda_kernel_cache_faults_survived);
    ATTN_RUN(cuda_threads_create_one_layer_compile_once);
    ATTN_RUN(cuda_stream_of_another_context_refused);
    ATTN_RUN(cuda_mla_selected_for_device_layers);
    ATTN_RUN(cuda_mla_graph_replays_after_new_builds);
    ATTN_RUN(cuda_mla_unaligned_rows_refused);
}
