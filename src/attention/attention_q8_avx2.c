/* AVX2 attention block kernel for a Q8_0 KV cache (the arithmetic is defined
 * in attention_q8.c). A whole 16-key block that every row sees goes through
 * q8_rows16, rows in tiles of 3. Other blocks: the block's keys and values
 * converted to F32 scratch once for all its rows, then row by row, 16 keys
 * at a time. Either way, per 32-channel group the int8 query times the int8
 * keys summed in F32 -- exact, the products being integers and the sums
 * below 2^24, so the same value as the int32 dot product of the AVX-512
 * kernel -- then scaled into the scores; P*V by the integer definition of
 * attention_q8_impl.h.
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
 * the same bits, the quantized weights written as floats: the largest
 * weight's exponent from its bits (it is normal, >= ATTN_Q8_PV_MIN), the
 * weights scaled by a power of two and rounded to nearest even (the default
 * rounding, as lrintf), at most 255. */
static inline float pv_quant16(const float *w, float *qf) {
    const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
    const float mx = attn_hmax_avx2(_mm256_max_ps(w0, w1));
    if (!(mx >= ATTN_Q8_PV_MIN)) {
        memset(qf, 0, ATTN_Q8_PV_TILE * sizeof(float));
        return 0.0f;
    }
    uint32_t bits;
    memcpy(&bits, &mx, 4);
    const int e = (int)((bits >> 23) & 0xff) - 127; /* ilogbf(mx) */
    const __m256 up = _mm256_castsi256_ps(_mm256_set1_epi32((127 + 7 - e) << 23));
    const __m256i top = _mm256_set1_epi32(255);
    const __m256i v0 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(w0, up)), top);
    const __m256i v1 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(w1, up)), top);
    _mm256_storeu_ps(qf, _mm256_cvtepi32_ps(v0)); /* integers in [0, 255]: exact */
    _mm256_storeu_ps(qf + 8, _mm256_cvtepi32_ps(v1));
    const uint32_t down = (uint32_t)(127 + e - 7) << 23; /* ldexpf(1, e - 7) */
    float sc;
    memcpy(&sc, &down, 4);
    return sc;
}

/* Rows [r, r + NR) (NR <= 3) of a whole 16-key block (every row sees all 16
 * keys). I8: the block's int8 keys k (channel-major, 16 a channel) and
 * values v (token rows of head_dim) read in place, converted where they are
 * multiplied; else k and v are the block converted to floats (channel rows
 * of stride lds, token rows of stride hdp). vdf[g][j]: the values' scales.
 * The steps of the row-by-row path of attn_block_q8_avx2 with the same
 * operands, so the same bits, but each key and value vector feeds all NR
 * rows, and the query and the P*V weights are broadcast from floats instead
 * of converted from bytes one at a time. The group sums of integer products
 * are exact in F32 in any order. */
static inline __attribute__((always_inline)) void q8_rows16(attn_state *st, const void *k, const void *v,
                                                            const uint16_t *kd, const float *vdf, int r, const int NR,
                                                            const int I8) {
    const int hd = st->head_dim, hdp = st->hdp, lds = st->lds, ng = hd / 32;
    float qf[3][256]; /* the rows' int8 queries as floats (hd <= 256) */
#pragma GCC unroll 3
    for (int i = 0; i < NR; i++)
        for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(qf[i] + d, q8_cvt8(st->q8 + (size_t)(r + i) * hdp + d));
    __m256 sc[3][2];
#pragma GCC unroll 3
    for (int i = 0; i < NR; i++) sc[i][0] = sc[i][1] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m256 f[3][2];
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) f[i][0] = f[i][1] = _mm256_setzero_ps();
        for (int c = 32 * g; c < 32 * g + 32; c++) {
            const __m256 k0 = I8 ? q8_cvt8((const int8_t *)k + (size_t)c * 16) : _mm256_loadu_ps((const float *)k + (size_t)c * lds);
            const __m256 k1 = I8 ? q8_cvt8((const int8_t *)k + (size_t)c * 16 + 8)
                                 : _mm256_loadu_ps((const float *)k + (size_t)c * lds + 8);
#pragma GCC unroll 3
            for (int i = 0; i < NR; i++) {
                const __m256 qb = _mm256_broadcast_ss(qf[i] + c);
                f[i][0] = _mm256_fmadd_ps(qb, k0, f[i][0]);
                f[i][1] = _mm256_fmadd_ps(qb, k1, f[i][1]);
            }
        }
        const __m256 kd0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + (size_t)g * 16)));
        const __m256 kd1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + (size_t)g * 16 + 8)));
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) {
            const __m256 qs = _mm256_set1_ps(st->qd[(size_t)(r + i) * ng + g]);
            sc[i][0] = _mm256_fmadd_ps(f[i][0], _mm256_mul_ps(kd0, qs), sc[i][0]);
            sc[i][1] = _mm256_fmadd_ps(f[i][1], _mm256_mul_ps(kd1, qs), sc[i][1]);
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
        float wq[3][ATTN_Q8_PV_TILE], vs[3];
        int any = 0;
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) {
            const float *si = s + (size_t)i * lds;
            float w[ATTN_Q8_PV_TILE];
            _mm256_storeu_ps(w, _mm256_mul_ps(_mm256_loadu_ps(si), _mm256_loadu_ps(vdf + (size_t)g * 16)));
            _mm256_storeu_ps(w + 8, _mm256_mul_ps(_mm256_loadu_ps(si + 8), _mm256_loadu_ps(vdf + (size_t)g * 16 + 8)));
            vs[i] = pv_quant16(w, wq[i]);
            any |= vs[i] != 0.0f;
        }
        if (!any) continue;
        __m256 I[3][4];
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) I[i][0] = I[i][1] = I[i][2] = I[i][3] = _mm256_setzero_ps();
        for (int j = 0; j < ATTN_Q8_PV_TILE; j++) {
            const size_t vo = I8 ? (size_t)j * hd + 32 * g : (size_t)j * hdp + 32 * g;
            __m256 wb[3];
#pragma GCC unroll 3
            for (int i = 0; i < NR; i++) wb[i] = _mm256_broadcast_ss(wq[i] + j);
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++) {
                const __m256 x = I8 ? q8_cvt8((const int8_t *)v + vo + 8 * e) : _mm256_loadu_ps((const float *)v + vo + 8 * e);
#pragma GCC unroll 3
                for (int i = 0; i < NR; i++) I[i][e] = _mm256_fmadd_ps(wb[i], x, I[i][e]);
            }
        }
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) {
            if (vs[i] == 0.0f) continue; /* the tile adds nothing to this row */
            const __m256 vsc = _mm256_set1_ps(vs[i]);
            float *a = st->acc + (size_t)(r + i) * hdp + 32 * g;
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++)
                _mm256_storeu_ps(a + 8 * e, _mm256_fmadd_ps(vsc, I[i][e], _mm256_loadu_ps(a + 8 * e)));
        }
    }
}

/* Every row of the part over a whole block, in tiles of 3, then 2 or 1. */
static void q8_whole_rows(attn_state *st, const void *k, const void *v, const uint16_t *kd, const float *vdf,
                          const int I8) {
    const int R = st->rows;
    int r = 0;
    for (; r + 3 <= R; r += 3) q8_rows16(st, k, v, kd, vdf, r, 3, I8);
    if (R - r == 2) q8_rows16(st, k, v, kd, vdf, r, 2, I8);
    else if (R - r == 1) q8_rows16(st, k, v, kd, vdf, r, 1, I8);
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
    if (b->next_k) prefetch_range_l1(b->next_k, 2 * kv_q8_half_bytes(hd, bt));
    if (b->ahead_k) prefetch_range_l2(b->ahead_k, 2 * kv_q8_half_bytes(hd, bt));
    /* A block every row sees whole: rows in tiles of 3 (q8_rows16). Up to 4
     * tiles read the int8 keys and values in place; more convert them once
     * into F32 scratch first (bench_attention_rows -t 2 --kv q8_0 at 16K,
     * 4 alternated rounds, in place against scratch: 1, 2, 4 query tokens
     * 1.49x, 1.25x, 1.17x; 9 tokens 0.93x). */
    const int whole = bt == 16 && nk == 16 && r0 == 0 && b->vis0 >= 16 && hd <= 256;
    float vdf[8 * 16]; /* vdf[g][j]: the values' scales by group */
    if (whole)
        for (int j = 0; j < 16; j++)
            for (int g = 0; g < ng; g++) vdf[g * 16 + j] = _cvtsh_ss(vd[(size_t)j * ng + g]);
    if (whole && R <= 12) {
        q8_whole_rows(st, k, v, kd, vdf, 1);
        return;
    }
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
    if (whole) {
        q8_whole_rows(st, kf, vf, kd, vdf, 0);
        return;
    }
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
