/* KV cache and fused attention: layout, F16 conversion, errors, truncation, and
 * attention_forward / attention_forward_blocks against the naive reference at
 * every ISA level this CPU runs, for F16 and F32 caches, several head sizes,
 * GQA groups, batch sizes, depths and thread counts. */
#include "attention/attention.h"
#include "attention/kv_cache.h"
#include "core/cpu.h"
#include "core/fp16.h"
#include "core/threadpool.h"
#include "harness.h"
#include "test_pool.h"
#include "kernels/quant.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#ifndef MAX_THREADS
#define MAX_THREADS 3
#endif

static ellm_isa g_best;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { return test_frand(&g_rng); }

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

static kv_cache *make_cache(int n_layer, int n_kv, int hd, int n_ctx, int bt, int type) {
    kv_cache_params p = {n_layer, n_kv, hd, n_ctx, bt, type, 0};
    kv_cache *kv = NULL;
    ellm_error err;
    ellm_status st = kv_cache_init(&p, &kv, &err);
    CHECK(st == ELLM_OK, "kv_cache_init: %s", st == ELLM_OK ? "" : err.msg);
    return kv;
}

/* Stores positions [0, n) of every layer with random K and V. */
static void fill_cache(kv_cache *kv, int n) {
    const kv_cache_params *p = kv_cache_get_params(kv);
    size_t row = (size_t)p->n_kv_head * p->head_dim;
    float *k = malloc((size_t)n * row * sizeof(float));
    float *v = malloc((size_t)n * row * sizeof(float));
    for (int l = 0; l < p->n_layer; l++) {
        fill(k, (size_t)n * row, 1.0f);
        fill(v, (size_t)n * row, 1.0f);
        kv_cache_store(kv, l, 0, n, k, v);
    }
    kv_cache_set_len(kv, n);
    free(k);
    free(v);
}

/* Largest |a - b| / (1 + |b|) over n values. */
static double max_rel_err(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i]));
        if (!(e <= worst)) worst = e; /* NaN counts as worst */
    }
    return worst;
}

/* ---- KV cache ----------------------------------------------------------- */

static void test_params_errors(void) {
    kv_cache *kv = (kv_cache *)1;
    ellm_error err;
    kv_cache_params good = {2, 2, 64, 100, 32, QTYPE_F16, 0};
    kv_cache_params p;

    p = good; p.n_layer = 0;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_ARG && kv == NULL, "n_layer 0 accepted");
    p = good; p.n_kv_head = -1;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_ARG, "negative heads accepted");
    p = good; p.head_dim = 0;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_ARG, "head_dim 0 accepted");
    p = good; p.n_ctx = 0;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_ARG, "n_ctx 0 accepted");
    p = good; p.block_tokens = 0;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_ARG, "block_tokens 0 accepted");
    p = good; p.block_tokens = 24;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_ARG && strstr(err.msg, "power of two"),
          "block_tokens 24 accepted: %s", err.msg);
    p = good; p.type = QTYPE_Q4_0;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_UNSUPPORTED, "Q4_0 cache accepted");
    p = good; p.head_dim = 1 << 20;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_ARG, "huge head_dim accepted");
    /* Products that overflow size_t. */
    p = good; p.page_blocks = 24;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_ARG && strstr(err.msg, "blocks per page"),
          "24 blocks per page accepted: %s", err.msg);
    p = good; p.page_blocks = 2048;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_ARG, "2048 blocks per page accepted");
    CHECK(kv_cache_own_page_blocks(8191, 16) == KV_PAGE_BLOCKS && kv_cache_own_page_blocks(8192, 16) == KV_PAGE_BLOCKS_LONG &&
              kv_cache_own_page_blocks(16383, 32) == KV_PAGE_BLOCKS,
          "long pages from 16 of them on: %d %d %d", kv_cache_own_page_blocks(8191, 16), kv_cache_own_page_blocks(8192, 16),
          kv_cache_own_page_blocks(16383, 32));
    p = (kv_cache_params){1 << 30, 1 << 30, 4096, 1 << 30, 32, QTYPE_F32, 0};
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_ERR_NOMEM && kv == NULL, "overflow accepted");
    /* 1000 layers x 64 heads x 128 dims x 2^30 tokens: ~32 PB, more than any machine. */
    p = (kv_cache_params){1000, 64, 128, 1 << 30, 32, QTYPE_F16, 0};
    ellm_status st = kv_cache_init(&p, &kv, &err);
    CHECK(st == ELLM_ERR_NOMEM && kv == NULL && strstr(err.msg, "GB"),
          "absurd cache: status %d msg %s", st, err.msg);
}

static void test_layout(void) {
    const int n_layer = 3, n_kv = 2, hd = 24, n_ctx = 70, bt = 16;
    for (int type = QTYPE_F32; type <= QTYPE_F16; type++) {
        kv_cache *kv = make_cache(n_layer, n_kv, hd, n_ctx, bt, type);
        if (!kv) return;
        size_t elt = type == QTYPE_F16 ? 2 : 4;
        CHECK(kv_cache_n_blocks(kv) == 5, "n_blocks %d", kv_cache_n_blocks(kv));
        CHECK(kv_cache_bytes_per_token(kv) == (size_t)n_layer * n_kv * 2 * hd * elt,
              "bytes_per_token %zu", kv_cache_bytes_per_token(kv));
        CHECK(kv_cache_bytes(kv) >= (size_t)n_layer * n_kv * 5 * 2 * bt * hd * elt,
              "bytes %zu", kv_cache_bytes(kv));
        CHECK(kv_cache_len(kv) == 0, "fresh len %d", kv_cache_len(kv));
        const kv_cache_params *p = kv_cache_get_params(kv);
        CHECK(p->n_layer == n_layer && p->head_dim == hd && p->type == type, "params");

        /* Values exactly representable in F16 so both types read back exactly. */
        size_t row = (size_t)n_kv * hd;
        float *k = malloc(n_ctx * row * sizeof(float)), *v = malloc(n_ctx * row * sizeof(float));
        for (size_t i = 0; i < n_ctx * row; i++) {
            k[i] = (float)((int)(i % 2001) - 1000) / 8.0f;
            v[i] = (float)((int)(i % 1999) - 999) / 4.0f;
        }
        /* Written in two uneven pieces to cross block boundaries inside a call. */
        kv_cache_store(kv, 1, 0, 37, k, v);
        kv_cache_store(kv, 1, 37, n_ctx - 37, k + 37 * row, v + 37 * row);
        int bad = 0, misaligned = 0;
        for (int h = 0; h < n_kv; h++)
            for (int pos = 0; pos < n_ctx; pos++) {
                const char *kb = kv_cache_block_k(kv, 1, h, pos / bt);
                const char *vb = kv_cache_block_v(kv, 1, h, pos / bt);
                if ((uintptr_t)kb % 64) misaligned++;
                if (vb != kb + (size_t)bt * hd * elt) bad++;
                float key[64];
                kv_cache_key(kv, 1, h, pos, key);
                for (int d = 0; d < hd; d++) {
                    /* K channel-major, V token-major */
                    size_t koff = (size_t)d * bt + (size_t)(pos % bt), voff = (size_t)(pos % bt) * hd + d;
                    float kx = type == QTYPE_F16 ? ellm_f16_to_f32(((const uint16_t *)kb)[koff])
                                                 : ((const float *)kb)[koff];
                    float vx = type == QTYPE_F16 ? ellm_f16_to_f32(((const uint16_t *)vb)[voff])
                                                 : ((const float *)vb)[voff];
                    if (kx != k[pos * row + h * hd + d] || vx != v[pos * row + h * hd + d]) bad++;
                    if (key[d] != kx) bad++;
                }
            }
        CHECK(bad == 0, "type %d: %d stored values differ", type, bad);
        CHECK(misaligned == 0, "%d blocks not 64-byte aligned", misaligned);
        kv_cache_set_len(kv, 50);
        CHECK(kv_cache_len(kv) == 50, "set_len");
        kv_cache_set_len(kv, 3);
        CHECK(kv_cache_len(kv) == 3, "set_len shrink");
        kv_cache_set_len(kv, n_ctx);
        CHECK(kv_cache_len(kv) == n_ctx, "set_len full");
        free(k);
        free(v);
        kv_cache_free(kv);
    }
    kv_cache_free(NULL);
}

/* Storing into an F16 cache gives the bits of ellm_f32_to_f16 on every ISA, and
 * every finite half survives F16 -> F32 -> store -> F16 unchanged. */
static void test_f16_store(void) {
    const int hd = 37, n = 1024; /* odd size: vector bodies and tails */
    kv_cache *kv = make_cache(1, 1, hd, n * 2, 64, QTYPE_F16);
    if (!kv) return;
    float *x = malloc((size_t)n * hd * sizeof(float));
    for (int i = 0; i < n * hd; i++) {
        float mag = ldexpf(1.0f, (int)((frand() + 1.0f) * 24) - 30); /* 2^-30 .. 2^18 */
        x[i] = frand() * mag;
    }
    const float specials[] = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, -1e9f, 1e-8f,
                              5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f, 1.0f + 1.0f / 2048,
                              1.0f + 3.0f / 2048, INFINITY, -INFINITY};
    memcpy(x, specials, sizeof specials);
    for (ellm_isa isa = ELLM_ISA_SCALAR; isa <= g_best; isa++) {
        ellm_cpu_set_isa(isa);
        kv_cache_store(kv, 0, 0, n, x, x);
        int bad = 0;
        for (int pos = 0; pos < n; pos++) {
            const uint16_t *kb = (const uint16_t *)kv_cache_block_k(kv, 0, 0, pos / 64);
            const uint16_t *vr = (const uint16_t *)kv_cache_block_v(kv, 0, 0, pos / 64) +
                                 (size_t)(pos % 64) * hd;
            for (int d = 0; d < hd; d++) {
                if (kb[(size_t)d * 64 + pos % 64] != ellm_f32_to_f16(x[pos * hd + d])) bad++;
                if (vr[d] != ellm_f32_to_f16(x[pos * hd + d])) bad++;
            }
        }
        CHECK(bad == 0, "isa %s: %d F16 conversions differ from the reference", ellm_isa_str(isa),
              bad);

        /* All 65536 halves: finite ones round-trip exactly, NaNs stay NaN. */
        float *all = malloc(65536 * sizeof(float));
        for (int h = 0; h < 65536; h++) all[h] = ellm_f16_to_f32((ellm_f16)h);
        kv_cache *kv2 = make_cache(1, 1, 64, 1024, 32, QTYPE_F16);
        if (kv2) {
            kv_cache_store(kv2, 0, 0, 1024, all, all);
            int bad_rt = 0;
            for (int h = 0; h < 65536; h++) {
                int pos = h / 64, d = h % 64;
                const uint16_t *vb = kv_cache_block_v(kv2, 0, 0, pos / 32);
                uint16_t got = vb[(pos % 32) * 64 + d];
                int nan_in = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
                int nan_out = (got & 0x7c00) == 0x7c00 && (got & 0x3ff);
                if (nan_in ? !nan_out : got != h) bad_rt++;
            }
            CHECK(bad_rt == 0, "isa %s: %d halves do not round-trip", ellm_isa_str(isa), bad_rt);
            kv_cache_free(kv2);
        }
        free(all);
    }
    ellm_cpu_set_isa(g_best);
    free(x);
    kv_cache_free(kv);
}

/* ---- attention ---------------------------------------------------------- */

static void test_workspace_errors(void) {
    attention_workspace *ws = (attention_workspace *)1;
    ellm_error err;
    CHECK(attention_workspace_init(0, 1, 8, 64, 128, 32, &ws, &err) == ELLM_ERR_ARG && !ws,
          "0 threads accepted");
    CHECK(attention_workspace_init(1, 0, 8, 64, 128, 32, &ws, &err) == ELLM_ERR_ARG, "max_q 0");
    CHECK(attention_workspace_init(1, 1, 8, -64, 128, 32, &ws, &err) == ELLM_ERR_ARG, "hd<0");
    CHECK(attention_workspace_init(1, 1, 8, 64, 128, 0, &ws, &err) == ELLM_ERR_ARG, "bt 0");
}

/* The reference against a double-precision softmax computed straight from the
 * floats that were stored (F32 cache), so the reference itself is checked. */
static void test_reference(void) {
    const int hd = 16, n_kv = 2, G = 2, n_head = n_kv * G, n = 45, n_q = 3, bt = 8;
    kv_cache *kv = make_cache(1, n_kv, hd, n, bt, QTYPE_F32);
    if (!kv) return;
    size_t row = (size_t)n_kv * hd;
    float *k = malloc(n * row * sizeof(float)), *v = malloc(n * row * sizeof(float));
    float q[3 * 4 * 16], out[3 * 4 * 16];
    fill(k, n * row, 1.0f);
    fill(v, n * row, 1.0f);
    fill(q, sizeof q / sizeof q[0], 3.0f);
    kv_cache_store(kv, 0, 0, n, k, v);
    attention_args a = {kv, 0, n_q, n - n_q, n_head, q, out, 0.25f};
    attention_forward_ref(&a);
    double worst = 0;
    for (int i = 0; i < n_q; i++)
        for (int hq = 0; hq < n_head; hq++) {
            int h = hq / G, last = n - n_q + i;
            const float *qr = q + (i * n_head + hq) * hd;
            double s[64], mx = -1e300, l = 0, o[16] = {0};
            for (int pos = 0; pos <= last; pos++) {
                s[pos] = 0;
                for (int d = 0; d < hd; d++) s[pos] += (double)qr[d] * k[pos * row + h * hd + d];
                s[pos] *= 0.25;
                if (s[pos] > mx) mx = s[pos];
            }
            for (int pos = 0; pos <= last; pos++) {
                double w = exp(s[pos] - mx);
                l += w;
                for (int d = 0; d < hd; d++) o[d] += w * v[pos * row + h * hd + d];
            }
            for (int d = 0; d < hd; d++) {
                double e = fabs(o[d] / l - out[(i * n_head + hq) * hd + d]);
                if (e > worst) worst = e;
            }
        }
    CHECK(worst < 1e-5, "reference differs from double precision by %g", worst);
    free(k);
    free(v);
    kv_cache_free(kv);
}

static int g_cases;
static double g_worst;

/* One shape: the reference once, then every ISA x thread count against it. */
static void check_shape(int type, int hd, int G, int n_q, int len, int bt) {
    const int n_kv = 2, n_head = n_kv * G, n_layer = 2, layer = 1;
    if (n_q > len) n_q = len;
    kv_cache *kv = make_cache(n_layer, n_kv, hd, len + 7, bt, type);
    if (!kv) return;
    fill_cache(kv, len);
    size_t nout = (size_t)n_q * n_head * hd;
    float *q = malloc(nout * sizeof(float)), *ref = malloc(nout * sizeof(float));
    float *out = malloc(nout * sizeof(float));
    /* Large queries make the softmax peaky, so the running max moves often. */
    fill(q, nout, 4.0f);
    attention_args a = {kv, layer, n_q, len - n_q, n_head, q, ref, 1.0f / sqrtf((float)hd)};
    pool_release();
    attention_forward_ref(&a);
    a.out = out;
    attention_workspace *ws = NULL;
    ellm_error err;
    ellm_status st = attention_workspace_init(MAX_THREADS, n_q, n_head, hd, len + 7, bt, &ws, &err);
    CHECK(st == ELLM_OK, "workspace: %s", err.msg);
    for (int nt = 1; ws && nt <= MAX_THREADS; nt++) {
        /* The partitioning does not depend on the ISA; more threads than this
         * machine's cores only exercise it at the best level (oversubscribed
         * runs cost a scheduler slice each). */
        ellm_isa first = nt > 2 ? g_best : ELLM_ISA_SCALAR;
        for (ellm_isa isa = first; isa <= g_best; isa++) {
            ellm_cpu_set_isa(isa);
            for (size_t i = 0; i < nout; i++) out[i] = NAN;
            attention_forward(&a, ws, pool_of(nt));
            double e = max_rel_err(out, ref, nout);
            if (e > g_worst) g_worst = e;
            g_cases++;
            CHECK(e < 1e-5, "%s %s hd=%d G=%d n_q=%d len=%d bt=%d threads=%d: error %g",
                  ellm_isa_str(isa), type == QTYPE_F16 ? "f16" : "f32", hd, G, n_q, len, bt, nt,
                  e);
        }
    }
    ellm_cpu_set_isa(g_best);
    attention_workspace_free(ws);
    free(q);
    free(ref);
    free(out);
    kv_cache_free(kv);
}

static void test_attention_matrix(void) {
    static const int lens_all[] = {1, 31, 32, 33, 100, 1000, 4097};
    static const int lens_few[] = {1, 33, 100, 1000};
    static const int n_qs[] = {1, 3, 16};
    static const int groups[] = {1, 3, 4};
    for (int type = QTYPE_F32; type <= QTYPE_F16; type++)
        for (int gi = 0; gi < 3; gi++)
            for (int qi = 0; qi < 3; qi++) {
                for (int li = 0; li < 7; li++)
                    check_shape(type, 64, groups[gi], n_qs[qi], lens_all[li], 32);
                for (int li = 0; li < 4; li++) {
                    check_shape(type, 32, groups[gi], n_qs[qi], lens_few[li], 32);
                    check_shape(type, 128, groups[gi], n_qs[qi], lens_few[li], 32);
                }
            }
    /* Odd head sizes (vector tails), other block sizes, multi-tile batches. */
    for (int type = QTYPE_F32; type <= QTYPE_F16; type++) {
        /* Few rows read K/V in place (masked tails); many rows go through scratch. */
        check_shape(type, 20, 3, 1, 77, 32);
        check_shape(type, 24, 1, 2, 70, 16);
        check_shape(type, 100, 2, 1, 150, 32);
        check_shape(type, 72, 4, 2, 97, 4);
        check_shape(type, 20, 3, 3, 77, 32);
        check_shape(type, 8, 2, 16, 40, 8);
        check_shape(type, 100, 4, 5, 300, 64);
        check_shape(type, 64, 3, 3, 50, 1);
        check_shape(type, 64, 3, 16, 50, 2);
        check_shape(type, 48, 2, 5, 129, 16);
        check_shape(type, 64, 3, 40, 200, 32);   /* three tiles, the last partial */
        check_shape(type, 64, 1, 130, 130, 32);  /* prefill from position 0 */
        check_shape(type, 64, 4, 17, 4097, 32);
    }
    check_shape(QTYPE_F16, 64, 3, 512, 700, 32); /* long prefill */
    printf("attention: %d ISA/thread runs, worst error %.3g\n", g_cases, g_worst);
}

/* Truncating and overwriting gives exactly the result of a fresh cache holding
 * the same tokens (rejected draft tokens leave no trace). */
static void test_truncation(void) {
    const int n_kv = 1, n_head = 3, hd = 64, bt = 32, len = 100, cut = 70, add = 5;
    for (int type = QTYPE_F32; type <= QTYPE_F16; type++) {
        kv_cache *a = make_cache(1, n_kv, hd, 256, bt, type);
        kv_cache *b = make_cache(1, n_kv, hd, 256, bt, type);
        if (!a || !b) return;
        size_t row = (size_t)n_kv * hd;
        float *k = malloc((len + add) * row * sizeof(float));
        float *v = malloc((len + add) * row * sizeof(float));
        fill(k, (len + add) * row, 1.0f);
        fill(v, (len + add) * row, 1.0f);
        kv_cache_store(a, 0, 0, len, k, v);
        kv_cache_set_len(a, len);
        kv_cache_set_len(a, cut);
        CHECK(kv_cache_len(a) == cut, "truncated len %d", kv_cache_len(a));
        kv_cache_store(a, 0, cut, add, k + len * row, v + len * row);
        kv_cache_set_len(a, cut + add);
        kv_cache_store(b, 0, 0, cut, k, v);
        kv_cache_store(b, 0, cut, add, k + len * row, v + len * row);
        kv_cache_set_len(b, cut + add);

        float q[4 * 3 * 64], oa[4 * 3 * 64], ob[4 * 3 * 64];
        fill(q, sizeof q / sizeof q[0], 2.0f);
        attention_workspace *ws = NULL;
        ellm_error err;
        CHECK(attention_workspace_init(MAX_THREADS, 4, n_head, hd, 256, bt, &ws, &err) == ELLM_OK,
              "workspace: %s", err.msg);
        for (int nt = 1; ws && nt <= MAX_THREADS; nt++) {
            attention_args aa = {a, 0, 4, cut + add - 4, n_head, q, oa, 0.125f};
            attention_args ab = aa;
            ab.kv = b;
            ab.out = ob;
            attention_forward(&aa, ws, pool_of(nt));
            attention_forward(&ab, ws, pool_of(nt));
            CHECK(memcmp(oa, ob, sizeof oa) == 0, "truncated cache differs (threads %d)", nt);
            attention_forward_ref(&ab);
            CHECK(max_rel_err(oa, ob, 4 * 3 * 64) < 1e-5, "truncated cache vs reference");
        }
        attention_workspace_free(ws);
        free(k);
        free(v);
        kv_cache_free(a);
        kv_cache_free(b);
    }
}

/* Reference for attention_forward_blocks: the naive softmax over the positions
 * of the listed blocks only (zeros where a row sees none). */
static void sparse_ref(const attention_args *a, const int32_t *blocks, const int *n_blocks,
                       int max_blocks) {
    const kv_cache_params *p = kv_cache_get_params(a->kv);
    const int hd = p->head_dim, bt = p->block_tokens, G = a->n_head / p->n_kv_head;
    for (int i = 0; i < a->n_q; i++)
        for (int hq = 0; hq < a->n_head; hq++) {
            int h = hq / G, last = a->q_pos0 + i;
            const float *q = a->q + ((size_t)i * a->n_head + hq) * hd;
            float *out = a->out + ((size_t)i * a->n_head + hq) * hd;
            float mx = -INFINITY, l = 0;
            for (int d = 0; d < hd; d++) out[d] = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int bi = 0; bi < n_blocks[h]; bi++) {
                    int blk = blocks[h * max_blocks + bi];
                    const float *kb = kv_cache_block_k(a->kv, a->layer, h, blk);
                    const float *vb = kv_cache_block_v(a->kv, a->layer, h, blk);
                    for (int j = 0; j < bt && blk * bt + j <= last; j++) {
                        float dot = 0;
                        for (int d = 0; d < hd; d++) dot += q[d] * kb[d * bt + j]; /* channel-major */
                        dot *= a->scale;
                        if (pass == 0) {
                            if (dot > mx) mx = dot;
                        } else {
                            float w = expf(dot - mx);
                            l += w;
                            for (int d = 0; d < hd; d++) out[d] += w * vb[j * hd + d];
                        }
                    }
                }
            for (int d = 0; d < hd; d++) out[d] = l > 0 ? out[d] / l : 0.0f;
        }
}

static void test_sparse(void) {
    /* 4 query heads per KV head */
    const int n_kv = 2, n_head = 8, hd = 64, bt = 32, len = 1000, n_q = 5;
    const int nb = (len + bt - 1) / bt, max_blocks = 40;
    kv_cache *kv = make_cache(1, n_kv, hd, len, bt, QTYPE_F32);
    if (!kv) return;
    fill_cache(kv, len);
    float *q = malloc(n_q * n_head * hd * sizeof(float));
    float *out = malloc(n_q * n_head * hd * sizeof(float));
    float *ref = malloc(n_q * n_head * hd * sizeof(float));
    fill(q, (size_t)n_q * n_head * hd, 4.0f);
    attention_args a = {kv, 0, n_q, len - n_q, n_head, q, ref, 0.125f};
    attention_workspace *ws = NULL;
    ellm_error err;
    CHECK(attention_workspace_init(MAX_THREADS, n_q, n_head, hd, len, bt, &ws, &err) == ELLM_OK,
          "workspace: %s", err.msg);
    if (!ws) return;

    /* All blocks, in reverse order: the dense result. */
    int32_t blocks[2 * 40];
    int n_blocks[2] = {nb, nb};
    for (int h = 0; h < n_kv; h++)
        for (int i = 0; i < nb; i++) blocks[h * max_blocks + i] = nb - 1 - i;
    attention_forward_ref(&a);
    a.out = out;
    for (ellm_isa isa = ELLM_ISA_SCALAR; isa <= g_best; isa++) {
        ellm_cpu_set_isa(isa);
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            attention_forward_blocks(&a, blocks, n_blocks, max_blocks, ws, pool_of(nt));
            double e = max_rel_err(out, ref, (size_t)n_q * n_head * hd);
            CHECK(e < 1e-5, "sparse(all) %s threads %d: error %g", ellm_isa_str(isa), nt, e);
        }
    }

    /* Sink + a few middle blocks + the recent block, different per head; the
     * last block (positions 992..999) is partly masked for the early queries. */
    int32_t sel[2][5] = {{0, 7, 19, 3, nb - 1}, {nb - 1, 0, 30, 12, 1}};
    int n_sel[2] = {5, 4};
    for (int h = 0; h < n_kv; h++)
        for (int i = 0; i < 5; i++) blocks[h * max_blocks + i] = sel[h][i];
    a.out = ref;
    sparse_ref(&a, blocks, n_sel, max_blocks);
    a.out = out;
    for (ellm_isa isa = ELLM_ISA_SCALAR; isa <= g_best; isa++) {
        ellm_cpu_set_isa(isa);
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            attention_forward_blocks(&a, blocks, n_sel, max_blocks, ws, pool_of(nt));
            double e = max_rel_err(out, ref, (size_t)n_q * n_head * hd);
            CHECK(e < 1e-5, "sparse(subset) %s threads %d: error %g", ellm_isa_str(isa), nt, e);
        }
    }

    /* A prefill-style batch whose first tokens see none of the chosen block: zeros. */
    a.n_q = 3;
    a.q_pos0 = 62; /* tokens at 62, 63, 64; block 2 starts at 64 */
    int32_t late[2 * 40] = {0};
    late[0] = 2;
    late[max_blocks] = 2;
    int n_late[2] = {1, 1};
    for (int nt = 1; nt <= MAX_THREADS; nt++) {
        for (int i = 0; i < 3 * n_head * hd; i++) out[i] = NAN;
        attention_forward_blocks(&a, late, n_late, max_blocks, ws, pool_of(nt));
        a.out = ref;
        sparse_ref(&a, late, n_late, max_blocks);
        a.out = out;
        int zeros = 1;
        for (int i = 0; i < 2 * n_head * hd; i++) zeros &= out[i] == 0.0f;
        CHECK(zeros, "rows without visible keys are not zero (threads %d)", nt);
        CHECK(max_rel_err(out, ref, 3 * (size_t)n_head * hd) < 1e-5, "late block (threads %d)", nt);
    }
    ellm_cpu_set_isa(g_best);
    attention_workspace_free(ws);
    free(q);
    free(out);
    free(ref);
    kv_cache_free(kv);
}

/* attention_forward_select: lists handed out by a callback. */
typedef struct {
    const int32_t *lists; /* n_kv x max_blocks */
    const int *n;
    int max_blocks, nth;
    atomic_int calls[8];
    int bad_thread;
} select_fixture;

static void fixture_select(void *arg, int h, int thread, int32_t *blocks, int *n_blocks) {
    select_fixture *f = arg;
    atomic_fetch_add(&f->calls[h], 1);
    if (thread < 0 || thread >= f->nth) f->bad_thread = 1;
    memcpy(blocks, f->lists + (size_t)h * f->max_blocks, (size_t)f->n[h] * sizeof *blocks);
    *n_blocks = f->n[h];
}

/* The lists of 3 KV heads over a cache of nb blocks (n_list: their lengths):
 * head 0 every other block and the last (301 blocks of 601: over 10 fixed
 * parts, or 5 cuts of 64 listed blocks), head 1 40 blocks 15 apart, head 2
 * the last block only. */
static void select_lists(int32_t *lists, int n_list[3], int nb, int max_blocks) {
    n_list[0] = n_list[1] = 0;
    n_list[2] = 1;
    for (int b = 0; b < nb; b += 2) lists[n_list[0]++] = b;
    if (lists[n_list[0] - 1] != nb - 1) lists[n_list[0]++] = nb - 1;
    for (int i = 0; i < 40; i++) lists[max_blocks + n_list[1]++] = i * 15;
    lists[2 * max_blocks] = nb - 1;
}

static void test_select(void) {
    /* 3 KV heads of 3 query heads; lists long enough to be cut into several
     * parts (up to 16 parts of >= 16 blocks), one short list, one of one block. */
    const int n_kv = 3, n_head = 9, hd = 64, bt = 16, len = 16 * 600 + 9, max_blocks = 640;
    const int nb = (len + bt - 1) / bt;
    kv_cache *kv = make_cache(1, n_kv, hd, len, bt, QTYPE_F32); /* as sparse_ref reads it */
    if (!kv) return;
    fill_cache(kv, len);
    const int max_q = 20;
    float *q = malloc((size_t)max_q * n_head * hd * sizeof(float));
    float *out = malloc((size_t)max_q * n_head * hd * sizeof(float));
    float *first = malloc((size_t)max_q * n_head * hd * sizeof(float));
    float *ref = malloc((size_t)max_q * n_head * hd * sizeof(float));
    float *blk = malloc((size_t)max_q * n_head * hd * sizeof(float));
    fill(q, (size_t)max_q * n_head * hd, 4.0f);
    int32_t *lists = malloc((size_t)n_kv * max_blocks * sizeof *lists);
    int32_t *got = malloc((size_t)n_kv * max_blocks * sizeof *got);
    int n_list[3];
    select_lists(lists, n_list, nb, max_blocks);
    attention_workspace *ws = NULL;
    ellm_error err;
    CHECK(attention_workspace_init(MAX_THREADS, max_q, n_head, hd, len, bt, &ws, &err) == ELLM_OK,
          "workspace: %s", err.msg);
    const int n_qs[] = {1, 3, 16, 20}; /* 20: two tiles, the select-then-attend path */
    for (int qi = 0; ws && qi < 4; qi++) {
        const int n_q = n_qs[qi];
        attention_args a = {kv, 0, n_q, len - n_q, n_head, q, ref, 0.125f};
        pool_release();
        sparse_ref(&a, lists, n_list, max_blocks);
        a.out = out;
        for (ellm_isa isa = ELLM_ISA_SCALAR; isa <= g_best; isa++) {
            ellm_cpu_set_isa(isa);
            for (int nt = 1; nt <= MAX_THREADS; nt++) {
                select_fixture f = {lists, n_list, max_blocks, nt, {0}, 0};
                memset(got, 0xff, (size_t)n_kv * max_blocks * sizeof *got);
                int got_n[3] = {-1, -1, -1};
                attention_forward_select(&a, fixture_select, &f, got, got_n, max_blocks, ws, pool_of(nt));
                int once = 1, same = 1;
                for (int h = 0; h < n_kv; h++) {
                    once &= atomic_load(&f.calls[h]) == 1;
                    same &= got_n[h] == n_list[h] &&
                            !memcmp(got + (size_t)h * max_blocks, lists + (size_t)h * max_blocks,
                                    (size_t)n_list[h] * sizeof *got);
                }
                CHECK(once && !f.bad_thread, "n_q %d %s threads %d: select called once per head on a pool thread",
                      n_q, ellm_isa_str(isa), nt);
                CHECK(same, "n_q %d threads %d: lists not returned", n_q, nt);
                double e = max_rel_err(out, ref, (size_t)n_q * n_head * hd);
                CHECK(e < 1e-5, "select n_q %d %s threads %d: error %g", n_q, ellm_isa_str(isa), nt, e);
                /* One tile: parts merge in a fixed order, the same bits whatever
                 * the threads (two tiles split statically, by thread count). */
                /* One tile: each thread adds up its own parts and the threads'
                 * sums merge, with the bits of merging every part at once as
                 * attention_forward_blocks does. */
                if (n_q <= 16) {
                    a.out = blk;
                    attention_forward_blocks(&a, lists, n_list, max_blocks, ws, pool_of(nt));
                    a.out = out;
                    CHECK(!memcmp(blk, out, (size_t)n_q * n_head * hd * sizeof(float)),
                          "select n_q %d %s threads %d: bits differ from attention_forward_blocks", n_q,
                          ellm_isa_str(isa), nt);
                }
                if (nt == 1) memcpy(first, out, (size_t)n_q * n_head * hd * sizeof(float));
                else if (n_q <= 16)
                    CHECK(!memcmp(first, out, (size_t)n_q * n_head * hd * sizeof(float)),
                          "select n_q %d %s: %d threads differ from 1", n_q, ellm_isa_str(isa), nt);
            }
        }
        ellm_cpu_set_isa(g_best);
    }
    attention_workspace_free(ws);
    free(q);
    free(out);
    free(first);
    free(ref);
    free(blk);
    free(lists);
    free(got);
    kv_cache_free(kv);
}

/* A Q8_0 cache's sparse lists are cut every ATTN_PART_BLOCKS listed blocks
 * (part_end), not at the cache's fixed parts: a list of 301 blocks spread
 * over the cache (5 cuts; 10 fixed parts), one of 40 and one of 1. Against
 * the reference over an F32 cache of the same keys and values (the Q8_0
 * tolerance), the same bits on 1 or more threads, from attention_forward_
 * select and attention_forward_blocks, and every row of a multi-row call equal
 * to a single-row call at its position (a verify pass or prompt chunk gives
 * each row a decode step's bits). */
static void test_select_q8(void) {
    const int n_kv = 3, n_head = 9, hd = 64, bt = 16, len = 16 * 600 + 9, max_blocks = 640;
    const int nb = (len + bt - 1) / bt;
    const uint64_t seed = g_rng;
    kv_cache *kv32 = make_cache(1, n_kv, hd, len, bt, QTYPE_F32);
    g_rng = seed;
    kv_cache *kvq = make_cache(1, n_kv, hd, len, bt, QTYPE_Q8_0);
    if (!kv32 || !kvq) return;
    g_rng = seed;
    fill_cache(kv32, len);
    g_rng = seed;
    fill_cache(kvq, len);
    const int max_q = 16;
    const size_t rowf = (size_t)n_head * hd;
    float *q = malloc((size_t)max_q * rowf * sizeof(float));
    float *out = malloc((size_t)max_q * rowf * sizeof(float));
    float *first = malloc((size_t)max_q * rowf * sizeof(float));
    float *ref = malloc((size_t)max_q * rowf * sizeof(float));
    float *blk = malloc((size_t)max_q * rowf * sizeof(float));
    float *one = malloc(rowf * sizeof(float));
    fill(q, (size_t)max_q * rowf, 4.0f);
    int32_t *lists = malloc((size_t)n_kv * max_blocks * sizeof *lists);
    int32_t *got = malloc((size_t)n_kv * max_blocks * sizeof *got);
    int n_list[3];
    select_lists(lists, n_list, nb, max_blocks);
    attention_workspace *ws = NULL;
    ellm_error err;
    CHECK(attention_workspace_init(MAX_THREADS, max_q, n_head, hd, len, bt, &ws, &err) == ELLM_OK,
          "workspace: %s", err.msg);
    const int n_qs[] = {1, 3, 16};
    for (int qi = 0; ws && qi < 3; qi++) {
        const int n_q = n_qs[qi];
        attention_args r32 = {kv32, 0, n_q, len - n_q, n_head, q, ref, 0.125f};
        sparse_ref(&r32, lists, n_list, max_blocks);
        attention_args a = {kvq, 0, n_q, len - n_q, n_head, q, out, 0.125f};
        for (ellm_isa isa = ELLM_ISA_SCALAR; isa <= g_best; isa++) {
            ellm_cpu_set_isa(isa);
            for (int nt = 1; nt <= MAX_THREADS; nt++) {
                select_fixture f = {lists, n_list, max_blocks, nt, {0}, 0};
                int got_n[3] = {-1, -1, -1};
                pool_release();
                attention_forward_select(&a, fixture_select, &f, got, got_n, max_blocks, ws, pool_of(nt));
                double e = max_rel_err(out, ref, (size_t)n_q * rowf);
                CHECK(e < 0.02, "q8_0 select n_q %d %s threads %d: error %g against the F32 reference", n_q,
                      ellm_isa_str(isa), nt, e);
                a.out = blk;
                attention_forward_blocks(&a, lists, n_list, max_blocks, ws, pool_of(nt));
                a.out = out;
                CHECK(!memcmp(blk, out, (size_t)n_q * rowf * sizeof(float)),
                      "q8_0 select n_q %d %s threads %d: bits differ from attention_forward_blocks", n_q,
                      ellm_isa_str(isa), nt);
                if (nt == 1) memcpy(first, out, (size_t)n_q * rowf * sizeof(float));
                else
                    CHECK(!memcmp(first, out, (size_t)n_q * rowf * sizeof(float)),
                          "q8_0 select n_q %d %s: %d threads differ from 1", n_q, ellm_isa_str(isa), nt);
                int rows_same = 1;
                for (int i = 0; i < n_q && n_q > 1; i++) {
                    attention_args s1 = {kvq, 0, 1, len - n_q + i, n_head, q + (size_t)i * rowf, one, 0.125f};
                    attention_forward_blocks(&s1, lists, n_list, max_blocks, ws, pool_of(nt));
                    rows_same &= !memcmp(one, out + (size_t)i * rowf, rowf * sizeof(float));
                }
                CHECK(rows_same, "q8_0 n_q %d %s threads %d: a row differs from a single-row call at its position", n_q,
                      ellm_isa_str(isa), nt);
            }
        }
        ellm_cpu_set_isa(g_best);
    }
    attention_workspace_free(ws);
    kv_cache_free(kv32);
    kv_cache_free(kvq);
    free(q);
    free(out);
    free(first);
    free(ref);
    free(blk);
    free(one);
    free(lists);
    free(got);
}


/* attention_forward_select merges a head's parts as running sums per thread
 * that move to higher bins when a part with a much larger score arrives
 * (attention_lse_rebase): keys of one block aligned with the query make its
 * part's terms ~2^90 times the others', placed early (no move) or late in
 * the list (the sums move up two bins). The output must keep the bits of
 * merging every part at once (attention_forward_blocks). */
static void test_select_rebase(void) {
    const int hd = 64, bt = 16, n_head = 3, len = bt * ATTENTION_PART_BLOCKS * 12, nb = len / bt;
    const int max_blocks = 64;
    kv_cache *kv = make_cache(1, 1, hd, len, bt, QTYPE_F32);
    if (!kv) return;
    float *k = malloc((size_t)len * hd * sizeof(float)), *v = malloc((size_t)len * hd * sizeof(float));
    float q[3 * 64], out[3 * 64], blk[3 * 64];
    fill(q, 3 * 64, 1.0f);
    int32_t list[64];
    int n = 0;
    for (int c = 0; c < 12; c++)
        for (int j = 0; j < 3; j++) list[n++] = c * ATTENTION_PART_BLOCKS + 7 * j + c % 5;
    list[n++] = nb - 1;
    attention_workspace *ws = NULL;
    ellm_error err;
    CHECK(attention_workspace_init(MAX_THREADS, 1, n_head, hd, len, bt, &ws, &err) == ELLM_OK, "workspace: %s",
          err.msg);
    const int big_blocks[2] = {list[1], list[n - 5]}; /* in part 0, in part 10 */
    for (int w = 0; ws && w < 2; w++) {
        fill(k, (size_t)len * hd, 0.1f);
        fill(v, (size_t)len * hd, 1.0f);
        for (int j = 0; j < bt; j++)
            for (int d = 0; d < hd; d++) k[(size_t)(big_blocks[w] * bt + j) * hd + d] = 25.0f * q[d];
        kv_cache_store(kv, 0, 0, len, k, v);
        kv_cache_set_len(kv, len);
        attention_args a = {kv, 0, 1, len - 1, n_head, q, blk, 0.125f};
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            int n_list[1] = {n}, got_n[1] = {0};
            int32_t got[64];
            select_fixture f = {list, n_list, max_blocks, nt, {0}, 0};
            a.out = blk;
            attention_forward_blocks(&a, list, n_list, max_blocks, ws, pool_of(nt));
            a.out = out;
            attention_forward_select(&a, fixture_select, &f, got, got_n, max_blocks, ws, pool_of(nt));
            CHECK(!memcmp(out, blk, sizeof out), "select, large scores in part %d, %d threads: bits differ from "
                  "attention_forward_blocks", w ? 10 : 0, nt);
        }
    }
    attention_workspace_free(ws);
    free(k);
    free(v);
    kv_cache_free(kv);
}

/* Decode at depth with a single KV head: with 2 and 3 threads the one segment
 * is cut between threads and merged, and must match 1 thread. */
static void test_single_head_split(void) {
    const int hd = 64, bt = 32, len = 32 * 64 + 5, n_head = 4;
    kv_cache *kv = make_cache(1, 1, hd, len, bt, QTYPE_F16);
    if (!kv) return;
    fill_cache(kv, len);
    float q[4 * 64], o1[4 * 64], on[4 * 64];
    fill(q, 4 * 64, 1.0f);
    attention_workspace *ws = NULL;
    ellm_error err;
    CHECK(attention_workspace_init(MAX_THREADS, 1, n_head, hd, len, bt, &ws, &err) == ELLM_OK,
          "workspace: %s", err.msg);
    if (!ws) return;
    attention_args a = {kv, 0, 1, len - 1, n_head, q, o1, 0.125f};
    attention_forward(&a, ws, NULL); /* no pool: the calling thread */
    a.out = on;
    for (int nt = 2; nt <= MAX_THREADS; nt++) {
        attention_forward(&a, ws, pool_of(nt));
        CHECK(max_rel_err(on, o1, 4 * 64) < 1e-5, "%d threads differ from 1", nt);
    }
    attention_workspace_free(ws);
    kv_cache_free(kv);
}

/* Batch-row exactness: each query row of a batched call (prefill or
 * speculative verification, one tile or several) equals bit for bit a
 * single-token call at that row's position, whatever the thread counts of
 * either, at depths of several parts (ATTN_PART_BLOCKS) and with an odd
 * number of KV heads (so thread ranges cut through heads). */
static void check_rows_exact(int type, int hd, int G, int n_q, int len, int bt) {
    const int n_kv = 3, n_head = n_kv * G, n_layer = 1, layer = 0;
    kv_cache *kv = make_cache(n_layer, n_kv, hd, len, bt, type);
    if (!kv) return;
    fill_cache(kv, len);
    size_t row = (size_t)n_head * hd, nout = (size_t)n_q * row;
    float *q = malloc(nout * sizeof(float)), *one = malloc(nout * sizeof(float));
    float *out = malloc(nout * sizeof(float));
    fill(q, nout, 4.0f);
    attention_workspace *ws = NULL;
    ellm_error err;
    CHECK(attention_workspace_init(MAX_THREADS, n_q, n_head, hd, len, bt, &ws, &err) == ELLM_OK, "workspace: %s",
          err.msg);
    for (ellm_isa isa = ELLM_ISA_SCALAR; ws && isa <= g_best; isa++) {
        ellm_cpu_set_isa(isa);
        for (int i = 0; i < n_q; i++) {
            attention_args a1 = {kv, layer, 1, len - n_q + i, n_head, q + i * row, one + i * row,
                                 1.0f / sqrtf((float)hd)};
            attention_forward(&a1, ws, pool_of(1 + i % 2));
        }
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            attention_args a = {kv, layer, n_q, len - n_q, n_head, q, out, 1.0f / sqrtf((float)hd)};
            attention_forward(&a, ws, pool_of(nt));
            int bad = 0;
            for (int i = 0; i < n_q; i++) bad += memcmp(out + i * row, one + i * row, row * sizeof(float)) != 0;
            CHECK(bad == 0, "%s %s hd=%d G=%d n_q=%d len=%d threads=%d: %d batch rows differ from single-token calls",
                  ellm_isa_str(isa), type == QTYPE_F16 ? "f16" : "f32", hd, G, n_q, len, nt, bad);
        }
    }
    ellm_cpu_set_isa(g_best);
    attention_workspace_free(ws);
    free(q);
    free(one);
    free(out);
    kv_cache_free(kv);
}

static void test_batch_rows_exact(void) {
    check_rows_exact(QTYPE_F16, 64, 3, 9, 1500, 16);  /* a verification batch, 2 parts deep */
    check_rows_exact(QTYPE_F16, 64, 1, 40, 1200, 16); /* three tiles, some rows one part shallower */
    check_rows_exact(QTYPE_F32, 40, 2, 17, 1100, 16); /* vector tails, two tiles */
    check_rows_exact(QTYPE_F16, 128, 2, 5, 600, 32);
}

/* A setting that must not change any output bit: variant 0 is the default,
 * variant 1 the setting under test. check_toggle runs a cache of 3 KV heads
 * (G query heads each) filled to len, n_q query tokens at its end, dense and
 * over sparse lists (in_list(h, i) chooses block i < nb - 1 of head h; the
 * last block always), on nt_min..MAX_THREADS threads, in both variants, and
 * compares the outputs bit for bit. */
typedef void (*toggle_fn)(int variant);

static void check_toggle(const char *what, toggle_fn set, int nt_min, int (*in_list)(int h, int i), int type, int hd,
                         int G, int n_q, int len, int bt) {
    const int n_kv = 3, n_head = n_kv * G;
    kv_cache *kv = make_cache(1, n_kv, hd, len, bt, type);
    if (!kv) return;
    fill_cache(kv, len);
    const size_t nout = (size_t)n_q * n_head * hd;
    float *q = malloc(nout * sizeof(float)), *outs[2] = {malloc(nout * sizeof(float)), malloc(nout * sizeof(float))};
    fill(q, nout, 4.0f);
    const int nb = (len + bt - 1) / bt, max_blocks = nb;
    int32_t *blocks = malloc((size_t)n_kv * max_blocks * sizeof(int32_t));
    int n_blocks[3];
    for (int h = 0; h < n_kv; h++) {
        int n = 0;
        for (int i = 0; i < nb - 1; i++)
            if (in_list(h, i)) blocks[h * max_blocks + n++] = i;
        blocks[h * max_blocks + n++] = nb - 1;
        n_blocks[h] = n;
    }
    attention_workspace *ws = NULL;
    ellm_error err;
    CHECK(attention_workspace_init(MAX_THREADS, n_q, n_head, hd, len, bt, &ws, &err) == ELLM_OK, "workspace: %s",
          err.msg);
    for (int nt = nt_min; ws && nt <= MAX_THREADS; nt++)
        for (int sparse = 0; sparse <= 1; sparse++) {
            for (int v = 0; v < 2; v++) {
                set(v);
                attention_args a = {kv, 0, n_q, len - n_q, n_head, q, outs[v], 1.0f / sqrtf((float)hd)};
                if (sparse) attention_forward_blocks(&a, blocks, n_blocks, max_blocks, ws, pool_of(nt));
                else attention_forward(&a, ws, pool_of(nt));
            }
            set(0);
            CHECK(memcmp(outs[0], outs[1], nout * sizeof(float)) == 0,
                  "%s %s hd=%d G=%d n_q=%d len=%d bt=%d threads=%d %s: outputs differ from the default's", what,
                  type == QTYPE_F16 ? "f16" : type == QTYPE_F32 ? "f32" : "q8_0", hd, G, n_q, len, bt, nt,
                  sparse ? "sparse" : "dense");
        }
    attention_workspace_free(ws);
    free(blocks);
    free(q);
    free(outs[0]);
    free(outs[1]);
    kv_cache_free(kv);
}

/* Work stealing (attn_worker): thread 0 starts with every part, so the
 * others compute only parts taken from it; dense and sparse-list outputs
 * keep their bits. */
static void uneven_on(int variant) { attention_uneven_ranges(variant); }
static int third_of_blocks(int h, int i) { return i % 3 == h; } /* about a third of the blocks */

static void test_uneven_ranges(void) {
    const long before = attention_parts_taken();
    for (int rep = 0; rep < 4; rep++) {
        check_toggle("uneven ranges", uneven_on, 2, third_of_blocks, QTYPE_F16, 64, 3, 1,
                     5 * ATTENTION_PART_BLOCKS * 16 + 37, 16);
        check_toggle("uneven ranges", uneven_on, 2, third_of_blocks, QTYPE_Q8_0, 64, 3, 1,
                     3 * ATTENTION_PART_BLOCKS * 16 + 5, 16);
        check_toggle("uneven ranges", uneven_on, 2, third_of_blocks, QTYPE_F16, 64, 2, 20,
                     2 * ATTENTION_PART_BLOCKS * 16 + 100, 16);
        check_toggle("uneven ranges", uneven_on, 2, third_of_blocks, QTYPE_F32, 32, 4, 3,
                     4 * ATTENTION_PART_BLOCKS * 16 + 1, 16);
    }
    const long taken = attention_parts_taken() - before;
    CHECK(taken > 0, "uneven ranges: no thread took a part from thread 0 in %d calls", 4 * 4 * 2 * 2 * (MAX_THREADS - 1));
    printf("uneven ranges: %ld parts taken from thread 0's range\n", taken);
}

/* Pair steps (attention_pairs_enable): the AVX-512 single-row kernel takes
 * two whole blocks of a part at once (F16 with 1-4 rows: runs of up to
 * ATTN_F16_STEP_BLOCKS with the state in registers; Q8_0: up to
 * ATTN_Q8_STEP_BLOCKS in a multi-block step); the outputs must keep their bits,
 * dense and over sparse lists of scattered blocks, at any thread count. */
static void pairs_off(int variant) { attention_pairs_enable(!variant); }
/* every other block, then the last (diagonal) one; head 1 all of them */
static int scattered_blocks(int h, int i) { return h == 1 || i % 2 == 0 || i % 7 == 3; }

static void check_pairs(int type, int hd, int G, int n_q, int len, int bt) {
    check_toggle("pair steps off", pairs_off, 1, scattered_blocks, type, hd, G, n_q, len, bt);
}

static void test_pair_steps(void) {
    if (g_best < ELLM_ISA_AVX512) {
        SKIP("pair steps: the AVX-512 kernel is not supported by this CPU");
        return;
    }
    check_pairs(QTYPE_F16, 64, 3, 1, 1500, 16);  /* decode, GQA 3: 94 blocks over 2 parts */
    /* F16 runs with the state in registers (attn_blocks_f16_avx512): every
     * row count it takes, blocks in pairs and one left over */
    check_pairs(QTYPE_F16, 64, 1, 1, 1100, 16);
    check_pairs(QTYPE_F16, 64, 2, 1, 1100, 16);
    check_pairs(QTYPE_F16, 64, 4, 1, 1500, 16);  /* 4 rows: pairs with spilled registers */
    check_pairs(QTYPE_F16, 64, 2, 2, 1037, 16);  /* 4 rows of two tokens, a partial last block */
    check_pairs(QTYPE_F16, 128, 2, 1, 900, 16);
    check_pairs(QTYPE_F16, 64, 3, 2, 1037, 16);  /* 6 rows, a partial last block */
    check_pairs(QTYPE_F16, 128, 1, 1, 700, 16);
    check_pairs(QTYPE_F16, 128, 4, 2, 530, 16);  /* 8 rows: the most the in-place path takes */
    check_pairs(QTYPE_F16, 64, 3, 3, 800, 16);   /* 9 rows: the multi-row kernel instead */
    check_pairs(QTYPE_F32, 64, 2, 4, 900, 16);   /* F32 in place for any rows */
    check_pairs(QTYPE_F16, 40, 3, 1, 600, 16);   /* head_dim without a pair path: single steps */
    check_pairs(QTYPE_F16, 64, 3, 1, 900, 32);   /* 32-token blocks: single steps */
    /* Q8_0: the same switch turns the kernel's multi-block steps on and off */
    check_pairs(QTYPE_Q8_0, 64, 3, 1, 1500, 16); /* decode, GQA 3 */
    check_pairs(QTYPE_Q8_0, 64, 1, 2, 1037, 16); /* 2 rows, a partial last block */
    check_pairs(QTYPE_Q8_0, 128, 4, 1, 700, 16);
    check_pairs(QTYPE_Q8_0, 64, 5, 1, 600, 16);  /* 5 rows: single steps */
}

/* The decode kernels' prefetch kind (attention_prefetch_nta): the blocks
 * ahead asked for non-temporally or towards L2 take different code paths
 * (each kernel is compiled for both); the outputs keep their bits. */
static void prefetch_kind(int variant) { attention_prefetch_nta(variant ? !attention_prefetch_nta_active() : -1); }

static void test_prefetch_kinds(void) {
    if (g_best < ELLM_ISA_AVX512) {
        SKIP("prefetch kinds: the AVX-512 decode kernels are not supported by this CPU");
        return;
    }
    check_toggle("other prefetch kind", prefetch_kind, 1, scattered_blocks, QTYPE_F16, 64, 3, 1, 1500, 16);
    check_toggle("other prefetch kind", prefetch_kind, 1, scattered_blocks, QTYPE_F16, 128, 2, 1, 900, 16);
    check_toggle("other prefetch kind", prefetch_kind, 1, scattered_blocks, QTYPE_Q8_0, 64, 3, 1, 1500, 16);
    check_toggle("other prefetch kind", prefetch_kind, 1, scattered_blocks, QTYPE_Q8_0, 128, 4, 1, 700, 16);
    attention_prefetch_nta(-1);
    const int amd = ellm_cpu()->amd;
    CHECK(attention_prefetch_nta_active() == amd, "default prefetch kind %d on a CPU with amd=%d",
          attention_prefetch_nta_active(), amd);
    attention_prefetch_nta(1);
    CHECK(attention_prefetch_nta_active() == 1, "forced non-temporal");
    attention_prefetch_nta(0);
    CHECK(attention_prefetch_nta_active() == 0, "forced towards L2");
    attention_prefetch_nta(-1);
}

/* ---- log-sum-exp of a block set (recall samples) ------------------------ */

/* Row (i, hq)'s log-sum-exp over the keys it sees in `blocks` (NULL: all),
 * in double from the stored keys (kv_cache_key), with the kernels' scale. */
static double lse_ref(const attention_args *a, int i, int hq, const int32_t *list, int n_list) {
    const kv_cache_params *p = kv_cache_get_params(a->kv);
    const int hd = p->head_dim, bt = p->block_tokens, h = hq / (a->n_head / p->n_kv_head), last = a->q_pos0 + i;
    const float *q = a->q + ((size_t)i * a->n_head + hq) * hd;
    float key[256];
    double s[8192];
    int n = 0;
    for (int pos = 0; pos <= last; pos++) {
        int in = !list;
        for (int k = 0; k < n_list && !in; k++) in = list[k] == pos / bt;
        if (!in) continue;
        kv_cache_key(a->kv, a->layer, h, pos, key);
        double dot = 0;
        for (int d = 0; d < hd; d++) dot += (double)q[d] * key[d];
        s[n++] = dot * a->scale;
    }
    if (!n) return -INFINITY;
    double m = s[0], l = 0;
    for (int j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
    for (int j = 0; j < n; j++) l += exp(s[j] - m);
    return m + log(l);
}

/* attention_lse against lse_ref (dense and over a subset of blocks), a list of
 * every block equal to the dense call bit for bit, -inf for a row that sees no
 * key of its list. The Q8_0 kernels score with the query rounded to int8
 * (attention_q8.c), hence their wider tolerance. */
static void test_lse(void) {
    static const int types[] = {QTYPE_F32, QTYPE_F16, QTYPE_Q8_0};
    static const int lens[] = {1, 17, 700, 2100};
    double worst[3] = {0, 0, 0};
    int cases = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int hd = 64; hd <= 128; hd += 64)
            for (int G = 1; G <= 4; G += 3)
                for (int li = 0; li < 4; li++)
                    for (int n_q = 1; n_q <= 3; n_q += 2) {
                        const int type = types[ti], len = lens[li], bt = 16, n_kv = 2, n_head = n_kv * G;
                        if (n_q > len) continue;
                        kv_cache *kv = make_cache(2, n_kv, hd, len, bt, type);
                        if (!kv) return;
                        fill_cache(kv, len);
                        const int nb = (len + bt - 1) / bt;
                        float *q = malloc((size_t)n_q * n_head * hd * sizeof(float));
                        fill(q, (size_t)n_q * n_head * hd, 2.0f);
                        attention_args a = {kv, 1, n_q, len - n_q, n_head, q, NULL, 1.0f / sqrtf((float)hd)};
                        const long n_rec = attention_part_first(&a, attention_n_tiles(&a));
                        const size_t rf = attention_part_floats(&a, 0);
                        float *mem = malloc((size_t)n_rec * rf * sizeof(float));
                        float **parts = malloc((size_t)n_rec * sizeof *parts);
                        for (long r = 0; r < n_rec; r++) parts[r] = mem + (size_t)r * rf;
                        const size_t nl = (size_t)n_q * n_head;
                        float *dense = malloc(nl * sizeof(float)), *listed = malloc(nl * sizeof(float));
                        float *sub = malloc(nl * sizeof(float));
                        int32_t *all = malloc((size_t)n_kv * nb * sizeof *all), *some = malloc((size_t)n_kv * nb * sizeof *some);
                        int n_all[2] = {nb, nb}, n_some[2] = {0, 0};
                        for (int h = 0; h < n_kv; h++)
                            for (int b = 0; b < nb; b++) {
                                all[h * nb + b] = b;
                                /* head 0: every third block and the last; head 1: the last only */
                                if ((h == 0 && (b % 3 == 0 || b == nb - 1)) || (h == 1 && b == nb - 1))
                                    some[h * nb + n_some[h]++] = b;
                            }
                        attention_workspace *ws = NULL;
                        ellm_error err;
                        CHECK(attention_workspace_init(MAX_THREADS, n_q, n_head, hd, len, bt, &ws, &err) == ELLM_OK,
                              "workspace: %s", err.msg);
                        for (int nt = 1; ws && nt <= 2; nt++) {
                            attention_lse(&a, NULL, NULL, 0, parts, dense, ws, pool_of(nt));
                            attention_lse(&a, all, n_all, nb, parts, listed, ws, pool_of(nt));
                            attention_lse(&a, some, n_some, nb, parts, sub, ws, pool_of(nt));
                            CHECK(!memcmp(dense, listed, nl * sizeof(float)),
                                  "lse type %d hd %d G %d len %d n_q %d threads %d: every block listed differs from dense",
                                  type, hd, G, len, n_q, nt);
                            for (int i = 0; i < n_q; i++)
                                for (int hq = 0; hq < n_head; hq++) {
                                    const int h = hq / G;
                                    const double rd = lse_ref(&a, i, hq, NULL, 0);
                                    const double rs = lse_ref(&a, i, hq, some + h * nb, n_some[h]);
                                    const float gd = dense[i * n_head + hq], gs = sub[i * n_head + hq];
                                    const double ed = fabs(gd - rd), es = rs == -INFINITY ? (gs == -INFINITY ? 0 : INFINITY)
                                                                                           : fabs(gs - rs);
                                    worst[ti] = ed > worst[ti] ? ed : worst[ti];
                                    worst[ti] = es > worst[ti] ? es : worst[ti];
                                    cases++;
                                    const double tol = type == QTYPE_Q8_0 ? 0.01 : 5e-6;
                                    CHECK(ed <= tol && es <= tol,
                                          "lse type %d hd %d G %d len %d n_q %d threads %d row (%d, %d): dense %g vs %g, "
                                          "subset %g vs %g",
                                          type, hd, G, len, n_q, nt, i, hq, (double)gd, rd, (double)gs, rs);
                                    /* a set's mass is at most the whole */
                                    CHECK(!(gs > gd), "lse: subset %g above all %g", (double)gs, (double)gd);
                                }
                        }
                        attention_workspace_free(ws);
                        free(q);
                        free(mem);
                        free(parts);
                        free(dense);
                        free(listed);
                        free(sub);
                        free(all);
                        free(some);
                        kv_cache_free(kv);
                    }
    printf("attention_lse: %d rows, worst |lse - reference|: f32 %.2e, f16 %.2e, q8_0 %.2e\n", cases, worst[0],
           worst[1], worst[2]);
}

int main(void) {
    g_best = ellm_cpu()->best;
    printf("attention tests: ISA levels scalar..%s\n", ellm_isa_str(g_best));
    for (int isa = (int)g_best + 1; isa <= ELLM_ISA_AVX512; isa++)
        SKIP("attention %s kernels: not supported by this CPU", ellm_isa_str((ellm_isa)isa));
    test_params_errors();
    test_layout();
    test_f16_store();
    test_workspace_errors();
    test_reference();
    test_truncation();
    test_sparse();
    test_select();
    test_select_q8();
    test_select_rebase();
    test_single_head_split();
    test_batch_rows_exact();
    test_pair_steps();
    test_prefetch_kinds();
    test_uneven_ranges();
    test_lse();
    test_attention_matrix();
    pool_release();
    return test_finish();
}
