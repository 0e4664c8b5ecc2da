/* Sparse MLA (attn_mla_forward_sparse, DeepSeek-V3.2's DSA) against a float64 reference:
   random varlen batches (decodes, speculative tokens, a prefill chunk), top-k index rows
   with padding (-1) and repeated positions, 16/20/40/64/128 heads, f32/f16/bf16 latents, fp8
   with a per-tensor scale, fp8_ds_mla (656-byte rows with their own scales, written by
   attn_concat_and_cache_mla and read back here byte by byte), q as one tensor or as
   q_latent + q_pe, sinks, LSE. Outputs are NaN-poisoned first. Then the named errors: an
   index outside its request, a wrong indices tensor, the dense calls on an fp8_ds_mla
   cache or a layer with sinks. With a CUDA device the same cases run on CUDA_MLA(_SM90)
   against the CPU's result (else those tests SKIP with the reason). */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "mla_fixtures.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { SP_R = 512, SP_P = 64, SP_D = 576, SP_MAXREQ = 6 };

typedef struct spcase {
    int heads, block, nreq, qlen[SP_MAXREQ], slen[SP_MAXREQ], topk;
    attn_dtype dt, kv;
    int split_q, sinks, lse, cuda;
    unsigned seed;
} spcase;

/* The value the cache holds for element x of the row written from (kv_c, k_pe): the
   format's own rounding, decoded here independently of the library's reader. */
static void sp_row_ref(const attn_layer_desc *d, const uint8_t *row, double *out) {
    int x;
    if (d->kv_cache_dtype == ATTN_DTYPE_FP8_DS_MLA) {
        float sc[4];
        memcpy(sc, row + 512, 16);
        for (x = 0; x < 512; x++) out[x] = (double)attn_fp8_e4m3_to_f32(row[x]) * sc[x / 128];
        for (x = 0; x < 64; x++) {
            uint16_t b;
            memcpy(&b, row + 528 + 2 * x, 2);
            out[512 + x] = attn_bf16_to_f32(b);
        }
        return;
    }
    for (x = 0; x < SP_D; x++) {
        switch (d->kv_cache_dtype) {
        case ATTN_DTYPE_F32: { float f; memcpy(&f, row + 4 * x, 4); out[x] = f; break; }
        case ATTN_DTYPE_F16: { uint16_t h; memcpy(&h, row + 2 * x, 2); out[x] = attn_f16_to_f32(h); break; }
        case ATTN_DTYPE_BF16: { uint16_t h; memcpy(&h, row + 2 * x, 2); out[x] = attn_bf16_to_f32(h); break; }
        case ATTN_DTYPE_FP8_E4M3: out[x] = (double)attn_fp8_e4m3_to_f32(row[x]) * d->k_scale.value; break;
        default: out[x] = NAN; break;
        }
    }
}

static size_t sp_row_bytes(const attn_layer_desc *d) {
    return d->kv_cache_dtype == ATTN_DTYPE_FP8_DS_MLA ? 656 : SP_D * attn_dtype_size(d->kv_cache_dtype);
}

typedef struct spworld {
    attn_context *ctx;
    attn_layer_desc d;
    attn_layer *cpu;
    attn_metadata *meta;
    attn_batch b;
    int32_t qsl[SP_MAXREQ + 1], *bt, *idx;
    int64_t *slots;
    int ntok, nb, stride;
    void *cache, *q, *qpe, *out;
    void *kcd, *kpd;               /* the latents written ([nw][512], [nw][64], layer dtype) */
    int nw;
    float *lse, sinks[128];
    double *ref, *ref_lse;
} spworld;

static void sp_free(spworld *w) {
    attn_metadata_destroy(w->meta);
    attn_layer_destroy(w->cpu);
    free(w->bt); free(w->idx); free(w->slots); free(w->cache); free(w->q); free(w->qpe); free(w->out);
    free(w->kcd); free(w->kpd);
    free(w->lse); free(w->ref); free(w->ref_lse);
    attn_context_destroy(w->ctx);
    memset(w, 0, sizeof *w);
}

/* Builds the world of case c on the CPU: the cache written through the library for every
   position of every request, indices, q, and the float64 reference. 1 on success. */
static int sp_open(spworld *w, const spcase *c) {
    rng r;
    attn_metadata_desc md;
    int i, k, t, x, maxs = 0, maxq = 0;
    size_t rb, esz = attn_dtype_size(c->dt);
    memset(w, 0, sizeof *w);
    rng_seed(&r, c->seed);
    w->ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 2);
    memset(&w->d, 0, sizeof w->d);
    w->d.num_heads = c->heads; w->d.head_size = SP_D; w->d.use_mla = 1; w->d.kv_lora_rank = SP_R;
    w->d.qk_rope_head_dim = SP_P; w->d.dtype = c->dt; w->d.kv_cache_dtype = c->kv; w->d.block_size = c->block;
    if (c->kv == ATTN_DTYPE_FP8_E4M3) w->d.k_scale.value = 1.0f / 64.0f;
    for (i = 0; i < c->heads; i++) w->sinks[i] = rng_uniform(&r, -1.0f, 3.0f);
    if (c->sinks) w->d.sinks = w->sinks;
    if (attn_layer_create(w->ctx, &w->d, NULL, &w->cpu) != ATTN_OK) {
        attn_test_fail(__FILE__, __LINE__, "layer: %s", attn_context_last_error(w->ctx));
        return 0;
    }
    w->d = *attn_layer_get_desc(w->cpu);
    w->qsl[0] = 0;
    for (i = 0; i < c->nreq; i++) {
        w->qsl[i + 1] = w->qsl[i] + c->qlen[i];
        if (c->slen[i] > maxs) maxs = c->slen[i];
        if (c->qlen[i] > maxq) maxq = c->qlen[i];
        if ((c->slen[i] + c->block - 1) / c->block > w->stride) w->stride = (c->slen[i] + c->block - 1) / c->block;
    }
    w->ntok = w->qsl[c->nreq];
    w->nb = c->nreq * w->stride + 2;
    w->bt = (int32_t *)malloc((size_t)c->nreq * w->stride * 4);
    w->idx = (int32_t *)malloc((size_t)w->ntok * c->topk * 4);
    w->slots = (int64_t *)malloc((size_t)w->nb * c->block * 8);
    rb = sp_row_bytes(&w->d);
    w->cache = calloc((size_t)w->nb * c->block, rb);
    w->q = malloc((size_t)w->ntok * c->heads * SP_D * esz);
    w->qpe = malloc((size_t)w->ntok * c->heads * SP_P * esz);
    w->out = malloc((size_t)w->ntok * c->heads * SP_R * esz);
    w->lse = (float *)malloc((size_t)w->ntok * c->heads * 4);
    w->ref = (double *)malloc((size_t)w->ntok * c->heads * SP_R * 8);
    w->ref_lse = (double *)malloc((size_t)w->ntok * c->heads * 8);
    if (!w->bt || !w->idx || !w->slots || !w->cache || !w->q || !w->qpe || !w->out || !w->lse || !w->ref || !w->ref_lse)
        return 0;
    for (i = 0; i < c->nreq * w->stride; i++) w->bt[i] = i; /* then shuffled */
    for (i = c->nreq * w->stride - 1; i > 0; i--) {
        int j = rng_int(&r, 0, i), tmp = w->bt[i];
        w->bt[i] = w->bt[j]; w->bt[j] = tmp;
    }
    { /* every position of every request written through attn_concat_and_cache_mla */
        int n = 0;
        float *kc, *kp;
        void *kcd, *kpd;
        int64_t sh[2];
        attn_tensor tc, tp, tcache;
        int64_t cshape[ATTN_MAX_DIMS];
        int nd = 0;
        for (i = 0; i < c->nreq; i++)
            for (k = 0; k < c->slen[i]; k++)
                w->slots[n++] = (int64_t)w->bt[i * w->stride + k / c->block] * c->block + k % c->block;
        kc = (float *)malloc((size_t)n * SP_R * 4); kp = (float *)malloc((size_t)n * SP_P * 4);
        kcd = malloc((size_t)n * SP_R * esz); kpd = malloc((size_t)n * SP_P * esz);
        if (!kc || !kp || !kcd || !kpd) return 0;
        for (x = 0; x < n * SP_R; x++) { /* tiles of one magnitude, others of another: the scales differ */
            kc[x] = rng_nz(&r, (x / 128) % 3 == 0 ? 4.0f : 0.5f);
            put(kcd, c->dt, (size_t)x, kc[x]);
        }
        for (x = 0; x < n * SP_P; x++) { kp[x] = rng_nz(&r, 1.0f); put(kpd, c->dt, (size_t)x, kp[x]); }
        sh[0] = n; sh[1] = SP_R;
        tc = attn_tensor_make(kcd, c->dt, 2, sh);
        sh[1] = SP_P;
        tp = attn_tensor_make(kpd, c->dt, 2, sh);
        attn_layer_kv_cache_shape(w->cpu, w->nb, cshape, &nd);
        tcache = attn_tensor_make(w->cache, w->d.kv_cache_dtype, nd, cshape);
        if (attn_concat_and_cache_mla(w->cpu, &tc, &tp, &tcache, ATTN_TEST_SLOTS(w->slots, n), NULL) != ATTN_OK) {
            attn_test_fail(__FILE__, __LINE__, "cache write: %s", attn_context_last_error(w->ctx));
            return 0;
        }
        free(kc); free(kp);
        w->kcd = kcd; w->kpd = kpd; w->nw = n;
    }
    for (x = 0; x < w->ntok * c->heads * SP_D; x++) put(w->q, c->dt, (size_t)x, rng_nz(&r, 1.0f));
    for (t = 0; t < w->ntok; t++) { /* the [q_latent | q_pe] rows as two tensors too */
        for (i = 0; i < c->heads; i++)
            memcpy((char *)w->qpe + ((size_t)t * c->heads + i) * SP_P * esz,
                   (char *)w->q + (((size_t)t * c->heads + i) * SP_D + SP_R) * esz, SP_P * esz);
    }
    for (i = 0; i < c->nreq; i++) /* indices: positions of the token's request, -1 now and then, repeats */
        for (t = w->qsl[i]; t < w->qsl[i + 1]; t++)
            for (k = 0; k < c->topk; k++) {
                int v = rng_int(&r, 0, 9) == 0 ? -1 : rng_int(&r, 0, c->slen[i] - 1);
                if (k > 0 && rng_int(&r, 0, 15) == 0) v = w->idx[(size_t)t * c->topk + k - 1];
                w->idx[(size_t)t * c->topk + k] = v;
            }
    if (c->nreq > 1) /* a token whose row is all padding */
        for (k = 0; k < c->topk; k++) w->idx[(size_t)(w->ntok - 1) * c->topk + k] = -1;
    { /* the float64 reference */
        double *row = (double *)malloc(SP_D * 8), *S = (double *)malloc((size_t)c->topk * 8);
        double *K = (double *)malloc((size_t)c->topk * SP_D * 8);
        if (!row || !S || !K) return 0;
        for (i = 0; i < c->nreq; i++)
            for (t = w->qsl[i]; t < w->qsl[i + 1]; t++) {
                int n = 0, h;
                for (k = 0; k < c->topk; k++) {
                    int p = w->idx[(size_t)t * c->topk + k];
                    size_t slot;
                    if (p < 0) continue;
                    slot = (size_t)w->bt[i * w->stride + p / c->block] * c->block + (size_t)(p % c->block);
                    sp_row_ref(&w->d, (const uint8_t *)w->cache + slot * rb, K + (size_t)n * SP_D);
                    n++;
                }
                for (h = 0; h < c->heads; h++) {
                    double m = -INFINITY, l = 0.0, *o = w->ref + ((size_t)t * c->heads + h) * SP_R;
                    int j;
                    for (x = 0; x < SP_D; x++) row[x] = get(w->q, c->dt, ((size_t)t * c->heads + h) * SP_D + (size_t)x);
                    for (j = 0; j < n; j++) {
                        double s = 0.0;
                        for (x = 0; x < SP_D; x++) s += row[x] * K[(size_t)j * SP_D + x];
                        S[j] = s * w->d.scale;
                        if (S[j] > m) m = S[j];
                    }
                    if (c->sinks && w->sinks[h] > m) m = w->sinks[h];
                    for (x = 0; x < SP_R; x++) o[x] = 0.0;
                    for (j = 0; j < n; j++) {
                        double p = exp(S[j] - m);
                        l += p;
                        for (x = 0; x < SP_R; x++) o[x] += p * K[(size_t)j * SP_D + x];
                    }
                    if (c->sinks) l += exp(w->sinks[h] - m);
                    for (x = 0; x < SP_R; x++) o[x] = n ? o[x] / l : 0.0;
                    w->ref_lse[(size_t)t * c->heads + h] = l > 0.0 ? m + log(l) : -INFINITY;
                }
            }
        free(row); free(S); free(K);
    }
    memset(&w->b, 0, sizeof w->b);
    w->b.query_start_loc = w->qsl; w->b.seq_lens = c->slen; w->b.block_table = w->bt; w->b.block_table_stride = w->stride;
    w->b.num_reqs = c->nreq; w->b.num_actual_tokens = w->ntok; w->b.max_query_len = maxq; w->b.max_seq_len = maxs;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = c->nreq; md.max_num_tokens = w->ntok + 4; md.max_blocks_per_req = w->stride; md.num_blocks = w->nb;
    md.decode_threshold = 16;
    if (attn_metadata_create(w->cpu, &md, &w->meta) != ATTN_OK || attn_metadata_build(w->meta, 0, &w->b, 0) != ATTN_OK) {
        attn_test_fail(__FILE__, __LINE__, "metadata: %s", attn_context_last_error(w->ctx));
        return 0;
    }
    return 1;
}

/* out/lse of one call against the reference; failures counted (first few named). */
static int sp_compare(const spworld *w, const spcase *c, const void *out, const float *lse, const char *what) {
    /* the GPU's P and Q run in 16 bits (f32 q: f16 mma) */
    const double tol = c->dt == ATTN_DTYPE_F32 ? (c->cuda ? 4e-3 : 2e-4) : c->dt == ATTN_DTYPE_F16 ? (c->cuda ? 8e-3 : 3e-3)
                                                                                                     : (c->cuda ? 3e-2 : 2e-2);
    size_t x, n = (size_t)w->ntok * c->heads * SP_R;
    int bad = 0;
    for (x = 0; x < n && bad < 4; x++) {
        double g = get(out, c->dt, x), e = w->ref[x];
        if (!(fabs(g - e) <= tol + tol * fabs(e))) {
            attn_test_fail(__FILE__, __LINE__, "%s: out[%zu] (token %zu head %zu) %g, float64 %g", what, x,
                           x / SP_R / c->heads, x / SP_R % c->heads, g, e);
            bad++;
        }
    }
    /* the GPU widens fp8_ds_mla rows (code x its tile's f32 scale) into the layer's 16-bit
       type before S: bf16 rounding of each key moves a score by up to 2^-9 of its size */
    const double ltol = c->cuda && w->d.kv_cache_dtype == ATTN_DTYPE_FP8_DS_MLA ? 5e-3 : 1e-3;
    for (x = 0; c->lse && x < (size_t)w->ntok * c->heads && bad < 4; x++) {
        double e = w->ref_lse[x];
        if (!(fabs((double)lse[x] - e) <= ltol + 1e-4 * fabs(e)) && !(isinf(e) && lse[x] == (float)e)) {
            attn_test_fail(__FILE__, __LINE__, "%s: lse[%zu] %g, float64 %g", what, x, (double)lse[x], e);
            bad++;
        }
    }
    return bad;
}

static attn_tensor sp_t3(void *p, attn_dtype dt, int64_t a, int64_t b, int64_t c, int cuda) {
    int64_t sh[3];
    attn_tensor t;
    sh[0] = a; sh[1] = b; sh[2] = c;
    t = attn_tensor_make(p, dt, 3, sh);
    if (cuda) t.device.kind = ATTN_DEVICE_CUDA;
    return t;
}

/* One CPU call of case c, checked; returns the failures. */
static int sp_run_cpu(spworld *w, const spcase *c, const char *what) {
    const size_t esz = attn_dtype_size(c->dt);
    int64_t cshape[ATTN_MAX_DIMS], ish[2];
    int nd = 0;
    attn_tensor q = sp_t3(w->q, c->dt, w->ntok, c->heads, c->split_q ? SP_R : SP_D, 0);
    attn_tensor qpe = sp_t3(w->qpe, c->dt, w->ntok, c->heads, SP_P, 0);
    attn_tensor out = sp_t3(w->out, c->dt, w->ntok, c->heads, SP_R, 0), cache, idx, lse;
    int64_t lsh[2];
    if (c->split_q) { /* q_latent: a view of q's rows */
        q.strides[0] = (int64_t)c->heads * SP_D;
        q.strides[1] = SP_D;
        q.strides[2] = 1;
    }
    attn_layer_kv_cache_shape(w->cpu, w->nb, cshape, &nd);
    cache = attn_tensor_make(w->cache, w->d.kv_cache_dtype, nd, cshape);
    ish[0] = w->ntok; ish[1] = c->topk;
    idx = attn_tensor_make(w->idx, ATTN_DTYPE_INT32, 2, ish);
    lsh[0] = w->ntok; lsh[1] = c->heads;
    lse = attn_tensor_make(w->lse, ATTN_DTYPE_F32, 2, lsh);
    memset(w->out, 0xff, (size_t)w->ntok * c->heads * SP_R * esz);
    memset(w->lse, 0xff, (size_t)w->ntok * c->heads * 4);
    if (attn_mla_forward_sparse(w->cpu, w->meta, &q, c->split_q ? &qpe : NULL, &cache, &idx, &out, c->lse ? &lse : NULL,
                                NULL) != ATTN_OK) {
        attn_test_fail(__FILE__, __LINE__, "%s: %s", what, attn_context_last_error(w->ctx));
        return 1;
    }
    return sp_compare(w, c, w->out, w->lse, what);
}

static void sp_case(spcase *c, int k, rng *r) {
    int i;
    memset(c, 0, sizeof *c);
    c->heads = k % 3 == 0 ? 16 : k % 3 == 1 ? 128 : 20;
    c->block = k % 2 ? 64 : 16;
    c->dt = k % 4 == 3 ? ATTN_DTYPE_F16 : k % 5 == 4 ? ATTN_DTYPE_F32 : ATTN_DTYPE_BF16;
    c->kv = k % 3 == 2 ? ATTN_DTYPE_FP8_DS_MLA : k == 4 ? ATTN_DTYPE_FP8_E4M3 : c->dt;
    if (c->kv == ATTN_DTYPE_FP8_DS_MLA && c->dt == ATTN_DTYPE_F32) c->dt = ATTN_DTYPE_BF16;
    c->topk = k == 1 ? 2048 : k % 4 == 0 ? 64 : rng_int(r, 1, 300);
    c->nreq = 1 + rng_int(r, 0, 4);
    for (i = 0; i < c->nreq; i++) {
        c->qlen[i] = i == 2 ? 9 : i == 3 ? 3 : 1;
        c->slen[i] = c->qlen[i] + rng_int(r, 1, k == 1 ? 3000 : 700);
    }
    if (k == 6) { /* a prefill chunk of 140 tokens last: more CTAs than a wave, so the GPU does not split */
        c->nreq = 3;
        c->qlen[2] = 140;
        c->slen[2] = 140 + rng_int(r, 1, 300);
    }
    c->split_q = k % 2;
    c->sinks = k % 3 == 1 || k == 6;
    c->lse = k % 2 == 0 || k == 1;
    if (k >= 9) { /* the wgmma gather's shapes (CUDA_MLA_SM90: 16-bit latents past 32 heads) */
        c->heads = k == 9 ? 64 : k == 10 ? 40 : 128;
        c->block = k == 10 ? 16 : 64;
        c->dt = c->kv = k == 10 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        c->topk = k == 9 ? 777 : k == 10 ? 129 : 2048;
        if (k == 10) { /* 150 tokens: more CTAs than a wave, no splits; the sink in the kernel */
            c->nreq = 3;
            c->qlen[0] = 1; c->qlen[1] = 9; c->qlen[2] = 140;
            for (i = 0; i < 3; i++) c->slen[i] = c->qlen[i] + rng_int(r, 1, 400);
        }
        if (k == 11) { /* one token over 2048 of ~3000 positions: split 16 ways, merged with the sink */
            c->nreq = 1;
            c->qlen[0] = 1;
            c->slen[0] = 2900 + rng_int(r, 0, 200);
        }
        c->sinks = k != 9;
        c->lse = 1;
    }
    c->seed = 1000u + (unsigned)k;
}

static int sp_run_cuda(spworld *w, const spcase *c, const char *what);

/* The 12 random cases of sp_case, each world run on the CPU or (cuda) the GPU layer. */
static void sp_cases(int cuda) {
    rng r;
    int k;
    rng_seed(&r, 0x5a5e);
    const char *only = getenv("ATTN_TEST_SPARSE_CASES"); /* "1,9,11": these cases only (racecheck) */
    char list[64];
    if (only) snprintf(list, sizeof list, ",%s,", only);
    for (k = 0; k < 12; k++) {
        spcase c;
        spworld w;
        char what[96], tag[16];
        sp_case(&c, k, &r); /* every case drawn, so a case's draws do not depend on the list */
        snprintf(tag, sizeof tag, ",%d,", k);
        if (only && !strstr(list, tag)) continue;
        if (!sp_open(&w, &c)) {
            attn_test_fail(__FILE__, __LINE__, "case %d: world", k);
            sp_free(&w);
            continue;
        }
        snprintf(what, sizeof what, "%scase %d (H %d, %s cache, topk %d, %d tokens)", cuda ? "CUDA " : "", k, c.heads,
                 attn_dtype_name(w.d.kv_cache_dtype), c.topk, w.ntok);
        EXPECT_EQ_INT(cuda ? sp_run_cuda(&w, &c, what) : sp_run_cpu(&w, &c, what), 0);
        sp_free(&w);
    }
}

ATTN_TEST(test_mla_sparse_matches_float64) {
    sp_cases(0);
}

/* The fp8_ds_mla bytes as the format defines them: codes of x / (max|tile| / 448), the
   four f32 scales at byte 512, k_pe as bf16 at 528; a zero tile keeps a finite scale. */
ATTN_TEST(test_mla_ds_row_layout) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 1);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    float kc[SP_R], kp[SP_P], sc[4];
    uint8_t cache[16 * 656];
    int64_t slots[1] = {5}, sh[2], cshape[ATTN_MAX_DIMS];
    int nd = 0, x, t;
    attn_tensor tc, tp, tcache;
    memset(&d, 0, sizeof d);
    d.num_heads = 16; d.head_size = SP_D; d.use_mla = 1; d.kv_lora_rank = SP_R; d.qk_rope_head_dim = SP_P;
    d.dtype = ATTN_DTYPE_F32; d.kv_cache_dtype = ATTN_DTYPE_FP8_DS_MLA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    for (x = 0; x < SP_R; x++) kc[x] = x >= 256 && x < 384 ? 0.0f : (float)((x * 37) % 201 - 100) * (x < 128 ? 0.01f : 3.0f);
    for (x = 0; x < SP_P; x++) kp[x] = (float)x * 0.37f - 11.0f;
    memset(cache, 0x5a, sizeof cache);
    sh[0] = 1; sh[1] = SP_R;
    tc = attn_tensor_make(kc, ATTN_DTYPE_F32, 2, sh);
    sh[1] = SP_P;
    tp = attn_tensor_make(kp, ATTN_DTYPE_F32, 2, sh);
    attn_layer_kv_cache_shape(layer, 1, cshape, &nd);
    EXPECT_EQ_INT(nd, 3);
    EXPECT_EQ_INT((int)cshape[2], 656);
    tcache = attn_tensor_make(cache, ATTN_DTYPE_FP8_DS_MLA, nd, cshape);
    EXPECT_OK(attn_concat_and_cache_mla(layer, &tc, &tp, &tcache, ATTN_TEST_SLOTS(slots, 1), NULL));
    memcpy(sc, cache + 5 * 656 + 512, 16);
    for (t = 0; t < 4; t++) {
        float amax = 0.0f;
        for (x = 0; x < 128; x++) amax = fmaxf(amax, fabsf(kc[128 * t + x]));
        EXPECT_TRUE(sc[t] == (amax > 0.0f ? amax / 448.0f : FLT_MIN));
        for (x = 0; x < 128; x++)
            EXPECT_EQ_INT(cache[5 * 656 + 128 * t + x], attn_f32_to_fp8_e4m3(kc[128 * t + x] / sc[t]));
    }
    for (x = 0; x < SP_P; x++) {
        uint16_t b;
        memcpy(&b, cache + 5 * 656 + 528 + 2 * x, 2);
        EXPECT_EQ_INT(b, attn_f32_to_bf16(kp[x]));
    }
    EXPECT_EQ_INT(cache[4 * 656 + 655], 0x5a); /* the neighbours untouched */
    EXPECT_EQ_INT(cache[6 * 656], 0x5a);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* Named errors, nothing written: an index past its request, -2, a wrong indices dtype or
   shape, topk 0; the dense calls on an fp8_ds_mla cache and on a layer with sinks; an
   fp8_ds_mla standard layer or one with scales set. */
ATTN_TEST(test_mla_sparse_refusals) {
    spcase c;
    spworld w;
    rng r;
    rng_seed(&r, 7);
    sp_case(&c, 2, &r); /* an fp8_ds_mla case */
    c.sinks = 1;
    if (!sp_open(&w, &c)) {
        attn_test_fail(__FILE__, __LINE__, "world");
        sp_free(&w);
        return;
    }
    {
        int64_t cshape[ATTN_MAX_DIMS], ish[2];
        int nd = 0, bad_at = 0, good;
        attn_tensor q = sp_t3(w.q, c.dt, w.ntok, c.heads, SP_D, 0), out = sp_t3(w.out, c.dt, w.ntok, c.heads, SP_R, 0);
        attn_tensor cache, idx;
        attn_layer_kv_cache_shape(w.cpu, w.nb, cshape, &nd);
        cache = attn_tensor_make(w.cache, w.d.kv_cache_dtype, nd, cshape);
        ish[0] = w.ntok; ish[1] = c.topk;
        idx = attn_tensor_make(w.idx, ATTN_DTYPE_INT32, 2, ish);
        memset(w.out, 0x7f, (size_t)w.ntok * c.heads * SP_R * attn_dtype_size(c.dt));
        good = w.idx[bad_at];
        w.idx[bad_at] = c.slen[0]; /* one past request 0's last position */
        EXPECT_EQ_INT(attn_mla_forward_sparse(w.cpu, w.meta, &q, NULL, &cache, &idx, &out, NULL, NULL),
                      ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(w.ctx), "indices[0][0]") != NULL);
        EXPECT_EQ_INT(((uint8_t *)w.out)[0], 0x7f); /* nothing written */
        w.idx[bad_at] = -2;
        EXPECT_EQ_INT(attn_mla_forward_sparse(w.cpu, w.meta, &q, NULL, &cache, &idx, &out, NULL, NULL),
                      ATTN_ERROR_INVALID_VALUE);
        w.idx[bad_at] = good;
        idx.dtype = ATTN_DTYPE_INT64;
        EXPECT_EQ_INT(attn_mla_forward_sparse(w.cpu, w.meta, &q, NULL, &cache, &idx, &out, NULL, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        idx.dtype = ATTN_DTYPE_INT32;
        idx.shape[1] = 0;
        EXPECT_EQ_INT(attn_mla_forward_sparse(w.cpu, w.meta, &q, NULL, &cache, &idx, &out, NULL, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_TRUE(strstr(attn_context_last_error(w.ctx), "topk") != NULL);
        idx.shape[1] = c.topk;
        EXPECT_EQ_INT(attn_mla_forward_sparse(w.cpu, w.meta, &q, NULL, &cache, NULL, &out, NULL, NULL),
                      ATTN_ERROR_NULL_ARGUMENT);
        EXPECT_EQ_INT(((uint8_t *)w.out)[0], 0x7f);
        /* the dense absorbed decode refuses the fp8_ds_mla cache by name */
        EXPECT_EQ_INT(attn_mla_forward_mqa(w.cpu, w.meta, &q, NULL, &cache, &out, NULL, NULL), ATTN_ERROR_UNSUPPORTED);
        EXPECT_TRUE(strstr(attn_context_last_error(w.ctx), "fp8_ds_mla") != NULL);
        EXPECT_OK(attn_mla_forward_sparse(w.cpu, w.meta, &q, NULL, &cache, &idx, &out, NULL, NULL));
    }
    sp_free(&w);
    sp_case(&c, 0, &r); /* a bf16 latent, sinks: the dense calls refuse the sinks by name */
    c.sinks = 1;
    if (sp_open(&w, &c)) {
        int64_t cshape[ATTN_MAX_DIMS];
        int nd = 0;
        attn_tensor q = sp_t3(w.q, c.dt, w.ntok, c.heads, SP_D, 0), out = sp_t3(w.out, c.dt, w.ntok, c.heads, SP_R, 0);
        attn_tensor cache;
        attn_layer_kv_cache_shape(w.cpu, w.nb, cshape, &nd);
        cache = attn_tensor_make(w.cache, w.d.kv_cache_dtype, nd, cshape);
        EXPECT_EQ_INT(attn_mla_forward_mqa(w.cpu, w.meta, &q, NULL, &cache, &out, NULL, NULL), ATTN_ERROR_UNSUPPORTED);
        EXPECT_TRUE(strstr(attn_context_last_error(w.ctx), "sinks") != NULL);
    } else {
        attn_test_fail(__FILE__, __LINE__, "world");
    }
    sp_free(&w);
    { /* descriptors: fp8_ds_mla outside DeepSeek-V3.2's latent, or with scales; sinks on dense MLA calls */
        attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 1);
        attn_layer_desc d;
        attn_layer *layer = NULL;
        memset(&d, 0, sizeof d);
        d.num_heads = 8; d.head_size = 128; d.dtype = ATTN_DTYPE_BF16; d.kv_cache_dtype = ATTN_DTYPE_FP8_DS_MLA;
        EXPECT_EQ_INT(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "fp8_ds_mla") != NULL);
        d.head_size = 320; d.use_mla = 1; d.kv_lora_rank = 256; d.qk_rope_head_dim = 64;
        EXPECT_EQ_INT(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
        d.head_size = SP_D; d.kv_lora_rank = SP_R; d.k_scale.value = 0.5f;
        EXPECT_EQ_INT(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "own four scales") != NULL);
        d.k_scale.value = 0.0f;
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
        attn_layer_destroy(layer);
        attn_context_destroy(ctx);
    }
}

/* ---- the GPU: the same worlds on CUDA_MLA_SM90 / CUDA_MLA against the float64 reference ---- */

static const char *sp_no_gpu(attn_context *ctx) {
    static attn_platform p;
    if (attn_platform_get(ctx, &p) != ATTN_OK) return "no platform";
    if (p.kind != ATTN_PLATFORM_CUDA) return p.cuda_reason;
    if (p.cuda_capability_major < 8) return "compute capability below 8.0";
    if (!p.nvrtc_version) return p.nvrtc_reason;
    return NULL;
}

/* Case c on the GPU layer of the world's descriptor (f32 q: refused by name, the CUDA MLA
   kernels take 16-bit q); the GPU's cache write of the world's latents must give the CPU's
   bytes. Returns the failures. */
static int sp_run_cuda(spworld *w, const spcase *c, const char *what) {
    const size_t esz = attn_dtype_size(c->dt), rb = sp_row_bytes(&w->d);
    attn_layer_desc d = w->d;
    attn_layer *gpu = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md;
    void *dq = NULL, *dqpe = NULL, *dcache = NULL, *didx = NULL, *dout = NULL, *dlse = NULL, *dsinks = NULL;
    void *hout = malloc((size_t)w->ntok * c->heads * SP_R * esz);
    float *hlse = (float *)malloc((size_t)w->ntok * c->heads * 4);
    int bad = 0;
    d.device = ATTN_DEVICE_CUDA;
    d.sinks = NULL;
    if (c->sinks && !(dsinks = attn_test_device_copy(w->ctx, w->sinks, (size_t)c->heads * 4))) { bad++; goto done; }
    d.sinks = (const float *)dsinks;
    if (attn_layer_create(w->ctx, &d, NULL, &gpu) != ATTN_OK) { /* refused by name: f32 q, which no CUDA MLA kernel takes */
        if (d.dtype == ATTN_DTYPE_F32 && strstr(attn_context_last_error(w->ctx), "f32")) goto done;
        attn_test_fail(__FILE__, __LINE__, "%s: CUDA layer: %s", what, attn_context_last_error(w->ctx));
        bad++;
        goto done;
    }
    memset(&md, 0, sizeof md);
    md.max_num_reqs = c->nreq; md.max_num_tokens = w->ntok + 4; md.max_blocks_per_req = w->stride; md.num_blocks = w->nb;
    md.decode_threshold = 16;
    if (attn_metadata_create(gpu, &md, &meta) != ATTN_OK || attn_metadata_build(meta, 0, &w->b, 0) != ATTN_OK) {
        attn_test_fail(__FILE__, __LINE__, "%s: metadata: %s", what, attn_context_last_error(w->ctx));
        bad++;
        goto done;
    }
    memset(hout, 0xff, (size_t)w->ntok * c->heads * SP_R * esz);
    memset(hlse, 0xff, (size_t)w->ntok * c->heads * 4);
    if (!(dq = attn_test_device_copy(w->ctx, w->q, (size_t)w->ntok * c->heads * SP_D * esz)) ||
        !(dqpe = attn_test_device_copy(w->ctx, w->qpe, (size_t)w->ntok * c->heads * SP_P * esz)) ||
        !(dcache = attn_test_device_copy(w->ctx, w->cache, (size_t)w->nb * c->block * rb)) ||
        !(didx = attn_test_device_copy(w->ctx, w->idx, (size_t)w->ntok * c->topk * 4)) ||
        !(dout = attn_test_device_copy(w->ctx, hout, (size_t)w->ntok * c->heads * SP_R * esz)) ||
        !(dlse = attn_test_device_copy(w->ctx, hlse, (size_t)w->ntok * c->heads * 4))) {
        attn_test_fail(__FILE__, __LINE__, "%s: device buffers: %s", what, attn_context_last_error(w->ctx));
        bad++;
        goto done;
    }
    {
        int64_t cshape[ATTN_MAX_DIMS], ish[2], lsh[2];
        int nd = 0;
        attn_tensor q = sp_t3(dq, c->dt, w->ntok, c->heads, c->split_q ? SP_R : SP_D, 1);
        attn_tensor qpe = sp_t3(dqpe, c->dt, w->ntok, c->heads, SP_P, 1);
        attn_tensor out = sp_t3(dout, c->dt, w->ntok, c->heads, SP_R, 1), cache, idx, lse;
        if (c->split_q) { q.strides[0] = (int64_t)c->heads * SP_D; q.strides[1] = SP_D; q.strides[2] = 1; }
        attn_layer_kv_cache_shape(gpu, w->nb, cshape, &nd);
        cache = attn_tensor_make(dcache, d.kv_cache_dtype, nd, cshape);
        cache.device.kind = ATTN_DEVICE_CUDA;
        ish[0] = w->ntok; ish[1] = c->topk;
        idx = attn_tensor_make(didx, ATTN_DTYPE_INT32, 2, ish);
        idx.device.kind = ATTN_DEVICE_CUDA;
        lsh[0] = w->ntok; lsh[1] = c->heads;
        lse = attn_tensor_make(dlse, ATTN_DTYPE_F32, 2, lsh);
        lse.device.kind = ATTN_DEVICE_CUDA;
        { /* the GPU's cache write of the same latents: the CPU's bytes (fp8_ds_mla: codes, scales, bf16) */
            void *dkc = attn_test_device_copy(w->ctx, w->kcd, (size_t)w->nw * SP_R * esz), *dkp = attn_test_device_copy(w->ctx, w->kpd, (size_t)w->nw * SP_P * esz);
            void *dslots = attn_test_device_copy(w->ctx, w->slots, (size_t)w->nw * 8), *dfresh = attn_test_device_copy(w->ctx, NULL, (size_t)w->nb * c->block * rb);
            unsigned char *back = (unsigned char *)malloc((size_t)w->nb * c->block * rb);
            int64_t sh[2];
            attn_tensor tkc, tkp, tsl, tfresh;
            if (!dkc || !dkp || !dslots || !dfresh || !back) { bad++; }
            else {
                sh[0] = w->nw; sh[1] = SP_R;
                tkc = attn_tensor_make(dkc, c->dt, 2, sh); tkc.device.kind = ATTN_DEVICE_CUDA;
                sh[1] = SP_P;
                tkp = attn_tensor_make(dkp, c->dt, 2, sh); tkp.device.kind = ATTN_DEVICE_CUDA;
                tsl = attn_tensor_make(dslots, ATTN_DTYPE_INT64, 1, sh); tsl.device.kind = ATTN_DEVICE_CUDA;
                tfresh = cache; tfresh.data = dfresh;
                memset(back, 0, (size_t)w->nb * c->block * rb);
                if (attn_cuda_memcpy(w->ctx, dfresh, back, (size_t)w->nb * c->block * rb, ATTN_COPY_HOST_TO_DEVICE, NULL) != ATTN_OK ||
                    attn_concat_and_cache_mla(gpu, &tkc, &tkp, &tfresh, &tsl, NULL) != ATTN_OK ||
                    attn_cuda_memcpy(w->ctx, back, dfresh, (size_t)w->nb * c->block * rb, ATTN_COPY_DEVICE_TO_HOST, NULL) != ATTN_OK) {
                    attn_test_fail(__FILE__, __LINE__, "%s: CUDA cache write: %s", what, attn_context_last_error(w->ctx));
                    bad++;
                } else {
                    int i2;
                    for (i2 = 0; i2 < w->nw; i2++)
                        if (memcmp(back + (size_t)w->slots[i2] * rb, (const char *)w->cache + (size_t)w->slots[i2] * rb, rb)) {
                            attn_test_fail(__FILE__, __LINE__, "%s: the CUDA cache write of slot %lld differs from the CPU's",
                                           what, (long long)w->slots[i2]);
                            bad++;
                            break;
                        }
                }
            }
            attn_cuda_free(w->ctx, dkc); attn_cuda_free(w->ctx, dkp); attn_cuda_free(w->ctx, dslots);
            attn_cuda_free(w->ctx, dfresh);
            free(back);
        }
        if (attn_mla_forward_sparse(gpu, meta, &q, c->split_q ? &qpe : NULL, &cache, &idx, &out, c->lse ? &lse : NULL,
                                    NULL) != ATTN_OK ||
            attn_cuda_memcpy(w->ctx, hout, dout, (size_t)w->ntok * c->heads * SP_R * esz, ATTN_COPY_DEVICE_TO_HOST,
                             NULL) != ATTN_OK ||
            attn_cuda_memcpy(w->ctx, hlse, dlse, (size_t)w->ntok * c->heads * 4, ATTN_COPY_DEVICE_TO_HOST, NULL) != ATTN_OK) {
            attn_test_fail(__FILE__, __LINE__, "%s: CUDA call: %s", what, attn_context_last_error(w->ctx));
            bad++;
            goto done;
        }
        {
            spcase g = *c;
            g.cuda = 1; /* the GPU's tolerances */
            bad += sp_compare(w, &g, hout, hlse, what) ? 1 : 0;
        }
    }
done:
    attn_metadata_destroy(meta);
    attn_layer_destroy(gpu);
    attn_cuda_free(w->ctx, dq); attn_cuda_free(w->ctx, dqpe); attn_cuda_free(w->ctx, dcache); attn_cuda_free(w->ctx, didx);
    attn_cuda_free(w->ctx, dout); attn_cuda_free(w->ctx, dlse); attn_cuda_free(w->ctx, dsinks);
    free(hout); free(hlse);
    return bad;
}

ATTN_TEST(test_mla_sparse_cuda_matches_float64) {
    attn_context *probe = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 1);
    const char *why = sp_no_gpu(probe);
    if (why) {
        static char reason[256];
        snprintf(reason, sizeof reason, "%s", why);
        attn_context_destroy(probe);
        SKIP(reason);
    }
    attn_context_destroy(probe);
    sp_cases(1);
}

void suite_mla_sparse(void) {
    ATTN_RUN(test_mla_sparse_matches_float64);
    ATTN_RUN(test_mla_ds_row_layout);
    ATTN_RUN(test_mla_sparse_refusals);
    ATTN_RUN(test_mla_sparse_cuda_matches_float64);
}
