/* AVX2 widening of Q8_0 KV blocks to F32 (see attention_q8.c), 8 lanes at a
 * time; block_tokens is a power of two, so below 8 the scalar reference runs. */
#include "attention/attention_internal.h"

#include <immintrin.h>

void attn_q8_widen_k_avx2(float *dst, const int8_t *k, const uint16_t *kd, int hd, int bt) {
    if (bt < 8) {
        attn_q8_widen_k_scalar(dst, k, kd, hd, bt);
        return;
    }
    for (int j = 0; j < bt; j += 8)
        for (int g = 0; g < hd / 32; g++) {
            const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + (size_t)g * bt + j)));
            for (int c = g * 32; c < g * 32 + 32; c++) {
                __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(k + (size_t)c * bt + j)));
                _mm256_storeu_ps(dst + (size_t)c * bt + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s));
            }
        }
}

void attn_q8_widen_v_avx2(float *dst, const int8_t *v, const uint16_t *vd, int n, int hd) {
    const int G = hd / 32;
    for (int j = 0; j < n; j++)
        for (int g = 0; g < G; g++) {
            const __m256 s = _mm256_cvtph_ps(_mm_set1_epi16((short)vd[(size_t)j * G + g]));
            const int8_t *src = v + (size_t)j * hd + g * 32;
            float *d = dst + (size_t)j * hd + g * 32;
            for (int i = 0; i < 32; i += 8) {
                __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
                _mm256_storeu_ps(d + i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s));
            }
        }
}
