/* paged_common.cuh - what the paged-attention kernels share beyond their parameters
   (attn__paged_params, defined once in attn_params.cuh for the kernels and the host): the
   keys a query position sees. Included by paged_attention.cu and paged_prefill_sm90.cu. */
#ifndef ATTN_PAGED_COMMON_CUH
#define ATTN_PAGED_COMMON_CUH

#include "attn_common.cuh"
#include "attn_params.cuh" /* attn__paged_params */


/* The keys [lo, hi) that query position pos of a request of seq_len keys sees inside a work
   item's [key0, key1): the CPU's attn__cpu_visible_keys. Causal is the item's flag; the
   sliding window applies when W (the kernel's WINDOW define) and p.window > 0. */
template <int W>
ATTN_DEV void attn_visible_keys(const attn__paged_params &p, int causal, int pos, int seq_len, int key0, int key1,
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
