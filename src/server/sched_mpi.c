/* The scheduler's passes on every rank of an MPI job (see sched_mpi.h). */
#include "server/sched_mpi.h"
#include "core/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A plan is one broadcast of int32: a header, every slot's KV length before
 * the pass, the pass's slots and token counts, then its tokens (stacked in
 * slot order of the pass). Fixed size, so one broadcast carries it. */
enum { PLAN_STEP = 1, PLAN_PING = 2, PLAN_STOP = 3 };
enum { H_KIND, H_NSEQ, H_NROWS, H_LEN };

struct sched_mpi {
    ellm_mpi *mpi;
    sched_mpi_setup setup;
    ellm_context **ctxs; /* (n_slots) rank 0's slot contexts */
    int32_t *plan;       /* (plan_len) */
    size_t plan_len;
    double last_ping;    /* seconds, monotonic */
    char lost[640];      /* why the job lost a rank, beyond a failed collective */
};

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t plan_ints(const sched_mpi_setup *su) {
    return (size_t)H_LEN + 3 * (size_t)su->n_slots + (size_t)su->max_rows;
}
static int32_t *plan_pos(sched_mpi *m) { return m->plan + H_LEN; }
static int32_t *plan_slot(sched_mpi *m) { return m->plan + H_LEN + m->setup.n_slots; }
static int32_t *plan_n(sched_mpi *m) { return m->plan + H_LEN + 2 * (size_t)m->setup.n_slots; }
static int32_t *plan_tok(sched_mpi *m) { return m->plan + H_LEN + 3 * (size_t)m->setup.n_slots; }

static ellm_status send_plan(sched_mpi *m, int kind, ellm_error *err) {
    m->plan[H_KIND] = kind;
    return ellm_mpi_bcast(m->mpi, m->plan, m->plan_len * sizeof *m->plan, err);
}

ellm_status sched_mpi_leader_init(ellm_mpi *mpi, const sched_mpi_setup *setup, ellm_context *const *ctxs,
                                  sched_mpi **out, ellm_error *err) {
    *out = NULL;
    sched_mpi *m = calloc(1, sizeof *m);
    if (!m) return ellm_fail(err, ELLM_ERR_NOMEM, "--mpi: out of memory");
    m->mpi = mpi;
    m->setup = *setup;
    m->plan_len = plan_ints(setup);
    m->plan = calloc(m->plan_len, sizeof *m->plan);
    m->ctxs = malloc((size_t)setup->n_slots * sizeof *m->ctxs);
    if (!m->plan || !m->ctxs) {
        sched_mpi_free(m);
        return ellm_fail(err, ELLM_ERR_NOMEM, "--mpi: out of memory");
    }
    memcpy(m->ctxs, ctxs, (size_t)setup->n_slots * sizeof *m->ctxs);
    sched_mpi_setup su = *setup;
    int all = 0;
    ellm_status st = ellm_mpi_bcast(mpi, &su, sizeof su, err);
    if (st == ELLM_OK) st = ellm_mpi_agree(mpi, 1, &all, err);
    if (st == ELLM_OK && !all)
        st = ellm_fail(err, ELLM_ERR_IO,
                       "--mpi: a follower rank could not build the slots' contexts (its standard error says why)");
    if (st != ELLM_OK) {
        free(m->plan);
        free(m->ctxs);
        free(m);
        return st;
    }
    m->last_ping = mono_s();
    *out = m;
    return ELLM_OK;
}

const char *sched_mpi_lost(const sched_mpi *m) {
    if (!m) return NULL;
    if (m->lost[0]) return m->lost;
    return ellm_mpi_failed(m->mpi);
}

ellm_status sched_mpi_decode_batch(sched_mpi *m, ellm_batch *b, ellm_context *const *ctxs,
                                   const int32_t *const *tokens, const int *n_tokens, int n_seq, ellm_error *err) {
    if (!m) return ellm_decode_batch(b, ctxs, tokens, n_tokens, n_seq, err);
    if (sched_mpi_lost(m)) return ellm_fail(err, ELLM_ERR_IO, "%s", sched_mpi_lost(m));
    const sched_mpi_setup *su = &m->setup;
    long rows = 0;
    for (int k = 0; k < n_seq; k++) rows += n_tokens[k];
    if (n_seq > su->n_slots || rows > su->max_rows)
        return ellm_fail(err, ELLM_ERR_ARG, "--mpi: a pass of %d sequences, %ld rows exceeds the plan's %d, %d", n_seq,
                         rows, su->n_slots, su->max_rows);
    for (int i = 0; i < su->n_slots; i++) plan_pos(m)[i] = ellm_context_pos(m->ctxs[i]);
    int32_t *tok = plan_tok(m);
    for (int k = 0; k < n_seq; k++) {
        int slot = -1;
        for (int i = 0; i < su->n_slots && slot < 0; i++)
            if (m->ctxs[i] == ctxs[k]) slot = i;
        if (slot < 0) return ellm_fail(err, ELLM_ERR_ARG, "--mpi: sequence %d is not a slot's context", k);
        plan_slot(m)[k] = slot;
        plan_n(m)[k] = n_tokens[k];
        memcpy(tok, tokens[k], (size_t)n_tokens[k] * sizeof *tok);
        tok += n_tokens[k];
    }
    m->plan[H_NSEQ] = n_seq;
    m->plan[H_NROWS] = (int32_t)rows;
    ellm_status st = send_plan(m, PLAN_STEP, err);
    if (st != ELLM_OK) return st;
    m->last_ping = mono_s(); /* a pass shows every rank alive as well */
    return ellm_decode_batch(b, ctxs, tokens, n_tokens, n_seq, err);
}

void sched_mpi_ping(sched_mpi *m, double every_s) {
    if (!m || sched_mpi_lost(m)) return;
    double now = mono_s();
    if (now - m->last_ping < every_s) return;
    m->last_ping = now;
    ellm_error err = {0};
    int all = 0;
    if (send_plan(m, PLAN_PING, &err) == ELLM_OK) ellm_mpi_agree(m->mpi, 1, &all, &err);
}

void sched_mpi_free(sched_mpi *m) {
    if (!m) return;
    ellm_error err = {0};
    if (m->plan && !sched_mpi_lost(m)) send_plan(m, PLAN_STOP, &err);
    free(m->plan);
    free(m->ctxs);
    free(m);
}

/* ---- followers ----------------------------------------------------------------- */

typedef struct {
    ellm_model *model;
    ellm_kv_pool *pool;
    ellm_batch *batch;
    ellm_context **ctxs;
    int n_slots;
} follower;

static void follower_free(follower *f) {
    for (int i = 0; f->ctxs && i < f->n_slots; i++) ellm_context_free(f->ctxs[i]);
    free(f->ctxs);
    ellm_batch_free(f->batch);
    ellm_kv_pool_free(f->pool);
    ellm_model_free(f->model);
}

/* The contexts rank 0's setup describes, built as sched_init builds its own. */
static ellm_status follower_build(follower *f, ellm_mpi *mpi, const server_params *p, const sched_mpi_setup *su,
                                  ellm_error *err) {
    if (su->n_slots < 1 || su->n_slots > 4096 || su->max_rows < 1 || su->n_ctx < 1 || su->ctx_batch < 1 ||
        !(su->pool_gb > 0))
        return ellm_fail(err, ELLM_ERR_ARG, "rank 0 sent a setup out of range (%d slots, %d rows, %d tokens)",
                         su->n_slots, su->max_rows, su->n_ctx);
    ellm_status st = ellm_kv_pool_init(f->model, p->kv_type, su->pool_gb, &f->pool, err);
    if (st == ELLM_OK) st = ellm_batch_init(f->model, p->n_threads, su->max_rows, &f->batch, err);
    if (st != ELLM_OK) return st;
    f->n_slots = su->n_slots;
    if (!(f->ctxs = calloc((size_t)su->n_slots, sizeof *f->ctxs)))
        return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = su->n_ctx;
    cp.n_batch = su->ctx_batch;
    cp.kv_pool = f->pool;
    cp.kv_type = p->kv_type; /* every rank parsed the same --kv-type */
    cp.sparse_topk = su->sparse_topk;
    cp.sparse_recall_every = 0;
    cp.mpi = mpi;
    for (int i = 0; i < su->n_slots && st == ELLM_OK; i++) {
        st = ellm_batch_context_init(f->batch, &cp, &f->ctxs[i], err);
        if (st == ELLM_OK && p->sparse_profile)
            st = ellm_context_load_sparse_profile(f->ctxs[i], p->sparse_profile, err);
    }
    return st;
}

/* One pass of rank 0's plan: the slots rank 0 cut since the last pass are
 * cut alike, then the same ellm_decode_batch. */
static ellm_status follower_step(follower *f, sched_mpi *m, ellm_error *err) {
    const int n_seq = m->plan[H_NSEQ];
    if (n_seq < 1 || n_seq > f->n_slots || m->plan[H_NROWS] < 1 || m->plan[H_NROWS] > m->setup.max_rows)
        return ellm_fail(err, ELLM_ERR_ARG, "rank 0 sent a pass of %d sequences, %d rows", n_seq, m->plan[H_NROWS]);
    for (int i = 0; i < f->n_slots; i++) {
        int have = ellm_context_pos(f->ctxs[i]), want = plan_pos(m)[i];
        if (want > have)
            return ellm_fail(err, ELLM_ERR_ARG, "slot %d holds %d tokens here and %d on rank 0 (out of step)", i, have,
                             want);
        if (want < have && ellm_context_truncate(f->ctxs[i], want) != ELLM_OK)
            return ellm_fail(err, ELLM_ERR_ARG, "slot %d: cannot cut its KV from %d to %d tokens", i, have, want);
    }
    ellm_context *ctxs[n_seq];
    const int32_t *toks[n_seq];
    int ns[n_seq];
    const int32_t *tok = plan_tok(m);
    long rows = 0;
    for (int k = 0; k < n_seq; k++) {
        int slot = plan_slot(m)[k];
        ns[k] = plan_n(m)[k];
        if (slot < 0 || slot >= f->n_slots || ns[k] < 1 || rows + ns[k] > m->plan[H_NROWS])
            return ellm_fail(err, ELLM_ERR_ARG, "rank 0 sent a bad pass (sequence %d: slot %d, %d tokens)", k, slot,
                             ns[k]);
        ctxs[k] = f->ctxs[slot];
        toks[k] = tok + rows;
        rows += ns[k];
    }
    return ellm_decode_batch(f->batch, ctxs, toks, ns, n_seq, err);
}

int sched_mpi_follow(ellm_mpi *mpi, const server_params *p) {
    const int rank = ellm_mpi_rank(mpi), size = ellm_mpi_size(mpi);
    ellm_error err = {0};
    follower f = {0};
    sched_mpi m = {.mpi = mpi};
    ellm_model_params mp = {.n_threads = p->n_threads, .pin_threads = ellm_mpi_local_size(mpi) <= 1,
                            .numa = p->numa_aware ? ELLM_NUMA_DISTRIBUTE : ELLM_NUMA_OFF,
                            .keep_layout = p->keep_layout, .rope = p->rope};
    ellm_status st = ellm_model_load(p->model_path, &mp, &f.model, &err);
    if (st != ELLM_OK) {
        /* rank 0 loads the same file and stops the job on the same error */
        fprintf(stderr, "ellm serve: MPI rank %d of %d: %s\n", rank, size, err.msg);
        follower_free(&f);
        return 1;
    }
    if ((st = ellm_mpi_bcast(mpi, &m.setup, sizeof m.setup, &err)) != ELLM_OK) {
        fprintf(stderr, "ellm serve: MPI rank %d of %d: no setup from rank 0: %s\n", rank, size, err.msg);
        follower_free(&f);
        return 1;
    }
    ellm_error berr = {0};
    ellm_status bst = follower_build(&f, mpi, p, &m.setup, &berr);
    m.plan_len = plan_ints(&m.setup);
    if (bst == ELLM_OK && !(m.plan = calloc(m.plan_len, sizeof *m.plan))) bst = ELLM_ERR_NOMEM;
    if (bst != ELLM_OK)
        fprintf(stderr, "ellm serve: MPI rank %d of %d: cannot build the slots' contexts: %s\n", rank, size,
                berr.msg[0] ? berr.msg : "out of memory");
    int all = 0;
    if ((st = ellm_mpi_agree(mpi, bst == ELLM_OK, &all, &err)) != ELLM_OK || !all) {
        if (st != ELLM_OK) fprintf(stderr, "ellm serve: MPI rank %d of %d: %s\n", rank, size, err.msg);
        free(m.plan);
        follower_free(&f);
        return 1;
    }
    fprintf(stderr, "ellm serve: MPI rank %d of %d (pid %d): following rank 0 (%d slots x %d tokens)\n", rank, size,
            (int)getpid(), m.setup.n_slots, m.setup.n_ctx);
    int rc = 0;
    for (;;) {
        if ((st = ellm_mpi_bcast(mpi, m.plan, m.plan_len * sizeof *m.plan, &err)) != ELLM_OK) {
            fprintf(stderr, "ellm serve: MPI rank %d of %d: rank 0 is gone or hangs: %s; stopping\n", rank, size,
                    err.msg);
            rc = 1;
            break;
        }
        const int kind = m.plan[H_KIND];
        if (kind == PLAN_STOP) break;
        if (kind == PLAN_PING) st = ellm_mpi_agree(mpi, 1, &all, &err);
        else if (kind == PLAN_STEP) st = follower_step(&f, &m, &err);
        else st = ellm_fail(&err, ELLM_ERR_ARG, "rank 0 sent a plan of unknown kind %d", kind);
        if (st != ELLM_OK) {
            fprintf(stderr, "ellm serve: MPI rank %d of %d: %s; stopping\n", rank, size, err.msg);
            rc = 1;
            break;
        }
    }
    free(m.plan);
    follower_free(&f);
    if (rc == 0) fprintf(stderr, "ellm serve: MPI rank %d of %d: stopped\n", rank, size);
    return rc;
}
