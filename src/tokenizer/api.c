/* The public ellm_tokenizer API: a tokenizer loaded on its own (GGUF or
 * tokenizer.json). An ellm_tokenizer pointer is the internal tokenizer under
 * its public name; a model's tokenizer is lent by ellm_model_tokenizer
 * (engine/api.c). */
#include "core/status.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const tokenizer *in(const ellm_tokenizer *tok) { return (const tokenizer *)tok; }

/* Loads a GGUF file's tokenizer; the file is closed again. */
static ellm_status load_gguf(const char *path, tokenizer **out, ellm_error *err) {
    gguf_file *f = NULL;
    ellm_status st = gguf_open(path, &f, err);
    if (st != ELLM_OK) return st;
    st = tokenizer_init_gguf(f, out, err);
    gguf_close(f);
    return st;
}

ellm_status ellm_tokenizer_load(const char *path, ellm_tokenizer **out, ellm_error *err) {
    if (!path || !out) return ellm_fail(err, ELLM_ERR_ARG, "ellm_tokenizer_load: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return ellm_fail(err, ELLM_ERR_IO, "cannot open '%s'", path);
    tokenizer *t = NULL;
    ellm_status st;
    if (S_ISDIR(sb.st_mode)) {
        char buf[4096];
        int n = snprintf(buf, sizeof(buf), "%s/tokenizer.json", path);
        if (n < 0 || (size_t)n >= sizeof(buf)) {
            return ellm_fail(err, ELLM_ERR_ARG, "path too long: '%s'", path);
        }
        st = tokenizer_init_hf_json(buf, &t, err);
    } else {
        char magic[4] = {0};
        FILE *f = fopen(path, "rb");
        if (!f) return ellm_fail(err, ELLM_ERR_IO, "cannot open '%s'", path);
        size_t got = fread(magic, 1, 4, f);
        fclose(f);
        if (got == 4 && memcmp(magic, "GGUF", 4) == 0) {
            st = load_gguf(path, &t, err);
        } else {
            st = tokenizer_init_hf_json(path, &t, err);
        }
    }
    if (st != ELLM_OK) return st;
    *out = (ellm_tokenizer *)t;
    return ELLM_OK;
}

void ellm_tokenizer_free(ellm_tokenizer *tok) { tokenizer_free((tokenizer *)tok); }

ellm_status ellm_tokenizer_encode(const ellm_tokenizer *tok, const char *text, size_t len,
                                  int add_bos, int parse_special, int32_t *ids, int cap, int *n_out,
                                  ellm_error *err) {
    return tokenizer_encode(in(tok), text, len, add_bos, parse_special, ids, cap, n_out, err);
}

int ellm_tokenizer_detok_push(const ellm_tokenizer *tok, ellm_detok *state, int32_t token,
                              char *out, size_t cap) {
    return tokenizer_detok_push(in(tok), state, token, out, cap);
}

int ellm_tokenizer_n_vocab(const ellm_tokenizer *tok) { return tokenizer_n_vocab(in(tok)); }
int32_t ellm_tokenizer_bos(const ellm_tokenizer *tok) { return tokenizer_bos(in(tok)); }
int32_t ellm_tokenizer_eos(const ellm_tokenizer *tok) { return tokenizer_eos(in(tok)); }

int ellm_tokenizer_is_eog(const ellm_tokenizer *tok, int32_t token) {
    return tokenizer_is_eog(in(tok), token);
}

const char *ellm_tokenizer_token_bytes(const ellm_tokenizer *tok, int32_t token, size_t *len) {
    return tokenizer_token_bytes(in(tok), token, len);
}

const char *ellm_tokenizer_token_text(const ellm_tokenizer *tok, int32_t token, size_t *len) {
    return tokenizer_piece(in(tok), token, len);
}

size_t ellm_tokenizer_max_token_bytes(const ellm_tokenizer *tok) {
    return tokenizer_max_token_bytes(in(tok));
}

const char *ellm_tokenizer_chat_template(const ellm_tokenizer *tok) {
    return tokenizer_chat_template(in(tok));
}
