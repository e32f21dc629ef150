/* Private to src/kernels: pieces shared by the AVX-512 batch ("quad")
 * kernels, q8_quads_avx512.c and kq16_quads_avx512.c. Both put 16 (weight
 * row, activation row) pairs in a vector, lane 4i + b for weight row i of a
 * group of 4 and activation row b of a quad (kernels_impl.h). */
#ifndef ELLM_KERNELS_QUADS_AVX512_H
#define ELLM_KERNELS_QUADS_AVX512_H

#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* 32 bytes at each of p, p + wrow, p + 2 wrow, p + 3 wrow as [row 0's
 * first 16, row 1's, row 2's, row 3's] (lo) and their last 16 (hi). */
INLINE void quads_load32x4(const char *p, size_t wrow, __m512i *lo, __m512i *hi) {
    __m512i z01 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                                     _mm256_loadu_si256((const __m256i *)(p + wrow)), 1);
    __m512i z23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2 * wrow))),
                                     _mm256_loadu_si256((const __m256i *)(p + 3 * wrow)), 1);
    *lo = _mm512_shuffle_i64x2(z01, z23, _MM_SHUFFLE(2, 0, 2, 0));
    *hi = _mm512_shuffle_i64x2(z01, z23, _MM_SHUFFLE(3, 1, 3, 1));
}

/* The lines of [p, p + bytes) towards L1, one prefetch every 64 bytes,
 * unrolled: as a plain loop, its counter and branch were ~30 of the ~650
 * instructions per block of a 4 x 4 pass of q8_quads_avx512.c. */
INLINE void quads_prefetch(const char *p, size_t bytes) {
#pragma GCC unroll 4
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

/* A pass's sums out[g * NQ + q] for weight rows r + 4g .. r + 4g + 3 and
 * activation rows 4 (q0 + q) .. + 3 (of nb) into Y: lane 4i + b to 4b + i,
 * each activation row's 4 outputs side by side, padding rows not stored. (A
 * macro: as an inline function it changed the code generated around it.) */
#define QUADS_STORE(out, r, q0, nb, Y, ldy, NG, NQ)                                                          \
    do {                                                                                                   \
        const __m512i tr_ = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);       \
        for (int g_ = 0; g_ < (NG); g_++)                                                                  \
            for (int q_ = 0; q_ < (NQ); q_++) {                                                            \
                __m512 t_ = _mm512_permutexvar_ps(tr_, (out)[g_ * (NQ) + q_]);                             \
                float *y_ = (Y) + (int64_t)(4 * ((q0) + q_)) * (ldy) + (r) + 4 * g_;                       \
                int n_ = (nb)-4 * ((q0) + q_);                                                             \
                _mm_storeu_ps(y_, _mm512_castps512_ps128(t_));                                             \
                if (n_ > 1) _mm_storeu_ps(y_ + (ldy), _mm512_extractf32x4_ps(t_, 1));                      \
                if (n_ > 2) _mm_storeu_ps(y_ + 2 * (ldy), _mm512_extractf32x4_ps(t_, 2));                  \
                if (n_ > 3) _mm_storeu_ps(y_ + 3 * (ldy), _mm512_extractf32x4_ps(t_, 3));                  \
            }                                                                                              \
    } while (0)

/* A pass of NG groups and nq quads (1-8, or 1-4 for SWITCH4; the largest
 * for more), RUN(NG, NQ) called with NQ a constant, so each shape is its own
 * instantiation. */
#define QUADS_SWITCH4(nq, RUN, NG)                                                                         \
    switch (nq) {                                                                                          \
    case 1: RUN(NG, 1); break;                                                                             \
    case 2: RUN(NG, 2); break;                                                                             \
    case 3: RUN(NG, 3); break;                                                                             \
    default: RUN(NG, 4); break;                                                                            \
    }
#define QUADS_SWITCH8(nq, RUN, NG)                                                                         \
    switch (nq) {                                                                                          \
    case 1: RUN(NG, 1); break;                                                                             \
    case 2: RUN(NG, 2); break;                                                                             \
    case 3: RUN(NG, 3); break;                                                                             \
    case 4: RUN(NG, 4); break;                                                                             \
    case 5: RUN(NG, 5); break;                                                                             \
    case 6: RUN(NG, 6); break;                                                                             \
    case 7: RUN(NG, 7); break;                                                                             \
    default: RUN(NG, 8); break;                                                                            \
    }

#endif
