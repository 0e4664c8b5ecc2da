/* mla_decode_sm90_t.cu - MLA absorbed decode for few heads (16 or 32) on wgmma with the KEYS
   on the MMA's M dimension; a draft for issue 9's 16-head target. NOT YET RUN ON A GPU,
   not embedded, not wired.

   WHY: kernels/mla_decode_sm90.cu puts a token's heads on wgmma's M (64 rows); at 16 heads
   three quarters of its tensor work is padding, and a 64-key tile then costs what it costs
   at 64 heads (~3.4 us per SM on the H200), which caps the latent stream at ~2.9 TB/s.
   Here the product is transposed so the work scales with the heads:
       S^T [64 keys][NH] = K [64 keys][576] . Q^T        wgmma m64nNHk16, A = K (K-major),
                                                          B = Q [NH][576] (K-major)
       O^T [512][NH]    += V^T [512][64 keys] . P^T      wgmma m64nNHk16, A = V^T: the K
                                                          stage read MN-major (trans-a),
                                                          B = P^T [NH][64 keys] (K-major)
   i.e. 36 + 32 m64nNHk16 per 64-key tile instead of 72 + 8 m64n{32,256}k16.

   WHAT IT COMPUTES, WORK LIST, SPLITS, params, partials, merge: mla_decode_sm90.cu's
   (same struct attn_mla_params, same items, partial layout [slot][64][KV_LORA] with rows
   0 .. NH - 1 used, merged by that file's attn_mla_merge), with NH (16 or 32) heads per
   item: head0 .. head0 + NH - 1 (those below num_heads). DT 16-bit only.

   INSIDE A CTA: 256 threads, two warpgroups. Shared memory (1024-aligned, 128B-swizzled):
       [Q: NH x 576 K-major][K: 2 stages x 64 keys x 576][P^T: NH x 64][reductions]
   Per 64-key tile: warpgroup 0 computes S^T (36 k-steps) while warpgroup 1 issues the next
   tile's copies; warpgroup 0 masks keys outside [key0, key1), reduces each head's max over
   the tile's 64 keys (quad lanes, then its 4 warps through shared memory), derives the new
   running max and alpha per head (in shared memory for both warpgroups), writes
   P^T = 2^(s - m) to shared memory (bf16/f16) and keeps per-thread partial sums;
   barrier; both warpgroups rescale their O^T by alpha and add V^T . P^T for their 256 of
   the 512 output columns (4 m64 blocks x 4 k-steps). Epilogue: the sums reduced over
   warpgroup 0, O^T / l written per (head, column), lse per head. */
#include "wgmma.cuh"
#include "mla_common.cuh" /* attn_mla_params */

#if !defined(KV_LORA) || !defined(ROPE) || !defined(BLOCK_SIZE) || !defined(DT) || !defined(NH)
#error "mla_decode_sm90_t.cu: define KV_LORA, ROPE, BLOCK_SIZE, DT and NH (16 or 32)"
#endif
#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16
#error "mla_decode_sm90_t.cu: DT must be 1 (f16) or 2 (bf16)"
#endif
#if NH != 16 && NH != 32
#error "mla_decode_sm90_t.cu: NH must be 16 or 32"
#endif
#if KV_LORA != 512 && KV_LORA != 256
#error "mla_decode_sm90_t.cu: KV_LORA must be 512 or 256"
#endif
#if ROPE != 64
#error "mla_decode_sm90_t.cu: ROPE must be 64"
#endif
#ifdef ROWS
#error "mla_decode_sm90_t.cu: do not define ROWS (wgmma.cuh uses the name)"
#endif
#define ROWS 64 /* the partial layout's rows (mla_decode_sm90.cu's) */

#define ATTN_D (KV_LORA + ROPE)
#define KV_TILE 64
#define KV_STAGES 2
#define ATTN_THREADS 256
#define ATTN_MB (KV_LORA / 64 / 2)           /* m64 blocks of O^T per warpgroup */
#define ATTN_SACC (NH / 2)                    /* accumulator registers of one m64nNH */
#define ATTN_Q_BYTES (NH * ATTN_D * 2)
#define ATTN_TILE_BYTES (KV_TILE * ATTN_D * 2)
#define ATTN_SQ_OFF 0
#define ATTN_SK_OFF ((ATTN_Q_BYTES + 1023) / 1024 * 1024)
#define ATTN_SP_OFF (ATTN_SK_OFF + KV_STAGES * ATTN_TILE_BYTES)
#define ATTN_SRED_OFF (ATTN_SP_OFF + ((NH * KV_TILE * 2 + 1023) / 1024 * 1024))
#define ATTN_SRED_FLOATS (4 * NH + 3 * NH)    /* per-warp maxima / sums, m, alpha, l */
#define ATTN_SBLK_OFF (ATTN_SRED_OFF + ATTN_SRED_FLOATS * 4)
#define ATTN_SMEM_BYTES (ATTN_SBLK_OFF + KV_STAGES * KV_TILE * 8 + 1024)
#if ATTN_SMEM_BYTES > 232448
#error "mla_decode_sm90_t.cu: shared memory over 227 KiB"
#endif
#define ATTN_NC_L (KV_LORA / 8)
#define ATTN_NC_R (ROPE / 8)

extern "C" __constant__ int attn_mla_config[8] = {ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, NH, KV_STAGES, 8, 0, 1};


/* wgmma with A read MN-major from shared memory (imm-trans-a 1), B K-major. */
template <int N, int ET> struct attn_wgmma_ta;
#define ATTN__WGMMA_TA_DEFINE(N, R, ET, TY)                                                       \
    template <> struct attn_wgmma_ta<N, ET> {                                                     \
        static ATTN_DEV void ss(float (&d)[R], attn_u64 desc_a, attn_u64 desc_b, int scale_d) {   \
            asm volatile(ATTN__WG_ASM(N, R, TY, SS, "1, 1, 1, 0")                                 \
                         : ATTN__WG_D##R(0) : "l"(desc_a), "l"(desc_b), "r"(scale_d) : "memory"); \
        }                                                                                         \
    };
ATTN__WGMMA_TA_DEFINE(16, 8, ATTN_DT_F16, "f16")
ATTN__WGMMA_TA_DEFINE(16, 8, ATTN_DT_BF16, "bf16")
ATTN__WGMMA_TA_DEFINE(32, 16, ATTN_DT_F16, "f16")
ATTN__WGMMA_TA_DEFINE(32, 16, ATTN_DT_BF16, "bf16")

extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1) attn_mla_decode(const attn_mla_params p) {
    extern __shared__ attn_vec16 attn_smem[];
    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();
    if ((int)blockIdx.x >= *p.num_work) return;
    const int *item = p.work + 8 * (attn_i64)blockIdx.x;
    const int req = item[0], head0 = item[1], q_row = item[2], slot = item[6];
    const int key0 = item[4], key1 = item[5];
    const int nheads = attn_imin(NH, p.num_heads - head0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7, w4 = warp & 3;
    const int g = lane >> 2, tq = lane & 3;
    const attn_u32 smem0 = attn_smem_addr(attn_smem);
    const attn_u32 base = (smem0 + 1023u) & ~1023u;
    char *const smem = (char *)attn_smem + (base - smem0);
    const attn_u32 sQ = base + ATTN_SQ_OFF, sK = base + ATTN_SK_OFF, sP = base + ATTN_SP_OFF;
    float *const sRed = (float *)(smem + ATTN_SRED_OFF); /* [4][NH] per-warp values */
    float *const sM = sRed + 4 * NH, *const sAlpha = sM + NH, *const sL = sAlpha + NH;
    attn_i64 *const sBlk = (attn_i64 *)(smem + ATTN_SBLK_OFF);

    /* ---- Q: NH heads x [q_latent | q_pe], zero past num_heads ---- */
    for (int c = tid; c < NH * (ATTN_D / 8); c += ATTN_THREADS) {
        const int r = c / (ATTN_D / 8), col = c - r * (ATTN_D / 8), valid = r < nheads;
        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,
                                                   p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col)
                                : (const char *)p.q;
        attn_cp_async16_or_zero(sQ + attn_wgmma_swizzle_offset<NH>(r, col), src, !valid);
    }
    for (int r = tid; r < NH; r += ATTN_THREADS) { sM[r] = attn_neg_inf(); sAlpha[r] = 1.0f; }

    /* ---- the K ring (mla_decode_sm90.cu's), issued by all threads for tile 0, then by
       warpgroup 1 while warpgroup 0 computes S^T ---- */
    const int *bt = p.block_table + (attn_i64)req * p.block_table_stride;
    const char *kv = (const char *)p.kv_cache;
    const int tile0 = key1 > key0 ? key0 / KV_TILE * KV_TILE : 0;
    const int ntiles = key1 > key0 ? (key1 - tile0 + KV_TILE - 1) / KV_TILE : 0;
    auto row_off = [&](int j) -> attn_i64 {
        return attn_mla_key_offset(bt, j, key0, key1, BLOCK_SIZE, ATTN_D * 2);
    };
    auto issue = [&](int tile, int t, int nthreads) {
        const int st = tile % KV_STAGES;
        const attn_u32 dst = sK + (attn_u32)(st * ATTN_TILE_BYTES);
        const attn_i64 *blk = sBlk + st * KV_TILE;
        for (int c = t; c < KV_TILE * ATTN_NC_L; c += nthreads) {
            const int r = c / ATTN_NC_L, col = c % ATTN_NC_L;
            const attn_i64 off = blk[r];
            attn_cp_async16_or_zero(dst + attn_wgmma_swizzle_offset<KV_TILE>(r, col), kv + (off >= 0 ? off + col * 16 : 0), off < 0);
        }
        for (int c = t; c < KV_TILE * ATTN_NC_R; c += nthreads) {
            const int r = c / ATTN_NC_R, col = ATTN_NC_L + c % ATTN_NC_R;
            const attn_i64 off = blk[r];
            attn_cp_async16_or_zero(dst + attn_wgmma_swizzle_offset<KV_TILE>(r, col), kv + (off >= 0 ? off + col * 16 : 0), off < 0);
        }
    };
    for (int s = 0; s < KV_STAGES; s++)
        for (int r = tid; r < KV_TILE; r += ATTN_THREADS) sBlk[s * KV_TILE + r] = row_off(tile0 + s * KV_TILE + r);
    __syncthreads();
    issue(0, tid, ATTN_THREADS);
    attn_cp_async_commit(); /* with Q */

    const float qk_scale = p.scale * ATTN_LOG2E;
    float lp[ATTN_SACC];          /* warpgroup 0: partial sums of P^T per (its key rows, head column) */
    float o[ATTN_MB][ATTN_SACC];  /* O^T blocks of this warpgroup */
#pragma unroll
    for (int i = 0; i < ATTN_SACC; i++) lp[i] = 0.0f;
#pragma unroll
    for (int b = 0; b < ATTN_MB; b++)
#pragma unroll
        for (int i = 0; i < ATTN_SACC; i++) o[b][i] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        attn_cp_async_wait<0>();
        attn_wgmma_fence_smem_writes();
        __syncthreads(); /* tile it and Q visible; tile it - 1's P^T and stage are free */
        const int st = it % KV_STAGES, kt = tile0 + it * KV_TILE;
        const attn_u32 sKst = sK + (attn_u32)(st * ATTN_TILE_BYTES);
        for (int r = tid; r < KV_TILE; r += ATTN_THREADS) sBlk[st * KV_TILE + r] = row_off(tile0 + (it + KV_STAGES) * KV_TILE + r);
        /* sBlk of stage st is read by the issue of tile it + 2, after the next barriers */
        if (wg == 0) {
            /* ---- S^T = K Q^T ---- */
            float s[ATTN_SACC];
            attn_wgmma_fence();
#pragma unroll
            for (int k = 0; k < ATTN_D; k += 16)
                attn_wgmma<NH, DT>::template ss<0>(s, attn_wgmma_desc_k_major<KV_TILE>(sKst, k), attn_wgmma_desc_k_major<NH>(sQ, k), k > 0);
            attn_wgmma_commit();
            attn_wgmma_wait<0>();
            attn_wgmma_fence_acc(s);
            /* mask; each head's max over this warp's 16 keys, then to shared memory */
#pragma unroll
            for (int i = 0; i < NH / 8; i++)
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    float mx = attn_neg_inf();
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int j = kt + 16 * w4 + g + 8 * h;
                        float x = s[4 * i + 2 * h + b];
                        if (j < key0 || j >= key1) x = attn_neg_inf();
                        s[4 * i + 2 * h + b] = x;
                        mx = fmaxf(mx, x);
                    }
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                    if (g == 0) sRed[w4 * NH + 8 * i + 2 * tq + b] = mx;
                }
            asm volatile("bar.sync 1, 128;" ::: "memory"); /* warpgroup 0's maxima */
            /* the new running max and alpha of this thread's head columns (every thread of
               warpgroup 0 derives the same values from shared memory; all read the old max
               before one thread per head stores the new one) */
            float mnew[NH / 8][2], alpha[NH / 8][2];
#pragma unroll
            for (int i = 0; i < NH / 8; i++)
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    const int c = 8 * i + 2 * tq + b;
                    const float mt = fmaxf(fmaxf(sRed[c], sRed[NH + c]), fmaxf(sRed[2 * NH + c], sRed[3 * NH + c]));
                    const float mold = sM[c];
                    mnew[i][b] = fmaxf(mold, mt * qk_scale);
                    alpha[i][b] = attn_exp2(mold - (mnew[i][b] == attn_neg_inf() ? 0.0f : mnew[i][b]));
                }
            asm volatile("bar.sync 1, 128;" ::: "memory"); /* the old maxima are read */
#pragma unroll
            for (int i = 0; i < NH / 8; i++)
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    const int c = 8 * i + 2 * tq + b;
                    const float bb = mnew[i][b] == attn_neg_inf() ? 0.0f : mnew[i][b];
                    lp[2 * i + b] *= alpha[i][b]; /* lp[2i + b]: this thread's partial sum of head c */
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = 16 * w4 + g + 8 * h; /* key row of the tile */
                        const float pv = attn_exp2(fmaf(s[4 * i + 2 * h + b], qk_scale, -bb));
                        lp[2 * i + b] += pv;
                        *(attn_u16 *)(smem + ATTN_SP_OFF + attn_wgmma_swizzle_offset<NH>(c, r >> 3) + (r & 7) * 2) =
                            attn_elem<DT>::from_f32(pv);
                    }
                    if (w4 == 0 && g == 0) { sAlpha[c] = alpha[i][b]; sM[c] = mnew[i][b]; }
                }
        } else {
            if (it + 1 < ntiles) issue(it + 1, tid - 128, 128); /* under warpgroup 0's S^T */
        }
        attn_cp_async_commit();
        attn_wgmma_fence_smem_writes(); /* P^T is read by wgmma (async proxy) */
        __syncthreads();                /* P^T, alpha, m complete */

        /* ---- O^T = alpha O^T + V^T P^T, this warpgroup's 4 m64 blocks of columns ---- */
        {
            float al[ATTN_SACC / 2 * 2];
#pragma unroll
            for (int i = 0; i < NH / 8; i++) {
                al[2 * i] = sAlpha[8 * i + 2 * tq];
                al[2 * i + 1] = sAlpha[8 * i + 2 * tq + 1];
            }
#pragma unroll
            for (int b = 0; b < ATTN_MB; b++)
#pragma unroll
                for (int i = 0; i < NH / 8; i++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        o[b][4 * i + 2 * h] *= al[2 * i];
                        o[b][4 * i + 2 * h + 1] *= al[2 * i + 1];
                    }
        }
        attn_wgmma_fence();
#pragma unroll
        for (int b = 0; b < ATTN_MB; b++) {
            const attn_u32 vblk = sKst + (attn_u32)((wg * ATTN_MB + b) * KV_TILE * 128); /* panel of 64 columns */
#pragma unroll
            for (int kk = 0; kk < KV_TILE / 16; kk++)
                attn_wgmma_ta<NH, DT>::ss(o[b], attn_wgmma_desc_mn_major<KV_TILE>(vblk, 16 * kk),
                                          attn_wgmma_desc_k_major<NH>(sP, 16 * kk), 1);
        }
        attn_wgmma_commit();
        attn_wgmma_wait<0>();
#pragma unroll
        for (int b = 0; b < ATTN_MB; b++) attn_wgmma_fence_acc(o[b]);
    }

    /* ---- epilogue: each head's sum over warpgroup 0, O^T / l out ---- */
    attn_cp_async_wait<0>();
    __syncthreads();
    if (wg == 0) {
#pragma unroll
        for (int i = 0; i < NH / 8; i++)
#pragma unroll
            for (int b = 0; b < 2; b++) {
                float v = lp[2 * i + b];
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                if (g == 0) sRed[w4 * NH + 8 * i + 2 * tq + b] = v;
            }
    }
    __syncthreads();
    if (tid < NH) sL[tid] = sRed[tid] + sRed[NH + tid] + sRed[2 * NH + tid] + sRed[3 * NH + tid];
    __syncthreads();
    if (tid < nheads) {
        const float L = sL[tid];
        const float lse2 = L > 0.0f ? sM[tid] + attn_log2(L) : attn_neg_inf();
        if (slot < 0) {
            if (p.lse) p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + tid) * p.lse_stride_head] = lse2 * ATTN_LN2;
        } else {
            p.partial_lse[(attn_i64)slot * ROWS + tid] = lse2;
        }
    }
#pragma unroll
    for (int i = 0; i < NH / 8; i++)
#pragma unroll
        for (int bb = 0; bb < 2; bb++) {
            const int c = 8 * i + 2 * tq + bb; /* head */
            const float L = sL[c];
            const float inv = L > 0.0f ? attn_rcp(L) : 0.0f;
            if (c >= nheads) continue;
#pragma unroll
            for (int b = 0; b < ATTN_MB; b++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int col = (wg * ATTN_MB + b) * 64 + 16 * w4 + g + 8 * h;
                    const float x = o[b][4 * i + 2 * h + bb] * inv;
                    if (slot < 0)
                        attn_store<DT>(p.out, (attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + c) * p.out_stride_head + col, x);
                    else
                        p.partial_o[((attn_i64)slot * ROWS + c) * KV_LORA + col] = x;
                }
        }
}
