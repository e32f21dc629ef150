/* OpenAI response objects, built with cJSON. */
#include "server/responses.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

char *resp_error(const req_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    if (e->param) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* A cJSON string from n bytes (not NUL-terminated). */
static cJSON *str_n(const char *text, size_t len) {
    char *tmp = malloc(len + 1);
    if (!tmp) return NULL;
    memcpy(tmp, text, len);
    tmp[len] = 0;
    cJSON *s = cJSON_CreateString(tmp);
    free(tmp);
    return s;
}

/* A JSON string of n token bytes: UTF-8 as it is, any byte that does not
 * start a valid character as U+FFFD. */
static cJSON *token_string(const char *b, size_t n) {
    char *tmp = malloc(3 * n + 1);
    if (!tmp) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)b[i];
        size_t k = !c ? 0 : c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (k && i + k <= n && req_utf8_valid(b + i, k)) {
            memcpy(tmp + o, b + i, k);
            o += k;
            i += k;
        } else {
            memcpy(tmp + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    tmp[o] = 0;
    cJSON *s = cJSON_CreateString(tmp);
    free(tmp);
    return s;
}

/* The bytes of token id (none if unknown). */
static const char *token_bytes(const resp_logprobs *lp, int32_t id, size_t *n) {
    const char *b = lp->bytes(lp->arg, id, n);
    if (!b) *n = 0;
    return b ? b : "";
}

/* {"token", "logprob", "bytes"} of one token (chat). */
static cJSON *chat_token(const resp_logprobs *lp, logprobs_item p) {
    size_t n = 0;
    const char *b = token_bytes(lp, p.id, &n);
    cJSON *o = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    cJSON_AddItemToObject(o, "token", token_string(b, n));
    cJSON_AddNumberToObject(o, "logprob", p.logprob);
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[i]));
    cJSON_AddItemToObject(o, "bytes", bytes);
    return o;
}

/* The "logprobs" value of a choice or chunk (see resp_logprobs). */
static cJSON *logprobs_json(req_kind kind, const resp_logprobs *lp) {
    if (!lp) return cJSON_CreateNull();
    cJSON *root = cJSON_CreateObject();
    if (kind == REQ_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(root, "content");
        for (int i = 0; i < lp->n; i++) {
            const logprobs_token *t = &lp->lp[i];
            if (t->chosen.id < 0) continue;
            cJSON *e = chat_token(lp, t->chosen), *top = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int k = 0; k < t->n_top; k++) cJSON_AddItemToArray(top, chat_token(lp, t->top[k]));
            cJSON_AddItemToArray(content, e);
        }
        return root;
    }
    cJSON *tokens = cJSON_AddArrayToObject(root, "tokens"), *lps = cJSON_AddArrayToObject(root, "token_logprobs"),
          *tops = cJSON_AddArrayToObject(root, "top_logprobs"), *offs = cJSON_AddArrayToObject(root, "text_offset");
    for (int i = 0; i < lp->n; i++) {
        const logprobs_token *t = &lp->lp[i];
        if (t->chosen.id < 0) continue;
        size_t n = 0;
        const char *b = token_bytes(lp, t->chosen.id, &n);
        cJSON_AddItemToArray(tokens, token_string(b, n));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(t->chosen.logprob));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(lp->offset ? lp->offset[i] : 0)));
        if (isnan(t->chosen.logprob)) { /* an echoed prompt's first token: nothing before it */
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        /* an object keyed by token text: of tokens with the same text, the likelier */
        cJSON *top = cJSON_CreateObject();
        for (int k = 0; k < t->n_top; k++) {
            b = token_bytes(lp, t->top[k].id, &n);
            cJSON *key = token_string(b, n);
            if (key && !cJSON_GetObjectItemCaseSensitive(top, key->valuestring))
                cJSON_AddNumberToObject(top, key->valuestring, t->top[k].logprob);
            cJSON_Delete(key);
        }
        cJSON_AddItemToArray(tops, top);
    }
    return root;
}

static void add_usage(cJSON *root, const resp_meta *m) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", m->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", m->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", m->prompt_tokens + m->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", m->cached_tokens);
}

static cJSON *head(const resp_meta *m, const char *object) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    cJSON_AddStringToObject(root, "model", m->model);
    return root;
}

static char *print(cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

char *resp_final_choices(const resp_meta *m, const resp_choice *choices, int n) {
    int chat = m->kind == REQ_CHAT;
    cJSON *root = head(m, chat ? "chat.completion" : "text_completion");
    cJSON *arr = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < n; i++) {
        const resp_choice *ch = &choices[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, c);
        cJSON_AddNumberToObject(c, "index", i);
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON *calls = ch->tool_calls ? cJSON_Parse(ch->tool_calls) : NULL;
            /* OpenAI's: a reply of calls alone has content null */
            if (calls && ch->len == 0) cJSON_AddNullToObject(msg, "content");
            else cJSON_AddItemToObject(msg, "content", str_n(ch->text, ch->len));
            if (calls) cJSON_AddItemToObject(msg, "tool_calls", calls);
        } else {
            cJSON_AddItemToObject(c, "text", str_n(ch->text, ch->len));
        }
        cJSON_AddItemToObject(c, "logprobs", logprobs_json(m->kind, ch->lp));
        cJSON_AddStringToObject(c, "finish_reason", ch->finish);
    }
    add_usage(root, m);
    return print(root);
}

char *resp_final(const resp_meta *m, const char *text, size_t len, const char *finish, const resp_logprobs *lp) {
    const resp_choice c = {.text = text, .len = len, .finish = finish, .lp = lp};
    return resp_final_choices(m, &c, 1);
}

/* A chunk of choice `index`: a chat's delta (role and content as given), or
 * a completion's text, then logprobs and finish_reason. */
static cJSON *chunk(const resp_meta *m, int index, int role, const char *text, size_t len, int content,
                    const resp_logprobs *lp, const char *finish) {
    int chat = m->kind == REQ_CHAT;
    cJSON *root = head(m, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", index);
    if (chat) {
        cJSON *delta = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(delta, "role", "assistant");
        if (content) cJSON_AddItemToObject(delta, "content", str_n(text, len));
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text, len));
    }
    cJSON_AddItemToObject(c, "logprobs", logprobs_json(m->kind, lp));
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return root;
}

char *resp_chunk(const resp_meta *m, int index, int role, const char *text, size_t len, const resp_logprobs *lp) {
    /* a token's chunk always has content ("" for a token with no text yet) */
    return print(chunk(m, index, role, text, len, 1, lp, NULL));
}

char *resp_tool_calls_chunk(const resp_meta *m, int index, const char *calls) {
    cJSON *root = chunk(m, index, 0, "", 0, 0, NULL, NULL);
    cJSON *arr = cJSON_Parse(calls);
    cJSON *delta = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "delta");
    if (!root || !cJSON_IsArray(arr) || !delta) {
        cJSON_Delete(arr);
        cJSON_Delete(root);
        return NULL;
    }
    int i = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, arr) cJSON_AddNumberToObject(c, "index", i++); /* streamed calls carry their index */
    cJSON_AddItemToObject(delta, "tool_calls", arr);
    return print(root);
}

char *resp_finish_chunk(const resp_meta *m, int index, const char *finish, int usage) {
    /* the final chunk's delta is empty, as OpenAI's is */
    cJSON *root = chunk(m, index, 0, "", 0, 0, NULL, finish);
    if (usage) add_usage(root, m);
    return print(root);
}

char *resp_usage_chunk(const resp_meta *m) {
    cJSON *root = head(m, m->kind == REQ_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, m);
    return print(root);
}
