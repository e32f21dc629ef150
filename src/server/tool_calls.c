/* Tool calls in generated text (tool_calls.h). */
#include "server/tool_calls.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>", MISTRAL_TAG[] = "[TOOL_CALLS]";

tool_syntax tool_syntax_of(const char *src) {
    if (!src) return TOOLS_NONE;
    if (strstr(src, OPEN)) return TOOLS_HERMES;
    if (strstr(src, MISTRAL_TAG)) return TOOLS_MISTRAL;
    /* Llama 3.1+: tool calls as {"name": ..., "parameters": ...} after <|python_tag|> or alone */
    if (strstr(src, "<|python_tag|>") || (strstr(src, "tools") && strstr(src, "\"parameters\"") && strstr(src, "ipython")))
        return TOOLS_LLAMA3;
    return TOOLS_NONE;
}

const char *tool_syntax_name(tool_syntax s) {
    return s == TOOLS_HERMES ? "hermes" : s == TOOLS_LLAMA3 ? "llama3" : s == TOOLS_MISTRAL ? "mistral" : "none";
}

static int blank(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static const char *find(const char *h, size_t n, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t i = 0; k <= n && i <= n - k; i++)
        if (!memcmp(h + i, needle, k)) return h + i;
    return NULL;
}

/* One JSON value filling text[0, n) but for blanks around it, or NULL. */
static cJSON *parse_whole(const char *text, size_t n) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!j) return NULL;
    while (end && end < text + n && blank(*end)) end++;
    if (end != text + n) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* An id: "call_" and 24 letters and digits, or for Mistral's template 9 of
 * them with no prefix (it refuses any other id when the call comes back). */
static void make_id(char *out, tool_syntax s, uint64_t seed, int index) {
    static const char an[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t x = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(index + 1);
    const int n = s == TOOLS_MISTRAL ? 9 : 24;
    char *o = out;
    if (s != TOOLS_MISTRAL) o += sprintf(o, "call_");
    for (int i = 0; i < n; i++) {
        /* splitmix64 */
        x += 0x9E3779B97F4A7C15ull;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        *o++ = an[z % (sizeof an - 1)];
    }
    *o = 0;
}

/* Appends the OpenAI call for one parsed object {name, arguments|parameters}
 * to arr; 0 if it is not one. */
static int add_call(cJSON *arr, const cJSON *obj, tool_syntax s, uint64_t seed) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    if (!cJSON_IsObject(obj) || !cJSON_IsString(name) || !name->valuestring[0]) return 0;
    if (args && !cJSON_IsObject(args) && !cJSON_IsString(args)) return 0;
    char *args_text = !args ? strdup("{}") : cJSON_IsString(args) ? strdup(args->valuestring) : cJSON_PrintUnformatted(args);
    char id[40];
    make_id(id, s, seed, cJSON_GetArraySize(arr));
    cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    int ok = args_text && call && fn && cJSON_AddStringToObject(call, "id", id) &&
             cJSON_AddStringToObject(call, "type", "function") && cJSON_AddItemToObject(call, "function", fn);
    if (!ok) cJSON_Delete(fn);
    fn = ok ? fn : NULL;
    ok = ok && cJSON_AddStringToObject(fn, "name", name->valuestring) && cJSON_AddStringToObject(fn, "arguments", args_text) &&
         cJSON_AddItemToArray(arr, call);
    if (!ok) cJSON_Delete(call);
    free(args_text);
    return ok ? 1 : -1;
}

int tool_calls_parse(tool_syntax s, const char *text, size_t len, uint64_t id_seed, size_t *content_len, char **calls) {
    *content_len = len;
    *calls = NULL;
    if (s == TOOLS_NONE || !text) return 0;
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return -1;
    int ok = 1;
    size_t content = len;
    if (s == TOOLS_HERMES) {
        const char *p = find(text, len, OPEN);
        if (!p) ok = 0;
        else content = (size_t)(p - text);
        while (ok && p) {
            const char *body = p + sizeof OPEN - 1, *end = text + len;
            const char *close = find(body, (size_t)(end - body), CLOSE);
            const char *stop = close ? close : end; /* a reply may end right after the JSON */
            cJSON *obj = parse_whole(body, (size_t)(stop - body));
            const int r = obj ? add_call(arr, obj, s, id_seed) : 0;
            cJSON_Delete(obj);
            if (r < 0) {
                cJSON_Delete(arr);
                return -1;
            }
            ok = r;
            if (!close) break;
            const char *next = close + sizeof CLOSE - 1;
            while (next < end && blank(*next)) next++;
            if (next == end) break;
            p = find(next, (size_t)(end - next), OPEN);
            if (p != next) ok = 0; /* text after the calls: not a tool call reply */
        }
    } else {
        const char *b = text, *end = text + len;
        while (b < end && blank(*b)) b++;
        if (s == TOOLS_MISTRAL && (size_t)(end - b) >= sizeof MISTRAL_TAG - 1 &&
            !memcmp(b, MISTRAL_TAG, sizeof MISTRAL_TAG - 1))
            b += sizeof MISTRAL_TAG - 1;
        cJSON *j = b < end && (*b == '{' || *b == '[') ? parse_whole(b, (size_t)(end - b)) : NULL;
        if (s == TOOLS_LLAMA3 && cJSON_IsObject(j)) {
            const int r = add_call(arr, j, s, id_seed);
            ok = r > 0;
            if (r < 0) ok = -1;
        } else if (s == TOOLS_MISTRAL && cJSON_IsArray(j) && cJSON_GetArraySize(j) > 0) {
            const cJSON *it;
            cJSON_ArrayForEach(it, j) {
                const int r = add_call(arr, it, s, id_seed);
                if (r <= 0) {
                    ok = r < 0 ? -1 : 0;
                    break;
                }
            }
        } else {
            ok = 0;
        }
        cJSON_Delete(j);
        content = 0;
    }
    if (ok <= 0) {
        cJSON_Delete(arr);
        return ok < 0 ? -1 : 0;
    }
    while (content > 0 && blank(text[content - 1])) content--;
    *calls = cJSON_PrintUnformatted(arr);
    const int n = cJSON_GetArraySize(arr);
    cJSON_Delete(arr);
    if (!*calls) return -1;
    *content_len = content;
    return n;
}

size_t tool_calls_stream_safe(tool_syntax s, const char *text, size_t len, int sent) {
    if (s == TOOLS_NONE || (sent && s != TOOLS_HERMES)) return len; /* the others' calls are the whole reply */
    if (s == TOOLS_HERMES) {
        const char *p = find(text, len, OPEN);
        size_t safe = p ? (size_t)(p - text) : len;
        /* a prefix of the marker at the end waits for the next token */
        for (size_t k = sizeof OPEN - 2; !p && k > 0; k--)
            if (len >= k && !memcmp(text + len - k, OPEN, k)) {
                safe = len - k;
                break;
            }
        /* and so do blanks before it: the text of a reply with calls ends
         * without them (tool_calls_parse), streamed or not */
        while (safe > 0 && blank(text[safe - 1])) safe--;
        return safe;
    }
    size_t i = 0;
    while (i < len && blank(text[i])) i++;
    if (i == len) return 0; /* only blanks so far: the reply may yet open a call */
    const char c = text[i];
    if (c == '{' || c == '[') return 0;
    if (s == TOOLS_MISTRAL) {
        const size_t k = len - i < sizeof MISTRAL_TAG - 1 ? len - i : sizeof MISTRAL_TAG - 1;
        if (!memcmp(text + i, MISTRAL_TAG, k)) return 0;
    }
    return len;
}
