/* Server metrics, rendered in the Prometheus text format (version 0.0.4).
 * Updated by the engine thread and the HTTP threads under the metrics' own
 * lock; every metric is always exported (0 while its feature is off). */
#ifndef ELLM_SERVER_METRICS_H
#define ELLM_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define METRICS_N_BUCKETS 14

typedef struct {
    uint64_t buckets[METRICS_N_BUCKETS]; /* cumulative counts for le = bounds[i] */
    uint64_t count;
    double sum;
} metrics_histogram;

/* Request outcomes counted in ellm_requests_total{status=...}. */
typedef enum {
    REQ_STATUS_OK,        /* finished: stop or length */
    REQ_STATUS_CANCELLED, /* the client went away */
    REQ_STATUS_REJECTED,  /* 4xx before generation */
    REQ_STATUS_OVERLOADED,/* 503: queue full or draining */
    REQ_STATUS_ERROR,     /* 5xx */
    REQ_STATUS_COUNT
} req_status;

/* Where the engine thread's time goes, per step (one batched forward pass and
 * what surrounds it), in ellm_engine_step_seconds_total{phase=...}. */
typedef enum {
    STEP_PHASE_SCHEDULE, /* cancellations, admission, KV pages, choosing the rows (lock held) */
    STEP_PHASE_FORWARD,  /* the batched forward pass */
    STEP_PHASE_SAMPLE,   /* sampling, detokenizing, stop strings (no lock) */
    STEP_PHASE_PUBLISH,  /* taking the lock, metrics, handing tokens to the streams */
    STEP_PHASE_SPEC,     /* speculative slots' draft and verify passes */
    STEP_PHASE_COUNT
} step_phase;

typedef struct {
    pthread_mutex_t mu;
    double model_load_ms;
    double mem_bandwidth_util;  /* bytes read per second over the last interval / measured bandwidth */
    double spec_acceptance_rate;
    double sparse_recall;
    uint64_t prompt_tokens_total;
    uint64_t generated_tokens_total;
    uint64_t requests_total[REQ_STATUS_COUNT];
    int requests_running;
    int requests_waiting;
    int kv_blocks_used;
    int kv_blocks_total;
    uint64_t engine_steps_total;    /* steps that ran a forward pass */
    uint64_t engine_rows_total;     /* token rows those passes computed (decode and prompt) */
    uint64_t engine_seqs_total;     /* sequences those passes fed (a pass feeds several) */
    double step_seconds[STEP_PHASE_COUNT];
    metrics_histogram ttft;        /* seconds */
    metrics_histogram inter_token; /* seconds */
} server_metrics;

void metrics_init(server_metrics *m);
void metrics_free(server_metrics *m);
/* Adds one observation (seconds) to h; caller holds m->mu. */
void metrics_observe(metrics_histogram *h, double seconds);
void metrics_count_request(server_metrics *m, req_status status);
/* Renders every metric; returns a malloc'ed NUL-terminated string (NULL if out of memory). */
char *metrics_render(server_metrics *m);

#endif
