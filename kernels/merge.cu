/* merge.cu - the LSE merge of two partial attention results (attn_merge_attn_states; the
   CPU form is attn__cpu_merge_attn_states).

   attn_merge_attn_states                          defines: HEAD_DIM DT
       For every (token, head):
           a = lse_a (base e, or base 2 when base_a is 1, then converted), b likewise;
           an LSE that is -inf or +inf means an empty partition: it contributes
           nothing, whatever its output row holds (NaN included); a NaN LSE (a partial
           whose inputs held a NaN) makes the row's out and lse NaN;
           both empty:  out = 0, lse = -inf;
           else         m = max(a, b), wa = exp(a - m) (0 if a is empty), wb likewise,
                        out = (wa * out_a + wb * out_b) / (wa + wb)   (rounded to DT, RNE)
                        lse = m + log(wa + wb), written in base_out (0 e, 1 two) if lse != 0.
       out_a, out_b, out: DT [tokens, heads, HEAD_DIM] (element strides per token and per
       head, last dimension contiguous); lse_*: f32 [tokens, heads] (element strides).
       out may alias out_a or out_b, and lse may alias lse_a or lse_b, element for element:
       each row is read completely before any of it is written.

   attn_dcp_combine                                defines: HEAD_DIM DT
       The same for n = 1..64 inputs (decode context parallelism's ranks, attn_dcp_combine):
       m = the largest non-empty LSE, w_i = exp(lse_i - m) (0 if empty), out = sum w_i out_i
       / sum w_i, lse = m + log(sum w_i); all empty: out 0, lse -inf. The inputs share their
       strides (attn__combine_params); out may alias an input element for element. With
       params.vec16 (the host checked that every row is 16-byte aligned) a lane reads 16 bytes
       of up to 8 inputs before it uses any (issue 25: the scalar loop it replaced waited on
       each load in turn).

   Launch (both): 1-D, any grid (a grid-stride loop over rows), 128 threads (a multiple of 32), no
   shared memory. A row is handled by LANES lanes of one warp (below), 8 elements per lane
   and step with 16-byte accesses when HEAD_DIM % 8 == 0 and the row is 16-byte aligned.
   HEAD_DIM: any positive size. DT: 0 f32, 1 f16, 2 bf16. */
#include "attn_common.cuh"
#include "attn_params.cuh" /* attn__merge_params */

#if !defined(HEAD_DIM) || !defined(DT)
#error "merge.cu: define HEAD_DIM and DT"
#endif


/* Lanes per row: enough for one pass over the 8-element chunks (a power of two <= 32). */
#define ATTN_MERGE_CHUNKS ((HEAD_DIM + 7) / 8)
#define ATTN_MERGE_LANES (ATTN_MERGE_CHUNKS >= 32 ? 32 : ATTN_MERGE_CHUNKS > 8 ? (ATTN_MERGE_CHUNKS > 16 ? 32 : 16) \
                          : ATTN_MERGE_CHUNKS > 4 ? 8 : ATTN_MERGE_CHUNKS > 2 ? 4 : ATTN_MERGE_CHUNKS > 1 ? 2 : 1)

/* attn_dcp_combine: inputs whose loads are issued together (W = 2, 4, 8 in one batch). */
#define ATTN_COMBINE_BATCH 8

/* An LSE in base e, with both kinds of "empty" (+inf, -inf) as -inf; NaN stays NaN. */
ATTN_DEV float attn_merge_lse_in(float x, int base2) {
    if (base2) x *= ATTN_LN2;
    return x == attn_inf() ? attn_neg_inf() : x;
}

/* The grid-stride loop over (token, head) rows both kernels share, ATTN_MERGE_LANES lanes of
   a warp a row:
       for (attn_i64 base = attn_merge_first_row(); base < rows; base += attn_merge_row_step())
   and this lane's row of `base` (valid 0 past the last row, where t = h = 0). Every lane of a
   warp runs the same iterations, so a loop body may __syncwarp. */
ATTN_DEV attn_i64 attn_merge_first_row(void) {
    return ((attn_i64)blockIdx.x * blockDim.x + threadIdx.x) / 32 * (32 / ATTN_MERGE_LANES);
}
ATTN_DEV attn_i64 attn_merge_row_step(void) { return (attn_i64)gridDim.x * blockDim.x / 32 * (32 / ATTN_MERGE_LANES); }
ATTN_DEV int attn_merge_row(attn_i64 base, attn_i64 rows, int num_heads, int &t, int &h) {
    const attn_i64 row = base + (threadIdx.x & 31) / ATTN_MERGE_LANES;
    const int valid = row < rows;
    t = valid ? (int)(row / num_heads) : 0;
    h = valid ? (int)(row - (attn_i64)t * num_heads) : 0;
    return valid;
}

extern "C" __global__ void __launch_bounds__(128) attn_merge_attn_states(const attn__merge_params p) {
    typedef typename attn_elem<DT>::storage elem_t;
    const int esz = attn_elem<DT>::size;
    const int sub = (threadIdx.x & 31) % ATTN_MERGE_LANES;
    const attn_i64 rows = (attn_i64)p.num_tokens * p.num_heads;
    for (attn_i64 base = attn_merge_first_row(); base < rows; base += attn_merge_row_step()) {
        int t, h;
        const int valid = attn_merge_row(base, rows, p.num_heads, t, h);
        float a = attn_neg_inf(), b = attn_neg_inf();
        if (valid) {
            a = attn_merge_lse_in(p.lse_a[t * p.lse_a_stride_token + h * p.lse_a_stride_head], p.base_a);
            b = attn_merge_lse_in(p.lse_b[t * p.lse_b_stride_token + h * p.lse_b_stride_head], p.base_b);
        }
        float m = attn_fmax_nan(a, b), wa = 0.0f, wb = 0.0f, inv = 0.0f, l = attn_neg_inf();
        if (!(m <= attn_neg_inf())) { /* a NaN m (a NaN partial) comes in too: inv and l turn NaN */
            wa = a == attn_neg_inf() ? 0.0f : expf(a - m);
            wb = b == attn_neg_inf() ? 0.0f : expf(b - m);
            inv = attn_rcp(wa + wb); /* wa + wb is in [1, 2] */
            l = m + logf(wa + wb);
        }
        const char *pa = (const char *)p.out_a + (t * p.out_a_stride_token + h * p.out_a_stride_head) * esz;
        const char *pb = (const char *)p.out_b + (t * p.out_b_stride_token + h * p.out_b_stride_head) * esz;
        char *po = (char *)p.out + (t * p.out_stride_token + h * p.out_stride_head) * esz;
        if (valid) {
            /* Each element is read and written by the same lane, so out may alias a or b. */
            if (HEAD_DIM % 8 == 0 && attn_aligned16(pa) && attn_aligned16(pb) && attn_aligned16(po)) {
                for (int c = sub; c < ATTN_MERGE_CHUNKS; c += ATTN_MERGE_LANES) {
                    attn_vec16 va[2], vb[2], vo[2];
                    float fa[8], fb[8], fo[8];
                    const int off = c * 8 * esz;
                    va[0] = attn_ld16(pa + off);
                    vb[0] = attn_ld16(pb + off);
                    if (esz == 4) { va[1] = attn_ld16(pa + off + 16); vb[1] = attn_ld16(pb + off + 16); }
                    attn_unpack8<DT>(va, fa);
                    attn_unpack8<DT>(vb, fb);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        float x = wa > 0.0f ? wa * fa[i] : 0.0f, y = wb > 0.0f ? wb * fb[i] : 0.0f;
                        fo[i] = (x + y) * inv; /* both empty: inv = 0 -> 0 */
                    }
                    attn_pack8<DT>(fo, vo);
                    attn_stg16(po + off, vo[0]);
                    if (esz == 4) attn_stg16(po + off + 16, vo[1]);
                }
            } else {
                for (int x = sub; x < HEAD_DIM; x += ATTN_MERGE_LANES) {
                    float va = wa > 0.0f ? wa * attn_elem<DT>::to_f32(((const elem_t *)pa)[x]) : 0.0f;
                    float vb = wb > 0.0f ? wb * attn_elem<DT>::to_f32(((const elem_t *)pb)[x]) : 0.0f;
                    ((elem_t *)po)[x] = attn_elem<DT>::from_f32((va + vb) * inv);
                }
            }
        }
        /* lse may alias lse_a/lse_b: every lane of the row has read them above. */
        __syncwarp();
        if (valid && sub == 0 && p.lse)
            p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = p.base_out ? l * ATTN_LOG2E : l;
    }
}

extern "C" __global__ void __launch_bounds__(128) attn_dcp_combine(const attn__combine_params p) {
    typedef typename attn_elem<DT>::storage elem_t;
    const int esz = attn_elem<DT>::size;
    const int sub = (threadIdx.x & 31) % ATTN_MERGE_LANES;
    const attn_i64 rows = (attn_i64)p.num_tokens * p.num_heads;
    for (attn_i64 base = attn_merge_first_row(); base < rows; base += attn_merge_row_step()) {
        int t, h;
        const int valid = attn_merge_row(base, rows, p.num_heads, t, h);
        const attn_i64 li = t * p.lse_in_stride_token + h * p.lse_in_stride_head;
        const attn_i64 oi = (t * p.in_stride_token + h * p.in_stride_head) * esz;
        const int n = valid ? p.n : 0;
        /* m and sum over the inputs' LSEs, ATTN_COMBINE_BATCH loads in flight at a time */
        float m = attn_neg_inf(), sum = 0.0f, inv = 0.0f, l = attn_neg_inf();
        for (int i0 = 0; i0 < n; i0 += ATTN_COMBINE_BATCH) {
            float y[ATTN_COMBINE_BATCH];
#pragma unroll
            for (int u = 0; u < ATTN_COMBINE_BATCH; u++)
                y[u] = i0 + u < n ? attn_merge_lse_in(p.lses[i0 + u][li], 0) : attn_neg_inf();
#pragma unroll
            for (int u = 0; u < ATTN_COMBINE_BATCH; u++) m = attn_fmax_nan(m, y[u]); /* a NaN input: m NaN */
        }
        if (!(m <= attn_neg_inf())) { /* a NaN m (a NaN input) comes in too: inv and l turn NaN */
            for (int i0 = 0; i0 < n; i0 += ATTN_COMBINE_BATCH) {
                float y[ATTN_COMBINE_BATCH];
#pragma unroll
                for (int u = 0; u < ATTN_COMBINE_BATCH; u++)
                    y[u] = i0 + u < n ? attn_merge_lse_in(p.lses[i0 + u][li], 0) : attn_neg_inf();
#pragma unroll
                for (int u = 0; u < ATTN_COMBINE_BATCH; u++) sum += y[u] == attn_neg_inf() ? 0.0f : expf(y[u] - m);
            }
            inv = attn_rcp(sum); /* sum is in [1, n] */
            l = m + logf(sum);
        }
        char *po = (char *)p.out + (t * p.out_stride_token + h * p.out_stride_head) * esz;
        /* Each element is read (from every input) and written by the same lane, so out may
           alias an input. An input whose LSE is empty weighs 0 whatever its row holds. */
        if (valid && HEAD_DIM % 8 == 0 && p.vec16) {
            for (int c = sub; c < ATTN_MERGE_CHUNKS; c += ATTN_MERGE_LANES) {
                const int off = c * 8 * esz;
                float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                for (int i0 = 0; i0 < n; i0 += ATTN_COMBINE_BATCH) { /* all empty: every w is 0 */
                    attn_vec16 v[ATTN_COMBINE_BATCH][2];
                    float w[ATTN_COMBINE_BATCH];
#pragma unroll
                    for (int u = 0; u < ATTN_COMBINE_BATCH; u++) { /* the batch's loads first */
                        const int in = i0 + u < n;
                        const float y = in ? attn_merge_lse_in(p.lses[i0 + u][li], 0) : attn_neg_inf();
                        const char *src = (const char *)p.outs[attn_imin(i0 + u, n - 1)] + oi + off;
                        w[u] = y == attn_neg_inf() ? 0.0f : expf(y - m);
                        v[u][0] = attn_ld16(src);
                        if (esz == 4) v[u][1] = attn_ld16(src + 16);
                    }
#pragma unroll
                    for (int u = 0; u < ATTN_COMBINE_BATCH; u++) {
                        float f[8];
                        attn_unpack8<DT>(v[u], f);
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[e] += w[u] > 0.0f ? w[u] * f[e] : 0.0f;
                    }
                }
                attn_vec16 vo[2];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[e] *= inv; /* all empty: inv = 0 -> 0 */
                attn_pack8<DT>(acc, vo);
                attn_stg16(po + off, vo[0]);
                if (esz == 4) attn_stg16(po + off + 16, vo[1]);
            }
        } else if (valid) {
            for (int x = sub; x < HEAD_DIM; x += ATTN_MERGE_LANES) {
                float acc = 0.0f;
                for (int i = 0; i < n && m > attn_neg_inf(); i++) {
                    const float y = attn_merge_lse_in(p.lses[i][li], 0);
                    if (y > attn_neg_inf())
                        acc += expf(y - m) * attn_elem<DT>::to_f32(((const elem_t *)((const char *)p.outs[i] + oi))[x]);
                }
                ((elem_t *)po)[x] = attn_elem<DT>::from_f32(acc * inv); /* all empty: inv = 0 -> 0 */
            }
        }
        __syncwarp();
        if (valid && sub == 0 && p.lse) p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = l;
    }
}
