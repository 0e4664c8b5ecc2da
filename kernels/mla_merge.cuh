/* mla_merge.cuh - the MLA decode's merge of split partials, shared by mla_decode.cu
   (mma.sync) and mla_decode_sm90.cu (wgmma): include after mla_common.cuh once ROWS,
   KV_LORA and DT (16-bit) are defined. */
#ifndef ATTN_MLA_MERGE_CUH
#define ATTN_MLA_MERGE_CUH
#if !defined(ROWS) || !defined(KV_LORA) || !defined(DT)
#error "mla_merge.cuh: define ROWS, KV_LORA and DT first"
#endif

/* Split weights kept in shared memory per merge (rows x ATTN_MERGE_CAP; an entry of more
   splits recomputes them from the partial LSEs, a slower path for forced split counts). */
#define ATTN_MERGE_CAP 64
#define ATTN_MERGE_SW_FLOATS (ROWS * (ATTN_MERGE_CAP + 2))

/* Merges the splits of entry `mi` for its rows row0 .. row1 - 1: out = sum_i w_i o_i,
   w_i = 2^(lse_i - max) / sum (splits that saw no key weigh 0); lse to base e. Called by
   all n threads of the CTA (t = thread index; n a multiple of 32); sw: shared scratch of
   ATTN_MERGE_SW_FLOATS. Phase 1, a warp per row: the row's max and weight sum over the
   splits (lanes over splits), the weights into sw. Phase 2: every thread 4 columns at a
   time, the splits' partials read at L2 (ld.global.cg: other CTAs wrote them) as float4. */
ATTN_DEV void attn_mla_merge_entry(const attn__mla_decode_params &p, int mi, int row0, int row1, int t, int n, float *sw) {
    const int *mg = p.merge + 8 * (attn_i64)mi;
    const int q_row = mg[0], head0 = mg[1], splits = mg[2], slot0 = mg[3];
    const int lane = t & 31, cap = splits <= ATTN_MERGE_CAP;
    row1 = attn_imin(row1, p.num_heads - head0);
    for (int row = row0 + (t >> 5); row < row1; row += n >> 5) {
        float mx = attn_neg_inf(), ws = 0.0f;
        for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, __ldcg(p.partial_lse + (attn_i64)(slot0 + s) * ROWS + row));
        mx = attn_warp_max(mx);
        /* a sink (sparse MLA: params.sinks) is one more state with lse = the sink, no value */
        const float sk = p.sinks ? __ldg(p.sinks + head0 + row) * ATTN_LOG2E : attn_neg_inf();
        mx = fmaxf(mx, sk);
        for (int s = lane; s < splits; s += 32) {
            const float l = __ldcg(p.partial_lse + (attn_i64)(slot0 + s) * ROWS + row);
            ws += attn_merge_weight(l, mx);
        }
        ws = attn_warp_sum(ws) + attn_merge_weight(sk, mx);
        const float inv = ws > 0.0f ? 1.0f / ws : 0.0f;
        float *w = sw + row * (ATTN_MERGE_CAP + 2);
        if (cap)
            for (int s = lane; s < splits; s += 32) {
                const float l = __ldcg(p.partial_lse + (attn_i64)(slot0 + s) * ROWS + row);
                w[s] = attn_merge_weight(l, mx) * inv;
            }
        if (lane == 0) {
            w[ATTN_MERGE_CAP] = mx;
            w[ATTN_MERGE_CAP + 1] = inv;
            if (p.lse)
                p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] =
                    attn_softmax_lse2(mx, ws) * ATTN_LN2;
        }
    }
    __syncthreads();
    for (int u = row0 * (KV_LORA / 4) + t; u < row1 * (KV_LORA / 4); u += n) {
        const int row = u / (KV_LORA / 4), c = (u - row * (KV_LORA / 4)) * 4;
        const float *w = sw + row * (ATTN_MERGE_CAP + 2);
        const float *po = p.partial_o + ((attn_i64)slot0 * ROWS + row) * KV_LORA + c;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll 4
        for (int s = 0; s < splits; s++) {
            const float x = cap ? w[s]
                                : attn_exp2(__ldcg(p.partial_lse + (attn_i64)(slot0 + s) * ROWS + row) - w[ATTN_MERGE_CAP]) *
                                      w[ATTN_MERGE_CAP + 1];
            if (x > 0.0f) { /* an empty split weighs 0, whatever its partial holds */
                const float4 v = __ldcg((const float4 *)(po + (attn_i64)s * ROWS * KV_LORA));
                a0 += x * v.x; a1 += x * v.y; a2 += x * v.z; a3 += x * v.w;
            }
        }
        attn_u32 *dst = (attn_u32 *)((char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head + c) * 2);
        dst[0] = attn_elem<DT>::pack2(a0, a1);
        dst[1] = attn_elem<DT>::pack2(a2, a3);
    }
}

/* attn_mla_merge's body: grid (>= *num_merge, ROWS), one CTA per row of an entry. */
ATTN_DEV void attn_mla_merge_kernel(const attn__mla_decode_params &p) {
    __shared__ float sw[ATTN_MERGE_SW_FLOATS];
    if ((int)blockIdx.x >= *p.num_merge) return;
    attn_mla_merge_entry(p, blockIdx.x, blockIdx.y, blockIdx.y + 1, threadIdx.x, blockDim.x, sw);
}

#endif /* ATTN_MLA_MERGE_CUH */
