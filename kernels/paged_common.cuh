/* paged_common.cuh - what the paged-attention kernels share beyond their parameters
   (attn__paged_params, defined once in attn_params.cuh for the kernels and the host): the
   work-item prologue (paged_attention.cu's; paged_prefill_sm90.cu writes it out, see there)
   and the keys a query position sees. Included by paged_attention.cu and
   paged_prefill_sm90.cu. */
#ifndef ATTN_PAGED_COMMON_CUH
#define ATTN_PAGED_COMMON_CUH

#include "attn_common.cuh"
#include "attn_params.cuh" /* attn__paged_params */
#include "online_softmax.cuh"


/* ---- the work-item prologue ----
   A work item (WORK LIST in paged_attention.cu: 8 x int32 per CTA) and what follows from it:
   the request's lengths and the key range clamped to [0, seq_len). */
struct attn_paged_item {
    int req, kv_head, tok0, ntok;   /* the tile: request, KV head, first query token, tokens */
    int slot, causal, merge_index;  /* partial slot (-1: write out), causal flag, merge entry (-1: none) */
    int seq_len, q_start, query_len;
    int key0, key1;                 /* the keys read, clamped to [0, seq_len) */
    int nrows;                      /* ntok * GROUP query rows */
};

ATTN_DEV attn_paged_item attn_paged_item_load(const attn__paged_params &p, int index, int group) {
    const int *item = p.work + 8 * (attn_i64)index;
    attn_paged_item w;
    w.req = item[0];
    w.kv_head = item[1];
    w.tok0 = item[2];
    w.ntok = item[3];
    w.slot = item[6];
    w.causal = item[7] & 1;
    w.merge_index = (item[7] >> 8) - 1;
    w.seq_len = p.seq_lens[w.req];
    w.q_start = p.query_start_loc[w.req];
    w.query_len = p.query_start_loc[w.req + 1] - w.q_start;
    w.key0 = attn_imax(item[4], 0);
    w.key1 = attn_imin(item[5], w.seq_len);
    w.nrows = w.ntok * group;
    return w;
}

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
    if (p.dcp_world_size > 1) { /* the global range as this rank's local keys (ownership is monotone) */
        a = attn_dcp_positions(p.dcp_world_size, p.dcp_rank, p.dcp_interleave, a);
        b = attn_dcp_positions(p.dcp_world_size, p.dcp_rank, p.dcp_interleave, b);
    }
    lo = attn_imax(a, key0);
    hi = attn_imin(b, key1);
}

#endif /* ATTN_PAGED_COMMON_CUH */
