/* The CPU backend against a float64 reference: random batches mixing prefills (with and
   without context) and decodes, every feature on and off, outputs poisoned before each
   run; plus exact f16/bf16 conversions. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <float.h>
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
/* The value a cache of type dt holds for x: fp8 with a per-tensor scale, code(x / scale) *
   scale (fixtures.h); other types: round_to. */
static float cache_value(attn_dtype dt, float scale, float x) {
    return dt == ATTN_DTYPE_FP8_E4M3 || dt == ATTN_DTYPE_FP8_E5M2 ? attn_test_fp8_value(dt, scale, x) : round_to(dt, x);
}
/* Per-token-head quantization of one row of n values in place (what the cache write does:
   scale = amax / 127 (int8) or / 448 (e4m3), codes of x / scale, read back as code * scale). */
static void quantize_row(attn_dtype dt, float *x, int n) {
    float amax = 0.0f, scale;
    int i;
    for (i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    scale = amax / (dt == ATTN_DTYPE_INT8 ? 127.0f : 448.0f);
    for (i = 0; i < n; i++) {
        float c = scale > 0.0f ? x[i] / scale : 0.0f;
        if (dt == ATTN_DTYPE_INT8) c = rintf(c) > 127.0f ? 127.0f : rintf(c) < -127.0f ? -127.0f : rintf(c);
        else c = attn_fp8_e4m3_to_f32(attn_f32_to_fp8_e4m3(c));
        x[i] = c * scale;
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
        else if (attn_test_is_8bit(dt)) ((uint8_t *)p)[i] = 0x7fu; /* NaN in both fp8 formats */
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

/* ---- fp8 (OCP e4m3fn / e5m2): every code both ways, rounding against a search ----------- */

typedef struct fp8_kind {
    const char *name;
    uint8_t (*enc)(float);
    float (*dec)(uint8_t);
    float max;      /* largest finite value */
    float min_sub;  /* smallest subnormal */
    int has_inf;
} fp8_kind;
static const fp8_kind fp8_kinds[2] = {{"e4m3", attn_f32_to_fp8_e4m3, attn_fp8_e4m3_to_f32, 448.0f, 0x1p-9f, 0},
                                      {"e5m2", attn_f32_to_fp8_e5m2, attn_fp8_e5m2_to_f32, 57344.0f, 0x1p-16f, 1}};

/* The nearest finite code by search over all of them (ties to the even code), the sign
   applied after; beyond the largest finite value that is the largest (saturation). */
static uint8_t fp8_ref(const fp8_kind *k, float x) {
    uint8_t best = 0;
    double bd = INFINITY, ax = fabs((double)x);
    int c;
    for (c = 0; c < 0x80; c++) {
        float v = k->dec((uint8_t)c);
        double dd;
        if (v != v || v == INFINITY) continue;
        dd = fabs((double)v - ax);
        if (dd < bd || (dd == bd && (c & 1) == 0)) { bd = dd; best = (uint8_t)c; }
    }
    return (uint8_t)(best | (signbit(x) ? 0x80u : 0u));
}

ATTN_TEST(test_fp8_all_codes_both_ways) {
    int k, c, nan_codes, inf_codes;
    for (k = 0; k < 2; k++) {
        const fp8_kind *f = &fp8_kinds[k];
        nan_codes = inf_codes = 0;
        for (c = 0; c < 256; c++) {
            float v = f->dec((uint8_t)c);
            uint8_t back = f->enc(v);
            if (v != v) { /* NaN codes: e4m3 0x7f/0xff, e5m2 0x7d-0x7f and 0xfd-0xff */
                nan_codes++;
                EXPECT_EQ_INT(back & 0x7f, 0x7f); /* NaN stays NaN (0x7f with the sign) */
                continue;
            }
            if (v == INFINITY || v == -INFINITY) { /* e5m2's infinities saturate on the way back */
                inf_codes++;
                EXPECT_EQ_INT(back, (c & 0x80) | 0x7b);
                continue;
            }
            if (back != c) {
                attn_test_fail(__FILE__, __LINE__, "%s code 0x%02x -> %g -> 0x%02x", f->name, c, (double)v, back);
                break;
            }
            /* the decoded value is the format's: sign, exponent, mantissa */
            {
                int mb = k ? 2 : 3, bias = k ? 15 : 7, e = (c & 0x7f) >> mb, m = c & ((1 << mb) - 1);
                double want = e ? ldexp(1.0 + m / (double)(1 << mb), e - bias) : ldexp(m / (double)(1 << mb), 1 - bias);
                EXPECT_NEAR((double)v, (c & 0x80) ? -want : want, 0.0, 0.0);
            }
        }
        EXPECT_EQ_INT(nan_codes, k ? 6 : 2);
        EXPECT_EQ_INT(inf_codes, k ? 2 : 0);
        EXPECT_NEAR((double)f->dec(k ? 0x7b : 0x7e), (double)f->max, 0.0, 0.0);
        EXPECT_NEAR((double)f->dec(1), (double)f->min_sub, 0.0, 0.0);
    }
}

ATTN_TEST(test_fp8_rounding_matches_search) {
    rng r = {0x5eedf8u};
    int k, i;
    for (k = 0; k < 2; k++) {
        const fp8_kind *f = &fp8_kinds[k];
        int emin = k ? -18 : -11, emax = k ? 17 : 10;
        for (i = 0; i < 3000; i++) {
            float x;
            if (i % 3 == 0) { /* exact ties between neighbouring finite codes */
                uint8_t c = (uint8_t)rng_int(&r, 0, k ? 0x7a : 0x7d);
                x = (float)(((double)f->dec(c) + (double)f->dec((uint8_t)(c + 1))) / 2);
            } else {
                x = ldexpf(rng_uniform(&r, 1.0f, 2.0f), rng_int(&r, emin, emax));
            }
            if (rng_next(&r) & 1) x = -x;
            if (f->enc(x) != fp8_ref(f, x)) {
                attn_test_fail(__FILE__, __LINE__, "%s(%a) = 0x%02x, nearest (ties to even) 0x%02x", f->name,
                               (double)x, f->enc(x), fp8_ref(f, x));
                break;
            }
        }
        /* saturation: past the largest finite value, and the infinities */
        EXPECT_EQ_INT(f->enc(f->max * 1.5f), k ? 0x7b : 0x7e);
        EXPECT_EQ_INT(f->enc(-f->max * 1000.0f), k ? 0xfb : 0xfe);
        EXPECT_EQ_INT(f->enc(INFINITY), k ? 0x7b : 0x7e);
        EXPECT_EQ_INT(f->enc(-INFINITY), k ? 0xfb : 0xfe);
        EXPECT_EQ_INT(f->enc(FLT_MAX), k ? 0x7b : 0x7e);
        /* NaN kept; zeros keep their sign; below half the smallest subnormal: zero */
        EXPECT_EQ_INT(f->enc(NAN) & 0x7f, 0x7f);
        EXPECT_EQ_INT(f->enc(0.0f), 0x00);
        EXPECT_EQ_INT(f->enc(-0.0f), 0x80);
        EXPECT_EQ_INT(f->enc(f->min_sub * 0.5f), 0x00);         /* a tie with 0: to even (0) */
        EXPECT_EQ_INT(f->enc(f->min_sub * 0.5000001f), 0x01);   /* just past it: up */
        EXPECT_EQ_INT(f->enc(f->min_sub * 1.5f), 0x02);         /* tie between 1 and 2: even */
        EXPECT_EQ_INT(f->enc(1e-30f), 0x00);
        EXPECT_EQ_INT(f->enc(-1e-42f), 0x80);                   /* an f32 subnormal */
    }
    /* e4m3's largest finite value and the tie just above it: 464 is halfway to the NaN
       code's 480 and saturates to 448 */
    EXPECT_EQ_INT(attn_f32_to_fp8_e4m3(464.0f), 0x7e);
    EXPECT_EQ_INT(attn_f32_to_fp8_e4m3(447.9f), 0x7e);
    EXPECT_EQ_INT(attn_f32_to_fp8_e4m3(1.0f), 0x38);
    EXPECT_EQ_INT(attn_f32_to_fp8_e5m2(1.0f), 0x3c);
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
    float k_scale, v_scale;    /* fp8 caches: the per-tensor scales */
    int scale_ptr;             /* fp8: the scales through desc.k_scale.ptr / v_scale.ptr */
    int per_token_head;        /* int8 / fp8_e4m3 with a scale per (token, KV head) row */
    int sinks;                 /* attention sinks: a random logit per query head (desc.sinks) */
    int prefix;                /* cascade: every request's first `prefix` tokens are the same blocks
                                  (a multiple of block_size), passed as common_prefix_len */
} fcase;

typedef struct fresult {
    int failures;
    double max_err;
    double max_quant_err, max_quant_bound; /* fp8: |out - unquantized reference|, and its bound */
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

/* The float64 attention of one query row qd (D values) for KV head kh over keys and values
   laid out [slen][num_kv_heads][D]: logit[j] (-inf where key j is not visible), acc = the
   normalised output; returns the LSE. slope: the head's ALiBi slope (0: none); sink: the
   head's attention sink, a logit with no value in the denominator and the LSE (NaN: none). */
static double ref_attend(const fcase *c, const double *qd, const float *keys, const float *values, int kh, int slen,
                         int pos, double scale, double slope, double sink, double *logit, double *acc) {
    const int HK = c->num_kv_heads, D = c->head_size;
    double mx = -INFINITY, sum = 0;
    int j, x;
    for (j = 0; j < slen; j++) {
        const float *k = keys + ((size_t)j * (size_t)HK + (size_t)kh) * (size_t)D;
        double s = 0;
        if (!visible(c, pos, j)) { logit[j] = -INFINITY; continue; }
        for (x = 0; x < D; x++) s += qd[x] * (double)k[x];
        s *= scale;
        if (c->soft_cap > 0) s = c->soft_cap * tanh(s / c->soft_cap);
        if (c->alibi) s += slope * (double)(j - pos);
        logit[j] = s;
        if (s > mx) mx = s;
    }
    for (x = 0; x < D; x++) acc[x] = 0;
    for (j = 0; j < slen; j++) {
        const float *v = values + ((size_t)j * (size_t)HK + (size_t)kh) * (size_t)D;
        double p;
        if (logit[j] == -INFINITY) continue;
        p = exp(logit[j] - mx);
        sum += p;
        for (x = 0; x < D; x++) acc[x] += p * (double)v[x];
    }
    if (sink == sink) { /* sum e^(s - m) + e^(sink - m) over the new maximum m */
        double m2 = mx > sink ? mx : sink, w = sum > 0 ? exp(mx - m2) : 0.0;
        sum = sum * w + exp(sink - m2);
        for (x = 0; x < D; x++) acc[x] *= w;
        mx = m2;
    }
    for (x = 0; x < D; x++) acc[x] /= sum;
    return mx + log(sum);
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
    float *KU[MAX_REQS], *VU[MAX_REQS]; /* fp8: the values before quantization (layer dtype) */
    float ks_now = c->k_scale, vs_now = c->v_scale; /* what desc.k_scale.ptr / v_scale.ptr point to */
    float *slopes = NULL, *sinks = NULL;
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
    if (c->per_token_head) d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
    else if (attn_test_is_8bit(c->kv_dtype)) {
        if (c->scale_ptr) { d.k_scale.ptr = &ks_now; d.v_scale.ptr = &vs_now; }
        else { d.k_scale.value = c->k_scale; d.v_scale.value = c->v_scale; }
    }
    if (c->alibi) {
        slopes = (float *)malloc((size_t)H * sizeof(float));
        for (h = 0; h < H; h++) slopes[h] = rng_uniform(r, 0.01f, 0.3f);
        d.alibi_slopes = slopes;
    }
    if (c->sinks) { /* around the logits' range, and now and then far above it (rows then ~0) */
        sinks = (float *)malloc((size_t)H * sizeof(float));
        for (h = 0; h < H; h++) sinks[h] = rng_int(r, 0, 7) ? rng_uniform(r, -4.0f, 4.0f) : rng_uniform(r, 8.0f, 30.0f);
        d.sinks = sinks;
    }
    scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)D);
    st = attn_layer_create(ctx, &d, NULL, &layer);
    EXPECT_OK(st);
    if (st != ATTN_OK) { res.failures = 1; attn_context_destroy(ctx); free(slopes); free(sinks); return res; }

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
            for (k = 0; i > 0 && k < c->prefix / bs; k++) bt[i * stride + k] = bt[k]; /* the shared prefix */
        }
    }
    st = attn_layer_kv_cache_shape(layer, nblocks, shape, &ndim);
    EXPECT_OK(st);
    EXPECT_TRUE(ndim == 5 && shape[0] == nblocks && shape[1] == 2 && shape[2] == bs && shape[3] == HK &&
                shape[4] == D + (c->per_token_head ? 4 : 0)); /* per-token-head: the scale's 4 bytes a row */
    cache = malloc((size_t)nblocks * 2 * (size_t)bs * (size_t)HK * (size_t)shape[4] * ksz);
    poison(cache, c->kv_dtype, (size_t)nblocks * 2 * (size_t)bs * (size_t)HK * (size_t)shape[4]);
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
        KU[i] = (float *)malloc(n * sizeof(float) + 4);
        VU[i] = (float *)malloc(n * sizeof(float) + 4);
        for (x = 0; x < (int)n; x++) {
            KU[i][x] = round_to(c->dtype, rng_uniform(rr, -1.0f, 1.0f));
            VU[i][x] = round_to(c->dtype, rng_uniform(rr, -1.0f, 1.0f));
            K[i][x] = c->per_token_head ? KU[i][x] : cache_value(c->kv_dtype, c->k_scale, KU[i][x]);
            V[i][x] = c->per_token_head ? VU[i][x] : cache_value(c->kv_dtype, c->v_scale, VU[i][x]);
        }
        if (c->per_token_head)
            for (x = 0; x < c->slen[i] * HK; x++) {
                quantize_row(c->kv_dtype, K[i] + (size_t)x * (size_t)D, D);
                quantize_row(c->kv_dtype, V[i] + (size_t)x * (size_t)D, D);
            }
        if (i > 0 && c->prefix) { /* the shared prefix holds request 0's tokens */
            size_t np = (size_t)c->prefix * (size_t)HK * (size_t)D * sizeof(float);
            memcpy(K[i], K[0], np); memcpy(V[i], V[0], np); memcpy(KU[i], KU[0], np); memcpy(VU[i], VU[0], np);
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
                    put(kc, c->dtype, (size_t)row * (size_t)(HK * D) + (size_t)x, KU[i][(size_t)t * (size_t)(HK * D) + (size_t)x]);
                    put(vc, c->dtype, (size_t)row * (size_t)(HK * D) + (size_t)x, VU[i][(size_t)t * (size_t)(HK * D) + (size_t)x]);
                }
            }
    }
    shape[0] = nctx; shape[1] = HK; shape[2] = D;
    tkc = attn_tensor_make(kc, c->dtype, 3, shape);
    tvc = attn_tensor_make(vc, c->dtype, 3, shape);
    if (nctx > 0) EXPECT_OK(attn_reshape_and_cache(layer, &tkc, &tvc, &tcache, ATTN_TEST_SLOTS(ctx_slots, nctx), NULL));

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
                    put(kn, c->dtype, (size_t)row * (size_t)(HK * D) + (size_t)x, KU[i][(size_t)pos * (size_t)(HK * D) + (size_t)x]);
                    put(vn, c->dtype, (size_t)row * (size_t)(HK * D) + (size_t)x, VU[i][(size_t)pos * (size_t)(HK * D) + (size_t)x]);
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
        EXPECT_OK(attn_reshape_and_cache(layer, &tk, &tv, &tcache, ATTN_TEST_SLOTS(slots, ntok), NULL));

    memset(&md, 0, sizeof md);
    md.max_num_reqs = c->num_reqs + 1;
    md.max_num_tokens = ntok + c->pad_tokens + 1;
    md.max_blocks_per_req = stride + 1;
    md.num_blocks = nblocks;
    if (c->prefix) md.decode_threshold = 16; /* cascade rows for up to 16 tokens a request (the CPU sizes them so) */
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
    if (meta) EXPECT_OK(attn_metadata_build(meta, c->prefix, &b, 0));
    if (meta)
        EXPECT_OK(attn_layer_forward(layer, meta, &tq, c->write_in_forward ? &tk : NULL,
                                     c->write_in_forward ? &tv : NULL, &tcache, &tout, &tlse, NULL));

    /* float64 reference */
    tol_for(c->dtype, &abs_tol, &rel_tol);
    if (keep_out) { res.out = (float *)malloc(((size_t)ntok + 1) * (size_t)H * (size_t)D * sizeof(float)); res.ntok = ntok; }
    {
        double *logit = (double *)malloc(((size_t)maxs + 1) * sizeof(double));
        double *acc = (double *)malloc((size_t)D * sizeof(double));
        double *accu = (double *)malloc((size_t)D * sizeof(double));
        double *qd = (double *)malloc((size_t)D * sizeof(double));
        for (rq = 0; rq < c->num_reqs; rq++)
            for (t = 0; t < c->qlen[rq]; t++) {
                int row = qsl[rq] + t, pos = c->slen[rq] - c->qlen[rq] + t;
                for (h = 0; h < H; h++) {
                    int kh = h / G;
                    double lse_ref;
                    for (x = 0; x < D; x++) qd[x] = get(q, c->dtype, ((size_t)row * (size_t)H + (size_t)h) * (size_t)D + (size_t)x);
                    lse_ref = ref_attend(c, qd, K[rq], V[rq], kh, c->slen[rq], pos, scale, slopes ? slopes[h] : 0.0,
                                         sinks ? sinks[h] : NAN, logit, acc);
                    if (attn_test_is_8bit(c->kv_dtype)) { /* against the unquantized keys and values: the bound */
                        double ds = 0, dv = 0, vmax = 0;
                        for (j = 0; j < c->slen[rq]; j++) {
                            double sd = 0;
                            const float *ku = KU[rq] + ((size_t)j * (size_t)HK + (size_t)kh) * (size_t)D;
                            const float *kq = K[rq] + ((size_t)j * (size_t)HK + (size_t)kh) * (size_t)D;
                            const float *vu = VU[rq] + ((size_t)j * (size_t)HK + (size_t)kh) * (size_t)D;
                            const float *vq = V[rq] + ((size_t)j * (size_t)HK + (size_t)kh) * (size_t)D;
                            if (logit[j] == -INFINITY) continue;
                            for (x = 0; x < D; x++) {
                                sd += fabs(qd[x]) * fabs((double)kq[x] - (double)ku[x]);
                                if (fabs((double)vq[x] - (double)vu[x]) > dv) dv = fabs((double)vq[x] - (double)vu[x]);
                                if (fabs((double)vu[x]) > vmax) vmax = fabs((double)vu[x]);
                            }
                            if (sd * scale > ds) ds = sd * scale;
                        }
                        ref_attend(c, qd, KU[rq], VU[rq], kh, c->slen[rq], pos, scale, slopes ? slopes[h] : 0.0,
                                   sinks ? sinks[h] : NAN, logit, accu);
                        /* |out - out_u| <= max|dv| + (e^(2 max|ds|) - 1) max|v_u| (softmax weights
                           move by at most that factor when every logit moves by at most ds) */
                        {
                            double bound = dv + (exp(2 * ds) - 1) * vmax;
                            if (bound > res.max_quant_bound) res.max_quant_bound = bound;
                            for (x = 0; x < D; x++) {
                                size_t idx = ((size_t)row * (size_t)H + (size_t)h) * (size_t)D + (size_t)x;
                                double got = get(out, c->dtype, idx), wantu = accu[x];
                                if (fabs(got - wantu) > res.max_quant_err) res.max_quant_err = fabs(got - wantu);
                                if (!(fabs(got - wantu) <= bound + abs_tol + rel_tol * fabs(wantu))) {
                                    if (res.failures < 3)
                                        attn_test_fail(__FILE__, __LINE__, "out[tok %d][head %d][%d] = %.7g: %.3g from the "
                                                       "unquantized reference %.7g, over the bound %.3g", row, h, x, got,
                                                       fabs(got - wantu), wantu, bound);
                                    res.failures++;
                                }
                            }
                        }
                    }
                    for (x = 0; x < D; x++) {
                        size_t idx = ((size_t)row * (size_t)H + (size_t)h) * (size_t)D + (size_t)x;
                        double want = acc[x], got = get(out, c->dtype, idx);
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
        free(accu);
        free(qd);
    }
    /* padding rows are not written */
    for (x = ntok * H * D; x < (ntok + c->pad_tokens) * H * D; x++)
        if (get(out, c->dtype, (size_t)x) == get(out, c->dtype, (size_t)x)) {
            attn_test_fail(__FILE__, __LINE__, "padding row element %d was written", x);
            res.failures++;
            break;
        }

    for (i = 0; i < c->num_reqs; i++) { free(K[i]); free(V[i]); free(KU[i]); free(VU[i]); }
    free(bt); free(perm); free(cache); free(kc); free(vc); free(ctx_slots);
    free(q); free(out); free(kn); free(vn); free(lse); free(slots); free(slopes); free(sinks);
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    return res;
}

static void describe(const fcase *c, char *buf, size_t size) {
    int i;
    size_t n;
    snprintf(buf, size, "H=%d HK=%d D=%d bs=%d %s/%s causal=%d win=%d cap=%g alibi=%d sinks=%d thr=%d reqs:",
             c->num_heads, c->num_kv_heads, c->head_size, c->block_size, attn_dtype_name(c->dtype),
             attn_dtype_name(c->kv_dtype), c->causal == ATTN_CAUSAL_YES, c->window, (double)c->soft_cap,
             c->alibi, c->sinks, c->threads);
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
    c->sinks = rng_int(r, 0, 2) == 0; /* drawn last: the cases before sinks keep their shapes */
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

/* The random cases with 8-bit caches, each checked against float64 from the dequantized
   cache values (the tolerances of the unquantized runs) and against the unquantized values
   within the bound run_case states. Per tensor: e4m3 and e5m2 by turns, scales by value and
   by pointer, from 1 (codes down to the subnormals) to 1 / max-code (the full range). Per
   token and head: int8 and e4m3 by turns. */
static void quant_random_cases(uint64_t seed, int per_token_head) {
    static const attn_dtype kinds[2][2] = {{ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2},
                                           {ATTN_DTYPE_INT8, ATTN_DTYPE_FP8_E4M3}};
    rng r = {seed};
    int n = (int)(40 * test_scale()), k, failed_cases = 0;
    double worst_ratio = 0, worst_err[2] = {0, 0};
    char buf[512];
    if (n < 4) n = 4;
    for (k = 0; k < n; k++) {
        fcase c;
        fresult res;
        random_case(&r, &c, 2e8);
        c.kv_dtype = kinds[per_token_head][k % 2];
        c.per_token_head = per_token_head;
        if (!per_token_head) {
            switch (rng_int(&r, 0, 2)) {
            case 0: c.k_scale = c.v_scale = 1.0f; break;
            case 1: c.k_scale = 1.0f / (k % 2 ? 57344.0f : 448.0f); c.v_scale = c.k_scale * 2; break;
            default: c.k_scale = rng_uniform(&r, 0.002f, 0.5f); c.v_scale = rng_uniform(&r, 0.002f, 0.5f); break;
            }
            c.scale_ptr = rng_int(&r, 0, 1);
        }
        res = run_case(&c, &r, 0);
        if (res.max_quant_bound > 0 && res.max_quant_err / res.max_quant_bound > worst_ratio)
            worst_ratio = res.max_quant_err / res.max_quant_bound;
        if (res.max_quant_err > worst_err[k % 2]) worst_err[k % 2] = res.max_quant_err;
        if (res.failures) {
            describe(&c, buf, sizeof buf);
            attn_test_fail(__FILE__, __LINE__, "%s case %d (scales %s%g/%g%s) failed (%d elements, max err %.3g): %s",
                           per_token_head ? "per-token-head" : "per-tensor", k, per_token_head ? "in the cache, " : "",
                           (double)c.k_scale, (double)c.v_scale, c.scale_ptr ? " by pointer" : "", res.failures,
                           res.max_err, buf);
            if (++failed_cases > 3) break;
        }
    }
    printf("    %s caches: largest |out - unquantized reference| %s %.3g, %s %.3g; at most %.0f%% of the bound\n",
           per_token_head ? "per-token-head" : "per-tensor fp8", attn_dtype_name(kinds[per_token_head][0]), worst_err[0],
           attn_dtype_name(kinds[per_token_head][1]), worst_err[1], 100 * worst_ratio);
}

ATTN_TEST(test_forward_fp8_random_cases) { quant_random_cases(0xf8f8f8f8f8ull, 0); }
ATTN_TEST(test_forward_per_token_head_random_cases) { quant_random_cases(0x7e57ab1e5ull, 1); }

/* The per-token-head layout as documented: a block half is the rows' codes, then their f32
   scales (amax / 127); the descriptor's rules are named errors. */
ATTN_TEST(test_forward_per_token_head_layout) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 1);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    enum { HK = 2, D = 32, BS = 16, NB = 3, T = 3 };
    int64_t shape[ATTN_MAX_DIMS], slots[T] = {2 * BS + 5, 0, -1};
    int ndim, t, h, i;
    float kf[T * HK * D], vf[T * HK * D];
    int8_t cache[NB * 2 * BS * HK * (D + 4)];
    attn_tensor tk, tv, tc;
    rng r = {99};
    if (!ctx) { attn_test_fail(__FILE__, __LINE__, "context"); return; }
    memset(&d, 0, sizeof d);
    d.num_heads = 4; d.num_kv_heads = HK; d.head_size = D; d.dtype = ATTN_DTYPE_F32; d.block_size = BS;
    d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E5M2; /* per-token-head takes int8 and fp8_e4m3 */
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "allowed: int8, fp8_e4m3") != NULL);
    d.kv_cache_dtype = ATTN_DTYPE_INT8;
    d.k_scale.value = 1.0f; /* the scales are the cache's */
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    d.k_scale.value = 0.0f;
    d.kv_scale_kind = ATTN_KV_SCALE_PER_TENSOR; /* int8 needs per-token-head */
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "int8") != NULL);
    d.kv_scale_kind = (attn_kv_scale_kind)2;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (!layer) { attn_context_destroy(ctx); return; }
    EXPECT_OK(attn_layer_kv_cache_shape(layer, NB, shape, &ndim));
    EXPECT_TRUE(ndim == 5 && shape[4] == D + 4);
    for (i = 0; i < T * HK * D; i++) { kf[i] = rng_uniform(&r, -3.0f, 3.0f); vf[i] = rng_uniform(&r, -0.5f, 0.5f); }
    for (i = 0; i < D; i++) kf[HK * D + D + i] = 0.0f; /* token 1, head 1: an all-zero row */
    memset(cache, 0x55, sizeof cache);
    tc = attn_tensor_make(cache, ATTN_DTYPE_INT8, ndim, shape);
    shape[0] = T; shape[1] = HK; shape[2] = D;
    tk = attn_tensor_make(kf, ATTN_DTYPE_F32, 3, shape);
    tv = attn_tensor_make(vf, ATTN_DTYPE_F32, 3, shape);
    EXPECT_OK(attn_reshape_and_cache(layer, &tk, &tv, &tc, ATTN_TEST_SLOTS(slots, T), NULL));
    for (t = 0; t < 2; t++)
        for (h = 0; h < HK; h++) {
            int kvi;
            for (kvi = 0; kvi < 2; kvi++) {
                const float *x = (kvi ? vf : kf) + ((size_t)t * HK + (size_t)h) * D;
                const int8_t *half = cache + ((size_t)(slots[t] / BS) * 2 + (size_t)kvi) * BS * HK * (D + 4);
                size_t row = (size_t)(slots[t] % BS) * HK + (size_t)h;
                float amax = 0.0f, scale, stored;
                for (i = 0; i < D; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
                scale = amax / 127.0f;
                memcpy(&stored, half + (size_t)BS * HK * D + row * 4, 4);
                EXPECT_NEAR(stored, scale, 0.0, 0.0);
                for (i = 0; i < D; i++) {
                    int want = scale > 0.0f ? (int)rintf(x[i] / scale) : 0;
                    if (half[row * D + (size_t)i] != want) {
                        attn_test_fail(__FILE__, __LINE__, "token %d head %d %s[%d]: code %d, want %d", t, h,
                                       kvi ? "v" : "k", i, half[row * D + (size_t)i], want);
                        break;
                    }
                }
            }
        }
    /* the row's largest magnitude is code +-127 */
    {
        int m = 0;
        for (i = 0; i < D; i++) m = abs(cache[(size_t)(2 * 2) * BS * HK * (D + 4) + (size_t)(5 * HK) * D + (size_t)i]) > m
                                        ? abs(cache[(size_t)(2 * 2) * BS * HK * (D + 4) + (size_t)(5 * HK) * D + (size_t)i])
                                        : m;
        EXPECT_EQ_INT(m, 127);
    }
    /* a NaN anywhere in a row makes its scale NaN (the row reads back NaN), wherever it sits:
       first, middle or last element (an amax loop that lets a later value replace a NaN
       would store a finite scale and codes of the other elements) */
    {
        static const int at[3] = {0, D / 2, D - 1};
        int k;
        for (k = 0; k < 3; k++) {
            int64_t one = 7;
            float stored;
            for (i = 0; i < HK * D; i++) kf[i] = rng_uniform(&r, -3.0f, 3.0f);
            kf[at[k]] = NAN; /* head 0's K row */
            shape[0] = 1;
            tk = attn_tensor_make(kf, ATTN_DTYPE_F32, 3, shape);
            tv = attn_tensor_make(vf, ATTN_DTYPE_F32, 3, shape);
            EXPECT_OK(attn_reshape_and_cache(layer, &tk, &tv, &tc, ATTN_TEST_SLOTS(&one, 1), NULL));
            memcpy(&stored, cache + (size_t)BS * HK * D + (size_t)(7 * HK) * 4, 4); /* block 0, K, row 7, head 0 */
            EXPECT_TRUE(stored != stored);
            memcpy(&stored, cache + (size_t)BS * HK * D + (size_t)(7 * HK + 1) * 4, 4); /* head 1: finite */
            EXPECT_TRUE(stored == stored && stored > 0.0f);
        }
    }
    /* MLA latents take per-tensor fp8 only: CPU_MLA says why */
    {
        attn_layer_desc m;
        attn_selection s;
        memset(&m, 0, sizeof m);
        m.num_heads = 16; m.head_size = 576; m.use_mla = 1; m.dtype = ATTN_DTYPE_BF16;
        m.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3; m.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
        EXPECT_TRUE(attn_select_backend(ctx, &m, NULL, &s) != ATTN_OK);
        for (i = 0; i < s.num_skipped && i < ATTN_SELECTION_MAX_SKIPPED; i++)
            if (s.skipped[i].backend == ATTN_BACKEND_CPU_MLA)
                EXPECT_TRUE(strstr(s.skipped[i].reason, "per-token-head scales not supported") != NULL);
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* Scales by pointer are read at every call; bad scales are named errors that change nothing. */
ATTN_TEST(test_forward_fp8_scales) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 1);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md;
    attn_batch b;
    enum { H = 2, D = 64, BS = 16, NB = 2, L = 20 };
    int32_t qsl[2] = {0, 1}, seq[1] = {L}, bt[NB] = {1, 0};
    int64_t slots[L], shape[ATTN_MAX_DIMS];
    float kv_f[L * H * D], q_f[H * D], out1[H * D], out2[H * D], outb[H * D], lse[H];
    uint8_t cache[NB * 2 * BS * H * D], cache_copy[sizeof cache];
    float ks = 0.01f, vs = 0.02f, bad;
    int i, ndim;
    attn_tensor tq, tk, tv, tc, to, tl;
    attn_status st;
    rng r = {77};
    const float bads[] = {0.0f, -1.0f, NAN, INFINITY};
    if (!ctx) { attn_test_fail(__FILE__, __LINE__, "context"); return; }
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = H; d.head_size = D; d.dtype = ATTN_DTYPE_F32;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3; d.block_size = BS;
    /* at create: a scale is required, finite and > 0; a pointer must be declared on the layer's device */
    for (i = 0; i < 4; i++) {
        d.k_scale.value = bads[i]; d.v_scale.value = 1.0f;
        EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "k_scale.value") != NULL);
        d.k_scale.value = 1.0f; d.v_scale.value = bads[i];
        EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "v_scale.value") != NULL);
    }
    d.v_scale.value = 1.0f;
    d.k_scale.value = 0.0f; d.k_scale.ptr = &ks; d.k_scale.device = ATTN_DEVICE_CUDA;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "k_scale.ptr") != NULL);
    d.k_scale.device = (attn_device_kind)5;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    d.dtype = ATTN_DTYPE_FP8_E4M3; d.k_scale.device = ATTN_DEVICE_CPU; /* q in fp8: no */
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "KV-cache type") != NULL);
    d.dtype = ATTN_DTYPE_F32;
    d.v_scale.value = 0.0f; d.v_scale.ptr = &vs;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (!layer) { attn_context_destroy(ctx); return; }
    EXPECT_OK(attn_layer_kv_cache_shape(layer, NB, shape, &ndim));
    EXPECT_TRUE(ndim == 5 && shape[4] == D);

    for (i = 0; i < L * H * D; i++) kv_f[i] = rng_uniform(&r, -1.0f, 1.0f);
    for (i = 0; i < H * D; i++) q_f[i] = rng_uniform(&r, -1.0f, 1.0f);
    for (i = 0; i < L; i++) slots[i] = (int64_t)bt[i / BS] * BS + i % BS;
    memset(cache, 0x7f, sizeof cache);
    tc = attn_tensor_make(cache, ATTN_DTYPE_FP8_E4M3, ndim, shape);
    shape[0] = L; shape[1] = H; shape[2] = D;
    tk = attn_tensor_make(kv_f, ATTN_DTYPE_F32, 3, shape);
    tv = tk;
    shape[0] = 1;
    tq = attn_tensor_make(q_f, ATTN_DTYPE_F32, 3, shape);
    to = attn_tensor_make(out1, ATTN_DTYPE_F32, 3, shape);
    tl = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, shape);
    EXPECT_OK(attn_reshape_and_cache(layer, &tk, &tv, &tc, ATTN_TEST_SLOTS(slots, L), NULL));
    /* the cache holds x / scale: K with k_scale, V with v_scale */
    EXPECT_EQ_INT(cache[(size_t)(1 * 2 + 0) * BS * H * D], attn_f32_to_fp8_e4m3(kv_f[0] / ks));
    EXPECT_EQ_INT(cache[(size_t)(1 * 2 + 1) * BS * H * D], attn_f32_to_fp8_e4m3(kv_f[0] / vs));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = NB; md.num_blocks = NB;
    EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = NB;
    b.slot_mapping = slots + L - 1; b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = L;
    if (meta) EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
    EXPECT_OK(attn_layer_forward(layer, meta, &tq, NULL, NULL, &tc, &to, &tl, NULL));
    /* a new v_scale through the pointer: the same codes now mean values twice as large */
    vs *= 2;
    to.data = out2;
    EXPECT_OK(attn_layer_forward(layer, meta, &tq, NULL, NULL, &tc, &to, &tl, NULL));
    for (i = 0; i < H * D; i++) EXPECT_NEAR(out2[i], 2 * out1[i], 1e-6, 1e-6);
    /* bad values behind the pointers: named errors; the cache and the output unchanged */
    memcpy(cache_copy, cache, sizeof cache);
    for (i = 0; i < 4; i++) {
        float saved = vs;
        bad = bads[i];
        vs = bad;
        memset(outb, 0x55, sizeof outb);
        to.data = outb;
        st = attn_layer_forward(layer, meta, &tq, &tk, &tv, &tc, &to, &tl, NULL);
        EXPECT_STATUS(st, ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "v_scale.ptr holds") != NULL);
        EXPECT_STATUS(attn_reshape_and_cache(layer, &tk, &tv, &tc, ATTN_TEST_SLOTS(slots, L), NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(memcmp(cache, cache_copy, sizeof cache) == 0);
        EXPECT_TRUE(((const uint8_t *)outb)[0] == 0x55 && ((const uint8_t *)outb)[sizeof outb - 1] == 0x55);
        vs = saved;
    }
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
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

/* Attention sinks (desc.sinks) on gpt-oss's shapes: 64 query heads over 8 KV heads of 64,
   bf16, layers alternating a 128-token window and full attention; then a long decode split
   across threads (the sink counted once, after the merge) and an fp8 cache. Against float64
   with the sink in the denominator and the LSE. */
ATTN_TEST(test_forward_sinks) {
    rng r = {0x51ab};
    fcase c;
    fresult res;
    int w;
    memset(&c, 0, sizeof c);
    c.num_heads = 64; c.num_kv_heads = 8; c.head_size = 64; c.block_size = 16;
    c.dtype = ATTN_DTYPE_BF16; c.kv_dtype = ATTN_DTYPE_BF16; c.causal = ATTN_CAUSAL_YES;
    c.threads = 2; c.num_reqs = 4; c.write_in_forward = 1; c.sinks = 1;
    c.qlen[0] = 1; c.slen[0] = 700;
    c.qlen[1] = 1; c.slen[1] = 90;
    c.qlen[2] = 150; c.slen[2] = 150;
    c.qlen[3] = 40; c.slen[3] = 400;
    for (w = 0; w < 2; w++) {
        c.window = w ? 0 : 128;
        res = run_case(&c, &r, 0);
        EXPECT_EQ_INT(res.failures, 0);
    }
    memset(&c, 0, sizeof c);
    c.num_heads = 8; c.num_kv_heads = 1; c.head_size = 128; c.block_size = 32;
    c.dtype = ATTN_DTYPE_F32; c.kv_dtype = ATTN_DTYPE_F32; c.causal = ATTN_CAUSAL_YES;
    c.threads = 3; c.num_reqs = 1; c.write_in_forward = 1; c.sinks = 1;
    c.qlen[0] = 1; c.slen[0] = 5000;
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
    c.dtype = ATTN_DTYPE_BF16; c.kv_dtype = ATTN_DTYPE_FP8_E4M3; c.k_scale = 0.01f; c.v_scale = 0.02f;
    c.num_heads = 16; c.num_kv_heads = 4; c.num_reqs = 2; c.qlen[1] = 30; c.slen[1] = 300;
    res = run_case(&c, &r, 0);
    EXPECT_EQ_INT(res.failures, 0);
}

/* Cascade attention (common_prefix_len): requests sharing their first blocks, the prefix
   attended by every query row in one pass and joined by LSE with each request's own keys.
   Against float64 on decodes, speculative verification steps (3 and 8 tokens) and a chunk,
   GQA and MQA, f32 and bf16, sinks, soft cap, ALiBi, non-causal, 8-bit caches (fp8 per
   tensor, int8 per token and head), a long suffix split across threads, and a window (where
   the CPU backend runs without the cascade: every row must still see exactly its keys). */
ATTN_TEST(test_forward_cascade) {
    rng r = {0xca5c};
    fcase c;
    fresult res;
    int k, i;
    for (k = 0; k < 9; k++) {
        memset(&c, 0, sizeof c);
        c.num_heads = k % 3 == 2 ? 8 : 16; c.num_kv_heads = k % 3 == 2 ? 1 : 4; c.head_size = k % 2 ? 64 : 128;
        c.block_size = k == 4 ? 32 : 16;
        c.dtype = c.kv_dtype = k % 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32;
        c.causal = k == 5 ? ATTN_CAUSAL_NO : ATTN_CAUSAL_YES;
        c.threads = 1 + k % 3; c.write_in_forward = k % 2;
        c.sinks = k % 3 == 1;
        c.soft_cap = k == 3 ? 20.0f : 0.0f;
        c.alibi = k == 3;
        c.window = k == 8 ? 100 : 0;
        if (k == 6) { c.dtype = ATTN_DTYPE_BF16; c.kv_dtype = ATTN_DTYPE_FP8_E4M3; c.k_scale = 0.01f; c.v_scale = 0.02f; }
        if (k == 7) { c.dtype = ATTN_DTYPE_F16; c.kv_dtype = ATTN_DTYPE_INT8; c.per_token_head = 1; }
        c.prefix = c.block_size * (k == 2 ? 40 : 12);
        c.num_reqs = k == 2 ? 2 : 10;
        for (i = 0; i < c.num_reqs; i++) {
            const int own = rng_int(&r, 1, k == 2 ? 3000 : 300);
            c.qlen[i] = i == 3 ? 3 : i == 5 ? 8 : i == 7 ? 40 : 1;
            if (c.qlen[i] > own) c.qlen[i] = own;
            c.slen[i] = c.prefix + own;
        }
        res = run_case(&c, &r, 0);
        if (res.failures) {
            char buf[512];
            describe(&c, buf, sizeof buf);
            attn_test_fail(__FILE__, __LINE__, "cascade case %d (prefix %d): %d elements off, max err %.3g: %s", k,
                           c.prefix, res.failures, res.max_err, buf);
        }
    }
}

/* desc.sinks is read at every call: a layer with sinks against the same layer without, on
   one cache and batch, row by row (lse_s = log(e^lse + e^sink), out_s = out e^(lse - lse_s));
   new values written into the array take effect at the next call; a NaN is refused by name
   at the call (nothing written) and at create. */
ATTN_TEST(test_forward_sinks_read_every_call) {
    enum { H = 4, HK = 2, D = 32, BS = 16, NB = 8 };
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 2);
    attn_layer_desc d;
    attn_layer *plain = NULL, *sunk = NULL, *bad = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md;
    attn_batch b;
    float sinks[H] = {0.5f, -1.0f, 2.0f, 9.0f};
    static float cache[NB * 2 * BS * HK * D], q[6 * H * D], out0[6 * H * D], out1[6 * H * D], lse0[6 * H], lse1[6 * H];
    int32_t qsl[3] = {0, 1, 6}, seq[2] = {40, 5}, bt[2 * 4] = {3, 0, 6, 1, 5, 2, 4, 7};
    int64_t shape[ATTN_MAX_DIMS];
    int ndim, i, x, round;
    rng r = {77};
    attn_tensor tq, to0, to1, tl0, tl1, tc;
    REQUIRE(ctx != NULL);
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HK; d.head_size = D; d.dtype = ATTN_DTYPE_F32; d.block_size = BS;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &plain));
    d.sinks = sinks;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &sunk));
    REQUIRE(plain && sunk);
    for (i = 0; i < NB * 2 * BS * HK * D; i++) cache[i] = rng_uniform(&r, -1.0f, 1.0f);
    for (i = 0; i < 6 * H * D; i++) q[i] = rng_uniform(&r, -1.0f, 1.0f);
    EXPECT_OK(attn_layer_kv_cache_shape(plain, NB, shape, &ndim));
    tc = attn_tensor_make(cache, ATTN_DTYPE_F32, ndim, shape);
    shape[0] = 6; shape[1] = H; shape[2] = D;
    tq = attn_tensor_make(q, ATTN_DTYPE_F32, 3, shape);
    to0 = attn_tensor_make(out0, ATTN_DTYPE_F32, 3, shape);
    to1 = attn_tensor_make(out1, ATTN_DTYPE_F32, 3, shape);
    tl0 = attn_tensor_make(lse0, ATTN_DTYPE_F32, 2, shape);
    tl1 = attn_tensor_make(lse1, ATTN_DTYPE_F32, 2, shape);
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 2; md.max_num_tokens = 6; md.max_blocks_per_req = 4; md.num_blocks = NB;
    EXPECT_OK(attn_metadata_create(plain, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 4;
    b.num_reqs = 2; b.num_actual_tokens = 6; b.max_query_len = 5; b.max_seq_len = 40;
    REQUIRE(meta != NULL);
    EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
    EXPECT_OK(attn_layer_forward(plain, meta, &tq, NULL, NULL, &tc, &to0, &tl0, NULL));
    for (round = 0; round < 2; round++) {
        if (round) for (i = 0; i < H; i++) sinks[i] = 3.0f - 1.5f * (float)i; /* new values, same array */
        EXPECT_OK(attn_layer_forward(sunk, meta, &tq, NULL, NULL, &tc, &to1, &tl1, NULL));
        for (i = 0; i < 6 * H; i++) {
            const double s = sinks[i % H], l0 = lse0[i], ls = l0 > s ? l0 + log1p(exp(s - l0)) : s + log1p(exp(l0 - s));
            if (!attn_test_near(lse1[i], ls, 1e-5, 1e-5))
                attn_test_fail(__FILE__, __LINE__, "round %d row %d head %d: lse %.7g, expected %.7g", round, i / H,
                               i % H, (double)lse1[i], ls);
            for (x = 0; x < D; x++)
                if (!attn_test_near(out1[i * D + x], out0[i * D + x] * exp(l0 - ls), 1e-5, 1e-4)) {
                    attn_test_fail(__FILE__, __LINE__, "round %d row %d head %d [%d]: out %.7g, expected %.7g", round,
                                   i / H, i % H, x, (double)out1[i * D + x], out0[i * D + x] * exp(l0 - ls));
                    break;
                }
        }
    }
    /* a NaN now: refused at the call by name, nothing written */
    sinks[2] = NAN;
    for (i = 0; i < 6 * H * D; i++) out1[i] = -7.0f;
    EXPECT_STATUS(attn_layer_forward(sunk, meta, &tq, NULL, NULL, &tc, &to1, &tl1, NULL), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "desc.sinks[2]") != NULL);
    for (i = 0; i < 6 * H * D; i++)
        if (out1[i] != -7.0f) { attn_test_fail(__FILE__, __LINE__, "out[%d] written by a refused call", i); break; }
    /* and at create */
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &bad), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(bad == NULL && strstr(attn_context_last_error(ctx), "desc.sinks[2] is nan") != NULL);
    sinks[2] = INFINITY;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &bad), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(bad == NULL);
    attn_metadata_destroy(meta);
    attn_layer_destroy(plain);
    attn_layer_destroy(sunk);
    attn_context_destroy(ctx);
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
    ATTN_RUN(test_fp8_all_codes_both_ways);
    ATTN_RUN(test_fp8_rounding_matches_search);
    ATTN_RUN(test_bf16_rounding_matches_search);
}

void suite_forward(void) {
    ATTN_RUN(test_forward_llama_shapes);
    ATTN_RUN(test_forward_all_head_sizes);
    ATTN_RUN(test_forward_split_kv_decode);
    ATTN_RUN(test_forward_sinks);
    ATTN_RUN(test_forward_sinks_read_every_call);
    ATTN_RUN(test_forward_cascade);
    ATTN_RUN(test_forward_many_kv_heads_decode);
    ATTN_RUN(test_forward_batch_invariant);
    ATTN_RUN(test_forward_window_edges);
    ATTN_RUN(test_forward_random_cases);
    ATTN_RUN(test_forward_fp8_random_cases);
    ATTN_RUN(test_forward_fp8_scales);
    ATTN_RUN(test_forward_per_token_head_random_cases);
    ATTN_RUN(test_forward_per_token_head_layout);
}
