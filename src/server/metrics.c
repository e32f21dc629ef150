/* Prometheus text rendering of the server metrics. */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Histogram bounds in seconds: from 1 ms (an inter-token gap of a small
 * model) to 60 s (time to first token behind a long queue). */
static const double bounds[METRICS_N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                 0.25,  0.5,    1,     2.5,  5,     10,  60};

static const char *status_names[REQ_STATUS_COUNT] = {"ok", "cancelled", "rejected", "overloaded", "error"};
static const char *phase_names[STEP_PHASE_COUNT] = {"schedule", "forward", "sample", "publish", "spec"};

void metrics_init(server_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void metrics_free(server_metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_observe(metrics_histogram *h, double s) {
    for (int i = 0; i < METRICS_N_BUCKETS; i++)
        if (s <= bounds[i]) h->buckets[i]++;
    h->count++;
    h->sum += s;
}

void metrics_count_request(server_metrics *m, req_status status) {
    pthread_mutex_lock(&m->mu);
    m->requests_total[status]++;
    pthread_mutex_unlock(&m->mu);
}

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = 2 * b->cap + (size_t)n;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->oom = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
}

static void gauge(sbuf *b, const char *name, const char *help, double v) {
    put(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

static void counter(sbuf *b, const char *name, const char *help, double v) {
    put(b, "# HELP %s %s\n# TYPE %s counter\n%s %.17g\n", name, help, name, name, v);
}

static void histogram(sbuf *b, const char *name, const char *help, const metrics_histogram *h) {
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < METRICS_N_BUCKETS; i++)
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)h->buckets[i]);
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)h->count, name, h->sum,
        name, (unsigned long long)h->count);
}

char *metrics_render(server_metrics *m) {
    sbuf b = {malloc(8192), 0, 8192, 0};
    if (!b.buf) return NULL;
    pthread_mutex_lock(&m->mu);
    gauge(&b, "ellm_model_load_ms", "Time to load the model, in milliseconds.", m->model_load_ms);
    gauge(&b, "ellm_mem_bandwidth_util",
          "Bytes the engine read per second over the last interval divided by the read bandwidth measured at start.",
          m->mem_bandwidth_util);
    gauge(&b, "ellm_spec_acceptance_rate", "Accepted draft tokens over drafted tokens (0 without speculation).",
          m->spec_acceptance_rate);
    gauge(&b, "ellm_sparse_recall",
          "Mean sampled attention mass inside the blocks sparse attention chose (0 without sparse attention).",
          m->sparse_recall);
    counter(&b, "ellm_prompt_tokens_total", "Prompt tokens of finished requests.", (double)m->prompt_tokens_total);
    counter(&b, "ellm_generated_tokens_total", "Tokens generated.", (double)m->generated_tokens_total);
    put(&b, "# HELP ellm_requests_total Requests by outcome (a request with n choices or several prompts counts each sequence).\n# TYPE ellm_requests_total counter\n");
    for (int i = 0; i < REQ_STATUS_COUNT; i++)
        put(&b, "ellm_requests_total{status=\"%s\"} %llu\n", status_names[i], (unsigned long long)m->requests_total[i]);
    gauge(&b, "ellm_requests_running", "Requests holding a slot.", m->requests_running);
    gauge(&b, "ellm_requests_waiting", "Requests queued for a slot or KV memory.", m->requests_waiting);
    gauge(&b, "ellm_kv_blocks_used", "KV cache blocks in use (held by sequences).", m->kv_blocks_used);
    gauge(&b, "ellm_kv_blocks_total", "KV cache blocks in the pool.", m->kv_blocks_total);
    counter(&b, "ellm_engine_steps_total", "Engine steps (batched forward passes of running sequences).",
            (double)m->engine_steps_total);
    counter(&b, "ellm_engine_rows_total", "Token rows those passes computed: one per decoding sequence plus prompt tokens.",
            (double)m->engine_rows_total);
    counter(&b, "ellm_engine_sequences_total", "Sequences those passes fed (each pass feeds every running one).",
            (double)m->engine_seqs_total);
    put(&b, "# HELP ellm_engine_step_seconds_total Engine thread time in steps, by phase.\n"
            "# TYPE ellm_engine_step_seconds_total counter\n");
    for (int i = 0; i < STEP_PHASE_COUNT; i++)
        put(&b, "ellm_engine_step_seconds_total{phase=\"%s\"} %.9g\n", phase_names[i], m->step_seconds[i]);
    histogram(&b, "ellm_time_to_first_token_seconds", "Time from a request's arrival to its first generated token.",
              &m->ttft);
    histogram(&b, "ellm_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.",
              &m->inter_token);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.buf);
        return NULL;
    }
    return b.buf;
}
