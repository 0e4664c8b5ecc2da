/* Issue 37's defects on the GPU backends (they SKIP without a CUDA device): NaN inputs
   propagate (out and LSE NaN, rows that do not see the NaN unchanged) through the paged
   decode (split along its keys) and prefill tiles (CUDA / CUDA_SM90), the MLA absorbed
   decode (split, merged), the public merge and the DCP combine; a finite sink past
   FLT_MAX / log2(e) gives LSE = the sink, not -inf or NaN; out exactly q works in place.
   Each result is compared with the CPU backend's on the same inputs. */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "cuda_fixtures.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A standard bf16 layer (8 heads over 2 KV heads, head 128), a 5-token chunk over 40
   cached tokens and a 1500-token decode, on the CPU and on the GPU (same inputs). */
#define FC_H 8
#define FC_KVH 2
#define FC_D 128
#define FC_T 6
#define FC_BLOCKS 100
#define FC_N (FC_T * FC_H * FC_D)
#define FC_CACHE ((size_t)FC_BLOCKS * 2 * 16 * FC_KVH * FC_D)

static const int32_t fc_qsl[3] = {0, 5, 6}, fc_seq[2] = {45, 1500};

typedef struct fc_world {
    attn_context *ctx;
    attn_layer *cpu, *gpu;
    attn_metadata *mc, *mg;
    uint16_t q[FC_N], out[2][FC_N]; /* out: CPU, GPU */
    float lse[2][FC_T * FC_H];
    uint16_t *cache;
    void *dsinks;
    cu_buf dq, dc, dout, dlse;
} fc_world;

/* cache index of (request r, position p, K/V v, KV head h, element x): request 0 in blocks
   0..2, request 1 in 3..96 */
static size_t fc_at(int r, int p, int v, int h, int x) {
    size_t blk = (size_t)(r == 0 ? p / 16 : 3 + p / 16);
    return (((blk * 2 + (size_t)v) * 16 + (size_t)(p % 16)) * FC_KVH + (size_t)h) * FC_D + (size_t)x;
}

static int fc_open(fc_world *w, const float *sinks) {
    attn_layer_desc d;
    attn_metadata_desc md;
    attn_batch b;
    int32_t bt[2 * 94];
    int i;
    memset(&d, 0, sizeof d);
    d.num_heads = FC_H; d.num_kv_heads = FC_KVH; d.head_size = FC_D; d.dtype = ATTN_DTYPE_BF16; d.block_size = 16;
    d.sinks = sinks; /* host floats for the CPU layer, a device copy for the GPU one */
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 2; md.max_num_tokens = FC_T; md.max_blocks_per_req = 94; md.num_blocks = FC_BLOCKS;
    EXPECT_OK(attn_layer_create(w->ctx, &d, NULL, &w->cpu));
    if (sinks && !(w->dsinks = attn_test_device_copy(w->ctx, sinks, sizeof(float) * FC_H))) return 0;
    d.sinks = (const float *)w->dsinks;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(w->ctx, &d, NULL, &w->gpu));
    if (!w->cpu || !w->gpu || attn_metadata_create(w->cpu, &md, &w->mc) != ATTN_OK ||
        attn_metadata_create(w->gpu, &md, &w->mg) != ATTN_OK)
        return 0;
    for (i = 0; i < 94; i++) { bt[i] = i < 3 ? i : 0; bt[94 + i] = 3 + i < FC_BLOCKS ? 3 + i : 0; }
    memset(&b, 0, sizeof b);
    b.query_start_loc = fc_qsl; b.seq_lens = fc_seq; b.block_table = bt; b.block_table_stride = 94;
    b.num_reqs = 2; b.num_actual_tokens = FC_T; b.max_query_len = 5; b.max_seq_len = 1500;
    EXPECT_OK(attn_metadata_build(w->mc, 0, &b, 0));
    EXPECT_OK(attn_metadata_build(w->mg, 0, &b, 0));
    return cu_buf_make(w->ctx, &w->dq, sizeof w->q) && cu_buf_make(w->ctx, &w->dc, FC_CACHE * 2) &&
           cu_buf_make(w->ctx, &w->dout, sizeof w->out[0]) && cu_buf_make(w->ctx, &w->dlse, sizeof w->lse[0]);
}

static void fc_close(fc_world *w) {
    cu_buf_free(w->ctx, &w->dq); cu_buf_free(w->ctx, &w->dc); cu_buf_free(w->ctx, &w->dout);
    cu_buf_free(w->ctx, &w->dlse);
    attn_metadata_destroy(w->mc); attn_metadata_destroy(w->mg);
    attn_layer_destroy(w->cpu); attn_layer_destroy(w->gpu);
    attn_cuda_free(w->ctx, w->dsinks);
    w->cpu = w->gpu = NULL; w->mc = w->mg = NULL; w->dsinks = NULL;
}

/* Both forwards; the GPU one into dout (or in place into q when in_place). */
static int fc_forward(fc_world *w, int in_place) {
    int64_t sc[5] = {FC_BLOCKS, 2, 16, FC_KVH, FC_D};
    attn_tensor tq = cu_tensor(w->q, ATTN_DTYPE_BF16, 3, FC_T, FC_H, FC_D, 0);
    attn_tensor to = cu_tensor(w->out[0], ATTN_DTYPE_BF16, 3, FC_T, FC_H, FC_D, 0);
    attn_tensor tl = cu_tensor(w->lse[0], ATTN_DTYPE_F32, 2, FC_T, FC_H, 1, 0);
    attn_tensor tc = attn_tensor_make(w->cache, ATTN_DTYPE_BF16, 5, sc);
    attn_tensor gq = cu_tensor(w->dq.dev, ATTN_DTYPE_BF16, 3, FC_T, FC_H, FC_D, 1);
    attn_tensor go = cu_tensor(w->dout.dev, ATTN_DTYPE_BF16, 3, FC_T, FC_H, FC_D, 1);
    attn_tensor gl = cu_tensor(w->dlse.dev, ATTN_DTYPE_F32, 2, FC_T, FC_H, 1, 1);
    attn_tensor gc = attn_tensor_make(w->dc.dev, ATTN_DTYPE_BF16, 5, sc);
    gc.device.kind = ATTN_DEVICE_CUDA;
    memcpy(w->dq.host, w->q, sizeof w->q);
    memcpy(w->dc.host, w->cache, FC_CACHE * 2);
    memset(w->dout.host, 0x7f, w->dout.bytes); /* poisoned */
    memset(w->dlse.host, 0x7f, w->dlse.bytes);
    if (!cu_up(w->ctx, &w->dq) || !cu_up(w->ctx, &w->dc) || !cu_up(w->ctx, &w->dout) || !cu_up(w->ctx, &w->dlse))
        return 0;
    EXPECT_OK(attn_layer_forward(w->cpu, w->mc, &tq, NULL, NULL, &tc, &to, &tl, NULL));
    EXPECT_OK(attn_layer_forward(w->gpu, w->mg, &gq, NULL, NULL, &gc, in_place ? &gq : &go, &gl, NULL));
    return cu_down(w->ctx, in_place ? &w->dq : &w->dout, w->out[1]) && cu_down(w->ctx, &w->dlse, w->lse[1]);
}

/* The GPU's rows against the CPU's: NaN exactly where the CPU has NaN (out and LSE), else
   within bf16 tolerance. */
static void fc_compare(const fc_world *w, const char *what, int line) {
    int i, bad = 0;
    for (i = 0; i < FC_N && bad < 3; i++) {
        const float c = attn_bf16_to_f32(w->out[0][i]), g = attn_bf16_to_f32(w->out[1][i]);
        if ((c != c) != (g != g) || (c == c && fabsf(c - g) > 2e-2f + 2e-2f * fabsf(c))) {
            attn_test_fail(__FILE__, line, "%s: %s out[%d] (token %d head %d): CPU %g, GPU %g", what,
                           attn_layer_backend(w->gpu)->name, i, i / (FC_H * FC_D), i / FC_D % FC_H, c, g);
            bad++;
        }
    }
    for (i = 0; i < FC_T * FC_H && bad < 3; i++) {
        const float c = w->lse[0][i], g = w->lse[1][i];
        if ((c != c) != (g != g) || (c == c && !(c == g || fabsf(c - g) <= 4e-3f + 1e-5f * fabsf(c)))) {
            attn_test_fail(__FILE__, line, "%s: %s lse[%d]: CPU %g, GPU %g", what, attn_layer_backend(w->gpu)->name,
                           i, c, g);
            bad++;
        }
    }
}

static int fc_nan_rows(const uint16_t *out) {
    int r, n = 0;
    for (r = 0; r < FC_T * FC_H; r++) {
        float x = attn_bf16_to_f32(out[r * FC_D]);
        n += x != x;
    }
    return n;
}

ATTN_TEST(found_cuda_nan_propagates) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    fc_world *w;
    size_t i;
    CU_SKIP_IF_NO_GPU(ctx);
    w = (fc_world *)calloc(1, sizeof *w);
    w->ctx = ctx;
    w->cache = (uint16_t *)malloc(FC_CACHE * 2);
    cu_fill(w->q, ATTN_DTYPE_BF16, FC_N, 2.0f);
    cu_fill(w->cache, ATTN_DTYPE_BF16, FC_CACHE, 2.0f);
    if (fc_open(w, NULL) && fc_forward(w, 0)) {
        fc_compare(w, "clean", __LINE__);
        /* q: token 1 head 3 (the chunk), token 5 head 0 (the split decode) */
        w->q[(1 * FC_H + 3) * FC_D + 7] = attn_f32_to_bf16(NAN);
        w->q[(5 * FC_H + 0) * FC_D] = attn_f32_to_bf16(NAN);
        if (fc_forward(w, 0)) {
            fc_compare(w, "NaN in q", __LINE__);
            EXPECT_EQ_INT(fc_nan_rows(w->out[0]), 2);
        }
        w->q[(1 * FC_H + 3) * FC_D + 7] = w->q[(5 * FC_H + 0) * FC_D] = attn_f32_to_bf16(0.25f);
        /* k: request 0 position 42, KV head 1 (tokens 2..4 of heads 4..7); request 1 position
           700 (one split's keys), KV head 0 (heads 0..3 of token 5) */
        w->cache[fc_at(0, 42, 0, 1, 3)] = attn_f32_to_bf16(NAN);
        w->cache[fc_at(1, 700, 0, 0, 9)] = attn_f32_to_bf16(NAN);
        if (fc_forward(w, 0)) {
            fc_compare(w, "NaN in k", __LINE__);
            EXPECT_EQ_INT(fc_nan_rows(w->out[0]), 3 * 4 + 4);
        }
        /* out exactly q: in place, the same rows as into memory of its own */
        w->cache[fc_at(0, 42, 0, 1, 3)] = w->cache[fc_at(1, 700, 0, 0, 9)] = attn_f32_to_bf16(0.5f);
        if (fc_forward(w, 1)) fc_compare(w, "out = q in place", __LINE__);
    }
    fc_close(w);
    /* sinks past FLT_MAX / log2 e, and hugely negative: LSE the sink / as without */
    {
        static float sinks[FC_H];
        for (i = 0; i < FC_H; i++) sinks[i] = i % 2 ? 3.0e38f : -3.0e38f;
        sinks[2] = FLT_MAX;
        if (fc_open(w, sinks) && fc_forward(w, 0)) {
            fc_compare(w, "huge sinks", __LINE__);
            for (i = 0; i < FC_T * FC_H; i++)
                if (i % FC_H % 2 || i % FC_H == 2) EXPECT_NEAR(w->lse[1][i], sinks[i % FC_H], 0, 1e-6);
        }
        fc_close(w);
    }
    free(w->cache);
    free(w);
    attn_context_destroy(ctx);
}

/* The public merge and the DCP combine on CUDA tensors: a NaN LSE makes the row NaN, +inf
   and -inf mean empty (both kernels, and the combine's fold of merges). */
ATTN_TEST(found_cuda_nan_merges) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    float oa[2 * 128], ob[2 * 128], o[2 * 128], la[2] = {NAN, 0.5f}, lb[2] = {0.25f, INFINITY}, l[2];
    cu_buf da, db, dla, dlb, dout, dl;
    int i, mode;
    CU_SKIP_IF_NO_GPU(ctx);
    for (i = 0; i < 256; i++) { oa[i] = (float)(i % 7); ob[i] = (float)(i % 5); }
    memset(&da, 0, sizeof da); memset(&db, 0, sizeof db); memset(&dla, 0, sizeof dla); memset(&dlb, 0, sizeof dlb);
    memset(&dout, 0, sizeof dout); memset(&dl, 0, sizeof dl);
    if (cu_buf_make(ctx, &da, sizeof oa) && cu_buf_make(ctx, &db, sizeof ob) && cu_buf_make(ctx, &dla, 8) &&
        cu_buf_make(ctx, &dlb, 8) && cu_buf_make(ctx, &dout, sizeof o) && cu_buf_make(ctx, &dl, 8)) {
        attn_tensor ta = cu_tensor(da.dev, ATTN_DTYPE_F32, 3, 1, 2, 128, 1), tb = cu_tensor(db.dev, ATTN_DTYPE_F32, 3, 1, 2, 128, 1);
        attn_tensor tla = cu_tensor(dla.dev, ATTN_DTYPE_F32, 2, 1, 2, 1, 1), tlb = cu_tensor(dlb.dev, ATTN_DTYPE_F32, 2, 1, 2, 1, 1);
        attn_tensor to = cu_tensor(dout.dev, ATTN_DTYPE_F32, 3, 1, 2, 128, 1), tl = cu_tensor(dl.dev, ATTN_DTYPE_F32, 2, 1, 2, 1, 1);
        const attn_tensor *po[2] = {&ta, &tb}, *pl[2] = {&tla, &tlb};
        memcpy(da.host, oa, sizeof oa); memcpy(db.host, ob, sizeof ob);
        memcpy(dla.host, la, 8); memcpy(dlb.host, lb, 8);
        if (cu_up(ctx, &da) && cu_up(ctx, &db) && cu_up(ctx, &dla) && cu_up(ctx, &dlb))
            for (mode = 0; mode < 2; mode++) {
                if (mode == 0)
                    EXPECT_OK(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &to, &tl,
                                                     ATTN_LSE_BASE_E, NULL));
                else
                    EXPECT_OK(attn_dcp_combine(ctx, 2, po, pl, &to, &tl, NULL));
                if (!cu_down(ctx, &dout, o) || !cu_down(ctx, &dl, l)) break;
                EXPECT_TRUE(o[0] != o[0] && o[127] != o[127] && l[0] != l[0]); /* head 0: a NaN side */
                EXPECT_TRUE(o[128] == oa[128] && o[255] == oa[255] && l[1] == 0.5f); /* head 1: b empty (+inf) */
            }
    }
    cu_buf_free(ctx, &da); cu_buf_free(ctx, &db); cu_buf_free(ctx, &dla); cu_buf_free(ctx, &dlb);
    cu_buf_free(ctx, &dout); cu_buf_free(ctx, &dl);
    attn_context_destroy(ctx);
}

/* The MLA absorbed decode on the GPU (16 heads, 512 + 64, bf16, a 3000-key decode split in
   8): a NaN in one head's q makes that head's latent out and LSE NaN, the other heads
   match the CPU. */
ATTN_TEST(found_cuda_mla_nan_propagates) {
    enum { H = 16, D = 576, R = 512, SEQ = 3000, NB = SEQ / 16 + 1 };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    attn_batch b;
    int32_t qsl[2] = {0, 1}, seq[1] = {SEQ}, bt[NB];
    static uint16_t q[H * D], cache[(size_t)NB * 16 * D], out[2][H * R];
    float lse[2][H];
    cu_buf dq, dc, dout, dl;
    int i, bad = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&dq, 0, sizeof dq); memset(&dc, 0, sizeof dc); memset(&dout, 0, sizeof dout); memset(&dl, 0, sizeof dl);
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.head_size = D; d.kv_lora_rank = R; d.qk_rope_head_dim = 64; d.qk_nope_head_dim = 128;
    d.v_head_dim = 128; d.dtype = ATTN_DTYPE_BF16; d.block_size = 16; d.use_mla = 1;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = NB; md.num_blocks = NB; md.num_kv_splits = 8;
    if (!cu_layer_pair(ctx, &d, &md, &cpu, &gpu, &mc, &mg)) goto done;
    for (i = 0; i < NB; i++) bt[i] = NB - 1 - i;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = NB;
    b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = SEQ;
    EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
    EXPECT_OK(attn_metadata_build(mg, 0, &b, 0));
    cu_fill(q, ATTN_DTYPE_BF16, H * D, 2.0f);
    cu_fill(cache, ATTN_DTYPE_BF16, (size_t)NB * 16 * D, 2.0f);
    q[5 * D + 300] = attn_f32_to_bf16(NAN);
    if (!cu_buf_make(ctx, &dq, sizeof q) || !cu_buf_make(ctx, &dc, sizeof cache) || !cu_buf_make(ctx, &dout, sizeof out[0]) ||
        !cu_buf_make(ctx, &dl, sizeof lse[0]))
        goto done;
    memcpy(dq.host, q, sizeof q);
    memcpy(dc.host, cache, sizeof cache);
    if (!cu_up(ctx, &dq) || !cu_up(ctx, &dc)) goto done;
    {
        int64_t sc[3] = {NB, 16, D};
        attn_tensor tq = cu_tensor(q, ATTN_DTYPE_BF16, 3, 1, H, D, 0), to = cu_tensor(out[0], ATTN_DTYPE_BF16, 3, 1, H, R, 0);
        attn_tensor tl = cu_tensor(lse[0], ATTN_DTYPE_F32, 2, 1, H, 1, 0), tc = attn_tensor_make(cache, ATTN_DTYPE_BF16, 3, sc);
        attn_tensor gq = cu_tensor(dq.dev, ATTN_DTYPE_BF16, 3, 1, H, D, 1), go = cu_tensor(dout.dev, ATTN_DTYPE_BF16, 3, 1, H, R, 1);
        attn_tensor gl = cu_tensor(dl.dev, ATTN_DTYPE_F32, 2, 1, H, 1, 1), gc = attn_tensor_make(dc.dev, ATTN_DTYPE_BF16, 3, sc);
        gc.device.kind = ATTN_DEVICE_CUDA;
        EXPECT_OK(attn_mla_forward_mqa(cpu, mc, &tq, NULL, &tc, &to, &tl, NULL));
        EXPECT_OK(attn_mla_forward_mqa(gpu, mg, &gq, NULL, &gc, &go, &gl, NULL));
        if (!cu_down(ctx, &dout, out[1]) || !cu_down(ctx, &dl, lse[1])) goto done;
    }
    for (i = 0; i < H * R && bad < 3; i++) {
        const float c = attn_bf16_to_f32(out[0][i]), g = attn_bf16_to_f32(out[1][i]);
        const int nan = i / R == 5;
        if (nan ? (c == c || g == g) : !(fabsf(c - g) <= 2e-2f + 2e-2f * fabsf(c))) {
            attn_test_fail(__FILE__, __LINE__, "%s: head %d out[%d]: CPU %g, GPU %g (%s)", attn_layer_backend(gpu)->name,
                           i / R, i % R, c, g, nan ? "NaN expected" : "the CPU's value expected");
            bad++;
        }
    }
    for (i = 0; i < H; i++) EXPECT_TRUE(i == 5 ? lse[0][i] != lse[0][i] && lse[1][i] != lse[1][i]
                                               : fabsf(lse[0][i] - lse[1][i]) <= 4e-3f);
done:
    cu_buf_free(ctx, &dq); cu_buf_free(ctx, &dc); cu_buf_free(ctx, &dout); cu_buf_free(ctx, &dl);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
}

void suite_found_cuda(void) {
    ATTN_RUN(found_cuda_nan_propagates);
    ATTN_RUN(found_cuda_nan_merges);
    ATTN_RUN(found_cuda_mla_nan_propagates);
}
