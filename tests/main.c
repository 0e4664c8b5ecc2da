/* The test runner: the implementations of attn.h, of the harness and of the shared
   fixtures live here; each tests/test_*.c file contributes one or more suites,
   registered explicitly below. */
#include <stdlib.h>

/* Every allocation of the library is counted, so a test can prove that build and forward
   allocate nothing after create (tests/test_seam.c).
   (Atomic: threads of the threaded tests allocate at once.) */
long attn_test_allocations;
static void attn_test_count(void) { __atomic_fetch_add(&attn_test_allocations, 1, __ATOMIC_RELAXED); }
static void *attn_test_malloc(size_t n) { attn_test_count(); return malloc(n); }
static void *attn_test_realloc(void *p, size_t n) { attn_test_count(); return realloc(p, n); }
#define ATTN_MALLOC(sz) attn_test_malloc(sz)
#define ATTN_REALLOC(p, sz) attn_test_realloc(p, sz)
#define ATTN_FREE(p) free(p)

#define ATTN_IMPLEMENTATION
#include "attn.h"
#define ATTN_TEST_IMPLEMENTATION
#include "attn_test.h"
#include "fixtures.h"
#include "mla_fixtures.h"
#include "cuda_fixtures.h"

#include <stdlib.h>
#include <string.h>

void suite_types(void);       /* tests/test_forward.c */
void suite_forward(void);     /* tests/test_forward.c */
void suite_bf16dot(void);     /* tests/test_bf16dot.c */
void suite_simd(void);        /* tests/test_simd.c */
void suite_selector(void);    /* tests/test_selector.c */
void suite_validation(void);  /* tests/test_validation.c */
void suite_regress(void);     /* tests/test_regress.c */
void suite_mla_reject(void);  /* tests/test_mla_reject.c */
void suite_mla_decode(void);  /* tests/test_mla_decode.c */
void suite_mla_prefill(void); /* tests/test_mla_prefill.c */
void suite_mla_batch(void);   /* tests/test_mla_batch.c */
void suite_mla_merge(void);   /* tests/test_mla_merge.c */
void suite_mla_sparse(void);  /* tests/test_mla_sparse.c */
void suite_dcp(void);         /* tests/test_dcp.c */
void suite_seam(void);        /* tests/test_seam.c */
void suite_defects(void);     /* tests/test_defects.c */
void suite_outside(void);     /* tests/test_outside.c */
void suite_found(void);       /* tests/test_found.c */
void suite_nvrtc(void);       /* tests/test_nvrtc.c */
void suite_cuda_reject(void);  /* tests/test_cuda_reject.c */
void suite_cuda_forward(void); /* tests/test_cuda_forward.c */
void suite_cuda_cache(void);   /* tests/test_cuda_cache.c */
void suite_cuda_merge(void);   /* tests/test_cuda_merge.c */
void suite_cuda_graph(void);   /* tests/test_cuda_graph.c */
void suite_cuda_compile(void); /* tests/test_cuda_compile.c */
void suite_cuda_mla_api(void); /* tests/test_cuda_mla_api.c: MLA on the GPU, the API */
void suite_found_cuda(void);  /* tests/test_found_cuda.c: issue 37 on the GPU */
void suite_cuda_mla(void);     /* tests/test_mla_cuda.c: MLA on the GPU, the numerics */

int main(int argc, char **argv) {
    /* Optional filter: run only suites whose name contains argv[1]. */
    const char *only = argc > 1 ? argv[1] : NULL;
#define SUITE(s) if (!only || strstr(#s, only)) s()
    SUITE(suite_types);
    SUITE(suite_forward);
    SUITE(suite_bf16dot);
    SUITE(suite_simd);
    SUITE(suite_selector);
    SUITE(suite_validation);
    SUITE(suite_regress);
    SUITE(suite_mla_reject); /* the MLA suites: "mla" or "suite_mla" selects them all */
    SUITE(suite_mla_decode);
    SUITE(suite_mla_prefill);
    SUITE(suite_mla_batch);
    SUITE(suite_mla_merge);
    SUITE(suite_mla_sparse);
    SUITE(suite_dcp);
    SUITE(suite_seam);
    SUITE(suite_defects);
    SUITE(suite_outside);
    SUITE(suite_found);
    SUITE(suite_nvrtc);
    SUITE(suite_cuda_reject); /* the CUDA suites: "cuda" or "suite_cuda" selects them all */
    SUITE(suite_cuda_forward);
    SUITE(suite_cuda_cache);
    SUITE(suite_cuda_merge);
    SUITE(suite_cuda_graph);
    SUITE(suite_cuda_compile);
    SUITE(suite_cuda_mla_api); /* "mla" selects these two too (MLA on the GPU) */
    SUITE(suite_found_cuda);
    SUITE(suite_cuda_mla);
#undef SUITE
    return attn_test_summary();
}
