/* Continuous batching: a sequence decoded among others in one pass
 * (ellm_decode_batch) gets exactly the logits it gets alone (ellm_decode),
 * bit for bit, whatever else is in the pass: decode rows, prefill chunks or
 * nothing. Checked on weight types with different matmul kernels. */
#include "attention/attention.h"
#include "core/timer.h"
#include "ellm.h"
#include "harness.h"

#include <stdint.h>
#include <string.h>

#define N_SEQ 5
#define N_GEN 10
/* Prompt chunk sizes: up to 16 rows a sequence's attention runs on one
 * thread of the pass; longer chunks run theirs on the whole pool, reading
 * the rows in the batch's scratch. */
#define CHUNK 16
#define CHUNK_WIDE 40
#define THREADS 2

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(test_xorshift64(&rng_state) >> 11); }

/* Each of n_seq sequences alone in its own context: its prompt (n_prompt[i]
 * ids at prompt + i * stride) prefilled, then n_gen greedy tokens. The logits
 * (V) before generated token g of sequence i go to solo[(i * n_gen + g) * V],
 * the token to gen[i * n_gen + g]. */
static void run_alone(ellm_model *m, const ellm_context_params *cp, int n_seq, const int32_t *prompt, int stride,
                      const int *n_prompt, int n_gen, int V, float *solo, int32_t *gen) {
    ellm_error err = {0};
    for (int i = 0; i < n_seq; i++) {
        ellm_context *ctx = NULL;
        CHECK(ellm_context_init(m, cp, &ctx, &err) == ELLM_OK, "%s", err.msg);
        if (!ctx) continue;
        CHECK(ellm_decode(ctx, prompt + (size_t)i * stride, n_prompt[i], NULL, &err) == ELLM_OK, "%s", err.msg);
        for (int g = 0; g < n_gen; g++) {
            const float *lg = ellm_context_logits(ctx);
            int32_t *tok = &gen[i * n_gen + g];
            memcpy(solo + ((size_t)i * n_gen + g) * V, lg, (size_t)V * sizeof *lg);
            *tok = test_argmax(lg, V);
            ellm_decode(ctx, tok, 1, NULL, &err);
        }
        ellm_context_free(ctx);
    }
}

/* The model at path with THREADS threads and its vocabulary size; NULL after
 * a failed check. */
static ellm_model *load(const char *path, int *n_vocab) {
    ellm_model_params mp = {.n_threads = THREADS, .pin_threads = 0};
    ellm_model *m = test_load_model(path, &mp);
    if (m) {
        ellm_model_info info;
        ellm_model_get_info(m, &info);
        *n_vocab = info.n_vocab;
    }
    return m;
}

static void check_model(const char *path, int chunk) {
    ellm_error err = {0};
    int V;
    ellm_model *m = load(path, &V);
    if (!m) return;
    int n_prompt[N_SEQ] = {1, 7, 16, 33, 50};
    int32_t prompt[N_SEQ][64];
    for (int i = 0; i < N_SEQ; i++)
        for (int t = 0; t < n_prompt[i]; t++) prompt[i][t] = (int32_t)(rnd() % (uint32_t)V);

    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 128;
    cp.n_batch = chunk;
    cp.n_threads = THREADS;
    cp.sparse_topk = -1;
    /* alone: prefill in chunk-token passes, then greedy decode */
    float *solo = malloc((size_t)N_SEQ * N_GEN * V * sizeof *solo);
    int32_t gen[N_SEQ][N_GEN];
    run_alone(m, &cp, N_SEQ, prompt[0], 64, n_prompt, N_GEN, V, solo, gen[0]);

    /* together: sequence i joins at step 2 i, so prefill chunks share passes
     * with decode rows of the others */
    ellm_batch *b = NULL;
    CHECK(ellm_batch_init(m, THREADS, N_SEQ * chunk, &b, &err) == ELLM_OK, "%s", err.msg);
    ellm_context *ctx[N_SEQ] = {0};
    for (int i = 0; i < N_SEQ && b; i++)
        CHECK(ellm_batch_context_init(b, &cp, &ctx[i], &err) == ELLM_OK, "%s", err.msg);
    int fed[N_SEQ] = {0}, n_gen[N_SEQ] = {0}, mismatches = 0, max_rows_seen = 0;
    const double t_loop = ellm_time_ms();
    for (int step = 0; b && step < 200; step++) {
        ellm_context *run[N_SEQ];
        const int32_t *tok[N_SEQ];
        int n[N_SEQ], ns = 0, rows = 0;
        for (int i = 0; i < N_SEQ; i++) {
            if (!ctx[i] || step < 2 * i || n_gen[i] >= N_GEN) continue;
            run[ns] = ctx[i];
            if (fed[i] < n_prompt[i]) {
                int c = n_prompt[i] - fed[i] < chunk ? n_prompt[i] - fed[i] : chunk;
                tok[ns] = prompt[i] + fed[i];
                n[ns] = c;
            } else {
                tok[ns] = &gen[i][n_gen[i] - 1];
                n[ns] = 1;
            }
            rows += n[ns++];
        }
        if (!ns) break;
        if (rows > max_rows_seen) max_rows_seen = rows;
        if (ellm_decode_batch(b, run, tok, n, ns, &err) != ELLM_OK) {
            CHECK(0, "decode batch: %s", err.msg);
            break;
        }
        for (int i = 0, k = 0; i < N_SEQ; i++) {
            if (k >= ns || run[k] != ctx[i]) continue;
            if (fed[i] < n_prompt[i]) fed[i] += n[k];
            if (fed[i] >= n_prompt[i]) {
                const float *lg = ellm_context_logits(ctx[i]);
                if (memcmp(lg, solo + ((size_t)i * N_GEN + n_gen[i]) * V, (size_t)V * sizeof *lg)) mismatches++;
                n_gen[i]++;
            }
            k++;
        }
    }
    int done = 1;
    for (int i = 0; i < N_SEQ; i++) done &= n_gen[i] == N_GEN;
    CHECK(done, "%s: every sequence generated %d tokens", path, N_GEN);
    CHECK(mismatches == 0, "%s: %d logit rows differ from the sequence alone", path, mismatches);
    CHECK(max_rows_seen > chunk, "%s: passes mixed prefill and decode rows (max %d rows)", path, max_rows_seen);
    /* each context's time split covers the batched passes it took part in:
     * every part measured, the parts within the passes' wall time, and that
     * within the loop's */
    const double loop_ms = ellm_time_ms() - t_loop;
    int bad_split = 0;
    for (int i = 0; i < N_SEQ && b; i++) {
        ellm_context_stats st;
        ellm_context_get_stats(ctx[i], &st);
        const double parts = st.matmul_ms + st.attention_ms + st.output_ms;
        bad_split += !(st.matmul_ms > 0 && st.attention_ms > 0 && st.output_ms > 0) ||
                     !(parts <= st.forward_ms * (1 + 1e-9)) || !(st.forward_ms <= loop_ms) ||
                     st.decode_steps != (int64_t)n_gen[i] + (n_prompt[i] + chunk - 1) / chunk - 1;
    }
    CHECK(bad_split == 0, "%s: %d contexts' time split or pass count off (loop %.1f ms)", path, bad_split, loop_ms);

    /* bad input is refused without feeding anything */
    if (b && ctx[0]) {
        int pos = ellm_context_pos(ctx[0]);
        int32_t bad_tok = V;
        const int32_t *tp[2] = {&bad_tok, &bad_tok};
        int one[2] = {1, 1};
        ellm_context *twice[2] = {ctx[0], ctx[0]};
        CHECK(ellm_decode_batch(b, ctx, tp, one, 1, &err) == ELLM_ERR_ARG, "token out of vocabulary refused");
        CHECK(ellm_decode_batch(b, twice, tp, one, 2, &err) == ELLM_ERR_ARG, "context listed twice refused");
        int too_many = chunk + 1;
        CHECK(ellm_decode_batch(b, ctx, tp, &too_many, 1, &err) == ELLM_ERR_ARG, "more than n_batch refused");
        CHECK(ellm_context_pos(ctx[0]) == pos, "nothing fed on error");
        ellm_context *own = NULL;
        ellm_context_init(m, &cp, &own, &err);
        ellm_context *foreign[1] = {own};
        CHECK(own && ellm_decode_batch(b, foreign, tp, one, 1, &err) == ELLM_ERR_ARG, "foreign context refused");
        ellm_context_free(own);
    }
    for (int i = 0; i < N_SEQ; i++) ellm_context_free(ctx[i]);
    ellm_batch_free(b);
    free(solo);
    ellm_model_free(m);
}

/* Sequences deeper than one attention part (DEEP_PT positions) decoding together:
 * each one's attention then runs on one thread of the pass (the others taking
 * other sequences) and merges several parts there; the logits must still be
 * those of the sequence alone. */
#define DEEP_SEQ 3
#define DEEP_GEN 3
#define DEEP_PT (ATTENTION_PART_BLOCKS * 16)
#define DEEP_MAX (2 * DEEP_PT + 76) /* the longest prompt */
static void check_deep(const char *path) {
    ellm_error err = {0};
    int V;
    ellm_model *m = load(path, &V);
    if (!m) return;
    const int n_prompt[DEEP_SEQ] = {DEEP_PT + 18, DEEP_MAX, DEEP_PT + 98};
    int32_t *prompt = malloc(sizeof(int32_t) * DEEP_SEQ * DEEP_MAX);
    for (int i = 0; i < DEEP_SEQ * DEEP_MAX; i++) prompt[i] = (int32_t)(rnd() % (uint32_t)V);
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = DEEP_MAX + 100;
    cp.n_batch = 64;
    cp.n_threads = THREADS;
    cp.sparse_topk = -1;
    float *solo = malloc((size_t)DEEP_SEQ * DEEP_GEN * V * sizeof *solo);
    int32_t gen[DEEP_SEQ][DEEP_GEN];
    run_alone(m, &cp, DEEP_SEQ, prompt, DEEP_MAX, n_prompt, DEEP_GEN, V, solo, gen[0]);
    ellm_batch *b = NULL;
    CHECK(ellm_batch_init(m, THREADS, DEEP_SEQ * 64, &b, &err) == ELLM_OK, "%s", err.msg);
    ellm_context *ctx[DEEP_SEQ] = {0};
    int mismatches = 0, ok = b != NULL;
    for (int i = 0; ok && i < DEEP_SEQ; i++) {
        ok = ellm_batch_context_init(b, &cp, &ctx[i], &err) == ELLM_OK;
        for (int f = 0; ok && f < n_prompt[i]; f += 64) { /* each prompt alone, in chunks */
            const int32_t *tp = prompt + i * DEEP_MAX + f;
            int n = n_prompt[i] - f < 64 ? n_prompt[i] - f : 64;
            ok = ellm_decode_batch(b, &ctx[i], &tp, &n, 1, &err) == ELLM_OK;
        }
    }
    for (int g = 0; ok && g < DEEP_GEN; g++) {
        for (int i = 0; i < DEEP_SEQ; i++)
            if (memcmp(ellm_context_logits(ctx[i]), solo + ((size_t)i * DEEP_GEN + g) * V, (size_t)V * 4)) mismatches++;
        const int32_t *tok[DEEP_SEQ];
        int one[DEEP_SEQ];
        for (int i = 0; i < DEEP_SEQ; i++) {
            tok[i] = &gen[i][g];
            one[i] = 1;
        }
        if (g + 1 < DEEP_GEN) ok = ellm_decode_batch(b, ctx, tok, one, DEEP_SEQ, &err) == ELLM_OK;
    }
    CHECK(ok, "%s: deep batched decode ran: %s", path, err.msg);
    CHECK(mismatches == 0, "%s: %d logit rows of sequences at %d-%d positions differ from alone", path, mismatches,
          DEEP_PT + 18, DEEP_MAX);
    for (int i = 0; i < DEEP_SEQ; i++) ellm_context_free(ctx[i]);
    ellm_batch_free(b);
    free(solo);
    free(prompt);
    ellm_model_free(m);
}

/* ellm_context_copy_prefix: a context that takes another's first n - 1
 * prompt positions and feeds the last token itself has the logits of the
 * context that computed the whole prompt, bit for bit, and generates the
 * same tokens (F16 and Q8_0 caches); contexts with a sparse index or another
 * cache type are refused. */
static void check_copy_prefix(const char *path) {
    int V = 0;
    ellm_model *m = load(path, &V);
    if (!m) return;
    ellm_error err = {0};
    enum { NP = 75, NG = 12 };
    int32_t prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(1 + rnd() % (uint32_t)(V - 1));
    for (int q = 0; q < 2; q++) {
        ellm_context_params cp = ellm_context_default_params();
        cp.n_ctx = NP + NG + 8;
        cp.kv_type = q ? ELLM_KV_Q8_0 : ELLM_KV_F16;
        cp.sparse_topk = -1; /* dense-only: no index (a server's dense slots) */
        ellm_context *a = NULL, *b = NULL;
        CHECK(ellm_context_init(m, &cp, &a, &err) == ELLM_OK && ellm_context_init(m, &cp, &b, &err) == ELLM_OK, "%s",
              err.msg);
        if (!a || !b) {
            ellm_context_free(a);
            ellm_context_free(b);
            continue;
        }
        CHECK(ellm_decode(b, prompt, 9, NULL, &err) == ELLM_OK, "%s", err.msg); /* b held something else */
        CHECK(ellm_decode(a, prompt, NP, NULL, &err) == ELLM_OK, "%s", err.msg);
        CHECK(ellm_context_copy_prefix(b, a, NP - 1, &err) == ELLM_OK && ellm_context_pos(b) == NP - 1, "copy: %s",
              err.msg);
        CHECK(ellm_decode(b, prompt + NP - 1, 1, NULL, &err) == ELLM_OK, "%s", err.msg);
        int same = !memcmp(ellm_context_logits(a), ellm_context_logits(b), (size_t)V * sizeof(float));
        for (int g = 0; g < NG && same; g++) {
            int32_t ta = test_argmax(ellm_context_logits(a), V), tb = test_argmax(ellm_context_logits(b), V);
            ellm_decode(a, &ta, 1, NULL, &err);
            ellm_decode(b, &tb, 1, NULL, &err);
            same = ta == tb && !memcmp(ellm_context_logits(a), ellm_context_logits(b), (size_t)V * sizeof(float));
        }
        CHECK(same, "%s, %s KV: logits after a copied prefix equal the computed ones, and %d greedy steps after", path,
              q ? "q8_0" : "f16", NG);
        CHECK(ellm_context_copy_prefix(b, a, ellm_context_pos(a) + 1, &err) == ELLM_ERR_ARG, "beyond src's position");
        ellm_context_free(a);
        ellm_context_free(b);
    }
    /* a sparse context, and caches of different types */
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 64;
    cp.sparse_topk = -1;
    ellm_context *d = NULL, *sp = NULL, *q8 = NULL;
    ellm_context_init(m, &cp, &d, &err);
    cp.kv_type = ELLM_KV_Q8_0;
    ellm_context_init(m, &cp, &q8, &err);
    cp.kv_type = ELLM_KV_F16;
    cp.sparse_topk = 16;
    ellm_context_init(m, &cp, &sp, &err);
    if (d && sp && q8) {
        ellm_decode(d, prompt, 20, NULL, &err);
        ellm_decode(sp, prompt, 20, NULL, &err);
        CHECK(ellm_context_copy_prefix(d, sp, 10, &err) == ELLM_ERR_UNSUPPORTED &&
                  ellm_context_copy_prefix(sp, d, 10, &err) == ELLM_ERR_UNSUPPORTED,
              "a sparse index: refused");
        CHECK(ellm_context_copy_prefix(q8, d, 10, &err) == ELLM_ERR_ARG, "another cache type: refused");
    }
    ellm_context_free(d);
    ellm_context_free(sp);
    ellm_context_free(q8);
    ellm_model_free(m);
}

int main(void) {
    char path[512];
    const char *models[] = {"llama-gqa.gguf", "llama-gqa-Q8_0.gguf", "llama-gqa-Q4_K_M.gguf", "qwen3-qknorm.gguf"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        snprintf(path, sizeof path, "%s/models/%s", test_data_dir(), models[i]);
        check_model(path, CHUNK);
    }
    check_model("models/evalmodel.gguf", CHUNK);
    snprintf(path, sizeof path, "%s/models/llama-gqa-Q8_0.gguf", test_data_dir());
    check_model(path, CHUNK_WIDE);
    snprintf(path, sizeof path, "%s/models/qwen3-qknorm.gguf", test_data_dir());
    check_model(path, CHUNK_WIDE);
    snprintf(path, sizeof path, "%s/models/llama-gqa-Q8_0.gguf", test_data_dir());
    check_deep(path);
    check_deep("models/evalmodel.gguf");
    check_copy_prefix("models/evalmodel.gguf");
    snprintf(path, sizeof path, "%s/models/llama-gqa-Q8_0.gguf", test_data_dir());
    check_copy_prefix(path);
    return test_finish();
}
