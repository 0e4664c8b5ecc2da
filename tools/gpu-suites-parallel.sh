#!/usr/bin/env bash
# The CUDA suites of build/attn_tests on a fresh GPU machine in a fraction of the time one
# process needs: a cold run is NVRTC compiles, one variant after another, so the suites run
# as several processes at once (each its own kernel cache directory: the compile-count and
# cache-fault tests of suite_cuda_compile expect a cache they alone fill), then the named
# tests once more under compute-sanitizer memcheck from a warm cache. Logs under $OUT; one
# line per group, then the totals.
#   usage: tools/gpu-suites-parallel.sh [MEMCHECK_TESTS (comma-separated; default none)]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
groups="cuda_reject cuda_forward cuda_cache cuda_merge cuda_graph cuda_compile cuda_mla found dcp"
pids=""
for g in $groups; do
    ( ATTN_CACHE_DIR=$PWD/build/kc-$g timeout 420 ./build/attn_tests "$g" > "$OUT/suite-$g.log" 2>&1 ) &
    pids="$pids $!"
done
wait $pids
P=0 F=0 S=0
for g in $groups; do
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/suite-$g.log" | tail -n 1)
    printf '%-14s %s\n' "$g" "${line:-no summary line (timed out?)}"
    grep -E '^  FAIL|^FAIL' "$OUT/suite-$g.log" | head -n 6
    if [ -n "$line" ]; then
        P=$((P + $(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')))
        F=$((F + $(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
        S=$((S + $(echo "$line" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p')))
    else
        F=$((F + 1))
    fi
done
echo "suites: $P passed, $F failed, $S skipped"
if [ -n "${1:-}" ] && command -v compute-sanitizer >/dev/null 2>&1; then
    ATTN_CACHE_DIR=$PWD/build/kc-found ATTN_TEST_ONLY=$1 timeout 200 compute-sanitizer --tool memcheck \
        --error-exitcode 9 ./build/attn_tests cuda > "$OUT/memcheck.log" 2>&1
    echo "memcheck: exit $?, $(grep -c 'Invalid ' "$OUT/memcheck.log") invalid accesses; $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)"
fi
