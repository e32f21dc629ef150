/* The multi-row attention kernel (attention_rows*.c): every row of a call
 * that takes it equals, bit for bit, the same call with the single-row
 * kernel and a single-token call at that row's position; results agree with
 * the naive reference; the block kernel itself leaves the same state (m,
 * lane sums, acc) as the single-row block kernel on full blocks (including a
 * block whose scores raise the running max) and on the diagonal block, and
 * so does the pair kernel taking two blocks at once. The same for Q8_0
 * caches (attention_rows_q8_avx512.c against attention_q8_avx512.c). */
#include "attention/attention.h"
#include "attention/attention_kernel.h"
#include "attention/attention_rows.h"
#include "attention/kv_cache.h"
#include "core/cpu.h"
#include "core/fp16.h"
#include "core/threadpool.h"
#include "harness.h"
#include "test_pool.h"
#include "kernels/quant.h"

#include <stdint.h>
#include <string.h>


static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static float frand(void) { return test_frand(&g_rng); }

/* Keys of tokens [hot0, hot1) are 4x larger, so every row's running max
 * grows when a part reaches them (hot0 = hot1: none). */
static kv_cache *make_filled_hot(int n_kv, int hd, int len, int bt, int type, int hot0, int hot1) {
    kv_cache_params p = {1, n_kv, hd, len, bt, type, 0};
    kv_cache *kv = NULL;
    ellm_error err;
    ellm_status st = kv_cache_init(&p, &kv, &err);
    CHECK(st == ELLM_OK, "kv_cache_init: %s", st == ELLM_OK ? "" : err.msg);
    if (!kv) return NULL;
    size_t n = (size_t)len * n_kv * hd;
    float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const int pos = (int)(i / ((size_t)n_kv * hd));
        k[i] = (pos >= hot0 && pos < hot1 ? 4.0f : 1.0f) * frand();
        v[i] = frand();
    }
    kv_cache_store(kv, 0, 0, len, k, v);
    kv_cache_set_len(kv, len);
    free(k);
    free(v);
    return kv;
}

static const char *type_name(int type) { return type == QTYPE_F16 ? "f16" : type == QTYPE_F32 ? "f32" : "q8_0"; }

static float max_abs(const float *a, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fabsf(a[i]) > m ? fabsf(a[i]) : m;
    return m;
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN counts */
    }
    return m;
}

/* One shape: a batch of n_q rows at the end of a cache of len tokens. */
static void check_shape(int type, int hd, int G, int n_q, int len, int bt) {
    const int n_kv = 3, n_head = n_kv * G;
    /* one block of larger keys halfway: the running max grows inside a part */
    const int hot = len / 2 / bt * bt;
    kv_cache *kv = make_filled_hot(n_kv, hd, len, bt, type, hot, hot + bt);
    if (!kv) return;
    const size_t row = (size_t)n_head * hd, nout = (size_t)n_q * row;
    float *q = malloc(nout * sizeof(float)), *rows = malloc(nout * sizeof(float)), *old = malloc(nout * sizeof(float));
    float *one = malloc(nout * sizeof(float)), *ref = malloc(nout * sizeof(float));
    for (size_t i = 0; i < nout; i++) q[i] = 3.0f * frand();
    attention_workspace *ws = NULL;
    ellm_error err;
    CHECK(attention_workspace_init(2, n_q, n_head, hd, len, bt, &ws, &err) == ELLM_OK, "workspace: %s", err.msg);
    const float scale = 1.0f / sqrtf((float)hd);
    attention_args a = {kv, 0, n_q, len - n_q, n_head, q, ref, scale};
    attention_forward_ref(&a);
    for (int nt = 1; ws && nt <= 2; nt++) {
        attention_rows_enable(1);
        a.out = rows;
        attention_forward(&a, ws, pool_of(nt));
        attention_rows_enable(0);
        a.out = old;
        attention_forward(&a, ws, pool_of(nt));
        attention_rows_enable(1);
        for (int i = 0; i < n_q; i++) {
            attention_args a1 = {kv, 0, 1, len - n_q + i, n_head, q + i * row, one + i * row, scale};
            attention_forward(&a1, ws, pool_of(1 + i % 2));
        }
        int bad_old = 0, bad_one = 0;
        for (int i = 0; i < n_q; i++) {
            bad_old += memcmp(rows + i * row, old + i * row, row * sizeof(float)) != 0;
            bad_one += memcmp(rows + i * row, one + i * row, row * sizeof(float)) != 0;
        }
        const char *tn = type_name(type);
        CHECK(bad_old == 0, "%s hd=%d G=%d n_q=%d len=%d bt=%d threads=%d: %d rows differ from the single-row kernel",
              tn, hd, G, n_q, len, bt, nt, bad_old);
        CHECK(bad_one == 0, "%s hd=%d G=%d n_q=%d len=%d bt=%d threads=%d: %d rows differ from single-token calls", tn,
              hd, G, n_q, len, bt, nt, bad_one);
        /* Q8_0: the reference takes F32 weights times the dequantized
         * values, the kernels 8-bit weights (attention_q8_impl.h; test_kv_q8
         * bounds that error) */
        const float tol = type == QTYPE_Q8_0 ? 0.02f * max_abs(ref, nout) : 2e-5f;
        float e = max_abs_diff(rows, ref, nout);
        CHECK(e < tol, "%s hd=%d G=%d n_q=%d: max |rows - reference| = %g (tolerance %g)", tn, hd, G, n_q, e, tol);
    }
    attention_workspace_free(ws);
    free(q);
    free(rows);
    free(old);
    free(one);
    free(ref);
    kv_cache_free(kv);
}

/* An attn_state over aligned scratch for R rows of head_dim hd (bt 16). */
typedef struct {
    attn_state st;
    float *mem;
} state_buf;

static void state_init(state_buf *sb, int R, int G, int hd, const float *q) {
    const int hdp = (hd + 15) & ~15, lds = 16, rp = (R + 15) & ~15;
    size_t floats =
        2 * (size_t)rp * hdp + 2 * (size_t)rp + (size_t)rp * lds + 2 * (size_t)lds * hdp + 16 * (size_t)rp + 2 * (size_t)rp;
    void *m = NULL;
    if (posix_memalign(&m, 64, floats * sizeof(float))) m = NULL;
    sb->mem = m;
    memset(&sb->st, 0, sizeof sb->st);
    if (!m) return;
    memset(m, 0, floats * sizeof(float));
    attn_state *st = &sb->st;
    float *p = m;
    st->head_dim = hd;
    st->hdp = hdp;
    st->rows = R;
    st->group = G;
    st->block_tokens = 16;
    st->lds = lds;
    st->lanes = 1;
    st->q = p;
    memcpy(p, q, (size_t)R * hdp * sizeof(float));
    p += (size_t)rp * hdp;
    st->acc = p, p += (size_t)rp * hdp;
    st->m = p, p += rp;
    st->l = p, p += rp;
    st->s = p, p += (size_t)rp * lds;
    st->kbuf = p, p += (size_t)lds * hdp;
    st->vbuf = p, p += (size_t)lds * hdp;
    st->lv = p, p += 16 * (size_t)rp;
    st->alpha = p;
    for (int r = 0; r < R; r++) st->m[r] = -INFINITY;
    /* the query rows quantized, for Q8_0 blocks (freed by state_free) */
    const int ng = hdp / 32 + 1;
    st->q8 = aligned_alloc(64, (size_t)rp * hdp);
    st->qd = malloc((size_t)rp * ng * sizeof(float));
    st->qsum = malloc((size_t)rp * ng * sizeof(int32_t));
    if (st->q8 && st->qd && st->qsum && hd % 32 == 0)
        for (int r = 0; r < R; r++)
            attn_q8_quantize_query(q + (size_t)r * hdp, hd, st->q8 + (size_t)r * hdp, st->qd + (size_t)r * (hdp / 32),
                                   st->qsum + (size_t)r * (hdp / 32));
}

static void state_free(state_buf *sb) {
    free(sb->mem);
    free(sb->st.q8);
    free(sb->st.qd);
    free(sb->st.qsum);
}

/* Whether two states hold the same m, lane sums and acc bits (count of differences). */
static int state_diff(const attn_state *a, const attn_state *b, int R, int hd) {
    int bad = memcmp(a->m, b->m, R * sizeof(float)) != 0;
    bad += memcmp(a->lv, b->lv, 16 * (size_t)R * sizeof(float)) != 0;
    for (int r = 0; r < R; r++)
        bad += memcmp(a->acc + (size_t)r * a->hdp, b->acc + (size_t)r * b->hdp, hd * sizeof(float)) != 0;
    return bad;
}

/* Block kernel against block kernel: a sequence of blocks (the third with
 * keys 4x larger, so every row's max grows there; the last the diagonal
 * block, which the rows of a batch see partly). */
static void check_block_kernel(int type, int hd, int G, int n_tok) {
    const int R = G * n_tok, hdp = (hd + 15) & ~15, n_blk = 5;
    const size_t elt = type == QTYPE_F16 ? 2 : 4, half = (size_t)16 * hd * elt;
    float *q = malloc((size_t)R * hdp * sizeof(float));
    for (int r = 0; r < R; r++)
        for (int d = 0; d < hdp; d++) q[(size_t)r * hdp + d] = d < hd ? 0.3f * frand() : 0.0f;
    char *kv = aligned_alloc(64, 2 * half * n_blk);
    for (int b = 0; b < n_blk; b++)
        for (size_t i = 0; i < 16 * (size_t)hd; i++) {
            float mul = b == 2 ? 4.0f : 1.0f;
            float k = mul * frand(), v = frand();
            if (type == QTYPE_F16) {
                ((uint16_t *)(kv + 2 * half * b))[i] = ellm_f32_to_f16(k);
                ((uint16_t *)(kv + 2 * half * b + half))[i] = ellm_f32_to_f16(v);
            } else {
                ((float *)(kv + 2 * half * b))[i] = k;
                ((float *)(kv + 2 * half * b + half))[i] = v;
            }
        }
    state_buf a, o, pr;
    state_init(&a, R, G, hd, q);
    state_init(&o, R, G, hd, q);
    state_init(&pr, R, G, hd, q);
    if (a.mem && o.mem && pr.mem) {
        /* the pair kernel uses the q8 scratch: rows x 16 floats (hd / 4 per row >= 16) */
        attn_block blk[8];
        for (int b = 0; b < n_blk; b++) {
            memset(&blk[b], 0, sizeof blk[b]);
            blk[b].k = kv + 2 * half * b;
            blk[b].v = kv + 2 * half * b + half;
            blk[b].type = type;
            blk[b].n_valid = b == n_blk - 1 ? 1 + n_tok - 1 : 16; /* the diagonal block: keys up to the last row */
            blk[b].vis0 = b == n_blk - 1 ? 1 : 1000;
            if (b + 1 < n_blk) {
                blk[b].next_k = kv + 2 * half * (b + 1);
                blk[b].next_v = blk[b].next_k + half;
            }
            attn_block_rows_avx512(&a.st, &blk[b]);
            attn_block_avx512(&o.st, &blk[b]);
        }
        /* in pairs: (0, 1), (2, 3) full, then (4, diagonal) handed on block by block */
        for (int b = 0; b + 1 < n_blk; b += 2) attn_block2_rows_avx512(&pr.st, &blk[b], &blk[b + 1]);
        if (n_blk % 2) attn_block_rows_avx512(&pr.st, &blk[n_blk - 1]);
        const int bad = state_diff(&a.st, &o.st, R, hd);
        CHECK(bad == 0, "block kernel %s hd=%d G=%d tokens=%d: state differs from attn_block_avx512 (%d)",
              type == QTYPE_F16 ? "f16" : "f32", hd, G, n_tok, bad);
        const int bad2 = state_diff(&pr.st, &o.st, R, hd);
        CHECK(bad2 == 0, "pair kernel %s hd=%d G=%d tokens=%d: state differs from attn_block_avx512 (%d)",
              type == QTYPE_F16 ? "f16" : "f32", hd, G, n_tok, bad2);
        float l0 = 0;
        for (int i = 0; i < 16; i++) l0 += a.st.lv[i];
        CHECK(l0 > 0 && isfinite(a.st.acc[0]), "block kernel: row 0 accumulated nothing (l = %g)", l0);
    }
    state_free(&a);
    state_free(&o);
    state_free(&pr);
    free(q);
    free(kv);
}

/* The Q8_0 block kernel against the single-row one: blocks of a cache (the
 * third with keys 4x larger, so every row's max grows there), then the
 * diagonal block, then a full block again. */
static void check_block_kernel_q8(int hd, int G, int n_tok) {
    const int R = G * n_tok, hdp = (hd + 15) & ~15, n_blk = 6;
    kv_cache *kv = make_filled_hot(1, hd, 16 * n_blk, 16, QTYPE_Q8_0, 32, 48);
    if (!kv) return;
    float *q = malloc((size_t)R * hdp * sizeof(float));
    for (int r = 0; r < R; r++)
        for (int d = 0; d < hdp; d++) q[(size_t)r * hdp + d] = d < hd ? 0.4f * frand() : 0.0f;
    state_buf a, o;
    state_init(&a, R, G, hd, q);
    state_init(&o, R, G, hd, q);
    if (a.mem && o.mem && a.st.q8 && o.st.q8) {
        const int order[7] = {0, 1, 2, 3, 4, 5, 3};
        for (int i = 0; i < 7; i++) {
            const int blk = order[i];
            attn_block b;
            memset(&b, 0, sizeof b);
            b.k = kv_cache_block_k(kv, 0, 0, blk);
            b.v = kv_cache_block_v(kv, 0, 0, blk);
            b.type = QTYPE_Q8_0;
            b.n_valid = i == 5 ? n_tok : 16; /* block 5 as the diagonal one */
            b.vis0 = i == 5 ? 1 : 1000;
            if (i + 1 < 7) {
                b.next_k = kv_cache_block_k(kv, 0, 0, order[i + 1]);
                b.next_v = kv_cache_block_v(kv, 0, 0, order[i + 1]);
            }
            attn_block_rows_q8_avx512(&a.st, &b);
            attn_block_q8_avx512(&o.st, &b);
        }
        const int bad = state_diff(&a.st, &o.st, R, hd);
        CHECK(bad == 0, "q8_0 block kernel hd=%d G=%d tokens=%d: state differs from attn_block_q8_avx512 (%d)", hd, G,
              n_tok, bad);
        float l0 = 0;
        for (int i = 0; i < 16; i++) l0 += a.st.lv[16 * (R - 1) + i];
        CHECK(l0 > 0 && isfinite(a.st.acc[(size_t)(R - 1) * hdp]) && a.st.acc[(size_t)(R - 1) * hdp] != 0.0f,
              "q8_0 block kernel: the last row accumulated nothing (l = %g)", l0);
    }
    state_free(&a);
    state_free(&o);
    free(q);
    kv_cache_free(kv);
}

int main(void) {
    if (ellm_cpu()->best < ELLM_ISA_AVX512) {
        SKIP("multi-row attention kernel: AVX-512 only, this CPU has %s", ellm_isa_str(ellm_cpu()->best));
        return test_finish();
    }
    ellm_cpu_set_isa(ELLM_ISA_AVX512);
    CHECK(attn_rows_kernel(QTYPE_F16) == attn_block_rows_avx512, "F16 cache: the multi-row kernel is chosen");
    const int q8_ok = ellm_cpu()->avx512vnni && ellm_cpu()->avx512vbmi;
    CHECK(attn_rows_kernel(QTYPE_Q8_0) == (q8_ok ? attn_block_rows_q8_avx512 : NULL),
          "Q8_0 cache: the multi-row kernel is chosen with VNNI and VBMI");
    CHECK(attn_rows_pair_kernel(QTYPE_Q8_0) == NULL, "Q8_0 cache: no pair kernel");
    CHECK(attn_rows_pair_kernel(QTYPE_F32) == attn_block2_rows_avx512, "F32 cache: the pair kernel is chosen");
    ellm_cpu_set_isa(ELLM_ISA_AVX2);
    CHECK(attn_rows_kernel(QTYPE_F16) == NULL, "AVX2: no multi-row kernel");
    ellm_cpu_set_isa(ELLM_ISA_AVX512);

    /* verify-pass shapes (GQA 3: 9..27 rows), MHA and wide heads, F16 and F32,
     * depths of several parts (32 blocks each), blocks of 16 and 32 tokens */
    check_shape(QTYPE_F16, 64, 3, 3, 1100, 16);
    check_shape(QTYPE_F16, 64, 3, 9, 1500, 16);
    check_shape(QTYPE_F16, 64, 3, 5, 77, 16);
    check_shape(QTYPE_F16, 64, 1, 16, 600, 16);
    check_shape(QTYPE_F16, 64, 4, 17, 700, 16); /* two tiles */
    check_shape(QTYPE_F16, 128, 2, 8, 900, 16);
    check_shape(QTYPE_F32, 64, 3, 4, 800, 16);
    check_shape(QTYPE_F32, 128, 3, 6, 530, 16);
    check_shape(QTYPE_F16, 64, 3, 6, 700, 32); /* blocks the multi-row kernel hands on */
    check_shape(QTYPE_F16, 40, 3, 6, 300, 16);

    for (int t = 0; t < 2; t++) {
        const int type = t ? QTYPE_F32 : QTYPE_F16;
        check_block_kernel(type, 64, 3, 3);
        check_block_kernel(type, 64, 3, 9);
        check_block_kernel(type, 64, 1, 13);
        check_block_kernel(type, 128, 3, 4);
    }

    if (!q8_ok) {
        SKIP("multi-row Q8_0 kernel: this CPU lacks AVX-512 VNNI or VBMI");
    } else {
        /* Q8_0: rows 3..19 of one tile (GQA 1-4; the multi-row kernel from 6), two tiles, head_dim 64 and
         * 128 (96 falls back), depths of one to five parts, a partial last
         * block, blocks of 32 tokens (handed on) */
        CHECK(attn_rows_min(QTYPE_Q8_0) == 6 && attn_rows_min(QTYPE_F16) == 9, "row thresholds");
        check_shape(QTYPE_Q8_0, 64, 3, 1, 1100, 16);  /* 3 rows: the single-row kernel */
        check_shape(QTYPE_Q8_0, 64, 3, 2, 1100, 16);  /* 6 rows: a 2-token verify */
        check_shape(QTYPE_Q8_0, 128, 1, 7, 900, 16);  /* 7 */
        check_shape(QTYPE_Q8_0, 64, 2, 4, 1300, 16);  /* 8 */
        check_shape(QTYPE_Q8_0, 64, 3, 3, 1100, 16);  /* 9 rows */
        check_shape(QTYPE_Q8_0, 128, 2, 5, 900, 16);  /* 10 */
        check_shape(QTYPE_Q8_0, 64, 1, 11, 650, 16);  /* 11 */
        check_shape(QTYPE_Q8_0, 64, 3, 4, 2100, 16);  /* 12, 5 parts */
        check_shape(QTYPE_Q8_0, 64, 1, 13, 333, 16);  /* 13 */
        check_shape(QTYPE_Q8_0, 128, 2, 7, 530, 16);  /* 14 */
        check_shape(QTYPE_Q8_0, 64, 3, 5, 77, 16);    /* 15 */
        check_shape(QTYPE_Q8_0, 64, 4, 4, 1500, 16);  /* 16 */
        check_shape(QTYPE_Q8_0, 64, 1, 17, 700, 16);  /* 16 + 1, two tiles */
        check_shape(QTYPE_Q8_0, 128, 3, 6, 1030, 16); /* 18 */
        check_shape(QTYPE_Q8_0, 64, 1, 19, 600, 16);  /* 16 + 3 */
        check_shape(QTYPE_Q8_0, 64, 3, 9, 1500, 16);  /* 27: a 9-token verify */
        check_shape(QTYPE_Q8_0, 64, 4, 17, 700, 16);  /* 64 + 4 */
        check_shape(QTYPE_Q8_0, 64, 3, 6, 700, 32);
        check_shape(QTYPE_Q8_0, 96, 3, 4, 300, 16);
        check_block_kernel_q8(64, 3, 3);
        check_block_kernel_q8(64, 3, 9);
        check_block_kernel_q8(64, 1, 13);
        check_block_kernel_q8(128, 3, 4);
        check_block_kernel_q8(128, 2, 7);
    }
    ellm_cpu_set_isa(ellm_cpu()->best);
    pool_release();
    return test_finish();
}
