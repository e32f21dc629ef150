/* libFuzzer target: the converter's tokenizer.model (SentencePiece protobuf)
 * reader. The input is a whole tokenizer.model; the pieces that parse
 * (cv_vocab_from_sp_memory) become a vocabulary that is checked, written as
 * GGUF, read back and tokenized with (fuzz_convert_common.h). The first byte
 * is not special: the whole input is the file. Seeds: tests/data/tok2k.model
 * and small models from fuzz/make_convert_seeds. */
#include "fuzz_convert_common.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy, sized exactly, so that a read past the end is caught. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    cv_vocab v;
    ellm_error err = {0};
    if (cv_vocab_from_sp_memory(buf, size, 0, &v, &err) != ELLM_OK) {
        FUZZ_CHECK(err.msg[0] != 0 && v.tok == NULL, "a refusal leaves a message and no vocabulary");
        free(buf);
        return 0;
    }
    fuzz_check_vocab(&v);
    FUZZ_CHECK(!strcmp(v.model, "llama") && v.scores != NULL, "a SentencePiece vocabulary has scores");
    fuzz_vocab_roundtrip(&v);
    cv_vocab_free(&v);
    free(buf);
    return 0;
}
