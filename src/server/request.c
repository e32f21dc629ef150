/* Request JSON -> generation parameters, with OpenAI-style errors. */
#include "server/request.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MESSAGES 4096
#define MAX_TOOLS 256
#define MAX_PROMPT_IDS (1 << 22)

int req_fail(req_error *e, int http_status, const char *type, const char *code, const char *param,
             const char *fmt, ...) {
    e->http_status = http_status;
    e->type = type;
    e->code = code;
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return 0;
}

static int bad(req_error *e, const char *param, const char *fmt, const char *what) {
    return req_fail(e, 400, "invalid_request_error", "invalid_value", param, fmt, what);
}

int req_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return 0;
        if (n - i < (size_t)len) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)len;
    }
    return 1;
}

/* A NUL-terminated copy of n bytes (NULL if out of memory). */
static char *dup_n(const void *src, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, src, n);
        d[n] = 0;
    }
    return d;
}

static char *dup_str(const char *s, size_t *len) {
    size_t n = strlen(s);
    if (len) *len = n;
    return dup_n(s, n);
}

/* A number field in [lo, hi] (absent or null: keep *out). */
static int get_float(const cJSON *root, const char *name, double lo, double hi, float *out, req_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsNumber(v)) return req_fail(e, 400, "invalid_request_error", "invalid_type", name, "'%s' must be a number", name);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return req_fail(e, 400, "invalid_request_error", "invalid_value", name, "'%s' must be between %g and %g", name, lo,
                        hi);
    *out = (float)v->valuedouble;
    return 1;
}

/* An integer field in [lo, hi]; *given set to 1 when present. */
static int get_int(const cJSON *root, const char *name, double lo, double hi, double *out, int *given, req_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return req_fail(e, 400, "invalid_request_error", "invalid_type", name, "'%s' must be an integer", name);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return req_fail(e, 400, "invalid_request_error", "invalid_value", name, "'%s' must be between %.0f and %.0f", name,
                        lo, hi);
    *out = v->valuedouble;
    if (given) *given = 1;
    return 1;
}

static int get_bool(const cJSON *root, const char *name, int *out, req_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsBool(v)) return req_fail(e, 400, "invalid_request_error", "invalid_type", name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 1;
}

/* Message content: a string, null (empty), or an array of {"type":"text","text":...} parts. */
static char *content_text(const cJSON *c, req_error *e) {
    if (!c || cJSON_IsNull(c)) return dup_str("", NULL);
    if (cJSON_IsString(c)) return dup_str(c->valuestring, NULL);
    if (!cJSON_IsArray(c)) {
        bad(e, "messages", "%s", "message 'content' must be a string or an array of text parts");
        return NULL;
    }
    size_t cap = 1, len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
            !cJSON_IsString(text)) {
            bad(e, "messages", "%s", "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
            return NULL;
        }
        cap += strlen(text->valuestring);
    }
    char *out = malloc(cap);
    if (!out) return NULL;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(out + len, t, n);
        len += n;
    }
    out[len] = 0;
    return out;
}

/* An owned copy of a string field of message m (NULL when absent); *bad_out
 * set when it is there but not a string. */
static char *msg_str(const cJSON *m, const char *name, int *bad_out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, name);
    if (!v || cJSON_IsNull(v)) return NULL;
    if (!cJSON_IsString(v)) {
        *bad_out = 1;
        return NULL;
    }
    return dup_str(v->valuestring, NULL);
}

/* v as compact JSON text in memory of our own (freed with free), or NULL
 * with a 500 in *e. */
static char *json_text(const cJSON *v, req_error *e) {
    char *text = cJSON_PrintUnformatted(v);
    char *own = text ? dup_str(text, NULL) : NULL;
    cJSON_free(text);
    if (!own) req_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return own;
}

/* An assistant message's "tool_calls": OpenAI's array of {"id", "type":
 * "function", "function": {"name", "arguments": string}}, kept as JSON text
 * for the chat template. */
static int parse_msg_tool_calls(const cJSON *tc, ellm_chat_message *out, req_error *e) {
    if (!tc || cJSON_IsNull(tc)) return 1;
    if (!cJSON_IsArray(tc))
        return req_fail(e, 400, "invalid_request_error", "invalid_type", "messages", "a message's 'tool_calls' must be an array");
    const cJSON *c;
    cJSON_ArrayForEach(c, tc) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(name) || (args && !cJSON_IsString(args)))
            return req_fail(e, 400, "invalid_request_error", "invalid_type", "messages",
                            "each tool call must be {\"id\", \"type\": \"function\", \"function\": {\"name\": string, "
                            "\"arguments\": string}}");
    }
    char *text = json_text(tc, e);
    out->tool_calls = text;
    return text != NULL;
}

/* "tools" (functions the model may call) and "tool_choice". Only "auto"
 * (the default) and "none" are honoured: "required" or a named function
 * would need decoding constrained to a call, which this server does not do. */
static int parse_tools(const cJSON *root, req_params *p, req_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (choice && !cJSON_IsNull(choice)) {
        if (!cJSON_IsString(choice) && !cJSON_IsObject(choice))
            return req_fail(e, 400, "invalid_request_error", "invalid_type", "tool_choice",
                            "'tool_choice' must be a string or an object");
        if (cJSON_IsObject(choice) || !strcmp(choice->valuestring, "required"))
            return req_fail(e, 400, "invalid_request_error", "unsupported_value", "tool_choice",
                            "'tool_choice' %s is not supported: only \"auto\" and \"none\" (the model decides whether to call)",
                            cJSON_IsObject(choice) ? "naming a function" : "\"required\"");
        if (strcmp(choice->valuestring, "auto") && strcmp(choice->valuestring, "none"))
            return req_fail(e, 400, "invalid_request_error", "invalid_value", "tool_choice",
                            "'tool_choice' must be \"auto\", \"none\", \"required\" or a function");
        p->tools_off = !strcmp(choice->valuestring, "none");
    }
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    if (ptc && !cJSON_IsNull(ptc) && !cJSON_IsBool(ptc))
        return req_fail(e, 400, "invalid_request_error", "invalid_type", "parallel_tool_calls",
                        "'parallel_tool_calls' must be a boolean");
    if (!tools || cJSON_IsNull(tools)) return 1;
    if (!cJSON_IsArray(tools))
        return req_fail(e, 400, "invalid_request_error", "invalid_type", "tools", "'tools' must be an array");
    if (cJSON_GetArraySize(tools) > MAX_TOOLS)
        return req_fail(e, 400, "invalid_request_error", "invalid_value", "tools", "more than %d tools", MAX_TOOLS);
    if (cJSON_GetArraySize(tools) == 0) return 1;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return req_fail(e, 400, "invalid_request_error", "invalid_value", "tools",
                            "each tool must be {\"type\": \"function\", \"function\": {...}}");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !name->valuestring[0])
            return req_fail(e, 400, "invalid_request_error", "invalid_value", "tools", "each tool's function needs a 'name'");
        if (params && !cJSON_IsObject(params))
            return req_fail(e, 400, "invalid_request_error", "invalid_type", "tools",
                            "tool '%.60s': 'parameters' must be a JSON Schema object", name->valuestring);
    }
    p->tools = json_text(tools, e);
    return p->tools != NULL;
}

static int parse_messages(const cJSON *root, req_params *p, req_error *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) return req_fail(e, 400, "invalid_request_error", "missing_field", "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs))
        return req_fail(e, 400, "invalid_request_error", "invalid_type", "messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return req_fail(e, 400, "invalid_request_error", "invalid_value", "messages", "'messages' must not be empty");
    if (n > MAX_MESSAGES)
        return req_fail(e, 400, "invalid_request_error", "invalid_value", "messages", "more than %d messages", MAX_MESSAGES);
    p->msgs = calloc((size_t)n, sizeof *p->msgs);
    if (!p->msgs) return req_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (!cJSON_IsObject(m))
            return req_fail(e, 400, "invalid_request_error", "invalid_type", "messages", "each message must be an object");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return req_fail(e, 400, "invalid_request_error", "invalid_type", "messages", "each message needs a string 'role'");
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))
            return req_fail(e, 400, "invalid_request_error", "invalid_value", "messages",
                            "message role '%.40s' is not supported (system, developer, user, assistant, tool)", r);
        char *text = content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), e);
        if (!text) return e->http_status ? 0 : req_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        ellm_chat_message *cm = &p->msgs[p->n_msgs++];
        cm->role = !strcmp(r, "system") ? "system" : !strcmp(r, "user") ? "user" : !strcmp(r, "tool") ? "tool" : "assistant";
        cm->content = text;
        int wrong = 0;
        if (!strcmp(r, "tool")) {
            cm->tool_call_id = msg_str(m, "tool_call_id", &wrong);
            cm->name = msg_str(m, "name", &wrong);
            if (wrong || !cm->tool_call_id)
                return req_fail(e, 400, "invalid_request_error", "invalid_value", "messages",
                                "a 'tool' message needs a string 'tool_call_id' (the call it answers)");
        } else if (!strcmp(r, "assistant")) {
            if (!parse_msg_tool_calls(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), cm, e)) return 0;
        }
    }
    return 1;
}

/* One prompt: a string, or an array of token ids. */
static int parse_one_prompt(const cJSON *pr, req_prompt *out, req_error *e) {
    if (cJSON_IsString(pr)) {
        out->text = dup_str(pr->valuestring, &out->len);
        return out->text ? 1 : req_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!cJSON_IsArray(pr))
        return req_fail(e, 400, "invalid_request_error", "invalid_type", "prompt",
                        "'prompt' must be a string, an array of token ids, or an array of those");
    int n = cJSON_GetArraySize(pr);
    if (n == 0) return req_fail(e, 400, "invalid_request_error", "invalid_value", "prompt", "'prompt' must not be empty");
    if (n > MAX_PROMPT_IDS)
        return req_fail(e, 400, "invalid_request_error", "invalid_value", "prompt", "more than %d prompt tokens", MAX_PROMPT_IDS);
    out->ids = malloc((size_t)n * sizeof *out->ids);
    if (!out->ids) return req_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    out->is_ids = 1;
    const cJSON *t;
    cJSON_ArrayForEach(t, pr) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble > 2147483647.0)
            return req_fail(e, 400, "invalid_request_error", "invalid_type", "prompt",
                            "'prompt' arrays must hold token ids (non-negative integers), or prompts");
        out->ids[out->n_ids++] = (int32_t)t->valuedouble;
    }
    return 1;
}

/* "prompt": one prompt (a string or token ids, also ["text"]) into p's own
 * fields, or an array of several (strings or arrays of ids): the first
 * there, the others in p->more. */
static int parse_prompt(const cJSON *root, req_params *p, req_error *e) {
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!pr) return req_fail(e, 400, "invalid_request_error", "missing_field", "prompt", "'prompt' is required");
    const cJSON *first = cJSON_IsArray(pr) ? cJSON_GetArrayItem(pr, 0) : NULL;
    const int several = first && (cJSON_IsString(first) || cJSON_IsArray(first));
    const int n = several ? cJSON_GetArraySize(pr) : 1;
    if (n * p->n_choices > REQ_MAX_JOBS)
        return req_fail(e, 400, "invalid_request_error", "invalid_value", "prompt",
                        "%d prompts x %d choices: at most %d sequences per request", n, p->n_choices, REQ_MAX_JOBS);
    req_prompt one = {0};
    if (!parse_one_prompt(several ? first : pr, &one, e)) {
        req_prompt_free(&one);
        return 0;
    }
    p->prompt = one.text;
    p->prompt_len = one.len;
    p->prompt_ids = one.ids;
    p->n_prompt_ids = one.n_ids;
    p->prompt_is_ids = one.is_ids;
    if (n == 1) return 1;
    if (!(p->more = calloc((size_t)n - 1, sizeof *p->more))) return req_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (int i = 1; i < n; i++) {
        const cJSON *it = cJSON_GetArrayItem(pr, i);
        if (!cJSON_IsString(it) && !cJSON_IsArray(it))
            return req_fail(e, 400, "invalid_request_error", "invalid_type", "prompt",
                            "several prompts must each be a string or an array of token ids");
        if (!parse_one_prompt(it, &p->more[p->n_more++], e)) return 0;
    }
    return 1;
}

static int parse_stop(const cJSON *root, req_params *p, req_error *e) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!s || cJSON_IsNull(s)) return 1;
    if (cJSON_IsString(s)) {
        if (!*s->valuestring) return 1;
        p->stop[p->n_stop++] = dup_str(s->valuestring, NULL);
        return 1;
    }
    if (!cJSON_IsArray(s))
        return req_fail(e, 400, "invalid_request_error", "invalid_type", "stop", "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(s) > REQ_MAX_STOP)
        return req_fail(e, 400, "invalid_request_error", "invalid_value", "stop", "at most %d stop sequences", REQ_MAX_STOP);
    const cJSON *it;
    cJSON_ArrayForEach(it, s) {
        if (!cJSON_IsString(it))
            return req_fail(e, 400, "invalid_request_error", "invalid_type", "stop", "'stop' must hold strings");
        if (!*it->valuestring) continue;
        if (strlen(it->valuestring) > 256)
            return req_fail(e, 400, "invalid_request_error", "invalid_value", "stop", "stop sequences are limited to 256 bytes");
        p->stop[p->n_stop++] = dup_str(it->valuestring, NULL);
    }
    return 1;
}

/* Chat: "logprobs" (boolean) and "top_logprobs" (0..REQ_MAX_TOP_LOGPROBS,
 * only with logprobs). Completions: "logprobs" (null or an integer
 * 0..REQ_MAX_TOP_LOGPROBS: the alternatives per token; 0 gives the chosen
 * tokens' log-probabilities only). */
static int parse_logprobs(req_kind kind, const cJSON *root, req_params *p, req_error *e) {
    double d = 0;
    int given = 0;
    if (kind == REQ_CHAT) {
        if (!get_bool(root, "logprobs", &p->logprobs, e) ||
            !get_int(root, "top_logprobs", 0, REQ_MAX_TOP_LOGPROBS, &d, &given, e))
            return 0;
        if (given && !p->logprobs)
            return req_fail(e, 400, "invalid_request_error", "invalid_value", "top_logprobs",
                            "'top_logprobs' needs 'logprobs' set to true");
    } else {
        if (!get_int(root, "logprobs", 0, REQ_MAX_TOP_LOGPROBS, &d, &given, e)) return 0;
        p->logprobs = given;
    }
    p->top_logprobs = (int)d;
    return 1;
}

/* "logit_bias": {"token id": bias in [-100, 100], ...} (OpenAI's form). */
static int parse_logit_bias(const cJSON *root, req_params *p, req_error *e) {
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (!lb || cJSON_IsNull(lb)) return 1;
    if (!cJSON_IsObject(lb))
        return req_fail(e, 400, "invalid_request_error", "invalid_type", "logit_bias",
                        "'logit_bias' must be an object of token ids to biases");
    const int n = cJSON_GetArraySize(lb);
    if (n > REQ_MAX_LOGIT_BIAS)
        return req_fail(e, 400, "invalid_request_error", "invalid_value", "logit_bias", "at most %d logit biases",
                        REQ_MAX_LOGIT_BIAS);
    if (!n) return 1;
    p->bias_ids = malloc((size_t)n * sizeof *p->bias_ids);
    p->bias = malloc((size_t)n * sizeof *p->bias);
    if (!p->bias_ids || !p->bias) return req_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, lb) {
        char *end = NULL;
        errno = 0;
        long id = it->string && *it->string >= '0' && *it->string <= '9' ? strtol(it->string, &end, 10) : -1;
        if (id < 0 || id > INT32_MAX || errno || !end || *end)
            return req_fail(e, 400, "invalid_request_error", "invalid_value", "logit_bias",
                            "'logit_bias' keys must be token ids (decimal integers)");
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return req_fail(e, 400, "invalid_request_error", "invalid_value", "logit_bias",
                            "'logit_bias' values must be numbers between -100 and 100");
        p->bias_ids[p->n_bias] = (int32_t)id;
        p->bias[p->n_bias++] = (float)it->valuedouble;
    }
    return 1;
}

/* Features a client may count on that this server does not have: a clear
 * 400 rather than a reply that silently ignores them. */
static int refuse_unsupported(const cJSON *root, req_kind kind, req_params *p, req_error *e) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(t))
            return req_fail(e, 400, "invalid_request_error", "invalid_type", "response_format",
                            "'response_format' must be an object with a 'type'");
        if (strcmp(t->valuestring, "text") && strcmp(t->valuestring, "json_object"))
            return req_fail(e, 400, "invalid_request_error", "unsupported_value", "response_format",
                            "'response_format' type '%.40s' is not supported: 'text' or 'json_object'", t->valuestring);
    }
    const cJSON *rt = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    p->json_mode = cJSON_IsString(rt) && !strcmp(rt->valuestring, "json_object");
    /* the deprecated "functions" (tools replaced it); and tools on /v1/completions, which has no messages */
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "functions");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
        return req_fail(e, 400, "invalid_request_error", "unsupported_value", "functions",
                        "'functions' is not supported: pass them as 'tools'");
    v = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (kind == REQ_COMPLETION && v && !cJSON_IsNull(v) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
        return req_fail(e, 400, "invalid_request_error", "unsupported_value", "tools",
                        "'tools' needs /v1/chat/completions (a chat template renders them)");
    return 1;
}

int req_parse(req_kind kind, const char *body, size_t len, req_params *p, req_error *e) {
    memset(p, 0, sizeof *p);
    memset(e, 0, sizeof *e);
    p->kind = kind;
    p->max_tokens = -1;
    p->n_choices = 1;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    if (!req_utf8_valid(body, len))
        return req_fail(e, 400, "invalid_request_error", "invalid_encoding", NULL, "the request body is not valid UTF-8");
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return req_fail(e, 400, "invalid_request_error", "invalid_json", NULL, "the request body is not valid JSON");
    int ok = 0;
    double d;
    int given = 0, n_given = 0;
    if (!cJSON_IsObject(root)) {
        req_fail(e, 400, "invalid_request_error", "invalid_json", NULL, "the request body must be a JSON object");
        goto out;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsString(model) && !cJSON_IsNull(model)) {
        req_fail(e, 400, "invalid_request_error", "invalid_type", "model", "'model' must be a string");
        goto out;
    }
    if (!get_bool(root, "stream", &p->stream, e) || !get_bool(root, "ignore_eos", &p->ignore_eos, e) ||
        !get_float(root, "temperature", 0, 2, &p->temperature, e) || !get_float(root, "top_p", 0, 1, &p->top_p, e) ||
        !get_float(root, "min_p", 0, 1, &p->min_p, e))
        goto out;
    d = 0;
    if (!get_int(root, "top_k", 0, 1e9, &d, NULL, e)) goto out;
    p->top_k = (int)d;
    if (!get_float(root, "presence_penalty", -2, 2, &p->presence_penalty, e) ||
        !get_float(root, "frequency_penalty", -2, 2, &p->frequency_penalty, e) ||
        !get_float(root, "repeat_penalty", 1e-3, 100, &p->repeat_penalty, e))
        goto out;
    d = 64;
    if (!get_int(root, "repeat_last_n", -1, 1e9, &d, NULL, e)) goto out;
    p->repeat_last_n = d < 0 ? 0 : (int)d; /* llama.cpp's -1: the whole context */
    if (!parse_logit_bias(root, p, e) || !refuse_unsupported(root, kind, p, e)) goto out;
    d = -1;
    if (!get_int(root, "max_tokens", 0, 1e9, &d, NULL, e) ||
        !get_int(root, "max_completion_tokens", 1, 1e9, &d, NULL, e) || !get_int(root, "n_predict", -1, 1e9, &d, NULL, e))
        goto out;
    p->max_tokens = (int)d;
    d = 0;
    if (!get_int(root, "seed", -9.2e18, 1.8e19, &d, &given, e)) goto out;
    if (given) {
        p->seed_given = 1;
        p->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    }
    d = 1;
    if (!get_int(root, "n", 1, REQ_MAX_CHOICES, &d, &n_given, e)) goto out;
    p->n_choices = (int)d;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            req_fail(e, 400, "invalid_request_error", "invalid_type", "stream_options", "'stream_options' must be an object");
            goto out;
        }
        if (!get_bool(so, "include_usage", &p->include_usage, e)) goto out;
    }
    if (!parse_logprobs(kind, root, p, e)) goto out;
    if (!get_bool(root, "echo", &p->echo, e)) goto out;
    if (p->echo && (kind == REQ_CHAT || p->stream)) {
        req_fail(e, 400, "invalid_request_error", "unsupported_value", "echo",
                 kind == REQ_CHAT ? "'echo' is a completions field" : "'echo' is not supported with 'stream'");
        goto out;
    }
    if (p->max_tokens == 0 && !p->echo) { /* nothing to generate and nothing to show */
        req_fail(e, 400, "invalid_request_error", "invalid_value", "max_tokens", "'max_tokens' 0 needs 'echo'");
        goto out;
    }
    if (!parse_stop(root, p, e)) goto out;
    ok = kind == REQ_CHAT ? parse_tools(root, p, e) && parse_messages(root, p, e) : parse_prompt(root, p, e);
out:
    cJSON_Delete(root);
    if (!ok) req_params_free(p);
    return ok;
}

/* A copy of n bytes (n + 1 allocated, NUL-terminated), or NULL for NULL. */
static void *dup_bytes(const void *src, size_t n, int *ok) {
    if (!src) return NULL;
    char *d = dup_n(src, n);
    if (!d) *ok = 0;
    return d;
}

int req_params_copy(req_params *dst, const req_params *src) {
    int ok = 1;
    *dst = *src;
    dst->msgs = NULL;
    dst->n_msgs = 0;
    dst->n_stop = 0;
    dst->tools = dup_bytes(src->tools, src->tools ? strlen(src->tools) : 0, &ok);
    dst->prompt = dup_bytes(src->prompt, src->prompt_len, &ok);
    dst->prompt_ids = dup_bytes(src->prompt_ids, (size_t)src->n_prompt_ids * sizeof *src->prompt_ids, &ok);
    dst->bias_ids = dup_bytes(src->bias_ids, (size_t)src->n_bias * sizeof *src->bias_ids, &ok);
    dst->bias = dup_bytes(src->bias, (size_t)src->n_bias * sizeof *src->bias, &ok);
    dst->more = NULL;
    dst->n_more = 0;
    if (src->n_more && (dst->more = calloc((size_t)src->n_more, sizeof *dst->more))) {
        for (int i = 0; i < src->n_more; i++) {
            const req_prompt *q = &src->more[i];
            dst->more[i] = (req_prompt){.text = dup_bytes(q->text, q->len, &ok), .len = q->len,
                                        .ids = dup_bytes(q->ids, (size_t)q->n_ids * sizeof *q->ids, &ok), .n_ids = q->n_ids,
                                        .is_ids = q->is_ids};
            dst->n_more = i + 1;
        }
    } else if (src->n_more) {
        ok = 0;
    }
    for (int i = 0; i < src->n_stop; i++) {
        dst->stop[i] = dup_bytes(src->stop[i], strlen(src->stop[i]), &ok);
        dst->n_stop = i + 1;
    }
    if (src->n_msgs && (dst->msgs = calloc((size_t)src->n_msgs, sizeof *dst->msgs))) {
        for (int i = 0; i < src->n_msgs; i++) {
            dst->msgs[i].role = src->msgs[i].role;
            const ellm_chat_message *sm = &src->msgs[i];
            dst->msgs[i].content = dup_bytes(sm->content, sm->content ? strlen(sm->content) : 0, &ok);
            dst->msgs[i].tool_calls = dup_bytes(sm->tool_calls, sm->tool_calls ? strlen(sm->tool_calls) : 0, &ok);
            dst->msgs[i].tool_call_id = dup_bytes(sm->tool_call_id, sm->tool_call_id ? strlen(sm->tool_call_id) : 0, &ok);
            dst->msgs[i].name = dup_bytes(sm->name, sm->name ? strlen(sm->name) : 0, &ok);
            dst->n_msgs = i + 1;
        }
    } else if (src->n_msgs) {
        ok = 0;
    }
    if (!ok) req_params_free(dst);
    return ok;
}

void req_prompt_free(req_prompt *q) {
    free(q->text);
    free(q->ids);
    memset(q, 0, sizeof *q);
}

void req_params_free(req_params *p) {
    for (int i = 0; i < p->n_more; i++) req_prompt_free(&p->more[i]);
    free(p->more);
    for (int i = 0; i < p->n_msgs; i++) {
        free((char *)p->msgs[i].content);
        free((char *)p->msgs[i].tool_calls);
        free((char *)p->msgs[i].tool_call_id);
        free((char *)p->msgs[i].name);
    }
    free(p->tools);
    free(p->msgs);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->prompt);
    free(p->prompt_ids);
    free(p->bias_ids);
    free(p->bias);
    memset(p, 0, sizeof *p);
}
