/* Defects found from outside in 0.17.0 (issue 37): black-box tests against the public API,
   each of which failed (or crashed) before its fix. DCP metadata sized for a rank's local
   tokens, NaN inputs, batch invariance under cascade, huge sinks, aliased arguments. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deterministic values in [-1, 1) (never all zero). */
static float fd_rand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* ---- 1. DCP metadata sized for the rank's local tokens ---------------------------------- */

/* An MLA layer (16 heads, 576 = 512 + 64, bf16) on a 2-thread context, metadata of rank 0
   of 2 sized for the rank's 350 local tokens (22 blocks of 16), one decode of 700 tokens:
   the split count was fixed at create from the rank's capacity (1) and recomputed at build
   from the global length (2), so the build wrote past the split rows (an assertion, or a
   heap overflow under NDEBUG). Every rank, world and interleave at the edge of the
   capacity must build, and the forward must equal the local-length plan. */
ATTN_TEST(found_dcp_mla_splits_from_local_tokens) {
    attn_test_log log;
    attn_context *ctx = attn_test_context(&log, ATTN_LOG_LEVEL_WARN, 2);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_platform p;
    int W, I, r, seq, threads;
    if (!ctx) return;
    EXPECT_OK(attn_platform_get(ctx, &p));
    threads = p.cpu_threads; /* 2, or 1 without threads */
    memset(&d, 0, sizeof d);
    d.num_heads = 16;
    d.head_size = 576;
    d.kv_lora_rank = 512;
    d.qk_rope_head_dim = 64;
    d.dtype = ATTN_DTYPE_BF16;
    d.block_size = 16;
    d.use_mla = 1;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (!layer) { attn_context_destroy(ctx); return; }
    for (W = 2; W <= 8; W *= 2)
        for (I = 1; I <= 64; I *= 8)
            for (r = 0; r < W; r++)
                for (seq = 700; seq <= 4100; seq += 1700) {
                    int64_t local = attn_dcp_local_tokens(W, r, I, seq);
                    int blocks = (int)((local + 15) / 16), i;
                    attn_metadata_desc md;
                    attn_metadata *meta = NULL;
                    attn_mla_info info;
                    attn_batch b;
                    int32_t qsl[2] = {0, 1}, sl[1], *bt;
                    int64_t slot = -1;
                    if (blocks < 1) blocks = 1;
                    bt = (int32_t *)malloc(sizeof(int32_t) * (size_t)blocks);
                    for (i = 0; i < blocks; i++) bt[i] = i;
                    sl[0] = seq;
                    memset(&md, 0, sizeof md);
                    md.max_num_reqs = 1;
                    md.max_num_tokens = 1;
                    md.max_blocks_per_req = blocks; /* sized for the local tokens, as documented */
                    md.num_blocks = blocks;
                    md.dcp_world_size = W;
                    md.dcp_rank = r;
                    md.dcp_interleave = I;
                    memset(&b, 0, sizeof b);
                    b.query_start_loc = qsl;
                    b.seq_lens = sl;
                    b.block_table = bt;
                    b.block_table_stride = blocks;
                    b.slot_mapping = &slot;
                    b.num_reqs = 1;
                    b.num_actual_tokens = 1;
                    b.max_query_len = 1;
                    b.max_seq_len = seq;
                    EXPECT_OK(attn_metadata_create(layer, &md, &meta));
                    if (meta) {
                        EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
                        EXPECT_OK(attn_metadata_mla_info(meta, &info));
                        /* the split count follows the rank's keys, as the capacity did */
                        EXPECT_EQ_INT(info.num_kv_splits, attn_mla_num_kv_splits((int)local, threads, 0));
                        EXPECT_TRUE(info.num_kv_splits <= attn_metadata_capacity(meta)->num_kv_splits);
                    }
                    attn_metadata_destroy(meta);
                    free(bt);
                }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* ---- 2. NaN inputs propagate; rows that see no key stay empty -------------------------- */

/* A standard f32 layer (4 heads over 2 KV heads, head 32) and a batch of a 5-token chunk
   over 40 cached tokens and a 1500-token decode (split along its keys on a 2-thread
   context): the cache holds every token, q and the cache fresh random values. */
#define FN_H 4
#define FN_KVH 2
#define FN_D 32
#define FN_T 6
#define FN_BLOCKS 100
typedef struct fn_world {
    attn_context *ctx;
    attn_layer *layer;
    attn_metadata *meta;
    float *q, *cache, *out, *lse, *sinks;
    int64_t cache_floats;
    attn_test_log log; /* the context's ERROR and WARN lines */
} fn_world;

static const int32_t fn_qsl[3] = {0, 5, 6}, fn_seq[2] = {45, 1500};

static int fn_open(fn_world *w, int sliding_window) {
    attn_layer_desc d;
    attn_metadata_desc md;
    attn_batch b;
    int32_t bt[2 * 94];
    int64_t slots[FN_T], shape[6];
    int nd = 0, i;
    uint32_t seed = 7;
    memset(w, 0, sizeof *w);
    w->ctx = attn_test_context(&w->log, ATTN_LOG_LEVEL_WARN, 2);
    if (!w->ctx) return 0;
    memset(&d, 0, sizeof d);
    d.num_heads = FN_H; d.num_kv_heads = FN_KVH; d.head_size = FN_D; d.dtype = ATTN_DTYPE_F32; d.block_size = 16;
    d.sliding_window = sliding_window;
    EXPECT_OK(attn_layer_create(w->ctx, &d, NULL, &w->layer));
    if (!w->layer) return 0;
    for (i = 0; i < 94; i++) { bt[i] = i < 3 ? i : 0; bt[94 + i] = 3 + i < FN_BLOCKS ? 3 + i : 0; }
    for (i = 0; i < 5; i++) slots[i] = 40 + i;
    slots[5] = 3 * 16 + 1499;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 2; md.max_num_tokens = FN_T; md.max_blocks_per_req = 94; md.num_blocks = FN_BLOCKS;
    EXPECT_OK(attn_metadata_create(w->layer, &md, &w->meta));
    if (!w->meta) return 0;
    memset(&b, 0, sizeof b);
    b.query_start_loc = fn_qsl; b.seq_lens = fn_seq; b.block_table = bt; b.block_table_stride = 94;
    b.slot_mapping = slots; b.num_reqs = 2; b.num_actual_tokens = FN_T; b.max_query_len = 5; b.max_seq_len = 1500;
    EXPECT_OK(attn_metadata_build(w->meta, 0, &b, 0));
    EXPECT_OK(attn_layer_kv_cache_shape(w->layer, FN_BLOCKS, shape, &nd));
    w->cache_floats = (int64_t)FN_BLOCKS * 2 * 16 * FN_KVH * FN_D;
    w->q = (float *)malloc(sizeof(float) * FN_T * FN_H * FN_D);
    w->cache = (float *)malloc(sizeof(float) * (size_t)w->cache_floats);
    w->out = (float *)malloc(sizeof(float) * FN_T * FN_H * FN_D);
    w->lse = (float *)malloc(sizeof(float) * FN_T * FN_H);
    for (i = 0; i < FN_T * FN_H * FN_D; i++) w->q[i] = fd_rand(&seed);
    for (i = 0; i < w->cache_floats; i++) w->cache[i] = fd_rand(&seed);
    return 1;
}

static void fn_close(fn_world *w) {
    attn_metadata_destroy(w->meta);
    attn_layer_destroy(w->layer);
    attn_context_destroy(w->ctx);
    free(w->q); free(w->cache); free(w->out); free(w->lse);
}

static void fn_forward(fn_world *w) {
    int64_t sq[3] = {FN_T, FN_H, FN_D}, sl[2] = {FN_T, FN_H}, sc[5] = {FN_BLOCKS, 2, 16, FN_KVH, FN_D};
    attn_tensor tq = attn_tensor_make(w->q, ATTN_DTYPE_F32, 3, sq), to = attn_tensor_make(w->out, ATTN_DTYPE_F32, 3, sq);
    attn_tensor tl = attn_tensor_make(w->lse, ATTN_DTYPE_F32, 2, sl), tc = attn_tensor_make(w->cache, ATTN_DTYPE_F32, 5, sc);
    int i;
    for (i = 0; i < FN_T * FN_H * FN_D; i++) w->out[i] = 12345.0f; /* poisoned with a value no row gives */
    for (i = 0; i < FN_T * FN_H; i++) w->lse[i] = 12345.0f;
    EXPECT_OK(attn_layer_forward(w->layer, w->meta, &tq, NULL, NULL, &tc, &to, &tl, NULL));
}

/* The cache index of (position p of request r, KV head h, element x) in K (v 0) or V (v 1). */
static int64_t fn_at(int r, int p, int v, int h, int x) {
    int64_t blk = r == 0 ? p / 16 : 3 + p / 16;
    return (((blk * 2 + v) * 16 + p % 16) * FN_KVH + h) * FN_D + x;
}

/* Row (token t, head h) is all NaN (out and LSE: nan_lse; with nan_lse 0 only out's
   element col) or equal to the clean run's. */
static void fn_expect_rows(const fn_world *w, const float *clean_out, const float *clean_lse,
                           const int nan_rows[FN_T][FN_H], int nan_lse, int col, const char *what) {
    int t, h, x, bad = 0;
    for (t = 0; t < FN_T; t++)
        for (h = 0; h < FN_H; h++) {
            const float *o = w->out + (t * FN_H + h) * FN_D, *c = clean_out + (t * FN_H + h) * FN_D;
            float l = w->lse[t * FN_H + h];
            for (x = 0; x < FN_D && !bad; x++)
                if (nan_rows[t][h] && (nan_lse || x == col) ? o[x] == o[x] : o[x] != c[x]) {
                    attn_test_fail(__FILE__, __LINE__, "%s: token %d head %d out[%d] = %g (%s)", what, t, h, x, o[x],
                                   nan_rows[t][h] ? "NaN expected" : "the clean value expected");
                    bad = 1;
                }
            if (!bad && (nan_rows[t][h] && nan_lse ? l == l : l != clean_lse[t * FN_H + h] && !nan_rows[t][h])) {
                attn_test_fail(__FILE__, __LINE__, "%s: token %d head %d lse = %g", what, t, h, l);
                bad = 1;
            }
            if (!bad && nan_rows[t][h] && !nan_lse && !(l == l && l > -INFINITY && l < INFINITY)) {
                attn_test_fail(__FILE__, __LINE__, "%s: token %d head %d lse = %g (finite expected)", what, t, h, l);
                bad = 1;
            }
        }
    EXPECT_TRUE(!bad);
}

/* A NaN in q made the row "see no key" (out 0, LSE -inf) while a NaN in k propagated: now
   every NaN that reaches a row's scores makes its out and LSE NaN, a NaN in v its out, on
   a prefill row, a decode row split along its keys, and only the rows that see the key
   (causal: earlier tokens and the other request stay clean; a window that ends before the
   key too). NaN scales and sinks are refused by name. */
ATTN_TEST(found_nan_propagates_cpu) {
    fn_world w;
    float clean_out[FN_T * FN_H * FN_D], clean_lse[FN_T * FN_H], keep;
    int rows[FN_T][FN_H], t, h;
    int64_t at;
    if (!fn_open(&w, 0)) { fn_close(&w); return; }
    fn_forward(&w);
    memcpy(clean_out, w.out, sizeof clean_out);
    memcpy(clean_lse, w.lse, sizeof clean_lse);
    for (t = 0; t < FN_T * FN_H; t++) EXPECT_TRUE(clean_lse[t] > -INFINITY && clean_lse[t] < INFINITY);
    /* q: token 1 head 3 (prefill), token 5 head 0 (the split decode) */
    memset(rows, 0, sizeof rows);
    w.q[(1 * FN_H + 3) * FN_D + 7] = NAN;
    w.q[(5 * FN_H + 0) * FN_D + 0] = NAN;
    rows[1][3] = rows[5][0] = 1;
    fn_forward(&w);
    fn_expect_rows(&w, clean_out, clean_lse, (const int (*)[FN_H])rows, 1, -1, "NaN in q");
    w.q[(1 * FN_H + 3) * FN_D + 7] = 0.5f;
    w.q[(5 * FN_H + 0) * FN_D + 0] = 0.5f;
    fn_forward(&w);
    memcpy(clean_out, w.out, sizeof clean_out);
    memcpy(clean_lse, w.lse, sizeof clean_lse);
    /* k: request 0 position 42, KV head 1: tokens 2..4 (positions 42..44) of heads 2, 3 */
    memset(rows, 0, sizeof rows);
    at = fn_at(0, 42, 0, 1, 3);
    keep = w.cache[at];
    w.cache[at] = NAN;
    for (t = 2; t < 5; t++) rows[t][2] = rows[t][3] = 1;
    fn_forward(&w);
    fn_expect_rows(&w, clean_out, clean_lse, (const int (*)[FN_H])rows, 1, -1, "NaN in k");
    w.cache[at] = keep;
    /* k of the decode at position 700 (one split's keys), KV head 0: heads 0, 1 of token 5 */
    memset(rows, 0, sizeof rows);
    at = fn_at(1, 700, 0, 0, 0);
    keep = w.cache[at];
    w.cache[at] = NAN;
    rows[5][0] = rows[5][1] = 1;
    fn_forward(&w);
    fn_expect_rows(&w, clean_out, clean_lse, (const int (*)[FN_H])rows, 1, -1, "NaN in a split's k");
    w.cache[at] = keep;
    /* v of position 40 (every token of the chunk sees it): out NaN, LSE as clean. (A NaN v
       of a key a row does not see can still reach it as 0 x NaN in a tile's P.V, as in
       SDPA's matrix product.) */
    memset(rows, 0, sizeof rows);
    at = fn_at(0, 40, 1, 0, 5);
    keep = w.cache[at];
    w.cache[at] = NAN;
    for (t = 0; t < 5; t++) rows[t][0] = rows[t][1] = 1;
    fn_forward(&w);
    fn_expect_rows(&w, clean_out, clean_lse, (const int (*)[FN_H])rows, 0, 5, "NaN in v");
    for (t = 0; t < 5; t++)
        for (h = 0; h < 2; h++) EXPECT_TRUE(w.lse[t * FN_H + h] == clean_lse[t * FN_H + h]);
    w.cache[at] = keep;
    fn_close(&w);
    /* a window of 2: position 42's key is seen by positions 42, 43 only */
    if (!fn_open(&w, 2)) { fn_close(&w); return; }
    fn_forward(&w);
    memcpy(clean_out, w.out, sizeof clean_out);
    memcpy(clean_lse, w.lse, sizeof clean_lse);
    memset(rows, 0, sizeof rows);
    w.cache[fn_at(0, 42, 0, 1, 3)] = NAN;
    rows[2][2] = rows[2][3] = rows[3][2] = rows[3][3] = 1;
    fn_forward(&w);
    fn_expect_rows(&w, clean_out, clean_lse, (const int (*)[FN_H])rows, 1, -1, "NaN in k outside a window");
    fn_close(&w);
}

/* The merges: a NaN LSE makes the row NaN (+inf and -inf still mean an empty side). */
ATTN_TEST(found_nan_merges) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_WARN, 1);
    float oa[4] = {1, 2, 3, 4}, ob[4] = {5, 6, 7, 8}, o[4], la[2] = {NAN, 0.5f}, lb[2] = {0.25f, INFINITY}, l[2];
    int64_t s3[3] = {1, 2, 2}, s2[2] = {1, 2};
    attn_tensor ta = attn_tensor_make(oa, ATTN_DTYPE_F32, 3, s3), tb = attn_tensor_make(ob, ATTN_DTYPE_F32, 3, s3);
    attn_tensor to = attn_tensor_make(o, ATTN_DTYPE_F32, 3, s3);
    attn_tensor tla = attn_tensor_make(la, ATTN_DTYPE_F32, 2, s2), tlb = attn_tensor_make(lb, ATTN_DTYPE_F32, 2, s2);
    attn_tensor tl = attn_tensor_make(l, ATTN_DTYPE_F32, 2, s2);
    const attn_tensor *po[2] = {&ta, &tb}, *pl[2] = {&tla, &tlb};
    if (!ctx) return;
    EXPECT_OK(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &to, &tl,
                                     ATTN_LSE_BASE_E, NULL));
    EXPECT_TRUE(o[0] != o[0] && o[1] != o[1] && l[0] != l[0]);   /* head 0: a NaN side */
    EXPECT_TRUE(o[2] == 3.0f && o[3] == 4.0f && l[1] == 0.5f);    /* head 1: b empty (+inf) */
    memset(o, 0, sizeof o);
    EXPECT_OK(attn_dcp_combine(ctx, 2, po, pl, &to, &tl, NULL));
    EXPECT_TRUE(o[0] != o[0] && o[1] != o[1] && l[0] != l[0]);
    EXPECT_TRUE(o[2] == 3.0f && o[3] == 4.0f && l[1] == 0.5f);
    attn_context_destroy(ctx);
}

/* ---- 2 (MLA). NaN through CPU_MLA's absorbed decode (split), up-projected prefill, sparse --- */

#define FM_H 4
#define FM_R 512
#define FM_HS 576
#define FM_N 16
#define FM_V 16
#define FM_BLOCKS 97 /* 94 for the decode, 3 for the prefill */

ATTN_TEST(found_nan_propagates_cpu_mla) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_WARN, 2);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch b;
    attn_mla_info info;
    int32_t qsl[3] = {0, 1, 5}, seq[2] = {1500, 40}, bt[2 * 94], idx[5 * 8];
    int64_t slots[5] = {93 * 16 + 11, 94 * 16 + 36, 94 * 16 + 37, 94 * 16 + 38, 94 * 16 + 39};
    float *cache = NULL, *q = NULL, *qp = NULL, *wuk = NULL, *wuv = NULL, *ol = NULL, *om = NULL, *lse = NULL;
    float *clean = NULL, clean_lse[5 * FM_H];
    uint32_t seed = 11;
    int i, pass, h, x;
    size_t ncache = (size_t)FM_BLOCKS * 16 * FM_HS;
    if (!ctx) return;
    memset(&d, 0, sizeof d);
    d.num_heads = FM_H; d.head_size = FM_HS; d.kv_lora_rank = FM_R; d.qk_rope_head_dim = 64;
    d.qk_nope_head_dim = FM_N; d.v_head_dim = FM_V; d.dtype = ATTN_DTYPE_F32; d.block_size = 16; d.use_mla = 1;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 2; md.max_num_tokens = 5; md.max_blocks_per_req = 94; md.num_blocks = FM_BLOCKS;
    md.num_kv_splits = 2; /* the decode split in two on every build (no-threads too) */
    if (layer) EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    for (i = 0; i < 94; i++) { bt[i] = i; bt[94 + i] = i < 3 ? 94 + i : 0; }
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 94; b.slot_mapping = slots;
    b.num_reqs = 2; b.num_actual_tokens = 5; b.max_query_len = 4; b.max_seq_len = 1500;
    if (meta) EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
    if (!meta || attn_metadata_mla_info(meta, &info) != ATTN_OK) goto done;
    EXPECT_TRUE(info.num_decodes == 1 && info.num_kv_splits == 2); /* the decode is split */
    cache = (float *)malloc(sizeof(float) * ncache);
    q = (float *)malloc(sizeof(float) * 5 * FM_H * FM_HS);
    qp = (float *)malloc(sizeof(float) * 4 * FM_H * (FM_N + 64));
    wuk = (float *)malloc(sizeof(float) * FM_H * FM_N * FM_R);
    wuv = (float *)malloc(sizeof(float) * FM_H * FM_R * FM_V);
    ol = (float *)malloc(sizeof(float) * 5 * FM_H * FM_R);
    om = (float *)malloc(sizeof(float) * 4 * FM_H * FM_V);
    lse = (float *)malloc(sizeof(float) * 5 * FM_H);
    clean = (float *)malloc(sizeof(float) * 5 * FM_H * FM_R);
    for (i = 0; i < (int)ncache; i++) cache[i] = fd_rand(&seed);
    for (i = 0; i < 5 * FM_H * FM_HS; i++) q[i] = fd_rand(&seed);
    for (i = 0; i < 4 * FM_H * (FM_N + 64); i++) qp[i] = fd_rand(&seed);
    for (i = 0; i < FM_H * FM_N * FM_R; i++) wuk[i] = fd_rand(&seed) * 0.1f;
    for (i = 0; i < FM_H * FM_R * FM_V; i++) wuv[i] = fd_rand(&seed) * 0.1f;
    for (i = 0; i < 5; i++) {
        int k;
        for (k = 0; k < 8; k++) idx[i * 8 + k] = i == 0 ? 100 * k + 3 : k * 5 + i; /* request-local positions */
    }
    for (pass = 0; pass < 2; pass++) { /* clean, then NaN in q of head 2 (decode), token 1 head 0 (prefill) */
        int64_t sc[3] = {FM_BLOCKS, 16, FM_HS}, sq[3] = {1, FM_H, FM_HS}, so[3] = {1, FM_H, FM_R}, sl[2] = {1, FM_H};
        int64_t sq2[3] = {4, FM_H, FM_N + 64}, so2[3] = {4, FM_H, FM_V}, sl2[2] = {4, FM_H};
        int64_t su[3] = {FM_H, FM_N, FM_R}, sv[3] = {FM_H, FM_R, FM_V}, sqs[3] = {5, FM_H, FM_HS}, sos[3] = {5, FM_H, FM_R};
        int64_t sls[2] = {5, FM_H}, si[2] = {5, 8};
        attn_tensor tc = attn_tensor_make(cache, ATTN_DTYPE_F32, 3, sc);
        attn_tensor tq = attn_tensor_make(q, ATTN_DTYPE_F32, 3, sq), to = attn_tensor_make(ol, ATTN_DTYPE_F32, 3, so);
        attn_tensor tl = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, sl);
        attn_tensor tq2 = attn_tensor_make(qp, ATTN_DTYPE_F32, 3, sq2), to2 = attn_tensor_make(om, ATTN_DTYPE_F32, 3, so2);
        attn_tensor tl2 = attn_tensor_make(lse + FM_H, ATTN_DTYPE_F32, 2, sl2);
        attn_tensor tu = attn_tensor_make(wuk, ATTN_DTYPE_F32, 3, su), tv = attn_tensor_make(wuv, ATTN_DTYPE_F32, 3, sv);
        attn_tensor tqs = attn_tensor_make(q, ATTN_DTYPE_F32, 3, sqs), tos = attn_tensor_make(ol, ATTN_DTYPE_F32, 3, sos);
        attn_tensor tls = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, sls), ti = attn_tensor_make(idx, ATTN_DTYPE_INT32, 2, si);
        if (pass) { q[2 * FM_HS + 100] = NAN; qp[(1 * FM_H + 0) * (FM_N + 64) + 3] = NAN; }
        EXPECT_OK(attn_mla_forward_mqa(layer, meta, &tq, NULL, &tc, &to, &tl, NULL));
        EXPECT_OK(attn_mla_forward_mha(layer, meta, &tq2, &tc, &tu, &tv, &to2, &tl2, NULL));
        for (h = 0; h < FM_H; h++) { /* decode */
            int nan = pass && h == 2;
            for (x = 0; x < FM_R; x++)
                if (nan ? ol[h * FM_R + x] == ol[h * FM_R + x] : pass && ol[h * FM_R + x] != clean[h * FM_R + x]) {
                    attn_test_fail(__FILE__, __LINE__, "decode head %d out[%d] = %g", h, x, ol[h * FM_R + x]);
                    break;
                }
            EXPECT_TRUE(nan ? lse[h] != lse[h] : lse[h] == lse[h] && (!pass || lse[h] == clean_lse[h]));
        }
        for (i = 0; i < 4 * FM_H; i++) { /* prefill: token 1 of request 1 sees nothing that is NaN but its q */
            int nan = pass && i == 1 * FM_H + 0;
            for (x = 0; x < FM_V; x++)
                if (nan ? om[i * FM_V + x] == om[i * FM_V + x] : pass && om[i * FM_V + x] != clean[FM_H * FM_R + i * FM_V + x]) {
                    attn_test_fail(__FILE__, __LINE__, "prefill row %d out[%d] = %g", i, x, om[i * FM_V + x]);
                    break;
                }
            EXPECT_TRUE(nan ? lse[FM_H + i] != lse[FM_H + i]
                            : lse[FM_H + i] == lse[FM_H + i] && (!pass || lse[FM_H + i] == clean_lse[FM_H + i]));
        }
        if (!pass) {
            memcpy(clean, ol, sizeof(float) * FM_H * FM_R);
            memcpy(clean + FM_H * FM_R, om, sizeof(float) * 4 * FM_H * FM_V);
            memcpy(clean_lse, lse, sizeof(float) * 5 * FM_H);
        }
        /* sparse: every token over its 8 indices, q as the decode's for token 0 */
        EXPECT_OK(attn_mla_forward_sparse(layer, meta, &tqs, NULL, &tc, &ti, &tos, &tls, NULL));
        for (i = 0; i < 5 * FM_H; i++) {
            int nan = pass && i == 2;
            EXPECT_TRUE(nan ? lse[i] != lse[i] && ol[i * FM_R] != ol[i * FM_R]
                            : lse[i] == lse[i] && lse[i] > -INFINITY && ol[i * FM_R] == ol[i * FM_R]);
        }
    }
done:
    free(cache); free(q); free(qp); free(wuk); free(wuv); free(ol); free(om); free(lse); free(clean);
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* ---- 3. ATTN_BATCH_INVARIANT holds when the batch shares a prefix ----------------------- */

/* NULL when this context has a CUDA device with NVRTC, else why not. */
static const char *fb_no_gpu(attn_context *ctx) {
    static attn_platform p;
    if (attn_platform_get(ctx, &p) != ATTN_OK) return "no platform";
    if (p.kind != ATTN_PLATFORM_CUDA) return p.cuda_reason;
    if (!p.nvrtc_version) return p.nvrtc_reason;
    return NULL;
}

/* Request 0's decode row (token 0), built alone, then in a batch of 8 decodes whose first
   4 blocks (64 tokens) are the same blocks, with common_prefix_len 64: under
   ATTN_BATCH_INVARIANT the two rows must be the same bits (the CPU ran the batch's prefix
   as a cascade pass joined by LSE: 471 of 512 elements differed). Standard (CPU, CUDA) and
   MLA (CPU_MLA, CUDA MLA) layers, on the device given. Returns 0 when it could not run. */
static int fb_invariant_rows(attn_context *ctx, attn_device_kind dev, int mla) {
    enum { R = 8, NB = 64, MAXB = 20 };
    const int H = 8, HKV = mla ? 1 : 2, D = mla ? 576 : 64, DO = mla ? 512 : 64;
    const attn_dtype dt = dev == ATTN_DEVICE_CUDA ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32;
    const size_t esz = attn_dtype_size(dt);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    int32_t bt[R * MAXB], qsl[R + 1], seq[R];
    int64_t shape[ATTN_MAX_DIMS], sq[3] = {R, H, D}, so[3] = {R, H, DO};
    size_t ncache, i;
    int nd = 0, pass, r, ok = 0;
    void *hq = NULL, *hc = NULL, *ho = NULL, *q = NULL, *c = NULL, *o = NULL;
    unsigned char *rows[2] = {NULL, NULL};
    uint32_t seed = 5;
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = dt; d.block_size = 16; d.device = dev;
    if (mla) { d.use_mla = 1; d.kv_lora_rank = 512; d.qk_rope_head_dim = 64; d.qk_nope_head_dim = 64; d.v_head_dim = 64; }
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = R; md.max_num_tokens = R; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!layer || attn_metadata_create(layer, &md, &meta) != ATTN_OK) goto done;
    EXPECT_OK(attn_layer_kv_cache_shape(layer, NB, shape, &nd));
    for (ncache = 1, i = 0; i < (size_t)nd; i++) ncache *= (size_t)shape[i];
    hq = malloc((size_t)R * H * D * esz);
    hc = malloc(ncache * esz);
    ho = malloc((size_t)R * H * DO * esz);
    rows[0] = (unsigned char *)malloc((size_t)H * DO * esz);
    rows[1] = (unsigned char *)malloc((size_t)H * DO * esz);
    for (i = 0; i < (size_t)R * H * D; i++) attn_test_put(hq, dt, i, fd_rand(&seed));
    for (i = 0; i < ncache; i++) attn_test_put(hc, dt, i, fd_rand(&seed));
    if (dev == ATTN_DEVICE_CUDA) {
        q = attn_test_device_copy(ctx, hq, (size_t)R * H * D * esz);
        c = attn_test_device_copy(ctx, hc, ncache * esz);
        o = attn_test_device_copy(ctx, NULL, (size_t)R * H * DO * esz);
        if (!q || !c || !o) goto done;
    } else {
        q = hq; c = hc; o = ho;
    }
    for (r = 0; r < R; r++) { /* blocks 0..3 shared, then 2 of the request's own */
        int k;
        for (k = 0; k < MAXB; k++) bt[r * MAXB + k] = k < 4 ? k : k < 6 ? 4 + 2 * r + (k - 4) : 0;
    }
    for (pass = 0; pass < 2; pass++) {
        int n = pass ? R : 1;
        attn_batch b;
        attn_tensor tq = attn_tensor_make(q, dt, 3, sq), to = attn_tensor_make(o, dt, 3, so);
        attn_tensor tc = attn_tensor_make(c, dt, nd, shape);
        tq.shape[0] = to.shape[0] = n;
        tq.device.kind = to.device.kind = tc.device.kind = dev;
        qsl[0] = 0;
        for (r = 0; r < n; r++) { qsl[r + 1] = r + 1; seq[r] = 64 + 20 + 3 * r; }
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = n; b.num_actual_tokens = n; b.max_query_len = 1; b.max_seq_len = seq[n - 1];
        EXPECT_OK(attn_metadata_build(meta, pass ? 64 : 0, &b, 0));
        if (mla) EXPECT_OK(attn_mla_forward_mqa(layer, meta, &tq, NULL, &tc, &to, NULL, NULL));
        else EXPECT_OK(attn_layer_forward(layer, meta, &tq, NULL, NULL, &tc, &to, NULL, NULL));
        if (dev == ATTN_DEVICE_CUDA) {
            if (attn_cuda_memcpy(ctx, rows[pass], o, (size_t)H * DO * esz, ATTN_COPY_DEVICE_TO_HOST, NULL) != ATTN_OK) goto done;
        } else {
            memcpy(rows[pass], o, (size_t)H * DO * esz);
        }
    }
    ok = 1;
    if (memcmp(rows[0], rows[1], (size_t)H * DO * esz) != 0)
        attn_test_fail(__FILE__, __LINE__, "ATTN_BATCH_INVARIANT=1 (%s, %s): request 0's row alone differs from the "
                       "same row in a batch sharing a 64-token prefix", attn_layer_backend(layer)->name,
                       mla ? "MLA" : "standard");
done:
    if (dev == ATTN_DEVICE_CUDA) { attn_cuda_free(ctx, q); attn_cuda_free(ctx, c); attn_cuda_free(ctx, o); }
    free(hq); free(hc); free(ho); free(rows[0]); free(rows[1]);
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    return ok;
}

static void fb_invariant(attn_device_kind dev) {
    attn_test_env saved = attn_test_env_save("ATTN_BATCH_INVARIANT");
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_WARN, 2);
    const char *why = ctx && dev == ATTN_DEVICE_CUDA ? fb_no_gpu(ctx) : NULL;
    if (ctx && !why) {
        setenv("ATTN_BATCH_INVARIANT", "1", 1);
        EXPECT_TRUE(fb_invariant_rows(ctx, dev, 0));
        EXPECT_TRUE(fb_invariant_rows(ctx, dev, 1));
    }
    attn_context_destroy(ctx);
    attn_test_env_restore(&saved);
    if (why) SKIP(why);
}
ATTN_TEST(found_batch_invariant_under_cascade_cpu) { fb_invariant(ATTN_DEVICE_CPU); }
ATTN_TEST(found_batch_invariant_under_cascade_cuda) { fb_invariant(ATTN_DEVICE_CUDA); }

/* ---- 4. a finite sink past FLT_MAX / log2(e) ------------------------------------------- */

/* The base-2 LSE overflowed: LSE -inf. Now a huge sink takes the whole denominator (LSE =
   the sink, out ~0), a hugely negative one nothing (out and LSE as without sinks). */
ATTN_TEST(found_huge_sinks) {
    fn_world w;
    float plain_out[FN_T * FN_H * FN_D], plain_lse[FN_T * FN_H], sinks[FN_H];
    attn_layer_desc d;
    attn_layer *sl = NULL;
    int i, k;
    if (!fn_open(&w, 0)) { fn_close(&w); return; }
    fn_forward(&w);
    memcpy(plain_out, w.out, sizeof plain_out);
    memcpy(plain_lse, w.lse, sizeof plain_lse);
    for (k = 0; k < 2; k++) {
        d = *attn_layer_get_desc(w.layer);
        for (i = 0; i < FN_H; i++) sinks[i] = k == 0 ? 3.0e38f : -3.0e38f;
        sinks[1] = k == 0 ? FLT_MAX : -FLT_MAX;
        d.sinks = sinks;
        EXPECT_OK(attn_layer_create(w.ctx, &d, NULL, &sl));
        if (!sl) break;
        attn_layer_destroy(w.layer);
        w.layer = sl;
        fn_forward(&w);
        for (i = 0; i < FN_T * FN_H; i++) {
            if (k == 0) EXPECT_NEAR(w.lse[i], sinks[i % FN_H], 0, 1e-6);
            else EXPECT_NEAR(w.lse[i], plain_lse[i], 1e-6, 1e-6);
        }
        for (i = 0; i < FN_T * FN_H * FN_D; i++) {
            if (k == 0) EXPECT_NEAR(w.out[i], 0.0, 1e-30, 0);
            else EXPECT_NEAR(w.out[i], plain_out[i], 1e-6, 1e-5);
        }
    }
    fn_close(&w);
}

/* ---- 5. aliased arguments ---------------------------------------------------------------- */

/* The call failed with SHAPE_MISMATCH and the layout item, naming both tensors. */
static void fa_refused(fn_world *w, attn_status st, const char *a, const char *b, int line) {
    const char *m = attn_context_last_error(w->ctx);
    if (st != ATTN_ERROR_SHAPE_MISMATCH || !attn_test_log_has(&w->log, ATTN_LOG_TENSOR_LAYOUT, ATTN_LOG_LEVEL_ERROR) ||
        !(m && strstr(m, a) && strstr(m, " overlaps ") && strstr(m, b)))
        attn_test_fail(__FILE__, line, "%s over %s: %s, '%s' (expected SHAPE_MISMATCH naming both)", a, b,
                       attn_status_string(st), m ? m : "(null)");
    attn_test_log_reset(&w->log);
}
#define FA_REFUSED(w, call, a, b) fa_refused((w), (call), (a), (b), __LINE__)

/* An out partly over q or the cache, an lse over out, a cache write's cache over its key,
   an MLA out_latent over q, a merge's out partly over an input and a DCP combine's out on
   a later rank's input were accepted (and gave wrong results). Each is refused by name and
   changes nothing; what works in place stays allowed and gives the same bits: out exactly
   q (the standard forward), a merge's out exactly out_a / out_b and lse exactly lse_a /
   lse_b, a combine's out exactly outs[0] and lse exactly lses[0]. */
ATTN_TEST(found_aliasing_refused) {
    enum { N = FN_T * FN_H * FN_D };
    fn_world w;
    int64_t sq[3] = {FN_T, FN_H, FN_D}, sl[2] = {FN_T, FN_H}, sc[5] = {FN_BLOCKS, 2, 16, FN_KVH, FN_D};
    int64_t skv[3] = {FN_T, FN_KVH, FN_D}, slots[FN_T] = {0, 1, 2, 3, 4, 5};
    static float big[3 * N], ref[N], ref_lse[FN_T * FN_H], lse2[FN_T * FN_H];
    attn_tensor tq, to, tl, tc, tk;
    int i;
    if (!fn_open(&w, 0)) { fn_close(&w); return; }
    fn_forward(&w);
    memcpy(ref, w.out, sizeof ref);
    memcpy(ref_lse, w.lse, sizeof ref_lse);
    tc = attn_tensor_make(w.cache, ATTN_DTYPE_F32, 5, sc);
    tl = attn_tensor_make(lse2, ATTN_DTYPE_F32, 2, sl);
    /* out exactly q: in place, the same bits as into memory of its own */
    memcpy(big, w.q, sizeof ref);
    tq = attn_tensor_make(big, ATTN_DTYPE_F32, 3, sq);
    EXPECT_OK(attn_layer_forward(w.layer, w.meta, &tq, NULL, NULL, &tc, &tq, &tl, NULL));
    EXPECT_TRUE(memcmp(big, ref, sizeof ref) == 0 && memcmp(lse2, ref_lse, sizeof lse2) == 0);
    /* out half a row past q: refused, q and the rest unchanged */
    memcpy(big, w.q, sizeof ref);
    for (i = N; i < 3 * N; i++) big[i] = 7.0f;
    to = attn_tensor_make(big + FN_D / 2, ATTN_DTYPE_F32, 3, sq);
    FA_REFUSED(&w, attn_layer_forward(w.layer, w.meta, &tq, NULL, NULL, &tc, &to, &tl, NULL), "out", "q");
    EXPECT_TRUE(memcmp(big, w.q, sizeof ref) == 0 && big[N + 5] == 7.0f);
    /* out on the cache; lse on out; lse on q */
    to = attn_tensor_make(w.cache + 100, ATTN_DTYPE_F32, 3, sq);
    FA_REFUSED(&w, attn_layer_forward(w.layer, w.meta, &tq, NULL, NULL, &tc, &to, &tl, NULL), "out", "kv_cache");
    to = attn_tensor_make(big + N, ATTN_DTYPE_F32, 3, sq);
    {
        attn_tensor lo = attn_tensor_make(big + N + 8, ATTN_DTYPE_F32, 2, sl);
        FA_REFUSED(&w, attn_layer_forward(w.layer, w.meta, &tq, NULL, NULL, &tc, &to, &lo, NULL), "out", "lse");
        lo = attn_tensor_make(big + 8, ATTN_DTYPE_F32, 2, sl);
        FA_REFUSED(&w, attn_layer_forward(w.layer, w.meta, &tq, NULL, NULL, &tc, &to, &lo, NULL), "lse", "q");
    }
    EXPECT_TRUE(big[N + 5] == 7.0f);
    /* a cache write whose key lies in the cache */
    tk = attn_tensor_make(w.cache + 64, ATTN_DTYPE_F32, 3, skv);
    FA_REFUSED(&w, attn_reshape_and_cache(w.layer, &tk, &tk, &tc, ATTN_TEST_SLOTS(slots, FN_T), NULL), "kv_cache", "key");
    /* the merge: out partly over out_a refused; out exactly out_b and lse exactly lse_a allowed */
    {
        int64_t m3[3] = {2, 2, 4}, m2[2] = {2, 2};
        float oa[16], ob[16], la[4] = {0.1f, 0.2f, 0.3f, 0.4f}, lb[4] = {0.4f, 0.3f, 0.2f, 0.1f}, want[16], wl[4];
        attn_tensor ta = attn_tensor_make(oa, ATTN_DTYPE_F32, 3, m3), tb = attn_tensor_make(ob, ATTN_DTYPE_F32, 3, m3);
        attn_tensor tla = attn_tensor_make(la, ATTN_DTYPE_F32, 2, m2), tlb = attn_tensor_make(lb, ATTN_DTYPE_F32, 2, m2);
        attn_tensor tw = attn_tensor_make(want, ATTN_DTYPE_F32, 3, m3), twl = attn_tensor_make(wl, ATTN_DTYPE_F32, 2, m2);
        attn_tensor part = attn_tensor_make(oa + 2, ATTN_DTYPE_F32, 3, m3);
        const attn_tensor *po[2] = {&ta, &tb}, *pl[2] = {&tla, &tlb};
        for (i = 0; i < 16; i++) { oa[i] = (float)i; ob[i] = (float)(16 - i); }
        EXPECT_OK(attn_merge_attn_states(w.ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &tw, &twl,
                                         ATTN_LSE_BASE_E, NULL));
        FA_REFUSED(&w, attn_merge_attn_states(w.ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &part,
                                              &twl, ATTN_LSE_BASE_E, NULL), "out", "out_a");
        {
            attn_tensor on_out = attn_tensor_make(want + 4, ATTN_DTYPE_F32, 2, m2);
            FA_REFUSED(&w, attn_merge_attn_states(w.ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &tw,
                                                  &on_out, ATTN_LSE_BASE_E, NULL), "out", "lse");
        }
        /* out == outs[1] for the combine: refused (a later rank's input); outs[0]: allowed */
        FA_REFUSED(&w, attn_dcp_combine(w.ctx, 2, po, pl, &tb, &twl, NULL), "out", "outs[1]");
        FA_REFUSED(&w, attn_dcp_combine(w.ctx, 2, po, pl, &tw, &tlb, NULL), "lse", "lses[1]");
        EXPECT_OK(attn_merge_attn_states(w.ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &tb, &tla,
                                         ATTN_LSE_BASE_E, NULL));
        EXPECT_TRUE(memcmp(ob, want, sizeof want) == 0 && memcmp(la, wl, sizeof wl) == 0);
        for (i = 0; i < 16; i++) { oa[i] = (float)i; ob[i] = (float)(16 - i); }
        la[0] = 0.1f; la[1] = 0.2f; la[2] = 0.3f; la[3] = 0.4f;
        EXPECT_OK(attn_dcp_combine(w.ctx, 2, po, pl, &ta, &tla, NULL));
        for (i = 0; i < 16; i++) EXPECT_NEAR(oa[i], want[i], 1e-6, 1e-6);
        for (i = 0; i < 4; i++) EXPECT_NEAR(la[i], wl[i], 1e-6, 1e-6);
    }
    fn_close(&w);
}

/* MLA: out_latent over q, lse over out_latent, forward_mha's out over w_uv. */
ATTN_TEST(found_aliasing_refused_mla) {
    fn_world w; /* its context and log */
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata_desc md;
    attn_metadata *meta = NULL;
    attn_batch b;
    int32_t qsl[3] = {0, 1, 3}, seq[2] = {20, 2}, bt[4] = {0, 1, 2, 0};
    static float buf[1 << 16], cache[3 * 16 * 320];
    int64_t sq[3] = {1, 2, 320}, so[3] = {1, 2, 256}, sl[2] = {1, 2}, sc[3] = {3, 16, 320};
    int64_t sq2[3] = {2, 2, 80}, so2[3] = {2, 2, 16}, su[3] = {2, 16, 256}, sv[3] = {2, 256, 16};
    attn_tensor tq, to, tl, tc, tu, tv;
    memset(&w, 0, sizeof w);
    w.ctx = attn_test_context(&w.log, ATTN_LOG_LEVEL_WARN, 1);
    if (!w.ctx) return;
    memset(&d, 0, sizeof d);
    d.num_heads = 2; d.head_size = 320; d.kv_lora_rank = 256; d.qk_rope_head_dim = 64; d.qk_nope_head_dim = 16;
    d.v_head_dim = 16; d.dtype = ATTN_DTYPE_F32; d.block_size = 16; d.use_mla = 1;
    EXPECT_OK(attn_layer_create(w.ctx, &d, NULL, &layer));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 2; md.max_num_tokens = 3; md.max_blocks_per_req = 2; md.num_blocks = 3;
    if (layer) EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 2;
    b.num_reqs = 2; b.num_actual_tokens = 3; b.max_query_len = 2; b.max_seq_len = 20;
    if (meta) EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
    if (meta) {
        tc = attn_tensor_make(cache, ATTN_DTYPE_F32, 3, sc);
        tq = attn_tensor_make(buf, ATTN_DTYPE_F32, 3, sq);
        to = attn_tensor_make(buf + 64, ATTN_DTYPE_F32, 3, so);
        tl = attn_tensor_make(buf + 4096, ATTN_DTYPE_F32, 2, sl);
        FA_REFUSED(&w, attn_mla_forward_mqa(layer, meta, &tq, NULL, &tc, &to, &tl, NULL), "out_latent", "q");
        to = attn_tensor_make(buf + 1024, ATTN_DTYPE_F32, 3, so);
        tl = attn_tensor_make(buf + 1030, ATTN_DTYPE_F32, 2, sl);
        FA_REFUSED(&w, attn_mla_forward_mqa(layer, meta, &tq, NULL, &tc, &to, &tl, NULL), "out_latent", "lse");
        tq = attn_tensor_make(buf, ATTN_DTYPE_F32, 3, sq2);
        tu = attn_tensor_make(buf + 8192, ATTN_DTYPE_F32, 3, su);
        tv = attn_tensor_make(buf + 16384, ATTN_DTYPE_F32, 3, sv);
        to = attn_tensor_make(buf + 16384 + 100, ATTN_DTYPE_F32, 3, so2);
        FA_REFUSED(&w, attn_mla_forward_mha(layer, meta, &tq, &tc, &tu, &tv, &to, NULL, NULL), "out", "w_uv");
    }
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(w.ctx);
}

/* ---- 13. what the header says -------------------------------------------------------- */

/* A local DCP group on CUDA without a GPU reported its error under attn_cuda_synchronize:
   it names attn_communicator_create_local and what is allowed, and creates nothing. */
ATTN_TEST(found_local_communicator_without_gpu_named) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 1);
    attn_communicator *comms[2] = {NULL, NULL};
    attn_platform p;
    const char *m;
    if (!ctx) return;
    EXPECT_OK(attn_platform_get(ctx, &p));
    if (p.kind == ATTN_PLATFORM_CUDA) { attn_context_destroy(ctx); SKIP("this host has a CUDA device"); }
    EXPECT_STATUS(attn_communicator_create_local(ctx, ATTN_DEVICE_CUDA, 1, comms), ATTN_ERROR_PLATFORM); /* 1: no-threads builds too */
    m = attn_context_last_error(ctx);
    EXPECT_TRUE(strncmp(m, "attn_communicator_create_local:", 31) == 0 && strstr(m, "allowed here: ATTN_DEVICE_CPU"));
    EXPECT_TRUE(comms[0] == NULL && comms[1] == NULL);
    attn_context_destroy(ctx);
}

/* ---- 7. the worker threads leave the caller's own threads their cores -------------------- */

#ifndef ATTN_NO_THREADS
#include <pthread.h>
#include <time.h>

static int fp_stop; /* both through __atomic builtins: the spinning thread and the test's */
static double fp_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static long fp_count;
static void *fp_spin(void *arg) { /* a compute-bound neighbour (a PyTorch op between attention calls) */
    volatile double x = 1.0;
    (void)arg;
    while (!__atomic_load_n(&fp_stop, __ATOMIC_RELAXED)) {
        int i;
        for (i = 0; i < 2000; i++) x = x * 1.0000001 + 1e-9;
        __atomic_fetch_add(&fp_count, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* A compute-bound thread beside a sequence of small forwards (8 decodes of 100 keys, a few
   microseconds each) keeps >= 90 % of the rate it has beside a caller that computes on its
   own: the forwards must not wake the pool's workers (each wake took the neighbour's core;
   transformers on attn.h ran 30 tok/s against sdpa's 325 on a 2-core machine). Windows of
   the two kinds alternate; the median ratio of 9 counts. */
ATTN_TEST(found_small_forwards_leave_neighbour_cores) {
    fn_world w;
    attn_layer_desc d;
    attn_metadata_desc md;
    attn_batch b;
    attn_platform p;
    pthread_t th;
    int32_t qsl[9], seq[8], bt[8 * 7];
    int64_t sq[3] = {8, 4, 64}, sc[5] = {56, 2, 16, 2, 64};
    float *q, *o, *c;
    double ratio[9];
    int i, k, cores;
    memset(&w, 0, sizeof w);
    w.ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_WARN, 0);
    if (!w.ctx) return;
    EXPECT_OK(attn_platform_get(w.ctx, &p));
    cores = p.cpu_threads;
    if (cores < 2) { attn_context_destroy(w.ctx); SKIP("one worker thread: nothing to wake"); }
    memset(&d, 0, sizeof d);
    d.num_heads = 4; d.num_kv_heads = 2; d.head_size = 64; d.dtype = ATTN_DTYPE_F32; d.block_size = 16;
    EXPECT_OK(attn_layer_create(w.ctx, &d, NULL, &w.layer));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 8; md.max_num_tokens = 8; md.max_blocks_per_req = 7; md.num_blocks = 56;
    if (w.layer) EXPECT_OK(attn_metadata_create(w.layer, &md, &w.meta));
    if (!w.meta) { fn_close(&w); return; }
    for (i = 0; i <= 8; i++) qsl[i] = i;
    for (i = 0; i < 8; i++) seq[i] = 100;
    for (i = 0; i < 8 * 7; i++) bt[i] = i;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 7;
    b.num_reqs = 8; b.num_actual_tokens = 8; b.max_query_len = 1; b.max_seq_len = 100;
    EXPECT_OK(attn_metadata_build(w.meta, 0, &b, 0));
    q = (float *)calloc(8 * 4 * 64, sizeof(float));
    o = (float *)calloc(8 * 4 * 64, sizeof(float));
    c = (float *)calloc(56 * 2 * 16 * 2 * 64, sizeof(float));
    {
        uint32_t seed = 3;
        for (i = 0; i < 8 * 4 * 64; i++) q[i] = fd_rand(&seed);
        for (i = 0; i < 56 * 2 * 16 * 2 * 64; i++) c[i] = fd_rand(&seed);
    }
    __atomic_store_n(&fp_stop, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&fp_count, 0, __ATOMIC_RELAXED);
    if (pthread_create(&th, NULL, fp_spin, NULL) != 0) { free(q); free(o); free(c); fn_close(&w); SKIP("no thread"); }
    for (k = 0; k < 9; k++) {
        double rate[2];
        int phase;
        for (phase = 0; phase < 2; phase++) { /* 0: the caller computes alone; 1: it runs forwards */
            attn_tensor tq = attn_tensor_make(q, ATTN_DTYPE_F32, 3, sq), to = attn_tensor_make(o, ATTN_DTYPE_F32, 3, sq);
            attn_tensor tc = attn_tensor_make(c, ATTN_DTYPE_F32, 5, sc);
            volatile double x = 1.0;
            double t0 = fp_now(), t1;
            long n0 = __atomic_load_n(&fp_count, __ATOMIC_RELAXED);
            while ((t1 = fp_now()) - t0 < 0.05) {
                if (phase) EXPECT_OK(attn_layer_forward(w.layer, w.meta, &tq, NULL, NULL, &tc, &to, NULL, NULL));
                else for (i = 0; i < 2000; i++) x = x * 1.0000001 + 1e-9;
            }
            rate[phase] = (double)(__atomic_load_n(&fp_count, __ATOMIC_RELAXED) - n0) / (t1 - t0);
        }
        ratio[k] = rate[1] / rate[0];
    }
    __atomic_store_n(&fp_stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    for (i = 0; i < 9; i++) /* sort: the median */
        for (k = i + 1; k < 9; k++)
            if (ratio[k] < ratio[i]) { double t = ratio[i]; ratio[i] = ratio[k]; ratio[k] = t; }
    if (!(ratio[4] >= 0.9))
        attn_test_fail(__FILE__, __LINE__, "a compute-bound thread beside small forwards kept %.0f%% of its rate "
                       "(median of 9; allowed: >= 90%%)", 100.0 * ratio[4]);
    free(q); free(o); free(c);
    fn_close(&w);
}
#endif

void suite_found(void) {
    ATTN_RUN(found_dcp_mla_splits_from_local_tokens);
    ATTN_RUN(found_nan_propagates_cpu);
    ATTN_RUN(found_nan_merges);
    ATTN_RUN(found_nan_propagates_cpu_mla);
    ATTN_RUN(found_huge_sinks);
    ATTN_RUN(found_batch_invariant_under_cascade_cpu);
    ATTN_RUN(found_batch_invariant_under_cascade_cuda);
    ATTN_RUN(found_aliasing_refused);
    ATTN_RUN(found_aliasing_refused_mla);
    ATTN_RUN(found_local_communicator_without_gpu_named);
#ifndef ATTN_NO_THREADS
    ATTN_RUN(found_small_forwards_leave_neighbour_cores);
#endif
}
