/* OpenAI response objects, built with cJSON. */
#include "server/responses.h"

#include <cjson/cJSON.h>
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

char *resp_final(const resp_meta *m, const char *text, size_t len, const char *finish) {
    int chat = m->kind == REQ_CHAT;
    cJSON *root = head(m, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddItemToObject(msg, "content", str_n(text, len));
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text, len));
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish);
    add_usage(root, m);
    return print(root);
}

char *resp_chunk(const resp_meta *m, int role, const char *text, size_t len, const char *finish) {
    int chat = m->kind == REQ_CHAT;
    cJSON *root = head(m, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *delta = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(delta, "role", "assistant");
        /* a token's chunk always has content ("" for a token with no text
         * yet); the final chunk's delta is empty, as OpenAI's is */
        if (role || len || !finish) cJSON_AddItemToObject(delta, "content", str_n(text, len));
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text, len));
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    if (finish) add_usage(root, m);
    return print(root);
}

char *resp_usage_chunk(const resp_meta *m) {
    cJSON *root = head(m, m->kind == REQ_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, m);
    return print(root);
}
