/* tool_support.h - what the tools and the GPU check programs share (tools/nvrtc-check.c,
   tests/wgmma_check.c, tests/cuda_kernels.c). Include after attn.h (with
   ATTN_IMPLEMENTATION: ATTN__DLOPEN_FLAGS). Static inline, so a program that uses one
   piece pays nothing for the other. */
#ifndef ATTN_TOOL_SUPPORT_H
#define ATTN_TOOL_SUPPORT_H

#include <dlfcn.h>
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

#endif /* ATTN_TOOL_SUPPORT_H */
