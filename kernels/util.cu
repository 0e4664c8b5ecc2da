// util.cu — small device utilities: filling buffers (the tests poison outputs with NaN
// before every GPU run; workspaces are cleared with it) and the read-bandwidth probe that
// tools/attn-bench-cuda measures the device's ceiling with (it compiles this file itself).
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

// Reads n 16-byte words (grid-stride, four independent loads in flight per thread, loads
// that bypass L1 and are marked evict-first in L2) and folds them with XOR. The result is
// stored only when it equals `never` (the caller passes a value the data cannot fold to),
// so the compiler must keep every load while the kernel writes nothing: what it measures
// is the device's read bandwidth, the ceiling of a memory-bound decode.
extern "C" __global__ void attn_read_probe(const uint4 *src, attn_u64 n, attn_u32 never, attn_u32 *out) {
    attn_u64 stride = (attn_u64)gridDim.x * blockDim.x;
    attn_u64 i = (attn_u64)blockIdx.x * blockDim.x + threadIdx.x;
    attn_u32 acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride);
        uint4 c = __ldcs(src + i + 2 * stride), d = __ldcs(src + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
        acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = __ldcs(src + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == never) out[0] = acc;
}
