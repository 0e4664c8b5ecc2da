/* The CPU inner loops' SIMD variants (issue 37): c, avx2 and avx512, chosen at
   attn_context_create from the CPU, or forced by env ATTN_CPU_SIMD.

   This file holds a private copy of the library (ATTN_STATIC) compiled with
   ATTN_SIMD_DISPATCH, so that every variant is in it whatever the build's flags (the other
   test files keep the build's own choice: -march=native on an AVX-512 machine compiles
   avx512 alone); only ATTN_NO_SIMD leaves it the plain-C variant. Variants are forced the
   way a user forces them, through ATTN_CPU_SIMD, and each is used only where the record
   says it runs (platform.cpu_simd), so a CPU without AVX-512 tests what it has.

   What "the same results" means here:
   - exactly equal: the row conversions every variant has (f16, bf16, fp8 e4m3/e5m2, int8
     -> f32; f32 -> f16 and bf16, round to nearest even). Each is exact in every variant.
   - within a tight bound: attention outputs and LSEs against the c variant. The variants
     add the same products in another order (8 or 16 lanes, their horizontal sums), fuse
     multiply and add (FMA: one rounding instead of two; the c variant also evaluates its
     exp2 polynomial without FMA) and, at head sizes that are not a multiple of 16, the
     AVX-512 decode takes the gather path where the others read the cache directly. So
     results differ by f32 rounding only: each output within 2^-18 (1 + |value|) of the
     reference (outputs are averages of |v| <= 1) and each LSE within 2^-18 (1 + |lse|); a
     16-bit output may then round to the neighbouring 16-bit value, so one unit in its last
     place is allowed on top. Measured on an AVX-512 machine: f32 outputs differ by at most
     1.8e-7, 16-bit ones by one unit in the last place. The bound is far below what a
     kernel error gives: one key dropped of the ~1000 a row sees moves an f32 output by
     ~1e-3 (ATTN_TEST_SIMD_DEBUG=1 prints each case's largest differences). */
#define _POSIX_C_SOURCE 200809L
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic ignored "-Wunused-function" /* the private copy's unused functions */
#endif
#define ATTN_STATIC
#define ATTN_SIMD_DISPATCH
#define ATTN_IMPLEMENTATION
#include "attn.h"
#include "attn_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const simd_names[3] = {"c", "avx2", "avx512"};

/* ---- contexts with a forced variant ----------------------------------------------------- */

typedef struct simd_log {
    int warn_env;  /* ATTN_LOG_ENV_INVALID at WARN */
    int warns;     /* any WARN or ERROR */
} simd_log;

static void simd_hook(void *user, attn_log_level level, attn_log_item item, const char *message) {
    simd_log *l = (simd_log *)user;
    (void)message;
    if (!l) return;
    if (level == ATTN_LOG_LEVEL_WARN && item == ATTN_LOG_ENV_INVALID) l->warn_env++;
    if (level == ATTN_LOG_LEVEL_WARN || level == ATTN_LOG_LEVEL_ERROR) l->warns++;
}

/* A context created with ATTN_CPU_SIMD=value (NULL: unset); the variable is put back. */
static attn_context *simd_context(const char *value, simd_log *log, attn_platform *plat) {
    attn_context_desc cd;
    attn_context *ctx = NULL;
    const char *old = getenv("ATTN_CPU_SIMD");
    char *saved = old ? strcpy((char *)malloc(strlen(old) + 1), old) : NULL;
    if (value) setenv("ATTN_CPU_SIMD", value, 1);
    else unsetenv("ATTN_CPU_SIMD");
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    cd.log = simd_hook;
    cd.log_user_data = log;
    cd.log_level = ATTN_LOG_LEVEL_WARN;
    EXPECT_OK(attn_context_create(&cd, &ctx));
    if (saved) setenv("ATTN_CPU_SIMD", saved, 1);
    else unsetenv("ATTN_CPU_SIMD");
    free(saved);
    if (ctx && plat) EXPECT_OK(attn_platform_get(ctx, plat));
    return ctx;
}

/* Which variants run here: forced one at a time, the record names the one that runs. */
static int simd_available(int runs[3]) {
    int v, n = 0;
    for (v = 0; v < 3; v++) {
        attn_platform p;
        attn_context *ctx = simd_context(simd_names[v], NULL, &p);
        runs[v] = ctx && strcmp(p.cpu_simd, simd_names[v]) == 0;
        n += runs[v];
        attn_context_destroy(ctx);
    }
    return n;
}

static double simd_scale(void) {
    const char *s = getenv("ATTN_TEST_SCALE");
    double v = s ? atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}
static int simd_scaled(int n, int min) {
    int v = (int)(n * simd_scale());
    return v < min ? min : v;
}

/* Deterministic values in [-1, 1) from an index (so the same slot always holds the same
   key, whichever request writes it). */
static float simd_value(uint64_t seed, uint64_t i) {
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x ^= x >> 31; x *= 0xbf58476d1ce4e5b9ull; x ^= x >> 27; x *= 0x94d049bb133111ebull; x ^= x >> 31;
    return (float)((double)(x >> 40) / (double)(1u << 23) - 1.0);
}

static void simd_put(void *p, attn_dtype dt, size_t i, float x) {
    if (dt == ATTN_DTYPE_F32) ((float *)p)[i] = x;
    else if (dt == ATTN_DTYPE_BF16) ((uint16_t *)p)[i] = attn_f32_to_bf16(x);
    else ((uint16_t *)p)[i] = attn_f32_to_f16(x);
}
static float simd_get(const void *p, attn_dtype dt, size_t i) {
    if (dt == ATTN_DTYPE_F32) return ((const float *)p)[i];
    if (dt == ATTN_DTYPE_BF16) return attn_bf16_to_f32(((const uint16_t *)p)[i]);
    return attn_f16_to_f32(((const uint16_t *)p)[i]);
}
static attn_tensor simd_t3(void *p, attn_dtype dt, int64_t a, int64_t b, int64_t c) {
    int64_t s[3];
    s[0] = a; s[1] = b; s[2] = c;
    return attn_tensor_make(p, dt, 3, s);
}
static attn_tensor simd_t2(void *p, attn_dtype dt, int64_t a, int64_t b) {
    int64_t s[2];
    s[0] = a; s[1] = b;
    return attn_tensor_make(p, dt, 2, s);
}

/* ---- one batch, run under one variant ------------------------------------------------------ */

enum { SIMD_STD, SIMD_MLA_MQA_MHA, SIMD_MLA_FUSED, SIMD_MLA_SPARSE };
#define SIMD_MAX_REQS 6

typedef struct simd_case {
    const char *name;
    int kind;                    /* SIMD_STD: attn_layer_forward; else the MLA calls */
    int H, HK, D;                /* standard layers (MLA: H; 576 = 512 + 64, one latent head) */
    attn_dtype dt, kvdt;
    int per_token_head, soft_cap, window, alibi, sinks, non_causal, prefix_blocks;
    int nreq, qlen[SIMD_MAX_REQS], slen[SIMD_MAX_REQS]; /* context lengths scaled, >= qlen */
} simd_case;

typedef struct simd_result {
    float *out, *lse;            /* outputs as f32, in the order the calls write them */
    size_t n_out, n_lse;
    attn_dtype out_dtype;
} simd_result;

static void simd_result_free(simd_result *r) { free(r->out); free(r->lse); memset(r, 0, sizeof *r); }

/* Runs the case on ctx; 0 on a failure (already reported). */
static int simd_run(attn_context *ctx, const simd_case *c, simd_result *res) {
    const int bs = 16, mla = c->kind != SIMD_STD;
    const int H = c->H, HK = mla ? 1 : c->HK, D = mla ? 576 : c->D, R = 512, P = 64, N = 128, V = 128;
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch b;
    int32_t qsl[SIMD_MAX_REQS + 1], sl[SIMD_MAX_REQS], *bt = NULL;
    int64_t shape[ATTN_MAX_DIMS], *slots = NULL;
    int ndim = 0, i, t, h, x, ntok, stride = 0, prefix = c->prefix_blocks * bs, nblocks, maxq = 0, maxs = 0, ok = 0;
    int num_dec = 0, dec_tok = 0, failed0 = attn_test_current_failed();
    float *alibi = NULL, *sinks = NULL;
    void *cache = NULL, *q = NULL, *out = NULL, *wk = NULL, *wv = NULL, *qpe = NULL, *kvc = NULL, *kpe = NULL;
    int32_t *idx = NULL;
    float *lse = NULL;
    size_t cache_bytes, esz = attn_dtype_size(c->dt);
    const int topk = 48;

    memset(res, 0, sizeof *res);
    qsl[0] = 0;
    for (i = 0; i < c->nreq; i++) {
        sl[i] = ATTN__MAX(c->qlen[i] + prefix, simd_scaled(c->slen[i], c->qlen[i] + prefix + 1));
        qsl[i + 1] = qsl[i] + c->qlen[i];
        stride = ATTN__MAX(stride, (sl[i] + bs - 1) / bs);
        maxq = ATTN__MAX(maxq, c->qlen[i]);
        maxs = ATTN__MAX(maxs, sl[i]);
        if (c->qlen[i] <= 1 && i == num_dec) { num_dec++; dec_tok += c->qlen[i]; }
    }
    ntok = qsl[c->nreq];
    nblocks = c->prefix_blocks + c->nreq * stride;
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HK; d.head_size = D; d.block_size = bs;
    d.dtype = c->dt; d.kv_cache_dtype = c->kvdt;
    d.causal = c->non_causal ? ATTN_CAUSAL_NO : ATTN_CAUSAL_YES;
    if ((c->kvdt == ATTN_DTYPE_FP8_E4M3 || c->kvdt == ATTN_DTYPE_FP8_E5M2) && !c->per_token_head) { d.k_scale.value = 0.5f; d.v_scale.value = 0.25f; }
    if (c->per_token_head) d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
    if (c->soft_cap) d.logits_soft_cap = 8.0f;
    if (c->window) d.sliding_window = 200;
    if (c->alibi) {
        alibi = (float *)malloc((size_t)H * sizeof(float));
        for (h = 0; h < H; h++) alibi[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)H);
        d.alibi_slopes = alibi;
    }
    if (c->sinks) {
        sinks = (float *)malloc((size_t)H * sizeof(float));
        for (h = 0; h < H; h++) sinks[h] = 2.0f * simd_value(77, (uint64_t)h);
        d.sinks = sinks;
    }
    if (mla) {
        d.use_mla = 1; d.kv_lora_rank = R; d.qk_rope_head_dim = P; d.qk_nope_head_dim = N; d.v_head_dim = V;
    }
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (!layer) goto done;

    /* blocks: the shared prefix's, then each request's own, in a scattered order */
    bt = (int32_t *)calloc((size_t)c->nreq * (size_t)stride, sizeof(int32_t));
    for (i = 0; i < c->nreq; i++)
        for (x = 0; x < stride; x++)
            bt[i * stride + x] = x < c->prefix_blocks ? x
                                 : c->prefix_blocks + (int)(((int64_t)(i * stride + x) * 7 + 3) % (c->nreq * stride));
    EXPECT_OK(attn_layer_kv_cache_shape(layer, nblocks, shape, &ndim));
    {
        attn_tensor probe = attn_tensor_make(NULL, c->kvdt, ndim, shape);
        cache_bytes = attn_tensor_nbytes(&probe);
    }
    cache = calloc(cache_bytes, 1);

    /* the cache: every request's whole sequence, each slot's values a function of the slot */
    {
        int64_t total = 0;
        for (i = 0; i < c->nreq; i++) total += sl[i];
        slots = (int64_t *)malloc((size_t)total * sizeof(int64_t));
        total = 0;
        for (i = 0; i < c->nreq; i++)
            for (t = 0; t < sl[i]; t++) slots[total++] = (int64_t)bt[i * stride + t / bs] * bs + t % bs;
        if (!mla) {
            void *kk = malloc((size_t)total * (size_t)HK * (size_t)D * esz), *vv = malloc((size_t)total * (size_t)HK * (size_t)D * esz);
            attn_tensor tk = simd_t3(kk, c->dt, total, HK, D), tv = simd_t3(vv, c->dt, total, HK, D);
            attn_tensor ts = attn_tensor_slots(slots, total), tcache = attn_tensor_make(cache, c->kvdt, ndim, shape);
            size_t e;
            for (e = 0; e < (size_t)total * (size_t)HK * (size_t)D; e++) {
                uint64_t slot = (uint64_t)slots[e / ((size_t)HK * (size_t)D)];
                uint64_t k = slot * (uint64_t)HK * (uint64_t)D + e % ((size_t)HK * (size_t)D);
                simd_put(kk, c->dt, e, simd_value(1, k));
                simd_put(vv, c->dt, e, simd_value(2, k));
            }
            EXPECT_OK(attn_reshape_and_cache(layer, &tk, &tv, &tcache, &ts, NULL));
            free(kk); free(vv);
        } else {
            attn_tensor tc, tp, ts = attn_tensor_slots(slots, total), tcache = attn_tensor_make(cache, c->kvdt, ndim, shape);
            size_t e;
            kvc = malloc((size_t)total * (size_t)R * esz);
            kpe = malloc((size_t)total * (size_t)P * esz);
            for (e = 0; e < (size_t)total * (size_t)R; e++)
                simd_put(kvc, c->dt, e, simd_value(3, (uint64_t)slots[e / (size_t)R] * (uint64_t)R + e % (size_t)R));
            for (e = 0; e < (size_t)total * (size_t)P; e++)
                simd_put(kpe, c->dt, e, simd_value(4, (uint64_t)slots[e / (size_t)P] * (uint64_t)P + e % (size_t)P));
            tc = simd_t2(kvc, c->dt, total, R);
            tp = simd_t2(kpe, c->dt, total, P);
            EXPECT_OK(attn_concat_and_cache_mla(layer, &tc, &tp, &tcache, &ts, NULL));
            free(kvc); free(kpe);
            kvc = kpe = NULL;
        }
        free(slots);
        slots = NULL;
    }

    memset(&md, 0, sizeof md);
    md.max_num_reqs = c->nreq;
    md.max_num_tokens = ntok;
    md.max_blocks_per_req = stride;
    md.num_blocks = nblocks;
    md.decode_threshold = 1;
    EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    if (!meta) goto done;
    slots = (int64_t *)malloc((size_t)ntok * sizeof(int64_t));
    for (i = 0; i < ntok; i++) slots[i] = -1; /* k/v are cached already */
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = sl; b.block_table = bt; b.block_table_stride = stride;
    b.slot_mapping = slots; b.num_reqs = c->nreq; b.num_actual_tokens = ntok; b.max_query_len = maxq;
    b.max_seq_len = maxs; b.causal = d.causal;
    EXPECT_OK(attn_metadata_build(meta, prefix, &b, 0));

    {
        attn_tensor tcache = attn_tensor_make(cache, c->kvdt, ndim, shape);
        const int qd = c->kind == SIMD_MLA_FUSED ? N : D, od = c->kind == SIMD_STD ? D : c->kind == SIMD_MLA_FUSED ? V : R;
        size_t e;
        res->out_dtype = c->dt;
        q = malloc((size_t)ntok * (size_t)H * (size_t)qd * esz);
        for (e = 0; e < (size_t)ntok * (size_t)H * (size_t)qd; e++) simd_put(q, c->dt, e, simd_value(5, e));
        res->n_out = (size_t)ntok * (size_t)H * (size_t)od;
        res->n_lse = c->kind == SIMD_MLA_FUSED ? 0 : (size_t)ntok * (size_t)H;
        out = malloc(res->n_out * esz + 1);
        lse = (float *)malloc(res->n_lse * sizeof(float) + 1);
        if (c->kind == SIMD_STD) {
            attn_tensor tq = simd_t3(q, c->dt, ntok, H, D), to = simd_t3(out, c->dt, ntok, H, D);
            attn_tensor tl = simd_t2(lse, ATTN_DTYPE_F32, ntok, H);
            EXPECT_OK(attn_layer_forward(layer, meta, &tq, NULL, NULL, &tcache, &to, &tl, NULL));
        } else if (c->kind == SIMD_MLA_SPARSE) {
            attn_tensor tq = simd_t3(q, c->dt, ntok, H, D), to = simd_t3(out, c->dt, ntok, H, R);
            attn_tensor tl = simd_t2(lse, ATTN_DTYPE_F32, ntok, H), ti;
            idx = (int32_t *)malloc((size_t)ntok * topk * sizeof(int32_t));
            for (i = 0; i < c->nreq; i++)
                for (t = qsl[i]; t < qsl[i + 1]; t++)
                    for (x = 0; x < topk; x++) {
                        float u = simd_value(6, (uint64_t)t * topk + (uint64_t)x);
                        idx[t * topk + x] = u < -0.8f ? -1 : (int)((u + 1.0f) * 0.5f * (float)sl[i]) % sl[i];
                    }
            ti = simd_t2(idx, ATTN_DTYPE_INT32, ntok, topk);
            EXPECT_OK(attn_mla_forward_sparse(layer, meta, &tq, NULL, &tcache, &ti, &to, &tl, NULL));
        } else {
            int64_t s3[3];
            attn_tensor tuk, tuv;
            wk = malloc((size_t)H * (size_t)N * (size_t)R * esz);
            wv = malloc((size_t)H * (size_t)R * (size_t)V * esz);
            for (e = 0; e < (size_t)H * (size_t)N * (size_t)R; e++) simd_put(wk, c->dt, e, 0.1f * simd_value(7, e));
            for (e = 0; e < (size_t)H * (size_t)R * (size_t)V; e++) simd_put(wv, c->dt, e, 0.1f * simd_value(8, e));
            s3[0] = H; s3[1] = N; s3[2] = R;
            tuk = attn_tensor_make(wk, c->dt, 3, s3);
            s3[1] = R; s3[2] = V;
            tuv = attn_tensor_make(wv, c->dt, 3, s3);
            if (c->kind == SIMD_MLA_FUSED) {
                attn_tensor tqn = simd_t3(q, c->dt, ntok, H, N), tqp, to = simd_t3(out, c->dt, ntok, H, V);
                qpe = malloc((size_t)ntok * (size_t)H * (size_t)P * esz);
                for (e = 0; e < (size_t)ntok * (size_t)H * (size_t)P; e++) simd_put(qpe, c->dt, e, simd_value(9, e));
                tqp = simd_t3(qpe, c->dt, ntok, H, P);
                EXPECT_OK(attn_mla_forward(layer, meta, &tqn, &tqp, NULL, NULL, &tcache, &tuk, &tuv, &to, NULL));
            } else { /* decodes absorbed (rows [0, dec_tok)), prefills up-projected (rows past them) */
                if (dec_tok) {
                    attn_tensor tq = simd_t3(q, c->dt, dec_tok, H, D), to = simd_t3(out, c->dt, dec_tok, H, R);
                    attn_tensor tl = simd_t2(lse, ATTN_DTYPE_F32, dec_tok, H);
                    EXPECT_OK(attn_mla_forward_mqa(layer, meta, &tq, NULL, &tcache, &to, &tl, NULL));
                }
                if (ntok > dec_tok) { /* q rows of width nope + rope = 192 after the decode rows */
                    char *qp = (char *)q + (size_t)dec_tok * (size_t)H * (size_t)D * esz;
                    char *op = (char *)out + (size_t)dec_tok * (size_t)H * (size_t)R * esz;
                    attn_tensor tq = simd_t3(qp, c->dt, ntok - dec_tok, H, N + P), to = simd_t3(op, c->dt, ntok - dec_tok, H, V);
                    attn_tensor tl = simd_t2(lse + (size_t)dec_tok * (size_t)H, ATTN_DTYPE_F32, ntok - dec_tok, H);
                    EXPECT_OK(attn_mla_forward_mha(layer, meta, &tq, &tcache, &tuk, &tuv, &to, &tl, NULL));
                    /* the compared elements: the mha rows are V wide */
                    res->n_out = (size_t)dec_tok * (size_t)H * (size_t)R + (size_t)(ntok - dec_tok) * (size_t)H * (size_t)V;
                }
            }
        }
        res->out = (float *)malloc(res->n_out * sizeof(float) + 1);
        res->lse = (float *)malloc(res->n_lse * sizeof(float) + 1);
        for (e = 0; e < res->n_out; e++) res->out[e] = simd_get(out, c->dt, e);
        if (res->n_lse) memcpy(res->lse, lse, res->n_lse * sizeof(float));
        ok = attn_test_current_failed() == failed0;
    }
done:
    free(alibi); free(sinks); free(bt); free(cache); free(slots); free(q); free(out); free(lse);
    free(wk); free(wv); free(qpe); free(idx);
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    return ok;
}

/* One unit in the last place of x in dt (the gap above |x|); 0 for f32 outputs. */
static double simd_ulp(attn_dtype dt, double x) {
    int e;
    if (dt == ATTN_DTYPE_F32) return 0.0;
    frexp(fabs(x), &e);
    if (dt == ATTN_DTYPE_BF16) return ldexp(1.0, ATTN__MAX(e, -125) - 8);
    return ldexp(1.0, ATTN__MAX(e, -13) - 11); /* f16: 10 stored bits, subnormals below 2^-14 */
}

/* Elements of got outside the bound of the file's comment around ref (reports the first). */
static int simd_compare(const simd_case *c, const char *variant, const simd_result *got, const simd_result *ref) {
    const double tol = ldexp(1.0, -18);
    size_t e;
    int bad = 0;
    double worst = 0.0, worst_lse = 0.0;
    for (e = 0; e < ref->n_out; e++) {
        double a = got->out[e], r = ref->out[e], diff = fabs(a - r);
        double bound = tol * (1.0 + fabs(r)) + simd_ulp(ref->out_dtype, r);
        if (diff > worst) worst = diff;
        if (!(diff <= bound) && !(a != a && r != r)) {
            if (!bad)
                attn_test_fail(__FILE__, __LINE__, "%s, %s: out[%zu] = %.9g, c variant %.9g (bound %.3g)", c->name,
                               variant, e, a, r, bound);
            bad++;
        }
    }
    for (e = 0; e < ref->n_lse; e++) {
        double a = got->lse[e], r = ref->lse[e];
        if (fabs(a - r) > worst_lse) worst_lse = fabs(a - r);
        if (!attn_test_near(a, r, tol, tol) && !(a == r) && !(a != a && r != r)) {
            if (!bad)
                attn_test_fail(__FILE__, __LINE__, "%s, %s: lse[%zu] = %.9g, c variant %.9g", c->name, variant, e, a, r);
            bad++;
        }
    }
    if (getenv("ATTN_TEST_SIMD_DEBUG"))
        printf("  %s %s: %zu outputs, largest difference %.3g (lse %.3g)\n", c->name, variant, ref->n_out, worst,
               worst_lse);
    return bad;
}

/* The cases: decodes (the direct kernels, split-KV), prefills with context (the gather
   path), every cache type, masks and sinks, cascade; MLA's absorbed decode, up-projected
   prefill, fused call and sparse call. */
static const simd_case simd_cases[] = {
    {"decode f16", SIMD_STD, 32, 8, 128, ATTN_DTYPE_F16, ATTN_DTYPE_F16, 0, 0, 0, 0, 0, 0, 0,
     4, {1, 1, 1, 1}, {1, 300, 1500, 4097}},
    {"decode bf16 GQA 6", SIMD_STD, 12, 2, 64, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0,
     3, {1, 1, 2}, {777, 64, 1200}},
    {"decode f32, head 96", SIMD_STD, 8, 8, 96, ATTN_DTYPE_F32, ATTN_DTYPE_F32, 0, 0, 0, 0, 0, 0, 0,
     2, {1, 1}, {1100, 33}},
    {"decode f32 q, f16 cache, head 72", SIMD_STD, 8, 2, 72, ATTN_DTYPE_F32, ATTN_DTYPE_F16, 0, 0, 0, 0, 0, 0, 0,
     2, {1, 1}, {900, 17}},
    {"decode fp8 e4m3", SIMD_STD, 16, 4, 128, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3, 0, 0, 0, 0, 0, 0, 0,
     3, {1, 1, 1}, {2000, 128, 555}},
    {"decode fp8 e5m2", SIMD_STD, 16, 4, 128, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E5M2, 0, 0, 0, 0, 0, 0, 0,
     2, {1, 1}, {1700, 80}},
    {"decode int8 per token-head", SIMD_STD, 16, 4, 128, ATTN_DTYPE_F16, ATTN_DTYPE_INT8, 1, 0, 0, 0, 0, 0, 0,
     3, {1, 1, 1}, {1300, 40, 2500}},
    {"prefill e4m3 per token-head", SIMD_STD, 8, 2, 64, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, 1, 0, 0, 0, 0, 0, 0,
     2, {37, 1}, {300, 260}},
    {"prefill f16 mixed batch", SIMD_STD, 16, 4, 128, ATTN_DTYPE_F16, ATTN_DTYPE_F16, 0, 0, 0, 0, 0, 0, 0,
     4, {1, 70, 33, 1}, {500, 70, 400, 90}},
    {"prefill bf16 soft cap, window, ALiBi, sinks", SIMD_STD, 8, 4, 128, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, 0, 1, 1, 1, 1,
     0, 0, 3, {20, 1, 45}, {420, 333, 45}},
    {"prefill f32 non-causal", SIMD_STD, 4, 2, 256, ATTN_DTYPE_F32, ATTN_DTYPE_F32, 0, 0, 0, 0, 0, 1, 0,
     2, {24, 9}, {100, 9}},
    {"decode f16 cascade", SIMD_STD, 16, 2, 128, ATTN_DTYPE_F16, ATTN_DTYPE_F16, 0, 0, 0, 0, 0, 0, 8,
     5, {1, 1, 1, 1, 1}, {300, 200, 500, 129, 1000}},
    {"MLA decode + prefill bf16", SIMD_MLA_MQA_MHA, 16, 1, 576, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0,
     3, {1, 1, 40}, {700, 65, 200}},
    {"MLA decode fp8 latent", SIMD_MLA_MQA_MHA, 16, 1, 576, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, 0, 0, 0, 0, 0, 0, 0,
     2, {1, 1}, {1500, 100}},
    {"MLA fused f16", SIMD_MLA_FUSED, 16, 1, 576, ATTN_DTYPE_F16, ATTN_DTYPE_F16, 0, 0, 0, 0, 0, 0, 0,
     3, {1, 1, 24}, {300, 50, 130}},
    {"MLA sparse bf16", SIMD_MLA_SPARSE, 16, 1, 576, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 0,
     3, {1, 1, 5}, {400, 90, 300}},
};

/* Every variant this CPU runs gives the c variant's results on every case (the bound above). */
ATTN_TEST(test_simd_variants_agree) {
    int runs[3], v, k;
    char skip[96];
    if (simd_available(runs) < 2 || !runs[0]) {
        attn__fmt(skip, sizeof skip, "one variant here (%s): nothing to compare",
                  runs[2] ? "avx512" : runs[1] ? "avx2" : "c");
        SKIP(skip);
    }
    for (k = 0; k < (int)(sizeof simd_cases / sizeof simd_cases[0]); k++) {
        const simd_case *c = &simd_cases[k];
        simd_result ref;
        attn_context *ctx = simd_context("c", NULL, NULL);
        memset(&ref, 0, sizeof ref);
        int ok = ctx && simd_run(ctx, c, &ref);
        attn_context_destroy(ctx);
        if (!ok) { simd_result_free(&ref); continue; }
        for (v = 1; v < 3; v++) {
            simd_result got;
            if (!runs[v]) continue;
            memset(&got, 0, sizeof got);
            ctx = simd_context(simd_names[v], NULL, NULL);
            if (ctx && simd_run(ctx, c, &got)) simd_compare(c, simd_names[v], &got, &ref);
            simd_result_free(&got);
            attn_context_destroy(ctx);
        }
        simd_result_free(&ref);
    }
}

/* The record: platform.cpu_simd names the variant that runs and cpu_simd_reason why; a
   forced variant runs (no WARN); one that is not compiled in or that the CPU cannot run,
   and a name that is no variant, are one WARN each (ATTN_LOG_ENV_INVALID) and the automatic
   choice runs; automatic is the widest variant that runs (ATTN_NO_SIMD: the only one). */
ATTN_TEST(test_simd_record_names_variant) {
    int runs[3], v, widest = 0;
    attn_platform p, pa;
    simd_log log;
    attn_context *ctx;
    char text[4096];
    simd_available(runs);
    for (v = 0; v < 3; v++)
        if (runs[v]) widest = v;
    memset(&log, 0, sizeof log);
    ctx = simd_context(NULL, &log, &pa);
    REQUIRE(ctx != NULL);
    EXPECT_TRUE(strcmp(pa.cpu_simd, simd_names[widest]) == 0);
#if ATTN__SIMD_DISPATCH
    EXPECT_TRUE(strstr(pa.cpu_simd_reason, "the widest variant this CPU runs") != NULL);
#else
    EXPECT_TRUE(strstr(pa.cpu_simd_reason, "the only variant compiled in") != NULL);
#endif
    EXPECT_TRUE(strstr(pa.cpu_simd_reason, "compiled: ") != NULL);
    EXPECT_EQ_INT(log.warns, 0);
    attn_platform_format(&pa, text, sizeof text);
    EXPECT_TRUE(strstr(text, "  cpu_simd: ") != NULL && strstr(text, "  cpu_simd_reason: ") != NULL);
    attn_context_destroy(ctx);
    for (v = 0; v < 3; v++) {
        memset(&log, 0, sizeof log);
        ctx = simd_context(simd_names[v], &log, &p);
        REQUIRE(ctx != NULL);
        if (runs[v]) {
            EXPECT_TRUE(strcmp(p.cpu_simd, simd_names[v]) == 0);
            EXPECT_TRUE(strstr(p.cpu_simd_reason, "forced by ATTN_CPU_SIMD") != NULL);
            EXPECT_EQ_INT(log.warns, 0);
        } else { /* not compiled in (ATTN_NO_SIMD) or not on this CPU */
            EXPECT_TRUE(strcmp(p.cpu_simd, pa.cpu_simd) == 0);
            EXPECT_TRUE(strstr(p.cpu_simd_reason, "ATTN_CPU_SIMD") != NULL);
            EXPECT_EQ_INT(log.warn_env, 1);
        }
        attn_context_destroy(ctx);
    }
    memset(&log, 0, sizeof log);
    ctx = simd_context("sse9", &log, &p); /* no such variant: the automatic choice */
    REQUIRE(ctx != NULL);
    EXPECT_EQ_INT(log.warn_env, 1);
    EXPECT_TRUE(strcmp(p.cpu_simd, pa.cpu_simd) == 0);
    attn_context_destroy(ctx);
    memset(&log, 0, sizeof log);
    ctx = simd_context("AUTO", &log, &p); /* the default, said explicitly */
    REQUIRE(ctx != NULL);
    EXPECT_EQ_INT(log.warns, 0);
    EXPECT_TRUE(strcmp(p.cpu_simd, pa.cpu_simd) == 0);
    attn_context_destroy(ctx);
}

/* Every compiled variant's row conversions, vector loop and scalar tail, bit for bit against
   the scalar conversions: every 8-bit code, f16 and bf16 bit patterns of every exponent,
   and f32 -> f16 / bf16 rounding (ties, subnormals, overflow to inf; NaN stays NaN). */
ATTN_TEST(test_simd_row_conversions_exact) {
    enum { N = 1024 + 13 };
    static uint8_t codes[N];
    static uint16_t h16[N], got16[N];
    static float f[N], got[N];
    int v, i, n;
    for (i = 0; i < N; i++) {
        codes[i] = (uint8_t)(i * 37 + 11);
        h16[i] = (uint16_t)(i * 0x9e37u + 0x1234u);
        f[i] = i % 7 == 0 ? ldexpf(1.0f + (float)i / 2048.0f, i % 50 - 30) /* ties and subnormals of f16 */
                          : (float)ldexp((double)simd_value(11, (uint64_t)i), (i % 40) - 20);
    }
    f[3] = 65520.0f; f[4] = -70000.0f; f[5] = NAN; f[6] = INFINITY; f[8] = 1.0f + 1.0f / 2048.0f; /* f16 tie */
    for (v = 0; v < 3; v++) {
        const attn__cpu_kernels *k = attn__cpu_variants[v];
        static const attn_dtype types[5] = {ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2, ATTN_DTYPE_INT8, ATTN_DTYPE_F16,
                                            ATTN_DTYPE_BF16};
        int t;
        if (!k) continue;
        for (t = 0; t < 5; t++)
            for (n = N; n >= N - 20; n -= 7) { /* lengths with and without a scalar tail */
                const void *src = t < 3 ? (const void *)codes : (const void *)h16;
                k->load_row(src, types[t], got, n);
                for (i = 0; i < n; i++) {
                    float want = types[t] == ATTN_DTYPE_FP8_E4M3   ? attn_fp8_e4m3_to_f32(codes[i])
                                 : types[t] == ATTN_DTYPE_FP8_E5M2 ? attn_fp8_e5m2_to_f32(codes[i])
                                 : types[t] == ATTN_DTYPE_INT8     ? (float)(int8_t)codes[i]
                                 : types[t] == ATTN_DTYPE_F16      ? attn_f16_to_f32(h16[i])
                                                                   : attn_bf16_to_f32(h16[i]);
                    if (!(memcmp(&got[i], &want, 4) == 0 || (got[i] != got[i] && want != want))) {
                        attn_test_fail(__FILE__, __LINE__, "%s load_row %s: element %d -> %a, want %a", k->name,
                                       attn_dtype_name(types[t]), i, (double)got[i], (double)want);
                        break;
                    }
                }
            }
        for (t = 3; t < 5; t++)
            for (n = N; n >= N - 20; n -= 7) {
                k->store_row(f, types[t], got16, n);
                for (i = 0; i < n; i++) {
                    uint16_t want = types[t] == ATTN_DTYPE_F16 ? attn_f32_to_f16(f[i]) : attn_f32_to_bf16(f[i]);
                    int nan = f[i] != f[i];
                    if (nan ? (got16[i] & 0x7fffu) <= (types[t] == ATTN_DTYPE_F16 ? 0x7c00u : 0x7f80u) : got16[i] != want) {
                        attn_test_fail(__FILE__, __LINE__, "%s store_row %s: %a -> 0x%04x, want 0x%04x", k->name,
                                       attn_dtype_name(types[t]), (double)f[i], got16[i], want);
                        break;
                    }
                }
            }
    }
}

/* The tables: the lane width each variant's direct kernels assume, its name, and that a
   build targeting AVX-512 without ATTN_SIMD_DISPATCH would still have its own (this copy has
   all three unless ATTN_NO_SIMD). */
ATTN_TEST(test_simd_tables) {
    static const int width[3] = {8, 8, 16};
    int v, n = 0;
    for (v = 0; v < 3; v++) {
        const attn__cpu_kernels *k = attn__cpu_variants[v];
        if (!k) continue;
        n++;
        EXPECT_TRUE(strcmp(k->name, simd_names[v]) == 0);
        EXPECT_EQ_INT(k->width, width[v]);
        EXPECT_TRUE(k->load_row && k->store_row && k->qk && k->pv && k->qk_direct && k->pv_direct && k->softmax_row);
    }
#if defined(ATTN_NO_SIMD)
    EXPECT_EQ_INT(n, 1);
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    EXPECT_EQ_INT(n, 3);
#endif
    EXPECT_TRUE(n >= 1);
}

void suite_simd(void) {
    ATTN_RUN(test_simd_tables);
    ATTN_RUN(test_simd_row_conversions_exact);
    ATTN_RUN(test_simd_record_names_variant);
    ATTN_RUN(test_simd_variants_agree);
}
