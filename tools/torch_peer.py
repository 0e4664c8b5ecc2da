"""The peers of `attn-bench --device cuda`, on the same shapes and the same GPU: PyTorch's
scaled_dot_product_attention (its default choice, and the flash and cuDNN backends forced)
on contiguous K/V, and attn.h itself through python/attn_h.py on a paged cache in torch
tensors (so the table is side by side, and the Python path's overhead is visible).

Decode: 32 query / 8 KV heads, head 128, bf16, batch {1, 16, 64, 128} x context {1k, 4k,
16k}. PyTorch has no paged attention: its K/V are contiguous [B, 8, ctx, 128] (its best
case). "default" calls SDPA with enable_gqa=True (what a model port writes); "flash" and
"cudnn" get the 4 query heads of each KV head folded into the query length, q [B, 8, 4, 128]
(exact for decode: every query sees every key), because not every backend takes
enable_gqa. attn_h: the same K/V values' bytes in a paged cache [blocks, 2, 16, 8, 128] with
shuffled block ids, one metadata per rotation set. GB/s = K+V bytes / time. Every decode
row is timed twice: eager calls, and "graph": CUDA-graph replays (one graph per rotation
set, replayed back to back: device time, as engines run decode).

Prefill: causal, 32 heads, head 128, bf16, batch 4 x 4096 and 1 x 16384; PyTorch gets K/V
with 8 heads and enable_gqa where the backend takes it, else K/V repeated to 32 heads (same
FLOPs); TFLOP/s over the causal-useful pairs, 4 * 32 * 128 * L(L+1)/2 per sequence.

Every case rotates over sets of >= 256 MiB in all (5x the L2); CUDA events over back-to-back
calls, median of 11 groups (5 with --quick). A backend that refuses a shape is reported as
such. The read ceiling: torch's float32 sum over 4 GiB, best of 11.

MLA (issue 9; --mla-only runs this part alone): the prefill shape, 128 heads, one sequence
of 4096, causal, qk 192 / v 128, bf16: SDPA (default, cuDNN, efficient; flash where it takes
v != qk) on contiguous q/k/v, beside attn.h's attn_mla_forward_mha through attn_h.py (its time
includes the latent gather and the up-projection GEMMs). TFLOP/s = 2 H L(L+1)/2 (192 + 128).
And MLA decode through attn_h.py (mla_forward_mqa, latent 576, pages of 64, heads 16 and 128)
on the decode shapes of attn-bench (PyTorch has no latent-cache decode to set beside it).
--prefill-only: the standard prefill shapes alone (no decode table, no MLA).

--head 512 (issue 23 (5)): the same tables at head 512 (Gemma-class), decode batch {1, 16, 64}
x context {4k, 16k} and prefill 1 x 4096, 2 x 2048, with SDPA's memory-efficient and math
backends beside its default, flash and cuDNN (not every backend takes a head of 512; a refusal
is reported).

FlashAttention-3 ("fa3": the `fa3-fwd` wheel, imported as fa3_fwd_interface; carried to the
device as a wheel) beside them where it imports (else skipped, saying why): prefill through
flash_attn_func on [B, L, heads, D] q/k/v (GQA native, causal), decode through
flash_attn_with_kvcache on contiguous [B, ctx, 8, 128] K/V caches with its own split
heuristic (num_splits=0), eager and graph like the rest. MLA prefill (qk 192 / v 128): FA3's
flash_attn_func takes v narrower than q/k.

usage: python3 tools/torch_peer.py [--quick] [--csv FILE] [--no-attn-h] [--mla-only | --prefill-only]
                                   [--head 512]
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

H, HKV, D, BS = 32, 8, 128, 16
BATCHES, CONTEXTS = (1, 16, 64, 128), (1024, 4096, 16384)
PREFILLS = ((4, 4096), (1, 16384))
ROTATE = 256 << 20


def timed(fn, per_group, groups):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    t, k = [], 0
    for _ in range(groups):
        e0.record()
        for _ in range(per_group):
            fn(k)
            k += 1
        e1.record()
        e1.synchronize()
        t.append(e0.elapsed_time(e1) * 1e-3 / per_group)
    t.sort()
    return t[len(t) // 2]


def timed_graph(fn, nsets, per_group, groups):
    """Seconds per CUDA-graph replay of fn: one graph per set i (fn(i) captured once, after
    a warm-up on a side stream as torch requires), the replays timed as timed() times calls.
    Device time, as engines run decode."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(nsets, 3)):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for i in range(nsets):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(i)
        graphs.append(g)
    return timed(lambda i: graphs[i % nsets].replay(), per_group, groups)


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


def load_fa3():
    """FlashAttention-3's interface module, or None (printing why)."""
    try:
        import fa3_fwd_interface as fa3  # the fa3-fwd wheel
        return fa3
    except Exception as e:  # noqa: BLE001 - a missing or broken wheel is a result to report
        print(f"fa3: not run ({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})")
        return None


def sdpa_backend(name):
    """A context manager forcing one SDPA backend (None: PyTorch's own choice)."""
    from contextlib import nullcontext
    if name in ("default", "fa3"):
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([{"flash": SDPBackend.FLASH_ATTENTION,
                         "cudnn": SDPBackend.CUDNN_ATTENTION,
                         "efficient": SDPBackend.EFFICIENT_ATTENTION,
                         "math": SDPBackend.MATH}[name]])


def try_time(label, make_fn, check, per_group, groups, backend="default", graph_sets=0):
    """(seconds, None) or (None, why): a backend may refuse a shape. The SDPA backend is
    forced around the whole timing (its context manager is entered once). graph_sets > 0:
    CUDA-graph replays over that many sets (timed_graph) instead of eager calls."""
    try:
        with sdpa_backend(backend):
            fn = make_fn()
            check(fn(0))
            if graph_sets:
                return timed_graph(fn, graph_sets, per_group, groups), None
            return timed(fn, per_group, groups), None
    except Exception as e:  # noqa: BLE001 - any refusal is a result to report
        why = str(e).strip().splitlines()[0][:100] if str(e).strip() else type(e).__name__
        print(f"    {label}: not run ({why})", flush=True)
        return None, why


class AttnH:
    """attn.h through python/attn_h.py on a paged bf16 cache in a torch tensor."""

    def __init__(self, device="cuda"):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import attn_h
        self.mod = attn_h
        self.ctx = attn_h.Context(log_level="warn")
        self.layer = attn_h.Layer(self.ctx, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=BS,
                                  dtype="bfloat16", device=device)
        self.device = device
        assert self.layer.selection["resolved"] in (("CUDA", "CUDA_SM90") if device == "cuda" else ("CPU",)), \
            self.layer.selection_text

    def case(self, b, qlens, seqlens, nsets, gen):
        """Metadata sets over disjoint shuffled blocks of one cache; returns (fn, cache)."""
        bps = max(-(-s // BS) for s in seqlens)
        nblocks = nsets * b * bps
        cache = torch.empty(self.layer.kv_cache_shape(nblocks), dtype=torch.bfloat16, device=self.device)
        cache.uniform_(-1, 1, generator=gen)
        ids = np.random.default_rng(b * 7919 + bps).permutation(nblocks).astype(np.int32)
        qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
        ntok = int(qsl[-1])
        metas = []
        for s in range(nsets):
            m = self.mod.Metadata(self.layer, b, ntok, bps, nblocks)
            m.build(qsl, np.array(seqlens, np.int32), ids[s * b * bps:(s + 1) * b * bps].reshape(b, bps),
                    np.full(ntok, -1, np.int64))
            metas.append(m)
        q = torch.empty((ntok, H, D), dtype=torch.bfloat16, device=self.device).uniform_(-1, 1, generator=gen)
        out = torch.empty_like(q)
        layer = self.layer

        def fn(i):
            return layer.forward(metas[i % nsets], q, cache, out)
        return fn, (cache, metas)


def add_attn_h(ah, res, label, b, qlens, seqlens, nsets, g, per_group, groups, graph=False):
    """Times attn.h through attn_h.py on the case (when it loaded) into res["attn_h"] (and,
    with graph, its CUDA-graph replays into res["attn_h graph"])."""
    if not ah:
        return
    case = ah.case(b, qlens, seqlens, nsets, g)  # (forward, the cache and metadata it holds)
    res["attn_h"], _ = try_time(f"{label} attn_h", lambda: case[0], lambda out: None, per_group, groups)
    if graph:
        res["attn_h graph"], _ = try_time(f"{label} attn_h graph", lambda: case[0], lambda out: None, per_group, groups,
                                          graph_sets=nsets)
    case = None  # frees the cache before the next case
    torch.cuda.empty_cache()


def report(impls, csv, table, kind, b, c, amount, res):
    """One printed line, CSV rows and a table entry; amount: bytes (decode) or FLOPs."""
    scale, unit = (1e9, "GB/s") if "decode" in kind else (1e12, "TFLOP/s")
    line = f"  {kind} batch {b:3d} x {c:5d}:"
    for impl in impls:
        t = res.get(impl)
        line += f"  {impl} " + (f"{t * 1e6:9.1f} us {amount / t / scale:5.0f} {unit}" if t else "   --")
        if t:
            csv.append(f"{impl},{kind},{b},{c},{t * 1e6:.2f},{amount / t / scale:.1f},{unit}")
    print(line, flush=True)
    table.append((kind, b, c, amount, res))


def mla_part(ah_ok, csv, table, groups):
    """MLA prefill: SDPA against attn.h's forward_mha; MLA decode through attn_h.py."""
    Hm, L, DQK, DV, R, P, BSM = 128, 4096, 192, 128, 512, 64, 64
    flops = 2.0 * Hm * L * (L + 1) / 2 * (DQK + DV)
    g = torch.Generator(device="cuda").manual_seed(9)
    q = torch.empty((1, Hm, L, DQK), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
    k = torch.empty((1, Hm, L, DQK), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
    v = torch.empty((1, Hm, L, DV), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
    fa3 = load_fa3()
    impls = ["default", "flash", "cudnn", "efficient"] + (["fa3"] if fa3 else []) + (["attn_h"] if ah_ok else [])
    res = {}
    if fa3:
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # [1, L, H, D]
        res["fa3"], _ = try_time("mla prefill fa3", lambda: (lambda i: fa3.flash_attn_func(qt, kt, vt, causal=True)),
                                 lambda out: None, 3, groups, "fa3")
        qt = kt = vt = None
    for impl in impls[:4]:
        def mk():
            return lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if impl == "efficient":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            try:
                with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                    res[impl] = timed(mk(), 3, groups)
            except Exception as ex:  # noqa: BLE001
                print(f"    mla prefill efficient: not run ({str(ex).splitlines()[0][:100]})")
                res[impl] = None
        else:
            res[impl], _ = try_time(f"mla prefill {impl}", mk, lambda out: None, 3, groups, impl)
        torch.cuda.empty_cache()
    q = k = v = None
    torch.cuda.empty_cache()
    if ah_ok:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import attn_h
        ctx = attn_h.Context(log_level="warn")
        mla = dict(kv_lora_rank=R, qk_rope_head_dim=P, qk_nope_head_dim=128, v_head_dim=DV)
        layer = attn_h.Layer(ctx, num_heads=Hm, block_size=BSM, dtype="bfloat16", device="cuda", mla=mla)
        nb = L // BSM
        cache = torch.empty(layer.kv_cache_shape(nb), dtype=torch.bfloat16, device="cuda").uniform_(-1, 1, generator=g)
        meta = attn_h.Metadata(layer, 1, L, nb, nb, workspace_bytes=320 << 20)
        meta.build(np.array([0, L], np.int32), np.array([L], np.int32),
                   np.random.default_rng(5).permutation(nb).astype(np.int32).reshape(1, nb), np.full(L, -1, np.int64))
        qm = torch.empty((L, Hm, DQK), dtype=torch.bfloat16, device="cuda").uniform_(-1, 1, generator=g)
        wuk = torch.empty((Hm, 128, R), dtype=torch.bfloat16, device="cuda").uniform_(-0.04, 0.04, generator=g)
        wuv = torch.empty((Hm, R, DV), dtype=torch.bfloat16, device="cuda").uniform_(-0.04, 0.04, generator=g)
        om = torch.empty((L, Hm, DV), dtype=torch.bfloat16, device="cuda")
        res["attn_h"], _ = try_time("mla prefill attn_h", lambda: (lambda i: layer.mla_forward_mha(meta, qm, cache, wuk, wuv, om)),
                                    lambda out: None, 3, groups)
        print(f"    attn_h MLA layer backend: {layer.selection['resolved']}")
    report(impls, csv, table, "mla_prefill", 1, L, flops, res)
    if not ah_ok:
        return
    for Hd in (16, 128):
        layer = attn_h.Layer(ctx, num_heads=Hd, block_size=BSM, dtype="bfloat16", device="cuda", mla=mla)
        for b in BATCHES:
            for c in CONTEXTS:
                set_bytes = b * c * (R + P) * 2
                nsets = max(2, min(64, -(-ROTATE // set_bytes)))
                bps = -(-c // BSM)
                nblocks = nsets * b * bps
                cache = torch.empty(layer.kv_cache_shape(nblocks), dtype=torch.bfloat16, device="cuda").uniform_(-1, 1, generator=g)
                ids = np.random.default_rng(b * 31 + c).permutation(nblocks).astype(np.int32)
                metas = []
                for s in range(nsets):
                    m = attn_h.Metadata(layer, b, b, bps, nblocks)
                    m.build(np.arange(b + 1, dtype=np.int32), np.full(b, c, np.int32),
                            ids[s * b * bps:(s + 1) * b * bps].reshape(b, bps), np.full(b, -1, np.int64))
                    metas.append(m)
                ql = torch.empty((b, Hd, R), dtype=torch.bfloat16, device="cuda").uniform_(-1, 1, generator=g)
                qp = torch.empty((b, Hd, P), dtype=torch.bfloat16, device="cuda").uniform_(-1, 1, generator=g)
                ol = torch.empty((b, Hd, R), dtype=torch.bfloat16, device="cuda")
                r = {}
                r["attn_h"], _ = try_time(f"mla decode H{Hd} b{b} c{c}",
                                          lambda: (lambda i: layer.mla_forward_mqa(metas[i % nsets], ql, cache, ol, q_pe=qp)),
                                          lambda out: None, max(20, nsets), groups)
                report(["attn_h"], csv, table, f"mla_decode_h{Hd}", b, c, set_bytes, r)
                cache = metas = None
                torch.cuda.empty_cache()


def main():
    global D, BATCHES, CONTEXTS, PREFILLS
    quick = "--quick" in sys.argv
    wide = "--head" in sys.argv
    if wide:
        D = int(sys.argv[sys.argv.index("--head") + 1])
        BATCHES, CONTEXTS, PREFILLS = (1, 16, 64), (4096, 16384), ((1, 4096), (2, 2048))
    csv_path = sys.argv[sys.argv.index("--csv") + 1] if "--csv" in sys.argv else None
    groups = 5 if quick else 11
    dev = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__}, {dev.name}, {dev.multi_processor_count} SMs")
    read = read_ceiling()
    print(f"read ceiling (torch float32 sum over 4 GiB, best of 11): {read:.0f} GB/s", flush=True)
    ah = None
    if "--no-attn-h" not in sys.argv:
        try:
            ah = AttnH()
        except Exception as e:  # noqa: BLE001
            print(f"attn_h: not run ({e})")
    fa3 = None if "--mla-only" in sys.argv else load_fa3()
    peers = ["default", "flash", "cudnn"] + (["efficient", "math"] if wide else []) + (["fa3"] if fa3 else [])
    impls = peers + (["attn_h"] if ah else [])
    csv = ["impl,kind,batch,context,us,value,unit"]
    table = []
    if "--mla-only" in sys.argv:
        mla_part(ah is not None, csv, table, groups)
        if csv_path:
            with open(csv_path, "w") as f:
                f.write("\n".join(csv) + "\n")
        return

    for b in ([] if "--prefill-only" in sys.argv else BATCHES):
        for c in CONTEXTS:
            set_bytes = b * c * HKV * D * 2 * 2
            nsets = max(2, min(64, -(-ROTATE // set_bytes)))
            per_group = max(20, nsets)
            g = torch.Generator(device="cuda").manual_seed(b * 100003 + c)
            k = [torch.empty((b, HKV, c, D), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
                 for _ in range(nsets)]
            v = [torch.empty((b, HKV, c, D), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
                 for _ in range(nsets)]
            q = torch.empty((b, H, 1, D), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
            qf = q.view(b, HKV, H // HKV, D)
            ref = F.scaled_dot_product_attention(qf.float(), k[0].float(), v[0].float())

            def check(out):
                err = (out.reshape(b, HKV, H // HKV, D).float() - ref).abs().max().item()
                assert err < 3e-2, f"differs from the fp32 reference by {err}"

            res = {}
            for impl in peers:
                if impl == "math" and b * c > 16 * 4096:
                    continue  # the math path's fp32 copies of K/V: skip the large cases
                if impl == "fa3":  # [B, ctx, 8, D] caches; q [B, 1, 32, D]; out [B, 1, 32, D]
                    kf = [x.transpose(1, 2).contiguous() for x in k]
                    vf = [x.transpose(1, 2).contiguous() for x in v]
                    qt = q.transpose(1, 2).contiguous()
                    seqlens = torch.full((b,), c, dtype=torch.int32, device="cuda")

                    def mk():
                        return lambda i: fa3.flash_attn_with_kvcache(qt, kf[i % nsets], vf[i % nsets],
                                                                     cache_seqlens=seqlens).transpose(1, 2)
                elif impl == "default":
                    def mk():
                        return lambda i: F.scaled_dot_product_attention(q, k[i % nsets], v[i % nsets], enable_gqa=True)
                else:
                    def mk():
                        return lambda i: F.scaled_dot_product_attention(qf, k[i % nsets], v[i % nsets])
                res[impl], _ = try_time(f"b{b} c{c} {impl}", mk, check, per_group, groups, impl)
                res[impl + " graph"], _ = try_time(f"b{b} c{c} {impl} graph", mk, check, per_group, groups, impl,
                                                   graph_sets=nsets)
            k = v = kf = vf = None  # free before the next case
            torch.cuda.empty_cache()
            add_attn_h(ah, res, f"b{b} c{c}", b, [1] * b, [c] * b, nsets, g, per_group, groups, graph=True)
            report(impls + [i + " graph" for i in impls], csv, table, "decode", b, c, set_bytes, res)

    for b, L in PREFILLS:
        flops = b * 4.0 * H * D * L * (L + 1) / 2
        set_bytes = b * L * D * 2 * (H + 2 * HKV) * 2
        nsets = max(2, min(8, -(-ROTATE // set_bytes)))
        g = torch.Generator(device="cuda").manual_seed(L)
        qs = [torch.empty((b, H, L, D), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
              for _ in range(nsets)]
        ks = [torch.empty((b, HKV, L, D), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
              for _ in range(nsets)]
        vs = [torch.empty((b, HKV, L, D), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
              for _ in range(nsets)]
        res = {}
        for impl in peers:
            if impl == "fa3":
                qt = [x.transpose(1, 2).contiguous() for x in qs]
                kt = [x.transpose(1, 2).contiguous() for x in ks]
                vt = [x.transpose(1, 2).contiguous() for x in vs]
                res[impl], _ = try_time(f"prefill b{b} L{L} fa3",
                                        lambda: (lambda i: fa3.flash_attn_func(qt[i % nsets], kt[i % nsets], vt[i % nsets],
                                                                               causal=True)),
                                        lambda out: None, 3, groups, "fa3")
                qt = kt = vt = None
                torch.cuda.empty_cache()
                continue

            def mk(gqa=True):
                kk = ks if gqa else [x.repeat_interleave(H // HKV, dim=1) for x in ks]
                vv = vs if gqa else [x.repeat_interleave(H // HKV, dim=1) for x in vs]
                return lambda i: F.scaled_dot_product_attention(qs[i % nsets], kk[i % nsets], vv[i % nsets],
                                                                is_causal=True, enable_gqa=gqa)
            t, _ = try_time(f"prefill b{b} L{L} {impl} (enable_gqa)", mk, lambda out: None, 3, groups, impl)
            if t is None:
                t, _ = try_time(f"prefill b{b} L{L} {impl} (K/V repeated)", lambda: mk(False),
                                lambda out: None, 3, groups, impl)
            res[impl] = t
            torch.cuda.empty_cache()
        qs = ks = vs = None
        torch.cuda.empty_cache()
        add_attn_h(ah, res, f"prefill b{b} L{L}", b, [L] * b, [L] * b, nsets, g, 3, groups)
        report(impls, csv, table, "prefill", b, L, flops, res)

    cols = impls + ([i + " graph" for i in impls] if any(r[0] == "decode" for r in table) else [])
    hdr = " | ".join(cols)
    print(f"\n| case | {hdr} (µs; GB/s or TFLOP/s; graph: CUDA-graph replays) |")
    print("| --- |" + " ---: |" * len(cols))
    for kind, b, c, amount, res in table:
        cells = []
        for impl in cols:
            t = res.get(impl)
            if not t:
                cells.append("--")
            elif kind == "decode":
                cells.append(f"{t * 1e6:.1f} µs, {amount / t / 1e9:.0f} GB/s")
            else:
                cells.append(f"{t * 1e6:.0f} µs, {amount / t / 1e12:.0f} TFLOP/s")
        print(f"| {kind} b={b} {'ctx' if kind == 'decode' else 'L'}={c} | " + " | ".join(cells) + " |")
    print(f"\nread ceiling {read:.0f} GB/s (torch); command: python3 {' '.join(sys.argv)}")
    csv.append(f"torch,ceiling,0,0,0,{read:.1f},GB/s")
    if csv_path:
        with open(csv_path, "w") as f:
            f.write("\n".join(csv) + "\n")


if __name__ == "__main__":
    main()
