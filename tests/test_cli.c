/* The ellm command end to end: `ellm logits` reproduces the reference logits,
 * `ellm run` is deterministic per seed, `eval`, `calibrate`, `bench` and run's
 * sparse flags work on the embedded model and their --json output has the
 * documented shape, and bad input (flags, values, files) gets a clear message
 * and a non-zero exit instead of a crash. Runs $ELLM_BIN (default build/ellm). */
#include "harness.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs `args` through the shell with stderr sent to `redir` ("2>&1": into the
 * output too), capturing stdout into out (cap bytes). Returns the exit
 * status, or -1 if the process died from a signal. */
static int run_redir(const char *args, const char *redir, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s %s", test_ellm_bin(), args, redir);
    return test_shell(cmd, out, cap);
}

/* stdout and stderr of `ellm args` into out. */
static int run(const char *args, char *out, size_t cap) { return run_redir(args, "2>&1", out, cap); }

/* stdout only (stderr dropped), for --json output. */
static int run_stdout(const char *args, char *out, size_t cap) { return run_redir(args, "2>/dev/null", out, cap); }

/* `ellm ARGS` that must exit 0 and print JSON (both checked): the parsed
 * document, or NULL; out keeps the text for messages. */
static cJSON *run_json(const char *args, char *out, size_t cap) {
    int rc = run_stdout(args, out, cap);
    CHECK(rc == 0, "`ellm %s`: exit %d: %s", args, rc, out);
    cJSON *j = cJSON_Parse(out);
    CHECK(j != NULL, "`ellm %s`: not JSON: %s", args, out);
    return j;
}

/* A path under /tmp unique to this process: name is "<tag>.<pid>". */
static const char *tmp_path(char *buf, size_t cap, const char *tag) {
    snprintf(buf, cap, "/tmp/ellm_test_%s.%d", tag, (int)getpid());
    return buf;
}

/* Number `key` of JSON object o, or NAN if absent or not a number. */
static double jnum(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* Runs `args`, expecting a non-zero exit (no crash) and `want` in the output. */
static void expect_error(const char *args, const char *want) {
    char out[8192];
    int rc = run(args, out, sizeof out);
    CHECK(rc > 0 && strstr(out, want), "`ellm %s`: exit %d, want '%s' in: %s", args, rc, want, out);
}

/* expect_error with the arguments formatted from fmt as printf does. */
static void expect_errorf(const char *want, const char *fmt, ...) {
    char args[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    expect_error(args, want);
}

/* `ellm logits -m MODEL --ids IDS ... FLAGS` (model and ids under the test
 * data's models/) against reference logits REF there: the largest
 * difference relative to the largest reference logit, or -1 if the run or a
 * file failed (a failed check). */
static double logits_vs(const char *model, const char *ids, const char *flags, const char *ref_name) {
    const char *d = test_data_dir();
    char args[1536], out[8192], ref_path[512];
    snprintf(args, sizeof args, "logits -m %s/models/%s --ids %s/models/%s -o /tmp/ellm_test_logits.f32 %s", d, model,
             d, ids, flags);
    int rc = run(args, out, sizeof out);
    CHECK(rc == 0, "ellm %s failed (%d): %s", args, rc, out);
    size_t n_got = 0, n_ref = 0;
    snprintf(ref_path, sizeof ref_path, "%s/models/%s", d, ref_name);
    float *got = (float *)test_read_file("/tmp/ellm_test_logits.f32", &n_got);
    float *ref = (float *)test_read_file(ref_path, &n_ref);
    CHECK(got && ref && n_got == n_ref, "logits size %zu vs reference %zu", n_got, n_ref);
    double rel = -1;
    if (rc == 0 && got && ref && n_got == n_ref) {
        double maxd = 0, maxr = 0;
        for (size_t i = 0; i < n_ref / 4; i++) {
            double dd = fabs((double)got[i] - ref[i]);
            if (!(dd <= maxd)) maxd = dd;
            if (fabs(ref[i]) > maxr) maxr = fabs(ref[i]);
        }
        rel = maxd / maxr;
    }
    free(got);
    free(ref);
    remove("/tmp/ellm_test_logits.f32");
    return rel;
}

static void test_logits(void) {
    char out[8192];
    /* ids file: both lines of the tokens file (prompt + greedy continuation) */
    double rel = logits_vs("llama-gqa.gguf", "llama-gqa.tokens.txt", "--kv-type f32 -t 2", "llama-gqa.logits.f32");
    CHECK(rel >= 0 && rel <= 1e-4, "ellm logits max diff %.3g of the largest reference logit", rel);
    int rc;

    rc = run("logits -m models/evalmodel.gguf --ids /nonexistent/ids.txt -o /tmp/x.f32", out, sizeof out);
    CHECK(rc > 0 && strstr(out, "/nonexistent/ids.txt"), "missing ids file: %d %s", rc, out);
    FILE *f = fopen("/tmp/ellm_test_bad_ids.txt", "w");
    fputs("1 2 three 4\n", f);
    fclose(f);
    rc = run("logits -m models/evalmodel.gguf --ids /tmp/ellm_test_bad_ids.txt -o /tmp/x.f32", out, sizeof out);
    CHECK(rc > 0 && strstr(out, "three"), "bad id: %d %s", rc, out);
    f = fopen("/tmp/ellm_test_bad_ids.txt", "w");
    fputs("1 2 99999 4\n", f);
    fclose(f);
    rc = run("logits -m models/evalmodel.gguf --ids /tmp/ellm_test_bad_ids.txt -o /tmp/x.f32", out, sizeof out);
    CHECK(rc > 0 && strstr(out, "99999"), "out-of-vocabulary id: %d %s", rc, out);
    remove("/tmp/ellm_test_bad_ids.txt");
}

static void test_run(void) {
    char a[16384], b[16384];
    int rc1 = run("run -n 40 --seed 7 -p 'def add(a, b):'", a, sizeof a);
    int rc2 = run("run -n 40 --seed 7 -p 'def add(a, b):'", b, sizeof b);
    CHECK(rc1 == 0 && rc2 == 0, "ellm run failed: %s", a);
    CHECK(!strcmp(a, b), "same seed, different output:\n%s\n---\n%s", a, b);
    CHECK(!strncmp(a, "def add(a, b):", 14) && strlen(a) > 40, "output: %s", a);
    run("run -n 40 --seed 8 -p 'def add(a, b):'", b, sizeof b);
    CHECK(strcmp(a, b) != 0, "different seeds, same output");

    /* --stats reports load time and speeds, and the passes' time split: one
     * pass for the prompt and one per token after the first, the shares
     * within the whole */
    int rc = run("run -n 8 --temp 0 --stats -p 'import os'", a, sizeof a);
    CHECK(rc == 0 && strstr(a, "model_load_ms:") && strstr(a, "decode:") && strstr(a, "prompt:"),
          "stats: %s", a);
    const char *split = strstr(a, "time split: ");
    long passes = 0;
    double fwd = 0, mm = -1, att = -1, out = -1;
    if (split)
        sscanf(split, "time split: %ld forward passes (prompt and decode) in %lf ms: layers' matmuls %lf%%, "
                      "attention %lf%%, output matrix %lf%%", &passes, &fwd, &mm, &att, &out);
    CHECK(passes == 8 && fwd > 0 && mm > 0 && att >= 0 && out > 0 && mm + att + out <= 101, "stats split: %s", a);

    /* Too long for the context: refused up front with the numbers. */
    rc = run("run -n 5000 -p 'x'", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "context"), "n beyond the training context: %d %s", rc, a);
    rc = run("run -n 100 -c 50 -p 'import os'", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "context size of 50"), "n beyond -c: %d %s", rc, a);

    /* llama.cpp's cache type flags: taken when K and V agree (the same text as
     * --kv-type), refused with a message when they do not */
    rc1 = run_stdout("run -n 24 --temp 0 -p 'def add(a, b):' --kv-type q8_0", a, sizeof a);
    rc2 = run_stdout("run -n 24 --temp 0 -p 'def add(a, b):' -ctk q8_0 --cache-type-v q8_0", b, sizeof b);
    CHECK(rc1 == 0 && rc2 == 0 && !strcmp(a, b), "-ctk/-ctv q8_0 against --kv-type q8_0: %d %d\n%s\n---\n%s", rc1,
          rc2, a, b);
    expect_error("run -n 4 -p x -ctk q8_0", "--cache-type-k q8_0 and --cache-type-v f16 differ");
    expect_error("run -n 4 -p x --kv-type f32 -ctk q8_0 -ctv q8_0", "--kv-type f32 and --cache-type-k/-v q8_0 differ");
    expect_error("run -n 4 -p x -ctv q4_0", "expects f16, f32 or q8_0, got 'q4_0'");
    expect_error("serve --port 0 -ctk f32", "--cache-type-k f32 and --cache-type-v f16 differ");

    /* Bad flags and files */
    rc = run("run --top-p 2", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "--top-p"), "bad value: %d %s", rc, a);
    rc = run("run --bogus", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "--bogus"), "unknown flag: %d %s", rc, a);
    rc = run("run -m /nonexistent.gguf", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "/nonexistent.gguf"), "missing model: %d %s", rc, a);
    rc = run("run -f /nonexistent-prompt.txt", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "/nonexistent-prompt.txt"), "missing prompt file: %d %s", rc, a);
    FILE *f = fopen("/tmp/ellm_test_trunc.gguf", "wb");
    size_t n;
    char *m = test_read_file("models/evalmodel.gguf", &n);
    if (m && f) fwrite(m, 1, n / 3, f);
    if (f) fclose(f);
    free(m);
    rc = run("run -m /tmp/ellm_test_trunc.gguf -n 4", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "error"), "truncated model: %d %s", rc, a);
    remove("/tmp/ellm_test_trunc.gguf");
    /* invalid UTF-8 in the prompt */
    rc = run("run -n 4 -p \"$(printf 'ab\\377\\376')\"", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "UTF-8"), "invalid UTF-8 prompt: %d %s", rc, a);
}

/* llama.cpp's RoPE flags: YaRN asked for on a file without it gives
 * llama.cpp's logits for the file that carries the same keys; the scaling
 * shows in --stats, a run saved with it resumes exactly (the flags are kept
 * in the state, and refused beside --resume), and bad values are named. */
static void test_rope_flags(void) {
    double rel = logits_vs("qwen2-bias.gguf", "qwen2-yarn.tokens.txt",
                           "--kv-type f32 --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 4096", "qwen2-yarn.logits.f32");
    CHECK(rel >= 0 && rel <= 1e-4, "logits with YaRN asked for: %.3g of the largest llama.cpp logit", rel);
    rel = logits_vs("qwen2-bias.gguf", "qwen2-yarn.tokens.txt", "--kv-type f32 --rope-freq-scale 0.25 --rope-scaling yarn "
                    "--yarn-orig-ctx 4096", "qwen2-yarn.logits.f32");
    CHECK(rel >= 0 && rel <= 1e-4, "--rope-freq-scale 0.25 as --rope-scale 4: %.3g", rel);
    char a[16384], b[16384];
    const char *yarn = "--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 512";
    char args[1024];
    snprintf(args, sizeof args, "run -n 8 --temp 0 --stats -p 'import os' %s", yarn);
    int rc = run(args, a, sizeof a);
    CHECK(rc == 0 && strstr(a, "rope scaling: yarn x4 from 512 tokens"), "--stats with YaRN asked for: %d %s", rc, a);
    /* save part way and resume: the text of one uninterrupted run */
    char st[256];
    tmp_path(st, sizeof st, "rope.state");
    snprintf(args, sizeof args, "run -n 48 --seed 5 -t 2 -p 'def f(x):' %s", yarn);
    int rc1 = run_stdout(args, a, sizeof a);
    snprintf(args, sizeof args, "run -n 20 --seed 5 -t 2 -p 'def f(x):' %s --save-state %s > /dev/null 2>&1 && %s run "
             "--resume %s -n 48", yarn, st, test_ellm_bin(), st);
    int rc2 = run_stdout(args, b, sizeof b);
    CHECK(rc1 == 0 && rc2 == 0 && !strcmp(a, b), "resume with YaRN asked for: %d %d\n%s\n---\n%s", rc1, rc2, a, b);
    snprintf(args, sizeof args, "run --resume %s -n 48 --rope-scale 2", st);
    expect_error(args, "--rope-scale cannot be given with --resume");
    remove(st);
    /* past the training context (2048) with the file's plain RoPE: a note suggesting YaRN; none once asked for */
    rc = run("run -c 4096 -n 2 -p 'import os'", a, sizeof a);
    CHECK(rc == 0 && strstr(a, "note: a context of 4096 tokens runs past the model's training context of 2048") &&
              strstr(a, "--rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 2048"),
          "note past the training context: %d %s", rc, a);
    rc = run("run -c 4096 -n 2 -p 'import os' --rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 2048", a, sizeof a);
    CHECK(rc == 0 && !strstr(a, "note: a context"), "no note with YaRN asked for: %d %s", rc, a);
    snprintf(args, sizeof args, "timeout 3 %s serve --port 0 -np 1 -c 4096 2>&1", test_ellm_bin());
    test_shell(args, a, sizeof a);
    CHECK(strstr(a, "ready:") && strstr(a, "note: a context of 4096 tokens runs past the model's training context of 2048"),
          "serve's note past the training context: %s", a);
    expect_error("run -n 4 -p x --rope-scaling ntk", "--rope-scaling 'ntk': expected none, linear or yarn");
    expect_error("run -n 4 -p x --rope-scale 0", "--rope-scale");
    expect_error("run -n 4 -p x --yarn-orig-ctx many", "--yarn-orig-ctx");
    expect_error("serve --port 0 --rope-freq-base -1", "--rope-freq-base");
}

static void test_chat(void) {
    char a[16384];
    /* one chat turn with a built-in template and the embedded model */
    int rc = run("run --chat-template chatml --system 'Be brief.' -p 'hi' -n 8 --seed 1", a, sizeof a);
    CHECK(rc == 0, "chat turn: %d %s", rc, a);
    rc = run("run --chat-template no-such-template -p 'hi' -n 8", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "no-such-template"), "unknown template: %d %s", rc, a);
    /* interactive chat from stdin: two turns, then EOF ends the session */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf 'hello\\nagain\\n' | %s run --chat --chat-template llama2 -n 6 --seed 3 -c 512 2>&1", test_ellm_bin());
    int st = test_shell(cmd, a, sizeof a);
    CHECK(st == 0, "interactive chat exit %d: %s", st, a);
    int lines = 0;
    for (char *c = a; *c; c++) lines += *c == '\n';
    CHECK(lines >= 2, "expected one reply line per turn: %s", a);
}

/* ellm eval: dense against one sparse budget on a short window of held-out
 * text; the JSON has one entry per mode with the documented fields. */
static void test_eval(void) {
    const char *d = test_data_dir();
    char args[1024], out[16384];
    snprintf(args, sizeof args, "eval -f %s/heldout-sample.txt --ctx 256 --windows 1 --score-from 128 "
             "--compare dense,sparse:96 --json", d);
    int rc = run_stdout(args, out, sizeof out);
    CHECK(rc == 0, "eval --json exit %d: %s", rc, out);
    cJSON *j = cJSON_Parse(out);
    CHECK(j != NULL, "eval --json is not JSON: %s", out);
    const cJSON *modes = cJSON_GetObjectItemCaseSensitive(j, "modes");
    CHECK(cJSON_IsArray(modes) && cJSON_GetArraySize(modes) == 2, "eval: modes: %s", out);
    CHECK(jnum(j, "ctx") == 256 && jnum(j, "windows") == 1 && jnum(j, "score_from") == 128, "eval header: %s", out);
    if (cJSON_IsArray(modes) && cJSON_GetArraySize(modes) == 2) {
        const cJSON *dn = cJSON_GetArrayItem(modes, 0), *sp = cJSON_GetArrayItem(modes, 1);
        CHECK(!strcmp(jstr(dn, "mode"), "dense") && jnum(dn, "ppl") > 1 && jnum(dn, "ppl") < 1000 &&
                  jnum(dn, "ppl_ratio") == 1 && jnum(dn, "positions") == 127,
              "eval dense entry: %s", out);
        CHECK(!strcmp(jstr(sp, "mode"), "sparse:96") && jnum(sp, "budget") == 96 &&
                  jnum(sp, "top1_agreement") > 0.5 && jnum(sp, "top1_agreement") <= 1 && jnum(sp, "kl") >= 0 &&
                  jnum(sp, "kl") < 1 && jnum(sp, "ppl_ratio") > 0.9 && jnum(sp, "ppl_ratio") < 1.1 &&
                  jnum(sp, "sparse_recall") > 0 && jnum(sp, "sparse_recall") <= 1,
              "eval sparse entry: %s", out);
    }
    cJSON_Delete(j);

    expect_error("eval --bogus", "--bogus");
    expect_error("eval", "-f");
    expect_error("eval -f /nonexistent-eval.txt", "/nonexistent-eval.txt");
    snprintf(args, sizeof args, "eval -f %s/heldout-sample.txt --compare sparse:abc", d);
    expect_error(args, "sparse:abc");
    snprintf(args, sizeof args, "eval -f %s/heldout-sample.txt --ctx 256 --score-from 256", d);
    expect_error(args, "--score-from");
    snprintf(args, sizeof args, "eval -m /nonexistent-model.gguf -f %s/heldout-sample.txt", d);
    expect_error(args, "/nonexistent-model.gguf");
    snprintf(args, sizeof args, "eval -f %s/heldout-sample.txt --compare sparse:96", d);
    expect_error(args, "dense");
}

/* ellm calibrate writes a profile that run and eval then accept; bad
 * arguments and an unwritable output are refused by name. */
static void test_calibrate(void) {
    const char *d = test_data_dir();
    char prof[256], args[1024], out[16384];
    tmp_path(prof, sizeof prof, "profile");
    snprintf(args, sizeof args, "calibrate -f %s/heldout-sample.txt --ctx 256 --windows 1 --budgets 64,128 "
             "--target 96 -o %s", d, prof);
    int rc = run(args, out, sizeof out);
    CHECK(rc == 0 && strstr(out, prof), "calibrate exit %d: %s", rc, out);
    char *text = test_read_file(prof, NULL);
    const char *head = "ellm-sparse-profile 1\nlayers ";
    CHECK(text && !strncmp(text, head, strlen(head)), "profile: %s", text ? text : "(none)");
    int layers = 0;
    for (const char *p = text; p && (p = strstr(p, "\nlayer ")); p++) layers++;
    CHECK(layers == 6, "profile has %d layer lines, the model 6", layers);
    free(text);
    snprintf(args, sizeof args, "run --sparse-topk 64 --sparse-profile %s -n 8 --seed 1 -p 'def f(x):'", prof);
    rc = run(args, out, sizeof out);
    CHECK(rc == 0, "run with the calibrated profile: %d %s", rc, out);
    snprintf(args, sizeof args, "eval -f %s/heldout-sample.txt --ctx 256 --windows 1 --score-from 128 "
             "--compare dense,sparse:96:profile --sparse-profile %s --json", d, prof);
    rc = run_stdout(args, out, sizeof out);
    cJSON *j = cJSON_Parse(out);
    const cJSON *modes = j ? cJSON_GetObjectItemCaseSensitive(j, "modes") : NULL;
    CHECK(rc == 0 && cJSON_GetArraySize(modes) == 2 &&
              !strcmp(jstr(cJSON_GetArrayItem(modes, 1), "mode"), "sparse:96:profile"),
          "eval with the calibrated profile: %d %s", rc, out);
    cJSON_Delete(j);
    remove(prof);

    expect_error("calibrate --bogus", "--bogus");
    snprintf(args, sizeof args, "calibrate -f %s/heldout-sample.txt", d);
    expect_error(args, "-o");
    snprintf(args, sizeof args, "calibrate -f %s/heldout-sample.txt -o %s --budgets 64,abc", d, prof);
    expect_error(args, "abc");
    snprintf(args, sizeof args, "calibrate -f /nonexistent-cal.txt -o %s", prof);
    expect_error(args, "/nonexistent-cal.txt");
    snprintf(args, sizeof args, "calibrate -f %s/heldout-sample.txt --ctx 256 --windows 1 --budgets 64 "
             "-o /nonexistent-dir/p.txt", d);
    expect_error(args, "/nonexistent-dir/p.txt");
}

/* ellm calibrate --imatrix and --draft: a short pass writes its file (an
 * imatrix in llama.cpp's layout, which starts with its entry count: 7
 * matrices per layer of the 6-layer model; a draft map GGUF), and missing
 * options, bad values and a text shorter than one window are refused by name. */
static void test_calibrate_fits(void) {
    const char *d = test_data_dir();
    const char *im = test_tmp_path("calib.imatrix"), *dm = test_tmp_path("calib.draft");
    const char *tiny = test_tmp_path("calib-tiny.txt");
    char args[1024], out[8192];
    snprintf(args, sizeof args, "calibrate --imatrix -f %s/heldout-sample.txt -o %s --ctx 64 --chunks 2", d, im);
    int rc = run(args, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "imatrix: 2/2 windows") && strstr(out, "from 128 tokens"), "imatrix exit %d: %s",
          rc, out);
    size_t n = 0;
    char *b = test_read_file(im, &n);
    int32_t entries = 0;
    if (b && n >= 4) memcpy(&entries, b, 4);
    CHECK(entries == 42, "imatrix file: %zu bytes, %d entries", n, entries);
    free(b);
    /* --covariance: a ".cov" entry per distinct input (4 per layer), columns x
     * --cov-block floats */
    snprintf(args, sizeof args,
             "calibrate --imatrix -f %s/heldout-sample.txt -o %s --ctx 64 --chunks 2 --covariance --cov-block 128", d, im);
    rc = run(args, out, sizeof out);
    b = test_read_file(im, &n);
    entries = 0;
    if (b && n >= 4) memcpy(&entries, b, 4);
    CHECK(rc == 0 && entries == 42 + 24 && b && memmem(b, n, "blk.5.ffn_down.weight.cov", 25) &&
              !memmem(b, n, "attn_k.weight.cov", 17),
          "imatrix --covariance exit %d: %d entries, %s", rc, entries, out);
    free(b);
    snprintf(args, sizeof args,
             "calibrate --draft -f %s/heldout-sample.txt -o %s --ctx 64 --windows 4 --draft-layers 1", d, dm);
    rc = run(args, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "draft maps: 4/4 windows") && strstr(out, "wrote 1 draft maps") &&
              strstr(out, "fitted on 256 tokens"),
          "draft exit %d: %s", rc, out);
    b = test_read_file(dm, &n);
    CHECK(b && n > 4 && !memcmp(b, "GGUF", 4), "draft map file: %zu bytes", n);
    free(b);

    FILE *f = fopen(tiny, "w");
    if (f) {
        fputs("def f(x):\n    return x\n", f);
        fclose(f);
    }
    expect_errorf("fewer than one --ctx window of 64", "calibrate --imatrix -f %s -o %s --ctx 64", tiny, im);
    expect_errorf("fewer than one --ctx window of 64", "calibrate --draft -f %s -o %s --ctx 64", tiny, dm);
    expect_errorf("-f TEXT and -o FILE are required", "calibrate --imatrix -f %s/heldout-sample.txt", d);
    expect_errorf("-f TEXT and -o DRAFT are required", "calibrate --draft -o %s", dm);
    expect_errorf("--ctx expects an integer in [16,", "calibrate --imatrix -f %s -o %s --ctx 3", tiny, im);
    expect_errorf("--ctx needs a value", "calibrate --draft -f %s -o %s --ctx", tiny, dm);
    expect_errorf("/nonexistent-imatrix.txt", "calibrate --imatrix -f /nonexistent-imatrix.txt -o %s", im);
    expect_error("calibrate --draft --bogus", "unknown option '--bogus' (see ellm calibrate --draft --help)");
    expect_error("calibrate --imatrix --chunks 0", "--chunks");
    expect_error("calibrate --imatrix --cov-block 200", "--cov-block must be a multiple of 128");
    expect_error("calibrate --imatrix --cov-block 2048", "--cov-block expects an integer in [128, 1024]");
}

/* A dense point's rounds (9 steps: 7 and 2): each with its bandwidth read,
 * median step and their ratio (bytes per token / median step / bandwidth),
 * and bw_paired_fraction the median of the rounds' ratios (of two, the
 * upper, as median_sort takes it). Returns the number of faults. */
static int bench_rounds_bad(const cJSON *p) {
    const cJSON *rounds = cJSON_GetObjectItemCaseSensitive(p, "rounds"), *r;
    if (cJSON_GetArraySize(rounds) != 2) return 1;
    int bad = 0;
    double f[2];
    int i = 0;
    cJSON_ArrayForEach(r, rounds) {
        const double bw = jnum(r, "bw_gbps"), ms = jnum(r, "ms_median");
        f[i] = jnum(r, "bw_fraction");
        const double want = bw > 0 && ms > 0 ? jnum(p, "bytes_per_token") / (ms / 1000.0) / 1e9 / bw : -1;
        bad += !(bw > 0) || !(ms > 0) || fabs(f[i] - want) > 1e-4 + 2e-3 * want;
        i++;
    }
    const double paired = jnum(p, "bw_paired_fraction"), med = f[0] > f[1] ? f[0] : f[1];
    bad += fabs(paired - med) > 1e-4 + 1e-3 * med || !(jnum(p, "bw_paired_gbps") > 0);
    return bad;
}

/* A dense point's split of its timed steps: every part measured, GB/s where
 * a part reads bytes, the parts and the rest adding up to the forward pass,
 * which fits in the mean timed step. Returns the number of faults. */
static int bench_split_bad(const cJSON *p) {
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(p, "split"), *steps = cJSON_GetObjectItemCaseSensitive(p, "step_ms"), *x;
    if (!cJSON_IsObject(sp) || cJSON_GetArraySize(steps) < 1) return 1;
    double mean = 0;
    cJSON_ArrayForEach(x, steps) mean += x->valuedouble / cJSON_GetArraySize(steps);
    const double fwd = jnum(sp, "forward_ms"), mm = jnum(sp, "matmul_ms"), att = jnum(sp, "attention_ms"),
                 out = jnum(sp, "output_ms"), other = jnum(sp, "other_ms");
    int bad = !(mm > 0) || !(att > 0) || !(out > 0) || !(other >= -1e-4) || !(jnum(sp, "matmul_gbps") > 0) ||
              !(jnum(sp, "output_gbps") > 0) || !(jnum(sp, "attention_gbps") > 0 || jnum(p, "depth") == 0);
    bad += fabs(mm + att + out + other - fwd) > 1e-3 || !(fwd <= mean * 1.0001 + 1e-3);
    return bad;
}

/* ellm bench at tiny depths: the JSON has the machine, one point per depth
 * and mode, the dense points' rounds paired with bandwidth reads, and the
 * prefill entries. */
static void test_bench(void) {
    char out[16384];
    cJSON *j = run_json("bench --depths 0,256 -n 9 --prefill 64 --bw-mb 16 --gen 1000 --sparse-topk 128 -t 1 --json",
                        out, sizeof out);
    CHECK(!strcmp(jstr(j, "engine"), "ellm") && jnum(j, "threads") == 1 && jnum(j, "bandwidth_gbps") > 0 &&
              jnum(j, "weight_bytes_per_token") > 0 && jnum(j, "kv_bytes_per_token") > 0,
          "bench header: %s", out);
    const cJSON *pts = j ? cJSON_GetObjectItemCaseSensitive(j, "points") : NULL;
    int n_dense = 0, n_sparse = 0, bad = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, pts) {
        double depth = jnum(p, "depth");
        const int dense = !strcmp(jstr(p, "mode"), "dense");
        n_dense += dense;
        if (dense) bad += bench_rounds_bad(p) + bench_split_bad(p);
        n_sparse += !strcmp(jstr(p, "mode"), "sparse") && jnum(p, "sparse_topk") == 128 &&
                    jnum(p, "vs_empty_context") > 0;
        bad += !(depth == 0 || depth == 256) || !(jnum(p, "tokens_per_s") > 0) || !(jnum(p, "ms_per_token") > 0) ||
               !(jnum(p, "bytes_per_token") > 0);
    }
    CHECK(n_dense == 2 && n_sparse == 2 && bad == 0, "bench points: %d dense, %d sparse, %d bad: %s", n_dense,
          n_sparse, bad, out);
    const cJSON *pre = j ? cJSON_GetObjectItemCaseSensitive(j, "prefill") : NULL;
    CHECK(cJSON_GetArraySize(pre) == 1 && jnum(cJSON_GetArrayItem(pre, 0), "tokens") == 64 &&
              jnum(cJSON_GetArrayItem(pre, 0), "tokens_per_s") > 0,
          "bench prefill: %s", out);
    cJSON_Delete(j);

    expect_error("bench --bogus", "--bogus");
    expect_error("bench --depths abc", "abc");
    expect_error("bench --kv-type q9", "q9");
    expect_error("bench --bw-mb 8", "--bw-mb");
    expect_error("bench -m /nonexistent-bench.gguf", "/nonexistent-bench.gguf");
    expect_error("bench --kv-compare q9", "q9");
}

/* ellm bench --kv-compare: every dense point carries both caches' medians from
 * the alternating rounds, and the speed-up is their ratio. */
static void test_bench_kv_compare(void) {
    char out[16384];
    cJSON *j = run_json("bench --depths 0,64 -n 3 --prefill 0 --bw-mb 16 -t 1 --kv-type q8_0 --kv-compare f16 --json",
                        out, sizeof out);
    CHECK(j && !strcmp(jstr(j, "kv_type"), "q8_0"), "bench --kv-compare header: %s", out);
    const cJSON *pts = j ? cJSON_GetObjectItemCaseSensitive(j, "points") : NULL, *p;
    int n = 0, bad = 0;
    cJSON_ArrayForEach(p, pts) {
        double a = jnum(p, "interleaved_ms_per_token"), b = jnum(p, "kv_compare_ms_per_token");
        double r = jnum(p, "speedup_vs_kv_compare");
        n++;
        bad += strcmp(jstr(p, "kv_compare"), "f16") != 0 || !(a > 0) || !(b > 0) || !(fabs(r - b / a) < 0.002 * r);
    }
    CHECK(n == 2 && bad == 0, "bench --kv-compare points: %d, %d bad: %s", n, bad, out);
    cJSON_Delete(j);
}

/* ellm bench --spec with a model drafter: a quant:q4_0 copy with a KV
 * budget is made (beside a temporary copy of the evaluation model, so no
 * cache lands in the source tree), its draft step and the verify passes are
 * timed, and the JSON has the speculative point; an unknown drafter is
 * refused by name. */
static void test_bench_spec(void) {
    char dir[256], model[512], args[1536], out[16384];
    tmp_path(dir, sizeof dir, "bench_spec");
    snprintf(model, sizeof model, "%s/m.gguf", dir);
    snprintf(args, sizeof args, "mkdir -p %s && cp models/evalmodel.gguf %s", dir, model);
    CHECK(system(args) == 0, "copy of the evaluation model into %s", dir);
    snprintf(args, sizeof args,
             "bench -m %s --depths 96 -n 2 --prefill 0 --bw-mb 16 -t 1 --spec quant:q4_0:sparse:32 --draft-max 3 "
             "--spec-tokens-per-verify 2.5 --json",
             model);
    cJSON *j = run_json(args, out, sizeof out);
    const cJSON *pts = j ? cJSON_GetObjectItemCaseSensitive(j, "points") : NULL, *p;
    int n_spec = 0;
    cJSON_ArrayForEach(p, pts) {
        if (strcmp(jstr(p, "mode"), "spec:quant:q4_0:sparse:32")) continue;
        n_spec++;
        CHECK(jnum(p, "depth") == 96 && jnum(p, "draft_step_ms") > 0 && jnum(p, "verify_ms") > 0 &&
                  jnum(p, "draft_max") >= 1 && jnum(p, "draft_max") <= 3 && jnum(p, "tokens_per_verify") > 1 &&
                  jnum(p, "tokens_per_s") > 0,
              "bench --spec point: %s", out);
    }
    CHECK(n_spec == 1, "bench --spec: %d speculative points: %s", n_spec, out);
    cJSON_Delete(j);
    snprintf(args, sizeof args, "%s.q4_0.ellm-draft", model);
    CHECK(access(args, F_OK) == 0, "the q4_0 copy was cached beside the model (%s)", args);
    snprintf(args, sizeof args, "bench -m %s --depths 16 -n 2 --prefill 0 --bw-mb 16 -t 1 --spec bogus:3", model);
    expect_error(args, "bogus");
    snprintf(args, sizeof args, "rm -rf %s", dir);
    CHECK(system(args) == 0, "removing %s", dir);
}

/* run's sparse flags: a sparse run reports its budget and recall; bad values
 * and bad profiles are refused by name. */
static void test_run_sparse(void) {
    char out[16384], args[1024], path[256];
    int rc = run("run --sparse-topk 32 --sparse-window 16 --sparse-recall-every 8 -n 120 --temp 0 --stats "
                 "-p 'def add(a, b):'", out, sizeof out);
    CHECK(rc == 0 && strstr(out, "sparse: budget 32 tokens") && strstr(out, "sparse_recall:"),
          "sparse run --stats: %d %s", rc, out);
    rc = run("run --sparse-topk 64 --sparse-adapt --sparse-dense-layers 1 --sparse-sink 2 -n 16 --temp 0 -p 'x = '",
             out, sizeof out);
    CHECK(rc == 0, "sparse run with adapt / dense layers / sink: %d %s", rc, out);
    expect_error("run --sparse-topk -5 -p x -n 2", "--sparse-topk");
    expect_error("run --sparse-topk 64 --sparse-window abc -p x -n 2", "--sparse-window");
    expect_error("run --sparse-topk 64 --sparse-profile /nonexistent-profile.txt -p x -n 2",
                 "/nonexistent-profile.txt");
    FILE *f = fopen(tmp_path(path, sizeof path, "bad_profile"), "w");
    if (f) {
        fputs("garbage\n", f);
        fclose(f);
    }
    snprintf(args, sizeof args, "run --sparse-topk 64 --sparse-profile %s -p x -n 2", path);
    expect_error(args, "ellm-sparse-profile");
    f = fopen(path, "w");
    if (f) {
        fputs("ellm-sparse-profile 1\nlayers 99 kv_heads 2\n", f);
        fclose(f);
    }
    expect_error(args, "99");
    remove(path);
    snprintf(args, sizeof args, "run --sparse-profile %s -p x -n 2", path);
    expect_error(args, "--sparse-topk");
}

/* --log-every lines: one per interval, with the GB/s read; --log-bandwidth
 * adds a bandwidth sample per line and a summary; logging changes no token. */
static void test_run_log(void) {
    char plain[16384], logged[16384], out[16384];
    int rc = run_stdout("run --sparse-topk 32 -n 60 --temp 0 -p 'def add(a, b):'", plain, sizeof plain);
    CHECK(rc == 0, "sparse run: %d %s", rc, plain);
    rc = run_redir("run --sparse-topk 32 -n 60 --temp 0 --stats --log-every 20 --log-bandwidth -p 'def add(a, b):'",
                   "2>/tmp/ellm_test_log.txt", logged, sizeof logged);
    CHECK(rc == 0 && !strcmp(plain, logged), "logging changed the output (%d):\n%s\n---\n%s", rc, plain, logged);
    size_t n = 0;
    char *err = test_read_file("/tmp/ellm_test_log.txt", &n);
    int lines = 0, good = 0;
    for (const char *p = err; p && (p = strstr(p, "log: generated=")); p++) {
        int gen = 0, pos = 0;
        double tok_s = 0, rss = 0, recall = 0, read = 0, bw = 0;
        lines++;
        if (sscanf(p, "log: generated=%d pos=%d tok_s=%lf rss_mb=%lf recall=%lf read_gbps=%lf bw_gbps=%lf", &gen, &pos,
                   &tok_s, &rss, &recall, &read, &bw) == 7 &&
            gen == 20 * lines && pos > gen && tok_s > 0 && rss > 0 && read > 0 && bw > 0)
            good++;
    }
    CHECK(lines == 2 && good == 2, "want 2 well-formed log lines (at 20 and 40 tokens), got %d of %d:\n%s", good, lines,
          err ? err : "");
    double util = 0;
    const char *u = err ? strstr(err, "sampled_bandwidth_util: ") : NULL;
    CHECK(u && sscanf(u, "sampled_bandwidth_util: %lf", &util) == 1 && util > 0 &&
              strstr(err, "bandwidth samples: 3 of the read self-test"),
          "bandwidth summary missing: %s", err ? err : "");
    free(err);
    remove("/tmp/ellm_test_log.txt");
    /* speculative steps add several tokens at once: a line when a multiple of N is passed */
    rc = run_redir("run --spec ngram -n 60 --temp 0 --log-every 20 -p 'def add(a, b):'", "2>/tmp/ellm_test_log.txt",
                   logged, sizeof logged);
    err = test_read_file("/tmp/ellm_test_log.txt", &n);
    lines = 0;
    int last = 0, ordered = 1;
    for (const char *p = err; p && (p = strstr(p, "log: generated=")); p++) {
        int gen = 0;
        if (sscanf(p, "log: generated=%d", &gen) != 1 || gen < 20 * (lines + 1) || gen >= 20 * (lines + 2) || gen <= last)
            ordered = 0;
        last = gen;
        lines++;
    }
    CHECK(rc == 0 && lines == 2 && ordered, "--spec with --log-every: want lines just past 20 and 40, got %d (rc %d):\n%s",
          lines, rc, err ? err : "");
    free(err);
    remove("/tmp/ellm_test_log.txt");
    rc = run("run -n 4 --log-bandwidth -p x", out, sizeof out);
    CHECK(rc > 0 && strstr(out, "--log-bandwidth needs --log-every"), "--log-bandwidth alone: %d %s", rc, out);
    expect_error("run -n 4 --log-every 0 -p x", "--log-every");
}

int main(void) {
    test_chat();
    test_logits();
    test_run();
    test_rope_flags();
    test_run_sparse();
    test_run_log();
    test_eval();
    test_calibrate();
    test_calibrate_fits();
    test_bench();
    test_bench_kv_compare();
    test_bench_spec();
    return test_finish();
}
