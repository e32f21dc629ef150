/* Q8_0 KV cache: quantization as GGUF's q8_0, the stored keys and values
 * within half a step of the originals, the query quantizer and score formula,
 * integer P*V (SIMD helpers bit-identical to the scalar reference, within the
 * weights' quantization bound), the AVX-512 kernel's multi-block steps equal
 * to block-by-block ones bit for bit, fused attention at every ISA level against the
 * scalar kernel and the naive reference on the same cache (dense, sparse block
 * lists, decode and batches, GQA, head sizes 64 and 128, several thread
 * counts), batched rows equal to single-token calls bit
 * for bit, the
 * sparse index built from the stored keys, and a whole model: logits close to
 * an F16 cache, save/restore and context shift with a Q8_0 cache. */
#include "attention/attention.h"
#include "attention/attention_kernel.h"
#include "attention/sparse_index_internal.h"
#include "core/cpu.h"
#include "core/fp16.h"
#include "core/threadpool.h"
#include "engine/engine_impl.h"
#include "harness.h"
#include "test_pool.h"
#include "kernels/quant.h"

#include <string.h>

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static float frand(void) { return test_frand(&g_rng); }

static kv_cache *make_cache(int n_kv, int hd, int n_ctx, int bt, int type) {
    kv_cache_params p = {1, n_kv, hd, n_ctx, bt, type, 0};
    kv_cache *kv = NULL;
    ellm_error err;
    CHECK(kv_cache_init(&p, &kv, &err) == ELLM_OK, "kv_cache_init: %s", err.msg);
    return kv;
}

/* How many of the hd values x came back as out further than 0.57 of their
 * 32-value block's step (amax / 127, kept as F16; see test_store). */
static int q8_misses(const float *x, const float *out, int hd) {
    int bad = 0;
    for (int g = 0; g < hd / 32; g++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[g * 32 + i]));
        float d = ellm_f16_to_f32(ellm_f32_to_f16(amax / 127));
        for (int i = 0; i < 32; i++) bad += !(fabsf(out[g * 32 + i] - x[g * 32 + i]) <= 0.57f * d + 1e-7f);
    }
    return bad;
}

/* Stored keys and values dequantize to within half a quantization step, plus
 * the F16 rounding of the scale (q = round(x / d) uses the F32 scale, the
 * cache keeps it as F16: 127 * 2^-11 d more at most, so 0.57 d); unsupported
 * shapes are refused. */
static void test_store(void) {
    const int hd = 64, n = 100, bt = 16;
    kv_cache *kv = make_cache(2, hd, 128, bt, QTYPE_Q8_0);
    if (!kv) return;
    float *k = malloc((size_t)n * 2 * hd * 4), *v = malloc((size_t)n * 2 * hd * 4);
    for (int i = 0; i < n * 2 * hd; i++) {
        k[i] = frand() * (i % 64 == 3 ? 20.0f : 2.0f); /* an outlier channel */
        v[i] = frand();
    }
    for (int i = 0; i < hd; i++) k[i] = 0.0f; /* an all-zero key: scale 0 */
    kv_cache_store(kv, 0, 0, n, k, v);
    kv_cache_set_len(kv, n);
    int bad_k = 0, bad_v = 0;
    float out[64];
    for (int p = 0; p < n; p++)
        for (int h = 0; h < 2; h++) {
            const float *ks = k + ((size_t)p * 2 + h) * hd, *vs = v + ((size_t)p * 2 + h) * hd;
            kv_cache_key(kv, 0, h, p, out);
            bad_k += q8_misses(ks, out, hd);
            kv_cache_value(kv, 0, h, p, out);
            bad_v += q8_misses(vs, out, hd);
        }
    CHECK(bad_k == 0 && bad_v == 0, "%d keys and %d values off by more than 0.57 steps", bad_k, bad_v);
    kv_cache_key(kv, 0, 0, 0, out);
    int zeros = 1;
    for (int i = 0; i < hd; i++) zeros &= out[i] == 0.0f;
    CHECK(zeros, "an all-zero key stays zero");
    /* storing dequantized values again gives the same bytes (context shift moves them so) */
    const void *b0 = kv_cache_block_v(kv, 0, 1, 2);
    unsigned char before[2048];
    memcpy(before, b0, kv_q8_half_bytes(hd, bt));
    float kk[2 * 64], vv[2 * 64];
    for (int h = 0; h < 2; h++) {
        kv_cache_key(kv, 0, h, 37, kk + h * hd);
        kv_cache_value(kv, 0, h, 37, vv + h * hd);
    }
    kv_cache_store(kv, 0, 37, 1, kk, vv);
    CHECK(!memcmp(before, b0, kv_q8_half_bytes(hd, bt)), "re-storing dequantized values changes the bytes");
    CHECK(kv_cache_bytes_per_token(kv) == (size_t)2 * 2 * (64 + 4), "bytes per token %zu", kv_cache_bytes_per_token(kv));
    free(k);
    free(v);
    kv_cache_free(kv);

    kv_cache_params bad = {1, 1, 48, 64, 16, QTYPE_Q8_0, 0};
    kv_cache *x = NULL;
    ellm_error err;
    CHECK(kv_cache_init(&bad, &x, &err) == ELLM_ERR_UNSUPPORTED && strstr(err.msg, "multiple of 32"), "hd 48: %s",
          err.msg);
}

/* The query quantizer: per 32 channels within half a step of the input (a
 * group of zeros gets scale 0), the sums the VNNI kernel subtracts; the score
 * of a key is the grouped integer formula of attention_q8.c. */
static void test_query(void) {
    enum { HD = 96, BT = 16 };
    float x[HD], d[HD / 32];
    int8_t q[HD], k[HD * BT];
    int32_t qs[HD / 32];
    uint16_t kd[HD / 32 * BT];
    for (int i = 0; i < HD; i++) x[i] = i < 32 ? frand() * 0.01f : i < 64 ? frand() * 3.0f : 0.0f;
    x[40] = -5.0f;
    attn_q8_quantize_query(x, HD, q, d, qs);
    for (int g = 0; g < HD / 32; g++) {
        int32_t sum = 0;
        for (int i = 32 * g; i < 32 * g + 32; i++) {
            CHECK(fabsf(x[i] - q[i] * d[g]) <= 0.5f * d[g] * 1.0001f, "query %d: %g vs %d x %g", i, x[i], q[i], d[g]);
            sum += q[i];
        }
        CHECK(qs[g] == 128 * sum, "group %d: qsum %d, 128 x sum %d", g, qs[g], 128 * sum);
    }
    CHECK(q[40] == -127 && d[2] == 0.0f && q[80] == 0, "extremes: q[40] %d, zero group scale %g", q[40], d[2]);
    for (int i = 0; i < HD * BT; i++) k[i] = (int8_t)(frand() * 127);
    for (int i = 0; i < HD / 32 * BT; i++) kd[i] = ellm_f32_to_f16(fabsf(frand()) * 0.05f);
    for (int j = 0; j < BT; j++) {
        double want = 0;
        for (int g = 0; g < HD / 32; g++) {
            long dot = 0;
            for (int c = 32 * g; c < 32 * g + 32; c++) dot += (long)q[c] * k[c * BT + j];
            want += (double)d[g] * ellm_f16_to_f32(kd[g * BT + j]) * (double)dot;
        }
        float got = attn_q8_score_ref(q, d, k, kd, HD, BT, j);
        CHECK(fabs(got - want) <= 1e-5 * (fabs(want) + 1e-3), "score of key %d: %g, want %g", j, got, want);
    }
}

/* The integer P*V of one row (attention_q8_impl.h): the AVX-512 helpers give
 * the scalar reference's bits, and the result is within the quantization's
 * bound of the F32-weight sum: each weight within half a step 2^(e - 8) of
 * p * vd (a full step where the largest is clamped to 255), for tiles of
 * probabilities of every size (tiles of zeros, a tile below 2^-100, weights
 * at a power of two, partial tiles, odd groups). */
static void test_pv(void) {
    const int hds[] = {32, 64, 96, 128}, nvs[] = {1, 5, 16, 17, 33, 64};
    const int simd = ellm_cpu()->avx512vnni && ellm_cpu()->avx512vbmi && ellm_cpu_isa() == ELLM_ISA_AVX512;
    int same = 1, within = 1, cases = 0;
    double worst = 0;
    for (size_t h = 0; h < sizeof hds / sizeof *hds; h++)
        for (size_t t = 0; t < sizeof nvs / sizeof *nvs; t++) {
            const int hd = hds[h], nv = nvs[t], ng = hd / 32;
            int8_t v[64 * 128];
            uint16_t vd[64 * 4];
            float p[64], a0[128], a1[128];
            double want[128], bound[128];
            for (int i = 0; i < nv * hd; i++) v[i] = (int8_t)(frand() * 128 - (i % 97 == 0 ? 1 : 0));
            for (int i = 0; i < nv * ng; i++) vd[i] = ellm_f32_to_f16(i % 23 == 5 ? 0.0f : fabsf(frand()) * 0.02f);
            for (int j = 0; j < nv; j++) {
                const int tile = j / 16;
                p[j] = tile == 1 ? 0.0f : tile == 2 ? 1e-33f * fabsf(frand()) : fabsf(frand()) * (j % 7 == 0);
                if (j == 3) p[j] = 1.0f;
                if (tile == 3 && j % 5 == 0) p[j] = 1.0f; /* several at the tile's maximum */
            }
            for (int d = 0; d < hd; d++) {
                a0[d] = a1[d] = frand() * 0.1f;
                want[d] = a0[d];
                bound[d] = 1e-6 * fabs(a0[d]);
            }
            for (int j0 = 0; j0 < nv; j0 += 16)
                for (int g = 0; g < ng; g++) {
                    float mx = 0;
                    for (int j = j0; j < nv && j < j0 + 16; j++)
                        mx = fmaxf(mx, p[j] * ellm_f16_to_f32(vd[j * ng + g]));
                    const double step = mx >= 0x1p-100f ? ldexp(1.0, ilogbf(mx) - 7) : 0;
                    for (int j = j0; j < nv && j < j0 + 16; j++) {
                        const double w = (double)(p[j] * ellm_f16_to_f32(vd[j * ng + g]));
                        for (int d = 32 * g; d < 32 * g + 32; d++) {
                            want[d] += w * v[j * hd + d];
                            bound[d] += (step > 0 ? step : w) * fabs((double)v[j * hd + d]);
                        }
                    }
                }
            attn_q8_pv_ref(a0, p, nv, v, vd, hd);
            if (simd) attn_q8_pv_avx512(a1, p, nv, v, vd, hd);
            for (int d = 0; d < hd; d++) {
                const double e = fabs(a0[d] - want[d]);
                within &= e <= bound[d] + 1e-6 * fabs(want[d]);
                worst = fmax(worst, e / (bound[d] + 1e-30));
            }
            if (simd) same &= !memcmp(a0, a1, (size_t)hd * 4);
            cases++;
        }
    printf("q8_0 P*V: %d cases, error at most %.2f of the quantization bound%s\n", cases, worst,
           simd ? ", AVX-512 bit-identical" : " (no AVX-512 VNNI/VBMI: SIMD not compared)");
    CHECK(within, "integer P*V outside the weights' quantization bound (worst %.3g of it)", worst);
    CHECK(same, "AVX-512 integer P*V differs from the scalar reference");
}

/* Every row of a batched call (prefill, speculative verification) equals a
 * single-token call at its position bit for bit, at every ISA and thread
 * count: the Q8_0 kernels' arithmetic per row does not depend on the rows
 * sharing the call (blocks seen whole, partly, by some rows only). */
static void test_rows_exact(ellm_isa best) {
    const int nkv = 2, bt = 16;
    /* head_dim 64 and 128: the AVX2 whole-block path is compiled for 64 and for any */
    const int shapes[][4] = {/* group, n_q, len, head_dim */ {3, 13, 1000, 64}, {8, 5, 77, 64}, {1, 20, 40, 64},
                             {4, 6, 300, 128}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int G = shapes[s][0], n_q = shapes[s][1], len = shapes[s][2], hd = shapes[s][3], nh = nkv * G;
        kv_cache *kv = make_cache(nkv, hd, 1024, bt, QTYPE_Q8_0);
        if (!kv) return;
        const size_t row = (size_t)nkv * hd, qrow = (size_t)nh * hd;
        float *k = malloc((size_t)len * row * 4), *v = malloc((size_t)len * row * 4), *q = malloc(n_q * qrow * 4),
              *out = malloc(n_q * qrow * 4), *one = malloc(qrow * 4);
        for (size_t i = 0; i < (size_t)len * row; i++) {
            k[i] = frand() * 2;
            v[i] = frand();
        }
        for (size_t i = 0; i < n_q * qrow; i++) q[i] = frand() * 2;
        kv_cache_store(kv, 0, 0, len, k, v);
        kv_cache_set_len(kv, len);
        attention_workspace *ws = NULL;
        ellm_error err;
        CHECK(attention_workspace_init(3, 32, nh, hd, 1024, bt, &ws, &err) == ELLM_OK, "%s", err.msg);
        for (ellm_isa isa = ELLM_ISA_SCALAR; isa <= best && ws; isa++) {
            ellm_cpu_set_isa(isa);
            for (int nt = 1; nt <= 3; nt += 2) {
                attention_args a = {kv, 0, n_q, len - n_q, nh, q, out, 0.125f};
                attention_forward(&a, ws, nt > 1 ? pool_of(nt) : NULL);
                int same = 1;
                for (int i = 0; i < n_q; i++) {
                    attention_args a1 = {kv, 0, 1, len - n_q + i, nh, q + i * qrow, one, 0.125f};
                    attention_forward(&a1, ws, nt > 1 ? pool_of(nt) : NULL);
                    same &= !memcmp(one, out + i * qrow, qrow * 4);
                }
                CHECK(same, "q8 batch rows vs single tokens: hd %d G %d n_q %d len %d isa %s threads %d", hd, G, n_q,
                      len, ellm_isa_str(isa), nt);
            }
        }
        ellm_cpu_set_isa(best);
        attention_workspace_free(ws);
        free(k);
        free(v);
        free(q);
        free(out);
        free(one);
        kv_cache_free(kv);
    }
}

static double max_rel(const float *a, const float *b, size_t n) {
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d;
        s = fmax(s, fabs(b[i]));
    }
    return m / (s > 0 ? s : 1);
}

/* Against the F32 reference (exp(s - m) weights): P*V's weights are 8-bit
 * numbers, each within half a step (2^-8 of its tile's largest) of p x vd;
 * measured 0.011 of the largest output on these shapes (the values' own
 * quantization moves it by 0.02 against an F16 cache). */
#define Q8_REF_TOL 0.02
/* SIMD against the scalar kernel: the same integers; the softmax's exp
 * differs by a few ulps between ISAs (measured 3.8e-7), and a weight that
 * rounded to the neighbouring u8 would move the output by one step of one
 * key -- none does here. */
#define Q8_ISA_TOL 2e-5
/* attention_forward (and the sparse variant) on a Q8_0 cache against the
 * reference, every ISA and thread count; and against an F16 cache of the same
 * keys (the quantization error only). */
static void test_attention(ellm_isa best) {
    const int shapes[][4] = {/* hd, group, n_q, len */
                             {64, 3, 1, 1000}, {64, 3, 5, 300}, {128, 4, 1, 700}, {64, 1, 20, 200}, {128, 2, 1, 17},
                             /* AVX-512 in-register kernel: the row limit, a 96-dim head (a 32-dim tail
                              * tile, generic head_dim), one row over a partial block */
                             {64, 8, 1, 150}, {96, 2, 2, 333}, {64, 1, 1, 7}, {64, 3, 3, 129}};
    double worst = 0, worst_f16 = 0, worst_isa = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int hd = shapes[s][0], G = shapes[s][1], n_q = shapes[s][2], len = shapes[s][3], nkv = 2, bt = 16;
        kv_cache *kv = make_cache(nkv, hd, 1024, bt, QTYPE_Q8_0), *k16 = make_cache(nkv, hd, 1024, bt, QTYPE_F16);
        if (!kv || !k16) return;
        size_t row = (size_t)nkv * hd;
        float *k = malloc((size_t)len * row * 4), *v = malloc((size_t)len * row * 4);
        for (size_t i = 0; i < (size_t)len * row; i++) {
            k[i] = frand() * 2 + (i % 16 == 0 ? 3.0f : 0.0f);
            v[i] = frand();
        }
        kv_cache_store(kv, 0, 0, len, k, v);
        kv_cache_store(k16, 0, 0, len, k, v);
        kv_cache_set_len(kv, len);
        kv_cache_set_len(k16, len);
        const int nh = nkv * G;
        float *q = malloc((size_t)n_q * nh * hd * 4), *ref = malloc((size_t)n_q * nh * hd * 4),
              *out = malloc((size_t)n_q * nh * hd * 4), *o16 = malloc((size_t)n_q * nh * hd * 4);
        for (int i = 0; i < n_q * nh * hd; i++) q[i] = frand() * 2;
        attention_args a = {kv, 0, n_q, len - n_q, nh, q, ref, 1.0f / sqrtf((float)hd)};
        attention_forward_ref(&a);
        attention_workspace *ws = NULL;
        ellm_error err;
        CHECK(attention_workspace_init(3, 32, nh, hd, 1024, bt, &ws, &err) == ELLM_OK, "%s", err.msg);
        float *scal = malloc((size_t)n_q * nh * hd * 4);
        for (ellm_isa isa = ELLM_ISA_SCALAR; isa <= best && ws; isa++) {
            ellm_cpu_set_isa(isa);
            for (int nt = 1; nt <= 3; nt += 2) {
                a.out = out;
                attention_forward(&a, ws, nt > 1 ? pool_of(nt) : NULL);
                double e = max_rel(out, ref, (size_t)n_q * nh * hd);
                worst = fmax(worst, e);
                CHECK(e < Q8_REF_TOL, "q8 dense hd %d G %d n_q %d len %d isa %s threads %d: error %g", hd, G, n_q,
                      len, ellm_isa_str(isa), nt, e);
                if (isa == ELLM_ISA_SCALAR && nt == 1) memcpy(scal, out, (size_t)n_q * nh * hd * 4);
                double ek = max_rel(out, scal, (size_t)n_q * nh * hd);
                worst_isa = fmax(worst_isa, ek);
                CHECK(ek < Q8_ISA_TOL, "q8 dense hd %d G %d n_q %d len %d isa %s threads %d vs scalar: %g", hd, G,
                      n_q, len, ellm_isa_str(isa), nt, ek);
                /* sparse: every other block, always the last */
                int nb = (len + bt - 1) / bt, lists[2 * 64], counts[2];
                for (int h = 0; h < nkv; h++) {
                    counts[h] = 0;
                    for (int b = 0; b < nb; b++)
                        if (b % 2 == h % 2 || b == nb - 1) lists[h * 64 + counts[h]++] = b;
                }
                attention_forward_blocks(&a, lists, counts, 64, ws, nt > 1 ? pool_of(nt) : NULL);
                /* the reference of a block subset: zero the other blocks' scores via a
                 * cache holding only those keys is costly; compare with the scalar path */
                if (isa == ELLM_ISA_SCALAR && nt == 1) memcpy(o16, out, (size_t)n_q * nh * hd * 4);
                else {
                    double es = max_rel(out, o16, (size_t)n_q * nh * hd);
                    worst_isa = fmax(worst_isa, es);
                    CHECK(es < Q8_ISA_TOL, "q8 sparse isa %s threads %d vs scalar: %g", ellm_isa_str(isa), nt, es);
                }
            }
        }
        ellm_cpu_set_isa(best);
        a.kv = k16;
        a.out = o16;
        attention_forward_ref(&a);
        worst_f16 = fmax(worst_f16, max_rel(ref, o16, (size_t)n_q * nh * hd));
        attention_workspace_free(ws);
        free(scal);
        free(k);
        free(v);
        free(q);
        free(ref);
        free(out);
        free(o16);
        kv_cache_free(kv);
        kv_cache_free(k16);
    }
    printf("q8_0 attention: SIMD within %.2g of the scalar kernel; worst error against the reference %.2g; "
           "the quantization moves the output by %.2g (relative to the largest) against an F16 cache\n",
           worst_isa, worst, worst_f16);
    CHECK(worst_f16 < 0.05, "q8_0 vs F16 cache: %g", worst_f16);
    pool_release();
}

/* A whole model: logits near an F16 cache's, the index bounds the stored keys,
 * save and restore continue exactly, a shift keeps going. */
static void test_model(void) {
    ellm_error err = {0};
    ellm_model *m = test_load_model("models/evalmodel.gguf", NULL);
    if (!m) return;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 2;
    cp.sparse_topk = 96;
    ellm_context *a = NULL, *b = NULL, *f = NULL;
    cp.kv_type = ELLM_KV_Q8_0;
    CHECK(ellm_context_init(m, &cp, &a, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_context_init(m, &cp, &b, &err) == ELLM_OK, "%s", err.msg);
    cp.kv_type = ELLM_KV_F16;
    CHECK(ellm_context_init(m, &cp, &f, &err) == ELLM_OK, "%s", err.msg);
    if (!a || !b || !f) goto out;
    int32_t toks[200];
    int n = 0;
    const char *text = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\n"
                       "class Stack:\n    def __init__(self):\n        self.items = []\n";
    ellm_tokenize(m, text, strlen(text), 1, 0, toks, 200, &n, &err);
    CHECK(ellm_decode(a, toks, n, NULL, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_decode(f, toks, n, NULL, &err) == ELLM_OK, "%s", err.msg);
    double e = max_rel(ellm_context_logits(a), ellm_context_logits(f), (size_t)m->cfg.n_vocab);
    printf("q8_0 KV: last logits within %.3g (relative to the largest) of an F16 cache's\n", e);
    CHECK(e < 0.05, "q8_0 vs f16 logits: %g", e);
    /* index summaries bound every stored key */
    int bounded = 1;
    float lo[256], hi[256], key[256];
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int h = 0; h < m->cfg.n_head_kv; h++)
            for (int p = 0; p < n; p++) {
                if (p % 16 == 0) sparse_index_summary(a->sidx, l, h, 0, p / 16, lo, hi);
                kv_cache_key(a->kv, l, h, p, key);
                for (int c = 0; c < m->cfg.head_dim; c++) bounded &= lo[c] <= key[c] && key[c] <= hi[c];
            }
    CHECK(bounded, "sparse summaries do not bound the stored Q8_0 keys");
    /* save, restore, continue: same logits */
    const char *state = test_tmp_path("q8.state");
    CHECK(ellm_context_state_save(a, state, NULL, 0, &err) == ELLM_OK, "%s", err.msg);
    CHECK(ellm_context_state_load(b, state, &err) == ELLM_OK, "%s", err.msg);
    remove(state);
    int same = 1;
    for (int i = 0; i < 40 && same; i++) {
        int32_t t = toks[i % n];
        ellm_decode(a, &t, 1, NULL, &err);
        ellm_decode(b, &t, 1, NULL, &err);
        same = !memcmp(ellm_context_logits(a), ellm_context_logits(b), (size_t)m->cfg.n_vocab * 4);
    }
    CHECK(same, "q8_0 context restored continues differently");
    int pos = ellm_context_pos(a);
    CHECK(ellm_context_shift(a, 4, pos / 2, &err) == ELLM_OK && ellm_context_pos(a) == pos - pos / 2, "shift: %s",
          err.msg);
    int32_t t = toks[0];
    CHECK(ellm_decode(a, &t, 1, NULL, &err) == ELLM_OK, "decode after a q8_0 shift: %s", err.msg);
out:
    ellm_context_free(a);
    ellm_context_free(b);
    ellm_context_free(f);
    ellm_model_free(m);
}

/* A part's state for R rows of head_dim hd (hdp = hd) with query rows q
 * (R x hd), quantized; mem holds it (free it). */
static attn_state block_state(int R, int hd, const float *q, float **mem) {
    const int rp = (R + 3) & ~3, ng = hd / 32;
    const size_t floats = 2 * (size_t)rp * hd + 2 * (size_t)rp + (size_t)rp * 16 + 2 * (size_t)16 * hd +
                          16 * (size_t)rp + (size_t)rp * hd / 4 + 2 * (size_t)rp * ng;
    float *p = aligned_alloc(64, (floats * sizeof(float) + 63) & ~(size_t)63);
    attn_state st;
    memset(&st, 0, sizeof st);
    *mem = p;
    if (!p) return st;
    memset(p, 0, floats * sizeof(float));
    st.head_dim = st.hdp = hd;
    st.rows = R;
    st.group = R;
    st.block_tokens = 16;
    st.lds = 16;
    st.lanes = 1;
    st.q = q;
    st.acc = p, p += (size_t)rp * hd;
    st.m = p, p += rp;
    st.l = p, p += rp;
    st.s = p, p += (size_t)rp * 16;
    st.kbuf = p, p += (size_t)16 * hd;
    st.vbuf = p, p += (size_t)16 * hd;
    st.lv = p, p += 16 * (size_t)rp;
    st.q8 = (int8_t *)p, p += (size_t)rp * hd / 4;
    st.qd = p, p += (size_t)rp * ng;
    st.qsum = (int32_t *)p;
    for (int r = 0; r < R; r++) {
        st.m[r] = -INFINITY;
        attn_q8_quantize_query(q + (size_t)r * hd, hd, st.q8 + (size_t)r * hd, st.qd + (size_t)r * ng,
                               st.qsum + (size_t)r * ng);
    }
    return st;
}

/* The multi-block step (attn_blocks_q8_avx512) against block-by-block steps
 * of attn_block_q8_avx512: m, the lane sums and acc keep their bits for 1-4
 * rows, head_dim 64 and 128, steps of 1-4 blocks. Block 2's keys are large,
 * so every row's max grows inside a step, and with a large query the other
 * blocks' weights fall below 2^-100 (tiles that add nothing) or their acc
 * is rescaled to almost nothing; a token with zero values has a zero scale. */
static void test_multi_block(void) {
    if (!(ellm_cpu()->avx512vnni && ellm_cpu()->avx512vbmi && ellm_cpu()->best >= ELLM_ISA_AVX512)) {
        SKIP("q8_0 multi-block steps: the CPU lacks AVX-512 VNNI or VBMI");
        return;
    }
    const int nblk = 11, hds[] = {64, 128};
    int bad = 0, cases = 0;
    /* its own random numbers: the later tests' data stay as they were (test_attention's ISA
     * tolerance assumes no weight of its data lands next to a rounding boundary) */
    const uint64_t rng_saved = g_rng;
    g_rng = 0x9e3779b97f4a7c15ull;
    for (int h = 0; h < 2; h++)
        for (int big = 0; big < 2; big++) {
            const int hd = hds[h];
            kv_cache *kv = make_cache(1, hd, 16 * nblk, 16, QTYPE_Q8_0);
            if (!kv) return;
            float *k = malloc((size_t)16 * nblk * hd * 4), *v = malloc((size_t)16 * nblk * hd * 4);
            for (int i = 0; i < 16 * nblk * hd; i++) {
                const int tok = i / hd;
                k[i] = (tok / 16 == 2 ? 4.0f : 1.0f) * frand();
                v[i] = tok == 70 ? 0.0f : frand();
            }
            kv_cache_store(kv, 0, 0, 16 * nblk, k, v);
            kv_cache_set_len(kv, 16 * nblk);
            attn_block b[16];
            for (int i = 0; i < nblk; i++) {
                memset(&b[i], 0, sizeof b[i]);
                b[i].k = kv_cache_block_k(kv, 0, 0, i);
                b[i].v = kv_cache_block_v(kv, 0, 0, i);
                b[i].type = QTYPE_Q8_0;
                b[i].n_valid = 16;
                b[i].vis0 = 1000;
                if (i + 1 < nblk) {
                    b[i].next_k = kv_cache_block_k(kv, 0, 0, i + 1);
                    b[i].next_v = kv_cache_block_v(kv, 0, 0, i + 1);
                }
                if (i + 4 < nblk) {
                    b[i].ahead_k = kv_cache_block_k(kv, 0, 0, i + 4);
                    b[i].ahead_v = kv_cache_block_v(kv, 0, 0, i + 4);
                }
            }
            for (int R = 1; R <= 4; R++)
                for (int step = 1; step <= ATTN_Q8_STEP_BLOCKS; step++) {
                    float *q = malloc((size_t)R * hd * 4), *ma, *mb;
                    for (int i = 0; i < R * hd; i++) q[i] = frand() * (big ? 40.0f : 0.4f);
                    attn_state one = block_state(R, hd, q, &ma), many = block_state(R, hd, q, &mb);
                    if (ma && mb) {
                        CHECK(attn_blocks_q8_fits(&many), "multi-block steps take %d rows, hd %d", R, hd);
                        for (int i = 0; i < nblk; i++) attn_block_q8_avx512(&one, &b[i]);
                        for (int i = 0; i < nblk; i += step)
                            attn_blocks_q8_avx512(&many, &b[i], nblk - i < step ? nblk - i : step);
                        int d = memcmp(one.m, many.m, (size_t)R * 4) != 0;
                        d += memcmp(one.lv, many.lv, (size_t)R * 16 * 4) != 0;
                        d += memcmp(one.acc, many.acc, (size_t)R * hd * 4) != 0;
                        CHECK(d == 0, "q8_0 multi-block steps of %d, rows %d, hd %d, query x%s: state differs", step,
                              R, hd, big ? "40" : "0.4");
                        int nz = 0;
                        for (int i = 0; i < R * hd; i++) nz += one.acc[i] != 0.0f && isfinite(one.acc[i]);
                        CHECK(nz > 0, "q8_0 blocks: the rows accumulated nothing");
                        bad += d != 0;
                        cases++;
                    }
                    free(ma);
                    free(mb);
                    free(q);
                }
            free(k);
            free(v);
            kv_cache_free(kv);
        }
    g_rng = rng_saved;
    printf("q8_0 multi-block steps: %d cases, %d differ from block-by-block steps\n", cases, bad);
}

int main(void) {
    ellm_isa best = ellm_cpu_isa();
    test_store();
    test_query();
    test_pv();
    test_multi_block();
    test_attention(best);
    test_rows_exact(best);
    test_model();
    return test_finish();
}
