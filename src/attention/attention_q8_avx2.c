/* AVX2 attention block kernel for a Q8_0 KV cache (the arithmetic is defined
 * in attention_q8.c), row by row, 8 keys at a time: per 32-channel group the
 * int8 query times the int8 keys (converted in registers) summed in F32 --
 * exact, the products being integers and the sums below 2^24, so the same
 * value as the int32 dot product of the AVX-512 kernel -- then scaled into
 * the scores; P*V by the integer definition of attention_q8_impl.h.
 * Blocks of fewer than 8 tokens go to the scalar kernel. */
#include "attention/attention_kernel.h"
#include "attention/attention_q8_impl.h"
#include "core/fp16.h"
#include "core/prefetch.h"

#include "attention/softmax_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* 8 int8 at p as floats. */
static inline __m256 q8_cvt8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

void attn_block_q8_avx2(attn_state *st, const attn_block *b) {
    const int G = st->group, R = st->rows, hd = st->head_dim, hdp = st->hdp, bt = st->block_tokens, ng = hd / 32;
    if (bt < 8) {
        attn_block_q8_scalar(st, b);
        return;
    }
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * G; /* first row that sees a key */
    if (r0 >= R) return;
    int nk = b->vis0 + (R - 1) / G; /* keys the last row sees */
    if (nk > b->n_valid) nk = b->n_valid;
    const int8_t *k = b->k, *v = b->v;
    const uint16_t *kd = (const uint16_t *)(k + (size_t)hd * bt), *vd = (const uint16_t *)(v + (size_t)hd * bt);
    if (b->next_k) prefetch_range_l1(b->next_k, 2 * kv_q8_half_bytes(hd, bt));
    if (b->ahead_k) prefetch_range_l2(b->ahead_k, 2 * kv_q8_half_bytes(hd, bt));
    for (int r = r0; r < R; r++) {
        int nv = b->vis0 + r / G;
        if (nv > nk) nv = nk;
        const int8_t *q8 = st->q8 + (size_t)r * hdp;
        const float *qd = st->qd + (size_t)r * ng;
        float *s = st->s + (size_t)r * st->lds;
        /* keys [j0, j0 + 8): every channel row holds them (bt >= 8), those
         * past nv are computed and dropped */
        for (int j0 = 0; j0 < nv; j0 += 8) {
            __m256 sc = _mm256_setzero_ps();
            for (int g = 0; g < ng; g++) {
                __m256 f0 = _mm256_setzero_ps(), f1 = _mm256_setzero_ps();
                for (int c = 32 * g; c < 32 * g + 32; c += 2) {
                    f0 = _mm256_fmadd_ps(_mm256_set1_ps((float)q8[c]), q8_cvt8(k + (size_t)c * bt + j0), f0);
                    f1 = _mm256_fmadd_ps(_mm256_set1_ps((float)q8[c + 1]), q8_cvt8(k + (size_t)(c + 1) * bt + j0), f1);
                }
                const __m256 kdv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + (size_t)g * bt + j0)));
                sc = _mm256_fmadd_ps(_mm256_add_ps(f0, f1), _mm256_mul_ps(kdv, _mm256_set1_ps(qd[g])), sc);
            }
            float t[8];
            _mm256_storeu_ps(t, sc);
            memcpy(s + j0, t, (size_t)(nv - j0 < 8 ? nv - j0 : 8) * sizeof(float));
        }
        const float alpha = attn_softmax_row_avx2(s, nv, nk, &st->m[r], &st->l[r]);
        float *acc = st->acc + (size_t)r * hdp;
        if (alpha != 1.0f) {
            const __m256 va = _mm256_set1_ps(alpha);
            for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(acc + d, _mm256_mul_ps(va, _mm256_loadu_ps(acc + d)));
        }
        /* integer P*V (attention_q8_impl.h): per tile of 16 keys and group,
         * the u8 weights times the values summed in F32 -- exact, the
         * products being integers and the sums below 2^24 -- then scaled */
        for (int j0 = 0; j0 < nv; j0 += ATTN_Q8_PV_TILE) {
            const int n = nv - j0 < ATTN_Q8_PV_TILE ? nv - j0 : ATTN_Q8_PV_TILE;
            for (int g = 0; g < ng; g++) {
                float w[ATTN_Q8_PV_TILE];
                uint8_t q[ATTN_Q8_PV_TILE];
                for (int j = 0; j < n; j++) w[j] = s[j0 + j] * ellm_f16_to_f32(vd[(size_t)(j0 + j) * ng + g]);
                const float sc = attn_q8_pv_quant_ref(w, n, q);
                if (sc == 0.0f) continue; /* fma(0, 0, acc) = acc: acc is never -0 */
                __m256 i0 = _mm256_setzero_ps(), i1 = i0, i2 = i0, i3 = i0;
                for (int j = 0; j < n; j++) {
                    const __m256 qj = _mm256_set1_ps((float)q[j]);
                    const int8_t *vr = v + (size_t)(j0 + j) * hd + 32 * g;
                    i0 = _mm256_fmadd_ps(qj, q8_cvt8(vr), i0);
                    i1 = _mm256_fmadd_ps(qj, q8_cvt8(vr + 8), i1);
                    i2 = _mm256_fmadd_ps(qj, q8_cvt8(vr + 16), i2);
                    i3 = _mm256_fmadd_ps(qj, q8_cvt8(vr + 24), i3);
                }
                const __m256 vs = _mm256_set1_ps(sc);
                float *a = acc + 32 * g;
                _mm256_storeu_ps(a, _mm256_fmadd_ps(vs, i0, _mm256_loadu_ps(a)));
                _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(vs, i1, _mm256_loadu_ps(a + 8)));
                _mm256_storeu_ps(a + 16, _mm256_fmadd_ps(vs, i2, _mm256_loadu_ps(a + 16)));
                _mm256_storeu_ps(a + 24, _mm256_fmadd_ps(vs, i3, _mm256_loadu_ps(a + 24)));
            }
        }
    }
}
