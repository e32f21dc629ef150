/* AVX-512 widening of Q8_0 KV blocks to F32 (see attention_q8.c): 16 int8
 * keys of a channel (or 16 dims of a value) sign-extended, converted and
 * multiplied by their F16 scales in registers. */
#include "attention/attention_internal.h"

#include <immintrin.h>

void attn_q8_widen_k_avx512(float *dst, const int8_t *k, const uint16_t *kd, int hd, int bt) {
    for (int j = 0; j < bt; j += 16) {
        const __mmask16 m = bt - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (bt - j)) - 1);
        for (int g = 0; g < hd / 32; g++) {
            const __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, kd + (size_t)g * bt + j));
            for (int c = g * 32; c < g * 32 + 32; c++) {
                __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, k + (size_t)c * bt + j));
                _mm512_mask_storeu_ps(dst + (size_t)c * bt + j, m, _mm512_mul_ps(_mm512_cvtepi32_ps(q), s));
            }
        }
    }
}

void attn_q8_widen_v_avx512(float *dst, const int8_t *v, const uint16_t *vd, int n, int hd) {
    const int G = hd / 32;
    for (int j = 0; j < n; j++)
        for (int g = 0; g < G; g++) {
            const __m512 s = _mm512_cvtph_ps(_mm256_set1_epi16((short)vd[(size_t)j * G + g]));
            const int8_t *src = v + (size_t)j * hd + g * 32;
            float *d = dst + (size_t)j * hd + g * 32;
            __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)src));
            __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 16)));
            _mm512_storeu_ps(d, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), s));
            _mm512_storeu_ps(d + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), s));
        }
}
