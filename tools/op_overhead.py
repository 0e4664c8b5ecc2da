"""Host time per forward through attn_h (issue 24, section 3): Layer.forward (argument
structs built per call), PreparedForward (built once, pointers updated) and the PyTorch
custom op torch.ops.attn_h.forward (attn_h.torch_ops(); the prepared path under torch's
dispatcher), beside the C API's figure for the same call measured by `attn-bench-cuda --case
host` (pass it with --c-us; the target: <= 5 us over it).

The call: batch 1 decode over 1024 keys, 32/8 heads, head 128, bf16, block 16 (attn-bench's
shape). 200 calls enqueued back to back on torch's current stream, the host's wall time
over them / 200 (the device runs behind), median of 11 groups.

usage: python3 tools/op_overhead.py [--c-us US] [--device cuda|cpu]
"""
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import attn_h  # noqa: E402

H, HKV, D, BS, C = 32, 8, 128, 16, 1024


def per_call(fn, dev, n=200, groups=11):
    t = []
    for g in range(groups + 1):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t0) / n
        if g:
            t.append(dt)
    if dev == "cuda":
        torch.cuda.synchronize()
    t.sort()
    return t[len(t) // 2]


def main():
    dev = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    c_us = float(sys.argv[sys.argv.index("--c-us") + 1]) if "--c-us" in sys.argv else None
    ctx = attn_h.Context(log_level="warn")
    layer = attn_h.Layer(ctx, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=BS, dtype="bfloat16",
                         device=dev)
    nb = C // BS + 1
    meta = attn_h.Metadata(layer, 1, 1, nb, nb)
    meta.build(np.array([0, 1], np.int32), np.array([C], np.int32),
               np.random.default_rng(1).permutation(nb).astype(np.int32)[None, :nb - 1], np.array([-1], np.int64))
    cache = torch.empty(layer.kv_cache_shape(nb), dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    q = torch.empty(1, H, D, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    out = torch.empty_like(q)
    want = layer.forward(meta, q, cache).clone()
    p = layer.prepare_forward(meta, q, cache, out)
    ops = attn_h.torch_ops()
    lh, mh = attn_h.op_handle(layer), attn_h.op_handle(meta)
    ops.forward(lh, mh, q, cache, out)
    if dev == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(out, want), "the op's output differs from Layer.forward's"
    rows = [("Layer.forward", lambda: layer.forward(meta, q, cache, out)),
            ("PreparedForward", lambda: p(q, cache, out)),
            ("torch.ops.attn_h.forward", lambda: ops.forward(lh, mh, q, cache, out))]
    print("torch %s, attn_h %s, %s; batch 1 decode x %d keys, %d/%d heads, head %d, bf16" % (
        torch.__version__, attn_h.__version__, torch.cuda.get_device_name() if dev == "cuda" else "cpu", C, H, HKV, D))
    print("| path | host us per forward | over the C API |")
    print("| --- | ---: | ---: |")
    if c_us is not None:
        print("| C API (attn-bench-cuda --case host) | %.2f | - |" % c_us)
    for name, fn in rows:
        us = per_call(fn, dev) * 1e6
        print("| %s | %.2f | %s |" % (name, us, "%+.2f" % (us - c_us) if c_us is not None else "-"))
    print("command: python3 %s" % " ".join(sys.argv))


if __name__ == "__main__":
    main()
