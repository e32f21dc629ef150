/* `ellm serve`: an OpenAI-compatible HTTP server (libmicrohttpd) over the
 * scheduler in sched.h. */
#ifndef ELLM_SERVER_SERVER_H
#define ELLM_SERVER_SERVER_H

#include "ellm.h"

#include <stddef.h>

typedef struct {
    const char *model_path;
    const char *host;          /* default 127.0.0.1 */
    int port;                  /* 0: any free port (printed at start) */
    int n_slots;               /* --parallel */
    int n_batch;               /* sequences per step; 0: n_slots */
    int chunk;                 /* prompt tokens per prefill pass */
    int n_threads;
    int n_ctx;                 /* per sequence; 0: the model's training context */
    double kv_cache_gb;        /* 0: every slot's full context */
    ellm_kv_type kv_type;      /* of every slot's cache (--kv-type; default F16) */
    int sparse_topk;
    const char *sparse_profile;
    const char *spec;          /* --spec drafter list (self-speculative decoding per slot), or NULL */
    int draft_max;             /* --draft-max: tokens drafted per verify pass at most */
    const char *draft_map;     /* --draft-map: maps for shallow:K drafters, or NULL */
    const char *api_key;       /* NULL: no key needed */
    const char *chat_template; /* built-in template name, or NULL: the model's */
    const char *alias;         /* model id reported; NULL: the file name */
    int numa_aware;
    int keep_layout; /* ellm_model_params.keep_layout */
    ellm_rope_params rope;     /* ellm_model_params.rope: --rope-scaling, --rope-scale, ... */
    int max_queue;             /* requests waiting beyond the slots before 503 */
    size_t max_body;           /* bytes; larger bodies get 413 */
    int timeout_s;             /* idle connection timeout */
    const char *slot_save_path; /* folder of POST /slots/{id}?action=save|restore files; NULL: off */
    struct ellm_mpi *mpi;      /* --mpi on rank 0: KV sharded over the job's ranks (sched_mpi.h); NULL: off */
} server_params;

void server_default_params(server_params *p);
/* Serves until SIGTERM or SIGINT, then drains running requests and returns
 * the process exit status. Prints the address it listens on to stderr. */
int server_run(const server_params *p);

#endif
