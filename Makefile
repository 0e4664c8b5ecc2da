# attn.h — build, test, demo, bench.  `make` builds everything; `make test` runs all tests.
CC      ?= cc
CXX     ?= c++
WARN     = -Wall -Wextra -Wpedantic -Werror
CSTD     = -std=c99
OPT      = -O2 -g
NATIVE   = -march=native
LIBS     = -lpthread -lm -ldl
B        = build

TEST_SRC = tests/main.c $(wildcard tests/test_*.c)
TEST_DEP = attn.h tests/attn_test.h tests/fixtures.h tests/mla_fixtures.h tests/cuda_fixtures.h $(TEST_SRC)

.PHONY: all test demo bench embed check-embed clean info nvrtc-check cuda-test wgmma-check hopper-check fuzz fuzz-dcp pytest

all: $(B)/attn_tests $(B)/attn_tests_avx2 $(B)/attn_tests_c $(B)/attn_tests_nothreads \
     $(B)/attn_tests_asan $(B)/attn_tests_tsan $(B)/attn-info $(B)/attn-bench $(B)/attn-bench-cuda $(B)/paged_decode \
     $(B)/libattn.so $(B)/nvrtc-check $(B)/wgmma_check $(B)/codes_check $(B)/hopper_check $(B)/cuda_kernels

$(B):
	mkdir -p $(B)

# The test binary in four builds: the widest SIMD this CPU has, AVX2, plain C (also without
# the CUDA path: ATTN_NO_CUDA), no threads;
# and once more under AddressSanitizer + UndefinedBehaviorSanitizer.
$(B)/attn_tests: $(TEST_DEP) | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) $(NATIVE) -I. $(TEST_SRC) -o $@ $(LIBS)
$(B)/attn_tests_avx2: $(TEST_DEP) | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) -mavx2 -mfma -mf16c -I. $(TEST_SRC) -o $@ $(LIBS)
$(B)/attn_tests_c: $(TEST_DEP) | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) -DATTN_NO_SIMD -DATTN_NO_CUDA -I. $(TEST_SRC) -o $@ $(LIBS)
$(B)/attn_tests_nothreads: $(TEST_DEP) | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) $(NATIVE) -DATTN_NO_THREADS -I. $(TEST_SRC) -o $@ -lm -ldl
$(B)/attn_tests_asan: $(TEST_DEP) | $(B)
	$(CC) $(CSTD) $(WARN) -O1 -g $(NATIVE) -fsanitize=address,undefined -fno-sanitize-recover=undefined \
	  -fno-omit-frame-pointer -I. $(TEST_SRC) -o $@ $(LIBS)

# And under ThreadSanitizer (make test runs it on a twentieth of the random cases).
$(B)/attn_tests_tsan: $(TEST_DEP) | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) $(NATIVE) -fsanitize=thread -I. $(TEST_SRC) -o $@ $(LIBS)

# libFuzzer target over the metadata builder and the validation of every forward call
# (clang only, so not part of `all`; `make test` runs it for 30 s when clang is there).
# `make fuzz` runs it for FUZZ_TIME seconds, growing FUZZ_CORPUS from the seeds in
# tests/fuzz_corpus; crashing inputs land in build/fuzz-artifacts/.
FUZZ_CC     ?= clang
FUZZ_TIME   ?= 600
FUZZ_CORPUS ?= $(B)/fuzz-corpus
FUZZ_ARGS   ?=
$(B)/fuzz_metadata: tests/fuzz_metadata.c attn.h | $(B)
	$(FUZZ_CC) $(CSTD) $(WARN) -O1 -g $(NATIVE) -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined -fno-omit-frame-pointer -I. $< -o $@ $(LIBS)
fuzz: $(B)/fuzz_metadata
	@mkdir -p $(FUZZ_CORPUS) $(B)/fuzz-artifacts
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	  ./$(B)/fuzz_metadata -max_total_time=$(FUZZ_TIME) -timeout=20 -max_len=4096 \
	  -artifact_prefix=$(B)/fuzz-artifacts/ $(FUZZ_ARGS) $(FUZZ_CORPUS) tests/fuzz_corpus

# The DCP target (tests/fuzz_dcp.c): every rank of a world of 1..8 builds and runs over its
# own blocks at the edge of the capacity; combined, the ranks equal one rank. `make fuzz-dcp`
# runs it for FUZZ_TIME seconds from tests/fuzz_dcp_corpus.
FUZZ_DCP_CORPUS ?= $(B)/fuzz-dcp-corpus
$(B)/fuzz_dcp: tests/fuzz_dcp.c attn.h | $(B)
	$(FUZZ_CC) $(CSTD) $(WARN) -O1 -g $(NATIVE) -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined -fno-omit-frame-pointer -I. $< -o $@ $(LIBS)
fuzz-dcp: $(B)/fuzz_dcp
	@mkdir -p $(FUZZ_DCP_CORPUS) $(B)/fuzz-artifacts
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	  ./$(B)/fuzz_dcp -max_total_time=$(FUZZ_TIME) -timeout=20 -max_len=256 \
	  -artifact_prefix=$(B)/fuzz-artifacts/dcp- $(FUZZ_ARGS) $(FUZZ_DCP_CORPUS) tests/fuzz_dcp_corpus

$(B)/attn-info: tools/attn-info.c attn.h | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) $(NATIVE) -I. $< -o $@ $(LIBS)
# The benches: attn-bench (the CPU backend; --device cuda runs attn-bench-cuda beside it) and
# attn-bench-cuda (the CUDA backends on a GPU; without one it prints SKIP and exits 0). Both
# use attn.h's public API only; tools/bench_common.h holds their timing and result table.
$(B)/attn-bench: tools/attn-bench.c tools/bench_common.h attn.h | $(B)
	$(CC) $(CSTD) $(WARN) -O3 $(NATIVE) -I. $< -o $@ $(LIBS)
$(B)/attn-bench-cuda: tools/attn-bench-cuda.c tools/bench_common.h attn.h $(B)/util_cu.inc | $(B)
	$(CC) $(CSTD) $(WARN) -O3 $(NATIVE) -I. -I$(B) $< -o $@ $(LIBS)
# kernels/util.cu (the read probe and the fill kernel) as one C string per line, for
# attn-bench-cuda's own NVRTC compile: \ " and ? escaped (no trigraphs), each line a literal.
$(B)/util_cu.inc: kernels/util.cu | $(B)
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/?/\\?/g' -e 's/^/"/' -e 's/$$/\\n",/' $< > $@
# Compiles every kernel variant with NVRTC (dlopen; no CUDA header, no GPU needed).
$(B)/nvrtc-check: tools/nvrtc-check.c tools/tool_support.h attn.h | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) -I. $< -o $@ $(LIBS)
# The kernels on a GPU against the CPU backend (dlopen; skips without a GPU). Not in `all`:
# `make cuda-test` on a machine with one.
$(B)/cuda_kernels: tests/cuda_kernels.c tools/tool_support.h attn.h | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) -I. $< -o $@ $(LIBS)
# The checks of kernels/wgmma.cuh: compiles tests/wgmma_probe.cu for sm_90a (ptxas report,
# no spill; no GPU needed) and runs the probes on a device of compute capability 9.0.
$(B)/wgmma_check: tests/wgmma_check.c tools/tool_support.h attn.h | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) -I. $< -o $@ $(LIBS)
# The 8-bit KV-cache codes of kernels/attn_common.cuh (tests/codes_probe.cu): compiles for
# sm_80 and sm_90 (no GPU needed) and, on a GPU, decodes every code and encodes 200000
# floats on the device, both e4m3 paths, against the CPU's conversions bit for bit.
# The checks of kernels/hopper.cuh (TMA, mbarrier pipelines, setmaxnreg) and of the tensor-map
# encoder: compiles tests/hopper_probe.cu for sm_90 and sm_90a (no GPU needed) and, on compute
# capability 9.0, copies tiles and paged K/V through TMA pipelines, compared bit for bit.
$(B)/hopper_check: tests/hopper_check.c tools/tool_support.h attn.h | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) -I. $< -o $@ $(LIBS)
$(B)/codes_check: tests/codes_check.c tools/tool_support.h attn.h | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) -I. $< -o $@ $(LIBS)
$(B)/paged_decode: examples/paged_decode.c attn.h | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) $(NATIVE) -I. $< -o $@ $(LIBS)
# Shared build for python/attn_h.py (ctypes) and its tests.
$(B)/libattn.so: python/attn_shared.c attn.h | $(B)
	$(CC) $(CSTD) $(WARN) $(OPT) $(NATIVE) -fPIC -shared -I. $< -o $@ $(LIBS)

test: all
	@bash tests/run_all.sh

demo: $(B)/paged_decode
	./$(B)/paged_decode

bench: $(B)/attn-bench $(B)/attn-bench-cuda
	./$(B)/attn-bench

info: $(B)/attn-info
	./$(B)/attn-info

nvrtc-check: $(B)/nvrtc-check
	./$(B)/nvrtc-check

cuda-test: $(B)/cuda_kernels
	./$(B)/cuda_kernels

wgmma-check: $(B)/wgmma_check
	./$(B)/wgmma_check
hopper-check: $(B)/hopper_check
	./$(B)/hopper_check

# pip install of the attn_h package into a fresh venv, checked as a user would use it
# (tests/pip_check.sh; needs python3-venv and PyPI for pip's build requirements); its decode
# is timed against build/libattn.so.
pip-check: $(B)/libattn.so
	bash tests/pip_check.sh

# The pytest suite of python/attn_h.py: numpy always; CPU torch tensors where torch imports;
# CUDA tensors where torch sees a GPU and attn.h's platform is CUDA (skipped otherwise).
pytest: $(B)/libattn.so
	python3 -m pytest -q -p no:cacheprovider tests/python/test_attn_h.py

# The generated kernel block between the >>kernels-begin / >>kernels-end markers.
embed:
	python3 tools/embed.py attn.h kernels
check-embed:
	python3 tools/embed.py --check attn.h kernels

clean:
	rm -rf $(B)
