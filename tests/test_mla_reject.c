/* What MLA refuses, as tables: each row names what it changes in a valid baseline (a layer
   descriptor, or the arguments of one call), the status expected, the log item that names
   the failure (at ERROR) and a piece of attn_context_last_error(); one loop per table
   builds the baseline, applies the row's edit, calls, and checks the three and that the
   call changed nothing (outputs still NaN, caches and outputs of counts as they were).
   Then the baselines themselves run. Also what is accepted around the refusals: the
   fallback of an explicit request, the defaults a default MLA layer gets, a second layer
   of the same shape sharing the metadata, -1 slots skipped by the cache write. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "mla_fixtures.h"

#include <limits.h>

/* ---- layer descriptors ---------------------------------------------------------------- */

static attn_layer_desc mla_desc(int H, int hs, int rank) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.use_mla = 1;
    d.num_heads = H;
    d.head_size = hs;
    d.kv_lora_rank = rank;
    d.qk_rope_head_dim = 64;
    d.dtype = ATTN_DTYPE_F32;
    return d;
}

typedef struct layer_case {
    const char *what;
    void (*edit)(attn_layer_desc *d, attn_select_request *req); /* of mla_desc(16, 576, 512) */
    attn_status status;
    attn_log_item item;  /* logged at ERROR */
    const char *message; /* in attn_context_last_error */
} layer_case;

static const float slopes16[16] = {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f,
                                   0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f};
static void ld_600(attn_layer_desc *d, attn_select_request *r) { (void)r; *d = mla_desc(16, 600, 536); }
static void ld_384(attn_layer_desc *d, attn_select_request *r) { (void)r; *d = mla_desc(16, 384, 320); }
static void ld_rope32(attn_layer_desc *d, attn_select_request *r) {
    (void)r;
    d->qk_rope_head_dim = 32;
    d->kv_lora_rank = 544;
}
static void ld_rank500(attn_layer_desc *d, attn_select_request *r) { (void)r; d->kv_lora_rank = 500; }
static void ld_head320(attn_layer_desc *d, attn_select_request *r) { (void)r; d->head_size = 320; }
static void ld_nope_max(attn_layer_desc *d, attn_select_request *r) { (void)r; d->qk_nope_head_dim = INT_MAX; }
static void ld_v_65537(attn_layer_desc *d, attn_select_request *r) { (void)r; d->v_head_dim = 65537; }
static void ld_rope_max(attn_layer_desc *d, attn_select_request *r) { (void)r; d->qk_rope_head_dim = INT_MAX; }
static void ld_rank_neg(attn_layer_desc *d, attn_select_request *r) { (void)r; d->kv_lora_rank = -1; }
static void ld_kv_heads(attn_layer_desc *d, attn_select_request *r) { (void)r; d->num_kv_heads = 2; }
static void ld_alibi(attn_layer_desc *d, attn_select_request *r) { (void)r; d->alibi_slopes = slopes16; }
static void ld_window(attn_layer_desc *d, attn_select_request *r) { (void)r; d->sliding_window = 128; }
static void ld_soft_cap(attn_layer_desc *d, attn_select_request *r) { (void)r; d->logits_soft_cap = 30.0f; }
static void ld_non_causal(attn_layer_desc *d, attn_select_request *r) { (void)r; d->causal = ATTN_CAUSAL_NO; }
static void ld_std_on_cpu_mla(attn_layer_desc *d, attn_select_request *r) {
    memset(d, 0, sizeof *d);
    d->num_heads = 8;
    d->head_size = 128;
    d->dtype = ATTN_DTYPE_F32;
    r->backend = ATTN_BACKEND_CPU_MLA;
}
static void ld_mla_on_cpu(attn_layer_desc *d, attn_select_request *r) { (void)d; r->backend = ATTN_BACKEND_CPU; }

static const layer_case layer_cases[] = {
    /* sizes between the supported ones: no backend (CPU_MLA skipped, named in the record) */
    {"head_size 600 = 536 + 64", ld_600, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_SELECT_NO_BACKEND,
     "CPU_MLA: head_size 600"},
    {"head_size 384 = 320 + 64", ld_384, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_SELECT_NO_BACKEND,
     "CPU_MLA: head_size 384"},
    {"rope 32, rank 544", ld_rope32, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_SELECT_NO_BACKEND,
     "kv_lora_rank 544 + qk_rope_head_dim 32"},
    /* head_size != kv_lora_rank + qk_rope_head_dim */
    {"kv_lora_rank 500 of head_size 576", ld_rank500, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
     "head_size 576 is not kv_lora_rank 500"},
    {"head_size 320 with kv_lora_rank 512", ld_head320, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
     "head_size 320 is not"},
    /* MLA dimensions out of range (a fuzzer input: INT_MAX + 64 overflowed in the default
       scale before this was checked) */
    {"qk_nope_head_dim INT_MAX", ld_nope_max, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
     "qk_nope_head_dim 2147483647"},
    {"v_head_dim 65537", ld_v_65537, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC, "v_head_dim 65537"},
    {"qk_rope_head_dim INT_MAX", ld_rope_max, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
     "qk_rope_head_dim 2147483647"},
    {"kv_lora_rank -1", ld_rank_neg, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC, "kv_lora_rank -1"},
    {"two KV heads", ld_kv_heads, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC, "num_kv_heads is 2"},
    /* features MLA does not have */
    {"ALiBi", ld_alibi, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_SELECT_NO_BACKEND, "CPU_MLA: ALiBi not supported"},
    {"sliding window", ld_window, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_SELECT_NO_BACKEND,
     "CPU_MLA: sliding_window 128"},
    {"soft cap", ld_soft_cap, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_SELECT_NO_BACKEND, "CPU_MLA: logits_soft_cap"},
    {"non-causal", ld_non_causal, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_SELECT_NO_BACKEND, "CPU_MLA: non-causal"},
    /* an explicit backend of the other kind */
    {"explicit CPU_MLA for a standard layer", ld_std_on_cpu_mla, ATTN_ERROR_BACKEND_UNAVAILABLE,
     ATTN_LOG_SELECT_EXPLICIT_FAILED, "the layer is not MLA"},
    {"explicit CPU for an MLA layer", ld_mla_on_cpu, ATTN_ERROR_BACKEND_UNAVAILABLE,
     ATTN_LOG_SELECT_EXPLICIT_FAILED, "the layer is MLA"},
};

/* Whether the last error on ctx holds piece (a failure names the case). */
static void expect_message(const attn_context *ctx, const char *piece, const char *what) {
    const char *err = attn_context_last_error(ctx);
    if (piece && !strstr(err, piece))
        attn_test_fail(__FILE__, __LINE__, "%s: last error \"%s\" lacks \"%s\"", what, err, piece);
}
/* Whether log holds item at ERROR (a failure names the case). */
static void expect_item(const attn_test_log *log, attn_log_item item, const char *what) {
    if (!attn_test_log_has(log, item, ATTN_LOG_LEVEL_ERROR))
        attn_test_fail(__FILE__, __LINE__, "%s: no ERROR line with item %d", what, (int)item);
}

ATTN_TEST(test_mla_reject_layers) {
    attn_test_log cap;
    attn_context *ctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 2);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_select_request req;
    attn_selection sel;
    int i, found;
    REQUIRE(ctx != NULL);
    for (i = 0; i < (int)(sizeof layer_cases / sizeof layer_cases[0]); i++) {
        const layer_case *k = &layer_cases[i];
        attn_status st;
        d = mla_desc(16, 576, 512);
        memset(&req, 0, sizeof req);
        k->edit(&d, &req);
        attn_test_log_reset(&cap);
        layer = NULL;
        st = attn_layer_create(ctx, &d, req.backend != ATTN_BACKEND_AUTO ? &req : NULL, &layer);
        if (st != k->status)
            attn_test_fail(__FILE__, __LINE__, "%s: got %s, expected %s", k->what, attn_status_string(st),
                           attn_status_string(k->status));
        if (layer) attn_test_fail(__FILE__, __LINE__, "%s: a layer came back", k->what);
        expect_item(&cap, k->item, k->what);
        expect_message(ctx, k->message, k->what);
        attn_layer_destroy(layer);
    }

    /* the refused selection's record: each candidate skipped at DEBUG, CPU_MLA named */
    d = mla_desc(16, 600, 536);
    attn_test_log_reset(&cap);
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_UNSUPPORTED);
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_CANDIDATE_SKIPPED, ATTN_LOG_LEVEL_DEBUG));
    memset(&sel, 0, sizeof sel);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &sel), ATTN_ERROR_UNSUPPORTED);
    EXPECT_EQ_INT(sel.resolved, ATTN_BACKEND_AUTO);
    EXPECT_EQ_INT(sel.use_mla, 1);
    found = 0;
    for (i = 0; i < sel.num_skipped; i++) found |= sel.skipped[i].backend == ATTN_BACKEND_CPU_MLA;
    EXPECT_TRUE(found);

    /* with fallback an explicit CPU serves through the automatic choice, with a WARN */
    d = mla_desc(16, 576, 512);
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CPU;
    req.allow_fallback = 1;
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_layer_create(ctx, &d, &req, &layer));
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_FALLBACK, ATTN_LOG_LEVEL_WARN));
    if (layer) EXPECT_EQ_INT(attn_layer_backend(layer)->id, ATTN_BACKEND_CPU_MLA);
    attn_layer_destroy(layer);
    layer = NULL;
    /* explicit CPU_MLA for an MLA layer works; the default too, logged once at INFO */
    req.backend = ATTN_BACKEND_CPU_MLA;
    req.allow_fallback = 0;
    EXPECT_OK(attn_layer_create(ctx, &d, &req, &layer));
    attn_layer_destroy(layer);
    layer = NULL;
    d.dtype = ATTN_DTYPE_BF16; /* a descriptor not in the selection cache yet */
    attn_test_log_reset(&cap);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_SELECT_RESOLVED, ATTN_LOG_LEVEL_INFO));
    if (layer) {
        const attn_layer_desc *e = attn_layer_get_desc(layer);
        EXPECT_EQ_INT(e->num_kv_heads, 1);
        EXPECT_EQ_INT(e->qk_nope_head_dim, 128);
        EXPECT_EQ_INT(e->v_head_dim, 128);
        EXPECT_NEAR(e->scale, 1.0 / sqrt(192.0), 1e-7, 1e-6);
        EXPECT_EQ_INT(attn_layer_selection(layer)->use_mla, 1);
    }
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* ---- calls ---------------------------------------------------------------------------- */

/* The world the calls run against: an MLA layer of 8 heads (576 wide) with a decode over 40
   keys and a prefill of 5 over 20, built; a standard layer of 8 heads (64 wide) on its own
   context with a built one-token batch; an MLA layer of twice the heads; metadata of the
   world's layer left unbuilt, and one built without slot_mapping; buffers for q, out and
   LSE. */
enum { RJ_H = 8, RJ_R = 512, RJ_D = 576, RJ_ROWS = 8 };
#define RJ_STD_CACHE_ELEMS (2 * 2 * 16 * RJ_H * 64)
typedef struct reject_world {
    mworld w;
    attn_test_log log;      /* w's context */
    attn_context *std_ctx;  /* the standard layer's */
    attn_test_log std_log;
    attn_layer *std_layer, *wide_layer;
    attn_metadata *std_meta, *unbuilt_meta, *no_slots_meta;
    float q[RJ_ROWS * RJ_H * RJ_D]; /* inputs: finite */
    float out[RJ_ROWS * RJ_H * RJ_D], lse[RJ_ROWS * RJ_H]; /* poisoned before each call */
    float *cache_copy;
    float std_cache[RJ_STD_CACHE_ELEMS];
} reject_world;

/* The call a row edits: its kind and every argument any kind takes, valid as built by
   call_baseline. An argument is passed as NULL where its bit is in nulls. */
typedef enum call_kind {
    CALL_MQA, CALL_MHA, CALL_FUSED, CALL_CACHE_WRITE, CALL_MLA_INFO, CALL_METADATA_CREATE,
    CALL_PARALLELISM, CALL_LAYER_FORWARD, CALL_RESHAPE_AND_CACHE, CALL_MERGE, CALL_REORDER
} call_kind;
enum {
    NUL_Q_PE = 1, NUL_K_PE = 2, NUL_OUT = 4, NUL_LSE = 8, NUL_LSE_A = 16, NUL_LAYER = 32, NUL_ND = 64, NUL_PERM = 128
};
typedef struct mla_call {
    call_kind kind;
    unsigned nulls;
    attn_context *ctx; /* merge */
    attn_layer *layer;
    attn_metadata *meta;
    attn_tensor q, q_pe, kv_c, k_pe, cache, w_uk, w_uv, out, lse;
    attn_tensor out_b, lse_b; /* merge: (q, lse_a) and (out_b, lse_b) into (out, lse) */
    attn_tensor lse_a;
    attn_lse_base base_a, base_b, base_out;
    int64_t slots[3];
    int num_slots;
    attn_metadata_desc md;
    attn_metadata *created;
    int resident_items, heads_per_item;
    int32_t query_lens[2], perm[2];
    int num_reqs, decode_threshold, num_decodes, num_swaps;
} mla_call;

#define ARG(a, t, bit) (((a)->nulls & (bit)) ? NULL : &(a)->t)

static attn_status call_run(mla_call *a) {
    attn_layer *layer = (a->nulls & NUL_LAYER) ? NULL : a->layer;
    attn_mla_info info;
    switch (a->kind) {
    case CALL_MQA:
        return attn_mla_forward_mqa(layer, a->meta, &a->q, ARG(a, q_pe, NUL_Q_PE), &a->cache, ARG(a, out, NUL_OUT),
                                    ARG(a, lse, NUL_LSE), NULL);
    case CALL_MHA:
        return attn_mla_forward_mha(layer, a->meta, &a->q, &a->cache, &a->w_uk, &a->w_uv, ARG(a, out, NUL_OUT),
                                    ARG(a, lse, NUL_LSE), NULL);
    case CALL_FUSED:
        return attn_mla_forward(layer, a->meta, &a->q, &a->q_pe, &a->kv_c, ARG(a, k_pe, NUL_K_PE), &a->cache,
                                &a->w_uk, &a->w_uv, ARG(a, out, NUL_OUT), NULL);
    case CALL_CACHE_WRITE:
        return attn_concat_and_cache_mla(layer, &a->kv_c, &a->k_pe, &a->cache,
                                         ATTN_TEST_SLOTS(a->slots, a->num_slots), NULL);
    case CALL_MLA_INFO:
        return attn_metadata_mla_info(a->meta, &info);
    case CALL_METADATA_CREATE:
        return attn_metadata_create(layer, &a->md, &a->created);
    case CALL_PARALLELISM:
        return attn_layer_set_decode_parallelism(layer, a->resident_items, a->heads_per_item);
    case CALL_LAYER_FORWARD:
        return attn_layer_forward(layer, a->meta, &a->q, NULL, NULL, &a->cache, ARG(a, out, NUL_OUT), NULL, NULL);
    case CALL_RESHAPE_AND_CACHE:
        return attn_reshape_and_cache(layer, &a->q, &a->q, &a->cache, ATTN_TEST_SLOTS(a->slots, a->num_slots),
                                      NULL);
    case CALL_MERGE:
        return attn_merge_attn_states(a->ctx, &a->q, ARG(a, lse_a, NUL_LSE_A), a->base_a, &a->out_b, &a->lse_b,
                                      a->base_b, ARG(a, out, NUL_OUT), ARG(a, lse, NUL_LSE), a->base_out, NULL);
    case CALL_REORDER:
        return attn_reorder_batch(a->query_lens, a->num_reqs, a->decode_threshold,
                                  (a->nulls & NUL_PERM) ? NULL : a->perm, (a->nulls & NUL_ND) ? NULL : &a->num_decodes,
                                  &a->num_swaps);
    }
    return ATTN_ERROR_INVALID_VALUE;
}

/* A valid call of this kind on f (outputs poisoned, nothing written yet). */
static void call_baseline(mla_call *a, call_kind kind, reject_world *f) {
    mworld *w = &f->w;
    const int H = RJ_H, R = RJ_R, T = w->ntok;
    memset(a, 0, sizeof *a);
    a->kind = kind;
    a->layer = w->layer;
    a->meta = w->meta;
    a->cache = w->t_cache;
    a->w_uk = w->t_wuk;
    a->w_uv = w->t_wuv;
    poison(f->out, ATTN_DTYPE_F32, sizeof f->out / sizeof f->out[0]);
    poison(f->lse, ATTN_DTYPE_F32, sizeof f->lse / sizeof f->lse[0]);
    switch (kind) {
    case CALL_MQA: /* the one decode token: q [1, H, 576], out_latent [1, H, 512] */
        a->q = t3(f->q, ATTN_DTYPE_F32, 1, H, RJ_D);
        a->q_pe = t3(f->q, ATTN_DTYPE_F32, 1, H, 64);
        a->nulls = NUL_Q_PE;
        a->out = t3(f->out, ATTN_DTYPE_F32, 1, H, R);
        a->lse = t2(f->lse, 1, H);
        break;
    case CALL_MHA: /* the five prefill tokens */
        a->q = t3(f->q, ATTN_DTYPE_F32, 5, H, 192);
        a->out = t3(f->out, ATTN_DTYPE_F32, 5, H, 128);
        a->lse = t2(f->lse, 5, H);
        break;
    case CALL_FUSED: /* every token, writing the new ones */
        a->q = t3(w->qn_raw, ATTN_DTYPE_F32, T, H, 128);
        a->q_pe = t3(w->qp_raw, ATTN_DTYPE_F32, T, H, 64);
        a->kv_c = t2(w->kvc_raw, T, R);
        a->k_pe = t2(w->kpe_raw, T, 64);
        a->out = t3(f->out, ATTN_DTYPE_F32, T, H, 128);
        break;
    case CALL_CACHE_WRITE: /* three tokens into slots 0, 5, 7 */
        a->kv_c = t2(w->kvc_raw, 3, R);
        a->k_pe = t2(w->kpe_raw, 3, 64);
        a->slots[0] = 0;
        a->slots[1] = 5;
        a->slots[2] = 7;
        a->num_slots = 3;
        break;
    case CALL_MLA_INFO:
        break;
    case CALL_METADATA_CREATE:
        a->md.max_num_reqs = 4;
        a->md.max_num_tokens = 16;
        a->md.max_blocks_per_req = w->stride;
        a->md.num_blocks = w->nblocks;
        break;
    case CALL_PARALLELISM:
        a->resident_items = 8;
        a->heads_per_item = 16;
        break;
    case CALL_LAYER_FORWARD: /* a standard layer's decode: q, out [1, H, 64] */
    case CALL_RESHAPE_AND_CACHE:
        a->layer = f->std_layer;
        a->meta = f->std_meta;
        a->cache = attn_tensor_make(f->std_cache, ATTN_DTYPE_F32, 5, (int64_t[5]){2, 2, 16, H, 64});
        a->q = t3(f->q, ATTN_DTYPE_F32, 1, H, 64);
        a->out = t3(f->out, ATTN_DTYPE_F32, 1, H, 64);
        a->slots[0] = 0;
        a->num_slots = 1;
        break;
    case CALL_MERGE: /* two [3, 5, 40] partial states */
        a->ctx = w->ctx;
        a->q = t3(f->q, ATTN_DTYPE_F32, 3, 5, 40);
        a->out_b = t3(f->q + 600, ATTN_DTYPE_F32, 3, 5, 40);
        a->lse_a = t2(f->q + 1200, 3, 5);
        a->lse_b = t2(f->q + 1300, 3, 5);
        a->out = t3(f->out, ATTN_DTYPE_F32, 3, 5, 40);
        a->lse = t2(f->lse, 3, 5);
        break;
    case CALL_REORDER: /* a decode and a prefill */
        a->query_lens[0] = 1;
        a->query_lens[1] = 3;
        a->num_reqs = 2;
        a->perm[0] = 77;
        a->perm[1] = 77;
        a->num_decodes = 55;
        a->num_swaps = 55;
        break;
    }
}

/* The edits. */
static void e_q_575(mla_call *a, reject_world *f) { (void)f; a->q.shape[2] = 575; }
static void e_q_pe_with_full_q(mla_call *a, reject_world *f) { (void)f; a->nulls &= ~(unsigned)NUL_Q_PE; }
static void e_q_pe_32(mla_call *a, reject_world *f) {
    (void)f;
    a->q.shape[2] = RJ_R; /* q_latent */
    a->q_pe.shape[2] = 32;
    a->nulls &= ~(unsigned)NUL_Q_PE;
}
static void e_q_latent_alone(mla_call *a, reject_world *f) { (void)f; a->q.shape[2] = RJ_R; }
static void e_out_576(mla_call *a, reject_world *f) { (void)f; a->out.shape[2] = RJ_D; }
static void e_out_heads(mla_call *a, reject_world *f) { (void)f; a->out.shape[1] = RJ_H - 1; }
static void e_lse_heads(mla_call *a, reject_world *f) { (void)f; a->lse.shape[1] = RJ_H + 1; }
static void e_q_rows_0(mla_call *a, reject_world *f) { (void)f; a->q.shape[0] = 0; }
static void e_q_f16(mla_call *a, reject_world *f) { (void)f; a->q.dtype = ATTN_DTYPE_F16; }
static void e_cache_512(mla_call *a, reject_world *f) { (void)f; a->cache.shape[2] = 512; }
static void e_cache_blocks(mla_call *a, reject_world *f) { a->cache.shape[0] = f->w.nblocks - 1; }
static void e_wide_layer(mla_call *a, reject_world *f) {
    a->layer = f->wide_layer;
    a->q.shape[1] = 2 * RJ_H;
    a->out.shape[1] = 2 * RJ_H;
    a->nulls |= NUL_LSE;
}
static void e_std_meta(mla_call *a, reject_world *f) { a->meta = f->std_meta; }
static void e_std_layer(mla_call *a, reject_world *f) {
    a->layer = f->std_layer;
    a->meta = f->std_meta;
    a->cache = attn_tensor_make(f->std_cache, ATTN_DTYPE_F32, 5, (int64_t[5]){2, 2, 16, RJ_H, 64});
}
static void e_q_128(mla_call *a, reject_world *f) { (void)f; a->q.shape[2] = 128; }
static void e_q_4_rows(mla_call *a, reject_world *f) { (void)f; a->q.shape[0] = 4; }
static void e_w_uk_64(mla_call *a, reject_world *f) { (void)f; a->w_uk.shape[1] = 64; }
static void e_w_uv_64(mla_call *a, reject_world *f) { (void)f; a->w_uv.shape[2] = 64; }
static void e_out_192(mla_call *a, reject_world *f) { (void)f; a->out.shape[2] = 192; }
static void e_no_out(mla_call *a, reject_world *f) { (void)f; a->nulls |= NUL_OUT; }
static void e_no_k_pe(mla_call *a, reject_world *f) { (void)f; a->nulls |= NUL_K_PE; }
static void e_q_nope_64(mla_call *a, reject_world *f) { (void)f; a->q.shape[2] = 64; }
static void e_kv_c_k_pe_swapped(mla_call *a, reject_world *f) {
    attn_tensor t = a->kv_c;
    (void)f;
    a->kv_c = a->k_pe;
    a->k_pe = t;
}
static void e_no_slots_meta(mla_call *a, reject_world *f) { a->meta = f->no_slots_meta; }
static void e_slot_past_end(mla_call *a, reject_world *f) { a->slots[2] = (int64_t)f->w.nblocks * f->w.c.bs; }
static void e_slot_neg2(mla_call *a, reject_world *f) { (void)f; a->slots[2] = -2; }
static void e_kv_c_256(mla_call *a, reject_world *f) { (void)f; a->kv_c.shape[1] = 256; }
static void e_slots_neg_count(mla_call *a, reject_world *f) { (void)f; a->num_slots = -1; }
static void e_unbuilt_meta(mla_call *a, reject_world *f) { a->meta = f->unbuilt_meta; }
static void e_threshold_neg(mla_call *a, reject_world *f) { (void)f; a->md.decode_threshold = -1; }
static void e_splits_neg(mla_call *a, reject_world *f) { (void)f; a->md.num_kv_splits = -1; }
static void e_splits_1025(mla_call *a, reject_world *f) { (void)f; a->md.num_kv_splits = 1025; }
static void e_threshold_big(mla_call *a, reject_world *f) { (void)f; a->md.decode_threshold = (1 << 16) + 1; }
static void e_no_layer(mla_call *a, reject_world *f) { (void)f; a->nulls |= NUL_LAYER; }
static void e_resident_0(mla_call *a, reject_world *f) { (void)f; a->resident_items = 0; }
static void e_resident_big(mla_call *a, reject_world *f) { (void)f; a->resident_items = (1 << 20) + 1; }
static void e_heads_0(mla_call *a, reject_world *f) { (void)f; a->heads_per_item = 0; }
static void e_heads_4097(mla_call *a, reject_world *f) { (void)f; a->heads_per_item = 4097; }
static void e_mla_layer(mla_call *a, reject_world *f) {
    a->layer = f->w.layer;
    a->meta = f->w.meta;
    a->cache = f->w.t_cache;
}
static void e_b_narrow(mla_call *a, reject_world *f) { (void)f; a->out_b.shape[2] = 32; }
static void e_lse_b_heads(mla_call *a, reject_world *f) { (void)f; a->lse_b.shape[1] = 4; }
static void e_base_2(mla_call *a, reject_world *f) { (void)f; a->base_a = (attn_lse_base)2; }
static void e_no_lse_a(mla_call *a, reject_world *f) { (void)f; a->nulls |= NUL_LSE_A; }
static void e_a_f16(mla_call *a, reject_world *f) { (void)f; a->q.dtype = ATTN_DTYPE_F16; }
static void e_query_len_neg(mla_call *a, reject_world *f) { (void)f; a->query_lens[1] = -2; }
static void e_threshold_arg_neg(mla_call *a, reject_world *f) { (void)f; a->decode_threshold = -1; }
static void e_num_reqs_neg(mla_call *a, reject_world *f) { (void)f; a->num_reqs = -1; }
static void e_no_num_decodes(mla_call *a, reject_world *f) { (void)f; a->nulls |= NUL_ND; }
static void e_no_perm(mla_call *a, reject_world *f) { (void)f; a->nulls |= NUL_PERM; }

typedef struct call_case {
    const char *what;
    call_kind kind;
    void (*edit)(mla_call *a, reject_world *f);
    attn_status status;
    attn_log_item item;  /* logged at ERROR on the call's context (NONE: no context) */
    const char *message; /* in attn_context_last_error of that context */
} call_case;

#define SHAPE ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE
static const call_case call_cases[] = {
    /* forward_mqa: q, q_pe, out_latent, lse, cache shapes; the q dtype; the layer; metadata */
    {"mqa: q 575 wide", CALL_MQA, e_q_575, SHAPE, "q.shape[2] is 575"},
    {"mqa: q_pe beside a 576-wide q", CALL_MQA, e_q_pe_with_full_q, SHAPE, "q.shape[2] is 576"},
    {"mqa: q_pe 32 wide", CALL_MQA, e_q_pe_32, SHAPE, "q_pe.shape[2] is 32"},
    {"mqa: q_latent without q_pe", CALL_MQA, e_q_latent_alone, SHAPE, "q.shape[2] is 512"},
    {"mqa: out_latent 576 wide", CALL_MQA, e_out_576, SHAPE, "out_latent.shape[2] is 576"},
    {"mqa: out_latent of 7 heads", CALL_MQA, e_out_heads, SHAPE, "out_latent.shape[1] is 7"},
    {"mqa: lse of 9 heads", CALL_MQA, e_lse_heads, SHAPE, "lse.shape[1] is 9"},
    {"mqa: q of 0 rows", CALL_MQA, e_q_rows_0, SHAPE, "q.shape[0] is 0"},
    {"mqa: q f16 on an f32 layer", CALL_MQA, e_q_f16, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE,
     "q.dtype is f16"},
    {"mqa: cache 512 wide", CALL_MQA, e_cache_512, SHAPE, "kv_cache.shape[2] is 512"},
    {"mqa: cache of one block too few", CALL_MQA, e_cache_blocks, SHAPE, "kv_cache.shape[0] is 7"},
    {"mqa: layer of twice the heads", CALL_MQA, e_wide_layer, ATTN_ERROR_INVALID_METADATA,
     ATTN_LOG_METADATA_MISMATCH, "num_heads 8 (this layer: 16)"},
    {"mqa: standard metadata", CALL_MQA, e_std_meta, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_METADATA_MISMATCH,
     "use_mla 0 (this layer: 1)"},
    {"mqa: standard layer", CALL_MQA, e_std_layer, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
     "the layer is not MLA"},
    /* forward_mha */
    {"mha: q 128 wide", CALL_MHA, e_q_128, SHAPE, "q.shape[2] is 128"},
    {"mha: q of 4 rows for 5 prefill tokens", CALL_MHA, e_q_4_rows, SHAPE, "q.shape[0] is 4"},
    {"mha: w_uk of 64 rows", CALL_MHA, e_w_uk_64, SHAPE, "w_uk.shape[1] is 64"},
    {"mha: w_uv 64 wide", CALL_MHA, e_w_uv_64, SHAPE, "w_uv.shape[2] is 64"},
    {"mha: out 192 wide", CALL_MHA, e_out_192, SHAPE, "out.shape[2] is 192"},
    {"mha: no out", CALL_MHA, e_no_out, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL, "'out' is NULL"},
    {"mha: standard layer", CALL_MHA, e_std_layer, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
     "the layer is not MLA"},
    /* the fused call */
    {"fused: kv_c without k_pe", CALL_FUSED, e_no_k_pe, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL,
     "'k_pe' is NULL but 'kv_c' is not"},
    {"fused: q_nope 64 wide", CALL_FUSED, e_q_nope_64, SHAPE, "q_nope.shape[2] is 64"},
    {"fused: kv_c and k_pe swapped", CALL_FUSED, e_kv_c_k_pe_swapped, SHAPE, "kv_c.shape[1] is 64"},
    {"fused: metadata built without slot_mapping", CALL_FUSED, e_no_slots_meta, ATTN_ERROR_INVALID_METADATA,
     ATTN_LOG_INVALID_METADATA, "no slot_mapping"},
    /* concat_and_cache_mla: bad slots after valid ones write nothing */
    {"cache write: a slot past the cache", CALL_CACHE_WRITE, e_slot_past_end, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_INVALID_SLOT, "slot_mapping[2] is 128"},
    {"cache write: slot -2", CALL_CACHE_WRITE, e_slot_neg2, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_SLOT,
     "slot_mapping[2] is -2"},
    {"cache write: kv_c 256 wide", CALL_CACHE_WRITE, e_kv_c_256, SHAPE, "kv_c.shape[1] is 256"},
    {"cache write: -1 slots", CALL_CACHE_WRITE, e_slots_neg_count, SHAPE, "shape[0] -1"},
    {"cache write: standard layer", CALL_CACHE_WRITE, e_std_layer, ATTN_ERROR_UNSUPPORTED,
     ATTN_LOG_CALL_UNSUPPORTED, "the layer is not MLA"},
    /* metadata */
    {"mla_info: metadata never built", CALL_MLA_INFO, e_unbuilt_meta, ATTN_ERROR_INVALID_METADATA,
     ATTN_LOG_METADATA_MISMATCH, "has not been built"},
    {"mla_info: standard metadata", CALL_MLA_INFO, e_std_meta, ATTN_ERROR_UNSUPPORTED,
     ATTN_LOG_CALL_UNSUPPORTED, "belongs to a standard layer"},
    {"metadata: decode_threshold -1", CALL_METADATA_CREATE, e_threshold_neg, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_INVALID_DESC, "decode_threshold is -1"},
    {"metadata: num_kv_splits -1", CALL_METADATA_CREATE, e_splits_neg, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_INVALID_DESC, "num_kv_splits is -1"},
    {"metadata: num_kv_splits 1025", CALL_METADATA_CREATE, e_splits_1025, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_INVALID_DESC, "num_kv_splits is 1025"},
    {"metadata: decode_threshold 65537", CALL_METADATA_CREATE, e_threshold_big, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_INVALID_DESC, "decode_threshold is 65537"},
    /* attn_layer_set_decode_parallelism (the GPU split policy's hook) */
    {"parallelism: no layer", CALL_PARALLELISM, e_no_layer, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_NONE,
     "'layer' is NULL"},
    {"parallelism: resident_items 0", CALL_PARALLELISM, e_resident_0, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_INVALID_ARGUMENT, "resident_items is 0 (allowed: 1 .."},
    {"parallelism: resident_items 2^20 + 1", CALL_PARALLELISM, e_resident_big, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_INVALID_ARGUMENT, "resident_items is 1048577"},
    {"parallelism: heads_per_item 0", CALL_PARALLELISM, e_heads_0, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_INVALID_ARGUMENT, "heads_per_item is 0 (allowed: 1 .. 4096"},
    {"parallelism: heads_per_item 4097", CALL_PARALLELISM, e_heads_4097, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_INVALID_ARGUMENT, "heads_per_item is 4097"},
    /* the standard calls on an MLA layer */
    {"layer_forward: MLA layer", CALL_LAYER_FORWARD, e_mla_layer, ATTN_ERROR_UNSUPPORTED,
     ATTN_LOG_CALL_UNSUPPORTED, "the layer is MLA"},
    {"reshape_and_cache: MLA layer", CALL_RESHAPE_AND_CACHE, e_mla_layer, ATTN_ERROR_UNSUPPORTED,
     ATTN_LOG_CALL_UNSUPPORTED, "the layer is MLA"},
    /* attn_merge_attn_states */
    {"merge: b narrower", CALL_MERGE, e_b_narrow, SHAPE, "out_b.shape[2] is 32"},
    {"merge: lse_b of 4 heads", CALL_MERGE, e_lse_b_heads, SHAPE, "lse_b.shape[1] is 4"},
    {"merge: base_a 2", CALL_MERGE, e_base_2, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
     "LSE base is out of range (2"},
    {"merge: no lse_a", CALL_MERGE, e_no_lse_a, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL,
     "'lse_a' is NULL"},
    {"merge: a f16, b f32", CALL_MERGE, e_a_f16, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE,
     "out_b.dtype is f32"},
    /* attn_reorder_batch (no context) */
    {"reorder: query_len -2", CALL_REORDER, e_query_len_neg, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_NONE,
     "query_lens[1] is -2"},
    {"reorder: decode_threshold -1", CALL_REORDER, e_threshold_arg_neg, ATTN_ERROR_INVALID_VALUE,
     ATTN_LOG_NONE, "decode_threshold is -1"},
    {"reorder: num_reqs -1", CALL_REORDER, e_num_reqs_neg, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_NONE,
     "num_reqs is -1"},
    {"reorder: no num_decodes", CALL_REORDER, e_no_num_decodes, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_NONE,
     "'num_decodes' is NULL"},
    {"reorder: no perm", CALL_REORDER, e_no_perm, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_NONE, "'perm' is NULL"},
};
#undef SHAPE

/* Builds f; 0 (with everything freed and the failure recorded) if it cannot. */
static int reject_world_open(reject_world *f) {
    mcfg c;
    attn_layer_desc sd, wide;
    attn_metadata_desc md;
    attn_batch b;
    int x, ok;
    memset(f, 0, sizeof *f);
    base_cfg(&c, RJ_H, RJ_R, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.cap = &f->log;
    c.seed = 1111;
    add_req(&c, 1, 40);
    add_req(&c, 5, 20);
    if (!world_open(&f->w, &c, 0)) return 0;
    EXPECT_EQ_INT(f->w.info.num_decode_tokens, 1);
    f->std_ctx = attn_test_context(&f->std_log, ATTN_LOG_LEVEL_DEBUG, 2);
    f->cache_copy = (float *)xmalloc(f->w.cache_elems * sizeof(float));
    for (x = 0; x < RJ_ROWS * RJ_H * RJ_D; x++) f->q[x] = 0.01f * (float)((x % 13) + 1);
    /* the standard layer, its one-token batch built */
    memset(&sd, 0, sizeof sd);
    sd.num_heads = RJ_H;
    sd.head_size = 64;
    sd.dtype = ATTN_DTYPE_F32;
    ok = f->std_ctx && attn_layer_create(f->std_ctx, &sd, NULL, &f->std_layer) == ATTN_OK &&
         (f->std_meta = one_request_meta(f->std_layer, 1, 4)) != NULL;
    EXPECT_TRUE(ok);
    /* an MLA layer of twice the heads; the world layer's metadata unbuilt, and built
       without slot_mapping */
    wide = *attn_layer_get_desc(f->w.layer);
    wide.num_heads = 2 * RJ_H;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 4;
    md.max_num_tokens = 16;
    md.max_blocks_per_req = f->w.stride;
    md.num_blocks = f->w.nblocks;
    b = world_batch(&f->w);
    b.slot_mapping = NULL;
    ok = ok && attn_layer_create(f->w.ctx, &wide, NULL, &f->wide_layer) == ATTN_OK &&
         attn_metadata_create(f->w.layer, &md, &f->unbuilt_meta) == ATTN_OK &&
         attn_metadata_create(f->w.layer, &md, &f->no_slots_meta) == ATTN_OK &&
         attn_metadata_build(f->no_slots_meta, 0, &b, 0) == ATTN_OK;
    EXPECT_TRUE(ok);
    return ok;
}

static void reject_world_free(reject_world *f) {
    attn_metadata_destroy(f->std_meta);
    attn_metadata_destroy(f->unbuilt_meta);
    attn_metadata_destroy(f->no_slots_meta);
    attn_layer_destroy(f->std_layer);
    attn_layer_destroy(f->wide_layer);
    attn_context_destroy(f->std_ctx);
    free(f->cache_copy);
    world_free(&f->w);
}

/* Whether a refused call left everything as it was: outputs NaN, caches, counts. */
static void expect_nothing_changed(const reject_world *f, const mla_call *a, const char *what) {
    size_t x;
    for (x = 0; x < sizeof f->out / sizeof f->out[0]; x++)
        if (f->out[x] == f->out[x]) {
            attn_test_fail(__FILE__, __LINE__, "%s: out[%zu] written", what, x);
            break;
        }
    for (x = 0; x < sizeof f->lse / sizeof f->lse[0]; x++)
        if (f->lse[x] == f->lse[x]) {
            attn_test_fail(__FILE__, __LINE__, "%s: lse[%zu] written", what, x);
            break;
        }
    if (memcmp(f->cache_copy, f->w.cache, f->w.cache_elems * sizeof(float)))
        attn_test_fail(__FILE__, __LINE__, "%s: the MLA cache changed", what);
    if (!attn_test_all_bytes(f->std_cache, sizeof f->std_cache, 0))
        attn_test_fail(__FILE__, __LINE__, "%s: the standard cache changed", what);
    if (a->created) attn_test_fail(__FILE__, __LINE__, "%s: a metadata came back", what);
    if (a->num_decodes != (a->kind == CALL_REORDER ? 55 : 0) || (a->kind == CALL_REORDER && a->perm[0] != 77))
        attn_test_fail(__FILE__, __LINE__, "%s: num_decodes or perm written", what);
}

ATTN_TEST(test_mla_reject_calls) {
    static reject_world f; /* large: not on the stack */
    attn_test_env saved = attn_test_env_save("ATTN_LOG_LEVEL");
    mla_call a;
    int i;
    if (!reject_world_open(&f)) {
        reject_world_free(&f);
        attn_test_env_restore(&saved);
        return;
    }
    setenv("ATTN_LOG_LEVEL", "none", 1); /* lines without a context would go to stderr */
    for (i = 0; i < (int)(sizeof call_cases / sizeof call_cases[0]); i++) {
        const call_case *k = &call_cases[i];
        const attn_context *ctx;
        const attn_test_log *log;
        attn_status st;
        call_baseline(&a, k->kind, &f);
        k->edit(&a, &f);
        /* the context (and log) the call reports on */
        ctx = a.kind == CALL_REORDER || (a.nulls & NUL_LAYER) ? NULL
              : a.kind == CALL_MERGE                         ? a.ctx
              : a.layer == f.std_layer || (a.kind == CALL_MLA_INFO && a.meta == f.std_meta) ? f.std_ctx
                                                                                          : f.w.ctx;
        log = !ctx ? NULL : ctx == f.std_ctx ? &f.std_log : &f.log;
        memcpy(f.cache_copy, f.w.cache, f.w.cache_elems * sizeof(float));
        attn_test_log_reset(&f.log);
        attn_test_log_reset(&f.std_log);
        st = call_run(&a);
        if (st != k->status)
            attn_test_fail(__FILE__, __LINE__, "%s: got %s, expected %s", k->what, attn_status_string(st),
                           attn_status_string(k->status));
        if (k->item != ATTN_LOG_NONE && log) expect_item(log, k->item, k->what);
        if (k->item != ATTN_LOG_NONE && !log)
            attn_test_fail(__FILE__, __LINE__, "%s: a log item expected of a call without context", k->what);
        expect_message(ctx, k->message, k->what);
        expect_nothing_changed(&f, &a, k->what);
        attn_metadata_destroy(a.created);
    }
    attn_test_env_restore(&saved);

    /* the baselines run: every row above was refused for its edit alone */
    for (i = CALL_MQA; i <= CALL_REORDER; i++) {
        call_baseline(&a, (call_kind)i, &f);
        if (call_run(&a) != ATTN_OK)
            attn_test_fail(__FILE__, __LINE__, "baseline of call kind %d: %s", i, attn_context_last_error(
                                                   a.kind == CALL_REORDER ? NULL
                                                   : a.layer == f.std_layer ? f.std_ctx : f.w.ctx));
        if (i == CALL_MQA) { /* and wrote out_latent */
            int x;
            for (x = 0; x < RJ_H * RJ_R; x++)
                if (!is_finite(f.out[x])) {
                    attn_test_fail(__FILE__, __LINE__, "out_latent[%d] not written", x);
                    break;
                }
        }
        attn_metadata_destroy(a.created);
    }

    /* concat_and_cache_mla: -1 skips; the others land */
    call_baseline(&a, CALL_CACHE_WRITE, &f);
    a.slots[0] = -1;
    a.slots[1] = 3;
    a.slots[2] = -1;
    memcpy(f.cache_copy, f.w.cache, f.w.cache_elems * sizeof(float));
    EXPECT_OK(call_run(&a));
    {
        const float *cache = (const float *)f.w.cache, *kvc = (const float *)f.w.kvc_raw,
                    *kpe = (const float *)f.w.kpe_raw;
        int x, same = 1;
        EXPECT_TRUE(memcmp(f.cache_copy, cache, (size_t)3 * RJ_D * sizeof(float)) == 0);
        for (x = 0; x < RJ_R; x++) same &= cache[(size_t)3 * RJ_D + x] == kvc[RJ_R + x];
        for (x = 0; x < 64; x++) same &= cache[(size_t)3 * RJ_D + RJ_R + x] == kpe[64 + x];
        EXPECT_TRUE(same);
        EXPECT_TRUE(memcmp(f.cache_copy + (size_t)4 * RJ_D, cache + (size_t)4 * RJ_D,
                           (f.w.cache_elems - (size_t)4 * RJ_D) * sizeof(float)) == 0);
    }

    /* a second layer of the same shape may share the metadata, and agrees bitwise */
    {
        attn_layer *twin = NULL;
        attn_layer_desc od = *attn_layer_get_desc(f.w.layer);
        float o1[RJ_H * RJ_R];
        EXPECT_OK(attn_layer_create(f.w.ctx, &od, NULL, &twin));
        if (twin) {
            call_baseline(&a, CALL_MQA, &f);
            a.nulls |= NUL_LSE;
            EXPECT_OK(call_run(&a));
            memcpy(o1, f.out, sizeof o1);
            call_baseline(&a, CALL_MQA, &f);
            a.nulls |= NUL_LSE;
            a.layer = twin;
            EXPECT_OK(call_run(&a));
            EXPECT_TRUE(memcmp(o1, f.out, sizeof o1) == 0);
        }
        attn_layer_destroy(twin);
    }
    reject_world_free(&f);
}

/* attn_layer_set_decode_parallelism on a CPU layer (its refusals: the table above): the
   split count stays the CPU's. */
ATTN_TEST(test_mla_decode_parallelism_checked) {
    mcfg c;
    mworld w;
    attn_metadata *m2;
    attn_mla_info after;
    base_cfg(&c, 16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.seed = 1212;
    add_req(&c, 1, 3000);
    add_req(&c, 1, 700);
    REQUIRE(world_open(&w, &c, 0));
    EXPECT_OK(attn_layer_set_decode_parallelism(w.layer, 1, 1));
    m2 = world_meta(&w, 0, NULL);
    EXPECT_TRUE(m2 != NULL);
    if (m2) {
        EXPECT_OK(attn_metadata_mla_info(m2, &after));
        EXPECT_EQ_INT(after.num_kv_splits, w.info.num_kv_splits); /* the CPU's policy */
        EXPECT_TRUE(w.info.num_kv_splits >= 1);
    }
    attn_metadata_destroy(m2);
    world_free(&w);
}

void suite_mla_reject(void) {
    ATTN_RUN(test_mla_reject_layers);
    ATTN_RUN(test_mla_reject_calls);
    ATTN_RUN(test_mla_decode_parallelism_checked);
}
