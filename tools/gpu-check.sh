#!/usr/bin/env bash
# The GPU half of the suite, for a machine with a CUDA device (CI has none): builds the test
# runner, runs the CUDA suites against the CPU backend, the same under compute-sanitizer
# (memcheck, then racecheck on a subset), the whole runner, python/attn_h.py's pytest suite
# on CUDA tensors (where torch is installed; with transformers 5.17 it runs the transformers
# example too) and tools/loader_check.sh, the kernel harness and its benchmark, the wgmma
# probes and the sm_90a prefill (CUDA_SM90) against the CPU backend, the MLA kernels (and their timing), the
# backend's benchmark (build/attn-bench-cuda) and the PyTorch peer on the same shapes.
# Logs under $OUT (default build/gpu-out); a short table last.
#   usage: tools/gpu-check.sh [--quick | --bench-only]
#   RACECHECK_TIMEOUT (seconds, default 330): racecheck's limit over the cuda suite (the whole
#   suite needs about 400-600 s under it on the H200).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT" build
export ATTN_CACHE_DIR=${ATTN_CACHE_DIR:-$PWD/build/kernel-cache}
summary() { printf '%-28s %s\n' "$1" "$2" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1; summary "gpu" "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
t0=$(date +%s)
if ! make -j"$(nproc)" build/attn_tests build/cuda_kernels build/attn-bench build/attn-bench-cuda build/wgmma_check build/codes_check > "$OUT/build.log" 2>&1; then
    summary "build" "FAILED (see build.log)"; tail -n 30 "$OUT/build.log"; exit 1
fi
summary "build" "ok ($(( $(date +%s) - t0 )) s)"
last() { grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1; }
backend_bench() {
    timeout 300 ./build/attn-bench-cuda --csv "$OUT/attn-bench.csv" > "$OUT/attn-bench-cuda.log" 2>&1
    summary "attn-bench-cuda" "exit $? (attn-bench-cuda.log)"
    if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
        timeout 300 python3 tools/torch_peer.py --csv "$OUT/torch-peer.csv" > "$OUT/torch-peer.log" 2>&1
        summary "torch peer" "exit $? (torch-peer.log)"
        timeout 200 python3 tools/torch_peer.py --mla-only --csv "$OUT/torch-peer-mla.csv" > "$OUT/torch-peer-mla.log" 2>&1
        summary "torch peer (MLA)" "exit $? (torch-peer-mla.log)"
    fi
}
if [ "${1:-}" = "--bench-only" ]; then backend_bench; cat "$OUT/summary.txt"; exit 0; fi
t0=$(date +%s)
timeout 400 ./build/attn_tests cuda > "$OUT/cuda-suite.log" 2>&1
summary "cuda suite (cold compile)" "$(last "$OUT/cuda-suite.log") ($(( $(date +%s) - t0 )) s)"
grep -E '^  (FAIL|SKIP)' "$OUT/cuda-suite.log" | head -n 20
t0=$(date +%s)
timeout 120 ./build/attn_tests cuda > "$OUT/cuda-suite-warm.log" 2>&1
summary "cuda suite (disk cache)" "$(last "$OUT/cuda-suite-warm.log") ($(( $(date +%s) - t0 )) s)"
if command -v compute-sanitizer >/dev/null 2>&1; then
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/attn_tests cuda \
        > "$OUT/memcheck.log" 2>&1
    rc=$?
    summary "memcheck" "exit $rc, $(grep -c 'Invalid\|Error' "$OUT/memcheck.log") error lines; $(last "$OUT/memcheck.log")"
    [ "${1:-}" = "--quick" ] || {
        timeout "${RACECHECK_TIMEOUT:-330}" compute-sanitizer --tool racecheck --error-exitcode 9 \
            ./build/attn_tests cuda > "$OUT/racecheck.log" 2>&1
        summary "racecheck (cuda suite)" "exit $?; $(grep -c 'Race\|Hazard' "$OUT/racecheck.log") hazard lines; $(last "$OUT/racecheck.log")"
    }
else
    summary "compute-sanitizer" "not installed"
fi
timeout 300 ./build/attn_tests > "$OUT/all-suites.log" 2>&1
summary "all suites" "$(last "$OUT/all-suites.log")"
grep -E '^  FAIL' "$OUT/all-suites.log" | head -n 10
if python3 -c 'import numpy, pytest, torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    make build/libattn.so >> "$OUT/build.log" 2>&1
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/python/test_attn_h.py \
        > "$OUT/pytest.log" 2>&1
    summary "pytest (attn_h, torch CUDA)" "exit $?; $(tail -n 1 "$OUT/pytest.log")"
    # NVRTC and cuBLAS from PyTorch's wheels with the toolkit's folder hidden (issue 24 section 2)
    if command -v unshare >/dev/null 2>&1; then
        timeout 200 tools/loader_check.sh "$OUT/loader-check" > "$OUT/loader-check.log" 2>&1
        summary "loader check" "exit $?; $(tail -n 1 "$OUT/loader-check.log")"
    else
        summary "loader check" "skipped: no unshare"
    fi
else
    summary "pytest (attn_h, torch CUDA)" "skipped: needs python3 with numpy, pytest, CUDA torch"
fi
timeout 200 ./build/cuda_kernels > "$OUT/cuda-kernels.log" 2>&1
summary "kernel harness" "$(last "$OUT/cuda-kernels.log")"
timeout 60 ./build/wgmma_check > "$OUT/wgmma-check.log" 2>&1
summary "wgmma probes (sm_90a)" "$(last "$OUT/wgmma-check.log")"
# the 8-bit KV-cache codes on the device against the CPU's conversions, bit for bit
timeout 60 ./build/codes_check > "$OUT/codes-check.log" 2>&1
summary "8-bit codes (device)" "$(last "$OUT/codes-check.log")"
# the Hopper prefill (kernels/paged_prefill_sm90.cu): against the CPU backend on sm_90
timeout 200 ./build/cuda_kernels --sm90-prefill --cases 200 > "$OUT/sm90-prefill.log" 2>&1
summary "sm_90a prefill" "$(last "$OUT/sm90-prefill.log")"
# MLA kernels: the mma.sync decode draft (kernels/wip/), CUDA_MLA_SM90's wgmma decode and
# prefill attention, against float64; with the timings of issue 9's shapes (the backend
# itself: the cuda suites above run suite_cuda_mla; its table: attn-bench's MLA part)
timeout 200 ./build/cuda_kernels --mla --cases 24 --bench > "$OUT/mla-kernels.log" 2>&1
summary "mla kernels" "$(last "$OUT/mla-kernels.log")"
[ "${1:-}" = "--quick" ] || {
    timeout 200 ./build/cuda_kernels --bench > "$OUT/cuda-bench.log" 2>&1
    summary "kernel bench" "exit $? (cuda-bench.log)"
    timeout 200 ./build/cuda_kernels --prefill-bench --sm90-prefill > "$OUT/sm90-prefill-bench.log" 2>&1
    summary "sm90 prefill bench" "exit $? (sm90-prefill-bench.log)"
    backend_bench
}
cat "$OUT/summary.txt"
