/* libFuzzer target: the converter's tokenizer.json (and tokenizer_config.json)
 * reader. The input is the tokenizer.json text, optionally followed by a NUL
 * byte and the tokenizer_config.json text, as for fuzz_hf_json. A vocabulary
 * that builds (cv_vocab_from_json) is checked, written as GGUF, read back and
 * tokenized with (fuzz_convert_common.h). Seeds: the small tokenizer.json
 * files of fuzz/make_seeds. */
#include "fuzz_convert_common.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data, *cfg;
    size_t cfg_len, len = fuzz_split_nul(data, size, &cfg, &cfg_len);
    cv_vocab v;
    ellm_error err = {0};
    /* n_vocab 0: the tokenizer's own size (config.json absent). */
    if (cv_vocab_from_json(json, len, cfg, cfg_len, 0, &v, &err) != ELLM_OK) {
        FUZZ_CHECK(err.msg[0] != 0 && v.tok == NULL, "a refusal leaves a message and no vocabulary");
        return 0;
    }
    fuzz_check_vocab(&v);
    fuzz_vocab_roundtrip(&v);
    cv_vocab_free(&v);
    return 0;
}
