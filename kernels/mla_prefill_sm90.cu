/* mla_prefill_sm90.cu - MLA's up-projected prefill attention on wgmma (sm_90a), and the
   gather of a chunk of latent rows it runs on: the CUDA_MLA_SM90 backend's forward_mha.

   =====================================================================================
   WHAT IT COMPUTES (attn_mla_forward_mha's attention over one chunk of keys)
   =====================================================================================
   Per head h (MHA: every head its own K/V, from the up-projection of the latent): query
   row [q_nope | q_pe] (DQK = DN + ROPE: 128 + 64; two tensors, which may be the two halves
   of one), key row [k_nope[j][h] | k_pe[j]] (k_pe one vector per key, shared by all heads:
   the loader appends it, nothing is materialised), value v[j][h] (DV = 128). Scores
   s = q . k * scale; out = softmax(s) V in DT; lse (base e). The keys of a launch are rows
   0 .. nkeys - 1 of the K/V tensors (a chunk of one request's keys, up-projected by the
   host's GEMMs) at positions key_pos0 + j; query t of the launch is row q_row0 + t of
   q/out/lse at position pos0 + t and sees key j iff (not causal or key_pos0 + j <= pos0 +
   t). Under DCP (params.dcp_world_size > 1) key j is the rank's local key key_pos0 + j and
   query t sees it iff key_pos0 + j < the rank's local count of positions [0, pos0 + t + 1)
   (attn_mha_causal_end). A row that sees no key: out 0, lse -inf.
   MERGE (flags bit 1): out/lse already hold the result over earlier chunks (lse base e;
   -inf: none); the CTA merges its chunk's result into them by LSE (weights 2^(lse - max);
   a side with lse -inf weighs 0, whatever its out holds). So a request of many chunks is
   one launch per chunk, the first without MERGE; lse is then required (the running LSE).

   LAUNCH (attn_mla_prefill): grid (ceil(nq / 128), heads), block 256, dynamic shared
   memory attn_mha_config.shared_bytes (one CTA per SM: 2 warpgroups at up to 255 registers). Tile
   x takes the 128 queries from the end backwards (tile gridDim.x - 1 - x), so the causal
   tiles with the most keys start first. attn_mha_config: {threads, dynamic shared bytes,
   KV_TILE, 128 rows, KV_STAGES, 8 warps, 0, 1} (mla_decode_sm90.cu's order).

   INSIDE A CTA: paged_prefill_sm90.cu's loop with three changes: Q is DQK wide (three
   128-byte panels), K and V tiles have their own widths (DQK and DV), and rows come from
   strided tensors instead of pages (the copies of a key row: 16 chunks of k_nope, 8 of
   k_pe; of a value row: 16). Per 128-key tile: S = Q K^T by wgmma m64n128k16 ss over
   DQK / 16 steps (next tile's copies issued under it), masked online softmax in base 2,
   O += P V by wgmma m64nDVk16 rs with P from the S accumulators.

   The chunk's latent rows come from cache_write.cu's attn_mla_gather (k_pe is read from
   their tail). */
#include "wgmma.cuh"
#include "mla_common.cuh" /* attn__mla_prefill_params, attn_mha_merge_weights */

#if !defined(DN) || !defined(ROPE) || !defined(DV) || !defined(DT)
#error "mla_prefill_sm90.cu: define DN (q/k nope width), ROPE, DV and DT"
#endif
#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16
#error "mla_prefill_sm90.cu: DT must be 1 (f16) or 2 (bf16)"
#endif
#define ATTN_DQK (DN + ROPE)
#if ATTN_DQK % 64 != 0 || DV % 64 != 0 || DV > 128 || ATTN_DQK > 256 || DN % 8 != 0
#error "mla_prefill_sm90.cu: DN + ROPE must be a multiple of 64 up to 256, DV 64 or 128"
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
#error "mla_prefill_sm90.cu: shared memory over 227 KiB; lower KV_STAGES"
#endif
#define ATTN_O_PITCH (DV + 8)
#if ATTN_ROWS_PAD * ATTN_O_PITCH * 2 > KV_STAGES * (ATTN_K_BYTES + ATTN_V_BYTES)
#error "mla_prefill_sm90.cu: the epilogue's O does not fit over the K/V stages"
#endif
#define ATTN_ST (KV_TILE / 2)
#define ATTN_OT (DV / 2)
#define ATTN_KCPR (ATTN_DQK / 8) /* 16-byte chunks of a K row */
#define ATTN_VCPR (DV / 8)
#define ATTN_NC_K (DN / 8)      /* ... of its K_nope part, its k_pe part, a V row */
#define ATTN_NC_P (ROPE / 8)
#define ATTN_NC_V (DV / 8)
#if ATTN_THREADS % ATTN_NC_K || ATTN_THREADS % ATTN_NC_P || ATTN_THREADS % ATTN_NC_V || \
    (KV_TILE * ATTN_NC_K) % ATTN_THREADS || (KV_TILE * ATTN_NC_P) % ATTN_THREADS || (KV_TILE * ATTN_NC_V) % ATTN_THREADS
#error "mla_prefill_sm90.cu: the loader needs chunks per row that divide the threads"
#endif

extern "C" __constant__ attn__launch_config attn_mha_config = {ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ATTN_ROWS_PAD, 1, KV_STAGES, 8, 1};


extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1) attn_mla_prefill(const attn__mla_prefill_params p) {
    extern __shared__ attn_vec16 attn_smem[];
    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();
    const int tile = (int)(gridDim.x - 1 - blockIdx.x), head = blockIdx.y;
    const int q_row0 = p.q_row0 + 128 * tile, nq = attn_imin(128, p.nq - 128 * tile), pos0 = p.pos0 + 128 * tile;
    const int key_pos0 = p.key_pos0, nkeys = p.nkeys, causal = p.flags & ATTN_MHA_CAUSAL;
    if (nq <= 0) return;
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
        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,
                                                   p.q_pe_stride_head, DN, q_row0 + r, head, col)
                                : (const char *)p.q;
        attn_cp_async16_or_zero(sQ + attn_wgmma_swizzle_offset<ATTN_ROWS_PAD>(r, col), src, !valid);
    }

    /* ---- this thread's two rows: keys [0, hi) visible; the warpgroup's extremes ---- */
    const int row0 = 64 * wg + 16 * (warp & 3) + g;
    int hi[2], hi_min = 0x7fffffff, hi_max = (int)0x80000000;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row0 + 8 * h;
        const int b = causal ? attn_imax(0, attn_imin(nkeys, attn_mha_causal_end(p, pos0 + R) - key_pos0)) : nkeys;
        hi[h] = R < nq ? b : 0;
        if (R < nq) { hi_min = attn_imin(hi_min, b); hi_max = attn_imax(hi_max, b); }
    }
    hi_min = attn_warp_imin(hi_min); hi_max = attn_warp_imax(hi_max);
    if (lane == 0) { sBounds[2 * warp] = hi_min; sBounds[2 * warp + 1] = hi_max; }

    /* ---- K/V copies of tile `tile` into stage tile % KV_STAGES ---- */
    /* Each thread copies fixed 16-byte columns of K_nope, k_pe and V rows (chunks per row
       divide the 256 threads: shifts, not divisions, and column bases computed once). */
    const char *const kn_base = (const char *)p.k_nope + ((attn_i64)head * p.k_stride_head + (tid % ATTN_NC_K) * 8) * 2;
    const char *const kp_base = (const char *)p.k_pe + (tid % ATTN_NC_P) * 8 * 2;
    const char *const v_base = (const char *)p.v + ((attn_i64)head * p.v_stride_head + (tid % ATTN_NC_V) * 8) * 2;
    const attn_i64 kn_step = p.k_stride_token * 2, kp_step = p.kpe_stride_token * 2, v_step = p.v_stride_token * 2;
    auto issue = [&](int tile) {
        const int st = tile % KV_STAGES, j0 = tile * KV_TILE;
        const attn_u32 kd = sK + (attn_u32)(st * ATTN_K_BYTES), vd = sV + (attn_u32)(st * ATTN_V_BYTES);
#pragma unroll
        for (int i = 0; i < KV_TILE * ATTN_NC_K / ATTN_THREADS; i++) {
            const int r = tid / ATTN_NC_K + i * (ATTN_THREADS / ATTN_NC_K), j = j0 + r;
            attn_cp_async16_or_zero(kd + attn_wgmma_swizzle_offset<KV_TILE>(r, tid % ATTN_NC_K),
                                    j < nkeys ? kn_base + (attn_i64)j * kn_step : kn_base, j >= nkeys);
        }
#pragma unroll
        for (int i = 0; i < KV_TILE * ATTN_NC_P / ATTN_THREADS; i++) {
            const int r = tid / ATTN_NC_P + i * (ATTN_THREADS / ATTN_NC_P), j = j0 + r;
            attn_cp_async16_or_zero(kd + attn_wgmma_swizzle_offset<KV_TILE>(r, ATTN_NC_K + tid % ATTN_NC_P),
                                    j < nkeys ? kp_base + (attn_i64)j * kp_step : kp_base, j >= nkeys);
        }
#pragma unroll
        for (int i = 0; i < KV_TILE * ATTN_NC_V / ATTN_THREADS; i++) {
            const int r = tid / ATTN_NC_V + i * (ATTN_THREADS / ATTN_NC_V), j = j0 + r;
            attn_cp_async16_or_zero(vd + attn_wgmma_swizzle_offset<KV_TILE>(r, tid % ATTN_NC_V),
                                    j < nkeys ? v_base + (attn_i64)j * v_step : v_base, j >= nkeys);
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
            float bs[2], sum[2] = {0.0f, 0.0f}, alpha[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                bs[h] = attn_softmax_rebase(m[h], attn_quad_max(mx[h]) * qk_scale, alpha[h]);
                l[h] *= alpha[h];
            }
            attn_wgmma_scale_rows(o, alpha[0], alpha[1]);
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
    const int merge = p.flags & ATTN_MHA_MERGE;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row0 + 8 * h;
        const float L = attn_quad_sum(l[h]);
        float lse2 = attn_softmax_lse2(m[h], L); /* this chunk's, base 2 */
        float wn = L > 0.0f ? attn_rcp(L) : 0.0f, wo = 0.0f;           /* weights of new o and old out */
        const attn_i64 lse_at = (attn_i64)(q_row0 + R) * p.lse_stride_token + (attn_i64)head * p.lse_stride_head;
        const char *old = (const char *)p.out + ((attn_i64)(q_row0 + R) * p.out_stride_token + (attn_i64)head * p.out_stride_head + 2 * tq) * 2;
        if (merge && R < nq) attn_mha_merge_weights(p.lse[lse_at], &lse2, &wn, &wo); /* out = wo old + wn o */
        char *orow = sO + (R * ATTN_O_PITCH + 2 * tq) * 2;
#pragma unroll
        for (int i = 0; i < DV / 8; i++) {
            float x0 = o[4 * i + 2 * h] * wn, x1 = o[4 * i + 2 * h + 1] * wn;
            if (wo > 0.0f) {
                x0 += wo * attn_load<DT>(old, 8 * i);
                x1 += wo * attn_load<DT>(old, 8 * i + 1);
            }
            *(attn_u32 *)(orow + 8 * i * 2) = attn_elem<DT>::pack2(x0, x1);
        }
        if (tq == 0 && R < nq && p.lse) p.lse[lse_at] = lse2 * ATTN_LN2;
    }
    __syncthreads();
    for (int u = tid; u < nq * ATTN_VCPR; u += ATTN_THREADS) {
        const int R = u / ATTN_VCPR, c = u - R * ATTN_VCPR;
        const attn_vec16 v = *(const attn_vec16 *)(sO + (R * ATTN_O_PITCH + c * 8) * 2);
        attn_stg16((char *)p.out + ((attn_i64)(q_row0 + R) * p.out_stride_token + (attn_i64)head * p.out_stride_head + c * 8) * 2, v);
    }
}
