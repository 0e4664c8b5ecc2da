/* Run-time compilation (NVRTC needs no GPU): compile, memory and disk cache hits, damaged
   and unwritable caches, bad arguments, compile errors with the log, one compile for many
   threads. SKIPs where no NVRTC library can be loaded. */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#ifndef ATTN_NO_THREADS
#include <pthread.h>
#endif

static int nv_dir_count;

/* A fresh cache directory name under /tmp for this process. */
static void nv_dir(char *buf, size_t size) {
    snprintf(buf, size, "/tmp/attn-test-kcache-%ld-%d", (long)getpid(), nv_dir_count++);
}

static attn_context *nv_ctx(attn_test_log *log, const char *dir) {
    attn_context_desc cd;
    attn_context *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 1;
    cd.log = attn_test_log_hook;
    cd.log_user_data = log;
    cd.log_level = ATTN_LOG_LEVEL_DEBUG;
    cd.kernel_cache_dir = dir;
    if (log) attn_test_log_reset(log);
    attn_context_create(&cd, &ctx);
    return ctx;
}

/* NULL when NVRTC loads here; else the reason (the caller SKIPs). */
static const char *nv_unavailable(attn_context *ctx) {
    static attn_platform p;
    if (!ctx || attn_platform_get(ctx, &p) != ATTN_OK) return "no context";
    return p.nvrtc_version ? NULL : p.nvrtc_reason;
}

static void nv_rm(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* best effort */ }
}

/* The one .cubin file in dir (path into buf); 0 if none or several. */
static int nv_cubin_file(const char *dir, char *buf, size_t size) {
    DIR *d = opendir(dir);
    struct dirent *ent;
    int n = 0;
    if (!d) return 0;
    while ((ent = readdir(d)) != NULL) {
        size_t k = strlen(ent->d_name);
        if (k > 6 && strcmp(ent->d_name + k - 6, ".cubin") == 0) {
            snprintf(buf, size, "%s/%s", dir, ent->d_name);
            n++;
        }
    }
    closedir(d);
    return n == 1;
}

ATTN_TEST(nvrtc_compile_and_cache) {
    attn_test_log log;
    int compiled_registers = 0;
    char dir[128];
    attn_kernel_info info;
    attn_context *ctx;
    const char *why;
    nv_dir(dir, sizeof dir);
    ctx = nv_ctx(&log, dir);
    if ((why = nv_unavailable(ctx)) != NULL) {
        attn_context_destroy(ctx);
        SKIP(why);
    }
    memset(&info, 0, sizeof info);
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "-DATTN_TEST_VARIANT=1", "sm_80", &info));
    EXPECT_EQ_INT(info.source, ATTN_KERNEL_COMPILED);
    EXPECT_TRUE(info.cubin_bytes > 0);
    /* the ptxas report (--ptxas-options=-v) is parsed from the NVRTC log: where a build of
       NVRTC puts none there (seen on one GPU host), the fields stay 0 and we say so */
    if (strstr(info.log, "ptxas info"))
        EXPECT_TRUE(info.registers > 0);
    else
        printf("  note: this NVRTC's log has no ptxas report; registers/spills read as 0\n");
    compiled_registers = info.registers;
    EXPECT_EQ_INT(info.spill_stores, 0);
    EXPECT_EQ_INT(info.spill_loads, 0);
    EXPECT_TRUE(strcmp(info.arch, "sm_80") == 0 && strcmp(info.kernel, "util.cu") == 0);
    EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_KERNEL_COMPILED, ATTN_LOG_LEVEL_INFO));
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), 1);
    /* again: from memory */
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "-DATTN_TEST_VARIANT=1", "sm_80", &info));
    EXPECT_EQ_INT(info.source, ATTN_KERNEL_FROM_MEMORY);
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), 1);
    /* another arch and another define are other variants */
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "-DATTN_TEST_VARIANT=1", "sm_90", &info));
    EXPECT_EQ_INT(info.source, ATTN_KERNEL_COMPILED);
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "-DATTN_TEST_VARIANT=2", "sm_80", NULL));
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), 3);
    attn_context_destroy(ctx);

    /* a new context: from disk, no compile */
    ctx = nv_ctx(&log, dir);
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "-DATTN_TEST_VARIANT=1", "sm_80", &info));
    EXPECT_EQ_INT(info.source, ATTN_KERNEL_FROM_DISK);
    EXPECT_EQ_INT(info.registers, compiled_registers); /* the report travels with the file */
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), 0);
    EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_KERNEL_CACHE_HIT, ATTN_LOG_LEVEL_DEBUG));
    attn_context_destroy(ctx);
    nv_rm(dir);
}

/* A truncated file and a garbage file are rebuilt with one WARN each. */
ATTN_TEST(nvrtc_damaged_cache_files) {
    attn_test_log log;
    char dir[128], file[400];
    attn_kernel_info info;
    attn_context *ctx;
    const char *why;
    int round;
    nv_dir(dir, sizeof dir);
    ctx = nv_ctx(&log, dir);
    if ((why = nv_unavailable(ctx)) != NULL) {
        attn_context_destroy(ctx);
        SKIP(why);
    }
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "", "sm_80", &info));
    attn_context_destroy(ctx);
    EXPECT_TRUE(nv_cubin_file(dir, file, sizeof file));
    for (round = 0; round < 3; round++) {
        FILE *f;
        if (round == 0) { /* truncate */
            long len;
            char *buf;
            f = fopen(file, "rb");
            if (!f) break;
            fseek(f, 0, SEEK_END);
            len = ftell(f);
            fseek(f, 0, SEEK_SET);
            buf = (char *)malloc((size_t)len);
            if (buf && fread(buf, 1, (size_t)len, f) == (size_t)len) {
                fclose(f);
                f = fopen(file, "wb");
                if (f) fwrite(buf, 1, (size_t)len / 2, f);
            }
            free(buf);
            if (f) fclose(f);
        } else if (round == 1) { /* garbage of the same length class */
            int i;
            f = fopen(file, "wb");
            if (!f) break;
            for (i = 0; i < 4096; i++) fputc((i * 37) & 0xff, f);
            fclose(f);
        } else { /* one flipped byte in the payload: the checksum catches it */
            long len;
            f = fopen(file, "r+b");
            if (!f) break;
            fseek(f, 0, SEEK_END);
            len = ftell(f);
            fseek(f, len - 10, SEEK_SET);
            fputc(0x5a ^ 0xff, f);
            fclose(f);
        }
        ctx = nv_ctx(&log, dir);
        EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "", "sm_80", &info));
        EXPECT_EQ_INT(info.source, ATTN_KERNEL_COMPILED);
        EXPECT_EQ_INT(log.by_level[ATTN_LOG_LEVEL_WARN], 1);
        EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_KERNEL_CACHE_FAULT, ATTN_LOG_LEVEL_WARN));
        attn_context_destroy(ctx);
        /* rebuilt: the next context reads it */
        ctx = nv_ctx(&log, dir);
        EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "", "sm_80", &info));
        EXPECT_EQ_INT(info.source, ATTN_KERNEL_FROM_DISK);
        EXPECT_EQ_INT(log.by_level[ATTN_LOG_LEVEL_WARN], 0);
        attn_context_destroy(ctx);
    }
    nv_rm(dir);
}

/* An unusable directory: one WARN, kernels kept in memory. "off": no disk at all. */
ATTN_TEST(nvrtc_unwritable_and_off) {
    attn_test_log log;
    char path[128];
    attn_kernel_info info;
    attn_context *ctx;
    const char *why;
    FILE *f;
    nv_dir(path, sizeof path);
    f = fopen(path, "w"); /* a file where the directory should be */
    if (f) fclose(f);
    ctx = nv_ctx(&log, path);
    if ((why = nv_unavailable(ctx)) != NULL) {
        attn_context_destroy(ctx);
        remove(path);
        SKIP(why);
    }
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "-DA=1", "sm_80", &info));
    EXPECT_EQ_INT(info.source, ATTN_KERNEL_COMPILED);
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "-DA=2", "sm_80", &info));
    EXPECT_EQ_INT(log.by_level[ATTN_LOG_LEVEL_WARN], 1);
    EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_KERNEL_CACHE_FAULT, ATTN_LOG_LEVEL_WARN));
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "-DA=1", "sm_80", &info));
    EXPECT_EQ_INT(info.source, ATTN_KERNEL_FROM_MEMORY);
    attn_context_destroy(ctx);
    remove(path);
    ctx = nv_ctx(&log, "off");
    EXPECT_OK(attn_kernel_compile(ctx, "util.cu", "-DA=3", "sm_80", &info));
    EXPECT_EQ_INT(info.source, ATTN_KERNEL_COMPILED);
    EXPECT_EQ_INT(log.by_level[ATTN_LOG_LEVEL_WARN], 0);
    attn_context_destroy(ctx);
}

ATTN_TEST(nvrtc_bad_arguments_and_compile_errors) {
    attn_test_log log;
    attn_kernel_info info;
    attn_context *ctx = nv_ctx(&log, "off");
    const char *why;
    static const char *const bad_arch[] = {"sm80", "sm_8", "sm_9x", "compute_90", "", "sm_1000", "sm_90ab"};
    int i;
    if ((why = nv_unavailable(ctx)) != NULL) {
        attn_context_destroy(ctx);
        SKIP(why);
    }
    EXPECT_STATUS(attn_kernel_compile(NULL, "util.cu", "", "sm_80", &info), ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_STATUS(attn_kernel_compile(ctx, NULL, "", "sm_80", &info), ATTN_ERROR_NULL_ARGUMENT);
    EXPECT_STATUS(attn_kernel_compile(ctx, "util.cu", "", NULL, &info), ATTN_ERROR_NULL_ARGUMENT);
    for (i = 0; i < (int)(sizeof bad_arch / sizeof bad_arch[0]); i++)
        EXPECT_STATUS(attn_kernel_compile(ctx, "util.cu", "", bad_arch[i], &info), ATTN_ERROR_INVALID_VALUE);
    EXPECT_STATUS(attn_kernel_compile(ctx, "nope.cu", "", "sm_80", &info), ATTN_ERROR_INVALID_VALUE);
    /* an option NVRTC refuses: the status carries its log */
    attn_test_log_reset(&log);
    EXPECT_STATUS(attn_kernel_compile(ctx, "util.cu", "--no-such-option", "sm_80", &info), ATTN_ERROR_PLATFORM);
    EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_KERNEL_COMPILE_FAILED, ATTN_LOG_LEVEL_ERROR));
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "no-such-option") != NULL);
    /* a define that breaks the source: the compiler's error is in the message */
    EXPECT_STATUS(attn_kernel_compile(ctx, "util.cu", "-Duint4=int", "sm_80", &info),
                  ATTN_ERROR_PLATFORM);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "error") != NULL);
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), 0);
    attn_context_destroy(ctx);
}

#ifndef ATTN_NO_THREADS
typedef struct nv_thread_arg {
    attn_context *ctx;
    attn_status st;
    attn_kernel_info info;
} nv_thread_arg;

static void *nv_thread(void *varg) {
    nv_thread_arg *a = (nv_thread_arg *)varg;
    a->st = attn_kernel_compile(a->ctx, "util.cu", "-DATTN_TEST_THREADS=1", "sm_90", &a->info);
    return NULL;
}
#endif

/* Eight threads asking for one variant at once: one compile, eight equal answers. */
ATTN_TEST(nvrtc_one_compile_for_many_threads) {
#ifdef ATTN_NO_THREADS
    SKIP("built without threads (ATTN_NO_THREADS)");
#else
    attn_test_log log;
    attn_context *ctx = nv_ctx(&log, "off");
    const char *why;
    nv_thread_arg args[8];
    pthread_t th[8];
    int i, compiled = 0;
    if ((why = nv_unavailable(ctx)) != NULL) {
        attn_context_destroy(ctx);
        SKIP(why);
    }
    for (i = 0; i < 8; i++) {
        memset(&args[i], 0, sizeof args[i]);
        args[i].ctx = ctx;
        pthread_create(&th[i], NULL, nv_thread, &args[i]);
    }
    for (i = 0; i < 8; i++) pthread_join(th[i], NULL);
    for (i = 0; i < 8; i++) {
        EXPECT_OK(args[i].st);
        EXPECT_TRUE(args[i].info.cubin_bytes == args[0].info.cubin_bytes && args[i].info.cubin_bytes > 0);
        compiled += args[i].info.source == ATTN_KERNEL_COMPILED;
    }
    EXPECT_EQ_INT(compiled, 1);
    EXPECT_EQ_INT(attn_kernel_compile_count(ctx), 1);
    attn_context_destroy(ctx);
#endif
}

void suite_nvrtc(void) {
    ATTN_RUN(nvrtc_compile_and_cache);
    ATTN_RUN(nvrtc_damaged_cache_files);
    ATTN_RUN(nvrtc_unwritable_and_off);
    ATTN_RUN(nvrtc_bad_arguments_and_compile_errors);
    ATTN_RUN(nvrtc_one_compile_for_many_threads);
}
