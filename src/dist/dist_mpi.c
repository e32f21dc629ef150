/* The MPI side of KV sharding: the ellm_mpi handle (ellm.h), part ownership,
 * and the per-layer exchange of partial attention states (dist.h). */
#include "dist/dist.h"
#include "core/median.h"
#include "core/status.h"
#include "core/timer.h"

#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ellm_mpi {
    MPI_Comm comm;    /* a duplicate of MPI_COMM_WORLD that returns errors */
    int rank, size;
    int local_size;   /* ranks of the job on this rank's machine (shared memory) */
    double timeout_s; /* longest wait for the other ranks in one collective */
    /* The first failed collective of any user of the handle (every context's
     * shard, the commands' broadcasts): after it no collective waits again,
     * since a request of the failed one is left pending and the ranks no
     * longer run in step. Written by the thread that talks to MPI. */
    char failed[600];
};

struct dist_shard {
    ellm_mpi *mpi;
    int block_tokens, part_tokens, head_dim;
    float *rec;      /* this rank's records of a call (attention_forward_parts) */
    size_t rec_cap;  /* floats */
    float **own;     /* (max_rec) this rank's records in rec, NULL for the others' */
    long max_rec;
    /* Per query row of a call (token-major, then query head; up to max_q x
     * n_head rows): one record of rec_len int64 (rec_* below), reduced over
     * the ranks by lse_op in one all-reduce. */
    int64_t *rec_rows;
    MPI_Datatype rec_type; /* one record: rec_len int64 */
    MPI_Op lse_op;
    int types_made;
    char failed[600];
    /* Fault injection for tests (ELLM_MPI_FAULT=exit|hang,RANK,N): rank
     * fault_rank exits or hangs at its N-th exchange. */
    int fault_kind, fault_rank; /* kind 0: none, 1: exit, 2: hang */
    long fault_at;
    dist_stats stats;
};

/* Message of an MPI error code. */
static const char *mpi_msg(int code, char *buf) {
    int len = 0;
    if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", code);
    return buf;
}

/* Waits for `req` at most the handle's timeout. Returns MPI_SUCCESS, an MPI
 * error code, or -1 on timeout (the request is then left pending: the job is
 * about to be stopped). Yields while waiting, since on an oversubscribed
 * machine the ranks being waited for may need this core. A control message
 * (`idle`: a broadcast or agreement that may come only after a long pause,
 * as a server's next step does) is polled every 200 us after the first
 * millisecond instead, so a rank waiting for work does not hold a core. */
static int wait_deadline_idle(const ellm_mpi *mpi, MPI_Request *req, int idle) {
    const uint64_t start = ellm_time_ns(), deadline = start + (uint64_t)(mpi->timeout_s * 1e9);
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return rc;
        if (done) return MPI_SUCCESS;
        uint64_t now = ellm_time_ns();
        if (now > deadline) return -1;
        if (idle && now - start > 1000000) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        } else {
            sched_yield();
        }
    }
}

static int wait_deadline(const ellm_mpi *mpi, MPI_Request *req) { return wait_deadline_idle(mpi, req, 0); }

/* An error message for a failed collective `what`, kept as the handle's
 * first failure. */
static ellm_status collective_fail(ellm_mpi *mpi, int rc, const char *what, ellm_error *err) {
    char buf[MPI_MAX_ERROR_STRING];
    ellm_error e;
    if (!err) err = &e;
    ellm_status st;
    if (rc == -1)
        st = ellm_fail(err, ELLM_ERR_IO,
                       "MPI rank %d of %d: %s: no answer from the other ranks within %.0f s "
                       "(a rank died, hangs or runs different inputs)",
                       mpi->rank, mpi->size, what, mpi->timeout_s);
    else
        st = ellm_fail(err, ELLM_ERR_IO, "MPI rank %d of %d: %s failed: %s", mpi->rank, mpi->size, what,
                       mpi_msg(rc, buf));
    if (!mpi->failed[0]) snprintf(mpi->failed, sizeof mpi->failed, "%s", err->msg);
    return st;
}

/* A collective after a failed one: refused at once (see ellm_mpi.failed). */
static ellm_status refuse_after_failure(const ellm_mpi *mpi, ellm_error *err) {
    return ellm_fail(err, ELLM_ERR_IO, "%s", mpi->failed);
}

const char *ellm_mpi_failed(const ellm_mpi *mpi) { return mpi && mpi->failed[0] ? mpi->failed : NULL; }

ellm_status ellm_mpi_init(int *argc, char ***argv, double timeout_s, ellm_mpi **out, ellm_error *err) {
    *out = NULL;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    /* One thread at a time talks to MPI (the thread pool never does); it need
     * not be the one that started it: a server's engine thread runs the
     * collectives, its main thread sets up and ends. */
    if (!inited && MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return ellm_fail(err, ELLM_ERR_IO, "MPI: MPI_Init_thread failed (is this run under mpirun?)");
    ellm_mpi *mpi = calloc(1, sizeof *mpi);
    if (!mpi) return ellm_fail(err, ELLM_ERR_NOMEM, "MPI: out of memory");
    mpi->timeout_s = timeout_s > 0 ? timeout_s : 300;
    char buf[MPI_MAX_ERROR_STRING];
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &mpi->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(mpi->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(mpi->comm, &mpi->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mpi->comm, &mpi->size);
    MPI_Comm local;
    if (rc == MPI_SUCCESS) rc = MPI_Comm_split_type(mpi->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Comm_size(local, &mpi->local_size);
        MPI_Comm_free(&local);
    }
    if (rc != MPI_SUCCESS) {
        free(mpi);
        return ellm_fail(err, ELLM_ERR_IO, "MPI: cannot set up the communicator: %s", mpi_msg(rc, buf));
    }
    *out = mpi;
    return ELLM_OK;
}

int ellm_mpi_rank(const ellm_mpi *mpi) { return mpi ? mpi->rank : 0; }
int ellm_mpi_size(const ellm_mpi *mpi) { return mpi ? mpi->size : 1; }
int ellm_mpi_local_size(const ellm_mpi *mpi) { return mpi ? mpi->local_size : 1; }

ellm_status ellm_mpi_bcast(ellm_mpi *mpi, void *buf, size_t bytes, ellm_error *err) {
    if (bytes > INT_MAX) return ellm_fail(err, ELLM_ERR_ARG, "MPI: broadcast of %zu bytes is too large", bytes);
    if (mpi->failed[0]) return refuse_after_failure(mpi, err);
    MPI_Request req;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, mpi->comm, &req);
    if (rc == MPI_SUCCESS) rc = wait_deadline_idle(mpi, &req, 1);
    return rc == MPI_SUCCESS ? ELLM_OK : collective_fail(mpi, rc, mpi->rank ? "waiting for rank 0's broadcast" : "broadcast", err);
}

ellm_status ellm_mpi_agree(ellm_mpi *mpi, int ok, int *all_ok, ellm_error *err) {
    *all_ok = 0;
    if (mpi->failed[0]) return refuse_after_failure(mpi, err);
    MPI_Request req;
    int in = ok != 0;
    int rc = MPI_Iallreduce(&in, all_ok, 1, MPI_INT, MPI_MIN, mpi->comm, &req);
    if (rc == MPI_SUCCESS) rc = wait_deadline_idle(mpi, &req, 1);
    return rc == MPI_SUCCESS ? ELLM_OK : collective_fail(mpi, rc, "agreement", err);
}

/* ---- a query row's record in the exchange ----------------------------------
 *
 * int64: [0] head_dim, [1..4] the merge's bound (attention_lse_bound: top
 * bins of acc and l, last and minus first part with keys), then the binned
 * sums (ATTENTION_LSE_SUMS(hd), on the bins of the bound), then the float
 * bits of acc / l of the rank's one part with keys for the row, two to an
 * int64 (used only if the whole row saw one part; zeros elsewhere). The
 * ranks' records merge in one all-reduce with lse_op: bounds by max, sums
 * moved to the higher bins and added (exact, any grouping), bits added. */
enum { REC_HD, REC_BOUND, REC_SUMS = REC_BOUND + 4 };
static size_t rec_len(int hd) { return REC_SUMS + ATTENTION_LSE_SUMS(hd) + (size_t)(hd + 1) / 2; }
static int64_t *rec_one(int64_t *rec, int hd) { return rec + REC_SUMS + ATTENTION_LSE_SUMS(hd); }

static void rec_bound(const int64_t *rec, attention_lse_bound *b) { memcpy(b, rec + REC_BOUND, sizeof *b); }
_Static_assert(sizeof(attention_lse_bound) == 4 * sizeof(int64_t), "a bound is 4 int64");

/* A record of no part (the neutral element of lse_op). */
static void rec_empty(int64_t *rec, int hd) {
    memset(rec, 0, rec_len(hd) * sizeof *rec);
    rec[REC_HD] = hd;
    attention_lse_bound b;
    attention_lse_bound_init(&b);
    memcpy(rec + REC_BOUND, &b, sizeof b);
}

/* inout = in (+) inout, record by record (MPI_User_function). */
static void lse_combine(void *in, void *inout, int *len, MPI_Datatype *type) {
    int bytes = 0;
    MPI_Type_size(*type, &bytes);
    const size_t n = (size_t)bytes / sizeof(int64_t);
    const int64_t *a = in;
    int64_t *b = inout;
    for (int r = 0; r < *len; r++, a += n, b += n) {
        const int hd = (int)b[REC_HD];
        attention_lse_bound ba, bb, both;
        rec_bound(a, &ba);
        rec_bound(b, &bb);
        both = bb;
        attention_lse_bound_merge(&both, &ba);
        attention_lse_grid ga, gb, g;
        attention_lse_grid_init(&ga, &ba);
        attention_lse_grid_init(&gb, &bb);
        attention_lse_grid_init(&g, &both);
        int64_t sa[ATTENTION_LSE_SUMS(hd)]; /* in is read-only */
        memcpy(sa, a + REC_SUMS, sizeof sa);
        attention_lse_rebase(&ga, &g, sa, hd);
        attention_lse_rebase(&gb, &g, b + REC_SUMS, hd);
        for (int i = 0; i < ATTENTION_LSE_SUMS(hd); i++) b[REC_SUMS + i] += sa[i];
        memcpy(b + REC_BOUND, &both, sizeof both);
        const uint64_t *oa = (const uint64_t *)(a + REC_SUMS + ATTENTION_LSE_SUMS(hd));
        uint64_t *ob = (uint64_t *)rec_one(b, hd);
        for (int i = 0; i < (hd + 1) / 2; i++) ob[i] += oa[i]; /* wraps: garbage only where unused */
    }
}

/* The record type and lse_op for head_dim hd. */
static int make_rec_types(int hd, MPI_Datatype *type, MPI_Op *op) {
    int rc = MPI_Type_contiguous((int)rec_len(hd), MPI_INT64_T, type);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(type);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(lse_combine, 1, op);
    return rc;
}

ellm_status ellm_mpi_time_exchange(ellm_mpi *mpi, int rows, int head_dim, int reps, double *median_us,
                                   ellm_error *err) {
    if (reps < 1 || rows < 1 || head_dim < 1 || head_dim > 4096 || (size_t)rows * rec_len(head_dim) > INT_MAX)
        return ellm_fail(err, ELLM_ERR_ARG, "MPI: exchange of %d rows of %d, %d runs: out of range", rows, head_dim,
                         reps);
    if (mpi->failed[0]) return refuse_after_failure(mpi, err);
    const size_t n = rec_len(head_dim);
    int64_t *rec = malloc((size_t)rows * n * sizeof *rec);
    double *us = malloc((size_t)reps * sizeof *us);
    MPI_Datatype type;
    MPI_Op op;
    ellm_status st = ELLM_OK;
    if (!rec || !us) {
        st = ellm_fail(err, ELLM_ERR_NOMEM, "MPI: out of memory");
        goto out;
    }
    char buf[MPI_MAX_ERROR_STRING];
    int rc = make_rec_types(head_dim, &type, &op);
    if (rc != MPI_SUCCESS) {
        st = ellm_fail(err, ELLM_ERR_IO, "MPI: cannot make the exchange's types: %s", mpi_msg(rc, buf));
        goto out;
    }
    for (int i = -1; i < reps && st == ELLM_OK; i++) { /* one untimed run first */
        for (int r = 0; r < rows; r++) rec_empty(rec + (size_t)r * n, head_dim);
        uint64_t t0 = ellm_time_ns();
        MPI_Request req;
        rc = MPI_Iallreduce(MPI_IN_PLACE, rec, rows, type, op, mpi->comm, &req);
        if (rc == MPI_SUCCESS) rc = wait_deadline(mpi, &req);
        if (rc != MPI_SUCCESS) st = collective_fail(mpi, rc, "timed exchange", err);
        else if (i >= 0) us[i] = (double)(ellm_time_ns() - t0) / 1e3;
    }
    MPI_Op_free(&op);
    MPI_Type_free(&type);
    if (st == ELLM_OK) *median_us = median_sort(us, reps);
out:
    free(rec);
    free(us);
    return st;
}

void ellm_mpi_abort(ellm_mpi *mpi, int code) { MPI_Abort(mpi ? mpi->comm : MPI_COMM_WORLD, code); }

void ellm_mpi_finalize(ellm_mpi *mpi) {
    if (!mpi) return;
    /* After a failed collective a rank is gone or out of step: MPI_Finalize
     * would wait for it (and for the pending request) forever. */
    const int failed = mpi->failed[0] != 0;
    if (!failed) MPI_Comm_free(&mpi->comm);
    free(mpi);
    if (failed) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

/* ---- the shard ----------------------------------------------------------- */

ellm_status dist_shard_init(ellm_mpi *mpi, int max_q, int n_head, int head_dim, int max_ctx, int block_tokens,
                            dist_shard **out, ellm_error *err) {
    *out = NULL;
    if (!mpi || max_q < 1 || n_head < 1 || head_dim < 1 || max_ctx < 1 || block_tokens < 1)
        return ellm_fail(err, ELLM_ERR_ARG, "distributed KV: bad shape");
    dist_shard *sh = calloc(1, sizeof *sh);
    if (!sh) return ellm_fail(err, ELLM_ERR_NOMEM, "distributed KV: out of memory");
    sh->mpi = mpi;
    sh->block_tokens = block_tokens;
    sh->part_tokens = ATTENTION_PART_BLOCKS * block_tokens;
    sh->head_dim = head_dim;
    const long tiles = (max_q + 15) / 16 + 1, parts = (max_ctx + sh->part_tokens - 1) / sh->part_tokens;
    const size_t rows = (size_t)max_q * (size_t)n_head;
    sh->max_rec = tiles * parts;
    sh->own = calloc((size_t)sh->max_rec, sizeof *sh->own);
    sh->rec_rows = malloc(rows * rec_len(head_dim) * sizeof *sh->rec_rows);
    if (!sh->own || !sh->rec_rows) {
        dist_shard_free(sh);
        return ellm_fail(err, ELLM_ERR_NOMEM, "distributed KV: out of memory");
    }
    int rc = make_rec_types(head_dim, &sh->rec_type, &sh->lse_op);
    if (rc != MPI_SUCCESS) {
        char buf[MPI_MAX_ERROR_STRING];
        dist_shard_free(sh);
        return ellm_fail(err, ELLM_ERR_IO, "distributed KV: cannot make the exchange's MPI types: %s", mpi_msg(rc, buf));
    }
    sh->types_made = 1;
    const char *f = getenv("ELLM_MPI_FAULT");
    char kind[8];
    if (f && sscanf(f, "%7[a-z],%d,%ld", kind, &sh->fault_rank, &sh->fault_at) == 3)
        sh->fault_kind = !strcmp(kind, "exit") ? 1 : !strcmp(kind, "hang") ? 2 : 0;
    *out = sh;
    return ELLM_OK;
}

void dist_shard_free(dist_shard *sh) {
    if (!sh) return;
    free(sh->rec);
    free(sh->own);
    free(sh->rec_rows);
    if (sh->types_made) {
        MPI_Op_free(&sh->lse_op);
        MPI_Type_free(&sh->rec_type);
    }
    free(sh);
}

int dist_rank(const dist_shard *sh) { return sh->mpi->rank; }
int dist_size(const dist_shard *sh) { return sh->mpi->size; }
int dist_part_tokens(const dist_shard *sh) { return sh->part_tokens; }

/* Part c opens when the sequence reaches position c * part_tokens; the
 * least-loaded rank then is the one with fewest parts, and parts 0..c-1 went
 * round-robin, so it is c mod R. */
static int part_owner(const dist_shard *sh, long c) { return (int)(c % sh->mpi->size); }

int dist_owner(const dist_shard *sh, int pos) { return part_owner(sh, pos / sh->part_tokens); }

int dist_local_tokens(const dist_shard *sh, int len) {
    int n = 0;
    for (int p0 = 0; p0 < len; p0 += sh->part_tokens)
        if (dist_owner(sh, p0) == sh->mpi->rank) n += len - p0 < sh->part_tokens ? len - p0 : sh->part_tokens;
    return n;
}

void dist_kv_store(dist_shard *sh, kv_cache *kv, int layer, int pos, int n, const float *k, const float *v) {
    const kv_cache_params *p = kv_cache_get_params(kv);
    const size_t row = (size_t)p->n_kv_head * (size_t)p->head_dim;
    for (int p0 = pos; p0 < pos + n;) {
        int p1 = (p0 / sh->part_tokens + 1) * sh->part_tokens;
        if (p1 > pos + n) p1 = pos + n;
        if (dist_owner(sh, p0) == sh->mpi->rank)
            kv_cache_store(kv, layer, p0, p1 - p0, k + (size_t)(p0 - pos) * row, v + (size_t)(p0 - pos) * row);
        p0 = p1;
    }
}

const char *dist_failed(const dist_shard *sh) {
    return sh->failed[0] ? sh->failed : sh->mpi->failed[0] ? sh->mpi->failed : NULL;
}

static void zero_out(const attention_args *a) {
    const size_t hd = (size_t)kv_cache_get_params(a->kv)->head_dim;
    memset(a->out, 0, (size_t)a->n_q * (size_t)a->n_head * hd * sizeof(float));
}

/* Runs an in-place all-reduce of n elements and waits for it (at most the
 * timeout). Returns MPI_SUCCESS, an MPI error code or -1 (timeout). */
static int allreduce(const ellm_mpi *mpi, void *buf, size_t n, MPI_Datatype type, MPI_Op op) {
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, type, op, mpi->comm, &req);
    return rc == MPI_SUCCESS ? wait_deadline(mpi, &req) : rc;
}

static void fail_exchange(dist_shard *sh, const attention_args *a, int rc) {
    ellm_error e;
    collective_fail(sh->mpi, rc, "exchange of attention partials", &e);
    snprintf(sh->failed, sizeof sh->failed, "%s", e.msg);
    zero_out(a);
}

enum { PASS_LOCAL, PASS_OUT };

/* One pass over every query row of a call: row q = token * n_head + query
 * head (a->out's order), at offset off in its tile's records (KV head h,
 * segment row r = token_in_tile * group + g); parts are numbered c as in
 * the call (the same on every rank).
 *   PASS_LOCAL: record q of this rank's parts: their bound, their binned
 *               sums on its bins, and acc / l bits if it holds exactly one
 *               part with keys for the row;
 *   PASS_OUT:   a->out from the reduced records: the one part's bits if the
 *               whole row saw one part, else the merged sums. */
static void rows_pass(dist_shard *sh, const attention_args *a, int pass) {
    const int hd = sh->head_dim, n_kv = kv_cache_get_params(a->kv)->n_kv_head, G = a->n_head / n_kv;
    const size_t n_rec = rec_len(hd);
    for (int t = 0; t < attention_n_tiles(a); t++) {
        const int np = attention_tile_parts(a, t), i0 = t * 16, rows = (a->n_q - i0 < 16 ? a->n_q - i0 : 16) * G;
        float *const *own = sh->own + attention_part_first(a, t);
        for (int h = 0; h < n_kv; h++)
            for (int r = 0; r < rows; r++) {
                const size_t q = (size_t)(i0 + r / G) * a->n_head + (size_t)h * G + r % G;
                const size_t off = ((size_t)h * rows + r) * (size_t)(hd + 2);
                int64_t *rec = sh->rec_rows + q * n_rec;
                uint32_t *bits = (uint32_t *)rec_one(rec, hd);
                float *dst = a->out + q * (size_t)hd;
                attention_lse_bound b;
                attention_lse_grid g;
                if (pass == PASS_LOCAL) {
                    rec_empty(rec, hd);
                    attention_lse_bound_init(&b);
                    for (int c = 0; c < np; c++)
                        if (own[c]) attention_lse_bound_add(&b, c, own[c][off], own[c][off + 1], own[c] + off + 2, hd);
                    memcpy(rec + REC_BOUND, &b, sizeof b);
                    const int one = attention_lse_single(&b);
                    if (one >= 0) { /* this rank's only part for the row: maybe the row's only one */
                        float o[hd];
                        attention_lse_one(own[one][off + 1], own[one] + off + 2, hd, o);
                        memcpy(bits, o, sizeof o);
                    }
                    attention_lse_grid_init(&g, &b);
                    for (int c = 0; c < np; c++)
                        if (own[c])
                            attention_lse_sum(&g, own[c][off], own[c][off + 1], own[c] + off + 2, hd, rec + REC_SUMS);
                } else {
                    rec_bound(rec, &b);
                    if (attention_lse_single(&b) >= 0) {
                        memcpy(dst, bits, (size_t)hd * sizeof *dst);
                    } else {
                        attention_lse_grid_init(&g, &b);
                        attention_lse_out(&g, rec + REC_SUMS, hd, dst);
                    }
                }
            }
    }
}

/* The exchange (see dist.h): rows are merged exactly (attention_lse_*):
 * every rank adds up its own parts into one record per row on the bins of
 * its own largest terms, and one all-reduce with lse_op merges the records
 * (sums moved to the bins of the overall largest terms and added); integer
 * sums do not depend on how parts are grouped over ranks, so every R gives
 * one process's bits. A row that saw keys of one part only gets acc / l of
 * it, as one process writes it: the part's owner sends those float bits,
 * the other ranks zeros. */
void dist_attention(dist_shard *sh, const attention_args *a, const int32_t *blocks, const int *n_blocks,
                    int max_blocks, attention_workspace *ws, threadpool *pool) {
    ellm_mpi *mpi = sh->mpi;
    if (sh->failed[0] || mpi->failed[0]) { /* the job is stopping: do not wait for ranks again */
        zero_out(a);
        return;
    }
    const int n_tiles = attention_n_tiles(a), R = mpi->size, me = mpi->rank, hd = sh->head_dim;
    const long n_rec = attention_part_first(a, n_tiles);
    if (n_rec > sh->max_rec) {
        snprintf(sh->failed, sizeof sh->failed, "distributed attention: %ld parts exceed the %ld planned", n_rec,
                 sh->max_rec);
        zero_out(a);
        return;
    }
    /* this rank's records: parts c of every tile with c mod R == rank */
    size_t need = 0;
    for (int t = 0; t < n_tiles; t++)
        for (int c = 0; c < attention_tile_parts(a, t); c++)
            if (part_owner(sh, c) == me) need += attention_part_floats(a, t);
    if (need > sh->rec_cap) {
        float *nb = realloc(sh->rec, need * sizeof(float));
        if (!nb) {
            snprintf(sh->failed, sizeof sh->failed, "distributed attention: out of memory for %zu partial floats",
                     need);
            zero_out(a);
            return;
        }
        sh->rec = nb;
        sh->rec_cap = need;
    }
    size_t fill = 0;
    for (int t = 0; t < n_tiles; t++) {
        const int np = attention_tile_parts(a, t);
        for (int c = 0; c < np; c++) {
            float **own = &sh->own[attention_part_first(a, t) + c];
            *own = part_owner(sh, c) == me ? sh->rec + fill : NULL;
            if (*own) fill += attention_part_floats(a, t);
        }
    }

    uint64_t t0 = ellm_time_ns();
    attention_forward_parts(a, blocks, n_blocks, max_blocks, sh->own, ws, pool);
    uint64_t t1 = ellm_time_ns();
    if (sh->fault_kind && me == sh->fault_rank && sh->stats.exchanges + 1 == sh->fault_at) {
        if (sh->fault_kind == 1) _exit(3);
        for (;;) pause();
    }

    const size_t n_rows = (size_t)a->n_q * (size_t)a->n_head;
    rows_pass(sh, a, PASS_LOCAL);
    uint64_t t2 = ellm_time_ns();
    int rc = MPI_SUCCESS;
    if (R > 1) rc = allreduce(mpi, sh->rec_rows, n_rows, sh->rec_type, sh->lse_op);
    uint64_t t3 = ellm_time_ns();
    if (rc != MPI_SUCCESS) {
        fail_exchange(sh, a, rc);
        return;
    }
    rows_pass(sh, a, PASS_OUT);
    uint64_t t4 = ellm_time_ns();
    sh->stats.exchanges++;
    if (R > 1) { /* an all-reduce: each rank contributes the whole vector and gets the result */
        const double bytes = (double)n_rows * (double)(rec_len(hd) * sizeof(int64_t));
        sh->stats.bytes_sent += bytes;
        sh->stats.bytes_recv += bytes;
    }
    sh->stats.compute_ms += (double)(t1 - t0) / 1e6;
    sh->stats.exchange_ms += (double)(t3 - t2) / 1e6;
    sh->stats.merge_ms += (double)(t2 - t1 + t4 - t3) / 1e6;
}

void dist_get_stats(const dist_shard *sh, dist_stats *st) { *st = sh->stats; }
void dist_reset_stats(dist_shard *sh) { memset(&sh->stats, 0, sizeof sh->stats); }
