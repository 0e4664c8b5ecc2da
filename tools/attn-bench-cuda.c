#define _POSIX_C_SOURCE 200809L
/* attn-bench-cuda: the CUDA backends of attn.h on a GPU, against the device's own ceilings
   measured in the same run. Public API only: attn.h's attn_* functions and types (no
   private, double-underscore name), device tensors from attn_cuda_malloc, the selection
   record of each layer, the log hook, and ATTN_KERNEL_DEFINES (the supported tuning seam,
   read at layer creation). The ceilings are this tool's own: it opens the CUDA driver,
   NVRTC and cuBLAS itself (dlopen, no CUDA header) and works in the device's primary
   context, the one attn.h uses, so attn_cuda_malloc's pointers and the legacy stream are
   shared. Timing and the result table: tools/bench_common.h. `attn-bench --device cuda
   ...` runs this binary with the same arguments. Without a GPU (or without NVRTC) it
   prints one SKIP line with the reason and exits 0; `make nvrtc-check` compiles every
   kernel variant without a GPU.

   1. Compile times, through layer creation itself, in a fresh kernel-cache directory:
        cold  - attn_layer_create of five layer configurations; every kernel variant NVRTC
                compiles on the way is reported by the log hook (ATTN_LOG_KERNEL_COMPILED:
                file, options, arch) and its figures read back with attn_kernel_compile
                (from the context's memory: NVRTC time, registers, shared memory, spills,
                CUBIN size); the variant's NVRTC time is the per-variant figure;
        warm  - a fresh context on the same directory: per layer, the whole
                attn_layer_create (disk + module load + configuration read-back), after the
                context's first GPU call (reported on its own line).
   2. The ceilings of the same run: read bandwidth (attn_read_probe of kernels/util.cu,
      compiled by this tool's NVRTC, over 4 GiB, best of 10, again after the tables), the
      bf16 tensor-core rate (cuBLAS GEMM 8192^3, best of 10) and the launch floor (an empty
      kernel, back to back); then the backend through the public API (attn_layer_forward on
      device tensors, its own scheduler and split-KV), 32/8 heads, head 128, bf16, block 16:
        decode   batch 1/16/64/128 x context 1k/4k/16k, GB/s of K+V against the read;
        8-bit    the same decode over fp8 e4m3 / e5m2 (per tensor) and int8 / e4m3 (per
                 token and head) caches, against the bf16 times; their prefill 4 x 4096;
        prefill  causal, batch 4 x 4096 and 1 x 16384, TFLOP/s of the causal-useful pairs
                 against the matmul rate;
        mixed    vLLM's chunked prefill: one chunk of 2048 over 8192 cached tokens with 64
                 decodes of 4096, against the sum of its parts timed alone.
   3. MLA (DeepSeek-V3's latent cache, bf16, pages of 64): decode through
      attn_mla_forward_mqa at 16 and 128 heads, batch 1/16/64/128 x context 1k/4k/16k; the
      fused attn_mla_forward on one shape; the prefill shape through attn_mla_forward_mha;
      an fp8 latent against the bf16 times.
   Each case rotates over pre-built metadata sets on disjoint shuffled block sets of a
   16 GiB (MLA: 12 GiB) cache (>= 256 MiB per rotation for decode, 5x the L2), timed with
   CUDA events over back-to-back forwards; median of 11 groups. --csv FILE writes the rows.
   Not shown any more: the decode schedule (work items, merges, wide tiles), which attn.h
   keeps private (no public query of a built metadata's schedule).

   Build: make build/attn-bench-cuda.  Usage: attn-bench-cuda [--quick]
   [--case decode|prefill|mla|wide|host|all] [--csv FILE] [--mla-backend NAME]
   (wide: the head-512 table alone, cuda_wide_table) */
#define ATTN_IMPLEMENTATION
#include "attn.h"

#include <dlfcn.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"

#define BENCH_MIN(a, b) ((a) < (b) ? (a) : (b))
#define BENCH_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---------------------------------------------------------------------------------------
   The CUDA driver, NVRTC and cuBLAS, opened by this tool (the subset it calls, declared
   here as cuew/volk do: opaque handles as void *, CUdevice and CUresult as int)
   ------------------------------------------------------------------------------------- */

#ifndef ATTN_CUDA_DRIVER_LIBRARY
#define ATTN_CUDA_DRIVER_LIBRARY "libcuda.so.1"
#endif
#ifndef ATTN_NVRTC_LIBRARY
#define ATTN_NVRTC_LIBRARY "libnvrtc.so.13"
#endif
#ifndef ATTN_CUBLAS_LIBRARY
#define ATTN_CUBLAS_LIBRARY "libcublas.so.13"
#endif

#define BENCH_DRIVER_FUNCTIONS(X)                                                            \
    X(cuInit, "cuInit", (unsigned flags))                                                    \
    X(cuDeviceGet, "cuDeviceGet", (int *device, int ordinal))                                \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (void **context, int device))    \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (int device))               \
    X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", (void *context))                              \
    X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", (void **context))                               \
    X(cuGetErrorString, "cuGetErrorString", (int error, const char **text))                  \
    X(cuModuleLoadData, "cuModuleLoadData", (void **module, const void *image))              \
    X(cuModuleUnload, "cuModuleUnload", (void *module))                                      \
    X(cuModuleGetFunction, "cuModuleGetFunction", (void **function, void *module, const char *name)) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", \
      (int *blocks, void *function, int block_size, size_t dynamic_shared))                  \
    X(cuLaunchKernel, "cuLaunchKernel",                                                      \
      (void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,      \
       unsigned bz, unsigned shared, void *stream, void **params, void **extra))             \
    X(cuEventCreate, "cuEventCreate", (void **event, unsigned flags))                        \
    X(cuEventRecord, "cuEventRecord", (void *event, void *stream))                           \
    X(cuEventSynchronize, "cuEventSynchronize", (void *event))                               \
    X(cuEventElapsedTime, "cuEventElapsedTime", (float *ms, void *start, void *end))         \
    X(cuEventDestroy, "cuEventDestroy_v2", (void *event))                                     \
    X(cuStreamCreate, "cuStreamCreate", (void **stream, unsigned flags))                     \
    X(cuStreamDestroy, "cuStreamDestroy_v2", (void *stream))                                 \
    X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", (void *stream, int mode))             \
    X(cuStreamEndCapture, "cuStreamEndCapture", (void *stream, void **graph))                \
    X(cuGraphInstantiate, "cuGraphInstantiateWithFlags", (void **exec, void *graph, unsigned long long flags)) \
    X(cuGraphLaunch, "cuGraphLaunch", (void *exec, void *stream))                            \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", (void *exec))                                \
    X(cuGraphDestroy, "cuGraphDestroy", (void *graph))

#define BENCH_NVRTC_FUNCTIONS(X)                                                             \
    X(nvrtcCreateProgram, "nvrtcCreateProgram",                                              \
      (void **program, const char *source, const char *name, int num_headers,               \
       const char *const *headers, const char *const *include_names))                        \
    X(nvrtcDestroyProgram, "nvrtcDestroyProgram", (void **program))                          \
    X(nvrtcCompileProgram, "nvrtcCompileProgram", (void *program, int num_options, const char *const *options)) \
    X(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", (void *program, size_t *size))       \
    X(nvrtcGetProgramLog, "nvrtcGetProgramLog", (void *program, char *log))                  \
    X(nvrtcGetCUBINSize, "nvrtcGetCUBINSize", (void *program, size_t *size))                 \
    X(nvrtcGetCUBIN, "nvrtcGetCUBIN", (void *program, char *cubin))

#define BENCH_CUBLAS_FUNCTIONS(X)                                                            \
    X(cublasCreate, "cublasCreate_v2", (void **handle))                                      \
    X(cublasDestroy, "cublasDestroy_v2", (void *handle))                                     \
    X(cublasSetStream, "cublasSetStream_v2", (void *handle, void *stream))                   \
    X(cublasGemmStridedBatchedEx, "cublasGemmStridedBatchedEx",                              \
      (void *handle, int transa, int transb, int m, int n, int k, const void *alpha,         \
       const void *a, int a_type, int lda, long long stride_a, const void *b, int b_type,   \
       int ldb, long long stride_b, const void *beta, void *c, int c_type, int ldc,          \
       long long stride_c, int batch_count, int compute_type, int algo))

#define BENCH_CUDA_R_16BF 14          /* cudaDataType CUDA_R_16BF */
#define BENCH_CUBLAS_COMPUTE_32F 68   /* cublasComputeType_t CUBLAS_COMPUTE_32F */
#define BENCH_CUBLAS_GEMM_DEFAULT (-1)
#define BENCH_CUBLAS_OP_N 0

#define BENCH_POINTER(field, symbol, params) int (*field) params;
typedef struct {
    void *library;
    BENCH_DRIVER_FUNCTIONS(BENCH_POINTER)
} bench_driver;
typedef struct {
    void *library;
    BENCH_NVRTC_FUNCTIONS(BENCH_POINTER)
} bench_nvrtc;
typedef struct {
    void *library;
    char reason[256];       /* why it is not loaded, else "" */
    BENCH_CUBLAS_FUNCTIONS(BENCH_POINTER)
} bench_cublas;
#undef BENCH_POINTER

/* One symbol into its slot (memcpy: ISO C has no cast from object to function pointer). */
static int bench_symbol(void *library, const char *soname, const char *name, void *slot, size_t size,
                        char *why, size_t why_size) {
    void *p = dlsym(library, name);
    if (!p) {
        snprintf(why, why_size, "%s has no symbol %s", soname, name);
        return 0;
    }
    memcpy(slot, &p, size);
    return 1;
}

/* The first of `sonames` (NULL-ended) that opens; for NVRTC also the toolkit's lib64 under
   $CUDA_HOME, $CUDA_PATH and /usr/local/cuda. *opened: the name it opened under. */
static void *bench_open(const char *const *sonames, int toolkit, char *opened, size_t size) {
    const char *dirs[3];
    size_t nd = 0, d;
    int i;
    void *lib;
    for (i = 0; sonames[i]; i++)
        if ((lib = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL)) != NULL) {
            snprintf(opened, size, "%s", sonames[i]);
            return lib;
        }
    if (!toolkit) return NULL;
    if (getenv("CUDA_HOME")) dirs[nd++] = getenv("CUDA_HOME");
    if (getenv("CUDA_PATH")) dirs[nd++] = getenv("CUDA_PATH");
    dirs[nd++] = "/usr/local/cuda";
    for (d = 0; d < nd; d++)
        for (i = 0; sonames[i]; i++) {
            snprintf(opened, size, "%s/lib64/%s", dirs[d], sonames[i]);
            if ((lib = dlopen(opened, RTLD_NOW | RTLD_LOCAL)) != NULL) return lib;
        }
    return NULL;
}

/* kernels/util.cu, one string per line: build/util_cu.inc, made by the Makefile from the
   file the library embeds too, so the read probe is the library's own, compiled here. */
static const char *const util_cu_lines[] = {
#include "util_cu.inc"
    NULL};

/* The tool's hold on the device: the driver, the primary context pushed on this thread,
   the probes of kernels/util.cu, two events, cuBLAS, a stream for CUDA-graph capture. */
typedef struct {
    bench_driver cu;
    bench_nvrtc nvrtc;
    bench_cublas blas;
    int device, pushed;
    void *primary;
    void *probes, *read_probe, *fill_u32; /* module and its kernels */
    void *e0, *e1;
    void *stream;                         /* non-blocking: graphs are captured and replayed on it */
} bench_gpu;

static bench_gpu gpu;

/* A driver call that must succeed: else the call's name and the driver's text, exit 1. */
static void cu_check(int rc, const char *call) {
    const char *text = NULL;
    if (rc == 0) return;
    if (gpu.cu.cuGetErrorString) gpu.cu.cuGetErrorString(rc, &text);
    fprintf(stderr, "attn-bench-cuda: %s failed (CUresult %d: %s)\n", call, rc, text ? text : "unknown");
    exit(1);
}
#define CU(call) cu_check((call), #call)

/* Compiles kernels/util.cu for this device with the tool's NVRTC and loads it. */
static int gpu_load_probes(int major, int minor, char *why, size_t size) {
    static const char *const sonames[] = {ATTN_NVRTC_LIBRARY, "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
    char opened[600], arch[64], *source, *log = NULL, *cubin = NULL;
    const char *options[1];
    size_t n = 1, k, log_size = 0, cubin_size = 0;
    void *program = NULL;
    int i, ok = 0, rc;
    if (!(gpu.nvrtc.library = bench_open(sonames, 1, opened, sizeof opened))) {
        snprintf(why, size, "NVRTC not found (%s, libnvrtc.so.12, libnvrtc.so; also under $CUDA_HOME/lib64)",
                 ATTN_NVRTC_LIBRARY);
        return 0;
    }
#define BENCH_LOAD(field, symbol, params) \
    if (!bench_symbol(gpu.nvrtc.library, opened, symbol, &gpu.nvrtc.field, sizeof gpu.nvrtc.field, why, size)) return 0;
    BENCH_NVRTC_FUNCTIONS(BENCH_LOAD)
#undef BENCH_LOAD
    for (i = 0; util_cu_lines[i]; i++) n += strlen(util_cu_lines[i]);
    source = (char *)bench_alloc(n);
    for (i = 0, k = 0; util_cu_lines[i]; i++) {
        memcpy(source + k, util_cu_lines[i], strlen(util_cu_lines[i]));
        k += strlen(util_cu_lines[i]);
    }
    source[k] = '\0';
    snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d%d", major, minor);
    options[0] = arch;
    if ((rc = gpu.nvrtc.nvrtcCreateProgram(&program, source, "util.cu", 0, NULL, NULL)) != 0) {
        snprintf(why, size, "nvrtcCreateProgram failed (nvrtcResult %d)", rc);
        program = NULL;
    } else if ((rc = gpu.nvrtc.nvrtcCompileProgram(program, 1, options)) != 0) {
        if (gpu.nvrtc.nvrtcGetProgramLogSize(program, &log_size) == 0 && log_size > 0 &&
            (log = (char *)calloc(log_size + 1, 1)) != NULL && gpu.nvrtc.nvrtcGetProgramLog(program, log) != 0)
            log[0] = '\0'; /* no log after all */
        snprintf(why, size, "NVRTC could not compile kernels/util.cu for sm_%d%d (nvrtcResult %d): %s", major, minor,
                 rc, log ? log : "(no log)");
    } else if ((rc = gpu.nvrtc.nvrtcGetCUBINSize(program, &cubin_size)) != 0 || cubin_size == 0 ||
               !(cubin = (char *)malloc(cubin_size)) || (rc = gpu.nvrtc.nvrtcGetCUBIN(program, cubin)) != 0) {
        snprintf(why, size, "no CUBIN from NVRTC for kernels/util.cu (nvrtcResult %d)", rc);
    } else {
        CU(gpu.cu.cuModuleLoadData(&gpu.probes, cubin));
        CU(gpu.cu.cuModuleGetFunction(&gpu.read_probe, gpu.probes, "attn_read_probe"));
        CU(gpu.cu.cuModuleGetFunction(&gpu.fill_u32, gpu.probes, "attn_fill_u32"));
        ok = 1;
    }
    if (program) gpu.nvrtc.nvrtcDestroyProgram(&program);
    free(log);
    free(cubin);
    free(source);
    return ok;
}

/* cuBLAS for the matmul ceiling; a missing library is a reason, not a failure. */
static void gpu_load_cublas(void) {
    static const char *const sonames[] = {ATTN_CUBLAS_LIBRARY, "libcublas.so.13", "libcublas.so.12", "libcublas.so", NULL};
    char opened[600];
    if (!(gpu.blas.library = bench_open(sonames, 1, opened, sizeof opened))) {
        snprintf(gpu.blas.reason, sizeof gpu.blas.reason, "no cuBLAS (%s, libcublas.so.12, libcublas.so not found)",
                 ATTN_CUBLAS_LIBRARY);
        return;
    }
#define BENCH_LOAD(field, symbol, params)                                                                      \
    if (!bench_symbol(gpu.blas.library, opened, symbol, &gpu.blas.field, sizeof gpu.blas.field, gpu.blas.reason, \
                      sizeof gpu.blas.reason)) {                                                               \
        dlclose(gpu.blas.library);                                                                            \
        gpu.blas.library = NULL;                                                                               \
        return;                                                                                                \
    }
    BENCH_CUBLAS_FUNCTIONS(BENCH_LOAD)
#undef BENCH_LOAD
}

/* The driver, device 0's primary context (the one attn.h retains: its pointers and the
   legacy stream are the same) pushed on this thread, the probes, the events, cuBLAS.
   Returns 0 with the reason when any of the first three is missing. */
static int gpu_open(const attn_platform *plat, char *why, size_t size) {
    static const char *const sonames[] = {ATTN_CUDA_DRIVER_LIBRARY, "libcuda.so.1", "libcuda.so", NULL};
    char opened[600];
    memset(&gpu, 0, sizeof gpu);
    if (!(gpu.cu.library = bench_open(sonames, 0, opened, sizeof opened))) {
        snprintf(why, size, "the CUDA driver (%s) cannot be opened: %s", ATTN_CUDA_DRIVER_LIBRARY, dlerror());
        return 0;
    }
#define BENCH_LOAD(field, symbol, params) \
    if (!bench_symbol(gpu.cu.library, opened, symbol, &gpu.cu.field, sizeof gpu.cu.field, why, size)) return 0;
    BENCH_DRIVER_FUNCTIONS(BENCH_LOAD)
#undef BENCH_LOAD
    CU(gpu.cu.cuInit(0));
    CU(gpu.cu.cuDeviceGet(&gpu.device, 0));
    CU(gpu.cu.cuDevicePrimaryCtxRetain(&gpu.primary, gpu.device));
    CU(gpu.cu.cuCtxPushCurrent(gpu.primary));
    gpu.pushed = 1;
    if (!gpu_load_probes(plat->cuda_capability_major, plat->cuda_capability_minor, why, size)) return 0;
    CU(gpu.cu.cuEventCreate(&gpu.e0, 0));
    CU(gpu.cu.cuEventCreate(&gpu.e1, 0));
    CU(gpu.cu.cuStreamCreate(&gpu.stream, 1 /* CU_STREAM_NON_BLOCKING */));
    gpu_load_cublas();
    return 1;
}

/* Everything gpu_open took, in reverse (cuBLAS and NVRTC stay open: other users in the
   process, attn.h among them, hold the same libraries). */
static void gpu_close(void) {
    void *popped = NULL;
    if (gpu.e0) CU(gpu.cu.cuEventDestroy(gpu.e0));
    if (gpu.e1) CU(gpu.cu.cuEventDestroy(gpu.e1));
    if (gpu.stream) CU(gpu.cu.cuStreamDestroy(gpu.stream));
    if (gpu.probes) CU(gpu.cu.cuModuleUnload(gpu.probes));
    if (gpu.pushed) CU(gpu.cu.cuCtxPopCurrent(&popped));
    if (gpu.primary) CU(gpu.cu.cuDevicePrimaryCtxRelease(gpu.device));
    gpu.e0 = gpu.e1 = gpu.probes = gpu.primary = gpu.stream = NULL;
    gpu.pushed = 0;
}

/* Milliseconds between the two events, after the second completes. */
static float gpu_elapsed_ms(void) {
    float ms = 0;
    CU(gpu.cu.cuEventSynchronize(gpu.e1));
    CU(gpu.cu.cuEventElapsedTime(&ms, gpu.e0, gpu.e1));
    return ms;
}

/* ---------------------------------------------------------------------------------------
   1. Compile times, through attn_layer_create in a fresh kernel-cache directory; the
   variants it compiles come from the log hook (ATTN_LOG_KERNEL_COMPILED)
   ------------------------------------------------------------------------------------- */

static int cuda_mla_only; /* --case mla: the ceilings and the MLA table only */
static int cuda_decode_only; /* --case decode: the decode tables (bf16, 8-bit) only */

typedef struct {
    const char *name;
    int heads, kv_heads, head_size, block_size;
    attn_dtype dtype;
    int window;
    float softcap;
} cuda_layer_cfg;

static const cuda_layer_cfg cuda_cfgs[] = {
    {"32/8 h128 bf16 (decode table)", 32, 8, 128, 16, ATTN_DTYPE_BF16, 0, 0.0f},
    {"32/8 h128 f16", 32, 8, 128, 16, ATTN_DTYPE_F16, 0, 0.0f},
    {"64/8 h64 bf16 block 32", 64, 8, 64, 32, ATTN_DTYPE_BF16, 0, 0.0f},
    {"16/16 h256 bf16", 16, 16, 256, 16, ATTN_DTYPE_BF16, 0, 0.0f},
    {"32/4 h128 f32 window soft-cap", 32, 4, 128, 16, ATTN_DTYPE_F32, 4096, 30.0f},
};
#define CUDA_NUM_CFGS ((int)(sizeof cuda_cfgs / sizeof cuda_cfgs[0]))

static attn_layer_desc cuda_desc(const cuda_layer_cfg *c) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.num_heads = c->heads;
    d.num_kv_heads = c->kv_heads;
    d.head_size = c->head_size;
    d.block_size = c->block_size;
    d.dtype = c->dtype;
    d.kv_cache_dtype = c->dtype;
    d.sliding_window = c->window;
    d.logits_soft_cap = c->softcap;
    d.device = ATTN_DEVICE_CUDA;
    return d;
}

/* A kernel variant NVRTC compiled, as the log line names it: "compiled kernel FILE
   [OPTIONS] for ARCH in N ms (...)". */
typedef struct {
    char file[64], options[1024], arch[16];
    double nvrtc_ms; /* from the line (attn_kernel_info.compile_ms replaces it when read back) */
    int complete;    /* the whole line parsed: FILE, OPTIONS and ARCH are exact */
} compiled_variant;

#define MAX_COMPILED 256
static compiled_variant compiled[MAX_COMPILED];
static int num_compiled;
static pthread_mutex_t compiled_lock = PTHREAD_MUTEX_INITIALIZER;

/* Copies [from, to) into dst (size bytes). */
static void copy_span(char *dst, size_t size, const char *from, const char *to) {
    size_t n = (size_t)(to - from);
    if (n >= size) n = size - 1;
    memcpy(dst, from, n);
    dst[n] = '\0';
}

static void parse_compiled(const char *m, compiled_variant *v) {
    static const char head[] = "compiled kernel ";
    const char *p = strstr(m, head), *q, *r;
    memset(v, 0, sizeof *v);
    snprintf(v->file, sizeof v->file, "?");
    if (!p) return;
    p += sizeof head - 1;
    if (!(q = strstr(p, " ["))) return;
    copy_span(v->file, sizeof v->file, p, q);
    q += 2;
    if (!(r = strstr(q, "] for "))) return;
    copy_span(v->options, sizeof v->options, q, r);
    r += 6;
    if (!(q = strstr(r, " in "))) return;
    copy_span(v->arch, sizeof v->arch, r, q);
    v->complete = sscanf(q, " in %lf ms (", &v->nvrtc_ms) == 1;
}

/* The log hook: collects compiled variants; WARN and ERROR lines go to stderr as the
   library's default logger writes them; other lines are dropped. */
static void bench_log(void *user_data, attn_log_level level, attn_log_item item, const char *message) {
    (void)user_data;
    if (item == ATTN_LOG_KERNEL_COMPILED) {
        pthread_mutex_lock(&compiled_lock);
        if (num_compiled < MAX_COMPILED) parse_compiled(message, &compiled[num_compiled++]);
        pthread_mutex_unlock(&compiled_lock);
        return;
    }
    if (level == ATTN_LOG_LEVEL_ERROR || level == ATTN_LOG_LEVEL_WARN)
        fprintf(stderr, "attn: %s: %s\n", level == ATTN_LOG_LEVEL_ERROR ? "ERROR" : "WARN", message);
}

/* A context on cache_dir (NULL: the default) whose log hook sees the compiles (INFO). */
static attn_context *cuda_bench_context(const char *cache_dir) {
    attn_context_desc cd;
    attn_context *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    cd.log = bench_log;
    cd.log_level = ATTN_LOG_LEVEL_INFO;
    cd.kernel_cache_dir = cache_dir;
    CHECK(NULL, attn_context_create(&cd, &ctx));
    return ctx;
}

static void rm_dir(const char *dir) {
    DIR *dp = opendir(dir);
    struct dirent *e;
    char path[1024];
    if (!dp) return;
    while ((e = readdir(dp)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove(path);
    }
    closedir(dp);
    rmdir(dir);
}

/* Cold compile per variant, warm start per layer (on a GPU: attn_layer_create needs one). */
static void cuda_compile_times(const attn_platform *plat, int quick) {
    char dir[512];
    const char *tmp = getenv("TMPDIR");
    int c, k, n_cold = 0, n_nvrtc_cached = 0, any90a = 0, rounds = quick ? 1 : 3, r;
    double cold_max = 0, cold_sum = 0, warm_max = 0, t0, first_call = 0, ctx_create;
    attn_context *ctx;

    snprintf(dir, sizeof dir, "%s/attn-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "attn-bench-cuda: cannot make a kernel-cache directory under %s\n", tmp ? tmp : "/tmp");
        exit(1);
    }
    printf("NVRTC %d.%d, kernels for sm_%d%d (this GPU); kernel cache: %s (fresh)\n", plat->nvrtc_version / 1000,
           plat->nvrtc_version % 1000 / 10, plat->cuda_capability_major, plat->cuda_capability_minor, dir);
    printf("cold compile, per layer and per variant (attn_layer_create in the fresh cache; the variants NVRTC "
           "compiled, from the log hook, figures read back with attn_kernel_compile):\n");
    ctx = cuda_bench_context(dir);
    num_compiled = 0;
    for (c = 0; c < CUDA_NUM_CFGS; c++) {
        attn_layer_desc d = cuda_desc(&cuda_cfgs[c]);
        attn_layer *layer = NULL;
        int first = num_compiled;
        double t;
        t0 = now_s();
        CHECK(ctx, attn_layer_create(ctx, &d, NULL, &layer));
        t = now_s() - t0;
        printf("  %-34s backend %s: attn_layer_create %.0f ms wall, %d variants compiled%s\n", cuda_cfgs[c].name,
               attn_layer_backend(layer)->name, t * 1e3, num_compiled - first,
               num_compiled == first ? " (every variant shared with an earlier layer: from memory)" : "");
        for (k = first; k < num_compiled; k++) {
            compiled_variant *v = &compiled[k];
            attn_kernel_info info;
            int have = 0;
            memset(&info, 0, sizeof info);
            /* from the context's memory: the figures of the compile that made it (an
               incomplete line is not looked up: its options might compile something new) */
            if (v->complete) have = attn_kernel_compile(ctx, v->file, v->options, v->arch, &info) == ATTN_OK;
            if (have) v->nvrtc_ms = info.compile_ms;
            if (have && !strstr(info.log, "ptxas")) {
                /* NVRTC 12.9+ keeps a cache of its own: a program it has compiled before on
                   this machine comes back fast and without the ptxas report. Not cold. */
                n_nvrtc_cached++;
                printf("    %-21s %-7s %6.0f ms: served by NVRTC's own cache (no ptxas report); not counted as "
                       "cold  [%s]\n", v->file, v->arch, v->nvrtc_ms, v->options);
                continue;
            }
            n_cold++;
            cold_sum += v->nvrtc_ms;
            if (v->nvrtc_ms > cold_max) cold_max = v->nvrtc_ms;
            if (v->arch[0] && v->arch[strlen(v->arch) - 1] == 'a') any90a = 1;
            if (have)
                printf("    %-21s %-7s NVRTC %6.0f ms, %3d registers, %5d B shared, spills %d/%d B, cubin %zu KiB  [%s]\n",
                       v->file, v->arch, v->nvrtc_ms, info.registers, info.shared_bytes, info.spill_stores,
                       info.spill_loads, info.cubin_bytes / 1024, v->options);
            else
                printf("    %-21s %-7s NVRTC %6.0f ms (its figures could not be read back)  [%s]\n", v->file, v->arch,
                       v->nvrtc_ms, v->options);
        }
        attn_layer_destroy(layer);
    }
    attn_context_destroy(ctx);
    printf("  %d variants compiled cold: %.0f ms the slowest, %.0f ms the mean (NVRTC time; target <= 2000 ms per "
           "variant)%s\n", n_cold, cold_max, cold_sum / (n_cold ? n_cold : 1),
           n_nvrtc_cached ? "; the others came from NVRTC's own cache (run with a fresh HOME for all cold)" : "");

    printf("warm start, per layer (a fresh context on the same cache directory; %d rounds, the slowest shown):\n",
           rounds);
    {
        double warm[CUDA_NUM_CFGS];
        int compiles = 0;
        for (c = 0; c < CUDA_NUM_CFGS; c++) warm[c] = 0;
        for (r = 0; r < rounds; r++) {
            attn_layer *layers[CUDA_NUM_CFGS];
            void *p = NULL;
            t0 = now_s();
            ctx = cuda_bench_context(dir);
            ctx_create = now_s() - t0;
            t0 = now_s(); /* the context's first GPU call: driver start, primary context */
            CHECK(ctx, attn_cuda_malloc(ctx, 256, &p));
            CHECK(ctx, attn_cuda_free(ctx, p));
            first_call = now_s() - t0;
            for (c = 0; c < CUDA_NUM_CFGS; c++) {
                attn_layer_desc d = cuda_desc(&cuda_cfgs[c]);
                double t;
                layers[c] = NULL;
                t0 = now_s();
                CHECK(ctx, attn_layer_create(ctx, &d, NULL, &layers[c]));
                t = now_s() - t0;
                if (t > warm[c]) warm[c] = t;
            }
            compiles += attn_kernel_compile_count(ctx);
            for (c = 0; c < CUDA_NUM_CFGS; c++) attn_layer_destroy(layers[c]);
            attn_context_destroy(ctx);
            if (r == 0) {
                printf("  attn_context_create %.1f ms\n", ctx_create * 1e3);
                printf("  the context's first GPU call (driver, primary context) %.1f ms, once per process\n",
                       first_call * 1e3);
            }
        }
        for (c = 0; c < CUDA_NUM_CFGS; c++) {
            printf("  %-34s %7.2f ms (attn_layer_create)\n", cuda_cfgs[c].name, warm[c] * 1e3);
            if (warm[c] > warm_max) warm_max = warm[c];
        }
        printf("  slowest layer %.2f ms (target <= 10 ms); NVRTC compiles during the warm rounds: %d%s\n",
               warm_max * 1e3, compiles, compiles ? " (NOT warm: the disk cache missed)" : "");
    }
    rm_dir(dir);
    {
        bench_row *row = row_add();
        snprintf(row->name, sizeof row->name, "cold NVRTC compile per variant (%d variants, sm_%d%d%s)", n_cold,
                 plat->cuda_capability_major, plat->cuda_capability_minor, any90a ? "; wgmma: sm_90a" : "");
        row->ms = cold_max;
        snprintf(row->metric, sizeof row->metric, "slowest; mean %.0f ms", cold_sum / (n_cold ? n_cold : 1));
        snprintf(row->ceiling, sizeof row->ceiling, "target <= 2000 ms");
        row->other_cores = -1;
        row = row_add();
        snprintf(row->name, sizeof row->name, "warm start per layer (attn_layer_create, disk cache)");
        row->ms = warm_max * 1e3;
        snprintf(row->metric, sizeof row->metric, "slowest of %d layers", CUDA_NUM_CFGS);
        snprintf(row->ceiling, sizeof row->ceiling, "target <= 10 ms");
        row->other_cores = -1;
    }
}

/* ---------------------------------------------------------------------------------------
   2. The device's ceilings (this tool's probes) and the backend table
   ------------------------------------------------------------------------------------- */

/* The device's read bandwidth: attn_read_probe over `bytes` from buf, best of `passes`
   (GB/s); *median_gbs the median. */
static double cuda_read_ceiling(attn_context *ctx, void *buf, size_t bytes, int sms, int passes, double *median_gbs) {
    unsigned long long src = (unsigned long long)(uintptr_t)buf, n = bytes / 16, out;
    unsigned never = 0x9e3779b9u;
    void *args[4], *d_out = NULL;
    int per_sm = 0, i;
    double best = 0, t[32];
    CHECK(ctx, attn_cuda_malloc(ctx, 16, &d_out));
    out = (unsigned long long)(uintptr_t)d_out;
    if (gpu.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gpu.read_probe, 512, 0) != 0 || per_sm < 1)
        per_sm = 1;
    args[0] = &src; args[1] = &n; args[2] = &never; args[3] = &out;
    if (passes > 32) passes = 32;
    for (i = -1; i < passes; i++) {
        float ms;
        CU(gpu.cu.cuEventRecord(gpu.e0, NULL));
        CU(gpu.cu.cuLaunchKernel(gpu.read_probe, (unsigned)(per_sm * BENCH_MAX(1, sms)), 1, 1, 512, 1, 1, 0, NULL,
                                 args, NULL));
        CU(gpu.cu.cuEventRecord(gpu.e1, NULL));
        ms = gpu_elapsed_ms();
        if (i < 0) continue; /* warm-up */
        t[i] = (double)bytes / (ms * 1e-3) / 1e9;
        if (t[i] > best) best = t[i];
    }
    *median_gbs = median(t, passes);
    CHECK(ctx, attn_cuda_free(ctx, d_out));
    return best;
}

#define CUDA_POOL_BYTES ((size_t)16 << 30)   /* the KV cache every case draws from */
#define CUDA_ROTATE_BYTES ((size_t)256 << 20) /* KV read per rotation, at least */
#define CUDA_MAX_SETS 64
#define CUDA_MAX_TOKENS 16384                 /* q/out rows (prefill 4 x 4096) */

/* What every GPU case shares: the layer (32/8 heads, head 128, bf16, block 16), the 16 GiB
   paged cache with shuffled block ids, q/out buffers, the timing groups (the events are the
   tool's own: gpu.e0, gpu.e1). */
typedef struct {
    attn_context *ctx;
    attn_layer *layer;
    attn_tensor kv;
    int64_t num_blocks;
    int32_t *ids;
    void *d_kv, *d_q, *d_out;
    int groups, sms;   /* timing groups per case; the device's multiprocessors */
    int h, d;          /* the layer's query heads and head size (q/out rows): CB_H, CB_D but in the wide-head table */
} cuda_bench;

enum { CB_H = 32, CB_HKV = 8, CB_D = 128, CB_BS = 16 };

/* nsets metadata of `layer` over disjoint block sets of a shuffled pool: set k takes the next
   sum(ceil(seq / block_size)) ids of `ids`. workspace: attn_metadata_desc.workspace_bytes. */
static int bench_forced_splits; /* attn_metadata_desc.num_kv_splits of bench_metas (0: automatic) */

/* Requests (and tokens) a metadata is created for beyond the batch it builds: 0, the batch;
   the capacity table sets it to an engine's max_num_reqs (one graph for any batch up to it). */
static int bench_capacity_reqs;

/* Cascade: bench_metas' requests share the blocks of their first bench_prefix_len tokens (a
   multiple of the block size); bench_prefix_build 1 passes it as common_prefix_len. */
static int bench_prefix_len, bench_prefix_build;

static attn_metadata **bench_metas(attn_context *ctx, attn_layer *layer, const int32_t *ids, int64_t pool_blocks,
                                   int block_size, int max_tokens, int nreq, const int32_t *qlens, const int32_t *seqs,
                                   int nsets, int64_t workspace) {
    attn_metadata **metas = (attn_metadata **)bench_alloc((size_t)nsets * sizeof *metas);
    int32_t *qsl = (int32_t *)bench_alloc(((size_t)nreq + 1) * 4), *table;
    const int pb = bench_prefix_len / block_size; /* shared blocks: once per set */
    int r, k, bps = 0, per_set = pb, maxq = 0, maxs = 0;
    for (r = 0; r < nreq; r++) {
        int nb = (seqs[r] + block_size - 1) / block_size;
        if (nb > bps) bps = nb;
        if (qlens[r] > maxq) maxq = qlens[r];
        if (seqs[r] > maxs) maxs = seqs[r];
        per_set += nb - pb;
    }
    qsl[0] = 0;
    for (r = 0; r < nreq; r++) qsl[r + 1] = qsl[r] + qlens[r];
    if ((int64_t)nsets * per_set > pool_blocks || qsl[nreq] > max_tokens) {
        fprintf(stderr, "attn-bench-cuda: a case does not fit the bench's cache or q buffer\n");
        exit(1);
    }
    table = (int32_t *)bench_alloc((size_t)nreq * (size_t)bps * 4);
    for (k = 0; k < nsets; k++) {
        attn_metadata_desc md;
        attn_batch b;
        const int32_t *set = ids + (size_t)k * (size_t)per_set;
        int used = pb;
        for (r = 0; r < nreq; r++) {
            int nb = (seqs[r] + block_size - 1) / block_size, j;
            for (j = 0; j < bps; j++) table[(size_t)r * bps + j] = j < pb ? set[j] : j < nb ? set[used + j - pb] : 0;
            used += nb - pb;
        }
        memset(&md, 0, sizeof md);
        md.max_num_reqs = nreq > bench_capacity_reqs ? nreq : bench_capacity_reqs;
        md.max_num_tokens = qsl[nreq] > bench_capacity_reqs ? qsl[nreq] : bench_capacity_reqs;
        md.max_blocks_per_req = bps;
        md.num_blocks = pool_blocks;
        md.workspace_bytes = workspace;
        md.num_kv_splits = bench_forced_splits;
        CHECK(ctx, attn_metadata_create(layer, &md, &metas[k]));
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl;
        b.seq_lens = seqs;
        b.block_table = table;
        b.block_table_stride = bps;
        b.num_reqs = nreq;
        b.num_actual_tokens = qsl[nreq];
        b.max_query_len = maxq;
        b.max_seq_len = maxs;
        CHECK(ctx, attn_metadata_build(metas[k], bench_prefix_build ? bench_prefix_len : 0, &b, 0));
    }
    CHECK(ctx, attn_cuda_synchronize(ctx, NULL));
    free(qsl);
    free(table);
    return metas;
}

/* The standard layer's sets (blocks of 16 from the 16 GiB pool). */
static attn_metadata **cuda_metas(cuda_bench *cb, int nreq, const int32_t *qlens, const int32_t *seqs, int nsets) {
    return bench_metas(cb->ctx, cb->layer, cb->ids, cb->num_blocks, CB_BS, CUDA_MAX_TOKENS, nreq, qlens, seqs, nsets, 0);
}

static void cuda_metas_free(attn_metadata **metas, int nsets) {
    int k;
    for (k = 0; k < nsets; k++) attn_metadata_destroy(metas[k]);
    free(metas);
}

/* Median seconds per call of run(arg, i), i = 0, 1, ...: 3 warm-up calls, then groups of
   per_group back-to-back calls between two CUDA events recorded on `stream` (the one the
   calls run on). */
static double bench_groups(cuda_bench *cb, void (*run)(void *, int), void *arg, int per_group, void *stream) {
    double t[16];
    int g, k, next = 0;
    for (k = 0; k < 3; k++) run(arg, k); /* warm-up */
    for (g = 0; g < cb->groups; g++) {
        CU(gpu.cu.cuEventRecord(gpu.e0, stream));
        for (k = 0; k < per_group; k++) run(arg, next++);
        CU(gpu.cu.cuEventRecord(gpu.e1, stream));
        t[g] = (double)gpu_elapsed_ms() * 1e-3 / per_group;
    }
    return median(t, cb->groups);
}

typedef struct {
    cuda_bench *cb;
    attn_metadata **metas;
    int nsets;
    attn_tensor q, out;
    void *stream;   /* the forward's stream: NULL, or gpu.stream while a graph is captured */
    void **exec;    /* cuda_graph_time: the graph of each set */
} cuda_forward_call;

/* A forward of ntok query tokens over the sets of metas, on the bench's q/out buffers. */
static cuda_forward_call cuda_forward_make(cuda_bench *cb, attn_metadata **metas, int nsets, int ntok) {
    int64_t qshape[3];
    cuda_forward_call c;
    qshape[0] = ntok; qshape[1] = cb->h; qshape[2] = cb->d;
    memset(&c, 0, sizeof c);
    c.cb = cb;
    c.metas = metas;
    c.nsets = nsets;
    c.q = attn_tensor_make(cb->d_q, ATTN_DTYPE_BF16, 3, qshape);
    c.out = attn_tensor_make(cb->d_out, ATTN_DTYPE_BF16, 3, qshape);
    c.q.device.kind = c.out.device.kind = ATTN_DEVICE_CUDA;
    return c;
}

static void cuda_forward_run(void *arg, int i) {
    cuda_forward_call *c = (cuda_forward_call *)arg;
    CHECK(c->cb->ctx, attn_layer_forward(c->cb->layer, c->metas[i % c->nsets], &c->q, NULL, NULL, &c->cb->kv, &c->out,
                                         NULL, c->stream));
}

static void cuda_graph_run(void *arg, int i) {
    cuda_forward_call *c = (cuda_forward_call *)arg;
    CU(gpu.cu.cuGraphLaunch(c->exec[i % c->nsets], gpu.stream));
}

static double cuda_time(cuda_bench *cb, attn_metadata **metas, int nsets, int ntok, int per_group) {
    cuda_forward_call c = cuda_forward_make(cb, metas, nsets, ntok);
    uint16_t *host;
    double med;
    med = bench_groups(cb, cuda_forward_run, &c, per_group, NULL);
    host = (uint16_t *)bench_alloc((size_t)ntok * cb->h * cb->d * 2);
    CHECK(cb->ctx, attn_cuda_memcpy(cb->ctx, host, cb->d_out, (size_t)ntok * cb->h * cb->d * 2,
                                    ATTN_COPY_DEVICE_TO_HOST, NULL));
    check_finite(host, ATTN_DTYPE_BF16, (size_t)ntok * cb->h * cb->d, "cuda forward");
    free(host);
    return med;
}

/* The bf16 tensor-core rate: cuBLAS GEMM 8192^3 (bf16 in, fp32 accumulate, bf16 out),
   best of 10 (TFLOP/s); 0 with the reason printed when cuBLAS is missing. */
static double cuda_matmul_ceiling(cuda_bench *cb) {
    attn_context *ctx = cb->ctx;
    const int n = 8192;
    const size_t bytes = (size_t)n * n * 2;
    void *a = NULL, *b = NULL, *c = NULL, *h = NULL;
    float alpha = 1.0f, beta = 0.0f;
    double best = 0;
    int i, rc;
    if (!gpu.blas.library) {
        printf("matmul ceiling: not measured (%s)\n", gpu.blas.reason);
        return 0;
    }
    CHECK(ctx, attn_cuda_malloc(ctx, bytes, &a));
    CHECK(ctx, attn_cuda_malloc(ctx, bytes, &b));
    CHECK(ctx, attn_cuda_malloc(ctx, bytes, &c));
    if ((rc = gpu.blas.cublasCreate(&h)) != 0 || (rc = gpu.blas.cublasSetStream(h, NULL)) != 0) {
        fprintf(stderr, "attn-bench-cuda: cannot set up the cuBLAS GEMM (cublasStatus %d)\n", rc);
        exit(1);
    }
    /* random bf16 operands: the start of the (random) KV cache */
    CHECK(ctx, attn_cuda_memcpy(ctx, a, cb->d_kv, bytes, ATTN_COPY_DEVICE_TO_DEVICE, NULL));
    CHECK(ctx, attn_cuda_memcpy(ctx, b, (const char *)cb->d_kv + bytes, bytes, ATTN_COPY_DEVICE_TO_DEVICE, NULL));
    for (i = -2; i < 10; i++) {
        double tf;
        CU(gpu.cu.cuEventRecord(gpu.e0, NULL));
        if ((rc = gpu.blas.cublasGemmStridedBatchedEx(h, BENCH_CUBLAS_OP_N, BENCH_CUBLAS_OP_N, n, n, n, &alpha, a,
                                                      BENCH_CUDA_R_16BF, n, 0, b, BENCH_CUDA_R_16BF, n, 0, &beta, c,
                                                      BENCH_CUDA_R_16BF, n, 0, 1, BENCH_CUBLAS_COMPUTE_32F,
                                                      BENCH_CUBLAS_GEMM_DEFAULT)) != 0) {
            fprintf(stderr, "attn-bench-cuda: cublasGemmStridedBatchedEx failed (cublasStatus %d)\n", rc);
            exit(1);
        }
        CU(gpu.cu.cuEventRecord(gpu.e1, NULL));
        tf = 2.0 * n * n * (double)n / ((double)gpu_elapsed_ms() * 1e-3) / 1e12;
        if (i >= 0 && tf > best) best = tf;
    }
    if ((rc = gpu.blas.cublasDestroy(h)) != 0) {
        fprintf(stderr, "attn-bench-cuda: cublasDestroy failed (cublasStatus %d)\n", rc);
        exit(1);
    }
    CHECK(ctx, attn_cuda_free(ctx, a));
    CHECK(ctx, attn_cuda_free(ctx, b));
    CHECK(ctx, attn_cuda_free(ctx, c));
    return best;
}

/* The launch floor: back-to-back launches of an empty kernel (attn_fill_u32 over 0 words,
   one CTA) on the legacy stream, per launch, median of 11 groups of 200 - what a forward of
   n launches costs before it reads a byte. */
static double cuda_launch_floor(cuda_bench *cb) {
    unsigned long long dst = (unsigned long long)(uintptr_t)cb->d_out, n = 0;
    unsigned value = 0;
    void *args[3];
    double t[11];
    int g, k;
    args[0] = &dst; args[1] = &n; args[2] = &value;
    for (g = -1; g < 11; g++) {
        double ms;
        CU(gpu.cu.cuEventRecord(gpu.e0, NULL));
        for (k = 0; k < 200; k++)
            CU(gpu.cu.cuLaunchKernel(gpu.fill_u32, 1, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
        CU(gpu.cu.cuEventRecord(gpu.e1, NULL));
        ms = gpu_elapsed_ms();
        if (g >= 0) t[g] = ms * 1e-3 / 200;
    }
    return median(t, 11);
}

/* 3. MLA on the GPU (issue 9's shapes): DeepSeek-V3's latent cache (576 = 512 + 64), bf16,
   pages of 64, heads {16, 128}; decode through attn_mla_forward_mqa (q_latent + q_pe),
   batch {1, 16, 64, 128} x context {1k, 4k, 16k}: GB/s of latent read (B L 576 2 bytes)
   and TFLOP/s (2 B H L (576 + 512)); the fused call on one decode shape (its cuBLAS
   projections included); the prefill shape (128 heads, one sequence of 4096, causal, qk
   192 / v 128) through attn_mla_forward_mha: TFLOP/s over the causal-useful pairs, 2 H L(L+1)/2
   (192 + 128), the up-projection's GEMMs and gathers inside the time. */
#define MLA_POOL_BYTES ((size_t)12 << 30)
enum { MB_R = 512, MB_P = 64, MB_D = 576, MB_N = 128, MB_V = 128, MB_BS = 64 };

/* --mla-backend NAME: the CUDA MLA table's layers forced onto that backend by code (e.g.
   CUDA_MLA, the mma.sync fallback, on a Hopper GPU); unset, the selector chooses */
static attn_select_request mla_request = {ATTN_BACKEND_AUTO, 0};

/* Tuning: the bench's ATTN_BENCH_*_DEFINES knobs ("NAME=VALUE ...") become the decode
   role's ATTN_KERNEL_DEFINES (the library's seam: read at layer creation, shown in the
   layer's record) for the layers of that table: attn_layer_create under it, the variable
   restored after. The split policies follow the recompiled kernel by themselves. */
static void bench_layer_create(attn_context *ctx, const attn_layer_desc *d, const attn_select_request *req,
                               const char *knob, attn_layer **out) {
    char defs[512], buf[256], *tok, *saved = NULL;
    const char *old = getenv("ATTN_KERNEL_DEFINES"), *k = knob ? getenv(knob) : NULL;
    size_t n = 0;
    if (k && *k) {
        defs[0] = 0;
        snprintf(buf, sizeof buf, "%s", k);
        for (tok = strtok(buf, " "); tok; tok = strtok(NULL, " "))
            n += (size_t)snprintf(defs + n, n < sizeof defs ? sizeof defs - n : 0, "%sdecode.%s", n ? " " : "", tok);
        if (old) saved = strdup(old);
        setenv("ATTN_KERNEL_DEFINES", defs, 1);
    }
    CHECK(ctx, attn_layer_create(ctx, d, req, out));
    if (k && *k) {
        if (saved) setenv("ATTN_KERNEL_DEFINES", saved, 1);
        else unsetenv("ATTN_KERNEL_DEFINES");
        free(saved);
        printf("  %s: the decode kernels compiled with ATTN_KERNEL_DEFINES=\"%s\" (the record: \"%s\")\n", knob, defs,
               attn_layer_selection(*out)->kernel_defines);
    }
}

static attn_layer *mla_bench_layer(attn_context *ctx, int H) {
    attn_layer_desc d;
    attn_layer *layer = NULL;
    memset(&d, 0, sizeof d);
    d.use_mla = 1;
    d.num_heads = H;
    d.head_size = MB_D;
    d.kv_lora_rank = MB_R;
    d.qk_rope_head_dim = MB_P;
    d.qk_nope_head_dim = MB_N;
    d.v_head_dim = MB_V;
    d.block_size = MB_BS;
    d.dtype = d.kv_cache_dtype = ATTN_DTYPE_BF16;
    d.device = ATTN_DEVICE_CUDA;
    bench_layer_create(ctx, &d, &mla_request, "ATTN_BENCH_MLA_DEFINES", &layer);
    if (H == 16 || H == 128) printf("MLA layer, %d heads: backend %s\n", H, attn_backend_name(attn_layer_selection(layer)->resolved));
    return layer;
}

typedef struct {
    attn_context *ctx;
    attn_layer *layer;
    attn_metadata **metas;
    int nsets, kind;                   /* kind: 0 forward_mqa, 1 fused decode, 2 forward_mha, 3 forward_sparse */
    attn_tensor cache, q, q_pe, out, w_uk, w_uv, indices;
} mla_call;

static void mla_call_run(void *arg, int k) { /* bench_groups' run */
    mla_call *c = (mla_call *)arg;
    attn_metadata *m = c->metas[k % c->nsets];
    if (c->kind == 0) CHECK(c->ctx, attn_mla_forward_mqa(c->layer, m, &c->q, &c->q_pe, &c->cache, &c->out, NULL, NULL));
    else if (c->kind == 1)
        CHECK(c->ctx, attn_mla_forward(c->layer, m, &c->q, &c->q_pe, NULL, NULL, &c->cache, &c->w_uk, &c->w_uv, &c->out, NULL));
    else if (c->kind == 2) CHECK(c->ctx, attn_mla_forward_mha(c->layer, m, &c->q, &c->cache, &c->w_uk, &c->w_uv, &c->out, NULL, NULL));
    else CHECK(c->ctx, attn_mla_forward_sparse(c->layer, m, &c->q, &c->q_pe, &c->cache, &c->indices, &c->out, NULL, NULL));
}

static attn_tensor mla_dev_tensor(void *p, int ndim, int64_t a, int64_t b, int64_t c) {
    int64_t s[3];
    attn_tensor t;
    s[0] = a; s[1] = b; s[2] = c;
    t = attn_tensor_make(p, ATTN_DTYPE_BF16, ndim, s);
    t.device.kind = ATTN_DEVICE_CUDA;
    return t;
}

/* Sparse MLA (DeepSeek-V3.2's DSA, attn_mla_forward_sparse): B decodes over C keys each, every
   token attending `topk` distinct random positions of its request; TFLOP/s = 2 B H topk (576
   + 512), GB/s of latent rows gathered (B topk 576 2 bytes). Issue 23's target: 128 heads,
   topk 2048, batch 128 >= 350 TFLOP/s. */
static void cuda_mla_sparse_rows(attn_context *ctx, cuda_bench *cb, mla_call *c, const int32_t *ids, int64_t pool_blocks,
                                 int H, void *d_q, void *d_qpe, void *d_out, double read_best, double mm) {
    static const int batches[] = {1, 32, 128};
    const int topk = 2048, C = 8192;
    int bi, i;
    for (bi = 0; bi < 3; bi++) {
        const int B = batches[bi];
        const double flops = 2.0 * B * H * (double)topk * (MB_D + MB_R);
        const size_t bytes = (size_t)B * topk * MB_D * 2;
        int32_t *ql = (int32_t *)bench_alloc((size_t)B * 4), *sl = (int32_t *)bench_alloc((size_t)B * 4);
        int32_t *hidx = (int32_t *)bench_alloc((size_t)B * topk * 4), *perm = (int32_t *)bench_alloc((size_t)C * 4);
        void *d_idx = NULL;
        int64_t ish[2];
        double med, tf, gbs;
        bench_row *row;
        for (i = 0; i < B; i++) { ql[i] = 1; sl[i] = C; }
        bench_topk_positions(hidx, B, topk, C, perm, 77);
        CHECK(ctx, attn_cuda_malloc(ctx, (size_t)B * topk * 4, &d_idx));
        CHECK(ctx, attn_cuda_memcpy(ctx, d_idx, hidx, (size_t)B * topk * 4, ATTN_COPY_HOST_TO_DEVICE, NULL));
        c->nsets = 2;
        c->metas = bench_metas(ctx, c->layer, ids, pool_blocks, MB_BS, B, B, ql, sl, c->nsets, 0);
        c->kind = 3;
        c->q = mla_dev_tensor(d_q, 3, B, H, MB_R);
        c->q_pe = mla_dev_tensor(d_qpe, 3, B, H, MB_P);
        c->out = mla_dev_tensor(d_out, 3, B, H, MB_R);
        ish[0] = B; ish[1] = topk;
        c->indices = attn_tensor_make(d_idx, ATTN_DTYPE_INT32, 2, ish);
        c->indices.device.kind = ATTN_DEVICE_CUDA;
        med = bench_groups(cb, mla_call_run, c, 20, NULL);
        tf = flops / med / 1e12;
        gbs = (double)bytes / med / 1e9;
        printf("  sparse batch %3d, topk %d of %d keys: %9.1f us  %6.1f TFLOP/s (%5.1f%% of matmul)  %7.0f GB/s gathered "
               "(%5.1f%% of read)\n", B, topk, C, med * 1e6, tf, mm > 0 ? 100.0 * tf / mm : 0.0, gbs, 100.0 * gbs / read_best);
        fflush(stdout);
        row = row_add();
        snprintf(row->name, sizeof row->name, "MLA sparse H=%d b=%d topk=%d, %s", H, B, topk,
                 attn_dtype_name(attn_layer_get_desc(c->layer)->kv_cache_dtype));
        row->ms = med * 1e3;
        snprintf(row->metric, sizeof row->metric, "%.1f TFLOP/s", tf);
        if (mm > 0) snprintf(row->ceiling, sizeof row->ceiling, "%.1f%% of the matmul ceiling", 100.0 * tf / mm);
        row->other_cores = -1;
        {
            char kind[32];
            snprintf(kind, sizeof kind, "mla_sparse_h%d_%s", H, attn_dtype_name(attn_layer_get_desc(c->layer)->kv_cache_dtype));
            csv_row("attn.h", kind, B, topk, med * 1e6, tf, "TFLOP/s");
        }
        cuda_metas_free(c->metas, c->nsets);
        CHECK(ctx, attn_cuda_free(ctx, d_idx));
        free(ql); free(sl); free(hidx); free(perm);
    }
}


/* One uniform decode case of the MLA table: B single-token requests of C keys, metadata sets
   rotating over CUDA_ROTATE_BYTES of the pool (iter_bytes a forward), forward_mqa. */
static void mla_decode_case(attn_context *ctx, mla_call *c, const int32_t *ids, int64_t pool_blocks, int B, int C, int H,
                            size_t iter_bytes, void *d_q, void *d_qpe, void *d_out) {
    int32_t ql[128], sl[128];
    int i;
    c->nsets = (int)((CUDA_ROTATE_BYTES + iter_bytes - 1) / iter_bytes);
    c->nsets = c->nsets < 2 ? 2 : c->nsets > CUDA_MAX_SETS ? CUDA_MAX_SETS : c->nsets;
    for (i = 0; i < B; i++) { ql[i] = 1; sl[i] = C; }
    c->metas = bench_metas(ctx, c->layer, ids, pool_blocks, MB_BS, B, B, ql, sl, c->nsets, 0);
    c->kind = 0;
    c->q = mla_dev_tensor(d_q, 3, B, H, MB_R);
    c->q_pe = mla_dev_tensor(d_qpe, 3, B, H, MB_P);
    c->out = mla_dev_tensor(d_out, 3, B, H, MB_R);
}

static void cuda_mla_table(attn_context *ctx, cuda_bench *cb, double read_best, double mm) {
    static const int heads[] = {16, 128}, batches[] = {1, 16, 64, 128}, contexts[] = {1024, 4096, 16384};
    const size_t block_bytes = (size_t)MB_BS * MB_D * 2;
    const int64_t pool_blocks = (int64_t)(MLA_POOL_BYTES / block_bytes);
    const size_t qbytes = (size_t)4096 * 128 * 192 * 2; /* the largest q: the prefill's */
    void *d_cache = NULL, *d_q = NULL, *d_qpe = NULL, *d_out = NULL, *d_wuk = NULL, *d_wuv = NULL;
    int32_t *ids = (int32_t *)bench_alloc((size_t)pool_blocks * sizeof(int32_t));
    size_t chunk = (size_t)64 << 20, off;
    uint16_t *host = (uint16_t *)bench_alloc(chunk + 1024);
    int hi, bi, ci, i;
    mla_call c;
    bench_row *row;
    double bf16_us[2][4][3]; /* [heads][batch][context]: the fp8 rows' reference */
    memset(bf16_us, 0, sizeof bf16_us);
    fill_random(host, ATTN_DTYPE_BF16, (chunk + 1024) / 2, 11);
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)pool_blocks * block_bytes, &d_cache));
    for (off = 0; off < (size_t)pool_blocks * block_bytes; off += chunk)
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)d_cache + off, (const char *)host + (off / chunk % 7) * 128,
                                    BENCH_MIN(chunk, (size_t)pool_blocks * block_bytes - off), ATTN_COPY_HOST_TO_DEVICE, NULL));
    CHECK(ctx, attn_cuda_malloc(ctx, qbytes, &d_q));
    CHECK(ctx, attn_cuda_malloc(ctx, qbytes, &d_qpe));
    CHECK(ctx, attn_cuda_malloc(ctx, qbytes, &d_out));
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)128 * MB_N * MB_R * 2, &d_wuk));
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)128 * MB_R * MB_V * 2, &d_wuv));
    for (off = 0; off < qbytes; off += chunk) {
        size_t n = BENCH_MIN(chunk, qbytes - off);
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)d_q + off, (const char *)host + 64, n, ATTN_COPY_HOST_TO_DEVICE, NULL));
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)d_qpe + off, (const char *)host + 192, n, ATTN_COPY_HOST_TO_DEVICE, NULL));
    }
    /* weights ~ U(-1, 1) / sqrt(R): projections of unit scale */
    for (i = 0; i < (int)((chunk + 1024) / 2); i++) host[i] = attn_f32_to_bf16(attn_bf16_to_f32(host[i]) * 0.044f);
    CHECK(ctx, attn_cuda_memcpy(ctx, d_wuk, host, (size_t)128 * MB_N * MB_R * 2, ATTN_COPY_HOST_TO_DEVICE, NULL));
    CHECK(ctx, attn_cuda_memcpy(ctx, d_wuv, (const char *)host + 512, (size_t)128 * MB_R * MB_V * 2,
                                ATTN_COPY_HOST_TO_DEVICE, NULL));
    free(host);
    shuffle_ids(ids, (int)pool_blocks, 43);
    memset(&c, 0, sizeof c);
    c.ctx = ctx;
    c.cache = mla_dev_tensor(d_cache, 3, pool_blocks, MB_BS, MB_D);
    c.w_uk = mla_dev_tensor(d_wuk, 3, 128, MB_N, MB_R);
    c.w_uv = mla_dev_tensor(d_wuv, 3, 128, MB_R, MB_V);
    /* tuning the fp8 latent's decode (ATTN_BENCH_MLA_FP8_ONLY: its 16-head rows only, against
       bf16 times given there as six numbers; ATTN_BENCH_MLA_DEFINES "NAME=VALUE ...": the MLA
       layers' decode compiled with these defines (ATTN_KERNEL_DEFINES); ATTN_BENCH_MLA_SPLITS: a forced split
       count) */
    const int fp8_h = getenv("ATTN_BENCH_MLA_FP8_H128") ? 1 : 0; /* with FP8_ONLY: the 128-head rows instead */
    if (getenv("ATTN_BENCH_MLA_FP8_ONLY"))
        sscanf(getenv("ATTN_BENCH_MLA_FP8_ONLY"), "%lf %lf %lf %lf %lf %lf", &bf16_us[fp8_h][1][1], &bf16_us[fp8_h][1][2],
               &bf16_us[fp8_h][2][1], &bf16_us[fp8_h][2][2], &bf16_us[fp8_h][3][1], &bf16_us[fp8_h][3][2]);
    for (hi = 0; hi < (getenv("ATTN_BENCH_MLA_FP8_ONLY") ? 0 : 2); hi++) {
        const int H = heads[hi];
        c.layer = mla_bench_layer(ctx, H);
        c.w_uk.shape[0] = c.w_uv.shape[0] = H;
        printf("MLA sparse decode (attn_mla_forward_sparse): %d heads, latent 576, bf16, topk 2048; TFLOP/s = 2 B H topk "
               "(576 + 512)\n", H);
        cuda_mla_sparse_rows(ctx, cb, &c, ids, pool_blocks, H, d_q, d_qpe, d_out, read_best, mm);
        if (H == 128) { /* the same over an fp8_ds_mla cache (656-byte rows; bytes 0x38: finite codes, scales, bf16) */
            attn_layer_desc dd = *attn_layer_get_desc(c.layer);
            attn_layer *keep = c.layer;
            attn_tensor keep_cache = c.cache;
            void *d_ds = NULL;
            const size_t ds_bytes = (size_t)pool_blocks * MB_BS * 656;
            char *fill = (char *)bench_alloc(chunk);
            memset(fill, 0x38, chunk);
            dd.kv_cache_dtype = ATTN_DTYPE_FP8_DS_MLA;
            bench_layer_create(ctx, &dd, &mla_request, "ATTN_BENCH_MLA_DEFINES", &c.layer);
            CHECK(ctx, attn_cuda_malloc(ctx, ds_bytes, &d_ds));
            for (off = 0; off < ds_bytes; off += chunk)
                CHECK(ctx, attn_cuda_memcpy(ctx, (char *)d_ds + off, fill, BENCH_MIN(chunk, ds_bytes - off), ATTN_COPY_HOST_TO_DEVICE,
                                            NULL));
            free(fill);
            {
                int64_t sh[3];
                sh[0] = pool_blocks; sh[1] = MB_BS; sh[2] = 656;
                c.cache = attn_tensor_make(d_ds, ATTN_DTYPE_FP8_DS_MLA, 3, sh);
                c.cache.device.kind = ATTN_DEVICE_CUDA;
            }
            printf("MLA sparse decode over fp8_ds_mla (656-byte rows), 128 heads, topk 2048; backend %s\n",
                   attn_layer_backend(c.layer)->name);
            cuda_mla_sparse_rows(ctx, cb, &c, ids, pool_blocks, H, d_q, d_qpe, d_out, read_best, mm);
            attn_layer_destroy(c.layer);
            CHECK(ctx, attn_cuda_free(ctx, d_ds));
            c.layer = keep;
            c.cache = keep_cache;
        }
        if (getenv("ATTN_BENCH_MLA_SPARSE_ONLY")) { /* tuning: the sparse rows alone */
            attn_layer_destroy(c.layer);
            continue;
        }
        printf("MLA decode: %d heads, latent 576 (512 + 64), bf16, pages of %d; backend %s; forward_mqa; GB/s of "
               "latent read (B L 576 2 bytes), TFLOP/s = 2 B H L (576 + 512) (splits: attn_metadata_mla_info; the work "
               "items per launch are attn.h's private schedule: not shown)\n", H, MB_BS,
               attn_layer_backend(c.layer)->name);
        for (bi = 0; bi < 4; bi++)
            for (ci = 0; ci < 3; ci++) {
                const int B = batches[bi], C = contexts[ci];
                const size_t iter_bytes = (size_t)B * (size_t)C * MB_D * 2;
                const double flops = 2.0 * B * H * (double)C * (MB_D + MB_R);
                attn_mla_info info;
                double med, gbs, tf;
                memset(&info, 0, sizeof info);
                mla_decode_case(ctx, &c, ids, pool_blocks, B, C, H, iter_bytes, d_q, d_qpe, d_out);
                med = bench_groups(cb, mla_call_run, &c, c.nsets < 20 ? 20 : c.nsets, NULL);
                bf16_us[hi][bi][ci] = med * 1e6;
                gbs = (double)iter_bytes / med / 1e9;
                tf = flops / med / 1e12;
                CHECK(ctx, attn_metadata_mla_info(c.metas[0], &info));
                printf("  batch %3d context %5d: %9.1f us  %7.0f GB/s (%5.1f%% of read)  %6.1f TFLOP/s (%5.1f%% of "
                       "matmul)  [%d splits; %d sets]\n", B, C, med * 1e6, gbs, 100.0 * gbs / read_best,
                       tf, mm > 0 ? 100.0 * tf / mm : 0.0, info.num_kv_splits, c.nsets);
                fflush(stdout);
                row = row_add();
                snprintf(row->name, sizeof row->name, "MLA decode H=%d b=%d ctx=%d (%d splits)", H, B, C, info.num_kv_splits);
                row->ms = med * 1e3;
                snprintf(row->metric, sizeof row->metric, "%.0f GB/s, %.1f TFLOP/s", gbs, tf);
                row->read_gbs = gbs;
                row->other_cores = -1;
                {
                    char kind[32];
                    snprintf(kind, sizeof kind, "mla_decode_h%d", H);
                    csv_row("attn.h", kind, B, C, med * 1e6, gbs, "GB/s");
                    snprintf(kind, sizeof kind, "mla_decode_h%d_tflops", H);
                    csv_row("attn.h", kind, B, C, med * 1e6, tf, "TFLOP/s");
                }
                if (B == 64 && C == 4096) { /* the fused call: projections by cuBLAS around the decode */
                    double mf;
                    c.kind = 1;
                    c.q = mla_dev_tensor(d_q, 3, B, H, MB_N);
                    c.out = mla_dev_tensor(d_out, 3, B, H, MB_V);
                    mf = bench_groups(cb, mla_call_run, &c, 20, NULL);
                    printf("  batch %3d context %5d: %9.1f us through attn_mla_forward (q_nope . W_UK, decode, . W_UV: "
                           "%.1f us around the decode)\n", B, C, mf * 1e6, (mf - med) * 1e6);
                    row = row_add();
                    snprintf(row->name, sizeof row->name, "MLA fused decode H=%d b=%d ctx=%d", H, B, C);
                    row->ms = mf * 1e3;
                    snprintf(row->metric, sizeof row->metric, "%.1f us more than forward_mqa", (mf - med) * 1e6);
                    row->other_cores = -1;
                    {
                        char kind[32];
                        snprintf(kind, sizeof kind, "mla_fused_decode_h%d", H);
                        csv_row("attn.h", kind, B, C, mf * 1e6, mf * 1e6, "us");
                    }
                }
                cuda_metas_free(c.metas, c.nsets);
            }
        if (H == 128) { /* the prefill shape: one sequence of 4096, causal, qk 192 / v 128 */
            const int L = 4096;
            const double flops = (double)H * (MB_N + MB_P + MB_V) * (double)L * (L + 1);
            static const int64_t ws[2] = {0, (int64_t)320 << 20};
            int32_t ql[1], sl[1];
            int w;
            ql[0] = sl[0] = L;
            for (w = 0; w < 2; w++) {
                attn_mla_info info;
                double med, tf;
                memset(&info, 0, sizeof info);
                c.nsets = 2;
                c.metas = bench_metas(ctx, c.layer, ids, pool_blocks, MB_BS, L, 1, ql, sl, c.nsets, ws[w]);
                c.kind = 2;
                c.q = mla_dev_tensor(d_q, 3, L, H, MB_N + MB_P);
                c.out = mla_dev_tensor(d_out, 3, L, H, MB_V);
                med = bench_groups(cb, mla_call_run, &c, 4, NULL);
                tf = flops / med / 1e12;
                CHECK(ctx, attn_metadata_mla_info(c.metas[0], &info));
                printf("MLA prefill: 128 heads, 1 x %d causal, qk 192 / v 128, forward_mha with workspace %s (chunks of "
                       "%d keys): %9.1f us  %6.1f TFLOP/s (%5.1f%% of matmul; gather and up-projection GEMMs "
                       "included, their FLOPs not counted)\n", L, ws[w] ? "320 MiB" : "64 MiB (default)", info.prefill_chunk,
                       med * 1e6, tf, mm > 0 ? 100.0 * tf / mm : 0.0);
                fflush(stdout);
                row = row_add();
                snprintf(row->name, sizeof row->name, "MLA prefill H=128 L=%d causal (chunk %d)", L, info.prefill_chunk);
                row->ms = med * 1e3;
                snprintf(row->metric, sizeof row->metric, "%.1f TFLOP/s", tf);
                if (mm > 0) snprintf(row->ceiling, sizeof row->ceiling, "%.1f%% of the matmul ceiling", 100.0 * tf / mm);
                row->other_cores = -1;
                csv_row("attn.h", w ? "mla_prefill_ws320" : "mla_prefill", 1, L, med * 1e6, tf, "TFLOP/s");
                cuda_metas_free(c.metas, c.nsets);
            }
        }
        attn_layer_destroy(c.layer);
    }
    /* fp8 latents (per-tensor scale 1/64; the pool's bytes read as e4m3 codes: timing only),
       forward_mqa against the bf16 latent's time above; issue 10's target: 16 heads >= 1.6x */
    for (hi = getenv("ATTN_BENCH_MLA_FP8_ONLY") ? fp8_h : 0;
         hi < (getenv("ATTN_BENCH_MLA_SPARSE_ONLY") ? 0 : getenv("ATTN_BENCH_MLA_FP8_ONLY") ? fp8_h + 1 : 2); hi++) {
        const int H = heads[hi];
        attn_layer_desc d;
        memset(&d, 0, sizeof d);
        d.use_mla = 1; d.num_heads = H; d.head_size = MB_D; d.kv_lora_rank = MB_R; d.qk_rope_head_dim = MB_P;
        d.qk_nope_head_dim = MB_N; d.v_head_dim = MB_V; d.block_size = MB_BS;
        d.dtype = ATTN_DTYPE_BF16; d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3; d.k_scale.value = 1.0f / 64;
        d.device = ATTN_DEVICE_CUDA;
        bench_layer_create(ctx, &d, NULL, "ATTN_BENCH_MLA_DEFINES", &c.layer);
        bench_forced_splits = getenv("ATTN_BENCH_MLA_SPLITS") ? atoi(getenv("ATTN_BENCH_MLA_SPLITS")) : 0;
        c.cache = mla_dev_tensor(d_cache, 3, pool_blocks, MB_BS, MB_D);
        c.cache.dtype = ATTN_DTYPE_FP8_E4M3;
        printf("MLA decode, fp8 e4m3 latent (q/out bf16): %d heads; backend %s; GB/s of latent read (B L 576 bytes)\n", H,
               attn_layer_backend(c.layer)->name);
        for (bi = 1; bi < 4; bi++)
            for (ci = 1; ci < 3; ci++) {
                const int B = batches[bi], C = contexts[ci];
                const size_t iter_bytes = (size_t)B * (size_t)C * MB_D;
                double med;
                mla_decode_case(ctx, &c, ids, pool_blocks, B, C, H, iter_bytes, d_q, d_qpe, d_out);
                med = bench_groups(cb, mla_call_run, &c, c.nsets < 20 ? 20 : c.nsets, NULL);
                printf("  batch %3d context %5d: %9.1f us  %7.0f GB/s (%5.1f%% of read)  %.2fx the bf16 latent (%.1f us)\n", B,
                       C, med * 1e6, (double)iter_bytes / med / 1e9, 100.0 * (double)iter_bytes / med / 1e9 / read_best,
                       bf16_us[hi][bi][ci] / (med * 1e6), bf16_us[hi][bi][ci]);
                fflush(stdout);
                row = row_add();
                snprintf(row->name, sizeof row->name, "MLA decode H=%d b=%d ctx=%d, fp8 latent: %.2fx bf16", H, B, C,
                         bf16_us[hi][bi][ci] / (med * 1e6));
                row->ms = med * 1e3;
                snprintf(row->metric, sizeof row->metric, "%.0f GB/s", (double)iter_bytes / med / 1e9);
                row->read_gbs = (double)iter_bytes / med / 1e9;
                row->other_cores = -1;
                cuda_metas_free(c.metas, c.nsets);
            }
        bench_forced_splits = 0;
        attn_layer_destroy(c.layer);
    }
    CHECK(ctx, attn_cuda_free(ctx, d_cache));
    CHECK(ctx, attn_cuda_free(ctx, d_q));
    CHECK(ctx, attn_cuda_free(ctx, d_qpe));
    CHECK(ctx, attn_cuda_free(ctx, d_out));
    CHECK(ctx, attn_cuda_free(ctx, d_wuk));
    CHECK(ctx, attn_cuda_free(ctx, d_wuv));
    free(ids);
}

/* One decode forward of B requests of context C (a query token each) on cb's layer and
   cache, timed over enough metadata sets to read CUDA_ROTATE_BYTES (iter_bytes a forward):
   the median seconds eagerly and (graph) as CUDA-graph replays, and the number of sets. (The schedule of a built metadata, work items,
   merges and wide tiles, is attn.h's private state: not shown.) */
typedef struct { double med, graph; int nsets; } cuda_decode_run;

/* The same forwards as CUDA-graph replays, as engines run decode: one graph per metadata
   set, captured on gpu.stream (relaxed mode), replayed back to back between two events on
   that stream; the median seconds per replay (device time: a replay is enqueued in ~2 us,
   less than any forward here takes). */
static double cuda_graph_time(cuda_bench *cb, attn_metadata **metas, int nsets, int ntok, int per_group) {
    cuda_forward_call c = cuda_forward_make(cb, metas, nsets, ntok);
    double med;
    int k;
    c.exec = (void **)bench_alloc((size_t)nsets * sizeof(void *));
    c.stream = gpu.stream;
    for (k = 0; k < nsets; k++) {
        void *graph = NULL;
        CU(gpu.cu.cuStreamBeginCapture(gpu.stream, 2 /* CU_STREAM_CAPTURE_MODE_RELAXED */));
        cuda_forward_run(&c, k);
        CU(gpu.cu.cuStreamEndCapture(gpu.stream, &graph));
        CU(gpu.cu.cuGraphInstantiate(&c.exec[k], graph, 0));
        CU(gpu.cu.cuGraphDestroy(graph));
    }
    med = bench_groups(cb, cuda_graph_run, &c, per_group, gpu.stream);
    for (k = 0; k < nsets; k++) CU(gpu.cu.cuGraphExecDestroy(c.exec[k]));
    free(c.exec);
    return med;
}
/* Speculative decoding's verification steps: query tokens per request of the decode tables
   (1: plain decode; the spec-decode table sets 2-8, causal within the draft). */
static int bench_decode_qlen = 1;

static cuda_decode_run cuda_decode_time(cuda_bench *cb, int B, int C, size_t iter_bytes, int graph) {
    cuda_decode_run d;
    int32_t *ql = (int32_t *)bench_alloc((size_t)B * 4), *sl = (int32_t *)bench_alloc((size_t)B * 4);
    attn_metadata **metas;
    int r;
    d.nsets = (int)((CUDA_ROTATE_BYTES + iter_bytes - 1) / iter_bytes);
    if (d.nsets < 2) d.nsets = 2;
    if (d.nsets > CUDA_MAX_SETS) d.nsets = CUDA_MAX_SETS;
    for (r = 0; r < B; r++) { ql[r] = bench_decode_qlen; sl[r] = C; }
    metas = cuda_metas(cb, B, ql, sl, d.nsets);
    d.med = cuda_time(cb, metas, d.nsets, B * bench_decode_qlen, d.nsets < 20 ? 20 : d.nsets);
    d.graph = graph ? cuda_graph_time(cb, metas, d.nsets, B * bench_decode_qlen, d.nsets < 20 ? 20 : d.nsets) : 0;
    cuda_metas_free(metas, d.nsets);
    free(ql); free(sl);
    return d;
}

/* Cascade attention (issue 23): B decodes sharing a prefix of P tokens, `own` tokens each of
   their own, with and without common_prefix_len, eager and replayed; the two builds'
   outputs of set 0 must agree within bf16 rounding. GB/s: the bytes the cascade must read
   (the prefix once, every request's own keys) over its time. */
static void cuda_cascade_table(cuda_bench *cb, double read_best) {
    static const int shapes[][3] = {{64, 16384, 512}, {16, 4096, 512}, {128, 8192, 256}};
    const size_t nout_max = (size_t)128 * CB_H * CB_D;
    uint16_t *o[2];
    int si, k;
    o[0] = (uint16_t *)bench_alloc(nout_max * 2);
    o[1] = (uint16_t *)bench_alloc(nout_max * 2);
    printf("cascade: %d/%d heads, head %d, bf16; B decodes over a shared prefix of P tokens + own tokens each, "
           "with and without common_prefix_len; GB/s = (prefix once + own) K+V bytes / time\n", CB_H, CB_HKV, CB_D);
    for (si = 0; si < 3; si++) {
        const int B = shapes[si][0], P = shapes[si][1], own = shapes[si][2];
        const size_t tok_bytes = (size_t)CB_HKV * CB_D * 2 * 2, need = ((size_t)P + (size_t)B * own) * tok_bytes;
        const size_t plain_bytes = (size_t)B * (size_t)(P + own) * tok_bytes;
        int32_t *ql = (int32_t *)bench_alloc((size_t)B * 4), *sl = (int32_t *)bench_alloc((size_t)B * 4);
        double eager[2], graph[2], maxdiff = 0.0;
        size_t x, n = (size_t)B * CB_H * CB_D;
        bench_row *row;
        for (k = 0; k < B; k++) { ql[k] = 1; sl[k] = P + own; }
        bench_prefix_len = P;
        for (k = 0; k < 2; k++) {
            const int nsets = 2;
            attn_metadata **metas;
            cuda_forward_call c;
            bench_prefix_build = k;
            metas = cuda_metas(cb, B, ql, sl, nsets);
            eager[k] = cuda_time(cb, metas, nsets, B, 20);
            graph[k] = cuda_graph_time(cb, metas, nsets, B, 20);
            c = cuda_forward_make(cb, metas, nsets, B);
            cuda_forward_run(&c, 0); /* set 0's output, for the comparison */
            CHECK(cb->ctx, attn_cuda_memcpy(cb->ctx, o[k], cb->d_out, n * 2, ATTN_COPY_DEVICE_TO_HOST, NULL));
            cuda_metas_free(metas, nsets);
        }
        bench_prefix_len = bench_prefix_build = 0;
        for (x = 0; x < n; x++) {
            double a = attn_bf16_to_f32(o[0][x]), b = attn_bf16_to_f32(o[1][x]), e = fabs(a - b) / (1.0 + fabs(a));
            if (e > maxdiff) maxdiff = e;
        }
        if (maxdiff > 2e-2) {
            fprintf(stderr, "attn-bench-cuda: cascade and plain forwards differ by %.3g (allowed: bf16 rounding, 2e-2)\n",
                    maxdiff);
            exit(1);
        }
        printf("  batch %3d prefix %5d own %4d: %8.1f us (graph %8.1f) with the prefix, %8.1f us (graph %8.1f) "
               "without: %5.2fx eager, %5.2fx replayed; %6.0f GB/s %5.1f%% of read (max rel diff %.2g)\n", B, P, own,
               eager[1] * 1e6, graph[1] * 1e6, eager[0] * 1e6, graph[0] * 1e6, eager[0] / eager[1], graph[0] / graph[1],
               (double)need / eager[1] / 1e9, 100.0 * (double)need / eager[1] / 1e9 / read_best, maxdiff);
        fflush(stdout);
        row = row_add();
        snprintf(row->name, sizeof row->name, "cascade b=%d prefix=%d own=%d", B, P, own);
        row->ms = eager[1] * 1e3;
        snprintf(row->metric, sizeof row->metric, "%.2fx without (graph %.2fx)", eager[0] / eager[1], graph[0] / graph[1]);
        snprintf(row->ceiling, sizeof row->ceiling, "%.1f%% of read BW", 100.0 * (double)need / eager[1] / 1e9 / read_best);
        row->other_cores = -1;
        csv_row("attn.h", "cascade", B, P, eager[1] * 1e6, eager[0] / eager[1], "x");
        csv_row("attn.h", "cascade_graph", B, P, graph[1] * 1e6, graph[0] / graph[1], "x");
        (void)plain_bytes;
        free(ql); free(sl);
    }
    free(o[0]); free(o[1]);
}

/* 2. The backend on the GPU: ceilings, decode, prefill, a mixed batch (then MLA: 3.). */
/* A device pool of `bytes` 8-bit cache codes 0x20-0x3f (positive, finite values of every
   8-bit type and, read as f32, finite positive scales), filled 64 MiB at a time from one host
   buffer at rotating offsets (LCG from `seed`). */
static void *cuda_code_pool(attn_context *ctx, size_t bytes, uint64_t seed) {
    const size_t chunk = (size_t)64 << 20;
    unsigned char *host = (unsigned char *)bench_alloc(chunk + 1024);
    void *pool = NULL;
    size_t off, i;
    for (i = 0; i < chunk + 1024; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = (unsigned char)(0x20 + ((seed >> 33) & 0x1f));
    }
    CHECK(ctx, attn_cuda_malloc(ctx, bytes, &pool));
    for (off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)pool + off, host + (off / chunk % 7) * 128, n, ATTN_COPY_HOST_TO_DEVICE, NULL));
    }
    free(host);
    return pool;
}

/* 8-bit caches: the decode of the table above (32/8 heads, head 128, q/out bf16, block 16)
   over fp8 e4m3 / e5m2 caches with per-tensor scales and int8 / e4m3 ones with
   per-token-head scales, from a pool of their own (the bf16 pool's block count; codes
   0x20-0x3f, positive values of every type and, read as f32, finite positive scales),
   against the bf16 decode of the same shape measured above: GB/s of cache bytes (codes and
   scales), % of read, speed-up. bf16_us[bi][ci]: the bf16 times (batches 1, 16, 64, 128 x
   contexts 1k, 4k, 16k). */
static void cuda_decode_8bit(attn_context *ctx, const cuda_bench *cb16, double read_best, double bf16_us[4][3]) {
    static const struct { attn_dtype dt; int pth; } kinds[4] = {
        {ATTN_DTYPE_FP8_E4M3, 0}, {ATTN_DTYPE_FP8_E5M2, 0}, {ATTN_DTYPE_INT8, 1}, {ATTN_DTYPE_FP8_E4M3, 1}};
    static const int batches[] = {1, 16, 64, 128}, contexts[] = {1024, 4096, 16384};
    const size_t row_bytes = CB_D + 4; /* the larger layout (per-token-head) sizes the pool */
    const size_t block_bytes = (size_t)2 * CB_BS * CB_HKV * row_bytes;
    cuda_bench cb = *cb16;
    void *pool = cuda_code_pool(ctx, (size_t)cb.num_blocks * block_bytes, 77);
    int k, bi, ci;
    printf("decode, 8-bit caches (q/out bf16; the same shapes; GB/s of cache bytes read: codes, and scales per token "
           "and head; x: speed-up over the bf16 cache above):\n");
    for (k = 0; k < 4; k++) {
        attn_layer_desc d;
        int64_t shape[ATTN_MAX_DIMS];
        int ndim = 0;
        memset(&d, 0, sizeof d);
        d.num_heads = CB_H; d.num_kv_heads = CB_HKV; d.head_size = CB_D; d.block_size = CB_BS;
        d.dtype = ATTN_DTYPE_BF16; d.kv_cache_dtype = kinds[k].dt;
        d.device = ATTN_DEVICE_CUDA;
        if (kinds[k].pth) d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
        else d.k_scale.value = d.v_scale.value = 1.0f / 64;
        bench_layer_create(ctx, &d, NULL, "ATTN_BENCH_KV8_DEFINES", &cb.layer);
        CHECK(ctx, attn_layer_kv_cache_shape(cb.layer, cb.num_blocks, shape, &ndim));
        cb.kv = attn_tensor_make(pool, kinds[k].dt, ndim, shape);
        cb.kv.device.kind = ATTN_DEVICE_CUDA;
        printf("  KV %s%s (backend %s):\n", attn_dtype_name(kinds[k].dt), kinds[k].pth ? " per token+head" : " per tensor",
               attn_layer_backend(cb.layer)->name);
        for (bi = 0; bi < 4; bi++)
            for (ci = 1; ci < 3; ci++) {
                const int B = batches[bi], C = contexts[ci];
                const size_t iter_bytes = (size_t)B * (size_t)C * CB_HKV * (CB_D + (kinds[k].pth ? 4 : 0)) * 2;
                const double med = cuda_decode_time(&cb, B, C, iter_bytes, 0).med, gbs = (double)iter_bytes / med / 1e9;
                bench_row *row;
                printf("    batch %3d context %5d: %9.1f us median  %7.0f GB/s  %5.1f%% of read  %.2fx bf16 (%.1f us)\n",
                       B, C, med * 1e6, gbs, 100.0 * gbs / read_best, bf16_us[bi][ci] / (med * 1e6), bf16_us[bi][ci]);
                fflush(stdout);
                row = row_add();
                snprintf(row->name, sizeof row->name, "decode b=%d ctx=%d, KV %s%s: %.2fx bf16", B, C,
                         attn_dtype_name(kinds[k].dt), kinds[k].pth ? " per token+head" : "", bf16_us[bi][ci] / (med * 1e6));
                row->ms = med * 1e3;
                snprintf(row->metric, sizeof row->metric, "%.0f GB/s KV read", gbs);
                row->read_gbs = gbs;
                row->other_cores = -1;
                {
                    char impl[64];
                    snprintf(impl, sizeof impl, "attn.h %s%s", attn_dtype_name(kinds[k].dt), kinds[k].pth ? " ptk" : "");
                    csv_row(impl, "decode", B, C, med * 1e6, gbs, "GB/s");
                }
            }
        { /* the prefill over the same cache: causal, 4 x 4096 (compare the bf16 prefill rows below) */
            int32_t ql[4] = {4096, 4096, 4096, 4096};
            attn_metadata **metas = cuda_metas(&cb, 4, ql, ql, 4);
            double med = cuda_time(&cb, metas, 4, 4 * 4096, 4), flops = 4.0 * 4.0 * CB_H * CB_D * 4096.0 * 4097 / 2;
            bench_row *row = row_add();
            printf("    prefill causal 4 x 4096: %9.1f us median  %6.1f TFLOP/s\n", med * 1e6, flops / med / 1e12);
            snprintf(row->name, sizeof row->name, "prefill causal b=4 L=4096, KV %s%s", attn_dtype_name(kinds[k].dt),
                     kinds[k].pth ? " per token+head" : "");
            row->ms = med * 1e3;
            snprintf(row->metric, sizeof row->metric, "%.1f TFLOP/s", flops / med / 1e12);
            row->other_cores = -1;
            cuda_metas_free(metas, 4);
        }
        attn_layer_destroy(cb.layer);
    }
    CHECK(ctx, attn_cuda_free(ctx, pool));
}

/* Heads past 256 (issue 23 (5), kernels/paged_attention.cu WIDE HEADS): 32/8 heads, head 512
   (Gemma-class), block 16. bf16: the bf16 pool's bytes seen as head-512 blocks (256 KiB
   each, their own shuffled ids); fp8 e4m3 per tensor: a pool of codes 0x20-0x3f (finite
   positive values). Decode eager and replayed, GB/s of K+V bytes against the run's read
   ceiling (target >= 85 % at batch >= 16 x >= 4k); prefill causal 1 x 4096 and 2 x 2048 in
   TFLOP/s over the causal-useful pairs (4 * 32 * 512 * L(L+1)/2 a sequence) against the
   matmul ceiling (PyTorch's SDPA at head 512 beside it: tools/torch_peer.py --head 512). */
static int cuda_wide_only; /* --case wide: this table alone */
static int cuda_host_only; /* --case host: the host time per forward alone */

/* Host time per forward through the C API (issue 24's baseline for attn_h's prepared path
   and torch ops, tools/op_overhead.py): batch 1 decode over 1024 keys (32/8 heads, head
   128, bf16), 200 forwards enqueued back to back, the host's wall time over them / 200
   (the device runs behind: nothing waits on it inside the group), median of 11 groups. */
static double cuda_host_per_forward(cuda_bench *cb) {
    int32_t ql[1] = {1}, sl[1] = {1024};
    attn_metadata **metas = cuda_metas(cb, 1, ql, sl, 1);
    cuda_forward_call c = cuda_forward_make(cb, metas, 1, 1);
    double t[11];
    int g, k;
    for (g = -1; g < 11; g++) {
        double t0;
        CHECK(cb->ctx, attn_cuda_synchronize(cb->ctx, NULL));
        t0 = now_s();
        for (k = 0; k < 200; k++) cuda_forward_run(&c, 0);
        if (g >= 0) t[g] = (now_s() - t0) / 200;
    }
    CHECK(cb->ctx, attn_cuda_synchronize(cb->ctx, NULL));
    cuda_metas_free(metas, 1);
    return median(t, 11);
}
static void cuda_wide_table(attn_context *ctx, const cuda_bench *cb16, double read_best, double mm) {
    static const int shapes[][2] = {{1, 16384}, {16, 4096}, {16, 16384}, {64, 4096}, {128, 4096}};
    static const int pre[][2] = {{1, 4096}, {2, 2048}};
    enum { WH = 32, WHKV = 8, WD = 512 };
    cuda_bench cb = *cb16;
    void *pool8 = NULL;
    int k, si;
    cb.h = WH;
    cb.d = WD;
    printf("wide heads: %d/%d heads, head %d, block %d (kernels/paged_attention.cu, WIDE HEADS); GB/s = K+V bytes / "
           "time\n", WH, WHKV, WD, CB_BS);
    for (k = 0; k < 2; k++) {
        attn_layer_desc d;
        int64_t shape[ATTN_MAX_DIMS];
        int ndim = 0, esz = k ? 1 : 2;
        const size_t block_bytes = (size_t)2 * CB_BS * WHKV * WD * (size_t)esz;
        memset(&d, 0, sizeof d);
        d.num_heads = WH; d.num_kv_heads = WHKV; d.head_size = WD; d.block_size = CB_BS;
        d.dtype = ATTN_DTYPE_BF16;
        d.kv_cache_dtype = k ? ATTN_DTYPE_FP8_E4M3 : ATTN_DTYPE_BF16;
        if (k) d.k_scale.value = d.v_scale.value = 1.0f / 64;
        d.device = ATTN_DEVICE_CUDA;
        bench_layer_create(ctx, &d, NULL, k ? "ATTN_BENCH_WIDE8_DEFINES" : "ATTN_BENCH_WIDE_DEFINES", &cb.layer);
        if (k) { /* 8 GiB of codes: two sets of the largest case */
            const size_t bytes = (size_t)8 << 30;
            pool8 = cuda_code_pool(ctx, bytes, 99);
            cb.num_blocks = (int64_t)(bytes / block_bytes);
        } else {
            cb.num_blocks = (int64_t)(CUDA_POOL_BYTES / block_bytes);
        }
        cb.ids = (int32_t *)bench_alloc((size_t)cb.num_blocks * sizeof(int32_t));
        shuffle_ids(cb.ids, (int)cb.num_blocks, 43 + k);
        CHECK(ctx, attn_layer_kv_cache_shape(cb.layer, cb.num_blocks, shape, &ndim));
        cb.kv = attn_tensor_make(k ? pool8 : cb16->d_kv, d.kv_cache_dtype, ndim, shape);
        cb.kv.device.kind = ATTN_DEVICE_CUDA;
        printf("  KV %s (backend %s, decode kernel: %s):\n", attn_dtype_name(d.kv_cache_dtype),
               attn_layer_backend(cb.layer)->name, attn_layer_selection(cb.layer)->kernel_defines);
        for (si = 0; si < 5; si++) {
            const int B = shapes[si][0], C = shapes[si][1];
            const size_t iter_bytes = (size_t)B * (size_t)C * WHKV * WD * 2 * (size_t)esz; /* K + V */
            const cuda_decode_run run = cuda_decode_time(&cb, B, C, iter_bytes, 1);
            const double gbs = (double)iter_bytes / run.med / 1e9, ggbs = (double)iter_bytes / run.graph / 1e9;
            bench_row *row;
            char kind[48];
            printf("    decode batch %3d context %5d: %9.1f us median  %7.0f GB/s  %5.1f%% of read; graph replay %9.1f "
                   "us  %7.0f GB/s  %5.1f%%\n", B, C, run.med * 1e6, gbs, 100.0 * gbs / read_best, run.graph * 1e6, ggbs,
                   100.0 * ggbs / read_best);
            fflush(stdout);
            row = row_add();
            snprintf(row->name, sizeof row->name, "head 512 decode b=%d ctx=%d, KV %s", B, C, attn_dtype_name(d.kv_cache_dtype));
            row->ms = run.med * 1e3;
            snprintf(row->metric, sizeof row->metric, "%.0f GB/s KV read (graph %.0f)", gbs, ggbs);
            row->read_gbs = gbs;
            row->other_cores = -1;
            snprintf(kind, sizeof kind, "decode_d512_%s", k ? "fp8" : "bf16");
            csv_row("attn.h", kind, B, C, run.med * 1e6, gbs, "GB/s");
            snprintf(kind, sizeof kind, "decode_graph_d512_%s", k ? "fp8" : "bf16");
            csv_row("attn.h", kind, B, C, run.graph * 1e6, ggbs, "GB/s");
        }
        for (si = 0; si < 2; si++) {
            const int B = pre[si][0], L = pre[si][1], nsets = 4;
            int32_t ql[2], sl[2];
            attn_metadata **metas;
            double med, tf, flops = (double)B * 4.0 * WH * WD * (double)L * (L + 1) / 2;
            bench_row *row;
            char kind[48];
            ql[0] = ql[1] = sl[0] = sl[1] = L;
            metas = cuda_metas(&cb, B, ql, sl, nsets);
            med = cuda_time(&cb, metas, nsets, B * L, 4);
            tf = flops / med / 1e12;
            printf("    prefill causal %d x %5d: %9.1f us median  %6.1f TFLOP/s  %5.1f%% of the matmul ceiling\n", B, L,
                   med * 1e6, tf, mm > 0 ? 100.0 * tf / mm : 0.0);
            fflush(stdout);
            row = row_add();
            snprintf(row->name, sizeof row->name, "head 512 prefill causal b=%d L=%d, KV %s", B, L,
                     attn_dtype_name(d.kv_cache_dtype));
            row->ms = med * 1e3;
            snprintf(row->metric, sizeof row->metric, "%.1f TFLOP/s", tf);
            if (mm > 0) snprintf(row->ceiling, sizeof row->ceiling, "%.1f%% of the matmul ceiling", 100.0 * tf / mm);
            row->other_cores = -1;
            snprintf(kind, sizeof kind, "prefill_d512_%s", k ? "fp8" : "bf16");
            csv_row("attn.h", kind, B, L, med * 1e6, tf, "TFLOP/s");
            cuda_metas_free(metas, nsets);
        }
        attn_layer_destroy(cb.layer);
        free(cb.ids);
    }
    if (pool8) CHECK(ctx, attn_cuda_free(ctx, pool8));
}

static void cuda_backend_table(attn_context *ctx, const attn_platform *plat, int quick) {
    static const int batches[] = {1, 16, 64, 128}, contexts[] = {1024, 4096, 16384};
    static const int pre_b[] = {4, 1}, pre_l[] = {4096, 16384};
    const size_t block_bytes = (size_t)2 * CB_BS * CB_HKV * CB_D * 2;
    cuda_bench cb;
    attn_layer_desc d;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim, bi, ci, i;
    uint16_t *host;
    size_t chunk = (size_t)64 << 20, off;
    double read_best, read_med, read_best2, read_med2, mm, launch, t0, bf16_us[4][3];
    char name[96];

    memset(&cb, 0, sizeof cb);
    cb.ctx = ctx;
    cb.groups = quick ? 5 : 11;
    cb.sms = plat->cuda_multiprocessors;
    cb.h = CB_H;
    cb.d = CB_D;
    cb.num_blocks = (int64_t)(CUDA_POOL_BYTES / block_bytes);
    memset(&d, 0, sizeof d);
    d.num_heads = CB_H; d.num_kv_heads = CB_HKV; d.head_size = CB_D; d.block_size = CB_BS;
    d.dtype = d.kv_cache_dtype = ATTN_DTYPE_BF16;
    d.device = ATTN_DEVICE_CUDA;
    CHECK(ctx, attn_layer_create(ctx, &d, NULL, &cb.layer));
    printf("layer (32/8 heads, head 128, bf16, block 16): backend %s%s (ATTN_BACKEND=CUDA for the "
           "mma.sync prefill)\n", attn_layer_backend(cb.layer)->name,
           attn_layer_backend(cb.layer)->id == ATTN_BACKEND_CUDA_SM90 ? ", prefill tiles on wgmma (sm_90a)" : "");
    CHECK(ctx, attn_layer_kv_cache_shape(cb.layer, cb.num_blocks, shape, &ndim));
    t0 = now_s();
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)cb.num_blocks * block_bytes, &cb.d_kv));
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)CUDA_MAX_TOKENS * CB_H * CB_D * 2, &cb.d_q));
    CHECK(ctx, attn_cuda_malloc(ctx, (size_t)CUDA_MAX_TOKENS * CB_H * CB_D * 2, &cb.d_out));
    host = (uint16_t *)bench_alloc(chunk + 1024);
    fill_random(host, ATTN_DTYPE_BF16, (chunk + 1024) / 2, 5);
    /* random bf16 in [-1, 1); each 64 MiB chunk from another offset of the host buffer */
    for (off = 0; off < (size_t)cb.num_blocks * block_bytes; off += chunk)
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)cb.d_kv + off, (const char *)host + (off / chunk % 7) * 128,
                                    chunk, ATTN_COPY_HOST_TO_DEVICE, NULL));
    for (off = 0; off < (size_t)CUDA_MAX_TOKENS * CB_H * CB_D * 2; off += chunk) /* q: 128 MiB */
        CHECK(ctx, attn_cuda_memcpy(ctx, (char *)cb.d_q + off, (const char *)host + (off / chunk % 7) * 128 + 64,
                                    chunk, ATTN_COPY_HOST_TO_DEVICE, NULL));
    free(host);
    printf("KV cache: %.1f GiB on the device (%lld blocks of 16 tokens), filled in %.1f s\n",
           (double)cb.num_blocks * (double)block_bytes / (1 << 30), (long long)cb.num_blocks, now_s() - t0);
    cb.kv = attn_tensor_make(cb.d_kv, ATTN_DTYPE_BF16, ndim, shape);
    cb.kv.device.kind = ATTN_DEVICE_CUDA;
    cb.ids = (int32_t *)bench_alloc((size_t)cb.num_blocks * sizeof(int32_t));
    shuffle_ids(cb.ids, (int)cb.num_blocks, 41);

    read_best = cuda_read_ceiling(ctx, cb.d_kv, (size_t)4 << 30, cb.sms, 10, &read_med);
    printf("read ceiling: %.0f GB/s best, %.0f median (attn_read_probe, 4 GiB, 10 passes)\n", read_best, read_med);
    mm = cuda_matmul_ceiling(&cb);
    if (mm > 0) printf("matmul ceiling: %.0f TFLOP/s (cuBLAS bf16 GEMM 8192^3, fp32 accumulate, best of 10)\n", mm);
    launch = cuda_launch_floor(&cb);
    printf("launch floor: %.2f us per launch (empty kernel, back to back on one stream; a forward is 2 "
           "launches: %.1f us before any byte is read)\n", launch * 1e6, 2 * launch * 1e6);
    csv_row("device", "launch_floor", 0, 0, launch * 1e6, 0, "us");
    fflush(stdout);

    printf("decode: %d/%d heads, head %d, bf16, block %d; GB/s = K+V bytes of the batch / time per forward (the "
           "schedule - work items, merges, wide tiles - is not shown: attn.h has no public query of a metadata's "
           "schedule)\n", CB_H, CB_HKV, CB_D, CB_BS);
    memset(bf16_us, 0, sizeof bf16_us);
    /* ATTN_BENCH_KV8_ONLY (tuning): the 8-bit table alone, no bf16 rows to compare with */
    /* ATTN_BENCH_CAPACITY_ONLY (tuning): the capacity-256 decode table alone */
    if (cuda_wide_only) {
        cuda_wide_table(ctx, &cb, read_best, mm);
        goto ceilings;
    }
    {
        const double host = cuda_host_per_forward(&cb);
        printf("host time per forward (C API, batch 1 x 1024 decode, 200 enqueued back to back, median of 11): "
               "%.2f us\n", host * 1e6);
        csv_row("attn.h", "host_per_forward", 1, 1024, host * 1e6, 0, "us");
        fflush(stdout);
        if (cuda_host_only) goto ceilings;
    }
    for (bi = 0; bi < (cuda_mla_only || getenv("ATTN_BENCH_KV8_ONLY") || getenv("ATTN_BENCH_CAPACITY_ONLY") ? 0 : 4); bi++)
        for (ci = 0; ci < 3; ci++) {
            const int B = batches[bi], C = contexts[ci];
            const size_t iter_bytes = (size_t)B * (size_t)C * CB_HKV * CB_D * 2 * 2;
            const cuda_decode_run run = cuda_decode_time(&cb, B, C, iter_bytes, 1);
            const double med = run.med, gbs = (double)iter_bytes / med / 1e9;
            bench_row *row;
            bf16_us[bi][ci] = med * 1e6;
            printf("  batch %3d context %5d: %9.1f us median  %7.0f GB/s  %5.1f%% of read; graph replay %9.1f us  "
                   "%7.0f GB/s  [%d sets x %.1f MiB]\n", B, C, med * 1e6, gbs, 100.0 * gbs / read_best, run.graph * 1e6,
                   (double)iter_bytes / run.graph / 1e9, run.nsets, (double)iter_bytes / MIB);
            fflush(stdout);
            row = row_add();
            snprintf(row->name, sizeof row->name, "decode b=%d ctx=%d", B, C);
            row->ms = med * 1e3;
            snprintf(row->metric, sizeof row->metric, "%.0f GB/s KV read", gbs);
            row->read_gbs = gbs;
            row->other_cores = -1;
            csv_row("attn.h", "decode", B, C, med * 1e6, gbs, "GB/s");
            csv_row("attn.h", "decode_graph", B, C, run.graph * 1e6, (double)iter_bytes / run.graph / 1e9, "GB/s");
        }

    /* An engine captures one graph per batch-size bucket with metadata created for its
       max_num_reqs, and replays it for smaller batches: the same decodes with a capacity of
       256 requests (and tokens), eager and replayed. */
    if (!cuda_mla_only && !getenv("ATTN_BENCH_KV8_ONLY")) {
        static const int cap_b[] = {1, 16, 64}, cap_c[] = {1024, 4096};
        printf("decode, metadata capacity 256 requests (an engine's graph replayed for a smaller batch):\n");
        bench_capacity_reqs = 256;
        for (bi = 0; bi < 3; bi++)
            for (ci = 0; ci < 2; ci++) {
                const int B = cap_b[bi], C = cap_c[ci];
                const size_t iter_bytes = (size_t)B * (size_t)C * CB_HKV * CB_D * 2 * 2;
                const cuda_decode_run run = cuda_decode_time(&cb, B, C, iter_bytes, 1);
                printf("  batch %3d context %5d: %9.1f us median  %7.0f GB/s; graph replay %9.1f us  %7.0f GB/s\n", B, C,
                       run.med * 1e6, (double)iter_bytes / run.med / 1e9, run.graph * 1e6,
                       (double)iter_bytes / run.graph / 1e9);
                fflush(stdout);
                csv_row("attn.h", "decode_cap256", B, C, run.med * 1e6, (double)iter_bytes / run.med / 1e9, "GB/s");
                csv_row("attn.h", "decode_graph_cap256", B, C, run.graph * 1e6, (double)iter_bytes / run.graph / 1e9, "GB/s");
            }
        bench_capacity_reqs = 0;
        /* speculative decoding: 2, 4, 8 query tokens per request (the K/V bytes are read once
           per request when a request's rows fit one tile per KV head) */
        printf("spec decode: %d/%d heads, head %d, bf16; query tokens per request 2 / 4 / 8 (causal within "
               "the draft); GB/s = K+V bytes / time, as the decode table\n", CB_H, CB_HKV, CB_D);
        for (bi = 0; bi < 2; bi++)
            for (ci = 0; ci < 3; ci++) {
                static const int sb[] = {16, 64}, sq[] = {2, 4, 8};
                const int B = sb[bi], C = 4096;
                const size_t iter_bytes = (size_t)B * (size_t)C * CB_HKV * CB_D * 2 * 2;
                cuda_decode_run run;
                bench_decode_qlen = sq[ci];
                run = cuda_decode_time(&cb, B, C, iter_bytes, 1);
                printf("  batch %3d context %5d, %d query tokens: %9.1f us median  %7.0f GB/s  %5.1f%% of read; graph "
                       "replay %9.1f us\n", B, C, sq[ci], run.med * 1e6, (double)iter_bytes / run.med / 1e9,
                       100.0 * (double)iter_bytes / run.med / 1e9 / read_best, run.graph * 1e6);
                fflush(stdout);
                csv_row("attn.h", sq[ci] == 2 ? "spec_decode_q2" : sq[ci] == 4 ? "spec_decode_q4" : "spec_decode_q8", B, C,
                        run.med * 1e6, (double)iter_bytes / run.med / 1e9, "GB/s");
            }
        bench_decode_qlen = 1;
        cuda_cascade_table(&cb, read_best);
    }

    if (!cuda_mla_only && !getenv("ATTN_BENCH_CAPACITY_ONLY")) cuda_decode_8bit(ctx, &cb, read_best, bf16_us);

    printf("prefill: causal, %d/%d heads, head %d, bf16; TFLOP/s over causal-useful pairs, "
           "4 * heads * head * L(L+1)/2 per sequence\n", CB_H, CB_HKV, CB_D);
    for (i = 0; i < (cuda_mla_only || cuda_decode_only ? 0 : 2); i++) {
        int B = pre_b[i], L = pre_l[i], r, nsets = 4;
        int32_t ql[4], sl[4];
        attn_metadata **metas;
        double med, tf, flops = (double)B * 4.0 * CB_H * CB_D * (double)L * (L + 1) / 2;
        bench_row *row;
        for (r = 0; r < B; r++) { ql[r] = L; sl[r] = L; }
        metas = cuda_metas(&cb, B, ql, sl, nsets);
        med = cuda_time(&cb, metas, nsets, B * L, 4);
        tf = flops / med / 1e12;
        printf("  batch %d x %5d: %9.1f us median  %6.1f TFLOP/s  %5.1f%% of the matmul ceiling\n", B, L, med * 1e6,
               tf, mm > 0 ? 100.0 * tf / mm : 0.0);
        fflush(stdout);
        row = row_add();
        snprintf(row->name, sizeof row->name, "prefill causal b=%d L=%d", B, L);
        row->ms = med * 1e3;
        snprintf(row->metric, sizeof row->metric, "%.1f TFLOP/s", tf);
        if (mm > 0) snprintf(row->ceiling, sizeof row->ceiling, "%.1f%% of the matmul ceiling", 100.0 * tf / mm);
        else snprintf(row->ceiling, sizeof row->ceiling, "matmul ceiling not measured");
        row->other_cores = -1;
        csv_row("attn.h", "prefill", B, L, med * 1e6, tf, "TFLOP/s");
        cuda_metas_free(metas, nsets);
    }

    if (!cuda_mla_only && !cuda_decode_only) { /* vLLM's chunked prefill: one chunk of 2048 over 8192 cached tokens + 64 decodes of 4096 */
        int32_t ql[65], sl[65];
        attn_metadata **metas;
        double t_mix, t_pre, t_dec;
        bench_row *row;
        ql[0] = 2048; sl[0] = 8192 + 2048;
        for (i = 1; i <= 64; i++) { ql[i] = 1; sl[i] = 4096; }
        metas = cuda_metas(&cb, 65, ql, sl, 4);
        t_mix = cuda_time(&cb, metas, 4, 2048 + 64, 10);
        cuda_metas_free(metas, 4);
        metas = cuda_metas(&cb, 1, ql, sl, 4);
        t_pre = cuda_time(&cb, metas, 4, 2048, 10);
        cuda_metas_free(metas, 4);
        metas = cuda_metas(&cb, 64, ql + 1, sl + 1, 4);
        t_dec = cuda_time(&cb, metas, 4, 64, 20);
        cuda_metas_free(metas, 4);
        printf("mixed batch (1 prefill chunk of 2048 over 8192 cached + 64 decodes of 4096): %.1f us; its parts "
               "alone %.1f + %.1f = %.1f us (mixed / parts = %.2f)\n", t_mix * 1e6, t_pre * 1e6, t_dec * 1e6,
               (t_pre + t_dec) * 1e6, t_mix / (t_pre + t_dec));
        row = row_add();
        snprintf(name, sizeof name, "mixed: chunk 2048 over 8k + 64 decodes of 4k");
        snprintf(row->name, sizeof row->name, "%s", name);
        row->ms = t_mix * 1e3;
        snprintf(row->metric, sizeof row->metric, "parts alone %.1f + %.1f us", t_pre * 1e6, t_dec * 1e6);
        snprintf(row->ceiling, sizeof row->ceiling, "%.2f x the sum of its parts", t_mix / (t_pre + t_dec));
        row->other_cores = -1;
        csv_row("attn.h", "mixed", 65, 4096, t_mix * 1e6, (t_pre + t_dec) * 1e6, "us_parts");
    }

    if (!cuda_decode_only) cuda_mla_table(ctx, &cb, read_best, mm);
    if (!cuda_decode_only && !cuda_mla_only) cuda_wide_table(ctx, &cb, read_best, mm);
ceilings:
    read_best2 = cuda_read_ceiling(ctx, cb.d_kv, (size_t)4 << 30, cb.sms, 10, &read_med2);
    if (read_best2 > read_best) read_best = read_best2;
    printf("read ceiling after the table: %.0f GB/s best, %.0f median; rows use the best of the run, %.0f GB/s\n",
           read_best2, read_med2, read_best);
    csv_row("device", "ceiling_read", 0, 0, 0, read_best, "GB/s");
    if (mm > 0) csv_row("cublas", "ceiling_matmul", 0, 0, 0, mm, "TFLOP/s");
    {
        bench_row *row = row_add();
        snprintf(row->name, sizeof row->name, "ceiling: device read (attn_read_probe, 4 GiB)");
        snprintf(row->metric, sizeof row->metric, "%.0f GB/s", read_best);
        snprintf(row->ceiling, sizeof row->ceiling, "100%% (best of 20 passes)");
        row->other_cores = -1;
        row = row_add();
        snprintf(row->name, sizeof row->name, "floor: one empty launch, back to back");
        row->ms = launch * 1e3;
        snprintf(row->metric, sizeof row->metric, "%.2f us", launch * 1e6);
        snprintf(row->ceiling, sizeof row->ceiling, "a forward is 2 launches");
        row->other_cores = -1;
        if (mm > 0) {
            row = row_add();
            snprintf(row->name, sizeof row->name, "ceiling: bf16 matmul (cuBLAS 8192^3)");
            snprintf(row->metric, sizeof row->metric, "%.0f TFLOP/s", mm);
            snprintf(row->ceiling, sizeof row->ceiling, "100%% (best of 10)");
            row->other_cores = -1;
        }
    }
    for (i = 0; i < num_rows; i++) /* decode rows against the run's best read */
        if (rows[i].read_gbs > 0)
            snprintf(rows[i].ceiling, sizeof rows[i].ceiling, "%.1f%% of read BW", 100.0 * rows[i].read_gbs / read_best);
    attn_layer_destroy(cb.layer);
    CHECK(ctx, attn_cuda_free(ctx, cb.d_kv));
    CHECK(ctx, attn_cuda_free(ctx, cb.d_q));
    CHECK(ctx, attn_cuda_free(ctx, cb.d_out));
    free(cb.ids);
}

/* ---------------------------------------------------------------------------------------
   main
   ------------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: attn-bench-cuda [--quick] [--case decode|prefill|mla|wide|host|all] [--csv FILE] [--mla-backend NAME]\n"
               "       attn-bench-cuda --selftest ROWS   the result table alone, with ROWS synthetic rows\n"
               "       (attn-bench --device cuda ... runs this program with the same arguments)\n"
               "  On a GPU: NVRTC compile time per kernel variant (attn_layer_create in a fresh kernel cache)\n"
               "  and warm start per layer; the CUDA decode, 8-bit decode, prefill, mixed-batch and MLA\n"
               "  tables against the device's read bandwidth and bf16 matmul rate. Without a GPU (or\n"
               "  NVRTC): one SKIP line with the reason, exit 0.\n"
               "  --csv FILE    also write the rows as CSV (tools/plot_bench.py)\n"
               "  --quick       fewer repetitions\n"
               "  --case C      decode (the decode tables: bf16, 8-bit), prefill, mla, wide (head 512),\n"
               "                host (the host time per forward) or all (default all)\n"
               "  --mla-backend NAME  the MLA table's layers forced onto NAME (CUDA_MLA: the mma.sync\n"
               "                fallback on a Hopper GPU; default: the selector's choice)\n"
               "  --device cuda, --threads N   accepted (attn-bench's options); --threads has no effect here\n"
               "Tuning: ATTN_BENCH_KV8_DEFINES=\"KV_TILE=64 KV_STAGES=3 ...\" compiles the 8-bit table's decode\n"
               "tiles with these defines (through the library's ATTN_KERNEL_DEFINES, read at layer creation;\n"
               "the layer's record shows them); ATTN_BENCH_MLA_DEFINES the same for the MLA tables;\n"
               "ATTN_BENCH_KV8_ONLY=1 skips the bf16 decode rows; ATTN_BENCH_MLA_SPLITS=N forces the fp8\n"
               "latent's split count; ATTN_BENCH_MLA_FP8_ONLY=\"six bf16 times\" (ATTN_BENCH_MLA_FP8_H128=1:\n"
               "the 128-head rows) times the fp8 latent alone.\n");
}

/* Without a device, NVRTC or a capable GPU: the reason on one line, success. */
static int skip(const char *why) {
    printf("SKIP attn-bench-cuda: %s\n", why);
    return 0;
}

int main(int argc, char **argv) {
    attn_context *ctx = NULL;
    attn_platform plat;
    int i, quick = 0, run_decode = 1, run_prefill = 1, run_mla = 1;
    const char *csv_path = NULL;
    char cmd[1024], why[1024];

    bench_name = "attn-bench-cuda";
    if (argc == 3 && !strcmp(argv[1], "--selftest")) return bench_selftest(atoi(argv[2]));
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
            csv_path = argv[++i];
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            if (strcmp(argv[++i], "cuda") != 0) {
                fprintf(stderr, "attn-bench-cuda: --device %s (allowed: cuda; the CPU bench is attn-bench)\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            i++; /* attn_context_desc.num_threads of the CPU bench: nothing to set here */
        } else if (!strcmp(argv[i], "--case") && i + 1 < argc) {
            const char *c = argv[++i];
            if (!strcmp(c, "decode")) { run_decode = 1; run_prefill = 0; run_mla = 0; }
            else if (!strcmp(c, "prefill")) { run_decode = 0; run_prefill = 1; run_mla = 0; }
            else if (!strcmp(c, "mla")) { run_decode = 0; run_prefill = 0; run_mla = 1; }
            else if (!strcmp(c, "all")) { run_decode = 1; run_prefill = 1; run_mla = 1; }
            else if (!strcmp(c, "wide")) { run_decode = 0; run_prefill = 0; run_mla = 0; cuda_wide_only = 1; }
            else if (!strcmp(c, "host")) { run_decode = 0; run_prefill = 0; run_mla = 0; cuda_host_only = 1; }
            else {
                fprintf(stderr, "attn-bench-cuda: --case %s (allowed: decode, prefill, mla, wide, host, all)\n", c);
                return 2;
            }
        } else if (!strcmp(argv[i], "--mla-backend") && i + 1 < argc) {
            if (attn_backend_from_name(argv[++i], &mla_request.backend) != ATTN_OK) {
                fprintf(stderr, "attn-bench-cuda: --mla-backend %s (allowed: a registered backend name, e.g. "
                        "CUDA_MLA_SM90 or CUDA_MLA)\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "attn-bench-cuda: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    command_line(argc, argv, cmd, sizeof cmd);
    cuda_mla_only = run_mla && !run_decode && !run_prefill;
    cuda_decode_only = run_decode && !run_prefill && !run_mla;

    ctx = cuda_bench_context(NULL);
    CHECK(ctx, attn_platform_get(ctx, &plat));
    attn_context_destroy(ctx); /* the tables make their own contexts */
    if (plat.kind != ATTN_PLATFORM_CUDA) {
        snprintf(why, sizeof why, "no CUDA device (%s)", plat.cuda_reason);
        return skip(why);
    }
    if (plat.cuda_capability_major < 8) {
        snprintf(why, sizeof why, "%s has compute capability %d.%d (the CUDA backends need 8.0 or newer)",
                 plat.cuda_device_name, plat.cuda_capability_major, plat.cuda_capability_minor);
        return skip(why);
    }
    if (!plat.nvrtc_version) {
        snprintf(why, sizeof why, "attn.h found no NVRTC (%s)", plat.nvrtc_reason);
        return skip(why);
    }
    if (csv_path && !csv_open(csv_path)) {
        fprintf(stderr, "attn-bench-cuda: --csv %s: cannot write it\n", csv_path);
        return 2;
    }
    printf("attn-bench (attn.h %s): CUDA backend (tools/attn-bench-cuda.c, public API)\n", ATTN_VERSION_STRING);
    printf("GPU: %s, compute capability %d.%d, %d SMs, %.0f GiB; driver %d\n", plat.cuda_device_name,
           plat.cuda_capability_major, plat.cuda_capability_minor, plat.cuda_multiprocessors,
           (double)plat.cuda_memory_bytes / (1 << 30), plat.cuda_driver_version);
    printf("command: %s\n\n", cmd);
    fflush(stdout);
    /* before the tool takes the primary context: the warm rounds time its first retain */
    if (!cuda_mla_only && !cuda_wide_only && !cuda_host_only) cuda_compile_times(&plat, quick);
    printf("\n");
    if (!gpu_open(&plat, why, sizeof why)) {
        gpu_close();
        csv_close();
        fprintf(stderr, "attn-bench-cuda: the device's ceilings cannot be measured: %s\n", why);
        return 1;
    }
    ctx = cuda_bench_context(NULL);
    cuda_backend_table(ctx, &plat, quick);
    attn_context_destroy(ctx);
    gpu_close();
    printf("\n");
    rows_print();
    printf("\ncommand: %s\n", cmd);
    csv_close();
    rows_free();
    return 0;
}
