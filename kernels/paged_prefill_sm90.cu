/* paged_prefill_sm90.cu - paged-attention prefill on Hopper warpgroup MMA (wgmma), sm_90a.

   The prefill tiles of the CUDA_SM90 backend (attn.h: a layer whose tensors are on a
   device of compute capability 9.0 and whose shape is in the scope below; its decode tiles
   and cache write are the CUDA backend's). Compiled for sm_90a only (wgmma does not exist
   in plain sm_90). Checked on an H200 against the CPU backend by tests/cuda_kernels.c
   --sm90-prefill (every random prefill-shaped case in scope, compute-sanitizer memcheck
   and racecheck clean) and by the CUDA suite through the backend.

   =====================================================================================
   WHAT IT COMPUTES
   =====================================================================================
   Exactly kernels/paged_attention.cu's function (its top comment: WHAT IT COMPUTES, the
   WORK LIST, the params struct) for a narrower scope:
     - q and cache of one 16-bit type: DT_Q == DT_KV, 1 (f16) or 2 (bf16);
     - HEAD_DIM 64 or 128; any GROUP, TILE_TOKENS * GROUP <= 128 rows (padded to 128);
       BLOCK_SIZE a multiple of 16;
     - WINDOW 0 or 1 (window from params as there); SOFTCAP and ALIBI 0 (#error else);
     - work items that write out/lse: slot -1 (prefill items are never split; a slot >= 0
       traps). Causality per work item (flags bit 0), as there.
   Query token t of a work item sits at pos = seq_len - query_len + tok0 + t; key j is
   visible iff lo <= j < hi (lo, hi as in paged_attention.cu, clamped to [key0, key1)).
   Scores in base 2 with the scale folded in: s = q.k * scale * log2(e); out = sum_j
   2^(s_j - m) v_j / sum_j 2^(s_j - m), rounded to DT_Q; lse = (m + log2 l) * ln 2 (base
   e); a row that sees no key gets out = 0 and lse = -inf.

   =====================================================================================
   LAUNCH
   =====================================================================================
   attn_paged_prefill_sm90: grid (>= *num_work), block 256 (attn_paged_config.threads), dynamic
   shared memory attn_paged_config.shared_bytes (set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
   sm_90a only (compute capability 9.0). One CTA per SM (two warpgroups at up
   to 255 registers fill the register file). CTAs past *num_work exit. The same params and
   work list as attn_paged_attention: the host drives it with the prefill variant's
   schedule (TILE_TOKENS = attn_paged_config.tile_tokens). The config (an extern "C"
   __constant__ attn__launch_config named as paged_attention.cu's, so one loader reads both):
   {threads, dynamic shared bytes, KV_TILE, TILE_TOKENS * GROUP, TILE_TOKENS, KV_STAGES, 0, 1}.

   =====================================================================================
   INSIDE A CTA (FlashAttention-3's compute, FlashAttention-2's pipeline)
   =====================================================================================
   256 threads = two consumer warpgroups, no producer warpgroup. Warpgroup w owns query
   rows 64w .. 64w + 63 of the 128-row tile (row R = token R / GROUP, head member
   R % GROUP; rows >= ntok * GROUP are padding: zero Q, never stored).
   Shared memory (dynamic, base rounded up to 1024 at run time; every tile 1024-aligned):
       [Q: 128 rows x HEAD_DIM, 128B-swizzled K-major (wgmma.cuh), HEAD_DIM / 64 panels]
       [K: KV_STAGES x (KV_TILE rows x HEAD_DIM, swizzled K-major: the B of S = Q K^T)]
       [V: KV_STAGES x (KV_TILE keys x HEAD_DIM, swizzled, read MN-major: the B of P V)]
       [sBlk: KV_STAGES x KV_TILE int64: cache byte offset of each key row in flight]
       [bounds: 8 warps x 4 int: the warps' lo/hi extremes, reduced per warpgroup]
   The epilogue reuses the K/V stages for O in DT_Q, 128 rows x (HEAD_DIM + 8).
   Loader (all 256 threads, as paged_attention.cu's): tiles of KV_TILE keys aligned to
   multiples of KV_TILE from floor(key0 / KV_TILE) * KV_TILE to key1; each thread copies
   fixed 16-byte chunks of K and V with cp.async into stage tile % KV_STAGES at their
   swizzled position; keys outside [key0, key1) are zero-filled (cp.async ignore-src) and
   their block_table entries never read. Q goes with tile 0's group.
   Per tile (one __syncthreads): cp.async wait for the tile, fence.proxy.async (this
   thread's generic-proxy writes, cp.async included, become visible to wgmma's async
   proxy), __syncthreads (everyone's part; the stage about to be refilled is free: both
   warpgroups' wgmma on it completed, wgmma.wait_group 0), then per warpgroup (tile it +
   KV_STAGES - 1 is issued between S's commit and its wait, LOAD_UNDER_S 1, or before S
   with LOAD_UNDER_S 0; by every thread on both branches of the skip), unless none of its 64 rows sees a key of the tile (causal tiles
   above the diagonal, window tiles before it: uniform over the warpgroup, from the
   per-warpgroup bounds):
       S[64][KV_TILE] = Q K^T     wgmma ss m64nKV_TILEk16, HEAD_DIM / 16 steps, wait 0
       online softmax in f32 registers, base 2 (each thread holds 2 rows; a row's max and
       sum over the 4 lanes q = 0..3 by shuffles; masking only on tiles that cross a
       visible-range edge of some row); O rescaled by 2^(m_old - m_new)
       O[64][HEAD_DIM] += P V     P packed to DT_Q from the S accumulator as the register
                                  A operand (attn_wgmma_a_from_acc), wgmma rs
                                  m64nHEAD_DIMk16 tnspB 1, KV_TILE / 16 steps, wait 0
   Epilogue: l summed over the row's 4 lanes; O / l to shared memory in DT_Q, lse (base e)
   straight to global; __syncthreads; 16-byte rows out (element stores when q/out rows are
   not 16-byte aligned).
   Not yet (FlashAttention-3 proper): a TMA/producer warpgroup with mbarriers, softmax of
   tile it overlapped with S of tile it + 1 inside a warpgroup, ping-pong named barriers
   between the two warpgroups, setmaxnreg. */
#include "paged_common.cuh" /* attn__paged_params, attn_visible_keys, as paged_attention.cu */
#include "online_softmax.cuh"
#include "wgmma.cuh"

#if !defined(HEAD_DIM) || !defined(BLOCK_SIZE) || !defined(GROUP) || !defined(DT_Q) || \
    !defined(DT_KV) || !defined(TILE_TOKENS)
#error "paged_prefill_sm90.cu: define HEAD_DIM, BLOCK_SIZE, GROUP, DT_Q, DT_KV and TILE_TOKENS"
#endif
#if HEAD_DIM != 64 && HEAD_DIM != 128
#error "paged_prefill_sm90.cu: HEAD_DIM must be 64 or 128"
#endif
#if DT_Q != DT_KV || (DT_Q != ATTN_DT_F16 && DT_Q != ATTN_DT_BF16)
#error "paged_prefill_sm90.cu: q and cache must be one 16-bit type (DT_Q == DT_KV, 1 or 2)"
#endif
#if BLOCK_SIZE % 16 != 0 || BLOCK_SIZE <= 0
#error "paged_prefill_sm90.cu: BLOCK_SIZE must be a positive multiple of 16"
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#if defined(SOFTCAP) && SOFTCAP
#error "paged_prefill_sm90.cu: no soft cap (SOFTCAP 1 takes paged_attention.cu)"
#endif
#if defined(ALIBI) && ALIBI
#error "paged_prefill_sm90.cu: no ALiBi (ALIBI 1 takes paged_attention.cu)"
#endif
#if WINDOW != 0 && WINDOW != 1
#error "paged_prefill_sm90.cu: WINDOW must be 0 or 1"
#endif

#define ATTN_ROWS (TILE_TOKENS * GROUP)
#if TILE_TOKENS < 1 || GROUP < 1 || ATTN_ROWS > 128
#error "paged_prefill_sm90.cu: need TILE_TOKENS >= 1, GROUP >= 1 and TILE_TOKENS * GROUP <= 128"
#endif
#define ATTN_ROWS_PAD 128
#define ATTN_THREADS 256
#define ATTN_ESZ 2

#ifndef KV_TILE
#define KV_TILE 128
#endif
#if KV_TILE != 64 && KV_TILE != 128
#error "paged_prefill_sm90.cu: KV_TILE must be 64 or 128"
#endif

#define ATTN_SQ_BYTES (ATTN_ROWS_PAD * HEAD_DIM * ATTN_ESZ)
#define ATTN_TILE_BYTES (KV_TILE * HEAD_DIM * ATTN_ESZ) /* one K (or V) stage */
#define ATTN_SMEM_LIMIT (227 * 1024)
/* the bytes past the K/V stages: sBlk, bounds, and the slack that aligns the base */
#define ATTN_EXTRA_BYTES(stages) ((stages) * KV_TILE * 8 + 128 + 1024)
#ifndef KV_STAGES
#if ATTN_SQ_BYTES + 3 * 2 * ATTN_TILE_BYTES + ATTN_EXTRA_BYTES(3) <= ATTN_SMEM_LIMIT
#define KV_STAGES 3
#else
#define KV_STAGES 2
#endif
#endif
#if KV_STAGES != 2 && KV_STAGES != 3
#error "paged_prefill_sm90.cu: KV_STAGES must be 2 or 3"
#endif
#define ATTN_SK_OFF ATTN_SQ_BYTES
#define ATTN_SV_OFF (ATTN_SK_OFF + KV_STAGES * ATTN_TILE_BYTES)
#define ATTN_SBLK_OFF (ATTN_SV_OFF + KV_STAGES * ATTN_TILE_BYTES)
#define ATTN_BOUNDS_OFF (ATTN_SBLK_OFF + KV_STAGES * KV_TILE * 8)
#define ATTN_SMEM_BYTES (ATTN_BOUNDS_OFF + 128 + 1024) /* + the slack that aligns the base */
#if ATTN_SMEM_BYTES > ATTN_SMEM_LIMIT
#error "paged_prefill_sm90.cu: shared memory over 227 KiB; lower KV_STAGES or KV_TILE"
#endif
#define ATTN_O_PITCH (HEAD_DIM + 8) /* epilogue rows, elements: conflict-free pair stores */
#if ATTN_ROWS_PAD * ATTN_O_PITCH * ATTN_ESZ > 2 * KV_STAGES * ATTN_TILE_BYTES
#error "paged_prefill_sm90.cu: the epilogue's O does not fit over the K/V stages"
#endif

#define ATTN_KV_CPR (HEAD_DIM * ATTN_ESZ / 16)           /* 16-byte chunks per K/V row */
#define ATTN_KV_RPP (ATTN_THREADS / ATTN_KV_CPR)          /* rows per pass of all threads */
#define ATTN_KV_LPT (KV_TILE * ATTN_KV_CPR / ATTN_THREADS) /* chunks per thread per tile */
#if ATTN_KV_RPP % 8 != 0 || KV_TILE % ATTN_KV_RPP != 0
#error "paged_prefill_sm90.cu: the loader's rows per pass must be whole swizzle atoms"
#endif
#ifndef LOAD_UNDER_S
#define LOAD_UNDER_S 1 /* the next tile's copies are issued while S's wgmma runs */
#endif
#if LOAD_UNDER_S != 0 && LOAD_UNDER_S != 1
#error "paged_prefill_sm90.cu: LOAD_UNDER_S must be 0 or 1"
#endif
#define ATTN_ST (KV_TILE / 2)  /* S accumulator registers per thread (m64nKV_TILE) */
#define ATTN_OT (HEAD_DIM / 2) /* O accumulator registers per thread (m64nHEAD_DIM) */

typedef typename attn_elem<DT_Q>::storage attn_q_t;


extern "C" __constant__ attn__launch_config attn_paged_config = {
    ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ATTN_ROWS, TILE_TOKENS, KV_STAGES, 0, 1};


extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1) attn_paged_prefill_sm90(const attn__paged_params p) {
    extern __shared__ attn_vec16 attn_smem[];
    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();
    if ((int)blockIdx.x >= *p.num_work) return;

    /* The work item and (below) the K/V row addresses are written out here rather than
       taken from attn_paged_item_load / attn_paged_rows (paged_common.cuh,
       paged_tile_loader.cuh), which compute the same values: at this kernel's 235
       registers ptxas schedules the helpers' IR into a loop 4-5 % slower (H200, same
       lease: 355 against 375 TFLOP/s at 1 x 4096 causal; docs/PERF.md, issue 21 bisect),
       while this form gives the SASS of the kernel before the helpers, instruction for
       instruction. The producer-fed kernel (issue 22) replaces this one. */
    const int *item = p.work + 8 * (attn_i64)blockIdx.x;
    const int req = item[0], kv_head = item[1], tok0 = item[2], ntok = item[3];
    if (item[6] >= 0) attn_trap(); /* prefill items are never split: no partial slots here */
    const int causal = item[7] & 1;
    const int seq_len = p.seq_lens[req];
    const int q_start = p.query_start_loc[req], query_len = p.query_start_loc[req + 1] - q_start;
    const int key0 = attn_imax(item[4], 0), key1 = attn_imin(item[5], seq_len);
    const int nrows = ntok * GROUP;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = tid >> 7;                 /* warpgroup: rows 64 wg .. 64 wg + 63 */
    const int g = lane >> 2, tq = lane & 3;  /* accumulator row group and lane within it */

    /* the 1024-aligned base; the config's byte count includes the slack */
    const attn_u32 smem0 = attn_smem_addr(attn_smem);
    const attn_u32 base = (smem0 + 1023u) & ~1023u;
    char *const smem = (char *)attn_smem + (base - smem0);
    const attn_u32 sQ = base, sK = base + ATTN_SK_OFF, sV = base + ATTN_SV_OFF;
    attn_i64 *const sBlk = (attn_i64 *)(smem + ATTN_SBLK_OFF); /* [stage][key] */
    int *const sBounds = (int *)(smem + ATTN_BOUNDS_OFF);      /* [warp][4] */

    /* ---- Q rows -> the swizzled K-major tile (cp.async, committed with tile 0) ---- */
    {
        const int cpr = HEAD_DIM * ATTN_ESZ / 16;
        const int vec = attn_aligned16(p.q) && ((p.q_stride_token * ATTN_ESZ) & 15) == 0 &&
                        ((p.q_stride_head * ATTN_ESZ) & 15) == 0;
        for (int c = tid; c < ATTN_ROWS_PAD * cpr; c += ATTN_THREADS) {
            const int r = c / cpr, col = c - r * cpr, t = r / GROUP;
            const int valid = r < nrows;
            const char *src = valid ? (const char *)p.q +
                                          ((attn_i64)(q_start + tok0 + t) * p.q_stride_token +
                                           (attn_i64)(kv_head * GROUP + r - t * GROUP) * p.q_stride_head) * ATTN_ESZ + col * 16
                                    : (const char *)p.q;
            const attn_u32 dst = sQ + attn_wgmma_swizzle_offset<ATTN_ROWS_PAD>(r, col);
            if (vec) {
                attn_cp_async16_or_zero(dst, src, !valid);
            } else {
                attn_u16 h[8];
#pragma unroll
                for (int i = 0; i < 8; i++) h[i] = valid ? ((const attn_u16 *)src)[i] : (attn_u16)0;
                attn_vec16 v = {h[0] | (attn_u32)h[1] << 16, h[2] | (attn_u32)h[3] << 16,
                                h[4] | (attn_u32)h[5] << 16, h[6] | (attn_u32)h[7] << 16};
                *(attn_vec16 *)(smem + (dst - base)) = v;
            }
        }
    }

    /* ---- this thread's two rows (accumulator rows g and g + 8 of its warp's 16):
       visible keys, and the warpgroup's extremes (the skip must be uniform over the 128
       threads that issue one wgmma) ---- */
    const int row0 = 64 * wg + 16 * (warp & 3) + g;
    int lo[2], hi[2];
    int lo_min = 0x7fffffff, lo_max = (int)0x80000000, hi_min = 0x7fffffff, hi_max = (int)0x80000000;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row0 + 8 * h, t = R / GROUP;
        const int valid = R < nrows;
        const int pos = seq_len - query_len + tok0 + t;
        int a, b;
        attn_visible_keys<WINDOW>(p, causal, pos, seq_len, key0, key1, a, b);
        lo[h] = valid ? a : 0;
        hi[h] = valid ? b : 0;
        if (valid) {
            lo_min = attn_imin(lo_min, a); lo_max = attn_imax(lo_max, a);
            hi_min = attn_imin(hi_min, b); hi_max = attn_imax(hi_max, b);
        }
    }
    lo_min = attn_warp_imin(lo_min); lo_max = attn_warp_imax(lo_max);
    hi_min = attn_warp_imin(hi_min); hi_max = attn_warp_imax(hi_max);
    if (lane == 0) {
        sBounds[4 * warp + 0] = lo_min; sBounds[4 * warp + 1] = lo_max;
        sBounds[4 * warp + 2] = hi_min; sBounds[4 * warp + 3] = hi_max;
    }

    /* ---- K/V loader (paged_attention.cu's, into the swizzled layout) ----
       Thread chunk i: row kv_r0 + i * RPP of the tile, 16-byte column kv_col; RPP is a
       multiple of 8, so the swizzle (row % 8) is the same for every i. */
    const char *kv_base = (const char *)p.kv_cache;
    const attn_i64 tok_stride = (attn_i64)p.num_kv_heads * HEAD_DIM; /* elements */
    const attn_i64 blk_stride = 2 * (attn_i64)BLOCK_SIZE * tok_stride;
    const attn_i64 v_bytes = (attn_i64)BLOCK_SIZE * tok_stride * ATTN_ESZ; /* K row -> V row */
    const attn_i64 head_off = (attn_i64)kv_head * HEAD_DIM;
    const int *bt = p.block_table + (attn_i64)req * p.block_table_stride;
    const int kv_r0 = tid / ATTN_KV_CPR, kv_col = tid % ATTN_KV_CPR;
    const attn_u32 kv_swz = attn_wgmma_swizzle_offset<KV_TILE>(kv_r0, kv_col);

    auto block_of = [&](int j) -> int { /* physical block of key j, -1 outside [key0, key1) */
        return j >= key0 && j < key1 ? bt[(unsigned)j / BLOCK_SIZE] : -1;
    };
    auto row_offset = [&](int b, int j) -> attn_i64 { /* of key j (absolute) in block b (-1: none) */
        return b >= 0 ? ((attn_i64)b * blk_stride + (attn_i64)((unsigned)j % BLOCK_SIZE) * tok_stride + head_off) * ATTN_ESZ
                      : (attn_i64)-1;
    };
    auto issue = [&](int stage) { /* cp.async of the tile whose rows sBlk[stage] holds */
        const attn_u32 k_dst = sK + (attn_u32)(stage * ATTN_TILE_BYTES) + kv_swz;
        const attn_u32 v_dst = sV + (attn_u32)(stage * ATTN_TILE_BYTES) + kv_swz;
#pragma unroll
        for (int i = 0; i < ATTN_KV_LPT; i++) {
            const attn_i64 b = sBlk[stage * KV_TILE + kv_r0 + i * ATTN_KV_RPP];
            const char *src = kv_base + (b >= 0 ? b + kv_col * 16 : 0);
            attn_cp_async16_or_zero(k_dst + i * ATTN_KV_RPP * 128, src, b < 0);
            attn_cp_async16_or_zero(v_dst + i * ATTN_KV_RPP * 128, src + (b >= 0 ? v_bytes : 0), b < 0);
        }
    };

    const int tile0 = key1 > key0 ? key0 / KV_TILE * KV_TILE : 0;
    const int ntiles = key1 > key0 ? (key1 - tile0 + KV_TILE - 1) / KV_TILE : 0;
#pragma unroll
    for (int s = 0; s < KV_STAGES; s++)
        for (int r = tid; r < KV_TILE; r += ATTN_THREADS)
            sBlk[s * KV_TILE + r] = row_offset(block_of(tile0 + s * KV_TILE + r), tile0 + s * KV_TILE + r);
    __syncthreads(); /* sBlk and sBounds */
#pragma unroll
    for (int s = 0; s < KV_STAGES - 1; s++) {
        if (s < ntiles) issue(s);
        attn_cp_async_commit(); /* one group per tile slot, empty or not: uniform counting */
    }
    {   /* the warpgroup's extremes from its four warps */
        const int *wb = sBounds + 16 * wg;
        lo_min = attn_imin(attn_imin(wb[0], wb[4]), attn_imin(wb[8], wb[12]));
        lo_max = attn_imax(attn_imax(wb[1], wb[5]), attn_imax(wb[9], wb[13]));
        hi_min = attn_imin(attn_imin(wb[2], wb[6]), attn_imin(wb[10], wb[14]));
        hi_max = attn_imax(attn_imax(wb[3], wb[7]), attn_imax(wb[11], wb[15]));
    }

    /* ---- softmax state of the thread's two rows; O in the accumulator layout
       o[4i + 2h + b] = O[row0 + 8h][8i + 2tq + b] ---- */
    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};
    float o[ATTN_OT];
#pragma unroll
    for (int i = 0; i < ATTN_OT; i++) o[i] = 0.0f;
    const float qk_scale = p.scale * ATTN_LOG2E;
    const attn_u32 sQ_wg = sQ + (attn_u32)(wg * 64 * 128); /* row 64 wg of every panel */

    for (int it = 0; it < ntiles; it++) {
        attn_cp_async_wait<KV_STAGES - 2>(); /* this thread's part of tile `it` (and Q) landed */
        attn_wgmma_fence_smem_writes();      /* ... and is visible to the async proxy */
        __syncthreads();                      /* everyone's part; stage (it-1) is free again */
        const int stage = it % KV_STAGES;
        const int kt0 = tile0 + it * KV_TILE;
        const attn_u32 sK_st = sK + (attn_u32)(stage * ATTN_TILE_BYTES), sV_st = sV + (attn_u32)(stage * ATTN_TILE_BYTES);
        /* uniform over the warpgroup (its bounds); __all_sync tells ptxas so per warp */
        const int active = __all_sync(0xffffffffu, kt0 + KV_TILE > lo_min && kt0 < hi_max);
        /* block number of row tid of tile it + KV_STAGES, stored to sBlk after compute */
        const int next_blk = tid < KV_TILE ? block_of(tile0 + (it + KV_STAGES) * KV_TILE + tid) : -1;
        /* the copies of tile it + KV_STAGES - 1 into the stage tile it - 1 used (free: the
           barrier above); with LOAD_UNDER_S issued while S's wgmma runs (on both paths, so
           that no branch joins while the accumulators are in flight: ptxas would serialize) */
        auto issue_next = [&]() {
            if (it + KV_STAGES - 1 < ntiles) issue((it + KV_STAGES - 1) % KV_STAGES);
            attn_cp_async_commit();
        };
#if !LOAD_UNDER_S
        issue_next();
#endif
        if (active) {
            const int need_mask = kt0 < lo_max || kt0 + KV_TILE > hi_min;

            /* ---- S = Q K^T: m64nKV_TILEk16, HEAD_DIM / 16 steps ---- */
            float s[ATTN_ST];
            attn_wgmma_fence();
#pragma unroll
            for (int k = 0; k < HEAD_DIM; k += 16)
                attn_wgmma<KV_TILE, DT_Q>::template ss<0>(s, attn_wgmma_desc_k_major<ATTN_ROWS_PAD>(sQ_wg, k),
                                                          attn_wgmma_desc_k_major<KV_TILE>(sK_st, k), k > 0);
            attn_wgmma_commit();
#if LOAD_UNDER_S
            issue_next();
#endif
            attn_wgmma_wait<0>();
            attn_wgmma_fence_acc(s);

            /* ---- mask (raw scores; the scale is folded into the exp2 below), row max:
               element 4i + 2h + b is row h, key kt0 + 8i + 2tq + b ---- */
            float mx[2] = {attn_neg_inf(), attn_neg_inf()};
            int dlo[2], dhi[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                dlo[h] = lo[h] - (kt0 + 2 * tq);
                dhi[h] = hi[h] - (kt0 + 2 * tq);
            }
#pragma unroll
            for (int i = 0; i < KV_TILE / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, c = 8 * i + (e & 1);
                    float x = s[4 * i + e];
                    if (need_mask && (c < dlo[h] || c >= dhi[h])) x = attn_neg_inf();
                    s[4 * i + e] = x;
                    mx[h] = fmaxf(mx[h], x);
                }
            float base_s[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float alpha; /* scale > 0: the scaled max is the max of the scaled scores */
                base_s[h] = attn_softmax_rebase(m[h], attn_quad_max(mx[h]) * qk_scale, alpha);
                l[h] *= alpha;
#pragma unroll
                for (int i = 0; i < HEAD_DIM / 8; i++) { o[4 * i + 2 * h] *= alpha; o[4 * i + 2 * h + 1] *= alpha; }
            }
#pragma unroll
            for (int i = 0; i < KV_TILE / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float x = attn_exp2(fmaf(s[4 * i + e], qk_scale, -base_s[e >> 1]));
                    s[4 * i + e] = x;
                    sum[e >> 1] += x;
                }
            l[0] += sum[0]; /* lane-partial sums; the row's 4 lanes are added in the epilogue */
            l[1] += sum[1];

            /* ---- O += P V: P from the S registers, m64nHEAD_DIMk16, KV_TILE / 16 steps ---- */
            attn_u32 a[KV_TILE / 16][4];
#pragma unroll
            for (int j = 0; j < KV_TILE / 16; j++) attn_wgmma_a_from_acc<DT_Q>(a[j], s, j);
            attn_wgmma_fence(); /* O and the A registers were written by ordinary instructions */
#pragma unroll
            for (int j = 0; j < KV_TILE / 16; j++)
                attn_wgmma<HEAD_DIM, DT_Q>::template rs<1>(o, a[j], attn_wgmma_desc_mn_major<KV_TILE>(sV_st, 16 * j), 1);
            attn_wgmma_commit();
            attn_wgmma_wait<0>();
            attn_wgmma_fence_acc(o);
        }
#if LOAD_UNDER_S
        else {
            issue_next();
        }
#endif
        if (it + KV_STAGES < ntiles && tid < KV_TILE) /* sBlk's slot of tile it + KV_STAGES held tile it: issued */
            sBlk[stage * KV_TILE + tid] = row_offset(next_blk, tile0 + (it + KV_STAGES) * KV_TILE + tid);
    }

    /* ---- epilogue: O / l in DT_Q to shared memory (over the K/V stages), lse to global,
       then 16-byte rows out ---- */
    attn_cp_async_wait<0>(); /* nothing may still land in the stages being reused */
    __syncthreads();         /* every warpgroup is done with the K/V stages */
    char *const sO = smem + ATTN_SK_OFF; /* [128][O_PITCH] DT_Q */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row0 + 8 * h;
        const float L = attn_quad_sum(l[h]);
        const float inv = L > 0.0f ? attn_rcp(L) : 0.0f; /* L >= 1 when a key was seen */
        char *orow = sO + (R * ATTN_O_PITCH + 2 * tq) * ATTN_ESZ;
#pragma unroll
        for (int i = 0; i < HEAD_DIM / 8; i++)
            *(attn_u32 *)(orow + 8 * i * ATTN_ESZ) = attn_elem<DT_Q>::pack2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
        if (tq == 0 && R < nrows && p.lse) {
            const int t = R / GROUP, head = kv_head * GROUP + (R - t * GROUP);
            p.lse[(attn_i64)(q_start + tok0 + t) * p.lse_stride_token + head * p.lse_stride_head] =
                attn_softmax_lse2(m[h], L) * ATTN_LN2;
        }
    }
    __syncthreads();
    const int out_vec = attn_aligned16(p.out) && ((p.out_stride_token * ATTN_ESZ) & 15) == 0 &&
                        ((p.out_stride_head * ATTN_ESZ) & 15) == 0;
    for (int u = tid; u < nrows * ATTN_KV_CPR; u += ATTN_THREADS) {
        const int R = u / ATTN_KV_CPR, c = u - R * ATTN_KV_CPR;
        const int t = R / GROUP, head = kv_head * GROUP + (R - t * GROUP);
        const attn_vec16 v = *(const attn_vec16 *)(sO + (R * ATTN_O_PITCH + c * 8) * ATTN_ESZ);
        char *dst = (char *)p.out + ((attn_i64)(q_start + tok0 + t) * p.out_stride_token +
                                     (attn_i64)head * p.out_stride_head + c * 8) * ATTN_ESZ;
        if (out_vec) {
            attn_stg16(dst, v);
        } else {
            const attn_u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                ((attn_u16 *)dst)[2 * i] = (attn_u16)(w[i] & 0xffffu);
                ((attn_u16 *)dst)[2 * i + 1] = (attn_u16)(w[i] >> 16);
            }
        }
    }
}
