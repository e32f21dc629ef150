/* The server's API below HTTP: log-probabilities (logprobs_compute against a
 * plain reference: log-softmax in double, a full sort), the request fields
 * (logprobs, echo, penalties, logit_bias, what is refused) and the JSON shapes
 * of chat and completions responses. The end-to-end checks (against
 * llama.cpp's logits, against `ellm run`, streamed against whole) are in
 * tests/server/server.test.mjs. */
#include "harness.h"
#include "server/logprobs.h"
#include "server/request.h"
#include "server/responses.h"
#include "server/json_mask.h"
#include "server/tool_calls.h"

#include <cjson/cJSON.h>

static const float *sort_logits;
static int by_logit(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    if (sort_logits[i] != sort_logits[j]) return sort_logits[i] > sort_logits[j] ? -1 : 1;
    return i - j; /* equal logits: lower id first */
}

static void test_compute(void) {
    enum { N = 3000 };
    static float l[N];
    static int idx[N];
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        l[i] = (float)((int)(x % 4001) - 2000) / 100.0f; /* many equal values */
        idx[i] = i;
    }
    l[17] = l[2900] = 25.0f; /* a tie at the top */
    sort_logits = l;
    qsort(idx, N, sizeof *idx, by_logit);
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < N; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < N; i++) sum += exp((double)l[i] - mx);
    const double lse = mx + log(sum);
    for (int top = 0; top <= REQ_MAX_TOP_LOGPROBS + 2; top += 3) {
        logprobs_token out;
        logprobs_compute(l, N, 1234, top, &out);
        const int want = top < REQ_MAX_TOP_LOGPROBS ? top : REQ_MAX_TOP_LOGPROBS;
        CHECK(out.n_top == want, "top %d: %d alternatives", top, out.n_top);
        int same = 1;
        for (int k = 0; k < out.n_top; k++)
            same &= out.top[k].id == idx[k] && fabs(out.top[k].logprob - ((double)l[idx[k]] - lse)) < 1e-5;
        CHECK(same, "top %d: the reference order (ties by lower id) and log-probabilities", top);
        CHECK(out.chosen.id == 1234 && fabs(out.chosen.logprob - ((double)l[1234] - lse)) < 1e-5,
              "chosen token's log-probability %g vs %g", out.chosen.logprob, (double)l[1234] - lse);
    }
    logprobs_token out;
    logprobs_compute(l, N, 0, 5, &out);
    CHECK(out.top[0].id == 17 && out.top[1].id == 2900 && out.top[0].logprob == out.top[1].logprob,
          "equal top logits: the lower id first (%d, %d)", out.top[0].id, out.top[1].id);
    logprobs_compute(l, 3, 1, 10, &out);
    CHECK(out.n_top == 3, "no more alternatives than the vocabulary (%d)", out.n_top);
    logprobs_compute(l, N, N, 0, &out);
    CHECK(isinf(out.chosen.logprob) && out.chosen.logprob < 0 && out.n_top == 0, "a token out of range: -inf");
    /* one token holding all the mass */
    static float peak[N];
    for (int i = 0; i < N; i++) peak[i] = -1e4f;
    peak[5] = 100.0f;
    logprobs_compute(peak, N, 5, 2, &out);
    CHECK(out.chosen.logprob == 0.0f && out.top[0].id == 5 && out.top[1].logprob < -1e3f,
          "a certain token: log-probability 0 (%g)", out.chosen.logprob);
}

/* req_parse on body; returns 1 if accepted; *e has the error otherwise. */
static int parse(req_kind kind, const char *body, req_params *p, req_error *e) {
    return req_parse(kind, body, strlen(body), p, e);
}

static void test_request(void) {
    req_params p;
    req_error e;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char b[256];
    snprintf(b, sizeof b, "%s,\"logprobs\":true,\"top_logprobs\":3}", chat);
    CHECK(parse(REQ_CHAT, b, &p, &e) && p.logprobs == 1 && p.top_logprobs == 3, "chat: logprobs with 3 alternatives");
    req_params_free(&p);
    snprintf(b, sizeof b, "%s,\"logprobs\":true}", chat);
    CHECK(parse(REQ_CHAT, b, &p, &e) && p.logprobs == 1 && p.top_logprobs == 0, "chat: logprobs alone");
    req_params_free(&p);
    snprintf(b, sizeof b, "%s,\"logprobs\":false}", chat);
    CHECK(parse(REQ_CHAT, b, &p, &e) && p.logprobs == 0, "chat: logprobs false");
    req_params_free(&p);
    const struct {
        req_kind kind;
        const char *fields, *param;
    } bad[] = {
        {REQ_CHAT, "\"top_logprobs\":2", "top_logprobs"},
        {REQ_CHAT, "\"logprobs\":true,\"top_logprobs\":21", "top_logprobs"},
        {REQ_CHAT, "\"logprobs\":true,\"top_logprobs\":1.5", "top_logprobs"},
        {REQ_CHAT, "\"logprobs\":2", "logprobs"},
        {REQ_COMPLETION, "\"logprobs\":true", "logprobs"},
        {REQ_COMPLETION, "\"logprobs\":21", "logprobs"},
        {REQ_COMPLETION, "\"logprobs\":-1", "logprobs"},
        {REQ_COMPLETION, "\"echo\":true,\"stream\":true", "echo"},
        {REQ_CHAT, "\"echo\":true", "echo"},
        {REQ_COMPLETION, "\"max_tokens\":0", "max_tokens"},
        {REQ_COMPLETION, "\"echo\":1", "echo"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (bad[i].kind == REQ_CHAT) snprintf(b, sizeof b, "%s,%s}", chat, bad[i].fields);
        else snprintf(b, sizeof b, "{\"prompt\":\"x\",%s}", bad[i].fields);
        int ok = parse(bad[i].kind, b, &p, &e);
        CHECK(!ok && e.http_status == 400 && e.param && !strcmp(e.param, bad[i].param), "%s: 400 naming %s (%s)", b,
              bad[i].param, ok ? "accepted" : e.message);
        if (ok) req_params_free(&p);
    }
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":0}", &p, &e) && p.logprobs == 1 && p.top_logprobs == 0,
          "completions: logprobs 0 gives the chosen tokens' only");
    req_params_free(&p);
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":5,\"echo\":false}", &p, &e) && p.logprobs == 1 &&
              p.top_logprobs == 5,
          "completions: logprobs 5");
    req_params_free(&p);
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":null}", &p, &e) && p.logprobs == 0,
          "completions: logprobs null is off");
    req_params_free(&p);
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":\"x\",\"echo\":true,\"max_tokens\":0,\"logprobs\":1}", &p, &e) &&
              p.echo == 1 && p.max_tokens == 0 && p.logprobs == 1,
          "completions: echo with max_tokens 0 scores the prompt");
    req_params_free(&p);
}

/* "n" choices, and req_params_copy: a deep copy each choice's job owns. */
static void test_choices(void) {
    req_params p, q;
    req_error e;
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":\"x\"}", &p, &e) && p.n_choices == 1, "n defaults to 1");
    req_params_free(&p);
    CHECK(!parse(REQ_COMPLETION, "{\"prompt\":\"x\",\"n\":17}", &p, &e) && !strcmp(e.param, "n"), "n 17: 400 naming n");
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":\"x\",\"n\":2,\"stream\":true}", &p, &e) && p.n_choices == 2 && p.stream,
          "n 2 streamed");
    req_params_free(&p);
    const char *chat = "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":"
                       "\"hi\"}],\"n\":4,\"stop\":[\"ab\",\"cd\"],\"logit_bias\":{\"5\":1.5}}";
    CHECK(parse(REQ_CHAT, chat, &p, &e) && p.n_choices == 4, "chat n 4: %s", e.message);
    CHECK(req_params_copy(&q, &p), "copy");
    CHECK(q.n_choices == 4 && q.n_msgs == 2 && q.msgs != p.msgs && q.msgs[1].content != p.msgs[1].content &&
              !strcmp(q.msgs[1].content, "hi") && !strcmp(q.msgs[0].role, "system") && q.n_stop == 2 &&
              q.stop[1] != p.stop[1] && !strcmp(q.stop[1], "cd") && q.n_bias == 1 && q.bias_ids != p.bias_ids &&
              q.bias_ids[0] == 5 && q.bias[0] == 1.5f,
          "the copy holds its own messages, stop strings and biases");
    req_params_free(&p); /* the copy outlives the original */
    CHECK(!strcmp(q.msgs[0].content, "be brief") && !strcmp(q.stop[0], "ab"), "the copy is intact after the original is freed");
    req_params_free(&q);
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":[1,2,3],\"n\":2}", &p, &e) && req_params_copy(&q, &p), "ids prompt copy");
    CHECK(q.prompt_is_ids && q.n_prompt_ids == 3 && q.prompt_ids != p.prompt_ids && q.prompt_ids[2] == 3, "token ids copied");
    req_params_free(&p);
    req_params_free(&q);
}

/* Several prompts in one completions request. */
static void test_prompts(void) {
    req_params p, q;
    req_error e;
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":[\"ab\",[4,5],\"c\"],\"n\":2}", &p, &e) && p.prompt &&
              !strcmp(p.prompt, "ab") && !p.prompt_is_ids && p.n_more == 2 && p.more[0].is_ids && p.more[0].n_ids == 2 &&
              p.more[0].ids[1] == 5 && !p.more[1].is_ids && !strcmp(p.more[1].text, "c"),
          "three prompts: the first in the request's fields, the others in more: %s", e.message);
    CHECK(req_params_copy(&q, &p) && q.n_more == 2 && q.more != p.more && q.more[0].ids != p.more[0].ids &&
              q.more[0].ids[0] == 4 && !strcmp(q.more[1].text, "c"),
          "the copy holds its own prompts");
    req_params_free(&p);
    req_params_free(&q);
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":[\"only\"]}", &p, &e) && p.n_more == 0 && !strcmp(p.prompt, "only"),
          "[\"text\"]: one prompt");
    req_params_free(&p);
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":[[1,2],[3]],\"stream\":true}", &p, &e) && p.prompt_is_ids &&
              p.n_prompt_ids == 2 && p.n_more == 1 && p.more[0].ids[0] == 3,
          "two prompts of token ids, streamed");
    req_params_free(&p);
    const char *bad[] = {
        "{\"prompt\":[\"a\",5]}",                 /* a number among prompts */
        "{\"prompt\":[\"a\",[]]}",                /* an empty one */
        "{\"prompt\":[[1],[2,\"x\"]]}",           /* a string among ids */
        "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\"],\"n\":16}", /* 80 sequences */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int ok = parse(REQ_COMPLETION, bad[i], &p, &e);
        CHECK(!ok && e.http_status == 400 && e.param && !strcmp(e.param, "prompt"), "%s: 400 naming prompt (%s)", bad[i],
              ok ? "accepted" : e.message);
        if (ok) req_params_free(&p);
    }
}

static void test_sampling_fields(void) {
    req_params p;
    req_error e;
    CHECK(parse(REQ_COMPLETION, "{\"prompt\":\"x\"}", &p, &e) && p.presence_penalty == 0 && p.frequency_penalty == 0 &&
              p.repeat_penalty == 1.0f && p.repeat_last_n == 64 && p.n_bias == 0,
          "defaults: penalties off, repeat_last_n 64, no biases");
    req_params_free(&p);
    CHECK(parse(REQ_COMPLETION,
                "{\"prompt\":\"x\",\"presence_penalty\":0.5,\"frequency_penalty\":-1.5,\"repeat_penalty\":1.2,"
                "\"repeat_last_n\":-1,\"logit_bias\":{\"15\":-100,\"7\":2.5},\"response_format\":{\"type\":\"text\"},"
                "\"tools\":[]}",
                &p, &e) &&
              p.presence_penalty == 0.5f && p.frequency_penalty == -1.5f && p.repeat_penalty == 1.2f &&
              p.repeat_last_n == 0 && p.n_bias == 2 && p.bias_ids[0] == 15 && p.bias[0] == -100.0f && p.bias_ids[1] == 7 &&
              p.bias[1] == 2.5f,
          "penalties, repeat_last_n -1 (all), logit_bias, text response_format, no tools: %s", e.message);
    req_params_free(&p);
    const struct {
        const char *fields, *param;
    } bad[] = {
        {"\"presence_penalty\":2.5", "presence_penalty"},
        {"\"frequency_penalty\":\"1\"", "frequency_penalty"},
        {"\"repeat_penalty\":0", "repeat_penalty"},
        {"\"repeat_last_n\":-2", "repeat_last_n"},
        {"\"logit_bias\":[[1,2]]", "logit_bias"},
        {"\"logit_bias\":{\"abc\":1}", "logit_bias"},
        {"\"logit_bias\":{\"-1\":1}", "logit_bias"},
        {"\"logit_bias\":{\"12x\":1}", "logit_bias"},
        {"\"logit_bias\":{\"99999999999\":1}", "logit_bias"},
        {"\"logit_bias\":{\"3\":101}", "logit_bias"},
        {"\"logit_bias\":{\"3\":\"1\"}", "logit_bias"},
        {"\"response_format\":{\"type\":\"json_schema\"}", "response_format"},
        {"\"response_format\":\"json\"", "response_format"},
        {"\"tools\":[{\"type\":\"function\"}]", "tools"},
        {"\"functions\":[{\"name\":\"f\"}]", "functions"},
    };
    char b[256];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(b, sizeof b, "{\"prompt\":\"x\",%s}", bad[i].fields);
        int ok = parse(REQ_COMPLETION, b, &p, &e);
        CHECK(!ok && e.http_status == 400 && e.param && !strcmp(e.param, bad[i].param), "%s: 400 naming %s (%s)", b,
              bad[i].param, ok ? "accepted" : e.message);
        if (ok) req_params_free(&p);
    }
}

/* A token of tok whose bytes alone are not UTF-8 (a byte token), or -1. */
static int32_t partial_token(const ellm_tokenizer *tok) {
    for (int32_t i = 0; i < ellm_tokenizer_n_vocab(tok); i++) {
        size_t n = 0;
        const char *b = ellm_tokenizer_token_bytes(tok, i, &n);
        if (b && n == 1 && (unsigned char)b[0] >= 0xC2 && (unsigned char)b[0] <= 0xF4) return i;
    }
    return -1;
}

static const char *vocab_bytes(const void *tok, int32_t id, size_t *len) {
    return ellm_tokenizer_token_bytes(tok, id, len);
}

static void test_json(void) {
    ellm_tokenizer *tok = NULL;
    ellm_error err = {0};
    CHECK(ellm_tokenizer_load("models/evalmodel.gguf", &tok, &err) == ELLM_OK, "%s", err.msg);
    if (!tok) return;
    int32_t ids[2] = {0, 0};
    int n = 0;
    CHECK(ellm_tokenizer_encode(tok, "def", 3, 0, 0, ids, 2, &n, &err) == ELLM_OK && n == 1, "'def' is one token (%d)", n);
    const int32_t part = partial_token(tok);
    CHECK(part >= 0, "the vocabulary has a byte token");
    logprobs_token lp[3] = {
        {.chosen = {ids[0], -0.25f}, .n_top = 2, .top = {{ids[0], -0.25f}, {part, -2.0f}}},
        {.chosen = {-1, 0.0f}}, /* the end-of-generation token: left out */
        {.chosen = {part, -3.5f}, .n_top = 0},
    };
    size_t offsets[3] = {0, 3, 3};
    const resp_logprobs rl = {.lp = lp, .offset = offsets, .n = 3, .bytes = vocab_bytes, .arg = tok};
    resp_meta m = {.id = "x", .model = "m", .kind = REQ_CHAT};
    char *s = resp_final(&m, "def", 3, "stop", &rl);
    cJSON *root = s ? cJSON_Parse(s) : NULL;
    const cJSON *c = root ? cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "logprobs") : NULL;
    const cJSON *content = cJSON_GetObjectItem(c, "content");
    CHECK(cJSON_GetArraySize(content) == 2, "chat: one entry per shown token (%s)", s ? s : "NULL");
    const cJSON *e0 = cJSON_GetArrayItem(content, 0), *e1 = cJSON_GetArrayItem(content, 1);
    const cJSON *t0 = cJSON_GetObjectItem(e0, "token"), *top = cJSON_GetObjectItem(e0, "top_logprobs");
    CHECK(cJSON_IsString(t0) && !strcmp(t0->valuestring, "def") && cJSON_GetObjectItem(e0, "logprob")->valuedouble == -0.25 &&
              cJSON_GetArraySize(cJSON_GetObjectItem(e0, "bytes")) == 3 && cJSON_GetArraySize(top) == 2,
          "chat entry: token, logprob, bytes, top_logprobs");
    const cJSON *t1 = cJSON_GetObjectItem(e1, "token"), *b1 = cJSON_GetObjectItem(e1, "bytes");
    size_t pn = 0;
    const char *pb = ellm_tokenizer_token_bytes(tok, part, &pn);
    CHECK(cJSON_IsString(t1) && !strcmp(t1->valuestring, "\xEF\xBF\xBD") && cJSON_GetArraySize(b1) == 1 &&
              cJSON_GetArrayItem(b1, 0)->valueint == (unsigned char)pb[0] &&
              cJSON_GetArraySize(cJSON_GetObjectItem(e1, "top_logprobs")) == 0,
          "a byte token: U+FFFD as its token string, its byte in bytes, no alternatives");
    cJSON_Delete(root);
    free(s);

    m.kind = REQ_COMPLETION;
    s = resp_final(&m, "def", 3, "stop", &rl);
    root = s ? cJSON_Parse(s) : NULL;
    c = root ? cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "logprobs") : NULL;
    const cJSON *tokens = cJSON_GetObjectItem(c, "tokens"), *tlp = cJSON_GetObjectItem(c, "token_logprobs"),
                *tops = cJSON_GetObjectItem(c, "top_logprobs"), *offs = cJSON_GetObjectItem(c, "text_offset");
    CHECK(cJSON_GetArraySize(tokens) == 2 && cJSON_GetArraySize(tlp) == 2 && cJSON_GetArraySize(tops) == 2 &&
              cJSON_GetArraySize(offs) == 2,
          "completions: tokens, logprobs_token, top_logprobs, text_offset per shown token (%s)", s ? s : "NULL");
    const cJSON *top0 = cJSON_GetArrayItem(tops, 0);
    CHECK(cJSON_GetArraySize(top0) == 2 && cJSON_GetObjectItem(top0, "def") &&
              cJSON_GetObjectItem(top0, "def")->valuedouble == -0.25 && cJSON_GetArrayItem(offs, 1)->valueint == 3,
          "completions: alternatives keyed by token text, offsets");
    cJSON_Delete(root);
    free(s);

    /* no logprobs asked: null */
    s = resp_chunk(&m, 0, 0, "x", 1, NULL);
    root = s ? cJSON_Parse(s) : NULL;
    CHECK(root && cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "logprobs")),
          "no logprobs: null");
    cJSON_Delete(root);
    free(s);
    ellm_tokenizer_free(tok);
}

/* ---- tool calling ---- */

/* Requests with tools: accepted as OpenAI sends them (tools kept as JSON
 * text, tool and assistant tool-call turns into the messages), and every
 * form this server cannot honour refused naming its field. */
static void test_tool_requests(void) {
    req_params p;
    req_error e;
    const char *ok_body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Bern\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"name\":\"get_weather\",\"content\":\"sunny\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":\"auto\",\"parallel_tool_calls\":false}";
    int ok = parse(REQ_CHAT, ok_body, &p, &e);
    CHECK(ok && p.tools && strstr(p.tools, "\"get_weather\"") && !p.tools_off && p.n_msgs == 3 &&
              !strcmp(p.msgs[1].role, "assistant") && !strcmp(p.msgs[1].content, "") && p.msgs[1].tool_calls &&
              strstr(p.msgs[1].tool_calls, "\"arguments\":\"{\\\"city\\\":\\\"Bern\\\"}\"") &&
              !strcmp(p.msgs[2].role, "tool") && !strcmp(p.msgs[2].tool_call_id, "call_1") &&
              !strcmp(p.msgs[2].name, "get_weather") && !strcmp(p.msgs[2].content, "sunny"),
          "a conversation with tools and tool calls: %s", ok ? "fields differ" : e.message);
    if (ok) {
        req_params q;
        CHECK(req_params_copy(&q, &p) && q.tools && strcmp(q.tools, p.tools) == 0 && q.tools != p.tools &&
                  q.msgs[1].tool_calls && !strcmp(q.msgs[1].tool_calls, p.msgs[1].tool_calls) &&
                  !strcmp(q.msgs[2].tool_call_id, "call_1") && q.msgs[2].tool_call_id != p.msgs[2].tool_call_id,
              "a copy holds its own tools and tool-call fields");
        req_params_free(&q);
        req_params_free(&p);
    }
    ok = parse(REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
                         "\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}", &p, &e);
    CHECK(ok && p.tools && p.tools_off, "tool_choice none: tools kept out of the prompt (%s)", ok ? "" : e.message);
    if (ok) req_params_free(&p);
    const struct {
        const char *body, *param, *says;
    } bad[] = {
        {"\"tools\":{}", "tools", "must be an array"},
        {"\"tools\":[{\"type\":\"function\"}]", "tools", "needs a 'name'"},
        {"\"tools\":[{\"type\":\"retrieval\",\"function\":{\"name\":\"f\"}}]", "tools", "\"type\": \"function\""},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]", "tools", "JSON Schema"},
        {"\"tool_choice\":\"required\"", "tool_choice", "not supported"},
        {"\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", "tool_choice", "naming a function"},
        {"\"tool_choice\":\"sometimes\"", "tool_choice", "must be"},
        {"\"tool_choice\":3", "tool_choice", "string or an object"},
        {"\"parallel_tool_calls\":\"yes\"", "parallel_tool_calls", "boolean"},
        {"\"functions\":[{\"name\":\"f\"}]", "functions", "as 'tools'"},
    };
    char b[512];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}", bad[i].body);
        ok = parse(REQ_CHAT, b, &p, &e);
        CHECK(!ok && e.http_status == 400 && e.param && !strcmp(e.param, bad[i].param) && strstr(e.message, bad[i].says),
              "%s: 400 naming %s saying '%s' (%s)", b, bad[i].param, bad[i].says, ok ? "accepted" : e.message);
        if (ok) req_params_free(&p);
    }
    const char *bad_msgs[] = {
        "[{\"role\":\"tool\",\"content\":\"5\"}]",                              /* no tool_call_id */
        "[{\"role\":\"tool\",\"tool_call_id\":7,\"content\":\"5\"}]",           /* not a string */
        "[{\"role\":\"assistant\",\"tool_calls\":{}}]",                          /* not an array */
        "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":1}}]}]", /* no name */
        "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]", /* not a string */
    };
    for (size_t i = 0; i < sizeof bad_msgs / sizeof *bad_msgs; i++) {
        snprintf(b, sizeof b, "{\"messages\":%s}", bad_msgs[i]);
        ok = parse(REQ_CHAT, b, &p, &e);
        CHECK(!ok && e.http_status == 400 && e.param && !strcmp(e.param, "messages"), "%s: 400 naming messages (%s)", b,
              ok ? "accepted" : e.message);
        if (ok) req_params_free(&p);
    }
}

/* The calls of a reply: n of them, content the first content_len bytes,
 * and each call's name and arguments as given (NULL: not checked). */
static void check_calls(tool_syntax s, const char *text, int n, size_t content_len, const char *const *names,
                        const char *const *args) {
    size_t content = 0;
    char *calls = NULL;
    int got = tool_calls_parse(s, text, strlen(text), 42, &content, &calls);
    CHECK(got == n, "%s: %s: %d calls, want %d", tool_syntax_name(s), text, got, n);
    if (n == 0) {
        CHECK(!calls && content == strlen(text), "%s: %s: no calls leave the text whole", tool_syntax_name(s), text);
        return;
    }
    CHECK(content == content_len, "%s: %s: content of %zu bytes, want %zu", tool_syntax_name(s), text, content,
          content_len);
    cJSON *j = calls ? cJSON_Parse(calls) : NULL;
    CHECK(cJSON_GetArraySize(j) == n, "%s: calls JSON %s", tool_syntax_name(s), calls ? calls : "(none)");
    for (int i = 0; i < n && j; i++) {
        const cJSON *c = cJSON_GetArrayItem(j, i), *fn = cJSON_GetObjectItem(c, "function");
        const cJSON *id = cJSON_GetObjectItem(c, "id"), *type = cJSON_GetObjectItem(c, "type");
        const cJSON *name = cJSON_GetObjectItem(fn, "name"), *a = cJSON_GetObjectItem(fn, "arguments");
        const size_t idn = cJSON_IsString(id) ? strlen(id->valuestring) : 0;
        int id_ok = s == TOOLS_MISTRAL ? idn == 9 : idn == 29 && !strncmp(id->valuestring, "call_", 5);
        for (size_t k = s == TOOLS_MISTRAL ? 0 : 5; id_ok && k < idn; k++) {
            const char ch = id->valuestring[k];
            id_ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        }
        CHECK(id_ok && cJSON_IsString(type) && !strcmp(type->valuestring, "function"), "%s: call %d's id / type: %s",
              tool_syntax_name(s), i, calls);
        CHECK(cJSON_IsString(name) && !strcmp(name->valuestring, names[i]), "%s: call %d named %s: %s",
              tool_syntax_name(s), i, names[i], calls);
        CHECK(cJSON_IsString(a) && (!args[i] || !strcmp(a->valuestring, args[i])), "%s: call %d arguments %s: %s",
              tool_syntax_name(s), i, args[i] ? args[i] : "(any)", calls);
    }
    cJSON_Delete(j);
    free(calls);
}

static void test_tool_parse(void) {
    /* the syntax each fixture template teaches */
    const struct {
        const char *file;
        tool_syntax want;
    } tpl[] = {
        {"qwen2.5-instruct", TOOLS_HERMES}, {"qwen3", TOOLS_HERMES}, {"llama3.2-instruct", TOOLS_LLAMA3},
        {"llama3.3-instruct", TOOLS_LLAMA3}, {"mistral-nemo-instruct-2407", TOOLS_MISTRAL},
        {"llama3-instruct", TOOLS_NONE}, {"chatml", TOOLS_NONE}, {"deepseek-v3", TOOLS_NONE},
    };
    for (size_t i = 0; i < sizeof tpl / sizeof *tpl; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/chat/%s.jinja", test_data_dir(), tpl[i].file);
        size_t n;
        char *src = test_read_file(path, &n);
        CHECK(src && tool_syntax_of(src) == tpl[i].want, "%s: syntax %s, want %s", tpl[i].file,
              src ? tool_syntax_name(tool_syntax_of(src)) : "(unreadable)", tool_syntax_name(tpl[i].want));
        free(src);
    }
    CHECK(tool_syntax_of(NULL) == TOOLS_NONE, "no template: no syntax");

    const char *w[] = {"get_weather", "add"}, *wa[] = {"{\"city\":\"Bern\"}", "{\"a\":2,\"b\":3}"};
    check_calls(TOOLS_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}\n</tool_call>", 1,
                0, w, wa);
    check_calls(TOOLS_HERMES,
                "Let me look.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>\n",
                2, 12, w, wa);
    /* the reply ended right after the JSON (no closing tag); arguments given as a string */
    const char *sa[] = {"{\"city\": \"Bern\"}"};
    check_calls(TOOLS_HERMES, "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Bern\\\"}\"}", 1, 0,
                w, sa);
    const char *none_args[] = {"{}"};
    check_calls(TOOLS_HERMES, "<tool_call>{\"name\": \"get_weather\"}</tool_call>", 1, 0, w, none_args);
    /* not calls: text, as it is */
    check_calls(TOOLS_HERMES, "The weather is fine.", 0, 0, NULL, NULL);
    check_calls(TOOLS_HERMES, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": </tool_call>", 0, 0, NULL,
                NULL);
    check_calls(TOOLS_HERMES, "<tool_call>{\"arguments\": {}}</tool_call>", 0, 0, NULL, NULL);
    check_calls(TOOLS_HERMES, "<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call> and then some text", 0, 0,
                NULL, NULL);
    check_calls(TOOLS_HERMES, "<tool_call>[1, 2]</tool_call>", 0, 0, NULL, NULL);

    check_calls(TOOLS_LLAMA3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Bern\"}} ", 1, 0, w, wa);
    check_calls(TOOLS_LLAMA3, "{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}", 1, 0, w + 1, wa + 1);
    check_calls(TOOLS_LLAMA3, "{\"name\": \"add\"} trailing", 0, 0, NULL, NULL);
    check_calls(TOOLS_LLAMA3, "Use {\"name\": \"add\"}", 0, 0, NULL, NULL);
    check_calls(TOOLS_LLAMA3, "{\"weather\": \"fine\"}", 0, 0, NULL, NULL);

    check_calls(TOOLS_MISTRAL,
                "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}, "
                "{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}]",
                2, 0, w, wa);
    check_calls(TOOLS_MISTRAL, "[{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}]", 1, 0, w + 1, wa + 1);
    check_calls(TOOLS_MISTRAL, "[]", 0, 0, NULL, NULL);
    check_calls(TOOLS_MISTRAL, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": 5}]", 0, 0, NULL, NULL);
    check_calls(TOOLS_NONE, "<tool_call>{\"name\": \"add\"}</tool_call>", 0, 0, NULL, NULL);

    /* streaming: text goes out up to where a call may start */
    const struct {
        tool_syntax s;
        const char *text;
        size_t safe;
    } st[] = {
        {TOOLS_HERMES, "Hello there", 11},
        {TOOLS_HERMES, "Hello <tool", 5},
        {TOOLS_HERMES, "Hello <", 5},
        {TOOLS_HERMES, "Hello\n<tool_call>{\"na", 5},
        {TOOLS_HERMES, "Hello \n", 5},
        {TOOLS_HERMES, "a < b", 5},
        {TOOLS_LLAMA3, "  ", 0},
        {TOOLS_LLAMA3, " {\"name\"", 0},
        {TOOLS_LLAMA3, "Sure, here", 10},
        {TOOLS_MISTRAL, "[TOOL_", 0},
        {TOOLS_MISTRAL, "[{\"name\"", 0},
        {TOOLS_MISTRAL, "Bonjour", 7},
        {TOOLS_NONE, "<tool_call>", 11},
    };
    for (size_t i = 0; i < sizeof st / sizeof *st; i++) {
        const size_t got = tool_calls_stream_safe(st[i].s, st[i].text, strlen(st[i].text), 0);
        CHECK(got == st[i].safe, "%s: stream '%s': %zu bytes safe, want %zu", tool_syntax_name(st[i].s), st[i].text, got,
              st[i].safe);
    }
    /* past text already sent: a Hermes marker is still looked for in what is left; a reply that did not open
     * with its call (Llama 3, Mistral) has none to come */
    CHECK(tool_calls_stream_safe(TOOLS_HERMES, " then <tool_call>", 17, 1) == 5, "hermes, after text sent: stops at the marker");
    CHECK(tool_calls_stream_safe(TOOLS_LLAMA3, " {\"name\"", 8, 1) == 8, "llama3, after text sent: all of it");
    CHECK(tool_calls_stream_safe(TOOLS_MISTRAL, "[TOOL_", 6, 1) == 6, "mistral, after text sent: all of it");

    /* the response shapes: content null beside the calls; a streamed chunk of indexed calls */
    const char *calls = "[{\"id\":\"call_x\",\"type\":\"function\",\"function\":{\"name\":\"add\",\"arguments\":\"{}\"}}]";
    resp_meta m = {.id = "chatcmpl-1", .model = "m", .created = 1, .kind = REQ_CHAT};
    resp_choice c = {.text = "", .len = 0, .finish = "tool_calls", .tool_calls = calls};
    char *body = resp_final_choices(&m, &c, 1);
    cJSON *j = body ? cJSON_Parse(body) : NULL;
    const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message");
    const cJSON *fin = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "finish_reason");
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")) && cJSON_GetArraySize(cJSON_GetObjectItem(msg, "tool_calls")) == 1 &&
              cJSON_IsString(fin) && !strcmp(fin->valuestring, "tool_calls"),
          "a reply of calls alone: %s", body ? body : "(none)");
    cJSON_Delete(j);
    free(body);
    c = (resp_choice){.text = "Let me see", .len = 10, .finish = "tool_calls", .tool_calls = calls};
    body = resp_final_choices(&m, &c, 1);
    CHECK(body && strstr(body, "\"content\":\"Let me see\"") && strstr(body, "\"tool_calls\":[{"), "text and calls: %s",
          body ? body : "(none)");
    free(body);
    body = resp_tool_calls_chunk(&m, 0, calls);
    j = body ? cJSON_Parse(body) : NULL;
    const cJSON *delta = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta");
    const cJSON *tc0 = cJSON_GetArrayItem(cJSON_GetObjectItem(delta, "tool_calls"), 0);
    CHECK(tc0 && cJSON_GetObjectItem(tc0, "index") && cJSON_GetObjectItem(tc0, "index")->valueint == 0 &&
              cJSON_IsString(cJSON_GetObjectItem(tc0, "id")) && !cJSON_GetObjectItem(delta, "content"),
          "streamed calls: %s", body ? body : "(none)");
    cJSON_Delete(j);
    free(body);
}

/* ---- JSON mode ---- */

/* 1 if every prefix of text is accepted, and 2 if the whole is a closed
 * object as well; 0 at the first refused byte. */
static int json_accepts(const char *text) {
    json_state st;
    json_state_init(&st);
    for (size_t i = 0; text[i]; i++)
        if (!json_feed(&st, text + i, 1)) return 0;
    return st.done ? 2 : 1;
}

static const char *vocab_tok[] = {"<eos>", "{", "}", "\"", "a", ":", " ", "1", "[", "]", ",", "true", "\"k\": ", "", "\n"};
static const char *json_vocab_bytes(const void *arg, int32_t id, size_t *len) {
    (void)arg;
    if (id == 0 || id == 13) return NULL; /* control tokens: no bytes */
    *len = strlen(vocab_tok[id]);
    return vocab_tok[id];
}
static int json_vocab_eog(const void *arg, int32_t id) {
    (void)arg;
    return id == 0;
}

static void test_json_mode(void) {
    const char *whole[] = {"{}", "{\"a\": 1}", " {\"a\":[1, -2.5e+3, 0, true, false, null, \"x\\u00e9\\n\"]}\n",
                           "{\"k\": {\"n\": {\"m\": []}}, \"s\": \"caf\xc3\xa9\"}", "{\"e\": 1E5, \"f\": 0.25}"};
    for (size_t i = 0; i < sizeof whole / sizeof *whole; i++)
        CHECK(json_accepts(whole[i]) == 2, "JSON object %s accepted whole (%d)", whole[i], json_accepts(whole[i]));
    const char *prefixes[] = {"{", "{\"a", "{\"a\": [1, 2", "{\"a\": tr", "{\"a\": -", "{\"a\": 1.", "{\"a\": \"\\u00",
                              "{\"a\": \"\xc3"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        CHECK(json_accepts(prefixes[i]) == 1, "prefix %s accepted, not closed (%d)", prefixes[i], json_accepts(prefixes[i]));
    const char *bad[] = {"[1]", "\"s\"", "1", "{a: 1}", "{\"a\" 1}", "{\"a\": 01}", "{\"a\": 1,}", "{\"a\": [1,]}",
                         "{\"a\": tru}", "{\"a\": \"\\x\"}", "{\"a\": \"\x01\"}", "{\"a\": \"\xc3(\"}", "{\"a\": 1]",
                         "{} {}", "{}x", "{\"a\": 1.e5}", "{\"a\": --1}", "{\"a\": +1}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(json_accepts(bad[i]) == 0, "not a JSON object text: %s (%d)", bad[i], json_accepts(bad[i]));
    /* blanks in a row and nesting are capped */
    char deep[128] = "{\"a\":";
    for (int i = 0; i < JSON_MAX_DEPTH - 1; i++) strcat(deep, "[");
    CHECK(json_accepts(deep) == 1, "nesting up to the cap");
    strcat(deep, "[");
    CHECK(json_accepts(deep) == 0, "nesting past the cap refused");
    char pad[64] = "{";
    for (int i = 0; i < JSON_MAX_BLANKS; i++) strcat(pad, " ");
    CHECK(json_accepts(pad) == 1, "%d blanks in a row", JSON_MAX_BLANKS);
    strcat(pad, " ");
    CHECK(json_accepts(pad) == 0, "more blanks in a row refused");

    /* the mask over a small vocabulary */
    const int nv = (int)(sizeof vocab_tok / sizeof *vocab_tok);
    uint8_t allow[16];
    json_state st;
    json_state_init(&st);
    int n = json_allowed(&st, nv, json_vocab_bytes, json_vocab_eog, NULL, allow);
    CHECK(n == 3 && allow[1] && allow[6] && allow[14] && !allow[0] && !allow[13] && !allow[8],
          "at the start: '{' and blanks (%d allowed)", n);
    CHECK(json_feed(&st, "{", 1), "'{'");
    n = json_allowed(&st, nv, json_vocab_bytes, json_vocab_eog, NULL, allow);
    CHECK(allow[2] && allow[3] && allow[12] && !allow[4] && !allow[7] && !allow[0], "after '{': '}', a key, blanks (%d)", n);
    CHECK(json_feed(&st, "\"k\": 1", 6), "a member");
    n = json_allowed(&st, nv, json_vocab_bytes, json_vocab_eog, NULL, allow);
    CHECK(allow[2] && allow[7] && allow[10] && !allow[3] && !allow[0], "after a number: more digits, ',' or '}' (%d)", n);
    CHECK(json_feed(&st, "}", 1) && st.done, "closed");
    n = json_allowed(&st, nv, json_vocab_bytes, json_vocab_eog, NULL, allow);
    CHECK(n == 1 && allow[0], "after the object: only the end (%d allowed)", n);
}

int main(void) {
    test_compute();
    test_request();
    test_sampling_fields();
    test_choices();
    test_prompts();
    test_json();
    test_tool_requests();
    test_tool_parse();
    test_json_mode();
    return test_finish();
}
