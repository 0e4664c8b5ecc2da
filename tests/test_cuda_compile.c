/* The CUDA kernels a context compiles, through the public API: two layers of one shape
   compile once (the context's kernel cache); ATTN_KERNEL_DEFINES (the tuning seam) compiles
   tuned tiles that still match the CPU, and a malformed value is one WARN; damaged cache
   files are rebuilt and an unusable cache directory keeps the kernels in memory; eight
   threads creating one layer compile each variant once. Every test SKIPs (with the reason)
   where the platform has no CUDA device. */
#define _POSIX_C_SOURCE 200809L /* setenv, getpid */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "cuda_fixtures.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifndef ATTN_NO_THREADS
#include <pthread.h>
#endif

/* ATTN_KERNEL_DEFINES (the tuning seam): a layer created while it is set compiles its decode
   tiles with those defines (2 stages instead of 3 here) and still matches the CPU; its record
   shows the value; a malformed value is one WARN, nothing applied, an empty record. */
ATTN_TEST(cuda_kernel_defines_env) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_test_env env = attn_test_env_save("ATTN_KERNEL_DEFINES");
    attn_layer_desc d;
    attn_layer *layer = NULL;
    int n, fails = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    setenv("ATTN_KERNEL_DEFINES", "decode.KV_STAGES=2 decode.KV_TILE=64", 1);
    memset(&d, 0, sizeof d);
    d.num_heads = 32; d.num_kv_heads = 8; d.head_size = 128; d.dtype = ATTN_DTYPE_BF16; d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (layer) EXPECT_TRUE(strcmp(attn_layer_selection(layer)->kernel_defines, "decode.KV_STAGES=2 decode.KV_TILE=64") == 0);
    attn_layer_destroy(layer);
    layer = NULL;
    for (n = 0; n < 6 && fails < 2; n++) { /* decodes and short prefills through the tuned tiles */
        cu_case c;
        memset(&c, 0, sizeof c);
        c.heads = 32; c.kv_heads = 8; c.head = 128; c.dt = c.kv_dt = n % 2 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        c.block = 16; c.causal = 1; c.lse = n % 2 == 0;
        cu_random_reqs(&c, 20, 1500);
        fails += cu_run_case(ctx, &c, __LINE__) > 0;
    }
    EXPECT_EQ_INT(fails, 0);
    setenv("ATTN_KERNEL_DEFINES", "decode.KV STAGES=2", 1);
    attn_test_log_reset(&log);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_ENV_INVALID, ATTN_LOG_LEVEL_WARN));
    if (layer) EXPECT_TRUE(attn_layer_selection(layer)->kernel_defines[0] == 0);
    attn_layer_destroy(layer);
    attn_test_env_restore(&env);
    attn_context_destroy(ctx);
}

/* Two layers of one shape compile once (the context's kernel cache). */
ATTN_TEST(cuda_layers_share_compiled_variants) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *a = NULL, *b = NULL;
    int n0;
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = 16; d.num_kv_heads = 4; d.head_size = 128; d.dtype = ATTN_DTYPE_BF16;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &a));
    n0 = attn_kernel_compile_count(ctx);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &b));
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), n0);
    attn_layer_destroy(a);
    attn_layer_destroy(b);
    attn_context_destroy(ctx);
}

/* ---- kernel cache on the GPU: many threads, damaged and unusable directories ---------------- */

/* A context whose kernels are kept in `dir` ("off": memory only), logging into log
   (an attn_test_log, reset here) or, with a hook of the caller's, into its user data. */
static attn_context *cu_ctx_dir(void *log, const char *dir, attn_log_fn hook) {
    attn_context_desc cd;
    attn_context *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    cd.log = hook ? hook : attn_test_log_hook;
    cd.log_user_data = log;
    cd.log_level = ATTN_LOG_LEVEL_INFO;
    cd.kernel_cache_dir = dir;
    if (attn_context_create(&cd, &ctx) != ATTN_OK) return NULL;
    if (log && !hook) attn_test_log_reset((attn_test_log *)log);
    return ctx;
}

/* A small mixed batch on a fresh pair of layers of ctx, CUDA against CPU; 0 = agreed. */
static int cu_small_case(attn_context *ctx, int line) {
    cu_case c;
    memset(&c, 0, sizeof c);
    c.heads = 16; c.kv_heads = 4; c.head = 128; c.dt = c.kv_dt = ATTN_DTYPE_BF16; c.block = 16;
    c.causal = 1; c.lse = 1; c.nreq = 3;
    c.qlen[0] = 1; c.ctxlen[0] = 300;
    c.qlen[1] = 1; c.ctxlen[1] = 1000;
    c.qlen[2] = 20; c.ctxlen[2] = 50;
    return cu_run_case(ctx, &c, line);
}

/* Damages every .cubin file of dir: truncated, garbage, one flipped byte, in turn. */
static int cu_damage_cache(const char *dir) {
    DIR *dd = opendir(dir);
    struct dirent *ent;
    int n = 0;
    if (!dd) return 0;
    while ((ent = readdir(dd)) != NULL) {
        char path[600];
        size_t k = strlen(ent->d_name);
        FILE *f;
        if (k <= 6 || strcmp(ent->d_name + k - 6, ".cubin") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        if (n % 3 == 0) { /* truncated: the first 100 bytes kept */
            char head[100];
            size_t got;
            if (!(f = fopen(path, "rb"))) continue;
            got = fread(head, 1, sizeof head, f);
            fclose(f);
            if (!(f = fopen(path, "wb"))) continue;
            fwrite(head, 1, got, f);
            fclose(f);
        } else if (n % 3 == 1) {
            int i;
            if (!(f = fopen(path, "wb"))) continue;
            for (i = 0; i < 5000; i++) fputc((i * 131) & 0xff, f);
            fclose(f);
        } else {
            long len;
            int ch;
            if (!(f = fopen(path, "r+b"))) continue;
            fseek(f, 0, SEEK_END);
            len = ftell(f);
            fseek(f, len / 2, SEEK_SET);
            ch = fgetc(f);
            fseek(f, len / 2, SEEK_SET);
            fputc(ch ^ 0x40, f);
            fclose(f);
        }
        n++;
    }
    closedir(dd);
    return n;
}

/* Damaged cache files are rebuilt (one WARN each, right results); an unusable directory
   keeps the kernels in memory (one WARN, right results). */
ATTN_TEST(cuda_kernel_cache_faults_survived) {
    attn_test_log log;
    char dir[128], cmd[200];
    attn_context *ctx;
    int damaged;
    FILE *f;
    snprintf(dir, sizeof dir, "/tmp/attn-cuda-kcache-%ld", (long)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* best effort */ }
    ctx = cu_ctx_dir(&log, dir, NULL);
    CU_SKIP_IF_NO_GPU(ctx);
    EXPECT_EQ_INT(cu_small_case(ctx, __LINE__), 0);
    EXPECT_EQ_INT(log.by_level[ATTN_LOG_LEVEL_WARN], 0);
    attn_context_destroy(ctx);
    damaged = cu_damage_cache(dir);
    EXPECT_TRUE(damaged >= 3); /* decode, prefill, cache write */
    ctx = cu_ctx_dir(&log, dir, NULL);
    EXPECT_EQ_INT(cu_small_case(ctx, __LINE__), 0);
    EXPECT_EQ_INT(log.by_item_level[ATTN_LOG_KERNEL_CACHE_FAULT][ATTN_LOG_LEVEL_WARN], damaged);
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), damaged);
    attn_context_destroy(ctx);
    /* rebuilt: read back with no compile and no warning */
    ctx = cu_ctx_dir(&log, dir, NULL);
    EXPECT_EQ_INT(cu_small_case(ctx, __LINE__), 0);
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), 0);
    EXPECT_EQ_INT(log.by_level[ATTN_LOG_LEVEL_WARN], 0);
    attn_context_destroy(ctx);
    if (system(cmd) != 0) { /* best effort */ }
    /* a file where the directory should be */
    f = fopen(dir, "w");
    if (f) fclose(f);
    ctx = cu_ctx_dir(&log, dir, NULL);
    EXPECT_EQ_INT(cu_small_case(ctx, __LINE__), 0);
    EXPECT_EQ_INT(log.by_item_level[ATTN_LOG_KERNEL_CACHE_FAULT][ATTN_LOG_LEVEL_WARN], 1);
    EXPECT_TRUE(attn_kernel_compile_count(ctx) >= 3);
    attn_context_destroy(ctx);
    remove(dir);
}

#ifndef ATTN_NO_THREADS
/* A log hook several threads may call at once: counts the compile lines. */
typedef struct cu_mt_log {
    pthread_mutex_t lock;
    int compiled, errors;
} cu_mt_log;
static void cu_mt_hook(void *user, attn_log_level level, attn_log_item item, const char *msg) {
    cu_mt_log *l = (cu_mt_log *)user;
    (void)msg;
    pthread_mutex_lock(&l->lock);
    l->compiled += item == ATTN_LOG_KERNEL_COMPILED;
    l->errors += level == ATTN_LOG_LEVEL_ERROR;
    pthread_mutex_unlock(&l->lock);
}

enum { MT_H = 16, MT_HKV = 4, MT_D = 128, MT_BS = 16, MT_REQS = 3, MT_STRIDE = 64, MT_NB = MT_REQS * MT_STRIDE };
typedef struct cu_mt_arg {
    attn_context *ctx;
    const attn_layer_desc *d;
    const attn_batch *b;
    const attn_metadata_desc *md;
    attn_tensor q, cache, out;
    attn_layer *layer;
    attn_status st;
    char err[512];
} cu_mt_arg;

static void *cu_mt_thread(void *varg) {
    cu_mt_arg *a = (cu_mt_arg *)varg;
    attn_metadata *m = NULL;
    a->st = attn_layer_create(a->ctx, a->d, NULL, &a->layer);
    if (a->st == ATTN_OK) a->st = attn_metadata_create(a->layer, a->md, &m);
    if (a->st == ATTN_OK) a->st = attn_metadata_build(m, 0, a->b, 0);
    if (a->st == ATTN_OK) a->st = attn_layer_forward(a->layer, m, &a->q, NULL, NULL, &a->cache, &a->out, NULL, NULL);
    if (a->st == ATTN_OK) a->st = attn_cuda_synchronize(a->ctx, NULL);
    if (a->st != ATTN_OK) snprintf(a->err, sizeof a->err, "%s", attn_context_last_error(a->ctx));
    attn_metadata_destroy(m);
    return NULL;
}
#endif

/* Eight threads creating the same CUDA layer at once: each variant compiles once, and
   every thread's layer computes what the CPU does. */
ATTN_TEST(cuda_threads_create_one_layer_compile_once) {
#ifdef ATTN_NO_THREADS
    SKIP("built without threads (ATTN_NO_THREADS)");
#else
    cu_mt_log log;
    attn_context *ctx;
    attn_layer_desc d;
    attn_layer *cpu = NULL;
    attn_metadata *mc = NULL;
    attn_metadata_desc md;
    attn_batch b;
    cu_mt_arg args[8];
    pthread_t th[8];
    int32_t qsl[MT_REQS + 1] = {0, 1, 2, 14}, seq[MT_REQS] = {700, 1000, 40}, bt[MT_REQS * MT_STRIDE];
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, i, x, bad = 0, ntok = 14;
    cu_buf q, kv, outs[8];
    static uint16_t ref[14 * MT_H * MT_D], got[14 * MT_H * MT_D];
    memset(&log, 0, sizeof log);
    pthread_mutex_init(&log.lock, NULL);
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(outs, 0, sizeof outs);
    ctx = cu_ctx_dir(&log, "off", cu_mt_hook);
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = MT_H; d.num_kv_heads = MT_HKV; d.head_size = MT_D; d.dtype = ATTN_DTYPE_BF16;
    d.block_size = MT_BS;
    for (i = 0; i < MT_REQS * MT_STRIDE; i++) bt[i] = (i * 53) % MT_NB;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MT_STRIDE;
    b.num_reqs = MT_REQS; b.num_actual_tokens = ntok; b.max_query_len = 12; b.max_seq_len = 1000;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = MT_REQS; md.max_num_tokens = ntok; md.max_blocks_per_req = MT_STRIDE; md.num_blocks = MT_NB;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &cpu));
    if (!cpu) goto done;
    attn_layer_kv_cache_shape(cpu, MT_NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, sizeof ref) || !cu_buf_make(ctx, &kv, (size_t)MT_NB * 2 * MT_BS * MT_HKV * MT_D * 2))
        goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, sizeof ref / 2, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, kv.bytes / 2, 2.0f);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &kv)) goto done;
    EXPECT_OK(attn_metadata_create(cpu, &md, &mc));
    EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
    {
        attn_tensor hq = cu_tensor(q.host, ATTN_DTYPE_BF16, 3, ntok, MT_H, MT_D, 0);
        attn_tensor ho = cu_tensor(ref, ATTN_DTYPE_BF16, 3, ntok, MT_H, MT_D, 0);
        attn_tensor hc = attn_tensor_make(kv.host, ATTN_DTYPE_BF16, ndim, shape);
        EXPECT_OK(attn_layer_forward(cpu, mc, &hq, NULL, NULL, &hc, &ho, NULL, NULL));
    }
    d.device = ATTN_DEVICE_CUDA;
    for (i = 0; i < 8; i++) {
        memset(&args[i], 0, sizeof args[i]);
        if (!cu_buf_make(ctx, &outs[i], sizeof ref)) goto done;
        memset(outs[i].host, 0xff, sizeof ref);
        if (!cu_up(ctx, &outs[i])) goto done;
        args[i].ctx = ctx; args[i].d = &d; args[i].b = &b; args[i].md = &md;
        args[i].q = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, ntok, MT_H, MT_D, 1);
        args[i].out = cu_tensor(outs[i].dev, ATTN_DTYPE_BF16, 3, ntok, MT_H, MT_D, 1);
        args[i].cache = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        args[i].cache.device.kind = ATTN_DEVICE_CUDA;
    }
    for (i = 0; i < 8; i++) pthread_create(&th[i], NULL, cu_mt_thread, &args[i]);
    for (i = 0; i < 8; i++) pthread_join(th[i], NULL);
    /* decode variant, prefill variant, cache write, and the wide decode variant where the
       device has the shared memory for it (sm_90+: 16 Q rows and 3 stages of 128 K and V
       rows, padded by 16 bytes, plus the row offsets): once each */
    {
        attn_platform pl;
        const int pitch = (MT_D + 8) * 2, wide_smem = 16 * pitch + 3 * 128 * 8 + 6 * 128 * pitch;
        int variants = 3;
        if (attn_platform_get(ctx, &pl) == ATTN_OK && pl.cuda_capability_major >= 9 &&
            pl.cuda_shared_per_block >= wide_smem)
            variants = 4;
        EXPECT_EQ_INT(log.compiled, variants);
        EXPECT_EQ_INT(attn_kernel_compile_count(ctx), variants);
    }
    EXPECT_EQ_INT(log.errors, 0);
    for (i = 0; i < 8; i++) {
        if (args[i].st != ATTN_OK) {
            attn_test_fail(__FILE__, __LINE__, "thread %d: %s: %s", i, attn_status_string(args[i].st), args[i].err);
            bad++;
            continue;
        }
        if (!cu_down(ctx, &outs[i], got)) { bad++; continue; }
        for (x = 0; x < ntok * MT_H * MT_D && bad < 4; x++) {
            float r = attn_bf16_to_f32(ref[x]), g = attn_bf16_to_f32(got[x]);
            if (!(fabsf(r - g) <= 3e-2f + 1e-2f * fabsf(r))) {
                attn_test_fail(__FILE__, __LINE__, "thread %d out[%d]: cpu %g, cuda %g", i, x, r, g);
                bad++;
            }
        }
    }
    EXPECT_EQ_INT(bad, 0);
done:
    for (i = 0; i < 8; i++) {
        if (args[i].layer) attn_layer_destroy(args[i].layer);
        cu_buf_free(ctx, &outs[i]);
    }
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv);
    attn_metadata_destroy(mc);
    attn_layer_destroy(cpu);
    attn_context_destroy(ctx);
    pthread_mutex_destroy(&log.lock);
#endif
}

void suite_cuda_compile(void) {
    ATTN_RUN(cuda_kernel_defines_env);
    ATTN_RUN(cuda_layers_share_compiled_variants);
    ATTN_RUN(cuda_kernel_cache_faults_survived);
    ATTN_RUN(cuda_threads_create_one_layer_compile_once);
}
