#!/usr/bin/env bash
# examples/transformers_generate.py on the oldest and the newest transformers release it supports
# (issue 37 item 9): a venv for each, sharing one torch install (a .pth file in each venv puts the
# torch venv's site-packages on its path, after its own), then the example with --check on the CPU
# for --model llama (against transformers' own paged sdpa) and --model deepseek_v3 (attn.h's MLA
# against the torch reference) in each. Prints one line a run and a summary; exits 1 if a run
# disagrees or fails. The venvs are kept for the next run (made again only when one is missing or
# broken). Logs: build/test-logs/transformers-<version>-<model>.log.
#
# usage: tests/transformers_versions.sh [--probe | --install | --pytest]
#   --probe    exit 0 if the venvs are ready or can be made here (python3 -m venv with pip, and
#              PyPI answers); else print why on the last line and exit 1 (run_all.sh's skip reason)
#   --install  make the venvs only (.ci/run's install step)
#   --pytest   also run tests/python/test_attn_h.py -k transformers in each venv
# environment:
#   ATTN_TF_VENVS    the venvs' folder (default ${XDG_CACHE_HOME:-$HOME/.cache}/attn/tf-venvs)
#   ATTN_TF_VERSIONS the transformers releases (default "5.17.0 5.25.0": the oldest and newest supported)
#   ATTN_TF_TORCH    the torch release (default 2.11.0, the H200 machine's). PyPI's Linux x86-64
#                    torch wheel is the CUDA build: with its nvidia-* wheels about 3.5 GB to
#                    download and 5 GB on disk (no CPU-only build is on PyPI)
#   ATTN_TF_ARGS     the example's size (default "--layers 2 --prompts 8 --new-tokens 32")
set -u
cd "$(dirname "$0")/.."
root=${ATTN_TF_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/attn/tf-venvs}
versions=${ATTN_TF_VERSIONS:-5.17.0 5.25.0}
torch_version=${ATTN_TF_TORCH:-2.11.0}
args=${ATTN_TF_ARGS:---layers 2 --prompts 8 --new-tokens 32}
logs=build/test-logs
base="$root/torch-$torch_version"
mode=${1:-run}

# ready VENV PACKAGE VERSION : the venv's python imports PACKAGE at exactly VERSION
ready() {
    [ -x "$1/bin/python" ] && "$1/bin/python" -c "
import sys, importlib.metadata as m
sys.exit(m.version('$2').split('+')[0] != '$3')" >/dev/null 2>&1
}

all_ready() {
    ready "$base" torch "$torch_version" || return 1
    local v
    for v in $versions; do ready "$root/tf-$v" transformers "$v" || return 1; done
}

probe() {
    all_ready && { echo "venvs ready in $root"; return 0; }
    command -v python3 >/dev/null 2>&1 || { echo "python3 not installed"; return 1; }
    local d; d=$(mktemp -d)
    if ! python3 -m venv "$d/v" >/dev/null 2>&1; then
        rm -rf "$d"; echo "python3 -m venv cannot make a venv with pip (python3-venv not installed)"; return 1
    fi
    rm -rf "$d"
    local v out
    out=$(timeout 120 python3 -m pip index versions transformers 2>/dev/null) ||
        { echo "PyPI does not answer (pip index versions transformers failed)"; return 1; }
    for v in $versions; do
        echo "$out" | grep -q "[ ,]$v\(,\|$\)" || { echo "PyPI lists no transformers $v"; return 1; }
    done
    echo "venvs can be made in $root"
}

# venv DIR : a fresh venv at DIR (an old or broken one removed first)
venv() { rm -rf "$1" && python3 -m venv "$1"; }

install() {
    mkdir -p "$root" || return 1
    local t0=$SECONDS
    if ! ready "$base" torch "$torch_version"; then
        echo "installing torch $torch_version (with PyPI's CUDA libraries), numpy, psutil, pytest into $base"
        venv "$base" && "$base/bin/python" -m pip install -q "torch==$torch_version" numpy psutil pytest ||
            { echo "FAIL: torch $torch_version did not install"; return 1; }
    fi
    local site v dir
    site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
    for v in $versions; do
        dir="$root/tf-$v"
        ready "$dir" transformers "$v" && continue
        echo "installing transformers $v into $dir (torch from $base)"
        venv "$dir" || { echo "FAIL: no venv at $dir"; return 1; }
        "$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$dir/.purelib" &&
            echo "$site" >"$(cat "$dir/.purelib")/_attn_h_shared_torch.pth" &&
            "$dir/bin/python" -m pip install -q "transformers==$v" ||
            { echo "FAIL: transformers $v did not install"; return 1; }
    done
    echo "venvs ready in $root ($((SECONDS - t0)) s)"
}

case "$mode" in
    --probe) probe; exit $? ;;
    --install) install; exit $? ;;
    run | --pytest) ;;
    *) echo "usage: tests/transformers_versions.sh [--probe | --install | --pytest]" >&2; exit 2 ;;
esac

install || exit 1
[ -e build/libattn.so ] || make -s build/libattn.so || exit 1
mkdir -p "$logs"
pass=0 fail=0
for v in $versions; do
    for model in llama deepseek_v3; do
        log="$logs/transformers-$v-$model.log"
        t0=$SECONDS
        # shellcheck disable=SC2086  # ATTN_TF_ARGS is a list of arguments
        "$root/tf-$v/bin/python" examples/transformers_generate.py --device cpu --model "$model" $args --check \
            >"$log" 2>&1
        rc=$?
        equal=$(grep -m 1 -o '^tokens equal for [0-9]* of [0-9]* prompts' "$log")
        if [ "$rc" -eq 0 ] && grep -q '^result: agree' "$log"; then
            state=ok; pass=$((pass + 1))
        else
            state=FAIL; fail=$((fail + 1))
        fi
        line=$(printf 'transformers %-7s %-12s %-4s %s (%d s; %s)' "$v" "$model" "$state" "${equal:-no result}" \
            $((SECONDS - t0)) "$log")
        echo "$line"
        [ "$state" = ok ] || tail -n 15 "$log" | sed 's/^/    /'
    done
    if [ "$mode" = --pytest ]; then
        log="$logs/transformers-$v-pytest.log"
        if "$root/tf-$v/bin/python" -m pytest -q -p no:cacheprovider tests/python/test_attn_h.py -k transformers \
            >"$log" 2>&1; then state=ok; pass=$((pass + 1)); else state=FAIL; fail=$((fail + 1)); fi
        echo "transformers $v pytest -k transformers: $state: $(tail -n 1 "$log") ($log)"
    fi
done
echo "summary: $pass of $((pass + fail)) runs agree (transformers $versions; torch $torch_version; CPU)"
[ "$fail" -eq 0 ]
