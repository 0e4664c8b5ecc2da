#!/usr/bin/env python3
"""attn.h against an independent numpy (float64) attention, through ctypes.

Loads build/libattn.so (make build/libattn.so; or the path in env ATTN_LIB) through the
ctypes mirrors of python/attn_h.py, calling the C functions directly; writes a
paged KV cache [num_blocks, 2, block_size, num_kv_heads, head_size] directly with numpy
(shuffled block tables, unused slots NaN so a stray read shows), runs attn_layer_forward
on batches that mix decodes and prefills, and compares out and the LSE (base e,
[num_tokens, num_heads]) with a reference computed here from the same rounded inputs.

One line per case; the last line is exactly "N passed, N failed"; exit 0 only if all pass.
"""
import ctypes as C
import math
import os
import sys
import traceback

import numpy as np

# ---- attn.h: the ctypes mirrors and the loader of python/attn_h.py -----------------------
# (one copy of the mirrors, checked against the compiled header when attn_h is imported)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

try:
    import attn_h  # noqa: E402  (loads the library and checks the mirrors)
except ImportError as e:
    if __name__ != "__main__":
        raise
    print("cannot load the library (make build/libattn.so, or set ATTN_LIB): %s" % e)
    print("0 passed, 1 failed")
    sys.exit(1)
from attn_h import (ATTN_LOG_FN, ATTN_MAX_DIMS, ATTN_OK,  # noqa: E402
                    ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16,
                    ATTN_CAUSAL_DEFAULT, ATTN_CAUSAL_YES, ATTN_CAUSAL_NO,
                    ATTN_LOG_LEVEL_WARN, ATTN_DEVICE_CPU, attn_device, attn_tensor,
                    attn_context_desc, attn_layer_desc, attn_select_request,
                    attn_metadata_desc, attn_batch)


def load_library():
    """The raw ctypes library (signatures declared by attn_h; ATTN_LIB or build/libattn.so)."""
    return attn_h.library()


# ---- element types: numpy storage and exact float64 values --------------------------------

NUMPY_STORAGE = {ATTN_DTYPE_F32: np.float32, ATTN_DTYPE_F16: np.float16, ATTN_DTYPE_BF16: np.uint16}
DTYPE_NAME = {ATTN_DTYPE_F32: "f32", ATTN_DTYPE_F16: "f16", ATTN_DTYPE_BF16: "bf16"}
TOLERANCE = {ATTN_DTYPE_F32: 1e-4, ATTN_DTYPE_F16: 1e-2, ATTN_DTYPE_BF16: 2e-2}  # abs + rel
# The LSE is f32 whatever the layer dtype, computed from exactly representable inputs.
LSE_TOLERANCE = {ATTN_DTYPE_F32: 1e-4, ATTN_DTYPE_F16: 1e-3, ATTN_DTYPE_BF16: 1e-3}


def to_storage(x, dtype):
    """float64 array -> the dtype's storage (bf16 as uint16 bits, round to nearest even)."""
    if dtype != ATTN_DTYPE_BF16:
        return np.asarray(x, dtype=NUMPY_STORAGE[dtype])
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), bits)


def to_f64(s, dtype):
    """Storage -> exact float64 values."""
    if dtype != ATTN_DTYPE_BF16:
        return s.astype(np.float64)
    return (s.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def tensor(arr, dtype):
    t = attn_tensor()
    t.data = arr.ctypes.data
    t.dtype = dtype
    t.ndim = arr.ndim
    for i in range(arr.ndim):
        t.shape[i] = arr.shape[i]
        t.strides[i] = arr.strides[i] // arr.itemsize
    t.device = attn_device(ATTN_DEVICE_CPU, 0)
    return t


def i32ptr(a):
    return a.ctypes.data_as(C.POINTER(C.c_int32))


# ---- the reference ------------------------------------------------------------------------

def visible_keys(pos, seq_len, causal, window):
    """[lo, hi) keys seen by the query at position pos (attn.h's documented semantics:
    a window of w keys ending at pos when causal, w either side of pos when not)."""
    lo = max(0, pos - window + 1) if window else 0
    if causal:
        hi = pos + 1
    else:
        hi = min(seq_len, pos + window) if window else seq_len
    return lo, hi


def reference(q, keys, values, reqs, heads, kv_heads, scale, causal, window, soft_cap, slopes,
              sinks=None):
    """q: [tokens, heads, D] float64; keys/values: per request [seq_len, kv_heads, D];
    sinks: None, or a logit per head in every row's denominator (and its LSE), with no value."""
    group = heads // kv_heads
    ntok = q.shape[0]
    out = np.zeros((ntok, heads, q.shape[2]))
    lse = np.zeros((ntok, heads))
    row = 0
    for r, (ql, sl) in enumerate(reqs):
        for t in range(ql):
            pos = sl - ql + t
            lo, hi = visible_keys(pos, sl, causal, window)
            for h in range(heads):
                k = keys[r][lo:hi, h // group]          # [n, D]
                v = values[r][lo:hi, h // group]
                s = (k @ q[row, h]) * scale
                if soft_cap:
                    s = soft_cap * np.tanh(s / soft_cap)
                if slopes is not None:
                    s = s + slopes[h] * (np.arange(lo, hi) - pos)
                m = s.max() if sinks is None else max(s.max(), float(sinks[h]))
                p = np.exp(s - m)
                total = p.sum() + (0.0 if sinks is None else math.exp(float(sinks[h]) - m))
                out[row, h] = (p @ v) / total
                lse[row, h] = m + math.log(total)
            row += 1
    return out, lse


# ---- one case -----------------------------------------------------------------------------

def run_case(lib, case, rng):
    dt = case.get("dtype", ATTN_DTYPE_F32)
    kvdt = case.get("kv_cache_dtype", dt)
    H, HKV, D = case["heads"], case["kv_heads"], case["head_size"]
    bs = case.get("block_size", 16)
    reqs = case["reqs"]                      # [(query_len, seq_len)]
    window = case.get("window", 0)
    soft_cap = case.get("soft_cap", 0.0)
    layer_causal = case.get("layer_causal", ATTN_CAUSAL_DEFAULT)
    batch_causal = case.get("batch_causal", ATTN_CAUSAL_DEFAULT)
    causal = (batch_causal or layer_causal or ATTN_CAUSAL_YES) == ATTN_CAUSAL_YES
    pass_kv = case.get("pass_kv", False)     # new tokens' k/v through forward + slot_mapping
    pad_rows = case.get("pad_rows", 0)       # extra q/out rows past num_actual_tokens
    scale = case.get("scale", 0.0)
    eff_scale = scale if scale else 1.0 / math.sqrt(D)
    slopes = None
    if case.get("alibi"):
        slopes = np.array([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)], dtype=np.float32)

    logs = []
    log_cb = ATTN_LOG_FN(lambda ud, level, item, msg: logs.append(msg.decode()))
    cdesc = attn_context_desc(log_cb, None, ATTN_LOG_LEVEL_WARN, case.get("threads", 0))
    ctx, layer, meta = C.c_void_p(), C.c_void_p(), C.c_void_p()

    def check(status, what):
        if status != ATTN_OK:
            raise RuntimeError("%s: %s: %s" % (what, lib.attn_status_string(status).decode(),
                                               (lib.attn_context_last_error(ctx) or b"").decode()))

    check(lib.attn_context_create(C.byref(cdesc), C.byref(ctx)), "attn_context_create")
    try:
        desc = attn_layer_desc()
        desc.num_heads, desc.num_kv_heads, desc.head_size = H, HKV, D
        desc.dtype, desc.kv_cache_dtype, desc.block_size = dt, kvdt, bs
        desc.scale, desc.causal, desc.sliding_window = scale, layer_causal, window
        desc.logits_soft_cap = soft_cap
        if slopes is not None:
            desc.alibi_slopes = slopes.ctypes.data_as(C.POINTER(C.c_float))
        request = attn_select_request()
        cpu = C.c_int()
        check(lib.attn_backend_from_name(b"CPU", C.byref(cpu)), "attn_backend_from_name")
        request.backend = cpu.value          # explicit: immune to a stray ATTN_BACKEND
        check(lib.attn_layer_create(ctx, C.byref(desc), C.byref(request), C.byref(layer)),
              "attn_layer_create")

        # Blocks: every request gets ceil(seq_len / bs) blocks taken from a shuffled pool
        # (plus spare blocks nobody owns), so block tables are scattered.
        need = [(sl + bs - 1) // bs for _, sl in reqs]
        num_blocks = sum(need) + 5
        stride = max(need) + 2
        pool = rng.permutation(num_blocks).astype(np.int32)
        block_table = np.zeros((len(reqs), stride), dtype=np.int32)   # padding entries: 0
        at = 0
        for r, n in enumerate(need):
            block_table[r, :n] = pool[at:at + n]
            at += n

        shape = (C.c_int64 * ATTN_MAX_DIMS)()
        ndim = C.c_int()
        check(lib.attn_layer_kv_cache_shape(layer, num_blocks, shape, C.byref(ndim)),
              "attn_layer_kv_cache_shape")
        expect = (num_blocks, 2, bs, HKV, D)
        got_shape = tuple(shape[i] for i in range(ndim.value))
        if got_shape != expect:
            raise RuntimeError("kv cache shape %s, expected %s" % (got_shape, expect))
        kv_cache = to_storage(np.full(expect, np.nan), kvdt)  # NaN: never read outside seqs

        # Inputs, rounded to their storage types; the reference uses the rounded values.
        keys, values, new_k, new_v, slots = [], [], [], [], []
        for r, (ql, sl) in enumerate(reqs):
            k = to_f64(to_storage(rng.uniform(-1, 1, (sl, HKV, D)), kvdt), kvdt)
            v = to_f64(to_storage(rng.uniform(-1, 1, (sl, HKV, D)), kvdt), kvdt)
            pos = np.arange(sl)
            blk, off = block_table[r, pos // bs], pos % bs
            slot = blk.astype(np.int64) * bs + off
            slots.append(slot[sl - ql:])
            if pass_kv:
                # The new tokens arrive as k/v in the layer dtype and are written (and
                # converted to the cache dtype) by attn_layer_forward.
                kn = to_storage(k[sl - ql:], dt)
                vn = to_storage(v[sl - ql:], dt)
                k[sl - ql:] = to_f64(to_storage(to_f64(kn, dt), kvdt), kvdt)
                v[sl - ql:] = to_f64(to_storage(to_f64(vn, dt), kvdt), kvdt)
                new_k.append(kn)
                new_v.append(vn)
                ctx_len = sl - ql
            else:
                ctx_len = sl
            kv_cache[blk[:ctx_len], 0, off[:ctx_len]] = to_storage(k[:ctx_len], kvdt)
            kv_cache[blk[:ctx_len], 1, off[:ctx_len]] = to_storage(v[:ctx_len], kvdt)
            keys.append(k)
            values.append(v)

        ntok = sum(ql for ql, _ in reqs)
        rows = ntok + pad_rows
        q_store = to_storage(rng.uniform(-2, 2, (rows, H, D)), dt)
        q = to_f64(q_store, dt)
        sentinel = to_storage(np.full((rows, H, D), 7.0), dt)
        out_store = sentinel.copy()
        lse_store = np.full((rows, H), 7.0, dtype=np.float32)

        qsl = np.zeros(len(reqs) + 1, dtype=np.int32)
        qsl[1:] = np.cumsum([ql for ql, _ in reqs])
        seq_lens = np.array([sl for _, sl in reqs], dtype=np.int32)
        slot_mapping = np.concatenate(slots).astype(np.int64)

        mdesc = attn_metadata_desc(len(reqs) + 1, rows + 4, stride + 1, num_blocks)
        check(lib.attn_metadata_create(layer, C.byref(mdesc), C.byref(meta)), "attn_metadata_create")
        batch = attn_batch()
        batch.query_start_loc = i32ptr(qsl)
        batch.seq_lens = i32ptr(seq_lens)
        batch.block_table = i32ptr(block_table)
        batch.block_table_stride = stride
        batch.slot_mapping = slot_mapping.ctypes.data_as(C.POINTER(C.c_int64))
        batch.num_reqs = len(reqs)
        batch.num_actual_tokens = ntok
        batch.max_query_len = max(ql for ql, _ in reqs)
        batch.max_seq_len = max(sl for _, sl in reqs)
        batch.causal = batch_causal
        check(lib.attn_metadata_build(meta, 0, C.byref(batch), 0), "attn_metadata_build")

        tq, tout, tlse = tensor(q_store, dt), tensor(out_store, dt), tensor(lse_store, ATTN_DTYPE_F32)
        tk = tv = None
        if pass_kv:
            k_in = np.ascontiguousarray(np.concatenate(new_k))
            v_in = np.ascontiguousarray(np.concatenate(new_v))
            tk, tv = tensor(k_in, dt), tensor(v_in, dt)
        tcache = tensor(kv_cache, kvdt)
        check(lib.attn_layer_forward(layer, meta, C.byref(tq),
                                     C.byref(tk) if tk is not None else None,
                                     C.byref(tv) if tv is not None else None,
                                     C.byref(tcache), C.byref(tout), C.byref(tlse), None),
              "attn_layer_forward")

        ref_out, ref_lse = reference(q[:ntok], keys, values, reqs, H, HKV, eff_scale, causal,
                                     window, soft_cap, slopes)
        got_out = to_f64(out_store[:ntok], dt)
        got_lse = lse_store[:ntok].astype(np.float64)
        tol = TOLERANCE[dt]
        problems = []
        err_out = np.abs(got_out - ref_out)
        err_lse = np.abs(got_lse - ref_lse)
        if not np.all(err_out <= tol + tol * np.abs(ref_out)):   # False for NaN too
            i = np.unravel_index(np.nanargmax(np.where(np.isnan(err_out), np.inf, err_out)),
                                 err_out.shape)
            problems.append("out[%d,%d,%d] = %g, reference %g" % (i + (got_out[i], ref_out[i])))
        ltol = LSE_TOLERANCE[dt]
        if not np.all(err_lse <= ltol + ltol * np.abs(ref_lse)):
            i = np.unravel_index(np.nanargmax(np.where(np.isnan(err_lse), np.inf, err_lse)),
                                 err_lse.shape)
            problems.append("lse[%d,%d] = %g, reference %g" % (i + (got_lse[i], ref_lse[i])))
        if pad_rows and (not np.array_equal(out_store[ntok:], sentinel[ntok:])
                         or not np.all(lse_store[ntok:] == 7.0)):
            problems.append("padding rows past num_actual_tokens were written")
        if pass_kv:
            # The cache must now hold every token of every sequence (k/v written by forward).
            for r, (ql, sl) in enumerate(reqs):
                pos = np.arange(sl)
                blk, off = block_table[r, pos // bs], pos % bs
                for which, ref in ((0, keys[r]), (1, values[r])):
                    if not np.array_equal(to_f64(kv_cache[blk, which, off], kvdt), ref):
                        problems.append("request %d: cache %s differs after forward"
                                        % (r, "keys" if which == 0 else "values"))
        if any("ERROR" in line or "WARN" in line for line in logs):
            problems.append("log: " + "; ".join(logs))
        detail = "out err %.2e, lse err %.2e" % (np.nanmax(err_out), np.nanmax(err_lse))
        return (not problems), detail + ("" if not problems else " -- " + "; ".join(problems))
    finally:
        if meta:
            lib.attn_metadata_destroy(meta)
        if layer:
            lib.attn_layer_destroy(layer)
        lib.attn_context_destroy(ctx)


F32, F16, BF16 = ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16

CASES = [
    dict(name="f32 GQA 8/2, decode+prefill mixed, causal", dtype=F32, heads=8, kv_heads=2,
         head_size=64, reqs=[(1, 37), (20, 20), (7, 50), (1, 1), (16, 16)]),
    dict(name="f16 GQA 16/4, decode+prefill mixed, causal", dtype=F16, heads=16, kv_heads=4,
         head_size=128, reqs=[(1, 100), (33, 33), (5, 70), (1, 17)]),
    dict(name="f32 MHA 4/4 head 40, non-causal layer", dtype=F32, heads=4, kv_heads=4,
         head_size=40, layer_causal=ATTN_CAUSAL_NO, reqs=[(1, 40), (17, 17), (9, 30)]),
    dict(name="f16 GQA 8/2, causal layer, non-causal batch", dtype=F16, heads=8, kv_heads=2,
         head_size=64, batch_causal=ATTN_CAUSAL_NO, reqs=[(12, 12), (1, 33), (6, 21)]),
    dict(name="f32 GQA 8/4, sliding window 16, causal, block 32", dtype=F32, heads=8,
         kv_heads=4, head_size=64, block_size=32, window=16,
         reqs=[(1, 80), (40, 40), (10, 60), (1, 5)]),
    dict(name="f16 GQA 4/2, sliding window 8, non-causal", dtype=F16, heads=4, kv_heads=2,
         head_size=32, window=8, layer_causal=ATTN_CAUSAL_NO, reqs=[(12, 12), (5, 30), (1, 9)]),
    dict(name="f32 MQA 8/1, soft cap 5, ALiBi, scale 0.3", dtype=F32, heads=8, kv_heads=1,
         head_size=64, soft_cap=5.0, alibi=True, scale=0.3, reqs=[(1, 50), (24, 24), (4, 19)]),
    dict(name="f32 GQA 4/2, long decodes (split-KV), 4 threads", dtype=F32, heads=4, kv_heads=2,
         head_size=64, threads=4, reqs=[(1, 3000), (1, 1500)]),
    dict(name="f16 GQA 8/2, split-KV + sliding window 1500, 4 threads", dtype=F16, heads=8,
         kv_heads=2, head_size=128, window=1500, threads=4, reqs=[(1, 2600)]),
    dict(name="f16 GQA 8/2, k/v through forward, 3 padding rows", dtype=F16, heads=8,
         kv_heads=2, head_size=64, pass_kv=True, pad_rows=3, reqs=[(1, 45), (19, 19), (6, 40)]),
    dict(name="f16 q/out, f32 KV cache, k/v through forward", dtype=F16, kv_cache_dtype=F32,
         heads=8, kv_heads=2, head_size=64, pass_kv=True, reqs=[(1, 30), (11, 11)]),
    dict(name="bf16 GQA 8/2, decode+prefill mixed, causal", dtype=BF16, heads=8, kv_heads=2,
         head_size=64, reqs=[(1, 64), (21, 21), (3, 35)]),
]


def main():
    passed = failed = 0
    lib = load_library()
    rng = np.random.default_rng(1234)
    for case in CASES:
        try:
            ok, detail = run_case(lib, case, rng)
        except Exception as e:  # a failed call is a failed case, not a crash of the run
            ok, detail = False, "%s: %s" % (type(e).__name__, e)
            if os.environ.get("ATTN_VERBOSE"):
                traceback.print_exc()
        print("%s  %-58s %s" % ("PASS" if ok else "FAIL", case["name"], detail))
        passed += ok
        failed += not ok
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
