/* The test runner: the implementations of attn.h, of the harness and of the shared
   fixtures live here; each tests/test_*.c file contributes one or more suites,
   registered explicitly below. */
#define ATTN_IMPLEMENTATION
#include "attn.h"
#define ATTN_TEST_IMPLEMENTATION
#include "attn_test.h"
#include "fixtures.h"

#include <stdlib.h>
#include <string.h>

void suite_types(void);      /* tests/test_forward.c */
void suite_forward(void);    /* tests/test_forward.c */
void suite_selector(void);   /* tests/test_selector.c */
void suite_validation(void); /* tests/test_validation.c */
void suite_regress(void);    /* tests/test_regress.c */
void suite_mla(void);        /* tests/test_mla.c */

int main(int argc, char **argv) {
    /* Optional filter: run only suites whose name contains argv[1]. */
    const char *only = argc > 1 ? argv[1] : NULL;
#define SUITE(s) if (!only || strstr(#s, only)) s()
    SUITE(suite_types);
    SUITE(suite_forward);
    SUITE(suite_selector);
    SUITE(suite_validation);
    SUITE(suite_regress);
    SUITE(suite_mla);
#undef SUITE
    return attn_test_summary();
}
