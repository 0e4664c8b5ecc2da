/* codes_check - the 8-bit KV-cache codes of kernels/attn_common.cuh on the device against
   the library's CPU conversions, bit for bit.

   A standalone C99 program on the library's NVRTC and CUDA driver tables (dlopen; no CUDA
   header), like wgmma_check. It compiles tests/codes_probe.cu with kernels/attn_common.cuh
   for sm_80 and sm_90 (no GPU needed: no warning, no spill), and for the device twice: as
   is and with -DATTN_E4M3_CVT=0 (the sm_80 e4m3 path, so both paths run on one GPU). On a
   device (compute capability 8.0+; the cvt path needs 8.9+) it checks
     - decode: all 256 codes of fp8 e4m3, fp8 e5m2 and int8 through attn_codes4_to_f16x2:
       the f16 times the code factor equals attn_fp8_e4m3_to_f32 / attn_fp8_e5m2_to_f32 /
       the integer (NaN codes give NaN, signed zeros keep their sign);
     - encode: attn_f32_to_code equals attn_f32_to_fp8_e4m3 / _e5m2 / the int8 rounding
       of the CPU cache write on every float of a list: +-0, +-inf, NaNs of both signs,
       the ties and boundaries of each type (midpoints between neighbouring codes and one
       ulp either side, the saturation edges, subnormals of f32 and of the code), and
       200000 random bit patterns.
   Usage: codes_check [--kernels DIR] [-v]. Ends with "N passed, N failed, N skipped". */
#define _POSIX_C_SOURCE 200809L
#define ATTN_IMPLEMENTATION
#include "attn.h"
#include "tools/tool_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static attn_context *context;
static const attn__nvrtc *nv;
static const attn__cuda_driver *cu;
static int passed, failed, skipped, verbose;

static void pass(const char *name, const char *detail) { printf("  PASS %s: %s\n", name, detail); passed++; }
static void fail(const char *name, const char *detail) { printf("  FAIL %s: %s\n", name, detail); failed++; }
static void skip(const char *name, const char *reason) { printf("  SKIP %s: %s\n", name, reason); skipped++; }

typedef attn_tool_compiled compiled; /* tools/tool_support.h */

/* the probes with attn_common.cuh for arch; cvt0: the sm_80 e4m3 path (-DATTN_E4M3_CVT=0) */
static void compile(compiled *out, const char *src, const char *hdr, const char *arch, int cvt0) {
    const char *hname = "attn_common.cuh";
    attn_tool_compile(nv, out, src, "codes_probe.cu", 1, &hdr, &hname, arch, cvt0 ? "-DATTN_E4M3_CVT=0" : NULL);
}

static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* the CPU's value of code c of type t (4, 5, 6) */
static float cpu_value(int t, unsigned c) {
    return t == 4 ? attn_fp8_e4m3_to_f32((uint8_t)c) : t == 5 ? attn_fp8_e5m2_to_f32((uint8_t)c) : (float)(int8_t)c;
}
/* the CPU's code of x: the library's own conversions (int8: through a one-element store of
   the cache write, attn__store_elem) */
static unsigned cpu_code(int t, float x) {
    int8_t v = 0;
    if (t == 4) return attn_f32_to_fp8_e4m3(x);
    if (t == 5) return attn_f32_to_fp8_e5m2(x);
    attn__store_elem(&v, ATTN_DTYPE_INT8, 0, x);
    return (uint8_t)v;
}

/* the float list of the encode check */
static size_t make_inputs(float *x, size_t cap) {
    size_t n = 0;
    int t;
    unsigned c;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    static const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                                        0x7f800001u, 0xff812345u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u,
                                        0x7f7fffffu, 0xff7fffffu};
    for (c = 0; c < sizeof specials / 4 && n < cap; c++) x[n++] = bits_f32(specials[c]);
    for (t = 4; t <= 6; t++) /* every code, the midpoints to the next one, one ulp either side */
        for (c = 0; c < 256; c++) {
            float a = cpu_value(t, c), b = cpu_value(t, (c + 1) & 0xff), m;
            if (a != a || b != b || n + 7 > cap) continue;
            m = (float)(((double)a + (double)b) / 2);
            x[n++] = a; x[n++] = m;
            x[n++] = bits_f32(f32_bits(m) + 1); x[n++] = bits_f32(f32_bits(m) - 1);
            x[n++] = a * 1.5f; x[n++] = a * 1000.0f; x[n++] = a * 1e-3f;
        }
    while (n < cap) { /* random bit patterns */
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[n++] = bits_f32((uint32_t)(s >> 17));
    }
    return n;
}

#define NUM_INPUTS 200000

static int cuda_ok(attn__CUresult rc, const char *what, char *detail, size_t size) {
    if (rc) snprintf(detail, size, "%s failed: CUDA error %d", what, rc);
    return rc == 0;
}

/* runs both probes of one compiled variant; tag names it */
static void run_variant(const compiled *prog, const char *tag, const float *x, size_t nx) {
    attn__CUmodule module = NULL;
    attn__CUfunction fdec, fenc, ffac;
    attn__CUdeviceptr d_codes = 0, d_half = 0, d_x = 0, d_out = 0, d_fac = 0;
    uint32_t words[64];
    uint16_t half[256];
    uint8_t *codes = (uint8_t *)malloc(nx);
    float fac[3];
    char name[128], detail[512];
    int t, i;
    for (i = 0; i < 64; i++) words[i] = (uint32_t)(4 * i) | (uint32_t)(4 * i + 1) << 8 | (uint32_t)(4 * i + 2) << 16 | (uint32_t)(4 * i + 3) << 24;
    detail[0] = 0;
    if (!codes || !cuda_ok(cu->cuModuleLoadData(&module, prog->cubin), "cuModuleLoadData", detail, sizeof detail) ||
        !cuda_ok(cu->cuModuleGetFunction(&fdec, module, "probe_decode"), "cuModuleGetFunction", detail, sizeof detail) ||
        !cuda_ok(cu->cuModuleGetFunction(&fenc, module, "probe_encode"), "cuModuleGetFunction", detail, sizeof detail) ||
        !cuda_ok(cu->cuModuleGetFunction(&ffac, module, "probe_factor"), "cuModuleGetFunction", detail, sizeof detail) ||
        !cuda_ok(cu->cuMemAlloc(&d_codes, sizeof words), "cuMemAlloc", detail, sizeof detail) ||
        !cuda_ok(cu->cuMemAlloc(&d_half, sizeof half), "cuMemAlloc", detail, sizeof detail) ||
        !cuda_ok(cu->cuMemAlloc(&d_x, nx * 4), "cuMemAlloc", detail, sizeof detail) ||
        !cuda_ok(cu->cuMemAlloc(&d_out, nx), "cuMemAlloc", detail, sizeof detail) ||
        !cuda_ok(cu->cuMemAlloc(&d_fac, sizeof fac), "cuMemAlloc", detail, sizeof detail) ||
        !cuda_ok(cu->cuMemcpyHtoDAsync(d_codes, words, sizeof words, NULL), "cuMemcpyHtoD", detail, sizeof detail) ||
        !cuda_ok(cu->cuMemcpyHtoDAsync(d_x, x, nx * 4, NULL), "cuMemcpyHtoD", detail, sizeof detail)) {
        snprintf(name, sizeof name, "%s: set-up", tag);
        fail(name, detail[0] ? detail : "out of memory");
        goto done;
    }
    {
        void *args[1] = {&d_fac};
        if (!cuda_ok(cu->cuLaunchKernel(ffac, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), "probe_factor", detail, sizeof detail) ||
            !cuda_ok(cu->cuMemcpyDtoHAsync(fac, d_fac, sizeof fac, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
            !cuda_ok(cu->cuStreamSynchronize(NULL), "cuStreamSynchronize", detail, sizeof detail)) {
            snprintf(name, sizeof name, "%s: code factors", tag);
            fail(name, detail);
            goto done;
        }
    }
    for (t = 4; t <= 6; t++) {
        int bad = 0, first = -1;
        void *args[3];
        const char *tn = t == 4 ? "fp8_e4m3" : t == 5 ? "fp8_e5m2" : "int8";
        args[0] = &d_codes; args[1] = &d_half; args[2] = &t;
        snprintf(name, sizeof name, "%s: decode %s (256 codes)", tag, tn);
        if (!cuda_ok(cu->cuLaunchKernel(fdec, 1, 1, 1, 64, 1, 1, 0, NULL, args, NULL), "probe_decode", detail, sizeof detail) ||
            !cuda_ok(cu->cuMemcpyDtoHAsync(half, d_half, sizeof half, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
            !cuda_ok(cu->cuStreamSynchronize(NULL), "cuStreamSynchronize", detail, sizeof detail)) {
            fail(name, detail);
            continue;
        }
        for (i = 0; i < 256; i++) {
            float want = cpu_value(t, (unsigned)i), got = attn_f16_to_f32(half[i]) * fac[t - 4];
            int same = want != want ? got != got : (got == want && signbit(got) == signbit(want));
            if (!same && t == 6 && i == 0x80) same = got == -128.0f; /* never written; read as -128 */
            if (!same) { bad++; if (first < 0) first = i; }
        }
        if (bad) {
            snprintf(detail, sizeof detail, "%d codes differ; first 0x%02x: device %g (f16 0x%04x x %g), CPU %g", bad, first,
                     attn_f16_to_f32(half[first]) * fac[t - 4], half[first], fac[t - 4], cpu_value(t, (unsigned)first));
            fail(name, detail);
        } else {
            snprintf(detail, sizeof detail, "all equal (code factor %g)", fac[t - 4]);
            pass(name, detail);
        }
    }
    for (t = 4; t <= 6; t++) {
        int n = (int)nx, bad = 0;
        size_t first = 0;
        void *args[4];
        const char *tn = t == 4 ? "fp8_e4m3" : t == 5 ? "fp8_e5m2" : "int8";
        args[0] = &d_x; args[1] = &d_out; args[2] = &n; args[3] = &t;
        snprintf(name, sizeof name, "%s: encode %s (%zu floats)", tag, tn, nx);
        if (!cuda_ok(cu->cuLaunchKernel(fenc, 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL), "probe_encode", detail, sizeof detail) ||
            !cuda_ok(cu->cuMemcpyDtoHAsync(codes, d_out, nx, NULL), "cuMemcpyDtoH", detail, sizeof detail) ||
            !cuda_ok(cu->cuStreamSynchronize(NULL), "cuStreamSynchronize", detail, sizeof detail)) {
            fail(name, detail);
            continue;
        }
        for (i = 0; i < n; i++)
            if (codes[i] != cpu_code(t, x[i])) { if (!bad) first = (size_t)i; bad++; }
        if (bad) {
            snprintf(detail, sizeof detail, "%d differ; first x = %.9g (0x%08x): device 0x%02x, CPU 0x%02x", bad,
                     (double)x[first], f32_bits(x[first]), codes[first], cpu_code(t, x[first]));
            fail(name, detail);
        } else {
            pass(name, "every code equal to the CPU's");
        }
    }
done:
    if (d_codes) cu->cuMemFree(d_codes);
    if (d_half) cu->cuMemFree(d_half);
    if (d_x) cu->cuMemFree(d_x);
    if (d_out) cu->cuMemFree(d_out);
    if (d_fac) cu->cuMemFree(d_fac);
    if (module) cu->cuModuleUnload(module);
    free(codes);
}

int main(int argc, char **argv) {
    const char *kernel_dir = "kernels", *probe_path = "tests/codes_probe.cu";
    char *src = NULL, *hdr = NULL, path[1024], detail[512], gpu_reason[600] = "", arch[16];
    static const char *const arches[2] = {"sm_80", "sm_90"};
    compiled prog[2];
    float *x = NULL;
    size_t nx;
    int i, cc = 0;
    memset(prog, 0, sizeof prog);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernels") && i + 1 < argc) kernel_dir = argv[++i];
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else { fprintf(stderr, "usage: codes_check [--kernels DIR] [-v]\n"); return 2; }
    }
    if (attn_tool_context_create(&context) != ATTN_OK) {
        printf("codes_check: %s\n", attn_context_last_error(NULL));
        return 2;
    }
    nv = context->nvrtc;
    cu = context->cuda;
    if (!nv->library) {
        skip("compile", context->platform.nvrtc_reason);
        skip("device checks", "no NVRTC");
        goto end;
    }
    snprintf(path, sizeof path, "%s/attn_common.cuh", kernel_dir);
    src = attn_tool_read_file(probe_path);
    hdr = attn_tool_read_file(path);
    if (!src || !hdr) { printf("codes_check: cannot read %s or %s (run from the repository root)\n", probe_path, path); return 2; }
    for (i = 0; i < 4; i++) { /* sm_80 and sm_90, each path */
        compiled c;
        char name[64];
        attn_tool_ptxas e;
        compile(&c, src, hdr, arches[i / 2], i % 2);
        snprintf(name, sizeof name, "compile %s%s", arches[i / 2], i % 2 ? " ATTN_E4M3_CVT=0" : "");
        if (verbose && c.log) printf("%s\n", c.log);
        e = attn_tool_ptxas_for(c.log, "probe_decode");
        if (!c.ok) { printf("%s\n", c.log ? c.log : "(no log)"); fail(name, "NVRTC could not compile the probes"); }
        else if (attn_tool_print_warnings(c.log) > 0) fail(name, "warnings (above)");
        else if (e.spill_st || e.spill_ld) fail(name, "spills");
        else { snprintf(detail, sizeof detail, "%zu-byte cubin, no warning, no spill", c.cubin_size); pass(name, detail); }
        free(c.log); free(c.cubin);
    }
    if (context->platform.kind != ATTN_PLATFORM_CUDA) snprintf(gpu_reason, sizeof gpu_reason, "%s", context->platform.cuda_reason);
    else if ((cc = context->platform.cuda_capability_major * 10 + context->platform.cuda_capability_minor) < 80)
        snprintf(gpu_reason, sizeof gpu_reason, "compute capability %d.%d (the kernels need 8.0)", cc / 10, cc % 10);
    else if (attn__cuda_enter(context, "codes_check") != ATTN_OK)
        snprintf(gpu_reason, sizeof gpu_reason, "%s", attn_context_last_error(context));
    if (gpu_reason[0]) { skip("device checks", gpu_reason); goto end; }
    snprintf(arch, sizeof arch, "sm_%d", cc);
    x = (float *)malloc(NUM_INPUTS * sizeof *x);
    nx = x ? make_inputs(x, NUM_INPUTS) : 0;
    for (i = 0; i < 2; i++) {
        char tag[64];
        compile(&prog[i], src, hdr, arch, i);
        snprintf(tag, sizeof tag, "%s%s", arch, i ? " ATTN_E4M3_CVT=0 (sm_80 path)" : cc >= 89 ? " (cvt path)" : " (sm_80 path)");
        if (!prog[i].ok) { fail(tag, "does not compile for the device"); continue; }
        run_variant(&prog[i], tag, x, nx);
    }
    attn__cuda_leave(context);
end:
    for (i = 0; i < 2; i++) { free(prog[i].log); free(prog[i].cubin); }
    free(src); free(hdr); free(x);
    attn_context_destroy(context);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
