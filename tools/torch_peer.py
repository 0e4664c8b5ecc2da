"""The PyTorch peer of `attn-bench --device cuda`: the same decode shapes through
torch.nn.functional.scaled_dot_product_attention on the same GPU, for the side-by-side
column of BENCHMARKS.md.

PyTorch has no paged attention, so its K/V are contiguous [B, 8, ctx, 128] bf16 tensors
(the best case for it: no block-table indirection). q is [B, 32, 1, 128]. Two ways:
  gqa  - SDPA with enable_gqa=True (what a model port would call);
  fold - the 4 query heads of a KV head folded into the query length, q [B, 8, 4, 128]
         against K/V [B, 8, ctx, 128] (non-causal: every query sees all keys), so no
         backend has to repeat K/V; the fastest exact form of GQA decode in PyTorch.
Each case rotates over K/V sets of >= 256 MiB in all (5x the L2), like attn-bench; CUDA
events over back-to-back calls, median of 11 groups. The read ceiling: torch's own
reduction over 4 GiB (x.sum() of float32), best of 10.

usage: python3 tools/torch_peer.py [--quick]
"""
import sys
import torch
import torch.nn.functional as F

H, HKV, D = 32, 8, 128
BATCHES, CONTEXTS = (1, 16, 64, 128), (1024, 4096, 16384)
ROTATE = 256 << 20


def timed(fn, per_group, groups):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn(0)
    t = []
    k = 0
    for _ in range(groups):
        e0.record()
        for _ in range(per_group):
            fn(k)
            k += 1
        e1.record()
        e1.synchronize()
        t.append(e0.elapsed_time(e1) * 1e-3 / per_group)
    t.sort()
    return t[len(t) // 2], t[0], t[-1]


def read_ceiling():
    x = torch.rand((4 << 30) // 4, dtype=torch.float32, device="cuda")
    best = 0.0
    for _ in range(11):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        x.sum()
        e1.record()
        e1.synchronize()
        best = max(best, x.numel() * 4 / (e0.elapsed_time(e1) * 1e-3) / 1e9)
    del x
    return best


def main():
    quick = "--quick" in sys.argv
    groups = 5 if quick else 11
    dev = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__}, {dev.name}, {dev.multi_processor_count} SMs")
    read = read_ceiling()
    print(f"read ceiling (torch float32 sum over 4 GiB, best of 11): {read:.0f} GB/s")
    rows = []
    for b in BATCHES:
        for c in CONTEXTS:
            set_bytes = b * c * HKV * D * 2 * 2
            nsets = max(2, min(64, -(-ROTATE // set_bytes)))
            per_group = max(20, nsets)
            g = torch.Generator(device="cuda").manual_seed(b * 100003 + c)
            k = [torch.rand((b, HKV, c, D), device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
                 for _ in range(nsets)]
            v = [torch.rand((b, HKV, c, D), device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
                 for _ in range(nsets)]
            q = torch.rand((b, H, 1, D), device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
            qf = q.view(b, HKV, H // HKV, D)
            ref = F.scaled_dot_product_attention(qf, k[0], v[0])
            res = {}
            for name, fn in (
                ("gqa", lambda i: F.scaled_dot_product_attention(q, k[i % nsets], v[i % nsets], enable_gqa=True)),
                ("fold", lambda i: F.scaled_dot_product_attention(qf, k[i % nsets], v[i % nsets])),
            ):
                out = fn(0).reshape(b, HKV, H // HKV, D)
                err = (out.float() - ref.float()).abs().max().item()
                assert err < 2e-2, f"{name}: differs from the folded form by {err}"
                med, lo, hi = timed(fn, per_group, groups)
                res[name] = med
                print(f"  batch {b:3d} context {c:5d} {name:4s}: {med * 1e6:9.1f} us median "
                      f"(min {lo * 1e6:.1f}, max {hi * 1e6:.1f})  {set_bytes / med / 1e9:7.0f} GB/s  "
                      f"{100 * set_bytes / med / 1e9 / read:5.1f}% of read  [{nsets} sets]", flush=True)
            rows.append((b, c, set_bytes, res))
            del k, v, q, qf, ref
            torch.cuda.empty_cache()
    print("\n| case | SDPA enable_gqa us | GB/s | SDPA folded us | GB/s | % of read |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for b, c, nb, r in rows:
        best = min(r.values())
        print(f"| decode b={b} ctx={c} | {r['gqa'] * 1e6:.1f} | {nb / r['gqa'] / 1e9:.0f} | "
              f"{r['fold'] * 1e6:.1f} | {nb / r['fold'] / 1e9:.0f} | {100 * nb / best / 1e9 / read:.1f} |")
    print(f"\nread ceiling {read:.0f} GB/s; command: python3 tools/torch_peer.py{' --quick' if quick else ''}")


if __name__ == "__main__":
    main()
