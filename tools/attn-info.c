/* attn-info — print the platform and the backend selection record for a layer config.

   Works with or without a GPU: the record says which backend a layer with these
   parameters would get, where the choice came from (code, env ATTN_BACKEND, automatic),
   and every candidate that was skipped and why. Log lines go to stderr (default logger),
   the platform and the record to stdout.

   Exit status: 0 resolved, 1 resolution failed (the record says why), 2 bad flags. */
#define ATTN_IMPLEMENTATION
#include "attn.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "attn-info";

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s [flags]\n"
            "Prints the platform and the attention-backend selection record for one layer.\n"
            "\n"
            "layer:\n"
            "  --heads N              query heads (default 32)\n"
            "  --kv-heads N           KV heads, a divisor of --heads (default 8; 1 with --mla)\n"
            "  --head-size N          head size (default 128; 576 with --mla)\n"
            "  --dtype T              q/k/v/out type: f32 | f16 | bf16 (default f16)\n"
            "  --kv-cache-dtype T     KV-cache type: auto | f32 | f16 | bf16 | fp8 (= fp8_e4m3) |\n"
            "                         fp8_e5m2 | int8 (default auto = dtype); fp8 caches take a\n"
            "                         scale per tensor (--k-scale, --v-scale), int8 one per token\n"
            "                         and head (--per-token-head, implied by int8)\n"
            "  --k-scale X, --v-scale X  an fp8 cache's per-tensor scales, X > 0 (default 1)\n"
            "  --per-token-head       int8 / fp8_e4m3 caches with a scale per token and KV head,\n"
            "                         stored in the cache by the cache write\n"
            "  --block-size N         tokens per KV-cache block, a multiple of 16 (default 16)\n"
            "  --sliding-window N     attend to the last N positions only (default 0 = off)\n"
            "  --soft-cap X           logits soft cap, X > 0 (default 0 = off)\n"
            "  --non-causal           bidirectional attention (default causal)\n"
            "  --alibi                ALiBi slopes (the standard geometric sequence)\n"
            "  --sinks                attention sinks (gpt-oss), a logit per query head\n"
            "  --mla                  multi-head latent attention: kv_lora_rank 512,\n"
            "                         qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128\n"
            "  --device D             where the layer's tensors live: cpu | cuda (default cpu)\n"
            "selection:\n"
            "  --backend NAME         request a backend in code (beats env ATTN_BACKEND)\n"
            "  --allow-fallback       degrade an explicit request to the automatic choice\n"
            "  --help                 this text\n"
            "\n"
            "environment: ATTN_BACKEND (force a backend by name), ATTN_LOG_LEVEL,\n"
            "ATTN_NUM_THREADS, ATTN_CPU_SIMD (auto | avx512 | avx2 | c: the CPU inner loops;\n"
            "the platform's cpu_simd and cpu_simd_reason say which run and why).\n"
            "exit status: 0 resolved, 1 resolution failed (the record says why), 2 bad flags.\n",
            prog);
}

/* Every flag error ends here: one line naming the flag and what is allowed. */
static void bad_flag(const char *flag, const char *value, const char *allowed) {
    if (value)
        fprintf(stderr, "%s: %s: '%s' is not allowed (allowed: %s)\n", prog, flag, value, allowed);
    else
        fprintf(stderr, "%s: %s: %s\n", prog, flag, allowed);
    fprintf(stderr, "%s: see --help\n", prog);
    exit(2);
}

static int parse_int(const char *flag, const char *s, long lo, long hi, const char *allowed) {
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) bad_flag(flag, s, allowed);
    return (int)v;
}

static float parse_float(const char *flag, const char *s, const char *allowed) {
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0.0) || v > 3.0e38) bad_flag(flag, s, allowed);
    return (float)v;
}

/* An element type by the library's names (attn_dtype_from_name: f16 / float16, fp8, ...);
   cache: the KV-cache flag, which also takes auto and the 8-bit types. */
static attn_dtype parse_dtype(const char *flag, const char *s, int cache) {
    const char *allowed = cache ? "auto, f32, f16, bf16, fp8 (= fp8_e4m3), fp8_e5m2, int8" : "f32, f16, bf16";
    attn_dtype d = ATTN_DTYPE_AUTO;
    if (cache && strcmp(s, "auto") == 0) return ATTN_DTYPE_AUTO;
    if (attn_dtype_from_name(s, &d) != ATTN_OK || (!cache && d != ATTN_DTYPE_F32 && d != ATTN_DTYPE_F16 &&
                                                   d != ATTN_DTYPE_BF16))
        bad_flag(flag, s, allowed);
    return d;
}

/* Prints a formatted block through a buffer sized by a first call (snprintf style). */
static void print_formatted(size_t (*format)(const void *, char *, size_t), const void *obj) {
    size_t need = format(obj, NULL, 0);
    char *buf = (char *)malloc(need + 1);
    if (!buf) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    format(obj, buf, need + 1);
    fputs(buf, stdout);
    free(buf);
}
static size_t format_platform(const void *p, char *buf, size_t size) {
    return attn_platform_format((const attn_platform *)p, buf, size);
}
static size_t format_selection(const void *s, char *buf, size_t size) {
    return attn_selection_format((const attn_selection *)s, buf, size);
}

int main(int argc, char **argv) {
    attn_layer_desc desc;
    attn_select_request request;
    attn_selection selection;
    attn_platform platform;
    attn_context *ctx = NULL;
    attn_status st;
    const char *backend_name = NULL;
    int kv_heads_given = 0, head_size_given = 0, alibi = 0, sinks = 0, per_token_head = 0, i;
    float k_scale = 0.0f, v_scale = 0.0f;
    float *slopes = NULL, *sink_values = NULL;
    void *sinks_dev = NULL;

    memset(&desc, 0, sizeof desc);
    memset(&request, 0, sizeof request);
    desc.num_heads = 32;
    desc.num_kv_heads = 8;
    desc.head_size = 128;
    desc.dtype = ATTN_DTYPE_F16;
    desc.kv_cache_dtype = ATTN_DTYPE_AUTO;
    desc.block_size = 16;

    for (i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = NULL;
        char flag[64];
        const char *eq = strchr(arg, '=');
        /* Accept both "--flag value" and "--flag=value". */
        if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof flag) {
            memcpy(flag, arg, (size_t)(eq - arg));
            flag[eq - arg] = 0;
            val = eq + 1;
        } else {
            snprintf(flag, sizeof flag, "%s", arg);
        }
#define NEEDS_VALUE(allowed)                                                       \
    do {                                                                           \
        if (!val) {                                                                \
            if (i + 1 >= argc) bad_flag(flag, NULL, "missing value (" allowed ")"); \
            val = argv[++i];                                                       \
        }                                                                          \
    } while (0)
#define NO_VALUE()                                                                 \
    do {                                                                           \
        if (val) bad_flag(flag, val, "no value, it is a switch");                  \
    } while (0)
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(flag, "--heads") == 0) {
            NEEDS_VALUE("an integer 1..65536");
            desc.num_heads = parse_int(flag, val, 1, 65536, "an integer 1..65536");
        } else if (strcmp(flag, "--kv-heads") == 0) {
            NEEDS_VALUE("an integer 1..65536 dividing --heads");
            desc.num_kv_heads = parse_int(flag, val, 1, 65536, "an integer 1..65536 dividing --heads");
            kv_heads_given = 1;
        } else if (strcmp(flag, "--head-size") == 0) {
            NEEDS_VALUE("an integer 1..65536");
            desc.head_size = parse_int(flag, val, 1, 65536, "an integer 1..65536");
            head_size_given = 1;
        } else if (strcmp(flag, "--dtype") == 0) {
            NEEDS_VALUE("f32, f16, bf16");
            desc.dtype = parse_dtype(flag, val, 0);
        } else if (strcmp(flag, "--kv-cache-dtype") == 0) {
            NEEDS_VALUE("auto, f32, f16, bf16, fp8, fp8_e5m2, int8");
            desc.kv_cache_dtype = parse_dtype(flag, val, 1);
        } else if (strcmp(flag, "--k-scale") == 0 || strcmp(flag, "--v-scale") == 0) {
            NEEDS_VALUE("a finite number > 0");
            *(flag[2] == 'k' ? &k_scale : &v_scale) = parse_float(flag, val, "a finite number > 0");
            if (!(*(flag[2] == 'k' ? &k_scale : &v_scale) > 0.0f)) bad_flag(flag, val, "a finite number > 0");
        } else if (strcmp(flag, "--per-token-head") == 0) {
            NO_VALUE();
            per_token_head = 1;
        } else if (strcmp(flag, "--block-size") == 0) {
            NEEDS_VALUE("a positive multiple of 16");
            desc.block_size = parse_int(flag, val, 16, 1 << 20, "a positive multiple of 16");
            if (desc.block_size % 16) bad_flag(flag, val, "a positive multiple of 16");
        } else if (strcmp(flag, "--sliding-window") == 0) {
            NEEDS_VALUE("an integer >= 0, 0 = off");
            desc.sliding_window = parse_int(flag, val, 0, INT_MAX, "an integer >= 0, 0 = off");
        } else if (strcmp(flag, "--soft-cap") == 0) {
            NEEDS_VALUE("a finite number >= 0, 0 = off");
            desc.logits_soft_cap = parse_float(flag, val, "a finite number >= 0, 0 = off");
        } else if (strcmp(flag, "--non-causal") == 0) {
            NO_VALUE();
            desc.causal = ATTN_CAUSAL_NO;
        } else if (strcmp(flag, "--alibi") == 0) {
            NO_VALUE();
            alibi = 1;
        } else if (strcmp(flag, "--sinks") == 0) {
            NO_VALUE();
            sinks = 1;
        } else if (strcmp(flag, "--mla") == 0) {
            NO_VALUE();
            desc.use_mla = 1;
        } else if (strcmp(flag, "--device") == 0) {
            NEEDS_VALUE("cpu | cuda");
            if (strcmp(val, "cpu") == 0) desc.device = ATTN_DEVICE_CPU;
            else if (strcmp(val, "cuda") == 0) desc.device = ATTN_DEVICE_CUDA;
            else bad_flag(flag, val, "cpu | cuda");
        } else if (strcmp(flag, "--backend") == 0) {
            NEEDS_VALUE("a backend name");
            backend_name = val;
        } else if (strcmp(flag, "--allow-fallback") == 0) {
            NO_VALUE();
            request.allow_fallback = 1;
        } else {
            bad_flag(flag, NULL, "unknown flag (allowed: --heads, --kv-heads, --head-size, "
                                 "--dtype, --kv-cache-dtype, --k-scale, --v-scale, --per-token-head, "
                                 "--block-size, --sliding-window, "
                                 "--soft-cap, --non-causal, --alibi, --sinks, --mla, --device, --backend, "
                                 "--allow-fallback, --help)");
        }
#undef NEEDS_VALUE
#undef NO_VALUE
    }

    if (desc.use_mla) {
        /* DeepSeek-V2/V3 shapes: the latent cache row is kv_lora_rank + qk_rope_head_dim,
           shared by all query heads (one KV head). */
        desc.kv_lora_rank = 512;
        desc.qk_rope_head_dim = 64;
        desc.qk_nope_head_dim = 128;
        desc.v_head_dim = 128;
        if (!head_size_given) desc.head_size = 576;
        if (!kv_heads_given) desc.num_kv_heads = 1;
    }
    /* 8-bit caches: int8 takes its scales per token and head only; fp8 per tensor needs
       scales, 1 unless given (the record does not depend on their values) */
    if (desc.kv_cache_dtype == ATTN_DTYPE_INT8) per_token_head = 1;
    if (per_token_head) {
        if (k_scale > 0.0f || v_scale > 0.0f)
            bad_flag("--k-scale/--v-scale", NULL, "not with --per-token-head (the cache write computes a scale per row)");
        if (desc.kv_cache_dtype != ATTN_DTYPE_INT8 && desc.kv_cache_dtype != ATTN_DTYPE_FP8_E4M3)
            bad_flag("--per-token-head", NULL, "needs --kv-cache-dtype int8 or fp8_e4m3");
        desc.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD;
    } else if (desc.kv_cache_dtype == ATTN_DTYPE_FP8_E4M3 || desc.kv_cache_dtype == ATTN_DTYPE_FP8_E5M2) {
        desc.k_scale.value = k_scale > 0.0f ? k_scale : 1.0f;
        desc.v_scale.value = v_scale > 0.0f ? v_scale : 1.0f;
    } else if (k_scale > 0.0f || v_scale > 0.0f) {
        bad_flag("--k-scale/--v-scale", NULL, "only with an fp8 --kv-cache-dtype");
    }
    if (desc.num_heads % desc.num_kv_heads) {
        char v[48], allowed[64];
        snprintf(v, sizeof v, kv_heads_given ? "%d" : "%d (the default)", desc.num_kv_heads);
        snprintf(allowed, sizeof allowed, "a divisor of --heads %d", desc.num_heads);
        bad_flag("--kv-heads", v, allowed);
    }

    /* A backend named on the command line is a request *in code*: it beats ATTN_BACKEND. */
    if (backend_name) {
        attn_backend_id id;
        if (attn_backend_from_name(backend_name, &id) != ATTN_OK) {
            fprintf(stderr, "%s: --backend: %s\n", prog, attn_context_last_error(NULL));
            return 2;
        }
        request.backend = id;
    }

    st = attn_context_create(NULL, &ctx);
    if (st != ATTN_OK) {
        fprintf(stderr, "%s: cannot create a context: %s: %s\n", prog, attn_status_string(st),
                attn_context_last_error(NULL));
        return 1;
    }

    if (alibi) {
        /* The ALiBi paper's slopes for n heads: 2^(-8 (i+1) / n). */
        slopes = (float *)malloc((size_t)desc.num_heads * sizeof *slopes);
        if (!slopes) { fprintf(stderr, "%s: out of memory\n", prog); return 1; }
        for (i = 0; i < desc.num_heads; i++)
            slopes[i] = (float)pow(2.0, -8.0 * (i + 1) / desc.num_heads);
        desc.alibi_slopes = slopes;
    }
    if (sinks) {
        /* zeros where the layer's tensors live: device memory for --device cuda on a GPU
           (the library checks where a pointer points when a driver can tell) */
        sink_values = (float *)calloc((size_t)desc.num_heads, sizeof *sink_values);
        if (!sink_values) { fprintf(stderr, "%s: out of memory\n", prog); return 1; }
        desc.sinks = sink_values;
        if (desc.device == ATTN_DEVICE_CUDA &&
            attn_cuda_malloc(ctx, (size_t)desc.num_heads * sizeof(float), &sinks_dev) == ATTN_OK &&
            attn_cuda_memcpy(ctx, sinks_dev, sink_values, (size_t)desc.num_heads * sizeof(float),
                             ATTN_COPY_HOST_TO_DEVICE, NULL) == ATTN_OK)
            desc.sinks = (const float *)sinks_dev;
    }

    printf("attn.h %s\n", ATTN_VERSION_STRING);
    st = attn_platform_get(ctx, &platform);
    if (st == ATTN_OK) print_formatted(format_platform, &platform);

    memset(&selection, 0, sizeof selection);
    st = attn_select_backend(ctx, &desc, &request, &selection);
    if (!selection.env_var[0]) {
        /* The descriptor itself was rejected before any resolution: no record exists. */
        fprintf(stderr, "%s: invalid layer configuration: %s\n", prog,
                attn_context_last_error(ctx));
        free(slopes);
        free(sink_values);
        attn_cuda_free(ctx, sinks_dev);
        attn_context_destroy(ctx);
        return 2;
    }
    print_formatted(format_selection, &selection);
    printf("status: %s\n", attn_status_string(st));
    if (st != ATTN_OK)
        fprintf(stderr, "%s: resolution failed: %s: %s\n", prog, attn_status_string(st),
                attn_context_last_error(ctx));

    free(slopes);
    free(sink_values);
    attn_cuda_free(ctx, sinks_dev);
    attn_context_destroy(ctx);
    return st == ATTN_OK ? 0 : 1;
}
