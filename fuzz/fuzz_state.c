/* libFuzzer target: state files (`ellm run --save-state` / `--resume`, the
 * server's slot save/restore), src/engine/state.c and src/cli/run_state.c.
 *
 * Input: one selector byte, then a whole state file. The selector picks the
 * context the file is loaded into (bit 0: Q8_0 KV instead of F16, bit 1: a
 * sparse index). Checksums protect a state against random corruption, so a
 * mutated file would almost always stop at the first CRC; the harness sets
 * the header's file size and recomputes the header's and every section's
 * CRC-32C (where the section's length fits the file) before loading, so the
 * parsers behind the checksums are reached: lengths, shapes, flags, the KV
 * blocks, the sparse budgets and the run's settings.
 *
 * Then, as `ellm run --resume` does: ellm_state_read_app, run_state_decode
 * of those bytes, and for settings that decode a context and a sampler made
 * from them (context sizes capped for speed); ellm_context_state_load into a
 * context of the tiny llama-gqa Q8_0 fixture; after a load that succeeds, a
 * decode step and a sample from its logits. Any status is fine for a bad
 * file, as long as it leaves a message, and a failed load leaves the context
 * empty or as it was; crashes, leaks and sanitizer reports are bugs.
 *
 * Seeds: FUZZ_STATE_SEEDS=DIR ./fuzz_state -runs=0 writes real state files
 * of each context kind (after a prompt and a few decoded tokens) into DIR.
 * The model comes from $ELLM_FUZZ_DATA (default tests/data). */
#include "fuzz_common.h"

#include "cli/run_state.h"
#include "core/crc32c.h"
#include "ellm.h"

#include <stdint.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static ellm_model *g_model;
static char g_path[128];
static int g_vocab;

static ellm_context *make_context(int sel, int n_ctx) {
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = 8;
    cp.n_threads = 1;
    cp.kv_type = sel & 1 ? ELLM_KV_Q8_0 : ELLM_KV_F16;
    cp.sparse_topk = sel & 2 ? 32 : 0;
    cp.sparse_window = sel & 2 ? 16 : cp.sparse_window;
    ellm_context *ctx = NULL;
    ellm_error err = {0};
    if (ellm_context_init(g_model, &cp, &ctx, &err) != ELLM_OK) {
        fprintf(stderr, "fuzz_state: context: %s\n", err.msg);
        abort();
    }
    return ctx;
}

/* A state of context kind `sel` after a prompt and some decoded tokens, with
 * an `ellm run` settings section, into dir/state-<sel>. */
static void write_seed(const char *dir, int sel) {
    ellm_context *ctx = make_context(sel, 96);
    ellm_error err = {0};
    int32_t toks[70];
    for (int i = 0; i < 70; i++) toks[i] = (int32_t)((i * 37 + 5) % g_vocab);
    FUZZ_CHECK(ellm_decode(ctx, toks, 8, NULL, &err) == ELLM_OK, "%s", err.msg);
    for (int i = 8; i < 70; i++) FUZZ_CHECK(ellm_decode(ctx, toks + i, 1, NULL, &err) == ELLM_OK, "%s", err.msg);
    run_state rs = {0};
    rs.model = "model.gguf";
    rs.kv_f32 = sel & 1 ? ELLM_KV_Q8_0 : ELLM_KV_F16;
    rs.n_predict = 90;
    rs.threads = 1;
    rs.batch = 8;
    rs.n_ctx = 96;
    rs.sp = ellm_sampler_default_params();
    rs.sparse_topk = sel & 2 ? 32 : 0;
    rs.sparse_window = 16;
    rs.overflow = 1;
    rs.keep = 4;
    rs.prompt = "abc";
    rs.prompt_len = 3;
    rs.n_prompt = 8;
    rs.n_tokens = 70;
    rs.tokens = toks;
    rs.save_every = 10;
    unsigned char *app = NULL;
    size_t app_len = 0;
    FUZZ_CHECK(run_state_encode(&rs, &app, &app_len), "encode");
    char path[1024];
    snprintf(path, sizeof path, "%s/state-%d", dir, sel);
    FUZZ_CHECK(ellm_context_state_save(ctx, path, app, app_len, &err) == ELLM_OK, "%s", err.msg);
    /* the harness's input: the selector byte, then the file */
    FILE *f = fopen(path, "rb");
    FUZZ_CHECK(f != NULL, "%s", path);
    static unsigned char buf[1 << 22];
    size_t n = fread(buf + 1, 1, sizeof buf - 1, f);
    fclose(f);
    buf[0] = (unsigned char)sel;
    f = fopen(path, "wb");
    FUZZ_CHECK(f && fwrite(buf, 1, n + 1, f) == n + 1, "%s", path);
    fclose(f);
    free(app);
    ellm_context_free(ctx);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("ELLM_ISA", "scalar", 1);
    const char *dir = getenv("ELLM_FUZZ_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/llama-gqa-Q8_0.gguf", dir && *dir ? dir : "tests/data");
    ellm_model_params mp = {.n_threads = 1, .pin_threads = 0};
    ellm_error err = {0};
    if (ellm_model_load(path, &mp, &g_model, &err) != ELLM_OK) {
        fprintf(stderr, "fuzz_state: %s: %s (set ELLM_FUZZ_DATA)\n", path, err.msg);
        abort();
    }
    ellm_model_info info;
    ellm_model_get_info(g_model, &info);
    g_vocab = info.n_vocab;
    snprintf(g_path, sizeof g_path, "/dev/shm/ellm-fuzz-state-%d", (int)getpid());
    const char *seeds = getenv("FUZZ_STATE_SEEDS");
    if (seeds && *seeds)
        for (int sel = 0; sel < 4; sel++) write_seed(seeds, sel);
    return 0;
}

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The header's size and CRC, and each section's CRC where it fits. */
static void fix_checksums(uint8_t *f, size_t n) {
    if (n < 32 || memcmp(f, "ELLMSTAT", 8)) return;
    const uint64_t total = n;
    memcpy(f + 16, &total, 8);
    const uint32_t hcrc = crc32c_update(0, f, 28);
    memcpy(f + 28, &hcrc, 4);
    size_t off = 32;
    for (uint32_t s = 0; s < rd32(f + 12) && s < 16 && n - off >= 16; s++) {
        const uint64_t len = rd64(f + off + 8);
        if (len > n - off - 16 || n - off - 16 - len < 4) return;
        const uint32_t crc = crc32c_update(0, f + off, 16 + (size_t)len);
        memcpy(f + off + 16 + len, &crc, 4);
        off += 16 + (size_t)len + 4;
    }
}

/* `ellm run --resume`'s use of the settings: a context and a sampler. */
static void use_settings(const void *app, size_t app_len) {
    run_state rs;
    char msg[256] = {0};
    if (!run_state_decode(app, app_len, &rs, msg, sizeof msg)) {
        FUZZ_CHECK(msg[0] != 0, "a refused settings section leaves a message");
        return;
    }
    ellm_error err = {0};
    ellm_context_params cp = ellm_context_default_params();
    cp.kv_type = (ellm_kv_type)rs.kv_f32;
    cp.n_threads = 1;
    cp.n_batch = (int)rs.batch;
    cp.n_ctx = rs.n_ctx > 256 ? 256 : (int)rs.n_ctx; /* speed: the size itself is checked by the context */
    cp.sparse_topk = (int)rs.sparse_topk;
    cp.sparse_window = (int)rs.sparse_window;
    cp.sparse_sink_blocks = (int)rs.sparse_sink;
    cp.sparse_dense_layers = (int)rs.sparse_dense;
    cp.sparse_recall_every = (int)rs.sparse_recall;
    cp.sparse_adapt = rs.sparse_adapt;
    ellm_context *ctx = NULL;
    if (cp.n_batch <= 256 && ellm_context_init(g_model, &cp, &ctx, &err) == ELLM_OK) {
        int32_t tok[2] = {1, 2};
        if (ellm_decode(ctx, tok, 2, NULL, &err) == ELLM_OK) {
            ellm_sampler *smp = NULL;
            if (ellm_sampler_init(&rs.sp, g_vocab, &smp, &err) == ELLM_OK) {
                ellm_sampler_set_state(smp, &rs.rng);
                const int n_hist = rs.n_tokens < 64 ? (int)rs.n_tokens : 64;
                int32_t id = ellm_sampler_sample(smp, ellm_context_logits(ctx), rs.tokens, n_hist);
                FUZZ_CHECK(id >= 0 && id < g_vocab, "sampled id %d outside the vocabulary", id);
                ellm_sampler_free(smp);
            } else {
                FUZZ_CHECK(err.msg[0] != 0, "a refused sampler leaves a message");
            }
        }
        ellm_context_free(ctx);
    } else if (cp.n_batch <= 256) {
        FUZZ_CHECK(ctx == NULL && err.msg[0] != 0, "a refused context leaves a message and no context");
    }
    run_state_free(&rs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int sel = data[0] & 3;
    uint8_t *f = malloc(size);
    if (!f) return 0;
    memcpy(f, data + 1, size - 1);
    fix_checksums(f, size - 1);
    FILE *out = fopen(g_path, "wb");
    if (!out) {
        free(f);
        return 0;
    }
    fwrite(f, 1, size - 1, out);
    fclose(out);
    free(f);

    ellm_error err = {0};
    void *app = NULL;
    size_t app_len = 0;
    if (ellm_state_read_app(g_path, &app, &app_len, &err) == ELLM_OK) {
        use_settings(app, app_len);
        ellm_free(app);
    } else {
        FUZZ_CHECK(app == NULL && err.msg[0] != 0, "a refused file leaves a message and no settings");
    }

    ellm_context *ctx = make_context(sel, 96);
    int32_t first = 3;
    FUZZ_CHECK(ellm_decode(ctx, &first, 1, NULL, &err) == ELLM_OK, "%s", err.msg);
    memset(&err, 0, sizeof err);
    if (ellm_context_state_load(ctx, g_path, &err) == ELLM_OK) {
        const int pos = ellm_context_pos(ctx);
        FUZZ_CHECK(pos >= 0 && pos <= 96, "position %d after a load", pos);
        int32_t next = 5;
        if (pos < 96 && ellm_decode(ctx, &next, 1, NULL, &err) == ELLM_OK) {
            const float *logits = ellm_context_logits(ctx);
            volatile float sum = 0;
            for (int i = 0; i < g_vocab; i++) sum += logits[i];
            (void)sum;
        }
    } else {
        const int pos = ellm_context_pos(ctx);
        FUZZ_CHECK(err.msg[0] != 0, "a failed load leaves a message");
        FUZZ_CHECK(pos == 0 || pos == 1, "a failed load left position %d (not empty, not as it was)", pos);
    }
    ellm_context_free(ctx);
    unlink(g_path);
    return 0;
}
