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
       8-bit caches (DT_CACHE 4 fp8 e4m3, 5 fp8 e5m2, 6 int8; the CPU's attn__cpu_write_kv,
       byte for byte): per tensor (KV_PTH 0, fp8) code(x / k_scale) and code(x / v_scale),
       the scales read from params.k_scale / v_scale (device floats) or the *_value
       fields; a scale that is not finite and > 0 writes nothing. Per token and head
       (KV_PTH 1, int8 / e4m3): a warp per (token, K or V, head) row computes amax (a NaN
       anywhere makes it NaN), scale = amax / 127 (int8) or / 448 (e4m3), stores
       code(x / scale) (0 where scale is 0) and the scale in the block half's scale plane
       (layout: paged_attention.cu, 8-BIT CACHES); HEAD_DIM <= 512.

   attn_concat_and_cache_mla                       defines: KV_LORA_RANK ROPE_DIM DT_IN DT_CACHE
       kv_c [tokens, KV_LORA_RANK] and k_pe [tokens, ROPE_DIM] (token strides in elements)
       into the latent cache [num_blocks, block_size, KV_LORA_RANK + ROPE_DIM]: row
       slot_mapping[t] gets kv_c then k_pe; -1 skips. With it, attn_mla_gather: a chunk of
       one request's latent rows back out of the cache, contiguous (the MLA prefill's
       up-projection operand; below).

   Each has an `_inline` twin (attn_reshape_and_cache_inline, attn_concat_and_cache_mla_
   inline) that takes the slots in its launch parameters instead of a device array (up to
   ATTN__INLINE_SLOTS a launch, params.slot_mapping unused): the host's slot mapping reaches
   the device with the launch itself, with no copy, allocation or synchronisation.

   Launch: any grid (x: a grid-stride loop over tokens; one CTA per token up to a few
   thousand is a good default), 128 threads (any multiple of 32 works), no shared memory.
   Each thread moves 8 elements at a time with 16-byte loads and stores when the source
   row and the cache are 16-byte aligned, else element by element. HEAD_DIM, KV_LORA_RANK
   and ROPE_DIM must be multiples of 8. DT_*: 0 f32, 1 f16, 2 bf16 (DT_CACHE also 4-6). */
#include "attn_common.cuh"
#include "attn_params.cuh" /* the write and gather parameters */

#if !defined(DT_IN) || !defined(DT_CACHE)
#error "cache_write.cu: define DT_IN and DT_CACHE (0 f32, 1 f16, 2 bf16; DT_CACHE 4-6: 8-bit)"
#endif
#ifndef KV_PTH
#define KV_PTH 0
#endif
#define ATTN_CACHE8 ATTN_DT_IS_8BIT(DT_CACHE)
#if ATTN_CACHE8 && defined(KV_LORA_RANK) && DT_CACHE == ATTN_DT_I8
#error "cache_write.cu: a latent cache takes fp8 (per-tensor scale), not int8"
#endif
/* DT_CACHE 9 (ATTN_DT_DS_MLA): DeepSeek-V3.2's 656-byte latent rows, KV_LORA_RANK 512 and
   ROPE_DIM 64 only: per 128 values of kv_c a scale s = max(max |x| / 448, FLT_MIN) and the
   e4m3 codes of x / s (the CPU's attn__ds_mla_row_store, byte for byte), k_pe as bf16 */
#define ATTN_DS (DT_CACHE == ATTN_DT_DS_MLA)
#if ATTN_DS && (!defined(KV_LORA_RANK) || KV_LORA_RANK != 512 || ROPE_DIM != 64)
#error "cache_write.cu: DT_CACHE 9 (fp8_ds_mla) is a latent cache of 512 + 64 only"
#endif

/* Whether every one of n slots is in [-1, num_slots). Slots from device memory (check_slots)
   are checked by every CTA, all of them, before it writes: a bad one anywhere makes every
   CTA write nothing, as the host-side check of host slots would (the host cannot read
   device slots without a synchronisation). */
ATTN_DEV int attn_slots_valid(const attn_i64 *slots, int n, attn_i64 num_slots) {
    int bad = 0;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const attn_i64 s = slots[t];
        bad |= s < -1 || s >= num_slots;
    }
    return !__syncthreads_or(bad);
}

#if ATTN_CACHE8
/* 8 elements of DT_IN as f32 (16-byte loads where vec) */
ATTN_DEV void attn_load8_in(const void *src, int vec, float *f) {
    if (vec) {
        attn_vec16 v[2];
        v[0] = attn_ldg16(src);
        if (attn_elem<DT_IN>::size == 4) v[1] = attn_ldg16((const char *)src + 16);
        attn_unpack8<DT_IN>(v, f);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = attn_load<DT_IN>(src, i);
    }
}
/* the codes of f[i] / div (IEEE division, as the CPU; 0 where zero) as 8 bytes at dst */
ATTN_DEV void attn_store8_codes(void *dst, const float *f, float div, int zero) {
    attn_u32 w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; i++) w[i >> 2] |= (zero ? 0u : attn_f32_to_code<DT_CACHE>(f[i] / div)) << (8 * (i & 3));
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(dst), "r"(w[0]), "r"(w[1]) : "memory");
}
#endif

#if !ATTN_CACHE8 && !ATTN_DS
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
#endif

#ifdef HEAD_DIM
#if HEAD_DIM % 8 != 0
#error "cache_write.cu: HEAD_DIM must be a multiple of 8"
#endif

#if ATTN_CACHE8 && KV_PTH
#if HEAD_DIM > 512
#error "cache_write.cu: per-token-head scales take HEAD_DIM <= 512"
#endif
/* NaN-sticky max (the CPU's amax loop) */
ATTN_DEV float attn_amax2(float a, float b) { return a != a || b != b ? __int_as_float(0x7fc00000) : fmaxf(a, b); }

ATTN_DEV void attn_reshape_and_cache_body(const attn__cache_write_params &p, const attn_i64 *slots) {
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5, rows = 2 * p.num_kv_heads;
    if (p.check_slots && !attn_slots_valid(slots, p.num_tokens, p.num_slots)) return;
    const float qmax = DT_CACHE == ATTN_DT_I8 ? 127.0f : 448.0f;
    const attn_i64 half = (attn_i64)p.block_size * p.num_kv_heads * (HEAD_DIM + 4); /* bytes of a block half */
    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
        const attn_i64 slot = slots[t];
        if (slot < 0) continue;
        const attn_i64 blk = slot / p.block_size, off = slot - blk * p.block_size;
        for (int row = threadIdx.x >> 5; row < rows; row += warps) {
            const int side = row >= p.num_kv_heads, h = row - side * p.num_kv_heads;
            const char *src = side ? (const char *)p.value + (t * p.value_stride_token + h * p.value_stride_head) * attn_elem<DT_IN>::size
                                   : (const char *)p.key + (t * p.key_stride_token + h * p.key_stride_head) * attn_elem<DT_IN>::size;
            char *base = (char *)p.kv_cache + blk * 2 * half + side * half;
            const attn_i64 x = off * p.num_kv_heads + h; /* row in the block half */
            constexpr int CPL = (HEAD_DIM / 8 + 31) / 32; /* 8-element chunks per lane: 2 past 256 */
            float f[CPL][8];
            float amax = 0.0f;
#pragma unroll
            for (int k = 0; k < CPL; k++) {
                const int c = lane + 32 * k;
                if (c < HEAD_DIM / 8) {
                    const char *s = src + (attn_i64)c * 8 * attn_elem<DT_IN>::size;
                    attn_load8_in(s, attn_aligned16(s), f[k]);
#pragma unroll
                    for (int i = 0; i < 8; i++) amax = attn_amax2(amax, fabsf(f[k][i]));
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) amax = attn_amax2(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float scale = amax / qmax; /* NaN or inf rows read back NaN */
#pragma unroll
            for (int k = 0; k < CPL; k++)
                if (lane + 32 * k < HEAD_DIM / 8)
                    attn_store8_codes(base + x * HEAD_DIM + (lane + 32 * k) * 8, f[k], scale, !(scale > 0.0f));
            if (lane == 0) *(float *)(base + (attn_i64)p.block_size * p.num_kv_heads * HEAD_DIM + x * 4) = scale;
        }
    }
}
#else
ATTN_DEV void attn_reshape_and_cache_body(const attn__cache_write_params &p, const attn_i64 *slots) {
    const int chunks = HEAD_DIM / 8;                 /* 8-element chunks per head row */
    if (p.check_slots && !attn_slots_valid(slots, p.num_tokens, p.num_slots)) return;
    const int per_side = p.num_kv_heads * chunks;    /* chunks of one token's K (or V) */
    const int esz_in = attn_elem<DT_IN>::size, esz_c = ATTN_DT_SIZE(DT_CACHE);
#if !ATTN_CACHE8
    const int cache_ok = attn_aligned16(p.kv_cache);
#else
    const float ks = attn_cache_scale(p.k_scale, p.k_scale_value), vs = attn_cache_scale(p.v_scale, p.v_scale_value);
    if (ks == 0.0f || vs == 0.0f) return; /* a bad scale: nothing written */
#endif
    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
        attn_i64 slot = slots[t];
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
#if ATTN_CACHE8
            float f[8];
            attn_load8_in(src, attn_aligned16(src), f);
            attn_store8_codes(dst, f, side ? vs : ks, 0);
#else
            attn_move8(src, dst, cache_ok && attn_aligned16(src));
#endif
        }
    }
}
#endif /* KV_PTH */

extern "C" __global__ void attn_reshape_and_cache(const __grid_constant__ attn__cache_write_params p) {
    attn_reshape_and_cache_body(p, p.slot_mapping);
}
extern "C" __global__ void attn_reshape_and_cache_inline(const __grid_constant__ attn__cache_write_inline_params ip) {
    attn_reshape_and_cache_body(ip.p, ip.slots);
}
#endif /* HEAD_DIM */

#ifdef KV_LORA_RANK
#if KV_LORA_RANK % 8 != 0 || !defined(ROPE_DIM) || ROPE_DIM % 8 != 0
#error "cache_write.cu: KV_LORA_RANK and ROPE_DIM must be defined, multiples of 8"
#endif

#if ATTN_DS
/* fp8_ds_mla: warp w < 4 writes tile w of kv_c (each lane 4 values; the tile's max |x| by a
   warp reduction), threads 0 .. 63 k_pe. Needs blockDim >= 128 (attn.h launches 128). */
ATTN_DEV void attn_concat_and_cache_mla_body(const attn__latent_write_params &p, const attn_i64 *slots) {
    if (p.check_slots && !attn_slots_valid(slots, p.num_tokens, p.num_slots)) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
        const attn_i64 slot = slots[t];
        if (slot < 0) continue;
        char *row = (char *)p.kv_cache + slot * (attn_i64)ATTN_DS_MLA_ROW;
        if (warp < 4) {
            const char *src = (const char *)p.kv_c + (t * p.kv_c_stride_token + 128 * warp + 4 * lane) * attn_elem<DT_IN>::size;
            float f[4], amax = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                f[i] = attn_load<DT_IN>(src, i);
                amax = fmaxf(amax, fabsf(f[i]));
            }
            amax = attn_warp_max(amax);
            const float sc = fmaxf(amax / 448.0f, 1.17549435e-38f); /* FLT_MIN */
            attn_u32 w = 0u;
#pragma unroll
            for (int i = 0; i < 4; i++) w |= attn_f32_to_code<ATTN_DT_E4M3>(f[i] / sc) << (8 * i);
            *(attn_u32 *)(row + 128 * warp + 4 * lane) = w;
            if (lane == 0) *(float *)(row + 512 + 4 * warp) = sc;
        }
        if (tid < 64) {
            const char *src = (const char *)p.k_pe + (t * p.k_pe_stride_token + tid) * attn_elem<DT_IN>::size;
            *(attn_u16 *)(row + 528 + 2 * tid) = attn_elem<ATTN_DT_BF16>::from_f32(attn_load<DT_IN>(src, 0));
        }
    }
}
#else
ATTN_DEV void attn_concat_and_cache_mla_body(const attn__latent_write_params &p, const attn_i64 *slots) {
    const int chunks_c = KV_LORA_RANK / 8, chunks = (KV_LORA_RANK + ROPE_DIM) / 8;
    if (p.check_slots && !attn_slots_valid(slots, p.num_tokens, p.num_slots)) return;
    const int esz_in = attn_elem<DT_IN>::size, esz_c = ATTN_DT_SIZE(DT_CACHE);
    const int cache_ok = attn_aligned16(p.kv_cache);
#if ATTN_CACHE8 /* code(x / scale), the CPU's bytes */
    const float ks = attn_cache_scale(p.k_scale, p.k_scale_value);
    if (ks == 0.0f) return;
#endif
    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
        attn_i64 slot = slots[t];
        if (slot < 0) continue;
        char *row = (char *)p.kv_cache + slot * (attn_i64)(KV_LORA_RANK + ROPE_DIM) * esz_c;
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            const char *src = c < chunks_c
                                  ? (const char *)p.kv_c + (t * p.kv_c_stride_token + (attn_i64)c * 8) * esz_in
                                  : (const char *)p.k_pe + (t * p.k_pe_stride_token + (attn_i64)(c - chunks_c) * 8) * esz_in;
#if ATTN_CACHE8
            float f[8];
            (void)cache_ok;
            attn_load8_in(src, attn_aligned16(src), f);
            attn_store8_codes(row + (attn_i64)c * 8, f, ks, 0);
#else
            attn_move8(src, row + (attn_i64)c * 8 * esz_c, cache_ok && attn_aligned16(src));
#endif
        }
    }
}
#endif /* ATTN_DS */

extern "C" __global__ void attn_concat_and_cache_mla(const __grid_constant__ attn__latent_write_params p) {
    attn_concat_and_cache_mla_body(p, p.slot_mapping);
}
extern "C" __global__ void attn_concat_and_cache_mla_inline(const __grid_constant__ attn__latent_write_inline_params ip) {
    attn_concat_and_cache_mla_body(ip.p, ip.slots);
}

/* The reverse copy for the up-projected prefill: rows key0 .. key0 + nkeys - 1 of one
   request (its block_table row) from the latent cache into a contiguous [nkeys][KV_LORA_RANK
   + ROPE_DIM] of DT_CACHE (the up-projection GEMMs' operand). Any grid (grid-stride over
   16-byte chunks), any block; cache and destination 16-byte aligned. */

extern "C" __global__ void attn_mla_gather(const attn__mla_gather_params p) {
#if ATTN_DS /* fp8_ds_mla serves the sparse call only: no up-projected prefill reads it */
    (void)p;
    attn_trap();
#elif ATTN_CACHE8 /* dequantizing: 8 codes -> 8 DT_IN elements (16 bytes at bf16/f16) per step */
    const int D = KV_LORA_RANK + ROPE_DIM, cpr = D / 8;
    const float ks = attn_cache_scale(p.k_scale, p.k_scale_value) * attn_code_factor<DT_CACHE>();
    if (ks == 0.0f) return;
    for (attn_i64 u = blockIdx.x * (attn_i64)blockDim.x + threadIdx.x; u < (attn_i64)p.nkeys * cpr; u += (attn_i64)gridDim.x * blockDim.x) {
        const int j = (int)(u / cpr), c = (int)(u - (attn_i64)j * cpr), key = p.key0 + j;
        const attn_i64 row = (attn_i64)p.block_table[key / p.block_size] * p.block_size + key % p.block_size;
        const attn_u32 *src = (const attn_u32 *)((const char *)p.kv_cache + row * D + c * 8);
        attn_u32 h[4];
        float f[8];
        attn_vec16 o[2];
        attn_codes4_to_f16x2<DT_CACHE>(src[0], h[0], h[1]);
        attn_codes4_to_f16x2<DT_CACHE>(src[1], h[2], h[3]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = attn_f16_to_f32((attn_u16)(h[i] & 0xffffu)) * ks;
            f[2 * i + 1] = attn_f16_to_f32((attn_u16)(h[i] >> 16)) * ks;
        }
        attn_pack8<DT_IN>(f, o);
        char *dst = (char *)p.lat + ((attn_i64)j * D + c * 8) * attn_elem<DT_IN>::size;
        attn_stg16(dst, o[0]);
        if (attn_elem<DT_IN>::size == 4) attn_stg16(dst + 16, o[1]);
    }
#else
    const int row_bytes = (KV_LORA_RANK + ROPE_DIM) * attn_elem<DT_CACHE>::size, cpr = row_bytes / 16;
    for (attn_i64 u = blockIdx.x * (attn_i64)blockDim.x + threadIdx.x; u < (attn_i64)p.nkeys * cpr; u += (attn_i64)gridDim.x * blockDim.x) {
        const int j = (int)(u / cpr), c = (int)(u - (attn_i64)j * cpr), key = p.key0 + j;
        const attn_i64 row = (attn_i64)p.block_table[key / p.block_size] * p.block_size + key % p.block_size;
        attn_stg16((char *)p.lat + (attn_i64)j * row_bytes + c * 16, attn_ldg16((const char *)p.kv_cache + row * row_bytes + c * 16));
    }
#endif
}
#endif /* KV_LORA_RANK */
