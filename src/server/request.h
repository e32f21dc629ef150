/* OpenAI-style request bodies -> generation parameters.
 *
 * Pure functions of the body bytes (no HTTP, no model), so the parser can be
 * fuzzed on its own (fuzz/fuzz_request.c). Every field is type-checked; a bad
 * one yields an error naming it, in the shape the OpenAI API uses. */
#ifndef ELLM_SERVER_REQUEST_H
#define ELLM_SERVER_REQUEST_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

#define REQ_MAX_STOP 4
/* Alternatives per token a request may ask for with logprobs (OpenAI's limit for chat). */
#define REQ_MAX_TOP_LOGPROBS 20
/* Choices ("n") a request may ask for. */
#define REQ_MAX_CHOICES 16
/* Sequences (prompts x choices) one request may ask for. */
#define REQ_MAX_JOBS 64
/* Entries of logit_bias a request may give. */
#define REQ_MAX_LOGIT_BIAS 1024

typedef enum { REQ_CHAT, REQ_COMPLETION } req_kind;

/* An error for the client: HTTP status, OpenAI "type" and "code", message. */
typedef struct {
    int http_status;
    const char *type;  /* "invalid_request_error", "authentication_error", ... */
    const char *code;  /* short machine-readable code, or NULL */
    const char *param; /* the offending field, or NULL */
    char message[400];
} req_error;

/* One prompt of several (completions' "prompt": [...]): text, or token ids. */
typedef struct {
    char *text;
    size_t len;
    int32_t *ids;
    int n_ids;
    int is_ids;
} req_prompt;
void req_prompt_free(req_prompt *q);

typedef struct {
    req_kind kind;
    int stream;
    int include_usage;     /* stream_options.include_usage */
    int max_tokens;        /* < 0: until the context is full; 0 (with echo): none, the prompt scored */
    float temperature;     /* OpenAI default 1 */
    float top_p;           /* default 1 (off) */
    int top_k;             /* llama.cpp extension; 0 = off */
    float min_p;           /* llama.cpp extension; 0 = off */
    float presence_penalty, frequency_penalty; /* OpenAI's, -2..2; 0 = off */
    float repeat_penalty;  /* llama.cpp extension; 1 = off */
    int repeat_last_n;     /* llama.cpp extension: tokens the penalties look back (default 64; 0 = all) */
    int32_t *bias_ids;     /* logit_bias: token ids and their biases (-100..100) */
    float *bias;
    int n_bias;
    int seed_given;
    uint64_t seed;
    int ignore_eos;        /* llama.cpp extension */
    int logprobs;          /* return each generated token's log-probability */
    int top_logprobs;      /* and this many most likely alternatives (0..REQ_MAX_TOP_LOGPROBS) */
    int echo;              /* completions, not streamed: the prompt leads the text (and its tokens the logprobs) */
    int n_choices;         /* "n": completions of the prompt, each its own sequence (not streamed when > 1) */
    char *stop[REQ_MAX_STOP];
    int n_stop;
    /* chat: messages (strings owned here: content, tool_calls JSON, tool_call_id, name) */
    ellm_chat_message *msgs;
    int n_msgs;
    /* chat: the functions the model may call (JSON text of "tools", owned), or
     * NULL; tool_choice "none" keeps them out of the prompt (tools_off) */
    char *tools;
    int tools_off;
    int json_mode;         /* response_format {"type": "json_object"}: the reply is a JSON object (json_mask.h) */
    /* completion: a text prompt, or token ids */
    char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    int n_prompt_ids;
    int prompt_is_ids;
    /* completions with several prompts: the first in the fields above, the others here */
    req_prompt *more;
    int n_more;
} req_params;

/* Parses `len` bytes of `body` as a request of `kind`. On failure returns 0
 * and fills *e (status 400); on success fills *out (release with
 * req_params_free). */
int req_parse(req_kind kind, const char *body, size_t len, req_params *out, req_error *e);
void req_params_free(req_params *p);
/* A deep copy of src into *dst (release with req_params_free); 0 if out of memory (dst then empty). */
int req_params_copy(req_params *dst, const req_params *src);

/* Fills *e with a status, type, code, param and printf-style message; returns 0. */
int req_fail(req_error *e, int http_status, const char *type, const char *code, const char *param,
             const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* 1 if the n bytes are valid UTF-8 (no overlongs, surrogates or values past U+10FFFF). */
int req_utf8_valid(const char *s, size_t n);

#endif
