/* Chat templates: renders a conversation into the prompt text a model was
 * trained on, by interpreting the model's `tokenizer.chat_template` (a Jinja2
 * template, as Hugging Face transformers renders it) or a built-in template.
 *
 * The interpreter covers the subset of Jinja2 that chat templates use:
 *  - statements: if/elif/else, for (loop.index/index0/first/last/length/...,
 *    `for x in xs if cond`, tuple targets, `else`), set (names, tuples,
 *    namespace attributes, {% set x %}...{% endset %}), macro, break/continue,
 *    filter blocks, raw, and transformers' generation/endgeneration markers;
 *  - whitespace control as transformers configures Jinja: trim_blocks and
 *    lstrip_blocks on, `-` and `+` modifiers, one trailing newline dropped;
 *  - expressions with Python semantics: arithmetic, comparisons, and/or/not,
 *    in/not in, is-tests, ternaries, subscripts and slices (`[::-1]`),
 *    attribute access, literals (lists, tuples, dicts), string methods
 *    (strip, split, startswith, replace, ...), dict methods (items, get, ...),
 *    the filters templates use (trim, tojson, join, selectattr, map, ...),
 *    and the globals raise_exception, namespace, range, dict, strftime_now.
 *
 * Values print as Python prints them (True, None, ['a']); undefined names
 * render as empty strings and attribute access on them stays undefined.
 *
 * Errors (never an abort, on any input):
 *  - ELLM_ERR_FORMAT: syntax errors and runtime errors (type errors, undefined
 *    functions), with "line:column" of the offending construct;
 *  - ELLM_ERR_UNSUPPORTED: valid Jinja this interpreter does not implement
 *    (include, call blocks, an unknown filter/test/method), naming it and
 *    its line:column; also templates that exceed a limit below;
 *  - ELLM_ERR_ARG: the template called raise_exception (the message is the
 *    template's, e.g. "Conversation roles must alternate ..."), or a bad
 *    argument from the caller;
 *  - ELLM_ERR_NOMEM: an allocation failed.
 * Runaway templates are stopped by the limits: nesting depth, macro recursion,
 * evaluation steps, loop iterations, output size and working memory.
 *
 * Safe on untrusted templates and messages. Needs about 1 MiB of stack. */
#ifndef ELLM_CHAT_CHAT_H
#define ELLM_CHAT_CHAT_H

#include "ellm.h"
#include "gguf/gguf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *role;    /* "system", "user", "assistant", "tool", ... (NUL-terminated) */
    const char *content; /* NUL-terminated; NULL renders as None */
    /* Tool calling (each NULL: the key is absent from the message's dict):
     * tool_calls, JSON text of an array of OpenAI tool calls ({"id", "type":
     * "function", "function": {"name", "arguments"}}), whose "arguments"
     * strings holding a JSON object reach the template as that object (as
     * transformers' templates and llama.cpp expect; a template that fails
     * on that with a type error, as DeepSeek's that join the arguments to
     * text with `+`, is rendered again with them as strings); tool_call_id
     * and name of
     * a "tool" message (the call it answers, the function's name). */
    const char *tool_calls;
    const char *tool_call_id;
    const char *name;
} chat_message;

/* Bounds on one render; 0 in a field means its default. */
typedef struct {
    size_t max_output;         /* bytes of rendered text (default 64 MiB) */
    size_t max_memory;         /* bytes of interpreter working memory (default 256 MiB) */
    uint64_t max_iterations;   /* loop iterations + range() items, summed (default 1M) */
    uint64_t max_steps;        /* evaluated nodes (default 50M) */
    int max_nesting;           /* template nesting depth (default 100) */
    int max_call_depth;        /* macro recursion depth (default 64) */
} chat_template_limits;

typedef struct {
    const chat_message *messages;
    int n_messages;
    int add_generation_prompt;
    const char *bos_token;            /* NULL = "" */
    const char *eos_token;            /* NULL = "" */
    int64_t now;                      /* unix time for strftime_now (UTC); 0 = the current time */
    const chat_template_limits *limits; /* NULL = defaults */
    const char *tools;                /* JSON text of the tools array (OpenAI's "tools"), or NULL: None */
} chat_template_params;

/* Renders `template_src` (`len` bytes, need not be NUL-terminated) for the
 * conversation; on ELLM_OK *out is a malloc'ed NUL-terminated string of
 * *out_len bytes that the caller frees. The template sees messages (a list of
 * {role, content} dicts, plus tool_calls / tool_call_id / name where given),
 * add_generation_prompt, bos_token, eos_token, tools (None here; see
 * chat_template_render_ex) and documents = None. Malformed tools or
 * tool_calls JSON is ELLM_ERR_ARG. On failure *out is NULL and err says why. */
ellm_status chat_template_render(const char *template_src, size_t len, const chat_message *msgs,
                                 int n_msgs, int add_generation_prompt, const char *bos_token,
                                 const char *eos_token, char **out, size_t *out_len,
                                 ellm_error *err);

/* chat_template_render with every option (clock, limits). */
ellm_status chat_template_render_ex(const char *template_src, size_t len,
                                    const chat_template_params *params, char **out,
                                    size_t *out_len, ellm_error *err);

/* Checks that `template_src` parses; ELLM_OK or the error render would give
 * for its syntax (runtime errors depend on the messages and are not found). */
ellm_status chat_template_check(const char *template_src, size_t len, ellm_error *err);

/* The built-in template called `name` ("llama2", "llama3", "chatml",
 * "mistral", "phi3", "deepseek", "deepseek-coder", "deepseek3", "gemma",
 * "zephyr"), each the official template of that family; NULL if unknown. */
const char *chat_template_builtin(const char *name);

/* The built-in template chat_template_render_gguf falls back on for a file
 * without tokenizer.chat_template (the family guessed from its special
 * tokens), or NULL. */
const char *chat_template_builtin_guess(const gguf_file *f);

/* The built-in names, NULL-terminated (for listing). */
const char *const *chat_template_builtin_names(void);

/* Renders the conversation with the chat template of the model in `f`:
 * `tokenizer.chat_template` if present, else the built-in `fallback` (NULL:
 * the family guessed from the vocabulary's special tokens). bos_token and
 * eos_token are the texts of tokenizer.ggml.bos_token_id / eos_token_id;
 * tools: JSON text of the tools array, or NULL (None). ELLM_ERR_UNSUPPORTED
 * if there is no template to use. Output as for chat_template_render. */
ellm_status chat_template_render_gguf(const gguf_file *f, const char *fallback,
                                      const chat_message *msgs, int n_msgs,
                                      int add_generation_prompt, const char *tools, char **out,
                                      size_t *out_len, ellm_error *err);

#endif
