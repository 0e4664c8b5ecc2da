/* attn.h - v0.15.1 - paged attention and MLA for C/C++, portable C and CUDA (NVRTC)

   Do this:
       #define ATTN_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the implementation.

       // i.e. it should look like this:
       #include ...
       #define ATTN_IMPLEMENTATION
       #include "attn.h"

   Link with -lpthread -lm (and -ldl on glibc older than 2.34).

   WHAT IT IS
       Paged-KV-cache attention as served by LLM inference engines (vLLM's v1 attention
       layer, in plain C): one call runs a batch that mixes prefills (with or without
       earlier context) and single-token decodes, over a block-paged KV cache, with GQA/MQA,
       causal or not, sliding window, logits soft cap and ALiBi. MLA (DeepSeek-V2/V3 latent
       attention): latent cache, absorbed split-KV decode, up-projected chunked prefill, the
       fused layer call and the LSE merge. Every call returns a status; every backend
       decision is logged and can be printed as a selection record.

   CONFIGURATION MACROS (define before including the implementation)
       ATTN_STATIC             make every function static (private copy per C file)
       ATTN_MALLOC(sz) ATTN_REALLOC(p,sz) ATTN_FREE(p)
                               custom allocator: define all three or none
       ATTN_ASSERT(x)          internal invariant check (default: assert.h)
       ATTN_NO_THREADS         compile the thread pool out (single-threaded CPU backend)
       ATTN_NO_SIMD            use the plain-C inner loops even where AVX2/AVX-512 exist
       ATTN_CPU_BF16_DOT       opt-in: decode QK on bf16 caches with AVX512-BF16 dot products
                               (vdpbf16ps); q is rounded to bf16, so results change slightly;
                               ignored where the build lacks AVX512-BF16
       ATTN_NO_CUDA            compile the CUDA path out whole: no CUDA library is ever
                               opened (no driver, NVRTC or cuBLAS probe), no kernel text or
                               compiler state is built in (the object is under a third of
                               the full one); the CUDA helpers and attn_kernel_compile answer
                               ATTN_ERROR_PLATFORM, and the platform's reasons say so
       ATTN_CUDA_DRIVER_LIBRARY  the driver's soname (default "libcuda.so.1"; the loader
                               then tries "libcuda.so")
       ATTN_NVRTC_LIBRARY      NVRTC's soname (default "libnvrtc.so.13"; then ".so.12",
                               "libnvrtc.so")
       ATTN_CUBLAS_LIBRARY     cuBLAS's soname (default "libcublas.so.13"; then ".so.12",
                               "libcublas.so"); opened only on a CUDA platform, on first need
       ATTN_MLA_WORKSPACE_BYTES  default of attn_metadata_desc.workspace_bytes (64 MiB): the
                               bound on each of forward_mha's workspaces (up-projected K/V of
                               a chunk of keys; running outputs of a group of queries). On
                               the GPU a chunk costs heads x (qk_nope + v) x 2 bytes a key:
                               960 keys at 128 heads; 320 MiB gives 4096

   ENVIRONMENT VARIABLES
       ATTN_BACKEND            force a backend by name (case-insensitive): CPU, CPU_MLA, CUDA,
                               CUDA_SM90, CUDA_MLA_SM90, CUDA_MLA
                               (code beats env; an unknown name fails and lists the names)
       ATTN_CACHE_DIR          where compiled kernels are kept (default $XDG_CACHE_HOME/attn,
                               else ~/.cache/attn; "off": in memory only); read at
                               attn_context_create unless attn_context_desc.kernel_cache_dir
       ATTN_CUDA_LIBRARY, ATTN_NVRTC_LIBRARY, ATTN_CUBLAS_LIBRARY
                               the CUDA driver, NVRTC and cuBLAS to open: a full path or a
                               soname, the only name tried (default: the compile-time
                               defaults above and their fallbacks); read at
                               attn_context_create unless attn_context_desc names them;
                               attn_platform's cuda_library / nvrtc_library /
                               cublas_library say what was opened
       ATTN_LOG_LEVEL          error | warn | info (default) | debug | none
       ATTN_NUM_THREADS        CPU worker threads, 1..1024 (default: the online cores)
       ATTN_KERNEL_DEFINES     tuning: "ROLE.NAME=VALUE ..." (ROLE decode, prefill, cache or
                               decode_wide; NAME an identifier; VALUE digits or an
                               identifier), -DNAME=VALUE appended to that role's kernel of
                               every CUDA layer created while it is set (e.g.
                               "decode.KV_TILE=64 decode.KV_STAGES=2"); the layer's record
                               shows it (kernel_defines); a malformed value is one WARN and
                               nothing is applied
       ATTN_BATCH_INVARIANT    on = never split a sequence's keys across threads (MLA: one
                               KV split, unless attn_metadata_desc.num_kv_splits forces a
                               count: an explicit count wins), so a row's result does not
                               depend on what else is in the batch; read at
                               attn_metadata_build (the CUDA and CUDA_SM90 backends: at
                               attn_metadata_create, so that a captured graph holds exactly
                               the decode kernels its builds can run) (default off)
       Booleans read 1/0, true/false, yes/no, on/off (case-insensitive). Apart from
       ATTN_BACKEND, a value that is not allowed logs one WARN line (ATTN_LOG_ENV_INVALID,
       through the context's hook) naming the variable, the value and what is allowed, and
       the default is used.

   BACKENDS, in automatic priority order per platform (a backend serves only layers of
   its kind: standard or MLA; CUSTOM, a plugin slot, leads when registered)
       platform CPU:   CUSTOM, CPU, CPU_MLA, CUDA_SM90, CUDA, CUDA_MLA_SM90, CUDA_MLA
                       (skipped: no device, but the record says so)
       platform CUDA:  CUSTOM, CUDA_SM90, CUDA, CUDA_MLA_SM90, CUDA_MLA, CPU, CPU_MLA
       Only backends of the layer's device (attn_layer_desc.device, CPU by default) serve it.
       CPU      standard attention: f32/f16/bf16, head sizes 8..512 step 8, any block size
                that is a multiple of 16, causal/non-causal, window, soft cap, ALiBi, LSE;
                KV caches also fp8 (see QUANTIZED CACHES)
       CPU_MLA  MLA: head size 576 (512+64) or 320 (256+64), causal, LSE; fp8 latent caches
       CUDA     standard attention on NVIDIA GPUs (compute capability 8.0+, NVRTC needed):
                the CPU backend's features and cache layout; head sizes 8..256 step 8,
                and 288..512 step 32 (Gemma-class 512: f16/bf16 q with the same cache
                type, or an 8-bit cache; kernels/paged_attention.cu, WIDE HEADS);
                f16/bf16 on tensor cores, f32 and mixed types on FMAs; split-KV; CUDA
                graphs: ALWAYS (a captured forward launches capacity grids that read the
                counts on the device)
       CUDA_SM90  the CUDA backend with its prefill tiles on Hopper's warpgroup MMA (wgmma,
                compiled for sm_90a): compute capability 9.0 only (H100, H200); q and
                cache of one 16-bit type, head size 64 or 128, no soft cap, no ALiBi. Its
                decode tiles, cache write, schedule and graph support are CUDA's. Where it
                does not apply (or its kernel cannot load) the record says why and CUDA
                serves the layer
       CUDA_MLA_SM90  MLA on compute capability 9.0 (sm_90a kernels; cuBLAS for the
                projections): head size 576 or 320, q = cache of one 16-bit type, qk_nope/v
                128/128 or 64/64, causal, LSE; the CPU_MLA cache layout. Decode on wgmma
                (64 heads of one token per CTA, split-KV merged by LSE), prefill up-projected
                per chunk of keys (cuBLAS) and attended on wgmma, chunks merged by LSE. q,
                q_pe and out rows must be 16-byte aligned (named error otherwise). CUDA
                graphs: UNIFORM_SINGLE_TOKEN_DECODE (forward_mqa replays for any decode batch
                of the metadata's capacity; the fused call for batches of its captured token
                count, its cuBLAS shapes being fixed at capture)
       CUDA_MLA  the same on mma.sync kernels, compute capability 8.0 and newer (the
                fallback where CUDA_MLA_SM90 does not apply): decode CTAs of 16, 32 or 64
                heads; split merges in attn_mla_merge; also fp8 latent caches (per tensor,
                see QUANTIZED CACHES), which CUDA_MLA_SM90 leaves to it
       A candidate is skipped, with a recorded reason, when a check fails (dtype, KV-cache
       dtype, head size, block size, feature, platform). Explicit requests (code or env)
       that cannot be honoured fail with ATTN_ERROR_BACKEND_UNAVAILABLE and every reason,
       unless attn_select_request.allow_fallback is set: then the automatic choice is used
       and a WARN line says why.

   QUANTIZED CACHES (issue 10; CPU, CPU_MLA, CUDA and CUDA_MLA; CUDA_SM90 and CUDA_MLA_SM90
   skip them with the reason in the record, and the selector moves on to CUDA / CUDA_MLA)
       kv_cache_dtype ATTN_DTYPE_FP8_E4M3 (vLLM's "fp8", "fp8_e4m3") or ATTN_DTYPE_FP8_E5M2,
       with per-tensor scales attn_layer_desc.k_scale / v_scale (MLA: k_scale for the
       latent): values, or pointers to one float read at every call (updated scales need
       no new layer). The cache write stores code(x / scale), rounded to nearest even,
       saturated to the largest finite code (PTX cvt's .satfinite: 448 for e4m3, 57344 for
       e5m2; infinities too), NaN kept; kernels read code * scale exactly and accumulate in
       f32. The cache shape is the unquantized one with 1-byte elements. Accuracy against
       the unquantized cache (asserted by tests/test_forward.c on random batches): for each
       output row, |out - out_unquantized| <= dv + (exp(2 ds) - 1) max|v|, where dv is the
       largest |v - v_cached| over the row's visible keys and ds the largest logit change
       scale * sum |q| |k - k_cached| (e4m3 keeps 3 mantissa bits: |x - x_cached| <= 2^-4 |x|
       for normal codes; e5m2 2 bits: 2^-3). Bad scales (0, negative, NaN, infinite, a
       pointer declared on another device than the layer's, or whose memory the CUDA driver
       places elsewhere than declared) are named errors at create;
       a pointer holding a bad value fails the call before anything is written.
       Per-token-head scales (kv_scale_kind ATTN_KV_SCALE_PER_TOKEN_HEAD; CPU, CUDA): int8 (vLLM's
       per-token-head int8) or fp8_e4m3 caches where every (token, KV head) row of K and of V
       gets scale = amax(row) / 127 (int8, codes rounded to nearest even) or / 448 (e4m3) at
       the cache write. The scales do not sit inline in the rows, which would misalign them
       (vLLM issue 56081): a block half is [block_size][num_kv_heads][head_size] codes, rows
       16-byte aligned when head_size is a multiple of 16, then [block_size][num_kv_heads]
       f32 scales; kv_cache_shape reports head_size + 4 (bytes a row, the scale included) and
       the record shows kv_cache_dtype int8 / fp8_e4m3. MLA latents: per-tensor fp8 only
       (CPU_MLA and CUDA_MLA say so in the record). The same accuracy bound is asserted.
       On the GPU (CUDA backend, head sizes in multiples of 16): the same bytes (the cache
       write kernel quantizes exactly as the CPU, tested bit for bit), read by the
       mma.sync kernel: codes to shared memory at half the bytes of f16, to f16 in the
       registers (exact), f16 tensor cores with f32 accumulation, q scaled by a power of
       two per CTA into f16's range; per-tensor scales as device pointers (read at every
       launch, so a replayed CUDA graph sees new values) or values. A device scale that is
       not finite and > 0 cannot be reported without a synchronisation: the kernels then
       write nothing (cache and output unchanged). CPU and CUDA agree within the f16
       rounding of q and of the probabilities (tests/test_cuda.c).
       CUDA_MLA reads an fp8 latent (e4m3 or e5m2, per-tensor k_scale) the same way in its
       decode (forward_mqa and the fused call's decode half); attn_concat_and_cache_mla
       quantizes with the CPU's bytes; forward_mha gathers the chunk's latent rows
       dequantized into the layer's 16-bit type for the up-projection GEMMs. On the H200 an
       fp8 latent decodes 1.65-1.96x faster than the bf16 latent on CUDA_MLA_SM90 at 16
       heads and batch x context >= 16 x 16k or 64 x 4k, but 0.8x at 128 heads (mma.sync
       against wgmma, compute-bound): BENCHMARKS.md.
       fp8_ds_mla (DeepSeek-V3.2's cache: 656-byte rows carrying 4 scales each) serves the
       sparse call only (attn_mla_forward_sparse): CPU_MLA decodes its rows exactly; the
       CUDA MLA backends copy them raw into shared memory and widen them there into the
       layer's 16-bit type (so the keys are rounded to bf16/f16 before S).

   ERRORS AND LOGGING
       Every public function returns attn_status (ATTN_OK = 0); attn_status_string() names
       it. The last error message names the argument, the value and what is allowed:
       attn_context_last_error(ctx) is the calling thread's last failure on ctx (each
       thread keeps its own, so threads failing on one context never see each other's
       message); with ctx == NULL, the thread's last failure without a context
       (attn_context_create, attn_reorder_batch, ...). Bad input never writes to outputs
       or caches.
       Log lines go through one hook (attn_context_desc.log) with a level and an item
       (attn_log_item, one X-macro list) so programs and tests can match on items. The
       selector logs each skipped candidate (DEBUG) and exactly one INFO line for each
       resolution, the default included. Cached resolutions log at DEBUG.

   SELECTION CACHE
       Resolutions are cached per context, keyed by the layer descriptor, the platform,
       the request *and the value of ATTN_BACKEND at the time of the call*: changing the
       variable later takes effect at the next attn_layer_create; attn_selection_cache_clear
       drops the cache.

   QUICK START (decode over a paged cache; see examples/paged_decode.c)
       attn_context *ctx;  attn_context_create(NULL, &ctx);
       attn_layer_desc d = {0};  d.num_heads = 32; d.num_kv_heads = 8; d.head_size = 128;
       d.dtype = ATTN_DTYPE_F16;  d.block_size = 16;
       attn_layer *layer;  attn_layer_create(ctx, &d, NULL, &layer);
       attn_metadata_desc md = {0}; md.max_num_reqs = 8; md.max_num_tokens = 8;
       md.max_blocks_per_req = 256; md.num_blocks = 2048;
       attn_metadata *meta;  attn_metadata_create(layer, &md, &meta);
       attn_metadata_build(meta, 0, &batch, 0);      // batch: attn_batch, see below
       attn_layer_forward(layer, meta, &q, &k, &v, &kv_cache, &out, NULL, NULL);

   FUNCTION LIST
       context   attn_context_create attn_context_destroy attn_context_last_error
                 attn_context_set_log_level attn_status_string attn_log_item_name
       types     attn_dtype_name attn_dtype_from_name attn_dtype_size attn_f32_to_f16
                 attn_f16_to_f32 attn_f32_to_bf16 attn_bf16_to_f32 attn_f32_to_fp8_e4m3
                 attn_fp8_e4m3_to_f32 attn_f32_to_fp8_e5m2 attn_fp8_e5m2_to_f32 attn_tensor_make
                 attn_tensor_slots attn_tensor_nbytes
       platform  attn_platform_get attn_platform_format
       cuda      attn_cuda_malloc attn_cuda_free attn_cuda_memcpy attn_cuda_synchronize
       kernels   attn_kernel_compile attn_kernel_compile_count
       backends  attn_backend_get attn_backend_name attn_backend_from_name
                 attn_register_backend
       selector  attn_select_backend attn_selection_format attn_selection_cache_clear
       layer     attn_layer_create attn_layer_destroy attn_layer_backend
                 attn_layer_selection attn_layer_get_desc attn_layer_kv_cache_shape
       metadata  attn_metadata_create attn_metadata_destroy attn_metadata_build
       plugins   attn_layer_context attn_layer_backend_state attn_context_backend_state
                 attn_layer_set_decode_parallelism
                 attn_metadata_batch attn_metadata_capacity attn_metadata_context
                 attn_metadata_private attn_metadata_private_set
       cache     attn_reshape_and_cache attn_concat_and_cache_mla
       forward   attn_layer_forward
       mla       attn_reorder_batch attn_metadata_mla_info attn_mla_num_kv_splits
                 attn_mla_forward_mqa attn_mla_forward_mha attn_mla_forward
                 attn_mla_forward_sparse
       merge     attn_merge_attn_states
       dcp       attn_dcp_local_tokens attn_dcp_combine attn_communicator_create_local
                 attn_communicator_destroy (decode context parallelism: attn_metadata_desc)

   ADDING A BACKEND (miniaudio's backend callbacks are the model)
       A backend is one const attn_backend: capability fields the selector and validation
       read, and hooks, each called with `self`. Registration checks the required hooks
       (standard: kv_cache_shape, forward, reshape_and_cache; MLA: kv_cache_shape,
       forward_mqa, forward_mha, mla_forward, concat_and_cache_mla). Plugins use
       attn_register_backend (tests/test_seam.c registers one through the public API and
       runs every hook). A built-in backend is: its section (>>cpu, >>cpu_mla,
       >>cuda_paged, >>cuda_mla), its id in attn_backend_id, one row of the built-in table
       in >>builtin (name, vtable, its rank in each platform's automatic order: the name,
       the registry and the priority lists all read it; the build fails if an id has no
       row), and for a GPU backend its kernel-family row in >>cuda (per role: file, entry
       points, architecture, launch config, parameter struct) that its layer_init and
       launches read. An ATTN_NO_CUDA build keeps the row with a NULL vtable.
       Lifecycle, and which state lives where:
         check          pure: can it serve this descriptor on this platform? (a reason)
         context_init   once per context, lazily, the first time the selector would pick
                        it: load libraries (through the context's loader), create handles,
                        open the kernel cache. State: attn_context_backend_state. A failure
                        is a skip reason remembered for the context's life.
                        context_release at attn_context_destroy.
         layer_init     when the selector picks it for a layer: compile or find the
                        variants for the layer's shapes. State: attn_layer_backend_state.
                        A failure is a skip reason in the layer's record and the selector
                        moves on (an explicit request fails with it). layer_release at
                        attn_layer_destroy. A GPU MLA backend may report here how many
                        decode items it runs at once (attn_layer_set_decode_parallelism),
                        which the split count of attn_metadata_mla_info then shares out.
                        Layer creation holds the context's selection lock: no hook may
                        call attn_layer_create or attn_select_backend on the same context.
         metadata_init  at attn_metadata_create: allocate, for the capacity
                        (attn_metadata_capacity, defaults resolved), the schedule and every
                        workspace forward will use, host and device. Private part:
                        attn_metadata_private_set. Metadata may outlive its layer, so keep
                        what build and forward need there. metadata_release frees it.
         build          at attn_metadata_build, after validation: turn the copied batch
                        (attn_metadata_batch; MLA: attn_metadata_mla_info, the backend-
                        neutral decode/prefill split and split count) into the schedule; a
                        GPU backend uploads it with one asynchronous copy. No allocation.
         entry points   forward / reshape_and_cache (standard); forward_mqa, forward_mha,
                        mla_forward, concat_and_cache_mla (MLA); merge_attn_states (any
                        backend, per device). Arguments are validated by the front door
                        (shapes, dtypes, device = self->device, metadata fit); the hook
                        allocates nothing, synchronises nothing, reads no device data on the
                        host, and works on the caller's stream, so a captured CUDA graph
                        replays after every build (cuda_graph says for which batches).

   THREAD SAFETY
       A context may be used from one thread at a time (its forward calls use the context's
       own worker threads), with one exception: threads may create layers of one context at
       once (attn_layer_create, attn_select_backend, attn_selection_cache_clear serialise on
       the context's selection lock; each kernel variant compiles once). Different contexts
       are independent. The backend registry is global and guarded by a lock. On a CUDA
       device the forwards that use one metadata must run one after another on the GPU (one
       stream, or streams ordered by events): the schedule and the split-KV merge counters
       live in the metadata, and two forwards in flight at once over it would share them.
       Give concurrent streams their own metadata.

   HISTORY
       0.1.0  backend abstraction, selector with selection record, metadata builder,
              paged KV cache, portable C backend; MLA on the portable path.
       0.2.0  the backend seam: lifecycle hooks with state, every front door through the
              vtable (cache writes, fused MLA call and LSE merge take a stream), device
              kind per backend, backend-neutral MLA plan, workspaces fixed at create,
              run-time loader table with an injection point (attn_context_desc.loader).
              NVRTC on the context with a memory and disk kernel cache; the layer names
              its device; the CUDA backend (first cut).
       0.3.0  CUDA speed: decode tiles in two shapes chosen per build, 128-row prefill
              tiles (two row tiles per warp), one launch per forward off graph capture;
              attn_platform.cuda_shared_per_block; the sm_90a wgmma base (kernels/wgmma.cuh).
       0.4.0  the CUDA_SM90 backend: wgmma prefill tiles on compute capability 9.0.
       0.5.0  the CUDA_MLA_SM90 backend: MLA decode and up-projected prefill on wgmma.
       0.6.0  the CUDA_MLA backend: the same on mma.sync (compute capability 8.0+).
       0.7.0  quantized KV caches on the CPU: fp8 e4m3/e5m2 per tensor, int8/e4m3 per token
              and head; fp8 MLA latents on CPU_MLA.
       0.8.0  8-bit KV caches on the CUDA backend.
       0.9.0  fp8 MLA latents on CUDA_MLA; the GPU MLA split policy over the backend's
              resident decode CTAs (attn_layer_set_decode_parallelism); a per-context
              selection lock (threads may create layers of one context at once).
       0.9.1  fixes found from outside (issue 20): metadata of an MLA layer with other
              qk_nope/v widths refused (was a heap overwrite); last errors per thread;
              explicit requests name every failing check; CUDA cache writes from host
              slots allocate, copy and wait for nothing (slots in the launch parameters);
              the selection record shows an 8-bit cache's scale kind.
       0.10.0 the house for more backends (issue 21, first steps). API changes: the cache
              writes take the slot mapping as an int64 tensor (ATTN_DTYPE_INT64; host, or
              the layer's device: one checked launch, capturable; attn_tensor_slots for a
              host array), and so do the backends' reshape/concat hooks; attn_selection's
              reasons and log line are longer. Every struct that crosses into a kernel is
              defined once (kernels/attn_params.cuh, embedded into the host part); kernel
              families and the registry are tables; ATTN_NO_CUDA removes the CUDA path
              whole; a backend's cuda_graph level and LSE base are enforced.
       0.11.0 Hopper pipelines, first kernel (issue 22): CUDA_SM90's prefill tiles are fed
              by a producer warpgroup through TMA (a tensor map of the cache encoded at each
              forward; attn_platform.cuda_tma; no TMA: CUDA serves, the record says why),
              any block size that is a multiple of 16; attn__launch_config gains
              tma_box_rows. The kernel split of 0.10 no longer costs split decode or the
              sm90 prefill time (issue 21). A decode-only metadata captures no prefill launch.
       0.12.0 Hopper pipelines (issue 22): CUDA_MLA_SM90's decode is FlashMLA's seesaw
              schedule fed through TMA (a tensor map of the latent cache encoded at each
              forward; no TMA: CUDA_MLA serves, the record says why), any block size that
              is a multiple of 16: 128 heads 488-532 TFLOP/s (was 336-349), 16 heads up to
              4.0 TB/s on the H200. ATTN_MLA_FUSED_MERGE_MAX is gone (the fused MLA merge
              was never faster; split entries merge in attn_mla_merge). A captured CUDA
              forward launches only the decode shapes its metadata can build;
              ATTN_BATCH_INVARIANT is read at attn_metadata_create on CUDA/CUDA_SM90.
       0.13.0 attention sinks (issue 23, first step): attn_layer_desc.sinks (gpt-oss; read
              at every call, a graph replay included; the LSE includes the sink) on CPU,
              CUDA and CUDA_SM90; the MLA backends refuse a layer with sinks by name
              (attn_backend.supports_sinks, a new capability field after supports_alibi).
              The CUDA decode kernel loops over its work items (PERSISTENT), so a captured
              decode launches one wave of CTAs whatever the metadata's capacity;
              attn__launch_config gains persistent. Cascade attention on the CPU
              (common_prefix_len, now validated); the CUDA libraries by name at run time
              (ATTN_CUDA_LIBRARY / ATTN_NVRTC_LIBRARY / ATTN_CUBLAS_LIBRARY, attn_context_desc,
              attn_platform's *_library).
       0.14.0 cascade attention on CUDA and CUDA_SM90 (issue 23): a decode batch built with
              common_prefix_len runs a prefix pass on the prefill tiles and joins it where
              the decode tiles store each row, captured in graphs too; the wgmma prefill
              writes partials for items with a slot; attn__paged_params gains the prefix
              fields, attn_backend gains supports_cascade (after supports_sinks), the
              record's features line lists cascade, and a build that uses the prefix logs
              CASCADE_PLANNED (DEBUG, a new log item at the end of the list). Sparse MLA
              (DeepSeek-V3.2's DSA): attn_mla_forward_sparse (request-local top-k indices,
              -1 padding), ATTN_DTYPE_INT32 and ATTN_DTYPE_FP8_DS_MLA (656-byte latent rows,
              written by attn_concat_and_cache_mla), MLA layers take desc.sinks (the sparse
              call joins them; the dense MLA calls refuse them by name), attn_backend gains
              forward_sparse (last), attn__mla_decode_params the sparse fields; on CPU_MLA
              and both CUDA MLA backends. Fixed: CUDA_MLA_SM90's decode encoded its tensor
              map outside the context (C callers without a current context got
              CUDA_ERROR_INVALID_CONTEXT).
       0.15.0 head sizes 288..512 (multiples of 32) on CUDA (issue 23): the paged kernel's
              warps come in two column groups past 256, each keeping half of O
              (kernels/paged_attention.cu, WIDE HEADS; f16/bf16 q with the same cache type,
              or an 8-bit cache; the others are refused by name and the CPU takes them);
              the per-token-head cache write takes heads up to 512. attn_h.py:
              PreparedForward / Layer.prepare_forward and torch_ops() (torch.library ops).
       0.15.1 CUDA_MLA_SM90's sparse call on a 16-bit 512 + 64 latent with more than 32
              heads runs the wgmma decode with rows gathered as one-row TMA boxes
              (kernels/mla_decode_sm90.cu, SPARSE 1; the sparse role of the family table
              takes the cache's map like the dense decode); H200, 128 heads, top-k 2048,
              batch 128: 161.6 -> 244.6 TFLOP/s. No API change.

   LICENSE: MIT, see the end of the file.
*/
#ifndef ATTN_H
#define ATTN_H

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 15
#define ATTN_VERSION_PATCH 1
#define ATTN_VERSION_STRING "0.15.1"

#include <stddef.h>
#include <stdint.h>

#ifndef ATTN_API
#ifdef ATTN_STATIC
#define ATTN_API static
#else
#define ATTN_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------
   Status codes and log items
   ------------------------------------------------------------------------------------- */

typedef enum attn_status {
    ATTN_OK = 0,
    /* caller errors: the call changed nothing */
    ATTN_ERROR_NULL_ARGUMENT = 1,        /* a required pointer was NULL */
    ATTN_ERROR_INVALID_VALUE = 2,        /* a size, count or enum is out of range */
    ATTN_ERROR_SHAPE_MISMATCH = 3,       /* a tensor's dtype/shape/strides/device disagree */
    ATTN_ERROR_INVALID_METADATA = 4,     /* the batch description is inconsistent */
    ATTN_ERROR_UNSUPPORTED = 5,          /* the backend cannot run this combination */
    ATTN_ERROR_BACKEND_UNAVAILABLE = 6,  /* an explicitly requested backend cannot serve */
    ATTN_ERROR_UNKNOWN_BACKEND = 7,      /* ATTN_BACKEND or a name matches no backend */
    ATTN_ERROR_CAPACITY = 8,             /* a batch exceeds the metadata's fixed capacity */
    /* environment errors */
    ATTN_ERROR_OUT_OF_MEMORY = 20,
    ATTN_ERROR_PLATFORM = 21,            /* threads, dynamic loading, driver */
    ATTN_ERROR_INTERNAL = 30
} attn_status;

/* One list of log items: the enum and the text come from it. */
#define ATTN_LOG_ITEMS(X)                                                        \
    X(NONE, "no item")                                                           \
    X(CONTEXT_CREATED, "context created")                                        \
    X(PLATFORM_PROBED, "platform probed")                                        \
    X(CUDA_UNAVAILABLE, "CUDA platform unavailable")                             \
    X(SELECT_CANDIDATE_SKIPPED, "backend candidate skipped")                     \
    X(SELECT_RESOLVED, "backend resolved")                                       \
    X(SELECT_CACHED, "backend resolution taken from the cache")                  \
    X(SELECT_FALLBACK, "explicit backend request degraded to automatic choice") \
    X(SELECT_EXPLICIT_FAILED, "explicit backend request cannot be honoured")     \
    X(SELECT_NO_BACKEND, "no backend supports the layer")                        \
    X(SELECT_UNKNOWN_ENV, "ATTN_BACKEND names no backend")                       \
    X(SELECT_CACHE_CLEARED, "selection cache cleared")                           \
    X(BACKEND_REGISTERED, "backend registry entry replaced")                     \
    X(BACKEND_RESTORED, "backend registry entry restored")                       \
    X(INVALID_ARGUMENT, "an argument value is out of range")                     \
    X(INVALID_METADATA, "invalid batch metadata")                                \
    X(ENV_INVALID, "environment variable has an invalid value")                  \
    X(THREADS_STARTED, "worker threads started")                                 \
    X(PLATFORM_ERROR, "platform facility failed (threads, loading)")            \
    X(OUT_OF_MEMORY, "out of memory")                                            \
    X(KERNEL_COMPILED, "kernel variant compiled by NVRTC")                       \
    X(KERNEL_CACHE_HIT, "kernel variant read from the disk cache")               \
    X(KERNEL_CACHE_FAULT, "kernel cache directory or file unusable")             \
    X(KERNEL_COMPILE_FAILED, "kernel variant failed to compile")                 \
    X(ARG_NULL, "a required pointer argument is NULL")                           \
    X(INVALID_DESC, "a descriptor or request field is out of range")             \
    X(TENSOR_DTYPE, "a tensor has another element type than allowed")            \
    X(TENSOR_SHAPE, "a tensor has another rank or shape than allowed")           \
    X(TENSOR_LAYOUT, "a tensor's strides are not allowed (rows not contiguous, overlapping output)") \
    X(TENSOR_DEVICE, "a tensor lives on another device than the layer's backend") \
    X(INVALID_SLOT, "a cache slot is out of range")                             \
    X(CALL_UNSUPPORTED, "the call does not fit the layer's kind or backend")     \
    X(METADATA_MISMATCH, "metadata not built, or built for another layer")       \
    X(CAPACITY_EXCEEDED, "a batch or capacity exceeds what is allowed")       \
    X(CASCADE_PLANNED, "a build attends the batch's shared prefix once (cascade)")

typedef enum attn_log_item {
#define ATTN__LOG_ENUM(name, text) ATTN_LOG_##name,
    ATTN_LOG_ITEMS(ATTN__LOG_ENUM)
#undef ATTN__LOG_ENUM
    ATTN_LOG_ITEM_COUNT
} attn_log_item;

typedef enum attn_log_level {
    ATTN_LOG_LEVEL_DEFAULT = 0, /* env ATTN_LOG_LEVEL, else INFO */
    ATTN_LOG_LEVEL_ERROR = 1,
    ATTN_LOG_LEVEL_WARN = 2,
    ATTN_LOG_LEVEL_INFO = 3,
    ATTN_LOG_LEVEL_DEBUG = 4,
    ATTN_LOG_LEVEL_NONE = 5     /* as a threshold: log nothing */
} attn_log_level;

/* The logger hook: `message` is one line without a newline, valid during the call. */
typedef void (*attn_log_fn)(void *user_data, attn_log_level level, attn_log_item item,
                            const char *message);

ATTN_API const char *attn_status_string(attn_status status);
ATTN_API const char *attn_log_item_name(attn_log_item item);

/* ---------------------------------------------------------------------------------------
   Element types and tensor views
   ------------------------------------------------------------------------------------- */

typedef enum attn_dtype {
    ATTN_DTYPE_AUTO = 0,  /* in descriptors: "same as the layer dtype" / default */
    ATTN_DTYPE_F32 = 1,
    ATTN_DTYPE_F16 = 2,
    ATTN_DTYPE_BF16 = 3,
    /* 8-bit floats, KV caches only (queries and outputs stay f32/f16/bf16), with a scale
       per tensor (attn_layer_desc.k_scale / v_scale): the cache holds x / scale. */
    ATTN_DTYPE_FP8_E4M3 = 4, /* OCP e4m3fn: bias 7, max 448, no infinity, NaN 0x7f/0xff */
    ATTN_DTYPE_FP8_E5M2 = 5, /* OCP e5m2: bias 15, max 57344, infinities, NaN */
    ATTN_DTYPE_INT8 = 6,     /* KV caches with per-token-head scales only: codes -127..127 */
    ATTN_DTYPE_INT64 = 7,    /* indices only: a cache write's slot mapping */
    ATTN_DTYPE_INT32 = 8,    /* indices only: sparse MLA's top-k token indices */
    /* DeepSeek-V3.2's fp8 latent cache (FlashMLA's "FP8 with scale", vLLM's fp8_ds_mla), MLA
       layers of kv_lora_rank 512 + rope 64 only: a token's row is 656 bytes, 512 e4m3 codes
       of kv_c, 4 f32 scales (one per 128 codes: x = code * scale), 64 bf16 k_pe values. The
       cache is [num_blocks, block_size, 656] bytes; it carries its own scales (no k_scale). */
    ATTN_DTYPE_FP8_DS_MLA = 9,
    ATTN_DTYPE_COUNT
} attn_dtype;

/* "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int64", "auto" */
ATTN_API const char *attn_dtype_name(attn_dtype dtype);
/* An element type by name, case-insensitive: "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"
   or "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", and vLLM's cache
   names "fp8" (= fp8_e4m3) and "fp8_e4m3"/"fp8_e5m2". Unknown names:
   ATTN_ERROR_INVALID_VALUE, *out unchanged. */
ATTN_API attn_status attn_dtype_from_name(const char *name, attn_dtype *out);
ATTN_API size_t attn_dtype_size(attn_dtype dtype);      /* 0 for AUTO or unknown */

/* Exact conversions, round to nearest even (NaN stays NaN, overflow goes to inf). */
ATTN_API uint16_t attn_f32_to_f16(float x);
ATTN_API float attn_f16_to_f32(uint16_t h);
ATTN_API uint16_t attn_f32_to_bf16(float x);
ATTN_API float attn_bf16_to_f32(uint16_t h);
/* 8-bit floats (OCP FP8): exact decoding of all 256 codes; encoding rounds to nearest
   even and saturates: a finite value beyond the largest finite code, and an infinity, give
   that code with the sign (448 for e4m3, 57344 for e5m2; PTX cvt's .satfinite); NaN gives
   NaN (0x7f with the sign). -0 stays -0. */
ATTN_API uint8_t attn_f32_to_fp8_e4m3(float x);
ATTN_API float attn_fp8_e4m3_to_f32(uint8_t c);
ATTN_API uint8_t attn_f32_to_fp8_e5m2(float x);
ATTN_API float attn_fp8_e5m2_to_f32(uint8_t c);

typedef enum attn_device_kind {
    ATTN_DEVICE_CPU = 0,
    ATTN_DEVICE_CUDA = 1
} attn_device_kind;

typedef struct attn_device {
    attn_device_kind kind;
    int index;
} attn_device;

#define ATTN_MAX_DIMS 6

/* A view of memory the caller owns. Strides are in elements; all-zero strides mean
   "contiguous" and are filled in by the library. Inputs may repeat elements (broadcast
   views); outputs may not (a stride of 0, or rows or heads that overlap, fail with
   ATTN_ERROR_SHAPE_MISMATCH). */
typedef struct attn_tensor {
    void *data;
    attn_dtype dtype;
    int ndim;
    int64_t shape[ATTN_MAX_DIMS];
    int64_t strides[ATTN_MAX_DIMS];
    attn_device device;
} attn_tensor;

/* A contiguous CPU view; shape has ndim entries (ndim <= ATTN_MAX_DIMS). */
ATTN_API attn_tensor attn_tensor_make(void *data, attn_dtype dtype, int ndim,
                                      const int64_t *shape);
/* A host view of a slot mapping, int64 [num_tokens] (the cache writes' argument): the
   shape a C caller's array of slots needs, e.g.
       attn_tensor sm = attn_tensor_slots(slots, n);
       attn_reshape_and_cache(layer, &k, &v, &cache, &sm, NULL); */
ATTN_API attn_tensor attn_tensor_slots(const int64_t *slots, int64_t num_tokens);
/* Bytes of a contiguous view: element size x the product of the shape. 0 for NULL, no
   dimensions, an empty dimension or AUTO; SIZE_MAX when the product does not fit in size_t
   (so that an allocation of that size fails rather than comes out short). */
ATTN_API size_t attn_tensor_nbytes(const attn_tensor *t);

/* ---------------------------------------------------------------------------------------
   Context: logger, last error, worker threads, selection cache
   ------------------------------------------------------------------------------------- */

typedef struct attn_context attn_context;

/* How the context opens run-time libraries (the CUDA driver; NVRTC and cuBLAS later).
   NULL members fall back to dlopen(RTLD_NOW | RTLD_LOCAL) / dlsym / dlclose; tests and
   unusual installs inject their own. */
typedef struct attn_loader {
    void *(*open)(void *user_data, const char *soname);   /* NULL: not found */
    void *(*symbol)(void *user_data, void *library, const char *name);
    void (*close)(void *user_data, void *library);
    void *user_data;
} attn_loader;

typedef struct attn_context_desc {
    attn_log_fn log;           /* NULL: lines go to stderr as "attn: LEVEL: message" */
    void *log_user_data;
    attn_log_level log_level;  /* DEFAULT: env ATTN_LOG_LEVEL, else INFO */
    int num_threads;           /* 0: env ATTN_NUM_THREADS, else online cores */
    const attn_loader *loader; /* NULL: dlopen; copied at create */
    const char *kernel_cache_dir; /* NULL: env ATTN_CACHE_DIR, else $XDG_CACHE_HOME/attn,
                                     else ~/.cache/attn; "off": memory only */
    /* The CUDA libraries to open, each a full path or a soname (copied at create): NULL or
       "": env ATTN_CUDA_LIBRARY / ATTN_NVRTC_LIBRARY / ATTN_CUBLAS_LIBRARY, else the
       compile-time defaults of the same names and their fallbacks (the config block). A
       name given here or in the environment is the only one tried; attn_platform says which
       file each library was opened as. (PyTorch's wheels keep NVRTC and cuBLAS under
       site-packages/nvidia/..., off the loader path: point these there.) */
    const char *cuda_library, *nvrtc_library, *cublas_library;
} attn_context_desc;

/* desc may be NULL (all defaults). On failure *out is NULL and the message is in
   attn_context_last_error(NULL); it is logged through desc's hook and level already. */
ATTN_API attn_status attn_context_create(const attn_context_desc *desc, attn_context **out);
ATTN_API void attn_context_destroy(attn_context *ctx);
/* The calling thread's last error message on ctx ("" if none); ctx == NULL: its last
   failure without a context (e.g. attn_context_create). Per thread: another thread's
   failure on the same context does not replace it. The pointer stays valid until this
   thread's next failure. */
ATTN_API const char *attn_context_last_error(const attn_context *ctx);
ATTN_API attn_status attn_context_set_log_level(attn_context *ctx, attn_log_level level);

/* ---------------------------------------------------------------------------------------
   Platform
   ------------------------------------------------------------------------------------- */

typedef enum attn_platform_kind {
    ATTN_PLATFORM_CPU = 0,
    ATTN_PLATFORM_CUDA = 1
} attn_platform_kind;

typedef struct attn_platform {
    attn_platform_kind kind;      /* CUDA when a driver and a device were found */
    int cpu_cores;                /* online cores */
    int cpu_threads;              /* worker threads the context uses */
    char cpu_simd[32];            /* the inner loops compiled in: "avx512", "avx2", "c" */
    int cuda_device_count;
    int cuda_capability_major;    /* of device 0; 0 when none */
    int cuda_capability_minor;
    int cuda_multiprocessors;
    int cuda_shared_per_block;    /* bytes of shared memory a block may opt in to; 0 when none */
    char cuda_device_name[96];
    int cuda_driver_version;      /* e.g. 13000; 0 when unknown */
    uint64_t cuda_memory_bytes;   /* of device 0; 0 when none */
    char cuda_reason[160];        /* why the CUDA platform is unavailable, else "" */
    int nvrtc_version;            /* run-time compiler found, e.g. 13000; 0 when none */
    char nvrtc_reason[160];       /* why NVRTC is unavailable, else "" */
    int cublas_version;           /* e.g. 130100; 0 when none. Loaded on the first
                                     attn_platform_get on a CUDA platform (not before:
                                     the library takes 50-400 ms to open) */
    char cublas_reason[160];      /* why cuBLAS is unavailable, else "" */
    int cuda_tma;                 /* 1: the tensor memory accelerator is usable (compute
                                     capability 9.0 or newer and a driver that encodes
                                     tensor maps, cuTensorMapEncodeTiled); 0: not */
    char cuda_tma_reason[96];     /* why not, else "" */
    char cuda_library[256];       /* the name (path or soname) each library was opened as; */
    char nvrtc_library[256];      /*   "" when it was not (the reasons above say why) */
    char cublas_library[256];
} attn_platform;

ATTN_API attn_status attn_platform_get(attn_context *ctx, attn_platform *out);
/* Writes a multi-line description; returns the length it needed (like snprintf). */
ATTN_API size_t attn_platform_format(const attn_platform *p, char *buf, size_t size);

/* ---------------------------------------------------------------------------------------
   CUDA helpers for C programs without the CUDA runtime (the device's primary context, so
   pointers from the runtime or PyTorch in the same process work too). Without a CUDA
   device they fail with ATTN_ERROR_PLATFORM and the reason.
   ------------------------------------------------------------------------------------- */

typedef enum attn_copy_kind {
    ATTN_COPY_HOST_TO_DEVICE = 1,
    ATTN_COPY_DEVICE_TO_HOST = 2,
    ATTN_COPY_DEVICE_TO_DEVICE = 3
} attn_copy_kind;

ATTN_API attn_status attn_cuda_malloc(attn_context *ctx, size_t bytes, void **ptr);
ATTN_API attn_status attn_cuda_free(attn_context *ctx, void *ptr);   /* NULL: nothing */
/* stream: a CUstream / cudaStream_t; NULL = the legacy default stream, and then the copy
   is complete when the call returns. */
ATTN_API attn_status attn_cuda_memcpy(attn_context *ctx, void *dst, const void *src, size_t bytes,
                                      attn_copy_kind kind, void *stream);
ATTN_API attn_status attn_cuda_synchronize(attn_context *ctx, void *stream);

/* ---------------------------------------------------------------------------------------
   Run-time kernel compilation (NVRTC; no GPU needed to compile)
   ------------------------------------------------------------------------------------- */

typedef enum attn_kernel_source {
    ATTN_KERNEL_COMPILED = 1,      /* NVRTC ran */
    ATTN_KERNEL_FROM_MEMORY = 2,   /* the context had it */
    ATTN_KERNEL_FROM_DISK = 3      /* the disk cache had it */
} attn_kernel_source;

typedef struct attn_kernel_info {
    char kernel[64];               /* the embedded file, e.g. "paged_attention.cu" */
    char arch[16];                 /* e.g. "sm_90" */
    attn_kernel_source source;
    size_t cubin_bytes;
    int registers;                 /* the most any function of the file uses (ptxas) */
    int shared_bytes;              /* the most static shared memory of any function */
    int spill_stores, spill_loads; /* bytes, all functions */
    double compile_ms;             /* of the compile that made it */
    char log[1024];                /* the start of the NVRTC log of that compile */
} attn_kernel_info;

/* Compiles one variant of an embedded kernel file to CUBIN for `arch` ("sm_80", "sm_90",
   "sm_90a"), with `options` (space-separated NVRTC options, e.g. "-DHEAD_DIM=128"), or
   finds it in the context's memory or disk cache. Backends call this at layer creation;
   tools and tests use it to check that every variant builds. A compile error returns
   ATTN_ERROR_PLATFORM with the NVRTC log in the message. info may be NULL. */
ATTN_API attn_status attn_kernel_compile(attn_context *ctx, const char *kernel, const char *options,
                                         const char *arch, attn_kernel_info *info);
/* NVRTC compilations this context has run (cache hits excluded). */
ATTN_API int attn_kernel_compile_count(const attn_context *ctx);

/* ---------------------------------------------------------------------------------------
   Layer descriptor (zero-initialise; 0 means default)
   ------------------------------------------------------------------------------------- */

typedef enum attn_causal {
    ATTN_CAUSAL_DEFAULT = 0, /* layer: causal (decoder); batch: the layer's setting */
    ATTN_CAUSAL_YES = 1,
    ATTN_CAUSAL_NO = 2
} attn_causal;

/* The scale of an fp8 KV cache (per tensor): the cache holds x / scale, the kernels read
   code * scale. Either a value, or a pointer to one float read at every forward and cache
   write (vLLM's k_scale / v_scale tensors: a captured graph sees updated scales). */
typedef struct attn_kv_scale {
    float value;              /* used when ptr is NULL: finite and > 0 (e.g. 1.0) */
    const float *ptr;         /* or the scale's address, read at each call: finite and > 0 */
    attn_device_kind device;  /* where ptr points: host memory (CPU) for a CPU layer */
} attn_kv_scale;

/* Where an 8-bit cache's scales are. */
typedef enum attn_kv_scale_kind {
    ATTN_KV_SCALE_PER_TENSOR = 0,    /* fp8_e4m3 / fp8_e5m2: desc.k_scale and desc.v_scale */
    /* int8 / fp8_e4m3: every (token, KV head) row of K and of V has its own scale, amax / 127
       (int8) or amax / 448 (e4m3) of the row, set by the cache write and stored in the cache
       beside the rows: a block half is [block_size][num_kv_heads][head_size] codes (rows stay
       16-byte aligned for head sizes that are multiples of 16), then [block_size]
       [num_kv_heads] f32 scales; kv_cache_shape counts head_size + 4 bytes per row. */
    ATTN_KV_SCALE_PER_TOKEN_HEAD = 1
} attn_kv_scale_kind;

typedef struct attn_layer_desc {
    int num_heads;             /* query heads, required */
    int num_kv_heads;          /* 0: num_heads; must divide num_heads */
    int head_size;             /* required (MLA: kv_lora_rank + qk_rope_head_dim) */
    attn_dtype dtype;          /* q/k/v/out element type; AUTO: F16 */
    attn_dtype kv_cache_dtype; /* AUTO: dtype */
    int block_size;            /* tokens per KV-cache block; 0: 16; multiple of 16 */
    float scale;               /* softmax scale; 0: 1/sqrt(head_size) (MLA: 1/sqrt(
                                  qk_nope_head_dim + qk_rope_head_dim), the query's width) */
    attn_causal causal;        /* DEFAULT: causal */
    int sliding_window;        /* 0: none; else a key is seen only within this many positions */
    float logits_soft_cap;     /* 0: none; else logits = cap * tanh(logits / cap) */
    const float *alibi_slopes; /* NULL: none; else num_heads slopes (copied at create) */
    /* MLA (multi-head latent attention) */
    int use_mla;
    int kv_lora_rank;          /* 512 or 256 */
    int qk_rope_head_dim;      /* 64 */
    int qk_nope_head_dim;      /* 128 */
    int v_head_dim;            /* 128 */
    /* Where the layer's tensors (q/k/v/out/lse, the cache, the MLA weights) live: the
       caller's choice, and the selector considers only backends for that device. CPU (0)
       by default, so existing programs keep running on the CPU on a GPU machine. */
    attn_device_kind device;
    /* fp8 caches (kv_cache_dtype FP8_E4M3 / FP8_E5M2): required, per tensor. MLA: k_scale
       is the latent's; v_scale is unused there. Other caches ignore them (a value or
       pointer set anyway must still be valid). */
    attn_kv_scale k_scale, v_scale;
    attn_kv_scale_kind kv_scale_kind; /* PER_TENSOR (default) or PER_TOKEN_HEAD (no k/v_scale) */
    /* Attention sinks (gpt-oss): NULL: none; else num_heads finite logits, one per query
       head, each joining its head's softmax as a key with no value:
         out = sum_j e^(s_j) v_j / (e^(sinks[h]) + sum_j e^(s_j)),
       s_j the logits after scale, soft cap and ALiBi (the sink is not capped). They live
       where the layer's tensors do (desc.device: host memory for CPU layers, device memory
       for CUDA ones) and are read at every forward, not copied, so new values take effect
       at the next call (and at a CUDA graph's next replay). The LSE a forward returns
       includes the sink, lse = log(e^(sinks[h]) + sum_j e^(s_j)), as vLLM's and
       FlashAttention's sink kernels return it; a row that sees no key gets out 0 and lse =
       sinks[h]. (attn_merge_attn_states of two outputs that both include the sink counts
       it twice: merge partials of a sinkless layer and let one side carry the sink.) */
    const float *sinks;
} attn_layer_desc;

/* ---------------------------------------------------------------------------------------
   Backends (layer 1): a const vtable per backend and a registry id -> backend
   ------------------------------------------------------------------------------------- */

typedef enum attn_backend_id {
    ATTN_BACKEND_AUTO = 0,   /* in requests: let the selector choose */
    ATTN_BACKEND_CPU = 1,    /* portable C, standard attention */
    ATTN_BACKEND_CPU_MLA = 2, /* portable C, MLA (latent cache) */
    ATTN_BACKEND_CUSTOM = 3, /* empty until a plugin registers it */
    ATTN_BACKEND_CUDA = 4,   /* NVIDIA GPUs (compute capability 8.0+), kernels compiled by NVRTC */
    ATTN_BACKEND_CUDA_SM90 = 5, /* CUDA with wgmma prefill tiles (compute capability 9.0, sm_90a) */
    ATTN_BACKEND_CUDA_MLA_SM90 = 6, /* MLA on wgmma and cuBLAS (compute capability 9.0, sm_90a) */
    ATTN_BACKEND_CUDA_MLA = 7, /* MLA on mma.sync and cuBLAS (compute capability 8.0+) */
    ATTN_BACKEND_COUNT
} attn_backend_id;

typedef enum attn_cuda_graph_support {
    ATTN_CUDA_GRAPH_NEVER = 0,
    ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE = 1,
    ATTN_CUDA_GRAPH_UNIFORM_BATCH = 2,
    ATTN_CUDA_GRAPH_ALWAYS = 3
} attn_cuda_graph_support;

typedef enum attn_lse_base {
    ATTN_LSE_BASE_E = 0,
    ATTN_LSE_BASE_2 = 1
} attn_lse_base;

#define ATTN_DTYPE_BIT(d) (1u << (unsigned)(d))

typedef struct attn_layer attn_layer;
typedef struct attn_metadata attn_metadata;
typedef struct attn_batch attn_batch;
typedef struct attn_backend attn_backend;

/* What a backend is and supports (the selector reads these), its lifecycle hooks and its
   entry points. A plugin fills one of these (static storage: the vtable must outlive every
   context that used it) and passes it to attn_register_backend. See "ADDING A BACKEND" in
   the doc block at the top for which state lives where and what each hook may do.
   Every hook gets `self`, the vtable it was called through. */
struct attn_backend {
    /* ---- identity and capabilities: read by the selector and by validation ---- */
    const char *name;                /* matched case-insensitively by ATTN_BACKEND */
    attn_backend_id id;
    attn_device_kind device;         /* where every tensor of its layers must live */
    unsigned dtypes;                 /* ATTN_DTYPE_BIT mask of q/k/v/out types */
    unsigned kv_cache_dtypes;        /* mask of KV-cache element types */
    int head_size_min, head_size_max, head_size_multiple;
    int block_size_multiple;         /* kernel block sizes: multiples of this (16) */
    int block_size_max;              /* 0: no limit */
    int supports_non_causal;
    int supports_sliding_window;
    int supports_logits_soft_cap;
    int supports_alibi;
    int supports_sinks;              /* attn_layer_desc.sinks */
    int supports_cascade;            /* uses attn_metadata_build's common_prefix_len (cascade
                                        attention; where it does not, results are the same) */
    int is_mla;
    attn_cuda_graph_support cuda_graph; /* which calls a captured graph may hold: a call on
                                        a capturing stream outside it is refused (NEVER: all;
                                        UNIFORM_SINGLE_TOKEN_DECODE: batches of one-token
                                        decodes and forward_mqa; UNIFORM_BATCH: one query
                                        length for every request; ALWAYS: any) */
    int can_return_lse;
    attn_lse_base lse_base;          /* base of the LSE its kernels produce: base 2 on CPU
                                        backends only (the front doors convert the rows in
                                        place); callers always get base e */

    /* ---- lifecycle ---- */
    /* Extra checks beyond the fields above; NULL = none. Return 0 if supported, else
       write why into reason. Must not allocate or touch the context. */
    int (*check)(const attn_backend *self, const attn_layer_desc *desc,
                 const attn_platform *platform, char *reason, size_t reason_size);
    /* Once per context, the first time the selector would pick this backend: load
       libraries, create handles, open the kernel cache. *state is kept on the context
       and handed back to context_release. A failure is a skip reason (write it into
       reason), remembered for the context's lifetime. NULL = nothing to do. */
    attn_status (*context_init)(const attn_backend *self, attn_context *ctx, void **state,
                                char *reason, size_t reason_size);
    void (*context_release)(const attn_backend *self, attn_context *ctx, void *state);
    /* Once per layer, when the selector picks this backend for it: compile or look up
       the variants for this layer's shapes. A failure is a skip reason in the layer's
       selection record and the selector moves on. *state: attn_layer_backend_state. */
    attn_status (*layer_init)(const attn_backend *self, attn_layer *layer, void **state,
                              char *reason, size_t reason_size);
    void (*layer_release)(const attn_backend *self, attn_layer *layer, void *state);
    /* KV-cache shape for num_blocks blocks of a layer (returns ndim). */
    int (*kv_cache_shape)(const attn_backend *self, const attn_layer_desc *desc,
                          int64_t num_blocks, int64_t shape[ATTN_MAX_DIMS]);
    /* Metadata: init allocates everything the backend needs for the metadata's fixed
       capacity (attn_metadata_capacity), its schedule and every workspace forward uses,
       and sets attn_metadata_private_set; release frees it. build turns the validated,
       copied batch (attn_metadata_batch; MLA: attn_metadata_mla_info) into the schedule
       and may not allocate. Metadata may outlive the layer that created it: keep what
       build and forward need in the private part. */
    attn_status (*metadata_init)(const attn_backend *self, attn_layer *layer, attn_metadata *meta);
    void (*metadata_release)(const attn_backend *self, attn_metadata *meta);
    attn_status (*build)(const attn_backend *self, attn_layer *layer, attn_metadata *meta,
                         int common_prefix_len, int fast_build);

    /* ---- entry points: arguments already validated by the front door; none may
       allocate, and a GPU backend may not synchronise (CUDA-graph capture) ---- */
    /* Standard attention (is_mla = 0): forward (k/v NULL when already cached) and the
       cache write. A cache write's slot_mapping is a validated int64 [num_tokens] tensor,
       contiguous: host memory (its slots checked) or the layer's device (unchecked: a GPU
       backend checks them on the device and writes nothing when one is out of range). */
    attn_status (*forward)(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                           const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                           attn_tensor *kv_cache, attn_tensor *out, attn_tensor *lse,
                           void *stream);
    attn_status (*reshape_and_cache)(const attn_backend *self, attn_layer *layer,
                                     const attn_tensor *key, const attn_tensor *value,
                                     attn_tensor *kv_cache, const attn_tensor *slot_mapping,
                                     void *stream);
    /* MLA (is_mla = 1): absorbed decode, up-projected prefill, the fused layer call and
       the latent cache write; arguments as the public calls of the same names. */
    attn_status (*forward_mqa)(const attn_backend *self, attn_layer *layer,
                               const attn_metadata *meta, const attn_tensor *q,
                               const attn_tensor *q_pe, const attn_tensor *kv_cache,
                               attn_tensor *out_latent, attn_tensor *lse, void *stream);
    attn_status (*forward_mha)(const attn_backend *self, attn_layer *layer,
                               const attn_metadata *meta, const attn_tensor *q,
                               const attn_tensor *kv_cache, const attn_tensor *w_uk,
                               const attn_tensor *w_uv, attn_tensor *out, attn_tensor *lse,
                               void *stream);
    attn_status (*mla_forward)(const attn_backend *self, attn_layer *layer,
                               const attn_metadata *meta, const attn_tensor *q_nope,
                               const attn_tensor *q_pe, const attn_tensor *kv_c,
                               const attn_tensor *k_pe, attn_tensor *kv_cache,
                               const attn_tensor *w_uk, const attn_tensor *w_uv,
                               attn_tensor *out, void *stream);
    attn_status (*concat_and_cache_mla)(const attn_backend *self, attn_layer *layer,
                                        const attn_tensor *kv_c, const attn_tensor *k_pe,
                                        attn_tensor *kv_cache, const attn_tensor *slot_mapping,
                                        void *stream);
    /* The LSE merge for tensors on this backend's device (any backend; NULL = none).
       attn_merge_attn_states picks the first backend of the platform's priority list
       whose device holds the tensors and which has this hook. */
    attn_status (*merge_attn_states)(const attn_backend *self, attn_context *ctx,
                                     const attn_tensor *out_a, const attn_tensor *lse_a,
                                     attn_lse_base base_a, const attn_tensor *out_b,
                                     const attn_tensor *lse_b, attn_lse_base base_b,
                                     attn_tensor *out, attn_tensor *lse,
                                     attn_lse_base base_out, void *stream);
    /* Sparse MLA (attn_mla_forward_sparse; NULL: the backend has none, the call is refused
       by name). Last, so plugins written before it leave it NULL. */
    attn_status (*forward_sparse)(const attn_backend *self, attn_layer *layer,
                                  const attn_metadata *meta, const attn_tensor *q,
                                  const attn_tensor *q_pe, const attn_tensor *kv_cache,
                                  const attn_tensor *indices, attn_tensor *out_latent,
                                  attn_tensor *lse, void *stream);
};

ATTN_API const attn_backend *attn_backend_get(attn_backend_id id); /* NULL if empty */
ATTN_API const char *attn_backend_name(attn_backend_id id);        /* "AUTO", "CPU", ... */
/* Case-insensitive lookup among registered backends. */
ATTN_API attn_status attn_backend_from_name(const char *name, attn_backend_id *out);
/* Replace the registry entry for id (backend->id must equal id); backend == NULL restores
   the built-in entry (or empties CUSTOM). Selection caches of all contexts are stale
   afterwards: call attn_selection_cache_clear. */
ATTN_API attn_status attn_register_backend(attn_backend_id id, const attn_backend *backend);

/* ---------------------------------------------------------------------------------------
   Selector (layer 2): code > env ATTN_BACKEND > automatic, always with a record
   ------------------------------------------------------------------------------------- */

typedef struct attn_select_request {
    attn_backend_id backend;  /* AUTO: not forced by code */
    int allow_fallback;       /* explicit (code or env) failures degrade with a WARN line */
} attn_select_request;

typedef enum attn_selection_source {
    ATTN_SELECTION_AUTO = 0,
    ATTN_SELECTION_CODE = 1,
    ATTN_SELECTION_ENV = 2
} attn_selection_source;

#define ATTN_SELECTION_MAX_SKIPPED 8

typedef struct attn_selection {
    /* selection */
    char env_var[16];                 /* "ATTN_BACKEND" */
    char env_value[64];               /* its value at resolution time, "" if unset */
    int env_set;
    int forced_by_code;
    attn_backend_id forced_backend;   /* AUTO unless forced_by_code */
    attn_backend_id default_backend;  /* first of the platform's list of the layer's kind and
                                         device whose capabilities fit the layer (the first
                                         of its kind and device when none fits) */
    attn_backend_id requested;        /* what code or env asked for, AUTO if nothing */
    attn_backend_id resolved;         /* AUTO only on failure */
    attn_selection_source source;     /* where the resolved choice came from */
    int degraded;                     /* an explicit request was not honoured */
    char degradation[320];            /* why, or "none" */
    /* inputs */
    attn_dtype dtype;
    attn_dtype kv_cache_dtype;        /* effective */
    attn_kv_scale_kind kv_scale_kind; /* an 8-bit cache's scales: per tensor or per token and head */
    int block_size;                   /* effective */
    int sliding_window;
    int head_size;
    int num_heads, num_kv_heads;
    int use_mla;
    attn_device_kind device;          /* where the layer's tensors live */
    int device_capability;            /* major*10+minor, 0 on CPU */
    attn_platform_kind platform;
    /* what the resolved backend declares */
    attn_device_kind backend_device;  /* where the layer's tensors must live */
    attn_cuda_graph_support cuda_graph;
    int can_return_lse;
    attn_lse_base lse_base;           /* of its kernels; callers always get base e */
    /* evidence */
    int num_skipped;
    struct {
        attn_backend_id backend;
        char reason[320];
    } skipped[ATTN_SELECTION_MAX_SKIPPED];
    char log_line[1024];               /* the INFO line that was logged */
    /* a layer's record only: ATTN_KERNEL_DEFINES as the layer's kernels were compiled with
       it ("" when unset, or when the layer's backend compiles no kernels) */
    char kernel_defines[256];
} attn_selection;

/* Resolves without creating a layer. On ATTN_ERROR_BACKEND_UNAVAILABLE /
   ATTN_ERROR_UNKNOWN_BACKEND / ATTN_ERROR_UNSUPPORTED the record still says why. */
ATTN_API attn_status attn_select_backend(attn_context *ctx, const attn_layer_desc *desc,
                                         const attn_select_request *request,
                                         attn_selection *out);
/* The record in the field layout of the seed report (YAML-like); returns needed length. */
ATTN_API size_t attn_selection_format(const attn_selection *s, char *buf, size_t size);
ATTN_API attn_status attn_selection_cache_clear(attn_context *ctx);

/* ---------------------------------------------------------------------------------------
   Layer: a resolved backend plus the validated descriptor
   ------------------------------------------------------------------------------------- */

/* request may be NULL (automatic). */
ATTN_API attn_status attn_layer_create(attn_context *ctx, const attn_layer_desc *desc,
                                       const attn_select_request *request, attn_layer **out);
ATTN_API void attn_layer_destroy(attn_layer *layer);
ATTN_API const attn_backend *attn_layer_backend(const attn_layer *layer);
ATTN_API const attn_selection *attn_layer_selection(const attn_layer *layer);
/* For backends: the state layer_init stored, and the context-level state of a backend
   (NULL until the selector first initialised it in this context). */
ATTN_API void *attn_layer_backend_state(const attn_layer *layer);
ATTN_API void *attn_context_backend_state(const attn_context *ctx, const attn_backend *backend);
/* For GPU MLA backends (from layer_init): the decode work items the device runs at once
   (resident_items: the decode kernel's CTAs per multiprocessor x multiprocessors) and the
   heads of one token an item holds (heads_per_item). attn_metadata_mla_info's split count
   shares resident_items among a batch's decode items. Unset: one item of 64 heads per
   multiprocessor. resident_items 1 .. 2^20, heads_per_item 1 .. 4096. */
ATTN_API attn_status attn_layer_set_decode_parallelism(attn_layer *layer, int resident_items, int heads_per_item);
/* The effective descriptor (defaults filled in). */
ATTN_API const attn_layer_desc *attn_layer_get_desc(const attn_layer *layer);
/* Standard: [num_blocks, 2, block_size, num_kv_heads, head_size]. Returns ndim via out.
   num_blocks: 1..2^40, the cap of every block count (metadata, cache tensors). */
ATTN_API attn_status attn_layer_kv_cache_shape(attn_layer *layer, int64_t num_blocks,
                                               int64_t shape[ATTN_MAX_DIMS], int *ndim);

/* ---------------------------------------------------------------------------------------
   Metadata builder (layer 3)
   ------------------------------------------------------------------------------------- */

/* The backend-neutral description of one batch (vLLM's CommonAttentionMetadata). Tokens
   of request i are rows query_start_loc[i] .. query_start_loc[i+1]-1 of q/k/v/out; they
   are the *last* query_len positions of a sequence of seq_lens[i] tokens. */
struct attn_batch {
    const int32_t *query_start_loc; /* [num_reqs + 1], starts at 0, non-decreasing */
    const int32_t *seq_lens;        /* [num_reqs], context + new tokens */
    const int32_t *block_table;     /* [num_reqs, block_table_stride] block ids */
    int block_table_stride;         /* entries per row (>= blocks any row needs) */
    const int64_t *slot_mapping;    /* [num_actual_tokens] cache slot of each new token, -1 = pad */
    int num_reqs;
    int num_actual_tokens;          /* == query_start_loc[num_reqs] */
    int max_query_len;              /* == max of query lengths */
    int max_seq_len;                /* == max of seq_lens */
    attn_causal causal;             /* DEFAULT: the layer's setting */
    void *stream;                   /* CUDA layers: the stream the schedule is uploaded on
                                       (NULL: the legacy default stream); CPU: ignored */
};

/* A DCP group's exchange (attn_metadata_desc.dcp_comm): `size` ranks, this one `rank`.
   all_gather copies every rank's `bytes` from `send` into `recv` in rank order (recv
   holds size * bytes); it is called by every rank of the group in the same order, with
   the same byte count, and returns 0 when done (CPU) or enqueued on `stream` (a GPU
   communicator), anything else on failure (the forward then fails with
   ATTN_ERROR_PLATFORM, naming it). A caller may fill one of these around its own transport;
   attn_communicator_create_local makes the in-process one (ranks as threads). */
typedef struct attn_communicator attn_communicator;
struct attn_communicator {
    int size, rank;
    int (*all_gather)(attn_communicator *self, const void *send, void *recv, size_t bytes, void *stream);
    void (*destroy)(attn_communicator *self); /* attn_communicator_destroy calls it; may be NULL */
    void *impl;                               /* the implementation's state */
};

/* An in-process group of `size` ranks (1..64) that exchange through shared memory: comms
   gets size communicators, comms[r] for the thread that runs rank r; each is destroyed
   on its own (the group's state goes with the last). */
ATTN_API attn_status attn_communicator_create_local(attn_context *ctx, int size, attn_communicator **comms);
ATTN_API void attn_communicator_destroy(attn_communicator *comm); /* NULL: nothing */

/* Fixed capacity, so that buffers never move between builds (CUDA-graph friendly). */
typedef struct attn_metadata_desc {
    int max_num_reqs;        /* required */
    int max_num_tokens;      /* required */
    int max_blocks_per_req;  /* required: block_table_stride may not exceed it */
    int64_t num_blocks;      /* required: blocks in the KV cache this metadata indexes */
    /* MLA only (ignored by standard layers) */
    int decode_threshold;    /* requests with query_len <= this are decodes, 0..16; 0: 1 */
    int num_kv_splits;       /* decode split-KV count, 1..1024; 0: attn_mla_num_kv_splits() */
    int64_t workspace_bytes; /* MLA prefill: bytes for up-projected K/V and running outputs,
                                0: ATTN_MLA_WORKSPACE_BYTES; at least 1 MiB */
    /* Decode context parallelism (DCP, vLLM's decode_context_parallel_size): each
       sequence's KV cache is dealt over dcp_world_size ranks in runs of dcp_interleave
       tokens (position p lives on rank (p / interleave) % world_size, at that rank's local
       index attn_dcp_local_tokens(world_size, rank, interleave, p)). A metadata of rank r
       takes the global batch (query_start_loc, seq_lens: the requests' full lengths) with
       block tables of rank r's own blocks, which hold its tokens at their local indices,
       and a slot mapping with -1 for the tokens other ranks own (checked). A forward then
       gives rank r's partial: every query over rank r's keys, out normalised over them and
       LSE (a row with none of its keys on the rank: out 0, LSE -inf); attn_dcp_combine
       joins the ranks' partials into the single-rank result. Sinks join rank 0's partial
       only (so the combined softmax counts them once). CPU, CPU_MLA, CUDA and CUDA_SM90
       backends (the CUDA MLA backends refuse it by name); not with ALiBi, cascade
       (common_prefix_len), the fused attn_mla_forward or the sparse MLA call (named
       errors). */
    int dcp_world_size;      /* 0 or 1: off; else 2..64 */
    int dcp_rank;            /* 0..dcp_world_size - 1 */
    int dcp_interleave;      /* tokens per run, 1..65536; 0: 1 (vLLM's default
                                cp_kv_cache_interleave_size) */
    attn_communicator *dcp_comm; /* NULL: a forward returns the rank's partial (out, LSE) for
                                the caller to gather and attn_dcp_combine. CPU layers only so
                                far (a CUDA layer's metadata refuses it by name). Else its size and
                                rank must be dcp_world_size and dcp_rank, and every forward
                                (attn_layer_forward, attn_mla_forward_mqa/_mha) computes the
                                partial into the metadata's buffers, all-gathers (out, LSE)
                                through it and writes the combined result to out and lse
                                (on every rank); each rank holds every head's q (vLLM gathers
                                q first for MLA). The metadata keeps (dcp_world_size + 1) x
                                max_num_tokens x num_heads rows of the widest output for it. */
} attn_metadata_desc;

/* DCP (above): how many of positions [0, position) rank `rank` of `world_size` holds with
   runs of `interleave` tokens, i.e. the local index of a token at `position` on its own
   rank; a request of seq_len tokens needs ceil(attn_dcp_local_tokens(.., seq_len) /
   block_size) blocks there. -1 for arguments outside world_size 1..64, rank
   0..world_size - 1, interleave 1..65536, position >= 0. */
ATTN_API int64_t attn_dcp_local_tokens(int world_size, int rank, int interleave, int64_t position);

ATTN_API attn_status attn_metadata_create(attn_layer *layer, const attn_metadata_desc *desc,
                                          attn_metadata **out);
ATTN_API void attn_metadata_destroy(attn_metadata *meta);
/* For backends (plugins included): the last built batch (arrays owned by meta), the
   backend's private part, and the layer's context. */
ATTN_API const attn_batch *attn_metadata_batch(const attn_metadata *meta);
ATTN_API void *attn_metadata_private(const attn_metadata *meta);
ATTN_API void attn_metadata_private_set(attn_metadata *meta, void *priv);
ATTN_API attn_context *attn_layer_context(const attn_layer *layer);
ATTN_API attn_context *attn_metadata_context(const attn_metadata *meta);
/* The capacity with every default resolved (decode_threshold, num_kv_splits, workspace). */
ATTN_API const attn_metadata_desc *attn_metadata_capacity(const attn_metadata *meta);
/* Validates every field (naming the first bad one), copies the batch, and runs the
   backend's builder. On a validation error the previous contents are kept; if the
   builder runs out of memory the metadata is left unbuilt. Reads ATTN_BATCH_INVARIANT
   (CUDA, CUDA_SM90: attn_metadata_create does).
   common_prefix_len (cascade attention, vLLM's argument): 0, or the number of leading
   tokens every request of the batch shares — whole blocks (a multiple of block_size), the
   same block-table entries in every request, and no longer than any request's context
   (seq_len - query_len), as vLLM computes it; anything else is a named error. A backend
   may then attend the shared prefix once for all query rows and join it by LSE with each
   request's own keys; the results are the same as with 0 (within rounding). CPU: for
   batches of at most max_num_reqs x decode_threshold tokens (the rows the metadata keeps
   for it) and layers without a sliding window. CUDA, CUDA_SM90: for batches of more than
   one request whose requests all fit a decode tile (16 / (num_heads / num_kv_heads) query
   tokens, at least 1: decodes, speculative verification), on layers without a sliding
   window or ALiBi, outside ATTN_BATCH_INVARIANT: a prefix pass on the prefill tiles, then
   the decode tiles over each request's own keys, both captured in a CUDA graph (a replay
   follows the build: with or without a prefix). The metadata holds the prefix pass's
   partials for it (two waves of prefill CTAs: 17 MB on an H200 at head 128). MLA backends
   compute the batch as with 0. A build that uses the prefix logs CASCADE_PLANNED (DEBUG). */
ATTN_API attn_status attn_metadata_build(attn_metadata *meta, int common_prefix_len,
                                         const attn_batch *batch, int fast_build);

/* ---------------------------------------------------------------------------------------
   Paged KV cache and forward (layer 4)
   ------------------------------------------------------------------------------------- */

/* Writes key/value [>= num_tokens, num_kv_heads, head_size] into kv_cache (the layer's
   shape) at slot = slot_mapping[i] = block * block_size + offset; -1 skips a token.
   slot_mapping: int64 [num_tokens], contiguous, on the host or on the layer's device (a
   CUDA layer: vLLM's slot_mapping tensor as it is). Host slots are all checked before
   anything is written (a bad one is a named error). Device slots cannot be read by the
   host without a synchronisation: the kernel checks them all first and writes nothing
   when one is outside [-1, num_blocks * block_size), as it does for a bad device scale.
   stream: the CUDA stream of a GPU backend (NULL on the CPU). On CUDA the call is launches
   on `stream` that allocate, copy and wait for nothing: it returns while other streams
   are busy and may be captured into a CUDA graph. Device slots: one launch, which a replay
   runs over whatever the slot tensor holds then. Host slots travel in the launches'
   parameters (448 tokens a launch), so a captured write keeps the captured slots. */
ATTN_API attn_status attn_reshape_and_cache(attn_layer *layer, const attn_tensor *key,
                                            const attn_tensor *value, attn_tensor *kv_cache,
                                            const attn_tensor *slot_mapping, void *stream);

/* q: [num_tokens, num_heads, head_size]; k, v: [num_tokens, num_kv_heads, head_size] or
   both NULL (already cached); when given they are written to the cache by the metadata's
   slot_mapping first. out: [num_tokens, num_heads, head_size] of the layer dtype.
   lse: NULL or f32 [num_tokens, num_heads], base e. stream: CUDA stream (NULL on CPU).
   num_tokens may exceed the batch's num_actual_tokens (padding rows are not written). */
ATTN_API attn_status attn_layer_forward(attn_layer *layer, const attn_metadata *meta,
                                        const attn_tensor *q, const attn_tensor *k,
                                        const attn_tensor *v, attn_tensor *kv_cache,
                                        attn_tensor *out, attn_tensor *lse, void *stream);

/* ---------------------------------------------------------------------------------------
   MLA (multi-head latent attention, DeepSeek-V2/V3)
   A layer with use_mla = 1 caches one latent row per token, [kv_c (kv_lora_rank) | k_pe
   (qk_rope_head_dim)]: cache [num_blocks, block_size, head_size], head_size 576 (512+64)
   or 320 (256+64). num_kv_heads is 1. The up-projection kv_b_proj splits into
   W_UK [num_heads, qk_nope_head_dim, kv_lora_rank] and W_UV [num_heads, kv_lora_rank,
   v_head_dim] (layer dtype). A batch must list its decodes first (attn_reorder_batch).
   ------------------------------------------------------------------------------------- */

/* The decode/prefill split of a built MLA batch. Decode tokens are batch rows
   0..num_decode_tokens-1; prefill tokens follow. */
typedef struct attn_mla_info {
    int num_decodes, num_decode_tokens;
    int num_prefills, num_prefill_tokens;
    int num_kv_splits;      /* decode split-KV count in force */
    int prefill_chunk;      /* keys up-projected per pass of forward_mha */
} attn_mla_info;

ATTN_API attn_status attn_metadata_mla_info(const attn_metadata *meta, attn_mla_info *out);

/* Split-KV count for decode: about one split per 512 keys of max_seq_len, at least 1, at
   most `parallelism` (threads on CPU, 2 x SMs on GPU); 1 when batch_invariant. The same
   function sizes the workspace and drives the forward. */
ATTN_API int attn_mla_num_kv_splits(int max_seq_len, int parallelism, int batch_invariant);

/* Decodes-first order with the fewest moves: perm[new_index] = old_index, where requests
   with query_lens[i] <= decode_threshold (0: 1) come first. *num_decodes gets their count,
   *num_swaps (may be NULL) the pairs exchanged. Scanning from both ends swaps each prefill
   found in front with a decode found at the back, so nothing already in place moves. */
ATTN_API attn_status attn_reorder_batch(const int32_t *query_lens, int num_reqs,
                                        int decode_threshold, int32_t *perm, int *num_decodes,
                                        int *num_swaps);

/* Writes kv_c [>= num_tokens, kv_lora_rank] and k_pe [>= num_tokens, qk_rope_head_dim]
   (layer dtype) into the latent cache at slot_mapping (int64 [num_tokens]; -1 skips), on
   the host or the layer's device, checked and launched as by attn_reshape_and_cache. */
ATTN_API attn_status attn_concat_and_cache_mla(attn_layer *layer, const attn_tensor *kv_c,
                                               const attn_tensor *k_pe, attn_tensor *kv_cache,
                                               const attn_tensor *slot_mapping, void *stream);

/* Absorbed decode (MQA over the latent): for the batch's decode tokens, q is either
   [>= num_decode_tokens, num_heads, head_size] with q_pe == NULL, or q_latent
   [.., num_heads, kv_lora_rank] plus q_pe [.., num_heads, qk_rope_head_dim]. Writes
   out_latent [.., num_heads, kv_lora_rank] (layer dtype) and, if lse != NULL, f32
   [.., num_heads] (base e). Split-KV in two stages: partial outputs per split, merged
   by LSE. */
ATTN_API attn_status attn_mla_forward_mqa(attn_layer *layer, const attn_metadata *meta,
                                          const attn_tensor *q, const attn_tensor *q_pe,
                                          const attn_tensor *kv_cache, attn_tensor *out_latent,
                                          attn_tensor *lse, void *stream);

/* Up-projected prefill (MHA): q [>= num_prefill_tokens, num_heads, qk_nope + qk_rope]
   holds the prefill tokens (batch rows num_decode_tokens.. in order); keys are the cached
   latents of each prefill request (its new tokens must be in the cache already),
   up-projected with W_UK / W_UV in chunks of attn_mla_info.prefill_chunk keys and merged
   by LSE. Causal. out [.., num_heads, v_head_dim]; lse as above. */
ATTN_API attn_status attn_mla_forward_mha(attn_layer *layer, const attn_metadata *meta,
                                          const attn_tensor *q, const attn_tensor *kv_cache,
                                          const attn_tensor *w_uk, const attn_tensor *w_uv,
                                          attn_tensor *out, attn_tensor *lse, void *stream);

/* The whole MLA attention of a layer (before o_proj) for a built batch: writes kv_c/k_pe
   (both or neither, [num_actual_tokens, ...]) into the cache, runs the decodes absorbed
   (q_nope . W_UK -> forward_mqa -> . W_UV) and the prefills up-projected, and writes
   out [>= num_actual_tokens, num_heads, v_head_dim]. q_nope [.., num_heads,
   qk_nope_head_dim], q_pe [.., num_heads, qk_rope_head_dim]. */
ATTN_API attn_status attn_mla_forward(attn_layer *layer, const attn_metadata *meta,
                                      const attn_tensor *q_nope, const attn_tensor *q_pe,
                                      const attn_tensor *kv_c, const attn_tensor *k_pe,
                                      attn_tensor *kv_cache, const attn_tensor *w_uk,
                                      const attn_tensor *w_uv, attn_tensor *out, void *stream);

/* Sparse MLA (DeepSeek-V3.2's DSA): every query token of the built batch — decodes,
   speculative tokens and prefill tokens alike, in batch order — attends absorbed (MQA over
   the latent, as forward_mqa) only to the tokens its row of `indices` names.
   q: [>= num_actual_tokens, num_heads, head_size] with q_pe == NULL, or q_latent
   [.., num_heads, kv_lora_rank] plus q_pe [.., num_heads, qk_rope_head_dim].
   indices: int32 [>= num_actual_tokens, topk] (1 <= topk <= 16384), contiguous rows, where
   the layer's tensors live. As vLLM's FLASHMLA_SPARSE backend receives them from the
   indexer: an index is the position of a token in the query token's own request (0 ..
   seq_len - 1; the block table finds its slot, as vLLM's
   triton_convert_req_index_to_global_index does); -1 is padding (attends nothing). The
   indices alone decide what a token sees (causality is the indexer's); a position named
   twice counts twice. Any other value is an error: named on the CPU (nothing written); on
   the GPU, where the values are not read by the host, such an entry is skipped like -1.
   out_latent [.., num_heads, kv_lora_rank] (layer dtype); lse f32 [.., num_heads] (base e)
   or NULL. A token with no valid index gets out 0 and lse -inf. The layer's sinks
   (desc.sinks) join every row's softmax here (the LSE includes them). Caches: the layer's
   16-bit or f32 latent, fp8 with a per-tensor scale, or fp8_ds_mla (656-byte rows with
   their own scales, written by attn_concat_and_cache_mla; the dense MLA calls refuse it).
   Kernels: CUDA_MLA_SM90 gathers the rows of a 16-bit 512 + 64 latent into its wgmma
   decode (64 heads a CTA) when the layer has more than 32 heads; every other CUDA case runs
   the mma.sync decode (16, 32 or 64 heads a CTA). */
ATTN_API attn_status attn_mla_forward_sparse(attn_layer *layer, const attn_metadata *meta,
                                             const attn_tensor *q, const attn_tensor *q_pe,
                                             const attn_tensor *kv_cache, const attn_tensor *indices,
                                             attn_tensor *out_latent, attn_tensor *lse, void *stream);

/* ---------------------------------------------------------------------------------------
   LSE merge of partial attention results (split-KV, context-parallel shards)
   ------------------------------------------------------------------------------------- */

/* out = merge((out_a, lse_a), (out_b, lse_b)): out_* [tokens, heads, head_size] of one
   dtype (f32/f16/bf16), lse_* f32 [tokens, heads] in base base_a / base_b, all on one
   device. An empty partition has LSE -inf (or +inf/NaN, as some kernels report it) and
   contributes nothing (both empty: out 0, lse -inf, no NaN). lse may be NULL; its base
   is base_out. out may alias out_a or out_b. Runs on the first backend of the platform's
   priority list that serves the tensors' device and has a merge; stream as above. */
ATTN_API attn_status attn_merge_attn_states(attn_context *ctx, const attn_tensor *out_a,
                                            const attn_tensor *lse_a, attn_lse_base base_a,
                                            const attn_tensor *out_b, const attn_tensor *lse_b,
                                            attn_lse_base base_b, attn_tensor *out,
                                            attn_tensor *lse, attn_lse_base base_out,
                                            void *stream);

/* DCP (attn_metadata_desc): the n ranks' partials (out_i [tokens, heads, head_size] of
   one dtype, lse_i f32 [tokens, heads] base e, as the ranks' forwards return them) joined
   by LSE into out and lse: the single-rank result. A row no rank holds keys of gets out 0,
   lse -inf. n 1..64; all tensors on one device; out may alias outs[0]. CPU tensors: one
   pass, f32 sums (lse may be NULL). CUDA tensors: n - 1 launches of
   attn_merge_attn_states on `stream` (n >= 2, and lse is required: it is the running LSE;
   out holds each step's result in its dtype). */
ATTN_API attn_status attn_dcp_combine(attn_context *ctx, int n, const attn_tensor *const *outs,
                                      const attn_tensor *const *lses, attn_tensor *out,
                                      attn_tensor *lse, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_H */

/* =======================================================================================
   Stop here if you only want the API.
   ======================================================================================= */

#ifdef ATTN_IMPLEMENTATION
#ifndef ATTN_IMPLEMENTATION_DONE
#define ATTN_IMPLEMENTATION_DONE

/* =======================================================================================
   >>config
   Allocator and assert overrides, platform headers, compiler helpers.
   ======================================================================================= */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>

#if defined(ATTN_MALLOC) && defined(ATTN_REALLOC) && defined(ATTN_FREE)
/* all three given */
#elif !defined(ATTN_MALLOC) && !defined(ATTN_REALLOC) && !defined(ATTN_FREE)
#define ATTN_MALLOC(sz) malloc(sz)
#define ATTN_REALLOC(p, sz) realloc(p, sz)
#define ATTN_FREE(p) free(p)
#else
#error "attn.h: define all of ATTN_MALLOC, ATTN_REALLOC and ATTN_FREE, or none of them"
#endif

#ifndef ATTN_ASSERT
#include <assert.h>
#define ATTN_ASSERT(x) assert(x)
#endif

#include <unistd.h>
#include <dlfcn.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/time.h>
#ifndef ATTN_NO_THREADS
#include <pthread.h>
#endif

#if defined(__cplusplus) && __cplusplus >= 201103L
#define ATTN__THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define ATTN__THREAD_LOCAL _Thread_local
#elif defined(__GNUC__) || defined(__clang__)
#define ATTN__THREAD_LOCAL __thread
#else
#define ATTN__THREAD_LOCAL
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ATTN__INLINE static inline __attribute__((always_inline))
#define ATTN__NOINLINE __attribute__((noinline))
#define ATTN__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ATTN__INLINE static inline
#define ATTN__NOINLINE
#define ATTN__PRINTF(a, b)
#endif

#if !defined(ATTN_NO_SIMD) && defined(__AVX512F__)
#define ATTN__SIMD_AVX512 1
#elif !defined(ATTN_NO_SIMD) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ATTN__SIMD_AVX2 1
#else
#define ATTN__SIMD_C 1
#endif
#if defined(ATTN__SIMD_AVX512) || defined(ATTN__SIMD_AVX2)
#if defined(__GNUC__) && !defined(__clang__)
/* g++ 12 flags its own AVX-512 headers (-Wmaybe-uninitialized on _mm512_undefined_*). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

#define ATTN__MIN(a, b) ((a) < (b) ? (a) : (b))
#define ATTN__MAX(a, b) ((a) > (b) ? (a) : (b))
#define ATTN__LOG2E 1.4426950408889634f
#define ATTN__LN2 0.6931471805599453f

/* The most blocks a KV cache may have, wherever a block count is taken (cache shapes,
   metadata capacity, cache tensors): block ids and slots stay far from int64 overflow. */
#define ATTN__MAX_BLOCKS ((int64_t)1 << 40)

/* =======================================================================================
   >>common
   Memory, formatting and strings: what every other section uses and that needs no
   context.
   ======================================================================================= */

static void *attn__malloc(size_t size) { return size ? ATTN_MALLOC(size) : NULL; }
static void *attn__calloc(size_t n, size_t size) {
    void *p;
    if (n && size > (size_t)-1 / n) return NULL;
    p = attn__malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}
static void attn__free(void *p) { if (p) ATTN_FREE(p); }

/* snprintf through one function, so messages that may be cut stay quiet under
   -Wformat-truncation (a cut message is still a valid, terminated message). */
static int attn__fmt(char *buf, size_t size, const char *fmt, ...) ATTN__PRINTF(3, 4);
static int attn__fmt(char *buf, size_t size, const char *fmt, ...) {
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    return n;
}

static int attn__tolower(int c) { return (c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c; }
static int attn__strieq(const char *a, const char *b) {
    while (*a && *b) {
        if (attn__tolower((unsigned char)*a) != attn__tolower((unsigned char)*b)) return 0;
        a++; b++;
    }
    return *a == *b;
}
static void attn__strlcpy(char *dst, const char *src, size_t size) {
    size_t n;
    if (!size) return;
    n = strlen(src);
    if (n >= size) n = size - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}
/* FNV-1a: the selection cache's slope hash and the kernel cache's keys. */
#define ATTN__FNV_SEED 1469598103934665603ull
static uint64_t attn__fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The one layout helper: with base NULL it only sizes (adds `bytes`, rounded up to
   `align`, to *used); else it also returns the piece at base + *used. Workspaces are laid
   out by one function called twice, first to size, then to carve. */
static void *attn__carve(void *base, size_t *used, size_t bytes, size_t align) {
    void *p = base ? (char *)base + *used : NULL;
    *used += (bytes + align - 1) / align * align;
    return p;
}

static const char *attn__trim_env(const char *name) {
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

/* =======================================================================================
   >>platform
   What this process can run on: cores, the compiled SIMD path, and the run-time
   libraries (CUDA driver, NVRTC) loaded through one table each; a missing piece is a reason.
   ======================================================================================= */

static int attn__cpu_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static const char *attn__simd_name(void) {
#if defined(ATTN__SIMD_AVX512)
    return "avx512";
#elif defined(ATTN__SIMD_AVX2)
    return "avx2";
#else
    return "c";
#endif
}

/* The CUDA platform: everything below, to the end of attn__probe_cuda, is compiled only
   with the CUDA path (ATTN_NO_CUDA removes the loaders, their tables and state, and the
   embedded kernels: no CUDA library is ever opened). */
#ifndef ATTN_NO_CUDA
typedef int attn__CUresult;
typedef int attn__CUdevice;
typedef unsigned long long attn__CUdeviceptr;
typedef struct attn__CUctx_st *attn__CUcontext;
typedef struct attn__CUmod_st *attn__CUmodule;
typedef struct attn__CUfunc_st *attn__CUfunction;
typedef struct attn__CUstream_st *attn__CUstream;
typedef struct attn__CUevent_st *attn__CUevent;
#define ATTN__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define ATTN__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define ATTN__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define ATTN__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define ATTN__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define ATTN__CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define ATTN__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define ATTN__CU_MEMORYTYPE_HOST 1
#define ATTN__CU_MEMORYTYPE_DEVICE 2
#define ATTN__CU_MEMORYTYPE_UNIFIED 4
#define ATTN__CU_EVENT_DISABLE_TIMING 2
#define ATTN__CUDA_ERROR_NOT_READY 600

/* CUtensorMap (cuda.h: CU_TENSOR_MAP_NUM_QWORDS 16 quadwords), what cuTensorMapEncodeTiled
   writes for the Hopper kernels' TMA copies (kernels/hopper.cuh: attn_tma_map); passed to
   a kernel by value, so its host copy needs no particular alignment. */
typedef struct attn__tma_map {
    uint64_t opaque[16];
} attn__tma_map;

/* The driver's library name; tests and unusual installs can point it elsewhere. The
   loader tries it, then "libcuda.so" (a development symlink some installs have only). */
#ifndef ATTN_CUDA_DRIVER_LIBRARY
#define ATTN_CUDA_DRIVER_LIBRARY "libcuda.so.1"
#endif

/* Every CUDA driver function attn.h calls: (field, exported symbol, parameters). The one
   list makes the pointer table and the table the loader walks (volk / cuew). */
#define ATTN__CUDA_DRIVER_FUNCTIONS(X)                                                   \
    X(cuInit, "cuInit", (unsigned flags))                                                \
    X(cuDriverGetVersion, "cuDriverGetVersion", (int *version))                          \
    X(cuDeviceGetCount, "cuDeviceGetCount", (int *count))                                \
    X(cuDeviceGet, "cuDeviceGet", (attn__CUdevice *device, int ordinal))                 \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute",                                      \
      (int *value, int attribute, attn__CUdevice device))                                \
    X(cuDeviceGetName, "cuDeviceGetName", (char *name, int length, attn__CUdevice device)) \
    X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", (size_t *bytes, attn__CUdevice device)) \
    X(cuGetErrorString, "cuGetErrorString", (attn__CUresult error, const char **text))   \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain",                              \
      (attn__CUcontext * ctx, attn__CUdevice device))                                    \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (attn__CUdevice device)) \
    X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", (attn__CUcontext ctx))                    \
    X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", (attn__CUcontext * ctx))                    \
    X(cuCtxSynchronize, "cuCtxSynchronize", (void))                                      \
    X(cuModuleLoadData, "cuModuleLoadData", (attn__CUmodule * module, const void *image)) \
    X(cuModuleUnload, "cuModuleUnload", (attn__CUmodule module))                         \
    X(cuModuleGetFunction, "cuModuleGetFunction",                                        \
      (attn__CUfunction * function, attn__CUmodule module, const char *name))            \
    X(cuModuleGetGlobal, "cuModuleGetGlobal_v2",                                         \
      (attn__CUdeviceptr * ptr, size_t *bytes, attn__CUmodule module, const char *name)) \
    X(cuFuncSetAttribute, "cuFuncSetAttribute",                                          \
      (attn__CUfunction function, int attribute, int value))                             \
    X(cuLaunchKernel, "cuLaunchKernel",                                                  \
      (attn__CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,            \
       unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,      \
       attn__CUstream stream, void **params, void **extra))                              \
    X(cuMemAlloc, "cuMemAlloc_v2", (attn__CUdeviceptr * ptr, size_t bytes))              \
    X(cuMemFree, "cuMemFree_v2", (attn__CUdeviceptr ptr))                                \
    X(cuMemAllocHost, "cuMemAllocHost_v2", (void **ptr, size_t bytes))                   \
    X(cuMemFreeHost, "cuMemFreeHost", (void *ptr))                                       \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                                         \
      (attn__CUdeviceptr dst, const void *src, size_t bytes, attn__CUstream stream))     \
    X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2",                                         \
      (void *dst, attn__CUdeviceptr src, size_t bytes, attn__CUstream stream))           \
    X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2",                                         \
      (attn__CUdeviceptr dst, attn__CUdeviceptr src, size_t bytes, attn__CUstream stream)) \
    X(cuStreamSynchronize, "cuStreamSynchronize", (attn__CUstream stream))               \
    X(cuStreamGetCtx, "cuStreamGetCtx", (attn__CUstream stream, attn__CUcontext * ctx))  \
    X(cuStreamIsCapturing, "cuStreamIsCapturing", (attn__CUstream stream, int *status))  \
    X(cuMemsetD8Async, "cuMemsetD8Async",                                                \
      (attn__CUdeviceptr dst, unsigned char value, size_t bytes, attn__CUstream stream)) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", \
      (int *blocks, attn__CUfunction f, int block_size, size_t dynamic_shared_bytes))    \
    X(cuEventElapsedTime, "cuEventElapsedTime", (float *ms, attn__CUevent start, attn__CUevent end)) \
    X(cuEventCreate, "cuEventCreate", (attn__CUevent * event, unsigned flags))           \
    X(cuEventRecord, "cuEventRecord", (attn__CUevent event, attn__CUstream stream))      \
    X(cuEventSynchronize, "cuEventSynchronize", (attn__CUevent event))                   \
    X(cuEventDestroy, "cuEventDestroy_v2", (attn__CUevent event))                        \
    X(cuPointerGetAttributes, "cuPointerGetAttributes",                                  \
      (unsigned num, int *attributes, void **data, attn__CUdeviceptr ptr))

/* Driver functions attn.h uses where the driver has them, NULL where it does not (the
   platform record says what is missing): cuTensorMapEncodeTiled (CUDA 12.0 drivers on;
   the Hopper kernels' TMA copies). The enums are passed as int (C enums, int-sized). */
#define ATTN__CUDA_DRIVER_OPTIONAL(X)                                                    \
    X(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled",                                  \
      (attn__tma_map * map, int data_type, unsigned rank, void *address, const uint64_t *dims, \
       const uint64_t *strides, const uint32_t *box, const uint32_t *element_strides, int interleave, \
       int swizzle, int l2_promotion, int oob_fill))

/* The loaded driver, kept on the context for the backends that use it. */
typedef struct attn__cuda_driver {
    void *library;                  /* NULL: not loaded (platform.cuda_reason says why) */
    char soname[256];               /* the name it was opened under (a soname or a path) */
#define ATTN__DRIVER_POINTER(field, symbol, params) attn__CUresult (*field) params;
    ATTN__CUDA_DRIVER_FUNCTIONS(ATTN__DRIVER_POINTER)
    ATTN__CUDA_DRIVER_OPTIONAL(ATTN__DRIVER_POINTER)
#undef ATTN__DRIVER_POINTER
} attn__cuda_driver;

/* NVRTC, the run-time compiler: loaded at context creation (it needs no GPU). */
typedef int attn__nvrtcResult;
typedef struct attn__nvrtcProgram_st *attn__nvrtcProgram;

#define ATTN__NVRTC_FUNCTIONS(X)                                                         \
    X(nvrtcVersion, "nvrtcVersion", (int *major, int *minor))                            \
    X(nvrtcCreateProgram, "nvrtcCreateProgram",                                          \
      (attn__nvrtcProgram * prog, const char *src, const char *name, int num_headers,    \
       const char *const *headers, const char *const *include_names))                    \
    X(nvrtcDestroyProgram, "nvrtcDestroyProgram", (attn__nvrtcProgram * prog))           \
    X(nvrtcCompileProgram, "nvrtcCompileProgram",                                        \
      (attn__nvrtcProgram prog, int num_options, const char *const *options))            \
    X(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", (attn__nvrtcProgram prog, size_t *size)) \
    X(nvrtcGetProgramLog, "nvrtcGetProgramLog", (attn__nvrtcProgram prog, char *log))    \
    X(nvrtcGetCUBINSize, "nvrtcGetCUBINSize", (attn__nvrtcProgram prog, size_t *size))   \
    X(nvrtcGetCUBIN, "nvrtcGetCUBIN", (attn__nvrtcProgram prog, char *cubin))

typedef struct attn__nvrtc {
    void *library;                  /* NULL: not loaded (platform.nvrtc_reason says why) */
    char soname[256];
    int major, minor;
#define ATTN__NVRTC_POINTER(field, symbol, params) attn__nvrtcResult (*field) params;
    ATTN__NVRTC_FUNCTIONS(ATTN__NVRTC_POINTER)
#undef ATTN__NVRTC_POINTER
} attn__nvrtc;

#ifndef ATTN_NVRTC_LIBRARY
#define ATTN_NVRTC_LIBRARY "libnvrtc.so.13"
#endif

/* cuBLAS, for the MLA projections on the GPU: loaded on first need. */
typedef int attn__cublasStatus;
#define ATTN__CUBLAS_FUNCTIONS(X)                                                        \
    X(cublasGetProperty, "cublasGetProperty", (int type, int *value))                    \
    X(cublasCreate, "cublasCreate_v2", (void **handle))                                  \
    X(cublasDestroy, "cublasDestroy_v2", (void *handle))                                 \
    X(cublasSetStream, "cublasSetStream_v2", (void *handle, void *stream))               \
    X(cublasSetWorkspace, "cublasSetWorkspace_v2", (void *handle, void *ws, size_t bytes)) \
    X(cublasGemmStridedBatchedEx, "cublasGemmStridedBatchedEx",                          \
      (void *handle, int transa, int transb, int m, int n, int k, const void *alpha,     \
       const void *a, int a_type, int lda, long long stride_a, const void *b, int b_type, \
       int ldb, long long stride_b, const void *beta, void *c, int c_type, int ldc,      \
       long long stride_c, int batch_count, int compute_type, int algo))

typedef struct attn__cublas {
    void *library;                  /* NULL: not loaded (platform.cublas_reason says why) */
    char soname[256];
    int tried;                      /* loading was attempted (once per context) */
#define ATTN__CUBLAS_POINTER(field, symbol, params) attn__cublasStatus (*field) params;
    ATTN__CUBLAS_FUNCTIONS(ATTN__CUBLAS_POINTER)
#undef ATTN__CUBLAS_POINTER
} attn__cublas;

#ifndef ATTN_CUBLAS_LIBRARY
#define ATTN_CUBLAS_LIBRARY "libcublas.so.13"
#endif

typedef struct attn__symbol_slot {
    const char *name;
    size_t offset;                  /* of the function pointer in its table */
} attn__symbol_slot;

static const attn__symbol_slot attn__cuda_driver_symbols[] = {
#define ATTN__DRIVER_SLOT(field, symbol, params) {symbol, offsetof(attn__cuda_driver, field)},
    ATTN__CUDA_DRIVER_FUNCTIONS(ATTN__DRIVER_SLOT)
#undef ATTN__DRIVER_SLOT
};

static const attn__symbol_slot attn__cuda_driver_optional_symbols[] = {
#define ATTN__DRIVER_SLOT(field, symbol, params) {symbol, offsetof(attn__cuda_driver, field)},
    ATTN__CUDA_DRIVER_OPTIONAL(ATTN__DRIVER_SLOT)
#undef ATTN__DRIVER_SLOT
};

static const attn__symbol_slot attn__nvrtc_symbols[] = {
#define ATTN__NVRTC_SLOT(field, symbol, params) {symbol, offsetof(attn__nvrtc, field)},
    ATTN__NVRTC_FUNCTIONS(ATTN__NVRTC_SLOT)
#undef ATTN__NVRTC_SLOT
};

/* RTLD_NODELETE: a closed driver or compiler stays mapped for the process, as CUDA's own
   runtime keeps it; unmapping buys nothing and would hide its allocations from leak
   checkers (their stacks lose the library's name). */
#ifdef RTLD_NODELETE
#define ATTN__DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)
#else
#define ATTN__DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL)
#endif

static const attn__symbol_slot attn__cublas_symbols[] = {
#define ATTN__CUBLAS_SLOT(field, symbol, params) {symbol, offsetof(attn__cublas, field)},
    ATTN__CUBLAS_FUNCTIONS(ATTN__CUBLAS_SLOT)
#undef ATTN__CUBLAS_SLOT
};

static void *attn__loader_open(const attn_loader *l, const char *soname) {
    return l->open ? l->open(l->user_data, soname) : dlopen(soname, ATTN__DLOPEN_FLAGS);
}
static void *attn__loader_symbol(const attn_loader *l, void *lib, const char *name) {
    return l->symbol ? l->symbol(l->user_data, lib, name) : dlsym(lib, name);
}
static void attn__loader_close(const attn_loader *l, void *lib) {
    if (!lib) return;
    if (l->close) l->close(l->user_data, lib);
    else if (!l->open) dlclose(lib); /* a library opened by an injected open stays its own */
}

/* Opens the first of `sonames` (NULL-terminated) that loads and fills the function
   pointers of `table` (slots give their offsets). Returns the library, or NULL with
   `reason` saying which library was missing or which symbol it lacks. */
static void *attn__load_library(const attn_loader *l, const char *const *sonames,
                                const attn__symbol_slot *slots, size_t num_slots, void *table,
                                char *opened, size_t opened_size, char *reason, size_t reason_size) {
    void *lib = NULL;
    size_t i, n = 0;
    char tried[160];
    tried[0] = 0;
    for (i = 0; sonames[i] && !lib; i++) {
        lib = attn__loader_open(l, sonames[i]);
        if (!lib) {
            attn__fmt(tried + n, sizeof tried - n, "%s%s", n ? ", " : "", sonames[i]);
            n = strlen(tried);
        } else {
            attn__strlcpy(opened, sonames[i], opened_size);
        }
    }
    if (!lib) {
        attn__fmt(reason, reason_size, "library not found (tried %s)", tried);
        return NULL;
    }
    for (i = 0; i < num_slots; i++) {
        void *sym = attn__loader_symbol(l, lib, slots[i].name);
        if (!sym) {
            attn__fmt(reason, reason_size, "library %s lacks symbol %s", opened, slots[i].name);
            attn__loader_close(l, lib);
            return NULL;
        }
        /* object pointer -> function pointer, as dlsym requires (POSIX) */
        memcpy((char *)table + slots[i].offset, &sym, sizeof sym);
    }
    return lib;
}

/* Loads NVRTC into *nv and fills p->nvrtc_version or p->nvrtc_reason. */
/* The names a probe tries: `override` alone when one was given (attn_context_desc, or the
   environment), else the defaults. */
static const char *const *attn__probe_names(const char *override, const char *const *defaults, const char **one) {
    if (!override || !override[0]) return defaults;
    one[0] = override;
    one[1] = NULL;
    return one;
}

static void attn__probe_nvrtc(const attn_loader *loader, const char *override, attn__nvrtc *nv, attn_platform *p) {
    static const char *const defaults[] = {ATTN_NVRTC_LIBRARY, "libnvrtc.so.12", "libnvrtc.so", NULL};
    const char *one[2], *const *sonames = attn__probe_names(override, defaults, one);
    char reason[160];
    memset(nv, 0, sizeof *nv);
    p->nvrtc_library[0] = 0;
    nv->library = attn__load_library(loader, sonames, attn__nvrtc_symbols,
                                     sizeof attn__nvrtc_symbols / sizeof attn__nvrtc_symbols[0], nv,
                                     nv->soname, sizeof nv->soname, reason, sizeof reason);
    if (!nv->library) {
        attn__fmt(p->nvrtc_reason, sizeof p->nvrtc_reason, "no NVRTC: %s%s", reason,
                  sonames == one ? " (ATTN_NVRTC_LIBRARY)" : "");
        return;
    }
    if (nv->nvrtcVersion(&nv->major, &nv->minor) != 0 || nv->major < 12) {
        attn__fmt(p->nvrtc_reason, sizeof p->nvrtc_reason, "NVRTC %s is version %d.%d (allowed: 12 "
                  "or later)", nv->soname, nv->major, nv->minor);
        attn__loader_close(loader, nv->library);
        memset(nv, 0, sizeof *nv);
        return;
    }
    p->nvrtc_version = nv->major * 1000 + nv->minor * 10;
    attn__strlcpy(p->nvrtc_library, nv->soname, sizeof p->nvrtc_library);
}

/* Loads cuBLAS into *cb (once) and fills p->cublas_version or p->cublas_reason. */
static void attn__probe_cublas(const attn_loader *loader, const char *override, attn__cublas *cb, attn_platform *p) {
    static const char *const defaults[] = {ATTN_CUBLAS_LIBRARY, "libcublas.so.12", "libcublas.so", NULL};
    const char *one[2], *const *sonames = attn__probe_names(override, defaults, one);
    char reason[160];
    int v[3] = {0, 0, 0};
    if (cb->tried) return;
    memset(cb, 0, sizeof *cb);
    cb->tried = 1;
    if (p->kind != ATTN_PLATFORM_CUDA) {
        attn__fmt(p->cublas_reason, sizeof p->cublas_reason, "not loaded: no CUDA device");
        return;
    }
    cb->library = attn__load_library(loader, sonames, attn__cublas_symbols,
                                     sizeof attn__cublas_symbols / sizeof attn__cublas_symbols[0], cb,
                                     cb->soname, sizeof cb->soname, reason, sizeof reason);
    if (!cb->library) {
        attn__fmt(p->cublas_reason, sizeof p->cublas_reason, "no cuBLAS: %s%s", reason,
                  sonames == one ? " (ATTN_CUBLAS_LIBRARY)" : "");
        return;
    }
    cb->cublasGetProperty(0, &v[0]); /* MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL */
    cb->cublasGetProperty(1, &v[1]);
    cb->cublasGetProperty(2, &v[2]);
    p->cublas_version = v[0] * 10000 + v[1] * 100 + v[2];
    p->cublas_reason[0] = 0;
    attn__strlcpy(p->cublas_library, cb->soname, sizeof p->cublas_library);
}

/* Loads the driver into *drv and fills the CUDA part of p; a missing piece is a reason
   in p->cuda_reason and leaves drv->library NULL. */
static void attn__probe_cuda(const attn_loader *loader, const char *override, attn__cuda_driver *drv, attn_platform *p) {
    static const char *const defaults[] = {ATTN_CUDA_DRIVER_LIBRARY, "libcuda.so", NULL};
    const char *one[2], *const *sonames = attn__probe_names(override, defaults, one);
    char reason[160];
    attn__CUdevice dev;
    attn__CUresult rc;
    int n = 0;
    memset(drv, 0, sizeof *drv);
    attn__fmt(p->cuda_tma_reason, sizeof p->cuda_tma_reason, "no CUDA device");
    drv->library = attn__load_library(loader, sonames, attn__cuda_driver_symbols,
                                      sizeof attn__cuda_driver_symbols / sizeof attn__cuda_driver_symbols[0],
                                      drv, drv->soname, sizeof drv->soname, reason, sizeof reason);
    if (!drv->library) {
        attn__fmt(p->cuda_reason, sizeof p->cuda_reason, "no CUDA driver: %s%s", reason,
                  sonames == one ? " (ATTN_CUDA_LIBRARY)" : "");
        return;
    }
    if ((rc = drv->cuInit(0)) != 0)
        attn__fmt(p->cuda_reason, sizeof p->cuda_reason, "cuInit failed (CUresult %d)", rc);
    else if ((rc = drv->cuDeviceGetCount(&n)) != 0 || n <= 0)
        attn__fmt(p->cuda_reason, sizeof p->cuda_reason, "no CUDA device (cuDeviceGetCount: "
                  "result %d, count %d)", rc, n);
    if (p->cuda_reason[0]) {
        attn__loader_close(loader, drv->library);
        memset(drv, 0, sizeof *drv);
        return;
    }
    p->cuda_device_count = n;
    drv->cuDriverGetVersion(&p->cuda_driver_version);
    if (drv->cuDeviceGet(&dev, 0) == 0) {
        drv->cuDeviceGetAttribute(&p->cuda_capability_major, ATTN__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
        drv->cuDeviceGetAttribute(&p->cuda_capability_minor, ATTN__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
        drv->cuDeviceGetAttribute(&p->cuda_multiprocessors, ATTN__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
        drv->cuDeviceGetAttribute(&p->cuda_shared_per_block, ATTN__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                  dev);
        drv->cuDeviceGetName(p->cuda_device_name, (int)sizeof p->cuda_device_name, dev);
        {
            size_t bytes = 0;
            if (drv->cuDeviceTotalMem(&bytes, dev) == 0) p->cuda_memory_bytes = bytes;
        }
    }
    p->kind = ATTN_PLATFORM_CUDA;
    attn__strlcpy(p->cuda_library, drv->soname, sizeof p->cuda_library);
    {   /* the optional functions: NULL where this driver lacks them */
        size_t i;
        for (i = 0; i < sizeof attn__cuda_driver_optional_symbols / sizeof attn__cuda_driver_optional_symbols[0]; i++) {
            void *sym = attn__loader_symbol(loader, drv->library, attn__cuda_driver_optional_symbols[i].name);
            memcpy((char *)drv + attn__cuda_driver_optional_symbols[i].offset, &sym, sizeof sym);
        }
    }
    p->cuda_tma_reason[0] = 0;
    if (p->cuda_capability_major < 9)
        attn__fmt(p->cuda_tma_reason, sizeof p->cuda_tma_reason, "compute capability %d.%d (TMA: 9.0 or newer)",
                  p->cuda_capability_major, p->cuda_capability_minor);
    else if (!drv->cuTensorMapEncodeTiled)
        attn__fmt(p->cuda_tma_reason, sizeof p->cuda_tma_reason, "driver %s lacks cuTensorMapEncodeTiled (CUDA 12.0 "
                  "or newer)", drv->soname);
    else
        p->cuda_tma = 1;
}
#endif /* ATTN_NO_CUDA (the CUDA platform) */

ATTN_API size_t attn_platform_format(const attn_platform *p, char *buf, size_t size) {
    int n;
    if (!p) return 0;
    n = attn__fmt(buf, size,
                 "platform:\n"
                 "  kind: %s\n"
                 "  cpu_cores: %d\n"
                 "  cpu_threads: %d\n"
                 "  cpu_simd: %s\n"
                 "  cuda_devices: %d\n"
                 "  cuda_device: %s\n"
                 "  device_capability: %d.%d\n"
                 "  cuda_multiprocessors: %d\n"
                 "  cuda_shared_per_block: %d\n"
                 "  cuda_driver_version: %d\n"
                 "  cuda_memory_mib: %llu\n"
                 "  cuda_unavailable_reason: %s\n"
                 "  nvrtc_version: %d.%d\n"
                 "  nvrtc_unavailable_reason: %s\n"
                 "  cublas_version: %d.%d.%d\n"
                 "  cublas_unavailable_reason: %s\n"
                 "  cuda_tma: %s%s%s\n"
                 "  cuda_library: %s\n"
                 "  nvrtc_library: %s\n"
                 "  cublas_library: %s\n",
                 p->kind == ATTN_PLATFORM_CUDA ? "CUDA" : "CPU", p->cpu_cores, p->cpu_threads,
                 p->cpu_simd, p->cuda_device_count,
                 p->cuda_device_name[0] ? p->cuda_device_name : "none",
                 p->cuda_capability_major, p->cuda_capability_minor, p->cuda_multiprocessors,
                 p->cuda_shared_per_block, p->cuda_driver_version, (unsigned long long)(p->cuda_memory_bytes >> 20),
                 p->cuda_reason[0] ? p->cuda_reason : "none", p->nvrtc_version / 1000,
                 p->nvrtc_version % 1000 / 10, p->nvrtc_reason[0] ? p->nvrtc_reason : "none",
                 p->cublas_version / 10000, p->cublas_version / 100 % 100, p->cublas_version % 100,
                 p->cublas_reason[0] ? p->cublas_reason : "none", p->cuda_tma ? "yes" : "no",
                 p->cuda_tma_reason[0] ? ": " : "", p->cuda_tma_reason, p->cuda_library[0] ? p->cuda_library : "none",
                 p->nvrtc_library[0] ? p->nvrtc_library : "none", p->cublas_library[0] ? p->cublas_library : "none");
    return n < 0 ? 0 : (size_t)n;
}

/* =======================================================================================
   >>threads
   A persistent pool: the caller plus num_threads-1 workers pull task indices from a
   shared counter (tasks are coarse, so a mutex-guarded counter costs nothing).
   ======================================================================================= */

typedef struct attn__threadpool attn__threadpool;

typedef void (*attn__task_fn)(void *arg, int task, int thread);

#ifndef ATTN_NO_THREADS
struct attn__threadpool {
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    pthread_t *threads;
    int num_workers;
    unsigned generation;
    int stop;
    attn__task_fn fn;
    void *arg;
    int num_tasks, next_task, busy;
};

typedef struct attn__worker_arg { attn__threadpool *pool; int index; } attn__worker_arg;

static void attn__pool_drain(attn__threadpool *pool, int thread) {
    for (;;) {
        int t;
        pthread_mutex_lock(&pool->lock);
        t = pool->next_task < pool->num_tasks ? pool->next_task++ : -1;
        pthread_mutex_unlock(&pool->lock);
        if (t < 0) return;
        pool->fn(pool->arg, t, thread);
    }
}

static void *attn__worker_main(void *varg) {
    attn__worker_arg a = *(attn__worker_arg *)varg;
    attn__threadpool *pool = a.pool;
    unsigned seen = 0;
    attn__free(varg);
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        while (!pool->stop && pool->generation == seen) pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop) { pthread_mutex_unlock(&pool->lock); return NULL; }
        seen = pool->generation;
        pthread_mutex_unlock(&pool->lock);
        attn__pool_drain(pool, a.index);
        pthread_mutex_lock(&pool->lock);
        if (--pool->busy == 0) pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->lock);
    }
}

static void attn__pool_destroy(attn__threadpool *pool) {
    int i;
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (i = 0; i < pool->num_workers; i++) pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->lock);
    attn__free(pool->threads);
    attn__free(pool);
}

static attn__threadpool *attn__pool_create(int num_threads) {
    attn__threadpool *pool = (attn__threadpool *)attn__calloc(1, sizeof *pool);
    int i;
    if (!pool) return NULL;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = (pthread_t *)attn__calloc((size_t)(num_threads > 1 ? num_threads - 1 : 1),
                                               sizeof(pthread_t));
    if (!pool->threads) { attn__pool_destroy(pool); return NULL; }
    for (i = 0; i < num_threads - 1; i++) {
        attn__worker_arg *a = (attn__worker_arg *)attn__malloc(sizeof *a);
        if (!a) break;
        a->pool = pool;
        a->index = i + 1;
        if (pthread_create(&pool->threads[i], NULL, attn__worker_main, a) != 0) {
            attn__free(a);
            break;
        }
        pool->num_workers++;
    }
    if (pool->num_workers != num_threads - 1) { attn__pool_destroy(pool); return NULL; }
    return pool;
}

static void attn__pool_run(attn__threadpool *pool, attn__task_fn fn, void *arg, int num_tasks) {
    if (!pool || pool->num_workers == 0 || num_tasks <= 1) {
        int t;
        for (t = 0; t < num_tasks; t++) fn(arg, t, 0);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->num_tasks = num_tasks;
    pool->next_task = 0;
    pool->busy = pool->num_workers;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    attn__pool_drain(pool, 0);
    pthread_mutex_lock(&pool->lock);
    while (pool->busy > 0) pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
#else
struct attn__threadpool { int unused; };
static void attn__pool_destroy(attn__threadpool *pool) { (void)pool; }
static attn__threadpool *attn__pool_create(int num_threads) { (void)num_threads; return NULL; }
static void attn__pool_run(attn__threadpool *pool, attn__task_fn fn, void *arg, int num_tasks) {
    int t;
    (void)pool;
    for (t = 0; t < num_tasks; t++) fn(arg, t, 0);
}
#endif

/* =======================================================================================
   >>context
   The context: its struct, the logger and last-error slots every section reports to,
   environment values, create/destroy, per-thread scratch and backends' context-level state.
   ======================================================================================= */

/* A backend's context-level state (context_init ran once; status and reason kept). */
typedef struct attn__backend_slot {
    const attn_backend *backend;
    void *state;
    attn_status status;
    char reason[160];
} attn__backend_slot;

typedef struct attn__selection_cache_entry {
    attn_layer_desc desc;            /* alibi pointer replaced by a hash of the slopes */
    uint64_t alibi_hash;
    attn_select_request request;
    char env_value[64];
    attn_status status;
    attn_selection selection;
} attn__selection_cache_entry;

struct attn_context {
    attn_log_fn log;
    void *log_user_data;
    attn_log_level log_level;
    uint64_t serial;                 /* names the context in the threads' error slots */
    attn_platform platform;
    int num_threads;
    attn__threadpool *pool;
    float **scratch;                 /* one per thread, grown on demand */
    size_t *scratch_size;
    attn__selection_cache_entry *cache;
    int cache_count, cache_capacity;
    attn_loader loader;              /* how run-time libraries are opened */
    char library_override[3][256];   /* CUDA driver, NVRTC, cuBLAS names to open ("": defaults) */
#ifndef ATTN_NO_CUDA
    struct attn__cuda_driver *cuda;  /* the driver's function table (library NULL: none) */
    struct attn__nvrtc *nvrtc;       /* the run-time compiler's table (library NULL: none) */
    struct attn__cublas *cublas;     /* cuBLAS, loaded on first need (attn_platform_get) */
    struct attn__kernel_cache *kernels; /* compiled variants, memory and disk (>>nvrtc) */
    attn__CUcontext cuda_primary;    /* the device's primary context, retained on first use */
    attn__CUdevice cuda_device;
#endif
    struct attn__backend_slot *backends; /* context-level state of each backend used */
    int num_backends, backend_capacity;
#ifndef ATTN_NO_THREADS
    pthread_mutex_t select_lock;     /* selection: the cache, backend context state, layer init */
#endif
};
#ifndef ATTN_NO_THREADS
#define ATTN__SELECT_LOCK(ctx) pthread_mutex_lock(&(ctx)->select_lock)
#define ATTN__SELECT_UNLOCK(ctx) pthread_mutex_unlock(&(ctx)->select_lock)
#else
#define ATTN__SELECT_LOCK(ctx) ((void)0)
#define ATTN__SELECT_UNLOCK(ctx) ((void)0)
#endif

/* Last errors are per thread: each thread keeps its own message for each of the last
   ATTN__ERROR_SLOTS contexts it failed on (slot 0: failures without a context), keyed by
   the context's serial (never reused, unlike its address). Threads that fail on one
   context at once never write, or log from, each other's message. */
#define ATTN__ERROR_SLOTS 8
typedef struct attn__error_slot {
    uint64_t serial; /* 0: empty (slot 0: no context) */
    char message[1024];
} attn__error_slot;
static ATTN__THREAD_LOCAL attn__error_slot attn__thread_errors[ATTN__ERROR_SLOTS];
static ATTN__THREAD_LOCAL unsigned attn__thread_error_next;

static uint64_t attn__context_serial(void) {
    static uint64_t next;
#ifndef ATTN_NO_THREADS
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    uint64_t s;
    pthread_mutex_lock(&lock);
    s = ++next;
    pthread_mutex_unlock(&lock);
    return s;
#else
    return ++next;
#endif
}

/* The calling thread's message slot for ctx (NULL: the context-free slot); claim = 0 only
   looks (NULL when this thread has no message for ctx), claim = 1 takes the oldest slot. */
static char *attn__error_slot_of(const attn_context *ctx, int claim) {
    unsigned i;
    if (!ctx) return attn__thread_errors[0].message;
    for (i = 1; i < ATTN__ERROR_SLOTS; i++)
        if (attn__thread_errors[i].serial == ctx->serial) return attn__thread_errors[i].message;
    if (!claim) return NULL;
    i = 1 + attn__thread_error_next++ % (ATTN__ERROR_SLOTS - 1);
    attn__thread_errors[i].serial = ctx->serial;
    attn__thread_errors[i].message[0] = 0;
    return attn__thread_errors[i].message;
}

static const char *attn__level_name(attn_log_level level) {
    switch (level) {
    case ATTN_LOG_LEVEL_ERROR: return "ERROR";
    case ATTN_LOG_LEVEL_WARN: return "WARN";
    case ATTN_LOG_LEVEL_INFO: return "INFO";
    case ATTN_LOG_LEVEL_DEBUG: return "DEBUG";
    default: return "?";
    }
}

/* A level name (case-insensitive) -> *level; 0 if v names none. */
static int attn__parse_log_level(const char *v, attn_log_level *level) {
    if (attn__strieq(v, "error")) *level = ATTN_LOG_LEVEL_ERROR;
    else if (attn__strieq(v, "warn") || attn__strieq(v, "warning")) *level = ATTN_LOG_LEVEL_WARN;
    else if (attn__strieq(v, "info")) *level = ATTN_LOG_LEVEL_INFO;
    else if (attn__strieq(v, "debug")) *level = ATTN_LOG_LEVEL_DEBUG;
    else if (attn__strieq(v, "none") || attn__strieq(v, "off")) *level = ATTN_LOG_LEVEL_NONE;
    else return 0;
    return 1;
}

/* Silent: the logger itself asks this for lines without a context (a bad value is
   reported once per context by attn__env_log_level_check). */
static attn_log_level attn__env_log_level(void) {
    const char *v = attn__trim_env("ATTN_LOG_LEVEL");
    attn_log_level level = ATTN_LOG_LEVEL_INFO;
    if (v && !attn__parse_log_level(v, &level)) level = ATTN_LOG_LEVEL_INFO;
    return level;
}

static void attn__log(const attn_context *ctx, attn_log_level level, attn_log_item item,
                      const char *fmt, ...) ATTN__PRINTF(4, 5);
static void attn__log(const attn_context *ctx, attn_log_level level, attn_log_item item,
                      const char *fmt, ...) {
    char line[768];
    va_list ap;
    attn_log_level threshold = ctx ? ctx->log_level : attn__env_log_level();
    if (threshold == ATTN_LOG_LEVEL_NONE || level > threshold) return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (ctx && ctx->log)
        ctx->log(ctx->log_user_data, level, item, line);
    else
        fprintf(stderr, "attn: %s: %s\n", attn__level_name(level), line);
}

/* Records the message as the last error (context, else thread), logs it at ERROR level
   under `item`, and returns status so callers can `return attn__fail(...)`. */
static attn_status attn__fail(attn_context *ctx, attn_status status, attn_log_item item,
                              const char *fmt, ...) ATTN__PRINTF(4, 5);
static attn_status attn__vfail(attn_context *ctx, attn_status status, attn_log_item item,
                               const char *fmt, va_list ap) {
    char *slot = attn__error_slot_of(ctx, 1);
    vsnprintf(slot, sizeof attn__thread_errors[0].message, fmt, ap);
    attn__log(ctx, ATTN_LOG_LEVEL_ERROR, item, "%s: %s", attn_status_string(status), slot);
    return status;
}
static attn_status attn__fail(attn_context *ctx, attn_status status, attn_log_item item,
                              const char *fmt, ...) {
    attn_status st;
    va_list ap;
    va_start(ap, fmt);
    st = attn__vfail(ctx, status, item, fmt, ap);
    va_end(ap);
    return st;
}

/* The two most common failures, spelled short: a descriptor field out of range, and a
   batch field that is inconsistent. Callers `return` them. */
static attn_status attn__bad_desc(attn_context *ctx, const char *fmt, ...) ATTN__PRINTF(2, 3);
static attn_status attn__bad_desc(attn_context *ctx, const char *fmt, ...) {
    attn_status st;
    va_list ap;
    va_start(ap, fmt);
    st = attn__vfail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC, fmt, ap);
    va_end(ap);
    return st;
}
static attn_status attn__bad_batch(attn_context *ctx, const char *fmt, ...) ATTN__PRINTF(2, 3);
static attn_status attn__bad_batch(attn_context *ctx, const char *fmt, ...) {
    attn_status st;
    va_list ap;
    va_start(ap, fmt);
    st = attn__vfail(ctx, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA, fmt, ap);
    va_end(ap);
    return st;
}

/* The NULL-argument failure every front door reports: `return attn__null_arg(...)`. */
static attn_status attn__null_arg(attn_context *ctx, const char *fn, const char *name) {
    return attn__fail(ctx, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL,
                      "%s: argument '%s' is NULL (a valid pointer is required)", fn, name);
}

/* Environment values other than ATTN_BACKEND: a value that is set but not allowed gets
   one WARN line (through ctx's hook) naming the variable, the value and what is allowed,
   and the caller's default is used. Unset or empty means the default, silently. */
static void attn__env_invalid(const attn_context *ctx, const char *name, const char *value,
                              const char *allowed) {
    attn__log(ctx, ATTN_LOG_LEVEL_WARN, ATTN_LOG_ENV_INVALID,
              "%s='%s' is not allowed (allowed: %s); using the default", name, value, allowed);
}

/* 1/0, true/false, yes/no, on/off (case-insensitive). */
static int attn__env_bool(const attn_context *ctx, const char *name, int dflt) {
    static const char *const words[8] = {"1", "true", "yes", "on", "0", "false", "no", "off"};
    const char *v = attn__trim_env(name);
    int i;
    if (!v) return dflt;
    for (i = 0; i < 8; i++)
        if (attn__strieq(v, words[i])) return i < 4;
    attn__env_invalid(ctx, name, v, "1, 0, true, false, yes, no, on, off (case-insensitive)");
    return dflt;
}

/* A decimal integer in lo..hi. */
static int attn__env_int(const attn_context *ctx, const char *name, int lo, int hi, int dflt) {
    const char *v = attn__trim_env(name);
    char allowed[64];
    char *end;
    long n;
    if (!v) return dflt;
    n = strtol(v, &end, 10);
    if (end != v && !*end && n >= lo && n <= hi) return (int)n;
    attn__fmt(allowed, sizeof allowed, "an integer from %d to %d", lo, hi);
    attn__env_invalid(ctx, name, v, allowed);
    return dflt;
}

/* ATTN_KERNEL_DEFINES (a tuning seam, see the doc block): "ROLE.NAME=VALUE ..." with ROLE
   decode, prefill, cache or decode_wide (the CUDA kernel roles, in that order), NAME an
   identifier, VALUE letters, digits and _. add[role] gets " -DNAME=VALUE" for each token of
   that role. Returns 1 when set and well formed; 0 when unset, or malformed (one WARN
   through ctx naming what is allowed, none when ctx is NULL; nothing to apply). */
static int attn__ident_char(char c, int first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
}
static int attn__env_kernel_defines(const attn_context *ctx, char add[4][256]) {
    static const char *const roles[4] = {"decode", "prefill", "cache", "decode_wide"};
    const char *v = attn__trim_env("ATTN_KERNEL_DEFINES"), *p;
    int pass, r;
    memset(add, 0, 4 * sizeof add[0]);
    if (!v) return 0;
    for (pass = 0; pass < 2; pass++)
        for (p = v; *p;) { /* tokens "ROLE.NAME=VALUE", separated by spaces */
            const char *t = p, *dot, *eq, *end, *c;
            int ok;
            while (*t == ' ') t++;
            if (!*t) break;
            for (end = t; *end && *end != ' '; end++) {}
            for (dot = t; dot < end && *dot != '.'; dot++) {}
            for (eq = dot; eq < end && *eq != '='; eq++) {}
            ok = dot < end && eq < end && eq > dot + 1 && eq + 1 < end && attn__ident_char(dot[1], 1);
            for (r = 0; ok && r < 4; r++)
                if ((size_t)(dot - t) == strlen(roles[r]) && !strncmp(t, roles[r], (size_t)(dot - t))) break;
            ok = ok && r < 4;
            for (c = dot + 1; ok && c < eq; c++) ok = attn__ident_char(*c, 0);
            for (c = eq + 1; ok && c < end; c++) ok = attn__ident_char(*c, 0);
            if (!ok) {
                if (ctx) /* NULL: only asking whether it is well formed */
                    attn__env_invalid(ctx, "ATTN_KERNEL_DEFINES", v, "space-separated ROLE.NAME=VALUE, ROLE one of "
                                      "decode, prefill, cache, decode_wide; NAME an identifier; VALUE letters, digits, _");
                memset(add, 0, 4 * sizeof add[0]);
                return 0;
            }
            if (pass == 1) {
                size_t n = strlen(add[r]);
                attn__fmt(add[r] + n, 256 - n, " -D%.*s", (int)(end - dot - 1), dot + 1);
            }
            p = end;
        }
    return 1;
}

/* ATTN_LOG_LEVEL once more, to report a bad value through a context that has its logger. */
static void attn__env_log_level_check(const attn_context *ctx) {
    const char *v = attn__trim_env("ATTN_LOG_LEVEL");
    attn_log_level level;
    if (v && !attn__parse_log_level(v, &level))
        attn__env_invalid(ctx, "ATTN_LOG_LEVEL", v, "error, warn, info, debug, none "
                          "(case-insensitive)");
}

ATTN_API const char *attn_status_string(attn_status status) {
    switch (status) {
    case ATTN_OK: return "ATTN_OK";
    case ATTN_ERROR_NULL_ARGUMENT: return "ATTN_ERROR_NULL_ARGUMENT";
    case ATTN_ERROR_INVALID_VALUE: return "ATTN_ERROR_INVALID_VALUE";
    case ATTN_ERROR_SHAPE_MISMATCH: return "ATTN_ERROR_SHAPE_MISMATCH";
    case ATTN_ERROR_INVALID_METADATA: return "ATTN_ERROR_INVALID_METADATA";
    case ATTN_ERROR_UNSUPPORTED: return "ATTN_ERROR_UNSUPPORTED";
    case ATTN_ERROR_BACKEND_UNAVAILABLE: return "ATTN_ERROR_BACKEND_UNAVAILABLE";
    case ATTN_ERROR_UNKNOWN_BACKEND: return "ATTN_ERROR_UNKNOWN_BACKEND";
    case ATTN_ERROR_CAPACITY: return "ATTN_ERROR_CAPACITY";
    case ATTN_ERROR_OUT_OF_MEMORY: return "ATTN_ERROR_OUT_OF_MEMORY";
    case ATTN_ERROR_PLATFORM: return "ATTN_ERROR_PLATFORM";
    case ATTN_ERROR_INTERNAL: return "ATTN_ERROR_INTERNAL";
    }
    return "ATTN_ERROR_UNKNOWN_STATUS";
}

ATTN_API const char *attn_log_item_name(attn_log_item item) {
    static const char *const names[] = {
#define ATTN__LOG_NAME(name, text) "ATTN_LOG_" #name,
        ATTN_LOG_ITEMS(ATTN__LOG_NAME)
#undef ATTN__LOG_NAME
    };
    if ((int)item < 0 || (int)item >= (int)ATTN_LOG_ITEM_COUNT) return "ATTN_LOG_?";
    return names[item];
}

/* Per-thread float scratch, grown before a parallel region so tasks never allocate. */
static attn_status attn__scratch_reserve(attn_context *ctx, size_t floats) {
    int t;
    for (t = 0; t < ctx->num_threads; t++) {
        if (ctx->scratch_size[t] < floats) {
            float *p = (float *)attn__malloc(floats * sizeof(float) + 64);
            if (!p)
                return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                                  "worker scratch: cannot allocate %zu bytes",
                                  floats * sizeof(float));
            attn__free(ctx->scratch[t]);
            ctx->scratch[t] = p;
            ctx->scratch_size[t] = floats;
        }
    }
    return ATTN_OK;
}

/* A failure of attn_context_create: logged through the caller's hook and level (`logger`
   holds only those), kept as the thread's last error since there is no context. */
static attn_status attn__create_fail(attn_context *logger, attn_status status, attn_log_item item,
                                     const char *fmt, ...) ATTN__PRINTF(4, 5);
static attn_status attn__create_fail(attn_context *logger, attn_status status, attn_log_item item,
                                     const char *fmt, ...) {
    char *slot = attn__error_slot_of(NULL, 1);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(slot, sizeof attn__thread_errors[0].message, fmt, ap);
    va_end(ap);
    attn__log(logger, ATTN_LOG_LEVEL_ERROR, item, "%s: %s", attn_status_string(status), slot);
    return status;
}

#ifndef ATTN_NO_CUDA
static void attn__cuda_release(attn_context *ctx);                /* >>cuda */
struct attn__kernel_cache;                                         /* >>nvrtc */
static struct attn__kernel_cache *attn__kernel_cache_create(const char *dir);
static void attn__kernel_cache_destroy(struct attn__kernel_cache *kc);
#endif

ATTN_API attn_status attn_context_create(const attn_context_desc *desc, attn_context **out) {
    attn_context_desc d;
    attn_context logger;
    attn_context *ctx;
    int threads;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    memset(&logger, 0, sizeof logger);
    logger.log = d.log;
    logger.log_user_data = d.log_user_data;
    logger.log_level = (int)d.log_level > 0 && (int)d.log_level <= (int)ATTN_LOG_LEVEL_NONE
                           ? d.log_level : attn__env_log_level();
    if (!out)
        return attn__create_fail(&logger, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL,
                          "attn_context_create: argument 'out' is NULL (a valid pointer is "
                          "required)");
    *out = NULL;
    if ((int)d.log_level < 0 || (int)d.log_level > (int)ATTN_LOG_LEVEL_NONE)
        return attn__create_fail(&logger, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
                          "attn_context_create: desc.log_level is %d (allowed: 0..5, "
                          "ATTN_LOG_LEVEL_DEFAULT..ATTN_LOG_LEVEL_NONE)", (int)d.log_level);
    if (d.num_threads < 0 || d.num_threads > 1024)
        return attn__create_fail(&logger, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
                          "attn_context_create: desc.num_threads is %d (allowed: 0 = default, "
                          "or 1..1024)", d.num_threads);
    ctx = (attn_context *)attn__calloc(1, sizeof *ctx);
    if (!ctx)
        return attn__create_fail(&logger, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_context_create: cannot allocate the context");
#ifndef ATTN_NO_THREADS
    pthread_mutex_init(&ctx->select_lock, NULL);
#endif
    ctx->serial = attn__context_serial();
    ctx->log = d.log;
    ctx->log_user_data = d.log_user_data;
    ctx->log_level = d.log_level ? d.log_level : attn__env_log_level();
    /* the environment is read once the logger exists, so bad values reach the hook */
    if (!d.log_level) attn__env_log_level_check(ctx);
    threads = d.num_threads ? d.num_threads
                            : attn__env_int(ctx, "ATTN_NUM_THREADS", 1, 1024, attn__cpu_cores());
#ifdef ATTN_NO_THREADS
    threads = 1;
#endif
    ctx->num_threads = threads;
    ctx->scratch = (float **)attn__calloc((size_t)threads, sizeof(float *));
    ctx->scratch_size = (size_t *)attn__calloc((size_t)threads, sizeof(size_t));
    if (!ctx->scratch || !ctx->scratch_size) {
        attn_context_destroy(ctx);
        return attn__create_fail(&logger, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_context_create: cannot allocate thread scratch tables");
    }
    if (threads > 1) {
        ctx->pool = attn__pool_create(threads);
        if (!ctx->pool) {
            attn_context_destroy(ctx);
            return attn__create_fail(&logger, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR,
                              "attn_context_create: cannot start %d worker threads", threads - 1);
        }
        attn__log(ctx, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_THREADS_STARTED, "%d worker threads",
                  threads);
    }
    ctx->platform.cpu_cores = attn__cpu_cores();
    ctx->platform.cpu_threads = threads;
    attn__strlcpy(ctx->platform.cpu_simd, attn__simd_name(), sizeof ctx->platform.cpu_simd);
    if (d.loader) ctx->loader = *d.loader;
    { /* the CUDA libraries' names: the desc's, else the environment's (copied now) */
        const char *given[3], *envs[3] = {"ATTN_CUDA_LIBRARY", "ATTN_NVRTC_LIBRARY", "ATTN_CUBLAS_LIBRARY"};
        int k;
        given[0] = d.cuda_library; given[1] = d.nvrtc_library; given[2] = d.cublas_library;
        for (k = 0; k < 3; k++) {
            const char *v = given[k] && given[k][0] ? given[k] : attn__trim_env(envs[k]);
            attn__strlcpy(ctx->library_override[k], v ? v : "", sizeof ctx->library_override[k]);
        }
    }
#ifdef ATTN_NO_CUDA
    attn__strlcpy(ctx->platform.cuda_reason, "the CUDA path is compiled out (ATTN_NO_CUDA)", sizeof ctx->platform.cuda_reason);
    attn__strlcpy(ctx->platform.nvrtc_reason, "the CUDA path is compiled out (ATTN_NO_CUDA)", sizeof ctx->platform.nvrtc_reason);
    attn__strlcpy(ctx->platform.cublas_reason, "the CUDA path is compiled out (ATTN_NO_CUDA)", sizeof ctx->platform.cublas_reason);
    attn__strlcpy(ctx->platform.cuda_tma_reason, "the CUDA path is compiled out (ATTN_NO_CUDA)", sizeof ctx->platform.cuda_tma_reason);
#else
    ctx->cuda = (struct attn__cuda_driver *)attn__calloc(1, sizeof *ctx->cuda);
    if (!ctx->cuda) {
        attn_context_destroy(ctx);
        return attn__create_fail(&logger, ATTN_ERROR_OUT_OF_MEMORY,
                          ATTN_LOG_OUT_OF_MEMORY, "attn_context_create: cannot allocate the driver table");
    }
    attn__probe_cuda(&ctx->loader, ctx->library_override[0], ctx->cuda, &ctx->platform);
    ctx->nvrtc = (struct attn__nvrtc *)attn__calloc(1, sizeof *ctx->nvrtc);
    ctx->cublas = (struct attn__cublas *)attn__calloc(1, sizeof *ctx->cublas);
    ctx->kernels = attn__kernel_cache_create(d.kernel_cache_dir);
    if (!ctx->nvrtc || !ctx->cublas || !ctx->kernels) {
        attn_context_destroy(ctx);
        return attn__create_fail(&logger, ATTN_ERROR_OUT_OF_MEMORY,
                          ATTN_LOG_OUT_OF_MEMORY, "attn_context_create: cannot allocate the compiler tables");
    }
    attn__probe_nvrtc(&ctx->loader, ctx->library_override[1], ctx->nvrtc, &ctx->platform);
    if (ctx->platform.kind != ATTN_PLATFORM_CUDA) /* no device: cuBLAS is never opened */
        attn__probe_cublas(&ctx->loader, ctx->library_override[2], ctx->cublas, &ctx->platform);
#endif
    if (ctx->platform.kind != ATTN_PLATFORM_CUDA)
        attn__log(ctx, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_CUDA_UNAVAILABLE, "CUDA: %s",
                  ctx->platform.cuda_reason);
    attn__log(ctx, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_PLATFORM_PROBED,
              "platform %s, %d cores, %d threads, simd %s",
              ctx->platform.kind == ATTN_PLATFORM_CUDA ? "CUDA" : "CPU",
              ctx->platform.cpu_cores, threads, ctx->platform.cpu_simd);
    *out = ctx;
    return ATTN_OK;
}

ATTN_API void attn_context_destroy(attn_context *ctx) {
    int t;
    if (!ctx) return;
    for (t = ctx->num_backends - 1; t >= 0; t--) { /* in reverse order of init */
        attn__backend_slot *bs = &ctx->backends[t];
        if (bs->status == ATTN_OK && bs->backend->context_release)
            bs->backend->context_release(bs->backend, ctx, bs->state);
    }
    attn__free(ctx->backends);
#ifndef ATTN_NO_CUDA
    if (ctx->cuda && ctx->cuda->library) attn__cuda_release(ctx);
#endif
    attn__pool_destroy(ctx->pool);
    if (ctx->scratch)
        for (t = 0; t < ctx->num_threads; t++) attn__free(ctx->scratch[t]);
    attn__free(ctx->scratch);
    attn__free(ctx->scratch_size);
    attn__free(ctx->cache);
#ifndef ATTN_NO_CUDA
    if (ctx->cuda) attn__loader_close(&ctx->loader, ctx->cuda->library);
    attn__free(ctx->cuda);
    if (ctx->nvrtc) attn__loader_close(&ctx->loader, ctx->nvrtc->library);
    attn__free(ctx->nvrtc);
    if (ctx->cublas) attn__loader_close(&ctx->loader, ctx->cublas->library);
    attn__free(ctx->cublas);
    attn__kernel_cache_destroy(ctx->kernels);
#endif
#ifndef ATTN_NO_THREADS
    pthread_mutex_destroy(&ctx->select_lock);
#endif
    attn__free(ctx);
}

ATTN_API const char *attn_context_last_error(const attn_context *ctx) {
    const char *m = attn__error_slot_of(ctx, 0);
    return m ? m : "";
}

ATTN_API attn_status attn_context_set_log_level(attn_context *ctx, attn_log_level level) {
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if ((int)level < 0 || (int)level > (int)ATTN_LOG_LEVEL_NONE)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_context_set_log_level: level is %d (allowed: 0..5)", (int)level);
    ctx->log_level = level ? level : attn__env_log_level();
    if (!level) attn__env_log_level_check(ctx);
    return ATTN_OK;
}

/* The context-level state of backend b, running its context_init the first time this
   context needs it. A failure is remembered (with its reason) for the context's life, so
   the selector's records stay consistent and a broken library is not retried per layer. */
static attn_status attn__backend_context(attn_context *ctx, const attn_backend *b, void **state,
                                         char *reason, size_t reason_size) {
    attn__backend_slot *bs = NULL;
    int i;
    for (i = 0; i < ctx->num_backends; i++)
        if (ctx->backends[i].backend == b) { bs = &ctx->backends[i]; break; }
    if (!bs) {
        if (ctx->num_backends == ctx->backend_capacity) {
            int cap = ctx->backend_capacity ? 2 * ctx->backend_capacity : 4;
            attn__backend_slot *n = (attn__backend_slot *)ATTN_REALLOC(ctx->backends, (size_t)cap * sizeof *n);
            if (!n) {
                attn__fmt(reason, reason_size, "%s: out of memory for its context state", b->name);
                return ATTN_ERROR_OUT_OF_MEMORY;
            }
            ctx->backends = n;
            ctx->backend_capacity = cap;
        }
        bs = &ctx->backends[ctx->num_backends];
        memset(bs, 0, sizeof *bs);
        bs->backend = b;
        if (b->context_init) {
            char why[160];
            why[0] = 0;
            bs->status = b->context_init(b, ctx, &bs->state, why, sizeof why);
            if (bs->status != ATTN_OK)
                attn__fmt(bs->reason, sizeof bs->reason, "%s: %s", b->name,
                          why[0] ? why : attn_status_string(bs->status));
        }
        ctx->num_backends++;
    }
    if (state) *state = bs->state;
    if (bs->status != ATTN_OK) attn__strlcpy(reason, bs->reason, reason_size);
    return bs->status;
}

ATTN_API void *attn_context_backend_state(const attn_context *ctx, const attn_backend *backend) {
    int i;
    if (!ctx || !backend) return NULL;
    for (i = 0; i < ctx->num_backends; i++)
        if (ctx->backends[i].backend == backend && ctx->backends[i].status == ATTN_OK)
            return ctx->backends[i].state;
    return NULL;
}

ATTN_API attn_status attn_platform_get(attn_context *ctx, attn_platform *out) {
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!out) return attn__null_arg(ctx, __func__, "out");
#ifndef ATTN_NO_CUDA
    attn__probe_cublas(&ctx->loader, ctx->library_override[2], ctx->cublas, &ctx->platform); /* once, on a GPU host */
#endif
    *out = ctx->platform;
    return ATTN_OK;
}

/* =======================================================================================
   >>types
   Element types from one table (name, size, row load/store), exact f16/bf16 conversions
   (round to nearest even), tensor views and the checks every front door runs on them.
   ======================================================================================= */

static uint32_t attn__f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float attn__bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

ATTN_API uint16_t attn_f32_to_f16(float x) {
    uint32_t u = attn__f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    if (exp > 142) return (uint16_t)(sign | 0x7c00u); /* >= 2^16: overflow to inf */
    if (exp < 113) {                                   /* subnormal half or zero */
        uint32_t shift, m, r, half;
        if (exp < 102) return (uint16_t)sign;          /* < 2^-25: rounds to zero */
        m = man | 0x800000u;
        shift = 126 - exp;                             /* 14..24 */
        r = m >> shift;
        half = 1u << (shift - 1);
        if ((m & ((half << 1) - 1)) > half || ((m & ((half << 1) - 1)) == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    } else {
        uint32_t h = ((exp - 112) << 10) | (man >> 13);
        uint32_t rest = man & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++; /* may carry into exp: ok */
        return (uint16_t)(sign | h);
    }
}

ATTN_API float attn_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return attn__bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float v = (float)man * (1.0f / 16777216.0f); /* man * 2^-24, exact */
        return sign ? -v : v;
    }
    return attn__bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

ATTN_API uint16_t attn_f32_to_bf16(float x) {
    uint32_t u = attn__f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

ATTN_API float attn_bf16_to_f32(uint16_t h) { return attn__bits_f32((uint32_t)h << 16); }

/* f32 -> an 8-bit float of MB mantissa bits and exponent bias BIAS whose largest finite
   code (without the sign) is MAXC: round to nearest even on the f32 bits, then saturate. */
static uint8_t attn__f32_to_fp8(float x, int mb, int bias, uint32_t maxc) {
    uint32_t u = attn__f32_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    uint32_t exp = a >> 23, man = a & 0x7fffffu, m, r, shift, rest, half;
    int e8;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);  /* NaN */
    if (a == 0x7f800000u) return (uint8_t)(sign | maxc);  /* infinity: saturate */
    if (exp == 0) exp = 1;                                /* f32 subnormal: no implicit bit */
    else man |= 0x800000u;
    e8 = (int)exp - 127 + bias;                           /* the fp8 exponent field */
    /* the kept bits: mb mantissa bits (normal), fewer below the smallest normal */
    shift = (uint32_t)(23 - mb) + (e8 < 1 ? (uint32_t)(1 - e8) : 0u);
    if (shift > 31) return (uint8_t)sign;                 /* < half the smallest subnormal */
    m = man >> shift;
    rest = man & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    if (rest > half || (rest == half && (m & 1u))) m++;
    /* normal: implicit bit -> exponent field (m's bit mb counts one exponent step);
       subnormal: m is the code (a carry into bit mb is the smallest normal) */
    r = e8 < 1 ? m : ((uint32_t)(e8 - 1) << mb) + m;
    if (r > maxc) r = maxc;
    return (uint8_t)(sign | r);
}

ATTN_API uint8_t attn_f32_to_fp8_e4m3(float x) { return attn__f32_to_fp8(x, 3, 7, 0x7eu); }
ATTN_API uint8_t attn_f32_to_fp8_e5m2(float x) { return attn__f32_to_fp8(x, 2, 15, 0x7bu); }

ATTN_API float attn_fp8_e4m3_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24, exp = (c >> 3) & 0xfu, man = c & 7u;
    float v;
    if (exp == 0xf && man == 7) return attn__bits_f32(sign | 0x7fc00000u);
    if (exp == 0) {
        v = (float)man * (1.0f / 512.0f); /* man * 2^-9, exact */
        return sign ? -v : v;
    }
    return attn__bits_f32(sign | ((exp + 120) << 23) | (man << 20));
}

ATTN_API float attn_fp8_e5m2_to_f32(uint8_t c) { return attn_f16_to_f32((uint16_t)((uint16_t)c << 8)); }

/* Rows of n elements between storage and f32 (stores round to nearest even). The f16 and
   bf16 ones are defined in >>cpu, next to the vector layer they use. */
static void attn__f32_row(const void *src, float *dst, int n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void attn__row_store_f32(const float *src, void *dst, int n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void attn__f16_row(const void *src, float *dst, int n);
static void attn__bf16_row(const void *src, float *dst, int n);
static void attn__row_to_f16(const float *src, void *dst, int n);
static void attn__row_to_bf16(const float *src, void *dst, int n);
static void attn__e4m3_row(const void *src, float *dst, int n);
static void attn__e5m2_row(const void *src, float *dst, int n);
static void attn__i8_row(const void *src, float *dst, int n);

/* f32 -> int8 code: round to nearest even, saturated to -127..127, NaN -> 0 (a row with a
   NaN has a NaN scale: it reads back NaN whatever its codes). */
static int8_t attn__f32_to_i8(float x) {
    float r;
    if (!(x == x)) return 0;
    if (x >= 127.0f) return 127;
    if (x <= -127.0f) return -127;
    r = (float)(int)x; /* toward zero, then to nearest even */
    if (fabsf(x - r) > 0.5f || (fabsf(x - r) == 0.5f && ((int)r & 1))) r += x > r ? 1.0f : -1.0f;
    return (int8_t)(int)r;
}

/* f32 rows into the 8-bit cache types, element by element (cache writes only). */
#define ATTN__ROW_FROM_F32(name, T, one)                   \
    static void name(const float *src, void *dst, int n) { \
        T *d = (T *)dst;                                   \
        int i;                                             \
        for (i = 0; i < n; i++) d[i] = one(src[i]);        \
    }
ATTN__ROW_FROM_F32(attn__row_to_e4m3, uint8_t, attn_f32_to_fp8_e4m3)
ATTN__ROW_FROM_F32(attn__row_to_e5m2, uint8_t, attn_f32_to_fp8_e5m2)
ATTN__ROW_FROM_F32(attn__row_to_i8, int8_t, attn__f32_to_i8)
#undef ATTN__ROW_FROM_F32

/* Everything that depends on the element type goes through this table, or through a
   switch without `default:` (so -Wswitch names each place a new type must be handled;
   the SIMD kernels keep one instantiation per type for speed). */
typedef struct attn__dtype_info {
    const char *name, *long_name;                         /* "bf16", "bfloat16" */
    size_t size;                                          /* bytes; 0: not an element type */
    void (*load_row)(const void *src, float *dst, int n); /* n elements -> f32 */
    void (*store_row)(const float *src, void *dst, int n);
    int cache_only;                                       /* 1: KV caches only, scaled (fp8);
                                                             2: a cache row format that holds its
                                                             own scales (fp8_ds_mla) */
    int index_only;                                       /* 1: indices (slot mappings) only */
} attn__dtype_info;

static const attn__dtype_info attn__dtypes[] = { /* one row per attn_dtype, in order */
    {"auto", "auto", 0, NULL, NULL, 0, 0},
    {"f32", "float32", 4, attn__f32_row, attn__row_store_f32, 0, 0},
    {"f16", "float16", 2, attn__f16_row, attn__row_to_f16, 0, 0},
    {"bf16", "bfloat16", 2, attn__bf16_row, attn__row_to_bf16, 0, 0},
    {"fp8_e4m3", "float8_e4m3fn", 1, attn__e4m3_row, attn__row_to_e4m3, 1, 0},
    {"fp8_e5m2", "float8_e5m2", 1, attn__e5m2_row, attn__row_to_e5m2, 1, 0},
    {"int8", "int8", 1, attn__i8_row, attn__row_to_i8, 1, 0},
    {"int64", "int64", 8, NULL, NULL, 0, 1},
    {"int32", "int32", 4, NULL, NULL, 0, 1},
    {"fp8_ds_mla", "fp8_ds_mla", 1, NULL, NULL, 2, 0} /* rows of 656 bytes: attn__ds_mla_row */
};
/* fails to compile when attn_dtype gains an enumerator without a row */
typedef char attn__dtype_table_complete[
    sizeof attn__dtypes / sizeof attn__dtypes[0] == (size_t)ATTN_DTYPE_COUNT ? 1 : -1];

static int attn__dtype_valid(attn_dtype dtype) {
    return (int)dtype >= 0 && (int)dtype < (int)ATTN_DTYPE_COUNT;
}

/* The element types' names for messages: "f32, f16, bf16". */
static void attn__dtype_names(char *buf, size_t size, int long_names) {
    int d;
    buf[0] = 0;
    for (d = 0; d < (int)ATTN_DTYPE_COUNT; d++)
        if (attn__dtypes[d].size && !attn__dtypes[d].index_only) { /* the element types */
            size_t n = strlen(buf);
            attn__fmt(buf + n, size - n, "%s%s", n ? ", " : "", attn__dtypes[d].name);
            if (long_names) {
                n = strlen(buf);
                attn__fmt(buf + n, size - n, " (%s)", attn__dtypes[d].long_name);
            }
        }
}

ATTN_API const char *attn_dtype_name(attn_dtype dtype) {
    return attn__dtype_valid(dtype) ? attn__dtypes[dtype].name : "?";
}

ATTN_API attn_status attn_dtype_from_name(const char *name, attn_dtype *out) {
    char names[160];
    int d;
    if (!name) return attn__null_arg(NULL, __func__, "name");
    if (!out) return attn__null_arg(NULL, __func__, "out");
    if (attn__strieq(name, "fp8")) { /* vLLM's kv_cache_dtype="fp8" */
        *out = ATTN_DTYPE_FP8_E4M3;
        return ATTN_OK;
    }
    for (d = 0; d < (int)ATTN_DTYPE_COUNT; d++)
        if (attn__dtypes[d].size &&
            (attn__strieq(name, attn__dtypes[d].name) || attn__strieq(name, attn__dtypes[d].long_name))) {
            *out = (attn_dtype)d;
            return ATTN_OK;
        }
    attn__dtype_names(names, sizeof names, 1);
    return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                      "attn_dtype_from_name: name '%s' names no element type (allowed, "
                      "case-insensitive: %s)", name, names);
}

ATTN_API size_t attn_dtype_size(attn_dtype dtype) {
    return attn__dtype_valid(dtype) ? attn__dtypes[dtype].size : 0;
}

ATTN_API attn_tensor attn_tensor_make(void *data, attn_dtype dtype, int ndim,
                                      const int64_t *shape) {
    attn_tensor t;
    int i;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = (ndim < 0 || ndim > ATTN_MAX_DIMS || !shape) ? 0 : ndim;
    for (i = 0; i < t.ndim; i++) t.shape[i] = shape[i];
    return t;
}

ATTN_API attn_tensor attn_tensor_slots(const int64_t *slots, int64_t num_tokens) {
    /* the view is read-only by contract (the cache writes take it const) */
    return attn_tensor_make((void *)(uintptr_t)slots, ATTN_DTYPE_INT64, 1, &num_tokens);
}

/* Fills default (contiguous) strides into a copy when all strides are zero. */
static attn_tensor attn__tensor_resolved(const attn_tensor *t) {
    attn_tensor r = *t;
    int i, all_zero = 1;
    for (i = 0; i < r.ndim; i++) if (r.strides[i]) all_zero = 0;
    if (all_zero && r.ndim > 0) {
        int64_t s = 1;
        /* the outermost extent enters no stride: it may be any length without overflow */
        for (i = r.ndim - 1; i >= 0; i--) { r.strides[i] = s; if (i > 0) s *= r.shape[i]; }
    }
    return r;
}

ATTN_API size_t attn_tensor_nbytes(const attn_tensor *t) {
    size_t n;
    int i;
    if (!t || t->ndim <= 0 || t->ndim > ATTN_MAX_DIMS) return 0;
    n = attn_dtype_size(t->dtype);
    for (i = 0; i < t->ndim; i++)
        if (t->shape[i] <= 0) return 0;
    for (i = 0; i < t->ndim; i++) {
        uint64_t e = (uint64_t)t->shape[i];
        if (e > (uint64_t)SIZE_MAX || (n && (size_t)e > SIZE_MAX / n)) return SIZE_MAX;
        n *= (size_t)e;
    }
    return n;
}

/* One element; a switch rather than the table's rows, so the conversion inlines. */
static float attn__load_elem(const void *p, attn_dtype dt, int64_t i) {
    switch (dt) {
    case ATTN_DTYPE_F32: return ((const float *)p)[i];
    case ATTN_DTYPE_F16: return attn_f16_to_f32(((const uint16_t *)p)[i]);
    case ATTN_DTYPE_BF16: return attn_bf16_to_f32(((const uint16_t *)p)[i]);
    case ATTN_DTYPE_FP8_E4M3: return attn_fp8_e4m3_to_f32(((const uint8_t *)p)[i]);
    case ATTN_DTYPE_FP8_E5M2: return attn_fp8_e5m2_to_f32(((const uint8_t *)p)[i]);
    case ATTN_DTYPE_INT8: return (float)((const int8_t *)p)[i];
    case ATTN_DTYPE_AUTO: case ATTN_DTYPE_INT64: case ATTN_DTYPE_INT32: case ATTN_DTYPE_FP8_DS_MLA: case ATTN_DTYPE_COUNT: break; /* not element types */
    }
    ATTN_ASSERT(0);
    return 0.0f;
}

static void attn__store_elem(void *p, attn_dtype dt, int64_t i, float x) {
    switch (dt) {
    case ATTN_DTYPE_F32: ((float *)p)[i] = x; return;
    case ATTN_DTYPE_F16: ((uint16_t *)p)[i] = attn_f32_to_f16(x); return;
    case ATTN_DTYPE_BF16: ((uint16_t *)p)[i] = attn_f32_to_bf16(x); return;
    case ATTN_DTYPE_FP8_E4M3: ((uint8_t *)p)[i] = attn_f32_to_fp8_e4m3(x); return;
    case ATTN_DTYPE_FP8_E5M2: ((uint8_t *)p)[i] = attn_f32_to_fp8_e5m2(x); return;
    case ATTN_DTYPE_INT8: ((int8_t *)p)[i] = attn__f32_to_i8(x); return;
    case ATTN_DTYPE_AUTO: case ATTN_DTYPE_INT64: case ATTN_DTYPE_INT32: case ATTN_DTYPE_FP8_DS_MLA: case ATTN_DTYPE_COUNT: break;
    }
    ATTN_ASSERT(0);
}

/* fp8_ds_mla rows (ATTN_DTYPE_FP8_DS_MLA): 512 e4m3 codes of kv_c, 4 f32 scales (one per
   128 codes), 64 bf16 k_pe values. The write takes each 128-value tile's scale as max|x| /
   448 (at least FLT_MIN: an all-zero tile still has a finite scale), its codes as x /
   scale rounded to nearest even and saturated, as vLLM's concat_and_cache_ds_mla does. */
#define ATTN__DS_MLA_ROW 656
static void attn__ds_mla_row_load(const uint8_t *row, float *dst, const float *lut) { /* 576 values; lut: the
                                                                                   256 e4m3 values */
    float sc[4];
    int i;
    memcpy(sc, row + 512, sizeof sc);
    for (i = 0; i < 512; i++) dst[i] = lut[row[i]] * sc[i >> 7];
    for (i = 0; i < 64; i++) {
        uint16_t b;
        memcpy(&b, row + 528 + 2 * i, 2);
        dst[512 + i] = attn_bf16_to_f32(b);
    }
}

static void attn__ds_mla_row_store(const float *kv_c, const float *k_pe, uint8_t *row) {
    int t, i;
    for (t = 0; t < 4; t++) {
        float amax = 0.0f, sc;
        for (i = 0; i < 128; i++) amax = ATTN__MAX(amax, fabsf(kv_c[128 * t + i]));
        sc = ATTN__MAX(amax / 448.0f, FLT_MIN);
        for (i = 0; i < 128; i++) row[128 * t + i] = attn_f32_to_fp8_e4m3(kv_c[128 * t + i] / sc);
        memcpy(row + 512 + 4 * t, &sc, 4);
    }
    for (i = 0; i < 64; i++) {
        uint16_t b = attn_f32_to_bf16(k_pe[i]);
        memcpy(row + 528 + 2 * i, &b, 2);
    }
}

/* Bytes of one latent row of an MLA layer's cache. */
static size_t attn__mla_row_bytes(const attn_layer_desc *d) {
    return d->kv_cache_dtype == ATTN_DTYPE_FP8_DS_MLA ? (size_t)ATTN__DS_MLA_ROW
                                                       : (size_t)d->head_size * attn_dtype_size(d->kv_cache_dtype);
}

static const char *attn__device_name(attn_device_kind d) {
    switch (d) {
    case ATTN_DEVICE_CPU: return "cpu";
    case ATTN_DEVICE_CUDA: return "cuda";
    }
    return "?";
}

/* Expected extents for attn__check_tensor: n means exactly n, ATTN__AT_LEAST(n) at least n. */
#define ATTN__AT_LEAST(n) (-(int64_t)(n) - 1)

/* Checks a tensor against an expected dtype and shape, innermost dimension contiguous. */
static attn_status attn__check_tensor(attn_context *ctx, const char *fn, const char *name,
                                      const attn_tensor *t, attn_dtype dtype, int ndim,
                                      const int64_t *shape, attn_device_kind device) {
    int i;
    if (!t->data)
        return attn__fail(ctx, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL,
                          "%s: %s.data is NULL (a valid pointer is required)", fn, name);
    if (t->dtype != dtype)
        return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DTYPE,
                          "%s: %s.dtype is %s (allowed: %s)", fn, name,
                          attn_dtype_name(t->dtype), attn_dtype_name(dtype));
    if (t->device.kind != device)
        return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DEVICE,
                          "%s: %s.device is %s (allowed: %s)", fn, name,
                          attn__device_name(t->device.kind), attn__device_name(device));
    if (device == ATTN_DEVICE_CUDA && t->device.index != 0) /* the context's device (attn__cuda_enter) */
        return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_DEVICE,
                          "%s: %s.device.index is %d (allowed: 0; a context works on CUDA device 0)",
                          fn, name, t->device.index);
    if (t->ndim != ndim)
        return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                          "%s: %s.ndim is %d (allowed: %d)", fn, name, t->ndim, ndim);
    for (i = 0; i < ndim; i++) {
        if (shape[i] >= 0 && t->shape[i] != shape[i])
            return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                              "%s: %s.shape[%d] is %lld (allowed: %lld)", fn, name, i,
                              (long long)t->shape[i], (long long)shape[i]);
        if (shape[i] < 0 && t->shape[i] < -shape[i] - 1)
            return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                              "%s: %s.shape[%d] is %lld (allowed: at least %lld)", fn, name,
                              i, (long long)t->shape[i], (long long)(-shape[i] - 1));
    }
    {
        attn_tensor r = attn__tensor_resolved(t);
        if (r.strides[ndim - 1] != 1)
            return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT,
                              "%s: %s.strides[%d] is %lld (allowed: 1, the last dimension "
                              "must be contiguous)", fn, name, ndim - 1,
                              (long long)r.strides[ndim - 1]);
        for (i = 0; i < ndim - 1; i++)
            if (r.strides[i] < 0)
                return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT,
                                  "%s: %s.strides[%d] is %lld (allowed: >= 0)", fn, name, i,
                                  (long long)r.strides[i]);
    }
    return ATTN_OK;
}

/* An output may not hold one element twice (two writers, or a row written over another);
   inputs may (broadcast views). With the dimensions of extent > 1 sorted by stride, each
   stride must reach past the span of the dimensions inside it. After attn__check_tensor. */
static attn_status attn__check_output_tensor(attn_context *ctx, const char *fn, const char *name,
                                             const attn_tensor *t) {
    attn_tensor r = attn__tensor_resolved(t);
    int order[ATTN_MAX_DIMS], n = 0, i, j;
    int64_t span = 1; /* elements from the first to the last of the dimensions so far */
    for (i = 0; i < r.ndim; i++) {
        if (r.shape[i] <= 0) return ATTN_OK; /* empty: nothing is written */
        if (r.shape[i] > 1) order[n++] = i;
    }
    for (i = 1; i < n; i++)
        for (j = i; j > 0 && r.strides[order[j]] < r.strides[order[j - 1]]; j--) {
            int x = order[j]; order[j] = order[j - 1]; order[j - 1] = x;
        }
    for (i = 0; i < n; i++) {
        int k = order[i];
        if (r.strides[k] < span)
            return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT,
                              "%s: %s.strides[%d] is %lld with shape[%d] %lld, so the output's "
                              "elements overlap (allowed: >= %lld, the span of the dimensions "
                              "inside it; outputs may not repeat elements)", fn, name, k,
                              (long long)r.strides[k], k, (long long)r.shape[k], (long long)span);
        span = (r.shape[k] - 1 > (INT64_MAX - span) / r.strides[k])
                   ? INT64_MAX : span + (r.shape[k] - 1) * r.strides[k];
    }
    return ATTN_OK;
}

/* Contiguity of a whole tensor (the KV cache must be exactly the backend's layout). */
static int attn__tensor_is_contiguous(const attn_tensor *t) {
    attn_tensor r = attn__tensor_resolved(t);
    int64_t s = 1;
    int i;
    for (i = r.ndim - 1; i >= 0; i--) {
        if (r.shape[i] != 1 && r.strides[i] != s) return 0;
        if (i > 0) s *= r.shape[i];
    }
    return 1;
}

/* =======================================================================================
   >>registry
   Backend id -> const vtable. Built-in entries are static; attn_register_backend swaps
   an entry under a lock (the only global mutable state in the library).
   ======================================================================================= */

/* The built-in registry rows (>>builtin, after every backend section): one per backend id.
   A built-in backend is its section, one row here and (a GPU one) its kernel family rows. */
typedef struct attn__builtin_row {
    attn_backend_id id;
    const char *name;            /* the slot's name (attn_backend_name) */
    const attn_backend *backend; /* NULL: none built in (CUSTOM; the CUDA ones under ATTN_NO_CUDA) */
    int rank_cpu, rank_cuda;     /* its place in each platform's automatic order, 1 = first */
} attn__builtin_row;
static const attn__builtin_row *attn__builtin_rows(int *count); /* >>builtin */

static const attn_backend *attn__builtin_backend(attn_backend_id id) {
    int count, i;
    const attn__builtin_row *rows = attn__builtin_rows(&count);
    for (i = 0; i < count; i++)
        if (rows[i].id == id) return rows[i].backend;
    return NULL;
}

static const attn_backend *attn__registry_override[ATTN_BACKEND_COUNT];
static int attn__registry_overridden[ATTN_BACKEND_COUNT];
#ifndef ATTN_NO_THREADS
static pthread_mutex_t attn__registry_lock = PTHREAD_MUTEX_INITIALIZER;
#define ATTN__REGISTRY_LOCK() pthread_mutex_lock(&attn__registry_lock)
#define ATTN__REGISTRY_UNLOCK() pthread_mutex_unlock(&attn__registry_lock)
#else
#define ATTN__REGISTRY_LOCK() ((void)0)
#define ATTN__REGISTRY_UNLOCK() ((void)0)
#endif

/* Automatic priority per platform, from the rows' ranks: the first entry whose checks pass
   wins. CUSTOM leads so that a registered plugin is preferred; an empty slot is not a
   candidate. Writes the order into list; returns its length. */
static int attn__priority_list(attn_platform_kind kind, attn_backend_id list[ATTN_BACKEND_COUNT]) {
    int count, n = 0, r, i;
    const attn__builtin_row *rows = attn__builtin_rows(&count);
    for (r = 1; r <= count; r++)
        for (i = 0; i < count && n < (int)ATTN_BACKEND_COUNT; i++)
            if ((kind == ATTN_PLATFORM_CUDA ? rows[i].rank_cuda : rows[i].rank_cpu) == r) list[n++] = rows[i].id;
    return n;
}

ATTN_API const attn_backend *attn_backend_get(attn_backend_id id) {
    const attn_backend *b;
    if ((int)id <= 0 || (int)id >= (int)ATTN_BACKEND_COUNT) return NULL;
    ATTN__REGISTRY_LOCK();
    b = attn__registry_overridden[id] ? attn__registry_override[id] : attn__builtin_backend(id);
    ATTN__REGISTRY_UNLOCK();
    return b;
}

ATTN_API const char *attn_backend_name(attn_backend_id id) {
    int count, i;
    const attn__builtin_row *rows = attn__builtin_rows(&count);
    if (id == ATTN_BACKEND_AUTO) return "AUTO";
    for (i = 0; i < count; i++)
        if (rows[i].id == id) return rows[i].name;
    return "?";
}

/* The valid names, for error messages: "CPU, CUSTOM". */
static void attn__backend_names(char *buf, size_t size) {
    int id;
    buf[0] = 0;
    for (id = 1; id < (int)ATTN_BACKEND_COUNT; id++) {
        const attn_backend *b = attn_backend_get((attn_backend_id)id);
        size_t n = strlen(buf);
        if (!b) continue;
        attn__fmt(buf + n, size - n, "%s%s", n ? ", " : "", b->name);
    }
}

/* A registered backend by its own name or its slot's name, case-insensitively; AUTO if none. */
static attn_backend_id attn__lookup_name(const char *name) {
    int id;
    for (id = 1; id < (int)ATTN_BACKEND_COUNT; id++) {
        const attn_backend *b = attn_backend_get((attn_backend_id)id);
        if (b && (attn__strieq(name, b->name) || attn__strieq(name, attn_backend_name((attn_backend_id)id))))
            return (attn_backend_id)id;
    }
    return ATTN_BACKEND_AUTO;
}

ATTN_API attn_status attn_backend_from_name(const char *name, attn_backend_id *out) {
    char names[256];
    attn_backend_id id;
    if (!name) return attn__null_arg(NULL, __func__, "name");
    if (!out) return attn__null_arg(NULL, __func__, "out");
    id = attn__lookup_name(name);
    if (id != ATTN_BACKEND_AUTO) {
        *out = id;
        return ATTN_OK;
    }
    attn__backend_names(names, sizeof names);
    return attn__fail(NULL, ATTN_ERROR_UNKNOWN_BACKEND, ATTN_LOG_INVALID_ARGUMENT,
                      "backend name '%s' matches no registered backend (allowed, "
                      "case-insensitive: %s)", name, names);
}

ATTN_API attn_status attn_register_backend(attn_backend_id id, const attn_backend *backend) {
    if ((int)id <= 0 || (int)id >= (int)ATTN_BACKEND_COUNT)
        return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_register_backend: id is %d (allowed: 1..%d)", (int)id,
                          (int)ATTN_BACKEND_COUNT - 1);
    if (backend) {
        if (backend->id != id)
            return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "attn_register_backend: backend->id is %d (allowed: %d, the "
                              "slot it is registered in)", (int)backend->id, (int)id);
        if (!backend->name || !backend->kv_cache_shape ||
            (backend->is_mla ? (!backend->forward_mqa || !backend->forward_mha ||
                                !backend->mla_forward || !backend->concat_and_cache_mla)
                             : (!backend->forward || !backend->reshape_and_cache)))
            return attn__fail(NULL, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL,
                              "attn_register_backend: backend must have a name, kv_cache_shape "
                              "and its entry points (standard: forward, reshape_and_cache; MLA: "
                              "forward_mqa, forward_mha, mla_forward, concat_and_cache_mla); one "
                              "is NULL");
        if ((int)backend->device != ATTN_DEVICE_CPU && (int)backend->device != ATTN_DEVICE_CUDA)
            return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "attn_register_backend: backend->device is %d (allowed: "
                              "ATTN_DEVICE_CPU, ATTN_DEVICE_CUDA)", (int)backend->device);
        if (!backend->name[0])
            return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "attn_register_backend: backend->name is \"\" (allowed: a "
                              "non-empty name)");
        if ((int)backend->lse_base != ATTN_LSE_BASE_E && (int)backend->lse_base != ATTN_LSE_BASE_2)
            return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "attn_register_backend: backend->lse_base is %d (allowed: ATTN_LSE_BASE_E, "
                              "ATTN_LSE_BASE_2)", (int)backend->lse_base);
        if (backend->lse_base == ATTN_LSE_BASE_2 && backend->device != ATTN_DEVICE_CPU)
            return attn__fail(NULL, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_INVALID_ARGUMENT,
                              "attn_register_backend: backend->lse_base is ATTN_LSE_BASE_2 on a %s backend "
                              "(allowed: base 2 on CPU backends only, whose LSE the front doors convert "
                              "in place; a GPU backend hands back base e)", attn__device_name(backend->device));
        if ((int)backend->cuda_graph < (int)ATTN_CUDA_GRAPH_NEVER || (int)backend->cuda_graph > (int)ATTN_CUDA_GRAPH_ALWAYS)
            return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "attn_register_backend: backend->cuda_graph is %d (allowed: ATTN_CUDA_GRAPH_NEVER "
                              ".. ATTN_CUDA_GRAPH_ALWAYS)", (int)backend->cuda_graph);
        if (backend->block_size_multiple <= 0 || backend->block_size_multiple % 16)
            return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "attn_register_backend: backend->block_size_multiple is %d "
                              "(allowed: a positive multiple of 16)",
                              backend->block_size_multiple);
    }
    ATTN__REGISTRY_LOCK();
    attn__registry_overridden[id] = backend != NULL;
    attn__registry_override[id] = backend;
    ATTN__REGISTRY_UNLOCK();
    if (backend)
        attn__log(NULL, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_BACKEND_REGISTERED,
                  "registry: %s now serves id %d", backend->name, (int)id);
    else
        attn__log(NULL, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_BACKEND_RESTORED,
                  "registry: id %d restored to its built-in entry", (int)id);
    return ATTN_OK;
}

/* =======================================================================================
   >>selector
   Descriptor validation and defaults, the per-backend checks, and the resolution
   code > env > automatic that always leaves a record and one INFO line.
   ======================================================================================= */

/* Where a pointer points, as the CUDA driver sees it: 1 device memory, 0 host memory (or
   memory the driver does not know), -1 no driver or device to ask (>>cuda). */
static int attn__cuda_pointer_kind(attn_context *ctx, const void *ptr);
/* Whether `stream` is capturing a CUDA graph now: 1 yes; 0 no, or no device (>>cuda). */
static int attn__stream_capturing(attn_context *ctx, void *stream);

/* The index of the first value of f[0..n) that is not finite (NaN, inf), or -1. */
static int attn__nonfinite_at(const float *f, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (!(f[i] - f[i] == 0.0f)) return i;
    return -1;
}

static attn_status attn__desc_resolve(attn_context *ctx, const char *fn,
                                      const attn_layer_desc *in, attn_layer_desc *out) {
    attn_layer_desc d = *in;
    char types[64];
    int i;
    if (d.num_heads <= 0)
        return attn__bad_desc(ctx, "%s: desc.num_heads is %d (allowed: >= 1)", fn, d.num_heads);
    if (d.num_kv_heads < 0)
        return attn__bad_desc(ctx, "%s: desc.num_kv_heads is %d (allowed: 0 = num_heads, or a "
                                   "divisor of num_heads)", fn, d.num_kv_heads);
    if (!d.num_kv_heads) d.num_kv_heads = d.use_mla == 1 ? 1 : d.num_heads;
    if (d.num_heads % d.num_kv_heads)
        return attn__bad_desc(ctx, "%s: desc.num_kv_heads is %d (allowed: a divisor of num_heads "
                                   "%d)", fn, d.num_kv_heads, d.num_heads);
    if (d.head_size <= 0)
        return attn__bad_desc(ctx, "%s: desc.head_size is %d (allowed: >= 1)", fn, d.head_size);
    attn__dtype_names(types, sizeof types, 0);
    if (!attn__dtype_valid(d.dtype))
        return attn__bad_desc(ctx, "%s: desc.dtype is %d (allowed: ATTN_DTYPE_AUTO, or an element "
                                   "type: %s)", fn, (int)d.dtype, types);
    if (attn__dtypes[d.dtype].cache_only || attn__dtypes[d.dtype].index_only)
        return attn__bad_desc(ctx, "%s: desc.dtype is %s (allowed: ATTN_DTYPE_AUTO, f32, f16, bf16; "
                                   "%s is %s)", fn, attn_dtype_name(d.dtype), attn_dtype_name(d.dtype),
                              attn__dtypes[d.dtype].index_only ? "an index type (slot mappings)"
                                                               : "a KV-cache type: set it as desc.kv_cache_dtype");
    if (!attn__dtype_valid(d.kv_cache_dtype) || attn__dtypes[d.kv_cache_dtype].index_only)
        return attn__bad_desc(ctx, "%s: desc.kv_cache_dtype is %d (allowed: ATTN_DTYPE_AUTO, or an "
                                   "element type: %s)", fn, (int)d.kv_cache_dtype, types);
    if (!d.dtype) d.dtype = ATTN_DTYPE_F16;
    if (!d.kv_cache_dtype) d.kv_cache_dtype = d.dtype;
    if (d.block_size < 0 || d.block_size % 16 || d.block_size > 65536)
        return attn__bad_desc(ctx, "%s: desc.block_size is %d (allowed: 0 = 16, or a multiple of "
                                   "16 up to 65536)", fn, d.block_size);
    if (!d.block_size) d.block_size = 16;
    if (d.use_mla < 0 || d.use_mla > 1)
        return attn__bad_desc(ctx, "%s: desc.use_mla is %d (allowed: 0 or 1)", fn, d.use_mla);
    if ((int)d.device != ATTN_DEVICE_CPU && (int)d.device != ATTN_DEVICE_CUDA)
        return attn__bad_desc(ctx, "%s: desc.device is %d (allowed: ATTN_DEVICE_CPU, "
                                   "ATTN_DEVICE_CUDA)", fn, (int)d.device);
    if (d.use_mla) {
        if (d.num_kv_heads != 1)
            return attn__bad_desc(ctx, "%s: desc.num_kv_heads is %d for an MLA layer (allowed: 0 "
                                       "or 1, the one latent head)", fn, in->num_kv_heads);
        if (d.qk_rope_head_dim < 0 || d.kv_lora_rank < 0 || d.qk_nope_head_dim < 0 || d.v_head_dim < 0 ||
            d.qk_rope_head_dim > 65536 || d.kv_lora_rank > 65536 || d.qk_nope_head_dim > 65536 ||
            d.v_head_dim > 65536)
            return attn__bad_desc(ctx, "%s: an MLA dimension is out of range (kv_lora_rank %d, "
                                       "qk_rope_head_dim %d, qk_nope_head_dim %d, v_head_dim %d; "
                                       "allowed: 0 = default, or 1 to 65536)", fn, d.kv_lora_rank,
                                       d.qk_rope_head_dim, d.qk_nope_head_dim, d.v_head_dim);
        if (!d.qk_rope_head_dim) d.qk_rope_head_dim = 64;
        if (!d.kv_lora_rank) d.kv_lora_rank = d.head_size - d.qk_rope_head_dim;
        if (!d.qk_nope_head_dim) d.qk_nope_head_dim = 128;
        if (!d.v_head_dim) d.v_head_dim = 128;
        if (d.kv_lora_rank <= 0 || d.kv_lora_rank + d.qk_rope_head_dim != d.head_size)
            return attn__bad_desc(ctx, "%s: desc.head_size %d is not kv_lora_rank %d + "
                                       "qk_rope_head_dim %d (allowed: head_size = kv_lora_rank + "
                                       "qk_rope_head_dim, e.g. 576 = 512 + 64)", fn, d.head_size,
                                       d.kv_lora_rank, d.qk_rope_head_dim);
    }
    if (!(d.scale >= 0.0f) || d.scale > FLT_MAX)
        return attn__bad_desc(ctx, "%s: desc.scale is %g (allowed: 0 = 1/sqrt(%s), or a finite value > 0)", fn,
                              (double)d.scale, d.use_mla ? "qk_nope_head_dim + qk_rope_head_dim" : "head_size");
    if (d.scale == 0.0f) {
        int qk = d.use_mla ? d.qk_nope_head_dim + d.qk_rope_head_dim : d.head_size;
        d.scale = 1.0f / sqrtf((float)(qk > 0 ? qk : d.head_size));
    }
    if ((int)d.causal < 0 || (int)d.causal > (int)ATTN_CAUSAL_NO)
        return attn__bad_desc(ctx, "%s: desc.causal is %d (allowed: ATTN_CAUSAL_DEFAULT, _YES, _NO)",
                                   fn, (int)d.causal);
    if (!d.causal) d.causal = ATTN_CAUSAL_YES;
    if (d.sliding_window < 0)
        return attn__bad_desc(ctx, "%s: desc.sliding_window is %d (allowed: 0 = none, or >= 1)",
                                   fn, d.sliding_window);
    if (!(d.logits_soft_cap >= 0.0f) || d.logits_soft_cap > FLT_MAX)
        return attn__bad_desc(ctx, "%s: desc.logits_soft_cap is %g (allowed: 0 = none, or a finite "
                                   "value > 0)", fn, (double)d.logits_soft_cap);
    if (d.alibi_slopes && (i = attn__nonfinite_at(d.alibi_slopes, d.num_heads)) >= 0)
        return attn__bad_desc(ctx, "%s: desc.alibi_slopes[%d] is %g (allowed: finite "
                                   "values)", fn, i, (double)d.alibi_slopes[i]);
    if ((int)d.kv_scale_kind != ATTN_KV_SCALE_PER_TENSOR && (int)d.kv_scale_kind != ATTN_KV_SCALE_PER_TOKEN_HEAD)
        return attn__bad_desc(ctx, "%s: desc.kv_scale_kind is %d (allowed: ATTN_KV_SCALE_PER_TENSOR, "
                                   "ATTN_KV_SCALE_PER_TOKEN_HEAD)", fn, (int)d.kv_scale_kind);
    if (d.kv_cache_dtype == ATTN_DTYPE_FP8_DS_MLA) { /* its own format: the rows carry their scales */
        if (!d.use_mla || d.kv_lora_rank != 512 || d.qk_rope_head_dim != 64)
            return attn__bad_desc(ctx, "%s: desc.kv_cache_dtype is fp8_ds_mla for %s (allowed: MLA layers of "
                                       "kv_lora_rank 512 + qk_rope_head_dim 64, DeepSeek-V3.2's latent)", fn,
                                  d.use_mla ? "another latent shape" : "a standard layer");
        if (d.kv_scale_kind != ATTN_KV_SCALE_PER_TENSOR || d.k_scale.value != 0.0f || d.k_scale.ptr ||
            d.v_scale.value != 0.0f || d.v_scale.ptr)
            return attn__bad_desc(ctx, "%s: desc.k_scale / v_scale / kv_scale_kind are set with kv_cache_dtype "
                                       "fp8_ds_mla (allowed: unset; every row holds its own four scales)", fn);
    }
    if (d.kv_scale_kind == ATTN_KV_SCALE_PER_TOKEN_HEAD) {
        if (d.kv_cache_dtype != ATTN_DTYPE_INT8 && d.kv_cache_dtype != ATTN_DTYPE_FP8_E4M3)
            return attn__bad_desc(ctx, "%s: desc.kv_scale_kind is PER_TOKEN_HEAD with kv_cache_dtype %s "
                                       "(allowed: int8, fp8_e4m3)", fn, attn_dtype_name(d.kv_cache_dtype));
        if (d.k_scale.value != 0.0f || d.k_scale.ptr || d.v_scale.value != 0.0f || d.v_scale.ptr)
            return attn__bad_desc(ctx, "%s: desc.k_scale / v_scale are set with kv_scale_kind PER_TOKEN_HEAD "
                                       "(allowed: unset; the cache write computes and stores a scale per "
                                       "row)", fn);
    } else if (d.kv_cache_dtype == ATTN_DTYPE_INT8) {
        return attn__bad_desc(ctx, "%s: desc.kv_cache_dtype is int8 with kv_scale_kind PER_TENSOR (allowed: "
                                   "int8 with ATTN_KV_SCALE_PER_TOKEN_HEAD; per-tensor scales take fp8_e4m3 or "
                                   "fp8_e5m2)", fn);
    }
    for (i = 0; i < 2 && d.kv_scale_kind == ATTN_KV_SCALE_PER_TENSOR; i++) { /* the fp8 scales */
        const attn_kv_scale *s = i ? &d.v_scale : &d.k_scale;
        const char *nm = i ? "v_scale" : "k_scale";
        int needed = attn__dtypes[d.kv_cache_dtype].cache_only == 1 && !(i == 1 && d.use_mla);
        if ((int)s->device != ATTN_DEVICE_CPU && (int)s->device != ATTN_DEVICE_CUDA)
            return attn__bad_desc(ctx, "%s: desc.%s.device is %d (allowed: ATTN_DEVICE_CPU, ATTN_DEVICE_CUDA)",
                                  fn, nm, (int)s->device);
        if (s->ptr) {
            int kind = ctx ? attn__cuda_pointer_kind(ctx, s->ptr) : -1;
            if (s->device != d.device)
                return attn__bad_desc(ctx, "%s: desc.%s.ptr is declared on %s (allowed: %s, the layer's "
                                           "device: desc.device)", fn, nm, attn__device_name(s->device),
                                      attn__device_name(d.device));
            if (kind >= 0 && kind != (s->device == ATTN_DEVICE_CUDA)) /* the driver knows better */
                return attn__bad_desc(ctx, "%s: desc.%s.ptr points to %s memory (the CUDA driver says so) but is "
                                           "declared on %s (allowed: %s memory for a %s layer)", fn, nm,
                                      kind ? "CUDA device" : "host", attn__device_name(s->device),
                                      s->device == ATTN_DEVICE_CUDA ? "device" : "host", attn__device_name(d.device));
        } else if ((needed || s->value != 0.0f) && !(s->value > 0.0f && s->value <= FLT_MAX)) {
            return attn__bad_desc(ctx, needed ? "%s: desc.%s.value is %g for a %s cache (allowed: a finite "
                                                "value > 0, e.g. 1.0, or desc.%s.ptr)"
                                              : "%s: desc.%s.value is %g (allowed: 0 = unset for a %s cache, "
                                                "or a finite value > 0; desc.%s.ptr is the other way)",
                                  fn, nm, (double)s->value, attn_dtype_name(d.kv_cache_dtype), nm);
        }
    }
    if (d.sinks) { /* host values are checked here and at every call (attn__sinks_check) */
        int kind = ctx ? attn__cuda_pointer_kind(ctx, d.sinks) : -1;
        if (kind >= 0 && kind != (d.device == ATTN_DEVICE_CUDA)) /* the driver knows */
            return attn__bad_desc(ctx, "%s: desc.sinks points to %s memory (the CUDA driver says so) for a %s "
                                       "layer (allowed: %s memory, where desc.device puts the layer's tensors)",
                                  fn, kind ? "CUDA device" : "host", attn__device_name(d.device),
                                  d.device == ATTN_DEVICE_CUDA ? "device" : "host");
        if (d.device == ATTN_DEVICE_CPU && (i = attn__nonfinite_at(d.sinks, d.num_heads)) >= 0)
            return attn__bad_desc(ctx, "%s: desc.sinks[%d] is %g (allowed: finite logits)", fn, i,
                                  (double)d.sinks[i]);
    }
    *out = d;
    return ATTN_OK;
}

/* A CPU layer's sinks as they are now (read at every call): each finite, else
   ATTN_ERROR_INVALID_VALUE and the caller changes nothing. */
static attn_status attn__sinks_check(attn_context *ctx, const attn_layer_desc *d, const char *fn) {
    const int i = d->sinks && d->device == ATTN_DEVICE_CPU ? attn__nonfinite_at(d->sinks, d->num_heads) : -1;
    if (i < 0) return ATTN_OK;
    return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                      "%s: desc.sinks[%d] holds %g (allowed: finite logits); nothing was written", fn, i,
                      (double)d->sinks[i]);
}

/* The layer's fp8 scales for one call (1, 1 for other caches): the values, or the floats
   the pointers hold now (host pointers on a CPU layer; checked: finite and > 0, else
   ATTN_ERROR_INVALID_VALUE and the caller changes nothing). */
static attn_status attn__kv_scales(attn_context *ctx, const attn_layer_desc *d, const char *fn, float *ks,
                                   float *vs) {
    int i;
    *ks = *vs = 1.0f;
    if (attn__dtypes[d->kv_cache_dtype].cache_only != 1 || d->kv_scale_kind == ATTN_KV_SCALE_PER_TOKEN_HEAD)
        return ATTN_OK; /* per-token-head, fp8_ds_mla: the scales are in the cache */
    for (i = 0; i < 2; i++) {
        const attn_kv_scale *s = i ? &d->v_scale : &d->k_scale;
        float x;
        if (i == 1 && d->use_mla) { *vs = *ks; break; } /* one latent, one scale */
        if (!s->ptr) x = s->value;
        else if (s->device == ATTN_DEVICE_CPU) x = *s->ptr;
        else return attn__fail(ctx, ATTN_ERROR_INTERNAL, ATTN_LOG_INVALID_ARGUMENT,
                               "%s: desc.%s.ptr is device memory; this backend reads host scales", fn,
                               i ? "v_scale" : "k_scale");
        if (!(x > 0.0f && x <= FLT_MAX))
            return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "%s: desc.%s.ptr holds %g (allowed: a finite value > 0); nothing was written",
                              fn, i ? "v_scale" : "k_scale", (double)x);
        *(i ? vs : ks) = x;
    }
    return ATTN_OK;
}

static int attn__head_size_ok(const attn_backend *b, int hs) {
    return hs >= b->head_size_min && hs <= b->head_size_max &&
           (b->head_size_multiple <= 1 || hs % b->head_size_multiple == 0);
}

static void attn__dtype_mask_names(unsigned mask, char *buf, size_t size) {
    int d;
    buf[0] = 0;
    for (d = 1; d < (int)ATTN_DTYPE_COUNT; d++)
        if (mask & ATTN_DTYPE_BIT(d)) {
            size_t n = strlen(buf);
            attn__fmt(buf + n, size - n, "%s%s", n ? ", " : "", attn_dtype_name((attn_dtype)d));
        }
}

/* Appends one failing check to a backend's reason: "NAME: first", then ", and next". */
static void attn__reason_add(char *reason, size_t size, int *count, const char *name, const char *fmt, ...)
    ATTN__PRINTF(5, 6);
static void attn__reason_add(char *reason, size_t size, int *count, const char *name, const char *fmt, ...) {
    size_t n = strlen(reason);
    va_list ap;
    if (n + 1 >= size) return;
    n += (size_t)attn__fmt(reason + n, size - n, *count ? ", and " : "%s: ", name);
    if (n + 1 < size) {
        va_start(ap, fmt);
        vsnprintf(reason + n, size - n, fmt, ap);
        va_end(ap);
    }
    ++*count;
}

/* 0 when b can serve the (resolved) descriptor on the platform, else every failing check
   is written into reason (the platform first, then the fields in the order of the struct,
   then the backend's own check) and the count of them is returned. A GPU backend's own
   check runs only where the platform has a device: on a CPU host its reason would only
   repeat "no device". */
static int attn__backend_check(const attn_backend *b, const attn_layer_desc *d,
                               const attn_platform *p, char *reason, size_t size) {
    char allowed[64];
    char custom[160];
    int n = 0, platform_ok = b->device != ATTN_DEVICE_CUDA || p->kind == ATTN_PLATFORM_CUDA, custom_used = 0;
    reason[0] = 0;
    if (!platform_ok)
        attn__reason_add(reason, size, &n, b->name, "%s", p->cuda_reason[0] ? p->cuda_reason : "no CUDA device");
    if (b->device != d->device)
        attn__reason_add(reason, size, &n, b->name, "runs on %s tensors; the layer's tensors are on %s "
                         "(attn_layer_desc.device)", attn__device_name(b->device), attn__device_name(d->device));
    if (b->is_mla != d->use_mla)
        attn__reason_add(reason, size, &n, b->name, b->is_mla ? "MLA backend, the layer is not MLA (use_mla = 0)"
                                                              : "standard-attention backend, the layer is MLA "
                                                                "(use_mla = 1)");
    if (!(b->dtypes & ATTN_DTYPE_BIT(d->dtype))) {
        attn__dtype_mask_names(b->dtypes, allowed, sizeof allowed);
        attn__reason_add(reason, size, &n, b->name, "dtype %s not supported (%s)", attn_dtype_name(d->dtype), allowed);
    }
    if (!(b->kv_cache_dtypes & ATTN_DTYPE_BIT(d->kv_cache_dtype))) {
        attn__dtype_mask_names(b->kv_cache_dtypes, allowed, sizeof allowed);
        attn__reason_add(reason, size, &n, b->name, "kv_cache_dtype %s not supported (%s)",
                         attn_dtype_name(d->kv_cache_dtype), allowed);
    }
    custom[0] = 0;
    if (b->check && platform_ok && b->check(b, d, p, custom, sizeof custom) && !custom[0])
        attn__strlcpy(custom, "backend check failed", sizeof custom);
    if (!attn__head_size_ok(b, d->head_size)) {
        /* the fields can only say "a range"; a backend whose sizes are a list (CPU_MLA: 576
           or 320) names them in its own check, so that reason wins when it has one */
        if (custom[0] && strstr(custom, "head_size")) {
            attn__reason_add(reason, size, &n, b->name, "%s", custom);
            custom_used = 1;
        } else {
            attn__reason_add(reason, size, &n, b->name, "head_size %d not supported (multiples of %d from %d to %d)",
                             d->head_size, b->head_size_multiple, b->head_size_min, b->head_size_max);
        }
    }
    if (d->block_size % b->block_size_multiple || (b->block_size_max && d->block_size > b->block_size_max))
        attn__reason_add(reason, size, &n, b->name, "block_size %d not supported (multiples of %d up to %d)",
                         d->block_size, b->block_size_multiple, b->block_size_max);
    if (d->causal == ATTN_CAUSAL_NO && !b->supports_non_causal)
        attn__reason_add(reason, size, &n, b->name, "non-causal attention not supported");
    if (d->sliding_window && !b->supports_sliding_window)
        attn__reason_add(reason, size, &n, b->name, "sliding_window %d not supported", d->sliding_window);
    if (d->logits_soft_cap > 0.0f && !b->supports_logits_soft_cap)
        attn__reason_add(reason, size, &n, b->name, "logits_soft_cap not supported");
    if (d->alibi_slopes && !b->supports_alibi) attn__reason_add(reason, size, &n, b->name, "ALiBi not supported");
    if (d->sinks && !b->supports_sinks) attn__reason_add(reason, size, &n, b->name, "attention sinks not supported");
    if (custom[0] && !custom_used) attn__reason_add(reason, size, &n, b->name, "%s", custom);
    return n;
}

static attn_status attn__layer_bind(attn_layer *layer, const attn_backend *b, char *reason,
                                    size_t size); /* >>layer */

/* 0 when b serves the layer: its capabilities fit, its context-level state is (or can
   be) initialised, and, when a layer is being created, its layer_init succeeds (the
   layer is then bound to b). Else 1 with the reason. */
static int attn__candidate_refused(attn_context *ctx, const attn_backend *b, const attn_layer_desc *d,
                                   attn_layer *layer, char *reason, size_t size) {
    if (attn__backend_check(b, d, &ctx->platform, reason, size)) return 1;
    if (attn__backend_context(ctx, b, NULL, reason, size) != ATTN_OK) return 1;
    return layer && attn__layer_bind(layer, b, reason, size) != ATTN_OK;
}

static uint64_t attn__hash_floats(const float *f, int n) {
    if (!f) return 0;
    return attn__fnv1a(ATTN__FNV_SEED, f, (size_t)n * sizeof(float)) | 1;
}

static int attn__desc_equal(const attn_layer_desc *a, const attn_layer_desc *b) {
    return a->num_heads == b->num_heads && a->num_kv_heads == b->num_kv_heads &&
           a->head_size == b->head_size && a->dtype == b->dtype &&
           a->kv_cache_dtype == b->kv_cache_dtype && a->block_size == b->block_size &&
           a->scale == b->scale && a->causal == b->causal &&
           a->sliding_window == b->sliding_window && a->logits_soft_cap == b->logits_soft_cap &&
           a->use_mla == b->use_mla && a->device == b->device && a->kv_lora_rank == b->kv_lora_rank &&
           a->qk_rope_head_dim == b->qk_rope_head_dim &&
           a->qk_nope_head_dim == b->qk_nope_head_dim && a->v_head_dim == b->v_head_dim &&
           a->kv_scale_kind == b->kv_scale_kind && !a->sinks == !b->sinks;
}

static void attn__selection_add_skip(attn_selection *s, attn_backend_id id, const char *reason) {
    if (s->num_skipped >= ATTN_SELECTION_MAX_SKIPPED) return;
    s->skipped[s->num_skipped].backend = id;
    attn__strlcpy(s->skipped[s->num_skipped].reason, reason, sizeof s->skipped[0].reason);
    s->num_skipped++;
}

/* All skip reasons joined by "; " for error messages. */
static void attn__selection_reasons(const attn_selection *s, char *buf, size_t size) {
    int i;
    buf[0] = 0;
    for (i = 0; i < s->num_skipped; i++) {
        size_t n = strlen(buf);
        attn__fmt(buf + n, size - n, "%s%s", n ? "; " : "", s->skipped[i].reason);
    }
}

/* Walks the platform's priority list; `tried` (already rejected, or AUTO) is not rechecked. */
static void attn__automatic(attn_context *ctx, const attn_layer_desc *d, attn_selection *s,
                            attn_backend_id tried, attn_layer *layer) {
    attn_backend_id list[ATTN_BACKEND_COUNT];
    const int count = attn__priority_list(ctx->platform.kind, list);
    int i;
    char reason[320];
    for (i = 0; i < count; i++) {
        const attn_backend *b = attn_backend_get(list[i]);
        if (!b || list[i] == tried) continue;
        if (attn__candidate_refused(ctx, b, d, layer, reason, sizeof reason)) {
            attn__selection_add_skip(s, list[i], reason);
            attn__log(ctx, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_SELECT_CANDIDATE_SKIPPED, "skipped %s",
                      reason);
            continue;
        }
        s->resolved = list[i];
        return;
    }
}

static attn_status attn__resolve(attn_context *ctx, const attn_layer_desc *d,
                                 const attn_select_request *req, attn_selection *s,
                                 attn_layer *layer) {
    const char *env = attn__trim_env("ATTN_BACKEND");
    attn_backend_id list[ATTN_BACKEND_COUNT];
    const int count = attn__priority_list(ctx->platform.kind, list);
    int i;
    char reasons[2048], reason[320];
    memset(s, 0, sizeof *s);
    attn__strlcpy(s->env_var, "ATTN_BACKEND", sizeof s->env_var);
    if (env) { s->env_set = 1; attn__strlcpy(s->env_value, env, sizeof s->env_value); }
    s->dtype = d->dtype;
    s->kv_cache_dtype = d->kv_cache_dtype;
    s->kv_scale_kind = d->kv_scale_kind;
    s->block_size = d->block_size;
    s->sliding_window = d->sliding_window;
    s->head_size = d->head_size;
    s->num_heads = d->num_heads;
    s->num_kv_heads = d->num_kv_heads;
    s->use_mla = d->use_mla;
    s->device = d->device;
    s->platform = ctx->platform.kind;
    s->device_capability = ctx->platform.kind == ATTN_PLATFORM_CUDA
                               ? ctx->platform.cuda_capability_major * 10 + ctx->platform.cuda_capability_minor
                               : 0;
    attn__strlcpy(s->degradation, "none", sizeof s->degradation);
    for (i = 0; i < count; i++) { /* the first registered backend of the layer's kind and device
                                     whose capability checks pass (CUDA on an A100, where
                                     CUDA_SM90 cannot serve), else the first of that kind */
        const attn_backend *b = attn_backend_get(list[i]);
        char why[320];
        if (!b || b->is_mla != d->use_mla || b->device != d->device) continue;
        if (!s->default_backend) s->default_backend = list[i];
        if (!attn__backend_check(b, d, &ctx->platform, why, sizeof why)) { s->default_backend = list[i]; break; }
    }

    if (req->backend != ATTN_BACKEND_AUTO) {
        s->forced_by_code = 1;
        s->forced_backend = req->backend;
        s->requested = req->backend;
        s->source = ATTN_SELECTION_CODE;
    } else if (env) {
        attn_backend_id id = attn__lookup_name(env);
        s->source = ATTN_SELECTION_ENV;
        if (id == ATTN_BACKEND_AUTO) {
            char names[256];
            attn__backend_names(names, sizeof names);
            attn__fmt(s->log_line, sizeof s->log_line,
                     "ATTN_BACKEND='%s' names no backend (allowed, case-insensitive: %s)", env, names);
            return attn__fail(ctx, ATTN_ERROR_UNKNOWN_BACKEND, ATTN_LOG_SELECT_UNKNOWN_ENV, "%s",
                              s->log_line);
        }
        s->requested = id;
        s->source = ATTN_SELECTION_ENV;
    }

    if (s->requested != ATTN_BACKEND_AUTO) {
        const attn_backend *b = attn_backend_get(s->requested);
        if (!b)
            attn__fmt(reason, sizeof reason, "%s: not registered", attn_backend_name(s->requested));
        if (b && !attn__candidate_refused(ctx, b, d, layer, reason, sizeof reason)) {
            s->resolved = s->requested;
        } else {
            attn__selection_add_skip(s, s->requested, reason);
            if (!req->allow_fallback) {
                attn__fmt(s->log_line, sizeof s->log_line,
                         "backend %s requested by %s cannot serve the layer: %s",
                         attn_backend_name(s->requested),
                         s->source == ATTN_SELECTION_CODE ? "code" : "env ATTN_BACKEND", reason);
                return attn__fail(ctx, ATTN_ERROR_BACKEND_UNAVAILABLE,
                                  ATTN_LOG_SELECT_EXPLICIT_FAILED, "%s", s->log_line);
            }
            s->degraded = 1;
            attn__fmt(s->degradation, sizeof s->degradation, "%s", reason);
            attn__automatic(ctx, d, s, s->requested, layer);
            if (s->resolved)
                attn__log(ctx, ATTN_LOG_LEVEL_WARN, ATTN_LOG_SELECT_FALLBACK,
                          "requested backend %s (%s) cannot serve the layer (%s); falling "
                          "back to %s", attn_backend_name(s->requested),
                          s->source == ATTN_SELECTION_CODE ? "code" : "env", reason,
                          attn_backend_name(s->resolved));
            s->source = ATTN_SELECTION_AUTO;
        }
    } else {
        attn__automatic(ctx, d, s, ATTN_BACKEND_AUTO, layer);
    }
    if (s->resolved) {
        const attn_backend *b = layer ? attn_layer_backend(layer) : attn_backend_get(s->resolved);
        if (b) {
            s->backend_device = b->device;
            s->cuda_graph = b->cuda_graph;
            s->can_return_lse = b->can_return_lse;
            s->lse_base = b->lse_base;
        }
    }
    if (!s->resolved) {
        attn__selection_reasons(s, reasons, sizeof reasons);
        attn__fmt(s->log_line, sizeof s->log_line, "no backend supports the layer: %s",
                 reasons[0] ? reasons : "no backend registered");
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_SELECT_NO_BACKEND, "%s",
                          s->log_line);
    }
    attn__fmt(s->log_line, sizeof s->log_line,
             "attention backend %s (source: %s%s; degraded: %s) for %s layer heads=%d/%d "
             "head_size=%d dtype=%s kv_cache_dtype=%s block_size=%d sliding_window=%d "
             "device=%s platform=%s",
             attn_backend_name(s->resolved),
             s->source == ATTN_SELECTION_CODE ? "code" : s->source == ATTN_SELECTION_ENV ? "env" : "auto",
             (s->source == ATTN_SELECTION_AUTO && s->resolved == s->default_backend) ? ", default" : "",
             s->degradation, d->use_mla ? "MLA" : "standard", d->num_heads, d->num_kv_heads,
             d->head_size, attn_dtype_name(d->dtype), attn_dtype_name(d->kv_cache_dtype),
             d->block_size, d->sliding_window, attn__device_name(d->device),
             ctx->platform.kind == ATTN_PLATFORM_CUDA ? "CUDA" : "CPU");
    attn__log(ctx, ATTN_LOG_LEVEL_INFO, ATTN_LOG_SELECT_RESOLVED, "%s", s->log_line);
    return ATTN_OK;
}

/* Resolution through the context's cache (keyed by descriptor, request, env value); it
   keeps the most recent ATTN__SELECTION_CACHE_MAX resolutions. */
#define ATTN__SELECTION_CACHE_MAX 256
static attn_status attn__select(attn_context *ctx, const attn_layer_desc *d,
                                const attn_select_request *req, attn_selection *out,
                                attn_layer *layer) {
    const char *env = attn__trim_env("ATTN_BACKEND");
    char env_value[64], reason[320];
    uint64_t ah = attn__hash_floats(d->alibi_slopes, d->num_heads);
    attn__selection_cache_entry *e = NULL;
    attn_status st;
    int i;
    attn__strlcpy(env_value, env ? env : "", sizeof env_value);
    for (i = 0; i < ctx->cache_count; i++) {
        attn__selection_cache_entry *c = &ctx->cache[i];
        if (attn__desc_equal(&c->desc, d) && c->alibi_hash == ah &&
            c->request.backend == req->backend && c->request.allow_fallback == req->allow_fallback &&
            strcmp(c->env_value, env_value) == 0) {
            const attn_backend *b = attn_backend_get(c->selection.resolved);
            e = c;
            /* a layer still runs its own layer_init; if that fails now, resolve afresh */
            if (layer && (!b || attn__layer_bind(layer, b, reason, sizeof reason) != ATTN_OK)) break;
            *out = c->selection;
            attn__log(ctx, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_SELECT_CACHED, "cached: %s",
                      out->log_line);
            return ATTN_OK;
        }
    }
    st = attn__resolve(ctx, d, req, out, layer);
    if (st != ATTN_OK) return st;
    if (!e) {
        if (ctx->cache_count == ATTN__SELECTION_CACHE_MAX) { /* bounded: drop the oldest */
            memmove(ctx->cache, ctx->cache + 1, (size_t)(ctx->cache_count - 1) * sizeof *ctx->cache);
            ctx->cache_count--;
        }
        if (ctx->cache_count == ctx->cache_capacity) {
            int cap = ctx->cache_capacity ? ctx->cache_capacity * 2 : 8;
            attn__selection_cache_entry *n = (attn__selection_cache_entry *)ATTN_REALLOC(
                ctx->cache, (size_t)cap * sizeof *n);
            if (!n) return ATTN_OK; /* caching is an optimisation */
            ctx->cache = n;
            ctx->cache_capacity = cap;
        }
        e = &ctx->cache[ctx->cache_count++];
    }
    memset(e, 0, sizeof *e);
    e->desc = *d;
    e->desc.alibi_slopes = NULL;
    e->alibi_hash = ah;
    e->request = *req;
    attn__strlcpy(e->env_value, env_value, sizeof e->env_value);
    e->status = st;
    e->selection = *out;
    return ATTN_OK;
}

ATTN_API attn_status attn_select_backend(attn_context *ctx, const attn_layer_desc *desc,
                                         const attn_select_request *request,
                                         attn_selection *out) {
    attn_layer_desc d;
    attn_select_request req;
    attn_status st;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!desc) return attn__null_arg(ctx, __func__, "desc");
    if (!out) return attn__null_arg(ctx, __func__, "out");
    memset(&req, 0, sizeof req);
    if (request) req = *request;
    if ((int)req.backend < 0 || (int)req.backend >= (int)ATTN_BACKEND_COUNT)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
                          "attn_select_backend: request.backend is %d (allowed: 0 = AUTO .. %d)",
                          (int)req.backend, (int)ATTN_BACKEND_COUNT - 1);
    st = attn__desc_resolve(ctx, "attn_select_backend", desc, &d);
    if (st != ATTN_OK) return st;
    ATTN__SELECT_LOCK(ctx);
    st = attn__select(ctx, &d, &req, out, NULL);
    ATTN__SELECT_UNLOCK(ctx);
    return st;
}

ATTN_API attn_status attn_selection_cache_clear(attn_context *ctx) {
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    ATTN__SELECT_LOCK(ctx);
    ctx->cache_count = 0;
    ATTN__SELECT_UNLOCK(ctx);
    attn__log(ctx, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_SELECT_CACHE_CLEARED, "selection cache cleared");
    return ATTN_OK;
}

static const char *attn__graph_name(attn_cuda_graph_support g) {
    switch (g) {
    case ATTN_CUDA_GRAPH_NEVER: return "NEVER";
    case ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE: return "UNIFORM_SINGLE_TOKEN_DECODE";
    case ATTN_CUDA_GRAPH_UNIFORM_BATCH: return "UNIFORM_BATCH";
    case ATTN_CUDA_GRAPH_ALWAYS: return "ALWAYS";
    }
    return "?";
}

ATTN_API size_t attn_selection_format(const attn_selection *s, char *buf, size_t size) {
    char skipped[ATTN_SELECTION_MAX_SKIPPED * 330 + 1], cap[32], kv[64], features[96];
    const attn_backend *rb;
    int n, i;
    if (!s) return 0;
    rb = s->resolved ? attn_backend_get(s->resolved) : NULL;
    features[0] = 0; /* what the resolved backend's layers may ask for (attn_backend's supports_*) */
    if (rb)
        attn__fmt(features, sizeof features, "%s%s%s%s%s%s%s", rb->supports_non_causal ? " non-causal" : "",
                  rb->supports_sliding_window ? " sliding-window" : "", rb->supports_logits_soft_cap ? " soft-cap" : "",
                  rb->supports_alibi ? " alibi" : "", rb->supports_sinks ? " sinks" : "",
                  rb->supports_cascade ? " cascade" : "", rb->forward_sparse ? " sparse-mla" : "");
    if (!features[0]) attn__strlcpy(features, rb ? " causal only" : " (none)", sizeof features);
    attn__strlcpy(kv, attn_dtype_name(s->kv_cache_dtype), sizeof kv);
    if (s->kv_cache_dtype == ATTN_DTYPE_FP8_E4M3 || s->kv_cache_dtype == ATTN_DTYPE_FP8_E5M2 ||
        s->kv_cache_dtype == ATTN_DTYPE_INT8)
        attn__fmt(kv, sizeof kv, "%s  # scales %s", attn_dtype_name(s->kv_cache_dtype),
                  s->kv_scale_kind == ATTN_KV_SCALE_PER_TOKEN_HEAD ? "per token and head (in the cache)"
                                                                   : "per tensor (k_scale, v_scale)");
    if (s->device_capability)
        attn__fmt(cap, sizeof cap, "%d.%d", s->device_capability / 10, s->device_capability % 10);
    else
        attn__strlcpy(cap, "none (CPU platform)", sizeof cap);
    skipped[0] = 0;
    for (i = 0; i < s->num_skipped; i++) {
        size_t k = strlen(skipped);
        attn__fmt(skipped + k, sizeof skipped - k, "    - %s\n", s->skipped[i].reason);
    }
    n = attn__fmt(buf, size,
                 "selection:\n"
                 "  env_var: %s\n"
                 "  env_value: %s\n"
                 "  forced_by_code: %s\n"
                 "  default_backend: %s\n"
                 "  requested_backend: %s\n"
                 "  resolved_backend: %s\n"
                 "  source: %s\n"
                 "  degradation_hit: %s\n"
                 "  skipped:%s\n%s"
                 "inputs:\n"
                 "  layer: %s\n"
                 "  num_heads: %d\n"
                 "  num_kv_heads: %d\n"
                 "  dtype: %s\n"
                 "  kv_cache_dtype: %s\n"
                 "  block_size: %d  # effective\n"
                 "  sliding_window: %d\n"
                 "  head_size: %d\n"
                 "  device: %s\n"
                 "  device_capability: %s\n"
                 "backend:\n"
                 "  device: %s\n"
                 "  cuda_graph: %s\n"
                 "  lse: %s\n"
                 "  features:%s\n"
                 "platform:\n"
                 "  kind: %s\n"
                 "log:\n"
                 "  backend_line: %s\n"
                 "%s%s%s",
                 s->env_var, s->env_set ? s->env_value : "(unset)",
                 s->forced_by_code ? attn_backend_name(s->forced_backend) : "no",
                 attn_backend_name(s->default_backend), attn_backend_name(s->requested),
                 s->resolved ? attn_backend_name(s->resolved) : "(none)",
                 s->source == ATTN_SELECTION_CODE ? "code" : s->source == ATTN_SELECTION_ENV ? "env" : "auto",
                 s->degradation, s->num_skipped ? "" : " none", skipped,
                 s->use_mla ? "MLA" : "standard", s->num_heads, s->num_kv_heads,
                 attn_dtype_name(s->dtype), kv, s->block_size,
                 s->sliding_window, s->head_size, attn__device_name(s->device), cap,
                 !s->resolved ? "(none)" : attn__device_name(s->backend_device),
                 !s->resolved ? "(none)" : attn__graph_name(s->cuda_graph),
                 !s->resolved ? "(none)" : !s->can_return_lse ? "not returned"
                 : s->lse_base == ATTN_LSE_BASE_2 ? "base 2 (returned as base e)" : "base e",
                 features, s->platform == ATTN_PLATFORM_CUDA ? "CUDA" : "CPU", s->log_line,
                 s->kernel_defines[0] ? "kernel_defines: " : "", s->kernel_defines, s->kernel_defines[0] ? "  # env ATTN_KERNEL_DEFINES\n" : "");
    return n < 0 ? 0 : (size_t)n;
}

/* =======================================================================================
   >>layer
   A resolved backend plus the validated descriptor (defaults filled in, slopes copied).
   ======================================================================================= */

/* A resolved backend plus the validated descriptor (defaults filled in, slopes copied). */
struct attn_layer {
    attn_context *ctx;
    attn_layer_desc desc;
    float *alibi;
    const attn_backend *backend;   /* bound by the selector once layer_init succeeded */
    void *backend_state;           /* what layer_init stored */
    attn_selection selection;
    int decode_items, decode_rows; /* attn_layer_set_decode_parallelism (0: unset) */
};

ATTN_API attn_status attn_layer_create(attn_context *ctx, const attn_layer_desc *desc,
                                       const attn_select_request *request, attn_layer **out) {
    attn_layer_desc d;
    attn_select_request req;
    attn_selection sel;
    attn_layer *layer;
    attn_status st;
    if (!out) return attn__null_arg(ctx, __func__, "out");
    *out = NULL;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!desc) return attn__null_arg(ctx, __func__, "desc");
    memset(&req, 0, sizeof req);
    if (request) req = *request;
    if ((int)req.backend < 0 || (int)req.backend >= (int)ATTN_BACKEND_COUNT)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
                          "attn_layer_create: request.backend is %d (allowed: 0 = AUTO .. %d)",
                          (int)req.backend, (int)ATTN_BACKEND_COUNT - 1);
    st = attn__desc_resolve(ctx, "attn_layer_create", desc, &d);
    if (st != ATTN_OK) return st;
    layer = (attn_layer *)attn__calloc(1, sizeof *layer);
    if (!layer)
        return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_layer_create: cannot allocate the layer");
    if (d.alibi_slopes) {
        layer->alibi = (float *)attn__malloc((size_t)d.num_heads * sizeof(float));
        if (!layer->alibi) {
            attn__free(layer);
            return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                              "attn_layer_create: cannot copy alibi_slopes");
        }
        memcpy(layer->alibi, d.alibi_slopes, (size_t)d.num_heads * sizeof(float));
        d.alibi_slopes = layer->alibi;
    }
    layer->ctx = ctx;
    layer->desc = d;
    /* the selector binds the layer to the first candidate whose layer_init succeeds (one
       thread of a context at a time: the selection cache, backend context state) */
    ATTN__SELECT_LOCK(ctx);
    st = attn__select(ctx, &d, &req, &sel, layer);
    ATTN__SELECT_UNLOCK(ctx);
    if (st != ATTN_OK) {
        attn_layer_destroy(layer);
        return st;
    }
    layer->selection = sel;
    if (layer->backend->device == ATTN_DEVICE_CUDA) { /* what its layer_init compiled in (well formed) */
        char add[4][256];
        if (attn__env_kernel_defines(NULL, add))
            attn__strlcpy(layer->selection.kernel_defines, attn__trim_env("ATTN_KERNEL_DEFINES"),
                          sizeof layer->selection.kernel_defines);
    }
    *out = layer;
    return ATTN_OK;
}

/* Runs b's layer_init for the layer and binds it; a failure leaves the layer unbound. */
static attn_status attn__layer_bind(attn_layer *layer, const attn_backend *b, char *reason,
                                    size_t size) {
    void *state = NULL;
    attn_status st = ATTN_OK;
    if (b->layer_init) {
        char why[160];
        why[0] = 0;
        st = b->layer_init(b, layer, &state, why, sizeof why);
        if (st != ATTN_OK) {
            attn__fmt(reason, size, "%s: layer init failed: %s", b->name,
                      why[0] ? why : attn_status_string(st));
            return st;
        }
    }
    layer->backend = b;
    layer->backend_state = state;
    return ATTN_OK;
}

ATTN_API void attn_layer_destroy(attn_layer *layer) {
    if (!layer) return;
    if (layer->backend && layer->backend->layer_release)
        layer->backend->layer_release(layer->backend, layer, layer->backend_state);
    attn__free(layer->alibi);
    attn__free(layer);
}

ATTN_API const attn_backend *attn_layer_backend(const attn_layer *layer) {
    return layer ? layer->backend : NULL;
}
ATTN_API const attn_selection *attn_layer_selection(const attn_layer *layer) {
    return layer ? &layer->selection : NULL;
}
ATTN_API const attn_layer_desc *attn_layer_get_desc(const attn_layer *layer) {
    return layer ? &layer->desc : NULL;
}
ATTN_API attn_context *attn_layer_context(const attn_layer *layer) {
    return layer ? layer->ctx : NULL;
}
ATTN_API void *attn_layer_backend_state(const attn_layer *layer) {
    return layer ? layer->backend_state : NULL;
}
ATTN_API attn_status attn_layer_set_decode_parallelism(attn_layer *layer, int resident_items, int heads_per_item) {
    if (!layer) return attn__null_arg(NULL, __func__, "layer");
    if (resident_items < 1 || resident_items > (1 << 20))
        return attn__fail(layer->ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_layer_set_decode_parallelism: resident_items is %d (allowed: 1 .. %d)", resident_items,
                          1 << 20);
    if (heads_per_item < 1 || heads_per_item > 4096)
        return attn__fail(layer->ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_layer_set_decode_parallelism: heads_per_item is %d (allowed: 1 .. 4096)",
                          heads_per_item);
    layer->decode_items = resident_items;
    layer->decode_rows = heads_per_item;
    return ATTN_OK;
}

ATTN_API attn_status attn_layer_kv_cache_shape(attn_layer *layer, int64_t num_blocks,
                                               int64_t shape[ATTN_MAX_DIMS], int *ndim) {
    attn_context *ctx = layer ? layer->ctx : NULL;
    if (!layer) return attn__null_arg(ctx, __func__, "layer");
    if (!shape) return attn__null_arg(ctx, __func__, "shape");
    if (!ndim) return attn__null_arg(ctx, __func__, "ndim");
    if (num_blocks <= 0 || num_blocks > ATTN__MAX_BLOCKS)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_layer_kv_cache_shape: num_blocks is %lld (allowed: 1..%lld)",
                          (long long)num_blocks, (long long)ATTN__MAX_BLOCKS);
    *ndim = layer->backend->kv_cache_shape(layer->backend, &layer->desc, num_blocks, shape);
    return ATTN_OK;
}

/* =======================================================================================
   >>metadata
   Fixed-capacity copies of the backend-neutral batch, validated field by field (the
   first bad field is named), then handed to the backend's builder.
   ======================================================================================= */

struct attn_metadata {
    attn_layer *layer;             /* &creator: the metadata's own copy of its creating layer,
                                      so it stays valid after that layer is destroyed */
    attn_layer creator;
    const attn_backend *backend;
    attn_metadata_desc cap;
    attn_layer_desc built_for;     /* the creating layer's descriptor (alibi not kept) */
    int built;
    attn_batch batch;              /* points into the arrays below */
    int32_t *query_start_loc, *seq_lens, *block_table;
    int64_t *slot_mapping;
    int common_prefix_len;
    int kv_splits_forced;          /* desc.num_kv_splits was given (else cap holds the most) */
    int planned;                   /* the batch is copied and planned (set before build) */
    attn_mla_info mla;             /* MLA: the decode/prefill split of the built batch */
    void *priv;
    /* DCP with a communicator: the rank's partial (out rows of dcp_width elements of the
       layer dtype, then f32 LSEs) and the gathered partials of every rank after it */
    void *dcp_buf;
    int dcp_width;
};

/* Work items one pass runs side by side on a device: what split-KV counts aim to fill. */
static int attn__parallelism(const attn_context *ctx, attn_device_kind device) {
    switch (device) {
    case ATTN_DEVICE_CPU: return ctx->num_threads;
    case ATTN_DEVICE_CUDA: return 2 * ATTN__MAX(1, ctx->platform.cuda_multiprocessors);
    }
    return 1;
}

static int attn__env_batch_invariant(const attn_context *ctx) {
    return attn__env_bool(ctx, "ATTN_BATCH_INVARIANT", 0);
}

/* Bytes forward_mha may spend on up-projected K/V of one chunk of keys (and, as much
   again, on the running outputs of the queries it serves at once). */
#ifndef ATTN_MLA_WORKSPACE_BYTES
#define ATTN_MLA_WORKSPACE_BYTES (64u << 20)
#endif

/* Keys up-projected per forward_mha pass: workspace_bytes of K and V for all heads (the
   CPU: f32 K = [K_nope | k_pe] and V, padded; CUDA: K_nope and V in the layer's 16-bit type
   and the chunk's latent rows, k_pe read from them). */
static int attn__mla_prefill_chunk(const attn_layer_desc *d, int64_t workspace_bytes, attn_device_kind device) {
    int64_t per_key = device == ATTN_DEVICE_CUDA
                          ? (int64_t)d->num_heads * (d->qk_nope_head_dim + d->v_head_dim) * 2 + (int64_t)d->head_size * 2
                          : (int64_t)d->num_heads * (((d->qk_nope_head_dim + d->qk_rope_head_dim + 15) / 16 * 16) +
                                                    (d->v_head_dim + 15) / 16 * 16) * 4;
    return (int)ATTN__MIN(4096, ATTN__MAX(64, workspace_bytes / per_key / 64 * 64));
}

/* Split-KV policy. Two policies, for a reason: the standard CPU schedule splits only
   when the batch's own tasks cannot fill the threads, and only as much as needed (it
   adapts per batch: attn__cpu_build); MLA decode splits every decode request the same
   number of times, fixed by the longest decode's keys, so that a GPU grid and its
   workspace are uniform and a captured graph replays for any batch of the capacity.
   Both count about one split per 512 keys. */
ATTN_API int attn_mla_num_kv_splits(int max_seq_len, int parallelism, int batch_invariant) {
    int n = max_seq_len / 512 + (max_seq_len % 512 > 0);
    if (batch_invariant || n < 1) return 1;
    if (parallelism < 1) parallelism = 1;
    return n < parallelism ? n : parallelism;
}

/* The split count of a device: the shared heuristic, with a GPU split unit of 256 keys
   (four of the CUDA MLA decode's 64-key tiles; half the CPU's 512) so that one request
   fills the SMs: a single 16k decode of 128 heads runs 64 splits x 2 CTAs of 64 heads. */
static int attn__mla_splits(attn_device_kind device, int keys, int parallelism, int batch_invariant) {
    if (device == ATTN_DEVICE_CUDA) keys = keys > INT32_MAX / 2 ? INT32_MAX : 2 * keys;
    return attn_mla_num_kv_splits(keys, parallelism, batch_invariant);
}

ATTN_API attn_status attn_reorder_batch(const int32_t *query_lens, int num_reqs,
                                        int decode_threshold, int32_t *perm, int *num_decodes,
                                        int *num_swaps) {
    int i, j, swaps = 0, nd = 0;
    const char *fn = "attn_reorder_batch";
    if (!num_decodes) return attn__null_arg(NULL, __func__, "num_decodes");
    if (num_reqs < 0)
        return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: num_reqs is %d (allowed: >= 0)", fn, num_reqs);
    if (num_reqs > 0) {
        if (!query_lens) return attn__null_arg(NULL, __func__, "query_lens");
        if (!perm) return attn__null_arg(NULL, __func__, "perm");
    }
    if (decode_threshold < 0)
        return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: decode_threshold is %d (allowed: 0 = 1, or >= 1)", fn, decode_threshold);
    if (!decode_threshold) decode_threshold = 1;
    for (i = 0; i < num_reqs; i++)
        if (query_lens[i] < 0)
            return attn__fail(NULL, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "%s: query_lens[%d] is %d (allowed: >= 0)", fn, i, query_lens[i]);
    for (i = 0; i < num_reqs; i++) perm[i] = i;
    i = 0;
    j = num_reqs - 1;
    for (;;) {
        while (i < num_reqs && query_lens[perm[i]] <= decode_threshold) i++;
        while (j >= 0 && query_lens[perm[j]] > decode_threshold) j--;
        if (i >= j) break;
        { int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
        swaps++;
    }
    for (i = 0; i < num_reqs; i++) nd += query_lens[i] <= decode_threshold;
    *num_decodes = nd;
    if (num_swaps) *num_swaps = swaps;
    return ATTN_OK;
}

ATTN_API attn_status attn_metadata_mla_info(const attn_metadata *meta, attn_mla_info *out) {
    attn_context *ctx = meta ? meta->layer->ctx : NULL;
    if (!meta) return attn__null_arg(ctx, __func__, "meta");
    if (!out) return attn__null_arg(ctx, __func__, "out");
    if (!meta->built_for.use_mla)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "attn_metadata_mla_info: meta belongs to a standard layer (allowed: MLA)");
    if (!meta->planned) /* a builder may read the plan of the batch it is building */
        return attn__fail(ctx, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_METADATA_MISMATCH,
                          "attn_metadata_mla_info: meta has not been built");
    *out = meta->mla;
    return ATTN_OK;
}

/* The decode/prefill split of a validated MLA batch (decodes first) and its plan. */
static attn_mla_info attn__mla_plan(const attn_metadata *m, const attn_batch *b) {
    attn_mla_info info;
    int nd = 0, r, max_dec = 0, par;
    memset(&info, 0, sizeof info);
    while (nd < b->num_reqs && b->query_start_loc[nd + 1] - b->query_start_loc[nd] <= m->cap.decode_threshold) nd++;
    for (r = 0; r < nd; r++) max_dec = ATTN__MAX(max_dec, b->seq_lens[r]);
    info.num_decodes = nd;
    info.num_decode_tokens = b->query_start_loc[nd];
    info.num_prefills = b->num_reqs - nd;
    info.num_prefill_tokens = b->num_actual_tokens - info.num_decode_tokens;
    par = attn__parallelism(m->layer->ctx, m->backend->device);
    /* a GPU splits what its decode items leave of the items it runs at once: an item is
       `rows` heads of one token, the backend's resident_items of them at once
       (attn_layer_set_decode_parallelism; unset: 64 heads filling an SM, one per SM); the
       CPU splits every decode alike */
    if (m->backend->device == ATTN_DEVICE_CUDA) {
        int rows = m->layer->decode_rows ? m->layer->decode_rows : 64;
        int items = m->layer->decode_items ? m->layer->decode_items : ATTN__MAX(1, par / 2);
        par = ATTN__MAX(1, items / ATTN__MAX(1, info.num_decode_tokens * ((m->built_for.num_heads + rows - 1) / rows)));
    }
    info.num_kv_splits = m->kv_splits_forced
                             ? m->cap.num_kv_splits
                             : attn__mla_splits(m->backend->device, max_dec, par, attn__env_batch_invariant(m->layer->ctx));
    info.prefill_chunk = attn__mla_prefill_chunk(&m->built_for, m->cap.workspace_bytes, m->backend->device);
    return info;
}

/* Metadata may serve every layer whose schedule- and workspace-relevant fields match its
   creator's: the schedule (heads, block size, causality, window) and the workspaces sized
   at create (MLA's latent, nope and v widths). Writes the mismatching fields, "name V
   (this layer: W)" joined by ", ", into why; returns whether all match. */
static int attn__metadata_fits(const attn_metadata *meta, const attn_layer *layer, char *why, size_t size) {
    const attn_layer_desc *m = &meta->built_for, *d = &layer->desc;
    struct { const char *name; int meta, layer; } f[11];
    size_t n = 0, i, len = 0;
#define ATTN__FIT(field) (f[n].name = #field, f[n].meta = (int)m->field, f[n].layer = (int)d->field, n++)
    ATTN__FIT(num_heads); ATTN__FIT(num_kv_heads); ATTN__FIT(head_size); ATTN__FIT(block_size);
    ATTN__FIT(causal); ATTN__FIT(sliding_window); ATTN__FIT(use_mla);
    if (m->use_mla && d->use_mla) {
        ATTN__FIT(kv_lora_rank); ATTN__FIT(qk_rope_head_dim); ATTN__FIT(qk_nope_head_dim); ATTN__FIT(v_head_dim);
    }
#undef ATTN__FIT
    if (why && size) why[0] = 0;
    if (meta->backend != layer->backend && why)
        len += (size_t)attn__fmt(why, size, "backend %s (this layer: %s)", meta->backend ? meta->backend->name : "?",
                                 layer->backend->name);
    for (i = 0; i < n; i++)
        if (f[i].meta != f[i].layer && why && len < size)
            len += (size_t)attn__fmt(why + len, size - len, "%s%s %d (this layer: %d)", len ? ", " : "", f[i].name,
                                     f[i].meta, f[i].layer);
    if (meta->backend != layer->backend) return 0;
    for (i = 0; i < n; i++)
        if (f[i].meta != f[i].layer) return 0;
    return 1;
}

/* A forward call's metadata: built, and created by a layer of the same configuration. */
static attn_status attn__check_meta(const attn_layer *layer, const attn_metadata *meta, const char *fn) {
    attn_context *ctx = layer->ctx;
    char why[384];
    if (!meta->built)
        return attn__fail(ctx, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_METADATA_MISMATCH,
                          "%s: meta has not been built (call attn_metadata_build first)", fn);
    if (!attn__metadata_fits(meta, layer, why, sizeof why))
        return attn__fail(ctx, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_METADATA_MISMATCH,
                          "%s: meta was created by a layer with %s (allowed: metadata created by a layer "
                          "with the same backend, num_heads, num_kv_heads, head_size, block_size, causal, "
                          "sliding_window, use_mla%s)",
                          fn, why, layer->desc.use_mla ? ", kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and "
                                                         "v_head_dim" : "");
    return ATTN_OK;
}

ATTN_API const attn_batch *attn_metadata_batch(const attn_metadata *meta) {
    return meta ? &meta->batch : NULL;
}
ATTN_API void *attn_metadata_private(const attn_metadata *meta) { return meta ? meta->priv : NULL; }
ATTN_API void attn_metadata_private_set(attn_metadata *meta, void *priv) { if (meta) meta->priv = priv; }
ATTN_API attn_context *attn_metadata_context(const attn_metadata *meta) {
    return meta ? meta->layer->ctx : NULL;
}
ATTN_API const attn_metadata_desc *attn_metadata_capacity(const attn_metadata *meta) {
    return meta ? &meta->cap : NULL;
}

ATTN_API void attn_metadata_destroy(attn_metadata *meta) {
    if (!meta) return;
    if (meta->backend && meta->backend->metadata_release)
        meta->backend->metadata_release(meta->backend, meta);
    attn__free(meta->query_start_loc);
    attn__free(meta->seq_lens);
    attn__free(meta->block_table);
    attn__free(meta->slot_mapping);
    attn__free(meta->dcp_buf);
    attn__free(meta);
}

/* The in-process DCP communicator (attn_communicator_create_local): ranks are threads of
   one process; all_gather publishes each rank's send pointer, meets the others at a
   barrier, copies every rank's bytes, and meets them again before a send buffer may
   change. */
typedef struct attn__local_group {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int size, refs, arrived;
    unsigned long phase;           /* barrier generation */
    const void *send[64];
    size_t bytes[64];
} attn__local_group;

typedef struct attn__local_comm {
    attn_communicator c;           /* first: the public part */
    attn__local_group *g;
} attn__local_comm;

static void attn__local_barrier(attn__local_group *g) {
    unsigned long ph;
    pthread_mutex_lock(&g->lock);
    ph = g->phase;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        g->phase++;
        pthread_cond_broadcast(&g->cond);
    } else {
        while (g->phase == ph) pthread_cond_wait(&g->cond, &g->lock);
    }
    pthread_mutex_unlock(&g->lock);
}

static int attn__local_all_gather(attn_communicator *self, const void *send, void *recv, size_t bytes, void *stream) {
    attn__local_group *g = ((attn__local_comm *)(void *)self)->g;
    int i, rc = 0;
    (void)stream;
    g->send[self->rank] = send;    /* published by the barrier's lock */
    g->bytes[self->rank] = bytes;
    attn__local_barrier(g);
    for (i = 0; i < g->size; i++)
        if (g->bytes[i] != bytes) rc = 1; /* ranks disagree on the size: nothing copied */
    for (i = 0; i < g->size && !rc; i++) memcpy((char *)recv + (size_t)i * bytes, g->send[i], bytes);
    attn__local_barrier(g);        /* every rank has read every send buffer */
    return rc;
}

static void attn__local_destroy(attn_communicator *self) {
    attn__local_group *g = ((attn__local_comm *)(void *)self)->g;
    int last;
    pthread_mutex_lock(&g->lock);
    last = --g->refs == 0;
    pthread_mutex_unlock(&g->lock);
    attn__free(self);
    if (last) {
        pthread_mutex_destroy(&g->lock);
        pthread_cond_destroy(&g->cond);
        attn__free(g);
    }
}

ATTN_API attn_status attn_communicator_create_local(attn_context *ctx, int size, attn_communicator **comms) {
    attn__local_group *g;
    int i;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!comms) return attn__null_arg(ctx, __func__, "comms");
    if (size < 1 || size > 64)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_communicator_create_local: size is %d (allowed: 1..64 ranks)", size);
    for (i = 0; i < size; i++) comms[i] = NULL;
    g = (attn__local_group *)attn__calloc(1, sizeof *g);
    if (!g) goto oom;
    g->size = g->refs = size;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    for (i = 0; i < size; i++) {
        attn__local_comm *c = (attn__local_comm *)attn__calloc(1, sizeof *c);
        if (!c) { /* the ones made so far, then the group (its refs count the rest) */
            int j;
            g->refs = i;
            for (j = 0; j < i; j++) attn__local_destroy(comms[j]), comms[j] = NULL;
            if (i == 0) {
                pthread_mutex_destroy(&g->lock);
                pthread_cond_destroy(&g->cond);
                attn__free(g);
            }
            goto oom;
        }
        c->c.size = size;
        c->c.rank = i;
        c->c.all_gather = attn__local_all_gather;
        c->c.destroy = attn__local_destroy;
        c->c.impl = g;
        c->g = g;
        comms[i] = &c->c;
    }
    return ATTN_OK;
oom:
    return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                      "attn_communicator_create_local: cannot allocate a group of %d ranks", size);
}

ATTN_API void attn_communicator_destroy(attn_communicator *comm) {
    if (comm && comm->destroy) comm->destroy(comm);
}

/* DCP: rank r's count of positions [0, p) with W ranks and runs of I tokens (the identity
   when W is 1). Ownership is monotone, so a global key range [lo, hi) is the local range
   [L(lo), L(hi)) on every rank. */
static int64_t attn__dcp_local(int W, int r, int I, int64_t p) {
    int64_t run, rem;
    if (W <= 1) return p;
    run = (int64_t)W * I;
    rem = p % run - (int64_t)r * I;
    return p / run * I + (rem < 0 ? 0 : rem > I ? I : rem);
}
/* The same for a metadata's capacity (its DCP fields resolved at create). */
static int attn__dcp_len(const attn_metadata_desc *cap, int64_t p) {
    return (int)attn__dcp_local(cap->dcp_world_size, cap->dcp_rank, cap->dcp_interleave, p);
}

ATTN_API int64_t attn_dcp_local_tokens(int world_size, int rank, int interleave, int64_t position) {
    if (world_size < 1 || world_size > 64 || rank < 0 || rank >= world_size || interleave < 1 ||
        interleave > 65536 || position < 0)
        return -1;
    return attn__dcp_local(world_size, rank, interleave, position);
}

static attn_status attn__bad_capacity(attn_context *ctx, const char *field, int64_t value,
                                      int64_t lo, int64_t hi) {
    return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
                      "attn_metadata_create: desc.%s is %lld (allowed: %lld..%lld%s)", field,
                      (long long)value, (long long)lo, (long long)hi,
                      strcmp(field, "workspace_bytes") == 0 ? ", or 0 = default" : "");
}

ATTN_API attn_status attn_metadata_create(attn_layer *layer, const attn_metadata_desc *desc,
                                          attn_metadata **out) {
    attn_context *ctx = layer ? layer->ctx : NULL;
    attn_metadata *m;
    attn_status st;
    const char *fn = "attn_metadata_create";
    if (!out) return attn__null_arg(ctx, __func__, "out");
    *out = NULL;
    if (!layer) return attn__null_arg(ctx, __func__, "layer");
    if (!desc) return attn__null_arg(ctx, __func__, "desc");
    if (desc->max_num_reqs < 1 || desc->max_num_reqs > (1 << 24))
        return attn__bad_capacity(ctx, "max_num_reqs", desc->max_num_reqs, 1, 1 << 24);
    if (desc->max_num_tokens < 1 || desc->max_num_tokens > (1 << 28))
        return attn__bad_capacity(ctx, "max_num_tokens", desc->max_num_tokens, 1, 1 << 28);
    if (desc->max_blocks_per_req < 1 || desc->max_blocks_per_req > (1 << 24))
        return attn__bad_capacity(ctx, "max_blocks_per_req", desc->max_blocks_per_req, 1, 1 << 24);
    if (desc->num_blocks < 1 || desc->num_blocks > ATTN__MAX_BLOCKS)
        return attn__bad_capacity(ctx, "num_blocks", desc->num_blocks, 1, ATTN__MAX_BLOCKS);
    if (desc->decode_threshold < 0 || desc->decode_threshold > 16)
        return attn__bad_capacity(ctx, "decode_threshold", desc->decode_threshold, 0, 16);
    if (desc->num_kv_splits < 0 || desc->num_kv_splits > 1024)
        return attn__bad_capacity(ctx, "num_kv_splits", desc->num_kv_splits, 0, 1024);
    if (desc->workspace_bytes && (desc->workspace_bytes < (1 << 20) || desc->workspace_bytes > ((int64_t)1 << 40)))
        return attn__bad_capacity(ctx, "workspace_bytes", desc->workspace_bytes, 1 << 20, (int64_t)1 << 40);
    if (desc->dcp_world_size < 0 || desc->dcp_world_size > 64)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
                          "%s: desc.dcp_world_size is %d (allowed: 0 or 1 = no DCP, 2..64 ranks)", fn,
                          desc->dcp_world_size);
    if (desc->dcp_rank < 0 || desc->dcp_rank >= ATTN__MAX(1, desc->dcp_world_size))
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
                          "%s: desc.dcp_rank is %d (allowed: 0..%d, dcp_world_size - 1)", fn, desc->dcp_rank,
                          ATTN__MAX(1, desc->dcp_world_size) - 1);
    if (desc->dcp_interleave < 0 || desc->dcp_interleave > 65536)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
                          "%s: desc.dcp_interleave is %d (allowed: 1..65536 tokens per run, or 0 = 1)", fn,
                          desc->dcp_interleave);
    if (desc->dcp_world_size > 1 && layer->backend->id != ATTN_BACKEND_CPU && layer->backend->id != ATTN_BACKEND_CPU_MLA &&
        layer->backend->id != ATTN_BACKEND_CUDA && layer->backend->id != ATTN_BACKEND_CUDA_SM90)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_INVALID_DESC,
                          "%s: desc.dcp_world_size is %d but the layer's backend %s has no decode context "
                          "parallelism yet (allowed there: 0 or 1; CPU, CPU_MLA, CUDA and CUDA_SM90 layers take "
                          "2..64)", fn, desc->dcp_world_size, layer->backend->name);
    if (desc->dcp_comm && layer->backend->device != ATTN_DEVICE_CPU)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_INVALID_DESC,
                          "%s: desc.dcp_comm is set on a %s layer (allowed: NULL there so far: the forward "
                          "returns the rank's partial; gather it with your own NCCL or torch.distributed call "
                          "and join with attn_dcp_combine on the device)", fn, layer->backend->name);
    if (desc->dcp_comm && (desc->dcp_comm->size != ATTN__MAX(1, desc->dcp_world_size) ||
                           desc->dcp_comm->rank != desc->dcp_rank || !desc->dcp_comm->all_gather))
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_DESC,
                          "%s: desc.dcp_comm is rank %d of %d%s (allowed: a communicator of dcp_world_size %d "
                          "ranks at dcp_rank %d, with all_gather)", fn, desc->dcp_comm->rank, desc->dcp_comm->size,
                          desc->dcp_comm->all_gather ? "" : " without all_gather", ATTN__MAX(1, desc->dcp_world_size),
                          desc->dcp_rank);
    if (desc->dcp_world_size > 1 && layer->desc.alibi_slopes)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_INVALID_DESC,
                          "%s: desc.dcp_world_size is %d on a layer with ALiBi slopes (allowed: DCP without "
                          "ALiBi; a rank's keys are local indices, ALiBi needs their positions)", fn,
                          desc->dcp_world_size);
    m = (attn_metadata *)attn__calloc(1, sizeof *m);
    if (!m) goto oom;
    m->creator = *layer;
    m->creator.alibi = NULL;       /* builders do not read slopes; the layer owns them */
    m->creator.desc.alibi_slopes = NULL;
    m->layer = &m->creator;
    m->backend = layer->backend;
    /* every default resolved here, once: builders and backends read m->cap */
    m->cap = *desc;
    if (!m->cap.decode_threshold) m->cap.decode_threshold = 1;
    if (!m->cap.workspace_bytes) m->cap.workspace_bytes = ATTN_MLA_WORKSPACE_BYTES;
    if (m->cap.dcp_world_size < 1) m->cap.dcp_world_size = 1;
    if (m->cap.dcp_interleave < 1) m->cap.dcp_interleave = 1;
    m->kv_splits_forced = desc->num_kv_splits > 0;
    if (!m->kv_splits_forced) /* the most any batch of this capacity gets */
        m->cap.num_kv_splits = attn__mla_splits(
            layer->backend->device,
            (int)ATTN__MIN((int64_t)INT32_MAX, (int64_t)desc->max_blocks_per_req * layer->desc.block_size),
            ATTN__MAX(attn__parallelism(ctx, layer->backend->device), layer->decode_items), 0);
    m->built_for = layer->desc;
    m->built_for.alibi_slopes = NULL;
    m->query_start_loc = (int32_t *)attn__calloc((size_t)desc->max_num_reqs + 1, sizeof(int32_t));
    m->seq_lens = (int32_t *)attn__calloc((size_t)desc->max_num_reqs, sizeof(int32_t));
    m->block_table = (int32_t *)attn__calloc((size_t)desc->max_num_reqs * (size_t)desc->max_blocks_per_req,
                                             sizeof(int32_t));
    m->slot_mapping = (int64_t *)attn__calloc((size_t)desc->max_num_tokens, sizeof(int64_t));
    if (!m->query_start_loc || !m->seq_lens || !m->block_table || !m->slot_mapping) goto oom;
    if (desc->dcp_comm) { /* the widest output row: the head, or the MLA latent / v */
        const attn_layer_desc *d = &layer->desc;
        const size_t rows = (size_t)desc->max_num_tokens * (size_t)d->num_heads;
        m->dcp_width = ATTN__MAX(d->head_size, d->use_mla ? ATTN__MAX(d->kv_lora_rank, d->v_head_dim) : 0);
        m->dcp_buf = attn__calloc(((size_t)m->cap.dcp_world_size + 1) * rows,
                                  (size_t)m->dcp_width * attn_dtype_size(d->dtype) + sizeof(float));
        if (!m->dcp_buf) goto oom;
    }
    if (m->backend->metadata_init) {
        st = m->backend->metadata_init(m->backend, layer, m);
        if (st != ATTN_OK) {
            m->backend = NULL; /* nothing to release */
            attn_metadata_destroy(m);
            return st;
        }
    }
    *out = m;
    return ATTN_OK;
oom:
    if (m) m->backend = NULL;
    attn_metadata_destroy(m);
    return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                      "%s: cannot allocate metadata for %d requests, %d tokens, %d blocks per "
                      "request", fn, desc->max_num_reqs, desc->max_num_tokens,
                      desc->max_blocks_per_req);
}

/* Checks every field of the batch against itself and the capacity; names the first bad one. */
static attn_status attn__batch_validate(attn_context *ctx, const attn_metadata *m,
                                        int common_prefix_len, const attn_batch *b) {
    const char *fn = "attn_metadata_build";
    int i, max_q = 0, max_s = 0;
    int64_t num_slots = m->cap.num_blocks * (int64_t)m->built_for.block_size;
    if (b->num_reqs < 0)
        return attn__bad_batch(ctx, "%s: batch.num_reqs is %d (allowed: >= 0)", fn, b->num_reqs);
    if (b->num_reqs > m->cap.max_num_reqs)
        return attn__fail(ctx, ATTN_ERROR_CAPACITY, ATTN_LOG_CAPACITY_EXCEEDED,
                          "%s: batch.num_reqs is %d (allowed: <= max_num_reqs %d of this metadata)",
                          fn, b->num_reqs, m->cap.max_num_reqs);
    if (b->num_actual_tokens < 0)
        return attn__bad_batch(ctx, "%s: batch.num_actual_tokens is %d (allowed: >= 0)", fn,
                                    b->num_actual_tokens);
    if (b->num_actual_tokens > m->cap.max_num_tokens)
        return attn__fail(ctx, ATTN_ERROR_CAPACITY, ATTN_LOG_CAPACITY_EXCEEDED,
                          "%s: batch.num_actual_tokens is %d (allowed: <= max_num_tokens %d of "
                          "this metadata)", fn, b->num_actual_tokens, m->cap.max_num_tokens);
    if ((int)b->causal < 0 || (int)b->causal > (int)ATTN_CAUSAL_NO)
        return attn__bad_batch(ctx, "%s: batch.causal is %d (allowed: ATTN_CAUSAL_DEFAULT, _YES, "
                                    "_NO)", fn, (int)b->causal);
    if (!b->query_start_loc)
        return attn__fail(ctx, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_INVALID_METADATA,
                          "%s: batch.query_start_loc is NULL (a [num_reqs+1] array is required)", fn);
    if (b->num_reqs > 0 && (!b->seq_lens || !b->block_table))
        return attn__fail(ctx, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_INVALID_METADATA,
                          "%s: batch.%s is NULL (required when num_reqs > 0)", fn,
                          b->seq_lens ? "block_table" : "seq_lens");
    if (b->num_reqs > 0 && (b->block_table_stride < 1 || b->block_table_stride > m->cap.max_blocks_per_req))
        return attn__bad_batch(ctx, "%s: batch.block_table_stride is %d (allowed: 1..%d, "
                                    "max_blocks_per_req of this metadata)", fn,
                                    b->block_table_stride, m->cap.max_blocks_per_req);
    if (b->query_start_loc[0] != 0)
        return attn__bad_batch(ctx, "%s: batch.query_start_loc[0] is %d (allowed: 0)", fn,
                                    b->query_start_loc[0]);
    for (i = 0; i < b->num_reqs; i++) /* the order first: a decrease is what is wrong, not a total */
        if (b->query_start_loc[i + 1] < b->query_start_loc[i])
            return attn__bad_batch(ctx, "%s: batch.query_start_loc decreases at index %d (%d then %d; allowed: "
                                        "non-decreasing offsets from 0)", fn, i + 1, b->query_start_loc[i],
                                        b->query_start_loc[i + 1]);
    for (i = 0; i < b->num_reqs; i++) {
        int q0 = b->query_start_loc[i], q1 = b->query_start_loc[i + 1];
        int ql, sl = b->seq_lens[i], nb, k;
        ql = q1 - q0;
        if (q1 > b->num_actual_tokens)
            return attn__bad_batch(ctx, "%s: batch.query_start_loc[%d] is %d (allowed: <= "
                                        "num_actual_tokens %d)", fn, i + 1, q1,
                                        b->num_actual_tokens);
        if (sl < 0)
            return attn__bad_batch(ctx, "%s: batch.seq_lens[%d] is %d (allowed: >= 0)", fn, i, sl);
        if (ql > sl)
            return attn__bad_batch(ctx, "%s: request %d has query_len %d > seq_lens[%d] %d "
                                        "(allowed: query_len <= seq_len)", fn, i, ql, i, sl);
        nb = (int)(((int64_t)attn__dcp_len(&m->cap, sl) + m->built_for.block_size - 1) / m->built_for.block_size);
        if (nb > b->block_table_stride)
            return attn__bad_batch(ctx, "%s: batch.seq_lens[%d] is %d, needing %d blocks of %d%s, "
                                        "but the block table row holds %d (block_table_stride)",
                                        fn, i, sl, nb, m->built_for.block_size,
                                        m->cap.dcp_world_size > 1 ? " on this DCP rank" : "",
                                        b->block_table_stride);
        for (k = 0; k < nb; k++) {
            int32_t id = b->block_table[(size_t)i * (size_t)b->block_table_stride + (size_t)k];
            if (id < 0 || id >= m->cap.num_blocks)
                return attn__bad_batch(ctx, "%s: batch.block_table[%d][%d] is %d (allowed: "
                                            "0..%lld, num_blocks - 1)", fn, i, k, id,
                                            (long long)m->cap.num_blocks - 1);
        }
        if (ql > max_q) max_q = ql;
        if (sl > max_s) max_s = sl;
    }
    if (b->query_start_loc[b->num_reqs] != b->num_actual_tokens)
        return attn__bad_batch(ctx, "%s: batch.query_start_loc[num_reqs=%d] is %d but "
                                    "num_actual_tokens is %d (they must agree)", fn, b->num_reqs,
                                    b->query_start_loc[b->num_reqs], b->num_actual_tokens);
    if (b->max_query_len != max_q)
        return attn__bad_batch(ctx, "%s: batch.max_query_len is %d but the longest query is %d "
                                    "(they must agree)", fn, b->max_query_len, max_q);
    if (b->max_seq_len != max_s)
        return attn__bad_batch(ctx, "%s: batch.max_seq_len is %d but the longest sequence is %d "
                                    "(they must agree)", fn, b->max_seq_len, max_s);
    if (b->slot_mapping)
        for (i = 0; i < b->num_actual_tokens; i++) {
            int64_t s = b->slot_mapping[i];
            if (s < -1 || s >= num_slots)
                return attn__bad_batch(ctx, "%s: batch.slot_mapping[%d] is %lld (allowed: -1 = "
                                            "padding, or 0..%lld = num_blocks * block_size - 1)",
                                            fn, i, (long long)s, (long long)num_slots - 1);
        }
    if (b->slot_mapping && m->cap.dcp_world_size > 1) /* the rank's own tokens, at their local slots */
        for (i = 0; i < b->num_reqs; i++) {
            const int q0 = b->query_start_loc[i], ql = b->query_start_loc[i + 1] - q0, sl = b->seq_lens[i];
            const int W = m->cap.dcp_world_size, I = m->cap.dcp_interleave, bs = m->built_for.block_size;
            int t;
            for (t = 0; t < ql; t++) {
                const int pos = sl - ql + t, mine = (pos / I) % W == m->cap.dcp_rank, j = attn__dcp_len(&m->cap, pos);
                const int64_t want = mine ? (int64_t)b->block_table[(size_t)i * (size_t)b->block_table_stride +
                                                                     (size_t)(j / bs)] * bs + j % bs : -1;
                if (b->slot_mapping[q0 + t] != want && !(mine && b->slot_mapping[q0 + t] == -1))
                    return attn__bad_batch(ctx, "%s: batch.slot_mapping[%d] is %lld but DCP rank %d of %d "
                                                "(interleave %d) %s position %d of request %d (allowed: %lld%s)",
                                                fn, q0 + t, (long long)b->slot_mapping[q0 + t], m->cap.dcp_rank, W,
                                                I, mine ? "holds" : "does not hold", pos, i, (long long)want,
                                                mine ? ", its local index's slot, or -1 = padding" : " = another rank's token");
            }
        }
    if (common_prefix_len < 0 || common_prefix_len > max_s)
        return attn__bad_batch(ctx, "%s: common_prefix_len is %d (allowed: 0..%d, max_seq_len)",
                                    fn, common_prefix_len, max_s);
    if (common_prefix_len > 0 && m->cap.dcp_world_size > 1)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_INVALID_METADATA,
                          "%s: common_prefix_len is %d with dcp_world_size %d (allowed: 0 under DCP; cascade "
                          "attention over a sharded prefix is not built)", fn, common_prefix_len,
                          m->cap.dcp_world_size);
    if (common_prefix_len > 0) { /* whole blocks every request holds, before its queries */
        const int bs = m->built_for.block_size, nb = common_prefix_len / bs;
        int j;
        if (common_prefix_len % bs)
            return attn__bad_batch(ctx, "%s: common_prefix_len is %d (allowed: 0, or a multiple of "
                                        "block_size %d: the shared prefix is whole blocks)", fn,
                                        common_prefix_len, bs);
        for (i = 0; i < b->num_reqs; i++) {
            const int ql = b->query_start_loc[i + 1] - b->query_start_loc[i], cl = b->seq_lens[i] - ql;
            if (common_prefix_len > cl)
                return attn__bad_batch(ctx, "%s: common_prefix_len is %d but request %d has %d tokens of "
                                            "context (seq_len %d - query_len %d; allowed: at most every "
                                            "request's context, as vLLM computes it)", fn,
                                            common_prefix_len, i, cl, b->seq_lens[i], ql);
            for (j = 0; i > 0 && j < nb; j++)
                if (b->block_table[(size_t)i * (size_t)b->block_table_stride + (size_t)j] != b->block_table[j])
                    return attn__bad_batch(ctx, "%s: common_prefix_len is %d but request %d's block_table[%d] "
                                                "is %d, request 0's %d (allowed: the first common_prefix_len / "
                                                "block_size = %d blocks the same in every request)", fn,
                                                common_prefix_len, i, j,
                                                b->block_table[(size_t)i * (size_t)b->block_table_stride + (size_t)j],
                                                b->block_table[j], nb);
        }
    }
    {
        attn_causal c = b->causal ? b->causal : m->built_for.causal;
        if (c == ATTN_CAUSAL_NO && !m->backend->supports_non_causal)
            return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_INVALID_METADATA,
                              "%s: batch.causal is ATTN_CAUSAL_NO but backend %s is causal only "
                              "(allowed: ATTN_CAUSAL_DEFAULT or _YES)", fn, m->backend->name);
    }
    if (m->built_for.use_mla) { /* MLA batches list their decodes first */
        int thr = m->cap.decode_threshold, first_prefill = -1;
        for (i = 0; i < b->num_reqs; i++) {
            int ql = b->query_start_loc[i + 1] - b->query_start_loc[i];
            if (ql > thr && first_prefill < 0) first_prefill = i;
            if (ql <= thr && first_prefill >= 0)
                return attn__bad_batch(ctx, "%s: request %d (query_len %d) is a decode after the "
                                            "prefill request %d (allowed: decodes first; reorder "
                                            "with attn_reorder_batch)", fn, i, ql, first_prefill);
        }
    }
    return ATTN_OK;
}

ATTN_API attn_status attn_metadata_build(attn_metadata *meta, int common_prefix_len,
                                         const attn_batch *batch, int fast_build) {
    attn_context *ctx = meta ? meta->layer->ctx : NULL;
    attn_status st;
    int i;
    if (!meta) return attn__null_arg(ctx, __func__, "meta");
    if (!batch) return attn__null_arg(ctx, __func__, "batch");
    st = attn__batch_validate(ctx, meta, common_prefix_len, batch);
    if (st != ATTN_OK) return st;
    memcpy(meta->query_start_loc, batch->query_start_loc, ((size_t)batch->num_reqs + 1) * sizeof(int32_t));
    if (batch->num_reqs > 0) {
        memcpy(meta->seq_lens, batch->seq_lens, (size_t)batch->num_reqs * sizeof(int32_t));
        for (i = 0; i < batch->num_reqs; i++) {
            int nb = (int)(((int64_t)attn__dcp_len(&meta->cap, batch->seq_lens[i]) + meta->built_for.block_size - 1) /
                           meta->built_for.block_size);
            memcpy(meta->block_table + (size_t)i * (size_t)meta->cap.max_blocks_per_req,
                   batch->block_table + (size_t)i * (size_t)batch->block_table_stride,
                   (size_t)nb * sizeof(int32_t));
        }
    }
    if (batch->slot_mapping && batch->num_actual_tokens > 0)
        memcpy(meta->slot_mapping, batch->slot_mapping, (size_t)batch->num_actual_tokens * sizeof(int64_t));
    meta->batch = *batch;
    meta->batch.query_start_loc = meta->query_start_loc;
    meta->batch.seq_lens = meta->seq_lens;
    meta->batch.block_table = meta->block_table;
    meta->batch.block_table_stride = meta->cap.max_blocks_per_req;
    meta->batch.slot_mapping = batch->slot_mapping ? meta->slot_mapping : NULL;
    if (!meta->batch.causal) meta->batch.causal = meta->layer->desc.causal;
    meta->common_prefix_len = common_prefix_len;
    meta->built = 0;
    if (meta->built_for.use_mla) meta->mla = attn__mla_plan(meta, &meta->batch);
    meta->planned = 1;
    if (meta->backend->build) {
        st = meta->backend->build(meta->backend, meta->layer, meta, common_prefix_len, fast_build);
        if (st != ATTN_OK) {
            meta->planned = 0;
            return st;
        }
    }
    meta->built = 1;
    return ATTN_OK;
}

/* =======================================================================================
   >>cache
   The cache-write front doors: every tensor and slot checked, then the backend writes
   (standard: reshape_and_cache; MLA: concat_and_cache_mla).
   ======================================================================================= */

/* What a call recorded into a CUDA graph may hold: a call issued on a stream that is
   capturing must be one its backend declares replayable (attn_backend.cuda_graph), else it
   is refused before anything is recorded (>>forward). part: ATTN__PART_ALL (a forward or
   the fused MLA call: the batch decides), ATTN__PART_DECODES (forward_mqa),
   ATTN__PART_PREFILLS (forward_mha), ATTN__PART_WRITE (a cache write: meta NULL). */
enum { ATTN__PART_ALL, ATTN__PART_DECODES, ATTN__PART_PREFILLS, ATTN__PART_WRITE };

#define ATTN__SPARSE_TOPK_MAX 16384 /* attn_mla_forward_sparse's largest topk */
#define ATTN__MLA_SPARSE_SPLITS 16  /* the most splits of a token's indices on the GPU */

/* The request of batch token t (query_start_loc[r] <= t < query_start_loc[r + 1]). */
static int attn__token_request(const attn_batch *b, int t) {
    int lo = 0, hi = b->num_reqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->query_start_loc[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Host indices of a sparse MLA call: each -1 or a position of its token's request. */
static attn_status attn__sparse_indices_check(const attn_metadata *meta, const attn_tensor *indices,
                                              const char *fn) {
    const attn_batch *b = &meta->batch;
    const attn_tensor ix = attn__tensor_resolved(indices);
    const int topk = (int)ix.shape[1];
    int t, k;
    for (t = 0; t < b->num_actual_tokens; t++) {
        const int r = attn__token_request(b, t), sl = b->seq_lens[r];
        const int32_t *row = (const int32_t *)ix.data + (size_t)t * (size_t)ix.strides[0];
        for (k = 0; k < topk; k++)
            if (row[k] < -1 || row[k] >= sl)
                return attn__fail(meta->layer->ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                                  "%s: indices[%d][%d] is %d (allowed: -1 = padding, or a position 0..%d of token "
                                  "%d's request %d, seq_len %d); nothing was written", fn, t, k, (int)row[k], sl - 1,
                                  t, r, sl);
    }
    return ATTN_OK;
}
static attn_status attn__check_graph(attn_layer *layer, const attn_metadata *meta, const char *fn, void *stream,
                                     int part);

static attn_status attn__check_kv_cache(attn_layer *layer, const char *fn, const attn_tensor *kv,
                                        int64_t expect_blocks) {
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = layer->backend->kv_cache_shape(layer->backend, &layer->desc,
                                              expect_blocks > 0 ? expect_blocks : 1, shape);
    attn_status st;
    if (expect_blocks <= 0) shape[0] = ATTN__AT_LEAST(1);
    st = attn__check_tensor(layer->ctx, fn, "kv_cache", kv, layer->desc.kv_cache_dtype, ndim, shape,
                            layer->backend->device);
    if (st != ATTN_OK) return st;
    if (kv->shape[0] < 1 || kv->shape[0] > ATTN__MAX_BLOCKS)
        return attn__fail(layer->ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                          "%s: kv_cache.shape[0] is %lld (allowed: 1..%lld blocks)", fn,
                          (long long)kv->shape[0], (long long)ATTN__MAX_BLOCKS);
    if (!attn__tensor_is_contiguous(kv))
        return attn__fail(layer->ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_LAYOUT,
                          "%s: kv_cache is not contiguous (allowed: the dense layout of "
                          "attn_layer_kv_cache_shape)", fn);
    return ATTN_OK;
}

/* Every slot of a cache write: -1 (skip) or a slot of the given cache. */
static attn_status attn__check_slots(attn_layer *layer, const char *fn, const attn_tensor *kv_cache,
                                     const int64_t *slots, int num_tokens) {
    int64_t num_slots = kv_cache->shape[0] * (int64_t)layer->desc.block_size;
    int t;
    for (t = 0; t < num_tokens; t++)
        if (slots[t] < -1 || slots[t] >= num_slots)
            return attn__fail(layer->ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_SLOT,
                              "%s: slot_mapping[%d] is %lld (allowed: -1 = skip, or 0..%lld = "
                              "num_blocks * block_size - 1)", fn, t, (long long)slots[t],
                              (long long)num_slots - 1);
    return ATTN_OK;
}

/* A cache write's slot mapping: int64 [num_tokens] (0 <= num_tokens < 2^31), contiguous,
   on the host or on the layer's device. Host slots are checked here (all of them, before
   anything is written); *num_tokens gets the count. */
static attn_status attn__check_slot_tensor(attn_layer *layer, const char *fn, const attn_tensor *slots,
                                           const attn_tensor *kv_cache, int *num_tokens) {
    attn_context *ctx = layer->ctx;
    attn_device_kind dev = layer->backend->device;
    int64_t shape[1];
    attn_status st;
    if (slots->ndim != 1 || slots->shape[0] < 0 || slots->shape[0] > INT32_MAX)
        return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                          "%s: slot_mapping has %d dimensions, shape[0] %lld (allowed: 1 dimension, "
                          "[num_tokens], 0 <= num_tokens < 2^31)", fn, slots->ndim,
                          (long long)(slots->ndim > 0 ? slots->shape[0] : -1));
    shape[0] = slots->shape[0];
    /* the layer's device, or the host (the library reads it: CPU layers always do) */
    st = attn__check_tensor(ctx, fn, "slot_mapping", slots, ATTN_DTYPE_INT64, 1, shape,
                            slots->device.kind == ATTN_DEVICE_CPU ? ATTN_DEVICE_CPU : dev);
    if (st != ATTN_OK) return st;
    *num_tokens = (int)slots->shape[0];
    if (slots->device.kind != ATTN_DEVICE_CPU) return ATTN_OK; /* the device checks them */
    return attn__check_slots(layer, fn, kv_cache, (const int64_t *)slots->data, *num_tokens);
}

/* Validates key/value/cache for a write of num_tokens rows; slots: host slots to check, or
   NULL (device slots, or checked already). */
static attn_status attn__check_kv_write(attn_layer *layer, const char *fn, const attn_tensor *key,
                                        const attn_tensor *value, const attn_tensor *kv_cache,
                                        const int64_t *slots, int num_tokens) {
    const attn_layer_desc *d = &layer->desc;
    attn_device_kind dev = layer->backend->device;
    int64_t shape[3];
    attn_status st;
    shape[0] = ATTN__AT_LEAST(num_tokens); shape[1] = d->num_kv_heads; shape[2] = d->head_size;
    st = attn__check_tensor(layer->ctx, fn, "key", key, d->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_tensor(layer->ctx, fn, "value", value, d->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_kv_cache(layer, fn, kv_cache, 0);
    if (st != ATTN_OK || !slots) return st;
    return attn__check_slots(layer, fn, kv_cache, slots, num_tokens);
}

ATTN_API attn_status attn_reshape_and_cache(attn_layer *layer, const attn_tensor *key,
                                            const attn_tensor *value, attn_tensor *kv_cache,
                                            const attn_tensor *slot_mapping, void *stream) {
    attn_context *ctx = layer ? layer->ctx : NULL;
    const char *fn = "attn_reshape_and_cache";
    attn_status st;
    int num_tokens = 0;
    if (!layer) return attn__null_arg(ctx, __func__, "layer");
    if (!key) return attn__null_arg(ctx, __func__, "key");
    if (!value) return attn__null_arg(ctx, __func__, "value");
    if (!kv_cache) return attn__null_arg(ctx, __func__, "kv_cache");
    if (!slot_mapping) return attn__null_arg(ctx, __func__, "slot_mapping");
    if (layer->desc.use_mla)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the layer is MLA (its cache holds latents; use the MLA cache write)", fn);
    st = attn__check_kv_write(layer, fn, key, value, kv_cache, NULL, 0);
    if (st == ATTN_OK) st = attn__check_slot_tensor(layer, fn, slot_mapping, kv_cache, &num_tokens);
    if (st == ATTN_OK) st = attn__check_kv_write(layer, fn, key, value, kv_cache, NULL, num_tokens);
    if (st == ATTN_OK) st = attn__check_graph(layer, NULL, fn, stream, ATTN__PART_WRITE);
    if (st != ATTN_OK) return st;
    return layer->backend->reshape_and_cache(layer->backend, layer, key, value, kv_cache, slot_mapping, stream);
}

/* Validates kv_c/k_pe/cache for a latent write of num_tokens rows; slots: host slots to
   check, or NULL (device slots, or checked already). */
static attn_status attn__check_latent_write(attn_layer *layer, const char *fn, const attn_tensor *kv_c,
                                            const attn_tensor *k_pe, const attn_tensor *kv_cache,
                                            const int64_t *slots, int num_tokens) {
    const attn_layer_desc *d = &layer->desc;
    int64_t shape[2];
    attn_status st;
    shape[0] = ATTN__AT_LEAST(num_tokens); shape[1] = d->kv_lora_rank;
    st = attn__check_tensor(layer->ctx, fn, "kv_c", kv_c, d->dtype, 2, shape, layer->backend->device);
    shape[1] = d->qk_rope_head_dim;
    if (st == ATTN_OK) st = attn__check_tensor(layer->ctx, fn, "k_pe", k_pe, d->dtype, 2, shape, layer->backend->device);
    if (st == ATTN_OK) st = attn__check_kv_cache(layer, fn, kv_cache, 0);
    if (st != ATTN_OK || !slots) return st;
    return attn__check_slots(layer, fn, kv_cache, slots, num_tokens);
}

ATTN_API attn_status attn_concat_and_cache_mla(attn_layer *layer, const attn_tensor *kv_c,
                                               const attn_tensor *k_pe, attn_tensor *kv_cache,
                                               const attn_tensor *slot_mapping, void *stream) {
    attn_context *ctx = layer ? layer->ctx : NULL;
    const char *fn = "attn_concat_and_cache_mla";
    attn_status st;
    int num_tokens = 0;
    if (!layer) return attn__null_arg(ctx, __func__, "layer");
    if (!kv_c) return attn__null_arg(ctx, __func__, "kv_c");
    if (!k_pe) return attn__null_arg(ctx, __func__, "k_pe");
    if (!kv_cache) return attn__null_arg(ctx, __func__, "kv_cache");
    if (!slot_mapping) return attn__null_arg(ctx, __func__, "slot_mapping");
    if (!layer->desc.use_mla)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the layer is not MLA (allowed: use_mla = 1; standard layers use "
                          "attn_reshape_and_cache)", fn);
    st = attn__check_latent_write(layer, fn, kv_c, k_pe, kv_cache, NULL, 0);
    if (st == ATTN_OK) st = attn__check_slot_tensor(layer, fn, slot_mapping, kv_cache, &num_tokens);
    if (st == ATTN_OK) st = attn__check_latent_write(layer, fn, kv_c, k_pe, kv_cache, NULL, num_tokens);
    if (st == ATTN_OK) st = attn__check_graph(layer, NULL, fn, stream, ATTN__PART_WRITE);
    if (st != ATTN_OK) return st;
    return layer->backend->concat_and_cache_mla(layer->backend, layer, kv_c, k_pe, kv_cache, slot_mapping, stream);
}

/* =======================================================================================
   >>cpu
   The portable C backend (CPU). Work is split into tasks of (request, KV heads, query
   tile[, key split]); a task loads all query heads of its KV-head group, so each K/V row is
   read once per group. Inner loops run on f32 tiles through a small vector layer: AVX-512,
   AVX2+FMA+F16C, or plain C. The MLA backend (>>cpu_mla) runs on the same kernels and runner.
   ======================================================================================= */

/* ---- SIMD layer and row conversions ------------------------------------------------------ */

#define ATTN__CPU_NT 64        /* keys per tile */
#define ATTN__CPU_ROWS 64      /* target query rows (tokens x group heads) per task */
#define ATTN__CPU_SPLIT_MIN 512 /* fewest keys worth a split of their own */
#define ATTN__CPU_CASCADE_ROWS 256 /* query rows (tokens x group heads) of a shared-prefix task */
#define ATTN__CPU_MAX_SPLITS 16

/* ATTN_CPU_BF16_DOT (define it before the implementation; off by default): decode QK on
   bf16 caches with AVX512-BF16 vdpbf16ps, two products per f32 lane, where the CPU has it
   (Zen 4/5, Cooper Lake, Sapphire Rapids and later) and the build targets it
   (-mavx512bf16 / -march=native). q is rounded to bf16 (RNE) first, so scores move by
   about 2^-9 of |q|.|k|: an opt-in, not the default. A compile-time switch: it is a build
   property like the SIMD level, and the default build stays bitwise what it was. */
#if defined(ATTN_CPU_BF16_DOT) && defined(__AVX512F__) && defined(__AVX512BF16__) && !defined(ATTN_NO_SIMD)
#define ATTN__CPU_BF16_DOT_ON 1
#else
#define ATTN__CPU_BF16_DOT_ON 0
#endif

#if defined(ATTN__SIMD_AVX512)
#define ATTN__W 16
#define ATTN__QK_RB 4
typedef __m512 attn__vf;
ATTN__INLINE attn__vf attn__vld(const float *p) { return _mm512_loadu_ps(p); }
ATTN__INLINE void attn__vst(float *p, attn__vf v) { _mm512_storeu_ps(p, v); }
ATTN__INLINE attn__vf attn__vset1(float x) { return _mm512_set1_ps(x); }
ATTN__INLINE attn__vf attn__vzero(void) { return _mm512_setzero_ps(); }
ATTN__INLINE attn__vf attn__vfma(attn__vf a, attn__vf b, attn__vf c) { return _mm512_fmadd_ps(a, b, c); }
ATTN__INLINE attn__vf attn__vmul(attn__vf a, attn__vf b) { return _mm512_mul_ps(a, b); }
ATTN__INLINE attn__vf attn__vadd(attn__vf a, attn__vf b) { return _mm512_add_ps(a, b); }
ATTN__INLINE attn__vf attn__vsub(attn__vf a, attn__vf b) { return _mm512_sub_ps(a, b); }
ATTN__INLINE attn__vf attn__vmax(attn__vf a, attn__vf b) { return _mm512_max_ps(a, b); }
ATTN__INLINE float attn__vhadd(attn__vf v) { return _mm512_reduce_add_ps(v); }
ATTN__INLINE float attn__vhmax(attn__vf v) { return _mm512_reduce_max_ps(v); }
ATTN__INLINE attn__vf attn__vround(attn__vf v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
ATTN__INLINE attn__vf attn__vpow2i(attn__vf n) { /* 2^n for integral n in [-127, 127] */
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
ATTN__INLINE attn__vf attn__vclamp(attn__vf v, float lo, float hi) {
    return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
}
/* 16 accumulators acc[r*4+k] (4 rows x 4 keys) -> their sums, row r to S + r*ld. */
ATTN__INLINE void attn__hsum_block_store(const attn__vf *v, float *S, int ld) {
    __m512 t[8], u[4], w0, w1, x;
    int i;
    for (i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    x = _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm_storeu_ps(S, _mm512_extractf32x4_ps(x, 0));
    _mm_storeu_ps(S + ld, _mm512_extractf32x4_ps(x, 1));
    _mm_storeu_ps(S + 2 * ld, _mm512_extractf32x4_ps(x, 2));
    _mm_storeu_ps(S + 3 * ld, _mm512_extractf32x4_ps(x, 3));
}
ATTN__INLINE attn__vf attn__vld_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
ATTN__INLINE attn__vf attn__vld_bf16(const uint16_t *p) {
    __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
ATTN__INLINE void attn__vst_f16(uint16_t *p, attn__vf v) { /* round to nearest even */
    _mm256_storeu_si256((__m256i *)(void *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
/* 16 fp8 codes -> f32, exactly (attn_fp8_e4m3_to_f32 / attn_fp8_e5m2_to_f32). e4m3: its
   7 magnitude bits at f16 bit 7 (f16's exponent field holds e4m3's, bias 15 for 7; its
   subnormals are f16 subnormals), converted by vcvtph2ps and scaled by 2^8, both exact;
   0x7f/0xff -> NaN. e5m2 is the high byte of an f16. */
ATTN__INLINE attn__vf attn__vld_e4m3(const uint8_t *p) {
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m256i w = _mm256_cvtepu8_epi16(b);
    __m256i h = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(0x3f80)),
                                _mm256_and_si256(_mm256_slli_epi16(w, 8), _mm256_set1_epi16((short)0x8000)));
    __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(0x7f)),
                                            _mm512_set1_epi32(0x7f));
    return _mm512_mask_blend_ps(nan, v, _mm512_set1_ps(NAN));
}
ATTN__INLINE attn__vf attn__vld_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)));
}
ATTN__INLINE attn__vf attn__vld_e5m2(const uint8_t *p) {
    __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p)), 8);
    return _mm512_cvtph_ps(h);
}

#elif defined(ATTN__SIMD_AVX2)
#define ATTN__W 8
#define ATTN__QK_RB 2
typedef __m256 attn__vf;
ATTN__INLINE attn__vf attn__vld(const float *p) { return _mm256_loadu_ps(p); }
ATTN__INLINE void attn__vst(float *p, attn__vf v) { _mm256_storeu_ps(p, v); }
ATTN__INLINE attn__vf attn__vset1(float x) { return _mm256_set1_ps(x); }
ATTN__INLINE attn__vf attn__vzero(void) { return _mm256_setzero_ps(); }
ATTN__INLINE attn__vf attn__vfma(attn__vf a, attn__vf b, attn__vf c) { return _mm256_fmadd_ps(a, b, c); }
ATTN__INLINE attn__vf attn__vmul(attn__vf a, attn__vf b) { return _mm256_mul_ps(a, b); }
ATTN__INLINE attn__vf attn__vadd(attn__vf a, attn__vf b) { return _mm256_add_ps(a, b); }
ATTN__INLINE attn__vf attn__vsub(attn__vf a, attn__vf b) { return _mm256_sub_ps(a, b); }
ATTN__INLINE attn__vf attn__vmax(attn__vf a, attn__vf b) { return _mm256_max_ps(a, b); }
ATTN__INLINE float attn__vhadd(attn__vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
ATTN__INLINE float attn__vhmax(attn__vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
ATTN__INLINE attn__vf attn__vround(attn__vf v) {
    return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
ATTN__INLINE attn__vf attn__vpow2i(attn__vf n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
ATTN__INLINE attn__vf attn__vclamp(attn__vf v, float lo, float hi) {
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
}
/* 8 accumulators acc[r*4+k] (2 rows x 4 keys) -> their sums, row r to S + r*ld. */
ATTN__INLINE void attn__hsum_block_store(const attn__vf *v, float *S, int ld) {
    __m256 t[4], u0, u1, x;
    int i;
    for (i = 0; i < 4; i++)
        t[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    u0 = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
    u1 = _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(3, 2, 3, 2)));
    x = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm_storeu_ps(S, _mm256_castps256_ps128(x));
    _mm_storeu_ps(S + ld, _mm256_extractf128_ps(x, 1));
}
ATTN__INLINE attn__vf attn__vld_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
ATTN__INLINE attn__vf attn__vld_bf16(const uint16_t *p) {
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}
ATTN__INLINE void attn__vst_f16(uint16_t *p, attn__vf v) {
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
/* 8 fp8 codes -> f32, exactly (see the AVX-512 versions) */
ATTN__INLINE attn__vf attn__vld_e4m3(const uint8_t *p) {
    __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)p));
    __m128i h = _mm_or_si128(_mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(0x3f80)),
                             _mm_and_si128(_mm_slli_epi16(w, 8), _mm_set1_epi16((short)0x8000)));
    __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7f));
    return _mm256_blendv_ps(v, _mm256_set1_ps(NAN), _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan)));
}
ATTN__INLINE attn__vf attn__vld_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)));
}
ATTN__INLINE attn__vf attn__vld_e5m2(const uint8_t *p) {
    __m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)p)), 8);
    return _mm256_cvtph_ps(h);
}

#else /* plain C: fixed-width lanes the compiler may vectorise */
#define ATTN__W 8
#define ATTN__QK_RB 2
typedef struct attn__vf { float v[ATTN__W]; } attn__vf;
ATTN__INLINE attn__vf attn__vld(const float *p) { attn__vf r; memcpy(r.v, p, sizeof r.v); return r; }
ATTN__INLINE void attn__vst(float *p, attn__vf v) { memcpy(p, v.v, sizeof v.v); }
ATTN__INLINE attn__vf attn__vset1(float x) { attn__vf r; int i; for (i = 0; i < ATTN__W; i++) r.v[i] = x; return r; }
ATTN__INLINE attn__vf attn__vzero(void) { return attn__vset1(0.0f); }
ATTN__INLINE attn__vf attn__vfma(attn__vf a, attn__vf b, attn__vf c) {
    int i; for (i = 0; i < ATTN__W; i++) c.v[i] += a.v[i] * b.v[i]; return c;
}
ATTN__INLINE attn__vf attn__vmul(attn__vf a, attn__vf b) { int i; for (i = 0; i < ATTN__W; i++) a.v[i] *= b.v[i]; return a; }
ATTN__INLINE attn__vf attn__vadd(attn__vf a, attn__vf b) { int i; for (i = 0; i < ATTN__W; i++) a.v[i] += b.v[i]; return a; }
ATTN__INLINE attn__vf attn__vsub(attn__vf a, attn__vf b) { int i; for (i = 0; i < ATTN__W; i++) a.v[i] -= b.v[i]; return a; }
ATTN__INLINE attn__vf attn__vmax(attn__vf a, attn__vf b) {
    int i; for (i = 0; i < ATTN__W; i++) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return a;
}
ATTN__INLINE float attn__vhadd(attn__vf v) {
    float s[4]; int i;
    for (i = 0; i < 4; i++) s[i] = v.v[i] + v.v[i + 4];
    return (s[0] + s[2]) + (s[1] + s[3]);
}
ATTN__INLINE float attn__vhmax(attn__vf v) {
    float m = v.v[0]; int i; for (i = 1; i < ATTN__W; i++) m = v.v[i] > m ? v.v[i] : m; return m;
}
ATTN__INLINE attn__vf attn__vround(attn__vf v) { int i; for (i = 0; i < ATTN__W; i++) v.v[i] = nearbyintf(v.v[i]); return v; }
ATTN__INLINE attn__vf attn__vpow2i(attn__vf n) {
    int i;
    for (i = 0; i < ATTN__W; i++) {
        int e = (int)n.v[i] + 127;
        n.v[i] = attn__bits_f32((uint32_t)e << 23);
    }
    return n;
}
ATTN__INLINE attn__vf attn__vclamp(attn__vf v, float lo, float hi) {
    int i;
    for (i = 0; i < ATTN__W; i++) v.v[i] = v.v[i] < lo ? lo : (v.v[i] > hi ? hi : v.v[i]);
    return v;
}
ATTN__INLINE void attn__hsum_block_store(const attn__vf *v, float *S, int ld) {
    int r, k;
    for (r = 0; r < ATTN__QK_RB; r++)
        for (k = 0; k < 4; k++) S[r * ld + k] = attn__vhadd(v[r * 4 + k]);
}
ATTN__INLINE attn__vf attn__vld_f16(const uint16_t *p) {
    attn__vf r; int i; for (i = 0; i < ATTN__W; i++) r.v[i] = attn_f16_to_f32(p[i]); return r;
}
ATTN__INLINE attn__vf attn__vld_bf16(const uint16_t *p) {
    attn__vf r; int i; for (i = 0; i < ATTN__W; i++) r.v[i] = attn_bf16_to_f32(p[i]); return r;
}
ATTN__INLINE void attn__vst_f16(uint16_t *p, attn__vf v) {
    int i; for (i = 0; i < ATTN__W; i++) p[i] = attn_f32_to_f16(v.v[i]);
}
ATTN__INLINE attn__vf attn__vld_e4m3(const uint8_t *p) {
    attn__vf r; int i; for (i = 0; i < ATTN__W; i++) r.v[i] = attn_fp8_e4m3_to_f32(p[i]); return r;
}
ATTN__INLINE attn__vf attn__vld_e5m2(const uint8_t *p) {
    attn__vf r; int i; for (i = 0; i < ATTN__W; i++) r.v[i] = attn_fp8_e5m2_to_f32(p[i]); return r;
}
ATTN__INLINE attn__vf attn__vld_i8(const int8_t *p) {
    attn__vf r; int i; for (i = 0; i < ATTN__W; i++) r.v[i] = (float)p[i]; return r;
}
#endif

/* Pins a vector to a register: compilers otherwise fold a load used by several FMAs into
   each of them as a memory operand, loading it again per use (the QK kernels then issue
   more loads than FMAs and are load-bound). */
#if (defined(ATTN__SIMD_AVX512) || defined(ATTN__SIMD_AVX2)) && (defined(__GNUC__) || defined(__clang__))
#define ATTN__VKEEP(v) __asm__("" : "+v"(v))
#else
#define ATTN__VKEEP(v) ((void)0)
#endif

/* Rows of n elements of a storage type into f32, W at a time, scalar tails: the dtype
   table's load_row for f16, bf16 and the 8-bit cache types. */
#define ATTN__ROW_TO_F32(name, T, vload, one)                                  \
    static void name(const void *src, float *d, int n) {                      \
        const T *s = (const T *)src;                                           \
        int i = 0;                                                             \
        for (; i + ATTN__W <= n; i += ATTN__W) attn__vst(d + i, vload(s + i)); \
        for (; i < n; i++) d[i] = one(s[i]);                                   \
    }
#define ATTN__I8_TO_F32(x) ((float)(x))
ATTN__ROW_TO_F32(attn__f16_row, uint16_t, attn__vld_f16, attn_f16_to_f32)
ATTN__ROW_TO_F32(attn__bf16_row, uint16_t, attn__vld_bf16, attn_bf16_to_f32)
ATTN__ROW_TO_F32(attn__e4m3_row, uint8_t, attn__vld_e4m3, attn_fp8_e4m3_to_f32)
ATTN__ROW_TO_F32(attn__e5m2_row, uint8_t, attn__vld_e5m2, attn_fp8_e5m2_to_f32)
ATTN__ROW_TO_F32(attn__i8_row, int8_t, attn__vld_i8, ATTN__I8_TO_F32)
#undef ATTN__ROW_TO_F32
#undef ATTN__I8_TO_F32
static void attn__row_to_f16(const float *s, void *dst, int n) {
    uint16_t *d = (uint16_t *)dst;
    int i = 0;
    for (; i + ATTN__W <= n; i += ATTN__W) attn__vst_f16(d + i, attn__vld(s + i));
    for (; i < n; i++) d[i] = attn_f32_to_f16(s[i]);
}
static void attn__row_to_bf16(const float *s, void *dst, int n) {
    uint16_t *d = (uint16_t *)dst;
    int i;
    for (i = 0; i < n; i++) d[i] = attn_f32_to_bf16(s[i]);
}

/* 2^x with |relative error| < 2e-7; x <= -127 gives exactly 0 (masked scores). */
ATTN__INLINE attn__vf attn__vexp2(attn__vf x) {
    attn__vf n, f, p;
    x = attn__vclamp(x, -127.0f, 127.0f);
    n = attn__vround(x);
    f = attn__vsub(x, n);
    p = attn__vset1(1.5252734e-05f);
    p = attn__vfma(p, f, attn__vset1(1.5403530e-04f));
    p = attn__vfma(p, f, attn__vset1(1.3333558e-03f));
    p = attn__vfma(p, f, attn__vset1(9.6181291e-03f));
    p = attn__vfma(p, f, attn__vset1(5.5504109e-02f));
    p = attn__vfma(p, f, attn__vset1(2.4022651e-01f));
    p = attn__vfma(p, f, attn__vset1(6.9314718e-01f));
    p = attn__vfma(p, f, attn__vset1(1.0f));
    return attn__vmul(p, attn__vpow2i(n));
}

/* A row of n elements of type dt -> f32, zero-padded to npad (through the dtype table). */
static void attn__row_to_f32(const void *src, attn_dtype dt, float *dst, int n, int npad) {
    int i;
    ATTN_ASSERT(attn__dtype_valid(dt) && attn__dtypes[dt].load_row);
    attn__dtypes[dt].load_row(src, dst, n);
    for (i = n; i < npad; i++) dst[i] = 0.0f;
}

static void attn__row_from_f32(const float *src, attn_dtype dt, void *dst, int n) {
    ATTN_ASSERT(attn__dtype_valid(dt) && attn__dtypes[dt].store_row);
    attn__dtypes[dt].store_row(src, dst, n);
}

ATTN__INLINE float attn__dot(const float *a, const float *b, int dp) {
    attn__vf acc0 = attn__vzero(), acc1 = attn__vzero();
    int d = 0;
    for (; d + 2 * ATTN__W <= dp; d += 2 * ATTN__W) {
        acc0 = attn__vfma(attn__vld(a + d), attn__vld(b + d), acc0);
        acc1 = attn__vfma(attn__vld(a + d + ATTN__W), attn__vld(b + d + ATTN__W), acc1);
    }
    for (; d < dp; d += ATTN__W) acc0 = attn__vfma(attn__vld(a + d), attn__vld(b + d), acc0);
    return attn__vhadd(attn__vadd(acc0, acc1));
}

/* ---- kernels: QK and PV tiles, direct decode kernels, online softmax --------------------- */

/* Rows per cache block of the gather-path kernels: a chunk of Q (or O) rows stays in L1
   while the K (or V) tile streams past it once. */
#define ATTN__CPU_ROW_CHUNK 16

/* S[M][ld] = Q[M][dp] . K[n][dp]^T, with QK_RB rows x 4 keys per register block; keys
   outer within a chunk of rows, so each K quad is loaded from L2 once per chunk. */
static void attn__cpu_qk(const float *Q, int M, const float *K, int n, int dp, float *S, int ld) {
    int rc, r, j, d, rr, kk;
    for (rc = 0; rc < M; rc += ATTN__CPU_ROW_CHUNK) {
        int rend = ATTN__MIN(M, rc + ATTN__CPU_ROW_CHUNK);
        int rfull = rc + (rend - rc) / ATTN__QK_RB * ATTN__QK_RB;
        for (j = 0; j + 4 <= n; j += 4) {
            const float *k = K + (size_t)j * (size_t)dp;
            for (r = rc; r < rfull; r += ATTN__QK_RB) {
                const float *q = Q + (size_t)r * (size_t)dp;
                attn__vf acc[ATTN__QK_RB * 4];
                for (rr = 0; rr < ATTN__QK_RB * 4; rr++) acc[rr] = attn__vzero();
                for (d = 0; d < dp; d += ATTN__W) {
                    attn__vf kv[4];
                    for (kk = 0; kk < 4; kk++) kv[kk] = attn__vld(k + (size_t)kk * (size_t)dp + d);
                    for (rr = 0; rr < ATTN__QK_RB; rr++) {
                        attn__vf qv = attn__vld(q + (size_t)rr * (size_t)dp + d);
                        for (kk = 0; kk < 4; kk++) acc[rr * 4 + kk] = attn__vfma(qv, kv[kk], acc[rr * 4 + kk]);
                    }
                }
                attn__hsum_block_store(acc, S + (size_t)r * (size_t)ld + j, ld);
            }
            for (r = rfull; r < rend; r++)
                for (kk = 0; kk < 4; kk++)
                    S[(size_t)r * (size_t)ld + j + kk] = attn__dot(Q + (size_t)r * (size_t)dp, k + (size_t)kk * (size_t)dp, dp);
        }
        for (; j < n; j++)
            for (r = rc; r < rend; r++)
                S[(size_t)r * (size_t)ld + j] = attn__dot(Q + (size_t)r * (size_t)dp, K + (size_t)j * (size_t)dp, dp);
    }
}

/* O[r] = O[r] * alpha[r] + sum_j P[r][j] V[j], 4 rows x 2 vectors per register block.
   V rows are ldv apart; O rows dp apart (dp floats wide, a multiple of W). alpha == NULL:
   O starts from zero (a plain GEMM). Within a chunk of rows the V column slice is outer,
   so it stays in L1 for every row block of the chunk. */
static void attn__cpu_pv(const float *P, int ld, int M, const float *V, int ldv, int n, int dp,
                         float *O, const float *alpha) {
    int rc, r, d, j, rr;
    for (rc = 0; rc < M; rc += ATTN__CPU_ROW_CHUNK) {
        int rend = ATTN__MIN(M, rc + ATTN__CPU_ROW_CHUNK), rfull = rc + (rend - rc) / 4 * 4;
        for (d = 0; d < dp; d += 2 * ATTN__W) {
            int two = d + 2 * ATTN__W <= dp;
            for (r = rc; r < rfull; r += 4) {
                attn__vf a0[4], a1[4];
                for (rr = 0; rr < 4; rr++) {
                    float *o = O + (size_t)(r + rr) * (size_t)dp + d;
                    if (alpha) {
                        attn__vf al = attn__vset1(alpha[r + rr]);
                        a0[rr] = attn__vmul(attn__vld(o), al);
                        a1[rr] = two ? attn__vmul(attn__vld(o + ATTN__W), al) : attn__vzero();
                    } else {
                        a0[rr] = attn__vzero();
                        a1[rr] = attn__vzero();
                    }
                }
                if (two) {
                    for (j = 0; j < n; j++) {
                        attn__vf v0 = attn__vld(V + (size_t)j * (size_t)ldv + d);
                        attn__vf v1 = attn__vld(V + (size_t)j * (size_t)ldv + d + ATTN__W);
                        for (rr = 0; rr < 4; rr++) {
                            attn__vf p = attn__vset1(P[(size_t)(r + rr) * (size_t)ld + j]);
                            a0[rr] = attn__vfma(p, v0, a0[rr]);
                            a1[rr] = attn__vfma(p, v1, a1[rr]);
                        }
                    }
                } else {
                    for (j = 0; j < n; j++) {
                        attn__vf v0 = attn__vld(V + (size_t)j * (size_t)ldv + d);
                        for (rr = 0; rr < 4; rr++)
                            a0[rr] = attn__vfma(attn__vset1(P[(size_t)(r + rr) * (size_t)ld + j]), v0, a0[rr]);
                    }
                }
                for (rr = 0; rr < 4; rr++) {
                    attn__vst(O + (size_t)(r + rr) * (size_t)dp + d, a0[rr]);
                    if (two) attn__vst(O + (size_t)(r + rr) * (size_t)dp + d + ATTN__W, a1[rr]);
                }
            }
            for (r = rfull; r < rend; r++) {
                int c;
                for (c = d; c < ATTN__MIN(dp, d + 2 * ATTN__W); c += ATTN__W) {
                    attn__vf a = alpha ? attn__vmul(attn__vld(O + (size_t)r * (size_t)dp + c), attn__vset1(alpha[r]))
                                       : attn__vzero();
                    for (j = 0; j < n; j++)
                        a = attn__vfma(attn__vset1(P[(size_t)r * (size_t)ld + j]), attn__vld(V + (size_t)j * (size_t)ldv + c), a);
                    attn__vst(O + (size_t)r * (size_t)dp + c, a);
                }
            }
        }
    }
}

/* How far ahead the decode kernels ask for K (keys) and V (rows) while they compute: the
   only requests for a task's first tile, later a second one for rows the pipeline below
   asked for (measured: it helps when that one is late or dropped). Hint 2 is T1, which
   Intel and Zen 4/5 fill into L2, not L1. */
#ifndef ATTN__QKPF
#define ATTN__QKPF 4
#endif
#ifndef ATTN__PVPF
#define ATTN__PVPF 8
#endif
#ifndef ATTN__PF_HINT
#define ATTN__PF_HINT 2
#endif

/* Asks for a K/V row ahead of use: rows of one head are strided across the page, which
   the hardware prefetchers do not follow. */
ATTN__INLINE void attn__cpu_prefetch_row(const char *p, size_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
    size_t o;
    for (o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, ATTN__PF_HINT);
#else
    (void)p; (void)bytes;
#endif
}

/* Rows of the cache to request while a kernel computes on other rows: the QK kernel asks
   for the tile's V rows, the PV kernel for the next tile's K rows, a few lines per step,
   so every row is in L2 about half a tile before it is read. K goes in whole rows (QK
   takes a quad of keys across all heads); V head by head as PV reads it where a head's
   slice is 512 bytes or more (f32 at head 128: measured 4-7% faster), else in whole rows
   (f16: address order measured 10% faster than 256-byte slices). */
typedef struct attn__cpu_pf {
    const char *const *rows; /* row starts */
    int num_rows, num_cols;  /* rows, and slices per row (heads for V, 1 for K) */
    size_t col_bytes;        /* bytes of a slice */
    int row, col;            /* cursor: slice col of row, byte off within it */
    size_t off;
    int lines_per_step;
} attn__cpu_pf;

static void attn__cpu_pf_init(attn__cpu_pf *pf, const char *const *rows, int num_rows, int num_cols,
                              size_t col_bytes, int steps) {
    size_t lines = (col_bytes + 63) / 64 * (size_t)num_rows * (size_t)num_cols;
    pf->rows = rows;
    pf->num_rows = num_rows;
    pf->num_cols = num_cols;
    pf->col_bytes = col_bytes;
    pf->row = pf->col = 0;
    pf->off = 0;
    pf->lines_per_step = steps > 0 ? (int)((lines + (size_t)steps - 1) / (size_t)steps) : 0;
}

ATTN__INLINE void attn__cpu_pf_step(attn__cpu_pf *pf) {
#if defined(__GNUC__) || defined(__clang__)
    int k = pf->lines_per_step, row = pf->row, col = pf->col, i; /* locals: pf may alias */
    size_t off = pf->off, bytes = pf->col_bytes;
    if (pf->num_rows <= 0) return;
    while (k > 0 && col < pf->num_cols) {
        const char *p = pf->rows[row] + (size_t)col * bytes + off;
        int now = (int)ATTN__MIN((size_t)k, (bytes - off + 63) / 64);
        for (i = 0; i < now; i++) __builtin_prefetch(p + 64 * i, 0, ATTN__PF_HINT);
        k -= now;
        off += (size_t)now * 64;
        if (off >= bytes) {
            off = 0;
            if (++row == pf->num_rows) { row = 0; col++; }
        }
    }
    pf->row = row;
    pf->col = col;
    pf->off = off;
#else
    (void)pf;
#endif
}

/* One vector of a K/V row straight from the cache, converted to f32 in registers. dt is a
   compile-time constant in every instantiation, so the switch folds away. */
ATTN__INLINE attn__vf attn__vload_kv(const char *p, attn_dtype dt) {
    switch (dt) {
    case ATTN_DTYPE_F32: return attn__vld((const float *)(const void *)p);
    case ATTN_DTYPE_F16: return attn__vld_f16((const uint16_t *)(const void *)p);
    case ATTN_DTYPE_BF16: return attn__vld_bf16((const uint16_t *)(const void *)p);
    case ATTN_DTYPE_FP8_E4M3: return attn__vld_e4m3((const uint8_t *)(const void *)p);
    case ATTN_DTYPE_FP8_E5M2: return attn__vld_e5m2((const uint8_t *)(const void *)p);
    case ATTN_DTYPE_INT8: return attn__vld_i8((const int8_t *)(const void *)p);
    case ATTN_DTYPE_AUTO: case ATTN_DTYPE_INT64: case ATTN_DTYPE_INT32: case ATTN_DTYPE_FP8_DS_MLA: case ATTN_DTYPE_COUNT: break;
    }
    ATTN_ASSERT(0);
    return attn__vzero();
}

/* The decode-shaped kernels: few query rows per KV head, so every K/V element is used
   once per row block and is read from the cache directly (row pointers, converted in
   registers; no gather copy). D is a multiple of W. The QK loop takes a quad of keys and
   then every head of the task, so it reads whole token rows front to back. */
ATTN__INLINE void attn__cpu_qk_direct_dt(const float *Q, int per_head, int nheads, const char *const *kp,
                                  size_t head_bytes, int n, int D, int dq, float *S, int ld,
                                  attn__cpu_pf *pf, attn_dtype dt) {
    size_t esz = attn__dtypes[dt].size; /* a constant: dt is one */
    int r, j, d, rr, kk, h;
    for (j = 0; j + 4 <= n; j += 4)
        for (h = 0; h < nheads; h++) {
            const char *k0 = kp[j] + h * head_bytes, *k1 = kp[j + 1] + h * head_bytes;
            const char *k2 = kp[j + 2] + h * head_bytes, *k3 = kp[j + 3] + h * head_bytes;
            int rend = (h + 1) * per_head;
            attn__cpu_pf_step(pf);
            if (j + ATTN__QKPF + 4 <= n) { /* this head's slice of a later quad's rows */
                int q2;
                for (q2 = ATTN__QKPF; q2 < ATTN__QKPF + 4; q2++) attn__cpu_prefetch_row(kp[j + q2] + h * head_bytes, head_bytes);
            }
            for (r = h * per_head; r + ATTN__QK_RB <= rend; r += ATTN__QK_RB) {
                const float *q = Q + (size_t)r * (size_t)dq;
                attn__vf acc[ATTN__QK_RB * 4];
                for (rr = 0; rr < ATTN__QK_RB * 4; rr++) acc[rr] = attn__vzero();
                for (d = 0; d < D; d += ATTN__W) {
                    attn__vf kv[4];
                    kv[0] = attn__vload_kv(k0 + (size_t)d * esz, dt);
                    kv[1] = attn__vload_kv(k1 + (size_t)d * esz, dt);
                    kv[2] = attn__vload_kv(k2 + (size_t)d * esz, dt);
                    kv[3] = attn__vload_kv(k3 + (size_t)d * esz, dt);
                    for (rr = 0; rr < ATTN__QK_RB; rr++) {
                        attn__vf qv = attn__vld(q + (size_t)rr * (size_t)dq + d);
                        ATTN__VKEEP(qv);
                        for (kk = 0; kk < 4; kk++) acc[rr * 4 + kk] = attn__vfma(qv, kv[kk], acc[rr * 4 + kk]);
                    }
                }
                attn__hsum_block_store(acc, S + (size_t)r * (size_t)ld + j, ld);
            }
            for (; r < rend; r++)
                for (kk = 0; kk < 4; kk++) {
                    attn__vf acc = attn__vzero();
                    const char *kr = kk == 0 ? k0 : kk == 1 ? k1 : kk == 2 ? k2 : k3;
                    for (d = 0; d < D; d += ATTN__W)
                        acc = attn__vfma(attn__vld(Q + (size_t)r * (size_t)dq + d), attn__vload_kv(kr + (size_t)d * esz, dt), acc);
                    S[(size_t)r * (size_t)ld + j + kk] = attn__vhadd(acc);
                }
        }
    for (; j < n; j++)
        for (r = 0; r < per_head * nheads; r++) {
            const char *kr = kp[j] + (size_t)(r / per_head) * head_bytes;
            attn__vf acc = attn__vzero();
            for (d = 0; d < D; d += ATTN__W)
                acc = attn__vfma(attn__vld(Q + (size_t)r * (size_t)dq + d), attn__vload_kv(kr + (size_t)d * esz, dt), acc);
            S[(size_t)r * (size_t)ld + j] = attn__vhadd(acc);
        }
}

/* O[r] = O[r] * alpha[r] + sum_j P[r][j] V[j] for the rows of one head; 4 rows x 4 vectors
   per register block (16 independent FMA chains). */
ATTN__INLINE void attn__cpu_pv_direct_dt(const float *P, int ld, int M, const char *const *vp, size_t hoff,
                                  int n, int D, int dq, float *O, const float *alpha,
                                  attn__cpu_pf *pf, attn_dtype dt) {
    size_t esz = attn__dtypes[dt].size;
    int r = 0, d, j, rr, c;
    for (; r + 4 <= M; r += 4) {
        for (d = 0; d + 4 * ATTN__W <= D; d += 4 * ATTN__W) {
            attn__vf acc[4][4];
            for (rr = 0; rr < 4; rr++) {
                attn__vf al = attn__vset1(alpha[r + rr]);
                for (c = 0; c < 4; c++)
                    acc[rr][c] = attn__vmul(attn__vld(O + (size_t)(r + rr) * (size_t)dq + d + c * ATTN__W), al);
            }
            for (j = 0; j < n; j++) {
                const char *v = vp[j] + hoff + (size_t)d * esz;
                attn__vf v0, v1, v2, v3;
                if (d == 0) {
                    if (r == 0) attn__cpu_pf_step(pf);
                    if (j + ATTN__PVPF < n) attn__cpu_prefetch_row(vp[j + ATTN__PVPF] + hoff, (size_t)D * esz);
                }
                v0 = attn__vload_kv(v, dt); v1 = attn__vload_kv(v + ATTN__W * esz, dt);
                v2 = attn__vload_kv(v + 2 * ATTN__W * esz, dt); v3 = attn__vload_kv(v + 3 * ATTN__W * esz, dt);
                for (rr = 0; rr < 4; rr++) {
                    attn__vf p = attn__vset1(P[(size_t)(r + rr) * (size_t)ld + j]);
                    acc[rr][0] = attn__vfma(p, v0, acc[rr][0]);
                    acc[rr][1] = attn__vfma(p, v1, acc[rr][1]);
                    acc[rr][2] = attn__vfma(p, v2, acc[rr][2]);
                    acc[rr][3] = attn__vfma(p, v3, acc[rr][3]);
                }
            }
            for (rr = 0; rr < 4; rr++)
                for (c = 0; c < 4; c++) attn__vst(O + (size_t)(r + rr) * (size_t)dq + d + c * ATTN__W, acc[rr][c]);
        }
        for (; d < D; d += ATTN__W) {
            attn__vf a0[4];
            for (rr = 0; rr < 4; rr++)
                a0[rr] = attn__vmul(attn__vld(O + (size_t)(r + rr) * (size_t)dq + d), attn__vset1(alpha[r + rr]));
            for (j = 0; j < n; j++) {
                attn__vf v0 = attn__vload_kv(vp[j] + hoff + (size_t)d * esz, dt);
                for (rr = 0; rr < 4; rr++)
                    a0[rr] = attn__vfma(attn__vset1(P[(size_t)(r + rr) * (size_t)ld + j]), v0, a0[rr]);
            }
            for (rr = 0; rr < 4; rr++) attn__vst(O + (size_t)(r + rr) * (size_t)dq + d, a0[rr]);
        }
    }
    for (; r < M; r++)
        for (d = 0; d < D; d += ATTN__W) {
            attn__vf a = attn__vmul(attn__vld(O + (size_t)r * (size_t)dq + d), attn__vset1(alpha[r]));
            for (j = 0; j < n; j++) {
                if (r == 0 && d == 0) attn__cpu_pf_step(pf);
                a = attn__vfma(attn__vset1(P[(size_t)r * (size_t)ld + j]), attn__vload_kv(vp[j] + hoff + (size_t)d * esz, dt), a);
            }
            attn__vst(O + (size_t)r * (size_t)dq + d, a);
        }
}

/* One instantiation per cache dtype, so the conversion is fixed inside the loops. Not
   inlined into attn__cpu_task_run: the kernels' registers are then allocated on their own,
   and an edit elsewhere in that large function cannot spill them (one did: -6% decode). */
ATTN__NOINLINE static void attn__cpu_qk_direct(const float *Q, int per_head, int nheads, const char *const *kp,
                                size_t head_bytes, int n, int D, int dq, float *S, int ld,
                                attn__cpu_pf *pf, attn_dtype dt) {
    switch (dt) {
    case ATTN_DTYPE_F32: attn__cpu_qk_direct_dt(Q, per_head, nheads, kp, head_bytes, n, D, dq, S, ld, pf, ATTN_DTYPE_F32); return;
    case ATTN_DTYPE_F16: attn__cpu_qk_direct_dt(Q, per_head, nheads, kp, head_bytes, n, D, dq, S, ld, pf, ATTN_DTYPE_F16); return;
    case ATTN_DTYPE_BF16: attn__cpu_qk_direct_dt(Q, per_head, nheads, kp, head_bytes, n, D, dq, S, ld, pf, ATTN_DTYPE_BF16); return;
    case ATTN_DTYPE_FP8_E4M3: attn__cpu_qk_direct_dt(Q, per_head, nheads, kp, head_bytes, n, D, dq, S, ld, pf, ATTN_DTYPE_FP8_E4M3); return;
    case ATTN_DTYPE_FP8_E5M2: attn__cpu_qk_direct_dt(Q, per_head, nheads, kp, head_bytes, n, D, dq, S, ld, pf, ATTN_DTYPE_FP8_E5M2); return;
    case ATTN_DTYPE_INT8: attn__cpu_qk_direct_dt(Q, per_head, nheads, kp, head_bytes, n, D, dq, S, ld, pf, ATTN_DTYPE_INT8); return;
    case ATTN_DTYPE_AUTO: case ATTN_DTYPE_INT64: case ATTN_DTYPE_INT32: case ATTN_DTYPE_FP8_DS_MLA: case ATTN_DTYPE_COUNT: break;
    }
    ATTN_ASSERT(0);
}
#if ATTN__CPU_BF16_DOT_ON
/* q . k over D bf16 elements (D a multiple of 32), 32 per vdpbf16ps. */
ATTN__INLINE float attn__cpu_dot_bf16(const uint16_t *q, const char *k, int D) {
    __m512 acc = _mm512_setzero_ps();
    int d;
    for (d = 0; d < D; d += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512((const void *)(q + d)),
                               (__m512bh)_mm512_loadu_si512((const void *)(k + (size_t)d * 2)));
    return _mm512_reduce_add_ps(acc);
}

/* The QK of attn__cpu_qk_direct for bf16 caches under ATTN_CPU_BF16_DOT: Qb holds the
   task's q rows rounded to bf16 (dq elements apart), K is read raw, 32 elements per
   instruction; same order of keys and heads, same prefetches. */
ATTN__NOINLINE static void attn__cpu_qk_bf16dot(const uint16_t *Qb, int per_head, int nheads,
                                                const char *const *kp, size_t head_bytes, int n, int D,
                                                int dq, float *S, int ld, attn__cpu_pf *pf) {
    int r, j, d, rr, kk, h;
    for (j = 0; j + 4 <= n; j += 4)
        for (h = 0; h < nheads; h++) {
            const char *k[4];
            int rend = (h + 1) * per_head;
            for (kk = 0; kk < 4; kk++) k[kk] = kp[j + kk] + h * head_bytes;
            attn__cpu_pf_step(pf);
            if (j + ATTN__QKPF + 4 <= n) {
                int q2;
                for (q2 = ATTN__QKPF; q2 < ATTN__QKPF + 4; q2++) attn__cpu_prefetch_row(kp[j + q2] + h * head_bytes, head_bytes);
            }
            for (r = h * per_head; r + 4 <= rend; r += 4) {
                __m512 acc[16];
                for (rr = 0; rr < 16; rr++) acc[rr] = _mm512_setzero_ps();
                for (d = 0; d < D; d += 32) {
                    __m512bh kv[4];
                    for (kk = 0; kk < 4; kk++) kv[kk] = (__m512bh)_mm512_loadu_si512((const void *)(k[kk] + (size_t)d * 2));
                    for (rr = 0; rr < 4; rr++) {
                        __m512bh qv = (__m512bh)_mm512_loadu_si512((const void *)(Qb + (size_t)(r + rr) * (size_t)dq + d));
                        ATTN__VKEEP(qv);
                        for (kk = 0; kk < 4; kk++) acc[rr * 4 + kk] = _mm512_dpbf16_ps(acc[rr * 4 + kk], qv, kv[kk]);
                    }
                }
                attn__hsum_block_store(acc, S + (size_t)r * (size_t)ld + j, ld);
            }
            for (; r < rend; r++)
                for (kk = 0; kk < 4; kk++)
                    S[(size_t)r * (size_t)ld + j + kk] = attn__cpu_dot_bf16(Qb + (size_t)r * (size_t)dq, k[kk], D);
        }
    for (; j < n; j++)
        for (r = 0; r < per_head * nheads; r++)
            S[(size_t)r * (size_t)ld + j] = attn__cpu_dot_bf16(Qb + (size_t)r * (size_t)dq,
                                                              kp[j] + (size_t)(r / per_head) * head_bytes, D);
}

/* Q rows (f32, dq apart) -> bf16, round to nearest even; D a multiple of 32. */
static void attn__cpu_q_to_bf16(const float *Q, int rows, int D, int dq, uint16_t *Qb) {
    int i, d;
    for (i = 0; i < rows; i++)
        for (d = 0; d < D; d += 32) {
            const float *q = Q + (size_t)i * (size_t)dq + d;
            _mm512_storeu_si512((void *)(Qb + (size_t)i * (size_t)dq + d),
                                (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 16), _mm512_loadu_ps(q)));
        }
}
#endif

ATTN__NOINLINE static void attn__cpu_pv_direct(const float *P, int ld, int M, const char *const *vp, size_t hoff,
                                int n, int D, int dq, float *O, const float *alpha, attn__cpu_pf *pf,
                                attn_dtype dt) {
    switch (dt) {
    case ATTN_DTYPE_F32: attn__cpu_pv_direct_dt(P, ld, M, vp, hoff, n, D, dq, O, alpha, pf, ATTN_DTYPE_F32); return;
    case ATTN_DTYPE_F16: attn__cpu_pv_direct_dt(P, ld, M, vp, hoff, n, D, dq, O, alpha, pf, ATTN_DTYPE_F16); return;
    case ATTN_DTYPE_BF16: attn__cpu_pv_direct_dt(P, ld, M, vp, hoff, n, D, dq, O, alpha, pf, ATTN_DTYPE_BF16); return;
    case ATTN_DTYPE_FP8_E4M3: attn__cpu_pv_direct_dt(P, ld, M, vp, hoff, n, D, dq, O, alpha, pf, ATTN_DTYPE_FP8_E4M3); return;
    case ATTN_DTYPE_FP8_E5M2: attn__cpu_pv_direct_dt(P, ld, M, vp, hoff, n, D, dq, O, alpha, pf, ATTN_DTYPE_FP8_E5M2); return;
    case ATTN_DTYPE_INT8: attn__cpu_pv_direct_dt(P, ld, M, vp, hoff, n, D, dq, O, alpha, pf, ATTN_DTYPE_INT8); return;
    case ATTN_DTYPE_AUTO: case ATTN_DTYPE_INT64: case ATTN_DTYPE_INT32: case ATTN_DTYPE_FP8_DS_MLA: case ATTN_DTYPE_COUNT: break;
    }
    ATTN_ASSERT(0);
}

/* Online-softmax step for one row of base-2 scores s[0..n) (padded to a multiple of W):
   updates the running max *m and sum *l, turns s into probabilities, returns alpha. */
static float attn__cpu_softmax_row(float *s, int n, float *m, float *l) {
    int np = (n + ATTN__W - 1) / ATTN__W * ATTN__W, j;
    attn__vf vm = attn__vset1(-INFINITY), sum = attn__vzero(), mv;
    float mx, mnew, alpha;
    for (j = n; j < np; j++) s[j] = -INFINITY;
    for (j = 0; j < np; j += ATTN__W) vm = attn__vmax(vm, attn__vld(s + j));
    mx = attn__vhmax(vm);
    mnew = mx > *m ? mx : *m;
    if (mnew == -INFINITY) { /* nothing visible yet */
        for (j = 0; j < np; j++) s[j] = 0.0f;
        return 1.0f;
    }
    alpha = *m == -INFINITY ? 0.0f : exp2f(*m - mnew);
    mv = attn__vset1(mnew);
    for (j = 0; j < np; j += ATTN__W) {
        attn__vf p = attn__vexp2(attn__vsub(attn__vld(s + j), mv));
        attn__vst(s + j, p);
        sum = attn__vadd(sum, p);
    }
    *l = *l * alpha + attn__vhadd(sum);
    *m = mnew;
    return alpha;
}

/* ---- schedule: the metadata's private part and the builder ------------------------------- */

typedef struct attn__cpu_task {
    int req;
    int head0, head1;             /* KV heads [head0, head1) */
    int tok0, tok1;               /* query tokens [tok0, tok1) of the request */
    int key0, key1;               /* key positions this task may see */
    int prow;                     /* -1: writes the output; else its first partial row */
    int64_t cost;
} attn__cpu_task;

typedef struct attn__cpu_merge {
    int req, head0, head1, tok0, tok1, row0, num_splits; /* split s: partial rows row0 + s*rows */
} attn__cpu_merge;

typedef struct attn__cpu_meta {
    attn__cpu_task *tasks;
    int num_tasks, task_capacity;
    attn__cpu_merge *merges;
    int num_merges, merge_capacity;
    int rows_per_task;            /* most query rows a task holds */
    int tile_rows;                /* K/V rows a tile holds (heads x keys) */
    int partial_rows;             /* split-KV partial rows the current schedule uses */
    int partial_capacity;         /* rows the partial buffer holds (fixed at create) */
    float *partial;               /* partial_capacity rows of (dp + 2): O, m, l */
    int partial_dp;               /* dp of a partial row */
    size_t scratch_floats;        /* per-thread scratch every forward path needs */
    void *workspace;              /* MLA: the fused call's latents and forward_mha's chunk */
    void *workspace_base;         /* its 64-byte aligned start, where the layout carves */
    size_t workspace_bytes;
    /* Cascade attention (attn_metadata_build's common_prefix_len): the shared prefix's keys
       are attended by every query row in prefix tasks (the prefix read once per KV head and
       chunk of tokens, not once per request); the other tasks see only keys past it, and
       each finished row joins its prefix row by LSE where it is stored. */
    int cascade_len;              /* the current build's prefix in keys (0: none) */
    int cascade_tokens;           /* batch tokens per prefix task */
    int num_prefix_tasks;
    int64_t prefix_capacity;      /* token x head rows prefix_partial holds (fixed at create) */
    float *prefix_partial;        /* [token][head] rows of (dp + 2): the prefix pass's O, m, l */
    /* DCP (attn_metadata_desc): the keys are this rank's local indices; visible ranges go
       through attn__dcp_local; sinks join rank 0's rows only */
    int dcp_w, dcp_r, dcp_i;
} attn__cpu_meta;

static int attn__cpu_dp(int head_size) { return (head_size + 15) / 16 * 16; }

static int attn__cpu_tile_tokens(int group) {
    int t = ATTN__CPU_ROWS / group;
    return t > 0 ? t : 1;
}

/* Requests with few query rows (decodes, short chunks) take all KV heads in one task, so
   that a tile reads whole token rows of the cache ([num_kv_heads, head_size] each)
   front to back; longer queries take one KV head per task. */
static int attn__cpu_all_heads(const attn_layer_desc *d, int query_len) {
    return d->num_kv_heads > 1 && (int64_t)query_len * d->num_heads <= ATTN__CPU_ROWS;
}

/* Keys per tile: ATTN__CPU_NT for one head, fewer (a multiple of 16) for many heads. */
static int attn__cpu_tile_keys(int heads) {
    int n = ATTN__CPU_NT / heads / 16 * 16;
    return heads == 1 ? ATTN__CPU_NT : (n < 16 ? 16 : n);
}

/* The private part of CPU metadata, allocated once at its fixed capacity. */
#define ATTN__CPU_MAX_TASKS (1 << 26)
#define ATTN__CPU_MAX_ROWS (1 << 20)

static attn_status attn__cpu_meta_attach(attn_layer *layer, attn_metadata *meta, int64_t task_capacity,
                                         int merge_capacity, int64_t rows_per_task, int tile_rows,
                                         int64_t partial_rows, int partial_dp, attn__cpu_meta **out) {
    attn__cpu_meta *cm = NULL;
    if (task_capacity > ATTN__CPU_MAX_TASKS || rows_per_task > ATTN__CPU_MAX_ROWS ||
        partial_rows > (int64_t)ATTN__CPU_MAX_TASKS * 16)
        return attn__fail(layer->ctx, ATTN_ERROR_CAPACITY, ATTN_LOG_CAPACITY_EXCEEDED,
                          "attn_metadata_create: the capacity asks for %lld tasks of up to %lld "
                          "query rows and %lld split-KV rows (allowed: at most %d tasks, %d rows "
                          "and %d split rows; lower max_num_reqs, max_num_tokens, num_kv_splits "
                          "or decode_threshold)", (long long)task_capacity, (long long)rows_per_task,
                          (long long)partial_rows, ATTN__CPU_MAX_TASKS, ATTN__CPU_MAX_ROWS,
                          ATTN__CPU_MAX_TASKS * 16);
    cm = (attn__cpu_meta *)attn__calloc(1, sizeof *cm);
    if (cm) {
        cm->task_capacity = (int)task_capacity;
        cm->merge_capacity = merge_capacity;
        cm->rows_per_task = (int)rows_per_task;
        cm->tile_rows = tile_rows;
        cm->partial_capacity = (int)partial_rows;
        cm->partial_dp = partial_dp;
        cm->tasks = (attn__cpu_task *)attn__calloc((size_t)task_capacity, sizeof *cm->tasks);
        cm->merges = (attn__cpu_merge *)attn__calloc((size_t)merge_capacity, sizeof *cm->merges);
        cm->partial = (float *)attn__calloc((size_t)partial_rows * (size_t)(partial_dp + 2), sizeof(float));
    }
    if (!cm || !cm->tasks || !cm->merges || (partial_rows && !cm->partial)) {
        if (cm) { attn__free(cm->tasks); attn__free(cm->merges); attn__free(cm->partial); attn__free(cm); }
        return attn__fail(layer->ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_metadata_create: cannot allocate the CPU schedule (%lld tasks, "
                          "%lld split-KV rows)", (long long)task_capacity, (long long)partial_rows);
    }
    attn_metadata_private_set(meta, cm);
    *out = cm;
    return ATTN_OK;
}

/* Reserves the per-thread scratch of every forward path now, so forward never allocates
   (the context's scratch only grows). */
static attn_status attn__cpu_meta_reserve(attn_layer *layer, attn_metadata *meta, attn__cpu_meta *cm,
                                          size_t scratch_floats) {
    attn_status st;
    cm->scratch_floats = scratch_floats;
    st = attn__scratch_reserve(layer->ctx, scratch_floats);
    if (st != ATTN_OK) {
        attn__free(cm->tasks); attn__free(cm->merges); attn__free(cm->partial); attn__free(cm->prefix_partial);
        attn__free(cm);
        attn_metadata_private_set(meta, NULL);
    }
    return st;
}

static size_t attn__cpu_scratch_floats(const attn__cpu_meta *cm, int dpk, int dpv);
static void attn__cpu_metadata_release(const attn_backend *self, attn_metadata *meta);

/* Query rows of a prefix task: whole tokens (all of a KV head's group), about
   ATTN__CPU_CASCADE_ROWS. */
static int attn__cpu_prefix_tokens(const attn_layer_desc *d) {
    return ATTN__MAX(1, ATTN__CPU_CASCADE_ROWS / (d->num_heads / d->num_kv_heads));
}

/* A prefix task's scratch: Q, O and S of its rows, one K/V tile in f32, m, l, alpha. */
static size_t attn__cpu_prefix_scratch_floats(const attn_layer_desc *d) {
    size_t rows = (size_t)attn__cpu_prefix_tokens(d) * (size_t)(d->num_heads / d->num_kv_heads);
    size_t dp = (size_t)attn__cpu_dp(d->head_size);
    return rows * (2 * dp + ATTN__CPU_NT + 3) + (size_t)ATTN__CPU_NT * 2 * dp + 64;
}

static attn_status attn__cpu_metadata_init(const attn_backend *self, attn_layer *layer, attn_metadata *meta) {
    const attn_layer_desc *d = &layer->desc;
    const attn_metadata_desc *cap = attn_metadata_capacity(meta);
    int group = d->num_heads / d->num_kv_heads;
    int tt = attn__cpu_tile_tokens(group);
    int want = 4 * layer->ctx->num_threads;
    int64_t base = (int64_t)d->num_kv_heads *
                   ((int64_t)cap->max_num_tokens / tt + 1 + cap->max_num_reqs);
    int64_t rows = ATTN__MAX(tt * group, ATTN__CPU_ROWS), prefix_rows;
    attn__cpu_meta *cm = NULL;
    attn_status st;
    /* splits happen only while the batch has fewer than `want` base tasks, and at most
       ceil(want / base) per tile: fewer than 2 * want split tasks in all */
    st = attn__cpu_meta_attach(layer, meta, base + (int64_t)want * ATTN__CPU_MAX_SPLITS, want, rows,
                               ATTN__MAX(ATTN__CPU_NT, d->num_kv_heads * attn__cpu_tile_keys(d->num_kv_heads)),
                               2 * (int64_t)want * rows, attn__cpu_dp(d->head_size), &cm);
    if (st != ATTN_OK) return st;
    /* cascade rows: batches of at most max_num_reqs x decode_threshold tokens (decodes and
       speculative verification steps, where a shared prefix dominates the reads) */
    prefix_rows = (int64_t)ATTN__MIN(cap->max_num_tokens, (int64_t)cap->max_num_reqs * cap->decode_threshold) * d->num_heads;
    cm->prefix_capacity = prefix_rows;
    cm->prefix_partial = (float *)attn__calloc((size_t)prefix_rows * (size_t)(attn__cpu_dp(d->head_size) + 2), sizeof(float));
    if (prefix_rows && !cm->prefix_partial) {
        attn__cpu_metadata_release(self, meta);
        return attn__fail(layer->ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_metadata_create: cannot allocate the CPU cascade rows (%lld)", (long long)prefix_rows);
    }
    return attn__cpu_meta_reserve(layer, meta, cm,
                                  ATTN__MAX(attn__cpu_scratch_floats(cm, attn__cpu_dp(d->head_size), attn__cpu_dp(d->head_size)),
                                            attn__cpu_prefix_scratch_floats(d)));
}

static void attn__cpu_metadata_release(const attn_backend *self, attn_metadata *meta) {
    attn__cpu_meta *cm = (attn__cpu_meta *)attn_metadata_private(meta);
    (void)self;
    if (!cm) return;
    attn__free(cm->tasks);
    attn__free(cm->merges);
    attn__free(cm->partial);
    attn__free(cm->workspace);
    attn__free(cm->prefix_partial);
    attn__free(cm);
    attn_metadata_private_set(meta, NULL);
}

/* Keys visible to query position pos of a sequence of seq_len tokens: [*lo, *hi). */
static void attn__cpu_visible_keys(const attn_layer_desc *d, int causal, int pos, int seq_len,
                               int *lo, int *hi) {
    int64_t w = d->sliding_window;
    *lo = w ? (int)ATTN__MAX(0, (int64_t)pos - w + 1) : 0;
    if (causal) *hi = pos + 1;
    else *hi = w ? (int)ATTN__MIN((int64_t)seq_len, (int64_t)pos + w) : seq_len;
}

/* The same as a DCP rank's local key range (the metadata's capacity; unchanged without). */
static void attn__visible_local(const attn_layer_desc *d, const attn_metadata_desc *cap, int causal, int pos,
                                int seq_len, int *lo, int *hi) {
    attn__cpu_visible_keys(d, causal, pos, seq_len, lo, hi);
    if (cap->dcp_world_size > 1) {
        *lo = attn__dcp_len(cap, *lo);
        *hi = attn__dcp_len(cap, *hi);
    }
}
static void attn__cpu_visible_local(const attn_layer_desc *d, const attn__cpu_meta *cm, int causal, int pos,
                                    int seq_len, int *lo, int *hi) {
    attn__cpu_visible_keys(d, causal, pos, seq_len, lo, hi);
    if (cm->dcp_w > 1) {
        *lo = (int)attn__dcp_local(cm->dcp_w, cm->dcp_r, cm->dcp_i, *lo);
        *hi = (int)attn__dcp_local(cm->dcp_w, cm->dcp_r, cm->dcp_i, *hi);
    }
}

/* Appends the tasks of one (request, KV heads, query tile): ns splits of the key range
   [lo, hi), and the merge that joins them when ns > 1. */
static void attn__cpu_emit(attn__cpu_meta *cm, int *nt, int *nm, int *prow, int req, int h0,
                           int h1, int t0, int t1, int lo, int hi, int ns, int rows) {
    int s;
    if (ns > 1) {
        attn__cpu_merge *mg = &cm->merges[(*nm)++];
        ATTN_ASSERT(*nm <= cm->merge_capacity);
        mg->req = req; mg->head0 = h0; mg->head1 = h1; mg->tok0 = t0; mg->tok1 = t1;
        mg->row0 = *prow; mg->num_splits = ns;
    }
    for (s = 0; s < ns; s++) {
        attn__cpu_task *tk = &cm->tasks[(*nt)++];
        ATTN_ASSERT(*nt <= cm->task_capacity);
        tk->req = req; tk->head0 = h0; tk->head1 = h1; tk->tok0 = t0; tk->tok1 = t1;
        tk->key0 = lo + (int)((int64_t)(hi - lo) * s / ns);
        tk->key1 = lo + (int)((int64_t)(hi - lo) * (s + 1) / ns);
        tk->prow = -1;
        if (ns > 1) {
            tk->prow = *prow;
            *prow += rows;
            ATTN_ASSERT(*prow <= cm->partial_capacity);
        }
        tk->cost = (int64_t)(tk->key1 - tk->key0 + 16) * (t1 - t0) * (h1 - h0);
    }
}

/* Heap sort by cost, longest first (qsort may allocate; build may not). */
static void attn__cpu_sift(attn__cpu_task *t, int root, int n) {
    for (;;) {
        int c = 2 * root + 1;
        attn__cpu_task tmp;
        if (c >= n) return;
        if (c + 1 < n && t[c + 1].cost < t[c].cost) c++;   /* min-heap: smallest to the end */
        if (t[root].cost <= t[c].cost) return;
        tmp = t[root]; t[root] = t[c]; t[c] = tmp;
        root = c;
    }
}
static void attn__cpu_sort_tasks(attn__cpu_task *t, int n) {
    int i;
    for (i = n / 2 - 1; i >= 0; i--) attn__cpu_sift(t, i, n);
    for (i = n - 1; i > 0; i--) {
        attn__cpu_task tmp = t[0];
        t[0] = t[i]; t[i] = tmp;
        attn__cpu_sift(t, 0, i);
    }
}

/* Orders the tasks longest first and publishes the counts (partials were sized at create). */
static attn_status attn__cpu_schedule_finish(attn__cpu_meta *cm, int nt, int nm, int prows) {
    attn__cpu_sort_tasks(cm->tasks, nt);
    cm->num_tasks = nt;
    cm->num_merges = nm;
    cm->partial_rows = prows;
    return ATTN_OK;
}

/* The schedule: tasks of (request, KV heads, query tile), split along the keys when the
   batch alone cannot keep the threads busy (never under ATTN_BATCH_INVARIANT=1). */
static attn_status attn__cpu_build(const attn_backend *self, attn_layer *layer, attn_metadata *meta,
                                   int common_prefix_len, int fast_build) {
    attn__cpu_meta *cm = (attn__cpu_meta *)attn_metadata_private(meta);
    const attn_batch *b = attn_metadata_batch(meta);
    const attn_layer_desc *d = &layer->desc;
    int group = d->num_heads / d->num_kv_heads, tt = attn__cpu_tile_tokens(group);
    int causal = b->causal == ATTN_CAUSAL_YES;
    int want = 4 * layer->ctx->num_threads, base = 0, r, h, t0, nt = 0, nm = 0, prows = 0;
    int split, P = 0;
    const attn_metadata_desc *cap = attn_metadata_capacity(meta);
    (void)self;
    (void)fast_build;
    cm->dcp_w = cap->dcp_world_size; cm->dcp_r = cap->dcp_rank; cm->dcp_i = cap->dcp_interleave;
    /* cascade (common_prefix_len: whole blocks before every request's queries, validated):
       where every row sees the whole prefix (no sliding window) and the rows fit */
    cm->cascade_len = cm->num_prefix_tasks = 0;
    if (common_prefix_len > 0 && !d->sliding_window && b->num_reqs > 1 &&
        (int64_t)b->num_actual_tokens * d->num_heads <= cm->prefix_capacity) {
        const int ct = attn__cpu_prefix_tokens(d);
        P = cm->cascade_len = common_prefix_len;
        cm->cascade_tokens = ct;
        cm->num_prefix_tasks = d->num_kv_heads * ((b->num_actual_tokens + ct - 1) / ct);
        attn__log(layer->ctx, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_CASCADE_PLANNED,
                  "attn_metadata_build: cascade: %d prefix keys for %d tokens, %d prefix tasks", P,
                  b->num_actual_tokens, cm->num_prefix_tasks);
    }
    for (r = 0; r < b->num_reqs; r++) {
        int ql = b->query_start_loc[r + 1] - b->query_start_loc[r];
        base += attn__cpu_all_heads(d, ql) ? (ql > 0) : d->num_kv_heads * ((ql + tt - 1) / tt);
    }
    split = !attn__env_batch_invariant(layer->ctx) && base > 0 && base < want;
    for (r = 0; r < b->num_reqs; r++) {
        int ql = b->query_start_loc[r + 1] - b->query_start_loc[r], sl = b->seq_lens[r];
        int all = attn__cpu_all_heads(d, ql), step = all ? ql : tt;
        for (t0 = 0; t0 < ql; t0 += step) {
            int t1 = ATTN__MIN(ql, t0 + step), lo0, hi0, lo1, hi1, lo, hi, ns = 1;
            attn__cpu_visible_local(d, cm, causal, sl - ql + t0, sl, &lo0, &hi0);
            attn__cpu_visible_local(d, cm, causal, sl - ql + t1 - 1, sl, &lo1, &hi1);
            lo = ATTN__MAX(ATTN__MIN(lo0, lo1), P); /* cascade: the prefix tasks saw [0, P) */
            hi = ATTN__MAX(hi0, hi1);
            if (split && t0 == 0 && t1 == ql && hi - lo >= 2 * ATTN__CPU_SPLIT_MIN) {
                ns = (hi - lo) / ATTN__CPU_SPLIT_MIN;
                ns = ATTN__MIN(ns, (want + base - 1) / base);
                ns = ATTN__MIN(ns, ATTN__CPU_MAX_SPLITS);
                if (ns < 2) ns = 1;
            }
            for (h = 0; h < d->num_kv_heads; h += all ? d->num_kv_heads : 1)
                attn__cpu_emit(cm, &nt, &nm, &prows, r, h, all ? d->num_kv_heads : h + 1, t0, t1,
                               lo, hi, ns, (t1 - t0) * group * (all ? d->num_kv_heads : 1));
        }
    }
    return attn__cpu_schedule_finish(cm, nt, nm, prows);
}

/* ---- runner: one pass of tasks, then the split-KV merges --------------------------------- */

/* What one parallel attention pass reads and writes: the effective layer view (for MLA
   decode: one KV head of width dk, V the first dv of the same row), the batch, the
   schedule, the cache geometry and the q/out/lse views. */
typedef struct attn__cpu_run {
    attn_context *ctx;
    float k_scale, v_scale;        /* fp8 caches: q is scaled by k_scale, O by v_scale; else 1 */
    int row_scales;                /* per-token-head scales: a float per (token, KV head) row at */
    size_t scale_offset;           /*   half + scale_offset + (token * num_kv_heads + head) * 4 */
    attn_layer_desc d;             /* heads, KV heads, head_size = dk, scale, mask fields */
    const float *alibi;
    const attn_batch *b;
    const attn__cpu_meta *cm;
    int dk, dv, dpk, dpv;          /* QK and PV widths, and padded to 16 */
    const char *kv;                /* cache base and geometry (elements) */
    attn_dtype kv_dtype;
    size_t block_stride, token_stride, head_stride, k_offset, v_offset;
    int v_in_k;                    /* V rows are the K rows (the MLA latent) */
    attn_tensor q, q2;             /* q rows [token][head][dk], or split at q_split: */
    int q_split;                   /*   q gives the first q_split dims, q2 the rest */
    int row0;                      /* batch token of q/out/lse row 0 */
    attn_tensor out, lse;
    int has_lse;
} attn__cpu_run;

static size_t attn__cpu_scratch_floats(const attn__cpu_meta *cm, int dpk, int dpv) {
    size_t r = (size_t)(cm->rows_per_task + 15) / 16 * 16;
    return r * (size_t)(dpk + dpv) + r * ATTN__CPU_NT + (size_t)cm->tile_rows * (size_t)(dpk + dpv) +
           5 * r + 64;
}

/* Row i of a task is (KV head, token, group member) in that order of significance. */
static void attn__cpu_row_owner(const attn_layer_desc *d, int head0, int tok0, int tok1, int i,
                                int *tok, int *head) {
    int group = d->num_heads / d->num_kv_heads, per_head = (tok1 - tok0) * group;
    int kh = head0 + i / per_head, rem = i % per_head;
    *tok = tok0 + rem / group;
    *head = kh * group + rem % group;
}

/* Writes normalised rows (or unnormalised partials) of one task. */
static void attn__cpu_store_rows(const attn__cpu_run *a, int req, int head0, int head1,
                                 int tok0, int tok1, int prow, const float *O, const float *m,
                                 const float *l, float *tmp) {
    const attn_layer_desc *d = &a->d;
    int group = d->num_heads / d->num_kv_heads, dp = a->dpv;
    int rows = (tok1 - tok0) * group * (head1 - head0), i, x, tok, head;
    int qs = a->b->query_start_loc[req] - a->row0;
    size_t osz = attn_dtype_size(a->out.dtype);
    if (prow >= 0) {
        float *p = a->cm->partial + (size_t)prow * (size_t)(dp + 2);
        for (i = 0; i < rows; i++) {
            memcpy(p + (size_t)i * (size_t)(dp + 2), O + (size_t)i * (size_t)dp, (size_t)dp * sizeof(float));
            p[(size_t)i * (size_t)(dp + 2) + (size_t)dp] = m[i];
            p[(size_t)i * (size_t)(dp + 2) + (size_t)dp + 1] = l[i];
        }
        return;
    }
    for (i = 0; i < rows; i++) {
        float mi = m[i], li = l[i], w = 1.0f, wp = 0.0f, inv; /* base 2: O = sum 2^(s - mi) v, li = sum 2^(s - mi) */
        const float *op = NULL;
        attn__cpu_row_owner(d, head0, tok0, tok1, i, &tok, &head);
        if (a->cm->cascade_len) { /* the row's part of the shared prefix (prefix tasks): by LSE */
            const float *pr = a->cm->prefix_partial + ((size_t)(a->b->query_start_loc[req] + tok) * (size_t)d->num_heads +
                                                       (size_t)head) * (size_t)(dp + 2);
            const float mp = pr[dp], lp = pr[dp + 1], mx = mi > mp ? mi : mp;
            if (lp > 0.0f) {
                w = li > 0.0f ? exp2f(mi - mx) : 0.0f;
                wp = exp2f(mp - mx);
                li = li * w + lp * wp;
                mi = mx;
                op = pr;
            }
        }
        if (d->sinks && a->cm->dcp_r == 0) { /* the sink joins the denominator once, here (partials
                                                   never see it; under DCP rank 0's rows only) */
            const float sk = d->sinks[head] * ATTN__LOG2E, mx = mi > sk ? mi : sk;
            const float f = li > 0.0f ? exp2f(mi - mx) : 0.0f;
            w *= f;
            wp *= f;
            li = li * f + exp2f(sk - mx);
            mi = mx;
        }
        inv = li > 0.0f ? 1.0f / li : 0.0f;
        tok += qs;
        for (x = 0; x < a->dv; x++) tmp[x] = O[(size_t)i * (size_t)dp + x] * (w * inv);
        if (op)
            for (x = 0; x < a->dv; x++) tmp[x] += op[x] * (wp * inv);
        attn__row_from_f32(tmp, a->out.dtype,
                           (char *)a->out.data + (size_t)(tok * a->out.strides[0] + head * a->out.strides[1]) * osz,
                           a->dv);
        if (a->has_lse)
            ((float *)a->lse.data)[tok * a->lse.strides[0] + head * a->lse.strides[1]] =
                li > 0.0f ? (mi + log2f(li)) * ATTN__LN2 : -INFINITY;
    }
}

/* Keys per tile of the direct (decode) kernels: ATTN__CPU_NT, fewer (a multiple of 16)
   when a tile of K rows of all the task's heads would pass ATTN__CPU_TILE_BYTES, so that
   the pipelined prefetch's V of this tile and K of the next stay in L2 (1 MiB on Zen 4/5). */
#ifndef ATTN__CPU_TILE_BYTES
#define ATTN__CPU_TILE_BYTES (256 * 1024)
#endif
static int attn__cpu_direct_tile_keys(int nheads, int dk, attn_dtype dt) {
    size_t row = (size_t)nheads * (size_t)dk * attn_dtype_size(dt);
    int keys = (int)ATTN__MIN((size_t)ATTN__CPU_NT, ATTN__CPU_TILE_BYTES / row / 16 * 16);
    return keys < 16 ? 16 : keys;
}

/* Start of the K row of (block slot key, KV head h); V adds v_offset - k_offset. */
static const char *attn__cpu_krow(const attn__cpu_run *a, const int32_t *bt, int key, int h) {
    int bs = a->d.block_size;
    size_t blk = (size_t)bt[key / bs], off = (size_t)(key % bs);
    return a->kv + (blk * a->block_stride + off * a->token_stride + (size_t)h * a->head_stride +
                    a->k_offset) * attn_dtype_size(a->kv_dtype);
}

/* The per-token-head scale of (key, KV head h): of its K row (v = 0) or V row (v = 1). */
static float attn__cpu_row_scale(const attn__cpu_run *a, const int32_t *bt, int key, int h, int v) {
    int bs = a->d.block_size;
    size_t blk = (size_t)bt[key / bs], off = (size_t)(key % bs);
    float s;
    memcpy(&s, a->kv + blk * a->block_stride + (v ? a->v_offset : 0) + a->scale_offset +
                   (off * (size_t)a->d.num_kv_heads + (size_t)h) * 4, 4);
    return s;
}

static void attn__cpu_task_run(void *varg, int ti, int thread) {
    const attn__cpu_run *a = (const attn__cpu_run *)varg;
    const attn__cpu_task *tk = &a->cm->tasks[ti];
    const attn_layer_desc *d = &a->d;
    const attn_batch *b = a->b;
    int group = d->num_heads / d->num_kv_heads, dpk = a->dpk, dpv = a->dpv, dk = a->dk, dv = a->dv;
    int nheads = tk->head1 - tk->head0, per_head = (tk->tok1 - tk->tok0) * group;
    int rows = per_head * nheads, rp = (rows + 15) / 16 * 16;
    int direct = per_head <= 8 && dk % ATTN__W == 0 && dv % ATTN__W == 0 && !a->v_in_k;
    int nt_keys = direct ? attn__cpu_direct_tile_keys(nheads, a->dk, a->kv_dtype) : attn__cpu_tile_keys(nheads);
    const char *rows_a[ATTN__CPU_NT], *rows_b[ATTN__CPU_NT], *vp[ATTN__CPU_NT];
#if ATTN__CPU_BF16_DOT_ON
    int bf16dot = direct && a->kv_dtype == ATTN_DTYPE_BF16 && dk % 32 == 0;
#endif
    const char **kp = rows_a, **kp_next = rows_b;  /* this tile's K rows, the next tile's */
    attn__cpu_pf pf;
    int ql = b->query_start_loc[tk->req + 1] - b->query_start_loc[tk->req];
    int sl = b->seq_lens[tk->req], qs = b->query_start_loc[tk->req] - a->row0;
    int causal = b->causal == ATTN_CAUSAL_YES;
    int i, j, j0, h, kmin = INT32_MAX, kmax = 0, ldv = a->v_in_k ? dpk : dpv;
    const int32_t *bt = b->block_table + (size_t)tk->req * (size_t)b->block_table_stride;
    float *base = a->ctx->scratch[thread];
    float *Q, *O, *S, *K, *V, *m, *l, *alpha, *tmp;
    float rscale[2 * ATTN__CPU_NT]; /* per-token-head scales of a tile's keys: K's, then V's */
    int *lo, *hi;
    size_t qsz = attn_dtype_size(a->q.dtype), csz = attn_dtype_size(a->kv_dtype);
    size_t head_bytes = a->head_stride * csz, vdelta = (a->v_offset - a->k_offset) * csz;
    float cap = d->logits_soft_cap;
    float qscale = (cap > 0.0f ? d->scale : d->scale * ATTN__LOG2E) * a->k_scale; /* k = code * k_scale */
    base = (float *)(void *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
    Q = base;
    O = Q + (size_t)rp * (size_t)dpk;
    S = O + (size_t)rp * (size_t)dpv;
    K = S + (size_t)rp * ATTN__CPU_NT;
    V = K + (size_t)a->cm->tile_rows * (size_t)dpk;
    m = V + (size_t)a->cm->tile_rows * (size_t)dpv;
    l = m + rp;
    alpha = l + rp;
    lo = (int *)(void *)(alpha + rp);
    hi = lo + rp;
    tmp = K; /* free once the key loop is done */

    for (i = 0; i < rows; i++) {
        int t, head;
        float *qr = Q + (size_t)i * (size_t)dpk;
        attn__cpu_row_owner(d, tk->head0, tk->tok0, tk->tok1, i, &t, &head);
        attn__cpu_visible_local(d, a->cm, causal, sl - ql + t, sl, &lo[i], &hi[i]);
        lo[i] = ATTN__MAX(lo[i], tk->key0);
        hi[i] = ATTN__MIN(hi[i], tk->key1);
        if (lo[i] < hi[i]) { kmin = ATTN__MIN(kmin, lo[i]); kmax = ATTN__MAX(kmax, hi[i]); }
        if (a->q_split) {
            size_t q2sz = attn_dtype_size(a->q2.dtype);
            attn__row_to_f32((const char *)a->q.data + (size_t)((qs + t) * a->q.strides[0] + head * a->q.strides[1]) * qsz,
                             a->q.dtype, qr, a->q_split, a->q_split);
            attn__row_to_f32((const char *)a->q2.data + (size_t)((qs + t) * a->q2.strides[0] + head * a->q2.strides[1]) * q2sz,
                             a->q2.dtype, qr + a->q_split, dk - a->q_split, dpk - a->q_split);
        } else {
            attn__row_to_f32((const char *)a->q.data + (size_t)((qs + t) * a->q.strides[0] + head * a->q.strides[1]) * qsz,
                             a->q.dtype, qr, dk, dpk);
        }
        for (j = 0; j < dk; j++) qr[j] *= qscale;
        memset(O + (size_t)i * (size_t)dpv, 0, (size_t)dpv * sizeof(float));
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
#if ATTN__CPU_BF16_DOT_ON
    if (bf16dot) attn__cpu_q_to_bf16(Q, rows, dk, dpk, (uint16_t *)(void *)K); /* K is free here */
#endif
    for (j0 = kmin; j0 < kmax; j0 += nt_keys) {
        int n = ATTN__MIN(nt_keys, kmax - j0), n_next;
        if (direct) { /* row pointers only; the kernels read and convert */
            const char **t = kp;
            kp = kp_next;
            kp_next = t;
            if (j0 == kmin)
                for (j = 0; j < n; j++) kp[j] = attn__cpu_krow(a, bt, j0 + j, tk->head0);
            for (j = 0; j < n; j++) vp[j] = kp[j] + vdelta;
            if (head_bytes >= 512)
                attn__cpu_pf_init(&pf, vp, n, nheads, head_bytes, (n + 3) / 4 * nheads);
            else
                attn__cpu_pf_init(&pf, vp, n, 1, (size_t)nheads * head_bytes, (n + 3) / 4 * nheads);
#if ATTN__CPU_BF16_DOT_ON
            if (bf16dot)
                attn__cpu_qk_bf16dot((const uint16_t *)(const void *)K, per_head, nheads, kp, head_bytes, n,
                                     dk, dpk, S, ATTN__CPU_NT, &pf);
            else
#endif
            attn__cpu_qk_direct(Q, per_head, nheads, kp, head_bytes, n, dk, dpk, S, ATTN__CPU_NT,
                                &pf, a->kv_dtype);
            n_next = ATTN__MIN(nt_keys, kmax - j0 - n);
            for (j = 0; j < n_next; j++) kp_next[j] = attn__cpu_krow(a, bt, j0 + n + j, tk->head0);
            attn__cpu_pf_init(&pf, kp_next, n_next, 1, (size_t)nheads * head_bytes, n * nheads);
        } else { /* gather: rows of the cache, converted to f32, tile layout [head][key][dp] */
            for (j = 0; j < n; j++) {
                const char *kr = attn__cpu_krow(a, bt, j0 + j, tk->head0);
                for (h = 0; h < nheads; h++) {
                    float *kd = K + ((size_t)h * (size_t)nt_keys + (size_t)j) * (size_t)dpk;
                    float *vd = V + ((size_t)h * (size_t)nt_keys + (size_t)j) * (size_t)dpv;
                    attn__row_to_f32(kr + (size_t)h * head_bytes, a->kv_dtype, kd, dk, dpk);
                    if (!a->v_in_k) attn__row_to_f32(kr + (size_t)h * head_bytes + vdelta, a->kv_dtype, vd, dv, dpv);
                    if (a->row_scales) { /* codes * the row's scale */
                        float ks = attn__cpu_row_scale(a, bt, j0 + j, tk->head0 + h, 0);
                        float vs = attn__cpu_row_scale(a, bt, j0 + j, tk->head0 + h, 1);
                        int x;
                        for (x = 0; x < dk; x++) kd[x] *= ks;
                        for (x = 0; x < dv; x++) vd[x] *= vs;
                    }
                }
            }
        }
        for (h = 0; h < nheads; h++) {
            float *Sh = S + (size_t)h * (size_t)per_head * ATTN__CPU_NT;
            const float *Kh = K + (size_t)h * (size_t)nt_keys * (size_t)dpk;
            const float *Vh = a->v_in_k ? Kh : V + (size_t)h * (size_t)nt_keys * (size_t)dpv;
            int r0 = h * per_head, scaled = direct && a->row_scales;
            if (!direct) attn__cpu_qk(Q + (size_t)r0 * (size_t)dpk, per_head, Kh, n, dpk, S + (size_t)r0 * ATTN__CPU_NT, ATTN__CPU_NT);
            if (scaled) /* per-token-head scales of this head's rows: s *= k scale, then p *= v scale */
                for (j = 0; j < n; j++) {
                    rscale[j] = attn__cpu_row_scale(a, bt, j0 + j, tk->head0 + h, 0);
                    rscale[ATTN__CPU_NT + j] = attn__cpu_row_scale(a, bt, j0 + j, tk->head0 + h, 1);
                }
            for (i = r0; i < r0 + per_head; i++) {
                float *s = S + (size_t)i * ATTN__CPU_NT;
                if (scaled)
                    for (j = 0; j < n; j++) s[j] *= rscale[j];
                if (cap > 0.0f)
                    for (j = 0; j < n; j++) s[j] = cap * tanhf(s[j] / cap) * ATTN__LOG2E;
                if (a->alibi) {
                    int t, head;
                    float slope;
                    attn__cpu_row_owner(d, tk->head0, tk->tok0, tk->tok1, i, &t, &head);
                    slope = a->alibi[head] * ATTN__LOG2E;
                    for (j = 0; j < n; j++) s[j] += slope * (float)(j0 + j - (sl - ql + t));
                }
                if (j0 < lo[i] || j0 + n > hi[i])
                    for (j = 0; j < n; j++)
                        if (j0 + j < lo[i] || j0 + j >= hi[i]) s[j] = -INFINITY;
                alpha[i] = attn__cpu_softmax_row(s, n, &m[i], &l[i]);
                if (scaled) /* l counted the unscaled p */
                    for (j = 0; j < n; j++) s[j] *= rscale[ATTN__CPU_NT + j];
            }
            if (direct)
                attn__cpu_pv_direct(Sh, ATTN__CPU_NT, per_head, vp, (size_t)h * head_bytes, n, dv, dpv,
                                    O + (size_t)r0 * (size_t)dpv, alpha + r0, &pf, a->kv_dtype);
            else
                attn__cpu_pv(Sh, ATTN__CPU_NT, per_head, Vh, ldv, n, dpv, O + (size_t)r0 * (size_t)dpv, alpha + r0);
        }
    }
    if (a->v_scale != 1.0f) /* v = code * v_scale: O is linear in v */
        for (i = 0; i < rows; i++)
            for (j = 0; j < dv; j++) O[(size_t)i * (size_t)dpv + (size_t)j] *= a->v_scale;
    attn__cpu_store_rows(a, tk->req, tk->head0, tk->head1, tk->tok0, tk->tok1, tk->prow, O, m, l, tmp);
}

/* Merges the split-KV partials of one (request, KV heads, tile) by their LSEs: the
   second stage of split-KV. */
static void attn__cpu_merge_run(void *varg, int mi, int thread) {
    const attn__cpu_run *a = (const attn__cpu_run *)varg;
    const attn__cpu_merge *mg = &a->cm->merges[mi];
    const attn_layer_desc *d = &a->d;
    int group = d->num_heads / d->num_kv_heads, dp = a->dpv;
    int rows = (mg->tok1 - mg->tok0) * group * (mg->head1 - mg->head0), i, s, x;
    size_t stride = (size_t)rows * (size_t)(dp + 2);            /* one split's rows */
    float *O = (float *)(void *)(((uintptr_t)a->ctx->scratch[thread] + 63) & ~(uintptr_t)63);
    float *mrow = O + (size_t)rows * (size_t)dp, *lrow = mrow + rows, *tmp = lrow + rows;
    for (i = 0; i < rows; i++) {
        float mx = -INFINITY, lsum = 0.0f;
        for (s = 0; s < mg->num_splits; s++) {
            const float *p = a->cm->partial + (size_t)mg->row0 * (size_t)(dp + 2) + (size_t)s * stride + (size_t)i * (size_t)(dp + 2);
            if (p[dp + 1] > 0.0f && p[dp] > mx) mx = p[dp];
        }
        for (x = 0; x < dp; x++) O[(size_t)i * (size_t)dp + x] = 0.0f;
        for (s = 0; s < mg->num_splits && mx > -INFINITY; s++) {
            const float *p = a->cm->partial + (size_t)mg->row0 * (size_t)(dp + 2) + (size_t)s * stride + (size_t)i * (size_t)(dp + 2);
            float w;
            if (!(p[dp + 1] > 0.0f)) continue;
            w = exp2f(p[dp] - mx);
            lsum += p[dp + 1] * w;
            for (x = 0; x < dp; x++) O[(size_t)i * (size_t)dp + x] += w * p[x];
        }
        mrow[i] = mx;
        lrow[i] = lsum;
    }
    attn__cpu_store_rows(a, mg->req, mg->head0, mg->head1, mg->tok0, mg->tok1, -1, O, mrow, lrow, tmp);
}

/* Cascade: one prefix task, the shared prefix's keys [0, cascade_len) of KV head kh for
   batch tokens [c0, c1) (every row sees all of them: each query lies past the prefix and
   the layer has no window). The keys are request 0's blocks, the same in every request
   (validated). Rows are (token, group member); each is stored, unnormalised in value
   units, with its base-2 (m, l) into prefix_partial[token][head] for attn__cpu_store_rows. */
static void attn__cpu_prefix_run(void *varg, int pi, int thread) {
    const attn__cpu_run *a = (const attn__cpu_run *)varg;
    const attn__cpu_meta *cm = a->cm;
    const attn_layer_desc *d = &a->d;
    const attn_batch *b = a->b;
    const int group = d->num_heads / d->num_kv_heads, kh = pi % d->num_kv_heads, dpk = a->dpk, dpv = a->dpv;
    const int c0 = pi / d->num_kv_heads * cm->cascade_tokens, c1 = ATTN__MIN(b->num_actual_tokens, c0 + cm->cascade_tokens);
    const int rows = (c1 - c0) * group, P = cm->cascade_len;
    const float cap = d->logits_soft_cap;
    const float qscale = (cap > 0.0f ? d->scale : d->scale * ATTN__LOG2E) * a->k_scale;
    const size_t qsz = attn_dtype_size(a->q.dtype), csz = attn_dtype_size(a->kv_dtype);
    const size_t vdelta = (a->v_offset - a->k_offset) * csz;
    float *base = (float *)(void *)(((uintptr_t)a->ctx->scratch[thread] + 63) & ~(uintptr_t)63);
    float *Q = base, *O = Q + (size_t)rows * (size_t)dpk, *S = O + (size_t)rows * (size_t)dpv;
    float *K = S + (size_t)rows * ATTN__CPU_NT, *V = K + (size_t)ATTN__CPU_NT * (size_t)dpk;
    float *m = V + (size_t)ATTN__CPU_NT * (size_t)dpv, *l = m + rows, *alpha = l + rows;
    int i, j, j0, x, req = 0;
    for (i = 0; i < rows; i++) {
        const int tok = c0 + i / group, head = kh * group + i % group;
        float *qr = Q + (size_t)i * (size_t)dpk;
        attn__row_to_f32((const char *)a->q.data + (size_t)((tok - a->row0) * a->q.strides[0] + head * a->q.strides[1]) * qsz,
                         a->q.dtype, qr, a->dk, dpk);
        for (x = 0; x < a->dk; x++) qr[x] *= qscale;
        memset(O + (size_t)i * (size_t)dpv, 0, (size_t)dpv * sizeof(float));
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    for (j0 = 0; j0 < P; j0 += ATTN__CPU_NT) {
        const int n = ATTN__MIN(ATTN__CPU_NT, P - j0);
        for (j = 0; j < n; j++) { /* K and V rows of the tile in f32, per-token-head scales applied */
            const char *kr = attn__cpu_krow(a, b->block_table, j0 + j, kh);
            float *kd = K + (size_t)j * (size_t)dpk, *vd = V + (size_t)j * (size_t)dpv;
            attn__row_to_f32(kr, a->kv_dtype, kd, a->dk, dpk);
            attn__row_to_f32(kr + vdelta, a->kv_dtype, vd, a->dv, dpv);
            if (a->row_scales) {
                const float ks = attn__cpu_row_scale(a, b->block_table, j0 + j, kh, 0);
                const float vs = attn__cpu_row_scale(a, b->block_table, j0 + j, kh, 1);
                for (x = 0; x < a->dk; x++) kd[x] *= ks;
                for (x = 0; x < a->dv; x++) vd[x] *= vs;
            }
        }
        attn__cpu_qk(Q, rows, K, n, dpk, S, ATTN__CPU_NT);
        req = 0; /* rows are in token order: a row's request only moves forward */
        for (i = 0; i < rows; i++) {
            float *sr = S + (size_t)i * ATTN__CPU_NT;
            if (cap > 0.0f)
                for (j = 0; j < n; j++) sr[j] = cap * tanhf(sr[j] / cap) * ATTN__LOG2E;
            if (a->alibi) {
                const int tok = c0 + i / group, head = kh * group + i % group;
                float slope, pos;
                while (b->query_start_loc[req + 1] <= tok) req++;
                pos = (float)(b->seq_lens[req] - (b->query_start_loc[req + 1] - b->query_start_loc[req]) +
                              (tok - b->query_start_loc[req]));
                slope = a->alibi[head] * ATTN__LOG2E;
                for (j = 0; j < n; j++) sr[j] += slope * ((float)(j0 + j) - pos);
            }
            alpha[i] = attn__cpu_softmax_row(sr, n, &m[i], &l[i]);
        }
        attn__cpu_pv(S, ATTN__CPU_NT, rows, V, dpv, n, dpv, O, alpha);
    }
    for (i = 0; i < rows; i++) {
        const int tok = c0 + i / group, head = kh * group + i % group;
        float *dst = cm->prefix_partial + ((size_t)tok * (size_t)d->num_heads + (size_t)head) * (size_t)(dpv + 2);
        for (x = 0; x < dpv; x++) dst[x] = O[(size_t)i * (size_t)dpv + x] * a->v_scale; /* v = code * v_scale */
        dst[dpv] = m[i];
        dst[dpv + 1] = l[i];
    }
}

/* Runs a schedule: the cascade's prefix tasks (when the build has a shared prefix), stage 1
   (tasks), then stage 2 (merges of split partials). */
static attn_status attn__cpu_execute(attn__cpu_run *a) {
    attn_status st = attn__scratch_reserve(a->ctx, a->cm->scratch_floats); /* reserved at create */
    if (st != ATTN_OK) return st;
    if (a->cm->num_prefix_tasks) attn__pool_run(a->ctx->pool, attn__cpu_prefix_run, a, a->cm->num_prefix_tasks);
    attn__pool_run(a->ctx->pool, attn__cpu_task_run, a, a->cm->num_tasks);
    if (a->cm->num_merges) attn__pool_run(a->ctx->pool, attn__cpu_merge_run, a, a->cm->num_merges);
    return ATTN_OK;
}

/* ---- entry points: forward, cache write, LSE merge --------------------------------------- */

/* Copies token rows of key/value into the standard cache; inputs already validated. (The
   CPU backends' cache writes; >>cpu.) */
static void attn__cpu_write_kv(const attn_layer *layer, const attn_tensor *k, const attn_tensor *v,
                           attn_tensor *kv, const int64_t *slots, int num_tokens, float k_scale, float v_scale) {
    const attn_layer_desc *d = &layer->desc;
    attn_tensor kr = attn__tensor_resolved(k), vr = attn__tensor_resolved(v);
    int64_t bs = d->block_size, hkv = d->num_kv_heads, hs = d->head_size;
    size_t esz = attn_dtype_size(d->kv_cache_dtype);
    int t, h;
    int64_t i;
    if (d->kv_scale_kind == ATTN_KV_SCALE_PER_TOKEN_HEAD) { /* codes of x / (amax / qmax), the scale beside */
        const float qmax = d->kv_cache_dtype == ATTN_DTYPE_INT8 ? 127.0f : 448.0f;
        const size_t half = (size_t)(bs * hkv) * (size_t)(hs + 4), plane = (size_t)(bs * hkv) * (size_t)hs;
        float row[512];
        for (t = 0; t < num_tokens; t++) {
            int64_t slot = slots[t];
            int kvi;
            if (slot < 0) continue;
            for (kvi = 0; kvi < 2; kvi++)
                for (h = 0; h < hkv; h++) {
                    const attn_tensor *src = kvi ? v : k;
                    const attn_tensor *rs = kvi ? &vr : &kr;
                    const char *p = (const char *)src->data +
                                    (size_t)(t * rs->strides[0] + h * rs->strides[1]) * attn_dtype_size(src->dtype);
                    char *base = (char *)kv->data + (size_t)(slot / bs) * 2 * half + (size_t)kvi * half;
                    size_t r = (size_t)((slot % bs) * hkv + h);
                    float amax = 0.0f, scale;
                    for (i = 0; i < hs; i++) {
                        float a;
                        row[i] = attn__load_elem(p, src->dtype, i);
                        a = fabsf(row[i]);
                        if (!(a <= amax) && amax == amax) amax = a; /* a NaN sticks */
                    }
                    scale = amax / qmax; /* NaN or inf rows read back NaN */
                    for (i = 0; i < hs; i++)
                        attn__store_elem(base + r * (size_t)hs, d->kv_cache_dtype, i, scale > 0.0f ? row[i] / scale : 0.0f);
                    memcpy(base + plane + r * 4, &scale, 4);
                }
        }
        return;
    }
    for (t = 0; t < num_tokens; t++) {
        int64_t slot = slots[t], blk, off;
        if (slot < 0) continue;
        blk = slot / bs;
        off = slot % bs;
        for (h = 0; h < hkv; h++) {
            int64_t kdst = (((blk * 2 + 0) * bs + off) * hkv + h) * hs;
            int64_t vdst = (((blk * 2 + 1) * bs + off) * hkv + h) * hs;
            const char *ks = (const char *)k->data + (size_t)(t * kr.strides[0] + h * kr.strides[1]) * attn_dtype_size(k->dtype);
            const char *vs = (const char *)v->data + (size_t)(t * vr.strides[0] + h * vr.strides[1]) * attn_dtype_size(v->dtype);
            if (attn__dtypes[d->kv_cache_dtype].cache_only) { /* fp8: x / scale, rounded, saturated */
                for (i = 0; i < hs; i++) {
                    attn__store_elem(kv->data, d->kv_cache_dtype, kdst + i, attn__load_elem(ks, k->dtype, i) / k_scale);
                    attn__store_elem(kv->data, d->kv_cache_dtype, vdst + i, attn__load_elem(vs, v->dtype, i) / v_scale);
                }
            } else if (k->dtype == d->kv_cache_dtype) {
                memcpy((char *)kv->data + (size_t)kdst * esz, ks, (size_t)hs * esz);
                memcpy((char *)kv->data + (size_t)vdst * esz, vs, (size_t)hs * esz);
            } else {
                for (i = 0; i < hs; i++) {
                    attn__store_elem(kv->data, d->kv_cache_dtype, kdst + i, attn__load_elem(ks, k->dtype, i));
                    attn__store_elem(kv->data, d->kv_cache_dtype, vdst + i, attn__load_elem(vs, v->dtype, i));
                }
            }
        }
    }
}

static attn_status attn__cpu_forward(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                     const attn_tensor *q, const attn_tensor *k,
                                     const attn_tensor *v, attn_tensor *kv_cache,
                                     attn_tensor *out, attn_tensor *lse, void *stream) {
    attn__cpu_run a;
    const attn_layer_desc *d = &layer->desc;
    attn_status st;
    (void)self;
    (void)stream;
    memset(&a, 0, sizeof a);
    a.ctx = layer->ctx;
    a.d = *d;
    a.alibi = layer->alibi;
    a.b = attn_metadata_batch(meta);
    a.cm = (const attn__cpu_meta *)attn_metadata_private(meta);
    a.dk = a.dv = d->head_size;
    a.dpk = a.dpv = attn__cpu_dp(d->head_size);
    a.kv = (const char *)kv_cache->data;
    a.kv_dtype = d->kv_cache_dtype;
    a.token_stride = (size_t)d->num_kv_heads * (size_t)d->head_size;
    a.block_stride = 2 * (size_t)d->block_size * a.token_stride;
    a.head_stride = (size_t)d->head_size;
    a.v_offset = (size_t)d->block_size * a.token_stride;
    if (d->kv_scale_kind == ATTN_KV_SCALE_PER_TOKEN_HEAD) { /* 1-byte codes, then the scale plane */
        a.row_scales = 1;
        a.scale_offset = (size_t)d->block_size * a.token_stride;
        a.v_offset = a.scale_offset + (size_t)d->block_size * (size_t)d->num_kv_heads * 4;
        a.block_stride = 2 * a.v_offset;
    }
    a.q = attn__tensor_resolved(q);
    a.out = attn__tensor_resolved(out);
    if (lse) { a.lse = attn__tensor_resolved(lse); a.has_lse = 1; }
    /* the scratch was reserved at metadata create; this only allocates when the metadata
       came from another context. Before the cache write, so a failure changes nothing. */
    st = attn__kv_scales(layer->ctx, d, "attn_layer_forward", &a.k_scale, &a.v_scale);
    if (st == ATTN_OK) st = attn__sinks_check(layer->ctx, d, "attn_layer_forward");
    if (st == ATTN_OK) st = attn__scratch_reserve(layer->ctx, a.cm->scratch_floats);
    if (st != ATTN_OK) return st;
    if (k && v)
        attn__cpu_write_kv(layer, k, v, kv_cache, a.b->slot_mapping, a.b->num_actual_tokens, a.k_scale, a.v_scale);
    return attn__cpu_execute(&a);
}

static attn_status attn__cpu_reshape_and_cache(const attn_backend *self, attn_layer *layer,
                                               const attn_tensor *key, const attn_tensor *value,
                                               attn_tensor *kv_cache, const attn_tensor *slot_mapping,
                                               void *stream) {
    float ks, vs;
    attn_status st = attn__kv_scales(layer->ctx, &layer->desc, "attn_reshape_and_cache", &ks, &vs);
    (void)self; (void)stream;
    if (st != ATTN_OK) return st;
    attn__cpu_write_kv(layer, key, value, kv_cache, (const int64_t *)slot_mapping->data, (int)slot_mapping->shape[0],
                       ks, vs);
    return ATTN_OK;
}

/* The LSE merge on the CPU, element by element (no buffer): weights from the two LSEs
   (base e), an empty side (-inf, or +inf/NaN as some kernels report it) contributes
   nothing whatever its output holds. out may alias out_a or out_b. */
static attn_status attn__cpu_merge_attn_states(const attn_backend *self, attn_context *ctx,
                                               const attn_tensor *out_a, const attn_tensor *lse_a,
                                               attn_lse_base base_a, const attn_tensor *out_b,
                                               const attn_tensor *lse_b, attn_lse_base base_b,
                                               attn_tensor *out, attn_tensor *lse,
                                               attn_lse_base base_out, void *stream) {
    attn_tensor oa = attn__tensor_resolved(out_a), ob = attn__tensor_resolved(out_b);
    attn_tensor oo = attn__tensor_resolved(out), la = attn__tensor_resolved(lse_a);
    attn_tensor lb = attn__tensor_resolved(lse_b), lo = lse ? attn__tensor_resolved(lse) : la;
    int64_t t, h, T = oa.shape[0], H = oa.shape[1];
    int D = (int)oa.shape[2], x;
    size_t esz = attn_dtype_size(oa.dtype);
    (void)self; (void)ctx; (void)stream;
    for (t = 0; t < T; t++)
        for (h = 0; h < H; h++) {
            float a = ((const float *)la.data)[t * la.strides[0] + h * la.strides[1]];
            float b = ((const float *)lb.data)[t * lb.strides[0] + h * lb.strides[1]];
            const char *pa = (const char *)oa.data + (size_t)(t * oa.strides[0] + h * oa.strides[1]) * esz;
            const char *pb = (const char *)ob.data + (size_t)(t * ob.strides[0] + h * ob.strides[1]) * esz;
            char *po = (char *)oo.data + (size_t)(t * oo.strides[0] + h * oo.strides[1]) * esz;
            float m, wa, wb, inv, l;
            if (base_a == ATTN_LSE_BASE_2) a *= ATTN__LN2;
            if (base_b == ATTN_LSE_BASE_2) b *= ATTN__LN2;
            if (!(a < INFINITY)) a = -INFINITY;
            if (!(b < INFINITY)) b = -INFINITY;
            m = a > b ? a : b;
            if (m == -INFINITY) { /* both empty */
                for (x = 0; x < D; x++) attn__store_elem(po, oo.dtype, x, 0.0f);
                l = -INFINITY;
            } else {
                wa = a == -INFINITY ? 0.0f : expf(a - m);
                wb = b == -INFINITY ? 0.0f : expf(b - m);
                inv = 1.0f / (wa + wb);
                for (x = 0; x < D; x++) { /* both loads before the store: out may alias */
                    float va = wa > 0.0f ? wa * attn__load_elem(pa, oa.dtype, x) : 0.0f;
                    float vb = wb > 0.0f ? wb * attn__load_elem(pb, ob.dtype, x) : 0.0f;
                    attn__store_elem(po, oo.dtype, x, (va + vb) * inv);
                }
                l = m + logf(wa + wb);
            }
            if (lse)
                ((float *)lo.data)[t * lo.strides[0] + h * lo.strides[1]] =
                    base_out == ATTN_LSE_BASE_2 ? l * ATTN__LOG2E : l;
        }
    return ATTN_OK;
}

/* ---- vtable ------------------------------------------------------------------------------ */

static int attn__cpu_kv_cache_shape(const attn_backend *self, const attn_layer_desc *d,
                                    int64_t num_blocks, int64_t shape[ATTN_MAX_DIMS]) {
    (void)self;
    shape[0] = num_blocks;
    shape[1] = 2;
    shape[2] = d->block_size;
    shape[3] = d->num_kv_heads;
    /* per-token-head scales: 4 bytes a row more, stored as a plane after the block half's
       rows (attn_kv_scale_kind) */
    shape[4] = d->head_size + (d->kv_scale_kind == ATTN_KV_SCALE_PER_TOKEN_HEAD ? 4 : 0);
    return 5;
}

static const attn_backend attn__cpu_backend = {
    "CPU",                    /* name */
    ATTN_BACKEND_CPU,         /* id */
    ATTN_DEVICE_CPU,          /* device */
    ATTN_DTYPE_BIT(ATTN_DTYPE_F32) | ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16),
    ATTN_DTYPE_BIT(ATTN_DTYPE_F32) | ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16) |
        ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E4M3) | ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E5M2) |
        ATTN_DTYPE_BIT(ATTN_DTYPE_INT8), /* caches: fp8 per tensor, int8 / fp8_e4m3 per token and head */
    8, 512, 8,                /* head sizes: multiples of 8 from 8 to 512 */
    16, 0,                    /* block sizes: any multiple of 16 */
    1, 1, 1, 1,               /* non-causal, sliding window, soft cap, ALiBi */
    1,                        /* attention sinks */
    1,                        /* cascade (common_prefix_len) */
    0,                        /* is_mla */
    ATTN_CUDA_GRAPH_NEVER,    /* no graphs on the CPU */
    1, ATTN_LSE_BASE_E,       /* returns LSE; its kernels work in base 2 and convert */
    NULL,                     /* check */
    NULL, NULL,               /* context_init/release: the context's threads suffice */
    NULL, NULL,               /* layer_init/release: nothing compiled per layer */
    attn__cpu_kv_cache_shape,
    attn__cpu_metadata_init,
    attn__cpu_metadata_release,
    attn__cpu_build,
    attn__cpu_forward,
    attn__cpu_reshape_and_cache,
    NULL, NULL, NULL, NULL,   /* MLA entry points: standard backend */
    attn__cpu_merge_attn_states,
    NULL                      /* sparse MLA: standard backend */
};

/* =======================================================================================
   >>cpu_mla
   MLA on the portable path (CPU_MLA): the latent cache, the decodes-first split-KV
   schedule, absorbed decode on the CPU runner, up-projected prefill in bounded chunks, the
   fused layer call. Projections use the same register-blocked kernels as a GEMM.
   ======================================================================================= */

/* ---- capabilities ------------------------------------------------------------------------ */

static int attn__cpu_mla_kv_cache_shape(const attn_backend *self, const attn_layer_desc *d,
                                    int64_t num_blocks, int64_t shape[ATTN_MAX_DIMS]) {
    (void)self;
    shape[0] = num_blocks;
    shape[1] = d->block_size;
    shape[2] = d->kv_cache_dtype == ATTN_DTYPE_FP8_DS_MLA ? ATTN__DS_MLA_ROW : d->head_size; /* bytes of a row */
    return 3;
}

static int attn__cpu_mla_check(const attn_backend *self, const attn_layer_desc *d,
                           const attn_platform *p, char *reason, size_t size) {
    (void)self; (void)p;
    if (!((d->kv_lora_rank == 512 || d->kv_lora_rank == 256) && d->qk_rope_head_dim == 64)) {
        attn__fmt(reason, size, "head_size %d (kv_lora_rank %d + qk_rope_head_dim %d) not "
                  "supported (576 = 512 + 64, or 320 = 256 + 64)", d->head_size,
                  d->kv_lora_rank, d->qk_rope_head_dim);
        return 1;
    }
    if (d->qk_nope_head_dim % 8 || d->v_head_dim % 8 || d->qk_nope_head_dim > 512 || d->v_head_dim > 512) {
        attn__fmt(reason, size, "qk_nope_head_dim %d / v_head_dim %d not supported (multiples "
                  "of 8 up to 512)", d->qk_nope_head_dim, d->v_head_dim);
        return 1;
    }
    if (d->kv_scale_kind != ATTN_KV_SCALE_PER_TENSOR) {
        attn__fmt(reason, size, "per-token-head scales not supported (allowed for the latent: per-tensor "
                  "fp8, kv_scale_kind PER_TENSOR with k_scale)");
        return 1;
    }
    return 0;
}

/* ---- workspace: one layout that sizes and carves ----------------------------------------- */

#define ATTN__CPU_MLA_TILE 32

/* The MLA workspace of one metadata: forward_mha's chunk (latents, up-projected K/V, the
   running outputs of a group of queries) and the fused call's latent query/output. The
   fused call runs its decodes before its prefills, so the two phases share the memory.
   One layout sizes (base NULL) and carves; returns the floats it needs. */
typedef struct attn__cpu_mla_ws {
    float *latc, *latpe, *kw, *vw, *state; /* forward_mha */
    float *ql, *ol;                        /* fused decode: [decode tokens][H][R] each */
    int chunk;                             /* keys up-projected per pass */
    int group;                             /* query tokens whose running state fits */
} attn__cpu_mla_ws;

/* A piece of n floats of the CPU MLA workspace, 64-byte aligned. */
static float *attn__cpu_mla_piece(void *base, size_t *used, size_t n) {
    return (float *)attn__carve(base, used, n * sizeof(float), 64);
}

static int attn__cpu_mla_decode_tokens(const attn_metadata_desc *cap) {
    return (int)ATTN__MIN((int64_t)cap->max_num_tokens, (int64_t)cap->max_num_reqs * cap->decode_threshold);
}

static size_t attn__cpu_mla_ws_layout(const attn_layer_desc *d, const attn_metadata_desc *cap, void *base,
                                  attn__cpu_mla_ws *w) {
    size_t H = (size_t)d->num_heads, R = (size_t)d->kv_lora_rank, P = (size_t)d->qk_rope_head_dim;
    size_t dpk = (size_t)attn__cpu_dp(d->qk_nope_head_dim + d->qk_rope_head_dim);
    size_t dpv = (size_t)attn__cpu_dp(d->v_head_dim), pre = 0, dec = 0, td;
    int64_t group = cap->workspace_bytes / (int64_t)(H * (dpv + 1) * 4);
    group = ATTN__MIN(group, (int64_t)cap->max_num_tokens + ATTN__CPU_MLA_TILE - 1) / ATTN__CPU_MLA_TILE * ATTN__CPU_MLA_TILE;
    w->chunk = attn__mla_prefill_chunk(d, cap->workspace_bytes, ATTN_DEVICE_CPU);
    w->group = (int)ATTN__MAX(ATTN__CPU_MLA_TILE, group);
    w->latc = attn__cpu_mla_piece(base, &pre, (size_t)w->chunk * R);
    w->latpe = attn__cpu_mla_piece(base, &pre, (size_t)w->chunk * P);
    w->kw = attn__cpu_mla_piece(base, &pre, H * (size_t)w->chunk * dpk);
    w->vw = attn__cpu_mla_piece(base, &pre, H * (size_t)w->chunk * dpv);
    w->state = attn__cpu_mla_piece(base, &pre, (size_t)w->group * H * (dpv + 1));
    td = (size_t)attn__cpu_mla_decode_tokens(cap);
    w->ql = attn__cpu_mla_piece(base, &dec, td * H * R);
    w->ol = attn__cpu_mla_piece(base, &dec, td * H * R);
    return ATTN__MAX(pre, dec);
}

/* Per-thread scratch of forward_mha's two kinds of task and of the fused projections. */
static size_t attn__cpu_mla_scratch_floats(const attn_layer_desc *d, int decode_tokens) {
    size_t R = (size_t)d->kv_lora_rank, N = (size_t)d->qk_nope_head_dim, td = (size_t)decode_tokens;
    size_t dpk = (size_t)attn__cpu_dp(d->qk_nope_head_dim + d->qk_rope_head_dim);
    size_t dpv = (size_t)attn__cpu_dp(d->v_head_dim);
    size_t mha = ATTN__MAX(N * R + R * dpv, (size_t)ATTN__CPU_MLA_TILE * (dpk + dpv + ATTN__CPU_NT + 3));
    size_t proj = ATTN__MAX(N * R + td * (N + R), R * dpv + td * (R + dpv));
    return ATTN__MAX(mha, proj) + 64;
}

/* ---- schedule ---------------------------------------------------------------------------- */

static attn_status attn__cpu_mla_metadata_init(const attn_backend *self, attn_layer *layer, attn_metadata *meta) {
    const attn_layer_desc *d = &layer->desc;
    const attn_metadata_desc *cap = attn_metadata_capacity(meta);
    int splits = cap->num_kv_splits; /* the most any batch of this capacity gets */
    int64_t td = attn__cpu_mla_decode_tokens(cap);
    attn__cpu_meta *cm = NULL;
    attn__cpu_mla_ws ws;
    size_t scratch;
    attn_status st;
    (void)self;
    st = attn__cpu_meta_attach(layer, meta, (int64_t)cap->max_num_reqs * splits, cap->max_num_reqs,
                               (int64_t)cap->decode_threshold * d->num_heads, ATTN__CPU_NT,
                               splits > 1 ? td * d->num_heads * splits : 0, attn__cpu_dp(d->kv_lora_rank), &cm);
    if (st != ATTN_OK) return st;
    cm->workspace_bytes = attn__cpu_mla_ws_layout(d, cap, NULL, &ws);
    cm->workspace = attn__malloc(cm->workspace_bytes + 64);
    cm->workspace_base = (void *)(((uintptr_t)cm->workspace + 63) & ~(uintptr_t)63);
    if (!cm->workspace) {
        size_t bytes = cm->workspace_bytes;
        attn__cpu_metadata_release(self, meta);
        return attn__fail(layer->ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_metadata_create: cannot allocate the MLA workspace (%zu bytes; "
                          "desc.workspace_bytes bounds it)", bytes);
    }
    scratch = ATTN__MAX(attn__cpu_scratch_floats(cm, attn__cpu_dp(d->head_size), attn__cpu_dp(d->kv_lora_rank)),
                        attn__cpu_mla_scratch_floats(d, (int)td));
    return attn__cpu_meta_reserve(layer, meta, cm, scratch);
}

/* The split-KV schedule of the decodes (the batch lists them first): every decode request
   gets num_kv_splits tasks over its keys, merged by LSE. */
static attn_status attn__cpu_mla_build(const attn_backend *self, attn_layer *layer, attn_metadata *meta,
                                   int common_prefix_len, int fast_build) {
    attn__cpu_meta *cm = (attn__cpu_meta *)attn_metadata_private(meta);
    const attn_batch *b = attn_metadata_batch(meta);
    attn_mla_info info;
    int r, nt = 0, nm = 0, prows = 0;
    attn_status st;
    (void)self;
    (void)common_prefix_len;
    (void)fast_build;
    const attn_metadata_desc *cap = attn_metadata_capacity(meta);
    memset(&info, 0, sizeof info);
    cm->dcp_w = cap->dcp_world_size; cm->dcp_r = cap->dcp_rank; cm->dcp_i = cap->dcp_interleave;
    st = attn_metadata_mla_info(meta, &info);
    if (st != ATTN_OK) return st;
    for (r = 0; r < info.num_decodes; r++) {
        int ql = b->query_start_loc[r + 1] - b->query_start_loc[r];
        if (ql == 0) continue;
        attn__cpu_emit(cm, &nt, &nm, &prows, r, 0, 1, 0, ql, 0, attn__dcp_len(cap, b->seq_lens[r]), info.num_kv_splits,
                       ql * layer->desc.num_heads);
    }
    return attn__cpu_schedule_finish(cm, nt, nm, prows);
}

/* ---- decode (forward_mqa) ---------------------------------------------------------------- */

static attn_status attn__cpu_mla_forward_mqa(const attn_backend *self, attn_layer *layer,
                                             const attn_metadata *meta, const attn_tensor *q,
                                             const attn_tensor *q_pe, const attn_tensor *kv_cache,
                                             attn_tensor *out_latent, attn_tensor *lse, void *stream) {
    const attn_layer_desc *d = &layer->desc;
    attn__cpu_run a;
    (void)self;
    (void)stream;
    memset(&a, 0, sizeof a);
    a.ctx = layer->ctx;
    a.d = *d;
    a.d.num_kv_heads = 1;
    a.b = attn_metadata_batch(meta);
    a.cm = (const attn__cpu_meta *)attn_metadata_private(meta);
    a.dk = d->head_size;
    a.dv = d->kv_lora_rank;
    a.dpk = attn__cpu_dp(a.dk);
    a.dpv = attn__cpu_dp(a.dv);
    a.kv = (const char *)kv_cache->data;
    a.kv_dtype = d->kv_cache_dtype;
    a.token_stride = (size_t)d->head_size;
    a.block_stride = (size_t)d->block_size * a.token_stride;
    a.v_in_k = 1;
    a.q = attn__tensor_resolved(q);
    if (q_pe) { a.q2 = attn__tensor_resolved(q_pe); a.q_split = d->kv_lora_rank; }
    a.out = attn__tensor_resolved(out_latent);
    if (lse) { a.lse = attn__tensor_resolved(lse); a.has_lse = 1; }
    {
        attn_status st = attn__kv_scales(layer->ctx, d, "attn_mla_forward_mqa", &a.k_scale, &a.v_scale);
        if (st != ATTN_OK) return st;
    }
    return attn__cpu_execute(&a);
}

/* ---- sparse MLA (forward_sparse) --------------------------------------------------------- */

/* One task: a query token and a group of ATTN__CPU_SPARSE_HEADS heads. Its indices' latent
   rows are gathered into the thread's scratch as f32 (dequantized: fp8 by the layer's
   scale, fp8_ds_mla by its rows' scales), then the group's heads attend them chunk by chunk
   (ATTN__CPU_SPARSE_CHUNK keys, in L2 while every head of the group passes over them) with
   an online softmax: s_j = q . k_j * scale, out = sum softmax(s)_j k_j[0 .. R), the sink
   in the denominator. */
#define ATTN__CPU_SPARSE_HEADS 16
#define ATTN__CPU_SPARSE_CHUNK 64 /* keys a head group attends at a time (64 x 576 f32: 147 KiB, L2) */

typedef struct attn__cpu_sparse {
    attn_context *ctx;
    const attn_layer_desc *d;
    const attn_batch *b;
    attn_tensor q, q2, out, lse, idx;
    int has_q2, has_lse, topk, groups;
    const char *kv;
    float k_scale;
    float e4m3[256];               /* fp8_ds_mla: every e4m3 code's value */
} attn__cpu_sparse;

static void attn__cpu_sparse_run(void *varg, int task, int thread) {
    const attn__cpu_sparse *a = (const attn__cpu_sparse *)varg;
    const attn_layer_desc *d = a->d;
    const int t = task / a->groups, h0 = (task % a->groups) * ATTN__CPU_SPARSE_HEADS;
    const int h1 = ATTN__MIN(d->num_heads, h0 + ATTN__CPU_SPARSE_HEADS);
    const int D = d->head_size, R = d->kv_lora_rank, r = attn__token_request(a->b, t);
    const int32_t *bt = a->b->block_table + (size_t)r * (size_t)a->b->block_table_stride;
    const int32_t *ix = (const int32_t *)a->idx.data + (size_t)t * (size_t)a->idx.strides[0];
    const size_t rb = attn__mla_row_bytes(d), qsz = attn_dtype_size(a->q.dtype), osz = attn_dtype_size(a->out.dtype);
    float *K = a->ctx->scratch[thread], *S = K + (size_t)a->topk * (size_t)D, *o = S + ATTN__CPU_SPARSE_CHUNK;
    int n = 0, k, h, j, x;
    for (k = 0; k < a->topk; k++) { /* gather the valid rows */
        const int p = ix[k];
        const char *row;
        float *dst = K + (size_t)n * (size_t)D;
        if (p < 0 || p >= a->b->seq_lens[r]) continue; /* padding (the front door refused the rest) */
        row = a->kv + ((size_t)bt[p / d->block_size] * (size_t)d->block_size + (size_t)(p % d->block_size)) * rb;
        if (d->kv_cache_dtype == ATTN_DTYPE_FP8_DS_MLA) {
            attn__ds_mla_row_load((const uint8_t *)row, dst, a->e4m3);
        } else {
            attn__row_to_f32(row, d->kv_cache_dtype, dst, D, D);
            if (a->k_scale != 1.0f)
                for (x = 0; x < D; x++) dst[x] *= a->k_scale;
        }
        n++;
    }
    { /* keys in chunks that stay in L2 across the group's heads: online softmax per head */
        const int nh = h1 - h0;
        float *Q = o, *O = Q + (size_t)nh * (size_t)D, *M = O + (size_t)nh * (size_t)R, *L = M + nh;
        for (h = 0; h < nh; h++) { /* the group's query rows (f32), running max, sum and output */
            const char *qr = (const char *)a->q.data + (size_t)(t * a->q.strides[0] + (h0 + h) * a->q.strides[1]) * qsz;
            float *qf2 = Q + (size_t)h * (size_t)D;
            if (a->has_q2) {
                const char *pr = (const char *)a->q2.data + (size_t)(t * a->q2.strides[0] + (h0 + h) * a->q2.strides[1]) * qsz;
                attn__row_to_f32(qr, a->q.dtype, qf2, R, R);
                attn__row_to_f32(pr, a->q2.dtype, qf2 + R, D - R, D - R);
            } else {
                attn__row_to_f32(qr, a->q.dtype, qf2, D, D);
            }
            M[h] = -INFINITY;
            L[h] = 0.0f;
            for (x = 0; x < R; x++) O[(size_t)h * (size_t)R + x] = 0.0f;
        }
        for (k = 0; k < n; k += ATTN__CPU_SPARSE_CHUNK) {
            const int kn = ATTN__MIN(ATTN__CPU_SPARSE_CHUNK, n - k);
            for (h = 0; h < nh; h++) {
                float mx = M[h], alpha, *oh = O + (size_t)h * (size_t)R;
                for (j = 0; j < kn; j++) {
                    S[j] = attn__dot(Q + (size_t)h * (size_t)D, K + (size_t)(k + j) * (size_t)D, D) * d->scale;
                    mx = ATTN__MAX(mx, S[j]);
                }
                alpha = M[h] == -INFINITY ? 0.0f : expf(M[h] - mx);
                if (alpha != 1.0f) {
                    const attn__vf av = attn__vset1(alpha);
                    for (x = 0; x < R; x += ATTN__W) attn__vst(oh + x, attn__vmul(av, attn__vld(oh + x)));
                }
                L[h] *= alpha;
                M[h] = mx;
                for (j = 0; j < kn; j++) {
                    const float pj = expf(S[j] - mx), *kv = K + (size_t)(k + j) * (size_t)D;
                    const attn__vf pv = attn__vset1(pj);
                    L[h] += pj;
                    for (x = 0; x < R; x += ATTN__W) attn__vst(oh + x, attn__vfma(pv, attn__vld(kv + x), attn__vld(oh + x)));
                }
            }
        }
        for (h = 0; h < nh; h++) { /* the sink joins the denominator; out and lse */
            float m = M[h], l = L[h], w = 1.0f, inv, lse, *oh = O + (size_t)h * (size_t)R;
            char *orow = (char *)a->out.data + (size_t)(t * a->out.strides[0] + (h0 + h) * a->out.strides[1]) * osz;
            if (d->sinks) {
                const float sk = d->sinks[h0 + h], mx = ATTN__MAX(m, sk);
                w = m == -INFINITY ? 0.0f : expf(m - mx);
                l = l * w + expf(sk - mx);
                m = mx;
            }
            inv = l > 0.0f && n > 0 ? w / l : 0.0f; /* no key: out 0 (a sink alone weighs nothing) */
            for (x = 0; x < R; x++) oh[x] *= inv;
            attn__row_from_f32(oh, a->out.dtype, orow, R);
            lse = l > 0.0f ? m + logf(l) : -INFINITY;
            if (a->has_lse) ((float *)a->lse.data)[t * a->lse.strides[0] + (h0 + h) * a->lse.strides[1]] = lse;
        }
    }
}

static attn_status attn__cpu_mla_forward_sparse(const attn_backend *self, attn_layer *layer,
                                                const attn_metadata *meta, const attn_tensor *q,
                                                const attn_tensor *q_pe, const attn_tensor *kv_cache,
                                                const attn_tensor *indices, attn_tensor *out_latent,
                                                attn_tensor *lse, void *stream) {
    const attn_layer_desc *d = &layer->desc;
    attn__cpu_sparse a;
    float vs;
    attn_status st;
    int i;
    (void)self;
    (void)stream;
    memset(&a, 0, sizeof a);
    a.ctx = layer->ctx;
    a.d = d;
    a.b = attn_metadata_batch(meta);
    a.q = attn__tensor_resolved(q);
    if (q_pe) { a.q2 = attn__tensor_resolved(q_pe); a.has_q2 = 1; }
    a.out = attn__tensor_resolved(out_latent);
    if (lse) { a.lse = attn__tensor_resolved(lse); a.has_lse = 1; }
    a.idx = attn__tensor_resolved(indices);
    a.topk = (int)indices->shape[1];
    a.groups = (d->num_heads + ATTN__CPU_SPARSE_HEADS - 1) / ATTN__CPU_SPARSE_HEADS;
    a.kv = (const char *)kv_cache->data;
    for (i = 0; i < 256; i++) a.e4m3[i] = attn_fp8_e4m3_to_f32((uint8_t)i);
    if ((st = attn__kv_scales(layer->ctx, d, "attn_mla_forward_sparse", &a.k_scale, &vs)) != ATTN_OK) return st;
    /* K [topk][D], S [chunk], then the group's Q [heads][D], O [heads][R], M, L */
    st = attn__scratch_reserve(layer->ctx, (size_t)a.topk * (size_t)d->head_size + ATTN__CPU_SPARSE_CHUNK +
                                               (size_t)ATTN__CPU_SPARSE_HEADS * (size_t)(d->head_size + d->kv_lora_rank + 2) + 64);
    if (st != ATTN_OK) return st;
    attn__pool_run(layer->ctx->pool, attn__cpu_sparse_run, &a, a.b->num_actual_tokens * a.groups);
    return ATTN_OK;
}

/* ---- projections: C = A . B through the attention kernels -------------------------------- */

/* B (rows x cols, of dtype dt, row stride ldb elements) -> dst f32 with row stride ldd. */
static void attn__cpu_matrix_to_f32(const void *src, attn_dtype dt, int rows, int cols, int64_t ldb,
                                float *dst, int ldd) {
    int r;
    size_t esz = attn_dtype_size(dt);
    for (r = 0; r < rows; r++)
        attn__row_to_f32((const char *)src + (size_t)r * (size_t)ldb * esz, dt, dst + (size_t)r * (size_t)ldd, cols, ldd);
}

/* C[M][N] (row stride N, a multiple of W) = A[M][K] (ld lda) . B[K][N] (ld N): the PV
   kernel starting from zero. */
static void attn__cpu_gemm_nn(const float *A, int lda, int M, const float *B, int K, int N, float *C) {
    attn__cpu_pv(A, lda, M, B, N, K, N, C, NULL);
}

/* C[M][N] (ld ldc) = A[M][K] (ld K) . B[N][K]^T (ld K): the QK kernel, in strips of keys. */
static void attn__cpu_gemm_nt(const float *A, int M, const float *B, int N, int K, float *C, int ldc) {
    int n0;
    for (n0 = 0; n0 < N; n0 += ATTN__CPU_NT)
        attn__cpu_qk(A, M, B + (size_t)n0 * (size_t)K, ATTN__MIN(ATTN__CPU_NT, N - n0), K, C + n0, ldc);
}

/* The LSE merge of one row: (o, l) and (ob, lb), base-e LSEs; result into (o, l). */
static void attn__cpu_lse_merge_row(float *o, float *l, const float *ob, float lb, int n) {
    float la = *l, m = la > lb ? la : lb, wa, wb, inv;
    int x;
    if (m == -INFINITY) { /* both empty */
        for (x = 0; x < n; x++) o[x] = 0.0f;
        *l = -INFINITY;
        return;
    }
    wa = la == -INFINITY ? 0.0f : expf(la - m);
    wb = lb == -INFINITY ? 0.0f : expf(lb - m);
    inv = 1.0f / (wa + wb);
    /* an empty side contributes nothing, whatever its (possibly NaN) output holds */
    for (x = 0; x < n; x++)
        o[x] = ((wa > 0.0f ? wa * o[x] : 0.0f) + (wb > 0.0f ? wb * ob[x] : 0.0f)) * inv;
    *l = m + logf(wa + wb);
}

/* ---- prefill (forward_mha): up-projected chunks merged by LSE ---------------------------- */

typedef struct attn__cpu_mla_prefill_run {
    attn_layer *layer;
    const attn_batch *b;
    int req, c0, c1;               /* request and the chunk of keys [c0, c1) */
    const float *latc, *latpe;     /* the chunk's latents, f32: [keys][kv_lora_rank], [keys][rope] */
    const attn_tensor *w_uk, *w_uv;
    float *kw, *vw;                /* [heads][chunk][dpk] / [heads][chunk][dpv] */
    int chunk, dpk, dpv;
    attn_tensor q, q2;             /* q [..][H][nope+rope], or q_nope + q_pe when q_split */
    int q_split;
    int row0;                      /* batch token of q row 0 */
    float *state;                  /* per prefill row (token-major, head-minor): [dpv + 1] */
    int state_row0;                /* batch token of state row 0 */
    int g0, gq;                    /* the group of the request's queries: [g0, g0 + gq) */
    int ntiles;                    /* query tiles of the group per head */
    const attn_metadata_desc *cap; /* DCP: keys are local indices (attn__dcp_len) */
} attn__cpu_mla_prefill_run;

/* Up-projects the chunk for one head: K = [lat . W_UK[h]^T | k_pe], V = lat . W_UV[h]. */
static void attn__cpu_mla_project(void *varg, int h, int thread) {
    const attn__cpu_mla_prefill_run *a = (const attn__cpu_mla_prefill_run *)varg;
    const attn_layer_desc *d = &a->layer->desc;
    int R = d->kv_lora_rank, P = d->qk_rope_head_dim, N = d->qk_nope_head_dim, Vd = d->v_head_dim;
    int n = a->c1 - a->c0, j;
    float *base = (float *)(void *)(((uintptr_t)a->layer->ctx->scratch[thread] + 63) & ~(uintptr_t)63);
    float *wk = base, *wv = wk + (size_t)N * (size_t)R;
    attn_tensor uk = attn__tensor_resolved(a->w_uk), uv = attn__tensor_resolved(a->w_uv);
    size_t esz = attn_dtype_size(uk.dtype);
    float *K = a->kw + (size_t)h * (size_t)a->chunk * (size_t)a->dpk;
    float *V = a->vw + (size_t)h * (size_t)a->chunk * (size_t)a->dpv;
    attn__cpu_matrix_to_f32((const char *)uk.data + (size_t)(h * uk.strides[0]) * esz, uk.dtype, N, R, uk.strides[1], wk, R);
    attn__cpu_matrix_to_f32((const char *)uv.data + (size_t)(h * uv.strides[0]) * esz, uv.dtype, R, Vd, uv.strides[1], wv, a->dpv);
    attn__cpu_gemm_nt(a->latc, n, wk, N, R, K, a->dpk);        /* K_nope = latent . W_UK[h]^T */
    for (j = 0; j < n; j++) {                               /* K = [K_nope | k_pe] */
        int x;
        memcpy(K + (size_t)j * (size_t)a->dpk + N, a->latpe + (size_t)j * (size_t)P, (size_t)P * sizeof(float));
        for (x = N + P; x < a->dpk; x++) K[(size_t)j * (size_t)a->dpk + x] = 0.0f;
    }
    attn__cpu_gemm_nn(a->latc, R, n, wv, R, a->dpv, V);       /* V = latent . W_UV[h] */
}

/* Attention of one (head, query tile) against the chunk, merged into the running state. */
static void attn__cpu_mla_attend(void *varg, int task, int thread) {
    const attn__cpu_mla_prefill_run *a = (const attn__cpu_mla_prefill_run *)varg;
    const attn_layer_desc *d = &a->layer->desc;
    const attn_batch *b = a->b;
    int H = d->num_heads, h = task / a->ntiles, tile = task % a->ntiles;
    int dk = d->qk_nope_head_dim + d->qk_rope_head_dim, Vd = d->v_head_dim;
    int q0 = b->query_start_loc[a->req], ql = b->query_start_loc[a->req + 1] - q0;
    int sl = b->seq_lens[a->req], t0 = a->g0 + tile * ATTN__CPU_MLA_TILE;
    int t1 = ATTN__MIN(a->g0 + a->gq, t0 + ATTN__CPU_MLA_TILE);
    int rows = t1 - t0, i, j, j0, n;
    float *base = (float *)(void *)(((uintptr_t)a->layer->ctx->scratch[thread] + 63) & ~(uintptr_t)63);
    float *Q = base, *O = Q + (size_t)ATTN__CPU_MLA_TILE * (size_t)a->dpk;
    float *S = O + (size_t)ATTN__CPU_MLA_TILE * (size_t)a->dpv, *m = S + (size_t)ATTN__CPU_MLA_TILE * ATTN__CPU_NT;
    float *l = m + ATTN__CPU_MLA_TILE, *alpha = l + ATTN__CPU_MLA_TILE;
    const float *K = a->kw + (size_t)h * (size_t)a->chunk * (size_t)a->dpk;
    const float *V = a->vw + (size_t)h * (size_t)a->chunk * (size_t)a->dpv;
    float qscale = d->scale * ATTN__LOG2E;
    int last_pos = sl - ql + t1 - 1, lim = attn__dcp_len(a->cap, last_pos + 1); /* local keys [0, lim) */
    if (rows <= 0 || a->c0 >= lim) return; /* the whole chunk is in this tile's future */
    for (i = 0; i < rows; i++) {
        int tok = q0 + t0 + i;
        float *qr = Q + (size_t)i * (size_t)a->dpk;
        size_t qsz = attn_dtype_size(a->q.dtype);
        if (a->q_split) {
            size_t q2sz = attn_dtype_size(a->q2.dtype);
            attn__row_to_f32((const char *)a->q.data + (size_t)((tok - a->row0) * a->q.strides[0] + h * a->q.strides[1]) * qsz,
                             a->q.dtype, qr, a->q_split, a->q_split);
            attn__row_to_f32((const char *)a->q2.data + (size_t)((tok - a->row0) * a->q2.strides[0] + h * a->q2.strides[1]) * q2sz,
                             a->q2.dtype, qr + a->q_split, dk - a->q_split, a->dpk - a->q_split);
        } else {
            attn__row_to_f32((const char *)a->q.data + (size_t)((tok - a->row0) * a->q.strides[0] + h * a->q.strides[1]) * qsz,
                             a->q.dtype, qr, dk, a->dpk);
        }
        for (j = 0; j < dk; j++) qr[j] *= qscale;
        memset(O + (size_t)i * (size_t)a->dpv, 0, (size_t)a->dpv * sizeof(float));
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    for (j0 = a->c0; j0 < ATTN__MIN(a->c1, lim); j0 += ATTN__CPU_NT) {
        n = ATTN__MIN(ATTN__CPU_NT, ATTN__MIN(a->c1, lim) - j0);
        attn__cpu_qk(Q, rows, K + (size_t)(j0 - a->c0) * (size_t)a->dpk, n, a->dpk, S, ATTN__CPU_NT);
        for (i = 0; i < rows; i++) {
            float *s = S + (size_t)i * ATTN__CPU_NT;
            int hi = attn__dcp_len(a->cap, sl - ql + t0 + i + 1); /* the row sees local keys [0, hi) */
            if (j0 + n > hi)
                for (j = 0; j < n; j++) if (j0 + j >= hi) s[j] = -INFINITY;
            alpha[i] = attn__cpu_softmax_row(s, n, &m[i], &l[i]);
        }
        attn__cpu_pv(S, ATTN__CPU_NT, rows, V + (size_t)(j0 - a->c0) * (size_t)a->dpv, a->dpv, n, a->dpv, O, alpha);
    }
    /* this chunk's partial (normalised output, base-e LSE) merged into the running state */
    for (i = 0; i < rows; i++) {
        int tok = q0 + t0 + i, x;
        float *st = a->state + ((size_t)(tok - a->state_row0) * (size_t)H + (size_t)h) * (size_t)(a->dpv + 1);
        float lse_c = l[i] > 0.0f ? (m[i] + log2f(l[i])) * ATTN__LN2 : -INFINITY;
        float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        float *o = O + (size_t)i * (size_t)a->dpv;
        for (x = 0; x < Vd; x++) o[x] *= inv;
        attn__cpu_lse_merge_row(st, &st[a->dpv], o, lse_c, Vd);
    }
}

/* Prefill of the batch's prefill requests; q rows start at batch token row0. Output rows
   and lse are written for batch tokens from the first prefill token. A request's queries
   go in groups whose running outputs fit the workspace; each group walks the chunks of
   keys it can see (a group past the first re-projects them: only for prefills longer
   than attn__cpu_mla_ws.group tokens). */
static attn_status attn__cpu_mla_prefill(attn_layer *layer, const attn_metadata *meta, const attn_tensor *q,
                                 const attn_tensor *q2, int q_split, int row0,
                                 const attn_tensor *kv_cache, const attn_tensor *w_uk,
                                 const attn_tensor *w_uv, const attn_tensor *out, int out_row0,
                                 const attn_tensor *lse) {
    const attn_layer_desc *d = &layer->desc;
    const attn__cpu_meta *cm = (const attn__cpu_meta *)attn_metadata_private(meta);
    const attn_batch *b = attn_metadata_batch(meta);
    int H = d->num_heads, R = d->kv_lora_rank, P = d->qk_rope_head_dim, LD = R + P;
    attn_mla_info info;
    attn__cpu_mla_ws ws;
    attn__cpu_mla_prefill_run a;
    attn_tensor o = attn__tensor_resolved(out), ls;
    attn_status st;
    memset(&info, 0, sizeof info);
    st = attn_metadata_mla_info(meta, &info);
    size_t csz = attn_dtype_size(d->kv_cache_dtype), osz = attn_dtype_size(o.dtype);
    int r, i;
    if (st != ATTN_OK || info.num_prefill_tokens <= 0) return st;
    float ks = 1.0f, vs;
    attn__cpu_mla_ws_layout(d, attn_metadata_capacity(meta), cm->workspace_base, &ws);
    st = attn__kv_scales(layer->ctx, d, "attn_mla_forward_mha", &ks, &vs);
    if (st == ATTN_OK) st = attn__scratch_reserve(layer->ctx, cm->scratch_floats); /* reserved at create */
    if (st != ATTN_OK) return st;
    memset(&a, 0, sizeof a);
    a.layer = layer;
    a.b = b;
    a.chunk = ws.chunk;
    a.dpk = attn__cpu_dp(d->qk_nope_head_dim + P);
    a.dpv = attn__cpu_dp(d->v_head_dim);
    a.w_uk = w_uk;
    a.w_uv = w_uv;
    a.q = attn__tensor_resolved(q);
    if (q2) { a.q2 = attn__tensor_resolved(q2); a.q_split = q_split; }
    a.row0 = row0;
    a.latc = ws.latc; a.latpe = ws.latpe; a.kw = ws.kw; a.vw = ws.vw; a.state = ws.state;
    a.cap = attn_metadata_capacity(meta);
    ls = lse ? attn__tensor_resolved(lse) : o;
    for (r = info.num_decodes; r < b->num_reqs; r++) {
        int q0 = b->query_start_loc[r], ql = b->query_start_loc[r + 1] - q0, sl = b->seq_lens[r];
        const int32_t *bt = b->block_table + (size_t)r * (size_t)b->block_table_stride;
        a.req = r;
        for (a.g0 = 0; a.g0 < ql; a.g0 += ws.group) {
            int c0, last_key;
            a.gq = ATTN__MIN(ws.group, ql - a.g0);
            a.ntiles = (a.gq + ATTN__CPU_MLA_TILE - 1) / ATTN__CPU_MLA_TILE;
            a.state_row0 = q0 + a.g0;
            last_key = attn__dcp_len(a.cap, sl - ql + a.g0 + a.gq) - 1; /* causal: the group sees (local)
                                                                          keys 0..last_key */
            for (i = 0; i < a.gq * H; i++) {
                float *sr = ws.state + (size_t)i * (size_t)(a.dpv + 1);
                memset(sr, 0, (size_t)a.dpv * sizeof(float));
                sr[a.dpv] = -INFINITY;
            }
            for (c0 = 0; c0 <= last_key; c0 += ws.chunk) {
                int c1 = ATTN__MIN(last_key + 1, c0 + ws.chunk), j;
                for (j = c0; j < c1; j++) {
                    size_t blk = (size_t)bt[j / d->block_size], off = (size_t)(j % d->block_size);
                    const char *row = (const char *)kv_cache->data + (blk * (size_t)d->block_size + off) * (size_t)LD * csz;
                    attn__row_to_f32(row, d->kv_cache_dtype, ws.latc + (size_t)(j - c0) * (size_t)R, R, R);
                    attn__row_to_f32(row + (size_t)R * csz, d->kv_cache_dtype, ws.latpe + (size_t)(j - c0) * (size_t)P, P, P);
                    if (ks != 1.0f) { /* fp8: latent = code * scale */
                        float *lc = ws.latc + (size_t)(j - c0) * (size_t)R, *lp = ws.latpe + (size_t)(j - c0) * (size_t)P;
                        int x;
                        for (x = 0; x < R; x++) lc[x] *= ks;
                        for (x = 0; x < P; x++) lp[x] *= ks;
                    }
                }
                a.c0 = c0;
                a.c1 = c1;
                attn__pool_run(layer->ctx->pool, attn__cpu_mla_project, &a, H);
                attn__pool_run(layer->ctx->pool, attn__cpu_mla_attend, &a, H * a.ntiles);
            }
            for (i = 0; i < a.gq; i++) {
                int tok = a.state_row0 + i, h;
                for (h = 0; h < H; h++) {
                    const float *sr = ws.state + ((size_t)i * (size_t)H + (size_t)h) * (size_t)(a.dpv + 1);
                    attn__row_from_f32(sr, o.dtype,
                                       (char *)o.data + (size_t)((tok - out_row0) * o.strides[0] + h * o.strides[1]) * osz,
                                       d->v_head_dim);
                    if (lse) ((float *)ls.data)[(tok - out_row0) * ls.strides[0] + h * ls.strides[1]] = sr[a.dpv];
                }
            }
        }
    }
    return ATTN_OK;
}

static attn_status attn__cpu_mla_forward_mha(const attn_backend *self, attn_layer *layer,
                                             const attn_metadata *meta, const attn_tensor *q,
                                             const attn_tensor *kv_cache, const attn_tensor *w_uk,
                                             const attn_tensor *w_uv, attn_tensor *out,
                                             attn_tensor *lse, void *stream) {
    const attn_mla_info *info = &meta->mla;
    (void)self;
    (void)stream;
    return attn__cpu_mla_prefill(layer, meta, q, NULL, 0, info->num_decode_tokens, kv_cache, w_uk, w_uv,
                         out, info->num_decode_tokens, lse);
}

/* ---- cache write and the fused layer call ------------------------------------------------ */

/* The latent cache write (validated by the front door) from host slots. */
static attn_status attn__cpu_write_latent(attn_layer *layer, const char *fn, const attn_tensor *kv_c,
                                          const attn_tensor *k_pe, attn_tensor *kv_cache,
                                          const int64_t *slot_mapping, int num_tokens) {
    const attn_layer_desc *d = &layer->desc;
    attn_tensor c, p;
    size_t csz;
    int t, x;
    float ks, vs;
    attn_status st = attn__kv_scales(layer->ctx, d, fn, &ks, &vs);
    if (st != ATTN_OK) return st;
    c = attn__tensor_resolved(kv_c);
    p = attn__tensor_resolved(k_pe);
    csz = attn_dtype_size(d->kv_cache_dtype);
    for (t = 0; t < num_tokens; t++) {
        int64_t slot = slot_mapping[t];
        char *row;
        const char *cs = (const char *)c.data + (size_t)(t * c.strides[0]) * attn_dtype_size(c.dtype);
        const char *ps = (const char *)p.data + (size_t)(t * p.strides[0]) * attn_dtype_size(p.dtype);
        if (slot < 0) continue;
        row = (char *)kv_cache->data + (size_t)slot * attn__mla_row_bytes(d);
        if (d->kv_cache_dtype == ATTN_DTYPE_FP8_DS_MLA) { /* scales per 128 values, k_pe bf16 */
            float fc[512], fp[64];
            for (x = 0; x < 512; x++) fc[x] = attn__load_elem(cs, c.dtype, x);
            for (x = 0; x < 64; x++) fp[x] = attn__load_elem(ps, p.dtype, x);
            attn__ds_mla_row_store(fc, fp, (uint8_t *)row);
        } else if (attn__dtypes[d->kv_cache_dtype].cache_only) { /* fp8: x / scale, rounded, saturated */
            for (x = 0; x < d->kv_lora_rank; x++)
                attn__store_elem(row, d->kv_cache_dtype, x, attn__load_elem(cs, c.dtype, x) / ks);
            for (x = 0; x < d->qk_rope_head_dim; x++)
                attn__store_elem(row, d->kv_cache_dtype, d->kv_lora_rank + x, attn__load_elem(ps, p.dtype, x) / ks);
        } else if (c.dtype == d->kv_cache_dtype) {
            memcpy(row, cs, (size_t)d->kv_lora_rank * csz);
            memcpy(row + (size_t)d->kv_lora_rank * csz, ps, (size_t)d->qk_rope_head_dim * csz);
        } else {
            for (x = 0; x < d->kv_lora_rank; x++)
                attn__store_elem(row, d->kv_cache_dtype, x, attn__load_elem(cs, c.dtype, x));
            for (x = 0; x < d->qk_rope_head_dim; x++)
                attn__store_elem(row, d->kv_cache_dtype, d->kv_lora_rank + x, attn__load_elem(ps, p.dtype, x));
        }
    }
    return ATTN_OK;
}

static attn_status attn__cpu_concat_and_cache_mla(const attn_backend *self, attn_layer *layer,
                                                  const attn_tensor *kv_c, const attn_tensor *k_pe,
                                                  attn_tensor *kv_cache, const attn_tensor *slot_mapping,
                                                  void *stream) {
    (void)self; (void)stream;
    return attn__cpu_write_latent(layer, "attn_concat_and_cache_mla", kv_c, k_pe, kv_cache,
                                  (const int64_t *)slot_mapping->data, (int)slot_mapping->shape[0]);
}

/* The absorbed projections of the fused call, one head per task. */
typedef struct attn__cpu_mla_proj {
    attn_layer *layer;
    int td;
    attn_tensor src;               /* q_nope (absorb) or unused */
    const float *src_f32;          /* o_latent [td][H][R] (up-project) */
    attn_tensor w;                 /* W_UK or W_UV */
    float *dst_f32;                /* q_latent [td][H][R] (absorb) */
    attn_tensor dst;               /* out (up-project) */
    int absorb;
} attn__cpu_mla_proj;

static void attn__cpu_mla_proj_run(void *varg, int h, int thread) {
    const attn__cpu_mla_proj *a = (const attn__cpu_mla_proj *)varg;
    const attn_layer_desc *d = &a->layer->desc;
    int H = d->num_heads, R = d->kv_lora_rank, N = d->qk_nope_head_dim, Vd = d->v_head_dim;
    int dpv = attn__cpu_dp(Vd), t;
    float *base = (float *)(void *)(((uintptr_t)a->layer->ctx->scratch[thread] + 63) & ~(uintptr_t)63);
    size_t wsz = attn_dtype_size(a->w.dtype);
    const char *wh = (const char *)a->w.data + (size_t)(h * a->w.strides[0]) * wsz;
    if (a->absorb) { /* q_latent[t][h] = q_nope[t][h] . W_UK[h]   ([N] x [N][R]) */
        float *w = base, *A = w + (size_t)N * (size_t)R, *C = A + (size_t)a->td * (size_t)N;
        size_t ssz = attn_dtype_size(a->src.dtype);
        attn__cpu_matrix_to_f32(wh, a->w.dtype, N, R, a->w.strides[1], w, R);
        for (t = 0; t < a->td; t++)
            attn__row_to_f32((const char *)a->src.data + (size_t)(t * a->src.strides[0] + h * a->src.strides[1]) * ssz,
                             a->src.dtype, A + (size_t)t * (size_t)N, N, N);
        attn__cpu_gemm_nn(A, N, a->td, w, N, R, C);
        for (t = 0; t < a->td; t++)
            memcpy(a->dst_f32 + ((size_t)t * (size_t)H + (size_t)h) * (size_t)R, C + (size_t)t * (size_t)R,
                   (size_t)R * sizeof(float));
    } else { /* out[t][h] = o_latent[t][h] . W_UV[h]   ([R] x [R][Vd]) */
        float *w = base, *A = w + (size_t)R * (size_t)dpv, *C = A + (size_t)a->td * (size_t)R;
        size_t osz = attn_dtype_size(a->dst.dtype);
        attn__cpu_matrix_to_f32(wh, a->w.dtype, R, Vd, a->w.strides[1], w, dpv);
        for (t = 0; t < a->td; t++)
            memcpy(A + (size_t)t * (size_t)R, a->src_f32 + ((size_t)t * (size_t)H + (size_t)h) * (size_t)R,
                   (size_t)R * sizeof(float));
        attn__cpu_gemm_nn(A, R, a->td, w, R, dpv, C);
        for (t = 0; t < a->td; t++)
            attn__row_from_f32(C + (size_t)t * (size_t)dpv, a->dst.dtype,
                               (char *)a->dst.data + (size_t)(t * a->dst.strides[0] + h * a->dst.strides[1]) * osz, Vd);
    }
}

/* The fused layer call (validated by the front door): the cache write, the decodes
   absorbed (q_nope . W_UK -> MQA -> . W_UV) through the workspace, then the prefills. */
static attn_status attn__cpu_mla_forward(const attn_backend *self, attn_layer *layer,
                                         const attn_metadata *meta, const attn_tensor *q_nope,
                                         const attn_tensor *q_pe, const attn_tensor *kv_c,
                                         const attn_tensor *k_pe, attn_tensor *kv_cache,
                                         const attn_tensor *w_uk, const attn_tensor *w_uv,
                                         attn_tensor *out, void *stream) {
    const attn_layer_desc *d = &layer->desc;
    const attn__cpu_meta *cm = (const attn__cpu_meta *)attn_metadata_private(meta);
    const attn_batch *b = attn_metadata_batch(meta);
    attn_context *ctx = layer->ctx;
    int H = d->num_heads, R = d->kv_lora_rank, td = meta->mla.num_decode_tokens;
    attn__cpu_mla_ws ws;
    float ks, vs;
    attn_status st = attn__scratch_reserve(ctx, cm->scratch_floats); /* reserved at create */
    /* the latent's scale, checked here for the whole call: before anything is written, and
       named by the call the caller made */
    if (st == ATTN_OK) st = attn__kv_scales(ctx, d, "attn_mla_forward", &ks, &vs);
    if (st != ATTN_OK) return st; /* before anything is written */
    attn__cpu_mla_ws_layout(d, attn_metadata_capacity(meta), cm->workspace_base, &ws);
    if (kv_c) /* the scale was checked above: this cannot fail */
        attn__cpu_write_latent(layer, "attn_mla_forward", kv_c, k_pe, kv_cache, b->slot_mapping, b->num_actual_tokens);
    if (td > 0) {
        attn__cpu_mla_proj pj;
        attn_tensor tql, tol;
        int64_t s3[3];
        memset(&pj, 0, sizeof pj);
        pj.layer = layer;
        pj.td = td;
        pj.absorb = 1;
        pj.src = attn__tensor_resolved(q_nope);
        pj.w = attn__tensor_resolved(w_uk);
        pj.dst_f32 = ws.ql;
        attn__pool_run(ctx->pool, attn__cpu_mla_proj_run, &pj, H);        /* q_latent */
        s3[0] = td; s3[1] = H; s3[2] = R;
        tql = attn_tensor_make(ws.ql, ATTN_DTYPE_F32, 3, s3);
        tol = attn_tensor_make(ws.ol, ATTN_DTYPE_F32, 3, s3);
        st = attn__cpu_mla_forward_mqa(self, layer, meta, &tql, q_pe, kv_cache, &tol, NULL, stream);
        if (st != ATTN_OK) return st;
        pj.absorb = 0;
        pj.src_f32 = ws.ol;
        pj.w = attn__tensor_resolved(w_uv);
        pj.dst = attn__tensor_resolved(out);
        attn__pool_run(ctx->pool, attn__cpu_mla_proj_run, &pj, H);        /* o = o_latent . W_UV */
    }
    return attn__cpu_mla_prefill(layer, meta, q_nope, q_pe, d->qk_nope_head_dim, 0, kv_cache, w_uk, w_uv,
                         out, 0, NULL);
}

/* ---- vtable ------------------------------------------------------------------------------ */

static const attn_backend attn__cpu_mla_backend = {
    "CPU_MLA",                /* name */
    ATTN_BACKEND_CPU_MLA,     /* id */
    ATTN_DEVICE_CPU,          /* device */
    ATTN_DTYPE_BIT(ATTN_DTYPE_F32) | ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16),
    ATTN_DTYPE_BIT(ATTN_DTYPE_F32) | ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16) |
        ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E4M3) | ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E5M2) | /* fp8 with per-tensor scales */
        ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_DS_MLA), /* DeepSeek-V3.2's rows (attn_mla_forward_sparse) */
    320, 576, 8,              /* head sizes: 576 or 320 exactly (attn__cpu_mla_check) */
    16, 0,                    /* block sizes: any multiple of 16 */
    0, 0, 0, 0,               /* non-causal, sliding window, soft cap, ALiBi: no */
    1,                        /* attention sinks: attn_mla_forward_sparse (the dense calls refuse them) */
    0,                        /* cascade: not yet (the batch computed as with common_prefix_len 0) */
    1,                        /* is_mla */
    ATTN_CUDA_GRAPH_NEVER,    /* no graphs on the CPU */
    1, ATTN_LSE_BASE_E,
    attn__cpu_mla_check,
    NULL, NULL,               /* context_init/release */
    NULL, NULL,               /* layer_init/release */
    attn__cpu_mla_kv_cache_shape,
    attn__cpu_mla_metadata_init,
    attn__cpu_metadata_release,
    attn__cpu_mla_build,
    NULL, NULL,               /* forward, reshape_and_cache: MLA backend */
    attn__cpu_mla_forward_mqa,
    attn__cpu_mla_forward_mha,
    attn__cpu_mla_forward,
    attn__cpu_concat_and_cache_mla,
    attn__cpu_merge_attn_states,
    attn__cpu_mla_forward_sparse
};

/* =======================================================================================
   >>nvrtc
   Run-time compilation of the embedded kernels (the .cu files of kernels/, in the
   generated block at the end of the file): NVRTC loaded like the driver; a variant is (file, options, arch) compiled
   to CUBIN, cached in memory per context and on disk, keyed by a hash of the sources,
   options, NVRTC version and arch; disk files are written atomically and checked on read.
   ======================================================================================= */

#ifndef ATTN_NO_CUDA

/* The generated block at the end of the file: the embedded sources by name / index. */
static const char *const *attn__kernel_source_lines(const char *name);
static const char *attn__kernel_source_name(int i);

/* Bumped when the cache file layout changes: old files then miss and are rebuilt. */
#define ATTN__CUBIN_MAGIC "ATTNCUB1"

typedef struct attn__cubin {
    uint64_t key;
    void *data;
    size_t size;
    attn_kernel_info info;         /* as first compiled (registers, spills, ...) */
} attn__cubin;

struct attn__kernel_cache {
#ifndef ATTN_NO_THREADS
    pthread_mutex_t lock;          /* held across a compile: one compile per variant */
#endif
    attn__cubin *entries;
    int count, capacity;
    char dir[512];                 /* "" = memory only */
    int dir_warned;                /* one WARN for an unwritable directory */
    int compiles;                  /* NVRTC compilations this context ran */
};


/* The source text of an embedded file (lines joined), NULL if there is none. */
static char *attn__kernel_source_text(const char *name) {
    const char *const *lines = attn__kernel_source_lines(name);
    size_t n = 1, i;
    char *s, *w;
    if (!lines) return NULL;
    for (i = 0; lines[i]; i++) n += strlen(lines[i]);
    s = (char *)attn__malloc(n);
    if (!s) return NULL;
    for (w = s, i = 0; lines[i]; i++) {
        size_t k = strlen(lines[i]);
        memcpy(w, lines[i], k);
        w += k;
    }
    *w = 0;
    return s;
}

/* Where compiled kernels are kept: desc.cache_dir, else ATTN_CACHE_DIR, else
   $XDG_CACHE_HOME/attn, else $HOME/.cache/attn; "off" keeps them in memory only. */
static void attn__kernel_cache_dir(const char *given, char *dir, size_t size) {
    const char *v = given && *given ? given : attn__trim_env("ATTN_CACHE_DIR");
    dir[0] = 0;
    if (v) {
        if (!attn__strieq(v, "off")) attn__strlcpy(dir, v, size);
        return;
    }
    if ((v = attn__trim_env("XDG_CACHE_HOME")) != NULL) attn__fmt(dir, size, "%s/attn", v);
    else if ((v = attn__trim_env("HOME")) != NULL) attn__fmt(dir, size, "%s/.cache/attn", v);
}

static void attn__kernel_cache_destroy(struct attn__kernel_cache *kc) {
    int i;
    if (!kc) return;
    for (i = 0; i < kc->count; i++) attn__free(kc->entries[i].data);
    attn__free(kc->entries);
#ifndef ATTN_NO_THREADS
    pthread_mutex_destroy(&kc->lock);
#endif
    attn__free(kc);
}

static struct attn__kernel_cache *attn__kernel_cache_create(const char *dir) {
    struct attn__kernel_cache *kc = (struct attn__kernel_cache *)attn__calloc(1, sizeof *kc);
    if (!kc) return NULL;
#ifndef ATTN_NO_THREADS
    pthread_mutex_init(&kc->lock, NULL);
#endif
    attn__kernel_cache_dir(dir, kc->dir, sizeof kc->dir);
    return kc;
}

/* mkdir -p; 0 when the directory exists afterwards. */
static int attn__mkdirs(const char *path) {
    char tmp[512];
    size_t i, n = strlen(path);
    struct stat st;
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, path, n + 1);
    for (i = 1; i <= n; i++) {
        if (tmp[i] == '/' || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            if (stat(tmp, &st) != 0 && mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
            tmp[i] = c;
        }
    }
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* The disk file's fixed header, then `size` bytes of CUBIN. */
typedef struct attn__cubin_file {
    char magic[8];
    uint64_t key, size, checksum;
    int32_t registers, shared_bytes, spill_stores, spill_loads;
} attn__cubin_file;

/* Reads a cached CUBIN; 1 hit, 0 absent, -1 present but damaged (then removed). */
static int attn__cubin_read(const char *path, uint64_t key, attn__cubin *out) {
    FILE *f = fopen(path, "rb");
    attn__cubin_file h;
    void *data = NULL;
    long len;
    int ok = 0;
    if (!f) return 0;
    if (fread(&h, sizeof h, 1, f) == 1 && memcmp(h.magic, ATTN__CUBIN_MAGIC, 8) == 0 &&
        h.key == key && h.size > 0 && h.size < ((uint64_t)1 << 31) &&
        fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 &&
        (uint64_t)len == sizeof h + h.size && fseek(f, (long)sizeof h, SEEK_SET) == 0 &&
        (data = attn__malloc((size_t)h.size)) != NULL &&
        fread(data, (size_t)h.size, 1, f) == 1 &&
        attn__fnv1a(ATTN__FNV_SEED, data, (size_t)h.size) == h.checksum) {
        out->data = data;
        out->size = (size_t)h.size;
        out->info.registers = h.registers;
        out->info.shared_bytes = h.shared_bytes;
        out->info.spill_stores = h.spill_stores;
        out->info.spill_loads = h.spill_loads;
        ok = 1;
    }
    fclose(f);
    if (ok) return 1;
    attn__free(data);
    remove(path);
    return -1;
}

/* Writes atomically (temp file + rename); 0 on success. */
static int attn__cubin_write(const char *dir, const char *path, const attn__cubin *c) {
    char tmp[600];
    static unsigned counter;
    attn__cubin_file h;
    FILE *f;
    int ok;
    if (attn__mkdirs(dir) != 0) return -1;
    attn__fmt(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), counter++);
    f = fopen(tmp, "wb");
    if (!f) return -1;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, ATTN__CUBIN_MAGIC, 8);
    h.key = c->key;
    h.size = c->size;
    h.checksum = attn__fnv1a(ATTN__FNV_SEED, c->data, c->size);
    h.registers = c->info.registers;
    h.shared_bytes = c->info.shared_bytes;
    h.spill_stores = c->info.spill_stores;
    h.spill_loads = c->info.spill_loads;
    ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(c->data, c->size, 1, f) == 1;
    ok = (fclose(f) == 0) && ok;
    if (ok && rename(tmp, path) == 0) return 0;
    remove(tmp);
    return -1;
}

/* The ptxas report in an NVRTC log: the most registers and shared memory of any function,
   the spill bytes of all of them. */
static void attn__ptxas_info(const char *log, attn_kernel_info *info) {
    const char *p = log;
    info->registers = info->shared_bytes = info->spill_stores = info->spill_loads = 0;
    while ((p = strstr(p, "ptxas info")) != NULL) {
        const char *eol = strchr(p, '\n');
        const char *q;
        char line[256];
        size_t n = eol ? (size_t)(eol - p) : strlen(p);
        if (n >= sizeof line) n = sizeof line - 1;
        memcpy(line, p, n);
        line[n] = 0;
        if ((q = strstr(line, "Used ")) != NULL) {
            int r = atoi(q + 5);
            if (r > info->registers) info->registers = r;
            if ((q = strstr(line, "bytes smem")) != NULL) {
                while (q > line && q[-1] == ' ') q--;
                while (q > line && q[-1] >= '0' && q[-1] <= '9') q--;
                if (atoi(q) > info->shared_bytes) info->shared_bytes = atoi(q);
            }
        }
        p += n;
        if (eol && (q = strstr(eol, "bytes spill stores")) != NULL && q - eol < 200) {
            const char *s = q, *l;
            while (s > eol && s[-1] == ' ') s--;
            while (s > eol && s[-1] >= '0' && s[-1] <= '9') s--;
            info->spill_stores += atoi(s);
            if ((l = strstr(q, "bytes spill loads")) != NULL && l - q < 60) {
                s = l;
                while (s > q && s[-1] == ' ') s--;
                while (s > q && s[-1] >= '0' && s[-1] <= '9') s--;
                info->spill_loads += atoi(s);
            }
        }
    }
}

static double attn__now_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec * 1e3 + (double)tv.tv_usec * 1e-3;
}

/* Splits `options` (space-separated) into argv, after the fixed options. */
static int attn__split_options(char *buf, const char **argv, int max) {
    int n = 0;
    char *p = buf;
    while (*p && n < max) {
        while (*p == ' ') *p++ = 0;
        if (!*p) break;
        argv[n++] = p;
        while (*p && *p != ' ') p++;
    }
    return n;
}

/* Compiles (or finds) one variant; *out points into the context's cache. Caller holds
   the cache lock. */
static attn_status attn__kernel_get_locked(attn_context *ctx, const char *file, const char *options,
                                          const char *arch, const attn__cubin **out, int *source) {
    struct attn__kernel_cache *kc = ctx->kernels;
    attn__nvrtc *nv = ctx->nvrtc;
    const char *fn = "attn_kernel_compile";
    const char *argv[72], *hdr_src[32], *hdr_name[32];
    char *text = NULL, *hdr_text[32], opt_buf[1024], arch_opt[48], path[600];
    int nh = 0, argc, i, major = nv->major, minor = nv->minor;
    uint64_t key = ATTN__FNV_SEED;
    attn__cubin c;
    attn__nvrtcProgram prog = NULL;
    attn_status st = ATTN_OK;
    double t0;
    memset(&c, 0, sizeof c);
    text = attn__kernel_source_text(file);
    if (!text)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: kernel '%s' is not embedded (allowed: a kernels/*.cu file name)", fn, file);
    /* every embedded header is offered to the program; the key covers them all */
    for (i = 0; attn__kernel_source_name(i) && nh < 32; i++) {
        const char *name = attn__kernel_source_name(i);
        size_t k = strlen(name);
        if (k > 4 && strcmp(name + k - 4, ".cuh") == 0) {
            hdr_text[nh] = attn__kernel_source_text(name);
            if (!hdr_text[nh]) { st = ATTN_ERROR_OUT_OF_MEMORY; break; }
            hdr_name[nh] = name;
            hdr_src[nh] = hdr_text[nh];
            key = attn__fnv1a(key, hdr_text[nh], strlen(hdr_text[nh]) + 1);
            nh++;
        }
    }
    key = attn__fnv1a(key, text, strlen(text) + 1);
    key = attn__fnv1a(key, file, strlen(file) + 1);
    key = attn__fnv1a(key, options, strlen(options) + 1);
    key = attn__fnv1a(key, arch, strlen(arch) + 1);
    key = attn__fnv1a(key, &major, sizeof major);
    key = attn__fnv1a(key, &minor, sizeof minor);
    key = attn__fnv1a(key, ATTN__CUBIN_MAGIC, 8);
    for (i = 0; st == ATTN_OK && i < kc->count; i++)
        if (kc->entries[i].key == key) {
            *out = &kc->entries[i];
            *source = ATTN_KERNEL_FROM_MEMORY;
            goto done;
        }
    if (st == ATTN_OK && kc->count == kc->capacity) {
        int cap = kc->capacity ? 2 * kc->capacity : 16;
        attn__cubin *n = (attn__cubin *)ATTN_REALLOC(kc->entries, (size_t)cap * sizeof *n);
        if (!n) st = ATTN_ERROR_OUT_OF_MEMORY;
        else { kc->entries = n; kc->capacity = cap; }
    }
    if (st != ATTN_OK) {
        st = attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                        "%s: out of memory for kernel '%s'", fn, file);
        goto done;
    }
    c.key = key;
    attn__strlcpy(c.info.kernel, file, sizeof c.info.kernel);
    attn__strlcpy(c.info.arch, arch, sizeof c.info.arch);
    if (kc->dir[0]) {
        int r;
        attn__fmt(path, sizeof path, "%s/%016llx.cubin", kc->dir, (unsigned long long)key);
        r = attn__cubin_read(path, key, &c);
        if (r > 0) {
            *source = ATTN_KERNEL_FROM_DISK;
            c.info.source = ATTN_KERNEL_FROM_DISK;
            kc->entries[kc->count] = c;
            *out = &kc->entries[kc->count++];
            attn__log(ctx, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_KERNEL_CACHE_HIT, "kernel %s [%s] %s from %s",
                      file, options, arch, path);
            goto done;
        }
        if (r < 0)
            attn__log(ctx, ATTN_LOG_LEVEL_WARN, ATTN_LOG_KERNEL_CACHE_FAULT,
                      "kernel cache file %s was damaged (truncated or corrupt); rebuilding it", path);
    }
    /* compile */
    attn__fmt(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
    attn__strlcpy(opt_buf, options, sizeof opt_buf);
    argv[0] = arch_opt;
    argv[1] = "--ptxas-options=-v";
    argv[2] = "--std=c++17";
    argc = 3 + attn__split_options(opt_buf, argv + 3, 64);
    t0 = attn__now_ms();
    if (nv->nvrtcCreateProgram(&prog, text, file, nh, hdr_src, hdr_name) != 0) {
        st = attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_KERNEL_COMPILE_FAILED,
                        "%s: nvrtcCreateProgram failed for %s", fn, file);
        goto done;
    }
    {
        int rc = nv->nvrtcCompileProgram(prog, argc, argv);
        size_t log_size = 0;
        char *log = NULL;
        if (nv->nvrtcGetProgramLogSize(prog, &log_size) == 0 && log_size > 0 &&
            (log = (char *)attn__malloc(log_size + 1)) != NULL &&
            nv->nvrtcGetProgramLog(prog, log) == 0) {
            log[log_size] = 0;
            attn__ptxas_info(log, &c.info);
            attn__strlcpy(c.info.log, log, sizeof c.info.log);
        }
        if (rc != 0) {
            st = attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_KERNEL_COMPILE_FAILED,
                            "%s: NVRTC could not compile %s [%s] for %s (result %d): %s", fn, file,
                            options, arch, rc, log ? log : "(no log)");
            attn__free(log);
            goto done;
        }
        attn__free(log);
    }
    if (nv->nvrtcGetCUBINSize(prog, &c.size) != 0 || c.size == 0 ||
        (c.data = attn__malloc(c.size)) == NULL || nv->nvrtcGetCUBIN(prog, (char *)c.data) != 0) {
        st = attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_KERNEL_COMPILE_FAILED,
                        "%s: no CUBIN from NVRTC for %s for %s", fn, file, arch);
        attn__free(c.data);
        goto done;
    }
    c.info.compile_ms = attn__now_ms() - t0;
    *source = ATTN_KERNEL_COMPILED;
    c.info.source = ATTN_KERNEL_COMPILED;
    kc->compiles++;
    attn__log(ctx, ATTN_LOG_LEVEL_INFO, ATTN_LOG_KERNEL_COMPILED,
              "compiled kernel %s [%s] for %s in %.0f ms (%d registers, %d bytes shared, %d/%d "
              "bytes spilled)", file, options, arch, c.info.compile_ms, c.info.registers,
              c.info.shared_bytes, c.info.spill_stores, c.info.spill_loads);
    if (kc->dir[0] && attn__cubin_write(kc->dir, path, &c) != 0 && !kc->dir_warned) {
        kc->dir_warned = 1;
        attn__log(ctx, ATTN_LOG_LEVEL_WARN, ATTN_LOG_KERNEL_CACHE_FAULT,
                  "kernel cache directory %s is not writable; compiled kernels stay in memory "
                  "(set ATTN_CACHE_DIR to a writable directory, or off)", kc->dir);
    }
    kc->entries[kc->count] = c;
    *out = &kc->entries[kc->count++];
done:
    if (prog) nv->nvrtcDestroyProgram(&prog);
    for (i = 0; i < nh; i++) attn__free(hdr_text[i]);
    attn__free(text);
    return st;
}

static attn_status attn__kernel_get(attn_context *ctx, const char *file, const char *options,
                                    const char *arch, const attn__cubin **out, int *source) {
    attn_status st;
#ifndef ATTN_NO_THREADS
    pthread_mutex_lock(&ctx->kernels->lock);
#endif
    st = attn__kernel_get_locked(ctx, file, options, arch, out, source);
#ifndef ATTN_NO_THREADS
    pthread_mutex_unlock(&ctx->kernels->lock);
#endif
    return st;
}

/* sm_NN or sm_NNa with 50 <= NN <= 199. */
static int attn__arch_ok(const char *arch) {
    size_t n = strlen(arch);
    if (n < 5 || n > 7 || strncmp(arch, "sm_", 3) != 0) return 0;
    if (arch[n - 1] == 'a') n--;
    if (n - 3 < 2 || n - 3 > 3) return 0;
    {
        size_t i;
        for (i = 3; i < n; i++) if (arch[i] < '0' || arch[i] > '9') return 0;
    }
    return atoi(arch + 3) >= 50 && atoi(arch + 3) <= 199;
}

ATTN_API attn_status attn_kernel_compile(attn_context *ctx, const char *kernel, const char *options,
                                         const char *arch, attn_kernel_info *info) {
    const attn__cubin *c = NULL;
    attn_status st;
    int source = 0;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!kernel) return attn__null_arg(ctx, __func__, "kernel");
    if (!arch) return attn__null_arg(ctx, __func__, "arch");
    if (!options) options = "";
    if (!attn__arch_ok(arch))
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_kernel_compile: arch is '%s' (allowed: sm_NN or sm_NNa, e.g. sm_80, "
                          "sm_90, sm_90a)", arch);
    if (strlen(options) >= 1000)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_kernel_compile: options are %zu characters (allowed: fewer than 1000)",
                          strlen(options));
    if (!ctx->nvrtc || !ctx->nvrtc->library)
        return attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR,
                          "attn_kernel_compile: NVRTC is not available (%s)", ctx->platform.nvrtc_reason);
    st = attn__kernel_get(ctx, kernel, options, arch, &c, &source);
    if (st == ATTN_OK && info) {
        *info = c->info;
        info->cubin_bytes = c->size;
        info->source = (attn_kernel_source)source;
    }
    return st;
}

ATTN_API int attn_kernel_compile_count(const attn_context *ctx) {
    return ctx && ctx->kernels ? ctx->kernels->compiles : 0;
}

#else /* ATTN_NO_CUDA: no compiler, no embedded kernels */

ATTN_API attn_status attn_kernel_compile(attn_context *ctx, const char *kernel, const char *options,
                                         const char *arch, attn_kernel_info *info) {
    (void)options; (void)info;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!kernel) return attn__null_arg(ctx, __func__, "kernel");
    if (!arch) return attn__null_arg(ctx, __func__, "arch");
    return attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR,
                      "attn_kernel_compile: the CUDA path is compiled out (ATTN_NO_CUDA): no kernels, no NVRTC");
}

ATTN_API int attn_kernel_compile_count(const attn_context *ctx) {
    (void)ctx;
    return 0;
}

#endif /* ATTN_NO_CUDA (>>nvrtc) */

/* =======================================================================================
   >>cuda
   The CUDA platform: the device's primary context (shared with the CUDA runtime and
   PyTorch), streams, memory helpers for C users without a runtime, the kernel parameter
   structs (generated), kernel loading, the kernel-family table and the LSE merge kernel.
   The backends follow: >>cuda_paged (CUDA, CUDA_SM90), >>cuda_mla (CUDA_MLA_SM90, CUDA_MLA).
   ======================================================================================= */

#ifndef ATTN_NO_CUDA

/* A failed driver call: ATTN_ERROR_PLATFORM naming the call and the driver's text. */
static attn_status attn__cu_fail(attn_context *ctx, const char *fn, const char *call, attn__CUresult rc) {
    const char *text = NULL;
    if (ctx->cuda->cuGetErrorString) ctx->cuda->cuGetErrorString(rc, &text);
    return attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR, "%s: %s failed (CUresult %d: %s)",
                      fn, call, rc, text ? text : "unknown");
}

/* Makes the device's primary context current (retained on first use, released at
   attn_context_destroy). Pair with attn__cuda_leave. */
static attn_status attn__cuda_enter(attn_context *ctx, const char *fn) {
    attn__cuda_driver *cu = ctx->cuda;
    attn__CUresult rc;
    if (ctx->platform.kind != ATTN_PLATFORM_CUDA)
        return attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR,
                          "%s: no CUDA device (%s)", fn, ctx->platform.cuda_reason);
    if (!ctx->cuda_primary) {
        if ((rc = cu->cuDeviceGet(&ctx->cuda_device, 0)) != 0)
            return attn__cu_fail(ctx, fn, "cuDeviceGet", rc);
        if ((rc = cu->cuDevicePrimaryCtxRetain(&ctx->cuda_primary, ctx->cuda_device)) != 0) {
            ctx->cuda_primary = NULL;
            return attn__cu_fail(ctx, fn, "cuDevicePrimaryCtxRetain", rc);
        }
    }
    if ((rc = cu->cuCtxPushCurrent(ctx->cuda_primary)) != 0)
        return attn__cu_fail(ctx, fn, "cuCtxPushCurrent", rc);
    return ATTN_OK;
}

static void attn__cuda_leave(attn_context *ctx) {
    attn__CUcontext popped;
    ctx->cuda->cuCtxPopCurrent(&popped);
}

/* A tiled tensor map for the Hopper kernels' TMA copies (kernels/hopper.cuh): `rank`
   dimensions innermost first, dims in elements, strides in bytes of dimensions 1 .. rank-1
   (multiples of 16), the box in elements (each <= 256; box[0] * element size a multiple
   of 16 and, swizzled, at most the swizzle span), swizzle 0 (none), 32, 64 or 128 bytes.
   Out-of-range box elements read as zero. Checks what the driver requires and names the
   argument that breaks it; the driver's own refusal comes back with its code. */
static attn_status attn__tma_encode(attn_context *ctx, attn__tma_map *map, attn_dtype dt, int rank, const void *base,
                                    const uint64_t *dims, const uint64_t *strides, const uint32_t *box, int swizzle) {
    static const char *const fn = "attn__tma_encode";
    const uint32_t ones[5] = {1, 1, 1, 1, 1};
    int type = -1, sw, i;
    size_t esz = attn_dtype_size(dt);
    attn__CUresult rc;
    if (!ctx->platform.cuda_tma)
        return attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR, "%s: no TMA on this platform (%s)", fn,
                          ctx->platform.cuda_tma_reason);
    switch (dt) {
    case ATTN_DTYPE_F16: type = 6; break;  /* CU_TENSOR_MAP_DATA_TYPE_FLOAT16 */
    case ATTN_DTYPE_BF16: type = 9; break; /* BFLOAT16 */
    case ATTN_DTYPE_F32: type = 7; break;  /* FLOAT32 */
    case ATTN_DTYPE_FP8_E4M3:
    case ATTN_DTYPE_FP8_E5M2:
    case ATTN_DTYPE_INT8: type = 0; break; /* UINT8: codes, copied as bytes */
    case ATTN_DTYPE_AUTO: case ATTN_DTYPE_INT64: case ATTN_DTYPE_INT32: case ATTN_DTYPE_FP8_DS_MLA: case ATTN_DTYPE_COUNT: break; /* not element types */
    }
    if (type < 0)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: dtype %s (allowed: f16, bf16, f32, fp8_e4m3, fp8_e5m2, int8)", fn, attn_dtype_name(dt));
    switch (swizzle) {
    case 0: sw = 0; break;
    case 32: sw = 1; break;
    case 64: sw = 2; break;
    case 128: sw = 3; break;
    default:
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: swizzle %d (allowed: 0, 32, 64, 128 bytes)", fn, swizzle);
    }
    if (rank < 1 || rank > 5)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT, "%s: rank %d (allowed: 1..5)", fn,
                          rank);
    if (((uintptr_t)base & 15) != 0)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: base %p is not 16-byte aligned", fn, base);
    for (i = 0; i < rank; i++) {
        if (dims[i] == 0 || dims[i] > ((uint64_t)1 << 32) || box[i] == 0 || box[i] > 256)
            return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "%s: dims[%d] %llu, box[%d] %u (allowed: dims 1..2^32, box 1..256)", fn, i,
                              (unsigned long long)dims[i], i, box[i]);
        if (i > 0 && (strides[i - 1] % 16 != 0 || strides[i - 1] >= ((uint64_t)1 << 40)))
            return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "%s: strides[%d] %llu bytes (allowed: a multiple of 16 below 2^40)", fn, i - 1,
                              (unsigned long long)strides[i - 1]);
    }
    if ((box[0] * esz) % 16 != 0 || (swizzle && box[0] * esz > (size_t)swizzle))
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: box[0] %u elements of %zu bytes (allowed: a multiple of 16 bytes, and at most the "
                          "swizzle span, %d, when swizzled)", fn, box[0], esz, swizzle);
    memset(map, 0, sizeof *map);
    rc = ctx->cuda->cuTensorMapEncodeTiled(map, type, (unsigned)rank, (void *)(uintptr_t)base, dims, strides, box, ones,
                                           0 /* no interleave */, sw, 2 /* L2 promotion 128 B */, 0 /* zero fill */);
    if (rc != 0) return attn__cu_fail(ctx, fn, "cuTensorMapEncodeTiled", rc);
    return ATTN_OK;
}

static int attn__stream_capturing(attn_context *ctx, void *stream) {
    int status = 0, rc;
    if (ctx->platform.kind != ATTN_PLATFORM_CUDA || attn__cuda_enter(ctx, "the graph check") != ATTN_OK) return 0;
    rc = ctx->cuda->cuStreamIsCapturing((attn__CUstream)stream, &status);
    attn__cuda_leave(ctx);
    return rc == 0 && status != 0;
}

/* 1: ptr is device memory, 0: host memory or not CUDA's, -1: no driver to ask. The plural
   cuPointerGetAttributes: for memory the driver does not know it returns success with a
   zero type, where cuPointerGetAttribute returns an error (which compute-sanitizer reports). */
static int attn__cuda_pointer_kind(attn_context *ctx, const void *ptr) {
    unsigned int type = 0;
    int attr = ATTN__CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    void *data = &type;
    attn__CUresult rc;
    if (ctx->platform.kind != ATTN_PLATFORM_CUDA || !ctx->cuda || !ctx->cuda->library) return -1;
    if (attn__cuda_enter(ctx, "attn_layer_create") != ATTN_OK) return -1;
    rc = ctx->cuda->cuPointerGetAttributes(1, &attr, &data, (attn__CUdeviceptr)(uintptr_t)ptr);
    attn__cuda_leave(ctx);
    return rc == 0 && type == 2 /* CU_MEMORYTYPE_DEVICE */ ? 1 : 0; /* else host or unknown to CUDA */
}

/* attn__cuda_enter for calls that take the caller's stream: the stream must belong to the
   context the kernels are loaded in (the device's primary context, which the CUDA runtime
   and PyTorch use too). NULL, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) name the
   current context's streams and always pass. A stream of another device or of a context
   made with cuCtxCreate is refused before anything is written. */
static attn_status attn__cuda_enter_stream(attn_context *ctx, const char *fn, void *stream) {
    attn__CUcontext owner = NULL;
    attn__CUresult rc;
    attn_status st;
    if ((st = attn__cuda_enter(ctx, fn)) != ATTN_OK) return st;
    if ((uintptr_t)stream <= 2) return ATTN_OK;
    rc = ctx->cuda->cuStreamGetCtx((attn__CUstream)stream, &owner);
    if (rc != 0 || owner != ctx->cuda_primary) {
        attn__cuda_leave(ctx);
        if (rc != 0)
            return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                              "%s: stream %p is not a stream the CUDA driver knows (cuStreamGetCtx: "
                              "CUresult %d; allowed: NULL for the legacy default stream, or a stream of "
                              "device %d's primary context)", fn, stream, rc, (int)ctx->cuda_device);
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: stream %p belongs to another CUDA context (another device's, or one "
                          "made with cuCtxCreate); allowed: NULL for the legacy default stream, or a "
                          "stream of device %d's primary context (CUDA runtime and PyTorch streams "
                          "are)", fn, stream, (int)ctx->cuda_device);
    }
    return ATTN_OK;
}

/* At attn_context_destroy. */
static void attn__cuda_release(attn_context *ctx) {
    if (ctx->cuda_primary) ctx->cuda->cuDevicePrimaryCtxRelease(ctx->cuda_device);
    ctx->cuda_primary = NULL;
}

ATTN_API attn_status attn_cuda_malloc(attn_context *ctx, size_t bytes, void **ptr) {
    attn__CUdeviceptr p = 0;
    attn__CUresult rc;
    attn_status st;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!ptr) return attn__null_arg(ctx, __func__, "ptr");
    *ptr = NULL;
    if (bytes == 0)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_cuda_malloc: bytes is 0 (allowed: >= 1)");
    if ((st = attn__cuda_enter(ctx, "attn_cuda_malloc")) != ATTN_OK) return st;
    rc = ctx->cuda->cuMemAlloc(&p, bytes);
    attn__cuda_leave(ctx);
    if (rc != 0) return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                                   "attn_cuda_malloc: cannot allocate %zu bytes on the device (CUresult %d)",
                                   bytes, rc);
    *ptr = (void *)(uintptr_t)p;
    return ATTN_OK;
}

ATTN_API attn_status attn_cuda_free(attn_context *ctx, void *ptr) {
    attn__CUresult rc;
    attn_status st;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!ptr) return ATTN_OK;
    if ((st = attn__cuda_enter(ctx, "attn_cuda_free")) != ATTN_OK) return st;
    rc = ctx->cuda->cuMemFree((attn__CUdeviceptr)(uintptr_t)ptr);
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, "attn_cuda_free", "cuMemFree", rc) : ATTN_OK;
}

ATTN_API attn_status attn_cuda_memcpy(attn_context *ctx, void *dst, const void *src, size_t bytes,
                                      attn_copy_kind kind, void *stream) {
    attn__cuda_driver *cu;
    attn__CUstream s = (attn__CUstream)stream;
    attn__CUresult rc = 0;
    attn_status st;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!dst) return attn__null_arg(ctx, __func__, "dst");
    if (!src) return attn__null_arg(ctx, __func__, "src");
    if ((int)kind < ATTN_COPY_HOST_TO_DEVICE || (int)kind > ATTN_COPY_DEVICE_TO_DEVICE)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_cuda_memcpy: kind is %d (allowed: ATTN_COPY_HOST_TO_DEVICE, "
                          "_DEVICE_TO_HOST, _DEVICE_TO_DEVICE)", (int)kind);
    if (bytes == 0) return ATTN_OK;
    if ((st = attn__cuda_enter_stream(ctx, "attn_cuda_memcpy", stream)) != ATTN_OK) return st;
    cu = ctx->cuda;
    switch (kind) {
    case ATTN_COPY_HOST_TO_DEVICE:
        rc = cu->cuMemcpyHtoDAsync((attn__CUdeviceptr)(uintptr_t)dst, src, bytes, s);
        break;
    case ATTN_COPY_DEVICE_TO_HOST:
        rc = cu->cuMemcpyDtoHAsync(dst, (attn__CUdeviceptr)(uintptr_t)src, bytes, s);
        break;
    case ATTN_COPY_DEVICE_TO_DEVICE:
        rc = cu->cuMemcpyDtoDAsync((attn__CUdeviceptr)(uintptr_t)dst, (attn__CUdeviceptr)(uintptr_t)src,
                                   bytes, s);
        break;
    }
    if (rc == 0 && !stream) rc = cu->cuStreamSynchronize(s); /* NULL stream: synchronous */
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, "attn_cuda_memcpy", "the copy", rc) : ATTN_OK;
}

ATTN_API attn_status attn_cuda_synchronize(attn_context *ctx, void *stream) {
    attn__CUresult rc;
    attn_status st;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if ((st = attn__cuda_enter_stream(ctx, "attn_cuda_synchronize", stream)) != ATTN_OK) return st;
    rc = ctx->cuda->cuStreamSynchronize((attn__CUstream)stream);
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, "attn_cuda_synchronize", "cuStreamSynchronize", rc) : ATTN_OK;
}

/* ---- kernel variants: compiled, loaded, configured ------------------------------------- */

/* The kernels' element numbering (DT_*): 0 f32, 1 f16, 2 bf16, and for caches 4 fp8 e4m3,
   5 fp8 e5m2, 6 int8 (attn_dtype's numbers); -1: no kernel reads it. */
static int attn__cuda_dt(attn_dtype d) {
    switch (d) {
    case ATTN_DTYPE_AUTO: return -1;
    case ATTN_DTYPE_F32: return 0;
    case ATTN_DTYPE_F16: return 1;
    case ATTN_DTYPE_BF16: return 2;
    case ATTN_DTYPE_FP8_E4M3: return 4;
    case ATTN_DTYPE_FP8_E5M2: return 5;
    case ATTN_DTYPE_INT8: return 6;
    case ATTN_DTYPE_FP8_DS_MLA: return 9; /* ATTN_DT_DS_MLA: latent rows with their own scales */
    case ATTN_DTYPE_INT64: case ATTN_DTYPE_INT32: case ATTN_DTYPE_COUNT: return -1;
    }
    return -1;
}

/* The parameter structs every kernel takes by value and the launch configuration the
   attention kernels export, defined once in kernels/attn_params.cuh (valid C99 and CUDA
   C++) and copied here by tools/embed.py: the host and the kernels cannot disagree on a
   layout. */
/* >>params-begin (generated by tools/embed from kernels/attn_params.cuh; do not edit) */
/* attn_params.cuh - every struct that crosses from the host into a kernel, defined once.

   The kernels include it (NVRTC is handed it as a named header, like every .cuh), and
   tools/embed.py copies it verbatim into attn.h's host part, between the >>params-begin /
   >>params-end markers of the >>cuda section; `make test` fails when that copy is stale. So
   this file is valid C99 and CUDA C++ at once: fixed-width members (int, float, long long),
   8-byte members first or padded to 8 by hand, no member functions. A pointer member is
   ATTN__DPTR(T): T * in a kernel, a 64-bit device address (attn__CUdeviceptr) on the host.

   Launch configurations: every attention kernel exports an attn__launch_config in
   __constant__ memory (attn_paged_config, attn_mla_config, attn_mha_config) that the host
   reads after loading the module: block size, dynamic shared memory and the tile shape the
   host's schedule must agree with. */
#ifndef ATTN_PARAMS_CUH
#define ATTN_PARAMS_CUH

#ifdef __CUDACC__
#define ATTN__DPTR(T) T *
#else
#define ATTN__DPTR(T) attn__CUdeviceptr
#endif

/* Slots an _inline cache write carries in its parameters (kernels/cache_write.cu): with the
   write's own parameters under the 4 KiB every driver takes. */
#define ATTN__INLINE_SLOTS 448

/* A kernel's launch configuration, named (the __constant__ each attention kernel exports). */
typedef struct attn__launch_config {
    int threads;       /* block size */
    int shared_bytes;  /* dynamic shared memory a CTA needs */
    int kv_tile;       /* keys per pipeline stage */
    int rows;          /* paged: query rows of a CTA (tile_tokens x GROUP, padded); MLA decode:
                          heads of one token per CTA (its partials' rows); MLA prefill: query
                          rows of one head per CTA */
    int tile_tokens;   /* paged: query tokens of a work item (the schedule's tile); MLA: 1 */
    int kv_stages;     /* pipeline depth */
    int warps;         /* paged: warps across the head dimension (WARPS_N); MLA: warps */
    int uses_mma;      /* 1: tensor cores (mma.sync / wgmma); 0: the FMA path */
    int tma_box_rows;  /* kernels that read the cache through a tensor map (the first kernel
                          parameter, attn_tma_map): the key rows of one box; 0: no map */
    int persistent;    /* 1: the CTAs loop over the work items, so any grid runs them all (a
                          captured launch takes one wave); 0: one CTA per item */
} attn__launch_config;

/* attn_paged_attention, attn_paged_merge_partials (paged_attention.cu) and
   attn_paged_prefill_sm90 (paged_prefill_sm90.cu). Strides in elements. The kernels that
   take it define TILE_TOKENS, GROUP and HEAD_DIM (the comments' shapes). */
typedef struct attn__paged_params {
    ATTN__DPTR(const void) q;               /* DT_Q [tokens, num_heads, HEAD_DIM] */
    ATTN__DPTR(const void) kv_cache;        /* DT_KV [num_blocks, 2, BLOCK_SIZE, num_kv_heads, HEAD_DIM] */
    ATTN__DPTR(void) out;                   /* DT_Q [tokens, num_heads, HEAD_DIM] */
    ATTN__DPTR(float) lse;                  /* f32 [tokens, num_heads], base e; NULL: not written */
    ATTN__DPTR(const int) block_table;      /* [num_reqs, block_table_stride] */
    ATTN__DPTR(const int) seq_lens;         /* [num_reqs] */
    ATTN__DPTR(const int) query_start_loc;  /* [num_reqs + 1] */
    ATTN__DPTR(const float) alibi_slopes;   /* [num_heads] (ALIBI) */
    ATTN__DPTR(const int) work;             /* [capacity][8], see paged_attention.cu's WORK LIST */
    ATTN__DPTR(const int) num_work;         /* one int: entries of `work` this launch runs */
    ATTN__DPTR(const int) merge;            /* [capacity][8], see MERGE LIST */
    ATTN__DPTR(const int) num_merge;        /* one int */
    ATTN__DPTR(float) partial_o;            /* [num_slots][TILE_TOKENS*GROUP][HEAD_DIM] */
    ATTN__DPTR(float) partial_ml;           /* [num_slots][TILE_TOKENS*GROUP][2] */
    ATTN__DPTR(int) merge_count;            /* [merge capacity] FUSED MERGE arrivals, zero between
                                               launches; NULL: merges only by attn_paged_merge_partials */
    ATTN__DPTR(const float) k_scale;        /* 8-bit caches with per-tensor scales: one float each
                                               on the device, read at every launch; NULL: the value */
    ATTN__DPTR(const float) v_scale;
    ATTN__DPTR(const float) sinks;          /* [num_heads] attention sinks (natural-log logits),
                                               read at every launch; NULL: none */
    ATTN__DPTR(const float) prefix_o;       /* cascade (paged_attention.cu, CASCADE): the prefix
                                               pass's partials [slots][prefix_rows][HEAD_DIM] */
    ATTN__DPTR(const float) prefix_ml;      /* [slots][prefix_rows][2] */
    ATTN__DPTR(const int) prefix_splits;    /* one int: the prefix pass's splits (0: no prefix in
                                               this launch's batch); NULL: never */
    long long q_stride_token, q_stride_head;
    long long out_stride_token, out_stride_head;
    long long lse_stride_token, lse_stride_head;
    long long block_table_stride;
    int num_kv_heads;
    float scale;                            /* softmax scale */
    float softcap;                          /* SOFTCAP: the cap (> 0) */
    int window;                             /* WINDOW: sliding window in tokens (0: none) */
    float k_scale_value, v_scale_value;     /* where k_scale / v_scale are NULL */
    int prefix_tile_tokens, prefix_rows;    /* cascade: the prefix pass's query tokens and rows
                                               per partial slot */
    int dcp_world_size, dcp_rank;           /* decode context parallelism (attn_metadata_desc): */
    int dcp_interleave, dcp_pad;            /*   keys are this rank's local indices; size 1: off */
} attn__paged_params;

/* attn_reshape_and_cache (cache_write.cu): key/value rows into the standard cache. */
typedef struct attn__cache_write_params {
    ATTN__DPTR(const void) key;             /* DT_IN [tokens, num_kv_heads, HEAD_DIM] */
    ATTN__DPTR(const void) value;           /* DT_IN, same shape */
    ATTN__DPTR(void) kv_cache;              /* DT_CACHE [num_blocks, 2, block_size, num_kv_heads, HEAD_DIM] */
    ATTN__DPTR(const long long) slot_mapping; /* [tokens]; -1 skips (the _inline kernel: unused) */
    ATTN__DPTR(const float) k_scale;        /* 8-bit per-tensor caches: device floats, NULL: *_value */
    ATTN__DPTR(const float) v_scale;
    long long key_stride_token, key_stride_head;     /* elements */
    long long value_stride_token, value_stride_head; /* elements */
    long long num_slots;                    /* num_blocks * block_size: slots are -1 .. num_slots - 1 */
    int num_tokens;
    int num_kv_heads;
    int block_size;
    float k_scale_value, v_scale_value;
    int check_slots;                        /* 1: slots the host has not checked (device memory):
                                               every CTA checks them all first, and none writes
                                               when one is out of range */
} attn__cache_write_params;

/* attn_reshape_and_cache_inline: the same with the slots in the parameters. */
typedef struct attn__cache_write_inline_params {
    attn__cache_write_params p;
    long long slots[ATTN__INLINE_SLOTS];    /* [p.num_tokens]; -1 skips */
} attn__cache_write_inline_params;

/* attn_concat_and_cache_mla (cache_write.cu): kv_c and k_pe rows into the latent cache. */
typedef struct attn__latent_write_params {
    ATTN__DPTR(const void) kv_c;            /* DT_IN [tokens, KV_LORA_RANK] */
    ATTN__DPTR(const void) k_pe;            /* DT_IN [tokens, ROPE_DIM] */
    ATTN__DPTR(void) kv_cache;              /* DT_CACHE [num_blocks, block_size, KV_LORA_RANK + ROPE_DIM] */
    ATTN__DPTR(const long long) slot_mapping; /* [tokens]; -1 skips (the _inline kernel: unused) */
    long long kv_c_stride_token;            /* elements */
    long long k_pe_stride_token;            /* elements */
    long long num_slots;                    /* num_blocks * block_size */
    int num_tokens;
    int check_slots;                        /* as attn__cache_write_params */
    ATTN__DPTR(const float) k_scale;        /* fp8 latent: the per-tensor scale (device float; NULL: value) */
    float k_scale_value;
    int pad1;
} attn__latent_write_params;

typedef struct attn__latent_write_inline_params {
    attn__latent_write_params p;
    long long slots[ATTN__INLINE_SLOTS];    /* [p.num_tokens]; -1 skips */
} attn__latent_write_inline_params;

/* attn_mla_gather (cache_write.cu): a chunk of one request's latent rows, contiguous. */
typedef struct attn__mla_gather_params {
    ATTN__DPTR(const void) kv_cache;
    ATTN__DPTR(const int) block_table;
    ATTN__DPTR(void) lat;                   /* DT_CACHE rows; an fp8 latent: DT_IN rows, code * scale */
    int key0, nkeys, block_size, pad0;
    ATTN__DPTR(const float) k_scale;        /* fp8 latent (as attn__latent_write_params) */
    float k_scale_value;
    int pad1;
} attn__mla_gather_params;

/* attn_merge_attn_states (merge.cu). */
typedef struct attn__merge_params {
    ATTN__DPTR(const void) out_a;
    ATTN__DPTR(const float) lse_a;
    ATTN__DPTR(const void) out_b;
    ATTN__DPTR(const float) lse_b;
    ATTN__DPTR(void) out;
    ATTN__DPTR(float) lse;                  /* NULL: no LSE output */
    long long out_a_stride_token, out_a_stride_head; /* elements */
    long long out_b_stride_token, out_b_stride_head;
    long long out_stride_token, out_stride_head;
    long long lse_a_stride_token, lse_a_stride_head;
    long long lse_b_stride_token, lse_b_stride_head;
    long long lse_stride_token, lse_stride_head;
    int num_tokens;
    int num_heads;
    int base_a, base_b, base_out;           /* 0: base e, 1: base 2 */
    int pad0;
} attn__merge_params;

/* attn_mla_decode, attn_mla_merge (mla_decode.cu, mla_decode_sm90.cu): the work list and
   partials are described at the top of mla_decode_sm90.cu. */
typedef struct attn__mla_decode_params {
    ATTN__DPTR(const void) q;               /* [.., num_heads, >= KV_LORA] q_latent */
    ATTN__DPTR(const void) q_pe;            /* [.., num_heads, ROPE] */
    ATTN__DPTR(const void) kv_cache;        /* [num_blocks, BLOCK_SIZE, KV_LORA + ROPE] */
    ATTN__DPTR(void) out;                   /* [.., num_heads, KV_LORA] */
    ATTN__DPTR(float) lse;                  /* [.., num_heads] or NULL */
    ATTN__DPTR(const int) block_table;      /* [reqs][block_table_stride] */
    ATTN__DPTR(const int) work;
    ATTN__DPTR(const int) num_work;
    ATTN__DPTR(const int) merge;
    ATTN__DPTR(const int) num_merge;
    ATTN__DPTR(float) partial_o;            /* [slots][ROWS][KV_LORA] */
    ATTN__DPTR(float) partial_lse;          /* [slots][ROWS] (base 2) */
    long long q_stride_token, q_stride_head, q_pe_stride_token, q_pe_stride_head;
    long long out_stride_token, out_stride_head, lse_stride_token, lse_stride_head;
    long long block_table_stride;
    int num_heads;
    float scale;
    ATTN__DPTR(const float) k_scale;        /* fp8 latent (DT_KV 4/5): the per-tensor scale, one
                                               device float read at every launch; NULL: the value */
    float k_scale_value;
    int pad0;
    /* sparse MLA (mla_decode.cu, SPARSE 1): query token t attends the positions of its
       request that indices[t][0 .. topk) name (-1 or out of [0, seq_len): skipped) */
    ATTN__DPTR(const int) indices;          /* [tokens][indices_stride] int32 */
    ATTN__DPTR(const int) seq_lens;         /* [reqs] */
    ATTN__DPTR(const int) token_req;        /* [tokens]: each batch token's request */
    ATTN__DPTR(const float) sinks;          /* [num_heads] natural-log sinks (SPARSE) or NULL */
    long long indices_stride;
    int topk;
    int pad1;
} attn__mla_decode_params;

/* attn_mla_prefill (mla_prefill.cu, mla_prefill_sm90.cu): one launch per request and chunk
   of keys (mla_prefill_sm90.cu's top comment). */
typedef struct attn__mla_prefill_params {
    ATTN__DPTR(const void) q;               /* [rows][heads][>= DN]: the first DN columns of the query */
    ATTN__DPTR(const void) q_pe;            /* [rows][heads][ROPE] */
    ATTN__DPTR(const void) k_nope;          /* [keys][heads][DN] */
    ATTN__DPTR(const void) k_pe;            /* [keys][ROPE] */
    ATTN__DPTR(const void) v;               /* [keys][heads][DV] */
    ATTN__DPTR(void) out;                   /* [rows][heads][DV] */
    ATTN__DPTR(float) lse;                  /* [rows][heads] (base e) or NULL; required with MERGE */
    long long q_stride_token, q_stride_head, q_pe_stride_token, q_pe_stride_head;
    long long k_stride_token, k_stride_head, kpe_stride_token, v_stride_token, v_stride_head;
    long long out_stride_token, out_stride_head, lse_stride_token, lse_stride_head;
    int q_row0, nq, pos0, key_pos0, nkeys, flags; /* flags: 1 causal, 2 merge into out/lse */
    float scale;
    int pad0;
} attn__mla_prefill_params;

/* Each size is the sum of its members' (no implicit padding anywhere, so the host's C
   compiler and the device's agree on every offset); a member added or moved must keep
   that, and the sizes here are updated with it. */
#define ATTN__PARAMS_SIZE(T, n) typedef char T##_size_check[sizeof(T) == (n) ? 1 : -1]
ATTN__PARAMS_SIZE(attn__launch_config, 40);
ATTN__PARAMS_SIZE(attn__paged_params, 21 * 8 + 7 * 8 + 12 * 4);
ATTN__PARAMS_SIZE(attn__cache_write_params, 6 * 8 + 5 * 8 + 6 * 4);
ATTN__PARAMS_SIZE(attn__cache_write_inline_params, 112 + ATTN__INLINE_SLOTS * 8);
ATTN__PARAMS_SIZE(attn__latent_write_params, 4 * 8 + 3 * 8 + 2 * 4 + 8 + 2 * 4);
ATTN__PARAMS_SIZE(attn__latent_write_inline_params, 80 + ATTN__INLINE_SLOTS * 8);
ATTN__PARAMS_SIZE(attn__mla_gather_params, 3 * 8 + 4 * 4 + 8 + 2 * 4);
ATTN__PARAMS_SIZE(attn__merge_params, 6 * 8 + 12 * 8 + 6 * 4);
ATTN__PARAMS_SIZE(attn__mla_decode_params, 12 * 8 + 9 * 8 + 2 * 4 + 8 + 2 * 4 + 4 * 8 + 8 + 2 * 4);
ATTN__PARAMS_SIZE(attn__mla_prefill_params, 7 * 8 + 13 * 8 + 8 * 4);
#undef ATTN__PARAMS_SIZE

#endif /* ATTN_PARAMS_CUH */
/* >>params-end */

typedef struct attn__cuda_module {
    attn__CUmodule module;
    attn__CUfunction main, second, third; /* the kernel; the others of its role, where it has them */
    attn__launch_config config;      /* attention kernels: the one they export */
} attn__cuda_module;

/* attn__cuda_load's flags */
#define ATTN__LOAD_PAGED 1   /* read attn_paged_config and set the dynamic shared memory */
#define ATTN__LOAD_ARCH_A 2  /* compile for sm_XYa: the architecture-specific instructions
                                (wgmma), which run on that exact compute capability only */

/* Reads a loaded kernel's launch configuration, the attn__launch_config global `name`, into
   m->config and allows m->main that much dynamic shared memory. */
static attn_status attn__cuda_configure(attn_context *ctx, attn__cuda_module *m, const char *name, const char *file,
                                        const char *options, char *reason, size_t reason_size) {
    attn__cuda_driver *cu = ctx->cuda;
    attn__CUdeviceptr g = 0;
    size_t gb = 0;
    attn__CUresult rc;
    if ((rc = cu->cuModuleGetGlobal(&g, &gb, m->module, name)) != 0 || gb != sizeof m->config ||
        (rc = cu->cuMemcpyDtoHAsync(&m->config, g, sizeof m->config, NULL)) != 0 ||
        (rc = cu->cuStreamSynchronize(NULL)) != 0 ||
        (m->config.shared_bytes > 48 * 1024 &&
         (rc = cu->cuFuncSetAttribute(m->main, ATTN__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, m->config.shared_bytes)) != 0)) {
        attn__fmt(reason, reason_size, "%s [%s]: cannot configure it (CUresult %d, config %zu bytes)", file, options,
                  rc, gb);
        return ATTN_ERROR_PLATFORM;
    }
    return ATTN_OK;
}

/* The CTAs of a configured kernel (m->main at m->config's threads and shared memory) the
   device holds at once: occupancy x SMs (occupancy `fallback` where the driver cannot say).
   The split-KV policies aim at one wave of them. */
static int attn__cuda_resident(attn_context *ctx, const attn__cuda_module *m, int fallback) {
    int per_sm = 0;
    if (ctx->cuda->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, m->main, m->config.threads, (size_t)m->config.shared_bytes) != 0 ||
        per_sm < 1)
        per_sm = fallback;
    return per_sm * ATTN__MAX(1, ctx->platform.cuda_multiprocessors);
}

/* Compiles (or finds) `file` with `options` for the device and loads the functions. */
static attn_status attn__cuda_load(attn_context *ctx, const char *file, const char *options,
                                   const char *main_name, const char *second_name, int flags,
                                   attn__cuda_module *m, char *reason, size_t reason_size) {
    attn__cuda_driver *cu = ctx->cuda;
    const attn__cubin *c = NULL;
    char arch[16];
    int source = 0;
    attn__CUresult rc;
    attn_status st;
    memset(m, 0, sizeof *m);
    attn__fmt(arch, sizeof arch, "sm_%d%d%s", ctx->platform.cuda_capability_major,
              ctx->platform.cuda_capability_minor, flags & ATTN__LOAD_ARCH_A ? "a" : "");
    st = attn__kernel_get(ctx, file, options, arch, &c, &source);
    if (st != ATTN_OK) {
        attn__fmt(reason, reason_size, "%s [%s] does not compile for %s: %.90s", file, options, arch,
                  attn_context_last_error(ctx));
        return st;
    }
    if ((rc = cu->cuModuleLoadData(&m->module, c->data)) != 0 ||
        (rc = cu->cuModuleGetFunction(&m->main, m->module, main_name)) != 0 ||
        (second_name && (rc = cu->cuModuleGetFunction(&m->second, m->module, second_name)) != 0)) {
        attn__fmt(reason, reason_size, "%s [%s]: the driver cannot load it (CUresult %d)", file, options, rc);
        if (m->module) cu->cuModuleUnload(m->module);
        m->module = NULL;
        return ATTN_ERROR_PLATFORM;
    }
    if ((flags & ATTN__LOAD_PAGED) &&
        attn__cuda_configure(ctx, m, "attn_paged_config", file, options, reason, reason_size) != ATTN_OK) {
        cu->cuModuleUnload(m->module);
        m->module = NULL;
        return ATTN_ERROR_PLATFORM;
    }
    return ATTN_OK;
}


/* ---- kernel families: which kernels a CUDA backend launches, as data ----------------------
   A CUDA backend is one row: for each role a layer loads, the file, its entry points, the
   architecture it is compiled for, the launch configuration it exports and the parameter
   struct it takes (kernels/attn_params.cuh). Layer creation and the launch paths read the
   row of the layer's backend, so a Hopper or Blackwell variant of a backend is a new row
   and its kernel files, not new branches. The defines of a variant come from the layer
   descriptor (attn__cuda_layer_variants, attn__cuda_mla_variants). */
typedef enum attn__role {
    ATTN__ROLE_DECODE,      /* decode tiles (standard) / the absorbed decode and its merge (MLA) */
    ATTN__ROLE_PREFILL,     /* prefill tiles / the up-projected prefill attention */
    ATTN__ROLE_CACHE,       /* the cache write and its _inline twin (MLA: and the gather) */
    ATTN__ROLE_DECODE_WIDE, /* the wide decode shape (standard, sm_90 and newer; optional) /
                               the sparse MLA decode (MLA: SPARSE 1 of the family's file;
                               attn__cuda_mla_sparse_role) */
    ATTN__ROLE_COUNT
} attn__role;

typedef struct attn__kernel_role {
    const char *file;                    /* kernels/FILE; NULL: the family has no such role */
    const char *entry[3];                /* main, second, third entry points (NULL: none) */
    const char *config;                  /* the attn__launch_config it exports, or NULL */
    int arch_a;                          /* compiled for sm_XYa (wgmma): that exact device */
    int tma;                             /* 1: reads the cache through a tensor map (its config's
                                            tma_box_rows; the platform needs cuda_tma) */
    const char *params;                  /* the struct its entry points take */
} attn__kernel_role;

typedef struct attn__kernel_family {
    attn_backend_id backend;
    int min_cc;                          /* compute capability (major * 10 + minor) at least */
    int exact_cc;                        /* > 0: exactly this one (sm_XYa kernels) */
    attn__kernel_role role[ATTN__ROLE_COUNT];
} attn__kernel_family;

#define ATTN__PAGED_ROLE(file, entry, arch_a, tma) {file, {entry, NULL, NULL}, "attn_paged_config", arch_a, tma, \
                                               "attn__paged_params"}
#define ATTN__CACHE_ROLE {"cache_write.cu", {"attn_reshape_and_cache", "attn_reshape_and_cache_inline", NULL}, NULL, 0, 0, \
                          "attn__cache_write_params"}
#define ATTN__LATENT_ROLE {"cache_write.cu", {"attn_concat_and_cache_mla", "attn_mla_gather", "attn_concat_and_cache_mla_inline"}, \
                           NULL, 0, 0, "attn__latent_write_params, attn__mla_gather_params"}
#define ATTN__MLA_DECODE_ROLE(file, arch_a, tma) {file, {"attn_mla_decode", "attn_mla_merge", NULL}, "attn_mla_config", arch_a, tma, \
                                             "attn__mla_decode_params"}
#define ATTN__MLA_PREFILL_ROLE(file, arch_a) {file, {"attn_mla_prefill", NULL, NULL}, "attn_mha_config", arch_a, 0, \
                                              "attn__mla_prefill_params"}
#define ATTN__MLA_SPARSE_ROLE(file, arch_a, tma) {file, {"attn_mla_decode", "attn_mla_merge", NULL}, "attn_mla_config", arch_a, tma, \
                                            "attn__mla_decode_params"}
#define ATTN__NO_ROLE {NULL, {NULL, NULL, NULL}, NULL, 0, 0, NULL}
static const attn__kernel_family attn__kernel_families[] = {
    {ATTN_BACKEND_CUDA, 80, 0,
     {ATTN__PAGED_ROLE("paged_attention.cu", "attn_paged_attention", 0, 0),
      ATTN__PAGED_ROLE("paged_attention.cu", "attn_paged_attention", 0, 0), ATTN__CACHE_ROLE,
      ATTN__PAGED_ROLE("paged_attention.cu", "attn_paged_attention", 0, 0)}},
    {ATTN_BACKEND_CUDA_SM90, 90, 90,
     {ATTN__PAGED_ROLE("paged_attention.cu", "attn_paged_attention", 0, 0),
      ATTN__PAGED_ROLE("paged_prefill_sm90.cu", "attn_paged_prefill_sm90", 1, 1), ATTN__CACHE_ROLE,
      ATTN__PAGED_ROLE("paged_attention.cu", "attn_paged_attention", 0, 0)}},
    {ATTN_BACKEND_CUDA_MLA_SM90, 90, 90,
     {ATTN__MLA_DECODE_ROLE("mla_decode_sm90.cu", 1, 1), ATTN__MLA_PREFILL_ROLE("mla_prefill_sm90.cu", 1),
      ATTN__LATENT_ROLE, ATTN__MLA_SPARSE_ROLE("mla_decode_sm90.cu", 1, 1)}},
    {ATTN_BACKEND_CUDA_MLA, 80, 0,
     {ATTN__MLA_DECODE_ROLE("mla_decode.cu", 0, 0), ATTN__MLA_PREFILL_ROLE("mla_prefill.cu", 0), ATTN__LATENT_ROLE,
      ATTN__MLA_SPARSE_ROLE("mla_decode.cu", 0, 0)}},
};
#undef ATTN__PAGED_ROLE
#undef ATTN__CACHE_ROLE
#undef ATTN__LATENT_ROLE
#undef ATTN__MLA_DECODE_ROLE
#undef ATTN__MLA_PREFILL_ROLE
#undef ATTN__MLA_SPARSE_ROLE
#undef ATTN__NO_ROLE

/* The kernel family of a built-in CUDA backend (NULL for any other id). */
static const attn__kernel_family *attn__kernel_family_of(attn_backend_id id) {
    size_t i;
    for (i = 0; i < sizeof attn__kernel_families / sizeof attn__kernel_families[0]; i++)
        if (attn__kernel_families[i].backend == id) return &attn__kernel_families[i];
    return NULL;
}

/* 0 when the platform's device runs the family's kernels, else the reason. */
static int attn__kernel_family_refuses(const attn__kernel_family *f, const attn_platform *p, char *reason, size_t size) {
    const int cc = p->cuda_capability_major * 10 + p->cuda_capability_minor;
    int r;
    if (f->exact_cc && cc != f->exact_cc) {
        attn__fmt(reason, size, "compute capability %d.%d (allowed: %d.%d: its kernels are compiled for sm_%da, "
                  "whose instructions run on that device only)", p->cuda_capability_major, p->cuda_capability_minor,
                  f->exact_cc / 10, f->exact_cc % 10, f->exact_cc);
        return 1;
    }
    if (cc < f->min_cc) {
        attn__fmt(reason, size, "compute capability %d.%d (allowed: %d.%d or newer: mma.sync, cp.async)",
                  p->cuda_capability_major, p->cuda_capability_minor, f->min_cc / 10, f->min_cc % 10);
        return 1;
    }
    for (r = 0; r < ATTN__ROLE_COUNT; r++)
        if (f->role[r].tma && !p->cuda_tma) {
            attn__fmt(reason, size, "its %s reads the cache through TMA, which this platform lacks (%s)",
                      f->role[r].file, p->cuda_tma_reason);
            return 1;
        }
    if (!p->nvrtc_version) {
        attn__fmt(reason, size, "%s", p->nvrtc_reason);
        return 1;
    }
    return 0;
}

/* ATTN_KERNEL_DEFINES applied to a layer's variants (opt[role] not empty: roles it compiles);
   a malformed value: one WARN, nothing applied (attn__env_kernel_defines). */
static void attn__kernel_defines(const attn_context *ctx, char opt[ATTN__ROLE_COUNT][256]) {
    char add[ATTN__ROLE_COUNT][256];
    int r;
    if (!attn__env_kernel_defines(ctx, add)) return;
    for (r = 0; r < ATTN__ROLE_COUNT; r++) {
        size_t n = strlen(opt[r]), m = strlen(add[r]);
        if (!opt[r][0] || !m) continue;
        if (n + m < 256) memcpy(opt[r] + n, add[r], m + 1);
        else attn__env_invalid(ctx, "ATTN_KERNEL_DEFINES", attn__trim_env("ATTN_KERNEL_DEFINES"),
                               "defines that fit a variant's 255 characters");
    }
}

/* Compiles (or finds) one role's kernel with `options` and loads its entry points and
   launch configuration. */
static attn_status attn__cuda_load_role(attn_context *ctx, const attn__kernel_role *r, const char *options,
                                        attn__cuda_module *m, char *reason, size_t reason_size) {
    attn__CUresult rc;
    attn_status st = attn__cuda_load(ctx, r->file, options, r->entry[0], r->entry[1],
                                     r->arch_a ? ATTN__LOAD_ARCH_A : 0, m, reason, reason_size);
    if (st != ATTN_OK) return st;
    if (r->entry[2] && (rc = ctx->cuda->cuModuleGetFunction(&m->third, m->module, r->entry[2])) != 0) {
        attn__fmt(reason, reason_size, "%s [%s]: no %s (CUresult %d)", r->file, options, r->entry[2], rc);
        st = ATTN_ERROR_PLATFORM;
    }
    if (st == ATTN_OK && r->config) st = attn__cuda_configure(ctx, m, r->config, r->file, options, reason, reason_size);
    if (st != ATTN_OK) {
        ctx->cuda->cuModuleUnload(m->module);
        memset(m, 0, sizeof *m);
    }
    return st;
}

/* =======================================================================================
   >>cuda_paged
   The paged-attention backends, CUDA and CUDA_SM90 (its prefill tiles on wgmma): kernels
   compiled by NVRTC at layer creation, a fixed-capacity schedule uploaded by build with one
   asynchronous copy, forward as launches on the caller's stream (graph-safe).
   ======================================================================================= */

/* ---- backend state ---------------------------------------------------------------------- */

/* Context level: the merge kernels of attn_merge_attn_states, per (dtype, head size),
   loaded on first use. */
typedef struct attn__cuda_merge_entry {
    int dt, head_dim;
    attn__cuda_module m;
} attn__cuda_merge_entry;

typedef struct attn__cuda_state {
    attn__cuda_merge_entry merges[16];
    int num_merges;
} attn__cuda_state;

/* Layer level: the two attention variants (decode tiles, prefill tiles), the cache write,
   the ALiBi slopes on the device. */
typedef struct attn__cuda_layer {
    attn__cuda_module decode, prefill, cache;
    attn__cuda_module decode_wide;   /* small batches (sm_90+, head <= 128): module 0 if none */
    attn__CUdeviceptr alibi;
    int resident;                    /* decode CTAs the device holds at once: occupancy x SMs */
    int resident_wide;               /* the same for decode_wide (0: none) */
    int resident_prefill;            /* the same for the prefill tiles */
    int cascade;                     /* the prefill tiles can run a cascade's prefix pass: no
                                        sliding window, no ALiBi (the prefix rows' positions are
                                        not their own); see attn__cuda_build */
} attn__cuda_layer;

/* A layer's per-tensor fp8 scales as the kernels take them: a device pointer (read at every
   launch: a replayed graph sees the value of the moment) or, without one, the value. Per
   token and head, and 16/32-bit caches: value 1, no pointer (the kernels ignore them). */
static void attn__cuda_kv_scales(const attn_layer_desc *d, attn__CUdeviceptr *kp, attn__CUdeviceptr *vp, float *kv,
                                 float *vv) {
    int per_tensor = attn__dtypes[d->kv_cache_dtype].cache_only == 1 && d->kv_scale_kind == ATTN_KV_SCALE_PER_TENSOR;
    const attn_kv_scale *vs = d->use_mla ? &d->k_scale : &d->v_scale; /* MLA: one latent scale */
    *kp = per_tensor && d->k_scale.ptr ? (attn__CUdeviceptr)(uintptr_t)d->k_scale.ptr : 0;
    *vp = per_tensor && vs->ptr ? (attn__CUdeviceptr)(uintptr_t)vs->ptr : 0;
    *kv = per_tensor && !d->k_scale.ptr ? d->k_scale.value : 1.0f;
    *vv = per_tensor && !vs->ptr ? vs->value : 1.0f;
}

static const attn__kernel_family *attn__kernel_family_of(attn_backend_id id);
static int attn__kernel_family_refuses(const attn__kernel_family *f, const attn_platform *p, char *reason, size_t size);

/* The device runs the backend's kernel family (compute capability, NVRTC). */
static int attn__cuda_family_check(const attn_backend *self, const attn_platform *p, char *reason, size_t size) {
    const attn__kernel_family *f = attn__kernel_family_of(self->id);
    if (!f) {
        attn__fmt(reason, size, "backend %s has no CUDA kernel family (its id names none)", self->name);
        return 1;
    }
    return attn__kernel_family_refuses(f, p, reason, size);
}

static int attn__cuda_check(const attn_backend *self, const attn_layer_desc *d, const attn_platform *p,
                            char *reason, size_t size) {
    if (attn__cuda_family_check(self, p, reason, size)) return 1;
    if (d->num_heads / d->num_kv_heads > 128) {
        attn__fmt(reason, size, "%d query heads per KV head (allowed: at most 128)",
                  d->num_heads / d->num_kv_heads);
        return 1;
    }
    if (attn__dtypes[d->kv_cache_dtype].cache_only && d->head_size % 16 != 0) {
        attn__fmt(reason, size, "head_size %d with a %s cache (allowed: a multiple of 16: the kernels read "
                  "16 codes of a row at a time; the CPU backend takes the others)", d->head_size,
                  attn_dtype_name(d->kv_cache_dtype));
        return 1;
    }
    /* past 256 two warp groups split O's columns (paged_attention.cu, WIDE HEADS): tensor
       cores only, halves of whole 16-column fragments */
    if (d->head_size > 256 && d->head_size % 32 != 0) {
        attn__fmt(reason, size, "head_size %d (allowed: multiples of 8 up to 256, of 32 from 288 to 512; the "
                  "CPU backend takes the others)", d->head_size);
        return 1;
    }
    if (d->head_size > 256 && !attn__dtypes[d->kv_cache_dtype].cache_only &&
        (d->dtype != d->kv_cache_dtype || d->dtype == ATTN_DTYPE_F32)) {
        attn__fmt(reason, size, "head_size %d with dtype %s and kv_cache_dtype %s (allowed past 256: one 16-bit "
                  "type for both, or an 8-bit cache: the tensor-core kernels; the CPU backend takes the others)",
                  d->head_size, attn_dtype_name(d->dtype), attn_dtype_name(d->kv_cache_dtype));
        return 1;
    }
    return 0;
}

static attn_status attn__cuda_context_init(const attn_backend *self, attn_context *ctx, void **state,
                                           char *reason, size_t size) {
    attn__cuda_state *s;
    attn_status st;
    (void)self;
    if ((st = attn__cuda_enter(ctx, "CUDA backend")) != ATTN_OK) {
        attn__fmt(reason, size, "%s", attn_context_last_error(ctx));
        return st;
    }
    attn__cuda_leave(ctx);
    s = (attn__cuda_state *)attn__calloc(1, sizeof *s);
    if (!s) {
        attn__fmt(reason, size, "out of memory");
        return ATTN_ERROR_OUT_OF_MEMORY;
    }
    *state = s;
    return ATTN_OK;
}

static void attn__cuda_context_release(const attn_backend *self, attn_context *ctx, void *state) {
    attn__cuda_state *s = (attn__cuda_state *)state;
    int i;
    (void)self;
    if (!s) return;
    if (s->num_merges && attn__cuda_enter(ctx, "CUDA backend") == ATTN_OK) {
        for (i = 0; i < s->num_merges; i++) ctx->cuda->cuModuleUnload(s->merges[i].m.module);
        attn__cuda_leave(ctx);
    }
    attn__free(s);
}

/* Query tokens per CTA: decode tiles hold 16 rows (one mma row tile), prefill tiles 64, or
   128 rows with two row tiles per warp (FlashAttention-2's shape, WARP_ROWS 2 in
   kernels/paged_attention.cu) where the kernel takes it: tensor cores (q and cache of one
   16-bit type), head <= 128, no soft cap, no ALiBi, an even number of 16-row tiles. */
static int attn__cuda_warp_rows(const attn_layer_desc *d) {
    int group = d->num_heads / d->num_kv_heads, t = 128 / group;
    if (t < 1 || d->dtype != d->kv_cache_dtype || d->dtype == ATTN_DTYPE_F32 || d->head_size > 128 ||
        d->logits_soft_cap > 0.0f || d->alibi_slopes)
        return 1;
    return ((t * group + 15) / 16) % 2 == 0 ? 2 : 1;
}

/* sm90: the CUDA_SM90 layer's prefill kernel (128 rows per CTA, two warpgroups). Heads past
   256 (WIDE HEADS): 64-row prefill tiles need 212 KiB of shared memory at head 512 (Q, then
   two stages of 32 K and V rows of 1 KiB or the epilogue's f32 O, then the exchanged
   partial S); with less per block (sm_80's 163 KiB), 32 rows and 16-key tiles (the kernel's
   own choice there). */
static int attn__cuda_tile_tokens(const attn_layer_desc *d, const attn_platform *plat, int prefill, int sm90) {
    int group = d->num_heads / d->num_kv_heads;
    int rows = !prefill ? 16 : sm90 || attn__cuda_warp_rows(d) == 2 ? 128
               : d->head_size > 256 && plat->cuda_shared_per_block < 212 * 1024 ? 32 : 64;
    int t = rows / group;
    return t > 0 ? t : 1;
}

static void attn__cuda_layer_free(attn_context *ctx, attn__cuda_layer *L) {
    if (!L) return;
    if (L->decode.module) ctx->cuda->cuModuleUnload(L->decode.module);
    if (L->decode_wide.module) ctx->cuda->cuModuleUnload(L->decode_wide.module);
    if (L->prefill.module) ctx->cuda->cuModuleUnload(L->prefill.module);
    if (L->cache.module) ctx->cuda->cuModuleUnload(L->cache.module);
    if (L->alibi) ctx->cuda->cuMemFree(L->alibi);
    attn__free(L);
}

/* The defines of the kernel variants a layer loads, one per role of its family (attn__role:
   decode tiles, prefill tiles, the cache write, wide decode tiles; an empty string where the
   layer has none). The prefill tiles of a family whose prefill role is compiled for sm_XYa
   (CUDA_SM90's wgmma kernel) are 128 rows and take neither soft cap nor ALiBi defines. One
   place, so tests (tests/test_cuda.c) ask for exactly what layer creation compiles (the
   files: the family's roles); tools see the compiled variants through the public log
   (ATTN_LOG_KERNEL_COMPILED) and attn_kernel_compile.
   Decode tiles come in two shapes. The default CTA (4 warps, 64-key tiles, 3 stages on
   sm_90, two CTAs per SM) streams best when the batch fills the device; a batch of no more
   work items (decode and prefill tiles before splitting) than the wide CTAs the device
   holds at once (one per SM) runs faster with one wide CTA per SM (8 warps, 128-key
   tiles, 3 stages in 211 KiB): fewer splits to merge, twice the keys per barrier (H200,
   32/8 heads, head 128: batch 16 x 4k 77.8 -> 72.4 us, 16 x 1k 28.3 -> 24.1, 1 x 16k
   38.5 -> 33.1; batch 64 and up 1-4 % slower, so they keep the default). Only where its
   stages fit: sm_90 or newer with the shared memory (not sm_120's 99 KiB), tensor cores,
   head <= 128, decode tiles of one row tile. */

/* 16-row Q tile + 3 stages of 128 K and 128 V rows (padded by 16 bytes) + row offsets */
static int attn__cuda_wide_smem(const attn_layer_desc *d) {
    int pitch = ((d->head_size + 15) / 16 * 16 + 8) * 2;
    return 16 * pitch + 3 * 128 * 8 + 3 * 2 * 128 * pitch;
}

static int attn__cuda_has_wide_decode(const attn_layer_desc *d, const attn_platform *p) {
    int group = d->num_heads / d->num_kv_heads;
    return p->cuda_capability_major >= 9 && p->cuda_shared_per_block >= attn__cuda_wide_smem(d) &&
           d->dtype == d->kv_cache_dtype && d->dtype != ATTN_DTYPE_F32 && d->head_size <= 128 && group <= 16;
}

static void attn__cuda_layer_variants(const attn_layer_desc *d, const attn_platform *plat, const attn__kernel_family *f,
                                      char opt[ATTN__ROLE_COUNT][256]) {
    const int sm90 = f->role[ATTN__ROLE_PREFILL].arch_a; /* the wgmma prefill tiles */
    int group = d->num_heads / d->num_kv_heads, pass;
    for (pass = 0; pass < 2; pass++) {
        int n = attn__fmt(opt[pass], 256, "-DHEAD_DIM=%d -DBLOCK_SIZE=%d -DGROUP=%d -DDT_Q=%d -DDT_KV=%d "
                          "-DTILE_TOKENS=%d -DWINDOW=%d", d->head_size, d->block_size, group,
                          attn__cuda_dt(d->dtype), attn__cuda_dt(d->kv_cache_dtype),
                          attn__cuda_tile_tokens(d, plat, pass, pass && sm90), d->sliding_window > 0);
        if (d->kv_scale_kind == ATTN_KV_SCALE_PER_TOKEN_HEAD) /* the 8-bit caches' scale layout */
            n += attn__fmt(opt[pass] + n, 256 - (size_t)n, " -DKV_PTH=1");
        if (!(pass && sm90)) /* paged_attention.cu's features (CUDA_SM90's scope has neither) */
            attn__fmt(opt[pass] + n, 256 - (size_t)n, " -DSOFTCAP=%d -DALIBI=%d -DWARP_ROWS=%d%s",
                      d->logits_soft_cap > 0.0f, d->alibi_slopes != NULL, pass ? attn__cuda_warp_rows(d) : 1,
                      pass ? "" : " -DPERSISTENT=1 -DCASCADE=1"); /* decode: a captured launch is one
                                                                      wave; rows join a cascade's prefix */
    }
    attn__fmt(opt[2], 256, "-DHEAD_DIM=%d -DDT_IN=%d -DDT_CACHE=%d%s", d->head_size,
              attn__cuda_dt(d->dtype), attn__cuda_dt(d->kv_cache_dtype),
              d->kv_scale_kind == ATTN_KV_SCALE_PER_TOKEN_HEAD ? " -DKV_PTH=1" : "");
    opt[3][0] = 0;
    if (f->role[ATTN__ROLE_DECODE_WIDE].file && attn__cuda_has_wide_decode(d, plat))
        attn__fmt(opt[3], 256, "%s -DKV_TILE=128 -DWARPS_N=8 -DKV_STAGES=3", opt[0]);
}

static attn_status attn__cuda_layer_init(const attn_backend *self, attn_layer *layer, void **state,
                                         char *reason, size_t size) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn__kernel_family *f = attn__kernel_family_of(self->id);
    int role;
    char opt[ATTN__ROLE_COUNT][256];
    attn__cuda_layer *L;
    attn_status st;
    if (!f) {
        attn__fmt(reason, size, "backend %s has no CUDA kernel family (its id names none)", self->name);
        return ATTN_ERROR_UNSUPPORTED;
    }
    L = (attn__cuda_layer *)attn__calloc(1, sizeof *L);
    if (!L) {
        attn__fmt(reason, size, "out of memory");
        return ATTN_ERROR_OUT_OF_MEMORY;
    }
    if ((st = attn__cuda_enter(ctx, "CUDA layer")) != ATTN_OK) {
        attn__fmt(reason, size, "%s", attn_context_last_error(ctx));
        attn__free(L);
        return st;
    }
    attn__cuda_layer_variants(d, &ctx->platform, f, opt);
    attn__kernel_defines(ctx, opt);
    for (role = ATTN__ROLE_DECODE; role <= ATTN__ROLE_CACHE && st == ATTN_OK; role++)
        st = attn__cuda_load_role(ctx, &f->role[role], opt[role],
                                  role == ATTN__ROLE_DECODE ? &L->decode : role == ATTN__ROLE_PREFILL ? &L->prefill : &L->cache,
                                  reason, size);
    if (st == ATTN_OK && opt[ATTN__ROLE_DECODE_WIDE][0]) {
        /* a speed-only variant: if it cannot load, the layer runs every decode tile in the
           default shape (one WARN, with the reason) */
        char why[256];
        if (attn__cuda_load_role(ctx, &f->role[ATTN__ROLE_DECODE_WIDE], opt[ATTN__ROLE_DECODE_WIDE], &L->decode_wide, why,
                                 sizeof why) != ATTN_OK) {
            attn__log(ctx, ATTN_LOG_LEVEL_WARN, ATTN_LOG_KERNEL_COMPILE_FAILED,
                      "CUDA layer: the wide decode tiles (%s) are not available, small batches run the "
                      "default shape: %s", opt[3], why);
            memset(&L->decode_wide, 0, sizeof L->decode_wide);
        }
    }
    if (st == ATTN_OK) { /* the split-KV target: one wave of resident decode CTAs */
        L->resident = attn__cuda_resident(ctx, &L->decode, 2);
        if (L->decode_wide.module)
            L->resident_wide = attn__cuda_resident(ctx, &L->decode_wide, 1); /* its shared memory allows one per SM */
        L->resident_prefill = attn__cuda_resident(ctx, &L->prefill, 1);
        L->cascade = d->sliding_window == 0 && !d->alibi_slopes;
    }
    if (st == ATTN_OK && d->alibi_slopes) {
        size_t bytes = (size_t)d->num_heads * sizeof(float);
        attn__CUresult rc = ctx->cuda->cuMemAlloc(&L->alibi, bytes);
        if (rc == 0) rc = ctx->cuda->cuMemcpyHtoDAsync(L->alibi, d->alibi_slopes, bytes, NULL);
        if (rc == 0) rc = ctx->cuda->cuStreamSynchronize(NULL);
        if (rc != 0) {
            attn__fmt(reason, size, "cannot place the ALiBi slopes on the device (CUresult %d)", rc);
            st = ATTN_ERROR_PLATFORM;
        }
    }
    if (st != ATTN_OK) attn__cuda_layer_free(ctx, L);
    else *state = L;
    attn__cuda_leave(ctx);
    return st;
}

static void attn__cuda_layer_release(const attn_backend *self, attn_layer *layer, void *state) {
    attn_context *ctx = attn_layer_context(layer);
    (void)self;
    if (!state) return;
    if (attn__cuda_enter(ctx, "CUDA layer") != ATTN_OK) return;
    attn__cuda_layer_free(ctx, (attn__cuda_layer *)state);
    attn__cuda_leave(ctx);
}

/* ---- metadata: the schedule, fixed capacity, one upload per build ------------------------ */

#define ATTN__CUDA_SPLIT_MIN 256   /* fewest keys worth a split of their own */
#define ATTN__CUDA_MAX_SPLITS 32

/* One region, laid out by one function (sizes with base NULL, carves otherwise), copied
   to the device with one cuMemcpyHtoDAsync per build: counts, work lists, merges, batch. */
typedef struct attn__cuda_plan {
    int32_t *counts;               /* [6]: decode work, prefill work, decode merges, wide decode
                                      work (decode tiles run with one of the two decode
                                      variants: the other's count is 0), cascade prefix work,
                                      cascade prefix splits (0: no prefix) */
    int32_t *work[3];              /* [capacity][8] per list (0 decode either shape, 1 prefill,
                                      2 the cascade's prefix pass on the prefill tiles) */
    int32_t *merge;                /* [capacity][8] (decode splits) */
    int32_t *query_start_loc, *seq_lens;
    int64_t *slot_mapping;
    int32_t *block_table;          /* last: the upload stops after the rows in use */
} attn__cuda_plan;

/* The staged schedule region of a CUDA metadata (the standard and the MLA backends'): a
   pinned host copy that build writes, its device copy, the event of the last upload. */
typedef struct attn__cuda_staged {
    size_t bytes;                  /* of the region */
    char *staging;                 /* pinned host copy */
    attn__CUdeviceptr region;      /* the device copy */
    attn__CUevent uploaded;        /* the last build's copy; waited for before the next */
    int pending;
} attn__cuda_staged;

/* Allocates s->bytes on both sides (zeroed on the host) and the event; on failure the
   caller frees with attn__cuda_staged_free. In the entered context. */
static attn__CUresult attn__cuda_staged_alloc(attn__cuda_driver *cu, attn__cuda_staged *s) {
    attn__CUresult rc;
    if ((rc = cu->cuMemAllocHost((void **)&s->staging, s->bytes)) != 0 || (rc = cu->cuMemAlloc(&s->region, s->bytes)) != 0 ||
        (rc = cu->cuEventCreate(&s->uploaded, ATTN__CU_EVENT_DISABLE_TIMING)) != 0)
        return rc;
    memset(s->staging, 0, s->bytes);
    return 0;
}

static void attn__cuda_staged_free(attn__cuda_driver *cu, attn__cuda_staged *s) {
    if (s->pending) cu->cuEventSynchronize(s->uploaded);
    if (s->uploaded) cu->cuEventDestroy(s->uploaded);
    if (s->staging) cu->cuMemFreeHost(s->staging);
    if (s->region) cu->cuMemFree(s->region);
}

/* Before a build writes the staging copy: the previous build's upload may still read it. */
static attn__CUresult attn__cuda_staged_wait(attn__cuda_driver *cu, attn__cuda_staged *s) {
    attn__CUresult rc = s->pending ? cu->cuEventSynchronize(s->uploaded) : 0;
    if (rc == 0) s->pending = 0;
    return rc;
}

/* The batch's slots (-1 past them: a captured cache write covers the capacity, which a
   graph replays for any later batch) and its block-table rows (the metadata's copy has row
   stride max_blocks_per_req already) into the staging copy, whose last piece `table` is;
   then the upload up to the end of the rows in use, on the batch's stream. *bytes: its size. */
static attn__CUresult attn__cuda_staged_send(attn__cuda_driver *cu, attn__cuda_staged *s, const attn_metadata_desc *cap,
                                             const attn_batch *b, int64_t *slots, int32_t *table, size_t *bytes) {
    attn__CUresult rc;
    int r;
    if (b->slot_mapping && b->num_actual_tokens) memcpy(slots, b->slot_mapping, (size_t)b->num_actual_tokens * 8);
    for (r = b->slot_mapping ? b->num_actual_tokens : 0; r < cap->max_num_tokens; r++) slots[r] = -1;
    if (b->num_reqs) memcpy(table, b->block_table, (size_t)b->num_reqs * (size_t)cap->max_blocks_per_req * 4);
    *bytes = (size_t)((char *)(table + (size_t)b->num_reqs * (size_t)cap->max_blocks_per_req) - s->staging);
    rc = cu->cuMemcpyHtoDAsync(s->region, s->staging, *bytes, (attn__CUstream)b->stream);
    if (rc == 0) rc = cu->cuEventRecord(s->uploaded, (attn__CUstream)b->stream);
    if (rc == 0) s->pending = 1;
    return rc;
}

typedef struct attn__cuda_meta {
    /* geometry copied from the layer: metadata may outlive it */
    int group, num_kv_heads, tile[2], rows[2], kv_tile[2];
    int work_capacity[3], merge_capacity, slot_capacity;
    int parallelism;               /* resident decode CTAs (the layer's occupancy x SMs) */
    int parallelism_wide, kv_tile_wide; /* the same for the wide decode tiles (0: none) */
    int wide;                      /* the last build runs its decode tiles wide */
    int invariant;                 /* ATTN_BATCH_INVARIANT when the metadata was created */
    int decode_shapes;             /* the decode shapes a build of this capacity can run: 1 the
                                      default, 2 the wide one (a captured forward launches only
                                      these) */
    attn__cuda_staged up;          /* the region: plan, batch */
    attn__CUdeviceptr partial_o, partial_ml;
    attn__CUdeviceptr merge_count;   /* [merge_capacity] fused-merge arrivals, zero between forwards */
    attn__CUdeviceptr prefix_o, prefix_ml; /* cascade: work_capacity[2] partial slots of rows[1] rows */
    int parallelism_prefill;       /* resident prefill CTAs */
    int cascade_len, cascade_splits; /* the last build's prefix pass (0: none) */
    size_t upload_bytes;           /* of the last build */
    attn__cuda_plan host;          /* pointers into staging */
    attn__cuda_plan dev;           /* the same offsets as device addresses (in pointer form) */
} attn__cuda_meta;


static size_t attn__cuda_plan_layout(const attn__cuda_meta *cm, const attn_metadata_desc *cap, char *base,
                                     attn__cuda_plan *p) {
    size_t used = 0;
    p->counts = (int32_t *)attn__carve(base, &used, 6 * sizeof(int32_t), 256);
    p->work[0] = (int32_t *)attn__carve(base, &used, (size_t)cm->work_capacity[0] * 32, 256);
    p->work[1] = (int32_t *)attn__carve(base, &used, (size_t)cm->work_capacity[1] * 32, 256);
    p->work[2] = (int32_t *)attn__carve(base, &used, (size_t)cm->work_capacity[2] * 32, 256);
    p->merge = (int32_t *)attn__carve(base, &used, (size_t)cm->merge_capacity * 32, 256);
    p->query_start_loc = (int32_t *)attn__carve(base, &used, ((size_t)cap->max_num_reqs + 1) * 4, 256);
    p->seq_lens = (int32_t *)attn__carve(base, &used, (size_t)cap->max_num_reqs * 4, 256);
    p->slot_mapping = (int64_t *)attn__carve(base, &used, (size_t)cap->max_num_tokens * 8, 256);
    p->block_table = (int32_t *)attn__carve(base, &used,
                                            (size_t)cap->max_num_reqs * (size_t)cap->max_blocks_per_req * 4, 256);
    return used;
}

static void attn__cuda_meta_free(attn_context *ctx, attn__cuda_meta *cm) {
    attn__cuda_driver *cu = ctx->cuda;
    if (!cm) return;
    attn__cuda_staged_free(cu, &cm->up);
    if (cm->partial_o) cu->cuMemFree(cm->partial_o);
    if (cm->partial_ml) cu->cuMemFree(cm->partial_ml);
    if (cm->merge_count) cu->cuMemFree(cm->merge_count);
    if (cm->prefix_o) cu->cuMemFree(cm->prefix_o);
    if (cm->prefix_ml) cu->cuMemFree(cm->prefix_ml);
    attn__free(cm);
}

static attn_status attn__cuda_metadata_init(const attn_backend *self, attn_layer *layer, attn_metadata *meta) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn_metadata_desc *cap = attn_metadata_capacity(meta);
    const attn__cuda_layer *L = (const attn__cuda_layer *)attn_layer_backend_state(layer);
    attn__cuda_driver *cu = ctx->cuda;
    attn__cuda_meta *cm;
    attn__CUresult rc = 0;
    attn_status st;
    int v;
    (void)self;
    cm = (attn__cuda_meta *)attn__calloc(1, sizeof *cm);
    if (!cm)
        return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_metadata_create: cannot allocate the CUDA schedule");
    cm->group = d->num_heads / d->num_kv_heads;
    cm->num_kv_heads = d->num_kv_heads;
    cm->parallelism = ATTN__MAX(1, L->resident);
    /* the capacities below are sized by `parallelism`; the wide shape never needs more */
    cm->parallelism_wide = L->decode_wide.module ? ATTN__MIN(L->resident_wide, cm->parallelism) : 0;
    cm->kv_tile_wide = L->decode_wide.module ? L->decode_wide.config.kv_tile : 0;
    for (v = 0; v < 2; v++) {
        const attn__cuda_module *m = v ? &L->prefill : &L->decode;
        cm->tile[v] = m->config.tile_tokens;
        cm->rows[v] = m->config.rows;
        cm->kv_tile[v] = m->config.kv_tile;
    }
    /* decode items: one per (request, KV head), times the splits; splits happen only while
       the batch has fewer items than `parallelism`, at most floor(parallelism / items) per
       item: at most parallelism split items in all (the wide decode shape's parallelism is
       smaller). A captured forward launches the whole capacity (graph safety), so it
       carries no slack beyond that bound. */
    cm->work_capacity[0] = cap->max_num_reqs * d->num_kv_heads + cm->parallelism;
    /* prefill tiles come from requests of more than tile[0] query tokens (the others fit a
       decode tile): at most max_num_tokens / (tile[0] + 1) of them, each ceil(ql / tile[1])
       tiles, so sum <= max_num_tokens / tile[1] + that count. A decode-only capacity (engines'
       decode graphs: max_num_tokens = max_num_reqs <= tile[0]) launches no prefill CTA at all;
       a batch of 64 launches 8 x (2 + 12) empty ones instead of 8 x (2 + 64). */
    cm->work_capacity[1] = d->num_kv_heads * (cap->max_num_tokens / cm->tile[1] +
                                              ATTN__MIN(cap->max_num_reqs, cap->max_num_tokens / (cm->tile[0] + 1)));
    cm->merge_capacity = ATTN__MIN(cap->max_num_reqs * d->num_kv_heads, cm->parallelism);
    cm->slot_capacity = cm->parallelism;
    /* Cascade (attn__cuda_build): the prefix pass's items, one partial slot each: two waves
       of prefill CTAs, or a decode-only batch of the whole capacity at one split, whichever
       is more (H200, head 128, 128-row tiles: 264 slots, 17 MB). None where the layer cannot
       cascade or the capacity holds one request. */
    cm->parallelism_prefill = ATTN__MAX(1, L->resident_prefill);
    if (L->cascade && cap->max_num_reqs > 1)
        cm->work_capacity[2] = ATTN__MAX(2 * cm->parallelism_prefill,
                                         d->num_kv_heads * ((ATTN__MIN(cap->max_num_tokens, cap->max_num_reqs * cm->tile[0]) +
                                                             cm->tile[1] - 1) / cm->tile[1]));
    /* A build's base items (attn__cuda_build) number at most num_kv_heads x (max_num_reqs +
       max_num_tokens / tile[1]): one per KV head for a request that fits a decode tile,
       ceil(ql / tile[1]) <= 1 + floor(ql / tile[1]) per KV head otherwise. Where that fits
       the wide shape's parallelism every build runs wide, so a captured forward holds one
       decode kernel, not two (engines' small decode graphs). Batch invariance keeps one shape,
       the default: it is read here, once, for that reason. */
    cm->invariant = attn__env_batch_invariant(ctx);
    if (cm->parallelism_wide == 0 || cm->invariant) cm->decode_shapes = 1;
    else if ((int64_t)d->num_kv_heads * (cap->max_num_reqs + cap->max_num_tokens / cm->tile[1]) <= cm->parallelism_wide)
        cm->decode_shapes = 2;
    else cm->decode_shapes = 3;
    cm->up.bytes = attn__cuda_plan_layout(cm, cap, NULL, &cm->host);
    if ((st = attn__cuda_enter(ctx, "attn_metadata_create")) != ATTN_OK) {
        attn__free(cm);
        return st;
    }
    if ((rc = attn__cuda_staged_alloc(cu, &cm->up)) != 0 ||
        (rc = cu->cuMemAlloc(&cm->partial_o, (size_t)cm->slot_capacity * (size_t)cm->rows[0] * (size_t)d->head_size * 4)) != 0 ||
        (rc = cu->cuMemAlloc(&cm->partial_ml, (size_t)cm->slot_capacity * (size_t)cm->rows[0] * 2 * 4)) != 0 ||
        (rc = cu->cuMemAlloc(&cm->merge_count, (size_t)ATTN__MAX(1, cm->merge_capacity) * 4)) != 0 ||
        (rc = cu->cuMemsetD8Async(cm->merge_count, 0, (size_t)ATTN__MAX(1, cm->merge_capacity) * 4, NULL)) != 0 ||
        (cm->work_capacity[2] > 0 &&
         ((rc = cu->cuMemAlloc(&cm->prefix_o, (size_t)cm->work_capacity[2] * (size_t)cm->rows[1] * (size_t)d->head_size * 4)) != 0 ||
          (rc = cu->cuMemAlloc(&cm->prefix_ml, (size_t)cm->work_capacity[2] * (size_t)cm->rows[1] * 2 * 4)) != 0)) ||
        (rc = cu->cuStreamSynchronize(NULL)) != 0) {
        size_t bytes = cm->up.bytes; /* read before the free */
        attn__cuda_meta_free(ctx, cm);
        attn__cuda_leave(ctx);
        return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_metadata_create: cannot allocate the CUDA schedule (%zu bytes; CUresult %d)",
                          bytes, rc);
    }
    attn__cuda_leave(ctx);
    attn__cuda_plan_layout(cm, cap, cm->up.staging, &cm->host);
    attn__cuda_plan_layout(cm, cap, (char *)(uintptr_t)cm->up.region, &cm->dev);
    attn_metadata_private_set(meta, cm);
    return ATTN_OK;
}

static void attn__cuda_metadata_release(const attn_backend *self, attn_metadata *meta) {
    attn_context *ctx = attn_metadata_context(meta);
    attn__cuda_meta *cm = (attn__cuda_meta *)attn_metadata_private(meta);
    (void)self;
    if (!cm) return;
    if (attn__cuda_enter(ctx, "attn_metadata_destroy") == ATTN_OK) {
        attn__cuda_meta_free(ctx, cm);
        attn__cuda_leave(ctx);
    }
    attn_metadata_private_set(meta, NULL);
}

/* Work items longest first (heap sort: build may not allocate). */
static void attn__cuda_sift(int32_t *w, int root, int n) {
    for (;;) {
        int c = 2 * root + 1, k;
        int32_t tmp[8];
        if (c >= n) return;
        if (c + 1 < n && (w[8 * (c + 1) + 5] - w[8 * (c + 1) + 4]) < (w[8 * c + 5] - w[8 * c + 4])) c++;
        if ((w[8 * root + 5] - w[8 * root + 4]) <= (w[8 * c + 5] - w[8 * c + 4])) return;
        for (k = 0; k < 8; k++) { tmp[k] = w[8 * root + k]; w[8 * root + k] = w[8 * c + k]; w[8 * c + k] = tmp[k]; }
        root = c;
    }
}
static void attn__cuda_sort_work(int32_t *w, int n) {
    int i, k;
    for (i = n / 2 - 1; i >= 0; i--) attn__cuda_sift(w, i, n);
    for (i = n - 1; i > 0; i--) {
        for (k = 0; k < 8; k++) { int32_t t = w[k]; w[k] = w[8 * i + k]; w[8 * i + k] = t; }
        attn__cuda_sift(w, 0, i);
    }
}

/* One work item (kernels/paged_attention.cu, WORK LIST); merge: the merge entry a split
   item belongs to (its last split to finish merges them: FUSED MERGE), -1 for none. */
static void attn__cuda_item(int32_t *w, int req, int kvh, int tok0, int ntok, int key0, int key1, int slot,
                            int causal, int merge) {
    w[0] = req; w[1] = kvh; w[2] = tok0; w[3] = ntok; w[4] = key0; w[5] = key1; w[6] = slot;
    w[7] = (causal ? 1 : 0) | (int32_t)((uint32_t)(merge + 1) << 8);
}

/* The schedule of a validated batch, written into the staging region, then uploaded. */
static attn_status attn__cuda_build(const attn_backend *self, attn_layer *layer, attn_metadata *meta,
                                    int common_prefix_len, int fast_build) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn_metadata_desc *cap = attn_metadata_capacity(meta);
    const attn_batch *b = attn_metadata_batch(meta);
    attn__cuda_meta *cm = (attn__cuda_meta *)attn_metadata_private(meta);
    attn__cuda_plan *p = &cm->host;
    attn__cuda_driver *cu = ctx->cuda;
    int causal = b->causal == ATTN_CAUSAL_YES, r, h, nw[2] = {0, 0}, nm = 0, slots = 0, base;
    int split, invariant = cm->invariant, par, kt; /* ATTN_BATCH_INVARIANT as the metadata was created */
    int P = 0, np = 0;                             /* cascade: the prefix's keys, its items */
    size_t upload;
    attn__CUresult rc;
    attn_status st;
    (void)self;
    (void)fast_build;
    if ((st = attn__cuda_enter_stream(ctx, "attn_metadata_build", b->stream)) != ATTN_OK) return st;
    if ((rc = attn__cuda_staged_wait(cu, &cm->up)) != 0) {
        attn__cuda_leave(ctx);
        return attn__cu_fail(ctx, "attn_metadata_build", "cuEventSynchronize", rc);
    }
    /* Cascade (common_prefix_len: whole blocks before every request's queries, validated):
       on a batch whose requests all fit decode tiles (decodes, speculative verification),
       a prefix pass on the prefill tiles attends keys [0, P) for every batch token at once
       (its items are request 0's, whose block table holds the prefix, with tok0 counting
       batch tokens: kernels/paged_attention.cu, CASCADE), split so its items fill a wave
       of prefill CTAs; the decode items then read keys [P, seq_len) and join the prefix's
       partials where each row is stored. Not under batch invariance (a row's sum would
       depend on its batch), nor where the layer cannot (attn__cuda_layer.cascade). */
    cm->cascade_len = cm->cascade_splits = 0;
    if (common_prefix_len > 0 && cm->work_capacity[2] > 0 && !invariant && b->num_reqs > 1) {
        const int T = b->num_actual_tokens, tp = cm->tile[1], J = (T + tp - 1) / tp, H = d->num_kv_heads;
        int fits = J * H <= cm->work_capacity[2], ns, j, s2;
        for (r = 0; r < b->num_reqs && fits; r++)
            fits = b->query_start_loc[r + 1] - b->query_start_loc[r] <= cm->tile[0];
        if (fits) {
            ns = ATTN__MAX(1, cm->parallelism_prefill / (J * H));                /* one wave */
            ns = ATTN__MIN(ns, ATTN__MAX(1, common_prefix_len / (2 * ATTN__CUDA_SPLIT_MIN))); /* >= 512 keys */
            ns = ATTN__MIN(ns, cm->work_capacity[2] / (J * H));
            P = cm->cascade_len = common_prefix_len;
            cm->cascade_splits = ns;
            attn__log(ctx, ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_CASCADE_PLANNED,
                      "attn_metadata_build: cascade: %d prefix keys for %d tokens, %d splits (%d items)", P, T, ns,
                      J * H * ns);
            for (j = 0; j < J; j++)
                for (h = 0; h < H; h++)
                    for (s2 = 0; s2 < ns; s2++) { /* split bounds on the prefill tiles' KV_TILE */
                        int k0 = (int)((int64_t)P * s2 / ns) / cm->kv_tile[1] * cm->kv_tile[1];
                        int k1 = s2 == ns - 1 ? P : (int)((int64_t)P * (s2 + 1) / ns) / cm->kv_tile[1] * cm->kv_tile[1];
                        attn__cuda_item(p->work[2] + 8 * np++, 0, h, j * tp, ATTN__MIN(tp, T - j * tp), k0, k1,
                                        (j * H + h) * ns + s2, 0, -1);
                    }
        }
    }
    /* base items: decodes (a request that fits one decode tile) one per KV head */
    base = 0;
    for (r = 0; r < b->num_reqs; r++) {
        int ql = b->query_start_loc[r + 1] - b->query_start_loc[r];
        if (ql <= 0) continue;
        base += ql <= cm->tile[0] ? d->num_kv_heads
                                  : d->num_kv_heads * ((ql + cm->tile[1] - 1) / cm->tile[1]);
    }
    /* A batch of fewer tiles than the wide decode CTAs the device holds runs its decode
       tiles wide (attn__cuda_layer_variants); batch-invariant mode keeps one shape. */
    cm->wide = !invariant && cm->parallelism_wide > 0 && base > 0 && base <= cm->parallelism_wide;
    par = cm->wide ? cm->parallelism_wide : cm->parallelism;
    kt = cm->wide ? cm->kv_tile_wide : cm->kv_tile[0];
    /* the decode variant merges splits in its own launch only when its tile has at most 16
       rows (GROUP <= 16; kernels/paged_attention.cu, FUSED MERGE): larger groups do not split */
    split = !invariant && base > 0 && base < par && cm->rows[0] <= 16;
    for (r = 0; r < b->num_reqs; r++) {
        int ql = b->query_start_loc[r + 1] - b->query_start_loc[r], sl = b->seq_lens[r];
        int v = ql <= cm->tile[0] ? 0 : 1, tt = cm->tile[v], t0;
        if (ql <= 0) continue;
        for (t0 = 0; t0 < ql; t0 += tt) {
            int t1 = ATTN__MIN(ql, t0 + tt), lo0, hi0, lo1, hi1, lo, hi, ns = 1, s;
            attn__visible_local(d, cap, causal, sl - ql + t0, sl, &lo0, &hi0);
            attn__visible_local(d, cap, causal, sl - ql + t1 - 1, sl, &lo1, &hi1);
            lo = ATTN__MAX(ATTN__MIN(lo0, lo1), P); /* cascade: the prefix is the prefix pass's */
            hi = ATTN__MAX(hi0, hi1);
            if (v == 0 && split && hi - lo >= 2 * ATTN__CUDA_SPLIT_MIN) {
                ns = (hi - lo) / ATTN__CUDA_SPLIT_MIN;
                ns = ATTN__MIN(ns, par / base); /* splits fill one wave, never 1.5 */
                ns = ATTN__MIN(ns, ATTN__CUDA_MAX_SPLITS);
                if (ns < 2) ns = 1;
            }
            for (h = 0; h < d->num_kv_heads; h++) {
                if (ns > 1) {
                    int32_t *m = p->merge + 8 * nm++;
                    ATTN_ASSERT(nm <= cm->merge_capacity && slots + ns <= cm->slot_capacity);
                    m[0] = r; m[1] = h; m[2] = t0; m[3] = t1 - t0; m[4] = slots; m[5] = ns; m[6] = m[7] = 0;
                    for (s = 0; s < ns; s++) { /* split bounds on KV_TILE multiples */
                        int k0 = s == 0 ? lo : lo + (int)((int64_t)(hi - lo) * s / ns) / kt * kt;
                        int k1 = s == ns - 1 ? hi : lo + (int)((int64_t)(hi - lo) * (s + 1) / ns) / kt * kt;
                        if (k0 < lo) k0 = lo;
                        if (k1 < k0) k1 = k0;
                        ATTN_ASSERT(nw[0] < cm->work_capacity[0]);
                        attn__cuda_item(p->work[0] + 8 * nw[0]++, r, h, t0, t1 - t0, k0, k1, slots + s, causal,
                                        nm - 1);
                    }
                    slots += ns;
                } else {
                    ATTN_ASSERT(nw[v] < cm->work_capacity[v]);
                    attn__cuda_item(p->work[v] + 8 * nw[v]++, r, h, t0, t1 - t0, lo, hi, -1, causal, -1);
                }
            }
        }
    }
    attn__cuda_sort_work(p->work[0], nw[0]);
    attn__cuda_sort_work(p->work[1], nw[1]);
    p->counts[0] = cm->wide ? 0 : nw[0];
    p->counts[1] = nw[1];
    ATTN_ASSERT((cm->decode_shapes & 1) || p->counts[0] == 0); /* the capacity bound above */
    p->counts[2] = nm;
    p->counts[3] = cm->wide ? nw[0] : 0;
    p->counts[4] = np;
    p->counts[5] = cm->cascade_splits;
    memcpy(p->query_start_loc, b->query_start_loc, ((size_t)b->num_reqs + 1) * 4);
    if (b->num_reqs) memcpy(p->seq_lens, b->seq_lens, (size_t)b->num_reqs * 4);
    rc = attn__cuda_staged_send(cu, &cm->up, cap, b, p->slot_mapping, p->block_table, &upload);
    attn__cuda_leave(ctx);
    if (rc != 0) return attn__cu_fail(ctx, "attn_metadata_build", "the schedule upload", rc);
    cm->upload_bytes = upload;
    return ATTN_OK;
}

/* ---- entry points ------------------------------------------------------------------------ */

static attn__CUdeviceptr attn__dptr(const void *p) { return (attn__CUdeviceptr)(uintptr_t)p; }

/* The paged kernels copy the cache in 16-byte pieces (cp.async or TMA) and the 8-bit cache
   write stores 8 bytes at a time: the cache must start on 16 bytes (cudaMalloc and PyTorch
   give 256). Checked before anything is launched (the MLA calls too). */
static attn_status attn__cuda_cache_aligned(attn_context *ctx, const char *fn, const attn_tensor *kv_cache) {
    if ((uintptr_t)kv_cache->data & 15)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: kv_cache.data %p is not 16-byte aligned (allowed: a cache that starts on 16 "
                          "bytes, as cudaMalloc and PyTorch allocate; the kernels copy it in 16-byte pieces)",
                          fn, kv_cache->data);
    return ATTN_OK;
}

/* The cache write's parameters for rows t0 .. t0 + num_tokens - 1 of k/v (slots unset). */
static void attn__cuda_write_params(const attn_layer_desc *d, const attn_tensor *k, const attn_tensor *v,
                                    attn_tensor *kv_cache, int64_t t0, int num_tokens, attn__cache_write_params *wp) {
    attn_tensor kr = attn__tensor_resolved(k), vr = attn__tensor_resolved(v);
    size_t esz = attn_dtype_size(k->dtype);
    memset(wp, 0, sizeof *wp);
    wp->key = attn__dptr((const char *)k->data + (size_t)(t0 * kr.strides[0]) * esz);
    wp->value = attn__dptr((const char *)v->data + (size_t)(t0 * vr.strides[0]) * esz);
    wp->kv_cache = attn__dptr(kv_cache->data);
    wp->key_stride_token = kr.strides[0];
    wp->key_stride_head = kr.strides[1];
    wp->value_stride_token = vr.strides[0];
    wp->value_stride_head = vr.strides[1];
    wp->num_tokens = num_tokens;
    wp->num_kv_heads = d->num_kv_heads;
    wp->block_size = d->block_size;
    wp->num_slots = kv_cache->shape[0] * (int64_t)d->block_size;
    attn__cuda_kv_scales(d, &wp->k_scale, &wp->v_scale, &wp->k_scale_value, &wp->v_scale_value);
}

/* The cache write from device slots (the metadata's copy of the batch's). */
static attn__CUresult attn__cuda_write_kv(attn_context *ctx, const attn__cuda_layer *L, const attn_layer_desc *d,
                                          const attn_tensor *k, const attn_tensor *v, attn_tensor *kv_cache,
                                          attn__CUdeviceptr slots, int num_tokens, attn__CUstream stream) {
    attn__cache_write_params wp;
    void *args[1];
    if (num_tokens <= 0) return 0;
    attn__cuda_write_params(d, k, v, kv_cache, 0, num_tokens, &wp);
    wp.slot_mapping = slots;
    args[0] = &wp;
    return ctx->cuda->cuLaunchKernel(L->cache.main, (unsigned)ATTN__MIN(num_tokens, 4096), 1, 1, 128, 1, 1, 0,
                                     stream, args, NULL);
}

/* Whether work launched on `stream` now is recorded into a graph rather than run. A
   captured launch must cover the metadata's capacity (the graph replays after later
   builds, whose counts the device reads; CTAs past the count exit); a launch that runs
   now needs only the last build's counts, which the host knows (a count of 0: no launch,
   which would still cost a launch's latency). A failed query counts as capturing (the
   safe side: full grids). */
static int attn__cuda_capturing(attn_context *ctx, attn__CUstream stream) {
    int status = 0;
    return ctx->cuda->cuStreamIsCapturing(stream, &status) != 0 || status != 0;
}

/* The tensor map a kernel that reads the cache through TMA takes first (its config's
   tma_box_rows > 0; kernels/paged_prefill_sm90.cu's LAUNCH): 5-D over the whole cache,
   innermost first {head, kv heads, block rows, K/V, blocks}, box {64 columns, 1 head,
   box_rows rows, 1, 1}, 128-byte swizzle (wgmma's K-major tiles). Encoded on the host at
   every forward that launches such a kernel: no device work, nothing allocated; a
   captured forward keeps the map it was captured with, as it keeps the cache pointer. */
static attn_status attn__cuda_kv_map(attn_context *ctx, const attn_layer_desc *d, const attn_tensor *kv_cache,
                                     int box_rows, attn__tma_map *map) {
    const uint64_t esz = (uint64_t)attn_dtype_size(d->kv_cache_dtype), row = (uint64_t)d->head_size * esz;
    uint64_t dims[5], strides[4];
    uint32_t box[5];
    dims[0] = (uint64_t)d->head_size;
    dims[1] = (uint64_t)d->num_kv_heads;
    dims[2] = (uint64_t)d->block_size;
    dims[3] = 2;
    dims[4] = (uint64_t)kv_cache->shape[0];
    strides[0] = row;
    strides[1] = row * (uint64_t)d->num_kv_heads;
    strides[2] = strides[1] * (uint64_t)d->block_size;
    strides[3] = 2 * strides[2];
    box[0] = (uint32_t)(128 / esz);
    box[1] = 1;
    box[2] = (uint32_t)box_rows;
    box[3] = 1;
    box[4] = 1;
    return attn__tma_encode(ctx, map, d->kv_cache_dtype, 5, kv_cache->data, dims, strides, box, 128);
}

static attn_status attn__cuda_forward(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                      const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                      attn_tensor *kv_cache, attn_tensor *out, attn_tensor *lse, void *stream) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn__cuda_layer *L = (const attn__cuda_layer *)attn_layer_backend_state(layer);
    const attn__cuda_meta *cm = (const attn__cuda_meta *)attn_metadata_private(meta);
    attn__cuda_driver *cu = ctx->cuda;
    attn__CUstream s = (attn__CUstream)stream;
    attn__paged_params pp;
    attn__tma_map kv_map;
    attn_tensor qr = attn__tensor_resolved(q), orr = attn__tensor_resolved(out), lr;
    attn__CUresult rc = 0;
    attn_status st;
    void *args[2];
    int v2, capturing;
    (void)self;
    /* The schedule's tile shapes come from the layer that created the metadata; a layer
       that shares its configuration (attn__metadata_fits) may still compile other tiles
       (dtypes, soft cap, ALiBi choose them), and its kernels would misread the schedule. */
    if (cm->tile[0] != L->decode.config.tile_tokens || cm->tile[1] != L->prefill.config.tile_tokens ||
        cm->rows[0] != L->decode.config.rows || (cm->parallelism_wide > 0) != (L->decode_wide.module != 0))
        return attn__fail(ctx, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_METADATA_MISMATCH,
                          "attn_layer_forward: meta's CUDA schedule has decode tiles of %d tokens, prefill "
                          "tiles of %d tokens%s; this layer's kernels take %d, %d%s (its dtypes, soft cap "
                          "or ALiBi differ from the layer that created meta; allowed: metadata created "
                          "by a layer with the same kernels, e.g. this one)",
                          cm->tile[0], cm->tile[1], cm->parallelism_wide ? " and the wide decode shape" : "",
                          L->decode.config.tile_tokens, L->prefill.config.tile_tokens,
                          L->decode_wide.module ? " and the wide decode shape" : "");
    if (cm->cascade_len > 0 && !L->cascade) /* metadata shared with a layer of other ALiBi */
        return attn__fail(ctx, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_METADATA_MISMATCH,
                          "attn_layer_forward: meta was built with common_prefix_len %d, whose prefix pass "
                          "cannot take this layer's ALiBi slopes (allowed: such a layer's metadata built "
                          "with common_prefix_len 0, or metadata created by it)", cm->cascade_len);
    if ((st = attn__cuda_cache_aligned(ctx, "attn_layer_forward", kv_cache)) != ATTN_OK) return st;
    if ((st = attn__cuda_enter_stream(ctx, "attn_layer_forward", stream)) != ATTN_OK) return st;
    capturing = attn__cuda_capturing(ctx, s);
    if (L->prefill.config.tma_box_rows > 0 && (capturing || cm->host.counts[1] > 0 || cm->host.counts[4] > 0) &&
        (st = attn__cuda_kv_map(ctx, d, kv_cache, L->prefill.config.tma_box_rows, &kv_map)) != ATTN_OK) {
        attn__cuda_leave(ctx); /* before anything is written */
        return st;
    }
    if (k && v)
        rc = attn__cuda_write_kv(ctx, L, d, k, v, kv_cache, attn__dptr(cm->dev.slot_mapping),
                                 capturing ? attn_metadata_capacity(meta)->max_num_tokens
                                           : attn_metadata_batch(meta)->num_actual_tokens, s);
    memset(&pp, 0, sizeof pp);
    pp.q = attn__dptr(q->data);
    pp.kv_cache = attn__dptr(kv_cache->data);
    pp.out = attn__dptr(out->data);
    pp.block_table = attn__dptr(cm->dev.block_table);
    pp.seq_lens = attn__dptr(cm->dev.seq_lens);
    pp.query_start_loc = attn__dptr(cm->dev.query_start_loc);
    pp.alibi_slopes = L->alibi;
    pp.sinks = attn__dptr(d->sinks); /* device floats, read by the launch (a replay reads them anew) */
    pp.merge = attn__dptr(cm->dev.merge);
    pp.num_merge = attn__dptr(cm->dev.counts + 2);
    pp.partial_o = cm->partial_o;
    pp.partial_ml = cm->partial_ml;
    pp.merge_count = cm->merge_count; /* split items merge in the attention launch */
    pp.q_stride_token = qr.strides[0];
    pp.q_stride_head = qr.strides[1];
    pp.out_stride_token = orr.strides[0];
    pp.out_stride_head = orr.strides[1];
    if (lse) {
        lr = attn__tensor_resolved(lse);
        pp.lse = attn__dptr(lse->data);
        pp.lse_stride_token = lr.strides[0];
        pp.lse_stride_head = lr.strides[1];
    }
    pp.block_table_stride = attn_metadata_capacity(meta)->max_blocks_per_req;
    pp.num_kv_heads = d->num_kv_heads;
    pp.scale = d->scale;
    pp.softcap = d->logits_soft_cap;
    pp.window = d->sliding_window;
    attn__cuda_kv_scales(d, &pp.k_scale, &pp.v_scale, &pp.k_scale_value, &pp.v_scale_value);
    pp.prefix_o = cm->prefix_o; /* cascade: the prefix pass's partials, joined by the decode tiles */
    pp.prefix_ml = cm->prefix_ml;
    pp.prefix_tile_tokens = cm->tile[1];
    pp.prefix_rows = cm->rows[1];
    {
        const attn_metadata_desc *cap = attn_metadata_capacity(meta);
        pp.dcp_world_size = cap->dcp_world_size;
        pp.dcp_rank = cap->dcp_rank;
        pp.dcp_interleave = cap->dcp_interleave;
        if (cap->dcp_rank > 0) pp.sinks = 0; /* DCP: the sinks join rank 0's partial only */
    }
    /* Decode splits merge inside the decode launch (the last split of each entry to
       finish), so a forward runs at most two launches: decode tiles (default or wide shape,
       whichever the build chose), prefill tiles. A captured forward holds each shape a build
       of its capacity can run (the graph replays later builds; an unused shape's count is
       0), a decode shape as one wave of CTAs that loop over the items. */
    {
        /* each launch: its module, its work list (plan.work[]), its count (plan.counts[]);
           the cascade's prefix pass first (the decode tiles read its partials) */
        const struct { const attn__cuda_module *m; int list, count; } launch[4] = {
            {&L->prefill, 2, 4}, {&L->decode, 0, 0}, {&L->prefill, 1, 1}, {&L->decode_wide, 0, 3}};
        for (v2 = 0; v2 < 4 && rc == 0; v2++) {
            const attn__cuda_module *m = launch[v2].m;
            unsigned grid = (unsigned)(capturing ? cm->work_capacity[launch[v2].list]
                                                 : cm->host.counts[launch[v2].count]);
            if (capturing && ((v2 == 1 && !(cm->decode_shapes & 1)) || (v2 == 3 && !(cm->decode_shapes & 2))))
                grid = 0; /* a decode shape no build of this capacity runs */
            if (capturing && m->config.persistent && (v2 == 1 || v2 == 3)) /* one wave, looping over the replayed build's items */
                grid = (unsigned)ATTN__MIN((int)grid, ATTN__MAX(1, v2 == 3 ? L->resident_wide : L->resident));
            if (!m->module || !grid) continue;
            pp.work = attn__dptr(cm->dev.work[launch[v2].list]);
            pp.num_work = attn__dptr(cm->dev.counts + launch[v2].count);
            /* the prefix pass writes partials into the cascade's slots; the decode tiles join
               them (a count of 0 splits: no prefix in this build) */
            pp.partial_o = v2 == 0 ? cm->prefix_o : cm->partial_o;
            pp.partial_ml = v2 == 0 ? cm->prefix_ml : cm->partial_ml;
            pp.prefix_splits = (v2 == 1 || v2 == 3) && cm->prefix_o ? attn__dptr(cm->dev.counts + 5) : 0;
            args[0] = &pp;
            if (m->config.tma_box_rows > 0) { /* a kernel fed through TMA takes the cache's map first */
                args[0] = &kv_map;
                args[1] = &pp;
            }
            rc = cu->cuLaunchKernel(m->main, grid, 1, 1, (unsigned)m->config.threads, 1, 1, (unsigned)m->config.shared_bytes, s,
                                    args, NULL);
        }
    }
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, "attn_layer_forward", "cuLaunchKernel", rc) : ATTN_OK;
}

/* CTAs of a cache write from device slots: each checks every slot before it writes, so
   their number is bounded (four per SM: the check reads num_tokens x 8 bytes per CTA from
   L2, about 35 MB at 8192 tokens on 132 SMs). */
static unsigned attn__cuda_write_grid(const attn_context *ctx, int num_tokens) {
    return (unsigned)ATTN__MIN(num_tokens, 4 * ATTN__MAX(1, ctx->platform.cuda_multiprocessors));
}

/* The public cache write, on the caller's stream, allocating, copying and waiting for
   nothing. Device slots: one launch whose CTAs check every slot first (all or nothing).
   Host slots (checked by the front door): in the parameters of ATTN__INLINE_SLOTS-token
   launches of the _inline kernel, so a captured write keeps the slots it was captured
   with. */
static attn_status attn__cuda_reshape_and_cache(const attn_backend *self, attn_layer *layer,
                                                const attn_tensor *key, const attn_tensor *value,
                                                attn_tensor *kv_cache, const attn_tensor *slot_mapping,
                                                void *stream) {
    attn_context *ctx = attn_layer_context(layer);
    const attn__cuda_layer *L = (const attn__cuda_layer *)attn_layer_backend_state(layer);
    attn__cuda_driver *cu = ctx->cuda;
    attn__CUstream s = (attn__CUstream)stream;
    const int num_tokens = (int)slot_mapping->shape[0];
    attn__cache_write_inline_params ip;
    attn__CUresult rc = 0;
    attn_status st;
    void *args[1];
    int t0, n;
    (void)self;
    if (num_tokens == 0) return ATTN_OK;
    if ((st = attn__cuda_cache_aligned(ctx, "attn_reshape_and_cache", kv_cache)) != ATTN_OK) return st;
    if ((st = attn__cuda_enter_stream(ctx, "attn_reshape_and_cache", stream)) != ATTN_OK) return st;
    args[0] = &ip;
    if (slot_mapping->device.kind == ATTN_DEVICE_CUDA) {
        attn__cuda_write_params(attn_layer_get_desc(layer), key, value, kv_cache, 0, num_tokens, &ip.p);
        ip.p.slot_mapping = attn__dptr(slot_mapping->data);
        ip.p.check_slots = 1;
        args[0] = &ip.p;
        rc = cu->cuLaunchKernel(L->cache.main, attn__cuda_write_grid(ctx, num_tokens), 1, 1, 128, 1, 1, 0, s, args, NULL);
    }
    for (t0 = 0; slot_mapping->device.kind != ATTN_DEVICE_CUDA && t0 < num_tokens && rc == 0; t0 += n) {
        n = ATTN__MIN(num_tokens - t0, ATTN__INLINE_SLOTS);
        attn__cuda_write_params(attn_layer_get_desc(layer), key, value, kv_cache, t0, n, &ip.p);
        memcpy(ip.slots, (const int64_t *)slot_mapping->data + t0, (size_t)n * sizeof(int64_t));
        rc = cu->cuLaunchKernel(L->cache.second, (unsigned)n, 1, 1, 128, 1, 1, 0, s, args, NULL);
    }
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, "attn_reshape_and_cache", "cuLaunchKernel", rc) : ATTN_OK;
}

/* The merge kernel of (dtype, head size), compiled and loaded on first use. The first
   merge of a shape therefore compiles (or reads the disk cache): do one before capturing
   a graph that contains merges. */
static attn_status attn__cuda_merge_kernel(attn_context *ctx, attn__cuda_state *cs, int dt, int head_dim,
                                           const attn__cuda_module **out) {
    char opt[64], reason[256];
    attn_status st;
    int i;
    for (i = 0; i < cs->num_merges; i++)
        if (cs->merges[i].dt == dt && cs->merges[i].head_dim == head_dim) {
            *out = &cs->merges[i].m;
            return ATTN_OK;
        }
    if (cs->num_merges == (int)(sizeof cs->merges / sizeof cs->merges[0])) { /* evict the oldest */
        ctx->cuda->cuModuleUnload(cs->merges[0].m.module);
        memmove(&cs->merges[0], &cs->merges[1], sizeof cs->merges - sizeof cs->merges[0]);
        cs->num_merges--;
    }
    attn__fmt(opt, sizeof opt, "-DHEAD_DIM=%d -DDT=%d", head_dim, dt);
    st = attn__cuda_load(ctx, "merge.cu", opt, "attn_merge_attn_states", NULL, 0, &cs->merges[cs->num_merges].m,
                         reason, sizeof reason);
    if (st != ATTN_OK)
        return attn__fail(ctx, st, ATTN_LOG_KERNEL_COMPILE_FAILED, "attn_merge_attn_states: %s", reason);
    cs->merges[cs->num_merges].dt = dt;
    cs->merges[cs->num_merges].head_dim = head_dim;
    *out = &cs->merges[cs->num_merges++].m;
    return ATTN_OK;
}

static attn_status attn__cuda_merge_attn_states(const attn_backend *self, attn_context *ctx,
                                                const attn_tensor *out_a, const attn_tensor *lse_a,
                                                attn_lse_base base_a, const attn_tensor *out_b,
                                                const attn_tensor *lse_b, attn_lse_base base_b,
                                                attn_tensor *out, attn_tensor *lse, attn_lse_base base_out,
                                                void *stream) {
    attn__cuda_state *cs = NULL;
    const attn__cuda_module *m = NULL;
    attn_tensor oa = attn__tensor_resolved(out_a), ob = attn__tensor_resolved(out_b), oo = attn__tensor_resolved(out);
    attn_tensor la = attn__tensor_resolved(lse_a), lb = attn__tensor_resolved(lse_b);
    attn__merge_params mp;
    attn__CUresult rc;
    attn_status st;
    char reason[160];
    void *args[1];
    int64_t rows = oa.shape[0] * oa.shape[1];
    if (rows == 0) return ATTN_OK;
    st = attn__backend_context(ctx, self, (void **)&cs, reason, sizeof reason);
    if (st != ATTN_OK) return attn__fail(ctx, st, ATTN_LOG_PLATFORM_ERROR, "attn_merge_attn_states: %s", reason);
    if ((st = attn__cuda_enter_stream(ctx, "attn_merge_attn_states", stream)) != ATTN_OK) return st;
    st = attn__cuda_merge_kernel(ctx, cs, attn__cuda_dt(oa.dtype), (int)oa.shape[2], &m);
    if (st != ATTN_OK) {
        attn__cuda_leave(ctx);
        return st;
    }
    memset(&mp, 0, sizeof mp);
    mp.out_a = attn__dptr(oa.data); mp.lse_a = attn__dptr(la.data);
    mp.out_b = attn__dptr(ob.data); mp.lse_b = attn__dptr(lb.data);
    mp.out = attn__dptr(oo.data);
    mp.out_a_stride_token = oa.strides[0]; mp.out_a_stride_head = oa.strides[1];
    mp.out_b_stride_token = ob.strides[0]; mp.out_b_stride_head = ob.strides[1];
    mp.out_stride_token = oo.strides[0]; mp.out_stride_head = oo.strides[1];
    mp.lse_a_stride_token = la.strides[0]; mp.lse_a_stride_head = la.strides[1];
    mp.lse_b_stride_token = lb.strides[0]; mp.lse_b_stride_head = lb.strides[1];
    if (lse) {
        attn_tensor lo = attn__tensor_resolved(lse);
        mp.lse = attn__dptr(lo.data);
        mp.lse_stride_token = lo.strides[0];
        mp.lse_stride_head = lo.strides[1];
    }
    mp.num_tokens = (int32_t)oa.shape[0];
    mp.num_heads = (int32_t)oa.shape[1];
    mp.base_a = base_a == ATTN_LSE_BASE_2;
    mp.base_b = base_b == ATTN_LSE_BASE_2;
    mp.base_out = base_out == ATTN_LSE_BASE_2;
    args[0] = &mp;
    rc = ctx->cuda->cuLaunchKernel(m->main, (unsigned)ATTN__MIN((rows + 3) / 4, 65535), 1, 1, 128, 1, 1, 0,
                                   (attn__CUstream)stream, args, NULL);
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, "attn_merge_attn_states", "cuLaunchKernel", rc) : ATTN_OK;
}

static const attn_backend attn__cuda_backend = {
    "CUDA",                   /* name */
    ATTN_BACKEND_CUDA,        /* id */
    ATTN_DEVICE_CUDA,         /* device */
    ATTN_DTYPE_BIT(ATTN_DTYPE_F32) | ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16),
    ATTN_DTYPE_BIT(ATTN_DTYPE_F32) | ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16) |
        ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E4M3) | ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E5M2) |
        ATTN_DTYPE_BIT(ATTN_DTYPE_INT8), /* caches: fp8 per tensor, int8 / fp8_e4m3 per token and head */
    8, 512, 8,                /* head sizes: multiples of 8 up to 256, of 32 up to 512 (attn__cuda_check) */
    16, 0,                    /* block sizes: any multiple of 16 */
    1, 1, 1, 1,               /* non-causal, sliding window, soft cap, ALiBi */
    1,                        /* attention sinks */
    1,                        /* cascade (common_prefix_len) */
    0,                        /* is_mla */
    ATTN_CUDA_GRAPH_ALWAYS,   /* captured forward: capacity grids, counts read on the device */
    1, ATTN_LSE_BASE_E,
    attn__cuda_check,
    attn__cuda_context_init, attn__cuda_context_release,
    attn__cuda_layer_init, attn__cuda_layer_release,
    attn__cpu_kv_cache_shape, /* the same cache layout as the CPU backend */
    attn__cuda_metadata_init,
    attn__cuda_metadata_release,
    attn__cuda_build,
    attn__cuda_forward,
    attn__cuda_reshape_and_cache,
    NULL, NULL, NULL, NULL,   /* MLA entry points: standard backend */
    attn__cuda_merge_attn_states,
    NULL                      /* sparse MLA: standard backend */
};

/* CUDA_SM90: the CUDA backend whose layers run their prefill tiles on wgmma fed by a
   producer warpgroup through TMA (kernels/paged_prefill_sm90.cu, sm_90a; the platform needs
   cuda_tma); everything else is CUDA's (decode tiles, cache write, schedule, merge, graph
   support). Its own registry entry so that the selection record says which prefill kernel
   a layer got and, where it did not get this one, why (the family's refusal names a
   missing TMA; CUDA's mma.sync tiles take the layer then). Speed: docs/PERF.md, issue 22. */
static int attn__cuda_sm90_check(const attn_backend *self, const attn_layer_desc *d, const attn_platform *p,
                                 char *reason, size_t size) {
    if (d->head_size != 64 && d->head_size != 128) {
        attn__fmt(reason, size, "head_size %d (allowed: 64 or 128, the wgmma prefill's tiles; CUDA takes "
                  "the others)", d->head_size);
        return 1;
    }
    if (d->dtype != d->kv_cache_dtype) {
        attn__fmt(reason, size, "dtype %s with kv_cache_dtype %s (allowed: one 16-bit type for both)",
                  attn_dtype_name(d->dtype), attn_dtype_name(d->kv_cache_dtype));
        return 1;
    }
    return attn__cuda_check(self, d, p, reason, size);
}

static const attn_backend attn__cuda_sm90_backend = {
    "CUDA_SM90",              /* name */
    ATTN_BACKEND_CUDA_SM90,   /* id */
    ATTN_DEVICE_CUDA,         /* device */
    ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16),
    ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16),
    64, 128, 64,              /* head sizes 64 and 128 */
    16, 0,                    /* block sizes: any multiple of 16 */
    1, 1, 0, 0,               /* non-causal, sliding window; no soft cap, no ALiBi */
    1,                        /* attention sinks */
    1,                        /* cascade (common_prefix_len) */
    0,                        /* is_mla */
    ATTN_CUDA_GRAPH_ALWAYS,
    1, ATTN_LSE_BASE_E,
    attn__cuda_sm90_check,
    attn__cuda_context_init, attn__cuda_context_release,
    attn__cuda_layer_init, attn__cuda_layer_release,
    attn__cpu_kv_cache_shape,
    attn__cuda_metadata_init,
    attn__cuda_metadata_release,
    attn__cuda_build,
    attn__cuda_forward,
    attn__cuda_reshape_and_cache,
    NULL, NULL, NULL, NULL,
    NULL,                     /* attn_merge_attn_states on the device goes to CUDA */
    NULL                      /* sparse MLA: standard backend */
};

/* =======================================================================================
   >>cuda_mla
   The MLA backends on the GPU, CUDA_MLA_SM90 (wgmma, Hopper) and CUDA_MLA (mma.sync, 8.0
   and newer): one host path over their kernel families: absorbed decode with split-KV,
   up-projected prefill through cuBLAS in chunks of keys, the fused layer call.
   ======================================================================================= */

/* ---- CUDA_MLA_SM90: MLA on wgmma (Hopper) ---------------------------------------------- */

/* The MLA backend of compute capability 9.0 with TMA: absorbed decode on wgmma over 64 heads
   of one token per CTA in FlashMLA's seesaw schedule, the latent cache read through a tensor
   map encoded at each forward (kernels/mla_decode_sm90.cu; split-KV partials merged by LSE in
   attn_mla_merge, a CTA per row; a fused merge in the decode launch was never faster on the
   H200 and is gone since 0.12), the latent cache write (cache_write.cu), and the up-projected prefill: per request and
   chunk of keys, the chunk's latent rows gathered from the paged cache, up-projected into
   K_nope and V by two strided-batched cuBLAS GEMMs (one batch entry per head, f32
   accumulation), attended by kernels/mla_prefill_sm90.cu, and merged by LSE into the
   output of the chunks before it (in the attention kernel's epilogue). The fused call's
   decodes go q_nope . W_UK (cuBLAS) -> decode -> . W_UV (cuBLAS). Decode splits: the
   shared heuristic (attn_mla_num_kv_splits) with the parallelism left per decode item
   (attn__mla_plan), fixed per build. Every buffer is allocated at attn_metadata_create;
   a forward allocates nothing and does not synchronise the host. */

#define ATTN__MLA_HEADS_PER_CTA 64     /* kernels/mla_decode_sm90.cu's ROWS */
#define ATTN__MLA_CUBLAS_WS (32u << 20) /* cuBLAS's workspace (its Hopper recommendation) */

/* cuBLAS's constants (cublas_api.h, library_types.h) */
#define ATTN__CUBLAS_OP_N 0
#define ATTN__CUBLAS_OP_T 1
#define ATTN__CUDA_R_16F 2
#define ATTN__CUDA_R_16BF 14
#define ATTN__CUBLAS_COMPUTE_32F 68
#define ATTN__CUBLAS_GEMM_DEFAULT (-1)

/* The latent's fp8 scale as the MLA kernels take it (attn__cuda_kv_scales' k half). */
static void attn__cuda_latent_scale(const attn_layer_desc *d, attn__CUdeviceptr *ptr, float *value) {
    attn__CUdeviceptr vp;
    float vv;
    attn__cuda_kv_scales(d, ptr, &vp, value, &vv);
}

/* A tensor of rows for the MLA kernels: device address and element strides. */
typedef struct attn__mla_rows {
    attn__CUdeviceptr data;
    int64_t s0, s1;
} attn__mla_rows;

static attn__mla_rows attn__mla_rows_of(const attn_tensor *t, int64_t row0) {
    attn_tensor r = attn__tensor_resolved(t);
    attn__mla_rows m;
    m.s0 = r.strides[0];
    m.s1 = r.ndim > 1 ? r.strides[1] : 0;
    m.data = attn__dptr(r.data) + (attn__CUdeviceptr)(row0 * m.s0 * (int64_t)attn_dtype_size(r.dtype));
    return m;
}

/* CUDA_MLA (mma.sync, sm_80+) and CUDA_MLA_SM90 (wgmma, sm_90a) take the same layers. */
static int attn__cuda_mla_check(const attn_backend *self, const attn_layer_desc *d, const attn_platform *p,
                                char *reason, size_t size) {
    const int fp8_latents = (self->kv_cache_dtypes & ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E4M3)) != 0;
    if (attn__cuda_family_check(self, p, reason, size)) return 1;
    if (!((d->kv_lora_rank == 512 || d->kv_lora_rank == 256) && d->qk_rope_head_dim == 64)) {
        attn__fmt(reason, size, "head_size %d (kv_lora_rank %d + qk_rope_head_dim %d) not supported "
                  "(576 = 512 + 64, or 320 = 256 + 64)", d->head_size, d->kv_lora_rank, d->qk_rope_head_dim);
        return 1;
    }
    if (d->dtype != d->kv_cache_dtype && d->kv_cache_dtype != ATTN_DTYPE_FP8_DS_MLA &&
        (!fp8_latents || !attn__dtypes[d->kv_cache_dtype].cache_only)) {
        attn__fmt(reason, size, "dtype %s with kv_cache_dtype %s (allowed: one 16-bit type for both%s)",
                  attn_dtype_name(d->dtype), attn_dtype_name(d->kv_cache_dtype),
                  fp8_latents ? ", or an fp8 latent" : "; CUDA_MLA reads fp8 latents");
        return 1;
    }
    if (d->kv_scale_kind != ATTN_KV_SCALE_PER_TENSOR) {
        attn__fmt(reason, size, "kv_scale_kind PER_TOKEN_HEAD (allowed for MLA latents: per-tensor fp8)");
        return 1;
    }
    if (!((d->qk_nope_head_dim == 128 && d->v_head_dim == 128) || (d->qk_nope_head_dim == 64 && d->v_head_dim == 64))) {
        attn__fmt(reason, size, "qk_nope_head_dim %d / v_head_dim %d (allowed: 128 / 128 as DeepSeek-V2/V3, "
                  "or 64 / 64: the prefill kernel's tiles)", d->qk_nope_head_dim, d->v_head_dim);
        return 1;
    }
    return 0;
}

/* Context level: the cuBLAS handle of the projections (created once; bound to the caller's
   stream per call). */
typedef struct attn__cuda_mla_state {
    void *cublas;
} attn__cuda_mla_state;

static attn_status attn__cuda_mla_context_init(const attn_backend *self, attn_context *ctx, void **state,
                                               char *reason, size_t size) {
    attn__cuda_mla_state *s;
    attn_status st;
    int rc;
    (void)self;
    attn__probe_cublas(&ctx->loader, ctx->library_override[2], ctx->cublas, &ctx->platform);
    if (!ctx->cublas->library) {
        attn__fmt(reason, size, "%s (the MLA projections run on cuBLAS; ATTN_CUBLAS_LIBRARY names it)",
                  ctx->platform.cublas_reason);
        return ATTN_ERROR_PLATFORM;
    }
    if ((st = attn__cuda_enter(ctx, "CUDA_MLA_SM90 backend")) != ATTN_OK) {
        attn__fmt(reason, size, "%s", attn_context_last_error(ctx));
        return st;
    }
    s = (attn__cuda_mla_state *)attn__calloc(1, sizeof *s);
    if (!s) {
        attn__cuda_leave(ctx);
        attn__fmt(reason, size, "out of memory");
        return ATTN_ERROR_OUT_OF_MEMORY;
    }
    rc = ctx->cublas->cublasCreate(&s->cublas);
    attn__cuda_leave(ctx);
    if (rc != 0) {
        attn__free(s);
        attn__fmt(reason, size, "cublasCreate failed (cublasStatus %d)", rc);
        return ATTN_ERROR_PLATFORM;
    }
    *state = s;
    return ATTN_OK;
}

static void attn__cuda_mla_context_release(const attn_backend *self, attn_context *ctx, void *state) {
    attn__cuda_mla_state *s = (attn__cuda_mla_state *)state;
    (void)self;
    if (!s) return;
    if (s->cublas && attn__cuda_enter(ctx, "CUDA_MLA_SM90 backend") == ATTN_OK) {
        ctx->cublas->cublasDestroy(s->cublas);
        attn__cuda_leave(ctx);
    }
    attn__free(s);
}

/* Layer level: decode (attn_mla_decode + attn_mla_merge), prefill (attn_mla_prefill), the
   latent cache write (attn_concat_and_cache_mla + attn_mla_gather); the context's cuBLAS
   handle. */
typedef struct attn__cuda_mla_layer {
    attn__cuda_module decode, prefill, cache; /* cache: the latent write, the gather, the
                                                 write from host slots (main, second, third) */
    attn__cuda_module sparse;        /* attn_mla_forward_sparse: mla_decode.cu, SPARSE 1 (both
                                        MLA backends: the mma.sync tiles gather by index) */
    void *cublas;
    int sm90;                        /* CUDA_MLA_SM90's kernels (else CUDA_MLA's, mma.sync) */
    int rows;                        /* heads per decode CTA (its config.rows: its partials' rows) */
    int resident;                    /* decode CTAs resident at once (CUDA_MLA: occupancy x SMs;
                                        CUDA_MLA_SM90: 0, the default policy) */
} attn__cuda_mla_layer;

/* The sparse MLA decode a layer loads: its family's role, except that CUDA_MLA_SM90's wgmma
   gather (mla_decode_sm90.cu, SPARSE 1: 64 heads a CTA, 16-bit latents) leaves to the
   mma.sync one (CUDA_MLA's role: 16, 32 or 64 heads a CTA, fp8 latents, fp8_ds_mla) a
   layer whose cache is not its 16-bit q type, that has 32 heads or fewer (where 64 rows a
   CTA would be mostly padding) or whose latent is not 512 wide (DeepSeek-V3.2's; the
   only width the GPU tests check the gather at). */
static const attn__kernel_role *attn__cuda_mla_sparse_role(const attn__kernel_family *f, const attn_layer_desc *d) {
    if (!f->role[ATTN__ROLE_DECODE_WIDE].arch_a ||
        (d->kv_cache_dtype == d->dtype && d->num_heads > 32 && d->kv_lora_rank == 512))
        return &f->role[ATTN__ROLE_DECODE_WIDE];
    return &attn__kernel_family_of(ATTN_BACKEND_CUDA_MLA)->role[ATTN__ROLE_DECODE_WIDE];
}

/* The kernel variants an MLA layer loads: [0] decode, [1] prefill, [2] cache write;
   CUDA_MLA_SM90's decode and prefill are compiled for sm_90a (wgmma), CUDA_MLA's
   (mma.sync, sm_80+) for the device; the mma.sync decode's CTA holds 16, 32 or 64 heads
   (ROWS: the fewest that cover the layer's heads, 64 past 32). One place for layer
   creation and tools. */
static void attn__cuda_mla_variants(const attn_layer_desc *d, const attn__kernel_family *f,
                                    char opt[ATTN__ROLE_COUNT][256]) {
    int dt = attn__cuda_dt(d->dtype), kv = attn__cuda_dt(d->kv_cache_dtype); /* kv: = dt, or an fp8 latent */
    if (f->role[ATTN__ROLE_DECODE].arch_a) /* the wgmma decode: 64 heads a CTA */
        attn__fmt(opt[0], 256, "-DKV_LORA=%d -DROPE=%d -DBLOCK_SIZE=%d -DDT=%d", d->kv_lora_rank,
                  d->qk_rope_head_dim, d->block_size, dt);
    else
        attn__fmt(opt[0], 256, "-DKV_LORA=%d -DROPE=%d -DBLOCK_SIZE=%d -DDT=%d -DROWS=%d -DDT_KV=%d", d->kv_lora_rank,
                  d->qk_rope_head_dim, d->block_size, dt, d->num_heads <= 16 ? 16 : d->num_heads <= 32 ? 32 : 64, kv);
    attn__fmt(opt[1], 256, "-DDN=%d -DROPE=%d -DDV=%d -DDT=%d", d->qk_nope_head_dim, d->qk_rope_head_dim,
              d->v_head_dim, dt); /* the prefill attends over up-projected (DT) keys and values */
    attn__fmt(opt[2], 256, "-DKV_LORA_RANK=%d -DROPE_DIM=%d -DDT_IN=%d -DDT_CACHE=%d", d->kv_lora_rank,
              d->qk_rope_head_dim, dt, kv);
    /* the sparse decode (attn__cuda_mla_sparse_role): the wgmma gather, 64 heads a CTA; or
       as the mma.sync decode, but 16 heads a CTA over an fp8 latent with a per-tensor scale
       (at 32 the index handling makes ptxas spill); fp8_ds_mla rows are widened into 16-bit
       stages, so they take the 16-bit shapes */
    if (attn__cuda_mla_sparse_role(f, d)->arch_a)
        attn__fmt(opt[3], 256, "-DKV_LORA=%d -DROPE=%d -DBLOCK_SIZE=%d -DDT=%d -DSPARSE=1", d->kv_lora_rank,
                  d->qk_rope_head_dim, d->block_size, dt);
    else
        attn__fmt(opt[3], 256, "-DKV_LORA=%d -DROPE=%d -DBLOCK_SIZE=%d -DDT=%d -DROWS=%d -DDT_KV=%d -DSPARSE=1",
              d->kv_lora_rank, d->qk_rope_head_dim, d->block_size, dt,
              d->num_heads <= 16 || attn__dtypes[d->kv_cache_dtype].cache_only == 1 ? 16 : d->num_heads <= 32 ? 32 : 64, kv);
}

static void attn__cuda_mla_layer_free(attn_context *ctx, attn__cuda_mla_layer *L) {
    if (!L) return;
    if (L->decode.module) ctx->cuda->cuModuleUnload(L->decode.module);
    if (L->prefill.module) ctx->cuda->cuModuleUnload(L->prefill.module);
    if (L->cache.module) ctx->cuda->cuModuleUnload(L->cache.module);
    if (L->sparse.module) ctx->cuda->cuModuleUnload(L->sparse.module);
    attn__free(L);
}

static attn_status attn__cuda_mla_layer_init(const attn_backend *self, attn_layer *layer, void **state,
                                             char *reason, size_t size) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn__kernel_family *f = attn__kernel_family_of(self->id);
    attn__cuda_mla_state *cs = NULL;
    char opt[ATTN__ROLE_COUNT][256];
    attn__cuda_mla_layer *L;
    int role;
    attn_status st = attn__backend_context(ctx, self, (void **)&cs, reason, size);
    if (st != ATTN_OK) return st;
    if (!f) {
        attn__fmt(reason, size, "backend %s has no CUDA kernel family (its id names none)", self->name);
        return ATTN_ERROR_UNSUPPORTED;
    }
    L = (attn__cuda_mla_layer *)attn__calloc(1, sizeof *L);
    if (!L) {
        attn__fmt(reason, size, "out of memory");
        return ATTN_ERROR_OUT_OF_MEMORY;
    }
    L->cublas = cs->cublas;
    L->sm90 = f->role[ATTN__ROLE_DECODE].arch_a; /* the wgmma kernels: the default split policy */
    if ((st = attn__cuda_enter(ctx, "CUDA MLA layer")) != ATTN_OK) {
        attn__fmt(reason, size, "%s", attn_context_last_error(ctx));
        attn__free(L);
        return st;
    }
    attn__cuda_mla_variants(d, f, opt);
    attn__kernel_defines(ctx, opt);
    for (role = ATTN__ROLE_DECODE; role <= ATTN__ROLE_CACHE && st == ATTN_OK; role++)
        st = attn__cuda_load_role(ctx, &f->role[role], opt[role],
                                  role == ATTN__ROLE_DECODE ? &L->decode : role == ATTN__ROLE_PREFILL ? &L->prefill : &L->cache,
                                  reason, size);
    if (st == ATTN_OK && f->role[ATTN__ROLE_DECODE_WIDE].file) /* the sparse MLA decode */
        st = attn__cuda_load_role(ctx, attn__cuda_mla_sparse_role(f, d), opt[ATTN__ROLE_DECODE_WIDE], &L->sparse, reason,
                                  size);
    if (st == ATTN_OK) L->rows = L->decode.config.rows;
    if (st == ATTN_OK && !L->sm90) { /* the split policy's target: one wave of resident decode CTAs */
        L->resident = attn__cuda_resident(ctx, &L->decode, 1);
        st = attn_layer_set_decode_parallelism(layer, L->resident, L->rows);
        if (st != ATTN_OK) attn__fmt(reason, size, "%s", attn_context_last_error(ctx));
    }
    if (st != ATTN_OK) attn__cuda_mla_layer_free(ctx, L);
    else *state = L;
    attn__cuda_leave(ctx);
    return st;
}

static void attn__cuda_mla_layer_release(const attn_backend *self, attn_layer *layer, void *state) {
    attn_context *ctx = attn_layer_context(layer);
    (void)self;
    if (!state) return;
    if (attn__cuda_enter(ctx, "CUDA MLA layer") != ATTN_OK) return;
    attn__cuda_mla_layer_free(ctx, (attn__cuda_mla_layer *)state);
    attn__cuda_leave(ctx);
}

/* ---- metadata: decode work list, device workspace ---- */

typedef struct attn__cuda_mla_plan {
    int32_t *counts;               /* [6]: decode work items, merge entries, batch tokens, sparse
                                      splits, sparse merge entries, - */
    int32_t *work;                 /* [work_capacity][8] (kernels/mla_decode_sm90.cu) */
    int32_t *merge;                /* [merge_capacity][8] */
    int32_t *smerge;               /* [sparse_slots][8]: sparse MLA's merge entries */
    int32_t *seq_lens;             /* [max_num_reqs] (sparse MLA) */
    int32_t *token_req;            /* [max_num_tokens]: each batch token's request (sparse MLA) */
    int64_t *slot_mapping;         /* [max_num_tokens], -1 past the batch */
    int32_t *block_table;          /* last: the upload stops after the rows in use */
} attn__cuda_mla_plan;

/* Device workspace (one allocation): the decode phase (q_latent, o_latent of the fused
   call) and the prefill phase (a chunk's latents and up-projected K_nope, V) share memory;
   the running prefill LSE and cuBLAS's workspace have their own. */
typedef struct attn__cuda_mla_ws {
    attn__CUdeviceptr q_lat, o_lat;        /* [decode tokens][H][R] DT */
    attn__CUdeviceptr lat, k_nope, v;      /* [chunk][R + P], [chunk][H][DN], [chunk][H][DV] DT */
    attn__CUdeviceptr run_lse;             /* [max_num_tokens][H] f32 */
    attn__CUdeviceptr cublas;              /* ATTN__MLA_CUBLAS_WS bytes */
} attn__cuda_mla_ws;

typedef struct attn__cuda_mla_meta {
    int heads, tiles, decode_tokens, chunk;
    /* sparse MLA: heads per CTA of the layer's sparse decode, its head tiles, and its split
       partials (a build splits each token's indices while tokens x tiles x splits fit one
       wave, ATTN__MLA_SPARSE_SPLITS at most) */
    int sparse_rows, sparse_tiles, sparse_slots;
    attn__CUdeviceptr sparse_o, sparse_lse;
    int rows;                        /* the creating layer's (metadata may outlive it) */
    int work_capacity, merge_capacity, slot_capacity;
    size_t ws_bytes;
    attn__cuda_staged up;          /* the region: work list, merges, batch */
    attn__CUdeviceptr partial_o, partial_lse, ws_base;
    attn__cuda_mla_plan host, dev;
    attn__cuda_mla_ws ws;
} attn__cuda_mla_meta;

static size_t attn__cuda_mla_plan_layout(const attn__cuda_mla_meta *cm, const attn_metadata_desc *cap, char *base,
                                         attn__cuda_mla_plan *p) {
    size_t used = 0;
    p->counts = (int32_t *)attn__carve(base, &used, 6 * sizeof(int32_t), 256);
    p->work = (int32_t *)attn__carve(base, &used, (size_t)cm->work_capacity * 32, 256);
    p->merge = (int32_t *)attn__carve(base, &used, (size_t)ATTN__MAX(1, cm->merge_capacity) * 32, 256);
    p->smerge = (int32_t *)attn__carve(base, &used, (size_t)ATTN__MAX(1, cm->sparse_slots) * 32, 256);
    p->seq_lens = (int32_t *)attn__carve(base, &used, (size_t)cap->max_num_reqs * 4, 256);
    p->token_req = (int32_t *)attn__carve(base, &used, (size_t)cap->max_num_tokens * 4, 256);
    p->slot_mapping = (int64_t *)attn__carve(base, &used, (size_t)cap->max_num_tokens * 8, 256);
    p->block_table = (int32_t *)attn__carve(base, &used,
                                            (size_t)cap->max_num_reqs * (size_t)cap->max_blocks_per_req * 4, 256);
    return used;
}

static size_t attn__cuda_mla_ws_layout(const attn__cuda_mla_meta *cm, const attn_layer_desc *d,
                                       const attn_metadata_desc *cap, attn__CUdeviceptr base, attn__cuda_mla_ws *w) {
    /* es: the layer's 16-bit type (an fp8 latent is gathered into it for the up-projection) */
    size_t H = (size_t)d->num_heads, R = (size_t)d->kv_lora_rank, es = attn_dtype_size(d->dtype);
    size_t dec = 0, pre = 0, used;
    char *b = (char *)(uintptr_t)base;
    w->q_lat = attn__dptr(attn__carve(b, &dec, (size_t)cm->decode_tokens * H * R * es, 256));
    w->o_lat = attn__dptr(attn__carve(b, &dec, (size_t)cm->decode_tokens * H * R * es, 256));
    w->lat = attn__dptr(attn__carve(b, &pre, (size_t)cm->chunk * (size_t)d->head_size * es, 256));
    w->k_nope = attn__dptr(attn__carve(b, &pre, (size_t)cm->chunk * H * (size_t)d->qk_nope_head_dim * es, 256));
    w->v = attn__dptr(attn__carve(b, &pre, (size_t)cm->chunk * H * (size_t)d->v_head_dim * es, 256));
    used = ATTN__MAX(dec, pre);
    w->run_lse = attn__dptr(attn__carve(b, &used, (size_t)cap->max_num_tokens * H * 4, 256));
    w->cublas = attn__dptr(attn__carve(b, &used, ATTN__MLA_CUBLAS_WS, 256));
    return used;
}

static void attn__cuda_mla_meta_free(attn_context *ctx, attn__cuda_mla_meta *cm) {
    attn__cuda_driver *cu = ctx->cuda;
    if (!cm) return;
    attn__cuda_staged_free(cu, &cm->up);
    if (cm->partial_o) cu->cuMemFree(cm->partial_o);
    if (cm->partial_lse) cu->cuMemFree(cm->partial_lse);
    if (cm->sparse_o) cu->cuMemFree(cm->sparse_o);
    if (cm->sparse_lse) cu->cuMemFree(cm->sparse_lse);
    if (cm->ws_base) cu->cuMemFree(cm->ws_base);
    attn__free(cm);
}

static attn_status attn__cuda_mla_metadata_init(const attn_backend *self, attn_layer *layer, attn_metadata *meta) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn_metadata_desc *cap = attn_metadata_capacity(meta);
    attn__cuda_driver *cu = ctx->cuda;
    const attn__cuda_mla_layer *L = (const attn__cuda_mla_layer *)attn_layer_backend_state(layer);
    attn__cuda_mla_meta *cm;
    attn__CUresult rc = 0;
    attn_status st;
    int64_t items, slots;
    (void)self;
    cm = (attn__cuda_mla_meta *)attn__calloc(1, sizeof *cm);
    if (!cm)
        return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_metadata_create: cannot allocate the CUDA MLA schedule");
    cm->heads = d->num_heads;
    cm->rows = L->rows;
    cm->tiles = (d->num_heads + cm->rows - 1) / cm->rows;
    cm->decode_tokens = (int)ATTN__MIN((int64_t)cap->max_num_tokens, (int64_t)cap->max_num_reqs * cap->decode_threshold);
    cm->chunk = attn__mla_prefill_chunk(d, cap->workspace_bytes, ATTN_DEVICE_CUDA);
    /* decode items: one per (decode token, ROWS heads); split items share the splits a
       batch gets: with the heuristic's count (attn_metadata_mla_info), items x splits <=
       the resident items (the layer's, set at layer init); a forced count multiplies every
       item */
    items = (int64_t)cm->decode_tokens * cm->tiles;
    slots = meta->kv_splits_forced ? items * cap->num_kv_splits
                                   : ATTN__MIN(items * cap->num_kv_splits,
                                               (int64_t)ATTN__MAX(attn__parallelism(ctx, ATTN_DEVICE_CUDA), L->resident));
    if (cap->num_kv_splits <= 1) slots = 0;
    if (items + slots > INT32_MAX / 64) {
        attn__free(cm);
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "attn_metadata_create: %lld decode work items of 64 heads x %d splits is too many "
                          "(lower max_num_reqs, decode_threshold or num_kv_splits)", (long long)items,
                          cap->num_kv_splits);
    }
    cm->work_capacity = (int)(items + slots);
    cm->merge_capacity = slots ? (int)items : 0;
    cm->slot_capacity = (int)slots;
    cm->sparse_rows = L->sparse.module ? L->sparse.config.rows : 0;
    cm->sparse_tiles = cm->sparse_rows ? (d->num_heads + cm->sparse_rows - 1) / cm->sparse_rows : 0;
    cm->sparse_slots = cm->sparse_rows ? ATTN__MAX(1, ctx->platform.cuda_multiprocessors) : 0; /* one wave */
    cm->up.bytes = attn__cuda_mla_plan_layout(cm, cap, NULL, &cm->host);
    cm->ws_bytes = attn__cuda_mla_ws_layout(cm, d, cap, 0, &cm->ws);
    if ((st = attn__cuda_enter(ctx, "attn_metadata_create")) != ATTN_OK) {
        attn__free(cm);
        return st;
    }
    if ((rc = attn__cuda_staged_alloc(cu, &cm->up)) != 0 ||
        (rc = cu->cuMemAlloc(&cm->partial_o, (size_t)ATTN__MAX(1, cm->slot_capacity) * (size_t)cm->rows *
                                                 (size_t)d->kv_lora_rank * 4)) != 0 ||
        (rc = cu->cuMemAlloc(&cm->partial_lse, (size_t)ATTN__MAX(1, cm->slot_capacity) * (size_t)cm->rows * 4)) != 0 ||
        (cm->sparse_slots &&
         ((rc = cu->cuMemAlloc(&cm->sparse_o, (size_t)cm->sparse_slots * (size_t)cm->sparse_rows * (size_t)d->kv_lora_rank * 4)) != 0 ||
          (rc = cu->cuMemAlloc(&cm->sparse_lse, (size_t)cm->sparse_slots * (size_t)cm->sparse_rows * 4)) != 0)) ||
        (rc = cu->cuMemAlloc(&cm->ws_base, cm->ws_bytes)) != 0) {
        size_t bytes = cm->up.bytes + cm->ws_bytes;
        attn__cuda_mla_meta_free(ctx, cm);
        attn__cuda_leave(ctx);
        return attn__fail(ctx, ATTN_ERROR_OUT_OF_MEMORY, ATTN_LOG_OUT_OF_MEMORY,
                          "attn_metadata_create: cannot allocate the CUDA MLA schedule and workspace (%zu bytes "
                          "and the split-KV partials; CUresult %d; desc.workspace_bytes bounds the prefill chunk)",
                          bytes, rc);
    }
    attn__cuda_leave(ctx);
    attn__cuda_mla_plan_layout(cm, cap, cm->up.staging, &cm->host);
    attn__cuda_mla_plan_layout(cm, cap, (char *)(uintptr_t)cm->up.region, &cm->dev);
    attn__cuda_mla_ws_layout(cm, d, cap, cm->ws_base, &cm->ws);
    attn_metadata_private_set(meta, cm);
    return ATTN_OK;
}

static void attn__cuda_mla_metadata_release(const attn_backend *self, attn_metadata *meta) {
    attn_context *ctx = attn_metadata_context(meta);
    attn__cuda_mla_meta *cm = (attn__cuda_mla_meta *)attn_metadata_private(meta);
    (void)self;
    if (!cm) return;
    if (attn__cuda_enter(ctx, "attn_metadata_destroy") == ATTN_OK) {
        attn__cuda_mla_meta_free(ctx, cm);
        attn__cuda_leave(ctx);
    }
    attn_metadata_private_set(meta, NULL);
}

/* One decode work item (kernels/mla_decode_sm90.cu). */
static void attn__cuda_mla_item(int32_t *w, int req, int head0, int q_row, int key0, int key1, int slot) {
    w[0] = req; w[1] = head0; w[2] = q_row; w[3] = 0; w[4] = key0; w[5] = key1; w[6] = slot; w[7] = 0;
}

/* The decode work list (the batch lists its decodes first): per decode token and 64
   heads, one item over its visible keys, or info.num_kv_splits items on 64-key bounds
   with a merge entry. */
static attn_status attn__cuda_mla_build(const attn_backend *self, attn_layer *layer, attn_metadata *meta,
                                        int common_prefix_len, int fast_build) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn_metadata_desc *cap = attn_metadata_capacity(meta);
    const attn_batch *b = attn_metadata_batch(meta);
    attn__cuda_mla_meta *cm = (attn__cuda_mla_meta *)attn_metadata_private(meta);
    attn__cuda_mla_plan *p = &cm->host;
    attn__cuda_driver *cu = ctx->cuda;
    attn_mla_info info;
    int r, t, h0, nw = 0, nm = 0, slots = 0;
    size_t upload;
    attn__CUresult rc;
    attn_status st;
    (void)self;
    (void)common_prefix_len;
    (void)fast_build;
    memset(&info, 0, sizeof info);
    if ((st = attn_metadata_mla_info(meta, &info)) != ATTN_OK) return st;
    if ((st = attn__cuda_enter_stream(ctx, "attn_metadata_build", b->stream)) != ATTN_OK) return st;
    if ((rc = attn__cuda_staged_wait(cu, &cm->up)) != 0) {
        attn__cuda_leave(ctx);
        return attn__cu_fail(ctx, "attn_metadata_build", "cuEventSynchronize", rc);
    }
    for (r = 0; r < info.num_decodes; r++) {
        int q0 = b->query_start_loc[r], ql = b->query_start_loc[r + 1] - q0, sl = b->seq_lens[r];
        for (t = 0; t < ql; t++) {
            int hi = ATTN__MAX(0, ATTN__MIN(sl, sl - ql + t + 1)); /* causal: keys 0 .. pos */
            int ns = ATTN__MIN(info.num_kv_splits, (hi + 63) / 64), s;
            for (h0 = 0; h0 < d->num_heads; h0 += cm->rows) {
                if (ns > 1) { /* merged by attn_mla_merge, a CTA per row */
                    int32_t *m = p->merge + 8 * nm++;
                    ATTN_ASSERT(nm <= cm->merge_capacity && slots + ns <= cm->slot_capacity);
                    m[0] = q0 + t; m[1] = h0; m[2] = ns; m[3] = slots; m[4] = m[5] = m[6] = m[7] = 0;
                    for (s = 0; s < ns; s++) {
                        int k0 = s == 0 ? 0 : (int)((int64_t)hi * s / ns) / 64 * 64;
                        int k1 = s == ns - 1 ? hi : (int)((int64_t)hi * (s + 1) / ns) / 64 * 64;
                        ATTN_ASSERT(nw < cm->work_capacity);
                        attn__cuda_mla_item(p->work + 8 * nw++, r, h0, q0 + t, k0, k1, slots + s);
                    }
                    slots += ns;
                } else {
                    ATTN_ASSERT(nw < cm->work_capacity);
                    attn__cuda_mla_item(p->work + 8 * nw++, r, h0, q0 + t, 0, hi, -1);
                }
            }
        }
    }
    attn__cuda_sort_work(p->work, nw);
    p->counts[0] = nw;
    p->counts[1] = nm;
    p->counts[2] = b->num_actual_tokens; /* sparse MLA: one CTA row per batch token */
    p->counts[3] = 1;                    /* its splits: while the batch's CTAs fill less than a wave */
    p->counts[4] = 0;
    if (cm->sparse_tiles && b->num_actual_tokens > 0 && !attn__env_batch_invariant(ctx)) {
        const int items = b->num_actual_tokens * cm->sparse_tiles;
        int ns = ATTN__MIN(ATTN__MLA_SPARSE_SPLITS, cm->sparse_slots / items), e;
        if (ns > 1) {
            p->counts[3] = ns;
            p->counts[4] = items;
            for (e = 0; e < items; e++) { /* entry (t, y): slots e ns .. e ns + ns - 1 (mla_decode.cu, SPARSE) */
                int32_t *m = p->smerge + 8 * e;
                m[0] = e / cm->sparse_tiles; m[1] = (e % cm->sparse_tiles) * cm->sparse_rows; m[2] = ns; m[3] = e * ns;
                m[4] = m[5] = m[6] = m[7] = 0;
            }
        }
    }
    if (b->num_reqs) memcpy(p->seq_lens, b->seq_lens, (size_t)b->num_reqs * 4);
    for (r = 0; r < b->num_reqs; r++)
        for (t = b->query_start_loc[r]; t < b->query_start_loc[r + 1]; t++) p->token_req[t] = r;
    rc = attn__cuda_staged_send(cu, &cm->up, cap, b, p->slot_mapping, p->block_table, &upload);
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, "attn_metadata_build", "the schedule upload", rc) : ATTN_OK;
}

/* ---- entry points ---- */

/* The MLA kernels copy q rows and write out rows in 16-byte pieces: a row tensor must
   start on 16 bytes with token and head strides of whole 16-byte pieces. */
static attn_status attn__cuda_mla_aligned(attn_context *ctx, const char *fn, const char *name, const attn_tensor *t) {
    attn_tensor r = attn__tensor_resolved(t);
    int64_t es = (int64_t)attn_dtype_size(r.dtype);
    if (((uintptr_t)r.data & 15) || (r.strides[0] * es) % 16 || (r.ndim > 2 && (r.strides[1] * es) % 16))
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: %s rows are not 16-byte aligned (data %p, strides %lld/%lld elements; allowed on "
                          "CUDA_MLA_SM90: a 16-byte aligned start and token and head strides that are multiples "
                          "of %d elements)", fn, name, r.data, (long long)r.strides[0],
                          (long long)(r.ndim > 2 ? r.strides[1] : 0), (int)(16 / es));
    return ATTN_OK;
}

/* C[b] = op(A[b]) . B[b] for b < batch, column-major (cuBLAS's view of our row-major
   tensors), f32 accumulation, elements of the layer's 16-bit type. */
static int attn__cuda_mla_gemm(attn_context *ctx, void *h, const attn_layer_desc *d, int transa, int m, int n, int k,
                               attn__CUdeviceptr A, int64_t lda, int64_t sa, attn__CUdeviceptr B, int64_t ldb,
                               int64_t sb, attn__CUdeviceptr C, int64_t ldc, int64_t sc, int batch) {
    const float one = 1.0f, zero = 0.0f;
    int t = d->dtype == ATTN_DTYPE_BF16 ? ATTN__CUDA_R_16BF : ATTN__CUDA_R_16F;
    if (n <= 0) return 0;
    return ctx->cublas->cublasGemmStridedBatchedEx(h, transa, ATTN__CUBLAS_OP_N, m, n, k, &one, (const void *)(uintptr_t)A, t,
                                                   (int)lda, (long long)sa, (const void *)(uintptr_t)B, t, (int)ldb,
                                                   (long long)sb, &zero, (void *)(uintptr_t)C, t, (int)ldc, (long long)sc,
                                                   batch, ATTN__CUBLAS_COMPUTE_32F, ATTN__CUBLAS_GEMM_DEFAULT);
}

/* The tensor map of an MLA latent cache [num_blocks, block_size, row] (rows contiguous) for
   a kernel that reads it through TMA (kernels/mla_decode_sm90.cu's LAUNCH): 3-D {row, block
   rows, blocks}, box {64 columns, box_rows rows, 1 block}, 128-byte swizzle (wgmma's K-major
   tiles). Host arithmetic and one driver call, nothing on the device: encoded at every
   forward, and a captured forward keeps its map as it keeps the cache pointer. */
static attn_status attn__cuda_mla_map(attn_context *ctx, attn_dtype dt, const void *cache, int64_t num_blocks,
                                      int block_size, int row, int box_rows, attn__tma_map *map) {
    const uint64_t esz = (uint64_t)attn_dtype_size(dt);
    uint64_t dims[3], strides[2];
    uint32_t box[3];
    dims[0] = (uint64_t)row;
    dims[1] = (uint64_t)block_size;
    dims[2] = (uint64_t)num_blocks;
    strides[0] = (uint64_t)row * esz;
    strides[1] = strides[0] * (uint64_t)block_size;
    box[0] = (uint32_t)(128 / esz);
    box[1] = (uint32_t)box_rows;
    box[2] = 1;
    return attn__tma_encode(ctx, map, dt, 3, cache, dims, strides, box, 128);
}

/* The decode launch: q [.][H][R] and q_pe [.][H][P] rows by the work list's q_row, out
   [.][H][R], lse [.][H] or none. */
static attn__CUresult attn__cuda_mla_decode(attn_context *ctx, const attn__cuda_mla_layer *L, const attn__cuda_mla_meta *cm,
                                            const attn_metadata *meta, const attn_layer_desc *d, attn__mla_rows q,
                                            attn__mla_rows q_pe, const attn_tensor *kv_cache, const attn__tma_map *map,
                                            attn__mla_rows out, const attn_tensor *lse, attn__CUstream s, int capturing) {
    attn__mla_decode_params dp;
    void *args[2];
    unsigned grid = (unsigned)(capturing ? cm->work_capacity : cm->host.counts[0]);
    unsigned merges = (unsigned)(capturing ? cm->merge_capacity : cm->host.counts[1]);
    attn__CUresult rc;
    if (!grid) return 0;
    memset(&dp, 0, sizeof dp);
    dp.q = q.data; dp.q_stride_token = q.s0; dp.q_stride_head = q.s1;
    dp.q_pe = q_pe.data; dp.q_pe_stride_token = q_pe.s0; dp.q_pe_stride_head = q_pe.s1;
    dp.kv_cache = attn__dptr(kv_cache->data);
    dp.out = out.data; dp.out_stride_token = out.s0; dp.out_stride_head = out.s1;
    if (lse) {
        attn_tensor lr = attn__tensor_resolved(lse);
        dp.lse = attn__dptr(lr.data);
        dp.lse_stride_token = lr.strides[0];
        dp.lse_stride_head = lr.strides[1];
    }
    dp.block_table = attn__dptr(cm->dev.block_table);
    dp.block_table_stride = attn_metadata_capacity(meta)->max_blocks_per_req;
    dp.work = attn__dptr(cm->dev.work);
    dp.num_work = attn__dptr(cm->dev.counts);
    dp.merge = attn__dptr(cm->dev.merge);
    dp.num_merge = attn__dptr(cm->dev.counts + 1);
    dp.partial_o = cm->partial_o;
    dp.partial_lse = cm->partial_lse;
    dp.num_heads = d->num_heads;
    dp.scale = d->scale;
    attn__cuda_latent_scale(d, &dp.k_scale, &dp.k_scale_value);
    args[0] = (void *)map; /* a kernel fed through TMA takes the cache's map first */
    args[1] = &dp;
    rc = ctx->cuda->cuLaunchKernel(L->decode.main, grid, 1, 1, (unsigned)L->decode.config.threads, 1, 1,
                                   (unsigned)L->decode.config.shared_bytes, s, map ? args : args + 1, NULL);
    if (rc == 0 && merges) /* the merges (a captured forward holds the launch always) */
        rc = ctx->cuda->cuLaunchKernel(L->decode.second, merges, (unsigned)L->rows, 1, 256, 1, 1, 0, s, args + 1, NULL);
    return rc;
}

/* Before a forward writes or launches anything, so that a cache refused here changes
   nothing: the cache's alignment, and where a decode launch follows (`decodes`) and the
   layer's decode kernel reads the cache through TMA (its config's tma_box_rows > 0), its
   tensor map, encoded into `storage`; *map is then storage, else NULL. */
static attn_status attn__cuda_mla_decode_map(attn_context *ctx, const char *fn, const attn__cuda_mla_layer *L,
                                             const attn_layer_desc *d, const attn_tensor *kv_cache, int decodes,
                                             attn__tma_map *storage, const attn__tma_map **map) {
    attn_status st;
    *map = NULL;
    if ((st = attn__cuda_cache_aligned(ctx, fn, kv_cache)) != ATTN_OK || !decodes || L->decode.config.tma_box_rows <= 0)
        return st;
    /* the driver's encoder wants a current context (it reads the device's limits): the
       layer's, entered for the call alone */
    if ((st = attn__cuda_enter(ctx, fn)) != ATTN_OK) return st;
    st = attn__cuda_mla_map(ctx, d->kv_cache_dtype, kv_cache->data, kv_cache->shape[0], d->block_size, d->head_size,
                            L->decode.config.tma_box_rows, storage);
    attn__cuda_leave(ctx);
    if (st == ATTN_OK) *map = storage;
    return st;
}

static attn_status attn__cuda_mla_forward_mqa(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                              const attn_tensor *q, const attn_tensor *q_pe,
                                              const attn_tensor *kv_cache, attn_tensor *out_latent, attn_tensor *lse,
                                              void *stream) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn__cuda_mla_layer *L = (const attn__cuda_mla_layer *)attn_layer_backend_state(layer);
    const attn__cuda_mla_meta *cm = (const attn__cuda_mla_meta *)attn_metadata_private(meta);
    const char *fn = "attn_mla_forward_mqa";
    attn__mla_rows qr = attn__mla_rows_of(q, 0), pr;
    attn__tma_map storage;
    const attn__tma_map *map;
    attn__CUresult rc;
    attn_status st;
    (void)self;
    if ((st = attn__cuda_mla_aligned(ctx, fn, "q", q)) != ATTN_OK ||
        (q_pe && (st = attn__cuda_mla_aligned(ctx, fn, "q_pe", q_pe)) != ATTN_OK) ||
        (st = attn__cuda_mla_aligned(ctx, fn, "out_latent", out_latent)) != ATTN_OK)
        return st;
    if (q_pe) pr = attn__mla_rows_of(q_pe, 0);
    else { /* one tensor [.][H][R + P]: q_pe is its tail */
        pr = qr;
        pr.data += (attn__CUdeviceptr)d->kv_lora_rank * attn_dtype_size(d->dtype);
    }
    if ((st = attn__cuda_mla_decode_map(ctx, fn, L, d, kv_cache, 1, &storage, &map)) != ATTN_OK) return st;
    if ((st = attn__cuda_enter_stream(ctx, fn, stream)) != ATTN_OK) return st;
    rc = attn__cuda_mla_decode(ctx, L, cm, meta, d, qr, pr, kv_cache, map, attn__mla_rows_of(out_latent, 0), lse,
                               (attn__CUstream)stream, attn__cuda_capturing(ctx, (attn__CUstream)stream));
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, fn, "cuLaunchKernel", rc) : ATTN_OK;
}

/* Sparse MLA: one launch of the layer's sparse decode (kernels/mla_decode.cu, SPARSE 1),
   grid (batch tokens, head tiles); a captured call covers the capacity's tokens (CTAs past
   the replayed build's count exit), so a graph replays for any batch of the metadata. */
static attn_status attn__cuda_mla_forward_sparse(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                                 const attn_tensor *q, const attn_tensor *q_pe,
                                                 const attn_tensor *kv_cache, const attn_tensor *indices,
                                                 attn_tensor *out_latent, attn_tensor *lse, void *stream) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn__cuda_mla_layer *L = (const attn__cuda_mla_layer *)attn_layer_backend_state(layer);
    const attn__cuda_mla_meta *cm = (const attn__cuda_mla_meta *)attn_metadata_private(meta);
    const char *fn = "attn_mla_forward_sparse";
    attn__mla_rows qr = attn__mla_rows_of(q, 0), pr, orr;
    attn_tensor ir = attn__tensor_resolved(indices);
    attn__mla_decode_params dp;
    attn__tma_map map; /* the wgmma gather's (its config's tma_box_rows: one-row boxes) */
    attn__CUresult rc;
    attn_status st;
    unsigned grid, splits, merges;
    int capturing, mapped = L->sparse.config.tma_box_rows > 0;
    void *args[2];
    (void)self;
    if ((st = attn__cuda_mla_aligned(ctx, fn, "q", q)) != ATTN_OK ||
        (q_pe && (st = attn__cuda_mla_aligned(ctx, fn, "q_pe", q_pe)) != ATTN_OK) ||
        (st = attn__cuda_mla_aligned(ctx, fn, "out_latent", out_latent)) != ATTN_OK ||
        (st = attn__cuda_cache_aligned(ctx, fn, kv_cache)) != ATTN_OK)
        return st;
    if (q_pe) pr = attn__mla_rows_of(q_pe, 0);
    else { /* one tensor [.][H][R + P]: q_pe is its tail */
        pr = qr;
        pr.data += (attn__CUdeviceptr)d->kv_lora_rank * attn_dtype_size(d->dtype);
    }
    orr = attn__mla_rows_of(out_latent, 0);
    memset(&dp, 0, sizeof dp);
    dp.q = qr.data; dp.q_stride_token = qr.s0; dp.q_stride_head = qr.s1;
    dp.q_pe = pr.data; dp.q_pe_stride_token = pr.s0; dp.q_pe_stride_head = pr.s1;
    dp.kv_cache = attn__dptr(kv_cache->data);
    dp.out = orr.data; dp.out_stride_token = orr.s0; dp.out_stride_head = orr.s1;
    if (lse) {
        attn_tensor lr = attn__tensor_resolved(lse);
        dp.lse = attn__dptr(lr.data);
        dp.lse_stride_token = lr.strides[0];
        dp.lse_stride_head = lr.strides[1];
    }
    dp.block_table = attn__dptr(cm->dev.block_table);
    dp.block_table_stride = attn_metadata_capacity(meta)->max_blocks_per_req;
    dp.num_work = attn__dptr(cm->dev.counts + 2); /* the build's token count, then its splits */
    dp.merge = attn__dptr(cm->dev.smerge);
    dp.num_merge = attn__dptr(cm->dev.counts + 4);
    dp.partial_o = cm->sparse_o;
    dp.partial_lse = cm->sparse_lse;
    dp.num_heads = d->num_heads;
    dp.scale = d->scale;
    attn__cuda_latent_scale(d, &dp.k_scale, &dp.k_scale_value);
    dp.indices = attn__dptr(ir.data);
    dp.indices_stride = ir.strides[0];
    dp.topk = (int)ir.shape[1];
    dp.seq_lens = attn__dptr(cm->dev.seq_lens);
    dp.token_req = attn__dptr(cm->dev.token_req);
    dp.sinks = attn__dptr(d->sinks); /* device floats, read by the launch */
    if ((st = attn__cuda_enter_stream(ctx, fn, stream)) != ATTN_OK) return st;
    if (mapped && (st = attn__cuda_mla_map(ctx, d->kv_cache_dtype, kv_cache->data, kv_cache->shape[0], d->block_size,
                                           d->head_size, L->sparse.config.tma_box_rows, &map)) != ATTN_OK) {
        attn__cuda_leave(ctx);
        return st;
    }
    capturing = attn__cuda_capturing(ctx, (attn__CUstream)stream);
    /* a captured call covers the capacity (tokens, the most splits, the most merge entries) */
    grid = (unsigned)(capturing ? attn_metadata_capacity(meta)->max_num_tokens : meta->batch.num_actual_tokens);
    splits = (unsigned)(capturing ? ATTN__MLA_SPARSE_SPLITS : cm->host.counts[3]);
    merges = (unsigned)(capturing ? cm->sparse_slots : cm->host.counts[4]);
    args[0] = &map; /* a kernel fed through TMA takes the cache's map first */
    args[1] = &dp;
    rc = grid ? ctx->cuda->cuLaunchKernel(L->sparse.main, grid, (unsigned)cm->sparse_tiles, splits,
                                          (unsigned)L->sparse.config.threads, 1, 1, (unsigned)L->sparse.config.shared_bytes,
                                          (attn__CUstream)stream, mapped ? args : args + 1, NULL)
              : 0;
    if (rc == 0 && grid && merges) /* the splits merged, a CTA per row (the sinks joined there) */
        rc = ctx->cuda->cuLaunchKernel(L->sparse.second, merges, (unsigned)cm->sparse_rows, 1, 256, 1, 1, 0,
                                       (attn__CUstream)stream, args + 1, NULL);
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, fn, "cuLaunchKernel", rc) : ATTN_OK;
}

/* The prefills of the batch (requests num_decodes ..): q_nope/q_pe/out rows are batch
   tokens from row0; lse rows too (NULL: the workspace's running LSE). Per request and
   chunk of keys: gather, up-project (cuBLAS), attend and merge. */
static attn_status attn__cuda_mla_prefill(attn_context *ctx, const char *fn, attn_layer *layer,
                                          const attn_metadata *meta, attn__mla_rows qn, attn__mla_rows qp,
                                          int row0, const attn_tensor *kv_cache, const attn_tensor *w_uk,
                                          const attn_tensor *w_uv, attn__mla_rows out, const attn_tensor *lse,
                                          attn__CUstream s) {
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn__cuda_mla_layer *L = (const attn__cuda_mla_layer *)attn_layer_backend_state(layer);
    const attn__cuda_mla_meta *cm = (const attn__cuda_mla_meta *)attn_metadata_private(meta);
    const attn_batch *b = attn_metadata_batch(meta);
    const attn_mla_info *info = &meta->mla;
    const int H = d->num_heads, R = d->kv_lora_rank, LD = d->head_size, DN = d->qk_nope_head_dim, DV = d->v_head_dim;
    const size_t es = attn_dtype_size(d->dtype);
    attn_tensor uk = attn__tensor_resolved(w_uk), uv = attn__tensor_resolved(w_uv);
    attn__mla_prefill_params pp;
    attn__mla_gather_params gp;
    attn__CUresult rc = 0;
    void *args[1];
    int r, c0, crc = 0;
    if (info->num_prefill_tokens <= 0) return ATTN_OK;
    memset(&pp, 0, sizeof pp);
    pp.q = qn.data; pp.q_stride_token = qn.s0; pp.q_stride_head = qn.s1;
    pp.q_pe = qp.data; pp.q_pe_stride_token = qp.s0; pp.q_pe_stride_head = qp.s1;
    pp.k_nope = cm->ws.k_nope; pp.k_stride_token = (int64_t)H * DN; pp.k_stride_head = DN;
    pp.k_pe = cm->ws.lat + (attn__CUdeviceptr)R * es; pp.kpe_stride_token = LD;
    pp.v = cm->ws.v; pp.v_stride_token = (int64_t)H * DV; pp.v_stride_head = DV;
    pp.out = out.data; pp.out_stride_token = out.s0; pp.out_stride_head = out.s1;
    if (lse) {
        attn_tensor lr = attn__tensor_resolved(lse);
        pp.lse = attn__dptr(lr.data); pp.lse_stride_token = lr.strides[0]; pp.lse_stride_head = lr.strides[1];
    } else {
        pp.lse = cm->ws.run_lse; pp.lse_stride_token = H; pp.lse_stride_head = 1;
    }
    pp.scale = d->scale;
    memset(&gp, 0, sizeof gp);
    gp.kv_cache = attn__dptr(kv_cache->data);
    gp.lat = cm->ws.lat;
    gp.block_size = d->block_size;
    attn__cuda_latent_scale(d, &gp.k_scale, &gp.k_scale_value);
    if ((crc = ctx->cublas->cublasSetStream(L->cublas, (void *)s)) != 0 ||
        (crc = ctx->cublas->cublasSetWorkspace(L->cublas, (void *)(uintptr_t)cm->ws.cublas, ATTN__MLA_CUBLAS_WS)) != 0)
        goto cublas_failed;
    for (r = info->num_decodes; r < b->num_reqs && rc == 0; r++) {
        int q0 = b->query_start_loc[r], ql = b->query_start_loc[r + 1] - q0, sl = b->seq_lens[r];
        int past = sl - ql; /* keys before the request's first query */
        if (ql <= 0) continue;
        for (c0 = 0; c0 < sl && rc == 0; c0 += cm->chunk) {
            int n = ATTN__MIN(cm->chunk, sl - c0), tq0 = ATTN__MAX(0, c0 - past);
            if (tq0 >= ql) break; /* causal: no query sees this chunk or a later one */
            gp.block_table = attn__dptr(cm->dev.block_table + (size_t)r * (size_t)attn_metadata_capacity(meta)->max_blocks_per_req);
            gp.key0 = c0;
            gp.nkeys = n;
            args[0] = &gp;
            rc = ctx->cuda->cuLaunchKernel(L->cache.second, (unsigned)ATTN__MIN(1024, ((int64_t)n * LD / 8 + 255) / 256),
                                           1, 1, 256, 1, 1, 0, s, args, NULL);
            if (rc) break;
            /* K_nope[j][h] = lat[j][:R] . W_UK[h]^T; V[j][h] = lat[j][:R] . W_UV[h] */
            if ((crc = attn__cuda_mla_gemm(ctx, L->cublas, d, ATTN__CUBLAS_OP_T, DN, n, R, attn__dptr(uk.data), uk.strides[1],
                                           uk.strides[0], cm->ws.lat, LD, 0, cm->ws.k_nope, (int64_t)H * DN, DN, H)) != 0 ||
                (crc = attn__cuda_mla_gemm(ctx, L->cublas, d, ATTN__CUBLAS_OP_N, DV, n, R, attn__dptr(uv.data), uv.strides[1],
                                           uv.strides[0], cm->ws.lat, LD, 0, cm->ws.v, (int64_t)H * DV, DV, H)) != 0)
                goto cublas_failed;
            pp.q_row0 = q0 - row0 + tq0;
            pp.nq = ql - tq0;
            pp.pos0 = past + tq0;
            pp.key_pos0 = c0;
            pp.nkeys = n;
            pp.flags = 1 | (c0 > 0 ? 2 : 0); /* causal; chunks after the first merge */
            args[0] = &pp;
            rc = ctx->cuda->cuLaunchKernel(L->prefill.main,
                                           (unsigned)((pp.nq + L->prefill.config.rows - 1) / L->prefill.config.rows), (unsigned)H, 1,
                                           (unsigned)L->prefill.config.threads, 1, 1, (unsigned)L->prefill.config.shared_bytes, s, args, NULL);
        }
    }
    return rc ? attn__cu_fail(ctx, fn, "cuLaunchKernel", rc) : ATTN_OK;
cublas_failed:
    return attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR, "%s: a cuBLAS call of the up-projection "
                      "failed (cublasStatus %d)", fn, crc);
}

static attn_status attn__cuda_mla_forward_mha(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                              const attn_tensor *q, const attn_tensor *kv_cache, const attn_tensor *w_uk,
                                              const attn_tensor *w_uv, attn_tensor *out, attn_tensor *lse, void *stream) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const char *fn = "attn_mla_forward_mha";
    attn__mla_rows qn = attn__mla_rows_of(q, 0), qp = qn;
    attn_status st;
    (void)self;
    if ((st = attn__cuda_mla_aligned(ctx, fn, "q", q)) != ATTN_OK ||
        (st = attn__cuda_mla_aligned(ctx, fn, "out", out)) != ATTN_OK)
        return st;
    qp.data += (attn__CUdeviceptr)d->qk_nope_head_dim * attn_dtype_size(d->dtype); /* [q_nope | q_pe] */
    if ((st = attn__cuda_enter_stream(ctx, fn, stream)) != ATTN_OK) return st;
    st = attn__cuda_mla_prefill(ctx, fn, layer, meta, qn, qp, meta->mla.num_decode_tokens, kv_cache, w_uk, w_uv,
                                attn__mla_rows_of(out, 0), lse, (attn__CUstream)stream);
    attn__cuda_leave(ctx);
    return st;
}

/* The latent write's parameters for rows t0 .. t0 + num_tokens - 1 (slots unset). */
static void attn__cuda_mla_write_params(const attn_layer_desc *d, const attn_tensor *kv_c, const attn_tensor *k_pe,
                                        attn_tensor *kv_cache, int64_t t0, int num_tokens,
                                        attn__latent_write_params *wp) {
    attn_tensor c = attn__tensor_resolved(kv_c), p = attn__tensor_resolved(k_pe);
    size_t esz = attn_dtype_size(kv_c->dtype);
    memset(wp, 0, sizeof *wp);
    wp->kv_c = attn__dptr((const char *)kv_c->data + (size_t)(t0 * c.strides[0]) * esz);
    wp->k_pe = attn__dptr((const char *)k_pe->data + (size_t)(t0 * p.strides[0]) * esz);
    wp->kv_cache = attn__dptr(kv_cache->data);
    wp->kv_c_stride_token = c.strides[0];
    wp->k_pe_stride_token = p.strides[0];
    wp->num_tokens = num_tokens;
    wp->num_slots = kv_cache->shape[0] * (int64_t)d->block_size;
    attn__cuda_latent_scale(d, &wp->k_scale, &wp->k_scale_value);
}

/* The latent write from device slots (the metadata's copy of the batch's). */
static attn__CUresult attn__cuda_mla_write(attn_context *ctx, const attn__cuda_mla_layer *L, const attn_layer_desc *d,
                                           const attn_tensor *kv_c,
                                           const attn_tensor *k_pe, attn_tensor *kv_cache, attn__CUdeviceptr slots,
                                           int num_tokens, attn__CUstream s) {
    attn__latent_write_params wp;
    void *args[1];
    if (num_tokens <= 0) return 0;
    attn__cuda_mla_write_params(d, kv_c, k_pe, kv_cache, 0, num_tokens, &wp);
    wp.slot_mapping = slots;
    args[0] = &wp;
    return ctx->cuda->cuLaunchKernel(L->cache.main, (unsigned)ATTN__MIN(num_tokens, 4096), 1, 1, 128, 1, 1, 0, s,
                                     args, NULL);
}

/* The public latent write: as attn_reshape_and_cache on CUDA (device slots in one checked
   launch; host slots in the launch parameters). */
static attn_status attn__cuda_mla_concat_and_cache(const attn_backend *self, attn_layer *layer, const attn_tensor *kv_c,
                                                   const attn_tensor *k_pe, attn_tensor *kv_cache,
                                                   const attn_tensor *slot_mapping, void *stream) {
    attn_context *ctx = attn_layer_context(layer);
    const attn__cuda_mla_layer *L = (const attn__cuda_mla_layer *)attn_layer_backend_state(layer);
    const int num_tokens = (int)slot_mapping->shape[0];
    attn__latent_write_inline_params ip;
    attn__CUresult rc = 0;
    attn_status st;
    void *args[1];
    int t0, n;
    (void)self;
    if (num_tokens == 0) return ATTN_OK;
    if ((st = attn__cuda_enter_stream(ctx, "attn_concat_and_cache_mla", stream)) != ATTN_OK) return st;
    args[0] = &ip;
    if (slot_mapping->device.kind == ATTN_DEVICE_CUDA) {
        attn__cuda_mla_write_params(attn_layer_get_desc(layer), kv_c, k_pe, kv_cache, 0, num_tokens, &ip.p);
        ip.p.slot_mapping = attn__dptr(slot_mapping->data);
        ip.p.check_slots = 1;
        args[0] = &ip.p;
        rc = ctx->cuda->cuLaunchKernel(L->cache.main, attn__cuda_write_grid(ctx, num_tokens), 1, 1, 128, 1, 1, 0,
                                       (attn__CUstream)stream, args, NULL);
    }
    for (t0 = 0; slot_mapping->device.kind != ATTN_DEVICE_CUDA && t0 < num_tokens && rc == 0; t0 += n) {
        n = ATTN__MIN(num_tokens - t0, ATTN__INLINE_SLOTS);
        attn__cuda_mla_write_params(attn_layer_get_desc(layer), kv_c, k_pe, kv_cache, t0, n, &ip.p);
        memcpy(ip.slots, (const int64_t *)slot_mapping->data + t0, (size_t)n * sizeof(int64_t));
        rc = ctx->cuda->cuLaunchKernel(L->cache.third, (unsigned)n, 1, 1, 128, 1, 1, 0, (attn__CUstream)stream, args,
                                       NULL);
    }
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, "attn_concat_and_cache_mla", "cuLaunchKernel", rc) : ATTN_OK;
}

/* The fused layer call: the cache write from the metadata's slots, the decodes absorbed
   (q_nope . W_UK -> decode -> o_latent . W_UV, through the workspace), the prefills
   up-projected. */
static attn_status attn__cuda_mla_forward(const attn_backend *self, attn_layer *layer, const attn_metadata *meta,
                                          const attn_tensor *q_nope, const attn_tensor *q_pe, const attn_tensor *kv_c,
                                          const attn_tensor *k_pe, attn_tensor *kv_cache, const attn_tensor *w_uk,
                                          const attn_tensor *w_uv, attn_tensor *out, void *stream) {
    attn_context *ctx = attn_layer_context(layer);
    const attn_layer_desc *d = attn_layer_get_desc(layer);
    const attn__cuda_mla_layer *L = (const attn__cuda_mla_layer *)attn_layer_backend_state(layer);
    const attn__cuda_mla_meta *cm = (const attn__cuda_mla_meta *)attn_metadata_private(meta);
    const char *fn = "attn_mla_forward";
    const int H = d->num_heads, R = d->kv_lora_rank, td = meta->mla.num_decode_tokens;
    attn__CUstream s = (attn__CUstream)stream;
    attn__mla_rows qn = attn__mla_rows_of(q_nope, 0), qp = attn__mla_rows_of(q_pe, 0), o = attn__mla_rows_of(out, 0);
    attn__tma_map storage;
    const attn__tma_map *map;
    attn__CUresult rc = 0;
    attn_status st;
    int capturing, crc = 0;
    (void)self;
    if ((st = attn__cuda_mla_aligned(ctx, fn, "q_nope", q_nope)) != ATTN_OK ||
        (st = attn__cuda_mla_aligned(ctx, fn, "q_pe", q_pe)) != ATTN_OK ||
        (st = attn__cuda_mla_aligned(ctx, fn, "out", out)) != ATTN_OK ||
        (st = attn__cuda_mla_decode_map(ctx, fn, L, d, kv_cache, td > 0, &storage, &map)) != ATTN_OK)
        return st;
    if ((st = attn__cuda_enter_stream(ctx, fn, stream)) != ATTN_OK) return st;
    capturing = attn__cuda_capturing(ctx, s);
    if (kv_c)
        rc = attn__cuda_mla_write(ctx, L, d, kv_c, k_pe, kv_cache, attn__dptr(cm->dev.slot_mapping),
                                  capturing ? attn_metadata_capacity(meta)->max_num_tokens
                                            : attn_metadata_batch(meta)->num_actual_tokens, s);
    if (rc == 0 && td > 0) {
        attn__mla_rows ql, ol;
        attn_tensor uk = attn__tensor_resolved(w_uk), uv = attn__tensor_resolved(w_uv);
        ql.data = cm->ws.q_lat; ql.s0 = (int64_t)H * R; ql.s1 = R;
        ol.data = cm->ws.o_lat; ol.s0 = (int64_t)H * R; ol.s1 = R;
        if ((crc = ctx->cublas->cublasSetStream(L->cublas, (void *)s)) != 0 ||
            (crc = ctx->cublas->cublasSetWorkspace(L->cublas, (void *)(uintptr_t)cm->ws.cublas, ATTN__MLA_CUBLAS_WS)) != 0 ||
            /* q_latent[t][h] = q_nope[t][h] . W_UK[h] */
            (crc = attn__cuda_mla_gemm(ctx, L->cublas, d, ATTN__CUBLAS_OP_N, R, td, d->qk_nope_head_dim, attn__dptr(uk.data),
                                       uk.strides[1], uk.strides[0], qn.data, qn.s0, qn.s1, ql.data, ql.s0, ql.s1, H)) != 0)
            goto cublas_failed;
        rc = attn__cuda_mla_decode(ctx, L, cm, meta, d, ql, qp, kv_cache, map, ol, NULL, s, capturing);
        /* out[t][h] = o_latent[t][h] . W_UV[h] */
        if (rc == 0 &&
            (crc = attn__cuda_mla_gemm(ctx, L->cublas, d, ATTN__CUBLAS_OP_N, d->v_head_dim, td, R, attn__dptr(uv.data),
                                       uv.strides[1], uv.strides[0], ol.data, ol.s0, ol.s1, o.data, o.s0, o.s1, H)) != 0)
            goto cublas_failed;
    }
    if (rc == 0) st = attn__cuda_mla_prefill(ctx, fn, layer, meta, qn, qp, 0, kv_cache, w_uk, w_uv, o, NULL, s);
    attn__cuda_leave(ctx);
    return rc ? attn__cu_fail(ctx, fn, "cuLaunchKernel", rc) : st;
cublas_failed:
    attn__cuda_leave(ctx);
    return attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR, "%s: a cuBLAS call of the projections "
                      "failed (cublasStatus %d)", fn, crc);
}

static const attn_backend attn__cuda_mla_sm90_backend = {
    "CUDA_MLA_SM90",          /* name */
    ATTN_BACKEND_CUDA_MLA_SM90, /* id */
    ATTN_DEVICE_CUDA,         /* device */
    ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16),
    ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16) |
        ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_DS_MLA), /* fp8_ds_mla: the sparse call (mma.sync, widened in shared memory) */
    320, 576, 8,              /* head sizes: 576 or 320 exactly (attn__cuda_mla_check) */
    16, 0,                    /* block sizes: any multiple of 16 (64 recommended) */
    0, 0, 0, 0,               /* non-causal, sliding window, soft cap, ALiBi: no */
    1,                        /* attention sinks: attn_mla_forward_sparse (the dense calls refuse them) */
    0,                        /* cascade: not yet (the batch computed as with common_prefix_len 0) */
    1,                        /* is_mla */
    ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE, /* decode: capacity grids, counts on the device */
    1, ATTN_LSE_BASE_E,
    attn__cuda_mla_check,
    attn__cuda_mla_context_init, attn__cuda_mla_context_release,
    attn__cuda_mla_layer_init, attn__cuda_mla_layer_release,
    attn__cpu_mla_kv_cache_shape, /* the CPU_MLA latent layout */
    attn__cuda_mla_metadata_init,
    attn__cuda_mla_metadata_release,
    attn__cuda_mla_build,
    NULL, NULL,               /* forward, reshape_and_cache: MLA backend */
    attn__cuda_mla_forward_mqa,
    attn__cuda_mla_forward_mha,
    attn__cuda_mla_forward,
    attn__cuda_mla_concat_and_cache,
    NULL,                     /* attn_merge_attn_states on the device goes to CUDA */
    attn__cuda_mla_forward_sparse
};

/* CUDA_MLA: the same backend on mma.sync kernels (kernels/mla_decode.cu, mla_prefill.cu),
   compute capability 8.0 and newer (A100, L40, H100 where CUDA_MLA_SM90 does not apply):
   the decode's CTA holds 16, 32 or 64 heads of one token; split merges always in
   attn_mla_merge. Everything else (schedule, workspace, cuBLAS projections, graphs) is
   CUDA_MLA_SM90's host code. */
static const attn_backend attn__cuda_mla_backend = {
    "CUDA_MLA",               /* name */
    ATTN_BACKEND_CUDA_MLA,    /* id */
    ATTN_DEVICE_CUDA,         /* device */
    ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16),
    ATTN_DTYPE_BIT(ATTN_DTYPE_F16) | ATTN_DTYPE_BIT(ATTN_DTYPE_BF16) | ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E4M3) |
        ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_E5M2) | /* fp8 latents with a per-tensor scale */
        ATTN_DTYPE_BIT(ATTN_DTYPE_FP8_DS_MLA), /* fp8_ds_mla: the sparse call */
    320, 576, 8,
    16, 0,
    0, 0, 0, 0,
    1,                        /* attention sinks: attn_mla_forward_sparse (the dense calls refuse them) */
    0,                        /* cascade: not yet (the batch computed as with common_prefix_len 0) */
    1,                        /* is_mla */
    ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE,
    1, ATTN_LSE_BASE_E,
    attn__cuda_mla_check,
    attn__cuda_mla_context_init, attn__cuda_mla_context_release,
    attn__cuda_mla_layer_init, attn__cuda_mla_layer_release,
    attn__cpu_mla_kv_cache_shape,
    attn__cuda_mla_metadata_init,
    attn__cuda_mla_metadata_release,
    attn__cuda_mla_build,
    NULL, NULL,
    attn__cuda_mla_forward_mqa,
    attn__cuda_mla_forward_mha,
    attn__cuda_mla_forward,
    attn__cuda_mla_concat_and_cache,
    NULL,
    attn__cuda_mla_forward_sparse
};

#else /* ATTN_NO_CUDA: the helpers answer, the backend does not exist */

static int attn__stream_capturing(attn_context *ctx, void *stream) {
    (void)ctx; (void)stream;
    return 0;
}

static int attn__cuda_pointer_kind(attn_context *ctx, const void *ptr) {
    (void)ctx; (void)ptr;
    return -1;
}

static attn_status attn__cuda_compiled_out(attn_context *ctx, const char *fn) {
    return attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR,
                      "%s: the CUDA path is compiled out (ATTN_NO_CUDA)", fn);
}
ATTN_API attn_status attn_cuda_malloc(attn_context *ctx, size_t bytes, void **ptr) {
    (void)bytes;
    if (ptr) *ptr = NULL;
    return attn__cuda_compiled_out(ctx, "attn_cuda_malloc");
}
ATTN_API attn_status attn_cuda_free(attn_context *ctx, void *ptr) {
    return ptr ? attn__cuda_compiled_out(ctx, "attn_cuda_free") : ATTN_OK;
}
ATTN_API attn_status attn_cuda_memcpy(attn_context *ctx, void *dst, const void *src, size_t bytes,
                                      attn_copy_kind kind, void *stream) {
    (void)dst; (void)src; (void)bytes; (void)kind; (void)stream;
    return attn__cuda_compiled_out(ctx, "attn_cuda_memcpy");
}
ATTN_API attn_status attn_cuda_synchronize(attn_context *ctx, void *stream) {
    (void)stream;
    return attn__cuda_compiled_out(ctx, "attn_cuda_synchronize");
}
#endif /* ATTN_NO_CUDA */

/* =======================================================================================
   >>builtin
   The built-in registry entries: one line per backend section above.
   ======================================================================================= */

#ifdef ATTN_NO_CUDA
#define ATTN__CUDA_VTABLE(v) NULL
#else
#define ATTN__CUDA_VTABLE(v) (&(v))
#endif
static const attn__builtin_row attn__builtin_table[] = {
    /* id                        name             vtable                                        cpu cuda */
    {ATTN_BACKEND_CUSTOM,        "CUSTOM",        NULL, /* a plugin's slot */                  1, 1},
    {ATTN_BACKEND_CPU,           "CPU",           &attn__cpu_backend,                           2, 6},
    {ATTN_BACKEND_CPU_MLA,       "CPU_MLA",       &attn__cpu_mla_backend,                       3, 7},
    {ATTN_BACKEND_CUDA_SM90,     "CUDA_SM90",     ATTN__CUDA_VTABLE(attn__cuda_sm90_backend),     4, 2},
    {ATTN_BACKEND_CUDA,          "CUDA",          ATTN__CUDA_VTABLE(attn__cuda_backend),          5, 3},
    {ATTN_BACKEND_CUDA_MLA_SM90, "CUDA_MLA_SM90", ATTN__CUDA_VTABLE(attn__cuda_mla_sm90_backend), 6, 4},
    {ATTN_BACKEND_CUDA_MLA,      "CUDA_MLA",      ATTN__CUDA_VTABLE(attn__cuda_mla_backend),      7, 5},
};
#undef ATTN__CUDA_VTABLE
/* fails to compile when attn_backend_id gains an id without a row (AUTO has none) */
typedef char attn__builtin_table_complete[
    sizeof attn__builtin_table / sizeof attn__builtin_table[0] == (size_t)ATTN_BACKEND_COUNT - 1 ? 1 : -1];

static const attn__builtin_row *attn__builtin_rows(int *count) {
    *count = (int)(sizeof attn__builtin_table / sizeof attn__builtin_table[0]);
    return attn__builtin_table;
}

/* =======================================================================================
   >>forward
   The public forward calls: validate everything a backend relies on (tensors, device,
   metadata fit, token counts), then dispatch through the vtable.
   ======================================================================================= */

static attn_status attn__check_graph(attn_layer *layer, const attn_metadata *meta, const char *fn, void *stream,
                                     int part) {
    const attn_backend *b = layer->backend;
    const attn_batch *bt = meta ? &meta->batch : NULL;
    int i, uniform = 1;
    if (b->device != ATTN_DEVICE_CUDA || b->cuda_graph == ATTN_CUDA_GRAPH_ALWAYS ||
        !attn__stream_capturing(layer->ctx, stream))
        return ATTN_OK;
    if (b->cuda_graph == ATTN_CUDA_GRAPH_NEVER)
        return attn__fail(layer->ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the stream is capturing a CUDA graph and backend %s declares no graph support "
                          "(cuda_graph NEVER; allowed: calls on a stream that is not capturing)", fn, b->name);
    if (part == ATTN__PART_WRITE) return ATTN_OK;
    if (b->cuda_graph == ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE) {
        if (part == ATTN__PART_DECODES) return ATTN_OK;
        if (part == ATTN__PART_PREFILLS || bt->max_query_len > 1)
            return attn__fail(layer->ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                              "%s: the stream is capturing a CUDA graph and backend %s replays single-token "
                              "decodes only (cuda_graph UNIFORM_SINGLE_TOKEN_DECODE); this %s (allowed: a "
                              "batch of one-token decodes, or forward_mqa)", fn, b->name,
                              part == ATTN__PART_PREFILLS ? "call runs prefills" : "batch has a query of more "
                                                                                   "than one token");
        return ATTN_OK;
    }
    for (i = 1; i < bt->num_reqs; i++) /* UNIFORM_BATCH: one query length for every request */
        uniform &= bt->query_start_loc[i + 1] - bt->query_start_loc[i] == bt->query_start_loc[1];
    if (!uniform)
        return attn__fail(layer->ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the stream is capturing a CUDA graph and backend %s replays uniform batches only "
                          "(cuda_graph UNIFORM_BATCH); this batch's query lengths differ (allowed: one query "
                          "length for every request)", fn, b->name);
    return ATTN_OK;
}

/* A backend that declares base-2 LSE (CPU backends only: attn_register_backend) hands the
   front door rows in base 2; the caller always gets base e. */
/* DCP with a communicator: the rank's partial of `rows` tokens x heads x `width` as
   contiguous views into the metadata's buffer (rank slot 0; the gathered ranks follow). */
static void attn__dcp_partial(const attn_metadata *meta, int slot, int rows, int width, attn_tensor *out,
                              attn_tensor *lse) {
    const attn_layer_desc *d = &meta->layer->desc;
    const size_t cap_rows = (size_t)meta->cap.max_num_tokens * (size_t)d->num_heads;
    const size_t esz = attn_dtype_size(d->dtype), W1 = (size_t)meta->cap.dcp_world_size + 1;
    char *outs = (char *)meta->dcp_buf, *lses = outs + W1 * cap_rows * (size_t)meta->dcp_width * esz;
    int64_t os[3], ls[2];
    os[0] = ls[0] = rows; os[1] = ls[1] = d->num_heads; os[2] = width;
    *out = attn_tensor_make(outs + (size_t)slot * (size_t)rows * (size_t)d->num_heads * (size_t)width * esz, d->dtype,
                            3, os);
    *lse = attn_tensor_make(lses + (size_t)slot * (size_t)rows * (size_t)d->num_heads * sizeof(float),
                            ATTN_DTYPE_F32, 2, ls);
}

/* All-gathers the rank's partial (slot 0) into slots 1..W and combines them into out/lse. */
static attn_status attn__dcp_exchange(const attn_metadata *meta, const char *fn, int rows, int width,
                                      attn_tensor *out, attn_tensor *lse, void *stream) {
    attn_context *ctx = meta->layer->ctx;
    attn_communicator *c = meta->cap.dcp_comm;
    const int W = meta->cap.dcp_world_size, H = meta->layer->desc.num_heads;
    const size_t esz = attn_dtype_size(meta->layer->desc.dtype);
    attn_tensor po, pl, go[64], gl[64], o, l;
    const attn_tensor *pgo[64], *pgl[64];
    int i, rc;
    if (rows <= 0) return ATTN_OK;
    attn__dcp_partial(meta, 0, rows, width, &po, &pl);
    attn__dcp_partial(meta, 1, rows, width, &go[0], &gl[0]);
    rc = c->all_gather(c, po.data, go[0].data, (size_t)rows * (size_t)H * (size_t)width * esz, stream);
    if (!rc) rc = c->all_gather(c, pl.data, gl[0].data, (size_t)rows * (size_t)H * sizeof(float), stream);
    if (rc)
        return attn__fail(ctx, ATTN_ERROR_PLATFORM, ATTN_LOG_PLATFORM_ERROR,
                          "%s: the DCP communicator's all_gather failed (%d) at rank %d of %d", fn, rc, c->rank,
                          c->size);
    for (i = 0; i < W; i++) { /* rank i's rows in the gathered blocks */
        go[i] = go[0];
        gl[i] = gl[0];
        go[i].data = (char *)go[0].data + (size_t)i * (size_t)rows * (size_t)H * (size_t)width * esz;
        gl[i].data = (float *)gl[0].data + (size_t)i * (size_t)rows * (size_t)H;
        pgo[i] = &go[i];
        pgl[i] = &gl[i];
    }
    o = attn__tensor_resolved(out);
    o.shape[0] = rows;
    if (lse) {
        l = attn__tensor_resolved(lse);
        l.shape[0] = rows;
    }
    return attn_dcp_combine(ctx, W, pgo, pgl, &o, lse ? &l : NULL, stream);
}

static void attn__lse_to_base_e(const attn_layer *layer, attn_tensor *lse, int64_t rows) {
    attn_tensor l;
    int64_t t, h;
    if (!lse || layer->backend->lse_base != ATTN_LSE_BASE_2) return;
    l = attn__tensor_resolved(lse);
    for (t = 0; t < rows && t < l.shape[0]; t++)
        for (h = 0; h < l.shape[1]; h++) ((float *)l.data)[t * l.strides[0] + h * l.strides[1]] *= 0.6931471805599453f;
}

ATTN_API attn_status attn_layer_forward(attn_layer *layer, const attn_metadata *meta,
                                        const attn_tensor *q, const attn_tensor *k,
                                        const attn_tensor *v, attn_tensor *kv_cache,
                                        attn_tensor *out, attn_tensor *lse, void *stream) {
    attn_context *ctx = layer ? layer->ctx : NULL;
    const char *fn = "attn_layer_forward";
    const attn_layer_desc *d;
    attn_device_kind dev;
    int64_t shape[3];
    attn_status st;
    int ntok;
    if (!layer) return attn__null_arg(ctx, __func__, "layer");
    if (!meta) return attn__null_arg(ctx, __func__, "meta");
    if (!q) return attn__null_arg(ctx, __func__, "q");
    if (!kv_cache) return attn__null_arg(ctx, __func__, "kv_cache");
    if (!out) return attn__null_arg(ctx, __func__, "out");
    d = &layer->desc;
    dev = layer->backend->device;
    if (d->use_mla)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the layer is MLA (allowed: standard layers; MLA layers use the "
                          "MLA forward calls)", fn);
    st = attn__check_meta(layer, meta, fn);
    if (st != ATTN_OK) return st;
    if ((k == NULL) != (v == NULL))
        return attn__fail(ctx, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL,
                          "%s: argument '%s' is NULL but '%s' is not (allowed: both or neither)",
                          fn, k ? "v" : "k", k ? "k" : "v");
    ntok = meta->batch.num_actual_tokens;
    shape[0] = ATTN__AT_LEAST(ntok); shape[1] = d->num_heads; shape[2] = d->head_size;
    st = attn__check_tensor(ctx, fn, "q", q, d->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "out", out, d->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_output_tensor(ctx, fn, "out", out);
    if (st != ATTN_OK) return st;
    st = attn__check_kv_cache(layer, fn, kv_cache, 0);
    if (st != ATTN_OK) return st;
    if (kv_cache->shape[0] < meta->cap.num_blocks)
        return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                          "%s: kv_cache.shape[0] is %lld (allowed: >= num_blocks %lld of the "
                          "metadata)", fn, (long long)kv_cache->shape[0], (long long)meta->cap.num_blocks);
    if (k) {
        if (!meta->batch.slot_mapping)
            return attn__fail(ctx, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA,
                              "%s: k/v given but the batch has no slot_mapping (allowed: a "
                              "slot_mapping, or k = v = NULL)", fn);
        st = attn__check_kv_write(layer, fn, k, v, kv_cache, meta->batch.slot_mapping, ntok);
        if (st != ATTN_OK) return st;
    }
    if (lse) {
        if (!layer->backend->can_return_lse)
            return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                              "%s: backend %s cannot return the LSE (allowed: lse = NULL)", fn,
                              layer->backend->name);
        shape[1] = d->num_heads;
        st = attn__check_tensor(ctx, fn, "lse", lse, ATTN_DTYPE_F32, 2, shape, dev);
        if (st == ATTN_OK) st = attn__check_output_tensor(ctx, fn, "lse", lse);
        if (st != ATTN_OK) return st;
    }
    if ((st = attn__check_graph(layer, meta, fn, stream, ATTN__PART_ALL)) != ATTN_OK) return st;
    if (meta->cap.dcp_comm) { /* the partial into the metadata, then gathered and combined */
        attn_tensor po, pl;
        attn__dcp_partial(meta, 0, ntok, d->head_size, &po, &pl);
        st = layer->backend->forward(layer->backend, layer, meta, q, k, v, kv_cache, &po, &pl, stream);
        if (st == ATTN_OK) attn__lse_to_base_e(layer, &pl, ntok);
        return st == ATTN_OK ? attn__dcp_exchange(meta, fn, ntok, d->head_size, out, lse, stream) : st;
    }
    st = layer->backend->forward(layer->backend, layer, meta, q, k, v, kv_cache, out, lse, stream);
    if (st == ATTN_OK) attn__lse_to_base_e(layer, lse, ntok);
    return st;
}

/* sparse: the call is attn_mla_forward_sparse (the one MLA call that reads fp8_ds_mla and
   takes sinks) */
static attn_status attn__check_mla_call(attn_layer *layer, const attn_metadata *meta, const char *fn, int sparse) {
    attn_context *ctx = layer->ctx;
    if (!layer->desc.use_mla || !layer->backend->is_mla)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the layer is not MLA (allowed: a layer created with use_mla = 1)", fn);
    if (!sparse && layer->desc.kv_cache_dtype == ATTN_DTYPE_FP8_DS_MLA)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the layer's cache is fp8_ds_mla (allowed: attn_mla_forward_sparse, the one MLA "
                          "call that reads it; dense MLA layers use a 16-bit or fp8 latent)", fn);
    if (!sparse && layer->desc.sinks)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the MLA layer has desc.sinks (allowed: attn_mla_forward_sparse, the one MLA call "
                          "that takes sinks so far; create the layer without sinks for the dense calls)", fn);
    if (sparse && !layer->backend->forward_sparse)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: backend %s has no sparse MLA (allowed: CPU_MLA, CUDA_MLA, CUDA_MLA_SM90)", fn,
                          layer->backend->name);
    return attn__check_meta(layer, meta, fn);
}

/* The checks the two absorbed (MQA over the latent) calls share: the call fits the layer
   and meta, q [>= rows, H, D] or q_latent + q_pe, out_latent [>= rows, H, R], lse [>= rows,
   H] if given, and the cache. */
static attn_status attn__check_latent_call(attn_layer *layer, const attn_metadata *meta, const char *fn, int sparse,
                                           int rows, const attn_tensor *q, const attn_tensor *q_pe,
                                           const attn_tensor *kv_cache, const attn_tensor *out_latent,
                                           const attn_tensor *lse) {
    attn_context *ctx = layer->ctx;
    const attn_layer_desc *d = &layer->desc;
    const attn_device_kind dev = layer->backend->device;
    int64_t shape[3];
    attn_status st = attn__check_mla_call(layer, meta, fn, sparse);
    if (st != ATTN_OK) return st;
    shape[0] = ATTN__AT_LEAST(rows); shape[1] = d->num_heads;
    shape[2] = q_pe ? d->kv_lora_rank : d->head_size;
    st = attn__check_tensor(ctx, fn, "q", q, d->dtype, 3, shape, dev);
    if (st == ATTN_OK && q_pe) {
        shape[2] = d->qk_rope_head_dim;
        st = attn__check_tensor(ctx, fn, "q_pe", q_pe, d->dtype, 3, shape, dev);
    }
    shape[2] = d->kv_lora_rank;
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "out_latent", out_latent, d->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_output_tensor(ctx, fn, "out_latent", out_latent);
    if (st == ATTN_OK && lse) st = attn__check_tensor(ctx, fn, "lse", lse, ATTN_DTYPE_F32, 2, shape, dev);
    if (st == ATTN_OK && lse) st = attn__check_output_tensor(ctx, fn, "lse", lse);
    if (st == ATTN_OK) st = attn__check_kv_cache(layer, fn, kv_cache, 0);
    if (st == ATTN_OK && kv_cache->shape[0] < meta->cap.num_blocks)
        st = attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                        "%s: kv_cache.shape[0] is %lld (allowed: >= num_blocks %lld of the metadata)",
                        fn, (long long)kv_cache->shape[0], (long long)meta->cap.num_blocks);
    return st;
}

ATTN_API attn_status attn_mla_forward_mqa(attn_layer *layer, const attn_metadata *meta,
                                          const attn_tensor *q, const attn_tensor *q_pe,
                                          const attn_tensor *kv_cache, attn_tensor *out_latent,
                                          attn_tensor *lse, void *stream) {
    attn_context *ctx = layer ? layer->ctx : NULL;
    const char *fn = "attn_mla_forward_mqa";
    attn_status st;
    int td;
    if (!layer) return attn__null_arg(ctx, __func__, "layer");
    if (!meta) return attn__null_arg(ctx, __func__, "meta");
    if (!q) return attn__null_arg(ctx, __func__, "q");
    if (!kv_cache) return attn__null_arg(ctx, __func__, "kv_cache");
    if (!out_latent) return attn__null_arg(ctx, __func__, "out_latent");
    td = meta->mla.num_decode_tokens;
    st = attn__check_latent_call(layer, meta, fn, 0, td, q, q_pe, kv_cache, out_latent, lse);
    if (st != ATTN_OK) return st;
    if ((st = attn__check_graph(layer, meta, fn, stream, ATTN__PART_DECODES)) != ATTN_OK) return st;
    if (meta->cap.dcp_comm) { /* the partial into the metadata, then gathered and combined */
        attn_tensor po, pl;
        attn__dcp_partial(meta, 0, td, layer->desc.kv_lora_rank, &po, &pl);
        st = layer->backend->forward_mqa(layer->backend, layer, meta, q, q_pe, kv_cache, &po, &pl, stream);
        if (st == ATTN_OK) attn__lse_to_base_e(layer, &pl, td);
        return st == ATTN_OK ? attn__dcp_exchange(meta, fn, td, layer->desc.kv_lora_rank, out_latent, lse, stream) : st;
    }
    st = layer->backend->forward_mqa(layer->backend, layer, meta, q, q_pe, kv_cache, out_latent, lse, stream);
    if (st == ATTN_OK) attn__lse_to_base_e(layer, lse, td);
    return st;
}

ATTN_API attn_status attn_mla_forward_sparse(attn_layer *layer, const attn_metadata *meta,
                                             const attn_tensor *q, const attn_tensor *q_pe,
                                             const attn_tensor *kv_cache, const attn_tensor *indices,
                                             attn_tensor *out_latent, attn_tensor *lse, void *stream) {
    attn_context *ctx = layer ? layer->ctx : NULL;
    const char *fn = "attn_mla_forward_sparse";
    attn_device_kind dev;
    int64_t shape[2];
    attn_status st;
    int nt;
    if (!layer) return attn__null_arg(ctx, __func__, "layer");
    if (!meta) return attn__null_arg(ctx, __func__, "meta");
    if (!q) return attn__null_arg(ctx, __func__, "q");
    if (!kv_cache) return attn__null_arg(ctx, __func__, "kv_cache");
    if (!indices) return attn__null_arg(ctx, __func__, "indices");
    if (!out_latent) return attn__null_arg(ctx, __func__, "out_latent");
    nt = meta->batch.num_actual_tokens;
    if (meta->cap.dcp_world_size > 1)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the metadata is DCP rank %d of %d (allowed: a metadata without DCP; the sparse "
                          "call's indices are global positions, not built for a sharded cache)", fn,
                          meta->cap.dcp_rank, meta->cap.dcp_world_size);
    st = attn__check_latent_call(layer, meta, fn, 1, nt, q, q_pe, kv_cache, out_latent, lse);
    if (st != ATTN_OK) return st;
    dev = layer->backend->device;
    shape[0] = ATTN__AT_LEAST(nt);
    shape[1] = indices->ndim == 2 ? indices->shape[1] : 1;
    if (shape[1] < 1 || shape[1] > ATTN__SPARSE_TOPK_MAX)
        return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                          "%s: indices.shape[1] (topk) is %lld (allowed: 1..%d)", fn, (long long)shape[1],
                          ATTN__SPARSE_TOPK_MAX);
    st = attn__check_tensor(ctx, fn, "indices", indices, ATTN_DTYPE_INT32, 2, shape, dev);
    if (st == ATTN_OK && dev == ATTN_DEVICE_CPU) st = attn__sparse_indices_check(meta, indices, fn);
    if (st == ATTN_OK) st = attn__sinks_check(ctx, &layer->desc, fn);
    if (st != ATTN_OK) return st;
    if ((st = attn__check_graph(layer, meta, fn, stream, ATTN__PART_DECODES)) != ATTN_OK) return st;
    st = layer->backend->forward_sparse(layer->backend, layer, meta, q, q_pe, kv_cache, indices, out_latent, lse,
                                        stream);
    if (st == ATTN_OK) attn__lse_to_base_e(layer, lse, nt);
    return st;
}

/* Shapes shared by forward_mha and the fused call: W_UK, W_UV, cache. */
static attn_status attn__check_mla_weights(attn_layer *layer, const attn_metadata *meta, const char *fn,
                                           const attn_tensor *kv_cache, const attn_tensor *w_uk,
                                           const attn_tensor *w_uv) {
    const attn_layer_desc *d = &layer->desc;
    attn_device_kind dev = layer->backend->device;
    int64_t shape[3];
    attn_status st;
    shape[0] = d->num_heads; shape[1] = d->qk_nope_head_dim; shape[2] = d->kv_lora_rank;
    st = attn__check_tensor(layer->ctx, fn, "w_uk", w_uk, d->dtype, 3, shape, dev);
    shape[1] = d->kv_lora_rank; shape[2] = d->v_head_dim;
    if (st == ATTN_OK) st = attn__check_tensor(layer->ctx, fn, "w_uv", w_uv, d->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_kv_cache(layer, fn, kv_cache, 0);
    if (st == ATTN_OK && kv_cache->shape[0] < meta->cap.num_blocks)
        st = attn__fail(layer->ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                        "%s: kv_cache.shape[0] is %lld (allowed: >= num_blocks %lld of the metadata)",
                        fn, (long long)kv_cache->shape[0], (long long)meta->cap.num_blocks);
    return st;
}

ATTN_API attn_status attn_mla_forward_mha(attn_layer *layer, const attn_metadata *meta,
                                          const attn_tensor *q, const attn_tensor *kv_cache,
                                          const attn_tensor *w_uk, const attn_tensor *w_uv,
                                          attn_tensor *out, attn_tensor *lse, void *stream) {
    attn_context *ctx = layer ? layer->ctx : NULL;
    const char *fn = "attn_mla_forward_mha";
    const attn_layer_desc *d;
    attn_device_kind dev;
    int64_t shape[3];
    attn_status st;
    if (!layer) return attn__null_arg(ctx, __func__, "layer");
    if (!meta) return attn__null_arg(ctx, __func__, "meta");
    if (!q) return attn__null_arg(ctx, __func__, "q");
    if (!kv_cache) return attn__null_arg(ctx, __func__, "kv_cache");
    if (!w_uk) return attn__null_arg(ctx, __func__, "w_uk");
    if (!w_uv) return attn__null_arg(ctx, __func__, "w_uv");
    if (!out) return attn__null_arg(ctx, __func__, "out");
    st = attn__check_mla_call(layer, meta, fn, 0);
    if (st != ATTN_OK) return st;
    d = &layer->desc;
    dev = layer->backend->device;
    shape[0] = ATTN__AT_LEAST(meta->mla.num_prefill_tokens); shape[1] = d->num_heads;
    shape[2] = d->qk_nope_head_dim + d->qk_rope_head_dim;
    st = attn__check_tensor(ctx, fn, "q", q, d->dtype, 3, shape, dev);
    shape[2] = d->v_head_dim;
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "out", out, d->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_output_tensor(ctx, fn, "out", out);
    if (st == ATTN_OK && lse) st = attn__check_tensor(ctx, fn, "lse", lse, ATTN_DTYPE_F32, 2, shape, dev);
    if (st == ATTN_OK && lse) st = attn__check_output_tensor(ctx, fn, "lse", lse);
    if (st == ATTN_OK) st = attn__check_mla_weights(layer, meta, fn, kv_cache, w_uk, w_uv);
    if (st != ATTN_OK) return st;
    if ((st = attn__check_graph(layer, meta, fn, stream, ATTN__PART_PREFILLS)) != ATTN_OK) return st;
    if (meta->cap.dcp_comm) { /* the partial into the metadata, then gathered and combined */
        const int tp = meta->mla.num_prefill_tokens;
        attn_tensor po, pl;
        attn__dcp_partial(meta, 0, tp, d->v_head_dim, &po, &pl);
        st = layer->backend->forward_mha(layer->backend, layer, meta, q, kv_cache, w_uk, w_uv, &po, &pl, stream);
        if (st == ATTN_OK) attn__lse_to_base_e(layer, &pl, tp);
        return st == ATTN_OK ? attn__dcp_exchange(meta, fn, tp, d->v_head_dim, out, lse, stream) : st;
    }
    st = layer->backend->forward_mha(layer->backend, layer, meta, q, kv_cache, w_uk, w_uv, out, lse, stream);
    if (st == ATTN_OK && lse) { /* lse rows are the prefill tokens, in order */
        attn_tensor l = attn__tensor_resolved(lse);
        attn__lse_to_base_e(layer, &l, meta->mla.num_prefill_tokens);
    }
    return st;
}

ATTN_API attn_status attn_mla_forward(attn_layer *layer, const attn_metadata *meta,
                                      const attn_tensor *q_nope, const attn_tensor *q_pe,
                                      const attn_tensor *kv_c, const attn_tensor *k_pe,
                                      attn_tensor *kv_cache, const attn_tensor *w_uk,
                                      const attn_tensor *w_uv, attn_tensor *out, void *stream) {
    attn_context *ctx = layer ? layer->ctx : NULL;
    const char *fn = "attn_mla_forward";
    const attn_layer_desc *d;
    const attn_batch *b;
    attn_device_kind dev;
    int64_t shape[3];
    attn_status st;
    if (!layer) return attn__null_arg(ctx, __func__, "layer");
    if (!meta) return attn__null_arg(ctx, __func__, "meta");
    if (!q_nope) return attn__null_arg(ctx, __func__, "q_nope");
    if (!q_pe) return attn__null_arg(ctx, __func__, "q_pe");
    if (!kv_cache) return attn__null_arg(ctx, __func__, "kv_cache");
    if (!w_uk) return attn__null_arg(ctx, __func__, "w_uk");
    if (!w_uv) return attn__null_arg(ctx, __func__, "w_uv");
    if (!out) return attn__null_arg(ctx, __func__, "out");
    st = attn__check_mla_call(layer, meta, fn, 0);
    if (st != ATTN_OK) return st;
    if (meta->cap.dcp_world_size > 1)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: the metadata is DCP rank %d of %d (allowed: attn_mla_forward_mqa and "
                          "attn_mla_forward_mha under DCP, whose LSE joins the ranks)", fn, meta->cap.dcp_rank,
                          meta->cap.dcp_world_size);
    d = &layer->desc;
    b = attn_metadata_batch(meta);
    dev = layer->backend->device;
    if ((kv_c == NULL) != (k_pe == NULL))
        return attn__fail(ctx, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_ARG_NULL,
                          "%s: argument '%s' is NULL but '%s' is not (allowed: both or neither)",
                          fn, kv_c ? "k_pe" : "kv_c", kv_c ? "kv_c" : "k_pe");
    shape[0] = ATTN__AT_LEAST(b->num_actual_tokens); shape[1] = d->num_heads;
    shape[2] = d->qk_nope_head_dim;
    st = attn__check_tensor(ctx, fn, "q_nope", q_nope, d->dtype, 3, shape, dev);
    shape[2] = d->qk_rope_head_dim;
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "q_pe", q_pe, d->dtype, 3, shape, dev);
    shape[2] = d->v_head_dim;
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "out", out, d->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_output_tensor(ctx, fn, "out", out);
    if (st == ATTN_OK) st = attn__check_mla_weights(layer, meta, fn, kv_cache, w_uk, w_uv);
    if (st != ATTN_OK) return st;
    if (kv_c) { /* every check of the cache write before the backend writes anything */
        if (!b->slot_mapping)
            return attn__fail(ctx, ATTN_ERROR_INVALID_METADATA, ATTN_LOG_INVALID_METADATA,
                              "%s: kv_c/k_pe given but the batch has no slot_mapping", fn);
        st = attn__check_latent_write(layer, fn, kv_c, k_pe, kv_cache, b->slot_mapping,
                                      b->num_actual_tokens);
        if (st != ATTN_OK) return st;
    }
    if ((st = attn__check_graph(layer, meta, fn, stream, ATTN__PART_ALL)) != ATTN_OK) return st;
    return layer->backend->mla_forward(layer->backend, layer, meta, q_nope, q_pe, kv_c, k_pe,
                                       kv_cache, w_uk, w_uv, out, stream);
}

/* =======================================================================================
   >>merge
   The public LSE merge: validated here, run by the first backend of the platform's
   priority list that serves the tensors' device.
   ======================================================================================= */

/* The first backend of the platform's priority list that serves `device` and merges. */
static const attn_backend *attn__merge_backend(const attn_context *ctx, attn_device_kind device) {
    attn_backend_id list[ATTN_BACKEND_COUNT];
    const int count = attn__priority_list(ctx->platform.kind, list);
    int i;
    for (i = 0; i < count; i++) {
        const attn_backend *b = attn_backend_get(list[i]);
        if (b && b->device == device && b->merge_attn_states) return b;
    }
    return NULL;
}

ATTN_API attn_status attn_merge_attn_states(attn_context *ctx, const attn_tensor *out_a,
                                            const attn_tensor *lse_a, attn_lse_base base_a,
                                            const attn_tensor *out_b, const attn_tensor *lse_b,
                                            attn_lse_base base_b, attn_tensor *out,
                                            attn_tensor *lse, attn_lse_base base_out,
                                            void *stream) {
    const char *fn = "attn_merge_attn_states";
    const attn_backend *be;
    int64_t shape[3];
    attn_device_kind dev;
    attn_status st;
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (!out_a) return attn__null_arg(ctx, __func__, "out_a");
    if (!lse_a) return attn__null_arg(ctx, __func__, "lse_a");
    if (!out_b) return attn__null_arg(ctx, __func__, "out_b");
    if (!lse_b) return attn__null_arg(ctx, __func__, "lse_b");
    if (!out) return attn__null_arg(ctx, __func__, "out");
    if ((int)base_a < 0 || (int)base_a > 1 || (int)base_b < 0 || (int)base_b > 1 ||
        (int)base_out < 0 || (int)base_out > 1)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: an LSE base is out of range (%d, %d, %d; allowed: ATTN_LSE_BASE_E, "
                          "ATTN_LSE_BASE_2)", fn, (int)base_a, (int)base_b, (int)base_out);
    if (out_a->ndim != 3 || out_a->shape[0] < 0 || out_a->shape[1] <= 0 || out_a->shape[2] <= 0 ||
        (out_a->dtype != ATTN_DTYPE_F32 && out_a->dtype != ATTN_DTYPE_F16 && out_a->dtype != ATTN_DTYPE_BF16))
        return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                          "%s: out_a must be [tokens, heads, head_size] of f32/f16/bf16 (ndim %d)",
                          fn, out_a->ndim);
    dev = out_a->device.kind;
    be = attn__merge_backend(ctx, dev);
    if (!be)
        return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                          "%s: out_a.device is %s and no registered backend merges there "
                          "(allowed: a device a backend of this platform serves)", fn,
                          attn__device_name(dev));
    shape[0] = out_a->shape[0]; shape[1] = out_a->shape[1]; shape[2] = out_a->shape[2];
    st = attn__check_tensor(ctx, fn, "out_a", out_a, out_a->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "out_b", out_b, out_a->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "out", out, out_a->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_output_tensor(ctx, fn, "out", out);
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "lse_a", lse_a, ATTN_DTYPE_F32, 2, shape, dev);
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "lse_b", lse_b, ATTN_DTYPE_F32, 2, shape, dev);
    if (st == ATTN_OK && lse) st = attn__check_tensor(ctx, fn, "lse", lse, ATTN_DTYPE_F32, 2, shape, dev);
    if (st == ATTN_OK && lse) st = attn__check_output_tensor(ctx, fn, "lse", lse);
    if (st != ATTN_OK) return st;
    return be->merge_attn_states(be, ctx, out_a, lse_a, base_a, out_b, lse_b, base_b, out, lse,
                                 base_out, stream);
}

ATTN_API attn_status attn_dcp_combine(attn_context *ctx, int n, const attn_tensor *const *outs,
                                      const attn_tensor *const *lses, attn_tensor *out,
                                      attn_tensor *lse, void *stream) {
    const char *fn = "attn_dcp_combine";
    int64_t shape[3], t, h, T, H;
    attn_device_kind dev;
    attn_status st = ATTN_OK;
    int i, x, D;
    char name[32];
    if (!ctx) return attn__null_arg(ctx, __func__, "ctx");
    if (n < 1 || n > 64)
        return attn__fail(ctx, ATTN_ERROR_INVALID_VALUE, ATTN_LOG_INVALID_ARGUMENT,
                          "%s: n is %d (allowed: 1..64, the ranks' partials)", fn, n);
    if (!outs) return attn__null_arg(ctx, __func__, "outs");
    if (!lses) return attn__null_arg(ctx, __func__, "lses");
    if (!out) return attn__null_arg(ctx, __func__, "out");
    for (i = 0; i < n; i++)
        if (!outs[i] || !lses[i])
            return attn__fail(ctx, ATTN_ERROR_NULL_ARGUMENT, ATTN_LOG_INVALID_ARGUMENT,
                              "%s: %s[%d] is NULL (allowed: n = %d tensors in outs and in lses)", fn,
                              outs[i] ? "lses" : "outs", i, n);
    if (outs[0]->ndim != 3 || outs[0]->shape[0] < 0 || outs[0]->shape[1] <= 0 || outs[0]->shape[2] <= 0 ||
        (outs[0]->dtype != ATTN_DTYPE_F32 && outs[0]->dtype != ATTN_DTYPE_F16 && outs[0]->dtype != ATTN_DTYPE_BF16))
        return attn__fail(ctx, ATTN_ERROR_SHAPE_MISMATCH, ATTN_LOG_TENSOR_SHAPE,
                          "%s: outs[0] must be [tokens, heads, head_size] of f32/f16/bf16 (ndim %d)", fn,
                          outs[0]->ndim);
    dev = outs[0]->device.kind;
    shape[0] = outs[0]->shape[0]; shape[1] = outs[0]->shape[1]; shape[2] = outs[0]->shape[2];
    for (i = 0; i < n && st == ATTN_OK; i++) {
        snprintf(name, sizeof name, "outs[%d]", i);
        st = attn__check_tensor(ctx, fn, name, outs[i], outs[0]->dtype, 3, shape, dev);
        snprintf(name, sizeof name, "lses[%d]", i);
        if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, name, lses[i], ATTN_DTYPE_F32, 2, shape, dev);
    }
    if (st == ATTN_OK) st = attn__check_tensor(ctx, fn, "out", out, outs[0]->dtype, 3, shape, dev);
    if (st == ATTN_OK) st = attn__check_output_tensor(ctx, fn, "out", out);
    if (st == ATTN_OK && lse) st = attn__check_tensor(ctx, fn, "lse", lse, ATTN_DTYPE_F32, 2, shape, dev);
    if (st == ATTN_OK && lse) st = attn__check_output_tensor(ctx, fn, "lse", lse);
    if (st != ATTN_OK) return st;
    if (dev != ATTN_DEVICE_CPU) { /* a fold of pairwise merges on the device's merge */
        if (n < 2 || !lse)
            return attn__fail(ctx, ATTN_ERROR_UNSUPPORTED, ATTN_LOG_CALL_UNSUPPORTED,
                              "%s: %s on %s tensors (allowed there: n >= 2 and an lse tensor, the running LSE "
                              "of the merges; a world of one rank has its result already)", fn,
                              n < 2 ? "n is 1" : "lse is NULL", attn__device_name(dev));
        st = attn_merge_attn_states(ctx, outs[0], lses[0], ATTN_LSE_BASE_E, outs[1], lses[1], ATTN_LSE_BASE_E, out,
                                    lse, ATTN_LSE_BASE_E, stream);
        for (i = 2; i < n && st == ATTN_OK; i++)
            st = attn_merge_attn_states(ctx, out, lse, ATTN_LSE_BASE_E, outs[i], lses[i], ATTN_LSE_BASE_E, out, lse,
                                        ATTN_LSE_BASE_E, stream);
        return st;
    }
    T = shape[0]; H = shape[1]; D = (int)shape[2];
    {
        attn_tensor o[64], l[64], oo = attn__tensor_resolved(out), lo;
        const size_t esz = attn_dtype_size(outs[0]->dtype);
        float w[64];
        for (i = 0; i < n; i++) { o[i] = attn__tensor_resolved(outs[i]); l[i] = attn__tensor_resolved(lses[i]); }
        lo = lse ? attn__tensor_resolved(lse) : l[0];
        for (t = 0; t < T; t++)
            for (h = 0; h < H; h++) {
                float mx = -INFINITY, sum = 0.0f, inv;
                char *po = (char *)oo.data + (size_t)(t * oo.strides[0] + h * oo.strides[1]) * esz;
                for (i = 0; i < n; i++) { /* +inf and NaN count as empty, as attn_merge_attn_states does */
                    float v = ((const float *)l[i].data)[t * l[i].strides[0] + h * l[i].strides[1]];
                    w[i] = v < INFINITY ? v : -INFINITY;
                    if (w[i] > mx) mx = w[i];
                }
                for (i = 0; i < n; i++) {
                    w[i] = mx > -INFINITY && w[i] > -INFINITY ? expf(w[i] - mx) : 0.0f;
                    sum += w[i];
                }
                inv = sum > 0.0f ? 1.0f / sum : 0.0f;
                for (x = 0; x < D; x++) { /* every input's element before the store: out may alias outs[0] */
                    float acc = 0.0f;
                    for (i = 0; i < n; i++)
                        if (w[i] > 0.0f)
                            acc += w[i] * attn__load_elem((const char *)o[i].data + (size_t)(t * o[i].strides[0] +
                                                                                               h * o[i].strides[1]) * esz,
                                                          o[i].dtype, x);
                    attn__store_elem(po, oo.dtype, x, acc * inv);
                }
                if (lse)
                    ((float *)lo.data)[t * lo.strides[0] + h * lo.strides[1]] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
            }
    }
    return ATTN_OK;
}

/* >>kernels-begin (generated by tools/embed from kernels/; do not edit) */
#ifndef ATTN_NO_CUDA /* the kernels exist only with the CUDA path */
static const char *const attn__kernel_src_attn_common_cuh[] = {
    "/* attn_common.cuh - helpers shared by every kernel of attn.h.\n",
    "\n",
    "   Compiled by NVRTC with no include path: nothing here includes a CUDA header. Element\n",
    "   types are plain 16-bit storage converted with PTX `cvt` (round to nearest even; NaN stays\n",
    "   NaN), tensor cores are reached through inline PTX (mma.sync, ldmatrix), global -> shared\n",
    "   copies through cp.async. Needs sm_80 or newer (bf16 cvt, cp.async, bf16 mma).\n",
    "\n",
    "   Element types are numbered as the kernels' defines use them:\n",
    "       0 = f32, 1 = f16, 2 = bf16     (DT, DT_Q, DT_KV, DT_IN, DT_CACHE, ...)\n",
    "       4 = fp8 e4m3, 5 = fp8 e5m2, 6 = int8   (KV caches only: DT_KV, DT_CACHE; attn.h's\n",
    "                                               attn_dtype numbers)\n",
    "   attn_elem<ET> gives the storage type, its size and the conversions of 0-2; the 8-bit\n",
    "   codes have their own section (attn_f32_to_code, attn_codes4_to_f16x2). */\n",
    "#ifndef ATTN_COMMON_CUH\n",
    "#define ATTN_COMMON_CUH\n",
    "\n",
    "#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 800\n",
    "#error \"attn.h kernels need sm_80 or newer (cp.async, bf16 cvt and mma)\"\n",
    "#endif\n",
    "\n",
    "typedef signed char attn_i8;\n",
    "typedef unsigned char attn_u8;\n",
    "typedef unsigned short attn_u16;\n",
    "typedef int attn_i32;\n",
    "typedef unsigned int attn_u32;\n",
    "typedef long long attn_i64;\n",
    "typedef unsigned long long attn_u64;\n",
    "\n",
    "#define ATTN_DT_F32 0\n",
    "#define ATTN_DT_F16 1\n",
    "#define ATTN_DT_BF16 2\n",
    "#define ATTN_DT_E4M3 4\n",
    "#define ATTN_DT_E5M2 5\n",
    "#define ATTN_DT_I8 6\n",
    "#define ATTN_DT_IS_8BIT(t) ((t) >= ATTN_DT_E4M3 && (t) <= ATTN_DT_I8)\n",
    "/* DeepSeek-V3.2's latent rows (attn.h's fp8_ds_mla): 656 bytes, 512 e4m3 codes, 4 f32\n",
    "   scales (one per 128 codes), 64 bf16 values; MLA caches only (DT_CACHE, DT_KV) */\n",
    "#define ATTN_DT_DS_MLA 9\n",
    "#define ATTN_DS_MLA_ROW 656\n",
    "#define ATTN_DT_SIZE(t) ((t) == ATTN_DT_F32 ? 4 : ATTN_DT_IS_8BIT(t) ? 1 : 2) /* bytes */\n",
    "\n",
    "#define ATTN_DEV __device__ __forceinline__\n",
    "\n",
    "#define ATTN_LOG2E 1.4426950408889634f\n",
    "#define ATTN_LN2 0.6931471805599453f\n",
    "\n",
    "/* Sixteen bytes moved as one unit (a 16-byte vector load or store). */\n",
    "struct __align__(16) attn_vec16 { attn_u32 x, y, z, w; };\n",
    "\n",
    "/* ---- infinities without <math.h> constants ---- */\n",
    "ATTN_DEV float attn_inf(void) { return __int_as_float(0x7f800000); }\n",
    "ATTN_DEV float attn_neg_inf(void) { return __int_as_float(0xff800000); }\n",
    "\n",
    "/* ---- scalar conversions (PTX cvt: round to nearest even, NaN kept as a NaN) ---- */\n",
    "ATTN_DEV float attn_f16_to_f32(attn_u16 h) {\n",
    "    float f;\n",
    "    asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n",
    "    return f;\n",
    "}\n",
    "ATTN_DEV attn_u16 attn_f32_to_f16(float f) {\n",
    "    attn_u16 h;\n",
    "    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n",
    "    return h;\n",
    "}\n",
    "ATTN_DEV float attn_bf16_to_f32(attn_u16 h) { return __int_as_float((int)((attn_u32)h << 16)); }\n",
    "ATTN_DEV attn_u16 attn_f32_to_bf16(float f) {\n",
    "    attn_u16 h;\n",
    "    asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n",
    "    return h;\n",
    "}\n",
    "\n",
    "/* Two floats -> one 32-bit register of two 16-bit values, `lo` in the low half (the\n",
    "   element with the lower index in memory and in mma fragments). */\n",
    "ATTN_DEV attn_u32 attn_pack_f16x2(float lo, float hi) {\n",
    "    attn_u32 r;\n",
    "    asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo));\n",
    "    return r;\n",
    "}\n",
    "ATTN_DEV attn_u32 attn_pack_bf16x2(float lo, float hi) {\n",
    "    attn_u32 r;\n",
    "    asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo));\n",
    "    return r;\n",
    "}\n",
    "\n",
    "/* ---- element types ---- */\n",
    "template <int ET> struct attn_elem;\n",
    "template <> struct attn_elem<ATTN_DT_F32> {\n",
    "    typedef float storage;\n",
    "    enum { size = 4 };\n",
    "    static ATTN_DEV float to_f32(float x) { return x; }\n",
    "    static ATTN_DEV float from_f32(float x) { return x; }\n",
    "};\n",
    "template <> struct attn_elem<ATTN_DT_F16> {\n",
    "    typedef attn_u16 storage;\n",
    "    enum { size = 2 };\n",
    "    static ATTN_DEV float to_f32(attn_u16 x) { return attn_f16_to_f32(x); }\n",
    "    static ATTN_DEV attn_u16 from_f32(float x) { return attn_f32_to_f16(x); }\n",
    "    static ATTN_DEV attn_u32 pack2(float lo, float hi) { return attn_pack_f16x2(lo, hi); }\n",
    "};\n",
    "template <> struct attn_elem<ATTN_DT_BF16> {\n",
    "    typedef attn_u16 storage;\n",
    "    enum { size = 2 };\n",
    "    static ATTN_DEV float to_f32(attn_u16 x) { return attn_bf16_to_f32(x); }\n",
    "    static ATTN_DEV attn_u16 from_f32(float x) { return attn_f32_to_bf16(x); }\n",
    "    static ATTN_DEV attn_u32 pack2(float lo, float hi) { return attn_pack_bf16x2(lo, hi); }\n",
    "};\n",
    "\n",
    "/* Element i of an array of type ET, as f32; and the store back (rounded to nearest even). */\n",
    "template <int ET> ATTN_DEV float attn_load(const void *p, attn_i64 i) {\n",
    "    return attn_elem<ET>::to_f32(((const typename attn_elem<ET>::storage *)p)[i]);\n",
    "}\n",
    "template <int ET> ATTN_DEV void attn_store(void *p, attn_i64 i, float x) {\n",
    "    ((typename attn_elem<ET>::storage *)p)[i] = attn_elem<ET>::from_f32(x);\n",
    "}\n",
    "\n",
    "/* Eight consecutive elements of type ET from registers holding their raw bytes (16 bytes\n",
    "   of f16/bf16, or 32 bytes of f32 as two vectors) to f32, and back. */\n",
    "template <int ET> ATTN_DEV void attn_unpack8(const attn_vec16 *v, float *f);\n",
    "template <> ATTN_DEV void attn_unpack8<ATTN_DT_F32>(const attn_vec16 *v, float *f) {\n",
    "    f[0] = __int_as_float(v[0].x); f[1] = __int_as_float(v[0].y);\n",
    "    f[2] = __int_as_float(v[0].z); f[3] = __int_as_float(v[0].w);\n",
    "    f[4] = __int_as_float(v[1].x); f[5] = __int_as_float(v[1].y);\n",
    "    f[6] = __int_as_float(v[1].z); f[7] = __int_as_float(v[1].w);\n",
    "}\n",
    "template <int ET> ATTN_DEV void attn_unpack8_16(const attn_vec16 *v, float *f) {\n",
    "    attn_u32 w[4] = {v[0].x, v[0].y, v[0].z, v[0].w};\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < 4; i++) {\n",
    "        f[2 * i] = attn_elem<ET>::to_f32((attn_u16)(w[i] & 0xffffu));\n",
    "        f[2 * i + 1] = attn_elem<ET>::to_f32((attn_u16)(w[i] >> 16));\n",
    "    }\n",
    "}\n",
    "template <> ATTN_DEV void attn_unpack8<ATTN_DT_F16>(const attn_vec16 *v, float *f) { attn_unpack8_16<ATTN_DT_F16>(v, f); }\n",
    "template <> ATTN_DEV void attn_unpack8<ATTN_DT_BF16>(const attn_vec16 *v, float *f) { attn_unpack8_16<ATTN_DT_BF16>(v, f); }\n",
    "\n",
    "template <int ET> ATTN_DEV void attn_pack8(const float *f, attn_vec16 *v);\n",
    "template <> ATTN_DEV void attn_pack8<ATTN_DT_F32>(const float *f, attn_vec16 *v) {\n",
    "    v[0].x = __float_as_int(f[0]); v[0].y = __float_as_int(f[1]);\n",
    "    v[0].z = __float_as_int(f[2]); v[0].w = __float_as_int(f[3]);\n",
    "    v[1].x = __float_as_int(f[4]); v[1].y = __float_as_int(f[5]);\n",
    "    v[1].z = __float_as_int(f[6]); v[1].w = __float_as_int(f[7]);\n",
    "}\n",
    "template <> ATTN_DEV void attn_pack8<ATTN_DT_F16>(const float *f, attn_vec16 *v) {\n",
    "    v[0].x = attn_pack_f16x2(f[0], f[1]); v[0].y = attn_pack_f16x2(f[2], f[3]);\n",
    "    v[0].z = attn_pack_f16x2(f[4], f[5]); v[0].w = attn_pack_f16x2(f[6], f[7]);\n",
    "}\n",
    "template <> ATTN_DEV void attn_pack8<ATTN_DT_BF16>(const float *f, attn_vec16 *v) {\n",
    "    v[0].x = attn_pack_bf16x2(f[0], f[1]); v[0].y = attn_pack_bf16x2(f[2], f[3]);\n",
    "    v[0].z = attn_pack_bf16x2(f[4], f[5]); v[0].w = attn_pack_bf16x2(f[6], f[7]);\n",
    "}\n",
    "\n",
    "/* ---- 8-bit KV-cache codes (fp8 e4m3 / e5m2, int8) ----\n",
    "   Writes: f32 -> code exactly as attn.h's attn_f32_to_fp8_e4m3 / _e5m2 and int8 rounding\n",
    "   (round to nearest even on the f32 bits; fp8 saturates to the largest finite code,\n",
    "   infinities too; NaN -> 0x7f with the sign; int8 clamps to +-127, NaN -> 0), in integer\n",
    "   arithmetic so every architecture writes the CPU's bytes (PTX's cvt .satfinite drops a\n",
    "   NaN's sign). Reads: four codes -> two f16x2 words, exactly (every e4m3, e5m2 and int8\n",
    "   value is an f16): e5m2 is the high byte of an f16; int8 through the 0x6400 magic\n",
    "   number; e4m3 by cvt.rn.f16x2.e4m3x2 on sm_89+, and on sm_80 by placing its bits in an\n",
    "   f16 (the value / 256, attn_code_factor: the caller multiplies 256 back in), NaN codes\n",
    "   made f16 NaNs. */\n",
    "#ifndef ATTN_E4M3_CVT\n",
    "#if __CUDA_ARCH__ >= 890\n",
    "#define ATTN_E4M3_CVT 1\n",
    "#else\n",
    "#define ATTN_E4M3_CVT 0\n",
    "#endif\n",
    "#endif\n",
    "\n",
    "ATTN_DEV attn_u32 attn_f32_to_fp8(float x, int mb, int bias, attn_u32 maxc) {\n",
    "    const attn_u32 u = (attn_u32)__float_as_int(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;\n",
    "    attn_u32 exp = a >> 23, man = a & 0x7fffffu;\n",
    "    if (a > 0x7f800000u) return sign | 0x7fu; /* NaN */\n",
    "    if (a == 0x7f800000u) return sign | maxc; /* infinity: saturate */\n",
    "    if (exp == 0) exp = 1;\n",
    "    else man |= 0x800000u;\n",
    "    const int e8 = (int)exp - 127 + bias;\n",
    "    const attn_u32 shift = (attn_u32)(23 - mb) + (e8 < 1 ? (attn_u32)(1 - e8) : 0u);\n",
    "    if (shift > 31) return sign;\n",
    "    attn_u32 m = man >> shift;\n",
    "    const attn_u32 rest = man & ((1u << shift) - 1u), half = 1u << (shift - 1);\n",
    "    if (rest > half || (rest == half && (m & 1u))) m++;\n",
    "    attn_u32 r = e8 < 1 ? m : ((attn_u32)(e8 - 1) << mb) + m;\n",
    "    return sign | (r > maxc ? maxc : r);\n",
    "}\n",
    "ATTN_DEV attn_u32 attn_f32_to_i8(float x) {\n",
    "    if (!(x == x)) return 0u;\n",
    "    if (x >= 127.0f) return 127u;\n",
    "    if (x <= -127.0f) return (attn_u32)(attn_u8)(-127);\n",
    "    float r = (float)(int)x; /* toward zero, then to nearest even */\n",
    "    const float d = fabsf(x - r);\n",
    "    if (d > 0.5f || (d == 0.5f && ((int)r & 1))) r += x > r ? 1.0f : -1.0f;\n",
    "    return (attn_u32)(attn_u8)(attn_i8)(int)r;\n",
    "}\n",
    "template <int ET> ATTN_DEV attn_u32 attn_f32_to_code(float x) {\n",
    "    return ET == ATTN_DT_E4M3 ? attn_f32_to_fp8(x, 3, 7, 0x7eu)\n",
    "         : ET == ATTN_DT_E5M2 ? attn_f32_to_fp8(x, 2, 15, 0x7bu) : attn_f32_to_i8(x);\n",
    "}\n",
    "/* what the f16 of attn_codes4_to_f16x2 must be multiplied by to give the code's value */\n",
    "template <int ET> ATTN_DEV float attn_code_factor(void) { return ET == ATTN_DT_E4M3 && !ATTN_E4M3_CVT ? 256.0f : 1.0f; }\n",
    "\n",
    "/* A per-tensor scale of an 8-bit cache as the kernels take it: the device float at ptr, or\n",
    "   value where ptr is NULL; 0 when it is not finite and > 0 (the kernels then write nothing:\n",
    "   the host cannot check a device value without a synchronisation). */\n",
    "ATTN_DEV float attn_cache_scale(const float *ptr, float value) {\n",
    "    const float s = ptr ? *ptr : value;\n",
    "    return s > 0.0f && s <= 3.402823466e38f ? s : 0.0f;\n",
    "}\n",
    "\n",
    "ATTN_DEV attn_u32 attn_prmt(attn_u32 a, attn_u32 b, attn_u32 sel) {\n",
    "    attn_u32 r;\n",
    "    asm(\"prmt.b32 %0, %1, %2, %3;\" : \"=r\"(r) : \"r\"(a), \"r\"(b), \"r\"(sel));\n",
    "    return r;\n",
    "}\n",
    "/* codes w (code i in byte i) -> lo = f16x2 of codes 0, 1 (code 0 in the low half), hi = 2, 3 */\n",
    "template <int ET> ATTN_DEV void attn_codes4_to_f16x2(attn_u32 w, attn_u32 &lo, attn_u32 &hi) {\n",
    "    if (ET == ATTN_DT_I8) { /* f16 0x64uu = 1024 + u, u = code + 128; minus 1152 */\n",
    "        const attn_u32 u = w ^ 0x80808080u, k = 0x64806480u;\n",
    "        lo = attn_prmt(u, 0x64646464u, 0x4140u);\n",
    "        hi = attn_prmt(u, 0x64646464u, 0x4342u);\n",
    "        asm(\"sub.rn.f16x2 %0, %0, %1;\" : \"+r\"(lo) : \"r\"(k));\n",
    "        asm(\"sub.rn.f16x2 %0, %0, %1;\" : \"+r\"(hi) : \"r\"(k));\n",
    "    } else if (ET == ATTN_DT_E5M2) {\n",
    "        lo = attn_prmt(w, 0u, 0x1404u);\n",
    "        hi = attn_prmt(w, 0u, 0x3424u);\n",
    "    } else {\n",
    "#if ATTN_E4M3_CVT\n",
    "        asm(\"{\\n\\t.reg .b16 l, h;\\n\\tmov.b32 {l, h}, %2;\\n\\t\"\n",
    "            \"cvt.rn.f16x2.e4m3x2 %0, l;\\n\\tcvt.rn.f16x2.e4m3x2 %1, h;\\n\\t}\"\n",
    "            : \"=r\"(lo), \"=r\"(hi) : \"r\"(w));\n",
    "#else\n",
    "        attn_u32 x[2] = {attn_prmt(w, 0u, 0x1404u), attn_prmt(w, 0u, 0x3424u)}; /* code << 8 per half */\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < 2; i++) {\n",
    "            /* s 0eeee mmm 0000000: the value / 256 */\n",
    "            const attn_u32 h = ((x[i] >> 1) & 0x3f803f80u) | (x[i] & 0x80008000u);\n",
    "            /* magnitude 0x7f is NaN (e4m3fn has no infinity): + 1 carries into bit 15 of its\n",
    "               half only there; that bit, shifted into the f16 exponent, makes 0x7f80: a NaN */\n",
    "            const attn_u32 t = (x[i] & 0x7f007f00u) + 0x01000100u;\n",
    "            (i ? hi : lo) = h | ((t >> 1) & 0x40004000u);\n",
    "        }\n",
    "#endif\n",
    "    }\n",
    "}\n",
    "\n",
    "/* 16-byte global loads and stores (the caller guarantees 16-byte alignment). attn_ldg16\n",
    "   reads through the read-only path: only for data no thread of the kernel writes;\n",
    "   attn_ld16 for inputs that may alias an output. */\n",
    "ATTN_DEV attn_vec16 attn_ldg16(const void *p) {\n",
    "    attn_vec16 v;\n",
    "    asm volatile(\"ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\"\n",
    "                 : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"(p));\n",
    "    return v;\n",
    "}\n",
    "ATTN_DEV attn_vec16 attn_ld16(const void *p) {\n",
    "    attn_vec16 v;\n",
    "    asm volatile(\"ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\"\n",
    "                 : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"(p) : \"memory\");\n",
    "    return v;\n",
    "}\n",
    "ATTN_DEV void attn_stg16(void *p, attn_vec16 v) {\n",
    "    asm volatile(\"st.global.v4.u32 [%0], {%1, %2, %3, %4};\"\n",
    "                 :: \"l\"(p), \"r\"(v.x), \"r\"(v.y), \"r\"(v.z), \"r\"(v.w) : \"memory\");\n",
    "}\n",
    "ATTN_DEV int attn_aligned16(const void *p) { return ((attn_u64)p & 15u) == 0; }\n",
    "\n",
    "/* ---- shared memory, cp.async ---- */\n",
    "ATTN_DEV attn_u32 attn_smem_addr(const void *p) {\n",
    "    attn_u64 a;\n",
    "    asm(\"cvta.to.shared.u64 %0, %1;\" : \"=l\"(a) : \"l\"(p));\n",
    "    return (attn_u32)a;\n",
    "}\n",
    "\n",
    "/* 16 bytes global -> shared, bypassing L1 (.cg). src_bytes 0 reads nothing and writes 16\n",
    "   zero bytes (rows outside the key range: no garbage reaches the softmax). */\n",
    "ATTN_DEV void attn_cp_async16(attn_u32 smem, const void *gmem, int src_bytes) {\n",
    "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\"\n",
    "                 :: \"r\"(smem), \"l\"(gmem), \"r\"(src_bytes) : \"memory\");\n",
    "}\n",
    "/* The same with a predicate instead of a byte count: zero = 1 writes 16 zero bytes and\n",
    "   reads nothing (gmem must still be a valid address; give the tensor's base). */\n",
    "ATTN_DEV void attn_cp_async16_or_zero(attn_u32 smem, const void *gmem, int zero) {\n",
    "    asm volatile(\"{\\n\\t.reg .pred z;\\n\\tsetp.ne.b32 z, %2, 0;\\n\\t\"\n",
    "                 \"cp.async.cg.shared.global [%0], [%1], 16, z;\\n\\t}\"\n",
    "                 :: \"r\"(smem), \"l\"(gmem), \"r\"(zero) : \"memory\");\n",
    "}\n",
    "/* 4 bytes (cp.async.ca: sizes below 16 go through L1), zero-filled as above: the f32\n",
    "   scales of the 8-bit caches with per-token-head scales. */\n",
    "ATTN_DEV void attn_cp_async4_or_zero(attn_u32 smem, const void *gmem, int zero) {\n",
    "    asm volatile(\"{\\n\\t.reg .pred z;\\n\\tsetp.ne.b32 z, %2, 0;\\n\\t\"\n",
    "                 \"cp.async.ca.shared.global [%0], [%1], 4, z;\\n\\t}\"\n",
    "                 :: \"r\"(smem), \"l\"(gmem), \"r\"(zero) : \"memory\");\n",
    "}\n",
    "ATTN_DEV void attn_cp_async_commit(void) { asm volatile(\"cp.async.commit_group;\" ::: \"memory\"); }\n",
    "/* Waits until at most N of this thread's committed groups are still in flight. */\n",
    "template <int N> ATTN_DEV void attn_cp_async_wait(void) {\n",
    "    asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(N) : \"memory\");\n",
    "}\n",
    "\n",
    "/* Dynamic shared memory the launch provided (bytes). */\n",
    "ATTN_DEV attn_u32 attn_dynamic_smem_size(void) {\n",
    "    attn_u32 r;\n",
    "    asm(\"mov.u32 %0, %%dynamic_smem_size;\" : \"=r\"(r));\n",
    "    return r;\n",
    "}\n",
    "\n",
    "/* ---- tensor cores: ldmatrix and mma.sync m16n8k16 (f32 accumulators) ----\n",
    "   Fragment layout (PTX ISA, mma.m16n8k16 with .f16/.bf16): lane = 4 * g + t.\n",
    "     A (16x16, row-major) a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)\n",
    "     B (16x8, k x n)      b0: (k 2t..2t+1, n g)  b1: (k 2t+8.., n g)\n",
    "     C (16x8, f32)        c0,c1: (g, 2t..2t+1)   c2,c3: (g+8, 2t..2t+1)  */\n",
    "ATTN_DEV void attn_ldmatrix_x4(attn_u32 *r, attn_u32 addr) {\n",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\"\n",
    "                 : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(addr));\n",
    "}\n",
    "ATTN_DEV void attn_ldmatrix_x2(attn_u32 *r, attn_u32 addr) {\n",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\"\n",
    "                 : \"=r\"(r[0]), \"=r\"(r[1]) : \"r\"(addr));\n",
    "}\n",
    "ATTN_DEV void attn_ldmatrix_x4_trans(attn_u32 *r, attn_u32 addr) {\n",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\"\n",
    "                 : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(addr));\n",
    "}\n",
    "ATTN_DEV void attn_ldmatrix_x2_trans(attn_u32 *r, attn_u32 addr) {\n",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\"\n",
    "                 : \"=r\"(r[0]), \"=r\"(r[1]) : \"r\"(addr));\n",
    "}\n",
    "\n",
    "/* c += a . b for one 16x8x16 tile; ET picks f16 or bf16 inputs. */\n",
    "template <int ET> ATTN_DEV void attn_mma16816(float *c, const attn_u32 *a, const attn_u32 *b);\n",
    "template <> ATTN_DEV void attn_mma16816<ATTN_DT_F16>(float *c, const attn_u32 *a, const attn_u32 *b) {\n",
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 \"\n",
    "                 \"{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\"\n",
    "                 : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n",
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n",
    "}\n",
    "template <> ATTN_DEV void attn_mma16816<ATTN_DT_BF16>(float *c, const attn_u32 *a, const attn_u32 *b) {\n",
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 \"\n",
    "                 \"{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\"\n",
    "                 : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n",
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n",
    "}\n",
    "\n",
    "/* ---- fast math ---- */\n",
    "/* 2^x, relative error about 2^-22; -inf -> +0, subnormal results flush to zero. */\n",
    "ATTN_DEV float attn_exp2(float x) {\n",
    "    float y;\n",
    "    asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x));\n",
    "    return y;\n",
    "}\n",
    "ATTN_DEV float attn_log2(float x) {\n",
    "    float y;\n",
    "    asm(\"lg2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x));\n",
    "    return y;\n",
    "}\n",
    "/* 1/x for a normal x (the softmax sums are >= 1): rcp.approx refined by one Newton step,\n",
    "   within an ulp or so of 1.0f / x, and no call to the IEEE division's slow path (whose\n",
    "   register saves ptxas reports as spills). */\n",
    "ATTN_DEV float attn_rcp(float x) {\n",
    "    float r;\n",
    "    asm(\"rcp.approx.ftz.f32 %0, %1;\" : \"=f\"(r) : \"f\"(x));\n",
    "    return fmaf(r, fmaf(-x, r, 1.0f), r);\n",
    "}\n",
    "/* tanh from one exp2: absolute error about 3e-7 everywhere (tanh.approx is only good to\n",
    "   about 2^-11, too coarse once the soft cap multiplies it back up). */\n",
    "ATTN_DEV float attn_tanh(float x) {\n",
    "    float e = attn_exp2(-2.0f * ATTN_LOG2E * fabsf(x)); /* in (0, 1] */\n",
    "    float r = __fdividef(1.0f - e, 1.0f + e);\n",
    "    return copysignf(r, x);\n",
    "}\n",
    "\n",
    "/* ---- warp reductions ---- */\n",
    "ATTN_DEV int attn_imin(int a, int b) { return a < b ? a : b; }\n",
    "ATTN_DEV int attn_imax(int a, int b) { return a > b ? a : b; }\n",
    "ATTN_DEV int attn_warp_imin(int v) {\n",
    "#pragma unroll\n",
    "    for (int o = 16; o > 0; o >>= 1) v = attn_imin(v, __shfl_xor_sync(0xffffffffu, v, o));\n",
    "    return v;\n",
    "}\n",
    "ATTN_DEV int attn_warp_imax(int v) {\n",
    "#pragma unroll\n",
    "    for (int o = 16; o > 0; o >>= 1) v = attn_imax(v, __shfl_xor_sync(0xffffffffu, v, o));\n",
    "    return v;\n",
    "}\n",
    "ATTN_DEV float attn_warp_max(float v) {\n",
    "#pragma unroll\n",
    "    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));\n",
    "    return v;\n",
    "}\n",
    "ATTN_DEV float attn_warp_sum(float v) {\n",
    "#pragma unroll\n",
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n",
    "    return v;\n",
    "}\n",
    "/* Over the four lanes of one mma row group (lanes 4g..4g+3). */\n",
    "ATTN_DEV float attn_quad_max(float v) {\n",
    "    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));\n",
    "    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));\n",
    "}\n",
    "ATTN_DEV float attn_quad_sum(float v) {\n",
    "    v += __shfl_xor_sync(0xffffffffu, v, 1);\n",
    "    return v + __shfl_xor_sync(0xffffffffu, v, 2);\n",
    "}\n",
    "\n",
    "/* An internal invariant the host broke (wrong block size or shared memory for this\n",
    "   variant): stop loudly rather than compute garbage. */\n",
    "ATTN_DEV void attn_trap(void) { asm volatile(\"trap;\"); }\n",
    "\n",
    "#endif /* ATTN_COMMON_CUH */\n",
    0};
static const char *const attn__kernel_src_attn_params_cuh[] = {
    "/* attn_params.cuh - every struct that crosses from the host into a kernel, defined once.\n",
    "\n",
    "   The kernels include it (NVRTC is handed it as a named header, like every .cuh), and\n",
    "   tools/embed.py copies it verbatim into attn.h's host part, between the >>params-begin /\n",
    "   >>params-end markers of the >>cuda section; `make test` fails when that copy is stale. So\n",
    "   this file is valid C99 and CUDA C++ at once: fixed-width members (int, float, long long),\n",
    "   8-byte members first or padded to 8 by hand, no member functions. A pointer member is\n",
    "   ATTN__DPTR(T): T * in a kernel, a 64-bit device address (attn__CUdeviceptr) on the host.\n",
    "\n",
    "   Launch configurations: every attention kernel exports an attn__launch_config in\n",
    "   __constant__ memory (attn_paged_config, attn_mla_config, attn_mha_config) that the host\n",
    "   reads after loading the module: block size, dynamic shared memory and the tile shape the\n",
    "   host's schedule must agree with. */\n",
    "#ifndef ATTN_PARAMS_CUH\n",
    "#define ATTN_PARAMS_CUH\n",
    "\n",
    "#ifdef __CUDACC__\n",
    "#define ATTN__DPTR(T) T *\n",
    "#else\n",
    "#define ATTN__DPTR(T) attn__CUdeviceptr\n",
    "#endif\n",
    "\n",
    "/* Slots an _inline cache write carries in its parameters (kernels/cache_write.cu): with the\n",
    "   write's own parameters under the 4 KiB every driver takes. */\n",
    "#define ATTN__INLINE_SLOTS 448\n",
    "\n",
    "/* A kernel's launch configuration, named (the __constant__ each attention kernel exports). */\n",
    "typedef struct attn__launch_config {\n",
    "    int threads;       /* block size */\n",
    "    int shared_bytes;  /* dynamic shared memory a CTA needs */\n",
    "    int kv_tile;       /* keys per pipeline stage */\n",
    "    int rows;          /* paged: query rows of a CTA (tile_tokens x GROUP, padded); MLA decode:\n",
    "                          heads of one token per CTA (its partials' rows); MLA prefill: query\n",
    "                          rows of one head per CTA */\n",
    "    int tile_tokens;   /* paged: query tokens of a work item (the schedule's tile); MLA: 1 */\n",
    "    int kv_stages;     /* pipeline depth */\n",
    "    int warps;         /* paged: warps across the head dimension (WARPS_N); MLA: warps */\n",
    "    int uses_mma;      /* 1: tensor cores (mma.sync / wgmma); 0: the FMA path */\n",
    "    int tma_box_rows;  /* kernels that read the cache through a tensor map (the first kernel\n",
    "                          parameter, attn_tma_map): the key rows of one box; 0: no map */\n",
    "    int persistent;    /* 1: the CTAs loop over the work items, so any grid runs them all (a\n",
    "                          captured launch takes one wave); 0: one CTA per item */\n",
    "} attn__launch_config;\n",
    "\n",
    "/* attn_paged_attention, attn_paged_merge_partials (paged_attention.cu) and\n",
    "   attn_paged_prefill_sm90 (paged_prefill_sm90.cu). Strides in elements. The kernels that\n",
    "   take it define TILE_TOKENS, GROUP and HEAD_DIM (the comments' shapes). */\n",
    "typedef struct attn__paged_params {\n",
    "    ATTN__DPTR(const void) q;               /* DT_Q [tokens, num_heads, HEAD_DIM] */\n",
    "    ATTN__DPTR(const void) kv_cache;        /* DT_KV [num_blocks, 2, BLOCK_SIZE, num_kv_heads, HEAD_DIM] */\n",
    "    ATTN__DPTR(void) out;                   /* DT_Q [tokens, num_heads, HEAD_DIM] */\n",
    "    ATTN__DPTR(float) lse;                  /* f32 [tokens, num_heads], base e; NULL: not written */\n",
    "    ATTN__DPTR(const int) block_table;      /* [num_reqs, block_table_stride] */\n",
    "    ATTN__DPTR(const int) seq_lens;         /* [num_reqs] */\n",
    "    ATTN__DPTR(const int) query_start_loc;  /* [num_reqs + 1] */\n",
    "    ATTN__DPTR(const float) alibi_slopes;   /* [num_heads] (ALIBI) */\n",
    "    ATTN__DPTR(const int) work;             /* [capacity][8], see paged_attention.cu's WORK LIST */\n",
    "    ATTN__DPTR(const int) num_work;         /* one int: entries of `work` this launch runs */\n",
    "    ATTN__DPTR(const int) merge;            /* [capacity][8], see MERGE LIST */\n",
    "    ATTN__DPTR(const int) num_merge;        /* one int */\n",
    "    ATTN__DPTR(float) partial_o;            /* [num_slots][TILE_TOKENS*GROUP][HEAD_DIM] */\n",
    "    ATTN__DPTR(float) partial_ml;           /* [num_slots][TILE_TOKENS*GROUP][2] */\n",
    "    ATTN__DPTR(int) merge_count;            /* [merge capacity] FUSED MERGE arrivals, zero between\n",
    "                                               launches; NULL: merges only by attn_paged_merge_partials */\n",
    "    ATTN__DPTR(const float) k_scale;        /* 8-bit caches with per-tensor scales: one float each\n",
    "                                               on the device, read at every launch; NULL: the value */\n",
    "    ATTN__DPTR(const float) v_scale;\n",
    "    ATTN__DPTR(const float) sinks;          /* [num_heads] attention sinks (natural-log logits),\n",
    "                                               read at every launch; NULL: none */\n",
    "    ATTN__DPTR(const float) prefix_o;       /* cascade (paged_attention.cu, CASCADE): the prefix\n",
    "                                               pass's partials [slots][prefix_rows][HEAD_DIM] */\n",
    "    ATTN__DPTR(const float) prefix_ml;      /* [slots][prefix_rows][2] */\n",
    "    ATTN__DPTR(const int) prefix_splits;    /* one int: the prefix pass's splits (0: no prefix in\n",
    "                                               this launch's batch); NULL: never */\n",
    "    long long q_stride_token, q_stride_head;\n",
    "    long long out_stride_token, out_stride_head;\n",
    "    long long lse_stride_token, lse_stride_head;\n",
    "    long long block_table_stride;\n",
    "    int num_kv_heads;\n",
    "    float scale;                            /* softmax scale */\n",
    "    float softcap;                          /* SOFTCAP: the cap (> 0) */\n",
    "    int window;                             /* WINDOW: sliding window in tokens (0: none) */\n",
    "    float k_scale_value, v_scale_value;     /* where k_scale / v_scale are NULL */\n",
    "    int prefix_tile_tokens, prefix_rows;    /* cascade: the prefix pass's query tokens and rows\n",
    "                                               per partial slot */\n",
    "    int dcp_world_size, dcp_rank;           /* decode context parallelism (attn_metadata_desc): */\n",
    "    int dcp_interleave, dcp_pad;            /*   keys are this rank's local indices; size 1: off */\n",
    "} attn__paged_params;\n",
    "\n",
    "/* attn_reshape_and_cache (cache_write.cu): key/value rows into the standard cache. */\n",
    "typedef struct attn__cache_write_params {\n",
    "    ATTN__DPTR(const void) key;             /* DT_IN [tokens, num_kv_heads, HEAD_DIM] */\n",
    "    ATTN__DPTR(const void) value;           /* DT_IN, same shape */\n",
    "    ATTN__DPTR(void) kv_cache;              /* DT_CACHE [num_blocks, 2, block_size, num_kv_heads, HEAD_DIM] */\n",
    "    ATTN__DPTR(const long long) slot_mapping; /* [tokens]; -1 skips (the _inline kernel: unused) */\n",
    "    ATTN__DPTR(const float) k_scale;        /* 8-bit per-tensor caches: device floats, NULL: *_value */\n",
    "    ATTN__DPTR(const float) v_scale;\n",
    "    long long key_stride_token, key_stride_head;     /* elements */\n",
    "    long long value_stride_token, value_stride_head; /* elements */\n",
    "    long long num_slots;                    /* num_blocks * block_size: slots are -1 .. num_slots - 1 */\n",
    "    int num_tokens;\n",
    "    int num_kv_heads;\n",
    "    int block_size;\n",
    "    float k_scale_value, v_scale_value;\n",
    "    int check_slots;                        /* 1: slots the host has not checked (device memory):\n",
    "                                               every CTA checks them all first, and none writes\n",
    "                                               when one is out of range */\n",
    "} attn__cache_write_params;\n",
    "\n",
    "/* attn_reshape_and_cache_inline: the same with the slots in the parameters. */\n",
    "typedef struct attn__cache_write_inline_params {\n",
    "    attn__cache_write_params p;\n",
    "    long long slots[ATTN__INLINE_SLOTS];    /* [p.num_tokens]; -1 skips */\n",
    "} attn__cache_write_inline_params;\n",
    "\n",
    "/* attn_concat_and_cache_mla (cache_write.cu): kv_c and k_pe rows into the latent cache. */\n",
    "typedef struct attn__latent_write_params {\n",
    "    ATTN__DPTR(const void) kv_c;            /* DT_IN [tokens, KV_LORA_RANK] */\n",
    "    ATTN__DPTR(const void) k_pe;            /* DT_IN [tokens, ROPE_DIM] */\n",
    "    ATTN__DPTR(void) kv_cache;              /* DT_CACHE [num_blocks, block_size, KV_LORA_RANK + ROPE_DIM] */\n",
    "    ATTN__DPTR(const long long) slot_mapping; /* [tokens]; -1 skips (the _inline kernel: unused) */\n",
    "    long long kv_c_stride_token;            /* elements */\n",
    "    long long k_pe_stride_token;            /* elements */\n",
    "    long long num_slots;                    /* num_blocks * block_size */\n",
    "    int num_tokens;\n",
    "    int check_slots;                        /* as attn__cache_write_params */\n",
    "    ATTN__DPTR(const float) k_scale;        /* fp8 latent: the per-tensor scale (device float; NULL: value) */\n",
    "    float k_scale_value;\n",
    "    int pad1;\n",
    "} attn__latent_write_params;\n",
    "\n",
    "typedef struct attn__latent_write_inline_params {\n",
    "    attn__latent_write_params p;\n",
    "    long long slots[ATTN__INLINE_SLOTS];    /* [p.num_tokens]; -1 skips */\n",
    "} attn__latent_write_inline_params;\n",
    "\n",
    "/* attn_mla_gather (cache_write.cu): a chunk of one request's latent rows, contiguous. */\n",
    "typedef struct attn__mla_gather_params {\n",
    "    ATTN__DPTR(const void) kv_cache;\n",
    "    ATTN__DPTR(const int) block_table;\n",
    "    ATTN__DPTR(void) lat;                   /* DT_CACHE rows; an fp8 latent: DT_IN rows, code * scale */\n",
    "    int key0, nkeys, block_size, pad0;\n",
    "    ATTN__DPTR(const float) k_scale;        /* fp8 latent (as attn__latent_write_params) */\n",
    "    float k_scale_value;\n",
    "    int pad1;\n",
    "} attn__mla_gather_params;\n",
    "\n",
    "/* attn_merge_attn_states (merge.cu). */\n",
    "typedef struct attn__merge_params {\n",
    "    ATTN__DPTR(const void) out_a;\n",
    "    ATTN__DPTR(const float) lse_a;\n",
    "    ATTN__DPTR(const void) out_b;\n",
    "    ATTN__DPTR(const float) lse_b;\n",
    "    ATTN__DPTR(void) out;\n",
    "    ATTN__DPTR(float) lse;                  /* NULL: no LSE output */\n",
    "    long long out_a_stride_token, out_a_stride_head; /* elements */\n",
    "    long long out_b_stride_token, out_b_stride_head;\n",
    "    long long out_stride_token, out_stride_head;\n",
    "    long long lse_a_stride_token, lse_a_stride_head;\n",
    "    long long lse_b_stride_token, lse_b_stride_head;\n",
    "    long long lse_stride_token, lse_stride_head;\n",
    "    int num_tokens;\n",
    "    int num_heads;\n",
    "    int base_a, base_b, base_out;           /* 0: base e, 1: base 2 */\n",
    "    int pad0;\n",
    "} attn__merge_params;\n",
    "\n",
    "/* attn_mla_decode, attn_mla_merge (mla_decode.cu, mla_decode_sm90.cu): the work list and\n",
    "   partials are described at the top of mla_decode_sm90.cu. */\n",
    "typedef struct attn__mla_decode_params {\n",
    "    ATTN__DPTR(const void) q;               /* [.., num_heads, >= KV_LORA] q_latent */\n",
    "    ATTN__DPTR(const void) q_pe;            /* [.., num_heads, ROPE] */\n",
    "    ATTN__DPTR(const void) kv_cache;        /* [num_blocks, BLOCK_SIZE, KV_LORA + ROPE] */\n",
    "    ATTN__DPTR(void) out;                   /* [.., num_heads, KV_LORA] */\n",
    "    ATTN__DPTR(float) lse;                  /* [.., num_heads] or NULL */\n",
    "    ATTN__DPTR(const int) block_table;      /* [reqs][block_table_stride] */\n",
    "    ATTN__DPTR(const int) work;\n",
    "    ATTN__DPTR(const int) num_work;\n",
    "    ATTN__DPTR(const int) merge;\n",
    "    ATTN__DPTR(const int) num_merge;\n",
    "    ATTN__DPTR(float) partial_o;            /* [slots][ROWS][KV_LORA] */\n",
    "    ATTN__DPTR(float) partial_lse;          /* [slots][ROWS] (base 2) */\n",
    "    long long q_stride_token, q_stride_head, q_pe_stride_token, q_pe_stride_head;\n",
    "    long long out_stride_token, out_stride_head, lse_stride_token, lse_stride_head;\n",
    "    long long block_table_stride;\n",
    "    int num_heads;\n",
    "    float scale;\n",
    "    ATTN__DPTR(const float) k_scale;        /* fp8 latent (DT_KV 4/5): the per-tensor scale, one\n",
    "                                               device float read at every launch; NULL: the value */\n",
    "    float k_scale_value;\n",
    "    int pad0;\n",
    "    /* sparse MLA (mla_decode.cu, SPARSE 1): query token t attends the positions of its\n",
    "       request that indices[t][0 .. topk) name (-1 or out of [0, seq_len): skipped) */\n",
    "    ATTN__DPTR(const int) indices;          /* [tokens][indices_stride] int32 */\n",
    "    ATTN__DPTR(const int) seq_lens;         /* [reqs] */\n",
    "    ATTN__DPTR(const int) token_req;        /* [tokens]: each batch token's request */\n",
    "    ATTN__DPTR(const float) sinks;          /* [num_heads] natural-log sinks (SPARSE) or NULL */\n",
    "    long long indices_stride;\n",
    "    int topk;\n",
    "    int pad1;\n",
    "} attn__mla_decode_params;\n",
    "\n",
    "/* attn_mla_prefill (mla_prefill.cu, mla_prefill_sm90.cu): one launch per request and chunk\n",
    "   of keys (mla_prefill_sm90.cu's top comment). */\n",
    "typedef struct attn__mla_prefill_params {\n",
    "    ATTN__DPTR(const void) q;               /* [rows][heads][>= DN]: the first DN columns of the query */\n",
    "    ATTN__DPTR(const void) q_pe;            /* [rows][heads][ROPE] */\n",
    "    ATTN__DPTR(const void) k_nope;          /* [keys][heads][DN] */\n",
    "    ATTN__DPTR(const void) k_pe;            /* [keys][ROPE] */\n",
    "    ATTN__DPTR(const void) v;               /* [keys][heads][DV] */\n",
    "    ATTN__DPTR(void) out;                   /* [rows][heads][DV] */\n",
    "    ATTN__DPTR(float) lse;                  /* [rows][heads] (base e) or NULL; required with MERGE */\n",
    "    long long q_stride_token, q_stride_head, q_pe_stride_token, q_pe_stride_head;\n",
    "    long long k_stride_token, k_stride_head, kpe_stride_token, v_stride_token, v_stride_head;\n",
    "    long long out_stride_token, out_stride_head, lse_stride_token, lse_stride_head;\n",
    "    int q_row0, nq, pos0, key_pos0, nkeys, flags; /* flags: 1 causal, 2 merge into out/lse */\n",
    "    float scale;\n",
    "    int pad0;\n",
    "} attn__mla_prefill_params;\n",
    "\n",
    "/* Each size is the sum of its members' (no implicit padding anywhere, so the host's C\n",
    "   compiler and the device's agree on every offset); a member added or moved must keep\n",
    "   that, and the sizes here are updated with it. */\n",
    "#define ATTN__PARAMS_SIZE(T, n) typedef char T##_size_check[sizeof(T) == (n) ? 1 : -1]\n",
    "ATTN__PARAMS_SIZE(attn__launch_config, 40);\n",
    "ATTN__PARAMS_SIZE(attn__paged_params, 21 * 8 + 7 * 8 + 12 * 4);\n",
    "ATTN__PARAMS_SIZE(attn__cache_write_params, 6 * 8 + 5 * 8 + 6 * 4);\n",
    "ATTN__PARAMS_SIZE(attn__cache_write_inline_params, 112 + ATTN__INLINE_SLOTS * 8);\n",
    "ATTN__PARAMS_SIZE(attn__latent_write_params, 4 * 8 + 3 * 8 + 2 * 4 + 8 + 2 * 4);\n",
    "ATTN__PARAMS_SIZE(attn__latent_write_inline_params, 80 + ATTN__INLINE_SLOTS * 8);\n",
    "ATTN__PARAMS_SIZE(attn__mla_gather_params, 3 * 8 + 4 * 4 + 8 + 2 * 4);\n",
    "ATTN__PARAMS_SIZE(attn__merge_params, 6 * 8 + 12 * 8 + 6 * 4);\n",
    "ATTN__PARAMS_SIZE(attn__mla_decode_params, 12 * 8 + 9 * 8 + 2 * 4 + 8 + 2 * 4 + 4 * 8 + 8 + 2 * 4);\n",
    "ATTN__PARAMS_SIZE(attn__mla_prefill_params, 7 * 8 + 13 * 8 + 8 * 4);\n",
    "#undef ATTN__PARAMS_SIZE\n",
    "\n",
    "#endif /* ATTN_PARAMS_CUH */\n",
    0};
static const char *const attn__kernel_src_cache_write_cu[] = {
    "/* cache_write.cu - paged KV-cache writes by slot mapping (the GPU form of attn__write_kv and\n",
    "   the CPU MLA backend's latent write).\n",
    "\n",
    "   Two kernels; a compile defines the constants of the one it builds (either or both):\n",
    "\n",
    "   attn_reshape_and_cache                          defines: HEAD_DIM DT_IN DT_CACHE\n",
    "       key/value [tokens, num_kv_heads, HEAD_DIM] (element strides per token and per head;\n",
    "       the last dimension contiguous) into the standard cache\n",
    "       [num_blocks, 2, block_size, num_kv_heads, HEAD_DIM] (contiguous). Token t goes to\n",
    "       slot = slot_mapping[t] (int64): block slot / block_size, row slot % block_size;\n",
    "       slot -1 skips the token. Values are converted DT_IN -> DT_CACHE (round to nearest\n",
    "       even); with equal types the bytes are copied unchanged (as the CPU's memcpy).\n",
    "       8-bit caches (DT_CACHE 4 fp8 e4m3, 5 fp8 e5m2, 6 int8; the CPU's attn__cpu_write_kv,\n",
    "       byte for byte): per tensor (KV_PTH 0, fp8) code(x / k_scale) and code(x / v_scale),\n",
    "       the scales read from params.k_scale / v_scale (device floats) or the *_value\n",
    "       fields; a scale that is not finite and > 0 writes nothing. Per token and head\n",
    "       (KV_PTH 1, int8 / e4m3): a warp per (token, K or V, head) row computes amax (a NaN\n",
    "       anywhere makes it NaN), scale = amax / 127 (int8) or / 448 (e4m3), stores\n",
    "       code(x / scale) (0 where scale is 0) and the scale in the block half's scale plane\n",
    "       (layout: paged_attention.cu, 8-BIT CACHES); HEAD_DIM <= 512.\n",
    "\n",
    "   attn_concat_and_cache_mla                       defines: KV_LORA_RANK ROPE_DIM DT_IN DT_CACHE\n",
    "       kv_c [tokens, KV_LORA_RANK] and k_pe [tokens, ROPE_DIM] (token strides in elements)\n",
    "       into the latent cache [num_blocks, block_size, KV_LORA_RANK + ROPE_DIM]: row\n",
    "       slot_mapping[t] gets kv_c then k_pe; -1 skips. With it, attn_mla_gather: a chunk of\n",
    "       one request's latent rows back out of the cache, contiguous (the MLA prefill's\n",
    "       up-projection operand; below).\n",
    "\n",
    "   Each has an `_inline` twin (attn_reshape_and_cache_inline, attn_concat_and_cache_mla_\n",
    "   inline) that takes the slots in its launch parameters instead of a device array (up to\n",
    "   ATTN__INLINE_SLOTS a launch, params.slot_mapping unused): the host's slot mapping reaches\n",
    "   the device with the launch itself, with no copy, allocation or synchronisation.\n",
    "\n",
    "   Launch: any grid (x: a grid-stride loop over tokens; one CTA per token up to a few\n",
    "   thousand is a good default), 128 threads (any multiple of 32 works), no shared memory.\n",
    "   Each thread moves 8 elements at a time with 16-byte loads and stores when the source\n",
    "   row and the cache are 16-byte aligned, else element by element. HEAD_DIM, KV_LORA_RANK\n",
    "   and ROPE_DIM must be multiples of 8. DT_*: 0 f32, 1 f16, 2 bf16 (DT_CACHE also 4-6). */\n",
    "#include \"attn_common.cuh\"\n",
    "#include \"attn_params.cuh\" /* the write and gather parameters */\n",
    "\n",
    "#if !defined(DT_IN) || !defined(DT_CACHE)\n",
    "#error \"cache_write.cu: define DT_IN and DT_CACHE (0 f32, 1 f16, 2 bf16; DT_CACHE 4-6: 8-bit)\"\n",
    "#endif\n",
    "#ifndef KV_PTH\n",
    "#define KV_PTH 0\n",
    "#endif\n",
    "#define ATTN_CACHE8 ATTN_DT_IS_8BIT(DT_CACHE)\n",
    "#if ATTN_CACHE8 && defined(KV_LORA_RANK) && DT_CACHE == ATTN_DT_I8\n",
    "#error \"cache_write.cu: a latent cache takes fp8 (per-tensor scale), not int8\"\n",
    "#endif\n",
    "/* DT_CACHE 9 (ATTN_DT_DS_MLA): DeepSeek-V3.2's 656-byte latent rows, KV_LORA_RANK 512 and\n",
    "   ROPE_DIM 64 only: per 128 values of kv_c a scale s = max(max |x| / 448, FLT_MIN) and the\n",
    "   e4m3 codes of x / s (the CPU's attn__ds_mla_row_store, byte for byte), k_pe as bf16 */\n",
    "#define ATTN_DS (DT_CACHE == ATTN_DT_DS_MLA)\n",
    "#if ATTN_DS && (!defined(KV_LORA_RANK) || KV_LORA_RANK != 512 || ROPE_DIM != 64)\n",
    "#error \"cache_write.cu: DT_CACHE 9 (fp8_ds_mla) is a latent cache of 512 + 64 only\"\n",
    "#endif\n",
    "\n",
    "/* Whether every one of n slots is in [-1, num_slots). Slots from device memory (check_slots)\n",
    "   are checked by every CTA, all of them, before it writes: a bad one anywhere makes every\n",
    "   CTA write nothing, as the host-side check of host slots would (the host cannot read\n",
    "   device slots without a synchronisation). */\n",
    "ATTN_DEV int attn_slots_valid(const attn_i64 *slots, int n, attn_i64 num_slots) {\n",
    "    int bad = 0;\n",
    "    for (int t = threadIdx.x; t < n; t += blockDim.x) {\n",
    "        const attn_i64 s = slots[t];\n",
    "        bad |= s < -1 || s >= num_slots;\n",
    "    }\n",
    "    return !__syncthreads_or(bad);\n",
    "}\n",
    "\n",
    "#if ATTN_CACHE8\n",
    "/* 8 elements of DT_IN as f32 (16-byte loads where vec) */\n",
    "ATTN_DEV void attn_load8_in(const void *src, int vec, float *f) {\n",
    "    if (vec) {\n",
    "        attn_vec16 v[2];\n",
    "        v[0] = attn_ldg16(src);\n",
    "        if (attn_elem<DT_IN>::size == 4) v[1] = attn_ldg16((const char *)src + 16);\n",
    "        attn_unpack8<DT_IN>(v, f);\n",
    "    } else {\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < 8; i++) f[i] = attn_load<DT_IN>(src, i);\n",
    "    }\n",
    "}\n",
    "/* the codes of f[i] / div (IEEE division, as the CPU; 0 where zero) as 8 bytes at dst */\n",
    "ATTN_DEV void attn_store8_codes(void *dst, const float *f, float div, int zero) {\n",
    "    attn_u32 w[2] = {0u, 0u};\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < 8; i++) w[i >> 2] |= (zero ? 0u : attn_f32_to_code<DT_CACHE>(f[i] / div)) << (8 * (i & 3));\n",
    "    asm volatile(\"st.global.v2.u32 [%0], {%1, %2};\" :: \"l\"(dst), \"r\"(w[0]), \"r\"(w[1]) : \"memory\");\n",
    "}\n",
    "#endif\n",
    "\n",
    "#if !ATTN_CACHE8 && !ATTN_DS\n",
    "/* Copies (converting) 8 elements from src to dst; vec: both are 16-byte aligned. */\n",
    "ATTN_DEV void attn_move8(const void *src, void *dst, int vec) {\n",
    "    typedef typename attn_elem<DT_IN>::storage in_t;\n",
    "    typedef typename attn_elem<DT_CACHE>::storage cache_t;\n",
    "    if (vec) {\n",
    "        attn_vec16 v[2];\n",
    "        v[0] = attn_ldg16(src);\n",
    "        if (attn_elem<DT_IN>::size == 4) v[1] = attn_ldg16((const char *)src + 16);\n",
    "        if (DT_IN == DT_CACHE) {\n",
    "            attn_stg16(dst, v[0]);\n",
    "            if (attn_elem<DT_CACHE>::size == 4) attn_stg16((char *)dst + 16, v[1]);\n",
    "        } else {\n",
    "            float f[8];\n",
    "            attn_vec16 o[2];\n",
    "            attn_unpack8<DT_IN>(v, f);\n",
    "            attn_pack8<DT_CACHE>(f, o);\n",
    "            attn_stg16(dst, o[0]);\n",
    "            if (attn_elem<DT_CACHE>::size == 4) attn_stg16((char *)dst + 16, o[1]);\n",
    "        }\n",
    "    } else {\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < 8; i++) {\n",
    "            if (DT_IN == DT_CACHE) /* raw bits, as memcpy (NaN payloads kept) */\n",
    "                ((cache_t *)dst)[i] = (cache_t)((const in_t *)src)[i];\n",
    "            else\n",
    "                ((cache_t *)dst)[i] = attn_elem<DT_CACHE>::from_f32(attn_elem<DT_IN>::to_f32(((const in_t *)src)[i]));\n",
    "        }\n",
    "    }\n",
    "}\n",
    "#endif\n",
    "\n",
    "#ifdef HEAD_DIM\n",
    "#if HEAD_DIM % 8 != 0\n",
    "#error \"cache_write.cu: HEAD_DIM must be a multiple of 8\"\n",
    "#endif\n",
    "\n",
    "#if ATTN_CACHE8 && KV_PTH\n",
    "#if HEAD_DIM > 512\n",
    "#error \"cache_write.cu: per-token-head scales take HEAD_DIM <= 512\"\n",
    "#endif\n",
    "/* NaN-sticky max (the CPU's amax loop) */\n",
    "ATTN_DEV float attn_amax2(float a, float b) { return a != a || b != b ? __int_as_float(0x7fc00000) : fmaxf(a, b); }\n",
    "\n",
    "ATTN_DEV void attn_reshape_and_cache_body(const attn__cache_write_params &p, const attn_i64 *slots) {\n",
    "    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5, rows = 2 * p.num_kv_heads;\n",
    "    if (p.check_slots && !attn_slots_valid(slots, p.num_tokens, p.num_slots)) return;\n",
    "    const float qmax = DT_CACHE == ATTN_DT_I8 ? 127.0f : 448.0f;\n",
    "    const attn_i64 half = (attn_i64)p.block_size * p.num_kv_heads * (HEAD_DIM + 4); /* bytes of a block half */\n",
    "    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {\n",
    "        const attn_i64 slot = slots[t];\n",
    "        if (slot < 0) continue;\n",
    "        const attn_i64 blk = slot / p.block_size, off = slot - blk * p.block_size;\n",
    "        for (int row = threadIdx.x >> 5; row < rows; row += warps) {\n",
    "            const int side = row >= p.num_kv_heads, h = row - side * p.num_kv_heads;\n",
    "            const char *src = side ? (const char *)p.value + (t * p.value_stride_token + h * p.value_stride_head) * attn_elem<DT_IN>::size\n",
    "                                   : (const char *)p.key + (t * p.key_stride_token + h * p.key_stride_head) * attn_elem<DT_IN>::size;\n",
    "            char *base = (char *)p.kv_cache + blk * 2 * half + side * half;\n",
    "            const attn_i64 x = off * p.num_kv_heads + h; /* row in the block half */\n",
    "            constexpr int CPL = (HEAD_DIM / 8 + 31) / 32; /* 8-element chunks per lane: 2 past 256 */\n",
    "            float f[CPL][8];\n",
    "            float amax = 0.0f;\n",
    "#pragma unroll\n",
    "            for (int k = 0; k < CPL; k++) {\n",
    "                const int c = lane + 32 * k;\n",
    "                if (c < HEAD_DIM / 8) {\n",
    "                    const char *s = src + (attn_i64)c * 8 * attn_elem<DT_IN>::size;\n",
    "                    attn_load8_in(s, attn_aligned16(s), f[k]);\n",
    "#pragma unroll\n",
    "                    for (int i = 0; i < 8; i++) amax = attn_amax2(amax, fabsf(f[k][i]));\n",
    "                }\n",
    "            }\n",
    "#pragma unroll\n",
    "            for (int o = 16; o > 0; o >>= 1) amax = attn_amax2(amax, __shfl_xor_sync(0xffffffffu, amax, o));\n",
    "            const float scale = amax / qmax; /* NaN or inf rows read back NaN */\n",
    "#pragma unroll\n",
    "            for (int k = 0; k < CPL; k++)\n",
    "                if (lane + 32 * k < HEAD_DIM / 8)\n",
    "                    attn_store8_codes(base + x * HEAD_DIM + (lane + 32 * k) * 8, f[k], scale, !(scale > 0.0f));\n",
    "            if (lane == 0) *(float *)(base + (attn_i64)p.block_size * p.num_kv_heads * HEAD_DIM + x * 4) = scale;\n",
    "        }\n",
    "    }\n",
    "}\n",
    "#else\n",
    "ATTN_DEV void attn_reshape_and_cache_body(const attn__cache_write_params &p, const attn_i64 *slots) {\n",
    "    const int chunks = HEAD_DIM / 8;                 /* 8-element chunks per head row */\n",
    "    if (p.check_slots && !attn_slots_valid(slots, p.num_tokens, p.num_slots)) return;\n",
    "    const int per_side = p.num_kv_heads * chunks;    /* chunks of one token's K (or V) */\n",
    "    const int esz_in = attn_elem<DT_IN>::size, esz_c = ATTN_DT_SIZE(DT_CACHE);\n",
    "#if !ATTN_CACHE8\n",
    "    const int cache_ok = attn_aligned16(p.kv_cache);\n",
    "#else\n",
    "    const float ks = attn_cache_scale(p.k_scale, p.k_scale_value), vs = attn_cache_scale(p.v_scale, p.v_scale_value);\n",
    "    if (ks == 0.0f || vs == 0.0f) return; /* a bad scale: nothing written */\n",
    "#endif\n",
    "    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {\n",
    "        attn_i64 slot = slots[t];\n",
    "        if (slot < 0) continue;\n",
    "        attn_i64 blk = slot / p.block_size, off = slot - blk * p.block_size;\n",
    "        for (int u = threadIdx.x; u < 2 * per_side; u += blockDim.x) {\n",
    "            int side = u >= per_side;                /* 0: key, 1: value */\n",
    "            int rem = u - side * per_side, h = rem / chunks, c = rem - h * chunks;\n",
    "            const char *src = side ? (const char *)p.value + (t * p.value_stride_token + h * p.value_stride_head) * esz_in\n",
    "                                   : (const char *)p.key + (t * p.key_stride_token + h * p.key_stride_head) * esz_in;\n",
    "            src += (attn_i64)c * 8 * esz_in;\n",
    "            attn_i64 dst_el = (((blk * 2 + side) * p.block_size + off) * p.num_kv_heads + h) * (attn_i64)HEAD_DIM + c * 8;\n",
    "            char *dst = (char *)p.kv_cache + dst_el * esz_c;\n",
    "#if ATTN_CACHE8\n",
    "            float f[8];\n",
    "            attn_load8_in(src, attn_aligned16(src), f);\n",
    "            attn_store8_codes(dst, f, side ? vs : ks, 0);\n",
    "#else\n",
    "            attn_move8(src, dst, cache_ok && attn_aligned16(src));\n",
    "#endif\n",
    "        }\n",
    "    }\n",
    "}\n",
    "#endif /* KV_PTH */\n",
    "\n",
    "extern \"C\" __global__ void attn_reshape_and_cache(const __grid_constant__ attn__cache_write_params p) {\n",
    "    attn_reshape_and_cache_body(p, p.slot_mapping);\n",
    "}\n",
    "extern \"C\" __global__ void attn_reshape_and_cache_inline(const __grid_constant__ attn__cache_write_inline_params ip) {\n",
    "    attn_reshape_and_cache_body(ip.p, ip.slots);\n",
    "}\n",
    "#endif /* HEAD_DIM */\n",
    "\n",
    "#ifdef KV_LORA_RANK\n",
    "#if KV_LORA_RANK % 8 != 0 || !defined(ROPE_DIM) || ROPE_DIM % 8 != 0\n",
    "#error \"cache_write.cu: KV_LORA_RANK and ROPE_DIM must be defined, multiples of 8\"\n",
    "#endif\n",
    "\n",
    "#if ATTN_DS\n",
    "/* fp8_ds_mla: warp w < 4 writes tile w of kv_c (each lane 4 values; the tile's max |x| by a\n",
    "   warp reduction), threads 0 .. 63 k_pe. Needs blockDim >= 128 (attn.h launches 128). */\n",
    "ATTN_DEV void attn_concat_and_cache_mla_body(const attn__latent_write_params &p, const attn_i64 *slots) {\n",
    "    if (p.check_slots && !attn_slots_valid(slots, p.num_tokens, p.num_slots)) return;\n",
    "    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;\n",
    "    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {\n",
    "        const attn_i64 slot = slots[t];\n",
    "        if (slot < 0) continue;\n",
    "        char *row = (char *)p.kv_cache + slot * (attn_i64)ATTN_DS_MLA_ROW;\n",
    "        if (warp < 4) {\n",
    "            const char *src = (const char *)p.kv_c + (t * p.kv_c_stride_token + 128 * warp + 4 * lane) * attn_elem<DT_IN>::size;\n",
    "            float f[4], amax = 0.0f;\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < 4; i++) {\n",
    "                f[i] = attn_load<DT_IN>(src, i);\n",
    "                amax = fmaxf(amax, fabsf(f[i]));\n",
    "            }\n",
    "            amax = attn_warp_max(amax);\n",
    "            const float sc = fmaxf(amax / 448.0f, 1.17549435e-38f); /* FLT_MIN */\n",
    "            attn_u32 w = 0u;\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < 4; i++) w |= attn_f32_to_code<ATTN_DT_E4M3>(f[i] / sc) << (8 * i);\n",
    "            *(attn_u32 *)(row + 128 * warp + 4 * lane) = w;\n",
    "            if (lane == 0) *(float *)(row + 512 + 4 * warp) = sc;\n",
    "        }\n",
    "        if (tid < 64) {\n",
    "            const char *src = (const char *)p.k_pe + (t * p.k_pe_stride_token + tid) * attn_elem<DT_IN>::size;\n",
    "            *(attn_u16 *)(row + 528 + 2 * tid) = attn_elem<ATTN_DT_BF16>::from_f32(attn_load<DT_IN>(src, 0));\n",
    "        }\n",
    "    }\n",
    "}\n",
    "#else\n",
    "ATTN_DEV void attn_concat_and_cache_mla_body(const attn__latent_write_params &p, const attn_i64 *slots) {\n",
    "    const int chunks_c = KV_LORA_RANK / 8, chunks = (KV_LORA_RANK + ROPE_DIM) / 8;\n",
    "    if (p.check_slots && !attn_slots_valid(slots, p.num_tokens, p.num_slots)) return;\n",
    "    const int esz_in = attn_elem<DT_IN>::size, esz_c = ATTN_DT_SIZE(DT_CACHE);\n",
    "    const int cache_ok = attn_aligned16(p.kv_cache);\n",
    "#if ATTN_CACHE8 /* code(x / scale), the CPU's bytes */\n",
    "    const float ks = attn_cache_scale(p.k_scale, p.k_scale_value);\n",
    "    if (ks == 0.0f) return;\n",
    "#endif\n",
    "    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {\n",
    "        attn_i64 slot = slots[t];\n",
    "        if (slot < 0) continue;\n",
    "        char *row = (char *)p.kv_cache + slot * (attn_i64)(KV_LORA_RANK + ROPE_DIM) * esz_c;\n",
    "        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {\n",
    "            const char *src = c < chunks_c\n",
    "                                  ? (const char *)p.kv_c + (t * p.kv_c_stride_token + (attn_i64)c * 8) * esz_in\n",
    "                                  : (const char *)p.k_pe + (t * p.k_pe_stride_token + (attn_i64)(c - chunks_c) * 8) * esz_in;\n",
    "#if ATTN_CACHE8\n",
    "            float f[8];\n",
    "            (void)cache_ok;\n",
    "            attn_load8_in(src, attn_aligned16(src), f);\n",
    "            attn_store8_codes(row + (attn_i64)c * 8, f, ks, 0);\n",
    "#else\n",
    "            attn_move8(src, row + (attn_i64)c * 8 * esz_c, cache_ok && attn_aligned16(src));\n",
    "#endif\n",
    "        }\n",
    "    }\n",
    "}\n",
    "#endif /* ATTN_DS */\n",
    "\n",
    "extern \"C\" __global__ void attn_concat_and_cache_mla(const __grid_constant__ attn__latent_write_params p) {\n",
    "    attn_concat_and_cache_mla_body(p, p.slot_mapping);\n",
    "}\n",
    "extern \"C\" __global__ void attn_concat_and_cache_mla_inline(const __grid_constant__ attn__latent_write_inline_params ip) {\n",
    "    attn_concat_and_cache_mla_body(ip.p, ip.slots);\n",
    "}\n",
    "\n",
    "/* The reverse copy for the up-projected prefill: rows key0 .. key0 + nkeys - 1 of one\n",
    "   request (its block_table row) from the latent cache into a contiguous [nkeys][KV_LORA_RANK\n",
    "   + ROPE_DIM] of DT_CACHE (the up-projection GEMMs' operand). Any grid (grid-stride over\n",
    "   16-byte chunks), any block; cache and destination 16-byte aligned. */\n",
    "\n",
    "extern \"C\" __global__ void attn_mla_gather(const attn__mla_gather_params p) {\n",
    "#if ATTN_DS /* fp8_ds_mla serves the sparse call only: no up-projected prefill reads it */\n",
    "    (void)p;\n",
    "    attn_trap();\n",
    "#elif ATTN_CACHE8 /* dequantizing: 8 codes -> 8 DT_IN elements (16 bytes at bf16/f16) per step */\n",
    "    const int D = KV_LORA_RANK + ROPE_DIM, cpr = D / 8;\n",
    "    const float ks = attn_cache_scale(p.k_scale, p.k_scale_value) * attn_code_factor<DT_CACHE>();\n",
    "    if (ks == 0.0f) return;\n",
    "    for (attn_i64 u = blockIdx.x * (attn_i64)blockDim.x + threadIdx.x; u < (attn_i64)p.nkeys * cpr; u += (attn_i64)gridDim.x * blockDim.x) {\n",
    "        const int j = (int)(u / cpr), c = (int)(u - (attn_i64)j * cpr), key = p.key0 + j;\n",
    "        const attn_i64 row = (attn_i64)p.block_table[key / p.block_size] * p.block_size + key % p.block_size;\n",
    "        const attn_u32 *src = (const attn_u32 *)((const char *)p.kv_cache + row * D + c * 8);\n",
    "        attn_u32 h[4];\n",
    "        float f[8];\n",
    "        attn_vec16 o[2];\n",
    "        attn_codes4_to_f16x2<DT_CACHE>(src[0], h[0], h[1]);\n",
    "        attn_codes4_to_f16x2<DT_CACHE>(src[1], h[2], h[3]);\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < 4; i++) {\n",
    "            f[2 * i] = attn_f16_to_f32((attn_u16)(h[i] & 0xffffu)) * ks;\n",
    "            f[2 * i + 1] = attn_f16_to_f32((attn_u16)(h[i] >> 16)) * ks;\n",
    "        }\n",
    "        attn_pack8<DT_IN>(f, o);\n",
    "        char *dst = (char *)p.lat + ((attn_i64)j * D + c * 8) * attn_elem<DT_IN>::size;\n",
    "        attn_stg16(dst, o[0]);\n",
    "        if (attn_elem<DT_IN>::size == 4) attn_stg16(dst + 16, o[1]);\n",
    "    }\n",
    "#else\n",
    "    const int row_bytes = (KV_LORA_RANK + ROPE_DIM) * attn_elem<DT_CACHE>::size, cpr = row_bytes / 16;\n",
    "    for (attn_i64 u = blockIdx.x * (attn_i64)blockDim.x + threadIdx.x; u < (attn_i64)p.nkeys * cpr; u += (attn_i64)gridDim.x * blockDim.x) {\n",
    "        const int j = (int)(u / cpr), c = (int)(u - (attn_i64)j * cpr), key = p.key0 + j;\n",
    "        const attn_i64 row = (attn_i64)p.block_table[key / p.block_size] * p.block_size + key % p.block_size;\n",
    "        attn_stg16((char *)p.lat + (attn_i64)j * row_bytes + c * 16, attn_ldg16((const char *)p.kv_cache + row * row_bytes + c * 16));\n",
    "    }\n",
    "#endif\n",
    "}\n",
    "#endif /* KV_LORA_RANK */\n",
    0};
static const char *const attn__kernel_src_hopper_cuh[] = {
    "/* hopper.cuh - the Hopper toolkit: tile copies by the tensor memory accelerator (TMA)\n",
    "   completing on mbarriers, the full/empty stage pipeline a producer warp and consumer\n",
    "   warpgroups share, the proxy fences, and register reallocation between warpgroups.\n",
    "   sm_90 or newer (setmaxnreg: sm_90a only). Checked by `make hopper-check`\n",
    "   (tests/hopper_probe.cu: compiled for sm_90 and sm_90a with no spill, and on a device of\n",
    "   compute capability 9.0 run against the host).\n",
    "\n",
    "   TMA. A tensor map (attn_tma_map: CUtensorMap, 128 opaque bytes, 64-aligned) is encoded\n",
    "   on the host by the driver's cuTensorMapEncodeTiled (attn.h: attn__tma_encode) and passed\n",
    "   to the kernel by value as a `const __grid_constant__ attn_tma_map` parameter, so the\n",
    "   copy engine reads it from the parameter space. attn_tma_load_Nd copies the box at the\n",
    "   given coordinates (innermost first, in elements) into shared memory at `dst` (its\n",
    "   shared-window address, 128-byte aligned; 1024 for the 128B swizzle so that the pattern\n",
    "   lines up with kernels/wgmma.cuh's descriptors) and adds the box's bytes to the\n",
    "   transaction count of the mbarrier `bar`. Coordinates past the tensor's extent read as\n",
    "   zero (the box is always whole in shared memory, and always counts all its bytes).\n",
    "\n",
    "   MBARRIERS. A 64-bit barrier in shared memory with an arrival count and a transaction\n",
    "   count; its phase completes when both reach zero, and a waiter names the phase by its\n",
    "   parity (0, 1, 0, ...). A full barrier per stage (count 1: the producer's\n",
    "   arrive_expect_tx, then the TMA bytes) tells consumers the stage has landed; an empty\n",
    "   barrier per stage (count: the consumer warps, one arrival each) tells the producer the\n",
    "   stage may be overwritten. Nobody meets at a CTA-wide barrier inside the main loop.\n",
    "\n",
    "     producer, tile t:  s = t % S, n = t / S\n",
    "                        wait empty[s] parity (n + 1) & 1 (the first round passes at once)\n",
    "                        arrive_expect_tx full[s] bytes; TMA loads ... -> full[s]\n",
    "     consumer, tile t:  wait full[s] parity n & 1; use stage s; one lane per warp arrives\n",
    "                        on empty[s]\n",
    "\n",
    "   attn_pipe_state walks (stage, phase) for either side. Initialise the barriers from one\n",
    "   thread (attn_mbar_init), then attn_mbar_init_fence and a __syncthreads before any\n",
    "   thread waits or any copy names them. */\n",
    "#ifndef ATTN_HOPPER_CUH\n",
    "#define ATTN_HOPPER_CUH\n",
    "\n",
    "#include \"attn_common.cuh\"\n",
    "\n",
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900\n",
    "#error \"hopper.cuh: TMA and the mbarrier transaction counts need sm_90 or newer\"\n",
    "#endif\n",
    "\n",
    "/* CUtensorMap, as the driver lays it out (cuda.h: CU_TENSOR_MAP_NUM_QWORDS 16). */\n",
    "struct __align__(64) attn_tma_map {\n",
    "    attn_u64 opaque[16];\n",
    "};\n",
    "\n",
    "/* ---- mbarriers (shared-window addresses, 8-byte aligned) ---- */\n",
    "\n",
    "ATTN_DEV void attn_mbar_init(attn_u32 bar, unsigned count) {\n",
    "    asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" ::\"r\"(bar), \"r\"(count) : \"memory\");\n",
    "}\n",
    "/* after the inits, before the __syncthreads that publishes them: visible to the copy\n",
    "   engine (the async proxy) as well as to the other threads */\n",
    "ATTN_DEV void attn_mbar_init_fence(void) { asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\"); }\n",
    "\n",
    "/* one arrival, and `bytes` more expected from copies (the producer, once per stage fill) */\n",
    "ATTN_DEV void attn_mbar_arrive_expect_tx(attn_u32 bar, unsigned bytes) {\n",
    "    asm volatile(\"mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\" ::\"r\"(bar), \"r\"(bytes) : \"memory\");\n",
    "}\n",
    "/* one arrival (a consumer warp's lane, done with a stage) */\n",
    "ATTN_DEV void attn_mbar_arrive(attn_u32 bar) {\n",
    "    asm volatile(\"mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\" ::\"r\"(bar) : \"memory\");\n",
    "}\n",
    "/* one arrival on `bar` made when every cp.async this thread issued before it has landed\n",
    "   (.noinc: the barrier's expected count includes this arrival). The bytes land through the\n",
    "   generic proxy: a reader through the async proxy (wgmma) issues attn_fence_proxy_async\n",
    "   after its wait. */\n",
    "ATTN_DEV void attn_cp_async_mbar_arrive(attn_u32 bar) {\n",
    "    asm volatile(\"cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\" ::\"r\"(bar) : \"memory\");\n",
    "}\n",
    "/* whether the phase of parity `parity` has completed (try_wait: the hardware may suspend\n",
    "   the thread for a while before answering no) */\n",
    "ATTN_DEV int attn_mbar_try_wait(attn_u32 bar, unsigned parity) {\n",
    "    attn_u32 done;\n",
    "    asm volatile(\n",
    "        \"{\\n\"\n",
    "        \"  .reg .pred p;\\n\"\n",
    "        \"  mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\\n\"\n",
    "        \"  selp.u32 %0, 1, 0, p;\\n\"\n",
    "        \"}\\n\"\n",
    "        : \"=r\"(done)\n",
    "        : \"r\"(bar), \"r\"(parity)\n",
    "        : \"memory\");\n",
    "    return (int)done;\n",
    "}\n",
    "ATTN_DEV void attn_mbar_wait(attn_u32 bar, unsigned parity) {\n",
    "    while (!attn_mbar_try_wait(bar, parity)) {\n",
    "    }\n",
    "}\n",
    "\n",
    "/* (stage, phase) of a pipeline of S stages, advanced once per tile by each side */\n",
    "template <int S> struct attn_pipe_state {\n",
    "    int stage;\n",
    "    unsigned phase; /* parity of the round: flips each time stage wraps to 0 */\n",
    "    ATTN_DEV void advance() {\n",
    "        if (++stage == S) {\n",
    "            stage = 0;\n",
    "            phase ^= 1u;\n",
    "        }\n",
    "    }\n",
    "};\n",
    "\n",
    "/* ---- TMA tile loads (global -> shared, completing on an mbarrier) ---- */\n",
    "\n",
    "/* a bulk prefetch of `bytes` (a multiple of 16, from 16-aligned global memory) into L2 */\n",
    "ATTN_DEV void attn_prefetch_l2_bulk(const void *gmem, unsigned bytes) {\n",
    "    asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" ::\"l\"(gmem), \"r\"(bytes) : \"memory\");\n",
    "}\n",
    "ATTN_DEV void attn_tma_prefetch_map(const attn_tma_map *map) {\n",
    "    asm volatile(\"prefetch.tensormap [%0];\" ::\"l\"((attn_u64)map) : \"memory\");\n",
    "}\n",
    "ATTN_DEV void attn_tma_load_2d(attn_u32 dst, const attn_tma_map *map, int c0, int c1, attn_u32 bar) {\n",
    "    asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\"\n",
    "                 ::\"r\"(dst), \"l\"((attn_u64)map), \"r\"(c0), \"r\"(c1), \"r\"(bar)\n",
    "                 : \"memory\");\n",
    "}\n",
    "ATTN_DEV void attn_tma_load_3d(attn_u32 dst, const attn_tma_map *map, int c0, int c1, int c2, attn_u32 bar) {\n",
    "    asm volatile(\"cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\"\n",
    "                 ::\"r\"(dst), \"l\"((attn_u64)map), \"r\"(c0), \"r\"(c1), \"r\"(c2), \"r\"(bar)\n",
    "                 : \"memory\");\n",
    "}\n",
    "/* the same with an L2 eviction policy (attn_l2_evict_first_policy): data read once */\n",
    "ATTN_DEV void attn_tma_load_3d_hint(attn_u32 dst, const attn_tma_map *map, int c0, int c1, int c2, attn_u32 bar,\n",
    "                                    attn_u64 policy) {\n",
    "    asm volatile(\"cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\"\n",
    "                 ::\"r\"(dst), \"l\"((attn_u64)map), \"r\"(c0), \"r\"(c1), \"r\"(c2), \"r\"(bar), \"l\"(policy)\n",
    "                 : \"memory\");\n",
    "}\n",
    "/* an L2 cache policy: evict these lines first */\n",
    "ATTN_DEV attn_u64 attn_l2_evict_first_policy(void) {\n",
    "    attn_u64 policy;\n",
    "    asm volatile(\"createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\" : \"=l\"(policy));\n",
    "    return policy;\n",
    "}\n",
    "ATTN_DEV void attn_tma_load_4d(attn_u32 dst, const attn_tma_map *map, int c0, int c1, int c2, int c3, attn_u32 bar) {\n",
    "    asm volatile(\"cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\"\n",
    "                 ::\"r\"(dst), \"l\"((attn_u64)map), \"r\"(c0), \"r\"(c1), \"r\"(c2), \"r\"(c3), \"r\"(bar)\n",
    "                 : \"memory\");\n",
    "}\n",
    "ATTN_DEV void attn_tma_load_5d(attn_u32 dst, const attn_tma_map *map, int c0, int c1, int c2, int c3, int c4,\n",
    "                               attn_u32 bar) {\n",
    "    asm volatile(\"cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\"\n",
    "                 ::\"r\"(dst), \"l\"((attn_u64)map), \"r\"(c0), \"r\"(c1), \"r\"(c2), \"r\"(c3), \"r\"(c4), \"r\"(bar)\n",
    "                 : \"memory\");\n",
    "}\n",
    "\n",
    "/* ---- fences ---- */\n",
    "\n",
    "/* ordinary shared-memory stores (st.shared, stmatrix) that the copy engine or the tensor\n",
    "   cores read next: each writing thread, before the barrier that hands them over */\n",
    "ATTN_DEV void attn_fence_proxy_async(void) { asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\"); }\n",
    "\n",
    "/* ---- named barriers: a subset of the CTA's warps meets (id 1..15; id 0 is __syncthreads).\n",
    "   `threads` is a multiple of 32: every warp that takes part, all its lanes. ---- */\n",
    "ATTN_DEV void attn_named_barrier(int id, int threads) {\n",
    "    asm volatile(\"bar.sync %0, %1;\" ::\"r\"(id), \"r\"(threads) : \"memory\");\n",
    "}\n",
    "/* arrive without waiting: with bar.sync by the other warps, a one-way signal (threads is the\n",
    "   total of both sides) */\n",
    "ATTN_DEV void attn_named_barrier_arrive(int id, int threads) {\n",
    "    asm volatile(\"bar.arrive %0, %1;\" ::\"r\"(id), \"r\"(threads) : \"memory\");\n",
    "}\n",
    "\n",
    "/* ---- register reallocation between warpgroups (sm_90a) ----\n",
    "   In effect only when the kernel has a register cap at entry (__launch_bounds__(threads, 1))\n",
    "   and each warpgroup's role is one branch of an if/else: the producer gives registers\n",
    "   back (dec), the consumers take them (inc); N a multiple of 8 in 24..256. */\n",
    "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n",
    "template <int N> ATTN_DEV void attn_regs_release(void) {\n",
    "    static_assert(N % 8 == 0 && N >= 24 && N <= 256, \"setmaxnreg: a multiple of 8 in 24..256\");\n",
    "    asm volatile(\"setmaxnreg.dec.sync.aligned.u32 %0;\" ::\"n\"(N));\n",
    "}\n",
    "template <int N> ATTN_DEV void attn_regs_acquire(void) {\n",
    "    static_assert(N % 8 == 0 && N >= 24 && N <= 256, \"setmaxnreg: a multiple of 8 in 24..256\");\n",
    "    asm volatile(\"setmaxnreg.inc.sync.aligned.u32 %0;\" ::\"n\"(N));\n",
    "}\n",
    "#endif\n",
    "\n",
    "#endif /* ATTN_HOPPER_CUH */\n",
    0};
static const char *const attn__kernel_src_merge_cu[] = {
    "/* merge.cu - the LSE merge of two partial attention results (attn_merge_attn_states; the\n",
    "   CPU form is attn__cpu_merge_attn_states).\n",
    "\n",
    "   attn_merge_attn_states                          defines: HEAD_DIM DT\n",
    "       For every (token, head):\n",
    "           a = lse_a (base e, or base 2 when base_a is 1, then converted), b likewise;\n",
    "           an LSE that is -inf, +inf or NaN means an empty partition: it contributes\n",
    "           nothing, whatever its output row holds (NaN included);\n",
    "           both empty:  out = 0, lse = -inf;\n",
    "           else         m = max(a, b), wa = exp(a - m) (0 if a is empty), wb likewise,\n",
    "                        out = (wa * out_a + wb * out_b) / (wa + wb)   (rounded to DT, RNE)\n",
    "                        lse = m + log(wa + wb), written in base_out (0 e, 1 two) if lse != 0.\n",
    "       out_a, out_b, out: DT [tokens, heads, HEAD_DIM] (element strides per token and per\n",
    "       head, last dimension contiguous); lse_*: f32 [tokens, heads] (element strides).\n",
    "       out may alias out_a or out_b, and lse may alias lse_a or lse_b, element for element:\n",
    "       each row is read completely before any of it is written.\n",
    "\n",
    "   Launch: 1-D, any grid (a grid-stride loop over rows), 128 threads (a multiple of 32), no\n",
    "   shared memory. A row is handled by LANES lanes of one warp (below), 8 elements per lane\n",
    "   and step with 16-byte accesses when HEAD_DIM % 8 == 0 and the row is 16-byte aligned.\n",
    "   HEAD_DIM: any positive size. DT: 0 f32, 1 f16, 2 bf16. */\n",
    "#include \"attn_common.cuh\"\n",
    "#include \"attn_params.cuh\" /* attn__merge_params */\n",
    "\n",
    "#if !defined(HEAD_DIM) || !defined(DT)\n",
    "#error \"merge.cu: define HEAD_DIM and DT\"\n",
    "#endif\n",
    "\n",
    "\n",
    "/* Lanes per row: enough for one pass over the 8-element chunks (a power of two <= 32). */\n",
    "#define ATTN_MERGE_CHUNKS ((HEAD_DIM + 7) / 8)\n",
    "#define ATTN_MERGE_LANES (ATTN_MERGE_CHUNKS >= 32 ? 32 : ATTN_MERGE_CHUNKS > 8 ? (ATTN_MERGE_CHUNKS > 16 ? 32 : 16) \\\n",
    "                          : ATTN_MERGE_CHUNKS > 4 ? 8 : ATTN_MERGE_CHUNKS > 2 ? 4 : ATTN_MERGE_CHUNKS > 1 ? 2 : 1)\n",
    "\n",
    "/* An LSE in base e, with every kind of \"empty\" (+inf, NaN, -inf) as -inf. */\n",
    "ATTN_DEV float attn_merge_lse_in(float x, int base2) {\n",
    "    if (base2) x *= ATTN_LN2;\n",
    "    return x < attn_inf() ? x : attn_neg_inf();\n",
    "}\n",
    "\n",
    "extern \"C\" __global__ void __launch_bounds__(128) attn_merge_attn_states(const attn__merge_params p) {\n",
    "    typedef typename attn_elem<DT>::storage elem_t;\n",
    "    const int esz = attn_elem<DT>::size;\n",
    "    const int lane = threadIdx.x & 31, sub = lane % ATTN_MERGE_LANES;\n",
    "    const int rows_per_warp = 32 / ATTN_MERGE_LANES;\n",
    "    const attn_i64 rows = (attn_i64)p.num_tokens * p.num_heads;\n",
    "    const attn_i64 warp0 = ((attn_i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;\n",
    "    const attn_i64 warps = (attn_i64)gridDim.x * blockDim.x / 32;\n",
    "    /* Every lane of a warp runs the same number of iterations (the __syncwarp below). */\n",
    "    for (attn_i64 base = warp0 * rows_per_warp; base < rows; base += warps * rows_per_warp) {\n",
    "        attn_i64 row = base + lane / ATTN_MERGE_LANES;\n",
    "        int valid = row < rows;\n",
    "        int t = valid ? (int)(row / p.num_heads) : 0, h = valid ? (int)(row - (attn_i64)t * p.num_heads) : 0;\n",
    "        float a = attn_neg_inf(), b = attn_neg_inf();\n",
    "        if (valid) {\n",
    "            a = attn_merge_lse_in(p.lse_a[t * p.lse_a_stride_token + h * p.lse_a_stride_head], p.base_a);\n",
    "            b = attn_merge_lse_in(p.lse_b[t * p.lse_b_stride_token + h * p.lse_b_stride_head], p.base_b);\n",
    "        }\n",
    "        float m = fmaxf(a, b), wa = 0.0f, wb = 0.0f, inv = 0.0f, l = attn_neg_inf();\n",
    "        if (m > attn_neg_inf()) {\n",
    "            wa = a == attn_neg_inf() ? 0.0f : expf(a - m);\n",
    "            wb = b == attn_neg_inf() ? 0.0f : expf(b - m);\n",
    "            inv = attn_rcp(wa + wb); /* wa + wb is in [1, 2] */\n",
    "            l = m + logf(wa + wb);\n",
    "        }\n",
    "        const char *pa = (const char *)p.out_a + (t * p.out_a_stride_token + h * p.out_a_stride_head) * esz;\n",
    "        const char *pb = (const char *)p.out_b + (t * p.out_b_stride_token + h * p.out_b_stride_head) * esz;\n",
    "        char *po = (char *)p.out + (t * p.out_stride_token + h * p.out_stride_head) * esz;\n",
    "        if (valid) {\n",
    "            /* Each element is read and written by the same lane, so out may alias a or b. */\n",
    "            if (HEAD_DIM % 8 == 0 && attn_aligned16(pa) && attn_aligned16(pb) && attn_aligned16(po)) {\n",
    "                for (int c = sub; c < ATTN_MERGE_CHUNKS; c += ATTN_MERGE_LANES) {\n",
    "                    attn_vec16 va[2], vb[2], vo[2];\n",
    "                    float fa[8], fb[8], fo[8];\n",
    "                    const int off = c * 8 * esz;\n",
    "                    va[0] = attn_ld16(pa + off);\n",
    "                    vb[0] = attn_ld16(pb + off);\n",
    "                    if (esz == 4) { va[1] = attn_ld16(pa + off + 16); vb[1] = attn_ld16(pb + off + 16); }\n",
    "                    attn_unpack8<DT>(va, fa);\n",
    "                    attn_unpack8<DT>(vb, fb);\n",
    "#pragma unroll\n",
    "                    for (int i = 0; i < 8; i++) {\n",
    "                        float x = wa > 0.0f ? wa * fa[i] : 0.0f, y = wb > 0.0f ? wb * fb[i] : 0.0f;\n",
    "                        fo[i] = (x + y) * inv; /* both empty: inv = 0 -> 0 */\n",
    "                    }\n",
    "                    attn_pack8<DT>(fo, vo);\n",
    "                    attn_stg16(po + off, vo[0]);\n",
    "                    if (esz == 4) attn_stg16(po + off + 16, vo[1]);\n",
    "                }\n",
    "            } else {\n",
    "                for (int x = sub; x < HEAD_DIM; x += ATTN_MERGE_LANES) {\n",
    "                    float va = wa > 0.0f ? wa * attn_elem<DT>::to_f32(((const elem_t *)pa)[x]) : 0.0f;\n",
    "                    float vb = wb > 0.0f ? wb * attn_elem<DT>::to_f32(((const elem_t *)pb)[x]) : 0.0f;\n",
    "                    ((elem_t *)po)[x] = attn_elem<DT>::from_f32((va + vb) * inv);\n",
    "                }\n",
    "            }\n",
    "        }\n",
    "        /* lse may alias lse_a/lse_b: every lane of the row has read them above. */\n",
    "        __syncwarp();\n",
    "        if (valid && sub == 0 && p.lse)\n",
    "            p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = p.base_out ? l * ATTN_LOG2E : l;\n",
    "    }\n",
    "}\n",
    0};
static const char *const attn__kernel_src_mla_common_cuh[] = {
    "/* mla_common.cuh - what the MLA kernels share beyond their parameters (attn__mla_decode_params\n",
    "   and attn__mla_prefill_params, defined once in attn_params.cuh for the kernels and the\n",
    "   host): the query-chunk and key-row addressing and the LSE merge of a prefill chunk's row\n",
    "   into the rows of the chunks before it. Included by the four MLA kernels (the decode's\n",
    "   split merge: mla_merge.cuh). */\n",
    "#ifndef ATTN_MLA_COMMON_CUH\n",
    "#define ATTN_MLA_COMMON_CUH\n",
    "#include \"attn_common.cuh\"\n",
    "#include \"attn_params.cuh\" /* attn__mla_decode_params, attn__mla_prefill_params */\n",
    "#include \"online_softmax.cuh\"\n",
    "\n",
    "/* The 16-byte chunk `col` (elements 8 col .. 8 col + 7) of the query row (row, head) held\n",
    "   as two 16-bit tensors: columns [0, split) in a (q_latent, or q_nope), the rest in b\n",
    "   (q_pe). Strides in elements. */\n",
    "ATTN_DEV const char *attn_mla_q_chunk(const void *a, attn_i64 a_token, attn_i64 a_head, const void *b, attn_i64 b_token,\n",
    "                                      attn_i64 b_head, int split, int row, int head, int col) {\n",
    "    return col * 8 < split ? (const char *)a + ((attn_i64)row * a_token + (attn_i64)head * a_head + col * 8) * 2\n",
    "                           : (const char *)b + ((attn_i64)row * b_token + (attn_i64)head * b_head + (col * 8 - split)) * 2;\n",
    "}\n",
    "\n",
    "/* Byte offset of key j's latent row (row_bytes) in the paged cache of one request (its\n",
    "   block_table row bt), or -1 outside [key0, key1). */\n",
    "ATTN_DEV attn_i64 attn_mla_key_offset(const int *bt, int j, int key0, int key1, int block_size, int row_bytes) {\n",
    "    return j >= key0 && j < key1\n",
    "               ? ((attn_i64)bt[(unsigned)j / (unsigned)block_size] * block_size + (attn_i64)((unsigned)j % (unsigned)block_size)) * row_bytes\n",
    "               : (attn_i64)-1;\n",
    "}\n",
    "\n",
    "#define ATTN_MHA_CAUSAL 1\n",
    "#define ATTN_MHA_MERGE 2\n",
    "\n",
    "/* MERGE of one row: the earlier chunks' lse (base e, lse_old; -inf: none) and this chunk's\n",
    "   (base 2, *lse2; -inf: no key). On return *wn is the weight of this chunk's normalised\n",
    "   output (it comes in as 1 / L), *wo that of the old out, and *lse2 the merged LSE (base 2);\n",
    "   a side with LSE -inf weighs 0. */\n",
    "ATTN_DEV void attn_mha_merge_weights(float lse_old, float *lse2, float *wn, float *wo) {\n",
    "    const float lo = lse_old * ATTN_LOG2E, mx = fmaxf(lo, *lse2);\n",
    "    if (mx == attn_neg_inf()) return;\n",
    "    const float a = attn_merge_weight(lo, mx), b = attn_merge_weight(*lse2, mx);\n",
    "    const float inv = attn_rcp(a + b);\n",
    "    *wo = a * inv;\n",
    "    *wn *= b * inv;\n",
    "    *lse2 = mx + attn_log2(a + b);\n",
    "}\n",
    "\n",
    "#endif /* ATTN_MLA_COMMON_CUH */\n",
    0};
static const char *const attn__kernel_src_mla_decode_cu[] = {
    "/* mla_decode.cu - MLA absorbed decode (MQA over the latent cache) on mma.sync (sm_80+): the\n",
    "   CUDA_MLA backend's forward_mqa (and the decode half of its fused attn_mla_forward).\n",
    "\n",
    "   Checked on an H200 (2026-12-02): `./build/cuda_kernels --mla` against a float64\n",
    "   reference and `./build/attn_tests cuda` (GPU worlds forced onto CUDA_MLA) passed,\n",
    "   compute-sanitizer memcheck and racecheck clean; figures in docs/PERF.md. `make test`\n",
    "   compiles its variants (no GPU).\n",
    "\n",
    "   =====================================================================================\n",
    "   WHAT IT COMPUTES (attn_mla_forward_mqa of the CPU_MLA backend)\n",
    "   =====================================================================================\n",
    "   Latent cache [num_blocks, BLOCK_SIZE, D] of DT (f16 or bf16), D = KV_LORA + ROPE (576 =\n",
    "   512 + 64, or 320 = 256 + 64); a row is [kv_c | k_pe]. One query row per (decode token,\n",
    "   head): [q_latent (KV_LORA) | q_pe (ROPE)] from two tensors. For the token's visible keys\n",
    "   j in [0, key_end): s_j = q . row_j * scale; out = sum_j softmax(s)_j row_j[0 .. KV_LORA)\n",
    "   (the value is the kv_c part of the same row); lse = log sum_j exp(s_j) (base e). Out\n",
    "   rounded to DT. A row that sees no key: out 0, lse -inf.\n",
    "\n",
    "   =====================================================================================\n",
    "   WORK LIST AND SPLITS\n",
    "   =====================================================================================\n",
    "   Work item (8 int32): {req, head0, q_row, -, key0, key1, slot, -}: the ROWS heads head0 ..\n",
    "   head0 + ROWS - 1 (those below num_heads) of the query row q_row (an index into q, q_pe,\n",
    "   out, lse) of request req, over keys [key0, key1) (one split of its visible range).\n",
    "   slot -1: the item writes out and lse; slot >= 0: it writes its normalised partial to\n",
    "   partial_o[slot][ROWS][KV_LORA] (f32) and its lse (base 2) to partial_lse[slot][ROWS],\n",
    "   and attn_mla_merge combines them. Merge entry (8 int32): {q_row, head0, splits,\n",
    "   first slot, -, -, -, -}: slots first .. first + splits - 1.\n",
    "\n",
    "   =====================================================================================\n",
    "   LAUNCH\n",
    "   =====================================================================================\n",
    "   attn_mla_decode: grid >= *num_work, block WARPS * 32, dynamic shared memory\n",
    "   attn_mla_config.shared_bytes; CTAs past *num_work exit. attn_mla_merge: grid (>= *num_merge,\n",
    "   ROWS), block 256, static shared memory only. attn_mla_config (extern \"C\" __constant__\n",
    "   attn__launch_config): {threads, dynamic shared bytes, KV_TILE, ROWS, 1, KV_STAGES, WARPS, 1}.\n",
    "\n",
    "   =====================================================================================\n",
    "   INSIDE A CTA\n",
    "   =====================================================================================\n",
    "   ROWS = 16 * RT query rows (heads of one token), WARPS warps. Shared memory:\n",
    "       [Q: ROWS x PITCH][K: KV_STAGES x KV_TILE x PITCH][P: ROWS x (KV_TILE + 8) DT]\n",
    "       [row maxima: S_KG x ROWS f32][block offsets: KV_STAGES x KV_TILE int64]\n",
    "   with PITCH = D + 8 elements (rows 16 bytes past the data: conflict-free ldmatrix).\n",
    "   Per tile of KV_TILE keys (cp.async ring of KV_STAGES):\n",
    "     S phase   warp w = (row group rg, key group kg) of S_RG x S_KG: S for its RT_S row\n",
    "               tiles x KW keys (m16n8k16, Q and K fragments by ldmatrix), keys outside\n",
    "               [key0, key1) -> -inf; its rows' maxima over its keys -> shared memory.\n",
    "     barrier   every key group's maxima are in.\n",
    "     softmax   every thread derives the new row max of its rows from the S_KG partial\n",
    "               maxima (identically in every warp), p = 2^(s*scale*log2e - m) -> P (DT) in\n",
    "               shared memory, its lane-partial row sums rescaled and accumulated.\n",
    "     barrier   P is complete.\n",
    "     PV phase  warp w owns output columns w * CW .. (w + 1) * CW of every row: O rescaled by\n",
    "               2^(m_old - m_new), O += P V with V = columns 0 .. KV_LORA of the K stage\n",
    "               (ldmatrix.trans), P fragments by ldmatrix.\n",
    "   Epilogue: row sums (S_KG x 4 lanes) summed through shared memory, O / l out. */\n",
    "#include \"mla_common.cuh\" /* attn__mla_decode_params */\n",
    "\n",
    "#if !defined(KV_LORA) || !defined(ROPE) || !defined(BLOCK_SIZE) || !defined(DT) || !defined(ROWS)\n",
    "#error \"mla_decode.cu: define KV_LORA, ROPE, BLOCK_SIZE, DT and ROWS\"\n",
    "#endif\n",
    "#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16\n",
    "#error \"mla_decode.cu: DT must be 1 (f16) or 2 (bf16)\"\n",
    "#endif\n",
    "/* DT_KV: the latent cache's type, DT (default) or an fp8 latent, 4 e4m3 / 5 e5m2, with a\n",
    "   per-tensor scale (params.k_scale / k_scale_value; a value that is not finite and > 0\n",
    "   writes nothing). fp8: the paged_attention.cu scheme (its 8-BIT CACHES): code stages,\n",
    "   ldmatrix of the codes as b16, Q in f16 with the k-permuted column order scaled by a power\n",
    "   of two per CTA, P in f16, V's even/odd column tiles put back in the epilogue. */\n",
    "#ifndef DT_KV\n",
    "#define DT_KV DT\n",
    "#endif\n",
    "#define ATTN_KV8 (DT_KV == ATTN_DT_E4M3 || DT_KV == ATTN_DT_E5M2)\n",
    "/* DT_KV 9 (ATTN_DT_DS_MLA, SPARSE only, 512 + 64): DeepSeek-V3.2's 656-byte rows, copied\n",
    "   raw (cp.async) into a staging ring beside the K stages and widened there, each tile once,\n",
    "   into the 16-bit K stage (codes x their 128-value tile's scale; the bf16 k_pe as DT): S\n",
    "   and P V then run the 16-bit path. */\n",
    "#define ATTN_DS (DT_KV == ATTN_DT_DS_MLA)\n",
    "#if DT_KV != DT && !ATTN_KV8 && !ATTN_DS\n",
    "#error \"mla_decode.cu: DT_KV must be DT, 4 (fp8 e4m3), 5 (fp8 e5m2) or 9 (fp8_ds_mla, SPARSE)\"\n",
    "#endif\n",
    "#define ATTN_DT_M (ATTN_KV8 ? ATTN_DT_F16 : DT) /* the mma's input type (Q, P, K, V) */\n",
    "/* SPARSE 1: sparse MLA (DeepSeek-V3.2, attn_mla_forward_sparse): grid (>= num_work[0]\n",
    "   tokens, ceil(num_heads / ROWS), >= num_work[1] splits); CTA (t, y, z) serves heads y *\n",
    "   ROWS .. of batch token t over entries [z c, z c + c) of its indices row (c = ceil(topk /\n",
    "   splits); -1 and positions outside [0, seq_len of its request) are skipped), gathered\n",
    "   through its request's block table; no work list. One split: it writes out/lse, the\n",
    "   sinks (params.sinks) joined; more: slot (t gridDim.y + y) splits + z of the partials,\n",
    "   merged by attn_mla_merge over params.merge (the sinks joined there). */\n",
    "#ifndef SPARSE\n",
    "#define SPARSE 0\n",
    "#endif\n",
    "/* MIN_CTAS: CTAs per SM the registers are budgeted for (launch bounds) */\n",
    "#ifndef MIN_CTAS\n",
    "#define MIN_CTAS 1\n",
    "#endif\n",
    "#if KV_LORA % 64 != 0 || ROPE % 16 != 0\n",
    "#error \"mla_decode.cu: KV_LORA must be a multiple of 64 and ROPE of 16\"\n",
    "#endif\n",
    "#if ROWS != 16 && ROWS != 32 && ROWS != 64\n",
    "#error \"mla_decode.cu: ROWS must be 16, 32 or 64\"\n",
    "#endif\n",
    "#ifndef WARPS\n",
    "#define WARPS (ROWS == 64 ? 8 : 4)\n",
    "#endif\n",
    "/* defaults: 16-bit latents 32-key tiles (3 stages at 16 rows, 2 past); an fp8 latent\n",
    "   64-key tiles x 2 stages (at 16 rows two CTAs per SM; H200 sweeps, docs/PERF.md) */\n",
    "#ifndef KV_TILE\n",
    "#define KV_TILE (ATTN_KV8 ? 64 : 32)\n",
    "#endif\n",
    "#ifndef KV_STAGES\n",
    "#define KV_STAGES (ROWS == 16 && !ATTN_KV8 ? 3 : 2)\n",
    "#endif\n",
    "\n",
    "#include \"mla_merge.cuh\" /* attn_mla_merge_kernel */\n",
    "\n",
    "#define ATTN_D (KV_LORA + ROPE)\n",
    "#define ATTN_RT (ROWS / 16)\n",
    "#define ATTN_PITCH (ATTN_D + 8)                 /* elements (Q; K of a 16-bit latent) */\n",
    "/* a K stage row in bytes: 16-bit latents ATTN_PITCH elements; fp8 codes D bytes, 16 more\n",
    "   where that makes an even number of 16-byte units (conflict-free ldmatrix) */\n",
    "#define ATTN_KROW (ATTN_KV8 ? ATTN_D + (ATTN_D / 16 % 2 == 0 ? 16 : 0) : ATTN_PITCH * 2)\n",
    "#define ATTN_PPITCH (KV_TILE + 8)               /* elements of a P row */\n",
    "#define ATTN_THREADS (WARPS * 32)\n",
    "/* S: row groups x key groups = WARPS */\n",
    "#define ATTN_S_RG (ATTN_RT < WARPS ? ATTN_RT : WARPS)\n",
    "#define ATTN_S_KG (WARPS / ATTN_S_RG)\n",
    "#define ATTN_RT_S (ATTN_RT / ATTN_S_RG)          /* row tiles per warp in S */\n",
    "#define ATTN_KW (KV_TILE / ATTN_S_KG)            /* keys per warp in S */\n",
    "#define ATTN_NT (ATTN_KW / 8)                    /* n tiles of 8 keys */\n",
    "#define ATTN_CW (KV_LORA / WARPS)                /* output columns per warp */\n",
    "#define ATTN_OT (ATTN_CW / 8)\n",
    "#if ATTN_S_RG * ATTN_S_KG != WARPS || ATTN_RT % ATTN_S_RG != 0 || ATTN_KW % 8 != 0 || ATTN_KW < 8\n",
    "#error \"mla_decode.cu: WARPS must split ROWS / 16 row tiles x KV_TILE keys into whole 16 x 8 tiles\"\n",
    "#endif\n",
    "#if ATTN_CW % 16 != 0 || ATTN_RT * ATTN_OT * 4 > 128\n",
    "#error \"mla_decode.cu: each warp's output columns must be a multiple of 16 and its O at most 128 registers\"\n",
    "#endif\n",
    "#if KV_TILE % 16 != 0\n",
    "#error \"mla_decode.cu: KV_TILE must be a multiple of 16\"\n",
    "#endif\n",
    "#if ATTN_KV8 && (ATTN_D % 64 != 0 || ATTN_CW % 32 != 0)\n",
    "#error \"mla_decode.cu: an fp8 latent needs KV_LORA + ROPE in multiples of 64 and each warp's output columns of 32\"\n",
    "#endif\n",
    "/* S_ACC: independent partial sums of a warp's S, 1, 2 or 4: at 8 keys a warp one accumulator\n",
    "   is a chain of D / 16 dependent mmas. Default: at 16 rows 4 (one n tile a warp) or 2; past\n",
    "   16 rows 1 (H200: 2 was 1.5 % slower at 128 heads, the warps having enough chains) */\n",
    "#ifndef S_ACC\n",
    "#define S_ACC (ROWS == 16 ? (ATTN_NT == 1 ? 4 : 2) : 1)\n",
    "#endif\n",
    "#if (S_ACC != 1 && S_ACC != 2 && S_ACC != 4) || ATTN_D / 16 % S_ACC != 0\n",
    "#error \"mla_decode.cu: S_ACC must be 1, 2 or 4 and divide (KV_LORA + ROPE) / 16\"\n",
    "#endif\n",
    "\n",
    "#define ATTN_SQ_OFF 0\n",
    "#define ATTN_SK_OFF (ATTN_SQ_OFF + ROWS * ATTN_PITCH * 2)\n",
    "#define ATTN_SP_OFF (ATTN_SK_OFF + KV_STAGES * KV_TILE * ATTN_KROW)\n",
    "#define ATTN_SMAX_OFF (ATTN_SP_OFF + ROWS * ATTN_PPITCH * 2)\n",
    "#define ATTN_SBLK_OFF (ATTN_SMAX_OFF + ATTN_S_KG * ROWS * 4)\n",
    "#define ATTN_SR_OFF (ATTN_SBLK_OFF + KV_STAGES * KV_TILE * 8) /* fp8_ds_mla: the raw rows */\n",
    "#define ATTN_SMEM_BYTES (ATTN_SR_OFF + (ATTN_DS ? KV_STAGES * KV_TILE * ATTN_DS_MLA_ROW : 0))\n",
    "#if ATTN_SBLK_OFF % 8 != 0\n",
    "#error \"mla_decode.cu: the block offsets must be 8-byte aligned\"\n",
    "#endif\n",
    "#define ATTN_CPR (ATTN_D * 2 / 16) /* 16-byte chunks per latent row (Q) */\n",
    "#define ATTN_ROWB (ATTN_DS ? ATTN_DS_MLA_ROW : ATTN_D * (ATTN_KV8 ? 1 : 2)) /* bytes of a cache row */\n",
    "#define ATTN_KCPR (ATTN_ROWB / 16) /* 16-byte chunks per cache row */\n",
    "\n",
    "extern \"C\" __constant__ attn__launch_config attn_mla_config = {ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ROWS, 1, KV_STAGES, WARPS, 1};\n",
    "\n",
    "\n",
    "extern \"C\" __global__ void __launch_bounds__(ATTN_THREADS, MIN_CTAS) attn_mla_decode(const attn__mla_decode_params p) {\n",
    "    extern __shared__ attn_vec16 attn_smem[];\n",
    "    char *const smem = (char *)attn_smem;\n",
    "    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();\n",
    "    if ((int)blockIdx.x >= *p.num_work) return;\n",
    "#if SPARSE\n",
    "    /* SPARSE: CTA (t, head tile) for t < *num_work (the batch's tokens); keys are the\n",
    "       positions of token t's indices row, the \"key\" j its j-th entry */\n",
    "    const int nsplit = p.num_work[1], z = blockIdx.z; /* the build's splits of each token's entries */\n",
    "    if (z >= nsplit) return;\n",
    "    const int chunk = (p.topk + nsplit - 1) / nsplit;\n",
    "    const int q_row = blockIdx.x, head0 = blockIdx.y * ROWS;\n",
    "    const int key0 = attn_imin(p.topk, z * chunk), key1 = attn_imin(p.topk, key0 + chunk);\n",
    "    const int slot = nsplit > 1 ? (q_row * (int)gridDim.y + (int)blockIdx.y) * nsplit + z : -1;\n",
    "    const int req = __ldg(p.token_req + q_row), seq_len = __ldg(p.seq_lens + req);\n",
    "    const int *const ix = p.indices + (attn_i64)q_row * p.indices_stride;\n",
    "    auto visible = [&](int j) -> bool { /* entry j names a position of the request */\n",
    "        if (j < key0 || j >= key1) return false;\n",
    "        const int x = __ldg(ix + j);\n",
    "        return x >= 0 && x < seq_len;\n",
    "    };\n",
    "#else\n",
    "    const int *item = p.work + 8 * (attn_i64)blockIdx.x;\n",
    "    const int req = item[0], head0 = item[1], q_row = item[2], slot = item[6];\n",
    "    const int key0 = item[4], key1 = item[5];\n",
    "    auto visible = [&](int j) -> bool { return j >= key0 && j < key1; };\n",
    "#endif\n",
    "    const int nrows = attn_imin(ROWS, p.num_heads - head0);\n",
    "#if ATTN_KV8\n",
    "    const float k_scale = attn_cache_scale(p.k_scale, p.k_scale_value);\n",
    "    if (k_scale == 0.0f) return; /* nothing written */\n",
    "    float q_unscale = 1.0f; /* 2^-e of Q's scaling */\n",
    "#endif\n",
    "    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;\n",
    "    const int g = lane >> 2, tq = lane & 3;\n",
    "    const attn_u32 sbase = attn_smem_addr(attn_smem);\n",
    "    const attn_u32 sQ = sbase + ATTN_SQ_OFF, sK = sbase + ATTN_SK_OFF, sP = sbase + ATTN_SP_OFF;\n",
    "    float *const sMax = (float *)(smem + ATTN_SMAX_OFF);      /* [S_KG][ROWS] */\n",
    "    attn_i64 *const sBlk = (attn_i64 *)(smem + ATTN_SBLK_OFF); /* [stage][key] */\n",
    "\n",
    "    /* ---- Q: [q_latent | q_pe] rows of heads head0 .. (zero past num_heads) ---- */\n",
    "#if !ATTN_KV8\n",
    "    for (int c = tid; c < ROWS * ATTN_CPR; c += ATTN_THREADS) {\n",
    "        const int r = c / ATTN_CPR, col = c - r * ATTN_CPR; /* col: 16-byte chunk, 8 elements */\n",
    "        const int valid = r < nrows;\n",
    "        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,\n",
    "                                                   p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col)\n",
    "                                : (const char *)p.q;\n",
    "        attn_cp_async16_or_zero(sQ + (attn_u32)((r * ATTN_PITCH + col * 8) * 2), src, !valid);\n",
    "    }\n",
    "#endif\n",
    "\n",
    "    /* ---- the K ring: row offsets of keys in flight, zero-filled outside [key0, key1) ---- */\n",
    "    const int *bt = p.block_table + (attn_i64)req * p.block_table_stride;\n",
    "    const char *kv = (const char *)p.kv_cache;\n",
    "    const int tile0 = key1 > key0 ? key0 / KV_TILE * KV_TILE : 0;\n",
    "    const int ntiles = key1 > key0 ? (key1 - tile0 + KV_TILE - 1) / KV_TILE : 0;\n",
    "    auto row_off = [&](int j) -> attn_i64 { /* byte offset of key j's row, -1 outside */\n",
    "#if SPARSE\n",
    "        if (!visible(j)) return (attn_i64)-1;\n",
    "        const int x = __ldg(ix + j);\n",
    "        return ((attn_i64)__ldg(bt + (unsigned)x / BLOCK_SIZE) * BLOCK_SIZE + (attn_i64)((unsigned)x % BLOCK_SIZE)) *\n",
    "               ATTN_ROWB;\n",
    "#else\n",
    "        return attn_mla_key_offset(bt, j, key0, key1, BLOCK_SIZE, ATTN_D * (ATTN_KV8 ? 1 : 2));\n",
    "#endif\n",
    "    };\n",
    "    auto issue = [&](int tile) { /* cp.async of tile `tile` into its stage */\n",
    "        const int st = tile % KV_STAGES;\n",
    "        for (int c = tid; c < KV_TILE * ATTN_KCPR; c += ATTN_THREADS) {\n",
    "            const int r = c / ATTN_KCPR, col = c - r * ATTN_KCPR;\n",
    "            const attn_i64 off = sBlk[st * KV_TILE + r];\n",
    "            const attn_u32 dst = ATTN_DS ? sbase + ATTN_SR_OFF + (attn_u32)((st * KV_TILE + r) * ATTN_DS_MLA_ROW + col * 16)\n",
    "                                         : sK + (attn_u32)((st * KV_TILE + r) * ATTN_KROW + col * 16);\n",
    "            attn_cp_async16_or_zero(dst, kv + (off >= 0 ? off + col * 16 : 0), off < 0);\n",
    "        }\n",
    "    };\n",
    "    for (int s = 0; s < KV_STAGES; s++)\n",
    "        for (int r = tid; r < KV_TILE; r += ATTN_THREADS) sBlk[s * KV_TILE + r] = row_off(tile0 + s * KV_TILE + r);\n",
    "    __syncthreads(); /* sBlk */\n",
    "    for (int s = 0; s < KV_STAGES - 1; s++) {\n",
    "        if (s < ntiles) issue(s);\n",
    "        attn_cp_async_commit(); /* Q goes with the first group */\n",
    "    }\n",
    "#if ATTN_KV8\n",
    "    /* ---- Q of an fp8 latent (converted while the first tiles are in flight) ---- */\n",
    "    {   /* f16, scaled by 2^e (the CTA's largest |q| into [2^14, 2^15)), columns k-permuted */\n",
    "        __shared__ int attn_q_amax;\n",
    "        if (tid == 0) attn_q_amax = 0;\n",
    "        __syncthreads();\n",
    "        float amax = 0.0f;\n",
    "        for (int c = tid; c < nrows * ATTN_CPR; c += ATTN_THREADS) {\n",
    "            const int r = c / ATTN_CPR, col = c - r * ATTN_CPR;\n",
    "            float f[8];\n",
    "            attn_vec16 v = attn_ldg16(attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,\n",
    "                                                       p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col));\n",
    "            attn_unpack8<DT>(&v, f);\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(f[i]));\n",
    "        }\n",
    "        atomicMax(&attn_q_amax, __float_as_int(amax));\n",
    "        __syncthreads();\n",
    "        const int ex = (attn_q_amax >> 23) & 0xff;\n",
    "        const int sh = attn_q_amax == 0 || ex == 255 ? 0 : attn_imax(-100, attn_imin(100, 141 - ex));\n",
    "        const float qmul = __int_as_float((127 + sh / 2) << 23) * __int_as_float((127 + sh - sh / 2) << 23);\n",
    "        q_unscale = __int_as_float((127 - sh / 2) << 23) * __int_as_float((127 - sh + sh / 2) << 23);\n",
    "        attn_u16 *const q16 = (attn_u16 *)(smem + ATTN_SQ_OFF);\n",
    "        for (int c = tid; c < ROWS * ATTN_CPR; c += ATTN_THREADS) {\n",
    "            const int r = c / ATTN_CPR, col = c - r * ATTN_CPR;\n",
    "            float f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};\n",
    "            if (r < nrows) {\n",
    "                attn_vec16 v = attn_ldg16(attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,\n",
    "                                                           p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col));\n",
    "                attn_unpack8<DT>(&v, f);\n",
    "            }\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < 8; i++) { /* dim d = 8 col + i; x = d % 16: column 2 (x / 4) + x % 4 (+ 8 - 2 if x % 4 >= 2) */\n",
    "                const int d = col * 8 + i, x = d & 15, jj = x & 3;\n",
    "                const int cc = (d & ~15) + (jj < 2 ? 2 * (x >> 2) + jj : 8 + 2 * (x >> 2) + jj - 2);\n",
    "                q16[r * ATTN_PITCH + cc] = attn_f32_to_f16(f[i] * qmul);\n",
    "            }\n",
    "        }\n",
    "    }\n",
    "#endif\n",
    "\n",
    "    /* ---- roles ---- */\n",
    "    const int rg = warp / ATTN_S_KG, kg = warp % ATTN_S_KG; /* S: row group, key group */\n",
    "#if ATTN_KV8\n",
    "    const float qk_scale = p.scale * ATTN_LOG2E * k_scale * q_unscale * attn_code_factor<DT_KV>();\n",
    "    /* code rows: ldmatrix x4 over keys 0-7 / 8-15 x bytes +0 / +16 (K: keys 0-7 +0, 0-7 +16,\n",
    "       8-15 +0, 8-15 +16; the 8-key x2: keys 0-7 +0, +16; V: 0-7 +0, 8-15 +0, 0-7 +16, 8-15 +16) */\n",
    "    const attn_u32 k8_lane4 = (attn_u32)(((lane & 7) + ((lane >> 4) << 3)) * ATTN_KROW + ((lane >> 3) & 1) * 16);\n",
    "    const attn_u32 k8_lane2 = (attn_u32)((lane & 7) * ATTN_KROW + ((lane >> 3) & 1) * 16);\n",
    "    const attn_u32 v8_lane = (attn_u32)(((lane & 7) + (((lane >> 3) & 1) << 3)) * ATTN_KROW + (lane >> 4) * 16);\n",
    "#else\n",
    "    const float qk_scale = p.scale * ATTN_LOG2E;\n",
    "#endif\n",
    "    /* ldmatrix lane offsets (bytes): A (rows lane % 16, column half lane / 16), B from\n",
    "       [key][dim] rows (keys lane % 8 + 8 (lane / 16), column half (lane / 8) % 2), B\n",
    "       transposed from [key][dim] (keys lane % 16, column half lane / 16) */\n",
    "    const attn_u32 a_lane = (attn_u32)(((lane & 15) * ATTN_PITCH + (lane >> 4) * 8) * 2);\n",
    "    const attn_u32 k_lane = (attn_u32)((((lane & 7) + ((lane >> 4) << 3)) * ATTN_PITCH + ((lane >> 3) & 1) * 8) * 2);\n",
    "    const attn_u32 v_lane = (attn_u32)(((lane & 15) * ATTN_PITCH + (lane >> 4) * 8) * 2);\n",
    "    const attn_u32 p_lane = (attn_u32)(((lane & 15) * ATTN_PPITCH + (lane >> 4) * 8) * 2);\n",
    "\n",
    "    /* running row max (base 2, scaled) of the S rows and of the O rows of this thread, kept\n",
    "       identically (both derive from the same shared maxima) */\n",
    "    float mS[ATTN_RT_S][2], lS[ATTN_RT_S][2], mO[ATTN_RT][2];\n",
    "#pragma unroll\n",
    "    for (int r = 0; r < ATTN_RT_S; r++) mS[r][0] = mS[r][1] = attn_neg_inf(), lS[r][0] = lS[r][1] = 0.0f;\n",
    "#pragma unroll\n",
    "    for (int r = 0; r < ATTN_RT; r++) mO[r][0] = mO[r][1] = attn_neg_inf();\n",
    "    float o[ATTN_RT][ATTN_OT][4];\n",
    "#pragma unroll\n",
    "    for (int r = 0; r < ATTN_RT; r++)\n",
    "#pragma unroll\n",
    "        for (int n = 0; n < ATTN_OT; n++) o[r][n][0] = o[r][n][1] = o[r][n][2] = o[r][n][3] = 0.0f;\n",
    "\n",
    "    for (int it = 0; it < ntiles; it++) {\n",
    "        attn_cp_async_wait<KV_STAGES - 2>();\n",
    "        __syncthreads(); /* tile it landed; the last tile's P and maxima are read */\n",
    "        if (it + KV_STAGES - 1 < ntiles) issue(it + KV_STAGES - 1);\n",
    "        attn_cp_async_commit();\n",
    "        const int st = it % KV_STAGES;\n",
    "        const int kt = tile0 + it * KV_TILE;\n",
    "        /* the row offsets of tile it + KV_STAGES into stage st's slot (its last reader,\n",
    "           the issue of tile it, ran iterations ago); read after the next barriers */\n",
    "        for (int r = tid; r < KV_TILE; r += ATTN_THREADS)\n",
    "            sBlk[st * KV_TILE + r] = row_off(tile0 + (it + KV_STAGES) * KV_TILE + r);\n",
    "        const attn_u32 sKst = sK + (attn_u32)(st * KV_TILE * ATTN_KROW);\n",
    "#if ATTN_DS\n",
    "        {   /* widen tile it's raw rows into K stage st (its last readers, tile it - KV_STAGES's\n",
    "               S and P V, finished before the previous iteration's barrier); rows of skipped\n",
    "               entries were zero-filled: scale 0, codes 0 */\n",
    "            const char *raw = smem + ATTN_SR_OFF + st * KV_TILE * ATTN_DS_MLA_ROW;\n",
    "            for (int u = tid; u < KV_TILE * (ATTN_D / 8); u += ATTN_THREADS) {\n",
    "                const int r = u / (ATTN_D / 8), c8 = u - r * (ATTN_D / 8);\n",
    "                const char *row = raw + r * ATTN_DS_MLA_ROW;\n",
    "                float f[8];\n",
    "                attn_vec16 o[2];\n",
    "                if (c8 < KV_LORA / 8) { /* 8 codes of tile c8 / 16 */\n",
    "                    const float sc = *(const float *)(row + 512 + 4 * (c8 >> 4)) * attn_code_factor<ATTN_DT_E4M3>();\n",
    "                    const uint2 w = *(const uint2 *)(row + c8 * 8);\n",
    "                    attn_vec16 h;\n",
    "                    attn_codes4_to_f16x2<ATTN_DT_E4M3>(w.x, h.x, h.y);\n",
    "                    attn_codes4_to_f16x2<ATTN_DT_E4M3>(w.y, h.z, h.w);\n",
    "                    attn_unpack8<ATTN_DT_F16>(&h, f);\n",
    "#pragma unroll\n",
    "                    for (int i = 0; i < 8; i++) f[i] *= sc;\n",
    "                } else { /* 8 bf16 of k_pe */\n",
    "                    const attn_vec16 b = *(const attn_vec16 *)(row + 512 + 16 + (c8 - KV_LORA / 8) * 16);\n",
    "                    attn_unpack8<ATTN_DT_BF16>(&b, f);\n",
    "                }\n",
    "                attn_pack8<DT>(f, o);\n",
    "                *(attn_vec16 *)(smem + ATTN_SK_OFF + (st * KV_TILE + r) * ATTN_KROW + c8 * 16) = o[0];\n",
    "            }\n",
    "            __syncthreads();\n",
    "        }\n",
    "#endif\n",
    "\n",
    "        /* ---- S phase: S_ACC partial sums sp, added into s ---- */\n",
    "        float s[ATTN_RT_S][ATTN_NT][4], sp[S_ACC][ATTN_RT_S][ATTN_NT][4];\n",
    "#pragma unroll\n",
    "        for (int c = 0; c < S_ACC; c++)\n",
    "#pragma unroll\n",
    "            for (int r = 0; r < ATTN_RT_S; r++)\n",
    "#pragma unroll\n",
    "                for (int n = 0; n < ATTN_NT; n++) sp[c][r][n][0] = sp[c][r][n][1] = sp[c][r][n][2] = sp[c][r][n][3] = 0.0f;\n",
    "#if ATTN_KV8\n",
    "        {   /* fp8: a 16-key x 32-dim block of codes by one ldmatrix.x4 (4 words: b0/b1 of two\n",
    "               k chunks for two n tiles), an 8-key one by x2. S_ACC independent partial sums\n",
    "               (chunk c of 16 dims into sp[c % S_ACC]): a warp's S is a chain of D / 16 mmas\n",
    "               per n tile, which at 8 keys a warp is the tile loop's critical path */\n",
    "            const attn_u32 kb = sKst + (attn_u32)(kg * ATTN_KW * ATTN_KROW);\n",
    "            const attn_u32 qb = sQ + (attn_u32)(rg * ATTN_RT_S * 16 * ATTN_PITCH * 2) + a_lane;\n",
    "            for (int kq2 = 0; kq2 < ATTN_D / 64; kq2++)\n",
    "#pragma unroll\n",
    "                for (int h2 = 0; h2 < 2; h2++) {\n",
    "                    const int kq = 2 * kq2 + h2, c0 = (2 * h2) % S_ACC, c1 = (2 * h2 + 1) % S_ACC;\n",
    "                    attn_u32 a0[ATTN_RT_S][4], a1[ATTN_RT_S][4];\n",
    "#pragma unroll\n",
    "                    for (int r = 0; r < ATTN_RT_S; r++) {\n",
    "                        attn_ldmatrix_x4(a0[r], qb + (attn_u32)(r * 16 * ATTN_PITCH * 2) + kq * 64);\n",
    "                        attn_ldmatrix_x4(a1[r], qb + (attn_u32)(r * 16 * ATTN_PITCH * 2) + kq * 64 + 32);\n",
    "                    }\n",
    "#pragma unroll\n",
    "                    for (int np = 0; np < ATTN_NT / 2; np++) {\n",
    "                        attn_u32 w[4], b[4][2];\n",
    "                        attn_ldmatrix_x4(w, kb + k8_lane4 + (attn_u32)(np * 16 * ATTN_KROW + kq * 32));\n",
    "#pragma unroll\n",
    "                        for (int i = 0; i < 4; i++) attn_codes4_to_f16x2<DT_KV>(w[i], b[i][0], b[i][1]);\n",
    "#pragma unroll\n",
    "                        for (int r = 0; r < ATTN_RT_S; r++) {\n",
    "                            attn_mma16816<ATTN_DT_M>(sp[c0][r][2 * np], a0[r], b[0]);\n",
    "                            attn_mma16816<ATTN_DT_M>(sp[c1][r][2 * np], a1[r], b[1]);\n",
    "                            attn_mma16816<ATTN_DT_M>(sp[c0][r][2 * np + 1], a0[r], b[2]);\n",
    "                            attn_mma16816<ATTN_DT_M>(sp[c1][r][2 * np + 1], a1[r], b[3]);\n",
    "                        }\n",
    "                    }\n",
    "#if ATTN_NT % 2\n",
    "                    {\n",
    "                        attn_u32 w[2], b[2][2];\n",
    "                        attn_ldmatrix_x2(w, kb + k8_lane2 + (attn_u32)((ATTN_NT - 1) * 8 * ATTN_KROW + kq * 32));\n",
    "                        attn_codes4_to_f16x2<DT_KV>(w[0], b[0][0], b[0][1]);\n",
    "                        attn_codes4_to_f16x2<DT_KV>(w[1], b[1][0], b[1][1]);\n",
    "#pragma unroll\n",
    "                        for (int r = 0; r < ATTN_RT_S; r++) {\n",
    "                            attn_mma16816<ATTN_DT_M>(sp[c0][r][ATTN_NT - 1], a0[r], b[0]);\n",
    "                            attn_mma16816<ATTN_DT_M>(sp[c1][r][ATTN_NT - 1], a1[r], b[1]);\n",
    "                        }\n",
    "                    }\n",
    "#endif\n",
    "                }\n",
    "        }\n",
    "#else\n",
    "        {\n",
    "            /* S_ACC independent partial sums, as the fp8 branch: 16-dim step ks into sp[ks % S_ACC] */\n",
    "            const attn_u32 kb = sKst + (attn_u32)(kg * ATTN_KW * ATTN_PITCH * 2);\n",
    "            const attn_u32 qb = sQ + (attn_u32)(rg * ATTN_RT_S * 16 * ATTN_PITCH * 2) + a_lane;\n",
    "#pragma unroll (S_ACC == 1 ? 4 : 1)\n",
    "            for (int ks0 = 0; ks0 < ATTN_D / 16; ks0 += S_ACC)\n",
    "#pragma unroll\n",
    "                for (int c = 0; c < S_ACC; c++) {\n",
    "                    const int ks = ks0 + c;\n",
    "                    attn_u32 a[ATTN_RT_S][4];\n",
    "#pragma unroll\n",
    "                    for (int r = 0; r < ATTN_RT_S; r++) attn_ldmatrix_x4(a[r], qb + (attn_u32)(r * 16 * ATTN_PITCH * 2) + ks * 32);\n",
    "#pragma unroll\n",
    "                    for (int np = 0; np < ATTN_NT / 2; np++) {\n",
    "                        attn_u32 b[4];\n",
    "                        attn_ldmatrix_x4(b, kb + k_lane + (attn_u32)((np * 16 * ATTN_PITCH + ks * 16) * 2));\n",
    "#pragma unroll\n",
    "                        for (int r = 0; r < ATTN_RT_S; r++) {\n",
    "                            attn_mma16816<DT>(sp[c][r][2 * np], a[r], b);\n",
    "                            attn_mma16816<DT>(sp[c][r][2 * np + 1], a[r], b + 2);\n",
    "                        }\n",
    "                    }\n",
    "#if ATTN_NT % 2\n",
    "                    {\n",
    "                        const attn_u32 k2_lane = (attn_u32)(((lane & 7) * ATTN_PITCH + ((lane >> 3) & 1) * 8) * 2); /* x2: 8 keys */\n",
    "                        attn_u32 b[2];\n",
    "                        attn_ldmatrix_x2(b, kb + k2_lane + (attn_u32)(((ATTN_NT - 1) * 8 * ATTN_PITCH + ks * 16) * 2));\n",
    "#pragma unroll\n",
    "                        for (int r = 0; r < ATTN_RT_S; r++) attn_mma16816<DT>(sp[c][r][ATTN_NT - 1], a[r], b);\n",
    "                    }\n",
    "#endif\n",
    "                }\n",
    "        }\n",
    "#endif\n",
    "#pragma unroll\n",
    "        for (int r = 0; r < ATTN_RT_S; r++)\n",
    "#pragma unroll\n",
    "            for (int n = 0; n < ATTN_NT; n++)\n",
    "#pragma unroll\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    float x = sp[0][r][n][e];\n",
    "#pragma unroll\n",
    "                    for (int c = 1; c < S_ACC; c++) x += sp[c][r][n][e];\n",
    "                    s[r][n][e] = x;\n",
    "                }\n",
    "        /* mask keys outside [key0, key1); this warp's row maxima to shared memory */\n",
    "        const int kw0 = kt + kg * ATTN_KW + 2 * tq;\n",
    "#pragma unroll\n",
    "        for (int r = 0; r < ATTN_RT_S; r++) {\n",
    "            float mx[2] = {attn_neg_inf(), attn_neg_inf()};\n",
    "#pragma unroll\n",
    "            for (int n = 0; n < ATTN_NT; n++)\n",
    "#pragma unroll\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    const int j = kw0 + 8 * n + (e & 1);\n",
    "                    float x = visible(j) ? s[r][n][e] : attn_neg_inf();\n",
    "                    s[r][n][e] = x;\n",
    "                    mx[e >> 1] = fmaxf(mx[e >> 1], x);\n",
    "                }\n",
    "#pragma unroll\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                mx[h] = attn_quad_max(mx[h]);\n",
    "                if (tq == 0) sMax[kg * ROWS + (rg * ATTN_RT_S + r) * 16 + g + 8 * h] = mx[h];\n",
    "            }\n",
    "        }\n",
    "        __syncthreads(); /* every key group's maxima */\n",
    "\n",
    "        /* ---- softmax of the S rows: P to shared memory ---- */\n",
    "#pragma unroll\n",
    "        for (int r = 0; r < ATTN_RT_S; r++) {\n",
    "#pragma unroll\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                const int row = (rg * ATTN_RT_S + r) * 16 + g + 8 * h;\n",
    "                float mx = attn_neg_inf();\n",
    "#pragma unroll\n",
    "                for (int k = 0; k < ATTN_S_KG; k++) mx = fmaxf(mx, sMax[k * ROWS + row]);\n",
    "                float alpha_s;\n",
    "                const float b = attn_softmax_rebase(mS[r][h], mx * qk_scale, alpha_s);\n",
    "                lS[r][h] *= alpha_s;\n",
    "                float sum = 0.0f;\n",
    "#pragma unroll\n",
    "                for (int n = 0; n < ATTN_NT; n++) {\n",
    "                    const float p0 = attn_exp2(fmaf(s[r][n][2 * h], qk_scale, -b));\n",
    "                    const float p1 = attn_exp2(fmaf(s[r][n][2 * h + 1], qk_scale, -b));\n",
    "                    sum += p0 + p1;\n",
    "                    *(attn_u32 *)(smem + ATTN_SP_OFF + (row * ATTN_PPITCH + kg * ATTN_KW + 8 * n + 2 * tq) * 2) =\n",
    "                        attn_elem<ATTN_DT_M>::pack2(p0, p1);\n",
    "                }\n",
    "                lS[r][h] += sum;\n",
    "            }\n",
    "        }\n",
    "        /* the O rows' new maxima and their rescale factor (same arithmetic as above) */\n",
    "        float alpha[ATTN_RT][2];\n",
    "#pragma unroll\n",
    "        for (int r = 0; r < ATTN_RT; r++)\n",
    "#pragma unroll\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                const int row = r * 16 + g + 8 * h;\n",
    "                float mx = attn_neg_inf();\n",
    "#pragma unroll\n",
    "                for (int k = 0; k < ATTN_S_KG; k++) mx = fmaxf(mx, sMax[k * ROWS + row]);\n",
    "                attn_softmax_rebase(mO[r][h], mx * qk_scale, alpha[r][h]);\n",
    "            }\n",
    "        __syncthreads(); /* P complete */\n",
    "\n",
    "        /* ---- PV phase: O[:, warp's columns] = alpha O + P V ---- */\n",
    "#pragma unroll\n",
    "        for (int r = 0; r < ATTN_RT; r++)\n",
    "#pragma unroll\n",
    "            for (int n = 0; n < ATTN_OT; n++) {\n",
    "                o[r][n][0] *= alpha[r][0]; o[r][n][1] *= alpha[r][0];\n",
    "                o[r][n][2] *= alpha[r][1]; o[r][n][3] *= alpha[r][1];\n",
    "            }\n",
    "        {   /* O += P V, per 16 keys: P's A fragments by ldmatrix, then V's */\n",
    "#if ATTN_KV8\n",
    "            /* fp8: V = the first KV_LORA code columns; per 16 keys x 32 columns one\n",
    "               ldmatrix.x4.trans, split by prmt into the even- and odd-column tiles of each 16\n",
    "               (o tiles 4q .. 4q + 3: columns 32q + {even, odd}, 32q + 16 + {even, odd}) */\n",
    "            const attn_u32 vb = sKst + v8_lane + (attn_u32)(warp * ATTN_CW);\n",
    "#else\n",
    "            const attn_u32 vb = sKst + v_lane + (attn_u32)(warp * ATTN_CW * 2);\n",
    "#endif\n",
    "#pragma unroll\n",
    "            for (int kk = 0; kk < KV_TILE / 16; kk++) {\n",
    "                attn_u32 a[ATTN_RT][4];\n",
    "#pragma unroll\n",
    "                for (int r = 0; r < ATTN_RT; r++)\n",
    "                    attn_ldmatrix_x4(a[r], sP + p_lane + (attn_u32)((r * 16 * ATTN_PPITCH + kk * 16) * 2));\n",
    "                const attn_u32 vrow = vb + (attn_u32)(kk * 16 * ATTN_KROW);\n",
    "#if ATTN_KV8\n",
    "#pragma unroll\n",
    "                for (int dq = 0; dq < ATTN_CW / 32; dq++) {\n",
    "                    attn_u32 w[4], b[4][2];\n",
    "                    attn_ldmatrix_x4_trans(w, vrow + dq * 32);\n",
    "#pragma unroll\n",
    "                    for (int h = 0; h < 2; h++) {\n",
    "                        attn_codes4_to_f16x2<DT_KV>(attn_prmt(w[2 * h], w[2 * h + 1], 0x6420u), b[2 * h][0], b[2 * h][1]);\n",
    "                        attn_codes4_to_f16x2<DT_KV>(attn_prmt(w[2 * h], w[2 * h + 1], 0x7531u), b[2 * h + 1][0], b[2 * h + 1][1]);\n",
    "                    }\n",
    "#pragma unroll\n",
    "                    for (int r = 0; r < ATTN_RT; r++)\n",
    "#pragma unroll\n",
    "                        for (int i = 0; i < 4; i++) attn_mma16816<ATTN_DT_M>(o[r][4 * dq + i], a[r], b[i]);\n",
    "                }\n",
    "#else\n",
    "#pragma unroll\n",
    "                for (int op = 0; op < ATTN_OT / 2; op++) {\n",
    "                    attn_u32 b[4];\n",
    "                    attn_ldmatrix_x4_trans(b, vrow + op * 32);\n",
    "#pragma unroll\n",
    "                    for (int r = 0; r < ATTN_RT; r++) {\n",
    "                        attn_mma16816<DT>(o[r][2 * op], a[r], b);\n",
    "                        attn_mma16816<DT>(o[r][2 * op + 1], a[r], b + 2);\n",
    "                    }\n",
    "                }\n",
    "#endif\n",
    "            }\n",
    "        }\n",
    "    }\n",
    "\n",
    "    /* ---- epilogue: row sums through shared memory, O / l out ---- */\n",
    "    attn_cp_async_wait<0>();\n",
    "    __syncthreads(); /* the maxima buffer is free */\n",
    "#pragma unroll\n",
    "    for (int r = 0; r < ATTN_RT_S; r++)\n",
    "#pragma unroll\n",
    "        for (int h = 0; h < 2; h++) {\n",
    "            const float l = attn_quad_sum(lS[r][h]);\n",
    "            if (tq == 0) sMax[kg * ROWS + (rg * ATTN_RT_S + r) * 16 + g + 8 * h] = l;\n",
    "        }\n",
    "    __syncthreads();\n",
    "#pragma unroll\n",
    "    for (int r = 0; r < ATTN_RT; r++)\n",
    "#pragma unroll\n",
    "        for (int h = 0; h < 2; h++) {\n",
    "            const int row = r * 16 + g + 8 * h;\n",
    "            float l = 0.0f, mrow = mO[r][h], wsink = 1.0f;\n",
    "#pragma unroll\n",
    "            for (int k = 0; k < ATTN_S_KG; k++) l += sMax[k * ROWS + row];\n",
    "            if (p.sinks && slot < 0 && row < nrows) /* the head's sink, once, where the row is finished */\n",
    "                wsink = attn_softmax_sink(__ldg(p.sinks + head0 + row), mrow, l);\n",
    "            const float inv = l > 0.0f ? wsink * attn_rcp(l) : 0.0f;\n",
    "            const float lse2 = attn_softmax_lse2(mrow, l);\n",
    "            if (row >= nrows) continue;\n",
    "#if ATTN_KV8\n",
    "            { /* o tile n holds columns c(n) + 4 tq and + 2 (the PV phase's order); the scale */\n",
    "                const float f = inv * k_scale * attn_code_factor<DT_KV>();\n",
    "                typedef typename attn_elem<DT>::storage out_t;\n",
    "                out_t *orow = (out_t *)((char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head) * 2);\n",
    "                float *po = p.partial_o + ((attn_i64)(slot < 0 ? 0 : slot) * ROWS + row) * KV_LORA;\n",
    "#pragma unroll\n",
    "                for (int n = 0; n < ATTN_OT; n++) {\n",
    "                    const int col = warp * ATTN_CW + (n >> 2) * 32 + ((n & 2) ? 16 : 0) + (n & 1) + 4 * tq;\n",
    "                    if (slot < 0) {\n",
    "                        orow[col] = attn_elem<DT>::from_f32(o[r][n][2 * h] * f);\n",
    "                        orow[col + 2] = attn_elem<DT>::from_f32(o[r][n][2 * h + 1] * f);\n",
    "                    } else {\n",
    "                        po[col] = o[r][n][2 * h] * f;\n",
    "                        po[col + 2] = o[r][n][2 * h + 1] * f;\n",
    "                    }\n",
    "                }\n",
    "                if (slot < 0 && p.lse && warp == 0 && tq == 0)\n",
    "                    p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] = lse2 * ATTN_LN2;\n",
    "                if (slot >= 0 && warp == 0 && tq == 0) p.partial_lse[(attn_i64)slot * ROWS + row] = lse2;\n",
    "                continue;\n",
    "            }\n",
    "#endif\n",
    "            if (slot < 0) {\n",
    "                char *orow = (char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head) * 2;\n",
    "#pragma unroll\n",
    "                for (int n = 0; n < ATTN_OT; n++)\n",
    "                    *(attn_u32 *)(orow + (warp * ATTN_CW + 8 * n + 2 * tq) * 2) =\n",
    "                        attn_elem<DT>::pack2(o[r][n][2 * h] * inv, o[r][n][2 * h + 1] * inv);\n",
    "                if (p.lse && warp == 0 && tq == 0)\n",
    "                    p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] = lse2 * ATTN_LN2;\n",
    "            } else {\n",
    "                float *po = p.partial_o + ((attn_i64)slot * ROWS + row) * KV_LORA;\n",
    "#pragma unroll\n",
    "                for (int n = 0; n < ATTN_OT; n++) {\n",
    "                    po[warp * ATTN_CW + 8 * n + 2 * tq] = o[r][n][2 * h] * inv;\n",
    "                    po[warp * ATTN_CW + 8 * n + 2 * tq + 1] = o[r][n][2 * h + 1] * inv;\n",
    "                }\n",
    "                if (warp == 0 && tq == 0) p.partial_lse[(attn_i64)slot * ROWS + row] = lse2;\n",
    "            }\n",
    "        }\n",
    "}\n",
    "\n",
    "/* The splits of one (query row, head tile) merged (mla_merge.cuh): grid (>= *num_merge,\n",
    "   ROWS), one CTA per row. */\n",
    "extern \"C\" __global__ void __launch_bounds__(256) attn_mla_merge(const attn__mla_decode_params p) {\n",
    "#if ATTN_KV8\n",
    "    if (attn_cache_scale(p.k_scale, p.k_scale_value) == 0.0f) return; /* the decode wrote nothing: neither does the merge */\n",
    "#endif\n",
    "    attn_mla_merge_kernel(p);\n",
    "}\n",
    0};
static const char *const attn__kernel_src_mla_decode_sm90_cu[] = {
    "/* mla_decode_sm90.cu - MLA absorbed decode on Hopper, sm_90a: warpgroup MMA (wgmma) fed\n",
    "   through the tensor memory accelerator (TMA) in FlashMLA's \"seesaw\" schedule; the\n",
    "   CUDA_MLA_SM90 backend's forward_mqa (and the decode half of its fused attn_mla_forward).\n",
    "   Checked on an H200 against float64 by tests/cuda_kernels.c --mla (random decode batches,\n",
    "   splits, block sizes 16..128, a cache whose unread rows are NaN) and through the backend\n",
    "   by the CUDA MLA suite.\n",
    "\n",
    "   WHAT IT COMPUTES, WORK LIST, SPLITS, params, merge: exactly kernels/mla_decode.cu's (the\n",
    "   mma.sync form, sm_80+, the CUDA_MLA backend's; same attn__mla_decode_params, same work\n",
    "   items, same partial layout with ROWS = 64), for 16-bit latents only, and every split\n",
    "   entry is merged by attn_mla_merge (its own launch; no fused merge).\n",
    "   Work item (8 int32): {req, head0, q_row, -, key0, key1, slot, -}: the 64 heads head0 ..\n",
    "   head0 + 63 (those below num_heads) of query row q_row over keys [key0, key1); slot -1\n",
    "   writes out/lse, slot >= 0 a normalised f32 partial (partial_o[slot][64][KV_LORA],\n",
    "   partial_lse[slot][64] base 2). Merge entry: {q_row, head0, splits, first slot, ...}.\n",
    "   attn_mla_merge, grid (entries, 64), block 256: one CTA per row.\n",
    "\n",
    "   LAUNCH: attn_mla_decode(kv_map, params): the cache's tensor map first (attn.h:\n",
    "   attn__cuda_mla_map, encoded on the host at each forward), 3-D {KV_LORA + ROPE,\n",
    "   BLOCK_SIZE, blocks}, box {64 columns, BOX_ROWS keys, 1 block} (attn_mla_config's\n",
    "   tma_box_rows), 128-byte swizzle; grid >= *num_work, 256 threads, attn_mla_config's\n",
    "   dynamic shared memory. SPARSE: the same map with box rows 1, grid (tokens, head tiles,\n",
    "   splits); SPARSE_TMA 0: attn_mla_decode(params) alone (tma_box_rows 0).\n",
    "\n",
    "   =====================================================================================\n",
    "   INSIDE A CTA\n",
    "   =====================================================================================\n",
    "   256 threads: two warpgroups C0 and C1, 64 query rows (heads head0 .. head0 + 63 of one\n",
    "   token: one wgmma M). Shared memory, 1024-aligned, 128B-swizzled:\n",
    "       [Q: 64 x D][slot 0: 64 keys x D][slot 1: 64 keys x D][4 mbarriers][m: 2 x 64 f32][l: 2 x 64 f32]\n",
    "   = 216 KiB + 1.1 KiB + 1 KiB slack at D = 576 (KV_LORA 512), 120 KiB at D = 320.\n",
    "   A slot is D / 64 panels of 64 keys x 64 columns (8 KiB). Keys are taken two 64-key tiles\n",
    "   at a time (a pair): tile 2i in slot 0, tile 2i + 1 in slot 1. The output O = [O_L | O_R]\n",
    "   (64 x KV_LORA f32) is split by columns: C0 holds O_L, C1 holds O_R (128 registers each at\n",
    "   KV_LORA 512).\n",
    "\n",
    "   Per pair (FlashMLA's seesaw: one O, the two halves of V, S of one tile each):\n",
    "     C0: S0 = Q K0^T (wgmma m64n64, all D) -> row max -> m0 = max(m, max S0) to shared memory\n",
    "         [M0] -> P0 = 2^(S0 - m0) into slot 0's rope panel [P0] -> O_L = a0 O_L + P0 V0_L\n",
    "         -> [M1] -> O_L = a1 O_L + P1 V1_L\n",
    "     C1: S1 = Q K1^T -> row max -> [M0] m1 = max(m0, max S1) [M1] -> P1 into slot 1's rope\n",
    "         panel [P1] -> [P0] O_R = a0 O_R + P0 V0_R -> O_R = a1 O_R + P1 V1_R\n",
    "   [X] are one-way named barriers (bar.arrive by the writer, bar.sync by the reader; what the\n",
    "   writer put in shared memory is published by them). C0's softmax runs under C1's S, C1's\n",
    "   under C0's P V. A P V takes P as register fragments: a warpgroup's own P from its S\n",
    "   accumulators, the other's read from the rope panel (ld.shared). Both warpgroups run the\n",
    "   same wgmma instructions with operands chosen by value: a wgmma under a branch on the\n",
    "   warpgroup makes ptxas serialize all of them (C7520).\n",
    "   The rope panel (64 columns) of a slot is read only by its tile's S, so after that S the\n",
    "   tile's P (64 x 64 16-bit, 8 KiB) is written over it: the P buffers cost no memory.\n",
    "\n",
    "   Loads (TMA, completing on a full mbarrier per group; no producer warp): each slot is two\n",
    "   groups, refilled with the next pair's tile by the warpgroup that reads the group last, as\n",
    "   soon as it is done with it (a warpgroup barrier, then one thread issues the boxes):\n",
    "       slot 0: A0 = panels [0, NL/2)          C0 refills it after O_L += P0 V0_L\n",
    "               B0 = panels [NL/2, D/64)       C1 refills it after O_R += P0 V0_R (P0 read)\n",
    "       slot 1: A1 = panels [0, NL/2) + rope   C0 refills it after O_L += P1 V1_L (P1 read)\n",
    "               B1 = panels [NL/2, NL)         C1 refills it after O_R += P1 V1_R\n",
    "   (NL = KV_LORA / 64.) The other warpgroup's reads of a group are done before the refill:\n",
    "   C0's S0 reads B0 before [M0], which C1 waited for; C1's S1 reads A1 before [M1]. S waits\n",
    "   for each group's full barrier before its panels, so it starts when the first half has\n",
    "   landed. Boxes hold keys of one block: BOX_ROWS = 64 where BLOCK_SIZE is a multiple of 64,\n",
    "   BLOCK_SIZE where it divides 64, 16 otherwise (BLOCK_SIZE is a multiple of 16). Boxes with no key in [key0, key1) are not loaded (their\n",
    "   rows keep stale bytes); a tile that reaches past [key0, key1) (an edge tile, or the\n",
    "   missing second tile of an odd count) has its V rows outside the range zeroed by the\n",
    "   warpgroup that owns the slot, before any P V reads them (0 x a stale NaN would be NaN);\n",
    "   the scores of those keys are masked to -inf.\n",
    "\n",
    "   Epilogue: row sums of both warpgroups through shared memory; O / l out (or the\n",
    "   normalised f32 partial); lse by C0.\n",
    "\n",
    "   =====================================================================================\n",
    "   SPARSE 1: DeepSeek-V3.2's sparse MLA (attn_mla_forward_sparse), 16-bit latents\n",
    "   =====================================================================================\n",
    "   The grid, keys, splits, slots and sinks of kernels/mla_decode.cu's SPARSE (CTA (t, y, z):\n",
    "   heads 64 y .. of batch token t over entries [z c, z c + c) of its indices row, an entry\n",
    "   naming a position of the token's request, -1 or out of [0, seq_len) skipped; one split\n",
    "   writes out/lse with the sink joined, more write slot (t gridDim.y + y) splits + z for\n",
    "   attn_mla_merge), on the seesaw above. The \"keys\" of a tile are 64 entries. A tensor map\n",
    "   cannot gather rows by index on sm_90, so each row comes in one-row boxes (box rows 1 of\n",
    "   LAUNCH's map, at (column 64 c, the position's row in its block, its block)), one per panel\n",
    "   of the group: thread u of the warpgroup that would have issued the group's boxes issues\n",
    "   row u / 2's panels i with i % 2 = u % 2, its issuer expects the group's 64 x panels x 128\n",
    "   bytes. The swizzle follows the shared address (a row lands at row r of a 1024-aligned\n",
    "   panel as a 64-row box would put it). An entry that names no row loads block -1: outside\n",
    "   the map, so TMA fills zeros (its V row is 0) and still counts the bytes; its score is\n",
    "   masked. A row's box coordinates take two dependent loads, both made during the pair\n",
    "   before its copies: the entry at the top of the pair, its block-table row under the S\n",
    "   wgmma. The S owner's mask is a ballot of its tile's entries, loaded a pair ahead.\n",
    "   SPARSE_TMA 0 copies by cp.async instead (16-byte pieces into the swizzled slots, one\n",
    "   cp.async arrival per thread on the group's barrier, a proxy fence after each wait):\n",
    "   correct, but held to ~10 GB/s an SM by the cp.async in flight (docs/PERF.md). */\n",
    "#include \"wgmma.cuh\"\n",
    "#include \"hopper.cuh\"\n",
    "#include \"mla_common.cuh\" /* attn__mla_decode_params */\n",
    "\n",
    "#if !defined(KV_LORA) || !defined(ROPE) || !defined(BLOCK_SIZE) || !defined(DT)\n",
    "#error \"mla_decode_sm90.cu: define KV_LORA, ROPE, BLOCK_SIZE and DT\"\n",
    "#endif\n",
    "#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16\n",
    "#error \"mla_decode_sm90.cu: DT must be 1 (f16) or 2 (bf16)\"\n",
    "#endif\n",
    "#if KV_LORA != 512 && KV_LORA != 256\n",
    "#error \"mla_decode_sm90.cu: KV_LORA must be 512 or 256\"\n",
    "#endif\n",
    "#if ROPE != 64\n",
    "#error \"mla_decode_sm90.cu: ROPE must be 64\"\n",
    "#endif\n",
    "#if BLOCK_SIZE % 16 || BLOCK_SIZE <= 0\n",
    "#error \"mla_decode_sm90.cu: BLOCK_SIZE must be a positive multiple of 16\"\n",
    "#endif\n",
    "#ifdef ROWS\n",
    "#error \"mla_decode_sm90.cu: ROWS is always 64 (one wgmma M); do not define it\"\n",
    "#endif\n",
    "#define ROWS 64\n",
    "#include \"mla_merge.cuh\" /* attn_mla_merge_kernel */\n",
    "#if defined(FUSED_MERGE) && FUSED_MERGE\n",
    "#error \"mla_decode_sm90.cu: no fused merge (attn_mla_merge merges every split)\"\n",
    "#endif\n",
    "#ifndef EVICT_FIRST\n",
    "#define EVICT_FIRST 1 /* tuning: the latent tiles are loaded with an L2 evict-first policy (0: the default\n",
    "                         policy; 1 measured 0-5 % faster on the H200, docs/PERF.md) */\n",
    "#endif\n",
    "#ifndef SPARSE\n",
    "#define SPARSE 0 /* 1: the index-gathered decode (SPARSE 1 above); no tensor map */\n",
    "#endif\n",
    "#ifndef SPARSE_TMA\n",
    "#define SPARSE_TMA 1 /* SPARSE: 1 each row's panels by TMA (one-row boxes, the map of LAUNCH with box\n",
    "                        rows 1); 0 by cp.async (16-byte pieces); 2 half of each by either (H200,\n",
    "                        128 heads, batch 128: 245 / 166 / 220 TFLOP/s, docs/PERF.md) */\n",
    "#endif\n",
    "#define ATTN_MLA_MAPPED (!SPARSE || SPARSE_TMA) /* the kernel takes the cache's tensor map */\n",
    "#ifndef SPARSE_L2_AHEAD\n",
    "#define SPARSE_L2_AHEAD 0 /* SPARSE tuning: 1 C0 prefetches the rows of the pair after next into L2 (one\n",
    "                             bulk prefetch a row; H200: 242 -> 223 TFLOP/s, docs/PERF.md) */\n",
    "#endif\n",
    "#ifndef SPARSE_FENCE\n",
    "#define SPARSE_FENCE 1 /* 1: a reader of gathered bytes issues the proxy fence after its wait */\n",
    "#endif\n",
    "#ifndef SPARSE_PROBE\n",
    "#define SPARSE_PROBE 0 /* diagnosis only, wrong results: 1 gathers rows 0..63 of the cache for every tile\n",
    "                          (contiguous), 2 copies nothing (arrives at once) */\n",
    "#endif\n",
    "#ifndef SPLIT_WAIT\n",
    "#define SPLIT_WAIT 1 /* tuning: 1 S starts on a slot's first group and waits for the second halfway;\n",
    "                        0 S waits for both first */\n",
    "#endif\n",
    "\n",
    "struct attn_mla_seesaw {\n",
    "    static constexpr int d = KV_LORA + ROPE, np = d / 64, nl = KV_LORA / 64, nh = nl / 2;\n",
    "    static constexpr int cw = KV_LORA / 2, o_regs = cw / 2;  /* columns of O per warpgroup, its registers */\n",
    "    static constexpr int rope = nl;                          /* the rope panel: P after S */\n",
    "    static constexpr int panel = 64 * 128;                   /* 64 rows x 64 columns, 8 KiB */\n",
    "    static constexpr int box_rows = BLOCK_SIZE % 64 == 0 ? 64 : 64 % BLOCK_SIZE == 0 ? BLOCK_SIZE : 16;\n",
    "    static constexpr int pieces = 64 / box_rows;             /* boxes per tile and panel */\n",
    "    static constexpr int slot_bytes = np * panel;\n",
    "    static constexpr int q_off = 0, slot_off = np * panel, bar_off = slot_off + 2 * slot_bytes;\n",
    "    static constexpr int m_off = bar_off + 32, l_off = m_off + 2 * 64 * 4;\n",
    "    static constexpr int smem_bytes = l_off + 2 * 64 * 4 + 1024; /* + the slack that aligns the base */\n",
    "    static constexpr int threads = 256;\n",
    "    static_assert(smem_bytes <= 227 * 1024, \"mla_decode_sm90.cu: shared memory over 227 KiB\");\n",
    "};\n",
    "typedef attn_mla_seesaw MW;\n",
    "\n",
    "/* named barriers (id 0 is __syncthreads): 1 both warpgroups; 2..5 the one-way signals M0,\n",
    "   M1, P0, P1 (C0 -> C1, C1 -> C0, C0 -> C1, C1 -> C0); 6, 7 one warpgroup */\n",
    "#define ATTN_NB_BOTH 1\n",
    "#define ATTN_NB_M0 2\n",
    "#define ATTN_NB_M1 3\n",
    "#define ATTN_NB_P0 4\n",
    "#define ATTN_NB_P1 5\n",
    "#define ATTN_NB_WG 6\n",
    "\n",
    "extern \"C\" __constant__ attn__launch_config attn_mla_config = {MW::threads, MW::smem_bytes, 64, ROWS, 1, 2, 8, 1,\n",
    "                                                                SPARSE ? (SPARSE_TMA ? 1 : 0) : MW::box_rows};\n",
    "\n",
    "/* group g (0 A0, 1 B0, 2 A1, 3 B1): its panels (A1 carries slot 1's rope panel) */\n",
    "ATTN_DEV constexpr int attn_mla_seesaw_group_count(int g) {\n",
    "    return g == 0 ? MW::nh : g == 1 ? MW::np - MW::nh : g == 2 ? MW::nh + 1 : MW::nl - MW::nh;\n",
    "}\n",
    "ATTN_DEV constexpr int attn_mla_seesaw_group_panel(int g, int i) {\n",
    "    return g == 0 ? i : g == 1 ? MW::nh + i : g == 2 ? (i < MW::nh ? i : MW::rope) : MW::nh + i;\n",
    "}\n",
    "\n",
    "/* The boxes of group g of tile t (keys kt .. kt + 63) that hold a key in [key0, key1), into\n",
    "   slot `dst`, completing on `bar`; blk[j]: the block of piece j (read before). One thread. */\n",
    "ATTN_DEV void attn_mla_seesaw_fill(const attn_tma_map *map, int g, attn_u32 dst, attn_u32 bar, int kt, int key0, int key1,\n",
    "                               const int (&blk)[MW::pieces], int valid) {\n",
    "    int nb = 0;\n",
    "#pragma unroll\n",
    "    for (int j = 0; j < MW::pieces; j++) nb += valid && kt + (j + 1) * MW::box_rows > key0 && kt + j * MW::box_rows < key1;\n",
    "    attn_mbar_arrive_expect_tx(bar, (unsigned)(nb * attn_mla_seesaw_group_count(g) * MW::box_rows * 128));\n",
    "#pragma unroll\n",
    "    for (int j = 0; j < MW::pieces; j++) {\n",
    "        const int k = kt + j * MW::box_rows;\n",
    "        if (!(valid && k + MW::box_rows > key0 && k < key1)) continue;\n",
    "        const int row = (int)((unsigned)k % BLOCK_SIZE);\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < attn_mla_seesaw_group_count(g); i++) {\n",
    "            const int c = attn_mla_seesaw_group_panel(g, i);\n",
    "            if (EVICT_FIRST)\n",
    "                attn_tma_load_3d_hint(dst + (attn_u32)(c * MW::panel + j * MW::box_rows * 128), map, 64 * c, row, blk[j], bar,\n",
    "                                      attn_l2_evict_first_policy());\n",
    "            else\n",
    "                attn_tma_load_3d(dst + (attn_u32)(c * MW::panel + j * MW::box_rows * 128), map, 64 * c, row, blk[j], bar);\n",
    "        }\n",
    "    }\n",
    "}\n",
    "\n",
    "/* the blocks of tile t's pieces (0 for pieces out of [key0, key1) or past the tiles) */\n",
    "ATTN_DEV void attn_mla_seesaw_blocks(int (&blk)[MW::pieces], const int *bt, int kt, int key0, int key1) {\n",
    "#pragma unroll\n",
    "    for (int j = 0; j < MW::pieces; j++) {\n",
    "        const int k = kt + j * MW::box_rows;\n",
    "        blk[j] = k + MW::box_rows > key0 && k < key1 ? bt[(unsigned)k / BLOCK_SIZE] : 0;\n",
    "    }\n",
    "}\n",
    "\n",
    "/* P (64 x 64, 16-bit, K-major swizzled at `panel`) as this thread's A fragments of the four\n",
    "   k16 steps (wgmma.cuh's A layout: rows row_a, row_a + 8; columns 16 j + 2 tq (+8)) */\n",
    "ATTN_DEV void attn_mla_seesaw_load_p(attn_u32 (&pf)[4][4], const char *panel, int row_a, int tq) {\n",
    "#pragma unroll\n",
    "    for (int j = 0; j < 4; j++)\n",
    "#pragma unroll\n",
    "        for (int x = 0; x < 4; x++) {\n",
    "            const int row = row_a + 8 * (x & 1), col = 16 * j + 2 * tq + 8 * (x >> 1);\n",
    "            pf[j][x] = *(const attn_u32 *)(panel + attn_wgmma_swizzle_offset<64>(row, col >> 3) + (col & 7) * 2);\n",
    "        }\n",
    "}\n",
    "\n",
    "#if !ATTN_MLA_MAPPED\n",
    "extern \"C\" __global__ void __launch_bounds__(MW::threads, 1) attn_mla_decode(const attn__mla_decode_params p) {\n",
    "#else\n",
    "extern \"C\" __global__ void __launch_bounds__(MW::threads, 1)\n",
    "    attn_mla_decode(const __grid_constant__ attn_tma_map kv_map, const attn__mla_decode_params p) {\n",
    "#endif\n",
    "    extern __shared__ attn_vec16 attn_smem[];\n",
    "    if (blockDim.x != MW::threads || attn_dynamic_smem_size() < MW::smem_bytes) attn_trap();\n",
    "    if ((int)blockIdx.x >= *p.num_work) return;\n",
    "#if SPARSE\n",
    "    const int nsplit = p.num_work[1], z = (int)blockIdx.z; /* the build's splits of each token's entries */\n",
    "    if (z >= nsplit) return;\n",
    "    const int chunk = (p.topk + nsplit - 1) / nsplit;\n",
    "    const int q_row = (int)blockIdx.x, head0 = (int)blockIdx.y * ROWS;\n",
    "    const int key0 = attn_imin(p.topk, z * chunk), key1 = attn_imin(p.topk, key0 + chunk);\n",
    "    const int slot = nsplit > 1 ? (q_row * (int)gridDim.y + (int)blockIdx.y) * nsplit + z : -1;\n",
    "    const int req = __ldg(p.token_req + q_row), seq_len = __ldg(p.seq_lens + req);\n",
    "    const int *const ix = p.indices + (attn_i64)q_row * p.indices_stride;\n",
    "#else\n",
    "    const int *item = p.work + 8 * (attn_i64)blockIdx.x;\n",
    "    const int req = item[0], head0 = item[1], q_row = item[2], slot = item[6];\n",
    "    const int key0 = item[4], key1 = item[5];\n",
    "#endif\n",
    "    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;\n",
    "    const int g = lane >> 2, tq = lane & 3;\n",
    "    const int c1 = __all_sync(0xffffffffu, wg == 1); /* wg, as a value ptxas knows is warp-uniform */\n",
    "    const int issuer = (tid & 127) == 0;            /* the thread of each warpgroup that issues its refills */\n",
    "    const attn_u32 smem0 = attn_smem_addr(attn_smem);\n",
    "    const attn_u32 base = (smem0 + 1023u) & ~1023u;\n",
    "    char *const smem = (char *)attn_smem + (base - smem0);\n",
    "    const attn_u32 sQ = base + MW::q_off, sS0 = base + MW::slot_off, sS1 = sS0 + MW::slot_bytes;\n",
    "    const attn_u32 full = base + MW::bar_off; /* [4]: A0 B0 A1 B1 */\n",
    "    float *const sM = (float *)(smem + MW::m_off); /* [2][64]: m after tile 2i (C0), after 2i + 1 (C1) */\n",
    "    float *const sL = (float *)(smem + MW::l_off);\n",
    "    const int *bt = p.block_table + (attn_i64)req * p.block_table_stride;\n",
    "    const int tile0 = key1 > key0 ? key0 / 64 * 64 : 0;\n",
    "    const int ntiles = key1 > key0 ? (key1 - tile0 + 63) / 64 : 0;\n",
    "    const int npairs = (ntiles + 1) / 2;\n",
    "    const int nrows = attn_imin(ROWS, p.num_heads - head0);\n",
    "    const int row_a = 16 * (warp & 3) + g; /* this thread's accumulator rows: row_a, row_a + 8 */\n",
    "#if SPARSE\n",
    "    const int grow = (tid & 127) >> 1; /* the row of a tile this thread gathers */\n",
    "    /* entry j's position in the request; -1 outside [key0, key1) or naming none */\n",
    "    auto entry = [&](int j) -> int {\n",
    "        const int x = j >= key0 && j < key1 ? __ldg(ix + j) : -1;\n",
    "        return x >= 0 && x < seq_len ? x : -1;\n",
    "    };\n",
    "    /* where position x's cache row is: block << 32 | row in the block (block -1: none) */\n",
    "    auto row_of = [&](int x) -> attn_i64 {\n",
    "        return x < 0 ? (attn_i64)((attn_u64)0xffffffffu << 32)\n",
    "                     : (attn_i64)(((attn_u64)(attn_u32)__ldg(bt + (unsigned)x / BLOCK_SIZE) << 32) | ((unsigned)x % BLOCK_SIZE));\n",
    "    };\n",
    "    /* the row of row_of's `at` in the cache (NULL: none) */\n",
    "    auto row_ptr = [&](attn_i64 at) -> const char * {\n",
    "        const int blk = (int)(at >> 32), row = (int)(at & 0xffffffff);\n",
    "        return blk < 0 ? NULL : (const char *)p.kv_cache + ((attn_i64)blk * BLOCK_SIZE + row) * (MW::d * 2);\n",
    "    };\n",
    "    /* this thread's 16-byte chunks 2 k + tid % 2 of panels i = first, first + step, .. of group\n",
    "       g of the row `src` (zeros for NULL) into `slot_at`, by cp.async */\n",
    "    auto copy_panels = [&](int g, attn_u32 slot_at, const char *src, int first, int step) {\n",
    "#pragma unroll\n",
    "        for (int i = first; i < MW::nh + 1; i += step) {\n",
    "            if (i >= attn_mla_seesaw_group_count(g)) break;\n",
    "            const int c = attn_mla_seesaw_group_panel(g, i);\n",
    "#pragma unroll\n",
    "            for (int k = 0; k < 4; k++) {\n",
    "                const int ch = 2 * k + (tid & 1);\n",
    "                attn_cp_async16_or_zero(slot_at + (attn_u32)(c * MW::panel) + attn_wgmma_swizzle_offset<64>(grow, ch),\n",
    "                                        (src ? src : (const char *)p.kv_cache) + (64 * c + 8 * ch) * 2, !src);\n",
    "            }\n",
    "        }\n",
    "    };\n",
    "#if SPARSE_TMA\n",
    "    /* this thread's share of group g of a tile into `slot_at`, on the group's full barrier:\n",
    "       SPARSE_TMA 1, its row's panels i with i % 2 = tid % 2 as one-row boxes at (block, row)\n",
    "       (block -1: outside the map, zeros; every box counts its bytes); 2, the even panels so\n",
    "       (i % 4 = 2 (tid % 2)) and the odd ones by cp.async (chunks 2 k + tid % 2, zeros for\n",
    "       block -1), then a cp.async arrival. Each thread arrives expecting its own boxes' bytes. */\n",
    "    auto gather = [&](int g, attn_u32 slot_at, attn_i64 at) {\n",
    "        const int blk = (int)(at >> 32), row = (int)(at & 0xffffffff), h = tid & 1;\n",
    "        const attn_u32 bar = full + 8 * g;\n",
    "        int mine = 0;\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < MW::nh + 1; i++)\n",
    "            mine += i < attn_mla_seesaw_group_count(g) && (SPARSE_TMA == 1 ? (i & 1) == h : (i & 3) == 2 * h);\n",
    "        attn_mbar_arrive_expect_tx(bar, (unsigned)(mine * 128));\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < MW::nh + 1; i++) {\n",
    "            if (i >= attn_mla_seesaw_group_count(g)) break;\n",
    "            if (SPARSE_TMA == 1 ? (i & 1) != h : (i & 3) != 2 * h) continue;\n",
    "            const int c = attn_mla_seesaw_group_panel(g, i);\n",
    "            attn_tma_load_3d(slot_at + (attn_u32)(c * MW::panel + grow * 128), &kv_map, 64 * c, row, blk, bar);\n",
    "        }\n",
    "#if SPARSE_TMA == 2\n",
    "        copy_panels(g, slot_at, row_ptr(at), 1, 2);\n",
    "        attn_cp_async_mbar_arrive(bar);\n",
    "#endif\n",
    "    };\n",
    "#else\n",
    "    /* this thread's share of group g of a tile into `slot_at` (its row, row_of's `at`,\n",
    "       zeros for none), then its arrival on the group's full barrier once the copies land */\n",
    "    auto gather = [&](int g, attn_u32 slot_at, attn_i64 at) {\n",
    "        if (SPARSE_PROBE == 2) {\n",
    "            attn_mbar_arrive(full + 8 * g);\n",
    "            return;\n",
    "        }\n",
    "        copy_panels(g, slot_at, SPARSE_PROBE == 1 ? (const char *)p.kv_cache + grow * (MW::d * 2) : row_ptr(at), 0, 1);\n",
    "        attn_cp_async_mbar_arrive(full + 8 * g);\n",
    "    };\n",
    "#endif\n",
    "#endif\n",
    "\n",
    "    if (tid == 0) {\n",
    "        for (int i = 0; i < 4; i++) attn_mbar_init(full + 8 * i, !SPARSE ? 1 : SPARSE_TMA == 2 ? 256 : 128);\n",
    "        attn_mbar_init_fence();\n",
    "    }\n",
    "    __syncthreads(); /* the barriers */\n",
    "#if !SPARSE\n",
    "    if (tid == 0 && npairs > 0) { /* pair 0, all four groups */\n",
    "        int b0[MW::pieces], b1[MW::pieces];\n",
    "        attn_tma_prefetch_map(&kv_map);\n",
    "        attn_mla_seesaw_blocks(b0, bt, tile0, key0, key1);\n",
    "        attn_mla_seesaw_blocks(b1, bt, tile0 + 64, key0, key1);\n",
    "        attn_mla_seesaw_fill(&kv_map, 0, sS0, full + 0, tile0, key0, key1, b0, 1);\n",
    "        attn_mla_seesaw_fill(&kv_map, 1, sS0, full + 8, tile0, key0, key1, b0, 1);\n",
    "        attn_mla_seesaw_fill(&kv_map, 2, sS1, full + 16, tile0 + 64, key0, key1, b1, ntiles > 1);\n",
    "        attn_mla_seesaw_fill(&kv_map, 3, sS1, full + 24, tile0 + 64, key0, key1, b1, ntiles > 1);\n",
    "    }\n",
    "#endif\n",
    "\n",
    "    /* Q rows: [q_latent | q_pe], zero past num_heads */\n",
    "    for (int c = tid; c < ROWS * (MW::d / 8); c += MW::threads) {\n",
    "        const int r = c / (MW::d / 8), col = c - r * (MW::d / 8);\n",
    "        const int valid = r < nrows;\n",
    "        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,\n",
    "                                                   p.q_pe_stride_head, KV_LORA, q_row, head0 + r, col)\n",
    "                                : (const char *)p.q;\n",
    "        attn_cp_async16_or_zero(sQ + attn_wgmma_swizzle_offset<ROWS>(r, col), src, !valid);\n",
    "    }\n",
    "    attn_cp_async_commit();\n",
    "#if SPARSE\n",
    "    if (npairs > 0) { /* pair 0: C0 gathers A0 and A1, C1 B0 and B1 (not committed: Q's wait below is Q's alone) */\n",
    "        gather(c1, sS0, row_of(entry(tile0 + grow)));\n",
    "        gather(2 + c1, sS1, row_of(entry(tile0 + 64 + grow)));\n",
    "    }\n",
    "#endif\n",
    "    attn_cp_async_wait<0>();\n",
    "    attn_fence_proxy_async(); /* Q is read by wgmma (the async proxy) */\n",
    "    __syncthreads();\n",
    "\n",
    "    const float qk_scale = p.scale * ATTN_LOG2E;\n",
    "    const attn_u32 mine = c1 ? sS1 : sS0; /* the slot of this warpgroup's S */\n",
    "    const attn_u32 fullA = full + 16 * c1, fullB = fullA + 8;\n",
    "    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};\n",
    "    float o[MW::o_regs];\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < MW::o_regs; i++) o[i] = 0.0f;\n",
    "    attn_u32 pown[4][4], pf[4][4]; /* this warpgroup's P as A fragments; the P of the P V issued next */\n",
    "#if !SPARSE\n",
    "    int nblk = 0;                  /* a block of the pair the refills load (lane j: piece j % pieces of tile j / pieces) */\n",
    "#endif\n",
    "    /* pf = this warpgroup's own P */\n",
    "    auto own_p = [&]() {\n",
    "#pragma unroll\n",
    "        for (int j = 0; j < 4; j++)\n",
    "#pragma unroll\n",
    "            for (int x = 0; x < 4; x++) pf[j][x] = pown[j][x];\n",
    "    };\n",
    "    /* O = a O + pf V over this warpgroup's half of the V in `slot_at`, issued and committed\n",
    "       (both warpgroups run these same wgmma; the caller waits) */\n",
    "    auto pv = [&](attn_u32 slot_at, const float (&a)[2]) {\n",
    "        attn_wgmma_scale_rows(o, a[0], a[1]);\n",
    "        attn_wgmma_fence();\n",
    "#pragma unroll\n",
    "        for (int j = 0; j < 4; j++)\n",
    "            attn_wgmma<MW::cw, DT>::template rs<1>(o, pf[j], attn_wgmma_desc_mn_major<64>(slot_at + (attn_u32)(c1 * MW::nh * MW::panel), 16 * j), 1);\n",
    "        attn_wgmma_commit();\n",
    "    };\n",
    "    /* the warpgroup is done with group g of `slot_at`: its issuer refills it with tile `ktile`\n",
    "       of the next pair (blocks from lanes first .. first + pieces - 1) */\n",
    "#if SPARSE\n",
    "    auto refill = [&](int g, attn_u32 slot_at, attn_i64 off, int next) {\n",
    "        attn_named_barrier(ATTN_NB_WG + wg, 128);\n",
    "        if (next) gather(g, slot_at, off);\n",
    "    };\n",
    "    (void)issuer; /* (every thread of the warpgroup issues its own copies) */\n",
    "#else\n",
    "    auto refill = [&](int g, attn_u32 slot_at, int first, int ktile, int valid, int next) {\n",
    "        int blk[MW::pieces];\n",
    "        attn_named_barrier(ATTN_NB_WG + wg, 128);\n",
    "#pragma unroll\n",
    "        for (int j = 0; j < MW::pieces; j++) blk[j] = __shfl_sync(0xffffffffu, nblk, first + j);\n",
    "        if (issuer && next) attn_mla_seesaw_fill(&kv_map, g, slot_at, full + 8 * g, ktile, key0, key1, blk, valid);\n",
    "    };\n",
    "#endif\n",
    "\n",
    "#if SPARSE\n",
    "    int me0 = entry(tile0 + 64 * c1 + lane), me1 = entry(tile0 + 64 * c1 + 32 + lane); /* pair 0's mask entries */\n",
    "    /* position x's cache row into L2, ahead of its boxes */\n",
    "    auto prefetch_row = [&](int x) {\n",
    "        if (x >= 0) attn_prefetch_l2_bulk(row_ptr(row_of(x)), (unsigned)(MW::d * 2));\n",
    "    };\n",
    "    if (SPARSE_L2_AHEAD && !c1 && npairs > 1) prefetch_row(entry(tile0 + 128 + 64 * (tid & 1) + grow)); /* pair 1's rows */\n",
    "#endif\n",
    "    for (int pr = 0; pr < npairs; pr++) {\n",
    "        const unsigned ph = (unsigned)(pr & 1);\n",
    "        const int kt = tile0 + 64 * (2 * pr + c1); /* this warpgroup's tile */\n",
    "        const int next = pr + 1 < npairs, kn = tile0 + 128 * (pr + 1);\n",
    "#if SPARSE\n",
    "        /* the next pair's positions of this thread's rows (their cache rows are looked up under\n",
    "           the S wgmma), and which of this warpgroup's tile's entries name a row */\n",
    "        int xa = -1, xb = -1, xp = -1; /* xp: C0's row of the pair after next (tile A for even tid, B for odd) */\n",
    "        if (SPARSE_L2_AHEAD && !c1 && pr + 2 < npairs) xp = entry(tile0 + 128 * (pr + 2) + 64 * (tid & 1) + grow);\n",
    "        if (next) {\n",
    "            xa = entry(kn + grow);\n",
    "            xb = entry(kn + 64 + grow);\n",
    "        }\n",
    "        const unsigned vm0 = __ballot_sync(0xffffffffu, me0 >= 0), vm1 = __ballot_sync(0xffffffffu, me1 >= 0);\n",
    "        if (next) { /* the entries of this warpgroup's tile of the next pair, for its mask */\n",
    "            me0 = entry(kt + 128 + lane);\n",
    "            me1 = entry(kt + 160 + lane);\n",
    "        }\n",
    "#else\n",
    "        /* the next pair's blocks, read now, handed to the issuer with shuffles when it refills */\n",
    "        nblk = 0;\n",
    "        if (next && lane < 2 * MW::pieces) {\n",
    "            const int k = kn + 64 * (lane / MW::pieces) + (lane % MW::pieces) * MW::box_rows;\n",
    "            if (k + MW::box_rows > key0 && k < key1) nblk = bt[(unsigned)k / BLOCK_SIZE];\n",
    "        }\n",
    "#endif\n",
    "\n",
    "        /* ---- S = Q K^T over this warpgroup's tile. The same order for both: panels 0 .. nh-1\n",
    "           (A0 / A1), nh .. nl-1 (B0 / B1), then the rope panel (in B0 for C0, A1 for C1: waited\n",
    "           for by then either way) ---- */\n",
    "        float s[32];\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < 32; i++) s[i] = 0.0f;\n",
    "        /* the shared addresses of Q and the slot, opaque to the compiler here: otherwise it\n",
    "           hoists all 72 loop-invariant descriptors out of the pair loop (144 registers) */\n",
    "        attn_u32 q_at, k_at;\n",
    "        asm volatile(\"mov.b32 %0, %1;\" : \"=r\"(q_at) : \"r\"(sQ));\n",
    "        asm volatile(\"mov.b32 %0, %1;\" : \"=r\"(k_at) : \"r\"(mine));\n",
    "        attn_mbar_wait(fullA, ph);\n",
    "        if (!SPLIT_WAIT) attn_mbar_wait(fullB, ph);\n",
    "        if (SPARSE && SPARSE_TMA != 1 && SPARSE_FENCE) attn_fence_proxy_async(); /* the gathered bytes, to wgmma */\n",
    "        attn_wgmma_fence();\n",
    "#pragma unroll\n",
    "        for (int c = 0; c < MW::nh; c++)\n",
    "#pragma unroll\n",
    "            for (int k = 0; k < 64; k += 16)\n",
    "                attn_wgmma<64, DT>::template ss<0>(s, attn_wgmma_desc_k_major<ROWS>(q_at, 64 * c + k),\n",
    "                                                   attn_wgmma_desc_k_major<64>(k_at, 64 * c + k), 1);\n",
    "        if (SPLIT_WAIT) {\n",
    "            attn_mbar_wait(fullB, ph);\n",
    "            if (SPARSE && SPARSE_TMA != 1 && SPARSE_FENCE) attn_fence_proxy_async();\n",
    "            attn_wgmma_fence(); /* after a branch among the wgmma: ptxas would put one here itself (C7519) */\n",
    "        }\n",
    "#pragma unroll\n",
    "        for (int c = MW::nh; c < MW::np; c++)\n",
    "#pragma unroll\n",
    "            for (int k = 0; k < 64; k += 16)\n",
    "                attn_wgmma<64, DT>::template ss<0>(s, attn_wgmma_desc_k_major<ROWS>(q_at, 64 * c + k),\n",
    "                                                   attn_wgmma_desc_k_major<64>(k_at, 64 * c + k), 1);\n",
    "        attn_wgmma_commit();\n",
    "#if SPARSE\n",
    "        const attn_i64 offa = row_of(xa), offb = row_of(xb); /* under the S wgmma */\n",
    "        if (SPARSE_L2_AHEAD) prefetch_row(xp);\n",
    "#endif\n",
    "        attn_wgmma_wait<0>();\n",
    "        attn_wgmma_fence_acc(s);\n",
    "\n",
    "        /* ---- mask to [key0, key1); the tile's row maxima; m0 (C0 -> C1), m1 (C1 -> C0) ---- */\n",
    "        float mx[2] = {attn_neg_inf(), attn_neg_inf()};\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < 8; i++)\n",
    "#pragma unroll\n",
    "            for (int e = 0; e < 4; e++) {\n",
    "                const int j = 8 * i + 2 * tq + (e & 1);\n",
    "#if SPARSE\n",
    "                const int seen = (int)(((j < 32 ? vm0 : vm1) >> (j & 31)) & 1u);\n",
    "#else\n",
    "                const int seen = kt + j >= key0 && kt + j < key1;\n",
    "#endif\n",
    "                const float x = seen ? s[4 * i + e] : attn_neg_inf();\n",
    "                s[4 * i + e] = x;\n",
    "                mx[e >> 1] = fmaxf(mx[e >> 1], x);\n",
    "            }\n",
    "        float alpha0[2], alpha1[2] = {1.0f, 1.0f}, b[2];\n",
    "#pragma unroll\n",
    "        for (int h = 0; h < 2; h++) mx[h] = attn_quad_max(mx[h]) * qk_scale;\n",
    "        if (!c1) {\n",
    "#pragma unroll\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                b[h] = attn_softmax_rebase(m[h], mx[h], alpha0[h]);\n",
    "                if (tq == 0) sM[row_a + 8 * h] = m[h];\n",
    "            }\n",
    "            attn_named_barrier_arrive(ATTN_NB_M0, MW::threads);\n",
    "        } else {\n",
    "            attn_named_barrier(ATTN_NB_M0, MW::threads);\n",
    "#pragma unroll\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                attn_softmax_rebase(m[h], sM[row_a + 8 * h], alpha0[h]);\n",
    "                b[h] = attn_softmax_rebase(m[h], mx[h], alpha1[h]);\n",
    "                if (tq == 0) sM[64 + row_a + 8 * h] = m[h];\n",
    "            }\n",
    "            attn_named_barrier_arrive(ATTN_NB_M1, MW::threads);\n",
    "        }\n",
    "\n",
    "        /* ---- P = 2^(S - base) into the rope panel; this warpgroup's row sums ---- */\n",
    "        char *const my_p = smem + (mine - base) + MW::rope * MW::panel;\n",
    "#pragma unroll\n",
    "        for (int h = 0; h < 2; h++) {\n",
    "            float sum = 0.0f;\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < 8; i++) {\n",
    "                const float p0 = attn_exp2(fmaf(s[4 * i + 2 * h], qk_scale, -b[h]));\n",
    "                const float p1 = attn_exp2(fmaf(s[4 * i + 2 * h + 1], qk_scale, -b[h]));\n",
    "                s[4 * i + 2 * h] = p0;\n",
    "                s[4 * i + 2 * h + 1] = p1;\n",
    "                sum += p0 + p1;\n",
    "                const int col = 8 * i + 2 * tq, row = row_a + 8 * h;\n",
    "                *(attn_u32 *)(my_p + attn_wgmma_swizzle_offset<64>(row, col >> 3) + (col & 7) * 2) = attn_elem<DT>::pack2(p0, p1);\n",
    "            }\n",
    "            l[h] = l[h] * alpha0[h] * alpha1[h] + sum; /* C0: alpha1 comes with [M1], below */\n",
    "        }\n",
    "#pragma unroll\n",
    "        for (int j = 0; j < 4; j++) attn_wgmma_a_from_acc<DT>(pown[j], s, j); /* the S registers are free after this */\n",
    "        if (!SPARSE && (kt < key0 || kt + 64 > key1)) { /* an edge tile: zero the V rows of keys outside [key0, key1) */\n",
    "            for (int u = tid & 127; u < 64 * MW::nl * 8; u += 128) {\n",
    "                const int r = u / (MW::nl * 8), ch = u - r * (MW::nl * 8), k = kt + r;\n",
    "                if (k < key0 || k >= key1) {\n",
    "                    const attn_vec16 zero = {0u, 0u, 0u, 0u};\n",
    "                    *(attn_vec16 *)(smem + (mine - base) + attn_wgmma_swizzle_offset<64>(r, ch)) = zero;\n",
    "                }\n",
    "            }\n",
    "        }\n",
    "        attn_fence_proxy_async();                     /* zeroed rows are read by wgmma */\n",
    "        attn_named_barrier(ATTN_NB_WG + wg, 128);     /* this warpgroup's P and zeroed rows are whole */\n",
    "        attn_named_barrier_arrive(c1 ? ATTN_NB_P1 : ATTN_NB_P0, MW::threads);\n",
    "\n",
    "        /* ---- O = a0 O + P0 V0 (this warpgroup's half of V0): C0's P0 from its S, C1's read ---- */\n",
    "        if (!c1) {\n",
    "            own_p();\n",
    "        } else {\n",
    "            attn_named_barrier(ATTN_NB_P0, MW::threads);\n",
    "            attn_mbar_wait(full + 8, ph); /* B0 (complete: C0 waited for it; the acquire for this warpgroup) */\n",
    "            if (SPARSE && SPARSE_TMA != 1 && SPARSE_FENCE) attn_fence_proxy_async();\n",
    "            attn_mla_seesaw_load_p(pf, smem + (sS0 - base) + MW::rope * MW::panel, row_a, tq);\n",
    "        }\n",
    "        pv(sS0, alpha0);\n",
    "        if (!c1) { /* m1 from C1 */\n",
    "            attn_named_barrier(ATTN_NB_M1, MW::threads);\n",
    "#pragma unroll\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                attn_softmax_rebase(m[h], sM[64 + row_a + 8 * h], alpha1[h]);\n",
    "                l[h] *= alpha1[h];\n",
    "            }\n",
    "        }\n",
    "        attn_wgmma_wait<0>();\n",
    "        attn_wgmma_fence_acc(o);\n",
    "#if SPARSE\n",
    "        refill(c1, sS0, offa, next);\n",
    "#else\n",
    "        refill(c1, sS0, 0, kn, 1, next); /* slot 0's A0 (C0) / B0 (C1) */\n",
    "#endif\n",
    "\n",
    "        /* ---- O = a1 O + P1 V1: C1's P1 from its S, C0's read ---- */\n",
    "        if (!c1) {\n",
    "            attn_named_barrier(ATTN_NB_P1, MW::threads);\n",
    "            attn_mbar_wait(full + 16, ph); /* A1 (complete: C1 waited for it) */\n",
    "            if (SPARSE && SPARSE_TMA != 1 && SPARSE_FENCE) attn_fence_proxy_async();\n",
    "            attn_mla_seesaw_load_p(pf, smem + (sS1 - base) + MW::rope * MW::panel, row_a, tq);\n",
    "        } else {\n",
    "            own_p();\n",
    "        }\n",
    "        pv(sS1, alpha1);\n",
    "        attn_wgmma_wait<0>();\n",
    "        attn_wgmma_fence_acc(o);\n",
    "#if SPARSE\n",
    "        refill(2 + c1, sS1, offb, next);\n",
    "#else\n",
    "        refill(2 + c1, sS1, MW::pieces, kn + 64, 2 * (pr + 1) + 1 < ntiles, next); /* slot 1's A1 (C0, P1 read) / B1 (C1) */\n",
    "#endif\n",
    "    }\n",
    "\n",
    "    /* ---- epilogue: L = both warpgroups' sums; O / L ---- */\n",
    "#pragma unroll\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        const float lq = attn_quad_sum(l[h]);\n",
    "        if (tq == 0) sL[wg * 64 + row_a + 8 * h] = lq;\n",
    "    }\n",
    "    __syncthreads();\n",
    "#pragma unroll\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        const int row = row_a + 8 * h;\n",
    "        float L = sL[row] + sL[64 + row], mrow = m[h], wsink = 1.0f;\n",
    "#if SPARSE\n",
    "        if (p.sinks && slot < 0 && row < nrows) /* the head's sink, once, where the row is finished */\n",
    "            wsink = attn_softmax_sink(__ldg(p.sinks + head0 + row), mrow, L);\n",
    "#endif\n",
    "        const float inv = L > 0.0f ? wsink * attn_rcp(L) : 0.0f;\n",
    "        const float lse2 = attn_softmax_lse2(mrow, L);\n",
    "        if (row >= nrows) continue;\n",
    "        if (slot < 0) {\n",
    "            char *orow = (char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head) * 2;\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < MW::o_regs / 4; i++)\n",
    "                *(attn_u32 *)(orow + (wg * MW::cw + 8 * i + 2 * tq) * 2) =\n",
    "                    attn_elem<DT>::pack2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);\n",
    "            if (p.lse && wg == 0 && tq == 0)\n",
    "                p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] = lse2 * ATTN_LN2;\n",
    "        } else {\n",
    "            float *po = p.partial_o + ((attn_i64)slot * ROWS + row) * KV_LORA + wg * MW::cw;\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < MW::o_regs / 4; i++)\n",
    "                *(float2 *)(po + 8 * i + 2 * tq) = make_float2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);\n",
    "            if (wg == 0 && tq == 0) p.partial_lse[(attn_i64)slot * ROWS + row] = lse2;\n",
    "        }\n",
    "    }\n",
    "}\n",
    "\n",
    "/* The merge as its own launch (mla_merge.cuh): grid (entries, 64), one CTA per row. */\n",
    "extern \"C\" __global__ void __launch_bounds__(256) attn_mla_merge(const attn__mla_decode_params p) {\n",
    "    attn_mla_merge_kernel(p);\n",
    "}\n",
    0};
static const char *const attn__kernel_src_mla_merge_cuh[] = {
    "/* mla_merge.cuh - the MLA decode's merge of split partials, shared by mla_decode.cu\n",
    "   (mma.sync) and mla_decode_sm90.cu (wgmma): include after mla_common.cuh once ROWS,\n",
    "   KV_LORA and DT (16-bit) are defined. */\n",
    "#ifndef ATTN_MLA_MERGE_CUH\n",
    "#define ATTN_MLA_MERGE_CUH\n",
    "#if !defined(ROWS) || !defined(KV_LORA) || !defined(DT)\n",
    "#error \"mla_merge.cuh: define ROWS, KV_LORA and DT first\"\n",
    "#endif\n",
    "\n",
    "/* Split weights kept in shared memory per merge (rows x ATTN_MERGE_CAP; an entry of more\n",
    "   splits recomputes them from the partial LSEs, a slower path for forced split counts). */\n",
    "#define ATTN_MERGE_CAP 64\n",
    "#define ATTN_MERGE_SW_FLOATS (ROWS * (ATTN_MERGE_CAP + 2))\n",
    "\n",
    "/* Merges the splits of entry `mi` for its rows row0 .. row1 - 1: out = sum_i w_i o_i,\n",
    "   w_i = 2^(lse_i - max) / sum (splits that saw no key weigh 0); lse to base e. Called by\n",
    "   all n threads of the CTA (t = thread index; n a multiple of 32); sw: shared scratch of\n",
    "   ATTN_MERGE_SW_FLOATS. Phase 1, a warp per row: the row's max and weight sum over the\n",
    "   splits (lanes over splits), the weights into sw. Phase 2: every thread 4 columns at a\n",
    "   time, the splits' partials read at L2 (ld.global.cg: other CTAs wrote them) as float4. */\n",
    "ATTN_DEV void attn_mla_merge_entry(const attn__mla_decode_params &p, int mi, int row0, int row1, int t, int n, float *sw) {\n",
    "    const int *mg = p.merge + 8 * (attn_i64)mi;\n",
    "    const int q_row = mg[0], head0 = mg[1], splits = mg[2], slot0 = mg[3];\n",
    "    const int lane = t & 31, cap = splits <= ATTN_MERGE_CAP;\n",
    "    row1 = attn_imin(row1, p.num_heads - head0);\n",
    "    for (int row = row0 + (t >> 5); row < row1; row += n >> 5) {\n",
    "        float mx = attn_neg_inf(), ws = 0.0f;\n",
    "        for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, __ldcg(p.partial_lse + (attn_i64)(slot0 + s) * ROWS + row));\n",
    "        mx = attn_warp_max(mx);\n",
    "        /* a sink (sparse MLA: params.sinks) is one more state with lse = the sink, no value */\n",
    "        const float sk = p.sinks ? __ldg(p.sinks + head0 + row) * ATTN_LOG2E : attn_neg_inf();\n",
    "        mx = fmaxf(mx, sk);\n",
    "        for (int s = lane; s < splits; s += 32) {\n",
    "            const float l = __ldcg(p.partial_lse + (attn_i64)(slot0 + s) * ROWS + row);\n",
    "            ws += attn_merge_weight(l, mx);\n",
    "        }\n",
    "        ws = attn_warp_sum(ws) + attn_merge_weight(sk, mx);\n",
    "        const float inv = ws > 0.0f ? 1.0f / ws : 0.0f;\n",
    "        float *w = sw + row * (ATTN_MERGE_CAP + 2);\n",
    "        if (cap)\n",
    "            for (int s = lane; s < splits; s += 32) {\n",
    "                const float l = __ldcg(p.partial_lse + (attn_i64)(slot0 + s) * ROWS + row);\n",
    "                w[s] = attn_merge_weight(l, mx) * inv;\n",
    "            }\n",
    "        if (lane == 0) {\n",
    "            w[ATTN_MERGE_CAP] = mx;\n",
    "            w[ATTN_MERGE_CAP + 1] = inv;\n",
    "            if (p.lse)\n",
    "                p.lse[(attn_i64)q_row * p.lse_stride_token + (attn_i64)(head0 + row) * p.lse_stride_head] =\n",
    "                    attn_softmax_lse2(mx, ws) * ATTN_LN2;\n",
    "        }\n",
    "    }\n",
    "    __syncthreads();\n",
    "    for (int u = row0 * (KV_LORA / 4) + t; u < row1 * (KV_LORA / 4); u += n) {\n",
    "        const int row = u / (KV_LORA / 4), c = (u - row * (KV_LORA / 4)) * 4;\n",
    "        const float *w = sw + row * (ATTN_MERGE_CAP + 2);\n",
    "        const float *po = p.partial_o + ((attn_i64)slot0 * ROWS + row) * KV_LORA + c;\n",
    "        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;\n",
    "#pragma unroll 4\n",
    "        for (int s = 0; s < splits; s++) {\n",
    "            const float x = cap ? w[s]\n",
    "                                : attn_exp2(__ldcg(p.partial_lse + (attn_i64)(slot0 + s) * ROWS + row) - w[ATTN_MERGE_CAP]) *\n",
    "                                      w[ATTN_MERGE_CAP + 1];\n",
    "            if (x > 0.0f) { /* an empty split weighs 0, whatever its partial holds */\n",
    "                const float4 v = __ldcg((const float4 *)(po + (attn_i64)s * ROWS * KV_LORA));\n",
    "                a0 += x * v.x; a1 += x * v.y; a2 += x * v.z; a3 += x * v.w;\n",
    "            }\n",
    "        }\n",
    "        attn_u32 *dst = (attn_u32 *)((char *)p.out + ((attn_i64)q_row * p.out_stride_token + (attn_i64)(head0 + row) * p.out_stride_head + c) * 2);\n",
    "        dst[0] = attn_elem<DT>::pack2(a0, a1);\n",
    "        dst[1] = attn_elem<DT>::pack2(a2, a3);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* attn_mla_merge's body: grid (>= *num_merge, ROWS), one CTA per row of an entry. */\n",
    "ATTN_DEV void attn_mla_merge_kernel(const attn__mla_decode_params &p) {\n",
    "    __shared__ float sw[ATTN_MERGE_SW_FLOATS];\n",
    "    if ((int)blockIdx.x >= *p.num_merge) return;\n",
    "    attn_mla_merge_entry(p, blockIdx.x, blockIdx.y, blockIdx.y + 1, threadIdx.x, blockDim.x, sw);\n",
    "}\n",
    "\n",
    "#endif /* ATTN_MLA_MERGE_CUH */\n",
    0};
static const char *const attn__kernel_src_mla_prefill_cu[] = {
    "/* mla_prefill.cu - MLA's up-projected prefill attention on mma.sync (sm_80+): the CUDA_MLA\n",
    "   backend's forward_mha. Checked on an H200 (2026-12-02): `./build/cuda_kernels --mla`\n",
    "   against float64 and `./build/attn_tests cuda` (GPU worlds forced onto CUDA_MLA) passed,\n",
    "   compute-sanitizer memcheck and racecheck clean; figures in docs/PERF.md (\"CUDA_MLA v1\").\n",
    "\n",
    "   WHAT IT COMPUTES, params, launch, MERGE: exactly kernels/mla_prefill_sm90.cu's (the same\n",
    "   struct attn__mla_prefill_params, the same pass scalars, the same LSE merge into out/lse for\n",
    "   chunks after the first), so the host drives both alike; only the tile differs:\n",
    "   grid (ceil(nq / 64), heads), block 128 (4 warps), dynamic shared memory\n",
    "   attn_mha_config.shared_bytes; tile x takes queries 64 (gridDim.x - 1 - x) .. (the causal tiles\n",
    "   with the most keys first). attn_mha_config: {threads, dynamic shared bytes, KV_TILE,\n",
    "   64 rows, KV_STAGES, 4 warps, 0, 1}.\n",
    "\n",
    "   INSIDE A CTA (FlashAttention-2's shape): warp w owns query rows 16w .. 16w + 15 of the\n",
    "   CTA's 64 and every key of a tile, so a row's max and sum stay within the warp's quad of\n",
    "   lanes. Q [64][DN + ROPE] is copied once (cp.async, rows padded by 16 bytes) and held as\n",
    "   mma A fragments in registers (DQK / 16 k-steps x 4 registers). K tiles [KV_TILE keys]\n",
    "   [DN | ROPE] and V tiles [KV_TILE][DV] stream through a cp.async ring of KV_STAGES stages\n",
    "   (padded rows: conflict-free ldmatrix); each thread copies fixed 16-byte columns (chunks\n",
    "   per row divide the 128 threads). Per tile: S = Q K^T (m16n8k16, K by ldmatrix), masked\n",
    "   (key j visible iff j < nkeys and, causal, key_pos0 + j <= pos0 + row), online softmax\n",
    "   in base 2 in registers, P packed from the S accumulators into A fragments, O += P V (V\n",
    "   by ldmatrix.trans). Epilogue: O / l (merged with the earlier chunks' out/lse with MERGE),\n",
    "   4-byte stores per lane. */\n",
    "#include \"mla_common.cuh\" /* attn__mla_prefill_params, attn_mha_merge_weights */\n",
    "\n",
    "#if !defined(DN) || !defined(ROPE) || !defined(DV) || !defined(DT)\n",
    "#error \"mla_prefill.cu: define DN (q/k nope width), ROPE, DV and DT\"\n",
    "#endif\n",
    "#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16\n",
    "#error \"mla_prefill.cu: DT must be 1 (f16) or 2 (bf16)\"\n",
    "#endif\n",
    "#define ATTN_DQK (DN + ROPE)\n",
    "#if ATTN_DQK % 16 != 0 || DV % 16 != 0 || DN % 8 != 0 || ROPE % 8 != 0 || DV > 128 || ATTN_DQK > 256\n",
    "#error \"mla_prefill.cu: DN + ROPE must be a multiple of 16 up to 256, DV a multiple of 16 up to 128\"\n",
    "#endif\n",
    "\n",
    "#define ATTN_WARPS 4\n",
    "#define ATTN_THREADS (ATTN_WARPS * 32)\n",
    "#define ATTN_ROWS (ATTN_WARPS * 16)\n",
    "#ifndef KV_TILE\n",
    "#define KV_TILE 64\n",
    "#endif\n",
    "#ifndef KV_STAGES\n",
    "#define KV_STAGES 2\n",
    "#endif\n",
    "#if KV_TILE % 16 != 0 || KV_STAGES < 2\n",
    "#error \"mla_prefill.cu: KV_TILE a multiple of 16, KV_STAGES >= 2\"\n",
    "#endif\n",
    "#define ATTN_QP (ATTN_DQK + 8) /* padded row pitches, elements */\n",
    "#define ATTN_VP (DV + 8)\n",
    "#define ATTN_SQ_OFF 0\n",
    "#define ATTN_SK_OFF (ATTN_SQ_OFF + ATTN_ROWS * ATTN_QP * 2)\n",
    "#define ATTN_SV_OFF (ATTN_SK_OFF + KV_STAGES * KV_TILE * ATTN_QP * 2)\n",
    "#define ATTN_SMEM_BYTES (ATTN_SV_OFF + KV_STAGES * KV_TILE * ATTN_VP * 2)\n",
    "#define ATTN_NC_K (DN / 8) /* 16-byte chunks of a row: K_nope, k_pe, V */\n",
    "#define ATTN_NC_P (ROPE / 8)\n",
    "#define ATTN_NC_V (DV / 8)\n",
    "#if ATTN_THREADS % ATTN_NC_K || ATTN_THREADS % ATTN_NC_P || ATTN_THREADS % ATTN_NC_V || \\\n",
    "    (KV_TILE * ATTN_NC_K) % ATTN_THREADS || (KV_TILE * ATTN_NC_P) % ATTN_THREADS || (KV_TILE * ATTN_NC_V) % ATTN_THREADS\n",
    "#error \"mla_prefill.cu: the loader needs chunks per row that divide the threads\"\n",
    "#endif\n",
    "#define ATTN_KS (ATTN_DQK / 16) /* k-steps of S */\n",
    "#define ATTN_NT (KV_TILE / 8)   /* n-tiles of S */\n",
    "#define ATTN_OT (DV / 8)        /* n-tiles of O */\n",
    "\n",
    "extern \"C\" __constant__ attn__launch_config attn_mha_config = {ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ATTN_ROWS, 1, KV_STAGES, ATTN_WARPS, 1};\n",
    "\n",
    "\n",
    "extern \"C\" __global__ void __launch_bounds__(ATTN_THREADS) attn_mla_prefill(const attn__mla_prefill_params p) {\n",
    "    extern __shared__ attn_vec16 attn_smem[];\n",
    "    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();\n",
    "    const int tile = (int)(gridDim.x - 1 - blockIdx.x), head = blockIdx.y;\n",
    "    const int q_row0 = p.q_row0 + ATTN_ROWS * tile, nq = attn_imin(ATTN_ROWS, p.nq - ATTN_ROWS * tile);\n",
    "    const int pos0 = p.pos0 + ATTN_ROWS * tile, key_pos0 = p.key_pos0, nkeys = p.nkeys;\n",
    "    const int causal = p.flags & ATTN_MHA_CAUSAL;\n",
    "    if (nq <= 0) return;\n",
    "    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;\n",
    "    const attn_u32 sbase = attn_smem_addr(attn_smem);\n",
    "    const attn_u32 sQ = sbase + ATTN_SQ_OFF, sK = sbase + ATTN_SK_OFF, sV = sbase + ATTN_SV_OFF;\n",
    "\n",
    "    /* ---- Q rows [q_nope | q_pe], zero past nq ---- */\n",
    "    for (int c = tid; c < ATTN_ROWS * (ATTN_DQK / 8); c += ATTN_THREADS) {\n",
    "        const int r = c / (ATTN_DQK / 8), col = c - r * (ATTN_DQK / 8), valid = r < nq;\n",
    "        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,\n",
    "                                                   p.q_pe_stride_head, DN, q_row0 + r, head, col)\n",
    "                                : (const char *)p.q;\n",
    "        attn_cp_async16_or_zero(sQ + (attn_u32)((r * ATTN_QP + col * 8) * 2), src, !valid);\n",
    "    }\n",
    "\n",
    "    /* ---- keys this CTA sees: [0, kend) of the chunk ---- */\n",
    "    const int kend = causal ? attn_imax(0, attn_imin(nkeys, pos0 + nq - 1 - key_pos0 + 1)) : nkeys;\n",
    "    const int ntiles = (kend + KV_TILE - 1) / KV_TILE;\n",
    "    const char *const kn_base = (const char *)p.k_nope + ((attn_i64)head * p.k_stride_head + (tid % ATTN_NC_K) * 8) * 2;\n",
    "    const char *const kp_base = (const char *)p.k_pe + (tid % ATTN_NC_P) * 8 * 2;\n",
    "    const char *const v_base = (const char *)p.v + ((attn_i64)head * p.v_stride_head + (tid % ATTN_NC_V) * 8) * 2;\n",
    "    const attn_i64 kn_step = p.k_stride_token * 2, kp_step = p.kpe_stride_token * 2, v_step = p.v_stride_token * 2;\n",
    "    auto issue = [&](int t) {\n",
    "        const int st = t % KV_STAGES, j0 = t * KV_TILE;\n",
    "        const attn_u32 kd = sK + (attn_u32)(st * KV_TILE * ATTN_QP * 2), vd = sV + (attn_u32)(st * KV_TILE * ATTN_VP * 2);\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < KV_TILE * ATTN_NC_K / ATTN_THREADS; i++) {\n",
    "            const int r = tid / ATTN_NC_K + i * (ATTN_THREADS / ATTN_NC_K), j = j0 + r;\n",
    "            attn_cp_async16_or_zero(kd + (attn_u32)((r * ATTN_QP + (tid % ATTN_NC_K) * 8) * 2),\n",
    "                                    j < nkeys ? kn_base + (attn_i64)j * kn_step : kn_base, j >= nkeys);\n",
    "        }\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < KV_TILE * ATTN_NC_P / ATTN_THREADS; i++) {\n",
    "            const int r = tid / ATTN_NC_P + i * (ATTN_THREADS / ATTN_NC_P), j = j0 + r;\n",
    "            attn_cp_async16_or_zero(kd + (attn_u32)((r * ATTN_QP + DN + (tid % ATTN_NC_P) * 8) * 2),\n",
    "                                    j < nkeys ? kp_base + (attn_i64)j * kp_step : kp_base, j >= nkeys);\n",
    "        }\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < KV_TILE * ATTN_NC_V / ATTN_THREADS; i++) {\n",
    "            const int r = tid / ATTN_NC_V + i * (ATTN_THREADS / ATTN_NC_V), j = j0 + r;\n",
    "            attn_cp_async16_or_zero(vd + (attn_u32)((r * ATTN_VP + (tid % ATTN_NC_V) * 8) * 2),\n",
    "                                    j < nkeys ? v_base + (attn_i64)j * v_step : v_base, j >= nkeys);\n",
    "        }\n",
    "    };\n",
    "#pragma unroll\n",
    "    for (int s = 0; s < KV_STAGES - 1; s++) {\n",
    "        if (s < ntiles) issue(s);\n",
    "        attn_cp_async_commit(); /* Q goes with the first group */\n",
    "    }\n",
    "\n",
    "    /* ldmatrix lane offsets (bytes): A rows lane % 16, column half lane / 16; B from [key]\n",
    "       [dim] rows: keys lane % 8 + 8 (lane / 16), column half (lane / 8) % 2; V transposed:\n",
    "       keys lane % 16, column half lane / 16 (mla_decode.cu's) */\n",
    "    const attn_u32 a_lane = (attn_u32)(((lane & 15) * ATTN_QP + (lane >> 4) * 8) * 2);\n",
    "    const attn_u32 k_lane = (attn_u32)((((lane & 7) + ((lane >> 4) << 3)) * ATTN_QP + ((lane >> 3) & 1) * 8) * 2);\n",
    "    const attn_u32 v_lane = (attn_u32)(((lane & 15) * ATTN_VP + (lane >> 4) * 8) * 2);\n",
    "    const float qk_scale = p.scale * ATTN_LOG2E;\n",
    "    const int row_a = 16 * warp + g; /* this thread's rows: row_a, row_a + 8 */\n",
    "    int hi[2]; /* keys [0, hi) visible to each of the two rows */\n",
    "#pragma unroll\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        const int R = row_a + 8 * h;\n",
    "        hi[h] = R >= nq ? 0 : causal ? attn_imax(0, attn_imin(nkeys, pos0 + R - key_pos0 + 1)) : nkeys;\n",
    "    }\n",
    "    attn_u32 qf[ATTN_KS][4];\n",
    "    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};\n",
    "    float o[ATTN_OT][4];\n",
    "#pragma unroll\n",
    "    for (int n = 0; n < ATTN_OT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;\n",
    "\n",
    "    for (int it = 0; it < ntiles; it++) {\n",
    "        attn_cp_async_wait<KV_STAGES - 2>();\n",
    "        __syncthreads(); /* tile it (and Q) landed; stage (it - 1) % KV_STAGES is free */\n",
    "        if (it == 0) {\n",
    "#pragma unroll\n",
    "            for (int ks = 0; ks < ATTN_KS; ks++)\n",
    "                attn_ldmatrix_x4(qf[ks], sQ + (attn_u32)(16 * warp * ATTN_QP * 2) + a_lane + ks * 32);\n",
    "        }\n",
    "        if (it + KV_STAGES - 1 < ntiles) issue(it + KV_STAGES - 1);\n",
    "        attn_cp_async_commit();\n",
    "        const int st = it % KV_STAGES, kt0 = it * KV_TILE;\n",
    "        const attn_u32 kb = sK + (attn_u32)(st * KV_TILE * ATTN_QP * 2) + k_lane;\n",
    "        const attn_u32 vb = sV + (attn_u32)(st * KV_TILE * ATTN_VP * 2) + v_lane;\n",
    "        /* a warp whose rows see none of this tile's keys skips it */\n",
    "        const int warp_hi = attn_warp_imax(attn_imax(hi[0], hi[1]));\n",
    "        if (kt0 >= warp_hi) continue;\n",
    "\n",
    "        /* ---- S = Q K^T ---- */\n",
    "        float s[ATTN_NT][4];\n",
    "#pragma unroll\n",
    "        for (int n = 0; n < ATTN_NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;\n",
    "#pragma unroll\n",
    "        for (int ks = 0; ks < ATTN_KS; ks++)\n",
    "#pragma unroll\n",
    "            for (int np = 0; np < ATTN_NT / 2; np++) {\n",
    "                attn_u32 b[4];\n",
    "                attn_ldmatrix_x4(b, kb + (attn_u32)((np * 16 * ATTN_QP + ks * 16) * 2));\n",
    "                attn_mma16816<DT>(s[2 * np], qf[ks], b);\n",
    "                attn_mma16816<DT>(s[2 * np + 1], qf[ks], b + 2);\n",
    "            }\n",
    "\n",
    "        /* ---- mask, online softmax (base 2, scale folded in) ---- */\n",
    "        float mx[2] = {attn_neg_inf(), attn_neg_inf()};\n",
    "#pragma unroll\n",
    "        for (int n = 0; n < ATTN_NT; n++)\n",
    "#pragma unroll\n",
    "            for (int e = 0; e < 4; e++) {\n",
    "                const int j = kt0 + 8 * n + 2 * tq + (e & 1);\n",
    "                const float x = j < hi[e >> 1] ? s[n][e] : attn_neg_inf();\n",
    "                s[n][e] = x;\n",
    "                mx[e >> 1] = fmaxf(mx[e >> 1], x);\n",
    "            }\n",
    "        float b2[2];\n",
    "#pragma unroll\n",
    "        for (int h = 0; h < 2; h++) {\n",
    "            float alpha;\n",
    "            b2[h] = attn_softmax_rebase(m[h], attn_quad_max(mx[h]) * qk_scale, alpha);\n",
    "            l[h] *= alpha;\n",
    "#pragma unroll\n",
    "            for (int n = 0; n < ATTN_OT; n++) { o[n][2 * h] *= alpha; o[n][2 * h + 1] *= alpha; }\n",
    "        }\n",
    "        float sum[2] = {0.0f, 0.0f};\n",
    "#pragma unroll\n",
    "        for (int n = 0; n < ATTN_NT; n++)\n",
    "#pragma unroll\n",
    "            for (int e = 0; e < 4; e++) {\n",
    "                const float x = attn_exp2(fmaf(s[n][e], qk_scale, -b2[e >> 1]));\n",
    "                s[n][e] = x;\n",
    "                sum[e >> 1] += x;\n",
    "            }\n",
    "        l[0] += sum[0];\n",
    "        l[1] += sum[1];\n",
    "\n",
    "        /* ---- O += P V: P's A fragments straight from the S accumulators ---- */\n",
    "#pragma unroll\n",
    "        for (int kk = 0; kk < KV_TILE / 16; kk++) {\n",
    "            attn_u32 a[4];\n",
    "            a[0] = attn_elem<DT>::pack2(s[2 * kk][0], s[2 * kk][1]);\n",
    "            a[1] = attn_elem<DT>::pack2(s[2 * kk][2], s[2 * kk][3]);\n",
    "            a[2] = attn_elem<DT>::pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);\n",
    "            a[3] = attn_elem<DT>::pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);\n",
    "#pragma unroll\n",
    "            for (int op = 0; op < ATTN_OT / 2; op++) {\n",
    "                attn_u32 b[4];\n",
    "                attn_ldmatrix_x4_trans(b, vb + (attn_u32)((kk * 16 * ATTN_VP + op * 16) * 2));\n",
    "                attn_mma16816<DT>(o[2 * op], a, b);\n",
    "                attn_mma16816<DT>(o[2 * op + 1], a, b + 2);\n",
    "            }\n",
    "        }\n",
    "    }\n",
    "    attn_cp_async_wait<0>();\n",
    "\n",
    "    /* ---- epilogue: O / l, merged with the earlier chunks' out/lse (MERGE) ---- */\n",
    "    const int merge = p.flags & ATTN_MHA_MERGE;\n",
    "#pragma unroll\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        const int R = row_a + 8 * h;\n",
    "        const float L = attn_quad_sum(l[h]);\n",
    "        float lse2 = attn_softmax_lse2(m[h], L);\n",
    "        float wn = L > 0.0f ? attn_rcp(L) : 0.0f, wo = 0.0f;\n",
    "        if (R >= nq) continue;\n",
    "        const attn_i64 lse_at = (attn_i64)(q_row0 + R) * p.lse_stride_token + (attn_i64)head * p.lse_stride_head;\n",
    "        char *orow = (char *)p.out + ((attn_i64)(q_row0 + R) * p.out_stride_token + (attn_i64)head * p.out_stride_head + 2 * tq) * 2;\n",
    "        if (merge) attn_mha_merge_weights(p.lse[lse_at], &lse2, &wn, &wo); /* out = wo old + wn o */\n",
    "#pragma unroll\n",
    "        for (int n = 0; n < ATTN_OT; n++) {\n",
    "            float x0 = o[n][2 * h] * wn, x1 = o[n][2 * h + 1] * wn;\n",
    "            if (wo > 0.0f) {\n",
    "                x0 += wo * attn_load<DT>(orow, 8 * n);\n",
    "                x1 += wo * attn_load<DT>(orow, 8 * n + 1);\n",
    "            }\n",
    "            *(attn_u32 *)(orow + 8 * n * 2) = attn_elem<DT>::pack2(x0, x1);\n",
    "        }\n",
    "        if (tq == 0 && p.lse) p.lse[lse_at] = lse2 * ATTN_LN2;\n",
    "    }\n",
    "}\n",
    0};
static const char *const attn__kernel_src_mla_prefill_sm90_cu[] = {
    "/* mla_prefill_sm90.cu - MLA's up-projected prefill attention on wgmma (sm_90a), and the\n",
    "   gather of a chunk of latent rows it runs on: the CUDA_MLA_SM90 backend's forward_mha.\n",
    "\n",
    "   =====================================================================================\n",
    "   WHAT IT COMPUTES (attn_mla_forward_mha's attention over one chunk of keys)\n",
    "   =====================================================================================\n",
    "   Per head h (MHA: every head its own K/V, from the up-projection of the latent): query\n",
    "   row [q_nope | q_pe] (DQK = DN + ROPE: 128 + 64; two tensors, which may be the two halves\n",
    "   of one), key row [k_nope[j][h] | k_pe[j]] (k_pe one vector per key, shared by all heads:\n",
    "   the loader appends it, nothing is materialised), value v[j][h] (DV = 128). Scores\n",
    "   s = q . k * scale; out = softmax(s) V in DT; lse (base e). The keys of a launch are rows\n",
    "   0 .. nkeys - 1 of the K/V tensors (a chunk of one request's keys, up-projected by the\n",
    "   host's GEMMs) at positions key_pos0 + j; query t of the launch is row q_row0 + t of\n",
    "   q/out/lse at position pos0 + t and sees key j iff (not causal or key_pos0 + j <= pos0 +\n",
    "   t). A row that sees no key: out 0, lse -inf.\n",
    "   MERGE (flags bit 1): out/lse already hold the result over earlier chunks (lse base e;\n",
    "   -inf: none); the CTA merges its chunk's result into them by LSE (weights 2^(lse - max);\n",
    "   a side with lse -inf weighs 0, whatever its out holds). So a request of many chunks is\n",
    "   one launch per chunk, the first without MERGE; lse is then required (the running LSE).\n",
    "\n",
    "   LAUNCH (attn_mla_prefill): grid (ceil(nq / 128), heads), block 256, dynamic shared\n",
    "   memory attn_mha_config.shared_bytes (one CTA per SM: 2 warpgroups at up to 255 registers). Tile\n",
    "   x takes the 128 queries from the end backwards (tile gridDim.x - 1 - x), so the causal\n",
    "   tiles with the most keys start first. attn_mha_config: {threads, dynamic shared bytes,\n",
    "   KV_TILE, 128 rows, KV_STAGES, 8 warps, 0, 1} (mla_decode_sm90.cu's order).\n",
    "\n",
    "   INSIDE A CTA: paged_prefill_sm90.cu's loop with three changes: Q is DQK wide (three\n",
    "   128-byte panels), K and V tiles have their own widths (DQK and DV), and rows come from\n",
    "   strided tensors instead of pages (the copies of a key row: 16 chunks of k_nope, 8 of\n",
    "   k_pe; of a value row: 16). Per 128-key tile: S = Q K^T by wgmma m64n128k16 ss over\n",
    "   DQK / 16 steps (next tile's copies issued under it), masked online softmax in base 2,\n",
    "   O += P V by wgmma m64nDVk16 rs with P from the S accumulators.\n",
    "\n",
    "   The chunk's latent rows come from cache_write.cu's attn_mla_gather (k_pe is read from\n",
    "   their tail). */\n",
    "#include \"wgmma.cuh\"\n",
    "#include \"mla_common.cuh\" /* attn__mla_prefill_params, attn_mha_merge_weights */\n",
    "\n",
    "#if !defined(DN) || !defined(ROPE) || !defined(DV) || !defined(DT)\n",
    "#error \"mla_prefill_sm90.cu: define DN (q/k nope width), ROPE, DV and DT\"\n",
    "#endif\n",
    "#if DT != ATTN_DT_F16 && DT != ATTN_DT_BF16\n",
    "#error \"mla_prefill_sm90.cu: DT must be 1 (f16) or 2 (bf16)\"\n",
    "#endif\n",
    "#define ATTN_DQK (DN + ROPE)\n",
    "#if ATTN_DQK % 64 != 0 || DV % 64 != 0 || DV > 128 || ATTN_DQK > 256 || DN % 8 != 0\n",
    "#error \"mla_prefill_sm90.cu: DN + ROPE must be a multiple of 64 up to 256, DV 64 or 128\"\n",
    "#endif\n",
    "\n",
    "#define ATTN_ROWS_PAD 128\n",
    "#define ATTN_THREADS 256\n",
    "#define KV_TILE 128\n",
    "#ifndef KV_STAGES\n",
    "#define KV_STAGES 2\n",
    "#endif\n",
    "#define ATTN_SQ_BYTES (ATTN_ROWS_PAD * ATTN_DQK * 2)\n",
    "#define ATTN_K_BYTES (KV_TILE * ATTN_DQK * 2)\n",
    "#define ATTN_V_BYTES (KV_TILE * DV * 2)\n",
    "#define ATTN_SK_OFF ATTN_SQ_BYTES\n",
    "#define ATTN_SV_OFF (ATTN_SK_OFF + KV_STAGES * ATTN_K_BYTES)\n",
    "#define ATTN_BOUNDS_OFF (ATTN_SV_OFF + KV_STAGES * ATTN_V_BYTES)\n",
    "#define ATTN_SMEM_BYTES (ATTN_BOUNDS_OFF + 128 + 1024)\n",
    "#if ATTN_SMEM_BYTES > 232448\n",
    "#error \"mla_prefill_sm90.cu: shared memory over 227 KiB; lower KV_STAGES\"\n",
    "#endif\n",
    "#define ATTN_O_PITCH (DV + 8)\n",
    "#if ATTN_ROWS_PAD * ATTN_O_PITCH * 2 > KV_STAGES * (ATTN_K_BYTES + ATTN_V_BYTES)\n",
    "#error \"mla_prefill_sm90.cu: the epilogue's O does not fit over the K/V stages\"\n",
    "#endif\n",
    "#define ATTN_ST (KV_TILE / 2)\n",
    "#define ATTN_OT (DV / 2)\n",
    "#define ATTN_KCPR (ATTN_DQK / 8) /* 16-byte chunks of a K row */\n",
    "#define ATTN_VCPR (DV / 8)\n",
    "#define ATTN_NC_K (DN / 8)      /* ... of its K_nope part, its k_pe part, a V row */\n",
    "#define ATTN_NC_P (ROPE / 8)\n",
    "#define ATTN_NC_V (DV / 8)\n",
    "#if ATTN_THREADS % ATTN_NC_K || ATTN_THREADS % ATTN_NC_P || ATTN_THREADS % ATTN_NC_V || \\\n",
    "    (KV_TILE * ATTN_NC_K) % ATTN_THREADS || (KV_TILE * ATTN_NC_P) % ATTN_THREADS || (KV_TILE * ATTN_NC_V) % ATTN_THREADS\n",
    "#error \"mla_prefill_sm90.cu: the loader needs chunks per row that divide the threads\"\n",
    "#endif\n",
    "\n",
    "extern \"C\" __constant__ attn__launch_config attn_mha_config = {ATTN_THREADS, ATTN_SMEM_BYTES, KV_TILE, ATTN_ROWS_PAD, 1, KV_STAGES, 8, 1};\n",
    "\n",
    "\n",
    "extern \"C\" __global__ void __launch_bounds__(ATTN_THREADS, 1) attn_mla_prefill(const attn__mla_prefill_params p) {\n",
    "    extern __shared__ attn_vec16 attn_smem[];\n",
    "    if (blockDim.x != ATTN_THREADS || attn_dynamic_smem_size() < ATTN_SMEM_BYTES) attn_trap();\n",
    "    const int tile = (int)(gridDim.x - 1 - blockIdx.x), head = blockIdx.y;\n",
    "    const int q_row0 = p.q_row0 + 128 * tile, nq = attn_imin(128, p.nq - 128 * tile), pos0 = p.pos0 + 128 * tile;\n",
    "    const int key_pos0 = p.key_pos0, nkeys = p.nkeys, causal = p.flags & ATTN_MHA_CAUSAL;\n",
    "    if (nq <= 0) return;\n",
    "    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;\n",
    "    const int g = lane >> 2, tq = lane & 3;\n",
    "    const attn_u32 smem0 = attn_smem_addr(attn_smem);\n",
    "    const attn_u32 base = (smem0 + 1023u) & ~1023u;\n",
    "    char *const smem = (char *)attn_smem + (base - smem0);\n",
    "    const attn_u32 sQ = base, sK = base + ATTN_SK_OFF, sV = base + ATTN_SV_OFF;\n",
    "    int *const sBounds = (int *)(smem + ATTN_BOUNDS_OFF); /* [warp][2]: hi min, hi max */\n",
    "\n",
    "    /* ---- Q rows (zero past nq), with tile 0's group ---- */\n",
    "    for (int c = tid; c < ATTN_ROWS_PAD * ATTN_KCPR; c += ATTN_THREADS) {\n",
    "        const int r = c / ATTN_KCPR, col = c - r * ATTN_KCPR;\n",
    "        const int valid = r < nq;\n",
    "        const char *src = valid ? attn_mla_q_chunk(p.q, p.q_stride_token, p.q_stride_head, p.q_pe, p.q_pe_stride_token,\n",
    "                                                   p.q_pe_stride_head, DN, q_row0 + r, head, col)\n",
    "                                : (const char *)p.q;\n",
    "        attn_cp_async16_or_zero(sQ + attn_wgmma_swizzle_offset<ATTN_ROWS_PAD>(r, col), src, !valid);\n",
    "    }\n",
    "\n",
    "    /* ---- this thread's two rows: keys [0, hi) visible; the warpgroup's extremes ---- */\n",
    "    const int row0 = 64 * wg + 16 * (warp & 3) + g;\n",
    "    int hi[2], hi_min = 0x7fffffff, hi_max = (int)0x80000000;\n",
    "#pragma unroll\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        const int R = row0 + 8 * h;\n",
    "        const int b = causal ? attn_imax(0, attn_imin(nkeys, pos0 + R - key_pos0 + 1)) : nkeys;\n",
    "        hi[h] = R < nq ? b : 0;\n",
    "        if (R < nq) { hi_min = attn_imin(hi_min, b); hi_max = attn_imax(hi_max, b); }\n",
    "    }\n",
    "    hi_min = attn_warp_imin(hi_min); hi_max = attn_warp_imax(hi_max);\n",
    "    if (lane == 0) { sBounds[2 * warp] = hi_min; sBounds[2 * warp + 1] = hi_max; }\n",
    "\n",
    "    /* ---- K/V copies of tile `tile` into stage tile % KV_STAGES ---- */\n",
    "    /* Each thread copies fixed 16-byte columns of K_nope, k_pe and V rows (chunks per row\n",
    "       divide the 256 threads: shifts, not divisions, and column bases computed once). */\n",
    "    const char *const kn_base = (const char *)p.k_nope + ((attn_i64)head * p.k_stride_head + (tid % ATTN_NC_K) * 8) * 2;\n",
    "    const char *const kp_base = (const char *)p.k_pe + (tid % ATTN_NC_P) * 8 * 2;\n",
    "    const char *const v_base = (const char *)p.v + ((attn_i64)head * p.v_stride_head + (tid % ATTN_NC_V) * 8) * 2;\n",
    "    const attn_i64 kn_step = p.k_stride_token * 2, kp_step = p.kpe_stride_token * 2, v_step = p.v_stride_token * 2;\n",
    "    auto issue = [&](int tile) {\n",
    "        const int st = tile % KV_STAGES, j0 = tile * KV_TILE;\n",
    "        const attn_u32 kd = sK + (attn_u32)(st * ATTN_K_BYTES), vd = sV + (attn_u32)(st * ATTN_V_BYTES);\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < KV_TILE * ATTN_NC_K / ATTN_THREADS; i++) {\n",
    "            const int r = tid / ATTN_NC_K + i * (ATTN_THREADS / ATTN_NC_K), j = j0 + r;\n",
    "            attn_cp_async16_or_zero(kd + attn_wgmma_swizzle_offset<KV_TILE>(r, tid % ATTN_NC_K),\n",
    "                                    j < nkeys ? kn_base + (attn_i64)j * kn_step : kn_base, j >= nkeys);\n",
    "        }\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < KV_TILE * ATTN_NC_P / ATTN_THREADS; i++) {\n",
    "            const int r = tid / ATTN_NC_P + i * (ATTN_THREADS / ATTN_NC_P), j = j0 + r;\n",
    "            attn_cp_async16_or_zero(kd + attn_wgmma_swizzle_offset<KV_TILE>(r, ATTN_NC_K + tid % ATTN_NC_P),\n",
    "                                    j < nkeys ? kp_base + (attn_i64)j * kp_step : kp_base, j >= nkeys);\n",
    "        }\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < KV_TILE * ATTN_NC_V / ATTN_THREADS; i++) {\n",
    "            const int r = tid / ATTN_NC_V + i * (ATTN_THREADS / ATTN_NC_V), j = j0 + r;\n",
    "            attn_cp_async16_or_zero(vd + attn_wgmma_swizzle_offset<KV_TILE>(r, tid % ATTN_NC_V),\n",
    "                                    j < nkeys ? v_base + (attn_i64)j * v_step : v_base, j >= nkeys);\n",
    "        }\n",
    "    };\n",
    "    const int ntiles = (nkeys + KV_TILE - 1) / KV_TILE;\n",
    "#pragma unroll\n",
    "    for (int s = 0; s < KV_STAGES - 1; s++) {\n",
    "        if (s < ntiles) issue(s);\n",
    "        attn_cp_async_commit();\n",
    "    }\n",
    "    __syncthreads(); /* sBounds */\n",
    "    {\n",
    "        const int *wb = sBounds + 8 * wg;\n",
    "        hi_min = attn_imin(attn_imin(wb[0], wb[2]), attn_imin(wb[4], wb[6]));\n",
    "        hi_max = attn_imax(attn_imax(wb[1], wb[3]), attn_imax(wb[5], wb[7]));\n",
    "    }\n",
    "\n",
    "    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};\n",
    "    float o[ATTN_OT];\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < ATTN_OT; i++) o[i] = 0.0f;\n",
    "    const float qk_scale = p.scale * ATTN_LOG2E;\n",
    "    const attn_u32 sQ_wg = sQ + (attn_u32)(wg * 64 * 128);\n",
    "\n",
    "    for (int it = 0; it < ntiles; it++) {\n",
    "        attn_cp_async_wait<KV_STAGES - 2>();\n",
    "        attn_wgmma_fence_smem_writes();\n",
    "        __syncthreads(); /* tile it visible; stage (it - 1) free */\n",
    "        const int st = it % KV_STAGES, kt0 = it * KV_TILE;\n",
    "        const attn_u32 sK_st = sK + (attn_u32)(st * ATTN_K_BYTES), sV_st = sV + (attn_u32)(st * ATTN_V_BYTES);\n",
    "        const int active = __all_sync(0xffffffffu, kt0 < hi_max);\n",
    "        auto issue_next = [&]() {\n",
    "            if (it + KV_STAGES - 1 < ntiles) issue(it + KV_STAGES - 1);\n",
    "            attn_cp_async_commit();\n",
    "        };\n",
    "        if (active) {\n",
    "            const int need_mask = kt0 + KV_TILE > hi_min;\n",
    "            float s[ATTN_ST];\n",
    "            attn_wgmma_fence();\n",
    "#pragma unroll\n",
    "            for (int k = 0; k < ATTN_DQK; k += 16)\n",
    "                attn_wgmma<KV_TILE, DT>::template ss<0>(s, attn_wgmma_desc_k_major<ATTN_ROWS_PAD>(sQ_wg, k),\n",
    "                                                        attn_wgmma_desc_k_major<KV_TILE>(sK_st, k), k > 0);\n",
    "            attn_wgmma_commit();\n",
    "            issue_next();\n",
    "            attn_wgmma_wait<0>();\n",
    "            attn_wgmma_fence_acc(s);\n",
    "            float mx[2] = {attn_neg_inf(), attn_neg_inf()};\n",
    "            const int dhi[2] = {hi[0] - (kt0 + 2 * tq), hi[1] - (kt0 + 2 * tq)};\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < KV_TILE / 8; i++)\n",
    "#pragma unroll\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    const int h = e >> 1, c = 8 * i + (e & 1);\n",
    "                    float x = s[4 * i + e];\n",
    "                    if (need_mask && c >= dhi[h]) x = attn_neg_inf();\n",
    "                    s[4 * i + e] = x;\n",
    "                    mx[h] = fmaxf(mx[h], x);\n",
    "                }\n",
    "            float bs[2], sum[2] = {0.0f, 0.0f}, alpha[2];\n",
    "#pragma unroll\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                bs[h] = attn_softmax_rebase(m[h], attn_quad_max(mx[h]) * qk_scale, alpha[h]);\n",
    "                l[h] *= alpha[h];\n",
    "            }\n",
    "            attn_wgmma_scale_rows(o, alpha[0], alpha[1]);\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < KV_TILE / 8; i++)\n",
    "#pragma unroll\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    const float x = attn_exp2(fmaf(s[4 * i + e], qk_scale, -bs[e >> 1]));\n",
    "                    s[4 * i + e] = x;\n",
    "                    sum[e >> 1] += x;\n",
    "                }\n",
    "            l[0] += sum[0];\n",
    "            l[1] += sum[1];\n",
    "            attn_u32 a[KV_TILE / 16][4];\n",
    "#pragma unroll\n",
    "            for (int j = 0; j < KV_TILE / 16; j++) attn_wgmma_a_from_acc<DT>(a[j], s, j);\n",
    "            attn_wgmma_fence();\n",
    "#pragma unroll\n",
    "            for (int j = 0; j < KV_TILE / 16; j++)\n",
    "                attn_wgmma<DV, DT>::template rs<1>(o, a[j], attn_wgmma_desc_mn_major<KV_TILE>(sV_st, 16 * j), 1);\n",
    "            attn_wgmma_commit();\n",
    "            attn_wgmma_wait<0>();\n",
    "            attn_wgmma_fence_acc(o);\n",
    "        } else {\n",
    "            issue_next();\n",
    "        }\n",
    "    }\n",
    "\n",
    "    /* ---- epilogue: O / l to shared memory over the stages, lse out, rows out ---- */\n",
    "    attn_cp_async_wait<0>();\n",
    "    __syncthreads();\n",
    "    char *const sO = smem + ATTN_SK_OFF;\n",
    "    const int merge = p.flags & ATTN_MHA_MERGE;\n",
    "#pragma unroll\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        const int R = row0 + 8 * h;\n",
    "        const float L = attn_quad_sum(l[h]);\n",
    "        float lse2 = attn_softmax_lse2(m[h], L); /* this chunk's, base 2 */\n",
    "        float wn = L > 0.0f ? attn_rcp(L) : 0.0f, wo = 0.0f;           /* weights of new o and old out */\n",
    "        const attn_i64 lse_at = (attn_i64)(q_row0 + R) * p.lse_stride_token + (attn_i64)head * p.lse_stride_head;\n",
    "        const char *old = (const char *)p.out + ((attn_i64)(q_row0 + R) * p.out_stride_token + (attn_i64)head * p.out_stride_head + 2 * tq) * 2;\n",
    "        if (merge && R < nq) attn_mha_merge_weights(p.lse[lse_at], &lse2, &wn, &wo); /* out = wo old + wn o */\n",
    "        char *orow = sO + (R * ATTN_O_PITCH + 2 * tq) * 2;\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < DV / 8; i++) {\n",
    "            float x0 = o[4 * i + 2 * h] * wn, x1 = o[4 * i + 2 * h + 1] * wn;\n",
    "            if (wo > 0.0f) {\n",
    "                x0 += wo * attn_load<DT>(old, 8 * i);\n",
    "                x1 += wo * attn_load<DT>(old, 8 * i + 1);\n",
    "            }\n",
    "            *(attn_u32 *)(orow + 8 * i * 2) = attn_elem<DT>::pack2(x0, x1);\n",
    "        }\n",
    "        if (tq == 0 && R < nq && p.lse) p.lse[lse_at] = lse2 * ATTN_LN2;\n",
    "    }\n",
    "    __syncthreads();\n",
    "    for (int u = tid; u < nq * ATTN_VCPR; u += ATTN_THREADS) {\n",
    "        const int R = u / ATTN_VCPR, c = u - R * ATTN_VCPR;\n",
    "        const attn_vec16 v = *(const attn_vec16 *)(sO + (R * ATTN_O_PITCH + c * 8) * 2);\n",
    "        attn_stg16((char *)p.out + ((attn_i64)(q_row0 + R) * p.out_stride_token + (attn_i64)head * p.out_stride_head + c * 8) * 2, v);\n",
    "    }\n",
    "}\n",
    0};
static const char *const attn__kernel_src_online_softmax_cuh[] = {
    "/* online_softmax.cuh - the online softmax of every attention kernel, written once.\n",
    "\n",
    "   Scores are in base 2 with the softmax scale folded in (x = s * scale * log2 e), so every\n",
    "   exponential is one ex2.approx. A row keeps m, the largest score seen so far (-inf before\n",
    "   any key), and l, the sum of exp2(x - m) over the keys seen; O holds the same sum of\n",
    "   exp2(x - m) * v. For each key tile:\n",
    "\n",
    "     base  = attn_softmax_rebase(m, tile_max, alpha)   m := max(m, tile_max)\n",
    "     l, O *= alpha                                      alpha = exp2(m_old - base)\n",
    "     p_j   = exp2(x_j - base), l += sum p_j, O += P V\n",
    "\n",
    "   `base` is m, except while no key has been seen (m = -inf): then it is 0, so exp2 of a\n",
    "   masked score (-inf - 0) is 0 and never NaN (-inf - -inf), and alpha = exp2(-inf) = 0\n",
    "   clears whatever O and l held. At the end, attn_softmax_lse2 gives the row's log-sum-exp\n",
    "   in base 2 (-inf for a row that saw no key; l >= 1 otherwise, the max key contributing\n",
    "   exp2(0)). The merge of such (m, l, O) states across splits or warps is split_merge.cuh.\n",
    "\n",
    "   The reductions that make tile_max a row's maximum differ per kernel (the 4 lanes of an\n",
    "   mma row group, or several warps through shared memory) and stay with the kernels. */\n",
    "#ifndef ATTN_ONLINE_SOFTMAX_CUH\n",
    "#define ATTN_ONLINE_SOFTMAX_CUH\n",
    "\n",
    "#include \"attn_common.cuh\"\n",
    "#include \"split_merge.cuh\"\n",
    "\n",
    "/* Folds a tile's row maximum `tile_max` (scaled, base 2) into the running max `m`; returns\n",
    "   the base the tile's exponentials subtract, and sets `alpha`, the factor the row's l and O\n",
    "   from earlier tiles are multiplied by. */\n",
    "ATTN_DEV float attn_softmax_rebase(float &m, float tile_max, float &alpha) {\n",
    "    const float mnew = fmaxf(m, tile_max);\n",
    "    const float base = mnew == attn_neg_inf() ? 0.0f : mnew; /* nothing seen yet: p = 0, not NaN */\n",
    "    alpha = attn_exp2(m - base);                              /* m = -inf -> 0 */\n",
    "    m = mnew;\n",
    "    return base;\n",
    "}\n",
    "\n",
    "/* The row's log-sum-exp in base 2 from its final (m, l); -inf when no key was seen. */\n",
    "ATTN_DEV float attn_softmax_lse2(float m, float l) { return l > 0.0f ? m + attn_log2(l) : attn_neg_inf(); }\n",
    "\n",
    "/* Attention sinks: joins a row's final (m, l) with its head's sink, a logit (natural log,\n",
    "   like the scaled scores before the base-2 fold) in the denominator with no value: m :=\n",
    "   max(m, sink), l := l 2^(m_old - m) + 2^(sink - m). Returns the factor O (summed over the\n",
    "   old m) takes: O / l after the join is sum 2^(x - m) v / (sum 2^(x - m) + 2^(sink - m)).\n",
    "   Applied once per row, where a row is finished (never to split partials: the merge\n",
    "   applies it). A row that saw no key gets l = 1, factor 0: out 0, lse = the sink. */\n",
    "ATTN_DEV float attn_softmax_sink(float sink, float &m, float &l) {\n",
    "    const float sk = sink * ATTN_LOG2E, mx = fmaxf(m, sk);\n",
    "    const float w = l > 0.0f ? attn_exp2(m - mx) : 0.0f;\n",
    "    l = l * w + attn_exp2(sk - mx);\n",
    "    m = mx;\n",
    "    return w;\n",
    "}\n",
    "\n",
    "#endif /* ATTN_ONLINE_SOFTMAX_CUH */\n",
    0};
static const char *const attn__kernel_src_paged_attention_cu[] = {
    "/* paged_attention.cu - paged attention forward over a varlen batch (decodes and chunked\n",
    "   prefills in one launch), the GPU form of the CPU backend's attn__cpu_task_run /\n",
    "   attn__cpu_merge_run; vLLM's unified attention, written as CUDA.\n",
    "\n",
    "   =====================================================================================\n",
    "   WHAT IT COMPUTES (exactly the CPU backend's function)\n",
    "   =====================================================================================\n",
    "   Request r has query_len = query_start_loc[r+1] - query_start_loc[r] tokens, which are\n",
    "   the LAST query_len positions of its seq_len = seq_lens[r] keys: query token i (0-based\n",
    "   within the request) sits at position pos = seq_len - query_len + i. Query head h reads\n",
    "   KV head h / GROUP. Key j (0 <= j < seq_len) lives in cache block block_table[r][j /\n",
    "   BLOCK_SIZE], row j % BLOCK_SIZE. Key j is visible from pos iff lo <= j < hi with\n",
    "       lo = window ? max(0, pos - window + 1) : 0\n",
    "       hi = causal ? pos + 1 : (window ? min(seq_len, pos + window) : seq_len)\n",
    "   where causal is bit 0 of the work item's flags (a run-time value read from device\n",
    "   memory, so one compiled variant serves causal and non-causal batches and a captured\n",
    "   graph follows the batch that the last build described).\n",
    "   (attn__visible_keys). Scores, in base-2 units (exp2 softmax, the scale folded in):\n",
    "       s = q.k * scale * log2(e)                                  (SOFTCAP 0)\n",
    "       s = softcap * tanh(q.k * scale / softcap) * log2(e)        (SOFTCAP 1)\n",
    "       s += alibi_slopes[h] * log2(e) * (j - pos)                 (ALIBI 1)\n",
    "   out = sum_j 2^(s_j - m) v_j / sum_j 2^(s_j - m), rounded to DT_Q (RNE); a row that sees\n",
    "   no key gets out = 0 and lse = -inf; lse = (m + log2(l)) * ln(2) (base e, f32).\n",
    "\n",
    "   =====================================================================================\n",
    "   DEFINES (every one a compile-time constant; the host compiles one variant per layer)\n",
    "   =====================================================================================\n",
    "   required  HEAD_DIM     multiple of 8, 8..256 (run against the CPU on an H200: 64, 80,\n",
    "                          96, 120, 128, 256; 120 takes the zero-column path), or a\n",
    "                          multiple of 32 in 288..512 with tensor cores (WIDE HEADS)\n",
    "             BLOCK_SIZE   cache block size, a multiple of 16 (any; tiles need not align)\n",
    "             GROUP        query heads per KV head (num_heads / num_kv_heads), >= 1\n",
    "             DT_Q         q/out element type: 0 f32, 1 f16, 2 bf16\n",
    "             DT_KV        cache element type, same numbering, or an 8-bit cache: 4 fp8 e4m3,\n",
    "                          5 fp8 e5m2 (per-tensor scales), 6 int8 (KV_PTH 1 only); see\n",
    "                          8-BIT CACHES\n",
    "             TILE_TOKENS  query tokens per CTA; TILE_TOKENS * GROUP <= 128\n",
    "   flags     KV_PTH       1: per-token-head scales (DT_KV 4 or 6), see 8-BIT CACHES\n",
    "             WINDOW SOFTCAP ALIBI   (0/1, default 0; WINDOW and SOFTCAP take their values\n",
    "             from params; WINDOW 1 with params.window 0 means no window). Causality is not\n",
    "             a define: it is a per-work-item flag (WORK LIST, item 7).\n",
    "   tuning    WARPS_N      warps sharing one row tile, each on its slice of a K/V tile\n",
    "             WARP_ROWS    row tiles of 16 per warp, 1 (default) or 2 (FlashAttention-2: each\n",
    "                          K/V fragment read from shared memory feeds two mma). A request: 2 is\n",
    "                          in force only with tensor cores, an even number of row tiles,\n",
    "                          HEAD_DIM <= 128, SOFTCAP 0 and ALIBI 0 (the register file holds no\n",
    "                          more); elsewhere it quietly stays 1, so one -D serves every variant\n",
    "             KV_TILE      keys per K/V tile (shared-memory stage)\n",
    "             KV_STAGES    K/V tiles in shared memory (default 2, double-buffered; 3 for\n",
    "                          decode shapes on sm_90 whose stages fit in 112 KiB)\n",
    "             MIN_CTAS     CTAs per SM the registers must allow (default 1; 3 for the 8-bit\n",
    "                          decode on sm_90)\n",
    "             PERSISTENT   1: CTAs loop over the work items (grid any size, LAUNCH); the\n",
    "                          library sets it for its decode shapes. 0 (default): one item per CTA\n",
    "             CASCADE      1: rows written to out join the partials of a cascade's prefix\n",
    "                          pass (see CASCADE below; the library sets it for its decode\n",
    "                          shapes). 0 (default): prefix_splits is ignored\n",
    "             SPLIT_S      WIDE HEADS: 1 (default where HEAD_DIM % 64 == 0) the column groups\n",
    "                          compute half of S each and exchange it, 0 both compute all of S\n",
    "             Q_IN_REGS    keep the Q fragments in registers (default: MMA, HEAD_DIM <= 128\n",
    "                          and one row tile per warp; with two, Q is read from shared memory\n",
    "                          per K/V tile)\n",
    "             (defaults below; the values in force are exported, see attn_paged_config)\n",
    "   Tensor cores (mma.sync m16n8k16, f32 accumulators) when DT_Q == DT_KV and both are\n",
    "   f16 or bf16, and for every 8-bit cache (f16 mma, any DT_Q); otherwise (any f32 involved, or mixed 16-bit types) a plain-FMA variant\n",
    "   with the same tiling, the same softmax and the same epilogue, in f32 throughout.\n",
    "   Suggested variants (the CUDA backend's, attn__cuda_layer_variants in attn.h): decode\n",
    "   (query_len 1): TILE_TOKENS = max(1, 16 / GROUP), so that one warp's 16 rows hold the\n",
    "   whole group, in two shapes: the default (4 warps, 64-key tiles, 2 CTAs per SM on sm_90)\n",
    "   for batches that fill the device, and KV_TILE 128 WARPS_N 8 KV_STAGES 3 (one 8-warp CTA\n",
    "   per SM, sm_90) for batches of at most one tile per SM; prefill: TILE_TOKENS = max(1, 64 /\n",
    "   GROUP) (four row tiles, four warps), or with WARP_ROWS 2 TILE_TOKENS = 128 / GROUP\n",
    "   (eight row tiles, four warps of 32 rows: FlashAttention-2's 128 x 64 block; 64 / GROUP\n",
    "   gives two warps). One launch serves any mix of requests; a mixed batch runs best as two\n",
    "   launches (decodes with the decode variant, the rest with the prefill variant), each\n",
    "   with its own work list, because a decode row in a prefill CTA leaves three of its four\n",
    "   warps idle.\n",
    "\n",
    "   =====================================================================================\n",
    "   LAUNCH\n",
    "   =====================================================================================\n",
    "   attn_paged_attention:      grid (PERSISTENT 1: any; 0: >= *num_work, 1, 1), block\n",
    "                              (attn_paged_config.threads), dynamic shared memory\n",
    "                              attn_paged_config.shared_bytes bytes (over 48 KiB for most\n",
    "                              variants: set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES once\n",
    "                              after loading). PERSISTENT 1: CTA b runs items b, b + grid, ...\n",
    "                              below *num_work, so an eager launch gives each item its CTA (grid\n",
    "                              = *num_work) and a captured one at most the CTAs the device holds\n",
    "                              at once (it then replays any batch of the capacity in one wave,\n",
    "                              without CTAs that load *num_work and exit). PERSISTENT 0: CTAs past\n",
    "                              *num_work exit, so a graph captured with the capacity replays any\n",
    "                              smaller batch.\n",
    "                              A wrong block size or too little shared memory traps.\n",
    "   attn_paged_merge_partials: grid (>= *num_merge), block 128, no shared memory; launch it\n",
    "                              after attn_paged_attention on the same stream when work items\n",
    "                              write partials without a merge index (flags bits 8+ = 0).\n",
    "                              Items that carry one merge in the attention launch itself\n",
    "                              (FUSED MERGE below) and need no second launch.\n",
    "   Both take the same attn__paged_params by value. Requirements: kv_cache 16-byte aligned\n",
    "   (cp.async); partial_o/partial_ml 16-byte aligned; q/out rows need not be aligned (16-byte\n",
    "   paths are taken when they are).\n",
    "   attn_paged_config (an extern \"C\" __constant__ attn__launch_config, attn_params.cuh; read it with cuModuleGetGlobal +\n",
    "   cuMemcpyDtoH at layer init): {threads, dynamic shared bytes, KV_TILE, TILE_TOKENS * GROUP\n",
    "   (= rows of a partial slot), TILE_TOKENS, KV_STAGES, WARPS_N, 1 if tensor cores, 0 (no\n",
    "   tensor map), PERSISTENT}.\n",
    "\n",
    "   =====================================================================================\n",
    "   WORK LIST (host-built, device memory; one entry per CTA, 8 x int32 = 32 bytes)\n",
    "   =====================================================================================\n",
    "     work[8*i + 0]  req       request index (row of block_table, seq_lens, query_start_loc)\n",
    "     work[8*i + 1]  kv_head   0 .. num_kv_heads-1; the CTA serves query heads\n",
    "                              kv_head*GROUP .. kv_head*GROUP + GROUP-1\n",
    "     work[8*i + 2]  tok0      first query token of the tile, 0-based within the request\n",
    "     work[8*i + 3]  ntok      query tokens in the tile, 1..TILE_TOKENS (tok0+ntok <= query_len)\n",
    "     work[8*i + 4]  key0      first key the CTA reads (absolute position, >= 0)\n",
    "     work[8*i + 5]  key1      one past the last key (<= seq_len; clamped to it). The CTA\n",
    "                              never reads a key outside [key0, key1) and masks each row to\n",
    "                              its visible range inside it: give the union of the tile's\n",
    "                              visible ranges, or a part of it for split-KV (an empty range\n",
    "                              is allowed: rows with nothing visible)\n",
    "     work[8*i + 6]  slot      -1: write out (and lse) for these rows; >= 0: write an\n",
    "                              unnormalised partial into partial slot `slot` instead\n",
    "     work[8*i + 7]  flags     bit 0: causal (hi = pos + 1); bits 1-7: 0; bits 8-31:\n",
    "                              merge index + 1 of a split item (0: none), see FUSED MERGE\n",
    "   Split-KV: the splits of one (req, kv_head, tok0, ntok) tile cover disjoint key ranges\n",
    "   whose union is the tile's visible range, and use consecutive slots slot0..slot0+n-1;\n",
    "   split boundaries at multiples of KV_TILE (and of BLOCK_SIZE) waste no loads. Order the\n",
    "   list longest first (key1 - key0) so the long items start early. Split only as far as\n",
    "   one wave of resident CTAs (cuOccupancyMaxActiveBlocksPerMultiprocessor x SMs; a decode\n",
    "   CTA of head 128 on an H200 is 2 per SM): a second, partial wave costs more than the\n",
    "   splits gain. tests/cuda_kernels.c (build_work) is a reference scheduler.\n",
    "   MERGE LIST (one entry per split tile, 8 x int32):\n",
    "     merge[8*i + 0..3]  req, kv_head, tok0, ntok   (as the tile's work items)\n",
    "     merge[8*i + 4]     slot0      first slot of the tile's splits\n",
    "     merge[8*i + 5]     num_splits\n",
    "     merge[8*i + 6..7]  0          reserved\n",
    "   PARTIAL WORKSPACE (f32): slot s holds ROWS = TILE_TOKENS * GROUP rows, row\n",
    "   R = t * GROUP + g for query token tok0 + t and head kv_head*GROUP + g (rows t >= ntok\n",
    "   are not written):\n",
    "     partial_o  [num_slots][ROWS][HEAD_DIM]  O = sum_j 2^(s_j - m) v_j   (unnormalised)\n",
    "     partial_ml [num_slots][ROWS][2]         (m, l): running max of s (base 2) and\n",
    "                                             l = sum_j 2^(s_j - m); a row that saw no key\n",
    "                                             has m = -inf, l = 0 and contributes nothing\n",
    "   The merge: M = max of m over splits with l > 0; out = sum 2^(m - M) O / sum 2^(m - M) l.\n",
    "   FUSED MERGE (variants of at most 16 rows, the decode shape): when a split item carries\n",
    "   merge index i + 1 in flags and merge_count is given, the CTA that finishes last of merge entry i's splits merges them: each split CTA\n",
    "   stores its partial, fences, and adds 1 to merge_count[i]; the one that sees\n",
    "   num_splits - 1 reads every partial (L2 loads, never the read-only path) and writes\n",
    "   out/lse, then sets merge_count[i] back to 0, so the counters are zero between launches\n",
    "   (the host zeroes them once; a replayed graph finds them so).\n",
    "   CASCADE (attn.h's common_prefix_len on a decode batch): a launch before this one (the\n",
    "   prefill tiles of paged_attention.cu or paged_prefill_sm90.cu, its own work list) attends\n",
    "   the shared prefix keys [0, P) for every query token of the batch: items of request 0\n",
    "   (whose block table holds the prefix, as every request's does), tok0 = the first batch\n",
    "   token of a tile of prefix_tile_tokens (request 0's query_start_loc is 0, so tok0 counts\n",
    "   batch tokens), non-causal (every query follows the prefix), split into ns key ranges,\n",
    "   each writing a partial (the PARTIAL WORKSPACE's format, prefix_rows rows a slot) into\n",
    "   prefix_o / prefix_ml: slot (j * num_kv_heads + kv_head) * ns + s for tile j and split s.\n",
    "   This launch's items then cover keys [P, seq_len) only, and every row that writes out\n",
    "   joins its prefix partials by LSE before the sink and the normalisation (attn_store_row8:\n",
    "   *prefix_splits = ns > 0; 0 or prefix_splits NULL: no prefix). A graph replays both\n",
    "   launches; a build without a prefix sets the count of the first and ns to 0.\n",
    "\n",
    "   =====================================================================================\n",
    "   8-BIT CACHES (DT_KV 4, 5, 6: the CPU backend's fp8 and int8 caches, same bytes)\n",
    "   =====================================================================================\n",
    "   Per tensor (KV_PTH 0, fp8): the cache holds code(x / k_scale) (and v_scale for V);\n",
    "   the scales are params.k_scale / v_scale (device pointers to one float, read at every\n",
    "   launch, so a replayed graph sees a new value) or, where those are NULL,\n",
    "   params.k_scale_value / v_scale_value. A scale that is not finite and > 0 makes every\n",
    "   CTA return at once: nothing is written (the host cannot check a device value without a\n",
    "   synchronisation; the CPU backend fails the call instead).\n",
    "   Per token and head (KV_PTH 1, int8 or e4m3): a block half is [BLOCK_SIZE][num_kv_heads]\n",
    "   [HEAD_DIM] codes, then [BLOCK_SIZE][num_kv_heads] f32 scales (K half, then V half; the\n",
    "   code rows stay 16-byte aligned), x = code * scale of its row.\n",
    "   HEAD_DIM is a multiple of 16. The CTA copies codes (half the bytes of f16) with cp.async\n",
    "   into the stages (rows of HEAD_DIM bytes, 16 more where that makes an even number of\n",
    "   16-byte units: conflict-free ldmatrix) and, KV_PTH, each key's two scales (4-byte\n",
    "   copies). The fragments come straight from the codes, converted once each in registers\n",
    "   (exact: every code value is an f16; attn_codes4_to_f16x2): ldmatrix reads the code rows\n",
    "   as b16 matrices. K (non-transposed): lane (g, t) gets key g's codes of dims 4t .. 4t + 3\n",
    "   of a 16-dim block, i.e. b0 and b1 of the B fragment if the mma's k index 2t + j means\n",
    "   dim 4t + j and 2t + 8 + j means dim 4t + 2 + j: Q is stored in shared memory with its\n",
    "   columns in that order. V (.trans): lane (g, t) gets the codes of dims 2g and 2g + 1 for\n",
    "   keys 2t and 2t + 1 (and + 8); a byte permute makes the B fragment of dim 2g (even) and\n",
    "   of dim 2g + 1 (odd), so O's n8 tiles hold the even and the odd dims of each 16 and the\n",
    "   epilogue puts them back in order. The mma type is f16 whatever DT_Q is: Q is converted\n",
    "   to f16 once, scaled by a power of two 2^e chosen per CTA from its rows' largest |q|\n",
    "   (into [2^14, 2^15): no overflow, no subnormals that matter), and 2^-e goes into the\n",
    "   score scale with k_scale (per tensor). Per token and\n",
    "   head: each score is multiplied by its key's K scale; each probability by its key's V\n",
    "   scale over 2^E (E the largest V-scale exponent the warp has seen: O is rescaled by a\n",
    "   power of two when it grows, as the softmax max) before P V, while l sums the unscaled\n",
    "   probabilities; O is multiplied by v_scale (per tensor) or 2^E in the epilogue. So S,\n",
    "   the softmax and O are the CPU's up to the order of the sums and P's rounding to f16.\n",
    "   Q rows need no alignment here (read element by element, once per CTA).\n",
    "\n",
    "   =====================================================================================\n",
    "   WIDE HEADS (HEAD_DIM 288..512, Gemma-class 512)\n",
    "   =====================================================================================\n",
    "   A warp keeps O for its 16 rows in registers: HEAD_DIM / 8 n8 tiles x 4 floats, 128\n",
    "   registers at 256, 256 at 512 (the whole register file). Past 256 the CTA's warps come in\n",
    "   two column groups (VSPLIT 2): warp group wv keeps O's columns [wv * HEAD_DIM / 2, (wv + 1)\n",
    "   * HEAD_DIM / 2) and reads only that half of each V row from shared memory in P V. K and\n",
    "   V are copied into shared memory once for both groups (every byte of the cache is still\n",
    "   read once), and each group computes the full S = Q K^T over all HEAD_DIM dims of its\n",
    "   rows and keys itself: the two groups' scores, maxima and sums are the same numbers (the\n",
    "   same instructions on the same operands), so each has the softmax it needs without an\n",
    "   exchange, at the cost of S computed twice (a decode tile waits on memory, not on the\n",
    "   mma; a prefill tile pays 3/2 of the FLOPs: docs/PERF.md, issue 23 (5)). The epilogue\n",
    "   writes each group's half of O into the same shared rows (m and l once, from group 0)\n",
    "   and from there on nothing differs. SPLIT_S 1 (the default where HEAD_DIM % 64 == 0):\n",
    "   instead of computing S twice, group wv computes the partial S over dims [wv * HEAD_DIM /\n",
    "   2, (wv + 1) * HEAD_DIM / 2), the two warps of a pair (same rows, same keys) exchange their\n",
    "   partials through shared memory (a second __syncthreads per tile, which every warp meets,\n",
    "   the ones that skip the tile too; a barrier of the pair's 64 threads alone measured 3 %\n",
    "   faster, but compute-sanitizer's racecheck reported hazards around it) and both form S =\n",
    "   partial(0) + partial(1), in that order, so their scores are still the same numbers; one\n",
    "   exchange buffer suffices, because the tile's first __syncthreads keeps a warp from\n",
    "   writing the next tile's partial before its partner has read this one. Q is read from\n",
    "   shared memory per K/V tile (Q_IN_REGS 0), tiles are 32 keys (16 on sm_80 for tiles of\n",
    "   more than one row tile: its 163 KiB), two warps split a decode tile's keys (WARPS_N 2:\n",
    "   four warps in all).\n",
    "\n",
    "   =====================================================================================\n",
    "   INSIDE A CTA\n",
    "   =====================================================================================\n",
    "   Rows: the CTA's ROWS = TILE_TOKENS * GROUP query rows (row R = token R / GROUP, head\n",
    "   member R % GROUP; rows of tokens >= ntok are padding, zero Q, never stored), padded to\n",
    "   ROW_TILES * 16. Warp w = (wv * ROW_TILES / WARP_ROWS + wm) * WARPS_N + wn (wv: the\n",
    "   column group of WIDE HEADS, 0 below 288) owns row tiles wm * WARP_ROWS ..\n",
    "   wm * WARP_ROWS + WARP_ROWS - 1 (16 rows each, the M of mma) and key slice wn: keys\n",
    "   [wn * KW, (wn + 1) * KW) of every K/V tile, KW = KV_TILE / WARPS_N; the CTA has\n",
    "   ROW_TILES / WARP_ROWS * WARPS_N warps (attn_paged_config.threads / 32). So a decode CTA (one\n",
    "   row tile) has four warps splitting each tile's keys, a prefill CTA four warps of 16 rows\n",
    "   (or, WARP_ROWS 2, of 32 rows) each reading the whole tile (FlashAttention-2). Each warp\n",
    "   keeps its own online softmax (m, l per row, O in registers, per row tile); the epilogue\n",
    "   combines the WARPS_N slices of a row through shared memory.\n",
    "   Pipeline (all threads): the CTA walks tiles of KV_TILE keys aligned to multiples of\n",
    "   KV_TILE, from floor(key0 / KV_TILE) * KV_TILE to key1. Every thread copies fixed 16-byte\n",
    "   chunks (the same chunk positions in every tile) of K and V with cp.async into stage\n",
    "   (tile % KV_STAGES); keys outside [key0, key1) are zero-filled and never read from\n",
    "   global memory (nor is their block_table entry). The byte offset in the cache of every\n",
    "   key row of the tiles in flight (block * block bytes + row in block * row bytes, read\n",
    "   from block_table) sits in shared memory (sBlk), so a copy's address is one 64-bit add;\n",
    "   the offsets of tile it + KV_STAGES are loaded into registers before tile it computes\n",
    "   and stored after it, so the block-table latency hides under compute. Per tile: wait for the tile's group,\n",
    "   __syncthreads (tile visible, and every warp is done with the stage about to be\n",
    "   refilled), issue the copy of tile it + KV_STAGES - 1, compute tile it. One barrier per\n",
    "   tile.\n",
    "   Compute per warp and tile (tensor cores): S = Q K^T (Q fragments by ldmatrix from shared\n",
    "   memory, K fragments by ldmatrix, m16n8k16 with f32 accumulators), scale/soft cap/ALiBi/\n",
    "   mask in registers (masking only on tiles that cross a row's visible range; a warp skips\n",
    "   tiles none of its rows sees: causal tiles above the diagonal), online softmax in base 2\n",
    "   with ex2.approx (rows reduced over the 4 lanes of an mma row group), P converted to\n",
    "   16-bit in registers as the A operand of O += P V (V fragments by ldmatrix.trans). With\n",
    "   WARP_ROWS 2 each K fragment (per 16 dims x 16 keys) and each V fragment (per 16 keys x\n",
    "   16 dims) is loaded once and feeds the mma of both row tiles; the skip and mask tests\n",
    "   cover the warp's 32 rows.\n",
    "   FMA variant: the same S and O fragment layout (lane 4g+t: rows g and g+8; columns\n",
    "   8n + 2t, 8n + 2t + 1), computed with f32 FMAs from shared memory; P is broadcast to the\n",
    "   lanes of its row with shuffles.\n",
    "   Epilogue: O, m, l of every warp to shared memory (over the K/V stages), then all threads\n",
    "   combine the WARPS_N slices of each row and write 8 elements at a time: normalised rows\n",
    "   to out (and lse), or the partial to the workspace.\n",
    "   Shared memory: [Q: ROW_TILES*16 rows x Q_PITCH][sBlk: KV_STAGES x KV_TILE int64]\n",
    "   [K: KV_STAGES x KV_TILE x KV_PITCH][V: same], rows padded by 16 bytes so ldmatrix reads\n",
    "   8 rows without bank conflicts; for HEAD_DIM % 16 == 8 the Q and K rows carry 8 zero\n",
    "   columns up to a multiple of 16. The epilogue reuses the K/V stages:\n",
    "   [O: WARPS_N x ROW_TILES*16 x (HEAD_DIM + 4) f32][m: WARPS_N x rows][l: WARPS_N x rows x 4].\n",
    "   attn_paged_config.shared_bytes is the total; the kernel traps when the launch gives less.\n",
    "\n",
    "   =====================================================================================\n",
    "   THE CODE\n",
    "   =====================================================================================\n",
    "   attn_paged_traits turns the defines into one struct of constants (what the variant is,\n",
    "   its warps, tiles and shared-memory layout); every feature below is chosen by `if\n",
    "   constexpr` on it. The kernel is a sequence of named stages, each a function of its own:\n",
    "   the work-item prologue (paged_common.cuh), the Q load, the K/V tile loader\n",
    "   (paged_tile_loader.cuh for the addressing; attn_paged_issue here for the pitched\n",
    "   copies), S = Q K^T (8-bit, tensor-core and FMA forms), the scores and online softmax\n",
    "   (online_softmax.cuh), O += P V (three forms), the epilogue, and the split merge\n",
    "   (split_merge.cuh). */\n",
    "#include \"paged_common.cuh\"\n",
    "#include \"paged_tile_loader.cuh\"\n",
    "\n",
    "/* ---- the defines: required ones checked, the others given their defaults ---- */\n",
    "#if !defined(HEAD_DIM) || !defined(BLOCK_SIZE) || !defined(GROUP) || !defined(DT_Q) || \\\n",
    "    !defined(DT_KV) || !defined(TILE_TOKENS)\n",
    "#error \"paged_attention.cu: define HEAD_DIM, BLOCK_SIZE, GROUP, DT_Q, DT_KV and TILE_TOKENS\"\n",
    "#endif\n",
    "#ifndef WINDOW\n",
    "#define WINDOW 0\n",
    "#endif\n",
    "#ifndef SOFTCAP\n",
    "#define SOFTCAP 0\n",
    "#endif\n",
    "#ifndef ALIBI\n",
    "#define ALIBI 0\n",
    "#endif\n",
    "#ifndef KV_PTH\n",
    "#define KV_PTH 0\n",
    "#endif\n",
    "/* tuning: 0 (Q_IN_REGS -1) is \"the default\", which attn_paged_traits works out */\n",
    "#ifndef WARP_ROWS\n",
    "#define WARP_ROWS 1\n",
    "#endif\n",
    "#ifndef WARPS_N\n",
    "#define WARPS_N 0\n",
    "#endif\n",
    "#ifndef KV_TILE\n",
    "#define KV_TILE 0\n",
    "#endif\n",
    "#ifndef KV_STAGES\n",
    "#define KV_STAGES 0\n",
    "#endif\n",
    "#ifndef MIN_CTAS\n",
    "#define MIN_CTAS 0\n",
    "#endif\n",
    "#ifndef CASCADE\n",
    "#define CASCADE 0 /* 1: rows stored to out join the prefix pass's partials (CASCADE; decode shapes) */\n",
    "#endif\n",
    "#ifndef PERSISTENT\n",
    "#define PERSISTENT 0\n",
    "#endif\n",
    "#ifndef Q_IN_REGS\n",
    "#define Q_IN_REGS -1\n",
    "#endif\n",
    "#ifndef SPLIT_S\n",
    "#define SPLIT_S -1 /* WIDE HEADS: -1 the default (1 where HEAD_DIM % 64 == 0), 0 S computed by both groups */\n",
    "#endif\n",
    "\n",
    "__host__ __device__ constexpr int attn_cmax(int a, int b) { return a > b ? a : b; }\n",
    "\n",
    "/* The element type of a cache: its 16/32-bit storage, or a byte of code for 8-bit caches. */\n",
    "template <int DT, bool CODES = ATTN_DT_IS_8BIT(DT)> struct attn_cache_elem { typedef typename attn_elem<DT>::storage type; };\n",
    "template <int DT> struct attn_cache_elem<DT, true> { typedef attn_u8 type; };\n",
    "template <bool C, class A, class B> struct attn_pick { typedef A type; };\n",
    "template <class A, class B> struct attn_pick<false, A, B> { typedef B type; };\n",
    "\n",
    "struct attn_paged_traits {\n",
    "    /* the variant */\n",
    "    static constexpr int head_dim = HEAD_DIM, block_size = BLOCK_SIZE, group = GROUP, dt_q = DT_Q, dt_kv = DT_KV,\n",
    "                         tile_tokens = TILE_TOKENS;\n",
    "    static constexpr bool window = WINDOW != 0, softcap = SOFTCAP != 0, alibi = ALIBI != 0, kv_pth = KV_PTH != 0;\n",
    "    static constexpr bool kv8 = ATTN_DT_IS_8BIT(DT_KV);\n",
    "    static_assert(head_dim % 8 == 0 && head_dim >= 8 && head_dim <= 512, \"paged_attention.cu: HEAD_DIM must be a multiple of 8 in 8..256 (or of 32 in 288..512)\");\n",
    "    static_assert(block_size % 16 == 0 && block_size > 0, \"paged_attention.cu: BLOCK_SIZE must be a positive multiple of 16\");\n",
    "    static_assert(dt_q >= 0 && dt_q <= 2 && dt_kv >= 0 && dt_kv <= 6 && dt_kv != 3, \"paged_attention.cu: DT_Q must be 0-2, DT_KV 0-2 or 4-6\");\n",
    "    static_assert(!kv_pth || dt_kv == ATTN_DT_E4M3 || dt_kv == ATTN_DT_I8, \"paged_attention.cu: KV_PTH 1 takes DT_KV 4 (fp8 e4m3) or 6 (int8)\");\n",
    "    static_assert(dt_kv != ATTN_DT_I8 || kv_pth, \"paged_attention.cu: an int8 cache has per-token-head scales (KV_PTH 1)\");\n",
    "    static_assert(!kv8 || head_dim % 16 == 0, \"paged_attention.cu: 8-bit caches take HEAD_DIM a multiple of 16\");\n",
    "\n",
    "    /* rows: TILE_TOKENS * GROUP, padded to row tiles of 16 (the M of mma) */\n",
    "    static constexpr int rows = tile_tokens * group, row_tiles = (rows + 15) / 16, rows_pad = row_tiles * 16;\n",
    "    static_assert(tile_tokens >= 1 && group >= 1 && rows <= 128, \"paged_attention.cu: need TILE_TOKENS >= 1, GROUP >= 1 and TILE_TOKENS * GROUP <= 128\");\n",
    "\n",
    "    /* element types: tensor cores for equal 16-bit types and every 8-bit cache (f16 mma);\n",
    "       the FMA form otherwise */\n",
    "    static constexpr bool use_mma = kv8 || (dt_q == dt_kv && dt_q != ATTN_DT_F32);\n",
    "    /* WIDE HEADS: two warp groups split O's columns past 256 */\n",
    "    static_assert(head_dim <= 256 || (head_dim % 32 == 0 && use_mma),\n",
    "                  \"paged_attention.cu: HEAD_DIM over 256 takes a multiple of 32 and the tensor-core forms \"\n",
    "                  \"(DT_Q == DT_KV, 16-bit, or an 8-bit cache)\");\n",
    "    static constexpr int vsplit = head_dim > 256 ? 2 : 1; /* warp groups along O's columns */\n",
    "    static constexpr int ovw = head_dim / vsplit;         /* O columns a warp keeps */\n",
    "    static constexpr int otw = ovw / 8;                   /* its n8 tiles of O */\n",
    "    /* WIDE HEADS, SPLIT_S: each group computes half of S's dot products (exchanged) */\n",
    "    static constexpr bool split_s = vsplit > 1 && (SPLIT_S >= 0 ? SPLIT_S != 0 : head_dim % 64 == 0);\n",
    "    static_assert(!split_s || head_dim % 64 == 0, \"paged_attention.cu: SPLIT_S 1 takes HEAD_DIM a multiple of 64\");\n",
    "    static constexpr int dt_m = kv8 ? ATTN_DT_F16 : dt_q; /* the mma's input type */\n",
    "    static constexpr int esz_q = dt_q == ATTN_DT_F32 ? 4 : 2;\n",
    "    static constexpr int esz_sq = kv8 ? 2 : esz_q; /* Q in shared memory: f16 for 8-bit caches */\n",
    "    static constexpr int esz_kv = ATTN_DT_SIZE(dt_kv);\n",
    "    static constexpr bool big_rows = head_dim * esz_kv > 512; /* FMA form: f32 rows over 128 wide */\n",
    "    typedef typename attn_elem<DT_Q>::storage q_t;\n",
    "    typedef typename attn_cache_elem<DT_KV>::type kv_t;      /* 8-bit caches: codes */\n",
    "    typedef typename attn_pick<kv8, attn_u16, q_t>::type sq_t; /* Q in shared memory */\n",
    "\n",
    "    /* warps. WARP_ROWS 2 is a request, in force only where it fits: tensor cores (the FMA\n",
    "       form keeps one row tile per warp), an even number of row tiles, HEAD_DIM <= 128 (two\n",
    "       row tiles of O at 256 wide alone are 256 registers), SOFTCAP 0 and ALIBI 0 (ptxas\n",
    "       sits at 255 registers with two row tiles, and their per-score work tips it into\n",
    "       spills at some head sizes), and on sm_80 HEAD_DIM a multiple of 16 (the zero columns\n",
    "       of HEAD_DIM 120 spilled 20 bytes at 255 registers there once the kernel was split\n",
    "       into stages; sm_90 keeps 2 without spills). Elsewhere it falls back to 1, so one -D\n",
    "       can go to every variant of a layer. */\n",
    "    static_assert(WARP_ROWS == 1 || WARP_ROWS == 2, \"paged_attention.cu: WARP_ROWS must be 1 or 2\");\n",
    "    static constexpr int warp_rows = WARP_ROWS == 2 && use_mma && row_tiles % 2 == 0 && head_dim <= 128 && !softcap &&\n",
    "                                             !alibi && (head_dim % 16 == 0 || __CUDA_ARCH__ >= 900) ? 2 : 1;\n",
    "    static constexpr int warps_n = WARPS_N > 0 ? WARPS_N\n",
    "                                   : vsplit > 1 ? (row_tiles == 1 ? 2 : 1)\n",
    "                                   : use_mma || !big_rows ? (row_tiles == 1 ? 4 : row_tiles == 2 ? 2 : 1)\n",
    "                                                          : (row_tiles <= 2 ? 2 : 1);\n",
    "    static constexpr int warp_rt = row_tiles / warp_rows; /* warps along the rows */\n",
    "    static constexpr int warps = warp_rt * warps_n * vsplit, threads = 32 * warps;\n",
    "    static_assert(threads <= 512, \"paged_attention.cu: more than 16 warps; lower WARPS_N\");\n",
    "\n",
    "    /* key tiles. 8-bit decode shapes on sm_90 (H200, 32/8 heads, head 128, attn-bench's\n",
    "       8-bit table with ATTN_BENCH_KV8_DEFINES): 128-key tiles x 2 stages, two CTAs per SM.\n",
    "       Per tensor they beat 64 x 4 (batch 128 x 16k 1066 against 1136 us, 64 x 4k 148\n",
    "       against 157) and 64 x 3 with three CTAs per SM (1106, 189). Per token and head, with\n",
    "       registers for two CTAs (capped for three, ptxas spills): e4m3 64 x 16k 586 against\n",
    "       790 us for 64 x 3 with three CTAs, 128 x 16k 1207 against 1270; int8 128 x 4k the\n",
    "       one case behind (371 against 340 us) */\n",
    "    static constexpr bool kv8_decode90 = kv8 && row_tiles == 1 && __CUDA_ARCH__ >= 900 && head_dim <= 128;\n",
    "    static constexpr int kv_tile = KV_TILE > 0 ? KV_TILE\n",
    "                                   : kv8_decode90 ? 128\n",
    "                                   : vsplit > 1 ? (__CUDA_ARCH__ >= 900 || row_tiles == 1 ? 32 : 16)\n",
    "                                   : use_mma ? attn_cmax(16 * warps_n, head_dim <= 128 ? 64 : 32)\n",
    "                                             : attn_cmax(8 * warps_n, big_rows ? 16 : 32);\n",
    "    static constexpr int kw = kv_tile / warps_n; /* keys of a tile per warp */\n",
    "    static constexpr int nt = kw / 8;            /* n8 tiles of S per warp */\n",
    "    static constexpr int ot = head_dim / 8;      /* n8 tiles of a row of O (otw of them per warp) */\n",
    "    static_assert(kv_tile % warps_n == 0 && kw % (use_mma ? 16 : 8) == 0,\n",
    "                  \"paged_attention.cu: KV_TILE / WARPS_N must be a multiple of 16 (tensor cores) or 8 (FMA)\");\n",
    "    /* two row tiles of Q are 64 registers at head 128 (FlashAttention-2 too reads Q from\n",
    "       shared memory per K/V tile); at head 64 ptxas takes the 32 but then spills on the flags */\n",
    "    static constexpr bool q_in_regs = Q_IN_REGS >= 0 ? Q_IN_REGS != 0 : use_mma && head_dim <= 128 && warp_rows == 1;\n",
    "\n",
    "    /* shared-memory rows */\n",
    "    static constexpr int hdp = (head_dim + 15) / 16 * 16; /* k extent of Q K^T on tensor cores */\n",
    "    /* row pitches in elements: 16 bytes past the data (conflict-free ldmatrix); K/V rows\n",
    "       that fragments are read from (8-bit caches: the codes) */\n",
    "    static constexpr int q_pitch = use_mma ? hdp + 8 : head_dim + 16 / esz_q;\n",
    "    static constexpr int kv_pitch = use_mma ? hdp + 8 : head_dim + 16 / esz_kv;\n",
    "    /* a stage row in bytes. 8-bit codes: HEAD_DIM bytes and 16 more where that makes an\n",
    "       even number of 16-byte units (an odd number: ldmatrix's 8 rows in 8 bank groups) */\n",
    "    static constexpr int srow = kv8 ? head_dim + (head_dim / 16 % 2 == 0 ? 16 : 0) : kv_pitch * esz_kv;\n",
    "    static constexpr int o_pitch = head_dim + 4; /* floats, epilogue */\n",
    "    /* K/V stages. 8-bit caches: two (sm_90 decode: of 128 keys). A decode-shaped CTA (one\n",
    "       row tile) waits on memory: on sm_90 (228 KiB of shared memory per SM) a third tile in\n",
    "       flight pays (H200: 4.2 against 4.0 TB/s at batch 128) when the stages stay within 112\n",
    "       KiB, two CTAs still fitting. A prefill CTA, and sm_80 (164 KiB), are better off with\n",
    "       two stages and more CTAs per SM. */\n",
    "    static constexpr int kv_stages =\n",
    "        KV_STAGES > 0 ? KV_STAGES\n",
    "        : !kv8 && row_tiles == 1 && __CUDA_ARCH__ >= 900 && 3 * 2 * kv_tile * kv_pitch * esz_kv <= 114688 ? 3 : 2;\n",
    "    static_assert(kv_stages >= 2, \"paged_attention.cu: KV_STAGES must be at least 2\");\n",
    "    /* CTAs per SM ptxas must leave registers for (__launch_bounds__). 8-bit decode on sm_90\n",
    "       (the shared memory of 128-key stages allows two CTAs per SM): per tensor, registers\n",
    "       capped as for three (measured so); per token and head, two (capped at three it spills) */\n",
    "    static constexpr int min_ctas = MIN_CTAS > 0 ? MIN_CTAS : kv8_decode90 && threads == 128 && kv_tile == 128 ? (kv_pth ? 2 : 3) : 1;\n",
    "\n",
    "    /* the loader: 16-byte chunks of a K (or V) tile, per thread; block numbers per thread */\n",
    "    static constexpr int kv_cpr = head_dim * esz_kv / 16;\n",
    "    static constexpr int kv_chunks = kv_tile * kv_cpr;\n",
    "    static constexpr int kv_lpt = (kv_chunks + threads - 1) / threads;\n",
    "    static constexpr int kv_bpt = (kv_tile + threads - 1) / threads;\n",
    "    /* FUSED MERGE: decode-shaped variants only (the ones the host splits; compiled into a\n",
    "       prefill variant it would cost registers for nothing) */\n",
    "    static constexpr bool fused_merge = rows <= 16;\n",
    "};\n",
    "\n",
    "/* The shared memory of a CTA: [Q][row table: offsets (KV_PTH: and scale deltas)][K stages]\n",
    "   [V stages][KV_PTH: K scales, V scales]; the epilogue reuses the stages for [O][m][l]. */\n",
    "template <class T> struct attn_paged_smem {\n",
    "    static constexpr int q_bytes = T::rows_pad * T::q_pitch * T::esz_sq;\n",
    "    static constexpr int table_bytes = T::kv_stages * T::kv_tile * (T::kv_pth ? 12 : 8);\n",
    "    static constexpr int tile_bytes = T::kv_tile * T::srow; /* one K (or V) tile */\n",
    "    static constexpr int scale_bytes = T::kv_pth ? T::kv_stages * 2 * T::kv_tile * 4 : 0;\n",
    "    static constexpr int kv_bytes = T::kv_stages * 2 * tile_bytes + scale_bytes;\n",
    "    static constexpr int epi_bytes = T::warps_n * T::rows_pad * (T::o_pitch + 5) * 4; /* O, m, 4 partial l */\n",
    "    /* SPLIT_S: every warp's partial S, [warp][element][lane] f32 */\n",
    "    static constexpr int xch_bytes = T::split_s ? T::warps * T::warp_rows * T::nt * 4 * 32 * 4 : 0;\n",
    "    static constexpr int bytes = q_bytes + table_bytes + attn_cmax(kv_bytes, epi_bytes) + xch_bytes;\n",
    "\n",
    "    char *base;\n",
    "    attn_u32 addr; /* base in the shared window (cvta once: ldmatrix / cp.async take these) */\n",
    "    ATTN_DEV typename T::sq_t *q() const { return (typename T::sq_t *)base; }\n",
    "    ATTN_DEV attn_i64 *blk() const { return (attn_i64 *)(base + q_bytes); }                          /* [stage][key] */\n",
    "    ATTN_DEV int *del() const { return (int *)(blk() + T::kv_stages * T::kv_tile); }                  /* [stage][key] */\n",
    "    ATTN_DEV typename T::kv_t *k() const { return (typename T::kv_t *)(base + q_bytes + table_bytes); } /* [stage][key][pitch] */\n",
    "    ATTN_DEV typename T::kv_t *v() const { return (typename T::kv_t *)((char *)k() + T::kv_stages * tile_bytes); }\n",
    "    ATTN_DEV float *k_scales() const { return (float *)((char *)k() + 2 * T::kv_stages * tile_bytes); } /* [stage][key] */\n",
    "    ATTN_DEV float *v_scales() const { return k_scales() + T::kv_stages * T::kv_tile; }\n",
    "    ATTN_DEV attn_u32 q_addr() const { return addr; }\n",
    "    ATTN_DEV attn_u32 k_addr() const { return addr + (attn_u32)(q_bytes + table_bytes); }\n",
    "    ATTN_DEV attn_u32 v_addr() const { return k_addr() + (attn_u32)(T::kv_stages * tile_bytes); }\n",
    "    ATTN_DEV attn_u32 k_scales_addr() const { return k_addr() + (attn_u32)(2 * T::kv_stages * tile_bytes); }\n",
    "    ATTN_DEV attn_u32 v_scales_addr() const { return k_scales_addr() + (attn_u32)(T::kv_stages * T::kv_tile * 4); }\n",
    "    ATTN_DEV float *epi_o() const { return (float *)k(); }                                  /* [WARPS_N][ROWS_PAD][O_PITCH] */\n",
    "    ATTN_DEV float *epi_m() const { return epi_o() + T::warps_n * T::rows_pad * T::o_pitch; } /* [WARPS_N][ROWS_PAD] */\n",
    "    ATTN_DEV float *epi_l() const { return epi_m() + T::warps_n * T::rows_pad; }              /* [WARPS_N][ROWS_PAD][4] */\n",
    "    ATTN_DEV float *xch() const { return (float *)(base + q_bytes + table_bytes + attn_cmax(kv_bytes, epi_bytes)); }\n",
    "};\n",
    "\n",
    "typedef attn_paged_traits attn_pt;\n",
    "extern \"C\" __constant__ attn__launch_config attn_paged_config = {\n",
    "    attn_pt::threads, attn_paged_smem<attn_pt>::bytes, attn_pt::kv_tile, attn_pt::rows, attn_pt::tile_tokens,\n",
    "    attn_pt::kv_stages, attn_pt::warps_n, attn_pt::use_mma, 0, PERSISTENT};\n",
    "\n",
    "\n",
    "/* Shared-memory reads of the FMA form: 4 (or 2) consecutive elements as f32. */\n",
    "struct __align__(8) attn_vec8 { attn_u32 x, y; };\n",
    "template <int ET> ATTN_DEV void attn_lds4(const void *p, float *f) {\n",
    "    if constexpr (ET == ATTN_DT_F32) {\n",
    "        attn_vec16 v = *(const attn_vec16 *)p;\n",
    "        f[0] = __int_as_float(v.x); f[1] = __int_as_float(v.y);\n",
    "        f[2] = __int_as_float(v.z); f[3] = __int_as_float(v.w);\n",
    "    } else {\n",
    "        attn_vec8 v = *(const attn_vec8 *)p;\n",
    "        f[0] = attn_elem<ET>::to_f32((attn_u16)(v.x & 0xffffu)); f[1] = attn_elem<ET>::to_f32((attn_u16)(v.x >> 16));\n",
    "        f[2] = attn_elem<ET>::to_f32((attn_u16)(v.y & 0xffffu)); f[3] = attn_elem<ET>::to_f32((attn_u16)(v.y >> 16));\n",
    "    }\n",
    "}\n",
    "template <int ET> ATTN_DEV void attn_lds2(const void *p, float *f) {\n",
    "    if constexpr (ET == ATTN_DT_F32) {\n",
    "        attn_vec8 v = *(const attn_vec8 *)p;\n",
    "        f[0] = __int_as_float(v.x); f[1] = __int_as_float(v.y);\n",
    "    } else {\n",
    "        attn_u32 v = *(const attn_u32 *)p;\n",
    "        f[0] = attn_elem<ET>::to_f32((attn_u16)(v & 0xffffu)); f[1] = attn_elem<ET>::to_f32((attn_u16)(v >> 16));\n",
    "    }\n",
    "}\n",
    "\n",
    "/* The A fragment of P for keys 16 kk .. 16 kk + 15: the C fragments of S's n8 tiles 2 kk and\n",
    "   2 kk + 1 (one row tile), rounded to the mma type. */\n",
    "template <class T> ATTN_DEV void attn_p_fragment(const float (*s)[4], int kk, attn_u32 *a) {\n",
    "    a[0] = attn_elem<T::dt_m>::pack2(s[2 * kk][0], s[2 * kk][1]);\n",
    "    a[1] = attn_elem<T::dt_m>::pack2(s[2 * kk][2], s[2 * kk][3]);\n",
    "    a[2] = attn_elem<T::dt_m>::pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);\n",
    "    a[3] = attn_elem<T::dt_m>::pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);\n",
    "}\n",
    "\n",
    "/* ---- the store of finished rows and the split merge ---- */\n",
    "\n",
    "/* CASCADE: joins the prefix pass's partials of one row (query `token`, head member `member`\n",
    "   of kv_head; columns 8c .. 8c + 7) into its own finished state (m, l, O unnormalised),\n",
    "   the merge of split_merge.cuh over 1 + ns states. The prefix pass (a launch before this\n",
    "   one) wrote tile j = token / prefix_tile_tokens, kv_head, split s into slot (j *\n",
    "   num_kv_heads + kv_head) * ns + s, row (token - j * prefix_tile_tokens) * GROUP + member. */\n",
    "ATTN_DEV void attn_cascade_join(const attn__paged_params &p, int token, int kv_head, int member, int group,\n",
    "                                int head_dim, int c, int ns, float *O, float &m, float &l) {\n",
    "    const int j = token / p.prefix_tile_tokens, Rp = (token - j * p.prefix_tile_tokens) * group + member;\n",
    "    const attn_i64 row0 = ((attn_i64)j * p.num_kv_heads + kv_head) * ns * p.prefix_rows + Rp;\n",
    "    float M = attn_merge_key(m, l);\n",
    "#pragma unroll 1\n",
    "    for (int s = 0; s < ns; s++) {\n",
    "        const float *ml = p.prefix_ml + (row0 + (attn_i64)s * p.prefix_rows) * 2;\n",
    "        M = fmaxf(M, attn_merge_key(__ldg(ml), __ldg(ml + 1)));\n",
    "    }\n",
    "    const float Mb = attn_merge_base(M), wa = attn_merge_weight(attn_merge_key(m, l), Mb);\n",
    "    l *= wa;\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < 8; i++) O[i] *= wa;\n",
    "#pragma unroll 1\n",
    "    for (int s = 0; s < ns; s++) {\n",
    "        const attn_i64 row = row0 + (attn_i64)s * p.prefix_rows;\n",
    "        const float ms = __ldg(p.prefix_ml + row * 2), ls = __ldg(p.prefix_ml + row * 2 + 1);\n",
    "        const float ws = attn_merge_weight(attn_merge_key(ms, ls), Mb); /* an empty split weighs 0 */\n",
    "        if (ws == 0.0f) continue;\n",
    "        const float4 a = __ldg((const float4 *)(p.prefix_o + row * head_dim + c * 8));\n",
    "        const float4 b = __ldg((const float4 *)(p.prefix_o + row * head_dim + c * 8 + 4));\n",
    "        l += ws * ls;\n",
    "        O[0] += ws * a.x; O[1] += ws * a.y; O[2] += ws * a.z; O[3] += ws * a.w;\n",
    "        O[4] += ws * b.x; O[5] += ws * b.y; O[6] += ws * b.z; O[7] += ws * b.w;\n",
    "    }\n",
    "    m = M;\n",
    "}\n",
    "\n",
    "/* Writes 8 finished elements (columns 8c..8c+7) of row R of a tile: out and lse, or the\n",
    "   partial slot. O is unnormalised; (m, l) its base-2 max and sum. The CPU's\n",
    "   attn__cpu_store_rows. out_vec: every out row is 16-byte aligned (attn_out_vec). */\n",
    "template <class T>\n",
    "ATTN_DEV void attn_store_row8(const attn__paged_params &p, int q_row0, int kv_head, int slot, int R,\n",
    "                              int c, const float *O, float m, float l, int out_vec) {\n",
    "    if (slot >= 0) {\n",
    "        float *dst = p.partial_o + ((attn_i64)slot * T::rows + R) * T::head_dim + c * 8;\n",
    "        attn_vec16 v[2];\n",
    "        attn_pack8<ATTN_DT_F32>(O, v);\n",
    "        attn_stg16(dst, v[0]);\n",
    "        attn_stg16(dst + 4, v[1]);\n",
    "        if (c == 0) {\n",
    "            float *ml = p.partial_ml + ((attn_i64)slot * T::rows + R) * 2;\n",
    "            ml[0] = m;\n",
    "            ml[1] = l;\n",
    "        }\n",
    "        return;\n",
    "    }\n",
    "    const int t = R / T::group, head = kv_head * T::group + (R - t * T::group);\n",
    "    const attn_i64 token = q_row0 + t;\n",
    "    float f[8];\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < 8; i++) f[i] = O[i];\n",
    "    if (CASCADE && p.prefix_splits) { /* the shared prefix's partials join first, the sink after */\n",
    "        const int ns = *p.prefix_splits;\n",
    "        if (ns > 0) attn_cascade_join(p, (int)token, kv_head, R - t * T::group, T::group, T::head_dim, c, ns, f, m, l);\n",
    "    }\n",
    "    const float w = p.sinks ? attn_softmax_sink(__ldg(p.sinks + head), m, l) : 1.0f; /* once, here */\n",
    "    const float inv = l > 0.0f ? w * attn_rcp(l) : 0.0f; /* l >= 1 when a key (or a sink) was seen */\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < 8; i++) f[i] *= inv;\n",
    "    char *dst = (char *)p.out + (token * p.out_stride_token + head * p.out_stride_head + c * 8) * T::esz_q;\n",
    "    if (out_vec) {\n",
    "        attn_vec16 v[2];\n",
    "        attn_pack8<T::dt_q>(f, v);\n",
    "        attn_stg16(dst, v[0]);\n",
    "        if (T::esz_q == 4) attn_stg16(dst + 16, v[1]);\n",
    "    } else {\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < 8; i++) ((typename T::q_t *)dst)[i] = attn_elem<T::dt_q>::from_f32(f[i]);\n",
    "    }\n",
    "    if (c == 0 && p.lse)\n",
    "        p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = attn_softmax_lse2(m, l) * ATTN_LN2;\n",
    "}\n",
    "\n",
    "/* The same for every row of the launch, so the choice is made once, not per element\n",
    "   (a per-row test inside the store loops also makes ptxas spill). */\n",
    "template <class T> ATTN_DEV int attn_out_vec(const attn__paged_params &p) {\n",
    "    return attn_aligned16(p.out) && ((p.out_stride_token * T::esz_q) & 15) == 0 &&\n",
    "           ((p.out_stride_head * T::esz_q) & 15) == 0;\n",
    "}\n",
    "\n",
    "/* Merges the partial slots of merge entry `mi` into out/lse (the CPU's attn__cpu_merge_run),\n",
    "   thread per (row, 8 columns), `nthreads` threads from `tid`. Loads at L2 (ld.global.cg):\n",
    "   in the FUSED MERGE the partials were written by other CTAs of the same launch. */\n",
    "template <class T> ATTN_DEV void attn_merge_entry(const attn__paged_params &p, int mi, int tid, int nthreads) {\n",
    "    const int *item = p.merge + 8 * (attn_i64)mi;\n",
    "    const int req = item[0], kv_head = item[1], tok0 = item[2], ntok = item[3];\n",
    "    const int slot0 = item[4], nsplit = item[5];\n",
    "    const int q_row0 = p.query_start_loc[req] + tok0, out_vec = attn_out_vec<T>(p);\n",
    "    for (int u = tid; u < ntok * T::group * T::ot; u += nthreads) {\n",
    "        const int R = u / T::ot, c = u - R * T::ot;\n",
    "        float M = attn_neg_inf();\n",
    "        /* m is read only for a split that saw a key (l > 0). Measured on the H200: reading\n",
    "           both unconditionally (attn_merge_key of the two loads) made this kernel 2-4 us\n",
    "           slower at 16-33 splits (docs/PERF.md, issue 21 bisect) */\n",
    "        for (int s = 0; s < nsplit; s++) {\n",
    "            const float *ml = p.partial_ml + ((attn_i64)(slot0 + s) * T::rows + R) * 2;\n",
    "            M = fmaxf(M, __ldcg(ml + 1) > 0.0f ? __ldcg(ml) : attn_neg_inf());\n",
    "        }\n",
    "        const float Mb = attn_merge_base(M);\n",
    "        float L = 0.0f, f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};\n",
    "        for (int s = 0; s < nsplit; s++) {\n",
    "            const attn_i64 row = (attn_i64)(slot0 + s) * T::rows + R;\n",
    "            const float *ml = p.partial_ml + row * 2;\n",
    "            const float ms = __ldcg(ml), ls = __ldcg(ml + 1);\n",
    "            /* an empty split (l = 0) contributes nothing, whatever its O holds */\n",
    "            const int used = ls > 0.0f;\n",
    "            const float w = used ? attn_exp2(ms - Mb) : 0.0f; /* = attn_merge_weight(attn_merge_key(ms, ls), Mb) */\n",
    "            const float4 a = __ldcg((const float4 *)(p.partial_o + row * T::head_dim + c * 8));\n",
    "            const float4 b = __ldcg((const float4 *)(p.partial_o + row * T::head_dim + c * 8 + 4));\n",
    "            const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};\n",
    "            L += used ? ls * w : 0.0f;\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < 8; i++) f[i] += used ? w * x[i] : 0.0f;\n",
    "        }\n",
    "        attn_store_row8<T>(p, q_row0, kv_head, -1, R, c, f, M, L, out_vec);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* ---- stage: the Q rows -> shared memory (cp.async group 0, with the first K/V tile) ----\n",
    "   16/32-bit caches: Q as it is (16-byte copies where rows are aligned). 8-bit caches: f16,\n",
    "   scaled by 2^e: the CTA's largest |q| into [2^14, 2^15); the columns of each 16 in the\n",
    "   order the K fragments come (8-BIT CACHES). Returns 2^-e (1 for 16/32-bit caches). With\n",
    "   tensor cores and HEAD_DIM % 16 = 8 the 8 columns past HEAD_DIM enter Q K^T: zero in Q and\n",
    "   in every K stage (cp.async never writes them). */\n",
    "template <class T>\n",
    "ATTN_DEV float attn_paged_load_q(const attn__paged_params &p, const attn_paged_item &w, const attn_paged_smem<T> &sm,\n",
    "                                 int tid) {\n",
    "    typename T::sq_t *sQ = sm.q();\n",
    "    float q_unscale = 1.0f;\n",
    "    if constexpr (T::kv8) {\n",
    "        __shared__ int attn_q_amax;\n",
    "        if (tid == 0) attn_q_amax = 0;\n",
    "        __syncthreads();\n",
    "        auto q_at = [&](int r, int c) -> float {\n",
    "            const int t = r / T::group;\n",
    "            return attn_load<T::dt_q>(p.q, (attn_i64)(w.q_start + w.tok0 + t) * p.q_stride_token +\n",
    "                                               (attn_i64)(w.kv_head * T::group + r - t * T::group) * p.q_stride_head + c);\n",
    "        };\n",
    "        float amax = 0.0f;\n",
    "        for (int u = tid; u < w.nrows * T::head_dim; u += T::threads)\n",
    "            amax = fmaxf(amax, fabsf(q_at(u / T::head_dim, u % T::head_dim)));\n",
    "        atomicMax(&attn_q_amax, __float_as_int(amax)); /* non-negative floats order as ints */\n",
    "        __syncthreads();\n",
    "        const int ex = (attn_q_amax >> 23) & 0xff; /* biased exponent of the largest |q| */\n",
    "        const int sh = attn_q_amax == 0 || ex == 255 ? 0 : attn_imax(-100, attn_imin(100, 141 - ex));\n",
    "        const float qmul = __int_as_float((127 + sh / 2) << 23) * __int_as_float((127 + sh - sh / 2) << 23);\n",
    "        q_unscale = __int_as_float((127 - sh / 2) << 23) * __int_as_float((127 - sh + sh / 2) << 23);\n",
    "        for (int u = tid; u < T::rows_pad * T::head_dim; u += T::threads) {\n",
    "            const int r = u / T::head_dim, c = u - r * T::head_dim, x = c & 15;\n",
    "            /* mma k column x of a 16-block holds dim 4 (x / 2) + x % 2 (x < 8) or that + 2 */\n",
    "            const int dim = (c & ~15) + 4 * ((x & 7) >> 1) + (x & 1) + (x >= 8 ? 2 : 0);\n",
    "            sQ[r * T::q_pitch + c] = attn_f32_to_f16(r < w.nrows ? q_at(r, dim) * qmul : 0.0f);\n",
    "        }\n",
    "    } else {\n",
    "        const int cpr = T::head_dim * T::esz_q / 16;\n",
    "        const int vec = attn_aligned16(p.q) && ((p.q_stride_token * T::esz_q) & 15) == 0 &&\n",
    "                        ((p.q_stride_head * T::esz_q) & 15) == 0;\n",
    "        for (int c = tid; c < T::rows_pad * cpr; c += T::threads) {\n",
    "            const int r = c / cpr, col = c - r * cpr, t = r / T::group;\n",
    "            const int valid = r < w.nrows;\n",
    "            const char *src = valid ? (const char *)p.q +\n",
    "                                          ((attn_i64)(w.q_start + w.tok0 + t) * p.q_stride_token +\n",
    "                                           (attn_i64)(w.kv_head * T::group + r - t * T::group) * p.q_stride_head) * T::esz_q + col * 16\n",
    "                                    : (const char *)p.q;\n",
    "            char *dst = (char *)sQ + r * (T::q_pitch * T::esz_sq) + col * 16;\n",
    "            if (vec) {\n",
    "                attn_cp_async16(attn_smem_addr(dst), src, valid ? 16 : 0);\n",
    "            } else {\n",
    "#pragma unroll\n",
    "                for (int i = 0; i < 16 / T::esz_q; i++)\n",
    "                    ((typename T::q_t *)dst)[i] = valid ? ((const typename T::q_t *)src)[i] : (typename T::q_t)0;\n",
    "            }\n",
    "        }\n",
    "    }\n",
    "    if constexpr (T::use_mma && T::head_dim % 16 != 0) {\n",
    "        for (int r = tid; r < T::rows_pad + T::kv_stages * T::kv_tile; r += T::threads) {\n",
    "            attn_vec16 z = {0u, 0u, 0u, 0u};\n",
    "            if (r < T::rows_pad) *(attn_vec16 *)(sQ + r * T::q_pitch + T::head_dim) = z;\n",
    "            else *(attn_vec16 *)(sm.k() + (r - T::rows_pad) * T::kv_pitch + T::head_dim) = z;\n",
    "        }\n",
    "    }\n",
    "    return q_unscale;\n",
    "}\n",
    "\n",
    "/* ---- stage: the copies of one K/V tile ----\n",
    "   Thread chunk i: row kv_row(i) of the tile, 16-byte column kv_col(i) (the same positions\n",
    "   in every tile), from the cache offsets in the row table of `stage` (-1: zero-fill,\n",
    "   nothing read); KV_PTH: then each row's two scales (4-byte copies, 0 outside the range). */\n",
    "template <class T>\n",
    "ATTN_DEV void attn_paged_issue(const attn_paged_smem<T> &sm, const char *kv_base, attn_i64 v_bytes, int stage, unsigned utid) {\n",
    "    const attn_i64 *sBlk = sm.blk();\n",
    "    const attn_u32 sK_addr = sm.k_addr(), sV_addr = sm.v_addr();\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < T::kv_lpt; i++) {\n",
    "        const int r = T::threads % T::kv_cpr == 0 ? (int)(utid / T::kv_cpr) + i * (T::threads / T::kv_cpr)\n",
    "                                                  : (int)((utid + i * T::threads) / T::kv_cpr);\n",
    "        const int col = T::threads % T::kv_cpr == 0 ? (int)(utid % T::kv_cpr) : (int)((utid + i * T::threads) % T::kv_cpr);\n",
    "        if (T::kv_chunks % T::threads == 0 || r < T::kv_tile) {\n",
    "            const attn_i64 b = sBlk[stage * T::kv_tile + r];\n",
    "            const char *src = kv_base + (b >= 0 ? b + col * 16 : 0);\n",
    "            const attn_u32 off = (attn_u32)((stage * T::kv_tile + r) * T::srow + col * 16);\n",
    "            attn_cp_async16_or_zero(sK_addr + off, src, b < 0);\n",
    "            attn_cp_async16_or_zero(sV_addr + off, src + (b >= 0 ? v_bytes : 0), b < 0);\n",
    "        }\n",
    "    }\n",
    "    if constexpr (T::kv_pth) {\n",
    "        const int *sDel = sm.del();\n",
    "        const attn_u32 sKs_addr = sm.k_scales_addr(), sVs_addr = sm.v_scales_addr();\n",
    "        for (int r = (int)utid; r < T::kv_tile; r += T::threads) {\n",
    "            const attn_i64 b = sBlk[stage * T::kv_tile + r];\n",
    "            const char *src = kv_base + (b >= 0 ? b + sDel[stage * T::kv_tile + r] : 0);\n",
    "            attn_cp_async4_or_zero(sKs_addr + (attn_u32)(stage * T::kv_tile + r) * 4, src, b < 0);\n",
    "            attn_cp_async4_or_zero(sVs_addr + (attn_u32)(stage * T::kv_tile + r) * 4, src + (b >= 0 ? v_bytes : 0), b < 0);\n",
    "        }\n",
    "    }\n",
    "}\n",
    "\n",
    "/* KV_PTH: each score times its key's K scale. */\n",
    "template <class T>\n",
    "ATTN_DEV void attn_paged_k_scales(float (&s)[T::warp_rows][T::nt][4], const attn_paged_smem<T> &sm, int stage, int lane,\n",
    "                                  int wn) {\n",
    "    const int tq = lane & 3;\n",
    "    if constexpr (T::kv_pth) { /* each key's K scale (lane keys 8n + 2tq, + 1) */\n",
    "        const float *ks = sm.k_scales() + stage * T::kv_tile + wn * T::kw + 2 * tq;\n",
    "#pragma unroll\n",
    "        for (int n = 0; n < T::nt; n++) {\n",
    "            const attn_vec8 kk = *(const attn_vec8 *)(ks + 8 * n);\n",
    "#pragma unroll\n",
    "            for (int wr = 0; wr < T::warp_rows; wr++) {\n",
    "                s[wr][n][0] *= __int_as_float(kk.x); s[wr][n][1] *= __int_as_float(kk.y);\n",
    "                s[wr][n][2] *= __int_as_float(kk.x); s[wr][n][3] *= __int_as_float(kk.y);\n",
    "            }\n",
    "        }\n",
    "    }\n",
    "}\n",
    "\n",
    "/* ---- stage: S = Q K^T for 16 rows x KW keys per row tile of the warp ----\n",
    "   Each K fragment feeds every row tile of the warp. Three forms: 8-bit codes (ldmatrix of\n",
    "   the codes as b16, converted in registers), 16-bit tensor cores, f32 FMA. Q fragments\n",
    "   from registers (qf, Q_IN_REGS) or from shared memory. */\n",
    "template <class T>\n",
    "ATTN_DEV void attn_paged_qk(float (&s)[T::warp_rows][T::nt][4], const attn_paged_smem<T> &sm,\n",
    "                            const attn_u32 (&qf)[T::warp_rows][T::hdp / 16][4], int stage, int row0, int lane,\n",
    "                            int wn, int wv, int warp) {\n",
    "    const int g = lane >> 2, tq = lane & 3;\n",
    "    const attn_u32 sQ_addr = sm.q_addr();\n",
    "    /* lane offsets (bytes) of the ldmatrix row addresses, see the fragment table in\n",
    "       attn_common.cuh: Q as A (rows lane%16, column half lane/16), K as B (keys lane%8 +\n",
    "       8*(lane/16), column half (lane/8)%2) */\n",
    "    const attn_u32 q_lane = (attn_u32)(((row0 + (lane & 15)) * T::q_pitch + (lane >> 4) * 8) * 2);\n",
    "    auto q_frag = [&](attn_u32 *a, int wr, int byte) { /* Q from shared memory */\n",
    "        attn_ldmatrix_x4(a, sQ_addr + q_lane + (attn_u32)(wr * 16 * T::q_pitch * 2) + byte);\n",
    "    };\n",
    "#pragma unroll\n",
    "    for (int wr = 0; wr < T::warp_rows; wr++)\n",
    "#pragma unroll\n",
    "        for (int n = 0; n < T::nt; n++) s[wr][n][0] = s[wr][n][1] = s[wr][n][2] = s[wr][n][3] = 0.0f;\n",
    "    if constexpr (T::kv8) {\n",
    "        /* lane (g, t) gets key g's four codes 4t..4t+3 of a 16-dim block, whose f16 are b0\n",
    "           and b1 of the B fragment for Q's column order; x4: keys 0-7 and 8-15 (n8 tiles\n",
    "           2np, 2np+1) x dims +0 and +16 (k chunks), matrices in the order keys 0-7 +0,\n",
    "           keys 0-7 +16, keys 8-15 +0, 8-15 +16; the x2: keys 0-7 +0, 8-15 +0 */\n",
    "        const attn_u32 k8_lane4 = (attn_u32)(((lane & 7) + ((lane >> 4) << 3)) * T::srow + ((lane >> 3) & 1) * 16);\n",
    "        const attn_u32 k8_lane2 = (attn_u32)(((lane & 7) + (((lane >> 3) & 1) << 3)) * T::srow);\n",
    "        const attn_u32 kb = sm.k_addr() + (attn_u32)((stage * T::kv_tile + wn * T::kw) * T::srow);\n",
    "        constexpr int kqn = T::split_s ? T::head_dim / 64 : T::head_dim / 32; /* SPLIT_S: this group's half */\n",
    "        const int kq0 = T::split_s ? wv * kqn : 0;\n",
    "#pragma unroll\n",
    "        for (int np = 0; np < T::nt / 2; np++) {\n",
    "#pragma unroll\n",
    "            for (int kx = 0; kx < kqn; kx++) {\n",
    "                const int kq = kq0 + kx;\n",
    "                attn_u32 w[4], b[4][2];\n",
    "                attn_ldmatrix_x4(w, kb + k8_lane4 + (attn_u32)(np * 16 * T::srow + kq * 32));\n",
    "#pragma unroll\n",
    "                for (int i = 0; i < 4; i++) attn_codes4_to_f16x2<T::dt_kv>(w[i], b[i][0], b[i][1]);\n",
    "#pragma unroll\n",
    "                for (int wr = 0; wr < T::warp_rows; wr++) {\n",
    "                    attn_u32 a0[4], a1[4];\n",
    "                    if constexpr (T::q_in_regs) { /* (never with SPLIT_S: Q_IN_REGS needs HEAD_DIM <= 128) */\n",
    "#pragma unroll\n",
    "                        for (int i = 0; i < 4; i++) a0[i] = qf[wr][2 * kx][i], a1[i] = qf[wr][2 * kx + 1][i];\n",
    "                    } else {\n",
    "                        q_frag(a0, wr, kq * 64);\n",
    "                        q_frag(a1, wr, kq * 64 + 32);\n",
    "                    }\n",
    "                    attn_mma16816<T::dt_m>(s[wr][2 * np], a0, b[0]);\n",
    "                    attn_mma16816<T::dt_m>(s[wr][2 * np], a1, b[1]);\n",
    "                    attn_mma16816<T::dt_m>(s[wr][2 * np + 1], a0, b[2]);\n",
    "                    attn_mma16816<T::dt_m>(s[wr][2 * np + 1], a1, b[3]);\n",
    "                }\n",
    "            }\n",
    "            if constexpr (T::head_dim % 32 != 0) { /* the last 16 dims: x2, keys 0-7 and 8-15 */\n",
    "                attn_u32 w[2], b[2][2];\n",
    "                attn_ldmatrix_x2(w, kb + k8_lane2 + (attn_u32)(np * 16 * T::srow + T::head_dim - 16));\n",
    "#pragma unroll\n",
    "                for (int i = 0; i < 2; i++) attn_codes4_to_f16x2<T::dt_kv>(w[i], b[i][0], b[i][1]);\n",
    "#pragma unroll\n",
    "                for (int wr = 0; wr < T::warp_rows; wr++) {\n",
    "                    attn_u32 a[4];\n",
    "                    if constexpr (T::q_in_regs) {\n",
    "#pragma unroll\n",
    "                        for (int i = 0; i < 4; i++) a[i] = qf[wr][T::head_dim / 16 - 1][i];\n",
    "                    } else {\n",
    "                        q_frag(a, wr, (T::head_dim - 16) * 2);\n",
    "                    }\n",
    "                    attn_mma16816<T::dt_m>(s[wr][2 * np], a, b[0]);\n",
    "                    attn_mma16816<T::dt_m>(s[wr][2 * np + 1], a, b[1]);\n",
    "                }\n",
    "            }\n",
    "        }\n",
    "    } else if constexpr (T::use_mma) {\n",
    "        const attn_u32 k_lane = (attn_u32)((((lane & 7) + ((lane >> 4) << 3)) * T::kv_pitch + ((lane >> 3) & 1) * 8) * 2);\n",
    "        const attn_u32 kb = sm.k_addr() + (attn_u32)((stage * T::kv_tile + wn * T::kw) * T::kv_pitch * 2) + k_lane;\n",
    "        constexpr int ksn = T::split_s ? T::hdp / 32 : T::hdp / 16; /* SPLIT_S: this group's half */\n",
    "        const int ks0 = T::split_s ? wv * ksn : 0;\n",
    "#pragma unroll\n",
    "        for (int kx = 0; kx < ksn; kx++) {\n",
    "            const int ks = ks0 + kx;\n",
    "            attn_u32 qa[T::warp_rows][4];\n",
    "            if constexpr (T::q_in_regs) {\n",
    "#pragma unroll\n",
    "                for (int wr = 0; wr < T::warp_rows; wr++)\n",
    "#pragma unroll\n",
    "                    for (int i = 0; i < 4; i++) qa[wr][i] = qf[wr][kx][i];\n",
    "            } else {\n",
    "#pragma unroll\n",
    "                for (int wr = 0; wr < T::warp_rows; wr++) q_frag(qa[wr], wr, ks * 32);\n",
    "            }\n",
    "#pragma unroll\n",
    "            for (int np = 0; np < T::nt / 2; np++) {\n",
    "                attn_u32 b[4];\n",
    "                attn_ldmatrix_x4(b, kb + (attn_u32)((np * 16 * T::kv_pitch + ks * 16) * 2));\n",
    "#pragma unroll\n",
    "                for (int wr = 0; wr < T::warp_rows; wr++) {\n",
    "                    attn_mma16816<T::dt_m>(s[wr][2 * np], qa[wr], b);\n",
    "                    attn_mma16816<T::dt_m>(s[wr][2 * np + 1], qa[wr], b + 2);\n",
    "                }\n",
    "            }\n",
    "        }\n",
    "    } else {\n",
    "        const typename T::q_t *q0 = (const typename T::q_t *)sm.q() + (row0 + g) * T::q_pitch, *q1 = q0 + 8 * T::q_pitch;\n",
    "        const typename T::kv_t *kb = sm.k() + (stage * T::kv_tile + wn * T::kw + 2 * tq) * T::kv_pitch;\n",
    "#pragma unroll 2\n",
    "        for (int d = 0; d < T::head_dim; d += 4) {\n",
    "            float a0[4], a1[4];\n",
    "            attn_lds4<T::dt_q>(q0 + d, a0);\n",
    "            attn_lds4<T::dt_q>(q1 + d, a1);\n",
    "#pragma unroll\n",
    "            for (int n = 0; n < T::nt; n++) {\n",
    "                float k0[4], k1[4];\n",
    "                attn_lds4<T::dt_kv>(kb + n * 8 * T::kv_pitch + d, k0);\n",
    "                attn_lds4<T::dt_kv>(kb + (n * 8 + 1) * T::kv_pitch + d, k1);\n",
    "#pragma unroll\n",
    "                for (int x = 0; x < 4; x++) { /* one row tile per warp: s[0] */\n",
    "                    s[0][n][0] = fmaf(a0[x], k0[x], s[0][n][0]);\n",
    "                    s[0][n][1] = fmaf(a0[x], k1[x], s[0][n][1]);\n",
    "                    s[0][n][2] = fmaf(a1[x], k0[x], s[0][n][2]);\n",
    "                    s[0][n][3] = fmaf(a1[x], k1[x], s[0][n][3]);\n",
    "                }\n",
    "            }\n",
    "        }\n",
    "    }\n",
    "    if constexpr (T::split_s) { /* this group's partial, for its partner (attn_paged_s_join) */\n",
    "        constexpr int E = T::warp_rows * T::nt * 4;\n",
    "        float *mine = sm.xch() + warp * E * 32 + lane;\n",
    "#pragma unroll\n",
    "        for (int wr = 0; wr < T::warp_rows; wr++)\n",
    "#pragma unroll\n",
    "            for (int n = 0; n < T::nt; n++)\n",
    "#pragma unroll\n",
    "                for (int e = 0; e < 4; e++) mine[((wr * T::nt + n) * 4 + e) * 32] = s[wr][n][e];\n",
    "    } else {\n",
    "        attn_paged_k_scales<T>(s, sm, stage, lane, wn);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* SPLIT_S: after a __syncthreads, S = partial(group 0) + partial(group 1), in that order in\n",
    "   both warps of the pair (the same numbers), then the K scales (KV_PTH). */\n",
    "template <class T>\n",
    "ATTN_DEV void attn_paged_s_join(float (&s)[T::warp_rows][T::nt][4], const attn_paged_smem<T> &sm, int stage, int lane,\n",
    "                                int wn, int wv, int warp) {\n",
    "    constexpr int E = T::warp_rows * T::nt * 4;\n",
    "    const int partner = warp + (wv ? -1 : 1) * T::warp_rt * T::warps_n;\n",
    "    const float *theirs = sm.xch() + partner * E * 32 + lane;\n",
    "#pragma unroll\n",
    "    for (int wr = 0; wr < T::warp_rows; wr++)\n",
    "#pragma unroll\n",
    "        for (int n = 0; n < T::nt; n++)\n",
    "#pragma unroll\n",
    "            for (int e = 0; e < 4; e++) {\n",
    "                const float o = theirs[((wr * T::nt + n) * 4 + e) * 32];\n",
    "                s[wr][n][e] = wv ? o + s[wr][n][e] : s[wr][n][e] + o;\n",
    "            }\n",
    "    attn_paged_k_scales<T>(s, sm, stage, lane, wn);\n",
    "}\n",
    "\n",
    "/* ---- stage: O += P V ----\n",
    "   P's A fragments straight from the S accumulators (tensor cores), V fragments by\n",
    "   ldmatrix.trans. 8-bit codes: lane (g, t) gets, for keys 2t and 2t + 1 (and + 8), the codes\n",
    "   of dims 2g and 2g + 1 of a 16-dim block; the even ones make the B fragment of an n8 tile\n",
    "   of the even dims, the odd ones of the odd dims: O's tiles 4q .. 4q + 3 hold dims\n",
    "   32q + {even, odd} and 32q + 16 + {even, odd} (the epilogue puts them back in order).\n",
    "   FMA form: P of key 8n + 2src + e for rows g and g + 8 lives in lane 4g + src (shuffles).\n",
    "   WIDE HEADS: the warp's O columns start at wv * OVW (the V rows' half of its group). */\n",
    "template <class T>\n",
    "ATTN_DEV void attn_paged_pv(float (&o)[T::warp_rows][T::otw][4], const float (&s)[T::warp_rows][T::nt][4],\n",
    "                            const attn_paged_smem<T> &sm, int stage, int lane, int wn, int wv) {\n",
    "    const int tq = lane & 3;\n",
    "    if constexpr (T::kv8) {\n",
    "        const attn_u32 v8_lane = (attn_u32)(((lane & 7) + (((lane >> 3) & 1) << 3)) * T::srow + (lane >> 4) * 16);\n",
    "        const attn_u32 vb = sm.v_addr() + (attn_u32)((stage * T::kv_tile + wn * T::kw) * T::srow + wv * T::ovw) + v8_lane;\n",
    "#pragma unroll\n",
    "        for (int kk = 0; kk < T::kw / 16; kk++) {\n",
    "            attn_u32 a[T::warp_rows][4];\n",
    "#pragma unroll\n",
    "            for (int wr = 0; wr < T::warp_rows; wr++) attn_p_fragment<T>(s[wr], kk, a[wr]);\n",
    "            const attn_u32 vrow = vb + (attn_u32)(kk * 16 * T::srow);\n",
    "#pragma unroll\n",
    "            for (int dq = 0; dq < (T::ovw + 16) / 32; dq++) {\n",
    "                attn_u32 r[4], b[4][2];\n",
    "                const int halves = dq < T::ovw / 32 ? 2 : 1; /* OVW % 32: the last 16 dims */\n",
    "                if (halves == 2) attn_ldmatrix_x4_trans(r, vrow + dq * 32);\n",
    "                else attn_ldmatrix_x2_trans(r, vrow + dq * 32);\n",
    "#pragma unroll\n",
    "                for (int h = 0; h < 2; h++) {\n",
    "                    if (h < halves) {\n",
    "                        attn_codes4_to_f16x2<T::dt_kv>(attn_prmt(r[2 * h], r[2 * h + 1], 0x6420u), b[2 * h][0], b[2 * h][1]);\n",
    "                        attn_codes4_to_f16x2<T::dt_kv>(attn_prmt(r[2 * h], r[2 * h + 1], 0x7531u), b[2 * h + 1][0], b[2 * h + 1][1]);\n",
    "#pragma unroll\n",
    "                        for (int wr = 0; wr < T::warp_rows; wr++) {\n",
    "                            attn_mma16816<T::dt_m>(o[wr][4 * dq + 2 * h], a[wr], b[2 * h]);\n",
    "                            attn_mma16816<T::dt_m>(o[wr][4 * dq + 2 * h + 1], a[wr], b[2 * h + 1]);\n",
    "                        }\n",
    "                    }\n",
    "                }\n",
    "            }\n",
    "        }\n",
    "    } else if constexpr (T::use_mma) {\n",
    "        /* V as B transposed (keys lane%16, column half lane/16) */\n",
    "        const attn_u32 v_lane = (attn_u32)(((lane & 15) * T::kv_pitch + (lane >> 4) * 8) * 2);\n",
    "        const attn_u32 vb = sm.v_addr() + (attn_u32)(((stage * T::kv_tile + wn * T::kw) * T::kv_pitch + wv * T::ovw) * 2) + v_lane;\n",
    "#pragma unroll\n",
    "        for (int kk = 0; kk < T::kw / 16; kk++) {\n",
    "            attn_u32 a[T::warp_rows][4]; /* the C fragments of keys 16kk.. are the A fragment of P */\n",
    "#pragma unroll\n",
    "            for (int wr = 0; wr < T::warp_rows; wr++) attn_p_fragment<T>(s[wr], kk, a[wr]);\n",
    "            const attn_u32 vrow = vb + (attn_u32)(kk * 16 * T::kv_pitch * 2);\n",
    "#pragma unroll\n",
    "            for (int op = 0; op < T::otw / 2; op++) {\n",
    "                attn_u32 b[4]; /* one V fragment for every row tile of the warp */\n",
    "                attn_ldmatrix_x4_trans(b, vrow + op * 32);\n",
    "#pragma unroll\n",
    "                for (int wr = 0; wr < T::warp_rows; wr++) {\n",
    "                    attn_mma16816<T::dt_m>(o[wr][2 * op], a[wr], b);\n",
    "                    attn_mma16816<T::dt_m>(o[wr][2 * op + 1], a[wr], b + 2);\n",
    "                }\n",
    "            }\n",
    "            if constexpr (T::otw % 2 != 0) {\n",
    "                attn_u32 b[2];\n",
    "                attn_ldmatrix_x2_trans(b, vrow + (T::otw - 1) * 16);\n",
    "#pragma unroll\n",
    "                for (int wr = 0; wr < T::warp_rows; wr++) attn_mma16816<T::dt_m>(o[wr][T::otw - 1], a[wr], b);\n",
    "            }\n",
    "        }\n",
    "    } else {\n",
    "        const typename T::kv_t *vb = sm.v() + (stage * T::kv_tile + wn * T::kw) * T::kv_pitch + wv * T::ovw + 2 * tq;\n",
    "#pragma unroll\n",
    "        for (int n = 0; n < T::nt; n++)\n",
    "#pragma unroll\n",
    "            for (int src = 0; src < 4; src++)\n",
    "#pragma unroll\n",
    "                for (int e = 0; e < 2; e++) {\n",
    "                    const float p0 = __shfl_sync(0xffffffffu, s[0][n][e], (lane & ~3) | src);\n",
    "                    const float p1 = __shfl_sync(0xffffffffu, s[0][n][2 + e], (lane & ~3) | src);\n",
    "                    const typename T::kv_t *v = vb + (8 * n + 2 * src + e) * T::kv_pitch;\n",
    "#pragma unroll\n",
    "                    for (int i = 0; i < T::otw; i++) {\n",
    "                        float vv[2];\n",
    "                        attn_lds2<T::dt_kv>(v + i * 8, vv);\n",
    "                        o[0][i][0] = fmaf(p0, vv[0], o[0][i][0]);\n",
    "                        o[0][i][1] = fmaf(p0, vv[1], o[0][i][1]);\n",
    "                        o[0][i][2] = fmaf(p1, vv[0], o[0][i][2]);\n",
    "                        o[0][i][3] = fmaf(p1, vv[1], o[0][i][3]);\n",
    "                    }\n",
    "                }\n",
    "    }\n",
    "}\n",
    "\n",
    "/* ---- the kernel ---- */\n",
    "/* One work item (`item` of the list); every thread of the CTA calls it with the same item\n",
    "   and returns from it together (a bad fp8 scale returns before any barrier). */\n",
    "template <class T> ATTN_DEV void attn_paged_attention_item(const attn__paged_params &p, const int item) {\n",
    "    extern __shared__ attn_vec16 attn_smem[];\n",
    "    const attn_paged_smem<T> sm = {(char *)attn_smem, attn_smem_addr(attn_smem)};\n",
    "\n",
    "    /* ---- prologue: the work item ---- */\n",
    "    const attn_paged_item w = attn_paged_item_load(p, item, T::group);\n",
    "    const int key0 = w.key0, key1 = w.key1, kv_head = w.kv_head, slot = w.slot;\n",
    "    /* per-tensor fp8 scales: a bad one (not finite and > 0) writes nothing, see 8-BIT CACHES */\n",
    "    float k_scale = 1.0f, v_scale = 1.0f;\n",
    "    if constexpr (T::kv8 && !T::kv_pth) {\n",
    "        k_scale = attn_cache_scale(p.k_scale, p.k_scale_value);\n",
    "        v_scale = attn_cache_scale(p.v_scale, p.v_scale_value);\n",
    "        if (k_scale == 0.0f || v_scale == 0.0f) return;\n",
    "    }\n",
    "\n",
    "    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;\n",
    "    const int wv = T::vsplit > 1 ? warp / (T::warp_rt * T::warps_n) : 0; /* WIDE HEADS: the column group */\n",
    "    const int wm = (warp - wv * T::warp_rt * T::warps_n) / T::warps_n, wn = warp - (wv * T::warp_rt + wm) * T::warps_n;\n",
    "    const int g = lane >> 2, tq = lane & 3; /* mma row group and lane within it */\n",
    "\n",
    "    const float q_unscale = attn_paged_load_q<T>(p, w, sm, tid); /* 8-bit caches: 2^-e */\n",
    "\n",
    "    /* ---- this lane's rows (g and g + 8 of each of the warp's row tiles): visible keys ---- */\n",
    "    const int row0 = wm * T::warp_rows * 16; /* the warp's first row; row tile wr at row0 + 16 wr */\n",
    "    int lo[T::warp_rows][2], hi[T::warp_rows][2];\n",
    "    int qpos[T::warp_rows][2];    /* ALIBI */\n",
    "    float slope[T::warp_rows][2]; /* ALIBI */\n",
    "    int lo_min = 0x7fffffff, lo_max = (int)0x80000000, hi_min = 0x7fffffff, hi_max = (int)0x80000000;\n",
    "#pragma unroll\n",
    "    for (int x = 0; x < 2 * T::warp_rows; x++) {\n",
    "        const int wr = x >> 1, rr = x & 1;\n",
    "        const int R = row0 + wr * 16 + g + 8 * rr, t = R / T::group;\n",
    "        const int valid = R < w.nrows;\n",
    "        const int pos = w.seq_len - w.query_len + w.tok0 + t;\n",
    "        int a, b;\n",
    "        attn_visible_keys<T::window>(p, w.causal, pos, w.seq_len, key0, key1, a, b);\n",
    "        lo[wr][rr] = valid ? a : 0;\n",
    "        hi[wr][rr] = valid ? b : 0;\n",
    "        if constexpr (T::alibi) {\n",
    "            qpos[wr][rr] = pos;\n",
    "            slope[wr][rr] = valid ? p.alibi_slopes[kv_head * T::group + (R - t * T::group)] * ATTN_LOG2E : 0.0f;\n",
    "        }\n",
    "        if (valid) {\n",
    "            lo_min = attn_imin(lo_min, a); lo_max = attn_imax(lo_max, a);\n",
    "            hi_min = attn_imin(hi_min, b); hi_max = attn_imax(hi_max, b);\n",
    "        }\n",
    "    }\n",
    "    lo_min = attn_warp_imin(lo_min); lo_max = attn_warp_imax(lo_max);\n",
    "    hi_min = attn_warp_imin(hi_min); hi_max = attn_warp_imax(hi_max);\n",
    "\n",
    "    /* ---- the K/V tile loader: the row table of the first stages, their copies ---- */\n",
    "    const attn_paged_rows<T::block_size, T::head_dim * T::esz_kv, T::kv_pth ? 4 : 0> rows(p, w.req, kv_head, key0, key1);\n",
    "    const char *kv_base = (const char *)p.kv_cache;\n",
    "    int tile0, ntiles;\n",
    "    attn_paged_tiles<T::kv_tile>(key0, key1, tile0, ntiles);\n",
    "    rows.template fill<T::kv_stages, T::kv_tile, T::threads>(sm.blk(), sm.del(), tile0, tid);\n",
    "    __syncthreads();\n",
    "#pragma unroll\n",
    "    for (int s = 0; s < T::kv_stages - 1; s++) {\n",
    "        if (s < ntiles) attn_paged_issue<T>(sm, kv_base, rows.v_bytes, s, (unsigned)tid);\n",
    "        attn_cp_async_commit(); /* one group per tile slot, empty or not: uniform counting */\n",
    "    }\n",
    "\n",
    "    /* ---- per-warp softmax state, per row tile wr: rows g (rr 0) and g + 8 (rr 1); O in\n",
    "       C-fragment layout ---- */\n",
    "    float m[T::warp_rows][2], l[T::warp_rows][2], o[T::warp_rows][T::otw][4];\n",
    "#pragma unroll\n",
    "    for (int wr = 0; wr < T::warp_rows; wr++) {\n",
    "        m[wr][0] = m[wr][1] = attn_neg_inf();\n",
    "        l[wr][0] = l[wr][1] = 0.0f;\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < T::otw; i++) o[wr][i][0] = o[wr][i][1] = o[wr][i][2] = o[wr][i][3] = 0.0f;\n",
    "    }\n",
    "    int v_e = 1; /* KV_PTH: biased exponent E, O holds sum p * (v scale / 2^(E - 127)) * code */\n",
    "    /* the q.k each score needs from the mma's: 8-bit caches, k_scale, 2^-e, the code factor */\n",
    "    const float kv_fac = T::kv8 ? k_scale * q_unscale * attn_code_factor<T::dt_kv>() : 1.0f;\n",
    "    const float cap_inv = T::softcap ? 1.0f / p.softcap : 0.0f, cap_log2 = T::softcap ? p.softcap * ATTN_LOG2E : 0.0f;\n",
    "    const float qk_scale = T::softcap ? p.scale * kv_fac : p.scale * ATTN_LOG2E * kv_fac;\n",
    "    attn_u32 qf[T::warp_rows][T::hdp / 16][4]; /* Q_IN_REGS: the Q fragments */\n",
    "\n",
    "    for (int it = 0; it < ntiles; it++) {\n",
    "        attn_cp_async_wait<T::kv_stages - 2>(); /* this thread's part of tile `it` has landed */\n",
    "        __syncthreads();                         /* everyone's part; stage (it-1) is free again */\n",
    "        if (it + T::kv_stages - 1 < ntiles)\n",
    "            attn_paged_issue<T>(sm, kv_base, rows.v_bytes, (it + T::kv_stages - 1) % T::kv_stages, (unsigned)tid);\n",
    "        attn_cp_async_commit();\n",
    "        int next_blk[T::kv_bpt]; /* block numbers of tile it + KV_STAGES, stored after compute */\n",
    "        rows.template prefetch<T::kv_tile, T::threads>(tile0 + (it + T::kv_stages) * T::kv_tile, tid, next_blk);\n",
    "        if constexpr (T::use_mma && T::q_in_regs) {\n",
    "            if (it == 0) {\n",
    "                const attn_u32 q_lane = (attn_u32)(((row0 + (lane & 15)) * T::q_pitch + (lane >> 4) * 8) * 2);\n",
    "#pragma unroll\n",
    "                for (int wr = 0; wr < T::warp_rows; wr++)\n",
    "#pragma unroll\n",
    "                    for (int ks = 0; ks < T::hdp / 16; ks++)\n",
    "                        attn_ldmatrix_x4(qf[wr][ks], sm.q_addr() + q_lane + (attn_u32)(wr * 16 * T::q_pitch * 2) + ks * 32);\n",
    "            }\n",
    "        }\n",
    "        const int stage = it % T::kv_stages;\n",
    "        const int kt0 = tile0 + it * T::kv_tile + wn * T::kw; /* this warp's first key */\n",
    "        /* A warp whose rows see none of its keys skips them (causal tiles above the\n",
    "           diagonal). The test is uniform over the warp already; __all_sync says so to\n",
    "           ptxas, which otherwise builds the softmax shuffles a divergent slow path (a call,\n",
    "           and spills around it). */\n",
    "        const int sees = __all_sync(0xffffffffu, kt0 + T::kw > lo_min && kt0 < hi_max);\n",
    "        float s[T::warp_rows][T::nt][4];\n",
    "        if constexpr (T::split_s) { /* WIDE HEADS: the pair's partial S, exchanged across a __syncthreads */\n",
    "            if (sees) attn_paged_qk<T>(s, sm, qf, stage, row0, lane, wn, wv, warp);\n",
    "            __syncthreads();\n",
    "            if (sees) attn_paged_s_join<T>(s, sm, stage, lane, wn, wv, warp);\n",
    "        }\n",
    "        if (sees) {\n",
    "            const int need_mask = kt0 < lo_max || kt0 + T::kw > hi_min;\n",
    "            if constexpr (!T::split_s) attn_paged_qk<T>(s, sm, qf, stage, row0, lane, wn, wv, warp);\n",
    "\n",
    "            /* ---- scores in base 2, masks, online softmax (row tile wr, element e: row rr =\n",
    "               e / 2, key kt0 + 8n + 2tq + e % 2) ---- */\n",
    "#pragma unroll\n",
    "            for (int wr = 0; wr < T::warp_rows; wr++) {\n",
    "                float mx[2] = {attn_neg_inf(), attn_neg_inf()};\n",
    "                /* Per-tile row offsets, so that per element only the constant 8n + e%2 varies\n",
    "                   (offsets like lo - 8n would be hoisted out of the tile loop: 32 registers). */\n",
    "                int dlo[2], dhi[2];\n",
    "                float dpos[2]; /* ALIBI */\n",
    "#pragma unroll\n",
    "                for (int rr = 0; rr < 2; rr++) {\n",
    "                    dlo[rr] = lo[wr][rr] - (kt0 + 2 * tq);\n",
    "                    dhi[rr] = hi[wr][rr] - (kt0 + 2 * tq);\n",
    "                    if constexpr (T::alibi) dpos[rr] = (float)(kt0 + 2 * tq - qpos[wr][rr]);\n",
    "                }\n",
    "#pragma unroll\n",
    "                for (int n = 0; n < T::nt; n++)\n",
    "#pragma unroll\n",
    "                    for (int e = 0; e < 4; e++) {\n",
    "                        const int rr = e >> 1, c = 8 * n + (e & 1); /* key = kt0 + 2tq + c */\n",
    "                        float x;\n",
    "                        if constexpr (T::softcap) x = cap_log2 * attn_tanh(s[wr][n][e] * qk_scale * cap_inv);\n",
    "                        else x = s[wr][n][e] * qk_scale;\n",
    "                        if constexpr (T::alibi) x = fmaf(slope[wr][rr], dpos[rr] + (float)c, x);\n",
    "                        if (need_mask && (c < dlo[rr] || c >= dhi[rr])) x = attn_neg_inf();\n",
    "                        s[wr][n][e] = x;\n",
    "                        mx[rr] = fmaxf(mx[rr], x);\n",
    "                    }\n",
    "                float sum[2] = {0.0f, 0.0f}, base[2], alpha[2];\n",
    "#pragma unroll\n",
    "                for (int rr = 0; rr < 2; rr++) {\n",
    "                    base[rr] = attn_softmax_rebase(m[wr][rr], attn_quad_max(mx[rr]), alpha[rr]);\n",
    "                    l[wr][rr] *= alpha[rr];\n",
    "                }\n",
    "                /* O is rescaled only when some row's max moved (after the first tiles of a\n",
    "                   long row it rarely does: a decode tile then skips 2 x HEAD_DIM / 4\n",
    "                   multiplies). Decode-shaped CTAs only (one row tile): prefill rows move\n",
    "                   their max often, and with two row tiles per warp the vote's registers\n",
    "                   tip ptxas into spills at 255. */\n",
    "                if (T::row_tiles > 1 || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {\n",
    "#pragma unroll\n",
    "                    for (int rr = 0; rr < 2; rr++)\n",
    "#pragma unroll\n",
    "                        for (int i = 0; i < T::otw; i++) { o[wr][i][2 * rr] *= alpha[rr]; o[wr][i][2 * rr + 1] *= alpha[rr]; }\n",
    "                }\n",
    "#pragma unroll\n",
    "                for (int n = 0; n < T::nt; n++)\n",
    "#pragma unroll\n",
    "                    for (int e = 0; e < 4; e++) {\n",
    "                        s[wr][n][e] = attn_exp2(s[wr][n][e] - base[e >> 1]);\n",
    "                        sum[e >> 1] += s[wr][n][e];\n",
    "                    }\n",
    "                l[wr][0] += sum[0]; /* lane-partial sums; the 4 lanes of a row are added in the epilogue */\n",
    "                l[wr][1] += sum[1];\n",
    "            }\n",
    "\n",
    "            if constexpr (T::kv_pth) {\n",
    "                /* P times each key's V scale / 2^(E - 127); E follows the largest V scale\n",
    "                   (uniform over the warp: the four lanes of a row group hold all of its keys) */\n",
    "                const float *vs = sm.v_scales() + stage * T::kv_tile + wn * T::kw + 2 * tq;\n",
    "                float vsc[T::nt][2], vmax = 0.0f;\n",
    "#pragma unroll\n",
    "                for (int n = 0; n < T::nt; n++) {\n",
    "                    const attn_vec8 vv = *(const attn_vec8 *)(vs + 8 * n);\n",
    "                    vsc[n][0] = __int_as_float(vv.x);\n",
    "                    vsc[n][1] = __int_as_float(vv.y);\n",
    "                    vmax = fmaxf(vmax, fmaxf(vsc[n][0], vsc[n][1]));\n",
    "                }\n",
    "                vmax = attn_quad_max(vmax);\n",
    "                const int et = attn_imin((__float_as_int(vmax) >> 23) & 0xff, 253);\n",
    "                if (et > v_e) {\n",
    "                    const int d = 127 + v_e - et;\n",
    "                    const float f = d > 0 ? __int_as_float(d << 23) : 0.0f;\n",
    "#pragma unroll\n",
    "                    for (int wr = 0; wr < T::warp_rows; wr++)\n",
    "#pragma unroll\n",
    "                        for (int i = 0; i < T::otw; i++) { o[wr][i][0] *= f; o[wr][i][1] *= f; o[wr][i][2] *= f; o[wr][i][3] *= f; }\n",
    "                    v_e = et;\n",
    "                }\n",
    "                const float r = __int_as_float((254 - v_e) << 23);\n",
    "#pragma unroll\n",
    "                for (int n = 0; n < T::nt; n++) {\n",
    "                    const float f0 = vsc[n][0] * r, f1 = vsc[n][1] * r;\n",
    "#pragma unroll\n",
    "                    for (int wr = 0; wr < T::warp_rows; wr++) {\n",
    "                        s[wr][n][0] *= f0; s[wr][n][1] *= f1; s[wr][n][2] *= f0; s[wr][n][3] *= f1;\n",
    "                    }\n",
    "                }\n",
    "            }\n",
    "\n",
    "            attn_paged_pv<T>(o, s, sm, stage, lane, wn, wv);\n",
    "        }\n",
    "        if (it + T::kv_stages < ntiles) /* the slot of tile it + KV_STAGES held tile it: done */\n",
    "            rows.template store<T::kv_tile, T::threads>(sm.blk(), sm.del(), (it + T::kv_stages) % T::kv_stages,\n",
    "                                                        tile0 + (it + T::kv_stages) * T::kv_tile, tid, next_blk);\n",
    "    }\n",
    "\n",
    "    /* ---- epilogue: combine the WARPS_N key slices of each row, then store ---- */\n",
    "    attn_cp_async_wait<0>(); /* nothing may still land in the stages being reused */\n",
    "    __syncthreads();         /* every warp is done with the K/V stages */\n",
    "    float *sO = sm.epi_o(), *sM = sm.epi_m(), *sL = sm.epi_l();\n",
    "    /* O in the values' units: 8-bit caches, v_scale (per tensor) or 2^(E - 127), code factor */\n",
    "    const float ofac = T::kv_pth ? __int_as_float(v_e << 23) * attn_code_factor<T::dt_kv>()\n",
    "                       : T::kv8  ? v_scale * attn_code_factor<T::dt_kv>()\n",
    "                                 : 1.0f;\n",
    "#pragma unroll\n",
    "    for (int x = 0; x < 2 * T::warp_rows; x++) {\n",
    "        const int wr = x >> 1, rr = x & 1;\n",
    "        const int R = row0 + wr * 16 + g + 8 * rr;\n",
    "        if constexpr (T::kv8) {\n",
    "            float *orow = sO + (wn * T::rows_pad + R) * T::o_pitch + wv * T::ovw + 4 * tq;\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < T::otw; i++) { /* tile i: dims d + (i & 1) + 4t and + 2 (see attn_paged_pv) */\n",
    "                const int d = (i >> 2) * 32 + ((i & 2) ? 16 : 0) + (i & 1);\n",
    "                orow[d] = o[wr][i][2 * rr] * ofac;\n",
    "                orow[d + 2] = o[wr][i][2 * rr + 1] * ofac;\n",
    "            }\n",
    "        } else {\n",
    "            float *orow = sO + (wn * T::rows_pad + R) * T::o_pitch + wv * T::ovw + 2 * tq;\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < T::otw; i++) {\n",
    "                orow[i * 8] = o[wr][i][2 * rr] * ofac;\n",
    "                orow[i * 8 + 1] = o[wr][i][2 * rr + 1] * ofac;\n",
    "            }\n",
    "        }\n",
    "        if (wv == 0) { /* WIDE HEADS: both column groups hold the same m and l */\n",
    "            sL[(wn * T::rows_pad + R) * 4 + tq] = l[wr][rr]; /* the four lane-partial sums of the row */\n",
    "            if (tq == 0) sM[wn * T::rows_pad + R] = m[wr][rr];\n",
    "        }\n",
    "    }\n",
    "    __syncthreads();\n",
    "    const int out_vec = attn_out_vec<T>(p);\n",
    "    for (int u = tid; u < w.nrows * T::ot; u += T::threads) {\n",
    "        const int R = u / T::ot, c = u - R * T::ot;\n",
    "        float M = attn_neg_inf();\n",
    "#pragma unroll\n",
    "        for (int k = 0; k < T::warps_n; k++) M = fmaxf(M, sM[k * T::rows_pad + R]);\n",
    "        const float Mb = attn_merge_base(M);\n",
    "        float L = 0.0f, f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};\n",
    "#pragma unroll\n",
    "        for (int k = 0; k < T::warps_n; k++) { /* a slice that saw no key has m = -inf: weight 0 */\n",
    "            const float sc = T::warps_n == 1 ? 1.0f : attn_merge_weight(sM[k * T::rows_pad + R], Mb);\n",
    "            const float *orow = sO + (k * T::rows_pad + R) * T::o_pitch + c * 8;\n",
    "            const float *lp = sL + (k * T::rows_pad + R) * 4;\n",
    "            L += sc * ((lp[0] + lp[1]) + (lp[2] + lp[3]));\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < 8; i++) f[i] += sc * orow[i];\n",
    "        }\n",
    "        attn_store_row8<T>(p, w.q_start + w.tok0, kv_head, slot, R, c, f, M, L, out_vec);\n",
    "    }\n",
    "    if constexpr (T::fused_merge) {\n",
    "        /* FUSED MERGE: the last split of a merge entry to finish merges it */\n",
    "        const int mi = w.merge_index;\n",
    "        if (slot >= 0 && mi >= 0 && p.merge_count) {\n",
    "            __shared__ int attn_last_split;\n",
    "            __threadfence(); /* this CTA's partial is visible device-wide before it is counted */\n",
    "            __syncthreads();\n",
    "            if (tid == 0) attn_last_split = atomicAdd(p.merge_count + mi, 1) == p.merge[8 * (attn_i64)mi + 5] - 1;\n",
    "            __syncthreads();\n",
    "            if (attn_last_split) {\n",
    "                __threadfence(); /* the other splits' partials, counted before, are read after */\n",
    "                attn_merge_entry<T>(p, mi, tid, T::threads);\n",
    "                if (tid == 0) p.merge_count[mi] = 0;\n",
    "            }\n",
    "        }\n",
    "    }\n",
    "}\n",
    "\n",
    "/* PERSISTENT 1 (the decode shapes): items blockIdx.x, + gridDim.x, ...: an eager launch has\n",
    "   one CTA per item, a captured one (the capacity's items) at most one wave of CTAs, which\n",
    "   loop (LAUNCH). The barrier between items: the next item's Q and K/V stages reuse shared\n",
    "   memory the epilogue still reads. PERSISTENT 0 (prefill: the loop costs the two-row-tile\n",
    "   variants registers they do not have): one item per CTA, CTAs past *num_work exit. */\n",
    "extern \"C\" __global__ void __launch_bounds__(attn_pt::threads, attn_pt::min_ctas) attn_paged_attention(const attn__paged_params p) {\n",
    "    if (blockDim.x != attn_pt::threads || attn_dynamic_smem_size() < attn_paged_smem<attn_pt>::bytes) attn_trap();\n",
    "    if constexpr (PERSISTENT) {\n",
    "        const int n = *p.num_work;\n",
    "        for (int item = blockIdx.x; item < n; item += gridDim.x) {\n",
    "            if (item != (int)blockIdx.x) __syncthreads();\n",
    "            attn_paged_attention_item<attn_pt>(p, item);\n",
    "        }\n",
    "    } else if ((int)blockIdx.x < *p.num_work) {\n",
    "        attn_paged_attention_item<attn_pt>(p, blockIdx.x);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* Second stage of split-KV as its own launch: one CTA per merge entry. (128, 8): registers\n",
    "   up to 64 — with (128) alone ptxas held sm_90 to 32 and spilled once the sink joined the\n",
    "   store.) */\n",
    "extern \"C\" __global__ void __launch_bounds__(128, 8) attn_paged_merge_partials(const attn__paged_params p) {\n",
    "    if ((int)blockIdx.x >= *p.num_merge) return;\n",
    "    attn_merge_entry<attn_pt>(p, blockIdx.x, threadIdx.x, blockDim.x);\n",
    "}\n",
    0};
static const char *const attn__kernel_src_paged_common_cuh[] = {
    "/* paged_common.cuh - what the paged-attention kernels share beyond their parameters\n",
    "   (attn__paged_params, defined once in attn_params.cuh for the kernels and the host): the\n",
    "   work-item prologue (paged_attention.cu's; paged_prefill_sm90.cu writes it out, see there)\n",
    "   and the keys a query position sees. Included by paged_attention.cu and\n",
    "   paged_prefill_sm90.cu. */\n",
    "#ifndef ATTN_PAGED_COMMON_CUH\n",
    "#define ATTN_PAGED_COMMON_CUH\n",
    "\n",
    "#include \"attn_common.cuh\"\n",
    "#include \"attn_params.cuh\" /* attn__paged_params */\n",
    "#include \"online_softmax.cuh\"\n",
    "\n",
    "\n",
    "/* ---- the work-item prologue ----\n",
    "   A work item (WORK LIST in paged_attention.cu: 8 x int32 per CTA) and what follows from it:\n",
    "   the request's lengths and the key range clamped to [0, seq_len). */\n",
    "struct attn_paged_item {\n",
    "    int req, kv_head, tok0, ntok;   /* the tile: request, KV head, first query token, tokens */\n",
    "    int slot, causal, merge_index;  /* partial slot (-1: write out), causal flag, merge entry (-1: none) */\n",
    "    int seq_len, q_start, query_len;\n",
    "    int key0, key1;                 /* the keys read, clamped to [0, seq_len) */\n",
    "    int nrows;                      /* ntok * GROUP query rows */\n",
    "};\n",
    "\n",
    "ATTN_DEV attn_paged_item attn_paged_item_load(const attn__paged_params &p, int index, int group) {\n",
    "    const int *item = p.work + 8 * (attn_i64)index;\n",
    "    attn_paged_item w;\n",
    "    w.req = item[0];\n",
    "    w.kv_head = item[1];\n",
    "    w.tok0 = item[2];\n",
    "    w.ntok = item[3];\n",
    "    w.slot = item[6];\n",
    "    w.causal = item[7] & 1;\n",
    "    w.merge_index = (item[7] >> 8) - 1;\n",
    "    w.seq_len = p.seq_lens[w.req];\n",
    "    w.q_start = p.query_start_loc[w.req];\n",
    "    w.query_len = p.query_start_loc[w.req + 1] - w.q_start;\n",
    "    w.key0 = attn_imax(item[4], 0);\n",
    "    w.key1 = attn_imin(item[5], w.seq_len);\n",
    "    w.nrows = w.ntok * group;\n",
    "    return w;\n",
    "}\n",
    "\n",
    "/* The keys [lo, hi) that query position pos of a request of seq_len keys sees inside a work\n",
    "   item's [key0, key1): the CPU's attn__cpu_visible_keys. Causal is the item's flag; the\n",
    "   sliding window applies when W (the kernel's WINDOW define) and p.window > 0. */\n",
    "/* DCP: how many of positions [0, x) the rank holds (the host's attn__dcp_local). */\n",
    "ATTN_DEV int attn_dcp_local(const attn__paged_params &p, int x) {\n",
    "    const attn_i64 run = (attn_i64)p.dcp_world_size * p.dcp_interleave;\n",
    "    const attn_i64 rem = x % run - (attn_i64)p.dcp_rank * p.dcp_interleave;\n",
    "    return (int)(x / run * p.dcp_interleave + (rem < 0 ? 0 : rem > p.dcp_interleave ? p.dcp_interleave : rem));\n",
    "}\n",
    "\n",
    "template <int W>\n",
    "ATTN_DEV void attn_visible_keys(const attn__paged_params &p, int causal, int pos, int seq_len, int key0, int key1,\n",
    "                                int &lo, int &hi) {\n",
    "    int a = 0, b = causal ? pos + 1 : seq_len;\n",
    "    if (W && p.window > 0) {\n",
    "        a = attn_imax(0, pos - p.window + 1);\n",
    "        if (!causal) b = (int)(((attn_i64)pos + p.window) < seq_len ? (attn_i64)pos + p.window : seq_len);\n",
    "    }\n",
    "    if (p.dcp_world_size > 1) { /* the global range as this rank's local keys (ownership is monotone) */\n",
    "        a = attn_dcp_local(p, a);\n",
    "        b = attn_dcp_local(p, b);\n",
    "    }\n",
    "    lo = attn_imax(a, key0);\n",
    "    hi = attn_imin(b, key1);\n",
    "}\n",
    "\n",
    "#endif /* ATTN_PAGED_COMMON_CUH */\n",
    0};
static const char *const attn__kernel_src_paged_prefill_sm90_cu[] = {
    "/* paged_prefill_sm90.cu - paged-attention prefill on Hopper, sm_90a: warpgroup MMA (wgmma)\n",
    "   fed by a producer warpgroup through the tensor memory accelerator (TMA) and mbarriers.\n",
    "\n",
    "   The prefill tiles of the CUDA_SM90 backend (attn.h: a layer whose tensors are on a\n",
    "   device of compute capability 9.0 with TMA and whose shape is in the scope below; its\n",
    "   decode tiles and cache write are the CUDA backend's). Compiled for sm_90a only (wgmma\n",
    "   and setmaxnreg do not exist in plain sm_90). Checked on an H200 against the CPU backend\n",
    "   by tests/cuda_kernels.c --sm90-prefill (random prefill-shaped cases in scope, under\n",
    "   compute-sanitizer too) and by the CUDA suite through the backend.\n",
    "\n",
    "   =====================================================================================\n",
    "   WHAT IT COMPUTES\n",
    "   =====================================================================================\n",
    "   Exactly kernels/paged_attention.cu's function (its top comment: WHAT IT COMPUTES, the\n",
    "   WORK LIST, the params struct) for a narrower scope:\n",
    "     - q and cache of one 16-bit type: DT_Q == DT_KV, 1 (f16) or 2 (bf16);\n",
    "     - HEAD_DIM 64 or 128; any GROUP, TILE_TOKENS * GROUP <= 128 rows (padded to 128);\n",
    "       BLOCK_SIZE a multiple of 16;\n",
    "     - WINDOW 0 or 1 (window from params as there); no soft cap, no ALiBi (the defines\n",
    "       SOFTCAP / ALIBI 1 are refused);\n",
    "     - work items that write out/lse (slot -1) or an unnormalised partial into partial slot\n",
    "       `slot` (paged_attention.cu's PARTIAL WORKSPACE, WT::rows rows a slot: the prefix pass\n",
    "       of its CASCADE; a merge index in the flags traps: nothing here merges). Causality\n",
    "       per work item (flags bit 0), as there.\n",
    "   Query token t of a work item sits at pos = seq_len - query_len + tok0 + t; key j is\n",
    "   visible iff lo <= j < hi (lo, hi as in paged_attention.cu, clamped to [key0, key1)).\n",
    "   Scores in base 2 with the scale folded in: s = q.k * scale * log2(e); out = sum_j\n",
    "   2^(s_j - m) v_j / sum_j 2^(s_j - m), rounded to DT_Q; lse = (m + log2 l) * ln 2 (base\n",
    "   e); a row that sees no key gets out = 0 and lse = -inf.\n",
    "\n",
    "   =====================================================================================\n",
    "   LAUNCH\n",
    "   =====================================================================================\n",
    "   attn_paged_prefill_sm90(const __grid_constant__ attn_tma_map kv_map, const\n",
    "   attn__paged_params p): grid (>= *num_work), block 384 (attn_paged_config.threads),\n",
    "   dynamic shared memory attn_paged_config.shared_bytes, one CTA per SM. CTAs past\n",
    "   *num_work exit. The same params and work list as attn_paged_attention: the host drives\n",
    "   it with the prefill variant's schedule (TILE_TOKENS = attn_paged_config.tile_tokens).\n",
    "   kv_map: a tiled tensor map over the whole cache (p.kv_cache), encoded by the host for\n",
    "   each forward (attn.h, attn__cuda_kv_map): 5-D, innermost first, dims {HEAD_DIM,\n",
    "   num_kv_heads, BLOCK_SIZE, 2, num_blocks}, byte strides {HEAD_DIM * 2, num_kv_heads *\n",
    "   HEAD_DIM * 2, BLOCK_SIZE * num_kv_heads * HEAD_DIM * 2, 2 * that}, box {64, 1, BOX_ROWS,\n",
    "   1, 1}, 128-byte swizzle, zero fill. One box is BOX_ROWS consecutive rows of one block,\n",
    "   64 columns of one head, K (coordinate 3 = 0) or V (1). BOX_ROWS (exported as\n",
    "   attn_paged_config.tma_box_rows) is the largest piece that never straddles a block or a\n",
    "   tile: KV_TILE when BLOCK_SIZE is a multiple of it, BLOCK_SIZE when it divides KV_TILE,\n",
    "   16 otherwise. The config: {threads, dynamic shared bytes, KV_TILE, TILE_TOKENS * GROUP,\n",
    "   TILE_TOKENS, KV_STAGES, 0, 1, BOX_ROWS}.\n",
    "\n",
    "   =====================================================================================\n",
    "   INSIDE A CTA (FlashAttention-3's structure: a producer, two consumer warpgroups)\n",
    "   =====================================================================================\n",
    "   Warpgroup 0 produces (one thread issues the copies; the group gives its registers\n",
    "   back, setmaxnreg 40); warpgroups 1 and 2 consume query rows 0-63 and 64-127 of the\n",
    "   128-row tile (setmaxnreg 232; row R = token R / GROUP, head member R % GROUP; rows >=\n",
    "   ntok * GROUP are padding: zero Q, never stored).\n",
    "   Shared memory (dynamic, base rounded up to 1024 at run time; every tile 1024-aligned):\n",
    "       [Q: 128 rows x HEAD_DIM, 128B-swizzled K-major (wgmma.cuh), HEAD_DIM / 64 panels]\n",
    "       [K: KV_STAGES x (KV_TILE rows x HEAD_DIM, swizzled K-major: the B of S = Q K^T)]\n",
    "       [V: KV_STAGES x (KV_TILE keys x HEAD_DIM, swizzled, read MN-major: the B of P V)]\n",
    "       [full[KV_STAGES], empty[KV_STAGES]: mbarriers] [bounds: 8 warps x 4 int]\n",
    "   A stage's panel c holds KV_TILE rows x 128 bytes (columns 64c .. 64c + 63): the layout\n",
    "   one TMA box per BOX_ROWS rows writes, and the wgmma descriptors read.\n",
    "     Q: the consumers copy it with cp.async into the swizzled K-major tile, once.\n",
    "     full[s] (count 1: the producer's arrive_expect_tx, then the copies' bytes) and\n",
    "     empty[s] (count 8: lane 0 of each consumer warp, after its wgmma on the stage\n",
    "     completed).\n",
    "     Producer, tile it (tiles of KV_TILE keys aligned to multiples of KV_TILE from\n",
    "     floor(key0 / KV_TILE) * KV_TILE to key1): wait empty[s]; for each piece of BOX_ROWS\n",
    "     keys that holds a key in [key0, key1): its block from block_table, then its K and V\n",
    "     boxes (2 x HEAD_DIM / 64 copies); the bytes expected are those of the pieces copied.\n",
    "     Pieces wholly outside are not read (nor their block_table entries).\n",
    "     Consumers, tile it: wait full[s]. On an edge tile (one holding a key outside [key0,\n",
    "     key1): rows of pieces not copied keep a stage's old contents, keys past seq_len in a\n",
    "     copied piece hold whatever the cache holds) the V rows of those keys are zeroed (each\n",
    "     consumer thread a share), fence.proxy.async, and the 256 consumer threads meet at a\n",
    "     named barrier before P V; K's rows need nothing (their scores are replaced by -inf).\n",
    "     Then per warpgroup, unless none of its 64 rows sees a key of the tile (causal tiles\n",
    "     above the diagonal, window tiles before it: uniform over the warpgroup, from the\n",
    "     per-warpgroup bounds):\n",
    "       S[64][KV_TILE] = Q K^T     wgmma ss m64nKV_TILEk16, HEAD_DIM / 16 steps, wait 0\n",
    "       online softmax in f32 registers, base 2 (online_softmax.cuh; each thread holds 2\n",
    "       rows, a row's max and sum over its 4 lanes by shuffles; masking only on tiles that\n",
    "       cross a visible-range edge of some row); O rescaled by 2^(m_old - m_new)\n",
    "       O[64][HEAD_DIM] += P V     P packed to DT_Q from the S accumulator as the register\n",
    "                                  A operand (attn_wgmma_a_from_acc), wgmma rs, wait 0\n",
    "     and lane 0 of each warp arrives on empty[s]. The consumers never meet at a CTA-wide\n",
    "     barrier inside the loop (only on edge tiles, at a named barrier of the 256).\n",
    "   PINGPONG 1 (tuning, default 0): the consumer warpgroups take turns issuing S (named\n",
    "   barriers 2 and 3); measured within 1 % of 0 on the H200 (docs/PERF.md). PINGPONG 2: they\n",
    "   take turns issuing P V as well (FlashAttention-3's ping-pong): +3 % at 1 x 1k, -1 to -2 %\n",
    "   at 4k and 16k on the H200 (docs/PERF.md, runs 9-10), so not the default.\n",
    "   Epilogue (the consumers; named barrier 1): l summed over the row's 4 lanes; O / l in\n",
    "   DT_Q to shared memory over the stages, lse (base e) straight to global; 16-byte rows\n",
    "   out (element stores when q/out rows are not 16-byte aligned).\n",
    "   Not yet: softmax of tile it overlapped with S of tile it + 1 inside a warpgroup (two\n",
    "   drafts measured 10 % slower, docs/PERF.md), persistent CTAs (issue 22). */\n",
    "#include \"paged_common.cuh\"\n",
    "#include \"paged_tile_loader.cuh\"\n",
    "#include \"wgmma.cuh\"\n",
    "#include \"hopper.cuh\"\n",
    "\n",
    "#if !defined(HEAD_DIM) || !defined(BLOCK_SIZE) || !defined(GROUP) || !defined(DT_Q) || \\\n",
    "    !defined(DT_KV) || !defined(TILE_TOKENS)\n",
    "#error \"paged_prefill_sm90.cu: define HEAD_DIM, BLOCK_SIZE, GROUP, DT_Q, DT_KV and TILE_TOKENS\"\n",
    "#endif\n",
    "#ifndef WINDOW\n",
    "#define WINDOW 0\n",
    "#endif\n",
    "#ifndef KV_TILE\n",
    "#define KV_TILE 128\n",
    "#endif\n",
    "/* PINGPONG 1: the two consumer warpgroups take turns issuing their S = Q K^T (named\n",
    "   barriers 2 and 3), so one's softmax runs under the other's GEMMs instead of both\n",
    "   contending for the tensor cores at once. PINGPONG 2: their P V too, FlashAttention-3's\n",
    "   schedule: the tensor cores see S0 S1 PV0 PV1 S0' ..., each softmax under the other\n",
    "   warpgroup's GEMM, with no more live registers (tuning; measured 1: within 1 % of 0) */\n",
    "#ifndef PINGPONG\n",
    "#define PINGPONG 0\n",
    "#endif\n",
    "#if defined(SOFTCAP) && SOFTCAP\n",
    "#error \"paged_prefill_sm90.cu: no soft cap (SOFTCAP 1 takes paged_attention.cu)\"\n",
    "#endif\n",
    "#if defined(ALIBI) && ALIBI\n",
    "#error \"paged_prefill_sm90.cu: no ALiBi (ALIBI 1 takes paged_attention.cu)\"\n",
    "#endif\n",
    "#ifndef KV_STAGES\n",
    "#define KV_STAGES 0 /* 0: the traits' choice, 3 where shared memory holds three */\n",
    "#endif\n",
    "\n",
    "struct attn_ws_traits {\n",
    "    static constexpr int head_dim = HEAD_DIM, block_size = BLOCK_SIZE, group = GROUP, kv_tile = KV_TILE;\n",
    "    static constexpr int rows = TILE_TOKENS * GROUP, rows_pad = 128, esz = 2;\n",
    "    static constexpr int threads = 384, consumers = 256;\n",
    "    static constexpr int q_bytes = rows_pad * head_dim * esz;\n",
    "    static constexpr int tile_bytes = kv_tile * head_dim * esz; /* one K (or V) stage */\n",
    "    static constexpr int panels = head_dim / 64;\n",
    "    /* the rows of one TMA box: a piece of a tile that lies in one block */\n",
    "    static constexpr int box_rows = block_size % kv_tile == 0 ? kv_tile : kv_tile % block_size == 0 ? block_size : 16;\n",
    "    static constexpr int box_bytes = box_rows * 128;            /* one TMA box: box_rows x 64 columns */\n",
    "    static constexpr int pieces = kv_tile / box_rows;           /* boxes per tile and panel, per K or V */\n",
    "    static constexpr int smem_limit = 227 * 1024;\n",
    "    static constexpr int stages_fit3 = q_bytes + 3 * 2 * tile_bytes + 3 * 16 + 128 + 1024 <= smem_limit;\n",
    "    static constexpr int kv_stages = KV_STAGES ? KV_STAGES : stages_fit3 ? 3 : 2;\n",
    "    static constexpr int k_off = q_bytes, v_off = k_off + kv_stages * tile_bytes, bar_off = v_off + kv_stages * tile_bytes;\n",
    "    static constexpr int smem_bytes = bar_off + 2 * kv_stages * 8 + 128 + 1024; /* barriers, bounds scratch, the slack that aligns the base */\n",
    "    static constexpr int o_pitch = head_dim + 8;\n",
    "    static_assert(head_dim == 64 || head_dim == 128, \"paged_prefill_sm90.cu: HEAD_DIM must be 64 or 128\");\n",
    "    static_assert(DT_Q == DT_KV && (DT_Q == ATTN_DT_F16 || DT_Q == ATTN_DT_BF16),\n",
    "                  \"paged_prefill_sm90.cu: q and cache must be one 16-bit type\");\n",
    "    static_assert(block_size % 16 == 0 && block_size > 0, \"paged_prefill_sm90.cu: BLOCK_SIZE a positive multiple of 16\");\n",
    "    static_assert(kv_stages == 2 || kv_stages == 3, \"paged_prefill_sm90.cu: KV_STAGES must be 2 or 3\");\n",
    "    static_assert(WINDOW == 0 || WINDOW == 1, \"paged_prefill_sm90.cu: WINDOW must be 0 or 1\");\n",
    "    static_assert(PINGPONG >= 0 && PINGPONG <= 2, \"paged_prefill_sm90.cu: PINGPONG must be 0, 1 or 2\");\n",
    "    static_assert(kv_tile == 64 || kv_tile == 128, \"paged_prefill_sm90.cu: KV_TILE must be 64 or 128\");\n",
    "    static_assert(TILE_TOKENS >= 1 && GROUP >= 1 && rows <= 128, \"paged_prefill_sm90.cu: TILE_TOKENS * GROUP <= 128\");\n",
    "    static_assert(smem_bytes <= smem_limit, \"paged_prefill_sm90.cu: shared memory over 227 KiB\");\n",
    "    static_assert(rows_pad * o_pitch * esz <= 2 * kv_stages * tile_bytes, \"the epilogue's O fits over the stages\");\n",
    "};\n",
    "typedef attn_ws_traits WT;\n",
    "\n",
    "extern \"C\" __constant__ attn__launch_config attn_paged_config = {\n",
    "    WT::threads, WT::smem_bytes, WT::kv_tile, WT::rows, TILE_TOKENS, WT::kv_stages, 0, 1, WT::box_rows};\n",
    "\n",
    "extern \"C\" __global__ void __launch_bounds__(WT::threads, 1)\n",
    "    attn_paged_prefill_sm90(const __grid_constant__ attn_tma_map kv_map, const attn__paged_params p) {\n",
    "    extern __shared__ attn_vec16 attn_smem[];\n",
    "    if (blockDim.x != WT::threads || attn_dynamic_smem_size() < WT::smem_bytes) attn_trap();\n",
    "    if ((int)blockIdx.x >= *p.num_work) return;\n",
    "\n",
    "    const attn_paged_item w = attn_paged_item_load(p, blockIdx.x, GROUP);\n",
    "    if (w.merge_index >= 0) attn_trap(); /* partials are merged by their reader (CASCADE), never here */\n",
    "    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;\n",
    "\n",
    "    const attn_u32 smem0 = attn_smem_addr(attn_smem);\n",
    "    const attn_u32 base = (smem0 + 1023u) & ~1023u;\n",
    "    char *const smem = (char *)attn_smem + (base - smem0);\n",
    "    const attn_u32 sQ = base, sK = base + WT::k_off, sV = base + WT::v_off;\n",
    "    const attn_u32 full = base + WT::bar_off, empty = full + 8 * WT::kv_stages;\n",
    "    int tile0, ntiles;\n",
    "    attn_paged_tiles<KV_TILE>(w.key0, w.key1, tile0, ntiles);\n",
    "\n",
    "    if (tid == 0) {\n",
    "        for (int s = 0; s < WT::kv_stages; s++) {\n",
    "            attn_mbar_init(full + 8 * s, 1);\n",
    "            attn_mbar_init(empty + 8 * s, 8);\n",
    "        }\n",
    "        attn_mbar_init_fence();\n",
    "    }\n",
    "    __syncthreads(); /* the barriers; the last CTA-wide barrier */\n",
    "\n",
    "    if (tid < 128) { /* ---- the producer warpgroup ---- */\n",
    "        attn_regs_release<40>();\n",
    "        if (tid == 0) {\n",
    "            const int *bt = p.block_table + (attn_i64)w.req * p.block_table_stride;\n",
    "            attn_tma_prefetch_map(&kv_map);\n",
    "            attn_pipe_state<WT::kv_stages> st = {0, 0u};\n",
    "            for (int it = 0; it < ntiles; it++, st.advance()) {\n",
    "                const int kt0 = tile0 + it * KV_TILE;\n",
    "                int np = 0;\n",
    "                for (int j = 0; j < WT::pieces; j++) /* pieces holding a key in [key0, key1) */\n",
    "                    np += kt0 + (j + 1) * WT::box_rows > w.key0 && kt0 + j * WT::box_rows < w.key1;\n",
    "                attn_mbar_wait(empty + 8 * st.stage, st.phase ^ 1u);\n",
    "                attn_mbar_arrive_expect_tx(full + 8 * st.stage, (unsigned)(np * 2 * WT::panels * WT::box_bytes));\n",
    "                for (int j = 0; j < WT::pieces; j++) {\n",
    "                    const int k = kt0 + j * WT::box_rows;\n",
    "                    if (!(k + WT::box_rows > w.key0 && k < w.key1)) continue;\n",
    "                    const int b = bt[(unsigned)k / BLOCK_SIZE], row = (int)((unsigned)k % BLOCK_SIZE);\n",
    "#pragma unroll\n",
    "                    for (int c = 0; c < WT::panels; c++) {\n",
    "                        const attn_u32 off = (attn_u32)(st.stage * WT::tile_bytes + c * KV_TILE * 128 + j * WT::box_bytes);\n",
    "                        attn_tma_load_5d(sK + off, &kv_map, 64 * c, w.kv_head, row, 0, b, full + 8 * st.stage);\n",
    "                        attn_tma_load_5d(sV + off, &kv_map, 64 * c, w.kv_head, row, 1, b, full + 8 * st.stage);\n",
    "                    }\n",
    "                }\n",
    "            }\n",
    "        }\n",
    "        return;\n",
    "    }\n",
    "\n",
    "    /* ---- the consumer warpgroups ---- */\n",
    "    attn_regs_acquire<232>();\n",
    "    const int ctid = tid - 128, wg = ctid >> 7; /* warpgroup 0/1: rows 64 wg .. 64 wg + 63 */\n",
    "    const int g = lane >> 2, tq = lane & 3;\n",
    "    const int nrows = w.nrows;\n",
    "\n",
    "    {   /* Q rows -> the swizzled K-major tile */\n",
    "        const int cpr = HEAD_DIM * WT::esz / 16;\n",
    "        const int vec = attn_aligned16(p.q) && ((p.q_stride_token * WT::esz) & 15) == 0 && ((p.q_stride_head * WT::esz) & 15) == 0;\n",
    "        for (int c = ctid; c < WT::rows_pad * cpr; c += WT::consumers) {\n",
    "            const int r = c / cpr, col = c - r * cpr, t = r / GROUP;\n",
    "            const int valid = r < nrows;\n",
    "            const char *src = valid ? (const char *)p.q + ((attn_i64)(w.q_start + w.tok0 + t) * p.q_stride_token +\n",
    "                                                           (attn_i64)(w.kv_head * GROUP + r - t * GROUP) * p.q_stride_head) * WT::esz + col * 16\n",
    "                                    : (const char *)p.q;\n",
    "            const attn_u32 dst = sQ + attn_wgmma_swizzle_offset<WT::rows_pad>(r, col);\n",
    "            if (vec) {\n",
    "                attn_cp_async16_or_zero(dst, src, !valid);\n",
    "            } else {\n",
    "                attn_u16 h[8];\n",
    "#pragma unroll\n",
    "                for (int i = 0; i < 8; i++) h[i] = valid ? ((const attn_u16 *)src)[i] : (attn_u16)0;\n",
    "                attn_vec16 v = {h[0] | (attn_u32)h[1] << 16, h[2] | (attn_u32)h[3] << 16, h[4] | (attn_u32)h[5] << 16,\n",
    "                                h[6] | (attn_u32)h[7] << 16};\n",
    "                *(attn_vec16 *)(smem + (dst - base)) = v;\n",
    "            }\n",
    "        }\n",
    "        attn_cp_async_commit();\n",
    "        attn_cp_async_wait<0>();\n",
    "        attn_fence_proxy_async();       /* Q is read by wgmma (the async proxy) */\n",
    "        attn_named_barrier(1, WT::consumers);\n",
    "    }\n",
    "\n",
    "    /* this thread's two rows: visible keys; the warpgroup's extremes through shared memory */\n",
    "    const int row0 = 64 * wg + 16 * (warp & 3) + g;\n",
    "    int lo[2], hi[2];\n",
    "    int lo_min = 0x7fffffff, lo_max = (int)0x80000000, hi_min = 0x7fffffff, hi_max = (int)0x80000000;\n",
    "#pragma unroll\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        const int R = row0 + 8 * h, t = R / GROUP;\n",
    "        const int valid = R < nrows;\n",
    "        const int pos = w.seq_len - w.query_len + w.tok0 + t;\n",
    "        int a, b;\n",
    "        attn_visible_keys<WINDOW>(p, w.causal, pos, w.seq_len, w.key0, w.key1, a, b);\n",
    "        lo[h] = valid ? a : 0;\n",
    "        hi[h] = valid ? b : 0;\n",
    "        if (valid) {\n",
    "            lo_min = attn_imin(lo_min, a); lo_max = attn_imax(lo_max, a);\n",
    "            hi_min = attn_imin(hi_min, b); hi_max = attn_imax(hi_max, b);\n",
    "        }\n",
    "    }\n",
    "    {   /* reduced over the warp, then over the warpgroup's 4 warps (a scratch past the\n",
    "           barriers: 8 consumer warps x 4 ints) */\n",
    "        int *sb = (int *)(smem + WT::bar_off + 2 * 8 * WT::kv_stages);\n",
    "        lo_min = attn_warp_imin(lo_min); lo_max = attn_warp_imax(lo_max);\n",
    "        hi_min = attn_warp_imin(hi_min); hi_max = attn_warp_imax(hi_max);\n",
    "        const int cw = warp - 4;\n",
    "        if (lane == 0) { sb[4 * cw] = lo_min; sb[4 * cw + 1] = lo_max; sb[4 * cw + 2] = hi_min; sb[4 * cw + 3] = hi_max; }\n",
    "        attn_named_barrier(1, WT::consumers);\n",
    "        const int *wb = sb + 16 * wg;\n",
    "        lo_min = attn_imin(attn_imin(wb[0], wb[4]), attn_imin(wb[8], wb[12]));\n",
    "        lo_max = attn_imax(attn_imax(wb[1], wb[5]), attn_imax(wb[9], wb[13]));\n",
    "        hi_min = attn_imin(attn_imin(wb[2], wb[6]), attn_imin(wb[10], wb[14]));\n",
    "        hi_max = attn_imax(attn_imax(wb[3], wb[7]), attn_imax(wb[11], wb[15]));\n",
    "    }\n",
    "\n",
    "    float m[2] = {attn_neg_inf(), attn_neg_inf()}, l[2] = {0.0f, 0.0f};\n",
    "    float o[HEAD_DIM / 2];\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < HEAD_DIM / 2; i++) o[i] = 0.0f;\n",
    "    const float qk_scale = p.scale * ATTN_LOG2E;\n",
    "    const attn_u32 sQ_wg = sQ + (attn_u32)(wg * 64 * 128);\n",
    "\n",
    "    attn_pipe_state<WT::kv_stages> st = {0, 0u};\n",
    "    if (PINGPONG && wg == 1) attn_named_barrier_arrive(2, WT::consumers); /* warpgroup 0 goes first */\n",
    "    for (int it = 0; it < ntiles; it++, st.advance()) {\n",
    "        const int kt0 = tile0 + it * KV_TILE;\n",
    "        const attn_u32 sK_st = sK + (attn_u32)(st.stage * WT::tile_bytes), sV_st = sV + (attn_u32)(st.stage * WT::tile_bytes);\n",
    "        attn_mbar_wait(full + 8 * st.stage, st.phase);\n",
    "        if (kt0 < w.key0 || kt0 + KV_TILE > w.key1) { /* an edge tile: zero the V rows of keys outside [key0, key1) */\n",
    "            for (int u = ctid; u < KV_TILE * (HEAD_DIM / 8); u += WT::consumers) {\n",
    "                const int r = u / (HEAD_DIM / 8), ch = u - r * (HEAD_DIM / 8), k = kt0 + r;\n",
    "                if (k < w.key0 || k >= w.key1) {\n",
    "                    const attn_vec16 zero = {0u, 0u, 0u, 0u};\n",
    "                    *(attn_vec16 *)(smem + (sV_st - base) + attn_wgmma_swizzle_offset<KV_TILE>(r, ch)) = zero;\n",
    "                }\n",
    "            }\n",
    "            attn_fence_proxy_async();\n",
    "            attn_named_barrier(1, WT::consumers);\n",
    "        }\n",
    "        const int active = __all_sync(0xffffffffu, kt0 + KV_TILE > lo_min && kt0 < hi_max);\n",
    "        if (PINGPONG) attn_named_barrier(2 + wg, WT::consumers); /* my turn (every tile, active or not: the counts pair up) */\n",
    "        if (active) {\n",
    "            const int need_mask = kt0 < lo_max || kt0 + KV_TILE > hi_min;\n",
    "            float s[KV_TILE / 2];\n",
    "            attn_wgmma_fence();\n",
    "#pragma unroll\n",
    "            for (int k = 0; k < HEAD_DIM; k += 16)\n",
    "                attn_wgmma<KV_TILE, DT_Q>::template ss<0>(s, attn_wgmma_desc_k_major<WT::rows_pad>(sQ_wg, k),\n",
    "                                                          attn_wgmma_desc_k_major<KV_TILE>(sK_st, k), k > 0);\n",
    "            attn_wgmma_commit();\n",
    "            if (PINGPONG) attn_named_barrier_arrive(3 - wg, WT::consumers); /* the other's turn */\n",
    "            attn_wgmma_wait<0>();\n",
    "            attn_wgmma_fence_acc(s);\n",
    "            float mx[2] = {attn_neg_inf(), attn_neg_inf()};\n",
    "            int dlo[2], dhi[2];\n",
    "#pragma unroll\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                dlo[h] = lo[h] - (kt0 + 2 * tq);\n",
    "                dhi[h] = hi[h] - (kt0 + 2 * tq);\n",
    "            }\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < KV_TILE / 8; i++)\n",
    "#pragma unroll\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    const int h = e >> 1, c = 8 * i + (e & 1);\n",
    "                    float x = s[4 * i + e];\n",
    "                    if (need_mask && (c < dlo[h] || c >= dhi[h])) x = attn_neg_inf();\n",
    "                    s[4 * i + e] = x;\n",
    "                    mx[h] = fmaxf(mx[h], x);\n",
    "                }\n",
    "            float base_s[2], sum[2] = {0.0f, 0.0f}, alpha[2];\n",
    "#pragma unroll\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                base_s[h] = attn_softmax_rebase(m[h], attn_quad_max(mx[h]) * qk_scale, alpha[h]);\n",
    "                l[h] *= alpha[h];\n",
    "            }\n",
    "            attn_wgmma_scale_rows(o, alpha[0], alpha[1]);\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < KV_TILE / 8; i++)\n",
    "#pragma unroll\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    const float x = attn_exp2(fmaf(s[4 * i + e], qk_scale, -base_s[e >> 1]));\n",
    "                    s[4 * i + e] = x;\n",
    "                    sum[e >> 1] += x;\n",
    "                }\n",
    "            l[0] += sum[0];\n",
    "            l[1] += sum[1];\n",
    "            attn_u32 a[KV_TILE / 16][4];\n",
    "#pragma unroll\n",
    "            for (int j = 0; j < KV_TILE / 16; j++) attn_wgmma_a_from_acc<DT_Q>(a[j], s, j);\n",
    "            if (PINGPONG == 2) attn_named_barrier(2 + wg, WT::consumers); /* my P V turn */\n",
    "            attn_wgmma_fence();\n",
    "#pragma unroll\n",
    "            for (int j = 0; j < KV_TILE / 16; j++)\n",
    "                attn_wgmma<HEAD_DIM, DT_Q>::template rs<1>(o, a[j], attn_wgmma_desc_mn_major<KV_TILE>(sV_st, 16 * j), 1);\n",
    "            attn_wgmma_commit();\n",
    "            if (PINGPONG == 2) attn_named_barrier_arrive(3 - wg, WT::consumers);\n",
    "            attn_wgmma_wait<0>();\n",
    "            attn_wgmma_fence_acc(o);\n",
    "        } else if (PINGPONG) {\n",
    "            attn_named_barrier_arrive(3 - wg, WT::consumers);\n",
    "            if (PINGPONG == 2) { /* the P V turn too: the counts pair up */\n",
    "                attn_named_barrier(2 + wg, WT::consumers);\n",
    "                attn_named_barrier_arrive(3 - wg, WT::consumers);\n",
    "            }\n",
    "        }\n",
    "        __syncwarp();\n",
    "        if (lane == 0) attn_mbar_arrive(empty + 8 * st.stage); /* this warp is done with the stage */\n",
    "    }\n",
    "\n",
    "    /* ---- epilogue (the consumers): O / l to shared memory over the stages, lse, rows out.\n",
    "       Every copy landed: each full barrier was waited on. ---- */\n",
    "    if (w.slot >= 0) { /* a partial (CASCADE's prefix pass): O, m, l of each row as they are */\n",
    "#pragma unroll\n",
    "        for (int h = 0; h < 2; h++) {\n",
    "            const int R = row0 + 8 * h;\n",
    "            const float L = attn_quad_sum(l[h]); /* every lane: a warp shuffle */\n",
    "            if (R >= nrows) continue;\n",
    "            const attn_i64 prow = (attn_i64)w.slot * WT::rows + R;\n",
    "            float *dst = p.partial_o + prow * HEAD_DIM + 2 * tq;\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < HEAD_DIM / 8; i++)\n",
    "                *(float2 *)(dst + 8 * i) = make_float2(o[4 * i + 2 * h], o[4 * i + 2 * h + 1]);\n",
    "            if (tq == 0) {\n",
    "                p.partial_ml[prow * 2] = m[h];\n",
    "                p.partial_ml[prow * 2 + 1] = L;\n",
    "            }\n",
    "        }\n",
    "        return;\n",
    "    }\n",
    "    attn_named_barrier(1, WT::consumers); /* both warpgroups are done with the stages */\n",
    "    char *const sO = smem + WT::k_off;\n",
    "#pragma unroll\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        const int R = row0 + 8 * h;\n",
    "        float L = attn_quad_sum(l[h]), M = m[h], ws = 1.0f;\n",
    "        if (p.sinks && R < nrows) { /* attention sinks: the row's head's, once (never split) */\n",
    "            const int t = R / GROUP;\n",
    "            ws = attn_softmax_sink(__ldg(p.sinks + w.kv_head * GROUP + (R - t * GROUP)), M, L);\n",
    "        }\n",
    "        const float inv = L > 0.0f ? ws * attn_rcp(L) : 0.0f;\n",
    "        char *orow = sO + (R * WT::o_pitch + 2 * tq) * WT::esz;\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < HEAD_DIM / 8; i++)\n",
    "            *(attn_u32 *)(orow + 8 * i * WT::esz) = attn_elem<DT_Q>::pack2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);\n",
    "        if (tq == 0 && R < nrows && p.lse) {\n",
    "            const int t = R / GROUP, head = w.kv_head * GROUP + (R - t * GROUP);\n",
    "            p.lse[(attn_i64)(w.q_start + w.tok0 + t) * p.lse_stride_token + head * p.lse_stride_head] =\n",
    "                attn_softmax_lse2(M, L) * ATTN_LN2;\n",
    "        }\n",
    "    }\n",
    "    attn_named_barrier(1, WT::consumers);\n",
    "    const int cpr = HEAD_DIM * WT::esz / 16;\n",
    "    const int out_vec = attn_aligned16(p.out) && ((p.out_stride_token * WT::esz) & 15) == 0 && ((p.out_stride_head * WT::esz) & 15) == 0;\n",
    "    for (int u = ctid; u < nrows * cpr; u += WT::consumers) {\n",
    "        const int R = u / cpr, c = u - R * cpr;\n",
    "        const int t = R / GROUP, head = w.kv_head * GROUP + (R - t * GROUP);\n",
    "        const attn_vec16 v = *(const attn_vec16 *)(sO + (R * WT::o_pitch + c * 8) * WT::esz);\n",
    "        char *dst = (char *)p.out + ((attn_i64)(w.q_start + w.tok0 + t) * p.out_stride_token + (attn_i64)head * p.out_stride_head + c * 8) * WT::esz;\n",
    "        if (out_vec) {\n",
    "            attn_stg16(dst, v);\n",
    "        } else {\n",
    "            const attn_u32 x[4] = {v.x, v.y, v.z, v.w};\n",
    "#pragma unroll\n",
    "            for (int i = 0; i < 4; i++) {\n",
    "                ((attn_u16 *)dst)[2 * i] = (attn_u16)(x[i] & 0xffffu);\n",
    "                ((attn_u16 *)dst)[2 * i + 1] = (attn_u16)(x[i] >> 16);\n",
    "            }\n",
    "        }\n",
    "    }\n",
    "}\n",
    0};
static const char *const attn__kernel_src_paged_tile_loader_cuh[] = {
    "/* paged_tile_loader.cuh - the paged K/V tile loader's addressing of paged_attention.cu's\n",
    "   pitched stages (paged_prefill_sm90.cu writes the same arithmetic out: see there why).\n",
    "\n",
    "   A CTA walks tiles of TILE keys aligned to multiples of TILE, from floor(key0 / TILE) *\n",
    "   TILE to key1 (attn_paged_tiles). For every key row of the STAGES tiles in flight the\n",
    "   byte offset of its K row in the cache sits in shared memory (the row table, sBlk\n",
    "   [stage][key]; -1 for a key outside [key0, key1): the stage row is zero-filled and\n",
    "   nothing is read, not even the key's block_table entry), so a copy's address is one\n",
    "   64-bit add. The table of tile it + STAGES is read from block_table into registers\n",
    "   while tile it computes (prefetch) and stored once the stage is free (store), so the\n",
    "   block-table latency hides under compute.\n",
    "\n",
    "   Cache layout (attn__paged_params, the CPU's): block b is [K half][V half]; a half is\n",
    "   BLOCK_SIZE x num_kv_heads rows of ROW_BYTES, then (SCALE_BYTES 4: per-token-head 8-bit\n",
    "   caches) one f32 scale per row. The V row of a key is v_bytes after its K row. */\n",
    "#ifndef ATTN_PAGED_TILE_LOADER_CUH\n",
    "#define ATTN_PAGED_TILE_LOADER_CUH\n",
    "\n",
    "#include \"attn_common.cuh\"\n",
    "#include \"attn_params.cuh\" /* attn__paged_params */\n",
    "\n",
    "/* The first tile and the number of tiles that cover [key0, key1) (0 when it is empty). */\n",
    "template <int TILE>\n",
    "ATTN_DEV void attn_paged_tiles(int key0, int key1, int &tile0, int &ntiles) {\n",
    "    tile0 = key1 > key0 ? key0 / TILE * TILE : 0;\n",
    "    ntiles = key1 > key0 ? (key1 - tile0 + TILE - 1) / TILE : 0;\n",
    "}\n",
    "\n",
    "/* Where a request's keys live, for one KV head. */\n",
    "template <int BLOCK_SIZE_, int ROW_BYTES, int SCALE_BYTES>\n",
    "struct attn_paged_rows {\n",
    "    const int *bt;     /* the request's block_table row */\n",
    "    attn_i64 v_bytes;  /* K row -> V row: one block half */\n",
    "    int key0, key1, kv_head, num_kv_heads;\n",
    "\n",
    "    ATTN_DEV attn_paged_rows(const attn__paged_params &p, int req, int head, int k0, int k1)\n",
    "        : bt(p.block_table + (attn_i64)req * p.block_table_stride),\n",
    "          v_bytes((attn_i64)BLOCK_SIZE_ * p.num_kv_heads * (ROW_BYTES + SCALE_BYTES)), key0(k0), key1(k1),\n",
    "          kv_head(head), num_kv_heads(p.num_kv_heads) {}\n",
    "\n",
    "    /* physical block of key j (absolute), -1 outside [key0, key1) */\n",
    "    ATTN_DEV int block_of(int j) const { return j >= key0 && j < key1 ? bt[(unsigned)j / BLOCK_SIZE_] : -1; }\n",
    "\n",
    "    /* byte offset in the cache of key j's K row, given its block b; -1 for b = -1 */\n",
    "    ATTN_DEV attn_i64 row_offset(int b, int j) const {\n",
    "        return b >= 0 ? (attn_i64)b * (2 * v_bytes) +\n",
    "                            ((attn_i64)((unsigned)j % BLOCK_SIZE_) * num_kv_heads + kv_head) * ROW_BYTES\n",
    "                      : (attn_i64)-1;\n",
    "    }\n",
    "\n",
    "    /* SCALE_BYTES 4: the K scale of key j's row sits this many bytes after its codes (the V\n",
    "       scale as far after the V codes): the codes plane, then row x's scale, x = row in\n",
    "       block * heads + head */\n",
    "    ATTN_DEV int scale_delta(int j) const {\n",
    "        const int x = (int)((unsigned)j % BLOCK_SIZE_) * num_kv_heads + kv_head;\n",
    "        return BLOCK_SIZE_ * num_kv_heads * ROW_BYTES - x * (ROW_BYTES - 4);\n",
    "    }\n",
    "\n",
    "    /* The row table of the first STAGES tiles from tile0 (sDel: SCALE_BYTES 4, each row's\n",
    "       scale_delta). The caller syncs before the copies read it. */\n",
    "    template <int STAGES, int TILE, int THREADS>\n",
    "    ATTN_DEV void fill(attn_i64 *sBlk, int *sDel, int tile0, int tid) const {\n",
    "#pragma unroll\n",
    "        for (int s = 0; s < STAGES; s++)\n",
    "            for (int r = tid; r < TILE; r += THREADS) {\n",
    "                const int j = tile0 + s * TILE + r;\n",
    "                sBlk[s * TILE + r] = row_offset(block_of(j), j);\n",
    "                if (SCALE_BYTES) sDel[s * TILE + r] = scale_delta(j);\n",
    "            }\n",
    "    }\n",
    "\n",
    "    /* The block numbers of tile `tile` (its first key) this thread stores: into registers\n",
    "       before the tile in its stage computes ... */\n",
    "    template <int TILE, int THREADS, int BPT>\n",
    "    ATTN_DEV void prefetch(int tile, int tid, int (&next)[BPT]) const {\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < BPT; i++) next[i] = tid + i * THREADS < TILE ? block_of(tile + tid + i * THREADS) : -1;\n",
    "    }\n",
    "    /* ... and into the row table of `stage` after it. */\n",
    "    template <int TILE, int THREADS, int BPT>\n",
    "    ATTN_DEV void store(attn_i64 *sBlk, int *sDel, int stage, int tile, int tid, const int (&next)[BPT]) const {\n",
    "#pragma unroll\n",
    "        for (int i = 0; i < BPT; i++)\n",
    "            if (tid + i * THREADS < TILE) {\n",
    "                const int j = tile + tid + i * THREADS;\n",
    "                sBlk[stage * TILE + tid + i * THREADS] = row_offset(next[i], j);\n",
    "                if (SCALE_BYTES) sDel[stage * TILE + tid + i * THREADS] = scale_delta(j);\n",
    "            }\n",
    "    }\n",
    "};\n",
    "\n",
    "#endif /* ATTN_PAGED_TILE_LOADER_CUH */\n",
    0};
static const char *const attn__kernel_src_split_merge_cuh[] = {
    "/* split_merge.cuh - the merge of softmax states, written once: split-KV partials, the key\n",
    "   slices of the warps of one CTA, MLA prefill chunks. A state is what online_softmax.cuh\n",
    "   leaves for a row: (m, l, O) with O unnormalised, or (lse, O) with O normalised; both in\n",
    "   base 2. Merging n states:\n",
    "\n",
    "     M = max over the states that saw a key of x_s     (x_s = m_s, or lse_s)\n",
    "     w_s = attn_merge_weight(x_s, attn_merge_base(M))  (0 for a state that saw no key)\n",
    "     O = sum w_s O_s,  l = sum w_s l_s  (or lse = M + log2 sum w_s)\n",
    "\n",
    "   A state that saw no key (l = 0, lse = -inf) weighs 0 whatever its O holds: partial\n",
    "   workspaces are not cleared between launches. The loops that run this (which lanes hold\n",
    "   which splits, where the partials live) are the kernels'; merge.cu, vLLM's\n",
    "   merge_attn_states on natural-log LSEs, keeps expf/logf to match its peer. */\n",
    "#ifndef ATTN_SPLIT_MERGE_CUH\n",
    "#define ATTN_SPLIT_MERGE_CUH\n",
    "\n",
    "#include \"attn_common.cuh\"\n",
    "\n",
    "/* The exponent base of a merge: the largest state, or 0 when no state saw a key. */\n",
    "ATTN_DEV float attn_merge_base(float mx) { return mx == attn_neg_inf() ? 0.0f : mx; }\n",
    "\n",
    "/* A state's weight against that base: 0 for a state that saw no key (x = -inf). */\n",
    "ATTN_DEV float attn_merge_weight(float x, float base) { return x == attn_neg_inf() ? 0.0f : attn_exp2(x - base); }\n",
    "\n",
    "/* An (m, l) state's merge key: m, or -inf when it saw no key (l = 0). */\n",
    "ATTN_DEV float attn_merge_key(float m, float l) { return l > 0.0f ? m : attn_neg_inf(); }\n",
    "\n",
    "#endif /* ATTN_SPLIT_MERGE_CUH */\n",
    0};
static const char *const attn__kernel_src_util_cu[] = {
    "// util.cu — small device utilities: filling buffers (the tests poison outputs with NaN\n",
    "// before every GPU run; workspaces are cleared with it) and the read-bandwidth probe that\n",
    "// tools/attn-bench-cuda measures the device's ceiling with (it compiles this file itself).\n",
    "// Header-free on purpose: NVRTC has no include path (DESIGN.md).\n",
    "\n",
    "typedef unsigned int attn_u32;\n",
    "typedef unsigned long long attn_u64;\n",
    "\n",
    "// Writes `value` (a 32-bit pattern) to n words, 16 bytes per store: dst must be 16-byte\n",
    "// aligned (cuMemAlloc gives 256).\n",
    "extern \"C\" __global__ void attn_fill_u32(attn_u32 *dst, attn_u64 n, attn_u32 value) {\n",
    "    attn_u64 i = ((attn_u64)blockIdx.x * blockDim.x + threadIdx.x) * 4;\n",
    "    attn_u64 stride = (attn_u64)gridDim.x * blockDim.x * 4;\n",
    "    for (; i + 4 <= n; i += stride) {\n",
    "        uint4 v;\n",
    "        v.x = v.y = v.z = v.w = value;\n",
    "        *(uint4 *)(dst + i) = v;\n",
    "    }\n",
    "    for (; i < n; i++) dst[i] = value; // the tail (< 4 words) of the last thread\n",
    "}\n",
    "\n",
    "// The same for 16-bit patterns (f16/bf16 buffers).\n",
    "extern \"C\" __global__ void attn_fill_u16(unsigned short *dst, attn_u64 n, unsigned short value) {\n",
    "    attn_u64 i = (attn_u64)blockIdx.x * blockDim.x + threadIdx.x;\n",
    "    attn_u64 stride = (attn_u64)gridDim.x * blockDim.x;\n",
    "    for (; i < n; i += stride) dst[i] = value;\n",
    "}\n",
    "\n",
    "// Reads n 16-byte words (grid-stride, four independent loads in flight per thread, loads\n",
    "// that bypass L1 and are marked evict-first in L2) and folds them with XOR. The result is\n",
    "// stored only when it equals `never` (the caller passes a value the data cannot fold to),\n",
    "// so the compiler must keep every load while the kernel writes nothing: what it measures\n",
    "// is the device's read bandwidth, the ceiling of a memory-bound decode.\n",
    "extern \"C\" __global__ void attn_read_probe(const uint4 *src, attn_u64 n, attn_u32 never, attn_u32 *out) {\n",
    "    attn_u64 stride = (attn_u64)gridDim.x * blockDim.x;\n",
    "    attn_u64 i = (attn_u64)blockIdx.x * blockDim.x + threadIdx.x;\n",
    "    attn_u32 acc = 0;\n",
    "    for (; i + 3 * stride < n; i += 4 * stride) {\n",
    "        uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride);\n",
    "        uint4 c = __ldcs(src + i + 2 * stride), d = __ldcs(src + i + 3 * stride);\n",
    "        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;\n",
    "        acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;\n",
    "    }\n",
    "    for (; i < n; i += stride) {\n",
    "        uint4 a = __ldcs(src + i);\n",
    "        acc ^= a.x ^ a.y ^ a.z ^ a.w;\n",
    "    }\n",
    "    if (acc == never) out[0] = acc;\n",
    "}\n",
    0};
static const char *const attn__kernel_src_wgmma_cuh[] = {
    "/* wgmma.cuh - Hopper warpgroup MMA (wgmma.mma_async) for kernels compiled for sm_90a.\n",
    "\n",
    "   Included only by kernels built with --gpu-architecture=sm_90a: wgmma is an\n",
    "   arch-specific instruction (NVRTC defines __CUDA_ARCH_FEAT_SM90_ALL for sm_90a only; a\n",
    "   cubin that uses it runs on compute capability 9.0 only). Inline PTX, no CUDA header.\n",
    "   tests/wgmma_probe.cu exercises every helper here; tests/wgmma_check.c runs it (on an\n",
    "   H200: every probe within 1.2e-5 of a float64 reference; with the MN-major LBO and SBO\n",
    "   swapped, the PV probes fail, so the choice below is the hardware's, not a guess).\n",
    "\n",
    "   One wgmma is issued by a warpgroup: 128 consecutive threads (warps 4k..4k+3) executing\n",
    "   it together. Shape m64nNk16: D[64][N] (+)= A[64][16] . B[16][N], f16 or bf16 inputs,\n",
    "   f32 accumulators in registers. A comes from shared memory (a descriptor) or from\n",
    "   registers; B always from shared memory.\n",
    "\n",
    "   ---- the 128-byte swizzled shared-memory layout (descriptor swizzle mode 1) ----------\n",
    "\n",
    "   Data is stored in rows of 128 bytes (64 16-bit elements = eight 16-byte chunks). Eight\n",
    "   consecutive rows, 1024 bytes, form an \"atom\"; every atom starts on a 1024-byte boundary\n",
    "   (then the descriptor's base offset is 0, which is all this file writes). Inside a row,\n",
    "   chunk c (elements 8c..8c+7 of that row) is stored at chunk position c ^ (r % 8):\n",
    "\n",
    "       byte(r, e) = (e / 64) * PANEL + r * 128 + (((e / 8) % 8) ^ (r % 8)) * 16 + (e % 8) * 2\n",
    "\n",
    "   for row r and element e of a tile of ROWS rows, PANEL = ROWS * 128: a row wider than 64\n",
    "   elements continues in the next panel (head dim 128 = two panels). The hardware's rule\n",
    "   is the same statement about addresses: inside a 1024-aligned atom, address bits [6:4]\n",
    "   are XORed with bits [9:7]. Example, a 64 x 64 bf16 tile (one panel, 8192 bytes): row 0\n",
    "   is stored in order; row 1 has chunks 1,0,3,2,5,4,7,6; element 20 of row 5 (chunk 2,\n",
    "   third element) is at 5 * 128 + (2 ^ 5) * 16 + 4 * 2 = 760. The XOR spreads the eight\n",
    "   16-byte chunks of one column of chunks over all 32 banks, so neither the cp.async\n",
    "   writer nor the tensor core's reads conflict.\n",
    "\n",
    "   K-major operand (A = Q or P [M][K]; B = K [N][K] with tnspB 0): the rows are the M (or\n",
    "   N) index, K runs along the row. The k16 step s reads K elements 16s..16s+15, that is 32\n",
    "   bytes of every row: descriptor start = tile + (16s / 64) * PANEL + (16s % 64) * 2\n",
    "   (32 bytes per step inside a panel), SBO = 1024 (from one 8-row group to the next),\n",
    "   LBO unused by swizzled K-major layouts (1 written, as the PTX ISA says it is assumed).\n",
    "   Advancing the start by 32 bytes is right because the XOR is applied to the final\n",
    "   address: row r's chunk 2s + c (c = 0, 1) is looked up at position (2s + c) ^ (r % 8),\n",
    "   exactly where the writer put it. The atom itself stays 1024-aligned, so base offset 0.\n",
    "\n",
    "   MN-major B operand (tnspB 1; V [keys][dims] row-major: the N index contiguous): the\n",
    "   rows are the K index (keys), a row holds 64 N columns, N beyond 64 in the next panel.\n",
    "   The k16 step s reads keys 16s..16s+15: start = tile + 16s * 128 (2048 bytes per step,\n",
    "   whole atoms), SBO = 1024 (the next 8 keys), LBO = PANEL (from one 64-column block of N\n",
    "   to the next; the PTX ISA: \"stride from the first 8 rows to the next 8 rows\" of the\n",
    "   128-bit-element MN-major matrix; CUTLASS make_gmma_desc<Major::MN>: the n mode).\n",
    "\n",
    "   Descriptor bits (PTX ISA \"Matrix Descriptor Format\"; enc(x) = (x & 0x3FFFF) >> 4):\n",
    "   [13:0] enc(start address, a shared-window byte address), [29:16] enc(LBO), [45:32]\n",
    "   enc(SBO), [51:49] base offset, [63:62] swizzle (0 none, 1 128B, 2 64B, 3 32B).\n",
    "\n",
    "   ---- register fragments (thread t of the warpgroup: w = t / 32, g = (t % 32) / 4,\n",
    "   q = t % 4; PTX ISA \"Register Fragments\" for .m64nNk16; CUTLASS CLayout_64xN and\n",
    "   ALayout_64x16 say the same) ------------------------------------------------------------\n",
    "\n",
    "   Accumulator D (f32, N/2 registers):  d[4i + 2h + b] = D[16w + g + 8h][8i + 2q + b]\n",
    "       for i in [0, N/8), h, b in {0, 1}: rows 16w + g and 16w + g + 8, columns 8i + 2q, +1.\n",
    "   A from registers (16-bit, four b32 registers, lower column in the low half):\n",
    "       a[0] = A[16w + g][2q, 2q+1]      a[1] = A[16w + g + 8][2q, 2q+1]\n",
    "       a[2] = A[16w + g][2q+8, 2q+9]    a[3] = A[16w + g + 8][2q+8, 2q+9]\n",
    "   (the m16n8k16 mma.sync A fragment of attn_common.cuh, warp w taking rows 16w..16w+15).\n",
    "   So the accumulator of S = Q K^T is, per k16 step j of P . V, the A fragment:\n",
    "   a = {d[8j], d[8j+1]}, {d[8j+2], d[8j+3]}, {d[8j+4], d[8j+5]}, {d[8j+6], d[8j+7]} packed\n",
    "   to 16 bits (attn_wgmma_a_from_acc).\n",
    "\n",
    "   ---- ordering -----------------------------------------------------------------------\n",
    "   Shared memory written by st.shared or cp.async (the generic proxy) is read by wgmma\n",
    "   through the async proxy. Each writing thread: cp.async wait, then\n",
    "   attn_wgmma_fence_smem_writes (fence.proxy.async.shared::cta), then a barrier\n",
    "   (__syncthreads), then wgmma. attn_wgmma_fence (wgmma.fence) goes before the first\n",
    "   wgmma and again whenever the accumulator or A registers were written by other\n",
    "   instructions. After attn_wgmma_commit / attn_wgmma_wait<0>, attn_wgmma_fence_acc keeps\n",
    "   the compiler from moving reads of the accumulators above the wait. */\n",
    "#ifndef ATTN_WGMMA_CUH\n",
    "#define ATTN_WGMMA_CUH\n",
    "\n",
    "#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL)\n",
    "#error \"wgmma.cuh needs --gpu-architecture=sm_90a (wgmma.mma_async is arch-specific to sm_90a)\"\n",
    "#endif\n",
    "\n",
    "#include \"attn_common.cuh\"\n",
    "\n",
    "/* ---- the swizzled layout ---- */\n",
    "\n",
    "/* Byte offset of 16-byte chunk `chunk` (elements 8 * chunk ..) of row `row` in a tile of\n",
    "   ROWS rows stored in the 128-byte swizzled layout (ROWS * 128-byte panels). */\n",
    "template <int ROWS> ATTN_DEV attn_u32 attn_wgmma_swizzle_offset(int row, int chunk) {\n",
    "    static_assert(ROWS % 8 == 0, \"a swizzled tile has whole 8-row atoms\");\n",
    "    return (attn_u32)((chunk >> 3) * (ROWS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));\n",
    "}\n",
    "\n",
    "/* cp.async of a row-major ROWS x COLS tile of 16-bit elements (rows `row_stride_bytes`\n",
    "   apart in global memory, 16-byte aligned) into the swizzled layout at shared address\n",
    "   `tile` (1024-aligned). Issued by THREADS threads, `tid` in [0, THREADS); commit and wait\n",
    "   are the caller's (attn_cp_async_commit / attn_cp_async_wait). */\n",
    "template <int ROWS, int COLS, int THREADS>\n",
    "ATTN_DEV void attn_wgmma_load_tile(attn_u32 tile, const void *gmem, attn_i64 row_stride_bytes, int tid) {\n",
    "    static_assert(COLS % 64 == 0, \"a swizzled row is 64 16-bit elements; wider tiles take whole panels\");\n",
    "    const int chunks = COLS / 8;\n",
    "#pragma unroll 4\n",
    "    for (int i = tid; i < ROWS * chunks; i += THREADS) {\n",
    "        int r = i / chunks, c = i % chunks;\n",
    "        attn_cp_async16(tile + attn_wgmma_swizzle_offset<ROWS>(r, c),\n",
    "                        (const char *)gmem + r * row_stride_bytes + c * 16, 16);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* ---- descriptors ---- */\n",
    "\n",
    "ATTN_DEV attn_u64 attn_wgmma_desc_encode(attn_u32 bytes) { return (attn_u64)((bytes & 0x3FFFFu) >> 4); }\n",
    "\n",
    "/* A 128B-swizzle descriptor (base offset 0: the atoms are 1024-aligned). */\n",
    "ATTN_DEV attn_u64 attn_wgmma_desc(attn_u32 start, attn_u32 lbo, attn_u32 sbo) {\n",
    "    return attn_wgmma_desc_encode(start) | attn_wgmma_desc_encode(lbo) << 16 | attn_wgmma_desc_encode(sbo) << 32 |\n",
    "           1ull << 62;\n",
    "}\n",
    "\n",
    "/* K-major operand: K elements k..k+15 (k % 16 == 0) of a swizzled tile of ROWS rows. */\n",
    "template <int ROWS> ATTN_DEV attn_u64 attn_wgmma_desc_k_major(attn_u32 tile, int k) {\n",
    "    return attn_wgmma_desc(tile + (attn_u32)((k >> 6) * (ROWS * 128) + (k & 63) * 2), 16, 1024);\n",
    "}\n",
    "\n",
    "/* MN-major B operand (tnspB 1): rows (keys) k..k+15 (k % 16 == 0) of a swizzled tile whose\n",
    "   ROWS rows are the K index and whose columns are N. */\n",
    "template <int ROWS> ATTN_DEV attn_u64 attn_wgmma_desc_mn_major(attn_u32 tile, int k) {\n",
    "    return attn_wgmma_desc(tile + (attn_u32)(k * 128), ROWS * 128, 1024);\n",
    "}\n",
    "\n",
    "/* ---- fences and groups ---- */\n",
    "\n",
    "/* Generic-proxy shared-memory writes (st.shared, cp.async) of this thread become visible\n",
    "   to the async proxy (wgmma); follow with a barrier before the wgmma. */\n",
    "ATTN_DEV void attn_wgmma_fence_smem_writes(void) { asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\"); }\n",
    "\n",
    "/* Orders this warpgroup's earlier register and shared-memory accesses before the wgmma\n",
    "   that follow: before the first wgmma, and after touching accumulators or A registers. */\n",
    "ATTN_DEV void attn_wgmma_fence(void) { asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\"); }\n",
    "\n",
    "/* Closes the group of wgmma issued since the last commit. */\n",
    "ATTN_DEV void attn_wgmma_commit(void) { asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\"); }\n",
    "\n",
    "/* Waits until at most N committed groups are pending (N = 0: all done, accumulators ready). */\n",
    "template <int N> ATTN_DEV void attn_wgmma_wait(void) {\n",
    "    asm volatile(\"wgmma.wait_group.sync.aligned %0;\" :: \"n\"(N) : \"memory\");\n",
    "}\n",
    "\n",
    "/* A compiler-level fence on each accumulator: reads after it cannot move above a wait. */\n",
    "template <int R> ATTN_DEV void attn_wgmma_fence_acc(float (&d)[R]) {\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < R; i++) asm volatile(\"\" : \"+f\"(d[i]) :: \"memory\");\n",
    "}\n",
    "\n",
    "/* The same for a register A fragment an rs wgmma reads: its registers stay this value (no\n",
    "   other value may take them) until here, after the wait that retires the wgmma. */\n",
    "ATTN_DEV void attn_wgmma_fence_frag(attn_u32 (&a)[4]) {\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < 4; i++) asm volatile(\"\" : \"+r\"(a[i]) :: \"memory\");\n",
    "}\n",
    "\n",
    "/* The online softmax's rescale of an accumulator: this thread's rows 16w + g times a0, 16w +\n",
    "   g + 8 times a1 (the accumulator layout at the top). */\n",
    "template <int R> ATTN_DEV void attn_wgmma_scale_rows(float (&d)[R], float a0, float a1) {\n",
    "#pragma unroll\n",
    "    for (int i = 0; i < R / 4; i++) {\n",
    "        d[4 * i] *= a0; d[4 * i + 1] *= a0;\n",
    "        d[4 * i + 2] *= a1; d[4 * i + 3] *= a1;\n",
    "    }\n",
    "}\n",
    "\n",
    "/* The A fragment of k16 step j of a P . V product from the f32 accumulator of S (N >= 16j\n",
    "   + 16): the layouts line up (top of file); ET is the 16-bit type P is rounded to (RNE). */\n",
    "template <int ET, int R> ATTN_DEV void attn_wgmma_a_from_acc(attn_u32 (&a)[4], const float (&d)[R], int j) {\n",
    "    a[0] = attn_elem<ET>::pack2(d[8 * j + 0], d[8 * j + 1]);\n",
    "    a[1] = attn_elem<ET>::pack2(d[8 * j + 2], d[8 * j + 3]);\n",
    "    a[2] = attn_elem<ET>::pack2(d[8 * j + 4], d[8 * j + 5]);\n",
    "    a[3] = attn_elem<ET>::pack2(d[8 * j + 6], d[8 * j + 7]);\n",
    "}\n",
    "\n",
    "/* ---- the MMA: attn_wgmma<N, ET>::ss<TRANS_B>(d, desc_a, desc_b, scale_d)\n",
    "                 attn_wgmma<N, ET>::rs<TRANS_B>(d, a, desc_b, scale_d)\n",
    "   D[64][N] = A . B + (scale_d ? D : 0); ss: A from a K-major descriptor, rs: A from the\n",
    "   registers a[4] (layout at the top). TRANS_B 0: B K-major ([N][K], e.g. K of QK^T);\n",
    "   1: MN-major ([K][N], e.g. V of PV). d has N/2 floats per thread (layout at the top).\n",
    "   N in {16, 32, 64, 128, 256}; ET 1 f16, 2 bf16. */\n",
    "template <int N, int ET> struct attn_wgmma;\n",
    "\n",
    "/* Operand numbers as text: inline PTX in NVRTC has no symbolic operand names, so the R\n",
    "   accumulators are %0..%R-1 and the operands after them are numbered per R (= N / 2):\n",
    "   ss: desc_a %R, desc_b %R+1, scale_d %R+2; rs: a[0..3] %R..%R+3, desc_b %R+4, scale_d %R+5. */\n",
    "#define ATTN__WG_LIST8(a, b, c, d, e, f, g, h) \"%\" #a \", %\" #b \", %\" #c \", %\" #d \", %\" #e \", %\" #f \", %\" #g \", %\" #h\n",
    "#define ATTN__WG_R8 ATTN__WG_LIST8(0, 1, 2, 3, 4, 5, 6, 7)\n",
    "#define ATTN__WG_R16 ATTN__WG_R8 \", \" ATTN__WG_LIST8(8, 9, 10, 11, 12, 13, 14, 15)\n",
    "#define ATTN__WG_R32 ATTN__WG_R16 \", \" ATTN__WG_LIST8(16, 17, 18, 19, 20, 21, 22, 23) \", \" \\\n",
    "    ATTN__WG_LIST8(24, 25, 26, 27, 28, 29, 30, 31)\n",
    "#define ATTN__WG_R64 ATTN__WG_R32 \", \" ATTN__WG_LIST8(32, 33, 34, 35, 36, 37, 38, 39) \", \" \\\n",
    "    ATTN__WG_LIST8(40, 41, 42, 43, 44, 45, 46, 47) \", \" ATTN__WG_LIST8(48, 49, 50, 51, 52, 53, 54, 55) \", \" \\\n",
    "    ATTN__WG_LIST8(56, 57, 58, 59, 60, 61, 62, 63)\n",
    "#define ATTN__WG_R128 ATTN__WG_R64 \", \" ATTN__WG_LIST8(64, 65, 66, 67, 68, 69, 70, 71) \", \" \\\n",
    "    ATTN__WG_LIST8(72, 73, 74, 75, 76, 77, 78, 79) \", \" ATTN__WG_LIST8(80, 81, 82, 83, 84, 85, 86, 87) \", \" \\\n",
    "    ATTN__WG_LIST8(88, 89, 90, 91, 92, 93, 94, 95) \", \" ATTN__WG_LIST8(96, 97, 98, 99, 100, 101, 102, 103) \", \" \\\n",
    "    ATTN__WG_LIST8(104, 105, 106, 107, 108, 109, 110, 111) \", \" \\\n",
    "    ATTN__WG_LIST8(112, 113, 114, 115, 116, 117, 118, 119) \", \" \\\n",
    "    ATTN__WG_LIST8(120, 121, 122, 123, 124, 125, 126, 127)\n",
    "#define ATTN__WG_SS_AB8 \"%8, %9\"\n",
    "#define ATTN__WG_SS_SD8 \"%10\"\n",
    "#define ATTN__WG_SS_AB16 \"%16, %17\"\n",
    "#define ATTN__WG_SS_SD16 \"%18\"\n",
    "#define ATTN__WG_SS_AB32 \"%32, %33\"\n",
    "#define ATTN__WG_SS_SD32 \"%34\"\n",
    "#define ATTN__WG_SS_AB64 \"%64, %65\"\n",
    "#define ATTN__WG_SS_SD64 \"%66\"\n",
    "#define ATTN__WG_SS_AB128 \"%128, %129\"\n",
    "#define ATTN__WG_SS_SD128 \"%130\"\n",
    "#define ATTN__WG_RS_AB8 \"{%8, %9, %10, %11}, %12\"\n",
    "#define ATTN__WG_RS_SD8 \"%13\"\n",
    "#define ATTN__WG_RS_AB16 \"{%16, %17, %18, %19}, %20\"\n",
    "#define ATTN__WG_RS_SD16 \"%21\"\n",
    "#define ATTN__WG_RS_AB32 \"{%32, %33, %34, %35}, %36\"\n",
    "#define ATTN__WG_RS_SD32 \"%37\"\n",
    "#define ATTN__WG_RS_AB64 \"{%64, %65, %66, %67}, %68\"\n",
    "#define ATTN__WG_RS_SD64 \"%69\"\n",
    "#define ATTN__WG_RS_AB128 \"{%128, %129, %130, %131}, %132\"\n",
    "#define ATTN__WG_RS_SD128 \"%133\"\n",
    "\n",
    "#define ATTN__WG_D8(i) \"+f\"(d[(i) + 0]), \"+f\"(d[(i) + 1]), \"+f\"(d[(i) + 2]), \"+f\"(d[(i) + 3]), \\\n",
    "    \"+f\"(d[(i) + 4]), \"+f\"(d[(i) + 5]), \"+f\"(d[(i) + 6]), \"+f\"(d[(i) + 7])\n",
    "#define ATTN__WG_D16(i) ATTN__WG_D8(i), ATTN__WG_D8((i) + 8)\n",
    "#define ATTN__WG_D32(i) ATTN__WG_D16(i), ATTN__WG_D16((i) + 16)\n",
    "#define ATTN__WG_D64(i) ATTN__WG_D32(i), ATTN__WG_D32((i) + 32)\n",
    "#define ATTN__WG_D128(i) ATTN__WG_D64(i), ATTN__WG_D64((i) + 64)\n",
    "\n",
    "/* p = (scale_d != 0), then the instruction; the immediates after p: imm-scale-a 1,\n",
    "   imm-scale-b 1, imm-trans-a 0 (ss only: A is K-major), imm-trans-b. */\n",
    "#define ATTN__WG_ASM(N, R, TY, FORM, TAIL)                                                            \\\n",
    "    \"{\\n.reg .pred p;\\nsetp.ne.b32 p, \" ATTN__WG_##FORM##_SD##R \", 0;\\n\"                              \\\n",
    "    \"wgmma.mma_async.sync.aligned.m64n\" #N \"k16.f32.\" TY \".\" TY \" {\" ATTN__WG_R##R \"}, \"              \\\n",
    "    ATTN__WG_##FORM##_AB##R \", p, \" TAIL \";\\n}\\n\"\n",
    "\n",
    "#define ATTN__WGMMA_DEFINE(N, R, ET, TY)                                                                  \\\n",
    "    template <> struct attn_wgmma<N, ET> {                                                                \\\n",
    "        enum { acc_regs = R };                                                                            \\\n",
    "        template <int TRANS_B>                                                                            \\\n",
    "        static ATTN_DEV void ss(float (&d)[R], attn_u64 desc_a, attn_u64 desc_b, int scale_d) {           \\\n",
    "            if constexpr (TRANS_B)                                                                        \\\n",
    "                asm volatile(ATTN__WG_ASM(N, R, TY, SS, \"1, 1, 0, 1\")                                     \\\n",
    "                             : ATTN__WG_D##R(0) : \"l\"(desc_a), \"l\"(desc_b), \"r\"(scale_d) : \"memory\");     \\\n",
    "            else                                                                                          \\\n",
    "                asm volatile(ATTN__WG_ASM(N, R, TY, SS, \"1, 1, 0, 0\")                                     \\\n",
    "                             : ATTN__WG_D##R(0) : \"l\"(desc_a), \"l\"(desc_b), \"r\"(scale_d) : \"memory\");     \\\n",
    "        }                                                                                                 \\\n",
    "        template <int TRANS_B>                                                                            \\\n",
    "        static ATTN_DEV void rs(float (&d)[R], const attn_u32 (&a)[4], attn_u64 desc_b, int scale_d) {    \\\n",
    "            if constexpr (TRANS_B)                                                                        \\\n",
    "                asm volatile(ATTN__WG_ASM(N, R, TY, RS, \"1, 1, 1\")                                        \\\n",
    "                             : ATTN__WG_D##R(0)                                                           \\\n",
    "                             : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(desc_b), \"r\"(scale_d)      \\\n",
    "                             : \"memory\");                                                                 \\\n",
    "            else                                                                                          \\\n",
    "                asm volatile(ATTN__WG_ASM(N, R, TY, RS, \"1, 1, 0\")                                        \\\n",
    "                             : ATTN__WG_D##R(0)                                                           \\\n",
    "                             : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(desc_b), \"r\"(scale_d)      \\\n",
    "                             : \"memory\");                                                                 \\\n",
    "        }                                                                                                 \\\n",
    "    };\n",
    "#define ATTN__WGMMA_DEFINE_N(N, R) ATTN__WGMMA_DEFINE(N, R, ATTN_DT_F16, \"f16\") ATTN__WGMMA_DEFINE(N, R, ATTN_DT_BF16, \"bf16\")\n",
    "\n",
    "ATTN__WGMMA_DEFINE_N(16, 8)\n",
    "ATTN__WGMMA_DEFINE_N(32, 16)\n",
    "ATTN__WGMMA_DEFINE_N(64, 32)\n",
    "ATTN__WGMMA_DEFINE_N(128, 64)\n",
    "ATTN__WGMMA_DEFINE_N(256, 128)\n",
    "\n",
    "#endif /* ATTN_WGMMA_CUH */\n",
    0};
/* 19 kernel source file(s); the lookup is declared in >>nvrtc */
static const struct { const char *name; const char *const *lines; } attn__kernel_sources[] = {
    {"attn_common.cuh", attn__kernel_src_attn_common_cuh},
    {"attn_params.cuh", attn__kernel_src_attn_params_cuh},
    {"cache_write.cu", attn__kernel_src_cache_write_cu},
    {"hopper.cuh", attn__kernel_src_hopper_cuh},
    {"merge.cu", attn__kernel_src_merge_cu},
    {"mla_common.cuh", attn__kernel_src_mla_common_cuh},
    {"mla_decode.cu", attn__kernel_src_mla_decode_cu},
    {"mla_decode_sm90.cu", attn__kernel_src_mla_decode_sm90_cu},
    {"mla_merge.cuh", attn__kernel_src_mla_merge_cuh},
    {"mla_prefill.cu", attn__kernel_src_mla_prefill_cu},
    {"mla_prefill_sm90.cu", attn__kernel_src_mla_prefill_sm90_cu},
    {"online_softmax.cuh", attn__kernel_src_online_softmax_cuh},
    {"paged_attention.cu", attn__kernel_src_paged_attention_cu},
    {"paged_common.cuh", attn__kernel_src_paged_common_cuh},
    {"paged_prefill_sm90.cu", attn__kernel_src_paged_prefill_sm90_cu},
    {"paged_tile_loader.cuh", attn__kernel_src_paged_tile_loader_cuh},
    {"split_merge.cuh", attn__kernel_src_split_merge_cuh},
    {"util.cu", attn__kernel_src_util_cu},
    {"wgmma.cuh", attn__kernel_src_wgmma_cuh},
    {0, 0}};
static const char *attn__kernel_source_name(int i) {
    return i >= 0 && i < (int)(sizeof attn__kernel_sources / sizeof attn__kernel_sources[0]) ? attn__kernel_sources[i].name : 0;
}
static const char *const *attn__kernel_source_lines(const char *name) {
    int i;
    for (i = 0; attn__kernel_sources[i].name; i++)
        if (strcmp(attn__kernel_sources[i].name, name) == 0) return attn__kernel_sources[i].lines;
    return 0;
}
#endif /* ATTN_NO_CUDA */
/* >>kernels-end */

#endif /* ATTN_IMPLEMENTATION_DONE */
#endif /* ATTN_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the attn.h authors

Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
*/
