/* Batch-row exactness at model level: the logits of ellm_decode over N tokens
 * at once (or in chunks) equal, bit for bit, those of N single-token decodes,
 * dense and with sparse attention (sparse: batches of up to 32 tokens, the
 * verification sizes), whatever the thread counts, at every ISA
 * level, for every fixture model (all weight types) and for the evaluation
 * model at a depth where attention runs in several parts. Speculative
 * verification and batched serving rely on it. */
#include "core/cpu.h"
#include "ellm.h"
#include "harness.h"

#include <string.h>

static const char *FIXTURES[] = {
    "llama-gqa",      "llama-untied-ropefreqs", "qwen2-bias",     "qwen3-qknorm",     "llama-gqa-F16",
    "llama-gqa-BF16", "llama-gqa-Q8_0",         "llama-gqa-Q4_0", "llama-gqa-Q5_0",   "llama-gqa-Q4_K_M",
    "llama-gqa-Q5_K_M", "llama-gqa-Q6_K",         "llama-gqa-Q4_1", "llama-gqa-Q5_1",   "llama-gqa-IQ4_NL",
    "llama-gqa-IQ4_XS", "llama-gqa-Q3_K_M", "llama-gqa-Q2_K",
};

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { return (uint32_t)(test_xorshift64(&g_rng) >> 32); }

/* Logits of `n` tokens fed `chunk` at a time (1: token by token) into a fresh
 * context with `threads` threads and sparse budget `topk` (0: dense). */
static float *run(ellm_model *m, const int32_t *toks, int n, int chunk, int threads, int topk) {
    ellm_model_info info;
    ellm_model_get_info(m, &info);
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n;
    cp.n_batch = chunk;
    cp.n_threads = threads;
    cp.sparse_topk = topk;
    cp.sparse_window = 16;
    ellm_context *ctx = NULL;
    ellm_error err;
    if (ellm_context_init(m, &cp, &ctx, &err) != ELLM_OK) {
        CHECK(0, "context: %s", err.msg);
        return NULL;
    }
    float *out = malloc((size_t)n * info.n_vocab * sizeof(float));
    ellm_status st = ELLM_OK;
    for (int i = 0; i < n && st == ELLM_OK; i += chunk) {
        int k = n - i < chunk ? n - i : chunk;
        st = ellm_decode(ctx, toks + i, k, out + (size_t)i * info.n_vocab, &err);
    }
    CHECK(st == ELLM_OK, "decode: %s", err.msg);
    ellm_context_free(ctx);
    return out;
}

/* Rows of a and b (n rows of n_vocab) that differ in any bit. */
static int rows_differ(const float *a, const float *b, int n, int n_vocab) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += memcmp(a + (size_t)i * n_vocab, b + (size_t)i * n_vocab, (size_t)n_vocab * sizeof(float)) != 0;
    return bad;
}

/* Single-token decodes (1 thread) against a whole batch and a chunked one
 * (2 threads; the attention tests vary threads further), dense and sparse. */
static void check_model(const char *name, const char *path, int n, int topk, int all_isas, int keep_layout) {
    ellm_model_params mp = {.n_threads = 2, .pin_threads = 0, .keep_layout = keep_layout};
    ellm_model *m = test_load_model(path, &mp);
    if (!m) return;
    ellm_model_info info;
    ellm_model_get_info(m, &info);
    int32_t *toks = malloc((size_t)n * sizeof *toks);
    for (int i = 0; i < n; i++) toks[i] = (int32_t)(rnd() % (uint32_t)info.n_vocab);
    ellm_isa best = ellm_cpu()->best;
    for (ellm_isa isa = all_isas ? ELLM_ISA_SCALAR : best; isa <= best; isa++) {
        ellm_cpu_set_isa(isa);
        for (int sparse = 0; sparse < 2; sparse++) {
            int k = sparse ? topk : 0;
            float *one = run(m, toks, n, 1, 1, k);
            /* one batch of all n (dense only: longer sparse batches, prefill
             * chunks, share one block selection per tile by design) */
            float *all = sparse ? NULL : run(m, toks, n, n, 2, k);
            float *chunked = run(m, toks, n, 17, 2, k); /* verification-sized batches */
            if (one && chunked && (all || sparse)) {
                int d1 = all ? rows_differ(one, all, n, info.n_vocab) : 0;
                int d2 = rows_differ(one, chunked, n, info.n_vocab);
                CHECK(d1 == 0 && d2 == 0,
                      "%s %s %s: %d of %d rows of one batch and %d of 17-token batches differ from single-token "
                      "decodes",
                      name, ellm_isa_str(isa), sparse ? "sparse" : "dense", d1, n, d2);
                printf("%-24s %-6s %-6s n=%d%s: batched rows %s\n", name, ellm_isa_str(isa),
                       sparse ? "sparse" : "dense", n, keep_layout ? " (file layout)" : "",
                       d1 || d2 ? "DIFFER" : "bit-identical");
            }
            free(one);
            free(all);
            free(chunked);
        }
    }
    ellm_cpu_set_isa(best);
    free(toks);
    ellm_model_free(m);
}

int main(void) {
    for (size_t i = 0; i < sizeof FIXTURES / sizeof *FIXTURES; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/models/%s.gguf", test_data_dir(), FIXTURES[i]);
        /* budget 48 (the floor with a 16-token window) < 96 positions */
        check_model(FIXTURES[i], path, 96, 48, 1, 0);
        /* Q8_0 weights are interleaved at load on CPUs with AVX2 or AVX-512:
         * the file's layout and its kernels as well */
        if (strstr(FIXTURES[i], "Q8_0")) check_model(FIXTURES[i], path, 96, 48, 1, 1);
    }
    /* 800 positions: attention in two parts, sparse selection over 50 blocks */
    check_model("evalmodel", "models/evalmodel.gguf", 800, 256, 0, 0);
    return test_finish();
}
