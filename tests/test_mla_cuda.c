/* MLA on the GPU (suite_cuda_mla): CUDA_MLA_SM90 (wgmma, compute capability 9.0) and the
   portable fallback CUDA_MLA (mma.sync, sm_80+) forced — decodes, speculative decodes,
   prefills over several up-projection chunks, mixed and random batches, forced split
   counts, batch invariance, fp8 latent caches — in worlds with c.cuda: the layer on
   ATTN_DEVICE_CUDA, every tensor a device copy, checked against the same float64
   reference as the CPU (bounds GPU_TOL wider: the GPU rounds q_latent, P and o_latent to
   the layer dtype) and against CPU_MLA on the same data. Each test SKIPs, saying why,
   where no such device (with NVRTC and cuBLAS) is here. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "mla_fixtures.h"

/* NULL where the CUDA MLA backend (fallback: CUDA_MLA, else CUDA_MLA_SM90) can run here,
   else why not. */
static const char *mla_cuda_unavailable_for(int fallback) {
    static char why[200];
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_ERROR, 1);
    attn_platform p;
    const char *r = NULL;
    memset(&p, 0, sizeof p);
    if (!ctx || attn_platform_get(ctx, &p) != ATTN_OK) r = "no context";
    else if (!attn_backend_get(ATTN_BACKEND_CUDA_MLA_SM90)) r = "the CUDA path is compiled out (ATTN_NO_CUDA)";
    else if (p.kind != ATTN_PLATFORM_CUDA) r = p.cuda_reason;
    else if (fallback && p.cuda_capability_major < 8) r = "CUDA_MLA needs compute capability 8.0 or newer";
    else if (!fallback && (p.cuda_capability_major != 9 || p.cuda_capability_minor != 0))
        r = "CUDA_MLA_SM90 needs compute capability 9.0";
    else if (!p.nvrtc_version) r = p.nvrtc_reason;
    else if (!p.cublas_version) r = p.cublas_reason;
    if (r) snprintf(why, sizeof why, "%s", r);
    attn_context_destroy(ctx);
    return r ? why : NULL;
}
#define MLA_CUDA_SKIP_FOR(fallback)                          \
    do {                                                     \
        const char *why_ = mla_cuda_unavailable_for(fallback); \
        if (why_) SKIP(why_);                                \
    } while (0)
#define MLA_CUDA_SKIP() MLA_CUDA_SKIP_FOR(0)

/* One world, every entry point that applies: forward_mqa in both q forms (decodes),
   forward_mha (prefills), the fused call (writing the cache when the world did not). */
static void gpu_world(mcfg *c, const char *name, int splits) {
    mworld w;
    char tag[160];
    if (!c->cuda) c->cuda = 1;
    if (!world_open(&w, c, splits)) return; /* this world only: the failure is recorded */
    if (!c->write_new) {
        snprintf(tag, sizeof tag, "%s fused (writes cache)", name);
        run_fused(&w, w.meta, 1, tag, NULL);
    }
    if (w.info.num_decodes) {
        snprintf(tag, sizeof tag, "%s mqa q[%d]", name, w.D);
        run_mqa(&w, w.meta, 0, tag, NULL);
        snprintf(tag, sizeof tag, "%s mqa q_latent+q_pe", name);
        run_mqa(&w, w.meta, 1, tag, NULL);
    }
    if (w.info.num_prefills) {
        snprintf(tag, sizeof tag, "%s mha", name);
        run_mha(&w, w.meta, tag);
    }
    if (c->write_new) {
        snprintf(tag, sizeof tag, "%s fused", name);
        run_fused(&w, w.meta, 0, tag, NULL);
    }
    world_free(&w);
}

ATTN_TEST(test_mla_cuda_decode) {
    static const attn_dtype dts[2] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    mcfg c;
    int i;
    MLA_CUDA_SKIP();
    for (i = 0; i < 2; i++) { /* DeepSeek-V3 with 16 heads (tensor parallel 8), pages 64 and 16 */
        base_cfg(&c, 16, 512, dts[i], dts[i]);
        c.seed = 7000 + (uint64_t)i;
        c.bs = i ? 16 : 64;
        c.nref = 4;
        ADD_REQS(&c, {1, 1}, {1, 17}, {1, 700}, {1, 1500});
        gpu_world(&c, i ? "cuda decode H16 f16 bs16" : "cuda decode H16 bf16 bs64", 0);
    }
    base_cfg(&c, 128, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16); /* 128 heads: two CTAs per token */
    c.seed = 7100;
    c.bs = 64;
    c.nref = 5;
    ADD_REQS(&c, {1, 5}, {1, 640}, {1, 2100});
    gpu_world(&c, "cuda decode H128 bf16", 0);
    base_cfg(&c, 40, 256, ATTN_DTYPE_F16, ATTN_DTYPE_F16); /* 320 wide; heads not a multiple of 64 */
    c.seed = 7200;
    c.bs = 32;
    c.nref = 6;
    ADD_REQS(&c, {1, 1}, {1, 40}, {1, 1200});
    gpu_world(&c, "cuda decode 320 H40 f16", 0);
}

/* Speculative decodes (decode_threshold 4: up to 4 tokens per decode, causal among them)
   and a prefill after them. */
ATTN_TEST(test_mla_cuda_multi_token) {
    mcfg c;
    MLA_CUDA_SKIP();
    base_cfg(&c, 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.decode_threshold = 4;
    c.nref = 4;
    c.seed = 7300;
    ADD_REQS(&c, {3, 3}, {4, 300}, {1, 50}, {2, 1300}, {9, 200});
    gpu_world(&c, "cuda spec-decode", 0);
}

/* Prefills: chunked (context before), fresh, tiny, across 128-query tiles; the 320 shape;
   a prefill over several up-projection chunks (a small workspace) merged by LSE. */
ATTN_TEST(test_mla_cuda_prefill) {
    mcfg c;
    MLA_CUDA_SKIP();
    base_cfg(&c, 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 7400;
    c.nref = 4;
    c.write_new = 0;
    ADD_REQS(&c, {37, 400}, {70, 70}, {2, 2}, {33, 34});
    add_req(&c, 300, 300); /* three query tiles */
    gpu_world(&c, "cuda prefill bf16", 0);
    base_cfg(&c, 16, 512, ATTN_DTYPE_F16, ATTN_DTYPE_F16);
    c.seed = 7401;
    c.nref = 4;
    c.bs = 32;
    add_req(&c, 130, 500);
    add_req(&c, 64, 64);
    gpu_world(&c, "cuda prefill f16", 0);
    base_cfg(&c, 24, 256, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 7402;
    c.nref = 6;
    add_req(&c, 45, 500);
    add_req(&c, 64, 64);
    gpu_world(&c, "cuda prefill 320", 0);
    /* 1 MiB of workspace: chunks of 192 keys at 16 heads (16 x 256 x 2 + 1152 bytes a key) */
    base_cfg(&c, 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 7403;
    c.nref = 4;
    c.bs = 64;
    c.workspace_bytes = 1 << 20;
    add_req(&c, 1, 900);   /* a decode (decodes first) */
    add_req(&c, 40, 700);  /* chunked prefill: keys over several chunks */
    add_req(&c, 400, 400); /* fresh: the causal edge crosses chunks */
    gpu_world(&c, "cuda prefill over chunks", 0);
}

/* Decodes, zero-token requests, chunked and fresh prefills in one batch. */
ATTN_TEST(test_mla_cuda_mixed_batch) {
    mcfg c;
    int i;
    MLA_CUDA_SKIP();
    for (i = 0; i < 2; i++) {
        base_cfg(&c, i ? 128 : 16, 512, i ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16, i ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16);
        c.seed = 7500 + (uint64_t)i;
        c.nref = 4;
        c.write_new = 0;
        c.pad = 2;
        ADD_REQS(&c, {1, 1100}, {1, 1}, {0, 30}, {1, 77}, {25, 200}, {40, 40}, {3, 90});
        gpu_world(&c, i ? "cuda mixed H128 f16" : "cuda mixed H16 bf16", 0);
    }
}

/* The same decode batch with num_kv_splits forced to 1, 2, 7, 32 (32 leaves empty splits
   over short contexts), and automatic. */
ATTN_TEST(test_mla_cuda_splits) {
    /* 7, 12 and 32 split entries take the merge's 128-, 256- and 512-thread CTAs
       (attn__mla_merge_threads) */
    static const int splits[] = {1, 2, 7, 12, 32, 0};
    int k;
    MLA_CUDA_SKIP();
    for (k = 0; k < 6; k++) {
        mcfg c;
        char name[64];
        base_cfg(&c, k & 1 ? 128 : 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
        c.seed = 7600;
        c.nref = 3;
        c.bs = 64;
        ADD_REQS(&c, {1, 2}, {1, 3000}, {1, 65}, {1, 700});
        snprintf(name, sizeof name, "cuda splits %d H%d", splits[k], c.H);
        gpu_world(&c, name, splits[k]);
    }
}

/* Random batches on the GPU: heads, latent width, page size, decode threshold, dtype, pads,
   scales, splits. */
ATTN_TEST(test_mla_cuda_random_batches) {
    rng r;
    int n = (int)(10 * test_scale()), k;
    MLA_CUDA_SKIP();
    if (n < 3) n = 3;
    rng_seed(&r, 0xc0dafeed5eedull);
    for (k = 0; k < n; k++) {
        static const int heads[] = {1, 16, 40, 64, 128};
        static const int blocks[] = {16, 32, 64, 128};
        mcfg c;
        int i, nd, np, f0 = attn_test_current_failed();
        char tag[160];
        base_cfg(&c, heads[rng_int(&r, 0, 4)], rng_int(&r, 0, 2) ? 512 : 256,
                 rng_int(&r, 0, 1) ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16, ATTN_DTYPE_AUTO);
        c.kvdt = c.dt;
        c.bs = blocks[rng_int(&r, 0, 3)];
        random_world_knobs(&r, &c);
        nd = rng_int(&r, 0, 6);
        np = rng_int(&r, nd ? 0 : 1, 3);
        for (i = 0; i < nd; i++) {
            int thr = c.decode_threshold ? c.decode_threshold : 1;
            int ql = rng_int(&r, 1, thr);
            add_req(&c, ql, ql + rng_int(&r, 0, rng_int(&r, 0, 3) ? 500 : 3000));
        }
        for (i = 0; i < np; i++) {
            int thr = c.decode_threshold ? c.decode_threshold : 1;
            int ql = rng_int(&r, thr + 1, 300);
            add_req(&c, ql, rng_int(&r, 0, 1) ? ql : ql + rng_int(&r, 1, 600));
        }
        snprintf(tag, sizeof tag, "cuda random case %d: H=%d R=%d %s bs=%d thr=%d reqs=%d+%d scale=%g", k, c.H, c.R,
                 attn_dtype_name(c.dt), c.bs, c.decode_threshold, nd, np, (double)c.scale);
        gpu_world(&c, tag, rng_int(&r, 0, 3) == 0 ? rng_int(&r, 1, 9) : 0);
        if (attn_test_current_failed() > f0) printf("    in %s\n", tag);
    }
}

/* The GPU against the portable C path on the same world: the fused call's outputs agree
   within the two paths' bounds (each is also checked against float64). */
ATTN_TEST(test_mla_cuda_matches_cpu) {
    mcfg c;
    mworld wc, wg;
    float *oc = NULL, *og = NULL;
    int x, bad = 0;
    double at, rt, lt, rms = 0;
    MLA_CUDA_SKIP();
    base_cfg(&c, 32, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 7700;
    c.nref = 4;
    c.bs = 64;
    ADD_REQS(&c, {1, 900}, {1, 33}, {50, 300}, {64, 64});
    REQUIRE(world_open(&wc, &c, 0));
    c.cuda = 1;
    if (!world_open(&wg, &c, 0)) {
        world_free(&wc);
        return;
    }
    run_fused(&wc, wc.meta, 0, "cpu fused", &oc);
    run_fused(&wg, wg.meta, 0, "cuda fused", &og);
    if (oc && og) {
        world_tol(&wg, &at, &rt, &lt);
        for (x = 0; x < wc.ntok * c.H * VDIM; x++) rms += (double)oc[x] * oc[x];
        rms = sqrt(rms / (wc.ntok * c.H * VDIM));
        for (x = 0; x < wc.ntok * c.H * VDIM; x++)
            if (!attn_test_near(og[x], oc[x], 2 * at * rms, 2 * rt) && bad++ < 3)
                attn_test_fail(__FILE__, __LINE__, "cuda vs cpu: out element %d: %.7g vs %.7g (rms %.3g)", x,
                               (double)og[x], (double)oc[x], rms);
    }
    free(oc);
    free(og);
    world_free(&wc);
    world_free(&wg);
}

/* ATTN_BATCH_INVARIANT=1: one split, and a request's forward_mqa rows are bitwise the same
   alone and in a batch (another page layout too). */
ATTN_TEST(test_mla_cuda_batch_invariant) {
    mcfg one, many;
    mworld wa, wb;
    attn_metadata *ma = NULL, *mb = NULL;
    int H = 128, R = 512;
    attn_test_env saved_env;
    MLA_CUDA_SKIP();
    base_cfg(&one, H, R, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    one.nref = 2;
    one.seed = 7800;
    one.wseed = 56;
    one.bs = 64;
    one.cuda = 1;
    add_req(&one, 1, 2100);
    many = one;
    ADD_REQS(&many, {1, 900}, {1, 3000}, {1, 3}, {20, 120});
    many.bs = 32;
    REQUIRE(world_init(&wa, &one));
    if (!world_init(&wb, &many)) {
        world_free(&wa);
        return;
    }
    saved_env = attn_test_env_save("ATTN_BATCH_INVARIANT");
    setenv("ATTN_BATCH_INVARIANT", "1", 1);
    ma = world_meta(&wa, 0, NULL);
    mb = world_meta(&wb, 0, NULL);
    attn_test_env_restore(&saved_env);
    EXPECT_TRUE(ma != NULL && mb != NULL);
    if (ma && mb) check_invariant_rows(&wa, ma, &wb, mb, 0, "cuda ");
    attn_metadata_destroy(ma);
    attn_metadata_destroy(mb);
    world_free(&wa);
    world_free(&wb);
}

/* fp8 latents (per-tensor scale) on the GPU: CUDA_MLA reads them (CUDA_MLA_SM90's wgmma
   kernels take 16-bit latents only: the selector passes it over with that reason) — decode
   at 16 / 32 / 128 heads (the 8-key and 16-key S paths), e4m3 and e5m2, the 320 shape,
   speculative decodes, prefills over several up-projection chunks (the gather dequantizes),
   splits, the fused call writing the cache (quantizing on the device) — against float64 of
   the values the cache holds and against CPU_MLA. */
ATTN_TEST(test_mla_cuda_fp8_latent) {
    static const struct { int H, R; attn_dtype dt, kvdt; float ks; int splits; } cases[] = {
        {16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3, 1.0f / 64, 0},
        {32, 512, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E5M2, 1.0f / 8, 7},
        {128, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3, 1.0f, 1},
        {40, 256, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, 1.0f / 16, 0}};
    int i;
    MLA_CUDA_SKIP_FOR(1);
    for (i = 0; i < 4; i++) {
        mcfg c;
        char name[96];
        base_cfg(&c, cases[i].H, cases[i].R, cases[i].dt, cases[i].kvdt);
        c.ks = cases[i].ks;
        c.cuda = 2;
        c.seed = 8200 + (uint64_t)i;
        c.nref = 4;
        c.write_new = i & 1;
        c.bs = i == 3 ? 32 : 64;
        c.decode_threshold = i == 1 ? 2 : 0;
        if (i == 0) c.workspace_bytes = 1 << 20; /* prefill over several chunks */
        ADD_REQS(&c, {1, 1}, {1, 700}, {1, 1500});
        if (i == 1) add_req(&c, 2, 90); /* a speculative decode */
        add_req(&c, 20, 150);           /* chunked prefill */
        add_req(&c, 33, 33);            /* fresh prefill */
        snprintf(name, sizeof name, "cuda fp8 H%d R%d %s/%s", c.H, c.R, attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
        gpu_world(&c, name, cases[i].splits);
    }
}

/* The portable fallback CUDA_MLA (mma.sync kernels, sm_80+), forced on this device: the
   decode, prefill, mixed, split and random worlds above, against the same reference. */
ATTN_TEST(test_mla_cuda_fallback) {
    static const int splits[] = {1, 7, 0};
    mcfg c;
    int i, k;
    rng r;
    MLA_CUDA_SKIP_FOR(1);
    for (i = 0; i < 3; i++) { /* 16 heads (ROWS 16), 32 (ROWS 32), 128 (ROWS 64) */
        static const int heads[3] = {16, 32, 128};
        char name[64];
        base_cfg(&c, heads[i], 512, i == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16, i == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16);
        c.cuda = 2;
        c.seed = 7900 + (uint64_t)i;
        c.bs = i == 1 ? 16 : 64;
        c.nref = 4;
        ADD_REQS(&c, {1, 1}, {1, 700}, {1, 1500});
        snprintf(name, sizeof name, "fallback decode H%d", heads[i]);
        gpu_world(&c, name, splits[i]);
    }
    base_cfg(&c, 40, 256, ATTN_DTYPE_F16, ATTN_DTYPE_F16); /* 320 wide */
    c.cuda = 2;
    c.seed = 7910;
    c.bs = 32;
    c.nref = 6;
    ADD_REQS(&c, {1, 40}, {1, 1200}, {45, 300});
    gpu_world(&c, "fallback 320 H40 mixed", 0);
    base_cfg(&c, 16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16); /* prefill over several chunks */
    c.cuda = 2;
    c.seed = 7911;
    c.nref = 4;
    c.bs = 64;
    c.workspace_bytes = 1 << 20;
    c.write_new = 0;
    ADD_REQS(&c, {1, 900}, {40, 700}, {150, 150});
    gpu_world(&c, "fallback prefill over chunks", 0);
    rng_seed(&r, 0xfa11bacc5eedull);
    for (k = 0; k < 3; k++) {
        static const int hs[] = {16, 64, 128};
        int nd = rng_int(&r, 1, 4), np = rng_int(&r, 0, 2);
        char tag[96];
        base_cfg(&c, hs[k], rng_int(&r, 0, 2) ? 512 : 256, rng_int(&r, 0, 1) ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16,
                 ATTN_DTYPE_AUTO);
        c.kvdt = c.dt;
        c.cuda = 2;
        c.seed = rng_next(&r);
        c.nref = 3;
        c.bs = 16 << rng_int(&r, 0, 3);
        c.write_new = rng_int(&r, 0, 1);
        for (i = 0; i < nd; i++) add_req(&c, 1, 1 + rng_int(&r, 0, 2000));
        for (i = 0; i < np; i++) {
            int ql = rng_int(&r, 2, 200);
            add_req(&c, ql, ql + rng_int(&r, 0, 300));
        }
        snprintf(tag, sizeof tag, "fallback random %d: H=%d R=%d %s bs=%d reqs=%d+%d", k, c.H, c.R,
                 attn_dtype_name(c.dt), c.bs, nd, np);
        gpu_world(&c, tag, 0);
    }
}

void suite_cuda_mla(void) {
    ATTN_RUN(test_mla_cuda_decode);
    ATTN_RUN(test_mla_cuda_multi_token);
    ATTN_RUN(test_mla_cuda_prefill);
    ATTN_RUN(test_mla_cuda_mixed_batch);
    ATTN_RUN(test_mla_cuda_splits);
    ATTN_RUN(test_mla_cuda_matches_cpu);
    ATTN_RUN(test_mla_cuda_batch_invariant);
    ATTN_RUN(test_mla_cuda_random_batches);
    ATTN_RUN(test_mla_cuda_fallback);
    ATTN_RUN(test_mla_cuda_fp8_latent);
}
