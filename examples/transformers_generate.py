"""transformers' continuous batching on attn.h (issue 24, section 4; issue 37: releases 5.17-5.25).

Registers attn.h as an attention function in transformers' AttentionInterface, under the name
its continuous batching runs (see continuous_batching_attention), and runs greedy
`generate_batch` (continuous batching) on a small model built from transformers' own modeling
code, seeded and randomly initialised (no downloads): --model llama (GQA) or --model
deepseek_v3 (MLA attention, MoE). The same prompts then run on a reference, and the script
prints both runs' tokens/s and whether their tokens agree. Where the tokens differ, it prints
the first divergence and how far apart the chosen tokens' log-probs were before it. The
reference:
- Llama: transformers' own paged sdpa ("paged|sdpa" in 5.17-5.18, "sdpa" from 5.19 on).
- DeepSeek-V3: "torch_ref". transformers 5.17-5.23 cannot run their own paged sdpa there (they
  size the paged cache by config.head_dim, the RoPE width), so this is torch's SDPA with its
  own pages, one request at a time, registered like attn.h. The test suite checks that it
  gives paged sdpa's tokens and log-probs on Llama. transformers' regular `generate` and,
  where it runs DeepSeek-V3 (5.25: a paged cache of latents), its own paged sdpa also run,
  for information.

Releases (transformers_support says which one is installed; older ones are refused at import):
- which names continuous batching runs: 5.17-5.18 any "paged|<name>" registered in
  AttentionInterface; from 5.19 only "paged|eager", "sdpa" and flash implementations, so attn.h
  takes "paged|eager"'s place while it runs (continuous_batching_attention says why that one);
- who writes transformers' cache: through 5.23 the attention function gets the step's new keys
  and values (and, with sdpa, writes the cache); from 5.24 the attention module writes the
  cache and hands the function every key of the step's requests, read back from it;
- the cache's layout: 5.17 numbers a layer's pages block * page_size + offset; from 5.18 one
  tensor holds every layer of a group, a block's rows 2 x layers x page_size apart.
So the functions read only what every release passes an attention function (cu_seq_lens_q/k,
read_index, write_index, the query, key and value tensors), never the cache object: attn.h's
block of a transformers block (page_size indices that share index // page_size) is the next
free one the first time the block is seen (PageMap).

How the function fits the engine. transformers' paged cache keeps K and V apart, while attn.h
keeps a block's K and V together ([blocks, 2, block_size, kv_heads, head]). So the function
keeps an attn.h cache of its own for every model layer. Each step it:
- writes the new tokens at the slots of transformers' `write_index`;
- takes each request's block table from `read_index` (the indices of its keys, in order);
- builds one attn.h schedule, shared by every layer of the step;
- runs attn_layer_forward.
Forked requests (parallel sampling copies a request's partial blocks in transformers' cache)
and CPU offloading (cpu_offload_space) move transformers' cache behind the attention function's
back: neither is mirrored (both are off here).

DeepSeek-V3 (MLA). transformers runs its attention over up-projected keys and values: q/k of
width qk_nope + rope and v of width v_head_dim, which is not what attn.h's MLA caches. So by
default (--mla latent) use_latent_mla points each DeepSeek-V3 attention module at attn.h's MLA
path while attn.h is the model's implementation. The module's own projections, norm and RoPE
still run; then the latent (kv_c, k_pe) goes into attn.h's latent cache, decodes run absorbed
and prefills up-projected with kv_b_proj's halves (attn_mla_forward, decode requests first).
With --mla padded, attn.h's standard layer takes transformers' up-projected keys and values
instead, V zero-padded to the q width and the output cropped. Either way, and for the torch
reference, without_transformers_cache keeps the modules from writing transformers' own cache
(5.24's attention module writes it itself and it cannot hold DeepSeek-V3's latents).

The engine runs with CUDA graphs off (ContinuousBatchingConfig(use_cuda_graph=False)): the
function reads the step's indices on the host to build attn.h's schedule. A graph-captured
step would need the schedule built before capture, which is not wired yet.

Scope: full-attention layers (no sliding window), one layer group, greedy requests.

usage: python3 examples/transformers_generate.py [--device cpu|cuda] [--model llama|deepseek_v3]
           [--prompts N] [--new-tokens N] [--dtype float32|bfloat16|float16] [--layers N] [--check]
  --check: exit 1 unless the tokens agree, or diverge only where the two runs' log-probs
           were within --tol of each other up to the divergence and within 2 tol there (a
           near-tie); --tol defaults to 1e-3 (f32), 3e-2 (f16), 0.125 (bf16): a logit of
           magnitude 16-32 has an ulp of 2^-3 in bf16 and 2^-6 in f16. A 16-bit run also
           runs the reference on the model in f32: the tolerance is raised to twice the
           reference's own largest log-prob error against f32 where that is larger (the
           model's rounding noise), and attn.h's RMS error against f32 must stay within
           1.5x the reference's (BENCHMARKS.md says what that catches)
"""
import argparse
import contextlib
import dataclasses
import os
import sys
import time

OLDEST = "5.17.0"           # the oldest release supported: the H200 machine's, and the first tested
NEWEST_TESTED = "5.25.0"    # tests/transformers_versions.sh runs the oldest and this one


class UnsupportedTransformers(ImportError):
    """transformers is missing, or older than OLDEST: raised at import with one line saying
    which version and the supported range (the script prints that line alone)."""


def release(version):
    """(major, minor, patch) of a version string ("5.26.0.dev0" -> (5, 26, 0)); no packaging
    module needed, so the check below runs before anything of transformers' is imported."""
    import re
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if m is None:
        raise ValueError("not a version: %r" % version)
    return tuple(int(x or 0) for x in m.groups())


def transformers_support(version=None):
    """(problem, note) for a transformers version string (the installed one by default):
    problem is '' where this example supports it, else one line naming the version and the
    supported range; note is '' or one line for a release newer than NEWEST_TESTED, which runs
    and fails at the first step that changed, naming it, rather than being refused here."""
    if version is None:
        import transformers
        version = transformers.__version__
    if release(version) < release(OLDEST):
        return ("transformers %s is not supported: this example needs %s or later (tested %s to %s)"
                % (version, OLDEST, OLDEST, NEWEST_TESTED)), ""
    if release(version)[:2] > release(NEWEST_TESTED)[:2]:
        return "", ("transformers %s is newer than the newest release tested here (%s to %s)"
                    % (version, OLDEST, NEWEST_TESTED))
    return "", ""


def _check_transformers():
    """The installed transformers' (major, minor, patch), or UnsupportedTransformers."""
    try:
        import transformers
    except ImportError as e:
        raise UnsupportedTransformers("transformers is not importable (%s): this example needs %s to %s"
                                      % (e, OLDEST, NEWEST_TESTED)) from None
    problem, note = transformers_support(transformers.__version__)
    if problem:
        raise UnsupportedTransformers(problem)
    if note:
        print("transformers_generate.py: note: %s" % note, file=sys.stderr)
    return release(transformers.__version__)


try:
    TRANSFORMERS_VERSION = _check_transformers()
    TRANSFORMERS = "%d.%d.%d" % TRANSFORMERS_VERSION
except UnsupportedTransformers as e:
    if __name__ == "__main__":
        sys.exit("transformers_generate.py: %s" % e)
    raise

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AttentionInterface  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import attn_h  # noqa: E402

# 5.17-5.18: continuous batching runs any "paged|<name>"; from 5.19 a fixed list (see below)
PAGED_NAMES_RUN = TRANSFORMERS_VERSION[:2] < (5, 19)
# transformers' own paged sdpa: "paged|sdpa" until 5.18; from 5.19 plain "sdpa" serves
# continuous batching too (5.20 on strips "paged|" from it, with a FutureWarning)
REFERENCE = "paged|sdpa" if PAGED_NAMES_RUN else "sdpa"


@contextlib.contextmanager
def continuous_batching_attention(fn, name):
    """Registers fn in transformers' AttentionInterface (its public registration) under the name
    continuous batching runs, and yields that name, the attn_implementation to set.
    - 5.17-5.18: "paged|<name>" (continuous batching runs any paged| implementation).
    - 5.19 on: switch_to_cb_friendly_attn accepts only "paged|eager", "sdpa" and names with
      "flash" in them (and 5.20 on strips "paged|" from any other name, so "paged|attn_h" is
      then "not supported"). Of those, fn takes "paged|eager": it serves continuous batching
      only, while "sdpa" also serves every plain forward and is the reference here, and a
      flash name makes transformers import flash kernels for it. transformers' own paged|eager
      comes back on exit.
    The function's kwargs are the same for either name."""
    if PAGED_NAMES_RUN:
        impl = "paged|" + name
        AttentionInterface.register(impl, fn)
        yield impl
        return
    impl = "paged|eager"
    own = AttentionInterface()[impl]
    AttentionInterface.register(impl, fn)
    try:
        yield impl
    finally:
        AttentionInterface.register(impl, own)


def runs_on(module, fn):
    """Whether the model of `module` runs fn as its attention function now."""
    impl = module.config._attn_implementation
    return impl is not None and AttentionInterface().get(impl) is fn


class PageMap:
    """transformers' cache index of a token -> its slot in a cache of ours: block * block_size +
    offset, the block being the next free one the first time a transformers block (block_size
    indices that share index // block_size) is seen. transformers numbers its indices by its own
    layout (5.18 on: a group's layers share one tensor, so a block's rows are strided by twice
    the layer count), and a request's keys may be anywhere in it; our caches then hold as many
    blocks as transformers has handed out, whatever its numbering."""

    def __init__(self, block_size):
        self.block_size = block_size
        self.block_of = np.full(0, -1, dtype=np.int64)   # transformers block -> ours (-1: not seen)
        self.num_blocks = 0     # blocks handed out
        self.capacity = 0       # blocks our caches are sized for (grown by doubling)

    def blocks(self, index):
        """Our block of each transformers index (int64 array), new blocks handed out."""
        key = index // self.block_size
        if key.size and key.max() >= self.block_of.size:
            grown = np.full(max(2 * self.block_of.size, int(key.max()) + 1), -1, dtype=np.int64)
            grown[: self.block_of.size] = self.block_of
            self.block_of = grown
        new = np.unique(key[self.block_of[key] < 0])
        self.block_of[new] = np.arange(self.num_blocks, self.num_blocks + new.size)
        self.num_blocks += new.size
        if self.num_blocks > self.capacity:
            self.capacity = max(64, 2 * self.num_blocks)
        return self.block_of[key]

    def slots(self, index):
        return self.blocks(index) * self.block_size + index % self.block_size


class Step:
    """One engine step as the attention functions read it from continuous batching's kwargs
    (the same names in every release 5.17-5.25), on the host, with transformers' indices mapped
    to our slots (PageMap): n requests (trailing requests with no query tokens are the engine's
    padding for static shapes and are dropped), cq/ck their query and key offsets, `tokens` the
    real query tokens, write_slots [tokens], read_slots [ck[n]] (each request's keys in order),
    table [max(n, 1), stride] our block table, capacity the blocks our caches need."""

    def __init__(self, cu_q, cu_k, write_index, read_index, pages, who):
        cq, ck, w, r = (t.detach().to("cpu", torch.int64).numpy() for t in (cu_q, cu_k, write_index, read_index))
        n = len(cq) - 1
        while n > 0 and cq[n] == cq[n - 1]:
            n -= 1
        cq, ck = cq[: n + 1], ck[: n + 1]
        qlen, slen = np.diff(cq), np.diff(ck)
        tokens = int(cq[n])
        if w.size < tokens:
            raise RuntimeError("%s: write_index holds %d indices for %d new tokens" % (who, w.size, tokens))
        if r.size == 0:               # no cached keys anywhere: a request's keys are its new tokens
            if not np.array_equal(qlen, slen):
                raise RuntimeError("%s: no read_index but the key lengths are not the query lengths" % who)
            r, ck = w[:tokens], cq
        if r.size < ck[n]:
            raise RuntimeError("%s: read_index holds %d indices for %d keys" % (who, r.size, ck[n]))
        bs = pages.block_size
        for i in range(n):
            idx = r[ck[i]:ck[i + 1]]
            pos = np.arange(slen[i])
            # our caches find key j at block_table[j / block_size], offset j % block_size
            if np.any(idx % bs != pos % bs) or np.any(idx // bs != idx[pos - pos % bs] // bs):
                raise RuntimeError("%s: request %d's keys are not whole blocks of %d in key order (is the engine's "
                                   "page size %d?)" % (who, i, bs, bs))
        self.n, self.cq, self.ck, self.qlen, self.slen, self.tokens = n, cq, ck, qlen, slen, tokens
        self.write_slots = pages.slots(w[:tokens])
        self.read_slots = pages.slots(r[: ck[n]])
        self.stride = max(1, int(((slen + bs - 1) // bs).max())) if n else 1
        self.table = np.zeros((max(n, 1), self.stride), dtype=np.int32)
        for i in range(n):
            self.table[i, : (slen[i] + bs - 1) // bs] = self.read_slots[ck[i]:ck[i + 1]:bs] // bs
        self.capacity = pages.capacity
        self._new_rows = {}

    def new_tokens(self, x, query, who):
        """The step's new tokens of a key or value tensor the engine passed [1, kv_heads, rows,
        head], as [tokens, kv_heads, head]: through 5.23 (and from 5.24 when nothing is read
        back) its rows are the step's new tokens, as the query's; from 5.24 otherwise every key
        of each request read back from transformers' cache, a request's new tokens last."""
        rows = x.shape[2]
        if rows == query.shape[2]:
            return x[0, :, : self.tokens].transpose(0, 1)
        if rows == self.ck[self.n]:
            sel = self._new_rows.get(x.device)
            if sel is None:
                sel = np.concatenate([np.arange(self.ck[i + 1] - self.qlen[i], self.ck[i + 1]) for i in range(self.n)]
                                     or [np.zeros(0, dtype=np.int64)])
                sel = self._new_rows[x.device] = torch.from_numpy(sel).to(x.device)
            return x[0].index_select(1, sel).transpose(0, 1)
        raise RuntimeError("%s: the engine passed %d key rows, neither the step's %d query rows nor its %d keys "
                           "(transformers %s)" % (who, rows, query.shape[2], self.ck[self.n], TRANSFORMERS))


class StepReader:
    """The current Step, read once per step: every layer of a step gets the same index tensors,
    so the step is read again only when one of them is another tensor or was written since (its
    storage, shape and version counter)."""

    def __init__(self, block_size, who):
        self.pages = PageMap(block_size)
        self.who = who
        self.key = None
        self.step = None

    def read(self, module, kwargs):
        if kwargs.get("write_index") is None or kwargs.get("cu_seq_lens_q") is None:
            raise ValueError("%s: called without continuous batching's step arguments (write_index, read_index, "
                             "cu_seq_lens_q/k); it serves continuous batching only (use sdpa for a plain forward)"
                             % self.who)
        if getattr(module, "sliding_window", None):
            raise NotImplementedError("%s: sliding-window layers are not wired yet (full attention only)" % self.who)
        if kwargs.get("block_table") is not None:
            raise NotImplementedError("%s: the engine's block-table decode path (flash only)" % self.who)
        w, r = kwargs["write_index"], kwargs["read_index"]
        if len(w) != 1 or len(r) != 1:
            raise NotImplementedError("%s: %d layer groups (one a kind of attention: full, sliding); only models "
                                      "of one group are wired" % (self.who, len(w)))
        cu_k = kwargs["cu_seq_lens_k"]
        if isinstance(cu_k, dict):    # one entry a layer type until the cache picks this layer's (5.20 on)
            if len(cu_k) != 1:
                raise NotImplementedError("%s: key offsets for several layer types %s" % (self.who, sorted(cu_k)))
            cu_k = next(iter(cu_k.values()))
        ins = (kwargs["cu_seq_lens_q"], cu_k, w[0], r[0])
        key = tuple((t.data_ptr(), tuple(t.shape), t._version) for t in ins)
        if key != self.key:
            self.step = Step(*ins, self.pages, self.who)
            self.key = key
        return self.step


class AttnHPaged:
    """attn.h as transformers' attention function under continuous batching (transformers calls
    it as fn(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs) with
    query [1, heads, rows, head], key/value [1, kv_heads, rows', head] (Step.new_tokens says
    which rows) and kwargs cu_seq_lens_q, cu_seq_lens_k, read_index, write_index). block_size:
    the engine's page size (ContinuousBatchingConfig's page_size, block_size in 5.17)."""

    def __init__(self, ctx: "attn_h.Context", block_size: int):
        self.ctx = ctx
        self.block_size = block_size
        self.steps = StepReader(block_size, "attn_h")
        self.layers = {}       # the Layer arguments (as a sorted tuple) -> attn_h.Layer
        self.caches = {}       # model layer index -> attn.h cache tensor
        self.metas = {}        # id(attn_h.Layer) -> [Metadata, the Step it was built from, decodes first, rows]
        self.weights = {}      # DeepSeek-V3 module -> (its kv_b_proj weight's version, W_UK, W_UV)
        self.calls = 0

    def _layer(self, like, module, **args):
        """The attn_h.Layer of these arguments (one for every model layer of the same shape),
        of `like`'s dtype and device and the module's scale."""
        args.update(block_size=self.block_size, dtype=like.dtype, device=like.device.type,
                    scale=float(module.scaling))
        key = tuple(sorted((k, str(v)) for k, v in args.items()))
        layer = self.layers.get(key)
        if layer is None:
            layer = self.layers[key] = attn_h.Layer(self.ctx, **args)
        return layer

    def _schedule(self, layer, step, device, decodes_first=False):
        """The attn.h schedule of this step for `layer` and the token order it runs in: None, or
        with decodes_first (the MLA calls take the decode requests first) rows[new] = old. Built
        once a step for every layer of the same shape."""
        entry = self.metas.get(id(layer))
        if entry is not None and entry[1] is step and entry[2] == decodes_first:
            return entry[0], entry[3]
        n, tokens = step.n, step.tokens
        cq, qlen, slen, table, slots = step.cq, step.qlen, step.slen, step.table, step.write_slots
        rows = None
        if decodes_first and n:
            perm, _ = attn_h.reorder_batch(qlen.astype(np.int32))
            if not np.array_equal(perm, np.arange(n)):
                rows = np.concatenate([np.arange(cq[p], cq[p + 1]) for p in perm])
                qlen, slen, table = qlen[perm], slen[perm], table[perm]
                cq = np.concatenate([[0], np.cumsum(qlen)])
                slots = slots[rows]
        meta = entry[0] if entry is not None else None
        cap = meta.capacity if meta is not None else None
        if (cap is None or cap["max_num_reqs"] < max(n, 1) or cap["max_num_tokens"] < max(tokens, 1)
                or cap["max_blocks_per_req"] < step.stride or cap["num_blocks"] != step.capacity):
            if meta is not None:
                meta.close()
            meta = attn_h.Metadata(layer, max_num_reqs=max(2 * n, 8), max_num_tokens=max(2 * tokens, 64),
                                   max_blocks_per_req=max(2 * step.stride, 8), num_blocks=step.capacity)
        meta.build(cq.astype(np.int32), slen.astype(np.int32), table, slots.astype(np.int64))
        rows_t = None if rows is None else torch.from_numpy(rows).to(device)
        self.metas[id(layer)] = [meta, step, decodes_first, rows_t]
        return meta, rows_t

    def _cache(self, module, layer, num_blocks, like):
        """This model layer's attn.h cache of num_blocks blocks: grown (its blocks kept) when the
        engine has handed out more blocks than it holds, new for another dtype or device."""
        kv = self.caches.get(module.layer_idx)
        shape = tuple(layer.kv_cache_shape(num_blocks))
        if kv is not None and tuple(kv.shape) == shape and kv.device == like.device and kv.dtype == like.dtype:
            return kv
        new = torch.zeros(shape, dtype=like.dtype, device=like.device)
        if kv is not None and kv.device == like.device and kv.dtype == like.dtype and kv.shape[1:] == new.shape[1:] \
                and kv.shape[0] <= new.shape[0]:
            new[: kv.shape[0]] = kv
        self.caches[module.layer_idx] = new
        return new

    def mla(self, module, q_nope, q_pe, kv_c, k_pe, kwargs):
        """DeepSeek-V3's attention on attn.h's MLA path: the latent (kv_c, k_pe after its
        norm and RoPE) cached as [blocks, block_size, kv_lora_rank + rope], decodes absorbed,
        prefills up-projected with kv_b_proj's halves. q_nope/q_pe [rows, heads, ..] and kv_c,
        k_pe [rows, ..] of the step's new tokens; returns [rows, heads, v_head_dim]."""
        step = self.steps.read(module, kwargs)
        heads, nope, rope = q_nope.shape[1], q_nope.shape[2], q_pe.shape[2]
        rank, vdim = kv_c.shape[-1], module.v_head_dim
        layer = self._layer(q_nope, module, num_heads=heads,
                            mla=dict(kv_lora_rank=rank, qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=vdim))
        wt = module.kv_b_proj.weight
        got = self.weights.get(module)
        if got is None or got[0] != (wt.data_ptr(), wt._version, wt.dtype):
            wv = wt.detach().view(heads, nope + vdim, rank)
            got = ((wt.data_ptr(), wt._version, wt.dtype), wv[:, :nope].contiguous(),
                   wv[:, nope:].transpose(1, 2).contiguous())
            self.weights[module] = got
        meta, rows = self._schedule(layer, step, q_nope.device, decodes_first=True)
        kv = self._cache(module, layer, step.capacity, q_nope)
        tokens = step.tokens
        if rows is not None:
            q_nope, q_pe, kv_c, k_pe = q_nope[rows], q_pe[rows], kv_c[rows], k_pe[rows]
        out = torch.zeros(q_nope.shape[0], heads, vdim, dtype=q_nope.dtype, device=q_nope.device)
        layer.mla_forward(meta, q_nope.contiguous(), q_pe.contiguous(), kv, got[1], got[2], out=out,
                          kv_c=kv_c[:tokens].contiguous(), k_pe=k_pe[:tokens].contiguous())
        self.calls += 1
        if rows is None:
            return out
        full = torch.zeros_like(out)
        full[rows] = out
        return full

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        step = self.steps.read(module, kwargs)
        layer = self._layer(query, module, num_heads=query.shape[1], num_kv_heads=key.shape[1],
                            head_size=query.shape[3])
        meta, _ = self._schedule(layer, step, query.device)
        kv = self._cache(module, layer, step.capacity, query)
        tokens = step.tokens
        q = query[0, :, :tokens].transpose(0, 1).contiguous()           # [tokens, heads, head]
        k = step.new_tokens(key, query, "attn_h").contiguous()
        v = step.new_tokens(value, query, "attn_h")
        dv = v.shape[-1]
        if dv != q.shape[-1]:   # DeepSeek-V3's up-projected V is narrower than q/k: zeros to the width
            v = torch.nn.functional.pad(v, (0, q.shape[-1] - dv))
        v = v.contiguous()
        out = torch.zeros(query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype,
                          device=query.device)                          # padding rows stay 0
        layer.forward(meta, q, kv, out=out[:tokens], k=k, v=v)
        self.calls += 1
        return out[..., :dv].unsqueeze(0), None            # [1, rows, heads, v head], no weights


class TorchPagedReference:
    """"torch_ref": the reference for models transformers' continuous batching cannot run on
    its own paged sdpa (5.17-5.23 size the paged cache by config.head_dim, which is DeepSeek-V3's
    RoPE width). It reads the step as AttnHPaged does (Step), keeps K and V pages of its own at
    the same slots, and attends with torch's scaled_dot_product_attention one request at a time,
    causal from the end: query t of Lq sees keys 0 .. L - Lq + t."""

    def __init__(self, block_size: int):
        self.steps = StepReader(block_size, "torch_ref")
        self.pages = {}

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        step = self.steps.read(module, kwargs)
        k = step.new_tokens(key, query, "torch_ref")
        v = step.new_tokens(value, query, "torch_ref")
        num_slots = step.capacity * self.steps.pages.block_size
        kp, vp = self.pages.get(module.layer_idx, (None, None))
        if kp is None or kp.shape[1:] != k.shape[1:] or vp.shape[1:] != v.shape[1:] or kp.shape[0] != num_slots \
                or kp.dtype != k.dtype or kp.device != k.device:
            kp2 = torch.zeros((num_slots,) + tuple(k.shape[1:]), dtype=k.dtype, device=k.device)
            vp2 = torch.zeros((num_slots,) + tuple(v.shape[1:]), dtype=v.dtype, device=v.device)
            if kp is not None and kp.shape[1:] == k.shape[1:] and vp.shape[1:] == v.shape[1:] and \
                    kp.dtype == k.dtype and kp.device == k.device and kp.shape[0] <= num_slots:
                kp2[: kp.shape[0]], vp2[: vp.shape[0]] = kp, vp     # the engine handed out more blocks
            kp, vp = self.pages[module.layer_idx] = (kp2, vp2)
        w = torch.from_numpy(step.write_slots).to(k.device)
        kp.index_copy_(0, w, k)
        vp.index_copy_(0, w, v)
        out = torch.zeros(query.shape[2], query.shape[1], v.shape[-1], dtype=query.dtype, device=query.device)
        rep = query.shape[1] // k.shape[1]
        for i in range(step.n):
            q0, q1, k0, k1 = (int(x) for x in (step.cq[i], step.cq[i + 1], step.ck[i], step.ck[i + 1]))
            if q1 == q0:
                continue
            pages = torch.from_numpy(step.read_slots[k0:k1]).to(k.device)
            ki = kp[pages].transpose(0, 1).repeat_interleave(rep, dim=0)   # [heads, L, d]
            vi = vp[pages].transpose(0, 1).repeat_interleave(rep, dim=0)
            lq, lk = q1 - q0, k1 - k0
            at = torch.arange(max(lq, lk), device=query.device)
            mask = at[None, :lk] <= (lk - lq + at[:lq])[:, None]
            o = torch.nn.functional.scaled_dot_product_attention(query[0][:, q0:q1], ki, vi, attn_mask=mask,
                                                                 scale=float(module.scaling))
            out[q0:q1] = o.transpose(0, 1)
        return out.unsqueeze(0), None


def _random_model(cls, cfg, dtype, device, seed):
    """cls(cfg) built under `seed`, its matrices redrawn N(0, 0.08): a wider spread than the
    default init, whose near-flat logits let any rounding pick another argmax."""
    torch.manual_seed(seed)
    model = cls(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    return model.to(device=device, dtype=dtype).eval()


def tiny_llama(layers, dtype, device, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    return _random_model(LlamaForCausalLM, cfg, dtype, device, seed)


def tiny_deepseek_v3(layers, dtype, device, seed=0):
    """DeepSeek-V3's architecture at its MLA widths (latent 512 + 64 RoPE, q/k 128 + 64, v 128;
    MoE past the first layer), small otherwise (8 heads, hidden 512). Every token takes all 4
    routed experts (weighted by the router, with the shared one): a top-k choice among them
    is a discrete step that bf16 rounding anywhere flips, and one flip moves a log-prob by
    0.5-1 (device run 29: with top-2, attn.h's MLA and its standard layer both agreed with
    the reference's tokens but not its log-probs; attn.h stayed as close to the f32 model). transformers runs its
    attention over the up-projected keys and values: an attention function gets q/k [.., 192]
    and v [.., 128] for every head (use_latent_mla hands attn.h the latent instead)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    cfg = DeepseekV3Config(vocab_size=1024, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                           num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                           n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=4, first_k_dense_replace=1,
                           n_group=1, topk_group=1, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                           qk_nope_head_dim=128, v_head_dim=128, max_position_embeddings=4096, rope_scaling=None,
                           tie_word_embeddings=False)
    return _random_model(DeepseekV3ForCausalLM, cfg, dtype, device, seed)


def use_latent_mla(model, fn):
    """Routes the model's DeepSeek-V3 attention modules to attn.h's MLA path (fn.mla) while fn is
    the model's attention function under continuous batching; otherwise (other
    implementations, a plain forward) the module's own forward runs. The projections, norms
    and RoPE are the module's, step by step as its forward does them: what changes is that the
    latent, not the up-projected keys and values, reaches the attention (and transformers' own
    cache is not written: from 5.24 the module's forward writes it)."""
    import types
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as md

    # the cache argument is past_key_values through 5.23 and cache from 5.24: both pass through
    def forward(mod, hidden_states, position_embeddings=None, attention_mask=None, *args, **kwargs):
        if args or not runs_on(mod, fn) or kwargs.get("write_index") is None:
            return type(mod).forward(mod, hidden_states, position_embeddings, attention_mask, *args, **kwargs)
        b, t = hidden_states.shape[:-1]
        if b != 1:
            raise ValueError("attn_h: continuous batching packs the batch into one row; got %d" % b)
        if mod.q_lora_rank is None:
            q = mod.q_proj(hidden_states)
        else:
            q = mod.q_b_proj(mod.q_a_layernorm(mod.q_a_proj(hidden_states)))
        q = q.view(b, t, -1, mod.qk_head_dim).transpose(1, 2)
        q_nope, q_rot = torch.split(q, [mod.qk_nope_head_dim, mod.qk_rope_head_dim], dim=-1)
        kv_c, k_rot = torch.split(mod.kv_a_proj_with_mqa(hidden_states), [mod.kv_lora_rank, mod.qk_rope_head_dim],
                                  dim=-1)
        kv_c = mod.kv_a_layernorm(kv_c)
        k_rot = k_rot.view(b, 1, t, mod.qk_rope_head_dim)
        cos, sin = position_embeddings
        rope = md.apply_rotary_pos_emb_interleave if mod.config.rope_interleave else md.apply_rotary_pos_emb
        q_rot, k_rot = rope(q_rot, k_rot, cos, sin)
        out = fn.mla(mod, q_nope[0].transpose(0, 1), q_rot[0].transpose(0, 1), kv_c[0], k_rot[0, 0], kwargs)
        return mod.o_proj(out.reshape(b, t, -1)), None

    n = 0
    for m in model.modules():
        if isinstance(m, md.DeepseekV3Attention):
            m.forward = types.MethodType(forward, m)
            n += 1
    return n


def without_transformers_cache(model, *fns):
    """While one of fns is the model's attention function under continuous batching, the
    model's attention modules run with no cache argument, so transformers' paged cache is
    neither written nor read back: fns keep caches of their own and get the step's new keys and
    values. DeepSeek-V3 needs it on 5.24, where the attention module writes the cache itself and
    the cache cannot hold the model's latents (5.25's can; 5.17-5.23 leave the write to the
    attention function); elsewhere it saves the copy. (Llama runs without it: attn.h then reads
    what every release hands a registered function.)"""
    def wrap(mod):
        inner = mod.forward       # the module's own, or use_latent_mla's

        def forward(*args, **kwargs):
            if kwargs.get("write_index") is not None and any(runs_on(mod, f) for f in fns):
                for name in ("cache", "past_key_values"):    # past_key_values through 5.23, cache from 5.24
                    if name in kwargs:
                        kwargs[name] = None
            return inner(*args, **kwargs)
        mod.forward = forward

    for layer in model.model.layers:
        wrap(layer.self_attn)
    return len(model.model.layers)


def generate_plain(model, inputs, new_tokens):
    """transformers' regular generate (sdpa, its dynamic cache), one prompt at a time: the
    reference where its continuous batching cannot run the model's own paged|sdpa (5.17 sizes
    the paged cache by config.head_dim, DeepSeek-V3's RoPE width)."""
    from transformers import GenerationConfig
    model.set_attn_implementation("sdpa")
    gen = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                           pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    rows, ntok = [], 0
    t0 = time.perf_counter()
    for p in inputs:
        ids = torch.tensor([p], device=model.device)
        with torch.no_grad():
            r = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
        toks = r.sequences[0, len(p):].tolist()
        logprobs = [float(torch.log_softmax(sc[0].float(), -1)[t]) for sc, t in zip(r.scores, toks)]
        rows.append((toks, logprobs))
        ntok += len(toks)
    dt = time.perf_counter() - t0
    return rows, ntok / dt, dt


def prompts(n, seed=1):
    g = np.random.default_rng(seed)
    lens = g.integers(4, 160, size=n)
    return [g.integers(3, 1000, size=int(L)).tolist() for L in lens]


def continuous_batching_config(block_size):
    """The engine's configuration: pages of block_size tokens (page_size from 5.18, block_size
    in 5.17), 512 of them, CUDA graphs off (see the top), log-probs returned, and no switch to a
    flash implementation (5.20 on would otherwise trade sdpa for flash where one is installed)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    args = dict(num_blocks=512, max_batch_tokens=512, use_cuda_graph=False, return_logprobs=True)
    args["page_size" if "page_size" in fields else "block_size"] = block_size
    if "auto_switch_to_flash" in fields:
        args["auto_switch_to_flash"] = False
    missing = sorted(set(args) - fields)
    if missing:
        raise RuntimeError("transformers %s: ContinuousBatchingConfig has no %s (tested %s to %s)"
                           % (TRANSFORMERS, ", ".join(missing), OLDEST, NEWEST_TESTED))
    return ContinuousBatchingConfig(**args)


def generate(model, implementation, inputs, new_tokens, block_size):
    """Greedy generate_batch of `inputs` on `implementation`: ([(tokens, log-probs)] in prompt
    order, tokens/s, seconds)."""
    from transformers import GenerationConfig
    model.set_attn_implementation(implementation)
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = continuous_batching_config(block_size)
    t0 = time.perf_counter()
    try:
        out = model.generate_batch(inputs=inputs, generation_config=gen, continuous_batching_config=cb,
                                   progress_bar=False)
    except ValueError as e:   # the engine refused the implementation (a release newer than tested)
        if "not supported" not in str(e):
            raise
        raise RuntimeError("transformers %s's continuous batching refuses %r (tested %s to %s): %s"
                           % (TRANSFORMERS, implementation, OLDEST, NEWEST_TESTED, e)) from e
    dt = time.perf_counter() - t0
    by_prompt = {}
    for r in out.values():
        if r.error:
            raise RuntimeError("%s: request %s failed: %s" % (implementation, r.request_id, r.error))
        by_prompt[tuple(r.prompt_ids)] = (list(r.generated_tokens), list(r.logprobs))
    rows = [by_prompt[tuple(p)] for p in inputs]
    ntok = sum(len(t) for t, _ in rows)
    return rows, ntok / dt, dt


def f32_error(ours, ref, f32):
    """Each 16-bit run's log-prob error against the f32 model's, over the new tokens of each
    prompt before the first place where either 16-bit run chose a token other than f32's (the
    same positions for both): {"n": count, "rms": (attn.h, reference), "max": (.., ..)}."""
    d = ([], [])
    for (t1, l1), (t2, l2), (t32, l32) in zip(ours, ref, f32):
        for j in range(min(len(t1), len(t2), len(t32), len(l1), len(l2), len(l32))):
            if t1[j] != t32[j] or t2[j] != t32[j]:
                break
            d[0].append(l1[j] - l32[j])
            d[1].append(l2[j] - l32[j])
    rms = tuple(float(np.sqrt(np.mean(np.square(x)))) if x else 0.0 for x in d)
    mx = tuple(float(np.max(np.abs(x))) if x else 0.0 for x in d)
    return {"n": len(d[0]), "rms": rms, "max": mx}


def compare(ours, ref, tol):
    """(agree, report lines): per prompt, the first divergence and the log-prob gap before it."""
    lines, ok = [], True
    for i, ((t1, l1), (t2, l2)) in enumerate(zip(ours, ref)):
        n = min(len(t1), len(t2))
        first = next((j for j in range(n) if t1[j] != t2[j]), None)
        upto = n if first is None else first
        gap = max((abs(a - b) for a, b in zip(l1[:upto], l2[:upto])), default=0.0) if l1 and l2 else 0.0
        if first is None and len(t1) == len(t2):
            if gap > tol:
                ok = False
                lines.append("prompt %d: tokens equal, log-prob gap %.2e over %g" % (i, gap, tol))
            continue
        near_tie = bool(l1 and l2 and first is not None and first < len(l1) and first < len(l2)
                        and abs(l1[first] - l2[first]) <= 2 * tol)
        ok = ok and gap <= tol and near_tie
        lines.append("prompt %d: first divergence at new token %d of %d (log-prob gap before it %.2e; at it "
                     "%s)" % (i, upto, n, gap, "a near-tie" if near_tie else "NOT a near-tie"))
    return ok, lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="llama", choices=["llama", "deepseek_v3"])
    ap.add_argument("--mla", default="latent", choices=["latent", "padded"],
                    help="deepseek_v3: attn.h's MLA path over the cached latent (default), or its standard "
                         "layer over transformers' up-projected keys and values, V zero-padded")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) | bfloat16 (CUDA default) | float16")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--tol", type=float, default=None,
                    help="log-prob agreement (default: 1e-3 f32, 3e-2 f16, 0.125 bf16)")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    import transformers
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if a.device == "cuda" else torch.float32)
    # a logit of magnitude 16-32 has an ulp of 2^-3 in bf16 and 2^-6 in f16: one ulp there moves a
    # log-prob by that much
    tol = a.tol if a.tol is not None else {torch.float32: 1e-3, torch.float16: 3e-2}.get(dtype, 1.25e-1)
    ctx = attn_h.Context(log_level="warn")
    fn = AttnHPaged(ctx, a.block_size)
    model = (tiny_llama if a.model == "llama" else tiny_deepseek_v3)(a.layers, dtype, a.device)
    torch_ref = TorchPagedReference(a.block_size)
    if a.model == "deepseek_v3":
        if a.mla == "latent":
            use_latent_mla(model, fn)
        without_transformers_cache(model, fn, torch_ref)
    inputs = prompts(a.prompts)
    with continuous_batching_attention(fn, "attn_h") as impl:
        generate(model, impl, inputs[:2], 2, a.block_size)   # one-time costs off the clock
        ours, tps_ours, dt_ours = generate(model, impl, inputs, a.new_tokens, a.block_size)
    if a.model == "llama":
        ref_name = "%s (transformers' continuous batching)" % REFERENCE
        registered = contextlib.nullcontext(REFERENCE)
    else:   # transformers' CB cannot run this model on its paged sdpa before 5.24: the torch reference in
        # CB; beside it transformers' regular generate and, where it runs, its own paged sdpa in CB
        # (their tokens compared, for information)
        registered = continuous_batching_attention(torch_ref, "torch_ref")
        generate_plain(model, inputs[:1], 2)
        plain, tps_plain, dt_plain = generate_plain(model, inputs, a.new_tokens)
        try:
            own = generate(model, REFERENCE, inputs, a.new_tokens, a.block_size)
        except RuntimeError as e:   # 5.17-5.23: its cache is sized by the RoPE width
            own = str(e).split("\n")[0]
    f32 = None
    with registered as ref_impl:
        if a.model != "llama":
            ref_name = "torch_ref as %s (torch SDPA per request, in transformers' continuous batching)" % ref_impl
        generate(model, ref_impl, inputs[:2], 2, a.block_size)
        ref, tps_ref, dt_ref = generate(model, ref_impl, inputs, a.new_tokens, a.block_size)
        if dtype != torch.float32:
            # the same model in f32 (the reference implementation there): how far bf16/f16 rounding
            # alone moves this model's log-probs, and which 16-bit run stays closer to f32
            f32, _, _ = generate(model.to(torch.float32), ref_impl, inputs, a.new_tokens, a.block_size)
            model.to(dtype)
    backend = next(iter(fn.layers.values())).selection["resolved"] if fn.layers else "none"
    arch = ("Llama-architecture, 8/2 heads, head 64" if a.model == "llama" else
            "DeepSeek-V3-architecture (MLA: latent 512 + 64 RoPE, q/k 128 + 64, v 128, 8 heads; MoE; attn.h %s)"
            % ("MLA over the cached latent" if a.mla == "latent" else "standard layer, V padded"))
    print("transformers %s, torch %s, attn_h %s; %s, %d layers, %s, %s; %d prompts of %d-%d tokens, %d new "
          "tokens each (greedy)"
          % (transformers.__version__, torch.__version__, attn_h.__version__, arch, a.layers,
             str(dtype).split(".")[-1], a.device, len(inputs), min(map(len, inputs)), max(map(len, inputs)),
             a.new_tokens))
    print("| implementation | tokens/s | seconds |")
    print("| --- | ---: | ---: |")
    print("| attn_h as %s (attn.h %s) | %.1f | %.2f |" % (impl, backend, tps_ours, dt_ours))
    print("| %s | %.1f | %.2f |" % (ref_name, tps_ref, dt_ref))
    if a.model != "llama":
        print("| sdpa (transformers' generate, one prompt at a time) | %.1f | %.2f |" % (tps_plain, dt_plain))
        same_plain = sum(1 for (t1, _), (t2, _) in zip(ours, plain) if t1 == t2)
        print("tokens equal to transformers' generate for %d of %d prompts (its log-probs differ from "
              "continuous batching's by itself too: information, not checked)" % (same_plain, len(inputs)))
        if isinstance(own, str):
            print("transformers' own %s cannot run this model in continuous batching here: %s"
                  % (REFERENCE, own[:160]))
        else:
            agree, _ = compare(ours, own[0], tol)
            print("| %s (transformers' continuous batching, its own MLA cache) | %.1f | %.2f |"
                  % (REFERENCE, own[1], own[2]))
            print("tokens equal to transformers' own %s for %d of %d prompts, %s within the tolerance (information, "
                  "not checked)" % (REFERENCE, sum(1 for (t1, _), (t2, _) in zip(ours, own[0]) if t1 == t2),
                                    len(inputs), "all" if agree else "NOT all"))
    err = None
    if f32 is not None:
        err = f32_error(ours, ref, f32)
        if err["n"] >= 32 and 2 * err["max"][1] > tol:
            # two runs each within e of the f32 log-probs are within 2 e of each other
            print("tolerance %g raised to %.3g: twice the reference's own largest log-prob error against the f32 "
                  "model (%s rounding through %d layers)" % (tol, 2 * err["max"][1], str(dtype).split(".")[-1],
                                                              a.layers))
            tol = 2 * err["max"][1]
    ok, lines = compare(ours, ref, tol)
    same = sum(1 for (t1, _), (t2, _) in zip(ours, ref) if t1 == t2)
    print("tokens equal for %d of %d prompts; attn.h calls: %d" % (same, len(inputs), fn.calls))
    for line in lines:
        print("  " + line)
    if fn.calls == 0:
        ok = False
        print("attn.h was never called")
    if err is not None:
        lead = [sum(next((j for j, (x, y) in enumerate(zip(t, t32)) if x != y), len(t32)) for (t, _), (t32, _)
                    in zip(run, f32)) for run in (ours, ref)]
        print("against the f32 model: new tokens before the first difference, summed over the prompts: "
              "attn.h %d, reference %d (of %d)" % (lead[0], lead[1], sum(len(t) for t, _ in f32)))
        print("against the f32 model, over the %d new tokens where both 16-bit runs still chose its tokens: "
              "log-prob error RMS attn.h %.2e, reference %.2e; max %.2e, %.2e"
              % (err["n"], err["rms"][0], err["rms"][1], err["max"][0], err["max"][1]))
        if err["n"] >= 32 and err["rms"][0] > 1.5 * err["rms"][1] + 1e-3:
            ok = False
            print("attn.h's 16-bit run is further from the f32 model than the reference's (RMS over 1.5x)")
    print("result: %s" % ("agree" if ok else "DISAGREE"))
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
