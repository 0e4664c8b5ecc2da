/* Bad input at every public entry point: each failure returns its named status, leaves a
   last-error message, logs one ERROR line with the expected item, and writes nothing
   (outputs, caches and metadata are poisoned or snapshotted before the call and compared
   byte for byte after it). Also one test per metadata rule. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A failing call on a context: the status, one more ERROR line carrying `item`, and a
   message in the context's last error. */
#define VAL_FAILS(cap, ctx, expr, want, item)                                          \
    do {                                                                               \
        int e0_ = (cap)->by_level[ATTN_LOG_LEVEL_ERROR];                               \
        EXPECT_STATUS(expr, want);                                                     \
        EXPECT_EQ_INT((cap)->by_level[ATTN_LOG_LEVEL_ERROR] - e0_, 1);                 \
        if ((cap)->last_item != (item))                                                \
            attn_test_fail(__FILE__, __LINE__, "ITEMFIX got %s expected %s",           \
                           attn_log_item_name((cap)->last_item), attn_log_item_name(item)); \
        EXPECT_EQ_INT((cap)->last_level, ATTN_LOG_LEVEL_ERROR);                        \
        EXPECT_TRUE(attn_context_last_error(ctx)[0] != 0);                             \
    } while (0)

/* A failing call without a context: the status and the thread's last error. */
#define VAL_FAILS_NOCTX(expr, want)                                                    \
    do {                                                                               \
        EXPECT_STATUS(expr, want);                                                     \
        EXPECT_TRUE(attn_context_last_error(NULL)[0] != 0);                            \
    } while (0)

/* ---- the fixture: a small GQA layer, a two-request batch, its tensors ------------------ */

#define VF_H 4      /* query heads */
#define VF_HKV 2    /* KV heads */
#define VF_D 16     /* head size */
#define VF_BS 16    /* block size */
#define VF_NB 8     /* blocks in the cache */
#define VF_NT 6     /* tokens in the batch */
#define VF_ROWS 8   /* rows of q/out (2 padding rows) */
#define VF_MAXREQ 4
#define VF_MAXBLK 4
#define VF_KV_FLOATS (VF_NB * 2 * VF_BS * VF_HKV * VF_D)

typedef struct vfix {
    attn_test_log cap;
    attn_context *ctx;
    attn_layer *layer;
    attn_metadata *meta;
    attn_layer_desc desc;
    attn_metadata_desc mdesc;
    /* the batch (arrays big enough for bad counts that a validator must not trust) */
    int32_t qsl[16];
    int32_t seq_lens[16];
    int32_t block_table[128];
    int64_t slots[32];
    attn_batch batch;
    /* tensors */
    float q[VF_ROWS * VF_H * VF_D], out[VF_ROWS * VF_H * VF_D], lse[VF_ROWS * VF_H];
    float k[VF_ROWS * VF_HKV * VF_D], v[VF_ROWS * VF_HKV * VF_D];
    float kv[VF_KV_FLOATS];
    attn_tensor tq, tk, tv, tout, tlse, tkv;
    /* snapshots for "nothing was written" */
    float out_ref[VF_ROWS * VF_H * VF_D], lse_ref[VF_ROWS * VF_H], kv_ref[VF_KV_FLOATS];
} vfix;

static vfix F;

static float vf_rand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

/* The valid batch: request 0 is a 5-token prefill (seq 5, block 3); request 1 a decode at
   position 19 (seq 20, blocks 5, 6). */
static void vf_batch_reset(vfix *f) {
    memset(f->qsl, 0, sizeof f->qsl);
    memset(f->seq_lens, 0, sizeof f->seq_lens);
    memset(f->block_table, 0, sizeof f->block_table);
    memset(f->slots, 0, sizeof f->slots);
    f->qsl[0] = 0; f->qsl[1] = 5; f->qsl[2] = 6;
    f->seq_lens[0] = 5; f->seq_lens[1] = 20;
    f->block_table[0 * VF_MAXBLK + 0] = 3;
    f->block_table[1 * VF_MAXBLK + 0] = 5;
    f->block_table[1 * VF_MAXBLK + 1] = 6;
    f->slots[0] = 48; f->slots[1] = 49; f->slots[2] = 50; f->slots[3] = 51; f->slots[4] = 52;
    f->slots[5] = 6 * VF_BS + 3;
    memset(&f->batch, 0, sizeof f->batch);
    f->batch.query_start_loc = f->qsl;
    f->batch.seq_lens = f->seq_lens;
    f->batch.block_table = f->block_table;
    f->batch.block_table_stride = VF_MAXBLK;
    f->batch.slot_mapping = f->slots;
    f->batch.num_reqs = 2;
    f->batch.num_actual_tokens = VF_NT;
    f->batch.max_query_len = 5;
    f->batch.max_seq_len = 20;
    f->batch.causal = ATTN_CAUSAL_DEFAULT;
}

static attn_layer_desc vf_desc(void) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.num_heads = VF_H;
    d.num_kv_heads = VF_HKV;
    d.head_size = VF_D;
    d.dtype = ATTN_DTYPE_F32;
    d.block_size = VF_BS;
    return d;
}

static void vf_tensors(vfix *f) {
    int64_t sq[3] = {VF_ROWS, VF_H, VF_D}, skv[3] = {VF_ROWS, VF_HKV, VF_D}, sl[2] = {VF_ROWS, VF_H};
    int64_t sc[5] = {VF_NB, 2, VF_BS, VF_HKV, VF_D};
    uint32_t seed = 12345u;
    size_t i;
    for (i = 0; i < sizeof f->q / sizeof f->q[0]; i++) f->q[i] = vf_rand(&seed);
    for (i = 0; i < sizeof f->k / sizeof f->k[0]; i++) f->k[i] = vf_rand(&seed);
    for (i = 0; i < sizeof f->v / sizeof f->v[0]; i++) f->v[i] = vf_rand(&seed);
    for (i = 0; i < VF_KV_FLOATS; i++) f->kv[i] = vf_rand(&seed);
    memset(f->out, 0, sizeof f->out);
    memset(f->lse, 0, sizeof f->lse);
    f->tq = attn_tensor_make(f->q, ATTN_DTYPE_F32, 3, sq);
    f->tout = attn_tensor_make(f->out, ATTN_DTYPE_F32, 3, sq);
    f->tk = attn_tensor_make(f->k, ATTN_DTYPE_F32, 3, skv);
    f->tv = attn_tensor_make(f->v, ATTN_DTYPE_F32, 3, skv);
    f->tlse = attn_tensor_make(f->lse, ATTN_DTYPE_F32, 2, sl);
    f->tkv = attn_tensor_make(f->kv, ATTN_DTYPE_F32, 5, sc);
}

/* ctx + layer + metadata (+ a built batch when build is set). */
static void vf_setup(vfix *f, int build) {
    memset(f, 0, sizeof *f);
    f->ctx = attn_test_context(&f->cap, ATTN_LOG_LEVEL_DEBUG, 2);
    f->desc = vf_desc();
    if (f->ctx) EXPECT_OK(attn_layer_create(f->ctx, &f->desc, NULL, &f->layer));
    f->mdesc.max_num_reqs = VF_MAXREQ;
    f->mdesc.max_num_tokens = VF_ROWS;
    f->mdesc.max_blocks_per_req = VF_MAXBLK;
    f->mdesc.num_blocks = VF_NB;
    if (f->layer) EXPECT_OK(attn_metadata_create(f->layer, &f->mdesc, &f->meta));
    vf_batch_reset(f);
    vf_tensors(f);
    if (build && f->meta) EXPECT_OK(attn_metadata_build(f->meta, 0, &f->batch, 0));
    memset(&f->cap, 0, sizeof f->cap);
}

static void vf_teardown(vfix *f) {
    attn_metadata_destroy(f->meta);
    attn_layer_destroy(f->layer);
    attn_context_destroy(f->ctx);
    f->meta = NULL;
    f->layer = NULL;
    f->ctx = NULL;
}

static int vf_ready(vfix *f) { return f->ctx && f->layer && f->meta; }

/* Poisons out and lse (0x7f bytes) and snapshots the cache. */
static void vf_poison(vfix *f) {
    memset(f->out, 0x7f, sizeof f->out);
    memset(f->lse, 0x7f, sizeof f->lse);
    memcpy(f->out_ref, f->out, sizeof f->out);
    memcpy(f->lse_ref, f->lse, sizeof f->lse);
    memcpy(f->kv_ref, f->kv, sizeof f->kv);
}

static int vf_untouched(const vfix *f) {
    return memcmp(f->out, f->out_ref, sizeof f->out) == 0 &&
           memcmp(f->lse, f->lse_ref, sizeof f->lse) == 0 &&
           memcmp(f->kv, f->kv_ref, sizeof f->kv) == 0;
}

/* A deep copy of what attn_metadata_batch shows, to prove a failed build kept it. */
typedef struct vf_meta_snap {
    attn_batch b;
    int32_t qsl[16], seq_lens[16], block_table[VF_MAXREQ * VF_MAXBLK];
    int64_t slots[32];
} vf_meta_snap;

static void vf_meta_take(const attn_metadata *meta, vf_meta_snap *s) {
    const attn_batch *b = attn_metadata_batch(meta);
    int i, k;
    memset(s, 0, sizeof *s);
    if (!b) return;
    s->b = *b;
    if (!b->query_start_loc) return; /* never built */
    for (i = 0; i <= b->num_reqs && i < 16; i++) s->qsl[i] = b->query_start_loc[i];
    for (i = 0; i < b->num_reqs && i < VF_MAXREQ; i++) {
        int nb = (b->seq_lens[i] + VF_BS - 1) / VF_BS;
        s->seq_lens[i] = b->seq_lens[i];
        for (k = 0; k < nb && k < VF_MAXBLK; k++)
            s->block_table[i * VF_MAXBLK + k] = b->block_table[(size_t)i * (size_t)b->block_table_stride + (size_t)k];
    }
    if (b->slot_mapping)
        for (i = 0; i < b->num_actual_tokens && i < 32; i++) s->slots[i] = b->slot_mapping[i];
}

static int vf_meta_same(const vf_meta_snap *a, const vf_meta_snap *b) {
    return a->b.num_reqs == b->b.num_reqs && a->b.num_actual_tokens == b->b.num_actual_tokens &&
           a->b.max_query_len == b->b.max_query_len && a->b.max_seq_len == b->b.max_seq_len &&
           a->b.causal == b->b.causal && a->b.block_table_stride == b->b.block_table_stride &&
           (a->b.slot_mapping == NULL) == (b->b.slot_mapping == NULL) &&
           memcmp(a->qsl, b->qsl, sizeof a->qsl) == 0 &&
           memcmp(a->seq_lens, b->seq_lens, sizeof a->seq_lens) == 0 &&
           memcmp(a->block_table, b->block_table, sizeof a->block_table) == 0 &&
           memcmp(a->slots, b->slots, sizeof a->slots) == 0;
}

/* attn_metadata_build with f->batch must fail with `want` (item INVALID_METADATA) and
   keep the metadata as it was. */
static void vf_build_fails(vfix *f, int common_prefix_len, attn_status want, attn_log_item item, int line) {
    vf_meta_snap before, after;
    int e0 = f->cap.by_level[ATTN_LOG_LEVEL_ERROR];
    attn_status st;
    vf_meta_take(f->meta, &before);
    st = attn_metadata_build(f->meta, common_prefix_len, &f->batch, 0);
    if (st != want)
        attn_test_fail(__FILE__, line, "attn_metadata_build: got %s, expected %s",
                       attn_status_string(st), attn_status_string(want));
    if (f->cap.by_level[ATTN_LOG_LEVEL_ERROR] - e0 != 1)
        attn_test_fail(__FILE__, line, "expected one ERROR line (got %d)",
                       f->cap.by_level[ATTN_LOG_LEVEL_ERROR] - e0);
    else if (f->cap.last_item != item)
        attn_test_fail(__FILE__, line, "ITEMFIX got %s expected %s", attn_log_item_name(f->cap.last_item),
                       attn_log_item_name(item));
    if (!attn_context_last_error(f->ctx)[0])
        attn_test_fail(__FILE__, line, "empty last error");
    vf_meta_take(f->meta, &after);
    if (!vf_meta_same(&before, &after))
        attn_test_fail(__FILE__, line, "the failed build changed the metadata");
}

/* attn_layer_forward must fail with `want`/`item` and write nothing. */
static void vf_forward_fails(vfix *f, const attn_metadata *meta, const attn_tensor *q,
                             const attn_tensor *k, const attn_tensor *v, attn_tensor *kv,
                             attn_tensor *out, attn_tensor *lse, attn_status want,
                             attn_log_item item, int line) {
    int e0 = f->cap.by_level[ATTN_LOG_LEVEL_ERROR];
    attn_status st;
    vf_poison(f);
    st = attn_layer_forward(f->layer, meta, q, k, v, kv, out, lse, NULL);
    if (st != want)
        attn_test_fail(__FILE__, line, "attn_layer_forward: got %s, expected %s",
                       attn_status_string(st), attn_status_string(want));
    if (f->cap.by_level[ATTN_LOG_LEVEL_ERROR] - e0 == 1 && f->cap.last_item != item)
        attn_test_fail(__FILE__, line, "ITEMFIX got %s expected %s", attn_log_item_name(f->cap.last_item),
                       attn_log_item_name(item));
    else if (f->cap.by_level[ATTN_LOG_LEVEL_ERROR] - e0 != 1 || f->cap.last_item != item)
        attn_test_fail(__FILE__, line, "expected one ERROR line with %s (got %d lines, last %s)",
                       attn_log_item_name(item), f->cap.by_level[ATTN_LOG_LEVEL_ERROR] - e0,
                       attn_log_item_name(f->cap.last_item));
    if (!attn_context_last_error(f->ctx)[0]) attn_test_fail(__FILE__, line, "empty last error");
    if (!vf_untouched(f)) attn_test_fail(__FILE__, line, "out, lse or kv_cache was written");
}

/* attn_reshape_and_cache must fail and leave the cache as it was. */
static void vf_cache_fails(vfix *f, const attn_tensor *key, const attn_tensor *value,
                           attn_tensor *kv, const int64_t *slots, int n, attn_status want,
                           attn_log_item item, int line) {
    int e0 = f->cap.by_level[ATTN_LOG_LEVEL_ERROR];
    attn_status st;
    vf_poison(f);
    st = attn_reshape_and_cache(f->layer, key, value, kv, ATTN_TEST_SLOTS(slots, n), NULL);
    if (st != want)
        attn_test_fail(__FILE__, line, "attn_reshape_and_cache: got %s, expected %s",
                       attn_status_string(st), attn_status_string(want));
    if (f->cap.by_level[ATTN_LOG_LEVEL_ERROR] - e0 != 1)
        attn_test_fail(__FILE__, line, "expected one ERROR line (got %d)",
                       f->cap.by_level[ATTN_LOG_LEVEL_ERROR] - e0);
    else if (f->cap.last_item != item)
        attn_test_fail(__FILE__, line, "ITEMFIX got %s expected %s", attn_log_item_name(f->cap.last_item),
                       attn_log_item_name(item));
    if (!attn_context_last_error(f->ctx)[0]) attn_test_fail(__FILE__, line, "empty last error");
    if (!vf_untouched(f)) attn_test_fail(__FILE__, line, "the cache was written");
}

#define VF_FWD_FAILS(meta, q, k, v, kv, out, lse, want, item) \
    vf_forward_fails(&F, meta, q, k, v, kv, out, lse, want, item, __LINE__)
#define VF_BUILD_FAILS(cpl, want, item) vf_build_fails(&F, cpl, want, item, __LINE__)
#define VF_CACHE_FAILS(key, value, kv, slots, n, want, item) \
    vf_cache_fails(&F, key, value, kv, slots, n, want, item, __LINE__)

/* ---- context, platform, names, registry ----------------------------------------------- */

ATTN_TEST(val_context_create) {
    attn_context_desc cd;
    attn_context *ctx = (attn_context *)&cd; /* poison: failures set it to NULL */
    VAL_FAILS_NOCTX(attn_context_create(NULL, NULL), ATTN_ERROR_NULL_ARGUMENT);
    memset(&cd, 0, sizeof cd);
    cd.log_level = (attn_log_level)6;
    VAL_FAILS_NOCTX(attn_context_create(&cd, &ctx), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(ctx == NULL);
    cd.log_level = (attn_log_level)-1;
    ctx = (attn_context *)&cd;
    VAL_FAILS_NOCTX(attn_context_create(&cd, &ctx), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(ctx == NULL);
    cd.log_level = ATTN_LOG_LEVEL_NONE;
    cd.num_threads = -1;
    ctx = (attn_context *)&cd;
    VAL_FAILS_NOCTX(attn_context_create(&cd, &ctx), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(ctx == NULL);
    cd.num_threads = 1025;
    VAL_FAILS_NOCTX(attn_context_create(&cd, &ctx), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(ctx == NULL);
    /* The edges that are allowed. */
    cd.num_threads = 1;
    EXPECT_OK(attn_context_create(&cd, &ctx));
    EXPECT_TRUE(ctx != NULL);
    attn_context_destroy(ctx);
    attn_context_destroy(NULL); /* harmless */
}

ATTN_TEST(val_context_set_log_level) {
    attn_test_log cap;
    attn_context *ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    attn_layer_desc d = vf_desc();
    attn_layer *layer = NULL;
    if (!ctx) return;
    VAL_FAILS_NOCTX(attn_context_set_log_level(NULL, ATTN_LOG_LEVEL_INFO), ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_OK(attn_context_set_log_level(ctx, ATTN_LOG_LEVEL_ERROR));
    memset(&cap, 0, sizeof cap);
    VAL_FAILS(&cap, ctx, attn_context_set_log_level(ctx, (attn_log_level)6), ATTN_ERROR_INVALID_VALUE,
              ATTN_LOG_INVALID_ARGUMENT);
    VAL_FAILS(&cap, ctx, attn_context_set_log_level(ctx, (attn_log_level)-1), ATTN_ERROR_INVALID_VALUE,
              ATTN_LOG_INVALID_ARGUMENT);
    /* The threshold is still ERROR: a resolution logs nothing. */
    memset(&cap, 0, sizeof cap);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_EQ_INT(cap.total, 0);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

ATTN_TEST(val_platform_get) {
    attn_test_log cap;
    attn_context *ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    attn_platform p, ref;
    memset(&p, 0x7f, sizeof p);
    memcpy(&ref, &p, sizeof p);
    VAL_FAILS_NOCTX(attn_platform_get(NULL, &p), ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_TRUE(memcmp(&p, &ref, sizeof p) == 0);
    if (ctx) {
        memset(&cap, 0, sizeof cap);
        VAL_FAILS(&cap, ctx, attn_platform_get(ctx, NULL), ATTN_ERROR_NULL_ARGUMENT,
                  ATTN_LOG_ARG_NULL);
    }
    EXPECT_EQ_INT(attn_platform_format(NULL, NULL, 0), 0);
    attn_context_destroy(ctx);
}

ATTN_TEST(val_backend_from_name) {
    attn_backend_id id = (attn_backend_id)55;
    VAL_FAILS_NOCTX(attn_backend_from_name(NULL, &id), ATTN_ERROR_NULL_ARGUMENT);
    VAL_FAILS_NOCTX(attn_backend_from_name("cpu", NULL), ATTN_ERROR_NULL_ARGUMENT);
    VAL_FAILS_NOCTX(attn_backend_from_name("nope", &id), ATTN_ERROR_UNKNOWN_BACKEND);
    EXPECT_EQ_INT(id, 55);
}

static int val_kv_shape(const attn_backend *self, const attn_layer_desc *d, int64_t nb, int64_t shape[ATTN_MAX_DIMS]) {
    (void)self;
    shape[0] = nb;
    shape[1] = 2;
    shape[2] = d->block_size;
    shape[3] = d->num_kv_heads;
    shape[4] = d->head_size;
    return 5;
}
static attn_status val_forward_nop(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                   const attn_tensor *q, const attn_tensor *k,
                                   const attn_tensor *v, attn_tensor *kv_cache,
                                   attn_tensor *out, attn_tensor *lse, void *stream) {
    (void)self; (void)layer; (void)meta; (void)q; (void)k; (void)v; (void)kv_cache; (void)out;
    (void)lse; (void)stream;
    return ATTN_OK;
}

static attn_backend val_plug;

static attn_backend *val_plug_make(void) {
    memset(&val_plug, 0, sizeof val_plug);
    val_plug.name = "VALPLUG";
    val_plug.id = ATTN_BACKEND_CUSTOM;
    val_plug.dtypes = ATTN_DTYPE_BIT(ATTN_DTYPE_F32);
    val_plug.kv_cache_dtypes = ATTN_DTYPE_BIT(ATTN_DTYPE_F32);
    val_plug.head_size_min = 8;
    val_plug.head_size_max = 256;
    val_plug.head_size_multiple = 8;
    val_plug.block_size_multiple = 16;
    val_plug.can_return_lse = 0;
    val_plug.kv_cache_shape = val_kv_shape;
    val_plug.forward = val_forward_nop;
    val_plug.reshape_and_cache = attn_backend_get(ATTN_BACKEND_CPU)->reshape_and_cache;
    return &val_plug;
}

ATTN_TEST(val_register_backend) {
    const attn_backend *cpu = attn_backend_get(ATTN_BACKEND_CPU);
    attn_backend *b = val_plug_make();
    VAL_FAILS_NOCTX(attn_register_backend(ATTN_BACKEND_AUTO, b), ATTN_ERROR_INVALID_VALUE);
    VAL_FAILS_NOCTX(attn_register_backend(ATTN_BACKEND_COUNT, NULL), ATTN_ERROR_INVALID_VALUE);
    VAL_FAILS_NOCTX(attn_register_backend((attn_backend_id)-3, NULL), ATTN_ERROR_INVALID_VALUE);
    VAL_FAILS_NOCTX(attn_register_backend(ATTN_BACKEND_CPU, b), ATTN_ERROR_INVALID_VALUE);
    b->block_size_multiple = 24;
    VAL_FAILS_NOCTX(attn_register_backend(ATTN_BACKEND_CUSTOM, b), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CPU) == cpu);
    EXPECT_TRUE(attn_backend_get(ATTN_BACKEND_CUSTOM) == NULL);
    attn_register_backend(ATTN_BACKEND_CUSTOM, NULL);
}

ATTN_TEST(val_select_backend) {
    attn_test_log cap;
    attn_context *ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    attn_layer_desc d = vf_desc();
    attn_select_request req;
    attn_selection s, ref;
    if (!ctx) return;
    memset(&s, 0x7f, sizeof s);
    memcpy(&ref, &s, sizeof s);
    VAL_FAILS_NOCTX(attn_select_backend(NULL, &d, NULL, &s), ATTN_ERROR_NULL_ARGUMENT);
    VAL_FAILS(&cap, ctx, attn_select_backend(ctx, NULL, NULL, &s), ATTN_ERROR_NULL_ARGUMENT,
              ATTN_LOG_ARG_NULL);
    VAL_FAILS(&cap, ctx, attn_select_backend(ctx, &d, NULL, NULL), ATTN_ERROR_NULL_ARGUMENT,
              ATTN_LOG_ARG_NULL);
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_COUNT;
    VAL_FAILS(&cap, ctx, attn_select_backend(ctx, &d, &req, &s), ATTN_ERROR_INVALID_VALUE,
              ATTN_LOG_INVALID_DESC);
    req.backend = (attn_backend_id)-1;
    VAL_FAILS(&cap, ctx, attn_select_backend(ctx, &d, &req, &s), ATTN_ERROR_INVALID_VALUE,
              ATTN_LOG_INVALID_DESC);
    d.num_heads = 0;
    VAL_FAILS(&cap, ctx, attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_INVALID_VALUE,
              ATTN_LOG_INVALID_DESC);
    /* Argument errors come before resolution: no record was written, nothing resolved. */
    EXPECT_TRUE(memcmp(&s, &ref, sizeof s) == 0);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    attn_context_destroy(ctx);
}

ATTN_TEST(val_selection_cache_clear) {
    VAL_FAILS_NOCTX(attn_selection_cache_clear(NULL), ATTN_ERROR_NULL_ARGUMENT);
}

/* ---- layer descriptor ------------------------------------------------------------------- */

/* attn_layer_create(d) must fail with want, log INVALID_ARGUMENT (or the selector item for
   UNSUPPORTED), set *out to NULL and resolve nothing. */
static void val_layer_fails(const attn_layer_desc *d, attn_status want, int line) {
    attn_test_log cap;
    attn_context *ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    attn_layer *layer = (attn_layer *)&cap;
    attn_status st;
    if (!ctx) return;
    memset(&cap, 0, sizeof cap);
    st = attn_layer_create(ctx, d, NULL, &layer);
    if (st != want)
        attn_test_fail(__FILE__, line, "attn_layer_create: got %s, expected %s",
                       attn_status_string(st), attn_status_string(want));
    if (layer != NULL) attn_test_fail(__FILE__, line, "*out is not NULL after a failure");
    if (cap.by_level[ATTN_LOG_LEVEL_ERROR] != 1)
        attn_test_fail(__FILE__, line, "expected one ERROR line, got %d",
                       cap.by_level[ATTN_LOG_LEVEL_ERROR]);
    if (want == ATTN_ERROR_INVALID_VALUE && cap.last_item != ATTN_LOG_INVALID_DESC)
        attn_test_fail(__FILE__, line, "expected ATTN_LOG_INVALID_DESC, got %s",
                       attn_log_item_name(cap.last_item));
    if (cap.by_item[ATTN_LOG_SELECT_RESOLVED] != 0)
        attn_test_fail(__FILE__, line, "a backend was resolved for a bad descriptor");
    if (!attn_context_last_error(ctx)[0]) attn_test_fail(__FILE__, line, "empty last error");
    if (st == ATTN_OK && layer != (attn_layer *)&cap) attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}
#define VAL_LAYER_FAILS(d, want) val_layer_fails(&(d), want, __LINE__)

ATTN_TEST(val_layer_create_null_arguments) {
    attn_test_log cap;
    attn_context *ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    attn_layer_desc d = vf_desc();
    attn_layer *layer = (attn_layer *)&cap;
    attn_select_request req;
    if (!ctx) return;
    VAL_FAILS_NOCTX(attn_layer_create(NULL, &d, NULL, &layer), ATTN_ERROR_NULL_ARGUMENT);
    VAL_FAILS(&cap, ctx, attn_layer_create(ctx, NULL, NULL, &layer), ATTN_ERROR_NULL_ARGUMENT,
              ATTN_LOG_ARG_NULL);
    EXPECT_TRUE(layer == NULL || layer == (attn_layer *)&cap); /* no layer, no garbage */
    VAL_FAILS(&cap, ctx, attn_layer_create(ctx, &d, NULL, NULL), ATTN_ERROR_NULL_ARGUMENT,
              ATTN_LOG_ARG_NULL);
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_COUNT; /* past the last id */
    layer = (attn_layer *)&cap;
    VAL_FAILS(&cap, ctx, attn_layer_create(ctx, &d, &req, &layer), ATTN_ERROR_INVALID_VALUE,
              ATTN_LOG_INVALID_DESC);
    EXPECT_TRUE(layer == NULL);
    EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 0);
    attn_context_destroy(ctx);
}

ATTN_TEST(val_layer_num_heads) {
    attn_layer_desc d = vf_desc();
    d.num_heads = 0;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.num_heads = -4;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
}

ATTN_TEST(val_layer_num_kv_heads) {
    attn_layer_desc d = vf_desc();
    d.num_kv_heads = 3; /* 4 % 3 */
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.num_kv_heads = 8; /* more KV heads than query heads */
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.num_kv_heads = -2;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
}

ATTN_TEST(val_layer_head_size) {
    attn_layer_desc d = vf_desc();
    d.head_size = 0;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.head_size = -64;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.head_size = 600; /* valid value, no backend for it */
    VAL_LAYER_FAILS(d, ATTN_ERROR_UNSUPPORTED);
}

ATTN_TEST(val_layer_block_size) {
    attn_layer_desc d = vf_desc();
    d.block_size = 8;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.block_size = 24;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.block_size = 1;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.block_size = -16;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
}

ATTN_TEST(val_layer_scale) {
    attn_layer_desc d = vf_desc();
    d.scale = -0.5f;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.scale = NAN;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.scale = INFINITY;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
}

ATTN_TEST(val_layer_logits_soft_cap) {
    attn_layer_desc d = vf_desc();
    d.logits_soft_cap = -30.0f;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.logits_soft_cap = NAN;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.logits_soft_cap = INFINITY;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
}

ATTN_TEST(val_layer_dtype_enums) {
    attn_layer_desc d = vf_desc();
    d.dtype = ATTN_DTYPE_COUNT;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.dtype = (attn_dtype)-1;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.dtype = (attn_dtype)99;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d = vf_desc();
    d.kv_cache_dtype = (attn_dtype)99;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.kv_cache_dtype = (attn_dtype)-2;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
}

ATTN_TEST(val_layer_causal_enum) {
    attn_layer_desc d = vf_desc();
    d.causal = (attn_causal)3;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.causal = (attn_causal)-1;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
}

ATTN_TEST(val_layer_other_fields) {
    float slopes[VF_H] = {0.5f, 0.25f, NAN, 0.0625f};
    attn_layer_desc d = vf_desc();
    d.sliding_window = -1;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d = vf_desc();
    d.use_mla = 2;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d.use_mla = -1;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    d = vf_desc();
    d.alibi_slopes = slopes;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
    slopes[2] = INFINITY;
    VAL_LAYER_FAILS(d, ATTN_ERROR_INVALID_VALUE);
}

ATTN_TEST(val_layer_kv_cache_shape) {
    int64_t shape[ATTN_MAX_DIMS], ref[ATTN_MAX_DIMS];
    int ndim = 77;
    vf_setup(&F, 0);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    memset(shape, 0x7f, sizeof shape);
    memcpy(ref, shape, sizeof shape);
    VAL_FAILS_NOCTX(attn_layer_kv_cache_shape(NULL, 4, shape, &ndim), ATTN_ERROR_NULL_ARGUMENT);
    VAL_FAILS(&F.cap, F.ctx, attn_layer_kv_cache_shape(F.layer, 4, NULL, &ndim),
              ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    VAL_FAILS(&F.cap, F.ctx, attn_layer_kv_cache_shape(F.layer, 4, shape, NULL),
              ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    VAL_FAILS(&F.cap, F.ctx, attn_layer_kv_cache_shape(F.layer, 0, shape, &ndim),
              ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT);
    VAL_FAILS(&F.cap, F.ctx, attn_layer_kv_cache_shape(F.layer, -3, shape, &ndim),
              ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT);
    EXPECT_TRUE(memcmp(shape, ref, sizeof shape) == 0);
    EXPECT_EQ_INT(ndim, 77);
    EXPECT_OK(attn_layer_kv_cache_shape(F.layer, VF_NB, shape, &ndim));
    EXPECT_EQ_INT(ndim, 5);
    EXPECT_EQ_INT(shape[0], VF_NB);
    EXPECT_EQ_INT(shape[1], 2);
    EXPECT_EQ_INT(shape[2], VF_BS);
    EXPECT_EQ_INT(shape[3], VF_HKV);
    EXPECT_EQ_INT(shape[4], VF_D);
    vf_teardown(&F);
}

/* ---- metadata create ----------------------------------------------------------------------- */

ATTN_TEST(val_metadata_create) {
    attn_metadata_desc md;
    attn_metadata *meta;
    vf_setup(&F, 0);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    md = F.mdesc;
    meta = (attn_metadata *)&md;
    VAL_FAILS_NOCTX(attn_metadata_create(NULL, &md, &meta), ATTN_ERROR_NULL_ARGUMENT);
    VAL_FAILS(&F.cap, F.ctx, attn_metadata_create(F.layer, NULL, &meta), ATTN_ERROR_NULL_ARGUMENT,
              ATTN_LOG_ARG_NULL);
    VAL_FAILS(&F.cap, F.ctx, attn_metadata_create(F.layer, &md, NULL), ATTN_ERROR_NULL_ARGUMENT,
              ATTN_LOG_ARG_NULL);
#define VAL_CAP_FAILS(field, value)                                                          \
    do {                                                                                     \
        md = F.mdesc;                                                                        \
        md.field = value;                                                                    \
        meta = (attn_metadata *)&md;                                                         \
        VAL_FAILS(&F.cap, F.ctx, attn_metadata_create(F.layer, &md, &meta),                  \
                  ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC);                          \
        EXPECT_TRUE(meta == NULL);                                                           \
    } while (0)
    VAL_CAP_FAILS(max_num_reqs, 0);
    VAL_CAP_FAILS(max_num_reqs, -1);
    VAL_CAP_FAILS(max_num_tokens, 0);
    VAL_CAP_FAILS(max_num_tokens, -8);
    VAL_CAP_FAILS(max_blocks_per_req, 0);
    VAL_CAP_FAILS(max_blocks_per_req, -1);
    VAL_CAP_FAILS(num_blocks, 0);
    VAL_CAP_FAILS(num_blocks, -16);
    VAL_CAP_FAILS(num_blocks, ((int64_t)1 << 40) + 1);
#undef VAL_CAP_FAILS
    vf_teardown(&F);
}

/* ---- metadata build: one test per rule ------------------------------------------------------- */

ATTN_TEST(val_build_null_arguments) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    VAL_FAILS_NOCTX(attn_metadata_build(NULL, 0, &F.batch, 0), ATTN_ERROR_NULL_ARGUMENT);
    VAL_FAILS(&F.cap, F.ctx, attn_metadata_build(F.meta, 0, NULL, 0), ATTN_ERROR_NULL_ARGUMENT,
              ATTN_LOG_ARG_NULL);
    F.batch.query_start_loc = NULL;
    VF_BUILD_FAILS(0, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_INVALID_METADATA);
    vf_batch_reset(&F);
    F.batch.seq_lens = NULL;
    VF_BUILD_FAILS(0, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_INVALID_METADATA);
    vf_batch_reset(&F);
    F.batch.block_table = NULL;
    VF_BUILD_FAILS(0, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_query_start_loc_not_monotonic) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.qsl[1] = 5; F.qsl[2] = 4; /* request 1 would have length -1 */
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_query_start_loc_first_not_zero) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.qsl[0] = 1;
    F.batch.max_query_len = 4;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_query_start_loc_past_tokens) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.qsl[1] = 7; /* beyond num_actual_tokens 6 */
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_query_len_exceeds_seq_len) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.seq_lens[0] = 4; /* 5 new tokens in a sequence of 4 */
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_negative_seq_len) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.qsl[1] = 5; F.qsl[2] = 5;
    F.batch.num_actual_tokens = 5;
    F.seq_lens[1] = -1;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_seq_len_beyond_block_table_row) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.seq_lens[1] = 70; /* needs 5 blocks, the row holds 4 */
    F.batch.max_seq_len = 70;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    /* A narrower row: stride 1 cannot hold the 2 blocks of request 1. */
    vf_batch_reset(&F);
    F.block_table[0] = 3;
    F.block_table[1] = 5;
    F.batch.block_table_stride = 1;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    /* A huge seq_len is caught the same way, up to INT32_MAX (the block count must not
       overflow). */
    vf_batch_reset(&F);
    F.seq_lens[1] = INT32_MAX - 64;
    F.batch.max_seq_len = F.seq_lens[1];
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_batch_reset(&F);
    F.seq_lens[1] = INT32_MAX;
    F.batch.max_seq_len = F.seq_lens[1];
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_block_id_out_of_range) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.block_table[1 * VF_MAXBLK + 1] = VF_NB; /* == num_blocks */
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.block_table[1 * VF_MAXBLK + 1] = -1;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.block_table[1 * VF_MAXBLK + 1] = INT32_MIN;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    /* Entries past what a row needs are not looked at. */
    vf_batch_reset(&F);
    F.block_table[0 * VF_MAXBLK + 3] = -7;
    EXPECT_OK(attn_metadata_build(F.meta, 0, &F.batch, 0));
    vf_teardown(&F);
}

ATTN_TEST(val_build_slot_mapping_range) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.slots[5] = (int64_t)VF_NB * VF_BS; /* one past the last slot */
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.slots[5] = -2;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.slots[5] = INT64_MIN;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    /* -1 is padding; the last slot is fine; no slot_mapping at all is fine. */
    F.slots[5] = -1;
    EXPECT_OK(attn_metadata_build(F.meta, 0, &F.batch, 0));
    F.slots[5] = (int64_t)VF_NB * VF_BS - 1;
    EXPECT_OK(attn_metadata_build(F.meta, 0, &F.batch, 0));
    F.batch.slot_mapping = NULL;
    EXPECT_OK(attn_metadata_build(F.meta, 0, &F.batch, 0));
    vf_teardown(&F);
}

ATTN_TEST(val_build_num_actual_tokens_disagrees) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.batch.num_actual_tokens = 7; /* query_start_loc[2] is 6 */
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.batch.num_actual_tokens = -1;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_max_query_len_disagrees) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.batch.max_query_len = 4;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.batch.max_query_len = 6;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_max_seq_len_disagrees) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.batch.max_seq_len = 21;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.batch.max_seq_len = 19;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_capacity) {
    int i;
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    /* 5 one-token decodes > max_num_reqs 4 (the arrays are valid for 5). */
    for (i = 0; i <= 5; i++) F.qsl[i] = i;
    for (i = 0; i < 5; i++) { F.seq_lens[i] = 1; F.block_table[i * VF_MAXBLK] = i; F.slots[i] = i * VF_BS; }
    F.batch.num_reqs = 5;
    F.batch.num_actual_tokens = 5;
    F.batch.max_query_len = 1;
    F.batch.max_seq_len = 1;
    VF_BUILD_FAILS(0, ATTN_ERROR_CAPACITY, ATTN_LOG_CAPACITY_EXCEEDED);
    /* More tokens than max_num_tokens (8). */
    vf_batch_reset(&F);
    F.qsl[1] = 9; F.qsl[2] = 10;
    F.seq_lens[0] = 9;
    F.batch.num_actual_tokens = 10;
    F.batch.max_query_len = 9;
    VF_BUILD_FAILS(0, ATTN_ERROR_CAPACITY, ATTN_LOG_CAPACITY_EXCEEDED);
    /* Exactly at capacity is fine. */
    for (i = 0; i <= 4; i++) F.qsl[i] = i * 2;
    for (i = 0; i < 4; i++) { F.seq_lens[i] = 2; F.block_table[i * VF_MAXBLK] = i; }
    for (i = 0; i < 8; i++) F.slots[i] = (i / 2) * VF_BS + i % 2;
    F.batch.num_reqs = 4;
    F.batch.num_actual_tokens = 8;
    F.batch.max_query_len = 2;
    F.batch.max_seq_len = 2;
    EXPECT_OK(attn_metadata_build(F.meta, 0, &F.batch, 0));
    vf_teardown(&F);
}

ATTN_TEST(val_build_num_reqs_negative) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.batch.num_reqs = -1;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_block_table_stride) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.batch.block_table_stride = VF_MAXBLK + 1; /* beyond max_blocks_per_req */
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.batch.block_table_stride = 0;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.batch.block_table_stride = -4;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

/* common_prefix_len (cascade attention): whole blocks, before every request's queries, the
   same blocks in every request; anything else is refused by name, the metadata kept. */
ATTN_TEST(val_build_common_prefix_len) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    VF_BUILD_FAILS(-1, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    VF_BUILD_FAILS(21, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA); /* > max_seq_len 20 */
    VF_BUILD_FAILS(5, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);  /* not whole blocks */
    EXPECT_TRUE(strstr(attn_context_last_error(F.ctx), "multiple of block_size 16") != NULL);
    VF_BUILD_FAILS(16, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA); /* request 0: no context */
    EXPECT_TRUE(strstr(attn_context_last_error(F.ctx), "request 0 has 0 tokens of context") != NULL);
    /* two decodes of 20 and 18 tokens whose first block is the same: 16 shared tokens */
    F.qsl[1] = 1; F.qsl[2] = 2;
    F.seq_lens[0] = 20; F.seq_lens[1] = 18;
    F.block_table[0 * VF_MAXBLK + 0] = 5; F.block_table[0 * VF_MAXBLK + 1] = 6;
    F.block_table[1 * VF_MAXBLK + 0] = 5; F.block_table[1 * VF_MAXBLK + 1] = 7;
    F.slots[0] = 6 * VF_BS + 3; F.slots[1] = 7 * VF_BS + 1;
    F.batch.num_actual_tokens = 2; F.batch.max_query_len = 1; F.batch.max_seq_len = 20;
    EXPECT_OK(attn_metadata_build(F.meta, 16, &F.batch, 0));
    EXPECT_OK(attn_metadata_build(F.meta, 0, &F.batch, 0));
    F.block_table[1 * VF_MAXBLK + 0] = 4; /* not shared after all */
    VF_BUILD_FAILS(16, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    EXPECT_TRUE(strstr(attn_context_last_error(F.ctx), "request 1's block_table[0] is 4, request 0's 5") != NULL);
    vf_teardown(&F);
}

ATTN_TEST(val_build_causal_enum) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.batch.causal = (attn_causal)3;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    F.batch.causal = (attn_causal)-1;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    vf_teardown(&F);
}

ATTN_TEST(val_build_failure_keeps_previous_contents) {
    float first[VF_ROWS * VF_H * VF_D], lse_first[VF_ROWS * VF_H];
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    EXPECT_OK(attn_layer_forward(F.layer, F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, NULL));
    memcpy(first, F.out, sizeof first);
    memcpy(lse_first, F.lse, sizeof lse_first);
    /* A different batch that passes every check but the last one. */
    F.seq_lens[1] = 18;
    F.batch.max_seq_len = 18;
    F.slots[5] = 6 * VF_BS + 1;
    F.block_table[1 * VF_MAXBLK + 0] = 2;
    VF_BUILD_FAILS(19, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    /* And a different batch that fails early. */
    vf_batch_reset(&F);
    F.batch.num_reqs = 1;
    F.batch.num_actual_tokens = 5;
    F.batch.max_seq_len = 5;
    F.block_table[0] = VF_NB;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    memset(F.out, 0, sizeof F.out);
    memset(F.lse, 0, sizeof F.lse);
    EXPECT_OK(attn_layer_forward(F.layer, F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, NULL));
    EXPECT_TRUE(memcmp(first, F.out, sizeof first) == 0);
    EXPECT_TRUE(memcmp(lse_first, F.lse, sizeof lse_first) == 0);
    vf_teardown(&F);
}

/* ---- reshape_and_cache --------------------------------------------------------------------- */

ATTN_TEST(val_cache_null_arguments) {
    vf_setup(&F, 0);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    vf_poison(&F);
    VAL_FAILS_NOCTX(attn_reshape_and_cache(NULL, &F.tk, &F.tv, &F.tkv, ATTN_TEST_SLOTS(F.slots, VF_NT), NULL), ATTN_ERROR_NULL_ARGUMENT);
    VF_CACHE_FAILS(NULL, &F.tv, &F.tkv, F.slots, VF_NT, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    VF_CACHE_FAILS(&F.tk, NULL, &F.tkv, F.slots, VF_NT, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    VF_CACHE_FAILS(&F.tk, &F.tv, NULL, F.slots, VF_NT, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    VF_CACHE_FAILS(&F.tk, &F.tv, &F.tkv, NULL, VF_NT, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    {
        attn_tensor k = F.tk;
        k.data = NULL;
        VF_CACHE_FAILS(&k, &F.tv, &F.tkv, F.slots, VF_NT, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    }
    {
        attn_tensor kv = F.tkv;
        kv.data = NULL;
        VF_CACHE_FAILS(&F.tk, &F.tv, &kv, F.slots, VF_NT, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    }
    vf_teardown(&F);
}

ATTN_TEST(val_cache_bad_counts_and_slots) {
    int64_t slots[32]; /* room for every count tried */
    vf_setup(&F, 0);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    memcpy(slots, F.slots, sizeof slots);
    /* a slot tensor of negative length (the count is its shape now) */
    VF_CACHE_FAILS(&F.tk, &F.tv, &F.tkv, slots, -1, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    VF_CACHE_FAILS(&F.tk, &F.tv, &F.tkv, slots, VF_ROWS + 1, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE); /* more rows than key has */
    /* One bad slot at the end: nothing before it may have been written. */
    slots[VF_NT - 1] = (int64_t)VF_NB * VF_BS;
    VF_CACHE_FAILS(&F.tk, &F.tv, &F.tkv, slots, VF_NT, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_SLOT);
    slots[VF_NT - 1] = -2;
    VF_CACHE_FAILS(&F.tk, &F.tv, &F.tkv, slots, VF_NT, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_SLOT);
    /* -1 skips a token; the others land where the slots say. */
    memcpy(slots, F.slots, sizeof slots);
    slots[2] = -1;
    vf_poison(&F);
    EXPECT_OK(attn_reshape_and_cache(F.layer, &F.tk, &F.tv, &F.tkv, ATTN_TEST_SLOTS(slots, VF_NT), NULL));
    {
        /* token 0 -> slot 48 = block 3, offset 0; K at [3][0][0][h], V at [3][1][0][h] */
        size_t kdst = (size_t)(((3 * 2 + 0) * VF_BS + 0) * VF_HKV) * VF_D;
        size_t vdst = (size_t)(((3 * 2 + 1) * VF_BS + 0) * VF_HKV) * VF_D;
        size_t skip = (size_t)(((3 * 2 + 0) * VF_BS + 2) * VF_HKV) * VF_D; /* token 2's slot */
        EXPECT_TRUE(memcmp(F.kv + kdst, F.k, VF_HKV * VF_D * sizeof(float)) == 0);
        EXPECT_TRUE(memcmp(F.kv + vdst, F.v, VF_HKV * VF_D * sizeof(float)) == 0);
        EXPECT_TRUE(memcmp(F.kv + skip, F.kv_ref + skip, VF_HKV * VF_D * sizeof(float)) == 0);
    }
    /* Fewer tokens than key rows: only those are written. */
    vf_poison(&F);
    EXPECT_OK(attn_reshape_and_cache(F.layer, &F.tk, &F.tv, &F.tkv, ATTN_TEST_SLOTS(F.slots, 1), NULL));
    EXPECT_TRUE(memcmp(F.kv + VF_KV_FLOATS / 2, F.kv_ref + VF_KV_FLOATS / 2,
                       VF_KV_FLOATS / 2 * sizeof(float)) == 0); /* blocks 4..7 untouched */
    vf_teardown(&F);
}

ATTN_TEST(val_cache_zero_tokens_with_padded_inputs) {
    /* key/value may hold more rows than num_tokens (1 or 5 are accepted); 0 tokens must be
       accepted the same way and write nothing. */
    vf_setup(&F, 0);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    vf_poison(&F);
    EXPECT_OK(attn_reshape_and_cache(F.layer, &F.tk, &F.tv, &F.tkv, ATTN_TEST_SLOTS(F.slots, 0), NULL));
    EXPECT_TRUE(vf_untouched(&F));
    vf_teardown(&F);
}

ATTN_TEST(val_cache_mismatched_tensors) {
    vf_setup(&F, 0);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    {
        attn_tensor k = F.tk;
        k.dtype = ATTN_DTYPE_F16;
        VF_CACHE_FAILS(&k, &F.tv, &F.tkv, F.slots, VF_NT, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE);
    }
    {
        attn_tensor v = F.tv;
        v.dtype = ATTN_DTYPE_BF16;
        VF_CACHE_FAILS(&F.tk, &v, &F.tkv, F.slots, VF_NT, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE);
    }
    {
        attn_tensor k = F.tk;
        k.shape[1] = VF_H; /* query heads instead of KV heads */
        VF_CACHE_FAILS(&k, &F.tv, &F.tkv, F.slots, VF_NT, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor v = F.tv;
        v.shape[2] = VF_D / 2;
        VF_CACHE_FAILS(&F.tk, &v, &F.tkv, F.slots, VF_NT, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor k = F.tk;
        k.ndim = 2;
        VF_CACHE_FAILS(&k, &F.tv, &F.tkv, F.slots, VF_NT, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor k = F.tk;
        k.strides[0] = VF_HKV * VF_D * 2; k.strides[1] = VF_D * 2; k.strides[2] = 2;
        VF_CACHE_FAILS(&k, &F.tv, &F.tkv, F.slots, VF_NT / 2, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT);
    }
    {
        attn_tensor k = F.tk;
        k.device.kind = ATTN_DEVICE_CUDA;
        VF_CACHE_FAILS(&k, &F.tv, &F.tkv, F.slots, VF_NT, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DEVICE);
    }
    {
        attn_tensor kv = F.tkv;
        kv.shape[0] = VF_NB / 2; kv.shape[2] = VF_BS * 2; /* same bytes, block size 32 */
        VF_CACHE_FAILS(&F.tk, &F.tv, &kv, F.slots, VF_NT, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor kv = F.tkv;
        kv.dtype = ATTN_DTYPE_F16;
        VF_CACHE_FAILS(&F.tk, &F.tv, &kv, F.slots, VF_NT, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE);
    }
    {
        attn_tensor kv = F.tkv;
        kv.shape[3] = 1; kv.shape[4] = VF_D * 2; /* same bytes, other layout */
        VF_CACHE_FAILS(&F.tk, &F.tv, &kv, F.slots, VF_NT, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor kv = F.tkv; /* non-contiguous: every other block */
        int64_t sc[5] = {VF_NB / 2, 2, VF_BS, VF_HKV, VF_D};
        int i;
        kv.shape[0] = VF_NB / 2;
        kv.strides[4] = 1;
        for (i = 3; i >= 0; i--) kv.strides[i] = kv.strides[i + 1] * sc[i + 1];
        kv.strides[0] *= 2;
        VF_CACHE_FAILS(&F.tk, &F.tv, &kv, F.slots, 2, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT);
    }
    vf_teardown(&F);
}

/* ---- forward -------------------------------------------------------------------------------- */

ATTN_TEST(val_forward_null_arguments) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    vf_poison(&F);
    VAL_FAILS_NOCTX(attn_layer_forward(NULL, F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, NULL, NULL),
                    ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_TRUE(vf_untouched(&F));
    VF_FWD_FAILS(NULL, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, NULL, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    VF_FWD_FAILS(F.meta, NULL, &F.tk, &F.tv, &F.tkv, &F.tout, NULL, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, NULL, &F.tout, NULL, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, NULL, NULL, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    /* k without v, v without k */
    VF_FWD_FAILS(F.meta, &F.tq, &F.tk, NULL, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    VF_FWD_FAILS(F.meta, &F.tq, NULL, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    {
        attn_tensor q = F.tq, out = F.tout;
        q.data = NULL;
        VF_FWD_FAILS(F.meta, &q, &F.tk, &F.tv, &F.tkv, &F.tout, NULL, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
        out.data = NULL;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &out, NULL, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    }
    vf_teardown(&F);
}

ATTN_TEST(val_forward_metadata_not_built) {
    vf_setup(&F, 0);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_METADATA_MISMATCH);
    /* A failed first build leaves it unbuilt. */
    F.batch.max_seq_len = 3;
    VF_BUILD_FAILS(0, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_METADATA_MISMATCH);
    vf_teardown(&F);
}

/* Metadata created for another layer shape must be refused. */
static void val_meta_of_other_layer(attn_layer_desc other, int line) {
    attn_layer *l2 = NULL;
    attn_metadata *m2 = NULL;
    attn_metadata_desc md = F.mdesc;
    EXPECT_OK(attn_layer_create(F.ctx, &other, NULL, &l2));
    if (l2) EXPECT_OK(attn_metadata_create(l2, &md, &m2));
    if (m2) {
        /* a batch all layers could share: request 1 only uses block 5 and 6 */
        EXPECT_OK(attn_metadata_build(m2, 0, &F.batch, 0));
        vf_forward_fails(&F, m2, &F.tq, NULL, NULL, &F.tkv, &F.tout, NULL,
                         ATTN_ERROR_INVALID_METADATA, ATTN_LOG_METADATA_MISMATCH, line);
    }
    attn_metadata_destroy(m2);
    attn_layer_destroy(l2);
}

ATTN_TEST(val_forward_metadata_of_other_layer) {
    attn_layer_desc d;
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    d = vf_desc();
    d.num_kv_heads = VF_H; /* 4 KV heads instead of 2 */
    val_meta_of_other_layer(d, __LINE__);
    d = vf_desc();
    d.num_heads = 8;
    val_meta_of_other_layer(d, __LINE__);
    d = vf_desc();
    d.head_size = 32;
    val_meta_of_other_layer(d, __LINE__);
    d = vf_desc();
    d.block_size = 32;
    val_meta_of_other_layer(d, __LINE__);
    vf_teardown(&F);
}

ATTN_TEST(val_forward_q_mismatch) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    {
        attn_tensor q = F.tq;
        q.dtype = ATTN_DTYPE_F16;
        VF_FWD_FAILS(F.meta, &q, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE);
    }
    {
        attn_tensor q = F.tq;
        q.shape[1] = VF_HKV; /* wrong head count */
        VF_FWD_FAILS(F.meta, &q, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor q = F.tq;
        q.shape[2] = VF_D / 2;
        VF_FWD_FAILS(F.meta, &q, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor q = F.tq;
        q.shape[0] = VF_NT - 1; /* fewer rows than tokens */
        VF_FWD_FAILS(F.meta, &q, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor q = F.tq;
        q.ndim = 4;
        q.shape[3] = 1;
        VF_FWD_FAILS(F.meta, &q, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor q = F.tq; /* last dimension not contiguous */
        q.strides[0] = VF_H * VF_D; q.strides[1] = VF_D; q.strides[2] = 2;
        VF_FWD_FAILS(F.meta, &q, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT);
    }
    {
        attn_tensor q = F.tq; /* negative row stride */
        q.strides[0] = -(VF_H * VF_D); q.strides[1] = VF_D; q.strides[2] = 1;
        VF_FWD_FAILS(F.meta, &q, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT);
    }
    {
        attn_tensor q = F.tq;
        q.device.kind = ATTN_DEVICE_CUDA;
        VF_FWD_FAILS(F.meta, &q, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DEVICE);
    }
    vf_teardown(&F);
}

ATTN_TEST(val_forward_out_and_lse_mismatch) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    {
        attn_tensor out = F.tout;
        out.shape[0] = VF_NT - 1; /* too small */
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &out, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor out = F.tout;
        out.dtype = ATTN_DTYPE_BF16;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &out, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE);
    }
    {
        attn_tensor out = F.tout;
        out.shape[1] = VF_H * 2;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &out, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor out = F.tout;
        out.strides[0] = VF_H * VF_D; out.strides[1] = 1; out.strides[2] = VF_H; /* heads innermost */
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &out, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT);
    }
    {
        attn_tensor lse = F.tlse;
        lse.dtype = ATTN_DTYPE_F16;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &lse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE);
    }
    {
        attn_tensor lse = F.tlse;
        lse.shape[1] = VF_HKV;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &lse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor lse = F.tlse;
        lse.shape[0] = VF_NT - 1;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &lse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor lse = F.tlse;
        lse.ndim = 3;
        lse.shape[2] = 1;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &lse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor lse = F.tlse;
        lse.data = NULL;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &lse, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL);
    }
    vf_teardown(&F);
}

ATTN_TEST(val_forward_kv_cache_mismatch) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    {
        attn_tensor kv = F.tkv;
        kv.shape[0] = VF_NB / 2; kv.shape[2] = VF_BS * 2; /* block size 32 */
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &kv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor kv = F.tkv;
        kv.shape[0] = VF_NB - 1; /* fewer blocks than the metadata indexes */
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &kv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
        VF_FWD_FAILS(F.meta, &F.tq, NULL, NULL, &kv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor kv = F.tkv;
        kv.dtype = ATTN_DTYPE_F16;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &kv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE);
    }
    {
        attn_tensor kv = F.tkv;
        kv.ndim = 4;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &kv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor kv = F.tkv;
        kv.shape[3] = VF_H; kv.shape[0] = VF_NB / 2; /* query heads instead of KV heads */
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &kv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor kv = F.tkv; /* K and V planes swapped by strides: not the dense layout */
        int64_t plane = (int64_t)VF_BS * VF_HKV * VF_D;
        kv.strides[4] = 1; kv.strides[3] = VF_D; kv.strides[2] = (int64_t)VF_HKV * VF_D;
        kv.strides[1] = -plane; kv.strides[0] = 2 * plane;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &kv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT);
    }
    {
        attn_tensor kv = F.tkv;
        kv.device.kind = ATTN_DEVICE_CUDA;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &kv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DEVICE);
    }
    vf_teardown(&F);
}

ATTN_TEST(val_forward_new_kv_mismatch) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    {
        attn_tensor k = F.tk;
        k.shape[1] = VF_H;
        VF_FWD_FAILS(F.meta, &F.tq, &k, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor v = F.tv;
        v.shape[0] = VF_NT - 1;
        VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &v, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE);
    }
    {
        attn_tensor k = F.tk;
        k.dtype = ATTN_DTYPE_F16;
        VF_FWD_FAILS(F.meta, &F.tq, &k, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE);
    }
    /* k/v given, but the batch has no slot_mapping to place them. */
    F.batch.slot_mapping = NULL;
    EXPECT_OK(attn_metadata_build(F.meta, 0, &F.batch, 0));
    VF_FWD_FAILS(F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA);
    /* Without k/v the same metadata runs. */
    vf_poison(&F);
    EXPECT_OK(attn_layer_forward(F.layer, F.meta, &F.tq, NULL, NULL, &F.tkv, &F.tout, &F.tlse, NULL));
    EXPECT_TRUE(memcmp(F.kv, F.kv_ref, sizeof F.kv) == 0);
    vf_teardown(&F);
}

ATTN_TEST(val_forward_lse_unsupported_by_backend) {
    attn_test_log cap;
    attn_context *ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    attn_layer_desc d = vf_desc();
    attn_metadata_desc md;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    if (!ctx) return;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = VF_MAXREQ;
    md.max_num_tokens = VF_ROWS;
    md.max_blocks_per_req = VF_MAXBLK;
    md.num_blocks = VF_NB;
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, val_plug_make()));
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (layer) {
        EXPECT_TRUE(attn_layer_backend(layer) == &val_plug);
        vf_batch_reset(&F);
        vf_tensors(&F);
        EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    }
    if (meta) {
        int e0;
        EXPECT_OK(attn_metadata_build(meta, 0, &F.batch, 0));
        vf_poison(&F);
        memset(&cap, 0, sizeof cap);
        e0 = cap.by_level[ATTN_LOG_LEVEL_ERROR];
        EXPECT_STATUS(attn_layer_forward(layer, meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, NULL),
                      ATTN_ERROR_UNSUPPORTED);
        EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_ERROR] - e0, 1);
        EXPECT_TRUE(attn_context_last_error(ctx)[0] != 0);
        EXPECT_TRUE(vf_untouched(&F));
        /* Without lse the (do-nothing) plugin is called. */
        EXPECT_OK(attn_layer_forward(layer, meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, NULL, NULL));
    }
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_register_backend(ATTN_BACKEND_CUSTOM, NULL);
    attn_context_destroy(ctx);
}

/* ---- what must work at the edges ---------------------------------------------------------------- */

ATTN_TEST(val_forward_padding_rows_not_written) {
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    /* q/out/lse have 8 rows, the batch 6 tokens: rows 6 and 7 keep their poison. */
    vf_poison(&F);
    EXPECT_OK(attn_layer_forward(F.layer, F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, &F.tlse, NULL));
    EXPECT_TRUE(memcmp(F.out + VF_NT * VF_H * VF_D, F.out_ref + VF_NT * VF_H * VF_D,
                       (VF_ROWS - VF_NT) * VF_H * VF_D * sizeof(float)) == 0);
    EXPECT_TRUE(memcmp(F.lse + VF_NT * VF_H, F.lse_ref + VF_NT * VF_H,
                       (VF_ROWS - VF_NT) * VF_H * sizeof(float)) == 0);
    EXPECT_TRUE(F.out[0] == F.out[0] && F.out[0] != F.out_ref[0]); /* real rows were written */
    vf_teardown(&F);
}

ATTN_TEST(val_forward_empty_batch_with_padding_rows) {
    /* A batch of zero requests over padded buffers (what a captured graph replays when
       nothing is scheduled): accepted, and nothing is written. */
    vf_setup(&F, 0);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    F.batch.num_reqs = 0;
    F.batch.num_actual_tokens = 0;
    F.batch.max_query_len = 0;
    F.batch.max_seq_len = 0;
    EXPECT_OK(attn_metadata_build(F.meta, 0, &F.batch, 0));
    vf_poison(&F);
    EXPECT_OK(attn_layer_forward(F.layer, F.meta, &F.tq, NULL, NULL, &F.tkv, &F.tout, &F.tlse, NULL));
    EXPECT_TRUE(vf_untouched(&F));
    vf_teardown(&F);
}

ATTN_TEST(val_forward_meta_from_layer_with_other_window) {
    /* Metadata built for a sliding-window layer, used by a full-attention layer of the same
       shape: either refused, or the same result as the layer's own metadata. */
    float own[VF_ROWS * VF_H * VF_D];
    attn_layer_desc dw = vf_desc();
    attn_layer *lw = NULL;
    attn_metadata *mw = NULL;
    attn_status st;
    vf_setup(&F, 1);
    if (!vf_ready(&F)) { vf_teardown(&F); return; }
    EXPECT_OK(attn_layer_forward(F.layer, F.meta, &F.tq, &F.tk, &F.tv, &F.tkv, &F.tout, NULL, NULL));
    memcpy(own, F.out, sizeof own);
    dw.sliding_window = 4;
    EXPECT_OK(attn_layer_create(F.ctx, &dw, NULL, &lw));
    if (lw) EXPECT_OK(attn_metadata_create(lw, &F.mdesc, &mw));
    if (mw) {
        EXPECT_OK(attn_metadata_build(mw, 0, &F.batch, 0));
        vf_poison(&F);
        st = attn_layer_forward(F.layer, mw, &F.tq, NULL, NULL, &F.tkv, &F.tout, NULL, NULL);
        if (st == ATTN_OK) {
            if (memcmp(own, F.out, VF_NT * VF_H * VF_D * sizeof(float)) != 0)
                attn_test_fail(__FILE__, __LINE__, "forward accepted metadata built for a "
                               "sliding-window layer and returned a different result");
        } else {
            EXPECT_EQ_INT(st, ATTN_ERROR_INVALID_METADATA);
            EXPECT_TRUE(vf_untouched(&F));
        }
    }
    attn_metadata_destroy(mw);
    attn_layer_destroy(lw);
    vf_teardown(&F);
}

void suite_validation(void) {
    /* Context-less failures go to stderr at the env level; keep the output clean. */
    const char *old = getenv("ATTN_LOG_LEVEL");
    char *saved = NULL;
    if (old) {
        saved = (char *)malloc(strlen(old) + 1);
        if (saved) strcpy(saved, old);
    }
    setenv("ATTN_LOG_LEVEL", "none", 1);

    ATTN_RUN(val_context_create);
    ATTN_RUN(val_context_set_log_level);
    ATTN_RUN(val_platform_get);
    ATTN_RUN(val_backend_from_name);
    ATTN_RUN(val_register_backend);
    ATTN_RUN(val_select_backend);
    ATTN_RUN(val_selection_cache_clear);
    ATTN_RUN(val_layer_create_null_arguments);
    ATTN_RUN(val_layer_num_heads);
    ATTN_RUN(val_layer_num_kv_heads);
    ATTN_RUN(val_layer_head_size);
    ATTN_RUN(val_layer_block_size);
    ATTN_RUN(val_layer_scale);
    ATTN_RUN(val_layer_logits_soft_cap);
    ATTN_RUN(val_layer_dtype_enums);
    ATTN_RUN(val_layer_causal_enum);
    ATTN_RUN(val_layer_other_fields);
    ATTN_RUN(val_layer_kv_cache_shape);
    ATTN_RUN(val_metadata_create);
    ATTN_RUN(val_build_null_arguments);
    ATTN_RUN(val_build_query_start_loc_not_monotonic);
    ATTN_RUN(val_build_query_start_loc_first_not_zero);
    ATTN_RUN(val_build_query_start_loc_past_tokens);
    ATTN_RUN(val_build_query_len_exceeds_seq_len);
    ATTN_RUN(val_build_negative_seq_len);
    ATTN_RUN(val_build_seq_len_beyond_block_table_row);
    ATTN_RUN(val_build_block_id_out_of_range);
    ATTN_RUN(val_build_slot_mapping_range);
    ATTN_RUN(val_build_num_actual_tokens_disagrees);
    ATTN_RUN(val_build_max_query_len_disagrees);
    ATTN_RUN(val_build_max_seq_len_disagrees);
    ATTN_RUN(val_build_capacity);
    ATTN_RUN(val_build_num_reqs_negative);
    ATTN_RUN(val_build_block_table_stride);
    ATTN_RUN(val_build_common_prefix_len);
    ATTN_RUN(val_build_causal_enum);
    ATTN_RUN(val_build_failure_keeps_previous_contents);
    ATTN_RUN(val_cache_null_arguments);
    ATTN_RUN(val_cache_bad_counts_and_slots);
    ATTN_RUN(val_cache_zero_tokens_with_padded_inputs);
    ATTN_RUN(val_cache_mismatched_tensors);
    ATTN_RUN(val_forward_null_arguments);
    ATTN_RUN(val_forward_metadata_not_built);
    ATTN_RUN(val_forward_metadata_of_other_layer);
    ATTN_RUN(val_forward_q_mismatch);
    ATTN_RUN(val_forward_out_and_lse_mismatch);
    ATTN_RUN(val_forward_kv_cache_mismatch);
    ATTN_RUN(val_forward_new_kv_mismatch);
    ATTN_RUN(val_forward_lse_unsupported_by_backend);
    ATTN_RUN(val_forward_padding_rows_not_written);
    ATTN_RUN(val_forward_empty_batch_with_padding_rows);
    ATTN_RUN(val_forward_meta_from_layer_with_other_window);

    if (saved) {
        setenv("ATTN_LOG_LEVEL", saved, 1);
        free(saved);
    } else {
        unsetenv("ATTN_LOG_LEVEL");
    }
}
