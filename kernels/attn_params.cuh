/* attn_params.cuh - every struct that crosses from the host into a kernel, defined once.

   The kernels include it (NVRTC is handed it as a named header, like every .cuh), and
   tools/embed.py copies it verbatim into attn.h's host part, between the >>params-begin /
   >>params-end markers of the >>cuda section; `make test` fails when that copy is stale. So
   this file is valid C99 and CUDA C++ at once: fixed-width members (int, float, long long),
   8-byte members first or padded to 8 by hand, no member functions. A pointer member is
   ATTN__DPTR(T): T * in a kernel, a 64-bit device address (attn__CUdeviceptr) on the host.

   Launch configurations: every attention kernel exports an attn__launch_config in
   __constant__ memory (attn_paged_config, attn_mla_config, attn_mha_config) that the host
   reads after loading the module: block size, dynamic shared memory and the tile shape the
   host's schedule must agree with. */
#ifndef ATTN_PARAMS_CUH
#define ATTN_PARAMS_CUH

#ifdef __CUDACC__
#define ATTN__DPTR(T) T *
#else
#define ATTN__DPTR(T) attn__CUdeviceptr
#endif

/* Slots an _inline cache write carries in its parameters (kernels/cache_write.cu): with the
   write's own parameters under the 4 KiB every driver takes. */
#define ATTN__INLINE_SLOTS 448

/* A kernel's launch configuration, named (the __constant__ each attention kernel exports). */
typedef struct attn__launch_config {
    int threads;       /* block size */
    int shared_bytes;  /* dynamic shared memory a CTA needs */
    int kv_tile;       /* keys per pipeline stage */
    int rows;          /* paged: query rows of a CTA (tile_tokens x GROUP, padded); MLA decode:
                          heads of one token per CTA (its partials' rows); MLA prefill: query
                          rows of one head per CTA */
    int tile_tokens;   /* paged: query tokens of a work item (the schedule's tile); MLA: 1 */
    int kv_stages;     /* pipeline depth */
    int warps;         /* paged: warps across the head dimension (WARPS_N); MLA: warps */
    int uses_mma;      /* 1: tensor cores (mma.sync / wgmma); 0: the FMA path */
    int tma_box_rows;  /* kernels that read the cache through a tensor map (the first kernel
                          parameter, attn_tma_map): the key rows of one box; 0: no map */
    int persistent;    /* 1: the CTAs loop over the work items, so any grid runs them all (a
                          captured launch takes one wave); 0: one CTA per item */
} attn__launch_config;

/* attn_paged_attention, attn_paged_merge_partials (paged_attention.cu) and
   attn_paged_prefill_sm90 (paged_prefill_sm90.cu). Strides in elements. The kernels that
   take it define TILE_TOKENS, GROUP and HEAD_DIM (the comments' shapes). */
typedef struct attn__paged_params {
    ATTN__DPTR(const void) q;               /* DT_Q [tokens, num_heads, HEAD_DIM] */
    ATTN__DPTR(const void) kv_cache;        /* DT_KV [num_blocks, 2, BLOCK_SIZE, num_kv_heads, HEAD_DIM] */
    ATTN__DPTR(void) out;                   /* DT_Q [tokens, num_heads, HEAD_DIM] */
    ATTN__DPTR(float) lse;                  /* f32 [tokens, num_heads], base e; NULL: not written */
    ATTN__DPTR(const int) block_table;      /* [num_reqs, block_table_stride] */
    ATTN__DPTR(const int) seq_lens;         /* [num_reqs] */
    ATTN__DPTR(const int) query_start_loc;  /* [num_reqs + 1] */
    ATTN__DPTR(const float) alibi_slopes;   /* [num_heads] (ALIBI) */
    ATTN__DPTR(const int) work;             /* [capacity][8], see paged_attention.cu's WORK LIST */
    ATTN__DPTR(const int) num_work;         /* one int: entries of `work` this launch runs */
    ATTN__DPTR(const int) merge;            /* [capacity][8], see MERGE LIST */
    ATTN__DPTR(const int) num_merge;        /* one int */
    ATTN__DPTR(float) partial_o;            /* [num_slots][TILE_TOKENS*GROUP][HEAD_DIM] */
    ATTN__DPTR(float) partial_ml;           /* [num_slots][TILE_TOKENS*GROUP][2] */
    ATTN__DPTR(int) merge_count;            /* [merge capacity] FUSED MERGE arrivals, zero between
                                               launches; NULL: merges only by attn_paged_merge_partials */
    ATTN__DPTR(const float) k_scale;        /* 8-bit caches with per-tensor scales: one float each
                                               on the device, read at every launch; NULL: the value */
    ATTN__DPTR(const float) v_scale;
    ATTN__DPTR(const float) sinks;          /* [num_heads] attention sinks (natural-log logits),
                                               read at every launch; NULL: none */
    ATTN__DPTR(const float) prefix_o;       /* cascade (paged_attention.cu, CASCADE): the prefix
                                               pass's partials [slots][prefix_rows][HEAD_DIM] */
    ATTN__DPTR(const float) prefix_ml;      /* [slots][prefix_rows][2] */
    ATTN__DPTR(const int) prefix_splits;    /* one int: the prefix pass's splits (0: no prefix in
                                               this launch's batch); NULL: never */
    long long q_stride_token, q_stride_head;
    long long out_stride_token, out_stride_head;
    long long lse_stride_token, lse_stride_head;
    long long block_table_stride;
    int num_kv_heads;
    float scale;                            /* softmax scale */
    float softcap;                          /* SOFTCAP: the cap (> 0) */
    int window;                             /* WINDOW: sliding window in tokens (0: none) */
    float k_scale_value, v_scale_value;     /* where k_scale / v_scale are NULL */
    int prefix_tile_tokens, prefix_rows;    /* cascade: the prefix pass's query tokens and rows
                                               per partial slot */
    int dcp_world_size, dcp_rank;           /* decode context parallelism (attn_metadata_desc): */
    int dcp_interleave, dcp_pad;            /*   keys are this rank's local indices; size 1: off */
} attn__paged_params;

/* attn_reshape_and_cache (cache_write.cu): key/value rows into the standard cache. */
typedef struct attn__cache_write_params {
    ATTN__DPTR(const void) key;             /* DT_IN [tokens, num_kv_heads, HEAD_DIM] */
    ATTN__DPTR(const void) value;           /* DT_IN, same shape */
    ATTN__DPTR(void) kv_cache;              /* DT_CACHE [num_blocks, 2, block_size, num_kv_heads, HEAD_DIM] */
    ATTN__DPTR(const long long) slot_mapping; /* [tokens]; -1 skips (the _inline kernel: unused) */
    ATTN__DPTR(const float) k_scale;        /* 8-bit per-tensor caches: device floats, NULL: *_value */
    ATTN__DPTR(const float) v_scale;
    long long key_stride_token, key_stride_head;     /* elements */
    long long value_stride_token, value_stride_head; /* elements */
    long long num_slots;                    /* num_blocks * block_size: slots are -1 .. num_slots - 1 */
    int num_tokens;
    int num_kv_heads;
    int block_size;
    float k_scale_value, v_scale_value;
    int check_slots;                        /* 1: slots the host has not checked (device memory):
                                               every CTA checks them all first, and none writes
                                               when one is out of range */
} attn__cache_write_params;

/* attn_reshape_and_cache_inline: the same with the slots in the parameters. */
typedef struct attn__cache_write_inline_params {
    attn__cache_write_params p;
    long long slots[ATTN__INLINE_SLOTS];    /* [p.num_tokens]; -1 skips */
} attn__cache_write_inline_params;

/* attn_concat_and_cache_mla (cache_write.cu): kv_c and k_pe rows into the latent cache. */
typedef struct attn__latent_write_params {
    ATTN__DPTR(const void) kv_c;            /* DT_IN [tokens, KV_LORA_RANK] */
    ATTN__DPTR(const void) k_pe;            /* DT_IN [tokens, ROPE_DIM] */
    ATTN__DPTR(void) kv_cache;              /* DT_CACHE [num_blocks, block_size, KV_LORA_RANK + ROPE_DIM] */
    ATTN__DPTR(const long long) slot_mapping; /* [tokens]; -1 skips (the _inline kernel: unused) */
    long long kv_c_stride_token;            /* elements */
    long long k_pe_stride_token;            /* elements */
    long long num_slots;                    /* num_blocks * block_size */
    int num_tokens;
    int check_slots;                        /* as attn__cache_write_params */
    ATTN__DPTR(const float) k_scale;        /* fp8 latent: the per-tensor scale (device float; NULL: value) */
    float k_scale_value;
    int pad1;
} attn__latent_write_params;

typedef struct attn__latent_write_inline_params {
    attn__latent_write_params p;
    long long slots[ATTN__INLINE_SLOTS];    /* [p.num_tokens]; -1 skips */
} attn__latent_write_inline_params;

/* attn_mla_gather (cache_write.cu): a chunk of one request's latent rows, contiguous. */
typedef struct attn__mla_gather_params {
    ATTN__DPTR(const void) kv_cache;
    ATTN__DPTR(const int) block_table;
    ATTN__DPTR(void) lat;                   /* DT_CACHE rows; an fp8 latent: DT_IN rows, code * scale */
    int key0, nkeys, block_size, pad0;
    ATTN__DPTR(const float) k_scale;        /* fp8 latent (as attn__latent_write_params) */
    float k_scale_value;
    int pad1;
} attn__mla_gather_params;

/* attn_merge_attn_states (merge.cu). */
typedef struct attn__merge_params {
    ATTN__DPTR(const void) out_a;
    ATTN__DPTR(const float) lse_a;
    ATTN__DPTR(const void) out_b;
    ATTN__DPTR(const float) lse_b;
    ATTN__DPTR(void) out;
    ATTN__DPTR(float) lse;                  /* NULL: no LSE output */
    long long out_a_stride_token, out_a_stride_head; /* elements */
    long long out_b_stride_token, out_b_stride_head;
    long long out_stride_token, out_stride_head;
    long long lse_a_stride_token, lse_a_stride_head;
    long long lse_b_stride_token, lse_b_stride_head;
    long long lse_stride_token, lse_stride_head;
    int num_tokens;
    int num_heads;
    int base_a, base_b, base_out;           /* 0: base e, 1: base 2 */
    int pad0;
} attn__merge_params;

/* attn_dcp_combine (merge.cu): the n partials of decode context parallelism joined by LSE
   in one pass. Every input has the same strides (the host checks; else it folds pairwise
   merges). */
#define ATTN__COMBINE_MAX 64
typedef struct attn__combine_params {
    ATTN__DPTR(const void) outs[ATTN__COMBINE_MAX]; /* DT [tokens, heads, HEAD_DIM] each */
    ATTN__DPTR(const float) lses[ATTN__COMBINE_MAX]; /* f32 [tokens, heads], base e */
    ATTN__DPTR(void) out;
    ATTN__DPTR(float) lse;                  /* NULL: no LSE output */
    long long in_stride_token, in_stride_head;   /* elements, every input */
    long long lse_in_stride_token, lse_in_stride_head;
    long long out_stride_token, out_stride_head;
    long long lse_stride_token, lse_stride_head;
    int n, num_tokens, num_heads;
    int vec16;                              /* every row 16-byte aligned, HEAD_DIM % 8 == 0 */
} attn__combine_params;

/* attn_mla_decode, attn_mla_merge (mla_decode.cu, mla_decode_sm90.cu): the work list and
   partials are described at the top of mla_decode_sm90.cu. */
typedef struct attn__mla_decode_params {
    ATTN__DPTR(const void) q;               /* [.., num_heads, >= KV_LORA] q_latent */
    ATTN__DPTR(const void) q_pe;            /* [.., num_heads, ROPE] */
    ATTN__DPTR(const void) kv_cache;        /* [num_blocks, BLOCK_SIZE, KV_LORA + ROPE] */
    ATTN__DPTR(void) out;                   /* [.., num_heads, KV_LORA] */
    ATTN__DPTR(float) lse;                  /* [.., num_heads] or NULL */
    ATTN__DPTR(const int) block_table;      /* [reqs][block_table_stride] */
    ATTN__DPTR(const int) work;
    ATTN__DPTR(const int) num_work;
    ATTN__DPTR(const int) merge;
    ATTN__DPTR(const int) num_merge;
    ATTN__DPTR(float) partial_o;            /* [slots][ROWS][KV_LORA] */
    ATTN__DPTR(float) partial_lse;          /* [slots][ROWS] (base 2) */
    long long q_stride_token, q_stride_head, q_pe_stride_token, q_pe_stride_head;
    long long out_stride_token, out_stride_head, lse_stride_token, lse_stride_head;
    long long block_table_stride;
    int num_heads;
    float scale;
    ATTN__DPTR(const float) k_scale;        /* fp8 latent (DT_KV 4/5): the per-tensor scale, one
                                               device float read at every launch; NULL: the value */
    float k_scale_value;
    int pad0;
    /* sparse MLA (mla_decode.cu, SPARSE 1): query token t attends the positions of its
       request that indices[t][0 .. topk) name (-1 or out of [0, seq_len): skipped) */
    ATTN__DPTR(const int) indices;          /* [tokens][indices_stride] int32 */
    ATTN__DPTR(const int) seq_lens;         /* [reqs] */
    ATTN__DPTR(const int) token_req;        /* [tokens]: each batch token's request */
    ATTN__DPTR(const float) sinks;          /* [num_heads] natural-log sinks (SPARSE) or NULL */
    long long indices_stride;
    int topk;
    int pad1;
} attn__mla_decode_params;

/* attn_mla_prefill (mla_prefill.cu, mla_prefill_sm90.cu): one launch per request and chunk
   of keys (mla_prefill_sm90.cu's top comment). */
typedef struct attn__mla_prefill_params {
    ATTN__DPTR(const void) q;               /* [rows][heads][>= DN]: the first DN columns of the query */
    ATTN__DPTR(const void) q_pe;            /* [rows][heads][ROPE] */
    ATTN__DPTR(const void) k_nope;          /* [keys][heads][DN] */
    ATTN__DPTR(const void) k_pe;            /* [keys][ROPE] */
    ATTN__DPTR(const void) v;               /* [keys][heads][DV] */
    ATTN__DPTR(void) out;                   /* [rows][heads][DV] */
    ATTN__DPTR(float) lse;                  /* [rows][heads] (base e) or NULL; required with MERGE */
    long long q_stride_token, q_stride_head, q_pe_stride_token, q_pe_stride_head;
    long long k_stride_token, k_stride_head, kpe_stride_token, v_stride_token, v_stride_head;
    long long out_stride_token, out_stride_head, lse_stride_token, lse_stride_head;
    int q_row0, nq, pos0, key_pos0, nkeys, flags; /* flags: 1 causal, 2 merge into out/lse */
    float scale;
    int dcp_world_size, dcp_rank, dcp_interleave; /* DCP (attn_metadata_desc's): keys are the rank's
                                                     local indices, key_pos0 one of them; size 1: off */
} attn__mla_prefill_params;

/* Each size is the sum of its members' (no implicit padding anywhere, so the host's C
   compiler and the device's agree on every offset); a member added or moved must keep
   that, and the sizes here are updated with it. */
#define ATTN__PARAMS_SIZE(T, n) typedef char T##_size_check[sizeof(T) == (n) ? 1 : -1]
ATTN__PARAMS_SIZE(attn__launch_config, 40);
ATTN__PARAMS_SIZE(attn__paged_params, 21 * 8 + 7 * 8 + 12 * 4);
ATTN__PARAMS_SIZE(attn__cache_write_params, 6 * 8 + 5 * 8 + 6 * 4);
ATTN__PARAMS_SIZE(attn__cache_write_inline_params, 112 + ATTN__INLINE_SLOTS * 8);
ATTN__PARAMS_SIZE(attn__latent_write_params, 4 * 8 + 3 * 8 + 2 * 4 + 8 + 2 * 4);
ATTN__PARAMS_SIZE(attn__latent_write_inline_params, 80 + ATTN__INLINE_SLOTS * 8);
ATTN__PARAMS_SIZE(attn__mla_gather_params, 3 * 8 + 4 * 4 + 8 + 2 * 4);
ATTN__PARAMS_SIZE(attn__merge_params, 6 * 8 + 12 * 8 + 6 * 4);
ATTN__PARAMS_SIZE(attn__combine_params, 2 * 64 * 8 + 2 * 8 + 8 * 8 + 4 * 4);
ATTN__PARAMS_SIZE(attn__mla_decode_params, 12 * 8 + 9 * 8 + 2 * 4 + 8 + 2 * 4 + 4 * 8 + 8 + 2 * 4);
ATTN__PARAMS_SIZE(attn__mla_prefill_params, 7 * 8 + 13 * 8 + 10 * 4);
#undef ATTN__PARAMS_SIZE

#endif /* ATTN_PARAMS_CUH */
