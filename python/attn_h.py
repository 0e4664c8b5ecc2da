"""attn_h: attn.h from Python, through ctypes (no compiled extension, no CUDA SDK).

The module loads a shared build of attn.h (``make build/libattn.so``) the way the header
loads CUDA: with the dynamic loader, at run time. It takes numpy arrays and PyTorch tensors
(CPU or CUDA) as they are, passing their data pointer, element type, strides and device;
nothing is copied except the small host-side int arrays of a batch. torch is imported only
when a torch tensor is handed in, so the module works with numpy alone.

Usage (a decode and a prefill in one batch over a paged cache)::

    import numpy as np, attn_h

    rng = np.random.default_rng(0)
    with attn_h.Context(log_level="warn") as ctx:
        layer = attn_h.Layer(ctx, num_heads=8, num_kv_heads=2, head_size=64,
                             block_size=16, dtype="float16")
        print(layer.selection["resolved"])               # CPU
        cache = np.zeros(layer.kv_cache_shape(num_blocks=8), np.float16)
        meta = attn_h.Metadata(layer, max_num_reqs=4, max_num_tokens=64,
                               max_blocks_per_req=4, num_blocks=8)
        # request 0 decodes token 40 of 40 (its first 39 are cached in blocks 0-2),
        # request 1 prefills 20 tokens (blocks 4-5); slot = block * 16 + offset
        block_table = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int32)
        slots = [2 * 16 + 7] + [4 * 16 + i for i in range(20)]
        meta.build(query_start_loc=[0, 1, 21], seq_lens=[40, 20],
                   block_table=block_table, slot_mapping=slots)
        k, v = (rng.standard_normal((21, 2, 64)).astype(np.float16) for _ in "kv")
        layer.reshape_and_cache(k, v, cache, slots)      # the new tokens' k/v
        q = rng.standard_normal((21, 8, 64)).astype(np.float16)
        out = layer.forward(meta, q, cache)              # [21, 8, 64], like q

With torch, the same calls take tensors; on a CUDA layer (``device="cuda"``) tensors live
on the GPU and every call runs on ``torch.cuda.current_stream()`` unless ``stream=`` says
otherwise (an int handle or a ``torch.cuda.Stream``). Batch arrays (query_start_loc,
seq_lens, block_table, slot_mapping) are host arrays, as in attn.h.

Element types: float32, float16, bfloat16 (torch; numpy has none, but ml_dtypes' bfloat16
numpy arrays work), int32/int64 where the API wants ints. Every failure of the library
raises AttnError (a RuntimeError) with the status name and the context's last error,
which names the argument; so does input this module can tell is wrong before the call. A
tensor of the wrong element type raises AttnDtypeError (an AttnError and a TypeError; its
item is 'ATTN_LOG_TENSOR_DTYPE'). The exception is the one report of a failure: nothing is
printed. The library's log lines go to Python's logging, logger 'attn_h' (Context's log=
takes them instead); its ERROR line for a call that raised arrives there at DEBUG.

The library: env ATTN_LIB, else the libattn.so installed beside this module (``pip
install .`` builds it), else build/libattn.so of this repository, else libattn.so on the
loader path. ``attn_h.__version__`` is the header's ATTN_VERSION_STRING; ``python -m attn_h
info`` prints the platform and the selection record of a layer, like attn-info. At import
the ctypes mirrors below are compared with the library's own sizes and offsets
(attn_py_layout in python/attn_shared.c); a difference raises ImportError naming the
struct and field.

Objects: Context -> Layer -> Metadata. Each holds its parent, so a child never outlives
what it points into; close() (or ``with``) frees at once, children first; __del__ is a
best effort.
"""
from __future__ import annotations   # the hints below are strings: no torch import needed

import array
import ctypes as C
import logging
import math
import os
import weakref
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = [
    "AttnError", "AttnDtypeError", "Context", "Layer", "Metadata", "merge_attn_states", "dcp_combine", "dcp_local_tokens",
    "dcp_all_gather_combine",
    "reorder_batch",
    "mla_num_kv_splits", "load_library", "library", "check_layout", "PreparedForward",
    "torch_ops", "op_handle",
]

# ---- attn.h, mirrored (enums are C int; values checked against the library at import) -

ATTN_MAX_DIMS = 6
ATTN_SELECTION_MAX_SKIPPED = 8
ATTN_OK = 0
ATTN_ERROR_INVALID_VALUE = 2
ATTN_ERROR_SHAPE_MISMATCH = 3
ATTN_ERROR_INVALID_METADATA = 4
ATTN_ERROR_UNKNOWN_BACKEND = 7
ATTN_DTYPE_AUTO, ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16 = 0, 1, 2, 3
ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2, ATTN_DTYPE_INT8 = 4, 5, 6     # KV caches only
ATTN_DTYPE_INT64 = 7                                                      # slot mappings only
ATTN_DTYPE_INT32 = 8                                                      # sparse MLA's top-k indices
ATTN_DTYPE_FP8_DS_MLA = 9     # DeepSeek-V3.2's 656-byte latent rows (uint8 caches), MLA 512 + 64 only
ATTN_KV_SCALE_PER_TENSOR, ATTN_KV_SCALE_PER_TOKEN_HEAD = 0, 1
ATTN_DEVICE_CPU, ATTN_DEVICE_CUDA = 0, 1
ATTN_PLATFORM_CPU, ATTN_PLATFORM_CUDA = 0, 1
ATTN_CAUSAL_DEFAULT, ATTN_CAUSAL_YES, ATTN_CAUSAL_NO = 0, 1, 2
(ATTN_LOG_LEVEL_DEFAULT, ATTN_LOG_LEVEL_ERROR, ATTN_LOG_LEVEL_WARN, ATTN_LOG_LEVEL_INFO,
 ATTN_LOG_LEVEL_DEBUG, ATTN_LOG_LEVEL_NONE) = range(6)
ATTN_BACKEND_AUTO = 0
ATTN_LSE_BASE_E, ATTN_LSE_BASE_2 = 0, 1
ATTN_SELECTION_AUTO, ATTN_SELECTION_CODE, ATTN_SELECTION_ENV = 0, 1, 2
(ATTN_CUDA_GRAPH_NEVER, ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE,
 ATTN_CUDA_GRAPH_UNIFORM_BATCH, ATTN_CUDA_GRAPH_ALWAYS) = range(4)
ATTN_COPY_HOST_TO_DEVICE, ATTN_COPY_DEVICE_TO_HOST, ATTN_COPY_DEVICE_TO_DEVICE = 1, 2, 3
ATTN_KERNEL_COMPILED, ATTN_KERNEL_FROM_MEMORY, ATTN_KERNEL_FROM_DISK = 1, 2, 3

_CONSTANTS = [name for name in dir() if name.startswith("ATTN_")]

# Type hints: an array argument is a numpy array (host) or a torch tensor (host or CUDA);
# a stream an int CUstream, a torch.cuda.Stream, or None (torch's current stream of the
# call's CUDA tensors, else the legacy default stream).
Array = Any          # numpy.ndarray | torch.Tensor
Stream = Any         # int | torch.cuda.Stream | None
VERSION = None    # the library's "major.minor.patch", set at load

ATTN_LOG_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_int, C.c_int, C.c_char_p)


class attn_device(C.Structure):
    _fields_ = [("kind", C.c_int), ("index", C.c_int)]


class attn_tensor(C.Structure):
    _fields_ = [
        ("data", C.c_void_p),
        ("dtype", C.c_int),
        ("ndim", C.c_int),
        ("shape", C.c_int64 * ATTN_MAX_DIMS),
        ("strides", C.c_int64 * ATTN_MAX_DIMS),   # elements; all zero: contiguous
        ("device", attn_device),
    ]


class attn_context_desc(C.Structure):
    _fields_ = [
        ("log", ATTN_LOG_FN),                     # NULL: stderr
        ("log_user_data", C.c_void_p),
        ("log_level", C.c_int),
        ("num_threads", C.c_int),
        ("loader", C.c_void_p),                   # const attn_loader *: NULL = dlopen
        ("kernel_cache_dir", C.c_char_p),
        ("cuda_library", C.c_char_p),             # NULL: env ATTN_CUDA_LIBRARY, else the default
        ("nvrtc_library", C.c_char_p),            # NULL: env ATTN_NVRTC_LIBRARY, ...
        ("cublas_library", C.c_char_p),           # NULL: env ATTN_CUBLAS_LIBRARY, ...
    ]


class attn_platform(C.Structure):
    _fields_ = [
        ("kind", C.c_int),
        ("cpu_cores", C.c_int),
        ("cpu_threads", C.c_int),
        ("cpu_simd", C.c_char * 32),
        ("cuda_device_count", C.c_int),
        ("cuda_capability_major", C.c_int),
        ("cuda_capability_minor", C.c_int),
        ("cuda_multiprocessors", C.c_int),
        ("cuda_shared_per_block", C.c_int),
        ("cuda_device_name", C.c_char * 96),
        ("cuda_driver_version", C.c_int),
        ("cuda_memory_bytes", C.c_uint64),
        ("cuda_reason", C.c_char * 160),
        ("nvrtc_version", C.c_int),
        ("nvrtc_reason", C.c_char * 160),
        ("cublas_version", C.c_int),
        ("cublas_reason", C.c_char * 160),
        ("cuda_tma", C.c_int),
        ("cuda_tma_reason", C.c_char * 96),
        ("cuda_library", C.c_char * 256),         # the file each library was opened as
        ("nvrtc_library", C.c_char * 256),
        ("cublas_library", C.c_char * 256),
        ("cpu_simd_reason", C.c_char * 192),     # why cpu_simd (CPU features, ATTN_CPU_SIMD)
    ]


class attn_kv_scale(C.Structure):
    _fields_ = [("value", C.c_float), ("ptr", C.POINTER(C.c_float)), ("device", C.c_int)]


class attn_layer_desc(C.Structure):
    _fields_ = [
        ("num_heads", C.c_int),
        ("num_kv_heads", C.c_int),
        ("head_size", C.c_int),
        ("dtype", C.c_int),
        ("kv_cache_dtype", C.c_int),
        ("block_size", C.c_int),
        ("scale", C.c_float),
        ("causal", C.c_int),
        ("sliding_window", C.c_int),
        ("logits_soft_cap", C.c_float),
        ("alibi_slopes", C.POINTER(C.c_float)),
        ("use_mla", C.c_int),
        ("kv_lora_rank", C.c_int),
        ("qk_rope_head_dim", C.c_int),
        ("qk_nope_head_dim", C.c_int),
        ("v_head_dim", C.c_int),
        ("device", C.c_int),
        ("k_scale", attn_kv_scale),               # fp8 caches: per-tensor scales
        ("v_scale", attn_kv_scale),
        ("kv_scale_kind", C.c_int),               # PER_TENSOR or PER_TOKEN_HEAD (in the cache)
        ("sinks", C.POINTER(C.c_float)),          # attention sinks: num_heads logits, read every call
    ]


class attn_select_request(C.Structure):
    _fields_ = [("backend", C.c_int), ("allow_fallback", C.c_int)]


class attn_selection_skipped(C.Structure):
    _fields_ = [("backend", C.c_int), ("reason", C.c_char * 320)]


class attn_selection(C.Structure):
    _fields_ = [
        ("env_var", C.c_char * 16),
        ("env_value", C.c_char * 64),
        ("env_set", C.c_int),
        ("forced_by_code", C.c_int),
        ("forced_backend", C.c_int),
        ("default_backend", C.c_int),
        ("requested", C.c_int),
        ("resolved", C.c_int),
        ("source", C.c_int),
        ("degraded", C.c_int),
        ("degradation", C.c_char * 320),
        ("dtype", C.c_int),
        ("kv_cache_dtype", C.c_int),
        ("kv_scale_kind", C.c_int),
        ("block_size", C.c_int),
        ("sliding_window", C.c_int),
        ("head_size", C.c_int),
        ("num_heads", C.c_int),
        ("num_kv_heads", C.c_int),
        ("use_mla", C.c_int),
        ("device", C.c_int),
        ("device_capability", C.c_int),
        ("platform", C.c_int),
        ("backend_device", C.c_int),
        ("cuda_graph", C.c_int),
        ("can_return_lse", C.c_int),
        ("lse_base", C.c_int),
        ("num_skipped", C.c_int),
        ("skipped", attn_selection_skipped * ATTN_SELECTION_MAX_SKIPPED),
        ("log_line", C.c_char * 1024),
        ("kernel_defines", C.c_char * 256),      # a layer's record: ATTN_KERNEL_DEFINES it was compiled with
    ]


class attn_batch(C.Structure):
    _fields_ = [
        ("query_start_loc", C.POINTER(C.c_int32)),
        ("seq_lens", C.POINTER(C.c_int32)),
        ("block_table", C.POINTER(C.c_int32)),
        ("block_table_stride", C.c_int),
        ("slot_mapping", C.POINTER(C.c_int64)),
        ("num_reqs", C.c_int),
        ("num_actual_tokens", C.c_int),
        ("max_query_len", C.c_int),
        ("max_seq_len", C.c_int),
        ("causal", C.c_int),
        ("stream", C.c_void_p),
    ]


class attn_metadata_desc(C.Structure):
    _fields_ = [
        ("max_num_reqs", C.c_int),
        ("max_num_tokens", C.c_int),
        ("max_blocks_per_req", C.c_int),
        ("num_blocks", C.c_int64),
        ("decode_threshold", C.c_int),            # MLA only
        ("num_kv_splits", C.c_int),               # MLA only
        ("workspace_bytes", C.c_int64),           # MLA only
        ("dcp_world_size", C.c_int),              # decode context parallelism: 0/1 off
        ("dcp_rank", C.c_int),
        ("dcp_interleave", C.c_int),              # 0: 1
        ("dcp_comm", C.c_void_p),                 # attn_communicator * (C callers; None here)
    ]


class attn_mla_info(C.Structure):
    _fields_ = [
        ("num_decodes", C.c_int),
        ("num_decode_tokens", C.c_int),
        ("num_prefills", C.c_int),
        ("num_prefill_tokens", C.c_int),
        ("num_kv_splits", C.c_int),
        ("prefill_chunk", C.c_int),
    ]


class attn_kernel_info(C.Structure):
    _fields_ = [
        ("kernel", C.c_char * 64),
        ("arch", C.c_char * 16),
        ("source", C.c_int),
        ("cubin_bytes", C.c_size_t),
        ("registers", C.c_int),
        ("shared_bytes", C.c_int),
        ("spill_stores", C.c_int),
        ("spill_loads", C.c_int),
        ("compile_ms", C.c_double),
        ("log", C.c_char * 1024),
    ]


class attn_backend(C.Structure):
    """The first member of attn.h's attn_backend (a prefix: read through attn_backend_get's
    pointer, never allocated here)."""
    _fields_ = [("name", C.c_char_p)]


class attn_py_layout_entry(C.Structure):
    _fields_ = [("name", C.c_char_p), ("a", C.c_int64), ("b", C.c_int64)]


# The structs whose layout the library reports (enums: the size of a C int).
_MIRRORS = {cls.__name__: cls for cls in (
    attn_device, attn_tensor, attn_context_desc, attn_platform, attn_layer_desc, attn_kv_scale,
    attn_select_request, attn_selection, attn_batch, attn_metadata_desc, attn_mla_info, attn_kernel_info,
    attn_backend)}
_PREFIXES = ("attn_backend",)   # mirrors of a struct's leading members only: no size to compare
_ENUMS = ("attn_status", "attn_dtype", "attn_backend_id")

# ---- the library ---------------------------------------------------------------------

_P = C.POINTER
_vp = C.c_void_p
_TP = _P(attn_tensor)
_SIGNATURES = {
    "attn_status_string": (C.c_char_p, [C.c_int]),
    "attn_log_item_name": (C.c_char_p, [C.c_int]),
    "attn_dtype_name": (C.c_char_p, [C.c_int]),
    "attn_backend_name": (C.c_char_p, [C.c_int]),
    "attn_backend_from_name": (C.c_int, [C.c_char_p, _P(C.c_int)]),
    "attn_backend_get": (_P(attn_backend), [C.c_int]),
    "attn_dtype_from_name": (C.c_int, [C.c_char_p, _P(C.c_int)]),
    "attn_context_create": (C.c_int, [_P(attn_context_desc), _P(_vp)]),
    "attn_context_destroy": (None, [_vp]),
    "attn_context_last_error": (C.c_char_p, [_vp]),
    "attn_context_set_log_level": (C.c_int, [_vp, C.c_int]),
    "attn_platform_get": (C.c_int, [_vp, _P(attn_platform)]),
    "attn_platform_format": (C.c_size_t, [_P(attn_platform), C.c_char_p, C.c_size_t]),
    "attn_selection_format": (C.c_size_t, [_P(attn_selection), C.c_char_p, C.c_size_t]),
    "attn_selection_cache_clear": (C.c_int, [_vp]),
    "attn_layer_create": (C.c_int, [_vp, _P(attn_layer_desc), _P(attn_select_request),
                                    _P(_vp)]),
    "attn_layer_destroy": (None, [_vp]),
    "attn_layer_selection": (_P(attn_selection), [_vp]),
    "attn_layer_get_desc": (_P(attn_layer_desc), [_vp]),
    "attn_layer_kv_cache_shape": (C.c_int, [_vp, C.c_int64, _P(C.c_int64), _P(C.c_int)]),
    "attn_metadata_create": (C.c_int, [_vp, _P(attn_metadata_desc), _P(_vp)]),
    "attn_metadata_destroy": (None, [_vp]),
    "attn_metadata_capacity": (_P(attn_metadata_desc), [_vp]),
    "attn_metadata_build": (C.c_int, [_vp, C.c_int, _P(attn_batch), C.c_int]),
    "attn_metadata_mla_info": (C.c_int, [_vp, _P(attn_mla_info)]),
    "attn_mla_num_kv_splits": (C.c_int, [C.c_int, C.c_int, C.c_int]),
    "attn_dcp_local_tokens": (C.c_int64, [C.c_int, C.c_int, C.c_int, C.c_int64]),
    "attn_dcp_combine": (C.c_int, [_vp, C.c_int, _P(_TP), _P(_TP), _TP, _TP, _vp]),
    "attn_reorder_batch": (C.c_int, [_P(C.c_int32), C.c_int, C.c_int, _P(C.c_int32),
                                     _P(C.c_int), _P(C.c_int)]),
    "attn_reshape_and_cache": (C.c_int, [_vp, _TP, _TP, _TP, _TP, _vp]),
    "attn_layer_forward": (C.c_int, [_vp, _vp, _TP, _TP, _TP, _TP, _TP, _TP, _vp]),
    "attn_concat_and_cache_mla": (C.c_int, [_vp, _TP, _TP, _TP, _TP, _vp]),
    "attn_mla_forward_mqa": (C.c_int, [_vp, _vp, _TP, _TP, _TP, _TP, _TP, _vp]),
    "attn_mla_forward_sparse": (C.c_int, [_vp, _vp, _TP, _TP, _TP, _TP, _TP, _TP, _vp]),
    "attn_mla_forward_mha": (C.c_int, [_vp, _vp, _TP, _TP, _TP, _TP, _TP, _TP, _vp]),
    "attn_mla_forward": (C.c_int, [_vp, _vp, _TP, _TP, _TP, _TP, _TP, _TP, _TP, _TP, _vp]),
    "attn_merge_attn_states": (C.c_int, [_vp, _TP, _TP, C.c_int, _TP, _TP, C.c_int, _TP,
                                         _TP, C.c_int, _vp]),
    "attn_cuda_malloc": (C.c_int, [_vp, C.c_size_t, _P(_vp)]),
    "attn_cuda_free": (C.c_int, [_vp, _vp]),
    "attn_cuda_memcpy": (C.c_int, [_vp, _vp, _vp, C.c_size_t, C.c_int, _vp]),
    "attn_cuda_synchronize": (C.c_int, [_vp, _vp]),
    "attn_kernel_compile": (C.c_int, [_vp, C.c_char_p, C.c_char_p, C.c_char_p, _P(attn_kernel_info)]),
    "attn_kernel_compile_count": (C.c_int, [_vp]),
    "attn_py_layout": (_P(attn_py_layout_entry), [_P(C.c_int)]),
    "attn_py_layer_forward": (C.c_int, [_P(C.c_uint64)]),
}


def _library_paths():
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("ATTN_LIB"):
        return [os.environ["ATTN_LIB"]]
    paths = [os.path.join(here, "libattn.so")] if os.path.exists(os.path.join(here, "libattn.so")) else []
    return paths + [os.path.join(os.path.dirname(here), "build", "libattn.so"), "libattn.so"]


def _header_version():
    """ATTN_VERSION_STRING of the attn.h installed beside this module (pip install) or of
    this repository's; "unknown" when neither is there."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "attn.h"), os.path.join(os.path.dirname(here), "attn.h")):
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.startswith("#define ATTN_VERSION_STRING "):
                        return line.split('"')[1]
        except OSError:
            continue
    return "unknown"


__version__ = _header_version()


def load_library(path=None):
    """Opens the shared build of attn.h (path, else env ATTN_LIB, else build/libattn.so of
    this repository, else libattn.so on the loader path), declares the signatures and
    checks the mirrors against it. Raises ImportError naming every path tried."""
    tried = []
    for p in ([path] if path else _library_paths()):
        try:
            lib = C.CDLL(p, mode=getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 2))
        except OSError as e:
            tried.append("%s (%s)" % (p, e))
            continue
        missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
        if missing:
            tried.append("%s (lacks %s: not a build of python/attn_shared.c?)"
                         % (p, ", ".join(missing)))
            continue
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        check_layout(lib)
        return lib
    raise ImportError("attn_h: cannot load the attn.h shared library (make build/libattn.so, "
                      "or set ATTN_LIB); tried: " + "; ".join(tried))


def _layout_table(lib):
    n = C.c_int()
    table = lib.attn_py_layout(C.byref(n))
    return [(table[i].name.decode(), table[i].a, table[i].b) for i in range(n.value)]


def _mirror_field(cls, path):
    """(offset, size) of a field path such as 'skipped[0].reason' in a ctypes struct."""
    offset = 0
    for part in path.split("."):
        index = None
        if part.endswith("]"):
            part, index = part[:-1].split("[")
        desc = getattr(cls, part, None)
        if desc is None or not hasattr(desc, "offset"):
            return None
        offset += desc.offset
        ftype = dict(cls._fields_)[part]
        if index is None:
            size = desc.size
            cls = ftype
        else:
            cls = ftype._type_
            size = C.sizeof(cls)
            offset += int(index) * size
    return offset, size


def check_layout(lib):
    """Compares every mirror above with the compiled header; raises ImportError naming the
    first struct, field or constant that differs, or a mirror field the library does not
    report."""
    global VERSION
    seen, version = set(), {}
    for name, a, b in _layout_table(lib):
        if name.startswith("ATTN_VERSION_"):   # reported, not checked: a bump is no ABI change
            version[name] = a
            continue
        if name.startswith("ATTN_"):
            mine = globals().get(name)
            if mine != a:
                raise ImportError("attn_h: constant %s is %d in the library, %r in attn_h.py"
                                  % (name, a, mine))
            continue
        struct, _, field = name.partition(".")
        if struct in _ENUMS:
            if a != C.sizeof(C.c_int):
                raise ImportError("attn_h: enum %s has %d bytes in the library, a C int has %d"
                                  % (struct, a, C.sizeof(C.c_int)))
            continue
        cls = _MIRRORS.get(struct)
        if cls is None:
            raise ImportError("attn_h: the library reports struct %s, which attn_h.py does "
                              "not mirror" % struct)
        if not field:
            if C.sizeof(cls) != a:
                raise ImportError("attn_h: struct %s is %d bytes in the library, %d in the "
                                  "attn_h.py mirror" % (struct, a, C.sizeof(cls)))
            continue
        got = _mirror_field(cls, field)
        if got is None:
            raise ImportError("attn_h: %s.%s is in the library but not in the attn_h.py mirror"
                              % (struct, field))
        if got != (a, b):
            raise ImportError("attn_h: %s.%s is at offset %d, %d bytes, in the library; at "
                              "offset %d, %d bytes in the attn_h.py mirror"
                              % (struct, field, a, b, got[0], got[1]))
        seen.add((struct, field.split(".")[0].split("[")[0]))
    for struct, cls in _MIRRORS.items():
        for fname, _ in cls._fields_:
            if (struct, fname) not in seen:
                raise ImportError("attn_h: the attn_h.py mirror has %s.%s, which the library "
                                  "does not report" % (struct, fname))
    missing = [n for n in _CONSTANTS if n not in {e[0] for e in _layout_table(lib)}]
    if missing:
        raise ImportError("attn_h: the library does not report constants %s" % ", ".join(missing))
    VERSION = "%d.%d.%d" % tuple(version.get("ATTN_VERSION_" + part, -1)
                                 for part in ("MAJOR", "MINOR", "PATCH"))


_lib = None


def library():
    """The loaded ctypes library (opened on first use)."""
    global _lib
    if _lib is None:
        _lib = load_library()
    return _lib


# ---- errors and the log hook ------------------------------------------------------------

class AttnError(RuntimeError):
    """A call failed: status (e.g. 'ATTN_ERROR_SHAPE_MISMATCH'), code (its number), message
    (the context's last error, which names the argument and what is allowed) and item (the
    log item the library logged the failure under, e.g. 'ATTN_LOG_TENSOR_SHAPE'; None for
    this module's own checks that have none). The exception is the failure's one report:
    the library's ERROR line for it is not printed (see Context's log)."""

    kind = None   # a subclass's words for what went wrong, ahead of the status in str()

    def __init__(self, status, code, message, item=None):
        super().__init__("%s: %s" % (status if self.kind is None else "%s (%s)" % (self.kind, status),
                                     message))
        self.status, self.code, self.message, self.item = status, code, message, item


class AttnDtypeError(AttnError, TypeError):
    """A tensor's element type is not the one the call allows (item 'ATTN_LOG_TENSOR_DTYPE').
    attn.h returns ATTN_ERROR_SHAPE_MISMATCH for it (that status covers a tensor's dtype,
    shape, strides and device alike), which status and code keep; the class, a TypeError
    too, and the text, 'dtype mismatch (ATTN_ERROR_SHAPE_MISMATCH): ...', tell it apart."""

    kind = "dtype mismatch"


_ITEM_DTYPE = "ATTN_LOG_TENSOR_DTYPE"
_ERROR_CLASSES = {_ITEM_DTYPE: AttnDtypeError}   # log item -> the AttnError subclass raised


def _status_name(code):
    return library().attn_status_string(code).decode()


def _error(code, message, item=None):
    return _ERROR_CLASSES.get(item, AttnError)(_status_name(code), code, message, item)


def _fail(code, message, item=None):
    raise _error(code, message, item)


_LOGGER = logging.getLogger("attn_h")
_PY_LEVELS = {ATTN_LOG_LEVEL_ERROR: logging.ERROR, ATTN_LOG_LEVEL_WARN: logging.WARNING,
              ATTN_LOG_LEVEL_INFO: logging.INFO, ATTN_LOG_LEVEL_DEBUG: logging.DEBUG}


class _LogRoute:
    """Where a context's log lines go: the user's log callable, else the logger 'attn_h' of
    Python's logging (extra attn_item: the item's name). ERROR lines are also kept (pending)
    until the call that logged them returns: a failing call raises its line as the AttnError
    (whose class its item chooses) and logging gets it at DEBUG only; an ERROR line of a
    call that then succeeded goes to logging at ERROR. quiet (log_level 'none'): the library
    still reports ERROR lines, for their items, but nothing is passed on."""

    def __init__(self, user, quiet):
        self.user, self.quiet, self.pending = user, quiet, []

    def line(self, level, item, text):
        if level == ATTN_LOG_LEVEL_ERROR:
            self.pending.append((item, text))
        if self.quiet:
            return
        if self.user is not None:
            self.user(_LEVEL_NAMES.get(level, str(level)), item, text)
        elif level != ATTN_LOG_LEVEL_ERROR:
            pylevel = _PY_LEVELS.get(level, logging.DEBUG)
            if _LOGGER.isEnabledFor(pylevel):
                _LOGGER.log(pylevel, "%s", text, extra={"attn_item": item})

    def flush(self, raised=""):
        """Passes on the pending ERROR lines; the one that starts `raised` (the line of the
        error being raised) at DEBUG. Returns the item of that one (else of the last)."""
        pending, self.pending = self.pending, []
        item = pending[-1][0] if raised and pending else None
        for name, text in pending:
            is_raised = bool(raised) and raised.startswith(text)
            if is_raised:
                item = name
            if not self.quiet and self.user is None:
                pylevel = logging.DEBUG if is_raised else logging.ERROR
                if _LOGGER.isEnabledFor(pylevel):
                    _LOGGER.log(pylevel, "%s", text, extra={"attn_item": name})
        return item


def _check(code, ctx_ptr=None, route=None):
    """Raises the AttnError of a failed call (code != ATTN_OK): the context's last error
    (ctx_ptr None: the thread's), classed by the item its ERROR line had (route: the
    context's _LogRoute, which that line reached)."""
    if code != ATTN_OK:
        msg = _text(library().attn_context_last_error(ctx_ptr) or b"")
        item = route.flush("%s: %s" % (_status_name(code), msg)) if route is not None else None
        raise _error(code, msg, item)
    if route is not None and route.pending:
        route.flush()


# ---- names <-> enums -------------------------------------------------------------------

_DTYPE_BY_NAME = {
    "f32": ATTN_DTYPE_F32, "float32": ATTN_DTYPE_F32, "float": ATTN_DTYPE_F32,
    "fp32": ATTN_DTYPE_F32,
    "f16": ATTN_DTYPE_F16, "float16": ATTN_DTYPE_F16, "half": ATTN_DTYPE_F16,
    "fp16": ATTN_DTYPE_F16,
    "bf16": ATTN_DTYPE_BF16, "bfloat16": ATTN_DTYPE_BF16,
    "fp8": ATTN_DTYPE_FP8_E4M3, "fp8_e4m3": ATTN_DTYPE_FP8_E4M3,
    "float8_e4m3fn": ATTN_DTYPE_FP8_E4M3, "fp8_e5m2": ATTN_DTYPE_FP8_E5M2,
    "float8_e5m2": ATTN_DTYPE_FP8_E5M2, "int8": ATTN_DTYPE_INT8,
    "fp8_ds_mla": ATTN_DTYPE_FP8_DS_MLA,
}
_LEVEL_BY_NAME = {"default": 0, "error": 1, "warn": 2, "warning": 2, "info": 3,
                  "debug": 4, "none": 5, "off": 5}
_LEVEL_NAMES = {v: k for k, v in _LEVEL_BY_NAME.items() if k not in ("warning", "off")}
_DEVICE_NAMES = {ATTN_DEVICE_CPU: "cpu", ATTN_DEVICE_CUDA: "cuda"}
_PLATFORM_NAMES = {ATTN_PLATFORM_CPU: "cpu", ATTN_PLATFORM_CUDA: "cuda"}
_SOURCE_NAMES = {ATTN_SELECTION_AUTO: "auto", ATTN_SELECTION_CODE: "code",
                 ATTN_SELECTION_ENV: "env"}
_GRAPH_NAMES = {ATTN_CUDA_GRAPH_NEVER: "never",
                ATTN_CUDA_GRAPH_UNIFORM_SINGLE_TOKEN_DECODE: "uniform_single_token_decode",
                ATTN_CUDA_GRAPH_UNIFORM_BATCH: "uniform_batch",
                ATTN_CUDA_GRAPH_ALWAYS: "always"}
_BASE_BY_NAME = {"e": ATTN_LSE_BASE_E, "2": ATTN_LSE_BASE_2, 2: ATTN_LSE_BASE_2}


def _dtype(value, what, auto=False):
    """An attn_dtype from a name ('f16', 'bfloat16'; case-insensitive, attn_dtype_from_name's
    names and a few more), a numpy or torch dtype, or None; auto: also 'auto' (= None: the
    layer's dtype), as attn-info's --kv-cache-dtype takes it."""
    if value is None:
        return ATTN_DTYPE_AUTO
    name = str(getattr(value, "name", None) or value).lower()
    name = name.replace("torch.", "").replace("numpy.", "")
    if name.startswith("<class"):                      # np.float16 and friends
        name = np.dtype(value).name
    if auto and name == "auto":
        return ATTN_DTYPE_AUTO
    if name in _DTYPE_BY_NAME:
        return _DTYPE_BY_NAME[name]
    _fail(ATTN_ERROR_INVALID_VALUE, "%s is %r (allowed: %sfloat32 (f32, fp32, float), float16 "
          "(f16, fp16, half), bfloat16 (bf16); for KV caches also fp8 = fp8_e4m3 "
          "(float8_e4m3fn), fp8_e5m2 (float8_e5m2), int8, and for MLA latents fp8_ds_mla)"
          % (what, value, "auto or None (the layer's dtype), " if auto else ""))


def _backend_id(name):
    """The backend id of a name (case-insensitive: a registered backend's own name or its
    slot's, as attn_backend_from_name matches them), found here: attn_backend_from_name has
    no context, so its refusal would print to stderr besides the AttnError."""
    lib = library()
    ids, names = {}, []
    for bid in range(1, 64):
        b = lib.attn_backend_get(bid)
        if not b:
            continue
        for n in (b.contents.name, lib.attn_backend_name(bid)):
            if n and n.decode().lower() not in ids:
                ids[n.decode().lower()] = bid
        names.append(b.contents.name.decode())
    bid = ids.get(str(name).lower())
    if bid is None:
        _fail(ATTN_ERROR_UNKNOWN_BACKEND, "Layer: backend %r names no registered backend (allowed, "
              "case-insensitive: %s, or None for the automatic choice / env ATTN_BACKEND)"
              % (name, ", ".join(names)))
    return bid


def _dtype_name(code):
    return library().attn_dtype_name(code).decode()


def _backend_name(code):
    return library().attn_backend_name(code).decode()


def _level(value):
    if value is None:
        return ATTN_LOG_LEVEL_DEFAULT
    if isinstance(value, str) and value.lower() in _LEVEL_BY_NAME:
        return _LEVEL_BY_NAME[value.lower()]
    if isinstance(value, int) and 0 <= value <= ATTN_LOG_LEVEL_NONE:
        return value
    _fail(ATTN_ERROR_INVALID_VALUE, "log_level is %r (allowed: error, warn, info, debug, "
          "none, or None for env ATTN_LOG_LEVEL)" % (value,))


def _levels(value):
    """(the threshold attn.h gets, quiet) for a log_level: 'none' (given, or env
    ATTN_LOG_LEVEL=none / off under None) reaches the library as 'error' with quiet set, so
    that a failure's item still reaches the hook (it picks the AttnError's class)."""
    level = _level(value)
    if level == ATTN_LOG_LEVEL_DEFAULT:
        env = os.environ.get("ATTN_LOG_LEVEL") or ""
        if env.lower() not in ("none", "off"):
            return level, False          # the library reads env ATTN_LOG_LEVEL (and names a bad one)
        level = ATTN_LOG_LEVEL_NONE
    if level == ATTN_LOG_LEVEL_NONE:
        return ATTN_LOG_LEVEL_ERROR, True
    return level, False


def _causal(value, what):
    if value is None:
        return ATTN_CAUSAL_DEFAULT
    if value is True or value is False:
        return ATTN_CAUSAL_YES if value else ATTN_CAUSAL_NO
    _fail(ATTN_ERROR_INVALID_VALUE, "%s is %r (allowed: True, False, None)" % (what, value))


def _base(value, what):
    if value in _BASE_BY_NAME:
        return _BASE_BY_NAME[value]
    _fail(ATTN_ERROR_INVALID_VALUE, "%s is %r (allowed: 'e', 2)" % (what, value))


def _text(raw):
    return raw.decode(errors="replace")


# ---- tensors ---------------------------------------------------------------------------

_TORCH_DTYPES = {"torch.int64": ATTN_DTYPE_INT64, "torch.int32": ATTN_DTYPE_INT32, "torch.float32": ATTN_DTYPE_F32, "torch.float16": ATTN_DTYPE_F16,
                 "torch.bfloat16": ATTN_DTYPE_BF16, "torch.float8_e4m3fn": ATTN_DTYPE_FP8_E4M3,
                 "torch.float8_e5m2": ATTN_DTYPE_FP8_E5M2, "torch.int8": ATTN_DTYPE_INT8}
_TORCH_DTYPE_CODES = {}   # torch.dtype -> code (None: not an element type attn.h takes)
_DEVICE_STRUCTS = {}      # CUDA device index -> attn_device
_CPU_DEVICE = attn_device(ATTN_DEVICE_CPU, 0)
_NUMPY_DTYPES = {"float32": ATTN_DTYPE_F32, "float16": ATTN_DTYPE_F16,
                 "bfloat16": ATTN_DTYPE_BF16, "float8_e4m3fn": ATTN_DTYPE_FP8_E4M3,
                 "float8_e5m2": ATTN_DTYPE_FP8_E5M2, "int8": ATTN_DTYPE_INT8, "int64": ATTN_DTYPE_INT64,
                 "int32": ATTN_DTYPE_INT32}
# (bfloat16 and the float8 types: ml_dtypes' numpy types; int8: KV caches only; uint8:
# the bytes of an 8-bit cache, taken as the layer's kv_cache_dtype)
_CACHE_ONLY = (ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2, ATTN_DTYPE_INT8, ATTN_DTYPE_FP8_DS_MLA)


_TORCH_TYPES = set()   # the tensor types seen (torch.Tensor, Parameter, subclasses): one set look-up


def _is_torch(x):
    t = type(x)
    if t in _TORCH_TYPES:
        return True
    if t.__module__.startswith("torch") and hasattr(x, "data_ptr"):
        _TORCH_TYPES.add(t)
        return True
    return False


def _host_writable(ptr, nbytes):
    """Whether the host memory [ptr, ptr + nbytes) is mapped writable (Linux: the process's
    own map; elsewhere assumed). A torch tensor carries no read-only flag, but a view of a
    read-only mapping (torch.from_numpy of a mode='r' memmap) would crash the interpreter
    at the first write."""
    if nbytes <= 0:
        return True
    end = ptr + nbytes
    for lo, hi in _WRITABLE:   # mappings seen writable (reading the map costs ~1 ms with torch loaded)
        if lo <= ptr and end <= hi:
            return True
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return True
    start = ptr
    for line in lines:
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= ptr < hi:
            if "w" not in fields[1]:
                return False
            if end <= hi:
                if lo <= start:   # one mapping holds it all: remember that mapping
                    if len(_WRITABLE) >= 64:
                        del _WRITABLE[0]
                    _WRITABLE.append((lo, hi))
                return True
            ptr = hi
    return False   # [ptr, end) runs into unmapped memory


_WRITABLE = []   # (lo, hi) of writable mappings _host_writable found (most recent last, at most 64)


def _tensor(x, name, fn, write=False, cache_dtype=None):
    """attn_tensor view of a numpy array or torch tensor (None stays None). write: the call
    writes x (it must be writeable memory); cache_dtype: x is a KV cache of that type, so
    a uint8 array holding an 8-bit cache's bytes is taken as that type."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        if write and not x.flags.writeable:
            _fail(ATTN_ERROR_INVALID_VALUE, "%s: %s is read-only (numpy's writeable flag is False, "
                  "e.g. a np.memmap opened with mode='r'; allowed: a writeable array: this call "
                  "writes %s)" % (fn, name, name))
        dtype = _NUMPY_DTYPES.get(x.dtype.name)
        type_name, ptr, itemsize = x.dtype.name, x.ctypes.data, x.itemsize
        for i, s in enumerate(x.strides):
            if s % itemsize:
                _fail(ATTN_ERROR_SHAPE_MISMATCH, "%s: %s.strides[%d] is %d bytes, not a "
                      "multiple of the element size %d" % (fn, name, i, s, itemsize))
        shape, strides = x.shape, [s // itemsize for s in x.strides]
        device = attn_device(ATTN_DEVICE_CPU, 0)
    elif _is_torch(x):
        # per call on every forward: lookups keyed by torch's own objects (no str())
        tdt = x.dtype
        dtype = _TORCH_DTYPE_CODES.get(tdt)
        if dtype is None:
            dtype = _TORCH_DTYPE_CODES[tdt] = _TORCH_DTYPES.get(str(tdt))
        type_name, ptr = tdt, x.data_ptr()
        shape, strides = x.shape, x.stride()
        if x.is_cuda:
            index = x.get_device()
            device = _DEVICE_STRUCTS.get(index)
            if device is None:
                device = _DEVICE_STRUCTS[index] = attn_device(ATTN_DEVICE_CUDA, index)
        elif x.is_cpu:
            device = _CPU_DEVICE
            if write and not _host_writable(ptr, x.numel() * x.element_size() if x.is_contiguous() else (
                    max((n - 1) * abs(st) for n, st in zip(shape, strides)) + 1 if x.numel() else 0)
                    * x.element_size()):
                _fail(ATTN_ERROR_INVALID_VALUE, "%s: %s is a view of read-only memory (allowed: a "
                      "tensor in writeable memory: this call writes %s)" % (fn, name, name))
        else:
            _fail(ATTN_ERROR_SHAPE_MISMATCH, "%s: %s is on device %s (allowed: cpu, cuda)"
                  % (fn, name, x.device))
    else:
        raise TypeError("%s: %s is a %s (allowed: a numpy array or a torch tensor)"
                        % (fn, name, type(x).__name__))
    if dtype is None and cache_dtype in _CACHE_ONLY and str(type_name) in ("uint8", "torch.uint8"):
        dtype = cache_dtype   # the bytes of an 8-bit cache, without ml_dtypes / a float8 dtype
    if dtype is None:
        _fail(ATTN_ERROR_SHAPE_MISMATCH, "%s: %s has element type %s (allowed: float32, "
              "float16, bfloat16; KV caches also float8_e4m3fn, float8_e5m2, int8, or uint8 "
              "holding the bytes of the layer's 8-bit cache type)" % (fn, name, type_name), _ITEM_DTYPE)
    if len(shape) > ATTN_MAX_DIMS:
        _fail(ATTN_ERROR_SHAPE_MISMATCH, "%s: %s has %d dimensions (allowed: at most %d)"
              % (fn, name, len(shape), ATTN_MAX_DIMS))
    if len(shape) and not any(strides) and int(np.prod(shape)) > 1:
        # attn.h reads all-zero strides as "contiguous": a broadcast view would be misread.
        _fail(ATTN_ERROR_SHAPE_MISMATCH, "%s: %s has all strides 0 (a broadcast view; attn.h "
              "reads that as contiguous): pass a contiguous copy" % (fn, name))
    t = attn_tensor()
    nd = len(shape)
    t.data, t.dtype, t.ndim, t.device = ptr, dtype, nd, device
    if nd:
        t.shape[:nd] = shape
        t.strides[:nd] = strides
    return t


def _ref(t):
    return C.byref(t) if t is not None else None


def _need(x, cls, name, fn):
    """x itself when it is a cls (e.g. the Metadata a call needs), else TypeError naming it."""
    if not isinstance(x, cls):
        raise TypeError("%s: %s is a %s (allowed: an attn_h.%s)"
                        % (fn, name, type(x).__name__, cls.__name__))
    return x


def _shape_of(x, name, fn):
    """The shape of an array argument (TypeError naming it for anything else)."""
    if not (isinstance(x, np.ndarray) or _is_torch(x)):
        raise TypeError("%s: %s is a %s (allowed: a numpy array or a torch tensor)"
                        % (fn, name, type(x).__name__))
    return tuple(x.shape)


def _host_ints(x, name, fn, ctype):
    """A C-contiguous host numpy array of int32/int64 from ints in a numpy array, a torch
    tensor (copied to the host when on a GPU) or a sequence."""
    want = np.int32 if ctype is C.c_int32 else np.int64
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.size and a.dtype.kind not in "iu":
        _fail(ATTN_ERROR_INVALID_VALUE, "%s: %s has element type %s (allowed: integers)"
              % (fn, name, a.dtype))
    if a.size and a.dtype != want:
        info = np.iinfo(want)
        if a.min() < info.min or a.max() > info.max:
            _fail(ATTN_ERROR_INVALID_VALUE, "%s: %s holds %d..%d, outside %s"
                  % (fn, name, a.min(), a.max(), np.dtype(want).name))
    return np.ascontiguousarray(a, dtype=want)


def _slots(x, fn):
    """A cache write's slot mapping as (what keeps its memory alive, attn_tensor): an int64
    CUDA tensor as it is (contiguous, one dimension); anything else through _host_ints."""
    if _is_torch(x) and x.device.type == "cuda":
        if str(x.dtype) != "torch.int64" or x.dim() != 1 or not x.is_contiguous():
            _fail(ATTN_ERROR_SHAPE_MISMATCH, "%s: slot_mapping is a CUDA tensor of %s, shape %s "
                  "(allowed on the device: a contiguous one-dimensional torch.int64 tensor; or "
                  "host ints)" % (fn, x.dtype, tuple(x.shape)))
        return x, _tensor(x, "slot_mapping", fn)
    a = _host_ints(x, "slot_mapping", fn, C.c_int64).reshape(-1)
    return a, _tensor(a, "slot_mapping", fn)


def _ptr(a, ctype):
    return a.ctypes.data_as(C.POINTER(ctype))


def _stream(stream, *tensors):
    """The CUDA stream handle for a call: the one given (an int or a torch.cuda.Stream),
    else torch's current stream of the first CUDA tensor's device, else NULL."""
    if stream is not None:
        return getattr(stream, "cuda_stream", stream)
    for x in tensors:
        if x is not None and _is_torch(x) and x.is_cuda:
            return _current_raw_stream()(x.get_device())
    return None


_RAW_STREAM = []   # torch's current raw stream of a device index (an int), found once


def _current_raw_stream():
    """torch._C._cuda_getCurrentRawStream (~0.1 us), else torch.cuda.current_stream(d).cuda_stream
    (which builds a Stream object: several us)."""
    if not _RAW_STREAM:
        import torch
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _RAW_STREAM.append(raw or (lambda d, cs=torch.cuda.current_stream: cs(d).cuda_stream))
    return _RAW_STREAM[0]


def _empty_like(ref, shape, dtype_code):
    """A new output of `shape` in the same library and on the same device as ref."""
    if _is_torch(ref):
        import torch
        tdt = {ATTN_DTYPE_F32: torch.float32, ATTN_DTYPE_F16: torch.float16,
               ATTN_DTYPE_BF16: torch.bfloat16}[dtype_code]
        return torch.empty(shape, dtype=tdt, device=ref.device)
    if dtype_code == ATTN_DTYPE_BF16:
        return np.empty(shape, dtype=ref.dtype)
    return np.empty(shape, dtype={ATTN_DTYPE_F32: np.float32, ATTN_DTYPE_F16: np.float16}
                    [dtype_code])


def _struct_dict(s, skip=()):
    out = {}
    for name, _ in s._fields_:
        if name in skip:
            continue
        value = getattr(s, name)
        out[name] = _text(value) if isinstance(value, bytes) else value
    return out


# ---- context ---------------------------------------------------------------------------

class _Owned:
    """A C object with a parent that must outlive it and children that must die first."""

    _ptr = None

    def __init__(self):
        self._children = weakref.WeakSet()
        self._lib = library()      # held, so that __del__ at interpreter exit still has it

    def close(self) -> None:
        """Frees the C object (children first). Idempotent."""
        for child in list(self._children):
            child.close()
        if self._ptr:
            ptr, self._ptr = self._ptr, None
            self._destroy(ptr)

    @property
    def closed(self) -> bool:
        return not self._ptr

    def _live(self):
        if not self._ptr:
            raise ValueError("%s is closed" % type(self).__name__)
        return self._ptr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:   # interpreter shutdown: the library may be gone already
            pass


_PIP_CUDA = {  # attn.h's default sonames, and where PyTorch's CUDA wheels keep each library
    "nvrtc": (("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"), ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib")),
    "cublas": (("libcublas.so.13", "libcublas.so.12", "libcublas.so"), ("nvidia/cu13/lib", "nvidia/cublas/lib")),
}


def _pip_cuda_library(kind):
    """The path of NVRTC / cuBLAS as a pip wheel installs it (nvidia-cuda-nvrtc,
    nvidia-cublas, which PyTorch depends on), when the loader finds none of the system's
    sonames; else None (attn.h then tries its defaults). The pip copy is looked for first:
    only where one exists is the system's opened to see whether it loads (cuBLAS takes
    50-400 ms to open, which attn.h otherwise defers to its first use)."""
    import glob
    import sys
    sonames, subdirs = _PIP_CUDA[kind]
    found = None
    for base in sys.path:
        for sub in subdirs:
            for soname in sonames:
                hits = sorted(glob.glob(os.path.join(base or ".", sub, soname + "*")))
                if hits and found is None:
                    found = hits[0]
    if found is None:
        return None
    for soname in sonames:
        try:
            C.CDLL(soname)
            return None                       # the system has one: attn.h finds it itself
        except OSError:
            pass
    return found


class Context(_Owned):
    """attn_context: logger, last error, worker threads, selection and kernel caches.

    num_threads: None = env ATTN_NUM_THREADS, else the online cores. log_level: which lines
    the library logs: 'error', 'warn', 'info', 'debug', 'none' or None (env ATTN_LOG_LEVEL,
    else info). log: None, or a callable(level, item, message) that gets every line, with
    names as strings, e.g. ('info', 'ATTN_LOG_SELECT_RESOLVED', 'attn_layer_create: ...').
    None: the lines go to Python's logging, logger 'attn_h' (record.attn_item: the item's
    name), whose configuration decides what shows (by default WARNING and above, on stderr;
    ``logging.basicConfig(level=logging.INFO)`` shows the selector's INFO line too). A
    failing call raises AttnError with the library's message and prints nothing: its ERROR
    line reaches logging at DEBUG only (the exception is its report).
    kernel_cache_dir: None = env ATTN_CACHE_DIR or the user cache; 'off' = memory only.
    cuda_library, nvrtc_library, cublas_library: the CUDA driver, NVRTC and cuBLAS to open
    (a full path or a soname); None = env ATTN_CUDA_LIBRARY / ATTN_NVRTC_LIBRARY /
    ATTN_CUBLAS_LIBRARY, else — for NVRTC and cuBLAS — the copies PyTorch's wheels keep
    under site-packages/nvidia/ when the loader finds none of the system's, else the
    library's defaults. ``platform`` says which file each was opened as."""

    def __init__(self, num_threads: Optional[int] = None, log_level: Optional[str] = None,
                 kernel_cache_dir: Optional[str] = None, log: Optional[Callable[[str, str, str], None]] = None,
                 cuda_library: Optional[str] = None, nvrtc_library: Optional[str] = None,
                 cublas_library: Optional[str] = None) -> None:
        super().__init__()
        lib = library()
        desc = attn_context_desc()
        desc.log_level, quiet = _levels(log_level)
        desc.num_threads = 0 if num_threads is None else int(num_threads)
        self._cache_dir = None if kernel_cache_dir is None else os.fsencode(kernel_cache_dir)
        desc.kernel_cache_dir = self._cache_dir
        self._libraries = []                     # the names the desc points into
        for field, given, env, pip in (("cuda_library", cuda_library, "ATTN_CUDA_LIBRARY", None),
                                       ("nvrtc_library", nvrtc_library, "ATTN_NVRTC_LIBRARY", "nvrtc"),
                                       ("cublas_library", cublas_library, "ATTN_CUBLAS_LIBRARY", "cublas")):
            name = given if given is not None else (None if os.environ.get(env) or not pip
                                                     else _pip_cuda_library(pip))
            if name is not None:
                self._libraries.append(os.fsencode(name))
                setattr(desc, field, self._libraries[-1])
        route = self._route = _LogRoute(log, quiet)   # the hook's state (not self: no cycle)

        def trampoline(user_data, level, item, message):
            try:
                route.line(level, lib.attn_log_item_name(item).decode(), _text(message))
            except Exception:   # never unwind through C
                pass
        self._log_fn = ATTN_LOG_FN(trampoline)   # kept: C calls it for the context's life
        desc.log = self._log_fn
        ptr = C.c_void_p()
        _check(lib.attn_context_create(C.byref(desc), C.byref(ptr)), None, route)
        self._ptr = ptr.value

    def _destroy(self, ptr):
        self._lib.attn_context_destroy(ptr)

    def _check(self, code):
        if code or self._route.pending:
            _check(code, self._ptr, self._route)

    @property
    def last_error(self) -> str:
        return _text(library().attn_context_last_error(self._live()) or b"")

    def set_log_level(self, level: Optional[str]) -> None:
        """Which lines the library logs from now on (as log_level of the constructor)."""
        threshold, quiet = _levels(level)
        self._check(library().attn_context_set_log_level(self._live(), threshold))
        self._route.quiet = quiet

    def _platform(self):
        p = attn_platform()
        self._check(library().attn_platform_get(self._live(), C.byref(p)))
        return p

    @property
    def platform(self) -> dict:
        """attn_platform as a dict; kind is 'cpu' or 'cuda'."""
        d = _struct_dict(self._platform())
        d["kind"] = _PLATFORM_NAMES.get(d["kind"], d["kind"])
        return d

    @property
    def platform_text(self) -> str:
        p = self._platform()
        n = library().attn_platform_format(C.byref(p), None, 0)
        buf = C.create_string_buffer(n + 1)
        library().attn_platform_format(C.byref(p), buf, n + 1)
        return _text(buf.value)

    # ---- the CUDA allocator, copies and NVRTC, as C callers have them ----

    def cuda_malloc(self, nbytes: int) -> int:
        """Device memory of nbytes bytes (attn_cuda_malloc): its address, an int. Free it with
        cuda_free. Raises AttnError naming the reason where there is no CUDA device."""
        ptr = _vp()
        if int(nbytes) < 0:
            _fail(ATTN_ERROR_INVALID_VALUE, "cuda_malloc: nbytes is %d (allowed: >= 0)" % int(nbytes))
        self._check(library().attn_cuda_malloc(self._live(), int(nbytes), C.byref(ptr)))
        return int(ptr.value or 0)

    def cuda_free(self, ptr: int) -> None:
        """Frees device memory from cuda_malloc (0 or None: nothing)."""
        self._check(library().attn_cuda_free(self._live(), _vp(int(ptr or 0))))

    def cuda_memcpy(self, dst: Union[int, Array], src: Union[int, Array], nbytes: int, kind: str,
                    stream: Stream = None) -> None:
        """Copies nbytes bytes (attn_cuda_memcpy). kind: 'h2d', 'd2h' or 'd2d'. Device sides
        are addresses (ints, e.g. from cuda_malloc or a CUDA tensor's data_ptr()); host
        sides a C-contiguous numpy array of at least nbytes bytes (written for 'd2h') or
        an address. stream: None = the legacy default stream (the copy is complete on
        return), an int CUstream, or a torch.cuda.Stream."""
        fn = "cuda_memcpy"
        kinds = {"h2d": ATTN_COPY_HOST_TO_DEVICE, "d2h": ATTN_COPY_DEVICE_TO_HOST, "d2d": ATTN_COPY_DEVICE_TO_DEVICE}
        if kind not in kinds:
            _fail(ATTN_ERROR_INVALID_VALUE, "%s: kind is %r (allowed: 'h2d', 'd2h', 'd2d')" % (fn, kind))
        n = int(nbytes)

        def address(x, name, host, write):
            if isinstance(x, np.ndarray):
                if not host:
                    _fail(ATTN_ERROR_INVALID_VALUE, "%s: %s is a numpy array but kind %r makes it device "
                          "memory (allowed: an int address)" % (fn, name, kind))
                if not x.flags.c_contiguous or x.nbytes < n or (write and not x.flags.writeable):
                    _fail(ATTN_ERROR_INVALID_VALUE, "%s: %s is a numpy array of %d bytes%s (allowed: a "
                          "C-contiguous%s array of at least nbytes = %d bytes)" % (
                              fn, name, x.nbytes, "" if x.flags.c_contiguous else ", not contiguous",
                              " writeable" if write else "", n))
                return x.ctypes.data
            if _is_torch(x):
                return x.data_ptr()
            return int(x)

        d = address(dst, "dst", kind == "d2h", True)
        s_ = address(src, "src", kind == "h2d", False)
        self._check(library().attn_cuda_memcpy(self._live(), _vp(d), _vp(s_), n, kinds[kind],
                                               _stream(stream, None, None)))

    def cuda_synchronize(self, stream: Stream = None) -> None:
        """Waits for the stream (None: the whole context's device work)."""
        self._check(library().attn_cuda_synchronize(self._live(), _stream(stream, None, None)))

    def kernel_compile(self, kernel: str, options: str = "", arch: str = "sm_90") -> dict:
        """Compiles one variant of an embedded kernel with NVRTC, or finds it in the memory or
        disk cache (attn_kernel_compile; no GPU needed): kernel e.g. 'paged_attention.cu',
        options e.g. '-DHEAD_DIM=128 ...', arch 'sm_80', 'sm_90' or 'sm_90a'. Returns the
        report: kernel, arch, source ('compiled', 'memory', 'disk'), cubin_bytes, registers,
        shared_bytes, spill_stores, spill_loads, compile_ms, log. A compile error raises
        AttnError with the NVRTC log."""
        info = attn_kernel_info()
        self._check(library().attn_kernel_compile(self._live(), kernel.encode(), options.encode(),
                                                  arch.encode(), C.byref(info)))
        return dict(kernel=info.kernel.decode(), arch=info.arch.decode(),
                    source={ATTN_KERNEL_COMPILED: "compiled", ATTN_KERNEL_FROM_MEMORY: "memory",
                            ATTN_KERNEL_FROM_DISK: "disk"}.get(info.source, "?"),
                    cubin_bytes=int(info.cubin_bytes), registers=info.registers, shared_bytes=info.shared_bytes,
                    spill_stores=info.spill_stores, spill_loads=info.spill_loads, compile_ms=info.compile_ms,
                    log=info.log.decode(errors="replace"))

    @property
    def kernel_compile_count(self) -> int:
        """NVRTC compilations this context has run (cache hits excluded)."""
        return int(library().attn_kernel_compile_count(self._live()))

    def selection_cache_clear(self) -> None:
        self._check(library().attn_selection_cache_clear(self._live()))


# ---- layer -----------------------------------------------------------------------------

def _selection_dict(s):
    """attn_selection as a dict, enums as names: backends 'CPU', dtypes 'f16', devices
    'cpu'/'cuda'; skipped: a list of {'backend', 'reason'}."""
    d = _struct_dict(s, skip=("skipped",))
    for key in ("forced_backend", "default_backend", "requested", "resolved"):
        d[key] = _backend_name(d[key])
    for key in ("dtype", "kv_cache_dtype"):
        d[key] = _dtype_name(d[key])
    for key in ("device", "backend_device"):
        d[key] = _DEVICE_NAMES.get(d[key], d[key])
    d["platform"] = _PLATFORM_NAMES.get(d["platform"], d["platform"])
    d["source"] = _SOURCE_NAMES.get(d["source"], d["source"])
    d["cuda_graph"] = _GRAPH_NAMES.get(d["cuda_graph"], d["cuda_graph"])
    d["lse_base"] = "e" if d["lse_base"] == ATTN_LSE_BASE_E else 2
    d["kv_scale_kind"] = ("per_token_head" if d["kv_scale_kind"] == ATTN_KV_SCALE_PER_TOKEN_HEAD
                          else "per_tensor")
    for key in ("env_set", "forced_by_code", "degraded", "use_mla", "can_return_lse"):
        d[key] = bool(d[key])
    d["skipped"] = [{"backend": _backend_name(s.skipped[i].backend),
                     "reason": _text(s.skipped[i].reason)}
                    for i in range(min(s.num_skipped, ATTN_SELECTION_MAX_SKIPPED))]
    return d


def _sinks(x, num_heads, device, keep):
    """desc.sinks from a float32 numpy array / torch tensor of num_heads logits: its address
    (read by the library at every call, so values written into it take effect at the next
    call and a CUDA graph's next replay). On the layer's device: numpy or a CPU tensor for
    device 'cpu', a CUDA tensor for 'cuda'."""
    if isinstance(x, np.ndarray):
        kind, dev, ptr, n = "a numpy array", ATTN_DEVICE_CPU, x.ctypes.data, x.size
        ok = x.dtype == np.float32 and x.flags["C_CONTIGUOUS"]
    elif _is_torch(x):
        kind, ptr, n = "a tensor", x.data_ptr(), x.numel()
        dev = ATTN_DEVICE_CUDA if x.device.type == "cuda" else ATTN_DEVICE_CPU
        ok = str(x.dtype) == "torch.float32" and x.is_contiguous()
    else:
        _fail(ATTN_ERROR_INVALID_VALUE, "Layer: sinks is %s (allowed: None, or a float32 numpy array / "
              "torch tensor of num_heads = %d logits)" % (type(x).__name__, num_heads))
    if not ok or n != num_heads:
        _fail(ATTN_ERROR_INVALID_VALUE, "Layer: sinks is %s of %s with %d elements (allowed: num_heads = %d "
              "contiguous float32 logits)" % (kind, x.dtype, n, num_heads))
    if dev != device:
        _fail(ATTN_ERROR_INVALID_VALUE, "Layer: sinks is on %s for a %s layer (allowed: the layer's device)"
              % (_DEVICE_NAMES.get(dev, dev), _DEVICE_NAMES.get(device, device)))
    keep.append(x)
    return C.cast(C.c_void_p(ptr), C.POINTER(C.c_float))


def _check_kv_scales(kv_dtype, per_token_head, mla, k_scale, v_scale):
    """Layer's k_scale / v_scale against its cache type, named as Layer's arguments (attn.h
    would name its desc fields): an fp8 cache with per-tensor scales needs k_scale and
    (standard layers) v_scale; a cache that keeps its own scales takes neither; a number
    must be finite and > 0."""
    given = [n for n, x in (("k_scale", k_scale), ("v_scale", v_scale)) if x is not None]
    fp8 = kv_dtype in (ATTN_DTYPE_FP8_E4M3, ATTN_DTYPE_FP8_E5M2)
    if given and (per_token_head or kv_dtype == ATTN_DTYPE_FP8_DS_MLA):
        _fail(ATTN_ERROR_INVALID_VALUE, "Layer: %s given with %s (allowed: None; %s)" % (
            " and ".join(n + "=" for n in given),
            "per_token_head=True" if per_token_head else "kv_cache_dtype 'fp8_ds_mla'",
            "the cache write computes and stores a scale per token and KV head" if per_token_head
            else "every fp8_ds_mla row holds its own scales"))
    if fp8 and not per_token_head:
        need = ["k_scale"] + ([] if mla else ["v_scale"])
        missing = [n for n in need if n not in given]
        if missing:
            _fail(ATTN_ERROR_INVALID_VALUE, "Layer: kv_cache_dtype %s needs %s (the per-tensor scales: the "
                  "cache holds k / k_scale%s; each a number > 0, e.g. 1.0, or a one-element float32 "
                  "array / tensor read at every call; or per_token_head=True for fp8_e4m3)" % (
                      _dtype_name(kv_dtype), " and ".join(n + "=" for n in missing),
                      "" if mla else " and v / v_scale"))
    for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
        if x is not None and not isinstance(x, np.ndarray) and not _is_torch(x):
            try:
                ok = math.isfinite(float(x)) and float(x) > 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                _fail(ATTN_ERROR_INVALID_VALUE, "Layer: %s=%r (allowed: a finite number > 0, or a "
                      "one-element float32 array / tensor)" % (name, x))


def _kv_scale(field, x, what, keep):
    """attn_kv_scale from a number (the value) or a one-element float32 numpy array / torch
    tensor (its address: read by the library at every call, so writing a new value into it
    changes the scale — vLLM's k_scale / v_scale tensors, CUDA graphs included)."""
    if x is None:
        return
    if isinstance(x, np.ndarray):
        if x.dtype != np.float32 or x.size != 1:
            _fail(ATTN_ERROR_INVALID_VALUE, "%s is a numpy array of %s with %d elements (allowed: "
                  "a number, or one float32)" % (what, x.dtype.name, x.size))
        field.ptr = C.cast(C.c_void_p(x.ctypes.data), C.POINTER(C.c_float))
        field.device = ATTN_DEVICE_CPU
        keep.append(x)
    elif _is_torch(x):
        if str(x.dtype) != "torch.float32" or x.numel() != 1:
            _fail(ATTN_ERROR_INVALID_VALUE, "%s is a tensor of %s with %d elements (allowed: a "
                  "number, or one torch.float32)" % (what, x.dtype, x.numel()))
        field.ptr = C.cast(C.c_void_p(x.data_ptr()), C.POINTER(C.c_float))
        field.device = ATTN_DEVICE_CUDA if x.device.type == "cuda" else ATTN_DEVICE_CPU
        keep.append(x)
    else:
        field.value = float(x)


class Layer(_Owned):
    """attn_layer: a layer descriptor resolved to a backend.

    dtype: of q/k/v/out ('float16', 'bf16', np.float32, torch.bfloat16...); kv_cache_dtype:
    None = dtype, or 'fp8' (= 'fp8_e4m3'), 'fp8_e5m2' with k_scale / v_scale (floats > 0, or
    one-element float32 arrays/tensors, read at every call; MLA: k_scale only): the cache
    holds k / k_scale and v / v_scale; or 'int8' / 'fp8_e4m3' with
    per_token_head=True: a scale per (token, KV head) row, kept in the cache. causal: True, False, or None (the library's default, causal).
    sliding_window, logits_soft_cap: 0 = none. alibi_slopes: None or num_heads floats.
    sinks: None, or attention sinks (gpt-oss): a float32 numpy array / torch tensor of num_heads
    logits on the layer's device, read at every call (not copied: values written into it
    take effect at the next call); the returned LSE includes the sink.
    scale: None = 1/sqrt(head_size) (MLA: of the query width). device: 'cpu' or 'cuda'.
    backend: None (automatic, or env ATTN_BACKEND) or a name ('CPU', 'CUDA', 'CUDA_SM90', 'CPU_MLA',
             'CUDA_MLA_SM90', 'CUDA_MLA'; an fp8 latent on a GPU runs on CUDA_MLA);
    allow_fallback: an explicit backend that cannot serve degrades to the automatic one.
    mla: None, or a dict with kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim
    (head_size then defaults to kv_lora_rank + qk_rope_head_dim, num_kv_heads to 1).

    selection: the selection record (dict); selection_text: the same as attn.h prints it;
    desc: the effective descriptor (defaults filled in)."""

    def __init__(self, ctx: Context, num_heads: int, num_kv_heads: Optional[int] = None,
                 head_size: Optional[int] = None, block_size: int = 16, dtype: Any = "float16",
                 kv_cache_dtype: Any = None, causal: bool = True, sliding_window: int = 0,
                 logits_soft_cap: float = 0.0, alibi_slopes: Optional[Sequence[float]] = None,
                 scale: Optional[float] = None, device: str = "cpu", backend: Optional[str] = None,
                 allow_fallback: bool = False, mla: Optional[dict] = None, k_scale: Any = None,
                 v_scale: Any = None, per_token_head: bool = False, sinks: Optional[Array] = None) -> None:
        super().__init__()
        lib = library()
        self.ctx = ctx
        desc = attn_layer_desc()
        desc.num_heads = int(num_heads)
        desc.num_kv_heads = int(num_kv_heads or 0)
        if mla is not None:
            known = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
            unknown = set(mla) - set(known)
            if unknown:
                _fail(ATTN_ERROR_INVALID_VALUE, "Layer: mla has %s (allowed: %s)"
                      % (", ".join(sorted(unknown)), ", ".join(known)))
            desc.use_mla = 1
            for key in known:
                setattr(desc, key, int(mla.get(key, 0)))
            if head_size is None:
                head_size = desc.kv_lora_rank + desc.qk_rope_head_dim
        desc.head_size = int(head_size or 0)
        desc.dtype = _dtype(dtype, "Layer: dtype")
        desc.kv_cache_dtype = _dtype(kv_cache_dtype, "Layer: kv_cache_dtype", auto=True)
        if desc.kv_cache_dtype == ATTN_DTYPE_INT8 and not per_token_head:
            _fail(ATTN_ERROR_INVALID_VALUE, "Layer: kv_cache_dtype 'int8' needs per_token_head=True "
                  "(an int8 cache keeps a scale per token and KV head, computed by the cache "
                  "write; per-tensor scales take 'fp8' / 'fp8_e5m2')")
        _check_kv_scales(desc.kv_cache_dtype, per_token_head, mla is not None, k_scale, v_scale)
        self._scales = []                      # arrays whose memory the scale pointers name
        _kv_scale(desc.k_scale, k_scale, "Layer: k_scale", self._scales)
        _kv_scale(desc.v_scale, v_scale, "Layer: v_scale", self._scales)
        desc.kv_scale_kind = ATTN_KV_SCALE_PER_TOKEN_HEAD if per_token_head else ATTN_KV_SCALE_PER_TENSOR
        desc.block_size = int(block_size or 0)
        desc.scale = float(scale or 0.0)
        desc.causal = _causal(causal, "Layer: causal")
        desc.sliding_window = int(sliding_window or 0)
        desc.logits_soft_cap = float(logits_soft_cap or 0.0)
        if alibi_slopes is not None:
            if _is_torch(alibi_slopes):
                alibi_slopes = alibi_slopes.detach().float().cpu().numpy()
            self._alibi = np.ascontiguousarray(alibi_slopes, dtype=np.float32).reshape(-1)
            if self._alibi.size != desc.num_heads:
                _fail(ATTN_ERROR_INVALID_VALUE, "Layer: alibi_slopes has %d entries (allowed: "
                      "num_heads = %d)" % (self._alibi.size, desc.num_heads))
            desc.alibi_slopes = _ptr(self._alibi, C.c_float)
        kinds = {"cpu": ATTN_DEVICE_CPU, "cuda": ATTN_DEVICE_CUDA}
        dev = str(getattr(device, "type", device)).split(":")[0].lower()
        if dev not in kinds:
            _fail(ATTN_ERROR_INVALID_VALUE, "Layer: device is %r (allowed: 'cpu', 'cuda')"
                  % (device,))
        desc.device = kinds[dev]
        if sinks is not None:
            desc.sinks = _sinks(sinks, desc.num_heads, desc.device, self._scales)
        self._desc = desc                       # alibi_slopes points into self._alibi
        request = attn_select_request()
        request.allow_fallback = int(bool(allow_fallback))
        if backend is not None:
            request.backend = _backend_id(backend)
        ptr = C.c_void_p()
        _need(ctx, Context, "ctx", "Layer")
        ctx._check(lib.attn_layer_create(ctx._live(), C.byref(desc), C.byref(request),
                                         C.byref(ptr)))
        self._ptr = ptr.value
        self._kv_dtype = self._effective().kv_cache_dtype   # a uint8 cache is taken as this
        ctx._children.add(self)

    def _destroy(self, ptr):
        self._lib.attn_layer_destroy(ptr)

    def _effective(self):
        return library().attn_layer_get_desc(self._live()).contents

    def __repr__(self):
        if self.closed:
            return "<attn_h.Layer (closed)>"
        d = self._effective()
        return "<attn_h.Layer %s heads=%d/%d head_size=%d %s%s>" % (
            self.backend, d.num_heads, d.num_kv_heads, d.head_size, _dtype_name(d.dtype),
            " mla" if d.use_mla else "")

    def _check(self, code):
        self.ctx._check(code)

    @property
    def selection(self) -> dict:
        return _selection_dict(library().attn_layer_selection(self._live()).contents)

    @property
    def selection_text(self) -> str:
        s = library().attn_layer_selection(self._live())
        n = library().attn_selection_format(s, None, 0)
        buf = C.create_string_buffer(n + 1)
        library().attn_selection_format(s, buf, n + 1)
        return _text(buf.value)

    @property
    def backend(self) -> str:
        """The resolved backend's name ('CPU', 'CPU_MLA', 'CUDA', 'CUDA_SM90', 'CUDA_MLA_SM90', ...)."""
        return self.selection["resolved"]

    @property
    def features(self) -> Tuple[str, ...]:
        """What the resolved backend's layers may ask for, as the selection record's
        `features:` line lists it: a tuple of 'non-causal', 'sliding-window', 'soft-cap',
        'alibi', 'sinks', 'cascade' (common_prefix_len used), 'sparse-mla' (mla_forward_sparse;
        empty: causal attention only)."""
        for line in self.selection_text.splitlines():
            if line.strip().startswith("features:"):
                words = line.split(":", 1)[1].split()
                return () if words == ["causal", "only"] else tuple(words)
        return ()

    @property
    def desc(self) -> dict:
        d = _struct_dict(self._effective(), skip=("alibi_slopes", "sinks"))
        for key in ("dtype", "kv_cache_dtype"):
            d[key] = _dtype_name(d[key])
        d["causal"] = {ATTN_CAUSAL_YES: True, ATTN_CAUSAL_NO: False}.get(d["causal"])
        d["device"] = _DEVICE_NAMES.get(d["device"], d["device"])
        d["use_mla"] = bool(d["use_mla"])
        return d

    def kv_cache_shape(self, num_blocks: int) -> Tuple[int, ...]:
        """The cache's shape for num_blocks blocks: standard [num_blocks, 2, block_size,
        num_kv_heads, head_size]; MLA [num_blocks, block_size, head_size]."""
        shape = (C.c_int64 * ATTN_MAX_DIMS)()
        ndim = C.c_int()
        self._check(library().attn_layer_kv_cache_shape(self._live(), int(num_blocks), shape,
                                                        C.byref(ndim)))
        return tuple(shape[i] for i in range(ndim.value))

    # -- standard attention --

    def reshape_and_cache(self, key: Array, value: Array, kv_cache: Array, slot_mapping: Array,
                          stream: Stream = None) -> None:
        """Writes key/value [>= num_tokens, num_kv_heads, head_size] into kv_cache at
        slot_mapping (-1 skips; num_tokens = len(slot_mapping)): host ints (a list, numpy or
        a CPU tensor), or, for a CUDA layer, an int64 CUDA tensor used in place (no copy;
        checked on the device: a slot out of range makes the write a no-op)."""
        fn = "reshape_and_cache"
        slots, ts = _slots(slot_mapping, fn)
        tk, tv = _tensor(key, "key", fn), _tensor(value, "value", fn)
        tc = _tensor(kv_cache, "kv_cache", fn, write=True, cache_dtype=self._kv_dtype)
        self._check(library().attn_reshape_and_cache(
            self._live(), tk, tv, tc, ts, _stream(stream, kv_cache, key)))
        del slots

    def forward(self, meta: Metadata, q: Array, kv_cache: Array, out: Optional[Array] = None,
                lse: Optional[Array] = None, k: Optional[Array] = None, v: Optional[Array] = None,
                stream: Stream = None) -> Array:
        """Attention of a built batch. q [num_tokens, num_heads, head_size]; k, v: None
        (already cached) or the new tokens' [num_tokens, num_kv_heads, head_size], written
        to the cache first by the batch's slot_mapping. out: like q (allocated when None);
        lse: None or float32 [num_tokens, num_heads] (base e). Returns out."""
        fn = "forward"
        _need(meta, Metadata, "meta", fn)
        tq = _tensor(q, "q", fn)
        if out is None:
            out = _empty_like(q, _shape_of(q, "q", fn), self._effective().dtype)
        self._check(library().attn_layer_forward(
            self._live(), meta._live(), _ref(tq), _ref(_tensor(k, "k", fn)),
            _ref(_tensor(v, "v", fn)),
            _ref(_tensor(kv_cache, "kv_cache", fn, write=k is not None, cache_dtype=self._kv_dtype)),
            _ref(_tensor(out, "out", fn, write=True)), _ref(_tensor(lse, "lse", fn, write=True)),
            _stream(stream, q, kv_cache)))
        return out

    def prepare_forward(self, meta: Metadata, q: Array, kv_cache: Array, out: Array,
                        lse: Optional[Array] = None, k: Optional[Array] = None, v: Optional[Array] = None,
                        stream: Stream = None) -> "PreparedForward":
        """forward on these torch tensors now, and a PreparedForward that repeats it on
        tensors of the same kinds with the argument structs built once (see PreparedForward)."""
        return PreparedForward(self, meta, q, kv_cache, out, lse, k, v, stream)

    # -- MLA --

    def concat_and_cache_mla(self, kv_c: Array, k_pe: Array, kv_cache: Array, slot_mapping: Array,
                             stream: Stream = None) -> None:
        """Writes kv_c [num_tokens, kv_lora_rank] and k_pe [num_tokens, qk_rope_head_dim]
        into the latent cache at slot_mapping (as reshape_and_cache's: host ints, or an
        int64 CUDA tensor for a CUDA layer; -1 skips)."""
        fn = "concat_and_cache_mla"
        slots, ts = _slots(slot_mapping, fn)
        self._check(library().attn_concat_and_cache_mla(
            self._live(), _tensor(kv_c, "kv_c", fn), _tensor(k_pe, "k_pe", fn),
            _tensor(kv_cache, "kv_cache", fn, write=True, cache_dtype=self._kv_dtype), ts,
            _stream(stream, kv_cache, kv_c)))
        del slots

    def mla_forward_mqa(self, meta: Metadata, q: Array, kv_cache: Array, out_latent: Array,
                        q_pe: Optional[Array] = None, lse: Optional[Array] = None, stream: Stream = None) -> Array:
        """Absorbed decode of the batch's decode tokens: q [.., num_heads, head_size] with
        q_pe None, or q_latent [.., num_heads, kv_lora_rank] plus q_pe [.., num_heads,
        qk_rope_head_dim]. Writes out_latent [.., num_heads, kv_lora_rank] and lse."""
        fn = "mla_forward_mqa"
        _need(meta, Metadata, "meta", fn)
        self._check(library().attn_mla_forward_mqa(
            self._live(), meta._live(), _ref(_tensor(q, "q", fn)),
            _ref(_tensor(q_pe, "q_pe", fn)),
            _ref(_tensor(kv_cache, "kv_cache", fn, cache_dtype=self._kv_dtype)),
            _ref(_tensor(out_latent, "out_latent", fn, write=True)),
            _ref(_tensor(lse, "lse", fn, write=True)),
            _stream(stream, q, kv_cache)))
        return out_latent

    def mla_forward_sparse(self, meta: Metadata, q: Array, kv_cache: Array, indices: Array, out_latent: Array,
                           q_pe: Optional[Array] = None, lse: Optional[Array] = None, stream: Stream = None) -> Array:
        """Sparse MLA (DeepSeek-V3.2's DSA): every batch token attends, absorbed, only to
        the positions of its request its row of indices names: int32 [num_tokens, topk]
        (numpy, or a torch tensor where the layer's tensors live), -1 = padding; positions
        are request-local, as vLLM's FLASHMLA_SPARSE backend receives them from the
        indexer. q as mla_forward_mqa's; writes out_latent [.., num_heads, kv_lora_rank]
        and lse. The layer's sinks join the softmax. kv_cache may be fp8_ds_mla (uint8
        [blocks, block_size, 656])."""
        fn = "mla_forward_sparse"
        _need(meta, Metadata, "meta", fn)
        self._check(library().attn_mla_forward_sparse(
            self._live(), meta._live(), _ref(_tensor(q, "q", fn)),
            _ref(_tensor(q_pe, "q_pe", fn)),
            _ref(_tensor(kv_cache, "kv_cache", fn, cache_dtype=self._kv_dtype)),
            _ref(_tensor(indices, "indices", fn)),
            _ref(_tensor(out_latent, "out_latent", fn, write=True)),
            _ref(_tensor(lse, "lse", fn, write=True)),
            _stream(stream, q, kv_cache)))
        return out_latent

    def mla_forward_mha(self, meta: Metadata, q: Array, kv_cache: Array, w_uk: Array, w_uv: Array, out: Array,
                        lse: Optional[Array] = None, stream: Stream = None) -> Array:
        """Up-projected prefill of the batch's prefill tokens: q [.., num_heads, qk_nope +
        qk_rope] (prefill rows in order), W_UK [num_heads, qk_nope, kv_lora_rank], W_UV
        [num_heads, kv_lora_rank, v_head_dim]; out [.., num_heads, v_head_dim]."""
        fn = "mla_forward_mha"
        _need(meta, Metadata, "meta", fn)
        self._check(library().attn_mla_forward_mha(
            self._live(), meta._live(), _ref(_tensor(q, "q", fn)),
            _ref(_tensor(kv_cache, "kv_cache", fn, cache_dtype=self._kv_dtype)),
            _ref(_tensor(w_uk, "w_uk", fn)), _ref(_tensor(w_uv, "w_uv", fn)),
            _ref(_tensor(out, "out", fn, write=True)), _ref(_tensor(lse, "lse", fn, write=True)),
            _stream(stream, q, kv_cache)))
        return out

    def mla_forward(self, meta: Metadata, q_nope: Array, q_pe: Array, kv_cache: Array, w_uk: Array,
                    w_uv: Array, out: Optional[Array] = None, kv_c: Optional[Array] = None,
                    k_pe: Optional[Array] = None, stream: Stream = None) -> Array:
        """The whole MLA attention of a built batch (decodes absorbed, prefills up-projected);
        kv_c/k_pe (both or neither) are written to the cache first. out [.., num_heads,
        v_head_dim] (allocated when None). Returns out."""
        fn = "mla_forward"
        _need(meta, Metadata, "meta", fn)
        tqn = _tensor(q_nope, "q_nope", fn)
        if out is None:
            d = self._effective()
            shape = _shape_of(q_nope, "q_nope", fn)
            if len(shape) != 3:
                _fail(ATTN_ERROR_SHAPE_MISMATCH, "%s: q_nope has shape %s (allowed: [tokens, "
                      "num_heads, qk_nope_head_dim])" % (fn, shape))
            out = _empty_like(q_nope, (shape[0], shape[1], d.v_head_dim), d.dtype)
        self._check(library().attn_mla_forward(
            self._live(), meta._live(), _ref(tqn),
            _ref(_tensor(q_pe, "q_pe", fn)), _ref(_tensor(kv_c, "kv_c", fn)),
            _ref(_tensor(k_pe, "k_pe", fn)),
            _ref(_tensor(kv_cache, "kv_cache", fn, write=kv_c is not None, cache_dtype=self._kv_dtype)),
            _ref(_tensor(w_uk, "w_uk", fn)), _ref(_tensor(w_uv, "w_uv", fn)),
            _ref(_tensor(out, "out", fn, write=True)), _stream(stream, q_nope, kv_cache)))
        return out


# ---- metadata --------------------------------------------------------------------------

class Metadata(_Owned):
    """attn_metadata: a batch schedule of fixed capacity, rebuilt for each batch.

    max_num_reqs, max_num_tokens, max_blocks_per_req, num_blocks: the capacity (num_blocks
    defaults to the blocks of the cache it will index; required). MLA only:
    decode_threshold, num_kv_splits, workspace_bytes (0: defaults). Decode context
    parallelism (every backend): dcp_world_size ranks, this one dcp_rank,
    runs of dcp_interleave tokens (attn_metadata_desc in attn.h); a forward then returns the
    rank's partial with its LSE (required), joined by dcp_combine or dcp_all_gather_combine."""

    def __init__(self, layer: Layer, max_num_reqs: int, max_num_tokens: int, max_blocks_per_req: int,
                 num_blocks: int, decode_threshold: int = 0, num_kv_splits: int = 0,
                 workspace_bytes: int = 0, dcp_world_size: int = 0, dcp_rank: int = 0,
                 dcp_interleave: int = 0) -> None:
        super().__init__()
        _need(layer, Layer, "layer", "Metadata")
        self.layer = layer
        desc = attn_metadata_desc(int(max_num_reqs), int(max_num_tokens),
                                  int(max_blocks_per_req), int(num_blocks),
                                  int(decode_threshold), int(num_kv_splits),
                                  int(workspace_bytes), int(dcp_world_size), int(dcp_rank),
                                  int(dcp_interleave))
        ptr = C.c_void_p()
        layer._check(library().attn_metadata_create(layer._live(), C.byref(desc),
                                                    C.byref(ptr)))
        self._ptr = ptr.value
        self._op_prepared = {}   # torch_ops()'s forward: its PreparedForward calls on this batch
        layer._children.add(self)

    def _destroy(self, ptr):
        self._op_prepared.clear()
        self._lib.attn_metadata_destroy(ptr)

    def _check(self, code):
        self.layer._check(code)

    @property
    def capacity(self) -> dict:
        """The capacity with every default resolved (dict)."""
        return _struct_dict(library().attn_metadata_capacity(self._live()).contents)

    def build(self, query_start_loc: Array, seq_lens: Array, block_table: Array, slot_mapping: Array,
              causal: Optional[bool] = None, stream: Stream = None, common_prefix_len: int = 0,
              fast_build: bool = False) -> None:
        """Validates and copies a batch (host int arrays; torch tensors on a GPU are copied
        to the host): query_start_loc [num_reqs + 1], seq_lens [num_reqs], block_table
        [num_reqs, stride] (its row count may exceed num_reqs), slot_mapping
        [num_actual_tokens] (-1 = pad). causal: None = the layer's. stream: where a CUDA
        layer uploads the schedule (None: torch's current stream, if torch is loaded and
        the layer is on CUDA)."""
        fn = "build"
        qsl = _host_ints(query_start_loc, "query_start_loc", fn, C.c_int32).reshape(-1)
        lens = _host_ints(seq_lens, "seq_lens", fn, C.c_int32).reshape(-1)
        bt = _host_ints(block_table, "block_table", fn, C.c_int32)
        slots = _host_ints(slot_mapping, "slot_mapping", fn, C.c_int64).reshape(-1)
        num_reqs = lens.size
        # attn.h reads these arrays through bare pointers: their lengths are checked here.
        if qsl.size != num_reqs + 1:
            _fail(ATTN_ERROR_INVALID_METADATA, "%s: query_start_loc has %d entries (allowed: "
                  "num_reqs + 1 = %d, num_reqs being len(seq_lens))" % (fn, qsl.size,
                                                                          num_reqs + 1))
        # num_actual_tokens is taken from the last offset: name a decrease first, or the
        # library would blame the total
        down = np.nonzero(np.diff(qsl) < 0)[0]
        if down.size:
            i = int(down[0]) + 1
            _fail(ATTN_ERROR_INVALID_METADATA, "%s: query_start_loc decreases at index %d (%d then "
                  "%d; allowed: non-decreasing offsets from 0)" % (fn, i, qsl[i - 1], qsl[i]))
        if bt.ndim != 2 or bt.shape[0] < num_reqs:
            _fail(ATTN_ERROR_INVALID_METADATA, "%s: block_table has shape %s (allowed: "
                  "[>= num_reqs = %d, blocks per request])" % (fn, bt.shape, num_reqs))
        num_tokens = int(qsl[-1])
        if slots.size < num_tokens:
            _fail(ATTN_ERROR_INVALID_METADATA, "%s: slot_mapping has %d entries (allowed: at "
                  "least num_actual_tokens = query_start_loc[-1] = %d)"
                  % (fn, slots.size, num_tokens))
        batch = attn_batch()
        batch.query_start_loc = _ptr(qsl, C.c_int32)
        batch.seq_lens = _ptr(lens, C.c_int32)
        batch.block_table = _ptr(bt, C.c_int32)
        batch.block_table_stride = bt.shape[1]
        batch.slot_mapping = _ptr(slots, C.c_int64)
        batch.num_reqs = num_reqs
        batch.num_actual_tokens = num_tokens
        batch.max_query_len = int(np.diff(qsl).max()) if num_reqs else 0
        batch.max_seq_len = int(lens.max()) if num_reqs else 0
        batch.causal = _causal(causal, "build: causal")
        if stream is None and self.layer._desc.device == ATTN_DEVICE_CUDA:
            import sys
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available():
                stream = torch.cuda.current_stream().cuda_stream
        batch.stream = getattr(stream, "cuda_stream", stream)
        self._check(library().attn_metadata_build(self._live(), int(common_prefix_len),
                                                  C.byref(batch), int(bool(fast_build))))

    @property
    def mla_info(self) -> dict:
        """The decode/prefill split of a built MLA batch (dict)."""
        info = attn_mla_info()
        self._check(library().attn_metadata_mla_info(self._live(), C.byref(info)))
        return _struct_dict(info)


# ---- the prepared forward and the PyTorch custom ops (issue 24 section 3) ---------------

def _torch_sig(x):
    """What a prepared call checks of a tensor at every call: dtype, shape, strides and the
    device (get_device(): -1 for the CPU, the index of a GPU; x.device would cost ~1 us)."""
    return (x.dtype, x.shape, x.stride(), x.get_device()) if x is not None else None


class PreparedForward:
    """Layer.forward with its argument structs built once (issue 24): the first call (at
    construction) validates every argument as Layer.forward does and keeps the attn_tensor
    structs; a call then checks that each tensor has the prepared dtype, shape, strides and
    device (AttnError naming the argument otherwise) and calls attn_layer_forward with the
    new data pointers (through attn_py_layer_forward, which writes them into the structs, so
    that ctypes converts one argument): no struct is built, nothing allocated. torch
    tensors only. stream None: torch's current stream of q's device at each call (so a CUDA
    graph captures the launch on its capture stream). Holds the layer and the metadata;
    closed (and refusing calls) when either is closed. One thread at a time: a call writes
    the structs the library then reads."""

    def __init__(self, layer: "Layer", meta: "Metadata", q: Array, kv_cache: Array, out: Array,
                 lse: Optional[Array] = None, k: Optional[Array] = None, v: Optional[Array] = None,
                 stream: Stream = None) -> None:
        fn = "prepare_forward"
        _need(layer, Layer, "layer", fn)
        _need(meta, Metadata, "meta", fn)
        for name, x in (("q", q), ("kv_cache", kv_cache), ("out", out), ("lse", lse), ("k", k), ("v", v)):
            if x is not None and not _is_torch(x):
                raise TypeError("%s: %s is a %s (allowed: a torch tensor; numpy arrays go through "
                                "Layer.forward)" % (fn, name, type(x).__name__))
        if (k is None) != (v is None):
            _fail(ATTN_ERROR_INVALID_VALUE, "%s: k and v are given together or not at all" % fn)
        self.layer, self.meta = layer, meta
        xs = (q, k, v, kv_cache, out, lse)
        self._t = [_tensor(q, "q", fn), _tensor(k, "k", fn), _tensor(v, "v", fn),
                   _tensor(kv_cache, "kv_cache", fn, write=k is not None, cache_dtype=layer._kv_dtype),
                   _tensor(out, "out", fn, write=True), _tensor(lse, "lse", fn, write=True)]
        self._sig = [_torch_sig(x) for x in xs]
        self._dev = q.get_device()   # -1: the CPU
        self._raw_stream = None      # torch's current raw stream of a device, called per call
        fixed = None if stream is None else getattr(stream, "cuda_stream", stream)
        if self._dev >= 0 and stream is None:
            self._raw_stream = _current_raw_stream()
        # attn_layer_forward's arguments in one array for attn_py_layer_forward (attn_shared.c):
        # layer, metadata, the six structs (0: none), the stream, then the six data pointers
        # it writes into the structs; a call sets the stream and the pointers (array items
        # cost a fraction of ctypes fields) and passes one pointer, without argtypes
        self._args = array.array("Q", [layer._live(), meta._live()] +
                                 [C.addressof(t) if t is not None else 0 for t in self._t] + [fixed or 0] + [0] * 6)
        lib = library()
        self._call = lib._FuncPtr(("attn_py_layer_forward", lib))
        self._call.restype = C.c_int
        self._run = _prepared_run(self)
        self._run(q, kv_cache, out, lse, k, v)

    def __call__(self, q: Array, kv_cache: Array, out: Array, lse: Optional[Array] = None,
                 k: Optional[Array] = None, v: Optional[Array] = None) -> Array:
        """The forward on these tensors (of the prepared kinds). Returns out."""
        return self._run(q, kv_cache, out, lse, k, v)


_PREPARED_NAMES = ("q", "k", "v", "kv_cache", "out", "lse")


def _prepared_run(p):
    """PreparedForward's call as one closure over what it checks and where it writes: each
    given tensor's dtype (is), shape, strides (a contiguous one: is_contiguous(), half the
    cost of stride(); the prepared strides then address the same elements) and device
    (get_device(): -1 for the CPU; x.device would cost ~1 us) against the prepared ones, its
    data pointer into the argument array, the stream, then one ctypes call. No loop and no
    attribute look-up on the way; it holds no reference to p."""
    sig, args, call = p._sig, p._args, p._call
    ptr = C.c_void_p(args.buffer_info()[0])       # the array is never resized: its address holds
    contiguous = [s is not None and _contiguous_strides(s[1]) == s[2] for s in sig]
    (qd, qs, qst, qv), (cd, cs, cst, cv), (od, os_, ost, ov) = sig[0], sig[3], sig[4]
    qc, cc, oc = contiguous[0], contiguous[3], contiguous[4]
    ks, vs, ls = sig[1], sig[2], sig[5]
    layer, meta, raw, dev = p.layer, p.meta, p._raw_stream, p._dev

    def run(q, kv_cache, out, lse=None, k=None, v=None):
        if q is None or q.dtype is not qd or q.shape != qs or q.get_device() != qv or \
                not (q.is_contiguous() if qc else q.stride() == qst):
            _prepared_refuse(sig, 0, q)
        if kv_cache is None or kv_cache.dtype is not cd or kv_cache.shape != cs or kv_cache.get_device() != cv or \
                not (kv_cache.is_contiguous() if cc else kv_cache.stride() == cst):
            _prepared_refuse(sig, 3, kv_cache)
        if out is None or out.dtype is not od or out.shape != os_ or out.get_device() != ov or \
                not (out.is_contiguous() if oc else out.stride() == ost):
            _prepared_refuse(sig, 4, out)
        args[9] = q.data_ptr()
        args[12] = kv_cache.data_ptr()
        args[13] = out.data_ptr()
        if lse is not None or ls is not None:
            if lse is None or ls is None or lse.dtype is not ls[0] or lse.shape != ls[1] or lse.stride() != ls[2] \
                    or lse.get_device() != ls[3]:
                _prepared_refuse(sig, 5, lse)
            args[14] = lse.data_ptr()
        if k is not None or v is not None or ks is not None:
            for i, x, s in ((1, k, ks), (2, v, vs)):
                if x is None or s is None or x.dtype is not s[0] or x.shape != s[1] or x.stride() != s[2] \
                        or x.get_device() != s[3]:
                    _prepared_refuse(sig, i, x)
                args[9 + i] = x.data_ptr()
        if not meta._ptr or not layer._ptr:
            raise ValueError("prepared forward: its %s is closed" % ("metadata" if not meta._ptr else "layer"))
        if raw is not None:
            args[8] = raw(dev)
        rc = call(ptr)
        if rc:
            layer._check(rc)
        return out
    run.structs = p._t   # what args points into lives as long as the closure
    return run


def _contiguous_strides(shape):
    """The strides (elements) of a C-contiguous tensor of this shape."""
    strides, step = [], 1
    for n in reversed(tuple(shape)):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _prepared_refuse(sig, i, x):
    """Raises the error for argument i of a prepared call (x: what the call got, sig: the
    prepared _torch_sig of each argument)."""
    name, s = _PREPARED_NAMES[i], sig[i]
    if x is None:
        _fail(ATTN_ERROR_INVALID_VALUE, "prepared forward: %s is None (allowed: a tensor like the "
              "prepared one, %s)" % (name, s[:3]))
    if s is None:
        _fail(ATTN_ERROR_INVALID_VALUE, "prepared forward: %s is given (allowed: None, as prepared; "
              "prepare again with it)" % name)
    if not _is_torch(x):
        raise TypeError("prepared forward: %s is a %s (allowed: a torch tensor like the prepared one)"
                        % (name, type(x).__name__))
    _fail(ATTN_ERROR_SHAPE_MISMATCH, "prepared forward: %s is %s (allowed: the prepared %s; prepare "
          "again for other shapes)" % (name, _torch_sig(x)[:3], s[:3]),
          _ITEM_DTYPE if x.dtype != s[0] else None)


_TORCH_LIB = None
_HANDLES = {}
# (layer handle, meta handle, k is None) -> weak reference to the op's PreparedForward for
# them (held by that Metadata): a live one holds its layer and metadata, whose ids (the
# handles) no other object can then have
_OP_FORWARDS = {}


def _handle_of(obj):
    """The int that stands for a Layer or Metadata in a custom op's arguments."""
    h = getattr(obj, "_op_handle", None)
    if h is None:
        h = obj._op_handle = id(obj)
        _HANDLES[h] = weakref.ref(obj)
    return h


def _from_handle(h, cls, name):
    ref = _HANDLES.get(int(h))
    obj = ref() if ref is not None else None
    if not isinstance(obj, cls):
        _fail(ATTN_ERROR_INVALID_VALUE, "attn_h op: %s handle %d names no live attn_h.%s (allowed: "
              "attn_h.op_handle(obj))" % (name, int(h), cls.__name__))
    return obj


def op_handle(obj: Any) -> int:
    """The int that passes a Layer or a Metadata to the torch.ops.attn_h ops (torch_ops())."""
    if not isinstance(obj, (Layer, Metadata)):
        raise TypeError("op_handle: obj is a %s (allowed: an attn_h.Layer or attn_h.Metadata)"
                        % type(obj).__name__)
    return _handle_of(obj)


def torch_ops() -> Any:
    """Registers attn.h's calls as PyTorch custom ops in the namespace attn_h (once) and
    returns torch.ops.attn_h. Layers and metadata pass as ints (op_handle); outputs are
    given, the ops return nothing (fake implementations for torch.compile's tracing):
      forward(layer, meta, q, kv_cache!, out!, lse!?, k?, v?)   (prepared per layer, metadata
              and tensor kinds: see PreparedForward)
      reshape_and_cache(layer, key, value, kv_cache!, slot_mapping)
      concat_and_cache_mla(layer, kv_c, k_pe, kv_cache!, slot_mapping)
      mla_forward_mqa(layer, meta, q, q_pe?, kv_cache, out_latent!, lse!?)
      mla_forward_mha(layer, meta, q, kv_cache, w_uk, w_uv, out!, lse!?)
      mla_forward_sparse(layer, meta, q, q_pe?, kv_cache, indices, out_latent!, lse!?)
      merge_attn_states(out_a, lse_a, out_b, lse_b, out!, lse!?)   (base e, on a context of
              the ops' own)
    Each runs on torch's current stream, so CUDA graphs capture it."""
    global _TORCH_LIB
    import torch
    if _TORCH_LIB is not None:
        return torch.ops.attn_h
    lib = torch.library.Library("attn_h", "DEF")
    defs = {
        "forward": "forward(int layer, int meta, Tensor q, Tensor(a!) kv_cache, Tensor(b!) out, "
                   "Tensor(c!)? lse=None, Tensor? k=None, Tensor? v=None) -> ()",
        "reshape_and_cache": "reshape_and_cache(int layer, Tensor key, Tensor value, Tensor(a!) kv_cache, "
                             "Tensor slot_mapping) -> ()",
        "concat_and_cache_mla": "concat_and_cache_mla(int layer, Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, "
                                "Tensor slot_mapping) -> ()",
        "mla_forward_mqa": "mla_forward_mqa(int layer, int meta, Tensor q, Tensor? q_pe, Tensor kv_cache, "
                           "Tensor(a!) out_latent, Tensor(b!)? lse=None) -> ()",
        "mla_forward_mha": "mla_forward_mha(int layer, int meta, Tensor q, Tensor kv_cache, Tensor w_uk, "
                           "Tensor w_uv, Tensor(a!) out, Tensor(b!)? lse=None) -> ()",
        "mla_forward_sparse": "mla_forward_sparse(int layer, int meta, Tensor q, Tensor? q_pe, Tensor kv_cache, "
                              "Tensor indices, Tensor(a!) out_latent, Tensor(b!)? lse=None) -> ()",
        "merge_attn_states": "merge_attn_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b, "
                             "Tensor(a!) out, Tensor(b!)? lse=None) -> ()",
    }
    for d in defs.values():
        lib.define(d)
    def forward(layer, meta, q, kv_cache, out, lse=None, k=None, v=None):
        # the prepared calls live on their Metadata (keyed by layer handle and whether k/v
        # come along), so they go with it: a cache here would keep every layer alive (the
        # cycle through p.meta is broken at close; the collector takes a dropped one).
        # _OP_FORWARDS finds them in one look-up, by weak reference.
        key = (layer, meta, k is None)
        ref = _OP_FORWARDS.get(key)
        p = ref() if ref is not None else None
        if p is not None:
            try:
                p._run(q, kv_cache, out, lse, k, v)
                return
            except AttnError as e:   # other tensor kinds: prepared again below
                if e.status != "ATTN_ERROR_SHAPE_MISMATCH" and e.status != "ATTN_ERROR_INVALID_VALUE":
                    raise
        M = _from_handle(meta, Metadata, "meta")
        p = M._op_prepared[(layer, k is None)] = PreparedForward(
            _from_handle(layer, Layer, "layer"), M, q, kv_cache, out, lse, k, v)
        _OP_FORWARDS[key] = weakref.ref(p, lambda r, key=key: _OP_FORWARDS.get(key) is r and _OP_FORWARDS.pop(key))

    def reshape_and_cache(layer, key, value, kv_cache, slot_mapping):
        _from_handle(layer, Layer, "layer").reshape_and_cache(key, value, kv_cache, slot_mapping)

    def concat_and_cache_mla(layer, kv_c, k_pe, kv_cache, slot_mapping):
        _from_handle(layer, Layer, "layer").concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping)

    def mla_forward_mqa(layer, meta, q, q_pe, kv_cache, out_latent, lse=None):
        _from_handle(layer, Layer, "layer").mla_forward_mqa(
            _from_handle(meta, Metadata, "meta"), q, kv_cache, out_latent, q_pe=q_pe, lse=lse)

    def mla_forward_mha(layer, meta, q, kv_cache, w_uk, w_uv, out, lse=None):
        _from_handle(layer, Layer, "layer").mla_forward_mha(
            _from_handle(meta, Metadata, "meta"), q, kv_cache, w_uk, w_uv, out, lse=lse)

    def mla_forward_sparse(layer, meta, q, q_pe, kv_cache, indices, out_latent, lse=None):
        _from_handle(layer, Layer, "layer").mla_forward_sparse(
            _from_handle(meta, Metadata, "meta"), q, kv_cache, indices, out_latent, q_pe=q_pe, lse=lse)

    merge_ctx = []   # the merge's own context, made at its first call

    def merge(out_a, lse_a, out_b, lse_b, out, lse=None):
        if not merge_ctx:
            merge_ctx.append(Context(log_level="warn"))
        merge_attn_states(merge_ctx[0], out_a, lse_a, out_b, lse_b, out=out, lse=lse)

    impls = dict(forward=forward, reshape_and_cache=reshape_and_cache,
                 concat_and_cache_mla=concat_and_cache_mla, mla_forward_mqa=mla_forward_mqa,
                 mla_forward_mha=mla_forward_mha, mla_forward_sparse=mla_forward_sparse,
                 merge_attn_states=merge)
    for name, f in impls.items():
        lib.impl(name, f, "CPU")
        lib.impl(name, f, "CUDA")
        # fake (meta) implementations: every op writes given outputs and returns nothing
        torch.library.register_fake("attn_h::" + name, lambda *a, **kw: None, lib=lib)
    _TORCH_LIB = lib
    return torch.ops.attn_h


# ---- free functions --------------------------------------------------------------------

def merge_attn_states(ctx: Context, out_a: Array, lse_a: Array, out_b: Array, lse_b: Array,
                      out: Optional[Array] = None, lse: Optional[Array] = None, base_a: Union[str, int] = "e",
                      base_b: Union[str, int] = "e", base_out: Union[str, int] = "e", stream: Stream = None) -> Array:
    """out = merge((out_a, lse_a), (out_b, lse_b)) of two partial attention results:
    out_* [tokens, heads, head_size] of one dtype, lse_* float32 [tokens, heads] in base
    base_a / base_b ('e' or 2). out (allocated like out_a when None) may alias out_a or
    out_b; lse: None or where the merged LSE goes, in base base_out. Returns out."""
    fn = "merge_attn_states"
    _need(ctx, Context, "ctx", fn)
    ta = _tensor(out_a, "out_a", fn)
    if out is None:
        out = _empty_like(out_a, _shape_of(out_a, "out_a", fn), ta.dtype)
    ctx._check(library().attn_merge_attn_states(
        ctx._live(), _ref(ta), _ref(_tensor(lse_a, "lse_a", fn)),
        _base(base_a, "base_a"), _ref(_tensor(out_b, "out_b", fn)),
        _ref(_tensor(lse_b, "lse_b", fn)), _base(base_b, "base_b"),
        _ref(_tensor(out, "out", fn, write=True)), _ref(_tensor(lse, "lse", fn, write=True)),
        _base(base_out, "base_out"), _stream(stream, out_a)))
    return out


def dcp_local_tokens(world_size: int, rank: int, interleave: int, position: int) -> int:
    """Decode context parallelism: how many of positions [0, position) rank `rank` of
    `world_size` holds with runs of `interleave` tokens (the local index of its token at
    `position`). Raises ValueError for arguments attn.h refuses."""
    n = library().attn_dcp_local_tokens(int(world_size), int(rank), int(interleave), int(position))
    if n < 0:
        raise ValueError("dcp_local_tokens(%r, %r, %r, %r): allowed world_size 1..64, rank 0..world_size-1, "
                         "interleave 1..65536, position >= 0" % (world_size, rank, interleave, position))
    return int(n)


def dcp_combine(ctx: Context, outs: Sequence[Array], lses: Sequence[Array], out: Optional[Array] = None,
                lse: Optional[Array] = None, stream: Stream = None) -> Array:
    """Joins the DCP ranks' partials (out_i [tokens, heads, head_size], lse_i float32
    [tokens, heads], base e) by LSE into out (allocated like outs[0] when None) and lse (None:
    not written; CUDA tensors of different strides need it, as the running LSE of the
    pairwise fold). Returns out."""
    fn = "dcp_combine"
    _need(ctx, Context, "ctx", fn)
    if not isinstance(outs, (list, tuple)) or not isinstance(lses, (list, tuple)) or len(outs) != len(lses) \
            or not outs or len(outs) > 64:
        raise ValueError("%s: outs and lses must be lists of the same length, 1..64 (got %s of %s and %s of %s)"
                         % (fn, type(outs).__name__, len(outs) if hasattr(outs, "__len__") else "?",
                            type(lses).__name__, len(lses) if hasattr(lses, "__len__") else "?"))
    ts = [_tensor(o, "outs[%d]" % i, fn) for i, o in enumerate(outs)]
    ls = [_tensor(x, "lses[%d]" % i, fn) for i, x in enumerate(lses)]
    if out is None:
        out = _empty_like(outs[0], _shape_of(outs[0], "outs[0]", fn), ts[0].dtype)
    po = (_TP * len(ts))(*[C.pointer(t) for t in ts])   # ts, ls stay referenced through the call
    pl = (_TP * len(ls))(*[C.pointer(t) for t in ls])
    ctx._check(library().attn_dcp_combine(ctx._live(), len(ts), po, pl, _ref(_tensor(out, "out", fn, write=True)),
                                          _ref(_tensor(lse, "lse", fn, write=True)),
                                          _stream(stream, outs[0] if outs else None)))
    return out


def dcp_all_gather_combine(ctx: Context, out: Any, lse: Any, group: Any = None, combined_out: Any = None,
                           combined_lse: Any = None) -> Tuple[Any, Any]:
    """The torch.distributed path of decode context parallelism: gathers every rank's partial
    (out [tokens, heads, head_size], lse float32 [tokens, heads], from a forward on a DCP
    metadata without a communicator) over `group` (None: the default process group; NCCL for
    CUDA tensors, gloo for CPU ones) with torch.distributed.all_gather, and joins them with
    dcp_combine in rank order. Returns (combined_out, combined_lse), allocated like out/lse
    when None."""
    import torch
    import torch.distributed as dist
    fn = "dcp_all_gather_combine"
    if not isinstance(out, torch.Tensor) or not isinstance(lse, torch.Tensor):
        raise TypeError("%s: out and lse must be torch tensors (got %s, %s)" % (fn, type(out).__name__,
                                                                               type(lse).__name__))
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("%s: torch.distributed is not initialised (init_process_group first)" % fn)
    world = dist.get_world_size(group)
    out, lse = out.contiguous(), lse.contiguous()
    outs = [torch.empty_like(out) for _ in range(world)]
    lses = [torch.empty_like(lse) for _ in range(world)]
    dist.all_gather(outs, out, group=group)
    dist.all_gather(lses, lse, group=group)
    if combined_out is None:
        combined_out = torch.empty_like(out)
    if combined_lse is None:
        combined_lse = torch.empty_like(lse)
    dcp_combine(ctx, outs, lses, combined_out, combined_lse)
    return combined_out, combined_lse


def reorder_batch(query_lens: Array, decode_threshold: int = 0) -> Tuple[Any, int]:
    """Decodes-first order for an MLA batch: (perm, num_decodes), perm[new] = old, the
    requests with query_len <= decode_threshold (0: 1) first, with the fewest moves."""
    lens = _host_ints(query_lens, "query_lens", "reorder_batch", C.c_int32).reshape(-1)
    perm = np.empty(lens.size, dtype=np.int32)
    num_decodes = C.c_int()
    _check(library().attn_reorder_batch(_ptr(lens, C.c_int32), lens.size, int(decode_threshold),
                                        _ptr(perm, C.c_int32), C.byref(num_decodes), None),
           None)
    return perm, num_decodes.value


def mla_num_kv_splits(max_seq_len: int, parallelism: int, batch_invariant: bool = False) -> int:
    """The split-KV count attn.h uses for MLA decode (see attn_mla_num_kv_splits)."""
    return library().attn_mla_num_kv_splits(int(max_seq_len), int(parallelism),
                                            int(bool(batch_invariant)))


library()   # load now: a missing library or a stale mirror fails at import


def main(argv=None):
    """python -m attn_h info [--heads N --kv-heads N --head-size N --dtype T --device D
    --mla]: the platform and the selection record of one layer, as attn-info prints them.
    Returns the exit status (0 resolved, 1 not, 2 bad arguments)."""
    import argparse
    import sys
    parser = argparse.ArgumentParser(prog="python -m attn_h", description=main.__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    info = sub.add_parser("info", help="the platform and the selection record of one layer")
    info.add_argument("--heads", type=int, default=32)
    info.add_argument("--kv-heads", type=int, default=None)
    info.add_argument("--head-size", type=int, default=None)
    info.add_argument("--dtype", default="float16")
    info.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    info.add_argument("--mla", action="store_true", help="DeepSeek's MLA dims (latent 512 + 64)")
    args = parser.parse_args(argv)
    if args.cmd != "info":
        parser.print_help()
        return 2
    print("attn_h %s (attn.h %s)" % (__version__, VERSION if _lib else "not loaded yet"))
    with Context(log_level="none") as ctx:
        print(ctx.platform_text)
        mla = (dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
               if args.mla else None)
        kv = args.kv_heads if args.kv_heads is not None else (None if args.mla else 8)
        try:
            layer = Layer(ctx, num_heads=args.heads, num_kv_heads=kv, head_size=args.head_size or
                          (None if args.mla else 128), dtype=args.dtype, device=args.device, mla=mla)
        except AttnError as e:
            print("no backend: %s" % e, file=sys.stderr)
            return 1
        print(layer.selection_text)
        layer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
