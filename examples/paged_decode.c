/* paged_decode.c — prefill three prompts into a paged KV cache, then decode a few steps.

   This is the loop an inference engine runs around one attention layer:

     1. create a context (logger, worker threads) and a layer (the selector picks a
        backend and records why);
     2. allocate the paged KV cache: a pool of fixed-size blocks, handed out to requests
        from a free list, one block per BLOCK_SIZE tokens; each request's block table
        lists its blocks in order, so its tokens need not be contiguous in memory;
     3. for every batch: describe it (where each request's new tokens start, how long each
        sequence is, the block tables, and the cache slot of every new token), build the
        metadata from that description, and call attn_layer_forward, which writes the new
        keys/values into the cache and attends over everything cached so far;
     4. at the end, check one decode step against a plain float64 attention.

   Where the data lives is the caller's choice: --device cpu keeps every tensor in host
   memory; --device cuda puts the KV cache, q/k/v and out in GPU memory (allocated and
   copied with attn.h's own helpers, so no CUDA SDK is needed to build this file) and the
   selector then picks the CUDA backend. The default, --device auto, is cuda when the
   platform has a usable GPU and cpu otherwise.

   Build and run:  make demo   (or: cc -std=c99 -O2 -march=native -I. \
                   examples/paged_decode.c -o paged_decode -lpthread -lm -ldl;
                   ./paged_decode [--device auto|cpu|cuda]) */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#define ATTN_IMPLEMENTATION     /* this file also holds the library's implementation */
#include "attn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The layer: a Llama-3-8B-like attention layer (GQA: 4 query heads share a KV head). */
#define NUM_HEADS 32
#define NUM_KV_HEADS 8
#define HEAD_SIZE 128
#define BLOCK_SIZE 16

/* The workload: three requests with different prompt lengths, then DECODE_STEPS steps
   that each add one token to every request. */
#define NUM_REQS 3
#define DECODE_STEPS 8
static const int prompt_lens[NUM_REQS] = {37, 100, 203};

/* The cache pool: NUM_BLOCKS blocks of BLOCK_SIZE tokens shared by all requests, and the
   longest block table a request may have (its width is fixed when metadata is created). */
#define NUM_BLOCKS 64
#define MAX_BLOCKS_PER_REQ 32
#define MAX_SEQ_LEN (MAX_BLOCKS_PER_REQ * BLOCK_SIZE)

#define ROW (NUM_HEADS * HEAD_SIZE)       /* elements of one token of q or out */
#define KV_ROW (NUM_KV_HEADS * HEAD_SIZE) /* elements of one token of k or v */

static attn_context *ctx; /* global only so that CHECK can report the context's error */
static int on_gpu;        /* the tensors live in GPU memory (--device cuda) */

/* Every attn_* call returns a status; on failure the context holds a message that names
   the bad argument, its value and what is allowed. */
#define CHECK(call)                                                                        \
    do {                                                                                   \
        attn_status st_ = (call);                                                          \
        if (st_ != ATTN_OK) {                                                              \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,       \
                    attn_status_string(st_), attn_context_last_error(ctx));                \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static void *xmalloc(size_t size) {
    void *p = malloc(size);
    if (!p) { fprintf(stderr, "out of memory (%zu bytes)\n", size); exit(1); }
    return p;
}

/* A small deterministic PRNG (xorshift64*), so every run sees the same inputs. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}
/* Uniform in [-1, -0.05] U [0.05, 1]: no zeros, so a row that was never written (and so
   still holds zeros) cannot look right by accident. */
static float rng_value(void) {
    float magnitude = 0.05f + 0.95f * (float)rng_next() / 4294967296.0f;
    return (rng_next() & 1) ? magnitude : -magnitude;
}
static void fill_random_f16(uint16_t *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = attn_f32_to_f16(rng_value());
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- The block allocator: a stack of free block ids ----------------------------------- */

static int32_t free_blocks[NUM_BLOCKS];
static int num_free_blocks;

static void free_list_init(void) {
    int i;
    for (i = 0; i < NUM_BLOCKS; i++) free_blocks[i] = i;
    /* Shuffle, as a long-running server's free list would be: block tables then point all
       over the pool, which is exactly what paging is for. */
    for (i = NUM_BLOCKS - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint32_t)(i + 1));
        int32_t t = free_blocks[i];
        free_blocks[i] = free_blocks[j];
        free_blocks[j] = t;
    }
    num_free_blocks = NUM_BLOCKS;
}

static int32_t block_alloc(void) {
    if (num_free_blocks == 0) { fprintf(stderr, "KV cache is full\n"); exit(1); }
    return free_blocks[--num_free_blocks];
}

/* ---- Per-request state ------------------------------------------------------------------ */

typedef struct request {
    int seq_len;                            /* tokens in the cache so far */
    int num_blocks;                         /* blocks allocated to it */
    int32_t block_table[MAX_BLOCKS_PER_REQ];
    uint16_t *keys, *values;                /* host copy of every k/v written, for the check */
} request;

static request reqs[NUM_REQS];

/* The cache slot of the request's token at position pos: block * BLOCK_SIZE + offset.
   A new block is taken from the free list whenever pos starts one. */
static int64_t slot_for(request *r, int pos) {
    int b = pos / BLOCK_SIZE;
    if (b >= MAX_BLOCKS_PER_REQ) { fprintf(stderr, "request too long\n"); exit(1); }
    while (r->num_blocks <= b) r->block_table[r->num_blocks++] = block_alloc();
    return (int64_t)r->block_table[b] * BLOCK_SIZE + pos % BLOCK_SIZE;
}

/* ---- One forward step ------------------------------------------------------------------ */

/* Buffers sized for the largest batch (the prefill), reused by every step. On the GPU the
   host arrays are staging: q/k/v go up before the forward and out comes back after it. */
typedef struct step_buffers {
    uint16_t *q, *k, *v, *out;         /* [tokens, heads, HEAD_SIZE] f16, host */
    void *dq, *dk, *dv, *dout;         /* the same on the GPU (--device cuda), else NULL */
    int32_t query_start_loc[NUM_REQS + 1];
    int32_t seq_lens[NUM_REQS];
    int32_t block_table[NUM_REQS * MAX_BLOCKS_PER_REQ];
    int64_t *slot_mapping;             /* [tokens] */
} step_buffers;

/* Adds query_lens[i] new tokens to request i, runs the layer over the batch, and prints a
   one-line summary. Returns the number of tokens in the batch. */
static int run_step(const char *label, const int *query_lens, attn_layer *layer,
                    attn_metadata *meta, attn_tensor *kv_cache, step_buffers *sb) {
    attn_batch batch;
    attn_tensor q, k, v, out;
    int64_t shape_q[3], shape_kv[3];
    int i, t, ntok = 0, max_q = 0, max_s = 0;
    double t0, t1, checksum = 0.0;

    /* Describe the batch: request i owns rows query_start_loc[i] .. [i+1]-1, which are
       the *last* query_lens[i] positions of a sequence of seq_lens[i] tokens. */
    sb->query_start_loc[0] = 0;
    for (i = 0; i < NUM_REQS; i++) {
        request *r = &reqs[i];
        int first = r->seq_len;
        for (t = 0; t < query_lens[i]; t++) {
            int row = ntok + t;
            /* Fresh q/k/v for the new token (a model would compute them from the hidden
               state); keep a host copy of k and v for the final check. */
            fill_random_f16(sb->q + (size_t)row * ROW, ROW);
            fill_random_f16(sb->k + (size_t)row * KV_ROW, KV_ROW);
            fill_random_f16(sb->v + (size_t)row * KV_ROW, KV_ROW);
            memcpy(r->keys + (size_t)(first + t) * KV_ROW, sb->k + (size_t)row * KV_ROW,
                   KV_ROW * sizeof(uint16_t));
            memcpy(r->values + (size_t)(first + t) * KV_ROW, sb->v + (size_t)row * KV_ROW,
                   KV_ROW * sizeof(uint16_t));
            /* Where attn_layer_forward will store this token's k/v in the cache. */
            sb->slot_mapping[row] = slot_for(r, first + t);
        }
        r->seq_len += query_lens[i];
        ntok += query_lens[i];
        sb->query_start_loc[i + 1] = ntok;
        sb->seq_lens[i] = r->seq_len;
        memcpy(sb->block_table + (size_t)i * MAX_BLOCKS_PER_REQ, r->block_table,
               sizeof r->block_table);
        if (query_lens[i] > max_q) max_q = query_lens[i];
        if (r->seq_len > max_s) max_s = r->seq_len;
    }
    memset(&batch, 0, sizeof batch);
    batch.query_start_loc = sb->query_start_loc;
    batch.seq_lens = sb->seq_lens;
    batch.block_table = sb->block_table;
    batch.block_table_stride = MAX_BLOCKS_PER_REQ;
    batch.slot_mapping = sb->slot_mapping;
    batch.num_reqs = NUM_REQS;
    batch.num_actual_tokens = ntok;
    batch.max_query_len = max_q;  /* must equal the longest query (it is checked) */
    batch.max_seq_len = max_s;    /* likewise */
    batch.causal = ATTN_CAUSAL_DEFAULT; /* the layer's setting: causal */

    /* Turn the description into the backend's schedule. The metadata has fixed capacity,
       so this reuses its buffers every step (on a GPU: CUDA-graph friendly). */
    CHECK(attn_metadata_build(meta, 0, &batch, 0));

    shape_q[0] = ntok; shape_q[1] = NUM_HEADS; shape_q[2] = HEAD_SIZE;
    shape_kv[0] = ntok; shape_kv[1] = NUM_KV_HEADS; shape_kv[2] = HEAD_SIZE;
    q = attn_tensor_make(on_gpu ? sb->dq : sb->q, ATTN_DTYPE_F16, 3, shape_q);
    k = attn_tensor_make(on_gpu ? sb->dk : sb->k, ATTN_DTYPE_F16, 3, shape_kv);
    v = attn_tensor_make(on_gpu ? sb->dv : sb->v, ATTN_DTYPE_F16, 3, shape_kv);
    out = attn_tensor_make(on_gpu ? sb->dout : sb->out, ATTN_DTYPE_F16, 3, shape_q);
    if (on_gpu) { /* every tensor says where it lives; the layer checks them all */
        q.device.kind = k.device.kind = v.device.kind = out.device.kind = ATTN_DEVICE_CUDA;
        CHECK(attn_cuda_memcpy(ctx, sb->dq, sb->q, (size_t)ntok * ROW * 2, ATTN_COPY_HOST_TO_DEVICE, NULL));
        CHECK(attn_cuda_memcpy(ctx, sb->dk, sb->k, (size_t)ntok * KV_ROW * 2, ATTN_COPY_HOST_TO_DEVICE, NULL));
        CHECK(attn_cuda_memcpy(ctx, sb->dv, sb->v, (size_t)ntok * KV_ROW * 2, ATTN_COPY_HOST_TO_DEVICE, NULL));
    }

    /* k/v are written into the cache at slot_mapping, then every new token attends over
       its whole sequence (cached context + itself, causally). No LSE wanted: NULL. The
       last argument is the CUDA stream (NULL: the default stream; ignored on the CPU). */
    t0 = now_ms();
    CHECK(attn_layer_forward(layer, meta, &q, &k, &v, kv_cache, &out, NULL, NULL));
    if (on_gpu) CHECK(attn_cuda_synchronize(ctx, NULL)); /* GPU work is asynchronous */
    t1 = now_ms();
    if (on_gpu)
        CHECK(attn_cuda_memcpy(ctx, sb->out, sb->dout, (size_t)ntok * ROW * 2, ATTN_COPY_DEVICE_TO_HOST, NULL));

    for (i = 0; i < ntok * ROW; i++) checksum += attn_f16_to_f32(sb->out[i]);
    printf("%-9s tokens %4d  (query lens %d/%d/%d, seq lens %d/%d/%d)  %8.3f ms  checksum %+.6f\n",
           label, ntok, query_lens[0], query_lens[1], query_lens[2], sb->seq_lens[0],
           sb->seq_lens[1], sb->seq_lens[2], t1 - t0, checksum);
    return ntok;
}

/* ---- The check: plain float64 attention over the tokens this program wrote ------------- */

/* Max |out - reference| over all heads of output row `row`, which is the last token of
   request r (a decode row: it sees all r->seq_len tokens). */
static double check_row(const step_buffers *sb, int row, const request *r) {
    const double scale = 1.0 / sqrt((double)HEAD_SIZE); /* the layer's default scale */
    const int group = NUM_HEADS / NUM_KV_HEADS;          /* query heads per KV head */
    double *logits = (double *)xmalloc((size_t)r->seq_len * sizeof(double));
    double max_err = 0.0;
    int h, j, x;
    for (h = 0; h < NUM_HEADS; h++) {
        const uint16_t *qh = sb->q + (size_t)row * ROW + (size_t)h * HEAD_SIZE;
        int kvh = h / group;
        double mx = -INFINITY, sum = 0.0;
        for (j = 0; j < r->seq_len; j++) {
            const uint16_t *kj = r->keys + (size_t)j * KV_ROW + (size_t)kvh * HEAD_SIZE;
            double dot = 0.0;
            for (x = 0; x < HEAD_SIZE; x++)
                dot += (double)attn_f16_to_f32(qh[x]) * (double)attn_f16_to_f32(kj[x]);
            logits[j] = dot * scale;
            if (logits[j] > mx) mx = logits[j];
        }
        for (j = 0; j < r->seq_len; j++) sum += (logits[j] = exp(logits[j] - mx));
        for (x = 0; x < HEAD_SIZE; x++) {
            double ref = 0.0, got, err;
            for (j = 0; j < r->seq_len; j++)
                ref += logits[j] / sum *
                       (double)attn_f16_to_f32(r->values[(size_t)j * KV_ROW + (size_t)kvh * HEAD_SIZE + x]);
            got = attn_f16_to_f32(sb->out[(size_t)row * ROW + (size_t)h * HEAD_SIZE + x]);
            err = fabs(got - ref);
            if (!(err <= max_err)) max_err = err; /* NaN propagates */
        }
    }
    free(logits);
    return max_err;
}

/* --device auto|cpu|cuda (or --device=...) -> on_gpu; 0 on success, 1 to exit 0 (--help),
   -1 on a bad argument (named, with what is allowed). */
static int parse_device(int argc, char **argv) {
    static const char usage[] = "usage: paged_decode [--device auto|cpu|cuda]\n"
                                "  auto: cuda when the platform has a usable GPU, else cpu (the default)\n"
                                "  cpu:  every tensor in host memory\n"
                                "  cuda: the KV cache, q/k/v and out in GPU memory\n";
    attn_platform platform;
    const char *want = "auto";
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 1;
    }
    if (argc == 3 && strcmp(argv[1], "--device") == 0) want = argv[2];
    else if (argc == 2 && strncmp(argv[1], "--device=", 9) == 0) want = argv[1] + 9;
    else if (argc == 2 && strcmp(argv[1], "--device") == 0) {
        fprintf(stderr, "paged_decode: --device needs a value (allowed: auto, cpu, cuda)\n%s", usage);
        return -1;
    } else if (argc != 1) {
        fprintf(stderr, "paged_decode: unknown argument '%s' (allowed: --device auto|cpu|cuda, --help)\n%s",
                argv[1], usage);
        return -1;
    }
    CHECK(attn_platform_get(ctx, &platform));
    if (strcmp(want, "cpu") == 0) on_gpu = 0;
    else if (strcmp(want, "cuda") == 0 || strcmp(want, "auto") == 0) {
        on_gpu = platform.kind == ATTN_PLATFORM_CUDA && platform.cuda_capability_major >= 8;
        if (!on_gpu && strcmp(want, "cuda") == 0) {
            fprintf(stderr, "paged_decode: --device cuda: no usable GPU here (%s)\n",
                    platform.kind == ATTN_PLATFORM_CUDA ? "compute capability below 8.0" : platform.cuda_reason);
            return -1;
        }
    } else {
        fprintf(stderr, "paged_decode: --device %s is not a device (allowed: auto, cpu, cuda%s)\n%s", want,
                strcmp(want, "gpu") == 0 ? "; a GPU is 'cuda'" : "", usage);
        return -1;
    }
    printf("device: %s\n", on_gpu ? "cuda (tensors in GPU memory)" : "cpu (tensors in host memory)");
    return 0;
}

int main(int argc, char **argv) {
    attn_layer_desc desc;
    attn_metadata_desc mdesc;
    attn_layer *layer;
    attn_metadata *meta;
    attn_tensor kv_cache;
    int64_t cache_shape[ATTN_MAX_DIMS];
    int cache_ndim, i, step, max_tokens = 0, ones[NUM_REQS];
    void *cache_mem;
    step_buffers sb;
    char *record;
    size_t record_len;
    double err;
    const double tolerance = 1e-2; /* f16 output: ~1e-3 rounding, plenty of margin */

    /* 1. Context: NULL = defaults (log to stderr at INFO, one worker per core). */
    CHECK(attn_context_create(NULL, &ctx));
    if ((i = parse_device(argc, argv)) != 0) {
        attn_context_destroy(ctx);
        return i > 0 ? 0 : 2;
    }

    /* 2. Layer: zero-initialise the descriptor; 0 means "default" for every field
          (scale 1/sqrt(head_size), causal, kv_cache_dtype = dtype, ...). */
    memset(&desc, 0, sizeof desc);
    desc.num_heads = NUM_HEADS;
    desc.num_kv_heads = NUM_KV_HEADS;
    desc.head_size = HEAD_SIZE;
    desc.dtype = ATTN_DTYPE_F16;
    desc.block_size = BLOCK_SIZE;
    desc.device = on_gpu ? ATTN_DEVICE_CUDA : ATTN_DEVICE_CPU; /* where the tensors live */
    CHECK(attn_layer_create(ctx, &desc, NULL, &layer)); /* NULL request: automatic choice */

    /* Which backend serves the layer, and why: the selection record. */
    record_len = attn_selection_format(attn_layer_selection(layer), NULL, 0);
    record = (char *)xmalloc(record_len + 1);
    attn_selection_format(attn_layer_selection(layer), record, record_len + 1);
    printf("%s\n", record);
    free(record);

    /* 3. The paged KV cache: the backend says its shape for NUM_BLOCKS blocks,
          [num_blocks, 2 (k, v), block_size, num_kv_heads, head_size]. We own the memory. */
    CHECK(attn_layer_kv_cache_shape(layer, NUM_BLOCKS, cache_shape, &cache_ndim));
    kv_cache = attn_tensor_make(NULL, ATTN_DTYPE_F16, cache_ndim, cache_shape);
    cache_mem = xmalloc(attn_tensor_nbytes(&kv_cache));
    memset(cache_mem, 0, attn_tensor_nbytes(&kv_cache));
    kv_cache.data = cache_mem;
    if (on_gpu) { /* the cache in GPU memory, zeroed from the host copy */
        void *host = cache_mem;
        CHECK(attn_cuda_malloc(ctx, attn_tensor_nbytes(&kv_cache), &cache_mem));
        CHECK(attn_cuda_memcpy(ctx, cache_mem, host, attn_tensor_nbytes(&kv_cache), ATTN_COPY_HOST_TO_DEVICE, NULL));
        free(host);
        kv_cache.data = cache_mem;
        kv_cache.device.kind = ATTN_DEVICE_CUDA;
    }
    printf("KV cache: %d blocks of %d tokens, %.1f MiB\n\n", NUM_BLOCKS, BLOCK_SIZE,
           (double)attn_tensor_nbytes(&kv_cache) / (1024.0 * 1024.0));
    free_list_init();

    /* 4. Metadata with fixed capacity: the largest batch is the prefill of all prompts. */
    for (i = 0; i < NUM_REQS; i++) max_tokens += prompt_lens[i];
    memset(&mdesc, 0, sizeof mdesc);
    mdesc.max_num_reqs = NUM_REQS;
    mdesc.max_num_tokens = max_tokens;
    mdesc.max_blocks_per_req = MAX_BLOCKS_PER_REQ;
    mdesc.num_blocks = NUM_BLOCKS;
    CHECK(attn_metadata_create(layer, &mdesc, &meta));

    memset(&sb, 0, sizeof sb);
    sb.q = (uint16_t *)xmalloc((size_t)max_tokens * ROW * sizeof(uint16_t));
    sb.out = (uint16_t *)xmalloc((size_t)max_tokens * ROW * sizeof(uint16_t));
    sb.k = (uint16_t *)xmalloc((size_t)max_tokens * KV_ROW * sizeof(uint16_t));
    sb.v = (uint16_t *)xmalloc((size_t)max_tokens * KV_ROW * sizeof(uint16_t));
    sb.slot_mapping = (int64_t *)xmalloc((size_t)max_tokens * sizeof(int64_t));
    if (on_gpu) {
        CHECK(attn_cuda_malloc(ctx, (size_t)max_tokens * ROW * sizeof(uint16_t), &sb.dq));
        CHECK(attn_cuda_malloc(ctx, (size_t)max_tokens * ROW * sizeof(uint16_t), &sb.dout));
        CHECK(attn_cuda_malloc(ctx, (size_t)max_tokens * KV_ROW * sizeof(uint16_t), &sb.dk));
        CHECK(attn_cuda_malloc(ctx, (size_t)max_tokens * KV_ROW * sizeof(uint16_t), &sb.dv));
    }
    for (i = 0; i < NUM_REQS; i++) {
        memset(&reqs[i], 0, sizeof reqs[i]);
        reqs[i].keys = (uint16_t *)xmalloc((size_t)MAX_SEQ_LEN * KV_ROW * sizeof(uint16_t));
        reqs[i].values = (uint16_t *)xmalloc((size_t)MAX_SEQ_LEN * KV_ROW * sizeof(uint16_t));
    }

    /* 5. Prefill: all three prompts in one batch (query length = prompt length). */
    run_step("prefill", prompt_lens, layer, meta, &kv_cache, &sb);

    /* 6. Decode: every step adds one token per request; the new tokens' slots come from
          the same block tables, which grow by a block whenever a sequence crosses a
          block boundary. The metadata is rebuilt for each batch. */
    for (i = 0; i < NUM_REQS; i++) ones[i] = 1;
    for (step = 1; step <= DECODE_STEPS; step++) {
        char label[32];
        snprintf(label, sizeof label, "decode %d", step);
        run_step(label, ones, layer, meta, &kv_cache, &sb);
    }
    printf("\nblocks used: %d of %d\n", NUM_BLOCKS - num_free_blocks, NUM_BLOCKS);

    /* 7. Check the last decode step: row i of the batch is request i's newest token. */
    err = 0.0;
    for (i = 0; i < NUM_REQS; i++) {
        double e = check_row(&sb, i, &reqs[i]);
        if (!(e <= err)) err = e;
    }
    printf("last decode step vs float64 reference: max abs error %.3g (tolerance %g) %s\n",
           err, tolerance, err <= tolerance ? "OK" : "FAILED");

    for (i = 0; i < NUM_REQS; i++) { free(reqs[i].keys); free(reqs[i].values); }
    free(sb.q); free(sb.k); free(sb.v); free(sb.out); free(sb.slot_mapping);
    if (on_gpu) {
        CHECK(attn_cuda_free(ctx, sb.dq)); CHECK(attn_cuda_free(ctx, sb.dk));
        CHECK(attn_cuda_free(ctx, sb.dv)); CHECK(attn_cuda_free(ctx, sb.dout));
        CHECK(attn_cuda_free(ctx, cache_mem));
    } else {
        free(cache_mem);
    }
    attn_metadata_destroy(meta);
    attn_layer_destroy(layer);
    attn_context_destroy(ctx);
    return err <= tolerance ? 0 : 1;
}
