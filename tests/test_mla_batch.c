/* MLA batches as an engine passes them, on CPU_MLA, through all three entry points
   (forward_mqa, forward_mha, the fused call): decodes, zero-token requests and chunked
   and fresh prefills in one batch; fp8 latent caches (per-tensor scale); q / kv_c / W_UK
   as strided views of larger tensors; random batches; attn_reorder_batch and a batch
   that needs it. Checked against the float64 unabsorbed reference of tests/mla_fixtures.h.
   (Their rejections: tests/test_mla_reject.c.) */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "mla_fixtures.h"

/* Decodes + prefills with and without context in one fused call that also writes the
   cache; then forward_mqa / forward_mha on the same built batch. */
ATTN_TEST(test_mla_mixed_batch) {
    static const attn_dtype dts[][2] = {{ATTN_DTYPE_F32, ATTN_DTYPE_F16},
                                        {ATTN_DTYPE_BF16, ATTN_DTYPE_BF16},
                                        {ATTN_DTYPE_F16, ATTN_DTYPE_F16}};
    int i;
    for (i = 0; i < 3; i++) {
        mcfg c;
        mworld w;
        char tag[96];
        base_cfg(&c, i == 2 ? 32 : 16, 512, dts[i][0], dts[i][1]);
        c.seed = 900 + (uint64_t)i;
        c.nref = 4;
        c.write_new = 0;
        c.pad = 2;
        add_req(&c, 1, scaled(1100, 200));
        add_req(&c, 1, 1);
        add_req(&c, 0, 30); /* no new token this step */
        add_req(&c, 1, 77);
        add_req(&c, 25, 200); /* chunked prefill */
        add_req(&c, 40, 40);  /* fresh prefill */
        add_req(&c, 3, 90);
        if (!world_open(&w, &c, 0)) continue; /* this case only: the failure is recorded */
        check_counts(&w, 4, 3, 3, 68);
        snprintf(tag, sizeof tag, "mixed %s/%s fused", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
        run_fused(&w, w.meta, 1, tag, NULL);
        snprintf(tag, sizeof tag, "mixed %s/%s mqa", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
        run_mqa(&w, w.meta, i & 1, tag, NULL);
        snprintf(tag, sizeof tag, "mixed %s/%s mha", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
        run_mha(&w, w.meta, tag);
        world_free(&w);
    }
}

/* fp8 latent caches (per-tensor scale) on CPU_MLA: decode at 16 and 128 heads, the 320
   variant, chunked and fresh prefills over several up-projection chunks, the fused call,
   every path against float64 from the dequantized latents; e4m3 and e5m2, scales 1 (codes
   down to the subnormals), 1/8 and 1/64. */
ATTN_TEST(test_mla_fp8_latent) {
    static const struct { int H, R; attn_dtype dt, kvdt; float ks; } cases[] = {
        {16, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E4M3, 1.0f / 64},
        {128, 512, ATTN_DTYPE_F16, ATTN_DTYPE_FP8_E4M3, 1.0f},
        {16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_FP8_E5M2, 1.0f / 8},
        {40, 256, ATTN_DTYPE_BF16, ATTN_DTYPE_FP8_E5M2, 1.0f / 64}};
    int i;
    for (i = 0; i < 4; i++) {
        mcfg c;
        mworld w;
        char name[64], tag[96];
        base_cfg(&c, cases[i].H, cases[i].R, cases[i].dt, cases[i].kvdt);
        c.ks = cases[i].ks;
        c.seed = 8100 + (uint64_t)i;
        c.nref = 4;
        c.write_new = i & 1;
        c.bs = i == 3 ? 32 : 64;
        add_req(&c, 1, scaled(900, 200));
        add_req(&c, 1, 1);
        add_req(&c, 2, 70);   /* a speculative decode */
        add_req(&c, 20, 150); /* chunked prefill */
        add_req(&c, 33, 33);  /* fresh prefill */
        if (c.H == 128) add_req(&c, 10, probe_chunk(128) + 60); /* keys over two up-projection chunks */
        if (!world_open(&w, &c, 2)) continue; /* this case only: the failure is recorded */
        snprintf(name, sizeof name, "fp8 H%d %s/%s scale %g", c.H, attn_dtype_name(c.dt), attn_dtype_name(c.kvdt),
                 (double)c.ks);
        snprintf(tag, sizeof tag, "%s fused", name);
        if (!c.write_new) run_fused(&w, w.meta, 1, tag, NULL);
        snprintf(tag, sizeof tag, "%s mqa", name);
        run_mqa(&w, w.meta, i & 1, tag, NULL);
        snprintf(tag, sizeof tag, "%s mha", name);
        run_mha(&w, w.meta, tag);
        world_free(&w);
    }
}

/* The layouts an engine passes: q_nope / q_pe as views of one [T, H, 192] tensor, kv_c /
   k_pe as views of one [T, 576] row (the kv_a projection), W_UK as a view of kv_b_proj
   ([H, 128 + 128, R], nope rows first), the prefill q of forward_mha with padded rows. */
ATTN_TEST(test_mla_strided_views) {
    const size_t esz = 2;
    mcfg c;
    mworld w;
    int H = 16, R = 512, T, t, h, x, n;
    void *qbuf, *kvbuf, *kvb, *out, *qm, *om;
    attn_tensor tqn, tqp, tkc, tkp, tuk, tout, tqm, tom;
    attn_mla_info info;
    base_cfg(&c, H, R, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.seed = 5150;
    c.nref = 4;
    c.write_new = 0;
    c.pad = 0;
    ADD_REQS(&c, {1, scaled(900, 200)}, {1, 33}, {20, 150}, {45, 45});
    REQUIRE(world_open(&w, &c, 0));
    T = w.ntok;
    info = w.info;
    qbuf = xmalloc((size_t)T * H * 192 * esz);
    kvbuf = xmalloc((size_t)T * 576 * esz);
    kvb = xmalloc((size_t)H * 256 * (size_t)R * esz);
    out = xmalloc((size_t)T * H * VDIM * esz);
    qm = xmalloc((size_t)T * H * 256 * esz);
    om = xmalloc((size_t)T * H * VDIM * esz);
    for (t = 0; t < T; t++)
        for (h = 0; h < H; h++) {
            for (x = 0; x < NOPE; x++)
                put(qbuf, c.dt, ((size_t)t * H + (size_t)h) * 192 + (size_t)x,
                    w.qn[((size_t)t * H + (size_t)h) * NOPE + (size_t)x]);
            for (x = 0; x < ROPE; x++)
                put(qbuf, c.dt, ((size_t)t * H + (size_t)h) * 192 + NOPE + (size_t)x,
                    w.qp[((size_t)t * H + (size_t)h) * ROPE + (size_t)x]);
        }
    for (t = 0; t < T; t++)
        for (x = 0; x < 576; x++)
            put(kvbuf, c.dt, (size_t)t * 576 + (size_t)x,
                get(x < R ? w.kvc_raw : w.kpe_raw, c.dt,
                    x < R ? (size_t)t * (size_t)R + (size_t)x : (size_t)t * ROPE + (size_t)(x - R)));
    for (h = 0; h < H; h++)
        for (n = 0; n < 256; n++)
            for (x = 0; x < R; x++) /* nope rows = W_UK; the other 128 rows: finite filler */
                put(kvb, c.dt, ((size_t)h * 256 + (size_t)n) * (size_t)R + (size_t)x,
                    n < NOPE ? w.wuk[((size_t)h * NOPE + (size_t)n) * (size_t)R + (size_t)x] : 9.0f);
    tqn = t3(qbuf, c.dt, T, H, NOPE);
    tqn.strides[0] = (int64_t)H * 192;
    tqn.strides[1] = 192;
    tqn.strides[2] = 1;
    tqp = tqn;
    tqp.data = (char *)qbuf + NOPE * esz;
    tqp.shape[2] = ROPE;
    tkc = attn_tensor_make(kvbuf, c.dt, 2, tqn.shape);
    tkc.shape[0] = T;
    tkc.shape[1] = R;
    tkc.strides[0] = 576;
    tkc.strides[1] = 1;
    tkp = tkc;
    tkp.data = (char *)kvbuf + (size_t)R * esz;
    tkp.shape[1] = ROPE;
    tuk = t3(kvb, c.dt, H, NOPE, R);
    tuk.strides[0] = (int64_t)256 * R;
    tuk.strides[1] = R;
    tuk.strides[2] = 1;
    tout = t3(out, c.dt, T, H, VDIM);
    poison(out, c.dt, (size_t)T * H * VDIM);
    EXPECT_OK(
        attn_mla_forward(w.layer, w.meta, &tqn, &tqp, &tkc, &tkp, &w.t_cache, &tuk, &w.t_wuv, &tout, NULL));
    check_out(&w, "strided fused", out, NULL, 0, T, 0, T);
    /* forward_mha with q rows padded to 256 per head, out rows of H * 128 + gap */
    for (t = 0; t < info.num_prefill_tokens; t++)
        for (h = 0; h < H; h++)
            for (x = 0; x < 256; x++)
                put(qm, c.dt, ((size_t)t * H + (size_t)h) * 256 + (size_t)x,
                    x < 192
                        ? get(qbuf, c.dt,
                              ((size_t)(info.num_decode_tokens + t) * H + (size_t)h) * 192 + (size_t)x)
                        : 7.0f);
    tqm = t3(qm, c.dt, info.num_prefill_tokens, H, 192);
    tqm.strides[0] = (int64_t)H * 256;
    tqm.strides[1] = 256;
    tqm.strides[2] = 1;
    tom = t3(om, c.dt, info.num_prefill_tokens, H, VDIM);
    poison(om, c.dt, (size_t)T * H * VDIM);
    EXPECT_OK(attn_mla_forward_mha(w.layer, w.meta, &tqm, &w.t_cache, &tuk, &w.t_wuv, &tom, NULL, NULL));
    check_out(&w, "strided mha", om, NULL, info.num_decode_tokens, T, info.num_decode_tokens,
              info.num_prefill_tokens);
    /* forward_mqa with q_pe a view of the combined q */
    {
        void *ql = xmalloc((size_t)T * H * (size_t)R * esz),
             *ol = xmalloc((size_t)T * H * (size_t)R * esz);
        float *lse = (float *)xmalloc((size_t)T * H * sizeof(float));
        attn_tensor tql, tol, tl;
        int td = info.num_decode_tokens;
        for (t = 0; t < td; t++)
            for (h = 0; h < H; h++)
                for (x = 0; x < R; x++) {
                    double sum = 0;
                    for (n = 0; n < NOPE; n++)
                        sum += (double)w.qn[((size_t)t * H + (size_t)h) * NOPE + (size_t)n] *
                               (double)w.wuk[((size_t)h * NOPE + (size_t)n) * (size_t)R + (size_t)x];
                    put(ql, c.dt, ((size_t)t * H + (size_t)h) * (size_t)R + (size_t)x, (float)sum);
                }
        tql = t3(ql, c.dt, td, H, R);
        tol = t3(ol, c.dt, td, H, R);
        tl = t2(lse, td, H);
        poison(ol, c.dt, (size_t)T * H * (size_t)R);
        poison(lse, ATTN_DTYPE_F32, (size_t)T * H);
        EXPECT_OK(attn_mla_forward_mqa(w.layer, w.meta, &tql, &tqp, &w.t_cache, &tol, &tl, NULL));
        check_latent(&w, "strided mqa", ol, c.dt, lse, td, td);
        free(ql);
        free(ol);
        free(lse);
    }
    free(qbuf);
    free(kvbuf);
    free(kvb);
    free(out);
    free(qm);
    free(om);
    world_free(&w);
}


ATTN_TEST(test_mla_random_batches) {
    rng r;
    int n = (int)(8 * test_scale()), k, failed = 0;
    if (n < 2) n = 2;
    rng_seed(&r, 0xfeedface12345ull);
    for (k = 0; k < n && failed < 2; k++) {
        static const int heads[] = {1, 8, 16, 24, 64};
        static const int blocks[] = {16, 32, 64, 128};
        mcfg c;
        mworld w;
        double work = 0;
        int i, nd, np, f0 = attn_test_current_failed();
        char tag[160];
        base_cfg(&c, heads[rng_int(&r, 0, 4)], rng_int(&r, 0, 2) ? 512 : 256, (attn_dtype)rng_int(&r, 1, 3),
                 ATTN_DTYPE_AUTO);
        c.kvdt = rng_int(&r, 0, 2) ? c.dt : (attn_dtype)rng_int(&r, 1, 3);
        c.bs = blocks[rng_int(&r, 0, 3)];
        c.threads = rng_int(&r, 1, 3);
        random_world_knobs(&r, &c);
        nd = rng_int(&r, 0, 5);
        np = rng_int(&r, nd ? 0 : 1, 3);
        for (i = 0; i < nd; i++) {
            int thr = c.decode_threshold ? c.decode_threshold : 1;
            int ql = rng_int(&r, 1, thr), sl = ql + rng_int(&r, 0, rng_int(&r, 0, 3) ? 400 : 2500);
            add_req(&c, ql, sl);
        }
        for (i = 0; i < np; i++) {
            int thr = c.decode_threshold ? c.decode_threshold : 1;
            int ql = rng_int(&r, thr + 1, 120), sl = rng_int(&r, 0, 1) ? ql : ql + rng_int(&r, 1, 500);
            add_req(&c, ql, sl);
        }
        for (i = 0; i < c.nreq; i++) work += (double)c.slen[i];
        if (work * (c.nref ? c.nref : c.H) > 9000 * test_scale() + 2000) { /* keep the reference cheap */
            for (i = 0; i < c.nreq; i++)
                if (c.slen[i] > 300) {
                    int ctxl = c.slen[i] - c.qlen[i];
                    c.slen[i] = c.qlen[i] + (ctxl > 150 ? 150 : ctxl);
                }
        }
        snprintf(tag, sizeof tag,
                 "random case %d: H=%d R=%d %s/%s bs=%d thr=%d threads=%d reqs=%d+%d scale=%g", k, c.H, c.R,
                 attn_dtype_name(c.dt), attn_dtype_name(c.kvdt), c.bs, c.decode_threshold, c.threads, nd, np,
                 (double)c.scale);
        if (!world_open(&w, &c, 0)) {
            printf("    in %s\n", tag);
            failed++;
            continue;
        }
        if (!c.write_new) run_fused(&w, w.meta, 1, tag, NULL);
        if (nd) run_mqa(&w, w.meta, rng_int(&r, 0, 1), tag, NULL);
        if (np) run_mha(&w, w.meta, tag);
        if (c.write_new) run_fused(&w, w.meta, 0, tag, NULL);
        if (attn_test_current_failed() > f0) {
            printf("    in %s\n", tag);
            failed++;
        }
        world_free(&w);
    }
}


/* The reference two-pointer algorithm: the first prefill from the front is swapped with
   the last decode from the back, until the pointers meet. */
static int ref_reorder(const int32_t *ql, int n, int thr, int32_t *perm) {
    int i = 0, j = n - 1, swaps = 0, k;
    if (thr <= 0) thr = 1;
    for (k = 0; k < n; k++) perm[k] = k;
    for (;;) {
        while (i < n && ql[perm[i]] <= thr) i++;
        while (j >= 0 && ql[perm[j]] > thr) j--;
        if (i >= j) break;
        {
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        swaps++;
    }
    return swaps;
}

ATTN_TEST(test_mla_reorder_batch) {
    /* hand-made: D = 1, P = 5 (threshold 1) */
    static const struct {
        int n;
        int32_t ql[8];
        int thr;
        int nd, swaps;
        int32_t perm[8];
    } cases[] = {
        {4, {5, 1, 5, 1}, 0, 2, 1, {3, 1, 2, 0}},       /* P D P D */
        {4, {1, 1, 5, 5}, 0, 2, 0, {0, 1, 2, 3}},       /* already sorted */
        {4, {5, 5, 1, 1}, 0, 2, 2, {3, 2, 1, 0}},       /* P P D D */
        {4, {5, 1, 1, 1}, 0, 3, 1, {3, 1, 2, 0}},       /* P D D D */
        {5, {1, 5, 1, 5, 1}, 0, 3, 1, {0, 4, 2, 3, 1}}, /* D P D P D */
        {3, {1, 1, 1}, 0, 3, 0, {0, 1, 2}},
        {3, {7, 2, 9}, 0, 0, 0, {0, 1, 2}},
        {5, {3, 2, 1, 5, 2}, 2, 3, 1, {4, 1, 2, 3, 0}},       /* threshold 2 */
        {6, {0, 5, 1, 5, 0, 1}, 0, 4, 2, {0, 5, 2, 4, 3, 1}}, /* query_len 0 counts as a decode */
        {1, {5}, 0, 0, 0, {0}},
    };
    int k, i, nd, sw;
    int32_t perm[64], rperm[64], ql[64];
    for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        for (i = 0; i < 8; i++) perm[i] = -1;
        EXPECT_OK(attn_reorder_batch(cases[k].ql, cases[k].n, cases[k].thr, perm, &nd, &sw));
        EXPECT_EQ_INT(nd, cases[k].nd);
        EXPECT_EQ_INT(sw, cases[k].swaps);
        for (i = 0; i < cases[k].n; i++)
            if (perm[i] != cases[k].perm[i]) {
                attn_test_fail(__FILE__, __LINE__, "case %d: perm[%d] = %d, expected %d", k, i, perm[i],
                               cases[k].perm[i]);
                break;
            }
    }
    /* empty batch; num_swaps may be NULL */
    EXPECT_OK(attn_reorder_batch(NULL, 0, 0, NULL, &nd, &sw));
    EXPECT_EQ_INT(nd, 0);
    EXPECT_EQ_INT(sw, 0);
    EXPECT_OK(attn_reorder_batch(cases[0].ql, 4, 0, perm, &nd, NULL));
    /* random lists: decodes first, a permutation, the fewest swaps, nothing in place moves */
    {
        rng r;
        rng_seed(&r, 606);
        for (k = 0; k < 300; k++) {
            int n = rng_int(&r, 1, 64), thr = rng_int(&r, 0, 3), t = thr ? thr : 1, misplaced = 0, ok = 1;
            int seen[64];
            for (i = 0; i < n; i++)
                ql[i] = rng_int(&r, 0, 2) ? rng_int(&r, 0, t) : rng_int(&r, t + 1, t + 50);
            EXPECT_OK(attn_reorder_batch(ql, n, thr, perm, &nd, &sw));
            memset(seen, 0, sizeof seen);
            for (i = 0; i < n; i++) {
                if (perm[i] < 0 || perm[i] >= n || seen[perm[i]]++)
                    ok = 0;
                else if ((i < nd) != (ql[perm[i]] <= t))
                    ok = 0;
            }
            for (i = 0; i < nd; i++)
                if (ql[i] > t) misplaced++;
            for (i = 0; i < n && ok; i++)
                if ((i < nd && ql[i] <= t) || (i >= nd && ql[i] > t)) ok = perm[i] == i;
            if (ok)
                ok = sw == misplaced && sw == ref_reorder(ql, n, thr, rperm) &&
                     memcmp(perm, rperm, (size_t)n * sizeof(int32_t)) == 0;
            if (!ok) {
                attn_test_fail(__FILE__, __LINE__,
                               "random list %d (n %d, thr %d): bad permutation or swaps %d (expected %d)", k,
                               n, thr, sw, misplaced);
                break;
            }
        }
    }
}

/* An unsorted batch: building it fails (INVALID_METADATA, logged as such); reordered with
   attn_reorder_batch, it runs and every original request matches its reference (the
   float64 reference is computed once, in the original order, and mapped through perm). */
ATTN_TEST(test_mla_unsorted_batch_reordered) {
    static const int qlens[] = {30, 1, 12, 1, 1, 50, 1};
    int slens[7] = {200, 600, 12, 1, 90, 50, 1300};
    int nreq = 7, i, nd, sw, k;
    int32_t ql[7], perm[7];
    mcfg cu, cs;
    mworld wu, ws;
    attn_metadata *meta;
    attn_status st;
    slens[1] = scaled(600, 150);
    slens[6] = scaled(1300, 300);
    base_cfg(&cu, 16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    cu.nref = 3;
    cu.seed = 7070;
    cu.use_stream = 1;
    cu.write_new = 0;
    for (i = 0; i < nreq; i++) {
        add_req(&cu, qlens[i], slens[i]);
        cu.stream[i] = i;
        ql[i] = qlens[i];
    }
    EXPECT_OK(attn_reorder_batch(ql, nreq, 0, perm, &nd, &sw));
    EXPECT_EQ_INT(nd, 4);
    EXPECT_EQ_INT(sw, 2); /* P D P D D P D: 30<->1300, 12<->90 */
    cs = cu;
    cs.nreq = 0;
    for (i = 0; i < nreq; i++) {
        add_req(&cs, qlens[perm[i]], slens[perm[i]]);
        cs.stream[i] = perm[i];
    }
    for (i = 0; i < nd; i++) EXPECT_TRUE(cs.qlen[i] <= 1);
    for (i = nd; i < nreq; i++) EXPECT_TRUE(cs.qlen[i] > 1);
    cs.no_ref = 1;

    REQUIRE(world_init(&wu, &cu));
    {
        attn_test_log cap;
        /* the unsorted build, on a context that captures the log */
        attn_context *lctx = attn_test_context(&cap, ATTN_LOG_LEVEL_DEBUG, 1);
        if (lctx) {
            attn_layer_desc d = *attn_layer_get_desc(wu.layer);
            attn_layer *l2 = NULL;
            attn_metadata_desc md;
            attn_metadata *m2 = NULL;
            attn_batch b = world_batch(&wu);
            EXPECT_OK(attn_layer_create(lctx, &d, NULL, &l2));
            memset(&md, 0, sizeof md);
            md.max_num_reqs = nreq;
            md.max_num_tokens = wu.ntok + 4;
            md.max_blocks_per_req = wu.stride;
            md.num_blocks = wu.nblocks;
            if (l2) EXPECT_OK(attn_metadata_create(l2, &md, &m2));
            if (m2) {
                attn_test_log_reset(&cap);
                EXPECT_STATUS(attn_metadata_build(m2, 0, &b, 0), ATTN_ERROR_INVALID_METADATA);
                EXPECT_TRUE(attn_test_log_has(&cap, ATTN_LOG_INVALID_METADATA, ATTN_LOG_LEVEL_ERROR));
                /* and the forward calls refuse a metadata that was never built */
                {
                    attn_tensor tq = t3(wu.qn_raw, ATTN_DTYPE_F32, wu.ntok, 16, 576);
                    attn_tensor to = t3(wu.qn_raw, ATTN_DTYPE_F32, wu.ntok, 16, 512);
                    EXPECT_STATUS(attn_mla_forward_mqa(l2, m2, &tq, NULL, &wu.t_cache, &to, NULL, NULL),
                                  ATTN_ERROR_INVALID_METADATA);
                }
            }
            attn_metadata_destroy(m2);
            attn_layer_destroy(l2);
        }
        attn_context_destroy(lctx);
    }
    meta = world_meta(&wu, 0, &st);
    EXPECT_TRUE(meta == NULL);
    EXPECT_EQ_INT(st, ATTN_ERROR_INVALID_METADATA);
    attn_metadata_destroy(meta);

    if (!world_init(&ws, &cs)) {
        world_free(&ws);
        world_free(&wu);
        return;
    }
    /* the same data per original request; its reference rows mapped through perm */
    {
        size_t nr = (size_t)wu.nref, R = 512;
        ws.nref = wu.nref;
        memcpy(ws.refh, wu.refh, sizeof ws.refh);
        ws.ref_out = (double *)xmalloc((size_t)ws.ntok * nr * VDIM * sizeof(double));
        ws.ref_lat = (double *)xmalloc((size_t)ws.ntok * nr * R * sizeof(double));
        ws.ref_lse = (double *)xmalloc((size_t)ws.ntok * nr * sizeof(double));
        for (k = 0; k < nreq; k++) {
            int orig = perm[k], t;
            EXPECT_TRUE(memcmp(ws.lat[k], wu.lat[orig], (size_t)cs.slen[k] * 576 * sizeof(float)) == 0);
            for (t = 0; t < cs.qlen[k]; t++) {
                size_t row = (size_t)(ws.qsl[k] + t), orow = (size_t)(wu.qsl[orig] + t);
                EXPECT_TRUE(memcmp(ws.qn + row * 16 * NOPE, wu.qn + orow * 16 * NOPE,
                                   16 * NOPE * sizeof(float)) == 0);
                memcpy(ws.ref_out + row * nr * VDIM, wu.ref_out + orow * nr * VDIM,
                       nr * VDIM * sizeof(double));
                memcpy(ws.ref_lat + row * nr * R, wu.ref_lat + orow * nr * R, nr * R * sizeof(double));
                memcpy(ws.ref_lse + row * nr, wu.ref_lse + orow * nr, nr * sizeof(double));
            }
        }
    }
    meta = world_meta(&ws, 0, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) {
        run_fused(&ws, meta, 1, "reordered fused", NULL);
        run_mqa(&ws, meta, 1, "reordered mqa", NULL);
        run_mha(&ws, meta, "reordered mha");
    }
    attn_metadata_destroy(meta);
    world_free(&ws);
    world_free(&wu);
}

void suite_mla_batch(void) {
    ATTN_RUN(test_mla_reorder_batch);
    ATTN_RUN(test_mla_mixed_batch);
    ATTN_RUN(test_mla_fp8_latent);
    ATTN_RUN(test_mla_strided_views);
    ATTN_RUN(test_mla_unsorted_batch_reordered);
    ATTN_RUN(test_mla_random_batches);
}
