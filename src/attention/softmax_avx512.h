/* The online-softmax step of the AVX-512 block kernels (F16/F32 in
 * attention_avx512.c, Q8_0 in attention_q8_avx512.c): included only by files
 * compiled with the AVX-512 flags.
 *
 * The running sum of a row is kept as 16 lane sums (st->lv; the driver adds
 * the lanes, in lane order, into st->l when the part ends), so a block costs
 * no horizontal add per row: lane i sums exp(s[j] - m) over the keys j = i
 * mod 16, each rescaled by alpha when the max grows. */
#ifndef ELLM_ATTENTION_SOFTMAX_AVX512_H
#define ELLM_ATTENTION_SOFTMAX_AVX512_H

#include "attention/attention_kernel.h"
#include "kernels/vec_exp.h"

#include <immintrin.h>
#include <math.h>

/* exp(m_old - m_new), the factor that rescales a row's old sums when its
 * running max grows, by the kernels' vector exp in lane 0: no call into
 * libm in the middle of register-resident loops (a call clobbers every
 * vector register, so the compiler spills the accumulators around it). */
static inline __attribute__((always_inline)) float attn_rescale_avx512(float m_old, float m_new) {
    return _mm512_cvtss_f32(exp512(_mm512_set1_ps(m_old - m_new)));
}

/* The same value out of line, for loops whose code the inlined exp would
 * crowd (the multi-row kernels, where the max grows in few blocks; their
 * state is in memory, so the call spills nothing). */
static __attribute__((noinline, cold, unused)) float attn_rescale_avx512_cold(float m_old, float m_new) {
    return attn_rescale_avx512(m_old, m_new);
}

/* One row: s[0, nv) scores become probabilities exp(s - m_new), s[nv, nk)
 * become 0 (keys this row must not see); lv (16 lane sums) is rescaled and
 * adds them; returns the factor exp(m_old - m_new) that rescales the row's
 * old acc. Callers pass constants for nv and nk where they know them: the
 * arithmetic is the same. */
static inline __attribute__((always_inline)) float attn_softmax_row_avx512(float *s, int nv, int nk, float *m,
                                                                           float *lv) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= nv; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + j));
    const __mmask16 tm = (__mmask16)((1u << (nv - j)) - 1);
    if (j < nv) vm = _mm512_mask_max_ps(vm, tm, vm, _mm512_maskz_loadu_ps(tm, s + j));
    /* The running max rarely grows after the first blocks: test that with a
     * vector compare and reduce only when it does. */
    float m_new = *m, alpha = 1.0f;
    __m512 vs = _mm512_loadu_ps(lv);
    if (_mm512_cmp_ps_mask(vm, _mm512_set1_ps(*m), _CMP_GT_OQ)) {
        m_new = _mm512_reduce_max_ps(vm);
        alpha = attn_rescale_avx512(*m, m_new);
        vs = _mm512_mul_ps(vs, _mm512_set1_ps(alpha));
    }
    const __m512 mn = _mm512_set1_ps(m_new);
    for (j = 0; j + 16 <= nv; j += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mn));
        _mm512_storeu_ps(s + j, e);
        vs = _mm512_add_ps(vs, e);
    }
    if (j < nv) {
        __m512 e = _mm512_maskz_mov_ps(tm, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, s + j), mn)));
        _mm512_mask_storeu_ps(s + j, tm, e);
        vs = _mm512_add_ps(vs, e);
    }
    for (j = nv; j < nk; j++) s[j] = 0.0f;
    *m = m_new;
    _mm512_storeu_ps(lv, vs);
    return alpha;
}

/* The same step for one whole block of 16 keys whose scores s a register
 * holds (attn_softmax_row_avx512 with nv = nk = 16, operation for operation:
 * max(-inf, s) is s), for kernels that keep a row's lane sums in a register
 * (*lv): returns the probabilities, updates *m and *lv, and sets *alpha to
 * the factor that rescales the row's old acc. COLD: that factor, needed in
 * few blocks, from attn_rescale_avx512_cold (state in memory) rather than
 * inline (state in registers, which a call would spill). */
static inline __attribute__((always_inline)) __m512 attn_softmax16_avx512(__m512 s, float *m, __m512 *lv,
                                                                          float *alpha, const int COLD) {
    float m_new = *m, a = 1.0f;
    if (__builtin_expect(_mm512_cmp_ps_mask(s, _mm512_set1_ps(*m), _CMP_GT_OQ) != 0, 0)) {
        m_new = _mm512_reduce_max_ps(s);
        a = COLD ? attn_rescale_avx512_cold(*m, m_new) : attn_rescale_avx512(*m, m_new);
        *lv = _mm512_mul_ps(*lv, _mm512_set1_ps(a));
    }
    const __m512 e = exp512(_mm512_sub_ps(s, _mm512_set1_ps(m_new)));
    *m = m_new;
    *lv = _mm512_add_ps(*lv, e);
    *alpha = a;
    return e;
}

/* The block's rows [r0, st->rows) over its nk keys: scores in st->s become
 * probabilities, and each row's acc (hdp floats, a constant where the caller
 * specialises on head_dim) is rescaled where its max grew. NK: nk when every
 * row sees all nk keys (a constant, 16), else 0. */
static inline __attribute__((always_inline)) void attn_softmax_block_avx512(attn_state *st, const attn_block *b,
                                                                            int r0, int nk, const int hdp,
                                                                            const int NK) {
    const int G = st->group;
    int nv = b->vis0 + r0 / G, g = r0 % G; /* keys row r sees, its query head in the group */
    for (int r = r0; r < st->rows; r++) {
        float alpha = NK ? attn_softmax_row_avx512(st->s + (size_t)r * st->lds, NK, NK, &st->m[r], st->lv + 16 * r)
                         : attn_softmax_row_avx512(st->s + (size_t)r * st->lds, nv < nk ? nv : nk, nk, &st->m[r],
                                                   st->lv + 16 * r);
        if (alpha != 1.0f) {
            float *acc = st->acc + (size_t)r * hdp;
            const __m512 va = _mm512_set1_ps(alpha);
            for (int d = 0; d < hdp; d += 16)
                _mm512_storeu_ps(acc + d, _mm512_mul_ps(va, _mm512_loadu_ps(acc + d)));
        }
        if (++g == G) {
            g = 0;
            nv++;
        }
    }
}

#endif
