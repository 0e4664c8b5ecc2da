/* wgmma_probe.cu - probes of kernels/wgmma.cuh, compiled for sm_90a and run by
   tests/wgmma_check.c (not embedded in attn.h). Each kernel is one warpgroup: launch one
   CTA of 128 threads with the dynamic shared memory the host names (tile bytes + 1024,
   the slack to round the base up to a 1024-byte boundary). Inputs are row-major 16-bit
   matrices in global memory (16-byte aligned); outputs are row-major f32, written
   through the documented accumulator layout (so a wrong layout shows as wrong elements).

   probe_qk_<N>_<type>(A, B, S)      S[64][N] = A[64][128] . B[N][128]^T
       A and B K-major from the swizzled layout (ss, tnspB 0), eight k16 steps, the first
       with scale-d 0 over NaN accumulators: QK^T of attention.
   probe_pv_rs(P, V, O)              O[64][128] = P[64][64] . V[64][128], bf16
       P loaded from global straight into the A register fragments (rs), V row-major in the
       swizzled layout as the MN-major B operand (tnspB 1): PV of attention.
   probe_pv_ss(P, V, O)              the same with P from shared memory (ss, K-major).
   probe_attn(Q, K, V, O)            O[64][128] = bf16(Q[64][128] . K[64][128]^T) . V[64][128]
       the FlashAttention-3 chain: the S accumulator turned into the A fragments of PV in
       registers (attn_wgmma_a_from_acc), no softmax.
   *status is set to 1 when the shared-memory base could not be 1024-aligned (the host
   names too little memory); the outputs are then left as they were. */
#include "attn_common.cuh"
#include "wgmma.cuh"

#define PROBE_THREADS 128

extern __shared__ attn_vec16 smem[]; /* the dynamic shared memory */

/* The first 1024-aligned shared address of the dynamic shared memory. */
ATTN_DEV attn_u32 probe_smem_base(const void *smem) { return (attn_smem_addr(smem) + 1023u) & ~1023u; }

ATTN_DEV bool probe_smem_ok(attn_u32 base, attn_u32 bytes, const void *smem, int *status) {
    if (base + bytes <= attn_smem_addr(smem) + attn_dynamic_smem_size()) return true;
    if (threadIdx.x == 0) *status = 1;
    return false;
}

/* Makes the cp.async copies of every thread visible to wgmma. */
ATTN_DEV void probe_tiles_ready(void) {
    attn_cp_async_commit();
    attn_cp_async_wait<0>();
    attn_wgmma_fence_smem_writes();
    __syncthreads();
}

/* The accumulator of m64nN, stored row-major into out[64][N] by the documented layout. */
template <int N> ATTN_DEV void probe_store(float *out, const float (&d)[N / 2]) {
    const int t = threadIdx.x, w = t / 32, g = (t % 32) / 4, q = t % 4;
#pragma unroll
    for (int i = 0; i < N / 8; i++) {
        int row = 16 * w + g, col = 8 * i + 2 * q;
        out[row * N + col] = d[4 * i + 0];
        out[row * N + col + 1] = d[4 * i + 1];
        out[(row + 8) * N + col] = d[4 * i + 2];
        out[(row + 8) * N + col + 1] = d[4 * i + 3];
    }
}

template <int R> ATTN_DEV void probe_fill_nan(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) d[i] = __int_as_float(0x7fc00000);
}

/* ---- S = A . B^T, K = 128 ---- */
template <int N, int ET> ATTN_DEV void probe_qk(const void *a, const void *b, float *s, int *status) {
    const attn_u32 base = probe_smem_base(smem), sa = base, sb = base + 64 * 256;
    float d[N / 2];
    if (!probe_smem_ok(base, 64 * 256 + N * 256, smem, status)) return;
    attn_wgmma_load_tile<64, 128, PROBE_THREADS>(sa, a, 256, threadIdx.x);
    attn_wgmma_load_tile<N, 128, PROBE_THREADS>(sb, b, 256, threadIdx.x);
    probe_tiles_ready();
    probe_fill_nan(d); /* scale-d 0 on the first step must ignore these */
    attn_wgmma_fence();
#pragma unroll
    for (int k = 0; k < 128; k += 16)
        attn_wgmma<N, ET>::template ss<0>(d, attn_wgmma_desc_k_major<64>(sa, k), attn_wgmma_desc_k_major<N>(sb, k), k > 0);
    attn_wgmma_commit();
    attn_wgmma_wait<0>();
    attn_wgmma_fence_acc(d);
    probe_store<N>(s, d);
}

extern "C" __global__ void __launch_bounds__(PROBE_THREADS) probe_qk_n64_bf16(const void *a, const void *b, float *s, int *status) {
    probe_qk<64, ATTN_DT_BF16>(a, b, s, status);
}
extern "C" __global__ void __launch_bounds__(PROBE_THREADS) probe_qk_n128_bf16(const void *a, const void *b, float *s, int *status) {
    probe_qk<128, ATTN_DT_BF16>(a, b, s, status);
}
extern "C" __global__ void __launch_bounds__(PROBE_THREADS) probe_qk_n64_f16(const void *a, const void *b, float *s, int *status) {
    probe_qk<64, ATTN_DT_F16>(a, b, s, status);
}

/* ---- O = P . V, P [64][64], V [64 keys][128] ---- */

/* P's A fragment of k16 step j straight from global memory (row-major [64][64]). */
ATTN_DEV void probe_load_a_fragment(attn_u32 (&a)[4], const attn_u16 *p, int j) {
    const int t = threadIdx.x, w = t / 32, g = (t % 32) / 4, q = t % 4;
    const attn_u16 *r0 = p + (16 * w + g) * 64 + 16 * j + 2 * q, *r8 = r0 + 8 * 64;
    a[0] = *(const attn_u32 *)r0;
    a[1] = *(const attn_u32 *)r8;
    a[2] = *(const attn_u32 *)(r0 + 8);
    a[3] = *(const attn_u32 *)(r8 + 8);
}

extern "C" __global__ void __launch_bounds__(PROBE_THREADS) probe_pv_rs(const attn_u16 *p, const void *v, float *o, int *status) {
    const attn_u32 sv = probe_smem_base(smem);
    attn_u32 a[4][4];
    float d[64];
    if (!probe_smem_ok(sv, 64 * 256, smem, status)) return;
    attn_wgmma_load_tile<64, 128, PROBE_THREADS>(sv, v, 256, threadIdx.x);
#pragma unroll
    for (int j = 0; j < 4; j++) probe_load_a_fragment(a[j], p, j);
    probe_tiles_ready();
    probe_fill_nan(d);
    attn_wgmma_fence(); /* the A registers and accumulators were just written */
#pragma unroll
    for (int j = 0; j < 4; j++)
        attn_wgmma<128, ATTN_DT_BF16>::rs<1>(d, a[j], attn_wgmma_desc_mn_major<64>(sv, 16 * j), j > 0);
    attn_wgmma_commit();
    attn_wgmma_wait<0>();
    attn_wgmma_fence_acc(d);
    probe_store<128>(o, d);
}

extern "C" __global__ void __launch_bounds__(PROBE_THREADS) probe_pv_ss(const void *p, const void *v, float *o, int *status) {
    const attn_u32 sp = probe_smem_base(smem), sv = sp + 64 * 128;
    float d[64];
    if (!probe_smem_ok(sp, 64 * 128 + 64 * 256, smem, status)) return;
    attn_wgmma_load_tile<64, 64, PROBE_THREADS>(sp, p, 128, threadIdx.x);
    attn_wgmma_load_tile<64, 128, PROBE_THREADS>(sv, v, 256, threadIdx.x);
    probe_tiles_ready();
    probe_fill_nan(d);
    attn_wgmma_fence();
#pragma unroll
    for (int k = 0; k < 64; k += 16)
        attn_wgmma<128, ATTN_DT_BF16>::ss<1>(d, attn_wgmma_desc_k_major<64>(sp, k), attn_wgmma_desc_mn_major<64>(sv, k), k > 0);
    attn_wgmma_commit();
    attn_wgmma_wait<0>();
    attn_wgmma_fence_acc(d);
    probe_store<128>(o, d);
}

/* ---- O = bf16(Q . K^T) . V: the S accumulator becomes P's A fragments ---- */
extern "C" __global__ void __launch_bounds__(PROBE_THREADS) probe_attn(const void *q, const void *k, const void *v, float *o, int *status) {
    const attn_u32 sq = probe_smem_base(smem), sk = sq + 64 * 256, sv = sk + 64 * 256;
    float s[32], acc[64];
    if (!probe_smem_ok(sq, 3 * 64 * 256, smem, status)) return;
    attn_wgmma_load_tile<64, 128, PROBE_THREADS>(sq, q, 256, threadIdx.x);
    attn_wgmma_load_tile<64, 128, PROBE_THREADS>(sk, k, 256, threadIdx.x);
    attn_wgmma_load_tile<64, 128, PROBE_THREADS>(sv, v, 256, threadIdx.x);
    probe_tiles_ready();
    probe_fill_nan(s);
    attn_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 128; kk += 16)
        attn_wgmma<64, ATTN_DT_BF16>::ss<0>(s, attn_wgmma_desc_k_major<64>(sq, kk), attn_wgmma_desc_k_major<64>(sk, kk), kk > 0);
    attn_wgmma_commit();
    attn_wgmma_wait<0>();
    attn_wgmma_fence_acc(s);
    attn_u32 a[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++) attn_wgmma_a_from_acc<ATTN_DT_BF16>(a[j], s, j);
    probe_fill_nan(acc);
    attn_wgmma_fence(); /* after writing the A registers and accumulators, before reading them */
#pragma unroll
    for (int j = 0; j < 4; j++)
        attn_wgmma<128, ATTN_DT_BF16>::rs<1>(acc, a[j], attn_wgmma_desc_mn_major<64>(sv, 16 * j), j > 0);
    attn_wgmma_commit();
    attn_wgmma_wait<0>();
    attn_wgmma_fence_acc(acc);
    probe_store<128>(o, acc);
}
