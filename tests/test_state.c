/* Resumable generation: the CRC, saving and restoring a context (KV, logits,
 * sparse index rebuilt equal, continuation bit for bit), clear errors for a
 * state of another model, truncated and corrupted files, and `ellm run`
 * killed with SIGKILL at random points then resumed giving exactly the
 * uninterrupted output (greedy, seeded sampling, sparse). */
#include "harness.h"

#include "attention/sparse_index_internal.h"
#include "core/crc32c.h"
#include "engine/engine_impl.h"
#include "kernels/kernels.h"

#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void test_crc(void) {
    CHECK(crc32c_update(0, "123456789", 9) == 0xE3069283u, "crc32c check value %08x",
          crc32c_update(0, "123456789", 9));
    CHECK(crc32c_update_ref(0, "123456789", 9) == 0xE3069283u, "reference check value");
    unsigned char buf[1000];
    uint64_t x = 42;
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)((x = x * 6364136223846793005ull + 1) >> 56);
    for (size_t n = 0; n <= 40; n++) {
        uint32_t a = crc32c_update(0, buf + 3, n), b = crc32c_update_ref(0, buf + 3, n);
        CHECK(a == b, "crc32c of %zu bytes: %08x vs reference %08x", n, a, b);
    }
    /* in pieces = at once */
    uint32_t whole = crc32c_update(0, buf, sizeof buf);
    uint32_t parts = crc32c_update(crc32c_update(0, buf, 333), buf + 333, sizeof buf - 333);
    CHECK(whole == parts && whole == crc32c_update_ref(0, buf, sizeof buf), "crc32c in pieces");
}

/* Greedy continuation of `ctx` by n tokens; writes them to out. */
static int greedy(ellm_context *ctx, int n, int32_t *out) {
    ellm_error err;
    const ellm_model_info *unused = NULL;
    (void)unused;
    int n_vocab = ctx->model->cfg.n_vocab;
    for (int i = 0; i < n; i++) {
        const float *lg = ellm_context_logits(ctx);
        int best = 0;
        for (int j = 1; j < n_vocab; j++)
            if (lg[j] > lg[best]) best = j;
        out[i] = best;
        if (ellm_decode(ctx, &out[i], 1, NULL, &err) != ELLM_OK) return 0;
    }
    return 1;
}

static int file_copy(const char *from, const char *to, size_t n_bytes) {
    size_t n;
    char *d = test_read_file(from, &n);
    FILE *f = fopen(to, "wb");
    int ok = d && f && fwrite(d, 1, n_bytes < n ? n_bytes : n, f) == (n_bytes < n ? n_bytes : n);
    if (f) fclose(f);
    free(d);
    return ok;
}

static void test_engine(void) {
    ellm_error err = {0};
    ellm_model *other = NULL;
    ellm_model *m = test_load_model("models/evalmodel.gguf", NULL);
    if (!m) return;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 2;
    cp.sparse_topk = 96; /* below the context: sparse steps run */
    cp.sparse_recall_every = 7;
    cp.sparse_adapt = 1;
    ellm_context *a = NULL, *b = NULL;
    CHECK(ellm_context_init(m, &cp, &a, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_context_init(m, &cp, &b, &err) == ELLM_OK, "%s", err.msg);
    int32_t prompt[64], ta[150], tb[150]; /* 150 - n generated, then 120 more */
    int n = 0;
    const char *text = "import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n";
    CHECK(ellm_tokenize(m, text, strlen(text), 1, 0, prompt, 64, &n, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_decode(a, prompt, n, NULL, &err) == ELLM_OK, "%s", err.msg);
    CHECK(greedy(a, 150 - n, ta), "decode");
    char path[640], model_copy[640], cut[640];
    snprintf(path, sizeof path, "%s", test_tmp_path("state.bin"));
    snprintf(model_copy, sizeof model_copy, "%s", test_tmp_path("state_model.gguf"));
    snprintf(cut, sizeof cut, "%s", test_tmp_path("state_cut.bin"));
    const char app[] = "caller bytes";
    CHECK(ellm_context_state_save(a, path, app, sizeof app, &err) == ELLM_OK, "save: %s", err.msg);
    void *got = NULL;
    size_t got_len = 0;
    CHECK(ellm_state_read_app(path, &got, &got_len, &err) == ELLM_OK && got_len == sizeof app &&
              !memcmp(got, app, sizeof app),
          "app bytes back: %s", err.msg);
    ellm_free(got);
    CHECK(ellm_context_state_load(b, path, &err) == ELLM_OK, "load: %s", err.msg);
    CHECK(ellm_context_pos(b) == 150, "pos %d", ellm_context_pos(b));
    CHECK(ellm_context_logits(b) && !memcmp(ellm_context_logits(a), ellm_context_logits(b), (size_t)m->cfg.n_vocab * 4),
          "logits restored");
    /* KV bytes of the held positions and every index summary equal */
    const model_config *c = &m->cfg;
    int kv_same = 1, sum_same = 1;
    float ka[256], kb[256], lo_a[256], hi_a[256], lo_b[256], hi_b[256];
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head_kv; h++) {
            for (int p = 0; p < 150; p++) {
                kv_cache_key(a->kv, l, h, p, ka);
                kv_cache_key(b->kv, l, h, p, kb);
                kv_same &= !memcmp(ka, kb, (size_t)c->head_dim * 4);
            }
            for (int level = 0; level < 2; level++)
                for (int i = 0; i < (level ? 1 : (150 + 15) / 16); i++) {
                    sparse_index_summary(a->sidx, l, h, level, i, lo_a, hi_a);
                    sparse_index_summary(b->sidx, l, h, level, i, lo_b, hi_b);
                    sum_same &= !memcmp(lo_a, lo_b, (size_t)c->head_dim * 4) &&
                                !memcmp(hi_a, hi_b, (size_t)c->head_dim * 4);
                }
        }
    CHECK(kv_same, "restored keys differ");
    CHECK(sum_same, "rebuilt sparse index summaries differ from the saved context's");
    size_t nlh = (size_t)c->n_layer * c->n_head_kv;
    CHECK(!memcmp(a->head_weight, b->head_weight, nlh * 4), "adapted head budgets restored");
    /* both continue identically, logits bit for bit */
    int same = 1;
    ellm_error e2;
    for (int i = 0; i < 120 && same; i++) {
        greedy(a, 1, &ta[i]);
        greedy(b, 1, &tb[i]);
        same = ta[i] == tb[i] && !memcmp(ellm_context_logits(a), ellm_context_logits(b), (size_t)c->n_vocab * 4);
    }
    (void)e2;
    CHECK(same, "continuation after restore differs");
    CHECK(a->stats.sparse_steps > 0 && a->stats.sparse_steps == b->stats.sparse_steps,
          "sparse steps %lld vs %lld", (long long)a->stats.sparse_steps, (long long)b->stats.sparse_steps);

    /* another model */
    if (ellm_model_load("tests/data/models/llama-gqa.gguf", NULL, &other, &err) == ELLM_OK) {
        ellm_context *o = NULL;
        ellm_context_params op = ellm_context_default_params();
        op.n_ctx = 256;
        CHECK(ellm_context_init(other, &op, &o, &err) == ELLM_OK, "%s", err.msg);
        ellm_status st = o ? ellm_context_state_load(o, path, &err) : ELLM_ERR_ARG;
        CHECK(st == ELLM_ERR_ARG && strstr(err.msg, "another model"), "other model: %d %s", st, err.msg);
        CHECK(o && ellm_context_pos(o) == 0, "a refused load leaves the context alone");
        ellm_context_free(o);
        ellm_model_free(other);
    } else {
        CHECK(0, "load llama-gqa: %s", err.msg);
    }
    /* same shape and metadata, other weights */
    size_t msize;
    char *mbytes = test_read_file("models/evalmodel.gguf", &msize);
    if (mbytes) {
        const gguf_tensor *t0 = gguf_tensor_at(m->file, 0);
        size_t data0 = (size_t)((const char *)t0->data - (const char *)gguf_base(m->file));
        for (int64_t i = 1; i < gguf_n_tensors(m->file); i++) {
            const gguf_tensor *t = gguf_tensor_at(m->file, i);
            size_t s = (size_t)((const char *)t->data - (const char *)gguf_base(m->file));
            if (s < data0) data0 = s;
        }
        mbytes[data0] ^= 0x01;
        FILE *f = fopen(model_copy, "wb");
        if (f) {
            fwrite(mbytes, 1, msize, f);
            fclose(f);
        }
        free(mbytes);
        ellm_model *twin = NULL;
        ellm_context *tc = NULL;
        if (ellm_model_load(model_copy, NULL, &twin, &err) == ELLM_OK &&
            ellm_context_init(twin, &cp, &tc, &err) == ELLM_OK) {
            ellm_status st = ellm_context_state_load(tc, path, &err);
            CHECK(st == ELLM_ERR_ARG && strstr(err.msg, "another model file"), "same-shape model: %d %s", st, err.msg);
        } else {
            CHECK(0, "twin model: %s", err.msg);
        }
        ellm_context_free(tc);
        ellm_model_free(twin);
        remove(model_copy);
    }

    /* truncated at several lengths, corrupted bytes at several places */
    struct stat sb;
    stat(path, &sb);
    size_t full = (size_t)sb.st_size;
    const size_t cuts[] = {0, 10, 32, 40, 200, full / 2, full - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        file_copy(path, cut, cuts[i]);
        ellm_status st = ellm_context_state_load(b, cut, &err);
        CHECK(st == ELLM_ERR_FORMAT && (strstr(err.msg, "truncated") || strstr(err.msg, "not an eLLM state")),
              "cut at %zu: %d %s", cuts[i], st, err.msg);
    }
    size_t n_all;
    char *all = test_read_file(path, &n_all);
    const size_t flips[] = {3, 20, 40, 60, 400, full / 2, full - 5, full - 1};
    for (size_t i = 0; all && i < sizeof flips / sizeof *flips; i++) {
        all[flips[i]] ^= 0x20;
        FILE *f = fopen(cut, "wb");
        fwrite(all, 1, n_all, f);
        fclose(f);
        all[flips[i]] ^= 0x20;
        ellm_status st = ellm_context_state_load(b, cut, &err);
        CHECK(st != ELLM_OK && (strstr(err.msg, "corrupted") || strstr(err.msg, "not an eLLM state") ||
                                strstr(err.msg, "truncated") || strstr(err.msg, "longer")),
              "byte %zu flipped: %d %s", flips[i], st, err.msg);
        CHECK(ellm_context_pos(b) == 0 || ellm_context_pos(b) == 150 + 120, "after a failed load: pos %d",
              ellm_context_pos(b));
    }
    free(all);
    /* not a state file at all */
    FILE *f = fopen(cut, "wb");
    fputs("this is plainly some text and not a state file, but it is long enough", f);
    fclose(f);
    CHECK(ellm_context_state_load(b, cut, &err) == ELLM_ERR_FORMAT &&
              strstr(err.msg, "not an eLLM state file"),
          "text file: %s", err.msg);
    CHECK(ellm_context_state_load(b, "/nonexistent/state", &err) == ELLM_ERR_IO && strstr(err.msg, "/nonexistent/state"),
          "missing file: %s", err.msg);
    remove(cut);
    remove(path);
    ellm_context_free(a);
    ellm_context_free(b);
    ellm_model_free(m);
}

/* The payload offset of section `tag` of the state file in buf (its length
 * in *len), or 0. */
static size_t section_at(const unsigned char *buf, size_t n, const char *tag, uint64_t *len) {
    size_t off = 32;
    while (off <= n && n - off >= 20) {
        uint64_t l;
        memcpy(&l, buf + off + 8, 8);
        if (l > n - off - 20) return 0;
        if (!memcmp(buf + off, tag, 4)) {
            *len = l;
            return off + 16;
        }
        off += 16 + (size_t)l + 4;
    }
    return 0;
}

/* buf (n bytes, a state file) with `bytes` of value written at offset `at`
 * of the section whose payload is [p, p + len) (none if value is NULL) and
 * that section's CRC-32C made right again, into path. */
static void write_resealed(const unsigned char *buf, size_t n, size_t p, uint64_t len, size_t at, const void *value,
                           size_t bytes, const char *path) {
    unsigned char *t = malloc(n);
    if (!t) return;
    memcpy(t, buf, n);
    if (value) memcpy(t + at, value, bytes);
    const uint32_t crc = crc32c_update(0, t + p - 16, 16 + (size_t)len);
    memcpy(t + p + len, &crc, 4);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(t, 1, n, f);
        fclose(f);
    }
    free(t);
}

/* The sparse section of a state (written by a context with an adapting
 * budget) with one value changed and its checksum made right again: values
 * no saver writes are refused by name, and the context keeps what it held. */
static void test_sparse_values(void) {
    ellm_error err = {0};
    ellm_model *m = test_load_model("models/evalmodel.gguf", NULL);
    if (!m) return;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 1;
    cp.sparse_topk = 64;
    cp.sparse_adapt = 1;
    cp.sparse_recall_every = 5;
    ellm_context *a = NULL, *b = NULL;
    CHECK(ellm_context_init(m, &cp, &a, &err) == ELLM_OK && ellm_context_init(m, &cp, &b, &err) == ELLM_OK, "%s",
          err.msg);
    int32_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = (int32_t)(3 + i * 7 % 200);
    CHECK(ellm_decode(a, toks, 90, NULL, &err) == ELLM_OK, "%s", err.msg);
    for (int i = 90; i < 100; i++) CHECK(ellm_decode(a, toks + i, 1, NULL, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_decode(b, toks, 5, NULL, &err) == ELLM_OK, "%s", err.msg);
    char path[640], bad[640];
    snprintf(path, sizeof path, "%s", test_tmp_path("sparse_values.state"));
    snprintf(bad, sizeof bad, "%s", test_tmp_path("sparse_values_bad.state"));
    CHECK(ellm_context_state_save(a, path, "x", 1, &err) == ELLM_OK, "save: %s", err.msg);
    size_t n = 0;
    unsigned char *buf = (unsigned char *)test_read_file(path, &n);
    uint64_t len = 0;
    const size_t p = buf ? section_at(buf, n, "SPRS", &len) : 0;
    const size_t nlh = (size_t)m->cfg.n_layer * (size_t)m->cfg.n_head_kv;
    CHECK(p > 0 && len == 12 + 3 * nlh * 4 + (size_t)m->cfg.n_layer, "sparse section of %llu bytes", (unsigned long long)len);
    if (!p) {
        free(buf);
        ellm_context_free(a);
        ellm_context_free(b);
        ellm_model_free(m);
        return;
    }
    const float nan = NAN, inf = INFINITY, zero = 0.0f, huge = 1e9f;
    const uint32_t all_ones = 0xFFFFFFFFu, two = 2;
    const size_t nkv = (size_t)m->cfg.n_head_kv;
    char w3[96], r2[96];
    snprintf(w3, sizeof w3, "budget weight of layer %zu head %zu is 0", (size_t)3 / nkv, (size_t)3 % nkv);
    snprintf(r2, sizeof r2, "recall average of layer %zu head %zu is inf", (size_t)2 / nkv, (size_t)2 % nkv);
    struct {
        size_t at;
        const void *value;
        const char *what;
    } cases[] = {
        {0, NULL, NULL}, /* unchanged, checksum rewritten: loads */
        {0, &all_ones, "sparse budget 4294967295"},
        {4, &two, "adaptation flag 2"},
        {12, &nan, "budget weight of layer 0 head 0 is nan"},
        {12 + 4 * 3, &zero, w3},
        {12 + 4, &huge, "budget weight of layer 0 head 1 is 1e+09"},
        {12 + 4 * nlh + 8, &inf, r2},
        {12 + 8 * nlh, &nan, "gain average of layer 0 head 0 is nan"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_resealed(buf, n, p, len, p + cases[i].at, cases[i].value, 4, bad);
        ellm_status st = ellm_context_state_load(b, bad, &err);
        if (!cases[i].what) {
            CHECK(st == ELLM_OK && ellm_context_pos(b) == 100, "resealed, unchanged: %d %s", st, err.msg);
            ellm_context_truncate(b, 5);
            continue;
        }
        CHECK(st == ELLM_ERR_FORMAT && strstr(err.msg, cases[i].what), "%s: %d %s", cases[i].what, st, err.msg);
        CHECK(ellm_context_pos(b) == 5, "after a refused load: pos %d", ellm_context_pos(b));
    }
    free(buf);
    remove(path);
    remove(bad);
    ellm_context_free(a);
    ellm_context_free(b);
    ellm_model_free(m);
}

/* ---- the command: SIGKILL at a random point, then --resume ---------------- */

/* Runs a shell command, capturing stdout (and stderr if `both`). Returns the exit status. */
static int sh(const char *cmd, char *out, size_t cap, int both) {
    char full[4096];
    snprintf(full, sizeof full, "%s%s", cmd, both ? " 2>&1" : " 2>/dev/null");
    return test_shell(full, out, cap);
}

/* Starts `ellm run ARGS --save-state state` with stdout to /dev/null; once the
 * state file exists, waits a random 0..delay_ms and kills it with SIGKILL. */
static int run_and_kill(const char *args, const char *state, int delay_ms, unsigned *seed) {
    remove(state);
    pid_t pid = fork();
    if (pid == 0) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "exec %s run %s --save-state %s >/dev/null 2>&1", test_ellm_bin(), args, state);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    struct stat sb;
    for (int i = 0; i < 20000 && stat(state, &sb) != 0; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return 0; /* ended before its first save */
        usleep(500);
    }
    *seed = *seed * 1103515245u + 12345u;
    usleep((useconds_t)((*seed >> 8) % (unsigned)(delay_ms + 1)) * 1000);
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st); /* 0: it had finished by then (resuming from its last save) */
}

static void test_kill_resume(void) {
    static char want[65536], got[65536];
    const char *configs[] = {
        "-n 250 --temp 0 -t 2 -p 'def parse(line):' --save-every 13",
        "-n 250 --seed 11 --repeat-penalty 1.1 --presence-penalty 0.3 --frequency-penalty 0.2 -t 2 -p 'class Node:' "
        "--save-every 17",
        "-n 250 --seed 5 --sparse-topk 96 -t 2 -p 'import json' --save-every 19",
    };
    char state[640], run_model[640];
    snprintf(state, sizeof state, "%s", test_tmp_path("run.state"));
    snprintf(run_model, sizeof run_model, "%s", test_tmp_path("run_model.gguf"));
    unsigned seed = (unsigned)time(NULL);
    printf("kill/resume trials, random seed %u\n", seed);
    int trials = 0, identical = 0, killed = 0;
    for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
        char cmd[2048];
        /* the uninterrupted run saves too (saving must not change the output) */
        snprintf(cmd, sizeof cmd, "%s run %s --save-state %s.ref", test_ellm_bin(), configs[c], state);
        int rc = sh(cmd, want, sizeof want, 0);
        CHECK(rc == 0 && strlen(want) > 100, "uninterrupted run %zu: %d", c, rc);
        for (int t = 0; t < 2; t++) {
            killed += run_and_kill(configs[c], state, 400, &seed);
            snprintf(cmd, sizeof cmd, "%s run --resume %s", test_ellm_bin(), state);
            rc = sh(cmd, got, sizeof got, 0);
            trials++;
            identical += rc == 0 && !strcmp(want, got);
            CHECK(rc == 0 && !strcmp(want, got), "config %zu trial %d: resumed output differs (rc %d)\n%s\n---\n%s", c,
                  t, rc, want, got);
        }
    }
    printf("kill/resume: %d of %d trials identical (%d killed mid-run, the others resumed from their last save)\n",
           identical, trials, killed);

    /* refused flags, a -n below what was generated, another model at the path */
    char out[4096];
    char cmd[2048];
    run_and_kill("-n 60 --temp 0 -t 2 -p 'x = 1' --save-every 5", state, 0, &seed);
    snprintf(cmd, sizeof cmd, "%s run --resume %s --top-k 3", test_ellm_bin(), state);
    CHECK(sh(cmd, out, sizeof out, 1) != 0 && strstr(out, "--top-k cannot be given with --resume"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s run --resume %s -n 1", test_ellm_bin(), state);
    CHECK(sh(cmd, out, sizeof out, 1) != 0 && strstr(out, "already generated"), "%s", out);
    /* a sharded cache: every rank would write its shard to the one path */
    snprintf(cmd, sizeof cmd, "%s run --mpi -n 4 -p x --save-state %s.mpi", test_ellm_bin(), state);
    CHECK(sh(cmd, out, sizeof out, 1) == 2 && strstr(out, "--save-state is not available with --mpi"), "%s", out);
    CHECK(file_copy("models/evalmodel.gguf", run_model, (size_t)-1), "copy model");
    snprintf(cmd, sizeof cmd, "%s run -m %s -n 40 --temp 0 -t 2 -p 'x' --save-state %s --save-every 8",
             test_ellm_bin(), run_model, state);
    CHECK(sh(cmd, out, sizeof out, 0) == 0, "run with a copied model");
    CHECK(file_copy("tests/data/models/llama-gqa.gguf", run_model, (size_t)-1), "replace model");
    snprintf(cmd, sizeof cmd, "%s run --resume %s", test_ellm_bin(), state);
    CHECK(sh(cmd, out, sizeof out, 1) != 0 && strstr(out, "another model"), "resume on another model: %s", out);
    remove(run_model);
    remove(state);
    snprintf(cmd, sizeof cmd, "%s.ref", state);
    remove(cmd);
}

/* `ellm run`'s settings in a state with one value outside what its flags
 * accept (the checksum made right again): --resume refuses the file. */
static void test_resume_bad_settings(void) {
    char state[640], cmd[2048], out[4096];
    snprintf(state, sizeof state, "%s", test_tmp_path("settings.state"));
    snprintf(cmd, sizeof cmd, "%s run -n 20 --temp 0 -t 1 -p 'x = 1' --save-state %s --save-every 5", test_ellm_bin(),
             state);
    CHECK(sh(cmd, out, sizeof out, 0) == 0, "run: %s", out);
    size_t n = 0;
    unsigned char *buf = (unsigned char *)test_read_file(state, &n);
    uint64_t len = 0;
    const size_t p = buf ? section_at(buf, n, "APP ", &len) : 0;
    CHECK(p > 0 && len > 40 && !memcmp(buf + p, "ellm-run", 8), "the run's section");
    if (!p || len <= 40) {
        free(buf);
        return;
    }
    int64_t path_len;
    memcpy(&path_len, buf + p + 12, 8);
    /* after the magic, the version and the model path: no_echo, kv type,
     * ctx_auto, n_predict, threads, batch, n_ctx (int64), then temperature */
    const size_t ints = p + 12 + 8 + (size_t)path_len, temp_at = ints + 7 * 8;
    const float nan = NAN, hot = 1e6f;
    const int64_t big_batch = (int64_t)1 << 40, kv7 = 7;
    struct {
        size_t at, bytes;
        const void *value;
        const char *what;
    } cases[] = {
        {0, 0, NULL, NULL},
        {temp_at, 4, &nan, "temperature NaN"},
        {temp_at, 4, &hot, "temperature 1e6"},
        {ints + 5 * 8, 8, &big_batch, "batch 2^40"},
        {ints + 1 * 8, 8, &kv7, "KV type 7"},
    };
    char bad[700];
    snprintf(bad, sizeof bad, "%s.bad", state);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_resealed(buf, n, p, len, cases[i].at, cases[i].value, cases[i].bytes, bad);
        snprintf(cmd, sizeof cmd, "%s run --resume %s", test_ellm_bin(), bad);
        const int rc = sh(cmd, out, sizeof out, 1);
        if (!cases[i].what)
            CHECK(rc == 0, "resealed, unchanged: rc %d %s", rc, out);
        else
            CHECK(rc != 0 && strstr(out, "run settings in the state are malformed"), "%s: rc %d %s", cases[i].what,
                  rc, out);
    }
    free(buf);
    remove(bad);
    remove(state);
}

/* A run that reaches -n keeps its final state (no periodic save falls on
 * it here): --resume with a larger -n continues it exactly as the longer run
 * goes on, greedy and sampled, and --resume with its own -n prints its text. */
static void test_extend_finished(void) {
    const char *configs[] = {"--temp 0 -t 1 -p 'def parse(line):'",
                             "--seed 7 --repeat-penalty 1.1 -t 1 -p 'class Node:'"};
    char state[640], copy[700], cmd[2048];
    static char want[65536], got[65536];
    snprintf(state, sizeof state, "%s", test_tmp_path("finished.state"));
    snprintf(copy, sizeof copy, "%s.copy", state);
    for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
        remove(state);
        snprintf(cmd, sizeof cmd, "%s run %s -n 70 --save-state %s --save-every 1000", test_ellm_bin(), configs[c], state);
        static char first[65536];
        CHECK(sh(cmd, first, sizeof first, 0) == 0 && access(state, F_OK) == 0, "config %zu: no state after -n 70", c);
        CHECK(file_copy(state, copy, (size_t)-1), "copy");
        snprintf(cmd, sizeof cmd, "%s run --resume %s", test_ellm_bin(), copy);
        CHECK(sh(cmd, got, sizeof got, 0) == 0 && !strcmp(first, got), "config %zu: resume of a finished run\n%s\n---\n%s",
              c, first, got);
        snprintf(cmd, sizeof cmd, "%s run %s -n 150", test_ellm_bin(), configs[c]);
        CHECK(sh(cmd, want, sizeof want, 0) == 0, "config %zu: -n 150", c);
        snprintf(cmd, sizeof cmd, "%s run --resume %s -n 150", test_ellm_bin(), state);
        CHECK(sh(cmd, got, sizeof got, 0) == 0 && !strcmp(want, got) && strlen(got) > strlen(first),
              "config %zu: the finished run extended to -n 150 differs\n%s\n---\n%s", c, want, got);
    }
    remove(state);
    remove(copy);
}

/* A state names its model by the file's bytes, not by the layout the engine
 * reads them in: saved with the Q8_0 matrices interleaved at load, it restores
 * into the same file loaded with keep_layout and the other way round (the
 * saved logits come back as they were), and both loads give the model the
 * same content hash. */
static void test_layouts(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/llama-gqa-Q8_0.gguf", test_data_dir());
    ellm_model_params pp = {.n_threads = 1}, kp = {.n_threads = 1, .keep_layout = 1};
    ellm_model *p = NULL, *k = NULL;
    ellm_error err = {0};
    CHECK(ellm_model_load(path, &pp, &p, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_model_load(path, &kp, &k, &err) == ELLM_OK, "%s", err.msg);
    if (!p || !k) goto out;
    CHECK(model_content_hash(p) == model_content_hash(k), "content hash %016llx interleaved, %016llx file layout",
          (unsigned long long)model_content_hash(p), (unsigned long long)model_content_hash(k));
    if (kern_r16_fast())
        CHECK(p->layers[0].wq.layout == MODEL_LAYOUT_R16 && k->layers[0].wq.layout == MODEL_LAYOUT_ROWS,
              "layouts %d and %d", p->layers[0].wq.layout, k->layers[0].wq.layout);
    else
        SKIP("state across weight layouts: this CPU has neither AVX2 nor AVX-512, both loads keep the file's layout");
    const char *state = test_tmp_path("state_layout.bin");
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 128;
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)((i * 29 + 3) % p->cfg.n_vocab);
    for (int dir = 0; dir < 2; dir++) {
        ellm_model *from = dir ? k : p, *to = dir ? p : k;
        ellm_context *a = NULL, *b = NULL;
        CHECK(ellm_context_init(from, &cp, &a, &err) == ELLM_OK && ellm_context_init(to, &cp, &b, &err) == ELLM_OK,
              "%s", err.msg);
        if (a && b && ellm_decode(a, toks, 40, NULL, &err) == ELLM_OK) {
            CHECK(ellm_context_state_save(a, state, NULL, 0, &err) == ELLM_OK, "save: %s", err.msg);
            const ellm_status st = ellm_context_state_load(b, state, &err);
            CHECK(st == ELLM_OK, "%s: restore into the %s: %d %s", dir ? "file layout" : "interleaved",
                  dir ? "interleaved load" : "file layout's load", st, err.msg);
            CHECK(st == ELLM_OK && ellm_context_pos(b) == 40 &&
                      memcmp(ellm_context_logits(a), ellm_context_logits(b), (size_t)p->cfg.n_vocab * 4) == 0,
                  "restored context: position %d, logits %s", ellm_context_pos(b),
                  st == ELLM_OK ? "compared" : "not restored");
        }
        ellm_context_free(a);
        ellm_context_free(b);
    }
    remove(state);
out:
    ellm_model_free(p);
    ellm_model_free(k);
}

int main(void) {
    test_crc();
    test_engine();
    test_layouts();
    test_sparse_values();
    test_resume_bad_settings();
    test_extend_finished();
    test_kill_resume();
    return test_finish();
}
