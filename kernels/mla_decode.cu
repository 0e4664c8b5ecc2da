/* mla_decode.cu - MLA absorbed decode (MQA over the latent cache) on mma.sync (sm_80+): the
   CUDA_MLA backend's forward_mqa (and the decode half of its fused attn_mla_forward).

   Checked on an H200 (2026-12-02): `./build/cuda_kernels --mla` against a float64
   reference and `./build/attn_tests cuda` (GPU worlds forced onto CUDA_MLA) passed,
   compute-sanitizer memcheck and racecheck clean; figures in docs/PERF.md. `make test`
   compiles its variants (no GPU).

   =====================================================================================
   WHAT IT COMPUTES (attn_mla_forward_mqa of the CPU_MLA backend)
   =====================================================================================
   Latent cache [num_blocks, BLOCK_SIZE, D] of DT (f16 or bf16), D = KV_LORA + ROPE (576 =
   512 + 64, or 320 = 256 + 64); a row is [kv_c | k_pe]. One query row per (decode token,
   head): [q_latent (KV_LORA) | q_pe (ROPE)] from two tensors. For the token's visible keys
   j in [0, key_end): s_j = q . row_j * scale; out = sum_j softmax(s)_j row_j[0 .. KV_LORA)
   (the value is the kv_c part of the same row); lse = log sum_j exp(s_j) (base e). Out
   rounded to DT. A row that sees no key: out 0, lse -inf.

   =====================================================================================
   WORK LIST AND SPLITS
   =====================================================================================
   Work item (8 int32): {req, head0, q_row, -, key0, key1, slot, -}: the ROWS heads head0 ..
   head0 + ROWS - 1 (those below num_heads) of the query row q_row (an index into q, q_pe,
   out, lse) of request req, over keys [key0, key1) (one split of its visible range).
   slot -1: the item writes out and lse; slot >= 0: it writes its normalised partial to
   partial_o[slot][ROWS][KV_LORA] (f32) and its lse (base 2) to partial_lse[slot][ROWS],
   and attn_mla_merge combines them. Merge entry (8 int32): {q_row, head0, splits,
   first slot, -, -, -, -}: slots first .. first + splits - 1.

   =====================================================================================
   LAUNCH
   =====================================================================================
   attn_mla_decode: grid >= *num_work, block WARPS * 32, dynamic shared memory
   attn_mla_config.shared_bytes; CTAs past *num_work exit. attn_mla_merge: grid (>= *num_merge,
   ROWS), block 256, static shared memory only. attn_mla_config (extern "C" __constant__
   attn__launch_config): {threads, dynamic shared bytes, KV_TILE, ROWS, 1, KV_STAGES, WARPS, 1}.

   =====================================================================================
   INSIDE A CTA
   =====================================================================================
   ROWS = 16 * RT query rows (heads of one token), WARPS warps. Shared memory:
       [Q: ROWS x PITCH][K: KV_STAGES x KV_TILE x PITCH][P: ROWS x (KV_TILE + 8) DT]
       [row maxima: S_KG x ROWS f32][block offsets: KV_STAGES x KV_TILE int64]
   with PITCH = D + 8 elements (rows 16 bytes past the data: conflict-free ldmatrix).
   Per tile of KV_TILE keys (cp.async ring of KV_STAGES):
     S phase   warp w = (row group rg, key group kg) of S_RG x S_KG: S for its RT_S row
               tiles x KW keys (m16n8k16, Q and K fragments by ldmatrix), keys outside
               [key0, key1) -> -inf; its rows' maxima over its keys -> shared memory.
     barrier   every key group's maxima are in.
     softmax   every thread derives the new row max of its rows from the S_KG partial
               maxima (identically in every warp), p = 2^(s*scale*log2e - m) -> P (DT) in
               shared memory, its lane-partial row sums rescaled and accumulated.
     barrier   P is complete.
     PV phase  warp w owns output columns w * CW .. (w + 1) * CW of every row: O rescaled by
               2^(m_old - m_new), O += P V with V = columns 0 .. KV_LORA of the K stage
               (ldmatrix.trans), P fragments by ldmatrix.
   Epilogue: row sums (S_KG x 4 lanes) summed through shared memory, O / l out. */
#include "mla_common.cuh" /* attn__mla_decode_params */

#if !defined(KV_LORA) || !defined(ROPE) || !defined(BLOCK_SIZE) || !defined(DT) || !defined(ROWS)
#error "mla_decode.cu: define KV_LORA, ROPE, BLOCK_SIZE, DT and ROWS"
#endif
#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16
#error "mla_decode.cu: DT must be 1 (f16) or 2 (bf16)"
#endif
/* DT_KV: the latent cache's type, DT (default) or an fp8 latent, 4 e4m3 / 5 e5m2, with a
   per-tensor scale (params.k_scale / k_scale_value; a value that is not finite and > 0
   writes nothing). fp8: the paged_attention.cu scheme (its 8-BIT CACHES): code stages,
   ldmatrix of the codes as b16, Q in f16 with the k-permuted column order scaled by a power
   of two per CTA, P in f16, V's even/odd column tiles put back in the epilogue. */
#ifndef DT_KV
#define DT_KV DT
#endif
#define ATTN_KV8 (DT_KV == ATTN_DT_E4M3 || DT_KV == ATTN_DT_E5M2)
/* DT_KV 9 (ATTN_DT_DS_MLA, SPARSE only, 512 + 64): DeepSeek-V3.2's 656-byte rows, copied
   raw (cp.async) into a staging ring beside the K stages and widened there, each tile once,
   into the 16-bit K stage (codes x their 128-value tile's scale; the bf16 k_pe as DT): S
   and P V then run the 16-bit path. */
#define ATTN_DS (DT_KV == ATTN_DT_DS_MLA)
#if DT_KV != DT && !ATTN_KV8 && !ATTN_DS
#error "mla_decode.cu: DT_KV must be DT, 4 (fp8 e4m3), 5 (fp8 e5m2) or 9 (fp8_ds_mla, SPARSE)"
#endif
#define ATTN_DT_M (ATTN_KV8 ? ATTN_DT_F16 : DT) /* the mma's input type (Q, P, K, V) */
/* SPARSE 1: sparse MLA (DeepSeek-V3.2, attn_mla_forward_sparse): grid (>= num_work[0]
   tokens, ceil(num_heads / ROWS), >= num_work[1] splits); CTA (t, y, z) serves heads y *
   ROWS .. of batch token t over entries [z c, z c + c) of its indices row (c = ceil(topk /
   splits); -1 and positions outside [0, seq_len of its request) are skipped), gathered
   through its request's block table; no work list. One split: it writes out/lse, the
   sinks (params.sinks) joined; more: slot (t gridDim.y + y) splits + z of the partials,
   merged by attn_mla_merge over params.merge (the sinks joined there). */
#ifndef SPARSE
#define SPARSE 0
#endif
/* MIN_CTAS: CTAs per SM the registers are budgeted for (launch bounds) */
#ifndef MIN_CTAS
#define MIN_CTAS 1
#endif
#if KV_LORA % 64 != 0 || ROPE % 16 != 0
#error "mla_decode.cu: KV_LORA must be a multiple of 64 and ROPE of 16"
#endif
#if ROWS != 16 && ROWS != 32 && ROWS != 64
#error "mla_decode.cu: ROWS must be 16, 32 or 64"
#endif
#ifndef WARPS
#define WARPS (ROWS == 64 ? 8 : 4)
#endif
/* defaults: 16-bit latents 32-key tiles (3 stages at 16 rows, 2 past); an fp8 latent
   64-key tiles x 2 stages (at 16 rows two CTAs per SM; H200 sweeps, docs/PERF.md) */
#ifndef KV_TILE
#define KV_TILE (ATTN_KV8 ? 64 : 32)
#endif
#ifndef KV_STAGES
#define KV_STAGES (ROWS == 16 && !ATTN_KV8 ? 3 : 2)
#endif

#include "mla_merge.cuh" /* attn_mla_merge_kernel */

#define ATTN_D (KV_LORA + ROPE)
#define ATTN_RT (ROWS / 16)
#define ATTN_PITCH (ATTN_D + 8)                 /* elements (Q; K of a 16-bit latent) */
/* a K stage row in bytes: 16-bit latents ATTN_PITCH elements; fp8 codes D bytes, 16 more
   where that makes an even number of 16-byte units (conflict-free ldmatrix) */
#define ATTN_KROW (ATTN_KV8 ? ATTN_D + (ATTN_D / 16 % 2 == 0 ? 16 : 0) : ATTN_PITCH * 2)
#define ATTN_PPITCH (KV_TILE + 8)               /* elements of a P row */
#define ATTN_THREADS (WARPS * 32)
/* S: row groups x key groups = WARPS */
#define ATTN_S_RG (ATTN_RT < WARPS ? ATTN_RT : WARPS)
#define ATTN_S_KG (WARPS / ATTN_S_RG)
#define ATTN_RT_S (ATTN_RT / ATTN_S_RG)          /* row tiles per warp in S */
#define ATTN_KW (KV_TILE / ATTN_S_KG)            /* keys per warp in S */
#define ATTN_NT (ATTN_KW / 8)                    /* n tiles of 8 keys */
#define ATTN_CW (KV_LORA / WARPS)                /* output columns per warp */
#define ATTN_OT (ATTN_CW / 8)
#if ATTN_S_RG * ATTN_S_KG != WARPS || ATTN_RT % ATTN_S_RG != 0 || ATTN_KW % 8 != 0 || ATTN_KW < 8
#error "mla_decode.cu: WARPS must split ROWS / 16 row tiles x KV_TILE keys into whole 16 x 8 tiles"
#endif
#if ATTN_CW % 16 != 0 || ATTN_RT * ATTN_OT * 4 > 128
#error "mla_decode.cu: each warp's output columns must be a multiple of 16 and its O at most 128 registers"
#endif
#if KV_TILE % 16 != 0
#error "mla_decode.cu: KV_TILE must be a multiple of 16"
#endif
#if ATTN_KV8 && (ATTN_D % 64 != 0 || ATTN_CW % 32 != 0)
#error "mla_decode.cu: an fp8 latent needs KV_LORA + ROPE in multiples of 64 and each warp's output columns of 32"
#endif
/* S_ACC: independent partial sums of a warp's S, 1, 2 or 4: at 8 keys a warp one accumulator
   is a chain of D / 16 dependent mmas. Default: at 16 rows 4 (one n tile a warp) or 2; past
   16 rows 1 (H200: 2 was 1.5 % slower at 128 heads, the warps having enough chains) */
#ifndef S_ACC
#define S_ACC (ROWS == 16 ? (ATTN_NT == 1 ? 4 : 2) : 1)
#endif
#if (S_ACC != 1 && S_ACC != 2 && S_ACC != 4) || ATTN_D / 16 % S_ACC != 0
#error "mla_decode.cu: S_ACC must be 1, 2 or 4 and divide (KV_LORA + ROPE) / 16"
#endif

#define ATTN_SQ_OFF 0
#define ATTN_SK_OFF (ATTN_SQ_OFF + ROWS * ATTN_PITCH * 2)
#define ATTN_SP_OFF (ATTN_SK_OFF + KV_STAGES * KV_TILE * ATTN_KROW)
#define ATTN_SMAX_OFF (ATTN_SP_OFF + ROWS * ATTN_PPITCH * 2)
#define ATTN_SBLK_OFF (ATTN_SMAX_OFF + ATTN_S_KG * ROWS * 4)
#define ATTN_SR_OFF (ATTN_SBLK_OFF + KV_STAGES * KV_TILE * 8) /* fp8_ds_mla: the raw rows */
#define ATTN_SMEM_BYTES (ATTN_SR_OFF + (ATTN_DS ? KV_STAGES * KV_TILE * ATTN_DS_MLA_ROW : 0))
#if ATTN_SBLK_OFF % 8 != 0
#error "mla_decode.cu: the block offsets must be 8-byte aligned"
#endif
#define ATTN_CPR (ATTN_D * 2 / 16) /* 16-byte chunks per latent row (Q) */
#define ATTN_ROWB (ATTN_DS ? ATTN_DS_MLA_ROW : ATTN_D * (ATTN_KV8 ? 1 : 2)) /* bytes of a cache row */
#define ATTN_KCPR (ATTN_ROWB / 16) /* 16-byte chunks per cache row */

extern "C" __constant__ attn__launch_config attn_mla_config = {ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ROWS, 1, KV_STAGES, WARPS, 1};


extern "C" __global__ void __launch_bounds__(ATTN_THREADS, MIN_CTAS) attn_mla_decode(const attn__mla_decode_params p) {
    extern __shared__ attn_vec16 attn_smem[];
    char *const smem = (char *)attn_smem;
    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();
    if ((int)blockIdx.x >= *p.num_work) return;
#if SPARSE
    /* SPARSE: CTA (t, head tile) for t < *num_work (the batch's tokens); keys are the
       positions of token t's indices row, the "key" j its j-th entry */
    const int nsplit = p.num_work[1], z = blockIdx.z; /* the build's splits of each token's entries */
    if (z >= nsplit) return;
    const int chunk = (p.topk + nsplit - 1) / nsplit;
    const int q_row = blockIdx.x, head0 = blockIdx.y * ROWS;
    const int key0 = attn_imin(p.topk, z * chunk), key1 = attn_imin(p.topk, key0 + chunk);
    const int slot = nsplit > 1 ? (q_row * (int)gridDim.y + (int)blockIdx.y) * nsplit + z : -1;
    const int req = __ldg(p.token_req + q_row), seq_len = __ldg(p.seq_lens + req);
    const int *const ix = p.indices + (attn_i64)q_row * p.indices_stride;
    auto visible = [&](int j) -> bool { /* entry j names a position of the request */
        if (j < key0 || j >= key1) return false;
        const int x = __ldg(ix + j);
        return x >= 0 && x < seq_len;
    };
#else
    const int *item = p.work + 8 * (attn_i64)blockIdx.x;
    const int req = item[0], head0 = item[1], q_row = item[2], slot = item[6];
    const int key0 = item[4], key1 = item[5];
    auto visible = [&](int j) -> bool { return j >= key0 && j < key1; };
#endif
    const int nrows = attn_imin(ROWS, p.num_heads - head0);
#if ATTN_KV8
    const float k_scale = attn_cache_scale(p.k_scale, p.k_scale_value);
    if (k_scale == 0.0f) return; /* nothing written */
    float q_unscale = 1.0f; /* 2^-e of Q's scaling */
#endif
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const attn_u32 sbase = attn_smem_addr(attn_smem);
    const attn_u32 sQ = sbase + ATTN_SQ_OFF, sK = sbase + ATTN_SK_OFF, sP = sbase + ATTN_SP_OFF;
    float *const sMax = (float *)(smem + ATTN_SMAX_OFF);      /* [S_KG][ROWS] */
    attn_i64 *const sBlk = (attn_i64 *)(smem + ATTN_SBLK_OFF); /* [stage][key] */

    /* ---- Q: [q_latent | q_pe] rows of heads head0 .. (zero past num_heads) ---- */
#if !ATTN_KV8
    for (int c = tid; c < ROWS * ATTN_CPR; c += ATTN_THREADS) {
        const int r = c / ATTN_CPR, col = c - r * ATTN_CPR; /* col: 16-byte chunk, 8 elements */
        const int valid = r < nrows;
        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,
                                                   p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col)
                                : (const char *)p.q;
        attn_cp_async16_or_zero(sQ + (attn_u32)((r * ATTN_PITCH + col * 8) * 2), src, !valid);
    }
#endif

    /* ---- the K ring: row offsets of keys in flight, zero-filled outside [key0, key1) ---- */
    const int *bt = p.block_table + (attn_i64)req * p.block_table_stride;
    const char *kv = (const char *)p.kv_cache;
    const int tile0 = key1 > key0 ? key0 / KV_TILE * KV_TILE : 0;
    const int ntiles = key1 > key0 ? (key1 - tile0 + KV_TILE - 1) / KV_TILE : 0;
    auto row_off = [&](int j) -> attn_i64 { /* byte offset of key j's row, -1 outside */
#if SPARSE
        if (!visible(j)) return (attn_i64)-1;
        const int x = __ldg(ix + j);
        return ((attn_i64)__ldg(bt + (unsigned)x / BLOCK_SIZE) * BLOCK_SIZE + (attn_i64)((unsigned)x % BLOCK_SIZE)) *
               ATTN_ROWB;
#else
        return attn_mla_key_offset(bt, j, key0, key1, BLOCK_SIZE, ATTN_D * (ATTN_KV8 ? 1 : 2));
#endif
    };
    auto issue = [&](int tile) { /* cp.async of tile `tile` into its stage */
        const int st = tile % KV_STAGES;
        for (int c = tid; c < KV_TILE * ATTN_KCPR; c += ATTN_THREADS) {
            const int r = c / ATTN_KCPR, col = c - r * ATTN_KCPR;
            const attn_i64 off = sBlk[st * KV_TILE + r];
            const attn_u32 dst = ATTN_DS ? sbase + ATTN_SR_OFF + (attn_u32)((st * KV_TILE + r) * ATTN_DS_MLA_ROW + col * 16)
                                         : sK + (attn_u32)((st * KV_TILE + r) * ATTN_KROW + col * 16);
            attn_cp_async16_or_zero(dst, kv + (off >= 0 ? off + col * 16 : 0), off < 0);
        }
    };
    for (int s = 0; s < KV_STAGES; s++)
        for (int r = tid; r < KV_TILE; r += ATTN_THREADS) sBlk[s * KV_TILE + r] = row_off(tile0 + s * KV_TILE + r);
    __syncthreads(); /* sBlk */
    for (int s = 0; s < KV_STAGES - 1; s++) {
        if (s < ntiles) issue(s);
        attn_cp_async_commit(); /* Q goes with the first group */
    }
#if ATTN_KV8
    /* ---- Q of an fp8 latent (converted while the first tiles are in flight) ---- */
    {   /* f16, scaled by 2^e (the CTA's largest |q| into [2^14, 2^15)), columns k-permuted */
        __shared__ int attn_q_amax;
        if (tid == 0) attn_q_amax = 0;
        __syncthreads();
        float amax = 0.0f;
        for (int c = tid; c < nrows * ATTN_CPR; c += ATTN_THREADS) {
            const int r = c / ATTN_CPR, col = c - r * ATTN_CPR;
            float f[8];
            attn_vec16 v = attn_ldg16(attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,
                                                       p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col));
            attn_unpack8<DT>(&v, f);
#pragma unroll
            for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(f[i]));
        }
        atomicMax(&attn_q_amax, __float_as_int(amax));
        __syncthreads();
        const int ex = (attn_q_amax >> 23) & 0xff;
        const int sh = attn_q_amax == 0 || ex == 255 ? 0 : attn_imax(-100, attn_imin(100, 141 - ex));
        const float qmul = __int_as_float((127 + sh / 2) << 23) * __int_as_float((127 + sh - sh / 2) << 23);
        q_unscale = __int_as_float((127 - sh / 2) << 23) * __int_as_float((127 - sh + sh / 2) << 23);
        attn_u16 *const q16 = (attn_u16 *)(smem + ATTN_SQ_OFF);
        for (int c = tid; c < ROWS * ATTN_CPR; c += ATTN_THREADS) {
            const int r = c / ATTN_CPR, col = c - r * ATTN_CPR;
            float f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (r < nrows) {
                attn_vec16 v = attn_ldg16(attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,
                                                           p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col));
                attn_unpack8<DT>(&v, f);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) { /* dim d = 8 col + i; x = d % 16: column 2 (x / 4) + x % 4 (+ 8 - 2 if x % 4 >= 2) */
                const int d = col * 8 + i, x = d & 15, jj = x & 3;
                const int cc = (d & ~15) + (jj < 2 ? 2 * (x >> 2) + jj : 8 + 2 * (x >> 2) + jj - 2);
                q16[r * ATTN_PITCH + cc] = attn_f32_to_f16(f[i] * qmul);
            }
        }
    }
#endif

    /* ---- roles ---- */
    const int rg = warp / ATTN_S_KG, kg = warp % ATTN_S_KG; /* S: row group, key group */
#if ATTN_KV8
    const float qk_scale = p.scale * ATTN_LOG2E * k_scale * q_unscale * attn_code_factor<DT_KV>();
    /* code rows: ldmatrix x4 over keys 0-7 / 8-15 x bytes +0 / +16 (K: keys 0-7 +0, 0-7 +16,
       8-15 +0, 8-15 +16; the 8-key x2: keys 0-7 +0, +16; V: 0-7 +0, 8-15 +0, 0-7 +16, 8-15 +16) */
    const attn_u32 k8_lane4 = (attn_u32)(((lane & 7) + ((lane >> 4) << 3)) * ATTN_KROW + ((lane >> 3) & 1) * 16);
    const attn_u32 k8_lane2 = (attn_u32)((lane & 7) * ATTN_KROW + ((lane >> 3) & 1) * 16);
    const attn_u32 v8_lane = (attn_u32)(((lane & 7) + (((lane >> 3) & 1) << 3)) * ATTN_KROW + (lane >> 4) * 16);
#else
    const float qk_scale = p.scale * ATTN_LOG2E;
#endif
    /* ldmatrix lane offsets (bytes): A (rows lane % 16, column half lane / 16), B from
       [key][dim] rows (keys lane % 8 + 8 (lane / 16), column half (lane / 8) % 2), B
       transposed from [key][dim] (keys lane % 16, column half lane / 16) */
    const attn_u32 a_lane = (attn_u32)(((lane & 15) * ATTN_PITCH + (lane >> 4) * 8) * 2);
    const attn_u32 k_lane = (attn_u32)((((lane & 7) + ((lane >> 4) << 3)) * ATTN_PITCH + ((lane >> 3) & 1) * 8) * 2);
    const attn_u32 v_lane = (attn_u32)(((lane & 15) * ATTN_PITCH + (lane >> 4) * 8) * 2);
    const attn_u32 p_lane = (attn_u32)(((lane & 15) * ATTN_PPITCH + (lane >> 4) * 8) * 2);

    /* running row max (base 2, scaled) of the S rows and of the O rows of this thread, kept
       identically (both derive from the same shared maxima) */
    float mS[ATTN_RT_S][2], lS[ATTN_RT_S][2], mO[ATTN_RT][2];
#pragma unroll
    for (int r = 0; r < ATTN_RT_S; r++) mS[r][0] = mS[r][1] = attn_neg_inf(), lS[r][0] = lS[r][1] = 0.0f;
#pragma unroll
    for (int r = 0; r < ATTN_RT; r++) mO[r][0] = mO[r][1] = attn_neg_inf();
    float o[ATTN_RT][ATTN_OT][4];
#pragma unroll
    for (int r = 0; r < ATTN_RT; r++)
#pragma unroll
        for (int n = 0; n < ATTN_OT; n++) o[r][n][0] = o[r][n][1] = o[r][n][2] = o[r][n][3] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        attn_cp_async_wait<KV_STAGES - 2>();
        __syncthreads(); /* tile it landed; the last tile's P and maxima are read */
        if (it + KV_STAGES - 1 < ntiles) issue(it + KV_STAGES - 1);
        attn_cp_async_commit();
        const int st = it % KV_STAGES;
        const int kt = tile0 + it * KV_TILE;
        /* the row offsets of tile it + KV_STAGES into stage st's slot (its last reader,
           the issue of tile it, ran iterations ago); read after the next barriers */
        for (int r = tid; r < KV_TILE; r += ATTN_THREADS)
            sBlk[st * KV_TILE + r] = row_off(tile0 + (it + KV_STAGES) * KV_TILE + r);
        const attn_u32 sKst = sK + (attn_u32)(st * KV_TILE * ATTN_KROW);
#if ATTN_DS
        {   /* widen tile it's raw rows into K stage st (its last readers, tile it - KV_STAGES's
               S and P V, finished before the previous iteration's barrier); rows of skipped
               entries were zero-filled: scale 0, codes 0 */
            const char *raw = smem + ATTN_SR_OFF + st * KV_TILE * ATTN_DS_MLA_ROW;
            for (int u = tid; u < KV_TILE * (ATTN_D / 8); u += ATTN_THREADS) {
                const int r = u / (ATTN_D / 8), c8 = u - r * (ATTN_D / 8);
                const char *row = raw + r * ATTN_DS_MLA_ROW;
                float f[8];
                attn_vec16 o[2];
                if (c8 < KV_LORA / 8) { /* 8 codes of tile c8 / 16 */
                    const float sc = *(const float *)(row + 512 + 4 * (c8 >> 4)) * attn_code_factor<ATTN_DT_E4M3>();
                    const uint2 w = *(const uint2 *)(row + c8 * 8);
                    attn_vec16 h;
                    attn_codes4_to_f16x2<ATTN_DT_E4M3>(w.x, h.x, h.y);
                    attn_codes4_to_f16x2<ATTN_DT_E4M3>(w.y, h.z, h.w);
                    attn_unpack8<ATTN_DT_F16>(&h, f);
#pragma unroll
                    for (int i = 0; i < 8; i++) f[i] *= sc;
                } else { /* 8 bf16 of k_pe */
                    const attn_vec16 b = *(const attn_vec16 *)(row + 512 + 16 + (c8 - KV_LORA / 8) * 16);
                    attn_unpack8<ATTN_DT_BF16>(&b, f);
                }
                attn_pack8<DT>(f, o);
                *(attn_vec16 *)(smem + ATTN_SK_OFF + (st * KV_TILE + r) * ATTN_KROW + c8 * 16) = o[0];
            }
            __syncthreads();
        }
#endif

        /* ---- S phase: S_ACC partial sums sp, added into s ---- */
        float s[ATTN_RT_S][ATTN_NT][4], sp[S_ACC][ATTN_RT_S][ATTN_NT][4];
#pragma unroll
        for (int c = 0; c < S_ACC; c++)
#pragma unroll
            for (int r = 0; r < ATTN_RT_S; r++)
#pragma unroll
                for (int n = 0; n < ATTN_NT; n++) sp[c][r][n][0] = sp[c][r][n][1] = sp[c][r][n][2] = sp[c][r][n][3] = 0.0f;
#if ATTN_KV8
        {   /* fp8: a 16-key x 32-dim block of codes by one ldmatrix.x4 (4 words: b0/b1 of two
               k chunks for two n tiles), an 8-key one by x2. S_ACC independent partial sums
               (chunk c of 16 dims into sp[c % S_ACC]): a warp's S is a chain of D / 16 mmas
               per n tile, which at 8 keys a warp is the tile loop's critical path */
            const attn_u32 kb = sKst + (attn_u32)(kg * ATTN_KW * ATTN_KROW);
            const attn_u32 qb = sQ + (attn_u32)(rg * ATTN_RT_S * 16 * ATTN_PITCH * 2) + a_lane;
            for (int kq2 = 0; kq2 < ATTN_D / 64; kq2++)
#pragma unroll
                for (int h2 = 0; h2 < 2; h2++) {
                    const int kq = 2 * kq2 + h2, c0 = (2 * h2) % S_ACC, c1 = (2 * h2 + 1) % S_ACC;
                    attn_u32 a0[ATTN_RT_S][4], a1[ATTN_RT_S][4];
#pragma unroll
                    for (int r = 0; r < ATTN_RT_S; r++) {
                        attn_ldmatrix_x4(a0[r], qb + (attn_u32)(r * 16 * ATTN_PITCH * 2) + kq * 64);
                        attn_ldmatrix_x4(a1[r], qb + (attn_u32)(r * 16 * ATTN_PITCH * 2) + kq * 64 + 32);
                    }
#pragma unroll
                    for (int np = 0; np < ATTN_NT / 2; np++) {
                        attn_u32 w[4], b[4][2];
                        attn_ldmatrix_x4(w, kb + k8_lane4 + (attn_u32)(np * 16 * ATTN_KROW + kq * 32));
#pragma unroll
                        for (int i = 0; i < 4; i++) attn_codes4_to_f16x2<DT_KV>(w[i], b[i][0], b[i][1]);
#pragma unroll
                        for (int r = 0; r < ATTN_RT_S; r++) {
                            attn_mma16816<ATTN_DT_M>(sp[c0][r][2 * np], a0[r], b[0]);
                            attn_mma16816<ATTN_DT_M>(sp[c1][r][2 * np], a1[r], b[1]);
                            attn_mma16816<ATTN_DT_M>(sp[c0][r][2 * np + 1], a0[r], b[2]);
                            attn_mma16816<ATTN_DT_M>(sp[c1][r][2 * np + 1], a1[r], b[3]);
                        }
                    }
#if ATTN_NT % 2
                    {
                        attn_u32 w[2], b[2][2];
                        attn_ldmatrix_x2(w, kb + k8_lane2 + (attn_u32)((ATTN_NT - 1) * 8 * ATTN_KROW + kq * 32));
                        attn_codes4_to_f16x2<DT_KV>(w[0], b[0][0], b[0][1]);
                        attn_codes4_to_f16x2<DT_KV>(w[1], b[1][0], b[1][1]);
#pragma unroll
                        for (int r = 0; r < ATTN_RT_S; r++) {
                            attn_mma16816<ATTN_DT_M>(sp[c0][r][ATTN_NT - 1], a0[r], b[0]);
                            attn_mma16816<ATTN_DT_M>(sp[c1][r][ATTN_NT - 1], a1[r], b[1]);
                        }
                    }
#endif
                }
        }
#else
        {
            /* S_ACC independent partial sums, as the fp8 branch: 16-dim step ks into sp[ks % S_ACC] */
            const attn_u32 kb = sKst + (attn_u32)(kg * ATTN_KW * ATTN_PITCH * 2);
            const attn_u32 qb = sQ + (attn_u32)(rg * ATTN_RT_S * 16 * ATTN_PITCH * 2) + a_lane;
#pragma unroll (S_ACC == 1 ? 4 : 1)
            for (int ks0 = 0; ks0 < ATTN_D / 16; ks0 += S_ACC)
#pragma unroll
                for (int c = 0; c < S_ACC; c++) {
                    const int ks = ks0 + c;
                    attn_u32 a[ATTN_RT_S][4];
#pragma unroll
                    for (int r = 0; r < ATTN_RT_S; r++) attn_ldmatrix_x4(a[r], qb + (attn_u32)(r * 16 * ATTN_PITCH * 2) + ks * 32);
#pragma unroll
                    for (int np = 0; np < ATTN_NT / 2; np++) {
                        attn_u32 b[4];
                        attn_ldmatrix_x4(b, kb + k_lane + (attn_u32)((np * 16 * ATTN_PITCH + ks * 16) * 2));
#pragma unroll
                        for (int r = 0; r < ATTN_RT_S; r++) {
                            attn_mma16816<DT>(sp[c][r][2 * np], a[r], b);
                            attn_mma16816<DT>(sp[c][r][2 * np + 1], a[r], b + 2);
                        }
                    }
#if ATTN_NT % 2
                    {
                        const attn_u32 k2_lane = (attn_u32)(((lane & 7) * ATTN_PITCH + ((lane >> 3) & 1) * 8) * 2); /* x2: 8 keys */
                        attn_u32 b[2];
                        attn_ldmatrix_x2(b, kb + k2_lane + (attn_u32)(((ATTN_NT - 1) * 8 * ATTN_PITCH + ks * 16) * 2));
#pragma unroll
                        for (int r = 0; r < ATTN_RT_S; r++) attn_mma16816<DT>(sp[c][r][ATTN_NT - 1], a[r], b);
                    }
#endif
                }
        }
#endif
#pragma unroll
        for (int r = 0; r < ATTN_RT_S; r++)
#pragma unroll
            for (int n = 0; n < ATTN_NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = sp[0][r][n][e];
#pragma unroll
                    for (int c = 1; c < S_ACC; c++) x += sp[c][r][n][e];
                    s[r][n][e] = x;
                }
        /* mask keys outside [key0, key1); this warp's row maxima to shared memory */
        const int kw0 = kt + kg * ATTN_KW + 2 * tq;
#pragma unroll
        for (int r = 0; r < ATTN_RT_S; r++) {
            float mx[2] = {attn_neg_inf(), attn_neg_inf()};
#pragma unroll
            for (int n = 0; n < ATTN_NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = kw0 + 8 * n + (e & 1);
                    float x = visible(j) ? s[r][n][e] : attn_neg_inf();
                    s[r][n][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mx[h] = attn_quad_max(mx[h]);
                if (tq == 0) sMax[kg * ROWS + (rg * ATTN_RT_S + r) * 16 + g + 8 * h] = mx[h];
            }
        }
        __syncthreads(); /* every key group's maxima */

        /* ---- softmax of the S rows: P to shared memory ---- */
#pragma unroll
        for (int r = 0; r < ATTN_RT_S; r++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = (rg * ATTN_RT_S + r) * 16 + g + 8 * h;
                float mx = attn_neg_inf();
#pragma unroll
                for (int k = 0; k < ATTN_S_KG; k++) mx = fmaxf(mx, sMax[k * ROWS + row]);
                float alpha_s;
                const float b = attn_softmax_rebase(mS[r][h], mx * qk_scale, alpha_s);
                lS[r][h] *= alpha_s;
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < ATTN_NT; n++) {
                    const float p0 = attn_exp2(fmaf(s[r][n][2 * h], qk_scale, -b));
                    const float p1 = attn_exp2(fmaf(s[r][n][2 * h + 1], qk_scale, -b));
                    sum += p0 + p1;
                    *(attn_u32 *)(smem + ATTN_SP_OFF + (row * ATTN_PPITCH + kg * ATTN_KW + 8 * n + 2 * tq) * 2) =
                        attn_elem<ATTN_DT_M>::pack2(p0, p1);
                }
                lS[r][h] += sum;
            }
        }
        /* the O rows' new maxima and their rescale factor (same arithmetic as above) */
        float alpha[ATTN_RT][2];
#pragma unroll
        for (int r = 0; r < ATTN_RT; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = r * 16 + g + 8 * h;
                float mx = attn_neg_inf();
#pragma unroll
                for (int k = 0; k < ATTN_S_KG; k++) mx = fmaxf(mx, sMax[k * ROWS + row]);
                attn_softmax_rebase(mO[r][h], mx * qk_scale, alpha[r][h]);
            }
        __syncthreads(); /* P complete */

        /* ---- PV phase: O[:, warp's columns] = alpha O + P V ---- */
#pragma unroll
        for (int r = 0; r < ATTN_RT; r++)
#pragma unroll
            for (int n = 0; n < ATTN_OT; n++) {
                o[r][n][0] *= alpha[r][0]; o[r][n][1] *= alpha[r][0];
                o[r][n][2] *= alpha[r][1]; o[r][n][3] *= alpha[r][1];
            }
        {   /* O += P V, per 16 keys: P's A fragments by ldmatrix, then V's */
#if ATTN_KV8
            /* fp8: V = the first KV_LORA code columns; per 16 keys x 32 columns one
               ldmatrix.x4.trans, split by prmt into the even- and odd-column tiles of each 16
               (o tiles 4q .. 4q + 3: columns 32q + {even, odd}, 32q + 16 + {even, odd}) */
            const attn_u32 vb = sKst + v8_lane + (attn_u32)(warp * ATTN_CW);
#else
            const attn_u32 vb = sKst + v_lane + (attn_u32)(warp * ATTN_CW * 2);
#endif
#pragma unroll
            for (int kk = 0; kk < KV_TILE / 16; kk++) {
                attn_u32 a[ATTN_RT][4];
#pragma unroll
                for (int r = 0; r < ATTN_RT; r++)
                    attn_ldmatrix_x4(a[r], sP + p_lane + (attn_u32)((r * 16 * ATTN_PPITCH + kk * 16) * 2));
                const attn_u32 vrow = vb + (attn_u32)(kk * 16 * ATTN_KROW);
#if ATTN_KV8
#pragma unroll
                for (int dq = 0; dq < ATTN_CW / 32; dq++) {
                    attn_u32 w[4], b[4][2];
                    attn_ldmatrix_x4_trans(w, vrow + dq * 32);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        attn_codes4_to_f16x2<DT_KV>(attn_prmt(w[2 * h], w[2 * h + 1], 0x6420u), b[2 * h][0], b[2 * h][1]);
                        attn_codes4_to_f16x2<DT_KV>(attn_prmt(w[2 * h], w[2 * h + 1], 0x7531u), b[2 * h + 1][0], b[2 * h + 1][1]);
                    }
#pragma unroll
                    for (int r = 0; r < ATTN_RT; r++)
#pragma unroll
                        for (int i = 0; i < 4; i++) attn_mma16816<ATTN_DT_M>(o[r][4 * dq + i], a[r], b[i]);
                }
#else
#pragma unroll
                for (int op = 0; op < ATTN_OT / 2; op++) {
                    attn_u32 b[4];
                    attn_ldmatrix_x4_trans(b, vrow + op * 32);
#pragma unroll
                    for (int r = 0; r < ATTN_RT; r++) {
                        attn_mma16816<DT>(o[r][2 * op], a[r], b);
                        attn_mma16816<DT>(o[r][2 * op + 1], a[r], b + 2);
                    }
                }
#endif
            }
        }
    }

    /* ---- epilogue: row sums through shared memory, O / l out ---- */
    attn_cp_async_wait<0>();
    __syncthreads(); /* the maxima buffer is free */
#pragma unroll
    for (int r = 0; r < ATTN_RT_S; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float l = attn_quad_sum(lS[r][h]);
            if (tq == 0) sMax[kg * ROWS + (rg * ATTN_RT_S + r) * 16 + g + 8 * h] = l;
        }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ATTN_RT; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = r * 16 + g + 8 * h;
            float l = 0.0f, wsink = 1.0f;
#pragma unroll
            for (int k = 0; k < ATTN_S_KG; k++) l += sMax[k * ROWS + row];
            const float lse2 = attn_softmax_lse2(mO[r][h], l); /* a split's partial: base 2, no sink */
            float lse = lse2 * ATTN_LN2;
            if (p.sinks && slot < 0 && row < nrows) /* the head's sink, once, where the row is finished */
                wsink = attn_softmax_sink(__ldg(p.sinks + head0 + row), lse);
            const float inv = l > 0.0f ? wsink * attn_rcp(l) : 0.0f;
            if (row >= nrows) continue;
#if ATTN_KV8
            { /* o tile n holds columns c(n) + 4 tq and + 2 (the PV phase's order); the scale */
                const float f = inv * k_scale * attn_code_factor<DT_KV>();
                typedef typename attn_elem<DT>::storage out_t;
                out_t *orow = (out_t *)((char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head) * 2);
                float *po = p.partial_o + ((attn_i64)(slot < 0 ? 0 : slot) * ROWS + row) * KV_LORA;
#pragma unroll
                for (int n = 0; n < ATTN_OT; n++) {
                    const int col = warp * ATTN_CW + (n >> 2) * 32 + ((n & 2) ? 16 : 0) + (n & 1) + 4 * tq;
                    if (slot < 0) {
                        orow[col] = attn_elem<DT>::from_f32(o[r][n][2 * h] * f);
                        orow[col + 2] = attn_elem<DT>::from_f32(o[r][n][2 * h + 1] * f);
                    } else {
                        po[col] = o[r][n][2 * h] * f;
                        po[col + 2] = o[r][n][2 * h + 1] * f;
                    }
                }
                if (slot < 0 && p.lse && warp == 0 && tq == 0)
                    p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] = lse;
                if (slot >= 0 && warp == 0 && tq == 0) p.partial_lse[(attn_i64)slot * ROWS + row] = lse2;
                continue;
            }
#endif
            if (slot < 0) {
                char *orow = (char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head) * 2;
#pragma unroll
                for (int n = 0; n < ATTN_OT; n++)
                    *(attn_u32 *)(orow + (warp * ATTN_CW + 8 * n + 2 * tq) * 2) =
                        attn_elem<DT>::pack2(o[r][n][2 * h] * inv, o[r][n][2 * h + 1] * inv);
                if (p.lse && warp == 0 && tq == 0)
                    p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] = lse;
            } else {
                float *po = p.partial_o + ((attn_i64)slot * ROWS + row) * KV_LORA;
#pragma unroll
                for (int n = 0; n < ATTN_OT; n++) {
                    po[warp * ATTN_CW + 8 * n + 2 * tq] = o[r][n][2 * h] * inv;
                    po[warp * ATTN_CW + 8 * n + 2 * tq + 1] = o[r][n][2 * h + 1] * inv;
                }
                if (warp == 0 && tq == 0) p.partial_lse[(attn_i64)slot * ROWS + row] = lse2;
            }
        }
}

/* The splits of one (query row, head tile) merged (mla_merge.cuh): grid (>= *num_merge,
   ROWS), one CTA per row. */
extern "C" __global__ void __launch_bounds__(ATTN_MLA_MERGE_THREADS) attn_mla_merge(const attn__mla_decode_params p) {
#if ATTN_KV8
    if (attn_cache_scale(p.k_scale, p.k_scale_value) == 0.0f) return; /* the decode wrote nothing: neither does the merge */
#endif
    attn_mla_merge_kernel(p);
}
