/* AVX-512 kernels of the sparse index (compiled with the AVX-512 flags; only
 * called when ellm_cpu_isa() says the CPU has them). Same results, bit for
 * bit, as the scalar references in sparse_index.c.
 *
 * Scoring: one zmm holds one channel of a tile's 16 entries (converted from
 * half with vcvtph2ps); each query row keeps two accumulators (the qp*hi and
 * qn*lo chains) and takes its q values as broadcasts, so a tile costs
 * 2 conversions + 2 * rows FMAs per channel and no horizontal reduction. */
#include "attention/sparse_index_internal.h"
#include "core/fp16.h"

#include <immintrin.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* One tile against R rows (R a constant after inlining, so the accumulators
 * stay in registers); max-accumulates into out[0..16). Prefetches the hd cache
 * lines of the tile at pf, one per channel step. */
static ALWAYS_INLINE void score_tile(const uint16_t *lo, int hd, const float *qpn, int R,
                                     float *out, const char *pf) {
    const uint16_t *hi = lo + (size_t)hd * SPARSE_LANES;
    __m512 sp[SPARSE_ROWS], sn[SPARSE_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sp[r] = sn[r] = _mm512_setzero_ps();
    for (int c = 0; c < hd; c++) {
        _mm_prefetch(pf + (size_t)c * 64, _MM_HINT_T0);
        __m512 l = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(lo + c * SPARSE_LANES)));
        __m512 h = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(hi + c * SPARSE_LANES)));
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            const float *qp = qpn + (size_t)r * 2 * hd;
            sp[r] = _mm512_fmadd_ps(_mm512_set1_ps(qp[c]), h, sp[r]);
            sn[r] = _mm512_fmadd_ps(_mm512_set1_ps(qp[hd + c]), l, sn[r]);
        }
    }
    __m512 best = _mm512_loadu_ps(out);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        __m512 b = _mm512_add_ps(sp[r], sn[r]);
        best = _mm512_max_ps(b, best); /* b > best ? b : best, as the reference */
    }
    _mm512_storeu_ps(out, best);
}

#define SCORE_R(R)                                                                        \
    static void score_r##R(const uint16_t *tiles, int n_tiles, int hd, const float *qpn,   \
                           float *out, const uint16_t *next) {                            \
        const size_t te = (size_t)2 * hd * SPARSE_LANES;                                  \
        for (int t = 0; t < n_tiles; t++) {                                               \
            const uint16_t *pf = t + 1 < n_tiles ? tiles + (t + 1) * te                   \
                                 : next          ? next                                   \
                                                 : tiles + t * te;                        \
            score_tile(tiles + t * te, hd, qpn, R, out + t * SPARSE_LANES,                \
                       (const char *)pf);                                                 \
        }                                                                                 \
    }
SCORE_R(1)
SCORE_R(2)
SCORE_R(3)
SCORE_R(4)
SCORE_R(5)
SCORE_R(6)
SCORE_R(7)
SCORE_R(8)

void sparse_score_avx512(const uint16_t *tiles, int n_tiles, int hd, const float *qpn, int rows,
                         float *out, const uint16_t *next) {
    switch (rows) {
    case 1: score_r1(tiles, n_tiles, hd, qpn, out, next); break;
    case 2: score_r2(tiles, n_tiles, hd, qpn, out, next); break;
    case 3: score_r3(tiles, n_tiles, hd, qpn, out, next); break;
    case 4: score_r4(tiles, n_tiles, hd, qpn, out, next); break;
    case 5: score_r5(tiles, n_tiles, hd, qpn, out, next); break;
    case 6: score_r6(tiles, n_tiles, hd, qpn, out, next); break;
    case 7: score_r7(tiles, n_tiles, hd, qpn, out, next); break;
    default: score_r8(tiles, n_tiles, hd, qpn, out, next); break;
    }
}

void sparse_fold_avx512(const float *k, size_t stride, int n, int hd, int f16, float *lo,
                        float *hi) {
    const int full = hd & ~15;
    for (int c = 0; c < full; c += 16) {
        __m512 l = _mm512_loadu_ps(lo + c), h = _mm512_loadu_ps(hi + c);
        for (int i = 0; i < n; i++) {
            __m512 x = _mm512_loadu_ps(k + (size_t)i * stride + c);
            if (f16)
                x = _mm512_cvtph_ps(
                    _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            l = _mm512_min_ps(x, l); /* x < l ? x : l */
            h = _mm512_max_ps(x, h);
        }
        _mm512_storeu_ps(lo + c, l);
        _mm512_storeu_ps(hi + c, h);
    }
    if (full < hd) sparse_fold_scalar(k + full, stride, n, hd - full, f16, lo + full, hi + full);
}

void sparse_round_avx512(const float *lo, const float *hi, int hd, uint16_t *lo16, uint16_t *hi16) {
    const __m512 mx = _mm512_set1_ps(SPARSE_F16_MAX), mn = _mm512_set1_ps(-SPARSE_F16_MAX);
    int c = 0;
    for (; c + 16 <= hd; c += 16) {
        /* max(x, -max) maps NaN to -max, as the reference. */
        __m512 l = _mm512_min_ps(_mm512_max_ps(_mm512_loadu_ps(lo + c), mn), mx);
        __m512 h = _mm512_min_ps(_mm512_max_ps(_mm512_loadu_ps(hi + c), mn), mx);
        _mm256_storeu_si256((__m256i *)(lo16 + c),
                            _mm512_cvtps_ph(l, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
        _mm256_storeu_si256((__m256i *)(hi16 + c),
                            _mm512_cvtps_ph(h, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
    }
    if (c < hd) sparse_round_scalar(lo + c, hi + c, hd - c, lo16 + c, hi16 + c);
}
