/* Public tokenizer entry points: thin wrappers over the model's tokenizer. */
#include "core/status.h"
#include "model/model.h"

ellm_status ellm_tokenize(const ellm_model *model, const char *text, size_t len, int add_bos,
                          int parse_special, int32_t *ids, int cap, int *n_out, ellm_error *err) {
    return tokenizer_encode(model->tok, text, len, add_bos, parse_special, ids, cap, n_out, err);
}

int ellm_detok_push(const ellm_model *model, ellm_detok *state, int32_t token, char *out, size_t cap) {
    return tokenizer_detok_push(model->tok, state, token, out, cap);
}

int ellm_detok_flush(ellm_detok *state, char *out, size_t cap) {
    return tokenizer_detok_flush(state, out, cap);
}

int32_t ellm_token_bos(const ellm_model *model) { return tokenizer_bos(model->tok); }
int32_t ellm_token_eos(const ellm_model *model) { return tokenizer_eos(model->tok); }
int ellm_token_is_eog(const ellm_model *model, int32_t token) { return tokenizer_is_eog(model->tok, token); }
