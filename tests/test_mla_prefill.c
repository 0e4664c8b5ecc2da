/* MLA prefills on CPU_MLA: the up-projected attn_mla_forward_mha and the fused call over
   prefill-only batches — chunked prefills with context before them, fresh prefills, tiny
   ones and ones across a tile boundary, the 576- and 320-wide latents — and a prefill over
   more keys than one up-projection chunk (merged by LSE across chunks). Checked against
   the float64 unabsorbed reference of tests/mla_fixtures.h. */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "mla_fixtures.h"

/* A prefill-only world (chunked prefill with earlier context, fresh prefills):
   forward_mha and the fused call. */
ATTN_TEST(test_mla_prefill_576) {
    static const attn_dtype dts[][2] = {{ATTN_DTYPE_F32, ATTN_DTYPE_F32},
                                        {ATTN_DTYPE_F16, ATTN_DTYPE_F32},
                                        {ATTN_DTYPE_BF16, ATTN_DTYPE_BF16}};
    int i;
    for (i = 0; i < 3; i++) {
        mcfg c;
        mworld w;
        char tag[96];
        base_cfg(&c, 16, 512, dts[i][0], dts[i][1]);
        c.seed = 500 + (uint64_t)i;
        c.nref = 4;
        c.bs = i == 1 ? 32 : 16;
        c.write_new = i != 2;              /* bf16: the fused call writes the cache first */
        add_req(&c, 37, scaled(400, 120)); /* chunked prefill: context before */
        add_req(&c, 70, 70);               /* fresh prefill */
        add_req(&c, 2, 2);
        add_req(&c, 33, 34); /* one key of context, a tile boundary */
        if (!world_open(&w, &c, 0)) continue; /* this case only: the failure is recorded */
        check_counts(&w, 0, -1, 4, w.ntok);
        if (!c.write_new) {
            snprintf(tag, sizeof tag, "prefill %s fused (writes cache)", attn_dtype_name(c.dt));
            run_fused(&w, w.meta, 1, tag, NULL);
        }
        snprintf(tag, sizeof tag, "prefill %s/%s mha", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
        run_mha(&w, w.meta, tag);
        snprintf(tag, sizeof tag, "prefill %s/%s fused", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
        run_fused(&w, w.meta, 0, tag, NULL);
        world_free(&w);
    }
}

ATTN_TEST(test_mla_prefill_320) {
    mcfg c;
    mworld w;
    base_cfg(&c, 16, 256, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.nref = 6;
    c.seed = 3200;
    add_req(&c, 45, scaled(500, 100));
    add_req(&c, 64, 64);
    REQUIRE(world_open(&w, &c, 0));
    run_mha(&w, w.meta, "prefill 320 bf16 mha");
    run_fused(&w, w.meta, 0, "prefill 320 bf16 fused", NULL);
    world_free(&w);
}

/* A prefill over more keys than info.prefill_chunk: the chunked up-projection with LSE
   merging across chunks (H = 128, where a chunk is a few hundred keys). */
ATTN_TEST(test_mla_prefill_longer_than_chunk) {
    mcfg c;
    mworld w;
    int chunk;
    /* the chunk size of this layer shape, from a tiny batch */
    chunk = probe_chunk(128);
    REQUIRE(chunk >= 64 && chunk % 64 == 0);
    EXPECT_TRUE(chunk <= 1024); /* small for 128 heads, so this test is affordable */
    REQUIRE(chunk <= 2048);     /* (beyond, the float64 reference would take too long) */
    /* fewer heads, a larger chunk: never fewer keys than for more heads */
    EXPECT_TRUE(probe_chunk(16) >= chunk);

    base_cfg(&c, 128, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.nref = 3;
    c.seed = 4096;
    c.bs = 64;
    add_req(&c, 40, chunk + 100); /* chunked prefill: keys span two chunks */
    if (test_scale() >= 1.0)
        add_req(&c, chunk + 30, chunk + 30); /* fresh prefill, the causal edge crosses a chunk */
    REQUIRE(world_open(&w, &c, 0));
    EXPECT_EQ_INT(w.info.prefill_chunk, chunk);
    EXPECT_TRUE(w.info.num_prefill_tokens == 40 + (c.nreq > 1 ? chunk + 30 : 0));
    run_mha(&w, w.meta, "long prefill H128 mha");
    if (test_scale() >= 1.0) run_fused(&w, w.meta, 0, "long prefill H128 fused", NULL);
    world_free(&w);
}

void suite_mla_prefill(void) {
    ATTN_RUN(test_mla_prefill_576);
    ATTN_RUN(test_mla_prefill_320);
    ATTN_RUN(test_mla_prefill_longer_than_chunk);
}
