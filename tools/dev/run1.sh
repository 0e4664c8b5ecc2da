#!/usr/bin/env bash
# session device run 1: correctness of the launch change + decode tuning sweep
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu-out}; mkdir -p "$OUT/logs" build
L=$OUT/logs
export ATTN_CACHE_DIR=$PWD/build/kernel-cache
S=$OUT/summary.txt; : > $S
sum() { printf '%-34s %s\n' "$1" "$2" | tee -a $S; }
last() { grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1; }
t0=$(date +%s)
make -j16 build/attn_tests build/cuda_kernels build/attn-bench > $L/build.log 2>&1 || { sum build FAILED; tail -30 $L/build.log; exit 1; }
sum build "ok $(( $(date +%s) - t0 )) s"
t0=$(date +%s); timeout 300 ./build/attn_tests cuda > $L/cuda-suite.log 2>&1
sum "cuda suite" "$(last $L/cuda-suite.log) $(( $(date +%s) - t0 )) s"; grep -E '^  (FAIL|SKIP)' $L/cuda-suite.log | head
t0=$(date +%s); timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/attn_tests cuda > $L/memcheck.log 2>&1
sum memcheck "exit $? $(last $L/memcheck.log) $(grep -c 'Invalid\|========= Error' $L/memcheck.log) err lines $(( $(date +%s) - t0 )) s"
t0=$(date +%s); timeout 120 ./build/cuda_kernels --cases 40 > $L/harness.log 2>&1
sum harness "$(last $L/harness.log) $(( $(date +%s) - t0 )) s"
i=0
for x in "" "KV_STAGES=4" "KV_STAGES=6" "KV_TILE=32 WARPS_N=2 KV_STAGES=6" "KV_TILE=32 WARPS_N=2 KV_STAGES=4" "KV_TILE=128 WARPS_N=8 KV_STAGES=3" "KV_STAGES=2" "KV_TILE=32 WARPS_N=2 KV_STAGES=3" "KV_TILE=32 WARPS_N=2 KV_STAGES=12" "KV_TILE=64 WARPS_N=2 KV_STAGES=3"; do
  i=$((i+1)); timeout 60 ./build/cuda_kernels --decode-bench --defines "$x" > $L/sweep$i.log 2>&1
  echo "== [$x]" >> $OUT/sweep.txt; grep -E "batch" $L/sweep$i.log >> $OUT/sweep.txt
done
sum sweep "$i configs (sweep.txt)"
t0=$(date +%s); timeout 240 ./build/attn-bench --device cuda --quick --csv $OUT/attn-bench.csv > $L/attn-bench.log 2>&1
sum attn-bench "exit $? $(( $(date +%s) - t0 )) s"
if command -v ncu >/dev/null; then
  timeout 90 ncu --kernel-name attn_paged_attention --launch-skip 95 --launch-count 1 --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,lts__t_sector_hit_rate.pct ./build/cuda_kernels --decode-bench > $L/ncu.log 2>&1
  sum ncu "exit $? (ncu.log)"
else sum ncu "not installed"; fi
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S; echo; sed -E 's/ +/ /g; s/ctas [0-9]+ //; s/\(([0-9]+) per SM, ([0-9]+) threads, [0-9]+ B shared\)/\1x\2/; s/context //' sweep.txt; grep -E "floor|decode|prefill" logs.tgz >/dev/null; tar xzf logs.tgz -O logs/attn-bench.log | grep -E "^ *(batch|decode|prefill|mixed|launch|read|matmul)" | head -40
