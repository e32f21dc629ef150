# eLLM build. `make` builds build/ellm; `make run` sets up, builds and generates
# from the embedded model; `make test` builds and runs the whole test suite;
# `make test-asan` runs it under AddressSanitizer + UBSan.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wno-unused-parameter \
           -fno-math-errno -Iinclude -Isrc -MMD -MP
LDLIBS  += -lmicrohttpd -lpcre2-8 -lcjson -lutf8proc -lhwloc -lnuma -lm -lpthread
# Open MPI (src/dist/ only includes mpi.h; everything links libmpi).
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null || pkg-config --cflags ompi 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null || pkg-config --libs ompi 2>/dev/null || echo -lmpi)
LDLIBS  += $(MPI_LIBS)

# Kernels for one ISA live in *_avx2.c / *_avx512.c files compiled for that ISA;
# the binary picks at run time, so no -march=native is ever needed.
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512dq -mavx512vl \
                -mavx512vnni -mavx512bf16 -mavx512vbmi

LIB_SRC  := $(sort $(shell find src -name '*.c' -not -path 'src/cli/*'))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
LIB      := $(BUILD)/libellm.a

.PHONY: all run test test-asan clean deps bench
all: $(BUILD)/ellm $(BUILD)/ellm_server

deps:
	@sh tools/install-deps.sh

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -c $< -o $@
$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -c $< -o $@
$(BUILD)/src/dist/%.o: src/dist/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -c $< -o $@
# Error-feedback rounding: plain float loops, vectorized at -O3.
$(BUILD)/src/convert/gptq.o: CFLAGS += -O3
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ellm: $(CLI_OBJ) $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDFLAGS) $(LDLIBS)

# The server binary: `ellm serve` with the seed's name.
$(BUILD)/ellm_server: $(BUILD)/src/cli/server/ellm_server.o $(filter-out $(BUILD)/src/cli/main.o,$(CLI_OBJ)) $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDFLAGS) $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDFLAGS) $(LDLIBS)

# Benchmarks (not tests): `make bench` builds them into $(BUILD)/bench/.
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDFLAGS) $(LDLIBS)
bench: $(addprefix $(BUILD)/bench/,bench_tokenizer bench_attention bench_attention_rows bench_sparse_attention bench_sparse bench_kernels bench_gemm bench_batch convert_synth_hf quant_kl)

# End-to-end server tests (Node, run by tests/test_server.c): the pinned npm
# packages of tests/server/package-lock.json, installed with npm ci when the
# lock file's content changes.
tests/server/node_modules/.stamp: FORCE
	@cmp -s tests/server/package-lock.json $@ 2>/dev/null || \
	    { cd tests/server && npm ci --no-audit --no-fund && cp package-lock.json node_modules/.stamp; }
# Node.js 20 for those tests where the system's is older (tools/node/ensure.sh).
tools/node/node_modules/.stamp: FORCE
	@sh tools/node/ensure.sh
# llama.cpp for tests/test_convert_llamacpp.c: node-llama-cpp and its linux-x64
# prebuilt CPU library only (the optional GPU builds are left out), pinned in
# tests/llamacpp/package-lock.json and installed the same way.
tests/llamacpp/node_modules/.stamp: FORCE
	@cmp -s tests/llamacpp/package-lock.json $@ 2>/dev/null || \
	    { cd tests/llamacpp && npm ci --omit=optional --ignore-scripts --no-audit --no-fund && \
	      cp package-lock.json node_modules/.stamp; }
FORCE:

# `run` and `test` install the dependencies first, then build in a second make,
# which reads this file again: flags taken from installed tools (mpicc) are
# only known once the packages are there.
run: deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/ellm run -n 200 --stats

test: deps
	@$(MAKE) --no-print-directory all $(TEST_BIN) tests/server/node_modules/.stamp \
	    tests/llamacpp/node_modules/.stamp tools/node/node_modules/.stamp
	@sh tests/run_tests.sh $(BUILD)

test-asan:
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 $(MAKE) BUILD=build-asan OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer" \
	    LDFLAGS="-fsanitize=address,undefined" test

clean:
	rm -rf build build-asan

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_BIN:=.d) $(BUILD)/src/cli/server/ellm_server.d
