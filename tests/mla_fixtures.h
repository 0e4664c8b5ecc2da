/* mla_fixtures.h - what the MLA test files (tests/test_mla_*.c) share: a test world and a
   float64 reference of the *unabsorbed* MLA definition to check it against.

   A world is one MLA layer with its weights, per-request latents and queries, a paged
   cache written through attn_concat_and_cache_mla, and the reference: per head,
   K = [kv_c . W_UK^T | k_pe] and V = kv_c . W_UV up-projected for every key, then causal
   softmax attention, in float64. run_mqa / run_mha / run_fused call the three entry
   points (absorbed decode, up-projected prefill, the fused layer call) on the world's
   batch, poison every output with NaN first and check it against the reference.

       mcfg c;
       mworld w;
       base_cfg(&c, 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
       add_req(&c, 1, 700);                 // a decode over 700 keys
       add_req(&c, 40, 200);                // a chunked prefill
       REQUIRE(world_open(&w, &c, 0));      // the world and its metadata (w.meta)
       run_fused(&w, w.meta, 0, "fused", NULL);
       world_free(&w);

   Inputs are random and never zero. A world with c.cuda runs on the GPU (every tensor a
   device copy; bounds GPU_TOL wider). Include after attn.h, attn_test.h and fixtures.h;
   the implementation is compiled where ATTN_TEST_IMPLEMENTATION is defined (tests/main.c). */
#ifndef ATTN_TEST_MLA_FIXTURES_H
#define ATTN_TEST_MLA_FIXTURES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
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
static inline uint64_t rng_next(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}
static inline void rng_seed(rng *r, uint64_t seed) {
    int i;
    r->s = seed ? seed : 0x2545f4914f6cdd1dull;
    for (i = 0; i < 4; i++) rng_next(r);
}
static inline int rng_int(rng *r, int lo, int hi) { /* inclusive */
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}
static inline float rng_uniform(rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next(r) >> 40) * (1.0 / 16777216.0));
}
/* Never exactly zero. */
static inline float rng_nz(rng *r, float a) {
    float x = rng_uniform(r, -a, a);
    return x == 0.0f ? a * 0.5f : x;
}

static inline float round_to(attn_dtype dt, float x) {
    switch (dt) {
    case ATTN_DTYPE_F16:
        return attn_f16_to_f32(attn_f32_to_f16(x));
    case ATTN_DTYPE_BF16:
        return attn_bf16_to_f32(attn_f32_to_bf16(x));
    default:
        return x;
    }
}
static inline void put(void *p, attn_dtype dt, size_t i, float x) {
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
static inline float get(const void *p, attn_dtype dt, size_t i) {
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
static inline float latent_value(attn_dtype dt, float s, float x) {
    return attn_test_is_8bit(dt) ? attn_test_fp8_value(dt, s, x) : round_to(dt, x);
}
static inline void poison(void *p, attn_dtype dt, size_t n) {
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
static inline int is_finite(float x) { return x - x == 0.0f; }

static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "mla_fixtures: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

/* ATTN_TEST_SCALE=0.25 shrinks the random cases and the long contexts. */
static inline int ctx_threads(attn_context *ctx) {
    attn_platform p;
    memset(&p, 0, sizeof p);
    if (attn_platform_get(ctx, &p) != ATTN_OK || p.cpu_threads < 1) return 1;
    return p.cpu_threads;
}

static inline double test_scale(void) {
    const char *s = getenv("ATTN_TEST_SCALE");
    double v = s ? atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}
static inline int scaled(int n, int min) {
    int v = (int)(n * test_scale());
    return v < min ? min : v;
}

/* Tolerances: abs is relative to the RMS of the reference row (outputs that average over
   thousands of keys are small), rel to the element. */
static inline void tol_for(attn_dtype dt, double *abs_tol, double *rel_tol, double *lse_tol) {
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

static inline attn_tensor t3(void *p, attn_dtype dt, int64_t a, int64_t b, int64_t c) {
    int64_t s[3];
    s[0] = a;
    s[1] = b;
    s[2] = c;
    return attn_tensor_make(p, dt, 3, s);
}
static inline attn_tensor t2(void *p, int64_t a, int64_t b) {
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
    attn_metadata *meta;                 /* world_open's metadata (freed with the world) */
    attn_mla_info info;                  /* and its split */
} mworld;


typedef struct mqa_result {
    float *lat; /* f32 copy of out_latent [td][H][R] */
    float *lse; /* [td][H] */
    int td;
} mqa_result;

/* The CPU path rounds only its outputs to the layer's 16-bit type; the GPU path (like
   FlashMLA) also rounds q_latent, the softmax weights P before P.V and o_latent before
   W_UV, so its bounds are wider by GPU_TOL. */
#define GPU_TOL 2.0
/* A world's tolerances: tol_for its dtype, GPU_TOL wider on the GPU. */
void world_tol(const mworld *w, double *abs_tol, double *rel_tol, double *lse_tol);

/* A config of H heads, kv_lora_rank R, no requests yet: blocks of 16, 2 threads, the new
   tokens cached at init, one padding row. add_req appends a request of qlen new tokens
   over slen keys (slen - qlen of context). */
void base_cfg(mcfg *c, int H, int R, attn_dtype dt, attn_dtype kvdt);
void add_req(mcfg *c, int qlen, int slen);
/* add_req for each {qlen, slen}: ADD_REQS(&c, {1, 700}, {40, 200}) adds a decode over 700
   keys and a prefill of 40 over 200. */
#define ADD_REQS(c, ...)                                                                    \
    add_reqs((c), (const int[][2]){__VA_ARGS__}, (int)(sizeof((int[][2]){__VA_ARGS__}) / sizeof(int[2])))
void add_reqs(mcfg *c, const int (*reqs)[2], int n);
/* The random knobs the CPU and GPU random batches share (in this order of draws): decode
   threshold, seeds, float64 heads, who writes the new tokens, padding rows, scale. */
void random_world_knobs(rng *r, mcfg *c);

/* Builds the world (layer, weights, data, cache with the context and, if write_new, the
   new tokens written through attn_concat_and_cache_mla, the float64 reference); 0 on a
   failure (recorded as failed checks), with everything freed already. world_free(w)
   after either (a freed world frees nothing). */
int world_init(mworld *w, const mcfg *cfg);
/* world_init, then w->meta built over the batch with num_kv_splits splits (0: automatic)
   and its w->info. On failure everything is freed already (REQUIRE(world_open(...))
   leaks nothing). */
int world_open(mworld *w, const mcfg *cfg, int splits);
void world_free(mworld *w);
attn_batch world_batch(const mworld *w);
/* Metadata over the world's batch (num_kv_splits 0 = automatic). NULL on failure, with
   the status in *status (optional). */
attn_metadata *world_meta(mworld *w, int splits, attn_status *status);
int world_num_decode_tokens(const mworld *w);
/* Checks the decode / prefill split of w->meta (a count of -1 is not checked). */
void check_counts(const mworld *w, int num_decodes, int num_decode_tokens, int num_prefills,
                  int num_prefill_tokens);

/* The root mean square of v (at least 1e-3: the scale of an absolute tolerance). */
double rms_of(const double *v, int n);
/* Compares output rows (batch rows [row_first, row_last), stored at row - out_row0 in out
   [.., H, VDIM]) and the LSE (if given) with the reference; every head must be finite;
   rows from row_last - out_row0 to alloc_rows must still be poisoned. Returns the failures. */
int check_out(const mworld *w, const char *tag, const void *out, const float *lse, int row_first, int row_last,
              int out_row0, int alloc_rows);
/* Compares out_latent [.., H, R] rows [0, td) of the decodes: with the reference latent
   (the softmax-weighted kv_c of the unabsorbed attention) and, up-projected by W_UV in
   float64, with the reference output; the LSE; rows td..alloc_rows must be untouched. */
int check_latent(const mworld *w, const char *tag, const void *olat, attn_dtype odt, const float *lse, int td,
                 int alloc_rows);


/* Absorbed decode through attn_mla_forward_mqa: q_latent = q_nope . W_UK[h] computed here
   (float64, rounded to the layer dtype), either concatenated with q_pe (split_q = 0) or
   passed with q_pe separately. Checks against the reference; optionally keeps copies.
   Returns the failures. */
int run_mqa(mworld *w, attn_metadata *meta, int split_q, const char *tag, mqa_result *keep);
/* Up-projected prefill through attn_mla_forward_mha (q = [q_nope | q_pe] of the prefill
   rows, new tokens already cached). */
int run_mha(mworld *w, attn_metadata *meta, const char *tag);
/* The fused call; with write = 1 the new tokens' kv_c / k_pe are passed (and written by
   the call), and afterwards the cache must hold exactly the expected latents. keep_out
   (optional) receives an f32 copy of out [ntok][H][VDIM]. */
int run_fused(mworld *w, attn_metadata *meta, int write, const char *tag, float **keep_out);

/* Metadata of layer over one request of query_len new tokens and seq_len keys in block 0
   (seq_len <= the block size), built; NULL on failure. */
attn_metadata *one_request_meta(attn_layer *layer, int query_len, int seq_len);
/* info.prefill_chunk of an f32 MLA layer with H heads (-1 on failure). */
int probe_chunk(int H);
/* Request 0 alone (wa, ma) and in a batch (wb, mb), both built with ATTN_BATCH_INVARIANT=1:
   one split each, and its forward_mqa rows (out_latent, LSE) bitwise equal; with fused, the
   fused call's rows too. */
void check_invariant_rows(mworld *wa, attn_metadata *ma, mworld *wb, attn_metadata *mb, int fused,
                          const char *tag);

#endif

#if defined(ATTN_TEST_IMPLEMENTATION) && !defined(ATTN_TEST_MLA_FIXTURES_IMPLEMENTED)
#define ATTN_TEST_MLA_FIXTURES_IMPLEMENTED

void world_tol(const mworld *w, double *abs_tol, double *rel_tol, double *lse_tol) {
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

void world_free(mworld *w) {
    int i;
    attn_metadata_destroy(w->meta);
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

int world_init(mworld *w, const mcfg *cfg) {
    mcfg *c;
    attn_layer_desc d;
    int H, R, D, i, t, x, h, maxnb = 0, nctx = 0, ndim;
    int64_t shape[ATTN_MAX_DIMS];
    size_t esz;
    rng wr, br;
    int32_t *perm;
    attn_status st;
    int failed_before = attn_test_current_failed(); /* ok: no check of this world failed */
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
        world_free(w);
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
    if (st != ATTN_OK) {
        world_free(w);
        return 0;
    }
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
    w->ok = attn_test_current_failed() == failed_before;
    if (!w->ok) world_free(w);
    return w->ok;
}

attn_batch world_batch(const mworld *w) {
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

attn_metadata *world_meta(mworld *w, int splits, attn_status *status) {
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

int world_open(mworld *w, const mcfg *cfg, int splits) {
    attn_status st = ATTN_OK;
    if (world_init(w, cfg)) {
        w->meta = world_meta(w, splits, &st);
        if (!w->meta)
            attn_test_fail(__FILE__, __LINE__, "world metadata (%d splits): %s: %s", splits,
                           attn_status_string(st), attn_context_last_error(w->ctx));
        else if ((st = attn_metadata_mla_info(w->meta, &w->info)) != ATTN_OK)
            attn_test_fail(__FILE__, __LINE__, "attn_metadata_mla_info: %s", attn_status_string(st));
        else
            return 1;
    }
    world_free(w);
    return 0;
}

void check_counts(const mworld *w, int num_decodes, int num_decode_tokens, int num_prefills,
                  int num_prefill_tokens) {
    if (num_decodes >= 0) EXPECT_EQ_INT(w->info.num_decodes, num_decodes);
    if (num_decode_tokens >= 0) EXPECT_EQ_INT(w->info.num_decode_tokens, num_decode_tokens);
    if (num_prefills >= 0) EXPECT_EQ_INT(w->info.num_prefills, num_prefills);
    if (num_prefill_tokens >= 0) EXPECT_EQ_INT(w->info.num_prefill_tokens, num_prefill_tokens);
}

int world_num_decode_tokens(const mworld *w) {
    int i, n = 0;
    for (i = 0; i < w->c.nreq && w->c.qlen[i] <= w->thr; i++) n += w->c.qlen[i];
    return n;
}

double rms_of(const double *v, int n) {
    double s = 0;
    int i;
    for (i = 0; i < n; i++) s += v[i] * v[i];
    s = sqrt(s / n);
    return s > 1e-3 ? s : 1e-3;
}

int check_out(const mworld *w, const char *tag, const void *out, const float *lse, int row_first,
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

int check_latent(const mworld *w, const char *tag, const void *olat, attn_dtype odt, const float *lse,
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


int run_mqa(mworld *w, attn_metadata *meta, int split_q, const char *tag, mqa_result *keep) {
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

int run_mha(mworld *w, attn_metadata *meta, const char *tag) {
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

int run_fused(mworld *w, attn_metadata *meta, int write, const char *tag, float **keep_out) {
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

void base_cfg(mcfg *c, int H, int R, attn_dtype dt, attn_dtype kvdt) {
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

void add_req(mcfg *c, int qlen, int slen) {
    c->qlen[c->nreq] = qlen;
    c->slen[c->nreq] = slen;
    c->nreq++;
}

void add_reqs(mcfg *c, const int (*reqs)[2], int n) {
    int i;
    for (i = 0; i < n; i++) add_req(c, reqs[i][0], reqs[i][1]);
}


attn_metadata *one_request_meta(attn_layer *layer, int query_len, int seq_len) {
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch b;
    int32_t qsl[2], seq[1], bt[1] = {0};
    qsl[0] = 0;
    qsl[1] = query_len;
    seq[0] = seq_len;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1;
    md.max_num_tokens = query_len;
    md.max_blocks_per_req = 1;
    md.num_blocks = 1;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl;
    b.seq_lens = seq;
    b.block_table = bt;
    b.block_table_stride = 1;
    b.num_reqs = 1;
    b.num_actual_tokens = query_len;
    b.max_query_len = query_len;
    b.max_seq_len = seq_len;
    if (attn_metadata_create(layer, &md, &meta) != ATTN_OK || attn_metadata_build(meta, 0, &b, 0) != ATTN_OK) {
        attn_metadata_destroy(meta);
        return NULL;
    }
    return meta;
}

int probe_chunk(int H) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEBUG, 1);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_mla_info info;
    int chunk = -1;
    memset(&d, 0, sizeof d);
    d.use_mla = 1;
    d.num_heads = H;
    d.head_size = 576;
    d.dtype = ATTN_DTYPE_F32;
    if (ctx && attn_layer_create(ctx, &d, NULL, &layer) == ATTN_OK && (meta = one_request_meta(layer, 2, 2)) &&
        attn_metadata_mla_info(meta, &info) == ATTN_OK)
        chunk = info.prefill_chunk;
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    return chunk;
}


void random_world_knobs(rng *r, mcfg *c) {
    c->decode_threshold = rng_int(r, 0, 2) == 0 ? rng_int(r, 2, 4) : 0;
    c->seed = rng_next(r);
    c->wseed = rng_next(r);
    c->nref = c->H > 8 ? 3 : 0;
    c->write_new = rng_int(r, 0, 1);
    c->pad = rng_int(r, 0, 2);
    if (rng_int(r, 0, 2) == 0) c->scale = rng_uniform(r, 0.03f, 0.15f);
}

void check_invariant_rows(mworld *wa, attn_metadata *ma, mworld *wb, attn_metadata *mb, int fused,
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

#endif
