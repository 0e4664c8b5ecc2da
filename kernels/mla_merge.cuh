/* mla_merge.cuh - the MLA decode's merge of split partials, shared by mla_decode.cu
   (mma.sync) and mla_decode_sm90.cu (wgmma): include after mla_common.cuh once ROWS,
   KV_LORA and DT (16-bit) are defined. */
#ifndef ATTN_MLA_MERGE_CUH
#define ATTN_MLA_MERGE_CUH
#if !defined(ROWS) || !defined(KV_LORA) || !defined(DT)
#error "mla_merge.cuh: define ROWS, KV_LORA and DT first"
#endif

/* The merge CTA: ATTN_MLA_MERGE_THREADS threads (the host launches that many; any multiple
   of 32 up to it works). Its shared scratch: the split weights (up to ATTN_MERGE_MAX_SPLITS,
   the metadata's limit; more recompute them from the partial LSEs, a slower path), 32 floats
   for block reductions, and the column sums of the split groups past the first. */
#define ATTN_MLA_MERGE_THREADS 512
#define ATTN_MERGE_MAX_SPLITS 1024
#define ATTN_MERGE_SW_FLOATS (ATTN_MERGE_MAX_SPLITS + 32 + 4 * ATTN_MLA_MERGE_THREADS)

/* The n threads' max (op 0) or sum (op 1) of v, through red[0 .. 32) (n a multiple of 32). */
ATTN_DEV float attn_mla_merge_reduce(float v, int op, int t, int n, float *red) {
    v = op ? attn_warp_sum(v) : attn_warp_max(v);
    __syncthreads(); /* red's earlier readers are done */
    if ((t & 31) == 0) red[t >> 5] = v;
    __syncthreads();
    v = op ? 0.0f : attn_neg_inf();
    for (int w = 0; w < (n >> 5); w++) v = op ? v + red[w] : fmaxf(v, red[w]);
    return v;
}

/* Merges the splits of row `row` of entry `mi`: out = sum_i w_i o_i, w_i = 2^(lse_i - max) /
   sum (splits that saw no key weigh 0; a sink then joins the denominator with no value); lse to base
   e. Called by all n threads of the CTA (t = thread index). Phase 1: every split's LSE read
   once (threads over splits), the max and the weight sum reduced over the CTA, the weights
   into shared memory. Phase 2: the n threads are groups of KV_LORA / 4 column quads; group g
   sums splits g, g + groups, ... with 8 partial reads (ld.global.cg, float4: other CTAs
   wrote them) in flight per thread, and the groups' sums meet in shared memory. */
ATTN_DEV void attn_mla_merge_row(const attn__mla_decode_params &p, int mi, int row, int t, int n, float *sw) {
    const int *mg = p.merge + 8 * (attn_i64)mi;
    const int q_row = mg[0], head0 = mg[1], splits = mg[2], slot0 = mg[3];
    const int cap = splits <= ATTN_MERGE_MAX_SPLITS;
    float *const w = sw, *const red = sw + ATTN_MERGE_MAX_SPLITS, *const part = red + 32;
    if (row >= p.num_heads - head0) return; /* the whole CTA: past the heads */
    const float *const plse = p.partial_lse + (attn_i64)slot0 * ROWS + row;
    float mx = attn_neg_inf();
    for (int s = t; s < splits; s += n) {
        const float l = __ldcg(plse + (attn_i64)s * ROWS);
        if (cap) w[s] = l;
        mx = fmaxf(mx, l);
    }
    mx = attn_mla_merge_reduce(mx, 0, t, n, red);
    float ws = 0.0f;
    for (int s = t; s < splits; s += n) {
        const float x = attn_merge_weight(cap ? w[s] : __ldcg(plse + (attn_i64)s * ROWS), mx);
        if (cap) w[s] = x;
        ws += x;
    }
    ws = attn_mla_merge_reduce(ws, 1, t, n, red);
    /* a sink (sparse MLA: params.sinks) joins the merged row: one more term of the
       denominator with no value (attn_softmax_sink, in natural logs) */
    float lse = attn_softmax_lse2(mx, ws) * ATTN_LN2;
    const float wsink = p.sinks ? attn_softmax_sink(__ldg(p.sinks + head0 + row), lse) : 1.0f;
    const float inv = ws > 0.0f ? wsink / ws : 0.0f;
    if (t == 0 && p.lse) p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] = lse;
    __syncthreads(); /* the weights are in w */

    const int quads = KV_LORA / 4, groups = n >= 2 * quads ? n / quads : 1;
    const float *const po0 = p.partial_o + ((attn_i64)slot0 * ROWS + row) * KV_LORA;
    attn_u32 *const dst = (attn_u32 *)((char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head) * 2);
    auto sum = [&](int c, int g) -> float4 { /* column quad c over splits g, g + groups, ... */
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int s0 = g; s0 < splits; s0 += 8 * groups) {
            float x[8];
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) { /* the batch's reads first */
                const int s = s0 + u * groups;
                x[u] = s >= splits ? 0.0f : cap ? w[s] : attn_merge_weight(__ldcg(plse + (attn_i64)s * ROWS), mx);
                /* an empty split weighs 0, whatever its partial holds */
                v[u] = x[u] > 0.0f ? __ldcg((const float4 *)(po0 + (attn_i64)s * ROWS * KV_LORA + 4 * c))
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                acc.x += x[u] * v[u].x; acc.y += x[u] * v[u].y; acc.z += x[u] * v[u].z; acc.w += x[u] * v[u].w;
            }
        }
        return acc;
    };
    auto store = [&](int c, float4 acc) {
        dst[2 * c] = attn_elem<DT>::pack2(acc.x * inv, acc.y * inv);
        dst[2 * c + 1] = attn_elem<DT>::pack2(acc.z * inv, acc.w * inv);
    };
    if (groups == 1) {
        for (int c = t; c < quads; c += n) store(c, sum(c, 0));
        return;
    }
    const int g = t / quads, c = t % quads; /* threads past groups * quads only meet the barrier */
    float4 acc = g < groups ? sum(c, g) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (g > 0 && g < groups) *(float4 *)(part + ((g - 1) * quads + c) * 4) = acc;
    __syncthreads();
    if (g == 0) {
        for (int k = 1; k < groups; k++) {
            const float4 o = *(const float4 *)(part + ((k - 1) * quads + c) * 4);
            acc.x += o.x; acc.y += o.y; acc.z += o.z; acc.w += o.w;
        }
        store(c, acc);
    }
}

/* attn_mla_merge's body: grid (>= *num_merge, ROWS), one CTA per row of an entry. */
ATTN_DEV void attn_mla_merge_kernel(const attn__mla_decode_params &p) {
    __shared__ float sw[ATTN_MERGE_SW_FLOATS];
    if ((int)blockIdx.x >= *p.num_merge) return;
    attn_mla_merge_row(p, blockIdx.x, blockIdx.y, threadIdx.x, blockDim.x, sw);
}

#endif /* ATTN_MLA_MERGE_CUH */
