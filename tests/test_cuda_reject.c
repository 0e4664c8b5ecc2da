/* What a CUDA layer resolves to and what it refuses, through the public API: the
   selector's record for device layers (CUDA_SM90 within its scope, CUDA otherwise, the
   reasons named; 8-bit caches and wide heads; CPU tensors stay on the CPU); scale pointers
   declared on the wrong device; host tensors given to a CUDA layer; a bad per-tensor scale
   in device memory (nothing written); metadata built for another layer's kernels; a stream
   of another CUDA context. Every test SKIPs (with the reason) where the platform has no
   CUDA device. (The numerics: tests/test_cuda_forward.c.) */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "cuda_fixtures.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

ATTN_TEST(cuda_selected_for_device_layers) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_selection s;
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = 32; d.num_kv_heads = 8; d.head_size = 128; d.dtype = ATTN_DTYPE_BF16;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, cu_auto_backend(ctx, &d));
    EXPECT_EQ_INT(s.default_backend, s.resolved); /* the default is the first that fits the layer */
    EXPECT_EQ_INT(s.cuda_graph, ATTN_CUDA_GRAPH_ALWAYS);
    if (s.resolved == ATTN_BACKEND_CUDA) { /* not compute capability 9.0: the record says so */
        EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "compute capability"));
    }
    /* outside CUDA_SM90's scope: CUDA, and the record names what did not fit */
    d.logits_soft_cap = 30.0f;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    EXPECT_EQ_INT(s.default_backend, ATTN_BACKEND_CUDA);
    EXPECT_TRUE(strstr(s.log_line, ", default") != NULL);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "soft_cap"));
    d.logits_soft_cap = 0.0f;
    d.head_size = 96;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "64 or 128"));
    d.head_size = 128;
    d.kv_cache_dtype = ATTN_DTYPE_F16; /* q bf16, cache f16 */
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, s.device_capability == 90 ? "one 16-bit type"
                                                                                    : "compute capability"));
    /* an fp8 cache: CUDA reads it (the mma.sync kernels dequantize); CUDA_SM90's wgmma
       prefill takes 16-bit caches only, and its record says so */
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
    d.k_scale.value = d.v_scale.value = 1.0f;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    if (s.device_capability == 90) EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "kv_cache_dtype fp8_e4m3"));
    d.kv_cache_dtype = ATTN_DTYPE_INT8; /* per token and head */
    d.k_scale.value = d.v_scale.value = 0.0f;
    d.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    d.head_size = 120; /* 8-bit caches on the GPU: head sizes in multiples of 16 */
    EXPECT_TRUE(attn_select_backend(ctx, &d, NULL, &s) != ATTN_OK);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA, "multiple of 16"));
    d.head_size = 512; /* WIDE HEADS: CUDA takes 512 with an 8-bit cache ... */
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA);
    d.head_size = 272; /* ... and past 256 multiples of 32 only */
    EXPECT_TRUE(attn_select_backend(ctx, &d, NULL, &s) != ATTN_OK);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA, "of 32 from 288 to 512"));
    d.head_size = 512;
    d.kv_scale_kind = ATTN_KV_SCALE_PER_TENSOR;
    d.dtype = d.kv_cache_dtype = ATTN_DTYPE_F32; /* past 256: no FMA form */
    EXPECT_TRUE(attn_select_backend(ctx, &d, NULL, &s) != ATTN_OK);
    EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA, "allowed past 256"));
    d.dtype = d.kv_cache_dtype = ATTN_DTYPE_BF16;
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CUDA); /* CUDA_SM90's record: 64 or 128 */
    if (s.device_capability == 90) EXPECT_TRUE(cu_skip_reason(&s, ATTN_BACKEND_CUDA_SM90, "64 or 128"));
    d.head_size = 128;
    d.kv_cache_dtype = ATTN_DTYPE_AUTO;
    d.device = ATTN_DEVICE_CPU; /* CPU tensors on a GPU machine stay on the CPU */
    EXPECT_OK(attn_select_backend(ctx, &d, NULL, &s));
    EXPECT_EQ_INT(s.resolved, ATTN_BACKEND_CPU);
    attn_context_destroy(ctx);
}

/* A scale pointer's declared device is checked against the driver: device memory declared
   CPU, host memory declared CUDA — named errors at create. */
ATTN_TEST(cuda_fp8_scale_pointer_device_checked) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    void *dev = NULL;
    float host = 1.0f;
    CU_SKIP_IF_NO_GPU(ctx);
    EXPECT_OK(attn_cuda_malloc(ctx, 64, &dev));
    memset(&d, 0, sizeof d);
    d.num_heads = 8; d.num_kv_heads = 2; d.head_size = 64; d.dtype = ATTN_DTYPE_F16;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3;
    d.v_scale.value = 1.0f;
    d.k_scale.ptr = (const float *)dev; /* device memory, declared CPU (the default) */
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "CUDA device memory") != NULL);
    d.k_scale.ptr = &host; /* host memory: a CPU layer takes it */
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    attn_layer_destroy(layer);
    layer = NULL;
    d.device = ATTN_DEVICE_CUDA; d.k_scale.device = ATTN_DEVICE_CUDA; /* host memory declared CUDA */
    EXPECT_STATUS(attn_layer_create(ctx, &d, NULL, &layer), ATTN_ERROR_INVALID_VALUE);
    EXPECT_TRUE(strstr(attn_context_last_error(ctx), "host memory") != NULL);
    EXPECT_OK(attn_cuda_free(ctx, dev));
    attn_context_destroy(ctx);
}

/* A per-tensor scale in device memory that is not finite and > 0: the kernels cannot
   report it without a synchronisation, so they write nothing (cache and output unchanged);
   a good value written later is read by the next call. */
ATTN_TEST(cuda_fp8_bad_device_scale_writes_nothing) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *layer = NULL;
    attn_metadata *meta = NULL;
    attn_metadata_desc md;
    attn_batch b;
    cu_buf q, kv, out, sc, k, v;
    int32_t qsl[2] = {0, 1}, seq[1] = {20}, bt[2] = {0, 1};
    int64_t slots[1] = {16 + 3}, shape[ATTN_MAX_DIMS]; /* position 19: block 1, row 3 */
    int ndim = 0;
    float bad = -1.0f, good[2] = {0.5f, 0.25f};
    unsigned char *before = NULL, *after = NULL;
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out);
    memset(&sc, 0, sizeof sc); memset(&k, 0, sizeof k); memset(&v, 0, sizeof v);
    memset(&d, 0, sizeof d);
    d.num_heads = 4; d.num_kv_heads = 2; d.head_size = 64; d.dtype = ATTN_DTYPE_BF16;
    d.kv_cache_dtype = ATTN_DTYPE_FP8_E4M3; d.device = ATTN_DEVICE_CUDA; d.block_size = 16;
    EXPECT_TRUE(cu_buf_make(ctx, &sc, 8));
    memcpy(sc.host, &bad, 4);
    memcpy((char *)sc.host + 4, &good[1], 4);
    EXPECT_TRUE(cu_up(ctx, &sc));
    d.k_scale.ptr = (const float *)sc.dev; d.k_scale.device = ATTN_DEVICE_CUDA;
    d.v_scale.ptr = (const float *)sc.dev + 1; d.v_scale.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &layer));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 2; md.num_blocks = 2;
    EXPECT_OK(attn_metadata_create(layer, &md, &meta));
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 2;
    b.slot_mapping = slots; b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 20;
    EXPECT_OK(attn_metadata_build(meta, 0, &b, 0));
    attn_layer_kv_cache_shape(layer, 2, shape, &ndim);
    EXPECT_TRUE(cu_buf_make(ctx, &q, 4 * 64 * 2) && cu_buf_make(ctx, &k, 2 * 64 * 2) && cu_buf_make(ctx, &v, 2 * 64 * 2) &&
                cu_buf_make(ctx, &kv, (size_t)2 * 2 * 16 * 2 * 64) && cu_buf_make(ctx, &out, 4 * 64 * 2));
    before = (unsigned char *)malloc(kv.bytes + out.bytes);
    after = (unsigned char *)malloc(kv.bytes + out.bytes);
    if (q.host && k.host && v.host && kv.host && out.host && before && after) {
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, 1, 4, 64, 1), gk = cu_tensor(k.dev, ATTN_DTYPE_BF16, 3, 1, 2, 64, 1);
        attn_tensor gv = cu_tensor(v.dev, ATTN_DTYPE_BF16, 3, 1, 2, 64, 1), go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, 1, 4, 64, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_FP8_E4M3, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        cu_fill(q.host, ATTN_DTYPE_BF16, 4 * 64, 2.0f);
        cu_fill(k.host, ATTN_DTYPE_BF16, 2 * 64, 2.0f);
        cu_fill(v.host, ATTN_DTYPE_BF16, 2 * 64, 2.0f);
        memset(kv.host, 0x11, kv.bytes);
        memset(out.host, 0x5a, out.bytes);
        EXPECT_TRUE(cu_up(ctx, &q) && cu_up(ctx, &k) && cu_up(ctx, &v) && cu_up(ctx, &kv) && cu_up(ctx, &out));
        memcpy(before, kv.host, kv.bytes);
        memcpy(before + kv.bytes, out.host, out.bytes);
        EXPECT_OK(attn_layer_forward(layer, meta, &gq, &gk, &gv, &gc, &go, NULL, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
        EXPECT_TRUE(cu_down(ctx, &kv, after) && cu_down(ctx, &out, after + kv.bytes));
        EXPECT_TRUE(memcmp(before, after, kv.bytes + out.bytes) == 0);
        memcpy(sc.host, &good[0], 4); /* a good scale: the same layer reads it at the next call */
        EXPECT_TRUE(cu_up(ctx, &sc));
        EXPECT_OK(attn_layer_forward(layer, meta, &gq, &gk, &gv, &gc, &go, NULL, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
        EXPECT_TRUE(cu_down(ctx, &kv, after) && cu_down(ctx, &out, after + kv.bytes));
        { /* the new token's K row: code(k / 0.5) */
            const unsigned char *row = after + ((size_t)(1 * 2 + 0) * 16 + 3) * 2 * 64; /* block 1, K, row 3, head 0 */
            int i, wrong = 0;
            for (i = 0; i < 64; i++)
                wrong += row[i] != attn_f32_to_fp8_e4m3(cu_get(k.host, ATTN_DTYPE_BF16, (size_t)i) / 0.5f);
            EXPECT_EQ_INT(wrong, 0);
        }
        EXPECT_TRUE(memcmp(before + kv.bytes, after + kv.bytes, out.bytes) != 0); /* out written */
    }
    free(before); free(after);
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &k); cu_buf_free(ctx, &v); cu_buf_free(ctx, &kv);
    cu_buf_free(ctx, &out); cu_buf_free(ctx, &sc);
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
}

/* Host tensors given to a CUDA layer are refused, naming the tensor; nothing is written. */
ATTN_TEST(cuda_host_tensor_refused) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *gpu = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b;
    int32_t qsl[2] = {0, 1}, seq[1] = {1}, bt[1] = {0};
    int64_t slots[1] = {0}, shape[ATTN_MAX_DIMS];
    float host_q[64], host_out[64];
    void *dq = NULL, *dcache = NULL;
    int ndim = 0;
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = 4; d.num_kv_heads = 4; d.head_size = 16; d.dtype = ATTN_DTYPE_F32;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 1; md.num_blocks = 1;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 1;
    b.slot_mapping = slots; b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 1;
    if (gpu && attn_metadata_create(gpu, &md, &m) == ATTN_OK && attn_metadata_build(m, 0, &b, 0) == ATTN_OK &&
        attn_cuda_malloc(ctx, sizeof host_q, &dq) == ATTN_OK && attn_cuda_malloc(ctx, 4096, &dcache) == ATTN_OK) {
        attn_tensor q = cu_tensor(dq, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
        attn_tensor hout = cu_tensor(host_out, ATTN_DTYPE_F32, 3, 1, 4, 16, 0);
        attn_tensor hq = cu_tensor(host_q, ATTN_DTYPE_F32, 3, 1, 4, 16, 0);
        attn_tensor cache;
        attn_layer_kv_cache_shape(gpu, 1, shape, &ndim);
        cache = attn_tensor_make(dcache, ATTN_DTYPE_F32, ndim, shape);
        cache.device.kind = ATTN_DEVICE_CUDA;
        memset(host_out, 0x7f, sizeof host_out);
        attn_test_log_reset(&log);
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &hout, NULL, NULL), ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_TENSOR_DEVICE, ATTN_LOG_LEVEL_ERROR));
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "out.device") != NULL);
        EXPECT_TRUE(host_out[0] != host_out[0] || ((unsigned char *)host_out)[0] == 0x7f);
        EXPECT_STATUS(attn_layer_forward(gpu, m, &hq, NULL, NULL, &cache, &q, NULL, NULL), ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "q.device") != NULL);
        q.device.index = 1; /* another GPU than the context's */
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &q, NULL, NULL), ATTN_ERROR_SHAPE_MISMATCH);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "q.device.index is 1") != NULL);
        q.device.index = 0;
        cache.data = (char *)dcache + 8; /* a cache that does not start on 16 bytes: refused before any launch */
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &q, NULL, NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "not 16-byte aligned") != NULL);
        EXPECT_STATUS(attn_reshape_and_cache(gpu, &q, &q, &cache, ATTN_TEST_SLOTS(slots, 1), NULL), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "kv_cache.data") != NULL);
    } else {
        EXPECT_TRUE(0);
    }
    attn_cuda_free(ctx, dq);
    attn_cuda_free(ctx, dcache);
    attn_metadata_destroy(m);
    attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
}

/* Metadata is shared by layers of one configuration (attn__metadata_fits), but a CUDA
   schedule also depends on the kernels the layer compiled: a bf16 layer's prefill tiles
   are 128 rows, a soft-capped one's 64. Forward with the other layer's metadata is refused
   by name, and writes nothing (neither out nor the cache). */
ATTN_TEST(cuda_metadata_of_other_kernels_refused) {
    enum { H = 32, HKV = 8, D = 128, BS = 16, T = 40, MAXB = 8, NB = 16 };
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    attn_layer_desc d;
    attn_layer *plain = NULL, *capped = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    cu_buf q, kv, out, knew;
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = 0, i, changed = 0;
    int32_t qsl[2] = {0, T}, seq[1] = {T}, bt[MAXB];
    int64_t slots[T];
    attn_batch b;
    static unsigned char before[NB * 2 * BS * HKV * D * 2], after[NB * 2 * BS * HKV * D * 2];
    memset(&q, 0, sizeof q); memset(&kv, 0, sizeof kv); memset(&out, 0, sizeof out); memset(&knew, 0, sizeof knew);
    CU_SKIP_IF_NO_GPU(ctx);
    memset(&d, 0, sizeof d);
    d.num_heads = H; d.num_kv_heads = HKV; d.head_size = D; d.dtype = ATTN_DTYPE_BF16; d.block_size = BS;
    d.device = ATTN_DEVICE_CUDA;
    { /* both on CUDA: one backend, other kernels (a CUDA_SM90 layer's metadata is refused
         by a CUDA layer already for its backend) */
        attn_select_request req;
        memset(&req, 0, sizeof req);
        req.backend = ATTN_BACKEND_CUDA;
        EXPECT_OK(attn_layer_create(ctx, &d, &req, &plain));
        d.logits_soft_cap = 30.0f;
        EXPECT_OK(attn_layer_create(ctx, &d, &req, &capped));
    }
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = T; md.max_blocks_per_req = MAXB; md.num_blocks = NB;
    if (!plain || !capped || attn_metadata_create(plain, &md, &m) != ATTN_OK) goto done;
    attn_layer_kv_cache_shape(plain, NB, shape, &ndim);
    if (!cu_buf_make(ctx, &q, (size_t)T * H * D * 2) || !cu_buf_make(ctx, &out, (size_t)T * H * D * 2) ||
        !cu_buf_make(ctx, &knew, (size_t)T * HKV * D * 2) || !cu_buf_make(ctx, &kv, sizeof before)) goto done;
    cu_fill(q.host, ATTN_DTYPE_BF16, (size_t)T * H * D, 2.0f);
    cu_fill(knew.host, ATTN_DTYPE_BF16, (size_t)T * HKV * D, 2.0f);
    cu_fill(kv.host, ATTN_DTYPE_BF16, sizeof before / 2, 2.0f);
    memset(out.host, 0xff, out.bytes);
    if (!cu_up(ctx, &q) || !cu_up(ctx, &knew) || !cu_up(ctx, &kv) || !cu_up(ctx, &out)) goto done;
    memcpy(before, kv.host, sizeof before);
    for (i = 0; i < MAXB; i++) bt[i] = i;
    for (i = 0; i < T; i++) slots[i] = i;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = MAXB;
    b.slot_mapping = slots; b.num_reqs = 1; b.num_actual_tokens = T; b.max_query_len = T; b.max_seq_len = T;
    EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
    {
        attn_tensor gq = cu_tensor(q.dev, ATTN_DTYPE_BF16, 3, T, H, D, 1);
        attn_tensor go = cu_tensor(out.dev, ATTN_DTYPE_BF16, 3, T, H, D, 1);
        attn_tensor gk = cu_tensor(knew.dev, ATTN_DTYPE_BF16, 3, T, HKV, D, 1);
        attn_tensor gc = attn_tensor_make(kv.dev, ATTN_DTYPE_BF16, ndim, shape);
        gc.device.kind = ATTN_DEVICE_CUDA;
        EXPECT_EQ_INT(attn_layer_forward(capped, m, &gq, &gk, &gk, &gc, &go, NULL, NULL), ATTN_ERROR_INVALID_METADATA);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "prefill tiles") != NULL);
    }
    if (!cu_down(ctx, &kv, after) || !cu_down(ctx, &out, out.host)) goto done;
    changed = memcmp(before, after, sizeof before) != 0;
    for (i = 0; i < T * H * D && !changed; i++) changed = ((uint16_t *)out.host)[i] != 0xffff;
    EXPECT_EQ_INT(changed, 0);
done:
    cu_buf_free(ctx, &q); cu_buf_free(ctx, &kv); cu_buf_free(ctx, &out); cu_buf_free(ctx, &knew);
    attn_metadata_destroy(m);
    attn_layer_destroy(plain); attn_layer_destroy(capped);
    attn_context_destroy(ctx);
}

/* ---- a stream of another CUDA context: refused by every call that takes one -------------- */

typedef int (*cu_fn_ctx_create)(void **, unsigned, int);
typedef int (*cu_fn_ctx_ptr)(void *);
typedef int (*cu_fn_ctx_pop)(void **);

ATTN_TEST(cuda_stream_of_another_context_refused) {
    attn_test_log log;
    attn_context *ctx = cu_ctx(&log);
    void *lib = NULL, *other = NULL, *stream = NULL, *popped = NULL, *dq = NULL, *dc = NULL, *dout = NULL;
    const char *missing = NULL;
    cu_fn_ctx_create ctx_create; cu_fn_ctx_ptr ctx_destroy, ctx_push; cu_fn_ctx_pop ctx_pop;
    cu_fn_stream_create stream_create; cu_fn_stream_destroy stream_destroy;
    attn_layer_desc d;
    attn_layer *gpu = NULL;
    attn_metadata *m = NULL;
    attn_metadata_desc md;
    attn_batch b;
    int32_t qsl[2] = {0, 1}, seq[1] = {5}, bt[1] = {0};
    int64_t slots[1] = {4}, shape[ATTN_MAX_DIMS];
    float host_out[64];
    int ndim = 0, n;
    CU_SKIP_IF_NO_GPU(ctx);
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { attn_context_destroy(ctx); SKIP("libcuda.so.1 not loadable by the test"); }
    CU_LOAD(ctx_create, cu_fn_ctx_create, "cuCtxCreate_v2");
    CU_LOAD(ctx_destroy, cu_fn_ctx_ptr, "cuCtxDestroy_v2");
    CU_LOAD(ctx_push, cu_fn_ctx_ptr, "cuCtxPushCurrent_v2");
    CU_LOAD(ctx_pop, cu_fn_ctx_pop, "cuCtxPopCurrent_v2");
    CU_LOAD(stream_create, cu_fn_stream_create, "cuStreamCreate");
    CU_LOAD(stream_destroy, cu_fn_stream_destroy, "cuStreamDestroy_v2");
    if (missing) { attn_test_fail(__FILE__, __LINE__, "libcuda lacks %s", missing); goto done; }
    /* a context of its own on device 0 (not the primary one), and a stream in it */
    if (ctx_create(&other, 0, 0) != 0 || stream_create(&stream, 1) != 0 || ctx_pop(&popped) != 0) {
        attn_test_fail(__FILE__, __LINE__, "cannot make a context and a stream");
        goto done;
    }
    memset(&d, 0, sizeof d);
    d.num_heads = 4; d.num_kv_heads = 4; d.head_size = 16; d.dtype = ATTN_DTYPE_F32; d.block_size = 16;
    d.device = ATTN_DEVICE_CUDA;
    EXPECT_OK(attn_layer_create(ctx, &d, NULL, &gpu));
    memset(&md, 0, sizeof md);
    md.max_num_reqs = 1; md.max_num_tokens = 1; md.max_blocks_per_req = 1; md.num_blocks = 1;
    memset(&b, 0, sizeof b);
    b.query_start_loc = qsl; b.seq_lens = seq; b.block_table = bt; b.block_table_stride = 1;
    b.slot_mapping = slots; b.num_reqs = 1; b.num_actual_tokens = 1; b.max_query_len = 1; b.max_seq_len = 5;
    if (!gpu || attn_metadata_create(gpu, &md, &m) != ATTN_OK || attn_cuda_malloc(ctx, 256, &dq) != ATTN_OK ||
        attn_cuda_malloc(ctx, 256, &dout) != ATTN_OK || attn_cuda_malloc(ctx, 4 * 2 * 16 * 64, &dc) != ATTN_OK) {
        EXPECT_TRUE(0);
        goto done;
    }
    {
        attn_tensor q = cu_tensor(dq, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
        attn_tensor out = cu_tensor(dout, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
        attn_tensor cache;
        attn_layer_kv_cache_shape(gpu, 1, shape, &ndim);
        cache = attn_tensor_make(dc, ATTN_DTYPE_F32, ndim, shape);
        cache.device.kind = ATTN_DEVICE_CUDA;
        for (n = 0; n < 64; n++) host_out[n] = 1.0f + (float)n;
        EXPECT_OK(attn_cuda_memcpy(ctx, dq, host_out, 256, ATTN_COPY_HOST_TO_DEVICE, NULL));
        EXPECT_OK(attn_cuda_memcpy(ctx, dc, host_out, 256, ATTN_COPY_HOST_TO_DEVICE, NULL));
        memset(host_out, 0x7f, sizeof host_out);
        EXPECT_OK(attn_cuda_memcpy(ctx, dout, host_out, 256, ATTN_COPY_HOST_TO_DEVICE, NULL));
        /* build with the foreign stream: refused, and the metadata stays unbuilt */
        b.stream = stream;
        attn_test_log_reset(&log);
        EXPECT_STATUS(attn_metadata_build(m, 0, &b, 0), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "another CUDA context") != NULL);
        EXPECT_TRUE(attn_test_log_has(&log, ATTN_LOG_INVALID_ARGUMENT, ATTN_LOG_LEVEL_ERROR));
        b.stream = NULL;
        EXPECT_OK(attn_metadata_build(m, 0, &b, 0));
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &out, NULL, stream), ATTN_ERROR_INVALID_VALUE);
        EXPECT_TRUE(strstr(attn_context_last_error(ctx), "attn_layer_forward: stream") != NULL);
        EXPECT_STATUS(attn_layer_forward(gpu, m, &q, &q, &q, &cache, &out, NULL, stream), ATTN_ERROR_INVALID_VALUE);
        EXPECT_STATUS(attn_reshape_and_cache(gpu, &q, &q, &cache, ATTN_TEST_SLOTS(slots, 1), stream), ATTN_ERROR_INVALID_VALUE);
        EXPECT_STATUS(attn_cuda_memcpy(ctx, dout, dq, 256, ATTN_COPY_DEVICE_TO_DEVICE, stream), ATTN_ERROR_INVALID_VALUE);
        EXPECT_STATUS(attn_cuda_synchronize(ctx, stream), ATTN_ERROR_INVALID_VALUE);
        {
            attn_tensor o = cu_tensor(dout, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
            attn_tensor l = cu_tensor(dq, ATTN_DTYPE_F32, 2, 1, 4, 0, 1);
            attn_tensor l2 = cu_tensor((char *)dq + 64, ATTN_DTYPE_F32, 2, 1, 4, 0, 1);
            attn_tensor o2 = cu_tensor(dc, ATTN_DTYPE_F32, 3, 1, 4, 16, 1);
            EXPECT_STATUS(attn_merge_attn_states(ctx, &o, &l, ATTN_LSE_BASE_E, &o2, &l2, ATTN_LSE_BASE_E, &o, NULL,
                                                 ATTN_LSE_BASE_E, stream), ATTN_ERROR_INVALID_VALUE);
        }
        /* nothing was written: out and the cache hold what they held */
        {
            float back[64], cache_back[64];
            int same = 1;
            EXPECT_OK(attn_cuda_memcpy(ctx, back, dout, 256, ATTN_COPY_DEVICE_TO_HOST, NULL));
            EXPECT_OK(attn_cuda_memcpy(ctx, cache_back, dc, 256, ATTN_COPY_DEVICE_TO_HOST, NULL));
            for (n = 0; n < 64; n++) same &= memcmp(&back[n], &host_out[n], 4) == 0 && cache_back[n] == 1.0f + (float)n;
            EXPECT_TRUE(same);
        }
        /* and the same calls on the primary context's streams work */
        EXPECT_OK(attn_layer_forward(gpu, m, &q, NULL, NULL, &cache, &out, NULL, NULL));
        EXPECT_OK(attn_cuda_synchronize(ctx, NULL));
    }
done:
    if (stream && other && ctx_push(other) == 0) {
        stream_destroy(stream);
        ctx_pop(&popped);
    }
    if (other) ctx_destroy(other);
    attn_cuda_free(ctx, dq); attn_cuda_free(ctx, dout); attn_cuda_free(ctx, dc);
    attn_metadata_destroy(m);
    attn_layer_destroy(gpu);
    attn_context_destroy(ctx);
    if (lib) dlclose(lib);
}

void suite_cuda_reject(void) {
    ATTN_RUN(cuda_selected_for_device_layers);
    ATTN_RUN(cuda_fp8_scale_pointer_device_checked);
    ATTN_RUN(cuda_fp8_bad_device_scale_writes_nothing);
    ATTN_RUN(cuda_host_tensor_refused);
    ATTN_RUN(cuda_metadata_of_other_kernels_refused);
    ATTN_RUN(cuda_stream_of_another_context_refused);
}
