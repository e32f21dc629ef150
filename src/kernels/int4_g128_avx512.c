/* INT4_G128 matmul, AVX-512 VNNI: per group one 64-byte weight load, the two
 * nibble halves unpacked once and reused for every activation row of the
 * batch, vpdpbusd (unsigned 4-bit x signed 8-bit) into 16 lanes, an exact
 * integer reduction, then the reference's float arithmetic per group (see
 * matmul_int4_g128_ref), so results equal the scalar reference bit for bit
 * whatever nb. */
#include "kernels/kernels_impl.h"

#include <immintrin.h>

/* Activation rows handled per pass over a weight row (its groups stay in
 * L1 between the rows of a pass). */
enum { I4_ROWS = 8 };

void kern_matmul_int4_g128_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                                  float *Y, int64_t ldy) {
    const int64_t ng = cols / QK_G128;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
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
                __m512i raw = _mm512_loadu_si512(w[g].qs);
                __m512i lo = _mm512_and_si512(raw, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                const float dw = ellm_f16_to_f32(w[g].d), mw = ellm_f16_to_f32(w[g].m);
                for (int i = 0; i < bn; i++) {
                    const int8_t *q = a[i].qs + QK_G128 * g;
                    __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(q));
                    acc = _mm512_dpbusd_epi32(acc, hi, _mm512_loadu_si512(q + 64));
                    int dot = _mm512_reduce_add_epi32(acc);
                    float da = a[i].d[g];
                    s[i] += (dw * da) * (float)dot;
                    s[i] += (mw * da) * (float)a[i].sa[g];
                }
            }
            for (int i = 0; i < bn; i++) Y[(int64_t)(b0 + i) * ldy + r] = s[i];
        }
    }
}
