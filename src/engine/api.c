/* Public tokenizer and chat entry points of a model: thin wrappers over the
 * model's tokenizer and the chat module. */
#include "chat/chat.h"
#include "core/status.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

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

const ellm_tokenizer *ellm_model_tokenizer(const ellm_model *model) {
    return model ? (const ellm_tokenizer *)model->tok : NULL;
}

int32_t ellm_token_bos(const ellm_model *model) { return tokenizer_bos(model->tok); }
int32_t ellm_token_eos(const ellm_model *model) { return tokenizer_eos(model->tok); }
int ellm_token_is_eog(const ellm_model *model, int32_t token) { return tokenizer_is_eog(model->tok, token); }

ellm_status ellm_chat_render(const ellm_model *model, const char *template_name,
                             const ellm_chat_message *msgs, int n_msgs, int add_generation_prompt,
                             char **out, size_t *out_len, ellm_error *err) {
    return ellm_chat_render_tools(model, template_name, msgs, n_msgs, add_generation_prompt, NULL, out, out_len, err);
}

const char *ellm_chat_template_source(const ellm_model *model, const char *template_name) {
    if (template_name) return chat_template_builtin(template_name);
    const char *src = ellm_tokenizer_chat_template(ellm_model_tokenizer(model));
    return src ? src : chat_template_builtin_guess(model->file);
}

ellm_status ellm_chat_render_tools(const ellm_model *model, const char *template_name,
                                   const ellm_chat_message *msgs, int n_msgs, int add_generation_prompt,
                                   const char *tools, char **out, size_t *out_len, ellm_error *err) {
    _Static_assert(sizeof(ellm_chat_message) == sizeof(chat_message), "chat message layouts differ");
    const chat_message *m = (const chat_message *)msgs;
    if (template_name) {
        const char *src = chat_template_builtin(template_name);
        if (!src) return ellm_fail(err, ELLM_ERR_ARG, "chat: no built-in template named '%s'", template_name);
        const char *bos = NULL, *eos = NULL;
        size_t n;
        if (tokenizer_bos(model->tok) >= 0) bos = tokenizer_piece(model->tok, tokenizer_bos(model->tok), &n);
        if (tokenizer_eos(model->tok) >= 0) eos = tokenizer_piece(model->tok, tokenizer_eos(model->tok), &n);
        chat_template_params p = {.messages = m, .n_messages = n_msgs, .add_generation_prompt = add_generation_prompt,
                                  .bos_token = bos, .eos_token = eos, .tools = tools};
        return chat_template_render_ex(src, strlen(src), &p, out, out_len, err);
    }
    return chat_template_render_gguf(model->file, NULL, m, n_msgs, add_generation_prompt, tools, out, out_len, err);
}

void ellm_free(void *p) { free(p); }
