// util.cu — small device utilities the library launches itself: filling buffers (the
// tests poison outputs with NaN before every GPU run; workspaces are cleared with it).
// Header-free on purpose: NVRTC has no include path (DESIGN.md).

typedef unsigned int attn_u32;
typedef unsigned long long attn_u64;

// Writes `value` (a 32-bit pattern) to n words, 16 bytes per store: dst must be 16-byte
// aligned (cuMemAlloc gives 256).
extern "C" __global__ void attn_fill_u32(attn_u32 *dst, attn_u64 n, attn_u32 value) {
    attn_u64 i = ((attn_u64)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    attn_u64 stride = (attn_u64)gridDim.x * blockDim.x * 4;
    for (; i + 4 <= n; i += stride) {
        uint4 v;
        v.x = v.y = v.z = v.w = value;
        *(uint4 *)(dst + i) = v;
    }
    for (; i < n; i++) dst[i] = value; // the tail (< 4 words) of the last thread
}

// The same for 16-bit patterns (f16/bf16 buffers).
extern "C" __global__ void attn_fill_u16(unsigned short *dst, attn_u64 n, unsigned short value) {
    attn_u64 i = (attn_u64)blockIdx.x * blockDim.x + threadIdx.x;
    attn_u64 stride = (attn_u64)gridDim.x * blockDim.x;
    for (; i < n; i += stride) dst[i] = value;
}
