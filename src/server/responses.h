/* JSON bodies of the OpenAI API: completions, chunks, errors. */
#ifndef ELLM_SERVER_RESPONSES_H
#define ELLM_SERVER_RESPONSES_H

#include "server/request.h"

#include <stddef.h>

typedef struct {
    const char *id;    /* "chatcmpl-..." or "cmpl-..." */
    const char *model;
    long created;
    req_kind kind;
    int prompt_tokens, completion_tokens, cached_tokens;
} resp_meta;

/* Each returns a malloc'ed NUL-terminated JSON string, or NULL if out of memory. */
char *resp_error(const req_error *e);
char *resp_final(const resp_meta *m, const char *text, size_t len, const char *finish);
/* A streamed chunk: role (chat, first chunk), one token's text delta
 * (possibly ""), or the final chunk (finish != NULL, with usage). */
char *resp_chunk(const resp_meta *m, int role, const char *text, size_t len, const char *finish);
/* The stream_options.include_usage chunk: no choices, usage only. */
char *resp_usage_chunk(const resp_meta *m);

#endif
