/* The ellm command end to end: `ellm logits` reproduces the reference logits,
 * `ellm run` is deterministic per seed, and bad input gets a clear message and
 * a non-zero exit instead of a crash. Runs $ELLM_BIN (default build/ellm). */
#include "harness.h"

#include <string.h>
#include <sys/wait.h>

static const char *bin(void) {
    const char *b = getenv("ELLM_BIN");
    return b && *b ? b : "build/ellm";
}

/* Runs `args` through the shell, capturing stdout+stderr into out (cap bytes).
 * Returns the exit status, or -1 if the process died from a signal. */
static int run(const char *args, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin(), args);
    FILE *p = popen(cmd, "r");
    if (!p) return -2;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    if (WIFSIGNALED(st)) return -1;
    return WEXITSTATUS(st);
}

static void test_logits(void) {
    const char *d = test_data_dir();
    char args[1024], out[8192];
    /* ids file: both lines of the tokens file (prompt + greedy continuation) */
    snprintf(args, sizeof args, "logits -m %s/models/llama-gqa.gguf --ids %s/models/llama-gqa.tokens.txt "
             "-o /tmp/ellm_test_logits.f32 --kv-type f32 -t 2", d, d);
    int rc = run(args, out, sizeof out);
    CHECK(rc == 0, "ellm logits failed (%d): %s", rc, out);
    size_t n_got = 0, n_ref = 0;
    char ref_path[512];
    snprintf(ref_path, sizeof ref_path, "%s/models/llama-gqa.logits.f32", d);
    float *got = (float *)test_read_file("/tmp/ellm_test_logits.f32", &n_got);
    float *ref = (float *)test_read_file(ref_path, &n_ref);
    CHECK(got && ref && n_got == n_ref, "logits size %zu vs reference %zu", n_got, n_ref);
    if (got && ref && n_got == n_ref) {
        double maxd = 0, maxr = 0;
        for (size_t i = 0; i < n_ref / 4; i++) {
            double dd = fabs((double)got[i] - ref[i]);
            if (!(dd <= maxd)) maxd = dd;
            if (fabs(ref[i]) > maxr) maxr = fabs(ref[i]);
        }
        CHECK(maxd <= 1e-4 * maxr, "ellm logits max diff %.3g (max |ref| %.3g)", maxd, maxr);
    }
    free(got);
    free(ref);
    remove("/tmp/ellm_test_logits.f32");

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

    /* --stats reports load time and speeds */
    int rc = run("run -n 8 --temp 0 --stats -p 'import os'", a, sizeof a);
    CHECK(rc == 0 && strstr(a, "model_load_ms:") && strstr(a, "decode:") && strstr(a, "prompt:"),
          "stats: %s", a);

    /* Too long for the context: refused up front with the numbers. */
    rc = run("run -n 5000 -p 'x'", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "context"), "n beyond the training context: %d %s", rc, a);
    rc = run("run -n 100 -c 50 -p 'import os'", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "context size of 50"), "n beyond -c: %d %s", rc, a);

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

static void test_chat(void) {
    char a[16384];
    /* one chat turn with a built-in template and the embedded model */
    int rc = run("run --chat-template chatml --system 'Be brief.' -p 'hi' -n 8 --seed 1", a, sizeof a);
    CHECK(rc == 0, "chat turn: %d %s", rc, a);
    rc = run("run --chat-template no-such-template -p 'hi' -n 8", a, sizeof a);
    CHECK(rc > 0 && strstr(a, "no-such-template"), "unknown template: %d %s", rc, a);
    /* interactive chat from stdin: two turns, then EOF ends the session */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf 'hello\\nagain\\n' | %s run --chat --chat-template llama2 -n 6 --seed 3 -c 512 2>&1", bin());
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(a, 1, sizeof a - 1, p) : 0;
    a[n] = 0;
    int st = p ? pclose(p) : -1;
    CHECK(st == 0, "interactive chat exit %d: %s", st, a);
    int lines = 0;
    for (char *c = a; *c; c++) lines += *c == '\n';
    CHECK(lines >= 2, "expected one reply line per turn: %s", a);
}

int main(void) {
    test_chat();
    test_logits();
    test_run();
    return test_finish();
}
