/* paged_common.cuh - what the paged-attention kernels share: the parameters the host
   passes by value to attn_paged_attention, attn_paged_merge_partials (paged_attention.cu)
   and the sm_90a prefill (paged_prefill_sm90.cu). attn.h declares the same struct as
   attn__paged_params (same members, same order; pointers and int64 first, so the natural
   alignment leaves no holes). Strides are in elements. The kernels that include it define
   TILE_TOKENS, GROUP and HEAD_DIM (the comments' shapes). */
#ifndef ATTN_PAGED_COMMON_CUH
#define ATTN_PAGED_COMMON_CUH

#include "attn_common.cuh"

struct attn_paged_params {
    const void *q;               /* DT_Q [tokens, num_heads, HEAD_DIM] */
    const void *kv_cache;        /* DT_KV [num_blocks, 2, BLOCK_SIZE, num_kv_heads, HEAD_DIM] */
    void *out;                   /* DT_Q [tokens, num_heads, HEAD_DIM] */
    float *lse;                  /* f32 [tokens, num_heads], base e; NULL: not written */
    const int *block_table;      /* [num_reqs, block_table_stride] */
    const int *seq_lens;         /* [num_reqs] */
    const int *query_start_loc;  /* [num_reqs + 1] */
    const float *alibi_slopes;   /* [num_heads] (ALIBI) */
    const int *work;             /* [capacity][8], see WORK LIST */
    const int *num_work;         /* one int: entries of `work` this launch runs */
    const int *merge;            /* [capacity][8], see MERGE LIST */
    const int *num_merge;        /* one int */
    float *partial_o;            /* [num_slots][TILE_TOKENS*GROUP][HEAD_DIM] */
    float *partial_ml;           /* [num_slots][TILE_TOKENS*GROUP][2] */
    int *merge_count;            /* [merge capacity] FUSED MERGE arrivals, zero between
                                    launches; NULL: merges only by attn_paged_merge_partials */
    const float *k_scale;        /* 8-bit caches with per-tensor scales: one float each on the
                                    device, read at every launch; NULL: k_scale_value */
    const float *v_scale;
    attn_i64 q_stride_token, q_stride_head;
    attn_i64 out_stride_token, out_stride_head;
    attn_i64 lse_stride_token, lse_stride_head;
    attn_i64 block_table_stride;
    int num_kv_heads;
    float scale;                 /* softmax scale */
    float softcap;               /* SOFTCAP: the cap (> 0) */
    int window;                  /* WINDOW: sliding window in tokens (0: none) */
    float k_scale_value, v_scale_value; /* where k_scale / v_scale are NULL */
};

/* The keys [lo, hi) that query position pos of a request of seq_len keys sees inside a work
   item's [key0, key1): the CPU's attn__cpu_visible_keys. Causal is the item's flag; the
   sliding window applies when W (the kernel's WINDOW define) and p.window > 0. */
template <int W>
ATTN_DEV void attn_visible_keys(const attn_paged_params &p, int causal, int pos, int seq_len, int key0, int key1,
                                int &lo, int &hi) {
    int a = 0, b = causal ? pos + 1 : seq_len;
    if (W && p.window > 0) {
        a = attn_imax(0, pos - p.window + 1);
        if (!causal) b = (int)(((attn_i64)pos + p.window) < seq_len ? (attn_i64)pos + p.window : seq_len);
    }
    lo = attn_imax(a, key0);
    hi = attn_imin(b, key1);
}

#endif /* ATTN_PAGED_COMMON_CUH */
