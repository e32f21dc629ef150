/* INT4_G128 matmul, AVX2: per group two 32-byte weight loads unpacked into
 * four nibble vectors (elements 0-31, 32-63, 64-95, 96-127) reused for every
 * activation row of the batch; maddubs (unsigned 4-bit x signed 8-bit, no
 * saturation: 2 * 15 * 127 < 2^15) summed in 16 bits (4 * 3810 < 2^15),
 * widened by madd, reduced exactly, then the reference's float arithmetic
 * per group, so results equal the scalar reference bit for bit. */
#include "kernels/kernels_impl.h"

#include <immintrin.h>

enum { I4_ROWS = 8 };

static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

void kern_matmul_int4_g128_avx2(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                                float *Y, int64_t ldy) {
    const int64_t ng = cols / QK_G128;
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int64_t r = r0; r < r1; r++) {
        const block_int4_g128 *w = (const block_int4_g128 *)W + r * ng;
        for (int b0 = 0; b0 < nb; b0 += I4_ROWS) {
            int bn = nb - b0 < I4_ROWS ? nb - b0 : I4_ROWS;
            act_row a[I4_ROWS];
            float s[I4_ROWS];
            for (int i = 0; i < bn; i++) {
                a[i] = act_get_row(ACT_Q8G, act, cols, b0 + i);
                s[i] = 0;
            }
            for (int64_t g = 0; g < ng; g++) {
                __m256i r0v = _mm256_loadu_si256((const __m256i *)w[g].qs);
                __m256i r1v = _mm256_loadu_si256((const __m256i *)(w[g].qs + 32));
                __m256i w0 = _mm256_and_si256(r0v, m4), w1 = _mm256_and_si256(r1v, m4);
                __m256i w2 = _mm256_and_si256(_mm256_srli_epi16(r0v, 4), m4);
                __m256i w3 = _mm256_and_si256(_mm256_srli_epi16(r1v, 4), m4);
                const float dw = ellm_f16_to_f32(w[g].d), mw = ellm_f16_to_f32(w[g].m);
                for (int i = 0; i < bn; i++) {
                    const int8_t *q = a[i].qs + QK_G128 * g;
                    __m256i p = _mm256_maddubs_epi16(w0, _mm256_loadu_si256((const __m256i *)q));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w1, _mm256_loadu_si256((const __m256i *)(q + 32))));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w2, _mm256_loadu_si256((const __m256i *)(q + 64))));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w3, _mm256_loadu_si256((const __m256i *)(q + 96))));
                    int dot = hsum_epi32(_mm256_madd_epi16(p, ones));
                    float da = a[i].d[g];
                    s[i] += (dw * da) * (float)dot;
                    s[i] += (mw * da) * (float)a[i].sa[g];
                }
            }
            for (int i = 0; i < bn; i++) Y[(int64_t)(b0 + i) * ldy + r] = s[i];
        }
    }
}
