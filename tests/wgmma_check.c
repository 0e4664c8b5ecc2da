/* wgmma_check - the checks of kernels/wgmma.cuh (Hopper wgmma.mma_async, sm_90a).

   A standalone C99 program on the library's NVRTC and CUDA driver tables (dlopen; no CUDA
   header). It compiles tests/wgmma_probe.cu, with kernels/attn_common.cuh and
   kernels/wgmma.cuh handed to NVRTC as named headers (as the library does), for sm_90a
   with --ptxas-options=-v, and checks, with no GPU:
     - the program compiles with no warning, and ptxas reports every probe kernel with no
       spill (its registers and shared memory are printed);
     - wgmma.cuh refuses to compile for plain sm_90 (its #error names sm_90a).
   On a device of compute capability 9.0 (an sm_90a cubin runs there only) it then runs
   every probe on random inputs (fixed seed, values in +-[1/64, 1], never zero, rounded to
   the 16-bit type) and compares with a float64 CPU reference of the rounded inputs; the
   outputs are filled with NaN before each launch, so an element the kernel did not write
   fails. Without NVRTC every test is a skip; without such a device the GPU tests are.

   Usage: wgmma_check [--probe FILE] [--kernels DIR] [--seed S] [-v]   (from the repository
   root by default: tests/wgmma_probe.cu and kernels/). Ends with
   "N passed, N failed, N skipped"; exit 1 when something failed, else 0. */
#define _POSIX_C_SOURCE 200809L
#define ATTN_IMPLEMENTATION
#include "attn.h"
#include "tools/tool_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static attn_context *context;
static const attn__nvrtc *nv;        /* context->nvrtc */
static const attn__cuda_driver *cu;  /* context->cuda */
static int passed, failed, skipped, verbose;

static void pass(const char *name, const char *detail) {
    printf("  PASS %s: %s\n", name, detail);
    passed++;
}
static void fail(const char *name, const char *detail) {
    printf("  FAIL %s: %s\n", name, detail);
    failed++;
}
static void skip(const char *name, const char *reason) {
    printf("  SKIP %s: %s\n", name, reason);
    skipped++;
}

/* ---- the probes: name, what it computes, the dynamic shared memory it asks for ---- */
enum probe_kind { PROBE_QK, PROBE_PV_RS, PROBE_PV_SS, PROBE_ATTN };
typedef struct probe {
    const char *name;
    enum probe_kind kind;
    int n;          /* QK: keys (N of the MMA) */
    attn_dtype dt;  /* the 16-bit input type */
    int smem;       /* tile bytes + 1024 to align the base */
} probe;
static const probe probes[] = {
    {"probe_qk_n64_bf16", PROBE_QK, 64, ATTN_DTYPE_BF16, 64 * 256 + 64 * 256 + 1024},
    {"probe_qk_n128_bf16", PROBE_QK, 128, ATTN_DTYPE_BF16, 64 * 256 + 128 * 256 + 1024},
    {"probe_qk_n64_f16", PROBE_QK, 64, ATTN_DTYPE_F16, 64 * 256 + 64 * 256 + 1024},
    {"probe_pv_rs", PROBE_PV_RS, 0, ATTN_DTYPE_BF16, 64 * 256 + 1024},
    {"probe_pv_ss", PROBE_PV_SS, 0, ATTN_DTYPE_BF16, 64 * 128 + 64 * 256 + 1024},
    {"probe_attn", PROBE_ATTN, 0, ATTN_DTYPE_BF16, 3 * 64 * 256 + 1024},
};
#define NUM_PROBES ((int)(sizeof probes / sizeof probes[0]))

/* ---- compiling: attn_tool_compile (tools/tool_support.h) ---- */
typedef attn_tool_compiled compiled;

/* ---- inputs and the reference ---- */
static uint64_t rng_state = 0x5eed5eed12345679ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
/* A value in +-[1/64, 1] rounded to dt (never zero), stored as 16 bits; *value gets it back. */
static uint16_t random_element(attn_dtype dt, double *value) {
    float x = (float)(1.0 / 64 + (1.0 - 1.0 / 64) * (double)(rnd() >> 11) * (1.0 / 9007199254740992.0));
    uint16_t h;
    if (rnd() & 1) x = -x;
    h = dt == ATTN_DTYPE_F16 ? attn_f32_to_f16(x) : attn_f32_to_bf16(x);
    *value = dt == ATTN_DTYPE_F16 ? attn_f16_to_f32(h) : attn_bf16_to_f32(h);
    return h;
}
static void random_matrix(uint16_t *h, double *v, size_t n, attn_dtype dt) {
    size_t i;
    for (i = 0; i < n; i++) h[i] = random_element(dt, &v[i]);
}

/* c[m][n] = sum_k a[m][k] * (b_kn ? b[k][n] : b[n][k]) */
static void reference_matmul(double *c, const double *a, const double *b, int M, int N, int K, int b_kn) {
    int m, n, k;
    for (m = 0; m < M; m++)
        for (n = 0; n < N; n++) {
            double s = 0;
            for (k = 0; k < K; k++) s += a[m * K + k] * (b_kn ? b[k * N + n] : b[n * K + k]);
            c[m * N + n] = s;
        }
}

/* ---- running one probe ---- */
static int cuda_broken; /* a CUDA error leaves the context unusable: the rest skip */

static int cu_ok(attn__CUresult r, const char *what, char *detail, size_t size) {
    const char *s = "?";
    if (!r) return 1;
    cu->cuGetErrorString(r, &s);
    snprintf(detail, size, "%s failed: CUDA error %d (%s)", what, r, s);
    cuda_broken = 1;
    return 0;
}

static void run_probe(const probe *p, attn__CUmodule module) {
    enum { MAX_IN = 3 };
    int num_in = p->kind == PROBE_ATTN ? 3 : 2, rows_out = 64, cols_out = p->kind == PROBE_QK ? p->n : 128;
    size_t in_elems[MAX_IN], out_elems = (size_t)rows_out * cols_out, i;
    uint16_t *h_in[MAX_IN] = {NULL, NULL, NULL};
    double *v_in[MAX_IN] = {NULL, NULL, NULL}, *ref = (double *)calloc(out_elems, sizeof(double));
    float *out = (float *)malloc(out_elems * sizeof(float));
    attn__CUdeviceptr d_in[MAX_IN] = {0, 0, 0}, d_out = 0, d_status = 0;
    attn__CUfunction f = NULL;
    void *args[5];
    int status = 0, bad = 0, shown = 0, k;
    double max_diff = 0, max_ref = 0, atol = 1e-3, rtol = 1e-2;
    char detail[512] = "";
    /* inputs: QK A[64][128] B[N][128]; PV P[64][64] V[64][128]; attn Q, K [64][128], V [64][128] */
    if (p->kind == PROBE_QK) { in_elems[0] = 64 * 128; in_elems[1] = (size_t)p->n * 128; }
    else if (p->kind == PROBE_ATTN) { in_elems[0] = in_elems[1] = in_elems[2] = 64 * 128; }
    else { in_elems[0] = 64 * 64; in_elems[1] = 64 * 128; }
    for (k = 0; k < num_in; k++) {
        h_in[k] = (uint16_t *)malloc(in_elems[k] * 2);
        v_in[k] = (double *)malloc(in_elems[k] * sizeof(double));
        random_matrix(h_in[k], v_in[k], in_elems[k], p->dt);
    }
    if (p->kind == PROBE_QK) reference_matmul(ref, v_in[0], v_in[1], 64, p->n, 128, 0);
    else if (p->kind == PROBE_ATTN) {
        /* S in f32 (the accumulator), rounded to bf16 as the kernel's P; then P . V */
        double *s = (double *)malloc(64 * 64 * sizeof(double));
        reference_matmul(s, v_in[0], v_in[1], 64, 64, 128, 0);
        for (i = 0; i < 64 * 64; i++) s[i] = attn_bf16_to_f32(attn_f32_to_bf16((float)s[i]));
        reference_matmul(ref, s, v_in[2], 64, 128, 64, 1);
        free(s);
        atol = 0.1; /* an S within f32 rounding of a bf16 tie may round the other way: one
                       P element off by a bf16 ulp (|S| < 16: <= 2^-4) times |V| <= 1 */
    } else reference_matmul(ref, v_in[0], v_in[1], 64, 128, 64, 1);

    for (i = 0; i < out_elems; i++) out[i] = NAN; /* poison: an unwritten element fails */
    if (!cu_ok(cu->cuModuleGetFunction(&f, module, p->name), "cuModuleGetFunction", detail, sizeof detail) ||
        !cu_ok(cu->cuFuncSetAttribute(f, ATTN__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, p->smem),
               "cuFuncSetAttribute", detail, sizeof detail))
        goto done;
    for (k = 0; k < num_in; k++)
        if (!cu_ok(cu->cuMemAlloc(&d_in[k], in_elems[k] * 2), "cuMemAlloc", detail, sizeof detail) ||
            !cu_ok(cu->cuMemcpyHtoDAsync(d_in[k], h_in[k], in_elems[k] * 2, NULL), "cuMemcpyHtoD", detail, sizeof detail))
            goto done;
    if (!cu_ok(cu->cuMemAlloc(&d_out, out_elems * 4), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_out, out, out_elems * 4, NULL), "cuMemcpyHtoD", detail, sizeof detail) ||
        !cu_ok(cu->cuMemAlloc(&d_status, 4), "cuMemAlloc", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyHtoDAsync(d_status, &status, 4, NULL), "cuMemcpyHtoD", detail, sizeof detail))
        goto done;
    for (k = 0; k < num_in; k++) args[k] = &d_in[k];
    args[num_in] = &d_out;
    args[num_in + 1] = &d_status;
    if (!cu_ok(cu->cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, (unsigned)p->smem, NULL, args, NULL), "cuLaunchKernel",
               detail, sizeof detail) ||
        !cu_ok(cu->cuStreamSynchronize(NULL), "the kernel", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyDtoHAsync(out, d_out, out_elems * 4, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
        !cu_ok(cu->cuMemcpyDtoHAsync(&status, d_status, 4, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
        !cu_ok(cu->cuStreamSynchronize(NULL), "cuStreamSynchronize", detail, sizeof detail))
        goto done;
    if (status) {
        snprintf(detail, sizeof detail, "the kernel found too little shared memory for a 1024-aligned base (status %d)",
                 status);
        goto done;
    }
    for (i = 0; i < out_elems; i++) {
        double diff = fabs((double)out[i] - ref[i]);
        int ok = !isnan(out[i]) && diff <= atol + rtol * fabs(ref[i]);
        if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
        if (!isnan(out[i]) && diff > max_diff) max_diff = diff;
        if (!ok) {
            bad++;
            if (shown++ < 6)
                printf("    %s [%d][%d]: gpu %.6g, reference %.6g\n", p->name, (int)(i / cols_out), (int)(i % cols_out),
                       (double)out[i], ref[i]);
        }
    }
    snprintf(detail, sizeof detail, "%s%s[64][%d], max abs diff %.3g (max |reference| %.3g, tolerance %g + %g |ref|)",
             bad ? "elements wrong or unwritten (first ones above); " : "", p->kind == PROBE_QK ? "S" : "O", cols_out,
             max_diff, max_ref, atol, rtol);
done:
    if (cuda_broken || bad || status) fail(p->name, detail);
    else pass(p->name, detail);
    for (k = 0; k < num_in; k++) {
        if (d_in[k]) cu->cuMemFree(d_in[k]);
        free(h_in[k]);
        free(v_in[k]);
    }
    if (d_out) cu->cuMemFree(d_out);
    if (d_status) cu->cuMemFree(d_status);
    free(ref);
    free(out);
}

int main(int argc, char **argv) {
    const char *probe_path = "tests/wgmma_probe.cu", *kernel_dir = "kernels";
    const char *hdr_name[2] = {"attn_common.cuh", "wgmma.cuh"}, *hdr_text[2];
    char *texts[3] = {NULL, NULL, NULL}, path[1024], detail[512], gpu_reason[600] = "";
    compiled prog;
    int i, arch = 0;
    memset(&prog, 0, sizeof prog);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--probe") && i + 1 < argc) probe_path = argv[++i];
        else if (!strcmp(argv[i], "--kernels") && i + 1 < argc) kernel_dir = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) rng_state = strtoull(argv[++i], NULL, 0) | 1;
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else {
            fprintf(stderr, "usage: wgmma_check [--probe FILE] [--kernels DIR] [--seed S] [-v]\n");
            return 2;
        }
    }
    if (attn_tool_context_create(&context) != ATTN_OK) {
        printf("wgmma_check: %s\n", attn_context_last_error(NULL));
        return 2;
    }
    nv = context->nvrtc;
    cu = context->cuda;
    if (!nv->library) {
        printf("wgmma_check: %s\n", context->platform.nvrtc_reason);
        skip("compile sm_90a", context->platform.nvrtc_reason);
        for (i = 0; i < NUM_PROBES; i++) skip(probes[i].name, "no NVRTC");
        goto end;
    }
    texts[0] = attn_tool_read_file(probe_path);
    for (i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", kernel_dir, hdr_name[i]);
        texts[i + 1] = attn_tool_read_file(path);
        hdr_text[i] = texts[i + 1];
        if (!texts[i + 1]) { printf("wgmma_check: cannot read %s (run from the repository root)\n", path); return 2; }
    }
    if (!texts[0]) { printf("wgmma_check: cannot read %s (run from the repository root)\n", probe_path); return 2; }
    printf("wgmma_check: NVRTC %d.%d; %s with %s/{attn_common,wgmma}.cuh for sm_90a\n", nv->major, nv->minor,
           probe_path, kernel_dir);

    /* ---- no GPU needed: the compile, ptxas's report, the architecture guard ---- */
    attn_tool_compile(nv, &prog, texts[0], "wgmma_probe.cu", 2, hdr_text, hdr_name, "sm_90a", NULL);
    if (verbose && prog.log) printf("%s\n", prog.log);
    if (!prog.ok) {
        printf("%s\n", prog.log ? prog.log : "(no log)");
        fail("compile sm_90a", "NVRTC could not compile the probes (log above)");
    } else if (attn_tool_print_warnings(prog.log) > 0) {
        fail("compile sm_90a", "the compile has warnings (above)");
    } else {
        snprintf(detail, sizeof detail, "%zu-byte cubin, no warnings", prog.cubin_size);
        pass("compile sm_90a", detail);
    }
    printf("    %-22s %5s %7s %6s %s\n", "ptxas (sm_90a)", "regs", "smem", "stack", "spill st/ld");
    for (i = 0; i < NUM_PROBES; i++) {
        attn_tool_ptxas e = attn_tool_ptxas_for(prog.log, probes[i].name);
        char name[96];
        snprintf(name, sizeof name, "ptxas %s", probes[i].name);
        if (!prog.ok) { skip(name, "the program did not compile"); continue; }
        printf("    %-22s %5d %7d %6d %d/%d\n", probes[i].name, e.regs, e.smem, e.stack, e.spill_st, e.spill_ld);
        snprintf(detail, sizeof detail, "%d registers, %d/%d bytes spilled, %d bytes stack", e.regs, e.spill_st,
                 e.spill_ld, e.stack);
        if (!e.found || !e.regs) fail(name, "not in ptxas's report");
        else if (e.spill_st || e.spill_ld || e.stack) fail(name, detail);
        else pass(name, detail);
    }
    if (attn_tool_guard(nv, 2, hdr_text, hdr_name, "wgmma.cuh", "sm_90", "sm_90a", detail, sizeof detail))
        pass("guard: wgmma.cuh refuses sm_90", detail);
    else fail("guard: wgmma.cuh refuses sm_90", detail);

    /* ---- the GPU: compute capability 9.0 only ---- */
    if (context->platform.kind != ATTN_PLATFORM_CUDA)
        snprintf(gpu_reason, sizeof gpu_reason, "%s", context->platform.cuda_reason);
    else if ((arch = context->platform.cuda_capability_major * 10 + context->platform.cuda_capability_minor) != 90)
        snprintf(gpu_reason, sizeof gpu_reason, "the device is sm_%d; sm_90a code runs on compute capability 9.0 only",
                 arch);
    else if (!prog.ok)
        snprintf(gpu_reason, sizeof gpu_reason, "the probes did not compile");
    else if (attn__cuda_enter(context, "wgmma_check") != ATTN_OK)
        snprintf(gpu_reason, sizeof gpu_reason, "%s", attn_context_last_error(context));
    if (gpu_reason[0]) {
        for (i = 0; i < NUM_PROBES; i++) skip(probes[i].name, gpu_reason);
    } else {
        attn__CUmodule module = NULL;
        attn__CUresult rc = cu->cuModuleLoadData(&module, prog.cubin);
        printf("device sm_%d: running each probe on one warpgroup\n", arch);
        if (rc) {
            snprintf(detail, sizeof detail, "cuModuleLoadData failed: CUDA error %d", rc);
            for (i = 0; i < NUM_PROBES; i++) fail(probes[i].name, detail);
        } else {
            for (i = 0; i < NUM_PROBES; i++) {
                if (cuda_broken) skip(probes[i].name, "an earlier CUDA error left the context unusable");
                else run_probe(&probes[i], module);
            }
            if (!cuda_broken) cu->cuModuleUnload(module);
        }
        attn__cuda_leave(context);
    }

end:
    free(prog.log);
    free(prog.cubin);
    for (i = 0; i < 3; i++) free(texts[i]);
    attn_context_destroy(context);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
