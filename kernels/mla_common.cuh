/* mla_common.cuh - what the MLA kernels share: the parameter structs the host passes by
   value (attn.h mirrors them as attn__mla_decode_params and attn__mla_prefill_params) and
   the LSE merge of a prefill chunk's row into the rows of the chunks before it. Included by
   the four MLA kernels (the decode's split merge: mla_merge.cuh). */
#ifndef ATTN_MLA_COMMON_CUH
#define ATTN_MLA_COMMON_CUH
#include "attn_common.cuh"

/* The decode kernels' (attn_mla_decode, attn_mla_merge): the work list and partials are
   described at the top of mla_decode_sm90.cu. */
struct attn_mla_params {
    const void *q;                 /* [.., num_heads, >= KV_LORA] q_latent */
    const void *q_pe;              /* [.., num_heads, ROPE] */
    const void *kv_cache;          /* [num_blocks, BLOCK_SIZE, KV_LORA + ROPE] */
    void *out;                     /* [.., num_heads, KV_LORA] */
    float *lse;                    /* [.., num_heads] or NULL */
    const int *block_table;        /* [reqs][block_table_stride] */
    const int *work, *num_work;
    const int *merge, *num_merge;
    float *partial_o;              /* [slots][ROWS][KV_LORA] */
    float *partial_lse;            /* [slots][ROWS] (base 2) */
    attn_i64 q_stride_token, q_stride_head, q_pe_stride_token, q_pe_stride_head;
    attn_i64 out_stride_token, out_stride_head, lse_stride_token, lse_stride_head;
    attn_i64 block_table_stride;
    int num_heads;
    float scale;
    int *merge_count;              /* FUSED_MERGE: [merge entries], zero between launches */
    const float *k_scale;          /* fp8 latent (DT_KV 4/5): the per-tensor scale, one device
                                      float read at every launch; NULL: k_scale_value */
    float k_scale_value;
    int pad0;
};

/* The prefill attention kernels' (attn_mla_prefill): one launch per request and chunk of
   keys (mla_prefill_sm90.cu's top comment). */
struct attn_mha_params {
    const void *q;        /* [rows][heads][>= DN]: the first DN columns of the query */
    const void *q_pe;     /* [rows][heads][ROPE] */
    const void *k_nope;   /* [keys][heads][DN] */
    const void *k_pe;     /* [keys][ROPE] */
    const void *v;        /* [keys][heads][DV] */
    void *out;            /* [rows][heads][DV] */
    float *lse;           /* [rows][heads] (base e) or NULL; required with MERGE */
    attn_i64 q_stride_token, q_stride_head, q_pe_stride_token, q_pe_stride_head;
    attn_i64 k_stride_token, k_stride_head, kpe_stride_token, v_stride_token, v_stride_head;
    attn_i64 out_stride_token, out_stride_head, lse_stride_token, lse_stride_head;
    int q_row0, nq, pos0, key_pos0, nkeys, flags; /* flags: 1 causal, 2 merge into out/lse */
    float scale;
    int pad0;
};

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

/* MERGE of one row: the earlier chunks' lse (base e, lse_old; -inf: none) and this chunk's
   (base 2, *lse2; -inf: no key). On return *wn is the weight of this chunk's normalised
   output (it comes in as 1 / L), *wo that of the old out, and *lse2 the merged LSE (base 2);
   a side with LSE -inf weighs 0. */
ATTN_DEV void attn_mha_merge_weights(float lse_old, float *lse2, float *wn, float *wo) {
    const float lo = lse_old * ATTN_LOG2E, mx = fmaxf(lo, *lse2);
    if (mx == attn_neg_inf()) return;
    const float a = lo == attn_neg_inf() ? 0.0f : attn_exp2(lo - mx);
    const float b = *lse2 == attn_neg_inf() ? 0.0f : attn_exp2(*lse2 - mx);
    const float inv = attn_rcp(a + b);
    *wo = a * inv;
    *wn *= b * inv;
    *lse2 = mx + attn_log2(a + b);
}

#endif /* ATTN_MLA_COMMON_CUH */
