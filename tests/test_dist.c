/* KV cache sharded over MPI ranks.
 *
 * In process: the binned merge of partial states gives the same integers for
 * any split of the parts into groups and on every ISA, and the exact merge
 * to float accuracy; attention computed part by part
 * (attention_forward_parts, any subset of parts at a time, as ranks would)
 * and merged with attention_merge_parts gives attention_forward's bits.
 *
 * Under mpirun (skipped, and counted, where mpirun is missing): `ellm logits
 * --mpi` with 1, 2 and 3 ranks writes the same bytes as one process, over a
 * context of three parts (2 PT + 76 tokens, PT the tokens of a part), batched prefill and
 * decode steps that open a new part; each rank stores only its parts; the
 * same for sparse attention, whose selections (a digest of every block list)
 * also match one process's; what reads every key (--sparse-adapt) is refused
 * with a message; a rank that hangs or exits makes the
 * job stop with an error instead of hanging. Runs $ELLM_BIN (default build/ellm). */
#include "harness.h"

#include "attention/attention.h"
#include "attention/kv_cache.h"
#include "core/cpu.h"
#include "core/threadpool.h"
#include "kernels/quant.h"

#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Tokens of one attention part at the 16-token blocks these tests use. */
#define PT (ATTENTION_PART_BLOCKS * 16)
/* Tokens of the MPI runs' context: three parts, the last one partly filled. */
#define N_IDS (2 * PT + 76)

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) from 53 bits */
    return (float)((test_xorshift64(&rng) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* attention_select_fn handing out fixed lists. */
typedef struct {
    const int32_t *lists;
    const int *n;
    int max;
} fixed_lists;

static void select_fixed(void *arg, int kv_head, int thread, int32_t *blocks, int *n_blocks) {
    const fixed_lists *fl = arg;
    (void)thread;
    *n_blocks = fl->n[kv_head];
    memcpy(blocks, fl->lists + (size_t)kv_head * fl->max, (size_t)*n_blocks * sizeof *blocks);
}

/* One layer, n_kv KV heads, a cache of n tokens filled with random keys and
 * values; for query batches at several positions, parts merged equal
 * attention_forward bit for bit, whether computed all at once or in R
 * interleaved subsets (part c in subset c mod R), on 1 or 2 threads; and the
 * same for sparse block lists against attention_forward_blocks and the
 * selection job's attention. */
static void test_parts_merge(void) {
    const int n_kv = 2, group = 3, n_head = n_kv * group, hd = 64, n_ctx = 2 * PT + 276, max_q = 40;
    ellm_error err;
    kv_cache_params p = {.n_layer = 1, .n_kv_head = n_kv, .head_dim = hd, .n_ctx = n_ctx, .block_tokens = 16,
                         .type = QTYPE_F16};
    kv_cache *kv = NULL;
    attention_workspace *ws = NULL;
    threadpool *pool = NULL;
    if (kv_cache_init(&p, &kv, &err) || attention_workspace_init(2, max_q, n_head, hd, n_ctx, 16, &ws, &err) ||
        threadpool_init(2, 0, &pool, &err)) {
        CHECK(0, "setup: %s", err.msg);
        return;
    }
    float *k = malloc((size_t)n_ctx * n_kv * hd * sizeof(float));
    float *v = malloc((size_t)n_ctx * n_kv * hd * sizeof(float));
    float *q = malloc((size_t)max_q * n_head * hd * sizeof(float));
    float *ref = malloc((size_t)max_q * n_head * hd * sizeof(float));
    float *got = malloc((size_t)max_q * n_head * hd * sizeof(float));
    enum { max_list = (2 * PT + 276) / 16 + 1 }; /* >= blocks of the cache */
    int32_t lists[2 * max_list];
    int n_list[2];
    for (size_t i = 0; i < (size_t)n_ctx * n_kv * hd; i++) {
        k[i] = frand() * 2.0f;
        v[i] = frand();
    }
    kv_cache_store(kv, 0, 0, n_ctx, k, v);
    kv_cache_set_len(kv, n_ctx);
    const int cases[][2] = {{1, 0},       {1, PT - 1},          {1, PT},           {1, 2 * PT + 275},
                             {16, PT - 12}, {40, 2 * PT - 24}, {37, 2 * PT + 176}, {5, 2 * PT + 6}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int n_q = cases[ci][0], pos0 = cases[ci][1];
        for (size_t i = 0; i < (size_t)n_q * n_head * hd; i++) q[i] = frand();
        attention_args a = {.kv = kv, .layer = 0, .n_q = n_q, .q_pos0 = pos0, .n_head = n_head, .q = q,
                            .out = ref, .scale = 0.125f};
        attention_forward(&a, ws, pool);
        const int n_tiles = attention_n_tiles(&a);
        const long n_rec = attention_part_first(&a, n_tiles);
        float **recs = calloc((size_t)n_rec, sizeof *recs);
        float **sub = calloc((size_t)n_rec, sizeof *sub);
        for (int t = 0; t < n_tiles; t++)
            for (int c = 0; c < attention_tile_parts(&a, t); c++)
                recs[attention_part_first(&a, t) + c] = malloc(attention_part_floats(&a, t) * sizeof(float));
        for (int R = 1; R <= 3; R++) {
            for (int th = 0; th < 2; th++) {
                for (int r = 0; r < R; r++) {
                    for (int t = 0; t < n_tiles; t++)
                        for (int c = 0; c < attention_tile_parts(&a, t); c++) {
                            long i = attention_part_first(&a, t) + c;
                            sub[i] = c % R == r ? recs[i] : NULL;
                        }
                    attention_forward_parts(&a, NULL, NULL, 0, sub, ws, th ? pool : NULL);
                }
                memset(got, 0xff, (size_t)n_q * n_head * hd * sizeof(float));
                attention_args b = a;
                b.out = got;
                attention_merge_parts(&b, (const float *const *)recs, th ? pool : NULL);
                CHECK(!memcmp(got, ref, (size_t)n_q * n_head * hd * sizeof(float)),
                      "n_q %d at %d: parts of %d subsets merged on %d threads differ from attention_forward", n_q,
                      pos0, R, th + 1);
            }
        }
        CHECK(n_rec == (long)n_tiles * ((pos0 + n_q + PT - 1) / PT) || n_tiles > 1,
              "one tile at %d+%d: %ld parts", pos0, n_q, n_rec);
        /* sparse: ascending lists of about a third of the visible blocks
         * (the last always), some heads missing whole parts; one process's
         * attention_forward_blocks and, for a decode-sized batch, the
         * selection job's attention are the references */
        const int n_vis = (pos0 + n_q + 15) / 16;
        for (int h = 0; h < n_kv; h++) {
            int nb = 0;
            for (int b = 0; b < n_vis; b++)
                if (b == n_vis - 1 || (frand() > 0.35f && !(h == 1 && b / 32 == 1)))
                    lists[h * max_list + nb++] = b;
            n_list[h] = nb;
        }
        attention_forward_blocks(&a, lists, n_list, max_list, ws, pool);
        if (n_q <= 16) {
            attention_args b = a;
            b.out = got;
            int32_t sel[2 * 128];
            int sel_n[2];
            fixed_lists fl = {lists, n_list, max_list};
            attention_forward_select(&b, select_fixed, &fl, sel, sel_n, max_list, ws, pool);
            CHECK(!memcmp(got, ref, (size_t)n_q * n_head * hd * sizeof(float)),
                  "n_q %d at %d: sparse selection job differs from attention_forward_blocks", n_q, pos0);
        }
        for (int R = 1; R <= 3; R++) {
            for (int r = 0; r < R; r++) {
                for (int t = 0; t < n_tiles; t++)
                    for (int c = 0; c < attention_tile_parts(&a, t); c++) {
                        long i = attention_part_first(&a, t) + c;
                        sub[i] = c % R == r ? recs[i] : NULL;
                    }
                attention_forward_parts(&a, lists, n_list, max_list, sub, ws, r % 2 ? pool : NULL);
            }
            memset(got, 0xff, (size_t)n_q * n_head * hd * sizeof(float));
            attention_args b = a;
            b.out = got;
            attention_merge_parts(&b, (const float *const *)recs, pool);
            CHECK(!memcmp(got, ref, (size_t)n_q * n_head * hd * sizeof(float)),
                  "n_q %d at %d: sparse parts of %d subsets merged differ from attention_forward_blocks", n_q, pos0,
                  R);
        }
        for (long i = 0; i < n_rec; i++) free(recs[i]);
        free(recs);
        free(sub);
    }
    free(k);
    free(v);
    free(q);
    free(ref);
    free(got);
    threadpool_free(pool);
    attention_workspace_free(ws);
    kv_cache_free(kv);
}

/* ---- the binned merge ------------------------------------------------------ */

/* Random partials of one row: scores spread over +-40 nats, values of mixed
 * magnitude, some parts that saw no key. */
static void random_partials(int np, int hd, float *m, float *l, float *acc) {
    for (int i = 0; i < np; i++) {
        m[i] = i % 7 == 3 ? -INFINITY : 40.0f * frand();
        l[i] = 1.0f + 50.0f * (frand() + 1.0f);
        const float scale = powf(2.0f, 12.0f * frand());
        for (int d = 0; d < hd; d++) acc[(size_t)i * hd + d] = l[i] * scale * frand();
    }
}

/* Sums of parts [p0, p1) on their own grid. */
static void group_sums(int p0, int p1, int hd, const float *m, const float *l, const float *acc,
                       attention_lse_bound *b, attention_lse_grid *g, int64_t *sum) {
    attention_lse_bound_init(b);
    for (int i = p0; i < p1; i++) attention_lse_bound_add(b, i, m[i], l[i], acc + (size_t)i * hd, hd);
    attention_lse_grid_init(g, b);
    memset(sum, 0, ATTENTION_LSE_SUMS(hd) * sizeof *sum);
    for (int i = p0; i < p1; i++) attention_lse_sum(g, m[i], l[i], acc + (size_t)i * hd, hd, sum);
}

/* attention_lse_*: the sums of any split of the parts into two groups,
 * each on its own bins, rebased and added, equal the sums of all parts at
 * once (so ranks may add their own parts); the scalar and AVX-512 deposits
 * give the same integers; the result is the exact merge to float accuracy. */
static void test_binned_merge(void) {
    enum { NP = 40, HD = 67 };
    float m[NP], l[NP], acc[NP * HD], out[HD];
    int64_t all[ATTENTION_LSE_SUMS(HD)], a[ATTENTION_LSE_SUMS(HD)], b[ATTENTION_LSE_SUMS(HD)];
    int grouped_ok = 1, isa_ok = 1, close_ok = 1, trials = 0;
    const ellm_isa isa0 = ellm_cpu_isa();
    const int have512 = ellm_cpu()->best == ELLM_ISA_AVX512;
    for (int trial = 0; trial < 200; trial++) {
        const int np = 2 + trial % (NP - 1);
        random_partials(np, HD, m, l, acc);
        attention_lse_bound ball, ba, bb;
        attention_lse_grid gall, ga, gb;
        group_sums(0, np, HD, m, l, acc, &ball, &gall, all);
        if (have512) {
            int64_t other[ATTENTION_LSE_SUMS(HD)];
            ellm_cpu_set_isa(isa0 == ELLM_ISA_AVX512 ? ELLM_ISA_SCALAR : ELLM_ISA_AVX512);
            group_sums(0, np, HD, m, l, acc, &ba, &ga, other);
            ellm_cpu_set_isa(isa0);
            isa_ok &= !memcmp(other, all, sizeof all);
        }
        for (int cut = 1; cut < np; cut += 1 + np / 5) {
            group_sums(0, cut, HD, m, l, acc, &ba, &ga, a);
            group_sums(cut, np, HD, m, l, acc, &bb, &gb, b);
            attention_lse_bound both = ba;
            attention_lse_bound_merge(&both, &bb);
            attention_lse_grid g;
            attention_lse_grid_init(&g, &both);
            attention_lse_rebase(&ga, &g, a, HD);
            attention_lse_rebase(&gb, &g, b, HD);
            for (int i = 0; i < ATTENTION_LSE_SUMS(HD); i++) a[i] += b[i];
            grouped_ok &= !memcmp(a, all, sizeof all) && !memcmp(&both, &ball, sizeof both);
            trials++;
        }
        /* against the merge in long double */
        attention_lse_out(&gall, all, HD, out);
        float M = -INFINITY;
        for (int i = 0; i < np; i++) M = m[i] > M ? m[i] : M;
        long double L = 0;
        for (int i = 0; i < np; i++)
            if (m[i] != -INFINITY) L += expl((long double)m[i] - M) * l[i];
        for (int d = 0; d < HD; d++) {
            long double A = 0, mag = 0;
            for (int i = 0; i < np; i++)
                if (m[i] != -INFINITY) {
                    A += expl((long double)m[i] - M) * acc[(size_t)i * HD + d];
                    mag += expl((long double)m[i] - M) * fabsl((long double)acc[(size_t)i * HD + d]);
                }
            /* error relative to the terms' magnitude: float rounding of e_i, 2^-40 of the largest term */
            close_ok &= fabsl((long double)out[d] - A / L) <= 1e-6L * mag / L + 1e-30L;
        }
    }
    CHECK(grouped_ok, "binned merge: two groups rebased and added differ from all parts at once (%d splits)", trials);
    CHECK(isa_ok, "binned merge: the AVX-512 and scalar deposits give different sums");
    if (!have512) printf("note: no AVX-512 here: the binned deposits were compared on the scalar path only\n");
    CHECK(close_ok, "binned merge: the result is not the exact merge to float accuracy");
}

/* ---- under mpirun ---------------------------------------------------------- */

/* `cmd` with stdout and stderr into out; as test_shell. */
static int sh(const char *cmd, char *out, size_t cap) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    return test_shell(full, out, cap);
}

/* libmpi keeps allocations until exit: no leak reports from it under ASan */
#define MPIRUN "ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 timeout 120 mpirun --oversubscribe --allow-run-as-root --bind-to none"

static int have_mpirun(void) { return system("command -v mpirun >/dev/null 2>&1") == 0; }

static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = test_read_file(a, &na), *y = test_read_file(b, &nb);
    int same = x && y && na == nb && na > 0 && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

static void test_mpi(void) {
    if (!have_mpirun()) {
        SKIP("mpirun not found: MPI sharding tests not run (tools/install-deps.sh installs openmpi-bin)");
        return;
    }
    char model[512], ids[128], one[128], got[128], cmd[2048], out[16384];
    snprintf(model, sizeof model, "%s/models/llama-gqa.gguf", test_data_dir());
    snprintf(ids, sizeof ids, "/tmp/ellm_test_dist_ids.%d", (int)getpid());
    snprintf(one, sizeof one, "/tmp/ellm_test_dist_one.%d", (int)getpid());
    snprintf(got, sizeof got, "/tmp/ellm_test_dist_got.%d", (int)getpid());
    FILE *f = fopen(ids, "w");
    if (!f) {
        CHECK(0, "cannot write %s", ids);
        return;
    }
    for (int i = 0; i < N_IDS; i++) fprintf(f, "%d ", 1 + (int)((frand() + 1.0f) * 1000.0f) % 2000);
    fclose(f);

    /* one process, no MPI: the reference */
    snprintf(cmd, sizeof cmd, "%s logits -m %s --ids %s -o %s -t 1", test_ellm_bin(), model, ids, one);
    int rc = sh(cmd, out, sizeof out);
    CHECK(rc == 0, "single process: exit %d: %s", rc, out);

    /* R ranks: batches that straddle parts, then decode steps from 2 PT - 24
     * on, which open part 2 (positions 2 PT..) on rank 2 mod R */
    const struct {
        int np, batch, decode_from, stores;
    } runs[] = {{1, N_IDS, N_IDS, N_IDS}, {2, 100, 2 * PT - 24, PT + 76}, {3, 64, 2 * PT - 24, PT}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        remove(got);
        snprintf(cmd, sizeof cmd, MPIRUN " -np %d %s logits --mpi -m %s --ids %s -o %s -t 1 -b %d --decode-from %d",
                 runs[i].np, test_ellm_bin(), model, ids, got, runs[i].batch, runs[i].decode_from);
        rc = sh(cmd, out, sizeof out);
        CHECK(rc == 0, "%d ranks: exit %d: %s", runs[i].np, rc, out);
        CHECK(same_file(one, got), "%d ranks: logits differ from one process's", runs[i].np);
        char want[128];
        snprintf(want, sizeof want, "mpi: %d ranks, rank 0 stores %d of %d positions", runs[i].np, runs[i].stores, N_IDS);
        CHECK(strstr(out, want) != NULL, "%d ranks: want '%s' in: %s", runs[i].np, want, out);
    }

    /* bench --mpi: per-layer exchange figures of a sharded decode */
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 %s bench --mpi -m %s --depths 0,%d -n 4 -t 1 --json", test_ellm_bin(), model,
             PT + 88);
    rc = sh(cmd, out, sizeof out);
    char want_depth[64], want_rank0[64];
    snprintf(want_depth, sizeof want_depth, "\"depth\": %d", PT + 88);
    snprintf(want_rank0, sizeof want_rank0, "\"rank0_tokens\": %d", PT);
    CHECK(rc == 0 && strstr(out, "\"ranks\": 2") && strstr(out, want_depth) && strstr(out, want_rank0),
          "bench --mpi: exit %d: %s", rc, out);
    const char *bp = strstr(out, "\"bytes_per_step\": ");
    CHECK(bp && atof(bp + 18) > 0, "bench --mpi: no bytes per step in: %s", out);
    CHECK(strstr(out, "\"kv_type\": \"f16\""), "bench --mpi: the default KV type is not f16 in: %s", out);
    /* --kv-type q8_0 runs a Q8_0 cache (it ran an F32 one); with a sparse budget it is refused */
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 %s bench --mpi -m %s --depths %d -n 2 -t 1 --kv-type q8_0 --json",
             test_ellm_bin(), model, PT);
    rc = sh(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "\"kv_type\": \"q8_0\""), "bench --mpi --kv-type q8_0: exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 %s bench --mpi -m %s --depths %d -n 2 -t 1 --kv-type q8_0 --sparse-topk 64",
             test_ellm_bin(), model, PT);
    rc = sh(cmd, out, sizeof out);
    CHECK(rc != 0 && strstr(out, "q8_0 KV cache sharded over MPI ranks is not supported"),
          "bench --mpi --kv-type q8_0 --sparse-topk: exit %d: %s", rc, out);

    /* sparse: each rank chooses from its copy of the index and attends to
     * the chosen blocks it holds; the same blocks (digest of every list) and
     * the same logits as one process, for batches of one selection each
     * (100 tokens), batches run token by token (20) and decode steps */
    const struct {
        int np, batch, decode_from;
    } sp[] = {{2, 100, 2 * PT - 24}, {3, 100, 2 * PT - 24}, {3, 20, 2 * PT + 16}};
    char one_sp[160], digest[64] = "";
    snprintf(one_sp, sizeof one_sp, "%s.sparse", one);
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        if (i == 0 || sp[i].batch != sp[i - 1].batch) { /* one process with the same batches: the reference */
            snprintf(cmd, sizeof cmd, "%s logits -m %s --ids %s -o %s -t 1 -b %d --decode-from %d --sparse-topk 128",
                     test_ellm_bin(), model, ids, one_sp, sp[i].batch, sp[i].decode_from);
            rc = sh(cmd, out, sizeof out);
            const char *d = strstr(out, "blocks digest ");
            CHECK(rc == 0 && d && !strstr(out, " 0 selections"), "sparse, one process: exit %d: %s", rc, out);
            snprintf(digest, sizeof digest, "%.30s", d ? d : "none");
            CHECK(!same_file(one, one_sp), "sparse logits equal dense ones: sparse attention did not run");
        }
        remove(got);
        snprintf(cmd, sizeof cmd,
                 MPIRUN " -np %d %s logits --mpi -m %s --ids %s -o %s -t 1 -b %d --decode-from %d --sparse-topk 128",
                 sp[i].np, test_ellm_bin(), model, ids, got, sp[i].batch, sp[i].decode_from);
        rc = sh(cmd, out, sizeof out);
        CHECK(rc == 0, "sparse, %d ranks: exit %d: %s", sp[i].np, rc, out);
        CHECK(strstr(out, digest) != NULL, "sparse, %d ranks, batch %d: want '%s' (one process's) in: %s", sp[i].np,
              sp[i].batch, digest, out);
        CHECK(same_file(one_sp, got), "sparse, %d ranks, batch %d: logits differ from one process's", sp[i].np,
              sp[i].batch);
    }
    remove(one_sp);
    /* what reads every key cannot run on a shard: refused with a message */
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 %s run --mpi -m %s -p hello -n 4 -t 1 --sparse-topk 64 --sparse-adapt",
             test_ellm_bin(), model);
    rc = sh(cmd, out, sizeof out);
    CHECK(rc != 0 && strstr(out, "read every key"), "sparse-adapt with --mpi: exit %d: %s", rc, out);

    /* a rank that stops answering: the others give up after --mpi-timeout */
    snprintf(cmd, sizeof cmd,
             "ELLM_MPI_FAULT=hang,1,5 " MPIRUN " -np 2 %s logits --mpi --mpi-timeout 3 -m %s --ids %s -o %s -t 1 -b 100",
             test_ellm_bin(), model, ids, got);
    rc = sh(cmd, out, sizeof out);
    CHECK(rc != 0 && rc != 124 && strstr(out, "no answer from the other ranks within 3 s"),
          "hanging rank: exit %d: %s", rc, out);
    /* a rank that exits: the job stops with a non-zero status, not a hang */
    snprintf(cmd, sizeof cmd,
             "ELLM_MPI_FAULT=exit,1,5 " MPIRUN " -np 2 %s logits --mpi --mpi-timeout 30 -m %s --ids %s -o %s -t 1 -b 100",
             test_ellm_bin(), model, ids, got);
    rc = sh(cmd, out, sizeof out);
    CHECK(rc != 0 && rc != 124, "exiting rank: exit %d: %s", rc, out);
    remove(ids);
    remove(one);
    remove(got);
}

int main(void) {
    test_binned_merge();
    test_parts_merge();
    test_mpi();
    return test_finish();
}
