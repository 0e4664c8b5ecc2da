"""Times one CPU decode forward through attn_h, as issue 37 measured the pip build: 16
requests decoding their next token over 2048 cached tokens each, 32 query / 8 KV heads, head
128, f16 q/cache/out, block 16, blocks shuffled. Prints the best of --runs forwards (ms)
and the inner loops the library runs (attn_platform.cpu_simd), as one line:

    decode 16 x 2048 f16: 23.1 ms (best of 15), cpu_simd avx512

Uses whichever attn_h imports (an installed package, or PYTHONPATH=python with ATTN_LIB).

usage: python3 tests/python/decode_time.py [--runs N] [--threads N] [--batch B] [--context C]
"""
import argparse
import time

import numpy as np

import attn_h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=2048)
    args = ap.parse_args()
    B, C, H, HKV, D, BS = args.batch, args.context, 32, 8, 128, 16
    rng = np.random.default_rng(0)
    with attn_h.Context(log_level="warn", num_threads=args.threads) as ctx:
        layer = attn_h.Layer(ctx, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=BS, dtype="float16")
        per = (C + BS - 1) // BS
        nb = B * per
        cache = rng.uniform(-1, 1, layer.kv_cache_shape(nb)).astype(np.float16)
        meta = attn_h.Metadata(layer, B, B, per, nb)
        meta.build(np.arange(B + 1, dtype=np.int32), np.full(B, C, np.int32),
                   rng.permutation(nb).astype(np.int32).reshape(B, per), np.full(B, -1, np.int64))
        q = rng.uniform(-1, 1, (B, H, D)).astype(np.float16)
        out = np.empty_like(q)
        layer.forward(meta, q, cache, out)  # warm-up: pages, threads, caches
        best = float("inf")
        for _ in range(args.runs):
            t0 = time.perf_counter()
            layer.forward(meta, q, cache, out)
            best = min(best, time.perf_counter() - t0)
        assert np.isfinite(out).all()
        simd = ctx.platform["cpu_simd"]
        layer.close()
    print("decode %d x %d f16: %.1f ms (best of %d), cpu_simd %s" % (B, C, best * 1e3, args.runs, simd))


if __name__ == "__main__":
    main()
