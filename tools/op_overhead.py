"""Host time per forward through attn_h (issue 24, section 3; issue 37 item 8): Layer.forward
(argument structs built per call), PreparedForward (built once, pointers updated) and the
PyTorch custom op torch.ops.attn_h.forward (attn_h.torch_ops(); the prepared path under
torch's dispatcher), beside the C API's figure for the same call measured by `attn-bench-cuda
--case host` (the target: the op <= 5 us over it) and the floor the dispatcher sets: a no-op
op of the same schema whose kernel is a Python function, as attn_h's is.

The call: batch 1 decode over 1024 keys, 32/8 heads, head 128, bf16, block 16 (attn-bench's
shape). 200 calls enqueued back to back on torch's current stream, the host's wall time over
them / 200 (the device runs behind), median of 11 groups, with the objects made before frozen
(gc.freeze(): else a full collection over torch's objects lands in some groups and not in
others, several us a call on a run's average). The last column times each path
with attn_layer_forward replaced by a no-op C function (built here with cc; without cc the
column says so): the Python side alone, which on the CPU is the only host overhead to see
(the forward itself computes there).

usage: python3 tools/op_overhead.py [--device cuda|cpu] [--c-us US | --c-bench PATH]
  --c-us US       the C API's host us per forward (attn-bench-cuda --case host)
  --c-bench PATH  run PATH --case host for it (default on CUDA: build/attn-bench-cuda, when
                  it is there; make build/attn-bench-cuda builds it)
"""
import ctypes
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
import attn_h  # noqa: E402

H, HKV, D, BS, C = 32, 8, 128, 16, 1024
STUB_C = "int attn_stub(void *a, void *b, void *c, void *d, void *e, void *f, void *g, void *h, void *i)\n" \
         "{ (void)a; (void)b; (void)c; (void)d; (void)e; (void)f; (void)g; (void)h; (void)i; return 0; }\n"


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


def c_api_us(dev):
    """The C API's figure: --c-us, else attn-bench-cuda --case host's line (None: not run)."""
    if "--c-us" in sys.argv:
        return float(sys.argv[sys.argv.index("--c-us") + 1]), "given"
    path = sys.argv[sys.argv.index("--c-bench") + 1] if "--c-bench" in sys.argv else (
        os.path.join(ROOT, "build", "attn-bench-cuda") if dev == "cuda" else None)
    if not path or not os.path.exists(path):
        return None, "no attn-bench-cuda (make build/attn-bench-cuda)" if dev == "cuda" else "CPU: none"
    p = subprocess.run([path, "--case", "host"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    m = re.search(r"host time per forward \(C API.*?\): ([\d.]+) us", p.stdout)
    return (float(m.group(1)), "%s --case host" % os.path.relpath(path, ROOT)) if m else (None, "no figure in its output")


def stub_library(tmp):
    """A no-op C function of attn_layer_forward's arity, or None without a C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None
    src, lib = os.path.join(tmp, "stub.c"), os.path.join(tmp, "libstub.so")
    with open(src, "w") as f:
        f.write(STUB_C)
    if subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", lib]).returncode:
        return None
    return ctypes.CDLL(lib)


class Stubbed:
    """attn_layer_forward replaced by the stub in the library (Layer.forward's call) and in
    the given PreparedForward objects, for the duration of a with block."""

    def __init__(self, stub, prepared):
        self.stub, self.prepared = stub, prepared

    def __enter__(self):
        lib = attn_h.library()
        self.saved = [(lib, "attn_layer_forward", lib.attn_layer_forward)]
        f = self.stub.attn_stub
        f.restype, f.argtypes = lib.attn_layer_forward.restype, lib.attn_layer_forward.argtypes
        lib.attn_layer_forward = f
        for p in self.prepared:
            self.saved += [(p, "_call", p._call), (p, "_run", p._run)]
            p._call = self.stub._FuncPtr(("attn_stub", self.stub))   # one pointer, as attn_py_layer_forward
            p._call.restype = ctypes.c_int
            p._run = attn_h._prepared_run(p)   # the closure holds the call it makes
        return self

    def __exit__(self, *exc):
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)


def main():
    dev = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    c_us, c_from = c_api_us(dev)
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
    # the dispatcher's floor: the same schema, a Python kernel that does nothing
    floor = torch.library.Library("attn_h_overhead", "DEF")
    floor.define("noop(int layer, int meta, Tensor q, Tensor(a!) kv_cache, Tensor(b!) out, Tensor(c!)? lse=None, "
                 "Tensor? k=None, Tensor? v=None) -> ()")
    for key in ("CPU", "CUDA"):
        floor.impl("noop", lambda *a, **kw: None, key)
    noop = torch.ops.attn_h_overhead.noop
    rows = [("torch dispatcher alone (no-op op, same schema)", lambda: noop(lh, mh, q, cache, out), False),
            ("PreparedForward", lambda: p(q, cache, out), True),
            ("torch.ops.attn_h.forward", lambda: ops.forward(lh, mh, q, cache, out), True),
            ("torch.ops.attn_h.forward.default", lambda: ops.forward.default(lh, mh, q, cache, out), True),
            ("Layer.forward", lambda: layer.forward(meta, q, cache, out), True)]
    gc.collect()
    gc.freeze()   # as serving engines do after loading: no collection walks torch's objects mid-group
    with tempfile.TemporaryDirectory() as tmp:
        stub = stub_library(tmp)
        stubbed = {}
        if stub is not None:
            with Stubbed(stub, [p] + list(meta._op_prepared.values())):
                for name, fn, _ in rows:
                    stubbed[name] = per_call(fn, dev, n=2000) * 1e6
        print("torch %s, attn_h %s, %s; batch 1 decode x %d keys, %d/%d heads, head %d, bf16" % (
            torch.__version__, attn_h.__version__, torch.cuda.get_device_name() if dev == "cuda" else "cpu",
            C, H, HKV, D))
        print("| path | host us per forward | over the C API | Python side alone (C call stubbed) |")
        print("| --- | ---: | ---: | ---: |")
        print("| C API (%s) | %s | - | - |" % (c_from, "%.2f" % c_us if c_us is not None else "-"))
        for name, fn, calls in rows:
            us = per_call(fn, dev) * 1e6
            over = "%+.2f" % (us - c_us) if c_us is not None and calls else "-"
            py = "%.2f" % stubbed[name] if name in stubbed else ("no cc" if stub is None else "-")
            print("| %s | %.2f | %s | %s |" % (name, us, over, py))
    print("command: python3 %s" % " ".join(sys.argv))


if __name__ == "__main__":
    main()
