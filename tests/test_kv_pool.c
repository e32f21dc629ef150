/* KV memory on demand: the page pool hands out and takes back pages; a
 * context holds pages only for the tokens it has (a short run stays small
 * however long its context); --kv-cache-gb is a ceiling a context reports as
 * its capacity and decode refuses to pass; contexts sharing one pool take
 * pages as they grow and one proceeds when another gives its pages back; and
 * paged storage leaves the logits bit-identical to a cache of the whole
 * context. `ellm run` stops or shifts at the ceiling. */
#include "harness.h"

#include "attention/kv_cache.h"
#include "attention/kv_pool.h"
#include "ellm.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Threads of this process at idle priority (SCHED_IDLE, or nice 19 where
 * that policy is refused): the pool's helper must be one, so that it never
 * takes a core from the threads running engine steps. */
static int idle_threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        pid_t tid = (pid_t)atoi(e->d_name);
        errno = 0;
        int nice = getpriority(PRIO_PROCESS, (id_t)tid);
        n += sched_getscheduler(tid) == SCHED_IDLE || (errno == 0 && nice == 19);
    }
    closedir(d);
    return n;
}

/* Waits (up to 10 s: a liveness bound, not a timing check) for the helper
 * to make `want` pages warm. */
static int64_t wait_warm(kv_pool *p, int64_t want) {
    for (int i = 0; i < 1000 && kv_pool_pages_warm(p) < want; i++) usleep(10000);
    return kv_pool_pages_warm(p);
}

/* A warm reserve: the helper commits free pages ahead, takers get them first,
 * given-back pages stay committed while the reserve is short, and the counts
 * of used pages are unchanged by it. */
static void test_warm(void) {
    kv_pool *p = NULL;
    ellm_error err = {0};
    CHECK(kv_pool_init(10000, 8, &p, &err) == ELLM_OK, "%s", err.msg);
    if (!p) return;
    const size_t pb = kv_pool_page_bytes(p);
    CHECK(idle_threads() == 0, "no thread at idle priority before the helper starts (%d)", idle_threads());
    CHECK(kv_pool_keep_warm(p, 3 * pb + pb / 2, &err) == ELLM_OK, "%s", err.msg);
    CHECK(wait_warm(p, 3) == 3, "the helper makes 3 pages warm (%lld)", (long long)kv_pool_pages_warm(p));
    CHECK(idle_threads() == 1, "the helper runs at idle priority (%d threads at idle priority)", idle_threads());
    CHECK(kv_pool_pages_used(p) == 0, "warm pages are free (used %lld)", (long long)kv_pool_pages_used(p));
    void *pg[9] = {0};
    int distinct = 1, all = 1;
    for (int i = 0; i < 8; i++) {
        pg[i] = kv_pool_take(p);
        all &= pg[i] != NULL;
        for (int j = 0; j < i; j++) distinct &= pg[i] != pg[j];
        if (pg[i]) memset(pg[i], 0x40 + i, pb);
    }
    CHECK(all && distinct, "8 distinct pages from a pool of 8 with a warm reserve");
    CHECK(kv_pool_take(p) == NULL, "a ninth is refused");
    CHECK(kv_pool_pages_used(p) == 8 && kv_pool_pages_warm(p) == 0, "used %lld warm %lld",
          (long long)kv_pool_pages_used(p), (long long)kv_pool_pages_warm(p));
    /* a page given back while the reserve is short stays committed: taken
     * again, it still holds what was written */
    kv_pool_give(p, pg[5]);
    CHECK(kv_pool_pages_used(p) == 7 && kv_pool_pages_warm(p) == 1, "given back into the reserve");
    void *again = kv_pool_take(p);
    int kept = again == pg[5];
    for (size_t o = 0; kept && o < pb; o += 4096) kept = ((unsigned char *)again)[o] == 0x45;
    CHECK(kept, "the warm page comes back with its contents");
    /* given-back pages stay committed up to twice the reserve (the next
     * request takes as many again); beyond that they go back to the OS */
    for (int i = 0; i < 8; i++) kv_pool_give(p, pg[i]);
    CHECK(kv_pool_pages_used(p) == 0, "all given back (%lld)", (long long)kv_pool_pages_used(p));
    CHECK(kv_pool_pages_warm(p) == 6, "twice the reserve, 6 of them, stay warm (%lld)",
          (long long)kv_pool_pages_warm(p));
    /* taking them back leaves the helper idle until fewer than 3 are warm */
    void *t[4];
    for (int i = 0; i < 3; i++) t[i] = kv_pool_take(p);
    usleep(50000);
    CHECK(kv_pool_pages_warm(p) == 3, "3 taken from 6 warm: 3 left, none faulted in (%lld)",
          (long long)kv_pool_pages_warm(p));
    t[3] = kv_pool_take(p);
    CHECK(wait_warm(p, 3) == 3, "one more taken: the helper refills the reserve to 3 (%lld)",
          (long long)kv_pool_pages_warm(p));
    for (int i = 0; i < 4; i++) kv_pool_give(p, t[i]);
    CHECK(kv_pool_pages_warm(p) == 6 && kv_pool_pages_used(p) == 0, "given back: 6 warm again (%lld), none used",
          (long long)kv_pool_pages_warm(p));
    kv_pool_free(p); /* stops the helper */

    /* a reserve as large as the pool: every take still succeeds while the
     * helper holds pages */
    CHECK(kv_pool_init(10000, 4, &p, &err) == ELLM_OK, "%s", err.msg);
    if (!p) return;
    CHECK(kv_pool_keep_warm(p, 100 * pb, &err) == ELLM_OK, "%s", err.msg);
    int ok = 1;
    for (int r = 0; r < 200; r++) {
        void *a = kv_pool_take(p), *b = kv_pool_take(p), *c = kv_pool_take(p), *d = kv_pool_take(p);
        ok &= a && b && c && d && kv_pool_take(p) == NULL;
        kv_pool_give(p, a);
        kv_pool_give(p, b);
        kv_pool_give(p, c);
        kv_pool_give(p, d);
    }
    CHECK(ok, "4 takes of 4 pages succeed and a fifth fails, 200 times, with the helper at work");
    CHECK(kv_pool_pages_used(p) == 0, "nothing held at the end");
    kv_pool_free(p);
}

static void test_pool(void) {
    kv_pool *p = NULL;
    ellm_error err = {0};
    CHECK(kv_pool_init(10000, 3, &p, &err) == ELLM_OK, "%s", err.msg);
    if (!p) return;
    CHECK(kv_pool_page_bytes(p) % 4096 == 0 && kv_pool_page_bytes(p) >= 10000, "page bytes %zu",
          kv_pool_page_bytes(p));
    void *a = kv_pool_take(p), *b = kv_pool_take(p), *c = kv_pool_take(p);
    CHECK(a && b && c && a != b && b != c && a != c, "three distinct pages");
    CHECK(kv_pool_take(p) == NULL, "a fourth page is refused at the ceiling");
    CHECK(kv_pool_pages_used(p) == 3 && kv_pool_pages_total(p) == 3, "used %lld", (long long)kv_pool_pages_used(p));
    memset(b, 7, kv_pool_page_bytes(p));
    kv_pool_give(p, b);
    CHECK(kv_pool_pages_used(p) == 2, "a page given back is free");
    void *d = kv_pool_take(p);
    CHECK(d == b, "and taken again");
    CHECK(((unsigned char *)d)[100] == 0, "a page given back returns its memory (reads zero when taken again)");
    kv_pool_give(p, a);
    kv_pool_give(p, c);
    kv_pool_give(p, d);
    CHECK(kv_pool_pages_used(p) == 0, "all given back");
    kv_pool_free(p);
    CHECK(kv_pool_init(0, 3, &p, &err) == ELLM_ERR_ARG, "zero-byte pages refused");
}

static void tokens_of(int32_t *t, int n, int n_vocab, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((seed >> 33) % (uint64_t)n_vocab);
    }
}

static ellm_context *ctx_new(ellm_model *m, int n_ctx, double gb, ellm_kv_pool *pool) {
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = 2;
    cp.n_batch = 64;
    cp.kv_cache_gb = gb;
    cp.kv_pool = pool;
    ellm_context *c = NULL;
    ellm_error err = {0};
    CHECK(ellm_context_init(m, &cp, &c, &err) == ELLM_OK, "context: %s", err.msg);
    return c;
}

static void test_contexts(ellm_model *m) {
    ellm_error err = {0};
    ellm_model_info info;
    ellm_model_get_info(m, &info);
    const int pt = ellm_kv_pool_page_tokens();
    const size_t page = ellm_kv_pool_page_bytes(m, ELLM_KV_F16);
    int32_t toks[600];
    tokens_of(toks, 600, info.n_vocab, 99);

    /* a short run in a long context holds one page */
    ellm_context *big = ctx_new(m, 4096, 0, NULL);
    if (!big) return;
    ellm_kv_pool_stats ps;
    ellm_kv_pool_get_stats(ellm_context_kv_pool(big), &ps);
    CHECK(ps.pages_used == 0 && ps.pages_total == 4096 / pt, "fresh context: %lld of %lld pages",
          (long long)ps.pages_used, (long long)ps.pages_total);
    CHECK(ellm_decode(big, toks, 10, NULL, &err) == ELLM_OK, "%s", err.msg);
    ellm_kv_pool_get_stats(ellm_context_kv_pool(big), &ps);
    CHECK(ps.pages_used == 1 && ellm_context_kv_pages(big) == 1,
          "10 tokens of a 4096-token context hold 1 page (%lld, %zu bytes of %zu)", (long long)ps.pages_used,
          (size_t)ps.pages_used * ps.page_bytes, (size_t)ps.pages_total * ps.page_bytes);

    /* the ceiling: 2 pages under a 4096-token context */
    ellm_context *cap = ctx_new(m, 4096, 2.5 * (double)page / 1e9, NULL);
    if (cap) {
        CHECK(ellm_context_capacity(cap) == 2 * pt && ellm_context_n_ctx(cap) == 4096, "capacity %d of n_ctx %d",
              ellm_context_capacity(cap), ellm_context_n_ctx(cap));
        CHECK(ellm_decode(cap, toks, 2 * pt, NULL, &err) == ELLM_OK, "%s", err.msg);
        CHECK(ellm_context_room(cap) == 0, "room %d at the ceiling", ellm_context_room(cap));
        ellm_status st = ellm_decode(cap, toks, 1, NULL, &err);
        CHECK(st == ELLM_ERR_CONTEXT_FULL && strstr(err.msg, "--kv-cache-gb"),
              "a token past the ceiling is refused, naming --kv-cache-gb: %d %s", st, err.msg);
        CHECK(ellm_context_pos(cap) == 2 * pt, "the refused token left the cache as it was");
        /* paged storage does not change results: same logits as the big context */
        float *la = malloc((size_t)info.n_vocab * 4);
        ellm_context_truncate(big, 0);
        CHECK(ellm_decode(big, toks, 2 * pt, NULL, &err) == ELLM_OK, "%s", err.msg);
        memcpy(la, ellm_context_logits(big), (size_t)info.n_vocab * 4);
        CHECK(!memcmp(la, ellm_context_logits(cap), (size_t)info.n_vocab * 4),
              "logits at %d tokens bit-identical with a 2-page pool and a 32-page one", 2 * pt);
        ellm_context_truncate(cap, 10);
        CHECK(ellm_context_kv_pages(cap) == 1 + 1, "truncating keeps the page in use and one spare (%d)",
              ellm_context_kv_pages(cap));
        ellm_context_truncate(cap, 0);
        CHECK(ellm_context_kv_pages(cap) == 0, "truncating to 0 gives every page back");
        free(la);
        ellm_context_free(cap);
    }

    /* one pool of 3 pages shared by two contexts */
    ellm_kv_pool *pool = NULL;
    CHECK(ellm_kv_pool_init(m, ELLM_KV_F16, 3.5 * (double)page / 1e9, &pool, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_kv_pool_init(m, ELLM_KV_F16, 0.5 * (double)page / 1e9, &(ellm_kv_pool *){NULL}, &err) == ELLM_ERR_ARG,
          "a pool below one page is refused");
    if (pool) {
        ellm_context *a = ctx_new(m, 1024, 0, pool), *b = ctx_new(m, 1024, 0, pool);
        if (a && b) {
            CHECK(ellm_context_capacity(a) == 3 * pt, "shared capacity %d", ellm_context_capacity(a));
            CHECK(ellm_decode(a, toks, pt + 20, NULL, &err) == ELLM_OK, "%s", err.msg); /* 2 pages */
            CHECK(ellm_decode(b, toks + 100, 30, NULL, &err) == ELLM_OK, "%s", err.msg); /* 1 page */
            ellm_kv_pool_get_stats(pool, &ps);
            CHECK(ps.pages_used == 3, "both contexts draw from the pool: %lld pages", (long long)ps.pages_used);
            CHECK(ellm_context_room(b) == pt - 30, "b can grow only within its page: room %d", ellm_context_room(b));
            ellm_status st = ellm_decode(b, toks + 130, pt, NULL, &err);
            CHECK(st == ELLM_ERR_CONTEXT_FULL, "b cannot take a second page while a holds two: %d", st);
            ellm_context_truncate(a, 0);
            CHECK(ellm_decode(b, toks + 130, pt, NULL, &err) == ELLM_OK, "b proceeds once a gave its pages back: %s",
                  err.msg);
            /* b's logits equal a private context's fed the same tokens */
            ellm_context *solo = ctx_new(m, 1024, 0, NULL);
            if (solo) {
                CHECK(ellm_decode(solo, toks + 100, 30, NULL, &err) == ELLM_OK &&
                          ellm_decode(solo, toks + 130, pt, NULL, &err) == ELLM_OK,
                      "%s", err.msg);
                CHECK(!memcmp(ellm_context_logits(solo), ellm_context_logits(b), (size_t)info.n_vocab * 4),
                      "a shared-pool context's logits are bit-identical to a private one's");
                ellm_context_free(solo);
            }
        }
        ellm_context_free(a);
        ellm_context_free(b);
        ellm_kv_pool_get_stats(pool, &ps);
        CHECK(ps.pages_used == 0, "freed contexts give their pages back (%lld)", (long long)ps.pages_used);
        ellm_context *q8 = NULL;
        ellm_context_params cp = ellm_context_default_params();
        cp.kv_type = ELLM_KV_Q8_0;
        cp.kv_pool = pool;
        CHECK(ellm_context_init(m, &cp, &q8, &err) == ELLM_ERR_ARG, "a pool of F16 pages refuses a Q8_0 context");
        ellm_kv_pool_free(pool);
    }

    /* a long context with a pool of its own takes longer pages (longer runs
     * of each head's blocks for dense attention); the logits do not change */
    const int lpt = pt * (KV_PAGE_BLOCKS_LONG / KV_PAGE_BLOCKS);
    ellm_context *longc = ctx_new(m, 8192, 0, NULL);
    if (longc) {
        ellm_kv_pool_get_stats(ellm_context_kv_pool(longc), &ps);
        CHECK(lpt > pt && ps.page_tokens == lpt && ps.pages_total == 8192 / lpt && ps.pages_used == 0,
              "an 8192-token context: %lld pages of %d tokens (%d-token pages below 8192)", (long long)ps.pages_total,
              ps.page_tokens, pt);
        ellm_context_truncate(big, 0);
        CHECK(ellm_decode(big, toks, 600, NULL, &err) == ELLM_OK && ellm_decode(longc, toks, 600, NULL, &err) == ELLM_OK,
              "%s", err.msg);
        ellm_kv_pool_get_stats(ellm_context_kv_pool(longc), &ps);
        CHECK(ps.pages_used == (600 + lpt - 1) / lpt, "600 tokens hold %lld pages of %d", (long long)ps.pages_used,
              ps.page_tokens);
        CHECK(!memcmp(ellm_context_logits(big), ellm_context_logits(longc), (size_t)info.n_vocab * 4),
              "logits at 600 tokens bit-identical with %d- and %d-token pages", pt, lpt);
        ellm_context_free(longc);
    }
    ellm_context_free(big);
}

/* `ellm run` with -c 4096 and a 2-page --kv-cache-gb: stop at the ceiling, or shift past it. */
static void test_cli(ellm_model *m) {
    char args[1024], out[16384];
    const double gb = 2.5 * (double)ellm_kv_pool_page_bytes(m, ELLM_KV_F16) / 1e9;
    const int pt = ellm_kv_pool_page_tokens();
    snprintf(args, sizeof args,
             "run -m models/evalmodel.gguf -p 'import os' -n 400 -c 4096 --kv-cache-gb %.9f --temp 0 -t 2 "
             "--ctx-overflow stop",
             gb);
    int rc = test_ellm(args, out, sizeof out);
    char want[128];
    snprintf(want, sizeof want, "KV memory full (--kv-cache-gb): %d tokens held", 2 * pt);
    CHECK(rc == 0 && strstr(out, want), "run stops at the KV ceiling with a message (rc %d): %.300s", rc,
          strstr(out, "KV memory") ? strstr(out, "KV memory") : out);
    snprintf(args, sizeof args,
             "run -m models/evalmodel.gguf -p 'import os' -n 400 -c 4096 --kv-cache-gb %.9f --temp 0 -t 2 "
             "--ctx-overflow shift --stats",
             gb);
    rc = test_ellm(args, out, sizeof out);
    const char *sh = strstr(out, "context shifts:");
    CHECK(rc == 0 && sh && atoi(sh + 15) >= 2, "run shifts past the KV ceiling (rc %d): %.200s", rc, sh ? sh : out);
}

/* The KV types' names (the GGUF type names the CLI flags take). */
static void test_type_names(void) {
    CHECK(!strcmp(ellm_kv_type_name(ELLM_KV_F16), "f16") && !strcmp(ellm_kv_type_name(ELLM_KV_F32), "f32") &&
              !strcmp(ellm_kv_type_name(ELLM_KV_Q8_0), "q8_0"),
          "KV type names: %s %s %s", ellm_kv_type_name(ELLM_KV_F16), ellm_kv_type_name(ELLM_KV_F32),
          ellm_kv_type_name(ELLM_KV_Q8_0));
    CHECK(!strcmp(ellm_kv_type_name((ellm_kv_type)7), "unknown"), "KV type 7: %s", ellm_kv_type_name((ellm_kv_type)7));
}

int main(void) {
    test_type_names();
    test_pool();
    test_warm();
    ellm_model *m = test_load_model("models/evalmodel.gguf", NULL);
    if (!m) return test_finish();
    test_contexts(m);
    test_cli(m);
    ellm_model_free(m);
    return test_finish();
}
