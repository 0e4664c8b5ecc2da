/* cache_write.cu - paged KV-cache writes by slot mapping (the GPU form of attn__write_kv and
   the CPU MLA backend's latent write).

   Two kernels; a compile defines the constants of the one it builds (either or both):

   attn_reshape_and_cache                          defines: HEAD_DIM DT_IN DT_CACHE
       key/value [tokens, num_kv_heads, HEAD_DIM] (element strides per token and per head;
       the last dimension contiguous) into the standard cache
       [num_blocks, 2, block_size, num_kv_heads, HEAD_DIM] (contiguous). Token t goes to
       slot = slot_mapping[t] (int64): block slot / block_size, row slot % block_size;
       slot -1 skips the token. Values are converted DT_IN -> DT_CACHE (round to nearest
       even); with equal types the bytes are copied unchanged (as the CPU's memcpy).

   attn_concat_and_cache_mla                       defines: KV_LORA_RANK ROPE_DIM DT_IN DT_CACHE
       kv_c [tokens, KV_LORA_RANK] and k_pe [tokens, ROPE_DIM] (token strides in elements)
       into the latent cache [num_blocks, block_size, KV_LORA_RANK + ROPE_DIM]: row
       slot_mapping[t] gets kv_c then k_pe; -1 skips. With it, attn_mla_gather: a chunk of
       one request's latent rows back out of the cache, contiguous (the MLA prefill's
       up-projection operand; below).

   Launch: any grid (x: a grid-stride loop over tokens; one CTA per token up to a few
   thousand is a good default), 128 threads (any multiple of 32 works), no shared memory.
   Each thread moves 8 elements at a time with 16-byte loads and stores when the source
   row and the cache are 16-byte aligned, else element by element. HEAD_DIM, KV_LORA_RANK
   and ROPE_DIM must be multiples of 8. DT_*: 0 f32, 1 f16, 2 bf16. */
#include "attn_common.cuh"

#if !defined(DT_IN) || !defined(DT_CACHE)
#error "cache_write.cu: define DT_IN and DT_CACHE (0 f32, 1 f16, 2 bf16)"
#endif

/* Copies (converting) 8 elements from src to dst; vec: both are 16-byte aligned. */
ATTN_DEV void attn_move8(const void *src, void *dst, int vec) {
    typedef typename attn_elem<DT_IN>::storage in_t;
    typedef typename attn_elem<DT_CACHE>::storage cache_t;
    if (vec) {
        attn_vec16 v[2];
        v[0] = attn_ldg16(src);
        if (attn_elem<DT_IN>::size == 4) v[1] = attn_ldg16((const char *)src + 16);
        if (DT_IN == DT_CACHE) {
            attn_stg16(dst, v[0]);
            if (attn_elem<DT_CACHE>::size == 4) attn_stg16((char *)dst + 16, v[1]);
        } else {
            float f[8];
            attn_vec16 o[2];
            attn_unpack8<DT_IN>(v, f);
            attn_pack8<DT_CACHE>(f, o);
            attn_stg16(dst, o[0]);
            if (attn_elem<DT_CACHE>::size == 4) attn_stg16((char *)dst + 16, o[1]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (DT_IN == DT_CACHE) /* raw bits, as memcpy (NaN payloads kept) */
                ((cache_t *)dst)[i] = (cache_t)((const in_t *)src)[i];
            else
                ((cache_t *)dst)[i] = attn_elem<DT_CACHE>::from_f32(attn_elem<DT_IN>::to_f32(((const in_t *)src)[i]));
        }
    }
}

#ifdef HEAD_DIM
#if HEAD_DIM % 8 != 0
#error "cache_write.cu: HEAD_DIM must be a multiple of 8"
#endif

/* Passed by value; the host declares the same struct (same order, natural alignment). */
struct attn_cache_write_params {
    const void *key;              /* DT_IN [tokens, num_kv_heads, HEAD_DIM] */
    const void *value;            /* DT_IN, same shape */
    void *kv_cache;               /* DT_CACHE [num_blocks, 2, block_size, num_kv_heads, HEAD_DIM] */
    const attn_i64 *slot_mapping; /* [tokens]; -1 skips */
    attn_i64 key_stride_token, key_stride_head;     /* elements */
    attn_i64 value_stride_token, value_stride_head; /* elements */
    int num_tokens;
    int num_kv_heads;
    int block_size;
    int pad0;
};

extern "C" __global__ void attn_reshape_and_cache(const attn_cache_write_params p) {
    const int chunks = HEAD_DIM / 8;                 /* 8-element chunks per head row */
    const int per_side = p.num_kv_heads * chunks;    /* chunks of one token's K (or V) */
    const int esz_in = attn_elem<DT_IN>::size, esz_c = attn_elem<DT_CACHE>::size;
    const int cache_ok = attn_aligned16(p.kv_cache);
    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
        attn_i64 slot = p.slot_mapping[t];
        if (slot < 0) continue;
        attn_i64 blk = slot / p.block_size, off = slot - blk * p.block_size;
        for (int u = threadIdx.x; u < 2 * per_side; u += blockDim.x) {
            int side = u >= per_side;                /* 0: key, 1: value */
            int rem = u - side * per_side, h = rem / chunks, c = rem - h * chunks;
            const char *src = side ? (const char *)p.value + (t * p.value_stride_token + h * p.value_stride_head) * esz_in
                                   : (const char *)p.key + (t * p.key_stride_token + h * p.key_stride_head) * esz_in;
            src += (attn_i64)c * 8 * esz_in;
            attn_i64 dst_el = (((blk * 2 + side) * p.block_size + off) * p.num_kv_heads + h) * (attn_i64)HEAD_DIM + c * 8;
            char *dst = (char *)p.kv_cache + dst_el * esz_c;
            attn_move8(src, dst, cache_ok && attn_aligned16(src));
        }
    }
}
#endif /* HEAD_DIM */

#ifdef KV_LORA_RANK
#if KV_LORA_RANK % 8 != 0 || !defined(ROPE_DIM) || ROPE_DIM % 8 != 0
#error "cache_write.cu: KV_LORA_RANK and ROPE_DIM must be defined, multiples of 8"
#endif

struct attn_latent_write_params {
    const void *kv_c;             /* DT_IN [tokens, KV_LORA_RANK] */
    const void *k_pe;             /* DT_IN [tokens, ROPE_DIM] */
    void *kv_cache;               /* DT_CACHE [num_blocks, block_size, KV_LORA_RANK + ROPE_DIM] */
    const attn_i64 *slot_mapping; /* [tokens]; -1 skips */
    attn_i64 kv_c_stride_token;   /* elements */
    attn_i64 k_pe_stride_token;   /* elements */
    int num_tokens;
    int pad0;
};

extern "C" __global__ void attn_concat_and_cache_mla(const attn_latent_write_params p) {
    const int chunks_c = KV_LORA_RANK / 8, chunks = (KV_LORA_RANK + ROPE_DIM) / 8;
    const int esz_in = attn_elem<DT_IN>::size, esz_c = attn_elem<DT_CACHE>::size;
    const int cache_ok = attn_aligned16(p.kv_cache);
    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
        attn_i64 slot = p.slot_mapping[t];
        if (slot < 0) continue;
        char *row = (char *)p.kv_cache + slot * (attn_i64)(KV_LORA_RANK + ROPE_DIM) * esz_c;
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            const char *src = c < chunks_c
                                  ? (const char *)p.kv_c + (t * p.kv_c_stride_token + (attn_i64)c * 8) * esz_in
                                  : (const char *)p.k_pe + (t * p.k_pe_stride_token + (attn_i64)(c - chunks_c) * 8) * esz_in;
            attn_move8(src, row + (attn_i64)c * 8 * esz_c, cache_ok && attn_aligned16(src));
        }
    }
}

/* The reverse copy for the up-projected prefill: rows key0 .. key0 + nkeys - 1 of one
   request (its block_table row) from the latent cache into a contiguous [nkeys][KV_LORA_RANK
   + ROPE_DIM] of DT_CACHE (the up-projection GEMMs' operand). Any grid (grid-stride over
   16-byte chunks), any block; cache and destination 16-byte aligned. */
struct attn_mla_gather_params {
    const void *kv_cache;
    const int *block_table;
    void *lat;
    int key0, nkeys, block_size, pad0;
};

extern "C" __global__ void attn_mla_gather(const attn_mla_gather_params p) {
    const int row_bytes = (KV_LORA_RANK + ROPE_DIM) * attn_elem<DT_CACHE>::size, cpr = row_bytes / 16;
    for (attn_i64 u = blockIdx.x * (attn_i64)blockDim.x + threadIdx.x; u < (attn_i64)p.nkeys * cpr; u += (attn_i64)gridDim.x * blockDim.x) {
        const int j = (int)(u / cpr), c = (int)(u - (attn_i64)j * cpr), key = p.key0 + j;
        const attn_i64 row = (attn_i64)p.block_table[key / p.block_size] * p.block_size + key % p.block_size;
        attn_stg16((char *)p.lat + (attn_i64)j * row_bytes + c * 16, attn_ldg16((const char *)p.kv_cache + row * row_bytes + c * 16));
    }
}
#endif /* KV_LORA_RANK */
