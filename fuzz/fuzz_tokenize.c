/* libFuzzer target: text through real tokenizers. Loads GGUF vocabularies and
 * tokenizer.json files from $ELLM_FUZZ_DATA (default tests/data); the first
 * input byte picks the tokenizer, BOS and special-token parsing, the rest is
 * the text. Checks: invalid UTF-8 is refused with a message, ids are in range,
 * the detokenizer writes whole characters, and byte-level vocabularies that
 * have a token for every byte give the text back exactly (one that lacks a
 * byte's token drops that byte, as llama.cpp does). */
#include "fuzz_common.h"

#include "gguf/gguf.h"

#include <stdint.h>

static const struct {
    const char *path;
    int exact; /* decode(encode(text)) == text without special-token parsing */
} files[] = {
    {"vocab/ggml-vocab-llama-bpe.gguf", 1},
    {"vocab/ggml-vocab-qwen2.gguf", 1},
    {"vocab/ggml-vocab-qwen35.gguf", 1},
    {"vocab/ggml-vocab-deepseek-llm.gguf", 1},
    {"vocab/ggml-vocab-deepseek-coder.gguf", 1},
    {"vocab/ggml-vocab-falcon.gguf", 1},
    {"vocab/ggml-vocab-gpt-2.gguf", 1},
    {"vocab/ggml-vocab-starcoder.gguf", 1},
    {"vocab/ggml-vocab-llama-spm.gguf", 0},
    {"hf/llama3/tokenizer.json", 1},
    {"hf/qwen3/tokenizer.json", 0},
    {"hf/llama2/tokenizer.json", 0},
};
#define N_FILES (sizeof(files) / sizeof(files[0]))
static tokenizer *toks[N_FILES];
static int exact[N_FILES];

/* Whether every byte that valid UTF-8 can hold (all but C0, C1, F5..FF) has
 * a token that stands for exactly that byte. */
static int has_all_bytes(const tokenizer *t) {
    int seen[256] = {0};
    for (int32_t id = 0; id < tokenizer_n_vocab(t); id++) {
        size_t len;
        const char *s = tokenizer_token_bytes(t, id, &len);
        if (len == 1) seen[(unsigned char)s[0]] = 1;
    }
    for (int b = 0; b < 0xF5; b++) {
        if (!seen[b] && b != 0xC0 && b != 0xC1) return 0;
    }
    return 1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("ELLM_FUZZ_DATA");
    if (!dir) dir = "tests/data";
    for (size_t i = 0; i < N_FILES; i++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, files[i].path);
        ellm_error err = {0};
        ellm_status st;
        if (strstr(path, ".gguf")) {
            gguf_file *f = NULL;
            st = gguf_open(path, &f, &err);
            if (st == ELLM_OK) st = tokenizer_init_gguf(f, &toks[i], &err);
            gguf_close(f);
        } else {
            st = tokenizer_init_hf_json(path, &toks[i], &err);
        }
        if (st != ELLM_OK) {
            fprintf(stderr, "fuzz_tokenize: %s: %s (set ELLM_FUZZ_DATA)\n", path, err.msg);
            exit(1);
        }
        exact[i] = files[i].exact && has_all_bytes(toks[i]);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    const tokenizer *t = toks[(sel & 0x3F) % N_FILES];
    int is_exact = exact[(sel & 0x3F) % N_FILES];
    int add_bos = (sel >> 6) & 1, parse_special = (sel >> 7) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    size_t out_len = 0;
    char *out = fuzz_encode_decode(t, text, len, add_bos, parse_special, &out_len);
    if (!out) return 0;
    FUZZ_CHECK(fuzz_whole_utf8(text, len), "invalid UTF-8 was accepted");
    if (is_exact && !parse_special) {
        FUZZ_CHECK(out_len == len && memcmp(out, text, len) == 0,
                   "round trip differs (%zu bytes in, %zu out)", len, out_len);
    }
    free(out);
    return 0;
}
