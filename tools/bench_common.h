/* bench_common.h - what the two benchmarks share (tools/attn-bench.c, the CPU backend and
   the dispatcher; tools/attn-bench-cuda.c, the CUDA backend): a monotonic timer, random
   fills, the median and best of timed passes, this CPU's read and FP32 FMA ceilings, and
   the result table (markdown rows that grow as cases add them, CSV lines for
   tools/plot_bench.py). Public attn.h API only (attn_* names, no double-underscore ones):
   include it after attn.h. Every function is static inline, so a tool that uses one piece
   pays nothing for the others and an unused one draws no warning. */
#ifndef ATTN_BENCH_COMMON_H
#define ATTN_BENCH_COMMON_H

#include <pthread.h>
#include <time.h>
#include <stdint.h>
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

/* The program's name in its error lines ("attn-bench", "attn-bench-cuda"); main sets it. */
static const char *bench_name = "attn-bench";

/* ---------------------------------------------------------------------------------------
   Small helpers: time, random numbers, allocation, failure
   ------------------------------------------------------------------------------------- */

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline uint64_t rng_next(uint64_t *s) { /* xorshift64 */
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static inline float rng_unit(uint64_t *s) { /* uniform in [-1, 1) */
    return (float)((double)(rng_next(s) >> 40) / (double)(1u << 23) - 1.0);
}

static inline uint64_t rng_seed(uint64_t x) { return x * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull; }

static inline void *bench_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0 || !p) {
        fprintf(stderr, "%s: cannot allocate %.1f MiB\n", bench_name, (double)bytes / MIB);
        exit(1);
    }
    return p;
}

static inline void bench_check(attn_context *ctx, attn_status st, const char *what) {
    if (st == ATTN_OK) return;
    fprintf(stderr, "%s: %s failed: %s: %s\n", bench_name, what, attn_status_string(st),
            attn_context_last_error(ctx));
    exit(1);
}
#define CHECK(ctx, call) bench_check((ctx), (call), #call)

/* Random values in [-1, 1) in the given dtype. For large f16/bf16 buffers the values come
   from a 64 Ki-entry table of converted random floats (converting 300M elements one by one
   would dominate the run); every element is still independently drawn. */
/* Sparse MLA's indices: for each of `rows` tokens, topk distinct positions of 0 .. ctx - 1 in
   random order (a partial Fisher-Yates shuffle; perm: ctx ints of scratch). */
static inline void bench_topk_positions(int32_t *out, int rows, int topk, int ctx, int32_t *perm, uint64_t seed) {
    int i, k;
    for (i = 0; i < rows; i++) {
        for (k = 0; k < ctx; k++) perm[k] = k;
        for (k = 0; k < topk; k++) {
            int j;
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            j = k + (int)((seed >> 33) % (uint64_t)(ctx - k));
            out[(size_t)i * (size_t)topk + (size_t)k] = perm[j];
            perm[j] = perm[k];
        }
    }
}

static inline void fill_random(void *data, attn_dtype dt, size_t n, uint64_t seed) {
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
        const size_t whole = n / 4 * 4; /* four values per random draw, then the tail */
        for (i = 0; i < 65536; i++)
            table[i] = dt == ATTN_DTYPE_F16 ? attn_f32_to_f16(rng_unit(&s)) : attn_f32_to_bf16(rng_unit(&s));
        for (i = 0; i < whole; i += 4) {
            uint64_t r = rng_next(&s);
            h[i] = table[r & 0xffff];
            h[i + 1] = table[(r >> 16) & 0xffff];
            h[i + 2] = table[(r >> 32) & 0xffff];
            h[i + 3] = table[(r >> 48) & 0xffff];
        }
        for (i = whole; i < n; i++) h[i] = table[rng_next(&s) & 0xffff];
        free(table);
    }
}

static inline void shuffle_ids(int32_t *ids, int n, uint64_t seed) {
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

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

/* Sorts t in place; returns the median. */
static inline double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Every output element must be finite: a broken kernel must not pass as a fast one. */
static inline void check_finite(const void *data, attn_dtype dt, size_t n, const char *name) {
    size_t i;
    for (i = 0; i < n; i++) {
        float x = dt == ATTN_DTYPE_F32 ? ((const float *)data)[i]
                : dt == ATTN_DTYPE_F16 ? attn_f16_to_f32(((const uint16_t *)data)[i])
                                       : attn_bf16_to_f32(((const uint16_t *)data)[i]);
        if (!isfinite(x)) {
            fprintf(stderr, "%s: %s: output element %zu is not finite (%g)\n", bench_name, name, i,
                    (double)x);
            exit(1);
        }
    }
}

/* The best (smallest) of n times. */
static inline double best_of(const double *t, int n) {
    double b = t[0];
    int i;
    for (i = 1; i < n; i++)
        if (t[i] < b) b = t[i];
    return b;
}

/* ---------------------------------------------------------------------------------------
   This CPU's ceilings: memory read bandwidth and FP32 FMA throughput, one thread per core
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
static inline float read_sum(const float *p, size_t n) {
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
static inline float fma_chains(long iters, float seed) {
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

static inline void *ceil_thread_main(void *varg) {
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
static inline double ceil_run(ceil_kind kind, int nthreads, int passes, float *buf, size_t floats_per_thread,
                       int fill, long fma_iters) {
    pthread_t th[256];
    ceil_thread args[256];
    pthread_barrier_t barrier;
    double times[64], best;
    float sink = 0.0f;
    int i;
    if (pthread_barrier_init(&barrier, NULL, (unsigned)nthreads) != 0) {
        fprintf(stderr, "%s: pthread_barrier_init failed\n", bench_name);
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
            fprintf(stderr, "%s: pthread_create failed\n", bench_name);
            exit(1);
        }
    }
    for (i = 0; i < nthreads; i++) {
        pthread_join(th[i], NULL);
        sink += args[i].sink;
    }
    pthread_barrier_destroy(&barrier);
    if (!isfinite(sink)) fprintf(stderr, "%s: note: ceiling checksum %g\n", bench_name, (double)sink);
    best = times[0];
    for (i = 1; i < passes; i++)
        if (times[i] < best) best = times[i];
    return best;
}

/* ---------------------------------------------------------------------------------------
   Results: the markdown table (rows grow as cases add them) and the CSV lines
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

static inline bench_row *row_add(void) {
    if (num_rows == cap_rows) {
        int cap = cap_rows ? 2 * cap_rows : 64;
        bench_row *r = (bench_row *)realloc(rows, (size_t)cap * sizeof *r);
        if (!r) {
            fprintf(stderr, "%s: out of memory for %d result rows\n", bench_name, cap);
            exit(1);
        }
        rows = r;
        cap_rows = cap;
    }
    memset(&rows[num_rows], 0, sizeof rows[num_rows]);
    return &rows[num_rows++];
}

/* One markdown row. The header is the caller's (its last column differs per tool). */
static inline void row_print(const bench_row *r, const char *flag) {
    printf("| %s%s | %.3f | %s | %s |\n", r->name, flag, r->ms, r->metric, r->ceiling);
}

/* The table with the "against" column, every row in order. */
static inline void rows_print(void) {
    int i;
    printf("| case | time ms (median) | metric | against |\n| --- | ---: | ---: | ---: |\n");
    for (i = 0; i < num_rows; i++) row_print(&rows[i], "");
}

static inline void rows_free(void) {
    free(rows);
    rows = NULL;
    num_rows = cap_rows = 0;
}

/* --csv FILE: one line per measured row, columns impl,kind,batch,context,us,value,unit */
static FILE *bench_csv;

static inline int csv_open(const char *path) {
    if (!(bench_csv = fopen(path, "w"))) return 0;
    fprintf(bench_csv, "impl,kind,batch,context,us,value,unit\n");
    return 1;
}

static inline void csv_row(const char *impl, const char *kind, int batch, int context, double us, double value,
                    const char *unit) {
    if (bench_csv) fprintf(bench_csv, "%s,%s,%d,%d,%.2f,%.1f,%s\n", impl, kind, batch, context, us, value, unit);
}

static inline void csv_close(void) {
    if (bench_csv) fclose(bench_csv);
    bench_csv = NULL;
}

/* --selftest ROWS: the result table's own logic with ROWS synthetic rows (make test runs it
   with more rows than any real run makes): every row printed once, in order. */
static inline int bench_selftest(int n) {
    int i;
    for (i = 0; i < n; i++) {
        bench_row *r = row_add();
        snprintf(r->name, sizeof r->name, "selftest row %d", i);
        r->ms = 1e-3 * (double)i;
        snprintf(r->metric, sizeof r->metric, "%d", i);
        r->other_cores = -1;
    }
    rows_print();
    rows_free();
    return 0;
}

/* The command line as one string (the tables end with it). */
static inline void command_line(int argc, char **argv, char *cmd, size_t size) {
    size_t cl = 0;
    int i;
    cmd[0] = '\0';
    for (i = 0; i < argc && cl + 2 < size; i++) {
        int n = snprintf(cmd + cl, size - cl, "%s%s", i ? " " : "", argv[i]);
        if (n < 0) break;
        cl += (size_t)n;
        if (cl >= size) { cl = size - 1; break; }
    }
}

#endif /* ATTN_BENCH_COMMON_H */
