#!/usr/bin/env python3
"""Batch-1 MLA absorbed decode on the GPU: device time per kernel against the split count
(issue 25: a DCP rank's decode over L / W keys must scale with its keys).

128 heads, latent 512 + RoPE 64, bf16, blocks of 64. For each context length and forced
num_kv_splits (0: the library's choice), the kernels' device times as CUPTI records them
(torch.profiler): the decode and the split merge, summed per call.

usage: python3 tools/mla_decode_splits.py [--contexts 32768,65536,131072,262144]
                                           [--splits 0,16,33,66,132]"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import attn_h  # noqa: E402
from dcp_projection import kernel_times  # noqa: E402  (this directory: the same profiler helper)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="32768,65536,131072,262144")
    ap.add_argument("--splits", default="0,16,33,66,132")
    a = ap.parse_args()
    H, R, P, bs = 128, 512, 64, 64
    ctx = attn_h.Context(log_level="warn")
    layer = attn_h.Layer(ctx, num_heads=H, block_size=bs, dtype="bfloat16", device="cuda",
                         mla=dict(kv_lora_rank=R, qk_rope_head_dim=P, qk_nope_head_dim=128, v_head_dim=128))
    Lmax = max(int(x) for x in a.contexts.split(","))
    nblocks = Lmax // bs + 1
    cache = torch.randn(layer.kv_cache_shape(nblocks), dtype=torch.bfloat16, device="cuda")
    q = torch.randn(1, H, R + P, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(1, H, R, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(1, H, dtype=torch.float32, device="cuda")
    print("MLA batch-1 decode, 128 heads, bf16, backend %s" % layer.selection["resolved"])
    print("| keys | splits (forced) | splits used | decode (us) | merge (us) | total (us) | TFLOP/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for L in (int(x) for x in a.contexts.split(",")):
        nb = (L + bs - 1) // bs
        table = np.arange(nb, dtype=np.int32).reshape(1, nb)
        for s in (int(x) for x in a.splits.split(",")):
            meta = attn_h.Metadata(layer, 1, 1, nb, nblocks, num_kv_splits=s)
            meta.build(np.array([0, 1], np.int32), np.array([L], np.int32), table, np.array([L - 1], np.int64))
            used = meta.mla_info["num_kv_splits"]
            k = kernel_times(lambda: layer.mla_forward_mqa(meta, q, cache, out, lse=lse))
            dec = sum(v for n, v in k.items() if "merge" not in n)
            mer = sum(v for n, v in k.items() if "merge" in n)
            flops = L * H * ((R + P) * 2 + R * 2)
            print("| %d | %d | %d | %.1f | %.1f | %.1f | %.0f |" % (L, s, used, dec, mer, dec + mer,
                                                                  flops / (dec + mer) / 1e6))
            meta.close()
    ctx.close()


if __name__ == "__main__":
    main()
