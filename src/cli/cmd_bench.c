/* `ellm bench`: memory bandwidth self-test, decode latency against context
 * depth, bytes moved per token and the fraction of bandwidth achieved, prefill
 * speed, and a projection of a long generation's end-to-end time. */
#include "cli/args.h"
#include "cli/commands.h"
#include "core/median.h"
#include "core/membw.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "topology/probe.h"
#include "ellm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_POINTS 64

/* Steps per round of time_alternating and of the dense rounds paired with a
 * bandwidth read: the first of each is not timed (the other pool may still
 * be spinning down). */
#define ROUND_STEPS 8

typedef struct {
    int depth;
    int synthetic;
    double select_fraction; /* sparse: share of the step spent choosing blocks */
    double index_ratio;     /* sparse: index bytes read / a flat per-block scan */
    double ms_median, ms_min;
    double tokens_per_s;
    double bytes_per_token;
    double gbps;
    double bw_fraction;
    double vs_empty; /* sparse: tok/s over an empty context's, timed interleaved */
    double cmp_ms, ab_ms; /* --kv-compare: medians of the other and this KV type, timed interleaved */
    double *step_ms; /* every timed step, ascending (n_tokens of them) */
    /* dense: the steps in rounds, each after a read of the bandwidth
     * (bw_meter): per round the bandwidth, the median step and their ratio */
    int n_rounds;
    double *round_bw, *round_ms, *round_fraction;
    double paired_fraction, paired_bw; /* medians over the rounds */
    /* dense: the point's timed steps by part, mean ms a step
     * (ellm_context_stats): the forward pass, the layers' weight
     * matmuls, attention, the output matrix; and the bytes each part reads */
    double fwd_ms, mm_ms, att_ms, out_ms;
    double mm_bytes, att_bytes, out_bytes;
} bench_point;

/* Adds one of p's n timed steps to its split: the context's stats before (a)
 * and after (b) the step. */
static void add_split(bench_point *p, const ellm_context_stats *a, const ellm_context_stats *b, int n) {
    p->fwd_ms += (b->forward_ms - a->forward_ms) / n;
    p->mm_ms += (b->matmul_ms - a->matmul_ms) / n;
    p->att_ms += (b->attention_ms - a->attention_ms) / n;
    p->out_ms += (b->output_ms - a->output_ms) / n;
}

/* GB/s of `bytes` read in `ms`, or 0. */
static double gbps_of(double bytes, double ms) { return ms > 0 ? bytes / (ms / 1000.0) / 1e9 : 0; }

#define MAX_PREFILL_REPS 64

typedef struct {
    int tokens;
    double tokens_per_s; /* median of the timed passes */
    double samples[MAX_PREFILL_REPS];
} prefill_point;

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: ellm bench [-m MODEL.gguf] [options]\n"
            "  -t, --threads N         compute threads (default: one per physical core)\n"
            "  --depths LIST           context depths to time decode at (default 0,4096,16384)\n"
            "  --synthetic-kv          fill the KV cache with synthetic keys/values instead of a\n"
            "                          real prefill (for deep points; labelled in the output)\n"
            "  --synthetic-from N      use synthetic KV only for depths >= N (default: all if\n"
            "                          --synthetic-kv, else none)\n"
            "  -n, --n-tokens N        decode steps timed per depth (default 32)\n"
            "  --prefill LIST          prompt lengths to time prefill at (default 512; 0 = none)\n"
            "  --prefill-reps N        timed passes per prompt length, after one untimed warm-up\n"
            "                          (default 1)\n"
            "  --gen N                 project the time of an N-token generation (default 50000)\n"
            "  --kv-type f16|f32|q8_0  KV cache element type (default f16)\n"
            "  --kv-compare TYPE       also time dense decode with a second cache of KV type TYPE\n"
            "                          at each depth, in rounds alternating with this --kv-type's\n"
            "                          steps (same machine state for both): speedup_vs_kv_compare\n"
            "  --sparse-topk K         also time sparse attention with a K-token budget\n"
            "  --bw-mb MB              bandwidth self-test buffer (default 1024)\n"
            "  --numa-aware, --numa MODE  NUMA placement as for ellm run (off, distribute,\n"
            "                          replicate, interleave); --mlock locks the weights;\n"
            "                          --keep-layout reads them in the file's layout (see ellm run)\n"
            "  --rope-scaling T, --rope-scale N, --rope-freq-base N, --yarn-orig-ctx N\n"
            "                          RoPE scaling instead of the file's (see ellm run)\n"
            "  --spec DRAFTER          also time speculative decoding: a draft step of DRAFTER\n"
            "                          (any ellm run --spec list: ngram, sparse:N, quant:TYPE,\n"
            "                          quant:TYPE:sparse:N, shallow:K, chains with +; the cost per\n"
            "                          token of drafting --draft-max tokens) and a verify pass of k+1\n"
            "                          tokens for k = 1 .. --draft-max (default 8) at each depth;\n"
            "                          tokens/s = T(k) / (k x draft step + verify of k+1) at the best k\n"
            "  --spec-tokens-per-verify T  tokens per verify pass at --draft-max (from `ellm eval\n"
            "                          --spec` on real text; default 5); T(k) follows from it\n"
            "  --json                  machine-readable output (every timed step of every point\n"
            "                          in step_ms, every prefill pass in samples_tps)\n"
            "  --mpi                   under mpirun: KV sharded over the ranks, exchange costs\n"
            "                          (ellm bench --mpi --help)\n"
            "Decode: one untimed step, then -n timed single-token steps per depth; the median\n"
            "step time gives tok/s. A dense context keeps no sparse index, as `ellm run`\n"
            "without --sparse-topk. Dense steps run in rounds of %d timed steps, each round\n"
            "after a read of the --bw-mb buffer by as many threads: a round's share of the\n"
            "bandwidth is its bytes per median step over the bandwidth read just before it,\n"
            "both in one machine state (\"paired\"; the median over the rounds is reported).\n"
            "Each dense point also splits its timed steps (\"split\"): the layers' weight\n"
            "matmuls, attention and the output matrix, mean ms and the GB/s each part reads.\n",
            ROUND_STEPS - 1);
}

/* Step latency at depth d from the measured points: piecewise linear, extended
 * linearly past the last point (decode cost grows linearly with depth). */
static double latency_at(const bench_point *p, int n, double d) {
    if (n == 1) return p[0].ms_median;
    int i = 0;
    while (i < n - 2 && d > p[i + 1].depth) i++;
    double x0 = p[i].depth, x1 = p[i + 1].depth, y0 = p[i].ms_median, y1 = p[i + 1].ms_median;
    if (x1 == x0) return y1;
    double y = y0 + (y1 - y0) * (d - x0) / (x1 - x0);
    return y > 0 ? y : y0;
}

/* Median and minimum of n step times (sorted in place) into p; the sorted
 * times are kept in p->step_ms. */
static void set_latency(bench_point *p, double *step_ms, int n) {
    p->ms_median = median_sort(step_ms, n);
    p->ms_min = step_ms[0];
    p->tokens_per_s = 1000.0 / p->ms_median;
    if (p->step_ms) memcpy(p->step_ms, step_ms, (size_t)n * sizeof *step_ms);
}

/* The yardstick read between rounds of dense steps: a committed buffer of
 * --bw-mb and a pool of the context's thread count, pinned as the context's
 * threads are (thread i on the i-th physical core). */
typedef struct {
    threadpool *pool;
    void *buf;
    size_t bytes;
} bw_meter;

/* n decode steps from depth d in rounds of ROUND_STEPS - 1 timed steps, each
 * round after a bandwidth read by m (best of 2 passes after a warm-up one)
 * and one untimed step; p->round_* get each round's bandwidth and median
 * step. This machine's read rate moves between states (35 and 61 GB/s were
 * seen seconds apart), so a share of bandwidth is only meaningful against a
 * figure read in the same state. The first untimed step also pays the page
 * faults of a fresh mapping. Needs room for d + n + n / (ROUND_STEPS - 1) + 1
 * tokens. */
static int time_steps(ellm_context *ctx, const int32_t *ids, int n_ctx, int d, int n, double *step_ms,
                      bench_point *p, const bw_meter *m) {
    ellm_error err = {0};
    int done = 0, pos = d;
    p->n_rounds = 0;
    while (done < n) {
        int k = n - done < ROUND_STEPS - 1 ? n - done : ROUND_STEPS - 1;
        const int r = p->n_rounds++;
        p->round_bw[r] = membw_read_buffer_gbps(m->pool, m->buf, m->bytes, 2);
        for (int s = -1; s < k; s++) {
            int32_t tok = ids[(pos + 1 + s) % n_ctx];
            ellm_context_stats st0, st1;
            ellm_context_get_stats(ctx, &st0);
            double t0 = ellm_time_ms();
            if (ellm_decode(ctx, &tok, 1, NULL, &err) != ELLM_OK) {
                fprintf(stderr, "error: %s\n", err.msg);
                return 0;
            }
            if (s < 0) continue;
            step_ms[done + s] = ellm_time_ms() - t0;
            ellm_context_get_stats(ctx, &st1);
            add_split(p, &st0, &st1, n);
        }
        double sorted[ROUND_STEPS];
        memcpy(sorted, step_ms + done, (size_t)k * sizeof *sorted);
        p->round_ms[r] = median_sort(sorted, k);
        pos += k + 1;
        done += k;
    }
    set_latency(p, step_ms, n);
    return 1;
}

/* Each round's share of its own bandwidth read, and the medians (tmp:
 * room for p->n_rounds values). */
static void set_paired(bench_point *p, double *tmp) {
    for (int r = 0; r < p->n_rounds; r++) {
        const double gbps = gbps_of(p->bytes_per_token, p->round_ms[r]);
        p->round_fraction[r] = p->round_bw[r] > 0 ? gbps / p->round_bw[r] : 0;
    }
    memcpy(tmp, p->round_fraction, (size_t)p->n_rounds * sizeof *tmp);
    p->paired_fraction = median_sort(tmp, p->n_rounds);
    memcpy(tmp, p->round_bw, (size_t)p->n_rounds * sizeof *tmp);
    p->paired_bw = median_sort(tmp, p->n_rounds);
}


/* Times n decode steps of a, from depth d, and n of b in rounds that
 * alternate between the two (ROUND_STEPS - 1 timed steps each), so both see
 * the same machine state: the ratio of their medians is robust to the load
 * of a shared machine drifting during the run, which separate commands are
 * not. b steps on from its own depth, or (b_empty) is emptied before each
 * of its steps: decode speed at an empty context. Fills a_ms and b_ms, n
 * each, in step order. a (and b, unless b_empty) needs room for
 * d + n + n / (ROUND_STEPS - 1) + 1 tokens. */
static int time_alternating(ellm_context *a, ellm_context *b, int b_empty, const int32_t *ids, int n_ctx, int d,
                            int n, double *a_ms, double *b_ms) {
    ellm_error err = {0};
    int done = 0, pos = d;
    while (done < n) {
        int k = n - done < ROUND_STEPS - 1 ? n - done : ROUND_STEPS - 1;
        for (int c = 0; c < 2; c++) {
            ellm_context *x = c ? b : a;
            double *ms = c ? b_ms : a_ms;
            for (int s = -1; s < k; s++) {
                int32_t tok = ids[(pos + 1 + s) % n_ctx];
                if (c && b_empty) ellm_context_truncate(b, 0);
                double t0 = ellm_time_ms();
                if (ellm_decode(x, &tok, 1, NULL, &err) != ELLM_OK) {
                    fprintf(stderr, "error: %s\n", err.msg);
                    return 0;
                }
                if (s >= 0) ms[done + s] = ellm_time_ms() - t0;
            }
        }
        pos += k + 1;
        done += k;
    }
    return 1;
}

/* `, "step_ms": [...]}`: the n sorted step times of a point, closing its JSON object. */
static void print_steps(const double *ms, int n) {
    printf(", \"step_ms\": [");
    for (int i = 0; i < n; i++) printf("%s%.4f", i ? ", " : "", ms[i]);
    printf("]}");
}

/* A progress line on stderr when it is a terminal: "<what><v>". */
static void progress(const char *what, int v) {
    if (!isatty(2)) return;
    fprintf(stderr, "\r\033[K%s%d", what, v);
    fflush(stderr);
}

/* A speculative point: costs measured at one depth and the best draft length. */
typedef struct {
    double draft_ms;  /* one draft step (0 for n-gram lookup) */
    double verify_ms; /* verify pass of k + 1 tokens at the best k */
    int k;            /* best draft length for these costs */
    double tpv;       /* tokens per verify expected at k */
    double tokens_per_s;
} spec_point;

/* Median time of `reps` batched passes of n tokens at depth d (truncated back each time). */
static double time_batch(ellm_context *ctx, const int32_t *ids, int d, int n, int reps) {
    double t[16];
    ellm_error err;
    if (reps > 16) reps = 16;
    for (int r = 0; r < reps; r++) {
        ellm_context_truncate(ctx, d);
        double t0 = ellm_time_ms();
        if (ellm_decode(ctx, ids, n, NULL, &err) != ELLM_OK) return -1;
        t[r] = ellm_time_ms() - t0;
    }
    ellm_context_truncate(ctx, d);
    return median_sort(t, reps);
}

/* Times verify passes of k + 1 tokens at depth d for k = 1..kmax with the
 * context's current attention mode and fills p with the draft length that
 * gives the most tokens/s for a draft step of p->draft_ms and a per-token
 * acceptance a. Returns 0, or -1 if a pass failed. */
static int best_draft_length(ellm_context *ctx, const int32_t *ids, int d, int kmax, double a, spec_point *p) {
    double verify[32];
    for (int k = 1; k <= kmax && k < 32; k++)
        if ((verify[k] = time_batch(ctx, ids, d, k + 1, 3)) < 0) return -1;
    p->k = ellm_spec_best_draft_length(a, p->draft_ms, verify, kmax, &p->tokens_per_s);
    p->tpv = ellm_spec_tokens_per_verify(a, p->k);
    p->verify_ms = verify[p->k];
    return 0;
}

/* A draft step's cost at depth d: the median over reps of (time of
 * ellm_spec_draft_step drafting the spec state's draft length) / (tokens
 * drafted), each from a context holding d + 1 tokens and the logits after
 * them; the cache is truncated back to d. Counts what a real pass counts:
 * the drafter's model and KV budget swapped in, its single-token passes, the
 * argmax of each row, the truncation of the provisional KV. Returns -1 if a
 * pass failed, 0 if nothing was drafted (an n-gram drafter on text that does
 * not repeat). */
static double time_draft_step(ellm_context *ctx, ellm_spec *spec, ellm_sampler *smp, const int32_t *ids, int n_ids,
                              int d) {
    enum { REPS = 5 };
    double t[REPS];
    int n = 0;
    ellm_error err;
    for (int r = 0; r < REPS; r++) {
        ellm_context_truncate(ctx, d);
        int32_t tok = ids[(d + r) % n_ids];
        if (ellm_decode(ctx, &tok, 1, NULL, &err) != ELLM_OK) return -1;
        int32_t out[40];
        int n_out = 0, n_feed = 0;
        const int32_t *feed;
        float *rows;
        const int n_hist = d + 1 < n_ids ? d + 1 : n_ids;
        double t0 = ellm_time_ms();
        if (ellm_spec_draft_step(spec, smp, ids, n_hist, 1 << 20, out, &n_out, &feed, &n_feed, &rows, &err) !=
            ELLM_OK) {
            fprintf(stderr, "error: %s\n", err.msg);
            return -1;
        }
        double dt = ellm_time_ms() - t0;
        ellm_spec_cancel_step(spec);
        if (n_feed > 1) t[n++] = dt / (n_feed - 1);
    }
    ellm_context_truncate(ctx, d);
    return n ? median_sort(t, n) : 0;
}

int cmd_bench(int argc, char **argv) {
    const char *model_path = NULL;
    long threads = 0, n_tokens = 32, gen = 50000, bw_mb = 1024, synth_from = -1, prefill_reps = 1;
    int depths[MAX_POINTS] = {0, 4096, 16384}, n_depths = 3;
    int prefills[16] = {512}, n_prefills = 1;
    int synthetic = 0, json = 0, kv_f32 = 0, kv_cmp = -1, bad = 0;
    long sparse_topk = 0;
    int numa = 0, mlock = 0, keep_layout = 0;
    ellm_rope_params rope = {0};
    const char *spec = NULL;
    long spec_kmax = 8, spec_budget = 0;
    double spec_tpv_given = 5.0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--mpi")) return cmd_bench_mpi(argc, argv);
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--synthetic-kv")) synthetic = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--numa-aware")) numa = ELLM_NUMA_DISTRIBUTE;
        else if (!strcmp(a, "--mlock")) mlock = 1;
        else if (!strcmp(a, "--keep-layout")) keep_layout = 1;
        else if (arg_rope_parse(argc, argv, &i, &rope, &bad)) {
            /* parsed into rope, the model's RoPE parameters */
        }
        else if (arg_value(argc, argv, &i, "--numa", NULL, &v, &bad))
            bad = !v || !arg_numa(a, v, &numa);
        else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad)) model_path = v;
        else if (arg_value(argc, argv, &i, "--threads", "-t", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1024, &threads);
        else if (arg_value(argc, argv, &i, "--n-tokens", "-n", &v, &bad))
            bad = !v || !arg_int(a, v, 2, 100000, &n_tokens);
        else if (arg_value(argc, argv, &i, "--gen", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1L << 30, &gen);
        else if (arg_value(argc, argv, &i, "--bw-mb", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 16, 1 << 20, &bw_mb);
        else if (arg_value(argc, argv, &i, "--prefill-reps", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, MAX_PREFILL_REPS, &prefill_reps);
        else if (arg_value(argc, argv, &i, "--sparse-topk", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 30, &sparse_topk);
        else if (arg_value(argc, argv, &i, "--spec", NULL, &v, &bad)) spec = v;
        else if (arg_value(argc, argv, &i, "--draft-max", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, 31, &spec_kmax);
        else if (arg_value(argc, argv, &i, "--spec-tokens-per-verify", NULL, &v, &bad))
            bad = !v || !arg_double(a, v, 1, 32, &spec_tpv_given);
        else if (arg_value(argc, argv, &i, "--synthetic-from", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 30, &synth_from);
        else if (arg_value(argc, argv, &i, "--depths", NULL, &v, &bad))
            bad = !v || (n_depths = arg_int_list(a, v, 0, 1L << 30, depths, MAX_POINTS)) <= 0;
        else if (arg_value(argc, argv, &i, "--prefill", NULL, &v, &bad))
            bad = !v || (n_prefills = arg_int_list(a, v, 0, 1L << 30, prefills, 16)) < 0;
        else if (arg_value(argc, argv, &i, "--kv-type", NULL, &v, &bad))
            bad = !v || !arg_kv_type(a, v, &kv_f32);
        else if (arg_value(argc, argv, &i, "--kv-compare", NULL, &v, &bad))
            bad = !v || !arg_kv_type(a, v, &kv_cmp);
        else {
            fprintf(stderr, "error: unknown option '%s' (see ellm bench --help)\n", a);
            bad = 1;
        }
    }
    /* Drafters keep the sparse index when one of them has a budget; the
     * list itself is checked by ellm_spec_init once the context exists. */
    if (!bad && spec) spec_budget = strstr(spec, "sparse:") != NULL;
    if (bad) return 2;
    if (n_prefills == 1 && prefills[0] == 0) n_prefills = 0;
    if (synth_from < 0) synth_from = synthetic ? 0 : (1L << 30) + 1;
    if (!model_path) model_path = cli_default_model();
    /* depths ascending, so the cache can grow from one point to the next */
    for (int i = 1; i < n_depths; i++)
        for (int j = i; j > 0 && depths[j] < depths[j - 1]; j--) {
            int t = depths[j]; depths[j] = depths[j - 1]; depths[j - 1] = t;
        }

    ellm_error err = {0};
    ellm_model *model = NULL;
    ellm_context *ctx = NULL, *ctx0 = NULL, *ctx_cmp = NULL;
    ellm_spec *spec_state = NULL;
    ellm_sampler *spec_smp = NULL;
    int32_t *ids = NULL;
    double *step_ms = NULL, *base_ms = NULL, *samples = NULL, *rounds = NULL;
    bw_meter meter = {0};
    int rc = 1;
    ellm_model_params mp = {.n_threads = (int)threads, .pin_threads = 1, .numa = (ellm_numa_mode)numa, .mlock = mlock,
                            .keep_layout = keep_layout, .rope = rope};
    if (ellm_model_load(model_path, &mp, &model, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    ellm_model_info info;
    ellm_model_get_info(model, &info);

    progress("bandwidth self-test, buffer MB: ", (int)bw_mb);
    int nt = threads > 0 ? (int)threads : ellm_default_threads();
    meter.bytes = (size_t)bw_mb << 20;
    if (threadpool_init(nt, 1, &meter.pool, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    if (!(meter.buf = membw_buffer_alloc(&meter.bytes))) {
        fprintf(stderr, "error: cannot allocate the %ld MB bandwidth buffer (--bw-mb)\n", bw_mb);
        goto done;
    }
    double bw = membw_read_buffer_gbps(meter.pool, meter.buf, meter.bytes, 5), bw1 = bw;
    if (nt > 1) { /* one thread over the same buffer, not a second one committed */
        threadpool *one;
        if (threadpool_init(1, 1, &one, &err) != ELLM_OK) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto done;
        }
        bw1 = membw_read_buffer_gbps(one, meter.buf, meter.bytes, 5);
        threadpool_free(one);
    }
    /* The yardstick `ellm probe` measured (all nodes, each core reading its
     * own node's memory), for the probe_fraction of each point. */
    double probe_age_s;
    int probe_saved;
    const double probe_bw = probe_reference_gbps((size_t)bw_mb << 20, 5, &probe_saved, &probe_age_s);

    int max_depth = depths[n_depths - 1];
    int max_prefill = 0;
    for (int i = 0; i < n_prefills; i++)
        if (prefills[i] > max_prefill) max_prefill = prefills[i];
    int n_ctx = (max_depth > max_prefill ? max_depth : max_prefill) + (int)n_tokens +
                (int)n_tokens / (ROUND_STEPS - 1) + 9 + 32;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = (int)threads;
    cp.kv_type = (ellm_kv_type)kv_f32;
    cp.n_batch = 512;
    cp.sparse_topk = sparse_topk > 0 || spec_budget > 0 ? 0 : -1; /* keep the index only when sparse is timed */
    if (ellm_context_init(model, &cp, &ctx, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    if (sparse_topk > 0) {
        /* The empty-context yardstick timed alongside the sparse points. */
        ellm_context_params cp0 = cp;
        cp0.n_ctx = 16;
        cp0.n_batch = 1;
        cp0.sparse_topk = -1;
        if (ellm_context_init(model, &cp0, &ctx0, &err) != ELLM_OK) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto done;
        }
    }
    if (kv_cmp >= 0) {
        /* The second cache of --kv-compare: dense, same size. */
        ellm_context_params cpc = cp;
        cpc.kv_type = (ellm_kv_type)kv_cmp;
        cpc.sparse_topk = -1;
        if (ellm_context_init(model, &cpc, &ctx_cmp, &err) != ELLM_OK) {
            fprintf(stderr, "error: --kv-compare: %s\n", err.msg);
            goto done;
        }
    }
    if (spec) {
        /* The drafter chain as ellm run --spec makes it (a quant: copy is
         * made or loaded here), drafting --draft-max tokens a pass, greedy. */
        ellm_spec_params sp = ellm_spec_default_params();
        sp.drafters = spec;
        sp.draft_max = (int)spec_kmax;
        sp.adapt = 0;
        ellm_sampler_params smp_p = ellm_sampler_default_params();
        smp_p.temperature = 0;
        if (ellm_spec_init(ctx, &sp, &spec_state, &err) != ELLM_OK ||
            ellm_sampler_init(&smp_p, info.n_vocab, &spec_smp, &err) != ELLM_OK) {
            fprintf(stderr, "error: --spec: %s\n", err.msg);
            goto done;
        }
    }
    size_t kv_per_token = ellm_context_kv_bytes_per_token(ctx);
    ids = malloc((size_t)n_ctx * sizeof *ids);
    step_ms = malloc((size_t)n_tokens * sizeof *step_ms);
    base_ms = malloc((size_t)n_tokens * sizeof *base_ms);
    samples = malloc((size_t)2 * n_depths * n_tokens * sizeof *samples); /* dense, then sparse points */
    const int max_rounds = ((int)n_tokens + ROUND_STEPS - 2) / (ROUND_STEPS - 1);
    rounds = malloc((size_t)3 * n_depths * max_rounds * sizeof *rounds); /* per dense point: bw, ms, fraction */
    if (!ids || !step_ms || !base_ms || !samples || !rounds) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    /* Any valid ids: a fixed pseudo-random walk over the vocabulary. */
    for (int i = 0; i < n_ctx; i++) ids[i] = (int32_t)(3 + ((uint64_t)i * 7919u) % (uint64_t)(info.n_vocab - 3));

    prefill_point pre[16];
    for (int i = 0; i < n_prefills; i++) {
        progress("prefill, tokens: ", prefills[i]);
        pre[i].tokens = prefills[i];
        /* pass -1 is the untimed warm-up */
        for (int r = -1; r < prefill_reps; r++) {
            ellm_context_truncate(ctx, 0);
            double t0 = ellm_time_ms();
            if (ellm_decode(ctx, ids, prefills[i], NULL, &err) != ELLM_OK) {
                fprintf(stderr, "error: %s\n", err.msg);
                goto done;
            }
            if (r >= 0) pre[i].samples[r] = prefills[i] / ((ellm_time_ms() - t0) / 1000.0);
        }
        double sorted[MAX_PREFILL_REPS];
        memcpy(sorted, pre[i].samples, (size_t)prefill_reps * sizeof *sorted);
        qsort(sorted, (size_t)prefill_reps, sizeof *sorted, median_cmp_double);
        pre[i].tokens_per_s = prefill_reps % 2 ? sorted[prefill_reps / 2]
                                               : (sorted[prefill_reps / 2 - 1] + sorted[prefill_reps / 2]) / 2;
    }

    bench_point pts[MAX_POINTS], spts[MAX_POINTS];
    spec_point specd[MAX_POINTS], specs[MAX_POINTS]; /* speculative over dense / over sparse verification */
    ellm_context_truncate(ctx, 0);
    for (int i = 0; i < n_depths; i++) {
        int d = depths[i];
        bench_point *p = &pts[i];
        memset(p, 0, sizeof *p);
        p->step_ms = samples + (size_t)i * n_tokens;
        p->depth = d;
        p->synthetic = d > 0 && d >= synth_from;
        progress(p->synthetic ? "synthetic KV fill, depth " : "prefill to depth ", d);
        if (p->synthetic) {
            if (ellm_context_fill_synthetic(ctx, d, 1234 + (uint64_t)d, &err) != ELLM_OK) {
                fprintf(stderr, "error: %s\n", err.msg);
                goto done;
            }
        } else {
            int pos = ellm_context_pos(ctx);
            if (pos > d) {
                ellm_context_truncate(ctx, 0);
                pos = 0;
            }
            if (d > pos && ellm_decode(ctx, ids + pos, d - pos, NULL, &err) != ELLM_OK) {
                fprintf(stderr, "error: %s\n", err.msg);
                goto done;
            }
        }
        progress("decode at depth ", d);
        p->round_bw = rounds + (size_t)(3 * i) * max_rounds;
        p->round_ms = p->round_bw + max_rounds;
        p->round_fraction = p->round_ms + max_rounds;
        if (!time_steps(ctx, ids, n_ctx, d, (int)n_tokens, step_ms, p, &meter)) goto done;
        /* the cache now holds d + n_tokens + n_rounds (one untimed step a
         * round); the timed steps' mean depth is about half way */
        p->att_bytes = (double)kv_per_token * (d + 1 + (n_tokens + p->n_rounds) / 2.0);
        p->out_bytes = (double)info.output_weight_bytes;
        p->mm_bytes = (double)info.decode_weight_bytes - p->out_bytes;
        p->bytes_per_token = (double)info.decode_weight_bytes + p->att_bytes;
        p->gbps = gbps_of(p->bytes_per_token, p->ms_median);
        p->bw_fraction = bw > 0 ? p->gbps / bw : 0;
        set_paired(p, base_ms);
        if (ctx_cmp) {
            progress("decode at depth, alternating with the --kv-compare cache: ", d);
            ellm_context_truncate(ctx_cmp, 0);
            int fill = p->synthetic ? ellm_context_fill_synthetic(ctx_cmp, d, 1234 + (uint64_t)d, &err)
                                    : (d > 0 ? ellm_decode(ctx_cmp, ids, d, NULL, &err) : ELLM_OK);
            if (fill != ELLM_OK) {
                fprintf(stderr, "error: --kv-compare: %s\n", err.msg);
                goto done;
            }
            ellm_context_truncate(ctx, d);
            if (!time_alternating(ctx, ctx_cmp, 0, ids, n_ctx, d, (int)n_tokens, step_ms, base_ms)) goto done;
            p->ab_ms = median_sort(step_ms, (int)n_tokens);
            p->cmp_ms = median_sort(base_ms, (int)n_tokens);
        }
        if (sparse_topk > 0) {
            bench_point *q = &spts[i];
            *q = *p;
            q->step_ms = samples + (size_t)(n_depths + i) * n_tokens;
            progress("sparse decode at depth ", d);
            ellm_context_truncate(ctx, d);
            ellm_context_set_sparse(ctx, (int)sparse_topk, NULL);
            ellm_context_stats s0, s1;
            ellm_context_get_stats(ctx, &s0);
            double t0 = ellm_time_ms();
            if (!time_alternating(ctx, ctx0, 1, ids, n_ctx, d, (int)n_tokens, step_ms, base_ms)) goto done;
            double total = ellm_time_ms() - t0;
            set_latency(q, step_ms, (int)n_tokens);
            q->vs_empty = median_sort(base_ms, (int)n_tokens) / q->ms_median;
            ellm_context_get_stats(ctx, &s1);
            ellm_context_set_sparse(ctx, 0, NULL);
            q->select_fraction = total > 0 ? (s1.select_ms - s0.select_ms) / total : 0;
            q->index_ratio = s1.index_flat_bytes - s0.index_flat_bytes > 0
                                 ? (s1.index_bytes_read - s0.index_bytes_read) / (s1.index_flat_bytes - s0.index_flat_bytes)
                                 : 0;
            double kv_tokens = d + 1 + n_tokens / 2.0;
            if (kv_tokens > sparse_topk) kv_tokens = (double)sparse_topk;
            q->bytes_per_token = (double)info.decode_weight_bytes + (double)kv_per_token * kv_tokens +
                                 (s1.index_bytes_read - s0.index_bytes_read) / (double)n_tokens;
            q->gbps = gbps_of(q->bytes_per_token, q->ms_median);
            q->bw_fraction = bw > 0 ? q->gbps / bw : 0;
        }
        if (spec) {
            progress("speculative draft and verify at depth ", d);
            ellm_context_truncate(ctx, d);
            double draft_ms = time_draft_step(ctx, spec_state, spec_smp, ids, n_ctx, d);
            if (draft_ms < 0) goto spec_fail;
            ellm_context_set_sparse(ctx, 0, NULL);
            memset(&specd[i], 0, sizeof specd[i]);
            specd[i].draft_ms = draft_ms;
            /* re-pick k with the draft cost */
            double a = ellm_spec_token_acceptance(spec_tpv_given, (int)spec_kmax);
            if (best_draft_length(ctx, ids, d, (int)spec_kmax, a, &specd[i]) < 0) goto spec_fail;
            if (sparse_topk > 0) {
                ellm_context_set_sparse(ctx, (int)sparse_topk, NULL);
                specs[i] = specd[i];
                int failed = best_draft_length(ctx, ids, d, (int)spec_kmax, a, &specs[i]);
                ellm_context_set_sparse(ctx, 0, NULL);
                if (failed < 0) goto spec_fail;
            }
            continue;
        spec_fail:
            fprintf(stderr, "error: speculative timing at depth %d failed\n", d);
            goto done;
        }
    }
    if (isatty(2)) fprintf(stderr, "\r\033[K");

    /* Projection of an N-token generation from an empty context. */
    double proj_s = 0, roof_s = 0;
    for (long t = 0; t < gen; t++) {
        proj_s += latency_at(pts, n_depths, (double)t) / 1000.0;
        roof_s += ((double)info.decode_weight_bytes + (double)kv_per_token * t) / (bw * 1e9);
    }

    if (json) {
        printf("{\"engine\": \"ellm\", \"model\": \"%s\", \"arch\": \"%s\", \"threads\": %d, \"isa\": \"%s\", "
               "\"kv_type\": \"%s\", \"weight_bytes_per_token\": %llu, \"kv_bytes_per_token\": %zu, "
               "\"bandwidth_gbps\": %.3f, \"bandwidth_gbps_1t\": %.3f, \"probe_read_gbps\": %.3f, "
               "\"probe_saved\": %s, \"probe_age_s\": %.0f, \"points\": [",
               model_path, info.arch, nt, ellm_isa_name(), ellm_kv_type_name((ellm_kv_type)kv_f32),
               (unsigned long long)info.decode_weight_bytes, kv_per_token, bw, bw1, probe_bw,
               probe_saved ? "true" : "false", probe_saved ? probe_age_s : 0.0);
        for (int i = 0; i < n_depths; i++) {
            printf("%s{\"depth\": %d, \"mode\": \"dense\", \"synthetic_kv\": %s, \"tokens_per_s\": %.3f, "
                   "\"ms_per_token\": %.4f, \"bytes_per_token\": %.0f, \"gbps\": %.3f, \"bw_fraction\": %.4f, "
                   "\"probe_fraction\": %.4f",
                   i ? ", " : "", pts[i].depth, pts[i].synthetic ? "true" : "false", pts[i].tokens_per_s,
                   pts[i].ms_median, pts[i].bytes_per_token, pts[i].gbps, pts[i].bw_fraction,
                   probe_bw > 0 ? pts[i].gbps / probe_bw : 0);
            printf(", \"bw_paired_fraction\": %.4f, \"bw_paired_gbps\": %.3f, \"rounds\": [", pts[i].paired_fraction,
                   pts[i].paired_bw);
            for (int r = 0; r < pts[i].n_rounds; r++)
                printf("%s{\"bw_gbps\": %.3f, \"ms_median\": %.4f, \"bw_fraction\": %.4f}", r ? ", " : "",
                       pts[i].round_bw[r], pts[i].round_ms[r], pts[i].round_fraction[r]);
            printf("], \"split\": {\"forward_ms\": %.4f, \"matmul_ms\": %.4f, \"matmul_gbps\": %.3f, "
                   "\"attention_ms\": %.4f, \"attention_gbps\": %.3f, \"output_ms\": %.4f, \"output_gbps\": %.3f, "
                   "\"other_ms\": %.4f}",
                   pts[i].fwd_ms, pts[i].mm_ms, gbps_of(pts[i].mm_bytes, pts[i].mm_ms), pts[i].att_ms,
                   gbps_of(pts[i].att_bytes, pts[i].att_ms), pts[i].out_ms,
                   gbps_of(pts[i].out_bytes, pts[i].out_ms),
                   pts[i].fwd_ms - pts[i].mm_ms - pts[i].att_ms - pts[i].out_ms);
            if (ctx_cmp)
                printf(", \"kv_compare\": \"%s\", \"interleaved_ms_per_token\": %.4f, "
                       "\"kv_compare_ms_per_token\": %.4f, \"speedup_vs_kv_compare\": %.3f",
                       ellm_kv_type_name((ellm_kv_type)kv_cmp), pts[i].ab_ms, pts[i].cmp_ms,
                       pts[i].cmp_ms / pts[i].ab_ms);
            print_steps(pts[i].step_ms, (int)n_tokens);
        }
        for (int i = 0; i < n_depths && sparse_topk > 0; i++) {
            printf(", {\"depth\": %d, \"mode\": \"sparse\", \"sparse_topk\": %ld, \"synthetic_kv\": %s, "
                   "\"tokens_per_s\": %.3f, \"ms_per_token\": %.4f, \"bytes_per_token\": %.0f, \"gbps\": %.3f, "
                   "\"bw_fraction\": %.4f, \"select_fraction\": %.4f, \"index_bytes_ratio\": %.4f, "
                   "\"speedup_vs_dense\": %.3f, \"vs_empty_context\": %.3f",
                   spts[i].depth, sparse_topk, spts[i].synthetic ? "true" : "false", spts[i].tokens_per_s,
                   spts[i].ms_median, spts[i].bytes_per_token, spts[i].gbps, spts[i].bw_fraction,
                   spts[i].select_fraction, spts[i].index_ratio, spts[i].tokens_per_s / pts[i].tokens_per_s,
                   spts[i].vs_empty);
            print_steps(spts[i].step_ms, (int)n_tokens);
        }
        for (int i = 0; i < n_depths && spec; i++) {
            printf(", {\"depth\": %d, \"mode\": \"spec:%s\", \"synthetic_kv\": %s, \"draft_step_ms\": %.4f, "
                   "\"verify_ms\": %.4f, \"draft_max\": %d, \"tokens_per_verify\": %.3f, \"tokens_per_s\": %.3f, "
                   "\"speedup_vs_dense\": %.3f}",
                   pts[i].depth, spec, pts[i].synthetic ? "true" : "false", specd[i].draft_ms, specd[i].verify_ms,
                   specd[i].k, specd[i].tpv, specd[i].tokens_per_s, specd[i].tokens_per_s / pts[i].tokens_per_s);
            if (sparse_topk > 0)
                printf(", {\"depth\": %d, \"mode\": \"spec-sparse:%s\", \"sparse_topk\": %ld, \"synthetic_kv\": %s, "
                       "\"draft_step_ms\": %.4f, \"verify_ms\": %.4f, \"draft_max\": %d, \"tokens_per_verify\": %.3f, "
                       "\"tokens_per_s\": %.3f, \"speedup_vs_sparse\": %.3f}",
                       pts[i].depth, spec, sparse_topk, pts[i].synthetic ? "true" : "false", specs[i].draft_ms,
                       specs[i].verify_ms, specs[i].k, specs[i].tpv, specs[i].tokens_per_s,
                       specs[i].tokens_per_s / spts[i].tokens_per_s);
        }
        printf("], \"prefill\": [");
        for (int i = 0; i < n_prefills; i++) {
            printf("%s{\"tokens\": %d, \"tokens_per_s\": %.2f, \"samples_tps\": [", i ? ", " : "", pre[i].tokens,
                   pre[i].tokens_per_s);
            for (int r = 0; r < prefill_reps; r++) printf("%s%.2f", r ? ", " : "", pre[i].samples[r]);
            printf("]}");
        }
        printf("], \"projection\": {\"gen_tokens\": %ld, \"seconds\": %.2f, \"roofline_seconds\": %.2f, "
               "\"ratio_to_roofline\": %.3f}}\n",
               gen, proj_s, roof_s, roof_s > 0 ? proj_s / roof_s : 0);
    } else {
        printf("model: %s (%s, %.1f M params)  isa: %s  threads: %d  kv: %s\n", model_path, info.arch,
               info.n_params / 1e6, ellm_isa_name(), nt, ellm_kv_type_name((ellm_kv_type)kv_f32));
        printf("weights read per token: %.1f MB   KV per token of context: %.1f KB\n",
               info.decode_weight_bytes / 1e6, kv_per_token / 1e3);
        printf("memory read bandwidth: %.1f GB/s (1 thread), %.1f GB/s (%d threads)\n\n", bw1, bw, nt);
        printf("%8s  %-6s %9s %10s %11s %9s %8s\n", "depth", "mode", "tok/s", "ms/token", "MB/token", "GB/s",
               "of bw");
        for (int i = 0; i < n_depths; i++)
            printf("%8d  %-6s %9.2f %10.3f %11.2f %9.2f %7.0f%%%s\n", pts[i].depth, "dense",
                   pts[i].tokens_per_s, pts[i].ms_median, pts[i].bytes_per_token / 1e6, pts[i].gbps,
                   100 * pts[i].bw_fraction, pts[i].synthetic ? "  (synthetic KV)" : "");
        printf("%8s  %-6s paired: each round of %d steps against the bandwidth read just before it\n", "", "",
               ROUND_STEPS - 1);
        for (int i = 0; i < n_depths; i++) {
            double lo = 1e9, hi = 0, blo = 1e9, bhi = 0;
            for (int r = 0; r < pts[i].n_rounds; r++) {
                const double f = pts[i].round_fraction[r], b = pts[i].round_bw[r];
                lo = f < lo ? f : lo;
                hi = f > hi ? f : hi;
                blo = b < blo ? b : blo;
                bhi = b > bhi ? b : bhi;
            }
            printf("%8d  %-6s %7.0f%% of %.1f GB/s (medians of %d rounds; rounds %.0f-%.0f%% of reads of %.1f-%.1f "
                   "GB/s)\n",
                   pts[i].depth, "paired", 100 * pts[i].paired_fraction, pts[i].paired_bw, pts[i].n_rounds, 100 * lo,
                   100 * hi, blo, bhi);
        }
        printf("%8s  %-6s where a timed step goes: mean ms of each part (GB/s it reads)\n", "", "");
        for (int i = 0; i < n_depths; i++)
            printf("%8d  %-6s layers' matmuls %.3f (%.1f)  attention %.3f (%.1f)  output %.3f (%.1f)  other %.3f\n",
                   pts[i].depth, "split", pts[i].mm_ms, gbps_of(pts[i].mm_bytes, pts[i].mm_ms), pts[i].att_ms,
                   gbps_of(pts[i].att_bytes, pts[i].att_ms), pts[i].out_ms,
                   gbps_of(pts[i].out_bytes, pts[i].out_ms),
                   pts[i].fwd_ms - pts[i].mm_ms - pts[i].att_ms - pts[i].out_ms);
        for (int i = 0; i < n_depths && ctx_cmp; i++)
            printf("%8d  %-6s %9.2f %10.3f   alternating with a %s cache: %.3f ms against %.3f ms, x%.2f\n",
                   pts[i].depth, "kv-ab", 1000.0 / pts[i].ab_ms, pts[i].ab_ms, ellm_kv_type_name((ellm_kv_type)kv_cmp),
                   pts[i].ab_ms, pts[i].cmp_ms, pts[i].cmp_ms / pts[i].ab_ms);
        for (int i = 0; i < n_depths && sparse_topk > 0; i++)
            printf("%8d  %-6s %9.2f %10.3f %11.2f %9.2f %7.0f%%  x%.2f vs dense, x%.2f vs empty context, "
                   "selection %.1f%% of step, index bytes %.0f%% of flat%s\n",
                   spts[i].depth, "sparse", spts[i].tokens_per_s, spts[i].ms_median, spts[i].bytes_per_token / 1e6,
                   spts[i].gbps, 100 * spts[i].bw_fraction, spts[i].tokens_per_s / pts[i].tokens_per_s,
                   spts[i].vs_empty, 100 * spts[i].select_fraction, 100 * spts[i].index_ratio,
                   spts[i].synthetic ? "  (synthetic KV)" : "");
        for (int i = 0; i < n_depths && spec; i++) {
            printf("%8d  %-6s %9.2f   spec:%s, best k %d at %.2f tokens/verify (given %.2f at k=%ld): draft step %.3f ms, "
                   "verify of k+1 %.3f ms, x%.2f vs dense%s%s\n",
                   pts[i].depth, "spec", specd[i].tokens_per_s, spec, specd[i].k, specd[i].tpv, spec_tpv_given, spec_kmax,
                   specd[i].draft_ms, specd[i].verify_ms, specd[i].tokens_per_s / pts[i].tokens_per_s,
                   specd[i].tokens_per_s < pts[i].tokens_per_s ? "; run --spec takes plain steps here" : "",
                   pts[i].synthetic ? "  (synthetic KV)" : "");
            if (sparse_topk > 0)
                printf("%8d  %-6s %9.2f   spec over sparse verify: best k %d, verify %.3f ms, x%.2f vs sparse\n",
                       pts[i].depth, "spec+s", specs[i].tokens_per_s, specs[i].k, specs[i].verify_ms,
                       specs[i].tokens_per_s / spts[i].tokens_per_s);
        }
        for (int i = 0; i < n_prefills; i++)
            printf("prefill %d tokens: %.1f tokens/s\n", pre[i].tokens, pre[i].tokens_per_s);
        if (probe_bw > 0) {
            /* the age: a figure measured on a busy machine stays low until the probe runs again */
            char age[64];
            if (probe_saved) {
                probe_age_text(probe_age_s, age, sizeof age);
                printf("share of the %.1f GB/s `ellm probe` %s (all nodes), dense decode:", probe_bw, age);
            } else {
                printf("share of the %.1f GB/s read now as `ellm probe` does (all nodes; `ellm probe` keeps its "
                       "result for later runs), dense decode:",
                       probe_bw);
            }
            for (int i = 0; i < n_depths; i++) printf(" %d: %.0f%%", pts[i].depth, 100 * pts[i].gbps / probe_bw);
            printf("\nplacement: %s\n", info.placement);
        }
        printf("\nprojected %ld-token generation: %.1f s (roofline at %.1f GB/s: %.1f s, ratio %.2f)\n", gen,
               proj_s, bw, roof_s, roof_s > 0 ? proj_s / roof_s : 0);
    }
    rc = 0;
done:
    free(ids);
    free(step_ms);
    free(base_ms);
    free(samples);
    free(rounds);
    free(meter.buf);
    if (meter.pool) threadpool_free(meter.pool);
    ellm_spec_free(spec_state);
    ellm_sampler_free(spec_smp);
    ellm_context_free(ctx0);
    ellm_context_free(ctx_cmp);
    ellm_context_free(ctx);
    ellm_model_free(model);
    return rc;
}
