/* The selector and the backend registry: code > env ATTN_BACKEND > automatic, the
   selection record, the per-context cache, plugins in the CUSTOM slot, log items and
   levels. Tests match on status codes and log items, never on message text. Every test
   leaves the registry, ATTN_BACKEND and ATTN_LOG_LEVEL as it found them. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifndef ATTN_NO_THREADS
#include <pthread.h>
#endif

/* ---- environment save/restore ------------------------------------------------------ */


/* Context-less failures (registry, names) log through stderr unless ATTN_LOG_LEVEL says
   otherwise; tests that provoke them silence it and restore it afterwards. */
static attn_test_env sel_quiet_begin(void) {
    attn_test_env e = attn_test_env_save("ATTN_LOG_LEVEL");
    setenv("ATTN_LOG_LEVEL", "none", 1);
    return e;
}

/* ---- descriptors and a plugin backend ---------------------------------------------- */

static attn_layer_desc sel_desc(void) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.num_heads = 4;
    d.num_kv_heads = 2;
    d.head_size = 64;
    d.dtype = ATTN_DTYPE_F16;
    d.block_size = 16;
    return d;
}

static int sel_plug_kv_shape(const attn_backend *self, const attn_layer_desc *d, int64_t num_blocks,
                             int64_t shape[ATTN_MAX_DIMS]) {
    (void)self;
    shape[0] = num_blocks;
    shape[1] = d->block_size;
    shape[2] = 2 * d->num_kv_heads * d->head_size; /* deliberately unlike the CPU layout */
    return 3;
}

/* Never run by a test that checks output: the plugin does nothing. */
static attn_status sel_plug_forward(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                    const attn_tensor *q, const attn_tensor *k,
                                    const attn_tensor *v, attn_tensor *kv_cache,
                                    attn_tensor *out, attn_tensor *lse, void *stream) {
    (void)self; (void)layer; (void)meta; (void)q; (void)k; (void)v; (void)kv_cache; (void)out;
    (void)lse; (void)stream;
    return ATTN_OK;
}

static int sel_plug_check_refuses(const attn_backend *self, const attn_layer_desc *desc,
                                  const attn_platform *platform, char *reason,
                                  size_t reason_size) {
    (void)self; (void)desc; (void)platform;
    if (reason_size) {
        strncpy(reason, "test plugin refuses every layer", reason_size - 1);
        reason[reason_size - 1] = 0;
    }
    return 1;
}

static attn_backend sel_plug;     /* registered in the CUSTOM slot */
static attn_backend sel_plug_cpu; /* registered in the CPU slot */

/* A standard-attention plugin serving head sizes hs_min..hs_max (multiples of 8). */
static attn_status sel_plug_forward_mqa(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                       const attn_tensor *q, const attn_tensor *q_pe,
                                       const attn_tensor *kv_cache, attn_tensor *out_latent,
                                       attn_tensor *lse, void *stream) {
    (void)self; (void)layer; (void)meta; (void)q; (void)q_pe; (void)kv_cache; (void)out_latent; (void)lse; (void)stream;
    return ATTN_ERROR_UNSUPPORTED; /* never run: selector tests only */
}
static attn_status sel_plug_forward_mha(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                       const attn_tensor *q, const attn_tensor *kv_cache,
                                       const attn_tensor *w_uk, const attn_tensor *w_uv,
                                       attn_tensor *out, attn_tensor *lse, void *stream) {
    (void)self; (void)layer; (void)meta; (void)q; (void)kv_cache; (void)w_uk; (void)w_uv; (void)out; (void)lse; (void)stream;
    return ATTN_ERROR_UNSUPPORTED;
}

static attn_status sel_plug_cache(const attn_backend *self, attn_layer *layer, const attn_tensor *key,
                                  const attn_tensor *value, attn_tensor *kv_cache,
                                  const attn_tensor *slots, void *stream) {
    (void)self; (void)layer; (void)key; (void)value; (void)kv_cache; (void)slots; (void)stream;
    return ATTN_ERROR_UNSUPPORTED; /* never run: selector tests only */
}
static attn_status sel_plug_mla_forward(const attn_backend *self, attn_layer *layer,
                                       const attn_metadata *meta, const attn_tensor *q_nope,
                                       const attn_tensor *q_pe, const attn_tensor *kv_c,
                                       const attn_tensor *k_pe, attn_tensor *kv_cache,
                                       const attn_tensor *w_uk, const attn_tensor *w_uv,
                                       attn_tensor *out, void *stream) {
    (void)self; (void)layer; (void)meta; (void)q_nope; (void)q_pe; (void)kv_c; (void)k_pe;
    (void)kv_cache; (void)w_uk; (void)w_uv; (void)out; (void)stream;
    return ATTN_ERROR_UNSUPPORTED;
}
static attn_status sel_plug_latent(const attn_backend *self, attn_layer *layer, const attn_tensor *kv_c,
                                   const attn_tensor *k_pe, attn_tensor *kv_cache,
                                   const attn_tensor *slots, void *stream) {
    (void)self; (void)layer; (void)kv_c; (void)k_pe; (void)kv_cache; (void)slots; (void)stream;
    return ATTN_ERROR_UNSUPPORTED;
}

static attn_backend *sel_plug_make(attn_backend *b, attn_backend_id id, const char *name,
                                   int hs_min, int hs_max) {
    memset(b, 0, sizeof *b);
    b->name = name;
    b->id = id;
    b->dtypes = ATTN_DTYPE_BIT(ATTN_DTYPE_F32) | ATTN_DTYPE_BIT(ATTN_DTYPE_F16) |
                ATTN_DTYPE_BIT(ATTN_DTYPE_BF16);
    b->kv_cache_dtypes = b->dtypes;
    b->head_size_min = hs_min;
    b->head_size_max = hs_max;
    b->head_size_multiple = 8;
    b->block_size_multiple = 16;
    b->block_size_max = 0;
    b->supports_non_causal = 1;
    b->supports_sliding_window = 1;
    b->supports_logits_soft_cap = 1;
    b->supports_alibi = 1;
    b->cuda_graph = ATTN_CUDA_GRAPH_NEVER;
    b->kv_cache_shape = sel_plug_kv_shape;
    b->forward = sel_plug_forward;
    b->reshape_and_cache = sel_plug_cache;
    b->forward_mqa = sel_plug_forward_mqa; /* used only when the test makes it an MLA plugin */
    b->forward_mha = sel_plug_forward_mha;
    b->mla_forward = sel_plug_mla_forward;
    b->concat_and_cache_mla = sel_plug_latent;
    return b;
}

/* Restores every registry slot and ATTN_BACKEND (run at the end of each test). */
static void sel_cleanup(void) {
    attn_test_env q = sel_quiet_begin();
    attn_register_backend(ATTN_BACKEND_CUSTOM, NULL);
    attn_register_backend(ATTN_BACKEND_CPU, NULL);
    attn_test_env_restore(&q);
    unsetenv("ATTN_BACKEND");
}

static int sel_platform_is_cuda(attn_context *ctx) {
    attn_platform p;
    memset(&p, 0, sizeof p);
    if (attn_platform_get(ctx, &p) != ATTN_OK) return 0;
    return p.kind == ATTN_PLATFORM_CUDA;
}

/* On a CUDA platform the CUDA backend is tried before CPU and skipped for a CPU layer (its
   tensors are on the CPU): one skip more than on a CPU host. */
/* the CUDA entries in the registry: 4, or 0 when the path is compiled out (ATTN_NO_CUDA) */
static int sel_cuda_entries(void) {
    return (attn_backend_get(ATTN_BACKEND_CUDA_SM90) != NULL) + (attn_backend_get(ATTN_BACKEND_CUDA) != NULL) +
           (attn_backend_get(ATTN_BACKEND_CUDA_MLA_SM90) != NULL) + (attn_backend_get(ATTN_BACKEND_CUDA_MLA) != NULL);
}

/* backends ahead of CPU on a CUDA platform (CUDA_SM90, CUDA, CUDA_MLA_SM90, CUDA_MLA): skipped for CPU layers */
static int sel_cuda_ahead(attn_context *ctx) { return 4 * sel_platform_is_cuda(ctx); }

static int sel_skipped_has(const attn_selection *s, attn_backend_id id) {
    int i;
    for (i = 0; i < s->num_skipped && i < ATTN_SELECTION_MAX_SKIPPED; i++)
        if (s->skipped[i].backend == id && s->skipped[i].reason[0]) return 1;
    return 0;
}

/* ---- quantized caches: a capability like any other ------------------------------------ */

/* An fp8 cache resolves to CPU (standard) / CPU_MLA (latent) with the type in the record;
   the backends whose kernels cannot read it say so in their capability masks (and so in
   the record, where they are candidates: tests/test_cuda_reject.c checks it on a GPU). */
ATTN_TEST(sel_fp8_cache_record) {
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    char buf[4096];
    int i;
    static const attn_backend_id gpu[] = {ATTN_BACKEND_CUDA, ATTN_BACKEND_CUDA_SM90, ATTN_BACKEND_CUDA_MLA_SM90,
                                          ATTN_BACKEND_CUDA_MLA};
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_NONE, 1);
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
    d.k_scale.value = 0.5f;
    d.v_scale.value = 0.25f;
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(s.kv_cache_dtype, ATTN_DTYPE_FP8_E4M3);
    attn_selection_format(&s, buf, sizeof buf);
    EXPECT_TRUE(strstr(buf, "fp8_e4m3") != NULL);
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E5M2;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    /* MLA: the latent's scale */
    memset(&d, 0, sizeof d);
    d.num_heads = 16; d.head_size = 576; d.use_mla = 1; d.dtype = ATTN_DTYPE_BF16;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3; d.k_scale.value = 1.0f;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU_MLA);
    for (i = 0; i < 4; i++) { /* CUDA reads 8-bit caches, CUDA_MLA fp8 latents; CUDA_SM90 and
                                 CUDA_MLA_SM90 (wgmma) neither */
        const attn_backend *b = attn_backend_get(gpu[i]);
        const unsigned fp8 = ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E4M3) | ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E5M2);
        const unsigned want = gpu[i] == ATTN_BACKEND_CUDA ? fp8 | ATTN_DTYPE_BIT(ATTN_DTYPE_INT8)
                              : gpu[i] == ATTN_BACKEND_CUDA_MLA ? fp8 : 0u;
        if (!b) continue; /* compiled out */
        EXPECT_EQ_INT(b->kv_cache_dtypes & (ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E4M3) | ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E5M2) |
                                            ATTN_DTYPE_BIT(ATTN_DTYPE_INT8)), want);
    }
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CPU)->kv_cache_dtypes & ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E4M3));
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CPU_MLA)->kv_cache_dtypes & ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E5M2));
    attn_context_destroy(ctx);
}

/* ---- automatic resolution ---------------------------------------------------------- */

ATTN_TEST(sel_auto_resolves_cpu_with_one_info_line) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *layer = NULL;
    const attn_selection *s;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(layer != NULL);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 1);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_INFO], 1);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_WARN], 0);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_ERROR], 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 0);
    EXPECT_EQ_INT(cap.bad_item, 0);
    if (layer) {
        s = attn_layer_selection(layer);
        EXPECT_TRUE(s != NULL);
        EXPECT_TRUE(attn_layer_backend(layer) == attn_backend_get(ATTN_BACKEND_CPU));
        if (s) {
            /* The default is the resolution, and it still got its INFO line. */
            EXPECT_EQ_INT(s->resolved, ATTN_BACKEND_CPU);
            EXPECT_EQ_INT(s->default_backend, ATTN_BACKEND_CPU);
            EXPECT_EQ_INT(s->requested, ATTN_BACKEND_AUTO);
            EXPECT_EQ_INT(s->source, ATTN_SELECTION_AUTO);
            EXPECT_EQ_INT(s->forced_by_code, 0);
            EXPECT_EQ_INT(s->forced_backend, ATTN_BACKEND_AUTO);
            EXPECT_EQ_INT(s->env_set, 0);
            EXPECT_EQ_INT(s->degraded, 0);
            EXPECT_TRUE(strcmp(s->degradation, "none") == 0);
            EXPECT_EQ_INT(s->num_skipped, sel_cuda_ahead(ctx));
            /* The record keeps the very line that went to the logger. */
            EXPECT_TRUE(s->log_line[0] != 0);
            EXPECT_TRUE(strcmp(s->log_line, cap.resolved_line) == 0);
        }
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_default_resolution_logs_info_at_info_threshold) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *layer = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_INFO, 1);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_EQ_INT(cap.total, 1);
    EXPECT_EQ_INT(cap.last_item, ATTN_LOG_SELECT_RESOLVED);
    EXPECT_EQ_INT(cap.last_level, ATTN_LOG_LEVEL_INFO);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_second_create_is_cached) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *a = NULL, *b = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &a));
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 1);
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &b));
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_INFO], 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 1);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_CACHED][ATTN_LOG_LEVEL_DEBUG], 1);
    if (a && b) {
        const attn_selection *sa = attn_layer_selection(a), *sb = attn_layer_selection(b);
        EXPECT_TRUE(a != b);
        EXPECT_EQ_INT(sb->resolved, ATTN_BACKEND_CPU);
        EXPECT_EQ_INT(sb->source, sa->source);
        EXPECT_TRUE(strcmp(sa->log_line, sb->log_line) == 0);
        EXPECT_TRUE(attn_layer_backend(b) == attn_layer_backend(a));
    }
    attn_layer_destroy(a);
    attn_layer_destroy(b);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_cache_clear_resolves_again) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *a = NULL, *b = NULL, *c = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &a));
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &b));
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 1);
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_selection_cache_clear(ctx));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_CACHE_CLEARED][ATTN_LOG_LEVEL_DEBUG], 1);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &c));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 0);
    attn_layer_destroy(a);
    attn_layer_destroy(b);
    attn_layer_destroy(c);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_cache_is_per_context) {
    attn_test_log cap1, cap2;
    attn_context *c1, *c2;
    attn_layer_desc d = sel_desc();
    attn_layer *a = NULL, *b = NULL;
    unsetenv("ATTN_BACKEND");
    c1 = attn_test_context(&cap1, ATTN_LOG_LEVEL_DEBUG, 1);
    c2 = attn_test_context(&cap2, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_layer_create(c1, &d, NULL, &a));
    EXPECT_OK(attn_layer_create(c2, &d, NULL, &b));
    EXPECT_EQ_INT(cap1.by_item[ATTN_LOG_SELECT_RESOLVED], 1);
    EXPECT_EQ_INT(cap2.by_item[ATTN_LOG_SELECT_RESOLVED], 1);
    EXPECT_EQ_INT(cap2.by_item[ATTN_LOG_SELECT_CACHED], 0);
    attn_layer_destroy(a);
    attn_layer_destroy(b);
    attn_context_destroy(c1);
    attn_context_destroy(c2);
    sel_cleanup();
}

ATTN_TEST(sel_cache_keyed_by_env_value) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *a = NULL, *b = NULL, *c = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &a));
    attn_test_log_reset(&cap);
    setenv("ATTN_BACKEND", "cpu", 1);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &b));
    /* The variable changed: a new resolution, now from the environment. */
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 0);
    if (b) EXPECT_EQ_INT(attn_layer_selection(b)->source, ATTN_SELECTION_ENV);
    attn_test_log_reset(&cap);
    unsetenv("ATTN_BACKEND");
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &c));
    /* Back to the first key: served from the cache, with the automatic record. */
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 1);
    if (c) EXPECT_EQ_INT(attn_layer_selection(c)->source, ATTN_SELECTION_AUTO);
    attn_layer_destroy(a);
    attn_layer_destroy(b);
    attn_layer_destroy(c);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_cache_keyed_by_request_and_desc) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc(), d2;
    attn_select_request req;
    attn_layer *a = NULL, *b = NULL, *c = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &a));
    attn_test_log_reset(&cap);
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CPU;
    EXPECT_OK(attn_layer_create(ctx, &d, &req, &b));
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 0);
    if (b) EXPECT_EQ_INT(attn_layer_selection(b)->source, ATTN_SELECTION_CODE);
    attn_test_log_reset(&cap);
    d2 = d;
    d2.sliding_window = 128;
    EXPECT_OK(attn_layer_create(ctx, &d2, NULL, &c));
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 0);
    attn_layer_destroy(a);
    attn_layer_destroy(b);
    attn_layer_destroy(c);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_select_backend_shares_the_cache) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    attn_layer *layer = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    attn_test_log_reset(&cap);
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 1);
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 1);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

/* ---- explicit requests: code and environment ----------------------------------------- */

ATTN_TEST(sel_code_request_cpu) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_select_request req;
    attn_layer *layer = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CPU;
    EXPECT_OK(attn_layer_create(ctx, &d, &req, &layer));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_INFO], 1);
    if (layer) {
        const attn_selection *s = attn_layer_selection(layer);
        EXPECT_EQ_INT(s->source, ATTN_SELECTION_CODE);
        EXPECT_EQ_INT(s->forced_by_code, 1);
        EXPECT_EQ_INT(s->forced_backend, ATTN_BACKEND_CPU);
        EXPECT_EQ_INT(s->requested, ATTN_BACKEND_CPU);
        EXPECT_EQ_INT(s->resolved, ATTN_BACKEND_CPU);
        EXPECT_EQ_INT(s->degraded, 0);
        EXPECT_TRUE(strcmp(s->degradation, "none") == 0);
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_env_cpu_is_case_insensitive) {
    static const char *const spellings[] = {"cpu", "CPU", "Cpu", "cPu"};
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    int i;
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    for (i = 0; i < 4; i++) {
        attn_layer *layer = NULL;
        setenv("ATTN_BACKEND", spellings[i], 1);
        attn_test_log_reset(&cap);
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
        EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
        if (layer) {
            const attn_selection *s = attn_layer_selection(layer);
            EXPECT_EQ_INT(s->source, ATTN_SELECTION_ENV);
            EXPECT_EQ_INT(s->requested, ATTN_BACKEND_CPU);
            EXPECT_EQ_INT(s->resolved, ATTN_BACKEND_CPU);
            EXPECT_EQ_INT(s->forced_by_code, 0);
            EXPECT_EQ_INT(s->env_set, 1);
            EXPECT_TRUE(strcmp(s->env_value, spellings[i]) == 0);
            EXPECT_TRUE(strcmp(s->env_var, "ATTN_BACKEND") == 0);
        }
        attn_layer_destroy(layer);
    }
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_env_empty_counts_as_unset) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    setenv("ATTN_BACKEND", "", 1);
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.source, ATTN_SELECTION_AUTO);
    EXPECT_EQ_INT(s.env_set, 0);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_code_beats_env) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_select_request req;
    attn_selection s;
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    memset(&req, 0, sizeof req);

    /* A bogus variable does not matter when code decides. */
    setenv("ATTN_BACKEND", "no-such-backend", 1);
    req.backend = ATTN_BACKEND_CPU;
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, &req, &s));
    EXPECT_EQ_INT(s.source, ATTN_SELECTION_CODE);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(s.env_set, 1); /* recorded, not used */
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_UNKNOWN_ENV], 0);

    /* Env names CPU, code names the plugin: the plugin wins. */
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512)));
    EXPECT_OK(attn_selection_cache_clear(ctx));
    setenv("ATTN_BACKEND", "cpu", 1);
    req.backend = ATTN_BACKEND_CUSTOM;
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, &req, &s));
    EXPECT_EQ_INT(s.source, ATTN_SELECTION_CODE);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUSTOM);
    EXPECT_EQ_INT(s.forced_backend, ATTN_BACKEND_CUSTOM);

    /* And code CPU against env naming the plugin. */
    setenv("ATTN_BACKEND", "testplug", 1);
    req.backend = ATTN_BACKEND_CPU;
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, &req, &s));
    EXPECT_EQ_INT(s.source, ATTN_SELECTION_CODE);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_env_unknown_name_fails) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *layer = (attn_layer *)&cap; /* poison: must come back NULL */
    attn_selection s;
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    setenv("ATTN_BACKEND", "flashinfer", 1);
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_TRUE(layer == NULL);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_UNKNOWN_ENV], 1);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_UNKNOWN_ENV][ATTN_LOG_LEVEL_ERROR], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_TRUE(attn_context_last_error(ctx)[0] != 0);
    /* attn_select_backend says the same and keeps the record. */
    attn_test_log_reset(&cap);
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_UNKNOWN_ENV], 1);
    EXPECT_EQ_INT(s.env_set, 1);
    EXPECT_TRUE(strcmp(s.env_value, "flashinfer") == 0);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_AUTO);
    /* Not cached: a repeat fails the same way. */
    attn_test_log_reset(&cap);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_UNKNOWN_ENV], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 0);
    /* "auto" is no backend name either. */
    setenv("ATTN_BACKEND", "auto", 1);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNKNOWN_BACKEND);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_env_names_a_plugin) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512)));
    setenv("ATTN_BACKEND", "TestPlug", 1);
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.source, ATTN_SELECTION_ENV);
    EXPECT_EQ_INT(s.requested, ATTN_BACKEND_CUSTOM);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUSTOM);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    /* The slot's name works too, as it does for attn_backend_from_name. */
    setenv("ATTN_BACKEND", "custom", 1);
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.source, ATTN_SELECTION_ENV);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUSTOM);
    /* An empty slot's name names no backend. */
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, NULL));
    EXPECT_OK(attn_selection_cache_clear(ctx)); /* the registry changed */
    attn_test_log_reset(&cap);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_UNKNOWN_ENV], 1);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_code_request_for_empty_slot_fails) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_select_request req;
    attn_selection s;
    attn_layer *layer = (attn_layer *)&cap;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CUSTOM;
    EXPECT_STATUS(attn_layer_create(ctx, &d, &req, &layer), ATTN_ERROR_BACKEND_UNAVAILABLE);
    EXPECT_TRUE(layer == NULL);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_EXPLICIT_FAILED], 1);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_EXPLICIT_FAILED][ATTN_LOG_LEVEL_ERROR], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_FALLBACK], 0);
    EXPECT_TRUE(attn_context_last_error(ctx)[0] != 0);
    attn_test_log_reset(&cap);
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, &req, &s), ATTN_ERROR_BACKEND_UNAVAILABLE);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_EXPLICIT_FAILED], 1);
    EXPECT_EQ_INT(s.forced_by_code, 1);
    EXPECT_EQ_INT(s.requested, ATTN_BACKEND_CUSTOM);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_AUTO);
    EXPECT_EQ_INT(s.source, ATTN_SELECTION_CODE);
    EXPECT_EQ_INT(s.num_skipped, 1);
    EXPECT_EQ_INT(s.skipped[0].backend, ATTN_BACKEND_CUSTOM);
    EXPECT_TRUE(s.skipped[0].reason[0] != 0);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_code_request_plugin_head_size_excluded_fails) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc(); /* head_size 64 */
    attn_select_request req;
    attn_selection s;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 128, 256)));
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CUSTOM;
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, &req, &s), ATTN_ERROR_BACKEND_UNAVAILABLE);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_EXPLICIT_FAILED][ATTN_LOG_LEVEL_ERROR], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_AUTO);
    EXPECT_EQ_INT(s.requested, ATTN_BACKEND_CUSTOM);
    EXPECT_EQ_INT(s.num_skipped, 1);
    EXPECT_EQ_INT(s.skipped[0].backend, ATTN_BACKEND_CUSTOM);
    EXPECT_TRUE(s.skipped[0].reason[0] != 0);
    EXPECT_TRUE(s.log_line[0] != 0);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_env_request_that_cannot_serve_fails) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 128, 256)));
    setenv("ATTN_BACKEND", "testplug", 1);
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_BACKEND_UNAVAILABLE);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_EXPLICIT_FAILED][ATTN_LOG_LEVEL_ERROR], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_EQ_INT(s.source, ATTN_SELECTION_ENV);
    EXPECT_EQ_INT(s.forced_by_code, 0);
    EXPECT_EQ_INT(s.requested, ATTN_BACKEND_CUSTOM);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_AUTO);
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CUSTOM));
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_fallback_degrades_to_cpu_with_warn) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_select_request req;
    attn_layer *layer = NULL;
    int round;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CUSTOM;
    req.allow_fallback = 1;
    /* Round 0: nothing registered in CUSTOM; round 1: a plugin that excludes the layer. */
    for (round = 0; round < 2; round++) {
        if (round == 1) {
            EXPECT_OK(attn_register_backend(
                ATTN_BACKEND_CUSTOM, sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 128, 256)));
            EXPECT_OK(attn_selection_cache_clear(ctx));
        }
        attn_test_log_reset(&cap);
        layer = NULL;
        EXPECT_OK(attn_layer_create(ctx, &d, &req, &layer));
        EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_FALLBACK], 1);
        EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_FALLBACK][ATTN_LOG_LEVEL_WARN], 1);
        EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
        EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_INFO], 1);
        EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_ERROR], 0);
        EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_EXPLICIT_FAILED], 0);
        if (layer) {
            const attn_selection *s = attn_layer_selection(layer);
            EXPECT_EQ_INT(s->resolved, ATTN_BACKEND_CPU);
            EXPECT_EQ_INT(s->requested, ATTN_BACKEND_CUSTOM);
            EXPECT_EQ_INT(s->forced_by_code, 1);
            EXPECT_EQ_INT(s->degraded, 1);
            EXPECT_TRUE(s->degradation[0] != 0);
            EXPECT_TRUE(strcmp(s->degradation, "none") != 0);
            EXPECT_TRUE(sel_skipped_has(s, ATTN_BACKEND_CUSTOM));
            EXPECT_EQ_INT(s->num_skipped, 1 + sel_cuda_ahead(ctx)); /* the refused request is not re-tried */
            EXPECT_TRUE(attn_layer_backend(layer) == attn_backend_get(ATTN_BACKEND_CPU));
        }
        attn_layer_destroy(layer);
    }
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_fallback_from_env_request) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_select_request req;
    attn_selection s;
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 128, 256)));
    setenv("ATTN_BACKEND", "TESTPLUG", 1);
    memset(&req, 0, sizeof req);
    req.allow_fallback = 1;
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, &req, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(s.requested, ATTN_BACKEND_CUSTOM);
    EXPECT_EQ_INT(s.degraded, 1);
    EXPECT_TRUE(strcmp(s.degradation, "none") != 0);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_FALLBACK][ATTN_LOG_LEVEL_WARN], 1);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_fallback_with_nothing_to_fall_back_to) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_select_request req;
    attn_selection s;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    d.head_size = 600; /* beyond CPU's range */
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CUSTOM;
    req.allow_fallback = 1;
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, &req, &s), ATTN_ERROR_UNSUPPORTED);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_NO_BACKEND][ATTN_LOG_LEVEL_ERROR], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_AUTO);
    EXPECT_EQ_INT(s.degraded, 1);
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CUSTOM));
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CPU));
    attn_context_destroy(ctx);
    sel_cleanup();
}

/* ---- plugins in automatic resolution --------------------------------------------------- */

ATTN_TEST(sel_auto_skips_plugin_outside_its_range) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *layer = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 128, 256)));
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_CANDIDATE_SKIPPED][ATTN_LOG_LEVEL_DEBUG], 1 + sel_cuda_ahead(ctx));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_FALLBACK], 0);
    if (layer) {
        const attn_selection *s = attn_layer_selection(layer);
        EXPECT_EQ_INT(s->resolved, ATTN_BACKEND_CPU);
        EXPECT_EQ_INT(s->source, ATTN_SELECTION_AUTO);
        EXPECT_EQ_INT(s->degraded, 0); /* automatic skips are no degradation */
        EXPECT_EQ_INT(s->num_skipped, 1 + sel_cuda_ahead(ctx));
        EXPECT_EQ_INT(s->skipped[0].backend, ATTN_BACKEND_CUSTOM);
        EXPECT_TRUE(s->skipped[0].reason[0] != 0);
        EXPECT_TRUE(attn_layer_backend(layer) == attn_backend_get(ATTN_BACKEND_CPU));
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_auto_skips_plugin_whose_check_refuses) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    attn_backend *b;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    b = sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512);
    b->check = sel_plug_check_refuses;
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, b));
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(s.num_skipped, 1 + sel_cuda_ahead(ctx));
    EXPECT_EQ_INT(s.skipped[0].backend, ATTN_BACKEND_CUSTOM);
    EXPECT_TRUE(s.skipped[0].reason[0] != 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CANDIDATE_SKIPPED], 1 + sel_cuda_ahead(ctx));
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_auto_skips_plugin_of_other_kind) {
    /* An MLA plugin does not serve a standard layer; a feature it lacks skips it too. */
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    attn_backend *b;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    b = sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512);
    b->is_mla = 1;
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, b));
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CUSTOM));

    b->is_mla = 0;
    b->supports_sliding_window = 0;
    EXPECT_OK(attn_selection_cache_clear(ctx));
    d.sliding_window = 32;
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CUSTOM));

    b->supports_sliding_window = 1;
    b->dtypes = ATTN_DTYPE_BIT(ATTN_DTYPE_BF16);
    d.sliding_window = 0;
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s)); /* f16 layer */
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CUSTOM));
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_auto_skips_cuda_plugin_on_cpu_platform) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    attn_backend *b;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    if (sel_platform_is_cuda(ctx)) {
        attn_context_destroy(ctx);
        SKIP("a CUDA platform is present");
    }
    b = sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512);
    b->device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, b));
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(s.num_skipped, 1);
    EXPECT_EQ_INT(s.skipped[0].backend, ATTN_BACKEND_CUSTOM);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_auto_prefers_passing_plugin) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *layer = NULL;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512)));
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CANDIDATE_SKIPPED], 0);
    if (layer) {
        const attn_selection *s = attn_layer_selection(layer);
        EXPECT_TRUE(attn_layer_backend(layer) == &sel_plug);
        EXPECT_EQ_INT(s->resolved, ATTN_BACKEND_CUSTOM);
        EXPECT_EQ_INT(s->default_backend, ATTN_BACKEND_CUSTOM); /* first in the list */
        EXPECT_EQ_INT(s->source, ATTN_SELECTION_AUTO);
        EXPECT_EQ_INT(s->num_skipped, 0);
        /* The layer's cache shape comes from the plugin. */
        EXPECT_OK(attn_layer_kv_cache_shape(layer, 7, shape, &ndim));
        EXPECT_EQ_INT(ndim, 3);
        EXPECT_EQ_INT(shape[0], 7);
        EXPECT_EQ_INT(shape[1], 16);
        EXPECT_EQ_INT(shape[2], 2 * 2 * 64);
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

/* ---- the registry ---------------------------------------------------------------------- */

ATTN_TEST(sel_registry_replace_and_restore) {
    attn_backend_id id = ATTN_BACKEND_AUTO;
    const attn_backend *builtin_cpu = attn_backend_get(ATTN_BACKEND_CPU);
    attn_test_env q;
    EXPECT_TRUE(builtin_cpu != NULL);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_AUTO) == NULL);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_COUNT) == NULL);
    if (builtin_cpu) {
        EXPECT_EQ_INT(builtin_cpu->id, ATTN_BACKEND_CPU);
        EXPECT_TRUE(builtin_cpu->name != NULL && builtin_cpu->forward != NULL &&
                    builtin_cpu->kv_cache_shape != NULL);
    }

    /* CUSTOM: empty -> plugin -> empty. */
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512)));
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == &sel_plug);
    EXPECT_OK(attn_backend_from_name("testplug", &id));
    EXPECT_EQ_INT(id, ATTN_BACKEND_CUSTOM);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, NULL));
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);
    q = sel_quiet_begin();
    EXPECT_STATUS(attn_backend_from_name("testplug", &id), ATTN_ERROR_UNKNOWN_BACKEND);
    attn_test_env_restore(&q);

    /* CPU: built-in -> replacement -> built-in. */
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CPU,
                                    sel_plug_make(&sel_plug_cpu, ATTN_BACKEND_CPU, "CPU2", 8, 512)));
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CPU) == &sel_plug_cpu);
    EXPECT_OK(attn_backend_from_name("cpu2", &id));
    EXPECT_EQ_INT(id, ATTN_BACKEND_CPU);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CPU, NULL));
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CPU) == builtin_cpu);
    /* Restoring an already built-in entry is harmless. */
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CPU, NULL));
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CPU) == builtin_cpu);
    sel_cleanup();
}

ATTN_TEST(sel_registry_replacement_serves_new_layers) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *layer = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CPU,
                                    sel_plug_make(&sel_plug_cpu, ATTN_BACKEND_CPU, "CPU2", 8, 512)));
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (layer) EXPECT_TRUE(attn_layer_backend(layer) == &sel_plug_cpu);
    attn_layer_destroy(layer);
    layer = NULL;
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CPU, NULL));
    EXPECT_OK(attn_selection_cache_clear(ctx));
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (layer) EXPECT_TRUE(attn_layer_backend(layer) == attn_backend_get(ATTN_BACKEND_CPU));
    if (layer) EXPECT_TRUE(attn_layer_backend(layer) != &sel_plug_cpu);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_registry_rejects_id_mismatch) {
    attn_test_env q = sel_quiet_begin();
    const attn_backend *before_cpu = attn_backend_get(ATTN_BACKEND_CPU);
    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512);
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CPU, &sel_plug), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(attn_context_last_error(NULL)[0] != 0);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CPU) == before_cpu);
    sel_plug_make(&sel_plug, ATTN_BACKEND_CPU, "TESTPLUG", 8, 512);
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, &sel_plug), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);
    attn_test_env_restore(&q);
    sel_cleanup();
}

ATTN_TEST(sel_registry_rejects_missing_fields) {
    attn_test_env q = sel_quiet_begin();
    attn_backend *b;

    /* A required pointer member that is NULL is a NULL argument. */
    b = sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512);
    b->name = NULL;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, b), ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_TRUE(attn_context_last_error(NULL)[0] != 0);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);

    b = sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512);
    b->forward = NULL;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, b), ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);

    b = sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512);
    b->kv_cache_shape = NULL;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, b), ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);

    attn_test_env_restore(&q);
    sel_cleanup();
}

ATTN_TEST(sel_registry_rejects_bad_values) {
    attn_test_env q = sel_quiet_begin();
    attn_backend *b;

    b = sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "", 8, 512); /* empty name */
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, b), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);

    b = sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512);
    b->block_size_multiple = 0;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, b), ATTN_ERROR_INVALID_VALUE);
    b->block_size_multiple = 8;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, b), ATTN_ERROR_INVALID_VALUE);
    b->block_size_multiple = -16;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_CUSTOM, b), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);
    EXPECT_TRUE(attn_context_last_error(NULL)[0] != 0);

    attn_test_env_restore(&q);
    sel_cleanup();
}

ATTN_TEST(sel_registry_rejects_out_of_range_ids) {
    attn_test_env q = sel_quiet_begin();
    const attn_backend *before_cpu = attn_backend_get(ATTN_BACKEND_CPU);
    sel_plug_make(&sel_plug, ATTN_BACKEND_AUTO, "TESTPLUG", 8, 512);
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_AUTO, &sel_plug), ATTN_ERROR_INVALID_VALUE);
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_AUTO, NULL), ATTN_ERROR_INVALID_VALUE);
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_COUNT, NULL), ATTN_ERROR_INVALID_VALUE);
    sel_plug.id = ATTN_BACKEND_COUNT;
    EXPECT_STATUS(attn_register_backend(ATTN_BACKEND_COUNT, &sel_plug), ATTN_ERROR_INVALID_VALUE);
    EXPECT_STATUS(attn_register_backend((attn_backend_id)-1, NULL), ATTN_ERROR_INVALID_VALUE);
    EXPECT_STATUS(attn_register_backend((attn_backend_id)1000, NULL), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(attn_context_last_error(NULL)[0] != 0);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CPU) == before_cpu);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);
    attn_test_env_restore(&q);
    sel_cleanup();
}

/* ---- what no backend serves -------------------------------------------------------------- */

ATTN_TEST(sel_head_size_600_is_unsupported) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *layer = (attn_layer *)&cap;
    attn_selection s;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    d.head_size = 600;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNSUPPORTED);
    EXPECT_TRUE(layer == NULL);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_NO_BACKEND][ATTN_LOG_LEVEL_ERROR], 1);
    /* CPU (head size), CPU_MLA (not an MLA layer), CUDA_SM90, CUDA and CUDA_MLA_SM90 (no
       device here, or the head size / not MLA on a GPU machine; absent with ATTN_NO_CUDA)
       each leave a reason */
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_CANDIDATE_SKIPPED][ATTN_LOG_LEVEL_DEBUG], 2 + sel_cuda_entries());
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_INFO], 0);
    EXPECT_TRUE(attn_context_last_error(ctx)[0] != 0);
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_AUTO);
    EXPECT_EQ_INT(s.num_skipped, 2 + sel_cuda_entries());
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CPU));
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CPU_MLA));
    if (sel_cuda_entries()) {
        EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CUDA_SM90));
        EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CUDA));
        EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CUDA_MLA_SM90));
        EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CUDA_MLA));
    }
    EXPECT_TRUE(s.skipped[0].reason[0] != 0);
    EXPECT_EQ_INT(s.head_size, 600);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_head_size_off_grid_is_unsupported) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    d.head_size = 12; /* not a multiple of 8 */
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
    EXPECT_EQ_INT(s.num_skipped, 2 + sel_cuda_entries()); /* CPU: head size; CPU_MLA: not MLA; the CUDA entries */
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CPU));
    d.head_size = 512; /* the top of the range is served */
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_mla_served_only_by_mla_backend) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d;
    attn_select_request req;
    attn_selection s;
    attn_layer *layer = (attn_layer *)&cap;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    memset(&d, 0, sizeof d);
    d.num_heads = 16;
    d.head_size = 576;
    d.dtype = ATTN_DTYPE_BF16;
    d.use_mla = 1;
    d.kv_lora_rank = 512;
    d.qk_rope_head_dim = 64;
    d.qk_nope_head_dim = 128;
    d.v_head_dim = 128;
    /* An MLA layer goes to CPU_MLA; the standard CPU backend is skipped with its reason. */
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(layer != NULL && attn_layer_backend(layer)->id == ATTN_BACKEND_CPU_MLA);
    attn_layer_destroy(layer);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_NO_BACKEND], 0);
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.use_mla, 1);
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU_MLA);
    EXPECT_TRUE(sel_skipped_has(&s, ATTN_BACKEND_CPU));
    /* Asking for CPU by name does not make it an MLA backend. */
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CPU;
    attn_test_log_reset(&cap);
    EXPECT_STATUS(attn_select_backend(ctx, &d, &req, &s), ATTN_ERROR_BACKEND_UNAVAILABLE);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_EXPLICIT_FAILED], 1);
    EXPECT_EQ_INT(s.num_skipped, 1);
    EXPECT_EQ_INT(s.skipped[0].backend, ATTN_BACKEND_CPU);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_failures_are_not_cached) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *layer = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    d.head_size = 600;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNSUPPORTED);
    attn_test_log_reset(&cap);
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNSUPPORTED);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_NO_BACKEND], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CACHED], 0);
    /* A plugin that serves 600 now makes the same descriptor work. */
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 1024)));
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (layer) EXPECT_TRUE(attn_layer_backend(layer) == &sel_plug);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

/* ---- the selection record ---------------------------------------------------------------- */

ATTN_TEST(sel_record_inputs_are_filled) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d;
    attn_selection s;
    attn_platform p;
    const attn_layer_desc *eff;
    attn_layer *layer = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    memset(&p, 0, sizeof p);
    EXPECT_OK(attn_platform_get(ctx, &p));
    memset(&d, 0, sizeof d);
    d.num_heads = 8;
    d.head_size = 128;
    d.dtype = ATTN_DTYPE_BF16;  /* kv_cache_dtype AUTO: bf16 */
    d.block_size = 0;           /* default 16 */
    d.sliding_window = 256;
    memset(&s, 0x5a, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.dtype, ATTN_DTYPE_BF16);
    EXPECT_EQ_INT(s.kv_cache_dtype, ATTN_DTYPE_BF16);
    EXPECT_EQ_INT(s.block_size, 16);
    EXPECT_EQ_INT(s.head_size, 128);
    EXPECT_EQ_INT(s.sliding_window, 256);
    EXPECT_EQ_INT(s.num_heads, 8);
    EXPECT_EQ_INT(s.num_kv_heads, 8); /* 0 means num_heads */
    EXPECT_EQ_INT(s.use_mla, 0);
    EXPECT_EQ_INT(s.platform, p.kind);
    if (p.kind == ATTN_PLATFORM_CPU) {
        EXPECT_EQ_INT(s.platform, ATTN_PLATFORM_CPU);
        EXPECT_EQ_INT(s.device_capability, 0);
    } else {
        EXPECT_EQ_INT(s.device_capability, p.cuda_capability_major * 10 + p.cuda_capability_minor);
    }
    EXPECT_TRUE(strcmp(s.env_var, "ATTN_BACKEND") == 0);
    EXPECT_EQ_INT(s.env_set, 0);
    EXPECT_EQ_INT(s.env_value[0], 0);
    EXPECT_EQ_INT(s.default_backend, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(s.num_skipped, sel_cuda_ahead(ctx));

    /* dtype AUTO means f16; an explicit kv_cache_dtype is kept. */
    d.dtype = ATTN_DTYPE_AUTO;
    d.kv_cache_dtype = ATTN_DTYPE_F32;
    d.block_size = 32;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.dtype, ATTN_DTYPE_F16);
    EXPECT_EQ_INT(s.kv_cache_dtype, ATTN_DTYPE_F32);
    EXPECT_EQ_INT(s.block_size, 32);

    /* The layer's effective descriptor agrees with the record. */
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    eff = attn_layer_get_desc(layer);
    EXPECT_TRUE(eff != NULL);
    if (eff) {
        EXPECT_EQ_INT(eff->dtype, ATTN_DTYPE_F16);
        EXPECT_EQ_INT(eff->kv_cache_dtype, ATTN_DTYPE_F32);
        EXPECT_EQ_INT(eff->num_kv_heads, 8);
        EXPECT_EQ_INT(eff->causal, ATTN_CAUSAL_YES);
        EXPECT_NEAR(eff->scale, 1.0 / sqrt(128.0), 1e-7, 1e-6);
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_format_names_every_field) {
    static const char *const fields[] = {
        "env_var", "env_value", "forced_by_code", "default_backend", "resolved_backend",
        "degradation_hit", "dtype", "kv_cache_dtype", "block_size", "sliding_window",
        "head_size", "device_capability", "kind"};
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    char buf[4096], small[16];
    size_t n, n2, i;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    n = attn_selection_format(&s, buf, sizeof buf);
    EXPECT_TRUE(n > 0 && n < sizeof buf);
    EXPECT_EQ_INT(strlen(buf), n);
    for (i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (!strstr(buf, fields[i])) attn_test_fail(__FILE__, __LINE__, "field %s missing", fields[i]);
    }
    /* Like snprintf: the needed length with a small buffer, always terminated. */
    memset(small, 'x', sizeof small);
    n2 = attn_selection_format(&s, small, sizeof small);
    EXPECT_EQ_INT(n2, n);
    EXPECT_EQ_INT(small[sizeof small - 1], 0);
    EXPECT_EQ_INT(attn_selection_format(&s, NULL, 0), n);
    EXPECT_EQ_INT(attn_selection_format(NULL, buf, sizeof buf), 0);

    /* A failed resolution formats too (the record says why). */
    d.head_size = 600;
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
    n = attn_selection_format(&s, buf, sizeof buf);
    EXPECT_TRUE(n > 0 && n < sizeof buf);
    EXPECT_TRUE(strstr(buf, "resolved_backend") != NULL);
    attn_context_destroy(ctx);
    sel_cleanup();
}

/* ---- platform, names, levels ---------------------------------------------------------------- */

ATTN_TEST(sel_platform_reports_cpu) {
    attn_test_log cap;
    attn_context_desc cd;
    attn_context *ctx = NULL;
    attn_platform p;
    char buf[2048];
    size_t n;
    memset(&cd, 0, sizeof cd);
    memset(&cap, 0, sizeof cap);
    cd.log = attn_test_log_hook;
    cd.log_user_data = &cap;
    cd.log_level = ATTN_LOG_LEVEL_DEBUG;
    cd.num_threads = 2;
    EXPECT_OK(attn_context_create(&cd, &ctx));
    if (!ctx) return;
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_PLATFORM_PROBED][ATTN_LOG_LEVEL_DEBUG], 1);
    memset(&p, 0x5a, sizeof p);
    EXPECT_OK(attn_platform_get(ctx, &p));
    EXPECT_TRUE(p.cpu_cores >= 1);
#ifndef ATTN_NO_THREADS
    EXPECT_EQ_INT(p.cpu_threads, 2);
#endif
    EXPECT_TRUE(p.cpu_simd[0] != 0);
    n = attn_platform_format(&p, buf, sizeof buf);
    EXPECT_TRUE(n > 0 && n < sizeof buf);
    EXPECT_TRUE(strstr(buf, "kind") != NULL);
    if (p.kind == ATTN_PLATFORM_CUDA) {
        attn_context_destroy(ctx);
        SKIP("a CUDA driver and device are present");
    }
    EXPECT_EQ_INT(p.kind, ATTN_PLATFORM_CPU);
    EXPECT_TRUE(p.cuda_reason[0] != 0);
    EXPECT_EQ_INT(p.cuda_capability_major, 0);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_CUDA_UNAVAILABLE][ATTN_LOG_LEVEL_DEBUG], 1);
    attn_context_destroy(ctx);
}

ATTN_TEST(sel_backend_from_name) {
    attn_backend_id id;
    attn_test_env q = sel_quiet_begin();
    id = ATTN_BACKEND_AUTO;
    EXPECT_OK(attn_backend_from_name("cpu", &id));
    EXPECT_EQ_INT(id, ATTN_BACKEND_CPU);
    id = ATTN_BACKEND_AUTO;
    EXPECT_OK(attn_backend_from_name("CpU", &id));
    EXPECT_EQ_INT(id, ATTN_BACKEND_CPU);
    id = ATTN_BACKEND_AUTO;
    EXPECT_OK(attn_backend_from_name("CPU", &id));
    EXPECT_EQ_INT(id, ATTN_BACKEND_CPU);

    id = (attn_backend_id)77;
    EXPECT_STATUS(attn_backend_from_name("flash_attn", &id), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_EQ_INT(id, 77); /* untouched */
    EXPECT_TRUE(attn_context_last_error(NULL)[0] != 0);
    EXPECT_STATUS(attn_backend_from_name("", &id), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_STATUS(attn_backend_from_name("cpux", &id), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_STATUS(attn_backend_from_name("cp", &id), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_STATUS(attn_backend_from_name("auto", &id), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_STATUS(attn_backend_from_name("custom", &id), ATTN_ERROR_UNKNOWN_BACKEND); /* empty */
    EXPECT_STATUS(attn_backend_from_name("testplug", &id), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_EQ_INT(id, 77);

    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM,
                                    sel_plug_make(&sel_plug, ATTN_BACKEND_CUSTOM, "TESTPLUG", 8, 512)));
    EXPECT_OK(attn_backend_from_name("tEsTpLuG", &id));
    EXPECT_EQ_INT(id, ATTN_BACKEND_CUSTOM);

    EXPECT_STATUS(attn_backend_from_name(NULL, &id), ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_STATUS(attn_backend_from_name("cpu", NULL), ATTN_ERROR_NULL_ARGUMENT);

    /* Slot names. */
    EXPECT_TRUE(strcmp(attn_backend_name(ATTN_BACKEND_CPU), attn_backend_name(ATTN_BACKEND_CUSTOM)) != 0);
    EXPECT_TRUE(strcmp(attn_backend_name(ATTN_BACKEND_CPU), attn_backend_name(ATTN_BACKEND_AUTO)) != 0);
    EXPECT_TRUE(attn_backend_name((attn_backend_id)99) != NULL);
    attn_test_env_restore(&q);
    sel_cleanup();
}

ATTN_TEST(sel_log_level_error_hides_info) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_layer *layer = NULL, *bad = NULL;
    unsetenv("ATTN_BACKEND");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_ERROR, 1);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_EQ_INT(cap.total, 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    /* Errors still come through. */
    d.head_size = 600;
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &bad), ATTN_ERROR_UNSUPPORTED);
    EXPECT_TRUE(bad == NULL);
    EXPECT_EQ_INT(cap.total, 1);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_NO_BACKEND][ATTN_LOG_LEVEL_ERROR], 1);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_CANDIDATE_SKIPPED], 0);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_log_level_thresholds) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_select_request req;
    attn_selection s;
    unsetenv("ATTN_BACKEND");
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CUSTOM;
    req.allow_fallback = 1;

    /* WARN: the fallback line, not the INFO line. */
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_WARN, 1);
    EXPECT_OK(attn_select_backend(ctx, &d, &req, &s));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_FALLBACK][ATTN_LOG_LEVEL_WARN], 1);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_INFO], 0);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_DEBUG], 0);

    /* NONE: nothing at all, errors included. */
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_context_set_log_level(ctx, ATTN_LOG_LEVEL_NONE));
    EXPECT_OK(attn_selection_cache_clear(ctx));
    EXPECT_OK(attn_select_backend(ctx, &d, &req, &s));
    d.head_size = 600;
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
    EXPECT_EQ_INT(cap.total, 0);

    /* INFO: the resolution and the warning, no debug lines. */
    d.head_size = 64;
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_context_set_log_level(ctx, ATTN_LOG_LEVEL_INFO));
    EXPECT_OK(attn_selection_cache_clear(ctx));
    EXPECT_OK(attn_select_backend(ctx, &d, &req, &s));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_FALLBACK][ATTN_LOG_LEVEL_WARN], 1);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_DEBUG], 0);
    EXPECT_OK(attn_select_backend(ctx, &d, &req, &s)); /* cached: DEBUG, hidden */
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_DEBUG], 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 1);

    /* DEBUG: the cache hit becomes visible. */
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_context_set_log_level(ctx, ATTN_LOG_LEVEL_DEBUG));
    EXPECT_OK(attn_select_backend(ctx, &d, &req, &s));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_CACHED][ATTN_LOG_LEVEL_DEBUG], 1);
    EXPECT_EQ_INT(cap.bad_item, 0);
    attn_context_destroy(ctx);
    sel_cleanup();
}

ATTN_TEST(sel_log_level_from_env) {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer_desc d = sel_desc();
    attn_selection s;
    attn_test_env saved = attn_test_env_save("ATTN_LOG_LEVEL");
    unsetenv("ATTN_BACKEND");
    setenv("ATTN_LOG_LEVEL", "ERROR", 1);
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEFAULT, 1);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(cap.total, 0);
    /* DEFAULT through set_log_level re-reads the variable. */
    setenv("ATTN_LOG_LEVEL", "info", 1);
    EXPECT_OK(attn_context_set_log_level(ctx, ATTN_LOG_LEVEL_DEFAULT));
    EXPECT_OK(attn_selection_cache_clear(ctx));
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    attn_context_destroy(ctx);
    /* Unset: INFO. */
    unsetenv("ATTN_LOG_LEVEL");
    ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEFAULT, 1);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(cap.by_item_level[ATTN_LOG_SELECT_RESOLVED][ATTN_LOG_LEVEL_INFO], 1);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_DEBUG], 0);
    attn_context_destroy(ctx);
    attn_test_env_restore(&saved);
    sel_cleanup();
}

ATTN_TEST(sel_status_strings_are_distinct) {
    static const attn_status all[] = {
        ATTN_OK, ATTN_ERROR_NULL_ARGUMENT, ATTN_ERROR_INVALID_VALUE, ATTN_ERROR_SHAPE_MISMATCH,
        ATTN_ERROR_INVALID_METADATA, ATTN_ERROR_UNSUPPORTED, ATTN_ERROR_BACKEND_UNAVAILABLE,
        ATTN_ERROR_UNKNOWN_BACKEND, ATTN_ERROR_CAPACITY, ATTN_ERROR_OUT_OF_MEMORY,
        ATTN_ERROR_PLATFORM, ATTN_ERROR_INTERNAL};
    const int n = (int)(sizeof all / sizeof all[0]);
    const char *unknown = attn_status_string((attn_status)12345);
    int i, j;
    EXPECT_TRUE(unknown != NULL && unknown[0] != 0);
    for (i = 0; i < n; i++) {
        const char *a = attn_status_string(all[i]);
        EXPECT_TRUE(a != NULL && a[0] != 0);
        if (!a) continue;
        if (unknown) EXPECT_TRUE(strcmp(a, unknown) != 0);
        for (j = i + 1; j < n; j++) {
            const char *b = attn_status_string(all[j]);
            if (b && strcmp(a, b) == 0)
                attn_test_fail(__FILE__, __LINE__, "status %d and %d share a name", (int)all[i],
                               (int)all[j]);
        }
    }
}

ATTN_TEST(sel_log_item_names_are_distinct) {
    const char *out_of_range = attn_log_item_name(ATTN_LOG_ITEM_COUNT);
    int i, j;
    EXPECT_TRUE(out_of_range != NULL);
    EXPECT_TRUE(attn_log_item_name((attn_log_item)-1) != NULL);
    for (i = 0; i < (int)ATTN_LOG_ITEM_COUNT; i++) {
        const char *a = attn_log_item_name((attn_log_item)i);
        EXPECT_TRUE(a != NULL && a[0] != 0);
        if (!a) continue;
        if (out_of_range) EXPECT_TRUE(strcmp(a, out_of_range) != 0);
        for (j = i + 1; j < (int)ATTN_LOG_ITEM_COUNT; j++) {
            const char *b = attn_log_item_name((attn_log_item)j);
            if (b && strcmp(a, b) == 0)
                attn_test_fail(__FILE__, __LINE__, "log items %d and %d share a name", i, j);
        }
    }
    /* Items the selector relies on exist and differ from NONE. */
    EXPECT_TRUE(strcmp(attn_log_item_name(ATTN_LOG_SELECT_RESOLVED),
                       attn_log_item_name(ATTN_LOG_NONE)) != 0);
}

#ifndef ATTN_NO_THREADS
typedef struct {
    attn_context *ctx;
    int id;
    attn_status st;
    attn_layer *layers[6];
} sel_mt_arg;

/* Each thread: layers of three descriptors (the selection cache's entries), a selection
   record, a cache clear between them. */
static void *sel_mt_thread(void *varg) {
    sel_mt_arg *a = (sel_mt_arg *)varg;
    int i;
    for (i = 0; i < 6 && a->st == ATTN_OK; i++) {
        attn_layer_desc d = sel_desc();
        attn_selection sel;
        d.head_size = 32 * (1 + (a->id + i) % 3);
        if (i == 3 && a->id % 2) a->st = attn_selection_cache_clear(a->ctx);
        if (a->st == ATTN_OK) a->st = attn_select_backend(a->ctx, &d, NULL, &sel);
        if (a->st == ATTN_OK && sel.resolved != ATTN_BACKEND_CPU) a->st = ATTN_ERROR_INTERNAL;
        if (a->st == ATTN_OK) a->st = attn_layer_create(a->ctx, &d, NULL, &a->layers[i]);
    }
    return NULL;
}
#endif

/* Threads creating layers of one fresh context at once (the backends' context state is
   created by the first; the selection cache grows and is cleared meanwhile): every call
   succeeds and every layer is the CPU backend's. The documented exception to "one thread
   at a time" (THREAD SAFETY); the ThreadSanitizer build of make test checks it for races. */
ATTN_TEST(sel_threads_create_layers_of_one_context) {
#ifdef ATTN_NO_THREADS
    SKIP("built without threads (ATTN_NO_THREADS)");
#else
    attn_context_desc cd;
    attn_context *ctx = NULL;
    sel_mt_arg args[8];
    pthread_t th[8];
    int i, k;
    memset(&cd, 0, sizeof cd);
    cd.log_level = ATTN_LOG_LEVEL_NONE;
    cd.num_threads = 1;
    EXPECT_OK(attn_context_create(&cd, &ctx));
    if (!ctx) return;
    memset(args, 0, sizeof args);
    for (i = 0; i < 8; i++) {
        args[i].ctx = ctx;
        args[i].id = i;
        pthread_create(&th[i], NULL, sel_mt_thread, &args[i]);
    }
    for (i = 0; i < 8; i++) pthread_join(th[i], NULL);
    for (i = 0; i < 8; i++) {
        EXPECT_OK(args[i].st);
        for (k = 0; k < 6; k++) {
            EXPECT_TRUE(args[i].layers[k] != NULL);
            if (args[i].layers[k]) EXPECT_TRUE(attn_layer_backend(args[i].layers[k])->id == ATTN_BACKEND_CPU);
            attn_layer_destroy(args[i].layers[k]);
        }
    }
    attn_context_destroy(ctx);
#endif
}

void suite_selector(void) {
    ATTN_RUN(sel_auto_resolves_cpu_with_one_info_line);
    ATTN_RUN(sel_fp8_cache_record);
    ATTN_RUN(sel_default_resolution_logs_info_at_info_threshold);
    ATTN_RUN(sel_second_create_is_cached);
    ATTN_RUN(sel_cache_clear_resolves_again);
    ATTN_RUN(sel_cache_is_per_context);
    ATTN_RUN(sel_cache_keyed_by_env_value);
    ATTN_RUN(sel_cache_keyed_by_request_and_desc);
    ATTN_RUN(sel_select_backend_shares_the_cache);
    ATTN_RUN(sel_code_request_cpu);
    ATTN_RUN(sel_env_cpu_is_case_insensitive);
    ATTN_RUN(sel_env_empty_counts_as_unset);
    ATTN_RUN(sel_code_beats_env);
    ATTN_RUN(sel_env_unknown_name_fails);
    ATTN_RUN(sel_env_names_a_plugin);
    ATTN_RUN(sel_code_request_for_empty_slot_fails);
    ATTN_RUN(sel_code_request_plugin_head_size_excluded_fails);
    ATTN_RUN(sel_env_request_that_cannot_serve_fails);
    ATTN_RUN(sel_fallback_degrades_to_cpu_with_warn);
    ATTN_RUN(sel_fallback_from_env_request);
    ATTN_RUN(sel_fallback_with_nothing_to_fall_back_to);
    ATTN_RUN(sel_auto_skips_plugin_outside_its_range);
    ATTN_RUN(sel_auto_skips_plugin_whose_check_refuses);
    ATTN_RUN(sel_auto_skips_plugin_of_other_kind);
    ATTN_RUN(sel_auto_skips_cuda_plugin_on_cpu_platform);
    ATTN_RUN(sel_auto_prefers_passing_plugin);
    ATTN_RUN(sel_registry_replace_and_restore);
    ATTN_RUN(sel_registry_replacement_serves_new_layers);
    ATTN_RUN(sel_registry_rejects_id_mismatch);
    ATTN_RUN(sel_registry_rejects_missing_fields);
    ATTN_RUN(sel_registry_rejects_bad_values);
    ATTN_RUN(sel_registry_rejects_out_of_range_ids);
    ATTN_RUN(sel_head_size_600_is_unsupported);
    ATTN_RUN(sel_head_size_off_grid_is_unsupported);
    ATTN_RUN(sel_mla_served_only_by_mla_backend);
    ATTN_RUN(sel_failures_are_not_cached);
    ATTN_RUN(sel_record_inputs_are_filled);
    ATTN_RUN(sel_format_names_every_field);
    ATTN_RUN(sel_platform_reports_cpu);
    ATTN_RUN(sel_backend_from_name);
    ATTN_RUN(sel_log_level_error_hides_info);
    ATTN_RUN(sel_log_level_thresholds);
    ATTN_RUN(sel_log_level_from_env);
    ATTN_RUN(sel_status_strings_are_distinct);
    ATTN_RUN(sel_log_item_names_are_distinct);
    ATTN_RUN(sel_threads_create_layers_of_one_context);
}
