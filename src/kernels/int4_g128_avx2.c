/* INT4_G128 matmul, AVX2, with the arithmetic of matmul_int4_g128_ref
 * (kernels.c): exact integer dots per sub-block of 32, weighted by their
 * activation scales into one float per group, then two multiply-adds per
 * group into lane g % 16 of 16 float accumulators (here two vectors of 8:
 * groups 16c + 0..7 and 16c + 8..15), one 16-lane sum per output.
 *
 * Per group two 32-byte weight loads unpacked into four nibble vectors, one
 * per sub-block (elements 0-31, 32-63, 64-95, 96-127); maddubs (unsigned
 * 4-bit x signed 8-bit, no saturation: 2 * 15 * 127 < 2^15) and madd widen
 * each to 8 int32 partial sums. The partial sums of a sub-block over 8
 * groups meet by a hadd tree in 8 lanes (group order), exactly, and the
 * float work is one multiply and five multiply-adds per 8 groups. A group's
 * nibbles are decoded once per pass and applied to up to I4_ROWS
 * activation rows. */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>

enum { I4_ROWS = 8, I4_OCT = 8 };

/* Lane j = sum of the 8 lanes of v[j]. */
INLINE __m256i i4_hsum8(const __m256i v[8]) {
    __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    /* a: groups 0-3 of the low 128-bit halves, then of the high ones; b: 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* One sub-block's 8 int32 partial dots of nibbles w with activation bytes q. */
INLINE __m256i i4_dot(__m256i w, const int8_t *q) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i *)q)), _mm256_set1_epi16(1));
}

/* Rows [r0, r1) against activation rows a[0 .. nb) (nb <= I4_ROWS). */
INLINE void i4_rows(const void *W, int64_t ng, int64_t r0, int64_t r1, const act_row *a, int nb, float *Y,
                    int64_t ldy, const int NB1) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const size_t wrow = (size_t)ng * sizeof(block_int4_g128);
    if (NB1) nb = 1;
    kern_pf_start((const char *)W + (size_t)r0 * wrow);
    for (int64_t r = r0; r < r1; r++) {
        const block_int4_g128 *w = (const block_int4_g128 *)W + r * ng;
        __m256 acc[I4_ROWS][2];
        for (int b = 0; b < nb; b++) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
        for (int64_t g0 = 0; g0 < ng; g0 += I4_OCT) {
            const int n = ng - g0 < I4_OCT ? (int)(ng - g0) : I4_OCT;
            const int half = (int)((g0 / I4_OCT) & 1); /* lanes 0-7 or 8-15 of the reference's 16 */
            kern_pf_pages(w + g0, (size_t)n * sizeof(block_int4_g128));
            __m256i dots[I4_ROWS][4][I4_OCT];
            uint16_t dh[I4_OCT] = {0}, mh[I4_OCT] = {0};
            for (int j = 0; j < I4_OCT; j++) {
                if (j >= n) {
                    for (int b = 0; b < nb; b++)
                        for (int k = 0; k < 4; k++) dots[b][k][j] = _mm256_setzero_si256();
                    continue;
                }
                const block_int4_g128 *blk = w + g0 + j;
                dh[j] = blk->d;
                mh[j] = blk->m;
                __m256i r0v = _mm256_loadu_si256((const __m256i *)blk->qs);
                __m256i r1v = _mm256_loadu_si256((const __m256i *)(blk->qs + 32));
                __m256i wv[4] = {_mm256_and_si256(r0v, m4), _mm256_and_si256(r1v, m4),
                                 _mm256_and_si256(_mm256_srli_epi16(r0v, 4), m4),
                                 _mm256_and_si256(_mm256_srli_epi16(r1v, 4), m4)};
                for (int b = 0; b < nb; b++) {
                    const int8_t *q = a[b].qs + QK_G128 * (g0 + j);
                    for (int k = 0; k < 4; k++) dots[b][k][j] = i4_dot(wv[k], q + 32 * k);
                }
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
            const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh));
            const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes));
            for (int b = 0; b < nb; b++) {
                /* sub-block k's scales of these 8 groups; zero past the last group */
                const float *da = a[b].d + 64 * (g0 / 16) + 8 * half;
                __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(i4_hsum8(dots[b][0])), _mm256_loadu_ps(da));
                for (int k = 1; k < 4; k++)
                    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i4_hsum8(dots[b][k])), _mm256_loadu_ps(da + 16 * k), s);
                __m256 t = _mm256_fmadd_ps(s, dw, acc[b][half]);
                t = _mm256_fmadd_ps(_mm256_loadu_ps(a[b].gs + 16 * (g0 / 16) + 8 * half), mw, t);
                /* lanes without a group keep their value, as in the reference */
                acc[b][half] = n == I4_OCT ? t : _mm256_blendv_ps(acc[b][half], t, keep);
            }
        }
        for (int b = 0; b < nb; b++) {
            /* the reference's tree: (j, j+8), (j, j+4), (j, j+2), (0, 1) */
            __m256 v = _mm256_add_ps(acc[b][0], acc[b][1]);
            __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            x = _mm_add_ps(x, _mm_movehl_ps(x, x));
            x = _mm_add_ss(x, _mm_movehdup_ps(x));
            Y[(int64_t)b * ldy + r] = _mm_cvtss_f32(x);
        }
    }
}

void kern_matmul_int4_g128_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                                float *Y, int64_t ldy) {
    const int64_t ng = cols / QK_G128;
    for (int b0 = 0; b0 < nb; b0 += I4_ROWS) {
        int bn = nb - b0 < I4_ROWS ? nb - b0 : I4_ROWS;
        act_row a[I4_ROWS];
        for (int i = 0; i < bn; i++) a[i] = act_get_row(ACT_Q8G, act, cols, b0 + i);
        if (bn == 1) i4_rows(W, ng, r0, r1, a, 1, Y + (int64_t)b0 * ldy, ldy, 1);
        else i4_rows(W, ng, r0, r1, a, bn, Y + (int64_t)b0 * ldy, ldy, 0);
    }
}
