/* paged_prefill_sm90.cu - paged-attention prefill on Hopper, sm_90a: warpgroup MMA (wgmma)
   fed by a producer warpgroup through the tensor memory accelerator (TMA) and mbarriers.

   The prefill tiles of the CUDA_SM90 backend (attn.h: a layer whose tensors are on a
   device of compute capability 9.0 with TMA and whose shape is in the scope below; its
   decode tiles and cache write are the CUDA backend's). Compiled for sm_90a only (wgmma
   and setmaxnreg do not exist in plain sm_90). Checked on an H200 against the CPU backend
   by tests/cuda_kernels.c --sm90-prefill (random prefill-shaped cases in scope, under
   compute-sanitizer too) and by the CUDA suite through the backend.

   =====================================================================================
   WHAT IT COMPUTES
   =====================================================================================
   Exactly kernels/paged_attention.cu's function (its top comment: WHAT IT COMPUTES, the
   WORK LIST, the params struct) for a narrower scope:
     - q and cache of one 16-bit type: DT_Q == DT_KV, 1 (f16) or 2 (bf16);
     - HEAD_DIM 64 or 128; any GROUP, TILE_TOKENS * GROUP <= 128 rows (padded to 128);
       BLOCK_SIZE a multiple of 16;
     - WINDOW 0 or 1 (window from params as there); no soft cap, no ALiBi (the defines
       SOFTCAP / ALIBI 1 are refused);
     - work items that write out/lse (slot -1) or an unnormalised partial into partial slot
       `slot` (paged_attention.cu's PARTIAL WORKSPACE, WT::rows rows a slot: the prefix pass
       of its CASCADE; a merge index in the flags traps: nothing here merges). Causality
       per work item (flags bit 0), as there.
   Query token t of a work item sits at pos = seq_len - query_len + tok0 + t; key j is
   visible iff lo <= j < hi (lo, hi as in paged_attention.cu, clamped to [key0, key1)).
   Scores in base 2 with the scale folded in: s = q.k * scale * log2(e); out = sum_j
   2^(s_j - m) v_j / sum_j 2^(s_j - m), rounded to DT_Q; lse = (m + log2 l) * ln 2 (base
   e); a row that sees no key gets out = 0 and lse = -inf.

   =====================================================================================
   LAUNCH
   =====================================================================================
   attn_paged_prefill_sm90(const __grid_constant__ attn_tma_map kv_map, const
   attn__paged_params p): grid (>= *num_work), block 384 (attn_paged_config.threads),
   dynamic shared memory attn_paged_config.shared_bytes, one CTA per SM. CTAs past
   *num_work exit. The same params and work list as attn_paged_attention: the host drives
   it with the prefill variant's schedule (TILE_TOKENS = attn_paged_config.tile_tokens).
   kv_map: a tiled tensor map over the whole cache (p.kv_cache), encoded by the host for
   each forward (attn.h, attn__cuda_kv_map): 5-D, innermost first, dims {HEAD_DIM,
   num_kv_heads, BLOCK_SIZE, 2, num_blocks}, byte strides {HEAD_DIM * 2, num_kv_heads *
   HEAD_DIM * 2, BLOCK_SIZE * num_kv_heads * HEAD_DIM * 2, 2 * that}, box {64, 1, BOX_ROWS,
   1, 1}, 128-byte swizzle, zero fill. One box is BOX_ROWS consecutive rows of one block,
   64 columns of one head, K (coordinate 3 = 0) or V (1). BOX_ROWS (exported as
   attn_paged_config.tma_box_rows) is the largest piece that never straddles a block or a
   tile: KV_TILE when BLOCK_SIZE is a multiple of it, BLOCK_SIZE when it divides KV_TILE,
   16 otherwise. The config: {threads, dynamic shared bytes, KV_TILE, TILE_TOKENS * GROUP,
   TILE_TOKENS, KV_STAGES, 0, 1, BOX_ROWS}.

   =====================================================================================
   INSIDE A CTA (FlashAttention-3's structure: a producer, two consumer warpgroups)
   =====================================================================================
   Warpgroup 0 produces (one thread issues the copies; the group gives its registers
   back, setmaxnreg 40); warpgroups 1 and 2 consume query rows 0-63 and 64-127 of the
   128-row tile (setmaxnreg 232; row R = token R / GROUP, head member R % GROUP; rows >=
   ntok * GROUP are padding: zero Q, never stored).
   Shared memory (dynamic, base rounded up to 1024 at run time; every tile 1024-aligned):
       [Q: 128 rows x HEAD_DIM, 128B-swizzled K-major (wgmma.cuh), HEAD_DIM / 64 panels]
       [K: KV_STAGES x (KV_TILE rows x HEAD_DIM, swizzled K-major: the B of S = Q K^T)]
       [V: KV_STAGES x (KV_TILE keys x HEAD_DIM, swizzled, read MN-major: the B of P V)]
       [full[KV_STAGES], empty[KV_STAGES]: mbarriers] [bounds: 8 warps x 4 int]
   A stage's panel c holds KV_TILE rows x 128 bytes (columns 64c .. 64c + 63): the layout
   one TMA box per BOX_ROWS rows writes, and the wgmma descriptors read.
     Q: the consumers copy it with cp.async into the swizzled K-major tile, once.
     full[s] (count 1: the producer's arrive_expect_tx, then the copies' bytes) and
     empty[s] (count 8: lane 0 of each consumer warp, after its wgmma on the stage
     completed).
     Producer, tile it (tiles of KV_TILE keys aligned to multiples of KV_TILE from
     floor(key0 / KV_TILE) * KV_TILE to key1): wait empty[s]; for each piece of BOX_ROWS
     keys that holds a key in [key0, key1): its block from block_table, then its K and V
     boxes (2 x HEAD_DIM / 64 copies); the bytes expected are those of the pieces copied.
     Pieces wholly outside are not read (nor their block_table entries).
     Consumers, tile it: wait full[s]. On an edge tile (one holding a key outside [key0,
     key1): rows of pieces not copied keep a stage's old contents, keys past seq_len in a
     copied piece hold whatever the cache holds) the V rows of those keys are zeroed (each
     consumer thread a share), fence.proxy.async, and the 256 consumer threads meet at a
     named barrier before P V; K's rows need nothing (their scores are replaced by -inf).
     Then per warpgroup, unless none of its 64 rows sees a key of the tile (causal tiles
     above the diagonal, window tiles before it: uniform over the warpgroup, from the
     per-warpgroup bounds):
       S[64][KV_TILE] = Q K^T     wgmma ss m64nKV_TILEk16, HEAD_DIM / 16 steps, wait 0
       online softmax in f32 registers, base 2 (online_softmax.cuh; each thread holds 2
       rows, a row's max and sum over its 4 lanes by shuffles; masking only on tiles that
       cross a visible-range edge of some row); O rescaled by 2^(m_old - m_new)
       O[64][HEAD_DIM] += P V     P packed to DT_Q from the S accumulator as the register
                                  A operand (attn_wgmma_a_from_acc), wgmma rs, wait 0
     and lane 0 of each warp arrives on empty[s]. The consumers never meet at a CTA-wide
     barrier inside the loop (only on edge tiles, at a named barrier of the 256).
   PINGPONG 1 (tuning, default 0): the consumer warpgroups take turns issuing S (named
   barriers 2 and 3); measured within 1 % of 0 on the H200 (docs/PERF.md). PINGPONG 2: they
   take turns issuing P V as well (FlashAttention-3's ping-pong): +3 % at 1 x 1k, -1 to -2 %
   at 4k and 16k on the H200 (docs/PERF.md, runs 9-10), so not the default.
   Epilogue (the consumers; named barrier 1): l summed over the row's 4 lanes; O / l in
   DT_Q to shared memory over the stages, lse (base e) straight to global; 16-byte rows
   out (element stores when q/out rows are not 16-byte aligned).
   Not yet: softmax of tile it overlapped with S of tile it + 1 inside a warpgroup (two
   drafts measured 10 % slower, docs/PERF.md), persistent CTAs (issue 22). */
#include "paged_common.cuh"
#include "paged_tile_loader.cuh"
#include "wgmma.cuh"
#include "hopper.cuh"

#if !defined(HEAD_DIM) || !defined(BLOCK_SIZE) || !defined(GROUP) || !defined(DT_Q) || \
    !defined(DT_KV) || !defined(TILE_TOKENS)
#error "paged_prefill_sm90.cu: define HEAD_DIM, BLOCK_SIZE, GROUP, DT_Q, DT_KV and TILE_TOKENS"
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#ifndef KV_TILE
#define KV_TILE 128
#endif
/* PINGPONG 1: the two consumer warpgroups take turns issuing their S = Q K^T (named
   barriers 2 and 3), so one's softmax runs under the other's GEMMs instead of both
   contending for the tensor cores at once. PINGPONG 2: their P V too, FlashAttention-3's
   schedule: the tensor cores see S0 S1 PV0 PV1 S0' ..., each softmax under the other
   warpgroup's GEMM, with no more live registers (tuning; measured 1: within 1 % of 0) */
#ifndef PINGPONG
#define PINGPONG 0
#endif
#if defined(SOFTCAP) && SOFTCAP
#error "paged_prefill_sm90.cu: no soft cap (SOFTCAP 1 takes paged_attention.cu)"
#endif
#if defined(ALIBI) && ALIBI
#error "paged_prefill_sm90.cu: no ALiBi (ALIBI 1 takes paged_attention.cu)"
#endif
#ifndef KV_STAGES
#define KV_STAGES 0 /* 0: the traits' choice, 3 where shared memory holds three */
#endif

struct attn_ws_traits {
    static constexpr int head_dim = HEAD_DIM, block_size = BLOCK_SIZE, group = GROUP, kv_tile = KV_TILE;
    static constexpr int rows = TILE_TOKENS * GROUP, rows_pad = 128, esz = 2;
    static constexpr int threads = 384, consumers = 256;
    static constexpr int q_bytes = rows_pad * head_dim * esz;
    static constexpr int tile_bytes = kv_tile * head_dim * esz; /* one K (or V) stage */
    static constexpr int panels = head_dim / 64;
    /* the rows of one TMA box: a piece of a tile that lies in one block */
    static constexpr int box_rows = block_size % kv_tile == 0 ? kv_tile : kv_tile % block_size == 0 ? block_size : 16;
    static constexpr int box_bytes = box_rows * 128;            /* one TMA box: box_rows x 64 columns */
    static constexpr int pieces = kv_tile / box_rows;           /* boxes per tile and panel, per K or V */
    static constexpr int smem_limit = 227 * 1024;
    static constexpr int stages_fit3 = q_bytes + 3 * 2 * tile_bytes + 3 * 16 + 128 + 1024 <= smem_limit;
    static constexpr int kv_stages = KV_STAGES ? KV_STAGES : stages_fit3 ? 3 : 2;
    static constexpr int k_off = q_bytes, v_off = k_off + kv_stages * tile_bytes, bar_off = v_off + kv_stages * tile_bytes;
    static constexpr int smem_bytes = bar_off + 2 * kv_stages * 8 + 128 + 1024; /* barriers, bounds scratch, the slack that aligns the base */
    static constexpr int o_pitch = head_dim + 8;
    static_assert(head_dim == 64 || head_dim == 128, "paged_prefill_sm90.cu: HEAD_DIM must be 64 or 128");
    static_assert(DT_Q == DT_KV && (DT_Q == ATTN_DT_F16 || DT_Q == ATTN_DT_BF16),
                  "paged_prefill_sm90.cu: q and cache must be one 16-bit type");
    static_assert(block_size % 16 == 0 && block_size > 0, "paged_prefill_sm90.cu: BLOCK_SIZE a positive multiple of 16");
    static_assert(kv_stages == 2 || kv_stages == 3, "paged_prefill_sm90.cu: KV_STAGES must be 2 or 3");
    static_assert(WINDOW == 0 || WINDOW == 1, "paged_prefill_sm90.cu: WINDOW must be 0 or 1");
    static_assert(PINGPONG >= 0 && PINGPONG <= 2, "paged_prefill_sm90.cu: PINGPONG must be 0, 1 or 2");
    static_assert(kv_tile == 64 || kv_tile == 128, "paged_prefill_sm90.cu: KV_TILE must be 64 or 128");
    static_assert(TILE_TOKENS >= 1 && GROUP >= 1 && rows <= 128, "paged_prefill_sm90.cu: TILE_TOKENS * GROUP <= 128");
    static_assert(smem_bytes <= smem_limit, "paged_prefill_sm90.cu: shared memory over 227 KiB");
    static_assert(rows_pad * o_pitch * esz <= 2 * kv_stages * tile_bytes, "the epilogue's O fits over the stages");
};
typedef attn_ws_traits WT;

extern "C" __constant__ attn__launch_config attn_paged_config = {
    WT::threads, WT::smem_bytes, WT::kv_tile, WT::rows, TILE_TOKENS, WT::kv_stages, 0, 1, WT::box_rows};

extern "C" __global__ void __launch_bounds__(WT::threads, 1)
    attn_paged_prefill_sm90(const __grid_constant__ attn_tma_map kv_map, const attn__paged_params p) {
    extern __shared__ attn_vec16 attn_smem[];
    if (blockDim.x != WT::threads || attn_dynamic_smem_size() < WT::smem_bytes) attn_trap();
    if ((int)blockIdx.x >= *p.num_work) return;

    const attn_paged_item w = attn_paged_item_load(p, blockIdx.x, GROUP);
    if (w.merge_index >= 0) attn_trap(); /* partials are merged by their reader (CASCADE), never here */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const attn_u32 smem0 = attn_smem_addr(attn_smem);
    const attn_u32 base = (smem0 + 1023u) & ~1023u;
    char *const smem = (char *)attn_smem + (base - smem0);
    const attn_u32 sQ = base, sK = base + WT::k_off, sV = base + WT::v_off;
    const attn_u32 full = base + WT::bar_off, empty = full + 8 * WT::kv_stages;
    int tile0, ntiles;
    attn_paged_tiles<KV_TILE>(w.key0, w.key1, tile0, ntiles);

    if (tid == 0) {
        for (int s = 0; s < WT::kv_stages; s++) {
            attn_mbar_init(full + 8 * s, 1);
            attn_mbar_init(empty + 8 * s, 8);
        }
        attn_mbar_init_fence();
    }
    __syncthreads(); /* the barriers; the last CTA-wide barrier */

    if (tid < 128) { /* ---- the producer warpgroup ---- */
        attn_regs_release<40>();
        if (tid == 0) {
            const int *bt = p.block_table + (attn_i64)w.req * p.block_table_stride;
            attn_tma_prefetch_map(&kv_map);
            attn_pipe_state<WT::kv_stages> st = {0, 0u};
            for (int it = 0; it < ntiles; it++, st.advance()) {
                const int kt0 = tile0 + it * KV_TILE;
                int np = 0;
                for (int j = 0; j < WT::pieces; j++) /* pieces holding a key in [key0, key1) */
                    np += kt0 + (j + 1) * WT::box_rows > w.key0 && kt0 + j * WT::box_rows < w.key1;
                attn_mbar_wait(empty + 8 * st.stage, st.phase ^ 1u);
                attn_mbar_arrive_expect_tx(full + 8 * st.stage, (unsigned)(np * 2 * WT::panels * WT::box_bytes));
                for (int j = 0; j < WT::pieces; j++) {
                    const int k = kt0 + j * WT::box_rows;
                    if (!(k + WT::box_rows > w.key0 && k < w.key1)) continue;
                    const int b = bt[(unsigned)k / BLOCK_SIZE], row = (int)((unsigned)k % BLOCK_SIZE);
#pragma unroll
                    for (int c = 0; c < WT::panels; c++) {
                        const attn_u32 off = (attn_u32)(st.stage * WT::tile_bytes + c * KV_TILE * 128 + j * WT::box_bytes);
                        attn_tma_load_5d(sK + off, &kv_map, 64 * c, w.kv_head, row, 0, b, full + 8 * st.stage);
                        attn_tma_load_5d(sV + off, &kv_map, 64 * c, w.kv_head, row, 1, b, full + 8 * st.stage);
                    }
                }
            }
        }
        return;
    }

    /* ---- the consumer warpgroups ---- */
    attn_regs_acquire<232>();
    const int ctid = tid - 128, wg = ctid >> 7; /* warpgroup 0/1: rows 64 wg .. 64 wg + 63 */
    const int g = lane >> 2, tq = lane & 3;
    const int nrows = w.nrows;

    {   /* Q rows -> the swizzled K-major tile */
        const int cpr = HEAD_DIM * WT::esz / 16;
        const int vec = attn_aligned16(p.q) && ((p.q_stride_token * WT::esz) & 15) == 0 && ((p.q_stride_head * WT::esz) & 15) == 0;
        for (int c = ctid; c < WT::rows_pad * cpr; c += WT::consumers) {
            const int r = c / cpr, col = c - r * cpr, t = r / GROUP;
            const int valid = r < nrows;
            const char *src = valid ? (const char *)p.q + ((attn_i64)(w.q_start + w.tok0 + t) * p.q_stride_token +
                                                           (attn_i64)(w.kv_head * GROUP + r - t * GROUP) * p.q_stride_head) * WT::esz + col * 16
                                    : (const char *)p.q;
            const attn_u32 dst = sQ + attn_wgmma_swizzle_offset<WT::rows_pad>(r, col);
            if (vec) {
                attn_cp_async16_or_zero(dst, src, !valid);
            } else {
                attn_u16 h[8];
#pragma unroll
                for (int i = 0; i < 8; i++) h[i] = valid ? ((const attn_u16 *)src)[i] : (attn_u16)0;
                attn_vec16 v = {h[0] | (attn_u32)h[1] << 16, h[2] | (attn_u32)h[3] << 16, h[4] | (attn_u32)h[5] << 16,
                                h[6] | (attn_u32)h[7] << 16};
                *(attn_vec16 *)(smem + (dst - base)) = v;
            }
        }
        attn_cp_async_commit();
        attn_cp_async_wait<0>();
        attn_fence_proxy_async();       /* Q is read by wgmma (the async proxy) */
        attn_named_barrier(1, WT::consumers);
    }

    /* this thread's two rows: visible keys; the warpgroup's extremes through shared memory */
    const int row0 = 64 * wg + 16 * (warp & 3) + g;
    int lo[2], hi[2];
    int lo_min = 0x7fffffff, lo_max = (int)0x80000000, hi_min = 0x7fffffff, hi_max = (int)0x80000000;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row0 + 8 * h, t = R / GROUP;
        const int valid = R < nrows;
        const int pos = w.seq_len - w.query_len + w.tok0 + t;
        int a, b;
        attn_visible_keys<WINDOW>(p, w.causal, pos, w.seq_len, w.key0, w.key1, a, b);
        lo[h] = valid ? a : 0;
        hi[h] = valid ? b : 0;
        if (valid) {
            lo_min = attn_imin(lo_min, a); lo_max = attn_imax(lo_max, a);
            hi_min = attn_imin(hi_min, b); hi_max = attn_imax(hi_max, b);
        }
    }
    {   /* reduced over the warp, then over the warpgroup's 4 warps (a scratch past the
           barriers: 8 consumer warps x 4 ints) */
        int *sb = (int *)(smem + WT::bar_off + 2 * 8 * WT::kv_stages);
        lo_min = attn_warp_imin(lo_min); lo_max = attn_warp_imax(lo_max);
        hi_min = attn_warp_imin(hi_min); hi_max = attn_warp_imax(hi_max);
        const int cw = warp - 4;
        if (lane == 0) { sb[4 * cw] = lo_min; sb[4 * cw + 1] = lo_max; sb[4 * cw + 2] = hi_min; sb[4 * cw + 3] = hi_max; }
        attn_named_barrier(1, WT::consumers);
        const int *wb = sb + 16 * wg;
        lo_min = attn_imin(attn_imin(wb[0], wb[4]), attn_imin(wb[8], wb[12]));
        lo_max = attn_imax(attn_imax(wb[1], wb[5]), attn_imax(wb[9], wb[13]));
        hi_min = attn_imin(attn_imin(wb[2], wb[6]), attn_imin(wb[10], wb[14]));
        hi_max = attn_imax(attn_imax(wb[3], wb[7]), attn_imax(wb[11], wb[15]));
    }

    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};
    float o[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; i++) o[i] = 0.0f;
    const float qk_scale = p.scale * ATTN_LOG2E;
    const attn_u32 sQ_wg = sQ + (attn_u32)(wg * 64 * 128);

    attn_pipe_state<WT::kv_stages> st = {0, 0u};
    if (PINGPONG && wg == 1) attn_named_barrier_arrive(2, WT::consumers); /* warpgroup 0 goes first */
    for (int it = 0; it < ntiles; it++, st.advance()) {
        const int kt0 = tile0 + it * KV_TILE;
        const attn_u32 sK_st = sK + (attn_u32)(st.stage * WT::tile_bytes), sV_st = sV + (attn_u32)(st.stage * WT::tile_bytes);
        attn_mbar_wait(full + 8 * st.stage, st.phase);
        if (kt0 < w.key0 || kt0 + KV_TILE > w.key1) { /* an edge tile: zero the V rows of keys outside [key0, key1) */
            for (int u = ctid; u < KV_TILE * (HEAD_DIM / 8); u += WT::consumers) {
                const int r = u / (HEAD_DIM / 8), ch = u - r * (HEAD_DIM / 8), k = kt0 + r;
                if (k < w.key0 || k >= w.key1) {
                    const attn_vec16 zero = {0u, 0u, 0u, 0u};
                    *(attn_vec16 *)(smem + (sV_st - base) + attn_wgmma_swizzle_offset<KV_TILE>(r, ch)) = zero;
                }
            }
            attn_fence_proxy_async();
            attn_named_barrier(1, WT::consumers);
        }
        const int active = __all_sync(0xffffffffu, kt0 + KV_TILE > lo_min && kt0 < hi_max);
        if (PINGPONG) attn_named_barrier(2 + wg, WT::consumers); /* my turn (every tile, active or not: the counts pair up) */
        if (active) {
            const int need_mask = kt0 < lo_max || kt0 + KV_TILE > hi_min;
            float s[KV_TILE / 2];
            attn_wgmma_fence();
#pragma unroll
            for (int k = 0; k < HEAD_DIM; k += 16)
                attn_wgmma<KV_TILE, DT_Q>::template ss<0>(s, attn_wgmma_desc_k_major<WT::rows_pad>(sQ_wg, k),
                                                          attn_wgmma_desc_k_major<KV_TILE>(sK_st, k), k > 0);
            attn_wgmma_commit();
            if (PINGPONG) attn_named_barrier_arrive(3 - wg, WT::consumers); /* the other's turn */
            attn_wgmma_wait<0>();
            attn_wgmma_fence_acc(s);
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
            float base_s[2], sum[2] = {0.0f, 0.0f}, alpha[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                base_s[h] = attn_softmax_rebase(m[h], attn_quad_max(mx[h]) * qk_scale, alpha[h]);
                l[h] *= alpha[h];
            }
            attn_wgmma_scale_rows(o, alpha[0], alpha[1]);
#pragma unroll
            for (int i = 0; i < KV_TILE / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float x = attn_exp2(fmaf(s[4 * i + e], qk_scale, -base_s[e >> 1]));
                    s[4 * i + e] = x;
                    sum[e >> 1] += x;
                }
            l[0] += sum[0];
            l[1] += sum[1];
            attn_u32 a[KV_TILE / 16][4];
#pragma unroll
            for (int j = 0; j < KV_TILE / 16; j++) attn_wgmma_a_from_acc<DT_Q>(a[j], s, j);
            if (PINGPONG == 2) attn_named_barrier(2 + wg, WT::consumers); /* my P V turn */
            attn_wgmma_fence();
#pragma unroll
            for (int j = 0; j < KV_TILE / 16; j++)
                attn_wgmma<HEAD_DIM, DT_Q>::template rs<1>(o, a[j], attn_wgmma_desc_mn_major<KV_TILE>(sV_st, 16 * j), 1);
            attn_wgmma_commit();
            if (PINGPONG == 2) attn_named_barrier_arrive(3 - wg, WT::consumers);
            attn_wgmma_wait<0>();
            attn_wgmma_fence_acc(o);
        } else if (PINGPONG) {
            attn_named_barrier_arrive(3 - wg, WT::consumers);
            if (PINGPONG == 2) { /* the P V turn too: the counts pair up */
                attn_named_barrier(2 + wg, WT::consumers);
                attn_named_barrier_arrive(3 - wg, WT::consumers);
            }
        }
        __syncwarp();
        if (lane == 0) attn_mbar_arrive(empty + 8 * st.stage); /* this warp is done with the stage */
    }

    /* ---- epilogue (the consumers): O / l to shared memory over the stages, lse, rows out.
       Every copy landed: each full barrier was waited on. ---- */
    if (w.slot >= 0) { /* a partial (CASCADE's prefix pass): O, m, l of each row as they are */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int R = row0 + 8 * h;
            const float L = attn_quad_sum(l[h]); /* every lane: a warp shuffle */
            if (R >= nrows) continue;
            const attn_i64 prow = (attn_i64)w.slot * WT::rows + R;
            float *dst = p.partial_o + prow * HEAD_DIM + 2 * tq;
#pragma unroll
            for (int i = 0; i < HEAD_DIM / 8; i++)
                *(float2 *)(dst + 8 * i) = make_float2(o[4 * i + 2 * h], o[4 * i + 2 * h + 1]);
            if (tq == 0) {
                p.partial_ml[prow * 2] = m[h];
                p.partial_ml[prow * 2 + 1] = L;
            }
        }
        return;
    }
    attn_named_barrier(1, WT::consumers); /* both warpgroups are done with the stages */
    char *const sO = smem + WT::k_off;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int R = row0 + 8 * h;
        float L = attn_quad_sum(l[h]), lse = attn_softmax_lse2(m[h], L) * ATTN_LN2, ws = 1.0f;
        if (p.sinks && R < nrows) { /* attention sinks: the row's head's, once (never split) */
            const int t = R / GROUP;
            ws = attn_softmax_sink(__ldg(p.sinks + w.kv_head * GROUP + (R - t * GROUP)), lse);
        }
        const float inv = L > 0.0f ? ws * attn_rcp(L) : 0.0f;
        char *orow = sO + (R * WT::o_pitch + 2 * tq) * WT::esz;
#pragma unroll
        for (int i = 0; i < HEAD_DIM / 8; i++)
            *(attn_u32 *)(orow + 8 * i * WT::esz) = attn_elem<DT_Q>::pack2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
        if (tq == 0 && R < nrows && p.lse) {
            const int t = R / GROUP, head = w.kv_head * GROUP + (R - t * GROUP);
            p.lse[(attn_i64)(w.q_start + w.tok0 + t) * p.lse_stride_token + head * p.lse_stride_head] = lse;
        }
    }
    attn_named_barrier(1, WT::consumers);
    const int cpr = HEAD_DIM * WT::esz / 16;
    const int out_vec = attn_aligned16(p.out) && ((p.out_stride_token * WT::esz) & 15) == 0 && ((p.out_stride_head * WT::esz) & 15) == 0;
    for (int u = ctid; u < nrows * cpr; u += WT::consumers) {
        const int R = u / cpr, c = u - R * cpr;
        const int t = R / GROUP, head = w.kv_head * GROUP + (R - t * GROUP);
        const attn_vec16 v = *(const attn_vec16 *)(sO + (R * WT::o_pitch + c * 8) * WT::esz);
        char *dst = (char *)p.out + ((attn_i64)(w.q_start + w.tok0 + t) * p.out_stride_token + (attn_i64)head * p.out_stride_head + c * 8) * WT::esz;
        if (out_vec) {
            attn_stg16(dst, v);
        } else {
            const attn_u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                ((attn_u16 *)dst)[2 * i] = (attn_u16)(x[i] & 0xffffu);
                ((attn_u16 *)dst)[2 * i + 1] = (attn_u16)(x[i] >> 16);
            }
        }
    }
}
