/* mha_prefill_sm90.cu - MLA's up-projected prefill attention on wgmma (sm_90a); a draft.

   NOT YET RUN ON A GPU; not embedded, not wired (issue 9). `./build/cuda_kernels --mla`
   compiles it for sm_90a and, on compute capability 9.0, checks it against float64.

   =====================================================================================
   WHAT IT COMPUTES (attn_mla_forward_mha's attention, one chunk of keys)
   =====================================================================================
   Per head h (MHA: every head its own K/V, from the up-projection of the latent): query
   row [q_nope | q_pe] (DQK = DN + ROPE: 128 + 64), key row [k_nope[j][h] | k_pe[j]] (k_pe
   one vector per key, shared by all heads: the loader appends it, nothing is
   materialised), value v[j][h] (DV = 128). Scores s = q . k * scale; out = softmax(s) V in
   DT; lse (base e). Keys of a work item are a contiguous run of rows of the up-projection
   workspace with consecutive positions; a query sees key j iff (not causal or
   key_pos0 + j <= pos of the query). A row that sees no key: out 0, lse -inf (the LSE
   merge of chunks then gives it weight 0).

   WORK ITEM (8 int32): {head, q_row0, nq (1..128), pos0 (position of query q_row0),
   key_pos0 (position of key 0), nkeys, kv_row0 (workspace row of key 0), flags (bit 0
   causal)}. Query t of the item is row q_row0 + t of q/out/lse at position pos0 + t.

   LAUNCH: grid >= *num_work, block 256, dynamic shared memory attn_mha_config[1]
   (one CTA per SM: 2 warpgroups at up to 255 registers). attn_mha_config: {threads,
   dynamic shared bytes, KV_TILE, 128 rows, KV_STAGES, 8 warps, 0, 1} (mla_decode.cu's order).

   INSIDE A CTA: paged_prefill_sm90.cu's loop with three changes: Q is DQK wide (three
   128-byte panels), K and V tiles have their own widths (DQK and DV), and rows come from
   strided tensors instead of pages (the copies of a key row: 16 chunks of k_nope, 8 of
   k_pe; of a value row: 16). Per 128-key tile: S = Q K^T by wgmma m64n128k16 ss over
   DQK / 16 steps (next tile's copies issued under it), masked online softmax in base 2,
   O += P V by wgmma m64nDVk16 rs with P from the S accumulators. */
#include "wgmma.cuh"

#if !defined(DN) || !defined(ROPE) || !defined(DV) || !defined(DT)
#error "mha_prefill_sm90.cu: define DN (q/k nope width), ROPE, DV and DT"
#endif
#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16
#error "mha_prefill_sm90.cu: DT must be 1 (f16) or 2 (bf16)"
#endif
#define ATTN_DQK (DN + ROPE)
#if ATTN_DQK % 64 != 0 || DV % 64 != 0 || DV > 128 || ATTN_DQK > 256 || DN % 8 != 0
#error "mha_prefill_sm90.cu: DN + ROPE must be a multiple of 64 up to 256, DV 64 or 128"
#endif

#define ATTN_ROWS_PAD 128
#define ATTN_THREADS 256
#define KV_TILE 128
#ifndef KV_STAGES
#define KV_STAGES 2
#endif
#define ATTN_SQ_BYTES (ATTN_ROWS_PAD * ATTN_DQK * 2)
#define ATTN_K_BYTES (KV_TILE * ATTN_DQK * 2)
#define ATTN_V_BYTES (KV_TILE * DV * 2)
#define ATTN_SK_OFF ATTN_SQ_BYTES
#define ATTN_SV_OFF (ATTN_SK_OFF + KV_STAGES * ATTN_K_BYTES)
#define ATTN_BOUNDS_OFF (ATTN_SV_OFF + KV_STAGES * ATTN_V_BYTES)
#define ATTN_SMEM_BYTES (ATTN_BOUNDS_OFF + 128 + 1024)
#if ATTN_SMEM_BYTES > 232448
#error "mha_prefill_sm90.cu: shared memory over 227 KiB; lower KV_STAGES"
#endif
#define ATTN_O_PITCH (DV + 8)
#if ATTN_ROWS_PAD * ATTN_O_PITCH * 2 > KV_STAGES * (ATTN_K_BYTES + ATTN_V_BYTES)
#error "mha_prefill_sm90.cu: the epilogue's O does not fit over the K/V stages"
#endif
#define ATTN_ST (KV_TILE / 2)
#define ATTN_OT (DV / 2)
#define ATTN_KCPR (ATTN_DQK / 8) /* 16-byte chunks of a K row */
#define ATTN_VCPR (DV / 8)

extern "C" __constant__ int attn_mha_config[8] = {ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ATTN_ROWS_PAD, KV_STAGES, 8, 0, 1};

struct attn_mha_params {
    const void *q;        /* [rows][heads][DQK] */
    const void *k_nope;   /* [kv rows][heads][DN] */
    const void *k_pe;     /* [kv rows][ROPE] */
    const void *v;        /* [kv rows][heads][DV] */
    void *out;            /* [rows][heads][DV] */
    float *lse;           /* [rows][heads] or NULL */
    const int *work, *num_work;
    attn_i64 q_stride_token, q_stride_head, k_stride_token, k_stride_head, kpe_stride_token;
    attn_i64 v_stride_token, v_stride_head, out_stride_token, out_stride_head, lse_stride_token, lse_stride_head;
    float scale;
};

extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1) attn_mha_prefill(const attn_mha_params p) {
    extern __shared__ attn_vec16 attn_smem[];
    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();
    if ((int)blockIdx.x >= *p.num_work) return;
    const int *item = p.work + 8 * (attn_i64)blockIdx.x;
    const int head = item[0], q_row0 = item[1], nq = item[2], pos0 = item[3];
    const int key_pos0 = item[4], nkeys = item[5], kv_row0 = item[6], causal = item[7] & 1;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
    const int g = lane >> 2, tq = lane & 3;
    const attn_u32 smem0 = attn_smem_addr(attn_smem);
    const attn_u32 base = (smem0 + 1023u) & ~1023u;
    char *const smem = (char *)attn_smem + (base - smem0);
    const attn_u32 sQ = base, sK = base + ATTN_SK_OFF, sV = base + ATTN_SV_OFF;
    int *const sBounds = (int *)(smem + ATTN_BOUNDS_OFF); /* [warp][2]: hi min, hi max */

    /* ---- Q rows (zero past nq), with tile 0's group ---- */
    for (int c = tid; c < ATTN_ROWS_PAD * ATTN_KCPR; c += ATTN_THREADS) {
        const int r = c / ATTN_KCPR, col = c - r * ATTN_KCPR;
        const int valid = r < nq;
        const char *src = valid ? (const char *)p.q + ((attn_i64)(q_row0 + r) * p.q_stride_token + (attn_i64)head * p.q_stride_head + col * 8) * 2
                                : (const char *)p.q;
        attn_cp_async16_or_zero(sQ + attn_wgmma_swizzle_offset<ATTN_ROWS_PAD>(r, col), src, !valid);
    }

    /* ---- this thread's two rows: keys [0, hi) visible; the warpgroup's extremes ---- */
    const int row0 = 64 * wg + 16 * (warp & 3) + g;
    int hi[2], hi_min = 0x7fffffff, hi_max = (int)0x80000000;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row0 + 8 * h;
        const int b = causal ? attn_imax(0, attn_imin(nkeys, pos0 + R - key_pos0 + 1)) : nkeys;
        hi[h] = R < nq ? b : 0;
        if (R < nq) { hi_min = attn_imin(hi_min, b); hi_max = attn_imax(hi_max, b); }
    }
    hi_min = attn_warp_imin(hi_min); hi_max = attn_warp_imax(hi_max);
    if (lane == 0) { sBounds[2 * warp] = hi_min; sBounds[2 * warp + 1] = hi_max; }

    /* ---- K/V copies of tile `tile` into stage tile % KV_STAGES ---- */
    auto issue = [&](int tile) {
        const int st = tile % KV_STAGES;
        const attn_u32 kd = sK + (attn_u32)(st * ATTN_K_BYTES), vd = sV + (attn_u32)(st * ATTN_V_BYTES);
        for (int c = tid; c < KV_TILE * ATTN_KCPR; c += ATTN_THREADS) {
            const int r = c / ATTN_KCPR, col = c - r * ATTN_KCPR, j = tile * KV_TILE + r;
            const int valid = j < nkeys;
            const char *src = (const char *)p.k_nope;
            if (valid)
                src = col * 8 < DN ? (const char *)p.k_nope + ((attn_i64)(kv_row0 + j) * p.k_stride_token + (attn_i64)head * p.k_stride_head + col * 8) * 2
                                   : (const char *)p.k_pe + ((attn_i64)(kv_row0 + j) * p.kpe_stride_token + (col * 8 - DN)) * 2;
            attn_cp_async16_or_zero(kd + attn_wgmma_swizzle_offset<KV_TILE>(r, col), src, !valid);
        }
        for (int c = tid; c < KV_TILE * ATTN_VCPR; c += ATTN_THREADS) {
            const int r = c / ATTN_VCPR, col = c - r * ATTN_VCPR, j = tile * KV_TILE + r;
            const int valid = j < nkeys;
            const char *src = valid ? (const char *)p.v + ((attn_i64)(kv_row0 + j) * p.v_stride_token + (attn_i64)head * p.v_stride_head + col * 8) * 2
                                    : (const char *)p.v;
            attn_cp_async16_or_zero(vd + attn_wgmma_swizzle_offset<KV_TILE>(r, col), src, !valid);
        }
    };
    const int ntiles = (nkeys + KV_TILE - 1) / KV_TILE;
#pragma unroll
    for (int s = 0; s < KV_STAGES - 1; s++) {
        if (s < ntiles) issue(s);
        attn_cp_async_commit();
    }
    __syncthreads(); /* sBounds */
    {
        const int *wb = sBounds + 8 * wg;
        hi_min = attn_imin(attn_imin(wb[0], wb[2]), attn_imin(wb[4], wb[6]));
        hi_max = attn_imax(attn_imax(wb[1], wb[3]), attn_imax(wb[5], wb[7]));
    }

    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};
    float o[ATTN_OT];
#pragma unroll
    for (int i = 0; i < ATTN_OT; i++) o[i] = 0.0f;
    const float qk_scale = p.scale * ATTN_LOG2E;
    const attn_u32 sQ_wg = sQ + (attn_u32)(wg * 64 * 128);

    for (int it = 0; it < ntiles; it++) {
        attn_cp_async_wait<KV_STAGES - 2>();
        attn_wgmma_fence_smem_writes();
        __syncthreads(); /* tile it visible; stage (it - 1) free */
        const int st = it % KV_STAGES, kt0 = it * KV_TILE;
        const attn_u32 sK_st = sK + (attn_u32)(st * ATTN_K_BYTES), sV_st = sV + (attn_u32)(st * ATTN_V_BYTES);
        const int active = __all_sync(0xffffffffu, kt0 < hi_max);
        auto issue_next = [&]() {
            if (it + KV_STAGES - 1 < ntiles) issue(it + KV_STAGES - 1);
            attn_cp_async_commit();
        };
        if (active) {
            const int need_mask = kt0 + KV_TILE > hi_min;
            float s[ATTN_ST];
            attn_wgmma_fence();
#pragma unroll
            for (int k = 0; k < ATTN_DQK; k += 16)
                attn_wgmma<KV_TILE, DT>::template ss<0>(s, attn_wgmma_desc_k_major<ATTN_ROWS_PAD>(sQ_wg, k),
                                                        attn_wgmma_desc_k_major<KV_TILE>(sK_st, k), k > 0);
            attn_wgmma_commit();
            issue_next();
            attn_wgmma_wait<0>();
            attn_wgmma_fence_acc(s);
            float mx[2] = {attn_neg_inf(), attn_neg_inf()};
            const int dhi[2] = {hi[0] - (kt0 + 2 * tq), hi[1] - (kt0 + 2 * tq)};
#pragma unroll
            for (int i = 0; i < KV_TILE / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, c = 8 * i + (e & 1);
                    float x = s[4 * i + e];
                    if (need_mask && c >= dhi[h]) x = attn_neg_inf();
                    s[4 * i + e] = x;
                    mx[h] = fmaxf(mx[h], x);
                }
            float bs[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float mnew = fmaxf(m[h], attn_quad_max(mx[h]) * qk_scale);
                const float b = mnew == attn_neg_inf() ? 0.0f : mnew;
                const float alpha = attn_exp2(m[h] - b);
                m[h] = mnew;
                l[h] *= alpha;
                bs[h] = b;
#pragma unroll
                for (int i = 0; i < DV / 8; i++) { o[4 * i + 2 * h] *= alpha; o[4 * i + 2 * h + 1] *= alpha; }
            }
#pragma unroll
            for (int i = 0; i < KV_TILE / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float x = attn_exp2(fmaf(s[4 * i + e], qk_scale, -bs[e >> 1]));
                    s[4 * i + e] = x;
                    sum[e >> 1] += x;
                }
            l[0] += sum[0];
            l[1] += sum[1];
            attn_u32 a[KV_TILE / 16][4];
#pragma unroll
            for (int j = 0; j < KV_TILE / 16; j++) attn_wgmma_a_from_acc<DT>(a[j], s, j);
            attn_wgmma_fence();
#pragma unroll
            for (int j = 0; j < KV_TILE / 16; j++)
                attn_wgmma<DV, DT>::template rs<1>(o, a[j], attn_wgmma_desc_mn_major<KV_TILE>(sV_st, 16 * j), 1);
            attn_wgmma_commit();
            attn_wgmma_wait<0>();
            attn_wgmma_fence_acc(o);
        } else {
            issue_next();
        }
    }

    /* ---- epilogue: O / l to shared memory over the stages, lse out, rows out ---- */
    attn_cp_async_wait<0>();
    __syncthreads();
    char *const sO = smem + ATTN_SK_OFF;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row0 + 8 * h;
        const float L = attn_quad_sum(l[h]);
        const float inv = L > 0.0f ? attn_rcp(L) : 0.0f;
        char *orow = sO + (R * ATTN_O_PITCH + 2 * tq) * 2;
#pragma unroll
        for (int i = 0; i < DV / 8; i++)
            *(attn_u32 *)(orow + 8 * i * 2) = attn_elem<DT>::pack2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
        if (tq == 0 && R < nq && p.lse)
            p.lse[(attn_i64)(q_row0 + R) * p.lse_stride_token + (attn_i64)head * p.lse_stride_head] =
                L > 0.0f ? (m[h] + attn_log2(L)) * ATTN_LN2 : attn_neg_inf();
    }
    __syncthreads();
    for (int u = tid; u < nq * ATTN_VCPR; u += ATTN_THREADS) {
        const int R = u / ATTN_VCPR, c = u - R * ATTN_VCPR;
        const attn_vec16 v = *(const attn_vec16 *)(sO + (R * ATTN_O_PITCH + c * 8) * 2);
        attn_stg16((char *)p.out + ((attn_i64)(q_row0 + R) * p.out_stride_token + (attn_i64)head * p.out_stride_head + c * 8) * 2, v);
    }
}
