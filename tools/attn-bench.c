#define _POSIX_C_SOURCE 200809L
/* attn-bench: the CPU backend of attn.h against this machine's own ceilings, in one run.

   1. Ceilings, measured here and now with one thread per online core:
        memory read  - each thread sums its own slice of a 1 GiB buffer (far beyond any L3)
                       with the widest vector loads and 8 independent accumulators; best pass.
        FP32 FMA     - 16 independent FMA chains per thread in the widest vectors (AVX-512,
                       else AVX2, else scalar), 2 flops per lane per FMA; best pass.
   2. attn.h, timed through its public API (context, layer, metadata, forward, MLA
      forward_mqa). The tool itself is built with the implementation and still reaches some
      private names: its CUDA part's ceilings (attn_read_probe through attn__cuda_load), the
      compile-time table (attn__cuda_layer_variants) and the tuning knobs that recompile a
      layer's decode kernel (ATTN_BENCH_*_DEFINES); issue 21 moves those to public seams:
        decode   - 32 query / 8 KV heads, head 128, context 4096, batch 1 and 8, KV cache f16,
                   f32 and bf16 (q/out in the same dtype). Metric: GB/s of KV read, against
                   the best read ceiling of the run, and GB/s per core. Every iteration reads a different set of blocks (randomly
                   shuffled block ids) out of >= 640 MiB of cache, so nothing is served from
                   the previous iteration's L3 contents.
        prefill  - 512 and 2048 tokens, causal, same heads, batch 1, f16. Metric: GFLOP/s
                   over unmasked (query, key) pairs only, 4 * head * heads * L(L+1)/2,
                   against the FP32 FMA ceiling (the CPU backend computes in fp32).
        mla      - MLA absorbed decode, attn_mla_forward_mqa: 16 and 128 heads, context 4096,
                   batch 1 and 4, latent cache bf16 and f16 (q [b, H, 576] and out_latent
                   [b, H, 512] in the same dtype), block size 16, shuffled block ids,
                   num_kv_splits automatic. Every iteration uses another metadata over a
                   disjoint block set of a 648 MiB latent cache (> the 260 MiB L3). Metrics:
                   GB/s of latent read (b * 4096 * 576 * 2 bytes / time) against the read
                   ceiling, and GFLOP/s = 2 * b * H * 4096 * (576 + 512) / time against the
                   FMA ceiling. The roofline (intensity 1.89 * H flop/byte vs the machine
                   balance) says which bound applies and the best reachable fraction.
      Only attn_layer_forward / attn_mla_forward_mqa is timed: metadata is built beforehand
      (one build per block set) and K/V (latents) are already in the cache (k = v = NULL),
      so the numbers are attention.
      The read ceiling of a shared VM moves during a run (on the AMD VMs of BENCHMARKS.md it
      is bimodal), so it is measured again around every decode case; read-bound rows are
      reported against the best read ceiling seen in the run, and per core (GB/s divided by
      the library's threads).
   3. A markdown table for BENCHMARKS.md, under a line naming the CPU (model, family/model,
      the SIMD flags that matter to the kernels), and the command line that produced it.

   Build: make build/attn-bench.  Usage: attn-bench [--threads N] [--quick]
   [--case decode|prefill|mla|all] */
#define ATTN_IMPLEMENTATION
#include "attn.h"

/* The address of a host slot-mapping view over n slots (a compound literal of the block). */
#define ATTN_SLOTS(s, n) (&(attn_tensor[1]){attn_tensor_slots((s), (n))}[0])

#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

#define MIB (1024.0 * 1024.0)
#define BENCH_HEADS 32
#define BENCH_KV_HEADS 8
#define BENCH_HEAD_SIZE 128
#define BENCH_BLOCK 16
#define BENCH_CONTEXT 4096
#define BENCH_ROTATE_BYTES ((size_t)640 << 20) /* decode KV rotated through >= this */
#define BENCH_READ_BYTES ((size_t)1 << 30)     /* memory-read ceiling buffer */
/* MLA decode (DeepSeek-V2/V3 dims): latent row = kv_c (512) | k_pe (64). */
#define BENCH_MLA_RANK 512
#define BENCH_MLA_ROPE 64
#define BENCH_MLA_HEAD (BENCH_MLA_RANK + BENCH_MLA_ROPE) /* 576 */
#define BENCH_MLA_NOPE 128
#define BENCH_MLA_V 128
#define BENCH_MLA_BLOCK 16
#define BENCH_MLA_MAX_BATCH 4
/* Sequences of 4096 tokens in the latent cache: 144 x 4.5 MiB = 648 MiB (bf16/f16), a
   multiple of every batch size used, so batch b rotates over 144/b disjoint block sets. */
#define BENCH_MLA_SEQS 144

/* ---------------------------------------------------------------------------------------
   Small helpers: time, random numbers, allocation, failure
   ------------------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) { /* xorshift64 */
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static float rng_unit(uint64_t *s) { /* uniform in [-1, 1) */
    return (float)((double)(rng_next(s) >> 40) / (double)(1u << 23) - 1.0);
}

static uint64_t rng_seed(uint64_t x) { return x * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull; }

static void *bench_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0 || !p) {
        fprintf(stderr, "attn-bench: cannot allocate %.1f MiB\n", (double)bytes / MIB);
        exit(1);
    }
    return p;
}

static void bench_check(attn_context *ctx, attn_status st, const char *what) {
    if (st == ATTN_OK) return;
    fprintf(stderr, "attn-bench: %s failed: %s: %s\n", what, attn_status_string(st),
            attn_context_last_error(ctx));
    exit(1);
}
#define CHECK(ctx, call) bench_check((ctx), (call), #call)

/* Random values in [-1, 1) in the given dtype. For large f16/bf16 buffers the values come
   from a 64 Ki-entry table of converted random floats (converting 300M elements one by one
   would dominate the run); every element is still independently drawn. */
static void fill_random(void *data, attn_dtype dt, size_t n, uint64_t seed) {
    uint64_t s = rng_seed(seed);
    size_t i;
    if (dt == ATTN_DTYPE_F32) {
        float *f = (float *)data;
        for (i = 0; i < n; i++) f[i] = rng_unit(&s);
        return;
    }
    if (attn_dtype_size(dt) == 1) { /* 8-bit caches: codes of values in [-1, 1) / (1/64) (int8: -127..127) */
        uint8_t table[256], *c = (uint8_t *)data;
        for (i = 0; i < 256; i++) {
            float x = rng_unit(&s) * 64.0f;
            table[i] = dt == ATTN_DTYPE_FP8_E4M3 ? attn_f32_to_fp8_e4m3(x)
                       : dt == ATTN_DTYPE_FP8_E5M2 ? attn_f32_to_fp8_e5m2(x)
                                                  : (uint8_t)(int8_t)(int)(rng_unit(&s) * 127.0f);
        }
        for (i = 0; i < n; i++) c[i] = table[(rng_next(&s) >> 32) & 255];
        return;
    }
    if (n < ((size_t)1 << 20)) {
        uint16_t *h = (uint16_t *)data;
        for (i = 0; i < n; i++)
            h[i] = dt == ATTN_DTYPE_F16 ? attn_f32_to_f16(rng_unit(&s)) : attn_f32_to_bf16(rng_unit(&s));
        return;
    }
    {
        uint16_t *table = (uint16_t *)bench_alloc(65536 * sizeof(uint16_t));
        uint16_t *h = (uint16_t *)data;
        for (i = 0; i < 65536; i++)
            table[i] = dt == ATTN_DTYPE_F16 ? attn_f32_to_f16(rng_unit(&s)) : attn_f32_to_bf16(rng_unit(&s));
        for (i = 0; i + 4 <= n; i += 4) {
            uint64_t r = rng_next(&s);
            h[i] = table[r & 0xffff];
            h[i + 1] = table[(r >> 16) & 0xffff];
            h[i + 2] = table[(r >> 32) & 0xffff];
            h[i + 3] = table[(r >> 48) & 0xffff];
        }
        for (; i < n; i++) h[i] = table[rng_next(&s) & 0xffff];
        free(table);
    }
}

static void shuffle_ids(int32_t *ids, int n, uint64_t seed) {
    uint64_t s = rng_seed(seed);
    int i;
    for (i = 0; i < n; i++) ids[i] = i;
    for (i = n - 1; i > 0; i--) {
        int j = (int)(rng_next(&s) % (uint64_t)(i + 1));
        int32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

/* Sorts t in place; returns the median. */
static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Every output element must be finite: a broken kernel must not pass as a fast one. */
static void check_finite(const void *data, attn_dtype dt, size_t n, const char *name) {
    size_t i;
    for (i = 0; i < n; i++) {
        float x = dt == ATTN_DTYPE_F32 ? ((const float *)data)[i]
                : dt == ATTN_DTYPE_F16 ? attn_f16_to_f32(((const uint16_t *)data)[i])
                                       : attn_bf16_to_f32(((const uint16_t *)data)[i]);
        if (!isfinite(x)) {
            fprintf(stderr, "attn-bench: %s: output element %zu is not finite (%g)\n", name, i,
                    (double)x);
            exit(1);
        }
    }
}

/* ---------------------------------------------------------------------------------------
   Ceilings: memory read bandwidth and FP32 FMA throughput, one thread per online core
   ------------------------------------------------------------------------------------- */

#if defined(__AVX512F__)
#define CEIL_SIMD "AVX-512"
#define CEIL_LANES 16
#elif defined(__AVX2__) && defined(__FMA__)
#define CEIL_SIMD "AVX2+FMA"
#define CEIL_LANES 8
#else
#define CEIL_SIMD "scalar"
#define CEIL_LANES 1
#endif
#define READ_UNROLL 128 /* floats per loop iteration: 8 accumulators x 16 lanes */
#define FMA_CHAINS 16

/* Sums n floats (n a multiple of READ_UNROLL, p 64-byte aligned) with 8 independent sums. */
static float read_sum(const float *p, size_t n) {
    float lanes[128];
    float total = 0.0f;
    size_t i;
    int k, nl;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (i = 0; i < n; i += 128) {
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
        a4 = _mm512_add_ps(a4, _mm512_load_ps(p + i + 64));
        a5 = _mm512_add_ps(a5, _mm512_load_ps(p + i + 80));
        a6 = _mm512_add_ps(a6, _mm512_load_ps(p + i + 96));
        a7 = _mm512_add_ps(a7, _mm512_load_ps(p + i + 112));
    }
    _mm512_storeu_ps(lanes, a0); _mm512_storeu_ps(lanes + 16, a1);
    _mm512_storeu_ps(lanes + 32, a2); _mm512_storeu_ps(lanes + 48, a3);
    _mm512_storeu_ps(lanes + 64, a4); _mm512_storeu_ps(lanes + 80, a5);
    _mm512_storeu_ps(lanes + 96, a6); _mm512_storeu_ps(lanes + 112, a7);
    nl = 128;
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (i = 0; i < n; i += 64) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
        a4 = _mm256_add_ps(a4, _mm256_load_ps(p + i + 32));
        a5 = _mm256_add_ps(a5, _mm256_load_ps(p + i + 40));
        a6 = _mm256_add_ps(a6, _mm256_load_ps(p + i + 48));
        a7 = _mm256_add_ps(a7, _mm256_load_ps(p + i + 56));
    }
    _mm256_storeu_ps(lanes, a0); _mm256_storeu_ps(lanes + 8, a1);
    _mm256_storeu_ps(lanes + 16, a2); _mm256_storeu_ps(lanes + 24, a3);
    _mm256_storeu_ps(lanes + 32, a4); _mm256_storeu_ps(lanes + 40, a5);
    _mm256_storeu_ps(lanes + 48, a6); _mm256_storeu_ps(lanes + 56, a7);
    nl = 64;
#else
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (i = 0; i < n; i += 8) {
        s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3];
        s4 += p[i + 4]; s5 += p[i + 5]; s6 += p[i + 6]; s7 += p[i + 7];
    }
    lanes[0] = s0; lanes[1] = s1; lanes[2] = s2; lanes[3] = s3;
    lanes[4] = s4; lanes[5] = s5; lanes[6] = s6; lanes[7] = s7;
    nl = 8;
#endif
    for (k = 0; k < nl; k++) total += lanes[k];
    return total;
}

/* iters rounds of FMA_CHAINS independent x = x * b + c chains; x converges to 1, so no
   overflow and no denormals. Returns a value that depends on every chain. */
static float fma_chains(long iters, float seed) {
    float lanes[FMA_CHAINS * CEIL_LANES];
    float total = 0.0f;
    long it;
    int k;
#if defined(__AVX512F__)
    const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
    __m512 x0 = _mm512_set1_ps(seed), x1 = _mm512_set1_ps(seed + 0.01f),
           x2 = _mm512_set1_ps(seed + 0.02f), x3 = _mm512_set1_ps(seed + 0.03f),
           x4 = _mm512_set1_ps(seed + 0.04f), x5 = _mm512_set1_ps(seed + 0.05f),
           x6 = _mm512_set1_ps(seed + 0.06f), x7 = _mm512_set1_ps(seed + 0.07f),
           x8 = _mm512_set1_ps(seed + 0.08f), x9 = _mm512_set1_ps(seed + 0.09f),
           x10 = _mm512_set1_ps(seed + 0.10f), x11 = _mm512_set1_ps(seed + 0.11f),
           x12 = _mm512_set1_ps(seed + 0.12f), x13 = _mm512_set1_ps(seed + 0.13f),
           x14 = _mm512_set1_ps(seed + 0.14f), x15 = _mm512_set1_ps(seed + 0.15f);
#define FMA_STEP(x) x = _mm512_fmadd_ps(x, b, c)
#define FMA_STORE(x, k) _mm512_storeu_ps(lanes + (k) * 16, x)
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
    __m256 x0 = _mm256_set1_ps(seed), x1 = _mm256_set1_ps(seed + 0.01f),
           x2 = _mm256_set1_ps(seed + 0.02f), x3 = _mm256_set1_ps(seed + 0.03f),
           x4 = _mm256_set1_ps(seed + 0.04f), x5 = _mm256_set1_ps(seed + 0.05f),
           x6 = _mm256_set1_ps(seed + 0.06f), x7 = _mm256_set1_ps(seed + 0.07f),
           x8 = _mm256_set1_ps(seed + 0.08f), x9 = _mm256_set1_ps(seed + 0.09f),
           x10 = _mm256_set1_ps(seed + 0.10f), x11 = _mm256_set1_ps(seed + 0.11f),
           x12 = _mm256_set1_ps(seed + 0.12f), x13 = _mm256_set1_ps(seed + 0.13f),
           x14 = _mm256_set1_ps(seed + 0.14f), x15 = _mm256_set1_ps(seed + 0.15f);
#define FMA_STEP(x) x = _mm256_fmadd_ps(x, b, c)
#define FMA_STORE(x, k) _mm256_storeu_ps(lanes + (k) * 8, x)
#else
    const float b = 0.999999f, c = 1e-6f;
    float x0 = seed, x1 = seed + 0.01f, x2 = seed + 0.02f, x3 = seed + 0.03f,
          x4 = seed + 0.04f, x5 = seed + 0.05f, x6 = seed + 0.06f, x7 = seed + 0.07f,
          x8 = seed + 0.08f, x9 = seed + 0.09f, x10 = seed + 0.10f, x11 = seed + 0.11f,
          x12 = seed + 0.12f, x13 = seed + 0.13f, x14 = seed + 0.14f, x15 = seed + 0.15f;
#define FMA_STEP(x) x = fmaf(x, b, c)
#define FMA_STORE(x, k) lanes[k] = x
#endif
    for (it = 0; it < iters; it++) {
        FMA_STEP(x0); FMA_STEP(x1); FMA_STEP(x2); FMA_STEP(x3);
        FMA_STEP(x4); FMA_STEP(x5); FMA_STEP(x6); FMA_STEP(x7);
        FMA_STEP(x8); FMA_STEP(x9); FMA_STEP(x10); FMA_STEP(x11);
        FMA_STEP(x12); FMA_STEP(x13); FMA_STEP(x14); FMA_STEP(x15);
    }
    FMA_STORE(x0, 0); FMA_STORE(x1, 1); FMA_STORE(x2, 2); FMA_STORE(x3, 3);
    FMA_STORE(x4, 4); FMA_STORE(x5, 5); FMA_STORE(x6, 6); FMA_STORE(x7, 7);
    FMA_STORE(x8, 8); FMA_STORE(x9, 9); FMA_STORE(x10, 10); FMA_STORE(x11, 11);
    FMA_STORE(x12, 12); FMA_STORE(x13, 13); FMA_STORE(x14, 14); FMA_STORE(x15, 15);
#undef FMA_STEP
#undef FMA_STORE
    for (k = 0; k < FMA_CHAINS * CEIL_LANES; k++) total += lanes[k];
    return total;
}

typedef enum { CEIL_READ, CEIL_FMA } ceil_kind;

typedef struct {
    ceil_kind kind;
    int index, passes, fill;
    float *slice;          /* CEIL_READ: this thread's part of the buffer */
    size_t slice_floats;
    long fma_iters;        /* CEIL_FMA: rounds per pass */
    pthread_barrier_t *barrier;
    double *pass_times;    /* written by thread 0 */
    float sink;            /* keeps the work observable */
} ceil_thread;

static void *ceil_thread_main(void *varg) {
    ceil_thread *a = (ceil_thread *)varg;
    int p;
    float sink = 0.0f;
    if (a->kind == CEIL_READ && a->fill) /* first touch by the thread that reads it */
        fill_random(a->slice, ATTN_DTYPE_F32, a->slice_floats, 1000 + (uint64_t)a->index);
    pthread_barrier_wait(a->barrier);
    for (p = 0; p < a->passes; p++) {
        double t0;
        pthread_barrier_wait(a->barrier);
        t0 = now_s();
        if (a->kind == CEIL_READ) sink += read_sum(a->slice, a->slice_floats);
        else sink += fma_chains(a->fma_iters, 0.5f + 0.001f * (float)(a->index + p));
        pthread_barrier_wait(a->barrier);
        if (a->index == 0) a->pass_times[p] = now_s() - t0;
    }
    a->sink = sink;
    return NULL;
}

/* Runs a ceiling kernel on nthreads threads for `passes` passes; returns the best pass. */
static double ceil_run(ceil_kind kind, int nthreads, int passes, float *buf, size_t floats_per_thread,
                       int fill, long fma_iters) {
    pthread_t th[256];
    ceil_thread args[256];
    pthread_barrier_t barrier;
    double times[64], best;
    float sink = 0.0f;
    int i;
    if (pthread_barrier_init(&barrier, NULL, (unsigned)nthreads) != 0) {
        fprintf(stderr, "attn-bench: pthread_barrier_init failed\n");
        exit(1);
    }
    for (i = 0; i < nthreads; i++) {
        memset(&args[i], 0, sizeof args[i]);
        args[i].kind = kind;
        args[i].index = i;
        args[i].passes = passes;
        args[i].fill = fill;
        args[i].slice = buf ? buf + (size_t)i * floats_per_thread : NULL;
        args[i].slice_floats = floats_per_thread;
        args[i].fma_iters = fma_iters;
        args[i].barrier = &barrier;
        args[i].pass_times = times;
        if (pthread_create(&th[i], NULL, ceil_thread_main, &args[i]) != 0) {
            fprintf(stderr, "attn-bench: pthread_create failed\n");
            exit(1);
        }
    }
    for (i = 0; i < nthreads; i++) {
        pthread_join(th[i], NULL);
        sink += args[i].sink;
    }
    pthread_barrier_destroy(&barrier);
    if (!isfinite(sink)) fprintf(stderr, "attn-bench: note: ceiling checksum %g\n", (double)sink);
    best = times[0];
    for (i = 1; i < passes; i++)
        if (times[i] < best) best = times[i];
    return best;
}

/* ---------------------------------------------------------------------------------------
   Contention: how many cores other processes (and the hypervisor's steal) used meanwhile.
   Ceilings are best-of passes but cases are medians, so a busy machine would understate
   the fractions; every case reports this so a contended number is never taken at face value.
   ------------------------------------------------------------------------------------- */

typedef struct {
    double wall, self_cpu, busy_s; /* busy_s < 0: /proc/stat unreadable (not Linux) */
} load_probe;

static double cpu_busy_seconds(void) { /* all CPUs, from /proc/stat */
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    long tck = sysconf(_SC_CLK_TCK);
    int n;
    if (!f) return -1.0;
    n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
               &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 8 || tck <= 0) return -1.0;
    /* user nice system [idle iowait] irq softirq steal */
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)tck;
}

static void probe_start(load_probe *p) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    p->self_cpu = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    p->busy_s = cpu_busy_seconds();
    p->wall = now_s();
}

/* Average number of cores busy with something other than this process since probe_start;
   -1 when unknown. Resolution is the kernel tick (10 ms), fine over a whole case. */
static double probe_other_cores(const load_probe *p) {
    struct timespec ts;
    double self, busy = cpu_busy_seconds(), wall = now_s() - p->wall, other;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    self = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - p->self_cpu;
    if (busy < 0 || p->busy_s < 0 || wall <= 0) return -1.0;
    other = (busy - p->busy_s - self) / wall;
    return other < 0 ? 0.0 : other;
}

#define CONTENDED_CORES 0.15 /* flag a case when others used more than this many cores */

/* ---------------------------------------------------------------------------------------
   Results
   ------------------------------------------------------------------------------------- */

typedef struct {
    char name[96];
    double ms;          /* median */
    char metric[64];
    char ceiling[96];   /* fixed text; or, for read-bound rows, made at the end from: */
    double read_gbs;    /* > 0: GB/s read, reported against the run's best read ceiling */
    double gflops;      /*   with read_gbs: also against the FMA ceiling */
    double other_cores; /* contention during the case, -1 unknown */
} bench_row;

/* The result table grows as cases add rows (a fixed 64 once cut the default CUDA run short
   after the MLA 16-head rows); --selftest ROWS fills it past any real run. */
static bench_row *rows;
static int num_rows, cap_rows;

static bench_row *row_add(void) {
    if (num_rows == cap_rows) {
        int cap = cap_rows ? 2 * cap_rows : 64;
        bench_row *r = (bench_row *)realloc(rows, (size_t)cap * sizeof *r);
        if (!r) {
            fprintf(stderr, "attn-bench: out of memory for %d result rows\n", cap);
            exit(1);
        }
        rows = r;
        cap_rows = cap;
    }
    memset(&rows[num_rows], 0, sizeof rows[num_rows]);
    return &rows[num_rows++];
}

typedef struct {
    int quick;
    int threads;        /* attn_context_desc.num_threads (0 = library default) */
    int lib_threads;    /* the threads the library runs on (per-core figures) */
    double read_gbs;    /* ceilings: read at the start, the best and worst read seen */
    double read_best, read_worst;
    double fma_gflops;
    int cores;          /* read ceiling re-measure: threads, buffer, floats per thread */
    float *read_buf;
    size_t read_per_thread;
} bench_opts;

/* The read ceiling again (3 passes over the same 1 GiB): the VM's memory bandwidth moves
   during a run, and read-bound rows are reported against the best value seen. */
static double read_ceiling_again(bench_opts *o) {
    double t = ceil_run(CEIL_READ, o->cores, 3, o->read_buf, o->read_per_thread, 0, 0);
    double gbs = (double)(o->read_per_thread * (size_t)o->cores * sizeof(float)) / t / 1e9;
    if (gbs > o->read_best) o->read_best = gbs;
    if (gbs < o->read_worst) o->read_worst = gbs;
    return gbs;
}

/* How many timed runs: enough to fill the time target, within [min, max]. */
static int reps_for(const bench_opts *o, double one_run_s, int is_fast_case) {
    double target = o->quick ? 0.3 : 1.5;
    int lo = o->quick ? 5 : (is_fast_case ? 21 : 7), hi = o->quick ? 50 : 1001;
    double want = one_run_s > 0 ? target / one_run_s : (double)hi;
    int n = want > (double)hi ? hi : (int)want;
    if (n < lo) n = lo;
    return n | 1; /* odd: the median is one measured run */
}

/* ---------------------------------------------------------------------------------------
   Decode: one token per request over a 4096-token paged context
   ------------------------------------------------------------------------------------- */

static void bench_decode(attn_context *ctx, bench_opts *o, int batch, attn_dtype dtype,
                         attn_dtype cache_dtype, int per_token_head) {
    const int blocks_per_seq = BENCH_CONTEXT / BENCH_BLOCK;
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata **metas;
    attn_tensor kv, q, out;
    int64_t shape[ATTN_MAX_DIMS], qshape[3];
    int ndim, nsets, set, i, reps, warm, next = 0;
    int64_t num_blocks;
    size_t esz = attn_dtype_size(cache_dtype), kv_bytes_iter, kv_bytes_total;
    int32_t *ids, *table, *qsl, *seq_lens;
    void *kv_data, *q_data, *out_data;
    double *t, med, gbs, t_warm, other, read_before, read_after;
    load_probe probe;
    bench_row *row;

    memset(&d, 0, sizeof d);
    d.num_heads = BENCH_HEADS;
    d.num_kv_heads = BENCH_KV_HEADS;
    d.head_size = BENCH_HEAD_SIZE;
    d.dtype = dtype;
    d.kv_cache_dtype = cache_dtype;
    d.block_size = BENCH_BLOCK;
    if (per_token_head) d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD; /* scales in the cache */
    else d.k_scale.value = d.v_scale.value = 1.0f / 64;                 /* fp8: per-tensor scales */
    CHECK(ctx, attn_layer_create(ctx, &d, NULL, &layer));

    kv_bytes_iter = (size_t)batch * BENCH_CONTEXT * BENCH_KV_HEADS * (BENCH_HEAD_SIZE + (per_token_head ? 4 : 0)) * 2 * esz;
    nsets = (int)((BENCH_ROTATE_BYTES + kv_bytes_iter - 1) / kv_bytes_iter);
    if (nsets < 3) nsets = 3;
    num_blocks = (int64_t)nsets * batch * blocks_per_seq;
    CHECK(ctx, attn_layer_kv_cache_shape(layer, num_blocks, shape, &ndim));
    kv = attn_tensor_make(NULL, cache_dtype, ndim, shape);
    kv_bytes_total = attn_tensor_nbytes(&kv);
    kv.data = kv_data = bench_alloc(kv_bytes_total);
    fill_random(kv_data, cache_dtype, kv_bytes_total / esz, 7 + (uint64_t)batch);
    if (per_token_head) { /* the scale planes: 1/64 for every row (the codes are random) */
        size_t half = (size_t)BENCH_BLOCK * BENCH_KV_HEADS * (BENCH_HEAD_SIZE + 4), rows = (size_t)BENCH_BLOCK * BENCH_KV_HEADS;
        int64_t blk;
        size_t r;
        for (blk = 0; blk < 2 * num_blocks; blk++)
            for (r = 0; r < rows; r++) {
                float sc = 1.0f / 64;
                memcpy((char *)kv_data + (size_t)blk * half + rows * BENCH_HEAD_SIZE + r * 4, &sc, 4);
            }
    }

    qshape[0] = batch; qshape[1] = BENCH_HEADS; qshape[2] = BENCH_HEAD_SIZE;
    q_data = bench_alloc((size_t)batch * BENCH_HEADS * BENCH_HEAD_SIZE * attn_dtype_size(dtype));
    out_data = bench_alloc((size_t)batch * BENCH_HEADS * BENCH_HEAD_SIZE * attn_dtype_size(dtype));
    q = attn_tensor_make(q_data, dtype, 3, qshape);
    out = attn_tensor_make(out_data, dtype, 3, qshape);
    fill_random(q_data, dtype, (size_t)batch * BENCH_HEADS * BENCH_HEAD_SIZE, 11);
    fill_random(out_data, dtype, (size_t)batch * BENCH_HEADS * BENCH_HEAD_SIZE, 12);

    /* Block ids shuffled over the whole cache; set s owns ids[s*batch*bps ...]. */
    ids = (int32_t *)bench_alloc((size_t)num_blocks * sizeof(int32_t));
    shuffle_ids(ids, (int)num_blocks, 99 + (uint64_t)batch);
    qsl = (int32_t *)bench_alloc(((size_t)batch + 1) * sizeof(int32_t));
    seq_lens = (int32_t *)bench_alloc((size_t)batch * sizeof(int32_t));
    for (i = 0; i <= batch; i++) qsl[i] = i;
    for (i = 0; i < batch; i++) seq_lens[i] = BENCH_CONTEXT;
    metas = (attn_metadata **)bench_alloc((size_t)nsets * sizeof *metas);
    for (set = 0; set < nsets; set++) {
        attn_metadata_desc md;
        attn_batch b;
        memset(&md, 0, sizeof md);
        md.max_num_reqs = batch;
        md.max_num_tokens = batch;
        md.max_blocks_per_req = blocks_per_seq;
        md.num_blocks = num_blocks;
        CHECK(ctx, attn_metadata_create(layer, &md, &metas[set]));
        table = ids + (size_t)set * (size_t)batch * (size_t)blocks_per_seq;
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl;
        b.seq_lens = seq_lens;
        b.block_table = table;
        b.block_table_stride = blocks_per_seq;
        b.slot_mapping = NULL; /* the new token's K/V is already in the cache */
        b.num_reqs = batch;
        b.num_actual_tokens = batch;
        b.max_query_len = 1;
        b.max_seq_len = BENCH_CONTEXT;
        b.causal = ATTN_CAUSAL_YES;
        CHECK(ctx, attn_metadata_build(metas[set], 0, &b, 0));
    }

    /* Warm-up (also sizes the repetition count), then timed runs, each on the next set; the
       read ceiling right before and after. */
    read_before = read_ceiling_again(o);
    probe_start(&probe);
    warm = nsets < 3 ? nsets : 3;
    t_warm = 0.0;
    for (i = 0; i < warm; i++) {
        double t0 = now_s();
        CHECK(ctx, attn_layer_forward(layer, metas[next], &q, NULL, NULL, &kv, &out, NULL, NULL));
        t_warm = now_s() - t0;
        next = (next + 1) % nsets;
    }
    reps = reps_for(o, t_warm, 1);
    t = (double *)bench_alloc((size_t)reps * sizeof(double));
    for (i = 0; i < reps; i++) {
        double t0 = now_s();
        CHECK(ctx, attn_layer_forward(layer, metas[next], &q, NULL, NULL, &kv, &out, NULL, NULL));
        t[i] = now_s() - t0;
        next = (next + 1) % nsets;
    }
    other = probe_other_cores(&probe);
    read_after = read_ceiling_again(o);
    check_finite(out_data, dtype, (size_t)batch * BENCH_HEADS * BENCH_HEAD_SIZE, "decode");
    med = median(t, reps);
    gbs = (double)kv_bytes_iter / med / 1e9;

    row = row_add();
    snprintf(row->name, sizeof row->name, "decode b=%d ctx=%d, KV %s%s, q/out %s", batch,
             BENCH_CONTEXT, attn_dtype_name(cache_dtype), per_token_head ? " per token+head" : "",
             attn_dtype_name(dtype));
    row->ms = med * 1e3;
    snprintf(row->metric, sizeof row->metric, "%.1f GB/s KV read", gbs);
    row->read_gbs = gbs;
    row->other_cores = other;
    printf("%-40s %8.3f ms median (min %.3f, max %.3f, n=%d)  %7.1f GB/s  %5.1f%% of best read "
           "BW so far  %5.1f GB/s per core  [read BW before/after %.1f/%.1f GB/s; KV %.1f MiB/iter, "
           "rotated over %d sets = %.0f MiB; other load %.2f cores]\n",
           row->name, med * 1e3, t[0] * 1e3, t[reps - 1] * 1e3, reps, gbs, 100.0 * gbs / o->read_best,
           gbs / o->lib_threads, read_before, read_after, (double)kv_bytes_iter / MIB, nsets,
           (double)kv_bytes_total / MIB, other);
    fflush(stdout);

    for (set = 0; set < nsets; set++) attn_metadata_destroy(metas[set]);
    attn_layer_destroy(layer);
    free(metas); free(ids); free(qsl); free(seq_lens); free(t);
    free(kv_data); free(q_data); free(out_data);
}

/* ---------------------------------------------------------------------------------------
   Prefill: one causal sequence of L tokens, K/V already in the (shuffled) paged cache
   ------------------------------------------------------------------------------------- */

static void bench_prefill(attn_context *ctx, const bench_opts *o, int len) {
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md;
    attn_batch b;
    attn_tensor kv, q, k, v, out;
    int64_t shape[ATTN_MAX_DIMS], qshape[3], kshape[3];
    int ndim, i, reps, nblocks = (len + BENCH_BLOCK - 1) / BENCH_BLOCK;
    const attn_dtype dt = ATTN_DTYPE_F16;
    size_t esz = attn_dtype_size(dt), qn, kn;
    int32_t *table, qsl[2], seq_len[1];
    int64_t *slots;
    void *kv_data, *q_data, *k_data, *v_data, *out_data;
    double *t, med, flops, gflops, t_warm = 0.0, other;
    load_probe probe;
    bench_row *row;

    memset(&d, 0, sizeof d);
    d.num_heads = BENCH_HEADS;
    d.num_kv_heads = BENCH_KV_HEADS;
    d.head_size = BENCH_HEAD_SIZE;
    d.dtype = dt;
    d.kv_cache_dtype = dt;
    d.block_size = BENCH_BLOCK;
    d.causal = ATTN_CAUSAL_YES;
    CHECK(ctx, attn_layer_create(ctx, &d, NULL, &layer));

    CHECK(ctx, attn_layer_kv_cache_shape(layer, nblocks, shape, &ndim));
    kv_data = bench_alloc((size_t)nblocks * 2 * BENCH_BLOCK * BENCH_KV_HEADS * BENCH_HEAD_SIZE * esz);
    kv = attn_tensor_make(kv_data, dt, ndim, shape);
    fill_random(kv_data, dt, attn_tensor_nbytes(&kv) / esz, 21);

    qn = (size_t)len * BENCH_HEADS * BENCH_HEAD_SIZE;
    kn = (size_t)len * BENCH_KV_HEADS * BENCH_HEAD_SIZE;
    qshape[0] = len; qshape[1] = BENCH_HEADS; qshape[2] = BENCH_HEAD_SIZE;
    kshape[0] = len; kshape[1] = BENCH_KV_HEADS; kshape[2] = BENCH_HEAD_SIZE;
    q_data = bench_alloc(qn * esz);
    out_data = bench_alloc(qn * esz);
    k_data = bench_alloc(kn * esz);
    v_data = bench_alloc(kn * esz);
    fill_random(q_data, dt, qn, 22);
    fill_random(out_data, dt, qn, 23);
    fill_random(k_data, dt, kn, 24);
    fill_random(v_data, dt, kn, 25);
    q = attn_tensor_make(q_data, dt, 3, qshape);
    out = attn_tensor_make(out_data, dt, 3, qshape);
    k = attn_tensor_make(k_data, dt, 3, kshape);
    v = attn_tensor_make(v_data, dt, 3, kshape);

    table = (int32_t *)bench_alloc((size_t)nblocks * sizeof(int32_t));
    shuffle_ids(table, nblocks, 31 + (uint64_t)len);
    slots = (int64_t *)bench_alloc((size_t)len * sizeof(int64_t));
    for (i = 0; i < len; i++)
        slots[i] = (int64_t)table[i / BENCH_BLOCK] * BENCH_BLOCK + i % BENCH_BLOCK;
    /* The sequence's K/V go into the cache once, outside the timing. */
    CHECK(ctx, attn_reshape_and_cache(layer, &k, &v, &kv, ATTN_SLOTS(slots, len), NULL));

    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1;
    md.max_num_tokens = len;
    md.max_blocks_per_req = nblocks;
    md.num_blocks = nblocks;
    CHECK(ctx, attn_metadata_create(layer, &md, &meta));
    qsl[0] = 0; qsl[1] = len; seq_len[0] = len;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl;
    b.seq_lens = seq_len;
    b.block_table = table;
    b.block_table_stride = nblocks;
    b.slot_mapping = slots;
    b.num_reqs = 1;
    b.num_actual_tokens = len;
    b.max_query_len = len;
    b.max_seq_len = len;
    b.causal = ATTN_CAUSAL_YES;
    CHECK(ctx, attn_metadata_build(meta, 0, &b, 0));

    probe_start(&probe);
    for (i = 0; i < 2; i++) {
        double t0 = now_s();
        CHECK(ctx, attn_layer_forward(layer, meta, &q, NULL, NULL, &kv, &out, NULL, NULL));
        t_warm = now_s() - t0;
    }
    reps = reps_for(o, t_warm, 0);
    t = (double *)bench_alloc((size_t)reps * sizeof(double));
    for (i = 0; i < reps; i++) {
        double t0 = now_s();
        CHECK(ctx, attn_layer_forward(layer, meta, &q, NULL, NULL, &kv, &out, NULL, NULL));
        t[i] = now_s() - t0;
    }
    other = probe_other_cores(&probe);
    check_finite(out_data, dt, qn, "prefill");
    med = median(t, reps);
    flops = 4.0 * BENCH_HEAD_SIZE * BENCH_HEADS * ((double)len * (double)(len + 1) / 2.0);
    gflops = flops / med / 1e9;

    row = row_add();
    snprintf(row->name, sizeof row->name, "prefill L=%d causal, f16", len);
    row->ms = med * 1e3;
    snprintf(row->metric, sizeof row->metric, "%.1f GFLOP/s", gflops);
    snprintf(row->ceiling, sizeof row->ceiling, "%.1f%% of FP32 FMA peak",
             100.0 * gflops / o->fma_gflops);
    row->other_cores = other;
    printf("%-40s %8.3f ms median (min %.3f, max %.3f, n=%d)  %7.1f GFLOP/s  %5.1f%% of FMA peak"
           "  [%.2f GFLOP unmasked; other load %.2f cores]\n",
           row->name, med * 1e3, t[0] * 1e3, t[reps - 1] * 1e3, reps, gflops,
           100.0 * gflops / o->fma_gflops, flops / 1e9, other);
    fflush(stdout);

    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    free(table); free(slots); free(t);
    free(kv_data); free(q_data); free(k_data); free(v_data); free(out_data);
}

/* ---------------------------------------------------------------------------------------
   MLA decode: absorbed forward_mqa over the latent cache, one token per request
   ------------------------------------------------------------------------------------- */

/* Flops per byte of latent read: per key and head, QK over 576 dims and PV over 512, 2 flops
   per multiply-add; the 576-element latent row (2 bytes each) is read once for all heads. */
static double mla_intensity(int heads) {
    return (double)heads * (BENCH_MLA_HEAD + BENCH_MLA_RANK) * 2.0 / (BENCH_MLA_HEAD * 2.0);
}

/* The roofline for one head count, against this run's ceilings. */
static void mla_roofline_line(const bench_opts *o, int heads) {
    double ai = mla_intensity(heads), bal = o->fma_gflops / o->read_best;
    if (ai >= bal)
        printf("  H=%-3d: %6.1f flop/byte >= balance %.1f -> COMPUTE-bound: at 100%% of FMA peak "
               "the latent is read at %.1f GB/s = %.1f%% of best read BW (the most achievable; 50%% of "
               "read BW would need %.0f%% of FMA peak)\n",
               heads, ai, bal, o->fma_gflops / ai, 100.0 * bal / ai, 50.0 * ai / bal);
    else
        printf("  H=%-3d: %6.1f flop/byte <  balance %.1f -> MEMORY-bound: at 100%% of best read BW "
               "the heads compute %.1f GFLOP/s = %.1f%% of FMA peak (the most achievable)\n",
               heads, ai, bal, o->read_best * ai, 100.0 * ai / bal);
}

static void mla_roofline_note(const bench_opts *o) {
    printf("MLA decode roofline: arithmetic intensity = H*(576+512)*2 flop / (576*2 bytes) per "
           "latent row = %.3f*H flop/byte; machine balance = FMA peak / read BW = %.1f / %.1f "
           "= %.1f flop/byte\n", mla_intensity(1), o->fma_gflops, o->read_best,
           o->fma_gflops / o->read_best);
    mla_roofline_line(o, 16);
    mla_roofline_line(o, 128);
}

static void bench_mla_case(attn_context *ctx, const bench_opts *o, attn_layer *layer,
                           const attn_tensor *cache, int heads, int batch, attn_dtype dt) {
    const int bps = BENCH_CONTEXT / BENCH_MLA_BLOCK;
    const int nsets = BENCH_MLA_SEQS / batch;
    const int64_t num_blocks = cache->shape[0];
    attn_metadata **metas;
    attn_mla_info info;
    attn_tensor q, out;
    int64_t qshape[3], oshape[3];
    int set, i, reps, warm, next = 0;
    size_t esz = attn_dtype_size(dt), qn, on, bytes_iter;
    const attn_dtype cdt = cache->dtype; /* the latent's type (fp8: 1 byte) */
    int32_t *ids, *qsl, *seq_lens;
    void *q_data, *out_data;
    double *t, med, gbs, gflops, flops, t_warm = 0.0, other, ai, bal;
    load_probe probe;
    bench_row *row;

    qn = (size_t)batch * (size_t)heads * BENCH_MLA_HEAD;
    on = (size_t)batch * (size_t)heads * BENCH_MLA_RANK;
    qshape[0] = batch; qshape[1] = heads; qshape[2] = BENCH_MLA_HEAD;
    oshape[0] = batch; oshape[1] = heads; oshape[2] = BENCH_MLA_RANK;
    q_data = bench_alloc(qn * esz);
    out_data = bench_alloc(on * esz);
    fill_random(q_data, dt, qn, 61 + (uint64_t)heads * 8 + (uint64_t)batch);
    fill_random(out_data, dt, on, 62 + (uint64_t)heads * 8 + (uint64_t)batch);
    q = attn_tensor_make(q_data, dt, 3, qshape);
    out = attn_tensor_make(out_data, dt, 3, oshape);

    /* Block ids shuffled over the whole latent cache; set s owns ids[s*batch*bps ...], so
       the sets are disjoint and together cover all BENCH_MLA_SEQS sequences' blocks. */
    ids = (int32_t *)bench_alloc((size_t)num_blocks * sizeof(int32_t));
    shuffle_ids(ids, (int)num_blocks, 71 + (uint64_t)heads * 8 + (uint64_t)batch + 1000u * (uint64_t)dt);
    qsl = (int32_t *)bench_alloc(((size_t)batch + 1) * sizeof(int32_t));
    seq_lens = (int32_t *)bench_alloc((size_t)batch * sizeof(int32_t));
    for (i = 0; i <= batch; i++) qsl[i] = i;
    for (i = 0; i < batch; i++) seq_lens[i] = BENCH_CONTEXT;
    metas = (attn_metadata **)bench_alloc((size_t)nsets * sizeof *metas);
    for (set = 0; set < nsets; set++) {
        attn_metadata_desc md;
        attn_batch b;
        memset(&md, 0, sizeof md);
        memset(&info, 0, sizeof info);
        md.max_num_reqs = batch;
        md.max_num_tokens = batch;
        md.max_blocks_per_req = bps;
        md.num_blocks = num_blocks;
        md.decode_threshold = 0; /* 1: query_len 1 is a decode */
        md.num_kv_splits = 0;    /* automatic: attn_mla_num_kv_splits() */
        CHECK(ctx, attn_metadata_create(layer, &md, &metas[set]));
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl;
        b.seq_lens = seq_lens;
        b.block_table = ids + (size_t)set * (size_t)batch * (size_t)bps;
        b.block_table_stride = bps;
        b.slot_mapping = NULL; /* the new token's latent is already in the cache */
        b.num_reqs = batch;
        b.num_actual_tokens = batch;
        b.max_query_len = 1;
        b.max_seq_len = BENCH_CONTEXT;
        b.causal = ATTN_CAUSAL_YES;
        CHECK(ctx, attn_metadata_build(metas[set], 0, &b, 0));
        CHECK(ctx, attn_metadata_mla_info(metas[set], &info));
        if (info.num_decodes != batch || info.num_decode_tokens != batch || info.num_prefills != 0) {
            fprintf(stderr, "attn-bench: MLA metadata: %d decodes / %d decode tokens / %d prefills "
                    "(expected %d / %d / 0)\n", info.num_decodes, info.num_decode_tokens,
                    info.num_prefills, batch, batch);
            exit(1);
        }
    }

    probe_start(&probe);
    warm = 3;
    for (i = 0; i < warm; i++) {
        double t0 = now_s();
        CHECK(ctx, attn_mla_forward_mqa(layer, metas[next], &q, NULL, cache, &out, NULL, NULL));
        t_warm = now_s() - t0;
        next = (next + 1) % nsets;
    }
    reps = reps_for(o, t_warm, 1);
    t = (double *)bench_alloc((size_t)reps * sizeof(double));
    for (i = 0; i < reps; i++) {
        double t0 = now_s();
        CHECK(ctx, attn_mla_forward_mqa(layer, metas[next], &q, NULL, cache, &out, NULL, NULL));
        t[i] = now_s() - t0;
        next = (next + 1) % nsets;
    }
    other = probe_other_cores(&probe);
    check_finite(out_data, dt, on, "MLA decode");
    med = median(t, reps);
    bytes_iter = (size_t)batch * BENCH_CONTEXT * BENCH_MLA_HEAD * attn_dtype_size(cdt);
    flops = 2.0 * batch * heads * (double)BENCH_CONTEXT * (BENCH_MLA_HEAD + BENCH_MLA_RANK);
    gbs = (double)bytes_iter / med / 1e9;
    gflops = flops / med / 1e9;
    ai = mla_intensity(heads);
    bal = o->fma_gflops / o->read_best;

    row = row_add();
    snprintf(row->name, sizeof row->name, "MLA decode H=%d b=%d ctx=%d, latent %s%s%s", heads, batch,
             BENCH_CONTEXT, attn_dtype_name(cdt), cdt != dt ? ", q/out " : "", cdt != dt ? attn_dtype_name(dt) : "");
    row->ms = med * 1e3;
    snprintf(row->metric, sizeof row->metric, "%.1f GB/s latent read; %.1f GFLOP/s", gbs, gflops);
    row->read_gbs = gbs;
    row->gflops = gflops;
    row->other_cores = other;
    printf("%-40s %8.3f ms median (min %.3f, max %.3f, n=%d)  %7.1f GB/s  %5.1f%% of best read BW  "
           "%7.1f GFLOP/s  %5.1f%% of FMA peak  [%s-bound, max %.1f%% of best read BW; %d KV splits; "
           "latent %.1f MiB/iter, rotated over %d sets = %.0f MiB; other load %.2f cores]\n",
           row->name, med * 1e3, t[0] * 1e3, t[reps - 1] * 1e3, reps, gbs, 100.0 * gbs / o->read_best,
           gflops, 100.0 * gflops / o->fma_gflops, ai >= bal ? "compute" : "memory",
           ai >= bal ? 100.0 * bal / ai : 100.0, info.num_kv_splits, (double)bytes_iter / MIB, nsets,
           (double)nsets * (double)bytes_iter / MIB, other);
    fflush(stdout);

    for (set = 0; set < nsets; set++) attn_metadata_destroy(metas[set]);
    free(metas); free(ids); free(qsl); free(seq_lens); free(t);
    free(q_data); free(out_data);
}

/* All MLA cases of one latent dtype (q/out in dt; the latent in cdt: dt, or fp8 with a
   per-tensor scale of 1/64) over one shared latent cache of BENCH_MLA_SEQS sequences (648 MiB
   at 2 bytes), filled once with random latents. */
static void bench_mla(attn_context *ctx, const bench_opts *o, attn_dtype dt, attn_dtype cdt) {
    static const int heads_list[2] = {16, 128}, batch_list[2] = {1, BENCH_MLA_MAX_BATCH};
    const int64_t num_blocks = (int64_t)BENCH_MLA_SEQS * (BENCH_CONTEXT / BENCH_MLA_BLOCK);
    int64_t shape[ATTN_MAX_DIMS];
    int ndim, hi, bi;
    void *cache_data = NULL;
    attn_tensor cache;
    size_t esz = attn_dtype_size(cdt);

    memset(&cache, 0, sizeof cache);
    for (hi = 0; hi < 2; hi++) {
        attn_layer_desc d;
        attn_layer *layer = NULL;
        memset(&d, 0, sizeof d);
        d.num_heads = heads_list[hi];
        d.num_kv_heads = 1;
        d.head_size = BENCH_MLA_HEAD;
        d.dtype = dt;
        d.kv_cache_dtype = cdt;
        if (cdt != dt) d.k_scale.value = 1.0f / 64; /* fp8 latent */
        d.block_size = BENCH_MLA_BLOCK;
        d.causal = ATTN_CAUSAL_YES;
        d.use_mla = 1;
        d.kv_lora_rank = BENCH_MLA_RANK;
        d.qk_rope_head_dim = BENCH_MLA_ROPE;
        d.qk_nope_head_dim = BENCH_MLA_NOPE;
        d.v_head_dim = BENCH_MLA_V;
        CHECK(ctx, attn_layer_create(ctx, &d, NULL, &layer));
        CHECK(ctx, attn_layer_kv_cache_shape(layer, num_blocks, shape, &ndim));
        if (ndim != 3 || shape[0] != num_blocks || shape[1] != BENCH_MLA_BLOCK ||
            shape[2] != BENCH_MLA_HEAD) {
            fprintf(stderr, "attn-bench: MLA cache shape has %d dims [%lld, %lld, %lld] (expected "
                    "[%lld, %d, %d])\n", ndim, (long long)shape[0], (long long)(ndim > 1 ? shape[1] : 0),
                    (long long)(ndim > 2 ? shape[2] : 0), (long long)num_blocks, BENCH_MLA_BLOCK,
                    BENCH_MLA_HEAD);
            exit(1);
        }
        if (!cache_data) {
            size_t n = (size_t)num_blocks * BENCH_MLA_BLOCK * BENCH_MLA_HEAD;
            cache_data = bench_alloc(n * esz);
            cache = attn_tensor_make(cache_data, cdt, ndim, shape);
            fill_random(cache_data, cdt, n, 51 + (uint64_t)cdt);
        }
        for (bi = 0; bi < 2; bi++) bench_mla_case(ctx, o, layer, &cache, heads_list[hi], batch_list[bi], dt);
        attn_layer_destroy(layer);
    }
    free(cache_data);
}

/* The 1-minute load average (Linux), or -1: other busy processes skew every number here. */
static double load_average(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double la = -1.0;
    if (!f) return -1.0;
    if (fscanf(f, "%lf", &la) != 1) la = -1.0;
    fclose(f);
    return la;
}

/* Whether the space-separated list holds the word w. */
static int has_word(const char *list, const char *w) {
    size_t k = strlen(w);
    const char *p = list;
    while ((p = strstr(p, w)) != NULL) {
        if ((p == list || p[-1] == ' ') && (p[k] == ' ' || p[k] == '\0')) return 1;
        p += k;
    }
    return 0;
}

/* The CPU in one line (Linux /proc/cpuinfo): model name, family/model, and which of the
   SIMD flags that matter here it has ("no X" for the ones it lacks). Results from
   different machines are not comparable, so every table carries this line. */
static void cpu_describe(char *buf, size_t size) {
    static const char *const flags[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                                        "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16"};
    static char line[16384];
    char model[128] = "unknown CPU", family[16] = "?", modelno[16] = "?", have[256] = "", lack[256] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    size_t i;
    int got_flags = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!v) continue;
        for (v++; *v == ' ' || *v == '\t'; v++) {}
        v[strcspn(v, "\n")] = '\0';
        if (!strncmp(line, "model name", 10)) snprintf(model, sizeof model, "%s", v);
        else if (!strncmp(line, "cpu family", 10)) snprintf(family, sizeof family, "%s", v);
        else if (!strncmp(line, "model\t", 6)) snprintf(modelno, sizeof modelno, "%s", v);
        else if (!strncmp(line, "flags", 5)) {
            for (i = 0; i < sizeof flags / sizeof flags[0]; i++) {
                char *dst = has_word(v, flags[i]) ? have : lack;
                size_t n = strlen(dst);
                snprintf(dst + n, sizeof have - n, "%s%s%s", n ? " " : "", dst == lack ? "no " : "", flags[i]);
            }
            got_flags = 1;
            break; /* the first processor's entry is enough */
        }
    }
    if (f) fclose(f);
    snprintf(buf, size, "%s (family %s, model %s); %s%s%s", model, family, modelno,
             got_flags ? have : "flags unknown", lack[0] ? "; " : "", lack);
}

/* ---------------------------------------------------------------------------------------
   main
   ------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------
   --device cuda: the CUDA backend (compile times with or without a GPU; the decode table
   and the device's read ceiling on a GPU)

   1. Compile times, through the same variant list layer creation compiles
      (attn__cuda_layer_variants), into a fresh kernel-cache directory:
        cold  - every variant of five layer configurations compiled by NVRTC for the
                device's architecture (sm_90 when there is no GPU), one at a time;
        warm  - a fresh context on the same directory: per layer, the three variants
                found on disk (no GPU: lookup + read + checksum), or on a GPU the whole
                attn_layer_create (disk + module load + configuration read-back), after
                the context's first GPU call (reported on its own line).
   2. On a GPU, the ceilings of the same run: read bandwidth (attn_read_probe over 4 GiB,
      best of 10) and the bf16 tensor-core rate (cuBLAS GEMM 8192^3, best of 10); then the
      backend through the public API (attn_layer_forward on device tensors, its own
      scheduler and split-KV), 32/8 heads, head 128, bf16, block 16:
        decode   batch 1/16/64/128 x context 1k/4k/16k, GB/s of K+V against the read;
        prefill  causal, batch 4 x 4096 and 1 x 16384, TFLOP/s of the causal-useful pairs
                 against the matmul rate;
        mixed    vLLM's chunked prefill: one chunk of 2048 over 8192 cached tokens with 64
                 decodes of 4096, against the sum of its parts timed alone.
      Each case rotates over pre-built metadata sets on disjoint shuffled block sets of a
      16 GiB cache (>= 256 MiB per rotation for decode, 5x the L2), timed with CUDA events
      over back-to-back forwards; median of 11 groups. --csv FILE writes the rows.
   ------------------------------------------------------------------------------------- */

static int cuda_mla_only; /* --device cuda --case mla: the ceilings and the MLA table only */
static int cuda_decode_only; /* --device cuda --case decode: the decode tables (bf16, 8-bit) only */

#ifndef ATTN_NO_CUDA
#include <dirent.h>
#include <sys/stat.h>

typedef struct {
    const char *name;
    int heads, kv_heads, head_size, block_size;
    attn_dtype dtype;
    int window;
    float softcap;
} cuda_layer_cfg;

static const cuda_layer_cfg cuda_cfgs[] = {
    {"32/8 h128 bf16 (decode table)", 32, 8, 128, 16, ATTN_DTYPE_BF16, 0, 0.0f},
    {"32/8 h128 f16", 32, 8, 128, 16, ATTN_DTYPE_F16, 0, 0.0f},
    {"64/8 h64 bf16 block 32", 64, 8, 64, 32, ATTN_DTYPE_BF16, 0, 0.0f},
    {"16/16 h256 bf16", 16, 16, 256, 16, ATTN_DTYPE_BF16, 0, 0.0f},
    {"32/4 h128 f32 window soft-cap", 32, 4, 128, 16, ATTN_DTYPE_F32, 4096, 30.0f},
};
#define CUDA_NUM_CFGS ((int)(sizeof cuda_cfgs / sizeof cuda_cfgs[0]))

static attn_layer_desc cuda_desc(const cuda_layer_cfg *c) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.num_heads = c->heads;
    d.num_kv_heads = c->kv_heads;
    d.head_size = c->head_size;
    d.block_size = c->block_size;
    d.dtype = c->dtype;
    d.kv_cache_dtype = c->dtype;
    d.sliding_window = c->window;
    d.logits_soft_cap = c->softcap;
    d.device = ATTN_DEVICE_CUDA;
    return d;
}

static attn_context *cuda_bench_context(const char *cache_dir) {
    attn_context_desc cd;
    attn_context *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    cd.log_level = ATTN_LOG_LEVEL_WARN;
    cd.kernel_cache_dir = cache_dir;
    CHECK(NULL, attn_context_create(&cd, &ctx));
    return ctx;
}

static void rm_dir(const char *dir) {
    DIR *dp = opendir(dir);
    struct dirent *e;
    char path[1024];
    if (!dp) return;
    while ((e = readdir(dp)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove(path);
    }
    closedir(dp);
    rmdir(dir);
}

static const char *const cuda_variant_label[ATTN__ROLE_COUNT] = {"decode     ", "prefill    ", "cache      ", "decode wide"};

/* 1. Cold compile per variant, warm start per layer. */
static void cuda_compile_times(const attn_platform *plat0, int quick) {
    char dir[512], arch[16], arch_a[20], opt[CUDA_NUM_CFGS][ATTN__ROLE_COUNT][256];
    const attn__kernel_family *fam[CUDA_NUM_CFGS]; /* the kernel family of the backend the layer resolves to */
    const char *tmp = getenv("TMPDIR");
    int have_gpu = plat0->kind == ATTN_PLATFORM_CUDA, c, v, n_cold = 0, n_nvrtc_cached = 0;
    int rounds = quick ? 1 : 3, r;
    double cold_max = 0, cold_sum = 0, warm_max = 0, t0, first_call = 0, ctx_create;
    attn_context *ctx;
    attn_kernel_info info;

    snprintf(dir, sizeof dir, "%s/attn-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "attn-bench: cannot make a kernel-cache directory under %s\n", tmp ? tmp : "/tmp");
        exit(1);
    }
    if (have_gpu) snprintf(arch, sizeof arch, "sm_%d%d", plat0->cuda_capability_major, plat0->cuda_capability_minor);
    else snprintf(arch, sizeof arch, "sm_90");
    /* on a GPU host, one context asks the selector for every layer (ATTN_BACKEND and
       plugins included); it compiles nothing */
    ctx = have_gpu ? cuda_bench_context(dir) : NULL;
    for (c = 0; c < CUDA_NUM_CFGS; c++) {
        attn_layer_desc d = cuda_desc(&cuda_cfgs[c]);
        attn_platform h200 = *plat0; /* no GPU here: the variants an H200 compiles */
        if (!have_gpu) {
            h200.cuda_capability_major = 9; h200.cuda_capability_minor = 0; h200.cuda_shared_per_block = 232448;
            h200.kind = ATTN_PLATFORM_CUDA;
        }
        if (have_gpu) {
            attn_selection sel;
            int sm90 = attn_select_backend(ctx, &d, NULL, &sel) == ATTN_OK && sel.resolved == ATTN_BACKEND_CUDA_SM90;
            fam[c] = attn__kernel_family_of(sm90 ? ATTN_BACKEND_CUDA_SM90 : ATTN_BACKEND_CUDA);
        } else { /* no GPU here: what an H200 would pick with ATTN_BACKEND unset */
            char why[256];
            int sm90 = attn__backend_check(attn_backend_get(ATTN_BACKEND_CUDA_SM90), &d, &h200, why, sizeof why) == 0;
            fam[c] = attn__kernel_family_of(sm90 ? ATTN_BACKEND_CUDA_SM90 : ATTN_BACKEND_CUDA);
        }
        attn__cuda_layer_variants(&d, &h200, fam[c], opt[c]);
    }
    if (ctx) attn_context_destroy(ctx);
    snprintf(arch_a, sizeof arch_a, "%sa", arch);
#define VARIANT_ARCH(c, v) (fam[c]->role[v].arch_a ? arch_a : arch)
#define VARIANT_FILE(c, v) (fam[c]->role[v].file)

    printf("NVRTC %d.%d, kernels for %s%s; kernel cache: %s (fresh)\n", plat0->nvrtc_version / 1000,
           plat0->nvrtc_version % 1000 / 10, arch, have_gpu ? " (this GPU)" : " (no GPU here: the H200's arch)", dir);
    printf("cold compile, per variant (each layer loads 3 or 4: decode tiles, prefill tiles, cache write, "
           "wide decode tiles where the layer has them):\n");
    ctx = cuda_bench_context(dir);
    for (c = 0; c < CUDA_NUM_CFGS; c++)
        for (v = 0; v < ATTN__ROLE_COUNT; v++) {
            double t;
            if (!opt[c][v][0]) continue; /* no wide decode tiles for this layer */
            t0 = now_s();
            CHECK(ctx, attn_kernel_compile(ctx, VARIANT_FILE(c, v), opt[c][v], VARIANT_ARCH(c, v), &info));
            t = now_s() - t0;
            if (info.source != ATTN_KERNEL_COMPILED) {
                printf("  %-34s %-21s (the same variant as an earlier layer: from memory)\n",
                       v ? "" : cuda_cfgs[c].name, VARIANT_FILE(c, v));
                continue;
            }
            if (!strstr(info.log, "ptxas")) {
                /* NVRTC 12.9+ keeps a cache of its own: a program it has compiled before on
                   this machine comes back fast and without the ptxas report. Not cold. */
                n_nvrtc_cached++;
                printf("  %-34s %-21s %s %7.0f ms wall: served by NVRTC's own cache (no ptxas report); "
                       "not counted as cold\n", v ? "" : cuda_cfgs[c].name, VARIANT_FILE(c, v),
                       cuda_variant_label[v], t * 1e3);
                continue;
            }
            n_cold++;
            cold_sum += t;
            if (t > cold_max) cold_max = t;
            printf("  %-34s %-21s %s %7.0f ms wall (NVRTC %6.0f ms), %3d registers, %5d B shared, "
                   "spills %d/%d B, cubin %zu KiB\n", v ? "" : cuda_cfgs[c].name, VARIANT_FILE(c, v),
                   cuda_variant_label[v], t * 1e3, info.compile_ms, info.registers,
                   info.shared_bytes, info.spill_stores, info.spill_loads, info.cubin_bytes / 1024);
        }
    attn_context_destroy(ctx);
    printf("  %d variants compiled cold: %.0f ms the slowest, %.0f ms the mean (target <= 2000 ms per "
           "variant)%s\n", n_cold, cold_max * 1e3, cold_sum / (n_cold ? n_cold : 1) * 1e3,
           n_nvrtc_cached ? "; the others came from NVRTC's own cache (run with a fresh HOME for all cold)" : "");

    printf("warm start, per layer (a fresh context on the same cache directory; %d rounds, the "
           "slowest shown)%s:\n", rounds, have_gpu ? "" : " - no GPU: the disk part only (lookup, read, checksum)");
    {
        double warm[CUDA_NUM_CFGS];
        int compiles = 0;
        for (c = 0; c < CUDA_NUM_CFGS; c++) warm[c] = 0;
        for (r = 0; r < rounds; r++) {
            attn_layer *layers[CUDA_NUM_CFGS];
            t0 = now_s();
            ctx = cuda_bench_context(dir);
            ctx_create = now_s() - t0;
            if (have_gpu) { /* the context's first GPU call: driver start, primary context */
                void *p = NULL;
                t0 = now_s();
                CHECK(ctx, attn_cuda_malloc(ctx, 256, &p));
                CHECK(ctx, attn_cuda_free(ctx, p));
                first_call = now_s() - t0;
            }
            for (c = 0; c < CUDA_NUM_CFGS; c++) {
                double t;
                layers[c] = NULL;
                t0 = now_s();
                if (have_gpu) {
                    attn_layer_desc d = cuda_desc(&cuda_cfgs[c]);
                    CHECK(ctx, attn_layer_create(ctx, &d, NULL, &layers[c]));
                } else {
                    for (v = 0; v < ATTN__ROLE_COUNT; v++)
                        if (opt[c][v][0])
                            CHECK(ctx, attn_kernel_compile(ctx, VARIANT_FILE(c, v), opt[c][v],
                                                           VARIANT_ARCH(c, v), NULL));
                }
                t = now_s() - t0;
                if (t > warm[c]) warm[c] = t;
            }
            compiles += attn_kernel_compile_count(ctx);
            for (c = 0; c < CUDA_NUM_CFGS; c++) attn_layer_destroy(layers[c]);
            attn_context_destroy(ctx);
            if (r == 0)
                printf("  attn_context_create %.1f ms\n", ctx_create * 1e3);
            if (r == 0 && have_gpu)
                printf("  the context's first GPU call (driver, primary context) %.1f ms, once per process\n",
                       first_call * 1e3);
        }
        for (c = 0; c < CUDA_NUM_CFGS; c++) {
            printf("  %-34s %7.2f ms%s\n", cuda_cfgs[c].name, warm[c] * 1e3,
                   have_gpu ? " (attn_layer_create)" : " (its variants from disk)");
            if (warm[c] > warm_max) warm_max = warm[c];
        }
        printf("  slowest layer %.2f ms (target <= 10 ms); NVRTC compiles during the warm rounds: %d%s\n",
               warm_max * 1e3, compiles, compiles ? " (NOT warm: the disk cache missed)" : "");
    }
    rm_dir(dir);
    {
        bench_row *row = row_add();
        int any90a = 0;
        for (c = 0; c < CUDA_NUM_CFGS; c++) any90a |= fam[c]->role[ATTN__ROLE_PREFILL].arch_a;
        snprintf(row->name, sizeof row->name, "cold NVRTC compile per variant (%d variants, %s%s)", n_cold, arch,
                 any90a ? "; wgmma: sm_90a" : "");
        row->ms = cold_max * 1e3;
        snprintf(row->metric, sizeof row->metric, "slowest; mean %.0f ms", cold_sum / (n_cold ? n_cold : 1) * 1e3);
        snprintf(row->ceiling, sizeof row->ceiling, "target <= 2000 ms");
        row->other_cores = -1;
        row = row_add();
        snprintf(row->name, sizeof row->name, "warm start per layer (%s)",
                 have_gpu ? "attn_layer_create, disk cache" : "its variants from the disk cache, no GPU");
        row->ms = warm_max * 1e3;
        snprintf(row->metric, sizeof row->metric, "slowest of %d layers", CUDA_NUM_CFGS);
        snprintf(row->ceiling, sizeof row->ceiling, "target <= 10 ms");
        row->other_cores = -1;
    }
}

/* The device's read bandwidth: attn_read_probe over `bytes`, best of `passes` (GB/s). */
static double cuda_read_ceiling(attn_context *ctx, attn__CUdeviceptr buf, size_t bytes, int passes,
                                double *median_gbs) {
    attn__cuda_driver *cu = ctx->cuda;
    attn__cuda_module m;
    attn__CUevent e0, e1;
    attn__CUdeviceptr out;
    unsigned long long n = bytes / 16;
    unsigned never = 0x9e3779b9u;
    void *args[4];
    char reason[256];
    int per_sm = 0, i;
    double best = 0, t[32];
    CHECK(ctx, attn__cuda_enter(ctx, "attn-bench"));
    CHECK(ctx, attn__cuda_load(ctx, "util.cu", "", "attn_read_probe", NULL, 0, &m, reason, sizeof reason));
    if (cu->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, m.main, 512, 0) != 0 || per_sm < 1) per_sm = 1;
    if (cu->cuMemAlloc(&out, 16) != 0 || cu->cuEventCreate(&e0, 0) != 0 || cu->cuEventCreate(&e1, 0) != 0) {
        fprintf(stderr, "attn-bench: cannot set up the read probe\n");
        exit(1);
    }
    args[0] = &buf; args[1] = &n; args[2] = &never; args[3] = &out;
    if (passes > 32) passes = 32;
    for (i = -1; i < passes; i++) {
        float ms = 0;
        cu->cuEventRecord(e0, NULL);
        if (cu->cuLaunchKernel(m.main, (unsigned)(per_sm * ATTN__MAX(1, ctx->platform.cuda_multiprocessors)), 1, 1,
                               512, 1, 1, 0, NULL, args, NULL) != 0) {
            fprintf(stderr, "attn-bench: the read probe did not launch\n");
            exit(1);
        }
        cu->cuEventRecord(e1, NULL);
        cu->cuEventSynchronize(e1);
        cu->cuEventElapsedTime(&ms, e0, e1);
        if (i < 0) continue; /* warm-up */
        t[i] = (double)bytes / (ms * 1e-3) / 1e9;
        if (t[i] > best) best = t[i];
    }
    *median_gbs = median(t, passes);
    cu->cuEventDestroy(e0);
    cu->cuEventDestroy(e1);
    cu->cuMemFree(out);
    cu->cuModuleUnload(m.module);
    attn__cuda_leave(ctx);
    return best;
}

#define CUDA_POOL_BYTES ((size_t)16 << 30)   /* the KV cache every case draws from */
#define CUDA_ROTATE_BYTES ((size_t)256 << 20) /* KV read per rotation, at least */
#define CUDA_MAX_SETS 64
#define CUDA_MAX_TOKENS 16384                 /* q/out rows (prefill 4 x 4096) */

static FILE *cuda_csv; /* --csv FILE: one line per measured row */

static void csv_row(const char *impl, const char *kind, int batch, int context, double us, double value,
                    const char *unit) {
    if (cuda_csv) fprintf(cuda_csv, "%s,%s,%d,%d,%.2f,%.1f,%s\n", impl, kind, batch, context, us, value, unit);
}

/* What every GPU case shares: the layer (32/8 heads, head 128, bf16, block 16), the 16 GiB
   paged cache with shuffled block ids, q/out buffers, two events. */
typedef struct {
    attn_context *ctx;
    attn_layer *layer;
    attn_tensor kv;
    int64_t num_blocks;
    int32_t *ids;
    void *d_kv, *d_q, *d_out;
    attn__CUevent e0, e1;
    int groups;
} cuda_bench;

enum { CB_H = 32, CB_HKV = 8, CB_D = 128, CB_BS = 16 };

/* nsets metadata of `layer` over disjoint block sets of a shuffled pool: set k takes the next
   sum(ceil(seq / block_size)) ids of `ids`. workspace: attn_metadata_desc.workspace_bytes. */
static int bench_forced_splits; /* attn_metadata_desc.num_kv_splits of bench_metas (0: automatic) */

static attn_metadata **bench_metas(attn_context *ctx, attn_layer *layer, const int32_t *ids, int64_t pool_blocks,
                                   int block_size, int max_tokens, int nreq, const int32_t *qlens, const int32_t *seqs,
                                   int nsets, int64_t workspace) {
    attn_metadata **metas = (attn_metadata **)bench_alloc((size_t)nsets * sizeof *metas);
    int32_t *qsl = (int32_t *)bench_alloc(((size_t)nreq + 1) * 4), *table;
    int r, k, bps = 0, per_set = 0, maxq = 0, maxs = 0;
    for (r = 0; r < nreq; r++) {
        int nb = (seqs[r] + block_size - 1) / block_size;
        if (nb > bps) bps = nb;
        if (qlens[r] > maxq) maxq = qlens[r];
        if (seqs[r] > maxs) maxs = seqs[r];
        per_set += nb;
    }
    qsl[0] = 0;
    for (r = 0; r < nreq; r++) qsl[r + 1] = qsl[r] + qlens[r];
    if ((int64_t)nsets * per_set > pool_blocks || qsl[nreq] > max_tokens) {
        fprintf(stderr, "attn-bench: a case does not fit the bench's cache or q buffer\n");
        exit(1);
    }
    table = (int32_t *)bench_alloc((size_t)nreq * (size_t)bps * 4);
    for (k = 0; k < nsets; k++) {
        attn_metadata_desc md;
        attn_batch b;
        const int32_t *set = ids + (size_t)k * (size_t)per_set;
        int used = 0;
        for (r = 0; r < nreq; r++) {
            int nb = (seqs[r] + block_size - 1) / block_size, j;
            for (j = 0; j < bps; j++) table[(size_t)r * bps + j] = j < nb ? set[used + j] : 0;
            used += nb;
        }
        memset(&md, 0, sizeof md);
        md.max_num_reqs = nreq;
        md.max_num_tokens = qsl[nreq];
        md.max_blocks_per_req = bps;
        md.num_blocks = pool_blocks;
        md.workspace_bytes = workspace;
        md.num_kv_splits = bench_forced_splits;
        CHECK(ctx, attn_metadata_create(layer, &md, &metas[k]));
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl;
        b.seq_lens = seqs;
        b.block_table = table;
        b.block_table_stride = bps;
        b.num_reqs = nreq;
        b.num_actual_tokens = qsl[nreq];
        b.max_query_len = maxq;
        b.max_seq_len = maxs;
        CHECK(ctx, attn_metadata_build(metas[k], 0, &b, 0));
    }
    CHECK(ctx, attn_cuda_synchronize(ctx, NULL));
    free(qsl);
    free(table);
    return metas;
}

/* The standard layer's sets (blocks of 16 from the 16 GiB pool). */
static attn_metadata **cuda_metas(cuda_bench *cb, int nreq, const int32_t *qlens, const int32_t *seqs, int nsets) {
    return bench_metas(cb->ctx, cb->layer, cb->ids, cb->num_blocks, CB_BS, CUDA_MAX_TOKENS, nreq, qlens, seqs, nsets, 0);
}

static void cuda_metas_free(attn_metadata **metas, int nsets) {
    int k;
    for (k = 0; k < nsets; k++) attn_metadata_destroy(metas[k]);
    free(metas);
}

/* Median seconds per forward: groups of per_group back-to-back forwards, each on the next
   metadata set, between two CUDA events. The output is checked finite afterwards. */
/* Median seconds per call of run(arg, i), i = 0, 1, ...: 3 warm-up calls, then groups of
   per_group back-to-back calls between two CUDA events. */
static double bench_groups(cuda_bench *cb, void (*run)(void *, int), void *arg, int per_group) {
    attn__cuda_driver *cu = cb->ctx->cuda;
    double t[16];
    int g, k, next = 0;
    for (k = 0; k < 3; k++) run(arg, k); /* warm-up */
    for (g = 0; g < cb->groups; g++) {
        float ms = 0;
        CHECK(cb->ctx, attn__cuda_enter(cb->ctx, "attn-bench"));
        cu->cuEventRecord(cb->e0, NULL);
        attn__cuda_leave(cb->ctx);
        for (k = 0; k < per_group; k++) run(arg, next++);
        CHECK(cb->ctx, attn__cuda_enter(cb->ctx, "attn-bench"));
        cu->cuEventRecord(cb->e1, NULL);
        cu->cuEventSynchronize(cb->e1);
        cu->cuEventElapsedTime(&ms, cb->e0, cb->e1);
        attn__cuda_leave(cb->ctx);
        t[g] = (double)ms * 1e-3 / per_group;
    }
    return median(t, cb->groups);
}

typedef struct {
    cuda_bench *cb;
    attn_metadata **metas;
    int nsets;
    attn_tensor q, out;
} cuda_forward_call;

static void cuda_forward_run(void *arg, int i) {
    cuda_forward_call *c = (cuda_forward_call *)arg;
    CHECK(c->cb->ctx, attn_layer_forward(c->cb->layer, c->metas[i % c->nsets], &c->q, NULL, NULL, &c->cb->kv, &c->out,
                                         NULL, NULL));
}

static double cuda_time(cuda_bench *cb, attn_metadata **metas, int nsets, int ntok, int per_group) {
    int64_t qshape[3];
    cuda_forward_call c;
    uint16_t *host;
    double med;
    qshape[0] = ntok; qshape[1] = CB_H; qshape[2] = CB_D;
    c.cb = cb;
    c.metas = metas;
    c.nsets = nsets;
    c.q = attn_tensor_make(cb->d_q, ATTN_DTYPE_BF16, 3, qshape);
    c.out = attn_tensor_make(cb->d_out, ATTN_DTYPE_BF16, 3, qshape);
    c.q.device.kind = c.out.device.kind = ATTN_DEVICE_CUDA;
    med = bench_groups(cb, cuda_forward_run, &c, per_group);
    host = (uint16_t *)bench_alloc((size_t)ntok * CB_H * CB_D * 2);
    CHECK(cb->ctx, attn_cuda_memcpy(cb->ctx, host, cb->d_out, (size_t)ntok * CB_H * CB_D * 2,
                                    ATTN_COPY_DEVICE_TO_HOST, NULL));
    check_finite(host, ATTN_DTYPE_BF16, (size_t)ntok * CB_H * CB_D, "cuda forward");
    free(host);
    return med;
}

/* The bf16 tensor-core rate: cuBLAS GEMM 8192^3 (bf16 in, fp32 accumulate, bf16 out),
   best of 10 (TFLOP/s); 0 with the reason printed when cuBLAS is missing. */
static double cuda_matmul_ceiling(cuda_bench *cb) {
    attn_context *ctx = cb->ctx;
    attn__cuda_driver *cu = ctx->cuda;
    attn__cublas *bl = ctx->cublas;
    const int n = 8192;
    const size_t bytes = (size_t)n * n * 2;
    attn__CUdeviceptr a, b, c;
    void *h = NULL;
    float alpha = 1.0f, beta = 0.0f;
    double best = 0;
    int i;
    if (!bl || !bl->library) {
        printf("matmul ceiling: not measured (%s)\n", ctx->platform.cublas_reason);
        return 0;
    }
    CHECK(ctx, attn__cuda_enter(ctx, "attn-bench"));
    if (cu->cuMemAlloc(&a, bytes) != 0 || cu->cuMemAlloc(&b, bytes) != 0 || cu->cuMemAlloc(&c, bytes) != 0 ||
        bl->cublasCreate(&h) != 0) {
        fprintf(stderr, "attn-bench: cannot set up the cuBLAS GEMM\n");
        exit(1);
    }
    /* random bf16 operands: the start of the (random) KV cache */
    cu->cuMemcpyDtoDAsync(a, (attn__CUdeviceptr)(uintptr_t)cb->d_kv, bytes, NULL);
    cu->cuMemcpyDtoDAsync(b, (attn__CUdeviceptr)(uintptr_t)cb->d_kv + bytes, bytes, NULL);
    bl->cublasSetStream(h, NULL);
    for (i = -2; i < 10; i++) {
        float ms = 0;
        cu->cuEventRecord(cb->e0, NULL);
        if (bl->cublasGemmStridedBatchedEx(h, 0, 0, n, n, n, &alpha, (const void *)(uintptr_t)a, 14, n, 0,
                                           (const void *)(uintptr_t)b, 14, n, 0, &beta, (void *)(uintptr_t)c, 14,
                                           n, 0, 1, 68, -1) != 0) {
            fprintf(stderr, "attn-bench: cublasGemmStridedBatchedEx failed\n");
            exit(1);
        }
        cu->cuEventRecord(cb->e1, NULL);
        cu->cuEventSynchronize(cb->e1);
        cu->cuEventElapsedTime(&ms, cb->e0, cb->e1);
        if (i >= 0 && 2.0 * n * n * (double)n / (ms * 1e-3) / 1e12 > best) best = 2.0 * n * n * (double)n / (ms * 1e-3) / 1e12;
    }
    bl->cublasDestroy(h);
    cu->cuMemFree(a); cu->cuMemFree(b); cu->cuMemFree(c);
    attn__cuda_leave(ctx);
    return best;
}

/* The launch floor: back-to-back launches of an empty kernel (attn_fill_u32 over 0 words,
   one CTA) on the legacy stream, per launch, median of 11 groups of 200 - what a forward of
   n launches costs before it reads a byte. */
static double cuda_launch_floor(cuda_bench *cb) {
    attn_context *ctx = cb->ctx;
    attn__cuda_driver *cu = ctx->cuda;
    attn__cuda_module m;
    attn__CUdeviceptr dst = (attn__CUdeviceptr)(uintptr_t)cb->d_out;
    unsigned long long n = 0;
    unsigned value = 0;
    void *args[3];
    char reason[256];
    double t[11];
    int g, k;
    args[0] = &dst; args[1] = &n; args[2] = &value;
    CHECK(ctx, attn__cuda_enter(ctx, "attn-bench"));
    CHECK(ctx, attn__cuda_load(ctx, "util.cu", "", "attn_fill_u32", NULL, 0, &m, reason, sizeof reason));
    for (g = -1; g < 11; g++) {
        float ms = 0;
        cu->cuEventRecord(cb->e0, NULL);
        for (k = 0; k < 200; k++)
            if (cu->cuLaunchKernel(m.main, 1, 1, 1, 128, 1, 1, 0, NULL, args, NULL) != 0) {
                fprintf(stderr, "attn-bench: the empty launch failed\n");
                exit(1);
            }
        cu->cuEventRecord(cb->e1, NULL);
        cu->cuEventSynchronize(cb->e1);
        cu->cuEventElapsedTime(&ms, cb->e0, cb->e1);
        if (g >= 0) t[g] = (double)ms * 1e-3 / 200;
    }
    cu->cuModuleUnload(m.module);
    attn__cuda_leave(ctx);
    return median(t, 11);
}

/* 3. MLA on the GPU (issue 9's shapes): DeepSeek-V3's latent cache (576 = 512 + 64), bf16,
   pages of 64, heads {16, 128}; decode through attn_mla_forward_mqa (q_latent + q_pe),
   batch {1, 16, 64, 128} x context {1k, 4k, 16k}: GB/s of latent read (B L 576 2 bytes)
   and TFLOP/s (2 B H L (576 + 512)); the fused call on one decode shape (its cuBLAS
   projections included); the prefill shape (128 heads, one sequence of 4096, causal, qk
   192 / v 128) through attn_mla_forward_mha: TFLOP/s over the causal-useful pairs, 2 H L(L+1)/2
   (192 + 128), the up-projection's GEMMs and gathers inside the time. */
#define MLA_POOL_BYTES ((size_t)12 << 30)
enum { MB_R = 512, MB_P = 64, MB_D = 576, MB_N = 128, MB_V = 128, MB_BS = 64 };

/* --mla-backend NAME: the CUDA MLA table's layers forced onto that backend by code (e.g.
   CUDA_MLA, the mma.sync fallback, on a Hopper GPU); unset, the selector chooses */
static attn_select_request mla_request = {ATTN_BACKEND_AUTO, 0};

/* Tuning: the bench's ATTN_BENCH_*_DEFINES knobs ("NAME=VALUE ...") become the decode
   role's ATTN_KERNEL_DEFINES (the library's seam: read at layer creation, shown in the
   layer's record) for the layers of that table: attn_layer_create under it, the variable
   restored after. The split policies follow the recompiled kernel by themselves. */
static void bench_layer_create(attn_context *ctx, const attn_layer_desc *d, const attn_select_request *req,
                               const char *knob, attn_layer **out) {
    char defs[512], buf[256], *tok, *saved = NULL;
    const char *old = getenv("ATTN_KERNEL_DEFINES"), *k = knob ? getenv(knob) : NULL;
    size_t n = 0;
    if (k && *k) {
        defs[0] = 0;
        snprintf(buf, sizeof buf, "%s", k);
        for (tok = strtok(buf, " "); tok; tok = strtok(NULL, " "))
            n += (size_t)snprintf(defs + n, n < sizeof defs ? sizeof defs - n : 0, "%sdecode.%s", n ? " " : "", tok);
        if (old) saved = strdup(old);
        setenv("ATTN_KERNEL_DEFINES", defs, 1);
    }
    CHECK(ctx, attn_layer_create(ctx, d, req, out));
    if (k && *k) {
        if (saved) setenv("ATTN_KERNEL_DEFINES", saved, 1);
        else unsetenv("ATTN_KERNEL_DEFINES");
        free(saved);
        printf("  %s: the decode kernels compiled with ATTN_KERNEL_DEFINES=\"%s\" (the record: \"%s\")\n", knob, defs,
               attn_layer_selection(*out)->kernel_defines);
    }
}

static attn_layer *mla_bench_layer(attn_context *ctx, int H) {
    attn_layer_desc d;
    attn_layer *layer = NULL;
    memset(&d, 0, sizeof d);
    d.use_mla = 1;
    d.num_heads = H;
    d.head_size = MB_D;
    d.kv_lora_rank = MB_R;
    d.qk_rope_head_dim = MB_P;
    d.qk_nope_head_dim = MB_N;
    d.v_head_dim = MB_V;
    d.block_size = MB_BS;
    d.dtype = d.kv_cache_dtype = ATTN_DTYPE_BF16;
    d.device = ATTN_DEVICE_CUDA;
    bench_layer_create(ctx, &d, &mla_request, "ATTN_BENCH_MLA_DEFINES", &layer);
    if (H == 16 || H == 128) printf("MLA layer, %d heads: backend %s\n", H, attn_backend_name(attn_layer_selection(layer)->resolved));
    return layer;
}

typedef struct {
    attn_context *ctx;
    attn_layer *layer;
    attn_metadata **metas;
    int nsets, kind;                   /* kind: 0 forward_mqa, 1 fused decode, 2 forward_mha */
    attn_tensor cache, q, q_pe, out, w_uk, w_uv;
} mla_call;

static void mla_call_run(void *arg, int k) { /* bench_groups' run */
    mla_call *c = (mla_call *)arg;
    attn_metadata *m = c->metas[k % c->nsets];
    if (c->kind == 0) CHECK(c->ctx, attn_mla_forward_mqa(c->layer, m, &c->q, &c->q_pe, &c->cache, &c->out, NULL, NULL));
    else if (c->kind == 1)
        CHECK(c->ctx, attn_mla_forward(c->layer, m, &c->q, &c->q_pe, NULL, NULL, &c->cache, &c->w_uk, &c->w_uv, &c->out, NULL));
    else CHECK(c->ctx, attn_mla_forward_mha(c->layer, m, &c->q, &c->cache, &c->w_uk, &c->w_uv, &c->out, NULL, NULL));
}

static attn_tensor mla_dev_tensor(void *p, int ndim, int64_t a, int64_t b, int64_t c) {
    int64_t s[3];
    attn_tensor t;
    s[0] = a; s[1] = b; s[2] = c;
    t = attn_tensor_make(p, ATTN_DTYPE_BF16, ndim, s);
    t.device.kind = ATTN_DEVICE_CUDA;
    return t;
}

/* One uniform decode case of the MLA table: B single-token requests of C keys, metadata sets
   rotating over CUDA_ROTATE_BYTES of the pool (iter_bytes a forward), forward_mqa. */
static void mla_decode_case(attn_context *ctx, mla_call *c, const int32_t *ids, int64_t pool_blocks, int B, int C, int H,
                            size_t iter_bytes, void *d_q, void *d_qpe, void *d_out) {
    int32_t ql[128], sl[128];
    int i;
    c->nsets = (int)((CUDA_ROTATE_BYTES + iter_bytes - 1) / iter_bytes);
    c->nsets = c->nsets < 2 ? 2 : c->nsets > CUDA_MAX_SETS ? CUDA_MAX_SETS : c->nsets;
    for (i = 0; i < B; i++) { ql[i] = 1; sl[i] = C; }
    c->metas = bench_metas(ctx, c->layer, ids, pool_blocks, MB_BS, B, B, ql, sl, c->nsets, 0);
    c->kind = 0;
    c->q = mla_dev_tensor(d_q, 3, B, H, MB_R);
    c->q_pe = mla_dev_tensor(d_qpe, 3, B, H, MB_P);
    c->out = mla_dev_tensor(d_out, 3, B, H, MB_R);
}

static void cuda_mla_table(attn_context *ctx, cuda_bench *cb, double read_best, double mm) {
    static const int heads[] = {16, 128}, batches[] = {1, 16, 64, 128}, contexts[] = {1024, 4096, 16384};
    const size_t block_bytes = (size_t)MB_BS * MB_D * 2;
    const int64_t pool_blocks = (int64_t)(MLA_POOL_BYTES / block_bytes);
    const size_t qbytes = (size_t)4096 * 128 * 192 * 2; /* the largest q: the prefill's */
    void *d_cache = NULL, *d_q = NULL, *d_qpe = NULL, *d_out = NULL, *d_wuk = NULL, *d_wuv = NULL;
    int32_t *ids = (int32_t *)bench_alloc((size_t)pool_blocks * sizeof(int32_t));
    size_t chunk = (size_t)64 << 20, off;
    uint16_t *host = (uint16_t *)bench_alloc(chunk + 1024);
    int hi, bi, ci, i;
    mla_call c;
    bench_row *row;
    double bf16_us[2][4][3]; /* [heads][batch][context]: the fp8 rows' reference */
    memset(bf16_us, 0, sizeof bf16_us);
    fill_random(host, ATTN_DTYPE_BF16, (chunk + 1024) / 2, 11);
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)pool_blocks * block_bytes, &d_cache));
    for (off = 0; off < (size_t)pool_blocks * block_bytes; off += chunk)
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)d_cache + off, (const char *)host + (off / chunk % 7) * 128,
                                    ATTN__MIN(chunk, (size_t)pool_blocks * block_bytes - off), ATTN_COPY_HOST_TO_DEVICE, NULL));
    CHECK(ctx, attn_cuda_malloc(ctx, qbytes, &d_q));
    CHECK(ctx, attn_cuda_malloc(ctx, qbytes, &d_qpe));
    CHECK(ctx, attn_cuda_malloc(ctx, qbytes, &d_out));
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)128 * MB_N * MB_R * 2, &d_wuk));
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)128 * MB_R * MB_V * 2, &d_wuv));
    for (off = 0; off < qbytes; off += chunk) {
        size_t n = ATTN__MIN(chunk, qbytes - off);
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)d_q + off, (const char *)host + 64, n, ATTN_COPY_HOST_TO_DEVICE, NULL));
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)d_qpe + off, (const char *)host + 192, n, ATTN_COPY_HOST_TO_DEVICE, NULL));
    }
    /* weights ~ U(-1, 1) / sqrt(R): projections of unit scale */
    for (i = 0; i < (int)((chunk + 1024) / 2); i++) host[i] = attn_f32_to_bf16(attn_bf16_to_f32(host[i]) * 0.044f);
    CHECK(ctx, attn_cuda_memcpy(ctx, d_wuk, host, (size_t)128 * MB_N * MB_R * 2, ATTN_COPY_HOST_TO_DEVICE, NULL));
    CHECK(ctx, attn_cuda_memcpy(ctx, d_wuv, (const char *)host + 512, (size_t)128 * MB_R * MB_V * 2,
                                ATTN_COPY_HOST_TO_DEVICE, NULL));
    free(host);
    shuffle_ids(ids, (int)pool_blocks, 43);
    memset(&c, 0, sizeof c);
    c.ctx = ctx;
    c.cache = mla_dev_tensor(d_cache, 3, pool_blocks, MB_BS, MB_D);
    c.w_uk = mla_dev_tensor(d_wuk, 3, 128, MB_N, MB_R);
    c.w_uv = mla_dev_tensor(d_wuv, 3, 128, MB_R, MB_V);
    /* tuning the fp8 latent's decode (ATTN_BENCH_MLA_FP8_ONLY: its 16-head rows only, against
       bf16 times given there as six numbers; ATTN_BENCH_MLA_DEFINES "NAME=VALUE ...": the MLA
       layers' decode compiled with these defines (ATTN_KERNEL_DEFINES); ATTN_BENCH_MLA_SPLITS: a forced split
       count) */
    const int fp8_h = getenv("ATTN_BENCH_MLA_FP8_H128") ? 1 : 0; /* with FP8_ONLY: the 128-head rows instead */
    if (getenv("ATTN_BENCH_MLA_FP8_ONLY"))
        sscanf(getenv("ATTN_BENCH_MLA_FP8_ONLY"), "%lf %lf %lf %lf %lf %lf", &bf16_us[fp8_h][1][1], &bf16_us[fp8_h][1][2],
               &bf16_us[fp8_h][2][1], &bf16_us[fp8_h][2][2], &bf16_us[fp8_h][3][1], &bf16_us[fp8_h][3][2]);
    for (hi = 0; hi < (getenv("ATTN_BENCH_MLA_FP8_ONLY") ? 0 : 2); hi++) {
        const int H = heads[hi];
        c.layer = mla_bench_layer(ctx, H);
        c.w_uk.shape[0] = c.w_uv.shape[0] = H;
        printf("MLA decode: %d heads, latent 576 (512 + 64), bf16, pages of %d; backend %s; forward_mqa; GB/s of "
               "latent read (B L 576 2 bytes), TFLOP/s = 2 B H L (576 + 512)\n", H, MB_BS,
               attn_layer_backend(c.layer)->name);
        for (bi = 0; bi < 4; bi++)
            for (ci = 0; ci < 3; ci++) {
                const int B = batches[bi], C = contexts[ci];
                const size_t iter_bytes = (size_t)B * (size_t)C * MB_D * 2;
                const double flops = 2.0 * B * H * (double)C * (MB_D + MB_R);
                attn_mla_info info;
                double med, gbs, tf;
                memset(&info, 0, sizeof info);
                mla_decode_case(ctx, &c, ids, pool_blocks, B, C, H, iter_bytes, d_q, d_qpe, d_out);
                med = bench_groups(cb, mla_call_run, &c, c.nsets < 20 ? 20 : c.nsets);
                bf16_us[hi][bi][ci] = med * 1e6;
                gbs = (double)iter_bytes / med / 1e9;
                tf = flops / med / 1e12;
                CHECK(ctx, attn_metadata_mla_info(c.metas[0], &info));
                printf("  batch %3d context %5d: %9.1f us  %7.0f GB/s (%5.1f%% of read)  %6.1f TFLOP/s (%5.1f%% of "
                       "matmul)  [%d splits, %d work items; %d sets]\n", B, C, med * 1e6, gbs, 100.0 * gbs / read_best,
                       tf, mm > 0 ? 100.0 * tf / mm : 0.0, info.num_kv_splits,
                       ((const attn__cuda_mla_meta *)attn_metadata_private(c.metas[0]))->host.counts[0], c.nsets);
                fflush(stdout);
                row = row_add();
                snprintf(row->name, sizeof row->name, "MLA decode H=%d b=%d ctx=%d (%d splits)", H, B, C, info.num_kv_splits);
                row->ms = med * 1e3;
                snprintf(row->metric, sizeof row->metric, "%.0f GB/s, %.1f TFLOP/s", gbs, tf);
                row->read_gbs = gbs;
                row->other_cores = -1;
                {
                    char kind[32];
                    snprintf(kind, sizeof kind, "mla_decode_h%d", H);
                    csv_row("attn.h", kind, B, C, med * 1e6, gbs, "GB/s");
                    snprintf(kind, sizeof kind, "mla_decode_h%d_tflops", H);
                    csv_row("attn.h", kind, B, C, med * 1e6, tf, "TFLOP/s");
                }
                if (B == 64 && C == 4096) { /* the fused call: projections by cuBLAS around the decode */
                    double mf;
                    c.kind = 1;
                    c.q = mla_dev_tensor(d_q, 3, B, H, MB_N);
                    c.out = mla_dev_tensor(d_out, 3, B, H, MB_V);
                    mf = bench_groups(cb, mla_call_run, &c, 20);
                    printf("  batch %3d context %5d: %9.1f us through attn_mla_forward (q_nope . W_UK, decode, . W_UV: "
                           "%.1f us around the decode)\n", B, C, mf * 1e6, (mf - med) * 1e6);
                    row = row_add();
                    snprintf(row->name, sizeof row->name, "MLA fused decode H=%d b=%d ctx=%d", H, B, C);
                    row->ms = mf * 1e3;
                    snprintf(row->metric, sizeof row->metric, "%.1f us more than forward_mqa", (mf - med) * 1e6);
                    row->other_cores = -1;
                    {
                        char kind[32];
                        snprintf(kind, sizeof kind, "mla_fused_decode_h%d", H);
                        csv_row("attn.h", kind, B, C, mf * 1e6, mf * 1e6, "us");
                    }
                }
                cuda_metas_free(c.metas, c.nsets);
            }
        if (H == 128) { /* the prefill shape: one sequence of 4096, causal, qk 192 / v 128 */
            const int L = 4096;
            const double flops = (double)H * (MB_N + MB_P + MB_V) * (double)L * (L + 1);
            static const int64_t ws[2] = {0, (int64_t)320 << 20};
            int32_t ql[1], sl[1];
            int w;
            ql[0] = sl[0] = L;
            for (w = 0; w < 2; w++) {
                attn_mla_info info;
                double med, tf;
                memset(&info, 0, sizeof info);
                c.nsets = 2;
                c.metas = bench_metas(ctx, c.layer, ids, pool_blocks, MB_BS, L, 1, ql, sl, c.nsets, ws[w]);
                c.kind = 2;
                c.q = mla_dev_tensor(d_q, 3, L, H, MB_N + MB_P);
                c.out = mla_dev_tensor(d_out, 3, L, H, MB_V);
                med = bench_groups(cb, mla_call_run, &c, 4);
                tf = flops / med / 1e12;
                CHECK(ctx, attn_metadata_mla_info(c.metas[0], &info));
                printf("MLA prefill: 128 heads, 1 x %d causal, qk 192 / v 128, forward_mha with workspace %s (chunks of "
                       "%d keys): %9.1f us  %6.1f TFLOP/s (%5.1f%% of matmul; gather and up-projection GEMMs "
                       "included, their FLOPs not counted)\n", L, ws[w] ? "320 MiB" : "64 MiB (default)", info.prefill_chunk,
                       med * 1e6, tf, mm > 0 ? 100.0 * tf / mm : 0.0);
                fflush(stdout);
                row = row_add();
                snprintf(row->name, sizeof row->name, "MLA prefill H=128 L=%d causal (chunk %d)", L, info.prefill_chunk);
                row->ms = med * 1e3;
                snprintf(row->metric, sizeof row->metric, "%.1f TFLOP/s", tf);
                if (mm > 0) snprintf(row->ceiling, sizeof row->ceiling, "%.1f%% of the matmul ceiling", 100.0 * tf / mm);
                row->other_cores = -1;
                csv_row("attn.h", w ? "mla_prefill_ws320" : "mla_prefill", 1, L, med * 1e6, tf, "TFLOP/s");
                cuda_metas_free(c.metas, c.nsets);
            }
        }
        attn_layer_destroy(c.layer);
    }
    /* fp8 latents (per-tensor scale 1/64; the pool's bytes read as e4m3 codes: timing only),
       forward_mqa against the bf16 latent's time above; issue 10's target: 16 heads >= 1.6x */
    for (hi = getenv("ATTN_BENCH_MLA_FP8_ONLY") ? fp8_h : 0; hi < (getenv("ATTN_BENCH_MLA_FP8_ONLY") ? fp8_h + 1 : 2); hi++) {
        const int H = heads[hi];
        attn_layer_desc d;
        memset(&d, 0, sizeof d);
        d.use_mla = 1; d.num_heads = H; d.head_size = MB_D; d.kv_lora_rank = MB_R; d.qk_rope_head_dim = MB_P;
        d.qk_nope_head_dim = MB_N; d.v_head_dim = MB_V; d.block_size = MB_BS;
        d.dtype = ATTN_DTYPE_BF16; d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3; d.k_scale.value = 1.0f / 64;
        d.device = ATTN_DEVICE_CUDA;
        bench_layer_create(ctx, &d, NULL, "ATTN_BENCH_MLA_DEFINES", &c.layer);
        bench_forced_splits = getenv("ATTN_BENCH_MLA_SPLITS") ? atoi(getenv("ATTN_BENCH_MLA_SPLITS")) : 0;
        c.cache = mla_dev_tensor(d_cache, 3, pool_blocks, MB_BS, MB_D);
        c.cache.dtype = ATTN_DTYPE_FP8_E4M3;
        printf("MLA decode, fp8 e4m3 latent (q/out bf16): %d heads; backend %s; GB/s of latent read (B L 576 bytes)\n", H,
               attn_layer_backend(c.layer)->name);
        for (bi = 1; bi < 4; bi++)
            for (ci = 1; ci < 3; ci++) {
                const int B = batches[bi], C = contexts[ci];
                const size_t iter_bytes = (size_t)B * (size_t)C * MB_D;
                double med;
                mla_decode_case(ctx, &c, ids, pool_blocks, B, C, H, iter_bytes, d_q, d_qpe, d_out);
                med = bench_groups(cb, mla_call_run, &c, c.nsets < 20 ? 20 : c.nsets);
                printf("  batch %3d context %5d: %9.1f us  %7.0f GB/s (%5.1f%% of read)  %.2fx the bf16 latent (%.1f us)\n", B,
                       C, med * 1e6, (double)iter_bytes / med / 1e9, 100.0 * (double)iter_bytes / med / 1e9 / read_best,
                       bf16_us[hi][bi][ci] / (med * 1e6), bf16_us[hi][bi][ci]);
                fflush(stdout);
                row = row_add();
                snprintf(row->name, sizeof row->name, "MLA decode H=%d b=%d ctx=%d, fp8 latent: %.2fx bf16", H, B, C,
                         bf16_us[hi][bi][ci] / (med * 1e6));
                row->ms = med * 1e3;
                snprintf(row->metric, sizeof row->metric, "%.0f GB/s", (double)iter_bytes / med / 1e9);
                row->read_gbs = (double)iter_bytes / med / 1e9;
                row->other_cores = -1;
                cuda_metas_free(c.metas, c.nsets);
            }
        bench_forced_splits = 0;
        attn_layer_destroy(c.layer);
    }
    attn_cuda_free(ctx, d_cache); attn_cuda_free(ctx, d_q); attn_cuda_free(ctx, d_qpe); attn_cuda_free(ctx, d_out);
    attn_cuda_free(ctx, d_wuk); attn_cuda_free(ctx, d_wuv);
    free(ids);
}

/* One decode forward of B requests of context C (a query token each) on cb's layer and
   cache, timed over enough metadata sets to read CUDA_ROTATE_BYTES (iter_bytes a forward):
   the median seconds, and the first set's schedule (work items of either decode shape,
   merges, wide or not) and the number of sets. */
typedef struct { double med; int items, merges, wide, nsets; } cuda_decode_run;
static cuda_decode_run cuda_decode_time(cuda_bench *cb, int B, int C, size_t iter_bytes) {
    cuda_decode_run d;
    int32_t *ql = (int32_t *)bench_alloc((size_t)B * 4), *sl = (int32_t *)bench_alloc((size_t)B * 4);
    attn_metadata **metas;
    const attn__cuda_meta *cm;
    int r;
    d.nsets = (int)((CUDA_ROTATE_BYTES + iter_bytes - 1) / iter_bytes);
    if (d.nsets < 2) d.nsets = 2;
    if (d.nsets > CUDA_MAX_SETS) d.nsets = CUDA_MAX_SETS;
    for (r = 0; r < B; r++) { ql[r] = 1; sl[r] = C; }
    metas = cuda_metas(cb, B, ql, sl, d.nsets);
    d.med = cuda_time(cb, metas, d.nsets, B, d.nsets < 20 ? 20 : d.nsets);
    cm = (const attn__cuda_meta *)attn_metadata_private(metas[0]);
    d.items = cm->host.counts[0] + cm->host.counts[3];
    d.merges = cm->host.counts[2];
    d.wide = cm->wide;
    cuda_metas_free(metas, d.nsets);
    free(ql); free(sl);
    return d;
}

/* 2. The backend on the GPU: ceilings, decode, prefill, a mixed batch (then MLA: 3.). */
/* 8-bit caches: the decode of the table above (32/8 heads, head 128, q/out bf16, block 16)
   over fp8 e4m3 / e5m2 caches with per-tensor scales and int8 / e4m3 ones with
   per-token-head scales, from a pool of their own (the bf16 pool's block count; codes
   0x20-0x3f, positive values of every type and, read as f32, finite positive scales),
   against the bf16 decode of the same shape measured above: GB/s of cache bytes (codes and
   scales), % of read, speed-up. bf16_us[bi][ci]: the bf16 times (batches 1, 16, 64, 128 x
   contexts 1k, 4k, 16k). */
static void cuda_decode_8bit(attn_context *ctx, const cuda_bench *cb16, double read_best, double bf16_us[4][3]) {
    static const struct { attn_dtype dt; int pth; } kinds[4] = {
        {ATTN_DTYPE_FP8_E4M3, 0}, {ATTN_DTYPE_FP8_E5M2, 0}, {ATTN_DTYPE_INT8, 1}, {ATTN_DTYPE_FP8_E4M3, 1}};
    static const int batches[] = {1, 16, 64, 128}, contexts[] = {1024, 4096, 16384};
    const size_t row_bytes = CB_D + 4; /* the larger layout (per-token-head) sizes the pool */
    const size_t block_bytes = (size_t)2 * CB_BS * CB_HKV * row_bytes, chunk = (size_t)64 << 20;
    cuda_bench cb = *cb16;
    void *pool = NULL;
    unsigned char *host;
    size_t off, i;
    int k, bi, ci;
    uint64_t st = 77;
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)cb.num_blocks * block_bytes, &pool));
    host = (unsigned char *)bench_alloc(chunk + 1024);
    for (i = 0; i < chunk + 1024; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = (unsigned char)(0x20 + ((st >> 33) & 0x1f));
    }
    for (off = 0; off < (size_t)cb.num_blocks * block_bytes; off += chunk) {
        size_t n = (size_t)cb.num_blocks * block_bytes - off < chunk ? (size_t)cb.num_blocks * block_bytes - off : chunk;
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)pool + off, host + (off / chunk % 7) * 128, n, ATTN_COPY_HOST_TO_DEVICE, NULL));
    }
    free(host);
    printf("decode, 8-bit caches (q/out bf16; the same shapes; GB/s of cache bytes read: codes, and scales per token "
           "and head; x: speed-up over the bf16 cache above):\n");
    for (k = 0; k < 4; k++) {
        attn_layer_desc d;
        int64_t shape[ATTN_MAX_DIMS];
        int ndim = 0;
        memset(&d, 0, sizeof d);
        d.num_heads = CB_H; d.num_kv_heads = CB_HKV; d.head_size = CB_D; d.block_size = CB_BS;
        d.dtype = ATTN_DTYPE_BF16; d.kv_cache_dtype = kinds[k].dt;
        d.device = ATTN_DEVICE_CUDA;
        if (kinds[k].pth) d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
        else d.k_scale.value = d.v_scale.value = 1.0f / 64;
        bench_layer_create(ctx, &d, NULL, "ATTN_BENCH_KV8_DEFINES", &cb.layer);
        CHECK(ctx, attn_layer_kv_cache_shape(cb.layer, cb.num_blocks, shape, &ndim));
        cb.kv = attn_tensor_make(pool, kinds[k].dt, ndim, shape);
        cb.kv.device.kind = ATTN_DEVICE_CUDA;
        printf("  KV %s%s (backend %s):\n", attn_dtype_name(kinds[k].dt), kinds[k].pth ? " per token+head" : " per tensor",
               attn_layer_backend(cb.layer)->name);
        for (bi = 0; bi < 4; bi++)
            for (ci = 1; ci < 3; ci++) {
                const int B = batches[bi], C = contexts[ci];
                const size_t iter_bytes = (size_t)B * (size_t)C * CB_HKV * (CB_D + (kinds[k].pth ? 4 : 0)) * 2;
                const double med = cuda_decode_time(&cb, B, C, iter_bytes).med, gbs = (double)iter_bytes / med / 1e9;
                bench_row *row;
                printf("    batch %3d context %5d: %9.1f us median  %7.0f GB/s  %5.1f%% of read  %.2fx bf16 (%.1f us)\n",
                       B, C, med * 1e6, gbs, 100.0 * gbs / read_best, bf16_us[bi][ci] / (med * 1e6), bf16_us[bi][ci]);
                fflush(stdout);
                row = row_add();
                snprintf(row->name, sizeof row->name, "decode b=%d ctx=%d, KV %s%s: %.2fx bf16", B, C,
                         attn_dtype_name(kinds[k].dt), kinds[k].pth ? " per token+head" : "", bf16_us[bi][ci] / (med * 1e6));
                row->ms = med * 1e3;
                snprintf(row->metric, sizeof row->metric, "%.0f GB/s KV read", gbs);
                row->read_gbs = gbs;
                row->other_cores = -1;
                {
                    char impl[64];
                    snprintf(impl, sizeof impl, "attn.h %s%s", attn_dtype_name(kinds[k].dt), kinds[k].pth ? " ptk" : "");
                    csv_row(impl, "decode", B, C, med * 1e6, gbs, "GB/s");
                }
            }
        { /* the prefill over the same cache: causal, 4 x 4096 (compare the bf16 prefill rows below) */
            int32_t ql[4] = {4096, 4096, 4096, 4096};
            attn_metadata **metas = cuda_metas(&cb, 4, ql, ql, 4);
            double med = cuda_time(&cb, metas, 4, 4 * 4096, 4), flops = 4.0 * 4.0 * CB_H * CB_D * 4096.0 * 4097 / 2;
            bench_row *row = row_add();
            printf("    prefill causal 4 x 4096: %9.1f us median  %6.1f TFLOP/s\n", med * 1e6, flops / med / 1e12);
            snprintf(row->name, sizeof row->name, "prefill causal b=4 L=4096, KV %s%s", attn_dtype_name(kinds[k].dt),
                     kinds[k].pth ? " per token+head" : "");
            row->ms = med * 1e3;
            snprintf(row->metric, sizeof row->metric, "%.1f TFLOP/s", flops / med / 1e12);
            row->other_cores = -1;
            cuda_metas_free(metas, 4);
        }
        attn_layer_destroy(cb.layer);
    }
    attn_cuda_free(ctx, pool);
}

static void cuda_backend_table(attn_context *ctx, int quick) {
    static const int batches[] = {1, 16, 64, 128}, contexts[] = {1024, 4096, 16384};
    static const int pre_b[] = {4, 1}, pre_l[] = {4096, 16384};
    const size_t block_bytes = (size_t)2 * CB_BS * CB_HKV * CB_D * 2;
    cuda_bench cb;
    attn_layer_desc d;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim, bi, ci, i;
    uint16_t *host;
    size_t chunk = (size_t)64 << 20, off;
    double read_best, read_med, read_best2, read_med2, mm, launch, t0, bf16_us[4][3];
    attn__cuda_driver *cu = ctx->cuda;
    char name[96];

    memset(&cb, 0, sizeof cb);
    cb.ctx = ctx;
    cb.groups = quick ? 5 : 11;
    cb.num_blocks = (int64_t)(CUDA_POOL_BYTES / block_bytes);
    memset(&d, 0, sizeof d);
    d.num_heads = CB_H; d.num_kv_heads = CB_HKV; d.head_size = CB_D; d.block_size = CB_BS;
    d.dtype = d.kv_cache_dtype = ATTN_DTYPE_BF16;
    d.device = ATTN_DEVICE_CUDA;
    CHECK(ctx, attn_layer_create(ctx, &d, NULL, &cb.layer));
    printf("layer (32/8 heads, head 128, bf16, block 16): backend %s%s (ATTN_BACKEND=CUDA for the "
           "mma.sync prefill)\n", attn_layer_backend(cb.layer)->name,
           attn_layer_backend(cb.layer)->id == ATTN_BACKEND_CUDA_SM90 ? ", prefill tiles on wgmma (sm_90a)" : "");
    CHECK(ctx, attn_layer_kv_cache_shape(cb.layer, cb.num_blocks, shape, &ndim));
    t0 = now_s();
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)cb.num_blocks * block_bytes, &cb.d_kv));
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)CUDA_MAX_TOKENS * CB_H * CB_D * 2, &cb.d_q));
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)CUDA_MAX_TOKENS * CB_H * CB_D * 2, &cb.d_out));
    host = (uint16_t *)bench_alloc(chunk + 1024);
    fill_random(host, ATTN_DTYPE_BF16, (chunk + 1024) / 2, 5);
    /* random bf16 in [-1, 1); each 64 MiB chunk from another offset of the host buffer */
    for (off = 0; off < (size_t)cb.num_blocks * block_bytes; off += chunk)
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)cb.d_kv + off, (const char *)host + (off / chunk % 7) * 128,
                                    chunk, ATTN_COPY_HOST_TO_DEVICE, NULL));
    for (off = 0; off < (size_t)CUDA_MAX_TOKENS * CB_H * CB_D * 2; off += chunk) /* q: 128 MiB */
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)cb.d_q + off, (const char *)host + (off / chunk % 7) * 128 + 64,
                                    chunk, ATTN_COPY_HOST_TO_DEVICE, NULL));
    free(host);
    printf("KV cache: %.1f GiB on the device (%lld blocks of 16 tokens), filled in %.1f s\n",
           (double)cb.num_blocks * (double)block_bytes / (1 << 30), (long long)cb.num_blocks, now_s() - t0);
    cb.kv = attn_tensor_make(cb.d_kv, ATTN_DTYPE_BF16, ndim, shape);
    cb.kv.device.kind = ATTN_DEVICE_CUDA;
    cb.ids = (int32_t *)bench_alloc((size_t)cb.num_blocks * sizeof(int32_t));
    shuffle_ids(cb.ids, (int)cb.num_blocks, 41);
    CHECK(ctx, attn__cuda_enter(ctx, "attn-bench"));
    if (cu->cuEventCreate(&cb.e0, 0) != 0 || cu->cuEventCreate(&cb.e1, 0) != 0) {
        fprintf(stderr, "attn-bench: cannot create CUDA events\n");
        exit(1);
    }
    attn__cuda_leave(ctx);

    read_best = cuda_read_ceiling(ctx, (attn__CUdeviceptr)(uintptr_t)cb.d_kv, (size_t)4 << 30, 10, &read_med);
    printf("read ceiling: %.0f GB/s best, %.0f median (attn_read_probe, 4 GiB, 10 passes)\n", read_best, read_med);
    mm = cuda_matmul_ceiling(&cb);
    if (mm > 0) printf("matmul ceiling: %.0f TFLOP/s (cuBLAS bf16 GEMM 8192^3, fp32 accumulate, best of 10)\n", mm);
    launch = cuda_launch_floor(&cb);
    printf("launch floor: %.2f us per launch (empty kernel, back to back on one stream; a forward is 2 "
           "launches: %.1f us before any byte is read)\n", launch * 1e6, 2 * launch * 1e6);
    csv_row("device", "launch_floor", 0, 0, launch * 1e6, 0, "us");
    fflush(stdout);

    printf("decode: %d/%d heads, head %d, bf16, block %d; GB/s = K+V bytes of the batch / time per forward\n",
           CB_H, CB_HKV, CB_D, CB_BS);
    memset(bf16_us, 0, sizeof bf16_us);
    /* ATTN_BENCH_KV8_ONLY (tuning): the 8-bit table alone, no bf16 rows to compare with */
    for (bi = 0; bi < (cuda_mla_only || getenv("ATTN_BENCH_KV8_ONLY") ? 0 : 4); bi++)
        for (ci = 0; ci < 3; ci++) {
            const int B = batches[bi], C = contexts[ci];
            const size_t iter_bytes = (size_t)B * (size_t)C * CB_HKV * CB_D * 2 * 2;
            const cuda_decode_run run = cuda_decode_time(&cb, B, C, iter_bytes);
            const double med = run.med, gbs = (double)iter_bytes / med / 1e9;
            bench_row *row;
            bf16_us[bi][ci] = med * 1e6;
            printf("  batch %3d context %5d: %9.1f us median  %7.0f GB/s  %5.1f%% of read  [%d %s work items, %d merges; "
                   "%d sets x %.1f MiB]\n", B, C, med * 1e6, gbs, 100.0 * gbs / read_best, run.items,
                   run.wide ? "wide" : "default", run.merges, run.nsets, (double)iter_bytes / MIB);
            fflush(stdout);
            row = row_add();
            snprintf(row->name, sizeof row->name, "decode b=%d ctx=%d (%d %s items, %d merges)", B, C, run.items,
                     run.wide ? "wide" : "default", run.merges);
            row->ms = med * 1e3;
            snprintf(row->metric, sizeof row->metric, "%.0f GB/s KV read", gbs);
            row->read_gbs = gbs;
            row->other_cores = -1;
            csv_row("attn.h", "decode", B, C, med * 1e6, gbs, "GB/s");
        }

    if (!cuda_mla_only) cuda_decode_8bit(ctx, &cb, read_best, bf16_us);

    printf("prefill: causal, %d/%d heads, head %d, bf16; TFLOP/s over causal-useful pairs, "
           "4 * heads * head * L(L+1)/2 per sequence\n", CB_H, CB_HKV, CB_D);
    for (i = 0; i < (cuda_mla_only || cuda_decode_only ? 0 : 2); i++) {
        int B = pre_b[i], L = pre_l[i], r, nsets = 4;
        int32_t ql[4], sl[4];
        attn_metadata **metas;
        double med, tf, flops = (double)B * 4.0 * CB_H * CB_D * (double)L * (L + 1) / 2;
        bench_row *row;
        for (r = 0; r < B; r++) { ql[r] = L; sl[r] = L; }
        metas = cuda_metas(&cb, B, ql, sl, nsets);
        med = cuda_time(&cb, metas, nsets, B * L, 4);
        tf = flops / med / 1e12;
        printf("  batch %d x %5d: %9.1f us median  %6.1f TFLOP/s  %5.1f%% of the matmul ceiling\n", B, L, med * 1e6,
               tf, mm > 0 ? 100.0 * tf / mm : 0.0);
        fflush(stdout);
        row = row_add();
        snprintf(row->name, sizeof row->name, "prefill causal b=%d L=%d", B, L);
        row->ms = med * 1e3;
        snprintf(row->metric, sizeof row->metric, "%.1f TFLOP/s", tf);
        if (mm > 0) snprintf(row->ceiling, sizeof row->ceiling, "%.1f%% of the matmul ceiling", 100.0 * tf / mm);
        else snprintf(row->ceiling, sizeof row->ceiling, "matmul ceiling not measured");
        row->other_cores = -1;
        csv_row("attn.h", "prefill", B, L, med * 1e6, tf, "TFLOP/s");
        cuda_metas_free(metas, nsets);
    }

    if (!cuda_mla_only && !cuda_decode_only) { /* vLLM's chunked prefill: one chunk of 2048 over 8192 cached tokens + 64 decodes of 4096 */
        int32_t ql[65], sl[65];
        attn_metadata **metas;
        double t_mix, t_pre, t_dec;
        bench_row *row;
        ql[0] = 2048; sl[0] = 8192 + 2048;
        for (i = 1; i <= 64; i++) { ql[i] = 1; sl[i] = 4096; }
        metas = cuda_metas(&cb, 65, ql, sl, 4);
        t_mix = cuda_time(&cb, metas, 4, 2048 + 64, 10);
        cuda_metas_free(metas, 4);
        metas = cuda_metas(&cb, 1, ql, sl, 4);
        t_pre = cuda_time(&cb, metas, 4, 2048, 10);
        cuda_metas_free(metas, 4);
        metas = cuda_metas(&cb, 64, ql + 1, sl + 1, 4);
        t_dec = cuda_time(&cb, metas, 4, 64, 20);
        cuda_metas_free(metas, 4);
        printf("mixed batch (1 prefill chunk of 2048 over 8192 cached + 64 decodes of 4096): %.1f us; its parts "
               "alone %.1f + %.1f = %.1f us (mixed / parts = %.2f)\n", t_mix * 1e6, t_pre * 1e6, t_dec * 1e6,
               (t_pre + t_dec) * 1e6, t_mix / (t_pre + t_dec));
        row = row_add();
        snprintf(name, sizeof name, "mixed: chunk 2048 over 8k + 64 decodes of 4k");
        snprintf(row->name, sizeof row->name, "%s", name);
        row->ms = t_mix * 1e3;
        snprintf(row->metric, sizeof row->metric, "parts alone %.1f + %.1f us", t_pre * 1e6, t_dec * 1e6);
        snprintf(row->ceiling, sizeof row->ceiling, "%.2f x the sum of its parts", t_mix / (t_pre + t_dec));
        row->other_cores = -1;
        csv_row("attn.h", "mixed", 65, 4096, t_mix * 1e6, (t_pre + t_dec) * 1e6, "us_parts");
    }

    if (!cuda_decode_only) cuda_mla_table(ctx, &cb, read_best, mm);
    read_best2 = cuda_read_ceiling(ctx, (attn__CUdeviceptr)(uintptr_t)cb.d_kv, (size_t)4 << 30, 10, &read_med2);
    if (read_best2 > read_best) read_best = read_best2;
    printf("read ceiling after the table: %.0f GB/s best, %.0f median; rows use the best of the run, %.0f GB/s\n",
           read_best2, read_med2, read_best);
    csv_row("device", "ceiling_read", 0, 0, 0, read_best, "GB/s");
    if (mm > 0) csv_row("cublas", "ceiling_matmul", 0, 0, 0, mm, "TFLOP/s");
    {
        bench_row *row = row_add();
        snprintf(row->name, sizeof row->name, "ceiling: device read (attn_read_probe, 4 GiB)");
        snprintf(row->metric, sizeof row->metric, "%.0f GB/s", read_best);
        snprintf(row->ceiling, sizeof row->ceiling, "100%% (best of 20 passes)");
        row->other_cores = -1;
        row = row_add();
        snprintf(row->name, sizeof row->name, "floor: one empty launch, back to back");
        row->ms = launch * 1e3;
        snprintf(row->metric, sizeof row->metric, "%.2f us", launch * 1e6);
        snprintf(row->ceiling, sizeof row->ceiling, "a forward is 2 launches");
        row->other_cores = -1;
        if (mm > 0) {
            row = row_add();
            snprintf(row->name, sizeof row->name, "ceiling: bf16 matmul (cuBLAS 8192^3)");
            snprintf(row->metric, sizeof row->metric, "%.0f TFLOP/s", mm);
            snprintf(row->ceiling, sizeof row->ceiling, "100%% (best of 10)");
            row->other_cores = -1;
        }
    }
    for (i = 0; i < num_rows; i++) /* decode rows against the run's best read */
        if (rows[i].read_gbs > 0)
            snprintf(rows[i].ceiling, sizeof rows[i].ceiling, "%.1f%% of read BW", 100.0 * rows[i].read_gbs / read_best);
    CHECK(ctx, attn__cuda_enter(ctx, "attn-bench"));
    cu->cuEventDestroy(cb.e0);
    cu->cuEventDestroy(cb.e1);
    attn__cuda_leave(ctx);
    attn_layer_destroy(cb.layer);
    attn_cuda_free(ctx, cb.d_kv); attn_cuda_free(ctx, cb.d_q); attn_cuda_free(ctx, cb.d_out);
    free(cb.ids);
}
#endif /* ATTN_NO_CUDA */

static int bench_cuda(int quick, const char *cmd, const char *csv_path) {
#ifdef ATTN_NO_CUDA
    (void)quick; (void)cmd; (void)csv_path;
    fprintf(stderr, "attn-bench: --device cuda: built with ATTN_NO_CUDA\n");
    return 2;
#else
    attn_context_desc cd;
    attn_context *ctx = NULL;
    attn_platform plat;
    int i;
    memset(&cd, 0, sizeof cd);
    cd.log_level = ATTN_LOG_LEVEL_WARN;
    CHECK(NULL, attn_context_create(&cd, &ctx));
    CHECK(ctx, attn_platform_get(ctx, &plat));
    printf("attn-bench (attn.h %s): CUDA backend\n", ATTN_VERSION_STRING);
    if (plat.kind == ATTN_PLATFORM_CUDA)
        printf("GPU: %s, compute capability %d.%d, %d SMs, %.0f GiB; driver %d\n", plat.cuda_device_name,
               plat.cuda_capability_major, plat.cuda_capability_minor, plat.cuda_multiprocessors,
               (double)plat.cuda_memory_bytes / (1 << 30), plat.cuda_driver_version);
    else
        printf("GPU: none (%s)\n", plat.cuda_reason);
    printf("command: %s\n\n", cmd);
    if (!plat.nvrtc_version) {
        fprintf(stderr, "attn-bench: --device cuda needs NVRTC (%s)\n", plat.nvrtc_reason);
        attn_context_destroy(ctx);
        return 2;
    }
    if (csv_path) {
        if (!(cuda_csv = fopen(csv_path, "w"))) {
            fprintf(stderr, "attn-bench: --csv %s: cannot write it\n", csv_path);
            attn_context_destroy(ctx);
            return 2;
        }
        fprintf(cuda_csv, "impl,kind,batch,context,us,value,unit\n");
    }
    if (!cuda_mla_only) cuda_compile_times(&plat, quick);
    printf("\n");
    if (plat.kind == ATTN_PLATFORM_CUDA && plat.cuda_capability_major >= 8)
        cuda_backend_table(ctx, quick);
    else
        printf("decode table: skipped (%s)\n", plat.kind == ATTN_PLATFORM_CUDA
               ? "compute capability below 8.0" : plat.cuda_reason);
    printf("\n| case | time ms (median) | metric | against |\n| --- | ---: | ---: | ---: |\n");
    for (i = 0; i < num_rows; i++)
        printf("| %s | %.3f | %s | %s |\n", rows[i].name, rows[i].ms, rows[i].metric, rows[i].ceiling);
    printf("\ncommand: %s\n", cmd);
    if (cuda_csv) fclose(cuda_csv);
    attn_context_destroy(ctx);
    return 0;
#endif
}

static void usage(FILE *f) {
    fprintf(f, "usage: attn-bench [--device cpu|cuda] [--threads N] [--quick] [--case decode|prefill|mla|all] [--csv FILE]\n"
               "                  [--mla-backend NAME]\n"
               "       attn-bench --selftest ROWS   the result table alone, with ROWS synthetic rows\n"
               "  --device D    cpu (default): the CPU backend against this CPU's ceilings;\n"
               "                cuda: NVRTC compile times (also without a GPU) and, on a GPU,\n"
               "                the CUDA decode, prefill and mixed-batch table against the\n"
               "                device's read bandwidth and bf16 matmul rate\n"
               "  --csv FILE    (cuda) also write the rows as CSV (tools/plot_bench.py)\n"
               "  --threads N   attn_context_desc.num_threads (default 0: the library's default)\n"
               "  --quick       fewer repetitions\n"
               "  --case C      decode, prefill, mla or all (default all)\n"
               "  --mla-backend NAME  (cuda) the MLA table's layers forced onto NAME (CUDA_MLA: the\n"
               "                mma.sync fallback on a Hopper GPU; default: the selector's choice)\n"
               "Tuning (cuda): ATTN_BENCH_KV8_DEFINES=\"KV_TILE=64 KV_STAGES=3 ...\" compiles the 8-bit\n"
               "table's decode tiles with these defines (through the library's ATTN_KERNEL_DEFINES, read at\n"
               "layer creation); ATTN_BENCH_MLA_DEFINES the same for the MLA tables; ATTN_BENCH_KV8_ONLY=1\n"
               "skips the bf16 decode rows.\n");
}

/* --selftest ROWS: the result table's own logic with ROWS synthetic rows (make test runs it
   with more rows than any real run makes): every row printed once, in order. */
static int bench_selftest(int n) {
    int i;
    for (i = 0; i < n; i++) {
        bench_row *r = row_add();
        snprintf(r->name, sizeof r->name, "selftest row %d", i);
        r->ms = 1e-3 * (double)i;
        snprintf(r->metric, sizeof r->metric, "%d", i);
        r->other_cores = -1;
    }
    printf("| case | time ms (median) | metric | against |\n| --- | ---: | ---: | ---: |\n");
    for (i = 0; i < num_rows; i++)
        printf("| %s | %.3f | %s | %s |\n", rows[i].name, rows[i].ms, rows[i].metric, rows[i].ceiling);
    free(rows);
    return 0;
}

int main(int argc, char **argv) {
    bench_opts o;
    attn_context_desc cd;
    attn_context *ctx = NULL;
    attn_platform plat;
    int i, cores, run_decode = 1, run_prefill = 1, run_mla = 1, read_passes, fma_passes;
    long fma_iters;
    size_t per_thread;
    float *buf;
    double t_read, t_fma, fma_flops, read1_gbs, fma1_gflops, ceil_other;
    load_probe probe;
    int contended = 0, on_cuda = 0;
    const char *csv_path = NULL;
    char cmd[1024], cpu[512];
    size_t cl = 0;

    memset(&o, 0, sizeof o);
    if (argc == 3 && !strcmp(argv[1], "--selftest")) return bench_selftest(atoi(argv[2]));
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            o.quick = 1;
        } else if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
            csv_path = argv[++i];
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            const char *dv = argv[++i];
            if (!strcmp(dv, "cpu")) on_cuda = 0;
            else if (!strcmp(dv, "cuda")) on_cuda = 1;
            else {
                fprintf(stderr, "attn-bench: --device %s (allowed: cpu, cuda)\n", dv);
                return 2;
            }
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 0 || n > 1024) {
                fprintf(stderr, "attn-bench: --threads %s (allowed: 0..1024)\n", argv[i]);
                return 2;
            }
            o.threads = (int)n;
        } else if (!strcmp(argv[i], "--case") && i + 1 < argc) {
            const char *c = argv[++i];
            if (!strcmp(c, "decode")) { run_decode = 1; run_prefill = 0; run_mla = 0; }
            else if (!strcmp(c, "prefill")) { run_decode = 0; run_prefill = 1; run_mla = 0; }
            else if (!strcmp(c, "mla")) { run_decode = 0; run_prefill = 0; run_mla = 1; }
            else if (!strcmp(c, "all")) { run_decode = 1; run_prefill = 1; run_mla = 1; }
            else {
                fprintf(stderr, "attn-bench: --case %s (allowed: decode, prefill, mla, all)\n", c);
                return 2;
            }
        } else if (!strcmp(argv[i], "--mla-backend") && i + 1 < argc) {
            if (attn_backend_from_name(argv[++i], &mla_request.backend) != ATTN_OK) {
                fprintf(stderr, "attn-bench: --mla-backend %s (allowed: a registered backend name, e.g. CUDA_MLA_SM90 or CUDA_MLA)\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "attn-bench: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    cmd[0] = '\0';
    for (i = 0; i < argc && cl + 2 < sizeof cmd; i++) {
        int n = snprintf(cmd + cl, sizeof cmd - cl, "%s%s", i ? " " : "", argv[i]);
        if (n < 0) break;
        cl += (size_t)n;
        if (cl >= sizeof cmd) { cl = sizeof cmd - 1; break; }
    }
    cuda_mla_only = run_mla && !run_decode && !run_prefill;
    cuda_decode_only = run_decode && !run_prefill && !run_mla;
    if (on_cuda) return bench_cuda(o.quick, cmd, csv_path);

    memset(&cd, 0, sizeof cd);
    cd.log_level = ATTN_LOG_LEVEL_WARN;
    cd.num_threads = o.threads;
    CHECK(NULL, attn_context_create(&cd, &ctx));
    CHECK(ctx, attn_platform_get(ctx, &plat));

    cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if (cores > 256) cores = 256;
    cpu_describe(cpu, sizeof cpu);
    o.lib_threads = plat.cpu_threads > 0 ? plat.cpu_threads : 1;
    printf("attn-bench (attn.h %s): CPU backend, %d online cores, library threads %d, "
           "library SIMD %s\n", ATTN_VERSION_STRING, plat.cpu_cores, plat.cpu_threads, plat.cpu_simd);
    printf("CPU: %s\n", cpu);
    printf("command: %s\n", cmd);
    if (load_average() >= 0) printf("load average (1 min) at start: %.2f\n", load_average());
    printf("\n");

    /* 1. Ceilings. */
    read_passes = o.quick ? 3 : 7;
    fma_passes = o.quick ? 3 : 7;
    per_thread = BENCH_READ_BYTES / sizeof(float) / (size_t)cores / READ_UNROLL * READ_UNROLL;
    buf = (float *)bench_alloc(per_thread * (size_t)cores * sizeof(float));
    probe_start(&probe);
    t_read = ceil_run(CEIL_READ, cores, read_passes, buf, per_thread, 1, 0);
    o.read_gbs = (double)(per_thread * (size_t)cores * sizeof(float)) / t_read / 1e9;
    /* One thread alone, for context only (on a VM, two vCPUs may share a physical core). */
    read1_gbs = cores > 1 ? (double)(per_thread * (size_t)cores * sizeof(float)) /
                            ceil_run(CEIL_READ, 1, read_passes, buf, per_thread * (size_t)cores, 0, 0) / 1e9
                          : o.read_gbs;
    o.read_best = o.read_worst = o.read_gbs;
    o.cores = cores;
    o.read_buf = buf; /* kept for the read ceiling around every decode case */
    o.read_per_thread = per_thread;
    fma_iters = o.quick ? 10000000L : 25000000L;
    t_fma = ceil_run(CEIL_FMA, cores, fma_passes, NULL, 0, 0, fma_iters);
    fma_flops = (double)cores * (double)fma_iters * FMA_CHAINS * CEIL_LANES * 2.0;
    o.fma_gflops = fma_flops / t_fma / 1e9;
    fma1_gflops = cores > 1 ? fma_flops / cores / ceil_run(CEIL_FMA, 1, fma_passes, NULL, 0, 0, fma_iters) / 1e9
                            : o.fma_gflops;
    ceil_other = probe_other_cores(&probe);
    printf("ceilings (%d threads, one per online core; other load %.2f cores):\n", cores, ceil_other);
    printf("  memory read : %8.1f GB/s    (%s loads, 8 accumulators/thread, %.0f MiB buffer, "
           "best of %d passes, %.2f ms; 1 thread alone: %.1f GB/s)\n", o.read_gbs, CEIL_SIMD,
           (double)(per_thread * (size_t)cores * sizeof(float)) / MIB, read_passes, t_read * 1e3,
           read1_gbs);
    printf("  FP32 FMA    : %8.1f GFLOP/s (%s, %d chains/thread, 2 flops/lane, best of %d passes, "
           "%.2f ms; 1 thread alone: %.1f GFLOP/s)\n\n", o.fma_gflops, CEIL_SIMD, FMA_CHAINS,
           fma_passes, t_fma * 1e3, fma1_gflops);
    fflush(stdout);
    {
        bench_row *r = row_add();
        snprintf(r->name, sizeof r->name, "ceiling: memory read, %d threads, %s", cores, CEIL_SIMD);
        r->ms = t_read * 1e3;
        snprintf(r->metric, sizeof r->metric, "%.1f GB/s", o.read_gbs);
        snprintf(r->ceiling, sizeof r->ceiling, "100%% (best of %d)", read_passes);
        r->other_cores = ceil_other;
        r = row_add();
        snprintf(r->name, sizeof r->name, "ceiling: FP32 FMA, %d threads, %s", cores, CEIL_SIMD);
        r->ms = t_fma * 1e3;
        snprintf(r->metric, sizeof r->metric, "%.1f GFLOP/s", o.fma_gflops);
        snprintf(r->ceiling, sizeof r->ceiling, "100%% (best of %d)", fma_passes);
        r->other_cores = ceil_other;
    }

    /* 2. The library. */
    if (run_decode) {
        bench_decode(ctx, &o, 1, ATTN_DTYPE_F16, ATTN_DTYPE_F16, 0);
        bench_decode(ctx, &o, 8, ATTN_DTYPE_F16, ATTN_DTYPE_F16, 0);
        bench_decode(ctx, &o, 1, ATTN_DTYPE_F32, ATTN_DTYPE_F32, 0);
        bench_decode(ctx, &o, 8, ATTN_DTYPE_F32, ATTN_DTYPE_F32, 0);
        bench_decode(ctx, &o, 1, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, 0);
        bench_decode(ctx, &o, 8, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, 0);
        bench_decode(ctx, &o, 1, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, 0); /* fp8 caches, per-tensor scales */
        bench_decode(ctx, &o, 8, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, 0);
        bench_decode(ctx, &o, 8, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E5M2, 0);
        bench_decode(ctx, &o, 8, ATTN_DTYPE_F16, ATTN_DTYPE_INT8, 1); /* per-token-head scales */
        bench_decode(ctx, &o, 8, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, 1);
        printf("read ceiling during the decode cases: %.1f to %.1f GB/s (%d threads); rows use the "
               "best, %.1f GB/s\n", o.read_worst, o.read_best, cores, o.read_best);
        {
            bench_row *r = row_add();
            snprintf(r->name, sizeof r->name, "ceiling: memory read, best of the run (before/after each decode case)");
            r->ms = 0.0;
            snprintf(r->metric, sizeof r->metric, "%.1f GB/s (lowest %.1f)", o.read_best, o.read_worst);
            snprintf(r->ceiling, sizeof r->ceiling, "the reference of the read-bound rows");
            r->other_cores = -1.0;
        }
    }
    free(buf);
    o.read_buf = NULL;
    if (run_prefill) {
        bench_prefill(ctx, &o, 512);
        bench_prefill(ctx, &o, 2048);
    }
    if (run_mla) {
        if (run_decode || run_prefill) printf("\n");
        mla_roofline_note(&o);
        printf("\n");
        fflush(stdout);
        bench_mla(ctx, &o, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
        bench_mla(ctx, &o, ATTN_DTYPE_F16, ATTN_DTYPE_F16);
        bench_mla(ctx, &o, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3); /* fp8 latent, per-tensor scale */
    }

    /* 3. The table. */
    printf("\nCPU: %s; %d cores, library threads %d, SIMD %s\n", cpu, cores, plat.cpu_threads,
           plat.cpu_simd);
    printf("\n| case | time ms (median) | metric | %% of ceiling |\n");
    printf("| --- | ---: | ---: | ---: |\n");
    for (i = 0; i < num_rows; i++) {
        int flag = rows[i].other_cores > CONTENDED_CORES;
        bench_row *r = &rows[i];
        contended |= flag;
        if (r->read_gbs > 0 && r->gflops > 0)
            snprintf(r->ceiling, sizeof r->ceiling, "%.1f%% of best read BW; %.1f%% of FMA peak",
                     100.0 * r->read_gbs / o.read_best, 100.0 * r->gflops / o.fma_gflops);
        else if (r->read_gbs > 0)
            snprintf(r->ceiling, sizeof r->ceiling, "%.1f%% of best read BW; %.1f GB/s per core",
                     100.0 * r->read_gbs / o.read_best, r->read_gbs / o.lib_threads);
        printf("| %s%s | %.3f | %s | %s |\n", r->name, flag ? " (*)" : "", r->ms, r->metric, r->ceiling);
    }
    printf("\n");
    if (run_decode || run_prefill)
        printf("decode/prefill rows: heads 32/8, head_size 128, block_size 16.\n");
    if (run_mla) {
        printf("MLA rows: attn_mla_forward_mqa (absorbed decode; q [b, H, 576], out_latent "
               "[b, H, 512], q/out in the latent dtype), kv_lora_rank 512 + rope 64, block_size %d, "
               "shuffled block ids, num_kv_splits automatic; each iteration reads another block "
               "set of a %.0f MiB latent cache. GB/s = b*%d*576*2 bytes / time; GFLOP/s = "
               "2*b*H*%d*(576+512) / time.\n", BENCH_MLA_BLOCK,
               (double)BENCH_MLA_SEQS * BENCH_CONTEXT * BENCH_MLA_HEAD * 2.0 / MIB, BENCH_CONTEXT,
               BENCH_CONTEXT);
        mla_roofline_note(&o);
    }
    printf("library threads %d, %d cores; ceiling rows show the best pass time. Best read BW: the "
           "best of the read ceilings measured in this run (%.1f GB/s; at the start %.1f, lowest "
           "%.1f); per core: GB/s / library threads.\n", plat.cpu_threads, cores, o.read_best,
           o.read_gbs, o.read_worst);
    if (contended)
        printf("(*) other processes used more than %.2f cores while this row ran (see \"other "
               "load\" above): its time and, through a contended ceiling, its fraction are not "
               "representative; rerun on an idle machine.\n", CONTENDED_CORES);
    printf("command: %s\n", cmd);
    if (load_average() >= 0)
        printf("load average (1 min) at end: %.2f (includes this run; more than the core count "
               "means other processes competed for the cores)\n", load_average());

    attn_context_destroy(ctx);
    return 0;
}
