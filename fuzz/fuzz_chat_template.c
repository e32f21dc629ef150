/* libFuzzer harness for the chat template interpreter (src/chat/chat.h,
 * jinja_*.c). The input is a template; if it contains a NUL
 * byte, what follows the first NUL becomes the content of one more user
 * message, so message text is fuzzed too; the same bytes are also given as
 * the JSON of the tools array and of an assistant turn's tool calls (most
 * inputs are refused as JSON; those that parse reach the template as
 * values). Each input is parsed on its own
 * (chat_template_check) and rendered over a fixed conversation with tight
 * limits, so that runaway templates end quickly instead of timing out.
 * Any status is fine; crashes, leaks, sanitizer reports and timeouts are not.
 * Build and run: see fuzz/README.md. */
#include "chat/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *src = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t tpl_len = nul ? (size_t)(nul - data) : size;

    /* the extra message: the bytes after the first NUL, NUL-terminated */
    char *extra = NULL;
    if (nul) {
        size_t n = size - tpl_len - 1;
        extra = malloc(n + 1);
        if (!extra) return 0;
        memcpy(extra, nul + 1, n);
        extra[n] = 0;
    }

    chat_message msgs[] = {
        {.role = "system", .content = "You are a helpful assistant."},
        {.role = "user", .content = "Hello <|im_end|> {{ not a tag }}"},
        {.role = "assistant", .content = "   <think>\nhm\n</think>\n\nHi there   "},
        {.role = "tool", .content = NULL, .tool_call_id = "call_1", .name = "f"},
        {.role = "user", .content = extra ? extra : "Another question"},
        {.role = "assistant", .content = NULL, .tool_calls = extra},
    };
    chat_template_limits lim = {
        .max_output = 1 << 20,
        .max_memory = 64 << 20,
        .max_iterations = 20000,
        .max_steps = 200000,
        .max_nesting = 100,
        .max_call_depth = 32,
    };
    chat_template_params p = {
        .messages = msgs,
        .n_messages = extra && (size & 2) ? 6 : 5,
        .add_generation_prompt = (int)(size & 1),
        .bos_token = "<s>",
        .eos_token = "</s>",
        .now = 1721995200,
        .limits = &lim,
        .tools = extra && (size & 4) ? extra : NULL,
    };
    ellm_error err;
    (void)chat_template_check(src, tpl_len, &err);
    char *out = NULL;
    size_t out_len = 0;
    ellm_status st = chat_template_render_ex(src, tpl_len, &p, &out, &out_len, &err);
    if ((st == ELLM_OK) != (out != NULL) || (out && out[out_len] != 0)) abort();
    free(out);
    free(extra);
    return 0;
}
