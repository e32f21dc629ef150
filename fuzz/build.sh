#!/bin/sh
# Builds the tokenizer, chat template and model loader fuzz targets with
# clang's libFuzzer, AddressSanitizer and UBSan into build/fuzz/, and writes
# their seed corpora (fuzz/README.md).
set -eu
cd "$(dirname "$0")/.."
OUT=build/fuzz
mkdir -p "$OUT"
CC=${CC:-clang}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CFLAGS="-g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -Ifuzz -fno-omit-frame-pointer $SAN"
LIBS="-lpcre2-8 -lcjson -lutf8proc -lm -lpthread"
# src/dist/ includes mpi.h; whatever links the whole library links libmpi.
MPI_CFLAGS=$(mpicc --showme:compile 2>/dev/null || pkg-config --cflags ompi 2>/dev/null || true)
MPI_LIBS=$(mpicc --showme:link 2>/dev/null || pkg-config --libs ompi 2>/dev/null || echo -lmpi)
SRC="src/tokenizer/tokenizer.c src/tokenizer/spm.c src/tokenizer/bpe.c src/tokenizer/hf_json.c
     src/tokenizer/detok.c src/gguf/gguf.c src/kernels/quant.c src/core/status.c"
CHAT_SRC="$(ls src/chat/*.c) src/gguf/gguf.c src/kernels/quant.c src/core/status.c"
for t in fuzz_tokenize fuzz_gguf_tokenizer fuzz_hf_json; do
    $CC $CFLAGS -fsanitize=fuzzer $SRC "fuzz/$t.c" -o "$OUT/$t" $LIBS
done
$CC $CFLAGS -fsanitize=fuzzer $CHAT_SRC fuzz/fuzz_chat_template.c -o "$OUT/fuzz_chat_template" $LIBS
# The model loader runs the whole library (load, then a few decode steps):
# every file of src/ but the CLI. The target runs the scalar kernels (it
# forces ELLM_ISA=scalar), so the per-ISA files are only linked: they are
# built without sanitizers or coverage, which would take many minutes.
mkdir -p "$OUT/lib"
OBJS=""
X86="-mavx2 -mfma -mf16c"
for s in $(find src -name '*.c' -not -path 'src/cli/*' | sort); do
    o="$OUT/lib/$(echo "$s" | tr / _ | sed 's/\.c$/.o/')"
    case "$s" in
    *_avx2.c) $CC -O1 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc $X86 -c "$s" -o "$o" ;;
    *_avx512.c) $CC -O1 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc $X86 -mavx512f -mavx512bw -mavx512dq \
        -mavx512vl -mavx512vnni -mavx512bf16 -mavx512vbmi -c "$s" -o "$o" ;;
    *) $CC $CFLAGS $MPI_CFLAGS -fsanitize=fuzzer-no-link -c "$s" -o "$o" ;;
    esac
    OBJS="$OBJS $o"
done
$CC $CFLAGS -fsanitize=fuzzer $OBJS fuzz/fuzz_model_load.c -o "$OUT/fuzz_model_load" $LIBS -lmicrohttpd -lhwloc -lnuma $MPI_LIBS
# The converter's inputs (src/convert/): the safetensors reader, the whole
# conversion of a checkpoint folder (config.json + model.safetensors), and the
# tokenizer.json and tokenizer.model readers. They link the same objects as
# the model loader; their seeds come from make_convert_seeds.
for t in fuzz_safetensors fuzz_convert fuzz_convert_vocab_json fuzz_convert_sp_model; do
    $CC $CFLAGS -fsanitize=fuzzer $OBJS "fuzz/$t.c" -o "$OUT/$t" $LIBS -lmicrohttpd -lhwloc -lnuma $MPI_LIBS
done
# State files (engine/state.c) and `ellm run`'s settings in them (cli/run_state.c);
# its seeds are real states written by the target itself.
$CC $CFLAGS -fsanitize=fuzzer $OBJS src/cli/run_state.c fuzz/fuzz_state.c -o "$OUT/fuzz_state" $LIBS -lmicrohttpd -lhwloc -lnuma $MPI_LIBS
mkdir -p "$OUT/seeds/state"
FUZZ_STATE_SEEDS="$OUT/seeds/state" ELLM_FUZZ_DATA=tests/data "$OUT/fuzz_state" -runs=0 "$OUT/seeds/state" > /dev/null 2>&1
$CC $CFLAGS -Itests $OBJS fuzz/make_convert_seeds.c -o "$OUT/make_convert_seeds" $LIBS -lmicrohttpd -lhwloc -lnuma $MPI_LIBS
"$OUT/make_convert_seeds" "$OUT/seeds" tests/data
# The seed writer is an ordinary program.
$CC $CFLAGS $SRC src/gguf/gguf_writer.c src/core/async_writer.c fuzz/make_seeds.c -o "$OUT/make_seeds" $LIBS
"$OUT/make_seeds" "$OUT/seeds" tests/data
# SMBIOS memory-device parser (ellm probe): only the parser and status.
$CC $CFLAGS -fsanitize=fuzzer src/topology/dmi.c src/core/status.c fuzz/fuzz_dmi.c -o "$OUT/fuzz_dmi" -lm
mkdir -p "$OUT/seeds/dmi"
cp fuzz/corpus_dmi/* "$OUT/seeds/dmi/"
[ -r /sys/firmware/dmi/tables/DMI ] && cp /sys/firmware/dmi/tables/DMI "$OUT/seeds/dmi/this-machine" || true
# Server request parser: JSON body -> generation parameters.
$CC $CFLAGS -fsanitize=fuzzer src/server/request.c src/server/responses.c src/server/tool_calls.c src/server/json_mask.c fuzz/fuzz_request.c -o "$OUT/fuzz_request" -lcjson -lm
mkdir -p "$OUT/seeds/request"
cp fuzz/corpus_request/* "$OUT/seeds/request/"
echo "built: $(ls "$OUT" | grep '^fuzz_' | tr '\n' ' ')"
