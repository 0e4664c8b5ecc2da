/* hopper_check - the checks of kernels/hopper.cuh (TMA tile copies, mbarrier pipelines,
   setmaxnreg) and of attn.h's tensor-map encoder (attn__tma_encode).

   A standalone C99 program on the library's NVRTC and CUDA driver tables (dlopen; no CUDA
   header). With no GPU:
     - tests/hopper_probe.cu compiles for sm_90 and for sm_90a (where setmaxnreg exists)
       with no warning, and ptxas reports every probe kernel with no spill and no stack;
     - hopper.cuh refuses sm_80 (its #error names sm_90);
     - the encoder refuses to run without TMA and says why (the platform's reason).
   On a device of compute capability 9.0 (the sm_90a cubin runs there only):
     - the encoder's argument checks name the argument (swizzle, alignment, box width, rank)
       before the driver is called;
     - probe_tma_rows and probe_tma_rows_ws copy a random 16-bit matrix whose row count is
       not a multiple of the box through a 3-stage TMA pipeline (rows past the end must
       arrive as zero), probe_tma_paged gathers the K and V rows of every KV head from a
       paged cache by a shuffled block table through a 5-D map; each output is compared
       bit for bit with the input (outputs are poisoned first; a barrier that never
       completes is reported by the probe, which gives up after 2 s).

   Usage: hopper_check [--probe FILE] [--kernels DIR] [-v]   (from the repository root by
   default). Ends with "N passed, N failed, N skipped"; exit 1 when something failed. */
#define _POSIX_C_SOURCE 200809L
#define ATTN_IMPLEMENTATION
#include "attn.h"
#include "tools/tool_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static attn_context *context;
static const attn__nvrtc *nv;
static const attn__cuda_driver *cu;
static int passed, failed, skipped, verbose, cuda_broken;

static void pass(const char *name, const char *detail) { printf("  PASS %s: %s\n", name, detail); passed++; }
static void fail(const char *name, const char *detail) { printf("  FAIL %s: %s\n", name, detail); failed++; }
static void skip(const char *name, const char *reason) { printf("  SKIP %s: %s\n", name, reason); skipped++; }

static const char *const probe_names[] = {"probe_tma_rows", "probe_tma_paged", "probe_tma_rows_ws"};
#define NUM_PROBES 3
#define STAGES 3
#define BLOCK 16

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int cu_ok(attn__CUresult r, const char *what, char *detail, size_t size) {
    const char *s = "?";
    if (!r) return 1;
    cu->cuGetErrorString(r, &s);
    snprintf(detail, size, "%s failed: CUDA error %d (%s)", what, r, s);
    cuda_broken = 1;
    return 0;
}

/* ---- the encoder's refusals: each names what was wrong, before the driver is called ---- */
static void check_encoder_refusals(void) {
    static uint16_t host[64];
    attn__tma_map map;
    uint64_t dims[2] = {128, 64}, strides[1] = {256};
    uint32_t box[2] = {64, 64};
    struct { const char *what, *expect; int swizzle, rank; const void *base; uint32_t box0; attn_dtype dt; } rows[] = {
        {"swizzle 96", "swizzle 96 (allowed: 0, 32, 64, 128 bytes)", 96, 2, NULL, 64, ATTN_DTYPE_BF16},
        {"rank 6", "rank 6 (allowed: 1..5)", 128, 6, NULL, 64, ATTN_DTYPE_BF16},
        {"base off by 2 bytes", "is not 16-byte aligned", 128, 2, (const char *)host + 2, 64, ATTN_DTYPE_BF16},
        {"box wider than the swizzle", "box[0] 128 elements of 2 bytes", 128, 2, NULL, 128, ATTN_DTYPE_BF16},
        {"box of 12 bytes", "box[0] 6 elements of 2 bytes", 0, 2, NULL, 6, ATTN_DTYPE_BF16},
        {"int64 elements", "dtype int64 (allowed: f16, bf16, f32, fp8_e4m3, fp8_e5m2, int8)", 128, 2, NULL, 64,
         ATTN_DTYPE_INT64},
    };
    size_t i;
    for (i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char name[96], detail[1200];
        attn_status st;
        box[0] = rows[i].box0;
        st = attn__tma_encode(context, &map, rows[i].dt, rows[i].rank, rows[i].base ? rows[i].base : (const void *)host,
                              dims, strides, box, rows[i].swizzle);
        snprintf(name, sizeof name, "encoder refuses %s", rows[i].what);
        snprintf(detail, sizeof detail, "%s: %s", attn_status_string(st), attn_context_last_error(context));
        if (st == ATTN_ERROR_INVALID_VALUE && strstr(attn_context_last_error(context), rows[i].expect)) pass(name, detail);
        else fail(name, detail);
    }
}

/* ---- the probes ---- */
static void run_rows(attn__CUmodule module, const char *fname, int threads) {
    const int rows = 200, cols = 512; /* 200: the last 64-row box is 8 rows in, 56 past the end */
    size_t n = (size_t)rows * cols, i;
    uint16_t *x = (uint16_t *)malloc(n * 2), *y = (uint16_t *)malloc(n * 2);
    attn__CUdeviceptr d_x = 0, d_y = 0, d_status = 0;
    attn__CUfunction f = NULL;
    attn__tma_map map;
    uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows}, strides[1] = {(uint64_t)cols * 2};
    uint32_t box[2] = {64, 64};
    int status = 0, bad = 0, shown = 0, smem = STAGES * 8192 + 64 + 1024;
    void *args[5];
    char detail[512] = "";
    for (i = 0; i < n; i++) { x[i] = (uint16_t)(rnd() >> 48); y[i] = 0xffff; }
    if (!cu_ok(cu->cuModuleGetFunction(&f, module, fname), "cuModuleGetFunction", detail, sizeof detail) ||
        !cu_ok(cu->cuFuncSetAttribute(f, ATTN__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), "cuFuncSetAttribute",
               detail, sizeof detail) ||
        !cu_ok(cu->cuMemAlloc(&d_x, n * 2), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemAlloc(&d_y, n * 2), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemAlloc(&d_status, 4), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_x, x, n * 2, NULL), "cuMemcpyHtoD", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_y, y, n * 2, NULL), "cuMemcpyHtoD", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_status, &status, 4, NULL), "cuMemcpyHtoD", detail, sizeof detail))
        goto done;
    if (attn__tma_encode(context, &map, ATTN_DTYPE_BF16, 2, (const void *)(uintptr_t)d_x, dims, strides, box, 128) !=
        ATTN_OK) {
        snprintf(detail, sizeof detail, "%s", attn_context_last_error(context));
        bad = 1;
        goto done;
    }
    {
        int r = rows, c = cols;
        args[0] = &map; args[1] = &d_y; args[2] = &r; args[3] = &c; args[4] = &d_status;
        if (!cu_ok(cu->cuLaunchKernel(f, (unsigned)((rows + 63) / 64), 1, 1, (unsigned)threads, 1, 1, (unsigned)smem, NULL,
                                      args, NULL), "cuLaunchKernel", detail, sizeof detail) ||
            !cu_ok(cu->cuStreamSynchronize(NULL), "the kernel", detail, sizeof detail) ||
            !cu_ok(cu->cuMemcpyDtoHAsync(y, d_y, n * 2, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
            !cu_ok(cu->cuMemcpyDtoHAsync(&status, d_status, 4, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
            !cu_ok(cu->cuStreamSynchronize(NULL), "cuStreamSynchronize", detail, sizeof detail))
            goto done;
    }
    for (i = 0; i < n; i++)
        if (y[i] != x[i]) {
            bad++;
            if (shown++ < 5) printf("    %s [%d][%d]: 0x%04x, expected 0x%04x\n", fname, (int)(i / cols), (int)(i % cols), y[i], x[i]);
        }
    snprintf(detail, sizeof detail, "%s%d x %d bf16 through %d stages of 64 x 64 (128B swizzle), %d CTAs; status %d%s",
             bad ? "elements differ (first ones above); " : "", rows, cols, STAGES, (rows + 63) / 64, status,
             status == 2 ? " (a barrier never completed)" : status == 3 ? " (rows past the end did not read as zero)" : "");
done:
    if (cuda_broken || bad || status) fail(fname, detail);
    else pass(fname, detail);
    if (d_x) cu->cuMemFree(d_x);
    if (d_y) cu->cuMemFree(d_y);
    if (d_status) cu->cuMemFree(d_status);
    free(x);
    free(y);
}

static void run_paged(attn__CUmodule module) {
    const int heads = 4, num_blocks = 40, nblk = 23, D = 128;
    size_t cache_n = (size_t)num_blocks * 2 * BLOCK * heads * D, out_n = (size_t)heads * nblk * BLOCK * D, i;
    uint16_t *cache = (uint16_t *)malloc(cache_n * 2), *ok = (uint16_t *)malloc(out_n * 2), *ov = (uint16_t *)malloc(out_n * 2);
    int bt[40], status = 0, bad = 0, shown = 0, smem = STAGES * 4 * BLOCK * 128 + 64 + 1024, h, t, r, d;
    attn__CUdeviceptr d_cache = 0, d_bt = 0, d_k = 0, d_v = 0, d_status = 0;
    attn__CUfunction f = NULL;
    attn__tma_map map;
    uint64_t dims[5] = {(uint64_t)D, (uint64_t)heads, BLOCK, 2, (uint64_t)num_blocks};
    uint64_t strides[4] = {(uint64_t)D * 2, (uint64_t)heads * D * 2, (uint64_t)BLOCK * heads * D * 2,
                           (uint64_t)2 * BLOCK * heads * D * 2};
    uint32_t box[5] = {64, 1, BLOCK, 1, 1};
    void *args[6];
    char detail[512] = "";
    for (i = 0; i < cache_n; i++) cache[i] = (uint16_t)(rnd() >> 48);
    for (i = 0; i < out_n; i++) ok[i] = ov[i] = 0xffff;
    for (t = 0; t < num_blocks; t++) bt[t] = t;
    for (t = num_blocks - 1; t > 0; t--) { /* shuffled: any block, in any order */
        int j = (int)(rnd() % (uint64_t)(t + 1)), tmp = bt[t];
        bt[t] = bt[j];
        bt[j] = tmp;
    }
    if (!cu_ok(cu->cuModuleGetFunction(&f, module, "probe_tma_paged"), "cuModuleGetFunction", detail, sizeof detail) ||
        !cu_ok(cu->cuFuncSetAttribute(f, ATTN__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), "cuFuncSetAttribute",
               detail, sizeof detail) ||
        !cu_ok(cu->cuMemAlloc(&d_cache, cache_n * 2), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemAlloc(&d_bt, sizeof bt), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemAlloc(&d_k, out_n * 2), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemAlloc(&d_v, out_n * 2), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemAlloc(&d_status, 4), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_cache, cache, cache_n * 2, NULL), "cuMemcpyHtoD", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_bt, bt, sizeof bt, NULL), "cuMemcpyHtoD", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_k, ok, out_n * 2, NULL), "cuMemcpyHtoD", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_v, ov, out_n * 2, NULL), "cuMemcpyHtoD", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_status, &status, 4, NULL), "cuMemcpyHtoD", detail, sizeof detail))
        goto done;
    if (attn__tma_encode(context, &map, ATTN_DTYPE_F16, 5, (const void *)(uintptr_t)d_cache, dims, strides, box, 128) !=
        ATTN_OK) {
        snprintf(detail, sizeof detail, "%s", attn_context_last_error(context));
        bad = 1;
        goto done;
    }
    {
        int n = nblk;
        args[0] = &map; args[1] = &d_bt; args[2] = &n; args[3] = &d_k; args[4] = &d_v; args[5] = &d_status;
        if (!cu_ok(cu->cuLaunchKernel(f, (unsigned)heads, 1, 1, 160, 1, 1, (unsigned)smem, NULL, args, NULL),
                   "cuLaunchKernel", detail, sizeof detail) ||
            !cu_ok(cu->cuStreamSynchronize(NULL), "the kernel", detail, sizeof detail) ||
            !cu_ok(cu->cuMemcpyDtoHAsync(ok, d_k, out_n * 2, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
            !cu_ok(cu->cuMemcpyDtoHAsync(ov, d_v, out_n * 2, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
            !cu_ok(cu->cuMemcpyDtoHAsync(&status, d_status, 4, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
            !cu_ok(cu->cuStreamSynchronize(NULL), "cuStreamSynchronize", detail, sizeof detail))
            goto done;
    }
    for (h = 0; h < heads; h++)
        for (t = 0; t < nblk; t++)
            for (r = 0; r < BLOCK; r++)
                for (d = 0; d < D; d++) {
                    size_t o = (((size_t)h * nblk + t) * BLOCK + r) * D + d;
                    size_t ck = ((((size_t)bt[t] * 2 + 0) * BLOCK + r) * heads + h) * D + d;
                    size_t cv = ((((size_t)bt[t] * 2 + 1) * BLOCK + r) * heads + h) * D + d;
                    if (ok[o] != cache[ck] || ov[o] != cache[cv]) {
                        bad++;
                        if (shown++ < 5)
                            printf("    probe_tma_paged head %d block #%d (%d) row %d col %d: k 0x%04x v 0x%04x, expected "
                                   "0x%04x 0x%04x\n", h, t, bt[t], r, d, ok[o], ov[o], cache[ck], cache[cv]);
                    }
                }
    snprintf(detail, sizeof detail, "%s%d heads x %d shuffled blocks of %d rows, K and V, 5-D map (128B swizzle); status %d%s",
             bad ? "elements differ (first ones above); " : "", heads, nblk, BLOCK, status,
             status == 2 ? " (a barrier never completed)" : "");
done:
    if (cuda_broken || bad || status) fail("probe_tma_paged", detail);
    else pass("probe_tma_paged", detail);
    if (d_cache) cu->cuMemFree(d_cache);
    if (d_bt) cu->cuMemFree(d_bt);
    if (d_k) cu->cuMemFree(d_k);
    if (d_v) cu->cuMemFree(d_v);
    if (d_status) cu->cuMemFree(d_status);
    free(cache);
    free(ok);
    free(ov);
}

/* compile for `arch`, report, and check ptxas's figures for the probes it should hold */
static void compile_and_report(attn_tool_compiled *prog, const char *src, int nh, const char *const *hdr_text,
                               const char *const *hdr_name, const char *arch, int nprobes) {
    char name[96], detail[256];
    int i;
    attn_tool_compile(nv, prog, src, "hopper_probe.cu", nh, hdr_text, hdr_name, arch, NULL);
    snprintf(name, sizeof name, "compile %s", arch);
    if (verbose && prog->log) printf("%s\n", prog->log);
    if (!prog->ok) {
        printf("%s\n", prog->log ? prog->log : "(no log)");
        fail(name, "NVRTC could not compile the probes (log above)");
        return;
    }
    if (attn_tool_print_warnings(prog->log) > 0) fail(name, "the compile has warnings (above)");
    else {
        snprintf(detail, sizeof detail, "%zu-byte cubin, no warnings", prog->cubin_size);
        pass(name, detail);
    }
    for (i = 0; i < nprobes; i++) {
        attn_tool_ptxas e = attn_tool_ptxas_for(prog->log, probe_names[i]);
        snprintf(name, sizeof name, "ptxas %s %s", arch, probe_names[i]);
        snprintf(detail, sizeof detail, "%d registers, %d/%d bytes spilled, %d bytes stack", e.regs, e.spill_st, e.spill_ld,
                 e.stack);
        if (!e.found || !e.regs) fail(name, "not in ptxas's report");
        else if (e.spill_st || e.spill_ld || e.stack) fail(name, detail);
        else pass(name, detail);
    }
}

int main(int argc, char **argv) {
    const char *probe_path = "tests/hopper_probe.cu", *kernel_dir = "kernels";
    const char *hdr_name[2] = {"attn_common.cuh", "hopper.cuh"}, *hdr_text[2];
    char *texts[3] = {NULL, NULL, NULL}, path[1024], gpu_reason[600] = "";
    attn_tool_compiled p90, p90a;
    int i, arch = 0;
    memset(&p90, 0, sizeof p90);
    memset(&p90a, 0, sizeof p90a);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--probe") && i + 1 < argc) probe_path = argv[++i];
        else if (!strcmp(argv[i], "--kernels") && i + 1 < argc) kernel_dir = argv[++i];
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else {
            fprintf(stderr, "usage: hopper_check [--probe FILE] [--kernels DIR] [-v]\n");
            return 2;
        }
    }
    if (attn_tool_context_create(&context) != ATTN_OK) {
        printf("hopper_check: %s\n", attn_context_last_error(NULL));
        return 2;
    }
    nv = context->nvrtc;
    cu = context->cuda;
    if (!context->platform.cuda_tma) { /* no GPU here: the encoder says why it cannot run */
        attn__tma_map map;
        uint64_t dims[1] = {64};
        uint32_t box[1] = {64};
        static uint16_t host[64];
        attn_status st = attn__tma_encode(context, &map, ATTN_DTYPE_BF16, 1, host, dims, NULL, box, 0);
        char detail[1200];
        snprintf(detail, sizeof detail, "%s: %s", attn_status_string(st), attn_context_last_error(context));
        if (st == ATTN_ERROR_PLATFORM && strstr(attn_context_last_error(context), "no TMA on this platform") &&
            strstr(attn_context_last_error(context), context->platform.cuda_tma_reason))
            pass("encoder refuses without TMA", detail);
        else fail("encoder refuses without TMA", detail);
    }
    if (!nv->library) {
        printf("hopper_check: %s\n", context->platform.nvrtc_reason);
        skip("compile sm_90", context->platform.nvrtc_reason);
        skip("compile sm_90a", context->platform.nvrtc_reason);
        goto end;
    }
    texts[0] = attn_tool_read_file(probe_path);
    for (i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", kernel_dir, hdr_name[i]);
        texts[i + 1] = attn_tool_read_file(path);
        hdr_text[i] = texts[i + 1];
        if (!texts[i + 1]) { printf("hopper_check: cannot read %s (run from the repository root)\n", path); return 2; }
    }
    if (!texts[0]) { printf("hopper_check: cannot read %s (run from the repository root)\n", probe_path); return 2; }
    printf("hopper_check: NVRTC %d.%d; %s with %s/{attn_common,hopper}.cuh\n", nv->major, nv->minor, probe_path, kernel_dir);

    /* ---- no GPU needed ---- */
    compile_and_report(&p90, texts[0], 2, hdr_text, hdr_name, "sm_90", 2);     /* no setmaxnreg probe on plain sm_90 */
    compile_and_report(&p90a, texts[0], 2, hdr_text, hdr_name, "sm_90a", 3);
    {
        char detail[256];
        if (attn_tool_guard(nv, 2, hdr_text, hdr_name, "hopper.cuh", "sm_80", "sm_90", detail, sizeof detail))
            pass("guard: hopper.cuh refuses sm_80", detail);
        else fail("guard: hopper.cuh refuses sm_80", detail);
    }

    /* ---- the GPU: compute capability 9.0 ---- */
    if (context->platform.kind != ATTN_PLATFORM_CUDA)
        snprintf(gpu_reason, sizeof gpu_reason, "%s", context->platform.cuda_reason);
    else if ((arch = context->platform.cuda_capability_major * 10 + context->platform.cuda_capability_minor) != 90)
        snprintf(gpu_reason, sizeof gpu_reason, "the device is sm_%d; the sm_90a probes run on compute capability 9.0 only",
                 arch);
    else if (!context->platform.cuda_tma)
        snprintf(gpu_reason, sizeof gpu_reason, "no TMA: %s", context->platform.cuda_tma_reason);
    else if (!p90a.ok)
        snprintf(gpu_reason, sizeof gpu_reason, "the probes did not compile");
    else if (attn__cuda_enter(context, "hopper_check") != ATTN_OK)
        snprintf(gpu_reason, sizeof gpu_reason, "%s", attn_context_last_error(context));
    if (gpu_reason[0]) {
        skip("encoder refusals", gpu_reason);
        for (i = 0; i < NUM_PROBES; i++) skip(probe_names[i], gpu_reason);
    } else {
        attn__CUmodule module = NULL;
        attn__CUresult rc = cu->cuModuleLoadData(&module, p90a.cubin);
        char detail[256];
        check_encoder_refusals();
        if (rc) {
            snprintf(detail, sizeof detail, "cuModuleLoadData failed: CUDA error %d", rc);
            for (i = 0; i < NUM_PROBES; i++) fail(probe_names[i], detail);
        } else {
            run_rows(module, "probe_tma_rows", 160);
            if (cuda_broken) skip("probe_tma_paged", "an earlier CUDA error left the context unusable");
            else run_paged(module);
            if (cuda_broken) skip("probe_tma_rows_ws", "an earlier CUDA error left the context unusable");
            else run_rows(module, "probe_tma_rows_ws", 256);
            if (!cuda_broken) cu->cuModuleUnload(module);
        }
        attn__cuda_leave(context);
    }

end:
    free(p90.log); free(p90.cubin);
    free(p90a.log); free(p90a.cubin);
    for (i = 0; i < 3; i++) free(texts[i]);
    attn_context_destroy(context);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
