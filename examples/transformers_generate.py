"""transformers' continuous batching on attn.h (issue 24, section 4).

Registers attn.h as the attention implementation "paged|attn_h" in transformers'
AttentionInterface and runs greedy `generate_batch` on a small Llama-architecture model
(GQA) built from transformers' own modeling code with a seeded random initialisation (no
downloads). The same prompts are then generated with transformers' own "paged|sdpa". The
script prints the tokens/s of each and whether the tokens agree. Where they differ, it prints
the first divergence and how far apart the chosen tokens' log-probabilities were before it.

How the function fits the engine. transformers' paged cache keeps K and V as two tensors a
layer ([pages, kv_heads, head], page = block * block_size + offset), while attn.h keeps a
block's K and V together ([blocks, 2, block_size, kv_heads, head]). So the function keeps an
attn.h cache of its own for every model layer, with the same page numbering, plus the two
trash blocks transformers writes padding to. Each step it:
- writes the new tokens at transformers' `write_index`;
- takes each request's block table from `read_index` (the pages of its keys, in order);
- builds one attn.h schedule, shared by every layer of the step;
- runs attn_layer_forward.
transformers' own cache tensors are written too (by the engine's sdpa run only): the two
runs are separate.

Scope (step 1): full-attention layers (no sliding window), one layer group, the transformers
version whose continuous batching takes "paged|<name>" implementations (5.17; later versions
accept only paged|eager, sdpa and flash there).

usage: python3 examples/transformers_generate.py [--device cpu|cuda] [--prompts N]
           [--new-tokens N] [--dtype float32|bfloat16|float16] [--layers N] [--check]
  --check: exit 1 unless the tokens agree, or diverge only where the two runs' log-probs
           were within --tol of each other up to the divergence and within 2 tol there (a
           near-tie); --tol defaults to 1e-3 (f32), 3e-2 (f16), 0.125 (bf16): a logit of
           magnitude 16-32 has an ulp of 2^-3 in bf16 and 2^-6 in f16
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import attn_h  # noqa: E402


class AttnHPaged:
    """The attention function registered as "paged|attn_h" (transformers calls it as
    fn(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs) with
    query [1, heads, tokens, head], key/value [1, kv_heads, tokens, head] of the step's new
    tokens, and kwargs cache, cu_seq_lens_q, cu_seq_lens_k, read_index, write_index)."""

    def __init__(self, ctx: "attn_h.Context"):
        self.ctx = ctx
        self.layers = {}       # (heads, kv_heads, head, dtype, device, scale, block_size) -> attn_h.Layer
        self.caches = {}       # model layer index -> attn.h cache tensor
        self.meta = None       # the step's schedule, and what it was built from
        self.meta_layer = None
        self.meta_key = None
        self.calls = 0

    def _layer(self, module, query):
        cfg = module.config
        heads, head = query.shape[1], query.shape[3]
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        key = (heads, kv_heads, head, query.dtype, query.device.type, float(module.scaling), self.block_size)
        layer = self.layers.get(key)
        if layer is None:
            layer = attn_h.Layer(self.ctx, num_heads=heads, num_kv_heads=kv_heads, head_size=head,
                                 block_size=self.block_size, dtype=query.dtype, scale=float(module.scaling),
                                 device=query.device.type)
            self.layers[key] = layer
        return layer

    def _schedule(self, layer, cu_q, cu_k, write_index, read_index, num_blocks):
        """The attn.h schedule of this step (rebuilt when the step's indices change)."""
        host = [t.detach().to("cpu", torch.int64).numpy() for t in (cu_q, cu_k, write_index, read_index)]
        key = tuple(a.tobytes() for a in host) + (id(layer),)
        if key == self.meta_key:
            return self.meta
        cq, ck, w, r = host
        # trailing requests with no query tokens are the engine's padding for static shapes
        n = len(cq) - 1
        while n > 0 and cq[n] == cq[n - 1]:
            n -= 1
        qlen = np.diff(cq[: n + 1])
        slen = np.diff(ck[: n + 1])
        if r.size == 0:               # no cached keys anywhere: a request's keys are its new tokens
            if not np.array_equal(qlen, slen):
                raise RuntimeError("paged|attn_h: no read_index but the key lengths are not the query lengths")
            r, ck = w, cq
        bs = self.block_size
        stride = max(1, int(((slen + bs - 1) // bs).max())) if n else 1
        table = np.zeros((max(n, 1), stride), dtype=np.int32)
        for i in range(n):
            pages = r[ck[i]:ck[i] + slen[i]]
            pos = np.arange(slen[i])
            # attn.h finds key j at block_table[j / block_size], offset j % block_size
            if np.any(pages % bs != pos % bs) or np.any(pages // bs != pages[pos - pos % bs] // bs):
                raise RuntimeError("paged|attn_h: request %d's pages are not whole blocks in key order "
                                   "(attn.h reads key j at block_table[j / block_size], offset j %% "
                                   "block_size)" % i)
            table[i, : (slen[i] + bs - 1) // bs] = pages[::bs] // bs
        tokens = int(cq[n])
        cap = self.meta.capacity if self.meta is not None else None
        if (cap is None or self.meta_layer is not layer or cap["max_num_reqs"] < max(n, 1)
                or cap["max_num_tokens"] < max(tokens, 1) or cap["max_blocks_per_req"] < stride):
            if self.meta is not None:
                self.meta.close()
            self.meta = attn_h.Metadata(layer, max_num_reqs=max(2 * n, 8), max_num_tokens=max(2 * tokens, 64),
                                        max_blocks_per_req=max(2 * stride, 8), num_blocks=num_blocks)
            self.meta_layer = layer
        self.meta.build(cq[: n + 1].astype(np.int32), slen.astype(np.int32), table, w[:tokens].astype(np.int64))
        self.meta_key = key
        return self.meta

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        cache = kwargs.get("cache")
        if cache is None:
            raise ValueError("paged|attn_h: called without transformers' paged cache (it serves continuous "
                             "batching only; use sdpa for a plain forward)")
        if getattr(module, "sliding_window", None):
            raise NotImplementedError("paged|attn_h: sliding-window layers are not wired yet (step 1: full "
                                      "attention)")
        if kwargs.get("block_table") is not None:
            raise NotImplementedError("paged|attn_h: the engine's block-table decode path (flash only)")
        group, _ = cache.layer_index_to_group_indices[module.layer_idx]
        cu_k = kwargs["cu_seq_lens_k"]
        if isinstance(cu_k, dict):
            cu_k = cu_k["full_attention"]
        self.block_size = cache.block_size
        num_pages = cache.key_cache[0].shape[0]           # the engine's pages, trash blocks included
        num_blocks = num_pages // cache.block_size
        layer = self._layer(module, query)
        meta = self._schedule(layer, kwargs["cu_seq_lens_q"], cu_k, kwargs["write_index"][group],
                              kwargs["read_index"][group], num_blocks)
        kv = self.caches.get(module.layer_idx)
        if kv is None or kv.device != query.device or kv.dtype != query.dtype:
            kv = torch.zeros(layer.kv_cache_shape(num_blocks), dtype=query.dtype, device=query.device)
            self.caches[module.layer_idx] = kv
        q = query[0].transpose(0, 1).contiguous()           # [tokens, heads, head]
        k = key[0].transpose(0, 1).contiguous()
        v = value[0].transpose(0, 1).contiguous()
        out = torch.zeros_like(q)                          # padding rows stay 0
        layer.forward(meta, q, kv, out=out, k=k, v=v)
        self.calls += 1
        return out.unsqueeze(0), None                      # [1, tokens, heads, head], no weights


def tiny_llama(layers, dtype, device, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    # a wider spread than the default init: random models otherwise make near-flat logits, where
    # any rounding picks another argmax
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    return model.to(device=device, dtype=dtype).eval()


def prompts(n, seed=1):
    g = np.random.default_rng(seed)
    lens = g.integers(4, 160, size=n)
    return [g.integers(3, 1000, size=int(L)).tolist() for L in lens]


def generate(model, implementation, inputs, new_tokens, block_size):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    model.set_attn_implementation(implementation)
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=block_size, num_blocks=512, max_batch_tokens=512, use_cuda_graph=False,
                                  return_logprobs=True)
    t0 = time.perf_counter()
    out = model.generate_batch(inputs=inputs, generation_config=gen, continuous_batching_config=cb,
                               progress_bar=False)
    dt = time.perf_counter() - t0
    by_prompt = {}
    for r in out.values():
        if r.error:
            raise RuntimeError("%s: request %s failed: %s" % (implementation, r.request_id, r.error))
        by_prompt[tuple(r.prompt_ids)] = (list(r.generated_tokens), list(r.logprobs))
    rows = [by_prompt[tuple(p)] for p in inputs]
    ntok = sum(len(t) for t, _ in rows)
    return rows, ntok / dt, dt


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
    from transformers import AttentionInterface
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if a.device == "cuda" else torch.float32)
    # a logit of magnitude 16-32 has an ulp of 2^-3 in bf16 and 2^-6 in f16: one ulp there moves a
    # log-prob by that much
    tol = a.tol if a.tol is not None else {torch.float32: 1e-3, torch.float16: 3e-2}.get(dtype, 1.25e-1)
    ctx = attn_h.Context(log_level="warn")
    fn = AttnHPaged(ctx)
    AttentionInterface.register("paged|attn_h", fn)
    model = tiny_llama(a.layers, dtype, a.device)
    inputs = prompts(a.prompts)
    for impl in ("paged|attn_h", "paged|sdpa"):   # one-time costs (imports, first kernels) off the clock
        generate(model, impl, inputs[:2], 2, a.block_size)
    ours, tps_ours, dt_ours = generate(model, "paged|attn_h", inputs, a.new_tokens, a.block_size)
    ref, tps_ref, dt_ref = generate(model, "paged|sdpa", inputs, a.new_tokens, a.block_size)
    backend = next(iter(fn.layers.values())).selection["resolved"] if fn.layers else "none"
    print("transformers %s, torch %s, attn_h %s; Llama-architecture, %d layers, 8/2 heads, head 64, %s, %s; "
          "%d prompts of %d-%d tokens, %d new tokens each (greedy)"
          % (transformers.__version__, torch.__version__, attn_h.__version__, a.layers, str(dtype).split(".")[-1],
             a.device, len(inputs), min(map(len, inputs)), max(map(len, inputs)), a.new_tokens))
    print("| implementation | tokens/s | seconds |")
    print("| --- | ---: | ---: |")
    print("| paged|attn_h (attn.h %s) | %.1f | %.2f |" % (backend, tps_ours, dt_ours))
    print("| paged|sdpa (transformers) | %.1f | %.2f |" % (tps_ref, dt_ref))
    ok, lines = compare(ours, ref, tol)
    same = sum(1 for (t1, _), (t2, _) in zip(ours, ref) if t1 == t2)
    print("tokens equal for %d of %d prompts; attn.h calls: %d" % (same, len(inputs), fn.calls))
    for line in lines:
        print("  " + line)
    if fn.calls == 0:
        ok = False
        print("attn.h was never called")
    print("result: %s" % ("agree" if ok else "DISAGREE"))
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
