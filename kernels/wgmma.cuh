/* wgmma.cuh - Hopper warpgroup MMA (wgmma.mma_async) for kernels compiled for sm_90a.

   Included only by kernels built with --gpu-architecture=sm_90a: wgmma is an
   arch-specific instruction (NVRTC defines __CUDA_ARCH_FEAT_SM90_ALL for sm_90a only; a
   cubin that uses it runs on compute capability 9.0 only). Inline PTX, no CUDA header.
   tests/wgmma_probe.cu exercises every helper here; tests/wgmma_check.c runs it (on an
   H200: every probe within 1.2e-5 of a float64 reference; with the MN-major LBO and SBO
   swapped, the PV probes fail, so the choice below is the hardware's, not a guess).

   One wgmma is issued by a warpgroup: 128 consecutive threads (warps 4k..4k+3) executing
   it together. Shape m64nNk16: D[64][N] (+)= A[64][16] . B[16][N], f16 or bf16 inputs,
   f32 accumulators in registers. A comes from shared memory (a descriptor) or from
   registers; B always from shared memory.

   ---- the 128-byte swizzled shared-memory layout (descriptor swizzle mode 1) ----------

   Data is stored in rows of 128 bytes (64 16-bit elements = eight 16-byte chunks). Eight
   consecutive rows, 1024 bytes, form an "atom"; every atom starts on a 1024-byte boundary
   (then the descriptor's base offset is 0, which is all this file writes). Inside a row,
   chunk c (elements 8c..8c+7 of that row) is stored at chunk position c ^ (r % 8):

       byte(r, e) = (e / 64) * PANEL + r * 128 + (((e / 8) % 8) ^ (r % 8)) * 16 + (e % 8) * 2

   for row r and element e of a tile of ROWS rows, PANEL = ROWS * 128: a row wider than 64
   elements continues in the next panel (head dim 128 = two panels). The hardware's rule
   is the same statement about addresses: inside a 1024-aligned atom, address bits [6:4]
   are XORed with bits [9:7]. Example, a 64 x 64 bf16 tile (one panel, 8192 bytes): row 0
   is stored in order; row 1 has chunks 1,0,3,2,5,4,7,6; element 20 of row 5 (chunk 2,
   third element) is at 5 * 128 + (2 ^ 5) * 16 + 4 * 2 = 760. The XOR spreads the eight
   16-byte chunks of one column of chunks over all 32 banks, so neither the cp.async
   writer nor the tensor core's reads conflict.

   K-major operand (A = Q or P [M][K]; B = K [N][K] with tnspB 0): the rows are the M (or
   N) index, K runs along the row. The k16 step s reads K elements 16s..16s+15, that is 32
   bytes of every row: descriptor start = tile + (16s / 64) * PANEL + (16s % 64) * 2
   (32 bytes per step inside a panel), SBO = 1024 (from one 8-row group to the next),
   LBO unused by swizzled K-major layouts (1 written, as the PTX ISA says it is assumed).
   Advancing the start by 32 bytes is right because the XOR is applied to the final
   address: row r's chunk 2s + c (c = 0, 1) is looked up at position (2s + c) ^ (r % 8),
   exactly where the writer put it. The atom itself stays 1024-aligned, so base offset 0.

   MN-major B operand (tnspB 1; V [keys][dims] row-major: the N index contiguous): the
   rows are the K index (keys), a row holds 64 N columns, N beyond 64 in the next panel.
   The k16 step s reads keys 16s..16s+15: start = tile + 16s * 128 (2048 bytes per step,
   whole atoms), SBO = 1024 (the next 8 keys), LBO = PANEL (from one 64-column block of N
   to the next; the PTX ISA: "stride from the first 8 rows to the next 8 rows" of the
   128-bit-element MN-major matrix; CUTLASS make_gmma_desc<Major::MN>: the n mode).

   Descriptor bits (PTX ISA "Matrix Descriptor Format"; enc(x) = (x & 0x3FFFF) >> 4):
   [13:0] enc(start address, a shared-window byte address), [29:16] enc(LBO), [45:32]
   enc(SBO), [51:49] base offset, [63:62] swizzle (0 none, 1 128B, 2 64B, 3 32B).

   ---- register fragments (thread t of the warpgroup: w = t / 32, g = (t % 32) / 4,
   q = t % 4; PTX ISA "Register Fragments" for .m64nNk16; CUTLASS CLayout_64xN and
   ALayout_64x16 say the same) ------------------------------------------------------------

   Accumulator D (f32, N/2 registers):  d[4i + 2h + b] = D[16w + g + 8h][8i + 2q + b]
       for i in [0, N/8), h, b in {0, 1}: rows 16w + g and 16w + g + 8, columns 8i + 2q, +1.
   A from registers (16-bit, four b32 registers, lower column in the low half):
       a[0] = A[16w + g][2q, 2q+1]      a[1] = A[16w + g + 8][2q, 2q+1]
       a[2] = A[16w + g][2q+8, 2q+9]    a[3] = A[16w + g + 8][2q+8, 2q+9]
   (the m16n8k16 mma.sync A fragment of attn_common.cuh, warp w taking rows 16w..16w+15).
   So the accumulator of S = Q K^T is, per k16 step j of P . V, the A fragment:
   a = {d[8j], d[8j+1]}, {d[8j+2], d[8j+3]}, {d[8j+4], d[8j+5]}, {d[8j+6], d[8j+7]} packed
   to 16 bits (attn_wgmma_a_from_acc).

   ---- ordering -----------------------------------------------------------------------
   Shared memory written by st.shared or cp.async (the generic proxy) is read by wgmma
   through the async proxy. Each writing thread: cp.async wait, then
   attn_wgmma_fence_smem_writes (fence.proxy.async.shared::cta), then a barrier
   (__syncthreads), then wgmma. attn_wgmma_fence (wgmma.fence) goes before the first
   wgmma and again whenever the accumulator or A registers were written by other
   instructions. After attn_wgmma_commit / attn_wgmma_wait<0>, attn_wgmma_fence_acc keeps
   the compiler from moving reads of the accumulators above the wait. */
#ifndef ATTN_WGMMA_CUH
#define ATTN_WGMMA_CUH

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.cuh needs --gpu-architecture=sm_90a (wgmma.mma_async is arch-specific to sm_90a)"
#endif

#include "attn_common.cuh"

/* ---- the swizzled layout ---- */

/* Byte offset of 16-byte chunk `chunk` (elements 8 * chunk ..) of row `row` in a tile of
   ROWS rows stored in the 128-byte swizzled layout (ROWS * 128-byte panels). */
template <int ROWS> ATTN_DEV attn_u32 attn_wgmma_swizzle_offset(int row, int chunk) {
    static_assert(ROWS % 8 == 0, "a swizzled tile has whole 8-row atoms");
    return (attn_u32)((chunk >> 3) * (ROWS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

/* cp.async of a row-major ROWS x COLS tile of 16-bit elements (rows `row_stride_bytes`
   apart in global memory, 16-byte aligned) into the swizzled layout at shared address
   `tile` (1024-aligned). Issued by THREADS threads, `tid` in [0, THREADS); commit and wait
   are the caller's (attn_cp_async_commit / attn_cp_async_wait). */
template <int ROWS, int COLS, int THREADS>
ATTN_DEV void attn_wgmma_load_tile(attn_u32 tile, const void *gmem, attn_i64 row_stride_bytes, int tid) {
    static_assert(COLS % 64 == 0, "a swizzled row is 64 16-bit elements; wider tiles take whole panels");
    const int chunks = COLS / 8;
#pragma unroll 4
    for (int i = tid; i < ROWS * chunks; i += THREADS) {
        int r = i / chunks, c = i % chunks;
        attn_cp_async16(tile + attn_wgmma_swizzle_offset<ROWS>(r, c),
                        (const char *)gmem + r * row_stride_bytes + c * 16, 16);
    }
}

/* ---- descriptors ---- */

ATTN_DEV attn_u64 attn_wgmma_desc_encode(attn_u32 bytes) { return (attn_u64)((bytes & 0x3FFFFu) >> 4); }

/* A 128B-swizzle descriptor (base offset 0: the atoms are 1024-aligned). */
ATTN_DEV attn_u64 attn_wgmma_desc(attn_u32 start, attn_u32 lbo, attn_u32 sbo) {
    return attn_wgmma_desc_encode(start) | attn_wgmma_desc_encode(lbo) << 16 | attn_wgmma_desc_encode(sbo) << 32 |
           1ull << 62;
}

/* K-major operand: K elements k..k+15 (k % 16 == 0) of a swizzled tile of ROWS rows. */
template <int ROWS> ATTN_DEV attn_u64 attn_wgmma_desc_k_major(attn_u32 tile, int k) {
    return attn_wgmma_desc(tile + (attn_u32)((k >> 6) * (ROWS * 128) + (k & 63) * 2), 16, 1024);
}

/* MN-major B operand (tnspB 1): rows (keys) k..k+15 (k % 16 == 0) of a swizzled tile whose
   ROWS rows are the K index and whose columns are N. */
template <int ROWS> ATTN_DEV attn_u64 attn_wgmma_desc_mn_major(attn_u32 tile, int k) {
    return attn_wgmma_desc(tile + (attn_u32)(k * 128), ROWS * 128, 1024);
}

/* ---- fences and groups ---- */

/* Generic-proxy shared-memory writes (st.shared, cp.async) of this thread become visible
   to the async proxy (wgmma); follow with a barrier before the wgmma. */
ATTN_DEV void attn_wgmma_fence_smem_writes(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* Orders this warpgroup's earlier register and shared-memory accesses before the wgmma
   that follow: before the first wgmma, and after touching accumulators or A registers. */
ATTN_DEV void attn_wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

/* Closes the group of wgmma issued since the last commit. */
ATTN_DEV void attn_wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

/* Waits until at most N committed groups are pending (N = 0: all done, accumulators ready). */
template <int N> ATTN_DEV void attn_wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}

/* A compiler-level fence on each accumulator: reads after it cannot move above a wait. */
template <int R> ATTN_DEV void attn_wgmma_fence_acc(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}

/* The same for a register A fragment an rs wgmma reads: its registers stay this value (no
   other value may take them) until here, after the wait that retires the wgmma. */
ATTN_DEV void attn_wgmma_fence_frag(attn_u32 (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) asm volatile("" : "+r"(a[i]) :: "memory");
}

/* The online softmax's rescale of an accumulator: this thread's rows 16w + g times a0, 16w +
   g + 8 times a1 (the accumulator layout at the top). */
template <int R> ATTN_DEV void attn_wgmma_scale_rows(float (&d)[R], float a0, float a1) {
#pragma unroll
    for (int i = 0; i < R / 4; i++) {
        d[4 * i] *= a0; d[4 * i + 1] *= a0;
        d[4 * i + 2] *= a1; d[4 * i + 3] *= a1;
    }
}

/* The A fragment of k16 step j of a P . V product from the f32 accumulator of S (N >= 16j
   + 16): the layouts line up (top of file); ET is the 16-bit type P is rounded to (RNE). */
template <int ET, int R> ATTN_DEV void attn_wgmma_a_from_acc(attn_u32 (&a)[4], const float (&d)[R], int j) {
    a[0] = attn_elem<ET>::pack2(d[8 * j + 0], d[8 * j + 1]);
    a[1] = attn_elem<ET>::pack2(d[8 * j + 2], d[8 * j + 3]);
    a[2] = attn_elem<ET>::pack2(d[8 * j + 4], d[8 * j + 5]);
    a[3] = attn_elem<ET>::pack2(d[8 * j + 6], d[8 * j + 7]);
}

/* ---- the MMA: attn_wgmma<N, ET>::ss<TRANS_B>(d, desc_a, desc_b, scale_d)
                 attn_wgmma<N, ET>::rs<TRANS_B>(d, a, desc_b, scale_d)
   D[64][N] = A . B + (scale_d ? D : 0); ss: A from a K-major descriptor, rs: A from the
   registers a[4] (layout at the top). TRANS_B 0: B K-major ([N][K], e.g. K of QK^T);
   1: MN-major ([K][N], e.g. V of PV). d has N/2 floats per thread (layout at the top).
   N in {16, 32, 64, 128, 256}; ET 1 f16, 2 bf16. */
template <int N, int ET> struct attn_wgmma;

/* Operand numbers as text: inline PTX in NVRTC has no symbolic operand names, so the R
   accumulators are %0..%R-1 and the operands after them are numbered per R (= N / 2):
   ss: desc_a %R, desc_b %R+1, scale_d %R+2; rs: a[0..3] %R..%R+3, desc_b %R+4, scale_d %R+5. */
#define ATTN__WG_LIST8(a, b, c, d, e, f, g, h) "%" #a ", %" #b ", %" #c ", %" #d ", %" #e ", %" #f ", %" #g ", %" #h
#define ATTN__WG_R8 ATTN__WG_LIST8(0, 1, 2, 3, 4, 5, 6, 7)
#define ATTN__WG_R16 ATTN__WG_R8 ", " ATTN__WG_LIST8(8, 9, 10, 11, 12, 13, 14, 15)
#define ATTN__WG_R32 ATTN__WG_R16 ", " ATTN__WG_LIST8(16, 17, 18, 19, 20, 21, 22, 23) ", " \
    ATTN__WG_LIST8(24, 25, 26, 27, 28, 29, 30, 31)
#define ATTN__WG_R64 ATTN__WG_R32 ", " ATTN__WG_LIST8(32, 33, 34, 35, 36, 37, 38, 39) ", " \
    ATTN__WG_LIST8(40, 41, 42, 43, 44, 45, 46, 47) ", " ATTN__WG_LIST8(48, 49, 50, 51, 52, 53, 54, 55) ", " \
    ATTN__WG_LIST8(56, 57, 58, 59, 60, 61, 62, 63)
#define ATTN__WG_R128 ATTN__WG_R64 ", " ATTN__WG_LIST8(64, 65, 66, 67, 68, 69, 70, 71) ", " \
    ATTN__WG_LIST8(72, 73, 74, 75, 76, 77, 78, 79) ", " ATTN__WG_LIST8(80, 81, 82, 83, 84, 85, 86, 87) ", " \
    ATTN__WG_LIST8(88, 89, 90, 91, 92, 93, 94, 95) ", " ATTN__WG_LIST8(96, 97, 98, 99, 100, 101, 102, 103) ", " \
    ATTN__WG_LIST8(104, 105, 106, 107, 108, 109, 110, 111) ", " \
    ATTN__WG_LIST8(112, 113, 114, 115, 116, 117, 118, 119) ", " \
    ATTN__WG_LIST8(120, 121, 122, 123, 124, 125, 126, 127)
#define ATTN__WG_SS_AB8 "%8, %9"
#define ATTN__WG_SS_SD8 "%10"
#define ATTN__WG_SS_AB16 "%16, %17"
#define ATTN__WG_SS_SD16 "%18"
#define ATTN__WG_SS_AB32 "%32, %33"
#define ATTN__WG_SS_SD32 "%34"
#define ATTN__WG_SS_AB64 "%64, %65"
#define ATTN__WG_SS_SD64 "%66"
#define ATTN__WG_SS_AB128 "%128, %129"
#define ATTN__WG_SS_SD128 "%130"
#define ATTN__WG_RS_AB8 "{%8, %9, %10, %11}, %12"
#define ATTN__WG_RS_SD8 "%13"
#define ATTN__WG_RS_AB16 "{%16, %17, %18, %19}, %20"
#define ATTN__WG_RS_SD16 "%21"
#define ATTN__WG_RS_AB32 "{%32, %33, %34, %35}, %36"
#define ATTN__WG_RS_SD32 "%37"
#define ATTN__WG_RS_AB64 "{%64, %65, %66, %67}, %68"
#define ATTN__WG_RS_SD64 "%69"
#define ATTN__WG_RS_AB128 "{%128, %129, %130, %131}, %132"
#define ATTN__WG_RS_SD128 "%133"

#define ATTN__WG_D8(i) "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), \
    "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define ATTN__WG_D16(i) ATTN__WG_D8(i), ATTN__WG_D8((i) + 8)
#define ATTN__WG_D32(i) ATTN__WG_D16(i), ATTN__WG_D16((i) + 16)
#define ATTN__WG_D64(i) ATTN__WG_D32(i), ATTN__WG_D32((i) + 32)
#define ATTN__WG_D128(i) ATTN__WG_D64(i), ATTN__WG_D64((i) + 64)

/* p = (scale_d != 0), then the instruction; the immediates after p: imm-scale-a 1,
   imm-scale-b 1, imm-trans-a 0 (ss only: A is K-major), imm-trans-b. */
#define ATTN__WG_ASM(N, R, TY, FORM, TAIL)                                                            \
    "{\n.reg .pred p;\nsetp.ne.b32 p, " ATTN__WG_##FORM##_SD##R ", 0;\n"                              \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" ATTN__WG_R##R "}, "              \
    ATTN__WG_##FORM##_AB##R ", p, " TAIL ";\n}\n"

#define ATTN__WGMMA_DEFINE(N, R, ET, TY)                                                                  \
    template <> struct attn_wgmma<N, ET> {                                                                \
        enum { acc_regs = R };                                                                            \
        template <int TRANS_B>                                                                            \
        static ATTN_DEV void ss(float (&d)[R], attn_u64 desc_a, attn_u64 desc_b, int scale_d) {           \
            if constexpr (TRANS_B)                                                                        \
                asm volatile(ATTN__WG_ASM(N, R, TY, SS, "1, 1, 0, 1")                                     \
                             : ATTN__WG_D##R(0) : "l"(desc_a), "l"(desc_b), "r"(scale_d) : "memory");     \
            else                                                                                          \
                asm volatile(ATTN__WG_ASM(N, R, TY, SS, "1, 1, 0, 0")                                     \
                             : ATTN__WG_D##R(0) : "l"(desc_a), "l"(desc_b), "r"(scale_d) : "memory");     \
        }                                                                                                 \
        template <int TRANS_B>                                                                            \
        static ATTN_DEV void rs(float (&d)[R], const attn_u32 (&a)[4], attn_u64 desc_b, int scale_d) {    \
            if constexpr (TRANS_B)                                                                        \
                asm volatile(ATTN__WG_ASM(N, R, TY, RS, "1, 1, 1")                                        \
                             : ATTN__WG_D##R(0)                                                           \
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)      \
                             : "memory");                                                                 \
            else                                                                                          \
                asm volatile(ATTN__WG_ASM(N, R, TY, RS, "1, 1, 0")                                        \
                             : ATTN__WG_D##R(0)                                                           \
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)      \
                             : "memory");                                                                 \
        }                                                                                                 \
    };
#define ATTN__WGMMA_DEFINE_N(N, R) ATTN__WGMMA_DEFINE(N, R, ATTN_DT_F16, "f16") ATTN__WGMMA_DEFINE(N, R, ATTN_DT_BF16, "bf16")

ATTN__WGMMA_DEFINE_N(16, 8)
ATTN__WGMMA_DEFINE_N(32, 16)
ATTN__WGMMA_DEFINE_N(64, 32)
ATTN__WGMMA_DEFINE_N(128, 64)
ATTN__WGMMA_DEFINE_N(256, 128)

#endif /* ATTN_WGMMA_CUH */
