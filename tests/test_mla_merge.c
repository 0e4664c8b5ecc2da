/* MLA's split-KV decode and the LSE merge on CPU_MLA: the same decodes with num_kv_splits
   forced from 1 to 1024 (empty splits included) agree with each other and the float64
   reference; ATTN_BATCH_INVARIANT=1 makes a request's rows bitwise the same alone and in a
   batch; attn_merge_attn_states merges shards of one sequence into the whole, in both LSE
   bases, with empty partitions, aliasing and half-precision outputs.
   (Its rejections: tests/test_mla_reject.c.) */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "mla_fixtures.h"

/* The same decode batch with num_kv_splits forced to 1, 2, 7, 32: the same out_latent and
   LSE within fp32 rounding, and each matching the reference; 32 splits over contexts of
   1..3 keys leave empty splits that must not produce NaN. */
ATTN_TEST(test_mla_split_invariance) {
    static const int splits[] = {1, 2, 7, 32};
    mcfg c;
    mworld w;
    mqa_result res[4];
    int s, x, i;
    base_cfg(&c, 16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.nref = 4;
    c.seed = 321;
    ADD_REQS(&c, {1, 1}, {1, 3}, {1, 100}, {1, scaled(1100, 300)}, {1, scaled(2600, 520)});
    memset(res, 0, sizeof res);
    REQUIRE(world_init(&w, &c));
    for (s = 0; s < 4; s++) {
        attn_metadata *meta = world_meta(&w, splits[s], NULL);
        attn_mla_info info;
        char tag[64];
        EXPECT_TRUE(meta != NULL);
        if (!meta) continue;
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        EXPECT_EQ_INT(info.num_kv_splits, splits[s]);
        snprintf(tag, sizeof tag, "%d splits", splits[s]);
        run_mqa(&w, meta, s & 1, tag, &res[s]);
        attn_metadata_destroy(meta);
    }
    for (s = 1; s < 4; s++) {
        int bad = 0;
        if (!res[0].lat || !res[s].lat) continue;
        for (x = 0; x < res[0].td * c.H * c.R && bad < 3; x++)
            if (!attn_test_near(res[s].lat[x], res[0].lat[x], 2e-6, 2e-5)) {
                attn_test_fail(__FILE__, __LINE__, "%d splits: out_latent[%d] = %.9g, 1 split %.9g",
                               splits[s], x, (double)res[s].lat[x], (double)res[0].lat[x]);
                bad++;
            }
        for (x = 0; x < res[0].td * c.H && bad < 3; x++)
            if (!attn_test_near(res[s].lse[x], res[0].lse[x], 2e-5, 0)) {
                attn_test_fail(__FILE__, __LINE__, "%d splits: lse[%d] = %.9g, 1 split %.9g", splits[s], x,
                               (double)res[s].lse[x], (double)res[0].lse[x]);
                bad++;
            }
    }
    for (i = 0; i < 4; i++) {
        free(res[i].lat);
        free(res[i].lse);
    }
    /* the automatic split count, and what drives it */
    {
        attn_metadata *meta = world_meta(&w, 0, NULL);
        attn_mla_info info;
        if (meta) {
            EXPECT_OK(attn_metadata_mla_info(meta, &info));
            EXPECT_EQ_INT(info.num_kv_splits, attn_mla_num_kv_splits(c.slen[4], ctx_threads(w.ctx), 0));
            run_mqa(&w, meta, 0, "automatic splits", NULL);
        }
        attn_metadata_destroy(meta);
    }
    world_free(&w);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(0, 4, 0), 1);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(1, 4, 0), 1);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(512, 4, 0), 1);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(513, 4, 0), 2);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(100000, 4, 0), 4);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(100000, 4, 1), 1);
    EXPECT_EQ_INT(attn_mla_num_kv_splits(100000, 0, 0), 1);
}

/* Only empty splits but one: 32 splits over requests of 1..5 keys, several threads. */
ATTN_TEST(test_mla_split_empty) {
    mcfg c;
    mworld w;
    attn_metadata *meta;
    base_cfg(&c, 8, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.threads = 3;
    c.seed = 3232;
    ADD_REQS(&c, {1, 1}, {1, 2}, {1, 5}, {1, 31});
    REQUIRE(world_open(&w, &c, 32));
    run_mqa(&w, w.meta, 0, "32 splits, short", NULL);
    run_fused(&w, w.meta, 0, "32 splits, short, fused", NULL);
    /* the most splits allowed */
    meta = world_meta(&w, 1024, NULL);
    EXPECT_TRUE(meta != NULL);
    if (meta) {
        attn_mla_info info;
        EXPECT_OK(attn_metadata_mla_info(meta, &info));
        EXPECT_EQ_INT(info.num_kv_splits, 1024);
        run_mqa(&w, meta, 1, "1024 splits, short", NULL);
    }
    attn_metadata_destroy(meta);
    world_free(&w);
}

/* ATTN_BATCH_INVARIANT=1: one decode request alone and first in a larger batch (more
   decodes and prefills, other block placement) gives bitwise-identical rows, in
   forward_mqa (out_latent, LSE) and in the fused call. Without the variable the two
   batches would split the request's keys differently (3 vs 4 splits on 4 threads). */
ATTN_TEST(test_mla_batch_invariant) {
    mcfg one, many;
    mworld wa, wb;
    attn_metadata *ma = NULL, *mb = NULL;
    int H = 16, R = 512;
    attn_test_env saved_env;
    base_cfg(&one, H, R, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    one.nref = 1;
    one.seed = 4444;
    one.wseed = 55;
    one.threads = 4;
    add_req(&one, 1, 1100);
    many = one;
    many.seed = 4444; /* request 0 draws the same stream */
    add_req(&many, 1, scaled(900, 100));
    add_req(&many, 1, 1800); /* the longest decode: 4 splits by default */
    ADD_REQS(&many, {1, 3}, {20, 120}, {7, 7});
    many.bs = 32; /* a different page layout too */
    REQUIRE(world_init(&wa, &one));
    if (!world_init(&wb, &many)) {
        world_free(&wa);
        return;
    }
    saved_env = attn_test_env_save("ATTN_BATCH_INVARIANT");
    unsetenv("ATTN_BATCH_INVARIANT");
    ma = world_meta(&wa, 0, NULL);
    mb = world_meta(&wb, 0, NULL);
    EXPECT_TRUE(ma != NULL && mb != NULL);
    if (ma && mb) { /* the default schedule depends on the batch (given 4 threads) */
        attn_mla_info ia, ib;
        int thr = ctx_threads(wa.ctx);
        EXPECT_OK(attn_metadata_mla_info(ma, &ia));
        EXPECT_OK(attn_metadata_mla_info(mb, &ib));
        EXPECT_EQ_INT(ia.num_kv_splits, attn_mla_num_kv_splits(1100, thr, 0));
        EXPECT_EQ_INT(ib.num_kv_splits, attn_mla_num_kv_splits(1800, thr, 0));
        if (thr >= 4) EXPECT_TRUE(ia.num_kv_splits == 3 && ib.num_kv_splits == 4);
    }
    attn_metadata_destroy(ma);
    attn_metadata_destroy(mb);
    ma = mb = NULL;
    setenv("ATTN_BATCH_INVARIANT", "1", 1);
    ma = world_meta(&wa, 0, NULL);
    mb = world_meta(&wb, 0, NULL);
    attn_test_env_restore(&saved_env);
    EXPECT_TRUE(ma != NULL && mb != NULL);
    if (ma && mb) check_invariant_rows(&wa, ma, &wb, mb, 1, "");
    attn_metadata_destroy(ma);
    attn_metadata_destroy(mb);
    world_free(&wa);
    world_free(&wb);
}


/* One sequence's context sharded into contiguous parts: each shard is a decode request over
   its keys (a decode sees all of them), the whole sequence another; forward_mqa gives every
   (out_latent, LSE); merging the shards with attn_merge_attn_states must give the whole. */
ATTN_TEST(test_mla_merge_shards) {
    mcfg c;
    mworld w;
    mqa_result res;
    int H = 8, R = 512, S = scaled(1000, 400), HR, x, s;
    static const int nshards_list[] = {2, 4};
    base_cfg(&c, H, R, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.seed = 8080;
    c.nref = 3;
    /* requests 0..5: shards (aliases of request 6), request 6: the whole sequence */
    {
        int cuts2[3], cuts4[5], i;
        cuts2[0] = 0;
        cuts2[1] = S / 3;
        cuts2[2] = S;
        cuts4[0] = 0;
        cuts4[1] = 1;
        cuts4[2] = S / 4;
        cuts4[3] = S / 2 + 7;
        cuts4[4] = S;
        for (i = 0; i < 2; i++) {
            add_req(&c, 1, cuts2[i + 1] - cuts2[i]);
            c.alias[c.nreq - 1] = 7;
            c.alias_off[c.nreq - 1] = cuts2[i];
        }
        for (i = 0; i < 4; i++) {
            add_req(&c, 1, cuts4[i + 1] - cuts4[i]);
            c.alias[c.nreq - 1] = 7;
            c.alias_off[c.nreq - 1] = cuts4[i];
        }
        add_req(&c, 1, S);
    }
    memset(&res, 0, sizeof res);
    HR = H * R;
    REQUIRE(world_open(&w, &c, 0));
    run_mqa(&w, w.meta, 0, "shards", &res);
    if (res.lat) {
        int first = 0, k;
        for (k = 0; k < 2; k++) {
            int ns = nshards_list[k];
            float *acc = (float *)xmalloc((size_t)HR * sizeof(float)),
                  *accl = (float *)xmalloc((size_t)H * sizeof(float));
            attn_tensor ta = t3(acc, ATTN_DTYPE_F32, 1, H, R), tla = t2(accl, 1, H);
            memcpy(acc, res.lat + (size_t)first * HR, (size_t)HR * sizeof(float));
            memcpy(accl, res.lse + (size_t)first * H, (size_t)H * sizeof(float));
            for (s = 1; s < ns; s++) { /* acc = merge(acc, shard s), out aliasing out_a */
                attn_tensor tb = t3(res.lat + (size_t)(first + s) * HR, ATTN_DTYPE_F32, 1, H, R);
                attn_tensor tlb = t2(res.lse + (size_t)(first + s) * H, 1, H);
                EXPECT_OK(attn_merge_attn_states(w.ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb,
                                                 ATTN_LSE_BASE_E, &ta, &tla, ATTN_LSE_BASE_E, NULL));
            }
            for (x = 0; x < HR; x++)
                if (!attn_test_near(acc[x], res.lat[(size_t)6 * HR + x], 2e-6, 2e-5)) {
                    attn_test_fail(__FILE__, __LINE__, "%d shards merged: out[%d] = %.9g, whole %.9g", ns, x,
                                   (double)acc[x], (double)res.lat[(size_t)6 * HR + x]);
                    break;
                }
            for (x = 0; x < H; x++) EXPECT_NEAR(accl[x], res.lse[(size_t)6 * H + x], 2e-5, 0);
            /* and against the float64 reference of the whole sequence */
            for (x = 0; x < w.nref; x++) {
                int h = w.refh[x], e;
                const double *want = w.ref_lat + ((size_t)6 * (size_t)w.nref + (size_t)x) * (size_t)R;
                double rms = rms_of(want, R);
                for (e = 0; e < R; e++)
                    if (!attn_test_near(acc[(size_t)h * R + e], want[e], 1e-4 * rms, 1e-4)) {
                        attn_test_fail(__FILE__, __LINE__,
                                       "%d shards merged vs reference: head %d [%d] %.9g vs %.9g", ns, h, e,
                                       (double)acc[(size_t)h * R + e], want[e]);
                        break;
                    }
                EXPECT_NEAR(accl[h], w.ref_lse[(size_t)6 * (size_t)w.nref + (size_t)x], 1e-4, 0);
            }
            free(acc);
            free(accl);
            first += ns;
        }
        /* base 2 and mixed bases: the 2-shard merge again */
        {
            const double LOG2E = 1.4426950408889634;
            float *oe = (float *)xmalloc((size_t)HR * sizeof(float)),
                  *le = (float *)xmalloc((size_t)H * sizeof(float));
            float *o2 = (float *)xmalloc((size_t)HR * sizeof(float)),
                  *l2 = (float *)xmalloc((size_t)H * sizeof(float));
            float *la2 = (float *)xmalloc((size_t)H * sizeof(float)),
                  *lb2 = (float *)xmalloc((size_t)H * sizeof(float));
            attn_tensor ta = t3(res.lat, ATTN_DTYPE_F32, 1, H, R),
                        tb = t3(res.lat + HR, ATTN_DTYPE_F32, 1, H, R);
            attn_tensor tla = t2(res.lse, 1, H), tlb = t2(res.lse + H, 1, H), tla2 = t2(la2, 1, H),
                        tlb2 = t2(lb2, 1, H);
            attn_tensor toe = t3(oe, ATTN_DTYPE_F32, 1, H, R), tle = t2(le, 1, H),
                        to2 = t3(o2, ATTN_DTYPE_F32, 1, H, R), tl2 = t2(l2, 1, H);
            int combo;
            for (x = 0; x < H; x++) {
                la2[x] = (float)(res.lse[x] * LOG2E);
                lb2[x] = (float)(res.lse[H + x] * LOG2E);
            }
            poison(oe, ATTN_DTYPE_F32, (size_t)HR);
            poison(le, ATTN_DTYPE_F32, (size_t)H);
            EXPECT_OK(attn_merge_attn_states(w.ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E,
                                             &toe, &tle, ATTN_LSE_BASE_E, NULL));
            for (combo = 0; combo < 4; combo++) {
                /* 0: 2+2 -> e, 1: 2+e -> 2, 2: e+2 -> e, 3: 2+2 -> 2 */
                attn_lse_base ba = combo == 2 ? ATTN_LSE_BASE_E : ATTN_LSE_BASE_2;
                attn_lse_base bb = combo == 1 ? ATTN_LSE_BASE_E : ATTN_LSE_BASE_2;
                attn_lse_base bo = (combo & 1) ? ATTN_LSE_BASE_2 : ATTN_LSE_BASE_E;
                poison(o2, ATTN_DTYPE_F32, (size_t)HR);
                poison(l2, ATTN_DTYPE_F32, (size_t)H);
                EXPECT_OK(attn_merge_attn_states(w.ctx, &ta, ba == ATTN_LSE_BASE_2 ? &tla2 : &tla, ba, &tb,
                                                 bb == ATTN_LSE_BASE_2 ? &tlb2 : &tlb, bb, &to2, &tl2, bo, NULL));
                for (x = 0; x < HR; x++)
                    if (!attn_test_near(o2[x], oe[x], 1e-6, 1e-5)) {
                        attn_test_fail(__FILE__, __LINE__,
                                       "bases combo %d: out[%d] = %.9g, base-e merge %.9g", combo, x,
                                       (double)o2[x], (double)oe[x]);
                        break;
                    }
                for (x = 0; x < H; x++)
                    EXPECT_NEAR(l2[x], bo == ATTN_LSE_BASE_2 ? le[x] * LOG2E : (double)le[x], 1e-5, 1e-6);
            }
            free(oe);
            free(le);
            free(o2);
            free(l2);
            free(la2);
            free(lb2);
        }
    }
    free(res.lat);
    free(res.lse);
    world_free(&w);
}

/* Empty partitions, aliasing, several rows, half-precision outputs. */
ATTN_TEST(test_mla_merge_edges) {
    enum { T = 3, H = 5, D = 40, n = T * H * D };
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEBUG, 1);
    float oa[n], ob[n], oo[n], ref[n];
    float la[15], lb[15], lo[15], lref[15], linf[15];
    attn_tensor ta = t3(oa, ATTN_DTYPE_F32, T, H, D), tb = t3(ob, ATTN_DTYPE_F32, T, H, D);
    attn_tensor to = t3(oo, ATTN_DTYPE_F32, T, H, D), tr = t3(ref, ATTN_DTYPE_F32, T, H, D);
    attn_tensor tla = t2(la, T, H), tlb = t2(lb, T, H), tlo = t2(lo, T, H), tlr = t2(lref, T, H),
                tinf = t2(linf, T, H);
    int x, i;
    rng r;
    REQUIRE(ctx != NULL);
    rng_seed(&r, 42);
    for (x = 0; x < n; x++) {
        oa[x] = rng_nz(&r, 1.0f);
        ob[x] = rng_nz(&r, 1.0f);
    }
    for (x = 0; x < T * H; x++) {
        la[x] = rng_uniform(&r, -3, 8);
        lb[x] = rng_uniform(&r, -3, 8);
        linf[x] = -INFINITY;
    }
    la[0] = 50.0f;
    lb[0] = -40.0f; /* one side dominates */
    la[1] = 2.5f;
    lb[1] = 2.5f; /* equal */

    /* float64 check of the formula, row by row */
    EXPECT_OK(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &tr, &tlr,
                                     ATTN_LSE_BASE_E, NULL));
    for (i = 0; i < T * H; i++) {
        double m = la[i] > lb[i] ? la[i] : lb[i], wa = exp(la[i] - m), wb = exp(lb[i] - m);
        EXPECT_NEAR(lref[i], m + log(wa + wb), 1e-5, 1e-6);
        for (x = 0; x < D; x++)
            EXPECT_NEAR(ref[(size_t)i * D + x],
                        (wa * oa[(size_t)i * D + x] + wb * ob[(size_t)i * D + x]) / (wa + wb), 1e-6, 1e-5);
    }
    /* out aliasing out_a, and out_b: the same result */
    {
        float *ca = (float *)xmalloc((size_t)n * sizeof(float)), cla[15];
        attn_tensor tca = t3(ca, ATTN_DTYPE_F32, T, H, D), tcla = t2(cla, T, H);
        memcpy(ca, oa, (size_t)n * sizeof(float));
        memcpy(cla, la, sizeof cla);
        EXPECT_OK(attn_merge_attn_states(ctx, &tca, &tcla, ATTN_LSE_BASE_E, &tb, &tlb, ATTN_LSE_BASE_E, &tca,
                                         &tcla, ATTN_LSE_BASE_E, NULL));
        EXPECT_TRUE(memcmp(ca, ref, (size_t)n * sizeof(float)) == 0);
        EXPECT_TRUE(memcmp(cla, lref, sizeof cla) == 0);
        memcpy(ca, ob, (size_t)n * sizeof(float));
        EXPECT_OK(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tca, &tlb, ATTN_LSE_BASE_E, &tca,
                                         NULL, ATTN_LSE_BASE_E, NULL));
        EXPECT_TRUE(memcmp(ca, ref, (size_t)n * sizeof(float)) == 0);
        free(ca);
    }
    /* an empty b (LSE -inf, finite or NaN garbage in its output) leaves a; an empty a with
       finite garbage leaves b (NaN garbage in an empty a: test_mla_merge_empty_nan) */
    for (i = 0; i < 2; i++) {
        float *garbage = (float *)xmalloc((size_t)n * sizeof(float));
        attn_tensor tg = t3(garbage, ATTN_DTYPE_F32, T, H, D);
        for (x = 0; x < n; x++) garbage[x] = i ? NAN : 1e6f;
        poison(oo, ATTN_DTYPE_F32, (size_t)n);
        poison(lo, ATTN_DTYPE_F32, 15);
        EXPECT_OK(attn_merge_attn_states(ctx, &ta, &tla, ATTN_LSE_BASE_E, &tg, &tinf, ATTN_LSE_BASE_E, &to,
                                         &tlo, ATTN_LSE_BASE_E, NULL));
        for (x = 0; x < n; x++)
            if (!attn_test_near(oo[x], oa[x], 1e-7, 1e-6)) {
                attn_test_fail(__FILE__, __LINE__, "empty b (%s): out[%d] = %g, a %g", i ? "NaN" : "finite",
                               x, (double)oo[x], (double)oa[x]);
                break;
            }
        for (x = 0; x < T * H; x++) EXPECT_NEAR(lo[x], la[x], 1e-6, 1e-6);
        if (i == 0) {
            poison(oo, ATTN_DTYPE_F32, (size_t)n);
            EXPECT_OK(attn_merge_attn_states(ctx, &tg, &tinf, ATTN_LSE_BASE_2, &tb, &tlb, ATTN_LSE_BASE_E,
                                             &to, &tlo, ATTN_LSE_BASE_E, NULL));
            for (x = 0; x < n; x++)
                if (!attn_test_near(oo[x], ob[x], 1e-7, 1e-6)) {
                    attn_test_fail(__FILE__, __LINE__, "empty a: out[%d] = %g, b %g", x, (double)oo[x],
                                   (double)ob[x]);
                    break;
                }
            for (x = 0; x < T * H; x++) EXPECT_NEAR(lo[x], lb[x], 1e-6, 1e-6);
        }
        /* both empty: out 0, lse -inf, no NaN, in either output base */
        poison(oo, ATTN_DTYPE_F32, (size_t)n);
        poison(lo, ATTN_DTYPE_F32, 15);
        EXPECT_OK(attn_merge_attn_states(ctx, &tg, &tinf, ATTN_LSE_BASE_E, &tg, &tinf, ATTN_LSE_BASE_2, &to,
                                         &tlo, i ? ATTN_LSE_BASE_2 : ATTN_LSE_BASE_E, NULL));
        for (x = 0; x < n; x++)
            if (oo[x] != 0.0f) {
                attn_test_fail(__FILE__, __LINE__, "both empty: out[%d] = %g", x, (double)oo[x]);
                break;
            }
        for (x = 0; x < T * H; x++) EXPECT_TRUE(lo[x] == -INFINITY);
        free(garbage);
    }
    /* half-precision outputs merge within their rounding */
    {
        static const attn_dtype dts[] = {ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
        int k;
        for (k = 0; k < 2; k++) {
            attn_dtype dt = dts[k];
            void *ha = xmalloc((size_t)n * 2), *hb = xmalloc((size_t)n * 2), *ho = xmalloc((size_t)n * 2);
            attn_tensor tha = t3(ha, dt, T, H, D), thb = t3(hb, dt, T, H, D), tho = t3(ho, dt, T, H, D);
            for (x = 0; x < n; x++) {
                put(ha, dt, (size_t)x, oa[x]);
                put(hb, dt, (size_t)x, ob[x]);
            }
            poison(ho, dt, (size_t)n);
            EXPECT_OK(attn_merge_attn_states(ctx, &tha, &tla, ATTN_LSE_BASE_E, &thb, &tlb, ATTN_LSE_BASE_E,
                                             &tho, NULL, ATTN_LSE_BASE_E, NULL));
            for (x = 0; x < n; x++)
                if (!attn_test_near(get(ho, dt, (size_t)x), ref[x], 2e-2, 1e-2)) {
                    attn_test_fail(__FILE__, __LINE__, "%s merge: out[%d] = %g, f32 %g", attn_dtype_name(dt),
                                   x, (double)get(ho, dt, (size_t)x), (double)ref[x]);
                    break;
                }
            free(ha);
            free(hb);
            free(ho);
        }
    }
    attn_context_destroy(ctx);
}

/* An empty partition "contributes nothing" whichever side it is on: with NaN in the
   unused output of the empty side (a buffer nobody wrote), merge(a, b) and merge(b, a)
   both give the other side. */
ATTN_TEST(test_mla_merge_empty_nan) {
    enum { H = 4, D = 64, n = H * D };
    attn_context *ctx = attn_test_context(NULL, ATTN_LOG_LEVEL_DEBUG, 1);
    float ov[n], og[n], oo[n];
    float lv[4] = {1.5f, -2.0f, 0.25f, 7.0f}, lg[4], lo[4];
    attn_tensor tv = t3(ov, ATTN_DTYPE_F32, 1, H, D), tg = t3(og, ATTN_DTYPE_F32, 1, H, D),
                to = t3(oo, ATTN_DTYPE_F32, 1, H, D);
    attn_tensor tlv = t2(lv, 1, H), tlg = t2(lg, 1, H), tlo = t2(lo, 1, H);
    int x, side;
    REQUIRE(ctx != NULL);
    for (x = 0; x < n; x++) {
        ov[x] = 0.01f * (float)(x % 37 + 1);
        og[x] = NAN;
    }
    for (x = 0; x < H; x++) lg[x] = -INFINITY;
    for (side = 0; side < 2; side++) {
        int bad = 0;
        poison(oo, ATTN_DTYPE_F32, (size_t)n);
        poison(lo, ATTN_DTYPE_F32, 4);
        if (side == 0) /* empty b */
            EXPECT_OK(attn_merge_attn_states(ctx, &tv, &tlv, ATTN_LSE_BASE_E, &tg, &tlg, ATTN_LSE_BASE_E, &to,
                                             &tlo, ATTN_LSE_BASE_E, NULL));
        else /* empty a */
            EXPECT_OK(attn_merge_attn_states(ctx, &tg, &tlg, ATTN_LSE_BASE_E, &tv, &tlv, ATTN_LSE_BASE_E, &to,
                                             &tlo, ATTN_LSE_BASE_E, NULL));
        for (x = 0; x < n && !bad; x++)
            if (!attn_test_near(oo[x], ov[x], 1e-7, 1e-6)) {
                attn_test_fail(
                    __FILE__, __LINE__,
                    "empty %s (LSE -inf, NaN in its out): merged out[%d] = %g, expected the other side's %g",
                    side ? "a" : "b", x, (double)oo[x], (double)ov[x]);
                bad = 1;
            }
        for (x = 0; x < H; x++) EXPECT_NEAR(lo[x], lv[x], 1e-6, 1e-6);
    }
    attn_context_destroy(ctx);
}

void suite_mla_merge(void) {
    ATTN_RUN(test_mla_merge_edges);
    ATTN_RUN(test_mla_merge_empty_nan);
    ATTN_RUN(test_mla_split_invariance);
    ATTN_RUN(test_mla_split_empty);
    ATTN_RUN(test_mla_batch_invariant);
    ATTN_RUN(test_mla_merge_shards);
}
