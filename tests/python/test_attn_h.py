"""pytest suite of python/attn_h.py (make build/libattn.so first; `make pytest` does both).

Each test runs on numpy arrays and, where torch imports, on CPU torch tensors (bf16
included) and on CUDA tensors (only where torch sees a GPU and attn.h's platform is CUDA;
skipped otherwise, with the reason). Inputs are random and never zero; every output and
every unused cache slot is NaN before a call, so a row not written or a stray read shows.

References: check_numpy.py's independent float64 numpy attention (standard layers), a
float64 numpy MLA of the unabsorbed definition (here), and with torch,
torch.nn.functional.scaled_dot_product_attention on the K/V gathered back from the paged
cache per request, with an explicit boolean mask (causal at the request's offset, window).
"""
import math
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

import attn_h  # noqa: E402
import check_numpy as ref  # noqa: E402  (the float64 reference and its tolerances)

try:
    import torch
except ImportError:       # the numpy tests still run; torch ones skip with the reason
    torch = None
try:
    import ml_dtypes      # numpy's bfloat16 and float8 types, where installed
except Exception:         # not installed, or built for another numpy
    ml_dtypes = None

NO_BF16 = "numpy has no bfloat16 (ml_dtypes is not installed)"
DTYPE_CODE = {"float32": attn_h.ATTN_DTYPE_F32, "float16": attn_h.ATTN_DTYPE_F16,
              "bfloat16": attn_h.ATTN_DTYPE_BF16}


# ---- arrays: numpy or torch (cpu/cuda), exact float64 in and out ------------------------

class Arrays:
    """Stores float64 values in an element type (rounding them) and reads stored values back
    as exact float64 numpy; the reference always works from what was stored."""

    def __init__(self, kind):
        self.kind = kind                        # "numpy", "torch-cpu", "torch-cuda"
        self.device = "cuda" if kind == "torch-cuda" else "cpu"

    def __repr__(self):
        return self.kind

    def supports(self, dtype):
        return self.kind != "numpy" or dtype != "bfloat16" or ml_dtypes is not None

    def store(self, x, dtype):
        x = np.asarray(x, dtype=np.float64)
        if self.kind == "numpy":
            return x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        return torch.from_numpy(x).to(getattr(torch, dtype)).to(self.device)

    def f64(self, a):
        if self.kind == "numpy":
            return np.asarray(a, dtype=np.float64)
        return a.detach().to("cpu", torch.float64).numpy()

    def nan(self, shape, dtype):
        return self.store(np.full(shape, np.nan), dtype)

    def ints(self, x, dtype):
        """Host ints as the library of the test passes them (torch: CPU tensors)."""
        a = np.asarray(x, dtype=dtype)
        return a if self.kind == "numpy" else torch.from_numpy(a)

    def sync(self):
        if self.kind == "torch-cuda":
            torch.cuda.synchronize()


_CUDA_REASON = []


def cuda_skip_reason():
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if not _CUDA_REASON:
        with attn_h.Context(log_level="error") as ctx:
            p = ctx.platform
        _CUDA_REASON.append("" if p["kind"] == "cuda" else
                            "attn.h's platform is not CUDA: " + p["cuda_reason"])
    return _CUDA_REASON[0]


def arrays(kind):
    if kind != "numpy" and torch is None:
        pytest.skip("torch is not installed")
    if kind == "torch-cuda" and cuda_skip_reason():
        pytest.skip(cuda_skip_reason())
    return Arrays(kind)


@pytest.fixture(params=["numpy", "torch-cpu", "torch-cuda"])
def xp(request):
    return arrays(request.param)


@pytest.fixture(params=["torch-cpu", "torch-cuda"])
def tx(request):
    return arrays(request.param)


@pytest.fixture(scope="session")
def kernel_dir(tmp_path_factory):
    """Env ATTN_CACHE_DIR when set (None: the library reads it), else one kernel cache for
    the session: CUDA kernels compile once, not once per test."""
    if os.environ.get("ATTN_CACHE_DIR"):
        return None
    return str(tmp_path_factory.mktemp("attn-kernels"))


@pytest.fixture
def ctx(kernel_dir):
    lines = []
    c = attn_h.Context(log_level="warn", num_threads=2, kernel_cache_dir=kernel_dir,
                       log=lambda level, item, msg: lines.append((level, item, msg)))
    c.lines = lines
    yield c
    c.close()
    assert not [line for line in lines if line[0] in ("error", "warn")], lines


def assert_close(got, want, atol, rtol, what):
    """|got - want| <= atol + rtol |want| everywhere (NaN fails), naming the worst element."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, "%s: shape %s, reference %s" % (what, got.shape, want.shape)
    err = np.abs(got - want)
    bad = ~(err <= atol + rtol * np.abs(want))
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(np.isnan(err), np.inf, err)), err.shape)
        raise AssertionError("%s: %d of %d elements off; worst %s = %r, reference %r"
                             % (what, bad.sum(), bad.size, i, got[i], want[i]))


# ---- paged batches ------------------------------------------------------------------------

def paged_batch(rng, reqs, block_size, spare=5):
    """Block tables from a shuffled pool (spare blocks nobody owns), the slot of every
    position of every request, and the capacity numbers."""
    need = [(s + block_size - 1) // block_size for _, s in reqs]
    num_blocks = sum(need) + spare
    stride = max(need) + 2
    pool = rng.permutation(num_blocks).astype(np.int32)
    table = np.full((len(reqs), stride), -7, dtype=np.int32)       # padding: never read
    at = 0
    for r, n in enumerate(need):
        table[r, :n] = pool[at:at + n]
        at += n
    slots = [table[r, np.arange(s) // block_size].astype(np.int64) * block_size
             + np.arange(s) % block_size for r, (_, s) in enumerate(reqs)]
    qsl = np.concatenate([[0], np.cumsum([q for q, _ in reqs])]).astype(np.int32)
    return dict(table=table, slots=slots, num_blocks=num_blocks, stride=stride, qsl=qsl,
                seq_lens=np.array([s for _, s in reqs], dtype=np.int32))


STANDARD = [
    dict(id="f32-gqa8/2-d64-decodes+chunked-prefills", dtype="float32", heads=8, kv_heads=2,
         head_size=64, reqs=[(1, 37), (20, 20), (7, 50), (1, 1), (16, 16)]),
    dict(id="f16-gqa16/4-d128-block32", dtype="float16", heads=16, kv_heads=4, head_size=128,
         block_size=32, reqs=[(1, 100), (33, 33), (5, 70), (1, 17)], pad_rows=3),
    dict(id="bf16-gqa8/2-d64", dtype="bfloat16", heads=8, kv_heads=2, head_size=64,
         reqs=[(1, 64), (21, 21), (3, 35)]),
    dict(id="f16-mqa-window8-softcap-kv-through-forward", dtype="float16", heads=4, kv_heads=1,
         head_size=32, window=8, soft_cap=5.0, pass_kv=True, reqs=[(12, 12), (5, 30), (1, 9)]),
    dict(id="f32-mha-noncausal-alibi-scale", dtype="float32", heads=4, kv_heads=4,
         head_size=40, causal=False, alibi=True, scale=0.3, reqs=[(1, 40), (17, 17), (9, 30)]),
    dict(id="f16-q-f32-cache-gqa4/2", dtype="float16", kv_cache_dtype="float32", heads=4,
         kv_heads=2, head_size=64, reqs=[(1, 30), (11, 11), (4, 19)]),
    dict(id="bf16-gqa8/2-d64-window16-sinks", dtype="bfloat16", heads=8, kv_heads=2, head_size=64,
         window=16, sinks=True, reqs=[(1, 70), (24, 24), (6, 40)]),
    dict(id="f32-gqa4/2-d32-sinks-kv-through-forward", dtype="float32", heads=4, kv_heads=2,
         head_size=32, sinks=True, pass_kv=True, reqs=[(1, 33), (9, 9), (3, 20)]),
    # heads past 256 (Gemma-class 512; on CUDA the WIDE HEADS kernels, issue 23 item 5)
    dict(id="f16-gqa4/2-d512-sinks", dtype="float16", heads=4, kv_heads=2, head_size=512,
         sinks=True, reqs=[(1, 90), (19, 19), (4, 40), (1, 300)]),
    dict(id="bf16-gqa8/2-d384-window24", dtype="bfloat16", heads=8, kv_heads=2, head_size=384,
         window=24, reqs=[(1, 60), (13, 13), (2, 33)]),
]


def run_standard(ctx, xp, cfg, seed):
    """One varlen batch through attn_h: the cache written by reshape_and_cache (all of it,
    or the context only when the new tokens go through forward), forward with out and LSE.
    Returns what the checks need."""
    dt, kvdt = cfg["dtype"], cfg.get("kv_cache_dtype", cfg["dtype"])
    if not (xp.supports(dt) and xp.supports(kvdt)):
        pytest.skip(NO_BF16)
    rng = np.random.default_rng(seed)
    H, HKV, D, bs = cfg["heads"], cfg["kv_heads"], cfg["head_size"], cfg.get("block_size", 16)
    reqs, pass_kv, pad = cfg["reqs"], cfg.get("pass_kv", False), cfg.get("pad_rows", 0)
    slopes = (np.array([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)], np.float32)
              if cfg.get("alibi") else None)
    sinks = (np.asarray(rng.uniform(-3, 5, H), np.float32) if cfg.get("sinks") else None)
    if sinks is not None and xp.kind != "numpy":
        sinks = torch.from_numpy(sinks).to(xp.device)
    layer = attn_h.Layer(ctx, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=bs,
                         dtype=dt, kv_cache_dtype=cfg.get("kv_cache_dtype"),
                         causal=cfg.get("causal", True), sliding_window=cfg.get("window", 0),
                         logits_soft_cap=cfg.get("soft_cap", 0.0), alibi_slopes=slopes,
                         scale=cfg.get("scale"), device=xp.device, sinks=sinks)
    b = paged_batch(rng, reqs, bs)
    cache = xp.nan(layer.kv_cache_shape(b["num_blocks"]), kvdt)

    # per request k/v in the layer dtype; what the cache then holds, as float64
    ks = [xp.store(rng.uniform(-1, 1, (s, HKV, D)), dt) for _, s in reqs]
    vs = [xp.store(rng.uniform(-1, 1, (s, HKV, D)), dt) for _, s in reqs]
    keys = [xp.f64(xp.store(xp.f64(k), kvdt)) for k in ks]
    values = [xp.f64(xp.store(xp.f64(v), kvdt)) for v in vs]
    cat = np.concatenate if xp.kind == "numpy" else torch.cat
    upto = [s - q if pass_kv else s for q, s in reqs]                # positions cached now
    layer.reshape_and_cache(cat([k[:n] for k, n in zip(ks, upto)]),
                            cat([v[:n] for v, n in zip(vs, upto)]), cache,
                            xp.ints(np.concatenate([sl[:n] for sl, n in zip(b["slots"], upto)]),
                                    np.int64))
    new_slots = np.concatenate([sl[s - q:] for sl, (q, s) in zip(b["slots"], reqs)])
    ntok = int(b["qsl"][-1])
    meta = attn_h.Metadata(layer, max_num_reqs=len(reqs) + 1, max_num_tokens=ntok + pad + 4,
                           max_blocks_per_req=b["stride"], num_blocks=b["num_blocks"])
    meta.build(xp.ints(b["qsl"], np.int32), xp.ints(b["seq_lens"], np.int32),
               xp.ints(b["table"], np.int32), xp.ints(new_slots, np.int64))

    q = xp.store(rng.uniform(-2, 2, (ntok + pad, H, D)), dt)
    out = xp.nan((ntok + pad, H, D), dt)
    lse = xp.nan((ntok + pad, H), "float32")
    k_new = v_new = None
    if pass_kv:
        k_new = cat([k[s - qn:] for k, (qn, s) in zip(ks, reqs)])
        v_new = cat([v[s - qn:] for v, (qn, s) in zip(vs, reqs)])
    got = layer.forward(meta, q, cache, out, lse=lse, k=k_new, v=v_new)
    assert got is out
    xp.sync()
    return dict(layer=layer, meta=meta, cache=cache, q=xp.f64(q), out=xp.f64(out),
                lse=xp.f64(lse), keys=keys, values=values, batch=b, ntok=ntok, slopes=slopes,
                sinks=None if sinks is None else xp.f64(sinks),
                scale=cfg.get("scale") or 1.0 / math.sqrt(D), cfg=cfg)


def check_cache(xp, run):
    """The cache holds every position of every request exactly, and NaN everywhere else."""
    cache = xp.f64(run["cache"])                       # [blocks, 2, bs, kv_heads, D]
    flat = cache.transpose(0, 2, 1, 3, 4).reshape(-1, 2, *cache.shape[3:])
    written = np.zeros(flat.shape[0], dtype=bool)
    for r, sl in enumerate(run["batch"]["slots"]):
        np.testing.assert_array_equal(flat[sl, 0], run["keys"][r], "request %d keys" % r)
        np.testing.assert_array_equal(flat[sl, 1], run["values"][r], "request %d values" % r)
        written[sl] = True
    assert np.isnan(flat[~written]).all(), "a slot outside every sequence was written"


@pytest.mark.parametrize("cfg", STANDARD, ids=[c["id"] for c in STANDARD])
def test_forward_against_numpy_reference(ctx, xp, cfg):
    run = run_standard(ctx, xp, cfg, seed=len(cfg["id"]))
    assert run["layer"].backend in (("CUDA", "CUDA_SM90") if xp.device == "cuda" else ("CPU",))
    check_cache(xp, run)
    H, ntok = cfg["heads"], run["ntok"]
    causal = cfg.get("causal", True)
    want_out, want_lse = ref.reference(run["q"][:ntok], run["keys"], run["values"], cfg["reqs"],
                                       H, cfg["kv_heads"], run["scale"], causal,
                                       cfg.get("window", 0), cfg.get("soft_cap", 0.0),
                                       run["slopes"], run["sinks"])
    code = DTYPE_CODE[cfg["dtype"]]
    tol, ltol = ref.TOLERANCE[code], ref.LSE_TOLERANCE[code]
    assert_close(run["out"][:ntok], want_out, tol, tol, "out")
    assert_close(run["lse"][:ntok], want_lse, ltol, ltol, "lse")
    assert np.isnan(run["out"][ntok:]).all() and np.isnan(run["lse"][ntok:]).all(), \
        "padding rows past num_actual_tokens were written"


def test_cascade_common_prefix_len_numpy():
    """Decodes and a 4-token verification step sharing 3 blocks (48 tokens): the forward with
    common_prefix_len=48 equals the one with 0, and both the float64 reference; a prefix the
    requests do not share is refused by name."""
    rng = np.random.default_rng(23)
    H, HKV, D, bs, P = 8, 2, 32, 16, 48
    reqs = [(1, 70), (1, 60), (4, 90), (1, 49)]
    ctx = attn_h.Context(log_level="error")
    layer = attn_h.Layer(ctx, num_heads=H, num_kv_heads=HKV, head_size=D, dtype="float32",
                         sinks=np.asarray(rng.uniform(-1, 2, H), np.float32))
    b = paged_batch(rng, reqs, bs)
    table = b["table"].copy()
    table[1:, :P // bs] = table[0, :P // bs]                       # the shared prefix blocks
    slots = [table[r, np.arange(s) // bs].astype(np.int64) * bs + np.arange(s) % bs
             for r, (_, s) in enumerate(reqs)]
    cache = np.full(layer.kv_cache_shape(b["num_blocks"]), np.nan, np.float32)
    k0 = rng.uniform(-1, 1, (max(s for _, s in reqs), HKV, D)).astype(np.float32)
    v0 = rng.uniform(-1, 1, k0.shape).astype(np.float32)
    keys, values = [], []
    for r, (_, s) in enumerate(reqs):
        k = rng.uniform(-1, 1, (s, HKV, D)).astype(np.float32)
        v = rng.uniform(-1, 1, (s, HKV, D)).astype(np.float32)
        k[:P], v[:P] = k0[:P], v0[:P]
        layer.reshape_and_cache(k, v, cache, slots[r])
        keys.append(k.astype(np.float64))
        values.append(v.astype(np.float64))
    ntok = int(b["qsl"][-1])
    q = rng.uniform(-2, 2, (ntok, H, D)).astype(np.float32)
    new_slots = np.concatenate([sl[s - qn:] for sl, (qn, s) in zip(slots, reqs)])
    outs = []
    for prefix in (0, P):
        meta = attn_h.Metadata(layer, max_num_reqs=4, max_num_tokens=ntok, max_blocks_per_req=b["stride"],
                               num_blocks=b["num_blocks"], decode_threshold=4)
        meta.build(b["qsl"], b["seq_lens"], table, new_slots, common_prefix_len=prefix)
        out, lse = np.full((ntok, H, D), np.nan, np.float32), np.full((ntok, H), np.nan, np.float32)
        layer.forward(meta, q, cache, out, lse=lse)
        outs.append((out.astype(np.float64), lse.astype(np.float64)))
    want_out, want_lse = ref.reference(q.astype(np.float64), keys, values, reqs, H, HKV,
                                       1.0 / math.sqrt(D), True, 0, 0.0, None,
                                       layer._scales[-1].astype(np.float64))
    for out, lse in outs:
        assert_close(out, want_out, 1e-5, 1e-5, "out")
        assert_close(lse, want_lse, 1e-5, 1e-5, "lse")
    np.testing.assert_allclose(outs[0][0], outs[1][0], atol=2e-6, rtol=1e-5)
    assert layer.features == ("non-causal", "sliding-window", "soft-cap", "alibi", "sinks", "cascade")
    table[2, 1] += 1                                                # not shared any more
    with pytest.raises(attn_h.AttnError, match=r"request 2's block_table\[1\]"):
        meta.build(b["qsl"], b["seq_lens"], table, new_slots, common_prefix_len=P)
    ctx.close()


# ---- 8-bit KV caches ----------------------------------------------------------------------

def cache_values_8bit(xp, cache, kvdt, per_token_head, slots, kv_heads, head_size, block_size,
                      k_scale=1.0, v_scale=1.0):
    """The float64 K and V a quantized cache holds at `slots` ([n, kv_heads, head_size] each),
    read from its bytes: code * scale (per-token-head: the scale plane after each block half's
    codes, attn.h's layout)."""
    if xp.kind == "numpy":
        raw = cache.view(np.uint8) if per_token_head else cache
    else:
        raw = cache.detach().cpu()
        raw = raw.view(torch.uint8).numpy() if per_token_head else raw.to(torch.float32).numpy()
    blk, row = slots // block_size, slots % block_size
    if not per_token_head:
        vals = np.asarray(raw, dtype=np.float64)                  # [blocks, 2, bs, hkv, D]
        return vals[blk, 0, row] * k_scale, vals[blk, 1, row] * v_scale
    half = raw.reshape(raw.shape[0], 2, -1)                       # bytes of each block half
    plane = block_size * kv_heads * head_size
    codes = half[:, :, :plane].reshape(raw.shape[0], 2, block_size, kv_heads, head_size)
    scales = np.ascontiguousarray(half[:, :, plane:]).view(np.float32).reshape(
        raw.shape[0], 2, block_size, kv_heads)
    if kvdt == "int8":
        codes = codes.view(np.int8).astype(np.float64)
    elif xp.kind != "numpy":    # torch reads its own float8 codes (ml_dtypes may not be installed)
        codes = torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn).to(torch.float64).numpy()
    else:
        codes = np.ascontiguousarray(codes).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return (codes[blk, 0, row] * scales[blk, 0, row][..., None],
            codes[blk, 1, row] * scales[blk, 1, row][..., None])


EIGHT_BIT = [
    dict(id="int8-per-token-head-f16", kv_cache_dtype="int8", per_token_head=True),
    dict(id="fp8-e4m3-per-token-head-bf16", kv_cache_dtype="fp8_e4m3", per_token_head=True,
         dtype="bfloat16"),
    dict(id="fp8-e4m3-per-tensor-scale-array", kv_cache_dtype="fp8_e4m3"),
    dict(id="fp8-e5m2-per-tensor-f32", kv_cache_dtype="fp8_e5m2", dtype="float32"),
]


@pytest.mark.parametrize("cfg", EIGHT_BIT, ids=[c["id"] for c in EIGHT_BIT])
def test_8bit_caches(ctx, xp, cfg):
    """An 8-bit cache through attn_h (numpy: int8 arrays, ml_dtypes' float8; torch: int8 and
    float8 tensors): the forward against the float64 reference of the values the cache holds
    (read back from its bytes), per-tensor scales given as one-element float32 arrays whose
    new value the next forward reads."""
    kvdt, pth, dt = cfg["kv_cache_dtype"], cfg.get("per_token_head", False), cfg.get("dtype", "float16")
    if xp.kind == "numpy" and ml_dtypes is None and (kvdt != "int8" or dt == "bfloat16"):
        pytest.skip("numpy has no float8/bfloat16 (ml_dtypes is not installed)")
    rng = np.random.default_rng(len(cfg["id"]))
    H, HKV, D, bs = 8, 2, 64, 16
    reqs = [(1, 70), (12, 12), (3, 40), (1, 1)]
    scales = None
    if not pth:
        scales = np.array([1.0 / 64, 1.0 / 32], dtype=np.float32)
        if xp.kind != "numpy":
            scales = torch.from_numpy(scales).to(xp.device)
    layer = attn_h.Layer(ctx, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=bs, dtype=dt,
                         kv_cache_dtype=kvdt, per_token_head=pth, device=xp.device,
                         k_scale=None if pth else scales[0:1], v_scale=None if pth else scales[1:2])
    assert layer.backend == ("CUDA" if xp.device == "cuda" else "CPU")
    b = paged_batch(rng, reqs, bs)
    shape = layer.kv_cache_shape(b["num_blocks"])
    assert shape[-1] == D + (4 if pth else 0)
    if xp.kind == "numpy":
        cache = np.zeros(shape, dtype=np.int8 if kvdt == "int8" else getattr(
            ml_dtypes, "float8_e4m3fn" if kvdt == "fp8_e4m3" else "float8_e5m2"))
    else:
        tdt = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[kvdt]
        cache = torch.zeros(shape, dtype=tdt, device=xp.device)
    ks = [xp.store(rng.uniform(-1, 1, (s, HKV, D)), dt) for _, s in reqs]
    vs = [xp.store(rng.uniform(-1, 1, (s, HKV, D)), dt) for _, s in reqs]
    cat = np.concatenate if xp.kind == "numpy" else torch.cat
    layer.reshape_and_cache(cat(ks), cat(vs), cache, xp.ints(np.concatenate(b["slots"]), np.int64))
    new_slots = np.concatenate([sl[s - q:] for sl, (q, s) in zip(b["slots"], reqs)])
    ntok = int(b["qsl"][-1])
    meta = attn_h.Metadata(layer, max_num_reqs=len(reqs), max_num_tokens=ntok,
                           max_blocks_per_req=b["stride"], num_blocks=b["num_blocks"])
    meta.build(xp.ints(b["qsl"], np.int32), xp.ints(b["seq_lens"], np.int32),
               xp.ints(b["table"], np.int32), xp.ints(new_slots, np.int64))
    q = xp.store(rng.uniform(-2, 2, (ntok, H, D)), dt)
    for round_ in range(1 if pth else 2):
        if round_ == 1:   # a new value in the same scale arrays: the next call reads it
            if xp.kind == "numpy":
                scales[:] = [1.0 / 16, 1.0 / 8]
            else:
                scales.copy_(torch.tensor([1.0 / 16, 1.0 / 8]))
        ksc, vsc = (1.0, 1.0) if pth else [float(x) for x in (scales.tolist() if xp.kind != "numpy" else scales)]
        out = xp.nan((ntok, H, D), dt)
        layer.forward(meta, q, cache, out)
        xp.sync()
        keys, values = [], []
        for sl in b["slots"]:
            k, v = cache_values_8bit(xp, cache, kvdt, pth, sl, HKV, D, bs, ksc, vsc)
            keys.append(k)
            values.append(v)
        want, _ = ref.reference(xp.f64(q), keys, values, reqs, H, HKV, 1.0 / math.sqrt(D), True,
                                0, 0.0, None)
        # CUDA: q and the probabilities go through f16 (the 8-bit kernels' mma type)
        tol = 4e-3 if dt == "float32" and xp.device == "cuda" else ref.TOLERANCE[DTYPE_CODE[dt]]
        assert_close(xp.f64(out), want, tol, tol, "out, round %d" % round_)


SDPA = [c for c in STANDARD if not c.get("soft_cap") and not c.get("alibi")] + [
    dict(id="f16-gqa8/2-window16-block32", dtype="float16", heads=8, kv_heads=2, head_size=64,
         block_size=32, window=16, reqs=[(1, 80), (40, 40), (10, 60), (1, 5)]),
    dict(id="bf16-f32-cache-chunked", dtype="bfloat16", kv_cache_dtype="float32", heads=4,
         kv_heads=2, head_size=128, reqs=[(8, 40), (1, 33), (25, 25)]),
]


@pytest.mark.parametrize("cfg", SDPA, ids=[c["id"] for c in SDPA])
def test_forward_against_torch_sdpa(ctx, tx, cfg):
    F = torch.nn.functional
    run = run_standard(ctx, tx, cfg, seed=7 + len(cfg["id"]))
    H, HKV, bs = cfg["heads"], cfg["kv_heads"], cfg.get("block_size", 16)
    group, causal, window = H // HKV, cfg.get("causal", True), cfg.get("window", 0)
    cache = run["cache"].detach().to("cpu", torch.float64)  # [blocks, 2, bs, kv_heads, D]
    q = torch.from_numpy(run["q"])
    want_out, want_lse = [], []
    row = 0
    for r, (ql, sl) in enumerate(cfg["reqs"]):
        blocks = torch.from_numpy(run["batch"]["table"][r]).long()
        pos = torch.arange(sl)
        k = cache[blocks[pos // bs], 0, pos % bs]         # gathered: [sl, kv_heads, D]
        v = cache[blocks[pos // bs], 1, pos % bs]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)   # [H, sl, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        qr = q[row:row + ql].transpose(0, 1)                    # [H, ql, D]
        qpos = torch.arange(sl - ql, sl)[:, None]               # this chunk's positions
        kpos = torch.arange(sl)[None, :]
        mask = torch.ones(ql, sl, dtype=torch.bool)
        if causal:
            mask &= kpos <= qpos
            if window:
                mask &= kpos > qpos - window
        elif window:
            mask &= (kpos > qpos - window) & (kpos < qpos + window)
        bias = torch.zeros(H, ql, sl, dtype=torch.float64).masked_fill(~mask, -math.inf)
        if run["sinks"] is not None:   # a sink: one more key, zero value, its logit as the bias
            sink = torch.from_numpy(run["sinks"])[:, None, None].expand(H, ql, 1)
            bias = torch.cat([bias, sink], -1)
            k = torch.cat([k, torch.zeros(H, 1, k.shape[-1], dtype=k.dtype)], 1)
            v = torch.cat([v, torch.zeros(H, 1, v.shape[-1], dtype=v.dtype)], 1)
        want_out.append(F.scaled_dot_product_attention(qr, k, v, attn_mask=bias,
                                                       scale=run["scale"]).transpose(0, 1))
        scores = (qr @ k.transpose(1, 2)) * run["scale"] + bias
        want_lse.append(torch.logsumexp(scores, -1).T)
        row += ql
    code = DTYPE_CODE[cfg["dtype"]]
    tol, ltol = ref.TOLERANCE[code], ref.LSE_TOLERANCE[code]
    ntok = run["ntok"]
    assert_close(run["out"][:ntok], torch.cat(want_out).numpy(), tol, tol, "out vs SDPA")
    assert_close(run["lse"][:ntok], torch.cat(want_lse).numpy(), ltol, ltol, "lse vs SDPA")


def test_cuda_calls_run_on_the_current_stream(ctx):
    """CUDA tensors on a side stream made current: build, cache write and forward go on it
    (stream=None), so after synchronising that stream alone the results are there."""
    if cuda_skip_reason():
        pytest.skip(cuda_skip_reason())
    xp = Arrays("torch-cuda")
    cfg = STANDARD[0]
    rng = np.random.default_rng(5)
    H, HKV, D, reqs = cfg["heads"], cfg["kv_heads"], cfg["head_size"], cfg["reqs"]
    layer = attn_h.Layer(ctx, num_heads=H, num_kv_heads=HKV, head_size=D, dtype="float32",
                         device="cuda")
    b = paged_batch(rng, reqs, 16)
    ntok = int(b["qsl"][-1])
    total = sum(s for _, s in reqs)
    k = xp.store(rng.uniform(-1, 1, (total, HKV, D)), "float32")
    v = xp.store(rng.uniform(-1, 1, (total, HKV, D)), "float32")
    q = xp.store(rng.uniform(-2, 2, (ntok, H, D)), "float32")
    cache = torch.empty(layer.kv_cache_shape(b["num_blocks"]), dtype=torch.float32,
                        device="cuda")
    out = torch.empty_like(q)
    meta = attn_h.Metadata(layer, len(reqs), ntok, b["stride"], b["num_blocks"])
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        cache.fill_(float("nan"))
        out.fill_(float("nan"))
        layer.reshape_and_cache(k, v, cache, np.concatenate(b["slots"]))
        meta.build(b["qsl"], b["seq_lens"], b["table"],
                   np.concatenate([sl[s - qn:] for sl, (qn, s) in zip(b["slots"], reqs)]))
        layer.forward(meta, q, cache, out)
    side.synchronize()
    kk, vv = xp.f64(k), xp.f64(v)
    starts = np.concatenate([[0], np.cumsum([s for _, s in reqs])])
    want, _ = ref.reference(xp.f64(q), [kk[a:e] for a, e in zip(starts, starts[1:])],
                            [vv[a:e] for a, e in zip(starts, starts[1:])], reqs, H, HKV,
                            1.0 / math.sqrt(D), True, 0, 0.0, None)
    assert_close(xp.f64(out), want, 1e-4, 1e-4, "out")


def test_cuda_slot_mapping_as_a_cuda_tensor(ctx):
    """Issue 21: a CUDA layer's cache write takes vLLM's slot_mapping as it is, an int64 CUDA
    tensor (no copy): the same bytes as from host slots; a slot out of range writes nothing."""
    if cuda_skip_reason():
        pytest.skip(cuda_skip_reason())
    layer = attn_h.Layer(ctx, num_heads=8, num_kv_heads=2, head_size=64, dtype="bfloat16", device="cuda")
    g = torch.Generator().manual_seed(11)
    k = torch.randn(300, 2, 64, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn(300, 2, 64, generator=g).to(torch.bfloat16).cuda()
    slots = torch.randperm(32 * 16, generator=g)[:300]
    slots[::7] = -1
    shape = layer.kv_cache_shape(32)
    a = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    b = a.clone()
    layer.reshape_and_cache(k, v, a, slots.numpy())                 # host slots
    layer.reshape_and_cache(k, v, b, slots.cuda())                  # device slots, in place
    torch.cuda.synchronize()
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    bad = slots.clone()
    bad[-1] = 32 * 16                                               # one past the last slot
    c = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    layer.reshape_and_cache(k, v, c, bad.cuda())
    torch.cuda.synchronize()
    assert torch.isnan(c.float()).all(), "a device slot out of range: nothing may be written"
    with pytest.raises(attn_h.AttnError, match="slot_mapping"):
        layer.reshape_and_cache(k, v, c, slots.cuda().to(torch.int32))


# ---- LSE merge ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dcp_combine(ctx, xp, dtype):
    """attn_dcp_combine of 3 ranks' partials: the LSE-weighted mean and the joint LSE; a row
    one rank has no key of (-inf) and a row no rank has (out 0, lse -inf, no NaN)."""
    if not xp.supports(dtype):
        pytest.skip(NO_BF16)
    rng = np.random.default_rng(12)
    T, H, D, W = 7, 4, 64, 3
    outs = [xp.store(rng.uniform(-1, 1, (T, H, D)), dtype) for _ in range(W)]
    ls = [rng.uniform(-3, 3, (T, H)) for _ in range(W)]
    ls[1][0, 1] = -np.inf
    for x in ls:
        x[3, 2] = -np.inf
    lses = [xp.store(x, "float32") for x in ls]
    out, lse = xp.nan((T, H, D), dtype), xp.nan((T, H), "float32")
    got = attn_h.dcp_combine(ctx, outs, lses, out, lse)
    assert got is out
    xp.sync()
    o = np.stack([xp.f64(x) for x in outs])
    lv = np.stack([xp.f64(x) for x in lses])
    m = lv.max(axis=0)
    w = np.where(np.isfinite(lv), np.exp(lv - np.where(np.isfinite(m), m, 0)), 0.0)
    s = w.sum(axis=0)
    want = np.where(s[..., None] > 0, (w[..., None] * o).sum(axis=0) / np.where(s > 0, s, 1)[..., None], 0.0)
    tol = 2 * ref.TOLERANCE[DTYPE_CODE[dtype]]   # the device folds pairwise merges in the dtype
    assert_close(xp.f64(out), want, tol, tol, "combined out")
    got_lse = xp.f64(lse)
    assert got_lse[3, 2] == -np.inf and np.all(xp.f64(out)[3, 2] == 0)
    fin = np.isfinite(m)
    assert_close(got_lse[fin], (m + np.log(np.where(s > 0, s, 1)))[fin], 1e-5, 1e-5, "combined lse")
    # inputs of different strides (one a view into a wider tensor): on CUDA the fold of
    # pairwise merges instead of the one-pass kernel, the same result
    wide = xp.nan((T, H, 2 * D), dtype)
    wide[:, :, :D] = outs[1]
    mixed = [outs[0], wide[:, :, :D], outs[2]]
    out2, lse2 = xp.nan((T, H, D), dtype), xp.nan((T, H), "float32")
    attn_h.dcp_combine(ctx, mixed, lses, out2, lse2)
    xp.sync()
    assert_close(xp.f64(out2), want, 2 * tol, 2 * tol, "combined out (mixed strides)")
    assert_close(xp.f64(lse2)[fin], (m + np.log(np.where(s > 0, s, 1)))[fin], 1e-5, 1e-5, "combined lse (mixed)")


def _dcp_gloo_rank(rank, world, init_file, result_file):
    """One process of test_dcp_torch_distributed_gloo: the whole batch on one rank (the
    reference), then this rank's shard, its partial forward and the gathered combine."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    try:
        ctx = attn_h.Context(log_level="warn", num_threads=1)
        H, HKV, D, bs, I = 4, 2, 64, 16, 16
        reqs = [(1, 70), (3, 33), (12, 50), (1, 5)]                  # (query_len, seq_len)
        rng = np.random.default_rng(77)                              # the same batch in every process
        ks = [torch.from_numpy(rng.uniform(-1, 1, (s, HKV, D)).astype(np.float32)) for _, s in reqs]
        vs = [torch.from_numpy(rng.uniform(-1, 1, (s, HKV, D)).astype(np.float32)) for _, s in reqs]
        ntok = sum(q for q, _ in reqs)
        q = torch.from_numpy(rng.uniform(-2, 2, (ntok, H, D)).astype(np.float32))
        qsl = np.concatenate([[0], np.cumsum([q_ for q_, _ in reqs])]).astype(np.int32)
        lens = np.array([s for _, s in reqs], np.int32)
        layer = attn_h.Layer(ctx, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=bs, dtype="float32")

        def run(W, r):
            """Rank r of W: its tokens at local indices in blocks of its own (W 1: all)."""
            local = [attn_h.dcp_local_tokens(W, r, I, s) for _, s in reqs]
            nbs = [(n + bs - 1) // bs for n in local]
            stride = max(nbs) + 1
            table = np.zeros((len(reqs), stride), np.int32)
            nb = 0
            for i, n in enumerate(nbs):
                table[i, :n] = np.arange(nb, nb + n)
                nb += n
            cache = torch.full(layer.kv_cache_shape(nb + 1), float("nan"))
            slots, kk, vv, new_slots = [], [], [], []
            for i, (ql, s) in enumerate(reqs):
                for p in range(s):
                    if (p // I) % W == r:
                        j = attn_h.dcp_local_tokens(W, r, I, p)
                        slot = int(table[i, j // bs]) * bs + j % bs
                        slots.append(slot)
                        kk.append(ks[i][p])
                        vv.append(vs[i][p])
                    else:
                        slot = -1
                    if p >= s - ql:
                        new_slots.append(slot)
            layer.reshape_and_cache(torch.stack(kk), torch.stack(vv), cache, np.array(slots, np.int64))
            meta = attn_h.Metadata(layer, len(reqs), ntok, stride, nb + 1, dcp_world_size=W, dcp_rank=r,
                                   dcp_interleave=I)
            meta.build(qsl, lens, table, np.array(new_slots, np.int64))
            out = torch.full((ntok, H, D), float("nan"))
            lse = torch.full((ntok, H), float("nan"))
            layer.forward(meta, q, cache, out, lse=lse)
            return out, lse

        ref_out, ref_lse = run(1, 0)
        part_out, part_lse = run(world, rank)
        got_out, got_lse = attn_h.dcp_all_gather_combine(ctx, part_out, part_lse)
        err = max(float((got_out - ref_out).abs().max()), float((got_lse - ref_lse).abs().max()))
        with open(result_file + ".%d" % rank, "w") as f:
            f.write("%r" % err)
        ctx.close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_dcp_torch_distributed_gloo(world, tmp_path):
    """attn_h's torch.distributed path: `world` processes (gloo, CPU tensors), each holding
    its shard of a varlen batch's caches, a partial forward on its DCP metadata, then
    dcp_all_gather_combine: every process gets the one-rank result."""
    if torch is None:
        pytest.skip("torch is not installed")
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    res = str(tmp_path / "result")
    mp.spawn(_dcp_gloo_rank, args=(world, str(tmp_path / "init"), res), nprocs=world, join=True)
    for r in range(world):
        err = float(open(res + ".%d" % r).read())
        assert err < 1e-5, "rank %d: combined result %g from the one-rank result" % (r, err)


def test_dcp_metadata_and_local_tokens(ctx):
    """The Python surface of DCP: dcp_local_tokens (and its ValueError), a Metadata of one
    rank, and attn.h's named error for a rank outside the world."""
    brute = sum(1 for p in range(100) if (p // 16) % 4 == 1)
    assert attn_h.dcp_local_tokens(4, 1, 16, 100) == brute
    with pytest.raises(ValueError):
        attn_h.dcp_local_tokens(4, 4, 16, 100)
    layer = attn_h.Layer(ctx, num_heads=4, head_size=64, dtype="float32")
    m = attn_h.Metadata(layer, 4, 32, 8, 16, dcp_world_size=2, dcp_rank=1, dcp_interleave=16)
    cap = m.capacity
    assert (cap["dcp_world_size"], cap["dcp_rank"], cap["dcp_interleave"]) == (2, 1, 16)
    with pytest.raises(attn_h.AttnError, match="dcp_rank is 2"):
        attn_h.Metadata(layer, 4, 32, 8, 16, dcp_world_size=2, dcp_rank=2)
    assert any("dcp_rank is 2" in line[2] for line in ctx.lines)
    ctx.lines.clear()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_merge_attn_states(ctx, xp, dtype):
    if not xp.supports(dtype):
        pytest.skip(NO_BF16)
    rng = np.random.default_rng(11)
    T, H, D = 9, 4, 64
    oa, ob = (xp.store(rng.uniform(-1, 1, (T, H, D)), dtype) for _ in range(2))
    la = rng.uniform(-3, 3, (T, H))
    lb = rng.uniform(-3, 3, (T, H))
    la[0, 1] = -np.inf                                # an empty partition: contributes nothing
    lb[2, 3] = -np.inf
    # lse_b given in base 2 (as some kernels produce it), the merged LSE asked in base e
    lse_a, lse_b = xp.store(la, "float32"), xp.store(lb / math.log(2), "float32")
    out, lse = xp.nan((T, H, D), dtype), xp.nan((T, H), "float32")
    got = attn_h.merge_attn_states(ctx, oa, lse_a, ob, lse_b, out, lse, base_b=2)
    assert got is out
    xp.sync()
    a, b = xp.f64(oa), xp.f64(ob)
    la, lb = xp.f64(lse_a), xp.f64(lse_b) * math.log(2)
    m = np.maximum(la, lb)
    wa, wb = np.exp(la - m), np.exp(lb - m)
    want = (wa[..., None] * a + wb[..., None] * b) / (wa + wb)[..., None]
    tol = ref.TOLERANCE[DTYPE_CODE[dtype]]
    assert_close(xp.f64(out), want, tol, tol, "merged out")
    assert_close(xp.f64(lse), m + np.log(wa + wb), 1e-5, 1e-5, "merged lse")
    # in place (out aliases out_a), allocation when out is None
    again = attn_h.merge_attn_states(ctx, oa, lse_a, ob, lse_b, base_b=2)
    attn_h.merge_attn_states(ctx, oa, lse_a, ob, lse_b, oa, base_b=2)
    xp.sync()
    assert_close(xp.f64(again), want, tol, tol, "merged out (allocated)")
    assert_close(xp.f64(oa), want, tol, tol, "merged out (in place)")


# ---- MLA ----------------------------------------------------------------------------------

R, ROPE, NOPE, VDIM = 256, 64, 128, 128
MLA_TOL = {"float32": (1e-4, 1e-4), "float16": (5e-3, 3e-3), "bfloat16": (1.5e-2, 1.5e-2)}


def mla_reference(lat, qn, qp, wuk, wuv, reqs, scale):
    """float64, unabsorbed: per head K = [kv_c W_UK^T | k_pe], V = kv_c W_UV, causal.
    Returns out [T, H, VDIM], the latent output softmax . kv_c [T, H, R], lse [T, H]."""
    T, H = qn.shape[:2]
    out, olat, lse = np.zeros((T, H, VDIM)), np.zeros((T, H, R)), np.zeros((T, H))
    row = 0
    for r, (ql, sl) in enumerate(reqs):
        kvc, kpe = lat[r][:, :R], lat[r][:, R:]
        k_nope = np.einsum("sr,hnr->hsn", kvc, wuk)          # [H, S, NOPE]
        v = np.einsum("sr,hrv->hsv", kvc, wuv)               # [H, S, VDIM]
        for t in range(ql):
            pos = sl - ql + t
            s = (np.einsum("hn,hsn->hs", qn[row], k_nope[:, :pos + 1])
                 + qp[row] @ kpe[:pos + 1].T) * scale        # [H, pos + 1]
            mx = s.max(-1, keepdims=True)
            p = np.exp(s - mx)
            out[row] = np.einsum("hs,hsv->hv", p, v[:, :pos + 1]) / p.sum(-1)[:, None]
            olat[row] = (p @ kvc[:pos + 1]) / p.sum(-1)[:, None]
            lse[row] = mx[:, 0] + np.log(p.sum(-1))
            row += 1
    return out, olat, lse


def assert_rows_close(got, want, abs_tol, rel_tol, what):
    """Tolerance per row of the last dimension: abs relative to the row's RMS."""
    rms = np.maximum(np.sqrt((want ** 2).mean(-1, keepdims=True)), 1e-3)
    assert_close(got, want, abs_tol * rms, rel_tol, what)


def mla_skip(xp, dtype):
    """Skips what the MLA backends of xp's device do not take."""
    if xp.device == "cuda":
        if dtype == "float32":
            pytest.skip("CUDA_MLA_SM90 takes f16 and bf16 (f32 MLA runs on CPU_MLA)")
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("CUDA_MLA_SM90 needs compute capability 9.0")
    if not xp.supports(dtype):
        pytest.skip(NO_BF16)


def mla_inputs(rng, xp, dtype, reqs, H, scale):
    """An MLA batch's random inputs in dtype (as xp tensors and their float64 values) and
    the float64 reference: (lat_t, lat, wuk_t, wuv_t, qn_t, qp_t, wuk, wuv, qn, qp, want_out,
    want_lat, want_lse); latents [seq_len, R + ROPE] per request, W_UK [H, NOPE, R], W_UV
    [H, R, VDIM], q_nope / q_pe [tokens, H, .]."""
    ntok = sum(q for q, _ in reqs)
    a = math.sqrt(3.0 / R)
    lat_t = [xp.store(rng.uniform(-1, 1, (s, R + ROPE)), dtype) for _, s in reqs]
    lat = [xp.f64(x) for x in lat_t]
    wuk_t = xp.store(rng.uniform(-a, a, (H, NOPE, R)), dtype)
    wuv_t = xp.store(rng.uniform(-a, a, (H, R, VDIM)), dtype)
    qn_t = xp.store(rng.uniform(-2, 2, (ntok, H, NOPE)), dtype)
    qp_t = xp.store(rng.uniform(-2, 2, (ntok, H, ROPE)), dtype)
    wuk, wuv, qn, qp = xp.f64(wuk_t), xp.f64(wuv_t), xp.f64(qn_t), xp.f64(qp_t)
    return (lat_t, lat, wuk_t, wuv_t, qn_t, qp_t, wuk, wuv, qn, qp) + \
        tuple(mla_reference(lat, qn, qp, wuk, wuv, reqs, scale))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_mla(ctx, xp, dtype):
    mla_skip(xp, dtype)
    rng = np.random.default_rng(3)
    H, bs = 4, 16
    layer = attn_h.Layer(ctx, num_heads=H, block_size=bs, dtype=dtype, device=xp.device,
                         mla=dict(kv_lora_rank=R, qk_rope_head_dim=ROPE,
                                  qk_nope_head_dim=NOPE, v_head_dim=VDIM))
    assert layer.backend == ("CUDA_MLA_SM90" if xp.device == "cuda" else "CPU_MLA")
    assert layer.selection["use_mla"]
    assert layer.features == ("sinks", "sparse-mla")   # MLA: causal, no window, cap or ALiBi; sinks (the sparse call)
    scale = layer.desc["scale"]
    assert scale == pytest.approx(1 / math.sqrt(NOPE + ROPE))

    # decodes first, as attn_reorder_batch orders them
    unordered = [(9, 30), (1, 40), (12, 12), (1, 17)]
    perm, num_decodes = attn_h.reorder_batch([q for q, _ in unordered])
    reqs = [unordered[i] for i in perm]
    assert num_decodes == 2 and [q for q, _ in reqs[:2]] == [1, 1]
    assert sorted(perm.tolist()) == [0, 1, 2, 3]

    b = paged_batch(rng, reqs, bs)
    ntok = int(b["qsl"][-1])
    td = sum(q for q, _ in reqs[:num_decodes])
    (lat_t, lat, wuk_t, wuv_t, qn_t, qp_t, wuk, wuv, qn, qp,
     want_out, want_lat, want_lse) = mla_inputs(rng, xp, dtype, reqs, H, scale)

    cache = xp.nan(layer.kv_cache_shape(b["num_blocks"]), dtype)
    assert tuple(cache.shape) == (b["num_blocks"], bs, R + ROPE)
    cat = np.concatenate if xp.kind == "numpy" else torch.cat
    ctx_rows = cat([x[:s - q] for x, (q, s) in zip(lat_t, reqs)])
    layer.concat_and_cache_mla(ctx_rows[:, :R], ctx_rows[:, R:], cache,
                               np.concatenate([sl[:s - q] for sl, (q, s) in
                                               zip(b["slots"], reqs)]))
    new_rows = cat([x[s - q:] for x, (q, s) in zip(lat_t, reqs)])
    meta = attn_h.Metadata(layer, len(reqs), ntok, b["stride"], b["num_blocks"])
    meta.build(b["qsl"], b["seq_lens"], b["table"],
               np.concatenate([sl[s - q:] for sl, (q, s) in zip(b["slots"], reqs)]))
    info = meta.mla_info
    assert (info["num_decodes"], info["num_decode_tokens"]) == (2, td)
    assert (info["num_prefills"], info["num_prefill_tokens"]) == (2, ntok - td)

    abs_tol, lse_tol = MLA_TOL[dtype]
    if xp.device == "cuda":  # the GPU also rounds q_latent, P and o_latent (tests/mla_fixtures.h GPU_TOL)
        abs_tol, lse_tol = 2 * abs_tol, 2 * lse_tol
    # the fused call writes the new latents, then attends
    out = layer.mla_forward(meta, qn_t, qp_t, cache, wuk_t, wuv_t,
                            kv_c=new_rows[:, :R], k_pe=new_rows[:, R:])
    assert_rows_close(xp.f64(out), want_out, abs_tol, abs_tol, "mla_forward out")
    flat = xp.f64(cache).reshape(-1, R + ROPE)
    for r, sl in enumerate(b["slots"]):
        np.testing.assert_array_equal(flat[sl], lat[r], "request %d latents" % r)

    # absorbed decode: q_latent = q_nope . W_UK per head, q_pe passed apart
    q_lat = xp.store(np.einsum("thn,hnr->thr", qn[:td], wuk), dtype)
    out_lat, lse = xp.nan((td, H, R), dtype), xp.nan((td, H), "float32")
    layer.mla_forward_mqa(meta, q_lat, cache, out_lat, q_pe=qp_t[:td], lse=lse)
    assert_rows_close(xp.f64(out_lat), want_lat[:td], abs_tol, abs_tol, "out_latent")
    assert_close(xp.f64(lse), want_lse[:td], lse_tol, 0, "mqa lse")

    # up-projected prefill of the prefill rows
    q_full = cat([qn_t[td:], qp_t[td:]], -1) if xp.kind != "numpy" else \
        np.concatenate([qn_t[td:], qp_t[td:]], -1)
    out_p, lse_p = xp.nan((ntok - td, H, VDIM), dtype), xp.nan((ntok - td, H), "float32")
    layer.mla_forward_mha(meta, q_full, cache, wuk_t, wuv_t, out_p, lse=lse_p)
    assert_rows_close(xp.f64(out_p), want_out[td:], abs_tol, abs_tol, "mha out")
    assert_close(xp.f64(lse_p), want_lse[td:], lse_tol, 0, "mha lse")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dcp_mla(ctx, xp, dtype):
    """MLA under decode context parallelism, against float64: W = 3 ranks (interleave 4),
    each with its own latent cache of the positions it owns (written through
    concat_and_cache_mla at its local slots) and a DCP metadata of the global batch; each
    rank's absorbed decode and up-projected prefill give partials with LSE, dcp_combine
    joins them. On CUDA this is CUDA_MLA_SM90's decode and prefill over a rank's shard."""
    mla_skip(xp, dtype)
    rng = np.random.default_rng(25)
    H, bs, W, I = 4, 16, 3, 4
    layer = attn_h.Layer(ctx, num_heads=H, block_size=bs, dtype=dtype, device=xp.device,
                         mla=dict(kv_lora_rank=R, qk_rope_head_dim=ROPE,
                                  qk_nope_head_dim=NOPE, v_head_dim=VDIM))
    scale = layer.desc["scale"]
    reqs = [(1, 40), (1, 3), (9, 30), (12, 12)]       # decodes first; request 1 has no key on rank 2
    td, ntok = 2, sum(q for q, _ in reqs)
    qsl = np.concatenate([[0], np.cumsum([q for q, _ in reqs])]).astype(np.int32)
    seq_lens = np.array([s for _, s in reqs], dtype=np.int32)
    (lat_t, lat, wuk_t, wuv_t, qn_t, qp_t, wuk, wuv, qn, qp,
     want_out, want_lat, want_lse) = mla_inputs(rng, xp, dtype, reqs, H, scale)
    q_lat = xp.store(np.einsum("thn,hnr->thr", qn[:td], wuk), dtype)
    cat = np.concatenate if xp.kind == "numpy" else torch.cat
    q_full = cat([qn_t[td:], qp_t[td:]], -1)
    parts = []
    for rank in range(W):
        local = [attn_h.dcp_local_tokens(W, rank, I, s) for _, s in reqs]
        need = [(n + bs - 1) // bs for n in local]
        stride, nblocks = max(max(need), 1) + 1, sum(need) + 2
        table = np.full((len(reqs), stride), -7, dtype=np.int32)
        pool = rng.permutation(nblocks).astype(np.int32)
        at = 0
        for r, n in enumerate(need):
            table[r, :n] = pool[at:at + n]
            at += n
        cache = xp.nan(layer.kv_cache_shape(nblocks), dtype)
        slot_of = []   # per request: each position's slot on this rank, -1 where another rank owns it
        for r, (q, s) in enumerate(reqs):
            pos = np.arange(s)
            j = np.array([attn_h.dcp_local_tokens(W, rank, I, p) for p in pos], dtype=np.int64)
            mine = (pos // I) % W == rank
            slot_of.append(np.where(mine, table[r, np.minimum(j // bs, stride - 1)].astype(np.int64) * bs + j % bs, -1))
            if mine.any():
                idx = np.nonzero(mine)[0]
                rows = lat_t[r][idx.tolist()] if xp.kind != "numpy" else lat_t[r][idx]
                layer.concat_and_cache_mla(rows[:, :R], rows[:, R:], cache, slot_of[r][idx])
        meta = attn_h.Metadata(layer, len(reqs), ntok, stride, nblocks, dcp_world_size=W, dcp_rank=rank,
                               dcp_interleave=I)
        meta.build(qsl, seq_lens, table, np.concatenate([so[s - q:] for so, (q, s) in zip(slot_of, reqs)]))
        out_lat, lse_d = xp.nan((td, H, R), dtype), xp.nan((td, H), "float32")
        layer.mla_forward_mqa(meta, q_lat, cache, out_lat, q_pe=qp_t[:td], lse=lse_d)
        out_p, lse_p = xp.nan((ntok - td, H, VDIM), dtype), xp.nan((ntok - td, H), "float32")
        layer.mla_forward_mha(meta, q_full, cache, wuk_t, wuv_t, out_p, lse=lse_p)
        parts.append((out_lat, lse_d, out_p, lse_p))
    assert np.all(xp.f64(parts[2][1])[1] == -np.inf) and np.all(xp.f64(parts[2][0])[1] == 0), \
        "a rank without keys: out 0, LSE -inf"
    out_lat, lse_d = xp.nan((td, H, R), dtype), xp.nan((td, H), "float32")
    attn_h.dcp_combine(ctx, [p[0] for p in parts], [p[1] for p in parts], out_lat, lse_d)
    out_p, lse_p = xp.nan((ntok - td, H, VDIM), dtype), xp.nan((ntok - td, H), "float32")
    attn_h.dcp_combine(ctx, [p[2] for p in parts], [p[3] for p in parts], out_p, lse_p)
    xp.sync()
    abs_tol, lse_tol = MLA_TOL[dtype]
    abs_tol, lse_tol = 2 * abs_tol, 2 * lse_tol       # the partials are rounded to the dtype once more
    if xp.device == "cuda":
        abs_tol, lse_tol = 2 * abs_tol, 2 * lse_tol
    assert_rows_close(xp.f64(out_lat), want_lat[:td], abs_tol, abs_tol, "DCP out_latent")
    assert_close(xp.f64(lse_d), want_lse[:td], lse_tol, 0, "DCP mqa lse")
    assert_rows_close(xp.f64(out_p), want_out[td:], abs_tol, abs_tol, "DCP mha out")
    assert_close(xp.f64(lse_p), want_lse[td:], lse_tol, 0, "DCP mha lse")


def ds_mla_decode(rows):
    """fp8_ds_mla bytes [N, 656] -> float64 [N, 576], decoded here from the format's
    definition: 512 e4m3 codes times their tile's f32 scale (bytes 512..527), 64 bf16."""
    rows = np.asarray(rows, dtype=np.uint8)
    codes = rows[:, :512].astype(np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e, m = (codes >> 3) & 0xF, codes & 0x7
    val = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0)) * sign
    scales = rows[:, 512:528].copy().view(np.float32).astype(np.float64)      # [N, 4]
    nope = val * np.repeat(scales, 128, axis=1)
    pe = (rows[:, 528:656].copy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.concatenate([nope, pe.astype(np.float64)], axis=1)


@pytest.mark.parametrize("kv", ["bfloat16", "fp8_ds_mla"])
def test_mla_sparse(ctx, xp, kv):
    """attn_mla_forward_sparse (DeepSeek-V3.2's DSA) against float64: request-local top-k
    indices with -1 padding and a repeat, sinks, LSE; an fp8_ds_mla cache written by
    concat_and_cache_mla and decoded here from its bytes; an index past its request refused."""
    if not xp.supports("bfloat16"):
        pytest.skip(NO_BF16)
    rng = np.random.default_rng(11)
    H, bs, RL, topk = 16, 16, 512, 40
    sinks = rng.uniform(-1, 2, H).astype(np.float32)
    layer = attn_h.Layer(ctx, num_heads=H, block_size=bs, dtype="bfloat16", kv_cache_dtype=kv,
                         device=xp.device, sinks=sinks if xp.device == "cpu" else torch.from_numpy(sinks).cuda(),
                         mla=dict(kv_lora_rank=RL, qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=VDIM))
    assert "sinks" in layer.features
    reqs = [(1, 90), (1, 33), (3, 60)]                         # decodes first, as MLA metadata wants
    b = paged_batch(rng, reqs, bs)
    ntok = int(b["qsl"][-1])
    lat = [rng.uniform(-1, 1, (s, RL + ROPE)) for _, s in reqs]
    shape = layer.kv_cache_shape(b["num_blocks"])
    if kv == "fp8_ds_mla":
        assert tuple(shape) == (b["num_blocks"], bs, 656)
        cache = np.zeros(shape, np.uint8) if xp.kind == "numpy" else \
            torch.zeros(tuple(shape), dtype=torch.uint8, device=xp.device)
    else:
        cache = xp.nan(shape, "bfloat16")
    rows = xp.store(np.concatenate(lat), "bfloat16")
    layer.concat_and_cache_mla(rows[:, :RL], rows[:, RL:], cache, np.concatenate(b["slots"]))
    xp.sync()
    if kv == "fp8_ds_mla":                                      # uint8 rows, decoded from their bytes
        flat = np.asarray(cache) if xp.kind == "numpy" else cache.cpu().numpy()
        stored = ds_mla_decode(flat.reshape(b["num_blocks"] * bs, -1))
    else:
        stored = xp.f64(cache).reshape(-1, RL + ROPE)
    idx = np.full((ntok, topk), -1, np.int32)
    t = 0
    for r, (q, s) in enumerate(reqs):
        for _ in range(q):
            n = rng.integers(1, topk + 1)
            idx[t, :n] = rng.integers(0, s, n)
            idx[t, 1] = idx[t, 0]                      # a position named twice counts twice
            t += 1
    q_t = xp.store(rng.uniform(-1, 1, (ntok, H, RL + ROPE)), "bfloat16")
    qv = xp.f64(q_t)
    scale = layer.desc["scale"]
    want, want_lse = np.zeros((ntok, H, RL)), np.zeros((ntok, H))
    t = 0
    for r, (q, s) in enumerate(reqs):
        for _ in range(q):
            sel = [p for p in idx[t] if p >= 0]
            K = stored[b["slots"][r][sel]]                      # [n, 576]
            S = qv[t] @ K.T * scale                             # [H, n]
            mx = np.maximum(S.max(-1), sinks)
            P = np.exp(S - mx[:, None])
            den = P.sum(-1) + np.exp(sinks - mx)
            want[t] = P @ K[:, :RL] / den[:, None]
            want_lse[t] = mx + np.log(den)
            t += 1
    meta = attn_h.Metadata(layer, len(reqs), ntok, b["stride"], b["num_blocks"])
    meta.build(b["qsl"], b["seq_lens"], b["table"], np.full(ntok, -1, np.int64))
    out, lse = xp.nan((ntok, H, RL), "bfloat16"), xp.nan((ntok, H), "float32")
    ix = idx if xp.kind == "numpy" else torch.from_numpy(idx).to(xp.device)
    layer.mla_forward_sparse(meta, q_t, cache, ix, out, lse=lse)
    xp.sync()
    assert_rows_close(xp.f64(out), want, 3e-2, 3e-2, "sparse out")
    assert_close(xp.f64(lse), want_lse, 2e-3, 1e-3, "sparse lse")
    if xp.device == "cpu":                                      # host indices are checked
        bad = idx.copy()
        bad[1, 0] = reqs[1][1]                                  # one past request 1's last position
        with pytest.raises(attn_h.AttnError, match=r"indices\[1\]\[0\]"):
            layer.mla_forward_sparse(meta, q_t, cache, bad if xp.kind == "numpy" else torch.from_numpy(bad), out)
        assert [item for _, item, _ in ctx.lines] == ["ATTN_LOG_INVALID_ARGUMENT"]   # logged once, as an error
        ctx.lines.clear()


def test_public_surface_typed_and_documented():
    """Every public callable of attn_h (Context, Layer, Metadata, the module functions) has
    a docstring or is a property, and type hints on its parameters and return."""
    import inspect
    import typing
    missing = []
    items = [(n, f) for n, f in vars(attn_h).items() if inspect.isfunction(f) and not n.startswith("_")
             and f.__module__ == attn_h.__name__ and n not in ("main", "load_library", "library", "check_layout")]
    for cls in (attn_h.Context, attn_h.Layer, attn_h.Metadata):
        for n, f in vars(cls).items():
            if isinstance(f, property):
                f = f.fget
            if inspect.isfunction(f) and (not n.startswith("_") or n == "__init__"):
                items.append(("%s.%s" % (cls.__name__, n), f))
    for cls in (attn_h.Context, attn_h.Layer, attn_h.Metadata):   # close / closed are inherited
        items += [("%s.close" % cls.__name__, cls.close), ("%s.closed" % cls.__name__, cls.closed.fget)]
    for name, f in items:
        hints = typing.get_type_hints(f, globalns=vars(attn_h))
        params = [p for p in inspect.signature(f).parameters if p not in ("self",)]
        if "return" not in hints or any(p not in hints for p in params):
            missing.append(name)
    assert not missing, "without type hints: %s" % ", ".join(sorted(set(missing)))


def test_kernel_compile(tmp_path, capfd):
    """NVRTC through Context.kernel_compile (no GPU needed): a variant's report (ptxas: the
    registers, no spills), the memory cache on a second call, the disk cache in a new
    context with the same report, a memory-only context that compiles again, a compile error
    raised with NVRTC's log. Issue 37 item 14: the contexts here have kernel caches of this
    test's own (an empty directory, then 'off'), so no source depends on what ran before: a
    session or ATTN_CACHE_DIR directory may hold the variant already, written by a compile
    that NVRTC 12.9+ served from its own cache (no ptxas run, no report: registers 0), which
    attn.h now turns off (--no-cache)."""
    variant = ("merge.cu", "-DHEAD_DIM=128 -DDT=2", "sm_90")
    kdir = str(tmp_path / "kernels")
    ctx = attn_h.Context(log_level="warn", num_threads=1, kernel_cache_dir=kdir)
    if not ctx.platform["nvrtc_version"]:
        pytest.skip("no NVRTC: " + ctx.platform["nvrtc_reason"])

    def check_report(info, source):
        assert (info["kernel"], info["arch"], info["source"]) == ("merge.cu", "sm_90", source), info
        assert info["cubin_bytes"] > 0
        assert info["registers"] > 0 and info["spill_stores"] == 0 and info["spill_loads"] == 0, info
        if source == "compiled":
            assert "ptxas info" in info["log"], info["log"]

    info = ctx.kernel_compile(*variant)
    check_report(info, "compiled")
    check_report(ctx.kernel_compile(*variant), "memory")
    assert ctx.kernel_compile_count == 1
    with pytest.raises(attn_h.AttnError, match="merge.cu"):
        ctx.kernel_compile("merge.cu", "-DHEAD_DIM=128", "sm_90")                  # no DT: its #error
    ctx.close()
    with attn_h.Context(log_level="warn", num_threads=1, kernel_cache_dir=kdir) as again:
        disk = again.kernel_compile(*variant)
        check_report(disk, "disk")
        assert disk["registers"] == info["registers"] and disk["cubin_bytes"] == info["cubin_bytes"]
        assert again.kernel_compile_count == 0
    with attn_h.Context(log_level="warn", num_threads=1, kernel_cache_dir="off") as memory_only:
        check_report(memory_only.kernel_compile(*variant), "compiled")     # NVRTC's cache would serve this one
        assert memory_only.kernel_compile_count == 1
    captured = capfd.readouterr()
    assert captured.err == "", captured.err                                # the compile error: raised, not printed


def test_cuda_memory(ctx):
    """Context.cuda_malloc / cuda_memcpy / cuda_free / cuda_synchronize: a round trip on a
    CUDA platform; elsewhere every call raises AttnError naming why. Bad kinds and short
    arrays are refused by name before any copy."""
    host = np.arange(64, dtype=np.float32)
    with pytest.raises(attn_h.AttnError, match="kind"):
        ctx.cuda_memcpy(0, host, host.nbytes, "host-to-device")
    with pytest.raises(attn_h.AttnError, match="at least nbytes"):
        ctx.cuda_memcpy(0, host[:4], host.nbytes, "h2d")
    if ctx.platform["kind"] != "cuda":
        with pytest.raises(attn_h.AttnError, match="CUDA"):
            ctx.cuda_malloc(256)
        ctx.lines.clear()
        return
    ctx.lines.clear()
    ptr = ctx.cuda_malloc(host.nbytes)
    assert ptr
    ctx.cuda_memcpy(ptr, host, host.nbytes, "h2d")
    back = np.zeros_like(host)
    ctx.cuda_memcpy(back, ptr, host.nbytes, "d2h")
    ctx.cuda_synchronize()
    np.testing.assert_array_equal(back, host)
    ctx.cuda_free(ptr)


FP8_MLA = [dict(id="e4m3-bf16", kv_cache_dtype="fp8_e4m3", dtype="bfloat16"),
           dict(id="e5m2-f16", kv_cache_dtype="fp8_e5m2", dtype="float16")]


@pytest.mark.parametrize("cfg", FP8_MLA, ids=[c["id"] for c in FP8_MLA])
def test_mla_fp8_latent(ctx, xp, cfg):
    """An fp8 latent cache (per-tensor k_scale: a one-element float32 array or tensor) through
    attn_h: the latent write quantizes (each value within half a code step of x / scale), and
    the absorbed decode and the up-projected prefill attend over the values the cache holds,
    code * scale read back from its bytes; a new scale value is read by the next call.
    CPU_MLA; on a GPU CUDA_MLA (CUDA_MLA_SM90 leaves fp8 latents to it)."""
    kvdt, dt = cfg["kv_cache_dtype"], cfg["dtype"]
    if xp.kind == "numpy" and ml_dtypes is None:
        pytest.skip("numpy has no float8/bfloat16 (ml_dtypes is not installed)")
    if xp.device == "cuda" and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("CUDA_MLA needs compute capability 8.0")
    rng = np.random.default_rng(17 + len(kvdt))
    H, bs = 4, 16
    ks = np.array([1.0 / 8], dtype=np.float32)
    if xp.kind != "numpy":
        ks = torch.from_numpy(ks).to(xp.device)
    layer = attn_h.Layer(ctx, num_heads=H, block_size=bs, dtype=dt, kv_cache_dtype=kvdt, k_scale=ks,
                         device=xp.device, mla=dict(kv_lora_rank=R, qk_rope_head_dim=ROPE,
                                                    qk_nope_head_dim=NOPE, v_head_dim=VDIM))
    assert layer.backend == ("CUDA_MLA" if xp.device == "cuda" else "CPU_MLA")
    reqs = [(1, 40), (1, 17), (9, 30), (12, 12)]                 # decodes first
    td = 2
    b = paged_batch(rng, reqs, bs)
    ntok = int(b["qsl"][-1])
    shape = layer.kv_cache_shape(b["num_blocks"])
    if xp.kind == "numpy":
        cache = np.zeros(shape, dtype=getattr(ml_dtypes, "float8_e4m3fn" if kvdt == "fp8_e4m3" else "float8_e5m2"))
    else:
        cache = torch.zeros(shape, dtype=torch.float8_e4m3fn if kvdt == "fp8_e4m3" else torch.float8_e5m2,
                            device=xp.device)
    cat = np.concatenate if xp.kind == "numpy" else torch.cat
    lat_t = [xp.store(rng.uniform(-1, 1, (s, R + ROPE)), dt) for _, s in reqs]
    rows = cat(lat_t)
    layer.concat_and_cache_mla(rows[:, :R], rows[:, R:], cache, xp.ints(np.concatenate(b["slots"]), np.int64))
    xp.sync()
    raw = cache if xp.kind == "numpy" else cache.detach().cpu().to(torch.float32).numpy()
    codes = np.asarray(raw, dtype=np.float64).reshape(-1, R + ROPE)
    half_step = 2.0 ** -4 if kvdt == "fp8_e4m3" else 2.0 ** -3    # relative, normal codes
    for r, sl in enumerate(b["slots"]):
        x = xp.f64(lat_t[r])
        assert np.all(np.abs(codes[sl] * 0.125 - x) <= half_step * np.abs(x) + 2.0 ** -12), \
            "request %d: a latent code is not the nearest to x / scale" % r
    meta = attn_h.Metadata(layer, len(reqs), ntok, b["stride"], b["num_blocks"])
    meta.build(b["qsl"], b["seq_lens"], b["table"],
               np.concatenate([sl[s - q:] for sl, (q, s) in zip(b["slots"], reqs)]))
    a = math.sqrt(3.0 / R)
    wuk_t = xp.store(rng.uniform(-a, a, (H, NOPE, R)), dt)
    wuv_t = xp.store(rng.uniform(-a, a, (H, R, VDIM)), dt)
    qn_t = xp.store(rng.uniform(-2, 2, (ntok, H, NOPE)), dt)
    qp_t = xp.store(rng.uniform(-2, 2, (ntok, H, ROPE)), dt)
    wuk, wuv, qn, qp = xp.f64(wuk_t), xp.f64(wuv_t), xp.f64(qn_t), xp.f64(qp_t)
    abs_tol, lse_tol = MLA_TOL[dt]
    if xp.device == "cuda":  # q_latent, P and o_latent also go through f16 on the GPU
        abs_tol, lse_tol = 2 * abs_tol, 2 * lse_tol
    q_lat = xp.store(np.einsum("thn,hnr->thr", qn[:td], wuk), dt)
    for scale_now in (0.125, 0.25):   # the second round: a new value in the same array
        if scale_now != 0.125:
            if xp.kind == "numpy":
                ks[0] = scale_now
            else:
                ks.fill_(scale_now)
        lat = [codes[sl] * scale_now for sl in b["slots"]]
        want_out, want_lat, want_lse = mla_reference(lat, qn, qp, wuk, wuv, reqs, layer.desc["scale"])
        out_lat, lse = xp.nan((td, H, R), dt), xp.nan((td, H), "float32")
        layer.mla_forward_mqa(meta, q_lat, cache, out_lat, q_pe=qp_t[:td], lse=lse)
        assert_rows_close(xp.f64(out_lat), want_lat[:td], abs_tol, abs_tol, "out_latent, scale %g" % scale_now)
        assert_close(xp.f64(lse), want_lse[:td], lse_tol, 0, "mqa lse, scale %g" % scale_now)
        q_full = cat([qn_t[td:], qp_t[td:]], -1) if xp.kind != "numpy" else \
            np.concatenate([qn_t[td:], qp_t[td:]], -1)
        out_p, lse_p = xp.nan((ntok - td, H, VDIM), dt), xp.nan((ntok - td, H), "float32")
        layer.mla_forward_mha(meta, q_full, cache, wuk_t, wuv_t, out_p, lse=lse_p)
        assert_rows_close(xp.f64(out_p), want_out[td:], abs_tol, abs_tol, "mha out, scale %g" % scale_now)
        assert_close(xp.f64(lse_p), want_lse[td:], lse_tol, 0, "mha lse, scale %g" % scale_now)


# ---- bad input, the library, the objects ---------------------------------------------------

def small_layer(ctx):
    layer = attn_h.Layer(ctx, num_heads=4, num_kv_heads=2, head_size=32, dtype="float16")
    meta = attn_h.Metadata(layer, 4, 32, 4, 8)
    table = np.arange(8, dtype=np.int32).reshape(2, 4)
    meta.build([0, 1, 5], [20, 4], table, [19, 64, 65, 66, 67])
    return layer, meta


def test_bad_input_raises_attn_error_naming_the_argument():
    items = []
    ctx = attn_h.Context(log_level="error", log=lambda level, item, msg: items.append(item))
    layer, meta = small_layer(ctx)
    cache = np.full(layer.kv_cache_shape(8), np.nan, np.float16)
    q = np.random.default_rng(1).uniform(-1, 1, (5, 4, 32)).astype(np.float16)
    out = np.full((5, 4, 32), np.nan, np.float16)

    def raises(status, needle, fn, *args, **kw):
        with pytest.raises(attn_h.AttnError) as e:
            fn(*args, **kw)
        assert isinstance(e.value, RuntimeError)
        assert e.value.status == status, str(e.value)
        assert needle in e.value.message, str(e.value)
        kind = "dtype mismatch (%s): " % status if isinstance(e.value, attn_h.AttnDtypeError) else status + ": "
        assert str(e.value).startswith(kind)
        return e.value

    # the library's own checks (the message is attn_context_last_error)
    e = raises("ATTN_ERROR_SHAPE_MISMATCH", "q.dtype", layer.forward, meta, q.astype(np.float32),
               cache, out)
    assert isinstance(e, attn_h.AttnDtypeError) and isinstance(e, TypeError), type(e)
    assert e.item == "ATTN_LOG_TENSOR_DTYPE" and str(e).startswith("dtype mismatch"), str(e)
    e = raises("ATTN_ERROR_SHAPE_MISMATCH", "out.shape", layer.forward, meta, q, cache, out[:, :2])
    assert type(e) is attn_h.AttnError and e.item == "ATTN_LOG_TENSOR_SHAPE", (type(e), e.item)
    raises("ATTN_ERROR_SHAPE_MISMATCH", "kv_cache", layer.forward, meta, q, cache[:4], out)
    raises("ATTN_ERROR_SHAPE_MISMATCH", "lse", layer.forward, meta, q, cache, out,
           lse=np.zeros((5, 3), np.float32))
    assert np.isnan(out).all(), "a rejected call wrote its output"
    raises("ATTN_ERROR_INVALID_VALUE", "num_kv_heads", attn_h.Layer, ctx, num_heads=4,
           num_kv_heads=3, head_size=32)
    raises("ATTN_ERROR_UNKNOWN_BACKEND", "nope", attn_h.Layer, ctx, num_heads=4,
           head_size=32, backend="nope")
    raises("ATTN_ERROR_INVALID_METADATA", "seq_lens", meta.build, [0, 1, 5], [20, 3],
           np.zeros((2, 4), np.int32), [1, 2, 3, 4, 5])
    kv = q[:, :2]
    raises("ATTN_ERROR_INVALID_VALUE", "slot", layer.reshape_and_cache, kv, kv, cache,
           [0, 1, 2, 3, 10 ** 6])
    assert np.isnan(cache).all(), "a rejected cache write wrote"
    # checks on the Python side, before the call: same error type, the argument named
    e = raises("ATTN_ERROR_SHAPE_MISMATCH", "q", layer.forward, meta, q.astype(np.float64),
               cache, out)
    assert isinstance(e, attn_h.AttnDtypeError) and e.item == "ATTN_LOG_TENSOR_DTYPE", (type(e), e.item)
    raises("ATTN_ERROR_SHAPE_MISMATCH", "all strides 0", layer.forward, meta,
           np.broadcast_to(np.float16(1), (5, 4, 32)), cache, out)
    raises("ATTN_ERROR_INVALID_METADATA", "query_start_loc", meta.build, [0, 1], [20, 4],
           np.zeros((2, 4), np.int32), [1, 2])
    raises("ATTN_ERROR_INVALID_METADATA", "slot_mapping", meta.build, [0, 1, 5], [20, 4],
           np.zeros((2, 4), np.int32), [1, 2])
    raises("ATTN_ERROR_INVALID_VALUE", "block_table", meta.build, [0, 1, 5], [20, 4],
           np.zeros((2, 4)), [1, 2, 3, 4, 5])
    raises("ATTN_ERROR_INVALID_VALUE", "dtype", attn_h.Layer, ctx, num_heads=4,
           head_size=32, dtype="float64")
    raises("ATTN_ERROR_INVALID_VALUE", "sinks", attn_h.Layer, ctx, num_heads=4, head_size=32,
           sinks=np.zeros(3, np.float32))
    raises("ATTN_ERROR_INVALID_VALUE", "sinks", attn_h.Layer, ctx, num_heads=4, head_size=32,
           sinks=np.zeros(4, np.float64))
    raises("ATTN_ERROR_INVALID_VALUE", "desc.sinks[1] is nan", attn_h.Layer, ctx, num_heads=4,
           head_size=32, sinks=np.array([0, np.nan, 0, 0], np.float32))
    sinks = np.zeros(4, np.float32)                    # read at every call: a NaN written later
    sunk = attn_h.Layer(ctx, num_heads=4, num_kv_heads=2, head_size=32, sinks=sinks)
    sinks[3] = np.inf
    raises("ATTN_ERROR_INVALID_VALUE", "desc.sinks[3] holds inf", sunk.forward, meta, q, cache, out)
    assert np.isnan(out).all(), "a rejected call wrote its output"
    with pytest.raises(TypeError, match="q is a list"):
        layer.forward(meta, [[1.0]], cache, out)
    # each library rejection logged its item (ERROR)
    assert {"ATTN_LOG_TENSOR_DTYPE", "ATTN_LOG_TENSOR_SHAPE", "ATTN_LOG_INVALID_SLOT"} <= set(items)
    ctx.close()


FAILING_CALLS = """
import logging, sys
import numpy as np
sys.path.insert(0, %r)
import attn_h
ctx = attn_h.Context(num_threads=1)
for kw in (dict(num_kv_heads=3), dict(backend="nope"), dict(kv_cache_dtype="fp8", dtype="float32")):
    try:
        attn_h.Layer(ctx, num_heads=4, head_size=32, **kw)
    except attn_h.AttnError as e:
        print(type(e).__name__, e.status, e.message)
layer = attn_h.Layer(ctx, num_heads=4, num_kv_heads=2, head_size=32, dtype="float16")
meta = attn_h.Metadata(layer, 4, 32, 4, 8)
meta.build([0, 1], [20], np.arange(4, dtype=np.int32)[None], [19])
cache = np.zeros(layer.kv_cache_shape(8), np.float16)
try:
    layer.forward(meta, np.zeros((1, 4, 32), np.float32), cache)
except TypeError as e:
    print(type(e).__name__, e.status, e.message)
"""


def test_a_failing_call_raises_once_and_prints_nothing(capfd, caplog, monkeypatch):
    """Issue 37 item 12: a failing call raises AttnError with the library's message, which
    names the argument, and prints nothing (the library logged its ERROR line to stderr
    besides, through the default hook; a bad backend name through a call without a
    context); the lines go to Python's logging, logger 'attn_h', the raised one at DEBUG only."""
    import logging
    monkeypatch.delenv("ATTN_LOG_LEVEL", raising=False)
    ctx = attn_h.Context(num_threads=1)          # the defaults: no log callable, level info
    caplog.set_level(logging.DEBUG, logger="attn_h")
    with pytest.raises(attn_h.AttnError) as e:
        attn_h.Layer(ctx, num_heads=4, num_kv_heads=3, head_size=32)
    assert "num_kv_heads" in e.value.message and e.value.status == "ATTN_ERROR_INVALID_VALUE"
    with pytest.raises(attn_h.AttnError) as e:
        attn_h.Layer(ctx, num_heads=4, head_size=32, backend="nope")
    assert e.value.status == "ATTN_ERROR_UNKNOWN_BACKEND" and "'nope'" in e.value.message, str(e.value)
    assert "CUDA_MLA" in e.value.message and "CPU" in e.value.message, e.value.message
    assert attn_h.Layer(ctx, num_heads=4, head_size=32, backend="cpu").backend == "CPU"
    layer, meta = small_layer(ctx)
    with pytest.raises(TypeError) as e:           # AttnDtypeError: an AttnError and a TypeError
        layer.forward(meta, np.zeros((5, 4, 32), np.float32), np.zeros(layer.kv_cache_shape(8), np.float16))
    assert isinstance(e.value, attn_h.AttnDtypeError) and e.value.item == "ATTN_LOG_TENSOR_DTYPE"
    assert "q.dtype" in e.value.message
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == "", captured
    records = [(r.levelno, r.attn_item, r.getMessage()) for r in caplog.records if r.name == "attn_h"]
    assert not [r for r in records if r[0] >= logging.WARNING], records
    assert (logging.DEBUG, "ATTN_LOG_TENSOR_DTYPE", "ATTN_ERROR_SHAPE_MISMATCH: " + e.value.message) in records
    assert any(r[:2] == (logging.INFO, "ATTN_LOG_SELECT_RESOLVED") for r in records), records
    ctx.close()
    # log_level 'none': nothing logged anywhere, the failure still classed by its item
    caplog.clear()
    quiet = attn_h.Context(log_level="none")
    layer, meta = small_layer(quiet)
    with pytest.raises(attn_h.AttnDtypeError):
        layer.forward(meta, np.zeros((5, 4, 32), np.float32), np.zeros(layer.kv_cache_shape(8), np.float16))
    quiet.set_log_level("error")
    lines = []
    told = attn_h.Context(log_level="error", log=lambda *line: lines.append(line))
    layer, meta = small_layer(told)
    with pytest.raises(attn_h.AttnDtypeError):    # a log callable gets the ERROR line as well
        layer.forward(meta, np.zeros((5, 4, 32), np.float32), np.zeros(layer.kv_cache_shape(8), np.float16))
    assert [line[:2] for line in lines] == [("error", "ATTN_LOG_TENSOR_DTYPE")], lines
    assert not [r for r in caplog.records if r.name == "attn_h"]
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == "", captured
    quiet.close()
    told.close()
    # as a script with Python's logging unconfigured: stderr stays empty, each error raised once
    import subprocess
    env = dict(os.environ)
    env.pop("ATTN_LOG_LEVEL", None)
    p = subprocess.run([sys.executable, "-c", FAILING_CALLS % os.path.join(HERE, "..", "..", "python")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    out = p.stdout.splitlines()
    assert len(out) == 4, p.stdout
    assert out[0].startswith("AttnError ATTN_ERROR_INVALID_VALUE") and "num_kv_heads" in out[0]
    assert out[1].startswith("AttnError ATTN_ERROR_UNKNOWN_BACKEND") and "nope" in out[1]
    assert out[2].startswith("AttnError ATTN_ERROR_INVALID_VALUE") and "k_scale=" in out[2]
    assert out[3].startswith("AttnDtypeError ATTN_ERROR_SHAPE_MISMATCH") and "q.dtype" in out[3]


def test_kv_cache_dtype_names_as_attn_info_takes_them():
    """Issue 37 item 12: kv_cache_dtype takes what attn-info's --kv-cache-dtype takes: 'auto'
    (the layer's dtype) and attn_dtype_from_name's names, case-insensitively, each to the
    same type."""
    ctx = attn_h.Context(log_level="none")
    for name in ("auto", "AUTO", None):
        layer = attn_h.Layer(ctx, num_heads=4, num_kv_heads=2, head_size=32, dtype="bf16", kv_cache_dtype=name)
        assert layer.desc["kv_cache_dtype"] == "bf16", (name, layer.desc)
    import ctypes
    lib = attn_h.library()
    names = ["f32", "f16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "fp8_ds_mla", "float32",
             "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
    for d in range(1, 16):                           # the library's short names of its element types
        n = lib.attn_dtype_name(d).decode()
        if n != "?" and not n.startswith("int") or n == "int8":
            names.append(n)
    for name in names + [n.upper() for n in names]:
        code = ctypes.c_int()
        assert lib.attn_dtype_from_name(name.encode(), ctypes.byref(code)) == attn_h.ATTN_OK, name
        assert attn_h._dtype(name, "kv_cache_dtype", auto=True) == code.value, name
    layer = attn_h.Layer(ctx, num_heads=4, num_kv_heads=2, head_size=32, dtype="f32", kv_cache_dtype="FP8_E5M2",
                         k_scale=1.0, v_scale=1.0)
    assert layer.desc["kv_cache_dtype"] == "fp8_e5m2"
    with pytest.raises(attn_h.AttnError, match="'auto'"):
        attn_h.Layer(ctx, num_heads=4, head_size=32, dtype="auto")   # attn-info's --dtype refuses it too
    ctx.close()


def test_fp8_scales_named_as_layer_arguments():
    """Issue 37 item 12: an fp8 cache without its scales (or with scales it does not take)
    is refused naming Layer's arguments, k_scale= / v_scale=, not attn.h's desc fields."""
    ctx = attn_h.Context(log_level="none")
    base = dict(num_heads=4, num_kv_heads=2, head_size=32, dtype="float32")

    def refused(needles, **kw):
        with pytest.raises(attn_h.AttnError) as e:
            attn_h.Layer(ctx, **dict(base, **kw))
        assert e.value.status == "ATTN_ERROR_INVALID_VALUE", str(e.value)
        for needle in needles:
            assert needle in e.value.message, (needle, e.value.message)
        assert "desc." not in e.value.message, e.value.message
        return e.value.message

    refused(["k_scale=", "v_scale=", "fp8_e4m3"], kv_cache_dtype="fp8")
    assert "k_scale=" not in refused(["v_scale="], kv_cache_dtype="fp8_e5m2", k_scale=0.5)
    refused(["k_scale=0"], kv_cache_dtype="fp8", k_scale=0.0, v_scale=1.0)
    refused(["v_scale=nan"], kv_cache_dtype="fp8", k_scale=1.0, v_scale=float("nan"))
    refused(["k_scale=", "per_token_head=True"], kv_cache_dtype="fp8", per_token_head=True, k_scale=1.0)
    mla = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    msg = refused(["k_scale="], num_heads=2, num_kv_heads=None, head_size=None, kv_cache_dtype="fp8", mla=mla)
    assert "v_scale=" not in msg, msg                # MLA: one latent, one scale
    attn_h.Layer(ctx, num_heads=2, dtype="float32", kv_cache_dtype="fp8", mla=mla, k_scale=0.5)
    attn_h.Layer(ctx, **dict(base, kv_cache_dtype="fp8", k_scale=np.ones(1, np.float32), v_scale=2.0))
    ctx.close()


def test_read_only_outputs_and_non_arrays_are_refused(tmp_path):
    """Issue 20, item 3: an output in read-only memory raises AttnError naming it (a mode='r'
    memmap used to crash the interpreter; a setflags(write=False) array used to be written),
    and non-array or None arguments raise TypeError / AttnError naming them."""
    ctx = attn_h.Context(log_level="none")
    layer, meta = small_layer(ctx)
    shape = layer.kv_cache_shape(8)
    path = tmp_path / "cache.bin"
    np.full(shape, np.nan, np.float16).tofile(path)
    rng = np.random.default_rng(3)
    kv = rng.uniform(-1, 1, (5, 2, 32)).astype(np.float16)
    q = rng.uniform(-1, 1, (5, 4, 32)).astype(np.float16)

    def refused(needle, fn, *args, **kw):
        with pytest.raises(attn_h.AttnError) as e:
            fn(*args, **kw)
        assert e.value.status == "ATTN_ERROR_INVALID_VALUE" and needle in e.value.message, str(e.value)

    mapped = np.memmap(path, dtype=np.float16, mode="r", shape=shape)
    refused("kv_cache is read-only", layer.reshape_and_cache, kv, kv, mapped, [19, 64, 65, 66, 67])
    frozen = np.full(shape, np.nan, np.float16)
    frozen.setflags(write=False)
    refused("kv_cache is read-only", layer.reshape_and_cache, kv, kv, frozen, [19, 64, 65, 66, 67])
    refused("kv_cache is read-only", layer.forward, meta, q, frozen, k=kv, v=kv)
    assert np.isnan(frozen).all() and np.isnan(np.asarray(mapped)).all()
    cache = np.full(shape, np.nan, np.float16)
    layer.reshape_and_cache(kv, kv, cache, [19, 64, 65, 66, 67])
    cache.setflags(write=False)
    layer.forward(meta, q, cache)              # a read-only cache is fine where it is only read
    out = np.full((5, 4, 32), np.nan, np.float16)
    out.setflags(write=False)
    refused("out is read-only", layer.forward, meta, q, cache, out)
    lse = np.zeros((5, 4), np.float32)
    lse.setflags(write=False)
    refused("lse is read-only", layer.forward, meta, q, cache, lse=lse)
    # non-arrays and None, named
    with pytest.raises(TypeError, match="forward: q is a list"):
        layer.forward(meta, q.tolist(), cache)
    with pytest.raises(TypeError, match="forward: meta is a NoneType"):
        layer.forward(None, q, cache)
    with pytest.raises(TypeError, match="kv_cache is a list"):
        layer.reshape_and_cache(kv, kv, cache.tolist(), [19, 64, 65, 66, 67])
    with pytest.raises(TypeError, match="merge_attn_states: out_a is a list"):
        attn_h.merge_attn_states(ctx, q.tolist(), None, q, None)
    with pytest.raises(TypeError, match="Metadata: layer is a NoneType"):
        attn_h.Metadata(None, 1, 1, 1, 1)
    if torch is not None:
        tfrozen = torch.from_numpy(np.asarray(mapped).copy())
        layer.reshape_and_cache(torch.from_numpy(kv), torch.from_numpy(kv), tfrozen, [19, 64, 65, 66, 67])
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")    # torch warns about the non-writeable array
            tmapped = torch.from_numpy(mapped)
        refused("kv_cache is a view of read-only memory", layer.reshape_and_cache,
                torch.from_numpy(kv), torch.from_numpy(kv), tmapped, [19, 64, 65, 66, 67])
    ctx.close()


def test_names_and_8bit_bytes_a_user_would_try():
    """Issue 20, item 10: 'fp16' and friends; a uint8 array as an 8-bit cache's bytes; int8
    without per_token_head named in Python's words; a decreasing query_start_loc blamed on
    its order."""
    ctx = attn_h.Context(log_level="none")
    for name in ("fp16", "half", "f16", "float16", "fp32", "f32", "float", "bf16", "bfloat16"):
        attn_h.Layer(ctx, num_heads=2, head_size=16, dtype=name)
    with pytest.raises(attn_h.AttnError, match="fp16"):
        attn_h.Layer(ctx, num_heads=2, head_size=16, dtype="fp64")
    with pytest.raises(attn_h.AttnError) as e:
        attn_h.Layer(ctx, num_heads=2, head_size=16, kv_cache_dtype="int8")
    assert "per_token_head=True" in e.value.message and "ATTN_" not in e.value.message
    # an fp8 cache as plain uint8 bytes: the same bytes as the float8 type would hold
    layer = attn_h.Layer(ctx, num_heads=4, num_kv_heads=2, head_size=32, dtype="float32",
                         kv_cache_dtype="fp8", k_scale=0.5, v_scale=0.25)
    meta = attn_h.Metadata(layer, 2, 8, 2, 4)
    meta.build([0, 3], [3], np.array([[0, 1]], np.int32), [0, 1, 2])
    rng = np.random.default_rng(5)
    k, v = (rng.uniform(-1, 1, (3, 2, 32)).astype(np.float32) for _ in "kv")
    q = rng.uniform(-1, 1, (3, 4, 32)).astype(np.float32)
    cache = np.zeros(layer.kv_cache_shape(4), np.uint8)
    layer.reshape_and_cache(k, v, cache, [0, 1, 2])
    codes = cache[0, 0, :3]                      # K of the three tokens, block 0
    import ctypes
    to_e4m3 = attn_h.library().attn_f32_to_fp8_e4m3
    to_e4m3.argtypes, to_e4m3.restype = [ctypes.c_float], ctypes.c_uint8
    expect = np.array([[[to_e4m3(float(x) / 0.5) for x in row] for row in tok] for tok in k])
    assert (codes == expect).all()
    out = layer.forward(meta, q, cache)
    assert out.shape == (3, 4, 32) and np.isfinite(out).all()
    with pytest.raises(attn_h.AttnError, match="uint8"):
        layer.forward(meta, q, np.zeros(layer.kv_cache_shape(4), np.int16))
    # a decreasing query_start_loc
    layer16 = attn_h.Layer(ctx, num_heads=2, head_size=16)
    meta16 = attn_h.Metadata(layer16, 4, 16, 2, 4)
    with pytest.raises(attn_h.AttnError) as e:
        meta16.build([0, 5, 3], [5, 3], np.zeros((2, 2), np.int32), list(range(5)))
    assert "query_start_loc decreases at index 2" in e.value.message, e.value.message
    ctx.close()


def test_struct_layout_matches_the_library(monkeypatch):
    lib = attn_h.library()
    attn_h.check_layout(lib)                           # what import did
    reported = {name for name, _, _ in attn_h._layout_table(lib)}
    for name, cls in attn_h._MIRRORS.items():
        assert name in reported or name in attn_h._PREFIXES, name
        for field, _ in cls._fields_:
            assert "%s.%s" % (name, field) in reported

    # and it fails, naming what differs: two fields swapped, a field missing, a constant
    import ctypes as C

    fields = list(attn_h.attn_layer_desc._fields_)
    fields[5], fields[6] = fields[6], fields[5]        # block_size <-> scale
    swapped = type("attn_layer_desc", (C.Structure,), {"_fields_": fields})
    monkeypatch.setitem(attn_h._MIRRORS, "attn_layer_desc", swapped)
    with pytest.raises(ImportError, match=r"attn_layer_desc\.(block_size|scale) is at offset"):
        attn_h.check_layout(lib)
    short = type("attn_batch", (C.Structure,), {"_fields_": attn_h.attn_batch._fields_[:-1]})
    monkeypatch.setitem(attn_h._MIRRORS, "attn_layer_desc", attn_h.attn_layer_desc)
    monkeypatch.setitem(attn_h._MIRRORS, "attn_batch", short)
    with pytest.raises(ImportError, match=r"attn_batch(\.stream| is \d+ bytes)"):
        attn_h.check_layout(lib)
    monkeypatch.setitem(attn_h._MIRRORS, "attn_batch", attn_h.attn_batch)
    monkeypatch.setattr(attn_h, "ATTN_DTYPE_BF16", 4)
    with pytest.raises(ImportError, match="ATTN_DTYPE_BF16"):
        attn_h.check_layout(lib)


def test_cuda_library_names_and_pytorch_copies(monkeypatch, tmp_path):
    """Context(nvrtc_library=...) is the only NVRTC tried and the platform says so; with no
    name and no system NVRTC, the copy a pip wheel keeps under site-packages/nvidia/ is used."""
    ctx = attn_h.Context(log_level="none", nvrtc_library=str(tmp_path / "libnvrtc.so.13"))
    p = ctx.platform
    assert p["nvrtc_library"] == "" and "tried %s" % (tmp_path / "libnvrtc.so.13") in p["nvrtc_reason"]
    assert "ATTN_NVRTC_LIBRARY" in p["nvrtc_reason"]
    assert "nvrtc_library: none" in ctx.platform_text
    ctx.close()
    # a site-packages with PyTorch's layout, and a loader that finds no system copy
    lib = tmp_path / "site" / "nvidia" / "cuda_nvrtc" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.12").write_bytes(b"")
    # sys.path holds that site-packages alone (the test's own may have PyTorch's real wheels)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    real_cdll = attn_h.C.CDLL

    def no_system_copy(name, *a, **kw):
        if os.path.basename(str(name)).startswith(("libnvrtc", "libcublas")):
            raise OSError("%s: not on the loader path (test)" % name)
        return real_cdll(name, *a, **kw)
    monkeypatch.setattr(attn_h.C, "CDLL", no_system_copy)
    assert attn_h._pip_cuda_library("nvrtc") == str(lib / "libnvrtc.so.12")
    assert attn_h._pip_cuda_library("cublas") is None            # no cuBLAS wheel here
    monkeypatch.setattr(attn_h.C, "CDLL", real_cdll)
    monkeypatch.delenv("ATTN_NVRTC_LIBRARY", raising=False)
    monkeypatch.setattr(attn_h, "_pip_cuda_library", lambda kind: str(lib / ("lib%s.so.12" % kind)))
    ctx = attn_h.Context(log_level="none")                       # picks the pip copy: an empty file
    assert str(lib / "libnvrtc.so.12") in ctx.platform["nvrtc_reason"]
    ctx.close()


def test_library_not_found_names_the_paths(monkeypatch, tmp_path):
    missing = str(tmp_path / "nowhere" / "libattn.so")
    monkeypatch.setenv("ATTN_LIB", missing)
    with pytest.raises(ImportError, match="tried: .*nowhere/libattn.so"):
        attn_h.load_library()
    monkeypatch.delenv("ATTN_LIB")
    assert attn_h.load_library() is not None   # the repository's build/libattn.so


def test_objects_close_children_first():
    with attn_h.Context(log_level="error") as c:
        layer = attn_h.Layer(c, num_heads=4, head_size=32)
        meta = attn_h.Metadata(layer, 2, 8, 2, 4)
        assert not meta.closed
    assert c.closed and layer.closed and meta.closed
    with pytest.raises(ValueError, match="closed"):
        layer.kv_cache_shape(4)
    c.close()                                   # idempotent
    # dropped without close(): __del__ frees them (metadata before layer before context)
    for _ in range(20):
        c = attn_h.Context(log_level="error")
        meta = attn_h.Metadata(attn_h.Layer(c, num_heads=2, head_size=16), 1, 4, 1, 2)
        del c, meta


def test_context_platform_selection_and_log():
    lines = []
    with attn_h.Context(log_level="debug", kernel_cache_dir="off",
                        log=lambda *line: lines.append(line)) as c:
        p = c.platform
        assert p["kind"] in ("cpu", "cuda") and p["cpu_threads"] >= 1
        assert "platform" in c.platform_text
        layer = attn_h.Layer(c, num_heads=8, num_kv_heads=2, head_size=64, dtype="bf16",
                             backend="CPU")
        s = layer.selection
        assert (s["resolved"], s["requested"], s["source"]) == ("CPU", "CPU", "code")
        assert s["forced_by_code"] and s["dtype"] == "bf16" and s["num_kv_heads"] == 2
        assert s["log_line"] and s["log_line"] in layer.selection_text
        assert ("info", "ATTN_LOG_SELECT_RESOLVED", s["log_line"]) in lines
        # an MLA layer on the CPU: the standard CPU backend is skipped, with its reason
        mla = attn_h.Layer(c, num_heads=2, dtype="float32",
                           mla=dict(kv_lora_rank=256, qk_rope_head_dim=64,
                                    qk_nope_head_dim=128, v_head_dim=128))
        s = mla.selection
        assert s["resolved"] == "CPU_MLA" and s["head_size"] == 320
        assert any(k["backend"] == "CPU" and k["reason"] for k in s["skipped"]), s["skipped"]
        assert mla.kv_cache_shape(3) == (3, 16, 320)
    assert attn_h.mla_num_kv_splits(4096, 4) >= 1
    assert attn_h.VERSION.count(".") == 2


def test_module_docstring_example(capsys):
    """The usage example at the top of attn_h.py runs as written."""
    text = attn_h.__doc__.split("::\n\n", 1)[1]
    lines = []
    for line in text.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    scope = {}
    exec("\n".join(lines), scope)
    assert capsys.readouterr().out.strip() == "CPU"
    out = scope["out"]
    assert out.shape == (21, 8, 64) and np.isfinite(out).all()


def test_prepared_forward_and_torch_ops(ctx, tx):
    """Issue 24: Layer.prepare_forward (structs built once, pointers updated per call) and
    the torch.library ops (torch.ops.attn_h): the same results as Layer.forward, named
    refusals, torch.compile tracing through the op (fullgraph), and on CUDA a captured CUDA
    graph that replays the op on new inputs."""
    H, HKV, D, BS, nb = 8, 2, 64, 16, 48
    dev = tx.device
    layer = attn_h.Layer(ctx, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=BS, dtype="bfloat16",
                         device=dev)
    meta = attn_h.Metadata(layer, 4, 64, 16, nb)
    meta.build(np.array([0, 1, 5, 6], np.int32), np.array([100, 37, 250], np.int32),
               np.arange(48, dtype=np.int32).reshape(3, 16), np.full(6, -1, np.int64))
    g = torch.Generator().manual_seed(7)
    cache = torch.empty(layer.kv_cache_shape(nb), dtype=torch.bfloat16).uniform_(-1, 1, generator=g).to(dev)
    q = torch.empty(6, H, D, dtype=torch.bfloat16).uniform_(-1, 1, generator=g).to(dev)
    q2 = torch.empty(6, H, D, dtype=torch.bfloat16).uniform_(-1, 1, generator=g).to(dev)
    want = layer.forward(meta, q, cache, lse=torch.empty(6, H, device=dev))
    lse_want2 = torch.empty(6, H, device=dev)
    want2 = layer.forward(meta, q2, cache, lse=lse_want2)
    out, lse = torch.full_like(q, float("nan")), torch.full((6, H), float("nan"), device=dev)
    p = layer.prepare_forward(meta, q, cache, out, lse=lse)
    tx.sync()
    assert torch.equal(out, want)
    assert p(q2, cache, out, lse) is out
    tx.sync()
    assert torch.equal(out, want2)
    with pytest.raises(attn_h.AttnError, match="prepared forward: q is .*allowed: the prepared"):
        p(q[:5], cache, out, lse)
    with pytest.raises(attn_h.AttnError, match="prepared forward: lse is None"):
        p(q, cache, out)
    with pytest.raises(TypeError, match="allowed: a torch tensor"):
        attn_h.PreparedForward(layer, meta, q.cpu().float().numpy(), cache, out)

    ops = attn_h.torch_ops()
    assert attn_h.torch_ops() is ops
    lh, mh = attn_h.op_handle(layer), attn_h.op_handle(meta)
    out.fill_(float("nan"))
    ops.forward(lh, mh, q, cache, out)
    tx.sync()
    assert torch.equal(out, want)
    lse_op = torch.full((6, H), float("nan"), device=dev)
    ops.forward(lh, mh, q2, cache, out, lse_op)      # with an LSE: prepared again for these kinds
    ops.forward(lh, mh, q, cache, out)               # and without: the first kinds again
    tx.sync()
    assert torch.equal(out, want) and torch.equal(lse_op, lse_want2), "the op's re-prepared calls"
    with pytest.raises(attn_h.AttnError, match="meta handle .* names no live attn_h.Metadata"):
        ops.forward(lh, 12345, q, cache, out)
    with pytest.raises(TypeError, match="op_handle: obj is a int"):
        attn_h.op_handle(3)

    def step(q, cache, out):
        ops.forward(lh, mh, q, cache, out)
        return out.float() * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out.fill_(float("nan"))
    got = compiled(q2, cache, out)
    tx.sync()
    assert torch.equal(got, want2.float() * 2)

    if dev == "cuda":   # the op under CUDA-graph capture, replayed on new q values
        qg, og = q.clone(), torch.empty_like(q)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ops.forward(lh, mh, qg, cache, og)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ops.forward(lh, mh, qg, cache, og)
        qg.copy_(q2)
        og.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(og, want2)
    meta.close()
    with pytest.raises(ValueError, match="metadata is closed"):
        p(q, cache, out, lse)
    with pytest.raises(ValueError, match="closed"):
        ops.forward(lh, mh, q, cache, out)
    assert not [key for key in attn_h._OP_FORWARDS if key[1] == mh], "the op's calls outlive their metadata"


def _transformers_example(device):
    """examples/transformers_generate.py as a module, or a skip with the reason: torch, the
    device (None: any), transformers 5.17 or later (the example's own check at import says which version is
    installed and the supported range) and, on the CPU, psutil (transformers' continuous
    batching sizes its CPU cache with it)."""
    if torch is None:
        pytest.skip("torch is not installed")
    if device == "cuda" and cuda_skip_reason():
        pytest.skip(cuda_skip_reason())
    sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
    try:
        import transformers_generate as tg
    except ImportError as e:
        if type(e).__name__ != "UnsupportedTransformers":
            raise
        pytest.skip(str(e))
    finally:
        sys.path.pop(0)
    if device == "cpu":
        try:
            import psutil  # noqa: F401
        except ImportError:
            pytest.skip("psutil is not installed (transformers' continuous batching sizes its CPU cache with it)")
    return tg


def test_transformers_version_check():
    """The example's version check (transformers_support) refuses releases before 5.17 in one
    line naming the version and the supported range, takes 5.17-5.25, and only notes a newer
    release (which fails at the first step that changed, naming it)."""
    tg = _transformers_example(None)
    for v in ("4.57.6", "5.16.1", "5.0.0"):
        problem, note = tg.transformers_support(v)
        assert problem.startswith("transformers %s is not supported" % v) and "5.17.0" in problem, problem
        assert "\n" not in problem and not note
    for v in ("5.17.0", "5.18.0", "5.20.2", "5.22.2", "5.25.0", "5.25.1"):
        assert tg.transformers_support(v) == ("", ""), v
    problem, note = tg.transformers_support("5.26.0")
    assert not problem and "5.26.0 is newer" in note and "5.25.0" in note


def test_transformers_unsupported_version_is_one_line(tmp_path):
    """The script, run on a transformers older than 5.17, exits with one line naming the version
    and the supported range (no traceback): a stand-in transformers package of version 5.16.1
    on PYTHONPATH. The check runs before torch is imported, so this runs without torch too."""
    import subprocess
    fake = tmp_path / "transformers"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "5.16.1"\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "examples", "transformers_generate.py"),
                        "--device", "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "transformers 5.16.1 is not supported" in lines[0] and "5.17.0" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("model", ["llama", "deepseek_v3", "deepseek_v3-padded"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_transformers_generate_example(device, model, capsys):
    """examples/transformers_generate.py as a user runs it: a seeded random model built from
    transformers' own modeling code (Llama: GQA; DeepSeek-V3: MLA and MoE) on transformers'
    continuous batching (whichever release 5.17-5.25 is installed), 16 prompts of mixed lengths,
    64 greedy new tokens, on attn.h and on the reference (Llama: transformers' own paged sdpa;
    DeepSeek-V3, which 5.17-5.23 cannot run on it: the example's torch SDPA reference): tokens
    must agree (or diverge only at near-ties after log-probs within tolerance), and attn.h must
    have run. DeepSeek-V3 goes
    through attn.h's MLA over the cached latent; "-padded": its standard layer over the
    up-projected keys and values (a shorter run)."""
    tg = _transformers_example(device)
    size = ["--prompts", "8", "--new-tokens", "32"] if model.endswith("-padded") else \
        ["--prompts", "16", "--new-tokens", "64"]
    mla = ["--mla", "padded"] if model.endswith("-padded") else []
    rc = tg.main(["--device", device, "--model", model.split("-")[0], "--layers", "2", "--check"] + size + mla)
    text = capsys.readouterr().out
    print(text)
    assert rc == 0, text
    assert "result: agree" in text
    calls = int(text.split("attn.h calls: ")[1].split()[0])
    assert calls >= 2 * int(size[3]), text   # every step of both layers went through attn.h
    if model == "deepseek_v3":
        assert "attn.h MLA over the cached latent" in text and "_MLA" in text, text
    assert ("attn.h CPU" in text) == (device == "cpu"), text


@pytest.mark.parametrize("dtype,scale", [("float32", 1.002), ("bfloat16", 1.1)])
def test_transformers_example_check_catches_a_wrong_attention(dtype, scale, monkeypatch, capsys):
    """The example's --check is not a test that cannot fail: with attn.h's attention output
    scaled by `scale` it reports DISAGREE and exits 1 (Llama, CPU). Its reach, measured: in f32
    a 0.2 % error fails the log-prob tolerance; in bf16 the model's own rounding noise (log-prob
    RMS 0.038 against f32 for either implementation) hides 1 %, 3 % moves attn.h's RMS to 1.3x
    the reference's, 10 % to 2.4x (over the 1.5x bound). The f32 runs are the sharp check."""
    tg = _transformers_example("cpu")
    real = tg.AttnHPaged.__call__

    def wrong(self, *args, **kwargs):
        out, w = real(self, *args, **kwargs)
        return out * scale, w

    monkeypatch.setattr(tg.AttnHPaged, "__call__", wrong)
    rc = tg.main(["--device", "cpu", "--model", "llama", "--layers", "2", "--prompts", "16", "--new-tokens", "64",
                  "--dtype", dtype, "--check"])
    text = capsys.readouterr().out
    assert rc == 1 and "result: DISAGREE" in text, text


@pytest.mark.parametrize("model", ["llama", "deepseek_v3-padded"])
def test_transformers_generate_example_cuda_f32(model, capsys):
    """The example on CUDA tensors in f32, where the check is sharp (log-probs within 1e-3 of
    the reference's): attn.h's CUDA kernels in a real engine. (DeepSeek-V3 through its
    standard layer: the CUDA MLA backends take f16/bf16 only, and name that.)"""
    tg = _transformers_example("cuda")
    mla = ["--mla", "padded"] if model.endswith("-padded") else []
    rc = tg.main(["--device", "cuda", "--model", model.split("-")[0], "--layers", "2", "--dtype", "float32",
                  "--prompts", "16", "--new-tokens", "64", "--check"] + mla)
    text = capsys.readouterr().out
    print(text)
    assert rc == 0 and "result: agree" in text, text
    assert "attn.h CUDA" in text, text


def test_transformers_step_maps_pages():
    """The example's Step on a step laid out as 5.18 on lay the cache (a block's rows strided by
    2 x layers x page_size, here 16): our blocks are handed out densely in first-seen order,
    the new tokens' blocks first, the block table and slots follow them, trailing requests with no query tokens (padding) are
    dropped, and keys that are not whole blocks in key order are refused, naming the request."""
    tg = _transformers_example(None)
    bs = 4
    pages = tg.PageMap(bs)

    def idx(blocks, n):   # transformers' indices of n keys in these blocks (16 rows a block)
        return [16 * b + j for b in blocks for j in range(bs)][:n]

    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    # request 0: 6 keys (2 new) in blocks 7, 3; request 1: 3 new keys (a prefill) in block 5; one padding request
    read = idx([7, 3], 6) + idx([5], 3)
    write = read[4:6] + read[6:9] + [0, 1]
    step = tg.Step(t([0, 2, 5, 5]), t([0, 6, 9, 9]), t(write), t(read), pages, "test")
    assert step.n == 2 and step.tokens == 5 and pages.num_blocks == 3 and pages.capacity == 64
    assert step.table.tolist() == [[2, 0], [1, 0]]                     # ours: 3 -> 0, 5 -> 1, 7 -> 2
    assert step.write_slots.tolist() == [0, 1, 4, 5, 6]
    assert step.read_slots.tolist() == [8, 9, 10, 11, 0, 1, 4, 5, 6]
    again = tg.Step(t([0, 1]), t([0, 7]), t(idx([7, 3], 7)[6:]), t(idx([7, 3], 7)), pages, "test")
    assert again.table.tolist() == [[2, 0]] and again.write_slots.tolist() == [2]
    assert pages.num_blocks == 3                                          # the same blocks, no new one
    with pytest.raises(RuntimeError, match="request 0's keys are not whole blocks of 4"):
        tg.Step(t([0, 1]), t([0, 2]), t([18]), t([17, 18]), tg.PageMap(4), "test")     # starts mid-block
    with pytest.raises(RuntimeError, match="request 0's keys are not whole blocks"):
        tg.Step(t([0, 1]), t([0, 3]), t([19]), t([16, 18, 19]), tg.PageMap(4), "test")  # skips a row


def test_transformers_torch_reference_is_paged_sdpa():
    """The example's torch_ref (the DeepSeek-V3 reference) gives transformers' own paged sdpa
    tokens and log-probs on a model both run (Llama, f32, CPU)."""
    tg = _transformers_example("cpu")
    model = tg.tiny_llama(2, torch.float32, "cpu")
    inputs = tg.prompts(8)
    with tg.continuous_batching_attention(tg.TorchPagedReference(32), "torch_ref") as impl:
        ours, _, _ = tg.generate(model, impl, inputs, 24, 32)
    ref, _, _ = tg.generate(model, tg.REFERENCE, inputs, 24, 32)
    ok, lines = tg.compare(ours, ref, 1e-4)
    assert ok and not lines, lines
    assert all(t for t, _ in ours)
