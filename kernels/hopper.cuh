/* hopper.cuh - the Hopper toolkit: tile copies by the tensor memory accelerator (TMA)
   completing on mbarriers, the full/empty stage pipeline a producer warp and consumer
   warpgroups share, the proxy fences, and register reallocation between warpgroups.
   sm_90 or newer (setmaxnreg: sm_90a only). Checked by `make hopper-check`
   (tests/hopper_probe.cu: compiled for sm_90 and sm_90a with no spill, and on a device of
   compute capability 9.0 run against the host).

   TMA. A tensor map (attn_tma_map: CUtensorMap, 128 opaque bytes, 64-aligned) is encoded
   on the host by the driver's cuTensorMapEncodeTiled (attn.h: attn__tma_encode) and passed
   to the kernel by value as a `const __grid_constant__ attn_tma_map` parameter, so the
   copy engine reads it from the parameter space. attn_tma_load_Nd copies the box at the
   given coordinates (innermost first, in elements) into shared memory at `dst` (its
   shared-window address, 128-byte aligned; 1024 for the 128B swizzle so that the pattern
   lines up with kernels/wgmma.cuh's descriptors) and adds the box's bytes to the
   transaction count of the mbarrier `bar`. Coordinates past the tensor's extent read as
   zero (the box is always whole in shared memory, and always counts all its bytes).

   MBARRIERS. A 64-bit barrier in shared memory with an arrival count and a transaction
   count; its phase completes when both reach zero, and a waiter names the phase by its
   parity (0, 1, 0, ...). A full barrier per stage (count 1: the producer's
   arrive_expect_tx, then the TMA bytes) tells consumers the stage has landed; an empty
   barrier per stage (count: the consumer warps, one arrival each) tells the producer the
   stage may be overwritten. Nobody meets at a CTA-wide barrier inside the main loop.

     producer, tile t:  s = t % S, n = t / S
                        wait empty[s] parity (n + 1) & 1 (the first round passes at once)
                        arrive_expect_tx full[s] bytes; TMA loads ... -> full[s]
     consumer, tile t:  wait full[s] parity n & 1; use stage s; one lane per warp arrives
                        on empty[s]

   attn_pipe_state walks (stage, phase) for either side. Initialise the barriers from one
   thread (attn_mbar_init), then attn_mbar_init_fence and a __syncthreads before any
   thread waits or any copy names them. */
#ifndef ATTN_HOPPER_CUH
#define ATTN_HOPPER_CUH

#include "attn_common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "hopper.cuh: TMA and the mbarrier transaction counts need sm_90 or newer"
#endif

/* CUtensorMap, as the driver lays it out (cuda.h: CU_TENSOR_MAP_NUM_QWORDS 16). */
struct __align__(64) attn_tma_map {
    attn_u64 opaque[16];
};

/* ---- mbarriers (shared-window addresses, 8-byte aligned) ---- */

ATTN_DEV void attn_mbar_init(attn_u32 bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* after the inits, before the __syncthreads that publishes them: visible to the copy
   engine (the async proxy) as well as to the other threads */
ATTN_DEV void attn_mbar_init_fence(void) { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

/* one arrival, and `bytes` more expected from copies (the producer, once per stage fill) */
ATTN_DEV void attn_mbar_arrive_expect_tx(attn_u32 bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
/* one arrival (a consumer warp's lane, done with a stage) */
ATTN_DEV void attn_mbar_arrive(attn_u32 bar) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* one arrival on `bar` made when every cp.async this thread issued before it has landed
   (.noinc: the barrier's expected count includes this arrival). The bytes land through the
   generic proxy: a reader through the async proxy (wgmma) issues attn_fence_proxy_async
   after its wait. */
ATTN_DEV void attn_cp_async_mbar_arrive(attn_u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
/* whether the phase of parity `parity` has completed (try_wait: the hardware may suspend
   the thread for a while before answering no) */
ATTN_DEV int attn_mbar_try_wait(attn_u32 bar, unsigned parity) {
    attn_u32 done;
    asm volatile(
        "{\n"
        "  .reg .pred p;\n"
        "  mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        "  selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return (int)done;
}
ATTN_DEV void attn_mbar_wait(attn_u32 bar, unsigned parity) {
    while (!attn_mbar_try_wait(bar, parity)) {
    }
}

/* (stage, phase) of a pipeline of S stages, advanced once per tile by each side */
template <int S> struct attn_pipe_state {
    int stage;
    unsigned phase; /* parity of the round: flips each time stage wraps to 0 */
    ATTN_DEV void advance() {
        if (++stage == S) {
            stage = 0;
            phase ^= 1u;
        }
    }
};

/* ---- TMA tile loads (global -> shared, completing on an mbarrier) ---- */

/* a bulk prefetch of `bytes` (a multiple of 16, from 16-aligned global memory) into L2 */
ATTN_DEV void attn_prefetch_l2_bulk(const void *gmem, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(gmem), "r"(bytes) : "memory");
}
ATTN_DEV void attn_tma_prefetch_map(const attn_tma_map *map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"((attn_u64)map) : "memory");
}
ATTN_DEV void attn_tma_load_2d(attn_u32 dst, const attn_tma_map *map, int c0, int c1, attn_u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"((attn_u64)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
ATTN_DEV void attn_tma_load_3d(attn_u32 dst, const attn_tma_map *map, int c0, int c1, int c2, attn_u32 bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                 ::"r"(dst), "l"((attn_u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
/* the same with an L2 eviction policy (attn_l2_evict_first_policy): data read once */
ATTN_DEV void attn_tma_load_3d_hint(attn_u32 dst, const attn_tma_map *map, int c0, int c1, int c2, attn_u32 bar,
                                    attn_u64 policy) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;"
                 ::"r"(dst), "l"((attn_u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
                 : "memory");
}
/* an L2 cache policy: evict these lines first */
ATTN_DEV attn_u64 attn_l2_evict_first_policy(void) {
    attn_u64 policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}
ATTN_DEV void attn_tma_load_4d(attn_u32 dst, const attn_tma_map *map, int c0, int c1, int c2, int c3, attn_u32 bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
                 ::"r"(dst), "l"((attn_u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
ATTN_DEV void attn_tma_load_5d(attn_u32 dst, const attn_tma_map *map, int c0, int c1, int c2, int c3, int c4,
                               attn_u32 bar) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
                 ::"r"(dst), "l"((attn_u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
                 : "memory");
}

/* the same load multicast: the box lands at `dst` (an offset in this CTA's shared window) in
   every CTA of the cluster whose bit is set in `cta_mask`, completing bytes on the mbarrier
   at `bar`'s offset in each of them */
ATTN_DEV void attn_tma_load_3d_multicast(attn_u32 dst, const attn_tma_map *map, int c0, int c1, int c2, attn_u32 bar,
                                         unsigned short cta_mask) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;"
                 ::"r"(dst), "l"((attn_u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask)
                 : "memory");
}

/* ---- thread-block clusters (a launch with a cluster dimension; 1 CTA otherwise) ---- */
ATTN_DEV unsigned attn_cluster_rank(void) {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
ATTN_DEV unsigned attn_cluster_size(void) {
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}
/* every thread of every CTA of the cluster meets (release / acquire at cluster scope) */
ATTN_DEV void attn_cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* an arrival on the mbarrier at `bar`'s offset in CTA `cta` of the cluster (this one too) */
ATTN_DEV void attn_mbar_arrive_remote(attn_u32 bar, unsigned cta) {
    asm volatile("{\n\t.reg .b32 ra;\n\tmapa.shared::cluster.u32 ra, %0, %1;\n\t"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n\t}" ::"r"(bar), "r"(cta)
                 : "memory");
}
/* attn_mbar_wait at cluster scope: what the arriving CTAs did before their arrivals (remote
   ones included) is visible after it */
ATTN_DEV void attn_mbar_wait_cluster(attn_u32 bar, unsigned parity) {
    attn_u32 done = 0;
    while (!done)
        asm volatile(
            "{\n"
            "  .reg .pred p;\n"
            "  mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
            "  selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
}

/* ---- fences ---- */

/* ordinary shared-memory stores (st.shared, stmatrix) that the copy engine or the tensor
   cores read next: each writing thread, before the barrier that hands them over */
ATTN_DEV void attn_fence_proxy_async(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* ---- named barriers: a subset of the CTA's warps meets (id 1..15; id 0 is __syncthreads).
   `threads` is a multiple of 32: every warp that takes part, all its lanes. ---- */
ATTN_DEV void attn_named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
/* arrive without waiting: with bar.sync by the other warps, a one-way signal (threads is the
   total of both sides) */
ATTN_DEV void attn_named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/* ---- register reallocation between warpgroups (sm_90a) ----
   In effect only when the kernel has a register cap at entry (__launch_bounds__(threads, 1))
   and each warpgroup's role is one branch of an if/else: the producer gives registers
   back (dec), the consumers take them (inc); N a multiple of 8 in 24..256. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int N> ATTN_DEV void attn_regs_release(void) {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N> ATTN_DEV void attn_regs_acquire(void) {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
#endif

#endif /* ATTN_HOPPER_CUH */
