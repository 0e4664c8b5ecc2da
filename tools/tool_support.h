/* tool_support.h - what the tools and the GPU check programs share (tools/nvrtc-check.c,
   tests/wgmma_check.c, tests/hopper_check.c, tests/codes_check.c, tests/cuda_kernels.c): finding NVRTC, reading
   files, a quiet context, one NVRTC compile, reading ptxas's report and a CUBIN's globals. Include after attn.h (with
   ATTN_IMPLEMENTATION: ATTN__DLOPEN_FLAGS). Static inline, so a program that uses one
   piece pays nothing for the other. */
#ifndef ATTN_TOOL_SUPPORT_H
#define ATTN_TOOL_SUPPORT_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The path the last libnvrtc was opened under (attn_tool_open_library). */
static inline char *attn_tool_nvrtc_path(void) {
    static char path[512];
    return path;
}

/* attn_loader.open: a name as given (the library's own search), then, for libnvrtc, under
   $CUDA_HOME, $CUDA_PATH and /usr/local/cuda (lib64): the toolkit's NVRTC need not be on
   the loader path for the checks to run. */
static inline void *attn_tool_open_library(void *user_data, const char *soname) {
    const char *dirs[3];
    char *path = attn_tool_nvrtc_path();
    void *lib = dlopen(soname, ATTN__DLOPEN_FLAGS);
    size_t d, nd = 0;
    (void)user_data;
    if (strncmp(soname, "libnvrtc", 8) != 0) return lib;
    snprintf(path, 512, "%s", soname);
    if (getenv("CUDA_HOME")) dirs[nd++] = getenv("CUDA_HOME");
    if (getenv("CUDA_PATH")) dirs[nd++] = getenv("CUDA_PATH");
    dirs[nd++] = "/usr/local/cuda";
    for (d = 0; d < nd && !lib; d++) {
        snprintf(path, 512, "%s/lib64/%s", dirs[d], soname);
        lib = dlopen(path, ATTN__DLOPEN_FLAGS);
    }
    return lib;
}

/* A whole file as a NUL-terminated string (malloc'd), NULL when it cannot be read. */
static inline char *attn_tool_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char *s;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    s = n >= 0 ? (char *)malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* A quiet context for a checking tool: no log, one thread, no disk kernel cache, and the
   loader above (so NVRTC is found in the toolkit's directories too). */
static inline attn_status attn_tool_context_create(attn_context **out) {
    attn_context_desc cd;
    attn_loader loader; /* copied by attn_context_create */
    memset(&cd, 0, sizeof cd);
    memset(&loader, 0, sizeof loader);
    loader.open = attn_tool_open_library;
    cd.loader = &loader;
    cd.log_level = ATTN_LOG_LEVEL_NONE;
    cd.num_threads = 1;
    cd.kernel_cache_dir = "off";
    return attn_context_create(&cd, out);
}

/* ---- ptxas -v in an NVRTC log ----
   "Compiling entry function 'F' for 'sm_90a'" (or "Function properties for F"), then
   "N bytes stack frame, N bytes spill stores, N bytes spill loads" and
   "Used N registers, used N barriers, N bytes smem, ..." until the next function. */

/* The number written just before `marker` in line (0 if none). */
static inline int attn_tool_number_before(const char *line, const char *marker) {
    const char *x = strstr(line, marker);
    if (!x) return 0;
    while (x > line && x[-1] == ' ') x--;
    while (x > line && x[-1] >= '0' && x[-1] <= '9') x--;
    return atoi(x);
}

/* Copies the line at p (up to '\n', at most size - 1 bytes) into line; returns the '\n'
   that ends it, or NULL at the end of the log. */
static inline const char *attn_tool_log_line(const char *p, char *line, size_t size) {
    const char *end = strchr(p, '\n');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n >= size) n = size - 1;
    memcpy(line, p, n);
    line[n] = 0;
    return end;
}

/* Fills the figures a "stack frame" or "Used N registers" line carries; 0 for other lines. */
typedef struct attn_tool_ptxas { int found, regs, smem, stack, spill_st, spill_ld; } attn_tool_ptxas;
static inline int attn_tool_ptxas_line(const char *line, attn_tool_ptxas *e) {
    const char *q;
    if (strstr(line, "bytes stack frame")) {
        e->stack = attn_tool_number_before(line, "bytes stack frame");
        e->spill_st = attn_tool_number_before(line, "bytes spill stores");
        e->spill_ld = attn_tool_number_before(line, "bytes spill loads");
        return 1;
    }
    if ((q = strstr(line, "Used ")) != NULL && strstr(line, "registers")) {
        e->regs = atoi(q + 5);
        e->smem = attn_tool_number_before(line, "bytes smem");
        return 1;
    }
    return 0;
}

/* The report of entry function `func` (found = 0 when the log has none). */
static inline attn_tool_ptxas attn_tool_ptxas_for(const char *log, const char *func) {
    attn_tool_ptxas e;
    char key[128], line[512];
    const char *p;
    memset(&e, 0, sizeof e);
    snprintf(key, sizeof key, "Compiling entry function '%s'", func);
    p = log ? strstr(log, key) : NULL;
    if (!p) return e;
    e.found = 1;
    p = strchr(p, '\n');
    while (p && *++p) {
        p = attn_tool_log_line(p, line, sizeof line);
        if (strstr(line, "Compiling entry function")) break;
        attn_tool_ptxas_line(line, &e);
    }
    return e;
}

/* Prints the log's warning lines (NVRTC's front end, or ptxas: e.g. wgmma serialized);
   returns how many. */
static inline int attn_tool_print_warnings(const char *log) {
    char line[512];
    int count = 0;
    const char *p = log;
    while (p && *p) {
        const char *end = attn_tool_log_line(p, line, sizeof line);
        if (strstr(line, "warning") || strstr(line, "Warning") || strstr(line, "Potential Performance Loss")) {
            printf("    %s\n", line);
            count++;
        }
        p = end ? end + 1 : NULL;
    }
    return count;
}

/* ---- one NVRTC compile (the GPU check programs' probes) ---- */

typedef struct attn_tool_compiled {
    int ok;           /* compiled, and the CUBIN is in cubin */
    char *log, *cubin; /* malloc'd (the caller frees them); log also on failure */
    size_t cubin_size;
} attn_tool_compiled;

/* Compiles src (named src_name, with nh named headers) for arch with --ptxas-options=-v,
   C++17 and, where not NULL, one more option (a -D). */
static inline void attn_tool_compile(const attn__nvrtc *nv, attn_tool_compiled *out, const char *src, const char *src_name,
                                     int nh, const char *const *hdr_text, const char *const *hdr_name, const char *arch,
                                     const char *extra) {
    char arch_opt[48];
    const char *opts[4];
    attn__nvrtcProgram prog;
    size_t size = 0;
    int n = 3;
    memset(out, 0, sizeof *out);
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
    opts[0] = arch_opt;
    opts[1] = "--ptxas-options=-v";
    opts[2] = "-std=c++17";
    if (extra) opts[n++] = extra;
    if (nv->nvrtcCreateProgram(&prog, src, src_name, nh, hdr_text, hdr_name) != 0) return;
    out->ok = nv->nvrtcCompileProgram(prog, n, opts) == 0;
    if (nv->nvrtcGetProgramLogSize(prog, &size) == 0 && (out->log = (char *)malloc(size + 1)) != NULL) {
        if (nv->nvrtcGetProgramLog(prog, out->log)) out->log[0] = 0;
        out->log[size] = 0;
    }
    if (out->ok && nv->nvrtcGetCUBINSize(prog, &out->cubin_size) == 0 && out->cubin_size &&
        (out->cubin = (char *)malloc(out->cubin_size)) != NULL && nv->nvrtcGetCUBIN(prog, out->cubin) != 0) {
        free(out->cubin);
        out->cubin = NULL;
    }
    if (!out->cubin) out->ok = 0;
    nv->nvrtcDestroyProgram(&prog);
}

/* An architecture guard: a kernel that only includes `header` must not compile for `arch`,
   and the failure must be the header's #error naming `names` (e.g. the architecture it
   needs). 1 when so; 0 with *detail saying what happened instead. */
static inline int attn_tool_guard(const attn__nvrtc *nv, int nh, const char *const *hdr_text, const char *const *hdr_name,
                                  const char *header, const char *arch, const char *names, char *detail, size_t size) {
    char src[160];
    attn_tool_compiled g;
    int ok;
    memset(&g, 0, sizeof g);
    snprintf(src, sizeof src, "#include \"%s\"\nextern \"C\" __global__ void k(void) {}\n", header);
    attn_tool_compile(nv, &g, src, "guard.cu", nh, hdr_text, hdr_name, arch, NULL);
    ok = !g.ok && g.log && strstr(g.log, "#error") && strstr(g.log, names);
    if (g.ok) snprintf(detail, size, "it compiled for %s", arch);
    else if (!ok) snprintf(detail, size, "the compile failed without %s's #error", header);
    else snprintf(detail, size, "its #error names %s", names);
    free(g.log);
    free(g.cubin);
    return ok;
}

/* ---- globals of a CUBIN (an ELF64 image), without a GPU ---- */

/* Little-endian fields of the ELF file. */
static inline uint64_t attn_tool_elf_field(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    while (bytes--) v = v << 8 | p[bytes];
    return v;
}

/* The n initial bytes of global `name` (an initialised __constant__ or __device__ object of
   exactly n bytes): the symbol of that name in the symbol table, its bytes in the section it
   lives in. 1 when found, 0 otherwise (also for a malformed image). */
static inline int attn_tool_cubin_global(const unsigned char *elf, size_t size, const char *name, void *out,
                                         size_t n) {
    uint64_t shoff, shentsize, shnum, i, k;
    const size_t name_len = strlen(name) + 1;
    if (size < 64 || memcmp(elf, "\177ELF", 4) != 0 || elf[4] != 2 /* ELFCLASS64 */) return 0;
    shoff = attn_tool_elf_field(elf + 0x28, 8);
    shentsize = attn_tool_elf_field(elf + 0x3a, 2);
    shnum = attn_tool_elf_field(elf + 0x3c, 2);
    if (shentsize < 64 || shoff > size || shnum > (size - shoff) / shentsize) return 0;
    for (i = 0; i < shnum; i++) { /* section headers: type +4, addr +0x10, offset +0x18, size +0x20, link +0x28 */
        const unsigned char *sh = elf + shoff + i * shentsize, *strtab;
        uint64_t off = attn_tool_elf_field(sh + 0x18, 8), len = attn_tool_elf_field(sh + 0x20, 8);
        uint64_t link = attn_tool_elf_field(sh + 0x28, 4), str_off, str_len;
        if (attn_tool_elf_field(sh + 4, 4) != 2 /* SHT_SYMTAB */ || off > size || len > size - off || link >= shnum)
            continue;
        strtab = elf + shoff + link * shentsize;
        str_off = attn_tool_elf_field(strtab + 0x18, 8);
        str_len = attn_tool_elf_field(strtab + 0x20, 8);
        if (str_off > size || str_len > size - str_off) return 0;
        for (k = 0; k + 24 <= len; k += 24) { /* Elf64_Sym: name +0, shndx +6, value +8, size +16 */
            const unsigned char *sym = elf + off + k, *sec;
            uint64_t at = attn_tool_elf_field(sym, 4), shndx = attn_tool_elf_field(sym + 6, 2);
            uint64_t value = attn_tool_elf_field(sym + 8, 8), sec_addr, sec_off, sec_len;
            if (at >= str_len || str_len - at < name_len || memcmp(elf + str_off + at, name, name_len) != 0 ||
                attn_tool_elf_field(sym + 16, 8) != n || shndx == 0 || shndx >= shnum)
                continue;
            sec = elf + shoff + shndx * shentsize;
            sec_addr = attn_tool_elf_field(sec + 0x10, 8);
            sec_off = attn_tool_elf_field(sec + 0x18, 8);
            sec_len = attn_tool_elf_field(sec + 0x20, 8);
            if (attn_tool_elf_field(sec + 4, 4) == 8 /* SHT_NOBITS */ || value < sec_addr) return 0;
            value -= sec_addr;
            if (sec_off > size || sec_len > size - sec_off || value > sec_len || sec_len - value < n) return 0;
            memcpy(out, elf + sec_off + value, n);
            return 1;
        }
    }
    return 0;
}

#endif /* ATTN_TOOL_SUPPORT_H */
