/* hopper_probe.cu - probes of kernels/hopper.cuh, compiled by tests/hopper_check.c for sm_90
   and sm_90a and run on a device of compute capability 9.0 against the host.

   Every probe is a producer/consumer pipeline: one producer thread streams tiles through
   STAGES shared-memory stages by TMA (full barrier: its arrive_expect_tx and the copy's
   bytes; empty barrier: one arrival per consumer warp), and four consumer warps read each
   stage through the 128B swizzle and write it back out. The output equals the input bit
   for bit only if every tile landed whole, in its stage, before it was read, and no stage
   was overwritten while still being read (each tile's values differ). Waits are bounded:
   a stuck barrier sets *status to 2 and the probe returns instead of hanging (the check
   also times the launch out). */
#include "hopper.cuh"

#define STAGES 3
#define TIMEOUT_NS 2000000000ull /* 2 s of %globaltimer */

ATTN_DEV attn_u64 probe_time_ns(void) {
    attn_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* attn_mbar_wait with a deadline: 0 (and *status 2) when the phase never completes */
ATTN_DEV int probe_wait(attn_u32 bar, unsigned parity, int *status) {
    const attn_u64 t0 = probe_time_ns();
    while (!attn_mbar_try_wait(bar, parity))
        if (probe_time_ns() - t0 > TIMEOUT_NS) {
            atomicExch(status, 2);
            return 0;
        }
    return 1;
}
/* the 1024-aligned base of dynamic shared memory (the launch gives 1 KiB of slack) */
ATTN_DEV attn_u32 probe_smem_base(void) {
    extern __shared__ attn_vec16 probe_smem[];
    const attn_u32 a = attn_smem_addr(probe_smem);
    return (a + 1023u) & ~1023u;
}
/* 16 bytes of shared memory at a shared-window address */
ATTN_DEV attn_vec16 probe_lds16(attn_u32 addr) {
    attn_vec16 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
/* byte offset of 16-byte chunk j (0..7) of row r in a 128B-swizzled tile of 128-byte rows */
ATTN_DEV attn_u32 probe_swizzle(int r, int j) { return (attn_u32)(r * 128 + ((j ^ (r & 7)) << 4)); }

/* The pipeline's barriers: full[STAGES] then empty[STAGES] at `bars` (8 bytes each). */
ATTN_DEV void probe_init_barriers(attn_u32 bars, int tid) {
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            attn_mbar_init(bars + 8 * s, 1);            /* full: the producer's arrival (+ bytes) */
            attn_mbar_init(bars + 8 * (STAGES + s), 4); /* empty: one arrival per consumer warp */
        }
        attn_mbar_init_fence();
    }
    __syncthreads();
}

/* ---- probe_tma_rows: a row-major [rows][cols] 16-bit matrix, a CTA per 64 rows ----
   map: 2-D, dims {cols, rows}, box {64, 64}, 128B swizzle. Tile t = columns 64t..64t+63;
   a stage holds one 64 x 64 box (8 KiB). Rows past `rows` come in as zero: the consumers
   check that (*status 3 otherwise). Block: 160 threads (warps 0-3 consume, warp 4
   produces); dynamic shared memory STAGES * 8 KiB + 1 KiB. */
ATTN_DEV void probe_rows_body(const attn_tma_map *map, attn_u16 *y, int rows, int cols, int *status, int tid,
                              int producer) {
    const attn_u32 base = probe_smem_base(), bars = base + STAGES * 8192;
    const int row0 = blockIdx.x * 64, ntiles = cols / 64;
    if (producer) {
        if ((tid & 31) == 0) {
            attn_tma_prefetch_map(map);
            attn_pipe_state<STAGES> st = {0, 0u};
            for (int t = 0; t < ntiles; t++, st.advance()) {
                if (!probe_wait(bars + 8 * (STAGES + st.stage), st.phase ^ 1u, status)) return;
                attn_mbar_arrive_expect_tx(bars + 8 * st.stage, 8192);
                attn_tma_load_2d(base + st.stage * 8192, map, 64 * t, row0, bars + 8 * st.stage);
            }
        }
        return;
    }
    attn_pipe_state<STAGES> st = {0, 0u};
    for (int t = 0; t < ntiles; t++, st.advance()) {
        if (!probe_wait(bars + 8 * st.stage, st.phase, status)) return;
        for (int i = tid; i < 64 * 8; i += 128) { /* 64 rows x 8 chunks of 16 bytes */
            const int r = i >> 3, j = i & 7;
            const attn_vec16 v = probe_lds16(base + st.stage * 8192 + probe_swizzle(r, j));
            if (row0 + r < rows) *(attn_vec16 *)(y + (attn_i64)(row0 + r) * cols + 64 * t + 8 * j) = v;
            else if (v.x | v.y | v.z | v.w) atomicExch(status, 3);
        }
        __syncwarp();
        if ((tid & 31) == 0) attn_mbar_arrive(bars + 8 * (STAGES + st.stage));
    }
}

extern "C" __global__ void __launch_bounds__(160, 1)
    probe_tma_rows(const __grid_constant__ attn_tma_map map, attn_u16 *y, int rows, int cols, int *status) {
    probe_init_barriers(probe_smem_base() + STAGES * 8192, threadIdx.x);
    probe_rows_body(&map, y, rows, cols, status, threadIdx.x, threadIdx.x >= 128);
}

/* ---- probe_tma_paged: K and V rows of one KV head, block by block, from a paged cache ----
   The cache [num_blocks][2][BLOCK][heads][128] 16-bit, as attn.h's standard cache; map:
   5-D, dims {128, heads, BLOCK, 2, num_blocks}, box {64, 1, BLOCK, 1, 1}, 128B swizzle: one
   box is a block's BLOCK rows of 64 columns of one head. Tile t = block block_table[t]: a
   stage holds [K cols 0-63][K cols 64-127][V 0-63][V 64-127], BLOCK x 128 bytes each (the
   wgmma K-major layout of kernels/wgmma.cuh). CTA h reads head h; out_k/out_v [heads]
   [nblk * BLOCK][128]. Block: 160 threads; shared memory STAGES * 4 * BLOCK * 128 + 1 KiB. */
#define BLOCK 16
#define PAGED_STAGE (4 * BLOCK * 128)
extern "C" __global__ void __launch_bounds__(160, 1)
    probe_tma_paged(const __grid_constant__ attn_tma_map map, const int *block_table, int nblk, attn_u16 *out_k,
                    attn_u16 *out_v, int *status) {
    const int tid = threadIdx.x, head = blockIdx.x;
    const attn_u32 base = probe_smem_base(), bars = base + STAGES * PAGED_STAGE;
    probe_init_barriers(bars, tid);
    if (tid >= 128) {
        if (tid == 128) {
            attn_pipe_state<STAGES> st = {0, 0u};
            for (int t = 0; t < nblk; t++, st.advance()) {
                const int b = block_table[t];
                const attn_u32 dst = base + st.stage * PAGED_STAGE;
                if (!probe_wait(bars + 8 * (STAGES + st.stage), st.phase ^ 1u, status)) return;
                attn_mbar_arrive_expect_tx(bars + 8 * st.stage, PAGED_STAGE);
                for (int q = 0; q < 4; q++) /* K, V (coordinate 3) x column halves (coordinate 0) */
                    attn_tma_load_5d(dst + q * BLOCK * 128, &map, 64 * (q & 1), head, 0, q >> 1, b, bars + 8 * st.stage);
            }
        }
        return;
    }
    attn_pipe_state<STAGES> st = {0, 0u};
    for (int t = 0; t < nblk; t++, st.advance()) {
        if (!probe_wait(bars + 8 * st.stage, st.phase, status)) return;
        for (int i = tid; i < 4 * BLOCK * 8; i += 128) {
            const int q = i / (BLOCK * 8), r = (i >> 3) % BLOCK, j = i & 7;
            const attn_vec16 v = probe_lds16(base + st.stage * PAGED_STAGE + q * BLOCK * 128 + probe_swizzle(r, j));
            attn_u16 *dst = (q >> 1 ? out_v : out_k) + ((attn_i64)head * nblk * BLOCK + t * BLOCK + r) * 128 + 64 * (q & 1) + 8 * j;
            *(attn_vec16 *)dst = v;
        }
        __syncwarp();
        if ((tid & 31) == 0) attn_mbar_arrive(bars + 8 * (STAGES + st.stage));
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* ---- probe_tma_rows_ws (sm_90a): probe_tma_rows with warpgroup roles and setmaxnreg ----
   256 threads: warpgroup 0 consumes (its first four warps, as above) after taking
   registers (232), warpgroup 1 produces from its first lane after giving them back (40). */
extern "C" __global__ void __launch_bounds__(256, 1)
    probe_tma_rows_ws(const __grid_constant__ attn_tma_map map, attn_u16 *y, int rows, int cols, int *status) {
    probe_init_barriers(probe_smem_base() + STAGES * 8192, threadIdx.x);
    if (threadIdx.x >= 128) {
        attn_regs_release<40>();
        if (threadIdx.x < 160) probe_rows_body(&map, y, rows, cols, status, threadIdx.x, 1);
    } else {
        attn_regs_acquire<232>();
        probe_rows_body(&map, y, rows, cols, status, threadIdx.x, 0);
    }
}
#endif
