/* The implementation of attn.h as a shared library (make build/libattn.so), so that
   python/attn_h.py (and tests/python/check_numpy.py through it) can call every ATTN_API
   function through ctypes.

   attn_py_layout() adds one thing the header has not: the size and offset of every struct
   and field that attn_h.py mirrors, and the values of the constants it uses, so that the
   module compares its mirrors with the compiled header at import and fails loudly, naming
   the struct and field, when attn.h changes. A field renamed or removed in attn.h breaks
   this file's build; one added, moved or retyped changes a size or an offset.
   attn_py_layer_forward() is attn_layer_forward with its arguments packed for ctypes. */
#define ATTN_IMPLEMENTATION
#include "attn.h"

/* One entry: "struct" (sizeof, 0), "struct.field" (offset, size) or a constant
   "ATTN_NAME" (value, 0). */
typedef struct attn_py_layout_entry {
    const char *name;
    int64_t a, b;
} attn_py_layout_entry;

#define S(T) {#T, (int64_t)sizeof(T), 0}
#define F(T, f) {#T "." #f, (int64_t)offsetof(T, f), (int64_t)sizeof(((T *)0)->f)}
#define K(c) {#c, (int64_t)(c), 0}

static const attn_py_layout_entry attn_py__layout[] = {
    S(attn_device), F(attn_device, kind), F(attn_device, index),

    S(attn_tensor), F(attn_tensor, data), F(attn_tensor, dtype), F(attn_tensor, ndim),
    F(attn_tensor, shape), F(attn_tensor, strides), F(attn_tensor, device),

    S(attn_context_desc), F(attn_context_desc, log), F(attn_context_desc, log_user_data),
    F(attn_context_desc, log_level), F(attn_context_desc, num_threads),
    F(attn_context_desc, loader), F(attn_context_desc, kernel_cache_dir),
    F(attn_context_desc, cuda_library), F(attn_context_desc, nvrtc_library), F(attn_context_desc, cublas_library),

    S(attn_platform), F(attn_platform, kind), F(attn_platform, cpu_cores),
    F(attn_platform, cpu_threads), F(attn_platform, cpu_simd),
    F(attn_platform, cuda_device_count), F(attn_platform, cuda_capability_major),
    F(attn_platform, cuda_capability_minor), F(attn_platform, cuda_multiprocessors),
    F(attn_platform, cuda_shared_per_block),
    F(attn_platform, cuda_device_name), F(attn_platform, cuda_driver_version),
    F(attn_platform, cuda_memory_bytes), F(attn_platform, cuda_reason),
    F(attn_platform, nvrtc_version), F(attn_platform, nvrtc_reason),
    F(attn_platform, cublas_version), F(attn_platform, cublas_reason), F(attn_platform, cuda_tma),
    F(attn_platform, cuda_tma_reason), F(attn_platform, cuda_library), F(attn_platform, nvrtc_library),
    F(attn_platform, cublas_library), F(attn_platform, cpu_simd_reason),

    S(attn_layer_desc), F(attn_layer_desc, num_heads), F(attn_layer_desc, num_kv_heads),
    F(attn_layer_desc, head_size), F(attn_layer_desc, dtype), F(attn_layer_desc, kv_cache_dtype),
    F(attn_layer_desc, block_size), F(attn_layer_desc, scale), F(attn_layer_desc, causal),
    F(attn_layer_desc, sliding_window), F(attn_layer_desc, logits_soft_cap),
    F(attn_layer_desc, alibi_slopes), F(attn_layer_desc, use_mla),
    F(attn_layer_desc, kv_lora_rank), F(attn_layer_desc, qk_rope_head_dim),
    F(attn_layer_desc, qk_nope_head_dim), F(attn_layer_desc, v_head_dim),
    F(attn_layer_desc, device), F(attn_layer_desc, k_scale), F(attn_layer_desc, v_scale),
    F(attn_layer_desc, kv_scale_kind), F(attn_layer_desc, sinks),
    S(attn_kv_scale), F(attn_kv_scale, value), F(attn_kv_scale, ptr), F(attn_kv_scale, device),

    F(attn_backend, name), /* attn_h.py mirrors only this first member (a prefix) */

    S(attn_select_request), F(attn_select_request, backend),
    F(attn_select_request, allow_fallback),

    S(attn_selection), F(attn_selection, env_var), F(attn_selection, env_value),
    F(attn_selection, env_set), F(attn_selection, forced_by_code),
    F(attn_selection, forced_backend), F(attn_selection, default_backend),
    F(attn_selection, requested), F(attn_selection, resolved), F(attn_selection, source),
    F(attn_selection, degraded), F(attn_selection, degradation), F(attn_selection, dtype),
    F(attn_selection, kv_cache_dtype), F(attn_selection, kv_scale_kind), F(attn_selection, block_size),
    F(attn_selection, sliding_window), F(attn_selection, head_size),
    F(attn_selection, num_heads), F(attn_selection, num_kv_heads), F(attn_selection, use_mla),
    F(attn_selection, device), F(attn_selection, device_capability),
    F(attn_selection, platform), F(attn_selection, backend_device),
    F(attn_selection, cuda_graph), F(attn_selection, can_return_lse),
    F(attn_selection, lse_base), F(attn_selection, num_skipped), F(attn_selection, skipped),
    F(attn_selection, skipped[0].backend), F(attn_selection, skipped[0].reason),
    F(attn_selection, skipped[1]), F(attn_selection, log_line), F(attn_selection, kernel_defines),

    S(attn_batch), F(attn_batch, query_start_loc), F(attn_batch, seq_lens),
    F(attn_batch, block_table), F(attn_batch, block_table_stride), F(attn_batch, slot_mapping),
    F(attn_batch, num_reqs), F(attn_batch, num_actual_tokens), F(attn_batch, max_query_len),
    F(attn_batch, max_seq_len), F(attn_batch, causal), F(attn_batch, stream),

    S(attn_metadata_desc), F(attn_metadata_desc, max_num_reqs),
    F(attn_metadata_desc, max_num_tokens), F(attn_metadata_desc, max_blocks_per_req),
    F(attn_metadata_desc, num_blocks), F(attn_metadata_desc, decode_threshold),
    F(attn_metadata_desc, num_kv_splits), F(attn_metadata_desc, workspace_bytes),
    F(attn_metadata_desc, dcp_world_size), F(attn_metadata_desc, dcp_rank), F(attn_metadata_desc, dcp_interleave),
    F(attn_metadata_desc, dcp_comm),

    S(attn_mla_info), F(attn_mla_info, num_decodes), F(attn_mla_info, num_decode_tokens),
    F(attn_mla_info, num_prefills), F(attn_mla_info, num_prefill_tokens),
    F(attn_mla_info, num_kv_splits), F(attn_mla_info, prefill_chunk),

    S(attn_kernel_info), F(attn_kernel_info, kernel), F(attn_kernel_info, arch), F(attn_kernel_info, source),
    F(attn_kernel_info, cubin_bytes), F(attn_kernel_info, registers), F(attn_kernel_info, shared_bytes),
    F(attn_kernel_info, spill_stores), F(attn_kernel_info, spill_loads), F(attn_kernel_info, compile_ms),
    F(attn_kernel_info, log),

    /* enums are C int: attn_h.py passes them as such */
    S(attn_status), S(attn_dtype), S(attn_backend_id),
    K(ATTN_MAX_DIMS), K(ATTN_SELECTION_MAX_SKIPPED), K(ATTN_OK),
    K(ATTN_ERROR_SHAPE_MISMATCH), K(ATTN_ERROR_INVALID_VALUE), K(ATTN_ERROR_INVALID_METADATA),
    K(ATTN_ERROR_UNKNOWN_BACKEND),
    K(ATTN_DTYPE_AUTO), K(ATTN_DTYPE_F32), K(ATTN_DTYPE_F16), K(ATTN_DTYPE_BF16),
    K(ATTN_DTYPE_FP8_E4M3), K(ATTN_DTYPE_FP8_E5M2), K(ATTN_DTYPE_INT8), K(ATTN_DTYPE_INT64), K(ATTN_DTYPE_INT32),
    K(ATTN_DTYPE_FP8_DS_MLA),
    K(ATTN_KV_SCALE_PER_TENSOR), K(ATTN_KV_SCALE_PER_TOKEN_HEAD),
    K(ATTN_DEVICE_CPU), K(ATTN_DEVICE_CUDA), K(ATTN_PLATFORM_CPU), K(ATTN_PLATFORM_CUDA),
    K(ATTN_CAUSAL_DEFAULT), K(ATTN_CAUSAL_YES), K(ATTN_CAUSAL_NO),
    K(ATTN_LOG_LEVEL_DEFAULT), K(ATTN_LOG_LEVEL_ERROR), K(ATTN_LOG_LEVEL_WARN),
    K(ATTN_LOG_LEVEL_INFO), K(ATTN_LOG_LEVEL_DEBUG), K(ATTN_LOG_LEVEL_NONE),
    K(ATTN_BACKEND_AUTO), K(ATTN_LSE_BASE_E), K(ATTN_LSE_BASE_2),
    K(ATTN_SELECTION_AUTO), K(ATTN_SELECTION_CODE), K(ATTN_SELECTION_ENV),
    K(ATTN_CUDA_GRAPH_NEVER), K(ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE),
    K(ATTN_CUDA_GRAPH_UNIFORM_BATCH), K(ATTN_CUDA_GRAPH_ALWAYS),
    K(ATTN_COPY_HOST_TO_DEVICE), K(ATTN_COPY_DEVICE_TO_HOST), K(ATTN_COPY_DEVICE_TO_DEVICE),
    K(ATTN_KERNEL_COMPILED), K(ATTN_KERNEL_FROM_MEMORY), K(ATTN_KERNEL_FROM_DISK),
    K(ATTN_VERSION_MAJOR), K(ATTN_VERSION_MINOR), K(ATTN_VERSION_PATCH),
};

#undef S
#undef F
#undef K

/* attn_layer_forward for attn_h.py's PreparedForward, its arguments in one array, so that a
   call converts one ctypes argument instead of nine (~0.5 us less per call): a[0] the layer,
   a[1] the metadata, a[2..7] the attn_tensor structs of q, k, v, kv_cache, out, lse (0:
   none), a[8] the stream, a[9..14] the data pointers written into those structs first. */
int attn_py_layer_forward(const uint64_t *a);
int attn_py_layer_forward(const uint64_t *a) {
    attn_tensor *t[6];
    int i;
    for (i = 0; i < 6; i++) {
        t[i] = (attn_tensor *)(uintptr_t)a[2 + i];
        if (t[i]) t[i]->data = (void *)(uintptr_t)a[9 + i];
    }
    return (int)attn_layer_forward((attn_layer *)(uintptr_t)a[0], (const attn_metadata *)(uintptr_t)a[1], t[0],
                                   t[1], t[2], t[3], t[4], t[5], (void *)(uintptr_t)a[8]);
}

/* The table and its length (not part of attn.h: only this shared build has it). */
const attn_py_layout_entry *attn_py_layout(int *count);
const attn_py_layout_entry *attn_py_layout(int *count) {
    *count = (int)(sizeof attn_py__layout / sizeof attn_py__layout[0]);
    return attn_py__layout;
}
