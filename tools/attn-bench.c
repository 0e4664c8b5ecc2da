#define _POSIX_C_SOURCE 200809L
/* attn-bench: the CPU backend of attn.h against this machine's own ceilings, in one run;
   and the one command for both benches: `attn-bench --device cuda ...` runs
   attn-bench-cuda (tools/attn-bench-cuda.c, next to this binary) with the same arguments.
   Public API only: attn.h's attn_* functions and types, no private (double-underscore)
   name; the timing, the ceilings and the result table come from tools/bench_common.h.

   1. Ceilings, measured here and now with one thread per online core:
        memory read  - each thread sums its own slice of a 1 GiB buffer (far beyond any L3)
                       with the widest vector loads and 8 independent accumulators; best pass.
        FP32 FMA     - 16 independent FMA chains per thread in the widest vectors (AVX-512,
                       else AVX2, else scalar), 2 flops per lane per FMA; best pass.
   2. attn.h, timed through its public API (context, layer, metadata, forward, MLA
      forward_mqa):
        decode   - 32 query / 8 KV heads, head 128, context 4096, batch 1 and 8, KV cache f16,
                   f32 and bf16 (q/out in the same dtype), and 8-bit caches (fp8 per tensor,
                   int8 / e4m3 per token and head). Metric: GB/s of KV read, against the
                   best read ceiling of the run, and GB/s per core. Every iteration reads a
                   different set of blocks (randomly shuffled block ids) out of >= 640 MiB
                   of cache, so nothing is served from the previous iteration's L3 contents.
        prefill  - 512 and 2048 tokens, causal, same heads, batch 1, f16. Metric: GFLOP/s
                   over unmasked (query, key) pairs only, 4 * head * heads * L(L+1)/2,
                   against the FP32 FMA ceiling (the CPU backend computes in fp32).
        mla      - MLA absorbed decode, attn_mla_forward_mqa: 16 and 128 heads, context 4096,
                   batch 1 and 4, latent cache bf16, f16 and fp8 (q [b, H, 576] and out_latent
                   [b, H, 512] in bf16/f16), block size 16, shuffled block ids,
                   num_kv_splits automatic. Every iteration uses another metadata over a
                   disjoint block set of a 648 MiB latent cache (> the 260 MiB L3). Metrics:
                   GB/s of latent read (b * 4096 * 576 * bytes / time) against the read
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

   Build: make build/attn-bench (make builds attn-bench-cuda beside it).
   Usage: attn-bench [--threads N] [--quick] [--case decode|prefill|mla|all]
          attn-bench --device cuda [attn-bench-cuda's options]
          attn-bench --selftest ROWS */
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
#include <errno.h>

#include "bench_common.h"

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
   Cascade: decodes sharing a prefix, with and without attn_metadata_build's
   common_prefix_len (issue 23's shape: 64 decodes, a 16k-token shared prefix, 512 tokens
   each of their own; --quick: 16 decodes, 4k). One cache, shuffled blocks; the two
   forwards' outputs must agree (f16 rounding).
   ------------------------------------------------------------------------------------- */

static void bench_cascade(attn_context *ctx, const bench_opts *o) {
    const int batch = o->quick ? 16 : 64, prefix = o->quick ? 4096 : 16384, own = 512;
    const int pb = prefix / BENCH_BLOCK, ob = own / BENCH_BLOCK, bps = pb + ob;
    const int64_t num_blocks = pb + (int64_t)batch * ob;
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta[2] = {NULL, NULL};
    attn_tensor kv, q, out[2];
    int64_t shape[ATTN_MAX_DIMS], qshape[3];
    int ndim, i, k, reps;
    size_t esz = 2, nq = (size_t)batch * BENCH_HEADS * BENCH_HEAD_SIZE;
    int32_t *ids, *table, *qsl, *seq_lens;
    void *kv_data, *q_data, *out_data[2];
    double med[2], maxdiff = 0.0;
    bench_row *row;

    memset(&d, 0, sizeof d);
    d.num_heads = BENCH_HEADS; d.num_kv_heads = BENCH_KV_HEADS; d.head_size = BENCH_HEAD_SIZE;
    d.dtype = d.kv_cache_dtype = ATTN_DTYPE_F16; d.block_size = BENCH_BLOCK;
    CHECK(ctx, attn_layer_create(ctx, &d, NULL, &layer));
    CHECK(ctx, attn_layer_kv_cache_shape(layer, num_blocks, shape, &ndim));
    kv = attn_tensor_make(NULL, ATTN_DTYPE_F16, ndim, shape);
    kv.data = kv_data = bench_alloc(attn_tensor_nbytes(&kv));
    fill_random(kv_data, ATTN_DTYPE_F16, attn_tensor_nbytes(&kv) / esz, 31);
    qshape[0] = batch; qshape[1] = BENCH_HEADS; qshape[2] = BENCH_HEAD_SIZE;
    q_data = bench_alloc(nq * esz);
    fill_random(q_data, ATTN_DTYPE_F16, nq, 32);
    q = attn_tensor_make(q_data, ATTN_DTYPE_F16, 3, qshape);
    ids = (int32_t *)bench_alloc((size_t)num_blocks * sizeof(int32_t));
    shuffle_ids(ids, (int)num_blocks, 33);
    table = (int32_t *)bench_alloc((size_t)batch * (size_t)bps * sizeof(int32_t));
    for (i = 0; i < batch; i++) /* the prefix's blocks in every row, then the request's own */
        for (k = 0; k < bps; k++) table[(size_t)i * (size_t)bps + (size_t)k] = k < pb ? ids[k] : ids[pb + i * ob + (k - pb)];
    qsl = (int32_t *)bench_alloc(((size_t)batch + 1) * sizeof(int32_t));
    seq_lens = (int32_t *)bench_alloc((size_t)batch * sizeof(int32_t));
    for (i = 0; i <= batch; i++) qsl[i] = i;
    for (i = 0; i < batch; i++) seq_lens[i] = prefix + own;
    for (k = 0; k < 2; k++) {
        attn_metadata_desc md;
        attn_batch b;
        out_data[k] = bench_alloc(nq * esz);
        out[k] = attn_tensor_make(out_data[k], ATTN_DTYPE_F16, 3, qshape);
        memset(&md, 0, sizeof md);
        md.max_num_reqs = batch; md.max_num_tokens = batch; md.max_blocks_per_req = bps; md.num_blocks = num_blocks;
        CHECK(ctx, attn_metadata_create(layer, &md, &meta[k]));
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq_lens; b.block_table = table; b.block_table_stride = bps;
        b.num_reqs = batch; b.num_actual_tokens = batch; b.max_query_len = 1; b.max_seq_len = prefix + own;
        CHECK(ctx, attn_metadata_build(meta[k], k ? prefix : 0, &b, 0));
    }
    for (k = 0; k < 2; k++) {
        double t0 = now_s(), *t;
        CHECK(ctx, attn_layer_forward(layer, meta[k], &q, NULL, NULL, &kv, &out[k], NULL, NULL));
        reps = reps_for(o, now_s() - t0, 0);
        t = (double *)bench_alloc((size_t)reps * sizeof(double));
        for (i = 0; i < reps; i++) {
            t0 = now_s();
            CHECK(ctx, attn_layer_forward(layer, meta[k], &q, NULL, NULL, &kv, &out[k], NULL, NULL));
            t[i] = now_s() - t0;
        }
        med[k] = median(t, reps);
        free(t);
    }
    check_finite(out_data[1], ATTN_DTYPE_F16, nq, "cascade");
    for (i = 0; i < (int)nq; i++) {
        double a = attn_f16_to_f32(((const uint16_t *)out_data[0])[i]), c = attn_f16_to_f32(((const uint16_t *)out_data[1])[i]);
        if (fabs(a - c) > maxdiff) maxdiff = fabs(a - c);
    }
    if (maxdiff > 2e-3) {
        fprintf(stderr, "attn-bench: cascade and plain forwards differ by %.3g (allowed: f16 rounding, 2e-3)\n", maxdiff);
        exit(1);
    }
    row = row_add();
    snprintf(row->name, sizeof row->name, "cascade b=%d prefix=%d own=%d, KV f16", batch, prefix, own);
    row->ms = med[1] * 1e3;
    snprintf(row->metric, sizeof row->metric, "%.2fx the same batch without common_prefix_len", med[0] / med[1]);
    row->other_cores = -1.0;
    printf("%-40s %8.3f ms median with common_prefix_len %d, %8.3f ms without: %.2fx  (max |out diff| %.2g)\n",
           row->name, med[1] * 1e3, prefix, med[0] * 1e3, med[0] / med[1], maxdiff);
    fflush(stdout);
    for (k = 0; k < 2; k++) { attn_metadata_destroy(meta[k]); free(out_data[k]); }
    attn_layer_destroy(layer);
    free(ids); free(table); free(qsl); free(seq_lens); free(kv_data); free(q_data);
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

/* Sparse MLA (attn_mla_forward_sparse, DeepSeek-V3.2's DSA): 4 decodes over BENCH_CONTEXT keys
   each, every token attending 2048 distinct random positions of its request, 16 heads,
   latent 576 bf16 and fp8_ds_mla (656-byte rows written by attn_concat_and_cache_mla);
   GFLOP/s = 2 B H topk (576 + 512) / time. */
static void bench_mla_sparse(attn_context *ctx, const bench_opts *o, attn_dtype cdt) {
    enum { B = 4, H = 16, TOPK = 2048 };
    const int bps = BENCH_CONTEXT / BENCH_MLA_BLOCK;
    const int64_t num_blocks = (int64_t)B * bps;
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md;
    attn_batch b;
    attn_tensor cache, q, out, idx;
    int64_t shape[ATTN_MAX_DIMS], sh[3];
    int ndim, i, reps;
    int32_t qsl[B + 1], seq_lens[B], *table, *ind, *perm;
    void *cache_data, *q_data, *out_data;
    double *t, med, gflops, t0;
    bench_row *row;
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = 1; d.head_size = BENCH_MLA_HEAD; d.dtype = ATTN_DTYPE_BF16;
    d.kv_cache_dtype = cdt; d.block_size = BENCH_MLA_BLOCK; d.use_mla = 1; d.kv_lora_rank = BENCH_MLA_RANK;
    d.qk_rope_head_dim = BENCH_MLA_ROPE; d.qk_nope_head_dim = BENCH_MLA_NOPE; d.v_head_dim = BENCH_MLA_V;
    CHECK(ctx, attn_layer_create(ctx, &d, NULL, &layer));
    CHECK(ctx, attn_layer_kv_cache_shape(layer, num_blocks, shape, &ndim));
    cache_data = bench_alloc((size_t)num_blocks * BENCH_MLA_BLOCK * (size_t)shape[2] * attn_dtype_size(cdt));
    cache = attn_tensor_make(cache_data, cdt, ndim, shape);
    { /* every slot written from random latents through the library (fp8_ds_mla: its scales) */
        const int64_t n = num_blocks * BENCH_MLA_BLOCK;
        void *kc = bench_alloc((size_t)n * BENCH_MLA_RANK * 2), *kp = bench_alloc((size_t)n * BENCH_MLA_ROPE * 2);
        int64_t *slots = (int64_t *)bench_alloc((size_t)n * 8), s2[2];
        attn_tensor tc, tp;
        fill_random(kc, ATTN_DTYPE_BF16, (size_t)n * BENCH_MLA_RANK, 81);
        fill_random(kp, ATTN_DTYPE_BF16, (size_t)n * BENCH_MLA_ROPE, 82);
        for (i = 0; i < n; i++) slots[i] = i;
        s2[0] = n; s2[1] = BENCH_MLA_RANK;
        tc = attn_tensor_make(kc, ATTN_DTYPE_BF16, 2, s2);
        s2[1] = BENCH_MLA_ROPE;
        tp = attn_tensor_make(kp, ATTN_DTYPE_BF16, 2, s2);
        CHECK(ctx, attn_concat_and_cache_mla(layer, &tc, &tp, &cache, ATTN_SLOTS(slots, (int)n), NULL));
        free(kc); free(kp); free(slots);
    }
    table = (int32_t *)bench_alloc((size_t)B * bps * 4);
    for (i = 0; i < B * bps; i++) table[i] = i;
    for (i = 0; i <= B; i++) qsl[i] = i;
    for (i = 0; i < B; i++) seq_lens[i] = BENCH_CONTEXT;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = B; md.max_num_tokens = B; md.max_blocks_per_req = bps; md.num_blocks = num_blocks;
    CHECK(ctx, attn_metadata_create(layer, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq_lens; b.block_table = table; b.block_table_stride = bps;
    b.num_reqs = B; b.num_actual_tokens = B; b.max_query_len = 1; b.max_seq_len = BENCH_CONTEXT;
    CHECK(ctx, attn_metadata_build(meta, 0, &b, 0));
    ind = (int32_t *)bench_alloc((size_t)B * TOPK * 4);
    perm = (int32_t *)bench_alloc((size_t)BENCH_CONTEXT * 4);
    bench_topk_positions(ind, B, TOPK, BENCH_CONTEXT, perm, 91);
    sh[0] = B; sh[1] = TOPK;
    idx = attn_tensor_make(ind, ATTN_DTYPE_INT32, 2, sh);
    q_data = bench_alloc((size_t)B * H * BENCH_MLA_HEAD * 2);
    out_data = bench_alloc((size_t)B * H * BENCH_MLA_RANK * 2);
    fill_random(q_data, ATTN_DTYPE_BF16, (size_t)B * H * BENCH_MLA_HEAD, 83);
    sh[0] = B; sh[1] = H; sh[2] = BENCH_MLA_HEAD;
    q = attn_tensor_make(q_data, ATTN_DTYPE_BF16, 3, sh);
    sh[2] = BENCH_MLA_RANK;
    out = attn_tensor_make(out_data, ATTN_DTYPE_BF16, 3, sh);
    t0 = now_s();
    CHECK(ctx, attn_mla_forward_sparse(layer, meta, &q, NULL, &cache, &idx, &out, NULL, NULL));
    reps = reps_for(o, now_s() - t0, 0);
    t = (double *)bench_alloc((size_t)reps * sizeof(double));
    for (i = 0; i < reps; i++) {
        t0 = now_s();
        CHECK(ctx, attn_mla_forward_sparse(layer, meta, &q, NULL, &cache, &idx, &out, NULL, NULL));
        t[i] = now_s() - t0;
    }
    check_finite(out_data, ATTN_DTYPE_BF16, (size_t)B * H * BENCH_MLA_RANK, "sparse MLA");
    med = median(t, reps);
    gflops = 2.0 * B * H * (double)TOPK * (BENCH_MLA_HEAD + BENCH_MLA_RANK) / med / 1e9;
    row = row_add();
    snprintf(row->name, sizeof row->name, "MLA sparse H=%d b=%d topk=%d, %s", H, B, TOPK, attn_dtype_name(cdt));
    row->ms = med * 1e3;
    snprintf(row->metric, sizeof row->metric, "%.1f GFLOP/s", gflops);
    row->gflops = gflops;
    row->other_cores = -1.0;
    printf("%-40s %8.3f ms median  %7.1f GFLOP/s  %5.1f%% of FMA peak\n", row->name, med * 1e3, gflops,
           100.0 * gflops / o->fma_gflops);
    fflush(stdout);
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    free(cache_data); free(table); free(ind); free(perm); free(q_data); free(out_data); free(t);
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
   --device cuda: attn-bench-cuda, the binary beside this one, with the same arguments
   ------------------------------------------------------------------------------------- */

/* Replaces this process with attn-bench-cuda from this binary's directory (Linux:
   /proc/self/exe; else the directory of argv[0]), argv unchanged, so its "command:" line
   is the one typed. Returns only on failure (exit status 2). */
static int run_cuda_bench(char **argv) {
    char self[1024], path[1100], *slash;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) self[n] = '\0';
    else snprintf(self, sizeof self, "%s", argv[0]);
    slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    else snprintf(self, sizeof self, ".");
    snprintf(path, sizeof path, "%s/attn-bench-cuda", self);
    fflush(stdout);
    execv(path, argv);
    fprintf(stderr, "attn-bench: --device cuda runs %s, which could not be started (%s); build it with "
            "make build/attn-bench-cuda\n", path, strerror(errno));
    return 2;
}

static void usage(FILE *f) {
    fprintf(f, "usage: attn-bench [--device cpu|cuda] [--threads N] [--quick] [--case decode|prefill|mla|all]\n"
               "       attn-bench --selftest ROWS   the result table alone, with ROWS synthetic rows\n"
               "  --device D    cpu (default): the CPU backend against this CPU's ceilings;\n"
               "                cuda: runs attn-bench-cuda (beside this binary) with the same\n"
               "                arguments: the CUDA backend on a GPU (attn-bench --device cuda --help\n"
               "                lists its options: --csv FILE, --mla-backend NAME, tuning variables)\n"
               "  --threads N   attn_context_desc.num_threads (default 0: the library's default)\n"
               "  --quick       fewer repetitions\n"
               "  --case C      decode, prefill, mla or all (default all)\n");
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
    int contended = 0;
    char cmd[1024], cpu[512];

    bench_name = "attn-bench";
    memset(&o, 0, sizeof o);
    if (argc == 3 && !strcmp(argv[1], "--selftest")) return bench_selftest(atoi(argv[2]));
    for (i = 1; i + 1 < argc; i++) /* --device cuda anywhere: the CUDA bench parses the rest */
        if (!strcmp(argv[i], "--device") && !strcmp(argv[i + 1], "cuda")) return run_cuda_bench(argv);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            o.quick = 1;
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            const char *dv = argv[++i];
            if (strcmp(dv, "cpu") != 0) {
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
        } else if ((!strcmp(argv[i], "--csv") || !strcmp(argv[i], "--mla-backend")) && i + 1 < argc) {
            fprintf(stderr, "attn-bench: %s is an option of the CUDA bench (--device cuda); the CPU bench "
                    "ignores it\n", argv[i]);
            i++;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "attn-bench: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    command_line(argc, argv, cmd, sizeof cmd);

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
        bench_cascade(ctx, &o);
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
        bench_mla_sparse(ctx, &o, ATTN_DTYPE_BF16);
        bench_mla_sparse(ctx, &o, ATTN_DTYPE_FP8_DS_MLA);
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
        row_print(r, flag ? " (*)" : "");
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
    rows_free();
    return 0;
}
