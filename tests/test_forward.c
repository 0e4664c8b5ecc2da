/* The CPU backend against a float64 reference: random batches mixing prefills (with and
   without context) and decodes, every feature on and off, outputs poisoned before each
   run; plus exact f16/bf16 conversions. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------------ */

typedef struct rng { uint64_t s; } rng;
static uint64_t rng_next(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}
static int rng_int(rng *r, int lo, int hi) { /* inclusive */
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}
static float rng_uniform(rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next(r) >> 40) * (1.0 / 16777216.0));
}

static float round_to(attn_dtype dt, float x) {
    switch (dt) {
    case ATTN_DTYPE_F16: return attn_f16_to_f32(attn_f32_to_f16(x));
    case ATTN_DTYPE_BF16: return attn_bf16_to_f32(attn_f32_to_bf16(x));
    default: return x;
    }
}
static void put(void *p, attn_dtype dt, size_t i, float x) {
    switch (dt) {
    case ATTN_DTYPE_F32: ((float *)p)[i] = x; break;
    case ATTN_DTYPE_F16: ((uint16_t *)p)[i] = attn_f32_to_f16(x); break;
    default: ((uint16_t *)p)[i] = attn_f32_to_bf16(x); break;
    }
}
static float get(const void *p, attn_dtype dt, size_t i) {
    switch (dt) {
    case ATTN_DTYPE_F32: return ((const float *)p)[i];
    case ATTN_DTYPE_F16: return attn_f16_to_f32(((const uint16_t *)p)[i]);
    default: return attn_bf16_to_f32(((const uint16_t *)p)[i]);
    }
}
/* A NaN bit pattern in every element, so an unwritten output cannot pass. */
static void poison(void *p, attn_dtype dt, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (dt == ATTN_DTYPE_F32) ((float *)p)[i] = NAN;
        else ((uint16_t *)p)[i] = dt == ATTN_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
    }
}

/* The scale of the test: ATTN_TEST_SCALE=0.25 runs a quarter of the random cases. */
static double test_scale(void) {
    const char *s = getenv("ATTN_TEST_SCALE");
    double v = s ? atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}

/* ---- conversions -------------------------------------------------------------------- */

/* The nearest representable value by search: an independent check of round-to-nearest-even. */
static uint16_t ref_round(float x, float (*to_f32)(uint16_t), int bf16) {
    uint16_t best = 0;
    double bd = INFINITY;
    uint32_t h;
    (void)bf16;
    float ax = fabsf(x);
    for (h = 0; h < 0x8000u; h++) { /* non-negative values; the sign is applied after */
        float v = to_f32((uint16_t)h);
        double dd;
        if (v != v) continue;
        dd = fabs((double)v - (double)ax);
        if (dd < bd || (dd == bd && (h & 1) == 0)) { /* ties go to the even mantissa */
            bd = dd;
            best = (uint16_t)h;
        }
    }
    return (uint16_t)(best | (x < 0 ? 0x8000u : 0u));
}

ATTN_TEST(test_f16_roundtrip_all_values) {
    uint32_t h;
    for (h = 0; h < 65536; h++) {
        float f = attn_f16_to_f32((uint16_t)h);
        if (f != f) { EXPECT_TRUE(attn_f32_to_f16(f) != 0); continue; }
        if (attn_f32_to_f16(f) != h) {
            attn_test_fail(__FILE__, __LINE__, "f16 0x%04x -> %g -> 0x%04x", h, (double)f,
                           attn_f32_to_f16(f));
            break;
        }
    }
}

ATTN_TEST(test_bf16_roundtrip_all_values) {
    uint32_t h;
    for (h = 0; h < 65536; h++) {
        float f = attn_bf16_to_f32((uint16_t)h);
        if (f != f) continue;
        EXPECT_EQ_INT(attn_f32_to_bf16(f), h);
    }
}

ATTN_TEST(test_f16_rounding_matches_search) {
    rng r = {0x1234567u};
    int i;
    /* random magnitudes across the whole half range, subnormals and ties included */
    for (i = 0; i < 300; i++) {
        float x;
        if (i % 3 == 0) { /* exact ties between neighbours */
            uint16_t h = (uint16_t)rng_int(&r, 0, 0x7bfe);
            x = (float)(((double)attn_f16_to_f32(h) + (double)attn_f16_to_f32((uint16_t)(h + 1))) / 2);
        } else {
            x = ldexpf(rng_uniform(&r, 1.0f, 2.0f), rng_int(&r, -26, 15));
        }
        if (rng_next(&r) & 1) x = -x;
        EXPECT_EQ_INT(attn_f32_to_f16(x), ref_round(x, attn_f16_to_f32, 0));
    }
    EXPECT_EQ_INT(attn_f32_to_f16(65520.0f), 0x7c00); /* rounds up to inf */
    EXPECT_EQ_INT(attn_f32_to_f16(65519.0f), 0x7bff);
    EXPECT_EQ_INT(attn_f32_to_f16(INFINITY), 0x7c00);
    EXPECT_TRUE((attn_f32_to_f16(NAN) & 0x7fffu) > 0x7c00u);
}

ATTN_TEST(test_bf16_rounding_matches_search) {
    rng r = {0x7654321u};
    int i;
    for (i = 0; i < 200; i++) {
        float x = ldexpf(rng_uniform(&r, 1.0f, 2.0f), rng_int(&r, -130, 120));
        if (i % 4 == 0) { /* ties */
            uint16_t h = (uint16_t)rng_int(&r, 0x0080, 0x7f00);
            x = (float)(((double)attn_bf16_to_f32(h) + (double)attn_bf16_to_f32((uint16_t)(h + 1))) / 2);
        }
        EXPECT_EQ_INT(attn_f32_to_bf16(x), ref_round(x, attn_bf16_to_f32, 1));
    }
    EXPECT_TRUE((attn_f32_to_bf16(NAN) & 0x7fffu) > 0x7f80u);
}

/* ---- the forward reference ------------------------------------------------------------ */

#define MAX_REQS 16

typedef struct fcase {
    int num_heads, num_kv_heads, head_size, block_size;
    attn_dtype dtype, kv_dtype;
    attn_causal causal;        /* YES or NO */
    int window;
    float soft_cap;
    int alibi;
    float scale;               /* 0 = default */
    int num_reqs;
    int qlen[MAX_REQS], slen[MAX_REQS];
    int threads;
    int pad_tokens;            /* extra q/out rows beyond num_actual_tokens */
    int write_in_forward;      /* new k/v passed to forward (else written beforehand) */
} fcase;

typedef struct fresult {
    int failures;
    double max_err;
    float *out;                /* f32 copy of the output rows, for invariance checks */
    int ntok;
} fresult;

static int visible(const fcase *c, int pos, int j) {
    if (c->causal == ATTN_CAUSAL_YES && j > pos) return 0;
    if (c->window) {
        if (pos - j >= c->window) return 0;
        if (c->causal == ATTN_CAUSAL_NO && j - pos >= c->window) return 0;
    }
    return 1;
}

static void tol_for(attn_dtype dt, double *abs_tol, double *rel_tol) {
    if (dt == ATTN_DTYPE_F32) { *abs_tol = 5e-5; *rel_tol = 5e-5; }
    else if (dt == ATTN_DTYPE_F16) { *abs_tol = 1.5e-3; *rel_tol = 2e-3; }
    else { *abs_tol = 1e-2; *rel_tol = 1e-2; }
}

/* Runs one case end to end and checks every output element and LSE against float64. */
static fresult run_case(const fcase *c, rng *r, int keep_out) {
    fresult res;
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEBUG, c->threads);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md;
    attn_batch b;
    int H = c->num_heads, HK = c->num_kv_heads, D = c->head_size, G = H / HK, bs = c->block_size;
    int ntok = 0, nctx = 0, nblocks = 0, maxnb = 0, i, t, h, x, j, rq;
    int32_t qsl[MAX_REQS + 1], seq[MAX_REQS];
    int32_t *bt, *perm;
    int64_t *slots, *ctx_slots;
    float *K[MAX_REQS], *V[MAX_REQS]; /* per request [slen][HK][D], the values the cache holds */
    float *slopes = NULL;
    void *q, *kn, *vn, *kc, *vc, *out, *cache;
    float *lse;
    size_t esz = attn_dtype_size(c->dtype), ksz = attn_dtype_size(c->kv_dtype);
    int64_t shape[ATTN_MAX_DIMS];
    int ndim, maxq = 0, maxs = 0, stride;
    attn_tensor tq, tk, tv, tout, tlse, tcache, tkc, tvc;
    double scale, abs_tol, rel_tol;
    attn_status st;
    rng req_rng[MAX_REQS];
    uint64_t base_seed;

    memset(&res, 0, sizeof res);
    base_seed = rng_next(r);
    if (!ctx) { res.failures = 1; attn_test_fail(__FILE__, __LINE__, "context"); return res; }
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HK; d.head_size = D; d.dtype = c->dtype;
    d.kv_cache_dtype = c->kv_dtype; d.block_size = bs; d.causal = c->causal;
    d.sliding_window = c->window; d.logits_soft_cap = c->soft_cap; d.scale = c->scale;
    if (c->alibi) {
        slopes = (float *)malloc((size_t)H * sizeof(float));
        for (h = 0; h < H; h++) slopes[h] = rng_uniform(r, 0.01f, 0.3f);
        d.alibi_slopes = slopes;
    }
    scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)D);
    st = attn_layer_create(ctx, &d, NULL, &layer);
    EXPECT_OK(st);
    if (st != ATTN_OK) { res.failures = 1; attn_context_destroy(ctx); free(slopes); return res; }

    qsl[0] = 0;
    for (i = 0; i < c->num_reqs; i++) {
        int nb = (c->slen[i] + bs - 1) / bs;
        qsl[i + 1] = qsl[i] + c->qlen[i];
        seq[i] = c->slen[i];
        nblocks += nb;
        if (nb > maxnb) maxnb = nb;
        if (c->qlen[i] > maxq) maxq = c->qlen[i];
        if (c->slen[i] > maxs) maxs = c->slen[i];
        nctx += c->slen[i] - c->qlen[i];
    }
    ntok = qsl[c->num_reqs];
    nblocks += 3;
    stride = maxnb + 2;
    bt = (int32_t *)calloc((size_t)c->num_reqs * (size_t)stride + 1, sizeof(int32_t));
    perm = (int32_t *)malloc((size_t)nblocks * sizeof(int32_t));
    for (i = 0; i < nblocks; i++) perm[i] = i;
    for (i = nblocks - 1; i > 0; i--) { int k = rng_int(r, 0, i), tmp = perm[i]; perm[i] = perm[k]; perm[k] = tmp; }
    {
        int next = 0;
        for (i = 0; i < c->num_reqs; i++) {
            int nb = (c->slen[i] + bs - 1) / bs, k;
            for (k = 0; k < nb; k++) bt[i * stride + k] = perm[next++];
            for (k = nb; k < stride; k++) bt[i * stride + k] = -5; /* never read */
        }
    }
    st = attn_layer_kv_cache_shape(layer, nblocks, shape, &ndim);
    EXPECT_OK(st);
    cache = malloc((size_t)nblocks * 2 * (size_t)bs * (size_t)HK * (size_t)D * ksz);
    poison(cache, c->kv_dtype, (size_t)nblocks * 2 * (size_t)bs * (size_t)HK * (size_t)D);
    tcache = attn_tensor_make(cache, c->kv_dtype, ndim, shape);

    /* K/V values: drawn in the layer dtype, stored in the cache dtype; each request draws
       from its own stream so it gets the same values whatever else is in the batch */
    for (i = 0; i < c->num_reqs; i++) {
        size_t n = (size_t)c->slen[i] * (size_t)HK * (size_t)D;
        rng *rr = &req_rng[i];
        rr->s = base_seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
        if (!rr->s) rr->s = 1;
        K[i] = (float *)malloc(n * sizeof(float) + 4);
        V[i] = (float *)malloc(n * sizeof(float) + 4);
        for (x = 0; x < (int)n; x++) {
            K[i][x] = round_to(c->kv_dtype, round_to(c->dtype, rng_uniform(rr, -1.0f, 1.0f)));
            V[i][x] = round_to(c->kv_dtype, round_to(c->dtype, rng_uniform(rr, -1.0f, 1.0f)));
        }
    }
    /* context tokens go in through attn_reshape_and_cache */
    kc = malloc(((size_t)nctx + 1) * (size_t)HK * (size_t)D * esz);
    vc = malloc(((size_t)nctx + 1) * (size_t)HK * (size_t)D * esz);
    ctx_slots = (int64_t *)malloc(((size_t)nctx + 1) * sizeof(int64_t));
    {
        int row = 0;
        for (i = 0; i < c->num_reqs; i++)
            for (t = 0; t < c->slen[i] - c->qlen[i]; t++, row++) {
                ctx_slots[row] = (int64_t)bt[i * stride + t / bs] * bs + t % bs;
                for (x = 0; x < HK * D; x++) {
                    put(kc, c->dtype, (size_t)row * (size_t)(HK * D) + (size_t)x, K[i][(size_t)t * (size_t)(HK * D) + (size_t)x]);
                    put(vc, c->dtype, (size_t)row * (size_t)(HK * D) + (size_t)x, V[i][(size_t)t * (size_t)(HK * D) + (size_t)x]);
                }
            }
    }
    shape[0] = nctx; shape[1] = HK; shape[2] = D;
    tkc = attn_tensor_make(kc, c->dtype, 3, shape);
    tvc = attn_tensor_make(vc, c->dtype, 3, shape);
    if (nctx > 0) EXPECT_OK(attn_reshape_and_cache(layer, &tkc, &tvc, &tcache, ctx_slots, nctx, NULL));

    /* new tokens: q, k, v rows in batch order, padding rows at the end */
    {
        size_t rows = (size_t)ntok + (size_t)c->pad_tokens;
        q = malloc(rows * (size_t)H * (size_t)D * esz + 4);
        out = malloc(rows * (size_t)H * (size_t)D * esz + 4);
        kn = malloc(rows * (size_t)HK * (size_t)D * esz + 4);
        vn = malloc(rows * (size_t)HK * (size_t)D * esz + 4);
        lse = (float *)malloc(rows * (size_t)H * sizeof(float) + 4);
        slots = (int64_t *)malloc(rows * sizeof(int64_t) + 8);
        for (i = 0; i < c->num_reqs; i++)
            for (x = qsl[i] * H * D; x < qsl[i + 1] * H * D; x++)
                put(q, c->dtype, (size_t)x, rng_uniform(&req_rng[i], -1.0f, 1.0f));
        for (x = ntok * H * D; x < (int)(rows * (size_t)H * (size_t)D); x++)
            put(q, c->dtype, (size_t)x, rng_uniform(r, -1.0f, 1.0f));
        poison(out, c->dtype, rows * (size_t)H * (size_t)D);
        for (x = 0; x < (int)(rows * (size_t)H); x++) lse[x] = NAN;
        for (i = 0; i < c->num_reqs; i++)
            for (t = 0; t < c->qlen[i]; t++) {
                int row = qsl[i] + t, pos = c->slen[i] - c->qlen[i] + t;
                slots[row] = (int64_t)bt[i * stride + pos / bs] * bs + pos % bs;
                for (x = 0; x < HK * D; x++) {
                    put(kn, c->dtype, (size_t)row * (size_t)(HK * D) + (size_t)x, K[i][(size_t)pos * (size_t)(HK * D) + (size_t)x]);
                    put(vn, c->dtype, (size_t)row * (size_t)(HK * D) + (size_t)x, V[i][(size_t)pos * (size_t)(HK * D) + (size_t)x]);
                }
            }
        shape[0] = (int64_t)rows; shape[1] = H; shape[2] = D;
        tq = attn_tensor_make(q, c->dtype, 3, shape);
        tout = attn_tensor_make(out, c->dtype, 3, shape);
        shape[1] = HK;
        tk = attn_tensor_make(kn, c->dtype, 3, shape);
        tv = attn_tensor_make(vn, c->dtype, 3, shape);
        shape[1] = H;
        tlse = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, shape);
    }
    if (!c->write_in_forward && ntok > 0)
        EXPECT_OK(attn_reshape_and_cache(layer, &tk, &tv, &tcache, slots, ntok, NULL));

    memset(&md, 0, sizeof md);
    md.max_num_reqs = c->num_reqs + 1;
    md.max_num_tokens = ntok + c->pad_tokens + 1;
    md.max_blocks_per_req = stride + 1;
    md.num_blocks = nblocks;
    EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl;
    b.seq_lens = seq;
    b.block_table = bt;
    b.block_table_stride = stride;
    b.slot_mapping = slots;
    b.num_reqs = c->num_reqs;
    b.num_actual_tokens = ntok;
    b.max_query_len = maxq;
    b.max_seq_len = maxs;
    if (meta) EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
    if (meta)
        EXPECT_OK(attn_layer_forward(layer, meta, &tq, c->write_in_forward ? &tk : NULL,
                                     c->write_in_forward ? &tv : NULL, &tcache, &tout, &tlse, NULL));

    /* float64 reference */
    tol_for(c->dtype, &abs_tol, &rel_tol);
    if (keep_out) { res.out = (float *)malloc(((size_t)ntok + 1) * (size_t)H * (size_t)D * sizeof(float)); res.ntok = ntok; }
    {
        double *logit = (double *)malloc(((size_t)maxs + 1) * sizeof(double));
        double *acc = (double *)malloc((size_t)D * sizeof(double));
        for (rq = 0; rq < c->num_reqs; rq++)
            for (t = 0; t < c->qlen[rq]; t++) {
                int row = qsl[rq] + t, pos = c->slen[rq] - c->qlen[rq] + t;
                for (h = 0; h < H; h++) {
                    int kh = h / G;
                    double mx = -INFINITY, sum = 0, lse_ref;
                    for (j = 0; j < c->slen[rq]; j++) {
                        double s = 0;
                        if (!visible(c, pos, j)) { logit[j] = -INFINITY; continue; }
                        for (x = 0; x < D; x++)
                            s += (double)get(q, c->dtype, ((size_t)row * (size_t)H + (size_t)h) * (size_t)D + (size_t)x) *
                                 (double)K[rq][((size_t)j * (size_t)HK + (size_t)kh) * (size_t)D + (size_t)x];
                        s *= scale;
                        if (c->soft_cap > 0) s = c->soft_cap * tanh(s / c->soft_cap);
                        if (slopes) s += (double)slopes[h] * (double)(j - pos);
                        logit[j] = s;
                        if (s > mx) mx = s;
                    }
                    for (x = 0; x < D; x++) acc[x] = 0;
                    for (j = 0; j < c->slen[rq]; j++) {
                        double p;
                        if (logit[j] == -INFINITY) continue;
                        p = exp(logit[j] - mx);
                        sum += p;
                        for (x = 0; x < D; x++) acc[x] += p * (double)V[rq][((size_t)j * (size_t)HK + (size_t)kh) * (size_t)D + (size_t)x];
                    }
                    lse_ref = mx + log(sum);
                    for (x = 0; x < D; x++) {
                        size_t idx = ((size_t)row * (size_t)H + (size_t)h) * (size_t)D + (size_t)x;
                        double want = acc[x] / sum, got = get(out, c->dtype, idx);
                        double err = fabs(got - want);
                        if (!(err <= res.max_err)) res.max_err = err != err ? INFINITY : err;
                        if (!attn_test_near(got, want, abs_tol, rel_tol)) {
                            if (res.failures < 3)
                                attn_test_fail(__FILE__, __LINE__,
                                               "out[tok %d][head %d][%d] = %.7g, reference %.7g (req %d pos %d)",
                                               row, h, x, got, want, rq, pos);
                            res.failures++;
                        }
                        if (res.out) res.out[idx] = (float)got;
                    }
                    if (!attn_test_near(lse[(size_t)row * (size_t)H + (size_t)h], lse_ref, 1e-4, 1e-4)) {
                        if (res.failures < 3)
                            attn_test_fail(__FILE__, __LINE__, "lse[tok %d][head %d] = %.7g, reference %.7g",
                                           row, h, (double)lse[(size_t)row * (size_t)H + (size_t)h], lse_ref);
                        res.failures++;
                    }
                }
            }
        free(logit);
        free(acc);
    }
    /* padding rows are not written */
    for (x = ntok * H * D; x < (ntok + c->pad_tokens) * H * D; x++)
        if (get(out, c->dtype, (size_t)x) == get(out, c->dtype, (size_t)x)) {
            attn_test_fail(__FILE__, __LINE__, "padding row element %d was written", x);
            res.failures++;
            break;
        }

    for (i = 0; i < c->num_reqs; i++) { free(K[i]); free(V[i]); }
    free(bt); free(perm); free(cache); free(kc); free(vc); free(ctx_slots);
    free(q); free(out); free(kn); free(vn); free(lse); free(slots); free(slopes);
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    return res;
}

static void describe(const fcase *c, char *buf, size_t size) {
    int i;
    size_t n;
    snprintf(buf, size, "H=%d HK=%d D=%d bs=%d %s/%s causal=%d win=%d cap=%g alibi=%d thr=%d reqs:",
             c->num_heads, c->num_kv_heads, c->head_size, c->block_size, attn_dtype_name(c->dtype),
             attn_dtype_name(c->kv_dtype), c->causal == ATTN_CAUSAL_YES, c->window, (double)c->soft_cap,
             c->alibi, c->threads);
    for (i = 0; i < c->num_reqs; i++) {
        n = strlen(buf);
        snprintf(buf + n, size - n, " %d/%d", c->qlen[i], c->slen[i]);
    }
}

/* Draws a random case whose float64 reference stays within a work budget. */
static void random_case(rng *r, fcase *c, double budget) {
    static const int heads[] = {64, 80, 96, 128, 256};
    static const int ratios[] = {1, 2, 4, 6, 8};
    static const int blocks[] = {16, 32, 64};
    double work;
    int i;
    memset(c, 0, sizeof *c);
    c->head_size = heads[rng_int(r, 0, 4)];
    c->num_kv_heads = rng_int(r, 1, 3);
    c->num_heads = c->num_kv_heads * ratios[rng_int(r, 0, 4)];
    c->block_size = blocks[rng_int(r, 0, 2)];
    c->dtype = (attn_dtype)rng_int(r, 1, 3);
    c->kv_dtype = rng_int(r, 0, 3) == 0 ? (attn_dtype)rng_int(r, 1, 3) : c->dtype;
    c->causal = rng_int(r, 0, 4) == 0 ? ATTN_CAUSAL_NO : ATTN_CAUSAL_YES;
    c->window = rng_int(r, 0, 3) == 0 ? rng_int(r, 1, 700) : 0;
    c->soft_cap = rng_int(r, 0, 3) == 0 ? rng_uniform(r, 5.0f, 30.0f) : 0.0f;
    c->alibi = rng_int(r, 0, 4) == 0;
    c->scale = rng_int(r, 0, 2) == 0 ? rng_uniform(r, 0.05f, 0.4f) : 0.0f;
    c->threads = rng_int(r, 1, 3);
    c->pad_tokens = rng_int(r, 0, 2);
    c->write_in_forward = rng_int(r, 0, 1);
    c->num_reqs = rng_int(r, 1, 16);
    for (;;) {
        work = 0;
        for (i = 0; i < c->num_reqs; i++) {
            int kind = rng_int(r, 0, 9);
            if (kind < 5) { /* decode */
                c->slen[i] = rng_int(r, 1, rng_int(r, 0, 3) == 0 ? 5000 : 600);
                c->qlen[i] = 1;
            } else if (kind < 8) { /* chunked prefill: new tokens after context */
                c->qlen[i] = rng_int(r, 2, 300);
                c->slen[i] = c->qlen[i] + rng_int(r, 1, 1200);
            } else { /* fresh prefill */
                c->qlen[i] = rng_int(r, 1, 300);
                c->slen[i] = c->qlen[i];
            }
            work += (double)c->qlen[i] * c->slen[i];
        }
        work *= (double)c->num_heads * c->head_size;
        if (work <= budget || c->num_reqs == 1) break;
        c->num_reqs = c->num_reqs > 1 ? c->num_reqs / 2 : 1;
    }
    if (work > budget) { /* one request: shrink it */
        c->qlen[0] = 1;
        if (c->slen[0] > 3000) c->slen[0] = 3000;
    }
}

ATTN_TEST(test_forward_random_cases) {
    rng r = {0x9e3779b97f4a7c15ull};
    int n = (int)(60 * test_scale()), k, failed_cases = 0;
    char buf[512];
    if (n < 4) n = 4;
    for (k = 0; k < n; k++) {
        fcase c;
        fresult res;
        random_case(&r, &c, 4e8);
        res = run_case(&c, &r, 0);
        if (res.failures) {
            describe(&c, buf, sizeof buf);
            attn_test_fail(__FILE__, __LINE__, "case %d failed (%d elements, max err %.3g): %s", k,
                           res.failures, res.max_err, buf);
            if (++failed_cases > 3) break;
        }
    }
}

/* Every head size the backend supports (multiples of 8 up to 512) on a small batch. */
ATTN_TEST(test_forward_all_head_sizes) {
    rng r = {77};
    int D;
    for (D = 8; D <= 512; D += 8) {
        fcase c;
        fresult res;
        memset(&c, 0, sizeof c);
        c.num_heads = 4; c.num_kv_heads = 2; c.head_size = D; c.block_size = 16;
        c.dtype = ATTN_DTYPE_F32; c.kv_dtype = ATTN_DTYPE_F32; c.causal = ATTN_CAUSAL_YES;
        c.threads = 2; c.num_reqs = 3; c.write_in_forward = 1;
        c.qlen[0] = 1; c.slen[0] = 70;
        c.qlen[1] = 9; c.slen[1] = 40;
        c.qlen[2] = 5; c.slen[2] = 5;
        res = run_case(&c, &r, 0);
        if (res.failures) { attn_test_fail(__FILE__, __LINE__, "head_size %d", D); break; }
    }
}

/* The benchmark shapes (32/8 heads, 128) in decode and prefill, f16 and bf16. */
ATTN_TEST(test_forward_llama_shapes) {
    rng r = {4242};
    fcase c;
    fresult res;
    memset(&c, 0, sizeof c);
    c.num_heads = 32; c.num_kv_heads = 8; c.head_size = 128; c.block_size = 16;
    c.dtype = ATTN_DTYPE_F16; c.kv_dtype = ATTN_DTYPE_F16; c.causal = ATTN_CAUSAL_YES;
    c.threads = 2; c.num_reqs = 4; c.write_in_forward = 1;
    c.qlen[0] = 1; c.slen[0] = 4096;
    c.qlen[1] = 1; c.slen[1] = 1000;
    c.qlen[2] = 200; c.slen[2] = 200;
    c.qlen[3] = 64; c.slen[3] = 900;
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
    c.dtype = ATTN_DTYPE_BF16; c.kv_dtype = ATTN_DTYPE_BF16;
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
}

/* Decodes over many KV heads (32/32, head 128): a token row of all heads is 8 KiB (f16) or
   16 KiB (f32), so the decode kernels take tiles of fewer keys (32, 16) than 64. */
ATTN_TEST(test_forward_many_kv_heads_decode) {
    rng r = {2718};
    fcase c;
    fresult res;
    memset(&c, 0, sizeof c);
    c.num_heads = 32; c.num_kv_heads = 32; c.head_size = 128; c.block_size = 16;
    c.dtype = ATTN_DTYPE_F32; c.kv_dtype = ATTN_DTYPE_F32; c.causal = ATTN_CAUSAL_YES;
    c.threads = 2; c.num_reqs = 3; c.write_in_forward = 1;
    c.qlen[0] = 1; c.slen[0] = 1100;
    c.qlen[1] = 2; c.slen[1] = 77;
    c.qlen[2] = 1; c.slen[2] = 9;
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
    c.dtype = ATTN_DTYPE_F16; c.kv_dtype = ATTN_DTYPE_F16;
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
}

/* One long MQA decode on several threads is split across the key range and merged by
   LSE; the result still matches the reference. */
ATTN_TEST(test_forward_split_kv_decode) {
    rng r = {99};
    fcase c;
    fresult res;
    memset(&c, 0, sizeof c);
    c.num_heads = 8; c.num_kv_heads = 1; c.head_size = 128; c.block_size = 32;
    c.dtype = ATTN_DTYPE_F32; c.kv_dtype = ATTN_DTYPE_F16; c.causal = ATTN_CAUSAL_YES;
    c.threads = 3; c.num_reqs = 1; c.write_in_forward = 1;
    c.qlen[0] = 1; c.slen[0] = 5000;
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
    c.window = 1500; /* the split covers only the window */
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
}

/* ATTN_BATCH_INVARIANT=1: a request's rows are bitwise identical alone and in a batch. */
ATTN_TEST(test_forward_batch_invariant) {
    rng r1 = {5}, r2 = {5};
    fcase one, many;
    fresult a, b;
    int i, same = 1;
    memset(&one, 0, sizeof one);
    one.num_heads = 8; one.num_kv_heads = 1; one.head_size = 64; one.block_size = 16;
    one.dtype = ATTN_DTYPE_F32; one.kv_dtype = ATTN_DTYPE_F32; one.causal = ATTN_CAUSAL_YES;
    one.threads = 2; one.num_reqs = 1; one.write_in_forward = 1;
    one.qlen[0] = 1; one.slen[0] = 3000;
    many = one;
    many.num_reqs = 6;
    for (i = 1; i < 6; i++) { many.qlen[i] = 1 + i * 7; many.slen[i] = 100 + i * 300; }
    setenv("ATTN_BATCH_INVARIANT", "1", 1);
    a = run_case(&one, &r1, 1);
    b = run_case(&many, &r2, 1); /* same seed: request 0 draws the same values first */
    unsetenv("ATTN_BATCH_INVARIANT");
    EXPECT_EQ_INT(a.failures, 0);
    EXPECT_EQ_INT(b.failures, 0);
    if (a.out && b.out)
        for (i = 0; i < 8 * 64; i++)
            if (memcmp(&a.out[i], &b.out[i], sizeof(float))) {
                if (same) printf("    first difference at %d: %.9g vs %.9g\n", i, (double)a.out[i], (double)b.out[i]);
                same = 0;
            }
    EXPECT_TRUE(same);
    free(a.out);
    free(b.out);
}

/* A sequence whose window leaves only the key itself, and non-causal windows. */
ATTN_TEST(test_forward_window_edges) {
    rng r = {31337};
    fcase c;
    fresult res;
    memset(&c, 0, sizeof c);
    c.num_heads = 6; c.num_kv_heads = 1; c.head_size = 40; c.block_size = 16;
    c.dtype = ATTN_DTYPE_F32; c.kv_dtype = ATTN_DTYPE_F32; c.causal = ATTN_CAUSAL_YES;
    c.threads = 2; c.num_reqs = 2; c.write_in_forward = 0;
    c.qlen[0] = 50; c.slen[0] = 130;
    c.qlen[1] = 1; c.slen[1] = 77;
    c.window = 1;
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
    c.causal = ATTN_CAUSAL_NO;
    c.window = 9;
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
}

void suite_types(void) {
    ATTN_RUN(test_f16_roundtrip_all_values);
    ATTN_RUN(test_bf16_roundtrip_all_values);
    ATTN_RUN(test_f16_rounding_matches_search);
    ATTN_RUN(test_bf16_rounding_matches_search);
}

void suite_forward(void) {
    ATTN_RUN(test_forward_llama_shapes);
    ATTN_RUN(test_forward_all_head_sizes);
    ATTN_RUN(test_forward_split_kv_decode);
    ATTN_RUN(test_forward_many_kv_heads_decode);
    ATTN_RUN(test_forward_batch_invariant);
    ATTN_RUN(test_forward_window_edges);
    ATTN_RUN(test_forward_random_cases);
}
