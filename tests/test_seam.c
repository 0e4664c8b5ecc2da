/* The seam between the backend-neutral layers and the backends: a plugin that implements
   every hook proves each is called (with self) and when; context- and layer-level init
   failures become skip reasons; the record shows what a backend declares; the loader's
   injection point; and nothing is allocated by build or forward after create. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Counted by the ATTN_MALLOC/ATTN_REALLOC of tests/main.c. */
extern long attn_test_allocations;

static attn_context *sm_ctx(int threads, const attn_loader *loader) {
    attn_context_desc cd;
    attn_context *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = threads;
    cd.log = attn_test_log_hook; /* user_data NULL: lines dropped */
    cd.loader = loader;
    attn_context_create(&cd, &ctx);
    return ctx;
}

/* ---- a plugin that records every call ------------------------------------------------ */

enum {
    H_CONTEXT_INIT, H_CONTEXT_RELEASE, H_LAYER_INIT, H_LAYER_RELEASE, H_CHECK, H_KV_SHAPE,
    H_META_INIT, H_META_RELEASE, H_BUILD, H_FORWARD, H_RESHAPE, H_MQA, H_MHA, H_MLA_FORWARD,
    H_CONCAT, H_MERGE, H_COUNT
};

static struct {
    int calls[H_COUNT];
    int wrong_self;            /* a hook got a self other than the registered vtable */
    int fail_context_init;     /* make context_init fail */
    int fail_layer_init;       /* make layer_init fail */
    int context_state_seen;    /* forward saw the context state through the accessor */
    int layer_state_seen;      /* forward saw the layer state through the accessor */
    int mla_info_decodes;      /* what the builder read from attn_metadata_mla_info */
    int mla_info_prefill_tokens;
} sm_rec;

static attn_backend sm_plug;
static int sm_context_token, sm_layer_token, sm_meta_token;

static void sm_hit(const attn_backend *self, int hook) {
    sm_rec.calls[hook]++;
    if (self != &sm_plug) sm_rec.wrong_self++;
}

static attn_status sm_context_init(const attn_backend *self, attn_context *ctx, void **state,
                                   char *reason, size_t size) {
    (void)ctx;
    sm_hit(self, H_CONTEXT_INIT);
    if (sm_rec.fail_context_init) {
        strncpy(reason, "test library missing", size - 1);
        reason[size - 1] = 0;
        return ATTN_ERROR_PLATFORM;
    }
    *state = &sm_context_token;
    return ATTN_OK;
}
static void sm_context_release(const attn_backend *self, attn_context *ctx, void *state) {
    (void)ctx;
    sm_hit(self, H_CONTEXT_RELEASE);
    if (state != &sm_context_token) sm_rec.wrong_self++;
}
static attn_status sm_layer_init(const attn_backend *self, attn_layer *layer, void **state,
                                 char *reason, size_t size) {
    (void)layer;
    sm_hit(self, H_LAYER_INIT);
    if (sm_rec.fail_layer_init) {
        strncpy(reason, "test kernel does not compile", size - 1);
        reason[size - 1] = 0;
        return ATTN_ERROR_UNSUPPORTED;
    }
    *state = &sm_layer_token;
    return ATTN_OK;
}
static void sm_layer_release(const attn_backend *self, attn_layer *layer, void *state) {
    (void)layer;
    sm_hit(self, H_LAYER_RELEASE);
    if (state != &sm_layer_token) sm_rec.wrong_self++;
}
static int sm_check(const attn_backend *self, const attn_layer_desc *d, const attn_platform *p,
                    char *reason, size_t size) {
    (void)d; (void)p; (void)reason; (void)size;
    sm_hit(self, H_CHECK);
    return 0;
}
static int sm_kv_shape(const attn_backend *self, const attn_layer_desc *d, int64_t nb,
                       int64_t shape[ATTN_MAX_DIMS]) {
    sm_hit(self, H_KV_SHAPE);
    if (d->use_mla) {
        shape[0] = nb; shape[1] = d->block_size; shape[2] = d->head_size;
        return 3;
    }
    shape[0] = nb; shape[1] = 2; shape[2] = d->block_size; shape[3] = d->num_kv_heads;
    shape[4] = d->head_size;
    return 5;
}
static attn_status sm_meta_init(const attn_backend *self, attn_layer *layer, attn_metadata *meta) {
    (void)layer;
    sm_hit(self, H_META_INIT);
    attn_metadata_private_set(meta, &sm_meta_token);
    return ATTN_OK;
}
static void sm_meta_release(const attn_backend *self, attn_metadata *meta) {
    sm_hit(self, H_META_RELEASE);
    if (attn_metadata_private(meta) != &sm_meta_token || !attn_metadata_context(meta)) sm_rec.wrong_self++;
}
static attn_status sm_build(const attn_backend *self, attn_layer *layer, attn_metadata *meta,
                            int cpl, int fast) {
    (void)cpl; (void)fast;
    sm_hit(self, H_BUILD);
    if (attn_layer_get_desc(layer)->use_mla) {
        attn_mla_info info;
        memset(&info, 0, sizeof info);
        if (attn_metadata_mla_info(meta, &info) != ATTN_OK) sm_rec.wrong_self++;
        sm_rec.mla_info_decodes = info.num_decodes;
        sm_rec.mla_info_prefill_tokens = info.num_prefill_tokens;
    }
    return ATTN_OK;
}
static void sm_note_states(attn_layer *layer) {
    if (attn_context_backend_state(attn_layer_context(layer), &sm_plug) == &sm_context_token)
        sm_rec.context_state_seen++;
    if (attn_layer_backend_state(layer) == &sm_layer_token) sm_rec.layer_state_seen++;
}
static attn_status sm_forward(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                              const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              attn_tensor *kv, attn_tensor *out, attn_tensor *lse, void *stream) {
    (void)meta; (void)q; (void)k; (void)v; (void)kv; (void)out; (void)lse; (void)stream;
    sm_hit(self, H_FORWARD);
    sm_note_states(layer);
    return ATTN_OK;
}
static attn_status sm_reshape(const attn_backend *self, attn_layer *layer, const attn_tensor *key,
                              const attn_tensor *value, attn_tensor *kv, const attn_tensor *slots,
                              void *stream) {
    (void)layer; (void)key; (void)value; (void)kv; (void)slots; (void)stream;
    sm_hit(self, H_RESHAPE);
    return ATTN_OK;
}
static attn_status sm_mqa(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                          const attn_tensor *q, const attn_tensor *q_pe, const attn_tensor *kv,
                          attn_tensor *out, attn_tensor *lse, void *stream) {
    (void)meta; (void)q; (void)q_pe; (void)kv; (void)out; (void)lse; (void)stream;
    sm_hit(self, H_MQA);
    sm_note_states(layer);
    return ATTN_OK;
}
static attn_status sm_mha(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                          const attn_tensor *q, const attn_tensor *kv, const attn_tensor *w_uk,
                          const attn_tensor *w_uv, attn_tensor *out, attn_tensor *lse, void *stream) {
    (void)layer; (void)meta; (void)q; (void)kv; (void)w_uk; (void)w_uv; (void)out; (void)lse; (void)stream;
    sm_hit(self, H_MHA);
    return ATTN_OK;
}
static attn_status sm_mla_forward(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                  const attn_tensor *q_nope, const attn_tensor *q_pe,
                                  const attn_tensor *kv_c, const attn_tensor *k_pe, attn_tensor *kv,
                                  const attn_tensor *w_uk, const attn_tensor *w_uv, attn_tensor *out,
                                  void *stream) {
    (void)layer; (void)meta; (void)q_nope; (void)q_pe; (void)kv_c; (void)k_pe; (void)kv;
    (void)w_uk; (void)w_uv; (void)out; (void)stream;
    sm_hit(self, H_MLA_FORWARD);
    return ATTN_OK;
}
static attn_status sm_concat(const attn_backend *self, attn_layer *layer, const attn_tensor *kv_c,
                             const attn_tensor *k_pe, attn_tensor *kv, const attn_tensor *slots,
                             void *stream) {
    (void)layer; (void)kv_c; (void)k_pe; (void)kv; (void)slots; (void)stream;
    sm_hit(self, H_CONCAT);
    return ATTN_OK;
}
static attn_status sm_merge(const attn_backend *self, attn_context *ctx, const attn_tensor *oa,
                            const attn_tensor *la, attn_lse_base ba, const attn_tensor *ob,
                            const attn_tensor *lb, attn_lse_base bb, attn_tensor *o, attn_tensor *l,
                            attn_lse_base bo, void *stream) {
    (void)ctx; (void)oa; (void)la; (void)ba; (void)ob; (void)lb; (void)bb; (void)o; (void)l; (void)bo;
    (void)stream;
    sm_hit(self, H_MERGE);
    return ATTN_OK;
}

static attn_backend *sm_plug_make(int mla) {
    memset(&sm_plug, 0, sizeof sm_plug);
    memset(&sm_rec, 0, sizeof sm_rec);
    sm_plug.name = "SEAMPLUG";
    sm_plug.id = ATTN_BACKEND_CUSTOM;
    sm_plug.device = ATTN_DEVICE_CPU;
    sm_plug.dtypes = ATTN_DTYPE_BIT(ATTN_DTYPE_F32);
    sm_plug.kv_cache_dtypes = ATTN_DTYPE_BIT(ATTN_DTYPE_F32);
    sm_plug.head_size_min = 8;
    sm_plug.head_size_max = 576;
    sm_plug.head_size_multiple = 8;
    sm_plug.block_size_multiple = 16;
    sm_plug.is_mla = mla;
    sm_plug.cuda_graph = ATTN_CUDA_GRAPH_UNIFORM_BATCH;
    sm_plug.can_return_lse = 1;
    sm_plug.lse_base = ATTN_LSE_BASE_2;
    sm_plug.check = sm_check;
    sm_plug.context_init = sm_context_init;
    sm_plug.context_release = sm_context_release;
    sm_plug.layer_init = sm_layer_init;
    sm_plug.layer_release = sm_layer_release;
    sm_plug.kv_cache_shape = sm_kv_shape;
    sm_plug.metadata_init = sm_meta_init;
    sm_plug.metadata_release = sm_meta_release;
    sm_plug.build = sm_build;
    sm_plug.forward = sm_forward;
    sm_plug.reshape_and_cache = sm_reshape;
    sm_plug.forward_mqa = sm_mqa;
    sm_plug.forward_mha = sm_mha;
    sm_plug.mla_forward = sm_mla_forward;
    sm_plug.concat_and_cache_mla = sm_concat;
    sm_plug.merge_attn_states = sm_merge;
    return &sm_plug;
}

static attn_layer_desc sm_desc(int mla) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = ATTN_DTYPE_F32;
    if (mla) {
        d.use_mla = 1;
        d.num_heads = 2;
        d.head_size = 576;
    } else {
        d.num_heads = 4;
        d.num_kv_heads = 2;
        d.head_size = 16;
    }
    return d;
}

/* One decode (request 0, 1 token) and one prefill (request 1, 3 tokens), 2 blocks of 16. */
typedef struct sm_batch {
    int32_t qsl[3], seq[2], bt[4];
    int64_t slots[4];
    attn_batch b;
} sm_batch;

static void sm_batch_make(sm_batch *s) {
    memset(s, 0, sizeof *s);
    s->qsl[0] = 0; s->qsl[1] = 1; s->qsl[2] = 4;
    s->seq[0] = 5; s->seq[1] = 3;
    s->bt[0] = 0; s->bt[1] = 1; s->bt[2] = 2; s->bt[3] = 3;
    s->slots[0] = 4; s->slots[1] = 32; s->slots[2] = 33; s->slots[3] = 34;
    s->b.query_start_loc = s->qsl; s->b.seq_lens = s->seq; s->b.block_table = s->bt;
    s->b.block_table_stride = 2; s->b.slot_mapping = s->slots; s->b.num_reqs = 2;
    s->b.num_actual_tokens = 4; s->b.max_query_len = 3; s->b.max_seq_len = 5;
}

static attn_metadata_desc sm_md(void) {
    attn_metadata_desc md;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 4; md.max_num_tokens = 8; md.max_blocks_per_req = 2; md.num_blocks = 4;
    return md;
}

static float sm_buf[4 * 4 * 2 * 16 * 2 * 576];

/* A view of memory of its own (the front doors refuse outputs that share an input's
   memory): the next of 16 slots, each as large as the largest view here. */
static float sm_views[16][2 * 512 * 128];
static attn_tensor sm_t(int ndim, int64_t a, int64_t b, int64_t c) {
    static int next;
    int64_t shape[3];
    shape[0] = a; shape[1] = b; shape[2] = c;
    return attn_tensor_make(sm_views[next++ % 16], ATTN_DTYPE_F32, ndim, shape);
}

/* Every hook of a standard plugin is reached, through the front doors, with self. */
ATTN_TEST(seam_plugin_every_standard_hook) {
    attn_context *ctx;
    attn_layer_desc d = sm_desc(0);
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md = sm_md();
    sm_batch sb;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0;
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, sm_plug_make(0)));
    ctx = sm_ctx(1, NULL);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(layer && attn_layer_backend(layer) == &sm_plug);
    EXPECT_EQ_INT(sm_rec.calls[H_CONTEXT_INIT], 1);
    EXPECT_EQ_INT(sm_rec.calls[H_LAYER_INIT], 1);
    EXPECT_TRUE(sm_rec.calls[H_CHECK] >= 1);
    if (layer) {
        attn_layer *second = NULL;
        attn_tensor q, out, lse, kv, k;
        sm_batch_make(&sb);
        EXPECT_EQ_INT(attn_layer_selection(layer)->cuda_graph, ATTN_CUDA_GRAPH_UNIFORM_BATCH);
        EXPECT_EQ_INT(attn_layer_selection(layer)->lse_base, ATTN_LSE_BASE_2);
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &second)); /* cached resolution: context init once */
        EXPECT_EQ_INT(sm_rec.calls[H_CONTEXT_INIT], 1);
        EXPECT_EQ_INT(sm_rec.calls[H_LAYER_INIT], 2);
        attn_layer_destroy(second);
        EXPECT_EQ_INT(sm_rec.calls[H_LAYER_RELEASE], 1);
        EXPECT_OK(attn_layer_kv_cache_shape(layer, 4, shape, &ndim));
        EXPECT_EQ_INT(ndim, 5);
        EXPECT_OK(attn_metadata_create(layer, &md, &meta));
        EXPECT_EQ_INT(sm_rec.calls[H_META_INIT], 1);
        EXPECT_OK(attn_metadata_build(meta, 0, &sb.b, 0));
        EXPECT_EQ_INT(sm_rec.calls[H_BUILD], 1);
        q = sm_t(3, 4, 4, 16);
        out = sm_t(3, 4, 4, 16);
        k = sm_t(3, 4, 2, 16);
        lse = sm_t(2, 4, 4, 1);
        kv = attn_tensor_make(sm_buf, ATTN_DTYPE_F32, ndim, shape);
        EXPECT_OK(attn_layer_forward(layer, meta, &q, &k, &k, &kv, &out, &lse, NULL));
        EXPECT_EQ_INT(sm_rec.calls[H_FORWARD], 1);
        EXPECT_EQ_INT(sm_rec.context_state_seen, 1);
        EXPECT_EQ_INT(sm_rec.layer_state_seen, 1);
        EXPECT_OK(attn_reshape_and_cache(layer, &k, &k, &kv, ATTN_TEST_SLOTS(sb.slots, 4), NULL));
        EXPECT_EQ_INT(sm_rec.calls[H_RESHAPE], 1);
        /* the merge of CPU tensors runs on the first CPU backend with a merge: the plugin */
        {
            attn_tensor o = sm_t(3, 4, 4, 16), l = sm_t(2, 4, 4, 1);
            EXPECT_OK(attn_merge_attn_states(ctx, &o, &l, ATTN_LSE_BASE_E, &o, &l, ATTN_LSE_BASE_E,
                                             &o, &l, ATTN_LSE_BASE_E, NULL));
            EXPECT_EQ_INT(sm_rec.calls[H_MERGE], 1);
        }
        /* the MLA entry points are refused before any hook of a standard layer */
        EXPECT_STATUS(attn_concat_and_cache_mla(layer, &k, &k, &kv, ATTN_TEST_SLOTS(sb.slots, 1), NULL), ATTN_ERROR_UNSUPPORTED);
        EXPECT_EQ_INT(sm_rec.calls[H_CONCAT], 0);
    }
    attn_metadata_destroy(meta);
    EXPECT_EQ_INT(sm_rec.calls[H_META_RELEASE], 1);
    attn_layer_destroy(layer);
    EXPECT_EQ_INT(sm_rec.calls[H_LAYER_RELEASE], 2);
    EXPECT_EQ_INT(sm_rec.calls[H_CONTEXT_RELEASE], 0);
    attn_context_destroy(ctx);
    EXPECT_EQ_INT(sm_rec.calls[H_CONTEXT_RELEASE], 1);
    EXPECT_EQ_INT(sm_rec.wrong_self, 0);
    attn_register_backend(ATTN_BACKEND_CUSTOM, NULL);
}

/* Every MLA hook, and the builder reads the backend-neutral decode/prefill split. */
ATTN_TEST(seam_plugin_every_mla_hook) {
    attn_context *ctx;
    attn_layer_desc d = sm_desc(1);
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md = sm_md();
    sm_batch sb;
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, sm_plug_make(1)));
    ctx = sm_ctx(1, NULL);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(layer && attn_layer_backend(layer) == &sm_plug);
    if (layer) {
        attn_mla_info info;
        int64_t shape[ATTN_MAX_DIMS];
        int ndim = 0;
        attn_tensor kv, q, qpe, ol, qn, out, wuk, wuv, kvc, kpe;
        sm_batch_make(&sb);
        EXPECT_OK(attn_metadata_create(layer, &md, &meta));
        EXPECT_OK(attn_metadata_build(meta, 0, &sb.b, 0));
        EXPECT_EQ_INT(sm_rec.mla_info_decodes, 1);
        EXPECT_EQ_INT(sm_rec.mla_info_prefill_tokens, 3);
        memset(&info, 0, sizeof info);
        EXPECT_OK(attn_metadata_mla_info(meta, &info)); /* a plugin's info is the real split */
        EXPECT_EQ_INT(info.num_decodes, 1);
        EXPECT_EQ_INT(info.num_decode_tokens, 1);
        EXPECT_EQ_INT(info.num_prefills, 1);
        EXPECT_EQ_INT(info.num_prefill_tokens, 3);
        EXPECT_TRUE(info.num_kv_splits >= 1 && info.prefill_chunk >= 64);
        EXPECT_OK(attn_layer_kv_cache_shape(layer, 4, shape, &ndim));
        kv = attn_tensor_make(sm_buf, ATTN_DTYPE_F32, ndim, shape);
        q = sm_t(3, 1, 2, 576);
        ol = sm_t(3, 1, 2, 512);
        EXPECT_OK(attn_mla_forward_mqa(layer, meta, &q, NULL, &kv, &ol, NULL, NULL));
        EXPECT_EQ_INT(sm_rec.calls[H_MQA], 1);
        EXPECT_EQ_INT(sm_rec.context_state_seen, 1);
        /* token counts are checked against the real split: 0 decode rows are too few */
        q = sm_t(3, 0, 2, 576);
        EXPECT_STATUS(attn_mla_forward_mqa(layer, meta, &q, NULL, &kv, &ol, NULL, NULL), ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_EQ_INT(sm_rec.calls[H_MQA], 1);
        q = sm_t(3, 3, 2, 192);
        out = sm_t(3, 3, 2, 128);
        wuk = sm_t(3, 2, 128, 512);
        wuv = sm_t(3, 2, 512, 128);
        EXPECT_OK(attn_mla_forward_mha(layer, meta, &q, &kv, &wuk, &wuv, &out, NULL, NULL));
        EXPECT_EQ_INT(sm_rec.calls[H_MHA], 1);
        qn = sm_t(3, 4, 2, 128);
        qpe = sm_t(3, 4, 2, 64);
        out = sm_t(3, 4, 2, 128);
        kvc = sm_t(2, 4, 512, 1);
        kpe = sm_t(2, 4, 64, 1);
        EXPECT_OK(attn_mla_forward(layer, meta, &qn, &qpe, &kvc, &kpe, &kv, &wuk, &wuv, &out, NULL));
        EXPECT_EQ_INT(sm_rec.calls[H_MLA_FORWARD], 1);
        EXPECT_OK(attn_concat_and_cache_mla(layer, &kvc, &kpe, &kv, ATTN_TEST_SLOTS(sb.slots, 4), NULL));
        EXPECT_EQ_INT(sm_rec.calls[H_CONCAT], 1);
        EXPECT_EQ_INT(sm_rec.calls[H_FORWARD], 0);
    }
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    EXPECT_EQ_INT(sm_rec.calls[H_META_RELEASE], 1);
    EXPECT_EQ_INT(sm_rec.calls[H_LAYER_RELEASE], 1);
    EXPECT_EQ_INT(sm_rec.calls[H_CONTEXT_RELEASE], 1);
    EXPECT_EQ_INT(sm_rec.wrong_self, 0);
    attn_register_backend(ATTN_BACKEND_CUSTOM, NULL);
}

static int sm_skipped(const attn_selection *s, attn_backend_id id, const char *word) {
    int i;
    for (i = 0; i < s->num_skipped; i++)
        if (s->skipped[i].backend == id && strstr(s->skipped[i].reason, word)) return 1;
    return 0;
}

/* A context-level init failure is a skip reason (remembered: tried once per context); a
   layer-level one too, in the layer's record, and the selector moves on. */
ATTN_TEST(seam_init_failures_are_skip_reasons) {
    attn_context *ctx;
    attn_layer_desc d = sm_desc(0);
    attn_layer *layer = NULL;
    attn_selection sel;
    sm_plug_make(0);
    sm_rec.fail_context_init = 1;
    EXPECT_OK(attn_register_backend(ATTN_BACKEND_CUSTOM, &sm_plug));
    ctx = sm_ctx(1, NULL);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &sel));
    EXPECT_EQ_INT(sel.resolved, ATTN_BACKEND_CPU);
    EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CUSTOM, "test library missing"));
    EXPECT_OK(attn_selection_cache_clear(ctx));
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(layer && attn_layer_backend(layer) == attn_backend_get(ATTN_BACKEND_CPU));
    EXPECT_EQ_INT(sm_rec.calls[H_CONTEXT_INIT], 1);
    EXPECT_EQ_INT(sm_rec.calls[H_LAYER_INIT], 0);
    attn_layer_destroy(layer);
    layer = NULL;
    attn_context_destroy(ctx);
    EXPECT_EQ_INT(sm_rec.calls[H_CONTEXT_RELEASE], 0); /* init failed: nothing to release */

    sm_plug_make(0);
    sm_rec.fail_layer_init = 1;
    ctx = sm_ctx(1, NULL);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(layer && attn_layer_backend(layer) == attn_backend_get(ATTN_BACKEND_CPU));
    if (layer) EXPECT_TRUE(sm_skipped(attn_layer_selection(layer), ATTN_BACKEND_CUSTOM, "does not compile"));
    attn_layer_destroy(layer);
    EXPECT_EQ_INT(sm_rec.calls[H_LAYER_RELEASE], 0);
    /* an explicit request for it fails with that reason */
    {
        attn_select_request req;
        memset(&req, 0, sizeof req);
        req.backend = ATTN_BACKEND_CUSTOM;
        layer = NULL;
        EXPECT_STATUS(attn_layer_create(ctx, &d, &req, &layer), ATTN_ERROR_BACKEND_UNAVAILABLE);
        EXPECT_TRUE(layer == NULL);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "does not compile") != NULL);
    }
    attn_context_destroy(ctx);
    EXPECT_EQ_INT(sm_rec.calls[H_CONTEXT_RELEASE], 1);
    attn_register_backend(ATTN_BACKEND_CUSTOM, NULL);
}

/* The record and its text show what the resolved backend declares. */
ATTN_TEST(seam_record_shows_declared_capabilities) {
    attn_context *ctx = sm_ctx(1, NULL);
    attn_layer_desc d = sm_desc(0);
    attn_selection sel;
    char text[4096];
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &sel));
    EXPECT_EQ_INT(sel.resolved, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(sel.backend_device, ATTN_DEVICE_CPU);
    EXPECT_EQ_INT(sel.cuda_graph, attn_backend_get(ATTN_BACKEND_CPU)->cuda_graph);
    EXPECT_EQ_INT(sel.cuda_graph, ATTN_CUDA_GRAPH_NEVER);
    EXPECT_EQ_INT(sel.can_return_lse, 1);
    EXPECT_EQ_INT(sel.lse_base, ATTN_LSE_BASE_E);
    attn_selection_format(&sel, text, sizeof text);
    EXPECT_TRUE(strstr(text, "cuda_graph: NEVER") != NULL);
    EXPECT_TRUE(strstr(text, "lse: base e") != NULL);
    EXPECT_TRUE(strstr(text, "device: cpu") != NULL);
    EXPECT_TRUE(strstr(text, "features: non-causal sliding-window soft-cap alibi sinks cascade\n") != NULL);
    d = sm_desc(1);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &sel));
    EXPECT_EQ_INT(sel.cuda_graph, attn_backend_get(ATTN_BACKEND_CPU_MLA)->cuda_graph);
    attn_selection_format(&sel, text, sizeof text);
    EXPECT_TRUE(strstr(text, "features: sinks sparse-mla\n") != NULL); /* MLA: sinks (the sparse call), sparse MLA */
    attn_context_destroy(ctx);
}

/* The layer names its device; backends of other devices are skipped with that reason. */
ATTN_TEST(seam_layer_device) {
    attn_test_log log;
    attn_context *ctx = attn_test_context(&log, ATTN_LOG_LEVEL_DEBUG, 1);
    attn_layer_desc d = sm_desc(0);
    attn_layer *layer = NULL;
    attn_selection sel;
    if (!ctx) return;
    d.device = ATTN_DEVICE_CUDA;
    {
        attn_platform p;
        attn_platform_get(ctx, &p);
        if (p.kind != ATTN_PLATFORM_CUDA) { /* here: nothing serves it, and the record says why */
            EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &sel), ATTN_ERROR_UNSUPPORTED);
            if (attn_backend_get(ATTN_BACKEND_CUDA)) { /* absent when compiled out (ATTN_NO_CUDA) */
                EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CUDA, "CUDA"));
                EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CUDA_SM90, "CUDA_SM90"));
            }
            EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CPU, "tensors are on cuda"));
            EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNSUPPORTED);
            EXPECT_TRUE(layer == NULL);
        } else { /* on a GPU machine the CUDA backend serves it (f32: CUDA_SM90 says why not) */
            EXPECT_OK(attn_select_backend(ctx, &d, NULL, &sel));
            EXPECT_EQ_INT(sel.resolved, ATTN_BACKEND_CUDA);
            EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CUDA_SM90, "dtype f32"));
        }
    }
    EXPECT_EQ_INT(sel.device, ATTN_DEVICE_CUDA);
    d.device = (attn_device_kind)7;
    attn_test_log_reset(&log);
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_INVALID_DESC, ATTN_LOG_LEVEL_ERROR));
    d.device = ATTN_DEVICE_CPU;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &sel));
    EXPECT_EQ_INT(sel.resolved, ATTN_BACKEND_CPU);
    EXPECT_EQ_INT(sel.device, ATTN_DEVICE_CPU);
    attn_context_destroy(ctx);
}

/* The selection cache is bounded: after its first few hundred distinct layers it stops
   growing (the oldest resolution makes room). */
ATTN_TEST(seam_selection_cache_bounded) {
    attn_context *ctx = sm_ctx(1, NULL);
    attn_layer_desc d = sm_desc(0);
    attn_selection s;
    long before = 0;
    int i;
    if (!ctx) return;
    for (i = 0; i < 700; i++) {
        if (i == 400) before = attn_test_allocations;
        d.sliding_window = i + 1; /* a distinct descriptor each time */
        EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    }
    EXPECT_EQ_INT((int)(attn_test_allocations - before), 0);
    attn_context_destroy(ctx);
}

/* ---- the loader's injection point --------------------------------------------------- */
#ifndef ATTN_NO_CUDA /* an ATTN_NO_CUDA build never calls the loader (tests/test_outside.c) */

typedef struct sm_fake_driver {
    int drop_symbol;      /* leave cuDeviceGetName out */
    int drop_tma;         /* leave cuTensorMapEncodeTiled out (an optional symbol) */
    int opened, closed;
    const char *refuse;   /* soname to report as missing */
} sm_fake_driver;

static int sm_cu_init(unsigned f) { (void)f; return 0; }
static int sm_cu_version(int *v) { *v = 13000; return 0; }
static int sm_cu_count(int *n) { *n = 1; return 0; }
static int sm_cu_get(int *dev, int i) { *dev = i; return 0; }
static int sm_cu_attr(int *v, int attr, int dev) {
    (void)dev;
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 132 : 0;
    return 0;
}
static int sm_cu_mem(size_t *bytes, int dev) {
    (void)dev;
    *bytes = (size_t)141 << 30;
    return 0;
}
static int sm_cu_name(char *name, int len, int dev) {
    (void)dev;
    strncpy(name, "Fake H200", (size_t)len - 1);
    name[len - 1] = 0;
    return 0;
}
static void *sm_open(void *u, const char *soname) {
    sm_fake_driver *f = (sm_fake_driver *)u;
    const char *base = strrchr(soname, '/') ? strrchr(soname, '/') + 1 : soname;
    if (strncmp(base, "libcuda", 7) != 0) return NULL; /* only a driver is faked (any directory) */
    if (f->refuse && strcmp(soname, f->refuse) == 0) return NULL;
    f->opened++;
    return f;
}
/* Every other driver function: the tests never get a device to call them on. */
static int sm_cu_unused(void) { return 999; }

/* A function pointer handed out as dlsym would (POSIX: object pointer of the same size). */
static void *sm_fn(void (*f)(void)) {
    void *p;
    memcpy(&p, &f, sizeof p);
    return p;
}
static void *sm_symbol(void *u, void *lib, const char *name) {
    sm_fake_driver *f = (sm_fake_driver *)u;
    (void)lib;
    if (strcmp(name, "cuInit") == 0) return sm_fn((void (*)(void))sm_cu_init);
    if (strcmp(name, "cuDriverGetVersion") == 0) return sm_fn((void (*)(void))sm_cu_version);
    if (strcmp(name, "cuDeviceGetCount") == 0) return sm_fn((void (*)(void))sm_cu_count);
    if (strcmp(name, "cuDeviceGet") == 0) return sm_fn((void (*)(void))sm_cu_get);
    if (strcmp(name, "cuDeviceGetAttribute") == 0) return sm_fn((void (*)(void))sm_cu_attr);
    if (strcmp(name, "cuDeviceGetName") == 0 && !f->drop_symbol) return sm_fn((void (*)(void))sm_cu_name);
    if (strcmp(name, "cuDeviceTotalMem_v2") == 0) return sm_fn((void (*)(void))sm_cu_mem);
    if (strcmp(name, "cuDeviceGetName") == 0) return NULL; /* dropped */
    if (strcmp(name, "cuTensorMapEncodeTiled") == 0 && f->drop_tma) return NULL;
    return strncmp(name, "cu", 2) == 0 ? sm_fn((void (*)(void))sm_cu_unused) : NULL;
}
static void *sm_open_none(void *u, const char *soname) {
    (void)u; (void)soname;
    return NULL;
}
static void sm_close(void *u, void *lib) {
    (void)lib;
    ((sm_fake_driver *)u)->closed++;
}

ATTN_TEST(seam_loader_injection) {
    sm_fake_driver f;
    attn_loader l;
    attn_platform p;
    attn_context *ctx;
    char text[2048];
    memset(&l, 0, sizeof l);
    l.open = sm_open; l.symbol = sm_symbol; l.close = sm_close; l.user_data = &f;

    /* a driver that lacks a symbol: the reason names the library and the symbol */
    memset(&f, 0, sizeof f);
    f.drop_symbol = 1;
    ctx = sm_ctx(1, &l);
    EXPECT_TRUE(ctx != NULL);
    if (ctx) {
        EXPECT_OK(attn_platform_get(ctx, &p));
        EXPECT_EQ_INT(p.kind, ATTN_PLATFORM_CPU);
        EXPECT_TRUE(strstr(p.cublas_reason, "no CUDA device") != NULL); /* never opened here */
        EXPECT_TRUE(strstr(p.cuda_reason, "lacks symbol cuDeviceGetName") != NULL);
        EXPECT_TRUE(strstr(p.cuda_reason, "libcuda.so.1") != NULL);
        EXPECT_EQ_INT(p.cuda_tma, 0);
        EXPECT_TRUE(strstr(p.cuda_tma_reason, "no CUDA device") != NULL);
        EXPECT_EQ_INT(f.closed, 1);
        attn_context_destroy(ctx);
    }

    /* the first soname missing: the fallback name is tried */
    memset(&f, 0, sizeof f);
    f.refuse = "libcuda.so.1";
    ctx = sm_ctx(1, &l);
    if (ctx) {
        EXPECT_OK(attn_platform_get(ctx, &p));
        EXPECT_EQ_INT(p.kind, ATTN_PLATFORM_CUDA);
        EXPECT_EQ_INT(f.opened, 1);
        attn_context_destroy(ctx);
        EXPECT_EQ_INT(f.closed, 1);
    }

    /* a driver without the tensor-map encoder (older than CUDA 12): CUDA still, no TMA,
       and the reason names the missing function */
    memset(&f, 0, sizeof f);
    f.drop_tma = 1;
    ctx = sm_ctx(1, &l);
    if (ctx) {
        EXPECT_OK(attn_platform_get(ctx, &p));
        EXPECT_EQ_INT(p.kind, ATTN_PLATFORM_CUDA);
        EXPECT_EQ_INT(p.cuda_tma, 0);
        EXPECT_TRUE(strstr(p.cuda_tma_reason, "lacks cuTensorMapEncodeTiled") != NULL);
        attn_platform_format(&p, text, sizeof text);
        EXPECT_TRUE(strstr(text, "cuda_tma: no: driver libcuda.so.1 lacks cuTensorMapEncodeTiled") != NULL);
        if (attn_backend_get(ATTN_BACKEND_CUDA_SM90)) { /* its prefill reads the cache through TMA: skipped, and why */
            attn_layer_desc d = sm_desc(0);
            attn_selection sel;
            d.device = ATTN_DEVICE_CUDA;
            d.dtype = ATTN_DTYPE_BF16;
            d.num_heads = 32; d.num_kv_heads = 8; d.head_size = 128; d.block_size = 16;
            attn_select_backend(ctx, &d, NULL, &sel); /* nothing serves it here: the fake has no NVRTC */
            EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CUDA_SM90, "paged_prefill_sm90.cu reads the cache through TMA"));
            EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CUDA_SM90, "lacks cuTensorMapEncodeTiled"));
            EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CUDA, "libnvrtc")); /* CUDA needs no TMA: its reason is NVRTC */
        }
        if (attn_backend_get(ATTN_BACKEND_CUDA_MLA_SM90)) { /* its decode reads the latent cache through TMA */
            attn_layer_desc d;
            attn_selection sel;
            memset(&d, 0, sizeof d);
            d.use_mla = 1; d.num_heads = 128; d.head_size = 576; d.kv_lora_rank = 512; d.qk_rope_head_dim = 64;
            d.qk_nope_head_dim = 128; d.v_head_dim = 128; d.dtype = ATTN_DTYPE_BF16; d.block_size = 64;
            d.device = ATTN_DEVICE_CUDA;
            attn_select_backend(ctx, &d, NULL, &sel);
            EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CUDA_MLA_SM90, "mla_decode_sm90.cu reads the cache through TMA"));
            EXPECT_TRUE(sm_skipped(&sel, ATTN_BACKEND_CUDA_MLA_SM90, "lacks cuTensorMapEncodeTiled"));
            if (attn_backend_get(ATTN_BACKEND_CUDA_MLA)) /* the mma.sync MLA kernels need no TMA */
                EXPECT_TRUE(!sm_skipped(&sel, ATTN_BACKEND_CUDA_MLA, "TMA"));
        }
        attn_context_destroy(ctx);
    }

    /* a working driver: the platform reads its device; the table is kept until destroy */
    memset(&f, 0, sizeof f);
    ctx = sm_ctx(1, &l);
    if (ctx) {
        attn_layer_desc d = sm_desc(0);
        attn_selection sel;
        EXPECT_OK(attn_platform_get(ctx, &p));
        EXPECT_EQ_INT(p.kind, ATTN_PLATFORM_CUDA);
        EXPECT_EQ_INT(p.cuda_capability_major, 9);
        EXPECT_EQ_INT(p.cuda_multiprocessors, 132);
        EXPECT_EQ_INT(p.cuda_driver_version, 13000);
        EXPECT_TRUE(p.cuda_memory_bytes == (uint64_t)141 << 30);
        EXPECT_TRUE(strstr(p.nvrtc_reason, "libnvrtc.so.13") != NULL); /* the fake has none */
        EXPECT_TRUE(strstr(p.cublas_reason, "libcublas.so.13") != NULL); /* tried on a CUDA platform */
        EXPECT_EQ_INT(p.cublas_version, 0);
        EXPECT_TRUE(strcmp(p.cuda_device_name, "Fake H200") == 0);
        attn_platform_format(&p, text, sizeof text);
        EXPECT_TRUE(strstr(text, "Fake H200") != NULL);
        EXPECT_EQ_INT(p.cuda_tma, 1); /* compute capability 9.0 and the encoder exported */
        EXPECT_TRUE(p.cuda_tma_reason[0] == 0);
        EXPECT_TRUE(strstr(text, "cuda_tma: yes\n") != NULL);
        EXPECT_EQ_INT(f.closed, 0);
        EXPECT_OK(attn_select_backend(ctx, &d, NULL, &sel)); /* CPU serves on a CUDA platform */
        EXPECT_EQ_INT(sel.resolved, ATTN_BACKEND_CPU);
        EXPECT_EQ_INT(sel.device_capability, 90);
        attn_context_destroy(ctx);
        EXPECT_EQ_INT(f.closed, 1);
    }

    /* nothing loads: the reason lists every name tried */
    memset(&f, 0, sizeof f);
    l.open = sm_open_none;
    ctx = sm_ctx(1, &l);
    if (ctx) {
        EXPECT_OK(attn_platform_get(ctx, &p));
        EXPECT_EQ_INT(p.kind, ATTN_PLATFORM_CPU);
        EXPECT_TRUE(strstr(p.cuda_reason, "not found") != NULL);
        EXPECT_TRUE(strstr(p.cuda_reason, "libcuda.so") != NULL);
        attn_context_destroy(ctx);
        EXPECT_EQ_INT(f.closed, 0);
    }
}
/* The CUDA libraries by name (attn_context_desc, else ATTN_*_LIBRARY): the name given is the
   only one tried, the platform says what each was opened as, a missing one is named in the
   reason with where the name came from; desc beats env. */
ATTN_TEST(seam_library_names) {
    sm_fake_driver f;
    attn_loader l;
    attn_platform p;
    attn_context_desc cd;
    attn_context *ctx = NULL;
    attn_test_env e1 = attn_test_env_save("ATTN_CUDA_LIBRARY"), e2 = attn_test_env_save("ATTN_NVRTC_LIBRARY");
    attn_test_env e3 = attn_test_env_save("ATTN_CUBLAS_LIBRARY");
    char text[4096];
    memset(&l, 0, sizeof l);
    l.open = sm_open; l.symbol = sm_symbol; l.close = sm_close; l.user_data = &f;
    memset(&f, 0, sizeof f);
    memset(&cd, 0, sizeof cd);
    cd.log_level = ATTN_LOG_LEVEL_NONE;
    cd.num_threads = 1;
    cd.loader = &l;
    cd.cuda_library = "/opt/site-packages/nvidia/libcuda.so.1";
    cd.nvrtc_library = "/opt/site-packages/nvidia/cu13/lib/libnvrtc.so.13";
    cd.cublas_library = "/opt/nowhere/libcublas.so.13";
    EXPECT_OK(attn_context_create(&cd, &ctx));
    if (ctx) {
        EXPECT_OK(attn_platform_get(ctx, &p));
        EXPECT_EQ_INT(p.kind, ATTN_PLATFORM_CUDA);
        EXPECT_TRUE(strcmp(p.cuda_library, "/opt/site-packages/nvidia/libcuda.so.1") == 0);
        EXPECT_EQ_INT(f.opened, 1);
        EXPECT_TRUE(strstr(p.nvrtc_reason, "tried /opt/site-packages/nvidia/cu13/lib/libnvrtc.so.13) (ATTN_NVRTC_LIBRARY)") != NULL);
        EXPECT_TRUE(strstr(p.nvrtc_reason, "libnvrtc.so.12") == NULL); /* the name given is the only one tried */
        EXPECT_TRUE(p.nvrtc_library[0] == 0);
        EXPECT_TRUE(strstr(p.cublas_reason, "tried /opt/nowhere/libcublas.so.13) (ATTN_CUBLAS_LIBRARY)") != NULL);
        attn_platform_format(&p, text, sizeof text);
        EXPECT_TRUE(strstr(text, "cuda_library: /opt/site-packages/nvidia/libcuda.so.1\n") != NULL);
        EXPECT_TRUE(strstr(text, "nvrtc_library: none\n") != NULL);
        attn_context_destroy(ctx);
        ctx = NULL;
    }
    /* the environment, when the desc names none; the desc, when both do */
    memset(&f, 0, sizeof f);
    setenv("ATTN_CUDA_LIBRARY", "/env/libcuda.so.1", 1);
    setenv("ATTN_NVRTC_LIBRARY", "/env/libnvrtc.so.13", 1);
    cd.cuda_library = NULL;
    cd.nvrtc_library = "";
    cd.cublas_library = NULL;
    EXPECT_OK(attn_context_create(&cd, &ctx));
    if (ctx) {
        EXPECT_OK(attn_platform_get(ctx, &p));
        EXPECT_TRUE(strcmp(p.cuda_library, "/env/libcuda.so.1") == 0);
        EXPECT_TRUE(strstr(p.nvrtc_reason, "tried /env/libnvrtc.so.13)") != NULL);
        EXPECT_TRUE(strstr(p.cublas_reason, "libcublas.so.13, libcublas.so.12") != NULL); /* the defaults */
        attn_context_destroy(ctx);
        ctx = NULL;
    }
    memset(&f, 0, sizeof f);
    cd.cuda_library = "/desc/libcuda.so.1";
    EXPECT_OK(attn_context_create(&cd, &ctx));
    if (ctx) {
        EXPECT_OK(attn_platform_get(ctx, &p));
        EXPECT_TRUE(strcmp(p.cuda_library, "/desc/libcuda.so.1") == 0);
        attn_context_destroy(ctx);
    }
    attn_test_env_restore(&e1); attn_test_env_restore(&e2); attn_test_env_restore(&e3);
}
#else
ATTN_TEST(seam_loader_injection) {
    SKIP("built with ATTN_NO_CUDA: the loader is never called (tests/test_outside.c checks that)");
}
ATTN_TEST(seam_library_names) {
    SKIP("built with ATTN_NO_CUDA: no CUDA library is opened");
}
#endif

/* ---- nothing allocated after create ------------------------------------------------ */

static void sm_fill(float *p, size_t n, unsigned seed) {
    size_t i;
    for (i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
}

ATTN_TEST(seam_no_allocation_after_create) {
    enum { H = 4, KVH = 2, D = 64, NB = 64, BS = 16 };
    attn_context *ctx = sm_ctx(2, NULL);
    attn_layer_desc d;
    attn_layer *layer = NULL, *mla = NULL;
    attn_metadata *meta = NULL, *mmeta = NULL;
    attn_metadata_desc md;
    static float cache[NB * 2 * BS * KVH * D], q[64 * H * D], o[64 * H * D], lse[64 * H];
    static float k[64 * KVH * D], o2[64 * H * D], lse2[64 * H];
    static float lat[NB * BS * 576], qn[64 * 16 * 128], qpe[64 * 16 * 64], wuk[16 * 128 * 512];
    static float wuv[16 * 512 * 128], mout[64 * 16 * 128], kvc[64 * 512], kpe[64 * 64];
    int32_t bt[4 * 16];
    int i, round;
    long before;
    if (!ctx) return;
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = KVH; d.head_size = D; d.dtype = ATTN_DTYPE_F32;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 4; md.max_num_tokens = 64; md.max_blocks_per_req = 16; md.num_blocks = NB;
    EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    memset(&d, 0, sizeof d);
    d.use_mla = 1; d.num_heads = 16; d.head_size = 576; d.dtype = ATTN_DTYPE_F32;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &mla));
    EXPECT_OK(attn_metadata_create(mla, &md, &mmeta));
    for (i = 0; i < 4 * 16; i++) bt[i] = i;
    sm_fill(cache, sizeof cache / sizeof cache[0], 1);
    sm_fill(lat, sizeof lat / sizeof lat[0], 2);
    sm_fill(q, sizeof q / sizeof q[0], 3);
    sm_fill(k, sizeof k / sizeof k[0], 4);
    sm_fill(qn, sizeof qn / sizeof qn[0], 5);
    sm_fill(qpe, sizeof qpe / sizeof qpe[0], 6);
    sm_fill(wuk, sizeof wuk / sizeof wuk[0], 7);
    sm_fill(wuv, sizeof wuv / sizeof wuv[0], 8);
    sm_fill(kvc, sizeof kvc / sizeof kvc[0], 9);
    sm_fill(kpe, sizeof kpe / sizeof kpe[0], 10);
    if (!meta || !mmeta) goto done;
    before = attn_test_allocations;
    for (round = 0; round < 6; round++) {
        /* batches that split (one long decode), that do not, and a mixed one */
        int32_t qsl[5], seq[4];
        int64_t slots[64];
        int nreq = 1 + round % 4, ntok = 0, r, maxq = 0, maxs = 0;
        attn_batch b;
        attn_tensor tq, to, tl, tk, tc, to2, tl2;
        int64_t s3[3], s2[2], sc[5];
        qsl[0] = 0;
        for (r = 0; r < nreq; r++) {
            int ql = (r == 0 || round % 2) ? 1 : 5 + 7 * r; /* decodes first, then prefills */
            seq[r] = round == 0 ? 250 : ql + 17 * r + 3 * round;
            qsl[r + 1] = qsl[r] + ql;
            maxq = ql > maxq ? ql : maxq;
            maxs = seq[r] > maxs ? seq[r] : maxs;
        }
        ntok = qsl[nreq];
        for (i = 0; i < ntok; i++) slots[i] = 5 * 16 + i;
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 16;
        b.slot_mapping = slots; b.num_reqs = nreq; b.num_actual_tokens = ntok;
        b.max_query_len = maxq; b.max_seq_len = maxs;
        EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(mmeta, 0, &b, 0));
        s3[0] = ntok; s3[1] = H; s3[2] = D;
        tq = attn_tensor_make(q, ATTN_DTYPE_F32, 3, s3);
        to = attn_tensor_make(o, ATTN_DTYPE_F32, 3, s3);
        to2 = attn_tensor_make(o2, ATTN_DTYPE_F32, 3, s3);
        s2[0] = ntok; s2[1] = H;
        tl = attn_tensor_make(lse, ATTN_DTYPE_F32, 2, s2);
        tl2 = attn_tensor_make(lse2, ATTN_DTYPE_F32, 2, s2);
        s3[1] = KVH;
        tk = attn_tensor_make(k, ATTN_DTYPE_F32, 3, s3);
        sc[0] = NB; sc[1] = 2; sc[2] = BS; sc[3] = KVH; sc[4] = D;
        tc = attn_tensor_make(cache, ATTN_DTYPE_F32, 5, sc);
        EXPECT_OK(attn_layer_forward(layer, meta, &tq, &tk, &tk, &tc, &to, &tl, NULL));
        EXPECT_OK(attn_layer_forward(layer, meta, &tq, NULL, NULL, &tc, &to2, &tl2, NULL));
        EXPECT_OK(attn_reshape_and_cache(layer, &tk, &tk, &tc, ATTN_TEST_SLOTS(slots, ntok), NULL));
        EXPECT_OK(attn_merge_attn_states(ctx, &to, &tl, ATTN_LSE_BASE_E, &to2, &tl2, ATTN_LSE_BASE_E,
                                         &to, &tl, ATTN_LSE_BASE_2, NULL));
        {
            attn_tensor tn, tp, tmo, tlat, tc2, tp2, twk, twv;
            int64_t m3[3], l3[3], w3[3], c2[2];
            m3[0] = ntok; m3[1] = 16; m3[2] = 128;
            tn = attn_tensor_make(qn, ATTN_DTYPE_F32, 3, m3);
            tmo = attn_tensor_make(mout, ATTN_DTYPE_F32, 3, m3);
            m3[2] = 64;
            tp = attn_tensor_make(qpe, ATTN_DTYPE_F32, 3, m3);
            l3[0] = NB; l3[1] = BS; l3[2] = 576;
            tlat = attn_tensor_make(lat, ATTN_DTYPE_F32, 3, l3);
            w3[0] = 16; w3[1] = 128; w3[2] = 512;
            twk = attn_tensor_make(wuk, ATTN_DTYPE_F32, 3, w3);
            w3[1] = 512; w3[2] = 128;
            twv = attn_tensor_make(wuv, ATTN_DTYPE_F32, 3, w3);
            c2[0] = ntok; c2[1] = 512;
            tc2 = attn_tensor_make(kvc, ATTN_DTYPE_F32, 2, c2);
            c2[1] = 64;
            tp2 = attn_tensor_make(kpe, ATTN_DTYPE_F32, 2, c2);
            EXPECT_OK(attn_mla_forward(mla, mmeta, &tn, &tp, &tc2, &tp2, &tlat, &twk, &twv, &tmo, NULL));
            EXPECT_OK(attn_concat_and_cache_mla(mla, &tc2, &tp2, &tlat, ATTN_TEST_SLOTS(slots, ntok), NULL));
        }
    }
    EXPECT_EQ_INT((int)(attn_test_allocations - before), 0);
    for (i = 0; i < 64 * H * D; i++)
        if (!(o[i] == o[i]) || !(mout[i % (64 * 16 * 128)] == mout[i % (64 * 16 * 128)])) {
            EXPECT_TRUE(0);
            break;
        }
done:
    attn_metadata_destroy(mmeta);
    attn_metadata_destroy(meta);
    attn_layer_destroy(mla);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* A small MLA workspace: short chunks and query groups (the prefill's running outputs no
   longer fit at once) give what the default workspace gives. */
ATTN_TEST(seam_mla_small_workspace_groups) {
    enum { H = 128, NB = 24, BS = 16, T = 100, S = 300 };
    attn_context *ctx = sm_ctx(2, NULL);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *big = NULL, *small = NULL;
    attn_metadata_desc md;
    static float lat[NB * BS * 576], q[T * H * 192], wuk[H * 128 * 512], wuv[H * 512 * 128];
    static float o1[T * H * 128], o2[T * H * 128], l1[T * H], l2[T * H];
    int32_t qsl[2] = {0, T}, seq[1] = {S}, bt[NB];
    attn_batch b;
    attn_mla_info ib, is;
    int i, bad = 0;
    if (!ctx) return;
    memset(&d, 0, sizeof d);
    d.use_mla = 1; d.num_heads = H; d.head_size = 576; d.dtype = ATTN_DTYPE_F32;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    if (!layer) { attn_context_destroy(ctx); return; }
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = T; md.max_blocks_per_req = NB; md.num_blocks = NB;
    EXPECT_OK(attn_metadata_create(layer, &md, &big));
    md.workspace_bytes = 1 << 20;
    EXPECT_OK(attn_metadata_create(layer, &md, &small));
    md.workspace_bytes = 1000; /* below the 1 MiB floor */
    {
        attn_metadata *m = NULL;
        EXPECT_STATUS(attn_metadata_create(layer, &md, &m), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(m == NULL);
    }
    for (i = 0; i < NB; i++) bt[i] = (i * 7) % NB;
    sm_fill(lat, sizeof lat / sizeof lat[0], 11);
    sm_fill(q, sizeof q / sizeof q[0], 12);
    sm_fill(wuk, sizeof wuk / sizeof wuk[0], 13);
    sm_fill(wuv, sizeof wuv / sizeof wuv[0], 14);
    for (i = 0; i < T * H * 128; i++) { o1[i] = NAN; o2[i] = NAN; }
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = NB;
    b.num_reqs = 1; b.num_actual_tokens = T; b.max_query_len = T; b.max_seq_len = S;
    if (big && small) {
        attn_tensor tq, tlat, twk, twv, to1, to2, tl1, tl2;
        int64_t s3[3], s2[2];
        EXPECT_OK(attn_metadata_build(big, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(small, 0, &b, 0));
        EXPECT_OK(attn_metadata_mla_info(big, &ib));
        EXPECT_OK(attn_metadata_mla_info(small, &is));
        EXPECT_TRUE(is.prefill_chunk < ib.prefill_chunk);
        EXPECT_TRUE(is.prefill_chunk < S); /* several chunks */
        s3[0] = T; s3[1] = H; s3[2] = 192;
        tq = attn_tensor_make(q, ATTN_DTYPE_F32, 3, s3);
        s3[2] = 128;
        to1 = attn_tensor_make(o1, ATTN_DTYPE_F32, 3, s3);
        to2 = attn_tensor_make(o2, ATTN_DTYPE_F32, 3, s3);
        s2[0] = T; s2[1] = H;
        tl1 = attn_tensor_make(l1, ATTN_DTYPE_F32, 2, s2);
        tl2 = attn_tensor_make(l2, ATTN_DTYPE_F32, 2, s2);
        s3[0] = NB; s3[1] = BS; s3[2] = 576;
        tlat = attn_tensor_make(lat, ATTN_DTYPE_F32, 3, s3);
        s3[0] = H; s3[1] = 128; s3[2] = 512;
        twk = attn_tensor_make(wuk, ATTN_DTYPE_F32, 3, s3);
        s3[1] = 512; s3[2] = 128;
        twv = attn_tensor_make(wuv, ATTN_DTYPE_F32, 3, s3);
        EXPECT_OK(attn_mla_forward_mha(layer, big, &tq, &tlat, &twk, &twv, &to1, &tl1, NULL));
        EXPECT_OK(attn_mla_forward_mha(layer, small, &tq, &tlat, &twk, &twv, &to2, &tl2, NULL));
        for (i = 0; i < T * H * 128 && bad < 5; i++)
            if (!(fabsf(o1[i] - o2[i]) <= 1e-5f + 1e-4f * fabsf(o1[i]))) {
                attn_test_fail(__FILE__, __LINE__, "out[%d]: %g (default) vs %g (small)", i, o1[i], o2[i]);
                bad++;
            }
        for (i = 0; i < T * H && bad < 5; i++)
            if (!(fabsf(l1[i] - l2[i]) <= 1e-4f + 1e-5f * fabsf(l1[i]))) {
                attn_test_fail(__FILE__, __LINE__, "lse[%d]: %g vs %g", i, l1[i], l2[i]);
                bad++;
            }
    }
    attn_metadata_destroy(small);
    attn_metadata_destroy(big);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

void suite_seam(void) {
    ATTN_RUN(seam_plugin_every_standard_hook);
    ATTN_RUN(seam_plugin_every_mla_hook);
    ATTN_RUN(seam_init_failures_are_skip_reasons);
    ATTN_RUN(seam_record_shows_declared_capabilities);
    ATTN_RUN(seam_layer_device);
    ATTN_RUN(seam_selection_cache_bounded);
    ATTN_RUN(seam_loader_injection);
    ATTN_RUN(seam_library_names);
    ATTN_RUN(seam_no_allocation_after_create);
    ATTN_RUN(seam_mla_small_workspace_groups);
}
