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
                          96, 120, 128, 256; 120 takes the zero-column path), or a
                          multiple of 32 in 288..512 with tensor cores (WIDE HEADS)
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
             PERSISTENT   1: CTAs loop over the work items (grid any size, LAUNCH); the
                          library sets it for its decode shapes. 0 (default): one item per CTA
             CASCADE      1: rows written to out join the partials of a cascade's prefix
                          pass (see CASCADE below; the library sets it for its decode
                          shapes). 0 (default): prefix_splits is ignored
             SPLIT_S      WIDE HEADS: 1 (default where HEAD_DIM % 64 == 0) the column groups
                          compute half of S each and exchange it, 0 both compute all of S
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
   attn_paged_attention:      grid (PERSISTENT 1: any; 0: >= *num_work, 1, 1), block
                              (attn_paged_config.threads), dynamic shared memory
                              attn_paged_config.shared_bytes bytes (over 48 KiB for most
                              variants: set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES once
                              after loading). PERSISTENT 1: CTA b runs items b, b + grid, ...
                              below *num_work, so an eager launch gives each item its CTA (grid
                              = *num_work) and a captured one at most the CTAs the device holds
                              at once (it then replays any batch of the capacity in one wave,
                              without CTAs that load *num_work and exit). PERSISTENT 0: CTAs past
                              *num_work exit, so a graph captured with the capacity replays any
                              smaller batch.
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
   (= rows of a partial slot), TILE_TOKENS, KV_STAGES, WARPS_N, 1 if tensor cores, 0 (no
   tensor map), PERSISTENT}.

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
   CASCADE (attn.h's common_prefix_len on a decode batch): a launch before this one (the
   prefill tiles of paged_attention.cu or paged_prefill_sm90.cu, its own work list) attends
   the shared prefix keys [0, P) for every query token of the batch: items of request 0
   (whose block table holds the prefix, as every request's does), tok0 = the first batch
   token of a tile of prefix_tile_tokens (request 0's query_start_loc is 0, so tok0 counts
   batch tokens), non-causal (every query follows the prefix), split into ns key ranges,
   each writing a partial (the PARTIAL WORKSPACE's format, prefix_rows rows a slot) into
   prefix_o / prefix_ml: slot (j * num_kv_heads + kv_head) * ns + s for tile j and split s.
   This launch's items then cover keys [P, seq_len) only, and every row that writes out
   joins its prefix partials by LSE before the sink and the normalisation (attn_store_row8:
   *prefix_splits = ns > 0; 0 or prefix_splits NULL: no prefix). A graph replays both
   launches; a build without a prefix sets the count of the first and ns to 0.

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
   WIDE HEADS (HEAD_DIM 288..512, Gemma-class 512)
   =====================================================================================
   A warp keeps O for its 16 rows in registers: HEAD_DIM / 8 n8 tiles x 4 floats, 128
   registers at 256, 256 at 512 (the whole register file). Past 256 the CTA's warps come in
   two column groups (VSPLIT 2): warp group wv keeps O's columns [wv * HEAD_DIM / 2, (wv + 1)
   * HEAD_DIM / 2) and reads only that half of each V row from shared memory in P V. K and
   V are copied into shared memory once for both groups (every byte of the cache is still
   read once), and each group computes the full S = Q K^T over all HEAD_DIM dims of its
   rows and keys itself: the two groups' scores, maxima and sums are the same numbers (the
   same instructions on the same operands), so each has the softmax it needs without an
   exchange, at the cost of S computed twice (a decode tile waits on memory, not on the
   mma; a prefill tile pays 3/2 of the FLOPs: docs/PERF.md, issue 23 (5)). The epilogue
   writes each group's half of O into the same shared rows (m and l once, from group 0)
   and from there on nothing differs. SPLIT_S 1 (the default where HEAD_DIM % 64 == 0):
   instead of computing S twice, group wv computes the partial S over dims [wv * HEAD_DIM /
   2, (wv + 1) * HEAD_DIM / 2), the two warps of a pair (same rows, same keys) exchange their
   partials through shared memory (a second __syncthreads per tile, which every warp meets,
   the ones that skip the tile too; a barrier of the pair's 64 threads alone measured 3 %
   faster, but compute-sanitizer's racecheck reported hazards around it) and both form S =
   partial(0) + partial(1), in that order, so their scores are still the same numbers; one
   exchange buffer suffices, because the tile's first __syncthreads keeps a warp from
   writing the next tile's partial before its partner has read this one. Q is read from
   shared memory per K/V tile (Q_IN_REGS 0), tiles are 32 keys (16 on sm_80 for tiles of
   more than one row tile: its 163 KiB), two warps split a decode tile's keys (WARPS_N 2:
   four warps in all).

   =====================================================================================
   INSIDE A CTA
   =====================================================================================
   Rows: the CTA's ROWS = TILE_TOKENS * GROUP query rows (row R = token R / GROUP, head
   member R % GROUP; rows of tokens >= ntok are padding, zero Q, never stored), padded to
   ROW_TILES * 16. Warp w = (wv * ROW_TILES / WARP_ROWS + wm) * WARPS_N + wn (wv: the
   column group of WIDE HEADS, 0 below 288) owns row tiles wm * WARP_ROWS ..
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
   attn_paged_config.shared_bytes is the total; the kernel traps when the launch gives less.

   =====================================================================================
   THE CODE
   =====================================================================================
   attn_paged_traits turns the defines into one struct of constants (what the variant is,
   its warps, tiles and shared-memory layout); every feature below is chosen by `if
   constexpr` on it. The kernel is a sequence of named stages, each a function of its own:
   the work-item prologue (paged_common.cuh), the Q load, the K/V tile loader
   (paged_tile_loader.cuh for the addressing; attn_paged_issue here for the pitched
   copies), S = Q K^T (8-bit, tensor-core and FMA forms), the scores and online softmax
   (online_softmax.cuh), O += P V (three forms), the epilogue, and the split merge
   (split_merge.cuh). */
#include "paged_common.cuh"
#include "paged_tile_loader.cuh"

/* ---- the defines: required ones checked, the others given their defaults ---- */
#if !defined(HEAD_DIM) || !defined(BLOCK_SIZE) || !defined(GROUP) || !defined(DT_Q) || \
    !defined(DT_KV) || !defined(TILE_TOKENS)
#error "paged_attention.cu: define HEAD_DIM, BLOCK_SIZE, GROUP, DT_Q, DT_KV and TILE_TOKENS"
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
/* tuning: 0 (Q_IN_REGS -1) is "the default", which attn_paged_traits works out */
#ifndef WARP_ROWS
#define WARP_ROWS 1
#endif
#ifndef WARPS_N
#define WARPS_N 0
#endif
#ifndef KV_TILE
#define KV_TILE 0
#endif
#ifndef KV_STAGES
#define KV_STAGES 0
#endif
#ifndef MIN_CTAS
#define MIN_CTAS 0
#endif
#ifndef CASCADE
#define CASCADE 0 /* 1: rows stored to out join the prefix pass's partials (CASCADE; decode shapes) */
#endif
#ifndef PERSISTENT
#define PERSISTENT 0
#endif
#ifndef Q_IN_REGS
#define Q_IN_REGS -1
#endif
#ifndef SPLIT_S
#define SPLIT_S -1 /* WIDE HEADS: -1 the default (1 where HEAD_DIM % 64 == 0), 0 S computed by both groups */
#endif

__host__ __device__ constexpr int attn_cmax(int a, int b) { return a > b ? a : b; }

/* The element type of a cache: its 16/32-bit storage, or a byte of code for 8-bit caches. */
template <int DT, bool CODES = ATTN_DT_IS_8BIT(DT)> struct attn_cache_elem { typedef typename attn_elem<DT>::storage type; };
template <int DT> struct attn_cache_elem<DT, true> { typedef attn_u8 type; };
template <bool C, class A, class B> struct attn_pick { typedef A type; };
template <class A, class B> struct attn_pick<false, A, B> { typedef B type; };

struct attn_paged_traits {
    /* the variant */
    static constexpr int head_dim = HEAD_DIM, block_size = BLOCK_SIZE, group = GROUP, dt_q = DT_Q, dt_kv = DT_KV,
                         tile_tokens = TILE_TOKENS;
    static constexpr bool window = WINDOW != 0, softcap = SOFTCAP != 0, alibi = ALIBI != 0, kv_pth = KV_PTH != 0;
    static constexpr bool kv8 = ATTN_DT_IS_8BIT(DT_KV);
    static_assert(head_dim % 8 == 0 && head_dim >= 8 && head_dim <= 512, "paged_attention.cu: HEAD_DIM must be a multiple of 8 in 8..256 (or of 32 in 288..512)");
    static_assert(block_size % 16 == 0 && block_size > 0, "paged_attention.cu: BLOCK_SIZE must be a positive multiple of 16");
    static_assert(dt_q >= 0 && dt_q <= 2 && dt_kv >= 0 && dt_kv <= 6 && dt_kv != 3, "paged_attention.cu: DT_Q must be 0-2, DT_KV 0-2 or 4-6");
    static_assert(!kv_pth || dt_kv == ATTN_DT_E4M3 || dt_kv == ATTN_DT_I8, "paged_attention.cu: KV_PTH 1 takes DT_KV 4 (fp8 e4m3) or 6 (int8)");
    static_assert(dt_kv != ATTN_DT_I8 || kv_pth, "paged_attention.cu: an int8 cache has per-token-head scales (KV_PTH 1)");
    static_assert(!kv8 || head_dim % 16 == 0, "paged_attention.cu: 8-bit caches take HEAD_DIM a multiple of 16");

    /* rows: TILE_TOKENS * GROUP, padded to row tiles of 16 (the M of mma) */
    static constexpr int rows = tile_tokens * group, row_tiles = (rows + 15) / 16, rows_pad = row_tiles * 16;
    static_assert(tile_tokens >= 1 && group >= 1 && rows <= 128, "paged_attention.cu: need TILE_TOKENS >= 1, GROUP >= 1 and TILE_TOKENS * GROUP <= 128");

    /* element types: tensor cores for equal 16-bit types and every 8-bit cache (f16 mma);
       the FMA form otherwise */
    static constexpr bool use_mma = kv8 || (dt_q == dt_kv && dt_q != ATTN_DT_F32);
    /* WIDE HEADS: two warp groups split O's columns past 256 */
    static_assert(head_dim <= 256 || (head_dim % 32 == 0 && use_mma),
                  "paged_attention.cu: HEAD_DIM over 256 takes a multiple of 32 and the tensor-core forms "
                  "(DT_Q == DT_KV, 16-bit, or an 8-bit cache)");
    static constexpr int vsplit = head_dim > 256 ? 2 : 1; /* warp groups along O's columns */
    static constexpr int ovw = head_dim / vsplit;         /* O columns a warp keeps */
    static constexpr int otw = ovw / 8;                   /* its n8 tiles of O */
    /* WIDE HEADS, SPLIT_S: each group computes half of S's dot products (exchanged) */
    static constexpr bool split_s = vsplit > 1 && (SPLIT_S >= 0 ? SPLIT_S != 0 : head_dim % 64 == 0);
    static_assert(!split_s || head_dim % 64 == 0, "paged_attention.cu: SPLIT_S 1 takes HEAD_DIM a multiple of 64");
    static constexpr int dt_m = kv8 ? ATTN_DT_F16 : dt_q; /* the mma's input type */
    static constexpr int esz_q = dt_q == ATTN_DT_F32 ? 4 : 2;
    static constexpr int esz_sq = kv8 ? 2 : esz_q; /* Q in shared memory: f16 for 8-bit caches */
    static constexpr int esz_kv = ATTN_DT_SIZE(dt_kv);
    static constexpr bool big_rows = head_dim * esz_kv > 512; /* FMA form: f32 rows over 128 wide */
    typedef typename attn_elem<DT_Q>::storage q_t;
    typedef typename attn_cache_elem<DT_KV>::type kv_t;      /* 8-bit caches: codes */
    typedef typename attn_pick<kv8, attn_u16, q_t>::type sq_t; /* Q in shared memory */

    /* warps. WARP_ROWS 2 is a request, in force only where it fits: tensor cores (the FMA
       form keeps one row tile per warp), an even number of row tiles, HEAD_DIM <= 128 (two
       row tiles of O at 256 wide alone are 256 registers), SOFTCAP 0 and ALIBI 0 (ptxas
       sits at 255 registers with two row tiles, and their per-score work tips it into
       spills at some head sizes), and on sm_80 HEAD_DIM a multiple of 16 (the zero columns
       of HEAD_DIM 120 spilled 20 bytes at 255 registers there once the kernel was split
       into stages; sm_90 keeps 2 without spills). Elsewhere it falls back to 1, so one -D
       can go to every variant of a layer. */
    static_assert(WARP_ROWS == 1 || WARP_ROWS == 2, "paged_attention.cu: WARP_ROWS must be 1 or 2");
    static constexpr int warp_rows = WARP_ROWS == 2 && use_mma && row_tiles % 2 == 0 && head_dim <= 128 && !softcap &&
                                             !alibi && (head_dim % 16 == 0 || __CUDA_ARCH__ >= 900) ? 2 : 1;
    static constexpr int warps_n = WARPS_N > 0 ? WARPS_N
                                   : vsplit > 1 ? (row_tiles == 1 ? 2 : 1)
                                   : use_mma || !big_rows ? (row_tiles == 1 ? 4 : row_tiles == 2 ? 2 : 1)
                                                          : (row_tiles <= 2 ? 2 : 1);
    static constexpr int warp_rt = row_tiles / warp_rows; /* warps along the rows */
    static constexpr int warps = warp_rt * warps_n * vsplit, threads = 32 * warps;
    static_assert(threads <= 512, "paged_attention.cu: more than 16 warps; lower WARPS_N");

    /* key tiles. 8-bit decode shapes on sm_90 (H200, 32/8 heads, head 128, attn-bench's
       8-bit table with ATTN_BENCH_KV8_DEFINES): 128-key tiles x 2 stages, two CTAs per SM.
       Per tensor they beat 64 x 4 (batch 128 x 16k 1066 against 1136 us, 64 x 4k 148
       against 157) and 64 x 3 with three CTAs per SM (1106, 189). Per token and head, with
       registers for two CTAs (capped for three, ptxas spills): e4m3 64 x 16k 586 against
       790 us for 64 x 3 with three CTAs, 128 x 16k 1207 against 1270; int8 128 x 4k the
       one case behind (371 against 340 us) */
    static constexpr bool kv8_decode90 = kv8 && row_tiles == 1 && __CUDA_ARCH__ >= 900 && head_dim <= 128;
    static constexpr int kv_tile = KV_TILE > 0 ? KV_TILE
                                   : kv8_decode90 ? 128
                                   : vsplit > 1 ? (__CUDA_ARCH__ >= 900 || row_tiles == 1 ? 32 : 16)
                                   : use_mma ? attn_cmax(16 * warps_n, head_dim <= 128 ? 64 : 32)
                                             : attn_cmax(8 * warps_n, big_rows ? 16 : 32);
    static constexpr int kw = kv_tile / warps_n; /* keys of a tile per warp */
    static constexpr int nt = kw / 8;            /* n8 tiles of S per warp */
    static constexpr int ot = head_dim / 8;      /* n8 tiles of a row of O (otw of them per warp) */
    static_assert(kv_tile % warps_n == 0 && kw % (use_mma ? 16 : 8) == 0,
                  "paged_attention.cu: KV_TILE / WARPS_N must be a multiple of 16 (tensor cores) or 8 (FMA)");
    /* two row tiles of Q are 64 registers at head 128 (FlashAttention-2 too reads Q from
       shared memory per K/V tile); at head 64 ptxas takes the 32 but then spills on the flags */
    static constexpr bool q_in_regs = Q_IN_REGS >= 0 ? Q_IN_REGS != 0 : use_mma && head_dim <= 128 && warp_rows == 1;

    /* shared-memory rows */
    static constexpr int hdp = (head_dim + 15) / 16 * 16; /* k extent of Q K^T on tensor cores */
    /* row pitches in elements: 16 bytes past the data (conflict-free ldmatrix); K/V rows
       that fragments are read from (8-bit caches: the codes) */
    static constexpr int q_pitch = use_mma ? hdp + 8 : head_dim + 16 / esz_q;
    static constexpr int kv_pitch = use_mma ? hdp + 8 : head_dim + 16 / esz_kv;
    /* a stage row in bytes. 8-bit codes: HEAD_DIM bytes and 16 more where that makes an
       even number of 16-byte units (an odd number: ldmatrix's 8 rows in 8 bank groups) */
    static constexpr int srow = kv8 ? head_dim + (head_dim / 16 % 2 == 0 ? 16 : 0) : kv_pitch * esz_kv;
    static constexpr int o_pitch = head_dim + 4; /* floats, epilogue */
    /* K/V stages. 8-bit caches: two (sm_90 decode: of 128 keys). A decode-shaped CTA (one
       row tile) waits on memory: on sm_90 (228 KiB of shared memory per SM) a third tile in
       flight pays (H200: 4.2 against 4.0 TB/s at batch 128) when the stages stay within 112
       KiB, two CTAs still fitting. A prefill CTA, and sm_80 (164 KiB), are better off with
       two stages and more CTAs per SM. */
    static constexpr int kv_stages =
        KV_STAGES > 0 ? KV_STAGES
        : !kv8 && row_tiles == 1 && __CUDA_ARCH__ >= 900 && 3 * 2 * kv_tile * kv_pitch * esz_kv <= 114688 ? 3 : 2;
    static_assert(kv_stages >= 2, "paged_attention.cu: KV_STAGES must be at least 2");
    /* CTAs per SM ptxas must leave registers for (__launch_bounds__). 8-bit decode on sm_90
       (the shared memory of 128-key stages allows two CTAs per SM): per tensor, registers
       capped as for three (measured so); per token and head, two (capped at three it spills) */
    static constexpr int min_ctas = MIN_CTAS > 0 ? MIN_CTAS : kv8_decode90 && threads == 128 && kv_tile == 128 ? (kv_pth ? 2 : 3) : 1;

    /* the loader: 16-byte chunks of a K (or V) tile, per thread; block numbers per thread */
    static constexpr int kv_cpr = head_dim * esz_kv / 16;
    static constexpr int kv_chunks = kv_tile * kv_cpr;
    static constexpr int kv_lpt = (kv_chunks + threads - 1) / threads;
    static constexpr int kv_bpt = (kv_tile + threads - 1) / threads;
    /* FUSED MERGE: decode-shaped variants only (the ones the host splits; compiled into a
       prefill variant it would cost registers for nothing) */
    static constexpr bool fused_merge = rows <= 16;
};

/* The shared memory of a CTA: [Q][row table: offsets (KV_PTH: and scale deltas)][K stages]
   [V stages][KV_PTH: K scales, V scales]; the epilogue reuses the stages for [O][m][l]. */
template <class T> struct attn_paged_smem {
    static constexpr int q_bytes = T::rows_pad * T::q_pitch * T::esz_sq;
    static constexpr int table_bytes = T::kv_stages * T::kv_tile * (T::kv_pth ? 12 : 8);
    static constexpr int tile_bytes = T::kv_tile * T::srow; /* one K (or V) tile */
    static constexpr int scale_bytes = T::kv_pth ? T::kv_stages * 2 * T::kv_tile * 4 : 0;
    static constexpr int kv_bytes = T::kv_stages * 2 * tile_bytes + scale_bytes;
    static constexpr int epi_bytes = T::warps_n * T::rows_pad * (T::o_pitch + 5) * 4; /* O, m, 4 partial l */
    /* SPLIT_S: every warp's partial S, [warp][element][lane] f32 */
    static constexpr int xch_bytes = T::split_s ? T::warps * T::warp_rows * T::nt * 4 * 32 * 4 : 0;
    static constexpr int bytes = q_bytes + table_bytes + attn_cmax(kv_bytes, epi_bytes) + xch_bytes;

    char *base;
    attn_u32 addr; /* base in the shared window (cvta once: ldmatrix / cp.async take these) */
    ATTN_DEV typename T::sq_t *q() const { return (typename T::sq_t *)base; }
    ATTN_DEV attn_i64 *blk() const { return (attn_i64 *)(base + q_bytes); }                          /* [stage][key] */
    ATTN_DEV int *del() const { return (int *)(blk() + T::kv_stages * T::kv_tile); }                  /* [stage][key] */
    ATTN_DEV typename T::kv_t *k() const { return (typename T::kv_t *)(base + q_bytes + table_bytes); } /* [stage][key][pitch] */
    ATTN_DEV typename T::kv_t *v() const { return (typename T::kv_t *)((char *)k() + T::kv_stages * tile_bytes); }
    ATTN_DEV float *k_scales() const { return (float *)((char *)k() + 2 * T::kv_stages * tile_bytes); } /* [stage][key] */
    ATTN_DEV float *v_scales() const { return k_scales() + T::kv_stages * T::kv_tile; }
    ATTN_DEV attn_u32 q_addr() const { return addr; }
    ATTN_DEV attn_u32 k_addr() const { return addr + (attn_u32)(q_bytes + table_bytes); }
    ATTN_DEV attn_u32 v_addr() const { return k_addr() + (attn_u32)(T::kv_stages * tile_bytes); }
    ATTN_DEV attn_u32 k_scales_addr() const { return k_addr() + (attn_u32)(2 * T::kv_stages * tile_bytes); }
    ATTN_DEV attn_u32 v_scales_addr() const { return k_scales_addr() + (attn_u32)(T::kv_stages * T::kv_tile * 4); }
    ATTN_DEV float *epi_o() const { return (float *)k(); }                                  /* [WARPS_N][ROWS_PAD][O_PITCH] */
    ATTN_DEV float *epi_m() const { return epi_o() + T::warps_n * T::rows_pad * T::o_pitch; } /* [WARPS_N][ROWS_PAD] */
    ATTN_DEV float *epi_l() const { return epi_m() + T::warps_n * T::rows_pad; }              /* [WARPS_N][ROWS_PAD][4] */
    ATTN_DEV float *xch() const { return (float *)(base + q_bytes + table_bytes + attn_cmax(kv_bytes, epi_bytes)); }
};

typedef attn_paged_traits attn_pt;
extern "C" __constant__ attn__launch_config attn_paged_config = {
    attn_pt::threads, attn_paged_smem<attn_pt>::bytes, attn_pt::kv_tile, attn_pt::rows, attn_pt::tile_tokens,
    attn_pt::kv_stages, attn_pt::warps_n, attn_pt::use_mma, 0, PERSISTENT};


/* Shared-memory reads of the FMA form: 4 (or 2) consecutive elements as f32. */
struct __align__(8) attn_vec8 { attn_u32 x, y; };
template <int ET> ATTN_DEV void attn_lds4(const void *p, float *f) {
    if constexpr (ET == ATTN_DT_F32) {
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
    if constexpr (ET == ATTN_DT_F32) {
        attn_vec8 v = *(const attn_vec8 *)p;
        f[0] = __int_as_float(v.x); f[1] = __int_as_float(v.y);
    } else {
        attn_u32 v = *(const attn_u32 *)p;
        f[0] = attn_elem<ET>::to_f32((attn_u16)(v & 0xffffu)); f[1] = attn_elem<ET>::to_f32((attn_u16)(v >> 16));
    }
}

/* The A fragment of P for keys 16 kk .. 16 kk + 15: the C fragments of S's n8 tiles 2 kk and
   2 kk + 1 (one row tile), rounded to the mma type. */
template <class T> ATTN_DEV void attn_p_fragment(const float (*s)[4], int kk, attn_u32 *a) {
    a[0] = attn_elem<T::dt_m>::pack2(s[2 * kk][0], s[2 * kk][1]);
    a[1] = attn_elem<T::dt_m>::pack2(s[2 * kk][2], s[2 * kk][3]);
    a[2] = attn_elem<T::dt_m>::pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = attn_elem<T::dt_m>::pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

/* ---- the store of finished rows and the split merge ---- */

/* CASCADE: joins the prefix pass's partials of one row (query `token`, head member `member`
   of kv_head; columns 8c .. 8c + 7) into its own finished state (m, l, O unnormalised),
   the merge of split_merge.cuh over 1 + ns states. The prefix pass (a launch before this
   one) wrote tile j = token / prefix_tile_tokens, kv_head, split s into slot (j *
   num_kv_heads + kv_head) * ns + s, row (token - j * prefix_tile_tokens) * GROUP + member. */
ATTN_DEV void attn_cascade_join(const attn__paged_params &p, int token, int kv_head, int member, int group,
                                int head_dim, int c, int ns, float *O, float &m, float &l) {
    const int j = token / p.prefix_tile_tokens, Rp = (token - j * p.prefix_tile_tokens) * group + member;
    const attn_i64 row0 = ((attn_i64)j * p.num_kv_heads + kv_head) * ns * p.prefix_rows + Rp;
    float M = attn_merge_key(m, l);
#pragma unroll 1
    for (int s = 0; s < ns; s++) {
        const float *ml = p.prefix_ml + (row0 + (attn_i64)s * p.prefix_rows) * 2;
        M = fmaxf(M, attn_merge_key(__ldg(ml), __ldg(ml + 1)));
    }
    const float Mb = attn_merge_base(M), wa = attn_merge_weight(attn_merge_key(m, l), Mb);
    l *= wa;
#pragma unroll
    for (int i = 0; i < 8; i++) O[i] *= wa;
#pragma unroll 1
    for (int s = 0; s < ns; s++) {
        const attn_i64 row = row0 + (attn_i64)s * p.prefix_rows;
        const float ms = __ldg(p.prefix_ml + row * 2), ls = __ldg(p.prefix_ml + row * 2 + 1);
        const float ws = attn_merge_weight(attn_merge_key(ms, ls), Mb); /* an empty split weighs 0 */
        if (ws == 0.0f) continue;
        const float4 a = __ldg((const float4 *)(p.prefix_o + row * head_dim + c * 8));
        const float4 b = __ldg((const float4 *)(p.prefix_o + row * head_dim + c * 8 + 4));
        l += ws * ls;
        O[0] += ws * a.x; O[1] += ws * a.y; O[2] += ws * a.z; O[3] += ws * a.w;
        O[4] += ws * b.x; O[5] += ws * b.y; O[6] += ws * b.z; O[7] += ws * b.w;
    }
    m = M;
}

/* Writes 8 finished elements (columns 8c..8c+7) of row R of a tile: out and lse, or the
   partial slot. O is unnormalised; (m, l) its base-2 max and sum. The CPU's
   attn__cpu_store_rows. out_vec: every out row is 16-byte aligned (attn_out_vec). */
template <class T>
ATTN_DEV void attn_store_row8(const attn__paged_params &p, int q_row0, int kv_head, int slot, int R,
                              int c, const float *O, float m, float l, int out_vec) {
    if (slot >= 0) {
        float *dst = p.partial_o + ((attn_i64)slot * T::rows + R) * T::head_dim + c * 8;
        attn_vec16 v[2];
        attn_pack8<ATTN_DT_F32>(O, v);
        attn_stg16(dst, v[0]);
        attn_stg16(dst + 4, v[1]);
        if (c == 0) {
            float *ml = p.partial_ml + ((attn_i64)slot * T::rows + R) * 2;
            ml[0] = m;
            ml[1] = l;
        }
        return;
    }
    const int t = R / T::group, head = kv_head * T::group + (R - t * T::group);
    const attn_i64 token = q_row0 + t;
    float f[8];
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = O[i];
    if (CASCADE && p.prefix_splits) { /* the shared prefix's partials join first, the sink after */
        const int ns = *p.prefix_splits;
        if (ns > 0) attn_cascade_join(p, (int)token, kv_head, R - t * T::group, T::group, T::head_dim, c, ns, f, m, l);
    }
    float lse = attn_softmax_lse2(m, l) * ATTN_LN2;
    const float w = p.sinks ? attn_softmax_sink(__ldg(p.sinks + head), lse) : 1.0f; /* once, here */
    const float inv = l > 0.0f ? w * attn_rcp(l) : 0.0f; /* l >= 1 when a key was seen */
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] *= inv;
    char *dst = (char *)p.out + (token * p.out_stride_token + head * p.out_stride_head + c * 8) * T::esz_q;
    if (out_vec) {
        attn_vec16 v[2];
        attn_pack8<T::dt_q>(f, v);
        attn_stg16(dst, v[0]);
        if (T::esz_q == 4) attn_stg16(dst + 16, v[1]);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) ((typename T::q_t *)dst)[i] = attn_elem<T::dt_q>::from_f32(f[i]);
    }
    if (c == 0 && p.lse) p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = lse;
}

/* The same for every row of the launch, so the choice is made once, not per element
   (a per-row test inside the store loops also makes ptxas spill). */
template <class T> ATTN_DEV int attn_out_vec(const attn__paged_params &p) {
    return attn_aligned16(p.out) && ((p.out_stride_token * T::esz_q) & 15) == 0 &&
           ((p.out_stride_head * T::esz_q) & 15) == 0;
}

/* Merges the partial slots of merge entry `mi` into out/lse (the CPU's attn__cpu_merge_run),
   thread per (row, 8 columns), `nthreads` threads from `tid`. Loads at L2 (ld.global.cg):
   in the FUSED MERGE the partials were written by other CTAs of the same launch. */
template <class T> ATTN_DEV void attn_merge_entry(const attn__paged_params &p, int mi, int tid, int nthreads) {
    const int *item = p.merge + 8 * (attn_i64)mi;
    const int req = item[0], kv_head = item[1], tok0 = item[2], ntok = item[3];
    const int slot0 = item[4], nsplit = item[5];
    const int q_row0 = p.query_start_loc[req] + tok0, out_vec = attn_out_vec<T>(p);
    for (int u = tid; u < ntok * T::group * T::ot; u += nthreads) {
        const int R = u / T::ot, c = u - R * T::ot;
        float M = attn_neg_inf();
        /* m is read only for a split that saw a key (l > 0). Measured on the H200: reading
           both unconditionally (attn_merge_key of the two loads) made this kernel 2-4 us
           slower at 16-33 splits (docs/PERF.md, issue 21 bisect) */
        for (int s = 0; s < nsplit; s++) {
            const float *ml = p.partial_ml + ((attn_i64)(slot0 + s) * T::rows + R) * 2;
            M = fmaxf(M, __ldcg(ml + 1) > 0.0f ? __ldcg(ml) : attn_neg_inf());
        }
        const float Mb = attn_merge_base(M);
        float L = 0.0f, f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < nsplit; s++) {
            const attn_i64 row = (attn_i64)(slot0 + s) * T::rows + R;
            const float *ml = p.partial_ml + row * 2;
            const float ms = __ldcg(ml), ls = __ldcg(ml + 1);
            /* an empty split (l = 0) contributes nothing, whatever its O holds; a NaN one
               (l NaN) makes the row NaN */
            const int used = !(ls <= 0.0f);
            const float w = used ? attn_exp2(ms - Mb) : 0.0f; /* = attn_merge_weight(attn_merge_key(ms, ls), Mb) */
            const float4 a = __ldcg((const float4 *)(p.partial_o + row * T::head_dim + c * 8));
            const float4 b = __ldcg((const float4 *)(p.partial_o + row * T::head_dim + c * 8 + 4));
            const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            L += used ? ls * w : 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] += used ? w * x[i] : 0.0f;
        }
        attn_store_row8<T>(p, q_row0, kv_head, -1, R, c, f, M, L, out_vec);
    }
}

/* ---- stage: the Q rows -> shared memory (cp.async group 0, with the first K/V tile) ----
   16/32-bit caches: Q as it is (16-byte copies where rows are aligned). 8-bit caches: f16,
   scaled by 2^e: the CTA's largest |q| into [2^14, 2^15); the columns of each 16 in the
   order the K fragments come (8-BIT CACHES). Returns 2^-e (1 for 16/32-bit caches). With
   tensor cores and HEAD_DIM % 16 = 8 the 8 columns past HEAD_DIM enter Q K^T: zero in Q and
   in every K stage (cp.async never writes them). */
template <class T>
ATTN_DEV float attn_paged_load_q(const attn__paged_params &p, const attn_paged_item &w, const attn_paged_smem<T> &sm,
                                 int tid) {
    typename T::sq_t *sQ = sm.q();
    float q_unscale = 1.0f;
    if constexpr (T::kv8) {
        __shared__ int attn_q_amax;
        if (tid == 0) attn_q_amax = 0;
        __syncthreads();
        auto q_at = [&](int r, int c) -> float {
            const int t = r / T::group;
            return attn_load<T::dt_q>(p.q, (attn_i64)(w.q_start + w.tok0 + t) * p.q_stride_token +
                                               (attn_i64)(w.kv_head * T::group + r - t * T::group) * p.q_stride_head + c);
        };
        float amax = 0.0f;
        for (int u = tid; u < w.nrows * T::head_dim; u += T::threads)
            amax = fmaxf(amax, fabsf(q_at(u / T::head_dim, u % T::head_dim)));
        atomicMax(&attn_q_amax, __float_as_int(amax)); /* non-negative floats order as ints */
        __syncthreads();
        const int ex = (attn_q_amax >> 23) & 0xff; /* biased exponent of the largest |q| */
        const int sh = attn_q_amax == 0 || ex == 255 ? 0 : attn_imax(-100, attn_imin(100, 141 - ex));
        const float qmul = __int_as_float((127 + sh / 2) << 23) * __int_as_float((127 + sh - sh / 2) << 23);
        q_unscale = __int_as_float((127 - sh / 2) << 23) * __int_as_float((127 - sh + sh / 2) << 23);
        for (int u = tid; u < T::rows_pad * T::head_dim; u += T::threads) {
            const int r = u / T::head_dim, c = u - r * T::head_dim, x = c & 15;
            /* mma k column x of a 16-block holds dim 4 (x / 2) + x % 2 (x < 8) or that + 2 */
            const int dim = (c & ~15) + 4 * ((x & 7) >> 1) + (x & 1) + (x >= 8 ? 2 : 0);
            sQ[r * T::q_pitch + c] = attn_f32_to_f16(r < w.nrows ? q_at(r, dim) * qmul : 0.0f);
        }
    } else {
        const int cpr = T::head_dim * T::esz_q / 16;
        const int vec = attn_aligned16(p.q) && ((p.q_stride_token * T::esz_q) & 15) == 0 &&
                        ((p.q_stride_head * T::esz_q) & 15) == 0;
        for (int c = tid; c < T::rows_pad * cpr; c += T::threads) {
            const int r = c / cpr, col = c - r * cpr, t = r / T::group;
            const int valid = r < w.nrows;
            const char *src = valid ? (const char *)p.q +
                                          ((attn_i64)(w.q_start + w.tok0 + t) * p.q_stride_token +
                                           (attn_i64)(w.kv_head * T::group + r - t * T::group) * p.q_stride_head) * T::esz_q + col * 16
                                    : (const char *)p.q;
            char *dst = (char *)sQ + r * (T::q_pitch * T::esz_sq) + col * 16;
            if (vec) {
                attn_cp_async16(attn_smem_addr(dst), src, valid ? 16 : 0);
            } else {
#pragma unroll
                for (int i = 0; i < 16 / T::esz_q; i++)
                    ((typename T::q_t *)dst)[i] = valid ? ((const typename T::q_t *)src)[i] : (typename T::q_t)0;
            }
        }
    }
    if constexpr (T::use_mma && T::head_dim % 16 != 0) {
        for (int r = tid; r < T::rows_pad + T::kv_stages * T::kv_tile; r += T::threads) {
            attn_vec16 z = {0u, 0u, 0u, 0u};
            if (r < T::rows_pad) *(attn_vec16 *)(sQ + r * T::q_pitch + T::head_dim) = z;
            else *(attn_vec16 *)(sm.k() + (r - T::rows_pad) * T::kv_pitch + T::head_dim) = z;
        }
    }
    return q_unscale;
}

/* ---- stage: the copies of one K/V tile ----
   Thread chunk i: row kv_row(i) of the tile, 16-byte column kv_col(i) (the same positions
   in every tile), from the cache offsets in the row table of `stage` (-1: zero-fill,
   nothing read); KV_PTH: then each row's two scales (4-byte copies, 0 outside the range). */
template <class T>
ATTN_DEV void attn_paged_issue(const attn_paged_smem<T> &sm, const char *kv_base, attn_i64 v_bytes, int stage, unsigned utid) {
    const attn_i64 *sBlk = sm.blk();
    const attn_u32 sK_addr = sm.k_addr(), sV_addr = sm.v_addr();
#pragma unroll
    for (int i = 0; i < T::kv_lpt; i++) {
        const int r = T::threads % T::kv_cpr == 0 ? (int)(utid / T::kv_cpr) + i * (T::threads / T::kv_cpr)
                                                  : (int)((utid + i * T::threads) / T::kv_cpr);
        const int col = T::threads % T::kv_cpr == 0 ? (int)(utid % T::kv_cpr) : (int)((utid + i * T::threads) % T::kv_cpr);
        if (T::kv_chunks % T::threads == 0 || r < T::kv_tile) {
            const attn_i64 b = sBlk[stage * T::kv_tile + r];
            const char *src = kv_base + (b >= 0 ? b + col * 16 : 0);
            const attn_u32 off = (attn_u32)((stage * T::kv_tile + r) * T::srow + col * 16);
            attn_cp_async16_or_zero(sK_addr + off, src, b < 0);
            attn_cp_async16_or_zero(sV_addr + off, src + (b >= 0 ? v_bytes : 0), b < 0);
        }
    }
    if constexpr (T::kv_pth) {
        const int *sDel = sm.del();
        const attn_u32 sKs_addr = sm.k_scales_addr(), sVs_addr = sm.v_scales_addr();
        for (int r = (int)utid; r < T::kv_tile; r += T::threads) {
            const attn_i64 b = sBlk[stage * T::kv_tile + r];
            const char *src = kv_base + (b >= 0 ? b + sDel[stage * T::kv_tile + r] : 0);
            attn_cp_async4_or_zero(sKs_addr + (attn_u32)(stage * T::kv_tile + r) * 4, src, b < 0);
            attn_cp_async4_or_zero(sVs_addr + (attn_u32)(stage * T::kv_tile + r) * 4, src + (b >= 0 ? v_bytes : 0), b < 0);
        }
    }
}

/* KV_PTH: each score times its key's K scale. */
template <class T>
ATTN_DEV void attn_paged_k_scales(float (&s)[T::warp_rows][T::nt][4], const attn_paged_smem<T> &sm, int stage, int lane,
                                  int wn) {
    const int tq = lane & 3;
    if constexpr (T::kv_pth) { /* each key's K scale (lane keys 8n + 2tq, + 1) */
        const float *ks = sm.k_scales() + stage * T::kv_tile + wn * T::kw + 2 * tq;
#pragma unroll
        for (int n = 0; n < T::nt; n++) {
            const attn_vec8 kk = *(const attn_vec8 *)(ks + 8 * n);
#pragma unroll
            for (int wr = 0; wr < T::warp_rows; wr++) {
                s[wr][n][0] *= __int_as_float(kk.x); s[wr][n][1] *= __int_as_float(kk.y);
                s[wr][n][2] *= __int_as_float(kk.x); s[wr][n][3] *= __int_as_float(kk.y);
            }
        }
    }
}

/* ---- stage: S = Q K^T for 16 rows x KW keys per row tile of the warp ----
   Each K fragment feeds every row tile of the warp. Three forms: 8-bit codes (ldmatrix of
   the codes as b16, converted in registers), 16-bit tensor cores, f32 FMA. Q fragments
   from registers (qf, Q_IN_REGS) or from shared memory. */
template <class T>
ATTN_DEV void attn_paged_qk(float (&s)[T::warp_rows][T::nt][4], const attn_paged_smem<T> &sm,
                            const attn_u32 (&qf)[T::warp_rows][T::hdp / 16][4], int stage, int row0, int lane,
                            int wn, int wv, int warp) {
    const int g = lane >> 2, tq = lane & 3;
    const attn_u32 sQ_addr = sm.q_addr();
    /* lane offsets (bytes) of the ldmatrix row addresses, see the fragment table in
       attn_common.cuh: Q as A (rows lane%16, column half lane/16), K as B (keys lane%8 +
       8*(lane/16), column half (lane/8)%2) */
    const attn_u32 q_lane = (attn_u32)(((row0 + (lane & 15)) * T::q_pitch + (lane >> 4) * 8) * 2);
    auto q_frag = [&](attn_u32 *a, int wr, int byte) { /* Q from shared memory */
        attn_ldmatrix_x4(a, sQ_addr + q_lane + (attn_u32)(wr * 16 * T::q_pitch * 2) + byte);
    };
#pragma unroll
    for (int wr = 0; wr < T::warp_rows; wr++)
#pragma unroll
        for (int n = 0; n < T::nt; n++) s[wr][n][0] = s[wr][n][1] = s[wr][n][2] = s[wr][n][3] = 0.0f;
    if constexpr (T::kv8) {
        /* lane (g, t) gets key g's four codes 4t..4t+3 of a 16-dim block, whose f16 are b0
           and b1 of the B fragment for Q's column order; x4: keys 0-7 and 8-15 (n8 tiles
           2np, 2np+1) x dims +0 and +16 (k chunks), matrices in the order keys 0-7 +0,
           keys 0-7 +16, keys 8-15 +0, 8-15 +16; the x2: keys 0-7 +0, 8-15 +0 */
        const attn_u32 k8_lane4 = (attn_u32)(((lane & 7) + ((lane >> 4) << 3)) * T::srow + ((lane >> 3) & 1) * 16);
        const attn_u32 k8_lane2 = (attn_u32)(((lane & 7) + (((lane >> 3) & 1) << 3)) * T::srow);
        const attn_u32 kb = sm.k_addr() + (attn_u32)((stage * T::kv_tile + wn * T::kw) * T::srow);
        constexpr int kqn = T::split_s ? T::head_dim / 64 : T::head_dim / 32; /* SPLIT_S: this group's half */
        const int kq0 = T::split_s ? wv * kqn : 0;
#pragma unroll
        for (int np = 0; np < T::nt / 2; np++) {
#pragma unroll
            for (int kx = 0; kx < kqn; kx++) {
                const int kq = kq0 + kx;
                attn_u32 w[4], b[4][2];
                attn_ldmatrix_x4(w, kb + k8_lane4 + (attn_u32)(np * 16 * T::srow + kq * 32));
#pragma unroll
                for (int i = 0; i < 4; i++) attn_codes4_to_f16x2<T::dt_kv>(w[i], b[i][0], b[i][1]);
#pragma unroll
                for (int wr = 0; wr < T::warp_rows; wr++) {
                    attn_u32 a0[4], a1[4];
                    if constexpr (T::q_in_regs) { /* (never with SPLIT_S: Q_IN_REGS needs HEAD_DIM <= 128) */
#pragma unroll
                        for (int i = 0; i < 4; i++) a0[i] = qf[wr][2 * kx][i], a1[i] = qf[wr][2 * kx + 1][i];
                    } else {
                        q_frag(a0, wr, kq * 64);
                        q_frag(a1, wr, kq * 64 + 32);
                    }
                    attn_mma16816<T::dt_m>(s[wr][2 * np], a0, b[0]);
                    attn_mma16816<T::dt_m>(s[wr][2 * np], a1, b[1]);
                    attn_mma16816<T::dt_m>(s[wr][2 * np + 1], a0, b[2]);
                    attn_mma16816<T::dt_m>(s[wr][2 * np + 1], a1, b[3]);
                }
            }
            if constexpr (T::head_dim % 32 != 0) { /* the last 16 dims: x2, keys 0-7 and 8-15 */
                attn_u32 w[2], b[2][2];
                attn_ldmatrix_x2(w, kb + k8_lane2 + (attn_u32)(np * 16 * T::srow + T::head_dim - 16));
#pragma unroll
                for (int i = 0; i < 2; i++) attn_codes4_to_f16x2<T::dt_kv>(w[i], b[i][0], b[i][1]);
#pragma unroll
                for (int wr = 0; wr < T::warp_rows; wr++) {
                    attn_u32 a[4];
                    if constexpr (T::q_in_regs) {
#pragma unroll
                        for (int i = 0; i < 4; i++) a[i] = qf[wr][T::head_dim / 16 - 1][i];
                    } else {
                        q_frag(a, wr, (T::head_dim - 16) * 2);
                    }
                    attn_mma16816<T::dt_m>(s[wr][2 * np], a, b[0]);
                    attn_mma16816<T::dt_m>(s[wr][2 * np + 1], a, b[1]);
                }
            }
        }
    } else if constexpr (T::use_mma) {
        const attn_u32 k_lane = (attn_u32)((((lane & 7) + ((lane >> 4) << 3)) * T::kv_pitch + ((lane >> 3) & 1) * 8) * 2);
        const attn_u32 kb = sm.k_addr() + (attn_u32)((stage * T::kv_tile + wn * T::kw) * T::kv_pitch * 2) + k_lane;
        constexpr int ksn = T::split_s ? T::hdp / 32 : T::hdp / 16; /* SPLIT_S: this group's half */
        const int ks0 = T::split_s ? wv * ksn : 0;
#pragma unroll
        for (int kx = 0; kx < ksn; kx++) {
            const int ks = ks0 + kx;
            attn_u32 qa[T::warp_rows][4];
            if constexpr (T::q_in_regs) {
#pragma unroll
                for (int wr = 0; wr < T::warp_rows; wr++)
#pragma unroll
                    for (int i = 0; i < 4; i++) qa[wr][i] = qf[wr][kx][i];
            } else {
#pragma unroll
                for (int wr = 0; wr < T::warp_rows; wr++) q_frag(qa[wr], wr, ks * 32);
            }
#pragma unroll
            for (int np = 0; np < T::nt / 2; np++) {
                attn_u32 b[4];
                attn_ldmatrix_x4(b, kb + (attn_u32)((np * 16 * T::kv_pitch + ks * 16) * 2));
#pragma unroll
                for (int wr = 0; wr < T::warp_rows; wr++) {
                    attn_mma16816<T::dt_m>(s[wr][2 * np], qa[wr], b);
                    attn_mma16816<T::dt_m>(s[wr][2 * np + 1], qa[wr], b + 2);
                }
            }
        }
    } else {
        const typename T::q_t *q0 = (const typename T::q_t *)sm.q() + (row0 + g) * T::q_pitch, *q1 = q0 + 8 * T::q_pitch;
        const typename T::kv_t *kb = sm.k() + (stage * T::kv_tile + wn * T::kw + 2 * tq) * T::kv_pitch;
#pragma unroll 2
        for (int d = 0; d < T::head_dim; d += 4) {
            float a0[4], a1[4];
            attn_lds4<T::dt_q>(q0 + d, a0);
            attn_lds4<T::dt_q>(q1 + d, a1);
#pragma unroll
            for (int n = 0; n < T::nt; n++) {
                float k0[4], k1[4];
                attn_lds4<T::dt_kv>(kb + n * 8 * T::kv_pitch + d, k0);
                attn_lds4<T::dt_kv>(kb + (n * 8 + 1) * T::kv_pitch + d, k1);
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
    if constexpr (T::split_s) { /* this group's partial, for its partner (attn_paged_s_join) */
        constexpr int E = T::warp_rows * T::nt * 4;
        float *mine = sm.xch() + warp * E * 32 + lane;
#pragma unroll
        for (int wr = 0; wr < T::warp_rows; wr++)
#pragma unroll
            for (int n = 0; n < T::nt; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) mine[((wr * T::nt + n) * 4 + e) * 32] = s[wr][n][e];
    } else {
        attn_paged_k_scales<T>(s, sm, stage, lane, wn);
    }
}

/* SPLIT_S: after a __syncthreads, S = partial(group 0) + partial(group 1), in that order in
   both warps of the pair (the same numbers), then the K scales (KV_PTH). */
template <class T>
ATTN_DEV void attn_paged_s_join(float (&s)[T::warp_rows][T::nt][4], const attn_paged_smem<T> &sm, int stage, int lane,
                                int wn, int wv, int warp) {
    constexpr int E = T::warp_rows * T::nt * 4;
    const int partner = warp + (wv ? -1 : 1) * T::warp_rt * T::warps_n;
    const float *theirs = sm.xch() + partner * E * 32 + lane;
#pragma unroll
    for (int wr = 0; wr < T::warp_rows; wr++)
#pragma unroll
        for (int n = 0; n < T::nt; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float o = theirs[((wr * T::nt + n) * 4 + e) * 32];
                s[wr][n][e] = wv ? o + s[wr][n][e] : s[wr][n][e] + o;
            }
    attn_paged_k_scales<T>(s, sm, stage, lane, wn);
}

/* ---- stage: O += P V ----
   P's A fragments straight from the S accumulators (tensor cores), V fragments by
   ldmatrix.trans. 8-bit codes: lane (g, t) gets, for keys 2t and 2t + 1 (and + 8), the codes
   of dims 2g and 2g + 1 of a 16-dim block; the even ones make the B fragment of an n8 tile
   of the even dims, the odd ones of the odd dims: O's tiles 4q .. 4q + 3 hold dims
   32q + {even, odd} and 32q + 16 + {even, odd} (the epilogue puts them back in order).
   FMA form: P of key 8n + 2src + e for rows g and g + 8 lives in lane 4g + src (shuffles).
   WIDE HEADS: the warp's O columns start at wv * OVW (the V rows' half of its group). */
template <class T>
ATTN_DEV void attn_paged_pv(float (&o)[T::warp_rows][T::otw][4], const float (&s)[T::warp_rows][T::nt][4],
                            const attn_paged_smem<T> &sm, int stage, int lane, int wn, int wv) {
    const int tq = lane & 3;
    if constexpr (T::kv8) {
        const attn_u32 v8_lane = (attn_u32)(((lane & 7) + (((lane >> 3) & 1) << 3)) * T::srow + (lane >> 4) * 16);
        const attn_u32 vb = sm.v_addr() + (attn_u32)((stage * T::kv_tile + wn * T::kw) * T::srow + wv * T::ovw) + v8_lane;
#pragma unroll
        for (int kk = 0; kk < T::kw / 16; kk++) {
            attn_u32 a[T::warp_rows][4];
#pragma unroll
            for (int wr = 0; wr < T::warp_rows; wr++) attn_p_fragment<T>(s[wr], kk, a[wr]);
            const attn_u32 vrow = vb + (attn_u32)(kk * 16 * T::srow);
#pragma unroll
            for (int dq = 0; dq < (T::ovw + 16) / 32; dq++) {
                attn_u32 r[4], b[4][2];
                const int halves = dq < T::ovw / 32 ? 2 : 1; /* OVW % 32: the last 16 dims */
                if (halves == 2) attn_ldmatrix_x4_trans(r, vrow + dq * 32);
                else attn_ldmatrix_x2_trans(r, vrow + dq * 32);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (h < halves) {
                        attn_codes4_to_f16x2<T::dt_kv>(attn_prmt(r[2 * h], r[2 * h + 1], 0x6420u), b[2 * h][0], b[2 * h][1]);
                        attn_codes4_to_f16x2<T::dt_kv>(attn_prmt(r[2 * h], r[2 * h + 1], 0x7531u), b[2 * h + 1][0], b[2 * h + 1][1]);
#pragma unroll
                        for (int wr = 0; wr < T::warp_rows; wr++) {
                            attn_mma16816<T::dt_m>(o[wr][4 * dq + 2 * h], a[wr], b[2 * h]);
                            attn_mma16816<T::dt_m>(o[wr][4 * dq + 2 * h + 1], a[wr], b[2 * h + 1]);
                        }
                    }
                }
            }
        }
    } else if constexpr (T::use_mma) {
        /* V as B transposed (keys lane%16, column half lane/16) */
        const attn_u32 v_lane = (attn_u32)(((lane & 15) * T::kv_pitch + (lane >> 4) * 8) * 2);
        const attn_u32 vb = sm.v_addr() + (attn_u32)(((stage * T::kv_tile + wn * T::kw) * T::kv_pitch + wv * T::ovw) * 2) + v_lane;
#pragma unroll
        for (int kk = 0; kk < T::kw / 16; kk++) {
            attn_u32 a[T::warp_rows][4]; /* the C fragments of keys 16kk.. are the A fragment of P */
#pragma unroll
            for (int wr = 0; wr < T::warp_rows; wr++) attn_p_fragment<T>(s[wr], kk, a[wr]);
            const attn_u32 vrow = vb + (attn_u32)(kk * 16 * T::kv_pitch * 2);
#pragma unroll
            for (int op = 0; op < T::otw / 2; op++) {
                attn_u32 b[4]; /* one V fragment for every row tile of the warp */
                attn_ldmatrix_x4_trans(b, vrow + op * 32);
#pragma unroll
                for (int wr = 0; wr < T::warp_rows; wr++) {
                    attn_mma16816<T::dt_m>(o[wr][2 * op], a[wr], b);
                    attn_mma16816<T::dt_m>(o[wr][2 * op + 1], a[wr], b + 2);
                }
            }
            if constexpr (T::otw % 2 != 0) {
                attn_u32 b[2];
                attn_ldmatrix_x2_trans(b, vrow + (T::otw - 1) * 16);
#pragma unroll
                for (int wr = 0; wr < T::warp_rows; wr++) attn_mma16816<T::dt_m>(o[wr][T::otw - 1], a[wr], b);
            }
        }
    } else {
        const typename T::kv_t *vb = sm.v() + (stage * T::kv_tile + wn * T::kw) * T::kv_pitch + wv * T::ovw + 2 * tq;
#pragma unroll
        for (int n = 0; n < T::nt; n++)
#pragma unroll
            for (int src = 0; src < 4; src++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p0 = __shfl_sync(0xffffffffu, s[0][n][e], (lane & ~3) | src);
                    const float p1 = __shfl_sync(0xffffffffu, s[0][n][2 + e], (lane & ~3) | src);
                    const typename T::kv_t *v = vb + (8 * n + 2 * src + e) * T::kv_pitch;
#pragma unroll
                    for (int i = 0; i < T::otw; i++) {
                        float vv[2];
                        attn_lds2<T::dt_kv>(v + i * 8, vv);
                        o[0][i][0] = fmaf(p0, vv[0], o[0][i][0]);
                        o[0][i][1] = fmaf(p0, vv[1], o[0][i][1]);
                        o[0][i][2] = fmaf(p1, vv[0], o[0][i][2]);
                        o[0][i][3] = fmaf(p1, vv[1], o[0][i][3]);
                    }
                }
    }
}

/* ---- the kernel ---- */
/* One work item (`item` of the list); every thread of the CTA calls it with the same item
   and returns from it together (a bad fp8 scale returns before any barrier). */
template <class T> ATTN_DEV void attn_paged_attention_item(const attn__paged_params &p, const int item) {
    extern __shared__ attn_vec16 attn_smem[];
    const attn_paged_smem<T> sm = {(char *)attn_smem, attn_smem_addr(attn_smem)};

    /* ---- prologue: the work item ---- */
    const attn_paged_item w = attn_paged_item_load(p, item, T::group);
    const int key0 = w.key0, key1 = w.key1, kv_head = w.kv_head, slot = w.slot;
    /* per-tensor fp8 scales: a bad one (not finite and > 0) writes nothing, see 8-BIT CACHES */
    float k_scale = 1.0f, v_scale = 1.0f;
    if constexpr (T::kv8 && !T::kv_pth) {
        k_scale = attn_cache_scale(p.k_scale, p.k_scale_value);
        v_scale = attn_cache_scale(p.v_scale, p.v_scale_value);
        if (k_scale == 0.0f || v_scale == 0.0f) return;
    }

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wv = T::vsplit > 1 ? warp / (T::warp_rt * T::warps_n) : 0; /* WIDE HEADS: the column group */
    const int wm = (warp - wv * T::warp_rt * T::warps_n) / T::warps_n, wn = warp - (wv * T::warp_rt + wm) * T::warps_n;
    const int g = lane >> 2, tq = lane & 3; /* mma row group and lane within it */

    const float q_unscale = attn_paged_load_q<T>(p, w, sm, tid); /* 8-bit caches: 2^-e */

    /* ---- this lane's rows (g and g + 8 of each of the warp's row tiles): visible keys ---- */
    const int row0 = wm * T::warp_rows * 16; /* the warp's first row; row tile wr at row0 + 16 wr */
    int lo[T::warp_rows][2], hi[T::warp_rows][2];
    int qpos[T::warp_rows][2];    /* ALIBI */
    float slope[T::warp_rows][2]; /* ALIBI */
    int lo_min = 0x7fffffff, lo_max = (int)0x80000000, hi_min = 0x7fffffff, hi_max = (int)0x80000000;
#pragma unroll
    for (int x = 0; x < 2 * T::warp_rows; x++) {
        const int wr = x >> 1, rr = x & 1;
        const int R = row0 + wr * 16 + g + 8 * rr, t = R / T::group;
        const int valid = R < w.nrows;
        const int pos = w.seq_len - w.query_len + w.tok0 + t;
        int a, b;
        attn_visible_keys<T::window>(p, w.causal, pos, w.seq_len, key0, key1, a, b);
        lo[wr][rr] = valid ? a : 0;
        hi[wr][rr] = valid ? b : 0;
        if constexpr (T::alibi) {
            qpos[wr][rr] = pos;
            slope[wr][rr] = valid ? p.alibi_slopes[kv_head * T::group + (R - t * T::group)] * ATTN_LOG2E : 0.0f;
        }
        if (valid) {
            lo_min = attn_imin(lo_min, a); lo_max = attn_imax(lo_max, a);
            hi_min = attn_imin(hi_min, b); hi_max = attn_imax(hi_max, b);
        }
    }
    lo_min = attn_warp_imin(lo_min); lo_max = attn_warp_imax(lo_max);
    hi_min = attn_warp_imin(hi_min); hi_max = attn_warp_imax(hi_max);

    /* ---- the K/V tile loader: the row table of the first stages, their copies ---- */
    const attn_paged_rows<T::block_size, T::head_dim * T::esz_kv, T::kv_pth ? 4 : 0> rows(p, w.req, kv_head, key0, key1);
    const char *kv_base = (const char *)p.kv_cache;
    int tile0, ntiles;
    attn_paged_tiles<T::kv_tile>(key0, key1, tile0, ntiles);
    rows.template fill<T::kv_stages, T::kv_tile, T::threads>(sm.blk(), sm.del(), tile0, tid);
    __syncthreads();
#pragma unroll
    for (int s = 0; s < T::kv_stages - 1; s++) {
        if (s < ntiles) attn_paged_issue<T>(sm, kv_base, rows.v_bytes, s, (unsigned)tid);
        attn_cp_async_commit(); /* one group per tile slot, empty or not: uniform counting */
    }

    /* ---- per-warp softmax state, per row tile wr: rows g (rr 0) and g + 8 (rr 1); O in
       C-fragment layout ---- */
    float m[T::warp_rows][2], l[T::warp_rows][2], o[T::warp_rows][T::otw][4];
#pragma unroll
    for (int wr = 0; wr < T::warp_rows; wr++) {
        m[wr][0] = m[wr][1] = attn_neg_inf();
        l[wr][0] = l[wr][1] = 0.0f;
#pragma unroll
        for (int i = 0; i < T::otw; i++) o[wr][i][0] = o[wr][i][1] = o[wr][i][2] = o[wr][i][3] = 0.0f;
    }
    int v_e = 1; /* KV_PTH: biased exponent E, O holds sum p * (v scale / 2^(E - 127)) * code */
    /* the q.k each score needs from the mma's: 8-bit caches, k_scale, 2^-e, the code factor */
    const float kv_fac = T::kv8 ? k_scale * q_unscale * attn_code_factor<T::dt_kv>() : 1.0f;
    const float cap_inv = T::softcap ? 1.0f / p.softcap : 0.0f, cap_log2 = T::softcap ? p.softcap * ATTN_LOG2E : 0.0f;
    const float qk_scale = T::softcap ? p.scale * kv_fac : p.scale * ATTN_LOG2E * kv_fac;
    attn_u32 qf[T::warp_rows][T::hdp / 16][4]; /* Q_IN_REGS: the Q fragments */

    for (int it = 0; it < ntiles; it++) {
        attn_cp_async_wait<T::kv_stages - 2>(); /* this thread's part of tile `it` has landed */
        __syncthreads();                         /* everyone's part; stage (it-1) is free again */
        if (it + T::kv_stages - 1 < ntiles)
            attn_paged_issue<T>(sm, kv_base, rows.v_bytes, (it + T::kv_stages - 1) % T::kv_stages, (unsigned)tid);
        attn_cp_async_commit();
        int next_blk[T::kv_bpt]; /* block numbers of tile it + KV_STAGES, stored after compute */
        rows.template prefetch<T::kv_tile, T::threads>(tile0 + (it + T::kv_stages) * T::kv_tile, tid, next_blk);
        if constexpr (T::use_mma && T::q_in_regs) {
            if (it == 0) {
                const attn_u32 q_lane = (attn_u32)(((row0 + (lane & 15)) * T::q_pitch + (lane >> 4) * 8) * 2);
#pragma unroll
                for (int wr = 0; wr < T::warp_rows; wr++)
#pragma unroll
                    for (int ks = 0; ks < T::hdp / 16; ks++)
                        attn_ldmatrix_x4(qf[wr][ks], sm.q_addr() + q_lane + (attn_u32)(wr * 16 * T::q_pitch * 2) + ks * 32);
            }
        }
        const int stage = it % T::kv_stages;
        const int kt0 = tile0 + it * T::kv_tile + wn * T::kw; /* this warp's first key */
        /* A warp whose rows see none of its keys skips them (causal tiles above the
           diagonal). The test is uniform over the warp already; __all_sync says so to
           ptxas, which otherwise builds the softmax shuffles a divergent slow path (a call,
           and spills around it). */
        const int sees = __all_sync(0xffffffffu, kt0 + T::kw > lo_min && kt0 < hi_max);
        float s[T::warp_rows][T::nt][4];
        if constexpr (T::split_s) { /* WIDE HEADS: the pair's partial S, exchanged across a __syncthreads */
            if (sees) attn_paged_qk<T>(s, sm, qf, stage, row0, lane, wn, wv, warp);
            __syncthreads();
            if (sees) attn_paged_s_join<T>(s, sm, stage, lane, wn, wv, warp);
        }
        if (sees) {
            const int need_mask = kt0 < lo_max || kt0 + T::kw > hi_min;
            if constexpr (!T::split_s) attn_paged_qk<T>(s, sm, qf, stage, row0, lane, wn, wv, warp);

            /* ---- scores in base 2, masks, online softmax (row tile wr, element e: row rr =
               e / 2, key kt0 + 8n + 2tq + e % 2) ---- */
#pragma unroll
            for (int wr = 0; wr < T::warp_rows; wr++) {
                float mx[2] = {attn_neg_inf(), attn_neg_inf()};
                /* Per-tile row offsets, so that per element only the constant 8n + e%2 varies
                   (offsets like lo - 8n would be hoisted out of the tile loop: 32 registers). */
                int dlo[2], dhi[2];
                float dpos[2]; /* ALIBI */
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    dlo[rr] = lo[wr][rr] - (kt0 + 2 * tq);
                    dhi[rr] = hi[wr][rr] - (kt0 + 2 * tq);
                    if constexpr (T::alibi) dpos[rr] = (float)(kt0 + 2 * tq - qpos[wr][rr]);
                }
#pragma unroll
                for (int n = 0; n < T::nt; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int rr = e >> 1, c = 8 * n + (e & 1); /* key = kt0 + 2tq + c */
                        float x;
                        if constexpr (T::softcap) x = cap_log2 * attn_tanh(s[wr][n][e] * qk_scale * cap_inv);
                        else x = s[wr][n][e] * qk_scale;
                        if constexpr (T::alibi) x = fmaf(slope[wr][rr], dpos[rr] + (float)c, x);
                        if (need_mask && (c < dlo[rr] || c >= dhi[rr])) x = attn_neg_inf();
                        s[wr][n][e] = x;
                        mx[rr] = fmaxf(mx[rr], x);
                    }
                float sum[2] = {0.0f, 0.0f}, base[2], alpha[2];
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    base[rr] = attn_softmax_rebase(m[wr][rr], attn_quad_max(mx[rr]), alpha[rr]);
                    l[wr][rr] *= alpha[rr];
                }
                /* O is rescaled only when some row's max moved (after the first tiles of a
                   long row it rarely does: a decode tile then skips 2 x HEAD_DIM / 4
                   multiplies). Decode-shaped CTAs only (one row tile): prefill rows move
                   their max often, and with two row tiles per warp the vote's registers
                   tip ptxas into spills at 255. */
                if (T::row_tiles > 1 || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                    for (int rr = 0; rr < 2; rr++)
#pragma unroll
                        for (int i = 0; i < T::otw; i++) { o[wr][i][2 * rr] *= alpha[rr]; o[wr][i][2 * rr + 1] *= alpha[rr]; }
                }
#pragma unroll
                for (int n = 0; n < T::nt; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        s[wr][n][e] = attn_exp2(s[wr][n][e] - base[e >> 1]);
                        sum[e >> 1] += s[wr][n][e];
                    }
                l[wr][0] += sum[0]; /* lane-partial sums; the 4 lanes of a row are added in the epilogue */
                l[wr][1] += sum[1];
            }

            if constexpr (T::kv_pth) {
                /* P times each key's V scale / 2^(E - 127); E follows the largest V scale
                   (uniform over the warp: the four lanes of a row group hold all of its keys) */
                const float *vs = sm.v_scales() + stage * T::kv_tile + wn * T::kw + 2 * tq;
                float vsc[T::nt][2], vmax = 0.0f;
#pragma unroll
                for (int n = 0; n < T::nt; n++) {
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
                    for (int wr = 0; wr < T::warp_rows; wr++)
#pragma unroll
                        for (int i = 0; i < T::otw; i++) { o[wr][i][0] *= f; o[wr][i][1] *= f; o[wr][i][2] *= f; o[wr][i][3] *= f; }
                    v_e = et;
                }
                const float r = __int_as_float((254 - v_e) << 23);
#pragma unroll
                for (int n = 0; n < T::nt; n++) {
                    const float f0 = vsc[n][0] * r, f1 = vsc[n][1] * r;
#pragma unroll
                    for (int wr = 0; wr < T::warp_rows; wr++) {
                        s[wr][n][0] *= f0; s[wr][n][1] *= f1; s[wr][n][2] *= f0; s[wr][n][3] *= f1;
                    }
                }
            }

            attn_paged_pv<T>(o, s, sm, stage, lane, wn, wv);
        }
        if (it + T::kv_stages < ntiles) /* the slot of tile it + KV_STAGES held tile it: done */
            rows.template store<T::kv_tile, T::threads>(sm.blk(), sm.del(), (it + T::kv_stages) % T::kv_stages,
                                                        tile0 + (it + T::kv_stages) * T::kv_tile, tid, next_blk);
    }

    /* ---- epilogue: combine the WARPS_N key slices of each row, then store ---- */
    attn_cp_async_wait<0>(); /* nothing may still land in the stages being reused */
    __syncthreads();         /* every warp is done with the K/V stages */
    float *sO = sm.epi_o(), *sM = sm.epi_m(), *sL = sm.epi_l();
    /* O in the values' units: 8-bit caches, v_scale (per tensor) or 2^(E - 127), code factor */
    const float ofac = T::kv_pth ? __int_as_float(v_e << 23) * attn_code_factor<T::dt_kv>()
                       : T::kv8  ? v_scale * attn_code_factor<T::dt_kv>()
                                 : 1.0f;
#pragma unroll
    for (int x = 0; x < 2 * T::warp_rows; x++) {
        const int wr = x >> 1, rr = x & 1;
        const int R = row0 + wr * 16 + g + 8 * rr;
        if constexpr (T::kv8) {
            float *orow = sO + (wn * T::rows_pad + R) * T::o_pitch + wv * T::ovw + 4 * tq;
#pragma unroll
            for (int i = 0; i < T::otw; i++) { /* tile i: dims d + (i & 1) + 4t and + 2 (see attn_paged_pv) */
                const int d = (i >> 2) * 32 + ((i & 2) ? 16 : 0) + (i & 1);
                orow[d] = o[wr][i][2 * rr] * ofac;
                orow[d + 2] = o[wr][i][2 * rr + 1] * ofac;
            }
        } else {
            float *orow = sO + (wn * T::rows_pad + R) * T::o_pitch + wv * T::ovw + 2 * tq;
#pragma unroll
            for (int i = 0; i < T::otw; i++) {
                orow[i * 8] = o[wr][i][2 * rr] * ofac;
                orow[i * 8 + 1] = o[wr][i][2 * rr + 1] * ofac;
            }
        }
        if (wv == 0) { /* WIDE HEADS: both column groups hold the same m and l */
            sL[(wn * T::rows_pad + R) * 4 + tq] = l[wr][rr]; /* the four lane-partial sums of the row */
            if (tq == 0) sM[wn * T::rows_pad + R] = m[wr][rr];
        }
    }
    __syncthreads();
    const int out_vec = attn_out_vec<T>(p);
    for (int u = tid; u < w.nrows * T::ot; u += T::threads) {
        const int R = u / T::ot, c = u - R * T::ot;
        float M = attn_neg_inf();
#pragma unroll
        for (int k = 0; k < T::warps_n; k++) M = fmaxf(M, sM[k * T::rows_pad + R]);
        const float Mb = attn_merge_base(M);
        float L = 0.0f, f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < T::warps_n; k++) { /* a slice that saw no key has m = -inf: weight 0 */
            const float sc = T::warps_n == 1 ? 1.0f : attn_merge_weight(sM[k * T::rows_pad + R], Mb);
            const float *orow = sO + (k * T::rows_pad + R) * T::o_pitch + c * 8;
            const float *lp = sL + (k * T::rows_pad + R) * 4;
            L += sc * ((lp[0] + lp[1]) + (lp[2] + lp[3]));
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] += sc * orow[i];
        }
        attn_store_row8<T>(p, w.q_start + w.tok0, kv_head, slot, R, c, f, M, L, out_vec);
    }
    if constexpr (T::fused_merge) {
        /* FUSED MERGE: the last split of a merge entry to finish merges it */
        const int mi = w.merge_index;
        if (slot >= 0 && mi >= 0 && p.merge_count) {
            __shared__ int attn_last_split;
            __threadfence(); /* this CTA's partial is visible device-wide before it is counted */
            __syncthreads();
            if (tid == 0) attn_last_split = atomicAdd(p.merge_count + mi, 1) == p.merge[8 * (attn_i64)mi + 5] - 1;
            __syncthreads();
            if (attn_last_split) {
                __threadfence(); /* the other splits' partials, counted before, are read after */
                attn_merge_entry<T>(p, mi, tid, T::threads);
                if (tid == 0) p.merge_count[mi] = 0;
            }
        }
    }
}

/* PERSISTENT 1 (the decode shapes): items blockIdx.x, + gridDim.x, ...: an eager launch has
   one CTA per item, a captured one (the capacity's items) at most one wave of CTAs, which
   loop (LAUNCH). The barrier between items: the next item's Q and K/V stages reuse shared
   memory the epilogue still reads. PERSISTENT 0 (prefill: the loop costs the two-row-tile
   variants registers they do not have): one item per CTA, CTAs past *num_work exit. */
extern "C" __global__ void __launch_bounds__(attn_pt::threads, attn_pt::min_ctas) attn_paged_attention(const attn__paged_params p) {
    if (blockDim.x != attn_pt::threads || attn_dynamic_smem_size() < attn_paged_smem<attn_pt>::bytes) attn_trap();
    if constexpr (PERSISTENT) {
        const int n = *p.num_work;
        for (int item = blockIdx.x; item < n; item += gridDim.x) {
            if (item != (int)blockIdx.x) __syncthreads();
            attn_paged_attention_item<attn_pt>(p, item);
        }
    } else if ((int)blockIdx.x < *p.num_work) {
        attn_paged_attention_item<attn_pt>(p, blockIdx.x);
    }
}

/* Second stage of split-KV as its own launch: one CTA per merge entry. (128, 8): registers
   up to 64 — with (128) alone ptxas held sm_90 to 32 and spilled once the sink joined the
   store.) */
extern "C" __global__ void __launch_bounds__(128, 8) attn_paged_merge_partials(const attn__paged_params p) {
    if ((int)blockIdx.x >= *p.num_merge) return;
    attn_merge_entry<attn_pt>(p, blockIdx.x, threadIdx.x, blockDim.x);
}
