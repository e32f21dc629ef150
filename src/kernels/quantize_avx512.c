/* AVX-512 weight quantizers: Q8_0 and Q4_0 blocks of 32, bit-identical to
 * quant.c's references (qtype_quantize_ref), which define the formats. They
 * serve `ellm convert`, where the scalar references bound the speed.
 *
 * Per block the references take the value of largest magnitude (for Q4_0 its
 * first occurrence, with its sign), derive the F16 scale from it in scalar
 * code, and round x * (1 / d) to nearest even; here the two 16-lane halves of
 * a block do the same multiply and the same rounding (vcvtps2dq under the
 * default MXCSR mode is lrintf's round-to-nearest-even). A block whose
 * largest magnitude is below 1e-30 takes the reference path: there 1 / d can
 * overflow, and the references' conversion of an infinite product differs
 * from the vector one. */
#include "kernels/kernels_impl.h"

#include "core/fp16.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define QZ_TINY 1e-30f

static inline float hmax16(__m512 v) { return _mm512_reduce_max_ps(v); }

void kern_quantize_q8_0_avx512(const float *x, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t k = 0; k < n / QK8_0; k++, x += QK8_0) {
        __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        float amax = hmax16(_mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
        if (amax < QZ_TINY) {
            qtype_quantize_ref(QTYPE_Q8_0, x, &b[k], QK8_0);
            continue;
        }
        float d = amax / 127.0f, id = 1.0f / d;
        b[k].d = ellm_f32_to_f16(d);
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), lo), hi);
        __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vid)), lo), hi);
        _mm_storeu_si128((__m128i *)b[k].qs, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(b[k].qs + 16), _mm512_cvtepi32_epi8(q1));
    }
}

void kern_quantize_q4_0_avx512(const float *x, void *dst, int64_t n) {
    block_q4_0 *b = dst;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t k = 0; k < n / QK4_0; k++, x += QK4_0) {
        __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        __m512 a0 = _mm512_andnot_ps(sign, x0), a1 = _mm512_andnot_ps(sign, x1);
        float amax = hmax16(_mm512_max_ps(a0, a1));
        if (amax < QZ_TINY) {
            qtype_quantize_ref(QTYPE_Q4_0, x, &b[k], QK4_0);
            continue;
        }
        /* First element of largest magnitude, as the reference's strict '>' scan. */
        __m512 va = _mm512_set1_ps(amax);
        uint32_t m = (uint32_t)_mm512_cmp_ps_mask(a0, va, _CMP_EQ_OQ) |
                     ((uint32_t)_mm512_cmp_ps_mask(a1, va, _CMP_EQ_OQ) << 16);
        float max = x[__builtin_ctz(m)];
        float d = max / -8.0f, id = 1.0f / d;
        b[k].d = ellm_f32_to_f16(d);
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i eight = _mm512_set1_epi32(8), zero = _mm512_setzero_si512(), fifteen = _mm512_set1_epi32(15);
        __m512i q0 = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), eight);
        __m512i q1 = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vid)), eight);
        q0 = _mm512_min_epi32(_mm512_max_epi32(q0, zero), fifteen);
        q1 = _mm512_min_epi32(_mm512_max_epi32(q1, zero), fifteen);
        __m512i packed = _mm512_or_si512(q0, _mm512_slli_epi32(q1, 4));
        _mm_storeu_si128((__m128i *)b[k].qs, _mm512_cvtepi32_epi8(packed));
    }
}

/* F32 -> BF16 rounded to nearest even on the bit pattern, NaN quieted: the
 * reference's integer arithmetic, 16 lanes at a time (vcvtneps2bf16 would
 * flush subnormal inputs to zero). */
void kern_quantize_bf16_avx512(const float *x, void *dst, int64_t n) {
    uint16_t *out = dst;
    int64_t i = 0;
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(64);
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_loadu_si512((const void *)(x + i));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(v, abs_mask), inf);
        __m512i r = _mm512_add_epi32(v, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(v, 16), one)));
        r = _mm512_srli_epi32(r, 16);
        r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(v, 16), quiet);
        _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++) out[i] = ellm_f32_to_bf16(x[i]);
}

/* Q6_K, 256 weights per block: the sub-block scales come from scalar code
 * as in the reference; the 256 quotients x / s (a true division, as there)
 * are rounded and clamped 16 lanes at a time into bytes q + 32, then packed
 * 32 bytes at a time into ql / qh. A block in which a quotient leaves the
 * int32 range (a scale flushed far into F16's subnormals) takes the
 * reference path, whose float-to-int conversion of such values differs. */
void kern_quantize_q6_K_avx512(const float *x, void *dst, int64_t n) {
    block_q6_K *b = dst;
    const __m512 sign = _mm512_set1_ps(-0.0f), big = _mm512_set1_ps(2147483520.0f);
    const __m512i lo = _mm512_set1_epi32(-32), hi = _mm512_set1_epi32(31), off = _mm512_set1_epi32(32);
    for (int64_t k = 0; k < n / QK_K; k++, x += QK_K) {
        float want[16], smax = 0;
        for (int j = 0; j < 16; j++) {
            want[j] = hmax16(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + 16 * j))) / 31.0f;
            smax = smax > want[j] ? smax : want[j];
        }
        ellm_f16 d16 = ellm_f32_to_f16(smax / 127.0f);
        float d = ellm_f16_to_f32(d16);
        int8_t scales[16];
        for (int j = 0; j < 16; j++) {
            int s = d > 0 ? (int)ceilf(want[j] / d) : 0;
            scales[j] = (int8_t)(s < 0 ? 0 : s > 127 ? 127 : s);
        }
        uint8_t q[QK_K];
        int bad = 0;
        for (int j = 0; j < 16; j++) {
            float s = d * (float)scales[j];
            __m512i v = off;
            if (s > 0) {
                __m512 r = _mm512_div_ps(_mm512_loadu_ps(x + 16 * j), _mm512_set1_ps(s));
                bad |= _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, r), big, _CMP_GE_OQ) != 0;
                v = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(r), lo), hi), off);
            }
            _mm_storeu_si128((__m128i *)(q + 16 * j), _mm512_cvtepi32_epi8(v));
        }
        if (bad) {
            qtype_quantize_ref(QTYPE_Q6_K, x, &b[k], QK_K);
            continue;
        }
        b[k].d = d16;
        memcpy(b[k].scales, scales, sizeof scales);
        const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
        for (int h = 0; h < 2; h++) {
            __m256i q0 = _mm256_loadu_si256((const __m256i *)(q + 128 * h));
            __m256i q1 = _mm256_loadu_si256((const __m256i *)(q + 128 * h + 32));
            __m256i q2 = _mm256_loadu_si256((const __m256i *)(q + 128 * h + 64));
            __m256i q3 = _mm256_loadu_si256((const __m256i *)(q + 128 * h + 96));
            /* nibble shifts on 16-bit lanes, masked back to bytes */
            __m256i l02 = _mm256_or_si256(_mm256_and_si256(q0, m4),
                                          _mm256_slli_epi16(_mm256_and_si256(q2, m4), 4));
            __m256i l13 = _mm256_or_si256(_mm256_and_si256(q1, m4),
                                          _mm256_slli_epi16(_mm256_and_si256(q3, m4), 4));
            __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(q0, 4), m2);
            __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m2), 2);
            __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q2, 4), m2), 4);
            __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q3, 4), m2), 6);
            _mm256_storeu_si256((__m256i *)(b[k].ql + 64 * h), l02);
            _mm256_storeu_si256((__m256i *)(b[k].ql + 64 * h + 32), l13);
            _mm256_storeu_si256((__m256i *)(b[k].qh + 32 * h),
                                _mm256_or_si256(_mm256_or_si256(h0, h1), _mm256_or_si256(h2, h3)));
        }
    }
}

int64_t kern_first_out_of_range_avx512(const float *x, int64_t n, float lim) {
    const __m512 sign = _mm512_set1_ps(-0.0f), vl = _mm512_set1_ps(lim);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        /* NaN fails the ordered <= as in the reference's !(|x| <= lim) */
        __mmask16 m0 = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + i)), vl, _CMP_LE_OQ);
        __mmask16 m1 = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + i + 16)), vl, _CMP_LE_OQ);
        __mmask16 m2 = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + i + 32)), vl, _CMP_LE_OQ);
        __mmask16 m3 = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + i + 48)), vl, _CMP_LE_OQ);
        if ((m0 & m1 & m2 & m3) != 0xFFFF) break;
    }
    for (; i < n; i++)
        if (!(fabsf(x[i]) <= lim)) return i;
    return -1;
}
