/* codes_probe.cu - device probes of kernels/attn_common.cuh's 8-bit KV-cache codes, run by
   tests/codes_check.c against the library's CPU conversions (attn_f32_to_fp8_e4m3, ...):
     probe_decode: every code of a type (codes[i] = i, 256 of them, 4 per 32-bit word)
                   through attn_codes4_to_f16x2 -> f16 bits out[i]
     probe_encode: floats x[i] through attn_f32_to_code -> out[i]
   type: 4 fp8 e4m3, 5 fp8 e5m2, 6 int8. Compiled twice by the check: as is (sm_89+: e4m3
   by cvt.rn.f16x2.e4m3x2) and with -DATTN_E4M3_CVT=0 (sm_80's bit placement, whose f16 is
   the value / 256: probe_factor says so), so both paths run on one GPU. */
#include "attn_common.cuh"

template <int ET> __device__ void decode4(const attn_u32 *codes, attn_u16 *out, int w) {
    attn_u32 lo, hi;
    attn_codes4_to_f16x2<ET>(codes[w], lo, hi);
    out[4 * w + 0] = (attn_u16)(lo & 0xffffu);
    out[4 * w + 1] = (attn_u16)(lo >> 16);
    out[4 * w + 2] = (attn_u16)(hi & 0xffffu);
    out[4 * w + 3] = (attn_u16)(hi >> 16);
}

extern "C" __global__ void probe_decode(const attn_u32 *codes, attn_u16 *out, int type) {
    const int w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= 64) return;
    if (type == ATTN_DT_E4M3) decode4<ATTN_DT_E4M3>(codes, out, w);
    else if (type == ATTN_DT_E5M2) decode4<ATTN_DT_E5M2>(codes, out, w);
    else decode4<ATTN_DT_I8>(codes, out, w);
}

extern "C" __global__ void probe_encode(const float *x, attn_u8 *out, int n, int type) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = (attn_u8)(type == ATTN_DT_E4M3   ? attn_f32_to_code<ATTN_DT_E4M3>(x[i])
                           : type == ATTN_DT_E5M2 ? attn_f32_to_code<ATTN_DT_E5M2>(x[i])
                                                  : attn_f32_to_code<ATTN_DT_I8>(x[i]));
}

/* what the decoded f16 is multiplied by to give the value (e4m3: 256 on the sm_80 path) */
extern "C" __global__ void probe_factor(float *out) {
    out[0] = attn_code_factor<ATTN_DT_E4M3>();
    out[1] = attn_code_factor<ATTN_DT_E5M2>();
    out[2] = attn_code_factor<ATTN_DT_I8>();
}
