/* The CUDA backend's forward against the CPU backend on the same inputs (cu_run_case):
   random varlen batches (decodes, chunked prefills with context), dtypes, head sizes, GQA,
   causal/window/soft cap/ALiBi/sinks, LSE, split-KV; 8-bit caches (fp8 e4m3/e5m2, int8;
   per-tensor and per-token-head scales); heads past 256; cascade attention over shared
   prefixes; with ATTN_BATCH_INVARIANT=1, a request's rows alone and in a batch bitwise
   equal. The cache each writes is compared bit for bit. Every test SKIPs (with the reason)
   where the platform has no CUDA device. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "cuda_fixtures.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ATTN_TEST(cuda_forward_matches_cpu) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    static const attn_dtype dts[3] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_F32};
    static const int heads[][3] = {{32, 8, 128}, {8, 8, 64}, {16, 2, 96}, {12, 1, 80}, {8, 2, 256}};
    int n, r, fails = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    for (n = 0; n < 24 && fails < 3; n++) {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = heads[n % 5][0]; c.kv_heads = heads[n % 5][1]; c.head = heads[n % 5][2];
        c.dt = dts[n % 3];
        c.kv_dt = (n % 7 == 6) ? ATTN_DTYPE_F32 : c.dt; /* a mixed-type case now and then */
        c.block = n % 4 == 3 ? 32 : 16;
        c.causal = n % 5 != 4;
        /* now and then a batch that overrides the layer: one layer serves both */
        if (n % 4 == 1) c.batch_causal = c.causal ? ATTN_CAUSAL_NO : ATTN_CAUSAL_YES;
        c.window = n % 6 == 2 ? 100 : 0;
        c.softcap = n % 6 == 3 ? 30.0f : 0.0f;
        c.alibi = n % 6 == 5;
        c.lse = n % 2 == 0;
        c.sinks = n % 3 == 1;
        cu_random_reqs(&c, 70, 900);
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    /* prefill-heavy batches within CUDA_SM90's scope (16-bit q = cache, head 64 or 128, no
       soft cap or ALiBi), by turns automatic (CUDA_SM90's wgmma prefill on compute
       capability 9.0, CUDA elsewhere) and forced to CUDA (the mma.sync prefill): several
       128-row tiles per request, windows, non-causal, groups 1 to 16 */
    for (n = 0; n < 16 && fails < 3; n++) {
        static const int shapes[][3] = {{32, 8, 128}, {8, 8, 64}, {16, 1, 128}, {12, 4, 64}, {6, 2, 128}};
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = shapes[n % 5][0]; c.kv_heads = shapes[n % 5][1]; c.head = shapes[n % 5][2];
        c.dt = c.kv_dt = n % 3 == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        /* block sizes that give the TMA prefill each box shape: a block per box (16, 32),
           16-row boxes (48: neither divides the 128-key tile), a tile per box (256) */
        c.block = n % 8 == 3 ? 32 : n % 8 == 5 ? 48 : n % 8 == 7 ? 256 : 16;
        c.causal = n % 5 != 4;
        c.window = n % 6 == 2 ? 150 : 0;
        c.lse = n % 2 == 0;
        c.sinks = n % 4 == 1;
        c.nreq = 1 + (int)(cu_rand() % 4);
        for (r = 0; r < c.nreq; r++) {
            c.qlen[r] = r == 0 ? 1 : 1 + (int)(cu_rand() % 300);
            c.ctxlen[r] = c.causal ? (int)(cu_rand() % 700) : (int)(cu_rand() % 40);
        }
        c.backend = n % 2 ? ATTN_BACKEND_CUDA : ATTN_BACKEND_AUTO;
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    /* one long decode alone: split-KV with the partial merge */
    {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = 32; c.kv_heads = 8; c.head = 128; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
        c.causal = 1; c.lse = 1; c.nreq = 1; c.qlen[0] = 1; c.ctxlen[0] = 8000;
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
        c.sinks = 1; /* the sink joins once, in the merge */
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    /* long decodes at the largest group that splits (16 query heads per KV head: a
       16-row tile, fused merge) and past it (32: a 32-row tile, which must not split) */
    for (n = 0; n < 2; n++) {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = n ? 32 : 16; c.kv_heads = 1; c.head = 128; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
        c.causal = 1; c.lse = 1; c.nreq = 3;
        c.qlen[0] = 1; c.ctxlen[0] = 6000;
        c.qlen[1] = 1; c.ctxlen[1] = 1500;
        c.qlen[2] = 40; c.ctxlen[2] = 700;
        c.sinks = n == 0;
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    /* a batch of more (request, KV head) tiles than the device has SMs: decode tiles take
       the default shape (smaller batches above run the wide one where the layer has it) */
    {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = 32; c.kv_heads = 32; c.head = 64; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
        c.causal = 1; c.lse = 1; c.nreq = 8;
        for (r = 0; r < 8; r++) { c.qlen[r] = r == 7 ? 20 : 1; c.ctxlen[r] = 200 + 170 * r; }
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    EXPECT_EQ_INT(fails, 0);
    attn_context_destroy(ctx);
}

/* 8-bit caches on the GPU against the CPU backend (which the CPU tests hold to float64 on
   the dequantized values and to the unquantized result within the stated bound): fp8 e4m3
   and e5m2 with per-tensor scales (values and device pointers), int8 and e4m3 with
   per-token-head scales; q bf16, f16, f32; decodes, chunked prefills, long splits; head
   sizes 64-256 (multiples of 32 and of 16 only); window, soft cap, ALiBi. The cache bytes each
   writes are compared bit for bit (the quantization is the CPU's). */
ATTN_TEST(cuda_forward_8bit_matches_cpu) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    static const attn_dtype qdts[3] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_F32};
    static const attn_dtype kdts[4] = {ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2, ATTN_DTYPE_INT8, ATTN_DTYPE_FP8_E4M3};
    static const int heads[][3] = {{32, 8, 128}, {8, 8, 64}, {16, 2, 112}, {12, 1, 80}, {8, 2, 256}, {4, 4, 96}};
    int n, fails = 0, cases = 28;
    CU_SKIP_IF_NO_GPU(ctx);
    if (getenv("ATTN_TEST_8BIT_CASES")) cases = atoi(getenv("ATTN_TEST_8BIT_CASES")); /* fewer under racecheck */
    if (getenv("ATTN_TEST_8BIT_DEBUG")) { /* one request of 1, 2, 17 keys: V alone, then the scores */
        static const int ctxs[4] = {0, 1, 16, 100};
        static const attn_dtype dk[3] = {ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2, ATTN_DTYPE_INT8};
        for (n = 0; n < 12; n++) {
            cu_case c;
            memset(&c, 0, sizeof c);
            c.heads = 4; c.kv_heads = 4; c.head = 128; c.dt = ATTN_DTYPE_BF16; c.kv_dt = dk[n / 4];
            c.pth = c.kv_dt == ATTN_DTYPE_INT8;
            c.block = 16; c.causal = 1; c.nreq = 1; c.qlen[0] = 1; c.ctxlen[0] = ctxs[n % 4];
            printf("debug case kv %s ctx %d\n", attn_dtype_name(c.kv_dt), c.ctxlen[0]);
            fails += cu_run_case(ctx, &c, __LINE__) > 0;
        }
        cases = 0;
    }
    for (n = 0; n < cases && fails < 3; n++) {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = heads[n % 6][0]; c.kv_heads = heads[n % 6][1]; c.head = heads[n % 6][2];
        c.dt = qdts[n % 3];
        c.kv_dt = kdts[n % 4];
        c.pth = n % 4 >= 2;                 /* int8 and the second e4m3: per token and head */
        c.scale_ptr = n % 8 == 1 || n % 8 == 4;
        c.block = n % 5 == 3 ? 32 : 16;
        c.causal = n % 7 != 6;
        c.window = n % 9 == 2 ? 100 : 0;
        c.softcap = n % 9 == 5 ? 30.0f : 0.0f;
        c.alibi = n % 9 == 7;
        c.lse = n % 2 == 0;
        c.sinks = n % 5 == 1 || n % 5 == 4;
        cu_random_reqs(&c, 90, 1200);
        if (n % 5 == 4) { c.nreq = 1; c.qlen[0] = 1; c.ctxlen[0] = 5000 + (int)(cu_rand() % 3000); } /* splits */
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    EXPECT_EQ_INT(fails, 0);
    attn_context_destroy(ctx);
}

/* Heads past 256 on the GPU (kernels/paged_attention.cu, WIDE HEADS: two warp groups split
   O's columns) against the CPU backend: 512 (Gemma-class), 384, 288 (halves of 144, an odd
   number of 16-column pairs); bf16/f16 caches, fp8 e4m3/e5m2 per tensor, int8 and e4m3 per
   token and head; decodes, speculative steps (4 tokens), chunked prefills, non-causal,
   long decodes that split (fused and separate merges), windows, soft cap, ALiBi, sinks,
   LSE, a cascade prefix. */
ATTN_TEST(cuda_wide_heads_match_cpu) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    static const int heads[][3] = {{8, 2, 512}, {16, 1, 512}, {4, 4, 512}, {12, 4, 384}, {8, 8, 288}, {32, 8, 512}};
    static const attn_dtype kdts[6] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2,
                                       ATTN_DTYPE_INT8, ATTN_DTYPE_FP8_E4M3};
    int n, r, fails = 0, cases = 24;
    CU_SKIP_IF_NO_GPU(ctx);
    if (getenv("ATTN_TEST_WIDE_CASES")) cases = atoi(getenv("ATTN_TEST_WIDE_CASES")); /* fewer under racecheck */
    for (n = 0; n < cases && fails < 3; n++) {
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = heads[n % 6][0]; c.kv_heads = heads[n % 6][1]; c.head = heads[n % 6][2];
        c.kv_dt = kdts[(n / 2) % 6];
        c.dt = c.kv_dt == ATTN_DTYPE_F16 || n % 4 == 3 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        if (!attn_test_is_8bit(c.kv_dt)) c.kv_dt = c.dt; /* 16-bit: one type for both */
        c.pth = c.kv_dt == ATTN_DTYPE_INT8 || (n / 2) % 6 == 5;
        c.scale_ptr = n % 5 == 2;
        c.block = n % 4 == 3 ? 32 : 16;
        c.causal = n % 7 != 6;
        if (n % 5 == 1) c.batch_causal = c.causal ? ATTN_CAUSAL_NO : ATTN_CAUSAL_YES;
        c.window = n % 6 == 2 ? 150 : 0;
        c.softcap = n % 6 == 3 ? 30.0f : 0.0f;
        c.alibi = n % 6 == 5;
        c.lse = n % 2 == 0;
        c.sinks = n % 3 == 1;
        if (n % 8 == 4) { /* speculative steps: 4 tokens a request, decode tiles */
            c.nreq = 5;
            for (r = 0; r < c.nreq; r++) { c.qlen[r] = 4; c.ctxlen[r] = 100 + (int)(cu_rand() % 900); }
        } else if (n % 8 == 7) { /* one long decode: split-KV */
            c.nreq = 2; c.qlen[0] = 1; c.ctxlen[0] = 6000 + (int)(cu_rand() % 2000); c.qlen[1] = 1; c.ctxlen[1] = 300;
        } else {
            cu_random_reqs(&c, 90, 700);
        }
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    { /* a cascade: 6 decodes sharing a 40-block prefix */
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = 8; c.kv_heads = 2; c.head = 512; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
        c.causal = 1; c.lse = 1; c.sinks = 1; c.prefix = 640; c.nreq = 6;
        for (r = 0; r < c.nreq; r++) { c.qlen[r] = 1; c.ctxlen[r] = c.prefix + (int)(cu_rand() % 500); }
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    EXPECT_EQ_INT(fails, 0);
    attn_context_destroy(ctx);
}

/* Cascade attention on CUDA and CUDA_SM90: decode and speculative batches whose requests
   share their first blocks, built with common_prefix_len (a prefix pass on the prefill
   tiles, joined where the decode tiles store each row), against the CPU computing every row
   over its own keys: GQA, MQA, large groups, f16/bf16/f32, 8-bit caches, sinks, soft cap,
   LSE, prefixes of one block to thousands of keys, suffixes split or not. The build logs
   CASCADE_PLANNED (DEBUG) exactly where the prefix pass runs: not with ALiBi, a window, a
   request longer than a decode tile, or one request. */
ATTN_TEST(cuda_cascade_matches_cpu) {
    attn_test_log log;
    attn_context *ctx = attn_test_context(&log, ATTN_LOG_LEVEL_DEBUG, 2);
    int k, r, fails = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    for (k = 0; k < 16; k++) {
        cu_case c;
        int planned, want = 1;
        memset(&c, 0, sizeof c);
        c.heads = k % 4 == 1 ? 8 : k % 4 == 2 ? 32 : 16;
        c.kv_heads = k % 4 == 1 ? 1 : k % 4 == 2 ? 2 : 4;
        c.head = k % 3 == 1 ? 64 : 128;
        c.block = k % 5 == 3 ? 32 : 16;
        c.dt = c.kv_dt = k % 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
        if (k == 5) c.dt = c.kv_dt = ATTN_DTYPE_F32;
        if (k == 6) { c.dt = ATTN_DTYPE_BF16; c.kv_dt = ATTN_DTYPE_FP8_E4M3; }
        if (k == 7) { c.dt = ATTN_DTYPE_F16; c.kv_dt = ATTN_DTYPE_INT8; c.pth = 1; }
        c.causal = 1;
        c.lse = k % 2 == 0;
        c.sinks = k % 3 == 0;
        c.softcap = k == 9 ? 30.0f : 0.0f;
        c.alibi = k == 10;     /* no prefix pass: the rows' positions are their own */
        c.window = k == 11 ? 200 : 0; /* no prefix pass */
        c.prefix = c.block * (k == 12 ? 1 : k == 13 ? 300 : 8 + k % 5);
        c.nreq = k == 14 ? 1 : 3 + (int)(cu_rand() % 6);
        for (r = 0; r < c.nreq; r++) {
            c.qlen[r] = k == 15 && r == 1 ? 40 : k == 4 && r % 2 ? 2 : 1; /* 15: a prefill tile, no pass */
            c.ctxlen[r] = c.prefix + (int)(cu_rand() % (k == 8 ? 3000u : 400u));
        }
        if (c.alibi || c.window || c.nreq == 1 || k == 15) want = 0;
        if (k == 4 && c.heads / c.kv_heads > 8) want = 0; /* 2 tokens need a decode tile of 2 */
        c.backend = (k & 8) ? ATTN_BACKEND_CUDA : 0; /* the selector's (CUDA_SM90 on an H100/H200) */
        attn_test_log_reset(&log);
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
        planned = log.by_item[ATTN_LOG_CASCADE_PLANNED] > 0;
        if (planned != want) {
            attn_test_fail(__FILE__, __LINE__, "case %d: the build %s the prefix pass (expected %s)", k,
                           planned ? "planned" : "did not plan", want ? "one" : "none");
            fails++;
        }
    }
    EXPECT_EQ_INT(fails, 0);
    attn_context_destroy(ctx);
}

/* ---- ATTN_BATCH_INVARIANT: a request's rows do not depend on the rest of the batch ------- */

/* One long decode alone, then the same request first in a batch of 32 decodes (256
   (request, KV head) tiles): by default the first runs split (and, on sm_90, in the wide
   decode shape) and the second does not; with ATTN_BATCH_INVARIANT=1 both run the same
   tiles with no split, so its rows are bitwise equal. */
ATTN_TEST(cuda_batch_invariant_rows) {
    enum { H = 32, HKV = 8, D = 128, BS = 16, R = 32, MAXB = 192, NB = 512 }; /* rows share blocks: read only */
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_test_env saved;
    attn_layer_desc d;
    attn_layer *gpu = NULL;
    attn_metadata *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, kv, out;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, pass, i;
    static int32_t bt[R * MAXB];
    static uint16_t rows[2][H * D];
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out);
    CU_SKIP_IF_NO_GPU(ctx);
    saved = attn_test_env_save("ATTN_BATCH_INVARIANT");
    setenv("ATTN_BATCH_INVARIANT", "1", 1);
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = R; md.max_num_tokens = R; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!gpu || attn_metadata_create(gpu, &md, &mg) != ATTN_OK) goto done;
    attn_layer_kv_cache_shape(gpu, NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, (size_t)R * H * D * 2) || !cu_buf_make(ctx, &out, (size_t)R * H * D * 2) ||
        !cu_buf_make(ctx, &kv, (size_t)NB * 2 * BS * HKV * D * 2)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, (size_t)R * H * D, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, (size_t)NB * 2 * BS * HKV * D, 2.0f);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &kv)) goto done;
    for (i = 0; i < R * MAXB; i++) bt[i] = (int32_t)(((int64_t)i * 7919) % NB);
    for (pass = 0; pass < 2; pass++) {
        int32_t qsl[R + 1], seq[R];
        int nreq = pass ? R : 1, r;
        attn_batch b;
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, nreq, H, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, nreq, H, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        qsl[0] = 0;
        for (r = 0; r < nreq; r++) {
            qsl[r + 1] = r + 1;
            seq[r] = r == 0 ? 3000 : 300 + 50 * r; /* request 0: the one compared */
        }
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = nreq; b.num_actual_tokens = nreq; b.max_query_len = 1; b.max_seq_len = 3000;
        EXPECT_OK(attn_metadata_build(mg, 0, &b, 0));
        memset(out.host, 0xff, out.bytes);
        if (!cu_up(ctx, &out)) goto done;
        EXPECT_OK(attn_layer_forward(gpu, mg, &gq, NULL, NULL, &gc, &go, NULL, NULL));
        if (!cu_down(ctx, &out, out.host)) goto done;
        memcpy(rows[pass], out.host, sizeof rows[pass]); /* token 0 = request 0 */
    }
    for (i = 0; i < H * D; i++)
        if (rows[0][i] != rows[1][i] || rows[0][i] == 0xffff) {
            attn_test_fail(__FILE__, __LINE__, "ATTN_BATCH_INVARIANT=1: out[%d] alone 0x%04x, in a batch of %d 0x%04x",
                           i, rows[0][i], R, rows[1][i]);
            break;
        }
done:
    attn_test_env_restore(&saved);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out);
    attn_metadata_destroy(mg);
    attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
}

void suite_cuda_forward(void) {
    ATTN_RUN(cuda_cascade_matches_cpu);
    ATTN_RUN(cuda_forward_8bit_matches_cpu);
    ATTN_RUN(cuda_wide_heads_match_cpu);
    ATTN_RUN(cuda_forward_matches_cpu);
    ATTN_RUN(cuda_batch_invariant_rows);
}
