/* MLA decodes on CPU_MLA: the absorbed attn_mla_forward_mqa (q as [q_latent | q_pe] and as
   q_latent with a separate q_pe) and the fused call over decode-only batches, at 16 and
   128 heads, the 576- and 320-wide latents, 16-bit and f32 caches; speculative decodes
   (several tokens per decode, causal among them). Checked against the float64 unabsorbed
   reference of tests/mla_fixtures.h. */
#include "attn.h"
#include "attn_test.h"
#include "fixtures.h"
#include "mla_fixtures.h"

/* A decode-only world: forward_mqa in both q forms, and the fused call (cache already
   written, then once more writing the new tokens itself). */
static void decode_world(mcfg *c, const char *name) {
    mworld w;
    char tag[128];
    if (!world_open(&w, c, 0)) return; /* this case only: the failure is recorded */
    check_counts(&w, c->nreq, -1, 0, 0);
    snprintf(tag, sizeof tag, "%s mqa q[%d]", name, w.D);
    run_mqa(&w, w.meta, 0, tag, NULL);
    snprintf(tag, sizeof tag, "%s mqa q_latent+q_pe", name);
    run_mqa(&w, w.meta, 1, tag, NULL);
    snprintf(tag, sizeof tag, "%s fused (cached)", name);
    run_fused(&w, w.meta, 0, tag, NULL);
    snprintf(tag, sizeof tag, "%s fused (writes cache)", name);
    run_fused(&w, w.meta, 1, tag, NULL);
    world_free(&w);
}

ATTN_TEST(test_mla_decode_576_h16) {
    static const attn_dtype dts[][2] = {{ATTN_DTYPE_F32, ATTN_DTYPE_F32},
                                        {ATTN_DTYPE_F16, ATTN_DTYPE_F16},
                                        {ATTN_DTYPE_BF16, ATTN_DTYPE_BF16},
                                        {ATTN_DTYPE_F32, ATTN_DTYPE_BF16}};
    int i;
    for (i = 0; i < 4; i++) {
        mcfg c;
        char name[64];
        base_cfg(&c, 16, 512, dts[i][0], dts[i][1]);
        c.seed += (uint64_t)i;
        c.bs = i == 3 ? 64 : 16;
        c.nref = 4;
        ADD_REQS(&c, {1, 1}, {1, 17}, {1, scaled(700, 130)},
                 {1, i == 0 ? scaled(3000, 600) : scaled(1500, 300)});
        snprintf(name, sizeof name, "H16 %s/%s", attn_dtype_name(c.dt), attn_dtype_name(c.kvdt));
        decode_world(&c, name);
    }
}

ATTN_TEST(test_mla_decode_576_h128) {
    mcfg c;
    base_cfg(&c, 128, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.nref = 3;
    c.bs = 32;
    ADD_REQS(&c, {1, 5}, {1, scaled(600, 100)}, {1, scaled(1800, 400)});
    decode_world(&c, "H128 f32");
    base_cfg(&c, 128, 512, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16);
    c.nref = 3;
    c.seed = 77;
    add_req(&c, 1, 2);
    add_req(&c, 1, scaled(1000, 200));
    decode_world(&c, "H128 bf16");
}

ATTN_TEST(test_mla_decode_320) {
    mcfg c;
    base_cfg(&c, 16, 256, ATTN_DTYPE_F16, ATTN_DTYPE_F16);
    c.nref = 8;
    ADD_REQS(&c, {1, 1}, {1, 40}, {1, scaled(1200, 300)});
    decode_world(&c, "320 H16 f16");
    base_cfg(&c, 32, 256, ATTN_DTYPE_F32, ATTN_DTYPE_F16);
    c.nref = 4;
    c.threads = 3;
    c.seed = 99;
    add_req(&c, 1, 3);
    add_req(&c, 1, scaled(900, 200));
    decode_world(&c, "320 H32 f32/f16");
}

/* Speculative-decode style decodes (query_len <= decode_threshold > 1) take the absorbed
   path with causal masking inside the request. */
ATTN_TEST(test_mla_decode_multi_token) {
    mcfg c;
    mworld w;
    base_cfg(&c, 16, 512, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    c.decode_threshold = 4;
    c.nref = 4;
    add_req(&c, 3, 3); /* all three keys are new */
    ADD_REQS(&c, {4, 300}, {1, 50}, {2, scaled(1300, 300)});
    add_req(&c, 9, 200); /* a prefill after them */
    REQUIRE(world_open(&w, &c, 0));
    check_counts(&w, 4, 10, 1, 9);
    run_mqa(&w, w.meta, 0, "spec-decode mqa", NULL);
    run_mqa(&w, w.meta, 1, "spec-decode mqa split q", NULL);
    run_mha(&w, w.meta, "spec-decode mha");
    run_fused(&w, w.meta, 1, "spec-decode fused", NULL);
    world_free(&w);
}

void suite_mla_decode(void) {
    ATTN_RUN(test_mla_decode_576_h16);
    ATTN_RUN(test_mla_decode_576_h128);
    ATTN_RUN(test_mla_decode_320);
    ATTN_RUN(test_mla_decode_multi_token);
}
