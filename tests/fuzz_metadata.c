/* libFuzzer target: the metadata builder and the validation of every forward call.

   Each input is decoded into a layer descriptor, a metadata capacity and a few rounds of
   batches (mostly valid, then mutated field by field), plus tensors for the standard and
   MLA calls whose dtype, ndim, shapes, strides, device and pointers may be wrong. The
   properties checked, besides what ASan and UBSan catch:
     - every call returns a known status; a failure logs exactly one ERROR line and leaves
       a last-error message;
     - a failed call writes nothing: outputs and caches compare equal to their snapshots;
       a successful one writes only the rows and cache slots it owns;
     - a rejected build keeps the previous batch (attn_metadata_batch compares equal) and
       the previous schedule (the forward of the previous batch gives the same bits);
     - a well-formed call on a built batch succeeds.
   Every tensor gets exactly the memory its view may touch (rows the call may read or
   write, at its strides), so reading past a view is an ASan report, not a silent pass.

   Build and run: make fuzz (FUZZ_TIME seconds, 600 by default); make test runs it for 30 s
   from a fixed seed. Needs clang with the libFuzzer runtime (Debian: clang and
   libclang-rt-<version>-dev). tests/fuzz_corpus holds the seeds: the edge-coverage merge
   (-merge=1 -use_counters=0) of a nine-minute run. */
#define _POSIX_C_SOURCE 200809L
#define ATTN_IMPLEMENTATION
#include "attn.h"

/* The address of a host slot-mapping view over n slots (a compound literal of the block). */
#define ATTN_SLOTS(s, n) (&(attn_tensor[1]){attn_tensor_slots((s), (n))}[0])

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken property: report it and abort, so libFuzzer saves the input. */
#define FZ_REQUIRE(cond, ...)                                                               \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "fuzz_metadata: %s:%d: property failed: %s: ", __FILE__,       \
                    __LINE__, #cond);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fputc('\n', stderr);                                                            \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

#define FZ_MAX_REQS 10        /* scratch rows: capacity 1..8, plus one past it */
#define FZ_MAX_BLOCKS 16      /* block-table entries per row in the scratch */
#define FZ_MAX_TOKENS 80
#define FZ_MAX_ELEMS (1 << 21) /* a view that would need more is not run */
#define FZ_MAX_HEADS 16       /* ALiBi slopes the descriptor may point to */

/* ---- the input ------------------------------------------------------------------------ */

typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

static unsigned fz_byte(fz_in *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}
static unsigned fz_u16(fz_in *in) {
    unsigned lo = fz_byte(in);
    return lo | fz_byte(in) << 8;
}
static uint32_t fz_u32(fz_in *in) {
    uint32_t lo = fz_u16(in);
    return lo | (uint32_t)fz_u16(in) << 16;
}
/* lo..hi inclusive (hi - lo < 65536) */
static int fz_range(fz_in *in, int lo, int hi) {
    return lo + (int)(fz_u16(in) % (unsigned)(hi - lo + 1));
}
/* Mostly lo..hi; now and then a boundary or a value far outside (|v| >= 2^30, which every
   capacity check rejects, so nothing huge is ever allocated). */
static int64_t fz_edgy(fz_in *in, int64_t lo, int64_t hi) {
    unsigned sel = fz_byte(in);
    if (sel < 216) return lo + (int64_t)(fz_u16(in) % (uint64_t)(hi - lo + 1));
    switch (sel & 7) {
    case 0: return lo - 1;
    case 1: return hi + 1;
    case 2: return 0;
    case 3: return -1;
    case 4: return INT32_MAX;
    case 5: return INT32_MIN;
    case 6: return (int64_t)((fz_u32(in) & 0x3fffffffu) | 0x40000000u) * ((sel & 8) ? -1 : 1);
    default: return hi;
    }
}
static int fz_edgy32(fz_in *in, int lo, int hi) { return (int)fz_edgy(in, lo, hi); }

/* Tensor contents: a xorshift stream seeded by the input, so a crash reproduces. */
static uint64_t fz_rng_state;
static uint64_t fz_rng(void) {
    fz_rng_state ^= fz_rng_state << 13;
    fz_rng_state ^= fz_rng_state >> 7;
    fz_rng_state ^= fz_rng_state << 17;
    return fz_rng_state;
}

/* ---- contexts and the log ------------------------------------------------------------- */

typedef struct fz_log {
    int errors;
    attn_log_item last_item;
    attn_log_level last_level;
} fz_log;

static fz_log fz_logs[2];
static attn_context *fz_ctx[2]; /* one thread; three threads */

/* What the inputs reached, printed at exit: a run that never builds proves little. */
static struct {
    long inputs, layers, metas, builds_ok, builds_rejected, calls_ok, calls_failed, reruns;
} fz_stats;

static void fz_stats_print(void) {
    fprintf(stderr, "fuzz_metadata: %ld inputs, %ld layers, %ld metadata, %ld builds ok, %ld "
            "rejected, %ld calls ok, %ld failed, %ld reruns after a rejected build\n",
            fz_stats.inputs, fz_stats.layers, fz_stats.metas, fz_stats.builds_ok,
            fz_stats.builds_rejected, fz_stats.calls_ok, fz_stats.calls_failed, fz_stats.reruns);
}

static void fz_log_hook(void *user, attn_log_level level, attn_log_item item, const char *msg) {
    fz_log *l = (fz_log *)user;
    FZ_REQUIRE(msg != NULL, "log line without a message");
    FZ_REQUIRE((int)item >= 0 && (int)item < (int)ATTN_LOG_ITEM_COUNT, "log item %d", (int)item);
    FZ_REQUIRE(level >= ATTN_LOG_LEVEL_ERROR && level <= ATTN_LOG_LEVEL_DEBUG, "log level %d",
               (int)level);
    if (level == ATTN_LOG_LEVEL_ERROR) l->errors++;
    l->last_item = item;
    l->last_level = level;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    int i;
    (void)argc;
    (void)argv;
    atexit(fz_stats_print);
    setenv("ATTN_LOG_LEVEL", "none", 1); /* context-less failures would print to stderr */
    unsetenv("ATTN_BACKEND");
    for (i = 0; i < 2; i++) {
        attn_context_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.log = fz_log_hook;
        cd.log_user_data = &fz_logs[i];
        cd.log_level = ATTN_LOG_LEVEL_DEBUG;
        cd.num_threads = i ? 3 : 1;
        if (attn_context_create(&cd, &fz_ctx[i]) != ATTN_OK) {
            fprintf(stderr, "fuzz_metadata: cannot create a context: %s\n",
                    attn_context_last_error(NULL));
            abort();
        }
    }
    return 0;
}

static int fz_status_known(attn_status st) {
    switch (st) {
    case ATTN_OK: case ATTN_ERROR_NULL_ARGUMENT: case ATTN_ERROR_INVALID_VALUE:
    case ATTN_ERROR_SHAPE_MISMATCH: case ATTN_ERROR_INVALID_METADATA: case ATTN_ERROR_UNSUPPORTED:
    case ATTN_ERROR_BACKEND_UNAVAILABLE: case ATTN_ERROR_UNKNOWN_BACKEND: case ATTN_ERROR_CAPACITY:
    case ATTN_ERROR_OUT_OF_MEMORY: case ATTN_ERROR_PLATFORM: case ATTN_ERROR_INTERNAL:
        return 1;
    }
    return 0;
}

/* The state of one input: its context, log, and every buffer (freed at the end). */
typedef struct fz_run {
    attn_context *ctx;
    fz_log *log;
    void *bufs[256];
    int nbufs;
} fz_run;

static void *fz_alloc(fz_run *r, size_t bytes) {
    void *p = malloc(bytes);
    if (!p || r->nbufs == (int)(sizeof r->bufs / sizeof r->bufs[0])) {
        fprintf(stderr, "fuzz_metadata: out of memory or buffer slots\n");
        abort();
    }
    r->bufs[r->nbufs++] = p;
    return p;
}

/* A call's status: known, and a failure is one ERROR line plus a last-error message. */
static attn_status fz_checked(fz_run *r, int errors_before, attn_status st, const char *what) {
    FZ_REQUIRE(fz_status_known(st), "%s returned %d", what, (int)st);
    if (st == ATTN_OK) fz_stats.calls_ok++;
    else fz_stats.calls_failed++;
    if (st == ATTN_OK) {
        FZ_REQUIRE(r->log->errors == errors_before, "%s succeeded but logged %d ERROR lines", what,
                   r->log->errors - errors_before);
    } else {
        FZ_REQUIRE(r->log->errors == errors_before + 1, "%s failed (%s) with %d ERROR lines", what,
                   attn_status_string(st), r->log->errors - errors_before);
        FZ_REQUIRE(r->log->last_level == ATTN_LOG_LEVEL_ERROR, "%s: last line not ERROR", what);
        FZ_REQUIRE(attn_context_last_error(r->ctx)[0] != 0, "%s failed without a message", what);
    }
    return st;
}
#define FZ_CALL(r, expr) fz_checked((r), (r)->log->errors, (expr), #expr)

/* ---- tensors ------------------------------------------------------------------------- */

/* One tensor argument: the view passed, and the memory behind it. */
typedef struct fz_tensor {
    attn_tensor t;
    int given;            /* 0: the argument is NULL */
    void *buf;
    size_t bytes;
    unsigned char *snap;  /* the contents before the call */
    int valid;            /* built to the call's expectations, non-overlapping */
} fz_tensor;

static size_t fz_esize(attn_dtype dt) {
    size_t s = attn_dtype_size(dt);
    return s ? s : 4;
}

static void fz_fill(void *p, attn_dtype dt, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        float x = (float)((int64_t)(fz_rng() >> 40) - (1 << 23)) / (float)(1 << 23);
        if (dt == ATTN_DTYPE_F16) ((uint16_t *)p)[i] = attn_f32_to_f16(x);
        else if (dt == ATTN_DTYPE_BF16) ((uint16_t *)p)[i] = attn_f32_to_bf16(x);
        else if (dt == ATTN_DTYPE_F32) ((float *)p)[i] = x;
        else if (attn_dtype_size(dt) == 1) ((uint8_t *)p)[i] = (uint8_t)fz_rng(); /* fp8 / int8 codes */
        else ((uint32_t *)p)[i] = (uint32_t)fz_rng(); /* a type of no size: fz_esize's 4 bytes */
    }
}

/* The elements a view may touch: dimension 0 up to `rows`, the others up to `want`
   (a call whose extents differ from `want` must fail before touching anything). Returns
   0 when that is more than FZ_MAX_ELEMS (or cannot be computed): the call is not run. */
static int fz_extent(const attn_tensor *t, int64_t rows, const int64_t *want, size_t *elems) {
    attn_tensor r = *t;
    double e = 1;
    int i, all_zero = 1;
    if (t->ndim < 1 || t->ndim > ATTN_MAX_DIMS) { *elems = 0; return 1; }
    for (i = 0; i < r.ndim; i++) if (r.strides[i]) all_zero = 0;
    if (all_zero) {
        double s = 1;
        for (i = r.ndim - 1; i >= 0; i--) {
            if (s > 9e18) return 0;
            r.strides[i] = (int64_t)s;
            s *= (double)(r.shape[i] > 0 ? r.shape[i] : 0);
        }
    }
    for (i = 0; i < r.ndim; i++) {
        int64_t n = r.shape[i];
        int64_t lim = i == 0 ? rows : want[i];
        if (n > lim) n = lim;
        if (n <= 0) { *elems = 0; return 1; }
        if (r.strides[i] > 0) e += (double)(n - 1) * (double)r.strides[i];
    }
    if (e > FZ_MAX_ELEMS) return 0;
    *elems = (size_t)e;
    return 1;
}

/* How an argument is decoded. */
#define FZ_AT_LEAST 1   /* dimension 0 may be longer than the rows the call touches */
#define FZ_OPTIONAL 2   /* the argument may be NULL */
#define FZ_OUTPUT 4     /* filled with a pattern instead of values */
#define FZ_BREAK 8      /* the input may break one field */
#define FZ_DENSE 16     /* contiguous layouts only (the KV cache) */

/* Decodes one argument of dtype dt, ndim dims, extents want[], of which the call may
   touch `rows` rows. Mostly a valid view (zero strides, explicit strides, padded rows and
   gaps, or dimensions 0 and 1 swapped in memory); with FZ_BREAK sometimes one field
   broken. Returns 0 when the view would be too large to back with memory. */
static int fz_tensor_decode_rows(fz_in *in, fz_run *r, fz_tensor *ft, attn_dtype dt, int ndim,
                                 const int64_t *want_in, int64_t rows, unsigned how) {
    unsigned mode = fz_byte(in), layout = fz_byte(in) & 3;
    attn_tensor *t = &ft->t;
    int64_t want[ATTN_MAX_DIMS];
    size_t elems = 0;
    int i;
    memset(ft, 0, sizeof *ft);
    ft->given = 1;
    for (i = 0; i < ATTN_MAX_DIMS; i++) want[i] = i < ndim ? want_in[i] : 1;
    t->dtype = dt;
    t->ndim = ndim;
    for (i = 0; i < ndim; i++) t->shape[i] = want[i];
    if (how & FZ_AT_LEAST) t->shape[0] += fz_byte(in) % 3; /* padding rows, never written */
    if (how & FZ_DENSE) layout &= 1;
    if (layout == 1 || layout == 2) { /* explicit strides; layout 2 leaves gaps */
        int64_t s = 1;
        for (i = ndim - 1; i >= 0; i--) {
            t->strides[i] = s;
            s = s * t->shape[i] + (layout == 2 && i > 0 ? 1 + (int64_t)(i & 1) : 0);
        }
    } else if (layout == 3 && ndim == 3) { /* dimensions 0 and 1 swapped in memory */
        t->strides[2] = 1;
        t->strides[0] = t->shape[2];
        t->strides[1] = t->shape[2] * t->shape[0];
    }
    ft->valid = 1;
    if ((how & FZ_OPTIONAL) && (how & FZ_BREAK) && mode < 12) ft->given = 0;
    if ((how & FZ_BREAK) && mode >= 200) {
        unsigned what = fz_byte(in), k = fz_byte(in) % (unsigned)ndim;
        ft->valid = 0;
        switch (what % 10) {
        case 0: t->dtype = (attn_dtype)fz_edgy32(in, 0, 3); break;
        case 1: t->device.kind = ATTN_DEVICE_CUDA; break;
        case 2: t->ndim = fz_edgy32(in, 0, 7); break;
        case 3: t->shape[k] += (fz_byte(in) & 1) ? 1 : -1; break;
        case 4: t->shape[k] = fz_edgy(in, -2, 4); break;
        case 5: t->shape[k] = (fz_byte(in) & 1) ? INT64_MAX : INT64_MIN; break;
        case 6: t->strides[k] = fz_edgy(in, -2, 4); break;
        case 7: t->strides[k] = (fz_byte(in) & 1) ? ((int64_t)1 << 62) : -((int64_t)1 << 40); break;
        case 8: ft->given = 2; break; /* a view without data */
        default: ft->given = 0; break; /* a NULL argument */
        }
    }
    if (!fz_extent(t, rows, want, &elems)) return 0;
    ft->bytes = elems * fz_esize(t->dtype);
    ft->buf = fz_alloc(r, ft->bytes ? ft->bytes : 1);
    if (how & FZ_OUTPUT) memset(ft->buf, 0xA5, ft->bytes);
    else fz_fill(ft->buf, t->dtype, elems);
    if (ft->given != 2) t->data = ft->buf;
    ft->snap = (unsigned char *)fz_alloc(r, ft->bytes ? ft->bytes : 1);
    memcpy(ft->snap, ft->buf, ft->bytes);
    return 1;
}

static int fz_tensor_decode(fz_in *in, fz_run *r, fz_tensor *ft, attn_dtype dt, int ndim,
                            const int64_t *want, unsigned how) {
    return fz_tensor_decode_rows(in, r, ft, dt, ndim, want, want[0], how);
}

/* The blocks a cache write may touch: up to the largest slot it names. */
static int64_t fz_slot_blocks(const int64_t *slots, int n, int bs) {
    int64_t m = 0;
    int t;
    for (t = 0; t < n; t++)
        if (slots[t] >= 0 && slots[t] / bs + 1 > m) m = slots[t] / bs + 1;
    return m;
}

static attn_tensor *fz_arg(fz_tensor *ft) { return ft->given ? &ft->t : NULL; }

static int fz_unchanged(const fz_tensor *ft) {
    return !ft->buf || memcmp(ft->buf, ft->snap, ft->bytes) == 0;
}

/* After a successful call on a valid output view: every element outside rows 0..rows-1
   of the view (padding rows, stride gaps) still holds its old value. */
static void fz_check_rows_only(const fz_tensor *ft, int64_t rows, const char *what) {
    const attn_tensor *t = &ft->t;
    size_t es = fz_esize(t->dtype), n = ft->bytes / es, i;
    unsigned char *mask;
    int64_t idx[ATTN_MAX_DIMS], stride[ATTN_MAX_DIMS];
    int d, all_zero = 1;
    if (!ft->valid || !ft->given || !n) return;
    mask = (unsigned char *)calloc(n, 1);
    if (!mask) abort();
    for (d = 0; d < t->ndim; d++) { stride[d] = t->strides[d]; if (stride[d]) all_zero = 0; }
    if (all_zero) {
        int64_t s = 1;
        for (d = t->ndim - 1; d >= 0; d--) { stride[d] = s; s *= t->shape[d]; }
    }
    if (rows > 0) {
        memset(idx, 0, sizeof idx);
        for (;;) { /* every element of rows 0..rows-1 */
            int64_t off = 0;
            for (d = 0; d < t->ndim; d++) off += idx[d] * stride[d];
            FZ_REQUIRE((size_t)off < n, "%s: element offset %lld outside %zu", what, (long long)off, n);
            mask[off] = 1;
            for (d = t->ndim - 1; d >= 0; d--) {
                if (++idx[d] < (d == 0 ? rows : t->shape[d])) break;
                idx[d] = 0;
            }
            if (d < 0) break;
        }
    }
    for (i = 0; i < n; i++)
        if (!mask[i])
            FZ_REQUIRE(memcmp((const char *)ft->buf + i * es, ft->snap + i * es, es) == 0,
                       "%s: element %zu outside the rows it owns was written", what, i);
    free(mask);
}

/* After a successful call: cache rows not named by a slot are unchanged. A standard
   block is [2][block_size][row]; an MLA block is [block_size][row]. */
static void fz_check_cache_slots(const fz_tensor *kv, const int64_t *slots, int n, int bs,
                                 int mla, size_t row_bytes) {
    size_t block_bytes = (size_t)bs * row_bytes * (mla ? 1 : 2), nblocks, b, o, half;
    unsigned char *mask;
    int t;
    if (!kv->given || !kv->buf || !block_bytes) return;
    nblocks = kv->bytes / block_bytes;
    mask = (unsigned char *)calloc(nblocks * (size_t)bs * 2 + 1, 1);
    if (!mask) abort();
    for (t = 0; t < n; t++)
        if (slots[t] >= 0 && (size_t)(slots[t] / bs) < nblocks) mask[slots[t]] = 1;
    for (b = 0; b < nblocks; b++)
        for (half = 0; half < (mla ? 1u : 2u); half++)
            for (o = 0; o < (size_t)bs; o++) {
                size_t off = b * block_bytes + (half * (size_t)bs + o) * row_bytes;
                if (mask[b * (size_t)bs + o]) continue;
                FZ_REQUIRE(memcmp((const char *)kv->buf + off, kv->snap + off, row_bytes) == 0,
                           "cache block %zu row %zu written without a slot", b, o);
            }
    free(mask);
}

/* ---- batches ------------------------------------------------------------------------- */

/* A batch under construction: generous scratch arrays, then exact-size copies. */
typedef struct fz_batch {
    int32_t qsl[FZ_MAX_REQS + 2], seq[FZ_MAX_REQS + 1], bt[FZ_MAX_REQS + 1][FZ_MAX_BLOCKS + 1];
    int64_t slots[FZ_MAX_TOKENS + 2];
    int null_qsl, null_seq, null_bt, has_slots;
    attn_batch b;
    int common_prefix_len, fast_build;
} fz_batch;

static void fz_batch_generate(fz_in *in, fz_batch *g, const attn_metadata_desc *cap,
                              const attn_layer_desc *d) {
    int nreq = fz_range(in, 0, cap->max_num_reqs), stride = fz_range(in, 1, cap->max_blocks_per_req);
    int bs = d->block_size, thr = cap->decode_threshold > 0 ? cap->decode_threshold : 1;
    int ql[FZ_MAX_REQS + 1], ctxlen[FZ_MAX_REQS + 1], i, j, k, ntok = 0, maxq = 0, maxs = 0;
    unsigned kind;
    memset(g, 0, sizeof *g);
    for (i = 0; i < FZ_MAX_REQS + 1; i++) /* rows and entries no request uses: garbage */
        for (k = 0; k < FZ_MAX_BLOCKS + 1; k++) g->bt[i][k] = (int32_t)fz_rng();
    for (i = 0; i < nreq; i++) {
        int room = stride * bs;
        kind = fz_byte(in);
        ql[i] = kind < 120 ? 1 : kind < 140 ? 0 : kind < 160 ? fz_range(in, 1, thr) : fz_range(in, 2, 24);
        if (ql[i] > cap->max_num_tokens - ntok) ql[i] = cap->max_num_tokens - ntok;
        if (ql[i] > room) ql[i] = room;
        ctxlen[i] = fz_range(in, 0, room - ql[i]);
        ntok += ql[i];
    }
    if (d->use_mla && (fz_byte(in) & 7)) { /* decodes first, through attn_reorder_batch */
        int32_t perm[FZ_MAX_REQS + 1], q32[FZ_MAX_REQS + 1], seen[FZ_MAX_REQS + 1];
        int nd = -1, swaps = -1, oql[FZ_MAX_REQS + 1], octx[FZ_MAX_REQS + 1];
        attn_status st;
        for (i = 0; i < nreq; i++) q32[i] = ql[i];
        st = attn_reorder_batch(q32, nreq, cap->decode_threshold, perm, &nd, &swaps);
        FZ_REQUIRE(st == ATTN_OK, "attn_reorder_batch failed: %s", attn_status_string(st));
        FZ_REQUIRE(nd >= 0 && nd <= nreq && swaps >= 0 && swaps <= nreq / 2, "nd %d swaps %d", nd, swaps);
        memset(seen, 0, sizeof seen);
        for (i = 0; i < nreq; i++) {
            FZ_REQUIRE(perm[i] >= 0 && perm[i] < nreq && !seen[perm[i]], "perm[%d] = %d", i, perm[i]);
            seen[perm[i]] = 1;
            FZ_REQUIRE((ql[perm[i]] <= thr) == (i < nd), "request %d out of order", i);
            oql[i] = ql[perm[i]];
            octx[i] = ctxlen[perm[i]];
        }
        memcpy(ql, oql, sizeof(int) * (size_t)nreq);
        memcpy(ctxlen, octx, sizeof(int) * (size_t)nreq);
    }
    g->has_slots = (fz_byte(in) & 7) != 0;
    for (i = 0; i < nreq; i++) {
        int sl = ctxlen[i] + ql[i], nb = (sl + bs - 1) / bs;
        g->qsl[i + 1] = g->qsl[i] + ql[i];
        g->seq[i] = sl;
        for (k = 0; k < nb; k++) g->bt[i][k] = (int32_t)(fz_u16(in) % (unsigned)cap->num_blocks);
        for (j = 0; j < ql[i]; j++) {
            int pos = ctxlen[i] + j;
            int64_t slot = (int64_t)g->bt[i][pos / bs] * bs + pos % bs;
            g->slots[g->qsl[i] + j] = (fz_byte(in) < 16) ? -1 : slot;
        }
        if (ql[i] > maxq) maxq = ql[i];
        if (sl > maxs) maxs = sl;
    }
    for (i = nreq + 1; i < FZ_MAX_REQS + 2; i++) g->qsl[i] = (int32_t)fz_rng();
    for (i = nreq; i < FZ_MAX_REQS + 1; i++) g->seq[i] = (int32_t)fz_rng();
    for (i = ntok; i < FZ_MAX_TOKENS + 2; i++) g->slots[i] = (int64_t)fz_rng();
    g->b.block_table_stride = stride;
    g->b.num_reqs = nreq;
    g->b.num_actual_tokens = ntok;
    g->b.max_query_len = maxq;
    g->b.max_seq_len = maxs;
    kind = fz_byte(in);
    g->b.causal = kind < 200 ? ATTN_CAUSAL_DEFAULT : kind < 228 ? ATTN_CAUSAL_YES : ATTN_CAUSAL_NO;
    kind = fz_byte(in);
    g->common_prefix_len = kind < 200 ? 0 : fz_range(in, 0, maxs);
    g->fast_build = fz_byte(in) & 1;
}

/* Breaks a field or two (or none); most results must be rejected by the build. */
static void fz_batch_mutate(fz_in *in, fz_batch *g) {
    int m = (int)(fz_byte(in) % 5) - 2, i;
    for (i = 0; i < m; i++) {
        unsigned f = fz_byte(in), k = fz_byte(in);
        switch (f % 14) {
        case 0: g->b.num_reqs = fz_edgy32(in, -1, FZ_MAX_REQS - 1); break;
        case 1: g->b.num_actual_tokens = fz_edgy32(in, -1, FZ_MAX_TOKENS); break;
        case 2: g->qsl[k % (FZ_MAX_REQS + 2)] = fz_edgy32(in, -2, FZ_MAX_TOKENS); break;
        case 3: g->seq[k % (FZ_MAX_REQS + 1)] = fz_edgy32(in, -2, 2000); break;
        case 4: g->bt[k % (FZ_MAX_REQS + 1)][fz_byte(in) % FZ_MAX_BLOCKS] = fz_edgy32(in, -1, 64); break;
        case 5: g->b.block_table_stride = fz_edgy32(in, -1, FZ_MAX_BLOCKS); break;
        case 6: g->slots[k % (FZ_MAX_TOKENS + 2)] = fz_edgy(in, -2, 4000); break;
        case 7: g->b.max_query_len += (k & 1) ? 1 : -1; break;
        case 8: g->b.max_seq_len += (k & 1) ? 1 : -1; break;
        case 9: g->b.causal = (attn_causal)fz_edgy32(in, 0, 3); break;
        case 10: g->common_prefix_len = fz_edgy32(in, -1, 2000); break;
        case 11: g->null_qsl = k % 3 == 0; g->null_seq = k % 3 == 1; g->null_bt = k % 3 == 2; break;
        case 12: g->has_slots = !g->has_slots; break;
        default: g->slots[k % (FZ_MAX_TOKENS + 2)] = (k & 1) ? INT64_MAX : INT64_MIN; break;
        }
    }
}

/* Exact-size arrays for the batch as described: the builder may read exactly these. */
static void fz_batch_materialize(fz_run *r, fz_batch *g, const attn_metadata_desc *cap) {
    int nr = g->b.num_reqs, st = g->b.block_table_stride, nt = g->b.num_actual_tokens, i, k;
    int32_t *qsl, *seq, *bt;
    int64_t *slots;
    /* counts beyond the capacity are rejected before any array is read */
    if (nr < 0 || nr > cap->max_num_reqs) nr = 0;
    if (st < 1 || st > cap->max_blocks_per_req) st = 0;
    if (nt < 0 || nt > cap->max_num_tokens) nt = 0;
    qsl = (int32_t *)fz_alloc(r, sizeof(int32_t) * ((size_t)nr + 1));
    seq = (int32_t *)fz_alloc(r, nr ? sizeof(int32_t) * (size_t)nr : 1);
    bt = (int32_t *)fz_alloc(r, nr && st ? sizeof(int32_t) * (size_t)nr * (size_t)st : 1);
    slots = (int64_t *)fz_alloc(r, nt ? sizeof(int64_t) * (size_t)nt : 1);
    for (i = 0; i <= nr; i++) qsl[i] = i < FZ_MAX_REQS + 2 ? g->qsl[i] : 0;
    for (i = 0; i < nr; i++) seq[i] = i < FZ_MAX_REQS + 1 ? g->seq[i] : 0;
    for (i = 0; i < nr; i++)
        for (k = 0; k < st; k++)
            bt[(size_t)i * (size_t)st + (size_t)k] =
                i < FZ_MAX_REQS + 1 && k < FZ_MAX_BLOCKS + 1 ? g->bt[i][k] : -7;
    for (i = 0; i < nt; i++) slots[i] = i < FZ_MAX_TOKENS + 2 ? g->slots[i] : -1;
    g->b.query_start_loc = g->null_qsl ? NULL : qsl;
    g->b.seq_lens = g->null_seq ? NULL : seq;
    g->b.block_table = g->null_bt ? NULL : bt;
    g->b.slot_mapping = g->has_slots ? slots : NULL;
}

/* A deep copy of what attn_metadata_batch shows. */
typedef struct fz_snapshot {
    attn_batch b;
    int32_t *qsl, *seq, *bt;
    int64_t *slots;
    size_t nqsl, nseq, nbt, nslots;
} fz_snapshot;

static void fz_snapshot_take(fz_run *r, const attn_metadata *meta, fz_snapshot *s) {
    const attn_batch *b = attn_metadata_batch(meta);
    memset(s, 0, sizeof *s);
    s->b = *b;
    if (!b->query_start_loc) return; /* never built */
    s->nqsl = (size_t)b->num_reqs + 1;
    s->nseq = (size_t)b->num_reqs;
    s->nbt = (size_t)b->num_reqs * (size_t)b->block_table_stride;
    s->nslots = b->slot_mapping ? (size_t)b->num_actual_tokens : 0;
    s->qsl = (int32_t *)fz_alloc(r, s->nqsl * 4 + 1);
    s->seq = (int32_t *)fz_alloc(r, s->nseq * 4 + 1);
    s->bt = (int32_t *)fz_alloc(r, s->nbt * 4 + 1);
    s->slots = (int64_t *)fz_alloc(r, s->nslots * 8 + 1);
    memcpy(s->qsl, b->query_start_loc, s->nqsl * 4);
    if (s->nseq) memcpy(s->seq, b->seq_lens, s->nseq * 4);
    if (s->nbt) memcpy(s->bt, b->block_table, s->nbt * 4);
    if (s->nslots) memcpy(s->slots, b->slot_mapping, s->nslots * 8);
}

static void fz_snapshot_same(const attn_metadata *meta, const fz_snapshot *s) {
    const attn_batch *b = attn_metadata_batch(meta);
    FZ_REQUIRE(memcmp(b, &s->b, sizeof *b) == 0, "a rejected build changed the batch header");
    if (!s->qsl) return;
    FZ_REQUIRE(memcmp(b->query_start_loc, s->qsl, s->nqsl * 4) == 0, "query_start_loc changed");
    FZ_REQUIRE(!s->nseq || memcmp(b->seq_lens, s->seq, s->nseq * 4) == 0, "seq_lens changed");
    FZ_REQUIRE(!s->nbt || memcmp(b->block_table, s->bt, s->nbt * 4) == 0, "block_table changed");
    FZ_REQUIRE(!s->nslots || memcmp(b->slot_mapping, s->slots, s->nslots * 8) == 0,
               "slot_mapping changed");
}

/* ---- layers -------------------------------------------------------------------------- */

/* A layer descriptor: mostly one the CPU or CPU_MLA backend serves; else such a one with
   a field or two broken (the descriptor validation and the selector). */
static void fz_layer_decode(fz_in *in, attn_layer_desc *d, float slopes[FZ_MAX_HEADS]) {
    static const int heads[] = {1, 2, 3, 4, 6, 8};
    unsigned mode = fz_byte(in);
    int i, breaks;
    memset(d, 0, sizeof *d);
    for (i = 0; i < FZ_MAX_HEADS; i++) slopes[i] = (float)(i + 1) / 16.0f;
    if (mode & 1) { /* standard */
        int divisors[8], nd = 0;
        d->num_heads = heads[fz_byte(in) % 6];
        for (i = 1; i <= d->num_heads; i++) if (d->num_heads % i == 0) divisors[nd++] = i;
        d->num_kv_heads = fz_byte(in) < 32 ? 0 : divisors[fz_byte(in) % (unsigned)nd];
        d->head_size = 8 * (1 + (int)(fz_byte(in) % ((fz_byte(in) < 16) ? 64 : 16)));
        d->dtype = (attn_dtype)(fz_byte(in) % 4);
        d->kv_cache_dtype = (attn_dtype)(fz_byte(in) % 4);
        d->block_size = (int)(fz_byte(in) % 4) * 16; /* 0 = default 16 */
        d->causal = (attn_causal)(fz_byte(in) % 3);
        if (fz_byte(in) < 64) d->sliding_window = fz_range(in, 1, 80);
        if (fz_byte(in) < 32) d->logits_soft_cap = (float)fz_range(in, 1, 60);
        if (fz_byte(in) < 32) {
            for (i = 0; i < d->num_heads; i++) slopes[i] = (float)fz_range(in, 0, 1000) / 256.0f;
            d->alibi_slopes = slopes;
        }
        if (fz_byte(in) < 32) d->scale = (float)fz_range(in, 1, 1000) / 300.0f;
    } else { /* MLA */
        static const int small[] = {8, 16, 32, 64};
        d->use_mla = 1;
        d->num_heads = heads[fz_byte(in) % 4];
        d->head_size = (fz_byte(in) & 1) ? 576 : 320;
        if (fz_byte(in) & 1) d->kv_lora_rank = d->head_size - 64;
        if (fz_byte(in) & 1) d->qk_rope_head_dim = 64;
        d->qk_nope_head_dim = small[fz_byte(in) % 4];
        d->v_head_dim = small[fz_byte(in) % 4];
        d->dtype = (attn_dtype)(fz_byte(in) % 4);
        d->kv_cache_dtype = (attn_dtype)(fz_byte(in) % 4);
        d->block_size = 16 * (1 + (int)(fz_byte(in) % 2));
    }
    breaks = mode >= 224 ? 1 + (int)(mode & 2) / 2 : 0;
    for (i = 0; i < breaks; i++) {
        uint32_t bits;
        float f;
        switch (fz_byte(in) % 17) {
        case 0: d->num_heads = fz_edgy32(in, -1, 9); break;
        case 1: d->num_kv_heads = fz_edgy32(in, -1, 9); break;
        case 2: d->head_size = fz_edgy32(in, -1, 600); break;
        case 3: d->dtype = (attn_dtype)fz_edgy32(in, 0, 4); break;
        case 4: d->kv_cache_dtype = (attn_dtype)fz_edgy32(in, 0, 4); break;
        case 5: d->block_size = fz_edgy32(in, -16, 80); break;
        case 6: d->causal = (attn_causal)fz_edgy32(in, 0, 3); break;
        case 7: d->sliding_window = fz_edgy32(in, -1, 100); break;
        case 8: d->use_mla = fz_edgy32(in, 0, 2); break;
        case 9: d->kv_lora_rank = fz_edgy32(in, -1, 600); break;
        case 10: d->qk_rope_head_dim = fz_edgy32(in, -1, 65); break;
        case 11: d->qk_nope_head_dim = fz_edgy32(in, -1, 520); break;
        case 12: d->v_head_dim = fz_edgy32(in, -1, 520); break;
        case 13: bits = fz_u32(in); memcpy(&f, &bits, 4); d->scale = f; break;
        case 14: bits = fz_u32(in); memcpy(&f, &bits, 4); d->logits_soft_cap = f; break;
        case 15: /* one slope any bit pattern (NaN, inf) */
            bits = fz_u32(in);
            memcpy(&slopes[fz_byte(in) % FZ_MAX_HEADS], &bits, 4);
            d->alibi_slopes = slopes;
            break;
        default: d->block_size = 65536 + 16 * (int)(fz_byte(in) & 1); break;
        }
    }
    /* the caller's side of the contract: num_heads slopes */
    if (d->alibi_slopes && (d->num_heads < 1 || d->num_heads > FZ_MAX_HEADS)) d->alibi_slopes = NULL;
}

/* ---- the calls ----------------------------------------------------------------------- */

/* The well-formed call of the last good build, kept to rerun after a rejected build. */
typedef struct fz_keep {
    int have;
    fz_tensor a[8];
    unsigned char *result; /* out (and lse) after the first run */
    size_t result_bytes;
} fz_keep;

typedef struct fz_world {
    fz_run *r;
    attn_layer *layer;
    const attn_layer_desc *d;
    attn_metadata *meta;
    attn_metadata_desc cap;
    fz_keep keep;
} fz_world;

#define FZ_IN_ARGS (FZ_BREAK)          /* inputs of a fuzzed call */
#define FZ_OUT_ARGS (FZ_BREAK | FZ_OUTPUT)

/* Restores the kept arguments to their contents before the first run. */
static void fz_keep_restore(fz_keep *k) {
    int i;
    for (i = 0; i < 8; i++)
        if (k->a[i].buf) memcpy(k->a[i].buf, k->a[i].snap, k->a[i].bytes);
}

/* First run: keep the result; rerun: it must be the same bits. */
static void fz_keep_result(fz_world *w, const fz_tensor *x, const fz_tensor *y, int rerun) {
    size_t nx = x->given ? x->bytes : 0, ny = y && y->given ? y->bytes : 0;
    if (rerun) {
        FZ_REQUIRE(w->keep.result_bytes == nx + ny && memcmp(w->keep.result, x->buf, nx) == 0 &&
                       (!ny || memcmp(w->keep.result + nx, y->buf, ny) == 0),
                   "the forward after a rejected build differs from the one before it");
        return;
    }
    w->keep.result = (unsigned char *)fz_alloc(w->r, nx + ny + 1);
    memcpy(w->keep.result, x->buf, nx);
    if (ny) memcpy(w->keep.result + nx, y->buf, ny);
    w->keep.result_bytes = nx + ny;
    w->keep.have = 1;
}

static size_t fz_std_row_bytes(const attn_layer_desc *d) {
    return (size_t)d->num_kv_heads * (size_t)d->head_size * fz_esize(d->kv_cache_dtype);
}

/* attn_layer_forward. mode 0: well-formed arguments (layouts from the input), which must
   succeed and are kept; 1: the kept call again; 2: arguments the input may break. */
static void fz_std_forward(fz_in *in, fz_world *w, int mode) {
    const attn_layer_desc *d = w->d;
    const attn_batch *b = attn_metadata_batch(w->meta);
    int ntok = b->num_actual_tokens;
    unsigned brk = mode == 2 ? FZ_BREAK : 0;
    int64_t wq[3], wk[3], wl[2], wc[5];
    fz_tensor *a = w->keep.a, *q = &a[0], *k = &a[1], *v = &a[2], *kv = &a[3], *out = &a[4], *lse = &a[5];
    fz_tensor local[6];
    attn_status st;
    if (mode == 1) {
        fz_keep_restore(&w->keep);
    } else {
        if (mode == 2) {
            a = local;
            q = &a[0]; k = &a[1]; v = &a[2]; kv = &a[3]; out = &a[4]; lse = &a[5];
        } else {
            memset(&w->keep, 0, sizeof w->keep);
        }
        wq[0] = ntok; wq[1] = d->num_heads; wq[2] = d->head_size;
        wk[0] = ntok; wk[1] = d->num_kv_heads; wk[2] = d->head_size;
        wl[0] = ntok; wl[1] = d->num_heads;
        wc[0] = w->cap.num_blocks; wc[1] = 2; wc[2] = d->block_size; wc[3] = d->num_kv_heads;
        wc[4] = d->head_size;
        if (!fz_tensor_decode(in, w->r, q, d->dtype, 3, wq, FZ_AT_LEAST | brk) ||
            !fz_tensor_decode(in, w->r, k, d->dtype, 3, wk, FZ_AT_LEAST | FZ_OPTIONAL | brk) ||
            !fz_tensor_decode(in, w->r, v, d->dtype, 3, wk, FZ_AT_LEAST | FZ_OPTIONAL | brk) ||
            !fz_tensor_decode(in, w->r, out, d->dtype, 3, wq, FZ_AT_LEAST | FZ_OUTPUT | brk) ||
            !fz_tensor_decode(in, w->r, lse, ATTN_DTYPE_F32, 2, wl, FZ_AT_LEAST | FZ_OPTIONAL | FZ_OUTPUT | brk) ||
            !fz_tensor_decode(in, w->r, kv, d->kv_cache_dtype, 5, wc, FZ_AT_LEAST | FZ_DENSE | brk)) {
            if (mode == 0) w->keep.have = 0; /* too large to back with memory */
            return;
        }
        if (mode == 0) {
            unsigned pick = fz_byte(in);
            if (!b->slot_mapping || (pick & 1)) k->given = v->given = 0;
            if (pick & 2) lse->given = 0;
        }
    }
    st = FZ_CALL(w->r, attn_layer_forward(w->layer, w->meta, fz_arg(q), fz_arg(k), fz_arg(v),
                                          fz_arg(kv), fz_arg(out), fz_arg(lse), NULL));
    if (mode != 2)
        FZ_REQUIRE(st == ATTN_OK, "a well-formed forward failed: %s (%s)", attn_status_string(st),
                   attn_context_last_error(w->r->ctx));
    if (st != ATTN_OK) {
        FZ_REQUIRE(fz_unchanged(out) && fz_unchanged(lse) && fz_unchanged(kv),
                   "a failed forward wrote to out, lse or the cache");
        return;
    }
    fz_check_rows_only(out, ntok, "out");
    fz_check_rows_only(lse, ntok, "lse");
    if (!k->given) FZ_REQUIRE(fz_unchanged(kv), "a forward without k/v wrote the cache");
    else fz_check_cache_slots(kv, b->slot_mapping, ntok, d->block_size, 0, fz_std_row_bytes(d));
    if (mode != 2) fz_keep_result(w, out, lse, mode == 1);
}

/* attn_reshape_and_cache with arguments from the input. */
static void fz_std_cache_write(fz_in *in, fz_world *w) {
    const attn_layer_desc *d = w->d;
    int n = fz_range(in, 0, 12), t;
    int64_t wk[3], wc[5], *slots, blocks = fz_range(in, 1, 8), maxslot = -1;
    unsigned neg = fz_byte(in);
    fz_tensor k, v, kv;
    slots = (int64_t *)fz_alloc(w->r, sizeof(int64_t) * (size_t)(n + 1));
    for (t = 0; t < n; t++) {
        slots[t] = fz_edgy(in, -1, blocks * d->block_size - 1);
        if (slots[t] > maxslot) maxslot = slots[t];
    }
    /* a call may touch every block up to the largest slot it names */
    if (maxslot >= blocks * d->block_size && maxslot < 64 * (int64_t)d->block_size)
        blocks = maxslot / d->block_size + 1;
    wk[0] = n; wk[1] = d->num_kv_heads; wk[2] = d->head_size;
    wc[0] = blocks; wc[1] = 2; wc[2] = d->block_size; wc[3] = d->num_kv_heads; wc[4] = d->head_size;
    if (!fz_tensor_decode(in, w->r, &k, d->dtype, 3, wk, FZ_AT_LEAST | FZ_IN_ARGS) ||
        !fz_tensor_decode(in, w->r, &v, d->dtype, 3, wk, FZ_AT_LEAST | FZ_IN_ARGS) ||
        !fz_tensor_decode_rows(in, w->r, &kv, d->kv_cache_dtype, 5, wc,
                               fz_slot_blocks(slots, n, d->block_size), FZ_DENSE | FZ_IN_ARGS))
        return;
    if (neg < 8) n = (neg & 1) ? -1 : INT32_MIN; /* a negative count reads nothing */
    if (FZ_CALL(w->r, attn_reshape_and_cache(w->layer, fz_arg(&k), fz_arg(&v), fz_arg(&kv), ATTN_SLOTS(fz_byte(in) < 8 ? NULL : slots, n), NULL)) != ATTN_OK) {
        FZ_REQUIRE(fz_unchanged(&kv), "a failed attn_reshape_and_cache wrote the cache");
        return;
    }
    fz_check_cache_slots(&kv, slots, n, d->block_size, 0, fz_std_row_bytes(d));
}

/* The fused MLA call. mode 0: well-formed (kept), 1: the kept call again, 2: broken. */
static void fz_mla_fused(fz_in *in, fz_world *w, int mode) {
    const attn_layer_desc *d = w->d;
    const attn_batch *b = attn_metadata_batch(w->meta);
    int H = d->num_heads, R = d->kv_lora_rank, P = d->qk_rope_head_dim, N = d->qk_nope_head_dim;
    int V = d->v_head_dim, ntok = b->num_actual_tokens;
    unsigned brk = mode == 2 ? FZ_BREAK : 0;
    int64_t s[3];
    fz_tensor *a = w->keep.a, local[8];
    attn_status st;
    if (mode == 1) {
        fz_keep_restore(&w->keep);
    } else {
        if (mode == 2) a = local;
        else memset(&w->keep, 0, sizeof w->keep);
        s[0] = ntok; s[1] = H; s[2] = N;
        if (!fz_tensor_decode(in, w->r, &a[0], d->dtype, 3, s, FZ_AT_LEAST | brk)) return;
        s[2] = P;
        if (!fz_tensor_decode(in, w->r, &a[1], d->dtype, 3, s, FZ_AT_LEAST | brk)) return;
        s[1] = R;
        if (!fz_tensor_decode(in, w->r, &a[2], d->dtype, 2, s, FZ_AT_LEAST | FZ_OPTIONAL | brk)) return;
        s[1] = P;
        if (!fz_tensor_decode(in, w->r, &a[3], d->dtype, 2, s, FZ_AT_LEAST | FZ_OPTIONAL | brk)) return;
        s[0] = w->cap.num_blocks; s[1] = d->block_size; s[2] = d->head_size;
        if (!fz_tensor_decode(in, w->r, &a[4], d->kv_cache_dtype, 3, s, FZ_AT_LEAST | FZ_DENSE | brk)) return;
        s[0] = H; s[1] = N; s[2] = R;
        if (!fz_tensor_decode(in, w->r, &a[5], d->dtype, 3, s, brk)) return;
        s[1] = R; s[2] = V;
        if (!fz_tensor_decode(in, w->r, &a[6], d->dtype, 3, s, brk)) return;
        s[0] = ntok; s[1] = H; s[2] = V;
        if (!fz_tensor_decode(in, w->r, &a[7], d->dtype, 3, s, FZ_AT_LEAST | FZ_OUTPUT | brk)) return;
        if (mode == 0 && (!b->slot_mapping || (fz_byte(in) & 1))) a[2].given = a[3].given = 0;
    }
    st = FZ_CALL(w->r, attn_mla_forward(w->layer, w->meta, fz_arg(&a[0]), fz_arg(&a[1]), fz_arg(&a[2]),
                                        fz_arg(&a[3]), fz_arg(&a[4]), fz_arg(&a[5]), fz_arg(&a[6]),
                                        fz_arg(&a[7]), NULL));
    if (mode != 2)
        FZ_REQUIRE(st == ATTN_OK, "a well-formed attn_mla_forward failed: %s (%s)",
                   attn_status_string(st), attn_context_last_error(w->r->ctx));
    if (st != ATTN_OK) {
        FZ_REQUIRE(fz_unchanged(&a[7]) && fz_unchanged(&a[4]), "a failed attn_mla_forward wrote");
        return;
    }
    fz_check_rows_only(&a[7], ntok, "out");
    if (!a[2].given) FZ_REQUIRE(fz_unchanged(&a[4]), "attn_mla_forward without kv_c wrote the cache");
    else fz_check_cache_slots(&a[4], b->slot_mapping, ntok, d->block_size, 1,
                              (size_t)d->head_size * fz_esize(d->kv_cache_dtype));
    if (mode != 2) fz_keep_result(w, &a[7], NULL, mode == 1);
}

/* The other MLA calls with arguments from the input: absorbed decode, up-projected
   prefill, the latent cache write. */
static void fz_mla_parts(fz_in *in, fz_world *w) {
    const attn_layer_desc *d = w->d;
    attn_mla_info info;
    int H = d->num_heads, R = d->kv_lora_rank, P = d->qk_rope_head_dim, N = d->qk_nope_head_dim;
    int V = d->v_head_dim, rows;
    unsigned which = fz_byte(in) % 3;
    int64_t s[3];
    fz_tensor q, qp, kv, wuk, wuv, out, lse;
    attn_status st;
    st = FZ_CALL(w->r, attn_metadata_mla_info(w->meta, &info));
    FZ_REQUIRE(st == ATTN_OK, "attn_metadata_mla_info on a built MLA batch: %s", attn_status_string(st));
    s[0] = w->cap.num_blocks; s[1] = d->block_size; s[2] = d->head_size;
    if (which == 2) { /* the latent cache write */
        int n = fz_range(in, 0, 12), t;
        int64_t *slots = (int64_t *)fz_alloc(w->r, sizeof(int64_t) * (size_t)(n + 1));
        for (t = 0; t < n; t++) slots[t] = fz_edgy(in, -1, w->cap.num_blocks * d->block_size - 1);
        if (!fz_tensor_decode_rows(in, w->r, &kv, d->kv_cache_dtype, 3, s,
                                   fz_slot_blocks(slots, n, d->block_size), FZ_DENSE | FZ_IN_ARGS))
            return;
        s[0] = n; s[1] = R;
        if (!fz_tensor_decode(in, w->r, &q, d->dtype, 2, s, FZ_AT_LEAST | FZ_IN_ARGS)) return;
        s[1] = P;
        if (!fz_tensor_decode(in, w->r, &qp, d->dtype, 2, s, FZ_AT_LEAST | FZ_IN_ARGS)) return;
        if (fz_byte(in) < 8) n = -1; /* a negative count reads nothing */
        st = FZ_CALL(w->r, attn_concat_and_cache_mla(w->layer, fz_arg(&q), fz_arg(&qp), fz_arg(&kv), ATTN_SLOTS(fz_byte(in) < 8 ? NULL : slots, n), NULL));
        if (st != ATTN_OK) FZ_REQUIRE(fz_unchanged(&kv), "a failed MLA cache write wrote the cache");
        else fz_check_cache_slots(&kv, slots, n, d->block_size, 1,
                                  (size_t)d->head_size * fz_esize(d->kv_cache_dtype));
        return;
    }
    if (!fz_tensor_decode(in, w->r, &kv, d->kv_cache_dtype, 3, s, FZ_AT_LEAST | FZ_DENSE | FZ_IN_ARGS)) return;
    if (which == 0) { /* absorbed decode: q [td, H, head_size], or q_latent + q_pe */
        int split = fz_byte(in) & 1;
        rows = info.num_decode_tokens;
        s[0] = rows; s[1] = H; s[2] = split ? R : d->head_size;
        if (!fz_tensor_decode(in, w->r, &q, d->dtype, 3, s, FZ_AT_LEAST | FZ_IN_ARGS)) return;
        s[2] = P;
        if (!fz_tensor_decode(in, w->r, &qp, d->dtype, 3, s, FZ_AT_LEAST | FZ_IN_ARGS)) return;
        if (!split) qp.given = 0;
        s[2] = R;
        if (!fz_tensor_decode(in, w->r, &out, d->dtype, 3, s, FZ_AT_LEAST | FZ_OUT_ARGS)) return;
        if (!fz_tensor_decode(in, w->r, &lse, ATTN_DTYPE_F32, 2, s, FZ_AT_LEAST | FZ_OPTIONAL | FZ_OUT_ARGS)) return;
        st = FZ_CALL(w->r, attn_mla_forward_mqa(w->layer, w->meta, fz_arg(&q), fz_arg(&qp), fz_arg(&kv),
                                                fz_arg(&out), fz_arg(&lse), NULL));
    } else { /* up-projected prefill */
        rows = info.num_prefill_tokens;
        s[0] = H; s[1] = N; s[2] = R;
        if (!fz_tensor_decode(in, w->r, &wuk, d->dtype, 3, s, FZ_IN_ARGS)) return;
        s[1] = R; s[2] = V;
        if (!fz_tensor_decode(in, w->r, &wuv, d->dtype, 3, s, FZ_IN_ARGS)) return;
        s[0] = rows; s[1] = H; s[2] = N + P;
        if (!fz_tensor_decode(in, w->r, &q, d->dtype, 3, s, FZ_AT_LEAST | FZ_IN_ARGS)) return;
        s[2] = V;
        if (!fz_tensor_decode(in, w->r, &out, d->dtype, 3, s, FZ_AT_LEAST | FZ_OUT_ARGS)) return;
        if (!fz_tensor_decode(in, w->r, &lse, ATTN_DTYPE_F32, 2, s, FZ_AT_LEAST | FZ_OPTIONAL | FZ_OUT_ARGS)) return;
        st = FZ_CALL(w->r, attn_mla_forward_mha(w->layer, w->meta, fz_arg(&q), fz_arg(&kv), fz_arg(&wuk),
                                                fz_arg(&wuv), fz_arg(&out), fz_arg(&lse), NULL));
    }
    if (st != ATTN_OK) {
        FZ_REQUIRE(fz_unchanged(&out) && fz_unchanged(&lse) && fz_unchanged(&kv),
                   "a failed MLA call wrote to its output or the cache");
        return;
    }
    FZ_REQUIRE(fz_unchanged(&kv), "an MLA attention call wrote the cache");
    fz_check_rows_only(&out, rows, "out");
    fz_check_rows_only(&lse, rows, "lse");
}

/* Calls that must fail before touching their (one-element) tensors: the wrong kind of
   layer, metadata never built, metadata of another layer configuration. */
static void fz_wrong_calls(fz_in *in, fz_world *w, int built) {
    const attn_layer_desc *d = w->d;
    float buf[4] = {1, 2, 3, 4}, ref[4];
    int64_t one[3] = {1, 1, 1}, slot = 0;
    attn_tensor t = attn_tensor_make(buf, ATTN_DTYPE_F32, 3, one);
    attn_tensor t2 = attn_tensor_make(buf, ATTN_DTYPE_F32, 2, one);
    attn_layer *other = NULL;
    attn_status st;
    memcpy(ref, buf, sizeof ref);
    if (!built) {
        if (d->use_mla) {
            st = FZ_CALL(w->r, attn_mla_forward_mqa(w->layer, w->meta, &t, NULL, &t, &t, NULL, NULL));
            FZ_REQUIRE(st == ATTN_ERROR_INVALID_METADATA, "MLA call on unbuilt metadata: %s", attn_status_string(st));
            st = FZ_CALL(w->r, attn_layer_forward(w->layer, w->meta, &t, NULL, NULL, &t, &t, NULL, NULL));
            FZ_REQUIRE(st == ATTN_ERROR_UNSUPPORTED, "attn_layer_forward on MLA: %s", attn_status_string(st));
            st = FZ_CALL(w->r, attn_reshape_and_cache(w->layer, &t, &t, &t, ATTN_SLOTS(&slot, 1), NULL));
            FZ_REQUIRE(st == ATTN_ERROR_UNSUPPORTED, "attn_reshape_and_cache on MLA: %s", attn_status_string(st));
        } else {
            st = FZ_CALL(w->r, attn_layer_forward(w->layer, w->meta, &t, NULL, NULL, &t, &t, NULL, NULL));
            FZ_REQUIRE(st == ATTN_ERROR_INVALID_METADATA, "forward on unbuilt metadata: %s", attn_status_string(st));
            st = FZ_CALL(w->r, attn_mla_forward_mqa(w->layer, w->meta, &t, NULL, &t, &t, NULL, NULL));
            FZ_REQUIRE(st == ATTN_ERROR_UNSUPPORTED, "MLA decode on a standard layer: %s", attn_status_string(st));
            st = FZ_CALL(w->r, attn_mla_forward_mha(w->layer, w->meta, &t, &t, &t, &t, &t, NULL, NULL));
            FZ_REQUIRE(st == ATTN_ERROR_UNSUPPORTED, "MLA prefill on a standard layer: %s", attn_status_string(st));
            st = FZ_CALL(w->r, attn_mla_forward(w->layer, w->meta, &t, &t, NULL, NULL, &t, &t, &t, &t, NULL));
            FZ_REQUIRE(st == ATTN_ERROR_UNSUPPORTED, "attn_mla_forward on a standard layer: %s", attn_status_string(st));
            st = FZ_CALL(w->r, attn_concat_and_cache_mla(w->layer, &t2, &t2, &t, ATTN_SLOTS(&slot, 1), NULL));
            FZ_REQUIRE(st == ATTN_ERROR_UNSUPPORTED, "MLA cache write on a standard layer: %s", attn_status_string(st));
        }
    } else { /* a layer that differs in one field */
        attn_layer_desc d2 = *d;
        unsigned f = fz_byte(in) % 5;
        int schedule = 1;
        d2.alibi_slopes = NULL;
        d2.logits_soft_cap = 0;
        if (f == 0) d2.block_size += 16;
        else if (f == 1 && d->num_heads <= 64) {
            d2.num_heads *= 2;
            d2.num_kv_heads = d->use_mla ? 1 : d2.num_kv_heads * 2;
        } else if (f == 2 && !d->use_mla && d->sliding_window < 1000) d2.sliding_window += 1;
        else if (f == 3 && !d->use_mla) d2.causal = d->causal == ATTN_CAUSAL_YES ? ATTN_CAUSAL_NO : ATTN_CAUSAL_YES;
        else { d2.scale *= 2; schedule = 0; }
        if (FZ_CALL(w->r, attn_layer_create(w->r->ctx, &d2, NULL, &other)) != ATTN_OK) return;
        if (d->use_mla) st = FZ_CALL(w->r, attn_mla_forward_mqa(other, w->meta, &t, NULL, &t, &t, NULL, NULL));
        else st = FZ_CALL(w->r, attn_layer_forward(other, w->meta, &t, NULL, NULL, &t, &t, NULL, NULL));
        FZ_REQUIRE(st != ATTN_OK && (!schedule || st == ATTN_ERROR_INVALID_METADATA),
                   "metadata used by a layer of another configuration: %s", attn_status_string(st));
        attn_layer_destroy(other);
    }
    FZ_REQUIRE(memcmp(buf, ref, sizeof ref) == 0, "a call that must fail wrote its tensors");
}

/* ---- the target ---------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in;
    fz_run run;
    fz_world w;
    attn_layer_desc d;
    attn_select_request req;
    attn_mla_info info;
    float slopes[FZ_MAX_HEADS];
    uint64_t h = 1469598103934665603ull;
    unsigned flags;
    int round, rounds;
    size_t i;
    attn_status st;

    fz_stats.inputs++;
    in.p = data;
    in.n = size;
    for (i = 0; i < size; i++) h = (h ^ data[i]) * 1099511628211ull;
    fz_rng_state = h | 1;
    memset(&run, 0, sizeof run);
    memset(&w, 0, sizeof w);
    flags = fz_byte(&in);
    run.ctx = fz_ctx[flags & 1];
    run.log = &fz_logs[flags & 1];
    w.r = &run;
    if (flags & 2) setenv("ATTN_BATCH_INVARIANT", "1", 1);
    else unsetenv("ATTN_BATCH_INVARIANT");
    attn_selection_cache_clear(run.ctx); /* keeps the per-context cache from growing */

    fz_layer_decode(&in, &d, slopes);
    memset(&req, 0, sizeof req);
    if (flags & 4) {
        req.backend = (attn_backend_id)fz_edgy32(&in, 0, 3);
        req.allow_fallback = fz_byte(&in) & 1;
    }
    st = FZ_CALL(&run, attn_layer_create(run.ctx, &d, (flags & 4) ? &req : NULL, &w.layer));
    if (st != ATTN_OK) {
        FZ_REQUIRE(w.layer == NULL, "a failed attn_layer_create left a layer");
        goto done;
    }
    w.d = attn_layer_get_desc(w.layer);
    fz_stats.layers++;

    w.cap.max_num_reqs = fz_edgy32(&in, 1, 8);
    w.cap.max_num_tokens = fz_edgy32(&in, 1, w.d->use_mla ? 24 : 64);
    w.cap.max_blocks_per_req = fz_edgy32(&in, 1, w.d->use_mla ? 6 : 12);
    w.cap.num_blocks = fz_edgy(&in, 1, 48);
    w.cap.decode_threshold = (flags & 8) ? fz_edgy32(&in, 0, 16) : 0;
    w.cap.num_kv_splits = (flags & 16) ? fz_edgy32(&in, 0, 8) : 0;
    {
        static const int64_t ws[6] = {1 << 20, (1 << 20) - 1, 3 << 20, -1, (int64_t)1 << 40,
                                      ((int64_t)1 << 40) + 1};
        unsigned k = fz_byte(&in);
        w.cap.workspace_bytes = k < 200 ? 0 : ws[k % 6]; /* the MLA prefill workspace */
    }
    st = FZ_CALL(&run, attn_metadata_create(w.layer, &w.cap, &w.meta));
    if (st != ATTN_OK) {
        FZ_REQUIRE(w.meta == NULL, "a failed attn_metadata_create left metadata");
        goto done;
    }
    fz_stats.metas++;
    st = FZ_CALL(&run, attn_metadata_mla_info(w.meta, &info)); /* unbuilt, or standard */
    FZ_REQUIRE(st != ATTN_OK, "attn_metadata_mla_info succeeded on unbuilt metadata");
    if (flags & 64) fz_wrong_calls(&in, &w, 0);

    rounds = 1 + (int)(fz_byte(&in) % 4);
    for (round = 0; round < rounds; round++) {
        fz_batch g;
        fz_snapshot snap;
        fz_batch_generate(&in, &g, &w.cap, w.d);
        if (round > 0 || (flags & 32)) fz_batch_mutate(&in, &g);
        fz_batch_materialize(&run, &g, &w.cap);
        fz_snapshot_take(&run, w.meta, &snap);
        st = FZ_CALL(&run, attn_metadata_build(w.meta, g.common_prefix_len, &g.b, g.fast_build));
        if (st == ATTN_ERROR_OUT_OF_MEMORY) { w.keep.have = 0; continue; }
        if (st != ATTN_OK) { /* rejected: the previous batch and schedule are intact */
            fz_snapshot_same(w.meta, &snap);
            fz_stats.builds_rejected++;
            if (w.keep.have) {
                fz_stats.reruns++;
                if (w.d->use_mla) fz_mla_fused(&in, &w, 1);
                else fz_std_forward(&in, &w, 1);
            }
            continue;
        }
        fz_stats.builds_ok++;
        if ((flags & 128) && round == 0) fz_wrong_calls(&in, &w, 1);
        if (w.d->use_mla) {
            fz_mla_fused(&in, &w, 0);
            if (fz_byte(&in) < 128) fz_mla_fused(&in, &w, 2);
            else fz_mla_parts(&in, &w);
        } else {
            st = FZ_CALL(&run, attn_metadata_mla_info(w.meta, &info));
            FZ_REQUIRE(st == ATTN_ERROR_UNSUPPORTED, "mla_info on standard metadata: %s",
                       attn_status_string(st));
            fz_std_forward(&in, &w, 0);
            fz_std_forward(&in, &w, 2);
            if (fz_byte(&in) < 64) fz_std_cache_write(&in, &w);
        }
    }

done:
    attn_metadata_destroy(w.meta);
    attn_layer_destroy(w.layer);
    for (i = 0; i < (size_t)run.nbufs; i++) free(run.bufs[i]);
    return 0;
}
