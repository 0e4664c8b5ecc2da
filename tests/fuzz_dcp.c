/* libFuzzer target: decode context parallelism (DCP) metadata on the CPU backends.

   Each input is decoded into a layer (standard or MLA, f32), a DCP world of 1..8 ranks with
   an interleave of 1..300 tokens, a capacity sized at the edge of what the batch needs
   (max_blocks_per_req exactly the largest rank's local blocks, sometimes one less, which
   every rank that needs them must refuse by name), a split-count choice and a batch of
   decodes, speculative rows and chunked prefills of up to 1500 tokens. Every rank builds its
   own metadata over its own blocks (slots of other ranks' tokens -1, sometimes one wrong,
   which must be refused) and runs its forward into buffers of exactly the bytes the call may
   touch; attn_dcp_combine joins the ranks' partials, which must equal the one-rank forward
   over the whole cache. Besides what ASan and UBSan catch:
     - every call returns a known status; a refused build or forward names one ERROR line;
     - a build that a capacity at the edge admits succeeds, and its forward succeeds;
     - the combined result equals the one-rank result (f32, 1e-4 relative).
   Build and run: make fuzz-dcp (FUZZ_TIME seconds); make test runs it for 20 s from a fixed
   seed. Issue 37 (1): a rank's split count was planned from the global length but sized from
   the local one, which wrote past the split rows. */
#define _POSIX_C_SOURCE 200809L
#define ATTN_IMPLEMENTATION
#include "attn.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FD_REQUIRE(cond, ...)                                                               \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "fuzz_dcp: %s:%d: property failed: %s: ", __FILE__, __LINE__, \
                    #cond);                                                                 \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fputc('\n', stderr);                                                            \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

#define FD_MAX_W 8
#define FD_MAX_REQS 6
#define FD_MAX_TOKENS 48
#define FD_MAX_SEQ 1500

typedef struct { const uint8_t *p; size_t n; } fd_in;
static unsigned fd_byte(fd_in *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}
static int fd_range(fd_in *in, int lo, int hi) { /* inclusive */
    unsigned v = fd_byte(in) | fd_byte(in) << 8;
    return lo + (int)(v % (unsigned)(hi - lo + 1));
}

static uint64_t fd_rng_state;
static float fd_uniform(void) {
    fd_rng_state ^= fd_rng_state << 13;
    fd_rng_state ^= fd_rng_state >> 7;
    fd_rng_state ^= fd_rng_state << 17;
    return (float)((int64_t)(fd_rng_state >> 40) - (1 << 23)) / (float)(1 << 23);
}

static int fd_errors;
static attn_context *fd_ctx[2];
static struct { long inputs, builds, refused, forwards, compared; } fd_stats;

static void fd_stats_print(void) {
    fprintf(stderr, "fuzz_dcp: %ld inputs, %ld rank builds, %ld refused, %ld forwards, %ld combined and compared\n",
            fd_stats.inputs, fd_stats.builds, fd_stats.refused, fd_stats.forwards, fd_stats.compared);
}

static void fd_log(void *user, attn_log_level level, attn_log_item item, const char *msg) {
    (void)user; (void)item;
    FD_REQUIRE(msg != NULL, "log line without a message");
    if (level == ATTN_LOG_LEVEL_ERROR) fd_errors++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    int i;
    (void)argc; (void)argv;
    atexit(fd_stats_print);
    setenv("ATTN_LOG_LEVEL", "none", 1);
    unsetenv("ATTN_BACKEND");
    unsetenv("ATTN_BATCH_INVARIANT");
    for (i = 0; i < 2; i++) {
        attn_context_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.log = fd_log;
        cd.log_level = ATTN_LOG_LEVEL_DEBUG;
        cd.num_threads = i ? 3 : 1;
        if (attn_context_create(&cd, &fd_ctx[i]) != ATTN_OK) abort();
    }
    return 0;
}

/* exactly n floats (ASan sees a read or write past them) */
static float *fd_floats(size_t n, int fill) {
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    size_t i;
    if (!p) abort();
    for (i = 0; i < n; i++) p[i] = fill ? fd_uniform() : NAN;
    return p;
}

typedef struct fd_case {
    attn_layer_desc d;
    int W, I, nreq, T, nd;          /* ranks, interleave, requests, tokens, MLA decodes */
    int ql[FD_MAX_REQS], sl[FD_MAX_REQS];
    int32_t qsl[FD_MAX_REQS + 1];
    int splits, threshold, short_blocks, wrong_slot;
    int maxb;                       /* max_blocks_per_req: the widest rank's blocks (or one less) */
} fd_case;

/* The blocks the widest rank of W needs for its longest request. */
static int fd_widest_blocks(const fd_case *c, int W) {
    int r, i, mb = 1;
    for (r = 0; r < W; r++)
        for (i = 0; i < c->nreq; i++)
            mb = (int)ATTN__MAX(mb, (attn_dcp_local_tokens(W, r, c->I, c->sl[i]) + c->d.block_size - 1) / c->d.block_size);
    return mb;
}

/* One rank's (or the whole world's: W = 1) forward into out/lse [T, H, dv] / [T, H].
   Returns the build's status; *fwd the forward's (ATTN_OK when not reached). */
static attn_status fd_rank(attn_context *ctx, attn_layer *layer, const fd_case *c, int W, int r,
                           const float *global_kv, const float *q, const float *wuk, const float *wuv,
                           float *out, float *lse, attn_status *fwd) {
    const attn_layer_desc *d = &c->d;
    int mla = d->use_mla, bs = d->block_size, i, p, maxb = c->maxb;
    int row = mla ? d->head_size : 2 * d->num_kv_heads * d->head_size; /* floats a slot holds (both halves) */
    int64_t nblocks = 0, local[FD_MAX_REQS];
    int32_t *bt;
    int64_t *slots;
    float *kv;
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch b;
    attn_status st;
    int errors = fd_errors;
    *fwd = ATTN_OK;
    for (i = 0; i < c->nreq; i++) local[i] = attn_dcp_local_tokens(W, r, c->I, c->sl[i]);
    bt = (int32_t *)calloc((size_t)c->nreq * (size_t)maxb + 1, sizeof *bt);
    slots = (int64_t *)malloc(sizeof(int64_t) * (size_t)c->T);
    for (i = 0; i < c->nreq; i++) {
        int k, need = (int)((local[i] + bs - 1) / bs);
        for (k = 0; k < maxb; k++) bt[i * maxb + k] = (int32_t)(k < need ? nblocks + k : 0);
        nblocks += need;
    }
    if (nblocks < 1) nblocks = 1;
    kv = fd_floats((size_t)nblocks * (size_t)bs * (size_t)row, 0);
    /* the rank's cache: its tokens at their local indices, copied from the global cache */
    for (i = 0; i < c->nreq; i++)
        for (p = 0; p < c->sl[i]; p++) {
            int64_t li = attn_dcp_local_tokens(W, r, c->I, p), blk;
            if ((p / c->I) % W != r) continue;
            blk = li / bs;
            if (blk >= maxb) continue; /* a short capacity: the build refuses */
            {
                size_t dst = ((size_t)bt[i * maxb + blk] * (size_t)bs + (size_t)(li % bs)) * (size_t)row;
                size_t src = ((size_t)i * FD_MAX_SEQ + (size_t)p) * (size_t)row;
                if (mla) memcpy(kv + dst, global_kv + src, sizeof(float) * (size_t)row);
                else { /* [block][2][bs][kvh][D]: K then V halves */
                    size_t half = (size_t)d->num_kv_heads * (size_t)d->head_size;
                    size_t kdst = ((size_t)bt[i * maxb + blk] * 2 * (size_t)bs + (size_t)(li % bs)) * half;
                    memcpy(kv + kdst, global_kv + src, sizeof(float) * half);
                    memcpy(kv + kdst + (size_t)bs * half, global_kv + src + half, sizeof(float) * half);
                }
            }
        }
    for (i = 0; i < c->nreq; i++)
        for (p = c->sl[i] - c->ql[i]; p < c->sl[i]; p++) {
            int t = c->qsl[i] + p - (c->sl[i] - c->ql[i]);
            int64_t li = attn_dcp_local_tokens(W, r, c->I, p);
            int mine = (p / c->I) % W == r;
            slots[t] = mine && li / bs < maxb ? (int64_t)bt[i * maxb + li / bs] * bs + li % bs : -1;
            if (c->wrong_slot && W > 1 && t == c->T - 1 && !mine) slots[t] = 0; /* another rank's token */
        }
    memset(&md, 0, sizeof md);
    md.max_num_reqs = c->nreq;
    md.max_num_tokens = c->T;
    md.max_blocks_per_req = maxb;
    md.num_blocks = nblocks;
    md.decode_threshold = c->threshold;
    md.num_kv_splits = c->splits;
    md.dcp_world_size = W;
    md.dcp_rank = r;
    md.dcp_interleave = c->I;
    st = attn_metadata_create(layer, &md, &meta);
    FD_REQUIRE(st == ATTN_OK, "metadata_create: %s (%s)", attn_status_string(st), attn_context_last_error(ctx));
    memset(&b, 0, sizeof b);
    b.query_start_loc = c->qsl;
    b.seq_lens = c->sl;
    b.block_table = bt;
    b.block_table_stride = maxb;
    b.slot_mapping = slots;
    b.num_reqs = c->nreq;
    b.num_actual_tokens = c->T;
    for (i = 0; i < c->nreq; i++) {
        b.max_query_len = ATTN__MAX(b.max_query_len, c->ql[i]);
        b.max_seq_len = ATTN__MAX(b.max_seq_len, c->sl[i]);
    }
    st = attn_metadata_build(meta, 0, &b, 0);
    fd_stats.builds++;
    if (st != ATTN_OK) {
        FD_REQUIRE(st == ATTN_ERROR_CAPACITY || st == ATTN_ERROR_INVALID_METADATA, "build: %s (%s)",
                   attn_status_string(st), attn_context_last_error(ctx));
        FD_REQUIRE(fd_errors == errors + 1, "a refused build logged %d ERROR lines", fd_errors - errors);
        fd_stats.refused++;
    } else {
        int H = d->num_heads, T = c->T;
        if (!mla) {
            int64_t sq[3] = {T, H, d->head_size}, sl2[2] = {T, H};
            int64_t sc[5] = {nblocks, 2, bs, d->num_kv_heads, d->head_size};
            attn_tensor tq = attn_tensor_make((void *)q, ATTN_DTYPE_F32, 3, sq);
            attn_tensor to = attn_tensor_make(out, ATTN_DTYPE_F32, 3, sq);
            attn_tensor tl = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, sl2);
            attn_tensor tc = attn_tensor_make(kv, ATTN_DTYPE_F32, 5, sc);
            *fwd = attn_layer_forward(layer, meta, &tq, NULL, NULL, &tc, &to, &tl, NULL);
        } else {
            int R = d->kv_lora_rank, P = d->qk_rope_head_dim, N = d->qk_nope_head_dim, V = d->v_head_dim;
            int td = c->qsl[c->nd], tp = T - td;
            int64_t sc[3] = {nblocks, bs, d->head_size};
            attn_tensor tc = attn_tensor_make(kv, ATTN_DTYPE_F32, 3, sc);
            /* decodes over the latent (q of width R + P; out rows of width R into out's
               first td rows at stride V: a copy below); prefills up-projected */
            if (td > 0) {
                float *ol = fd_floats((size_t)td * (size_t)H * (size_t)R, 0);
                int64_t sq[3] = {td, H, R + P}, so[3] = {td, H, R}, sl2[2] = {td, H};
                attn_tensor tq = attn_tensor_make((void *)q, ATTN_DTYPE_F32, 3, sq);
                attn_tensor to = attn_tensor_make(ol, ATTN_DTYPE_F32, 3, so);
                attn_tensor tl = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, sl2);
                *fwd = attn_mla_forward_mqa(layer, meta, &tq, NULL, &tc, &to, &tl, NULL);
                for (i = 0; i < td * H; i++) memcpy(out + (size_t)i * (size_t)V, ol + (size_t)i * (size_t)R, sizeof(float) * (size_t)V);
                free(ol);
            }
            if (tp > 0 && *fwd == ATTN_OK) {
                int64_t sq[3] = {tp, H, N + P}, so[3] = {tp, H, V}, sl2[2] = {tp, H};
                int64_t su[3] = {H, N, R}, sv[3] = {H, R, V};
                attn_tensor tq = attn_tensor_make((void *)(q + (size_t)td * (size_t)H * (size_t)(R + P)), ATTN_DTYPE_F32, 3, sq);
                attn_tensor to = attn_tensor_make(out + (size_t)td * (size_t)H * (size_t)V, ATTN_DTYPE_F32, 3, so);
                attn_tensor tl = attn_tensor_make(lse + (size_t)td * (size_t)H, ATTN_DTYPE_F32, 2, sl2);
                attn_tensor tu = attn_tensor_make((void *)wuk, ATTN_DTYPE_F32, 3, su);
                attn_tensor tv = attn_tensor_make((void *)wuv, ATTN_DTYPE_F32, 3, sv);
                *fwd = attn_mla_forward_mha(layer, meta, &tq, &tc, &tu, &tv, &to, &tl, NULL);
            }
        }
        FD_REQUIRE(*fwd == ATTN_OK, "forward after a good build: %s (%s)", attn_status_string(*fwd),
                   attn_context_last_error(ctx));
        fd_stats.forwards++;
    }
    attn_metadata_destroy(meta);
    free(kv);
    free(slots);
    free(bt);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fd_in in;
    fd_case c;
    attn_context *ctx;
    attn_layer *layer = NULL;
    attn_status st;
    uint64_t h = 1469598103934665603ull;
    unsigned flags;
    int i, r, H, dq, dv, row, refused = 0, widest;
    size_t nq, no, i2;
    float *global_kv, *q, *wuk = NULL, *wuv = NULL, *ref, *ref_lse;
    float *outs[FD_MAX_W], *lses[FD_MAX_W];
    static const int interleaves[8] = {1, 1, 2, 3, 7, 16, 64, 0};

    fd_stats.inputs++;
    for (i2 = 0; i2 < size; i2++) h = (h ^ data[i2]) * 1099511628211ull;
    fd_rng_state = h | 1;
    in.p = data;
    in.n = size;
    memset(&c, 0, sizeof c);
    flags = fd_byte(&in);
    ctx = fd_ctx[flags & 1];
    c.W = 1 + (int)(fd_byte(&in) % FD_MAX_W);
    c.I = interleaves[fd_byte(&in) % 8];
    if (!c.I) c.I = fd_range(&in, 1, 300);
    c.short_blocks = (fd_byte(&in) % 8) == 0;
    c.wrong_slot = (fd_byte(&in) % 8) == 0;
    c.splits = (flags & 4) ? fd_range(&in, 1, 8) : 0;
    c.d.dtype = ATTN_DTYPE_F32;
    c.d.block_size = 16 * (1 + (int)(fd_byte(&in) % 2));
    if (flags & 2) { /* MLA */
        c.d.use_mla = 1;
        c.d.num_heads = 1 + (int)(fd_byte(&in) % 4);
        c.d.head_size = (fd_byte(&in) & 1) ? 576 : 320;
        c.d.kv_lora_rank = c.d.head_size - 64;
        c.d.qk_rope_head_dim = 64;
        c.d.qk_nope_head_dim = 16;
        c.d.v_head_dim = 16;
        c.threshold = (flags & 8) ? 1 + (int)(fd_byte(&in) % 4) : 0;
    } else {
        static const int kvh[4] = {1, 1, 2, 4};
        c.d.num_kv_heads = kvh[fd_byte(&in) % 4];
        c.d.num_heads = c.d.num_kv_heads * (1 + (int)(fd_byte(&in) % 3));
        c.d.head_size = 16 * (1 + (int)(fd_byte(&in) % 4));
        if (fd_byte(&in) < 48) c.d.sliding_window = fd_range(&in, 1, 400);
    }
    /* requests: decodes, speculative rows, chunked prefills over context (MLA: decodes first) */
    c.nreq = 1 + (int)(fd_byte(&in) % FD_MAX_REQS);
    for (i = 0; i < c.nreq && c.T < FD_MAX_TOKENS; i++) {
        unsigned kind = fd_byte(&in) % 4;
        int ql = kind < 2 ? 1 : kind == 2 ? fd_range(&in, 2, 4) : fd_range(&in, 5, 16);
        if (ql > FD_MAX_TOKENS - c.T) ql = FD_MAX_TOKENS - c.T;
        c.ql[i] = ql;
        c.sl[i] = ql + fd_range(&in, 0, FD_MAX_SEQ - ql);
        c.T += ql;
    }
    c.nreq = i;
    if (c.d.use_mla) { /* decodes first: a stable partition by query length */
        int thr = c.threshold ? c.threshold : 1, ql2[FD_MAX_REQS], sl2[FD_MAX_REQS], n = 0, pass;
        for (pass = 0; pass < 2; pass++)
            for (i = 0; i < c.nreq; i++)
                if ((c.ql[i] <= thr) == (pass == 0)) { ql2[n] = c.ql[i]; sl2[n] = c.sl[i]; n++; }
        memcpy(c.ql, ql2, sizeof ql2);
        memcpy(c.sl, sl2, sizeof sl2);
        for (i = 0; i < c.nreq; i++) c.nd += c.ql[i] <= thr;
    }
    for (i = 0; i < c.nreq; i++) c.qsl[i + 1] = c.qsl[i] + c.ql[i];

    st = attn_layer_create(ctx, &c.d, NULL, &layer);
    FD_REQUIRE(st == ATTN_OK, "layer_create: %s (%s)", attn_status_string(st), attn_context_last_error(ctx));
    H = c.d.num_heads;
    dq = c.d.use_mla ? 0 : c.d.head_size;
    dv = c.d.use_mla ? c.d.v_head_dim : c.d.head_size;
    row = c.d.use_mla ? c.d.head_size : 2 * c.d.num_kv_heads * c.d.head_size;
    global_kv = fd_floats((size_t)c.nreq * FD_MAX_SEQ * (size_t)row, 1);
    if (c.d.use_mla) { /* decode rows of width R + P, then prefill rows of width N + P */
        int td = c.qsl[c.nd];
        nq = (size_t)td * (size_t)H * (size_t)c.d.head_size +
             (size_t)(c.T - td) * (size_t)H * (size_t)(c.d.qk_nope_head_dim + 64);
        wuk = fd_floats((size_t)H * 16 * (size_t)c.d.kv_lora_rank, 1);
        wuv = fd_floats((size_t)H * (size_t)c.d.kv_lora_rank * 16, 1);
    } else {
        nq = (size_t)c.T * (size_t)H * (size_t)dq;
    }
    q = fd_floats(nq, 1);
    no = (size_t)c.T * (size_t)H * (size_t)dv;
    ref = fd_floats(no, 0);
    ref_lse = fd_floats((size_t)c.T * (size_t)H, 0);
    {
        attn_status fwd;
        fd_case one = c;
        one.short_blocks = one.wrong_slot = 0;
        one.maxb = fd_widest_blocks(&c, 1);
        st = fd_rank(ctx, layer, &one, 1, 0, global_kv, q, wuk, wuv, ref, ref_lse, &fwd);
        FD_REQUIRE(st == ATTN_OK, "the one-rank build: %s (%s)", attn_status_string(st), attn_context_last_error(ctx));
    }
    /* every rank of the world shares one capacity: the widest rank's blocks, or one less */
    widest = fd_widest_blocks(&c, c.W);
    c.maxb = widest - (c.short_blocks && widest > 1);
    for (r = 0; r < c.W; r++) {
        attn_status fwd;
        outs[r] = fd_floats(no, 0);
        lses[r] = fd_floats((size_t)c.T * (size_t)H, 0);
        st = fd_rank(ctx, layer, &c, c.W, r, global_kv, q, wuk, wuv, outs[r], lses[r], &fwd);
        if (st != ATTN_OK) refused = 1;
    }
    /* a capacity sized for the widest rank admits every rank; one block short is refused by
       the widest rank; a slot for another rank's token is refused by the rank given it */
    if (c.maxb == widest && !(c.wrong_slot && c.W > 1))
        FD_REQUIRE(!refused, "a rank refused a batch its capacity admits (W %d, I %d)", c.W, c.I);
    else
        FD_REQUIRE(refused, "a batch past the capacity or with a wrong slot was built (W %d, I %d)", c.W, c.I);
    if (!refused && c.W > 1) {
        int64_t so[3] = {c.T, H, dv}, sl2[2] = {c.T, H};
        attn_tensor to[FD_MAX_W], tl[FD_MAX_W], tout, tlse;
        const attn_tensor *po[FD_MAX_W], *pl[FD_MAX_W];
        float *comb = fd_floats(no, 0), *comb_lse = fd_floats((size_t)c.T * (size_t)H, 0);
        for (r = 0; r < c.W; r++) {
            to[r] = attn_tensor_make(outs[r], ATTN_DTYPE_F32, 3, so);
            tl[r] = attn_tensor_make(lses[r], ATTN_DTYPE_F32, 2, sl2);
            po[r] = &to[r];
            pl[r] = &tl[r];
        }
        tout = attn_tensor_make(comb, ATTN_DTYPE_F32, 3, so);
        tlse = attn_tensor_make(comb_lse, ATTN_DTYPE_F32, 2, sl2);
        st = attn_dcp_combine(ctx, c.W, po, pl, &tout, &tlse, NULL);
        FD_REQUIRE(st == ATTN_OK, "combine: %s (%s)", attn_status_string(st), attn_context_last_error(ctx));
        for (i2 = 0; i2 < no; i2++)
            FD_REQUIRE(comb[i2] == ref[i2] || fabsf(comb[i2] - ref[i2]) <= 1e-4f + 1e-4f * fabsf(ref[i2]),
                       "out[%zu]: combined %g, one rank %g (W %d, I %d)", i2, comb[i2], ref[i2], c.W, c.I);
        for (i2 = 0; i2 < (size_t)c.T * (size_t)H; i2++)
            FD_REQUIRE(comb_lse[i2] == ref_lse[i2] || fabsf(comb_lse[i2] - ref_lse[i2]) <= 1e-4f + 1e-4f * fabsf(ref_lse[i2]),
                       "lse[%zu]: combined %g, one rank %g", i2, comb_lse[i2], ref_lse[i2]);
        fd_stats.compared++;
        free(comb);
        free(comb_lse);
    }
    for (r = 0; r < c.W; r++) { free(outs[r]); free(lses[r]); }
    free(ref); free(ref_lse); free(q); free(global_kv); free(wuk); free(wuv);
    attn_layer_destroy(layer);
    return 0;
}
