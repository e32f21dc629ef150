/* AVX2 attention block kernel for a Q8_0 KV cache (the arithmetic is defined
 * in attention_q8.c). A whole 16-key block that every row sees goes through
 * q8_rows16_int, rows in tiles of 3: the int8 keys and values read in place
 * and multiplied with vpmaddwd (int16 pairs into exact int32 sums). Other
 * blocks (a part's last, the diagonal of a prompt chunk): the block's keys
 * and values converted to F32 scratch once for all its rows, then row by
 * row, 16 keys at a time, the int8 products summed in F32 -- exact, the
 * products being integers and the sums below 2^24. Both give the same value
 * as the int32 dot products of the AVX-512 kernel, then scale it into the
 * scores; P*V by the integer definition of attention_q8_impl.h.
 * Blocks of fewer than 8 tokens go to the scalar kernel. */
#include "attention/attention_kernel.h"
#include "attention/attention_q8_impl.h"
#include "core/fp16.h"
#include "core/prefetch.h"

#include "attention/softmax_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* 8 int8 at p as floats. */
static inline __m256 q8_cvt8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* attn_q8_pv_quant_ref for a full tile of ATTN_Q8_PV_TILE (16) weights, with
 * the same bits: the quantized weights 0-7 in v[0] and 8-15 in v[1] as int32,
 * the tile's scale returned (0, and v zero, when the tile adds nothing). The
 * largest weight's exponent comes from its bits (it is normal, >=
 * ATTN_Q8_PV_MIN); the weights scaled by a power of two and rounded to
 * nearest even (the default rounding, as lrintf), at most 255. */
static inline float pv_quant16_i32(const float *w, __m256i v[2]) {
    const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
    const float mx = attn_hmax_avx2(_mm256_max_ps(w0, w1));
    if (!(mx >= ATTN_Q8_PV_MIN)) {
        v[0] = v[1] = _mm256_setzero_si256();
        return 0.0f;
    }
    uint32_t bits;
    memcpy(&bits, &mx, 4);
    const int e = (int)((bits >> 23) & 0xff) - 127; /* ilogbf(mx) */
    const __m256 up = _mm256_castsi256_ps(_mm256_set1_epi32((127 + 7 - e) << 23));
    const __m256i top = _mm256_set1_epi32(255);
    v[0] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(w0, up)), top);
    v[1] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(w1, up)), top);
    const uint32_t down = (uint32_t)(127 + e - 7) << 23; /* ldexpf(1, e - 7) */
    float sc;
    memcpy(&sc, &down, 4);
    return sc;
}

/* pv_quant16_i32 with the weights written as floats (integers in [0, 255]: exact). */
static inline float pv_quant16(const float *w, float *qf) {
    __m256i v[2];
    const float sc = pv_quant16_i32(w, v);
    _mm256_storeu_ps(qf, _mm256_cvtepi32_ps(v[0]));
    _mm256_storeu_ps(qf + 8, _mm256_cvtepi32_ps(v[1]));
    return sc;
}

/* pv_quant16_i32 with the weights written as int16 (for vpmaddwd). */
static inline float pv_quant16_i16(const float *w, int16_t *q) {
    __m256i v[2];
    const float sc = pv_quant16_i32(w, v);
    /* packs works per 128-bit lane: weights 0-3, 8-11 | 4-7, 12-15 back in order */
    _mm256_storeu_si256((__m256i *)q, _mm256_permute4x64_epi64(_mm256_packs_epi32(v[0], v[1]), 0xD8));
    return sc;
}

/* Two int8 rows' 16 bytes a, b interleaved (a0 b0 a1 b1 ...) and widened:
 * lo holds the int16 pairs of elements 0..7, hi of 8..15. */
static inline __attribute__((always_inline)) void q8_pairs16(__m128i a, __m128i b, __m256i *lo, __m256i *hi) {
    *lo = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
    *hi = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b));
}

static inline __m128i q8_load16(const int8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

/* 32-bit broadcast of the int16 pair at p. */
static inline __m256i q8_bcast_pair(const int16_t *p) {
    int32_t x;
    memcpy(&x, p, 4);
    return _mm256_set1_epi32(x);
}

/* Rows [r, r + NR) (NR <= 3) of a whole 16-key block (every row sees all 16
 * keys; vdf[g][j]: the values' scales), the int8 keys and values read in
 * place and multiplied as integers: vpmaddwd of channel pairs (k[c][j],
 * k[c + 1][j]), widened to int16, against the query's pair (q[c], q[c + 1])
 * gives key j's two products in one int32 lane, summed over the group's 16
 * pairs; P*V likewise over key pairs (v[j][d], v[j + 1][d]) against the u8
 * weights' pair. The same integer sums as the row-by-row F32 path of
 * attn_block_q8_avx2 (exact in both), then the same conversions and fused
 * multiply-adds, so the same bits; with half the multiply instructions of
 * F32 and no int8-to-F32 conversions. The next block's
 * lines (into L1) and the block ahead's (towards L2) are prefetched one per
 * step of the score and P*V loops (PF: the first tile of rows only). */
static inline __attribute__((always_inline)) void q8_rows16_int(attn_state *st, const int8_t *k, const int8_t *v,
                                                                const uint16_t *kd, const float *vdf, int r,
                                                                const char *pn, const char *pa, const int NR,
                                                                const int PF, const int HD) {
    const int hd = HD ? HD : st->head_dim, hdp = st->hdp, lds = st->lds, ng = hd / 32;
    if (PF) { /* the lines the loops' hd / 2 steps each do not reach */
        const size_t rest = 2 * kv_q8_half_bytes(hd, 16) - (size_t)hd / 2 * 64;
        prefetch_range_l1(pn + (size_t)hd / 2 * 64, rest);
        prefetch_range_l2(pa + (size_t)hd / 2 * 64, rest);
    }
    int16_t q16[3][256] __attribute__((aligned(32))); /* the rows' int8 queries as int16 (hd <= 256) */
#pragma GCC unroll 3
    for (int i = 0; i < NR; i++)
        for (int d = 0; d < hd; d += 16)
            _mm256_store_si256((__m256i *)(q16[i] + d),
                               _mm256_cvtepi8_epi16(q8_load16(st->q8 + (size_t)(r + i) * hdp + d)));
    __m256 sc[3][2];
#pragma GCC unroll 3
    for (int i = 0; i < NR; i++) sc[i][0] = sc[i][1] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m256i f[3][2];
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) f[i][0] = f[i][1] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int c = 32 * g; c < 32 * g + 32; c += 2) {
            if (PF) {
                __builtin_prefetch(pn, 0, 3);
                pn += 64;
            }
            __m256i k0, k1;
            q8_pairs16(q8_load16(k + (size_t)c * 16), q8_load16(k + (size_t)c * 16 + 16), &k0, &k1);
#pragma GCC unroll 3
            for (int i = 0; i < NR; i++) {
                const __m256i qb = q8_bcast_pair(q16[i] + c);
                f[i][0] = _mm256_add_epi32(f[i][0], _mm256_madd_epi16(k0, qb));
                f[i][1] = _mm256_add_epi32(f[i][1], _mm256_madd_epi16(k1, qb));
            }
        }
        const __m256 kd0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + (size_t)g * 16)));
        const __m256 kd1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + (size_t)g * 16 + 8)));
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) {
            const __m256 qs = _mm256_set1_ps(st->qd[(size_t)(r + i) * ng + g]);
            sc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(f[i][0]), _mm256_mul_ps(kd0, qs), sc[i][0]);
            sc[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(f[i][1]), _mm256_mul_ps(kd1, qs), sc[i][1]);
        }
    }
    float *s = st->s + (size_t)r * lds;
#pragma GCC unroll 3
    for (int i = 0; i < NR; i++) {
        _mm256_storeu_ps(s + (size_t)i * lds, sc[i][0]);
        _mm256_storeu_ps(s + (size_t)i * lds + 8, sc[i][1]);
    }
    float alpha[3];
    attn_softmax_rows16_avx2(s, lds, NR, st->m + r, st->l + r, alpha);
#pragma GCC unroll 3
    for (int i = 0; i < NR; i++) attn_rescale_avx2(st->acc + (size_t)(r + i) * hdp, hd, alpha[i]);
    for (int g = 0; g < ng; g++) {
        int16_t wq[3][ATTN_Q8_PV_TILE] __attribute__((aligned(32)));
        float vs[3];
        int any = 0;
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) {
            const float *si = s + (size_t)i * lds;
            float w[ATTN_Q8_PV_TILE];
            _mm256_storeu_ps(w, _mm256_mul_ps(_mm256_loadu_ps(si), _mm256_loadu_ps(vdf + (size_t)g * 16)));
            _mm256_storeu_ps(w + 8, _mm256_mul_ps(_mm256_loadu_ps(si + 8), _mm256_loadu_ps(vdf + (size_t)g * 16 + 8)));
            vs[i] = pv_quant16_i16(w, wq[i]);
            any |= vs[i] != 0.0f;
        }
        if (!any) continue;
        /* 16 dims at a time: 2 x NR accumulators */
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i I[3][2];
#pragma GCC unroll 3
            for (int i = 0; i < NR; i++) I[i][0] = I[i][1] = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int j = 0; j < ATTN_Q8_PV_TILE; j += 2) {
                if (PF) {
                    __builtin_prefetch(pa, 0, 2);
                    pa += 64;
                }
                const int8_t *vr = v + (size_t)j * hd + 32 * g + 16 * h;
                __m256i x0, x1;
                q8_pairs16(q8_load16(vr), q8_load16(vr + hd), &x0, &x1);
#pragma GCC unroll 3
                for (int i = 0; i < NR; i++) {
                    const __m256i wb = q8_bcast_pair(wq[i] + j);
                    I[i][0] = _mm256_add_epi32(I[i][0], _mm256_madd_epi16(x0, wb));
                    I[i][1] = _mm256_add_epi32(I[i][1], _mm256_madd_epi16(x1, wb));
                }
            }
#pragma GCC unroll 3
            for (int i = 0; i < NR; i++) {
                if (vs[i] == 0.0f) continue; /* the tile adds nothing to this row */
                const __m256 vsc = _mm256_set1_ps(vs[i]);
                float *a = st->acc + (size_t)(r + i) * hdp + 32 * g + 16 * h;
                _mm256_storeu_ps(a, _mm256_fmadd_ps(vsc, _mm256_cvtepi32_ps(I[i][0]), _mm256_loadu_ps(a)));
                _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(vsc, _mm256_cvtepi32_ps(I[i][1]), _mm256_loadu_ps(a + 8)));
            }
        }
    }
}

/* q8_rows16_int for rows [r, r + n), n <= 3 (NR as a constant). */
static inline __attribute__((always_inline)) void q8_int_tile(attn_state *st, const int8_t *k, const int8_t *v,
                                                              const uint16_t *kd, const float *vdf, int r, int n,
                                                              const char *pn, const char *pa, const int PF,
                                                              const int HD) {
    if (n == 3) q8_rows16_int(st, k, v, kd, vdf, r, pn, pa, 3, PF, HD);
    else if (n == 2) q8_rows16_int(st, k, v, kd, vdf, r, pn, pa, 2, PF, HD);
    else q8_rows16_int(st, k, v, kd, vdf, r, pn, pa, 1, PF, HD);
}

/* Every row of the part, in tiles of 3 (the last one 1 or 2), the first
 * tile prefetching (HD: a constant head_dim, or 0). */
static inline __attribute__((always_inline)) void q8_int_rows(attn_state *st, const int8_t *k, const int8_t *v,
                                                              const uint16_t *kd, const float *vdf, const char *pn,
                                                              const char *pa, const int HD) {
    const int R = st->rows;
    q8_int_tile(st, k, v, kd, vdf, 0, R < 3 ? R : 3, pn, pa, 1, HD);
    for (int r = 3; r < R; r += 3) q8_int_tile(st, k, v, kd, vdf, r, R - r < 3 ? R - r : 3, pn, pa, 0, HD);
}

/* Every row of the part over a whole block: the next block's lines (into
 * L1) and the block ahead's (towards L2) spread over the first tile's loops. */
static void q8_whole_rows(attn_state *st, const attn_block *b, const uint16_t *kd, const float *vdf) {
    const char *pn = b->next_k ? b->next_k : b->k, *pa = b->ahead_k ? b->ahead_k : b->k;
    if (st->head_dim == 64) q8_int_rows(st, b->k, b->v, kd, vdf, pn, pa, 64);
    else q8_int_rows(st, b->k, b->v, kd, vdf, pn, pa, 0);
}

/* A 16-token block's value scales vd[j][g] (F16, ng per token) as floats
 * vdf[g][j]. */
static void q8_value_scales16(const uint16_t *vd, int ng, float *vdf) {
    if (ng == 2) { /* head_dim 64: (j0 g0, j0 g1, j1 g0, ...) de-interleaved */
        for (int h = 0; h < 2; h++) {
            const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vd + 16 * h)));
            const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vd + 16 * h + 8)));
            /* per 128-bit lane: a's and b's even (odd) floats, tokens 8h + (0 1 4 5 | 2 3 6 7) */
            const __m256d g0 = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88));
            const __m256d g1 = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD));
            _mm256_storeu_ps(vdf + 8 * h, _mm256_castpd_ps(_mm256_permute4x64_pd(g0, 0xD8)));
            _mm256_storeu_ps(vdf + 16 + 8 * h, _mm256_castpd_ps(_mm256_permute4x64_pd(g1, 0xD8)));
        }
        return;
    }
    float t[8 * 16];
    for (int i = 0; i < 16 * ng; i += 8) _mm256_storeu_ps(t + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vd + i))));
    for (int j = 0; j < 16; j++)
        for (int g = 0; g < ng; g++) vdf[g * 16 + j] = t[j * ng + g];
}

void attn_block_q8_avx2(attn_state *st, const attn_block *b) {
    const int G = st->group, R = st->rows, hd = st->head_dim, hdp = st->hdp, bt = st->block_tokens, ng = hd / 32,
              lds = st->lds;
    if (bt < 8) {
        attn_block_q8_scalar(st, b);
        return;
    }
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * G; /* first row that sees a key */
    if (r0 >= R) return;
    int nk = b->vis0 + (R - 1) / G; /* keys the last row sees */
    if (nk > b->n_valid) nk = b->n_valid;
    const int8_t *k = b->k, *v = b->v;
    const uint16_t *kd = (const uint16_t *)(k + (size_t)hd * bt), *vd = (const uint16_t *)(v + (size_t)hd * bt);
    /* A block every row sees whole: the integer path (q8_rows16_int), rows in
     * tiles of 3, at any row count (bench_attention_rows -t 1 --kv q8_0, in
     * cache, 3 alternated rounds: 5, 9 and 16 query tokens of 3 rows each at
     * 111, 110 and 92 ns a row-block against 116, 110 and 113 through F32
     * scratch, medians). */
    if (bt == 16 && nk == 16 && r0 == 0 && b->vis0 >= 16 && hd <= 256) {
        float vdf[8 * 16]; /* vdf[g][j]: the values' scales by group */
        q8_value_scales16(vd, ng, vdf);
        q8_whole_rows(st, b, kd, vdf);
        return;
    }
    if (b->next_k) prefetch_range_l1(b->next_k, 2 * kv_q8_half_bytes(hd, bt));
    if (b->ahead_k) prefetch_range_l2(b->ahead_k, 2 * kv_q8_half_bytes(hd, bt));
    /* The block's keys (channel-major, row stride lds) and values (token
     * rows, stride hdp) as floats, converted once for all rows of the part:
     * keys [0, nk rounded up to 8), every channel row holding them (bt >= 8
     * and a multiple of 8; lds >= bt). */
    const int nk8 = (nk + 7) & ~7;
    float *kf = st->kbuf, *vf = st->vbuf;
    for (int c = 0; c < hd; c++)
        for (int j0 = 0; j0 < nk8; j0 += 8) _mm256_storeu_ps(kf + (size_t)c * lds + j0, q8_cvt8(k + (size_t)c * bt + j0));
    for (int j = 0; j < nk; j++)
        for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(vf + (size_t)j * hdp + d, q8_cvt8(v + (size_t)j * hd + d));
    for (int r = r0; r < R; r++) {
        int nv = b->vis0 + r / G;
        if (nv > nk) nv = nk;
        const int8_t *q8 = st->q8 + (size_t)r * hdp;
        const float *qd = st->qd + (size_t)r * ng;
        float *s = st->s + (size_t)r * lds;
        /* keys [j0, j0 + 16) (the second 8 only where the row sees some of
         * them): per 32-channel group the int8 query times the keys summed in
         * two chains (even and odd channels) per 8 keys, then scaled into the
         * scores; keys past nv are computed and dropped */
        for (int j0 = 0; j0 < nv; j0 += 16) {
            const int two = j0 + 8 < nv;
            __m256 sa = _mm256_setzero_ps(), sb = _mm256_setzero_ps();
            for (int g = 0; g < ng; g++) {
                __m256 f0a = _mm256_setzero_ps(), f1a = f0a, f0b = f0a, f1b = f0a;
                for (int c = 32 * g; c < 32 * g + 32; c += 2) {
                    const __m256 q0 = _mm256_set1_ps((float)q8[c]), q1 = _mm256_set1_ps((float)q8[c + 1]);
                    const float *k0 = kf + (size_t)c * lds + j0, *k1 = k0 + lds;
                    f0a = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k0), f0a);
                    f1a = _mm256_fmadd_ps(q1, _mm256_loadu_ps(k1), f1a);
                    if (two) {
                        f0b = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k0 + 8), f0b);
                        f1b = _mm256_fmadd_ps(q1, _mm256_loadu_ps(k1 + 8), f1b);
                    }
                }
                const __m256 qs = _mm256_set1_ps(qd[g]);
                const uint16_t *kdg = kd + (size_t)g * bt + j0;
                sa = _mm256_fmadd_ps(_mm256_add_ps(f0a, f1a),
                                     _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)kdg)), qs), sa);
                if (two)
                    sb = _mm256_fmadd_ps(_mm256_add_ps(f0b, f1b),
                                         _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kdg + 8))), qs),
                                         sb);
            }
            float t[16];
            _mm256_storeu_ps(t, sa);
            _mm256_storeu_ps(t + 8, sb);
            memcpy(s + j0, t, (size_t)(nv - j0 < 16 ? nv - j0 : 16) * sizeof(float));
        }
        const float alpha = attn_softmax_row_avx2(s, nv, nk, &st->m[r], &st->l[r]);
        float *acc = st->acc + (size_t)r * hdp;
        attn_rescale_avx2(acc, hd, alpha);
        /* integer P*V (attention_q8_impl.h): per tile of 16 keys and group,
         * the u8 weights times the values summed in F32 -- exact, the
         * products being integers and the sums below 2^24 -- then scaled */
        for (int j0 = 0; j0 < nv; j0 += ATTN_Q8_PV_TILE) {
            const int n = nv - j0 < ATTN_Q8_PV_TILE ? nv - j0 : ATTN_Q8_PV_TILE;
            for (int g = 0; g < ng; g++) {
                float w[ATTN_Q8_PV_TILE], qf[ATTN_Q8_PV_TILE];
                for (int j = 0; j < n; j++) w[j] = s[j0 + j] * _cvtsh_ss(vd[(size_t)(j0 + j) * ng + g]);
                float sc;
                if (n == ATTN_Q8_PV_TILE) {
                    sc = pv_quant16(w, qf);
                } else {
                    uint8_t q[ATTN_Q8_PV_TILE];
                    sc = attn_q8_pv_quant_ref(w, n, q);
                    for (int j = 0; j < n; j++) qf[j] = q[j];
                }
                if (sc == 0.0f) continue; /* fma(0, 0, acc) = acc: acc is never -0 */
                __m256 i0 = _mm256_setzero_ps(), i1 = i0, i2 = i0, i3 = i0;
                for (int j = 0; j < n; j++) {
                    const __m256 qj = _mm256_broadcast_ss(qf + j);
                    const float *vr = vf + (size_t)(j0 + j) * hdp + 32 * g;
                    i0 = _mm256_fmadd_ps(qj, _mm256_loadu_ps(vr), i0);
                    i1 = _mm256_fmadd_ps(qj, _mm256_loadu_ps(vr + 8), i1);
                    i2 = _mm256_fmadd_ps(qj, _mm256_loadu_ps(vr + 16), i2);
                    i3 = _mm256_fmadd_ps(qj, _mm256_loadu_ps(vr + 24), i3);
                }
                const __m256 vs = _mm256_set1_ps(sc);
                float *a = acc + 32 * g;
                _mm256_storeu_ps(a, _mm256_fmadd_ps(vs, i0, _mm256_loadu_ps(a)));
                _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(vs, i1, _mm256_loadu_ps(a + 8)));
                _mm256_storeu_ps(a + 16, _mm256_fmadd_ps(vs, i2, _mm256_loadu_ps(a + 16)));
                _mm256_storeu_ps(a + 24, _mm256_fmadd_ps(vs, i3, _mm256_loadu_ps(a + 24)));
            }
        }
    }
}
