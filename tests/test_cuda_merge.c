/* attn_merge_attn_states on CUDA tensors: run on the GPU, it agrees with the CPU merge
   (LSE in both bases, infinite LSEs, a NaN LSE, which makes its row NaN on both, a NaN
   output row of an empty side, which does not). SKIPs (with the reason)
   where the platform has no CUDA device. */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "cuda_fixtures.h"

#include <math.h>

/* The merge of CUDA tensors runs on the GPU and agrees with the CPU merge. */
ATTN_TEST(cuda_merge_matches_cpu) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    enum { T = 37, H = 5, D = 72 };
    static float a[T * H * D], bb[T * H * D], la[T * H], lb[T * H], o_cpu[T * H * D], l_cpu[T * H];
    static float o_gpu[T * H * D], l_gpu[T * H];
    void *da = NULL, *db = NULL, *dla = NULL, *dlb = NULL, *dout = NULL, *dl = NULL;
    int i, bad = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    cu_fill(a, ATTN_DTYPE_F32, T * H * D, 4.0f);
    cu_fill(bb, ATTN_DTYPE_F32, T * H * D, 4.0f);
    cu_fill(la, ATTN_DTYPE_F32, T * H, 8.0f);
    cu_fill(lb, ATTN_DTYPE_F32, T * H, 8.0f);
    la[3] = -INFINITY; lb[4] = -INFINITY; la[5] = lb[5] = -INFINITY; la[6] = INFINITY; lb[7] = NAN;
    a[3 * D] = NAN;
    if (attn_cuda_malloc(ctx, sizeof a, &da) == ATTN_OK && attn_cuda_malloc(ctx, sizeof bb, &db) == ATTN_OK &&
        attn_cuda_malloc(ctx, sizeof la, &dla) == ATTN_OK && attn_cuda_malloc(ctx, sizeof lb, &dlb) == ATTN_OK &&
        attn_cuda_malloc(ctx, sizeof o_gpu, &dout) == ATTN_OK && attn_cuda_malloc(ctx, sizeof l_gpu, &dl) == ATTN_OK &&
        attn_cuda_memcpy(ctx, da, a, sizeof a, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK &&
        attn_cuda_memcpy(ctx, db, bb, sizeof bb, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK &&
        attn_cuda_memcpy(ctx, dla, la, sizeof la, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK &&
        attn_cuda_memcpy(ctx, dlb, lb, sizeof lb, ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK) {
        attn_tensor ha = cu_tensor(a, ATTN_DTYPE_F32, 3, T, H, D, 0), hb = cu_tensor(bb, ATTN_DTYPE_F32, 3, T, H, D, 0);
        attn_tensor hla = cu_tensor(la, ATTN_DTYPE_F32, 2, T, H, 0, 0), hlb = cu_tensor(lb, ATTN_DTYPE_F32, 2, T, H, 0, 0);
        attn_tensor ho = cu_tensor(o_cpu, ATTN_DTYPE_F32, 3, T, H, D, 0), hl = cu_tensor(l_cpu, ATTN_DTYPE_F32, 2, T, H, 0, 0);
        attn_tensor ga = cu_tensor(da, ATTN_DTYPE_F32, 3, T, H, D, 1), gb = cu_tensor(db, ATTN_DTYPE_F32, 3, T, H, D, 1);
        attn_tensor gla = cu_tensor(dla, ATTN_DTYPE_F32, 2, T, H, 0, 1), glb = cu_tensor(dlb, ATTN_DTYPE_F32, 2, T, H, 0, 1);
        attn_tensor go = cu_tensor(dout, ATTN_DTYPE_F32, 3, T, H, D, 1), gl = cu_tensor(dl, ATTN_DTYPE_F32, 2, T, H, 0, 1);
        EXPECT_OK(attn_merge_attn_states(ctx, &ha, &hla, ATTN_LSE_BASE_E, &hb, &hlb, ATTN_LSE_BASE_2, &ho, &hl,
                                         ATTN_LSE_BASE_E, NULL));
        EXPECT_OK(attn_merge_attn_states(ctx, &ga, &gla, ATTN_LSE_BASE_E, &gb, &glb, ATTN_LSE_BASE_2, &go, &gl,
                                         ATTN_LSE_BASE_E, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
        EXPECT_OK(attn_cuda_memcpy(ctx, o_gpu, dout, sizeof o_gpu, ATTN_COPY_DEVICE_TO_HOST, NULL));
        EXPECT_OK(attn_cuda_memcpy(ctx, l_gpu, dl, sizeof l_gpu, ATTN_COPY_DEVICE_TO_HOST, NULL));
        for (i = 0; i < T * H * D && bad < 4; i++)
            if (!(fabsf(o_cpu[i] - o_gpu[i]) <= 1e-5f + 1e-5f * fabsf(o_cpu[i])) && !(o_cpu[i] != o_cpu[i] && o_gpu[i] != o_gpu[i])) {
                attn_test_fail(__FILE__, __LINE__, "merge out[%d]: cpu %g cuda %g", i, o_cpu[i], o_gpu[i]);
                bad++;
            }
        for (i = 0; i < T * H && bad < 4; i++)
            if (!(fabsf(l_cpu[i] - l_gpu[i]) <= 1e-5f + 1e-5f * fabsf(l_cpu[i])) && !(l_cpu[i] == l_gpu[i]) &&
                !(l_cpu[i] != l_cpu[i] && l_gpu[i] != l_gpu[i])) {
                attn_test_fail(__FILE__, __LINE__, "merge lse[%d]: cpu %g cuda %g", i, l_cpu[i], l_gpu[i]);
                bad++;
            }
        /* row 7 (lb NaN) is NaN on both; row 3 (a empty, a NaN in its output) is b's */
        EXPECT_TRUE(o_gpu[7 * D] != o_gpu[7 * D] && l_gpu[7] != l_gpu[7] && o_gpu[3 * D] == o_gpu[3 * D]);
    } else {
        EXPECT_TRUE(0);
    }
    attn_cuda_free(ctx, da); attn_cuda_free(ctx, db); attn_cuda_free(ctx, dla); attn_cuda_free(ctx, dlb);
    attn_cuda_free(ctx, dout); attn_cuda_free(ctx, dl);
    attn_context_destroy(ctx);
}

void suite_cuda_merge(void) {
    ATTN_RUN(cuda_merge_matches_cpu);
}
