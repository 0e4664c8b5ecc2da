/* fixtures.h - what several test files share: a logger that records lines instead of
   printing them, and a context that logs into it.

       attn_test_log log;
       attn_context *ctx = attn_test_context(&log, ATTN_LOG_LEVEL_DEBUG, 2);
       ... EXPECT_EQ_INT(log.by_level[ATTN_LOG_LEVEL_ERROR], 1); ...
       attn_test_log_reset(&log);   // start counting again

   Include after attn.h and attn_test.h. The implementation is compiled where
   ATTN_TEST_IMPLEMENTATION is defined (tests/main.c). */
#ifndef ATTN_TEST_FIXTURES_H
#define ATTN_TEST_FIXTURES_H

#define ATTN_TEST_LOG_LEVELS 6 /* ATTN_LOG_LEVEL_DEFAULT .. ATTN_LOG_LEVEL_NONE */

/* What a context logged since the last reset. A line whose item or level is outside its
   enum counts in total and bad_item only. */
typedef struct attn_test_log {
    int total;
    int bad_item;
    int by_level[ATTN_TEST_LOG_LEVELS];
    int by_item[ATTN_LOG_ITEM_COUNT];
    int by_item_level[ATTN_LOG_ITEM_COUNT][ATTN_TEST_LOG_LEVELS];
    attn_log_item last_item;
    attn_log_level last_level;
    char resolved_line[800]; /* the message of the last SELECT_RESOLVED line */
} attn_test_log;

/* The logger hook; user_data is an attn_test_log, or NULL to drop every line. */
void attn_test_log_hook(void *user_data, attn_log_level level, attn_log_item item,
                        const char *message);
void attn_test_log_reset(attn_test_log *log);
/* Whether a line with this item was logged at this level. */
int attn_test_log_has(const attn_test_log *log, attn_log_item item, attn_log_level level);

/* A context with `threads` worker threads (0: the default) whose lines at or above
   `level` go to log (NULL: nowhere). The lines of the creation itself are dropped. A
   failure to create counts as a failed check and returns NULL. */
attn_context *attn_test_context(attn_test_log *log, attn_log_level level, int threads);

#ifdef _POSIX_C_SOURCE /* setenv: in the test files that define it */
#include <stdlib.h>
#include <string.h>
/* An environment variable saved before a test changes it and put back after:
       attn_test_env e = attn_test_env_save("ATTN_BATCH_INVARIANT");
       setenv("ATTN_BATCH_INVARIANT", "1", 1); ... attn_test_env_restore(&e); */
typedef struct attn_test_env {
    const char *name;
    char *value; /* NULL: was unset */
} attn_test_env;

static inline attn_test_env attn_test_env_save(const char *name) {
    attn_test_env e;
    const char *v = getenv(name);
    e.name = name;
    e.value = NULL;
    if (v) {
        size_t n = strlen(v) + 1;
        e.value = (char *)malloc(n);
        if (e.value) memcpy(e.value, v, n);
    }
    return e;
}

static inline void attn_test_env_restore(attn_test_env *e) {
    if (e->value) setenv(e->name, e->value, 1);
    else unsetenv(e->name);
    free(e->value);
    e->value = NULL;
}
#endif

/* The address of a host slot-mapping view over n slots, for a cache write's argument
   (a C99 compound literal: it lives to the end of the enclosing block). */
#define ATTN_TEST_SLOTS(s, n) (&(attn_tensor[1]){attn_tensor_slots((s), (n))}[0])

/* Whether all n bytes at p are b (an output a refused call must not have touched). */
static inline int attn_test_all_bytes(const void *p, size_t n, unsigned char b) {
    const unsigned char *c = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++)
        if (c[i] != b) return 0;
    return 1;
}

/* Element i of an f32 / f16 / bf16 array, written from or read as f32 (RNE for 16-bit). */
static inline void attn_test_put(void *p, attn_dtype dt, size_t i, float x) {
    if (dt == ATTN_DTYPE_F32) ((float *)p)[i] = x;
    else if (dt == ATTN_DTYPE_BF16) ((uint16_t *)p)[i] = attn_f32_to_bf16(x);
    else ((uint16_t *)p)[i] = attn_f32_to_f16(x);
}
static inline float attn_test_get(const void *p, attn_dtype dt, size_t i) {
    if (dt == ATTN_DTYPE_F32) return ((const float *)p)[i];
    if (dt == ATTN_DTYPE_BF16) return attn_bf16_to_f32(((const uint16_t *)p)[i]);
    return attn_f16_to_f32(((const uint16_t *)p)[i]);
}

/* A device copy of `bytes` of host memory (host NULL: left uninitialised; at least one byte
   is allocated), or NULL on failure (the context's last error says why). */
static inline void *attn_test_device_copy(attn_context *ctx, const void *host, size_t bytes) {
    void *d = NULL;
    if (attn_cuda_malloc(ctx, bytes ? bytes : 1, &d) != ATTN_OK) return NULL;
    if (host && bytes && attn_cuda_memcpy(ctx, d, host, bytes, ATTN_COPY_HOST_TO_DEVICE, NULL) != ATTN_OK) {
        attn_cuda_free(ctx, d);
        return NULL;
    }
    return d;
}

/* 8-bit KV-cache types (fp8_e4m3, fp8_e5m2, int8): one byte an element. */
static inline int attn_test_is_8bit(attn_dtype dt) {
    return dt == ATTN_DTYPE_FP8_E4M3 || dt == ATTN_DTYPE_FP8_E5M2 || dt == ATTN_DTYPE_INT8;
}
/* What an fp8 cache with a per-tensor scale holds for x, read back: code(x / scale) * scale
   (the library's cache write and dequantization); x unchanged for other types. */
static inline float attn_test_fp8_value(attn_dtype dt, float scale, float x) {
    if (dt == ATTN_DTYPE_FP8_E4M3) return attn_fp8_e4m3_to_f32(attn_f32_to_fp8_e4m3(x / scale)) * scale;
    if (dt == ATTN_DTYPE_FP8_E5M2) return attn_fp8_e5m2_to_f32(attn_f32_to_fp8_e5m2(x / scale)) * scale;
    return x;
}

#endif

#ifdef ATTN_TEST_IMPLEMENTATION
#include <string.h>

void attn_test_log_hook(void *user_data, attn_log_level level, attn_log_item item,
                        const char *message) {
    attn_test_log *c = (attn_test_log *)user_data;
    if (!c) return;
    c->total++;
    if ((int)level < 0 || (int)level >= ATTN_TEST_LOG_LEVELS || (int)item < 0 ||
        (int)item >= (int)ATTN_LOG_ITEM_COUNT) {
        c->bad_item++;
        return;
    }
    c->by_level[level]++;
    c->by_item[item]++;
    c->by_item_level[item][level]++;
    c->last_item = item;
    c->last_level = level;
    if (item == ATTN_LOG_SELECT_RESOLVED && message) {
        strncpy(c->resolved_line, message, sizeof c->resolved_line - 1);
        c->resolved_line[sizeof c->resolved_line - 1] = 0;
    }
}

void attn_test_log_reset(attn_test_log *log) { memset(log, 0, sizeof *log); }

int attn_test_log_has(const attn_test_log *log, attn_log_item item, attn_log_level level) {
    if ((int)item < 0 || (int)item >= (int)ATTN_LOG_ITEM_COUNT || (int)level < 0 ||
        (int)level >= ATTN_TEST_LOG_LEVELS)
        return 0;
    return log->by_item_level[item][level] > 0;
}

attn_context *attn_test_context(attn_test_log *log, attn_log_level level, int threads) {
    attn_context_desc cd;
    attn_context *ctx = NULL;
    attn_status st;
    memset(&cd, 0, sizeof cd);
    cd.log = attn_test_log_hook;
    cd.log_user_data = log;
    cd.log_level = level;
    cd.num_threads = threads;
    st = attn_context_create(&cd, &ctx);
    if (st != ATTN_OK)
        attn_test_fail(__FILE__, __LINE__, "attn_context_create (%d threads): %s: %s", threads,
                       attn_status_string(st), attn_context_last_error(NULL));
    if (log) attn_test_log_reset(log);
    return ctx;
}
#endif
