/* Regressions from the review of attn.h: capacity overflow, metadata outliving its layer,
   rejected builds keeping the previous schedule, causal-only backends, +inf LSEs, huge
   non-causal windows. Each test is the reviewer's reproducer, made to assert. */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <limits.h>
#include <math.h>
#include <string.h>

static attn_layer_desc rg_mla_desc(int block_size) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.num_heads = 2;
    d.head_size = 576;
    d.dtype = ATTN_DTYPE_F32;
    d.use_mla = 1;
    d.block_size = block_size;
    return d;
}

/* The MLA split capacity at the longest sequence a block table allows must not overflow
   (it once wrapped to 1 split and the build wrote past the task array). */
ATTN_TEST(rg_mla_split_capacity_at_int_limit) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEFAULT, 4);
    attn_layer_desc d = rg_mla_desc(128);
    attn_layer *L = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b;
    attn_mla_info info;
    int32_t qsl[2] = {0, 1}, sl[1] = {2048}, bt[16];
    int i;
    EXPECT_EQ_INT(attn_mla_num_kv_splits(INT_MAX, 4, 0), 4);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &L));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 1 << 24; md.num_blocks = 16;
    EXPECT_OK(attn_metadata_create(L, &md, &m));
    for (i = 0; i < 16; i++) bt[i] = i;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = sl; b.block_table = bt; b.block_table_stride = 16;
    b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 2048;
    if (m) {
        attn_platform pf;
        EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
        EXPECT_OK(attn_platform_get(ctx, &pf));
        EXPECT_OK(attn_metadata_mla_info(m, &info));
        /* 2048 keys: 4 splits, capped by the threads (1 under ATTN_NO_THREADS) */
        EXPECT_EQ_INT(info.num_kv_splits, pf.cpu_threads < 4 ? pf.cpu_threads : 4);
    }
    attn_metadata_destroy(m);
    attn_layer_destroy(L);
    attn_context_destroy(ctx);
}

/* Capacities whose task count does not fit are refused at create, not overrun at build. */
ATTN_TEST(rg_capacity_overflow_is_refused) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEFAULT, 1);
    attn_layer_desc d, dm = rg_mla_desc(16);
    attn_layer *L = NULL, *LM = NULL;
    attn_metadata *m = (attn_metadata *)&d;
    attn_metadata_desc md;
    memset(&d, 0, sizeof d);
    d.num_heads = 256; d.num_kv_heads = 256; d.head_size = 8; d.dtype = ATTN_DTYPE_F32;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &L));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = (1 << 24) - 1; md.max_num_tokens = 64; md.max_blocks_per_req = 1; md.num_blocks = 16;
    EXPECT_STATUS(attn_metadata_create(L, &md, &m), ATTN_ERROR_CAPACITY);
    EXPECT_TRUE(m == NULL);
    EXPECT_OK(attn_layer_create(ctx, &dm, NULL, &LM));
    md.max_num_reqs = (1 << 22) + 1; md.num_kv_splits = 1024;
    EXPECT_STATUS(attn_metadata_create(LM, &md, &m), ATTN_ERROR_CAPACITY);
    attn_layer_destroy(L);
    attn_layer_destroy(LM);
    attn_context_destroy(ctx);
}

/* Metadata keeps working after the layer that created it is destroyed; a rejected MLA
   build keeps the previous schedule; a causal-only backend refuses a non-causal batch. */
ATTN_TEST(rg_metadata_lifetime_and_rejected_builds) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEFAULT, 2);
    attn_layer_desc d = rg_mla_desc(16);
    attn_layer *L = NULL, *L2 = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b, c;
    attn_mla_info info;
    int32_t qsl[3] = {0, 1, 4}, sl[2] = {5, 3}, bt[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t qsl2[3] = {0, 3, 4}, sl2[2] = {3, 5};
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &L));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 4; md.max_num_tokens = 16; md.max_blocks_per_req = 4; md.num_blocks = 16;
    EXPECT_OK(attn_metadata_create(L, &md, &m));
    if (!m) { attn_layer_destroy(L); attn_context_destroy(ctx); return; }
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = sl; b.block_table = bt; b.block_table_stride = 4;
    b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 5;
    EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
    c = b;
    c.query_start_loc = qsl2; c.seq_lens = sl2; c.num_reqs = 2; c.num_actual_tokens = 4;
    c.max_query_len = 3; c.max_seq_len = 5;
    EXPECT_STATUS(attn_metadata_build(m, 0, &c, 0), ATTN_ERROR_INVALID_METADATA);
    EXPECT_OK(attn_metadata_mla_info(m, &info));       /* the previous build stands */
    EXPECT_EQ_INT(info.num_decodes, 1);
    EXPECT_EQ_INT(info.num_prefills, 0);
    b.causal = ATTN_CAUSAL_NO;
    EXPECT_STATUS(attn_metadata_build(m, 0, &b, 0), ATTN_ERROR_UNSUPPORTED);
    b.causal = ATTN_CAUSAL_DEFAULT;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &L2));
    attn_layer_destroy(L);                              /* the creator goes away */
    EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
    EXPECT_OK(attn_metadata_mla_info(m, &info));
    EXPECT_EQ_INT(info.num_decode_tokens, 1);
    attn_metadata_destroy(m);
    attn_layer_destroy(L2);
    attn_context_destroy(ctx);
}

/* An LSE of +inf (how some kernels mark an empty partition) merges as empty, not NaN. */
ATTN_TEST(rg_merge_plus_inf_lse_is_empty) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEFAULT, 1);
    float oa[2] = {NAN, NAN}, ob[2] = {1.0f, 2.0f}, o[2] = {0, 0};
    float la[1] = {INFINITY}, lb[1] = {0.5f}, l[1] = {0};
    int64_t s3[3] = {1, 1, 2}, s2[2] = {1, 1};
    attn_tensor ta = attn_tensor_make(oa, ATTN_DTYPE_F32, 3, s3), tb = attn_tensor_make(ob, ATTN_DTYPE_F32, 3, s3);
    attn_tensor to = attn_tensor_make(o, ATTN_DTYPE_F32, 3, s3);
    attn_tensor tla = attn_tensor_make(la, ATTN_DTYPE_F32, 2, s2), tlb = attn_tensor_make(lb, ATTN_DTYPE_F32, 2, s2);
    attn_tensor tl = attn_tensor_make(l, ATTN_DTYPE_F32, 2, s2);
    EXPECT_OK(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &to, &tl,
                                     ATTN_LSE_BASE_E, NULL));
    EXPECT_NEAR(o[0], 1.0, 0, 0);
    EXPECT_NEAR(o[1], 2.0, 0, 0);
    EXPECT_NEAR(l[0], 0.5, 1e-7, 0);
    attn_context_destroy(ctx);
}

/* A non-causal window near INT_MAX sees every key (pos + window once overflowed). */
ATTN_TEST(rg_huge_noncausal_window) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEFAULT, 1);
    attn_layer_desc d;
    attn_layer *L = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b;
    int32_t qsl[2] = {0, 4}, sl[1] = {4}, bt[1] = {0};
    float qd[32], cache[2 * 16 * 8], out[32], lse[4];
    int64_t s3[3] = {4, 1, 8}, s5[5] = {1, 2, 16, 1, 8}, s2[2] = {4, 1};
    attn_tensor tq, to, tc, tl;
    int i;
    memset(&d, 0, sizeof d);
    d.num_heads = 1; d.head_size = 8; d.dtype = ATTN_DTYPE_F32; d.causal = ATTN_CAUSAL_NO;
    d.sliding_window = INT_MAX;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &L));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 4; md.max_blocks_per_req = 1; md.num_blocks = 1;
    EXPECT_OK(attn_metadata_create(L, &md, &m));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = sl; b.block_table = bt; b.block_table_stride = 1;
    b.num_reqs = 1; b.num_actual_tokens = 4; b.max_query_len = 4; b.max_seq_len = 4;
    if (m) EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
    for (i = 0; i < 32; i++) qd[i] = 1.0f;
    for (i = 0; i < 2 * 16 * 8; i++) cache[i] = 1.0f;
    tq = attn_tensor_make(qd, ATTN_DTYPE_F32, 3, s3);
    to = attn_tensor_make(out, ATTN_DTYPE_F32, 3, s3);
    tc = attn_tensor_make(cache, ATTN_DTYPE_F32, 5, s5);
    tl = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, s2);
    if (m) EXPECT_OK(attn_layer_forward(L, m, &tq, NULL, NULL, &tc, &to, &tl, NULL));
    /* 4 keys, all logits 8/sqrt(8): lse = 8/sqrt(8) + log(4) for every row; out = 1 */
    for (i = 0; i < 4; i++) EXPECT_NEAR(lse[i], 8.0 / sqrt(8.0) + log(4.0), 1e-5, 1e-5);
    EXPECT_NEAR(out[24], 1.0, 1e-6, 0);
    attn_metadata_destroy(m);
    attn_layer_destroy(L);
    attn_context_destroy(ctx);
}

/* Views longer than the batch with default (all-zero) strides: q and out of INT64_MAX
   rows run like one row, a cache of INT64_MAX blocks is refused. Deriving the strides
   once multiplied by the outermost extent too, a signed overflow (UBSan); the fuzzer
   found it. */
ATTN_TEST(rg_huge_outer_extent_with_default_strides) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEFAULT, 1);
    attn_layer_desc d;
    attn_layer *L = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b;
    int32_t qsl[2] = {0, 1}, sl[1] = {3}, bt[1] = {0};
    float qd[16], cache[2 * 16 * 2 * 8], out[16], out_long[16];
    int64_t s3[3] = {1, 2, 8}, s5[5] = {1, 2, 16, 2, 8};
    attn_tensor tq, to, tc, tq_long, to_long, tc_long;
    int i;
    memset(&d, 0, sizeof d);
    d.num_heads = 2; d.head_size = 8; d.dtype = ATTN_DTYPE_F32;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &L));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 1; md.num_blocks = 1;
    if (L) EXPECT_OK(attn_metadata_create(L, &md, &m));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = sl; b.block_table = bt; b.block_table_stride = 1;
    b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 3;
    if (m) EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
    for (i = 0; i < 16; i++) qd[i] = (float)(i % 5) * 0.25f;
    for (i = 0; i < 2 * 16 * 2 * 8; i++) cache[i] = (float)(i % 7) * 0.125f;
    tq = attn_tensor_make(qd, ATTN_DTYPE_F32, 3, s3);
    to = attn_tensor_make(out, ATTN_DTYPE_F32, 3, s3);
    tc = attn_tensor_make(cache, ATTN_DTYPE_F32, 5, s5);
    tq_long = tq; tq_long.shape[0] = INT64_MAX;
    to_long = attn_tensor_make(out_long, ATTN_DTYPE_F32, 3, s3); to_long.shape[0] = INT64_MAX;
    tc_long = tc; tc_long.shape[0] = INT64_MAX;
    if (m) {
        EXPECT_OK(attn_layer_forward(L, m, &tq, NULL, NULL, &tc, &to, NULL, NULL));
        EXPECT_OK(attn_layer_forward(L, m, &tq_long, NULL, NULL, &tc, &to_long, NULL, NULL));
        EXPECT_TRUE(memcmp(out, out_long, sizeof out) == 0);
        EXPECT_STATUS(attn_layer_forward(L, m, &tq, NULL, NULL, &tc_long, &to, NULL, NULL),
                      ATTN_ERROR_SHAPE_MISMATCH);
    }
    attn_metadata_destroy(m);
    attn_layer_destroy(L);
    attn_context_destroy(ctx);
}

/* The record's default backend is the first of the layer's kind (CPU_MLA for MLA). */
ATTN_TEST(rg_default_backend_of_the_layer_kind) {
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEFAULT, 1);
    attn_layer_desc d = rg_mla_desc(16);
    attn_selection sel;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &sel));
    EXPECT_EQ_INT(sel.default_backend, ATTN_BACKEND_CPU_MLA);
    EXPECT_EQ_INT(sel.resolved, ATTN_BACKEND_CPU_MLA);
    d.use_mla = 0;
    d.head_size = 128;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &sel));
    EXPECT_EQ_INT(sel.default_backend, ATTN_BACKEND_CPU);
    attn_context_destroy(ctx);
}

void suite_regress(void) {
    ATTN_RUN(rg_default_backend_of_the_layer_kind);
    ATTN_RUN(rg_mla_split_capacity_at_int_limit);
    ATTN_RUN(rg_capacity_overflow_is_refused);
    ATTN_RUN(rg_metadata_lifetime_and_rejected_builds);
    ATTN_RUN(rg_merge_plus_inf_lse_is_empty);
    ATTN_RUN(rg_huge_noncausal_window);
    ATTN_RUN(rg_huge_outer_extent_with_default_strides);
}
