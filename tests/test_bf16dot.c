/* ATTN_CPU_BF16_DOT: the opt-in decode QK on bf16 caches with vdpbf16ps (q rounded to bf16).
   This file holds a private copy of the library (ATTN_STATIC) built with the switch on, so
   the other test files keep the default build. Where the build has no AVX512-BF16 the
   switch does nothing and the exact path must come out. Each output is checked twice
   against float64: tightly against a reference whose scaled q is rounded to bf16 as the
   kernel does (the kernel is right), and against the exact reference within a bound made
   from that rounding (what a user of the switch gives up). */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic ignored "-Wunused-function" /* the private copy's unused functions */
#endif
#define ATTN_STATIC
#define ATTN_IMPLEMENTATION
#define ATTN_CPU_BF16_DOT
#include "attn.h"
#include "attn_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BF_MAX_REQS 4

typedef struct {
    int num_heads, num_kv_heads, head_size, num_reqs, qlen[BF_MAX_REQS], slen[BF_MAX_REQS];
} bf_case;

static uint64_t bf_rng_state = 0x243f6a8885a308d3ull;
static float bf_uniform(void) { /* [-1, 1) */
    uint64_t x = bf_rng_state;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    bf_rng_state = x;
    return (float)((double)(x >> 40) / (double)(1u << 23) - 1.0);
}

/* Runs one case; returns the number of failed elements. */
static int bf_run(const bf_case *c, int rounded_path) {
    const int H = c->num_heads, HK = c->num_kv_heads, D = c->head_size, G = H / HK, bs = 16;
    const double scale = 1.0 / sqrt((double)D), log2e = 1.4426950408889634;
    const float qscale = (1.0f / sqrtf((float)D)) * 1.4426950408889634f; /* the layer's default scale, base 2 */
    attn_context_desc cd;
    attn_context *ctx = NULL;
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch b;
    attn_tensor tq, tout, tcache;
    int64_t shape[ATTN_MAX_DIMS];
    int32_t qsl[BF_MAX_REQS + 1], seq[BF_MAX_REQS], *bt;
    int i, t, h, j, x, ndim = 0, nblocks = 0, stride = 0, ntok, maxq = 0, maxs = 0, failures = 0;
    uint16_t *cache;
    float *q, *out;
    double *logit, *logit_exact, *acc, *acc_exact;

    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    cd.log_level = ATTN_LOG_LEVEL_WARN;
    EXPECT_OK(attn_context_create(&cd, &ctx));
    if (!ctx) return 1;
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HK; d.head_size = D; d.block_size = bs;
    d.dtype = ATTN_DTYPE_F32; d.kv_cache_dtype = ATTN_DTYPE_BF16; d.causal = ATTN_CAUSAL_YES;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (!layer) { attn_context_destroy(ctx); return 1; }

    qsl[0] = 0;
    for (i = 0; i < c->num_reqs; i++) {
        int nb = (c->slen[i] + bs - 1) / bs;
        qsl[i + 1] = qsl[i] + c->qlen[i];
        seq[i] = c->slen[i];
        if (nb > stride) stride = nb;
        if (c->qlen[i] > maxq) maxq = c->qlen[i];
        if (c->slen[i] > maxs) maxs = c->slen[i];
    }
    ntok = qsl[c->num_reqs];
    nblocks = stride * c->num_reqs;
    bt = (int32_t *)malloc((size_t)nblocks * sizeof(int32_t));
    for (i = 0; i < nblocks; i++) bt[i] = (i * 7 + 3) % nblocks; /* scattered blocks; 7 and the counts are coprime */
    EXPECT_OK(attn_layer_kv_cache_shape(layer, nblocks, shape, &ndim));
    cache = (uint16_t *)malloc((size_t)nblocks * 2 * (size_t)bs * (size_t)HK * (size_t)D * sizeof(uint16_t));
    for (x = 0; x < nblocks * 2 * bs * HK * D; x++) cache[x] = attn_f32_to_bf16(bf_uniform());
    tcache = attn_tensor_make(cache, ATTN_DTYPE_BF16, ndim, shape);
    q = (float *)malloc((size_t)ntok * (size_t)H * (size_t)D * sizeof(float));
    out = (float *)malloc((size_t)ntok * (size_t)H * (size_t)D * sizeof(float));
    for (x = 0; x < ntok * H * D; x++) { q[x] = bf_uniform(); out[x] = NAN; }
    shape[0] = ntok; shape[1] = H; shape[2] = D;
    tq = attn_tensor_make(q, ATTN_DTYPE_F32, 3, shape);
    tout = attn_tensor_make(out, ATTN_DTYPE_F32, 3, shape);

    memset(&md, 0, sizeof md);
    md.max_num_reqs = c->num_reqs;
    md.max_num_tokens = ntok;
    md.max_blocks_per_req = stride;
    md.num_blocks = nblocks;
    EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = stride;
    b.num_reqs = c->num_reqs; b.num_actual_tokens = ntok; b.max_query_len = maxq; b.max_seq_len = maxs;
    b.causal = ATTN_CAUSAL_YES;
    if (meta) EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
    if (meta) EXPECT_OK(attn_layer_forward(layer, meta, &tq, NULL, NULL, &tcache, &tout, NULL, NULL));

    logit = (double *)malloc((size_t)maxs * sizeof(double));
    logit_exact = (double *)malloc((size_t)maxs * sizeof(double));
    acc = (double *)malloc((size_t)D * sizeof(double));
    acc_exact = (double *)malloc((size_t)D * sizeof(double));
    for (i = 0; i < c->num_reqs; i++)
        for (t = 0; t < c->qlen[i]; t++) {
            int row = qsl[i] + t, pos = c->slen[i] - c->qlen[i] + t;
            for (h = 0; h < H; h++) {
                const float *qr = q + ((size_t)row * (size_t)H + (size_t)h) * (size_t)D;
                double mx = -INFINITY, mx_exact = -INFINITY, sum = 0, sum_exact = 0, ds = 0, vmax = 0;
                for (j = 0; j <= pos; j++) { /* base-2 logits, as the kernel scales q */
                    size_t kr = (((size_t)bt[i * stride + j / bs] * 2 * (size_t)bs + (size_t)(j % bs)) * (size_t)HK +
                                 (size_t)(h / G)) * (size_t)D;
                    double s = 0, s_exact = 0, mag = 0;
                    for (x = 0; x < D; x++) {
                        float qs = qr[x] * qscale, qb = attn_bf16_to_f32(attn_f32_to_bf16(qs)); /* as the kernel */
                        double k = (double)attn_bf16_to_f32(cache[kr + (size_t)x]);
                        s += (rounded_path ? (double)qb : (double)qs) * k;
                        s_exact += (double)qr[x] * scale * log2e * k;
                        mag += fabs((double)qs * k);
                    }
                    logit[j] = s;
                    logit_exact[j] = s_exact;
                    if (s > mx) mx = s;
                    if (s_exact > mx_exact) mx_exact = s_exact;
                    if (ldexp(mag, -8) > ds) ds = ldexp(mag, -8); /* bf16 RNE: 2^-9 relative, doubled */
                }
                for (x = 0; x < D; x++) acc[x] = acc_exact[x] = 0;
                for (j = 0; j <= pos; j++) {
                    size_t vr = (((size_t)bt[i * stride + j / bs] * 2 * (size_t)bs + (size_t)bs + (size_t)(j % bs)) *
                                 (size_t)HK + (size_t)(h / G)) * (size_t)D;
                    double p = exp2(logit[j] - mx), pe = exp2(logit_exact[j] - mx_exact);
                    sum += p;
                    sum_exact += pe;
                    for (x = 0; x < D; x++) {
                        double v = (double)attn_bf16_to_f32(cache[vr + (size_t)x]);
                        acc[x] += p * v;
                        acc_exact[x] += pe * v;
                        if (fabs(v) > vmax) vmax = fabs(v);
                    }
                }
                for (x = 0; x < D; x++) {
                    double got = out[((size_t)row * (size_t)H + (size_t)h) * (size_t)D + (size_t)x];
                    double want = acc[x] / sum, want_exact = acc_exact[x] / sum_exact;
                    /* a logit error of e (base 2) moves an output by at most 2 ln2 e max|v| */
                    double bound = 2.0 * 0.6931471805599453 * ds * vmax + 3e-5;
                    if (!attn_test_near(got, want, 1e-5, 1e-4) || !(fabs(got - want_exact) <= bound)) {
                        if (failures < 3)
                            attn_test_fail(__FILE__, __LINE__,
                                           "H=%d HK=%d D=%d req %d tok %d head %d [%d]: %.7g, reference %.7g "
                                           "(q %s), exact-q reference %.7g within %.3g",
                                           H, HK, D, i, t, h, x, got, want, rounded_path ? "rounded to bf16" : "exact",
                                           want_exact, bound);
                        failures++;
                    }
                }
            }
        }
    free(logit); free(logit_exact); free(acc); free(acc_exact);
    free(bt); free(cache); free(q); free(out);
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    return failures;
}

/* Decodes (splits, tail keys, several tiles), a group of 3 (tail rows), two query tokens
   (8 rows per KV head), and a head size the path does not take (96: exact). */
ATTN_TEST(test_bf16dot_decode) {
    static const bf_case cases[] = {
        {8, 2, 128, 3, {1, 1, 1}, {1, 301, 3000}},
        {6, 2, 64, 2, {1, 1}, {777, 64}},
        {8, 2, 128, 2, {2, 1}, {200, 45}},
        {8, 1, 96, 1, {1}, {500}},
    };
    size_t k;
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const bf_case *c = &cases[k];
        EXPECT_EQ_INT(bf_run(c, ATTN__CPU_BF16_DOT_ON && c->head_size % 32 == 0), 0);
    }
}

/* The 8-bit caches' row loaders (the SIMD paths of this build: AVX-512, AVX2 or plain C, the
   vector loop and its scalar tail) against the scalar conversions, every code, bit for bit
   (NaN codes NaN): what the decode kernels read from an fp8/int8 cache. */
ATTN_TEST(test_8bit_row_loaders_exact) {
    static const attn_dtype types[] = {ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2, ATTN_DTYPE_INT8};
    uint8_t codes[256 + 7];
    float got[256 + 7];
    int t, i, n;
    for (i = 0; i < 256 + 7; i++) codes[i] = (uint8_t)(i * 37 + 11); /* every code, then a tail */
    for (t = 0; t < 3; t++)
        for (n = 256 + 7; n >= 250; n -= 13) { /* lengths with and without a scalar tail */
            memset(got, 0, sizeof got);
            attn__dtypes[types[t]].load_row(codes, got, n);
            for (i = 0; i < n; i++) {
                float want = types[t] == ATTN_DTYPE_FP8_E4M3   ? attn_fp8_e4m3_to_f32(codes[i])
                             : types[t] == ATTN_DTYPE_FP8_E5M2 ? attn_fp8_e5m2_to_f32(codes[i])
                                                               : (float)(int8_t)codes[i];
                if (!(got[i] == want || (got[i] != got[i] && want != want)) ||
                    (want == 0.0f && signbit(got[i]) != signbit(want))) {
                    attn_test_fail(__FILE__, __LINE__, "%s row loader: code 0x%02x -> %g, want %g",
                                   attn_dtype_name(types[t]), codes[i], (double)got[i], (double)want);
                    break;
                }
            }
        }
}

void suite_bf16dot(void) {
    ATTN_RUN(test_bf16dot_decode);
    ATTN_RUN(test_8bit_row_loaders_exact);
}
