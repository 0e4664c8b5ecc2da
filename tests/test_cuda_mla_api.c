/* MLA on the GPU through the public API: what an MLA layer on the device resolves to
   (CUDA_MLA_SM90, the CUDA_MLA fallback, the reasons named); forward_mqa and the fused call
   captured in CUDA graphs and replayed after new builds, against CPU_MLA; rows the kernels
   cannot copy in 16-byte pieces refused by name. Every test SKIPs (with the reason) where
   the platform has no such device. (The numerics of CUDA_MLA_SM90 against float64 and
   CPU_MLA: tests/test_mla_cuda.c, suite_cuda_mla.) */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "cuda_fixtures.h"

#include <dlfcn.h>
#include <math.h>
#include <string.h>

static attn_layer_desc cu_mla_desc(int H, attn_dtype dt, attn_device_kind dev) {
    attn_layer_desc d;
    memset(&d, 0, sizeof d);
    d.use_mla = 1; d.num_heads = H; d.head_size = 576; d.kv_lora_rank = 512; d.qk_rope_head_dim = 64;
    d.qk_nope_head_dim = 128; d.v_head_dim = 128; d.dtype = dt; d.block_size = 64; d.device = dev;
    return d;
}

/* An MLA layer on the device resolves to CUDA_MLA_SM90 on compute capability 9.0 (the record
   says so), elsewhere to nothing with CUDA_MLA_SM90's reason; f32 is outside its scope. */
ATTN_TEST(cuda_mla_selected_for_device_layers) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_selection s;
    attn_platform p;
    CU_SKIP_IF_NO_GPU(ctx);
    attn_platform_get(ctx, &p);
    d = cu_mla_desc(128, ATTN_DTYPE_BF16, ATTN_DEVICE_CUDA);
    memset(&s, 0, sizeof s);
    if (p.cuda_capability_major == 9 && p.cuda_capability_minor == 0 && p.cublas_version) {
        EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
        EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA_MLA_SM90);
        EXPECT_EQ_INT(s.default_backend, ATTN_BACKEND_CUDA_MLA_SM90);
        EXPECT_EQ_INT(s.cuda_graph, ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE);
        EXPECT_TRUE(s.can_return_lse);
    } else if (p.cublas_version) { /* the mma.sync fallback, and the record says why not the wgmma one */
        EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
        EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA_MLA);
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA_SM90, "compute capability"));
    } else {
        EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA, "cuBLAS"));
    }
    d.dtype = ATTN_DTYPE_F32; /* outside every GPU MLA scope: refused with the reason */
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA_SM90, ""));
    d = cu_mla_desc(16, ATTN_DTYPE_BF16, ATTN_DEVICE_CUDA);
    d.qk_nope_head_dim = 96; /* the prefill kernel takes 128 / 128 and 64 / 64 */
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(attn_select_backend(ctx, &d, NULL, &s), ATTN_ERROR_UNSUPPORTED);
    if (p.cuda_capability_major == 9 && p.cuda_capability_minor == 0)
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA_SM90, "qk_nope_head_dim 96"));
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA, "qk_nope_head_dim 96"));
    if (p.cublas_version) { /* an fp8 latent: CUDA_MLA; the wgmma backend says why not */
        d = cu_mla_desc(16, ATTN_DTYPE_BF16, ATTN_DEVICE_CUDA);
        d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
        d.k_scale.value = 0.5f;
        memset(&s, 0, sizeof s);
        EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
        EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA_MLA);
        if (p.cuda_capability_major == 9 && p.cuda_capability_minor == 0)
            EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA_SM90, "fp8_e4m3"));
        d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD; /* latents: per tensor only */
        d.k_scale.value = 0.0f;
        memset(&s, 0, sizeof s);
        EXPECT_TRUE(attn_select_backend(ctx, &d, NULL, &s) != ATTN_OK);
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_MLA, "PER_TOKEN_HEAD"));
    }
    d = cu_mla_desc(16, ATTN_DTYPE_BF16, ATTN_DEVICE_CPU); /* CPU tensors stay on the CPU */
    memset(&s, 0, sizeof s);
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU_MLA);
    attn_context_destroy(ctx);
}

static int cu_mla_sm90(attn_context *ctx) {
    attn_platform p;
    attn_platform_get(ctx, &p);
    return p.cuda_capability_major == 9 && p.cuda_capability_minor == 0 && p.cublas_version;
}

/* forward_mqa and the fused call captured once into CUDA graphs and replayed after new
   builds of other decode batches (more and fewer requests, with and without splits), each
   against CPU_MLA on the same data; the fused graph (cuBLAS projections inside) replays
   batches of its captured token count. Outputs past the batch stay untouched. */
ATTN_TEST(cuda_mla_graph_replays_after_new_builds) {
    enum { H = 128, R = 512, P = 64, D = 576, N = 128, V = 128, BS = 64, MAXR = 24, MAXB = 40, NB = MAXR * MAXB };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *graph[2] = {NULL, NULL}, *exec[2] = {NULL, NULL};
    cu_graph_api cg;
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, qpe, qn, kv, out, wuk, wuv;
    int round, bad = 0, x;
    int32_t bt[MAXR * MAXB];
    static uint16_t cpu_out[MAXR * H * R], gpu_out[MAXR * H * R];
    memset(&q, 0, sizeof q); memset(&qpe, 0, sizeof qpe); memset(&qn, 0, sizeof qn); memset(&kv, 0, sizeof kv);
    memset(&out, 0, sizeof out); memset(&wuk, 0, sizeof wuk); memset(&wuv, 0, sizeof wuv);
    CU_SKIP_IF_NO_GPU(ctx);
    if (!cu_mla_sm90(ctx)) { attn_context_destroy(ctx); SKIP("CUDA_MLA_SM90 needs compute capability 9.0 and cuBLAS"); }
    switch (cu_graph_open(&cg)) {
    case 1: attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test");
    case -1: goto done;
    }
    d = cu_mla_desc(H, ATTN_DTYPE_BF16, ATTN_DEVICE_CPU);
    memset(&md, 0, sizeof md);
    md.max_num_reqs = MAXR; md.max_num_tokens = MAXR; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!cu_layer_pair(ctx, &d, &md, &cpu, &gpu, &mc, &mg)) goto done;
    if (!cu_buf_make(ctx, &q, (size_t)MAXR * H * R * 2) || !cu_buf_make(ctx, &qpe, (size_t)MAXR * H * P * 2) ||
        !cu_buf_make(ctx, &qn, (size_t)MAXR * H * N * 2) || !cu_buf_make(ctx, &out, sizeof gpu_out) ||
        !cu_buf_make(ctx, &kv, (size_t)NB * BS * D * 2) || !cu_buf_make(ctx, &wuk, (size_t)H * N * R * 2) ||
        !cu_buf_make(ctx, &wuv, (size_t)H * R * V * 2)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, (size_t)MAXR * H * R, 0.5f);
    cu_fill(qpe.host, ATTN_DTYPE_BF16, (size_t)MAXR * H * P, 2.0f);
    cu_fill(qn.host, ATTN_DTYPE_BF16, (size_t)MAXR * H * N, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, (size_t)NB * BS * D, 2.0f);
    cu_fill(wuk.host, ATTN_DTYPE_BF16, (size_t)H * N * R, 0.2f);
    cu_fill(wuv.host, ATTN_DTYPE_BF16, (size_t)H * R * V, 0.2f);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &qpe) || !cu_up(ctx, &qn) || !cu_up(ctx, &kv) || !cu_up(ctx, &wuk) ||
        !cu_up(ctx, &wuv)) goto done;
    for (x = 0; x < MAXR * MAXB; x++) bt[x] = (x * 37) % NB;
    for (round = 0; round < 6 && !bad; round++) {
        /* rounds 0, 2, 4: 8 decodes (the fused graph's token count); 1: 2 long decodes (many
           splits); 3: 24 decodes of a few hundred keys; 5: 1 decode of 2500 keys */
        static const int nreqs[6] = {8, 2, 8, 24, 8, 1};
        int32_t qsl[MAXR + 1], seq[MAXR];
        int nreq = nreqs[round], r, maxs = 0, g, T;
        attn_batch b;
        qsl[0] = 0;
        for (r = 0; r < nreq; r++) {
            seq[r] = nreq == 2 ? 2000 + 400 * r : nreq == 1 ? 2500 : 40 + (97 * r + 311 * round) % 900;
            qsl[r + 1] = r + 1;
            maxs = seq[r] > maxs ? seq[r] : maxs;
        }
        T = nreq;
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = nreq; b.num_actual_tokens = T; b.max_query_len = 1; b.max_seq_len = maxs;
        b.stream = cg.stream;
        EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(mg, 0, &b, 0));
        for (g = 0; g < 2 && !bad; g++) { /* 0: forward_mqa, 1: the fused call */
            const int W = g ? V : R;
            attn_tensor gq = cu_tensor(g ? qn.dev : q.dev, ATTN_DTYPE_BF16, 3, g ? T : MAXR, H, g ? N : R, 1);
            attn_tensor gp = cu_tensor(qpe.dev, ATTN_DTYPE_BF16, 3, g ? T : MAXR, H, P, 1);
            attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, g ? T : MAXR, H, W, 1);
            attn_tensor gc = cu_tensor(kv.dev, ATTN_DTYPE_BF16, 3, NB, BS, D, 1);
            attn_tensor gk = cu_tensor(wuk.dev, ATTN_DTYPE_BF16, 3, H, N, R, 1);
            attn_tensor gv = cu_tensor(wuv.dev, ATTN_DTYPE_BF16, 3, H, R, V, 1);
            attn_tensor hq = cu_tensor(g ? qn.host : q.host, ATTN_DTYPE_BF16, 3, T, H, g ? N : R, 0);
            attn_tensor hp = cu_tensor(qpe.host, ATTN_DTYPE_BF16, 3, T, H, P, 0);
            attn_tensor ho = cu_tensor(cpu_out, ATTN_DTYPE_BF16, 3, T, H, W, 0);
            attn_tensor hc = cu_tensor(kv.host, ATTN_DTYPE_BF16, 3, NB, BS, D, 0);
            attn_tensor hk = cu_tensor(wuk.host, ATTN_DTYPE_BF16, 3, H, N, R, 0);
            attn_tensor hv = cu_tensor(wuv.host, ATTN_DTYPE_BF16, 3, H, R, V, 0);
            double rms = 0;
            if (g == 1 && nreq != 8) continue;
            if (round == 0) { /* capture once */
                attn_status st;
                EXPECT_EQ_INT(cg.begin(cg.stream, 2 /* relaxed */), 0);
                if (!g) { /* the backend declares single-token decodes: a prefill call is refused, unrecorded */
                    attn_tensor gqh = cu_tensor(qn.dev, ATTN_DTYPE_BF16, 3, 1, H, N + P, 1);
                    attn_tensor goh = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, 1, H, V, 1);
                    EXPECT_STATUS(attn_mla_forward_mha(gpu, mg, &gqh, &gc, &gk, &gv, &goh, NULL, cg.stream),
                                  ATTN_ERROR_UNSUPPORTED);
                    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "UNIFORM_SINGLE_TOKEN_DECODE") != NULL);
                }
                st = g ? attn_mla_forward(gpu, mg, &gq, &gp, NULL, NULL, &gc, &gk, &gv, &go, cg.stream)
                       : attn_mla_forward_mqa(gpu, mg, &gq, &gp, &gc, &go, NULL, cg.stream);
                EXPECT_OK(st);
                EXPECT_EQ_INT(cg.end(cg.stream, &graph[g]), 0);
                if (!graph[g] || cg.instantiate(&exec[g], graph[g], 0) != 0) {
                    attn_test_fail(__FILE__, __LINE__, "graph %d capture / instantiate failed", g);
                    bad++;
                    break;
                }
            }
            memset(out.host, 0xff, out.bytes);
            if (!cu_up(ctx, &out)) { bad++; break; }
            EXPECT_EQ_INT(cg.launch(exec[g], cg.stream), 0);
            EXPECT_EQ_INT(cg.sync(cg.stream), 0);
            if (g) EXPECT_OK(attn_mla_forward(cpu, mc, &hq, &hp, NULL, NULL, &hc, &hk, &hv, &ho, NULL));
            else EXPECT_OK(attn_mla_forward_mqa(cpu, mc, &hq, &hp, &hc, &ho, NULL, NULL));
            if (!cu_down(ctx, &out, gpu_out)) { bad++; break; }
            for (x = 0; x < T * H * W; x++) rms += (double)attn_bf16_to_f32(cpu_out[x]) * attn_bf16_to_f32(cpu_out[x]);
            rms = sqrt(rms / (T * H * W)) + 1e-6;
            for (x = 0; x < T * H * W && bad < 4; x++) {
                float a = attn_bf16_to_f32(cpu_out[x]), o = attn_bf16_to_f32(gpu_out[x]);
                if (!(fabs(a - o) <= 4e-2 * rms + 2e-2 * fabs(a))) {
                    attn_test_fail(__FILE__, __LINE__, "round %d %s out[%d]: cpu %g, graph replay %g (rms %g)", round,
                                   g ? "fused" : "mqa", x, a, o, rms);
                    bad++;
                }
            }
            for (x = T * H * W; x < MAXR * H * W && bad < 4 && !g; x++)
                if (gpu_out[x] != 0xffff) {
                    attn_test_fail(__FILE__, __LINE__, "round %d: out past the batch written at %d", round, x);
                    bad++;
                }
        }
    }
    EXPECT_EQ_INT(bad, 0);
done:
    for (x = 0; x < 2; x++) {
        if (exec[x]) cg.exec_destroy(exec[x]);
        if (graph[x]) cg.graph_destroy(graph[x]);
    }
    cu_graph_close(&cg);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &qpe); cu_buf_free(ctx, &qn); cu_buf_free(ctx, &kv);
    cu_buf_free(ctx, &out); cu_buf_free(ctx, &wuk); cu_buf_free(ctx, &wuv);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (cg.lib) dlclose(cg.lib);
}

/* Rows the MLA kernels cannot copy in 16-byte pieces are refused by name, before anything
   is written (outputs unchanged). */
ATTN_TEST(cuda_mla_unaligned_rows_refused) {
    enum { H = 16, R = 512, D = 576, BS = 64, NB = 4 };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *gpu = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b;
    cu_buf q, kv, out;
    int32_t qsl[2] = {0, 1}, seq[1] = {100}, bt[4] = {0, 1, 2, 3};
    static uint16_t after[H * (R + 4) + 64];
    int x, changed = 0;
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out);
    CU_SKIP_IF_NO_GPU(ctx);
    if (!cu_mla_sm90(ctx)) { attn_context_destroy(ctx); SKIP("CUDA_MLA_SM90 needs compute capability 9.0 and cuBLAS"); }
    d = cu_mla_desc(H, ATTN_DTYPE_BF16, ATTN_DEVICE_CUDA);
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 4; md.num_blocks = NB;
    if (!gpu || attn_metadata_create(gpu, &md, &m) != ATTN_OK) goto done;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 4;
    b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 100;
    EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
    if (!cu_buf_make(ctx, &q, (size_t)H * D * 2 + 64) || !cu_buf_make(ctx, &kv, (size_t)NB * BS * D * 2 + 64) ||
        !cu_buf_make(ctx, &out, sizeof after)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, (size_t)H * D, 1.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, (size_t)NB * BS * D, 1.0f);
    memset(out.host, 0xff, out.bytes);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &kv) || !cu_up(ctx, &out)) goto done;
    {
        attn_tensor gq = cu_tensor((char *)q.dev + 2, ATTN_DTYPE_BF16, 3, 1, H, D, 1); /* 2 bytes off */
        attn_tensor gc = cu_tensor(kv.dev, ATTN_DTYPE_BF16, 3, NB, BS, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, 1, H, R, 1);
        EXPECT_STATUS(attn_mla_forward_mqa(gpu, m, &gq, NULL, &gc, &go, NULL, NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "q rows are not 16-byte aligned") != NULL);
        gq.data = q.dev;
        go.strides[0] = (int64_t)H * (R + 4); go.strides[1] = R + 4; go.strides[2] = 1; /* 8-byte head stride */
        EXPECT_STATUS(attn_mla_forward_mqa(gpu, m, &gq, NULL, &gc, &go, NULL, NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "out_latent rows are not 16-byte aligned") != NULL);
        go.strides[0] = (int64_t)H * R; go.strides[1] = R;
        gc.data = (char *)kv.dev + 2; /* a cache 2 bytes off (the buffer has 64 to spare): refused before any launch */
        EXPECT_STATUS(attn_mla_forward_mqa(gpu, m, &gq, NULL, &gc, &go, NULL, NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "kv_cache.data") != NULL &&
                    strstr(attn_context_last_error(ctx), "16-byte aligned") != NULL);
    }
    if (!cu_down(ctx, &out, after)) goto done;
    for (x = 0; x < (int)(sizeof after / 2); x++) changed |= after[x] != 0xffff;
    EXPECT_EQ_INT(changed, 0);
done:
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out);
    attn_metadata_destroy(m);
    attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
}

void suite_cuda_mla_api(void) {
    ATTN_RUN(cuda_mla_selected_for_device_layers);
    ATTN_RUN(cuda_mla_graph_replays_after_new_builds);
    ATTN_RUN(cuda_mla_unaligned_rows_refused);
}
