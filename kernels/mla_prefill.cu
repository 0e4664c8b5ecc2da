/* mla_prefill.cu - MLA's up-projected prefill attention on mma.sync (sm_80+): the CUDA_MLA
   backend's forward_mha. Checked on an H200 (2026-12-02): `./build/cuda_kernels --mla`
   against float64 and `./build/attn_tests cuda` (GPU worlds forced onto CUDA_MLA) passed,
   compute-sanitizer memcheck and racecheck clean; figures in docs/PERF.md ("CUDA_MLA v1").

   WHAT IT COMPUTES, params, launch, MERGE: exactly kernels/mla_prefill_sm90.cu's (the same
   struct attn__mla_prefill_params, the same pass scalars, the same LSE merge into out/lse for
   chunks after the first), so the host drives both alike; only the tile differs:
   grid (ceil(nq / 64), heads), block 128 (4 warps), dynamic shared memory
   attn_mha_config.shared_bytes; tile x takes queries 64 (gridDim.x - 1 - x) .. (the causal tiles
   with the most keys first). attn_mha_config: {threads, dynamic shared bytes, KV_TILE,
   64 rows, KV_STAGES, 4 warps, 0, 1}.

   INSIDE A CTA (FlashAttention-2's shape): warp w owns query rows 16w .. 16w + 15 of the
   CTA's 64 and every key of a tile, so a row's max and sum stay within the warp's quad of
   lanes. Q [64][DN + ROPE] is copied once (cp.async, rows padded by 16 bytes) and held as
   mma A fragments in registers (DQK / 16 k-steps x 4 registers). K tiles [KV_TILE keys]
   [DN | ROPE] and V tiles [KV_TILE][DV] stream through a cp.async ring of KV_STAGES stages
   (padded rows: conflict-free ldmatrix); each thread copies fixed 16-byte columns (chunks
   per row divide the 128 threads). Per tile: S = Q K^T (m16n8k16, K by ldmatrix), masked
   (key j visible iff j < nkeys and, causal, key_pos0 + j < attn_mha_causal_end(pos0 + row):
   key_pos0 + j <= pos0 + row, or the DCP rank's local count), online softmax
   in base 2 in registers, P packed from the S accumulators into A fragments, O += P V (V
   by ldmatrix.trans). Epilogue: O / l (merged with the earlier chunks' out/lse with MERGE),
   4-byte stores per lane. */
#include "mla_common.cuh" /* attn__mla_prefill_params, attn_mha_merge_weights */

#if !defined(DN) || !defined(ROPE) || !defined(DV) || !defined(DT)
#error "mla_prefill.cu: define DN (q/k nope width), ROPE, DV and DT"
#endif
#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16
#error "mla_prefill.cu: DT must be 1 (f16) or 2 (bf16)"
#endif
#define ATTN_DQK (DN + ROPE)
#if ATTN_DQK % 16 != 0 || DV % 16 != 0 || DN % 8 != 0 || ROPE % 8 != 0 || DV > 128 || ATTN_DQK > 256
#error "mla_prefill.cu: DN + ROPE must be a multiple of 16 up to 256, DV a multiple of 16 up to 128"
#endif

#define ATTN_WARPS 4
#define ATTN_THREADS (ATTN_WARPS * 32)
#define ATTN_ROWS (ATTN_WARPS * 16)
#ifndef KV_TILE
#define KV_TILE 64
#endif
#ifndef KV_STAGES
#define KV_STAGES 2
#endif
#if KV_TILE % 16 != 0 || KV_STAGES < 2
#error "mla_prefill.cu: KV_TILE a multiple of 16, KV_STAGES >= 2"
#endif
#define ATTN_QP (ATTN_DQK + 8) /* padded row pitches, elements */
#define ATTN_VP (DV + 8)
#define ATTN_SQ_OFF 0
#define ATTN_SK_OFF (ATTN_SQ_OFF + ATTN_ROWS * ATTN_QP * 2)
#define ATTN_SV_OFF (ATTN_SK_OFF + KV_STAGES * KV_TILE * ATTN_QP * 2)
#define ATTN_SMEM_BYTES (ATTN_SV_OFF + KV_STAGES * KV_TILE * ATTN_VP * 2)
#define ATTN_NC_K (DN / 8) /* 16-byte chunks of a row: K_nope, k_pe, V */
#define ATTN_NC_P (ROPE / 8)
#define ATTN_NC_V (DV / 8)
#if ATTN_THREADS % ATTN_NC_K || ATTN_THREADS % ATTN_NC_P || ATTN_THREADS % ATTN_NC_V || \
    (KV_TILE * ATTN_NC_K) % ATTN_THREADS || (KV_TILE * ATTN_NC_P) % ATTN_THREADS || (KV_TILE * ATTN_NC_V) % ATTN_THREADS
#error "mla_prefill.cu: the loader needs chunks per row that divide the threads"
#endif
#define ATTN_KS (ATTN_DQK / 16) /* k-steps of S */
#define ATTN_NT (KV_TILE / 8)   /* n-tiles of S */
#define ATTN_OT (DV / 8)        /* n-tiles of O */

extern "C" __constant__ attn__launch_config attn_mha_config = {ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ATTN_ROWS, 1, KV_STAGES, ATTN_WARPS, 1};


extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_mla_prefill(const attn__mla_prefill_params p) {
    extern __shared__ attn_vec16 attn_smem[];
    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();
    const int tile = (int)(gridDim.x - 1 - blockIdx.x), head = blockIdx.y;
    const int q_row0 = p.q_row0 + ATTN_ROWS * tile, nq = attn_imin(ATTN_ROWS, p.nq - ATTN_ROWS * tile);
    const int pos0 = p.pos0 + ATTN_ROWS * tile, key_pos0 = p.key_pos0, nkeys = p.nkeys;
    const int causal = p.flags & ATTN_MHA_CAUSAL;
    if (nq <= 0) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const attn_u32 sbase = attn_smem_addr(attn_smem);
    const attn_u32 sQ = sbase + ATTN_SQ_OFF, sK = sbase + ATTN_SK_OFF, sV = sbase + ATTN_SV_OFF;

    /* ---- Q rows [q_nope | q_pe], zero past nq ---- */
    for (int c = tid; c < ATTN_ROWS * (ATTN_DQK / 8); c += ATTN_THREADS) {
        const int r = c / (ATTN_DQK / 8), col = c - r * (ATTN_DQK / 8), valid = r < nq;
        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,
                                                   p.q_pe_stride_head, DN, q_row0 + r, head, col)
                                : (const char *)p.q;
        attn_cp_async16_or_zero(sQ + (attn_u32)((r * ATTN_QP + col * 8) * 2), src, !valid);
    }

    /* ---- keys this CTA sees: [0, kend) of the chunk ---- */
    const int kend = causal ? attn_imax(0, attn_imin(nkeys, attn_mha_causal_end(p, pos0 + nq - 1) - key_pos0)) : nkeys;
    const int ntiles = (kend + KV_TILE - 1) / KV_TILE;
    const char *const kn_base = (const char *)p.k_nope + ((attn_i64)head * p.k_stride_head + (tid % ATTN_NC_K) * 8) * 2;
    const char *const kp_base = (const char *)p.k_pe + (tid % ATTN_NC_P) * 8 * 2;
    const char *const v_base = (const char *)p.v + ((attn_i64)head * p.v_stride_head + (tid % ATTN_NC_V) * 8) * 2;
    const attn_i64 kn_step = p.k_stride_token * 2, kp_step = p.kpe_stride_token * 2, v_step = p.v_stride_token * 2;
    auto issue = [&](int t) {
        const int st = t % KV_STAGES, j0 = t * KV_TILE;
        const attn_u32 kd = sK + (attn_u32)(st * KV_TILE * ATTN_QP * 2), vd = sV + (attn_u32)(st * KV_TILE * ATTN_VP * 2);
#pragma unroll
        for (int i = 0; i < KV_TILE * ATTN_NC_K / ATTN_THREADS; i++) {
            const int r = tid / ATTN_NC_K + i * (ATTN_THREADS / ATTN_NC_K), j = j0 + r;
            attn_cp_async16_or_zero(kd + (attn_u32)((r * ATTN_QP + (tid % ATTN_NC_K) * 8) * 2),
                                    j < nkeys ? kn_base + (attn_i64)j * kn_step : kn_base, j >= nkeys);
        }
#pragma unroll
        for (int i = 0; i < KV_TILE * ATTN_NC_P / ATTN_THREADS; i++) {
            const int r = tid / ATTN_NC_P + i * (ATTN_THREADS / ATTN_NC_P), j = j0 + r;
            attn_cp_async16_or_zero(kd + (attn_u32)((r * ATTN_QP + DN + (tid % ATTN_NC_P) * 8) * 2),
                                    j < nkeys ? kp_base + (attn_i64)j * kp_step : kp_base, j >= nkeys);
        }
#pragma unroll
        for (int i = 0; i < KV_TILE * ATTN_NC_V / ATTN_THREADS; i++) {
            const int r = tid / ATTN_NC_V + i * (ATTN_THREADS / ATTN_NC_V), j = j0 + r;
            attn_cp_async16_or_zero(vd + (attn_u32)((r * ATTN_VP + (tid % ATTN_NC_V) * 8) * 2),
                                    j < nkeys ? v_base + (attn_i64)j * v_step : v_base, j >= nkeys);
        }
    };
#pragma unroll
    for (int s = 0; s < KV_STAGES - 1; s++) {
        if (s < ntiles) issue(s);
        attn_cp_async_commit(); /* Q goes with the first group */
    }

    /* ldmatrix lane offsets (bytes): A rows lane % 16, column half lane / 16; B from [key]
       [dim] rows: keys lane % 8 + 8 (lane / 16), column half (lane / 8) % 2; V transposed:
       keys lane % 16, column half lane / 16 (mla_decode.cu's) */
    const attn_u32 a_lane = (attn_u32)(((lane & 15) * ATTN_QP + (lane >> 4) * 8) * 2);
    const attn_u32 k_lane = (attn_u32)((((lane & 7) + ((lane >> 4) << 3)) * ATTN_QP + ((lane >> 3) & 1) * 8) * 2);
    const attn_u32 v_lane = (attn_u32)(((lane & 15) * ATTN_VP + (lane >> 4) * 8) * 2);
    const float qk_scale = p.scale * ATTN_LOG2E;
    const int row_a = 16 * warp + g; /* this thread's rows: row_a, row_a + 8 */
    int hi[2]; /* keys [0, hi) visible to each of the two rows */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row_a + 8 * h;
        hi[h] = R >= nq ? 0 : causal ? attn_imax(0, attn_imin(nkeys, attn_mha_causal_end(p, pos0 + R) - key_pos0)) : nkeys;
    }
    attn_u32 qf[ATTN_KS][4];
    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};
    float o[ATTN_OT][4];
#pragma unroll
    for (int n = 0; n < ATTN_OT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        attn_cp_async_wait<KV_STAGES - 2>();
        __syncthreads(); /* tile it (and Q) landed; stage (it - 1) % KV_STAGES is free */
        if (it == 0) {
#pragma unroll
            for (int ks = 0; ks < ATTN_KS; ks++)
                attn_ldmatrix_x4(qf[ks], sQ + (attn_u32)(16 * warp * ATTN_QP * 2) + a_lane + ks * 32);
        }
        if (it + KV_STAGES - 1 < ntiles) issue(it + KV_STAGES - 1);
        attn_cp_async_commit();
        const int st = it % KV_STAGES, kt0 = it * KV_TILE;
        const attn_u32 kb = sK + (attn_u32)(st * KV_TILE * ATTN_QP * 2) + k_lane;
        const attn_u32 vb = sV + (attn_u32)(st * KV_TILE * ATTN_VP * 2) + v_lane;
        /* a warp whose rows see none of this tile's keys skips it */
        const int warp_hi = attn_warp_imax(attn_imax(hi[0], hi[1]));
        if (kt0 >= warp_hi) continue;

        /* ---- S = Q K^T ---- */
        float s[ATTN_NT][4];
#pragma unroll
        for (int n = 0; n < ATTN_NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < ATTN_KS; ks++)
#pragma unroll
            for (int np = 0; np < ATTN_NT / 2; np++) {
                attn_u32 b[4];
                attn_ldmatrix_x4(b, kb + (attn_u32)((np * 16 * ATTN_QP + ks * 16) * 2));
                attn_mma16816<DT>(s[2 * np], qf[ks], b);
                attn_mma16816<DT>(s[2 * np + 1], qf[ks], b + 2);
            }

        /* ---- mask, online softmax (base 2, scale folded in) ---- */
        float mx[2] = {attn_neg_inf(), attn_neg_inf()};
#pragma unroll
        for (int n = 0; n < ATTN_NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = kt0 + 8 * n + 2 * tq + (e & 1);
                const float x = j < hi[e >> 1] ? s[n][e] : attn_neg_inf();
                s[n][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float b2[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float alpha;
            b2[h] = attn_softmax_rebase(m[h], attn_quad_max(mx[h]) * qk_scale, alpha);
            l[h] *= alpha;
#pragma unroll
            for (int n = 0; n < ATTN_OT; n++) { o[n][2 * h] *= alpha; o[n][2 * h + 1] *= alpha; }
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < ATTN_NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float x = attn_exp2(fmaf(s[n][e], qk_scale, -b2[e >> 1]));
                s[n][e] = x;
                sum[e >> 1] += x;
            }
        l[0] += sum[0];
        l[1] += sum[1];

        /* ---- O += P V: P's A fragments straight from the S accumulators ---- */
#pragma unroll
        for (int kk = 0; kk < KV_TILE / 16; kk++) {
            attn_u32 a[4];
            a[0] = attn_elem<DT>::pack2(s[2 * kk][0], s[2 * kk][1]);
            a[1] = attn_elem<DT>::pack2(s[2 * kk][2], s[2 * kk][3]);
            a[2] = attn_elem<DT>::pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            a[3] = attn_elem<DT>::pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int op = 0; op < ATTN_OT / 2; op++) {
                attn_u32 b[4];
                attn_ldmatrix_x4_trans(b, vb + (attn_u32)((kk * 16 * ATTN_VP + op * 16) * 2));
                attn_mma16816<DT>(o[2 * op], a, b);
                attn_mma16816<DT>(o[2 * op + 1], a, b + 2);
            }
        }
    }
    attn_cp_async_wait<0>();

    /* ---- epilogue: O / l, merged with the earlier chunks' out/lse (MERGE) ---- */
    const int merge = p.flags & ATTN_MHA_MERGE;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row_a + 8 * h;
        const float L = attn_quad_sum(l[h]);
        float lse2 = attn_softmax_lse2(m[h], L);
        float wn = L > 0.0f ? attn_rcp(L) : 0.0f, wo = 0.0f;
        if (R >= nq) continue;
        const attn_i64 lse_at = (attn_i64)(q_row0 + R) * p.lse_stride_token + (attn_i64)head * p.lse_stride_head;
        char *orow = (char *)p.out + ((attn_i64)(q_row0 + R) * p.out_stride_token + (attn_i64)head * p.out_stride_head + 2 * tq) * 2;
        if (merge) attn_mha_merge_weights(p.lse[lse_at], &lse2, &wn, &wo); /* out = wo old + wn o */
#pragma unroll
        for (int n = 0; n < ATTN_OT; n++) {
            float x0 = o[n][2 * h] * wn, x1 = o[n][2 * h + 1] * wn;
            if (wo > 0.0f) {
                x0 += wo * attn_load<DT>(orow, 8 * n);
                x1 += wo * attn_load<DT>(orow, 8 * n + 1);
            }
            *(attn_u32 *)(orow + 8 * n * 2) = attn_elem<DT>::pack2(x0, x1);
        }
        if (tq == 0 && p.lse) p.lse[lse_at] = lse2 * ATTN_LN2;
    }
}
