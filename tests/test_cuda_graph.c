/* CUDA graphs through the public API: one forward captured once (libcuda's graph calls,
   opened by the tests) and replayed after new builds of other batches, causal and not, with
   splits, more tiles than SMs and a cascade; a cache write from device slots captured with
   the forward; an fp8 layer whose device scales and sinks change between replays. Each
   replay against the CPU layer on the same data. Every test SKIPs (with the reason) where
   the platform has no CUDA device or the test cannot open libcuda. (MLA's graphs:
   tests/test_cuda_mla_api.c.) */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "cuda_fixtures.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Captures one forward of `gpu` on cg's stream (relaxed mode) into *graph / *exec; 1 on
   success. */
static int cu_capture_forward(cu_graph_api *cg, attn_layer *gpu, attn_metadata *mg, const attn_tensor *q,
                              attn_tensor *cache, attn_tensor *out, void **graph, void **exec) {
    EXPECT_EQ_INT(cg->begin(cg->stream, 2 /* relaxed */), 0);
    EXPECT_OK(attn_layer_forward(gpu, mg, q, NULL, NULL, cache, out, NULL, cg->stream));
    EXPECT_EQ_INT(cg->end(cg->stream, graph), 0);
    if (!*graph || cg->instantiate(exec, *graph, 0) != 0) {
        attn_test_fail(__FILE__, __LINE__, "graph capture / instantiate failed");
        return 0;
    }
    return 1;
}

/* One round of a graph test: the captured forward replayed into out (poisoned first), the
   CPU layer's forward on the host tensors into cpu_out, and the n bf16 outputs compared
   within atol + rtol |cpu| (the first differences named after `what`). Returns the
   failures, at most 4 (a replay or copy that fails counts one). */
static int cu_replay_matches_cpu(attn_context *ctx, cu_graph_api *cg, void *exec, cu_buf *out, attn_layer *cpu,
                                 attn_metadata *mc, const attn_tensor *hq, attn_tensor *hc, attn_tensor *ho,
                                 const uint16_t *cpu_out, uint16_t *gpu_out, int n, float atol, float rtol,
                                 const char *what) {
    int x, bad = 0;
    memset(out->host, 0xff, out->bytes);
    if (!cu_up(ctx, out)) return 1;
    EXPECT_EQ_INT(cg->launch(exec, cg->stream), 0);
    EXPECT_EQ_INT(cg->sync(cg->stream), 0);
    EXPECT_OK(attn_layer_forward(cpu, mc, hq, NULL, NULL, hc, ho, NULL, NULL));
    if (!cu_down(ctx, out, gpu_out)) return 1;
    for (x = 0; x < n && bad < 4; x++) {
        float a = attn_bf16_to_f32(cpu_out[x]), g = attn_bf16_to_f32(gpu_out[x]);
        if (!(fabsf(a - g) <= atol + rtol * fabsf(a))) {
            attn_test_fail(__FILE__, __LINE__, "%s out[%d]: cpu %g, graph replay %g", what, x, a, g);
            bad++;
        }
    }
    return bad;
}

ATTN_TEST(cuda_graph_replays_after_new_builds) {
    /* round 3 reaches 1750 keys; round 4 has 24 decodes, 192 (request, KV head) tiles: past
       the SM count, so on a device with the wide decode shape the graph captured on a
       wide build (round 0) replays the default shape's launch */
    enum { H = 32, HKV = 8, D = 128, BS = 16, MAXR = 24, MAXT = 32, MAXB = 112, NB = 8 * MAXB };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *graph = NULL, *exec = NULL;
    cu_graph_api cg;
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, kv, out;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, round, bad = 0;
    int32_t bt[MAXR * MAXB];
    static uint16_t cpu_out[MAXT * H * D], gpu_out[MAXT * H * D];
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out);
    CU_SKIP_IF_NO_GPU(ctx);
    switch (cu_graph_open(&cg)) {
    case 1: attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test");
    case -1: goto done;
    }
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = MAXR; md.max_num_tokens = MAXT; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!cu_layer_pair(ctx, &d, &md, &cpu, &gpu, &mc, &mg)) goto done;
    attn_layer_kv_cache_shape(gpu, NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, sizeof cpu_out) || !cu_buf_make(ctx, &out, sizeof cpu_out) ||
        !cu_buf_make(ctx, &kv, (size_t)NB * 2 * BS * HKV * D * 2)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, MAXT * H * D, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, (size_t)NB * 2 * BS * HKV * D, 2.0f);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &kv)) goto done;
    {
        int i;
        for (i = 0; i < MAXR * MAXB; i++) bt[i] = (i * 37) % NB;
    }
    for (round = 0; round < 7 && !bad; round++) {
        /* a new batch each round: decodes and a short prefill, other lengths; round 5 a
           cascade (8 decodes sharing 256 keys: the captured prefix pass, then the decode
           tiles' join), round 6 the same batch without it (a replay that joins nothing) */
        int32_t qsl[MAXR + 1], seq[MAXR];
        int nreq = round == 4 ? 24 : round >= 5 ? 8 : 2 + round, r, maxq = 0, maxs = 0;
        int prefix = round == 5 ? 256 : 0;
        attn_batch b;
        attn_tensor hq = cu_tensor(q.host, ATTN_DTYPE_BF16, 3, MAXT, H, D, 0);
        attn_tensor ho = cu_tensor(cpu_out, ATTN_DTYPE_BF16, 3, MAXT, H, D, 0);
        attn_tensor hc = attn_tensor_make(kv.host, ATTN_DTYPE_BF16, ndim, shape);
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, MAXT, H, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, MAXT, H, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        qsl[0] = 0;
        for (r = 0; r < nreq; r++) {
            /* the captured build (round 0) has decodes only, no split and no prefill tile:
               the graph must still hold every launch the later rounds need (a prefill of
               8..12 tokens is past the 4-token decode tile; 1750 keys split) */
            int ql = r == nreq - 1 && round > 0 && round < 4 ? 6 + 2 * round : 1;
            seq[r] = round == 4 ? 64 + 37 * r : round >= 5 ? 300 + 97 * r : 100 + 300 * r + 150 * round;
            if (round == 5) memcpy(bt + r * MAXB, bt, (size_t)(prefix / BS) * sizeof bt[0]);
            qsl[r + 1] = qsl[r] + ql;
            maxq = ql > maxq ? ql : maxq;
            maxs = seq[r] > maxs ? seq[r] : maxs;
        }
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = nreq; b.num_actual_tokens = qsl[nreq]; b.max_query_len = maxq; b.max_seq_len = maxs;
        b.stream = cg.stream;
        b.causal = round % 2 ? ATTN_CAUSAL_NO : ATTN_CAUSAL_DEFAULT; /* the graph follows the build */
        EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(mg, prefix, &b, 0));
        if (round == 0 && !cu_capture_forward(&cg, gpu, mg, &gq, &gc, &go, &graph, &exec)) { /* capture once */
            bad++;
            break;
        }
        {
            char what[32];
            snprintf(what, sizeof what, "round %d", round);
            bad += cu_replay_matches_cpu(ctx, &cg, exec, &out, cpu, mc, &hq, &hc, &ho, cpu_out, gpu_out, qsl[nreq] * H * D,
                                         3e-2f, 1e-2f, what);
        }
    }
    EXPECT_EQ_INT(bad, 0);
done:
    if (exec) cg.exec_destroy(exec);
    if (graph) cg.graph_destroy(graph);
    cu_graph_close(&cg);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (cg.lib) dlclose(cg.lib);
}

/* A cache write from device slots (vLLM's slot_mapping tensor) and a forward captured in
   one CUDA graph, replayed after new builds with new slots, keys and values written into the
   same device buffers: the cache bytes and the outputs follow, against the CPU layer doing
   the same from host slots. Then a device slot out of range: the write writes nothing. */
ATTN_TEST(cuda_graph_cache_write_from_device_slots) {
    enum { H = 8, HKV = 2, D = 64, BS = 16, MAXR = 4, MAXT = 8, MAXB = 8, NB = 40 };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *graph = NULL, *exec = NULL;
    cu_graph_api cg;
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, k, v, kv, out, sl;
    int64_t shape[ATTN_MAX_DIMS], one[1];
    int ndim = 0, round, bad = 0, x;
    int32_t bt[MAXR * MAXB];
    size_t cbytes = (size_t)NB * 2 * BS * HKV * D * 2;
    static uint16_t cpu_out[MAXT * H * D], gpu_out[MAXT * H * D];
    unsigned char *ref = NULL;
    memset(&q, 0, sizeof q); memset(&k, 0, sizeof k); memset(&v, 0, sizeof v);
    memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out); memset(&sl, 0, sizeof sl);
    CU_SKIP_IF_NO_GPU(ctx);
    switch (cu_graph_open(&cg)) {
    case 1: attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test");
    case -1: goto done;
    }
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    memset(&md, 0, sizeof md);
    md.max_num_reqs = MAXR; md.max_num_tokens = MAXT; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!cu_layer_pair(ctx, &d, &md, &cpu, &gpu, &mc, &mg)) goto done;
    attn_layer_kv_cache_shape(gpu, NB, shape, &ndim);
    ref = (unsigned char *)malloc(cbytes);
    if (!ref || !cu_buf_make(ctx, &q, sizeof cpu_out) || !cu_buf_make(ctx, &out, sizeof cpu_out) ||
        !cu_buf_make(ctx, &k, (size_t)MAXT * HKV * D * 2) || !cu_buf_make(ctx, &v, (size_t)MAXT * HKV * D * 2) ||
        !cu_buf_make(ctx, &sl, MAXT * 8) || !cu_buf_make(ctx, &kv, cbytes)) goto done;
    cu_fill(kv.host, ATTN_DTYPE_BF16, cbytes / 2, 2.0f); /* every earlier token's K/V */
    memcpy(ref, kv.host, cbytes);
    if (!cu_up(ctx, &kv)) goto done;
    for (x = 0; x < MAXR * MAXB; x++) bt[x] = (x * 7 + 3) % NB; /* distinct blocks per request */
    for (round = 0; round < 4 && !bad; round++) {
        /* 4 requests: three decodes and (rounds 1, 3) a prefill of 5 tokens; every new
           token's slot from the block table */
        int32_t qsl[MAXR + 1], seq[MAXR];
        int64_t *hs = (int64_t *)sl.host;
        int r, t, maxq = 0, maxs = 0;
        attn_batch b;
        attn_tensor hq = cu_tensor(q.host, ATTN_DTYPE_BF16, 3, MAXT, H, D, 0);
        attn_tensor ho = cu_tensor(cpu_out, ATTN_DTYPE_BF16, 3, MAXT, H, D, 0);
        attn_tensor hc = attn_tensor_make(ref, ATTN_DTYPE_BF16, ndim, shape);
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, MAXT, H, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, MAXT, H, D, 1);
        attn_tensor gk = cu_tensor(k.dev, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 1);
        attn_tensor gv = cu_tensor(v.dev, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 1);
        attn_tensor hk = cu_tensor(k.host, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 0);
        attn_tensor hv = cu_tensor(v.host, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 0);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        attn_tensor gs;
        gc.device.kind = ATTN_DEVICE_CUDA;
        qsl[0] = 0;
        for (r = 0; r < MAXR; r++) {
            int ql = r == 3 && round % 2 ? 5 : 1;
            seq[r] = 20 + 9 * r + 13 * round;
            qsl[r + 1] = qsl[r] + ql;
            maxq = ql > maxq ? ql : maxq;
            maxs = seq[r] > maxs ? seq[r] : maxs;
            for (t = 0; t < ql; t++) {
                int pos = seq[r] - ql + t;
                hs[qsl[r] + t] = (int64_t)bt[r * MAXB + pos / BS] * BS + pos % BS;
            }
        }
        for (t = qsl[MAXR]; t < MAXT; t++) hs[t] = -1; /* the capacity's padding rows */
        one[0] = MAXT; /* the captured write covers the capacity; padding slots skip */
        gs = attn_tensor_make(sl.dev, ATTN_DTYPE_INT64, 1, one);
        gs.device.kind = ATTN_DEVICE_CUDA;
        cu_fill(q.host, ATTN_DTYPE_BF16, MAXT * H * D, 2.0f);
        cu_fill(k.host, ATTN_DTYPE_BF16, MAXT * HKV * D, 2.0f);
        cu_fill(v.host, ATTN_DTYPE_BF16, MAXT * HKV * D, 2.0f);
        if (!cu_up(ctx, &q) || !cu_up(ctx, &k) || !cu_up(ctx, &v) || !cu_up(ctx, &sl)) { bad++; break; }
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = MAXR; b.num_actual_tokens = qsl[MAXR]; b.max_query_len = maxq; b.max_seq_len = maxs;
        b.slot_mapping = hs;
        b.stream = cg.stream;
        EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(mg, 0, &b, 0));
        if (round == 0) { /* capture once: the write from the slot tensor, then the forward */
            EXPECT_EQ_INT(cg.begin(cg.stream, 2 /* relaxed */), 0);
            EXPECT_OK(attn_reshape_and_cache(gpu, &gk, &gv, &gc, &gs, cg.stream));
            EXPECT_OK(attn_layer_forward(gpu, mg, &gq, NULL, NULL, &gc, &go, NULL, cg.stream));
            EXPECT_EQ_INT(cg.end(cg.stream, &graph), 0);
            if (!graph || cg.instantiate(&exec, graph, 0) != 0) {
                attn_test_fail(__FILE__, __LINE__, "graph capture / instantiate failed");
                bad++;
                break;
            }
        }
        EXPECT_OK(attn_reshape_and_cache(cpu, &hk, &hv, &hc, ATTN_TEST_SLOTS(hs, qsl[MAXR]), NULL));
        {
            char what[32];
            snprintf(what, sizeof what, "round %d", round);
            bad += cu_replay_matches_cpu(ctx, &cg, exec, &out, cpu, mc, &hq, &hc, &ho, cpu_out, gpu_out,
                                         qsl[MAXR] * H * D, 3e-2f, 1e-2f, what);
        }
        if (cu_down(ctx, &kv, kv.host) && memcmp(kv.host, ref, cbytes) != 0) {
            attn_test_fail(__FILE__, __LINE__, "round %d: the cache written from device slots differs from the CPU's",
                           round);
            bad++;
        }
    }
    /* a slot out of range among good ones: no CTA writes (the cache keeps its bytes) */
    if (!bad) {
        int64_t *hs = (int64_t *)sl.host;
        attn_tensor gk = cu_tensor(k.dev, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 1);
        attn_tensor gv = cu_tensor(v.dev, ATTN_DTYPE_BF16, 3, MAXT, HKV, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape), gs;
        gc.device.kind = ATTN_DEVICE_CUDA;
        for (x = 0; x < MAXT; x++) hs[x] = x;
        hs[MAXT - 1] = (int64_t)NB * BS; /* one past the last slot */
        one[0] = MAXT;
        gs = attn_tensor_make(sl.dev, ATTN_DTYPE_INT64, 1, one);
        gs.device.kind = ATTN_DEVICE_CUDA;
        cu_fill(k.host, ATTN_DTYPE_BF16, MAXT * HKV * D, 2.0f);
        EXPECT_TRUE(cu_up(ctx, &sl) && cu_up(ctx, &k));
        EXPECT_OK(attn_reshape_and_cache(gpu, &gk, &gv, &gc, &gs, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
        EXPECT_TRUE(cu_down(ctx, &kv, kv.host) && memcmp(kv.host, ref, cbytes) == 0);
    }
    EXPECT_EQ_INT(bad, 0);
done:
    if (exec) cg.exec_destroy(exec);
    if (graph) cg.graph_destroy(graph);
    cu_graph_close(&cg);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &k); cu_buf_free(ctx, &v); cu_buf_free(ctx, &kv);
    cu_buf_free(ctx, &out); cu_buf_free(ctx, &sl);
    free(ref);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (cg.lib) dlclose(cg.lib);
}

/* An fp8 layer whose scales and attention sinks are device floats (vLLM's k_scale / v_scale
   tensors, gpt-oss's sinks): a forward captured once in a CUDA graph and replayed after the
   scales and sinks change reads the new values (against a CPU layer reading host floats
   changed alike). */
ATTN_TEST(cuda_fp8_graph_replays_new_scales) {
    enum { H = 8, HKV = 2, D = 128, BS = 16, R = 3, MAXB = 16, NB = R * MAXB };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *graph = NULL, *exec = NULL;
    cu_graph_api cg;
    attn_layer_desc d;
    attn_layer *cpu = NULL, *gpu = NULL;
    attn_metadata *mc = NULL, *mg = NULL;
    attn_metadata_desc md;
    cu_buf q, kv, out, sc;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, round, bad = 0, i;
    int32_t bt[R * MAXB], qsl[R + 1] = {0, 1, 2, 3}, seq[R] = {100, 250, 17};
    float hs[2 + H] = {1.0f / 64, 1.0f / 32}; /* k_scale, v_scale, then the H sinks */
    static const float rounds[3][2] = {{1.0f / 64, 1.0f / 32}, {1.0f / 16, 1.0f / 128}, {0.5f, 0.75f}};
    static uint16_t cpu_out[R * H * D], gpu_out[R * H * D];
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out); memset(&sc, 0, sizeof sc);
    CU_SKIP_IF_NO_GPU(ctx);
    switch (cu_graph_open(&cg)) {
    case 1: attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test");
    case -1: goto done;
    }
    if (!cu_buf_make(ctx, &sc, sizeof hs)) goto done;
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
    d.k_scale.ptr = &hs[0]; d.v_scale.ptr = &hs[1]; /* the CPU layer: host floats */
    d.sinks = hs + 2;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &cpu));
    d.device = ATTN_DEVICE_CUDA; /* the CUDA layer: device floats */
    d.k_scale.ptr = (const float *)sc.dev; d.v_scale.ptr = (const float *)sc.dev + 1;
    d.k_scale.device = d.v_scale.device = ATTN_DEVICE_CUDA;
    d.sinks = (const float *)sc.dev + 2;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = R; md.max_num_tokens = R; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!cpu || !gpu || attn_metadata_create(cpu, &md, &mc) != ATTN_OK || attn_metadata_create(gpu, &md, &mg) != ATTN_OK)
        goto done;
    attn_layer_kv_cache_shape(gpu, NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, sizeof cpu_out) || !cu_buf_make(ctx, &out, sizeof cpu_out) ||
        !cu_buf_make(ctx, &kv, (size_t)NB * 2 * BS * HKV * D))
        goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, R * H * D, 2.0f);
    /* every slot's codes through the CPU cache write (scales 1/64, 1/32) */
    if (!cu_fill_by_write(cpu, kv.host, ATTN_DTYPE_FP8_E4M3, ndim, shape, ATTN_DTYPE_BF16, NB, BS, HKV, D) ||
        !cu_up(ctx, &q) || !cu_up(ctx, &kv))
        goto done;
    for (i = 0; i < R * MAXB; i++) bt[i] = (i * 7) % NB;
    {
        attn_batch b;
        memset(&b, 0, sizeof b);
        b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
        b.num_reqs = R; b.num_actual_tokens = R; b.max_query_len = 1; b.max_seq_len = 250;
        b.stream = cg.stream;
        EXPECT_OK(attn_metadata_build(mc, 0, &b, 0));
        EXPECT_OK(attn_metadata_build(mg, 0, &b, 0));
    }
    for (round = 0; round < 3 && !bad; round++) {
        attn_tensor hq = cu_tensor(q.host, ATTN_DTYPE_BF16, 3, R, H, D, 0), ho = cu_tensor(cpu_out, ATTN_DTYPE_BF16, 3, R, H, D, 0);
        attn_tensor hc = attn_tensor_make(kv.host, ATTN_DTYPE_FP8_E4M3, ndim, shape);
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, R, H, D, 1), go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, R, H, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_FP8_E4M3, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        hs[0] = rounds[round][0]; hs[1] = rounds[round][1];
        for (i = 0; i < H; i++) hs[2 + i] = (float)(round * 3 - i) * 0.75f; /* new sinks each round */
        memcpy(sc.host, hs, sizeof hs);
        if (!cu_up(ctx, &sc)) { bad++; break; }
        if (round == 0 && !cu_capture_forward(&cg, gpu, mg, &gq, &gc, &go, &graph, &exec)) { /* capture once */
            bad++;
            break;
        }
        {
            char what[80];
            snprintf(what, sizeof what, "round %d (k_scale %g, v_scale %g)", round, (double)hs[0], (double)hs[1]);
            bad += cu_replay_matches_cpu(ctx, &cg, exec, &out, cpu, mc, &hq, &hc, &ho, cpu_out, gpu_out, R * H * D, 3e-2f,
                                         3e-2f, what);
        }
    }
    EXPECT_EQ_INT(bad, 0);
done:
    if (exec) cg.exec_destroy(exec);
    if (graph) cg.graph_destroy(graph);
    cu_graph_close(&cg);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out); cu_buf_free(ctx, &sc);
    attn_metadata_destroy(mc); attn_metadata_destroy(mg);
    attn_layer_destroy(cpu); attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (cg.lib) dlclose(cg.lib);
}

void suite_cuda_graph(void) {
    ATTN_RUN(cuda_fp8_graph_replays_new_scales);
    ATTN_RUN(cuda_graph_replays_after_new_builds);
    ATTN_RUN(cuda_graph_cache_write_from_device_slots);
}
