/* libFuzzer target: tokenizer.json (and tokenizer_config.json) contents. The
 * input is the tokenizer.json text, optionally followed by a NUL byte and the
 * tokenizer_config.json text. When they build a tokenizer, a few texts are
 * encoded and decoded. Seeds: fuzz/make_seeds writes small tokenizers using
 * every supported normalizer and pre-tokenizer. */
#include "fuzz_common.h"

#include "tokenizer/tokenizer_impl.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data, *cfg;
    size_t cfg_len, len = fuzz_split_nul(data, size, &cfg, &cfg_len);
    tokenizer *t = NULL;
    ellm_error err = {0};
    ellm_status st = tok_hf_init_memory(json, len, cfg, cfg_len, &t, &err);
    if (st != ELLM_OK) {
        FUZZ_CHECK(t == NULL && err.msg[0] != 0, "a failed load leaves a message and no tokenizer");
        return 0;
    }
    static const char *const texts[] = {"Hello world",
                                        " ab  ab\n\n\tab",
                                        "<|end|>ab<x> b",
                                        "123 4567",
                                        "caf\xc3\xa9 cafe\xcc\x81 \xe6\x97\xa5 \xf0\x9f\x98\x80",
                                        "'s 'LL  \r\n",
                                        ""};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        for (int mode = 0; mode < 4; mode++) {
            size_t n;
            free(fuzz_encode_decode(t, texts[i], strlen(texts[i]), mode & 1, mode >> 1, &n));
        }
    }
    tokenizer_chat_template(t);
    tokenizer_free(t);
    return 0;
}
