/* MLA (DeepSeek multi-head latent attention) on the CPU_MLA backend against a float64
   reference of the *unabsorbed* definition: per head, K = [kv_c . W_UK^T | k_pe] and
   V = kv_c . W_UV are up-projected for every key, then causal softmax attention. The
   library's absorbed decode (forward_mqa, both q forms), its chunked up-projected prefill
   (forward_mha) and the fused layer call are checked against it; plus split-KV
   invariance, batch invariance, LSE merging, attn_reorder_batch, and rejections (status
   and log item, never message text). Inputs are random and never zero; every output is
   poisoned with NaN before a call. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The fixed DeepSeek head dimensions (compile-time, so the reference loops vectorise). */
#define NOPE 128
#define ROPE 64
#define VDIM 128
#define MAXR 16

/* ---- small helpers ------------------------------------------------------------------ */

typedef struct rng {
    uint64_t s;
} rng;
static uint64_t rng_next(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}
static void rng_seed(rng *r, uint64_t seed) {
    int i;
    r->s = seed ? seed : 0x2545f4914f6cdd1dull;
    for (i = 0; i < 4; i++) rng_next(r);
}
static int rng_int(rng *r, int lo, int hi) { /* inclusive */
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}
static float rng_uniform(rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next(r) >> 40) * (1.0 / 16777216.0));
}
/* Never exactly zero. */
static float rng_nz(rng *r, float a) {
    float x = rng_uniform(r, -a, a);
    return x == 0.0f ? a * 0.5f : x;
}

static float round_to(attn_dtype dt, float x) {
    switch (dt) {
    case ATTN_DTYPE_F16:
        return attn_f16_to_f32(attn_f32_to_f16(x));
    case ATTN_DTYPE_BF16:
        return attn_bf16_to_f32(attn_f32_to_bf16(x));
    default:
        return x;
    }
}
static void put(void *p, attn_dtype dt, size_t i, float x) {
    switch (dt) {
    case ATTN_DTYPE_F32:
        ((float *)p)[i] = x;
        break;
    case ATTN_DTYPE_FP8_E4M3: /* codes, unscaled */
        ((uint8_t *)p)[i] = attn_f32_to_fp8_e4m3(x);
        break;
    case ATTN_DTYPE_FP8_E5M2:
        ((uint8_t *)p)[i] = attn_f32_to_fp8_e5m2(x);
        break;
    case ATTN_DTYPE_F16:
        ((uint16_t *)p)[i] = attn_f32_to_f16(x);
        break;
    default:
        ((uint16_t *)p)[i] = attn_f32_to_bf16(x);
        break;
    }
}
static float get(const void *p, attn_dtype dt, size_t i) {
    switch (dt) {
    case ATTN_DTYPE_F32:
        return ((const float *)p)[i];
    case ATTN_DTYPE_F16:
        return attn_f16_to_f32(((const uint16_t *)p)[i]);
    case ATTN_DTYPE_FP8_E4M3: /* the code's value, unscaled */
        return attn_fp8_e4m3_to_f32(((const uint8_t *)p)[i]);
    case ATTN_DTYPE_FP8_E5M2:
        return attn_fp8_e5m2_to_f32(((const uint8_t *)p)[i]);
    default:
        return attn_bf16_to_f32(((const uint16_t *)p)[i]);
    }
}
/* The latent value a cache of type dt with scale s holds for x (fp8: code(x / s) * s) */
static float latent_value(attn_dtype dt, float s, float x) {
    return attn_test_is_8bit(dt) ? attn_test_fp8_value(dt, s, x) : round_to(dt, x);
}
static void poison(void *p, attn_dtype dt, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (dt == ATTN_DTYPE_F32)
            ((float *)p)[i] = NAN;
        else if (attn_test_is_8bit(dt))
            ((uint8_t *)p)[i] = 0x7fu; /* NaN in both fp8 formats */
        else
            ((uint16_t *)p)[i] = dt == ATTN_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
    }
}
static int is_finite(float x) { return x - x == 0.0f; }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_mla: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

/* ATTN_TEST_SCALE=0.25 shrinks the random cases and the long contexts. */
static int ctx_threads(attn_context *ctx) {
    attn_platform p;
    memset(&p, 0, sizeof p);
    if (attn_platform_get(ctx, &p) != ATTN_OK || p.cpu_threads < 1) return 1;
    return p.cpu_threads;
}

static double test_scale(void) {
    const char *s = getenv("ATTN_TEST_SCALE");
    double v = s ? atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}
static int scaled(int n, int min) {
    int v = (int)(n * test_scale());
    return v < min ? min : v;
}

/* Tolerances: abs is relative to the RMS of the reference row (outputs that average over
   thousands of keys are small), rel to the element. */
static void tol_for(attn_dtype dt, double *abs_tol, double *rel_tol, double *lse_tol) {
    if (dt == ATTN_DTYPE_F32) {
        *abs_tol = 1e-4;
        *rel_tol = 1e-4;
        *lse_tol = 1e-4;
    } else if (dt == ATTN_DTYPE_F16) {
        *abs_tol = 5e-3;
        *rel_tol = 5e-3;
        *lse_tol = 3e-3;
    } else {
        *abs_tol = 1.5e-2;
        *rel_tol = 1.5e-2;
        *lse_tol = 1.5e-2;
    }
}

/* A world's tolerances (after mworld). */
struct mworld;
static void world_tol(const struct mworld *w, double *abs_tol, double *rel_tol, double *lse_tol);

static attn_tensor t3(void *p, attn_dtype dt, int64_t a, int64_t b, int64_t c) {
    int64_t s[3];
    s[0] = a;
    s[1] = b;
    s[2] = c;
    return attn_tensor_make(p, dt, 3, s);
}
static attn_tensor t2(void *p, int64_t a, int64_t b) {
    int64_t s[2];
    s[0] = a;
    s[1] = b;
    return attn_tensor_make(p, ATTN_DTYPE_F32, 2, s);
}

/* ---- a test world: layer, weights, per-request latents and queries, cache, reference -- */

typedef struct mcfg {
    int H, R, bs; /* heads, kv_lora_rank, block size */
    attn_dtype dt, kvdt;
    int threads;
    int nreq, qlen[MAXR], slen[MAXR];
    int use_stream, stream[MAXR];     /* per-request PRNG stream ids (default: the index) */
    int alias[MAXR], alias_off[MAXR]; /* alias[i] = 1 + source: a decode over the source's
                                         latents [off, off + slen), with its last query */
    int nref;                         /* heads checked in float64 (0: all) */
    int decode_threshold;             /* of the metadata (0: 1) */
    int write_new;                    /* new tokens cached at init (else by the fused call) */
    int pad;                          /* extra rows in q/out tensors, never written */
    float scale;                      /* 0: default 1/sqrt(192) */
    uint64_t seed, wseed;
    attn_test_log *cap; /* NULL: the world's context logs nowhere */
    int no_ref;         /* skip the float64 reference */
    int64_t workspace_bytes; /* of the metadata (0: the default) */
    float ks;           /* fp8 latent caches: the scale, a power of two (so each latent
                           value, code * ks, is exact in dt and the cache write of it
                           reproduces the code) */
    int cuda;           /* a GPU world (1: CUDA_MLA_SM90, 2: CUDA_MLA forced), every
                           tensor a device copy of the host data (uploaded before a call,
                           outputs downloaded after) */
} mcfg;

typedef struct mworld {
    mcfg c;
    int ok;
    attn_context *ctx;
    attn_layer *layer;
    int D, ntok, nblocks, stride, thr;
    int32_t qsl[MAXR + 1], seq[MAXR];
    int32_t *bt;
    int64_t *slots;
    double scale;
    float *wuk, *wuv;        /* rounded: [H][NOPE][R], [H][R][VDIM] */
    void *wuk_raw, *wuv_raw; /* the layer dtype (aliases the floats for f32) */
    attn_tensor t_wuk, t_wuv;
    float *lat[MAXR];        /* [slen][D] as cached */
    float *qn, *qp;          /* [ntok][H][NOPE], [ntok][H][ROPE] rounded */
    void *qn_raw, *qp_raw;   /* [ntok + pad][H][..] in the layer dtype */
    void *kvc_raw, *kpe_raw; /* new tokens' latents [ntok][R], [ntok][ROPE] */
    void *cache;
    size_t cache_elems;
    attn_tensor t_cache;
    int nref, refh[256];
    double *ref_out, *ref_lat, *ref_lse; /* [ntok][nref][VDIM], [ntok][nref][R], [ntok][nref] */
    void *dev[8];                        /* GPU world: weights, cache (freed with the world) */
} mworld;

/* The CPU path rounds only its outputs to the layer's 16-bit type; the GPU path (like
   FlashMLA) also rounds q_latent, the softmax weights P before P.V and o_latent before
   W_UV, so its bounds are wider by GPU_TOL. */
#define GPU_TOL 2.0
static void world_tol(const struct mworld *w, double *abs_tol, double *rel_tol, double *lse_tol) {
    tol_for(w->c.dt, abs_tol, rel_tol, lse_tol);
    if (w->c.cuda) {
        *abs_tol *= GPU_TOL;
        *rel_tol *= GPU_TOL;
        *lse_tol *= GPU_TOL;
    }
}

/* ---- GPU worlds: device copies ------------------------------------------------------ */

/* A device copy of n bytes of host (or the host pointer itself in a CPU world); NULL on
   failure (a test failure). */
static void *wup(const mworld *w, const void *host, size_t n) {
    void *d = NULL;
    if (!w->c.cuda) return (void *)(uintptr_t)host;
    if (attn_cuda_malloc(w->ctx, n + 16, &d) != ATTN_OK ||
        attn_cuda_memcpy(w->ctx, d, host, n, ATTN_COPY_HOST_TO_DEVICE, NULL) != ATTN_OK) {
        attn_test_fail(__FILE__, __LINE__, "device copy of %zu bytes: %s", n, attn_context_last_error(w->ctx));
        attn_cuda_free(w->ctx, d);
        return NULL;
    }
    return d;
}
/* Back to the host (GPU world) and frees the device copy; a CPU world's pointer is the host's. */
static void wdown(const mworld *w, void *host, void *d, size_t n) {
    if (!w->c.cuda || !d) return;
    if (host && attn_cuda_memcpy(w->ctx, host, d, n, ATTN_COPY_DEVICE_TO_HOST, NULL) != ATTN_OK)
        attn_test_fail(__FILE__, __LINE__, "download of %zu bytes: %s", n, attn_context_last_error(w->ctx));
    attn_cuda_free(w->ctx, d);
}
/* t on the world's device. */
static attn_tensor won(const mworld *w, attn_tensor t) {
    if (w->c.cuda) t.device.kind = ATTN_DEVICE_CUDA;
    return t;
}
/* The world's cache back on the host (GPU world). */
static void wcache_down(mworld *w) {
    if (w->c.cuda)
        EXPECT_OK(attn_cuda_memcpy(w->ctx, w->cache, w->t_cache.data, w->cache_elems * attn_dtype_size(w->c.kvdt),
                                   ATTN_COPY_DEVICE_TO_HOST, NULL));
}
/* NULL where the CUDA MLA backend (fallback: CUDA_MLA, else CUDA_MLA_SM90) can run here,
   else why not. */
static const char *mla_cuda_unavailable_for(int fallback) {
    static char why[200];
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_ERROR, 1);
    attn_platform p;
    const char *r = NULL;
    memset(&p, 0, sizeof p);
    if (!ctx || attn_platform_get(ctx, &p) != ATTN_OK) r = "no context";
    else if (!attn_backend_get(ATTN_BACKEND_CUDA_MLA_SM90)) r = "the CUDA path is compiled out (ATTN_NO_CUDA)";
    else if (p.kind != ATTN_PLATFORM_CUDA) r = p.cuda_reason;
    else if (fallback && p.cuda_capability_major < 8) r = "CUDA_MLA needs compute capability 8.0 or newer";
    else if (!fallback && (p.cuda_capability_major != 9 || p.cuda_capability_minor != 0))
        r = "CUDA_MLA_SM90 needs compute capability 9.0";
    else if (!p.nvrtc_version) r = p.nvrtc_reason;
    else if (!p.cublas_version) r = p.cublas_reason;
    if (r) snprintf(why, sizeof why, "%s", r);
    attn_context_destroy(ctx);
    return r ? why : NULL;
}
#define MLA_CUDA_SKIP_FOR(fallback)                          \
    do {                                                     \
        const char *why_ = mla_cuda_unavailable_for(fallback); \
        if (why_) SKIP(why_);                                \
    } while (0)
#define MLA_CUDA_SKIP() MLA_CUDA_SKIP_FOR(0)

static uint64_t stream_seed(uint64_t seed, int id) {
    return seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(id + 1));
}

/* float64 reference of the unabsorbed attention for the checked heads. */
static void world_reference(mworld *w) {
    const mcfg *c = &w->c;
    int H = c->H, R = c->R, D = w->D, nref = w->nref, k, r, j, t, x, n;
    int maxs = 1;
    double *Wt, *Wv, *K, *V, *lg, *lrow;
    for (r = 0; r < c->nreq; r++)
        if (c->slen[r] > maxs) maxs = c->slen[r];
    Wt = (double *)xmalloc((size_t)R * NOPE * sizeof(double));
    Wv = (double *)xmalloc((size_t)R * VDIM * sizeof(double));
    K = (double *)xmalloc((size_t)maxs * NOPE * sizeof(double));
    V = (double *)xmalloc((size_t)maxs * VDIM * sizeof(double));
    lg = (double *)xmalloc((size_t)maxs * sizeof(double));
    lrow = (double *)xmalloc((size_t)4 * (size_t)R * sizeof(double));
    w->ref_out = (double *)xmalloc((size_t)w->ntok * (size_t)nref * VDIM * sizeof(double));
    w->ref_lat = (double *)xmalloc((size_t)w->ntok * (size_t)nref * (size_t)R * sizeof(double));
    w->ref_lse = (double *)xmalloc((size_t)w->ntok * (size_t)nref * sizeof(double));
    for (x = 0; x < w->ntok * nref * R; x++) w->ref_lat[x] = NAN;
    for (k = 0; k < nref; k++) {
        int h = w->refh[k];
        for (n = 0; n < NOPE; n++)
            for (x = 0; x < R; x++) Wt[(size_t)x * NOPE + n] = w->wuk[((size_t)h * NOPE + n) * (size_t)R + x];
        for (x = 0; x < R * VDIM; x++) Wv[x] = w->wuv[(size_t)h * (size_t)R * VDIM + x];
        for (r = 0; r < c->nreq; r++) {
            int S = c->slen[r], ql = c->qlen[r];
            /* per-key K_nope and V, four keys at a time */
            for (j = 0; j < S; j += 4) {
                int nb = S - j < 4 ? S - j : 4, b;
                double *Kb[4], *Vb[4];
                for (b = 0; b < 4; b++) {
                    int jj = j + (b < nb ? b : 0);
                    for (x = 0; x < R; x++) lrow[(size_t)b * R + x] = w->lat[r][(size_t)jj * D + x];
                    Kb[b] = K + (size_t)jj * NOPE;
                    Vb[b] = V + (size_t)jj * VDIM;
                }
                {
                    double k0[NOPE], k1[NOPE], k2[NOPE], k3[NOPE], v0[VDIM], v1[VDIM], v2[VDIM], v3[VDIM];
                    memset(k0, 0, sizeof k0);
                    memset(k1, 0, sizeof k1);
                    memset(k2, 0, sizeof k2);
                    memset(k3, 0, sizeof k3);
                    memset(v0, 0, sizeof v0);
                    memset(v1, 0, sizeof v1);
                    memset(v2, 0, sizeof v2);
                    memset(v3, 0, sizeof v3);
                    for (x = 0; x < R; x++) {
                        const double *wk = Wt + (size_t)x * NOPE, *wv = Wv + (size_t)x * VDIM;
                        double l0 = lrow[x], l1 = lrow[R + x], l2 = lrow[2 * R + x], l3 = lrow[3 * R + x];
                        for (n = 0; n < NOPE; n++) {
                            k0[n] += l0 * wk[n];
                            k1[n] += l1 * wk[n];
                            k2[n] += l2 * wk[n];
                            k3[n] += l3 * wk[n];
                        }
                        for (n = 0; n < VDIM; n++) {
                            v0[n] += l0 * wv[n];
                            v1[n] += l1 * wv[n];
                            v2[n] += l2 * wv[n];
                            v3[n] += l3 * wv[n];
                        }
                    }
                    /* written in reverse so a duplicated tail key keeps its own values */
                    for (b = nb - 1; b >= 0; b--) {
                        const double *ks = b == 0 ? k0 : b == 1 ? k1 : b == 2 ? k2 : k3;
                        const double *vs = b == 0 ? v0 : b == 1 ? v1 : b == 2 ? v2 : v3;
                        memcpy(Kb[b], ks, sizeof k0);
                        memcpy(Vb[b], vs, sizeof v0);
                    }
                }
            }
            for (t = 0; t < ql; t++) {
                int row = w->qsl[r] + t, pos = S - ql + t;
                const float *qn = w->qn + ((size_t)row * (size_t)H + (size_t)h) * NOPE;
                const float *qp = w->qp + ((size_t)row * (size_t)H + (size_t)h) * ROPE;
                double mx = -INFINITY, sum = 0, acc[VDIM];
                double *out = w->ref_out + ((size_t)row * (size_t)nref + (size_t)k) * VDIM;
                int want_lat = ql <= w->thr;
                double *olat = w->ref_lat + ((size_t)row * (size_t)nref + (size_t)k) * (size_t)R;
                for (j = 0; j <= pos; j++) {
                    double s = 0, s2 = 0;
                    const float *lj = w->lat[r] + (size_t)j * (size_t)D;
                    for (n = 0; n < NOPE; n++) s += (double)qn[n] * K[(size_t)j * NOPE + n];
                    for (n = 0; n < ROPE; n++) s2 += (double)qp[n] * (double)lj[R + n];
                    lg[j] = (s + s2) * w->scale;
                    if (lg[j] > mx) mx = lg[j];
                }
                for (n = 0; n < VDIM; n++) acc[n] = 0;
                if (want_lat)
                    for (x = 0; x < R; x++) olat[x] = 0;
                for (j = 0; j <= pos; j++) {
                    double p = exp(lg[j] - mx);
                    sum += p;
                    for (n = 0; n < VDIM; n++) acc[n] += p * V[(size_t)j * VDIM + n];
                    if (want_lat) {
                        const float *lj = w->lat[r] + (size_t)j * (size_t)D;
                        for (x = 0; x < R; x++) olat[x] += p * (double)lj[x];
                    }
                }
                for (n = 0; n < VDIM; n++) out[n] = acc[n] / sum;
                if (want_lat)
                    for (x = 0; x < R; x++) olat[x] /= sum;
                w->ref_lse[(size_t)row * (size_t)nref + (size_t)k] = mx + log(sum);
            }
        }
    }
    free(Wt);
    free(Wv);
    free(K);
    free(V);
    free(lg);
    free(lrow);
}

static void world_free(mworld *w) {
    int i;
    for (i = 0; i < MAXR; i++) free(w->lat[i]);
    if (w->wuk_raw != (void *)w->wuk) free(w->wuk_raw);
    if (w->wuv_raw != (void *)w->wuv) free(w->wuv_raw);
    free(w->wuk);
    free(w->wuv);
    free(w->qn);
    free(w->qp);
    free(w->qn_raw);
    free(w->qp_raw);
    free(w->kvc_raw);
    free(w->kpe_raw);
    free(w->cache);
    free(w->bt);
    free(w->slots);
    free(w->ref_out);
    free(w->ref_lat);
    free(w->ref_lse);
    if (w->c.cuda)
        for (i = 0; i < 8; i++) attn_cuda_free(w->ctx, w->dev[i]);
    attn_layer_destroy(w->layer);
    attn_context_destroy(w->ctx);
    memset(w, 0, sizeof *w);
}

/* Builds the world: layer, weights, data, cache with the context (and, if write_new, the
   new tokens) written through attn_concat_and_cache_mla, and the float64 reference. */
static int world_init(mworld *w, const mcfg *cfg) {
    mcfg *c;
    attn_layer_desc d;
    int H, R, D, i, t, x, h, maxnb = 0, nctx = 0, ndim;
    int64_t shape[ATTN_MAX_DIMS];
    size_t esz;
    rng wr, br;
    int32_t *perm;
    attn_status st;
    memset(w, 0, sizeof *w);
    w->c = *cfg;
    c = &w->c;
    H = c->H;
    R = c->R;
    D = w->D = R + ROPE;
    esz = attn_dtype_size(c->dt);
    w->thr = c->decode_threshold > 0 ? c->decode_threshold : 1;
    w->ctx = attn_test_context(c->cap, ATTN_LOG_LEVEL_DEBUG, c->threads);
    if (!w->ctx) {
        attn_test_fail(__FILE__, __LINE__, "context");
        return 0;
    }
    memset(&d, 0, sizeof d);
    d.use_mla = 1;
    d.num_heads = H;
    d.head_size = D;
    d.kv_lora_rank = R;
    d.qk_rope_head_dim = ROPE;
    d.qk_nope_head_dim = NOPE;
    d.v_head_dim = VDIM;
    d.dtype = c->dt;
    d.kv_cache_dtype = c->kvdt;
    if (attn_test_is_8bit(c->kvdt)) d.k_scale.value = c->ks;
    d.block_size = c->bs;
    d.scale = c->scale;
    d.device = c->cuda ? ATTN_DEVICE_CUDA : ATTN_DEVICE_CPU;
    {
        attn_select_request req; /* cuda 2: the mma.sync fallback forced */
        memset(&req, 0, sizeof req);
        req.backend = ATTN_BACKEND_CUDA_MLA;
        st = attn_layer_create(w->ctx, &d, c->cuda == 2 ? &req : NULL, &w->layer);
    }
    EXPECT_OK(st);
    if (st != ATTN_OK) return 0;
    EXPECT_EQ_INT(attn_layer_backend(w->layer)->id,
                  c->cuda == 2 ? ATTN_BACKEND_CUDA_MLA : c->cuda ? ATTN_BACKEND_CUDA_MLA_SM90 : ATTN_BACKEND_CPU_MLA);
    w->scale = c->scale > 0 ? (double)c->scale : 1.0 / sqrt((double)(NOPE + ROPE));
    EXPECT_NEAR(attn_layer_get_desc(w->layer)->scale, w->scale, 1e-7, 1e-6);

    /* weights ~ U(-a, a) with a = sqrt(3 / R): the projections keep unit-ish variance */
    rng_seed(&wr, c->wseed ? c->wseed : 0x5eedull);
    {
        size_t n = (size_t)H * NOPE * (size_t)R;
        float a = sqrtf(3.0f / (float)R);
        w->wuk = (float *)xmalloc(n * sizeof(float));
        w->wuv = (float *)xmalloc(n * sizeof(float));
        w->wuk_raw = c->dt == ATTN_DTYPE_F32 ? (void *)w->wuk : xmalloc(n * esz);
        w->wuv_raw = c->dt == ATTN_DTYPE_F32 ? (void *)w->wuv : xmalloc(n * esz);
        for (x = 0; x < (int)n; x++) {
            w->wuk[x] = round_to(c->dt, rng_nz(&wr, a));
            w->wuv[x] = round_to(c->dt, rng_nz(&wr, a));
            if (c->dt != ATTN_DTYPE_F32) {
                put(w->wuk_raw, c->dt, (size_t)x, w->wuk[x]);
                put(w->wuv_raw, c->dt, (size_t)x, w->wuv[x]);
            }
        }
        shape[0] = H;
        shape[1] = NOPE;
        shape[2] = R;
        w->dev[0] = c->cuda ? wup(w, w->wuk_raw, n * esz) : NULL;
        w->dev[1] = c->cuda ? wup(w, w->wuv_raw, n * esz) : NULL;
        w->t_wuk = won(w, attn_tensor_make(c->cuda ? w->dev[0] : w->wuk_raw, c->dt, 3, shape));
        shape[1] = R;
        shape[2] = VDIM;
        w->t_wuv = won(w, attn_tensor_make(c->cuda ? w->dev[1] : w->wuv_raw, c->dt, 3, shape));
    }

    w->qsl[0] = 0;
    for (i = 0; i < c->nreq; i++) {
        int nb = (c->slen[i] + c->bs - 1) / c->bs;
        w->qsl[i + 1] = w->qsl[i] + c->qlen[i];
        w->seq[i] = c->slen[i];
        w->nblocks += nb;
        if (nb > maxnb) maxnb = nb;
        nctx += c->slen[i] - c->qlen[i];
    }
    w->ntok = w->qsl[c->nreq];
    w->nblocks += 3;
    w->stride = maxnb + 2;

    /* per-request data, each from its own stream (the same values whatever the batch) */
    {
        size_t rows = (size_t)w->ntok + (size_t)c->pad + 1;
        w->qn = (float *)xmalloc(rows * (size_t)H * NOPE * sizeof(float));
        w->qp = (float *)xmalloc(rows * (size_t)H * ROPE * sizeof(float));
        w->qn_raw = xmalloc(rows * (size_t)H * NOPE * esz);
        w->qp_raw = xmalloc(rows * (size_t)H * ROPE * esz);
        for (i = 0; i < c->nreq; i++) {
            rng rr;
            size_t n = (size_t)c->slen[i] * (size_t)D;
            w->lat[i] = (float *)xmalloc(n * sizeof(float) + 4);
            if (c->alias[i]) continue;
            rng_seed(&rr, stream_seed(c->seed, c->use_stream ? c->stream[i] : i));
            for (x = 0; x < (int)n; x++) {
                w->lat[i][x] = latent_value(c->kvdt, c->ks, round_to(c->dt, rng_nz(&rr, 1.0f)));
                if (attn_test_is_8bit(c->kvdt) && round_to(c->dt, w->lat[i][x]) != w->lat[i][x]) /* see mcfg.ks */
                    attn_test_fail(__FILE__, __LINE__, "fp8 latent %g not exact in %s", (double)w->lat[i][x],
                                   attn_dtype_name(c->dt));
            }
            for (x = w->qsl[i] * H * NOPE; x < w->qsl[i + 1] * H * NOPE; x++)
                w->qn[x] = round_to(c->dt, rng_nz(&rr, 2.0f));
            for (x = w->qsl[i] * H * ROPE; x < w->qsl[i + 1] * H * ROPE; x++)
                w->qp[x] = round_to(c->dt, rng_nz(&rr, 2.0f));
        }
        for (i = 0; i < c->nreq; i++) {
            int src = c->alias[i] - 1, srow;
            if (!c->alias[i]) continue;
            memcpy(w->lat[i], w->lat[src] + (size_t)c->alias_off[i] * (size_t)D,
                   (size_t)c->slen[i] * (size_t)D * sizeof(float));
            srow = w->qsl[src + 1] - 1;
            memcpy(w->qn + (size_t)w->qsl[i] * H * NOPE, w->qn + (size_t)srow * H * NOPE,
                   (size_t)H * NOPE * sizeof(float));
            memcpy(w->qp + (size_t)w->qsl[i] * H * ROPE, w->qp + (size_t)srow * H * ROPE,
                   (size_t)H * ROPE * sizeof(float));
        }
        for (x = 0; x < w->ntok * H * NOPE; x++) put(w->qn_raw, c->dt, (size_t)x, w->qn[x]);
        for (x = 0; x < w->ntok * H * ROPE; x++) put(w->qp_raw, c->dt, (size_t)x, w->qp[x]);
        /* padding rows: finite values that no output may depend on */
        for (x = w->ntok * H * NOPE; x < (w->ntok + c->pad) * H * NOPE; x++)
            put(w->qn_raw, c->dt, (size_t)x, 0.5f);
        for (x = w->ntok * H * ROPE; x < (w->ntok + c->pad) * H * ROPE; x++)
            put(w->qp_raw, c->dt, (size_t)x, 0.5f);
    }

    /* block table: a random permutation of the blocks */
    rng_seed(&br, c->seed ^ 0xb10cb10cull);
    w->bt = (int32_t *)calloc((size_t)c->nreq * (size_t)w->stride + 1, sizeof(int32_t));
    perm = (int32_t *)xmalloc((size_t)w->nblocks * sizeof(int32_t));
    for (i = 0; i < w->nblocks; i++) perm[i] = i;
    for (i = w->nblocks - 1; i > 0; i--) {
        int k = rng_int(&br, 0, i), tmp = perm[i];
        perm[i] = perm[k];
        perm[k] = tmp;
    }
    {
        int next = 0, k;
        for (i = 0; i < c->nreq; i++) {
            int nb = (c->slen[i] + c->bs - 1) / c->bs;
            for (k = 0; k < nb; k++) w->bt[i * w->stride + k] = perm[next++];
            for (k = nb; k < w->stride; k++) w->bt[i * w->stride + k] = -5; /* never read */
        }
    }
    free(perm);
    st = attn_layer_kv_cache_shape(w->layer, w->nblocks, shape, &ndim);
    EXPECT_OK(st);
    EXPECT_EQ_INT(ndim, 3);
    EXPECT_EQ_INT(shape[0], w->nblocks);
    EXPECT_EQ_INT(shape[1], c->bs);
    EXPECT_EQ_INT(shape[2], D);
    w->cache_elems = (size_t)w->nblocks * (size_t)c->bs * (size_t)D;
    w->cache = xmalloc(w->cache_elems * attn_dtype_size(c->kvdt));
    poison(w->cache, c->kvdt, w->cache_elems);
    w->dev[2] = c->cuda ? wup(w, w->cache, w->cache_elems * attn_dtype_size(c->kvdt)) : NULL;
    w->t_cache = won(w, attn_tensor_make(c->cuda ? w->dev[2] : w->cache, c->kvdt, 3, shape));

    /* context latents through attn_concat_and_cache_mla */
    if (nctx > 0) {
        void *kc = xmalloc((size_t)nctx * (size_t)R * esz), *kp = xmalloc((size_t)nctx * ROPE * esz);
        int64_t *cs = (int64_t *)xmalloc((size_t)nctx * sizeof(int64_t));
        attn_tensor tkc, tkp;
        int row = 0;
        for (i = 0; i < c->nreq; i++)
            for (t = 0; t < c->slen[i] - c->qlen[i]; t++, row++) {
                cs[row] = (int64_t)w->bt[i * w->stride + t / c->bs] * c->bs + t % c->bs;
                for (x = 0; x < R; x++)
                    put(kc, c->dt, (size_t)row * (size_t)R + (size_t)x,
                        w->lat[i][(size_t)t * (size_t)D + (size_t)x]);
                for (x = 0; x < ROPE; x++)
                    put(kp, c->dt, (size_t)row * ROPE + (size_t)x,
                        w->lat[i][(size_t)t * (size_t)D + (size_t)R + (size_t)x]);
            }
        shape[0] = nctx;
        shape[1] = R;
        void *dkc = wup(w, kc, (size_t)nctx * (size_t)R * esz), *dkp = wup(w, kp, (size_t)nctx * ROPE * esz);
        tkc = won(w, attn_tensor_make(dkc, c->dt, 2, shape));
        shape[1] = ROPE;
        tkp = won(w, attn_tensor_make(dkp, c->dt, 2, shape));
        EXPECT_OK(attn_concat_and_cache_mla(w->layer, &tkc, &tkp, &w->t_cache, ATTN_TEST_SLOTS(cs, nctx), NULL));
        wdown(w, NULL, dkc, 0);
        wdown(w, NULL, dkp, 0);
        free(kc);
        free(kp);
        free(cs);
    }
    /* new tokens: their latents in batch order, and their slots */
    w->kvc_raw = xmalloc(((size_t)w->ntok + 1) * (size_t)R * esz);
    w->kpe_raw = xmalloc(((size_t)w->ntok + 1) * ROPE * esz);
    w->slots = (int64_t *)xmalloc(((size_t)w->ntok + 1) * sizeof(int64_t));
    for (i = 0; i < c->nreq; i++)
        for (t = 0; t < c->qlen[i]; t++) {
            int row = w->qsl[i] + t, pos = c->slen[i] - c->qlen[i] + t;
            w->slots[row] = (int64_t)w->bt[i * w->stride + pos / c->bs] * c->bs + pos % c->bs;
            for (x = 0; x < R; x++)
                put(w->kvc_raw, c->dt, (size_t)row * (size_t)R + (size_t)x,
                    w->lat[i][(size_t)pos * (size_t)D + (size_t)x]);
            for (x = 0; x < ROPE; x++)
                put(w->kpe_raw, c->dt, (size_t)row * ROPE + (size_t)x,
                    w->lat[i][(size_t)pos * (size_t)D + (size_t)R + (size_t)x]);
        }
    if (c->write_new && w->ntok > 0) {
        attn_tensor tkc, tkp;
        void *dkc = wup(w, w->kvc_raw, (size_t)w->ntok * (size_t)R * esz);
        void *dkp = wup(w, w->kpe_raw, (size_t)w->ntok * ROPE * esz);
        shape[0] = w->ntok;
        shape[1] = R;
        tkc = won(w, attn_tensor_make(dkc, c->dt, 2, shape));
        shape[1] = ROPE;
        tkp = won(w, attn_tensor_make(dkp, c->dt, 2, shape));
        EXPECT_OK(attn_concat_and_cache_mla(w->layer, &tkc, &tkp, &w->t_cache, ATTN_TEST_SLOTS(w->slots, w->ntok), NULL));
        wdown(w, NULL, dkc, 0);
        wdown(w, NULL, dkp, 0);
    }

    /* the heads checked in float64: all, or nref spread over [0, H) with both ends */
    w->nref = c->nref > 0 && c->nref < H ? c->nref : H;
    if (c->nref > 2 && test_scale() < 1.0) { /* fewer float64 heads in the reduced runs */
        int n = (int)(c->nref * test_scale() * 2 + 0.5);
        w->nref = n < 2 ? 2 : n > w->nref ? w->nref : n;
    }
    for (h = 0; h < w->nref; h++)
        w->refh[h] = w->nref == H ? h : (w->nref == 1 ? 0 : (int)((int64_t)h * (H - 1) / (w->nref - 1)));
    if (!c->no_ref) world_reference(w);
    w->ok = attn_test_current_failed() == 0;
    return w->ok;
}

static attn_batch world_batch(const mworld *w) {
    attn_batch b;
    int i, maxq = 0, maxs = 0;
    memset(&b, 0, sizeof b);
    for (i = 0; i < w->c.nreq; i++) {
        if (w->c.qlen[i] > maxq) maxq = w->c.qlen[i];
        if (w->c.slen[i] > maxs) maxs = w->c.slen[i];
    }
    b.query_start_loc = w->qsl;
    b.seq_lens = w->seq;
    b.block_table = w->bt;
    b.block_table_stride = w->stride;
    b.slot_mapping = w->slots;
    b.num_reqs = w->c.nreq;
    b.num_actual_tokens = w->ntok;
    b.max_query_len = maxq;
    b.max_seq_len = maxs;
    return b;
}

/* Metadata over the world's batch (num_kv_splits 0 = automatic). NULL on failure. */
static attn_metadata *world_meta(mworld *w, int splits, attn_status *status) {
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch b = world_batch(w);
    attn_status st;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = w->c.nreq + 1;
    md.max_num_tokens = w->ntok + w->c.pad + 1;
    md.max_blocks_per_req = w->stride + 1;
    md.num_blocks = w->nblocks;
    md.decode_threshold = w->c.decode_threshold;
    md.num_kv_splits = splits;
    md.workspace_bytes = w->c.workspace_bytes;
    st = attn_metadata_create(w->layer, &md, &meta);
    if (st == ATTN_OK) st = attn_metadata_build(meta, 0, &b, 0);
    if (status) *status = st;
    if (st != ATTN_OK) {
        attn_metadata_destroy(meta);
        return NULL;
    }
    return meta;
}

static int world_num_decode_tokens(const mworld *w) {
    int i, n = 0;
    for (i = 0; i < w->c.nreq && w->c.qlen[i] <= w->thr; i++) n += w->c.qlen[i];
    return n;
}

static double rms_of(const double *v, int n) {
    double s = 0;
    int i;
    for (i = 0; i < n; i++) s += v[i] * v[i];
    s = sqrt(s / n);
    return s > 1e-3 ? s : 1e-3;
}

/* Compares output rows (batch rows [row_first, row_last), stored at row - out_row0 in out
   [.., H, VDIM]) and the LSE (if given) with the reference; every head must be finite;
   rows from row_last - out_row0 to alloc_rows must still be poisoned. */
static int check_out(const mworld *w, const char *tag, const void *out, const float *lse, int row_first,
                     int row_last, int out_row0, int alloc_rows) {
    int H = w->c.H, row, k, h, x, fails = 0;
    double at, rt, lt;
    world_tol(w, &at, &rt, &lt);
    for (row = row_first; row < row_last; row++) {
        int orow = row - out_row0;
        for (x = 0; x < H * VDIM; x++)
            if (!is_finite(get(out, w->c.dt, (size_t)orow * (size_t)H * VDIM + (size_t)x))) {
                if (fails++ < 3)
                    attn_test_fail(__FILE__, __LINE__, "%s: out row %d element %d is not finite", tag, row,
                                   x);
                break;
            }
        for (k = 0; k < w->nref; k++) {
            const double *want = w->ref_out + ((size_t)row * (size_t)w->nref + (size_t)k) * VDIM;
            double rms = rms_of(want, VDIM);
            h = w->refh[k];
            for (x = 0; x < VDIM; x++) {
                double got = get(out, w->c.dt, ((size_t)orow * (size_t)H + (size_t)h) * VDIM + (size_t)x);
                if (!attn_test_near(got, want[x], at * rms, rt)) {
                    if (fails++ < 3)
                        attn_test_fail(__FILE__, __LINE__,
                                       "%s: out[row %d][head %d][%d] = %.7g, reference %.7g (rms %.3g)", tag,
                                       row, h, x, got, want[x], rms);
                }
            }
            if (lse) {
                double got = lse[(size_t)orow * (size_t)H + (size_t)h],
                       want_l = w->ref_lse[(size_t)row * (size_t)w->nref + (size_t)k];
                if (!attn_test_near(got, want_l, lt, 0)) {
                    if (fails++ < 3)
                        attn_test_fail(__FILE__, __LINE__, "%s: lse[row %d][head %d] = %.7g, reference %.7g",
                                       tag, row, h, got, want_l);
                }
            }
        }
    }
    for (x = (row_last - out_row0) * H * VDIM; x < alloc_rows * H * VDIM; x++)
        if (get(out, w->c.dt, (size_t)x) == get(out, w->c.dt, (size_t)x)) {
            if (fails++ < 3) attn_test_fail(__FILE__, __LINE__, "%s: padding element %d was written", tag, x);
            break;
        }
    return fails;
}

/* Compares out_latent [.., H, R] rows [0, td) of the decodes: with the reference latent
   (the softmax-weighted kv_c of the unabsorbed attention) and, up-projected by W_UV in
   float64, with the reference output; the LSE; rows td..alloc_rows must be untouched. */
static int check_latent(const mworld *w, const char *tag, const void *olat, attn_dtype odt, const float *lse,
                        int td, int alloc_rows) {
    int H = w->c.H, R = w->c.R, row, k, h, x, v, fails = 0;
    double at, rt, lt;
    world_tol(w, &at, &rt, &lt);
    for (row = 0; row < td; row++) {
        for (x = 0; x < H * R; x++)
            if (!is_finite(get(olat, odt, (size_t)row * (size_t)H * (size_t)R + (size_t)x))) {
                if (fails++ < 3)
                    attn_test_fail(__FILE__, __LINE__, "%s: out_latent row %d element %d is not finite", tag,
                                   row, x);
                break;
            }
        if (lse)
            for (h = 0; h < H; h++)
                if (!is_finite(lse[(size_t)row * (size_t)H + (size_t)h])) {
                    if (fails++ < 3)
                        attn_test_fail(__FILE__, __LINE__, "%s: lse row %d head %d is not finite", tag, row,
                                       h);
                    break;
                }
        for (k = 0; k < w->nref; k++) {
            const double *want = w->ref_lat + ((size_t)row * (size_t)w->nref + (size_t)k) * (size_t)R;
            const double *wout = w->ref_out + ((size_t)row * (size_t)w->nref + (size_t)k) * VDIM;
            double rms = rms_of(want, R), rmo = rms_of(wout, VDIM), o[VDIM];
            h = w->refh[k];
            for (v = 0; v < VDIM; v++) o[v] = 0;
            for (x = 0; x < R; x++) {
                double got = get(olat, odt, ((size_t)row * (size_t)H + (size_t)h) * (size_t)R + (size_t)x);
                const float *wv = w->wuv + ((size_t)h * (size_t)R + (size_t)x) * VDIM;
                if (!attn_test_near(got, want[x], at * rms, rt)) {
                    if (fails++ < 3)
                        attn_test_fail(
                            __FILE__, __LINE__,
                            "%s: out_latent[row %d][head %d][%d] = %.7g, reference %.7g (rms %.3g)", tag, row,
                            h, x, got, want[x], rms);
                }
                for (v = 0; v < VDIM; v++) o[v] += got * (double)wv[v];
            }
            for (v = 0; v < VDIM; v++)
                if (!attn_test_near(o[v], wout[v], at * rmo, rt)) {
                    if (fails++ < 3)
                        attn_test_fail(
                            __FILE__, __LINE__,
                            "%s: out_latent.W_UV[row %d][head %d][%d] = %.7g, unabsorbed reference %.7g", tag,
                            row, h, v, o[v], wout[v]);
                }
            if (lse) {
                double got = lse[(size_t)row * (size_t)H + (size_t)h],
                       wl = w->ref_lse[(size_t)row * (size_t)w->nref + (size_t)k];
                if (!attn_test_near(got, wl, lt, 0)) {
                    if (fails++ < 3)
                        attn_test_fail(__FILE__, __LINE__, "%s: lse[row %d][head %d] = %.7g, reference %.7g",
                                       tag, row, h, got, wl);
                }
            }
        }
    }
    for (x = td * H * R; x < alloc_rows * H * R; x++)
        if (get(olat, odt, (size_t)x) == get(olat, odt, (size_t)x)) {
            if (fails++ < 3)
                attn_test_fail(__FILE__, __LINE__, "%s: out_latent padding element %d was written", tag, x);
            break;
        }
    if (lse)
        for (x = td * H; x < alloc_rows * H; x++)
            if (lse[x] == lse[x]) {
                if (fails++ < 3)
                    attn_test_fail(__FILE__, __LINE__, "%s: lse padding element %d was written", tag, x);
                break;
            }
    return fails;
}

/* ---- runs of the three entry points ---------------------------------------------------- */

typedef struct mqa_result {
    float *lat; /* f32 copy of out_latent [td][H][R] */
    float *lse; /* [td][H] */
    int td;
} mqa_result;

/* Absorbed decode through attn_mla_forward_mqa: q_latent = q_nope . W_UK[h] computed here
   (float64, rounded to the layer dtype), either concatenated with q_pe (split_q = 0) or
   passed with q_pe separately. Checks against the reference; optionally keeps copies. */
static int run_mqa(mworld *w, attn_metadata *meta, int split_q, const char *tag, mqa_result *keep) {
    const mcfg *c = &w->c;
    int H = c->H, R = c->R, D = w->D, td, rows, t, h, x, n, fails;
    size_t esz = attn_dtype_size(c->dt);
    attn_mla_info info;
    void *q, *ol;
    float *lse;
    int64_t shape[3];
    attn_tensor tq, tqp, tol, tlse;
    attn_status st;
    EXPECT_OK(attn_metadata_mla_info(meta, &info));
    td = info.num_decode_tokens;
    EXPECT_EQ_INT(td, world_num_decode_tokens(w));
    rows = td + c->pad;
    q = xmalloc(((size_t)rows + 1) * (size_t)H * (size_t)D * esz);
    ol = xmalloc(((size_t)rows + 1) * (size_t)H * (size_t)R * esz);
    lse = (float *)xmalloc(((size_t)rows + 1) * (size_t)H * sizeof(float));
    {
        int W = split_q ? R : D;
        for (t = 0; t < rows; t++)
            for (h = 0; h < H; h++) {
                const float *wk = w->wuk + (size_t)h * NOPE * (size_t)R;
                size_t base = ((size_t)t * (size_t)H + (size_t)h) * (size_t)W;
                if (t >= td) { /* padding rows: finite, unused */
                    for (x = 0; x < W; x++) put(q, c->dt, base + (size_t)x, 0.25f);
                    continue;
                }
                for (x = 0; x < R; x++) {
                    double s = 0;
                    for (n = 0; n < NOPE; n++)
                        s += (double)w->qn[((size_t)t * (size_t)H + (size_t)h) * NOPE + (size_t)n] *
                             (double)wk[(size_t)n * (size_t)R + (size_t)x];
                    put(q, c->dt, base + (size_t)x, (float)s);
                }
                if (!split_q)
                    for (x = 0; x < ROPE; x++)
                        put(q, c->dt, base + (size_t)R + (size_t)x,
                            w->qp[((size_t)t * (size_t)H + (size_t)h) * ROPE + (size_t)x]);
            }
        shape[0] = rows;
        shape[1] = H;
        shape[2] = W;
        tq = attn_tensor_make(q, c->dt, 3, shape);
    }
    shape[0] = w->ntok + c->pad;
    shape[1] = H;
    shape[2] = ROPE;
    tqp = attn_tensor_make(w->qp_raw, c->dt, 3, shape);
    shape[0] = rows;
    shape[2] = R;
    tol = attn_tensor_make(ol, c->dt, 3, shape);
    tlse = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, shape);
    poison(ol, c->dt, (size_t)rows * (size_t)H * (size_t)R);
    poison(lse, ATTN_DTYPE_F32, (size_t)rows * (size_t)H);
    { /* a GPU world runs on device copies */
        size_t qb = (size_t)tq.shape[0] * (size_t)H * (size_t)tq.shape[2] * esz, pb = (size_t)(w->ntok + c->pad) * (size_t)H * ROPE * esz;
        size_t ob = (size_t)rows * (size_t)H * (size_t)R * esz, lb = (size_t)rows * (size_t)H * 4;
        tq.data = wup(w, q, qb);
        tqp.data = wup(w, w->qp_raw, pb);
        tol.data = wup(w, ol, ob);
        tlse.data = wup(w, lse, lb);
        tq = won(w, tq); tqp = won(w, tqp); tol = won(w, tol); tlse = won(w, tlse);
        st = attn_mla_forward_mqa(w->layer, meta, &tq, split_q ? &tqp : NULL, &w->t_cache, &tol, &tlse, NULL);
        wdown(w, NULL, tq.data, 0);
        wdown(w, NULL, tqp.data, 0);
        wdown(w, ol, tol.data, ob);
        wdown(w, lse, tlse.data, lb);
    }
    EXPECT_OK(st);
    fails = st != ATTN_OK ? 1 : check_latent(w, tag, ol, c->dt, lse, td, rows);
    if (keep) {
        keep->td = td;
        keep->lat = (float *)xmalloc(((size_t)td + 1) * (size_t)H * (size_t)R * sizeof(float));
        keep->lse = (float *)xmalloc(((size_t)td + 1) * (size_t)H * sizeof(float));
        for (x = 0; x < td * H * R; x++) keep->lat[x] = get(ol, c->dt, (size_t)x);
        memcpy(keep->lse, lse, (size_t)td * (size_t)H * sizeof(float));
    }
    free(q);
    free(ol);
    free(lse);
    return fails;
}

/* Up-projected prefill through attn_mla_forward_mha (q = [q_nope | q_pe] of the prefill
   rows, new tokens already cached). */
static int run_mha(mworld *w, attn_metadata *meta, const char *tag) {
    const mcfg *c = &w->c;
    int H = c->H, td, tp, rows, t, h, x, fails;
    size_t esz = attn_dtype_size(c->dt);
    attn_mla_info info;
    void *q, *out;
    float *lse;
    int64_t shape[3];
    attn_tensor tq, tout, tlse;
    attn_status st;
    EXPECT_OK(attn_metadata_mla_info(meta, &info));
    td = info.num_decode_tokens;
    tp = info.num_prefill_tokens;
    EXPECT_EQ_INT(td + tp, w->ntok);
    rows = tp + c->pad;
    q = xmalloc(((size_t)rows + 1) * (size_t)H * (NOPE + ROPE) * esz);
    out = xmalloc(((size_t)rows + 1) * (size_t)H * VDIM * esz);
    lse = (float *)xmalloc(((size_t)rows + 1) * (size_t)H * sizeof(float));
    for (t = 0; t < rows; t++)
        for (h = 0; h < H; h++) {
            size_t base = ((size_t)t * (size_t)H + (size_t)h) * (NOPE + ROPE);
            size_t src = (size_t)(td + t) * (size_t)H + (size_t)h;
            for (x = 0; x < NOPE; x++)
                put(q, c->dt, base + (size_t)x, t < tp ? w->qn[src * NOPE + (size_t)x] : 0.25f);
            for (x = 0; x < ROPE; x++)
                put(q, c->dt, base + NOPE + (size_t)x, t < tp ? w->qp[src * ROPE + (size_t)x] : 0.25f);
        }
    shape[0] = rows;
    shape[1] = H;
    shape[2] = NOPE + ROPE;
    tq = attn_tensor_make(q, c->dt, 3, shape);
    shape[2] = VDIM;
    tout = attn_tensor_make(out, c->dt, 3, shape);
    tlse = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, shape);
    poison(out, c->dt, (size_t)rows * (size_t)H * VDIM);
    poison(lse, ATTN_DTYPE_F32, (size_t)rows * (size_t)H);
    {
        size_t qb = (size_t)rows * (size_t)H * (NOPE + ROPE) * esz, ob = (size_t)rows * (size_t)H * VDIM * esz;
        size_t lb = (size_t)rows * (size_t)H * 4;
        tq.data = wup(w, q, qb);
        tout.data = wup(w, out, ob);
        tlse.data = wup(w, lse, lb);
        tq = won(w, tq); tout = won(w, tout); tlse = won(w, tlse);
        st = attn_mla_forward_mha(w->layer, meta, &tq, &w->t_cache, &w->t_wuk, &w->t_wuv, &tout, &tlse, NULL);
        wdown(w, NULL, tq.data, 0);
        wdown(w, out, tout.data, ob);
        wdown(w, lse, tlse.data, lb);
    }
    EXPECT_OK(st);
    fails = st != ATTN_OK ? 1 : check_out(w, tag, out, lse, td, w->ntok, td, rows);
    if (st == ATTN_OK)
        for (x = tp * H; x < rows * H; x++)
            if (lse[x] == lse[x]) {
                attn_test_fail(__FILE__, __LINE__, "%s: lse padding written", tag);
                fails++;
                break;
            }
    free(q);
    free(out);
    free(lse);
    return fails;
}

/* The fused call; with write = 1 the new tokens' kv_c / k_pe are passed (and written by
   the call), and afterwards the cache must hold exactly the expected latents. keep_out
   (optional) receives an f32 copy of out [ntok][H][VDIM]. */
static int run_fused(mworld *w, attn_metadata *meta, int write, const char *tag, float **keep_out) {
    const mcfg *c = &w->c;
    int H = c->H, R = c->R, D = w->D, rows = w->ntok + c->pad, x, i, t, fails;
    size_t esz = attn_dtype_size(c->dt);
    void *out = xmalloc(((size_t)rows + 1) * (size_t)H * VDIM * esz);
    int64_t shape[3];
    attn_tensor tqn, tqp, tout, tkc, tkp;
    attn_status st;
    shape[0] = rows;
    shape[1] = H;
    shape[2] = NOPE;
    tqn = attn_tensor_make(w->qn_raw, c->dt, 3, shape);
    shape[2] = ROPE;
    tqp = attn_tensor_make(w->qp_raw, c->dt, 3, shape);
    shape[2] = VDIM;
    tout = attn_tensor_make(out, c->dt, 3, shape);
    shape[0] = w->ntok;
    shape[1] = R;
    tkc = attn_tensor_make(w->kvc_raw, c->dt, 2, shape);
    shape[1] = ROPE;
    tkp = attn_tensor_make(w->kpe_raw, c->dt, 2, shape);
    poison(out, c->dt, (size_t)rows * (size_t)H * VDIM);
    {
        size_t nb = (size_t)rows * (size_t)H * NOPE * esz, pb = (size_t)rows * (size_t)H * ROPE * esz;
        size_t ob = (size_t)rows * (size_t)H * VDIM * esz;
        tqn.data = wup(w, w->qn_raw, nb);
        tqp.data = wup(w, w->qp_raw, pb);
        tout.data = wup(w, out, ob);
        tkc.data = wup(w, w->kvc_raw, (size_t)w->ntok * (size_t)R * esz);
        tkp.data = wup(w, w->kpe_raw, (size_t)w->ntok * ROPE * esz);
        tqn = won(w, tqn); tqp = won(w, tqp); tout = won(w, tout); tkc = won(w, tkc); tkp = won(w, tkp);
        st = attn_mla_forward(w->layer, meta, &tqn, &tqp, write ? &tkc : NULL, write ? &tkp : NULL, &w->t_cache,
                              &w->t_wuk, &w->t_wuv, &tout, NULL);
        wdown(w, NULL, tqn.data, 0);
        wdown(w, NULL, tqp.data, 0);
        wdown(w, out, tout.data, ob);
        wdown(w, NULL, tkc.data, 0);
        wdown(w, NULL, tkp.data, 0);
        if (write) wcache_down(w);
    }
    EXPECT_OK(st);
    fails = st != ATTN_OK ? 1 : check_out(w, tag, out, NULL, 0, w->ntok, 0, rows);
    if (write && st == ATTN_OK) { /* the cache rows of the new tokens */
        int bad = 0;
        for (i = 0; i < c->nreq && !bad; i++)
            for (t = 0; t < c->qlen[i] && !bad; t++) {
                int row = w->qsl[i] + t, pos = c->slen[i] - c->qlen[i] + t;
                for (x = 0; x < D; x++)
                    if (get(w->cache, c->kvdt, (size_t)w->slots[row] * (size_t)D + (size_t)x) *
                            (attn_test_is_8bit(c->kvdt) ? c->ks : 1.0f) !=
                        w->lat[i][(size_t)pos * (size_t)D + (size_t)x]) {
                        attn_test_fail(__FILE__, __LINE__,
                                       "%s: cache slot %lld element %d not the written latent", tag,
                                       (long long)w->slots[row], x);
                        bad = 1;
                        fails++;
                        break;
                    }
            }
    }
    if (keep_out) {
        *keep_out = (float *)xmalloc(((size_t)w->ntok + 1) * (size_t)H * VDIM * sizeof(float));
        for (x = 0; x < w->ntok * H * VDIM; x++) (*keep_out)[x] = get(out, c->dt, (size_t)x);
    }
    free(out);
    return fails;
}

static void base_cfg(mcfg *c, int H, int R, attn_dtype dt, attn_dtype kvdt) {
    memset(c, 0, sizeof *c);
    c->H = H;
    c->R = R;
    c->dt = dt;
    c->kvdt = kvdt;
    c->bs = 16;
    c->threads = 2;
    c->write_new = 1;
    c->pad = 1;
    c->seed = 0x1234abcdull;
}

static void add_req(mcfg *c, int qlen, int slen) {
    c->qlen[c->nreq] = qlen;
    c->slen[c->nreq] = slen;
    c->nreq++;
}

/* A decode-only world: forward_mqa in both q forms, and the fused call (cache already
   written, then once more writing the new tokens itself). */
static void decode_world(mcfg *c, const char *name) {
    mworld w;
    attn_metadata *meta;
    char tag[128];
    if (!world_init(&w, c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) {
        attn_mla_info info;
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        EXPECT_EQ_INT(info.num_decodes, c->nreq);
        EXPECT_EQ_INT(info.num_prefills, 0);
        EXPECT_EQ_INT(info.num_prefill_tokens, 0);
        snprintf(tag, sizeof tag, "%s mqa q[%d]", name, w.D);
        run_mqa(&w, meta, 0, tag, NULL);
        snprintf(tag, sizeof tag, "%s mqa q_latent+q_pe", name);
        run_mqa(&w, meta, 1, tag, NULL);
        snprintf(tag, sizeof tag, "%s fused (cached)", name);
        run_fused(&w, meta, 0, tag, NULL);
        snprintf(tag, sizeof tag, "%s fused (writes cache)", name);
        run_fused(&w, meta, 1, tag, NULL);
    }
    attn_metadata_destroy(meta);
    world_free(&w);
}

/* ---- decode ----------------------------------------------------------------------------- */

ATTN_TEST(test_mla_decode_576_h16) {
    static const attn_dtype dts[][2] = {{ATTN_DTYPE_F32, ATTN_DTYPE_F32},
                                        {ATTN_DTYPE_F16, ATTN_DTYPE_F16},
                                        {ATTN_DTYPE_BF16, ATTN_DTYPE_BF16},
                                        {ATTN_DTYPE_F32, ATTN_DTYPE_BF16}};
    int i;
    for (i = 0; i < 4; i++) {
        mcfg c;
        char name[64];
        base_cfg(&c, 16, 512, dts[i][0], dts[i][1]);
        c.seed += (uint64_t)i;
        c.bs = i == 3 ? 64 : 16;
        c.nref = 4;
        add_req(&c, 1, 1);
        add_req(&c, 1, 17);
        add_req(&c, 1, scaled(700, 130));
        add_req(&c, 1, i == 0 ? scaled(3000, 600) : scaled(1500, 300));
        snprintf(name, sizeof name, "H16 %s/%s", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
        decode_world(&c, name);
    }
}

ATTN_TEST(test_mla_decode_576_h128) {
    mcfg c;
    base_cfg(&c, 128, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.nref = 3;
    c.bs = 32;
    add_req(&c, 1, 5);
    add_req(&c, 1, scaled(600, 100));
    add_req(&c, 1, scaled(1800, 400));
    decode_world(&c, "H128 f32");
    base_cfg(&c, 128, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.nref = 3;
    c.seed = 77;
    add_req(&c, 1, 2);
    add_req(&c, 1, scaled(1000, 200));
    decode_world(&c, "H128 bf16");
}

ATTN_TEST(test_mla_decode_320) {
    mcfg c;
    base_cfg(&c, 16, 256, ATTN_DTYPE_F16, ATTN_DTYPE_F16);
    c.nref = 8;
    add_req(&c, 1, 1);
    add_req(&c, 1, 40);
    add_req(&c, 1, scaled(1200, 300));
    decode_world(&c, "320 H16 f16");
    base_cfg(&c, 32, 256, ATTN_DTYPE_F32, ATTN_DTYPE_F16);
    c.nref = 4;
    c.threads = 3;
    c.seed = 99;
    add_req(&c, 1, 3);
    add_req(&c, 1, scaled(900, 200));
    decode_world(&c, "320 H32 f32/f16");
}

/* Speculative-decode style decodes (query_len <= decode_threshold > 1) take the absorbed
   path with causal masking inside the request. */
ATTN_TEST(test_mla_decode_multi_token) {
    mcfg c;
    mworld w;
    attn_metadata *meta;
    base_cfg(&c, 16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.decode_threshold = 4;
    c.nref = 4;
    add_req(&c, 3, 3); /* all three keys are new */
    add_req(&c, 4, 300);
    add_req(&c, 1, 50);
    add_req(&c, 2, scaled(1300, 300));
    add_req(&c, 9, 200); /* a prefill after them */
    if (!world_init(&w, &c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) {
        attn_mla_info info;
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        EXPECT_EQ_INT(info.num_decodes, 4);
        EXPECT_EQ_INT(info.num_decode_tokens, 10);
        EXPECT_EQ_INT(info.num_prefills, 1);
        EXPECT_EQ_INT(info.num_prefill_tokens, 9);
        run_mqa(&w, meta, 0, "spec-decode mqa", NULL);
        run_mqa(&w, meta, 1, "spec-decode mqa split q", NULL);
        run_mha(&w, meta, "spec-decode mha");
        run_fused(&w, meta, 1, "spec-decode fused", NULL);
    }
    attn_metadata_destroy(meta);
    world_free(&w);
}

/* ---- prefill ---------------------------------------------------------------------------- */

/* A prefill-only world (chunked prefill with earlier context, fresh prefills):
   forward_mha and the fused call. */
ATTN_TEST(test_mla_prefill_576) {
    static const attn_dtype dts[][2] = {{ATTN_DTYPE_F32, ATTN_DTYPE_F32},
                                        {ATTN_DTYPE_F16, ATTN_DTYPE_F32},
                                        {ATTN_DTYPE_BF16, ATTN_DTYPE_BF16}};
    int i;
    for (i = 0; i < 3; i++) {
        mcfg c;
        mworld w;
        attn_metadata *meta;
        char tag[96];
        base_cfg(&c, 16, 512, dts[i][0], dts[i][1]);
        c.seed = 500 + (uint64_t)i;
        c.nref = 4;
        c.bs = i == 1 ? 32 : 16;
        c.write_new = i != 2;              /* bf16: the fused call writes the cache first */
        add_req(&c, 37, scaled(400, 120)); /* chunked prefill: context before */
        add_req(&c, 70, 70);               /* fresh prefill */
        add_req(&c, 2, 2);
        add_req(&c, 33, 34); /* one key of context, a tile boundary */
        if (!world_init(&w, &c)) {
            world_free(&w);
            continue;
        }
        meta = world_meta(&w, 0, NULL);
        EXPECT_TRUE(meta != NULL);
        if (meta) {
            attn_mla_info info;
            EXPECT_OK(attn_metadata_mla_info(meta, &info));
            EXPECT_EQ_INT(info.num_decodes, 0);
            EXPECT_EQ_INT(info.num_prefills, 4);
            EXPECT_EQ_INT(info.num_prefill_tokens, w.ntok);
            if (!c.write_new) {
                snprintf(tag, sizeof tag, "prefill %s fused (writes cache)", attn_dtype_name(c.dt));
                run_fused(&w, meta, 1, tag, NULL);
            }
            snprintf(tag, sizeof tag, "prefill %s/%s mha", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
            run_mha(&w, meta, tag);
            snprintf(tag, sizeof tag, "prefill %s/%s fused", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
            run_fused(&w, meta, 0, tag, NULL);
        }
        attn_metadata_destroy(meta);
        world_free(&w);
    }
}

ATTN_TEST(test_mla_prefill_320) {
    mcfg c;
    mworld w;
    attn_metadata *meta;
    base_cfg(&c, 16, 256, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.nref = 6;
    c.seed = 3200;
    add_req(&c, 45, scaled(500, 100));
    add_req(&c, 64, 64);
    if (!world_init(&w, &c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) {
        run_mha(&w, meta, "prefill 320 bf16 mha");
        run_fused(&w, meta, 0, "prefill 320 bf16 fused", NULL);
    }
    attn_metadata_destroy(meta);
    world_free(&w);
}

/* info.prefill_chunk of an f32 MLA layer with H heads (-1 on failure). */
static int probe_chunk(int H) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEBUG, 1);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch b;
    attn_mla_info info;
    int32_t qsl[2] = {0, 2}, seq[1] = {2}, bt[1] = {0};
    int chunk = -1;
    memset(&d, 0, sizeof d);
    d.use_mla = 1;
    d.num_heads = H;
    d.head_size = 576;
    d.dtype = ATTN_DTYPE_F32;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1;
    md.max_num_tokens = 2;
    md.max_blocks_per_req = 1;
    md.num_blocks = 1;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl;
    b.seq_lens = seq;
    b.block_table = bt;
    b.block_table_stride = 1;
    b.num_reqs = 1;
    b.num_actual_tokens = 2;
    b.max_query_len = 2;
    b.max_seq_len = 2;
    if (ctx && attn_layer_create(ctx, &d, NULL, &layer) == ATTN_OK &&
        attn_metadata_create(layer, &md, &meta) == ATTN_OK &&
        attn_metadata_build(meta, 0, &b, 0) == ATTN_OK && attn_metadata_mla_info(meta, &info) == ATTN_OK)
        chunk = info.prefill_chunk;
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    return chunk;
}

/* A prefill over more keys than info.prefill_chunk: the chunked up-projection with LSE
   merging across chunks (H = 128, where a chunk is a few hundred keys). */
ATTN_TEST(test_mla_prefill_longer_than_chunk) {
    mcfg c;
    mworld w;
    attn_metadata *meta;
    attn_mla_info info;
    int chunk;
    /* the chunk size of this layer shape, from a tiny batch */
    chunk = probe_chunk(128);
    EXPECT_TRUE(chunk >= 64 && chunk % 64 == 0);
    EXPECT_TRUE(chunk <= 1024); /* small for 128 heads, so this test is affordable */
    if (chunk < 64 || chunk > 2048) return;
    /* fewer heads, a larger chunk: never fewer keys than for more heads */
    EXPECT_TRUE(probe_chunk(16) >= chunk);

    base_cfg(&c, 128, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.nref = 3;
    c.seed = 4096;
    c.bs = 64;
    add_req(&c, 40, chunk + 100); /* chunked prefill: keys span two chunks */
    if (test_scale() >= 1.0)
        add_req(&c, chunk + 30, chunk + 30); /* fresh prefill, the causal edge crosses a chunk */
    if (!world_init(&w, &c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) {
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        EXPECT_EQ_INT(info.prefill_chunk, chunk);
        EXPECT_TRUE(info.num_prefill_tokens == 40 + (c.nreq > 1 ? chunk + 30 : 0));
        run_mha(&w, meta, "long prefill H128 mha");
        if (test_scale() >= 1.0) run_fused(&w, meta, 0, "long prefill H128 fused", NULL);
    }
    attn_metadata_destroy(meta);
    world_free(&w);
}

/* ---- mixed batches ---------------------------------------------------------------------- */

/* Decodes + prefills with and without context in one fused call that also writes the
   cache; then forward_mqa / forward_mha on the same built batch. */
/* fp8 latent caches (per-tensor scale) on CPU_MLA: decode at 16 and 128 heads, the 320
   variant, chunked and fresh prefills over several up-projection chunks, the fused call,
   every path against float64 from the dequantized latents; e4m3 and e5m2, scales 1 (codes
   down to the subnormals), 1/8 and 1/64. */
ATTN_TEST(test_mla_fp8_latent) {
    static const struct { int H, R; attn_dtype dt, kvdt; float ks; } cases[] = {
        {16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3, 1.0f / 64},
        {128, 512, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, 1.0f},
        {16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_FP8_E5M2, 1.0f / 8},
        {40, 256, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E5M2, 1.0f / 64}};
    int i;
    for (i = 0; i < 4; i++) {
        mcfg c;
        mworld w;
        attn_metadata *meta;
        char tag[96];
        base_cfg(&c, cases[i].H, cases[i].R, cases[i].dt, cases[i].kvdt);
        c.ks = cases[i].ks;
        c.seed = 8100 + (uint64_t)i;
        c.nref = 4;
        c.write_new = i & 1;
        c.bs = i == 3 ? 32 : 64;
        add_req(&c, 1, scaled(900, 200));
        add_req(&c, 1, 1);
        add_req(&c, 2, 70);   /* a speculative decode */
        add_req(&c, 20, 150); /* chunked prefill */
        add_req(&c, 33, 33);  /* fresh prefill */
        if (c.H == 128) add_req(&c, 10, probe_chunk(128) + 60); /* keys over two up-projection chunks */
        if (!world_init(&w, &c)) {
            world_free(&w);
            continue;
        }
        meta = world_meta(&w, 2, NULL);
        EXPECT_TRUE(meta != NULL);
        if (meta) {
            char name[64];
            snprintf(name, sizeof name, "fp8 H%d %s/%s scale %g", c.H, attn_dtype_name(c.dt), attn_dtype_name(c.kvdt),
                     (double)c.ks);
            snprintf(tag, sizeof tag, "%s fused", name);
            if (!c.write_new) run_fused(&w, meta, 1, tag, NULL);
            snprintf(tag, sizeof tag, "%s mqa", name);
            run_mqa(&w, meta, i & 1, tag, NULL);
            snprintf(tag, sizeof tag, "%s mha", name);
            run_mha(&w, meta, tag);
        }
        attn_metadata_destroy(meta);
        world_free(&w);
    }
}

ATTN_TEST(test_mla_mixed_batch) {
    static const attn_dtype dts[][2] = {{ATTN_DTYPE_F32, ATTN_DTYPE_F16},
                                        {ATTN_DTYPE_BF16, ATTN_DTYPE_BF16},
                                        {ATTN_DTYPE_F16, ATTN_DTYPE_F16}};
    int i;
    for (i = 0; i < 3; i++) {
        mcfg c;
        mworld w;
        attn_metadata *meta;
        char tag[96];
        base_cfg(&c, i == 2 ? 32 : 16, 512, dts[i][0], dts[i][1]);
        c.seed = 900 + (uint64_t)i;
        c.nref = 4;
        c.write_new = 0;
        c.pad = 2;
        add_req(&c, 1, scaled(1100, 200));
        add_req(&c, 1, 1);
        add_req(&c, 0, 30); /* no new token this step */
        add_req(&c, 1, 77);
        add_req(&c, 25, 200); /* chunked prefill */
        add_req(&c, 40, 40);  /* fresh prefill */
        add_req(&c, 3, 90);
        if (!world_init(&w, &c)) {
            world_free(&w);
            continue;
        }
        meta = world_meta(&w, 0, NULL);
        EXPECT_TRUE(meta != NULL);
        if (meta) {
            attn_mla_info info;
            EXPECT_OK(attn_metadata_mla_info(meta, &info));
            EXPECT_EQ_INT(info.num_decodes, 4);
            EXPECT_EQ_INT(info.num_decode_tokens, 3);
            EXPECT_EQ_INT(info.num_prefills, 3);
            EXPECT_EQ_INT(info.num_prefill_tokens, 68);
            snprintf(tag, sizeof tag, "mixed %s/%s fused", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
            run_fused(&w, meta, 1, tag, NULL);
            snprintf(tag, sizeof tag, "mixed %s/%s mqa", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
            run_mqa(&w, meta, i & 1, tag, NULL);
            snprintf(tag, sizeof tag, "mixed %s/%s mha", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
            run_mha(&w, meta, tag);
        }
        attn_metadata_destroy(meta);
        world_free(&w);
    }
}

/* The layouts an engine passes: q_nope / q_pe as views of one [T, H, 192] tensor, kv_c /
   k_pe as views of one [T, 576] row (the kv_a projection), W_UK as a view of kv_b_proj
   ([H, 128 + 128, R], nope rows first), the prefill q of forward_mha with padded rows. */
ATTN_TEST(test_mla_strided_views) {
    mcfg c;
    mworld w;
    attn_metadata *meta;
    int H = 16, R = 512, T, t, h, x, n;
    base_cfg(&c, H, R, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 5150;
    c.nref = 4;
    c.write_new = 0;
    c.pad = 0;
    add_req(&c, 1, scaled(900, 200));
    add_req(&c, 1, 33);
    add_req(&c, 20, 150);
    add_req(&c, 45, 45);
    if (!world_init(&w, &c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    T = w.ntok;
    if (meta) {
        size_t esz = 2;
        void *qbuf = xmalloc((size_t)T * H * 192 * esz), *kvbuf = xmalloc((size_t)T * 576 * esz);
        void *kvb = xmalloc((size_t)H * 256 * (size_t)R * esz), *out = xmalloc((size_t)T * H * VDIM * esz);
        void *qm = xmalloc((size_t)T * H * 256 * esz), *om = xmalloc((size_t)T * H * VDIM * esz);
        attn_tensor tqn, tqp, tkc, tkp, tuk, tout, tqm, tom;
        attn_mla_info info;
        for (t = 0; t < T; t++)
            for (h = 0; h < H; h++) {
                for (x = 0; x < NOPE; x++)
                    put(qbuf, c.dt, ((size_t)t * H + (size_t)h) * 192 + (size_t)x,
                        w.qn[((size_t)t * H + (size_t)h) * NOPE + (size_t)x]);
                for (x = 0; x < ROPE; x++)
                    put(qbuf, c.dt, ((size_t)t * H + (size_t)h) * 192 + NOPE + (size_t)x,
                        w.qp[((size_t)t * H + (size_t)h) * ROPE + (size_t)x]);
            }
        for (t = 0; t < T; t++)
            for (x = 0; x < 576; x++)
                put(kvbuf, c.dt, (size_t)t * 576 + (size_t)x,
                    get(x < R ? w.kvc_raw : w.kpe_raw, c.dt,
                        x < R ? (size_t)t * (size_t)R + (size_t)x : (size_t)t * ROPE + (size_t)(x - R)));
        for (h = 0; h < H; h++)
            for (n = 0; n < 256; n++)
                for (x = 0; x < R; x++) /* nope rows = W_UK; the other 128 rows: finite filler */
                    put(kvb, c.dt, ((size_t)h * 256 + (size_t)n) * (size_t)R + (size_t)x,
                        n < NOPE ? w.wuk[((size_t)h * NOPE + (size_t)n) * (size_t)R + (size_t)x] : 9.0f);
        tqn = t3(qbuf, c.dt, T, H, NOPE);
        tqn.strides[0] = (int64_t)H * 192;
        tqn.strides[1] = 192;
        tqn.strides[2] = 1;
        tqp = tqn;
        tqp.data = (char *)qbuf + NOPE * esz;
        tqp.shape[2] = ROPE;
        tkc = attn_tensor_make(kvbuf, c.dt, 2, tqn.shape);
        tkc.shape[0] = T;
        tkc.shape[1] = R;
        tkc.strides[0] = 576;
        tkc.strides[1] = 1;
        tkp = tkc;
        tkp.data = (char *)kvbuf + (size_t)R * esz;
        tkp.shape[1] = ROPE;
        tuk = t3(kvb, c.dt, H, NOPE, R);
        tuk.strides[0] = (int64_t)256 * R;
        tuk.strides[1] = R;
        tuk.strides[2] = 1;
        tout = t3(out, c.dt, T, H, VDIM);
        poison(out, c.dt, (size_t)T * H * VDIM);
        EXPECT_OK(
            attn_mla_forward(w.layer, meta, &tqn, &tqp, &tkc, &tkp, &w.t_cache, &tuk, &w.t_wuv, &tout, NULL));
        check_out(&w, "strided fused", out, NULL, 0, T, 0, T);
        /* forward_mha with q rows padded to 256 per head, out rows of H * 128 + gap */
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        for (t = 0; t < info.num_prefill_tokens; t++)
            for (h = 0; h < H; h++)
                for (x = 0; x < 256; x++)
                    put(qm, c.dt, ((size_t)t * H + (size_t)h) * 256 + (size_t)x,
                        x < 192
                            ? get(qbuf, c.dt,
                                  ((size_t)(info.num_decode_tokens + t) * H + (size_t)h) * 192 + (size_t)x)
                            : 7.0f);
        tqm = t3(qm, c.dt, info.num_prefill_tokens, H, 192);
        tqm.strides[0] = (int64_t)H * 256;
        tqm.strides[1] = 256;
        tqm.strides[2] = 1;
        tom = t3(om, c.dt, info.num_prefill_tokens, H, VDIM);
        poison(om, c.dt, (size_t)T * H * VDIM);
        EXPECT_OK(attn_mla_forward_mha(w.layer, meta, &tqm, &w.t_cache, &tuk, &w.t_wuv, &tom, NULL, NULL));
        check_out(&w, "strided mha", om, NULL, info.num_decode_tokens, T, info.num_decode_tokens,
                  info.num_prefill_tokens);
        /* forward_mqa with q_pe a view of the combined q */
        {
            void *ql = xmalloc((size_t)T * H * (size_t)R * esz),
                 *ol = xmalloc((size_t)T * H * (size_t)R * esz);
            float *lse = (float *)xmalloc((size_t)T * H * sizeof(float));
            attn_tensor tql, tol, tl;
            int td = info.num_decode_tokens;
            for (t = 0; t < td; t++)
                for (h = 0; h < H; h++)
                    for (x = 0; x < R; x++) {
                        double sum = 0;
                        for (n = 0; n < NOPE; n++)
                            sum += (double)w.qn[((size_t)t * H + (size_t)h) * NOPE + (size_t)n] *
                                   (double)w.wuk[((size_t)h * NOPE + (size_t)n) * (size_t)R + (size_t)x];
                        put(ql, c.dt, ((size_t)t * H + (size_t)h) * (size_t)R + (size_t)x, (float)sum);
                    }
            tql = t3(ql, c.dt, td, H, R);
            tol = t3(ol, c.dt, td, H, R);
            tl = t2(lse, td, H);
            poison(ol, c.dt, (size_t)T * H * (size_t)R);
            poison(lse, ATTN_DTYPE_F32, (size_t)T * H);
            EXPECT_OK(attn_mla_forward_mqa(w.layer, meta, &tql, &tqp, &w.t_cache, &tol, &tl, NULL));
            check_latent(&w, "strided mqa", ol, c.dt, lse, td, td);
            free(ql);
            free(ol);
            free(lse);
        }
        free(qbuf);
        free(kvbuf);
        free(kvb);
        free(out);
        free(qm);
        free(om);
    }
    attn_metadata_destroy(meta);
    world_free(&w);
}

/* Random mixed batches (shapes, dtypes, block sizes, thresholds, threads). */
/* The random knobs the CPU and GPU random batches share (in this order of draws): decode
   threshold, seeds, float64 heads, who writes the new tokens, padding rows, scale. */
static void random_world_knobs(rng *r, mcfg *c) {
    c->decode_threshold = rng_int(r, 0, 2) == 0 ? rng_int(r, 2, 4) : 0;
    c->seed = rng_next(r);
    c->wseed = rng_next(r);
    c->nref = c->H > 8 ? 3 : 0;
    c->write_new = rng_int(r, 0, 1);
    c->pad = rng_int(r, 0, 2);
    if (rng_int(r, 0, 2) == 0) c->scale = rng_uniform(r, 0.03f, 0.15f);
}

ATTN_TEST(test_mla_random_batches) {
    rng r;
    int n = (int)(8 * test_scale()), k, failed = 0;
    if (n < 2) n = 2;
    rng_seed(&r, 0xfeedface12345ull);
    for (k = 0; k < n && failed < 2; k++) {
        static const int heads[] = {1, 8, 16, 24, 64};
        static const int blocks[] = {16, 32, 64, 128};
        mcfg c;
        mworld w;
        attn_metadata *meta;
        double work = 0;
        int i, nd, np, f0 = attn_test_current_failed();
        char tag[160];
        base_cfg(&c, heads[rng_int(&r, 0, 4)], rng_int(&r, 0, 2) ? 512 : 256, (attn_dtype)rng_int(&r, 1, 3),
                 ATTN_DTYPE_AUTO);
        c.kvdt = rng_int(&r, 0, 2) ? c.dt : (attn_dtype)rng_int(&r, 1, 3);
        c.bs = blocks[rng_int(&r, 0, 3)];
        c.threads = rng_int(&r, 1, 3);
        random_world_knobs(&r, &c);
        nd = rng_int(&r, 0, 5);
        np = rng_int(&r, nd ? 0 : 1, 3);
        for (i = 0; i < nd; i++) {
            int thr = c.decode_threshold ? c.decode_threshold : 1;
            int ql = rng_int(&r, 1, thr), sl = ql + rng_int(&r, 0, rng_int(&r, 0, 3) ? 400 : 2500);
            add_req(&c, ql, sl);
        }
        for (i = 0; i < np; i++) {
            int thr = c.decode_threshold ? c.decode_threshold : 1;
            int ql = rng_int(&r, thr + 1, 120), sl = rng_int(&r, 0, 1) ? ql : ql + rng_int(&r, 1, 500);
            add_req(&c, ql, sl);
        }
        for (i = 0; i < c.nreq; i++) work += (double)c.slen[i];
        if (work * (c.nref ? c.nref : c.H) > 9000 * test_scale() + 2000) { /* keep the reference cheap */
            for (i = 0; i < c.nreq; i++)
                if (c.slen[i] > 300) {
                    int ctxl = c.slen[i] - c.qlen[i];
                    c.slen[i] = c.qlen[i] + (ctxl > 150 ? 150 : ctxl);
                }
        }
        snprintf(tag, sizeof tag,
                 "random case %d: H=%d R=%d %s/%s bs=%d thr=%d threads=%d reqs=%d+%d scale=%g", k, c.H, c.R,
                 attn_dtype_name(c.dt), attn_dtype_name(c.kvdt), c.bs, c.decode_threshold, c.threads, nd, np,
                 (double)c.scale);
        if (!world_init(&w, &c)) {
            world_free(&w);
            failed++;
            continue;
        }
        meta = world_meta(&w, 0, NULL);
        EXPECT_TRUE(meta != NULL);
        if (meta) {
            if (!c.write_new) run_fused(&w, meta, 1, tag, NULL);
            if (nd) run_mqa(&w, meta, rng_int(&r, 0, 1), tag, NULL);
            if (np) run_mha(&w, meta, tag);
            if (c.write_new) run_fused(&w, meta, 0, tag, NULL);
        }
        if (attn_test_current_failed() > f0) {
            printf("    in %s\n", tag);
            failed++;
        }
        attn_metadata_destroy(meta);
        world_free(&w);
    }
}

/* ---- split-KV and batch invariance ------------------------------------------------------ */

/* The same decode batch with num_kv_splits forced to 1, 2, 7, 32: the same out_latent and
   LSE within fp32 rounding, and each matching the reference; 32 splits over contexts of
   1..3 keys leave empty splits that must not produce NaN. */
ATTN_TEST(test_mla_split_invariance) {
    static const int splits[] = {1, 2, 7, 32};
    mcfg c;
    mworld w;
    mqa_result res[4];
    int s, x, i;
    base_cfg(&c, 16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.nref = 4;
    c.seed = 321;
    add_req(&c, 1, 1);
    add_req(&c, 1, 3);
    add_req(&c, 1, 100);
    add_req(&c, 1, scaled(1100, 300));
    add_req(&c, 1, scaled(2600, 520));
    memset(res, 0, sizeof res);
    if (!world_init(&w, &c)) {
        world_free(&w);
        return;
    }
    for (s = 0; s < 4; s++) {
        attn_metadata *meta = world_meta(&w, splits[s], NULL);
        attn_mla_info info;
        char tag[64];
        EXPECT_TRUE(meta != NULL);
        if (!meta) continue;
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        EXPECT_EQ_INT(info.num_kv_splits, splits[s]);
        snprintf(tag, sizeof tag, "%d splits", splits[s]);
        run_mqa(&w, meta, s & 1, tag, &res[s]);
        attn_metadata_destroy(meta);
    }
    for (s = 1; s < 4; s++) {
        int bad = 0;
        if (!res[0].lat || !res[s].lat) continue;
        for (x = 0; x < res[0].td * c.H * c.R && bad < 3; x++)
            if (!attn_test_near(res[s].lat[x], res[0].lat[x], 2e-6, 2e-5)) {
                attn_test_fail(__FILE__, __LINE__, "%d splits: out_latent[%d] = %.9g, 1 split %.9g",
                               splits[s], x, (double)res[s].lat[x], (double)res[0].lat[x]);
                bad++;
            }
        for (x = 0; x < res[0].td * c.H && bad < 3; x++)
            if (!attn_test_near(res[s].lse[x], res[0].lse[x], 2e-5, 0)) {
                attn_test_fail(__FILE__, __LINE__, "%d splits: lse[%d] = %.9g, 1 split %.9g", splits[s], x,
                               (double)res[s].lse[x], (double)res[0].lse[x]);
                bad++;
            }
    }
    for (i = 0; i < 4; i++) {
        free(res[i].lat);
        free(res[i].lse);
    }
    /* the automatic split count, and what drives it */
    {
        attn_metadata *meta = world_meta(&w, 0, NULL);
        attn_mla_info info;
        if (meta) {
            EXPECT_OK(attn_metadata_mla_info(meta, &info));
            EXPECT_EQ_INT(info.num_kv_splits, attn_mla_num_kv_splits(c.slen[4], ctx_threads(w.ctx), 0));
            run_mqa(&w, meta, 0, "automatic splits", NULL);
        }
        attn_metadata_destroy(meta);
    }
    world_free(&w);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(0, 4, 0), 1);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(1, 4, 0), 1);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(512, 4, 0), 1);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(513, 4, 0), 2);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(100000, 4, 0), 4);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(100000, 4, 1), 1);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(100000, 0, 0), 1);
}

/* Only empty splits but one: 32 splits over requests of 1..5 keys, several threads. */
ATTN_TEST(test_mla_split_empty) {
    mcfg c;
    mworld w;
    attn_metadata *meta;
    base_cfg(&c, 8, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.threads = 3;
    c.seed = 3232;
    add_req(&c, 1, 1);
    add_req(&c, 1, 2);
    add_req(&c, 1, 5);
    add_req(&c, 1, 31);
    if (!world_init(&w, &c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, 32, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) {
        run_mqa(&w, meta, 0, "32 splits, short", NULL);
        run_fused(&w, meta, 0, "32 splits, short, fused", NULL);
    }
    attn_metadata_destroy(meta);
    /* the most splits allowed */
    meta = world_meta(&w, 1024, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) {
        attn_mla_info info;
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        EXPECT_EQ_INT(info.num_kv_splits, 1024);
        run_mqa(&w, meta, 1, "1024 splits, short", NULL);
    }
    attn_metadata_destroy(meta);
    world_free(&w);
}

/* ATTN_BATCH_INVARIANT=1: one decode request alone and first in a larger batch (more
   decodes and prefills, other block placement) gives bitwise-identical rows, in
   forward_mqa (out_latent, LSE) and in the fused call. Without the variable the two
   batches would split the request's keys differently (3 vs 4 splits on 4 threads). */
/* Request 0 alone (wa, ma) and in a batch (wb, mb), both built with ATTN_BATCH_INVARIANT=1:
   one split each, and its forward_mqa rows (out_latent, LSE) bitwise equal; with fused, the
   fused call's rows too. */
static void check_invariant_rows(mworld *wa, attn_metadata *ma, mworld *wb, attn_metadata *mb, int fused,
                                 const char *tag) {
    const int H = wa->c.H, R = wa->c.R;
    attn_mla_info ia, ib;
    mqa_result ra, rb;
    float *fa = NULL, *fb = NULL;
    char name[96];
    int x, same = 1;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    EXPECT_OK(attn_metadata_mla_info(ma, &ia));
    EXPECT_OK(attn_metadata_mla_info(mb, &ib));
    EXPECT_EQ_INT(ia.num_kv_splits, 1);
    EXPECT_EQ_INT(ib.num_kv_splits, 1);
    snprintf(name, sizeof name, "%salone", tag);
    run_mqa(wa, ma, 0, name, &ra);
    snprintf(name, sizeof name, "%sin batch", tag);
    run_mqa(wb, mb, 0, name, &rb);
    if (ra.lat && rb.lat) {
        for (x = 0; x < H * R; x++)
            if (memcmp(&ra.lat[x], &rb.lat[x], sizeof(float))) {
                if (same)
                    printf("    out_latent: first difference at %d: %.9g vs %.9g\n", x, (double)ra.lat[x],
                           (double)rb.lat[x]);
                same = 0;
            }
        EXPECT_TRUE(same);
        same = 1;
        for (x = 0; x < H; x++)
            if (memcmp(&ra.lse[x], &rb.lse[x], sizeof(float))) same = 0;
        EXPECT_TRUE(same);
    }
    if (fused) {
        snprintf(name, sizeof name, "%salone fused", tag);
        run_fused(wa, ma, 0, name, &fa);
        snprintf(name, sizeof name, "%sin batch fused", tag);
        run_fused(wb, mb, 0, name, &fb);
        if (fa && fb) {
            same = 1;
            for (x = 0; x < H * VDIM; x++)
                if (memcmp(&fa[x], &fb[x], sizeof(float))) {
                    if (same)
                        printf("    fused out: first difference at %d: %.9g vs %.9g\n", x, (double)fa[x],
                               (double)fb[x]);
                    same = 0;
                }
            EXPECT_TRUE(same);
        }
    }
    free(ra.lat);
    free(ra.lse);
    free(rb.lat);
    free(rb.lse);
    free(fa);
    free(fb);
}

ATTN_TEST(test_mla_batch_invariant) {
    mcfg one, many;
    mworld wa, wb;
    attn_metadata *ma = NULL, *mb = NULL;
    int H = 16, R = 512;
    attn_test_env saved_env;
    base_cfg(&one, H, R, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    one.nref = 1;
    one.seed = 4444;
    one.wseed = 55;
    one.threads = 4;
    add_req(&one, 1, 1100);
    many = one;
    many.seed = 4444; /* request 0 draws the same stream */
    add_req(&many, 1, scaled(900, 100));
    add_req(&many, 1, 1800); /* the longest decode: 4 splits by default */
    add_req(&many, 1, 3);
    add_req(&many, 20, 120);
    add_req(&many, 7, 7);
    many.bs = 32; /* a different page layout too */
    saved_env = attn_test_env_save("ATTN_BATCH_INVARIANT");
    unsetenv("ATTN_BATCH_INVARIANT");
    if (world_init(&wa, &one)) ma = world_meta(&wa, 0, NULL);
    if (world_init(&wb, &many)) mb = world_meta(&wb, 0, NULL);
    if (ma && mb) { /* the default schedule depends on the batch (given 4 threads) */
        attn_mla_info ia, ib;
        int thr = ctx_threads(wa.ctx);
        EXPECT_OK(attn_metadata_mla_info(ma, &ia));
        EXPECT_OK(attn_metadata_mla_info(mb, &ib));
        EXPECT_EQ_INT(ia.num_kv_splits, attn_mla_num_kv_splits(1100, thr, 0));
        EXPECT_EQ_INT(ib.num_kv_splits, attn_mla_num_kv_splits(1800, thr, 0));
        if (thr >= 4) EXPECT_TRUE(ia.num_kv_splits == 3 && ib.num_kv_splits == 4);
    }
    attn_metadata_destroy(ma);
    attn_metadata_destroy(mb);
    ma = mb = NULL;
    setenv("ATTN_BATCH_INVARIANT", "1", 1);
    if (wa.ok) ma = world_meta(&wa, 0, NULL);
    if (wb.ok) mb = world_meta(&wb, 0, NULL);
    attn_test_env_restore(&saved_env);
    EXPECT_TRUE(ma != NULL && mb != NULL);
    if (ma && mb) check_invariant_rows(&wa, ma, &wb, mb, 1, "");
    attn_metadata_destroy(ma);
    attn_metadata_destroy(mb);
    world_free(&wa);
    world_free(&wb);
}

/* ---- LSE merge ------------------------------------------------------------------------- */

/* One sequence's context sharded into contiguous parts: each shard is a decode request over
   its keys (a decode sees all of them), the whole sequence another; forward_mqa gives every
   (out_latent, LSE); merging the shards with attn_merge_attn_states must give the whole. */
ATTN_TEST(test_mla_merge_shards) {
    mcfg c;
    mworld w;
    attn_metadata *meta;
    mqa_result res;
    int H = 8, R = 512, S = scaled(1000, 400), HR, x, s;
    static const int nshards_list[] = {2, 4};
    base_cfg(&c, H, R, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.seed = 8080;
    c.nref = 3;
    /* requests 0..5: shards (aliases of request 6), request 6: the whole sequence */
    {
        int cuts2[3], cuts4[5], i;
        cuts2[0] = 0;
        cuts2[1] = S / 3;
        cuts2[2] = S;
        cuts4[0] = 0;
        cuts4[1] = 1;
        cuts4[2] = S / 4;
        cuts4[3] = S / 2 + 7;
        cuts4[4] = S;
        for (i = 0; i < 2; i++) {
            add_req(&c, 1, cuts2[i + 1] - cuts2[i]);
            c.alias[c.nreq - 1] = 7;
            c.alias_off[c.nreq - 1] = cuts2[i];
        }
        for (i = 0; i < 4; i++) {
            add_req(&c, 1, cuts4[i + 1] - cuts4[i]);
            c.alias[c.nreq - 1] = 7;
            c.alias_off[c.nreq - 1] = cuts4[i];
        }
        add_req(&c, 1, S);
    }
    memset(&res, 0, sizeof res);
    HR = H * R;
    if (!world_init(&w, &c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) run_mqa(&w, meta, 0, "shards", &res);
    if (res.lat) {
        int first = 0, k;
        for (k = 0; k < 2; k++) {
            int ns = nshards_list[k];
            float *acc = (float *)xmalloc((size_t)HR * sizeof(float)),
                  *accl = (float *)xmalloc((size_t)H * sizeof(float));
            attn_tensor ta = t3(acc, ATTN_DTYPE_F32, 1, H, R), tla = t2(accl, 1, H);
            memcpy(acc, res.lat + (size_t)first * HR, (size_t)HR * sizeof(float));
            memcpy(accl, res.lse + (size_t)first * H, (size_t)H * sizeof(float));
            for (s = 1; s < ns; s++) { /* acc = merge(acc, shard s), out aliasing out_a */
                attn_tensor tb = t3(res.lat + (size_t)(first + s) * HR, ATTN_DTYPE_F32, 1, H, R);
                attn_tensor tlb = t2(res.lse + (size_t)(first + s) * H, 1, H);
                EXPECT_OK(attn_merge_attn_states(w.ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb,
                                                 ATTN_LSE_BASE_E, &ta, &tla, ATTN_LSE_BASE_E, NULL));
            }
            for (x = 0; x < HR; x++)
                if (!attn_test_near(acc[x], res.lat[(size_t)6 * HR + x], 2e-6, 2e-5)) {
                    attn_test_fail(__FILE__, __LINE__, "%d shards merged: out[%d] = %.9g, whole %.9g", ns, x,
                                   (double)acc[x], (double)res.lat[(size_t)6 * HR + x]);
                    break;
                }
            for (x = 0; x < H; x++) EXPECT_NEAR(accl[x], res.lse[(size_t)6 * H + x], 2e-5, 0);
            /* and against the float64 reference of the whole sequence */
            for (x = 0; x < w.nref; x++) {
                int h = w.refh[x], e;
                const double *want = w.ref_lat + ((size_t)6 * (size_t)w.nref + (size_t)x) * (size_t)R;
                double rms = rms_of(want, R);
                for (e = 0; e < R; e++)
                    if (!attn_test_near(acc[(size_t)h * R + e], want[e], 1e-4 * rms, 1e-4)) {
                        attn_test_fail(__FILE__, __LINE__,
                                       "%d shards merged vs reference: head %d [%d] %.9g vs %.9g", ns, h, e,
                                       (double)acc[(size_t)h * R + e], want[e]);
                        break;
                    }
                EXPECT_NEAR(accl[h], w.ref_lse[(size_t)6 * (size_t)w.nref + (size_t)x], 1e-4, 0);
            }
            free(acc);
            free(accl);
            first += ns;
        }
        /* base 2 and mixed bases: the 2-shard merge again */
        {
            const double LOG2E = 1.4426950408889634;
            float *oe = (float *)xmalloc((size_t)HR * sizeof(float)),
                  *le = (float *)xmalloc((size_t)H * sizeof(float));
            float *o2 = (float *)xmalloc((size_t)HR * sizeof(float)),
                  *l2 = (float *)xmalloc((size_t)H * sizeof(float));
            float *la2 = (float *)xmalloc((size_t)H * sizeof(float)),
                  *lb2 = (float *)xmalloc((size_t)H * sizeof(float));
            attn_tensor ta = t3(res.lat, ATTN_DTYPE_F32, 1, H, R),
                        tb = t3(res.lat + HR, ATTN_DTYPE_F32, 1, H, R);
            attn_tensor tla = t2(res.lse, 1, H), tlb = t2(res.lse + H, 1, H), tla2 = t2(la2, 1, H),
                        tlb2 = t2(lb2, 1, H);
            attn_tensor toe = t3(oe, ATTN_DTYPE_F32, 1, H, R), tle = t2(le, 1, H),
                        to2 = t3(o2, ATTN_DTYPE_F32, 1, H, R), tl2 = t2(l2, 1, H);
            int combo;
            for (x = 0; x < H; x++) {
                la2[x] = (float)(res.lse[x] * LOG2E);
                lb2[x] = (float)(res.lse[H + x] * LOG2E);
            }
            poison(oe, ATTN_DTYPE_F32, (size_t)HR);
            poison(le, ATTN_DTYPE_F32, (size_t)H);
            EXPECT_OK(attn_merge_attn_states(w.ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E,
                                             &toe, &tle, ATTN_LSE_BASE_E, NULL));
            for (combo = 0; combo < 4; combo++) {
                /* 0: 2+2 -> e, 1: 2+e -> 2, 2: e+2 -> e, 3: 2+2 -> 2 */
                attn_lse_base ba = combo == 2 ? ATTN_LSE_BASE_E : ATTN_LSE_BASE_2;
                attn_lse_base bb = combo == 1 ? ATTN_LSE_BASE_E : ATTN_LSE_BASE_2;
                attn_lse_base bo = (combo & 1) ? ATTN_LSE_BASE_2 : ATTN_LSE_BASE_E;
                poison(o2, ATTN_DTYPE_F32, (size_t)HR);
                poison(l2, ATTN_DTYPE_F32, (size_t)H);
                EXPECT_OK(attn_merge_attn_states(w.ctx, &ta, ba == ATTN_LSE_BASE_2 ? &tla2 : &tla, ba, &tb,
                                                 bb == ATTN_LSE_BASE_2 ? &tlb2 : &tlb, bb, &to2, &tl2, bo, NULL));
                for (x = 0; x < HR; x++)
                    if (!attn_test_near(o2[x], oe[x], 1e-6, 1e-5)) {
                        attn_test_fail(__FILE__, __LINE__,
                                       "bases combo %d: out[%d] = %.9g, base-e merge %.9g", combo, x,
                                       (double)o2[x], (double)oe[x]);
                        break;
                    }
                for (x = 0; x < H; x++)
                    EXPECT_NEAR(l2[x], bo == ATTN_LSE_BASE_2 ? le[x] * LOG2E : (double)le[x], 1e-5, 1e-6);
            }
            free(oe);
            free(le);
            free(o2);
            free(l2);
            free(la2);
            free(lb2);
        }
    }
    free(res.lat);
    free(res.lse);
    attn_metadata_destroy(meta);
    world_free(&w);
}

/* Empty partitions, aliasing, several rows, half-precision outputs. */
ATTN_TEST(test_mla_merge_edges) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEBUG, 1);
    int T = 3, H = 5, D = 40, n = T * H * D, x, i;
    float *oa = (float *)xmalloc((size_t)n * sizeof(float)),
          *ob = (float *)xmalloc((size_t)n * sizeof(float));
    float *oo = (float *)xmalloc((size_t)n * sizeof(float)),
          *ref = (float *)xmalloc((size_t)n * sizeof(float));
    float la[15], lb[15], lo[15], lref[15], linf[15];
    attn_tensor ta = t3(oa, ATTN_DTYPE_F32, T, H, D), tb = t3(ob, ATTN_DTYPE_F32, T, H, D);
    attn_tensor to = t3(oo, ATTN_DTYPE_F32, T, H, D), tr = t3(ref, ATTN_DTYPE_F32, T, H, D);
    attn_tensor tla = t2(la, T, H), tlb = t2(lb, T, H), tlo = t2(lo, T, H), tlr = t2(lref, T, H),
                tinf = t2(linf, T, H);
    rng r;
    rng_seed(&r, 42);
    if (!ctx) {
        attn_test_fail(__FILE__, __LINE__, "context");
        return;
    }
    for (x = 0; x < n; x++) {
        oa[x] = rng_nz(&r, 1.0f);
        ob[x] = rng_nz(&r, 1.0f);
    }
    for (x = 0; x < T * H; x++) {
        la[x] = rng_uniform(&r, -3, 8);
        lb[x] = rng_uniform(&r, -3, 8);
        linf[x] = -INFINITY;
    }
    la[0] = 50.0f;
    lb[0] = -40.0f; /* one side dominates */
    la[1] = 2.5f;
    lb[1] = 2.5f; /* equal */

    /* float64 check of the formula, row by row */
    EXPECT_OK(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &tr, &tlr,
                                     ATTN_LSE_BASE_E, NULL));
    for (i = 0; i < T * H; i++) {
        double m = la[i] > lb[i] ? la[i] : lb[i], wa = exp(la[i] - m), wb = exp(lb[i] - m);
        EXPECT_NEAR(lref[i], m + log(wa + wb), 1e-5, 1e-6);
        for (x = 0; x < D; x++)
            EXPECT_NEAR(ref[(size_t)i * D + x],
                        (wa * oa[(size_t)i * D + x] + wb * ob[(size_t)i * D + x]) / (wa + wb), 1e-6, 1e-5);
    }
    /* out aliasing out_a, and out_b: the same result */
    {
        float *ca = (float *)xmalloc((size_t)n * sizeof(float)), cla[15];
        attn_tensor tca = t3(ca, ATTN_DTYPE_F32, T, H, D), tcla = t2(cla, T, H);
        memcpy(ca, oa, (size_t)n * sizeof(float));
        memcpy(cla, la, sizeof cla);
        EXPECT_OK(attn_merge_attn_states(ctx, &tca, &tcla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &tca,
                                         &tcla, ATTN_LSE_BASE_E, NULL));
        EXPECT_TRUE(memcmp(ca, ref, (size_t)n * sizeof(float)) == 0);
        EXPECT_TRUE(memcmp(cla, lref, sizeof cla) == 0);
        memcpy(ca, ob, (size_t)n * sizeof(float));
        EXPECT_OK(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tca, &tlb, ATTN_LSE_BASE_E, &tca,
                                         NULL, ATTN_LSE_BASE_E, NULL));
        EXPECT_TRUE(memcmp(ca, ref, (size_t)n * sizeof(float)) == 0);
        free(ca);
    }
    /* an empty b (LSE -inf, finite or NaN garbage in its output) leaves a; an empty a with
       finite garbage leaves b (NaN garbage in an empty a: test_mla_merge_empty_nan) */
    for (i = 0; i < 2; i++) {
        float *garbage = (float *)xmalloc((size_t)n * sizeof(float));
        attn_tensor tg = t3(garbage, ATTN_DTYPE_F32, T, H, D);
        for (x = 0; x < n; x++) garbage[x] = i ? NAN : 1e6f;
        poison(oo, ATTN_DTYPE_F32, (size_t)n);
        poison(lo, ATTN_DTYPE_F32, 15);
        EXPECT_OK(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tg, &tinf, ATTN_LSE_BASE_E, &to,
                                         &tlo, ATTN_LSE_BASE_E, NULL));
        for (x = 0; x < n; x++)
            if (!attn_test_near(oo[x], oa[x], 1e-7, 1e-6)) {
                attn_test_fail(__FILE__, __LINE__, "empty b (%s): out[%d] = %g, a %g", i ? "NaN" : "finite",
                               x, (double)oo[x], (double)oa[x]);
                break;
            }
        for (x = 0; x < T * H; x++) EXPECT_NEAR(lo[x], la[x], 1e-6, 1e-6);
        if (i == 0) {
            poison(oo, ATTN_DTYPE_F32, (size_t)n);
            EXPECT_OK(attn_merge_attn_states(ctx, &tg, &tinf, ATTN_LSE_BASE_2, &tb, &tlb, ATTN_LSE_BASE_E,
                                             &to, &tlo, ATTN_LSE_BASE_E, NULL));
            for (x = 0; x < n; x++)
                if (!attn_test_near(oo[x], ob[x], 1e-7, 1e-6)) {
                    attn_test_fail(__FILE__, __LINE__, "empty a: out[%d] = %g, b %g", x, (double)oo[x],
                                   (double)ob[x]);
                    break;
                }
            for (x = 0; x < T * H; x++) EXPECT_NEAR(lo[x], lb[x], 1e-6, 1e-6);
        }
        /* both empty: out 0, lse -inf, no NaN, in either output base */
        poison(oo, ATTN_DTYPE_F32, (size_t)n);
        poison(lo, ATTN_DTYPE_F32, 15);
        EXPECT_OK(attn_merge_attn_states(ctx, &tg, &tinf, ATTN_LSE_BASE_E, &tg, &tinf, ATTN_LSE_BASE_2, &to,
                                         &tlo, i ? ATTN_LSE_BASE_2 : ATTN_LSE_BASE_E, NULL));
        for (x = 0; x < n; x++)
            if (oo[x] != 0.0f) {
                attn_test_fail(__FILE__, __LINE__, "both empty: out[%d] = %g", x, (double)oo[x]);
                break;
            }
        for (x = 0; x < T * H; x++) EXPECT_TRUE(lo[x] == -INFINITY);
        free(garbage);
    }
    /* half-precision outputs merge within their rounding */
    {
        static const attn_dtype dts[] = {ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
        int k;
        for (k = 0; k < 2; k++) {
            attn_dtype dt = dts[k];
            void *ha = xmalloc((size_t)n * 2), *hb = xmalloc((size_t)n * 2), *ho = xmalloc((size_t)n * 2);
            attn_tensor tha = t3(ha, dt, T, H, D), thb = t3(hb, dt, T, H, D), tho = t3(ho, dt, T, H, D);
            for (x = 0; x < n; x++) {
                put(ha, dt, (size_t)x, oa[x]);
                put(hb, dt, (size_t)x, ob[x]);
            }
            poison(ho, dt, (size_t)n);
            EXPECT_OK(attn_merge_attn_states(ctx, &tha, &tla, ATTN_LSE_BASE_E, &thb, &tlb, ATTN_LSE_BASE_E,
                                             &tho, NULL, ATTN_LSE_BASE_E, NULL));
            for (x = 0; x < n; x++)
                if (!attn_test_near(get(ho, dt, (size_t)x), ref[x], 2e-2, 1e-2)) {
                    attn_test_fail(__FILE__, __LINE__, "%s merge: out[%d] = %g, f32 %g", attn_dtype_name(dt),
                                   x, (double)get(ho, dt, (size_t)x), (double)ref[x]);
                    break;
                }
            /* mixed dtypes are rejected and nothing is written */
            poison(oo, ATTN_DTYPE_F32, (size_t)n);
            EXPECT_STATUS(attn_merge_attn_states(ctx, &tha, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E,
                                                 &to, NULL, ATTN_LSE_BASE_E, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            for (x = 0; x < n; x++)
                if (oo[x] == oo[x]) {
                    attn_test_fail(__FILE__, __LINE__, "rejected merge wrote out");
                    break;
                }
            free(ha);
            free(hb);
            free(ho);
        }
    }
    /* rejections: shapes, bases */
    {
        attn_tensor small = t3(ob, ATTN_DTYPE_F32, T, H, D - 8), lsmall = t2(lb, T, H - 1);
        EXPECT_STATUS(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &small, &tlb, ATTN_LSE_BASE_E,
                                             &to, NULL, ATTN_LSE_BASE_E, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_STATUS(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &lsmall, ATTN_LSE_BASE_E,
                                             &to, NULL, ATTN_LSE_BASE_E, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_STATUS(attn_merge_attn_states(ctx, &ta, &tla, (attn_lse_base)2, &tb, &tlb, ATTN_LSE_BASE_E,
                                             &to, NULL, ATTN_LSE_BASE_E, NULL),
                      ATTN_ERROR_INVALID_VALUE);
        EXPECT_STATUS(attn_merge_attn_states(ctx, &ta, NULL, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &to,
                                             NULL, ATTN_LSE_BASE_E, NULL),
                      ATTN_ERROR_NULL_ARGUMENT);
    }
    free(oa);
    free(ob);
    free(oo);
    free(ref);
    attn_context_destroy(ctx);
}

/* An empty partition "contributes nothing" whichever side it is on: with NaN in the
   unused output of the empty side (a buffer nobody wrote), merge(a, b) and merge(b, a)
   both give the other side. */
ATTN_TEST(test_mla_merge_empty_nan) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEBUG, 1);
    int H = 4, D = 64, n = H * D, x, side;
    float *ov = (float *)xmalloc((size_t)n * sizeof(float)),
          *og = (float *)xmalloc((size_t)n * sizeof(float));
    float *oo = (float *)xmalloc((size_t)n * sizeof(float));
    float lv[4] = {1.5f, -2.0f, 0.25f, 7.0f}, lg[4], lo[4];
    attn_tensor tv = t3(ov, ATTN_DTYPE_F32, 1, H, D), tg = t3(og, ATTN_DTYPE_F32, 1, H, D),
                to = t3(oo, ATTN_DTYPE_F32, 1, H, D);
    attn_tensor tlv = t2(lv, 1, H), tlg = t2(lg, 1, H), tlo = t2(lo, 1, H);
    if (!ctx) {
        attn_test_fail(__FILE__, __LINE__, "context");
        return;
    }
    for (x = 0; x < n; x++) {
        ov[x] = 0.01f * (float)(x % 37 + 1);
        og[x] = NAN;
    }
    for (x = 0; x < H; x++) lg[x] = -INFINITY;
    for (side = 0; side < 2; side++) {
        int bad = 0;
        poison(oo, ATTN_DTYPE_F32, (size_t)n);
        poison(lo, ATTN_DTYPE_F32, 4);
        if (side == 0) /* empty b */
            EXPECT_OK(attn_merge_attn_states(ctx, &tv, &tlv, ATTN_LSE_BASE_E, &tg, &tlg, ATTN_LSE_BASE_E, &to,
                                             &tlo, ATTN_LSE_BASE_E, NULL));
        else /* empty a */
            EXPECT_OK(attn_merge_attn_states(ctx, &tg, &tlg, ATTN_LSE_BASE_E, &tv, &tlv, ATTN_LSE_BASE_E, &to,
                                             &tlo, ATTN_LSE_BASE_E, NULL));
        for (x = 0; x < n && !bad; x++)
            if (!attn_test_near(oo[x], ov[x], 1e-7, 1e-6)) {
                attn_test_fail(
                    __FILE__, __LINE__,
                    "empty %s (LSE -inf, NaN in its out): merged out[%d] = %g, expected the other side's %g",
                    side ? "a" : "b", x, (double)oo[x], (double)ov[x]);
                bad = 1;
            }
        for (x = 0; x < H; x++) EXPECT_NEAR(lo[x], lv[x], 1e-6, 1e-6);
    }
    free(ov);
    free(og);
    free(oo);
    attn_context_destroy(ctx);
}

/* ---- reorder ------------------------------------------------------------------------- */

/* The reference two-pointer algorithm: the first prefill from the front is swapped with
   the last decode from the back, until the pointers meet. */
static int ref_reorder(const int32_t *ql, int n, int thr, int32_t *perm) {
    int i = 0, j = n - 1, swaps = 0, k;
    if (thr <= 0) thr = 1;
    for (k = 0; k < n; k++) perm[k] = k;
    for (;;) {
        while (i < n && ql[perm[i]] <= thr) i++;
        while (j >= 0 && ql[perm[j]] > thr) j--;
        if (i >= j) break;
        {
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        swaps++;
    }
    return swaps;
}

ATTN_TEST(test_mla_reorder_batch) {
    /* hand-made: D = 1, P = 5 (threshold 1) */
    static const struct {
        int n;
        int32_t ql[8];
        int thr;
        int nd, swaps;
        int32_t perm[8];
    } cases[] = {
        {4, {5, 1, 5, 1}, 0, 2, 1, {3, 1, 2, 0}},       /* P D P D */
        {4, {1, 1, 5, 5}, 0, 2, 0, {0, 1, 2, 3}},       /* already sorted */
        {4, {5, 5, 1, 1}, 0, 2, 2, {3, 2, 1, 0}},       /* P P D D */
        {4, {5, 1, 1, 1}, 0, 3, 1, {3, 1, 2, 0}},       /* P D D D */
        {5, {1, 5, 1, 5, 1}, 0, 3, 1, {0, 4, 2, 3, 1}}, /* D P D P D */
        {3, {1, 1, 1}, 0, 3, 0, {0, 1, 2}},
        {3, {7, 2, 9}, 0, 0, 0, {0, 1, 2}},
        {5, {3, 2, 1, 5, 2}, 2, 3, 1, {4, 1, 2, 3, 0}},       /* threshold 2 */
        {6, {0, 5, 1, 5, 0, 1}, 0, 4, 2, {0, 5, 2, 4, 3, 1}}, /* query_len 0 counts as a decode */
        {1, {5}, 0, 0, 0, {0}},
    };
    int k, i, nd, sw;
    int32_t perm[64], rperm[64], ql[64];
    for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        for (i = 0; i < 8; i++) perm[i] = -1;
        EXPECT_OK(attn_reorder_batch(cases[k].ql, cases[k].n, cases[k].thr, perm, &nd, &sw));
        EXPECT_EQ_INT(nd, cases[k].nd);
        EXPECT_EQ_INT(sw, cases[k].swaps);
        for (i = 0; i < cases[k].n; i++)
            if (perm[i] != cases[k].perm[i]) {
                attn_test_fail(__FILE__, __LINE__, "case %d: perm[%d] = %d, expected %d", k, i, perm[i],
                               cases[k].perm[i]);
                break;
            }
    }
    /* empty batch; num_swaps may be NULL */
    EXPECT_OK(attn_reorder_batch(NULL, 0, 0, NULL, &nd, &sw));
    EXPECT_EQ_INT(nd, 0);
    EXPECT_EQ_INT(sw, 0);
    EXPECT_OK(attn_reorder_batch(cases[0].ql, 4, 0, perm, &nd, NULL));
    /* random lists: decodes first, a permutation, the fewest swaps, nothing in place moves */
    {
        rng r;
        rng_seed(&r, 606);
        for (k = 0; k < 300; k++) {
            int n = rng_int(&r, 1, 64), thr = rng_int(&r, 0, 3), t = thr ? thr : 1, misplaced = 0, ok = 1;
            int seen[64];
            for (i = 0; i < n; i++)
                ql[i] = rng_int(&r, 0, 2) ? rng_int(&r, 0, t) : rng_int(&r, t + 1, t + 50);
            EXPECT_OK(attn_reorder_batch(ql, n, thr, perm, &nd, &sw));
            memset(seen, 0, sizeof seen);
            for (i = 0; i < n; i++) {
                if (perm[i] < 0 || perm[i] >= n || seen[perm[i]]++)
                    ok = 0;
                else if ((i < nd) != (ql[perm[i]] <= t))
                    ok = 0;
            }
            for (i = 0; i < nd; i++)
                if (ql[i] > t) misplaced++;
            for (i = 0; i < n && ok; i++)
                if ((i < nd && ql[i] <= t) || (i >= nd && ql[i] > t)) ok = perm[i] == i;
            if (ok)
                ok = sw == misplaced && sw == ref_reorder(ql, n, thr, rperm) &&
                     memcmp(perm, rperm, (size_t)n * sizeof(int32_t)) == 0;
            if (!ok) {
                attn_test_fail(__FILE__, __LINE__,
                               "random list %d (n %d, thr %d): bad permutation or swaps %d (expected %d)", k,
                               n, thr, sw, misplaced);
                break;
            }
        }
    }
    /* rejections (no context: the lines would go to stderr, so the level is 'none') */
    {
        attn_test_env saved = attn_test_env_save("ATTN_LOG_LEVEL");
        setenv("ATTN_LOG_LEVEL", "none", 1);
        ql[0] = 1;
        ql[1] = -2;
        perm[0] = 77;
        nd = 55;
        EXPECT_STATUS(attn_reorder_batch(ql, 2, 0, perm, &nd, &sw), ATTN_ERROR_INVALID_VALUE);
        EXPECT_EQ_INT(nd, 55);
        EXPECT_STATUS(attn_reorder_batch(ql, 1, -1, perm, &nd, &sw), ATTN_ERROR_INVALID_VALUE);
        EXPECT_STATUS(attn_reorder_batch(ql, -1, 0, perm, &nd, &sw), ATTN_ERROR_INVALID_VALUE);
        EXPECT_STATUS(attn_reorder_batch(ql, 1, 0, perm, NULL, &sw), ATTN_ERROR_NULL_ARGUMENT);
        EXPECT_STATUS(attn_reorder_batch(ql, 1, 0, NULL, &nd, &sw), ATTN_ERROR_NULL_ARGUMENT);
        EXPECT_EQ_INT(nd, 55);
        attn_test_env_restore(&saved);
    }
}

/* An unsorted batch: building it fails (INVALID_METADATA, logged as such); reordered with
   attn_reorder_batch, it runs and every original request matches its reference (the
   float64 reference is computed once, in the original order, and mapped through perm). */
ATTN_TEST(test_mla_unsorted_batch_reordered) {
    static const int qlens[] = {30, 1, 12, 1, 1, 50, 1};
    int slens[7] = {200, 600, 12, 1, 90, 50, 1300};
    int nreq = 7, i, nd, sw, k;
    int32_t ql[7], perm[7];
    mcfg cu, cs;
    mworld wu, ws;
    attn_metadata *meta;
    attn_status st;
    slens[1] = scaled(600, 150);
    slens[6] = scaled(1300, 300);
    base_cfg(&cu, 16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    cu.nref = 3;
    cu.seed = 7070;
    cu.use_stream = 1;
    cu.write_new = 0;
    for (i = 0; i < nreq; i++) {
        add_req(&cu, qlens[i], slens[i]);
        cu.stream[i] = i;
        ql[i] = qlens[i];
    }
    EXPECT_OK(attn_reorder_batch(ql, nreq, 0, perm, &nd, &sw));
    EXPECT_EQ_INT(nd, 4);
    EXPECT_EQ_INT(sw, 2); /* P D P D D P D: 30<->1300, 12<->90 */
    cs = cu;
    cs.nreq = 0;
    for (i = 0; i < nreq; i++) {
        add_req(&cs, qlens[perm[i]], slens[perm[i]]);
        cs.stream[i] = perm[i];
    }
    for (i = 0; i < nd; i++) EXPECT_TRUE(cs.qlen[i] <= 1);
    for (i = nd; i < nreq; i++) EXPECT_TRUE(cs.qlen[i] > 1);
    cs.no_ref = 1;

    if (!world_init(&wu, &cu)) {
        world_free(&wu);
        return;
    }
    {
        attn_test_log cap;
        /* the unsorted build, on a context that captures the log */
        attn_context *lctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
        if (lctx) {
            attn_layer_desc d = *attn_layer_get_desc(wu.layer);
            attn_layer *l2 = NULL;
            attn_metadata_desc md;
            attn_metadata *m2 = NULL;
            attn_batch b = world_batch(&wu);
            EXPECT_OK(attn_layer_create(lctx, &d, NULL, &l2));
            memset(&md, 0, sizeof md);
            md.max_num_reqs = nreq;
            md.max_num_tokens = wu.ntok + 4;
            md.max_blocks_per_req = wu.stride;
            md.num_blocks = wu.nblocks;
            if (l2) EXPECT_OK(attn_metadata_create(l2, &md, &m2));
            if (m2) {
                attn_test_log_reset(&cap);
                EXPECT_STATUS(attn_metadata_build(m2, 0, &b, 0), ATTN_ERROR_INVALID_METADATA);
                EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_INVALID_METADATA, ATTN_LOG_LEVEL_ERROR));
                /* and the forward calls refuse a metadata that was never built */
                {
                    attn_tensor tq = t3(wu.qn_raw, ATTN_DTYPE_F32, wu.ntok, 16, 576);
                    attn_tensor to = t3(wu.qn_raw, ATTN_DTYPE_F32, wu.ntok, 16, 512);
                    EXPECT_STATUS(attn_mla_forward_mqa(l2, m2, &tq, NULL, &wu.t_cache, &to, NULL, NULL),
                                  ATTN_ERROR_INVALID_METADATA);
                }
            }
            attn_metadata_destroy(m2);
            attn_layer_destroy(l2);
        }
        attn_context_destroy(lctx);
    }
    meta = world_meta(&wu, 0, &st);
    EXPECT_TRUE(meta == NULL);
    EXPECT_EQ_INT(st, ATTN_ERROR_INVALID_METADATA);
    attn_metadata_destroy(meta);

    if (!world_init(&ws, &cs)) {
        world_free(&ws);
        world_free(&wu);
        return;
    }
    /* the same data per original request; its reference rows mapped through perm */
    {
        size_t nr = (size_t)wu.nref, R = 512;
        ws.nref = wu.nref;
        memcpy(ws.refh, wu.refh, sizeof ws.refh);
        ws.ref_out = (double *)xmalloc((size_t)ws.ntok * nr * VDIM * sizeof(double));
        ws.ref_lat = (double *)xmalloc((size_t)ws.ntok * nr * R * sizeof(double));
        ws.ref_lse = (double *)xmalloc((size_t)ws.ntok * nr * sizeof(double));
        for (k = 0; k < nreq; k++) {
            int orig = perm[k], t;
            EXPECT_TRUE(memcmp(ws.lat[k], wu.lat[orig], (size_t)cs.slen[k] * 576 * sizeof(float)) == 0);
            for (t = 0; t < cs.qlen[k]; t++) {
                size_t row = (size_t)(ws.qsl[k] + t), orow = (size_t)(wu.qsl[orig] + t);
                EXPECT_TRUE(memcmp(ws.qn + row * 16 * NOPE, wu.qn + orow * 16 * NOPE,
                                   16 * NOPE * sizeof(float)) == 0);
                memcpy(ws.ref_out + row * nr * VDIM, wu.ref_out + orow * nr * VDIM,
                       nr * VDIM * sizeof(double));
                memcpy(ws.ref_lat + row * nr * R, wu.ref_lat + orow * nr * R, nr * R * sizeof(double));
                memcpy(ws.ref_lse + row * nr, wu.ref_lse + orow * nr, nr * sizeof(double));
            }
        }
    }
    meta = world_meta(&ws, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) {
        run_fused(&ws, meta, 1, "reordered fused", NULL);
        run_mqa(&ws, meta, 1, "reordered mqa", NULL);
        run_mha(&ws, meta, "reordered mha");
    }
    attn_metadata_destroy(meta);
    world_free(&ws);
    world_free(&wu);
}

/* ---- rejections --------------------------------------------------------------------------- */

static attn_layer_desc mla_desc(int H, int hs, int rank) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.use_mla = 1;
    d.num_heads = H;
    d.head_size = hs;
    d.kv_lora_rank = rank;
    d.qk_rope_head_dim = 64;
    d.dtype = ATTN_DTYPE_F32;
    return d;
}

ATTN_TEST(test_mla_reject_layers) {
    attn_test_log cap;
    attn_context *ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 2);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_select_request req;
    attn_selection sel;
    float slopes[16];
    int i, found;
    if (!ctx) return;
    for (i = 0; i < 16; i++) slopes[i] = 0.1f;

    /* 600 = 536 + 64: no backend (CPU_MLA skipped, and named in the record) */
    d = mla_desc(16, 600, 536);
    attn_test_log_reset(&cap);
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNSUPPORTED);
    EXPECT_TRUE(layer == NULL);
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_NO_BACKEND, ATTN_LOG_LEVEL_ERROR));
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_CANDIDATE_SKIPPED, ATTN_LOG_LEVEL_DEBUG));
    memset(&sel, 0, sizeof sel);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &sel), ATTN_ERROR_UNSUPPORTED);
    EXPECT_EQ_INT(sel.resolved, ATTN_BACKEND_AUTO);
    EXPECT_EQ_INT(sel.use_mla, 1);
    found = 0;
    for (i = 0; i < sel.num_skipped; i++) found |= sel.skipped[i].backend == ATTN_BACKEND_CPU_MLA;
    EXPECT_TRUE(found);
    /* 384 = 320 + 64 and 448: sizes between the supported ones */
    d = mla_desc(16, 384, 320);
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNSUPPORTED);
    d = mla_desc(16, 576, 512);
    d.qk_rope_head_dim = 32;
    d.kv_lora_rank = 544;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNSUPPORTED);

    /* head_size != kv_lora_rank + qk_rope_head_dim */
    d = mla_desc(16, 576, 500);
    attn_test_log_reset(&cap);
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_INVALID_DESC, ATTN_LOG_LEVEL_ERROR));
    d = mla_desc(16, 320, 512);
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    /* MLA dimensions out of range (a fuzzer input: INT_MAX + 64 overflowed in the default
       scale before this was checked) */
    for (i = 0; i < 4; i++) {
        d = mla_desc(16, 576, 512);
        if (i == 0) d.qk_nope_head_dim = INT_MAX;
        if (i == 1) d.v_head_dim = 65537;
        if (i == 2) d.qk_rope_head_dim = INT_MAX;
        if (i == 3) d.kv_lora_rank = -1;
        attn_test_log_reset(&cap);
        EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_INVALID_DESC, ATTN_LOG_LEVEL_ERROR));
        EXPECT_TRUE(layer == NULL);
    }
    /* more than one KV head */
    d = mla_desc(16, 576, 512);
    d.num_kv_heads = 2;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);

    /* ALiBi, sliding window, soft cap, non-causal on an MLA layer */
    for (i = 0; i < 4; i++) {
        d = mla_desc(16, 576, 512);
        if (i == 0) d.alibi_slopes = slopes;
        if (i == 1) d.sliding_window = 128;
        if (i == 2) d.logits_soft_cap = 30.0f;
        if (i == 3) d.causal = ATTN_CAUSAL_NO;
        attn_test_log_reset(&cap);
        EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNSUPPORTED);
        EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_NO_BACKEND, ATTN_LOG_LEVEL_ERROR));
        EXPECT_TRUE(layer == NULL);
    }

    /* explicit CPU_MLA for a standard layer; explicit CPU for an MLA layer */
    memset(&d, 0, sizeof d);
    d.num_heads = 8;
    d.head_size = 128;
    d.dtype = ATTN_DTYPE_F32;
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CPU_MLA;
    attn_test_log_reset(&cap);
    EXPECT_STATUS(attn_layer_create(ctx, &d, &req, &layer), ATTN_ERROR_BACKEND_UNAVAILABLE);
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_EXPLICIT_FAILED, ATTN_LOG_LEVEL_ERROR));
    d = mla_desc(16, 576, 512);
    req.backend = ATTN_BACKEND_CPU;
    attn_test_log_reset(&cap);
    EXPECT_STATUS(attn_layer_create(ctx, &d, &req, &layer), ATTN_ERROR_BACKEND_UNAVAILABLE);
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_EXPLICIT_FAILED, ATTN_LOG_LEVEL_ERROR));
    /* with fallback the automatic choice serves, with a WARN */
    req.allow_fallback = 1;
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_layer_create(ctx, &d, &req, &layer));
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_FALLBACK, ATTN_LOG_LEVEL_WARN));
    if (layer) EXPECT_EQ_INT(attn_layer_backend(layer)->id, ATTN_BACKEND_CPU_MLA);
    attn_layer_destroy(layer);
    layer = NULL;
    /* explicit CPU_MLA for an MLA layer works; the default too, logged once at INFO */
    req.backend = ATTN_BACKEND_CPU_MLA;
    req.allow_fallback = 0;
    EXPECT_OK(attn_layer_create(ctx, &d, &req, &layer));
    attn_layer_destroy(layer);
    layer = NULL;
    d.dtype = ATTN_DTYPE_BF16; /* a descriptor not in the selection cache yet */
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_RESOLVED, ATTN_LOG_LEVEL_INFO));
    if (layer) {
        const attn_layer_desc *e = attn_layer_get_desc(layer);
        EXPECT_EQ_INT(e->num_kv_heads, 1);
        EXPECT_EQ_INT(e->qk_nope_head_dim, 128);
        EXPECT_EQ_INT(e->v_head_dim, 128);
        EXPECT_NEAR(e->scale, 1.0 / sqrt(192.0), 1e-7, 1e-6);
        EXPECT_EQ_INT(attn_layer_selection(layer)->use_mla, 1);
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* Calls that do not fit the layer, bad slots, bad shapes: the status, and outputs and
   caches untouched. */
/* attn_layer_set_decode_parallelism: the backends' hook for the GPU split policy. Bad
   values are named and change nothing; on a CPU layer the split count stays the CPU's. */
ATTN_TEST(test_mla_decode_parallelism_checked) {
    mcfg c;
    mworld w;
    attn_metadata *meta;
    attn_mla_info before, after;
    const char *err;
    base_cfg(&c, 16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.seed = 1212;
    add_req(&c, 1, 3000);
    add_req(&c, 1, 700);
    if (!world_init(&w, &c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) EXPECT_OK(attn_metadata_mla_info(meta, &before));
    EXPECT_STATUS(attn_layer_set_decode_parallelism(NULL, 8, 16), ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_STATUS(attn_layer_set_decode_parallelism(w.layer, 0, 16), ATTN_ERROR_INVALID_VALUE);
    err = attn_context_last_error(w.ctx);
    EXPECT_TRUE(err && strstr(err, "resident_items is 0") && strstr(err, "allowed: 1 .."));
    EXPECT_STATUS(attn_layer_set_decode_parallelism(w.layer, (1 << 20) + 1, 16), ATTN_ERROR_INVALID_VALUE);
    EXPECT_STATUS(attn_layer_set_decode_parallelism(w.layer, 8, 0), ATTN_ERROR_INVALID_VALUE);
    err = attn_context_last_error(w.ctx);
    EXPECT_TRUE(err && strstr(err, "heads_per_item is 0") && strstr(err, "allowed: 1 .. 4096"));
    EXPECT_STATUS(attn_layer_set_decode_parallelism(w.layer, 8, 4097), ATTN_ERROR_INVALID_VALUE);
    EXPECT_OK(attn_layer_set_decode_parallelism(w.layer, 1, 1));
    if (meta) {
        attn_metadata *m2 = world_meta(&w, 0, NULL);
        EXPECT_TRUE(m2 != NULL);
        if (m2) {
            EXPECT_OK(attn_metadata_mla_info(m2, &after));
            EXPECT_EQ_INT(after.num_kv_splits, before.num_kv_splits); /* the CPU's policy */
            EXPECT_TRUE(before.num_kv_splits >= 1);
        }
        attn_metadata_destroy(m2);
    }
    attn_metadata_destroy(meta);
    world_free(&w);
}

ATTN_TEST(test_mla_reject_calls) {
    attn_test_log cap;
    mcfg c;
    mworld w;
    attn_metadata *meta = NULL;
    attn_context *ctx = NULL;
    attn_layer *std_layer = NULL;
    attn_metadata *std_meta = NULL;
    int H = 8, R = 512, D = 576, x;
    attn_test_log wcap;
    base_cfg(&c, H, R, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    memset(&wcap, 0, sizeof wcap);
    c.cap = &wcap;
    c.seed = 1111;
    add_req(&c, 1, 40);
    add_req(&c, 5, 20);
    if (!world_init(&w, &c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 2);
    if (!meta || !ctx) {
        attn_metadata_destroy(meta);
        attn_context_destroy(ctx);
        world_free(&w);
        return;
    }
    {
        /* a standard layer with its own cache and metadata */
        attn_layer_desc sd;
        attn_metadata_desc md;
        attn_batch b;
        int32_t qsl[2] = {0, 1}, seq[1] = {4}, bt[1] = {0};
        memset(&sd, 0, sizeof sd);
        sd.num_heads = H;
        sd.head_size = 64;
        sd.dtype = ATTN_DTYPE_F32;
        EXPECT_OK(attn_layer_create(ctx, &sd, NULL, &std_layer));
        memset(&md, 0, sizeof md);
        md.max_num_reqs = 1;
        md.max_num_tokens = 1;
        md.max_blocks_per_req = 1;
        md.num_blocks = 1;
        if (std_layer) EXPECT_OK(attn_metadata_create(std_layer, &md, &std_meta));
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl;
        b.seq_lens = seq;
        b.block_table = bt;
        b.block_table_stride = 1;
        b.num_reqs = 1;
        b.num_actual_tokens = 1;
        b.max_query_len = 1;
        b.max_seq_len = 4;
        if (std_meta) EXPECT_OK(attn_metadata_build(std_meta, 0, &b, 0));
    }
    {
        /* buffers for the bad calls, poisoned; checked untouched afterwards */
        size_t nq = (size_t)8 * H * D;
        float *q = (float *)xmalloc(nq * sizeof(float)), *o = (float *)xmalloc(nq * sizeof(float));
        float *lse = (float *)xmalloc((size_t)8 * H * sizeof(float));
        float *cache_copy = (float *)xmalloc(w.cache_elems * sizeof(float));
        float *std_cache = (float *)xmalloc((size_t)2 * 2 * 16 * 8 * 64 * sizeof(float));
        int64_t shape[5];
        attn_tensor tq, tq_bad, to, to_bad, to_bad2, tl, tqpe, tqpe_bad, tqlat, tsc;
        attn_mla_info info;
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        EXPECT_EQ_INT(info.num_decode_tokens, 1);
        for (x = 0; x < (int)nq; x++) q[x] = 0.01f * (float)((x % 13) + 1);
        poison(o, ATTN_DTYPE_F32, nq);
        poison(lse, ATTN_DTYPE_F32, (size_t)8 * H);
        tq = t3(q, ATTN_DTYPE_F32, 1, H, D);
        tq_bad = t3(q, ATTN_DTYPE_F32, 1, H, 575);
        to = t3(o, ATTN_DTYPE_F32, 1, H, R);
        to_bad = t3(o, ATTN_DTYPE_F32, 1, H, D);
        to_bad2 = t3(o, ATTN_DTYPE_F32, 1, H - 1, R);
        tl = t2(lse, 1, H);
        tqpe = t3(q, ATTN_DTYPE_F32, 1, H, 64);
        tqpe_bad = t3(q, ATTN_DTYPE_F32, 1, H, 32);
        tqlat = t3(q, ATTN_DTYPE_F32, 1, H, R);
        shape[0] = 2;
        shape[1] = 2;
        shape[2] = 16;
        shape[3] = H;
        shape[4] = 64;
        tsc = attn_tensor_make(std_cache, ATTN_DTYPE_F32, 5, shape);
        memset(std_cache, 0, (size_t)2 * 2 * 16 * 8 * 64 * sizeof(float));

        /* forward_mqa: wrong q width, q_pe width, out width/heads, dtype, empty decode rows */
        attn_test_log_reset(&wcap);
        EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tq_bad, NULL, &w.t_cache, &to, &tl, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_TRUE(attn_test_log_has(&wcap, ATTN_LOG_TENSOR_SHAPE, ATTN_LOG_LEVEL_ERROR));
        EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tq, &tqpe, &w.t_cache, &to, &tl, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tqlat, &tqpe_bad, &w.t_cache, &to, &tl, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tqlat, NULL, &w.t_cache, &to, &tl, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tq, NULL, &w.t_cache, &to_bad, &tl, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tq, NULL, &w.t_cache, &to_bad2, &tl, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        {
            attn_tensor tl_bad = t2(lse, 1, H + 1), tq0 = t3(q, ATTN_DTYPE_F32, 0, H, D), tqh = tq;
            attn_tensor tcache_bad = w.t_cache;
            tqh.dtype = ATTN_DTYPE_F16;
            EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tq, NULL, &w.t_cache, &to, &tl_bad, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tq0, NULL, &w.t_cache, &to, &tl, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tqh, NULL, &w.t_cache, &to, &tl, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            tcache_bad.shape[2] = 512;
            EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tq, NULL, &tcache_bad, &to, &tl, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            tcache_bad = w.t_cache;
            tcache_bad.shape[0] = w.nblocks - 1;
            EXPECT_STATUS(attn_mla_forward_mqa(w.layer, meta, &tq, NULL, &tcache_bad, &to, &tl, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
        }
        for (x = 0; x < (int)nq; x++)
            if (o[x] == o[x]) {
                attn_test_fail(__FILE__, __LINE__, "a rejected forward_mqa wrote out_latent[%d]", x);
                break;
            }
        for (x = 0; x < 8 * H; x++)
            if (lse[x] == lse[x]) {
                attn_test_fail(__FILE__, __LINE__, "a rejected forward_mqa wrote lse[%d]", x);
                break;
            }
        /* and the same call with good shapes runs */
        EXPECT_OK(attn_mla_forward_mqa(w.layer, meta, &tq, NULL, &w.t_cache, &to, &tl, NULL));
        for (x = 0; x < H * R; x++)
            if (!is_finite(o[x])) {
                attn_test_fail(__FILE__, __LINE__, "out_latent[%d] not written", x);
                break;
            }
        poison(o, ATTN_DTYPE_F32, nq);
        poison(lse, ATTN_DTYPE_F32, (size_t)8 * H);

        /* forward_mha: wrong q width, w_uk/w_uv shapes, out width */
        {
            attn_tensor tqm = t3(q, ATTN_DTYPE_F32, 5, H, 192), tqm_bad = t3(q, ATTN_DTYPE_F32, 5, H, 128);
            attn_tensor tom = t3(o, ATTN_DTYPE_F32, 5, H, 128), tom_bad = t3(o, ATTN_DTYPE_F32, 5, H, 192);
            attn_tensor tuk_bad = w.t_wuk, tuv_bad = w.t_wuv, tlm = t2(lse, 5, H);
            attn_tensor tqm_short = t3(q, ATTN_DTYPE_F32, 4, H, 192);
            tuk_bad.shape[1] = 64;
            tuv_bad.shape[2] = 64;
            EXPECT_STATUS(attn_mla_forward_mha(w.layer, meta, &tqm_bad, &w.t_cache, &w.t_wuk, &w.t_wuv, &tom,
                                               &tlm, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_STATUS(attn_mla_forward_mha(w.layer, meta, &tqm_short, &w.t_cache, &w.t_wuk, &w.t_wuv,
                                               &tom, &tlm, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_STATUS(
                attn_mla_forward_mha(w.layer, meta, &tqm, &w.t_cache, &tuk_bad, &w.t_wuv, &tom, &tlm, NULL),
                ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_STATUS(
                attn_mla_forward_mha(w.layer, meta, &tqm, &w.t_cache, &w.t_wuk, &tuv_bad, &tom, &tlm, NULL),
                ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_STATUS(attn_mla_forward_mha(w.layer, meta, &tqm, &w.t_cache, &w.t_wuk, &w.t_wuv, &tom_bad,
                                               &tlm, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_STATUS(
                attn_mla_forward_mha(w.layer, meta, &tqm, &w.t_cache, &w.t_wuk, &w.t_wuv, NULL, &tlm, NULL),
                ATTN_ERROR_NULL_ARGUMENT);
            for (x = 0; x < (int)nq; x++)
                if (o[x] == o[x]) {
                    attn_test_fail(__FILE__, __LINE__, "a rejected forward_mha wrote out[%d]", x);
                    break;
                }
            for (x = 0; x < 8 * H; x++)
                if (lse[x] == lse[x]) {
                    attn_test_fail(__FILE__, __LINE__, "a rejected forward_mha wrote lse[%d]", x);
                    break;
                }
        }
        /* the fused call: one of kv_c / k_pe; a q_nope of the wrong width */
        {
            int64_t s2[3];
            attn_tensor tqn, tqp, tof, tkc, tkp, tqn_bad;
            s2[0] = w.ntok;
            s2[1] = H;
            s2[2] = 128;
            tqn = attn_tensor_make(w.qn_raw, ATTN_DTYPE_F32, 3, s2);
            tof = attn_tensor_make(o, ATTN_DTYPE_F32, 3, s2);
            s2[2] = 64;
            tqp = attn_tensor_make(w.qp_raw, ATTN_DTYPE_F32, 3, s2);
            tqn_bad = tqp;
            s2[1] = R;
            tkc = attn_tensor_make(w.kvc_raw, ATTN_DTYPE_F32, 2, s2);
            s2[1] = 64;
            tkp = attn_tensor_make(w.kpe_raw, ATTN_DTYPE_F32, 2, s2);
            for (x = 0; x < (int)w.cache_elems; x++) cache_copy[x] = ((float *)w.cache)[x];
            EXPECT_STATUS(attn_mla_forward(w.layer, meta, &tqn, &tqp, &tkc, NULL, &w.t_cache, &w.t_wuk,
                                           &w.t_wuv, &tof, NULL),
                          ATTN_ERROR_NULL_ARGUMENT);
            EXPECT_STATUS(attn_mla_forward(w.layer, meta, &tqn_bad, &tqp, &tkc, &tkp, &w.t_cache, &w.t_wuk,
                                           &w.t_wuv, &tof, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_STATUS(attn_mla_forward(w.layer, meta, &tqn, &tqp, &tkp, &tkc, &w.t_cache, &w.t_wuk,
                                           &w.t_wuv, &tof, NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_TRUE(memcmp(cache_copy, w.cache, w.cache_elems * sizeof(float)) == 0);
            for (x = 0; x < (int)nq; x++)
                if (o[x] == o[x]) {
                    attn_test_fail(__FILE__, __LINE__, "a rejected fused call wrote out[%d]", x);
                    break;
                }
        }
        /* concat_and_cache_mla: a slot out of range (after valid ones) writes nothing */
        {
            int64_t slots[3], s2[2];
            attn_tensor tkc, tkp, tkc_bad;
            s2[0] = 3;
            s2[1] = R;
            tkc = attn_tensor_make(w.kvc_raw, ATTN_DTYPE_F32, 2, s2);
            s2[1] = 64;
            tkp = attn_tensor_make(w.kpe_raw, ATTN_DTYPE_F32, 2, s2);
            s2[1] = 256;
            tkc_bad = attn_tensor_make(w.kvc_raw, ATTN_DTYPE_F32, 2, s2);
            slots[0] = 0;
            slots[1] = 5;
            slots[2] = (int64_t)w.nblocks * c.bs;
            for (x = 0; x < (int)w.cache_elems; x++) cache_copy[x] = ((float *)w.cache)[x];
            attn_test_log_reset(&wcap);
            EXPECT_STATUS(attn_concat_and_cache_mla(w.layer, &tkc, &tkp, &w.t_cache, ATTN_TEST_SLOTS(slots, 3), NULL),
                          ATTN_ERROR_INVALID_VALUE);
            EXPECT_TRUE(attn_test_log_has(&wcap, ATTN_LOG_INVALID_SLOT, ATTN_LOG_LEVEL_ERROR));
            slots[2] = -2;
            EXPECT_STATUS(attn_concat_and_cache_mla(w.layer, &tkc, &tkp, &w.t_cache, ATTN_TEST_SLOTS(slots, 3), NULL),
                          ATTN_ERROR_INVALID_VALUE);
            slots[2] = 7;
            EXPECT_STATUS(attn_concat_and_cache_mla(w.layer, &tkc_bad, &tkp, &w.t_cache, ATTN_TEST_SLOTS(slots, 3), NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_STATUS(attn_concat_and_cache_mla(w.layer, &tkc, &tkp, &w.t_cache, ATTN_TEST_SLOTS(slots, -1), NULL),
                          ATTN_ERROR_SHAPE_MISMATCH);
            EXPECT_TRUE(memcmp(cache_copy, w.cache, w.cache_elems * sizeof(float)) == 0);
            /* -1 skips; the others land */
            slots[0] = -1;
            slots[1] = 3;
            slots[2] = -1;
            EXPECT_OK(attn_concat_and_cache_mla(w.layer, &tkc, &tkp, &w.t_cache, ATTN_TEST_SLOTS(slots, 3), NULL));
            EXPECT_TRUE(memcmp(cache_copy, w.cache, (size_t)3 * D * sizeof(float)) == 0);
            for (x = 0; x < R; x++)
                EXPECT_TRUE(((float *)w.cache)[(size_t)3 * D + x] == ((float *)w.kvc_raw)[R + x]);
            for (x = 0; x < 64; x++)
                EXPECT_TRUE(((float *)w.cache)[(size_t)3 * D + R + x] == ((float *)w.kpe_raw)[64 + x]);
            EXPECT_TRUE(memcmp((float *)cache_copy + (size_t)4 * D, (float *)w.cache + (size_t)4 * D,
                               (w.cache_elems - (size_t)4 * D) * sizeof(float)) == 0);
            /* on a standard layer */
            if (std_layer)
                EXPECT_STATUS(attn_concat_and_cache_mla(std_layer, &tkc, &tkp, &tsc, ATTN_TEST_SLOTS(slots, 3), NULL),
                              ATTN_ERROR_UNSUPPORTED);
        }
        /* metadata: unbuilt; of an MLA layer of another shape; no slot_mapping for a write;
           decode_threshold / num_kv_splits out of range */
        {
            attn_metadata_desc md;
            attn_metadata *m0 = NULL;
            attn_layer *other = NULL, *twin = NULL;
            attn_layer_desc od = *attn_layer_get_desc(w.layer);
            attn_mla_info i0;
            attn_batch b = world_batch(&w);
            memset(&md, 0, sizeof md);
            md.max_num_reqs = 4;
            md.max_num_tokens = 16;
            md.max_blocks_per_req = w.stride;
            md.num_blocks = w.nblocks;
            {
                static const int bad[][2] = {{-1, 0}, {0, -1}, {0, 1025}, {(1 << 16) + 1, 0}};
                int k;
                for (k = 0; k < 4; k++) {
                    attn_metadata *mb = NULL;
                    md.decode_threshold = bad[k][0];
                    md.num_kv_splits = bad[k][1];
                    attn_test_log_reset(&wcap);
                    EXPECT_STATUS(attn_metadata_create(w.layer, &md, &mb), ATTN_ERROR_INVALID_VALUE);
                    EXPECT_TRUE(mb == NULL);
                    EXPECT_TRUE(attn_test_log_has(&wcap, ATTN_LOG_INVALID_DESC, ATTN_LOG_LEVEL_ERROR));
                    attn_metadata_destroy(mb);
                }
                md.decode_threshold = 0;
                md.num_kv_splits = 0;
            }
            EXPECT_OK(attn_metadata_create(w.layer, &md, &m0));
            if (m0) {
                int64_t s2[3];
                attn_tensor tqn, tqp, tof, tkc, tkp;
                attn_test_log_reset(&wcap);
                EXPECT_STATUS(attn_metadata_mla_info(m0, &i0), ATTN_ERROR_INVALID_METADATA);
                EXPECT_TRUE(attn_test_log_has(&wcap, ATTN_LOG_METADATA_MISMATCH, ATTN_LOG_LEVEL_ERROR));
                b.slot_mapping = NULL;
                EXPECT_OK(attn_metadata_build(m0, 0, &b, 0));
                s2[0] = w.ntok;
                s2[1] = H;
                s2[2] = 128;
                tqn = attn_tensor_make(w.qn_raw, ATTN_DTYPE_F32, 3, s2);
                tof = attn_tensor_make(o, ATTN_DTYPE_F32, 3, s2);
                s2[2] = 64;
                tqp = attn_tensor_make(w.qp_raw, ATTN_DTYPE_F32, 3, s2);
                s2[1] = R;
                tkc = attn_tensor_make(w.kvc_raw, ATTN_DTYPE_F32, 2, s2);
                s2[1] = 64;
                tkp = attn_tensor_make(w.kpe_raw, ATTN_DTYPE_F32, 2, s2);
                for (x = 0; x < (int)w.cache_elems; x++) cache_copy[x] = ((float *)w.cache)[x];
                EXPECT_STATUS(attn_mla_forward(w.layer, m0, &tqn, &tqp, &tkc, &tkp, &w.t_cache, &w.t_wuk,
                                               &w.t_wuv, &tof, NULL),
                              ATTN_ERROR_INVALID_METADATA);
                EXPECT_TRUE(memcmp(cache_copy, w.cache, w.cache_elems * sizeof(float)) == 0);
                for (x = 0; x < (int)nq; x++)
                    if (o[x] == o[x]) {
                        attn_test_fail(__FILE__, __LINE__, "a rejected fused call wrote out[%d]", x);
                        break;
                    }
            }
            attn_metadata_destroy(m0);
            od.num_heads = H * 2;
            EXPECT_OK(attn_layer_create(w.ctx, &od, NULL, &other));
            if (other) {
                attn_tensor tq2 = t3(q, ATTN_DTYPE_F32, 1, 2 * H, D),
                            to2 = t3(o, ATTN_DTYPE_F32, 1, 2 * H, R);
                EXPECT_STATUS(attn_mla_forward_mqa(other, meta, &tq2, NULL, &w.t_cache, &to2, NULL, NULL),
                              ATTN_ERROR_INVALID_METADATA);
                for (x = 0; x < (int)nq; x++)
                    if (o[x] == o[x]) {
                        attn_test_fail(__FILE__, __LINE__, "a rejected forward_mqa wrote out[%d]", x);
                        break;
                    }
            }
            attn_layer_destroy(other);
            /* a second layer of the same shape may share the metadata, and agrees bitwise */
            od.num_heads = H;
            EXPECT_OK(attn_layer_create(w.ctx, &od, NULL, &twin));
            if (twin) {
                float *o1 = (float *)xmalloc((size_t)H * R * sizeof(float));
                EXPECT_OK(attn_mla_forward_mqa(w.layer, meta, &tq, NULL, &w.t_cache, &to, NULL, NULL));
                memcpy(o1, o, (size_t)H * R * sizeof(float));
                poison(o, ATTN_DTYPE_F32, nq);
                EXPECT_OK(attn_mla_forward_mqa(twin, meta, &tq, NULL, &w.t_cache, &to, NULL, NULL));
                EXPECT_TRUE(memcmp(o1, o, (size_t)H * R * sizeof(float)) == 0);
                free(o1);
            }
            attn_layer_destroy(twin);
            poison(o, ATTN_DTYPE_F32, nq);
        }
        /* the wrong kind of layer */
        if (std_layer && std_meta) {
            attn_tensor tsq = t3(q, ATTN_DTYPE_F32, 1, H, 64), tso = t3(o, ATTN_DTYPE_F32, 1, H, 64);
            attn_mla_info info2;
            attn_test_log_reset(&cap);
            EXPECT_STATUS(attn_mla_forward_mqa(std_layer, std_meta, &tq, NULL, &tsc, &to, &tl, NULL),
                          ATTN_ERROR_UNSUPPORTED);
            EXPECT_STATUS(
                attn_mla_forward_mha(std_layer, std_meta, &tq, &tsc, &w.t_wuk, &w.t_wuv, &to, NULL, NULL),
                ATTN_ERROR_UNSUPPORTED);
            EXPECT_STATUS(attn_metadata_mla_info(std_meta, &info2), ATTN_ERROR_UNSUPPORTED);
            EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_CALL_UNSUPPORTED, ATTN_LOG_LEVEL_ERROR));
            /* MLA layer through the standard forward, and standard metadata on an MLA layer */
            attn_test_log_reset(&wcap);
            EXPECT_STATUS(attn_layer_forward(w.layer, meta, &tsq, NULL, NULL, &w.t_cache, &tso, NULL, NULL),
                          ATTN_ERROR_UNSUPPORTED);
            EXPECT_TRUE(attn_test_log_has(&wcap, ATTN_LOG_CALL_UNSUPPORTED, ATTN_LOG_LEVEL_ERROR));
            attn_test_log_reset(&wcap);
            EXPECT_STATUS(attn_mla_forward_mqa(w.layer, std_meta, &tq, NULL, &w.t_cache, &to, &tl, NULL),
                          ATTN_ERROR_INVALID_METADATA);
            EXPECT_TRUE(attn_test_log_has(&wcap, ATTN_LOG_METADATA_MISMATCH, ATTN_LOG_LEVEL_ERROR));
            EXPECT_STATUS(attn_reshape_and_cache(w.layer, &tsq, &tsq, &w.t_cache, ATTN_TEST_SLOTS(w.slots, 1), NULL),
                          ATTN_ERROR_UNSUPPORTED);
            for (x = 0; x < (int)nq; x++)
                if (o[x] == o[x]) {
                    attn_test_fail(__FILE__, __LINE__, "a rejected call wrote out[%d]", x);
                    break;
                }
        }
        free(q);
        free(o);
        free(lse);
        free(cache_copy);
        free(std_cache);
    }
    attn_metadata_destroy(std_meta);
    attn_layer_destroy(std_layer);
    attn_context_destroy(ctx);
    attn_metadata_destroy(meta);
    world_free(&w);
}

/* ---- the same on the GPU (CUDA_MLA_SM90) -------------------------------------------------
   Worlds with c.cuda: the layer on ATTN_DEVICE_CUDA, every tensor a device copy, checked
   against the same float64 reference (bounds GPU_TOL wider: the GPU rounds q_latent, P and
   o_latent to the layer dtype) and against the CPU_MLA path on the same data. SKIP where
   no compute capability 9.0 device (with NVRTC and cuBLAS) is here. */

/* One world, every entry point that applies: forward_mqa in both q forms (decodes),
   forward_mha (prefills), the fused call (writing the cache when the world did not). */
static void gpu_world(mcfg *c, const char *name, int splits) {
    mworld w;
    attn_metadata *meta;
    char tag[160];
    attn_status st;
    if (!c->cuda) c->cuda = 1;
    if (!world_init(&w, c)) {
        world_free(&w);
        return;
    }
    meta = world_meta(&w, splits, &st);
    EXPECT_OK(st);
    if (meta) {
        attn_mla_info info;
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        if (!c->write_new) {
            snprintf(tag, sizeof tag, "%s fused (writes cache)", name);
            run_fused(&w, meta, 1, tag, NULL);
        }
        if (info.num_decodes) {
            snprintf(tag, sizeof tag, "%s mqa q[%d]", name, w.D);
            run_mqa(&w, meta, 0, tag, NULL);
            snprintf(tag, sizeof tag, "%s mqa q_latent+q_pe", name);
            run_mqa(&w, meta, 1, tag, NULL);
        }
        if (info.num_prefills) {
            snprintf(tag, sizeof tag, "%s mha", name);
            run_mha(&w, meta, tag);
        }
        if (c->write_new) {
            snprintf(tag, sizeof tag, "%s fused", name);
            run_fused(&w, meta, 0, tag, NULL);
        }
    }
    attn_metadata_destroy(meta);
    world_free(&w);
}

ATTN_TEST(test_mla_cuda_decode) {
    static const attn_dtype dts[2] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    mcfg c;
    int i;
    MLA_CUDA_SKIP();
    for (i = 0; i < 2; i++) { /* DeepSeek-V3 with 16 heads (tensor parallel 8), pages 64 and 16 */
        base_cfg(&c, 16, 512, dts[i], dts[i]);
        c.seed = 7000 + (uint64_t)i;
        c.bs = i ? 16 : 64;
        c.nref = 4;
        add_req(&c, 1, 1);
        add_req(&c, 1, 17);
        add_req(&c, 1, 700);
        add_req(&c, 1, 1500);
        gpu_world(&c, i ? "cuda decode H16 f16 bs16" : "cuda decode H16 bf16 bs64", 0);
    }
    base_cfg(&c, 128, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16); /* 128 heads: two CTAs per token */
    c.seed = 7100;
    c.bs = 64;
    c.nref = 5;
    add_req(&c, 1, 5);
    add_req(&c, 1, 640);
    add_req(&c, 1, 2100);
    gpu_world(&c, "cuda decode H128 bf16", 0);
    base_cfg(&c, 40, 256, ATTN_DTYPE_F16, ATTN_DTYPE_F16); /* 320 wide; heads not a multiple of 64 */
    c.seed = 7200;
    c.bs = 32;
    c.nref = 6;
    add_req(&c, 1, 1);
    add_req(&c, 1, 40);
    add_req(&c, 1, 1200);
    gpu_world(&c, "cuda decode 320 H40 f16", 0);
}

/* Speculative decodes (decode_threshold 4: up to 4 tokens per decode, causal among them)
   and a prefill after them. */
ATTN_TEST(test_mla_cuda_multi_token) {
    mcfg c;
    MLA_CUDA_SKIP();
    base_cfg(&c, 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.decode_threshold = 4;
    c.nref = 4;
    c.seed = 7300;
    add_req(&c, 3, 3);
    add_req(&c, 4, 300);
    add_req(&c, 1, 50);
    add_req(&c, 2, 1300);
    add_req(&c, 9, 200);
    gpu_world(&c, "cuda spec-decode", 0);
}

/* Prefills: chunked (context before), fresh, tiny, across 128-query tiles; the 320 shape;
   a prefill over several up-projection chunks (a small workspace) merged by LSE. */
ATTN_TEST(test_mla_cuda_prefill) {
    mcfg c;
    MLA_CUDA_SKIP();
    base_cfg(&c, 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 7400;
    c.nref = 4;
    c.write_new = 0;
    add_req(&c, 37, 400);
    add_req(&c, 70, 70);
    add_req(&c, 2, 2);
    add_req(&c, 33, 34);
    add_req(&c, 300, 300); /* three query tiles */
    gpu_world(&c, "cuda prefill bf16", 0);
    base_cfg(&c, 16, 512, ATTN_DTYPE_F16, ATTN_DTYPE_F16);
    c.seed = 7401;
    c.nref = 4;
    c.bs = 32;
    add_req(&c, 130, 500);
    add_req(&c, 64, 64);
    gpu_world(&c, "cuda prefill f16", 0);
    base_cfg(&c, 24, 256, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 7402;
    c.nref = 6;
    add_req(&c, 45, 500);
    add_req(&c, 64, 64);
    gpu_world(&c, "cuda prefill 320", 0);
    /* 1 MiB of workspace: chunks of 192 keys at 16 heads (16 x 256 x 2 + 1152 bytes a key) */
    base_cfg(&c, 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 7403;
    c.nref = 4;
    c.bs = 64;
    c.workspace_bytes = 1 << 20;
    add_req(&c, 1, 900);   /* a decode (decodes first) */
    add_req(&c, 40, 700);  /* chunked prefill: keys over several chunks */
    add_req(&c, 400, 400); /* fresh: the causal edge crosses chunks */
    gpu_world(&c, "cuda prefill over chunks", 0);
}

/* Decodes, zero-token requests, chunked and fresh prefills in one batch. */
ATTN_TEST(test_mla_cuda_mixed_batch) {
    mcfg c;
    int i;
    MLA_CUDA_SKIP();
    for (i = 0; i < 2; i++) {
        base_cfg(&c, i ? 128 : 16, 512, i ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16, i ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16);
        c.seed = 7500 + (uint64_t)i;
        c.nref = 4;
        c.write_new = 0;
        c.pad = 2;
        add_req(&c, 1, 1100);
        add_req(&c, 1, 1);
        add_req(&c, 0, 30);
        add_req(&c, 1, 77);
        add_req(&c, 25, 200);
        add_req(&c, 40, 40);
        add_req(&c, 3, 90);
        gpu_world(&c, i ? "cuda mixed H128 f16" : "cuda mixed H16 bf16", 0);
    }
}

/* The same decode batch with num_kv_splits forced to 1, 2, 7, 32 (32 leaves empty splits
   over short contexts), and automatic. */
ATTN_TEST(test_mla_cuda_splits) {
    static const int splits[] = {1, 2, 7, 32, 0};
    int k;
    MLA_CUDA_SKIP();
    for (k = 0; k < 5; k++) {
        mcfg c;
        char name[64];
        base_cfg(&c, k & 1 ? 128 : 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
        c.seed = 7600;
        c.nref = 3;
        c.bs = 64;
        add_req(&c, 1, 2);
        add_req(&c, 1, 3000);
        add_req(&c, 1, 65);
        add_req(&c, 1, 700);
        snprintf(name, sizeof name, "cuda splits %d H%d", splits[k], c.H);
        gpu_world(&c, name, splits[k]);
    }
}

/* Random batches on the GPU: heads, latent width, page size, decode threshold, dtype, pads,
   scales, splits. */
ATTN_TEST(test_mla_cuda_random_batches) {
    rng r;
    int n = (int)(10 * test_scale()), k;
    MLA_CUDA_SKIP();
    if (n < 3) n = 3;
    rng_seed(&r, 0xc0dafeed5eedull);
    for (k = 0; k < n; k++) {
        static const int heads[] = {1, 16, 40, 64, 128};
        static const int blocks[] = {16, 32, 64, 128};
        mcfg c;
        int i, nd, np, f0 = attn_test_current_failed();
        char tag[160];
        base_cfg(&c, heads[rng_int(&r, 0, 4)], rng_int(&r, 0, 2) ? 512 : 256,
                 rng_int(&r, 0, 1) ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16, ATTN_DTYPE_AUTO);
        c.kvdt = c.dt;
        c.bs = blocks[rng_int(&r, 0, 3)];
        random_world_knobs(&r, &c);
        nd = rng_int(&r, 0, 6);
        np = rng_int(&r, nd ? 0 : 1, 3);
        for (i = 0; i < nd; i++) {
            int thr = c.decode_threshold ? c.decode_threshold : 1;
            int ql = rng_int(&r, 1, thr);
            add_req(&c, ql, ql + rng_int(&r, 0, rng_int(&r, 0, 3) ? 500 : 3000));
        }
        for (i = 0; i < np; i++) {
            int thr = c.decode_threshold ? c.decode_threshold : 1;
            int ql = rng_int(&r, thr + 1, 300);
            add_req(&c, ql, rng_int(&r, 0, 1) ? ql : ql + rng_int(&r, 1, 600));
        }
        snprintf(tag, sizeof tag, "cuda random case %d: H=%d R=%d %s bs=%d thr=%d reqs=%d+%d scale=%g", k, c.H, c.R,
                 attn_dtype_name(c.dt), c.bs, c.decode_threshold, nd, np, (double)c.scale);
        gpu_world(&c, tag, rng_int(&r, 0, 3) == 0 ? rng_int(&r, 1, 9) : 0);
        if (attn_test_current_failed() > f0) printf("    in %s\n", tag);
    }
}

/* The GPU against the portable C path on the same world: the fused call's outputs agree
   within the two paths' bounds (each is also checked against float64). */
ATTN_TEST(test_mla_cuda_matches_cpu) {
    mcfg c;
    mworld wc, wg;
    attn_metadata *mc = NULL, *mg = NULL;
    float *oc = NULL, *og = NULL;
    int x, bad = 0;
    double at, rt, lt, rms = 0;
    MLA_CUDA_SKIP();
    base_cfg(&c, 32, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 7700;
    c.nref = 4;
    c.bs = 64;
    add_req(&c, 1, 900);
    add_req(&c, 1, 33);
    add_req(&c, 50, 300);
    add_req(&c, 64, 64);
    if (world_init(&wc, &c)) mc = world_meta(&wc, 0, NULL);
    c.cuda = 1;
    if (world_init(&wg, &c)) mg = world_meta(&wg, 0, NULL);
    EXPECT_TRUE(mc && mg);
    if (mc && mg) {
        run_fused(&wc, mc, 0, "cpu fused", &oc);
        run_fused(&wg, mg, 0, "cuda fused", &og);
    }
    if (oc && og) {
        world_tol(&wg, &at, &rt, &lt);
        for (x = 0; x < wc.ntok * c.H * VDIM; x++) rms += (double)oc[x] * oc[x];
        rms = sqrt(rms / (wc.ntok * c.H * VDIM));
        for (x = 0; x < wc.ntok * c.H * VDIM; x++)
            if (!attn_test_near(og[x], oc[x], 2 * at * rms, 2 * rt) && bad++ < 3)
                attn_test_fail(__FILE__, __LINE__, "cuda vs cpu: out element %d: %.7g vs %.7g (rms %.3g)", x,
                               (double)og[x], (double)oc[x], rms);
    }
    free(oc);
    free(og);
    attn_metadata_destroy(mc);
    attn_metadata_destroy(mg);
    world_free(&wc);
    world_free(&wg);
}

/* ATTN_BATCH_INVARIANT=1: one split, and a request's forward_mqa rows are bitwise the same
   alone and in a batch (another page layout too). */
ATTN_TEST(test_mla_cuda_batch_invariant) {
    mcfg one, many;
    mworld wa, wb;
    attn_metadata *ma = NULL, *mb = NULL;
    int H = 128, R = 512;
    attn_test_env saved_env;
    MLA_CUDA_SKIP();
    base_cfg(&one, H, R, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    one.nref = 2;
    one.seed = 7800;
    one.wseed = 56;
    one.bs = 64;
    one.cuda = 1;
    add_req(&one, 1, 2100);
    many = one;
    add_req(&many, 1, 900);
    add_req(&many, 1, 3000);
    add_req(&many, 1, 3);
    add_req(&many, 20, 120);
    many.bs = 32;
    saved_env = attn_test_env_save("ATTN_BATCH_INVARIANT");
    setenv("ATTN_BATCH_INVARIANT", "1", 1);
    if (world_init(&wa, &one)) ma = world_meta(&wa, 0, NULL);
    if (world_init(&wb, &many)) mb = world_meta(&wb, 0, NULL);
    attn_test_env_restore(&saved_env);
    EXPECT_TRUE(ma != NULL && mb != NULL);
    if (ma && mb) check_invariant_rows(&wa, ma, &wb, mb, 0, "cuda ");
    attn_metadata_destroy(ma);
    attn_metadata_destroy(mb);
    world_free(&wa);
    world_free(&wb);
}

/* The portable fallback CUDA_MLA (mma.sync kernels, sm_80+), forced on this device: the
   decode, prefill, mixed, split and random worlds above, against the same reference. */
/* fp8 latents (per-tensor scale) on the GPU: CUDA_MLA reads them (CUDA_MLA_SM90's wgmma
   kernels take 16-bit latents only: the selector passes it over with that reason) — decode
   at 16 / 32 / 128 heads (the 8-key and 16-key S paths), e4m3 and e5m2, the 320 shape,
   speculative decodes, prefills over several up-projection chunks (the gather dequantizes),
   splits, the fused call writing the cache (quantizing on the device) — against float64 of
   the values the cache holds and against CPU_MLA. */
ATTN_TEST(test_mla_cuda_fp8_latent) {
    static const struct { int H, R; attn_dtype dt, kvdt; float ks; int splits; } cases[] = {
        {16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3, 1.0f / 64, 0},
        {32, 512, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E5M2, 1.0f / 8, 7},
        {128, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3, 1.0f, 1},
        {40, 256, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, 1.0f / 16, 0}};
    int i;
    MLA_CUDA_SKIP_FOR(1);
    for (i = 0; i < 4; i++) {
        mcfg c;
        char name[96];
        base_cfg(&c, cases[i].H, cases[i].R, cases[i].dt, cases[i].kvdt);
        c.ks = cases[i].ks;
        c.cuda = 2;
        c.seed = 8200 + (uint64_t)i;
        c.nref = 4;
        c.write_new = i & 1;
        c.bs = i == 3 ? 32 : 64;
        c.decode_threshold = i == 1 ? 2 : 0;
        if (i == 0) c.workspace_bytes = 1 << 20; /* prefill over several chunks */
        add_req(&c, 1, 1);
        add_req(&c, 1, 700);
        add_req(&c, 1, 1500);
        if (i == 1) add_req(&c, 2, 90); /* a speculative decode */
        add_req(&c, 20, 150);           /* chunked prefill */
        add_req(&c, 33, 33);            /* fresh prefill */
        snprintf(name, sizeof name, "cuda fp8 H%d R%d %s/%s", c.H, c.R, attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
        gpu_world(&c, name, cases[i].splits);
    }
}

ATTN_TEST(test_mla_cuda_fallback) {
    static const int splits[] = {1, 7, 0};
    mcfg c;
    int i, k;
    rng r;
    MLA_CUDA_SKIP_FOR(1);
    for (i = 0; i < 3; i++) { /* 16 heads (ROWS 16), 32 (ROWS 32), 128 (ROWS 64) */
        static const int heads[3] = {16, 32, 128};
        char name[64];
        base_cfg(&c, heads[i], 512, i == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16, i == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16);
        c.cuda = 2;
        c.seed = 7900 + (uint64_t)i;
        c.bs = i == 1 ? 16 : 64;
        c.nref = 4;
        add_req(&c, 1, 1);
        add_req(&c, 1, 700);
        add_req(&c, 1, 1500);
        snprintf(name, sizeof name, "fallback decode H%d", heads[i]);
        gpu_world(&c, name, splits[i]);
    }
    base_cfg(&c, 40, 256, ATTN_DTYPE_F16, ATTN_DTYPE_F16); /* 320 wide */
    c.cuda = 2;
    c.seed = 7910;
    c.bs = 32;
    c.nref = 6;
    add_req(&c, 1, 40);
    add_req(&c, 1, 1200);
    add_req(&c, 45, 300);
    gpu_world(&c, "fallback 320 H40 mixed", 0);
    base_cfg(&c, 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16); /* prefill over several chunks */
    c.cuda = 2;
    c.seed = 7911;
    c.nref = 4;
    c.bs = 64;
    c.workspace_bytes = 1 << 20;
    c.write_new = 0;
    add_req(&c, 1, 900);
    add_req(&c, 40, 700);
    add_req(&c, 150, 150);
    gpu_world(&c, "fallback prefill over chunks", 0);
    rng_seed(&r, 0xfa11bacc5eedull);
    for (k = 0; k < 3; k++) {
        static const int hs[] = {16, 64, 128};
        int nd = rng_int(&r, 1, 4), np = rng_int(&r, 0, 2);
        char tag[96];
        base_cfg(&c, hs[k], rng_int(&r, 0, 2) ? 512 : 256, rng_int(&r, 0, 1) ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16,
                 ATTN_DTYPE_AUTO);
        c.kvdt = c.dt;
        c.cuda = 2;
        c.seed = rng_next(&r);
        c.nref = 3;
        c.bs = 16 << rng_int(&r, 0, 3);
        c.write_new = rng_int(&r, 0, 1);
        for (i = 0; i < nd; i++) add_req(&c, 1, 1 + rng_int(&r, 0, 2000));
        for (i = 0; i < np; i++) {
            int ql = rng_int(&r, 2, 200);
            add_req(&c, ql, ql + rng_int(&r, 0, 300));
        }
        snprintf(tag, sizeof tag, "fallback random %d: H=%d R=%d %s bs=%d reqs=%d+%d", k, c.H, c.R,
                 attn_dtype_name(c.dt), c.bs, nd, np);
        gpu_world(&c, tag, 0);
    }
}

void suite_cuda_mla(void) {
    ATTN_RUN(test_mla_cuda_decode);
    ATTN_RUN(test_mla_cuda_multi_token);
    ATTN_RUN(test_mla_cuda_prefill);
    ATTN_RUN(test_mla_cuda_mixed_batch);
    ATTN_RUN(test_mla_cuda_splits);
    ATTN_RUN(test_mla_cuda_matches_cpu);
    ATTN_RUN(test_mla_cuda_batch_invariant);
    ATTN_RUN(test_mla_cuda_random_batches);
    ATTN_RUN(test_mla_cuda_fallback);
    ATTN_RUN(test_mla_cuda_fp8_latent);
}

void suite_mla(void) {
    ATTN_RUN(test_mla_reject_layers);
    ATTN_RUN(test_mla_reject_calls);
    ATTN_RUN(test_mla_decode_parallelism_checked);
    ATTN_RUN(test_mla_reorder_batch);
    ATTN_RUN(test_mla_merge_edges);
    ATTN_RUN(test_mla_merge_empty_nan);
    ATTN_RUN(test_mla_decode_576_h16);
    ATTN_RUN(test_mla_decode_576_h128);
    ATTN_RUN(test_mla_decode_320);
    ATTN_RUN(test_mla_decode_multi_token);
    ATTN_RUN(test_mla_prefill_576);
    ATTN_RUN(test_mla_prefill_320);
    ATTN_RUN(test_mla_prefill_longer_than_chunk);
    ATTN_RUN(test_mla_mixed_batch);
    ATTN_RUN(test_mla_fp8_latent);
    ATTN_RUN(test_mla_strided_views);
    ATTN_RUN(test_mla_split_invariance);
    ATTN_RUN(test_mla_split_empty);
    ATTN_RUN(test_mla_batch_invariant);
    ATTN_RUN(test_mla_merge_shards);
    ATTN_RUN(test_mla_unsorted_batch_reordered);
    ATTN_RUN(test_mla_random_batches);
}
