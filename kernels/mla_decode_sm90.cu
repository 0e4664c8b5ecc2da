/* mla_decode_sm90.cu - MLA absorbed decode on Hopper warpgroup MMA (wgmma), sm_90a: the
   CUDA_MLA_SM90 backend's forward_mqa (and the decode half of its fused attn_mla_forward).

   WHAT IT COMPUTES, WORK LIST, SPLITS, params, merge: exactly kernels/mla_decode.cu's (the
   mma.sync form, sm_80+, the CUDA_MLA backend's; same attn__mla_decode_params, same work
   items, same partial layout with ROWS = 64), for 16-bit DT only.
   Work item (8 int32): {req, head0, q_row, -, key0, key1, slot, merge entry + 1}: the 64
   heads head0 .. head0 + 63 (those below num_heads) of query row q_row over keys [key0,
   key1); slot -1 writes out/lse, slot >= 0 a normalised f32 partial (partial_o[slot][64]
   [KV_LORA], partial_lse[slot][64] base 2). Merge entry: {q_row, head0, splits, first
   slot, fused, ...}. FUSED_MERGE 1 (what the backend compiles): an item with item[7] =
   entry + 1 > 0 is a split of a fused entry (fused = 1): the last of its splits to finish
   merges it in this launch (counter in merge_count, back to 0 after), so a forward is one
   launch. attn_mla_merge, grid (entries, 64), block 256, merges the entries with fused = 0
   (all with FUSED_MERGE 0): one CTA per row, where one CTA merging a whole entry of many
   splits (it reads splits x 128 KiB of partials) would be slow. The backend compiles
   FUSED_MERGE 1 and fuses an entry when splits x its rows <= ATTN_MLA_FUSED_MERGE_MAX,
   which is 0 by default: every split merges in attn_mla_merge, which measured faster on
   the H200 (docs/PERF.md); the fused path stays for that knob and the kernel harness.

   =====================================================================================
   INSIDE A CTA (FlashMLA's shape, written with kernels/wgmma.cuh)
   =====================================================================================
   256 threads = two warpgroups; 64 query rows (heads head0 .. head0 + 63 of one token:
   one wgmma M). Shared memory, every tile 1024-aligned, 128B-swizzled (wgmma.cuh):
       [Q: 64 x D, K-major: D / 64 panels][K: KV_STAGES x (KV_TILE keys x D, K-major)]
       [P: 64 x 64 DT, K-major][row maxima / sums: 2 x 64 f32][row offsets: stages x tile int64]
   = 72 + 144 + 8 KiB + 1.5 KiB + 1 KiB of alignment slack (226.5 KiB) at D = 576, for
   KV_TILE x KV_STAGES = 64 x 2 (default) or 32 x 4 (KW = KV_TILE / 2 keys per warpgroup).
   Tile i + KV_STAGES - 1 is issued when tile i starts (into tile i - 1's stage), so
   KV_STAGES - 1 tiles are in flight while one is computed. Per tile:
     S   warpgroup w: S_w[64][KW] = Q . K[keys KW w ..]^T, wgmma m64nKWk16 ss over D / 16
         steps (the copies of tile i + KV_STAGES - 1 are issued while it runs); masked to
         [key0, key1); row maxima over its KW keys -> shared memory.    barrier
     P   both warpgroups derive the same new row max; p = 2^(s - m) -> P (DT, swizzled) in
         shared memory; lane-partial row sums; fence.proxy.async.  barrier
     PV  warpgroup w: O_w[64][256] (columns 256w ..) = alpha O_w + P . V, V = columns
         256w .. 256w + 255 of the K stage read MN-major (LBO = one 64-column panel),
         wgmma m64n256k16 ss over 4 steps; 128 accumulator registers per thread.
   Epilogue: row sums of both warpgroups through shared memory; O / l out (or the
   partial); lse by warpgroup 0. */
#include "wgmma.cuh"
#include "mla_common.cuh" /* attn__mla_decode_params */

#if !defined(KV_LORA) || !defined(ROPE) || !defined(BLOCK_SIZE) || !defined(DT)
#error "mla_decode_sm90.cu: define KV_LORA, ROPE, BLOCK_SIZE and DT"
#endif
#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16
#error "mla_decode_sm90.cu: DT must be 1 (f16) or 2 (bf16)"
#endif
#if KV_LORA != 512 && KV_LORA != 256
#error "mla_decode_sm90.cu: KV_LORA must be 512 or 256"
#endif
#if ROPE != 64
#error "mla_decode_sm90.cu: ROPE must be 64"
#endif
#ifdef ROWS
#error "mla_decode_sm90.cu: ROWS is always 64 (one wgmma M); do not define it (wgmma.cuh uses the name)"
#endif
#define ROWS 64
#include "mla_merge.cuh" /* attn_mla_merge_entry, attn_mla_merge_kernel */

#ifndef FUSED_MERGE
#define FUSED_MERGE 0 /* 1: the last split of a merge entry merges it (item[7] = entry + 1) */
#endif

#define ATTN_D (KV_LORA + ROPE)
/* Keys per tile and stages of the K ring: 64 x 2 (default) or 32 x 4 (the same 144 KiB,
   three tiles in flight while one is computed). */
#ifndef KV_TILE
#define KV_TILE 64
#endif
#ifndef KV_STAGES
#define KV_STAGES (128 / KV_TILE)
#endif
#if !(KV_TILE == 64 && KV_STAGES == 2) && !(KV_TILE == 32 && (KV_STAGES == 2 || KV_STAGES == 4))
#error "mla_decode_sm90.cu: KV_TILE x KV_STAGES must be 64 x 2, 32 x 2 or 32 x 4"
#endif
#define ATTN_KW (KV_TILE / 2)                 /* keys of S per warpgroup (its wgmma N) */
#define ATTN_THREADS 256
#define ATTN_CW (KV_LORA / 2)                 /* output columns per warpgroup: 256 or 128 */
#define ATTN_OR (ATTN_CW / 2)                 /* O accumulator registers per thread */
#define ATTN_TILE_BYTES (64 * ATTN_D * 2)     /* Q: D / 64 panels of 8 KiB */
#define ATTN_STAGE_BYTES (KV_TILE * ATTN_D * 2) /* one K stage: D / 64 panels of KV_TILE x 128 bytes */
#define ATTN_SQ_OFF 0
#define ATTN_SK_OFF ATTN_TILE_BYTES
#define ATTN_SP_OFF (ATTN_SK_OFF + KV_STAGES * ATTN_STAGE_BYTES)
#define ATTN_SRED_OFF (ATTN_SP_OFF + 64 * 64 * 2)
#define ATTN_SBLK_OFF (ATTN_SRED_OFF + 2 * 64 * 4)
#define ATTN_SMEM_BYTES (ATTN_SBLK_OFF + KV_STAGES * KV_TILE * 8 + 1024) /* + alignment slack */
#if ATTN_SMEM_BYTES > 232448
#error "mla_decode_sm90.cu: shared memory over 227 KiB"
#endif
#define ATTN_CPR (ATTN_D / 8) /* 16-byte chunks per row */
#define ATTN_NC_L (KV_LORA / 8) /* ... of its latent part */
#define ATTN_NC_R (ROPE / 8)    /* ... of its rope part */
#if ATTN_THREADS % ATTN_NC_L || ATTN_THREADS % ATTN_NC_R || (KV_TILE * ATTN_NC_L) % ATTN_THREADS || (KV_TILE * ATTN_NC_R) % ATTN_THREADS
#error "mla_decode_sm90.cu: the loader needs chunks per row that divide the threads"
#endif

extern "C" __constant__ attn__launch_config attn_mla_config = {ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ROWS, 1, KV_STAGES, 8, 1};


extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1) attn_mla_decode(const attn__mla_decode_params p) {
    extern __shared__ attn_vec16 attn_smem[];
    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();
    if ((int)blockIdx.x >= *p.num_work) return;
    const int *item = p.work + 8 * (attn_i64)blockIdx.x;
    const int req = item[0], head0 = item[1], q_row = item[2], slot = item[6];
    const int key0 = item[4], key1 = item[5];
    const int nrows = attn_imin(ROWS, p.num_heads - head0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
    const int g = lane >> 2, tq = lane & 3;
    const attn_u32 smem0 = attn_smem_addr(attn_smem);
    const attn_u32 base = (smem0 + 1023u) & ~1023u;
    char *const smem = (char *)attn_smem + (base - smem0);
    const attn_u32 sQ = base + ATTN_SQ_OFF, sK = base + ATTN_SK_OFF, sP = base + ATTN_SP_OFF;
    float *const sRed = (float *)(smem + ATTN_SRED_OFF);       /* [wg][64] */
    attn_i64 *const sBlk = (attn_i64 *)(smem + ATTN_SBLK_OFF); /* [stage][key] */

    /* ---- Q rows: [q_latent | q_pe], zero past num_heads ---- */
    for (int c = tid; c < ROWS * ATTN_CPR; c += ATTN_THREADS) {
        const int r = c / ATTN_CPR, col = c - r * ATTN_CPR;
        const int valid = r < nrows;
        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,
                                                   p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col)
                                : (const char *)p.q;
        attn_cp_async16_or_zero(sQ + attn_wgmma_swizzle_offset<ROWS>(r, col), src, !valid);
    }

    /* ---- the K ring ---- */
    const int *bt = p.block_table + (attn_i64)req * p.block_table_stride;
    const char *kv = (const char *)p.kv_cache;
    const int tile0 = key1 > key0 ? key0 / KV_TILE * KV_TILE : 0;
    const int ntiles = key1 > key0 ? (key1 - tile0 + KV_TILE - 1) / KV_TILE : 0;
    auto row_off = [&](int j) -> attn_i64 {
        return attn_mla_key_offset(bt, j, key0, key1, BLOCK_SIZE, ATTN_D * 2);
    };
    /* each thread copies fixed 16-byte columns of its rows: the latent part (KV_LORA / 8
       chunks a row) and the rope part (8), shifts instead of a division by D / 8 */
    auto issue = [&](int tile) {
        const int st = tile % KV_STAGES;
        const attn_u32 dst = sK + (attn_u32)(st * ATTN_STAGE_BYTES);
        const attn_i64 *blk = sBlk + st * KV_TILE;
#pragma unroll
        for (int i = 0; i < KV_TILE * ATTN_NC_L / ATTN_THREADS; i++) {
            const int r = tid / ATTN_NC_L + i * (ATTN_THREADS / ATTN_NC_L), col = tid % ATTN_NC_L;
            const attn_i64 off = blk[r];
            attn_cp_async16_or_zero(dst + attn_wgmma_swizzle_offset<KV_TILE>(r, col), kv + (off >= 0 ? off + col * 16 : 0), off < 0);
        }
#pragma unroll
        for (int i = 0; i < KV_TILE * ATTN_NC_R / ATTN_THREADS; i++) {
            const int r = tid / ATTN_NC_R + i * (ATTN_THREADS / ATTN_NC_R), col = ATTN_NC_L + tid % ATTN_NC_R;
            const attn_i64 off = blk[r];
            attn_cp_async16_or_zero(dst + attn_wgmma_swizzle_offset<KV_TILE>(r, col), kv + (off >= 0 ? off + col * 16 : 0), off < 0);
        }
    };
    for (int s = 0; s < KV_STAGES; s++)
        for (int r = tid; r < KV_TILE; r += ATTN_THREADS) sBlk[s * KV_TILE + r] = row_off(tile0 + s * KV_TILE + r);
    __syncthreads();
    /* tiles 0 .. KV_STAGES - 2 in flight, a commit group each (Q with tile 0) */
#pragma unroll
    for (int s = 0; s < KV_STAGES - 1; s++) {
        if (s < ntiles) issue(s);
        attn_cp_async_commit();
    }

    const float qk_scale = p.scale * ATTN_LOG2E;
    const int row_a = 16 * (warp & 3) + g; /* this thread's accumulator rows: row_a, row_a + 8 */
    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};
    float o[ATTN_OR];
#pragma unroll
    for (int i = 0; i < ATTN_OR; i++) o[i] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        attn_cp_async_wait<KV_STAGES - 2>(); /* this thread's part of tile it (and Q) */
        attn_wgmma_fence_smem_writes();
        __syncthreads();                      /* everyone's part; tile it-1's P and stage are free */
        const int st = it % KV_STAGES;
        const int kt = tile0 + it * KV_TILE;
        const attn_u32 sKst = sK + (attn_u32)(st * ATTN_STAGE_BYTES);
        /* row offsets of tile it + KV_STAGES into this stage's slot (tile it's copies are
           done; the slot is read when that tile is issued, the next iteration) */
        for (int r = tid; r < KV_TILE; r += ATTN_THREADS) sBlk[st * KV_TILE + r] = row_off(tile0 + (it + KV_STAGES) * KV_TILE + r);

        /* ---- S_w = Q K[32 wg ..]^T, the next tile's copies under it ---- */
        float s[ATTN_KW / 2];
        attn_wgmma_fence();
#pragma unroll
        for (int k = 0; k < ATTN_D; k += 16)
            attn_wgmma<ATTN_KW, DT>::template ss<0>(s, attn_wgmma_desc_k_major<ROWS>(sQ, k),
                                                    attn_wgmma_desc_k_major<KV_TILE>(sKst + (attn_u32)(wg * ATTN_KW * 128), k),
                                                    k > 0);
        attn_wgmma_commit();
        /* tile it + KV_STAGES - 1 into stage (it - 1) % KV_STAGES: tile it-1's, free since the
           barrier; a commit group every iteration, empty past the last tile */
        if (it + KV_STAGES - 1 < ntiles) issue(it + KV_STAGES - 1);
        attn_cp_async_commit();
        attn_wgmma_wait<0>();
        attn_wgmma_fence_acc(s);

        /* ---- mask, row maxima over this warpgroup's KW keys ---- */
        const int kw0 = kt + ATTN_KW * wg + 2 * tq;
        float mx[2] = {attn_neg_inf(), attn_neg_inf()};
#pragma unroll
        for (int i = 0; i < ATTN_KW / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = kw0 + 8 * i + (e & 1);
                const float x = j >= key0 && j < key1 ? s[4 * i + e] : attn_neg_inf();
                s[4 * i + e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = attn_quad_max(mx[h]);
            if (tq == 0) sRed[wg * 64 + row_a + 8 * h] = mx[h];
        }
        __syncthreads(); /* both warpgroups' maxima */

        /* ---- softmax: P to shared memory ---- */
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = row_a + 8 * h;
            const float mt = fmaxf(sRed[row], sRed[64 + row]);
            const float b = attn_softmax_rebase(m[h], mt * qk_scale, alpha[h]);
            l[h] *= alpha[h];
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < ATTN_KW / 8; i++) {
                const float p0 = attn_exp2(fmaf(s[4 * i + 2 * h], qk_scale, -b));
                const float p1 = attn_exp2(fmaf(s[4 * i + 2 * h + 1], qk_scale, -b));
                sum += p0 + p1;
                const int col = ATTN_KW * wg + 8 * i + 2 * tq; /* key column of P */
                *(attn_u32 *)(smem + ATTN_SP_OFF + attn_wgmma_swizzle_offset<64>(row, col >> 3) + (col & 7) * 2) =
                    attn_elem<DT>::pack2(p0, p1);
            }
            l[h] += sum;
        }
        attn_wgmma_fence_smem_writes(); /* P is read by wgmma (async proxy) */
        __syncthreads();                /* P complete */

        /* ---- O_w = alpha O_w + P V[:, 256 wg ..] ---- */
#pragma unroll
        for (int i = 0; i < ATTN_OR / 4; i++) {
            o[4 * i] *= alpha[0]; o[4 * i + 1] *= alpha[0];
            o[4 * i + 2] *= alpha[1]; o[4 * i + 3] *= alpha[1];
        }
        attn_wgmma_fence(); /* O was written by ordinary instructions */
#pragma unroll
        for (int j = 0; j < KV_TILE / 16; j++)
            attn_wgmma<ATTN_CW, DT>::template ss<1>(o, attn_wgmma_desc_k_major<64>(sP, 16 * j),
                                                    attn_wgmma_desc_mn_major<KV_TILE>(sKst + (attn_u32)(wg * (ATTN_CW / 64) * KV_TILE * 128), 16 * j),
                                                    1);
        attn_wgmma_commit();
        attn_wgmma_wait<0>();
        attn_wgmma_fence_acc(o);
    }

    /* ---- epilogue ---- */
    attn_cp_async_wait<0>();
    __syncthreads(); /* sRed is free */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float lq = attn_quad_sum(l[h]);
        if (tq == 0) sRed[wg * 64 + row_a + 8 * h] = lq;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = row_a + 8 * h;
        const float L = sRed[row] + sRed[64 + row];
        const float inv = L > 0.0f ? attn_rcp(L) : 0.0f;
        const float lse2 = attn_softmax_lse2(m[h], L);
        if (row >= nrows) continue;
        if (slot < 0) {
            char *orow = (char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head) * 2;
#pragma unroll
            for (int i = 0; i < ATTN_OR / 4; i++)
                *(attn_u32 *)(orow + (wg * ATTN_CW + 8 * i + 2 * tq) * 2) =
                    attn_elem<DT>::pack2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
            if (p.lse && wg == 0 && tq == 0)
                p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] = lse2 * ATTN_LN2;
        } else {
            float *po = p.partial_o + ((attn_i64)slot * ROWS + row) * KV_LORA + wg * ATTN_CW;
#pragma unroll
            for (int i = 0; i < ATTN_OR / 4; i++) {
                po[8 * i + 2 * tq] = o[4 * i + 2 * h] * inv;
                po[8 * i + 2 * tq + 1] = o[4 * i + 2 * h + 1] * inv;
            }
            if (wg == 0 && tq == 0) p.partial_lse[(attn_i64)slot * ROWS + row] = lse2;
        }
    }
#if FUSED_MERGE
    /* the last split of the entry to finish merges it (paged_attention.cu's FUSED MERGE) */
    const int mi = item[7] - 1;
    if (slot >= 0 && mi >= 0 && p.merge_count) {
        __shared__ int attn_last_split;
        __threadfence(); /* this CTA's partial is visible device-wide before it is counted */
        __syncthreads();
        if (tid == 0) attn_last_split = atomicAdd(p.merge_count + mi, 1) == p.merge[8 * (attn_i64)mi + 2] - 1;
        __syncthreads();
        if (attn_last_split) {
            __threadfence(); /* the other splits' partials, counted before, are read after */
            attn_mla_merge_entry(p, mi, 0, ROWS, tid, ATTN_THREADS, (float *)smem); /* the stages are free */
            if (tid == 0) p.merge_count[mi] = 0;
        }
    }
#endif
}

/* The merge as its own launch (mla_merge.cuh): grid (entries, ROWS), one CTA per row. */
extern "C" __global__ void __launch_bounds__(256) attn_mla_merge(const attn__mla_decode_params p) {
    attn_mla_merge_kernel(p);
}
