/* AVX-512 widening of Q8_0 KV blocks to F32 (see attention_q8.c): 16 int8
 * keys of a channel (or 16 dims of a value) sign-extended, converted and
 * multiplied by their F16 scales in registers. */
#include "attention/attention_internal.h"
#include "core/prefetch.h"

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

/* ---- fused block kernel: int8 read straight from the cache ------------------
 *
 * For the few query rows of decode and verification (up to ATTN_Q8_FUSE_ROWS)
 * nothing is widened to memory: per 16 keys, each channel's int8 values are
 * sign-extended and converted in registers and multiplied into the rows'
 * scores by broadcast query values, a group of 32 channels at a time, and the
 * group's partial scores are scaled once by the 16 keys' F16 scales (so the
 * scale costs one FMA per 32 channels, not a multiply per channel). Values are
 * converted 16 dims at a time, scaled by their group's scale and accumulated
 * into the rows' outputs. The block ahead is prefetched spread over the
 * computation (one or more lines per channel pair, then per key), as the F16
 * kernel does. Same arithmetic as the scalar reference up to the order of the
 * sums: tested within float rounding of it. */
#include "attention/softmax_avx512.h"

#include <math.h>

#define Q8_ALWAYS_INLINE inline __attribute__((always_inline))

static Q8_ALWAYS_INLINE __mmask16 q8_tail(int n) { return (__mmask16)((1u << n) - 1); }

/* 16 int8 at p (lanes outside m read nothing, are 0) as floats. */
static Q8_ALWAYS_INLINE __m512 q8_cvt16(const int8_t *p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

/* Scores s[r][j0 .. j0 + 16) for NR rows: per 32-channel group, two
 * accumulators per row (even, odd channels) then one FMA with the keys' scales. */
static Q8_ALWAYS_INLINE void q8_qk16(const float *q, int hdp, const int8_t *k, const uint16_t *kd, int bt, int hd,
                                     int j0, __mmask16 m, float *s, int lds, const int NR, const char **pf,
                                     int pf_lines) {
    __m512 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < hd / 32; g++) {
        __m512 c0[4], c1[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) c0[r] = c1[r] = _mm512_setzero_ps();
        const int8_t *kp = k + (size_t)g * 32 * bt + j0;
#pragma GCC unroll 4
        for (int c = 0; c < 32; c += 2, kp += 2 * bt) {
            if (*pf)
                for (int i = 0; i < pf_lines; i++, *pf += 64) _mm_prefetch(*pf, _MM_HINT_T1);
            const __m512 x0 = q8_cvt16(kp, m), x1 = q8_cvt16(kp + bt, m);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const float *qr = q + (size_t)r * hdp + g * 32 + c;
                c0[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[0]), x0, c0[r]);
                c1[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[1]), x1, c1[r]);
            }
        }
        const __m512 sc = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, kd + (size_t)g * bt + j0));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) acc[r] = _mm512_fmadd_ps(_mm512_add_ps(c0[r], c1[r]), sc, acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) _mm512_mask_storeu_ps(s + (size_t)r * lds + j0, m, acc[r]);
}

static Q8_ALWAYS_INLINE void q8_qk_rows(const float *q, int hdp, const int8_t *k, const uint16_t *kd, int bt, int hd,
                                        int nk, float *s, int lds, const int NR, const char **pf, int pf_lines) {
    for (int j = 0; j < nk; j += 16)
        q8_qk16(q, hdp, k, kd, bt, hd, j, nk - j >= 16 ? (__mmask16)0xffff : q8_tail(nk - j), s, lds, NR, pf,
                pf_lines);
}

/* acc[NR rows][d0 .. d0 + 16 NV) += p[r][j] * vd[j][group] * v[j][d] over keys [0, nk). */
static Q8_ALWAYS_INLINE void q8_pv_tile(float *acc, int hdp, const float *p, int lds, const int8_t *v,
                                        const uint16_t *vd, int hd, int d0, int nk, const int NR, const int NV,
                                        const char **pf, int pf_lines) {
    const int G = hd / 32;
    __m512 c[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) c[r][i] = _mm512_loadu_ps(acc + (size_t)r * hdp + d0 + 16 * i);
    for (int j = 0; j < nk; j++) {
        if (*pf)
            for (int i = 0; i < pf_lines; i++, *pf += 64) _mm_prefetch(*pf, _MM_HINT_T1);
        __m512 x[4];
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) {
            const int d = d0 + 16 * i;
            const __m512 sc = _mm512_cvtph_ps(_mm256_set1_epi16((short)vd[(size_t)j * G + d / 32]));
            x[i] = _mm512_mul_ps(q8_cvt16(v + (size_t)j * hd + d, (__mmask16)0xffff), sc);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 pb = _mm512_set1_ps(p[(size_t)r * lds + j]);
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++) c[r][i] = _mm512_fmadd_ps(pb, x[i], c[r][i]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) _mm512_storeu_ps(acc + (size_t)r * hdp + d0 + 16 * i, c[r][i]);
}

static Q8_ALWAYS_INLINE void q8_pv_rows(float *acc, int hdp, const float *p, int lds, const int8_t *v,
                                        const uint16_t *vd, int hd, int nk, const int NR, const char **pf,
                                        int pf_lines) {
    int d = 0;
    for (; d + 64 <= hd; d += 64) q8_pv_tile(acc, hdp, p, lds, v, vd, hd, d, nk, NR, 4, pf, pf_lines);
    if (d < hd) q8_pv_tile(acc, hdp, p, lds, v, vd, hd, d, nk, NR, 2, pf, pf_lines); /* hd % 64 == 32 */
}

static Q8_ALWAYS_INLINE void q8_fused_step(attn_state *st, const attn_block *b, const int HD) {
    const int G = st->group, R = st->rows, hd = HD ? HD : st->head_dim, hdp = st->hdp, lds = st->lds;
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * G; /* first row that sees a key */
    if (r0 >= R) return;
    int nk = b->vis0 + (R - 1) / G; /* keys the last row sees */
    if (nk > b->n_valid) nk = b->n_valid;
    const int bt = st->block_tokens;
    const size_t half = kv_q8_half_bytes(hd, bt);
    const int8_t *k = b->k, *v = b->v;
    const uint16_t *kd = (const uint16_t *)(k + (size_t)hd * bt), *vd = (const uint16_t *)(v + (size_t)hd * bt);
    /* the block ahead spread over this one's work; else the next one at once */
    const size_t half_lines = (half + 63) / 64;
    const size_t k_steps = (size_t)((nk + 15) / 16) * (size_t)(hd / 2);
    const int pf_k = (int)((half_lines + k_steps - 1) / k_steps);
    const int pf_v = (int)((half_lines + (size_t)nk - 1) / (size_t)nk);
    if (b->next_k && !b->ahead_k) {
        prefetch_range_l1(b->next_k, half);
        prefetch_range_l1(b->next_v, half);
    }
    const char *pfk = b->ahead_k, *pfv = b->ahead_v;
    int r = r0;
    for (; r + 4 <= R; r += 4)
        q8_qk_rows(st->q + (size_t)r * hdp, hdp, k, kd, bt, hd, nk, st->s + (size_t)r * lds, lds, 4, &pfk, pf_k);
    switch (R - r) {
    case 3: q8_qk_rows(st->q + (size_t)r * hdp, hdp, k, kd, bt, hd, nk, st->s + (size_t)r * lds, lds, 3, &pfk, pf_k); break;
    case 2: q8_qk_rows(st->q + (size_t)r * hdp, hdp, k, kd, bt, hd, nk, st->s + (size_t)r * lds, lds, 2, &pfk, pf_k); break;
    case 1: q8_qk_rows(st->q + (size_t)r * hdp, hdp, k, kd, bt, hd, nk, st->s + (size_t)r * lds, lds, 1, &pfk, pf_k); break;
    default: break;
    }
    attn_softmax_block_avx512(st, b, r0, nk, hdp, 0);
    for (r = r0; r + 4 <= R; r += 4)
        q8_pv_rows(st->acc + (size_t)r * hdp, hdp, st->s + (size_t)r * lds, lds, v, vd, hd, nk, 4, &pfv, pf_v);
    switch (R - r) {
    case 3: q8_pv_rows(st->acc + (size_t)r * hdp, hdp, st->s + (size_t)r * lds, lds, v, vd, hd, nk, 3, &pfv, pf_v); break;
    case 2: q8_pv_rows(st->acc + (size_t)r * hdp, hdp, st->s + (size_t)r * lds, lds, v, vd, hd, nk, 2, &pfv, pf_v); break;
    case 1: q8_pv_rows(st->acc + (size_t)r * hdp, hdp, st->s + (size_t)r * lds, lds, v, vd, hd, nk, 1, &pfv, pf_v); break;
    default: break;
    }
}

void attn_block_q8_fused_avx512(attn_state *st, const attn_block *b) {
    switch (st->head_dim) {
    case 64: q8_fused_step(st, b, 64); break;
    case 128: q8_fused_step(st, b, 128); break;
    default: q8_fused_step(st, b, 0); break;
    }
}
