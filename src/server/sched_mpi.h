/* The scheduler's engine steps on every rank of an MPI job (`ellm serve
 * --mpi`): the KV cache of each slot sharded over the ranks (dist/).
 *
 * Rank 0 serves HTTP and runs the scheduler (sched.c) as without MPI; the
 * other ranks (followers) hold the same slots' contexts over the same KV
 * pool size and run every pass rank 0 runs, in the same order, so the
 * per-layer exchanges of each pass line up. Before each pass rank 0
 * broadcasts its plan: every slot's KV length (a follower truncates a slot
 * that rank 0 cut since the last pass -- a cancelled request, prefix reuse,
 * pages taken back from an idle slot -- so the pools stay alike), then the
 * slots of the pass with their tokens. Followers do not sample: the logits
 * of a pass are the same on every rank and rank 0 draws the tokens.
 *
 * While idle, rank 0 sends a heartbeat each second that every rank answers,
 * so a lost rank is noticed within the timeout even without traffic. A
 * collective that fails (MPI error, or no answer within --mpi-timeout)
 * marks the job lost: rank 0 stops running passes and reports the message
 * (/health, failed requests); a follower prints why and exits. */
#ifndef ELLM_SERVER_SCHED_MPI_H
#define ELLM_SERVER_SCHED_MPI_H

#include "ellm.h"
#include "server/server.h"

typedef struct sched_mpi sched_mpi;

/* What a follower needs to build contexts like rank 0's (rank 0's values:
 * its KV pool may have been sized from its own free memory). */
typedef struct {
    int32_t n_slots;     /* contexts, one per slot */
    int32_t max_rows;    /* rows of one batched pass (ellm_batch_init) */
    int32_t n_ctx;       /* tokens per context */
    int32_t ctx_batch;   /* a context's n_batch (the prefill chunk) */
    int32_t sparse_topk; /* ellm_context_params.sparse_topk */
    int32_t reserved;
    double pool_gb;      /* the KV pool every slot draws from */
} sched_mpi_setup;

/* Rank 0: sends the setup and waits until every follower has built its
 * contexts (ctxs: rank 0's n_slots slot contexts, slot order). */
ellm_status sched_mpi_leader_init(ellm_mpi *mpi, const sched_mpi_setup *setup, ellm_context *const *ctxs,
                                  sched_mpi **out, ellm_error *err);
/* Rank 0: ellm_decode_batch of the scheduler's pass, after sending its plan
 * (ctxs are slot contexts given at init). */
ellm_status sched_mpi_decode_batch(sched_mpi *m, ellm_batch *b, ellm_context *const *ctxs,
                                   const int32_t *const *tokens, const int *n_tokens, int n_seq, ellm_error *err);
/* Rank 0, idle: the heartbeat (at most one per `every_s` seconds). */
void sched_mpi_ping(sched_mpi *m, double every_s);
/* NULL, or why the job lost a rank (engine thread). */
const char *sched_mpi_lost(const sched_mpi *m);
/* Rank 0: tells the followers to stop (unless the job is lost) and frees. */
void sched_mpi_free(sched_mpi *m);

/* A follower rank of `ellm serve --mpi`: loads p->model_path, builds the
 * contexts rank 0 describes, runs rank 0's passes until it says stop.
 * Returns the exit status (non-zero after printing why it stopped). */
int sched_mpi_follow(ellm_mpi *mpi, const server_params *p);

#endif
