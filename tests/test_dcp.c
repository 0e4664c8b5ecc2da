/* Decode context parallelism on the CPU backends (issue 25, CPU step): a sequence's KV
   cache dealt over W = 1..8 ranks in runs of I tokens, each rank's metadata built from the
   global batch with its own block tables, each rank's forward giving (out, LSE) over its
   keys, and attn_dcp_combine joining them. The joined result must equal the single-rank
   forward on the whole cache: random varlen batches of decodes, speculative rows and
   chunked prefills; GQA, sliding windows, sinks, fp8 caches, bf16; MLA's absorbed decode
   and up-projected prefill over a rank's latent rows. Outputs are poisoned (NaN) before
   every call. Then the named errors. */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint64_t s; } drng;
static uint64_t d_next(drng *r) {
    r->s ^= r->s << 13; r->s ^= r->s >> 7; r->s ^= r->s << 17;
    return r->s;
}
static int d_int(drng *r, int lo, int hi) { return lo + (int)(d_next(r) % (uint64_t)(hi - lo + 1)); }
static float d_uni(drng *r) { return (float)((d_next(r) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }

static void *alloc_poisoned(attn_dtype dt, size_t n) { /* NaN in every element */
    size_t esz = attn_dtype_size(dt), i;
    void *p = malloc(n * esz + 1);
    for (i = 0; i < n; i++) attn_test_put(p, dt, i, NAN);
    return p;
}

/* One random batch: per request the query length and the sequence length. */
typedef struct {
    int nreq, T, maxq, maxs;
    int32_t qsl[9], sl[8];
} dbatch;

static void random_batch(drng *r, dbatch *b, int mla) {
    int i;
    b->nreq = d_int(r, 1, 6);
    b->qsl[0] = 0;
    b->maxq = b->maxs = 0;
    for (i = 0; i < b->nreq; i++) {
        int kind = d_int(r, 0, 2), ql = kind == 0 ? 1 : kind == 1 ? d_int(r, 2, 4) : d_int(r, 5, 40);
        int ctxlen = d_int(r, 0, 3) == 0 ? d_int(r, 0, 6) : d_int(r, 0, 300);
        b->qsl[i + 1] = b->qsl[i] + ql;
        b->sl[i] = ctxlen + ql;
    }
    if (mla) { /* decodes first */
        int j, k;
        for (j = 0; j < b->nreq; j++)
            for (k = j + 1; k < b->nreq; k++) {
                int qj = b->qsl[j + 1] - b->qsl[j], qk = b->qsl[k + 1] - b->qsl[k];
                if (qj > 1 && qk == 1) { /* swap request j and k */
                    int32_t q[8], s[8], n = b->nreq, t;
                    for (t = 0; t < n; t++) { q[t] = b->qsl[t + 1] - b->qsl[t]; s[t] = b->sl[t]; }
                    t = q[j]; q[j] = q[k]; q[k] = t;
                    t = s[j]; s[j] = s[k]; s[k] = t;
                    for (t = 0; t < n; t++) { b->qsl[t + 1] = b->qsl[t] + q[t]; b->sl[t] = s[t]; }
                }
            }
    }
    b->T = b->qsl[b->nreq];
    for (i = 0; i < b->nreq; i++) {
        if (b->qsl[i + 1] - b->qsl[i] > b->maxq) b->maxq = b->qsl[i + 1] - b->qsl[i];
        if (b->sl[i] > b->maxs) b->maxs = b->sl[i];
    }
}

/* A rank's (or the whole world's, W = 1) paged layout of the batch: shuffled block ids,
   a block table of the rank's blocks, the slot of each (request, position) it holds. */
typedef struct {
    int W, rank, I, bs, stride;
    int64_t num_blocks;
    int32_t *table;      /* [nreq][stride] */
    int64_t *slots;      /* batch token -> slot (-1: another rank's) */
} dlayout;

static void layout_make(dlayout *L, const dbatch *b, int W, int rank, int I, int bs, drng *r) {
    int i, k, n = 0, *ids;
    L->W = W; L->rank = rank; L->I = I; L->bs = bs;
    L->stride = (b->maxs + bs - 1) / bs + 1;
    L->num_blocks = (int64_t)b->nreq * L->stride + 3;
    L->table = (int32_t *)calloc((size_t)b->nreq * (size_t)L->stride, sizeof(int32_t));
    L->slots = (int64_t *)malloc((size_t)(b->T + 1) * sizeof(int64_t));
    ids = (int *)malloc((size_t)L->num_blocks * sizeof(int));
    for (i = 0; i < L->num_blocks; i++) ids[i] = i;
    for (i = (int)L->num_blocks - 1; i > 0; i--) { int j = d_int(r, 0, i), t = ids[i]; ids[i] = ids[j]; ids[j] = t; }
    for (i = 0; i < b->nreq; i++) {
        int local = (int)attn_dcp_local_tokens(W, rank, I, b->sl[i]), nb = (local + bs - 1) / bs, ql = b->qsl[i + 1] - b->qsl[i], t;
        for (k = 0; k < nb; k++) L->table[(size_t)i * (size_t)L->stride + (size_t)k] = ids[n++];
        for (t = 0; t < ql; t++) {
            int pos = b->sl[i] - ql + t, j = (int)attn_dcp_local_tokens(W, rank, I, pos);
            L->slots[b->qsl[i] + t] = (pos / I) % W == rank ?
                (int64_t)L->table[(size_t)i * (size_t)L->stride + (size_t)(j / bs)] * bs + j % bs : -1;
        }
    }
    free(ids);
}
static void layout_free(dlayout *L) { free(L->table); free(L->slots); }

static attn_batch batch_view(const dbatch *b, const dlayout *L) {
    attn_batch v;
    memset(&v, 0, sizeof v);
    v.query_start_loc = b->qsl; v.seq_lens = b->sl; v.block_table = L->table; v.block_table_stride = L->stride;
    v.slot_mapping = L->slots; v.num_reqs = b->nreq; v.num_actual_tokens = b->T; v.max_query_len = b->maxq;
    v.max_seq_len = b->maxs;
    return v;
}

/* Writes every position's row (rows[req][pos], `width` values of `row_floats`) that the
   layout's rank holds into its cache through the public write (standard: K and V; MLA: the
   latent and its RoPE part). */
static int write_cache(attn_layer *layer, const dbatch *b, const dlayout *L, int mla, const float *const *k,
                       const float *const *v, int kvh, int D, int R, int P, attn_dtype dt, attn_tensor *cache) {
    int i, ok = 1;
    for (i = 0; i < b->nreq; i++) {
        int n = 0, pos;
        int64_t *slots = (int64_t *)malloc((size_t)b->sl[i] * sizeof(int64_t) + 8);
        size_t w1 = mla ? (size_t)R : (size_t)kvh * (size_t)D, w2 = mla ? (size_t)P : w1;
        void *a = malloc((size_t)b->sl[i] * w1 * attn_dtype_size(dt) + 8), *c = malloc((size_t)b->sl[i] * w2 * attn_dtype_size(dt) + 8);
        for (pos = 0; pos < b->sl[i]; pos++) {
            int j = (int)attn_dcp_local_tokens(L->W, L->rank, L->I, pos);
            size_t x;
            slots[pos] = (pos / L->I) % L->W == L->rank ?
                (int64_t)L->table[(size_t)i * (size_t)L->stride + (size_t)(j / L->bs)] * L->bs + j % L->bs : -1;
            for (x = 0; x < w1; x++) attn_test_put(a, dt, (size_t)pos * w1 + x, k[i][(size_t)pos * w1 + x]);
            for (x = 0; x < w2; x++) attn_test_put(c, dt, (size_t)pos * w2 + x, v[i][(size_t)pos * w2 + x]);
            n++;
        }
        {
            int64_t s1[3] = {n, kvh, D}, s2[2] = {n, R}, s3[2] = {n, P};
            attn_tensor ta = mla ? attn_tensor_make(a, dt, 2, s2) : attn_tensor_make(a, dt, 3, s1);
            attn_tensor tc = mla ? attn_tensor_make(c, dt, 2, s3) : attn_tensor_make(c, dt, 3, s1);
            attn_tensor ts = attn_tensor_slots(slots, n);
            attn_status st = mla ? attn_concat_and_cache_mla(layer, &ta, &tc, cache, &ts, NULL)
                                 : attn_reshape_and_cache(layer, &ta, &tc, cache, &ts, NULL);
            if (st != ATTN_OK) {
                attn_test_fail(__FILE__, __LINE__, "cache write: %s", attn_context_last_error(attn_layer_context(layer)));
                ok = 0;
            }
        }
        free(slots); free(a); free(c);
    }
    return ok;
}

typedef struct {
    int H, KVH, D, window, sinks, W, I, mla, R;
    attn_dtype dt, kvdt;
    int threads;         /* ranks as threads with the in-process communicator */
    attn_layer *gpu;     /* set: the forwards run on this CUDA layer (the cache written on the
                            CPU layer, then copied: both backends share its layout) */
    const attn_layer_desc *gpu_desc; /* threads on the GPU: each thread's CUDA layer */
    const attn_select_request *gpu_req; /* and its backend request (NULL: the selector's) */
} dcase;

/* A device copy of `bytes` of host memory (NULL on failure, with a test failure). */
static void *dev_copy(attn_context *ctx, const void *host, size_t bytes) {
    void *d = attn_test_device_copy(ctx, host, bytes);
    if (!d) attn_test_fail(__FILE__, __LINE__, "device copy: %s", attn_context_last_error(ctx));
    return d;
}

/* A device tensor over `p`. */
static attn_tensor dev_tensor(void *p, attn_dtype dt, int nd, const int64_t *shape) {
    attn_tensor t = attn_tensor_make(p, dt, nd, shape);
    t.device.kind = ATTN_DEVICE_CUDA;
    return t;
}

/* Host `n` values of a float array as dt on the device (NULL on failure, recorded). */
static void *dev_values(attn_context *ctx, attn_dtype dt, const float *x, size_t n) {
    void *h = malloc(n * attn_dtype_size(dt) + 8), *d;
    size_t i;
    for (i = 0; i < n; i++) attn_test_put(h, dt, i, x[i]);
    d = dev_copy(ctx, h, n * attn_dtype_size(dt));
    free(h);
    return d;
}

/* The device bytes back into host memory (0 on failure, recorded). */
static int dev_back(attn_context *ctx, void *host, const void *dev, size_t bytes) {
    if (attn_cuda_memcpy(ctx, host, dev, bytes, ATTN_COPY_DEVICE_TO_HOST, NULL) == ATTN_OK) return 1;
    attn_test_fail(__FILE__, __LINE__, "device copy back: %s", attn_context_last_error(ctx));
    return 0;
}

static void describe(const dcase *c, const dbatch *b, char *buf, size_t n) {
    int i, o = snprintf(buf, n, "%s H %d/%d D %d %s cache %s window %d sinks %d W %d I %d; reqs", c->mla ? "MLA" : "std",
                        c->H, c->KVH, c->D, attn_dtype_name(c->dt), attn_dtype_name(c->kvdt), c->window, c->sinks,
                        c->W, c->I);
    for (i = 0; i < b->nreq && o < (int)n; i++)
        o += snprintf(buf + o, n - (size_t)o, " %d/%d", b->qsl[i + 1] - b->qsl[i], b->sl[i]);
}

/* The forward of one rank (or of the whole world): out [T][H][dv] and lse [T][H]. MLA:
   the decodes' out_latent (width R) and the prefills' out (width v) in two tensors. */
typedef struct { void *out, *out2; float *lse, *lse2; } dres;

/* Where a rank's forward runs: the CPU layer on host buffers, or the case's CUDA layer on
   device copies of them (every placed buffer freed by place_free; results come back through
   place_back). */
typedef struct {
    attn_layer *layer;
    attn_context *ctx;
    int gpu, ok;
    void *own[16]; /* what place_free frees: device copies, or converted host arrays (9 at most) */
    int n_own;
} dplace;

static void *place_keep(dplace *pl, void *p) {
    if (!p || pl->n_own == (int)(sizeof pl->own / sizeof pl->own[0])) {
        if (p) attn_test_fail(__FILE__, __LINE__, "dplace: more than %d buffers", pl->n_own);
        if (pl->gpu) attn_cuda_free(pl->ctx, p);
        else free(p);
        pl->ok = 0;
        return NULL;
    }
    return pl->own[pl->n_own++] = p;
}
/* `bytes` of host memory where the forward reads or writes it (the host pointer on the CPU). */
static void *place_bytes(dplace *pl, void *host, size_t bytes) {
    return pl->gpu ? place_keep(pl, dev_copy(pl->ctx, host, bytes)) : host;
}
/* n floats as dt where the forward reads them. */
static void *place_values(dplace *pl, attn_dtype dt, const float *x, size_t n) {
    void *h;
    size_t i;
    if (pl->gpu) return place_keep(pl, dev_values(pl->ctx, dt, x, n));
    h = place_keep(pl, malloc(n * attn_dtype_size(dt) + 8));
    for (i = 0; h && i < n; i++) attn_test_put(h, dt, i, x[i]);
    return h;
}
static attn_tensor place_tensor(const dplace *pl, void *p, attn_dtype dt, int nd, const int64_t *shape) {
    return pl->gpu ? dev_tensor(p, dt, nd, shape) : attn_tensor_make(p, dt, nd, shape);
}
/* A placed output back into its host buffer (nothing to do on the CPU). */
static void place_back(dplace *pl, void *host, const void *placed, size_t bytes) {
    if (pl->gpu && pl->ok && !dev_back(pl->ctx, host, placed, bytes)) pl->ok = 0;
}
static void place_free(dplace *pl) {
    int i;
    for (i = 0; i < pl->n_own; i++) {
        if (pl->gpu) attn_cuda_free(pl->ctx, pl->own[i]);
        else free(pl->own[i]);
    }
    pl->n_own = 0;
}
/* A failed call of the rank's forward: recorded with the layer's last error. */
static void place_fail(dplace *pl, const char *what, const dlayout *L) {
    attn_test_fail(__FILE__, __LINE__, "%s%s, rank %d of %d: %s", pl->gpu ? "CUDA " : "", what, L->rank, L->W,
                   attn_context_last_error(pl->ctx));
    pl->ok = 0;
}

static int run_rank(attn_layer *layer, const dcase *c, const dbatch *b, const dlayout *L, const float *const *k,
                    const float *const *v, const float *q, const float *wuk, const float *wuv,
                    attn_communicator *comm, dres *res) {
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch bv = batch_view(b, L);
    int64_t cshape[8];
    int cnd = 0, ok, H = c->H, P = 64, N = 128, V = 128;
    attn_tensor cache;
    void *cmem;
    size_t cbytes = 1, x, esz = attn_dtype_size(c->dt);
    dplace pl;
    attn_layer_kv_cache_shape(layer, L->num_blocks, cshape, &cnd);
    for (x = 0; x < (size_t)cnd; x++) cbytes *= (size_t)cshape[x];
    cbytes *= attn_dtype_size(c->kvdt);
    cmem = malloc(cbytes);
    memset(cmem, 0x7f, cbytes); /* unwritten slots: large garbage that a stray read would show */
    if (c->kvdt == ATTN_DTYPE_FP8_E4M3) memset(cmem, 0x7e, cbytes);
    cache = attn_tensor_make(cmem, c->kvdt, cnd, cshape);
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 8; md.max_num_tokens = 256; md.max_blocks_per_req = L->stride; md.num_blocks = L->num_blocks;
    md.dcp_world_size = L->W; md.dcp_rank = L->rank; md.dcp_interleave = L->I; md.dcp_comm = comm;
    if (!write_cache(layer, b, L, c->mla, k, v, c->KVH, c->D, c->R, P, c->dt, &cache)) { free(cmem); return 0; }
    /* the cache is written on the CPU layer; a CUDA case copies it (both backends share its layout) */
    memset(&pl, 0, sizeof pl);
    pl.layer = c->gpu ? c->gpu : layer;
    pl.ctx = attn_layer_context(pl.layer);
    pl.gpu = c->gpu != NULL;
    pl.ok = 1;
    cache = place_tensor(&pl, place_bytes(&pl, cmem, cbytes), c->kvdt, cnd, cshape);
    if (pl.ok && (attn_metadata_create(pl.layer, &md, &meta) != ATTN_OK || attn_metadata_build(meta, 0, &bv, 0) != ATTN_OK))
        place_fail(&pl, "metadata", L);
    if (!c->mla) { /* q, out [T][H][D], lse [T][H] */
        int64_t qs[3] = {b->T, H, c->D}, ls[2] = {b->T, H};
        size_t qn = (size_t)b->T * (size_t)H * (size_t)c->D, lb = (size_t)b->T * (size_t)H * 4;
        res->out = alloc_poisoned(c->dt, qn);
        res->lse = (float *)alloc_poisoned(ATTN_DTYPE_F32, (size_t)b->T * (size_t)H);
        if (pl.ok) {
            attn_tensor tq = place_tensor(&pl, place_values(&pl, c->dt, q, qn), c->dt, 3, qs);
            attn_tensor to = place_tensor(&pl, place_bytes(&pl, res->out, qn * esz), c->dt, 3, qs);
            attn_tensor tl = place_tensor(&pl, place_bytes(&pl, res->lse, lb), ATTN_DTYPE_F32, 2, ls);
            if (pl.ok && attn_layer_forward(pl.layer, meta, &tq, NULL, NULL, &cache, &to, &tl, NULL) != ATTN_OK)
                place_fail(&pl, "forward", L);
            place_back(&pl, res->out, to.data, qn * esz);
            place_back(&pl, res->lse, tl.data, lb);
        }
    } else { /* the decodes' out_latent (width R) in out / lse, the prefills' out (width V) in out2 / lse2 */
        attn_mla_info info;
        int td = 0, tp = 0, R = c->R;
        memset(&info, 0, sizeof info);
        if (pl.ok) attn_metadata_mla_info(meta, &info);
        td = info.num_decode_tokens; tp = b->T - td;
        res->out = alloc_poisoned(c->dt, (size_t)b->T * (size_t)H * (size_t)R);
        res->lse = (float *)alloc_poisoned(ATTN_DTYPE_F32, (size_t)b->T * (size_t)H);
        res->out2 = alloc_poisoned(c->dt, (size_t)b->T * (size_t)H * (size_t)V);
        res->lse2 = (float *)alloc_poisoned(ATTN_DTYPE_F32, (size_t)b->T * (size_t)H);
        if (pl.ok && td > 0) { /* absorbed: q is [td][H][R + P] */
            int64_t qs[3] = {td, H, R + P}, os[3] = {td, H, R}, ls[2] = {td, H};
            size_t ob = (size_t)td * (size_t)H * (size_t)R * esz, lb = (size_t)td * (size_t)H * 4;
            attn_tensor tq = place_tensor(&pl, place_values(&pl, c->dt, q, (size_t)td * (size_t)H * (size_t)(R + P)),
                                          c->dt, 3, qs);
            attn_tensor to = place_tensor(&pl, place_bytes(&pl, res->out, ob), c->dt, 3, os);
            attn_tensor tl = place_tensor(&pl, place_bytes(&pl, res->lse, lb), ATTN_DTYPE_F32, 2, ls);
            if (pl.ok && attn_mla_forward_mqa(pl.layer, meta, &tq, NULL, &cache, &to, &tl, NULL) != ATTN_OK)
                place_fail(&pl, "forward_mqa", L);
            place_back(&pl, res->out, to.data, ob);
            place_back(&pl, res->lse, tl.data, lb);
        }
        if (pl.ok && tp > 0) { /* up-projected: q is [tp][H][N + P] after the decodes' rows; W_UK [H][N][R], W_UV [H][R][V] */
            int64_t qs[3] = {tp, H, N + P}, os[3] = {tp, H, V}, ls[2] = {tp, H}, ks[3] = {H, N, R}, vs[3] = {H, R, V};
            size_t ob = (size_t)tp * (size_t)H * (size_t)V * esz, lb = (size_t)tp * (size_t)H * 4;
            char *hout = (char *)res->out2 + (size_t)td * (size_t)H * (size_t)V * esz;
            float *hlse = res->lse2 + (size_t)td * (size_t)H;
            const float *qp = q + (size_t)td * (size_t)H * (size_t)(R + P); /* the prefill q block */
            attn_tensor tq = place_tensor(&pl, place_values(&pl, c->dt, qp, (size_t)tp * (size_t)H * (size_t)(N + P)),
                                          c->dt, 3, qs);
            attn_tensor tk = place_tensor(&pl, place_values(&pl, c->dt, wuk, (size_t)H * (size_t)N * (size_t)R), c->dt, 3, ks);
            attn_tensor tv = place_tensor(&pl, place_values(&pl, c->dt, wuv, (size_t)H * (size_t)R * (size_t)V), c->dt, 3, vs);
            attn_tensor to = place_tensor(&pl, place_bytes(&pl, hout, ob), c->dt, 3, os);
            attn_tensor tl = place_tensor(&pl, place_bytes(&pl, hlse, lb), ATTN_DTYPE_F32, 2, ls);
            if (pl.ok && attn_mla_forward_mha(pl.layer, meta, &tq, &cache, &tk, &tv, &to, &tl, NULL) != ATTN_OK)
                place_fail(&pl, "forward_mha", L);
            place_back(&pl, hout, to.data, ob);
            place_back(&pl, hlse, tl.data, lb);
        }
    }
    ok = pl.ok;
    place_free(&pl);
    attn_metadata_destroy(meta);
    free(cmem);
    return ok;
}

/* Combines the ranks' rows [t0, t1) of width `width` (out and lse arrays of W ranks). */
static int combine(attn_context *ctx, int W, attn_dtype dt, void **outs, float **lses, int T, int t0, int t1, int H,
                   int width, void *out, float *lse) {
    attn_tensor to[8], tl[8], tout, tlse;
    const attn_tensor *po[8], *pl[8];
    int64_t os[3] = {t1 - t0, H, width}, ls[2] = {t1 - t0, H};
    size_t esz = attn_dtype_size(dt), off = (size_t)t0 * (size_t)H;
    int i;
    (void)T;
    for (i = 0; i < W; i++) {
        to[i] = attn_tensor_make((char *)outs[i] + off * (size_t)width * esz, dt, 3, os);
        tl[i] = attn_tensor_make(lses[i] + off, ATTN_DTYPE_F32, 2, ls);
        po[i] = &to[i]; pl[i] = &tl[i];
    }
    tout = attn_tensor_make((char *)out + off * (size_t)width * esz, dt, 3, os);
    tlse = attn_tensor_make(lse + off, ATTN_DTYPE_F32, 2, ls);
    if (attn_dcp_combine(ctx, W, po, pl, &tout, &tlse, NULL) != ATTN_OK) {
        attn_test_fail(__FILE__, __LINE__, "attn_dcp_combine: %s", attn_context_last_error(ctx));
        return 0;
    }
    return 1;
}

static int compare_rows(const dcase *c, const char *what, const void *got, const float *glse, const void *want,
                        const float *wlse, int t0, int t1, int H, int width, const char *tag) {
    double at = c->dt == ATTN_DTYPE_F32 ? (c->gpu ? 2e-4 : 2e-5) : 2e-2, rt = at;
    /* CUDA MLA prefills up-project K and V through cuBLAS into the 16-bit type (the CPU keeps
       f32), which moves a row's LSE by up to ~1e-3; a rank that sees the wrong keys moves it
       by far more */
    double lat = c->gpu && c->mla && c->dt != ATTN_DTYPE_F32 ? 4e-3 : 1e-4, lrt = c->gpu && c->mla ? 1e-3 : 1e-5;
    int t, h, x, bad = 0;
    for (t = t0; t < t1 && bad < 3; t++)
        for (h = 0; h < H && bad < 3; h++) {
            size_t row = (size_t)t * (size_t)H + (size_t)h;
            if (!attn_test_near(glse[row], wlse[row], lat, lrt)) {
                attn_test_fail(__FILE__, __LINE__, "%s: %s lse[%d][%d] %.7g, one rank %.7g", tag, what, t, h,
                               (double)glse[row], (double)wlse[row]);
                bad++;
            }
            for (x = 0; x < width && bad < 3; x++) {
                float g = attn_test_get(got, c->dt, row * (size_t)width + (size_t)x);
                float w = attn_test_get(want, c->dt, row * (size_t)width + (size_t)x);
                if (!attn_test_near(g, w, at, rt)) {
                    attn_test_fail(__FILE__, __LINE__, "%s: %s[%d][%d][%d] %.7g, one rank %.7g", tag, what, t, h, x,
                                   (double)g, (double)w);
                    bad++;
                }
            }
        }
    return bad == 0;
}

/* One rank as a thread: its own context and layer (as a process per GPU would have). */
typedef struct {
    const dcase *c;
    const dbatch *b;
    const dlayout *L;
    const float *const *k, *const *v;
    const float *q, *wuk, *wuv;
    attn_communicator *comm;
    dres *res;
    const attn_layer_desc *ld;
    int ok;
} dthread;

static void *rank_thread(void *p) {
    dthread *a = (dthread *)p;
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 1);
    attn_layer *layer = NULL;
    if (ctx && attn_layer_create(ctx, a->ld, NULL, &layer) == ATTN_OK) {
        dcase c2 = *a->c;  /* on the GPU: this thread's own CUDA layer beside the CPU one that writes */
        attn_layer *gpu = NULL;
        c2.gpu = NULL;
        if (!a->c->gpu_desc || attn_layer_create(ctx, a->c->gpu_desc, a->c->gpu_req, &gpu) == ATTN_OK) {
            c2.gpu = gpu;
            a->ok = run_rank(layer, &c2, a->b, a->L, a->k, a->v, a->q, a->wuk, a->wuv, a->comm, a->res);
        }
        attn_layer_destroy(gpu);
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    return NULL;
}

static void free_res(dres *r) { free(r->out); free(r->out2); free(r->lse); free(r->lse2); memset(r, 0, sizeof *r); }

/* One case: the whole world on one rank, then W ranks and the combine. */
static void run_case(attn_context *ctx, const dcase *c, uint64_t seed) {
    drng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    dbatch b;
    attn_layer_desc ld;
    attn_layer *layer = NULL;
    float *k[8], *v[8], *q, *wuk = NULL, *wuv = NULL, sinks[64];
    int i, rank, P = 64, N = 128, V = 128, qw, ow, td = 0;
    size_t x;
    dlayout L1, Lr[8];
    dres one, part[8], joined;
    char tag[256];
    random_batch(&r, &b, c->mla);
    describe(c, &b, tag, sizeof tag);
    memset(&ld, 0, sizeof ld);
    ld.num_heads = c->H; ld.dtype = c->dt; ld.kv_cache_dtype = c->kvdt; ld.block_size = 16;
    ld.causal = ATTN_CAUSAL_YES;
    if (c->mla) {
        ld.use_mla = 1; ld.num_kv_heads = 1; ld.kv_lora_rank = c->R; ld.qk_rope_head_dim = P; ld.qk_nope_head_dim = N;
        ld.v_head_dim = V; ld.head_size = c->R + P;
    } else {
        ld.num_kv_heads = c->KVH; ld.head_size = c->D; ld.sliding_window = c->window;
        if (c->sinks) {
            for (i = 0; i < c->H; i++) sinks[i] = 2.0f * d_uni(&r);
            ld.sinks = sinks;
        }
    }
    if (c->kvdt == ATTN_DTYPE_FP8_E4M3) ld.k_scale.value = ld.v_scale.value = 1.0f / 32;
    if (attn_layer_create(ctx, &ld, NULL, &layer) != ATTN_OK) {
        attn_test_fail(__FILE__, __LINE__, "%s: layer: %s", tag, attn_context_last_error(ctx));
        return;
    }
    for (i = 0; i < b.nreq; i++) { /* rows of every position: K/V [pos][kvh][D], or latent [pos][R] and k_pe [pos][P] */
        size_t w1 = c->mla ? (size_t)c->R : (size_t)c->KVH * (size_t)c->D, w2 = c->mla ? (size_t)P : w1;
        k[i] = (float *)malloc((size_t)b.sl[i] * w1 * sizeof(float));
        v[i] = (float *)malloc((size_t)b.sl[i] * w2 * sizeof(float));
        for (x = 0; x < (size_t)b.sl[i] * w1; x++) k[i][x] = d_uni(&r);
        for (x = 0; x < (size_t)b.sl[i] * w2; x++) v[i][x] = d_uni(&r);
    }
    qw = c->mla ? c->R + P : c->D;  /* widest q row (MLA: absorbed decodes; prefill rows use N + P) */
    ow = c->mla ? c->R : c->D;
    q = (float *)malloc((size_t)b.T * (size_t)c->H * (size_t)qw * sizeof(float));
    for (x = 0; x < (size_t)b.T * (size_t)c->H * (size_t)qw; x++) q[x] = 1.5f * d_uni(&r);
    if (c->mla) {
        wuk = (float *)malloc((size_t)c->H * (size_t)N * (size_t)c->R * sizeof(float));
        wuv = (float *)malloc((size_t)c->H * (size_t)c->R * (size_t)V * sizeof(float));
        for (x = 0; x < (size_t)c->H * (size_t)N * (size_t)c->R; x++) wuk[x] = 0.1f * d_uni(&r);
        for (x = 0; x < (size_t)c->H * (size_t)c->R * (size_t)V; x++) wuv[x] = 0.1f * d_uni(&r);
        for (i = 0; i < b.nreq && b.qsl[i + 1] - b.qsl[i] == 1; i++) td++;
    }
    memset(&one, 0, sizeof one); memset(part, 0, sizeof part); memset(&joined, 0, sizeof joined);
    memset(Lr, 0, sizeof Lr);
    layout_make(&L1, &b, 1, 0, 1, 16, &r);
    {
        dcase c1 = *c; /* the one-rank result on the CPU (a CUDA case compares its ranks with it) */
        c1.gpu = NULL;
        if (!run_rank(layer, &c1, &b, &L1, (const float *const *)k, (const float *const *)v, q, wuk, wuv, NULL, &one))
            goto done;
    }
    for (rank = 0; rank < c->W; rank++) layout_make(&Lr[rank], &b, c->W, rank, c->I, 16, &r);
    if (c->threads) { /* ranks as threads, each with its own context and layer, exchanging
                         through the in-process communicator: every rank gets the result */
        attn_communicator *comms[8];
        pthread_t th[8];
        dthread args[8];
        attn_context *cctx = c->gpu ? attn_layer_context(c->gpu) : ctx;
        if (attn_communicator_create_local(cctx, c->gpu ? ATTN_DEVICE_CUDA : ATTN_DEVICE_CPU, c->W, comms) != ATTN_OK) {
            attn_test_fail(__FILE__, __LINE__, "%s: communicator: %s", tag, attn_context_last_error(ctx));
            goto done_ranks;
        }
        for (i = 0; i < c->W; i++) {
            dthread a0 = {c, &b, &Lr[i], (const float *const *)k, (const float *const *)v, q, wuk, wuv, comms[i], &part[i], &ld, 0};
            args[i] = a0;
            pthread_create(&th[i], NULL, rank_thread, &args[i]);
        }
        for (i = 0; i < c->W; i++) pthread_join(th[i], NULL);
        for (i = 0; i < c->W; i++) {
            char t2[300];
            attn_communicator_destroy(comms[i]);
            snprintf(t2, sizeof t2, "%s, threads, rank %d", tag, i);
            if (!args[i].ok) continue;
            if (!c->mla) {
                compare_rows(c, "out", part[i].out, part[i].lse, one.out, one.lse, 0, b.T, c->H, ow, t2);
            } else {
                if (td > 0) compare_rows(c, "out_latent", part[i].out, part[i].lse, one.out, one.lse, 0, td, c->H, ow, t2);
                if (td < b.T) compare_rows(c, "out", part[i].out2, part[i].lse2, one.out2, one.lse2, td, b.T, c->H, V, t2);
            }
        }
        goto done_ranks;
    }
    for (rank = 0; rank < c->W; rank++)
        if (!run_rank(layer, c, &b, &Lr[rank], (const float *const *)k, (const float *const *)v, q, wuk, wuv, NULL,
                      &part[rank]))
            goto done_ranks;
    {
        void *outs[8], *outs2[8];
        float *lses[8], *lses2[8];
        for (i = 0; i < c->W; i++) { outs[i] = part[i].out; lses[i] = part[i].lse; outs2[i] = part[i].out2; lses2[i] = part[i].lse2; }
        joined.out = alloc_poisoned(c->dt, (size_t)b.T * (size_t)c->H * (size_t)ow);
        joined.lse = (float *)alloc_poisoned(ATTN_DTYPE_F32, (size_t)b.T * (size_t)c->H);
        if (!c->mla) {
            if (combine(ctx, c->W, c->dt, outs, lses, b.T, 0, b.T, c->H, ow, joined.out, joined.lse))
                compare_rows(c, "out", joined.out, joined.lse, one.out, one.lse, 0, b.T, c->H, ow, tag);
        } else {
            joined.out2 = alloc_poisoned(c->dt, (size_t)b.T * (size_t)c->H * (size_t)V);
            joined.lse2 = (float *)alloc_poisoned(ATTN_DTYPE_F32, (size_t)b.T * (size_t)c->H);
            if (td > 0 && combine(ctx, c->W, c->dt, outs, lses, b.T, 0, td, c->H, ow, joined.out, joined.lse))
                compare_rows(c, "out_latent", joined.out, joined.lse, one.out, one.lse, 0, td, c->H, ow, tag);
            if (td < b.T && combine(ctx, c->W, c->dt, outs2, lses2, b.T, td, b.T, c->H, V, joined.out2, joined.lse2))
                compare_rows(c, "out", joined.out2, joined.lse2, one.out2, one.lse2, td, b.T, c->H, V, tag);
        }
    }
done_ranks:
    for (i = 0; i < c->W; i++) {
        if (Lr[i].table) layout_free(&Lr[i]);
        free_res(&part[i]);
    }
done:
    layout_free(&L1);
    free_res(&one);
    free_res(&joined);
    for (i = 0; i < b.nreq; i++) { free(k[i]); free(v[i]); }
    free(q); free(wuk); free(wuv);
    attn_layer_destroy(layer);
}

static attn_context *cpu_ctx(void) { return attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 0); }

ATTN_TEST(test_dcp_local_tokens) {
    int W, r, I, p;
    for (W = 1; W <= 8; W++)
        for (I = 1; I <= 17; I += 8)
            for (p = 0; p <= 200; p++) {
                int64_t total = 0;
                for (r = 0; r < W; r++) {
                    int64_t brute = 0, q;
                    for (q = 0; q < p; q++) brute += (q / I) % W == r;
                    EXPECT_EQ_INT(attn_dcp_local_tokens(W, r, I, p), brute);
                    total += brute;
                }
                EXPECT_EQ_INT(total, p);
            }
    EXPECT_EQ_INT(attn_dcp_local_tokens(0, 0, 1, 5), -1);
    EXPECT_EQ_INT(attn_dcp_local_tokens(65, 0, 1, 5), -1);
    EXPECT_EQ_INT(attn_dcp_local_tokens(4, 4, 1, 5), -1);
    EXPECT_EQ_INT(attn_dcp_local_tokens(4, -1, 1, 5), -1);
    EXPECT_EQ_INT(attn_dcp_local_tokens(4, 1, 0, 5), -1);
    EXPECT_EQ_INT(attn_dcp_local_tokens(4, 1, 65537, 5), -1);
    EXPECT_EQ_INT(attn_dcp_local_tokens(4, 1, 1, -1), -1);
    EXPECT_EQ_INT(attn_dcp_local_tokens(2, 1, 1, (int64_t)1 << 40), (int64_t)1 << 39);
}

/* Standard layers: every world size 1..8 on random batches. */
ATTN_TEST(test_dcp_standard_matches_one_rank) {
    static const int inter[3] = {1, 16, 5};
    attn_context *ctx = cpu_ctx();
    int W, n = 0, k;
    REQUIRE(ctx != NULL);
    for (W = 1; W <= 8; W++)
        for (k = 0; k < 4; k++) {
            dcase c;
            memset(&c, 0, sizeof c);
            c.W = W; c.I = inter[(W + k) % 3];
            c.H = k == 3 ? 4 : 8; c.KVH = k == 0 ? 8 : k == 3 ? 4 : 2; c.D = k == 2 ? 128 : 64;
            c.dt = k == 1 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32;
            c.kvdt = k == 2 ? ATTN_DTYPE_FP8_E4M3 : c.dt;
            c.window = k == 3 ? 37 + W : 0;
            c.sinks = k == 1 || (k == 3 && W % 2);
            run_case(ctx, &c, (uint64_t)(100 * W + k));
            n++;
        }
    EXPECT_EQ_INT(n, 32);
    attn_context_destroy(ctx);
}

/* MLA: absorbed decodes and up-projected prefills over each rank's latent rows. */
ATTN_TEST(test_dcp_mla_matches_one_rank) {
    attn_context *ctx = cpu_ctx();
    int W;
    REQUIRE(ctx != NULL);
    for (W = 1; W <= 8; W++) {
        dcase c;
        memset(&c, 0, sizeof c);
        c.mla = 1; c.W = W; c.I = W % 2 ? 1 : 16; c.H = 4; c.R = 256;
        c.dt = ATTN_DTYPE_F32;
        c.kvdt = W == 3 || W == 6 ? ATTN_DTYPE_FP8_E4M3 : ATTN_DTYPE_F32;
        run_case(ctx, &c, (uint64_t)(7000 + W));
    }
    attn_context_destroy(ctx);
}

/* A rank that holds none of a row's keys gives out 0 and LSE -inf (never NaN), and the
   combine of all-empty rows gives the same. */
ATTN_TEST(test_dcp_empty_rank) {
    attn_context *ctx = cpu_ctx();
    attn_layer_desc ld;
    attn_layer *layer = NULL;
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    int32_t qsl[2] = {0, 1}, sl[1] = {1}, table[2] = {0, 1};
    int64_t slots[1] = {-1}, qs[3] = {1, 2, 16}, ls[2] = {1, 2}, cs[8];
    float q[32], out[32], lse[2], cache[2 * 2 * 16 * 2 * 16];
    int nd = 0, x;
    attn_batch b;
    attn_tensor tq, to, tl, tc;
    REQUIRE(ctx != NULL);
    memset(&ld, 0, sizeof ld);
    ld.num_heads = 2; ld.num_kv_heads = 2; ld.head_size = 16; ld.dtype = ATTN_DTYPE_F32; ld.block_size = 16;
    REQUIRE_OK(attn_layer_create(ctx, &ld, NULL, &layer));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 2; md.num_blocks = 2;
    md.dcp_world_size = 2; md.dcp_rank = 1; md.dcp_interleave = 1;
    REQUIRE_OK(attn_metadata_create(layer, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = sl; b.block_table = table; b.block_table_stride = 2; b.slot_mapping = slots;
    b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 1;
    REQUIRE_OK(attn_metadata_build(meta, 0, &b, 0));
    REQUIRE_OK(attn_layer_kv_cache_shape(layer, 2, cs, &nd));
    for (x = 0; x < 32; x++) { q[x] = 1.0f; out[x] = NAN; }
    for (x = 0; x < (int)(sizeof cache / sizeof cache[0]); x++) cache[x] = NAN; /* nothing may be read */
    lse[0] = lse[1] = NAN;
    tq = attn_tensor_make(q, ATTN_DTYPE_F32, 3, qs);
    to = attn_tensor_make(out, ATTN_DTYPE_F32, 3, qs);
    tl = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, ls);
    tc = attn_tensor_make(cache, ATTN_DTYPE_F32, nd, cs);
    EXPECT_OK(attn_layer_forward(layer, meta, &tq, NULL, NULL, &tc, &to, &tl, NULL));
    for (x = 0; x < 32; x++) EXPECT_TRUE(out[x] == 0.0f);
    EXPECT_TRUE(lse[0] == -INFINITY && lse[1] == -INFINITY);
    {
        const attn_tensor *po[2] = {&to, &to}, *pl[2] = {&tl, &tl};
        float o2[32], l2[2];
        attn_tensor t2 = attn_tensor_make(o2, ATTN_DTYPE_F32, 3, qs), tl2 = attn_tensor_make(l2, ATTN_DTYPE_F32, 2, ls);
        for (x = 0; x < 32; x++) o2[x] = NAN;
        EXPECT_OK(attn_dcp_combine(ctx, 2, po, pl, &t2, &tl2, NULL));
        for (x = 0; x < 32; x++) EXPECT_TRUE(o2[x] == 0.0f);
        EXPECT_TRUE(l2[0] == -INFINITY && l2[1] == -INFINITY);
    }
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

#ifndef ATTN_NO_THREADS
/* Two ranks as threads calling all_gather with different byte counts: both return the
   failure (neither hangs, nothing is copied). */
typedef struct { attn_communicator *c; size_t bytes; int rc; unsigned char send[64], recv[128]; } gjob;
static void *gather_thread(void *p) {
    gjob *j = (gjob *)p;
    memset(j->send, j->c->rank + 1, sizeof j->send);
    memset(j->recv, 0xee, sizeof j->recv);
    j->rc = j->c->all_gather(j->c, j->send, j->recv, j->bytes, NULL);
    return NULL;
}
#endif

static int msg_has(attn_context *ctx, const char *a, const char *b) {
    const char *m = attn_context_last_error(ctx);
    int ok = m && strstr(m, a) && (!b || strstr(m, b));
    if (!ok) attn_test_fail(__FILE__, __LINE__, "message '%s' lacks '%s'%s%s", m ? m : "(null)", a, b ? " / " : "", b ? b : "");
    return ok;
}

ATTN_TEST(test_dcp_named_errors) {
    attn_context *ctx = cpu_ctx();
    attn_layer_desc ld;
    attn_layer *layer = NULL, *alibi = NULL;
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    float slopes[2] = {0.5f, 0.25f};
    int32_t qsl[2] = {0, 2}, sl[1] = {40}, table[3] = {0, 1, 2};
    int64_t slots[2];
    attn_batch b;
    REQUIRE(ctx != NULL);
    memset(&ld, 0, sizeof ld);
    ld.num_heads = 2; ld.head_size = 16; ld.dtype = ATTN_DTYPE_F32;
    REQUIRE_OK(attn_layer_create(ctx, &ld, NULL, &layer));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 2; md.max_num_tokens = 8; md.max_blocks_per_req = 3; md.num_blocks = 3;
    md.dcp_world_size = 65;
    EXPECT_STATUS(attn_metadata_create(layer, &md, &meta), ATTN_ERROR_INVALID_VALUE);
    msg_has(ctx, "desc.dcp_world_size is 65", "2..64");
    EXPECT_TRUE(meta == NULL);
    md.dcp_world_size = 4; md.dcp_rank = 4;
    EXPECT_STATUS(attn_metadata_create(layer, &md, &meta), ATTN_ERROR_INVALID_VALUE);
    msg_has(ctx, "desc.dcp_rank is 4", "0..3");
    md.dcp_rank = 1; md.dcp_interleave = -2;
    EXPECT_STATUS(attn_metadata_create(layer, &md, &meta), ATTN_ERROR_INVALID_VALUE);
    msg_has(ctx, "desc.dcp_interleave is -2", "1..65536");
    md.dcp_interleave = 0; md.dcp_rank = 0; md.dcp_world_size = 0;
    md.dcp_rank = 1;
    EXPECT_STATUS(attn_metadata_create(layer, &md, &meta), ATTN_ERROR_INVALID_VALUE);
    msg_has(ctx, "desc.dcp_rank is 1", "0..0");
    ld.alibi_slopes = slopes;
    REQUIRE_OK(attn_layer_create(ctx, &ld, NULL, &alibi));
    md.dcp_world_size = 2; md.dcp_rank = 1;
    EXPECT_STATUS(attn_metadata_create(alibi, &md, &meta), ATTN_ERROR_UNSUPPORTED);
    msg_has(ctx, "ALiBi", "dcp_world_size is 2");
    attn_layer_destroy(alibi);
    /* rank 1 of 2, interleave 1: of 40 positions it holds the odd ones, 20 (2 blocks) */
    REQUIRE_OK(attn_metadata_create(layer, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = sl; b.block_table = table; b.block_table_stride = 3; b.slot_mapping = slots;
    b.num_reqs = 1; b.num_actual_tokens = 2; b.max_query_len = 2; b.max_seq_len = 40;
    slots[0] = -1;               /* position 38: rank 0's */
    slots[1] = 1 * 16 + 3;       /* position 39: local 19 = block table[1] = 1, offset 3 */
    EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
    slots[0] = 5;
    EXPECT_STATUS(attn_metadata_build(meta, 0, &b, 0), ATTN_ERROR_INVALID_METADATA);
    msg_has(ctx, "batch.slot_mapping[0] is 5", "does not hold position 38");
    slots[0] = -1; slots[1] = 2 * 16 + 3;
    EXPECT_STATUS(attn_metadata_build(meta, 0, &b, 0), ATTN_ERROR_INVALID_METADATA);
    msg_has(ctx, "batch.slot_mapping[1] is 35", "allowed: 19");
    slots[1] = 19;
    b.block_table_stride = 1;
    EXPECT_STATUS(attn_metadata_build(meta, 0, &b, 0), ATTN_ERROR_INVALID_METADATA);
    msg_has(ctx, "needing 2 blocks of 16 on this DCP rank", "block_table_stride");
    b.block_table_stride = 3;
    EXPECT_STATUS(attn_metadata_build(meta, 16, &b, 0), ATTN_ERROR_UNSUPPORTED);
    msg_has(ctx, "common_prefix_len is 16 with dcp_world_size 2", NULL);
    {   /* a DCP forward without a communicator needs the LSE its partial is joined by */
        float qv[64], ov[64], cache[3 * 2 * 16 * 2 * 16]; /* [2, 2, 16] */
        int64_t qs[3] = {2, 2, 16}, cs[8];
        int nd = 0, x;
        attn_tensor tq, to, tc;
        for (x = 0; x < 64; x++) qv[x] = ov[x] = 0.0f;
        memset(cache, 0, sizeof cache);
        slots[0] = -1; slots[1] = 19;
        EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
        EXPECT_OK(attn_layer_kv_cache_shape(layer, 3, cs, &nd));
        tq = attn_tensor_make(qv, ATTN_DTYPE_F32, 3, qs);
        to = attn_tensor_make(ov, ATTN_DTYPE_F32, 3, qs);
        tc = attn_tensor_make(cache, ATTN_DTYPE_F32, nd, cs);
        EXPECT_STATUS(attn_layer_forward(layer, meta, &tq, NULL, NULL, &tc, &to, NULL, NULL), ATTN_ERROR_NULL_ARGUMENT);
        msg_has(ctx, "lse is NULL but the metadata is DCP rank 1 of 2", NULL);
    }
    attn_metadata_destroy(meta);
#ifndef ATTN_NO_THREADS
    {   /* the in-process group agrees on a failure */
        attn_communicator *cm[2];
        pthread_t th[2];
        gjob g[2];
        int i;
        REQUIRE_OK(attn_communicator_create_local(ctx, ATTN_DEVICE_CPU, 2, cm));
        for (i = 0; i < 2; i++) {
            g[i].c = cm[i];
            g[i].bytes = i ? 32 : 64;
            pthread_create(&th[i], NULL, gather_thread, &g[i]);
        }
        for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
        EXPECT_TRUE(g[0].rc != 0 && g[0].rc == g[1].rc);
        EXPECT_TRUE(g[0].recv[0] == 0xee && g[1].recv[0] == 0xee);
        for (i = 0; i < 2; i++) { /* then a matching call works */
            g[i].bytes = 64;
            pthread_create(&th[i], NULL, gather_thread, &g[i]);
        }
        for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
        EXPECT_TRUE(g[0].rc == 0 && g[1].rc == 0);
        EXPECT_TRUE(g[0].recv[0] == 1 && g[0].recv[64] == 2 && g[1].recv[63] == 1 && g[1].recv[127] == 2);
        attn_communicator_destroy(cm[0]);
        attn_communicator_destroy(cm[1]);
    }
#endif
    /* attn_dcp_combine's own checks */
    {
        float o[2][16], l[2][2], oo[16], lo[2];
        int64_t os[3] = {1, 1, 16}, ls[2] = {1, 1}, bad[3] = {1, 1, 8};
        attn_tensor to0 = attn_tensor_make(o[0], ATTN_DTYPE_F32, 3, os), to1 = attn_tensor_make(o[1], ATTN_DTYPE_F32, 3, bad);
        attn_tensor tl0 = attn_tensor_make(l[0], ATTN_DTYPE_F32, 2, ls), tl1 = attn_tensor_make(l[1], ATTN_DTYPE_F32, 2, ls);
        attn_tensor tout = attn_tensor_make(oo, ATTN_DTYPE_F32, 3, os), tlse = attn_tensor_make(lo, ATTN_DTYPE_F32, 2, ls);
        const attn_tensor *po[2] = {&to0, &to1}, *pl[2] = {&tl0, &tl1}, *pn[2] = {&to0, NULL};
        memset(o, 0, sizeof o); memset(l, 0, sizeof l);
        EXPECT_STATUS(attn_dcp_combine(ctx, 0, po, pl, &tout, &tlse, NULL), ATTN_ERROR_INVALID_VALUE);
        msg_has(ctx, "n is 0", "1..64");
        EXPECT_STATUS(attn_dcp_combine(ctx, 2, pn, pl, &tout, &tlse, NULL), ATTN_ERROR_NULL_ARGUMENT);
        msg_has(ctx, "outs[1] is NULL", NULL);
        EXPECT_STATUS(attn_dcp_combine(ctx, 2, po, pl, &tout, &tlse, NULL), ATTN_ERROR_SHAPE_MISMATCH);
        msg_has(ctx, "outs[1]", NULL);
        EXPECT_STATUS(attn_dcp_combine(ctx, 1, po, pl, &tout, NULL, NULL), ATTN_OK); /* n 1: a copy */
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* Ranks as threads exchanging through attn_communicator_create_local: each forward
   gathers the partials itself and every rank ends with the single-rank result. */
ATTN_TEST(test_dcp_threads_local_communicator) {
    attn_context *ctx;
    int W;
#ifdef ATTN_NO_THREADS
    attn_communicator *two[2];
    ctx = cpu_ctx();
    REQUIRE(ctx != NULL);
    EXPECT_STATUS(attn_communicator_create_local(ctx, ATTN_DEVICE_CPU, 2, two), ATTN_ERROR_UNSUPPORTED);
    attn_context_destroy(ctx);
    SKIP("built with ATTN_NO_THREADS: the in-process communicator takes one rank (refusal checked)");
#endif
    ctx = cpu_ctx();
    REQUIRE(ctx != NULL);
    for (W = 1; W <= 8; W++) {
        dcase c;
        memset(&c, 0, sizeof c);
        c.threads = 1; c.W = W; c.I = W % 3 ? 16 : 1;
        c.H = 8; c.KVH = 2; c.D = 64; c.dt = W % 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32; c.kvdt = c.dt;
        c.window = W == 5 ? 50 : 0; c.sinks = W == 4;
        run_case(ctx, &c, (uint64_t)(9100 + W));
        memset(&c, 0, sizeof c);
        c.threads = 1; c.mla = 1; c.W = W; c.I = 16; c.H = 4; c.R = 256;
        c.dt = ATTN_DTYPE_F32; c.kvdt = W == 7 ? ATTN_DTYPE_FP8_E4M3 : ATTN_DTYPE_F32;
        run_case(ctx, &c, (uint64_t)(9200 + W));
    }
    attn_context_destroy(ctx);
}

/* The same on CUDA (and CUDA_SM90 where the device has it): each rank's forward on the
   GPU over a copy of the cache the CPU layer wrote, combined on the host, against the
   single-rank forward on the CPU. */
ATTN_TEST(test_dcp_cuda_matches_cpu) {
    attn_context *ctx = cpu_ctx(), *gctx = cpu_ctx();
    attn_platform pf;
    int W, k;
    REQUIRE(ctx != NULL);
    if (!gctx || attn_platform_get(gctx, &pf) != ATTN_OK ||
        pf.kind != ATTN_PLATFORM_CUDA || !pf.nvrtc_version) {
        static char why[256];
        snprintf(why, sizeof why, "no CUDA device with NVRTC: %.200s", gctx ? pf.cuda_reason : "no context");
        attn_context_destroy(gctx);
        attn_context_destroy(ctx);
        SKIP(why);
    }
    for (W = 1; W <= 8; W++)
        for (k = 0; k < 3; k++) {
            dcase c;
            attn_layer_desc gd;
            float sinks_host[8];
            void *dsinks = NULL;
            int i;
            memset(&c, 0, sizeof c);
            c.W = W; c.I = k == 1 ? 1 : 16;
            c.H = 8; c.KVH = k == 2 ? 8 : 2; c.D = k == 2 ? 64 : 128;
            c.dt = k == 0 ? ATTN_DTYPE_BF16 : k == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_F32;
            c.kvdt = k == 1 && W % 2 ? ATTN_DTYPE_FP8_E4M3 : c.dt;
            c.window = k == 2 ? 29 + W : 0;
            c.sinks = k == 0;
            memset(&gd, 0, sizeof gd);
            gd.num_heads = c.H; gd.num_kv_heads = c.KVH; gd.head_size = c.D; gd.dtype = c.dt; gd.kv_cache_dtype = c.kvdt;
            gd.block_size = 16; gd.sliding_window = c.window; gd.device = ATTN_DEVICE_CUDA; gd.causal = ATTN_CAUSAL_YES;
            if (c.kvdt == ATTN_DTYPE_FP8_E4M3) gd.k_scale.value = gd.v_scale.value = 1.0f / 32;
            if (c.sinks) { /* the run_case draws the CPU layer's sinks from the same seed: copied below */
                drng r = {(uint64_t)(500 + 10 * W + k) * 0x9E3779B97F4A7C15ull + 1};
                dbatch bb;
                random_batch(&r, &bb, 0);
                for (i = 0; i < c.H; i++) sinks_host[i] = 2.0f * d_uni(&r);
                dsinks = dev_copy(gctx, sinks_host, sizeof sinks_host);
                gd.sinks = (const float *)dsinks;
            }
            if (attn_layer_create(gctx, &gd, NULL, &c.gpu) != ATTN_OK) {
                attn_test_fail(__FILE__, __LINE__, "CUDA layer: %s", attn_context_last_error(gctx));
                attn_cuda_free(gctx, dsinks);
                continue;
            }
            run_case(ctx, &c, (uint64_t)(500 + 10 * W + k));
#ifndef ATTN_NO_THREADS
            if (k != 1) { /* ranks as threads on the one GPU, the forwards gathering through the
                             device communicator (the same batch and sinks) */
                c.threads = 1;
                c.gpu_desc = &gd;
                run_case(ctx, &c, (uint64_t)(500 + 10 * W + k));
            }
#endif
            attn_layer_destroy(c.gpu);
            attn_cuda_free(gctx, dsinks);
        }
    attn_context_destroy(gctx);
    attn_context_destroy(ctx);
}

/* MLA on the CUDA MLA backends (CUDA_MLA_SM90 on an H100/H200, and the mma.sync CUDA_MLA
   forced): every rank's absorbed decodes and up-projected prefills over its latent rows,
   combined, against the one-rank CPU_MLA result; bf16 and f16, a 16-bit or fp8 latent,
   kv_lora_rank 512 and 256; then ranks as threads on the one GPU through the device
   communicator. */
ATTN_TEST(test_dcp_cuda_mla_matches_cpu) {
    attn_context *ctx = cpu_ctx(), *gctx = cpu_ctx();
    attn_platform pf;
    int W, k;
    REQUIRE(ctx != NULL);
    memset(&pf, 0, sizeof pf);
    if (!gctx || attn_platform_get(gctx, &pf) != ATTN_OK || pf.kind != ATTN_PLATFORM_CUDA || !pf.nvrtc_version ||
        !pf.cublas_version) {
        static char why[300];
        snprintf(why, sizeof why, "no CUDA device with NVRTC and cuBLAS: %.120s %.120s", gctx ? pf.cuda_reason : "no context",
                 gctx ? pf.cublas_reason : "");
        attn_context_destroy(gctx);
        attn_context_destroy(ctx);
        SKIP(why);
    }
    for (W = 1; W <= 8; W++)
        for (k = 0; k < 2; k++) { /* k 0: the selector's backend (CUDA_MLA_SM90 on sm_90), 1: CUDA_MLA */
            dcase c;
            attn_layer_desc gd;
            attn_select_request req;
            memset(&c, 0, sizeof c);
            memset(&req, 0, sizeof req);
            req.backend = ATTN_BACKEND_CUDA_MLA;
            c.mla = 1; c.W = W; c.I = (W + k) % 2 ? 1 : 16; c.H = k ? 16 : 24; c.R = (W + k) % 3 ? 512 : 256;
            c.dt = (W + k) % 2 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
            c.kvdt = W % 4 == 3 ? ATTN_DTYPE_FP8_E4M3 : c.dt;
            memset(&gd, 0, sizeof gd);
            gd.num_heads = c.H; gd.dtype = c.dt; gd.kv_cache_dtype = c.kvdt; gd.block_size = 16;
            gd.causal = ATTN_CAUSAL_YES; gd.device = ATTN_DEVICE_CUDA;
            gd.use_mla = 1; gd.num_kv_heads = 1; gd.kv_lora_rank = c.R; gd.qk_rope_head_dim = 64;
            gd.qk_nope_head_dim = 128; gd.v_head_dim = 128; gd.head_size = c.R + 64;
            if (c.kvdt == ATTN_DTYPE_FP8_E4M3) gd.k_scale.value = gd.v_scale.value = 1.0f / 32;
            if (attn_layer_create(gctx, &gd, k ? &req : NULL, &c.gpu) != ATTN_OK) {
                attn_test_fail(__FILE__, __LINE__, "CUDA MLA layer (%s): %s", k ? "CUDA_MLA" : "selected",
                               attn_context_last_error(gctx));
                continue;
            }
            run_case(ctx, &c, (uint64_t)(900 + 10 * W + k));
#ifndef ATTN_NO_THREADS
            if (W > 1 && (W + k) % 2 == 0) { /* ranks as threads gathering through the device communicator */
                c.threads = 1;
                c.gpu_desc = &gd;
                c.gpu_req = k ? &req : NULL;
                run_case(ctx, &c, (uint64_t)(900 + 10 * W + k));
            }
#endif
            attn_layer_destroy(c.gpu);
        }
    attn_context_destroy(gctx);
    attn_context_destroy(ctx);
}

/* attn_communicator_create_nccl: a missing library is a named ATTN_ERROR_PLATFORM (CI);
   with NCCL and a GPU (ATTN_NCCL_LIBRARY, e.g. torch's copy), a one-rank ncclComm_t from
   ncclCommInitAll: size 1, rank 0, and its all_gather copies device bytes. (NCCL takes one
   rank per GPU: more ranks need the multi-GPU machines, issue 25.) */
ATTN_TEST(test_dcp_nccl_communicator) {
    attn_context *ctx = cpu_ctx();
    attn_communicator *c = NULL;
    attn_platform pf;
    const char *lib = getenv("ATTN_NCCL_LIBRARY");
    void *h, *comm = NULL, *d0 = NULL, *d1 = NULL;
    int (*init_all)(void **, int, const int *), (*destroy)(void *), dev = 0, i, ok;
    unsigned char src[256], back[256];
    REQUIRE(ctx != NULL);
#ifndef ATTN_NO_CUDA
    EXPECT_STATUS(attn_communicator_create_nccl(ctx, (void *)src, "libattn-no-such-nccl.so.2", &c), ATTN_ERROR_PLATFORM);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "NCCL not loadable: tried libattn-no-such-nccl.so.2") != NULL);
    EXPECT_TRUE(c == NULL);
    EXPECT_STATUS(attn_communicator_create_nccl(ctx, NULL, NULL, &c), ATTN_ERROR_NULL_ARGUMENT);
#endif
    h = dlopen(lib && *lib ? lib : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h || attn_platform_get(ctx, &pf) != ATTN_OK || pf.kind != ATTN_PLATFORM_CUDA) {
        if (h) dlclose(h);
        attn_context_destroy(ctx);
        SKIP("no NCCL library (set ATTN_NCCL_LIBRARY) or no CUDA device");
    }
    *(void **)(void *)&init_all = dlsym(h, "ncclCommInitAll");
    *(void **)(void *)&destroy = dlsym(h, "ncclCommDestroy");
    REQUIRE(init_all && destroy);
    REQUIRE(attn_cuda_synchronize(ctx, NULL) == ATTN_OK); /* the primary context current for NCCL */
    if (init_all(&comm, 1, &dev) != 0) {
        dlclose(h);
        attn_context_destroy(ctx);
        SKIP("ncclCommInitAll failed on this machine");
    }
    ok = attn_communicator_create_nccl(ctx, comm, lib, &c) == ATTN_OK;
    EXPECT_TRUE(ok);
    if (ok) {
        EXPECT_EQ_INT(c->size, 1);
        EXPECT_EQ_INT(c->rank, 0);
        for (i = 0; i < 256; i++) { src[i] = (unsigned char)(i * 7 + 3); back[i] = 0; }
        d0 = dev_copy(ctx, src, sizeof src);
        d1 = dev_copy(ctx, back, sizeof back);
        EXPECT_EQ_INT(c->all_gather(c, d0, d1, sizeof src, NULL), 0);
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
        EXPECT_OK(attn_cuda_memcpy(ctx, back, d1, sizeof back, ATTN_COPY_DEVICE_TO_HOST, NULL));
        EXPECT_TRUE(memcmp(src, back, sizeof src) == 0);
        attn_cuda_free(ctx, d0);
        attn_cuda_free(ctx, d1);
    }
    attn_communicator_destroy(c);
    destroy(comm);
    dlclose(h);
    attn_context_destroy(ctx);
}

void suite_dcp(void) {
    ATTN_RUN(test_dcp_local_tokens);
    ATTN_RUN(test_dcp_threads_local_communicator);
    ATTN_RUN(test_dcp_standard_matches_one_rank);
    ATTN_RUN(test_dcp_mla_matches_one_rank);
    ATTN_RUN(test_dcp_cuda_matches_cpu);
    ATTN_RUN(test_dcp_cuda_mla_matches_cpu);
    ATTN_RUN(test_dcp_nccl_communicator);
    ATTN_RUN(test_dcp_empty_rank);
    ATTN_RUN(test_dcp_named_errors);
}
