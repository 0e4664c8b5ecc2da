/* split_merge.cuh - the merge of softmax states, written once: split-KV partials, the key
   slices of the warps of one CTA, MLA prefill chunks. A state is what online_softmax.cuh
   leaves for a row: (m, l, O) with O unnormalised, or (lse, O) with O normalised; both in
   base 2. Merging n states:

     M = max over the states that saw a key of x_s     (x_s = m_s, or lse_s)
     w_s = attn_merge_weight(x_s, attn_merge_base(M))  (0 for a state that saw no key)
     O = sum w_s O_s,  l = sum w_s l_s  (or lse = M + log2 sum w_s)

   A state that saw no key (l = 0, lse = -inf) weighs 0 whatever its O holds: partial
   workspaces are not cleared between launches. A NaN state (l or lse NaN) weighs NaN: the
   max (fmaxf) skips it, the weight does not, so the merged row is NaN. The loops that run this (which lanes hold
   which splits, where the partials live) are the kernels'; merge.cu, vLLM's
   merge_attn_states on natural-log LSEs, keeps expf/logf to match its peer. */
#ifndef ATTN_SPLIT_MERGE_CUH
#define ATTN_SPLIT_MERGE_CUH

#include "attn_common.cuh"

/* The exponent base of a merge: the largest state, or 0 when no state saw a key. */
ATTN_DEV float attn_merge_base(float mx) { return mx == attn_neg_inf() ? 0.0f : mx; }

/* A state's weight against that base: 0 for a state that saw no key (x = -inf). */
ATTN_DEV float attn_merge_weight(float x, float base) { return x == attn_neg_inf() ? 0.0f : attn_exp2(x - base); }

/* An (m, l) state's merge key: m, or -inf when it saw no key (l = 0), NaN when it met a
   NaN score (l NaN: its weight, exp2 of NaN, makes the merged row NaN). */
ATTN_DEV float attn_merge_key(float m, float l) { return l > 0.0f ? m : l != l ? l : attn_neg_inf(); }

#endif /* ATTN_SPLIT_MERGE_CUH */
