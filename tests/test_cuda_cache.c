/* The CUDA cache writes (attn_reshape_and_cache, attn_concat_and_cache_mla) against the
   CPU's bytes: 16-bit, fp8 and int8 caches (per-tensor and per-token-head scales), bf16 and
   fp8 MLA latents, from host slots (-1 skipped) and from device slots, each on a side
   stream while another stream is busy (the write must not wait for it). SKIPs (with the
   reason) where the platform has no CUDA device. (A cache write captured in a CUDA graph:
   tests/test_cuda_graph.c.) */
#define _POSIX_C_SOURCE 200809L /* nanosleep, clock_gettime */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "cuda_fixtures.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- cache writes from host slots: the CPU's bytes, and no wait on other streams --------- */

typedef int (*cu_fn_host_func)(void *, void (*)(void *), void *);
typedef int (*cu_fn_query)(void *);

static void cu_sleep_800ms(void *p) {
    struct timespec ts;
    (void)p;
    ts.tv_sec = 0;
    ts.tv_nsec = 800000000L;
    nanosleep(&ts, NULL);
}

static double cu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A side stream (g.stream) and a busy one: `busy` runs a host function of 800 ms when
   asked (cu_busy_start), so a call that waited for the device would wait that long. */
typedef struct cu_busy {
    cu_graph_api g;
    void *busy;
    cu_fn_host_func host_func;
    cu_fn_query query;
} cu_busy;

static int cu_busy_open(cu_busy *b) {
    void *f, *q;
    memset(b, 0, sizeof *b);
    if (cu_graph_open(&b->g) != 0) return 0;
    f = dlsym(b->g.lib, "cuLaunchHostFunc");
    q = dlsym(b->g.lib, "cuStreamQuery");
    memcpy(&b->host_func, &f, sizeof f);
    memcpy(&b->query, &q, sizeof q);
    return f && q && b->g.stream_create(&b->busy, 1) == 0;
}
static void cu_busy_close(cu_busy *b) {
    if (b->busy) { b->g.sync(b->busy); b->g.stream_destroy(b->busy); }
    cu_graph_close(&b->g);
}

/* Runs `write` (a cache write on the side stream) while the busy stream sleeps: the call
   must return within 200 ms, with the busy stream still busy. */
#define CU_WRITE_WHILE_BUSY(b, write)                                                           \
    do {                                                                                        \
        double t0_, t1_;                                                                        \
        EXPECT_EQ_INT((b)->host_func((b)->busy, cu_sleep_800ms, NULL), 0);                      \
        t0_ = cu_now_ms();                                                                      \
        EXPECT_OK(write);                                                                       \
        t1_ = cu_now_ms();                                                                      \
        if (t1_ - t0_ > 200.0)                                                                  \
            attn_test_fail(__FILE__, __LINE__, "the cache write took %.0f ms while another "    \
                           "stream was busy (allowed: < 200)", t1_ - t0_);                      \
        EXPECT_EQ_INT((b)->query((b)->busy), 600 /* CUDA_ERROR_NOT_READY: still busy */);       \
        EXPECT_EQ_INT((b)->g.sync((b)->g.stream), 0);                                           \
        EXPECT_EQ_INT((b)->g.sync((b)->busy), 0);                                               \
    } while (0)

typedef struct cu_write_case {
    attn_dtype dt, kv_dt;
    int kv_heads, head, pth;
} cu_write_case;

ATTN_TEST(cuda_cache_writes_match_cpu) {
    static const cu_write_case cases[] = {
        {ATTN_DTYPE_F16, ATTN_DTYPE_F16, 8, 128, 0},
        {ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3, 4, 64, 0},
        {ATTN_DTYPE_F16, ATTN_DTYPE_INT8, 2, 128, 1},
        {ATTN_DTYPE_F32, ATTN_DTYPE_F16, 1, 80, 0},
    };
    enum { NTOK = 1000, BLOCKS = 80, BS = 16 }; /* three launches of host slots */
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    cu_busy bz;
    int64_t slots[NTOK], perm[BLOCKS * BS];
    void *dslots = NULL;
    size_t c;
    int i;
    CU_SKIP_IF_NO_GPU(ctx);
    if (!cu_busy_open(&bz)) {
        EXPECT_TRUE(0);
        cu_busy_close(&bz);
        attn_context_destroy(ctx);
        return;
    }
    for (i = 0; i < BLOCKS * BS; i++) perm[i] = i;
    for (i = BLOCKS * BS - 1; i > 0; i--) {
        int j = (int)(cu_rand() % (unsigned)(i + 1));
        int64_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    for (i = 0; i < NTOK; i++) slots[i] = i % 7 == 3 ? -1 : perm[i];
    if (attn_cuda_malloc(ctx, sizeof slots, &dslots) != ATTN_OK ||
        attn_cuda_memcpy(ctx, dslots, slots, sizeof slots, ATTN_COPY_HOST_TO_DEVICE, NULL) != ATTN_OK)
        EXPECT_TRUE(0);
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const cu_write_case *w = &cases[c];
        attn_layer_desc d;
        attn_layer *cpu = NULL, *gpu = NULL;
        int64_t shape[ATTN_MAX_DIMS];
        int ndim = 0;
        size_t n = (size_t)NTOK * w->kv_heads * w->head, cbytes;
        cu_buf k, v, kv;
        void *ref = NULL;
        memset(&k, 0, sizeof k); memset(&v, 0, sizeof v); memset(&kv, 0, sizeof kv);
        memset(&d, 0, sizeof d);
        d.num_heads = w->kv_heads * 2; d.num_kv_heads = w->kv_heads; d.head_size = w->head;
        d.dtype = w->dt; d.kv_cache_dtype = w->kv_dt; d.block_size = BS;
        if (w->pth) d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
        else if (attn_test_is_8bit(w->kv_dt)) { d.k_scale.value = 1.0f / 64.0f; d.v_scale.value = 1.0f / 32.0f; }
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &cpu));
        d.device = ATTN_DEVICE_CUDA;
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
        if (!cpu || !gpu || attn_layer_kv_cache_shape(gpu, BLOCKS, shape, &ndim) != ATTN_OK) {
            EXPECT_TRUE(0);
        } else {
            attn_tensor hk, hv, hc, dk, dv, dc;
            for (cbytes = attn_dtype_size(w->kv_dt), i = 0; i < ndim; i++) cbytes *= (size_t)shape[i];
            ref = malloc(cbytes);
            if (ref && cu_buf_make(ctx, &k, n * attn_dtype_size(w->dt)) && cu_buf_make(ctx, &v, n * attn_dtype_size(w->dt)) &&
                cu_buf_make(ctx, &kv, cbytes)) {
                cu_fill(k.host, w->dt, n, 2.0f);
                cu_fill(v.host, w->dt, n, 2.0f);
                memset(kv.host, 0x5a, cbytes);
                memset(ref, 0x5a, cbytes);
                EXPECT_TRUE(cu_up(ctx, &k) && cu_up(ctx, &v) && cu_up(ctx, &kv));
                hk = cu_tensor(k.host, w->dt, 3, NTOK, w->kv_heads, w->head, 0);
                hv = cu_tensor(v.host, w->dt, 3, NTOK, w->kv_heads, w->head, 0);
                hc = attn_tensor_make(ref, w->kv_dt, ndim, shape);
                dk = cu_tensor(k.dev, w->dt, 3, NTOK, w->kv_heads, w->head, 1);
                dv = cu_tensor(v.dev, w->dt, 3, NTOK, w->kv_heads, w->head, 1);
                dc = attn_tensor_make(kv.dev, w->kv_dt, ndim, shape);
                dc.device.kind = ATTN_DEVICE_CUDA;
                EXPECT_OK(attn_reshape_and_cache(cpu, &hk, &hv, &hc, ATTN_TEST_SLOTS(slots, NTOK), NULL));
                CU_WRITE_WHILE_BUSY(&bz, attn_reshape_and_cache(gpu, &dk, &dv, &dc, ATTN_TEST_SLOTS(slots, NTOK), bz.g.stream));
                EXPECT_TRUE(cu_down(ctx, &kv, kv.host));
                if (memcmp(kv.host, ref, cbytes) != 0) {
                    size_t at = 0;
                    while (((unsigned char *)kv.host)[at] == ((unsigned char *)ref)[at]) at++;
                    attn_test_fail(__FILE__, __LINE__, "case %d: the GPU cache differs from the CPU's at byte %zu of %zu",
                                   (int)c, at, cbytes);
                }
                /* the same from device slots (one checked launch) */
                if (dslots) {
                    attn_tensor ds = attn_tensor_slots((const int64_t *)dslots, NTOK);
                    ds.device.kind = ATTN_DEVICE_CUDA;
                    memset(kv.host, 0x5a, cbytes);
                    EXPECT_TRUE(cu_up(ctx, &kv));
                    CU_WRITE_WHILE_BUSY(&bz, attn_reshape_and_cache(gpu, &dk, &dv, &dc, &ds, bz.g.stream));
                    EXPECT_TRUE(cu_down(ctx, &kv, kv.host));
                    if (memcmp(kv.host, ref, cbytes) != 0)
                        attn_test_fail(__FILE__, __LINE__, "case %d: the cache written from device slots differs from "
                                       "the CPU's", (int)c);
                }
            } else {
                EXPECT_TRUE(0);
            }
        }
        free(ref);
        cu_buf_free(ctx, &k); cu_buf_free(ctx, &v); cu_buf_free(ctx, &kv);
        attn_layer_destroy(cpu);
        attn_layer_destroy(gpu);
    }
    /* the MLA latent write: bf16 and an fp8 latent */
    for (c = 0; c < 2; c++) {
        attn_layer_desc d;
        attn_layer *cpu = NULL, *gpu = NULL;
        const size_t cbytes = (size_t)BLOCKS * BS * 576 * (c ? 1 : 2);
        cu_buf kc, kp, kv;
        void *ref = malloc(cbytes);
        memset(&kc, 0, sizeof kc); memset(&kp, 0, sizeof kp); memset(&kv, 0, sizeof kv);
        memset(&d, 0, sizeof d);
        d.num_heads = 16; d.head_size = 576; d.dtype = ATTN_DTYPE_BF16; d.use_mla = 1; d.block_size = BS;
        if (c) { d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3; d.k_scale.value = 1.0f / 32.0f; }
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &cpu));
        d.device = ATTN_DEVICE_CUDA;
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
        if (ref && cpu && gpu && cu_buf_make(ctx, &kc, (size_t)NTOK * 512 * 2) && cu_buf_make(ctx, &kp, (size_t)NTOK * 64 * 2) &&
            cu_buf_make(ctx, &kv, cbytes)) {
            attn_dtype cdt = c ? ATTN_DTYPE_FP8_E4M3 : ATTN_DTYPE_BF16;
            attn_tensor hkc = cu_tensor(kc.host, ATTN_DTYPE_BF16, 2, NTOK, 512, 0, 0);
            attn_tensor hkp = cu_tensor(kp.host, ATTN_DTYPE_BF16, 2, NTOK, 64, 0, 0);
            attn_tensor dkc = cu_tensor(kc.dev, ATTN_DTYPE_BF16, 2, NTOK, 512, 0, 1);
            attn_tensor dkp = cu_tensor(kp.dev, ATTN_DTYPE_BF16, 2, NTOK, 64, 0, 1);
            attn_tensor hc = cu_tensor(ref, cdt, 3, BLOCKS, BS, 576, 0), dc = cu_tensor(kv.dev, cdt, 3, BLOCKS, BS, 576, 1);
            cu_fill(kc.host, ATTN_DTYPE_BF16, (size_t)NTOK * 512, 2.0f);
            cu_fill(kp.host, ATTN_DTYPE_BF16, (size_t)NTOK * 64, 2.0f);
            memset(kv.host, 0x5a, cbytes);
            memset(ref, 0x5a, cbytes);
            EXPECT_TRUE(cu_up(ctx, &kc) && cu_up(ctx, &kp) && cu_up(ctx, &kv));
            EXPECT_OK(attn_concat_and_cache_mla(cpu, &hkc, &hkp, &hc, ATTN_TEST_SLOTS(slots, NTOK), NULL));
            CU_WRITE_WHILE_BUSY(&bz, attn_concat_and_cache_mla(gpu, &dkc, &dkp, &dc, ATTN_TEST_SLOTS(slots, NTOK), bz.g.stream));
            EXPECT_TRUE(cu_down(ctx, &kv, kv.host));
            EXPECT_TRUE(memcmp(kv.host, ref, cbytes) == 0);
            if (dslots) { /* from device slots */
                attn_tensor ds = attn_tensor_slots((const int64_t *)dslots, NTOK);
                ds.device.kind = ATTN_DEVICE_CUDA;
                memset(kv.host, 0x5a, cbytes);
                EXPECT_TRUE(cu_up(ctx, &kv));
                CU_WRITE_WHILE_BUSY(&bz, attn_concat_and_cache_mla(gpu, &dkc, &dkp, &dc, &ds, bz.g.stream));
                EXPECT_TRUE(cu_down(ctx, &kv, kv.host));
                EXPECT_TRUE(memcmp(kv.host, ref, cbytes) == 0);
            }
        } else {
            EXPECT_TRUE(0);
        }
        free(ref);
        cu_buf_free(ctx, &kc); cu_buf_free(ctx, &kp); cu_buf_free(ctx, &kv);
        attn_layer_destroy(cpu);
        attn_layer_destroy(gpu);
    }
    cu_busy_close(&bz);
    attn_cuda_free(ctx, dslots);
    attn_context_destroy(ctx);
}

void suite_cuda_cache(void) {
    ATTN_RUN(cuda_cache_writes_match_cpu);
}
