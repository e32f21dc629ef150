/* JSON bodies of the OpenAI API: completions, chunks, errors. */
#ifndef ELLM_SERVER_RESPONSES_H
#define ELLM_SERVER_RESPONSES_H

#include "server/logprobs.h"
#include "server/request.h"

#include <stddef.h>

typedef struct {
    const char *id;    /* "chatcmpl-..." or "cmpl-..." */
    const char *model;
    long created;
    req_kind kind;
    int prompt_tokens, completion_tokens, cached_tokens;
} resp_meta;

/* The log-probabilities of a response's tokens: n entries (one left out
 * where chosen.id < 0), each token's bytes from bytes(arg, id, &len) (NULL:
 * none), and (completions,
 * whose format has a "text_offset") where each token's text starts in the
 * choice's text. Chat gives OpenAI's {"content": [{token, logprob, bytes,
 * top_logprobs}]}, completions {tokens, logprobs_token, top_logprobs,
 * text_offset}; a token whose logprob is NAN gets null for it and its
 * alternatives. A token's "token" string shows bytes that are not UTF-8 on
 * their own (part of a character) as U+FFFD; "bytes" has them as they are. */
typedef struct {
    const logprobs_token *lp;
    const size_t *offset;
    int n;
    const char *(*bytes)(const void *arg, int32_t id, size_t *len);
    const void *arg;
} resp_logprobs;

/* Each returns a malloc'ed NUL-terminated JSON string, or NULL if out of
 * memory. lp NULL: "logprobs": null. */
char *resp_error(const req_error *e);
char *resp_final(const resp_meta *m, const char *text, size_t len, const char *finish, const resp_logprobs *lp);
/* One choice of a whole response. */
typedef struct {
    const char *text;
    size_t len;
    const char *finish;
    const resp_logprobs *lp; /* NULL: "logprobs": null */
    const char *tool_calls;  /* chat: JSON text of the message's tool_calls (tool_calls.h), or NULL */
} resp_choice;
/* A whole response with n choices (index 0 .. n - 1). */
char *resp_final_choices(const resp_meta *m, const resp_choice *choices, int n);
/* A streamed chunk of choice `index`: a chat's role (its first chunk), or
 * one token's text delta (possibly "") with its log-probabilities if asked. */
char *resp_chunk(const resp_meta *m, int index, int role, const char *text, size_t len, const resp_logprobs *lp);
/* Choice `index`'s tool calls as one chunk: delta {"tool_calls": [{"index",
 * "id", "type", "function": {"name", "arguments"}}, ...]} from `calls`, the
 * JSON text of tool_calls_parse. */
char *resp_tool_calls_chunk(const resp_meta *m, int index, const char *calls);
/* Choice `index`'s final chunk: its finish_reason, and the usage with `usage`. */
char *resp_finish_chunk(const resp_meta *m, int index, const char *finish, int usage);
/* The stream_options.include_usage chunk: no choices, usage only. */
char *resp_usage_chunk(const resp_meta *m);

#endif
