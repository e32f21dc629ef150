/* `ellm serve --mpi` end to end under mpirun (2 ranks, 127.0.0.1): greedy
 * completions through the sharded server equal `ellm run --temp 0` and the
 * server without MPI, for prompts that cross a shard boundary (512 tokens),
 * two at once (one batched pass over both slots) and one reusing a cut
 * prefix of a slot's KV; a follower that dies makes /health answer 503
 * naming the lost rank and requests fail with 503; a follower that hangs
 * during a request makes that request fail with 503 within the timeout;
 * sparse attention (--sparse-topk) through the sharded server equals
 * `ellm run --sparse-topk` with the server's prefill chunks; --spec and
 * --slot-save-path are refused.
 * Skipped, and counted, where mpirun or curl is missing. */
#include "harness.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* libmpi keeps allocations until exit: no leak reports from it under ASan */
#define MPIRUN                                                                                                         \
    "ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 exec mpirun --oversubscribe --allow-run-as-root --bind-to none "      \
    "--mca orte_abort_on_non_zero_status 0 -np 2 "
#define MODEL "models/evalmodel.gguf"
#define N_GEN 16

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    pid_t pid; /* the shell that execs mpirun (or ellm), leader of its process group */
    char log[640];
    int port;
} server;

/* Starts `cmd` (stdout and stderr into a log) in a process group of its own
 * and waits up to 60 s for /health to answer 200. Returns 1 when it does. */
static int server_start(server *s, const char *cmd, const char *name) {
    memset(s, 0, sizeof *s);
    snprintf(s->log, sizeof s->log, "%s", test_tmp_path(name));
    fflush(stdout);
    s->pid = fork();
    if (s->pid < 0) return 0;
    if (s->pid == 0) {
        setpgid(0, 0);
        if (!freopen(s->log, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(127);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(s->pid, s->pid);
    const double t0 = now_s();
    while (now_s() - t0 < 60) {
        char *log = test_read_file(s->log, NULL);
        const char *at = log ? strstr(log, "listening on http://127.0.0.1:") : NULL;
        if (at) s->port = atoi(at + strlen("listening on http://127.0.0.1:"));
        free(log);
        if (s->port > 0) {
            char c[256], out[64];
            snprintf(c, sizeof c, "curl -s -m 5 -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health", s->port);
            if (test_shell(c, out, sizeof out) == 0 && !strcmp(out, "200")) return 1;
        }
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            return 0;
        }
        usleep(100000);
    }
    return 0;
}

/* SIGTERM to the group (mpirun ends its ranks), SIGKILL after 15 s. */
static void server_stop(server *s) {
    if (s->pid <= 0) return;
    kill(-s->pid, SIGTERM);
    const double t0 = now_s();
    while (waitpid(s->pid, NULL, WNOHANG) == 0) {
        if (now_s() - t0 > 15) {
            kill(-s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
            break;
        }
        usleep(50000);
    }
    s->pid = 0;
}

static char *server_log(const server *s) {
    char *log = test_read_file(s->log, NULL);
    return log ? log : strdup("(no log)");
}

/* The JSON body of a greedy completion of the prompt in file `prompt`, into
 * file `body`. */
static int write_body(const char *prompt, const char *body, int max_tokens) {
    char *text = test_read_file(prompt, NULL);
    if (!text) return 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", text);
    cJSON_AddNumberToObject(o, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(o, "temperature", 0);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(text);
    FILE *f = fopen(body, "w");
    int ok = f && s && fputs(s, f) >= 0;
    if (f) fclose(f);
    free(s);
    return ok;
}

/* POSTs each body[i] to /v1/completions at once (one curl each, in
 * parallel); out[i] gets the response file's path, code[i] the HTTP status. */
static void post_all(const server *s, int n, const char *const *body, const char *const *out, int *code) {
    char cmd[4096] = "", one[800];
    for (int i = 0; i < n; i++) {
        snprintf(one, sizeof one,
                 "curl -s -m 90 -o %s -w '%%{http_code}' -H 'Content-Type: application/json' -d @%s "
                 "http://127.0.0.1:%d/v1/completions > %s.code & ",
                 out[i], body[i], s->port, out[i]);
        strncat(cmd, one, sizeof cmd - strlen(cmd) - 1);
    }
    strncat(cmd, "wait", sizeof cmd - strlen(cmd) - 1);
    char sink[64];
    test_shell(cmd, sink, sizeof sink);
    for (int i = 0; i < n; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s.code", out[i]);
        char *c = test_read_file(p, NULL);
        code[i] = c ? atoi(c) : 0;
        free(c);
    }
}

/* choices[0].text of a completion response file, or NULL. */
static char *completion_text(const char *path) {
    char *raw = test_read_file(path, NULL);
    cJSON *o = raw ? cJSON_Parse(raw) : NULL;
    free(raw);
    const cJSON *ch = o ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0) : NULL;
    const cJSON *t = ch ? cJSON_GetObjectItemCaseSensitive(ch, "text") : NULL;
    char *text = cJSON_IsString(t) ? strdup(t->valuestring) : NULL;
    cJSON_Delete(o);
    return text;
}

/* error.code of an OpenAI-style error response file (static), or "". */
static const char *error_code(const char *path) {
    static char code[64];
    code[0] = 0;
    char *raw = test_read_file(path, NULL);
    cJSON *o = raw ? cJSON_Parse(raw) : NULL;
    free(raw);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"), "code");
    if (cJSON_IsString(c)) snprintf(code, sizeof code, "%s", c->valuestring);
    cJSON_Delete(o);
    return code;
}

/* `ellm run --temp 0` of the prompt file: the reference text (run ends its
 * output with a newline, which is not part of the text). */
static char *run_greedy(const char *prompt, const char *extra) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s run -m " MODEL " -f %s -n %d --temp 0 -t 1 --no-display-prompt %s 2>/dev/null",
             test_ellm_bin(), prompt, N_GEN, extra);
    char *out = malloc(1 << 16);
    if (!out) return NULL;
    if (test_shell(cmd, out, 1 << 16) != 0) {
        free(out);
        return NULL;
    }
    size_t n = strlen(out);
    if (n && out[n - 1] == '\n') out[n - 1] = 0;
    return out;
}

/* A prompt of `lines` numbered sentences (about 45 tokens each); the first
 * 10 are the same for every salt. */
static void write_prompt(const char *path, int lines, int salt) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    for (int i = 0; i < lines; i++)
        fprintf(f, "%sItem %d: the river runs past the old mill, and the miller counts %d sacks of %s before dark.",
                i ? "\n" : "", i, i * 7 + 3 + (i < 10 ? 0 : salt), i < 10 || !salt ? "grain" : "barley");
    fclose(f);
}

/* The follower's pid from its log line, or 0. */
static pid_t follower_pid(const server *s) {
    char *log = server_log(s);
    const char *at = strstr(log, "MPI rank 1 of 2 (pid ");
    pid_t pid = at ? (pid_t)atoi(at + strlen("MPI rank 1 of 2 (pid ")) : 0;
    free(log);
    return pid;
}

/* GET /health into file `out`; the HTTP status. */
static int health(const server *s, const char *out) {
    char c[700], code[64];
    snprintf(c, sizeof c, "curl -s -m 10 -o %s -w '%%{http_code}' http://127.0.0.1:%d/health", out, s->port);
    return test_shell(c, code, sizeof code) == 0 ? atoi(code) : 0;
}

/* `ellm serve --mpi ... FLAGS` on 2 ranks, the request in `body` alone in a
 * fresh slot: its completion text must be `want` (from ellm run with the
 * same flags). */
static void mpi_serve_alone(const char *flags, const char *want, const char *log_name, const char *body,
                            const char *resp) {
    char cmd[1024];
    server s = {0}; /* pid 0: server_stop does nothing if it never started */
    snprintf(cmd, sizeof cmd, MPIRUN "%s serve --mpi -m " MODEL " --port 0 -t 1 -c 1024 --parallel 2 %s",
             test_ellm_bin(), flags);
    int up = want && server_start(&s, cmd, log_name);
    CHECK(up, "serve --mpi %s did not start", flags);
    if (up) {
        int code = 0;
        const char *b[1] = {body}, *r[1] = {resp};
        post_all(&s, 1, b, r, &code);
        char *t = completion_text(resp);
        CHECK(code == 200 && t && !strcmp(t, want), "serve --mpi %s: %d '%s', want '%s'", flags, code,
              t ? t : "(none)", want);
        free(t);
    }
    server_stop(&s);
}

static void test_greedy(void) {
    char path[9][640]; /* test_tmp_path's buffers rotate: copies */
    const char *name[9] = {"a.txt", "b.txt", "c.txt", "a.json", "b.json", "c.json", "a.out", "b.out", "c.out"};
    for (int i = 0; i < 9; i++) snprintf(path[i], sizeof path[i], "%s", test_tmp_path(name[i]));
    write_prompt(path[0], 14, 0); /* ~630 tokens: positions 512.. live on rank 1 */
    write_prompt(path[1], 13, 1);
    write_prompt(path[2], 16, 5); /* the first 10 lines are a's: a prefix of a's slot is kept and cut */
    const char *prompts[3] = {path[0], path[1], path[2]};
    const char *body[3] = {path[3], path[4], path[5]};
    const char *resp[3] = {path[6], path[7], path[8]};
    char *ref[3];
    for (int i = 0; i < 3; i++) {
        ref[i] = run_greedy(prompts[i], "");
        CHECK(ref[i] && *ref[i], "ellm run --temp 0 of prompt %d failed", i);
        CHECK(write_body(prompts[i], body[i], N_GEN), "cannot write request %d", i);
    }
    if (!ref[0] || !ref[1] || !ref[2]) goto out;

    char cmd[1024];
    server s;
    /* without MPI: the same text */
    snprintf(cmd, sizeof cmd, "exec %s serve -m " MODEL " --port 0 -t 1 -c 1024 --parallel 2", test_ellm_bin());
    int up = server_start(&s, cmd, "plain.log");
    CHECK(up, "ellm serve did not start");
    if (up) {
        int code[1];
        post_all(&s, 1, body, resp, code);
        char *t = completion_text(resp[0]);
        CHECK(code[0] == 200 && t && !strcmp(t, ref[0]), "serve: %d '%s', want ellm run's '%s'", code[0],
              t ? t : "(none)", ref[0]);
        free(t);
    }
    server_stop(&s);

    snprintf(cmd, sizeof cmd, MPIRUN "%s serve --mpi -m " MODEL " --port 0 -t 1 -c 1024 --parallel 2",
             test_ellm_bin());
    up = server_start(&s, cmd, "mpi.log");
    char *log = server_log(&s);
    CHECK(up && strstr(log, "MPI rank 1 of 2 (pid ") && strstr(log, "following rank 0 (2 slots x 1024 tokens)"),
          "serve --mpi did not start with a follower: %s", log);
    free(log);
    if (up) {
        /* a and b at once: passes over both slots (each sharded) */
        int code[3];
        post_all(&s, 2, body, resp, code);
        for (int i = 0; i < 2; i++) {
            char *t = completion_text(resp[i]);
            CHECK(code[i] == 200 && t && !strcmp(t, ref[i]), "serve --mpi, prompt %d of 2 at once: %d '%s', want '%s'",
                  i, code[i], t ? t : "(none)", ref[i]);
            free(t);
        }
        /* c after them: reuses a's slot up to the shared prefix, cut on both ranks */
        post_all(&s, 1, body + 2, resp + 2, code + 2);
        char *t = completion_text(resp[2]);
        CHECK(code[2] == 200 && t && !strcmp(t, ref[2]), "serve --mpi, prefix reuse: %d '%s', want '%s'", code[2],
              t ? t : "(none)", ref[2]);
        free(t);
        char *raw = test_read_file(resp[2], NULL);
        const char *cached = raw ? strstr(raw, "\"cached_tokens\":") : NULL;
        CHECK(cached && atoi(cached + strlen("\"cached_tokens\":")) > 300, "prefix reuse: no cached tokens in %s",
              raw ? raw : "(none)");
        free(raw);
    }
    server_stop(&s);

    /* sparse attention: every rank selects from its copy of the index. A
     * batch's selection depends on where the prompt's batches start (one
     * process too), so the reference prefills in the server's 128-token
     * chunks and the request runs alone in a fresh slot (with other
     * sequences generating, the scheduler may shorten a chunk). */
    char *sref = run_greedy(prompts[0], "-b 128 --sparse-topk 64");
    CHECK(sref && strcmp(sref, ref[0]), "ellm run --sparse-topk 64 failed or equals dense: %s", sref ? sref : "");
    mpi_serve_alone("--sparse-topk 64", sref, "sparse.log", body[0], resp[0]);
    free(sref);

    /* a Q8_0 cache (--kv-type q8_0 on every rank): ellm run --kv-type q8_0's text */
    char *qref = run_greedy(prompts[0], "--kv-type q8_0");
    CHECK(qref && *qref, "ellm run --kv-type q8_0 failed");
    mpi_serve_alone("--kv-type q8_0", qref, "q8.log", body[0], resp[0]);
    free(qref);
out:
    for (int i = 0; i < 3; i++) free(ref[i]);
}

/* What a sharded slot cannot do is refused before MPI starts. */
static void test_refused(void) {
    char out[1024];
    int rc = test_ellm("serve --mpi --spec ngram", out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--mpi does not support --spec"), "serve --mpi --spec: exit %d: %s", rc, out);
    rc = test_ellm("serve --mpi --slot-save-path .", out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--mpi does not support --slot-save-path"), "serve --mpi --slot-save-path: exit %d: %s",
          rc, out);
}

static void test_lost_rank(void) {
    char cmd[1024];
    char body[640], h[640], r[640];
    snprintf(body, sizeof body, "%s", test_tmp_path("a.json")); /* test_greedy's request a */
    snprintf(h, sizeof h, "%s", test_tmp_path("health.out"));
    snprintf(r, sizeof r, "%s", test_tmp_path("r.out"));
    server s;
    /* a follower that dies while the server is idle: the heartbeat notices */
    snprintf(cmd, sizeof cmd, MPIRUN "%s serve --mpi --mpi-timeout 2 -m " MODEL " --port 0 -t 1 -c 1024 --parallel 2",
             test_ellm_bin());
    int up = server_start(&s, cmd, "kill.log");
    pid_t f = up ? follower_pid(&s) : 0;
    CHECK(up && f > 0, "serve --mpi (kill) did not start");
    if (f > 0) {
        kill(f, SIGKILL);
        int code = 0;
        const double t0 = now_s();
        while ((code = health(&s, h)) == 200 && now_s() - t0 < 20) usleep(200000);
        char *raw = test_read_file(h, NULL);
        CHECK(code == 503 && raw && !strcmp(error_code(h), "mpi_rank_lost") && strstr(raw, "lost an MPI rank") &&
                  strstr(raw, "no answer from the other ranks within 2 s"),
              "killed follower: /health %d %s", code, raw ? raw : "(none)");
        free(raw);
        const char *b[1] = {body}, *o[1] = {r};
        int rc[1];
        post_all(&s, 1, b, o, rc);
        CHECK(rc[0] == 503 && !strcmp(error_code(r), "mpi_rank_lost"), "killed follower: completion %d (%s)", rc[0],
              error_code(r));
    }
    server_stop(&s);

    /* a follower that stops answering while a request runs (at its 60th
     * exchange: the 10th pass of 6 layers): the request fails with 503
     * within the timeout, not a hang */
    snprintf(cmd, sizeof cmd,
             "ELLM_MPI_FAULT=hang,1,60 " MPIRUN "%s serve --mpi --mpi-timeout 2 -m " MODEL
             " --port 0 -t 1 -c 1024 --parallel 2",
             test_ellm_bin());
    up = server_start(&s, cmd, "hang.log");
    CHECK(up, "serve --mpi (hang) did not start");
    if (up) {
        char c[1200], sink[64];
        snprintf(c, sizeof c,
                 "curl -s -m 60 -o %s -w '%%{http_code}' -H 'Content-Type: application/json' "
                 "-d '{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"temperature\":0,\"ignore_eos\":true}' "
                 "http://127.0.0.1:%d/v1/completions",
                 r, s.port);
        const double t0 = now_s();
        test_shell(c, sink, sizeof sink);
        const double took = now_s() - t0;
        char *raw = test_read_file(r, NULL);
        CHECK(atoi(sink) == 503 && !strcmp(error_code(r), "mpi_rank_lost") && took < 30,
              "hung follower: completion %s after %.1f s: %s", sink, took, raw ? raw : "(none)");
        free(raw);
        CHECK(health(&s, h) == 503 && !strcmp(error_code(h), "mpi_rank_lost"), "hung follower: /health not 503");
    }
    server_stop(&s);
}

int main(void) {
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        SKIP("mpirun not found: serve --mpi tests not run (tools/install-deps.sh installs openmpi-bin)");
        return test_finish();
    }
    if (system("command -v curl >/dev/null 2>&1") != 0) {
        SKIP("curl not found: serve --mpi tests not run");
        return test_finish();
    }
    test_refused();
    test_greedy();
    test_lost_rank();
    return test_finish();
}
