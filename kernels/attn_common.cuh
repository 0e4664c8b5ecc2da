/* attn_common.cuh - helpers shared by every kernel of attn.h.

   Compiled by NVRTC with no include path: nothing here includes a CUDA header. Element
   types are plain 16-bit storage converted with PTX `cvt` (round to nearest even; NaN stays
   NaN), tensor cores are reached through inline PTX (mma.sync, ldmatrix), global -> shared
   copies through cp.async. Needs sm_80 or newer (bf16 cvt, cp.async, bf16 mma).

   Element types are numbered as the kernels' defines use them:
       0 = f32, 1 = f16, 2 = bf16     (DT, DT_Q, DT_KV, DT_IN, DT_CACHE, ...)
       4 = fp8 e4m3, 5 = fp8 e5m2, 6 = int8   (KV caches only: DT_KV, DT_CACHE; attn.h's
                                               attn_dtype numbers)
   attn_elem<ET> gives the storage type, its size and the conversions of 0-2; the 8-bit
   codes have their own section (attn_f32_to_code, attn_codes4_to_f16x2). */
#ifndef ATTN_COMMON_CUH
#define ATTN_COMMON_CUH

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 800
#error "attn.h kernels need sm_80 or newer (cp.async, bf16 cvt and mma)"
#endif

typedef signed char attn_i8;
typedef unsigned char attn_u8;
typedef unsigned short attn_u16;
typedef int attn_i32;
typedef unsigned int attn_u32;
typedef long long attn_i64;
typedef unsigned long long attn_u64;

#define ATTN_DT_F32 0
#define ATTN_DT_F16 1
#define ATTN_DT_BF16 2
#define ATTN_DT_E4M3 4
#define ATTN_DT_E5M2 5
#define ATTN_DT_I8 6
#define ATTN_DT_IS_8BIT(t) ((t) >= ATTN_DT_E4M3 && (t) <= ATTN_DT_I8)
/* DeepSeek-V3.2's latent rows (attn.h's fp8_ds_mla): 656 bytes, 512 e4m3 codes, 4 f32
   scales (one per 128 codes), 64 bf16 values; MLA caches only (DT_CACHE, DT_KV) */
#define ATTN_DT_DS_MLA 9
#define ATTN_DS_MLA_ROW 656
#define ATTN_DT_SIZE(t) ((t) == ATTN_DT_F32 ? 4 : ATTN_DT_IS_8BIT(t) ? 1 : 2) /* bytes */

#define ATTN_DEV __device__ __forceinline__

#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_LN2 0.6931471805599453f

/* Sixteen bytes moved as one unit (a 16-byte vector load or store). */
struct __align__(16) attn_vec16 { attn_u32 x, y, z, w; };

/* ---- infinities and NaN without <math.h> constants ---- */
ATTN_DEV float attn_inf(void) { return __int_as_float(0x7f800000); }
ATTN_DEV float attn_neg_inf(void) { return __int_as_float(0xff800000); }
ATTN_DEV float attn_nan(void) { return __int_as_float(0x7fc00000); }
/* max(a, b), NaN if either is NaN (PTX max.NaN, sm_80+): fmaxf returns the other one. */
ATTN_DEV float attn_fmax_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

/* ---- scalar conversions (PTX cvt: round to nearest even, NaN kept as a NaN) ---- */
ATTN_DEV float attn_f16_to_f32(attn_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
ATTN_DEV attn_u16 attn_f32_to_f16(float f) {
    attn_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
ATTN_DEV float attn_bf16_to_f32(attn_u16 h) { return __int_as_float((int)((attn_u32)h << 16)); }
ATTN_DEV attn_u16 attn_f32_to_bf16(float f) {
    attn_u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

/* Two floats -> one 32-bit register of two 16-bit values, `lo` in the low half (the
   element with the lower index in memory and in mma fragments). */
ATTN_DEV attn_u32 attn_pack_f16x2(float lo, float hi) {
    attn_u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
ATTN_DEV attn_u32 attn_pack_bf16x2(float lo, float hi) {
    attn_u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* ---- element types ---- */
template <int ET> struct attn_elem;
template <> struct attn_elem<ATTN_DT_F32> {
    typedef float storage;
    enum { size = 4 };
    static ATTN_DEV float to_f32(float x) { return x; }
    static ATTN_DEV float from_f32(float x) { return x; }
};
template <> struct attn_elem<ATTN_DT_F16> {
    typedef attn_u16 storage;
    enum { size = 2 };
    static ATTN_DEV float to_f32(attn_u16 x) { return attn_f16_to_f32(x); }
    static ATTN_DEV attn_u16 from_f32(float x) { return attn_f32_to_f16(x); }
    static ATTN_DEV attn_u32 pack2(float lo, float hi) { return attn_pack_f16x2(lo, hi); }
};
template <> struct attn_elem<ATTN_DT_BF16> {
    typedef attn_u16 storage;
    enum { size = 2 };
    static ATTN_DEV float to_f32(attn_u16 x) { return attn_bf16_to_f32(x); }
    static ATTN_DEV attn_u16 from_f32(float x) { return attn_f32_to_bf16(x); }
    static ATTN_DEV attn_u32 pack2(float lo, float hi) { return attn_pack_bf16x2(lo, hi); }
};

/* Element i of an array of type ET, as f32; and the store back (rounded to nearest even). */
template <int ET> ATTN_DEV float attn_load(const void *p, attn_i64 i) {
    return attn_elem<ET>::to_f32(((const typename attn_elem<ET>::storage *)p)[i]);
}
template <int ET> ATTN_DEV void attn_store(void *p, attn_i64 i, float x) {
    ((typename attn_elem<ET>::storage *)p)[i] = attn_elem<ET>::from_f32(x);
}

/* Eight consecutive elements of type ET from registers holding their raw bytes (16 bytes
   of f16/bf16, or 32 bytes of f32 as two vectors) to f32, and back. */
template <int ET> ATTN_DEV void attn_unpack8(const attn_vec16 *v, float *f);
template <> ATTN_DEV void attn_unpack8<ATTN_DT_F32>(const attn_vec16 *v, float *f) {
    f[0] = __int_as_float(v[0].x); f[1] = __int_as_float(v[0].y);
    f[2] = __int_as_float(v[0].z); f[3] = __int_as_float(v[0].w);
    f[4] = __int_as_float(v[1].x); f[5] = __int_as_float(v[1].y);
    f[6] = __int_as_float(v[1].z); f[7] = __int_as_float(v[1].w);
}
template <int ET> ATTN_DEV void attn_unpack8_16(const attn_vec16 *v, float *f) {
    attn_u32 w[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = attn_elem<ET>::to_f32((attn_u16)(w[i] & 0xffffu));
        f[2 * i + 1] = attn_elem<ET>::to_f32((attn_u16)(w[i] >> 16));
    }
}
template <> ATTN_DEV void attn_unpack8<ATTN_DT_F16>(const attn_vec16 *v, float *f) { attn_unpack8_16<ATTN_DT_F16>(v, f); }
template <> ATTN_DEV void attn_unpack8<ATTN_DT_BF16>(const attn_vec16 *v, float *f) { attn_unpack8_16<ATTN_DT_BF16>(v, f); }

template <int ET> ATTN_DEV void attn_pack8(const float *f, attn_vec16 *v);
template <> ATTN_DEV void attn_pack8<ATTN_DT_F32>(const float *f, attn_vec16 *v) {
    v[0].x = __float_as_int(f[0]); v[0].y = __float_as_int(f[1]);
    v[0].z = __float_as_int(f[2]); v[0].w = __float_as_int(f[3]);
    v[1].x = __float_as_int(f[4]); v[1].y = __float_as_int(f[5]);
    v[1].z = __float_as_int(f[6]); v[1].w = __float_as_int(f[7]);
}
template <> ATTN_DEV void attn_pack8<ATTN_DT_F16>(const float *f, attn_vec16 *v) {
    v[0].x = attn_pack_f16x2(f[0], f[1]); v[0].y = attn_pack_f16x2(f[2], f[3]);
    v[0].z = attn_pack_f16x2(f[4], f[5]); v[0].w = attn_pack_f16x2(f[6], f[7]);
}
template <> ATTN_DEV void attn_pack8<ATTN_DT_BF16>(const float *f, attn_vec16 *v) {
    v[0].x = attn_pack_bf16x2(f[0], f[1]); v[0].y = attn_pack_bf16x2(f[2], f[3]);
    v[0].z = attn_pack_bf16x2(f[4], f[5]); v[0].w = attn_pack_bf16x2(f[6], f[7]);
}

/* ---- 8-bit KV-cache codes (fp8 e4m3 / e5m2, int8) ----
   Writes: f32 -> code exactly as attn.h's attn_f32_to_fp8_e4m3 / _e5m2 and int8 rounding
   (round to nearest even on the f32 bits; fp8 saturates to the largest finite code,
   infinities too; NaN -> 0x7f with the sign; int8 clamps to +-127, NaN -> 0), in integer
   arithmetic so every architecture writes the CPU's bytes (PTX's cvt .satfinite drops a
   NaN's sign). Reads: four codes -> two f16x2 words, exactly (every e4m3, e5m2 and int8
   value is an f16): e5m2 is the high byte of an f16; int8 through the 0x6400 magic
   number; e4m3 by cvt.rn.f16x2.e4m3x2 on sm_89+, and on sm_80 by placing its bits in an
   f16 (the value / 256, attn_code_factor: the caller multiplies 256 back in), NaN codes
   made f16 NaNs. */
#ifndef ATTN_E4M3_CVT
#if __CUDA_ARCH__ >= 890
#define ATTN_E4M3_CVT 1
#else
#define ATTN_E4M3_CVT 0
#endif
#endif

ATTN_DEV attn_u32 attn_f32_to_fp8(float x, int mb, int bias, attn_u32 maxc) {
    const attn_u32 u = (attn_u32)__float_as_int(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    attn_u32 exp = a >> 23, man = a & 0x7fffffu;
    if (a > 0x7f800000u) return sign | 0x7fu; /* NaN */
    if (a == 0x7f800000u) return sign | maxc; /* infinity: saturate */
    if (exp == 0) exp = 1;
    else man |= 0x800000u;
    const int e8 = (int)exp - 127 + bias;
    const attn_u32 shift = (attn_u32)(23 - mb) + (e8 < 1 ? (attn_u32)(1 - e8) : 0u);
    if (shift > 31) return sign;
    attn_u32 m = man >> shift;
    const attn_u32 rest = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (m & 1u))) m++;
    attn_u32 r = e8 < 1 ? m : ((attn_u32)(e8 - 1) << mb) + m;
    return sign | (r > maxc ? maxc : r);
}
ATTN_DEV attn_u32 attn_f32_to_i8(float x) {
    if (!(x == x)) return 0u;
    if (x >= 127.0f) return 127u;
    if (x <= -127.0f) return (attn_u32)(attn_u8)(-127);
    float r = (float)(int)x; /* toward zero, then to nearest even */
    const float d = fabsf(x - r);
    if (d > 0.5f || (d == 0.5f && ((int)r & 1))) r += x > r ? 1.0f : -1.0f;
    return (attn_u32)(attn_u8)(attn_i8)(int)r;
}
template <int ET> ATTN_DEV attn_u32 attn_f32_to_code(float x) {
    return ET == ATTN_DT_E4M3 ? attn_f32_to_fp8(x, 3, 7, 0x7eu)
         : ET == ATTN_DT_E5M2 ? attn_f32_to_fp8(x, 2, 15, 0x7bu) : attn_f32_to_i8(x);
}
/* what the f16 of attn_codes4_to_f16x2 must be multiplied by to give the code's value */
template <int ET> ATTN_DEV float attn_code_factor(void) { return ET == ATTN_DT_E4M3 && !ATTN_E4M3_CVT ? 256.0f : 1.0f; }

/* A per-tensor scale of an 8-bit cache as the kernels take it: the device float at ptr, or
   value where ptr is NULL; 0 when it is not finite and > 0 (the kernels then write nothing:
   the host cannot check a device value without a synchronisation). */
ATTN_DEV float attn_cache_scale(const float *ptr, float value) {
    const float s = ptr ? *ptr : value;
    return s > 0.0f && s <= 3.402823466e38f ? s : 0.0f;
}

ATTN_DEV attn_u32 attn_prmt(attn_u32 a, attn_u32 b, attn_u32 sel) {
    attn_u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
/* codes w (code i in byte i) -> lo = f16x2 of codes 0, 1 (code 0 in the low half), hi = 2, 3 */
template <int ET> ATTN_DEV void attn_codes4_to_f16x2(attn_u32 w, attn_u32 &lo, attn_u32 &hi) {
    if (ET == ATTN_DT_I8) { /* f16 0x64uu = 1024 + u, u = code + 128; minus 1152 */
        const attn_u32 u = w ^ 0x80808080u, k = 0x64806480u;
        lo = attn_prmt(u, 0x64646464u, 0x4140u);
        hi = attn_prmt(u, 0x64646464u, 0x4342u);
        asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(lo) : "r"(k));
        asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(hi) : "r"(k));
    } else if (ET == ATTN_DT_E5M2) {
        lo = attn_prmt(w, 0u, 0x1404u);
        hi = attn_prmt(w, 0u, 0x3424u);
    } else {
#if ATTN_E4M3_CVT
        asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
            "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
            : "=r"(lo), "=r"(hi) : "r"(w));
#else
        attn_u32 x[2] = {attn_prmt(w, 0u, 0x1404u), attn_prmt(w, 0u, 0x3424u)}; /* code << 8 per half */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            /* s 0eeee mmm 0000000: the value / 256 */
            const attn_u32 h = ((x[i] >> 1) & 0x3f803f80u) | (x[i] & 0x80008000u);
            /* magnitude 0x7f is NaN (e4m3fn has no infinity): + 1 carries into bit 15 of its
               half only there; that bit, shifted into the f16 exponent, makes 0x7f80: a NaN */
            const attn_u32 t = (x[i] & 0x7f007f00u) + 0x01000100u;
            (i ? hi : lo) = h | ((t >> 1) & 0x40004000u);
        }
#endif
    }
}

/* 16-byte global loads and stores (the caller guarantees 16-byte alignment). attn_ldg16
   reads through the read-only path: only for data no thread of the kernel writes;
   attn_ld16 for inputs that may alias an output. */
ATTN_DEV attn_vec16 attn_ldg16(const void *p) {
    attn_vec16 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
ATTN_DEV attn_vec16 attn_ld16(const void *p) {
    attn_vec16 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
ATTN_DEV void attn_stg16(void *p, attn_vec16 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
ATTN_DEV int attn_aligned16(const void *p) { return ((attn_u64)p & 15u) == 0; }

/* ---- shared memory, cp.async ---- */
ATTN_DEV attn_u32 attn_smem_addr(const void *p) {
    attn_u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (attn_u32)a;
}

/* 16 bytes global -> shared, bypassing L1 (.cg). src_bytes 0 reads nothing and writes 16
   zero bytes (rows outside the key range: no garbage reaches the softmax). */
ATTN_DEV void attn_cp_async16(attn_u32 smem, const void *gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem), "l"(gmem), "r"(src_bytes) : "memory");
}
/* The same with a predicate instead of a byte count: zero = 1 writes 16 zero bytes and
   reads nothing (gmem must still be a valid address; give the tensor's base). */
ATTN_DEV void attn_cp_async16_or_zero(attn_u32 smem, const void *gmem, int zero) {
    asm volatile("{\n\t.reg .pred z;\n\tsetp.ne.b32 z, %2, 0;\n\t"
                 "cp.async.cg.shared.global [%0], [%1], 16, z;\n\t}"
                 :: "r"(smem), "l"(gmem), "r"(zero) : "memory");
}
/* 4 bytes (cp.async.ca: sizes below 16 go through L1), zero-filled as above: the f32
   scales of the 8-bit caches with per-token-head scales. */
ATTN_DEV void attn_cp_async4_or_zero(attn_u32 smem, const void *gmem, int zero) {
    asm volatile("{\n\t.reg .pred z;\n\tsetp.ne.b32 z, %2, 0;\n\t"
                 "cp.async.ca.shared.global [%0], [%1], 4, z;\n\t}"
                 :: "r"(smem), "l"(gmem), "r"(zero) : "memory");
}
ATTN_DEV void attn_cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> ATTN_DEV void attn_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

/* Dynamic shared memory the launch provided (bytes). */
ATTN_DEV attn_u32 attn_dynamic_smem_size(void) {
    attn_u32 r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

/* ---- tensor cores: ldmatrix and mma.sync m16n8k16 (f32 accumulators) ----
   Fragment layout (PTX ISA, mma.m16n8k16 with .f16/.bf16): lane = 4 * g + t.
     A (16x16, row-major) a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
     B (16x8, k x n)      b0: (k 2t..2t+1, n g)  b1: (k 2t+8.., n g)
     C (16x8, f32)        c0,c1: (g, 2t..2t+1)   c2,c3: (g+8, 2t..2t+1)  */
ATTN_DEV void attn_ldmatrix_x4(attn_u32 *r, attn_u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
ATTN_DEV void attn_ldmatrix_x2(attn_u32 *r, attn_u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
ATTN_DEV void attn_ldmatrix_x4_trans(attn_u32 *r, attn_u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
ATTN_DEV void attn_ldmatrix_x2_trans(attn_u32 *r, attn_u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

/* c += a . b for one 16x8x16 tile; ET picks f16 or bf16 inputs. */
template <int ET> ATTN_DEV void attn_mma16816(float *c, const attn_u32 *a, const attn_u32 *b);
template <> ATTN_DEV void attn_mma16816<ATTN_DT_F16>(float *c, const attn_u32 *a, const attn_u32 *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> ATTN_DEV void attn_mma16816<ATTN_DT_BF16>(float *c, const attn_u32 *a, const attn_u32 *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ---- fast math ---- */
/* 2^x, relative error about 2^-22; -inf -> +0, subnormal results flush to zero. */
ATTN_DEV float attn_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
ATTN_DEV float attn_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
/* 1/x for a normal x (the softmax sums are >= 1): rcp.approx refined by one Newton step,
   within an ulp or so of 1.0f / x, and no call to the IEEE division's slow path (whose
   register saves ptxas reports as spills). */
ATTN_DEV float attn_rcp(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return fmaf(r, fmaf(-x, r, 1.0f), r);
}
/* tanh from one exp2: absolute error about 3e-7 everywhere (tanh.approx is only good to
   about 2^-11, too coarse once the soft cap multiplies it back up). */
ATTN_DEV float attn_tanh(float x) {
    float e = attn_exp2(-2.0f * ATTN_LOG2E * fabsf(x)); /* in (0, 1] */
    float r = __fdividef(1.0f - e, 1.0f + e);
    return copysignf(r, x);
}

/* Decode context parallelism: how many of positions [0, x) rank r of W holds when runs of I
   tokens are dealt round-robin (the host's attn__dcp_local; x itself when W is 1). */
ATTN_DEV int attn_dcp_positions(int W, int r, int I, attn_i64 x) {
    if (W <= 1) return (int)x;
    const attn_i64 run = (attn_i64)W * I, rem = x % run - (attn_i64)r * I;
    return (int)(x / run * I + (rem < 0 ? 0 : rem > I ? I : rem));
}

/* ---- warp reductions ---- */
ATTN_DEV int attn_imin(int a, int b) { return a < b ? a : b; }
ATTN_DEV int attn_imax(int a, int b) { return a > b ? a : b; }
ATTN_DEV int attn_warp_imin(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = attn_imin(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
ATTN_DEV int attn_warp_imax(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = attn_imax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
ATTN_DEV float attn_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
ATTN_DEV float attn_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* Over the four lanes of one mma row group (lanes 4g..4g+3). */
ATTN_DEV float attn_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
ATTN_DEV float attn_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* An internal invariant the host broke (wrong block size or shared memory for this
   variant): stop loudly rather than compute garbage. */
ATTN_DEV void attn_trap(void) { asm volatile("trap;"); }

#endif /* ATTN_COMMON_CUH */
