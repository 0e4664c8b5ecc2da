#!/usr/bin/env bash
# One device call within a time budget: build, the CUDA suites (cold compile, then from the
# disk cache), the named tests under compute-sanitizer memcheck, the pytest suite on CUDA
# tensors, and the CUDA bench (build/attn-bench-cuda) with whatever time is left. Logs under $OUT
# (default build/gpu-out); a short table last.
#   usage: tools/gpu-quick.sh [BUDGET_SECONDS (default 540)]
#   MEMCHECK_TESTS  comma-separated test names for memcheck (ATTN_TEST_ONLY; default: none)
#   PYTEST_K        pytest -k expression (default: all of tests/python/test_attn_h.py)
#   BENCH_ARGS      extra attn-bench-cuda arguments (default: none = the whole default run)
#   PEER=1          also tools/torch_peer.py --quick (PyTorch on the same shapes), after the bench
#   HARNESS=1       also the kernel harness (cuda_kernels, paged and MLA kernels against the CPU)
#   SM90_CASES=N    also the sm_90a prefill (CUDA_SM90's wgmma tiles) against the CPU, N cases
#   SUITES          the runner's suite filters after the cold CUDA run (default: outside)
#   NO_BENCH=1      skip the CUDA bench
set -u
cd "$(dirname "$0")/.."
budget=${1:-540}
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT" build
export ATTN_CACHE_DIR=${ATTN_CACHE_DIR:-$PWD/build/kernel-cache}
: > "$OUT/summary.txt"
summary() { printf '%-30s %s\n' "$1" "$2" | tee -a "$OUT/summary.txt" >/dev/null; }
last() { grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1; }
summary "gpu" "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null | head -1)"
t0=$(date +%s)
if ! make -j"$(nproc)" build/attn_tests build/attn-bench build/attn-bench-cuda build/libattn.so build/cuda_kernels > "$OUT/build.log" 2>&1; then
    summary "build" "FAILED (build.log)"; tail -n 30 "$OUT/build.log"; cat "$OUT/summary.txt"; exit 1
fi
summary "build" "ok ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout $(( $(left) / 2 )) ./build/attn_tests cuda > "$OUT/cuda-suite.log" 2>&1
summary "cuda suites (cold)" "$(last "$OUT/cuda-suite.log") ($(( $(date +%s) - t0 )) s)"
grep -E '^  FAIL|^FAIL' "$OUT/cuda-suite.log" | head -n 12 >> "$OUT/summary.txt"
for suite in ${SUITES:-outside}; do
    t0=$(date +%s)
    timeout 200 ./build/attn_tests "$suite" > "$OUT/suite-$suite.log" 2>&1
    summary "suites '$suite'" "$(last "$OUT/suite-$suite.log") ($(( $(date +%s) - t0 )) s)"
    grep -E '^  FAIL|^FAIL' "$OUT/suite-$suite.log" | head -n 8 >> "$OUT/summary.txt"
done
if [ -n "${MEMCHECK_TESTS:-}" ] && command -v compute-sanitizer >/dev/null 2>&1; then
    t0=$(date +%s)
    ATTN_TEST_ONLY=$MEMCHECK_TESTS timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
        ./build/attn_tests cuda > "$OUT/memcheck.log" 2>&1
    summary "memcheck" "exit $?, $(grep -c 'Invalid\|ERROR SUMMARY: [1-9]' "$OUT/memcheck.log") error lines; $(last "$OUT/memcheck.log") ($(( $(date +%s) - t0 )) s)"
fi
if [ -n "${HARNESS:-}" ]; then
    t0=$(date +%s)
    timeout 90 ./build/cuda_kernels --cases 6 > "$OUT/harness.log" 2>&1
    summary "kernel harness" "$(last "$OUT/harness.log") ($(( $(date +%s) - t0 )) s)"
    t0=$(date +%s)
    timeout 90 ./build/cuda_kernels --mla --cases 6 > "$OUT/harness-mla.log" 2>&1
    summary "kernel harness (MLA)" "$(last "$OUT/harness-mla.log") ($(( $(date +%s) - t0 )) s)"
fi
if [ -n "${SM90_CASES:-}" ]; then
    t0=$(date +%s)
    timeout 150 ./build/cuda_kernels --sm90-prefill --cases "$SM90_CASES" > "$OUT/sm90-prefill.log" 2>&1
    summary "sm_90a prefill harness" "$(last "$OUT/sm90-prefill.log") ($(( $(date +%s) - t0 )) s)"
fi
if python3 -c 'import numpy, pytest, torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    t0=$(date +%s)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/python/test_attn_h.py ${PYTEST_K:+-k "$PYTEST_K"} \
        > "$OUT/pytest.log" 2>&1
    summary "pytest (torch CUDA)" "exit $?; $(tail -n 1 "$OUT/pytest.log") ($(( $(date +%s) - t0 )) s)"
fi
if [ -z "${NO_BENCH:-}" ] && [ "$(left)" -gt 60 ]; then
    t0=$(date +%s)
    # shellcheck disable=SC2086
    timeout $(( $(left) - 15 )) ./build/attn-bench-cuda --csv "$OUT/attn-bench.csv" ${BENCH_ARGS:-} \
        > "$OUT/attn-bench.log" 2>&1
    summary "attn-bench-cuda" "exit $? ($(( $(date +%s) - t0 )) s)"
fi
if [ -n "${PEER:-}" ] && [ "$(left)" -gt 60 ]; then
    t0=$(date +%s)
    timeout $(( $(left) - 10 )) python3 tools/torch_peer.py --quick --csv "$OUT/torch-peer.csv" > "$OUT/torch-peer.log" 2>&1
    summary "torch peer (--quick)" "exit $? ($(( $(date +%s) - t0 )) s)"
fi
cat "$OUT/summary.txt"
