#!/usr/bin/env bash
# Runs every test build of attn.h and prints the total as the last line:
#   N passed, N failed, N skipped
# Each binary's own closing line is added in; single checks (header compiles, demo,
# embedded-kernel freshness, the fuzz run, the transformers releases) count one each. A check
# whose tool is not installed (clang, python3, numpy, pytest, the libFuzzer runtime, a venv with
# pip and PyPI for the transformers venvs) is skipped with the reason.
# Full logs go to build/test-logs/.
set -u
cd "$(dirname "$0")/.."
logs=build/test-logs
mkdir -p "$logs"
P=0 F=0 S=0

# run NAME CMD... : a test binary that ends with "N passed, N failed[, N skipped]"
run() {
    local name=$1; shift
    local log="$logs/$name.log"
    echo "=== $name"
    "$@" >"$log" 2>&1
    local rc=$?
    grep -E '^(FAIL|  FAIL|  SKIP)' "$log" | head -n 30
    grep -m 3 -E '^(WARNING|ERROR): [A-Za-z]+Sanitizer|runtime error:' "$log"
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "    no summary line (exit $rc); see $log"; tail -n 20 "$log"
        F=$((F + 1)); return
    fi
    echo "    $line"
    local p f s
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p')
    P=$((P + p)); F=$((F + f)); S=$((S + ${s:-0}))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "    exit $rc with no failed test"; F=$((F + 1)); fi
}

# check NAME CMD... : one pass or fail
check() {
    local name=$1; shift
    local log="$logs/$name.log"
    if "$@" >"$log" 2>&1; then echo "ok   $name"; P=$((P + 1));
    else echo "FAIL $name (see $log)"; tail -n 15 "$log"; F=$((F + 1)); fi
}

skip() { echo "SKIP $1: $2"; S=$((S + 1)); }

# need NAME TOOL : true if TOOL is installed; else NAME is skipped, saying so
need() {
    command -v "$2" >/dev/null 2>&1 && return 0
    skip "$1" "$2 not installed"; return 1
}

# The CUDA driver's own allocations are not ours to report (see the file).
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"

# The header compiles warning-free as C99, C11 and C++17 (the implementation included).
hdr=$(mktemp -d)
printf '#define ATTN_IMPLEMENTATION\n#include "attn.h"\nint main(void){return 0;}\n' >"$hdr/t.c"
cp "$hdr/t.c" "$hdr/t.cpp"
need header-c99-gcc gcc && \
check header-c99-gcc     gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -I. -c "$hdr/t.c" -o "$hdr/a.o"
need header-c11-clang clang && \
check header-c11-clang   clang -std=c11 -Wall -Wextra -Wpedantic -Werror -I. -c "$hdr/t.c" -o "$hdr/b.o"
need header-cxx17-gxx g++ && \
check header-cxx17-gxx   g++ -std=c++17 -Wall -Wextra -Werror -I. -c "$hdr/t.cpp" -o "$hdr/c.o"
need header-cxx17-native g++ && \
check header-cxx17-native g++ -std=c++17 -Wall -Wextra -Werror -O2 -march=native -I. -c "$hdr/t.cpp" -o "$hdr/d.o"
need header-c99-O3-native gcc && \
check header-c99-O3-native gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O3 -march=native -I. -c "$hdr/t.c" -o "$hdr/g.o"
need header-c99-avx2 gcc && \
check header-c99-avx2    gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -mavx2 -mfma -mf16c -I. -c "$hdr/t.c" -o "$hdr/e.o"
need header-c99-static gcc && \
check header-c99-static  gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -DATTN_STATIC -Wno-unused-function -I. -c "$hdr/t.c" -o "$hdr/f.o"
# The SIMD variants: compile-time choice only (ATTN_NO_SIMD_DISPATCH); the header including
# itself per variant from another directory than the includer's, and as a renamed copy
# (ATTN_SELF_INCLUDE)
need header-c99-no-dispatch gcc && \
check header-c99-no-dispatch gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -DATTN_NO_SIMD_DISPATCH -I. -c "$hdr/t.c" -o "$hdr/h.o"
self_include() {
    mkdir -p "$hdr/inc" "$hdr/src" && cp attn.h "$hdr/inc/attn.h" && cp attn.h "$hdr/inc/attn_copy.h" &&
    printf '#define ATTN_IMPLEMENTATION\n#include "../inc/attn.h"\nint main(void){return 0;}\n' >"$hdr/src/a.c" &&
    printf '#define ATTN_IMPLEMENTATION\n#define ATTN_SELF_INCLUDE "attn_copy.h"\n#include "attn_copy.h"\nint main(void){return 0;}\n' >"$hdr/src/b.c" &&
    gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -c "$hdr/src/a.c" -o "$hdr/i.o" &&
    clang -std=c99 -Wall -Wextra -Wpedantic -Werror -I "$hdr/inc" -c "$hdr/src/b.c" -o "$hdr/j.o" &&
    nm "$hdr/i.o" | grep -q 'attn__cpu_kernels_avx512' && nm "$hdr/j.o" | grep -q 'attn__cpu_kernels_avx2'
}
need header-self-include clang && check header-self-include self_include
# ATTN_NO_CUDA removes the CUDA path whole: loaders, their state, the embedded kernels (the
# object keeps under half the full one's size; tests-plain-c-no-cuda checks that no library
# is opened)
no_cuda_size() {
    local full small
    gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -I. -c "$hdr/t.c" -o "$hdr/full.o" &&
    gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -DATTN_NO_CUDA -I. -c "$hdr/t.c" -o "$hdr/nocuda.o" || return 1
    full=$(size "$hdr/full.o" | awk 'NR == 2 {print $1 + $2}')
    small=$(size "$hdr/nocuda.o" | awk 'NR == 2 {print $1 + $2}')
    echo "text+data: $full bytes with the CUDA path, $small with ATTN_NO_CUDA"
    [ $((small * 2)) -lt "$full" ]
}
need header-no-cuda-size gcc && check header-no-cuda-size no_cuda_size
rm -rf "$hdr"
need embedded-kernels-fresh python3 && \
check embedded-kernels-fresh python3 tools/embed.py --check attn.h kernels
# Every kernel variant of tools/nvrtc-check's manifest compiles with NVRTC for sm_80 and
# sm_90 with no spill; needs libnvrtc (the CUDA toolkit or the nvrtc package), no GPU.
if nvrtc_probe=$(./build/nvrtc-check --probe 2>&1); then
    check nvrtc-kernels ./build/nvrtc-check
else
    skip nvrtc-kernels "$(echo "$nvrtc_probe" | tail -n 1)"
fi
# kernels/wgmma.cuh: its probes compile for sm_90a with no spill and the sm_90 guard holds
# (no GPU needed; on an H200/H100 the probes also run against a float64 reference).
run wgmma-probe ./build/wgmma_check
# the 8-bit cache codes on the device against the CPU's conversions (compiles without a GPU)
run codes-check ./build/codes_check
# kernels/hopper.cuh: its TMA/mbarrier probes compile for sm_90 and sm_90a with no spill, the
# sm_80 guard holds, the tensor-map encoder says why it cannot run here (on an H200/H100 the
# probes copy tiles and paged K/V through TMA pipelines, compared bit for bit)
run hopper-probe ./build/hopper_check
# kernels/paged_prefill_sm90.cu (CUDA_SM90's wgmma prefill): its variants compile for
# sm_90a with no spill and fit the shared memory (no GPU needed; on compute capability 9.0
# the harness also runs it against the CPU backend).
run sm90-prefill ./build/cuda_kernels --sm90-prefill --cases 0
# The MLA kernels: CUDA_MLA_SM90's decode and prefill (sm_90a), CUDA_MLA's on mma.sync, and the drafts of
# the fallback (kernels/wip/mla_decode.cu, kernels/wip/mla_prefill.cu): their variants
# compile with no spill (no GPU needed; on a GPU the harness also runs them against a
# float64 reference: ./build/cuda_kernels --mla --cases 25 --bench).
run mla-kernels ./build/cuda_kernels --mla --cases 0

run tests-native ./build/attn_tests
if grep -q ' avx2 ' /proc/cpuinfo && grep -q ' fma ' /proc/cpuinfo && grep -q ' f16c ' /proc/cpuinfo; then
    # the build also has the avx512 variant, which an AVX-512 CPU would pick: force avx2
    run tests-avx2 env ATTN_TEST_SCALE=0.5 ATTN_CPU_SIMD=avx2 ./build/attn_tests_avx2
else
    skip tests-avx2 "this CPU lacks AVX2/FMA/F16C"
fi
run tests-plain-c-no-cuda env ATTN_TEST_SCALE=0.5 ./build/attn_tests_c
run tests-no-threads env ATTN_TEST_SCALE=0.3 ./build/attn_tests_nothreads
# LeakSanitizer's own tracer now and then dies at exit on these shared VMs ("Tracer caught
# signal 11 ... LeakSanitizer has encountered a fatal error": its stop-the-world, not a leak,
# which it reports as "ERROR: LeakSanitizer: detected memory leaks"); only that failure
# reruns the build once, saying so.
asan_run() {
    env ATTN_TEST_SCALE=0.2 ASAN_OPTIONS=detect_leaks=1 ./build/attn_tests_asan; local rc=$?
    if [ "$rc" -ne 0 ] && grep -q 'LeakSanitizer has encountered a fatal error' "$logs/tests-asan-ubsan.log" &&
        ! grep -q 'detected memory leaks' "$logs/tests-asan-ubsan.log"; then
        echo "run_all: LeakSanitizer's tracer failed (not a leak report); running the ASan build once more"
        env ATTN_TEST_SCALE=0.2 ASAN_OPTIONS=detect_leaks=1 ./build/attn_tests_asan; rc=$?
    fi
    return "$rc"
}
run tests-asan-ubsan asan_run

# ThreadSanitizer: a twentieth of the random cases, and not the one big fixed-size test
# (its float64 reference alone would take TSan a quarter of a minute). Kernels that map
# memory where TSan wants its shadow make it refuse to start: then once more without
# address-space randomisation.
tsan() {
    "$@"; local rc=$?
    if [ "$rc" -ne 0 ] && grep -q 'ThreadSanitizer: unexpected memory mapping' "$logs/tests-tsan.log" &&
        command -v setarch >/dev/null 2>&1; then
        setarch "$(uname -m)" -R "$@"; rc=$?
    fi
    return "$rc"
}
run tests-tsan tsan env ATTN_TEST_SCALE=0.05 ATTN_TEST_SKIP=test_forward_llama_shapes \
    TSAN_OPTIONS=halt_on_error=0 ./build/attn_tests_tsan

if ! command -v python3 >/dev/null 2>&1; then skip python-numpy "python3 not installed"
elif ! python3 -c 'import numpy' >/dev/null 2>&1; then skip python-numpy "numpy not installed"
else run python-numpy python3 tests/python/check_numpy.py
fi
venv_probe() { local d; d=$(mktemp -d); python3 -m venv "$d/v" >/dev/null 2>&1; local rc=$?; rm -rf "$d"; return "$rc"; }
# pip install of the attn_h package in a fresh venv: sdist, wheels, import from elsewhere,
# the README's Python example, python -m attn_h info, uninstall (tests/pip_check.sh).
if ! command -v python3 >/dev/null 2>&1; then skip pip-install "python3 not installed"
elif ! python3 -c 'import numpy' >/dev/null 2>&1; then skip pip-install "numpy not installed"
elif ! venv_probe; then skip pip-install "python3 -m venv cannot make a venv with pip (python3-venv not installed)"
else
    check pip-install bash tests/pip_check.sh
    grep -E '^(sdist|import ok|pip install|pip build decode)' "$logs/pip-install.log" | sed 's/^/    /'
fi

# The pytest suite of python/attn_h.py, one check (its torch and CUDA parts skip themselves).
if ! command -v python3 >/dev/null 2>&1; then skip python-pytest "python3 not installed"
elif ! python3 -c 'import numpy' >/dev/null 2>&1; then skip python-pytest "numpy not installed"
elif ! python3 -c 'import pytest' >/dev/null 2>&1; then skip python-pytest "pytest not installed"
else
    check python-pytest python3 -m pytest -q -p no:cacheprovider tests/python/test_attn_h.py
    grep -E '^=* ?[0-9]+ (passed|failed|skipped|error)' "$logs/python-pytest.log" | tail -n 1 | sed 's/^/    /'
fi
# transformers' continuous batching on attn.h on the oldest and the newest supported transformers
# (5.17.0, 5.25.0), a venv each sharing one torch, the example's --check for Llama and DeepSeek-V3
# on the CPU (tests/transformers_versions.sh; .ci/run installs the venvs first)
if ! command -v python3 >/dev/null 2>&1; then skip transformers-versions "python3 not installed"
elif tf_probe=$(bash tests/transformers_versions.sh --probe 2>&1); then
    check transformers-versions bash tests/transformers_versions.sh
    grep -E '^(transformers [0-9]|summary:)' "$logs/transformers-versions.log" | sed 's/^/    /'
else
    skip transformers-versions "$(echo "$tf_probe" | tail -n 1)"
fi
check demo ./build/paged_decode
# a device the demo does not know: exit 2, naming what is allowed
check demo-device-named bash -c './build/paged_decode --device gpu 2>&1 >/dev/null; [ $? -eq 2 ] &&
    ./build/paged_decode --device gpu 2>&1 | grep -q "allowed: auto, cpu, cuda"'
check attn-info ./build/attn-info
# A build without -march flags (pip's: cc -std=c99 -O2) runs the widest SIMD variant this CPU
# has (/proc/cpuinfo's flags), says why, and runs another one when ATTN_CPU_SIMD asks
simd_dispatch() {
    local want=c bin=build/attn-info-plain
    grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo && want=avx2
    [ "$want" = avx2 ] && grep -qw avx512f /proc/cpuinfo && want=avx512
    cc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -I. tools/attn-info.c -o "$bin" -lpthread -lm -ldl &&
    "$bin" 2>/dev/null | tee /dev/stderr | grep -qx "  cpu_simd: $want" &&
    "$bin" 2>/dev/null | grep -q '^  cpu_simd_reason: the widest variant this CPU runs; cpu: .*; compiled: avx512 avx2 c$' &&
    ATTN_CPU_SIMD=c "$bin" 2>/dev/null | grep -qx '  cpu_simd: c'
}
if [ "$(uname -m)" = x86_64 ]; then check simd-dispatch-plain-build simd_dispatch
else skip simd-dispatch-plain-build "not an x86-64 machine (one variant compiled)"; fi
check attn-info-env-unknown bash -c '! ATTN_BACKEND=nope ./build/attn-info'
# the 8-bit caches' records: fp8 per tensor, int8 / e4m3 per token and head; bad mixes exit 2
check attn-info-8bit-caches bash -c '
    ./build/attn-info --kv-cache-dtype fp8_e4m3 --k-scale 0.5 2>/dev/null |
        grep -q "kv_cache_dtype: fp8_e4m3  # scales per tensor" &&
    ./build/attn-info --kv-cache-dtype int8 2>/dev/null | grep -q "kv_cache_dtype: int8  # scales per token and head" &&
    ./build/attn-info --kv-cache-dtype fp8 --per-token-head 2>/dev/null | grep -q "resolved_backend: CPU" &&
    { ./build/attn-info --kv-cache-dtype f16 --k-scale 2 >/dev/null 2>&1; [ $? -eq 2 ]; } &&
    { ./build/attn-info --kv-cache-dtype fp8_e5m2 --per-token-head >/dev/null 2>&1; [ $? -eq 2 ]; }'
# attn-bench's result table holds as many rows as a run makes (a fixed 64 cut the default
# CUDA run short)
check bench-table-rows bash -c '[ "$(./build/attn-bench --selftest 1000 | grep -c "^| selftest row")" = 1000 ] &&
    [ "$(./build/attn-bench-cuda --selftest 1000 | grep -c "^| selftest row")" = 1000 ]'
# attn-bench --device cuda runs attn-bench-cuda (its usage comes back); without a GPU the CUDA
# bench prints one SKIP line and exits 0 (on a GPU host the check runs only --help)
check bench-cuda-dispatch bash -c './build/attn-bench --device cuda --help | grep -q "^usage: attn-bench-cuda" &&
    if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ]; then :; else
        out=$(./build/attn-bench --device cuda) && echo "$out" | grep -q "^SKIP attn-bench-cuda: "; fi'
# the benches use attn.h's public API only: no private (double-underscore) name
check bench-public-api bash -c '! grep -n "attn__\|ATTN__" tools/attn-bench*.c tools/bench_common.h'
# README.md: its C program compiled and run, its Python run, its make commands real
if command -v python3 >/dev/null 2>&1; then run readme-snippets python3 tests/readme_check.py
else skip readme-snippets "python3 not installed"
fi
# LICENSE is the license text at the end of attn.h, word for word, and the header's first
# lines name it
check license-file bash -c 'test -f LICENSE && sed -n 2p attn.h | grep -q "MIT license" &&
    awk "/^MIT License\$/{f=1} f&&/^------------------------------/{exit} f" attn.h | diff - LICENSE'
# line 1's version and ATTN_VERSION_STRING come from the version macros: a stale line fails
need version-derived python3 && check version-derived bash -c '
    t=$(mktemp -d); sed "1s/ - v[0-9.]* - / - v0.0.1 - /" attn.h >"$t/attn.h";
    ! python3 tools/embed.py --check "$t/attn.h" kernels 2>/dev/null; rc=$?; rm -rf "$t"; exit $rc'

# The libFuzzer target: ATTN_FUZZ_SECONDS (30) from a fixed seed over the committed seed
# corpus, into a fresh corpus; a crash, sanitizer report, broken property or hang fails.
fuzz_seconds=${ATTN_FUZZ_SECONDS:-30}
fuzz_probe() {
    local dir; dir=$(mktemp -d)
    printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$dir/p.c"
    clang -fsanitize=fuzzer,address,undefined "$dir/p.c" -o "$dir/p" >/dev/null 2>&1; local rc=$?
    rm -rf "$dir"; return "$rc"
}
fuzz_run() {
    rm -rf build/fuzz-corpus-test
    make -s fuzz FUZZ_TIME="$fuzz_seconds" FUZZ_CORPUS=build/fuzz-corpus-test FUZZ_ARGS=-seed=1
}
# The DCP target (tests/fuzz_dcp.c): ATTN_FUZZ_DCP_SECONDS (20) the same way.
fuzz_dcp_run() {
    rm -rf build/fuzz-dcp-corpus-test
    make -s fuzz-dcp FUZZ_TIME="${ATTN_FUZZ_DCP_SECONDS:-20}" FUZZ_DCP_CORPUS=build/fuzz-dcp-corpus-test FUZZ_ARGS=-seed=1
}
if ! command -v clang >/dev/null 2>&1; then skip fuzz-metadata "clang not installed"; skip fuzz-dcp "clang not installed"
elif ! fuzz_probe; then
    skip fuzz-metadata "clang's libFuzzer runtime not installed (libclang-rt-<version>-dev)"
    skip fuzz-dcp "clang's libFuzzer runtime not installed (libclang-rt-<version>-dev)"
else
    check fuzz-metadata fuzz_run
    grep -hE '^Done [0-9]+ runs|^fuzz_metadata: [0-9]+ inputs' "$logs/fuzz-metadata.log" | sed 's/^/    /'
    check fuzz-dcp fuzz_dcp_run
    grep -hE '^Done [0-9]+ runs|^fuzz_dcp: [0-9]+ inputs' "$logs/fuzz-dcp.log" | sed 's/^/    /'
fi

echo "$P passed, $F failed, $S skipped"
[ "$F" -eq 0 ]
