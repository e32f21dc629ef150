/* HTTP front end: libmicrohttpd in thread-per-connection mode, routing, the
 * OpenAI endpoints, SSE streaming through content-reader callbacks, and the
 * process lifecycle (load, serve, drain on SIGTERM).
 *
 * HTTP threads parse and tokenize requests, then hand jobs to the scheduler
 * (sched.h) and wait on them; they never call the engine. */
#include "server/server.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/responses.h"
#include "server/sched.h"
#include "server/tool_calls.h"
#include "server/ui.h"
#include "ellm.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#define WAIT_SLICE_MS 100     /* how often a waiting handler checks its client */
#define KEEPALIVE_MS 5000     /* SSE comment while a stream has nothing to say */
#define MULTI_WAIT_SLICE_MS 5 /* how often a stream of several choices looks at each */

typedef struct {
    server_params p;
    const char *model_id;
    struct MHD_Daemon *daemon;
    ellm_model *model;
    sched *sched;
    server_metrics metrics;
    atomic_int ready;    /* model loaded, scheduler running */
    atomic_int draining; /* SIGTERM: no new generation requests */
    atomic_ulong next_id;
    tool_syntax tools; /* how the chat template's model writes tool calls (tool_calls.h) */
} server;

typedef enum { ROUTE_NONE, ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_MODELS, ROUTE_HEALTH, ROUTE_METRICS, ROUTE_TOKENIZE,
               ROUTE_DETOKENIZE, ROUTE_UI, ROUTE_SLOT } route;

/* Per-connection request state (MHD's con_cls). */
typedef struct {
    char *body;
    size_t len, cap;
    int too_large;
} conn_state;

void server_default_params(server_params *p) {
    memset(p, 0, sizeof *p);
    p->host = "127.0.0.1";
    p->port = 8080;
    p->n_slots = 4;
    p->chunk = 128;
    p->max_queue = 64;
    p->max_body = (size_t)4 << 20;
    p->timeout_s = 30;
}

/* ---- responses ---------------------------------------------------------------- */

static enum MHD_Result send_body(struct MHD_Connection *c, unsigned status, const char *type, char *body,
                                 int retry_after) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":null}}";
        struct MHD_Response *r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Content-Type", "application/json");
        enum MHD_Result ret = MHD_queue_response(c, 500, r);
        MHD_destroy_response(r);
        return ret;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_body(c, status, "application/json", s, 0);
}

static enum MHD_Result send_error(server *srv, struct MHD_Connection *c, const req_error *e, req_status counted) {
    if (counted != REQ_STATUS_COUNT) metrics_count_request(&srv->metrics, counted);
    return send_body(c, (unsigned)e->http_status, "application/json", resp_error(e),
                     e->http_status == 503 ? 1 : 0);
}

static enum MHD_Result fail(server *srv, struct MHD_Connection *c, int status, const char *type, const char *code,
                            const char *msg, req_status counted) {
    req_error e;
    req_fail(&e, status, type, code, NULL, "%s", msg);
    return send_error(srv, c, &e, counted);
}

/* ---- client liveness -------------------------------------------------------- */

/* 1 if the client has closed or reset its connection. */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd pfd = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0) return 0;
    return (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* ---- generation requests ------------------------------------------------------ */

/* 1 if the rendered text already starts with the model's BOS (the template put it there). */
static int starts_with_bos(const ellm_model *model, const char *text, size_t len) {
    int32_t bos = ellm_token_bos(model), buf[128];
    int n = 0;
    ellm_error err;
    if (bos < 0) return 0;
    if (ellm_tokenize(model, text, len < 64 ? len : 64, 0, 1, buf, 128, &n, &err) != ELLM_OK || n == 0) return 0;
    return buf[0] == bos;
}

/* Tokenizes the request's prompt (as `ellm run` would: a chat turn through
 * the chat template with control tokens parsed, a completion prompt as plain
 * text after BOS). Returns a malloc'ed array, or NULL with *e filled. */
static int32_t *prompt_tokens(server *srv, const req_params *p, int *n_out, req_error *e) {
    const int n_ctx = sched_n_ctx(srv->sched);
    const int n_vocab = ellm_tokenizer_n_vocab(ellm_model_tokenizer(srv->model));
    ellm_error err = {0};
    *n_out = 0;
    if (p->kind == REQ_COMPLETION && p->prompt_is_ids) {
        for (int i = 0; i < p->n_prompt_ids; i++)
            if (p->prompt_ids[i] >= n_vocab) {
                req_fail(e, 400, "invalid_request_error", "invalid_value", "prompt",
                         "token id %d at index %d is outside the vocabulary [0, %d)", p->prompt_ids[i], i, n_vocab);
                return NULL;
            }
        if (p->n_prompt_ids >= n_ctx) goto too_long;
        int32_t *ids = malloc((size_t)p->n_prompt_ids * sizeof *ids);
        if (!ids) return req_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
        memcpy(ids, p->prompt_ids, (size_t)p->n_prompt_ids * sizeof *ids);
        *n_out = p->n_prompt_ids;
        return ids;
    }
    char *rendered = NULL;
    const char *text = p->prompt;
    size_t len = p->prompt_len;
    int add_bos = 1, special = 0;
    if (p->kind == REQ_CHAT) {
        if (ellm_chat_render_tools(srv->model, srv->p.chat_template, p->msgs, p->n_msgs, 1, p->tools_off ? NULL : p->tools,
                                   &rendered, &len, &err) != ELLM_OK) {
            req_fail(e, 400, "invalid_request_error", "chat_template_error", "messages", "chat template: %s", err.msg);
            return NULL;
        }
        text = rendered;
        special = 1;
        add_bos = !starts_with_bos(srv->model, rendered, len);
    }
    int cap = n_ctx + 1;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = 0;
    ellm_status st = ids ? ellm_tokenize(srv->model, text, len, add_bos, special, ids, cap, &n, &err) : ELLM_ERR_NOMEM;
    ellm_free(rendered);
    if (st == ELLM_ERR_NOMEM) {
        free(ids);
        return req_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    }
    if (st == ELLM_ERR_ARG || (st == ELLM_OK && n >= n_ctx)) {
        free(ids);
        *n_out = n;
        goto too_long;
    }
    if (st != ELLM_OK) {
        free(ids);
        req_fail(e, 400, "invalid_request_error", "invalid_value", p->kind == REQ_CHAT ? "messages" : "prompt",
                 "cannot tokenize the prompt: %s", err.msg);
        return NULL;
    }
    if (n == 0) { /* an empty prompt starts from BOS, as `ellm run` does */
        if (ellm_token_bos(srv->model) < 0) {
            free(ids);
            req_fail(e, 400, "invalid_request_error", "invalid_value", "prompt",
                     "the prompt is empty and the model has no BOS token to start from");
            return NULL;
        }
        ids[n++] = ellm_token_bos(srv->model);
    }
    *n_out = n;
    return ids;
too_long:
    req_fail(e, 400, "invalid_request_error", "context_length_exceeded", p->kind == REQ_CHAT ? "messages" : "prompt",
             "the prompt is %s%d tokens; this server's context holds %d tokens per request (prompt plus at least one "
             "generated token)",
             p->prompt_is_ids ? "" : "at least ", p->prompt_is_ids ? p->n_prompt_ids : (*n_out > 0 ? *n_out : n_ctx),
             n_ctx);
    return NULL;
}

/* Drops the HTTP side's hold on jobs[0 .. n) (running ones are cancelled). */
static void release_jobs(server *srv, job **jobs, int n) {
    for (int i = 0; i < n; i++)
        if (jobs[i]) sched_release(srv->sched, jobs[i]);
}

/* What of one choice of a stream (stream.jobs[k]) was sent. */
/* Whether job j's reply is read for tool calls: a chat request with tools
 * (not tool_choice "none") and a template whose call syntax is known. */
static int job_tools(const server *srv, const job *j) {
    return j->p.kind == REQ_CHAT && j->p.tools && !j->p.tools_off && srv->tools != TOOLS_NONE;
}

/* The seed of the ids of choice k's tool calls in response `id`. */
static uint64_t tool_id_seed(const char *id, int k) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)time(NULL);
    for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h ^ (uint64_t)k * 0x9E3779B97F4A7C15ull;
}

typedef struct {
    size_t taken;       /* bytes of job->text already sent */
    size_t taken_chars; /* the characters in those bytes */
    int sent_tok;       /* generated tokens whose chunk was sent (job->tok_end entries) */
    int started;        /* its first chunk (a chat's role) was sent */
    int ended;          /* its final chunk (or error) was sent */
} choice_stream;

typedef struct {
    server *srv;
    struct MHD_Connection *conn;
    resp_meta meta;
    char id[48];
    job *jobs[REQ_MAX_JOBS];
    choice_stream ch[REQ_MAX_JOBS];
    int n_ch, n_ended;
    int n_choices; /* choices per prompt (fill_usage counts each prompt once) */
    int finished;
    char *out;     /* pending bytes of SSE events */
    size_t out_len, out_off, out_cap;
    /* a running job's new token ends, log-probabilities and text, copied under the lock */
    size_t *snap_ends;
    logprobs_token *snap_lps;
    char *snap_text;
    size_t snap_ends_cap, snap_text_cap;
} stream;

/* Room in the stream's snapshot for n token ends (and their log-probabilities,
 * when the request asked for them: its choices all did or all did not) and
 * len text bytes. */
static int snap_reserve(stream *st, size_t n, size_t len) {
    if (n > st->snap_ends_cap) {
        if (st->jobs[0]->p.logprobs) {
            logprobs_token *l = realloc(st->snap_lps, 2 * n * sizeof *l);
            if (!l) return 0;
            st->snap_lps = l;
        }
        size_t *e = realloc(st->snap_ends, 2 * n * sizeof *e);
        if (!e) return 0;
        st->snap_ends = e;
        st->snap_ends_cap = 2 * n;
    }
    if (len + 1 > st->snap_text_cap) {
        char *t = realloc(st->snap_text, 2 * len + 64);
        if (!t) return 0;
        st->snap_text = t;
        st->snap_text_cap = 2 * len + 64;
    }
    return 1;
}

/* resp_logprobs' token bytes: the model's vocabulary. */
static const char *vocab_bytes(const void *model, int32_t id, size_t *len) {
    return ellm_tokenizer_token_bytes(ellm_model_tokenizer(model), id, len);
}

/* Characters (code points) in n bytes of UTF-8: a completion's text_offset
 * counts characters, as OpenAI's does. */
static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static void out_event(stream *st, const char *json) {
    if (!json) return;
    size_t n = strlen(json), need = st->out_len + n + 9;
    if (need > st->out_cap) {
        size_t cap = 2 * need;
        char *b = realloc(st->out, cap);
        if (!b) return;
        st->out = b;
        st->out_cap = cap;
    }
    memcpy(st->out + st->out_len, "data: ", 6);
    memcpy(st->out + st->out_len + 6, json, n);
    memcpy(st->out + st->out_len + 6 + n, "\n\n", 2);
    st->out_len += n + 8;
}

/* The usage of a request's n jobs, n_choices to a prompt (prompt-major):
 * each prompt once (its first choice's), as OpenAI counts it, and every
 * choice's tokens. */
static void count_usage(resp_meta *m, job *const *jobs, int n, int n_choices) {
    m->prompt_tokens = m->completion_tokens = m->cached_tokens = 0;
    for (int k = 0; k < n; k++) {
        if (k % n_choices == 0) {
            m->prompt_tokens += jobs[k]->n_prompt;
            m->cached_tokens += jobs[k]->n_cached;
        }
        m->completion_tokens += jobs[k]->n_gen;
    }
}

/* Something to send for choice k (lock held): a token, or its end. */
static int choice_news(const stream *st, int k) {
    const choice_stream *c = &st->ch[k];
    return !c->ended && (st->jobs[k]->n_tok > c->sent_tok || st->jobs[k]->done);
}

static int stream_news(const stream *st) {
    for (int k = 0; k < st->n_ch; k++)
        if (choice_news(st, k)) return 1;
    return 0;
}

static void out_done_mark(stream *st) {
    static const char dmark[] = "data: [DONE]\n\n";
    size_t need = st->out_len + sizeof dmark;
    if (need > st->out_cap) {
        char *b = realloc(st->out, need);
        if (b) st->out = b, st->out_cap = need;
    }
    if (need <= st->out_cap) {
        memcpy(st->out + st->out_len, dmark, sizeof dmark - 1);
        st->out_len += sizeof dmark - 1;
    }
}

/* The SSE events of choice k's news: a chunk per new token (a chat's role
 * chunk first), and once its job is done the text no token carried and its
 * final chunk. What to send is taken under the lock and the JSON built after
 * it, so the engine never waits for streams to format their chunks; a
 * running job's token ends and text may grow (and move) meanwhile: they are
 * copied; a finished job changes no more and is read as is. Returns 0 if
 * out of memory. */
static int stream_choice(stream *st, int k) {
    sched *s = st->srv->sched;
    choice_stream *cs = &st->ch[k];
    job *j = st->jobs[k];
    sched_lock(s);
    const int done = j->done, n_new = j->n_tok - cs->sent_tok;
    const int role = !cs->started && (n_new > 0 || done) && st->meta.kind == REQ_CHAT && (j->n_tok > 0 || j->finish);
    if (n_new > 0 || done) cs->started = 1;
    const size_t *ends = j->tok_end + cs->sent_tok;
    const logprobs_token *lps = j->p.logprobs ? j->lps + cs->sent_tok : NULL;
    const char *text = j->text;
    size_t base = 0; /* offset in the job's text of text[0] */
    const int tools = job_tools(st->srv, j);
    if (!done && n_new > 0) {
        size_t to = j->tok_end[j->n_tok - 1];
        if (!snap_reserve(st, (size_t)n_new, to - cs->taken)) {
            sched_unlock(s);
            return 0;
        }
        memcpy(st->snap_ends, ends, (size_t)n_new * sizeof *ends);
        if (lps) lps = memcpy(st->snap_lps, lps, (size_t)n_new * sizeof *lps);
        if (to > cs->taken) memcpy(st->snap_text, j->text + cs->taken, to - cs->taken); /* tokens may have no text yet: j->text NULL */
        ends = st->snap_ends;
        text = st->snap_text;
        base = cs->taken;
    }
    sched_unlock(s);
    /* with tools, text from where a call may be starting waits for the end:
     * a running reply's unsent text (the snapshot) is read for it, outside the
     * lock; a finished one (its text changes no more) is split into text and
     * calls, so tokens read in the same poll carry only the text */
    size_t limit = SIZE_MAX;
    if (tools && !done && n_new > 0)
        limit = cs->taken + tool_calls_stream_safe(st->srv->tools, text, ends[n_new - 1] - cs->taken, cs->taken > 0);
    const char *finish = j->finish;
    char *calls = NULL;
    size_t text_end = j->text_len;
    if (done && tools && j->finish && j->text_len) {
        const int n_calls = tool_calls_parse(st->srv->tools, j->text, j->text_len, tool_id_seed(st->id, k), &text_end, &calls);
        if (n_calls > 0 && !strcmp(j->finish, "stop")) finish = "tool_calls";
        if (n_calls <= 0) text_end = j->text_len;
        else limit = text_end;
    }
    if (role) {
        char *c = resp_chunk(&st->meta, k, 1, "", 0, NULL);
        out_event(st, c);
        free(c);
    }
    for (int t = 0; t < n_new; t++) {
        /* a token's text starts where the text sent so far ends */
        const resp_logprobs lp = {.lp = lps ? lps + t : NULL, .offset = &cs->taken_chars, .n = 1,
                                  .bytes = vocab_bytes, .arg = st->srv->model};
        const size_t to = ends[t] < limit ? ends[t] : limit > cs->taken ? limit : cs->taken;
        char *c = resp_chunk(&st->meta, k, 0, text + (cs->taken - base), to - cs->taken, lps ? &lp : NULL);
        out_event(st, c);
        free(c);
        cs->taken_chars += utf8_chars(text + (cs->taken - base), to - cs->taken);
        cs->taken = to;
    }
    cs->sent_tok += n_new;
    if (!done) return 1;
    if (text_end > cs->taken) { /* text no token carried (flushed at the end, or held back for a call) */
        char *c = resp_chunk(&st->meta, k, 0, j->text + cs->taken, text_end - cs->taken, NULL);
        out_event(st, c);
        free(c);
        cs->taken = text_end;
    }
    if (calls) {
        char *c = resp_tool_calls_chunk(&st->meta, k, calls);
        out_event(st, c);
        free(c);
        free(calls);
        cs->taken = j->text_len;
    }
    cs->ended = 1;
    st->n_ended++;
    if (!j->finish) { /* a failed choice ends the stream */
        req_error e;
        req_fail(&e, 500, "server_error", "generation_failed", NULL, "generation failed: %s",
                 j->failed ? j->errmsg : "cancelled");
        char *c = resp_error(&e);
        out_event(st, c);
        free(c);
        st->n_ended = st->n_ch;
        return 1;
    }
    /* usage (every choice's tokens) goes with the last final chunk */
    const int last = st->n_ended == st->n_ch;
    if (last) count_usage(&st->meta, st->jobs, st->n_ch, st->n_choices);
    char *c = resp_finish_chunk(&st->meta, k, finish, last);
    out_event(st, c);
    free(c);
    if (last && j->p.include_usage) {
        c = resp_usage_chunk(&st->meta);
        out_event(st, c);
        free(c);
    }
    return 1;
}

/* MHD content reader: SSE events as the jobs produce tokens, one chunk per
 * generated token (its text may be empty: half a UTF-8 character or a
 * possible stop-string prefix waits for a later token), as llama-server
 * streams, so a client sees each token when it exists. A chat stream's role
 * chunk goes out with the first token. Blocks (this is the connection's own
 * thread) until there is something to send. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *st = cls;
    (void)pos;
    if (st->out_off == st->out_len) {
        st->out_off = st->out_len = 0;
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        sched *s = st->srv->sched;
        sched_lock(s);
        int waited = 0;
        while (!st->out_len && !stream_news(st)) {
            if (client_gone(st->conn)) {
                sched_unlock(s);
                return MHD_CONTENT_READER_END_WITH_ERROR; /* the free callback cancels the jobs */
            }
            /* one choice: its job's news wake this thread; several: each is looked at every slice */
            int k = 0;
            while (k + 1 < st->n_ch && st->ch[k].ended) k++;
            const int slice = st->n_ch > 1 ? MULTI_WAIT_SLICE_MS : WAIT_SLICE_MS;
            sched_wait(s, st->jobs[k], slice);
            waited += slice;
            if (waited >= KEEPALIVE_MS && !stream_news(st)) {
                static const char ka[] = ": keep-alive\n\n";
                if (st->out_cap < sizeof ka) {
                    char *b = realloc(st->out, 64);
                    if (b) st->out = b, st->out_cap = 64;
                }
                if (st->out_cap >= sizeof ka) memcpy(st->out, ka, st->out_len = sizeof ka - 1);
                break;
            }
        }
        sched_unlock(s);
        for (int k = 0; k < st->n_ch && st->n_ended < st->n_ch; k++) {
            sched_lock(s);
            const int news = choice_news(st, k);
            sched_unlock(s);
            if (news && !stream_choice(st, k))
                return MHD_CONTENT_READER_END_WITH_ERROR; /* out of memory: close; the free callback cancels */
        }
        if (st->n_ended == st->n_ch) {
            out_done_mark(st);
            st->finished = 1;
        }
        if (!st->out_len) return st->finished ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->out_len - st->out_off < max ? st->out_len - st->out_off : max;
    memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    release_jobs(st->srv, st->jobs, st->n_ch); /* cancels those still running */
    free(st->out);
    free(st->snap_ends);
    free(st->snap_lps);
    free(st->snap_text);
    free(st);
}

/* The text of n token ids (malloc'ed: a prompt given as ids, /detokenize), NULL if out of memory. */
static char *ids_text(const ellm_model *model, const int32_t *ids, int n, size_t *len) {
    size_t cap = 256, used = 0;
    char *t = malloc(cap), piece[4096];
    ellm_detok dt = {0};
    for (int i = 0; t && i <= n; i++) {
        int nb = i < n ? ellm_detok_push(model, &dt, ids[i], piece, sizeof piece) : ellm_detok_flush(&dt, piece, sizeof piece);
        if (nb <= 0) continue;
        if (used + (size_t)nb + 1 > cap) {
            cap = 2 * (used + (size_t)nb + 1);
            char *b = realloc(t, cap);
            if (!b) free(t);
            t = b;
            if (!t) break;
        }
        memcpy(t + used, piece, (size_t)nb);
        used += (size_t)nb;
    }
    if (t) t[used] = 0;
    *len = used;
    return t;
}

/* A finished job's choice: its text (led by the prompt's with echo: the
 * prompt as sent, or the text of its token ids) and, if asked, the
 * log-probabilities of its tokens (with echo the prompt's first, the first
 * of them without any), each token at its text's offset in characters. */
typedef struct {
    char *text;
    size_t len;
    logprobs_token *lps;
    size_t *offsets;
    resp_logprobs lp;
} choice_buf;

static void choice_free(choice_buf *cb) {
    free(cb->text);
    free(cb->lps);
    free(cb->offsets);
}

/* Fills *cb for job j; 0 if out of memory. */
static int choice_build(server *srv, const job *j, choice_buf *cb) {
    memset(cb, 0, sizeof *cb);
    const char *gen = j->text ? j->text : "";
    size_t plen = 0;
    char *echo = NULL;
    if (j->p.echo) {
        if (j->p.prompt_is_ids) {
            echo = ids_text(srv->model, j->prompt, j->n_prompt, &plen);
        } else if ((echo = malloc(j->p.prompt_len + 1))) {
            memcpy(echo, j->p.prompt, plen = j->p.prompt_len);
        }
    }
    cb->len = plen + j->text_len;
    cb->text = !j->p.echo || echo ? malloc(cb->len + 1) : NULL;
    const int np = j->p.echo && j->p.logprobs ? j->n_prompt : 0, n = np + j->n_tok;
    if (j->p.logprobs) {
        cb->lps = malloc((size_t)(n > 0 ? n : 1) * sizeof *cb->lps);
        cb->offsets = malloc((size_t)(n > 0 ? n : 1) * sizeof *cb->offsets);
    }
    if (!cb->text || (j->p.logprobs && (!cb->lps || !cb->offsets))) {
        free(echo);
        choice_free(cb);
        return 0;
    }
    memcpy(cb->text, echo ? echo : "", plen);
    memcpy(cb->text + plen, gen, j->text_len);
    cb->text[cb->len] = 0;
    free(echo);
    const size_t echo_chars = utf8_chars(cb->text, plen);
    size_t chars = 0, at = 0;
    for (int i = 0; i < np; i++) { /* the prompt's tokens: their bytes one after another, within the echo */
        cb->lps[i] = j->prompt_lps[i];
        cb->offsets[i] = chars < echo_chars ? chars : echo_chars;
        size_t tb = 0;
        const char *b = vocab_bytes(srv->model, j->prompt[i], &tb);
        chars += b ? utf8_chars(b, tb) : 0;
    }
    chars = echo_chars;
    for (int i = 0; cb->lps && i < j->n_tok; at = j->tok_end[i++]) {
        cb->lps[np + i] = j->lps[i];
        cb->offsets[np + i] = chars; /* where the text of the tokens before it ends */
        chars += utf8_chars(gen + at, j->tok_end[i] - at);
    }
    cb->lp = (resp_logprobs){.lp = cb->lps, .offset = cb->offsets, .n = n, .bytes = vocab_bytes, .arg = srv->model};
    return 1;
}

/* The body of the whole response of n finished jobs (one choice each); NULL if out of memory. */
static char *final_body(server *srv, job *const *jobs, int n, const resp_meta *meta) {
    choice_buf cb[REQ_MAX_CHOICES];
    resp_choice rc[REQ_MAX_CHOICES];
    int built = 0;
    char *calls[REQ_MAX_CHOICES] = {0};
    while (built < n && choice_build(srv, jobs[built], &cb[built])) {
        const job *j = jobs[built];
        rc[built] = (resp_choice){.text = cb[built].text, .len = cb[built].len, .finish = j->finish,
                                  .lp = j->p.logprobs ? &cb[built].lp : NULL};
        size_t content = cb[built].len;
        if (job_tools(srv, j) && j->finish &&
            tool_calls_parse(srv->tools, cb[built].text, cb[built].len, tool_id_seed(meta->id, built), &content,
                             &calls[built]) > 0) {
            rc[built].len = content;
            rc[built].tool_calls = calls[built];
            if (!strcmp(j->finish, "stop")) rc[built].finish = "tool_calls";
        }
        built++;
    }
    char *body = built == n ? resp_final_choices(meta, rc, n) : NULL;
    for (int i = 0; i < built; i++) {
        choice_free(&cb[i]);
        free(calls[i]);
    }
    return body;
}

/* The request of prompt u of src (0: its own first one, u > 0: src->more[u - 1])
 * alone: a deep copy with that prompt in the prompt fields and no others (the
 * other prompts are not copied); 0 if out of memory. */
static int unit_params(req_params *dst, const req_params *src, int u) {
    req_params view = *src; /* shallow: only read by the copy */
    if (u > 0) {
        const req_prompt *q = &src->more[u - 1];
        view.prompt = q->text;
        view.prompt_len = q->len;
        view.prompt_ids = q->ids;
        view.n_prompt_ids = q->n_ids;
        view.prompt_is_ids = q->is_ids;
    }
    view.more = NULL;
    view.n_more = 0;
    return req_params_copy(dst, &view);
}

static enum MHD_Result handle_generate(server *srv, struct MHD_Connection *c, req_kind kind, conn_state *cs) {
    req_params p;
    req_error e;
    if (!req_parse(kind, cs->body ? cs->body : "", cs->len, &p, &e)) return send_error(srv, c, &e, REQ_STATUS_REJECTED);
    if (p.logprobs && p.echo && srv->p.mpi) { /* the ranks' passes keep the last row's logits only */
        req_params_free(&p);
        return fail(srv, c, 400, "invalid_request_error", "unsupported_value",
                    "'echo' with 'logprobs' is not available on a server started with --mpi", REQ_STATUS_REJECTED);
    }
    if (p.json_mode && srv->p.spec) { /* drafts and their verification sample without the JSON mask */
        req_params_free(&p);
        return fail(srv, c, 400, "invalid_request_error", "unsupported_value",
                    "'response_format' json_object is not available on a server started with --spec", REQ_STATUS_REJECTED);
    }
    if (atomic_load(&srv->draining)) {
        req_params_free(&p);
        return fail(srv, c, 503, "unavailable_error", "shutting_down", "the server is shutting down",
                    REQ_STATUS_OVERLOADED);
    }
    ellm_sampler_params sp = ellm_sampler_default_params();
    sp.temperature = p.temperature;
    sp.top_p = p.top_p;
    sp.top_k = p.top_k;
    sp.min_p = p.min_p;
    sp.repeat_penalty = p.repeat_penalty;
    sp.repeat_last_n = p.repeat_last_n;
    sp.presence_penalty = p.presence_penalty;
    sp.frequency_penalty = p.frequency_penalty;
    const uint64_t seed =
        p.seed_given ? p.seed : ((uint64_t)time(NULL) << 20) ^ (atomic_fetch_add(&srv->next_id, 1) * 0x9E3779B97F4A7C15ull);
    const int stream_mode = p.stream, n_choices = p.n_choices, n_units = 1 + p.n_more, n_jobs = n_units * n_choices;
    ellm_model_info info;
    ellm_model_get_info(srv->model, &info);
    ellm_error err = {0};
    /* one job per prompt and choice, prompt-major (choice index u x n + i):
     * its own sequence, sampler and seed (seed + i) */
    job *jobs[REQ_MAX_JOBS] = {0};
    int made = 0;
    for (int u = 0; u < n_units; u++) {
        req_params pu;
        int n_prompt = 0, ok = 0; /* ok: every choice of the prompt made; else e says why */
        int32_t *ids = NULL;
        if (!unit_params(&pu, &p, u)) {
            memset(&pu, 0, sizeof pu);
            req_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        } else {
            ids = prompt_tokens(srv, &pu, &n_prompt, &e);
        }
        for (int i = 0; ids && i < n_choices; i++) {
            req_params pi;
            int copied = 1;
            if (i + 1 < n_choices) {
                copied = req_params_copy(&pi, &pu);
            } else { /* the last choice takes the prompt's own */
                pi = pu;
                memset(&pu, 0, sizeof pu);
            }
            job *j = copied ? job_new(&pi, ids, n_prompt) : NULL;
            if (!j) {
                if (copied) req_params_free(&pi);
                req_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
                break;
            }
            jobs[made++] = j;
            sp.seed = seed + (uint64_t)i;
            if (ellm_sampler_init(&sp, info.n_vocab, &j->sampler, &err) != ELLM_OK ||
                ellm_sampler_set_logit_bias(j->sampler, j->p.bias_ids, j->p.bias, j->p.n_bias, &err) != ELLM_OK) {
                const int oom = err.status == ELLM_ERR_NOMEM;
                req_fail(&e, oom ? 500 : 400, oom ? "server_error" : "invalid_request_error", oom ? NULL : "invalid_value",
                         j->sampler && !oom ? "logit_bias" : NULL, "%s", err.msg);
                break;
            }
            ok = i + 1 == n_choices;
        }
        req_params_free(&pu);
        free(ids);
        if (!ok) {
            req_params_free(&p);
            release_jobs(srv, jobs, made);
            return send_error(srv, c, &e, e.http_status >= 500 ? REQ_STATUS_ERROR : REQ_STATUS_REJECTED);
        }
    }
    req_params_free(&p);
    for (int i = 0; i < n_jobs; i++) {
        submit_result r = sched_submit(srv->sched, jobs[i], &err);
        if (r == SUBMIT_OK) continue;
        release_jobs(srv, jobs, n_jobs); /* the submitted ones are cancelled */
        if (r == SUBMIT_BAD) return fail(srv, c, 400, "invalid_request_error", "context_length_exceeded", err.msg, REQ_STATUS_REJECTED);
        if (r == SUBMIT_UNAVAILABLE) return fail(srv, c, 503, "unavailable_error", "mpi_rank_lost", err.msg, REQ_STATUS_ERROR);
        return fail(srv, c, 503, "unavailable_error", r == SUBMIT_DRAINING ? "shutting_down" : "queue_full",
                    r == SUBMIT_DRAINING ? "the server is shutting down"
                                         : "every slot is busy and the wait queue is full; retry later",
                    REQ_STATUS_OVERLOADED);
    }
    unsigned long id = atomic_fetch_add(&srv->next_id, 1);
    resp_meta meta = {.model = srv->model_id, .created = (long)time(NULL), .kind = kind};
    if (stream_mode) {
        stream *st = calloc(1, sizeof *st);
        if (!st) {
            release_jobs(srv, jobs, n_jobs);
            return fail(srv, c, 500, "server_error", NULL, "out of memory", REQ_STATUS_COUNT);
        }
        st->srv = srv;
        memcpy(st->jobs, jobs, (size_t)n_jobs * sizeof *jobs);
        st->n_ch = n_jobs;
        st->n_choices = n_choices;
        st->conn = c;
        st->meta = meta;
        snprintf(st->id, sizeof st->id, "%s-%lx", kind == REQ_CHAT ? "chatcmpl" : "cmpl", id);
        st->meta.id = st->id;
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
        if (!resp) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    /* Not streamed: wait here (the connection's own thread) for every choice's whole text. */
    sched *s = srv->sched;
    sched_lock(s);
    for (int i = 0; i < n_jobs; i++)
        while (!jobs[i]->done) {
            sched_wait(s, jobs[i], WAIT_SLICE_MS);
            if (!jobs[i]->done && client_gone(c)) {
                sched_unlock(s);
                release_jobs(srv, jobs, n_jobs);
                return MHD_NO; /* nobody to answer */
            }
        }
    sched_unlock(s);
    char idbuf[48];
    snprintf(idbuf, sizeof idbuf, "%s-%lx", kind == REQ_CHAT ? "chatcmpl" : "cmpl", id);
    meta.id = idbuf;
    count_usage(&meta, jobs, n_jobs, n_choices);
    const job *failed = NULL;
    for (int i = 0; i < n_jobs && !failed; i++)
        if (!jobs[i]->finish) failed = jobs[i];
    enum MHD_Result ret;
    if (!failed) {
        ret = send_body(c, 200, "application/json", final_body(srv, jobs, n_jobs, &meta), 0);
    } else {
        req_error fe;
        if (failed->unavailable)
            req_fail(&fe, 503, "unavailable_error", "mpi_rank_lost", NULL, "generation failed: %s", failed->errmsg);
        else req_fail(&fe, 500, "server_error", "generation_failed", NULL, "generation failed: %s", failed->errmsg);
        ret = send_error(srv, c, &fe, REQ_STATUS_COUNT);
    }
    release_jobs(srv, jobs, n_jobs);
    return ret;
}

/* ---- other endpoints ------------------------------------------------------------ */

static enum MHD_Result handle_tokenize(server *srv, struct MHD_Connection *c, conn_state *cs) {
    if (!req_utf8_valid(cs->body ? cs->body : "", cs->len))
        return fail(srv, c, 400, "invalid_request_error", "invalid_encoding", "the request body is not valid UTF-8",
                    REQ_STATUS_COUNT);
    cJSON *root = cs->body ? cJSON_ParseWithLength(cs->body, cs->len) : NULL;
    const cJSON *content = root ? cJSON_GetObjectItemCaseSensitive(root, "content") : NULL;
    const cJSON *add = root ? cJSON_GetObjectItemCaseSensitive(root, "add_special") : NULL;
    const cJSON *special = root ? cJSON_GetObjectItemCaseSensitive(root, "parse_special") : NULL;
    if (!root || !cJSON_IsObject(root) || !cJSON_IsString(content) || (add && !cJSON_IsBool(add)) ||
        (special && !cJSON_IsBool(special))) {
        cJSON_Delete(root);
        return fail(srv, c, 400, "invalid_request_error", "invalid_value",
                    "expected {\"content\": string, \"add_special\"?: bool, \"parse_special\"?: bool}", REQ_STATUS_COUNT);
    }
    size_t len = strlen(content->valuestring);
    int cap = (int)(len + 16 < (1u << 28) ? len + 16 : (1u << 28)), n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    ellm_error err = {0};
    ellm_status st = ids ? ellm_tokenize(srv->model, content->valuestring, len, add && cJSON_IsTrue(add),
                                         !special || cJSON_IsTrue(special), ids, cap, &n, &err)
                         : ELLM_ERR_NOMEM;
    cJSON_Delete(root);
    if (st != ELLM_OK) {
        free(ids);
        return fail(srv, c, st == ELLM_ERR_NOMEM ? 500 : 400, "invalid_request_error", "invalid_value",
                    st == ELLM_ERR_NOMEM ? "out of memory" : err.msg, REQ_STATUS_COUNT);
    }
    cJSON *out = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(out, "tokens");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    free(ids);
    return send_json(c, 200, out);
}

static enum MHD_Result handle_detokenize(server *srv, struct MHD_Connection *c, conn_state *cs) {
    cJSON *root = cs->body ? cJSON_ParseWithLength(cs->body, cs->len) : NULL;
    const cJSON *tokens = root ? cJSON_GetObjectItemCaseSensitive(root, "tokens") : NULL;
    const int n_vocab = ellm_tokenizer_n_vocab(ellm_model_tokenizer(srv->model));
    int ok = cJSON_IsObject(root) && cJSON_IsArray(tokens);
    const cJSON *t;
    if (ok)
        cJSON_ArrayForEach(t, tokens) ok &= cJSON_IsNumber(t) && t->valuedouble >= 0 && t->valuedouble < n_vocab &&
                                            t->valuedouble == (double)(int)t->valuedouble;
    if (!ok) {
        cJSON_Delete(root);
        return fail(srv, c, 400, "invalid_request_error", "invalid_value",
                    "expected {\"tokens\": [token ids within the vocabulary]}", REQ_STATUS_COUNT);
    }
    const int n = cJSON_GetArraySize(tokens);
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    int k = 0;
    cJSON_ArrayForEach(t, tokens) if (ids) ids[k++] = (int32_t)t->valuedouble;
    cJSON_Delete(root);
    size_t len = 0;
    char *text = ids ? ids_text(srv->model, ids, n, &len) : NULL;
    free(ids);
    if (!text) return fail(srv, c, 500, "server_error", NULL, "out of memory", REQ_STATUS_COUNT);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "content", text);
    free(text);
    return send_json(c, 200, out);
}

static enum MHD_Result handle_models(server *srv, struct MHD_Connection *c) {
    ellm_model_info info;
    ellm_model_get_info(srv->model, &info);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data"), *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", srv->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "ellm");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddStringToObject(meta, "arch", info.arch);
    cJSON_AddNumberToObject(meta, "n_vocab", info.n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", info.n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_ctx", sched_n_ctx(srv->sched));
    cJSON_AddNumberToObject(meta, "n_params", (double)info.n_params);
    cJSON_AddNumberToObject(meta, "size", (double)info.weight_bytes);
    return send_json(c, 200, root);
}

/* ---- slot save / restore (llama.cpp's POST /slots/{id}?action=...) ------------------ */

/* A file name inside --slot-save-path: no folders, no "..", no hidden or
 * control characters, as llama.cpp's server validates it. */
static int slot_filename_ok(const char *f) {
    size_t n = strlen(f);
    if (n == 0 || n > 255 || f[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)f[i];
        if (ch < 0x20 || ch == 0x7f || ch == '/' || ch == '\\' || ch == ':') return 0;
    }
    return strstr(f, "..") == NULL;
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static enum MHD_Result handle_slot(server *srv, struct MHD_Connection *c, const char *url, conn_state *cs) {
    const char *ids = url + strlen("/slots/");
    char *end = NULL;
    long id = strtol(ids, &end, 10);
    if (!*ids || *end || id < 0 || id > 1000000)
        return fail(srv, c, 400, "invalid_request_error", "invalid_slot", "the slot id must be a non-negative integer",
                    REQ_STATUS_COUNT);
    if (!srv->p.slot_save_path)
        return fail(srv, c, 501, "not_supported_error", "not_supported",
                    "slot save/restore is off: start the server with --slot-save-path DIR", REQ_STATUS_COUNT);
    const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    int save = action && !strcmp(action, "save"), restore = action && !strcmp(action, "restore");
    if (!save && !restore)
        return fail(srv, c, 400, "invalid_request_error", "invalid_action", "action must be save or restore",
                    REQ_STATUS_COUNT);
    cJSON *body = cs->body ? cJSON_ParseWithLength(cs->body, cs->len) : NULL;
    const cJSON *fn = body ? cJSON_GetObjectItemCaseSensitive(body, "filename") : NULL;
    if (!cJSON_IsString(fn) || !slot_filename_ok(fn->valuestring)) {
        cJSON_Delete(body);
        return fail(srv, c, 400, "invalid_request_error", "invalid_filename",
                    "\"filename\" must be a plain file name inside the slot save folder (no '/', no '..')",
                    REQ_STATUS_COUNT);
    }
    char path[4096], name[256];
    snprintf(name, sizeof name, "%s", fn->valuestring);
    cJSON_Delete(body);
    if ((size_t)snprintf(path, sizeof path, "%s/%s", srv->p.slot_save_path, name) >= sizeof path)
        return fail(srv, c, 400, "invalid_request_error", "invalid_filename", "the file path is too long",
                    REQ_STATUS_COUNT);
    ellm_error err = {0};
    int n = 0;
    double t0 = mono_ms();
    slot_result r = save ? sched_slot_save(srv->sched, (int)id, path, &n, &err)
                         : sched_slot_restore(srv->sched, (int)id, path, &n, &err);
    double ms = mono_ms() - t0;
    if (r == SLOT_BAD_ID) return fail(srv, c, 400, "invalid_request_error", "invalid_slot", err.msg, REQ_STATUS_COUNT);
    if (r == SLOT_BUSY) return fail(srv, c, 409, "invalid_request_error", "slot_busy", err.msg, REQ_STATUS_COUNT);
    if (r != SLOT_OK)
        return fail(srv, c, save ? 500 : 400, save ? "server_error" : "invalid_request_error",
                    save ? "save_failed" : "restore_failed", err.msg, REQ_STATUS_COUNT);
    struct stat stt;
    double bytes = stat(path, &stt) == 0 ? (double)stt.st_size : 0;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "id_slot", (double)id);
    cJSON_AddStringToObject(root, "filename", name);
    cJSON_AddNumberToObject(root, save ? "n_saved" : "n_restored", n);
    cJSON_AddNumberToObject(root, save ? "n_written" : "n_read", bytes);
    cJSON *t = cJSON_AddObjectToObject(root, "timings");
    cJSON_AddNumberToObject(t, save ? "save_ms" : "restore_ms", ms);
    return send_json(c, 200, root);
}

/* ---- routing ---------------------------------------------------------------------- */

static route route_of(const char *method, const char *url, int *method_ok) {
    static const struct {
        const char *path, *method;
        route r;
    } table[] = {{"/v1/chat/completions", "POST", ROUTE_CHAT},
                 {"/chat/completions", "POST", ROUTE_CHAT},
                 {"/v1/completions", "POST", ROUTE_COMPLETIONS},
                 {"/completions", "POST", ROUTE_COMPLETIONS},
                 {"/v1/models", "GET", ROUTE_MODELS},
                 {"/models", "GET", ROUTE_MODELS},
                 {"/health", "GET", ROUTE_HEALTH},
                 {"/metrics", "GET", ROUTE_METRICS},
                 {"/tokenize", "POST", ROUTE_TOKENIZE},
                 {"/detokenize", "POST", ROUTE_DETOKENIZE},
                 {"/", "GET", ROUTE_UI},
                 {"/index.html", "GET", ROUTE_UI}};
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (!strcmp(url, table[i].path)) {
            *method_ok = !strcmp(method, table[i].method) || (!strcmp(method, "HEAD") && !strcmp(table[i].method, "GET"));
            return table[i].r;
        }
    if (!strncmp(url, "/slots/", 7)) {
        *method_ok = !strcmp(method, "POST");
        return ROUTE_SLOT;
    }
    *method_ok = 0;
    return ROUTE_NONE;
}

/* Constant-time comparison of the bearer token with the key. */
static int key_ok(struct MHD_Connection *c, const char *key) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t n = strlen(h), k = strlen(key);
    unsigned diff = n != k;
    for (size_t i = 0; i < k; i++) diff |= (unsigned)(unsigned char)key[i] ^ (unsigned)(unsigned char)(i < n ? h[i] : 0);
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    server *srv = cls;
    (void)version;
    conn_state *cs = *con_cls;
    if (!cs) { /* first call: headers only */
        if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
        *con_cls = cs;
        return MHD_YES;
    }
    if (*upload_size) { /* body data: keep up to the limit, then discard */
        if (!cs->too_large && cs->len + *upload_size > srv->p.max_body) {
            cs->too_large = 1;
            free(cs->body);
            cs->body = NULL;
            cs->len = cs->cap = 0;
        }
        if (!cs->too_large) {
            if (cs->len + *upload_size + 1 > cs->cap) {
                size_t cap = 2 * (cs->len + *upload_size) + 1;
                if (cap > srv->p.max_body + 1) cap = srv->p.max_body + 1;
                char *b = realloc(cs->body, cap);
                if (!b) return MHD_NO;
                cs->body = b;
                cs->cap = cap;
            }
            memcpy(cs->body + cs->len, upload, *upload_size);
            cs->len += *upload_size;
            cs->body[cs->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    int method_ok = 0;
    route r = route_of(method, url, &method_ok);
    if (r == ROUTE_NONE) return fail(srv, c, 404, "invalid_request_error", "not_found", "no such endpoint", REQ_STATUS_COUNT);
    if (!method_ok)
        return fail(srv, c, 405, "invalid_request_error", "method_not_allowed", "method not allowed for this endpoint",
                    REQ_STATUS_COUNT);
    if (cs->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body exceeds the limit of %zu bytes", srv->p.max_body);
        return fail(srv, c, 413, "invalid_request_error", "request_too_large", msg, REQ_STATUS_REJECTED);
    }
    if (r == ROUTE_UI) return send_body(c, 200, "text/html; charset=utf-8", strdup(ui_html), 0);
    if (r == ROUTE_HEALTH) {
        if (!atomic_load(&srv->ready))
            return fail(srv, c, 503, "unavailable_error", "loading", "Loading model", REQ_STATUS_COUNT);
        char why[700];
        if (sched_unavailable(srv->sched, why, sizeof why)) /* --mpi: a rank was lost */
            return fail(srv, c, 503, "unavailable_error", "mpi_rank_lost", why, REQ_STATUS_COUNT);
        cJSON *ok = cJSON_CreateObject();
        cJSON_AddStringToObject(ok, "status", "ok");
        return send_json(c, 200, ok);
    }
    if (r == ROUTE_METRICS) return send_body(c, 200, "text/plain; version=0.0.4", metrics_render(&srv->metrics), 0);
    if (srv->p.api_key && !key_ok(c, srv->p.api_key))
        return fail(srv, c, 401, "authentication_error", "invalid_api_key", "missing or wrong API key (Authorization: Bearer ...)",
                    r == ROUTE_CHAT || r == ROUTE_COMPLETIONS ? REQ_STATUS_REJECTED : REQ_STATUS_COUNT);
    if (!atomic_load(&srv->ready))
        return fail(srv, c, 503, "unavailable_error", "loading", "Loading model", REQ_STATUS_COUNT);
    switch (r) {
    case ROUTE_CHAT: return handle_generate(srv, c, REQ_CHAT, cs);
    case ROUTE_COMPLETIONS: return handle_generate(srv, c, REQ_COMPLETION, cs);
    case ROUTE_MODELS: return handle_models(srv, c);
    case ROUTE_TOKENIZE: return handle_tokenize(srv, c, cs);
    case ROUTE_DETOKENIZE: return handle_detokenize(srv, c, cs);
    case ROUTE_SLOT: return handle_slot(srv, c, url, cs);
    default: return MHD_NO;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *con_cls = NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int server_run(const server_params *params) {
    server *srv = calloc(1, sizeof *srv);
    if (!srv) return 1;
    srv->p = *params;
    srv->model_id = params->alias ? params->alias : base_name(params->model_path);
    metrics_init(&srv->metrics);
    atomic_store(&srv->next_id, 1);

    /* SIGTERM/SIGINT are taken by sigwait below; every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD;
    const char *host = !strcmp(params->host, "localhost") ? "127.0.0.1" : params->host;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&addr;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&addr;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)params->port);
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)params->port);
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "error: --host '%s' is not an IPv4 or IPv6 address\n", params->host);
        free(srv);
        return 2;
    }
    srv->daemon = MHD_start_daemon(flags, (uint16_t)params->port, NULL, NULL, on_request, srv,
                                   MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                   MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                   MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)params->timeout_s,
                                   MHD_OPTION_CONNECTION_LIMIT, (unsigned)512,
                                   MHD_OPTION_END);
    if (!srv->daemon) {
        fprintf(stderr, "error: cannot listen on %s:%d (address in use or not allowed)\n", params->host, params->port);
        free(srv);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : params->port;
    fprintf(stderr, "ellm serve: listening on http://%s:%d (loading %s)\n", params->host, port, params->model_path);

    int rc = 1;
    ellm_error err = {0};
    ellm_model_params mp = {.n_threads = params->n_threads, .pin_threads = ellm_mpi_local_size(params->mpi) <= 1,
                            .numa = params->numa_aware ? ELLM_NUMA_DISTRIBUTE : ELLM_NUMA_OFF,
                            .keep_layout = params->keep_layout, .rope = params->rope};
    if (ellm_model_load(params->model_path, &mp, &srv->model, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto out;
    }
    ellm_model_info info;
    ellm_model_get_info(srv->model, &info);
    srv->metrics.model_load_ms = info.load_ms;
    sched_params sp = {.n_slots = params->n_slots,
                       .n_batch = params->n_batch,
                       .chunk = params->chunk,
                       .n_ctx = params->n_ctx,
                       .kv_cache_gb = params->kv_cache_gb,
                       .kv_type = params->kv_type,
                       .n_threads = params->n_threads,
                       .max_queue = params->max_queue,
                       .sparse_topk = params->sparse_topk,
                       .sparse_profile = params->sparse_profile,
                       .spec = params->spec,
                       .draft_max = params->draft_max,
                       .draft_map = params->draft_map,
                       .mpi = params->mpi};
    if (sched_init(srv->model, &sp, &srv->metrics, &srv->sched, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto out;
    }
    srv->tools = tool_syntax_of(ellm_chat_template_source(srv->model, params->chat_template));
    atomic_store(&srv->ready, 1);
    ellm_model_info mi;
    ellm_model_get_info(srv->model, &mi);
    fprintf(stderr, "ellm serve: ready: %s, %d slots x %d tokens (%s KV), %d sequences per step%s%s; tool calls: %s\n",
            srv->model_id, params->n_slots, sched_n_ctx(srv->sched), ellm_kv_type_name(params->kv_type),
            params->n_batch > 0 ? params->n_batch : params->n_slots, mi.rope_scaling[0] ? ", RoPE " : "",
            mi.rope_scaling, srv->tools == TOOLS_NONE ? "not read (the chat template has no known syntax)"
                                                      : tool_syntax_name(srv->tools));
    if (sched_memory_note(srv->sched)[0]) fprintf(stderr, "ellm serve: warning: %s\n", sched_memory_note(srv->sched));
    char advice[320];
    if (ellm_model_context_advice(srv->model, sched_n_ctx(srv->sched), advice, sizeof advice))
        fprintf(stderr, "ellm serve: note: %s\n", advice);
    int sig = 0;
    sigset_t wait_sigs;
    sigemptyset(&wait_sigs);
    sigaddset(&wait_sigs, SIGTERM);
    sigaddset(&wait_sigs, SIGINT);
    sigwait(&wait_sigs, &sig);
    fprintf(stderr, "ellm serve: %s: draining running requests\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    atomic_store(&srv->draining, 1);
    sched_drain(srv->sched);
    rc = 0;
out:
    MHD_stop_daemon(srv->daemon); /* joins the connection threads */
    sched_free(srv->sched);
    ellm_model_free(srv->model);
    metrics_free(&srv->metrics);
    free(srv);
    if (rc == 0) fprintf(stderr, "ellm serve: stopped\n");
    return rc;
}
