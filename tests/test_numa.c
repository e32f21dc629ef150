/* NUMA placement end to end: every --numa mode computes exactly what the
 * default does (bit-identical logits), on this machine and on a faked
 * two-node topology (ELLM_TOPOLOGY) that drives the multi-node code paths
 * (per-node row split, per-node weight copies, KV heads per node) on one
 * node; the placement helpers put pages where asked; `ellm run` gives the
 * same tokens with and without the flags; bad flags are refused. */
#include "harness.h"
#include "topology/place.h"

#include "ellm.h"

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_TOK 24

/* Logits (N_TOK x n_vocab) of a prefill then decode steps (prefill of half,
 * then one token at a time) with `numa` placement; NULL on failure. */
static float *logits_with(const char *path, ellm_numa_mode numa, int n_threads, int *n_vocab, char *placement,
                          size_t cap) {
    ellm_model_params mp = {.n_threads = n_threads, .pin_threads = 1, .numa = numa};
    ellm_model *m = NULL;
    ellm_error err = {0};
    if (ellm_model_load(path, &mp, &m, &err) != ELLM_OK) {
        CHECK(0, "load %s with numa %d: %s", path, numa, err.msg);
        return NULL;
    }
    ellm_model_info info;
    ellm_model_get_info(m, &info);
    *n_vocab = info.n_vocab;
    snprintf(placement, cap, "%s", info.placement);
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 64;
    ellm_context *ctx = NULL;
    float *out = malloc((size_t)N_TOK * info.n_vocab * sizeof *out);
    int32_t ids[N_TOK];
    for (int i = 0; i < N_TOK; i++) ids[i] = (int32_t)(1 + (i * 37) % (info.n_vocab - 1));
    ellm_status st = ellm_context_init(m, &cp, &ctx, &err);
    if (st == ELLM_OK) st = ellm_decode(ctx, ids, N_TOK / 2, out, &err);
    for (int i = N_TOK / 2; i < N_TOK && st == ELLM_OK; i++)
        st = ellm_decode(ctx, ids + i, 1, out + (size_t)i * info.n_vocab, &err);
    CHECK(st == ELLM_OK, "numa %d: %s", numa, err.msg);
    ellm_context_free(ctx);
    ellm_model_free(m);
    if (st != ELLM_OK) {
        free(out);
        return NULL;
    }
    return out;
}

static void test_modes_identical(const char *model, const char *fake_topology) {
    if (fake_topology) setenv("ELLM_TOPOLOGY", fake_topology, 1);
    else unsetenv("ELLM_TOPOLOGY");
    char path[512], place[320];
    snprintf(path, sizeof path, "%s/models/%s", test_data_dir(), model);
    int nv = 0;
    float *ref = logits_with(path, ELLM_NUMA_OFF, 2, &nv, place, sizeof place);
    CHECK(strstr(place, "numa off") != NULL, "off placement: %s", place);
    static const ellm_numa_mode modes[] = {ELLM_NUMA_DISTRIBUTE, ELLM_NUMA_REPLICATE, ELLM_NUMA_INTERLEAVE};
    static const char *const names[] = {"distribute", "replicate", "interleave"};
    for (int i = 0; i < 3 && ref; i++) {
        int nv2 = 0;
        float *got = logits_with(path, modes[i], 2, &nv2, place, sizeof place);
        if (!got) continue;
        CHECK(nv2 == nv && !memcmp(got, ref, (size_t)N_TOK * nv * sizeof *got),
              "%s, %s, topology %s: logits differ from numa off", model, names[i],
              fake_topology ? fake_topology : "of this machine");
        CHECK(strstr(place, names[i]) != NULL, "placement says '%s' for %s", place, names[i]);
        if (fake_topology) CHECK(strstr(place, "2 nodes") && strstr(place, "node 1: cpus 1"), "fake 2-node plan: %s", place);
        free(got);
    }
    free(ref);
    unsetenv("ELLM_TOPOLOGY");
}

static void test_place_helpers(void) {
    if (!place_numa_available()) {
        printf("SKIP: placement helpers (the kernel has no NUMA support)\n");
        return;
    }
    size_t bytes = 8u << 20;
    char *p = place_alloc_on_node(bytes, 0);
    CHECK(p != NULL, "allocation on node 0");
    if (!p) return;
    memset(p, 1, bytes);
    int count[4] = {0};
    int found = place_page_nodes(p, bytes, 256, count, 4);
    CHECK(found == 256 && count[0] == 256, "pages on node 0: %d of %d sampled", count[0], found);
    CHECK(place_on_node(p, bytes, 0, PLACE_MOVE) == 0, "bind to node 0");
    CHECK(place_alloc_on_node(bytes, 999) == NULL, "allocation on node 999 succeeded");
    place_free(p, bytes);
}

static void test_cli(void) {
    static char ref[16384], got[16384];
    const char *base = "run -n 32 --seed 5 --temp 0.7 -p 'def add(a, b):' --no-display-prompt";
    char args[512];
    int rc = test_ellm(base, ref, sizeof ref);
    CHECK(rc == 0 && strlen(ref) > 10, "ellm run: %d %s", rc, ref);
    static const char *const flags[] = {"--numa-aware", "--numa distribute", "--numa replicate", "--numa interleave",
                                        "--numa off", "--numa-aware --mlock"};
    for (int i = 0; i < 6; i++) {
        snprintf(args, sizeof args, "%s %s", base, flags[i]);
        rc = test_ellm(args, got, sizeof got);
        CHECK(rc == 0 && !strcmp(got, ref), "%s changes the output:\n%s\n---\n%s", flags[i], ref, got);
    }
    snprintf(args, sizeof args, "%s --numa-aware --stats", base);
    rc = test_ellm(args, got, sizeof got);
    CHECK(rc == 0 && strstr(got, "placement: ") && strstr(got, "numa distribute"), "--stats placement line: %s", got);
    rc = test_ellm("run -n 4 --numa sideways", got, sizeof got);
    CHECK(rc == 2 && strstr(got, "--numa") && strstr(got, "sideways"), "bad --numa: %d %s", rc, got);
    rc = test_ellm("run -n 4 --numa", got, sizeof got);
    CHECK(rc == 2 && strstr(got, "--numa"), "--numa without a value: %d %s", rc, got);
    rc = test_ellm("bench -n 4 --depths 0 --prefill 0 --bw-mb 16 --numa-aware --json", got, sizeof got);
    CHECK(rc == 0 && strstr(got, "\"points\""), "bench --numa-aware: %d %s", rc, got);
}

int main(void) {
    test_modes_identical("llama-gqa-Q8_0.gguf", NULL);
    test_modes_identical("llama-gqa-Q8_0.gguf", "pack:2 [numa(memory=8589934592)] core:1 pu:1");
    test_modes_identical("llama-gqa-Q4_K_M.gguf", "pack:1 group:2 [numa(memory=8589934592)] core:1 pu:1");
    test_place_helpers();
    test_cli();
    return test_finish();
}
