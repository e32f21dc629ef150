/* Tool calls in generated text: which syntax a model's chat template teaches
 * it, and the calls (OpenAI's "tool_calls") split from the text it wrote.
 *
 * Pure functions of the text (no model, no HTTP), so they can be tested and
 * fuzzed alone. Three syntaxes cover the templates that handle tools:
 *   TOOLS_HERMES   <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
 *                  any number, after optional text (Qwen2.5, Qwen3, Hermes);
 *   TOOLS_LLAMA3   the whole reply one JSON object {"name": ...,
 *                  "parameters": {...}} (Llama 3.1-3.3; their <|python_tag|>
 *                  is a control token, not in the text);
 *   TOOLS_MISTRAL  the whole reply a JSON array [{"name": ..., "arguments":
 *                  {...}}, ...] after the control token [TOOL_CALLS] (which
 *                  may or may not be in the text).
 * A reply that does not parse as calls of its syntax is text, as it is. */
#ifndef ELLM_SERVER_TOOL_CALLS_H
#define ELLM_SERVER_TOOL_CALLS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { TOOLS_NONE, TOOLS_HERMES, TOOLS_LLAMA3, TOOLS_MISTRAL } tool_syntax;

/* The syntax a chat template (Jinja source, NULL: none) teaches; TOOLS_NONE
 * for templates that do not handle tools or use another syntax (then the
 * reply stays text). */
tool_syntax tool_syntax_of(const char *template_src);
/* "hermes", "llama3", "mistral" or "none". */
const char *tool_syntax_name(tool_syntax s);

/* Splits text[0, len): *content_len = the bytes of text before the calls
 * (trailing whitespace left out), *calls = a malloc'ed JSON array of OpenAI
 * tool calls ({"id": "call_...", "type": "function", "function": {"name",
 * "arguments": JSON text}}), ids made from id_seed and the call's index.
 * Returns the number of calls; 0 (*calls NULL, *content_len = len) when the
 * text holds none or any of them does not parse; -1 if out of memory. */
int tool_calls_parse(tool_syntax s, const char *text, size_t len, uint64_t id_seed, size_t *content_len, char **calls);

/* While a reply is streamed: how many bytes of `rest`, the len bytes not
 * yet sent, can go out as text: everything before where a call may be
 * starting (a marker, or a prefix of one at the end, or a reply whose first
 * non-blank character opens the JSON of a call), blanks at the end held back
 * too. `sent`: some of the reply already went out as text (so it holds no
 * call's start, and a reply that must open with its call does not). Reads
 * only `rest`, so a stream's scans add up to the reply's length once. */
size_t tool_calls_stream_safe(tool_syntax s, const char *rest, size_t len, int sent);

#endif
