/* paged_attention.cu - paged attention forward over a varlen batch (decodes and chunked
   prefills in one launch), the GPU form of the CPU backend's attn__cpu_task_run /
   attn__cpu_merge_run; vLLM's unified attention, written as CUDA.

   =====================================================================================
   WHAT IT COMPUTES (exactly the CPU backend's function)
   =====================================================================================
   Request r has query_len = query_start_loc[r+1] - query_start_loc[r] tokens, which are
   the LAST query_len positions of its seq_len = seq_lens[r] keys: query token i (0-based
   within the request) sits at position pos = seq_len - query_len + i. Query head h reads
   KV head h / GROUP. Key j (0 <= j < seq_len) lives in cache block block_table[r][j /
   BLOCK_SIZE], row j % BLOCK_SIZE. Key j is visible from pos iff lo <= j < hi with
       lo = window ? max(0, pos - window + 1) : 0
       hi = causal ? pos + 1 : (window ? min(seq_len, pos + window) : seq_len)
   where causal is bit 0 of the work item's flags (a run-time value read from device
   memory, so one compiled variant serves causal and non-causal batches and a captured
   graph follows the batch that the last build described).
   (attn__visible_keys). Scores, in base-2 units (exp2 softmax, the scale folded in):
       s = q.k * scale * log2(e)                                  (SOFTCAP 0)
       s = softcap * tanh(q.k * scale / softcap) * log2(e)        (SOFTCAP 1)
       s += alibi_slopes[h] * log2(e) * (j - pos)                 (ALIBI 1)
   out = sum_j 2^(s_j - m) v_j / sum_j 2^(s_j - m), rounded to DT_Q (RNE); a row that sees
   no key gets out = 0 and lse = -inf; lse = (m + log2(l)) * ln(2) (base e, f32).

   =====================================================================================
   DEFINES (every one a compile-time constant; the host compiles one variant per layer)
   =====================================================================================
   required  HEAD_DIM     multiple of 8, 8..256 (run against the CPU on an H200: 64, 80,
                          96, 120, 128, 256; 120 takes the zero-column path)
             BLOCK_SIZE   cache block size, a multiple of 16 (any; tiles need not align)
             GROUP        query heads per KV head (num_heads / num_kv_heads), >= 1
             DT_Q         q/out element type: 0 f32, 1 f16, 2 bf16
             DT_KV        cache element type, same numbering, or an 8-bit cache: 4 fp8 e4m3,
                          5 fp8 e5m2 (per-tensor scales), 6 int8 (KV_PTH 1 only); see
                          8-BIT CACHES
             TILE_TOKENS  query tokens per CTA; TILE_TOKENS * GROUP <= 128
   flags     KV_PTH       1: per-token-head scales (DT_KV 4 or 6), see 8-BIT CACHES
             WINDOW SOFTCAP ALIBI   (0/1, default 0; WINDOW and SOFTCAP take their values
             from params; WINDOW 1 with params.window 0 means no window). Causality is not
             a define: it is a per-work-item flag (WORK LIST, item 7).
   tuning    WARPS_N      warps sharing one row tile, each on its slice of a K/V tile
             WARP_ROWS    row tiles of 16 per warp, 1 (default) or 2 (FlashAttention-2: each
                          K/V fragment read from shared memory feeds two mma). A request: 2 is
                          in force only with tensor cores, an even number of row tiles,
                          HEAD_DIM <= 128, SOFTCAP 0 and ALIBI 0 (the register file holds no
                          more); elsewhere it quietly stays 1, so one -D serves every variant
             KV_TILE      keys per K/V tile (shared-memory stage)
             KV_STAGES    K/V tiles in shared memory (default 2, double-buffered; 3 for
                          decode shapes on sm_90 whose stages fit in 112 KiB)
             MIN_CTAS     CTAs per SM the registers must allow (default 1; 3 for the 8-bit
                          decode on sm_90)
             Q_IN_REGS    keep the Q fragments in registers (default: MMA, HEAD_DIM <= 128
                          and one row tile per warp; with two, Q is read from shared memory
                          per K/V tile)
             (defaults below; the values in force are exported, see attn_paged_config)
   Tensor cores (mma.sync m16n8k16, f32 accumulators) when DT_Q == DT_KV and both are
   f16 or bf16, and for every 8-bit cache (f16 mma, any DT_Q); otherwise (any f32 involved, or mixed 16-bit types) a plain-FMA variant
   with the same tiling, the same softmax and the same epilogue, in f32 throughout.
   Suggested variants (the CUDA backend's, attn__cuda_layer_variants in attn.h): decode
   (query_len 1): TILE_TOKENS = max(1, 16 / GROUP), so that one warp's 16 rows hold the
   whole group, in two shapes: the default (4 warps, 64-key tiles, 2 CTAs per SM on sm_90)
   for batches that fill the device, and KV_TILE 128 WARPS_N 8 KV_STAGES 3 (one 8-warp CTA
   per SM, sm_90) for batches of at most one tile per SM; prefill: TILE_TOKENS = max(1, 64 /
   GROUP) (four row tiles, four warps), or with WARP_ROWS 2 TILE_TOKENS = 128 / GROUP
   (eight row tiles, four warps of 32 rows: FlashAttention-2's 128 x 64 block; 64 / GROUP
   gives two warps). One launch serves any mix of requests; a mixed batch runs best as two
   launches (decodes with the decode variant, the rest with the prefill variant), each
   with its own work list, because a decode row in a prefill CTA leaves three of its four
   warps idle.

   =====================================================================================
   LAUNCH
   =====================================================================================
   attn_paged_attention:      grid (>= *num_work, 1, 1), block (attn_paged_config.threads),
                              dynamic shared memory attn_paged_config.shared_bytes bytes (over 48 KiB
                              for most variants: set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_
                              SIZE_BYTES once after loading). CTAs past *num_work exit, so a
                              graph captured with the capacity replays any smaller batch.
                              A wrong block size or too little shared memory traps.
   attn_paged_merge_partials: grid (>= *num_merge), block 128, no shared memory; launch it
                              after attn_paged_attention on the same stream when work items
                              write partials without a merge index (flags bits 8+ = 0).
                              Items that carry one merge in the attention launch itself
                              (FUSED MERGE below) and need no second launch.
   Both take the same attn__paged_params by value. Requirements: kv_cache 16-byte aligned
   (cp.async); partial_o/partial_ml 16-byte aligned; q/out rows need not be aligned (16-byte
   paths are taken when they are).
   attn_paged_config (an extern "C" __constant__ attn__launch_config, attn_params.cuh; read it with cuModuleGetGlobal +
   cuMemcpyDtoH at layer init): {threads, dynamic shared bytes, KV_TILE, TILE_TOKENS * GROUP
   (= rows of a partial slot), TILE_TOKENS, KV_STAGES, WARPS_N, 1 if tensor cores}.

   =====================================================================================
   WORK LIST (host-built, device memory; one entry per CTA, 8 x int32 = 32 bytes)
   =====================================================================================
     work[8*i + 0]  req       request index (row of block_table, seq_lens, query_start_loc)
     work[8*i + 1]  kv_head   0 .. num_kv_heads-1; the CTA serves query heads
                              kv_head*GROUP .. kv_head*GROUP + GROUP-1
     work[8*i + 2]  tok0      first query token of the tile, 0-based within the request
     work[8*i + 3]  ntok      query tokens in the tile, 1..TILE_TOKENS (tok0+ntok <= query_len)
     work[8*i + 4]  key0      first key the CTA reads (absolute position, >= 0)
     work[8*i + 5]  key1      one past the last key (<= seq_len; clamped to it). The CTA
                              never reads a key outside [key0, key1) and masks each row to
                              its visible range inside it: give the union of the tile's
                              visible ranges, or a part of it for split-KV (an empty range
                              is allowed: rows with nothing visible)
     work[8*i + 6]  slot      -1: write out (and lse) for these rows; >= 0: write an
                              unnormalised partial into partial slot `slot` instead
     work[8*i + 7]  flags     bit 0: causal (hi = pos + 1); bits 1-7: 0; bits 8-31:
                              merge index + 1 of a split item (0: none), see FUSED MERGE
   Split-KV: the splits of one (req, kv_head, tok0, ntok) tile cover disjoint key ranges
   whose union is the tile's visible range, and use consecutive slots slot0..slot0+n-1;
   split boundaries at multiples of KV_TILE (and of BLOCK_SIZE) waste no loads. Order the
   list longest first (key1 - key0) so the long items start early. Split only as far as
   one wave of resident CTAs (cuOccupancyMaxActiveBlocksPerMultiprocessor x SMs; a decode
   CTA of head 128 on an H200 is 2 per SM): a second, partial wave costs more than the
   splits gain. tests/cuda_kernels.c (build_work) is a reference scheduler.
   MERGE LIST (one entry per split tile, 8 x int32):
     merge[8*i + 0..3]  req, kv_head, tok0, ntok   (as the tile's work items)
     merge[8*i + 4]     slot0      first slot of the tile's splits
     merge[8*i + 5]     num_splits
     merge[8*i + 6..7]  0          reserved
   PARTIAL WORKSPACE (f32): slot s holds ROWS = TILE_TOKENS * GROUP rows, row
   R = t * GROUP + g for query token tok0 + t and head kv_head*GROUP + g (rows t >= ntok
   are not written):
     partial_o  [num_slots][ROWS][HEAD_DIM]  O = sum_j 2^(s_j - m) v_j   (unnormalised)
     partial_ml [num_slots][ROWS][2]         (m, l): running max of s (base 2) and
                                             l = sum_j 2^(s_j - m); a row that saw no key
                                             has m = -inf, l = 0 and contributes nothing
   The merge: M = max of m over splits with l > 0; out = sum 2^(m - M) O / sum 2^(m - M) l.
   FUSED MERGE (variants of at most 16 rows, the decode shape): when a split item carries
   merge index i + 1 in flags and merge_count is given, the CTA that finishes last of merge entry i's splits merges them: each split CTA
   stores its partial, fences, and adds 1 to merge_count[i]; the one that sees
   num_splits - 1 reads every partial (L2 loads, never the read-only path) and writes
   out/lse, then sets merge_count[i] back to 0, so the counters are zero between launches
   (the host zeroes them once; a replayed graph finds them so).

   =====================================================================================
   8-BIT CACHES (DT_KV 4, 5, 6: the CPU backend's fp8 and int8 caches, same bytes)
   =====================================================================================
   Per tensor (KV_PTH 0, fp8): the cache holds code(x / k_scale) (and v_scale for V);
   the scales are params.k_scale / v_scale (device pointers to one float, read at every
   launch, so a replayed graph sees a new value) or, where those are NULL,
   params.k_scale_value / v_scale_value. A scale that is not finite and > 0 makes every
   CTA return at once: nothing is written (the host cannot check a device value without a
   synchronisation; the CPU backend fails the call instead).
   Per token and head (KV_PTH 1, int8 or e4m3): a block half is [BLOCK_SIZE][num_kv_heads]
   [HEAD_DIM] codes, then [BLOCK_SIZE][num_kv_heads] f32 scales (K half, then V half; the
   code rows stay 16-byte aligned), x = code * scale of its row.
   HEAD_DIM is a multiple of 16. The CTA copies codes (half the bytes of f16) with cp.async
   into the stages (rows of HEAD_DIM bytes, 16 more where that makes an even number of
   16-byte units: conflict-free ldmatrix) and, KV_PTH, each key's two scales (4-byte
   copies). The fragments come straight from the codes, converted once each in registers
   (exact: every code value is an f16; attn_codes4_to_f16x2): ldmatrix reads the code rows
   as b16 matrices. K (non-transposed): lane (g, t) gets key g's codes of dims 4t .. 4t + 3
   of a 16-dim block, i.e. b0 and b1 of the B fragment if the mma's k index 2t + j means
   dim 4t + j and 2t + 8 + j means dim 4t + 2 + j: Q is stored in shared memory with its
   columns in that order. V (.trans): lane (g, t) gets the codes of dims 2g and 2g + 1 for
   keys 2t and 2t + 1 (and + 8); a byte permute makes the B fragment of dim 2g (even) and
   of dim 2g + 1 (odd), so O's n8 tiles hold the even and the odd dims of each 16 and the
   epilogue puts them back in order. The mma type is f16 whatever DT_Q is: Q is converted
   to f16 once, scaled by a power of two 2^e chosen per CTA from its rows' largest |q|
   (into [2^14, 2^15): no overflow, no subnormals that matter), and 2^-e goes into the
   score scale with k_scale (per tensor). Per token and
   head: each score is multiplied by its key's K scale; each probability by its key's V
   scale over 2^E (E the largest V-scale exponent the warp has seen: O is rescaled by a
   power of two when it grows, as the softmax max) before P V, while l sums the unscaled
   probabilities; O is multiplied by v_scale (per tensor) or 2^E in the epilogue. So S,
   the softmax and O are the CPU's up to the order of the sums and P's rounding to f16.
   Q rows need no alignment here (read element by element, once per CTA).

   =====================================================================================
   INSIDE A CTA
   =====================================================================================
   Rows: the CTA's ROWS = TILE_TOKENS * GROUP query rows (row R = token R / GROUP, head
   member R % GROUP; rows of tokens >= ntok are padding, zero Q, never stored), padded to
   ROW_TILES * 16. Warp w = wm * WARPS_N + wn owns row tiles wm * WARP_ROWS ..
   wm * WARP_ROWS + WARP_ROWS - 1 (16 rows each, the M of mma) and key slice wn: keys
   [wn * KW, (wn + 1) * KW) of every K/V tile, KW = KV_TILE / WARPS_N; the CTA has
   ROW_TILES / WARP_ROWS * WARPS_N warps (attn_paged_config.threads / 32). So a decode CTA (one
   row tile) has four warps splitting each tile's keys, a prefill CTA four warps of 16 rows
   (or, WARP_ROWS 2, of 32 rows) each reading the whole tile (FlashAttention-2). Each warp
   keeps its own online softmax (m, l per row, O in registers, per row tile); the epilogue
   combines the WARPS_N slices of a row through shared memory.
   Pipeline (all threads): the CTA walks tiles of KV_TILE keys aligned to multiples of
   KV_TILE, from floor(key0 / KV_TILE) * KV_TILE to key1. Every thread copies fixed 16-byte
   chunks (the same chunk positions in every tile) of K and V with cp.async into stage
   (tile % KV_STAGES); keys outside [key0, key1) are zero-filled and never read from
   global memory (nor is their block_table entry). The byte offset in the cache of every
   key row of the tiles in flight (block * block bytes + row in block * row bytes, read
   from block_table) sits in shared memory (sBlk), so a copy's address is one 64-bit add;
   the offsets of tile it + KV_STAGES are loaded into registers before tile it computes
   and stored after it, so the block-table latency hides under compute. Per tile: wait for the tile's group,
   __syncthreads (tile visible, and every warp is done with the stage about to be
   refilled), issue the copy of tile it + KV_STAGES - 1, compute tile it. One barrier per
   tile.
   Compute per warp and tile (tensor cores): S = Q K^T (Q fragments by ldmatrix from shared
   memory, K fragments by ldmatrix, m16n8k16 with f32 accumulators), scale/soft cap/ALiBi/
   mask in registers (masking only on tiles that cross a row's visible range; a warp skips
   tiles none of its rows sees: causal tiles above the diagonal), online softmax in base 2
   with ex2.approx (rows reduced over the 4 lanes of an mma row group), P converted to
   16-bit in registers as the A operand of O += P V (V fragments by ldmatrix.trans). With
   WARP_ROWS 2 each K fragment (per 16 dims x 16 keys) and each V fragment (per 16 keys x
   16 dims) is loaded once and feeds the mma of both row tiles; the skip and mask tests
   cover the warp's 32 rows.
   FMA variant: the same S and O fragment layout (lane 4g+t: rows g and g+8; columns
   8n + 2t, 8n + 2t + 1), computed with f32 FMAs from shared memory; P is broadcast to the
   lanes of its row with shuffles.
   Epilogue: O, m, l of every warp to shared memory (over the K/V stages), then all threads
   combine the WARPS_N slices of each row and write 8 elements at a time: normalised rows
   to out (and lse), or the partial to the workspace.
   Shared memory: [Q: ROW_TILES*16 rows x Q_PITCH][sBlk: KV_STAGES x KV_TILE int64]
   [K: KV_STAGES x KV_TILE x KV_PITCH][V: same], rows padded by 16 bytes so ldmatrix reads
   8 rows without bank conflicts; for HEAD_DIM % 16 == 8 the Q and K rows carry 8 zero
   columns up to a multiple of 16. The epilogue reuses the K/V stages:
   [O: WARPS_N x ROW_TILES*16 x (HEAD_DIM + 4) f32][m: WARPS_N x rows][l: WARPS_N x rows x 4].
   attn_paged_config.shared_bytes is the total; the kernel traps when the launch gives less. */
#include "paged_common.cuh"

#if !defined(HEAD_DIM) || !defined(BLOCK_SIZE) || !defined(GROUP) || !defined(DT_Q) || \
    !defined(DT_KV) || !defined(TILE_TOKENS)
#error "paged_attention.cu: define HEAD_DIM, BLOCK_SIZE, GROUP, DT_Q, DT_KV and TILE_TOKENS"
#endif
#if HEAD_DIM % 8 != 0 || HEAD_DIM < 8 || HEAD_DIM > 256
#error "paged_attention.cu: HEAD_DIM must be a multiple of 8 in 8..256"
#endif
#if BLOCK_SIZE % 16 != 0 || BLOCK_SIZE <= 0
#error "paged_attention.cu: BLOCK_SIZE must be a positive multiple of 16"
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
#ifndef ALIBI
#define ALIBI 0
#endif
#ifndef KV_PTH
#define KV_PTH 0
#endif
#define ATTN_KV8 ATTN_DT_IS_8BIT(DT_KV)
#if DT_Q < 0 || DT_Q > 2 || DT_KV < 0 || DT_KV > 6 || DT_KV == 3
#error "paged_attention.cu: DT_Q must be 0-2, DT_KV 0-2 or 4-6"
#endif
#if KV_PTH && DT_KV != ATTN_DT_E4M3 && DT_KV != ATTN_DT_I8
#error "paged_attention.cu: KV_PTH 1 takes DT_KV 4 (fp8 e4m3) or 6 (int8)"
#endif
#if DT_KV == ATTN_DT_I8 && !KV_PTH
#error "paged_attention.cu: an int8 cache has per-token-head scales (KV_PTH 1)"
#endif
#if ATTN_KV8 && HEAD_DIM % 16 != 0
#error "paged_attention.cu: 8-bit caches take HEAD_DIM a multiple of 16"
#endif

#define ATTN_ROWS (TILE_TOKENS * GROUP)
#define ATTN_ROW_TILES ((ATTN_ROWS + 15) / 16)
#define ATTN_ROWS_PAD (ATTN_ROW_TILES * 16)
#if TILE_TOKENS < 1 || GROUP < 1 || ATTN_ROWS > 128
#error "paged_attention.cu: need TILE_TOKENS >= 1, GROUP >= 1 and TILE_TOKENS * GROUP <= 128"
#endif
#define ATTN_USE_MMA (ATTN_KV8 || (DT_Q == DT_KV && DT_Q != ATTN_DT_F32))
#define ATTN_DT_M (ATTN_KV8 ? ATTN_DT_F16 : DT_Q) /* the mma's input type */
#define ATTN_ESZ_Q (DT_Q == ATTN_DT_F32 ? 4 : 2)
#define ATTN_ESZ_SQ (ATTN_KV8 ? 2 : ATTN_ESZ_Q)   /* Q in shared memory: f16 for 8-bit caches */
#define ATTN_ESZ_KV (DT_KV == ATTN_DT_F32 ? 4 : ATTN_KV8 ? 1 : 2)
#define ATTN_BIG_ROWS (HEAD_DIM * ATTN_ESZ_KV > 512) /* FMA variant: f32 rows over 128 wide */

#ifndef WARP_ROWS
#define WARP_ROWS 1
#endif
#if WARP_ROWS != 1 && WARP_ROWS != 2
#error "paged_attention.cu: WARP_ROWS must be 1 or 2"
#endif
/* WARP_ROWS 2 is a request, in force only where it fits: tensor cores (the FMA variant keeps
   one row tile per warp), an even number of row tiles, HEAD_DIM <= 128 (two row tiles of O
   at 256 wide alone are 256 registers), SOFTCAP 0 and ALIBI 0 (ptxas sits at 255 registers
   with two row tiles, and their per-score work tips it into spills at some head sizes).
   Elsewhere it falls back to 1, so one -D can go to every variant of a layer. */
#if WARP_ROWS == 2 && ATTN_USE_MMA && ATTN_ROW_TILES % 2 == 0 && HEAD_DIM <= 128 && !SOFTCAP && !ALIBI
#define ATTN_WARP_ROWS 2
#else
#define ATTN_WARP_ROWS 1
#endif
#ifndef WARPS_N
#if ATTN_USE_MMA || !ATTN_BIG_ROWS
#define WARPS_N (ATTN_ROW_TILES == 1 ? 4 : ATTN_ROW_TILES == 2 ? 2 : 1)
#else
#define WARPS_N (ATTN_ROW_TILES <= 2 ? 2 : 1)
#endif
#endif
#define ATTN_WARP_RT (ATTN_ROW_TILES / ATTN_WARP_ROWS) /* warps along the rows */
#define ATTN_WARPS (ATTN_WARP_RT * WARPS_N)
#define ATTN_THREADS (32 * ATTN_WARPS)
#if ATTN_THREADS > 512
#error "paged_attention.cu: more than 16 warps; lower WARPS_N"
#endif

#define ATTN_MAX_(a, b) ((a) > (b) ? (a) : (b))
/* 8-bit decode shapes on sm_90 (H200, 32/8 heads, head 128, attn-bench's 8-bit table with
   ATTN_BENCH_KV8_DEFINES): 128-key tiles x 2 stages, two CTAs per SM. Per tensor they beat
   64 x 4 (batch 128 x 16k 1066 against 1136 us, 64 x 4k 148 against 157) and 64 x 3 with
   three CTAs per SM (1106, 189). Per token and head, with registers for two CTAs (capped
   for three, ptxas spills): e4m3 64 x 16k 586 against 790 us for 64 x 3 with three CTAs,
   128 x 16k 1207 against 1270; int8 128 x 4k the one case behind (371 against 340 us) */
#define ATTN_KV8_DECODE90 (ATTN_KV8 && ATTN_ROW_TILES == 1 && __CUDA_ARCH__ >= 900 && HEAD_DIM <= 128)
#ifndef KV_TILE
#if ATTN_KV8_DECODE90
#define KV_TILE 128
#elif ATTN_USE_MMA
#define KV_TILE ATTN_MAX_(16 * WARPS_N, HEAD_DIM <= 128 ? 64 : 32)
#else
#define KV_TILE ATTN_MAX_(8 * WARPS_N, ATTN_BIG_ROWS ? 16 : 32)
#endif
#endif
#define ATTN_KW (KV_TILE / WARPS_N) /* keys of a tile per warp */
#define ATTN_NT (ATTN_KW / 8)       /* n8 tiles of S per warp */
#define ATTN_OT (HEAD_DIM / 8)      /* n8 tiles of O per warp */
#if KV_TILE % WARPS_N != 0 || ATTN_KW % (ATTN_USE_MMA ? 16 : 8) != 0
#error "paged_attention.cu: KV_TILE / WARPS_N must be a multiple of 16 (tensor cores) or 8 (FMA)"
#endif
#ifndef Q_IN_REGS
/* two row tiles of Q are 64 registers at head 128 (FlashAttention-2 too reads Q from shared
   memory per K/V tile); at head 64 ptxas takes the 32 but then spills on the flags */
#define Q_IN_REGS (ATTN_USE_MMA && HEAD_DIM <= 128 && ATTN_WARP_ROWS == 1)
#endif

#define ATTN_HDP ((HEAD_DIM + 15) / 16 * 16) /* k extent of Q K^T on tensor cores */
/* Row pitches in elements: 16 bytes past the data (conflict-free ldmatrix). */
#define ATTN_Q_PITCH (ATTN_USE_MMA ? ATTN_HDP + 8 : HEAD_DIM + 16 / ATTN_ESZ_Q)
/* K/V rows that fragments are read from (8-bit caches: the f16 conversion buffer's) */
#define ATTN_KV_PITCH (ATTN_USE_MMA ? ATTN_HDP + 8 : HEAD_DIM + 16 / ATTN_ESZ_KV)
/* A stage row in bytes. 8-bit codes: HEAD_DIM bytes and 16 more where that makes an even
   number of 16-byte units (an odd number: ldmatrix's 8 rows in 8 different bank groups). */
#define ATTN_SROW (ATTN_KV8 ? HEAD_DIM + (HEAD_DIM / 16 % 2 == 0 ? 16 : 0) : ATTN_KV_PITCH * ATTN_ESZ_KV)
/* 8-bit caches: the stages and scales of `st` stages */
#define ATTN_KV8_BYTES(st) ((st) * (2 * KV_TILE * ATTN_SROW + (KV_PTH ? 8 * KV_TILE : 0)))
#define ATTN_O_PITCH (HEAD_DIM + 4) /* floats, epilogue */
#if !defined(KV_STAGES) && ATTN_KV8
/* 8-bit caches: two stages (sm_90 decode: of 128 keys, see ATTN_KV8_DECODE90) */
#define KV_STAGES 2
#endif
#ifndef KV_STAGES
/* A decode-shaped CTA (one row tile) waits on memory: on sm_90 (228 KiB of shared memory
   per SM) a third tile in flight pays (H200: 4.2 against 4.0 TB/s at batch 128) when the
   stages stay within 112 KiB, two CTAs still fitting. A prefill CTA, and sm_80 (164 KiB),
   are better off with two stages and more CTAs per SM. */
#if ATTN_ROW_TILES == 1 && __CUDA_ARCH__ >= 900 && 3 * 2 * KV_TILE * ATTN_KV_PITCH * ATTN_ESZ_KV <= 114688
#define KV_STAGES 3
#else
#define KV_STAGES 2
#endif
#endif
#if KV_STAGES < 2
#error "paged_attention.cu: KV_STAGES must be at least 2"
#endif
#define ATTN_SQ_BYTES (ATTN_ROWS_PAD * ATTN_Q_PITCH * ATTN_ESZ_SQ)
#define ATTN_TILE_BYTES (KV_TILE * ATTN_SROW) /* one K (or V) tile */
#define ATTN_SCL_BYTES (KV_PTH ? KV_STAGES * 2 * KV_TILE * 4 : 0) /* KV_PTH: K, V scales per stage */
#define ATTN_KV_BYTES (KV_STAGES * 2 * ATTN_TILE_BYTES + ATTN_SCL_BYTES)
#define ATTN_EPI_BYTES (WARPS_N * ATTN_ROWS_PAD * (ATTN_O_PITCH + 5) * 4) /* O, m, 4 partial l */
/* cache row offsets of the tiles in flight (KV_PTH: and each row's scale offset from it) */
#define ATTN_SBLK_BYTES (KV_STAGES * KV_TILE * (KV_PTH ? 12 : 8))
#define ATTN_SMEM_BYTES (ATTN_SQ_BYTES + ATTN_SBLK_BYTES + ATTN_MAX_(ATTN_KV_BYTES, ATTN_EPI_BYTES))

#define ATTN_KV_CPR (HEAD_DIM * ATTN_ESZ_KV / 16)   /* 16-byte chunks per K/V row */
#define ATTN_KV_CHUNKS (KV_TILE * ATTN_KV_CPR)      /* chunks per K (or V) tile */
#define ATTN_KV_LPT ((ATTN_KV_CHUNKS + ATTN_THREADS - 1) / ATTN_THREADS) /* per thread */
#define ATTN_KV_BPT ((KV_TILE + ATTN_THREADS - 1) / ATTN_THREADS)   /* block numbers per thread */

typedef typename attn_elem<DT_Q>::storage attn_q_t;
#if ATTN_KV8
typedef attn_u8 attn_kv_t;   /* codes */
typedef attn_u16 attn_sq_t;  /* Q in shared memory: f16 */
#else
typedef typename attn_elem<DT_KV>::storage attn_kv_t;
typedef attn_q_t attn_sq_t;
#endif


extern "C" __constant__ attn__launch_config attn_paged_config = {
    ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ATTN_ROWS, TILE_TOKENS, KV_STAGES, WARPS_N, ATTN_USE_MMA};


/* Shared-memory reads of the FMA variant: 4 (or 2) consecutive elements as f32. */
struct __align__(8) attn_vec8 { attn_u32 x, y; };
template <int ET> ATTN_DEV void attn_lds4(const void *p, float *f) {
    if (ET == ATTN_DT_F32) {
        attn_vec16 v = *(const attn_vec16 *)p;
        f[0] = __int_as_float(v.x); f[1] = __int_as_float(v.y);
        f[2] = __int_as_float(v.z); f[3] = __int_as_float(v.w);
    } else {
        attn_vec8 v = *(const attn_vec8 *)p;
        f[0] = attn_elem<ET>::to_f32((attn_u16)(v.x & 0xffffu)); f[1] = attn_elem<ET>::to_f32((attn_u16)(v.x >> 16));
        f[2] = attn_elem<ET>::to_f32((attn_u16)(v.y & 0xffffu)); f[3] = attn_elem<ET>::to_f32((attn_u16)(v.y >> 16));
    }
}
template <int ET> ATTN_DEV void attn_lds2(const void *p, float *f) {
    if (ET == ATTN_DT_F32) {
        attn_vec8 v = *(const attn_vec8 *)p;
        f[0] = __int_as_float(v.x); f[1] = __int_as_float(v.y);
    } else {
        attn_u32 v = *(const attn_u32 *)p;
        f[0] = attn_elem<ET>::to_f32((attn_u16)(v & 0xffffu)); f[1] = attn_elem<ET>::to_f32((attn_u16)(v >> 16));
    }
}

#if ATTN_USE_MMA
/* The A fragment of P for keys 16 kk .. 16 kk + 15: the C fragments of S's n8 tiles 2 kk and
   2 kk + 1 (one row tile), rounded to the mma type. */
ATTN_DEV void attn_p_fragment(const float (*s)[4], int kk, attn_u32 *a) {
    a[0] = attn_elem<ATTN_DT_M>::pack2(s[2 * kk][0], s[2 * kk][1]);
    a[1] = attn_elem<ATTN_DT_M>::pack2(s[2 * kk][2], s[2 * kk][3]);
    a[2] = attn_elem<ATTN_DT_M>::pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = attn_elem<ATTN_DT_M>::pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}
#endif

/* Writes 8 finished elements (columns 8c..8c+7) of row R of a tile: out and lse, or the
   partial slot. O is unnormalised; (m, l) its base-2 max and sum. The CPU's
   attn__cpu_store_rows. out_vec: every out row is 16-byte aligned (attn_out_vec). */
ATTN_DEV void attn_store_row8(const attn__paged_params &p, int q_row0, int kv_head, int slot, int R,
                              int c, const float *O, float m, float l, int out_vec) {
    if (slot >= 0) {
        float *dst = p.partial_o + ((attn_i64)slot * ATTN_ROWS + R) * HEAD_DIM + c * 8;
        attn_vec16 v[2];
        attn_pack8<ATTN_DT_F32>(O, v);
        attn_stg16(dst, v[0]);
        attn_stg16(dst + 4, v[1]);
        if (c == 0) {
            float *ml = p.partial_ml + ((attn_i64)slot * ATTN_ROWS + R) * 2;
            ml[0] = m;
            ml[1] = l;
        }
        return;
    }
    const int t = R / GROUP, head = kv_head * GROUP + (R - t * GROUP);
    const attn_i64 token = q_row0 + t;
    float inv = l > 0.0f ? attn_rcp(l) : 0.0f, f[8]; /* l >= 1 when a key was seen */
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = O[i] * inv;
    char *dst = (char *)p.out + (token * p.out_stride_token + head * p.out_stride_head + c * 8) * ATTN_ESZ_Q;
    if (out_vec) {
        attn_vec16 v[2];
        attn_pack8<DT_Q>(f, v);
        attn_stg16(dst, v[0]);
        if (ATTN_ESZ_Q == 4) attn_stg16(dst + 16, v[1]);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) ((attn_q_t *)dst)[i] = attn_elem<DT_Q>::from_f32(f[i]);
    }
    if (c == 0 && p.lse)
        p.lse[token * p.lse_stride_token + head * p.lse_stride_head] =
            l > 0.0f ? (m + attn_log2(l)) * ATTN_LN2 : attn_neg_inf();
}

/* The same for every row of the launch, so the choice is made once, not per element
   (a per-row test inside the store loops also makes ptxas spill). */
ATTN_DEV int attn_out_vec(const attn__paged_params &p) {
    return attn_aligned16(p.out) && ((p.out_stride_token * ATTN_ESZ_Q) & 15) == 0 &&
           ((p.out_stride_head * ATTN_ESZ_Q) & 15) == 0;
}

/* Merges the partial slots of merge entry `mi` into out/lse (the CPU's attn__cpu_merge_run),
   thread per (row, 8 columns), `nthreads` threads from `tid`. Loads at L2 (ld.global.cg):
   in the FUSED MERGE the partials were written by other CTAs of the same launch. */
ATTN_DEV void attn_merge_entry(const attn__paged_params &p, int mi, int tid, int nthreads) {
    const int *item = p.merge + 8 * (attn_i64)mi;
    const int req = item[0], kv_head = item[1], tok0 = item[2], ntok = item[3];
    const int slot0 = item[4], nsplit = item[5];
    const int q_row0 = p.query_start_loc[req] + tok0, out_vec = attn_out_vec(p);
    for (int u = tid; u < ntok * GROUP * ATTN_OT; u += nthreads) {
        const int R = u / ATTN_OT, c = u - R * ATTN_OT;
        float M = attn_neg_inf();
        for (int s = 0; s < nsplit; s++) {
            const float *ml = p.partial_ml + ((attn_i64)(slot0 + s) * ATTN_ROWS + R) * 2;
            M = fmaxf(M, __ldcg(ml + 1) > 0.0f ? __ldcg(ml) : attn_neg_inf());
        }
        const float Mb = M == attn_neg_inf() ? 0.0f : M;
        float L = 0.0f, f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < nsplit; s++) {
            const attn_i64 row = (attn_i64)(slot0 + s) * ATTN_ROWS + R;
            const float *ml = p.partial_ml + row * 2;
            const float ms = __ldcg(ml), ls = __ldcg(ml + 1);
            /* an empty split (l = 0) contributes nothing, whatever its O holds */
            const int used = ls > 0.0f;
            const float w = used ? attn_exp2(ms - Mb) : 0.0f;
            const float4 a = __ldcg((const float4 *)(p.partial_o + row * HEAD_DIM + c * 8));
            const float4 b = __ldcg((const float4 *)(p.partial_o + row * HEAD_DIM + c * 8 + 4));
            const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            L += used ? ls * w : 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] += used ? w * x[i] : 0.0f;
        }
        attn_store_row8(p, q_row0, kv_head, -1, R, c, f, M, L, out_vec);
    }
}

#ifndef MIN_CTAS /* tuning: CTAs per SM ptxas must leave registers for (__launch_bounds__) */
#if ATTN_KV8_DECODE90 && ATTN_THREADS == 128 && KV_TILE == 128
/* 8-bit decode on sm_90 (the shared memory of 128-key stages allows two CTAs per SM): per
   tensor, registers capped as for three (measured so); per token and head, two (capped at
   three it spills) */
#define MIN_CTAS (KV_PTH ? 2 : 3)
#else
#define MIN_CTAS 1
#endif
#endif
extern "C" __global__ void __launch_bounds__(ATTN_THREADS, MIN_CTAS) attn_paged_attention(const attn__paged_params p) {
    extern __shared__ attn_vec16 attn_smem[];
    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();
    if ((int)blockIdx.x >= *p.num_work) return;

    const int *item = p.work + 8 * (attn_i64)blockIdx.x;
    const int req = item[0], kv_head = item[1], tok0 = item[2], ntok = item[3], slot = item[6];
    const int causal = item[7] & 1;
    const int seq_len = p.seq_lens[req];
    const int q_start = p.query_start_loc[req], query_len = p.query_start_loc[req + 1] - q_start;
    const int key0 = attn_imax(item[4], 0), key1 = attn_imin(item[5], seq_len);
    const int nrows = ntok * GROUP;
#if ATTN_KV8 && !KV_PTH
    /* per-tensor fp8 scales: a bad one (not finite and > 0) writes nothing, see 8-BIT CACHES */
    const float k_scale = attn_cache_scale(p.k_scale, p.k_scale_value);
    const float v_scale = attn_cache_scale(p.v_scale, p.v_scale_value);
    if (k_scale == 0.0f || v_scale == 0.0f) return;
#else
    const float k_scale = 1.0f, v_scale = 1.0f;
#endif

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp - wm * WARPS_N;
    const int g = lane >> 2, tq = lane & 3; /* mma row group and lane within it */

    char *smem = (char *)attn_smem;
    attn_sq_t *sQ = (attn_sq_t *)smem;
    attn_i64 *sBlk = (attn_i64 *)(smem + ATTN_SQ_BYTES);                    /* [stage][key] */
    attn_kv_t *sK = (attn_kv_t *)(smem + ATTN_SQ_BYTES + ATTN_SBLK_BYTES);  /* [stage][key][pitch] */
    attn_kv_t *sV = (attn_kv_t *)((char *)sK + KV_STAGES * ATTN_TILE_BYTES);
    const attn_u32 sQ_addr = attn_smem_addr(sQ), sK_addr = attn_smem_addr(sK), sV_addr = attn_smem_addr(sV);
#if KV_PTH
    int *sDel = (int *)(sBlk + KV_STAGES * KV_TILE);           /* [stage][key]: scale offset - row offset */
    float *sKs = (float *)((char *)sK + 2 * KV_STAGES * ATTN_TILE_BYTES); /* [stage][key] K scales */
    float *sVs = sKs + KV_STAGES * KV_TILE;                                /* [stage][key] V scales */
    const attn_u32 sKs_addr = attn_smem_addr(sKs), sVs_addr = attn_smem_addr(sVs);
#endif
#if ATTN_KV8
    float q_unscale = 1.0f; /* 2^-e, the power of two Q was scaled by (8-BIT CACHES) */
#endif

    /* ---- Q rows -> shared memory (cp.async group 0, with the first K/V tile) ---- */
#if ATTN_KV8
    {   /* f16, scaled by 2^e: the CTA's largest |q| into [2^14, 2^15); the columns of each 16
           in the order the K fragments come (8-BIT CACHES) */
        __shared__ int attn_q_amax;
        if (tid == 0) attn_q_amax = 0;
        __syncthreads();
        auto q_at = [&](int r, int c) -> float {
            const int t = r / GROUP;
            return attn_load<DT_Q>(p.q, (attn_i64)(q_start + tok0 + t) * p.q_stride_token +
                                            (attn_i64)(kv_head * GROUP + r - t * GROUP) * p.q_stride_head + c);
        };
        float amax = 0.0f;
        for (int u = tid; u < nrows * HEAD_DIM; u += ATTN_THREADS) amax = fmaxf(amax, fabsf(q_at(u / HEAD_DIM, u % HEAD_DIM)));
        atomicMax(&attn_q_amax, __float_as_int(amax)); /* non-negative floats order as ints */
        __syncthreads();
        const int ex = (attn_q_amax >> 23) & 0xff; /* biased exponent of the largest |q| */
        const int sh = attn_q_amax == 0 || ex == 255 ? 0 : attn_imax(-100, attn_imin(100, 141 - ex));
        const float qmul = __int_as_float((127 + sh / 2) << 23) * __int_as_float((127 + sh - sh / 2) << 23);
        q_unscale = __int_as_float((127 - sh / 2) << 23) * __int_as_float((127 - sh + sh / 2) << 23);
        for (int u = tid; u < ATTN_ROWS_PAD * HEAD_DIM; u += ATTN_THREADS) {
            const int r = u / HEAD_DIM, c = u - r * HEAD_DIM, x = c & 15;
            /* mma k column x of a 16-block holds dim 4 (x / 2) + x % 2 (x < 8) or that + 2 */
            const int dim = (c & ~15) + 4 * ((x & 7) >> 1) + (x & 1) + (x >= 8 ? 2 : 0);
            sQ[r * ATTN_Q_PITCH + c] = attn_f32_to_f16(r < nrows ? q_at(r, dim) * qmul : 0.0f);
        }
    }
    {
#else
    {
        const int cpr = HEAD_DIM * ATTN_ESZ_Q / 16;
        const int vec = attn_aligned16(p.q) && ((p.q_stride_token * ATTN_ESZ_Q) & 15) == 0 &&
                        ((p.q_stride_head * ATTN_ESZ_Q) & 15) == 0;
        for (int c = tid; c < ATTN_ROWS_PAD * cpr; c += ATTN_THREADS) {
            const int r = c / cpr, col = c - r * cpr, t = r / GROUP;
            const int valid = r < nrows;
            const char *src = valid ? (const char *)p.q +
                                          ((attn_i64)(q_start + tok0 + t) * p.q_stride_token +
                                           (attn_i64)(kv_head * GROUP + r - t * GROUP) * p.q_stride_head) * ATTN_ESZ_Q + col * 16
                                    : (const char *)p.q;
            char *dst = (char *)sQ + r * (ATTN_Q_PITCH * ATTN_ESZ_SQ) + col * 16;
            if (vec) {
                attn_cp_async16(attn_smem_addr(dst), src, valid ? 16 : 0);
            } else {
#pragma unroll
                for (int i = 0; i < 16 / ATTN_ESZ_Q; i++)
                    ((attn_q_t *)dst)[i] = valid ? ((const attn_q_t *)src)[i] : (attn_q_t)0;
            }
        }
#endif /* ATTN_KV8 */
#if ATTN_USE_MMA && HEAD_DIM % 16 != 0
        /* the 8 columns past HEAD_DIM enter Q K^T: zero in Q and in every K stage (cp.async
           never writes them) */
        for (int r = tid; r < ATTN_ROWS_PAD + KV_STAGES * KV_TILE; r += ATTN_THREADS) {
            attn_vec16 z = {0u, 0u, 0u, 0u};
            if (r < ATTN_ROWS_PAD) *(attn_vec16 *)(sQ + r * ATTN_Q_PITCH + HEAD_DIM) = z;
            else *(attn_vec16 *)(sK + (r - ATTN_ROWS_PAD) * ATTN_KV_PITCH + HEAD_DIM) = z;
        }
#endif
    }

    /* ---- this lane's rows (g and g + 8 of each of the warp's row tiles): visible keys ---- */
    const int row0 = wm * ATTN_WARP_ROWS * 16; /* the warp's first row; row tile wr at row0 + 16 wr */
    int lo[ATTN_WARP_ROWS][2], hi[ATTN_WARP_ROWS][2];
#if ALIBI
    int qpos[ATTN_WARP_ROWS][2];
    float slope[ATTN_WARP_ROWS][2];
#endif
    int lo_min = 0x7fffffff, lo_max = (int)0x80000000, hi_min = 0x7fffffff, hi_max = (int)0x80000000;
#pragma unroll
    for (int x = 0; x < 2 * ATTN_WARP_ROWS; x++) {
        const int wr = x >> 1, rr = x & 1;
        const int R = row0 + wr * 16 + g + 8 * rr, t = R / GROUP;
        const int valid = R < nrows;
        const int pos = seq_len - query_len + tok0 + t;
        int a, b;
        attn_visible_keys<WINDOW>(p, causal, pos, seq_len, key0, key1, a, b);
        lo[wr][rr] = valid ? a : 0;
        hi[wr][rr] = valid ? b : 0;
#if ALIBI
        qpos[wr][rr] = pos;
        slope[wr][rr] = valid ? p.alibi_slopes[kv_head * GROUP + (R - t * GROUP)] * ATTN_LOG2E : 0.0f;
#endif
        if (valid) {
            lo_min = attn_imin(lo_min, a); lo_max = attn_imax(lo_max, a);
            hi_min = attn_imin(hi_min, b); hi_max = attn_imax(hi_max, b);
        }
    }
    lo_min = attn_warp_imin(lo_min); lo_max = attn_warp_imax(lo_max);
    hi_min = attn_warp_imin(hi_min); hi_max = attn_warp_imax(hi_max);

    /* ---- K/V loader ----
       Thread chunk i: row kv_row(i) of the tile, 16-byte column kv_col (the same positions
       in every tile). The cache byte offset of every row of a tile (head 0's K row) is in
       sBlk[stage][row] (-1: the key is outside [key0, key1): zero-fill, nothing read). The
       offsets of tile it + KV_STAGES are loaded into registers while tile it computes and
       stored to sBlk after it, so the block-table latency hides under compute. */
    const char *kv_base = (const char *)p.kv_cache;
    /* a block half (K or V): BLOCK_SIZE x num_kv_heads rows (KV_PTH: then their scales) */
    const attn_i64 v_bytes = (attn_i64)BLOCK_SIZE * p.num_kv_heads * (HEAD_DIM * ATTN_ESZ_KV + (KV_PTH ? 4 : 0));
    const attn_i64 blk_bytes = 2 * v_bytes;
    const int *bt = p.block_table + (attn_i64)req * p.block_table_stride;
    const unsigned utid = (unsigned)tid;

    auto kv_row = [&](int i) -> int {
        return ATTN_THREADS % ATTN_KV_CPR == 0 ? (int)(utid / ATTN_KV_CPR) + i * (ATTN_THREADS / ATTN_KV_CPR)
                                               : (int)((utid + i * ATTN_THREADS) / ATTN_KV_CPR);
    };
    auto kv_col = [&](int i) -> int {
        return ATTN_THREADS % ATTN_KV_CPR == 0 ? (int)(utid % ATTN_KV_CPR) : (int)((utid + i * ATTN_THREADS) % ATTN_KV_CPR);
    };
    auto block_of = [&](int j) -> int { /* physical block of key j, -1 outside [key0, key1) */
        return j >= key0 && j < key1 ? bt[(unsigned)j / BLOCK_SIZE] : -1;
    };
    /* byte offset in the cache of key j's K row (j absolute) for this CTA's KV head, given
       its block b; -1 for b = -1 */
    auto row_offset = [&](int b, int j) -> attn_i64 {
        return b >= 0 ? (attn_i64)b * blk_bytes +
                            ((attn_i64)((unsigned)j % BLOCK_SIZE) * p.num_kv_heads + kv_head) * (HEAD_DIM * ATTN_ESZ_KV)
                      : (attn_i64)-1;
    };
#if KV_PTH
    /* the K scale of key j's row sits this many bytes after its codes (the V scale as far
       after the V codes): the codes plane, then row x's scale, x = row in block * heads + head */
    auto scale_delta = [&](int j) -> int {
        const int x = (int)((unsigned)j % BLOCK_SIZE) * p.num_kv_heads + kv_head;
        return BLOCK_SIZE * p.num_kv_heads * HEAD_DIM - x * (HEAD_DIM - 4);
    };
#endif
    auto issue = [&](int stage) { /* cp.async of the tile whose rows sBlk[stage] holds */
#pragma unroll
        for (int i = 0; i < ATTN_KV_LPT; i++) {
            const int r = kv_row(i), col = kv_col(i);
            if (ATTN_KV_CHUNKS % ATTN_THREADS == 0 || r < KV_TILE) {
                const attn_i64 b = sBlk[stage * KV_TILE + r];
                const char *src = kv_base + (b >= 0 ? b + col * 16 : 0);
                const attn_u32 off = (attn_u32)((stage * KV_TILE + r) * ATTN_SROW + col * 16);
                attn_cp_async16_or_zero(sK_addr + off, src, b < 0);
                attn_cp_async16_or_zero(sV_addr + off, src + (b >= 0 ? v_bytes : 0), b < 0);
            }
        }
#if KV_PTH
        for (int r = tid; r < KV_TILE; r += ATTN_THREADS) { /* the rows' scales (0 outside the range) */
            const attn_i64 b = sBlk[stage * KV_TILE + r];
            const char *src = kv_base + (b >= 0 ? b + sDel[stage * KV_TILE + r] : 0);
            attn_cp_async4_or_zero(sKs_addr + (attn_u32)(stage * KV_TILE + r) * 4, src, b < 0);
            attn_cp_async4_or_zero(sVs_addr + (attn_u32)(stage * KV_TILE + r) * 4, src + (b >= 0 ? v_bytes : 0), b < 0);
        }
#endif
    };

    const int tile0 = key1 > key0 ? key0 / KV_TILE * KV_TILE : 0;
    const int ntiles = key1 > key0 ? (key1 - tile0 + KV_TILE - 1) / KV_TILE : 0;
    /* prologue: block numbers of tiles 0..KV_STAGES-1, then the copies of 0..KV_STAGES-2 */
#pragma unroll
    for (int s = 0; s < KV_STAGES; s++)
        for (int r = tid; r < KV_TILE; r += ATTN_THREADS) {
            sBlk[s * KV_TILE + r] = row_offset(block_of(tile0 + s * KV_TILE + r), tile0 + s * KV_TILE + r);
#if KV_PTH
            sDel[s * KV_TILE + r] = scale_delta(tile0 + s * KV_TILE + r);
#endif
        }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < KV_STAGES - 1; s++) {
        if (s < ntiles) issue(s);
        attn_cp_async_commit(); /* one group per tile slot, empty or not: uniform counting */
    }

    /* ---- per-warp softmax state, per row tile wr: rows g (rr 0) and g + 8 (rr 1); O in
       C-fragment layout ---- */
    float m[ATTN_WARP_ROWS][2], l[ATTN_WARP_ROWS][2], o[ATTN_WARP_ROWS][ATTN_OT][4];
#pragma unroll
    for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) {
        m[wr][0] = m[wr][1] = attn_neg_inf();
        l[wr][0] = l[wr][1] = 0.0f;
#pragma unroll
        for (int i = 0; i < ATTN_OT; i++) o[wr][i][0] = o[wr][i][1] = o[wr][i][2] = o[wr][i][3] = 0.0f;
    }
#if KV_PTH
    int v_e = 1; /* biased exponent E: O holds sum p * (v scale / 2^(E - 127)) * code */
#endif
    /* the q.k each score needs from the mma's: 8-bit caches, k_scale, 2^-e, the code factor */
#if ATTN_KV8
    const float kv_fac = k_scale * q_unscale * attn_code_factor<DT_KV>();
#else
    const float kv_fac = 1.0f;
#endif
#if SOFTCAP
    const float cap_inv = 1.0f / p.softcap, cap_log2 = p.softcap * ATTN_LOG2E, qk_scale = p.scale * kv_fac;
#else
    const float qk_scale = p.scale * ATTN_LOG2E * kv_fac;
#endif

#if ATTN_USE_MMA
    /* lane offsets (bytes) of the ldmatrix row addresses, see the fragment table in
       attn_common.cuh: Q as A (rows lane%16, column half lane/16), K as B (keys lane%8 +
       8*(lane/16), column half (lane/8)%2), V as B transposed (keys lane%16, column half
       lane/16) */
    const attn_u32 q_lane = (attn_u32)(((row0 + (lane & 15)) * ATTN_Q_PITCH + (lane >> 4) * 8) * 2);
    const attn_u32 k_lane = (attn_u32)((((lane & 7) + ((lane >> 4) << 3)) * ATTN_KV_PITCH + ((lane >> 3) & 1) * 8) * 2);
    const attn_u32 v_lane = (attn_u32)(((lane & 15) * ATTN_KV_PITCH + (lane >> 4) * 8) * 2);
#if Q_IN_REGS
    attn_u32 qf[ATTN_WARP_ROWS][ATTN_HDP / 16][4];
#endif
#if ATTN_KV8
    /* 8-bit stages: row addresses of ldmatrix x4 over keys 0-7 / 8-15 x bytes +0 / +16 (K:
       matrices in the order keys 0-7 +0, keys 0-7 +16, keys 8-15 +0, 8-15 +16; V and the x2s:
       keys 0-7 +0, 8-15 +0, 0-7 +16, 8-15 +16) */
    const attn_u32 k8_lane4 = (attn_u32)(((lane & 7) + ((lane >> 4) << 3)) * ATTN_SROW + ((lane >> 3) & 1) * 16);
    const attn_u32 k8_lane2 = (attn_u32)(((lane & 7) + (((lane >> 3) & 1) << 3)) * ATTN_SROW);
    const attn_u32 v8_lane = (attn_u32)(((lane & 7) + (((lane >> 3) & 1) << 3)) * ATTN_SROW + (lane >> 4) * 16);
#endif
#endif

    for (int it = 0; it < ntiles; it++) {
        attn_cp_async_wait<KV_STAGES - 2>(); /* this thread's part of tile `it` has landed */
        __syncthreads();                      /* everyone's part; stage (it-1) is free again */
        if (it + KV_STAGES - 1 < ntiles) issue((it + KV_STAGES - 1) % KV_STAGES);
        attn_cp_async_commit();
        int next_blk[ATTN_KV_BPT]; /* block numbers of tile it + KV_STAGES, stored after compute */
#pragma unroll
        for (int i = 0; i < ATTN_KV_BPT; i++)
            next_blk[i] = tid + i * ATTN_THREADS < KV_TILE ? block_of(tile0 + (it + KV_STAGES) * KV_TILE + tid + i * ATTN_THREADS) : -1;
#if ATTN_USE_MMA && Q_IN_REGS
        if (it == 0) {
#pragma unroll
            for (int wr = 0; wr < ATTN_WARP_ROWS; wr++)
#pragma unroll
                for (int ks = 0; ks < ATTN_HDP / 16; ks++)
                    attn_ldmatrix_x4(qf[wr][ks], sQ_addr + q_lane + (attn_u32)(wr * 16 * ATTN_Q_PITCH * 2) + ks * 32);
        }
#endif
        const int stage = it % KV_STAGES;
        const int kt0 = tile0 + it * KV_TILE + wn * ATTN_KW; /* this warp's first key */
        /* A warp whose rows see none of its keys skips them (causal tiles above the
           diagonal). The test is uniform over the warp already; __all_sync says so to
           ptxas, which otherwise builds the softmax shuffles a divergent slow path (a call,
           and spills around it). */
        const int sees = __all_sync(0xffffffffu, kt0 + ATTN_KW > lo_min && kt0 < hi_max);
        if (sees) {
            const int need_mask = kt0 < lo_max || kt0 + ATTN_KW > hi_min;

            /* ---- S = Q K^T for 16 rows x KW keys per row tile; each K fragment feeds
               every row tile of the warp (8-bit caches: after the ATTN_USE_MMA section) ---- */
            float s[ATTN_WARP_ROWS][ATTN_NT][4];
#pragma unroll
            for (int wr = 0; wr < ATTN_WARP_ROWS; wr++)
#pragma unroll
                for (int n = 0; n < ATTN_NT; n++) s[wr][n][0] = s[wr][n][1] = s[wr][n][2] = s[wr][n][3] = 0.0f;
#if ATTN_KV8
            {   /* ldmatrix of the codes as b16: lane (g, t) gets key g's four codes 4t..4t+3 of a
                   16-dim block, whose f16 are b0 and b1 of the B fragment for Q's column order;
                   x4: keys 0-7 and 8-15 (n8 tiles 2np, 2np+1) x dims +0 and +16 (k chunks) */
                const attn_u32 kb = sK_addr + (attn_u32)((stage * KV_TILE + wn * ATTN_KW) * ATTN_SROW);
#pragma unroll
                for (int np = 0; np < ATTN_NT / 2; np++) {
#pragma unroll
                    for (int kq = 0; kq < HEAD_DIM / 32; kq++) {
                        attn_u32 w[4], b[4][2];
                        attn_ldmatrix_x4(w, kb + k8_lane4 + (attn_u32)(np * 16 * ATTN_SROW + kq * 32));
#pragma unroll
                        for (int i = 0; i < 4; i++) attn_codes4_to_f16x2<DT_KV>(w[i], b[i][0], b[i][1]);
#pragma unroll
                        for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) {
#if Q_IN_REGS
                            const attn_u32 *a0 = qf[wr][2 * kq], *a1 = qf[wr][2 * kq + 1];
#else
                            attn_u32 a0[4], a1[4];
                            attn_ldmatrix_x4(a0, sQ_addr + q_lane + (attn_u32)(wr * 16 * ATTN_Q_PITCH * 2) + kq * 64);
                            attn_ldmatrix_x4(a1, sQ_addr + q_lane + (attn_u32)(wr * 16 * ATTN_Q_PITCH * 2) + kq * 64 + 32);
#endif
                            attn_mma16816<ATTN_DT_M>(s[wr][2 * np], a0, b[0]);
                            attn_mma16816<ATTN_DT_M>(s[wr][2 * np], a1, b[1]);
                            attn_mma16816<ATTN_DT_M>(s[wr][2 * np + 1], a0, b[2]);
                            attn_mma16816<ATTN_DT_M>(s[wr][2 * np + 1], a1, b[3]);
                        }
                    }
#if HEAD_DIM % 32
                    { /* the last 16 dims: x2, keys 0-7 and 8-15 */
                        attn_u32 w[2], b[2][2];
                        attn_ldmatrix_x2(w, kb + k8_lane2 + (attn_u32)(np * 16 * ATTN_SROW + HEAD_DIM - 16));
#pragma unroll
                        for (int i = 0; i < 2; i++) attn_codes4_to_f16x2<DT_KV>(w[i], b[i][0], b[i][1]);
#pragma unroll
                        for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) {
#if Q_IN_REGS
                            const attn_u32 *a = qf[wr][HEAD_DIM / 16 - 1];
#else
                            attn_u32 a[4];
                            attn_ldmatrix_x4(a, sQ_addr + q_lane + (attn_u32)(wr * 16 * ATTN_Q_PITCH * 2) + (HEAD_DIM - 16) * 2);
#endif
                            attn_mma16816<ATTN_DT_M>(s[wr][2 * np], a, b[0]);
                            attn_mma16816<ATTN_DT_M>(s[wr][2 * np + 1], a, b[1]);
                        }
                    }
#endif
                }
            }
#elif ATTN_USE_MMA
            {
                const attn_u32 kb = sK_addr + (attn_u32)((stage * KV_TILE + wn * ATTN_KW) * ATTN_KV_PITCH * 2) + k_lane;
#pragma unroll
                for (int ks = 0; ks < ATTN_HDP / 16; ks++) {
#if !Q_IN_REGS
                    attn_u32 qa[ATTN_WARP_ROWS][4];
#pragma unroll
                    for (int wr = 0; wr < ATTN_WARP_ROWS; wr++)
                        attn_ldmatrix_x4(qa[wr], sQ_addr + q_lane + (attn_u32)(wr * 16 * ATTN_Q_PITCH * 2) + ks * 32);
#endif
#pragma unroll
                    for (int np = 0; np < ATTN_NT / 2; np++) {
                        attn_u32 b[4];
                        attn_ldmatrix_x4(b, kb + (attn_u32)((np * 16 * ATTN_KV_PITCH + ks * 16) * 2));
#pragma unroll
                        for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) {
#if Q_IN_REGS
                            const attn_u32 *a = qf[wr][ks];
#else
                            const attn_u32 *a = qa[wr];
#endif
                            attn_mma16816<ATTN_DT_M>(s[wr][2 * np], a, b);
                            attn_mma16816<ATTN_DT_M>(s[wr][2 * np + 1], a, b + 2);
                        }
                    }
                }
            }
#else
            {
                const attn_q_t *q0 = sQ + (row0 + g) * ATTN_Q_PITCH, *q1 = q0 + 8 * ATTN_Q_PITCH;
                const attn_kv_t *kb = sK + (stage * KV_TILE + wn * ATTN_KW + 2 * tq) * ATTN_KV_PITCH;
#pragma unroll 2
                for (int d = 0; d < HEAD_DIM; d += 4) {
                    float a0[4], a1[4];
                    attn_lds4<DT_Q>(q0 + d, a0);
                    attn_lds4<DT_Q>(q1 + d, a1);
#pragma unroll
                    for (int n = 0; n < ATTN_NT; n++) {
                        float k0[4], k1[4];
                        attn_lds4<DT_KV>(kb + n * 8 * ATTN_KV_PITCH + d, k0);
                        attn_lds4<DT_KV>(kb + (n * 8 + 1) * ATTN_KV_PITCH + d, k1);
#pragma unroll
                        for (int x = 0; x < 4; x++) { /* one row tile per warp: s[0] */
                            s[0][n][0] = fmaf(a0[x], k0[x], s[0][n][0]);
                            s[0][n][1] = fmaf(a0[x], k1[x], s[0][n][1]);
                            s[0][n][2] = fmaf(a1[x], k0[x], s[0][n][2]);
                            s[0][n][3] = fmaf(a1[x], k1[x], s[0][n][3]);
                        }
                    }
                }
            }
#endif

#if KV_PTH
            { /* each key's K scale (lane keys 8n + 2tq, + 1) */
                const float *ks = sKs + stage * KV_TILE + wn * ATTN_KW + 2 * tq;
#pragma unroll
                for (int n = 0; n < ATTN_NT; n++) {
                    const attn_vec8 kk = *(const attn_vec8 *)(ks + 8 * n);
#pragma unroll
                    for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) {
                        s[wr][n][0] *= __int_as_float(kk.x); s[wr][n][1] *= __int_as_float(kk.y);
                        s[wr][n][2] *= __int_as_float(kk.x); s[wr][n][3] *= __int_as_float(kk.y);
                    }
                }
            }
#endif
            /* ---- scores in base 2, masks, online softmax (row tile wr, element e: row rr =
               e / 2, key kt0 + 8n + 2tq + e % 2) ---- */
#pragma unroll
            for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) {
                float mx[2] = {attn_neg_inf(), attn_neg_inf()};
                /* Per-tile row offsets, so that per element only the constant 8n + e%2 varies
                   (offsets like lo - 8n would be hoisted out of the tile loop: 32 registers). */
                int dlo[2], dhi[2];
#if ALIBI
                float dpos[2];
#endif
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    dlo[rr] = lo[wr][rr] - (kt0 + 2 * tq);
                    dhi[rr] = hi[wr][rr] - (kt0 + 2 * tq);
#if ALIBI
                    dpos[rr] = (float)(kt0 + 2 * tq - qpos[wr][rr]);
#endif
                }
#pragma unroll
                for (int n = 0; n < ATTN_NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int rr = e >> 1, c = 8 * n + (e & 1); /* key = kt0 + 2tq + c */
#if SOFTCAP
                        float x = cap_log2 * attn_tanh(s[wr][n][e] * qk_scale * cap_inv);
#else
                        float x = s[wr][n][e] * qk_scale;
#endif
#if ALIBI
                        x = fmaf(slope[wr][rr], dpos[rr] + (float)c, x);
#endif
                        if (need_mask && (c < dlo[rr] || c >= dhi[rr])) x = attn_neg_inf();
                        s[wr][n][e] = x;
                        mx[rr] = fmaxf(mx[rr], x);
                    }
                float sum[2] = {0.0f, 0.0f}, base[2], alpha[2];
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const float mnew = fmaxf(m[wr][rr], attn_quad_max(mx[rr]));
                    base[rr] = mnew == attn_neg_inf() ? 0.0f : mnew; /* nothing seen yet: p = 0, not NaN */
                    alpha[rr] = attn_exp2(m[wr][rr] - base[rr]);     /* m = -inf -> 0 */
                    m[wr][rr] = mnew;
                    l[wr][rr] *= alpha[rr];
                }
                /* O is rescaled only when some row's max moved (after the first tiles of a
                   long row it rarely does: a decode tile then skips 2 x HEAD_DIM / 4
                   multiplies). Decode-shaped CTAs only (one row tile): prefill rows move
                   their max often, and with two row tiles per warp the vote's registers
                   tip ptxas into spills at 255. */
                if (ATTN_ROW_TILES > 1 || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                    for (int rr = 0; rr < 2; rr++)
#pragma unroll
                        for (int i = 0; i < ATTN_OT; i++) { o[wr][i][2 * rr] *= alpha[rr]; o[wr][i][2 * rr + 1] *= alpha[rr]; }
                }
#pragma unroll
                for (int n = 0; n < ATTN_NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        s[wr][n][e] = attn_exp2(s[wr][n][e] - base[e >> 1]);
                        sum[e >> 1] += s[wr][n][e];
                    }
                l[wr][0] += sum[0]; /* lane-partial sums; the 4 lanes of a row are added in the epilogue */
                l[wr][1] += sum[1];
            }

#if KV_PTH
            { /* P times each key's V scale / 2^(E - 127); E follows the largest V scale (uniform
                 over the warp: the four lanes of a row group hold all of its keys) */
                const float *vs = sVs + stage * KV_TILE + wn * ATTN_KW + 2 * tq;
                float vsc[ATTN_NT][2], vmax = 0.0f;
#pragma unroll
                for (int n = 0; n < ATTN_NT; n++) {
                    const attn_vec8 vv = *(const attn_vec8 *)(vs + 8 * n);
                    vsc[n][0] = __int_as_float(vv.x);
                    vsc[n][1] = __int_as_float(vv.y);
                    vmax = fmaxf(vmax, fmaxf(vsc[n][0], vsc[n][1]));
                }
                vmax = attn_quad_max(vmax);
                const int et = attn_imin((__float_as_int(vmax) >> 23) & 0xff, 253);
                if (et > v_e) {
                    const int d = 127 + v_e - et;
                    const float f = d > 0 ? __int_as_float(d << 23) : 0.0f;
#pragma unroll
                    for (int wr = 0; wr < ATTN_WARP_ROWS; wr++)
#pragma unroll
                        for (int i = 0; i < ATTN_OT; i++) { o[wr][i][0] *= f; o[wr][i][1] *= f; o[wr][i][2] *= f; o[wr][i][3] *= f; }
                    v_e = et;
                }
                const float r = __int_as_float((254 - v_e) << 23);
#pragma unroll
                for (int n = 0; n < ATTN_NT; n++) {
                    const float f0 = vsc[n][0] * r, f1 = vsc[n][1] * r;
#pragma unroll
                    for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) {
                        s[wr][n][0] *= f0; s[wr][n][1] *= f1; s[wr][n][2] *= f0; s[wr][n][3] *= f1;
                    }
                }
            }
#endif

            /* ---- O += P V ---- */
#if ATTN_KV8
            {   /* ldmatrix.trans of the codes as b16: lane (g, t) gets, for keys 2t and 2t + 1 (and
                   + 8), the codes of dims 2g and 2g + 1 of a 16-dim block; the even ones make the
                   B fragment of an n8 tile of the even dims, the odd ones of the odd dims: O's
                   tiles 4q .. 4q + 3 hold dims 32q + {even, odd} and 32q + 16 + {even, odd}
                   (the epilogue puts them back in order) */
                const attn_u32 vb = sV_addr + (attn_u32)((stage * KV_TILE + wn * ATTN_KW) * ATTN_SROW) + v8_lane;
#pragma unroll
                for (int kk = 0; kk < ATTN_KW / 16; kk++) {
                    attn_u32 a[ATTN_WARP_ROWS][4];
#pragma unroll
                    for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) attn_p_fragment(s[wr], kk, a[wr]);
                    const attn_u32 vrow = vb + (attn_u32)(kk * 16 * ATTN_SROW);
#pragma unroll
                    for (int dq = 0; dq < (HEAD_DIM + 16) / 32; dq++) {
                        attn_u32 r[4], b[4][2];
                        const int halves = dq < HEAD_DIM / 32 ? 2 : 1; /* HEAD_DIM % 32: the last 16 dims */
                        if (halves == 2) attn_ldmatrix_x4_trans(r, vrow + dq * 32);
                        else attn_ldmatrix_x2_trans(r, vrow + dq * 32);
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            if (h < halves) {
                                attn_codes4_to_f16x2<DT_KV>(attn_prmt(r[2 * h], r[2 * h + 1], 0x6420u), b[2 * h][0], b[2 * h][1]);
                                attn_codes4_to_f16x2<DT_KV>(attn_prmt(r[2 * h], r[2 * h + 1], 0x7531u), b[2 * h + 1][0], b[2 * h + 1][1]);
#pragma unroll
                                for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) {
                                    attn_mma16816<ATTN_DT_M>(o[wr][4 * dq + 2 * h], a[wr], b[2 * h]);
                                    attn_mma16816<ATTN_DT_M>(o[wr][4 * dq + 2 * h + 1], a[wr], b[2 * h + 1]);
                                }
                            }
                        }
                    }
                }
            }
#elif ATTN_USE_MMA
            {
                const attn_u32 vb = sV_addr + (attn_u32)((stage * KV_TILE + wn * ATTN_KW) * ATTN_KV_PITCH * 2) + v_lane;
#pragma unroll
                for (int kk = 0; kk < ATTN_KW / 16; kk++) {
                    attn_u32 a[ATTN_WARP_ROWS][4]; /* the C fragments of keys 16kk.. are the A fragment of P */
#pragma unroll
                    for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) attn_p_fragment(s[wr], kk, a[wr]);
                    const attn_u32 vrow = vb + (attn_u32)(kk * 16 * ATTN_KV_PITCH * 2);
#pragma unroll
                    for (int op = 0; op < ATTN_OT / 2; op++) {
                        attn_u32 b[4]; /* one V fragment for every row tile of the warp */
                        attn_ldmatrix_x4_trans(b, vrow + op * 32);
#pragma unroll
                        for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) {
                            attn_mma16816<ATTN_DT_M>(o[wr][2 * op], a[wr], b);
                            attn_mma16816<ATTN_DT_M>(o[wr][2 * op + 1], a[wr], b + 2);
                        }
                    }
#if ATTN_OT % 2
                    {
                        attn_u32 b[2];
                        attn_ldmatrix_x2_trans(b, vrow + (ATTN_OT - 1) * 16);
#pragma unroll
                        for (int wr = 0; wr < ATTN_WARP_ROWS; wr++) attn_mma16816<ATTN_DT_M>(o[wr][ATTN_OT - 1], a[wr], b);
                    }
#endif
                }
            }
#else
            {
                const attn_kv_t *vb = sV + (stage * KV_TILE + wn * ATTN_KW) * ATTN_KV_PITCH + 2 * tq;
#pragma unroll
                for (int n = 0; n < ATTN_NT; n++)
#pragma unroll
                    for (int src = 0; src < 4; src++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            /* P of key 8n + 2src + e for rows g and g + 8 lives in lane 4g + src */
                            const float p0 = __shfl_sync(0xffffffffu, s[0][n][e], (lane & ~3) | src);
                            const float p1 = __shfl_sync(0xffffffffu, s[0][n][2 + e], (lane & ~3) | src);
                            const attn_kv_t *v = vb + (8 * n + 2 * src + e) * ATTN_KV_PITCH;
#pragma unroll
                            for (int i = 0; i < ATTN_OT; i++) {
                                float vv[2];
                                attn_lds2<DT_KV>(v + i * 8, vv);
                                o[0][i][0] = fmaf(p0, vv[0], o[0][i][0]);
                                o[0][i][1] = fmaf(p0, vv[1], o[0][i][1]);
                                o[0][i][2] = fmaf(p1, vv[0], o[0][i][2]);
                                o[0][i][3] = fmaf(p1, vv[1], o[0][i][3]);
                            }
                        }
            }
#endif
        }
        if (it + KV_STAGES < ntiles) { /* the slot of tile it + KV_STAGES held tile it: done */
#pragma unroll
            for (int i = 0; i < ATTN_KV_BPT; i++)
                if (tid + i * ATTN_THREADS < KV_TILE) {
                    const int j = tile0 + (it + KV_STAGES) * KV_TILE + tid + i * ATTN_THREADS;
                    sBlk[((it + KV_STAGES) % KV_STAGES) * KV_TILE + tid + i * ATTN_THREADS] = row_offset(next_blk[i], j);
#if KV_PTH
                    sDel[((it + KV_STAGES) % KV_STAGES) * KV_TILE + tid + i * ATTN_THREADS] = scale_delta(j);
#endif
                }
        }
    }

    /* ---- epilogue: combine the WARPS_N key slices of each row, then store ---- */
    attn_cp_async_wait<0>(); /* nothing may still land in the stages being reused */
    __syncthreads();         /* every warp is done with the K/V stages */
    float *sO = (float *)(smem + ATTN_SQ_BYTES + ATTN_SBLK_BYTES);   /* [WARPS_N][ROWS_PAD][O_PITCH] */
    float *sM = sO + WARPS_N * ATTN_ROWS_PAD * ATTN_O_PITCH;          /* [WARPS_N][ROWS_PAD] */
    float *sL = sM + WARPS_N * ATTN_ROWS_PAD;                         /* [WARPS_N][ROWS_PAD][4] */
    /* O in the values' units: 8-bit caches, v_scale (per tensor) or 2^(E - 127), code factor */
#if KV_PTH
    const float ofac = __int_as_float(v_e << 23) * attn_code_factor<DT_KV>();
#elif ATTN_KV8
    const float ofac = v_scale * attn_code_factor<DT_KV>();
#else
    const float ofac = 1.0f;
#endif
#pragma unroll
    for (int x = 0; x < 2 * ATTN_WARP_ROWS; x++) {
        const int wr = x >> 1, rr = x & 1;
        const int R = row0 + wr * 16 + g + 8 * rr;
#if ATTN_KV8
        float *orow = sO + (wn * ATTN_ROWS_PAD + R) * ATTN_O_PITCH + 4 * tq;
#pragma unroll
        for (int i = 0; i < ATTN_OT; i++) { /* tile i: dims d + (i & 1) + 4t and + 2 (see O += P V) */
            const int d = (i >> 2) * 32 + ((i & 2) ? 16 : 0) + (i & 1);
            orow[d] = o[wr][i][2 * rr] * ofac;
            orow[d + 2] = o[wr][i][2 * rr + 1] * ofac;
        }
#else
        float *orow = sO + (wn * ATTN_ROWS_PAD + R) * ATTN_O_PITCH + 2 * tq;
#pragma unroll
        for (int i = 0; i < ATTN_OT; i++) {
            orow[i * 8] = o[wr][i][2 * rr] * ofac;
            orow[i * 8 + 1] = o[wr][i][2 * rr + 1] * ofac;
        }
#endif
        sL[(wn * ATTN_ROWS_PAD + R) * 4 + tq] = l[wr][rr]; /* the four lane-partial sums of the row */
        if (tq == 0) sM[wn * ATTN_ROWS_PAD + R] = m[wr][rr];
    }
    __syncthreads();
    const int out_vec = attn_out_vec(p);
    for (int u = tid; u < nrows * ATTN_OT; u += ATTN_THREADS) {
        const int R = u / ATTN_OT, c = u - R * ATTN_OT;
        float M = attn_neg_inf();
#pragma unroll
        for (int w = 0; w < WARPS_N; w++) M = fmaxf(M, sM[w * ATTN_ROWS_PAD + R]);
        const float Mb = M == attn_neg_inf() ? 0.0f : M;
        float L = 0.0f, f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < WARPS_N; w++) {
            const float sc = WARPS_N == 1 ? 1.0f : attn_exp2(sM[w * ATTN_ROWS_PAD + R] - Mb);
            const float *orow = sO + (w * ATTN_ROWS_PAD + R) * ATTN_O_PITCH + c * 8;
            const float *lp = sL + (w * ATTN_ROWS_PAD + R) * 4;
            L += sc * ((lp[0] + lp[1]) + (lp[2] + lp[3]));
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] += sc * orow[i];
        }
        attn_store_row8(p, q_start + tok0, kv_head, slot, R, c, f, M, L, out_vec);
    }
#if ATTN_ROWS <= 16
    /* FUSED MERGE (decode-shaped variants only, the ones the host splits: compiled into a
       prefill variant it would cost registers for nothing): the last split of a merge
       entry to finish merges it */
    const int mi = (item[7] >> 8) - 1;
    if (slot >= 0 && mi >= 0 && p.merge_count) {
        __shared__ int attn_last_split;
        __threadfence(); /* this CTA's partial is visible device-wide before it is counted */
        __syncthreads();
        if (tid == 0) attn_last_split = atomicAdd(p.merge_count + mi, 1) == p.merge[8 * (attn_i64)mi + 5] - 1;
        __syncthreads();
        if (attn_last_split) {
            __threadfence(); /* the other splits' partials, counted before, are read after */
            attn_merge_entry(p, mi, tid, ATTN_THREADS);
            if (tid == 0) p.merge_count[mi] = 0;
        }
    }
#endif
}

/* Second stage of split-KV as its own launch: one CTA per merge entry. */
extern "C" __global__ void __launch_bounds__(128) attn_paged_merge_partials(const attn__paged_params p) {
    if ((int)blockIdx.x >= *p.num_merge) return;
    attn_merge_entry(p, blockIdx.x, threadIdx.x, blockDim.x);
}
