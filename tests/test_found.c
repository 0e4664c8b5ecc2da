/* Defects found from outside in 0.17.0 (issue 37): black-box tests against the public API,
   each of which failed (or crashed) before its fix. DCP metadata sized for a rank's local
   tokens, NaN inputs, batch invariance under cascade, huge sinks, aliased arguments. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

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
    int W, I, r, seq;
    if (!ctx) return;
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
                        EXPECT_EQ_INT(info.num_kv_splits, attn_mla_num_kv_splits((int)local, 2, 0));
                        EXPECT_TRUE(info.num_kv_splits <= attn_metadata_capacity(meta)->num_kv_splits);
                    }
                    attn_metadata_destroy(meta);
                    free(bt);
                }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

void suite_found(void) {
    ATTN_RUN(found_dcp_mla_splits_from_local_tokens);
}
