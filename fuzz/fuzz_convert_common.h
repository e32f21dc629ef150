/* Checks shared by the converter's tokenizer fuzz targets: a vocabulary the
 * converter builds from tokenizer.json or tokenizer.model must be well formed
 * (every token a string, types in GGUF's range, special ids inside the
 * vocabulary), must write as GGUF, and the file must read back; when eLLM's
 * tokenizer accepts it, a few texts encode to ids in range and decode as
 * whole characters (fuzz_common.h). A failed check aborts. */
#ifndef ELLM_FUZZ_CONVERT_COMMON_H
#define ELLM_FUZZ_CONVERT_COMMON_H

#include "fuzz_common.h"

#include "convert/hf_vocab.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

static inline void fuzz_check_vocab(const cv_vocab *v) {
    FUZZ_CHECK(v->n >= 1 && v->tok && v->types, "a built vocabulary has tokens (n %lld)", (long long)v->n);
    for (int64_t i = 0; i < v->n; i++) {
        FUZZ_CHECK(v->tok[i] != NULL, "token %lld is NULL", (long long)i);
        FUZZ_CHECK(v->types[i] >= 1 && v->types[i] <= 6, "token %lld has type %d", (long long)i, (int)v->types[i]);
    }
    for (int64_t i = 0; i < v->n_merges; i++) FUZZ_CHECK(v->merges[i] != NULL, "merge %lld is NULL", (long long)i);
    for (int k = 0; k < CV_SPECIAL_COUNT; k++)
        FUZZ_CHECK(v->special[k] >= -1 && v->special[k] < v->n, "special %d = %lld outside the vocabulary", k,
                   (long long)v->special[k]);
    FUZZ_CHECK(!strcmp(v->model, "llama") || !strcmp(v->model, "gpt2"), "model '%s'", v->model);
}

/* Writes the vocabulary as a GGUF (metadata only), reads it back, and runs
 * the tokenizer over a few texts when it loads. */
static inline void fuzz_vocab_roundtrip(const cv_vocab *v) {
    gguf_writer *w = NULL;
    ellm_error err = {0};
    FUZZ_CHECK(gguf_writer_init(&w, &err) == ELLM_OK, "writer init: %s", err.msg);
    gguf_writer_add_str(w, "general.architecture", "llama", &err);
    ellm_status st = cv_vocab_write(v, w, &err);
    FUZZ_CHECK(st == ELLM_OK, "cv_vocab_write of a built vocabulary failed: %s", err.msg);
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    FUZZ_CHECK(fp != NULL, "open_memstream");
    st = gguf_writer_write_fp(w, fp, "(memory)", &err);
    fclose(fp);
    gguf_writer_free(w);
    FUZZ_CHECK(st == ELLM_OK, "writing the GGUF failed: %s", err.msg);
    gguf_file *f = NULL;
    st = gguf_open_memory(buf, len, &f, &err);
    FUZZ_CHECK(st == ELLM_OK, "the written GGUF does not read back: %s", err.msg);
    tokenizer *t = NULL;
    if (tokenizer_init_gguf(f, &t, &err) == ELLM_OK) {
        static const char *const texts[] = {"Hello world", " ab  ab\n\n\tab", "<s>ab</s> b",
                                            "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80", ""};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            size_t n;
            free(fuzz_encode_decode(t, texts[i], strlen(texts[i]), 1, 1, &n));
        }
        tokenizer_free(t);
    } else {
        FUZZ_CHECK(t == NULL && err.msg[0] != 0, "a refused vocabulary leaves a message and no tokenizer");
    }
    gguf_close(f);
    free(buf);
}

#endif
