/* mla_common.cuh - what the MLA kernels share beyond their parameters (attn__mla_decode_params
   and attn__mla_prefill_params, defined once in attn_params.cuh for the kernels and the
   host): the query-chunk and key-row addressing and the LSE merge of a prefill chunk's row
   into the rows of the chunks before it. Included by the four MLA kernels (the decode's
   split merge: mla_merge.cuh). */
#ifndef ATTN_MLA_COMMON_CUH
#define ATTN_MLA_COMMON_CUH
#include "attn_common.cuh"
#include "attn_params.cuh" /* attn__mla_decode_params, attn__mla_prefill_params */
#include "online_softmax.cuh"

/* The 16-byte chunk `col` (elements 8 col .. 8 col + 7) of the query row (row, head) held
   as two 16-bit tensors: columns [0, split) in a (q_latent, or q_nope), the rest in b
   (q_pe). Strides in elements. */
ATTN_DEV const char *attn_mla_q_chunk(const void *a, attn_i64 a_token, attn_i64 a_head, const void *b, attn_i64 b_token,
                                      attn_i64 b_head, int split, int row, int head, int col) {
    return col * 8 < split ? (const char *)a + ((attn_i64)row * a_token + (attn_i64)head * a_head + col * 8) * 2
                           : (const char *)b + ((attn_i64)row * b_token + (attn_i64)head * b_head + (col * 8 - split)) * 2;
}

/* Byte offset of key j's latent row (row_bytes) in the paged cache of one request (its
   block_table row bt), or -1 outside [key0, key1). */
ATTN_DEV attn_i64 attn_mla_key_offset(const int *bt, int j, int key0, int key1, int block_size, int row_bytes) {
    return j >= key0 && j < key1
               ? ((attn_i64)bt[(unsigned)j / (unsigned)block_size] * block_size + (attn_i64)((unsigned)j % (unsigned)block_size)) * row_bytes
               : (attn_i64)-1;
}

#define ATTN_MHA_CAUSAL 1
#define ATTN_MHA_MERGE 2

/* The causal end of query position pos: the keys [0, end) it sees, pos + 1; under DCP the
   rank's local count of positions [0, pos + 1), keys being the rank's local indices. */
ATTN_DEV int attn_mha_causal_end(const attn__mla_prefill_params &p, int pos) {
    return attn_dcp_positions(p.dcp_world_size, p.dcp_rank, p.dcp_interleave, (attn_i64)pos + 1);
}

/* MERGE of one row: the earlier chunks' lse (base e, lse_old; -inf: none) and this chunk's
   (base 2, *lse2; -inf: no key). On return *wn is the weight of this chunk's normalised
   output (it comes in as 1 / L), *wo that of the old out, and *lse2 the merged LSE (base 2);
   a side with LSE -inf weighs 0. */
ATTN_DEV void attn_mha_merge_weights(float lse_old, float *lse2, float *wn, float *wo) {
    const float lo = lse_old * ATTN_LOG2E, mx = fmaxf(lo, *lse2);
    if (mx == attn_neg_inf()) return;
    const float a = attn_merge_weight(lo, mx), b = attn_merge_weight(*lse2, mx);
    const float inv = attn_rcp(a + b);
    *wo = a * inv;
    *wn *= b * inv;
    *lse2 = mx + attn_log2(a + b);
}

#endif /* ATTN_MLA_COMMON_CUH */
