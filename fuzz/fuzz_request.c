/* libFuzzer target: request JSON -> generation parameters (src/server/
 * request.c), the parser every body of /v1/chat/completions and
 * /v1/completions goes through. The first input byte picks the endpoint, the
 * rest is the body. Checks: a refused body gets a 4xx/5xx with a message and
 * an error JSON that parses back; an accepted one has every parameter in its
 * documented range, at least one message (chat) or a prompt (completion),
 * and only valid UTF-8 text. The body is also read as a model's reply for
 * tool calls (src/server/tool_calls.c) in each syntax: any calls found are
 * a JSON array of well-formed calls, the content a prefix of the text, and
 * what may be streamed at most the text; and through JSON mode's recognizer
 * (src/server/json_mask.c). */
#include "server/request.h"
#include "server/responses.h"
#include "server/json_mask.h"
#include "server/tool_calls.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(c)            \
    do {                      \
        if (!(c)) abort();    \
    } while (0)

/* resp_logprobs' token bytes: token 0 is the request's first stop string. */
static const char *stop_bytes(const void *arg, int32_t id, size_t *len) {
    const req_params *p = arg;
    if (id != 0 || !p->n_stop) return NULL;
    *len = strlen(p->stop[0]);
    return p->stop[0];
}

/* The body as a reply holding tool calls, in syntax s. */
static void fuzz_tool_calls(tool_syntax s, const char *text, size_t len) {
    size_t content = 0;
    char *calls = NULL;
    const int n = tool_calls_parse(s, text, len, 7, &content, &calls);
    REQUIRE(n >= -1 && content <= len);
    if (n > 0) {
        cJSON *j = cJSON_Parse(calls);
        REQUIRE(cJSON_IsArray(j) && cJSON_GetArraySize(j) == n);
        const cJSON *c;
        cJSON_ArrayForEach(c, j) {
            const cJSON *fn = cJSON_GetObjectItem(c, "function");
            REQUIRE(cJSON_IsString(cJSON_GetObjectItem(c, "id")) && cJSON_IsString(cJSON_GetObjectItem(fn, "name")) &&
                    cJSON_IsString(cJSON_GetObjectItem(fn, "arguments")));
        }
        cJSON_Delete(j);
        resp_meta m = {.id = "x", .model = "m", .kind = REQ_CHAT};
        char *chunk = resp_tool_calls_chunk(&m, 0, calls);
        resp_choice ch = {.text = text, .len = content, .finish = "tool_calls", .tool_calls = calls};
        char *whole = resp_final_choices(&m, &ch, 1);
        REQUIRE(chunk && whole);
        free(chunk);
        free(whole);
    } else {
        REQUIRE(!calls && content == len);
    }
    free(calls);
    REQUIRE(tool_calls_stream_safe(s, text, len, 0) <= len && tool_calls_stream_safe(s, text, len, 1) <= len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    req_kind kind = data[0] & 1 ? REQ_COMPLETION : REQ_CHAT;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    if (req_utf8_valid(body, len)) /* replies are text */
        for (int s = TOOLS_HERMES; s <= TOOLS_MISTRAL; s++) fuzz_tool_calls((tool_syntax)s, body, len);
    { /* JSON mode's recognizer: byte by byte and at once agree; a closed object takes no more text */
        json_state a, b;
        json_state_init(&a);
        json_state_init(&b);
        size_t i = 0;
        while (i < len && json_feed(&a, body + i, 1)) i++;
        REQUIRE(json_feed(&b, body, len) == (i == len));
        REQUIRE(a.depth <= JSON_MAX_DEPTH);
        if (i == len && a.done) REQUIRE(!json_feed(&a, "x", 1));
    }
    req_params p;
    req_error e;
    if (!req_parse(kind, body, len, &p, &e)) {
        REQUIRE(e.http_status >= 400 && e.http_status < 600);
        REQUIRE(e.message[0] && e.type);
        char *js = resp_error(&e);
        REQUIRE(js);
        cJSON *back = cJSON_Parse(js);
        REQUIRE(back && cJSON_IsObject(cJSON_GetObjectItem(back, "error")));
        cJSON_Delete(back);
        free(js);
        return 0;
    }
    REQUIRE(p.kind == kind);
    REQUIRE(p.temperature >= 0 && p.temperature <= 2);
    REQUIRE(p.top_p >= 0 && p.top_p <= 1);
    REQUIRE(p.min_p >= 0 && p.min_p <= 1);
    REQUIRE(p.top_k >= 0);
    REQUIRE(p.max_tokens == -1 || p.max_tokens >= 1);
    REQUIRE(p.n_stop >= 0 && p.n_stop <= REQ_MAX_STOP);
    for (int i = 0; i < p.n_stop; i++) REQUIRE(p.stop[i] && p.stop[i][0] && req_utf8_valid(p.stop[i], strlen(p.stop[i])));
    if (kind == REQ_CHAT) {
        REQUIRE(p.n_msgs >= 1 && p.msgs);
        for (int i = 0; i < p.n_msgs; i++) {
            const char *r = p.msgs[i].role;
            REQUIRE(!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant") || !strcmp(r, "tool"));
            REQUIRE(strcmp(r, "tool") || p.msgs[i].tool_call_id);
            if (p.msgs[i].tool_calls) {
                cJSON *tc = cJSON_Parse(p.msgs[i].tool_calls);
                REQUIRE(cJSON_IsArray(tc));
                cJSON_Delete(tc);
            }
            REQUIRE(p.msgs[i].content && req_utf8_valid(p.msgs[i].content, strlen(p.msgs[i].content)));
        }
    } else if (p.prompt_is_ids) {
        REQUIRE(p.n_prompt_ids >= 1 && p.prompt_ids);
        for (int i = 0; i < p.n_prompt_ids; i++) REQUIRE(p.prompt_ids[i] >= 0);
    } else {
        REQUIRE(p.prompt && strlen(p.prompt) == p.prompt_len && req_utf8_valid(p.prompt, p.prompt_len));
    }
    REQUIRE(p.top_logprobs >= 0 && p.top_logprobs <= REQ_MAX_TOP_LOGPROBS && (p.logprobs || !p.top_logprobs));
    REQUIRE((p.max_tokens != 0 || p.echo) && (!p.echo || (kind == REQ_COMPLETION && !p.stream)));
    REQUIRE(p.n_choices >= 1 && p.n_choices <= REQ_MAX_CHOICES);
    REQUIRE(p.n_more >= 0 && (1 + p.n_more) * p.n_choices <= REQ_MAX_JOBS && (!p.n_more || kind == REQ_COMPLETION));
    for (int i = 0; i < p.n_more; i++)
        REQUIRE(p.more[i].is_ids ? p.more[i].n_ids >= 1 && p.more[i].ids : p.more[i].text && strlen(p.more[i].text) == p.more[i].len);
    if (p.tools) {
        cJSON *t = cJSON_Parse(p.tools);
        REQUIRE(kind == REQ_CHAT && cJSON_IsArray(t) && cJSON_GetArraySize(t) > 0);
        cJSON_Delete(t);
    }
    {
        req_params q; /* a deep copy frees apart from the original (ASan) */
        if (req_params_copy(&q, &p)) req_params_free(&q);
    }
    REQUIRE(p.presence_penalty >= -2 && p.presence_penalty <= 2 && p.frequency_penalty >= -2 && p.frequency_penalty <= 2 &&
            p.repeat_penalty > 0 && p.repeat_last_n >= 0 && p.n_bias >= 0 && p.n_bias <= REQ_MAX_LOGIT_BIAS);
    for (int i = 0; i < p.n_bias; i++) REQUIRE(p.bias_ids[i] >= 0 && p.bias[i] >= -100 && p.bias[i] <= 100);
    /* the response builders take any text the parser accepted */
    resp_meta m = {.id = "x", .model = "m", .kind = kind};
    /* with log-probabilities: token 0's bytes are the first stop string's (any UTF-8 the parser took), others none */
    logprobs_token lp = {.chosen = {0, -1.0f}, .n_top = p.top_logprobs};
    for (int k = 0; k < lp.n_top; k++) lp.top[k] = (logprobs_item){k, -1.0f - (float)k};
    size_t off = 0;
    const resp_logprobs rl = {.lp = &lp, .offset = &off, .n = 1, .bytes = stop_bytes, .arg = &p};
    char *a = resp_final(&m, p.prompt ? p.prompt : "", p.prompt ? p.prompt_len : 0, "stop", p.logprobs ? &rl : NULL);
    char *b = resp_chunk(&m, 0, 1, p.n_stop ? p.stop[0] : "", p.n_stop ? strlen(p.stop[0]) : 0, p.logprobs ? &rl : NULL);
    char *f = resp_finish_chunk(&m, p.n_choices - 1, "stop", 1);
    REQUIRE(a && b && f);
    free(a);
    free(b);
    free(f);
    req_params_free(&p);
    return 0;
}
