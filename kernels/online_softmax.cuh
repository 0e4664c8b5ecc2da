/* online_softmax.cuh - the online softmax of every attention kernel, written once.

   Scores are in base 2 with the softmax scale folded in (x = s * scale * log2 e), so every
   exponential is one ex2.approx. A row keeps m, the largest score seen so far (-inf before
   any key), and l, the sum of exp2(x - m) over the keys seen; O holds the same sum of
   exp2(x - m) * v. For each key tile:

     base  = attn_softmax_rebase(m, tile_max, alpha)   m := max(m, tile_max)
     l, O *= alpha                                      alpha = exp2(m_old - base)
     p_j   = exp2(x_j - base), l += sum p_j, O += P V

   `base` is m, except while no key has been seen (m = -inf): then it is 0, so exp2 of a
   masked score (-inf - 0) is 0 and never NaN (-inf - -inf), and alpha = exp2(-inf) = 0
   clears whatever O and l held. At the end, attn_softmax_lse2 gives the row's log-sum-exp
   in base 2 (-inf for a row that saw no key; l >= 1 otherwise, the max key contributing
   exp2(0)). The merge of such (m, l, O) states across splits or warps is split_merge.cuh.

   NaN: a NaN score (a NaN in q, in a key the row sees, in a scale) is skipped by the max
   (fmaxf) but not by exp2, so l and O turn NaN; attn_softmax_lse2 and the merges keep it,
   and the row's out and lse come out NaN (a row of NaN scores is not a row that saw no key).

   The reductions that make tile_max a row's maximum differ per kernel (the 4 lanes of an
   mma row group, or several warps through shared memory) and stay with the kernels. */
#ifndef ATTN_ONLINE_SOFTMAX_CUH
#define ATTN_ONLINE_SOFTMAX_CUH

#include "attn_common.cuh"
#include "split_merge.cuh"

/* Folds a tile's row maximum `tile_max` (scaled, base 2) into the running max `m`; returns
   the base the tile's exponentials subtract, and sets `alpha`, the factor the row's l and O
   from earlier tiles are multiplied by. */
ATTN_DEV float attn_softmax_rebase(float &m, float tile_max, float &alpha) {
    const float mnew = fmaxf(m, tile_max);
    const float base = mnew == attn_neg_inf() ? 0.0f : mnew; /* nothing seen yet: p = 0, not NaN */
    alpha = attn_exp2(m - base);                              /* m = -inf -> 0 */
    m = mnew;
    return base;
}

/* The row's log-sum-exp in base 2 from its final (m, l); -inf when no key was seen, NaN
   when a NaN score made l NaN. */
ATTN_DEV float attn_softmax_lse2(float m, float l) {
    return l > 0.0f || l != l ? m + attn_log2(l) : attn_neg_inf();
}

/* Attention sinks: joins a finished row's log-sum-exp `lse` (natural log, of its keys;
   -inf: none) with its head's sink, a logit in the denominator with no value: lse :=
   log(e^lse + e^sink). Returns the share of the denominator the keys keep, the factor the
   row's normalised output O / l takes. In natural logs, not the scores' base 2: a finite
   sink past FLT_MAX ln 2 has no base-2 float. Applied once per row, where a row is
   finished (never to split partials: the merge applies it). A row that saw no key gets
   factor 0 (out 0) and lse = the sink; a NaN lse stays NaN. */
ATTN_DEV float attn_softmax_sink(float sink, float &lse) {
    const float mx = fmaxf(lse, sink); /* the differences to mx are <= 0: their exp2 is safe */
    const float a = attn_exp2((lse - mx) * ATTN_LOG2E), b = attn_exp2((sink - mx) * ATTN_LOG2E);
    lse = mx + attn_log2(a + b) * ATTN_LN2;
    return a * attn_rcp(a + b);
}

#endif /* ATTN_ONLINE_SOFTMAX_CUH */
