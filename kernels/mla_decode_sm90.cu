/* mla_decode_sm90.cu - MLA absorbed decode on Hopper, sm_90a: warpgroup MMA (wgmma) fed
   through the tensor memory accelerator (TMA) in FlashMLA's "seesaw" schedule; the
   CUDA_MLA_SM90 backend's forward_mqa (and the decode half of its fused attn_mla_forward).
   Checked on an H200 against float64 by tests/cuda_kernels.c --mla (random decode batches,
   splits, block sizes 16..128, a cache whose unread rows are NaN) and through the backend
   by the CUDA MLA suite.

   WHAT IT COMPUTES, WORK LIST, SPLITS, params, merge: exactly kernels/mla_decode.cu's (the
   mma.sync form, sm_80+, the CUDA_MLA backend's; same attn__mla_decode_params, same work
   items, same partial layout with ROWS = 64), for 16-bit latents only, and every split
   entry is merged by attn_mla_merge (its own launch; no fused merge).
   Work item (8 int32): {req, head0, q_row, -, key0, key1, slot, -}: the 64 heads head0 ..
   head0 + 63 (those below num_heads) of query row q_row over keys [key0, key1); slot -1
   writes out/lse, slot >= 0 a normalised f32 partial (partial_o[slot][64][KV_LORA],
   partial_lse[slot][64] base 2). Merge entry: {q_row, head0, splits, first slot, ...}.
   attn_mla_merge, grid (entries, 64), block 256: one CTA per row.

   LAUNCH: attn_mla_decode(kv_map, params): the cache's tensor map first (attn.h:
   attn__cuda_mla_map, encoded on the host at each forward), 3-D {KV_LORA + ROPE,
   BLOCK_SIZE, blocks}, box {64 columns, BOX_ROWS keys, 1 block} (attn_mla_config's
   tma_box_rows), 128-byte swizzle; grid >= *num_work, 256 threads, attn_mla_config's
   dynamic shared memory. SPARSE: the same map with box rows 1, grid (tokens, head tiles,
   splits); SPARSE_TMA 0: attn_mla_decode(params) alone (tma_box_rows 0).

   =====================================================================================
   INSIDE A CTA
   =====================================================================================
   256 threads: two warpgroups C0 and C1, 64 query rows (heads head0 .. head0 + 63 of one
   token: one wgmma M). Shared memory, 1024-aligned, 128B-swizzled:
       [Q: 64 x D][slot 0: 64 keys x D][slot 1: 64 keys x D][4 mbarriers][m: 2 x 64 f32][l: 2 x 64 f32]
   = 216 KiB + 1.1 KiB + 1 KiB slack at D = 576 (KV_LORA 512), 120 KiB at D = 320.
   A slot is D / 64 panels of 64 keys x 64 columns (8 KiB). Keys are taken two 64-key tiles
   at a time (a pair): tile 2i in slot 0, tile 2i + 1 in slot 1. The output O = [O_L | O_R]
   (64 x KV_LORA f32) is split by columns: C0 holds O_L, C1 holds O_R (128 registers each at
   KV_LORA 512).

   Per pair (FlashMLA's seesaw: one O, the two halves of V, S of one tile each):
     C0: S0 = Q K0^T (wgmma m64n64, all D) -> row max -> m0 = max(m, max S0) to shared memory
         [M0] -> P0 = 2^(S0 - m0) into slot 0's rope panel [P0] -> O_L = a0 O_L + P0 V0_L
         -> [M1] -> O_L = a1 O_L + P1 V1_L
     C1: S1 = Q K1^T -> row max -> [M0] m1 = max(m0, max S1) [M1] -> P1 into slot 1's rope
         panel [P1] -> [P0] O_R = a0 O_R + P0 V0_R -> O_R = a1 O_R + P1 V1_R
   [X] are one-way named barriers (bar.arrive by the writer, bar.sync by the reader; what the
   writer put in shared memory is published by them). C0's softmax runs under C1's S, C1's
   under C0's P V. A P V takes P as register fragments: a warpgroup's own P from its S
   accumulators, the other's read from the rope panel (ld.shared). Both warpgroups run the
   same wgmma instructions with operands chosen by value: a wgmma under a branch on the
   warpgroup makes ptxas serialize all of them (C7520).
   The rope panel (64 columns) of a slot is read only by its tile's S, so after that S the
   tile's P (64 x 64 16-bit, 8 KiB) is written over it: the P buffers cost no memory.

   Loads (TMA, completing on a full mbarrier per group; no producer warp): each slot is two
   groups, refilled with the next pair's tile by the warpgroup that reads the group last, as
   soon as it is done with it (a warpgroup barrier, then one thread issues the boxes):
       slot 0: A0 = panels [0, NL/2)          C0 refills it after O_L += P0 V0_L
               B0 = panels [NL/2, D/64)       C1 refills it after O_R += P0 V0_R (P0 read)
       slot 1: A1 = panels [0, NL/2) + rope   C0 refills it after O_L += P1 V1_L (P1 read)
               B1 = panels [NL/2, NL)         C1 refills it after O_R += P1 V1_R
   (NL = KV_LORA / 64.) The other warpgroup's reads of a group are done before the refill:
   C0's S0 reads B0 before [M0], which C1 waited for; C1's S1 reads A1 before [M1]. S waits
   for each group's full barrier before its panels, so it starts when the first half has
   landed. Boxes hold keys of one block: BOX_ROWS = 64 where BLOCK_SIZE is a multiple of 64,
   BLOCK_SIZE where it divides 64, 16 otherwise (BLOCK_SIZE is a multiple of 16). Boxes with no key in [key0, key1) are not loaded (their
   rows keep stale bytes); a tile that reaches past [key0, key1) (an edge tile, or the
   missing second tile of an odd count) has its V rows outside the range zeroed by the
   warpgroup that owns the slot, before any P V reads them (0 x a stale NaN would be NaN);
   the scores of those keys are masked to -inf.

   Epilogue: row sums of both warpgroups through shared memory; O / l out (or the
   normalised f32 partial); lse by C0.

   =====================================================================================
   SPARSE 1: DeepSeek-V3.2's sparse MLA (attn_mla_forward_sparse), 16-bit latents
   =====================================================================================
   The grid, keys, splits, slots and sinks of kernels/mla_decode.cu's SPARSE (CTA (t, y, z):
   heads 64 y .. of batch token t over entries [z c, z c + c) of its indices row, an entry
   naming a position of the token's request, -1 or out of [0, seq_len) skipped; one split
   writes out/lse with the sink joined, more write slot (t gridDim.y + y) splits + z for
   attn_mla_merge), on the seesaw above. The "keys" of a tile are 64 entries. A tensor map
   cannot gather rows by index on sm_90, so each row comes in one-row boxes (box rows 1 of
   LAUNCH's map, at (column 64 c, the position's row in its block, its block)), one per panel
   of the group: thread u of the warpgroup that would have issued the group's boxes issues
   row u / 2's panels i with i % 2 = u % 2, its issuer expects the group's 64 x panels x 128
   bytes. The swizzle follows the shared address (a row lands at row r of a 1024-aligned
   panel as a 64-row box would put it). An entry that names no row loads block -1: outside
   the map, so TMA fills zeros (its V row is 0) and still counts the bytes; its score is
   masked. A row's box coordinates take two dependent loads, both made during the pair
   before its copies: the entry at the top of the pair, its block-table row under the S
   wgmma. The S owner's mask is a ballot of its tile's entries, loaded a pair ahead.
   SPARSE_CLUSTER (the host's choice, where the head tiles are even: 128 heads and more): the
   launch pairs head tiles 2k and 2k + 1 of a token in a cluster of 2. Each CTA issues the
   boxes of the rows of its parity only, multicast into both CTAs' slots (the same offsets;
   each CTA's full barrier counts the bytes that land in it, from either), so each gathers
   half the rows. A slot is then written by the peer too, so a refill first meets the
   peer's: the refilling warpgroup's issuer arrives on the group's empty barrier in both
   CTAs (count 2) and the warpgroup waits on its own (parity of the pair) before its boxes.
   A cluster barrier follows the barriers' init and ends the kernel.
   SPARSE_TMA 0 copies by cp.async instead (16-byte pieces into the swizzled slots, one
   cp.async arrival per thread on the group's barrier, a proxy fence after each wait):
   correct, but held to ~10 GB/s an SM by the cp.async in flight (docs/PERF.md). */
#include "wgmma.cuh"
#include "hopper.cuh"
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
#if BLOCK_SIZE % 16 || BLOCK_SIZE <= 0
#error "mla_decode_sm90.cu: BLOCK_SIZE must be a positive multiple of 16"
#endif
#ifdef ROWS
#error "mla_decode_sm90.cu: ROWS is always 64 (one wgmma M); do not define it"
#endif
#define ROWS 64
#include "mla_merge.cuh" /* attn_mla_merge_kernel */
#if defined(FUSED_MERGE) && FUSED_MERGE
#error "mla_decode_sm90.cu: no fused merge (attn_mla_merge merges every split)"
#endif
#ifndef EVICT_FIRST
#define EVICT_FIRST 1 /* tuning: the latent tiles are loaded with an L2 evict-first policy (0: the default
                         policy; 1 measured 0-5 % faster on the H200, docs/PERF.md) */
#endif
#ifndef SPARSE
#define SPARSE 0 /* 1: the index-gathered decode (SPARSE 1 above); no tensor map */
#endif
#ifndef SPARSE_TMA
#define SPARSE_TMA 1 /* SPARSE: 1 each row's panels by TMA (one-row boxes, the map of LAUNCH with box
                        rows 1); 0 by cp.async (16-byte pieces); 2 half of each by either (H200,
                        128 heads, batch 128: 245 / 166 / 220 TFLOP/s, docs/PERF.md) */
#endif
#define ATTN_MLA_MAPPED (!SPARSE || SPARSE_TMA) /* the kernel takes the cache's tensor map */
#ifndef SPARSE_L2_AHEAD
#define SPARSE_L2_AHEAD 0 /* SPARSE tuning: 1 C0 prefetches the rows of the pair after next into L2 (one
                             bulk prefetch a row; H200: 242 -> 223 TFLOP/s, docs/PERF.md) */
#endif
#ifndef SPARSE_FENCE
#define SPARSE_FENCE 1 /* 1: a reader of gathered bytes issues the proxy fence after its wait */
#endif
#ifndef SPARSE_PROBE
#define SPARSE_PROBE 0 /* diagnosis only, wrong results: 1 gathers rows 0..63 of the cache for every tile
                          (contiguous), 2 copies nothing (arrives at once) */
#endif
#ifndef SPLIT_WAIT
#define SPLIT_WAIT 1 /* tuning: 1 S starts on a slot's first group and waits for the second halfway;
                        0 S waits for both first */
#endif

struct attn_mla_seesaw {
    static constexpr int d = KV_LORA + ROPE, np = d / 64, nl = KV_LORA / 64, nh = nl / 2;
    static constexpr int cw = KV_LORA / 2, o_regs = cw / 2;  /* columns of O per warpgroup, its registers */
    static constexpr int rope = nl;                          /* the rope panel: P after S */
    static constexpr int panel = 64 * 128;                   /* 64 rows x 64 columns, 8 KiB */
    static constexpr int box_rows = BLOCK_SIZE % 64 == 0 ? 64 : 64 % BLOCK_SIZE == 0 ? BLOCK_SIZE : 16;
    static constexpr int pieces = 64 / box_rows;             /* boxes per tile and panel */
    static constexpr int slot_bytes = np * panel;
    static constexpr int q_off = 0, slot_off = np * panel, bar_off = slot_off + 2 * slot_bytes;
    static constexpr int m_off = bar_off + 64, l_off = m_off + 2 * 64 * 4; /* 4 full, 4 empty barriers */
    static constexpr int smem_bytes = l_off + 2 * 64 * 4 + 1024; /* + the slack that aligns the base */
    static constexpr int threads = 256;
    static_assert(smem_bytes <= 227 * 1024, "mla_decode_sm90.cu: shared memory over 227 KiB");
};
typedef attn_mla_seesaw MW;

/* named barriers (id 0 is __syncthreads): 1 both warpgroups; 2..5 the one-way signals M0,
   M1, P0, P1 (C0 -> C1, C1 -> C0, C0 -> C1, C1 -> C0); 6, 7 one warpgroup */
#define ATTN_NB_BOTH 1
#define ATTN_NB_M0 2
#define ATTN_NB_M1 3
#define ATTN_NB_P0 4
#define ATTN_NB_P1 5
#define ATTN_NB_WG 6

extern "C" __constant__ attn__launch_config attn_mla_config = {MW::threads, MW::smem_bytes, 64, ROWS, 1, 2, 8, 1,
                                                                SPARSE ? (SPARSE_TMA ? 1 : 0) : MW::box_rows};

/* group g (0 A0, 1 B0, 2 A1, 3 B1): its panels (A1 carries slot 1's rope panel) */
ATTN_DEV constexpr int attn_mla_seesaw_group_count(int g) {
    return g == 0 ? MW::nh : g == 1 ? MW::np - MW::nh : g == 2 ? MW::nh + 1 : MW::nl - MW::nh;
}
ATTN_DEV constexpr int attn_mla_seesaw_group_panel(int g, int i) {
    return g == 0 ? i : g == 1 ? MW::nh + i : g == 2 ? (i < MW::nh ? i : MW::rope) : MW::nh + i;
}

/* The boxes of group g of tile t (keys kt .. kt + 63) that hold a key in [key0, key1), into
   slot `dst`, completing on `bar`; blk[j]: the block of piece j (read before). One thread. */
ATTN_DEV void attn_mla_seesaw_fill(const attn_tma_map *map, int g, attn_u32 dst, attn_u32 bar, int kt, int key0, int key1,
                               const int (&blk)[MW::pieces], int valid) {
    int nb = 0;
#pragma unroll
    for (int j = 0; j < MW::pieces; j++) nb += valid && kt + (j + 1) * MW::box_rows > key0 && kt + j * MW::box_rows < key1;
    attn_mbar_arrive_expect_tx(bar, (unsigned)(nb * attn_mla_seesaw_group_count(g) * MW::box_rows * 128));
#pragma unroll
    for (int j = 0; j < MW::pieces; j++) {
        const int k = kt + j * MW::box_rows;
        if (!(valid && k + MW::box_rows > key0 && k < key1)) continue;
        const int row = (int)((unsigned)k % BLOCK_SIZE);
#pragma unroll
        for (int i = 0; i < attn_mla_seesaw_group_count(g); i++) {
            const int c = attn_mla_seesaw_group_panel(g, i);
            if (EVICT_FIRST)
                attn_tma_load_3d_hint(dst + (attn_u32)(c * MW::panel + j * MW::box_rows * 128), map, 64 * c, row, blk[j], bar,
                                      attn_l2_evict_first_policy());
            else
                attn_tma_load_3d(dst + (attn_u32)(c * MW::panel + j * MW::box_rows * 128), map, 64 * c, row, blk[j], bar);
        }
    }
}

/* the blocks of tile t's pieces (0 for pieces out of [key0, key1) or past the tiles) */
ATTN_DEV void attn_mla_seesaw_blocks(int (&blk)[MW::pieces], const int *bt, int kt, int key0, int key1) {
#pragma unroll
    for (int j = 0; j < MW::pieces; j++) {
        const int k = kt + j * MW::box_rows;
        blk[j] = k + MW::box_rows > key0 && k < key1 ? bt[(unsigned)k / BLOCK_SIZE] : 0;
    }
}

/* P (64 x 64, 16-bit, K-major swizzled at `panel`) as this thread's A fragments of the four
   k16 steps (wgmma.cuh's A layout: rows row_a, row_a + 8; columns 16 j + 2 tq (+8)) */
ATTN_DEV void attn_mla_seesaw_load_p(attn_u32 (&pf)[4][4], const char *panel, int row_a, int tq) {
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int row = row_a + 8 * (x & 1), col = 16 * j + 2 * tq + 8 * (x >> 1);
            pf[j][x] = *(const attn_u32 *)(panel + attn_wgmma_swizzle_offset<64>(row, col >> 3) + (col & 7) * 2);
        }
}

#if !ATTN_MLA_MAPPED
extern "C" __global__ void __launch_bounds__(MW::threads, 1) attn_mla_decode(const attn__mla_decode_params p) {
#else
extern "C" __global__ void __launch_bounds__(MW::threads, 1)
    attn_mla_decode(const __grid_constant__ attn_tma_map kv_map, const attn__mla_decode_params p) {
#endif
    extern __shared__ attn_vec16 attn_smem[];
    if (blockDim.x != MW::threads || attn_dynamic_smem_size() < MW::smem_bytes) attn_trap();
    if ((int)blockIdx.x >= *p.num_work) return;
#if SPARSE
    const int nsplit = p.num_work[1], z = (int)blockIdx.z; /* the build's splits of each token's entries */
    if (z >= nsplit) return;
    const int chunk = (p.topk + nsplit - 1) / nsplit;
    const int q_row = (int)blockIdx.x, head0 = (int)blockIdx.y * ROWS;
    const int key0 = attn_imin(p.topk, z * chunk), key1 = attn_imin(p.topk, key0 + chunk);
    const int slot = nsplit > 1 ? (q_row * (int)gridDim.y + (int)blockIdx.y) * nsplit + z : -1;
    const int req = __ldg(p.token_req + q_row), seq_len = __ldg(p.seq_lens + req);
    const int *const ix = p.indices + (attn_i64)q_row * p.indices_stride;
#else
    const int *item = p.work + 8 * (attn_i64)blockIdx.x;
    const int req = item[0], head0 = item[1], q_row = item[2], slot = item[6];
    const int key0 = item[4], key1 = item[5];
#endif
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
    const int g = lane >> 2, tq = lane & 3;
    const int c1 = __all_sync(0xffffffffu, wg == 1); /* wg, as a value ptxas knows is warp-uniform */
    const int issuer = (tid & 127) == 0;            /* the thread of each warpgroup that issues its refills */
#if SPARSE && SPARSE_TMA == 1
    /* a cluster of 2 (the host's launch, 128 heads and more): the CTAs of one token's two head
       tiles each gather half of every tile's rows, multicast into both (SPARSE_CLUSTER) */
    const unsigned ncl = attn_cluster_size(), crank = attn_cluster_rank();
#else
    const unsigned ncl = 1, crank = 0;
    (void)crank;
#endif
    const attn_u32 smem0 = attn_smem_addr(attn_smem);
    const attn_u32 base = (smem0 + 1023u) & ~1023u;
    char *const smem = (char *)attn_smem + (base - smem0);
    const attn_u32 sQ = base + MW::q_off, sS0 = base + MW::slot_off, sS1 = sS0 + MW::slot_bytes;
    const attn_u32 full = base + MW::bar_off; /* [4]: A0 B0 A1 B1 */
    const attn_u32 empty = full + 32;         /* [4]: in a cluster, the group's slot is free in both CTAs */
    float *const sM = (float *)(smem + MW::m_off); /* [2][64]: m after tile 2i (C0), after 2i + 1 (C1) */
    float *const sL = (float *)(smem + MW::l_off);
    const int *bt = p.block_table + (attn_i64)req * p.block_table_stride;
    const int tile0 = key1 > key0 ? key0 / 64 * 64 : 0;
    const int ntiles = key1 > key0 ? (key1 - tile0 + 63) / 64 : 0;
    const int npairs = (ntiles + 1) / 2;
    const int nrows = attn_imin(ROWS, p.num_heads - head0);
    const int row_a = 16 * (warp & 3) + g; /* this thread's accumulator rows: row_a, row_a + 8 */
#if SPARSE
    const int grow = (tid & 127) >> 1; /* the row of a tile this thread gathers */
    /* entry j's position in the request; -1 outside [key0, key1) or naming none */
    auto entry = [&](int j) -> int {
        const int x = j >= key0 && j < key1 ? __ldg(ix + j) : -1;
        return x >= 0 && x < seq_len ? x : -1;
    };
    /* where position x's cache row is: block << 32 | row in the block (block -1: none) */
    auto row_of = [&](int x) -> attn_i64 {
        return x < 0 ? (attn_i64)((attn_u64)0xffffffffu << 32)
                     : (attn_i64)(((attn_u64)(attn_u32)__ldg(bt + (unsigned)x / BLOCK_SIZE) << 32) | ((unsigned)x % BLOCK_SIZE));
    };
    /* the row of row_of's `at` in the cache (NULL: none) */
    auto row_ptr = [&](attn_i64 at) -> const char * {
        const int blk = (int)(at >> 32), row = (int)(at & 0xffffffff);
        return blk < 0 ? NULL : (const char *)p.kv_cache + ((attn_i64)blk * BLOCK_SIZE + row) * (MW::d * 2);
    };
    /* this thread's 16-byte chunks 2 k + tid % 2 of panels i = first, first + step, .. of group
       g of the row `src` (zeros for NULL) into `slot_at`, by cp.async */
    auto copy_panels = [&](int g, attn_u32 slot_at, const char *src, int first, int step) {
#pragma unroll
        for (int i = first; i < MW::nh + 1; i += step) {
            if (i >= attn_mla_seesaw_group_count(g)) break;
            const int c = attn_mla_seesaw_group_panel(g, i);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int ch = 2 * k + (tid & 1);
                attn_cp_async16_or_zero(slot_at + (attn_u32)(c * MW::panel) + attn_wgmma_swizzle_offset<64>(grow, ch),
                                        (src ? src : (const char *)p.kv_cache) + (64 * c + 8 * ch) * 2, !src);
            }
        }
    };
#if SPARSE_TMA
    /* this thread's share of group g of a tile into `slot_at`, on the group's full barrier:
       SPARSE_TMA 1, its row's panels i with i % 2 = tid % 2 as one-row boxes at (block, row)
       (block -1: outside the map, zeros; every box counts its bytes); 2, the even panels so
       (i % 4 = 2 (tid % 2)) and the odd ones by cp.async (chunks 2 k + tid % 2, zeros for
       block -1), then a cp.async arrival. Each thread arrives expecting its own boxes' bytes. */
    auto gather = [&](int g, attn_u32 slot_at, attn_i64 at) {
        const int blk = (int)(at >> 32), row = (int)(at & 0xffffffff), h = tid & 1;
        const attn_u32 bar = full + 8 * g;
        int mine = 0;
#pragma unroll
        for (int i = 0; i < MW::nh + 1; i++)
            mine += i < attn_mla_seesaw_group_count(g) && (SPARSE_TMA == 1 ? (i & 1) == h : (i & 3) == 2 * h);
        attn_mbar_arrive_expect_tx(bar, (unsigned)(mine * 128));
#pragma unroll
        for (int i = 0; i < MW::nh + 1; i++) {
            if (i >= attn_mla_seesaw_group_count(g)) break;
            if (SPARSE_TMA == 1 ? (i & 1) != h : (i & 3) != 2 * h) continue;
            const int c = attn_mla_seesaw_group_panel(g, i);
            if (ncl == 1)
                attn_tma_load_3d(slot_at + (attn_u32)(c * MW::panel + grow * 128), &kv_map, 64 * c, row, blk, bar);
            else if ((unsigned)(grow & 1) == crank) /* this CTA's half of the rows, into both */
                attn_tma_load_3d_multicast(slot_at + (attn_u32)(c * MW::panel + grow * 128), &kv_map, 64 * c, row, blk, bar,
                                           (unsigned short)3);
        }
#if SPARSE_TMA == 2
        copy_panels(g, slot_at, row_ptr(at), 1, 2);
        attn_cp_async_mbar_arrive(bar);
#endif
    };
#else
    /* this thread's share of group g of a tile into `slot_at` (its row, row_of's `at`,
       zeros for none), then its arrival on the group's full barrier once the copies land */
    auto gather = [&](int g, attn_u32 slot_at, attn_i64 at) {
        if (SPARSE_PROBE == 2) {
            attn_mbar_arrive(full + 8 * g);
            return;
        }
        copy_panels(g, slot_at, SPARSE_PROBE == 1 ? (const char *)p.kv_cache + grow * (MW::d * 2) : row_ptr(at), 0, 1);
        attn_cp_async_mbar_arrive(full + 8 * g);
    };
#endif
#endif

    if (tid == 0) {
        for (int i = 0; i < 4; i++) attn_mbar_init(full + 8 * i, !SPARSE ? 1 : SPARSE_TMA == 2 ? 256 : 128);
        if (ncl > 1)
            for (int i = 0; i < 4; i++) attn_mbar_init(empty + 8 * i, 2); /* the refilling warpgroups of both CTAs */
        attn_mbar_init_fence();
    }
    __syncthreads(); /* the barriers */
    if (ncl > 1) attn_cluster_sync(); /* the peer's too, before any multicast lands on them */
#if !SPARSE
    if (tid == 0 && npairs > 0) { /* pair 0, all four groups */
        int b0[MW::pieces], b1[MW::pieces];
        attn_tma_prefetch_map(&kv_map);
        attn_mla_seesaw_blocks(b0, bt, tile0, key0, key1);
        attn_mla_seesaw_blocks(b1, bt, tile0 + 64, key0, key1);
        attn_mla_seesaw_fill(&kv_map, 0, sS0, full + 0, tile0, key0, key1, b0, 1);
        attn_mla_seesaw_fill(&kv_map, 1, sS0, full + 8, tile0, key0, key1, b0, 1);
        attn_mla_seesaw_fill(&kv_map, 2, sS1, full + 16, tile0 + 64, key0, key1, b1, ntiles > 1);
        attn_mla_seesaw_fill(&kv_map, 3, sS1, full + 24, tile0 + 64, key0, key1, b1, ntiles > 1);
    }
#endif

    /* Q rows: [q_latent | q_pe], zero past num_heads */
    for (int c = tid; c < ROWS * (MW::d / 8); c += MW::threads) {
        const int r = c / (MW::d / 8), col = c - r * (MW::d / 8);
        const int valid = r < nrows;
        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,
                                                   p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col)
                                : (const char *)p.q;
        attn_cp_async16_or_zero(sQ + attn_wgmma_swizzle_offset<ROWS>(r, col), src, !valid);
    }
    attn_cp_async_commit();
#if SPARSE
    if (npairs > 0) { /* pair 0: C0 gathers A0 and A1, C1 B0 and B1 (not committed: Q's wait below is Q's alone) */
        gather(c1, sS0, row_of(entry(tile0 + grow)));
        gather(2 + c1, sS1, row_of(entry(tile0 + 64 + grow)));
    }
#endif
    attn_cp_async_wait<0>();
    attn_fence_proxy_async(); /* Q is read by wgmma (the async proxy) */
    __syncthreads();

    const float qk_scale = p.scale * ATTN_LOG2E;
    const attn_u32 mine = c1 ? sS1 : sS0; /* the slot of this warpgroup's S */
    const attn_u32 fullA = full + 16 * c1, fullB = fullA + 8;
    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};
    float o[MW::o_regs];
#pragma unroll
    for (int i = 0; i < MW::o_regs; i++) o[i] = 0.0f;
    attn_u32 pown[4][4], pf[4][4]; /* this warpgroup's P as A fragments; the P of the P V issued next */
#if !SPARSE
    int nblk = 0;                  /* a block of the pair the refills load (lane j: piece j % pieces of tile j / pieces) */
#endif
    /* pf = this warpgroup's own P */
    auto own_p = [&]() {
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int x = 0; x < 4; x++) pf[j][x] = pown[j][x];
    };
    /* O = a O + pf V over this warpgroup's half of the V in `slot_at`, issued and committed
       (both warpgroups run these same wgmma; the caller waits) */
    auto pv = [&](attn_u32 slot_at, const float (&a)[2]) {
        attn_wgmma_scale_rows(o, a[0], a[1]);
        attn_wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; j++)
            attn_wgmma<MW::cw, DT>::template rs<1>(o, pf[j], attn_wgmma_desc_mn_major<64>(slot_at + (attn_u32)(c1 * MW::nh * MW::panel), 16 * j), 1);
        attn_wgmma_commit();
    };
    /* the warpgroup is done with group g of `slot_at`: its issuer refills it with tile `ktile`
       of the next pair (blocks from lanes first .. first + pieces - 1) */
#if SPARSE
    auto refill = [&](int g, attn_u32 slot_at, attn_i64 off, int next, unsigned par) {
        attn_named_barrier(ATTN_NB_WG + wg, 128);
        if (!next) return;
        if (ncl > 1) { /* the peer writes this slot too: both CTAs' readers must be done with group g */
            if (issuer) {
                attn_mbar_arrive(empty + 8 * g);
                attn_mbar_arrive_remote(empty + 8 * g, crank ^ 1u);
            }
            attn_mbar_wait_cluster(empty + 8 * g, par);
        }
        gather(g, slot_at, off);
    };
    /* (every thread of the warpgroup issues its own copies; in a cluster the issuer arrives
       for the warpgroup on both CTAs' empty barriers) */
#else
    auto refill = [&](int g, attn_u32 slot_at, int first, int ktile, int valid, int next) {
        int blk[MW::pieces];
        attn_named_barrier(ATTN_NB_WG + wg, 128);
#pragma unroll
        for (int j = 0; j < MW::pieces; j++) blk[j] = __shfl_sync(0xffffffffu, nblk, first + j);
        if (issuer && next) attn_mla_seesaw_fill(&kv_map, g, slot_at, full + 8 * g, ktile, key0, key1, blk, valid);
    };
#endif

#if SPARSE
    int me0 = entry(tile0 + 64 * c1 + lane), me1 = entry(tile0 + 64 * c1 + 32 + lane); /* pair 0's mask entries */
    /* position x's cache row into L2, ahead of its boxes */
    auto prefetch_row = [&](int x) {
        if (x >= 0) attn_prefetch_l2_bulk(row_ptr(row_of(x)), (unsigned)(MW::d * 2));
    };
    if (SPARSE_L2_AHEAD && !c1 && npairs > 1) prefetch_row(entry(tile0 + 128 + 64 * (tid & 1) + grow)); /* pair 1's rows */
#endif
    for (int pr = 0; pr < npairs; pr++) {
        const unsigned ph = (unsigned)(pr & 1);
        const int kt = tile0 + 64 * (2 * pr + c1); /* this warpgroup's tile */
        const int next = pr + 1 < npairs, kn = tile0 + 128 * (pr + 1);
#if SPARSE
        /* the next pair's positions of this thread's rows (their cache rows are looked up under
           the S wgmma), and which of this warpgroup's tile's entries name a row */
        int xa = -1, xb = -1, xp = -1; /* xp: C0's row of the pair after next (tile A for even tid, B for odd) */
        if (SPARSE_L2_AHEAD && !c1 && pr + 2 < npairs) xp = entry(tile0 + 128 * (pr + 2) + 64 * (tid & 1) + grow);
        if (next) {
            xa = entry(kn + grow);
            xb = entry(kn + 64 + grow);
        }
        const unsigned vm0 = __ballot_sync(0xffffffffu, me0 >= 0), vm1 = __ballot_sync(0xffffffffu, me1 >= 0);
        if (next) { /* the entries of this warpgroup's tile of the next pair, for its mask */
            me0 = entry(kt + 128 + lane);
            me1 = entry(kt + 160 + lane);
        }
#else
        /* the next pair's blocks, read now, handed to the issuer with shuffles when it refills */
        nblk = 0;
        if (next && lane < 2 * MW::pieces) {
            const int k = kn + 64 * (lane / MW::pieces) + (lane % MW::pieces) * MW::box_rows;
            if (k + MW::box_rows > key0 && k < key1) nblk = bt[(unsigned)k / BLOCK_SIZE];
        }
#endif

        /* ---- S = Q K^T over this warpgroup's tile. The same order for both: panels 0 .. nh-1
           (A0 / A1), nh .. nl-1 (B0 / B1), then the rope panel (in B0 for C0, A1 for C1: waited
           for by then either way) ---- */
        float s[32];
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] = 0.0f;
        /* the shared addresses of Q and the slot, opaque to the compiler here: otherwise it
           hoists all 72 loop-invariant descriptors out of the pair loop (144 registers) */
        attn_u32 q_at, k_at;
        asm volatile("mov.b32 %0, %1;" : "=r"(q_at) : "r"(sQ));
        asm volatile("mov.b32 %0, %1;" : "=r"(k_at) : "r"(mine));
        attn_mbar_wait(fullA, ph);
        if (!SPLIT_WAIT) attn_mbar_wait(fullB, ph);
        if (SPARSE && SPARSE_TMA != 1 && SPARSE_FENCE) attn_fence_proxy_async(); /* the gathered bytes, to wgmma */
        attn_wgmma_fence();
#pragma unroll
        for (int c = 0; c < MW::nh; c++)
#pragma unroll
            for (int k = 0; k < 64; k += 16)
                attn_wgmma<64, DT>::template ss<0>(s, attn_wgmma_desc_k_major<ROWS>(q_at, 64 * c + k),
                                                   attn_wgmma_desc_k_major<64>(k_at, 64 * c + k), 1);
        if (SPLIT_WAIT) {
            attn_mbar_wait(fullB, ph);
            if (SPARSE && SPARSE_TMA != 1 && SPARSE_FENCE) attn_fence_proxy_async();
            attn_wgmma_fence(); /* after a branch among the wgmma: ptxas would put one here itself (C7519) */
        }
#pragma unroll
        for (int c = MW::nh; c < MW::np; c++)
#pragma unroll
            for (int k = 0; k < 64; k += 16)
                attn_wgmma<64, DT>::template ss<0>(s, attn_wgmma_desc_k_major<ROWS>(q_at, 64 * c + k),
                                                   attn_wgmma_desc_k_major<64>(k_at, 64 * c + k), 1);
        attn_wgmma_commit();
#if SPARSE
        const attn_i64 offa = row_of(xa), offb = row_of(xb); /* under the S wgmma */
        if (SPARSE_L2_AHEAD) prefetch_row(xp);
#endif
        attn_wgmma_wait<0>();
        attn_wgmma_fence_acc(s);

        /* ---- mask to [key0, key1); the tile's row maxima; m0 (C0 -> C1), m1 (C1 -> C0) ---- */
        float mx[2] = {attn_neg_inf(), attn_neg_inf()};
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = 8 * i + 2 * tq + (e & 1);
#if SPARSE
                const int seen = (int)(((j < 32 ? vm0 : vm1) >> (j & 31)) & 1u);
#else
                const int seen = kt + j >= key0 && kt + j < key1;
#endif
                const float x = seen ? s[4 * i + e] : attn_neg_inf();
                s[4 * i + e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float alpha0[2], alpha1[2] = {1.0f, 1.0f}, b[2];
#pragma unroll
        for (int h = 0; h < 2; h++) mx[h] = attn_quad_max(mx[h]) * qk_scale;
        if (!c1) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                b[h] = attn_softmax_rebase(m[h], mx[h], alpha0[h]);
                if (tq == 0) sM[row_a + 8 * h] = m[h];
            }
            attn_named_barrier_arrive(ATTN_NB_M0, MW::threads);
        } else {
            attn_named_barrier(ATTN_NB_M0, MW::threads);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                attn_softmax_rebase(m[h], sM[row_a + 8 * h], alpha0[h]);
                b[h] = attn_softmax_rebase(m[h], mx[h], alpha1[h]);
                if (tq == 0) sM[64 + row_a + 8 * h] = m[h];
            }
            attn_named_barrier_arrive(ATTN_NB_M1, MW::threads);
        }

        /* ---- P = 2^(S - base) into the rope panel; this warpgroup's row sums ---- */
        char *const my_p = smem + (mine - base) + MW::rope * MW::panel;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float p0 = attn_exp2(fmaf(s[4 * i + 2 * h], qk_scale, -b[h]));
                const float p1 = attn_exp2(fmaf(s[4 * i + 2 * h + 1], qk_scale, -b[h]));
                s[4 * i + 2 * h] = p0;
                s[4 * i + 2 * h + 1] = p1;
                sum += p0 + p1;
                const int col = 8 * i + 2 * tq, row = row_a + 8 * h;
                *(attn_u32 *)(my_p + attn_wgmma_swizzle_offset<64>(row, col >> 3) + (col & 7) * 2) = attn_elem<DT>::pack2(p0, p1);
            }
            l[h] = l[h] * alpha0[h] * alpha1[h] + sum; /* C0: alpha1 comes with [M1], below */
        }
#pragma unroll
        for (int j = 0; j < 4; j++) attn_wgmma_a_from_acc<DT>(pown[j], s, j); /* the S registers are free after this */
        if (!SPARSE && (kt < key0 || kt + 64 > key1)) { /* an edge tile: zero the V rows of keys outside [key0, key1) */
            for (int u = tid & 127; u < 64 * MW::nl * 8; u += 128) {
                const int r = u / (MW::nl * 8), ch = u - r * (MW::nl * 8), k = kt + r;
                if (k < key0 || k >= key1) {
                    const attn_vec16 zero = {0u, 0u, 0u, 0u};
                    *(attn_vec16 *)(smem + (mine - base) + attn_wgmma_swizzle_offset<64>(r, ch)) = zero;
                }
            }
        }
        attn_fence_proxy_async();                     /* zeroed rows are read by wgmma */
        attn_named_barrier(ATTN_NB_WG + wg, 128);     /* this warpgroup's P and zeroed rows are whole */
        attn_named_barrier_arrive(c1 ? ATTN_NB_P1 : ATTN_NB_P0, MW::threads);

        /* ---- O = a0 O + P0 V0 (this warpgroup's half of V0): C0's P0 from its S, C1's read ---- */
        if (!c1) {
            own_p();
        } else {
            attn_named_barrier(ATTN_NB_P0, MW::threads);
            attn_mbar_wait(full + 8, ph); /* B0 (complete: C0 waited for it; the acquire for this warpgroup) */
            if (SPARSE && SPARSE_TMA != 1 && SPARSE_FENCE) attn_fence_proxy_async();
            attn_mla_seesaw_load_p(pf, smem + (sS0 - base) + MW::rope * MW::panel, row_a, tq);
        }
        pv(sS0, alpha0);
        if (!c1) { /* m1 from C1 */
            attn_named_barrier(ATTN_NB_M1, MW::threads);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                attn_softmax_rebase(m[h], sM[64 + row_a + 8 * h], alpha1[h]);
                l[h] *= alpha1[h];
            }
        }
        attn_wgmma_wait<0>();
        attn_wgmma_fence_acc(o);
#if SPARSE
        refill(c1, sS0, offa, next, ph);
#else
        refill(c1, sS0, 0, kn, 1, next); /* slot 0's A0 (C0) / B0 (C1) */
#endif

        /* ---- O = a1 O + P1 V1: C1's P1 from its S, C0's read ---- */
        if (!c1) {
            attn_named_barrier(ATTN_NB_P1, MW::threads);
            attn_mbar_wait(full + 16, ph); /* A1 (complete: C1 waited for it) */
            if (SPARSE && SPARSE_TMA != 1 && SPARSE_FENCE) attn_fence_proxy_async();
            attn_mla_seesaw_load_p(pf, smem + (sS1 - base) + MW::rope * MW::panel, row_a, tq);
        } else {
            own_p();
        }
        pv(sS1, alpha1);
        attn_wgmma_wait<0>();
        attn_wgmma_fence_acc(o);
#if SPARSE
        refill(2 + c1, sS1, offb, next, ph);
#else
        refill(2 + c1, sS1, MW::pieces, kn + 64, 2 * (pr + 1) + 1 < ntiles, next); /* slot 1's A1 (C0, P1 read) / B1 (C1) */
#endif
    }

    /* ---- epilogue: L = both warpgroups' sums; O / L ---- */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float lq = attn_quad_sum(l[h]);
        if (tq == 0) sL[wg * 64 + row_a + 8 * h] = lq;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = row_a + 8 * h;
        const float L = sL[row] + sL[64 + row];
        const float lse2 = attn_softmax_lse2(m[h], L); /* a split's partial: base 2, no sink */
        float lse = lse2 * ATTN_LN2, wsink = 1.0f;
#if SPARSE
        if (p.sinks && slot < 0 && row < nrows) /* the head's sink, once, where the row is finished */
            wsink = attn_softmax_sink(__ldg(p.sinks + head0 + row), lse);
#endif
        const float inv = L > 0.0f ? wsink * attn_rcp(L) : 0.0f;
        if (row >= nrows) continue;
        if (slot < 0) {
            char *orow = (char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head) * 2;
#pragma unroll
            for (int i = 0; i < MW::o_regs / 4; i++)
                *(attn_u32 *)(orow + (wg * MW::cw + 8 * i + 2 * tq) * 2) =
                    attn_elem<DT>::pack2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
            if (p.lse && wg == 0 && tq == 0)
                p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] = lse;
        } else {
            float *po = p.partial_o + ((attn_i64)slot * ROWS + row) * KV_LORA + wg * MW::cw;
#pragma unroll
            for (int i = 0; i < MW::o_regs / 4; i++)
                *(float2 *)(po + 8 * i + 2 * tq) = make_float2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
            if (wg == 0 && tq == 0) p.partial_lse[(attn_i64)slot * ROWS + row] = lse2;
        }
    }
    if (ncl > 1) attn_cluster_sync(); /* no CTA leaves while its peer may still write to it */
}

/* The merge as its own launch (mla_merge.cuh): grid (entries, 64), one CTA per row. */
extern "C" __global__ void __launch_bounds__(ATTN_MLA_MERGE_THREADS) attn_mla_merge(const attn__mla_decode_params p) {
    attn_mla_merge_kernel(p);
}
