/* AVX2 attention block kernel for a Q8_0 KV cache (the arithmetic is defined
 * in attention_q8.c), row by row, 8 keys at a time: per 32-channel group the
 * int8 query times the int8 keys (converted in registers) summed in F32 --
 * exact, the products being integers and the sums below 2^24, so the same
 * value as the int32 dot product of the AVX-512 kernel -- then scaled into
 * the scores; the value's scale folded into each probability for P*V.
 * Blocks of fewer than 8 tokens go to the scalar kernel. */
#include "attention/attention_kernel.h"
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
        for (int g = 0; g < ng; g++) {
            __m256 a0 = _mm256_loadu_ps(acc + 32 * g), a1 = _mm256_loadu_ps(acc + 32 * g + 8),
                   a2 = _mm256_loadu_ps(acc + 32 * g + 16), a3 = _mm256_loadu_ps(acc + 32 * g + 24);
            for (int j = 0; j < nv; j++) {
                const __m256 w = _mm256_set1_ps(s[j] * ellm_f16_to_f32(vd[(size_t)j * ng + g]));
                const int8_t *vr = v + (size_t)j * hd + 32 * g;
                a0 = _mm256_fmadd_ps(w, q8_cvt8(vr), a0);
                a1 = _mm256_fmadd_ps(w, q8_cvt8(vr + 8), a1);
                a2 = _mm256_fmadd_ps(w, q8_cvt8(vr + 16), a2);
                a3 = _mm256_fmadd_ps(w, q8_cvt8(vr + 24), a3);
            }
            _mm256_storeu_ps(acc + 32 * g, a0);
            _mm256_storeu_ps(acc + 32 * g + 8, a1);
            _mm256_storeu_ps(acc + 32 * g + 16, a2);
            _mm256_storeu_ps(acc + 32 * g + 24, a3);
        }
    }
}
