/* The online-softmax step of the AVX2 block kernels (F16/F32 in
 * attention_avx2.c, Q8_0 in attention_q8_avx2.c): included only by files
 * compiled with the AVX2 flags. */
#ifndef ELLM_ATTENTION_SOFTMAX_AVX2_H
#define ELLM_ATTENTION_SOFTMAX_AVX2_H

#include "kernels/vec_exp.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline __attribute__((always_inline)) float attn_hmax_avx2(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline __attribute__((always_inline)) float attn_hadd_avx2(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* Online-softmax step for one row: s[0, nv) become exp(s - m_new), s[nv, nk)
 * become 0; returns exp(m_old - m_new), the rescale of the old acc and l. */
static inline __attribute__((always_inline)) float attn_softmax_row_avx2(float *s, int nv, int nk, float *m, float *l) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= nv; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
    float mx = attn_hmax_avx2(vm);
    for (; j < nv; j++) mx = s[j] > mx ? s[j] : mx;
    float m_new = mx > *m ? mx : *m;
    float alpha = m_new == *m ? 1.0f : expf(*m - m_new);
    const __m256 mn = _mm256_set1_ps(m_new);
    __m256 vs = _mm256_setzero_ps();
    for (j = 0; j + 8 <= nv; j += 8) {
        __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), mn));
        _mm256_storeu_ps(s + j, e);
        vs = _mm256_add_ps(vs, e);
    }
    if (j < nv) {
        float t[8] = {0};
        memcpy(t, s + j, (size_t)(nv - j) * sizeof(float));
        __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(t), mn));
        _mm256_storeu_ps(t, e);
        for (int i = nv - j; i < 8; i++) t[i] = 0.0f;
        memcpy(s + j, t, (size_t)(nv - j) * sizeof(float));
        vs = _mm256_add_ps(vs, _mm256_loadu_ps(t));
    }
    for (j = nv; j < nk; j++) s[j] = 0.0f;
    *m = m_new;
    *l = *l * alpha + attn_hadd_avx2(vs);
    return alpha;
}

/* acc[0, n) (n a multiple of 8) times a row's rescale alpha, when the
 * row's maximum grew (alpha != 1). */
static inline __attribute__((always_inline)) void attn_rescale_avx2(float *acc, int n, float alpha) {
    if (alpha == 1.0f) return;
    const __m256 va = _mm256_set1_ps(alpha);
    for (int d = 0; d < n; d += 8) _mm256_storeu_ps(acc + d, _mm256_mul_ps(va, _mm256_loadu_ps(acc + d)));
}

/* The step above for NR (<= 4) rows that each see all 16 keys of a block
 * (rows lds apart), with the same operations in the same order per row, so
 * the same bits; alpha[r] gets row r's rescale. The rows go through each
 * phase together (maxima, then the rescales, then the exponentials and sums):
 * one row alone is a chain of dependent steps (max, horizontal max, exp, sum)
 * that left the core waiting on latency for a third of a decode step's block
 * time. */
static inline __attribute__((always_inline)) void attn_softmax_rows16_avx2(float *s, int lds, const int NR,
                                                                          float *m, float *l,
                                                                          float *alpha) {
    float m_new[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        const float *sr = s + (size_t)r * lds;
        const __m256 vm = _mm256_max_ps(_mm256_max_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(sr)),
                                        _mm256_loadu_ps(sr + 8));
        const float mx = attn_hmax_avx2(vm);
        m_new[r] = mx > m[r] ? mx : m[r];
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) alpha[r] = m_new[r] == m[r] ? 1.0f : expf(m[r] - m_new[r]);
    __m256 vs[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        float *sr = s + (size_t)r * lds;
        const __m256 mn = _mm256_set1_ps(m_new[r]);
        const __m256 e0 = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sr), mn));
        const __m256 e1 = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sr + 8), mn));
        _mm256_storeu_ps(sr, e0);
        _mm256_storeu_ps(sr + 8, e1);
        vs[r] = _mm256_add_ps(_mm256_add_ps(_mm256_setzero_ps(), e0), e1);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        m[r] = m_new[r];
        l[r] = l[r] * alpha[r] + attn_hadd_avx2(vs[r]);
    }
}

#endif
