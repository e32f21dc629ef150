/* AVX2 + FMA + F16C kernels of the sparse index (compiled with the AVX2 flags;
 * only called when ellm_cpu_isa() says the CPU has them). Same results, bit
 * for bit, as the scalar references in sparse_index.c.
 *
 * Scoring: a tile's 16 entries are done as two halves of 8 (one ymm per
 * channel), with up to 4 query rows per pass so the 2 accumulators per row,
 * the channel and the broadcasts fit in the 16 ymm registers. */
#include "attention/sparse_index_internal.h"
#include "core/fp16.h"

#include <immintrin.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Entries [half * 8, half * 8 + 8) of one tile against R rows (R <= 4).
 * Prefetches the hd cache lines of the tile at pf, one per channel step. */
static ALWAYS_INLINE void score_half(const uint16_t *lo, int hd, const float *qpn, int R,
                                     float *out, const char *pf) {
    const uint16_t *hi = lo + (size_t)hd * SPARSE_LANES;
    __m256 sp[4], sn[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sp[r] = sn[r] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c++) {
        _mm_prefetch(pf + (size_t)c * 64, _MM_HINT_T0);
        __m256 l = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(lo + c * SPARSE_LANES)));
        __m256 h = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hi + c * SPARSE_LANES)));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const float *qp = qpn + (size_t)r * 2 * hd;
            sp[r] = _mm256_fmadd_ps(_mm256_set1_ps(qp[c]), h, sp[r]);
            sn[r] = _mm256_fmadd_ps(_mm256_set1_ps(qp[hd + c]), l, sn[r]);
        }
    }
    __m256 best = _mm256_loadu_ps(out);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        best = _mm256_max_ps(_mm256_add_ps(sp[r], sn[r]), best); /* as the reference */
    _mm256_storeu_ps(out, best);
}

#define SCORE_R(R)                                                                        \
    static void score_r##R(const uint16_t *tiles, int n_tiles, int hd, const float *qpn,   \
                           float *out, const uint16_t *next) {                            \
        const size_t te = (size_t)2 * hd * SPARSE_LANES;                                  \
        for (int t = 0; t < n_tiles; t++) {                                               \
            const uint16_t *pf = t + 1 < n_tiles ? tiles + (t + 1) * te                   \
                                 : next          ? next                                   \
                                                 : tiles + t * te;                        \
            for (int half = 0; half < 2; half++)                                          \
                score_half(tiles + t * te + half * 8, hd, qpn, R,                         \
                           out + t * SPARSE_LANES + half * 8, (const char *)pf);          \
        }                                                                                 \
    }
SCORE_R(1)
SCORE_R(2)
SCORE_R(3)
SCORE_R(4)

void sparse_score_avx2(const uint16_t *tiles, int n_tiles, int hd, const float *qpn, int rows,
                       float *out, const uint16_t *next) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const float *q = qpn + (size_t)r0 * 2 * hd;
        switch (rows - r0 < 4 ? rows - r0 : 4) {
        case 1: score_r1(tiles, n_tiles, hd, q, out, next); break;
        case 2: score_r2(tiles, n_tiles, hd, q, out, next); break;
        case 3: score_r3(tiles, n_tiles, hd, q, out, next); break;
        default: score_r4(tiles, n_tiles, hd, q, out, next); break;
        }
    }
}

void sparse_fold_avx2(const float *k, size_t stride, int n, int hd, int f16, float *lo, float *hi) {
    const int full = hd & ~7;
    for (int c = 0; c < full; c += 8) {
        __m256 l = _mm256_loadu_ps(lo + c), h = _mm256_loadu_ps(hi + c);
        for (int i = 0; i < n; i++) {
            __m256 x = _mm256_loadu_ps(k + (size_t)i * stride + c);
            if (f16)
                x = _mm256_cvtph_ps(
                    _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            l = _mm256_min_ps(x, l); /* x < l ? x : l */
            h = _mm256_max_ps(x, h);
        }
        _mm256_storeu_ps(lo + c, l);
        _mm256_storeu_ps(hi + c, h);
    }
    if (full < hd) sparse_fold_scalar(k + full, stride, n, hd - full, f16, lo + full, hi + full);
}

void sparse_round_avx2(const float *lo, const float *hi, int hd, uint16_t *lo16, uint16_t *hi16) {
    const __m256 mx = _mm256_set1_ps(SPARSE_F16_MAX), mn = _mm256_set1_ps(-SPARSE_F16_MAX);
    int c = 0;
    for (; c + 8 <= hd; c += 8) {
        /* max(x, -max) maps NaN to -max, as the reference. */
        __m256 l = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(lo + c), mn), mx);
        __m256 h = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(hi + c), mn), mx);
        _mm_storeu_si128((__m128i *)(lo16 + c),
                         _mm256_cvtps_ph(l, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
        _mm_storeu_si128((__m128i *)(hi16 + c),
                         _mm256_cvtps_ph(h, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
    }
    if (c < hd) sparse_round_scalar(lo + c, hi + c, hd - c, lo16 + c, hi16 + c);
}
