/* The engine thread: slots, a bounded wait queue and continuous batching.
 *
 * HTTP threads never touch the engine. They submit a job (prompt tokens and
 * sampling parameters) and then wait on the job's condition variable, under
 * the scheduler lock, for text to appear or the job to finish. One engine
 * thread admits waiting jobs into free slots (reusing the longest common
 * prefix a slot's KV cache already holds), and each step runs one batched
 * forward pass: one token for every generating sequence plus a prefill chunk
 * of new prompts, each weight read once for all of them. */
#ifndef ELLM_SERVER_SCHED_H
#define ELLM_SERVER_SCHED_H

#include "ellm.h"
#include "server/logprobs.h"
#include "server/metrics.h"
#include "server/json_mask.h"
#include "server/request.h"

#include <pthread.h>

typedef struct {
    int n_slots;       /* sequences at once (--parallel) */
    int n_batch;       /* sequences per step (--n-batch) */
    int chunk;         /* prompt tokens per prefill pass (-b) */
    int n_ctx;         /* tokens per sequence (-c); 0: the model's training context */
    double kv_cache_gb; /* > 0: the KV pool of all slots together (else every slot's full context) */
    ellm_kv_type kv_type; /* element type of every slot's KV cache */
    int n_threads;     /* <= 0: the model's */
    int max_queue;     /* jobs waiting for a slot before 503 */
    int sparse_topk;
    const char *sparse_profile;
    /* Self-speculative decoding: each generating slot runs ellm_spec_step
     * (draft, verify in one pass of its own) instead of joining the batch's
     * one-token rows; greedy output is the same as without. */
    const char *spec;  /* drafter list, or NULL: off */
    int draft_max;     /* <= 0: the library's default */
    const char *draft_map;
    /* KV sharded over the ranks of an MPI job (`--mpi`; this is rank 0, the
     * others follow its passes: sched_mpi.h), or NULL. */
    ellm_mpi *mpi;
} sched_params;

typedef struct job job;
struct job {
    /* Set before sched_submit, read-only afterwards. */
    req_params p;
    int32_t *prompt;
    int n_prompt;
    ellm_sampler *sampler;
    double t_arrive; /* seconds, monotonic */
    /* Under the scheduler lock. */
    char *text;      /* emitted text: complete UTF-8, stop strings held back */
    size_t text_len, text_cap;
    /* One entry per generated token the stream may send, in order: the
     * length of `text` once that token is shown (a token that adds no text,
     * e.g. half a UTF-8 character or a possible stop-string prefix, repeats
     * the previous length), so a stream sends one chunk per token. Text past
     * the last entry (a flush at the end) goes with the final chunk. */
    size_t *tok_end;
    /* With p.logprobs, each of those tokens' log-probabilities (chosen.id < 0:
     * the end-of-generation token that stopped it, shown without any). */
    logprobs_token *lps;
    /* With p.echo and p.logprobs, each prompt token's (entry 0 has no
     * logprob: NAN); written by the engine thread before the job is done. */
    logprobs_token *prompt_lps;
    int n_tok, tok_cap;
    int n_gen;       /* completion tokens */
    int n_cached;    /* prompt tokens reused from the slot's KV cache */
    int done;
    const char *finish; /* "stop" or "length" when done; NULL if cancelled or failed */
    int failed;
    int unavailable; /* failed because the server lost an MPI rank (503, not 500) */
    char errmsg[512];
    int cancelled;
    int refs;        /* the HTTP side and the scheduler */
    int submitted;
    pthread_cond_t cv;
    /* Engine thread only. */
    int slot, n_fed, generating;
    int32_t last;
    ellm_detok dt;
    char *gen;       /* all generated text */
    size_t gen_len, gen_cap, gen_emitted;
    double t_last_token;
    float *prompt_rows; /* echo with logprobs: the logits of each row of its prompt chunk */
    json_state json;    /* p.json_mode: where the reply is in JSON's grammar */
    job *next;
};

typedef struct sched sched;

ellm_status sched_init(ellm_model *model, const sched_params *p, server_metrics *metrics, sched **out, ellm_error *err);
/* Stops the engine thread (after sched_drain for a clean stop) and frees everything. */
void sched_free(sched *s);
int sched_n_ctx(const sched *s);
/* Why the KV pool asked for (--kv-cache-gb) may not fit in memory, or "". */
const char *sched_memory_note(const sched *s);

/* A new job for `p` (taken over: zeroed in the caller) with its prompt
 * tokens (copied); NULL if out of memory. */
job *job_new(req_params *p, const int32_t *prompt, int n_prompt);

typedef enum { SUBMIT_OK, SUBMIT_QUEUE_FULL, SUBMIT_DRAINING, SUBMIT_BAD, SUBMIT_UNAVAILABLE } submit_result;
/* Queues the job; on failure the caller still owns it (job_release frees it).
 * SUBMIT_UNAVAILABLE: the server cannot generate any more (err says why: an
 * MPI rank was lost). */
submit_result sched_submit(sched *s, job *j, ellm_error *err);
/* The HTTP side is done with the job: cancels it if still running (its
 * sequence stops and its KV is freed within one step) and drops the reference. */
void sched_release(sched *s, job *j);
/* POST /slots/{id}?action=save|restore: an idle slot's KV cache and tokens
 * to or from a state file (ellm_context_state_save/load; the tokens are the
 * file's caller section), so a conversation's prefix can be reused after a
 * restart. SLOT_BUSY: the slot runs a request (or the KV pool cannot hold the
 * restored tokens now); SLOT_FAILED: the file could not be written or read
 * (err says why; a failed restore leaves the slot empty or as it was). */
typedef enum { SLOT_OK, SLOT_BAD_ID, SLOT_BUSY, SLOT_FAILED } slot_result;
slot_result sched_slot_save(sched *s, int id, const char *path, int *n_tokens, ellm_error *err);
slot_result sched_slot_restore(sched *s, int id, const char *path, int *n_tokens, ellm_error *err);

/* Waits (under the lock, which the caller holds) for news on the job, at most `ms`. */
void sched_wait(sched *s, job *j, int ms);
void sched_lock(sched *s);
void sched_unlock(sched *s);

/* 1 and why in msg if the server can no longer generate (an MPI rank was
 * lost: /health answers 503), else 0. */
int sched_unavailable(sched *s, char *msg, size_t cap);

/* Refuses new jobs and waits until every queued and running one has finished. */
void sched_drain(sched *s);

#endif
