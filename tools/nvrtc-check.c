/* nvrtc-check - compiles every kernel variant of a built-in manifest with NVRTC, as the
   CUDA backend will at run time, and checks what ptxas reports.

   The sources are the ones embedded in attn.h (the generated block between >>kernels-begin
   and >>kernels-end; `make embed` writes it), or those of a directory (--dir). Every .cuh
   file is handed to nvrtcCreateProgram as a named header, so `#include "attn_common.cuh"`
   resolves with no include path. Each variant is compiled to CUBIN for sm_80 and sm_90
   with --ptxas-options=-v; the table lists, per kernel: registers, shared memory (static
   + the dynamic bytes a variant exports in attn_paged_config), spill bytes and compile
   time. No CUDA header and no GPU are needed: libnvrtc is opened with dlopen
   (libnvrtc.so.13, .12, libnvrtc.so, then under $CUDA_HOME, $CUDA_PATH and
   /usr/local/cuda).

   Exit status: 0 all compiled with no spill and within the shared-memory limit of the
   architecture; 1 a compile error, a spill or too much shared memory; 2 bad flags;
   3 libnvrtc cannot be loaded (--probe prints why and exits 3 the same way). */
#define _POSIX_C_SOURCE 200809L
#define ATTN_IMPLEMENTATION
#include "attn.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the NVRTC subset, declared here (no CUDA header) ---- */
typedef int nvrtc_result; /* nvrtcResult: 0 = NVRTC_SUCCESS */
typedef struct nvrtc_program_s *nvrtc_program;
typedef struct nvrtc_api {
    const char *(*GetErrorString)(nvrtc_result);
    nvrtc_result (*Version)(int *, int *);
    nvrtc_result (*CreateProgram)(nvrtc_program *, const char *, const char *, int, const char *const *,
                                  const char *const *);
    nvrtc_result (*DestroyProgram)(nvrtc_program *);
    nvrtc_result (*CompileProgram)(nvrtc_program, int, const char *const *);
    nvrtc_result (*GetProgramLogSize)(nvrtc_program, size_t *);
    nvrtc_result (*GetProgramLog)(nvrtc_program, char *);
    nvrtc_result (*GetCUBINSize)(nvrtc_program, size_t *);
    nvrtc_result (*GetCUBIN)(nvrtc_program, char *);
    nvrtc_result (*GetPTXSize)(nvrtc_program, size_t *);
    nvrtc_result (*GetPTX)(nvrtc_program, char *);
} nvrtc_api;

static nvrtc_api nv;
static const char *save_dir; /* --save: write every CUBIN there */
static char nv_library[256];

static int load_nvrtc(char *reason, size_t size) {
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    static const char *const syms[] = {"nvrtcGetErrorString", "nvrtcVersion", "nvrtcCreateProgram",
                                       "nvrtcDestroyProgram", "nvrtcCompileProgram",
                                       "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
                                       "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcGetPTXSize",
                                       "nvrtcGetPTX"};
    const char *dirs[4];
    void *lib = NULL;
    size_t i, d, nd = 0;
    dirs[nd++] = "";
    if (getenv("CUDA_HOME")) dirs[nd++] = getenv("CUDA_HOME");
    if (getenv("CUDA_PATH")) dirs[nd++] = getenv("CUDA_PATH");
    dirs[nd++] = "/usr/local/cuda";
    for (d = 0; d < nd && !lib; d++)
        for (i = 0; i < sizeof names / sizeof names[0] && !lib; i++) {
            if (d == 0) snprintf(nv_library, sizeof nv_library, "%s", names[i]);
            else snprintf(nv_library, sizeof nv_library, "%s/lib64/%s", dirs[d], names[i]);
            lib = dlopen(nv_library, RTLD_NOW | RTLD_LOCAL);
        }
    if (!lib) {
        snprintf(reason, size, "libnvrtc not found (tried libnvrtc.so.13, .12, libnvrtc.so in the "
                               "loader path, $CUDA_HOME, $CUDA_PATH and /usr/local/cuda/lib64)");
        return 0;
    }
    for (i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *sym = dlsym(lib, syms[i]);
        if (!sym) {
            snprintf(reason, size, "%s lacks %s", nv_library, syms[i]);
            return 0;
        }
        memcpy((char *)&nv + i * sizeof sym, &sym, sizeof sym); /* object -> function pointer */
    }
    return 1;
}

/* ---- sources ---- */
#define MAX_FILES 16
static int num_files;
static const char *file_name[MAX_FILES];
static char *file_text[MAX_FILES];

static char *join_lines(const char *const *lines) {
    size_t n = 1, i;
    char *s, *p;
    for (i = 0; lines[i]; i++) n += strlen(lines[i]);
    s = p = (char *)malloc(n);
    if (!s) return NULL;
    for (i = 0; lines[i]; i++) {
        size_t k = strlen(lines[i]);
        memcpy(p, lines[i], k);
        p += k;
    }
    *p = 0;
    return s;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char *s;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    s = (char *)malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* The embedded table names the files (attn__kernel_source_name / _lines, generated by
   tools/embed.py); --dir reads the same names from a directory. */
static int load_sources(const char *dir) {
    int i;
    const char *name;
    for (i = 0; (name = attn__kernel_source_name(i)) != NULL && num_files < MAX_FILES; i++) {
        file_name[num_files] = name;
        if (dir) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dir, name);
            file_text[num_files] = read_file(path);
            if (!file_text[num_files]) { fprintf(stderr, "nvrtc-check: cannot read %s\n", path); return 0; }
        } else {
            file_text[num_files] = join_lines(attn__kernel_source_lines(name));
            if (!file_text[num_files]) return 0;
        }
        num_files++;
    }
    return 1;
}

static const char *source_of(const char *name) {
    int i;
    for (i = 0; i < num_files; i++)
        if (!strcmp(file_name[i], name)) return file_text[i];
    return NULL;
}

/* ---- the manifest: representative variants of every kernel ---- */
typedef struct variant { const char *file, *defines; } variant;

#define PA(hd, bs, grp, dq, dkv, tt, flags) \
    {"paged_attention.cu", "HEAD_DIM=" #hd " BLOCK_SIZE=" #bs " GROUP=" #grp " DT_Q=" #dq " DT_KV=" #dkv \
                           " TILE_TOKENS=" #tt flags}

static variant manifest_builtin[] = {
    /* decode (TILE_TOKENS = 16 / GROUP) and prefill (64 / GROUP) shapes; DT 0 f32, 1 f16, 2 bf16 */
    PA(128, 16, 4, 2, 2, 4, ""),   /* the decode target: 32/8 heads, bf16, block 16 */
    PA(128, 16, 4, 2, 2, 16, ""),  /* the prefill target */
    PA(128, 32, 4, 1, 1, 4, ""),
    PA(128, 32, 4, 1, 1, 16, ""),
    PA(128, 16, 8, 2, 2, 2, ""),
    PA(128, 16, 8, 1, 1, 8, ""),
    PA(128, 16, 1, 2, 2, 16, ""),
    PA(128, 16, 1, 1, 1, 64, ""),
    PA(64, 16, 1, 1, 1, 16, ""),
    PA(64, 16, 4, 2, 2, 16, ""),
    PA(80, 16, 4, 1, 1, 4, ""),
    PA(80, 16, 4, 2, 2, 16, ""),
    PA(96, 32, 8, 2, 2, 2, ""),
    PA(96, 16, 8, 1, 1, 8, ""),
    PA(120, 16, 4, 2, 2, 16, ""),  /* HEAD_DIM % 16 == 8: zero columns */
    PA(256, 16, 4, 2, 2, 4, ""),
    PA(256, 16, 4, 2, 2, 16, ""),
    PA(256, 32, 8, 1, 1, 8, ""),
    PA(128, 16, 3, 2, 2, 5, ""),   /* a group that is no power of two */
    PA(128, 16, 16, 2, 2, 1, ""),
    /* the FMA variants: f32, and q/cache types that differ */
    PA(128, 16, 4, 0, 0, 4, ""),
    PA(128, 16, 4, 0, 0, 16, ""),
    PA(64, 32, 1, 0, 0, 64, ""),
    PA(256, 16, 4, 0, 0, 4, ""),
    PA(256, 16, 4, 0, 0, 16, ""),
    PA(128, 16, 4, 1, 0, 16, ""),
    PA(128, 16, 4, 2, 1, 4, ""),
    /* each feature flag once, then all together (causality is per work item, not a define) */
    PA(128, 16, 4, 2, 2, 16, " WINDOW=1"),
    PA(128, 16, 4, 1, 1, 16, " SOFTCAP=1"),
    PA(128, 16, 4, 2, 2, 16, " ALIBI=1"),
    PA(128, 16, 4, 2, 2, 4, " WINDOW=1 SOFTCAP=1 ALIBI=1"),
    PA(256, 16, 4, 0, 0, 16, " WINDOW=1 SOFTCAP=1 ALIBI=1"),
    /* cache writes (DT 0 f32, 1 f16, 2 bf16) */
    {"cache_write.cu", "HEAD_DIM=128 DT_IN=1 DT_CACHE=1"},
    {"cache_write.cu", "HEAD_DIM=128 DT_IN=2 DT_CACHE=2"},
    {"cache_write.cu", "HEAD_DIM=80 DT_IN=0 DT_CACHE=1"},
    {"cache_write.cu", "HEAD_DIM=256 DT_IN=1 DT_CACHE=0"},
    {"cache_write.cu", "KV_LORA_RANK=512 ROPE_DIM=64 DT_IN=2 DT_CACHE=2"},
    {"cache_write.cu", "KV_LORA_RANK=256 ROPE_DIM=64 DT_IN=0 DT_CACHE=2"},
    /* the library's own utilities */
    {"util.cu", ""},
    /* LSE merge */
    {"merge.cu", "HEAD_DIM=128 DT=1"},
    {"merge.cu", "HEAD_DIM=128 DT=2"},
    {"merge.cu", "HEAD_DIM=64 DT=0"},
    {"merge.cu", "HEAD_DIM=100 DT=2"},
    {"merge.cu", "HEAD_DIM=512 DT=1"},
};
static variant *manifest = manifest_builtin;
static int num_variants = (int)(sizeof manifest_builtin / sizeof manifest_builtin[0]);
static variant custom;

static const int archs[] = {80, 90};
#define NUM_ARCHS 2
/* Opt-in shared memory per block (bytes): A100 163 KiB, H100/H200 227 KiB. */
static int smem_limit(int arch) { return arch >= 90 ? 232448 : 166912; }

/* ---- one compile job: a variant for one architecture ---- */
#define MAX_FUNCS 4
typedef struct func_info {
    char name[64];
    int regs, smem, stack, spill_st, spill_ld;
} func_info;

typedef struct job {
    int variant, arch;
    int ok;                 /* compiled and CUBIN present */
    double ms;
    int num_funcs;
    func_info funcs[MAX_FUNCS];
    int config[8], has_config; /* attn_paged_config, when the variant exports it */
    char *log;
} job;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static func_info *func_named(job *j, const char *name, size_t len) {
    int i;
    if (len >= sizeof j->funcs[0].name) len = sizeof j->funcs[0].name - 1;
    for (i = 0; i < j->num_funcs; i++)
        if (strlen(j->funcs[i].name) == len && !strncmp(j->funcs[i].name, name, len)) return &j->funcs[i];
    if (j->num_funcs == MAX_FUNCS) return NULL;
    memset(&j->funcs[j->num_funcs], 0, sizeof j->funcs[0]);
    memcpy(j->funcs[j->num_funcs].name, name, len);
    return &j->funcs[j->num_funcs++];
}

/* The number written just before `marker` in line (0 if none). */
static int number_before(const char *line, const char *marker) {
    const char *x = strstr(line, marker);
    if (!x) return 0;
    while (x > line && x[-1] == ' ') x--;
    while (x > line && x[-1] >= '0' && x[-1] <= '9') x--;
    return atoi(x);
}

/* ptxas -v: "Compiling entry function 'F' for 'sm_90'", "Function properties for F",
   "N bytes stack frame, N bytes spill stores, N bytes spill loads",
   "Used N registers, used N barriers, N bytes smem, ..." (the last two follow their F). */
static void parse_log(job *j) {
    static const char *const starts[] = {"Compiling entry function '", "Function properties for "};
    const char *p = j->log;
    func_info *cur = NULL;
    while (p && *p) {
        const char *e = strchr(p, '\n'), *q;
        size_t n = e ? (size_t)(e - p) : strlen(p), k;
        char line[512];
        if (n >= sizeof line) n = sizeof line - 1;
        memcpy(line, p, n);
        line[n] = 0;
        for (k = 0; k < 2; k++)
            if ((q = strstr(line, starts[k])) != NULL) {
                q += strlen(starts[k]);
                cur = func_named(j, q, strcspn(q, "' "));
            }
        if (cur && strstr(line, "bytes stack frame")) {
            cur->stack = number_before(line, "bytes stack frame");
            cur->spill_st = number_before(line, "bytes spill stores");
            cur->spill_ld = number_before(line, "bytes spill loads");
        } else if (cur && (q = strstr(line, "Used ")) != NULL && strstr(line, "registers")) {
            cur->regs = atoi(q + 5);
            cur->smem = number_before(line, "bytes smem");
        }
        p = e ? e + 1 : NULL;
    }
}

/* `.const .align 4 .b8 attn_paged_config[32] = {128, 0, 0, 0, ...};` in the PTX (bytes,
   little endian, trailing zeros may be left out). */
static void parse_config(job *j, const char *ptx) {
    const char *s = strstr(ptx, "attn_paged_config[");
    unsigned char bytes[32];
    int n = 0, i;
    if (!s || !(s = strchr(s, '{'))) return;
    memset(bytes, 0, sizeof bytes);
    s++;
    while (*s && *s != '}' && n < 32) {
        while (*s == ' ' || *s == ',') s++;
        if (*s == '}') break;
        bytes[n++] = (unsigned char)strtol(s, (char **)&s, 10);
    }
    for (i = 0; i < 8; i++)
        j->config[i] = (int)((unsigned)bytes[4 * i] | (unsigned)bytes[4 * i + 1] << 8 |
                             (unsigned)bytes[4 * i + 2] << 16 | (unsigned)bytes[4 * i + 3] << 24);
    j->has_config = 1;
}

static void run_job(job *j) {
    const variant *v = &manifest[j->variant];
    const char *src = source_of(v->file);
    const char *hdr_text[MAX_FILES], *hdr_name[MAX_FILES], *opts[24];
    char optbuf[24][96], defs[256], *tok, *save = NULL;
    int nh = 0, no = 0, i;
    nvrtc_program prog;
    nvrtc_result r;
    size_t size;
    double t0 = now_ms();
    j->ok = 0;
    if (!src) {
        j->log = (char *)malloc(128);
        if (j->log) snprintf(j->log, 128, "source %s is not embedded (run `make embed`)\n", v->file);
        return;
    }
    for (i = 0; i < num_files; i++)
        if (strstr(file_name[i], ".cuh")) { hdr_text[nh] = file_text[i]; hdr_name[nh] = file_name[i]; nh++; }
    snprintf(optbuf[no], sizeof optbuf[no], "--gpu-architecture=sm_%d", j->arch); opts[no] = optbuf[no]; no++;
    opts[no++] = "--ptxas-options=-v";
    opts[no++] = "-std=c++17";
    snprintf(defs, sizeof defs, "%s", v->defines);
    for (tok = strtok_r(defs, " ", &save); tok && no < 24; tok = strtok_r(NULL, " ", &save)) {
        snprintf(optbuf[no], sizeof optbuf[no], "-D%s", tok);
        opts[no] = optbuf[no];
        no++;
    }
    r = nv.CreateProgram(&prog, src, v->file, nh, hdr_text, hdr_name);
    if (r) {
        j->log = (char *)malloc(128);
        if (j->log) snprintf(j->log, 128, "nvrtcCreateProgram: %s\n", nv.GetErrorString(r));
        return;
    }
    r = nv.CompileProgram(prog, no, opts);
    j->ms = now_ms() - t0;
    if (nv.GetProgramLogSize(prog, &size) == 0 && (j->log = (char *)malloc(size + 1)) != NULL) {
        if (nv.GetProgramLog(prog, j->log)) j->log[0] = 0;
        j->log[size] = 0;
    }
    if (r == 0 && nv.GetCUBINSize(prog, &size) == 0 && size > 0) {
        j->ok = 1;
        if (save_dir) {
            char path[1024], *cubin = (char *)malloc(size);
            FILE *f;
            snprintf(path, sizeof path, "%s/%02d_sm_%d.cubin", save_dir, j->variant, j->arch);
            if (cubin && nv.GetCUBIN(prog, cubin) == 0 && (f = fopen(path, "wb")) != NULL) {
                fwrite(cubin, 1, size, f);
                fclose(f);
            }
            free(cubin);
        }
        if (nv.GetPTXSize(prog, &size) == 0) {
            char *ptx = (char *)malloc(size + 1);
            if (ptx && nv.GetPTX(prog, ptx) == 0) { ptx[size] = 0; parse_config(j, ptx); }
            free(ptx);
        }
    }
    parse_log(j);
    nv.DestroyProgram(&prog);
}

/* ---- a small work queue over the jobs ---- */
static job *jobs;
static int num_jobs, next_job;
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;

static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        int k;
        pthread_mutex_lock(&queue_lock);
        k = next_job < num_jobs ? next_job++ : -1;
        pthread_mutex_unlock(&queue_lock);
        if (k < 0) return NULL;
        run_job(&jobs[k]);
    }
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: nvrtc-check [--probe] [--dir DIR] [-j N] [--only TEXT] [--variant FILE DEFS]\n"
            "                   [--save DIR] [-v]\n"
            "Compiles every kernel variant of the manifest with NVRTC for sm_80 and sm_90 and\n"
            "prints registers, shared memory, spills and compile time per kernel.\n"
            "  --probe     only load libnvrtc and print its version (exit 3 if it cannot)\n"
            "  --dir DIR   read the kernel sources from DIR instead of the copies in attn.h\n"
            "  -j N        compile N variants at a time (default 2)\n"
            "  --only TXT  only variants whose file or defines contain TXT\n"
            "  --variant FILE DEFS  compile this one variant instead of the manifest, e.g.\n"
            "              --variant paged_attention.cu \"HEAD_DIM=128 BLOCK_SIZE=16 GROUP=4 DT_Q=2\n"
            "              DT_KV=2 TILE_TOKENS=4 KV_STAGES=3\"\n"
            "  --save DIR  write each CUBIN to DIR/<variant>_sm_<arch>.cubin (for nvdisasm)\n"
            "  -v          print every ptxas log\n");
}

int main(int argc, char **argv) {
    const char *dir = NULL, *only = NULL;
    int threads = 2, verbose = 0, probe = 0, i, k, major = 0, minor = 0, failed = 0;
    int worst_spill = 0, nvar = 0;
    double total_ms = 0, max_ms = 0, t0;
    char reason[640];
    pthread_t tids[16];
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--probe")) probe = 1;
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "-j") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--variant") && i + 2 < argc) {
            custom.file = argv[i + 1];
            custom.defines = argv[i + 2];
            manifest = &custom;
            num_variants = 1;
            i += 2;
        }
        else if (!strcmp(argv[i], "--save") && i + 1 < argc) save_dir = argv[++i];
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 0; }
        else { usage(stderr); return 2; }
    }
    if (threads < 1) threads = 1;
    if (threads > 16) threads = 16;
    if (!load_nvrtc(reason, sizeof reason)) {
        printf("nvrtc-check: %s\n", reason);
        return 3;
    }
    nv.Version(&major, &minor);
    printf("nvrtc-check: %s (NVRTC %d.%d)\n", nv_library, major, minor);
    if (probe) return 0;
    if (!load_sources(dir)) return 1;

    jobs = (job *)calloc((size_t)num_variants * NUM_ARCHS, sizeof *jobs);
    if (!jobs) return 1;
    for (i = 0; i < num_variants; i++) {
        char all[384];
        snprintf(all, sizeof all, "%s %s", manifest[i].file, manifest[i].defines);
        if (only && !strstr(all, only)) continue;
        nvar++;
        for (k = 0; k < NUM_ARCHS; k++) {
            jobs[num_jobs].variant = i;
            jobs[num_jobs].arch = archs[k];
            num_jobs++;
        }
    }
    t0 = now_ms();
    for (i = 0; i < threads; i++)
        if (pthread_create(&tids[i], NULL, worker, NULL)) { threads = i; break; }
    if (threads == 0) worker(NULL);
    for (i = 0; i < threads; i++) pthread_join(tids[i], NULL);

    printf("%-26s %-58s %-5s %5s %8s %8s %7s %7s\n", "kernel", "defines", "arch", "regs",
           "smem", "dyn", "spills", "ms");
    for (k = 0; k < num_jobs; k++) {
        job *j = &jobs[k];
        const variant *v = &manifest[j->variant];
        total_ms += j->ms;
        if (j->ms > max_ms) max_ms = j->ms;
        if (!j->ok) {
            printf("%-26s %-58s sm_%d  COMPILE ERROR\n%s\n", v->file, v->defines, j->arch, j->log ? j->log : "");
            failed = 1;
            continue;
        }
        for (i = 0; i < j->num_funcs; i++) {
            func_info *f = &j->funcs[i];
            int dyn = j->has_config && !strcmp(f->name, "attn_paged_attention") ? j->config[1] : 0;
            int spill = f->spill_st + f->spill_ld;
            const char *bad = spill ? "  <- SPILL" : f->smem + dyn > smem_limit(j->arch) ? "  <- SMEM" : "";
            if (*bad) failed = 1;
            if (spill > worst_spill) worst_spill = spill;
            printf("%-26s %-58s sm_%d %5d %8d %8d %3d/%-3d %7.0f%s\n", f->name, v->defines, j->arch, f->regs,
                   f->smem, dyn, f->spill_st, f->spill_ld, j->ms, bad);
        }
        if (j->num_funcs == 0) { printf("%-26s %-58s sm_%d  no kernel in the ptxas log\n", v->file, v->defines, j->arch); failed = 1; }
        if (verbose && j->log) printf("%s\n", j->log);
    }
    printf("nvrtc-check: %d variants x %d architectures, %.1f s wall (%d threads), compile %.0f ms total, "
           "%.0f ms the slowest; %s\n", nvar, NUM_ARCHS, (now_ms() - t0) / 1e3, threads, total_ms, max_ms,
           failed ? "FAILED" : "all compiled, no spills");
    for (k = 0; k < num_jobs; k++) free(jobs[k].log);
    free(jobs);
    for (i = 0; i < num_files; i++) free(file_text[i]);
    return failed ? 1 : 0;
}
