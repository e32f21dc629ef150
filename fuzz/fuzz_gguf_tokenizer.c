/* libFuzzer target: GGUF tokenizer metadata. The input is a whole GGUF file;
 * when it parses and its tokenizer.ggml.* keys build a tokenizer, a few texts
 * are encoded (with and without BOS and special-token parsing) and decoded.
 * Seeds: fuzz/make_seeds writes small SentencePiece and byte-level BPE
 * vocabularies. */
#include "fuzz_common.h"

#include "gguf/gguf.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = NULL;
    ellm_error err = {0};
    if (gguf_open_memory(data, size, &f, &err) != ELLM_OK) return 0;
    tokenizer *t = NULL;
    ellm_status st = tokenizer_init_gguf(f, &t, &err);
    gguf_close(f);
    if (st != ELLM_OK) {
        FUZZ_CHECK(t == NULL && err.msg[0] != 0, "a failed load leaves a message and no tokenizer");
        return 0;
    }
    static const char *const texts[] = {
        "Hello world",
        " the  thing\n\n\tdone",
        "<|im_start|>user<|im_end|>",
        "<s> a</s>",
        "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 123456",
        "'s 'LL  \r\n",
        ""};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        for (int mode = 0; mode < 4; mode++) {
            size_t n;
            free(fuzz_encode_decode(t, texts[i], strlen(texts[i]), mode & 1, mode >> 1, &n));
        }
    }
    for (int32_t id = -1; id <= tokenizer_n_vocab(t); id++) {
        size_t n;
        tokenizer_piece(t, id, &n);
        tokenizer_token_bytes(t, id, &n);
    }
    tokenizer_free(t);
    return 0;
}
