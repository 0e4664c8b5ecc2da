#!/usr/bin/env python3
"""Decode context parallelism on one GPU (issue 25): what one rank of W does and what the
combine costs, to project the multi-GPU speed-up before the multi-GPU machines are lent.

Batch-1 decode over a 256k-token context (32/8 heads, head 128, bf16, blocks of 16,
interleave 16). For W = 1, 2, 4, 8: rank 0's shard (L / W tokens) in its own cache, its
forward on a DCP metadata (partial out and LSE), timed eagerly and as a CUDA-graph replay
(median of CUDA-event timings); then attn_dcp_combine of W partials on the device, eagerly
(a Python call: its host time) and replayed from a CUDA graph (the kernel). The projection
t(1) / (t_rank(W) + t_combine(W)), both replays (or both device times: the replay of one
small graph adds ~10 us of launch that a step's single graph would not), leaves out the exchange (an all-gather of
W x 32 x 128 x 2 bytes of out and W x 32 x 4 of LSE: microseconds over NVLink), which only
the multi-GPU run can measure.

The same for MLA (issue 25's second shape): batch-1 absorbed decode over the same context,
128 heads, latent 512 + RoPE 64 (576), bf16, on the CUDA MLA backend: rank 0's
attn_mla_forward_mqa over its shard, then the combine of W partials of width 512.

usage: python3 tools/dcp_projection.py [--context 262144] [--iters 50] [--only std|mla]"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import attn_h  # noqa: E402


def timed(fn, iters):
    """Median milliseconds of fn() over iters runs, by CUDA events."""
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def kernel_times(fn, iters=20):
    """{kernel name: microseconds of device time per fn() call} as CUPTI records the kernels
    (torch.profiler), so launch and graph overheads stay out."""
    import collections
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    t = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t[e.name] += (e.device_time if hasattr(e, "device_time") else e.cuda_time) / iters
    return t


def kernel_us(fn, iters=20):
    """Microseconds of device time per fn() call, all its kernels."""
    return sum(kernel_times(fn, iters).values())


def eager_and_replay(fn, iters):
    """(eager ms, CUDA-graph replay ms) of fn: warmed up, then captured on a side stream."""
    for _ in range(5):
        fn()
    eager = timed(fn, iters)
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.synchronize()
    return eager, timed(g.replay, iters)


def project(a, ctx, layer, title, q, width, forward, bs, I):
    """The table for one layer: rank 0's forward(meta, q, cache, out, lse) over its shard at
    W = 1, 2, 4, 8 (out [1, heads, width]), then the combine of W such partials."""
    L, H = a.context, q.shape[1]
    nblocks = L // bs + 1
    cache = torch.randn(layer.kv_cache_shape(nblocks), dtype=torch.bfloat16, device="cuda")
    print(title + "; backend %s" % layer.selection["resolved"])
    print("| W | rank-0 keys | rank forward, eager (us) | graph replay (us) | combine, eager Python (us) | "
          "combine, graph replay (us) | kernels: rank, combine (us) | projected speed-up (replays) | "
          "projected speed-up (kernels) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = kbase = None
    for W in (1, 2, 4, 8):
        local = attn_h.dcp_local_tokens(W, 0, I, L)
        nb = (local + bs - 1) // bs
        table = np.arange(nb, dtype=np.int32).reshape(1, nb)
        owner = ((L - 1) // I) % W
        slot = attn_h.dcp_local_tokens(W, 0, I, L - 1) if owner == 0 else -1
        meta = attn_h.Metadata(layer, 1, 1, nb, nblocks, dcp_world_size=W, dcp_rank=0, dcp_interleave=I)
        meta.build(np.array([0, 1], np.int32), np.array([L], np.int32), table, np.array([slot], np.int64))
        out = torch.empty(1, H, width, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(1, H, dtype=torch.float32, device="cuda")
        t_eager, t_graph = eager_and_replay(lambda: forward(meta, q, cache, out, lse=lse), a.iters)
        outs = [out.clone() for _ in range(W)]
        lses = [lse.clone() for _ in range(W)]
        c_out, c_lse = torch.empty_like(out), torch.empty_like(lse)
        t_comb_eager = t_comb = k_comb = 0.0
        k_rank = kernel_us(lambda: forward(meta, q, cache, out, lse=lse))
        if W > 1:   # eagerly (the Python call's host time) and as a graph replay (the kernel)
            t_comb_eager, t_comb = eager_and_replay(lambda: attn_h.dcp_combine(ctx, outs, lses, c_out, c_lse),
                                                    a.iters)
            k_comb = kernel_us(lambda: attn_h.dcp_combine(ctx, outs, lses, c_out, c_lse))
        base = base or t_graph
        kbase = kbase or k_rank
        print("| %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f, %.1f | %.2f | %.2f |" % (
            W, local, t_eager * 1e3, t_graph * 1e3, t_comb_eager * 1e3, t_comb * 1e3, k_rank, k_comb,
            base / (t_graph + t_comb), kbase / (k_rank + k_comb)))


def standard(a):
    H, HKV, D, bs, I = 32, 8, 128, 16, 16
    ctx = attn_h.Context(log_level="warn")
    layer = attn_h.Layer(ctx, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=bs, dtype="bfloat16",
                         device="cuda")
    q = torch.randn(1, H, D, dtype=torch.bfloat16, device="cuda")
    project(a, ctx, layer, "DCP on one H200: rank 0 of W, batch-1 decode over %d tokens (32/8 heads, head 128, "
            "bf16, interleave %d)" % (a.context, I), q, D, layer.forward, bs, I)
    ctx.close()


def mla(a):
    H, R, P, bs, I = 128, 512, 64, 64, 64
    ctx = attn_h.Context(log_level="warn")
    layer = attn_h.Layer(ctx, num_heads=H, block_size=bs, dtype="bfloat16", device="cuda",
                         mla=dict(kv_lora_rank=R, qk_rope_head_dim=P, qk_nope_head_dim=128, v_head_dim=128))
    q = torch.randn(1, H, R + P, dtype=torch.bfloat16, device="cuda")
    print()
    project(a, ctx, layer, "DCP on one H200, MLA: rank 0 of W, batch-1 absorbed decode over %d tokens (128 heads, "
            "latent 512 + 64, bf16, blocks of %d, interleave %d)" % (a.context, bs, I), q, R,
            lambda meta, q, cache, out, lse: layer.mla_forward_mqa(meta, q, cache, out, lse=lse), bs, I)
    ctx.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=262144)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--only", choices=("std", "mla"), default=None)
    a = ap.parse_args()
    if a.only != "mla":
        standard(a)
    if a.only != "std":
        mla(a)


if __name__ == "__main__":
    main()
