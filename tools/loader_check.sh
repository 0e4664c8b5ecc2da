#!/usr/bin/env bash
# Issue 24 section 2 on a GPU machine: attn_h with the CUDA toolkit's libraries out of the
# loader's reach, so that NVRTC and cuBLAS can only come from PyTorch's wheels
# (site-packages/nvidia/...). In a private mount namespace (unshare -rm: no root needed
# where user namespaces are allowed) the folders ldconfig names for libnvrtc and libcublas
# are hidden under an empty directory and LD_LIBRARY_PATH loses its CUDA entries; then
# `python3 -m attn_h info` must name the wheels' files and the CUDA pytest cases must pass.
#   usage: tools/loader_check.sh [OUT_DIR (default build/loader-check)]
set -u
cd "$(dirname "$0")/.."
out=${1:-build/loader-check}
mkdir -p "$out"
{ echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; ldconfig -p | grep -E "libnvrtc|libcublas\.|libcuda\."; } > "$out/loader.txt" 2>&1
dirs=$(ldconfig -p | grep -E "libnvrtc\.so|libcublas\.so" | sed 's/.*=> //' | xargs -r -n1 readlink -f | xargs -r -n1 dirname |
       sort -u | tr '\n' ' ')
echo "hidden: $dirs" >> "$out/loader.txt"
empty=$(mktemp -d)
script=$(mktemp)
cat > "$script" <<EOS
set -u
for d in $dirs; do mount --bind "$empty" "\$d" || echo "mount over \$d failed"; done
export LD_LIBRARY_PATH=\$(echo "\${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v -i cuda | paste -sd: -)
python3 -c "import ctypes; ctypes.CDLL('libnvrtc.so.13')" 2>&1 | tail -1 | sed 's/^/system nvrtc: /'
PYTHONPATH=python python3 -m attn_h info 2>&1
PYTHONPATH=python python3 -m pytest -q -p no:cacheprovider tests/python/test_attn_h.py -k cuda -x 2>&1 | tail -5
EOS
unshare -rm bash "$script" > "$out/stripped.log" 2>&1
rc=$?
rm -rf "$empty" "$script"
grep -E "system nvrtc|_library|passed|failed|mount" "$out/stripped.log"
# pass: the system's NVRTC was out of reach, both libraries came from the wheels, pytest passed
grep -q "system nvrtc: OSError" "$out/stripped.log" && grep -q "nvrtc_library: .*site-packages/nvidia" "$out/stripped.log" &&
    grep -q "cublas_library: .*site-packages/nvidia" "$out/stripped.log" && grep -qE "[0-9]+ passed" "$out/stripped.log" &&
    ! grep -qE "[0-9]+ failed" "$out/stripped.log" && [ $rc -eq 0 ] && { echo "loader check: ok"; exit 0; }
echo "loader check: FAILED ($out/stripped.log)"
exit 1
