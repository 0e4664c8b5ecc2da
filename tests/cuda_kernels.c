/* cuda_kernels - runs the embedded CUDA kernels on a GPU against the CPU backend.

   A standalone C99 program on the library's own CUDA driver and NVRTC tables (loaded by
   dlopen at context creation; no CUDA header). It compiles the kernels of attn.h's
   generated block for the device's architecture and loads them as the CUDA backend does
   (attn__cuda_load), builds work lists the way the backend will (a reference host
   scheduler: see build_work below), launches, and compares with the CPU backend through
   the public API on the same inputs:
     - paged attention: random varlen batches (decodes, chunked prefills with context),
       decode- and prefill-shaped variants, f16/bf16 (tensor cores), f32 and mixed types
       (FMA), head sizes 64..256, GQA groups, causal or not, window, soft cap, ALiBi, LSE,
       strided and unaligned q/out, split-KV with the partial merge;
     - the cache writes (bit-exact against attn_reshape_and_cache / _mla);
     - the LSE merge, with empty (-inf/+inf/NaN) sides, both bases and out aliasing out_a.
   --bench adds timings: decode (32/8 heads, head 128, bf16, block 16) against the memory
   roof, and causal prefill in TFLOP/s; --bench-only skips the tests, --decode-bench times
   the decode shapes only (tuning sweeps; --prefill-bench the prefill ones), --contiguous lays the bench's pages out in order.
   --defines "WARP_ROWS=2 ..." adds kernel defines to every paged-attention variant, tested
   and timed; --prefill-tt N sets the prefill tile (N tokens at group 4, the same rows per
   CTA at other groups).
   --sm90-prefill: the CUDA_SM90 backend's prefill kernel (kernels/paged_prefill_sm90.cu,
   wgmma): compiled for sm_90a with
   ptxas's report for a few variants (no GPU needed; a spill, stack or warning fails); on a
   device of compute capability 9.0 every attention case is drawn within its scope (16-bit
   q = cache, head 64 or 128, no soft cap or ALiBi, prefill-shaped, no split) and runs it,
   at 128 rows per CTA, instead of the prefill variant, against the CPU backend (the merge
   and cache-write tests are left out); with --prefill-bench it is timed after the prefill
   variant on each causal shape. Elsewhere its GPU part is a skip.
   --sm90-source FILE:ENTRY runs a draft of that kernel (read from FILE, e.g.
   a file under kernels/wip/, entry ENTRY) in its place: the same cases,
   compile report and timings, so a draft and the embedded kernel compare in one lease.

   Ends with "N passed, N failed[, N skipped]" like the other test binaries. Exit 0 when
   nothing failed; with no GPU (or no NVRTC) every test is a skip and the exit is 0. */
#define _POSIX_C_SOURCE 200809L
#define ATTN_IMPLEMENTATION
#include "attn.h"

/* The address of a host slot-mapping view over n slots (a compound literal of the block). */
#define ATTN_SLOTS(s, n) (&(attn_tensor[1]){attn_tensor_slots((s), (n))}[0])
#include "tools/tool_support.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The CUDA driver and NVRTC are the library's: one context holds their tables (context->cuda,
   context->nvrtc), compiles and loads the kernels (attn__cuda_load: NVRTC through its kernel
   cache) and is the CPU reference too. The device's primary context is pushed once at start
   and stays current. */
static attn_context *context;
static const attn__cuda_driver *cu; /* context->cuda */
static int arch, num_sms;
static char skip_reason[256];

/* 0 with skip_reason when the context's platform cannot run the kernels. */
static int cuda_init(void) {
    const attn_platform *p = &context->platform;
    cu = context->cuda;
    arch = p->cuda_capability_major * 10 + p->cuda_capability_minor;
    num_sms = p->cuda_multiprocessors;
    if (p->kind != ATTN_PLATFORM_CUDA) { attn__fmt(skip_reason, sizeof skip_reason, "%s", p->cuda_reason); return 0; }
    if (!p->nvrtc_version) { attn__fmt(skip_reason, sizeof skip_reason, "%s", p->nvrtc_reason); return 0; }
    if (arch < 80) { attn__fmt(skip_reason, sizeof skip_reason, "device sm_%d is older than sm_80", arch); return 0; }
    if (attn__cuda_enter(context, "cuda_kernels") != ATTN_OK) {
        attn__fmt(skip_reason, sizeof skip_reason, "%s", attn_context_last_error(context));
        return 0;
    }
    return 1;
}

static int failures;
#define CU_CHECK(x) cu_check((x), #x, __LINE__)
static int cu_check(attn__CUresult r, const char *what, int line) {
    const char *s = "?";
    if (!r) return 1;
    cu->cuGetErrorString(r, &s);
    fprintf(stderr, "CUDA error %d (%s) at line %d: %s\n", r, s, line, what);
    exit(2); /* a sticky error leaves the context unusable: stop here */
}

static attn__CUdeviceptr dalloc(size_t n) {
    attn__CUdeviceptr p = 0;
    CU_CHECK(cu->cuMemAlloc(&p, n ? n : 16));
    return p;
}
/* The copies are complete on return (the host buffers may go right after). */
static attn__CUdeviceptr dupload(const void *h, size_t n) {
    attn__CUdeviceptr p = dalloc(n);
    if (n) {
        CU_CHECK(cu->cuMemcpyHtoDAsync(p, h, n, NULL));
        CU_CHECK(cu->cuStreamSynchronize(NULL));
    }
    return p;
}
static attn__CUresult download(void *h, attn__CUdeviceptr d, size_t n) {
    attn__CUresult r = cu->cuMemcpyDtoHAsync(h, d, n, NULL);
    return r ? r : cu->cuStreamSynchronize(NULL);
}

/* ---- kernel modules, compiled (or found in the library's kernel cache) and loaded once
   per (file, kernel, defines) ---- */
typedef struct module_entry {
    char key[320];
    attn__CUfunction main, second; /* the kernel asked for; paged: and attn_paged_merge_partials */
    attn__launch_config config;    /* the one the kernel exports (attn_params.cuh) */
} module_entry;

/* The tensor map a kernel that reads the cache through TMA takes first (its config's
   tma_box_rows > 0: the sm90 prefill), encoded by the library's own attn__cuda_kv_map for a
   [num_blocks, 2, BS, Hkv, D] cache, before the launches over that cache */
static attn__tma_map kv_map;
static int kv_map_encode(const module_entry *m, attn__CUdeviceptr kv, attn_dtype dt, int num_blocks, int BS, int Hkv,
                         int D) {
    attn_layer_desc d;
    int64_t shape[5];
    attn_tensor cache;
    memset(&d, 0, sizeof d);
    d.head_size = D; d.num_kv_heads = Hkv; d.block_size = BS; d.kv_cache_dtype = dt;
    shape[0] = num_blocks; shape[1] = 2; shape[2] = BS; shape[3] = Hkv; shape[4] = D;
    cache = attn_tensor_make((void *)(uintptr_t)kv, dt, 5, shape);
    if (attn__cuda_kv_map(context, &d, &cache, m->config.tma_box_rows, &kv_map) == ATTN_OK) return 1;
    printf("  FAIL tensor map of the cache: %s\n", attn_context_last_error(context)); /* the caller counts it */
    return 0;
}
/* the launch arguments of m: the params, after the cache's tensor map for a TMA kernel */
static int launch_args(const module_entry *m, void **args, attn__paged_params *p) {
    if (m->config.tma_box_rows > 0) { args[0] = &kv_map; args[1] = p; return 2; }
    args[0] = p;
    return 1;
}
static module_entry modules[1024];
static int num_modules;

static module_entry *get_module(const char *file, const char *defines, const char *kernel) {
    char key[320], options[1024], defs[256], reason[256], *tok, *save = NULL;
    int i, paged = !strcmp(file, "paged_attention.cu");
    size_t n = 0;
    attn__cuda_module loaded;
    module_entry *m;
    snprintf(key, sizeof key, "%s|%s|%s", file, kernel, defines);
    for (i = 0; i < num_modules; i++)
        if (!strcmp(modules[i].key, key)) return &modules[i];
    if (num_modules == (int)(sizeof modules / sizeof modules[0])) { fprintf(stderr, "too many modules\n"); exit(2); }
    snprintf(defs, sizeof defs, "%s", defines); /* "HEAD_DIM=128 DT=1" -> "-DHEAD_DIM=128 -DDT=1" */
    options[0] = 0;
    for (tok = strtok_r(defs, " ", &save); tok && n < sizeof options; tok = strtok_r(NULL, " ", &save))
        n += (size_t)snprintf(options + n, sizeof options - n, "%s-D%s", n ? " " : "", tok);
    if (attn__cuda_load(context, file, options, kernel, paged ? "attn_paged_merge_partials" : NULL, paged ? ATTN__LOAD_PAGED : 0, &loaded,
                        reason, sizeof reason) != ATTN_OK) {
        fprintf(stderr, "cannot load %s %s: %s\n%s\n", file, defines, reason, attn_context_last_error(context));
        exit(2);
    }
    m = &modules[num_modules++];
    snprintf(m->key, sizeof m->key, "%s", key);
    m->main = loaded.main;
    m->second = loaded.second;
    m->config = loaded.config;
    return m;
}

/* ---- random numbers and element helpers ---- */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static int rnd_int(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }
static float rnd_float(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 40) * (1.0 / 16777216.0)); }

static size_t dsize(attn_dtype dt) { return dt == ATTN_DTYPE_F32 ? 4 : 2; }
static int dcode(attn_dtype dt) { return dt == ATTN_DTYPE_F32 ? 0 : dt == ATTN_DTYPE_F16 ? 1 : 2; }
static void put(void *p, attn_dtype dt, size_t i, float x) {
    if (dt == ATTN_DTYPE_F32) ((float *)p)[i] = x;
    else if (dt == ATTN_DTYPE_F16) ((uint16_t *)p)[i] = attn_f32_to_f16(x);
    else ((uint16_t *)p)[i] = attn_f32_to_bf16(x);
}
static float get(const void *p, attn_dtype dt, size_t i) {
    if (dt == ATTN_DTYPE_F32) return ((const float *)p)[i];
    if (dt == ATTN_DTYPE_F16) return attn_f16_to_f32(((const uint16_t *)p)[i]);
    return attn_bf16_to_f32(((const uint16_t *)p)[i]);
}
static void fill_random(void *p, attn_dtype dt, size_t n, float amp) {
    size_t i;
    for (i = 0; i < n; i++) put(p, dt, i, rnd_float(-amp, amp));
}

static void quiet(void *u, attn_log_level l, attn_log_item it, const char *m) { (void)u; (void)l; (void)it; (void)m; }

/* Keys visible from pos: [lo, hi) (attn__visible_keys). */
static void visible(int causal, int window, int pos, int seq_len, int *lo, int *hi) {
    *lo = window ? (pos - window + 1 > 0 ? pos - window + 1 : 0) : 0;
    if (causal) *hi = pos + 1;
    else *hi = window ? ((int64_t)pos + window < seq_len ? pos + window : seq_len) : seq_len;
}

/* The reference host scheduler: one work item per (request, KV head, tile of tile_tokens
   query tokens); a tile's key range is the union of its rows' visible ranges; with
   splits > 1 a range of at least 2 * kv_tile keys is cut into up to `splits` parts at
   multiples of kv_tile, each writing a partial slot, plus a merge entry. */
typedef struct schedule {
    int *work, num_work, *merge, num_merge, num_slots;
} schedule;

static void build_work(schedule *s, int num_reqs, const int32_t *qsl, const int32_t *seq_lens, int num_kv_heads,
                       int tile_tokens, int causal, int window, int splits, int kv_tile) {
    int r, t0, h, cap = 0;
    for (r = 0; r < num_reqs; r++) cap += ((qsl[r + 1] - qsl[r] + tile_tokens - 1) / tile_tokens) * num_kv_heads;
    s->work = (int *)calloc((size_t)cap * (splits > 0 ? splits : 1) + 1, 8 * sizeof(int));
    s->merge = (int *)calloc((size_t)cap + 1, 8 * sizeof(int));
    s->num_work = s->num_merge = s->num_slots = 0;
    for (r = 0; r < num_reqs; r++) {
        int ql = qsl[r + 1] - qsl[r], sl = seq_lens[r];
        for (t0 = 0; t0 < ql; t0 += tile_tokens) {
            int t1 = t0 + tile_tokens < ql ? t0 + tile_tokens : ql, lo0, hi0, lo1, hi1, lo, hi, ns = 1, k;
            visible(causal, window, sl - ql + t0, sl, &lo0, &hi0);
            visible(causal, window, sl - ql + t1 - 1, sl, &lo1, &hi1);
            lo = lo0 < lo1 ? lo0 : lo1;
            hi = hi0 > hi1 ? hi0 : hi1;
            if (splits > 1 && hi - lo >= 2 * kv_tile) {
                ns = (hi - lo) / kv_tile;
                if (ns > splits) ns = splits;
            }
            for (h = 0; h < num_kv_heads; h++) {
                int slot0 = ns > 1 ? s->num_slots : -1;
                if (ns > 1) {
                    int *m = s->merge + 8 * s->num_merge++;
                    m[0] = r; m[1] = h; m[2] = t0; m[3] = t1 - t0; m[4] = slot0; m[5] = ns;
                    s->num_slots += ns;
                }
                for (k = 0; k < ns; k++) {
                    int *w = s->work + 8 * s->num_work++;
                    int a = lo + (int)((int64_t)(hi - lo) * k / ns), b = lo + (int)((int64_t)(hi - lo) * (k + 1) / ns);
                    if (k > 0) a = a / kv_tile * kv_tile;         /* cut at tile multiples */
                    if (k + 1 < ns) b = b / kv_tile * kv_tile;
                    if (k > 0 && a < lo) a = lo;
                    w[0] = r; w[1] = h; w[2] = t0; w[3] = t1 - t0; w[4] = a; w[5] = b;
                    w[6] = ns > 1 ? slot0 + k : -1; w[7] = causal ? 1 : 0;
                }
            }
        }
    }
}

/* ---- tests ---- */
static int passed, failed, skipped;
/* --defines: extra kernel defines for every paged-attention variant, tests and bench alike
   (e.g. "WARP_ROWS=2": a request the kernel drops where it does not apply) */
static const char *extra_defines = "";
/* --prefill-tt: query tokens per prefill CTA at the bench's group 4 (default 64 / group);
   the tests keep the same rows per CTA at every group: max(1, 4N / group) tokens */
static int prefill_tt;

static int near_ok(float a, float b, float atol, float rtol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabsf(a - b) <= atol + rtol * fabsf(b);
}

typedef struct attn_case {
    int head, group, kv_heads, block, causal, window, alibi, want_lse, splits, decode_shape, sinks;
    float softcap;
    attn_dtype dq, dkv;
    int q_pad, q_misalign; /* q/out row strides wider than the heads; q/out offset by one element */
} attn_case;

static void describe(const attn_case *c, char *buf, size_t n) {
    snprintf(buf, n, "head %d group %d kv_heads %d block %d %s q=%s kv=%s causal %d window %d softcap %g alibi %d "
                     "sinks %d lse %d splits %d pad %d misalign %d",
             c->head, c->group, c->kv_heads, c->block, c->decode_shape ? "decode-shape" : "prefill-shape",
             attn_dtype_name(c->dq), attn_dtype_name(c->dkv), c->causal, c->window, c->softcap, c->alibi, c->sinks,
             c->want_lse, c->splits, c->q_pad, c->q_misalign);
}

/* ---- kernels compiled here rather than through the library's variant cache: the sm_90a
   prefill and the MLA kernels (embedded) and the drafts (kernels/wip/, read from disk), with the headers
   embedded in attn.h offered by name, and ptxas's report checked ---- */
typedef struct draft_kernel {
    const char *label;     /* in messages: "sm90-prefill", "mla", ... */
    const char *file;      /* embedded name, or a path (read from disk) */
    int embedded;          /* 1: attn__kernel_source_text(file) */
    int arch_a;            /* 1: compiled for sm_XYa (wgmma) */
    const char *fn, *second, *config; /* the kernel, a second one (or NULL), the config global */
    char *text;            /* the source, once read */
} draft_kernel;

/* Compiles `k` with `defines` for the device's architecture (sm_90 without one) and prints
   ptxas's report (registers, stack, spills, the config) and any warning. NULL (a test
   failure, printed) when it does not compile, spills, or asks for more shared memory than
   the architecture has; a skip when NVRTC's log is empty and nothing is loaded. With load,
   the module is loaded and its dynamic shared memory configured as attn__cuda_load does. */
static module_entry *draft_module(draft_kernel *k, const char *defines, int load) {
    char key[320], defs[256], opt_store[32][64], arch_opt[48], *tok, *save = NULL;
    const char *opts[40], *hname[16];
    char *htext[16];
    const attn__nvrtc *nv = context->nvrtc;
    attn__nvrtcProgram prog = NULL;
    char *log = NULL, *cubin = NULL;
    size_t log_size = 0, cubin_size = 0;
    int nopt = 0, i, nh = 0, ok, warnings;
    attn__launch_config config;
    const char *base_name = strrchr(k->file, '/') ? strrchr(k->file, '/') + 1 : k->file;
    attn_tool_ptxas e;
    module_entry *m;
    snprintf(key, sizeof key, "%s|%s|%s|%d", k->label, k->file, defines, load);
    for (i = 0; i < num_modules; i++)
        if (!strcmp(modules[i].key, key)) return &modules[i];
    if (!k->text && !(k->text = k->embedded ? attn__kernel_source_text(k->file) : attn_tool_read_file(k->file))) {
        printf("FAIL %s: %s %s\n", k->label, k->file,
               k->embedded ? "is not embedded in attn.h (run `make embed`)" : "cannot be read (run from the repository root)");
        failed++;
        return NULL;
    }
    for (i = 0; attn__kernel_source_name(i) && nh < 16; i++) {
        const char *name = attn__kernel_source_name(i);
        size_t n = strlen(name);
        if (n > 4 && !strcmp(name + n - 4, ".cuh") && (htext[nh] = attn__kernel_source_text(name))) hname[nh++] = name;
    }
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=sm_%d%s", load ? arch : 90, k->arch_a ? "a" : "");
    opts[nopt++] = arch_opt;
    opts[nopt++] = "--ptxas-options=-v";
    opts[nopt++] = "--std=c++17";
    if (getenv("ATTN_HARNESS_LINEINFO")) opts[nopt++] = "-lineinfo"; /* source lines in sanitizer reports */
    snprintf(defs, sizeof defs, "%s", defines);
    for (tok = strtok_r(defs, " ", &save); tok && nopt < 32; tok = strtok_r(NULL, " ", &save)) {
        snprintf(opt_store[nopt], sizeof opt_store[nopt], "-D%s", tok);
        opts[nopt] = opt_store[nopt];
        nopt++;
    }
    if (nv->nvrtcCreateProgram(&prog, k->text, base_name, nh, (const char *const *)htext, hname) != 0) {
        printf("FAIL %s [%s]: nvrtcCreateProgram failed\n", k->label, defines);
        failed++;
        return NULL;
    }
    ok = nv->nvrtcCompileProgram(prog, nopt, opts) == 0;
    if (nv->nvrtcGetProgramLogSize(prog, &log_size) == 0 && (log = (char *)calloc(log_size + 1, 1)) != NULL &&
        nv->nvrtcGetProgramLog(prog, log) != 0)
        log[0] = 0;
    if (ok && (nv->nvrtcGetCUBINSize(prog, &cubin_size) != 0 || !cubin_size || !(cubin = (char *)malloc(cubin_size)) ||
               nv->nvrtcGetCUBIN(prog, cubin) != 0))
        ok = 0;
    nv->nvrtcDestroyProgram(&prog);
    if (!ok) {
        printf("FAIL %s [%s]: does not compile for %s\n%s\n", k->label, defines, arch_opt + 19, log ? log : "(no log)");
        failed++;
        free(log); free(cubin);
        return NULL;
    }
    e = attn_tool_ptxas_for(log, k->fn);
    warnings = attn_tool_print_warnings(log);
    memset(&config, 0, sizeof config);
    if (!attn_tool_cubin_global((const unsigned char *)cubin, cubin_size, k->config, &config, sizeof config))
        config.shared_bytes = -1;
    if ((!e.found || e.regs <= 0) && load) {
        /* Seen on the H200 host: NVRTC's log sometimes lacks ptxas's report (its own cache
           served the program; the cubin is fine). The loaded function's attributes are then
           the report: registers, and local memory (stack or spills, not told apart there). */
        int (*get_attr)(int *, int, attn__CUfunction) = NULL;
        void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        attn__CUmodule mod = NULL;
        attn__CUfunction f = NULL;
        int regs = 0, local = -1;
        if (lib) *(void **)&get_attr = dlsym(lib, "cuFuncGetAttribute");
        if (get_attr && cu->cuModuleLoadData(&mod, cubin) == 0 && cu->cuModuleGetFunction(&f, mod, k->fn) == 0 &&
            get_attr(&regs, 4 /* NUM_REGS */, f) == 0 && get_attr(&local, 3 /* LOCAL_SIZE_BYTES */, f) == 0 && regs > 0) {
            printf("  %s [%s]: NVRTC's log (%zu bytes) has no ptxas report; the driver's attributes stand in\n", k->label,
                   defines, log ? strlen(log) : (size_t)0);
            e.found = 1;
            e.regs = regs;
            e.stack = local;
        }
        if (mod) cu->cuModuleUnload(mod);
        if (lib) dlclose(lib);
    }
    if ((!e.found || e.regs <= 0) && !load && log && !log[0]) {
        /* an empty log (seen on the H200 host, not here): nothing to check without loading */
        printf("  SKIP %s [%s]: NVRTC returned an empty log (the GPU run checks the loaded function's attributes)\n",
               k->label, defines);
        skipped++;
        free(log); free(cubin);
        return NULL;
    }
    if (!e.found || e.regs <= 0)
        printf("  %s [%s]: NVRTC's log (%zu bytes) has no ptxas report for %s:\n%.600s\n", k->label, defines,
               log ? strlen(log) : (size_t)0, k->fn, log ? log : "");
    printf("  %s %s [%s]: %d registers, %d B stack, %d/%d B spilled, %d threads, %d B shared (%.1f KiB), KV_TILE %d, "
           "%d rows, tile tokens %d, stages %d\n",
           k->label, arch_opt + 19, defines, e.regs, e.stack, e.spill_st, e.spill_ld, config.threads, config.shared_bytes,
           config.shared_bytes / 1024.0, config.kv_tile, config.rows, config.tile_tokens, config.kv_stages);
    if (!e.found || e.regs <= 0 || e.stack != 0 || e.spill_st != 0 || e.spill_ld != 0 || warnings || config.shared_bytes < 0 ||
        config.shared_bytes > (arch >= 90 || !load ? 232448 : 166912)) {
        printf("FAIL %s [%s]: ptxas reports spills, stack or warnings, or the shared memory is over the architecture's\n",
               k->label, defines);
        failed++;
        free(log); free(cubin);
        return NULL;
    }
    if (num_modules == (int)(sizeof modules / sizeof modules[0])) { fprintf(stderr, "too many modules\n"); exit(2); }
    m = &modules[num_modules++];
    memset(m, 0, sizeof *m);
    snprintf(m->key, sizeof m->key, "%s", key);
    m->config = config;
    if (load) {
        attn__CUmodule mod = NULL;
        CU_CHECK(cu->cuModuleLoadData(&mod, cubin));
        CU_CHECK(cu->cuModuleGetFunction(&m->main, mod, k->fn));
        if (k->second) CU_CHECK(cu->cuModuleGetFunction(&m->second, mod, k->second));
        CU_CHECK(cu->cuFuncSetAttribute(m->main, ATTN__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, m->config.shared_bytes));
    }
    free(log);
    free(cubin);
    return m;
}

/* ---- --sm90-prefill: kernels/paged_prefill_sm90.cu (the CUDA_SM90 backend's prefill tiles) */
static int sm90_prefill; /* 1: asked for; the GPU part runs on compute capability 9.0 only */
static int sm90_passed;  /* attention cases the sm_90a kernel passed */
static draft_kernel sm90_kernel = {"sm90-prefill", "paged_prefill_sm90.cu", 1, 1, "attn_paged_prefill_sm90", NULL,
                                   "attn_paged_config", NULL};
static module_entry *sm90_module(const char *defines, int load) { return draft_module(&sm90_kernel, defines, load); }

/* The compile report of --sm90-prefill, GPU or not: the variants the issue names. */
static void sm90_compile_report(void) {
    static const char *const variants[] = {
        "HEAD_DIM=128 BLOCK_SIZE=16 GROUP=4 DT_Q=2 DT_KV=2 TILE_TOKENS=32",
        "HEAD_DIM=64 BLOCK_SIZE=16 GROUP=1 DT_Q=1 DT_KV=1 TILE_TOKENS=128",
        "HEAD_DIM=128 BLOCK_SIZE=16 GROUP=8 DT_Q=2 DT_KV=2 TILE_TOKENS=16 WINDOW=1",
        "HEAD_DIM=64 BLOCK_SIZE=32 GROUP=3 DT_Q=2 DT_KV=2 TILE_TOKENS=42 WINDOW=1",
        "HEAD_DIM=128 BLOCK_SIZE=32 GROUP=16 DT_Q=1 DT_KV=1 TILE_TOKENS=8",
    };
    size_t i;
    if (!context->platform.nvrtc_version) {
        printf("  SKIP sm90-prefill compile: %s\n", context->platform.nvrtc_reason);
        skipped++;
        return;
    }
    printf("sm90-prefill: %s for sm_90a (NVRTC %d.%d)\n", sm90_kernel.file, context->nvrtc->major, context->nvrtc->minor);
    for (i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        if (sm90_module(variants[i], 0)) passed++;
    }
}

/* Within the sm_90a kernel's scope: one 16-bit type for q and cache, head 64 or 128, no soft
   cap or ALiBi, a prefill-shaped tile, no split. */
static int sm90_in_scope(const attn_case *c) {
    return c->dq == c->dkv && c->dq != ATTN_DTYPE_F32 && (c->head == 64 || c->head == 128) && c->softcap == 0.0f &&
           !c->alibi && !c->decode_shape && c->splits <= 1;
}

static void run_attention_case(const attn_case *c, int num_reqs, const int *qlens, const int *ctxlens) {
    int H = c->kv_heads * c->group, D = c->head, Hkv = c->kv_heads, BS = c->block, r, i;
    int32_t *qsl = (int32_t *)calloc((size_t)num_reqs + 1, 4), *sl = (int32_t *)calloc((size_t)num_reqs, 4);
    int max_blocks = 0, total_blocks, T, max_q = 0, max_s = 0, tt, big, sm90 = sm90_prefill && sm90_in_scope(c);
    int32_t *bt;
    float *alibi = NULL, *sinks = NULL;
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md;
    attn_batch b;
    attn_select_request req;
    char desc[400], defs[256];
    void *kvh, *qh, *out_cpu, *out_gpu;
    float *lse_cpu = NULL, *lse_gpu = NULL;
    size_t kv_elems, q_row, q_elems, esq = dsize(c->dq), eskv = dsize(c->dkv);
    int64_t shape[ATTN_MAX_DIMS];
    int ndim, bad = 0, items = 0;
    unsigned grid = 0; /* the attention launch's CTAs, for the failure report */
    float atol, rtol;
    describe(c, desc, sizeof desc);
    for (r = 0; r < num_reqs; r++) {
        qsl[r + 1] = qsl[r] + qlens[r];
        sl[r] = ctxlens[r] + qlens[r];
        if ((sl[r] + BS - 1) / BS > max_blocks) max_blocks = (sl[r] + BS - 1) / BS;
        if (qlens[r] > max_q) max_q = qlens[r];
        if (sl[r] > max_s) max_s = sl[r];
    }
    T = qsl[num_reqs];
    total_blocks = max_blocks * num_reqs + 3;
    bt = (int32_t *)malloc((size_t)max_blocks * num_reqs * 4);
    { /* a random permutation of the blocks, so that pages are scattered */
        int *perm = (int *)malloc((size_t)total_blocks * sizeof(int));
        for (i = 0; i < total_blocks; i++) perm[i] = i;
        for (i = total_blocks - 1; i > 0; i--) { int j = rnd_int(0, i), x = perm[i]; perm[i] = perm[j]; perm[j] = x; }
        for (i = 0; i < max_blocks * num_reqs; i++) bt[i] = perm[i];
        free(perm);
    }
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = Hkv; d.head_size = D; d.dtype = c->dq; d.kv_cache_dtype = c->dkv;
    d.block_size = BS; d.causal = c->causal ? ATTN_CAUSAL_YES : ATTN_CAUSAL_NO; d.sliding_window = c->window;
    d.logits_soft_cap = c->softcap;
    if (c->alibi) {
        alibi = (float *)malloc((size_t)H * sizeof(float));
        for (i = 0; i < H; i++) alibi[i] = -rnd_float(0.01f, 0.5f);
        d.alibi_slopes = alibi;
    }
    if (c->sinks) { /* around the logits, now and then far above them */
        sinks = (float *)malloc((size_t)H * sizeof(float));
        for (i = 0; i < H; i++) sinks[i] = rnd_int(0, 5) ? rnd_float(-3.0f, 5.0f) : rnd_float(8.0f, 25.0f);
        d.sinks = sinks; /* the CPU layer reads them from host memory */
    }
    memset(&req, 0, sizeof req);
    req.backend = ATTN_BACKEND_CPU;
    if (attn_layer_create(context, &d, &req, &layer) != ATTN_OK) {
        printf("FAIL attention %s: CPU layer: %s\n", desc, attn_context_last_error(context));
        failed++;
        goto done;
    }
    memset(&md, 0, sizeof md);
    md.max_num_reqs = num_reqs; md.max_num_tokens = T; md.max_blocks_per_req = max_blocks; md.num_blocks = total_blocks;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = sl; b.block_table = bt; b.block_table_stride = max_blocks;
    b.num_reqs = num_reqs; b.num_actual_tokens = T; b.max_query_len = max_q; b.max_seq_len = max_s;
    if (attn_metadata_create(layer, &md, &meta) != ATTN_OK || attn_metadata_build(meta, 0, &b, 0) != ATTN_OK) {
        printf("FAIL attention %s: CPU metadata: %s\n", desc, attn_context_last_error(context));
        failed++;
        goto done;
    }
    attn_layer_kv_cache_shape(layer, total_blocks, shape, &ndim);
    kv_elems = (size_t)total_blocks * 2 * BS * Hkv * D;
    kvh = malloc(kv_elems * eskv);
    fill_random(kvh, c->dkv, kv_elems, 1.0f);
    q_row = (size_t)H * D + (size_t)c->q_pad;              /* elements per token row */
    q_elems = (size_t)T * q_row + 1;
    qh = calloc(q_elems, esq);
    fill_random(qh, c->dq, q_elems, 1.0f);
    out_cpu = calloc(q_elems, esq);
    out_gpu = calloc(q_elems, esq);
    lse_cpu = (float *)calloc((size_t)T * H, 4);
    lse_gpu = (float *)calloc((size_t)T * H, 4);
    {
        attn_tensor q = attn_tensor_make((char *)qh + c->q_misalign * esq, c->dq, 3, NULL), kv, out, lse;
        int64_t s3[3];
        s3[0] = T; s3[1] = H; s3[2] = D;
        q = attn_tensor_make((char *)qh + c->q_misalign * esq, c->dq, 3, s3);
        q.strides[0] = (int64_t)q_row; q.strides[1] = D; q.strides[2] = 1;
        out = attn_tensor_make((char *)out_cpu + c->q_misalign * esq, c->dq, 3, s3);
        out.strides[0] = (int64_t)q_row; out.strides[1] = D; out.strides[2] = 1;
        kv = attn_tensor_make(kvh, c->dkv, ndim, shape);
        s3[0] = T; s3[1] = H;
        lse = attn_tensor_make(lse_cpu, ATTN_DTYPE_F32, 2, s3);
        if (attn_layer_forward(layer, meta, &q, NULL, NULL, &kv, &out, c->want_lse ? &lse : NULL, NULL) != ATTN_OK) {
            printf("FAIL attention %s: CPU forward: %s\n", desc, attn_context_last_error(context));
            failed++;
            goto free_all;
        }
    }
    /* ---- the GPU run ---- */
    /* --prefill-tt applies where the library would use a large prefill tile: 16-bit q and
       cache of one type, head <= 128 (elsewhere 64 rows, as the library does) */
    big = prefill_tt && c->dq == c->dkv && c->dq != ATTN_DTYPE_F32 && D <= 128;
    tt = (c->decode_shape ? 16 : big ? 4 * prefill_tt : 64) / c->group;
    if (sm90) tt = 128 / c->group; /* --sm90-prefill: the sm_90 kernel's 128-row tile */
    if (tt < 1) tt = 1;
    if (tt * c->group > 128) tt = 128 / c->group;
    if (sm90)
        snprintf(defs, sizeof defs, "HEAD_DIM=%d BLOCK_SIZE=%d GROUP=%d DT_Q=%d DT_KV=%d TILE_TOKENS=%d WINDOW=%d %s", D, BS,
                 c->group, dcode(c->dq), dcode(c->dkv), tt, c->window > 0, extra_defines);
    else
        snprintf(defs, sizeof defs, "HEAD_DIM=%d BLOCK_SIZE=%d GROUP=%d DT_Q=%d DT_KV=%d TILE_TOKENS=%d WINDOW=%d SOFTCAP=%d ALIBI=%d%s %s",
                 D, BS, c->group, dcode(c->dq), dcode(c->dkv), tt, c->window > 0, c->softcap > 0, c->alibi,
                 c->decode_shape && rnd_int(0, 1) ? " PERSISTENT=1" : "", extra_defines); /* the library's decode: 1 */
    {
        module_entry *m = sm90 ? sm90_module(defs, 1)
                               : get_module("paged_attention.cu", defs, "attn_paged_attention");
        if (!m) goto free_all; /* the sm_90a kernel did not compile: counted as failed */
        {
        attn__CUfunction fa = m->main, fm = m->second;
        schedule s;
        attn__paged_params p;
        void *args[2];
        int zero_merge = 0;
        attn__CUdeviceptr d_q, d_kv, d_out, d_lse, d_bt, d_sl, d_qsl, d_alibi, d_sinks, d_work, d_nw, d_merge, d_nm, d_po, d_pml;
        float scale = 1.0f / sqrtf((float)D);
        build_work(&s, num_reqs, qsl, sl, Hkv, tt, c->causal, c->window, c->splits, m->config.kv_tile);
        d_q = dupload(qh, q_elems * esq);
        d_kv = dupload(kvh, kv_elems * eskv);
        d_out = dalloc(q_elems * esq);
        CU_CHECK(cu->cuMemsetD8Async(d_out, 0xff, q_elems * esq, NULL)); /* NaN everywhere: unwritten rows show */
        d_lse = dalloc((size_t)T * H * 4);
        CU_CHECK(cu->cuMemsetD8Async(d_lse, 0xff, (size_t)T * H * 4, NULL));
        d_bt = dupload(bt, (size_t)max_blocks * num_reqs * 4);
        d_sl = dupload(sl, (size_t)num_reqs * 4);
        d_qsl = dupload(qsl, (size_t)(num_reqs + 1) * 4);
        d_alibi = alibi ? dupload(alibi, (size_t)H * 4) : 0;
        d_sinks = sinks ? dupload(sinks, (size_t)H * 4) : 0;
        d_work = dupload(s.work, (size_t)s.num_work * 32);
        d_nw = dupload(&s.num_work, 4);
        d_merge = dupload(s.merge, (size_t)(s.num_merge ? s.num_merge : 1) * 32);
        d_nm = dupload(s.num_merge ? &s.num_merge : &zero_merge, 4);
        d_po = dalloc((size_t)(s.num_slots ? s.num_slots : 1) * tt * c->group * D * 4);
        d_pml = dalloc((size_t)(s.num_slots ? s.num_slots : 1) * tt * c->group * 2 * 4);
        CU_CHECK(cu->cuMemsetD8Async(d_po, 0xff, (size_t)(s.num_slots ? s.num_slots : 1) * tt * c->group * D * 4, NULL));
        memset(&p, 0, sizeof p);
        p.q = d_q + (attn__CUdeviceptr)(c->q_misalign * esq);
        p.kv_cache = d_kv;
        p.out = d_out + (attn__CUdeviceptr)(c->q_misalign * esq);
        p.lse = c->want_lse ? d_lse : 0;
        p.block_table = d_bt; p.seq_lens = d_sl; p.query_start_loc = d_qsl; p.alibi_slopes = d_alibi;
        p.sinks = d_sinks;
        p.work = d_work; p.num_work = d_nw; p.merge = d_merge; p.num_merge = d_nm;
        p.partial_o = d_po; p.partial_ml = d_pml;
        p.q_stride_token = (int64_t)q_row; p.q_stride_head = D;
        p.out_stride_token = (int64_t)q_row; p.out_stride_head = D;
        p.lse_stride_token = H; p.lse_stride_head = 1;
        p.block_table_stride = max_blocks;
        p.num_kv_heads = Hkv; p.scale = scale; p.softcap = c->softcap; p.window = c->window;
        launch_args(m, args, &p);
        if (m->config.tma_box_rows > 0 && !kv_map_encode(m, d_kv, c->dkv, total_blocks, BS, Hkv, D)) {
            failed++; /* no launch: the output stays NaN and the comparison below reports it too */
        } else {
            /* one spare CTA past *num_work: it must exit without touching anything; a
               persistent kernel gets fewer CTAs than items (they loop) or one spare */
            items = s.num_work;
            grid = (unsigned)s.num_work + 1;
            if (m->config.persistent && s.num_work > 1 && rnd_int(0, 3)) grid = (unsigned)rnd_int(1, s.num_work - 1);
            CU_CHECK(cu->cuLaunchKernel(fa, grid, 1, 1, (unsigned)m->config.threads, 1, 1,
                                        (unsigned)m->config.shared_bytes, NULL, args, NULL));
            if (s.num_merge) CU_CHECK(cu->cuLaunchKernel(fm, (unsigned)s.num_merge, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
        }
        CU_CHECK(cu->cuCtxSynchronize());
        CU_CHECK(download(out_gpu, d_out, q_elems * esq));
        CU_CHECK(download(lse_gpu, d_lse, (size_t)T * H * 4));
        cu->cuMemFree(d_q); cu->cuMemFree(d_kv); cu->cuMemFree(d_out); cu->cuMemFree(d_lse); cu->cuMemFree(d_bt); cu->cuMemFree(d_sl);
        cu->cuMemFree(d_qsl); if (d_alibi) cu->cuMemFree(d_alibi); if (d_sinks) cu->cuMemFree(d_sinks); cu->cuMemFree(d_work); cu->cuMemFree(d_nw); cu->cuMemFree(d_merge);
        cu->cuMemFree(d_nm); cu->cuMemFree(d_po); cu->cuMemFree(d_pml);
        free(s.work);
        free(s.merge);
        }
    }
    /* ---- compare: outputs in the q dtype; bf16 keeps 8 bits, so its tolerance is widest ---- */
    atol = c->dq == ATTN_DTYPE_BF16 || c->dkv == ATTN_DTYPE_BF16 ? 2e-2f
           : c->dq == ATTN_DTYPE_F16 || c->dkv == ATTN_DTYPE_F16   ? 4e-3f
           : c->softcap > 0                                        ? 2e-4f  /* tanh: 3e-7 x the cap */
                                                                   : 5e-5f;
    if (c->alibi && c->dq == ATTN_DTYPE_F32 && c->dkv == ATTN_DTYPE_F32) {
        /* f32 scores carry ALiBi's bias, |slope| log2(e) x distance: with these negative slopes
           the far keys lead, at scores up to ~2000 where an f32 ulp is 2.4e-4, and the GPU's fma
           and the CPU's multiply-add round it differently (one case of 1.2e-3 relative at 2882
           keys, device run 17): 4 ulps of the largest score */
        float big = 0.0f;
        for (i = 0; i < H; i++) big = fmaxf(big, fabsf(alibi[i]));
        atol = fmaxf(atol, 4.0f * 1.1920929e-7f * big * 1.4426950f * (float)max_s);
    }
    rtol = atol;
    {
        int t, h, x;
        float worst = 0;
        for (t = 0; t < T && bad < 5; t++)
            for (h = 0; h < H && bad < 5; h++) {
                for (x = 0; x < D; x++) {
                    size_t k = (size_t)c->q_misalign + (size_t)t * q_row + (size_t)h * D + (size_t)x;
                    float a = get(out_gpu, c->dq, k), e = get(out_cpu, c->dq, k);
                    if (fabsf(a - e) > worst) worst = fabsf(a - e);
                    if (!near_ok(a, e, atol, rtol)) {
                        printf("  out[%d][%d][%d]: gpu %g cpu %g\n", t, h, x, a, e);
                        bad++;
                        break;
                    }
                }
                if (c->want_lse && !near_ok(lse_gpu[t * H + h], lse_cpu[t * H + h], 1e-3f, 1e-4f)) {
                    printf("  lse[%d][%d]: gpu %g cpu %g\n", t, h, lse_gpu[t * H + h], lse_cpu[t * H + h]);
                    bad++;
                }
            }
        /* padding between rows (q_pad) and the misaligned first element stay untouched (NaN) */
        if (c->q_pad && !isnan(get(out_gpu, c->dq, (size_t)c->q_misalign + (size_t)H * D))) {
            printf("  the padding after row 0 was written\n");
            bad++;
        }
        if (bad) {
            printf("FAIL attention %s%s (reqs %d, tokens %d; %s; grid %u for %d items)\n", sm90 ? "[sm90 prefill] " : "", desc,
                   num_reqs, T, defs, grid, items);
            for (r = 0; r < num_reqs; r++) printf("    req %d: query %d context %d\n", r, qlens[r], ctxlens[r]);
            failed++;
        } else {
            passed++;
            if (sm90) sm90_passed++;
            if (getenv("ATTN_TEST_VERBOSE")) printf("ok   attention %s%s max|diff| %.3g\n", sm90 ? "[sm90 prefill] " : "", desc, worst);
        }
    }
free_all:
    free(kvh); free(qh); free(out_cpu); free(out_gpu); free(lse_cpu); free(lse_gpu);
done:
    if (meta) attn_metadata_destroy(meta);
    if (layer) attn_layer_destroy(layer);
    free(alibi); free(sinks); free(bt); free(qsl); free(sl);
}

static void test_attention(int cases) {
    static const int heads[] = {64, 80, 96, 128, 256, 120, 128, 128}; /* and 288-512 below */
    static const int groups[] = {1, 4, 8, 3, 4, 16};
    int k;
    for (k = 0; k < cases; k++) {
        attn_case c;
        int nr = rnd_int(1, 5), qlens[8], ctx[8], r, kind = rnd_int(0, 9);
        memset(&c, 0, sizeof c);
        c.head = heads[rnd_int(0, 7)];
        c.group = groups[rnd_int(0, 5)];
        c.kv_heads = rnd_int(1, c.group >= 8 ? 2 : 3);
        { /* the sm90 prefill's box shapes: a block per box, 16-row boxes, a tile per box */
            static const int blocks[] = {16, 16, 16, 32, 32, 48, 64, 256};
            c.block = blocks[rnd_int(0, 7)];
        }
        c.causal = rnd_int(0, 4) != 0;
        c.window = rnd_int(0, 4) == 0 ? rnd_int(1, 300) : 0;
        c.softcap = rnd_int(0, 5) == 0 ? rnd_float(5.0f, 50.0f) : 0.0f;
        c.alibi = rnd_int(0, 5) == 0;
        c.want_lse = rnd_int(0, 1);
        c.splits = rnd_int(0, 2) == 0 ? 1 : rnd_int(2, 9);
        c.decode_shape = rnd_int(0, 1);
        c.q_pad = rnd_int(0, 3) == 0 ? 8 * rnd_int(1, 4) : 0;
        c.q_misalign = rnd_int(0, 7) == 0;
        if (kind < 6) c.dq = c.dkv = rnd_int(0, 1) ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
        else if (kind < 8) c.dq = c.dkv = ATTN_DTYPE_F32;
        else { c.dq = rnd_int(0, 1) ? ATTN_DTYPE_F16 : ATTN_DTYPE_F32; c.dkv = c.dq == ATTN_DTYPE_F32 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32; }
        if (sm90_prefill) { /* --sm90-prefill: every case within the sm_90 kernel's scope */
            c.head = rnd_int(0, 1) ? 128 : 64;
            if (c.dq != c.dkv || c.dq == ATTN_DTYPE_F32) c.dq = c.dkv = rnd_int(0, 1) ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
            c.softcap = 0.0f;
            c.alibi = 0;
            c.splits = 1;
            c.decode_shape = 0;
        }
        c.sinks = rnd_int(0, 2) == 0; /* drawn last: the other draws of a seed stay as they were */
        if (!sm90_prefill && rnd_int(0, 5) == 0) { /* WIDE HEADS (after the others, for the same reason) */
            c.head = rnd_int(0, 2) ? 512 : rnd_int(0, 1) ? 384 : 288;
            if (c.dq != c.dkv || c.dq == ATTN_DTYPE_F32) c.dq = c.dkv = rnd_int(0, 1) ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
        }
        for (r = 0; r < nr; r++) {
            int shape = rnd_int(0, 3);
            if (shape == 0) { qlens[r] = 1; ctx[r] = rnd_int(0, 700); }                 /* decode */
            else if (shape == 1) { qlens[r] = rnd_int(2, 90); ctx[r] = 0; }             /* prefill */
            else if (shape == 2) { qlens[r] = rnd_int(2, 70); ctx[r] = rnd_int(1, 400); } /* chunked prefill */
            else { qlens[r] = rnd_int(1, 3); ctx[r] = rnd_int(1500, 3000); }           /* long decode */
        }
        run_attention_case(&c, nr, qlens, ctx);
    }
}

/* ---- cache writes ---- */
static void test_cache_write(int cases) {
    int k;
    for (k = 0; k < cases; k++) {
        static const int heads[] = {64, 80, 128, 256};
        attn_dtype din = (attn_dtype)rnd_int(1, 3), dc = rnd_int(0, 1) ? din : (attn_dtype)rnd_int(1, 3);
        int D = heads[rnd_int(0, 3)], Hkv = rnd_int(1, 4), BS = rnd_int(0, 1) ? 16 : 32, T = rnd_int(1, 40);
        int nblocks = (T + BS - 1) / BS + 2, pad = rnd_int(0, 1) ? 8 : 0, mis = rnd_int(0, 4) == 0, t;
        size_t row = (size_t)Hkv * D + (size_t)pad, in_elems = (size_t)T * row + 1, c_elems = (size_t)nblocks * 2 * BS * Hkv * D;
        size_t ein = dsize(din), ec = dsize(dc);
        void *kh = malloc(in_elems * ein), *vh = malloc(in_elems * ein), *cpu = calloc(c_elems, ec), *gpu = malloc(c_elems * ec);
        int64_t *slots = (int64_t *)malloc((size_t)T * 8), shape[ATTN_MAX_DIMS];
        attn_layer_desc d;
        attn_layer *layer = NULL;
        attn_select_request req;
        char defs[128];
        int ndim;
        fill_random(kh, din, in_elems, 3.0f);
        fill_random(vh, din, in_elems, 3.0f);
        { /* distinct slots in random order, some -1 */
            int n = nblocks * BS, *perm = (int *)malloc((size_t)n * sizeof(int)), i;
            for (i = 0; i < n; i++) perm[i] = i;
            for (i = n - 1; i > 0; i--) { int j = rnd_int(0, i), x = perm[i]; perm[i] = perm[j]; perm[j] = x; }
            for (t = 0; t < T; t++) slots[t] = rnd_int(0, 5) == 0 ? -1 : perm[t];
            free(perm);
        }
        memset(&d, 0, sizeof d);
        d.num_heads = Hkv; d.num_kv_heads = Hkv; d.head_size = D; d.dtype = din; d.kv_cache_dtype = dc; d.block_size = BS;
        memset(&req, 0, sizeof req);
        req.backend = ATTN_BACKEND_CPU;
        if (attn_layer_create(context, &d, &req, &layer) != ATTN_OK) { failed++; continue; }
        attn_layer_kv_cache_shape(layer, nblocks, shape, &ndim);
        {
            int64_t s3[3];
            attn_tensor kt, vt, ct;
            s3[0] = T; s3[1] = Hkv; s3[2] = D;
            kt = attn_tensor_make((char *)kh + mis * ein, din, 3, s3);
            kt.strides[0] = (int64_t)row; kt.strides[1] = D; kt.strides[2] = 1;
            vt = attn_tensor_make((char *)vh + mis * ein, din, 3, s3);
            vt.strides[0] = (int64_t)row; vt.strides[1] = D; vt.strides[2] = 1;
            ct = attn_tensor_make(cpu, dc, ndim, shape);
            if (attn_reshape_and_cache(layer, &kt, &vt, &ct, ATTN_SLOTS(slots, T), NULL) != ATTN_OK) { failed++; attn_layer_destroy(layer); continue; }
        }
        snprintf(defs, sizeof defs, "HEAD_DIM=%d DT_IN=%d DT_CACHE=%d", D, dcode(din), dcode(dc));
        {
            module_entry *m = get_module("cache_write.cu", defs, "attn_reshape_and_cache");
            attn__CUfunction f = m->main;
            attn__cache_write_params p; /* kernels/attn_params.cuh, as the kernel takes it */
            void *args[1];
            attn__CUdeviceptr dk = dupload(kh, in_elems * ein), dv = dupload(vh, in_elems * ein), dcache = dalloc(c_elems * ec),
                              ds = dupload(slots, (size_t)T * 8);
            CU_CHECK(cu->cuMemsetD8Async(dcache, 0, c_elems * ec, NULL));
            memset(&p, 0, sizeof p);
            p.key = dk + (attn__CUdeviceptr)(mis * ein); p.value = dv + (attn__CUdeviceptr)(mis * ein); p.kv_cache = dcache;
            p.slot_mapping = ds;
            p.key_stride_token = p.value_stride_token = (int64_t)row; p.key_stride_head = p.value_stride_head = D;
            p.num_tokens = T; p.num_kv_heads = Hkv; p.block_size = BS;
            args[0] = &p;
            CU_CHECK(cu->cuLaunchKernel(f, (unsigned)rnd_int(1, T), 1, 1, 128, 1, 1, 0, NULL, args, NULL));
            CU_CHECK(cu->cuCtxSynchronize());
            CU_CHECK(download(gpu, dcache, c_elems * ec));
            cu->cuMemFree(dk); cu->cuMemFree(dv); cu->cuMemFree(dcache); cu->cuMemFree(ds);
        }
        if (memcmp(cpu, gpu, c_elems * ec)) {
            printf("FAIL reshape_and_cache %s (tokens %d, kv_heads %d, block %d, pad %d, misalign %d)\n", defs, T, Hkv, BS, pad, mis);
            failed++;
        } else passed++;
        attn_layer_destroy(layer);
        free(kh); free(vh); free(cpu); free(gpu); free(slots);
    }
    for (k = 0; k < cases; k++) { /* the MLA latent write */
        attn_dtype din = (attn_dtype)rnd_int(1, 3), dc = rnd_int(0, 1) ? din : (attn_dtype)rnd_int(1, 3);
        int R = rnd_int(0, 1) ? 512 : 256, P = 64, BS = 16, T = rnd_int(1, 40), nblocks = (T + BS - 1) / BS + 1, t, mis = rnd_int(0, 3) == 0;
        size_t ein = dsize(din), ec = dsize(dc), c_elems = (size_t)nblocks * BS * (R + P);
        void *ch = malloc(((size_t)T * (R + 8) + 1) * ein), *ph = malloc(((size_t)T * P + 1) * ein);
        void *cpu = calloc(c_elems, ec), *gpu = malloc(c_elems * ec);
        int64_t *slots = (int64_t *)malloc((size_t)T * 8), shape[ATTN_MAX_DIMS];
        attn_layer_desc d;
        attn_layer *layer = NULL;
        attn_select_request req;
        char defs[128];
        int ndim;
        fill_random(ch, din, (size_t)T * (R + 8) + 1, 2.0f);
        fill_random(ph, din, (size_t)T * P + 1, 2.0f);
        for (t = 0; t < T; t++) slots[t] = rnd_int(0, 6) == 0 ? -1 : (int64_t)t * (nblocks * BS - 1) / (T > 1 ? T - 1 : 1) % (nblocks * BS);
        { /* distinct: sequential slots shuffled */
            int i;
            for (t = 0; t < T; t++) if (slots[t] >= 0) slots[t] = t;
            for (i = T - 1; i > 0; i--) { int j = rnd_int(0, i); int64_t x = slots[i]; slots[i] = slots[j]; slots[j] = x; }
        }
        memset(&d, 0, sizeof d);
        d.num_heads = 16; d.num_kv_heads = 1; d.head_size = R + P; d.dtype = din; d.kv_cache_dtype = dc; d.block_size = BS;
        d.use_mla = 1; d.kv_lora_rank = R; d.qk_rope_head_dim = P; d.qk_nope_head_dim = 128; d.v_head_dim = 128;
        memset(&req, 0, sizeof req);
        req.backend = ATTN_BACKEND_CPU_MLA;
        if (attn_layer_create(context, &d, &req, &layer) != ATTN_OK) {
            printf("FAIL MLA layer: %s\n", attn_context_last_error(context));
            failed++;
            continue;
        }
        attn_layer_kv_cache_shape(layer, nblocks, shape, &ndim);
        {
            int64_t s2[2];
            attn_tensor ct, pt, kt;
            s2[0] = T; s2[1] = R;
            ct = attn_tensor_make((char *)ch + mis * ein, din, 2, s2);
            ct.strides[0] = R + 8; ct.strides[1] = 1;
            s2[1] = P;
            pt = attn_tensor_make((char *)ph + mis * ein, din, 2, s2);
            kt = attn_tensor_make(cpu, dc, ndim, shape);
            if (attn_concat_and_cache_mla(layer, &ct, &pt, &kt, ATTN_SLOTS(slots, T), NULL) != ATTN_OK) {
                printf("FAIL MLA write (CPU): %s\n", attn_context_last_error(context));
                failed++;
                attn_layer_destroy(layer);
                continue;
            }
        }
        snprintf(defs, sizeof defs, "KV_LORA_RANK=%d ROPE_DIM=%d DT_IN=%d DT_CACHE=%d", R, P, dcode(din), dcode(dc));
        {
            module_entry *m = get_module("cache_write.cu", defs, "attn_concat_and_cache_mla");
            attn__CUfunction f = m->main;
            attn__latent_write_params p; /* kernels/attn_params.cuh, as the kernel takes it */
            void *args[1];
            attn__CUdeviceptr dcx = dupload(ch, ((size_t)T * (R + 8) + 1) * ein), dpx = dupload(ph, ((size_t)T * P + 1) * ein);
            attn__CUdeviceptr dcache = dalloc(c_elems * ec), ds = dupload(slots, (size_t)T * 8);
            CU_CHECK(cu->cuMemsetD8Async(dcache, 0, c_elems * ec, NULL));
            memset(&p, 0, sizeof p);
            p.kv_c = dcx + (attn__CUdeviceptr)(mis * ein); p.k_pe = dpx + (attn__CUdeviceptr)(mis * ein); p.kv_cache = dcache;
            p.slot_mapping = ds;
            p.kv_c_stride_token = R + 8; p.k_pe_stride_token = P; p.num_tokens = T;
            p.num_slots = (int64_t)nblocks * BS;
            args[0] = &p;
            CU_CHECK(cu->cuLaunchKernel(f, (unsigned)rnd_int(1, T), 1, 1, 128, 1, 1, 0, NULL, args, NULL));
            CU_CHECK(cu->cuCtxSynchronize());
            CU_CHECK(download(gpu, dcache, c_elems * ec));
            cu->cuMemFree(dcx); cu->cuMemFree(dpx); cu->cuMemFree(dcache); cu->cuMemFree(ds);
        }
        if (memcmp(cpu, gpu, c_elems * ec)) {
            printf("FAIL concat_and_cache_mla %s (tokens %d, misalign %d)\n", defs, T, mis);
            failed++;
        } else passed++;
        attn_layer_destroy(layer);
        free(ch); free(ph); free(cpu); free(gpu); free(slots);
    }
}

/* ---- the LSE merge ---- */
static float special_lse(void) {
    switch (rnd_int(0, 9)) {
    case 0: return -INFINITY;
    case 1: return INFINITY;
    case 2: return NAN;
    default: return rnd_float(-5.0f, 5.0f);
    }
}

static void test_merge(int cases) {
    int k;
    for (k = 0; k < cases; k++) {
        static const int dims[] = {64, 128, 100, 512, 8, 13};
        attn_dtype dt = (attn_dtype)rnd_int(1, 3);
        int T = rnd_int(1, 50), H = rnd_int(1, 8), D = dims[rnd_int(0, 5)], alias = rnd_int(0, 2) == 0, with_lse = rnd_int(0, 3) != 0;
        int ba = rnd_int(0, 1), bb = rnd_int(0, 1), bo = rnd_int(0, 1), i, bad = 0;
        size_t n = (size_t)T * H * D, es = dsize(dt);
        void *a = malloc(n * es), *bh = malloc(n * es), *cpu = malloc(n * es), *gpu = malloc(n * es);
        float *la = (float *)malloc((size_t)T * H * 4), *lb = (float *)malloc((size_t)T * H * 4);
        float *lcpu = (float *)malloc((size_t)T * H * 4), *lgpu = (float *)malloc((size_t)T * H * 4);
        char defs[64];
        fill_random(a, dt, n, 2.0f);
        fill_random(bh, dt, n, 2.0f);
        for (i = 0; i < T * H; i++) { la[i] = special_lse(); lb[i] = special_lse(); }
        { /* an empty side may hold NaN in its output: it must not leak */
            for (i = 0; i < T * H; i++)
                if (!(la[i] < INFINITY) && D > 0) put(a, dt, (size_t)i * D, NAN);
        }
        {
            int64_t s3[3], s2[2];
            attn_tensor oa, ob, oo, ta, tb, to;
            s3[0] = T; s3[1] = H; s3[2] = D; s2[0] = T; s2[1] = H;
            memcpy(cpu, a, n * es);
            oa = attn_tensor_make(alias ? cpu : a, dt, 3, s3);
            ob = attn_tensor_make(bh, dt, 3, s3);
            oo = attn_tensor_make(cpu, dt, 3, s3);
            ta = attn_tensor_make(la, ATTN_DTYPE_F32, 2, s2);
            tb = attn_tensor_make(lb, ATTN_DTYPE_F32, 2, s2);
            to = attn_tensor_make(lcpu, ATTN_DTYPE_F32, 2, s2);
            if (attn_merge_attn_states(context, &oa, &ta, (attn_lse_base)ba, &ob, &tb, (attn_lse_base)bb, &oo,
                                       with_lse ? &to : NULL, (attn_lse_base)bo, NULL) != ATTN_OK) {
                printf("FAIL merge (CPU): %s\n", attn_context_last_error(context));
                failed++;
                continue;
            }
        }
        snprintf(defs, sizeof defs, "HEAD_DIM=%d DT=%d", D, dcode(dt));
        {
            module_entry *m = get_module("merge.cu", defs, "attn_merge_attn_states");
            attn__CUfunction f = m->main;
            struct {
                attn__CUdeviceptr oa, la, ob, lb, out, lse;
                int64_t s[12];
                int T, H, ba, bb, bo, pad0;
            } p;
            void *args[1];
            attn__CUdeviceptr da = dupload(a, n * es), db = dupload(bh, n * es), dla = dupload(la, (size_t)T * H * 4),
                              dlb = dupload(lb, (size_t)T * H * 4), dout = alias ? da : dalloc(n * es), dl = dalloc((size_t)T * H * 4);
            p.oa = da; p.la = dla; p.ob = db; p.lb = dlb; p.out = dout; p.lse = with_lse ? dl : 0;
            for (i = 0; i < 6; i++) { p.s[2 * i] = (int64_t)H * (i < 3 ? D : 1); p.s[2 * i + 1] = i < 3 ? D : 1; }
            p.T = T; p.H = H; p.ba = ba; p.bb = bb; p.bo = bo; p.pad0 = 0;
            args[0] = &p;
            CU_CHECK(cu->cuLaunchKernel(f, (unsigned)rnd_int(1, 8), 1, 1, 128, 1, 1, 0, NULL, args, NULL));
            CU_CHECK(cu->cuCtxSynchronize());
            CU_CHECK(download(gpu, dout, n * es));
            CU_CHECK(download(lgpu, dl, (size_t)T * H * 4));
            cu->cuMemFree(da); cu->cuMemFree(db); cu->cuMemFree(dla); cu->cuMemFree(dlb); if (!alias) cu->cuMemFree(dout); cu->cuMemFree(dl);
        }
        for (i = 0; i < (int)n && bad < 3; i++) {
            float x = get(gpu, dt, (size_t)i), y = get(cpu, dt, (size_t)i);
            if (!near_ok(x, y, dt == ATTN_DTYPE_F32 ? 1e-6f : 1e-4f, dt == ATTN_DTYPE_F32 ? 1e-5f : 8e-3f)) {
                printf("  out %d: gpu %g cpu %g\n", i, x, y);
                bad++;
            }
        }
        for (i = 0; with_lse && i < T * H && bad < 3; i++)
            if (!near_ok(lgpu[i], lcpu[i], 1e-5f, 1e-5f)) { printf("  lse %d: gpu %g cpu %g\n", i, lgpu[i], lcpu[i]); bad++; }
        if (bad) { printf("FAIL merge %s tokens %d heads %d alias %d bases %d %d %d\n", defs, T, H, alias, ba, bb, bo); failed++; }
        else passed++;
        free(a); free(bh); free(cpu); free(gpu); free(la); free(lb); free(lcpu); free(lgpu);
    }
}

/* ---- benchmarks ---- */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Times one launch pair (attention + merge) of a schedule, average of `reps` after warmup. */
static float time_launch(module_entry *m, attn__paged_params *p, schedule *s, int reps) {
    attn__CUfunction fa = m->main, fm = m->second;
    attn__CUevent e0, e1;
    void *args[2];
    float ms = 0;
    int i;
    launch_args(m, args, p);
    CU_CHECK(cu->cuEventCreate(&e0, 0));
    CU_CHECK(cu->cuEventCreate(&e1, 0));
    for (i = 0; i < reps + 3; i++) {
        if (i == 3) CU_CHECK(cu->cuEventRecord(e0, NULL));
        CU_CHECK(cu->cuLaunchKernel(fa, (unsigned)s->num_work, 1, 1, (unsigned)m->config.threads, 1, 1, (unsigned)m->config.shared_bytes, NULL, args, NULL));
        if (s->num_merge) CU_CHECK(cu->cuLaunchKernel(fm, (unsigned)s->num_merge, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
    }
    CU_CHECK(cu->cuEventRecord(e1, NULL));
    CU_CHECK(cu->cuEventSynchronize(e1));
    CU_CHECK(cu->cuEventElapsedTime(&ms, e0, e1));
    cu->cuEventDestroy(e0);
    cu->cuEventDestroy(e1);
    return ms / reps;
}

static int decode_only;  /* --decode-bench: time the decode shapes only */
static int prefill_only; /* --prefill-bench: the prefill shapes only */
static int contiguous;  /* --contiguous: block_table rows in cache order (an upper bound of paging's cost) */
static int bench_sinks; /* --sinks: the benches run with attention sinks (p.sinks, a logit per head) */
static attn__CUdeviceptr bench_sinks_dev;

/* Times one causal prefill of n tokens (32/8 heads, head 128, bf16, block 16) with module m
   at ptt query tokens per CTA; prints TFLOP/s. */
static void bench_prefill(module_entry *m, const char *label, int n, int ptt, attn__CUdeviceptr d_q, attn__CUdeviceptr d_kv,
                          attn__CUdeviceptr d_out, attn__CUdeviceptr d_bt, attn__CUdeviceptr d_po, attn__CUdeviceptr d_pml,
                          int max_blocks) {
    const int H = 32, Hkv = 8, D = 128;
    int32_t qsl[2], sl[1];
    schedule s;
    attn__paged_params p;
    attn__CUdeviceptr d_sl, d_qsl, d_w, d_nw, d_m, d_nm;
    float ms;
    double flops = 4.0 * H * D * ((double)n * (n + 1) / 2);
    qsl[0] = 0; qsl[1] = n; sl[0] = n;
    build_work(&s, 1, qsl, sl, Hkv, ptt, 1, 0, 1, m->config.kv_tile);
    { /* longest first: the tiles at the end of the sequence see the most keys */
        int a, b2;
        for (a = 0, b2 = s.num_work - 1; a < b2; a++, b2--) {
            int tmp[8];
            memcpy(tmp, s.work + 8 * a, 32); memcpy(s.work + 8 * a, s.work + 8 * b2, 32); memcpy(s.work + 8 * b2, tmp, 32);
        }
    }
    d_sl = dupload(sl, 4); d_qsl = dupload(qsl, 8);
    d_w = dupload(s.work, (size_t)s.num_work * 32); d_nw = dupload(&s.num_work, 4);
    d_m = dupload(s.merge, 32); d_nm = dupload(&s.num_merge, 4);
    memset(&p, 0, sizeof p);
    p.q = d_q; p.kv_cache = d_kv; p.out = d_out; p.block_table = d_bt; p.seq_lens = d_sl; p.query_start_loc = d_qsl;
    p.work = d_w; p.num_work = d_nw; p.merge = d_m; p.num_merge = d_nm; p.partial_o = d_po; p.partial_ml = d_pml;
    p.q_stride_token = (int64_t)H * D; p.q_stride_head = D; p.out_stride_token = (int64_t)H * D; p.out_stride_head = D;
    p.block_table_stride = (int64_t)max_blocks; p.num_kv_heads = Hkv; p.scale = 0.088f; p.sinks = bench_sinks_dev;
    ms = time_launch(m, &p, &s, 10);
    printf("  %stokens %5d (%d per CTA, %d threads, %d B smem): ctas %5d  %9.1f us  %6.1f TFLOP/s\n", label, n, ptt,
           m->config.threads, m->config.shared_bytes, s.num_work, ms * 1e3, flops / (ms * 1e-3) / 1e12);
    cu->cuMemFree(d_sl); cu->cuMemFree(d_qsl); cu->cuMemFree(d_w); cu->cuMemFree(d_nw); cu->cuMemFree(d_m); cu->cuMemFree(d_nm);
    free(s.work); free(s.merge);
}

static void bench(const char *extra) {
    const int H = 32, Hkv = 8, D = 128, BS = 16, G = H / Hkv;
    static const int batches[] = {1, 16, 64, 128}, ctxs[] = {1024, 4096, 16384};
    int bi, ci;
    char defs[256];
    size_t max_blocks = 16384 / BS, total_blocks = 128 * max_blocks;
    attn__CUdeviceptr d_kv = dalloc(total_blocks * 2 * BS * Hkv * D * 2);
    attn__CUdeviceptr d_q = dalloc((size_t)16384 * H * D * 2), d_out = dalloc((size_t)16384 * H * D * 2);
    attn__CUdeviceptr d_po = dalloc((size_t)64 << 20), d_pml = dalloc((size_t)8 << 20);
    int32_t *bt = (int32_t *)malloc(total_blocks * 4);
    attn__CUdeviceptr d_bt;
    size_t i;
    double t0 = now_s();
    CU_CHECK(cu->cuMemsetD8Async(d_kv, 0x3c, total_blocks * 2 * BS * Hkv * D * 2, NULL)); /* bf16 ~0.01 */
    CU_CHECK(cu->cuMemsetD8Async(d_q, 0x3c, (size_t)16384 * H * D * 2, NULL));
    for (i = 0; i < total_blocks; i++) /* scattered pages (--contiguous: in order) */
        bt[i] = contiguous ? (int32_t)i : (int32_t)((i * 7919) % total_blocks);
    d_bt = dupload(bt, total_blocks * 4);
    if (bench_sinks) {
        float sk[64];
        for (i = 0; i < 64; i++) sk[i] = 0.5f + 0.01f * (float)i;
        bench_sinks_dev = dupload(sk, sizeof sk);
    }
    printf("decode: bf16, %d/%d heads, head %d, block %d%s%s%s (bytes = K+V read once)\n", H, Hkv, D, BS,
           extra[0] ? ", " : "", extra, bench_sinks ? ", attention sinks" : "");
    for (bi = 0; bi < (prefill_only ? 0 : 4); bi++)
        for (ci = 0; ci < 3; ci++) {
            int B = batches[bi], ctx = ctxs[ci], r, splits, per_sm = 1;
            int32_t *qsl = (int32_t *)malloc((size_t)(B + 1) * 4), *sl = (int32_t *)malloc((size_t)B * 4);
            schedule s;
            attn__paged_params p;
            module_entry *m;
            attn__CUdeviceptr d_sl, d_qsl, d_w, d_nw, d_m, d_nm;
            float ms;
            double bytes = (double)B * ctx * Hkv * D * 2 * 2;
            for (r = 0; r <= B; r++) qsl[r] = r;
            for (r = 0; r < B; r++) sl[r] = ctx;
            snprintf(defs, sizeof defs, "HEAD_DIM=%d BLOCK_SIZE=%d GROUP=%d DT_Q=2 DT_KV=2 TILE_TOKENS=%d %s", D, BS, G, 16 / G, extra);
            m = get_module("paged_attention.cu", defs, "attn_paged_attention");
            { /* split so that one wave of resident CTAs holds the grid (splits >= 256 keys) */
                CU_CHECK(cu->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, m->main, m->config.threads,
                                                                         (size_t)m->config.shared_bytes));
                splits = per_sm * num_sms / (B * Hkv);
                if (splits > ctx / 256) splits = ctx / 256;
                if (splits < 1) splits = 1;
            }
            build_work(&s, B, qsl, sl, Hkv, 16 / G, 1, 0, splits, m->config.kv_tile);
            d_sl = dupload(sl, (size_t)B * 4); d_qsl = dupload(qsl, (size_t)(B + 1) * 4);
            d_w = dupload(s.work, (size_t)s.num_work * 32); d_nw = dupload(&s.num_work, 4);
            d_m = dupload(s.merge, (size_t)(s.num_merge + 1) * 32); d_nm = dupload(&s.num_merge, 4);
            memset(&p, 0, sizeof p);
            p.q = d_q; p.kv_cache = d_kv; p.out = d_out; p.block_table = d_bt; p.seq_lens = d_sl; p.query_start_loc = d_qsl;
            p.work = d_w; p.num_work = d_nw; p.merge = d_m; p.num_merge = d_nm; p.partial_o = d_po; p.partial_ml = d_pml;
            p.q_stride_token = (int64_t)H * D; p.q_stride_head = D; p.out_stride_token = (int64_t)H * D; p.out_stride_head = D;
            p.block_table_stride = (int64_t)max_blocks; p.num_kv_heads = Hkv; p.scale = 0.088f; p.sinks = bench_sinks_dev;
            ms = time_launch(m, &p, &s, 20);
            printf("  batch %3d context %5d: splits %2d ctas %5d (%d per SM, %d threads, %d B shared)  %8.1f us  %6.2f TB/s\n",
                   B, ctx, splits, s.num_work, per_sm, m->config.threads, m->config.shared_bytes, ms * 1e3, bytes / (ms * 1e-3) / 1e12);
            cu->cuMemFree(d_sl); cu->cuMemFree(d_qsl); cu->cuMemFree(d_w); cu->cuMemFree(d_nw); cu->cuMemFree(d_m); cu->cuMemFree(d_nm);
            free(s.work); free(s.merge); free(qsl); free(sl);
        }
    if (!decode_only) { /* causal prefill: one request of n tokens, 32/8 heads, head 128, bf16 */
        static const int lens[] = {1024, 4096, 16384};
        int li;
        printf("prefill: causal, bf16, %d/%d heads, head %d, block %d%s%s (FLOPs = 4 * heads * head * visible pairs)\n",
               H, Hkv, D, BS, extra[0] ? ", " : "", extra);
        for (li = 0; li < 3; li++) {
            int ptt = prefill_tt ? prefill_tt : 64 / G;
            snprintf(defs, sizeof defs, "HEAD_DIM=%d BLOCK_SIZE=%d GROUP=%d DT_Q=2 DT_KV=2 TILE_TOKENS=%d %s", D, BS, G, ptt, extra);
            bench_prefill(get_module("paged_attention.cu", defs, "attn_paged_attention"), "", lens[li], ptt, d_q, d_kv, d_out,
                          d_bt, d_po, d_pml, (int)max_blocks);
            if (sm90_prefill) { /* the sm_90a kernel on the same shape: 128 rows per CTA */
                module_entry *m;
                snprintf(defs, sizeof defs, "HEAD_DIM=%d BLOCK_SIZE=%d GROUP=%d DT_Q=2 DT_KV=2 TILE_TOKENS=%d %s", D, BS, G,
                         128 / G, extra);
                if ((m = sm90_module(defs, 1)) != NULL && kv_map_encode(m, d_kv, ATTN_DTYPE_BF16, (int)total_blocks, BS, Hkv, D))
                    bench_prefill(m, "sm90 ", lens[li], 128 / G, d_q, d_kv, d_out, d_bt, d_po, d_pml, (int)max_blocks);
            }
        }
    }
    cu->cuMemFree(d_kv); cu->cuMemFree(d_q); cu->cuMemFree(d_out); cu->cuMemFree(d_po); cu->cuMemFree(d_pml); cu->cuMemFree(d_bt);
    free(bt);
    printf("bench: %.1f s\n", now_s() - t0);
}

/* ---- --mla: the MLA kernels (CUDA_MLA_SM90's on wgmma and CUDA_MLA's on mma.sync, all
   embedded), compiled for the
   device (sm_90 / sm_90a without one) with ptxas's report; on a GPU, random decode batches
   and prefill passes against a float64 reference, and with --bench issue 9's shapes ---- */
static int mla_mode;
static int mla_shape[5]; /* --mla-shape H,B,CTX,SPLITS[,V]: one decode shape timed on the wgmma kernel's
                            variant V of mla_variants (0: the first wgmma one) */

/* the kernels' parameter structs: attn__mla_decode_params and attn__mla_prefill_params
   (kernels/attn_params.cuh, shared with the kernels) */

/* MLA kernels (all embedded): 0 mla_decode.cu (CUDA_MLA's decode, mma.sync), 1
   mla_decode_sm90.cu, 2 mla_prefill_sm90.cu, 3 mla_prefill.cu (CUDA_MLA's prefill attention,
   same params and pass as 2) */
static draft_kernel mla_kernels[4] = {
    {"mla", "mla_decode.cu", 1, 0, "attn_mla_decode", "attn_mla_merge", "attn_mla_config", NULL},
    {"mla", "mla_decode_sm90.cu", 1, 1, "attn_mla_decode", "attn_mla_merge", "attn_mla_config", NULL},
    {"mha", "mla_prefill_sm90.cu", 1, 1, "attn_mla_prefill", NULL, "attn_mha_config", NULL},
    {"mha", "mla_prefill.cu", 1, 0, "attn_mla_prefill", NULL, "attn_mha_config", NULL}};
static module_entry *mla_module(const char *defines, int which, int load) {
    return draft_module(&mla_kernels[which], defines, load);
}

/* the first five: mla_decode.cu; then mla_decode_sm90.cu (ROWS 64; the cache's tensor map first) */
#define MLA_NV 5
#define MLA_NV_SM90 7
static const char *mla_variants[] = {
    "KV_LORA=512 ROPE=64 BLOCK_SIZE=64 DT=2 ROWS=16",
    "KV_LORA=512 ROPE=64 BLOCK_SIZE=64 DT=2 ROWS=64",
    "KV_LORA=512 ROPE=64 BLOCK_SIZE=16 DT=1 ROWS=32",
    "KV_LORA=256 ROPE=64 BLOCK_SIZE=32 DT=2 ROWS=16",
    "KV_LORA=256 ROPE=64 BLOCK_SIZE=64 DT=1 ROWS=64",
    "KV_LORA=512 ROPE=64 BLOCK_SIZE=64 DT=2",
    "KV_LORA=512 ROPE=64 BLOCK_SIZE=16 DT=1",
    "KV_LORA=256 ROPE=64 BLOCK_SIZE=32 DT=2",
    "KV_LORA=512 ROPE=64 BLOCK_SIZE=128 DT=2",
    "KV_LORA=512 ROPE=64 BLOCK_SIZE=48 DT=2",
    "KV_LORA=512 ROPE=64 BLOCK_SIZE=64 DT=2 SPLIT_WAIT=0",
    "KV_LORA=512 ROPE=64 BLOCK_SIZE=64 DT=2 EVICT_FIRST=0",
};
static int mla_sm90_only; /* --mla-sm90: the random cases and the decode bench on mla_decode_sm90.cu only */
/* the kernel (mla_kernels index) of variant v */
static int mla_variant_kernel(int v) { return v < MLA_NV ? 0 : 1; }

/* The tensor map of a [num_blocks, BS, D] 16-bit latent cache for a kernel that reads it
   through TMA (config.tma_box_rows > 0), encoded by the library's attn__cuda_mla_map. */
static attn__tma_map mla_map;
static int mla_map_encode(const module_entry *m, attn__CUdeviceptr kv, attn_dtype dt, int num_blocks, int BS, int D) {
    if (attn__cuda_mla_map(context, dt, (const void *)(uintptr_t)kv, num_blocks, BS, D, m->config.tma_box_rows, &mla_map) == ATTN_OK)
        return 1;
    printf("  FAIL tensor map of the latent cache: %s\n", attn_context_last_error(context));
    return 0;
}

static const char *mha_variants[] = {"DN=128 ROPE=64 DV=128 DT=2 KV_LORA=512", "DN=128 ROPE=64 DV=128 DT=1 KV_LORA=512",
                                     "DN=64 ROPE=64 DV=64 DT=2 KV_LORA=256"};

static void mla_compile_report(void) {
    size_t i;
    if (!context->platform.nvrtc_version) {
        printf("  SKIP mla compile: %s\n", context->platform.nvrtc_reason);
        skipped++;
        return;
    }
    printf("mla: %s and %s for sm_90, %s and %s for sm_90a (NVRTC %d.%d)\n", mla_kernels[0].file, mla_kernels[3].file,
           mla_kernels[1].file, mla_kernels[2].file, context->nvrtc->major,
           context->nvrtc->minor);
    for (i = 0; i < sizeof mla_variants / sizeof mla_variants[0]; i++)
        if (mla_module(mla_variants[i], mla_variant_kernel((int)i), 0)) passed++;
    for (i = 0; i < sizeof mha_variants / sizeof mha_variants[0]; i++)
        if (mla_module(mha_variants[i], 2, 0)) passed++;
    for (i = 0; i < sizeof mha_variants / sizeof mha_variants[0]; i++)
        if (mla_module(mha_variants[i], 3, 0)) passed++;
}

/* One random decode batch on variant v with `splits` (1: none) against float64. Returns 1 ok. */
static int mla_case(int v, int H, int nreq, int max_ctx, int splits, int timing, double *us) {
    int L, R, BS, dt, rows, r, i, t, h, nq = 0, ok = 1, nw = 0, nm = 0, nslot = 0, maxb = 0, nb;
    char defs[160];
    module_entry *m;
    const int which = mla_variant_kernel(v);
    int prow; /* rows of a partial slot: the kernel's ROWS (64 for both wgmma kernels) */
    module_entry *mm; /* the module whose second function merges the splits */
    if (sscanf(mla_variants[v], "KV_LORA=%d ROPE=%d BLOCK_SIZE=%d DT=%d ROWS=%d", &L, &R, &BS, &dt, &rows) < 5) rows = 64;
    prow = which == 0 ? rows : 64;
    snprintf(defs, sizeof defs, "%s", mla_variants[v]);
    if (!(m = mla_module(defs, which, 1))) return 0;
    mm = m;
    {
        const int D = L + R;
        attn_dtype et = dt == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        int *qlen = (int *)calloc((size_t)nreq, sizeof(int)), *sl = (int *)calloc((size_t)nreq, sizeof(int));
        int *qsl = (int *)calloc((size_t)nreq + 1, sizeof(int)), *bt, *work, *merge;
        uint16_t *q, *qpe, *kvc, *out;
        float *lse, scale = 1.0f / sqrtf((float)(128 + R));
        attn__CUdeviceptr dq, dqpe, dkv, dout, dlse, dbt, dw, dnw, dm, dnm, dpo, dpl;
        attn__mla_decode_params p;
        void *args[2], *margs[1];
        for (r = 0; r < nreq; r++) {
            qlen[r] = timing ? 1 : (rnd_int(0, 3) == 0 ? 2 : 1);
            sl[r] = timing ? max_ctx : rnd_int(qlen[r], max_ctx);
            if (!timing && rnd_int(0, 9) == 0) sl[r] = qlen[r]; /* a request of its own tokens only */
            qsl[r + 1] = qsl[r] + qlen[r];
            if ((sl[r] + BS - 1) / BS > maxb) maxb = (sl[r] + BS - 1) / BS;
        }
        nq = qsl[nreq];
        nb = nreq * maxb + 2;
        bt = (int *)calloc((size_t)nreq * maxb, sizeof(int));
        { /* shuffled blocks */
            int *perm = (int *)malloc((size_t)nb * sizeof(int));
            for (i = 0; i < nb; i++) perm[i] = i;
            for (i = nb - 1; i > 0; i--) { int j = rnd_int(0, i), x = perm[i]; perm[i] = perm[j]; perm[j] = x; }
            for (i = 0; i < nreq * maxb; i++) bt[i] = perm[i];
            free(perm);
        }
        q = (uint16_t *)malloc((size_t)nq * H * L * 2);
        qpe = (uint16_t *)malloc((size_t)nq * H * R * 2);
        kvc = (uint16_t *)malloc((size_t)nb * BS * D * 2);
        out = (uint16_t *)malloc((size_t)nq * H * L * 2);
        lse = (float *)malloc((size_t)nq * H * 4);
        fill_random(q, et, (size_t)nq * H * L, 1.0f);
        fill_random(qpe, et, (size_t)nq * H * R, 1.0f);
        fill_random(kvc, et, (size_t)nb * BS * D, 1.0f);
        { /* NaN in every cache row no query may read: past each request's keys in its blocks,
             and the two spare blocks (a kernel that lets one into a product fails) */
            int j;
            for (r = 0; r < nreq; r++)
                for (j = sl[r]; j < maxb * BS; j++)
                    memset(kvc + ((size_t)bt[r * maxb + j / BS] * BS + j % BS) * D, 0xff, (size_t)D * 2);
            { /* the blocks no table names */
                char *named = (char *)calloc((size_t)nb, 1);
                for (i = 0; i < nreq * maxb; i++) named[bt[i]] = 1;
                for (i = 0; i < nb; i++)
                    if (!named[i]) memset(kvc + (size_t)i * BS * D, 0xff, (size_t)BS * D * 2);
                free(named);
            }
        }
        memset(out, 0xff, (size_t)nq * H * L * 2); /* NaN poison */
        memset(lse, 0xff, (size_t)nq * H * 4);
        { /* the work list: per query row and head tile, `splits` parts of its keys */
            int cap = nq * ((H + rows - 1) / rows);
            work = (int *)calloc((size_t)cap * splits + 1, 32);
            merge = (int *)calloc((size_t)cap + 1, 32);
            for (r = 0; r < nreq; r++)
                for (t = 0; t < qlen[r]; t++) {
                    int kend = sl[r] - (qlen[r] - 1 - t), qrow = qsl[r] + t, ns = splits;
                    if (ns > 1 && kend < 2 * ns) ns = 1;
                    for (h = 0; h < H; h += rows) {
                        int s0 = nslot;
                        if (ns > 1) {
                            int *me = merge + 8 * nm++;
                            me[0] = qrow; me[1] = h; me[2] = ns; me[3] = s0;
                            nslot += ns;
                        }
                        for (i = 0; i < ns; i++) {
                            int *w = work + 8 * nw++;
                            w[0] = r; w[1] = h; w[2] = qrow; w[4] = (int)((int64_t)kend * i / ns);
                            w[5] = (int)((int64_t)kend * (i + 1) / ns); w[6] = ns > 1 ? s0 + i : -1;
                            w[7] = 0;
                        }
                    }
                }
        }
        dq = dupload(q, (size_t)nq * H * L * 2); dqpe = dupload(qpe, (size_t)nq * H * R * 2);
        dkv = dupload(kvc, (size_t)nb * BS * D * 2); dout = dupload(out, (size_t)nq * H * L * 2);
        dlse = dupload(lse, (size_t)nq * H * 4); dbt = dupload(bt, (size_t)nreq * maxb * 4);
        dw = dupload(work, (size_t)nw * 32 + 32); dnw = dupload(&nw, 4);
        dm = dupload(merge, (size_t)nm * 32 + 32); dnm = dupload(&nm, 4);
        dpo = dalloc((size_t)(nslot + 1) * prow * L * 4); dpl = dalloc((size_t)(nslot + 1) * prow * 4);
        memset(&p, 0, sizeof p);
        p.q = dq; p.q_pe = dqpe; p.kv_cache = dkv; p.out = dout; p.lse = dlse; p.block_table = dbt;
        p.work = dw; p.num_work = dnw; p.merge = dm; p.num_merge = dnm; p.partial_o = dpo; p.partial_lse = dpl;
        p.q_stride_token = (int64_t)H * L; p.q_stride_head = L; p.q_pe_stride_token = (int64_t)H * R; p.q_pe_stride_head = R;
        p.out_stride_token = (int64_t)H * L; p.out_stride_head = L; p.lse_stride_token = H; p.lse_stride_head = 1;
        p.block_table_stride = maxb; p.num_heads = H; p.scale = scale;
        margs[0] = &p;
        if (m->config.tma_box_rows > 0) {
            if (!mla_map_encode(m, dkv, et, nb, BS, D)) ok = 0;
            args[0] = &mla_map; args[1] = &p;
        } else {
            args[0] = &p;
        }
        if (ok) CU_CHECK(cu->cuLaunchKernel(m->main, (unsigned)nw, 1, 1, (unsigned)m->config.threads, 1, 1, (unsigned)m->config.shared_bytes, NULL, args, NULL));
        if (ok && nm) CU_CHECK(cu->cuLaunchKernel(mm->second, (unsigned)nm, (unsigned)prow, 1, 256, 1, 1, 0, NULL, margs, NULL));
        CU_CHECK(cu->cuStreamSynchronize(NULL));
        if (timing && ok) {
            attn__CUevent e0, e1;
            float ms = 0;
            int k;
            CU_CHECK(cu->cuEventCreate(&e0, 0)); CU_CHECK(cu->cuEventCreate(&e1, 0));
            CU_CHECK(cu->cuEventRecord(e0, NULL));
            for (k = 0; k < 20; k++) {
                CU_CHECK(cu->cuLaunchKernel(m->main, (unsigned)nw, 1, 1, (unsigned)m->config.threads, 1, 1, (unsigned)m->config.shared_bytes, NULL, args, NULL));
                if (nm) CU_CHECK(cu->cuLaunchKernel(mm->second, (unsigned)nm, (unsigned)prow, 1, 256, 1, 1, 0, NULL, margs, NULL));
            }
            CU_CHECK(cu->cuEventRecord(e1, NULL));
            CU_CHECK(cu->cuEventSynchronize(e1));
            CU_CHECK(cu->cuEventElapsedTime(&ms, e0, e1));
            *us = ms * 1e3 / 20;
            cu->cuEventDestroy(e0); cu->cuEventDestroy(e1);
        }
        CU_CHECK(download(out, dout, (size_t)nq * H * L * 2));
        CU_CHECK(download(lse, dlse, (size_t)nq * H * 4));
        { /* float64 reference over a sample of rows (all of them when small) */
            double *sc = (double *)malloc((size_t)max_ctx * sizeof(double)), *acc = (double *)malloc((size_t)L * sizeof(double));
            int bad = 0, checked = 0, step = timing ? 37 : 1;
            for (r = 0; r < (timing ? 1 : nreq) && bad < 4; r++)
                for (t = 0; t < qlen[r] && bad < 4; t++) {
                    int kend = sl[r] - (qlen[r] - 1 - t), qrow = qsl[r] + t, j, c;
                    for (h = (r * 7 + t) % step; h < H && bad < 4; h += step) {
                        double mx = -INFINITY, sum = 0, want_lse;
                        for (j = 0; j < kend; j++) {
                            const uint16_t *row = kvc + ((size_t)bt[r * maxb + j / BS] * BS + j % BS) * D;
                            double d = 0;
                            for (c = 0; c < L; c++) d += (double)get(q, et, ((size_t)qrow * H + h) * L + c) * get(row, et, (size_t)c);
                            for (c = 0; c < R; c++) d += (double)get(qpe, et, ((size_t)qrow * H + h) * R + c) * get(row, et, (size_t)(L + c));
                            sc[j] = d * scale;
                            if (sc[j] > mx) mx = sc[j];
                        }
                        for (c = 0; c < L; c++) acc[c] = 0;
                        for (j = 0; j < kend; j++) {
                            const uint16_t *row = kvc + ((size_t)bt[r * maxb + j / BS] * BS + j % BS) * D;
                            double w = exp(sc[j] - mx);
                            sum += w;
                            for (c = 0; c < L; c++) acc[c] += w * get(row, et, (size_t)c);
                        }
                        want_lse = kend ? mx + log(sum) : -INFINITY;
                        checked++;
                        {
                            float gl = lse[(size_t)qrow * H + h];
                            if (!(fabs(gl - want_lse) <= 2e-3 * (1 + fabs(want_lse))) && !(kend == 0 && isinf(gl) && gl < 0)) {
                                printf("FAIL mla %s [%s] H %d splits %d: req %d row %d head %d (keys %d): lse %g, want %g\n", mla_kernels[which].file, defs, H, splits, r, t,
                                       h, kend, gl, want_lse);
                                bad++;
                            }
                        }
                        for (c = 0; c < L && bad < 4; c++) {
                            double want = kend ? acc[c] / sum : 0.0;
                            float got = get(out, et, ((size_t)qrow * H + h) * L + c);
                            if (!(fabs(got - want) <= (dt == 1 ? 4e-3 : 2e-2) + 2e-2 * fabs(want))) {
                                printf("FAIL mla %s [%s] H %d splits %d: req %d row %d head %d col %d (keys %d): out %g, want %g\n", mla_kernels[which].file, defs, H,
                                       splits, r, t, h, c, kend, got, want);
                                bad++;
                            }
                        }
                    }
                }
            free(sc); free(acc);
            ok = ok && bad == 0 && checked > 0;
        }
        cu->cuMemFree(dq); cu->cuMemFree(dqpe); cu->cuMemFree(dkv); cu->cuMemFree(dout); cu->cuMemFree(dlse); cu->cuMemFree(dbt);
        cu->cuMemFree(dw); cu->cuMemFree(dnw); cu->cuMemFree(dm); cu->cuMemFree(dnm); cu->cuMemFree(dpo); cu->cuMemFree(dpl);
        free(qlen); free(sl); free(qsl); free(bt); free(work); free(merge); free(q); free(qpe); free(kvc); free(out); free(lse);
    }
    return ok;
}


/* MLA's prefill attention (mla_prefill_sm90.cu, variant v of mha_variants): random requests,
   each over a random chunk of its keys, in one launch or two (the second merged into the
   first's out/lse by LSE), against float64. With timing: one request of n tokens x 128 heads, causal, all keys; *us set. */
static int mha_case(int which, int v, int H, int nreq, int max_len, int timing, double *us) {
    int DN, R, DV, dt, r, t, h, nq = 0, nk = 0, bad = 0;
    module_entry *m;
    sscanf(mha_variants[v], "DN=%d ROPE=%d DV=%d DT=%d", &DN, &R, &DV, &dt);
    if (!(m = mla_module(mha_variants[v], which, 1))) return 0;
    {
        const int DQK = DN + R;
        attn_dtype et = dt == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        int *qlen = (int *)calloc((size_t)nreq, sizeof(int)), *ctx = (int *)calloc((size_t)nreq, sizeof(int));
        int *q0 = (int *)calloc((size_t)nreq, sizeof(int)), *k0 = (int *)calloc((size_t)nreq, sizeof(int));
        int *kp0 = (int *)calloc((size_t)nreq, sizeof(int)), *nks = (int *)calloc((size_t)nreq, sizeof(int)), k;
        attn__CUevent e0 = NULL, e1 = NULL;
        uint16_t *q, *kn, *kpe, *vv, *out;
        float *lse, scale = 1.0f / sqrtf((float)DQK);
        attn__CUdeviceptr dq, dkn, dkpe, dv, dout, dlse;
        attn__mla_prefill_params p;
        void *args[1];
        for (r = 0; r < nreq; r++) {
            qlen[r] = timing ? max_len : rnd_int(1, max_len);
            ctx[r] = timing ? 0 : rnd_int(0, max_len);
            q0[r] = nq; nq += qlen[r];
            k0[r] = nk; nk += ctx[r] + qlen[r];
            kp0[r] = timing ? 0 : rnd_int(0, ctx[r] + qlen[r] - 1); /* a chunk of the request's keys */
            nks[r] = timing ? ctx[r] + qlen[r] : rnd_int(1, ctx[r] + qlen[r] - kp0[r]);
        }
        q = (uint16_t *)malloc((size_t)nq * H * DQK * 2); kn = (uint16_t *)malloc((size_t)nk * H * DN * 2);
        kpe = (uint16_t *)malloc((size_t)nk * R * 2); vv = (uint16_t *)malloc((size_t)nk * H * DV * 2);
        out = (uint16_t *)malloc((size_t)nq * H * DV * 2); lse = (float *)malloc((size_t)nq * H * 4);
        fill_random(q, et, (size_t)nq * H * DQK, 1.0f); fill_random(kn, et, (size_t)nk * H * DN, 1.0f);
        fill_random(kpe, et, (size_t)nk * R, 1.0f); fill_random(vv, et, (size_t)nk * H * DV, 1.0f);
        memset(out, 0xff, (size_t)nq * H * DV * 2); memset(lse, 0xff, (size_t)nq * H * 4);
        dq = dupload(q, (size_t)nq * H * DQK * 2); dkn = dupload(kn, (size_t)nk * H * DN * 2);
        dkpe = dupload(kpe, (size_t)nk * R * 2); dv = dupload(vv, (size_t)nk * H * DV * 2);
        dout = dupload(out, (size_t)nq * H * DV * 2); dlse = dupload(lse, (size_t)nq * H * 4);
        memset(&p, 0, sizeof p);
        p.q = dq; p.q_pe = dq + (attn__CUdeviceptr)DN * 2; p.k_pe = dkpe; p.out = dout; p.lse = dlse;
        p.q_stride_token = p.q_pe_stride_token = (int64_t)H * DQK; p.q_stride_head = p.q_pe_stride_head = DQK;
        p.k_stride_token = (int64_t)H * DN; p.k_stride_head = DN;
        p.kpe_stride_token = R; p.v_stride_token = (int64_t)H * DV; p.v_stride_head = DV;
        p.out_stride_token = (int64_t)H * DV; p.out_stride_head = DV; p.lse_stride_token = H; p.lse_stride_head = 1;
        p.scale = scale;
        args[0] = &p;
        if (timing) { CU_CHECK(cu->cuEventCreate(&e0, 0)); CU_CHECK(cu->cuEventCreate(&e1, 0)); }
        /* one launch per request and chunk of its keys: most requests' keys in two chunks,
           the second merged into the first's out/lse (MERGE) */
        for (k = 0; k < (timing ? 11 : 1); k++) {
            if (timing && k == 1) CU_CHECK(cu->cuEventRecord(e0, NULL));
            for (r = 0; r < nreq; r++) {
                const int cut = timing || nks[r] < 2 || rnd_int(0, 3) == 0 ? nks[r] : rnd_int(1, nks[r] - 1);
                int c0;
                for (c0 = 0; c0 < nks[r]; c0 = c0 ? nks[r] : cut) {
                    const int c1 = c0 ? nks[r] : cut;
                    p.k_nope = dkn + (attn__CUdeviceptr)(k0[r] + kp0[r] + c0) * H * DN * 2;
                    p.k_pe = dkpe + (attn__CUdeviceptr)(k0[r] + kp0[r] + c0) * R * 2;
                    p.v = dv + (attn__CUdeviceptr)(k0[r] + kp0[r] + c0) * H * DV * 2;
                    p.q_row0 = q0[r]; p.nq = qlen[r]; p.pos0 = ctx[r]; p.key_pos0 = kp0[r] + c0; p.nkeys = c1 - c0;
                    p.flags = 1 | (c0 ? 2 : 0);
                    /* config: {threads, dynamic shared bytes, KV_TILE, rows per CTA, ...} */
                    CU_CHECK(cu->cuLaunchKernel(m->main, (unsigned)((qlen[r] + m->config.rows - 1) / m->config.rows), (unsigned)H, 1,
                                                (unsigned)m->config.threads, 1, 1,
                                                (unsigned)m->config.shared_bytes, NULL, args, NULL));
                }
            }
        }
        if (timing) {
            float ms = 0;
            CU_CHECK(cu->cuEventRecord(e1, NULL));
            CU_CHECK(cu->cuEventSynchronize(e1));
            CU_CHECK(cu->cuEventElapsedTime(&ms, e0, e1));
            *us = ms * 1e3 / 10;
        }
        CU_CHECK(cu->cuStreamSynchronize(NULL));
        CU_CHECK(download(out, dout, (size_t)nq * H * DV * 2));
        CU_CHECK(download(lse, dlse, (size_t)nq * H * 4));
        { /* float64 reference (timing: every 97th row of head 0 and 1) */
            double *sc = (double *)malloc((size_t)(nk + 1) * sizeof(double)), *acc = (double *)malloc((size_t)DV * sizeof(double));
            for (r = 0; r < nreq && bad < 4; r++)
                for (h = 0; h < (timing ? 2 : H) && bad < 4; h++)
                    for (t = 0; t < qlen[r] && bad < 4; t += timing ? 97 : 1) {
                        const int qr = q0[r] + t, pos = ctx[r] + t;
                        double mx = -INFINITY, sum = 0;
                        int j, c, seen = 0;
                        for (j = 0; j < nks[r]; j++) {
                            const int kr = k0[r] + kp0[r] + j;
                            double d = 0;
                            sc[j] = -INFINITY;
                            if (kp0[r] + j > pos) continue;
                            for (c = 0; c < DN; c++) d += (double)get(q, et, ((size_t)qr * H + h) * DQK + c) * get(kn, et, ((size_t)kr * H + h) * DN + c);
                            for (c = 0; c < R; c++) d += (double)get(q, et, ((size_t)qr * H + h) * DQK + DN + c) * get(kpe, et, (size_t)kr * R + c);
                            sc[j] = d * scale;
                            if (sc[j] > mx) mx = sc[j];
                            seen = 1;
                        }
                        for (c = 0; c < DV; c++) acc[c] = 0;
                        for (j = 0; seen && j < nks[r]; j++) {
                            double w;
                            if (sc[j] == -INFINITY) continue;
                            w = exp(sc[j] - mx);
                            sum += w;
                            for (c = 0; c < DV; c++) acc[c] += w * get(vv, et, ((size_t)(k0[r] + kp0[r] + j) * H + h) * DV + c);
                        }
                        {
                            const double want_lse = seen ? mx + log(sum) : -INFINITY;
                            const float gl = lse[(size_t)qr * H + h];
                            if (!(fabs(gl - want_lse) <= 2e-3 * (1 + fabs(want_lse))) && !(!seen && isinf(gl) && gl < 0)) {
                                printf("FAIL mha %s [%s]: req %d head %d row %d: lse %g, want %g\n", mla_kernels[which].file,
                                       mha_variants[v], r, h, t, gl, want_lse);
                                bad++;
                            }
                        }
                        for (c = 0; c < DV && bad < 4; c++) {
                            const double want = seen ? acc[c] / sum : 0.0;
                            const float got = get(out, et, ((size_t)qr * H + h) * DV + c);
                            if (!(fabs(got - want) <= (dt == 1 ? 4e-3 : 2e-2) + 2e-2 * fabs(want))) {
                                printf("FAIL mha %s [%s]: req %d head %d row %d col %d: out %g, want %g\n", mla_kernels[which].file,
                                       mha_variants[v], r, h, t, c, got, want);
                                bad++;
                            }
                        }
                    }
            free(sc); free(acc);
        }
        cu->cuMemFree(dq); cu->cuMemFree(dkn); cu->cuMemFree(dkpe); cu->cuMemFree(dv); cu->cuMemFree(dout); cu->cuMemFree(dlse);
        if (e0) { cu->cuEventDestroy(e0); cu->cuEventDestroy(e1); }
        free(qlen); free(ctx); free(q0); free(k0); free(kp0); free(nks); free(q); free(kn); free(kpe); free(vv);
        free(out); free(lse);
    }
    return bad == 0;
}

static void mla_tests(int cases, int bench) {
    int n;
    const int nv = MLA_NV + (arch == 90 ? MLA_NV_SM90 : 0); /* the wgmma kernel on compute capability 9.0 only */
    for (n = 0; n < cases; n++) {
        int v = mla_sm90_only ? MLA_NV + n % MLA_NV_SM90 : n % nv, Hs[] = {16, 128, 20, 40, 64},
            H = Hs[(n / (mla_sm90_only ? MLA_NV_SM90 : nv)) % 5], splits = n % 3 == 2 ? 1 + rnd_int(1, 4) : 1;
        double us;
        if (mla_case(v, H, rnd_int(1, 5), rnd_int(1, 1500), splits, 0, &us)) passed++;
        else failed++;
    }
    /* MLA's prefill attention: on mma.sync (CUDA_MLA's, any sm_80+) and on wgmma
       (compute capability 9.0) */
    for (n = 0; n < (mla_sm90_only ? 0 : cases); n++) {
        double us;
        const int which = n % 2 ? 3 : 2;
        if (which == 2 && arch != 90) continue;
        if (mha_case(which, n / 2 % 3, 1 + rnd_int(0, 5), rnd_int(1, 3), rnd_int(1, 400), 0, &us)) passed++;
        else failed++;
    }
    if (bench && mla_sm90_only && arch == 90) { /* the wgmma kernel (SPLIT_WAIT 1, 0) on issue 22's shapes */
        static const int shapes[][3] = {{128, 64, 4096}, {128, 128, 4096}, {128, 64, 16384}, {16, 64, 4096},
                                        {16, 128, 16384}, {128, 1, 16384}, {128, 16, 4096}};
        int k, ws;
        for (k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++)
            for (ws = 0; ws < 3; ws++) { /* the default, SPLIT_WAIT=0, EVICT_FIRST=0 */
                const int H = shapes[k][0], B = shapes[k][1], C = shapes[k][2], v = MLA_NV + (ws ? 4 + ws : 0);
                int items = B * ((H + 63) / 64), splits = 1;
                double us = 0;
                while (items * splits * 2 <= 2 * num_sms && C / (splits * 2) >= 256 && splits < 64) splits *= 2;
                if (!mla_case(v, H, B, C, splits, 1, &us)) { failed++; continue; }
                passed++;
                printf("  mla %-8s bench H %3d batch %3d ctx %5d: splits %2d  %8.1f us  %6.2f TB/s  %6.1f TFLOP/s\n",
                       ws == 2 ? "evict0" : ws ? "wait0" : "wgmma", H, B, C, splits, us, (double)B * C * 576 * 2 / (us * 1e-6) / 1e12,
                       2.0 * B * H * C * (576 + 512) / (us * 1e-6) / 1e12);
            }
        return;
    }
    if (bench) { /* issue 9's prefill shape: 128 heads, one sequence of 4096, causal */
        int which;
        for (which = 3; which >= (arch == 90 ? 2 : 3); which--) {
            double us = 0;
            if (mha_case(which, 0, 128, 1, 4096, 1, &us)) {
                passed++;
                printf("  mha %s bench: 128 heads, 1 x 4096 causal, qk 192 / v 128: %8.1f us  %6.1f TFLOP/s\n",
                       which == 2 ? "wgmma" : "mma.sync", us, 2.0 * 128 * (192 + 128) * 4096.0 * 4097 / 2 / (us * 1e-6) / 1e12);
            } else {
                failed++;
            }
        }
    }
    if (bench) { /* a few of issue 9's decode shapes (20 launches back to back over one batch:
                    the larger ones exceed the L2; the first request checked against float64) */
        static const int shapes[][3] = {{16, 64, 4096}, {128, 64, 4096}, {128, 1, 16384}, {16, 1, 16384}, {128, 16, 4096},
                                        {16, 128, 16384}};
        int si;
        for (si = 0; si < (arch == 90 ? 10 : 5); si++) { /* mma.sync, then the wgmma kernel */
            const int k = si % 5;
            int H = shapes[k][0], B = shapes[k][1], C = shapes[k][2];
            int v = si >= 5 ? MLA_NV : H == 16 ? 0 : 1;
            int rows = v == 0 ? 16 : 64, items = B * ((H + rows - 1) / rows), splits = 1;
            double us = 0;
            while (items * splits * 2 <= 2 * num_sms && C / (splits * 2) >= 256 && splits < 32) splits *= 2;
            if (!mla_case(v, H, B, C, splits, 1, &us)) { failed++; continue; }
            passed++;
            printf("  mla%s bench H %3d batch %3d ctx %5d: splits %2d  %8.1f us  %6.2f TB/s  %6.1f TFLOP/s\n",
                   v >= MLA_NV ? " wgmma" : "", H, B, C, splits, us,
                   (double)B * C * 576 * 2 / (us * 1e-6) / 1e12, 2.0 * B * H * C * (576 + 512) / (us * 1e-6) / 1e12);
        }
    }
}

int main(int argc, char **argv) {
    int i, do_bench = 0, cases = 60, only_bench = 0;
    attn_context_desc cd;
    double t0 = now_s();
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench")) do_bench = 1;
        else if (!strcmp(argv[i], "--bench-only")) do_bench = only_bench = 1;
        else if (!strcmp(argv[i], "--decode-bench")) do_bench = only_bench = decode_only = 1;
        else if (!strcmp(argv[i], "--prefill-bench")) do_bench = only_bench = prefill_only = 1;
        else if (!strcmp(argv[i], "--contiguous")) contiguous = 1;
        else if (!strcmp(argv[i], "--sinks")) bench_sinks = 1;
        else if (!strcmp(argv[i], "--defines") && i + 1 < argc) extra_defines = argv[++i];
        else if (!strcmp(argv[i], "--cases") && i + 1 < argc) cases = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefill-tt") && i + 1 < argc) prefill_tt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) rng_state = strtoull(argv[++i], NULL, 0) | 1;
        else if (!strcmp(argv[i], "--sm90-prefill")) sm90_prefill = 1;
        else if (!strcmp(argv[i], "--sm90-source") && i + 1 < argc && strchr(argv[i + 1], ':')) {
            char *colon = strchr(argv[++i], ':'); /* FILE:ENTRY, argv kept alive for main's run */
            *colon = '\0';
            sm90_kernel.file = argv[i];
            sm90_kernel.fn = colon + 1;
            sm90_kernel.embedded = 0;
            sm90_prefill = 1;
        }
        else if (!strcmp(argv[i], "--mla")) mla_mode = 1;
        else if (!strcmp(argv[i], "--mla-sm90")) mla_mode = mla_sm90_only = 1;
        else if (!strcmp(argv[i], "--mla-shape") && i + 1 < argc &&
                 sscanf(argv[++i], "%d,%d,%d,%d,%d", &mla_shape[0], &mla_shape[1], &mla_shape[2], &mla_shape[3],
                        &mla_shape[4]) >= 4)
            mla_mode = 1;
        else {
            fprintf(stderr, "usage: cuda_kernels [--cases N] [--seed S] [--bench | --bench-only | --decode-bench | --prefill-bench] [--contiguous] [--sinks] [--defines \"KV_STAGES=3 ...\"]\n"
                            "                    [--prefill-tt N] [--sm90-prefill] [--sm90-source FILE:ENTRY] [--mla] [--mla-sm90] [--mla-shape H,B,CTX,SPLITS[,V]]\n");
            return 2;
        }
    }
    memset(&cd, 0, sizeof cd);
    cd.log = quiet;
    if (attn_context_create(&cd, &context) != ATTN_OK) return 2;
    if (sm90_prefill) sm90_compile_report(); /* no GPU needed */
    if (mla_mode) mla_compile_report();
    if (!cuda_init()) {
        printf("  SKIP cuda kernels%s: %s\n", sm90_prefill ? " (and the sm90-prefill GPU run)" : mla_mode ? " (and the mla GPU run)" : "",
               skip_reason);
        printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped + 1);
        attn_context_destroy(context);
        return failed ? 1 : 0;
    }
    printf("device sm_%d, %d SMs\n", arch, num_sms);
    if (sm90_prefill && arch != 90) {
        printf("  SKIP sm90-prefill GPU run: the device is sm_%d; sm_90a code runs on compute capability 9.0 only\n", arch);
        skipped++;
        sm90_prefill = 0; /* the rest runs as without --sm90-prefill */
    }
    if (mla_mode && mla_shape[0] > 0) { /* one decode shape on the wgmma kernel (profilers) */
        double us = 0;
        const int v = MLA_NV + (mla_shape[4] >= 0 && mla_shape[4] < MLA_NV_SM90 ? mla_shape[4] : 0);
        if (arch == 90 && mla_case(v, mla_shape[0], mla_shape[1], mla_shape[2], mla_shape[3], 1, &us)) {
            passed++;
            printf("  mla wgmma [%s] H %d batch %d ctx %d splits %d: %.1f us (kernel + merge, 20 launches)\n",
                   mla_variants[v], mla_shape[0], mla_shape[1], mla_shape[2], mla_shape[3], us);
        } else if (arch != 90) {
            printf("  SKIP --mla-shape: the wgmma kernel runs on compute capability 9.0 only\n");
            skipped++;
        } else {
            failed++;
        }
        do_bench = 0;
    } else if (mla_mode) { /* the MLA kernels only: random decode batches (and with --bench their timings) */
        mla_tests(cases, do_bench);
        printf("mla: %d passed, %d failed (%.1f s)\n", passed, failed, now_s() - t0);
        do_bench = 0;
    } else if (sm90_prefill && !only_bench) { /* the attention cases only, each within the sm_90a kernel's scope */
        test_attention(cases);
        printf("sm90-prefill attention: %d of %d cases passed on the sm_90 kernel; %d passed, %d failed (%.1f s)\n",
               sm90_passed, cases, passed, failed, now_s() - t0);
    } else if (!only_bench) {
        test_merge(cases);
        printf("merge: %d passed, %d failed (%.1f s)\n", passed, failed, now_s() - t0);
        test_cache_write(cases / 2);
        printf("cache writes: %d passed, %d failed (%.1f s)\n", passed, failed, now_s() - t0);
        test_attention(cases);
        printf("attention: %d passed, %d failed (%.1f s, %d modules)\n", passed, failed, now_s() - t0, num_modules);
    }
    if (do_bench) bench(extra_defines);
    attn__cuda_leave(context);
    attn_context_destroy(context);
    (void)failures;
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
