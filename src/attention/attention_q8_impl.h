/* The Q8_0 cache's integer P*V, per row and per tile of 16 keys of a block,
 * as inline helpers any Q8_0 kernel can call for its rows (the block kernels
 * of attention_q8*.c; kernels over several query rows of other shapes). Not
 * for use outside src/attention.
 *
 * Definition (attention_q8.c states the whole kernel). Keys of a block are
 * taken in tiles of 16 ([0, 16), [16, 32), ...). For a query row, a tile and a
 * 32-dim group g, with p[j] the row's probabilities (0 for keys it does not
 * see) and vd[j][g] the values' scales:
 *     w[j]  = p[j] * vd[j][g]                       (F32 product)
 *     mx    = max over the tile's keys of w[j]
 *     e     = floor(log2(mx))                       (mx >= 2^-100; else the
 *                                                    tile adds nothing: q = 0, sc = 0)
 *     q[j]  = min(255, round_even(w[j] * 2^(7 - e)))  in [0, 255], u8
 *     sc    = 2^(e - 7)
 *     I[d]  = sum over the tile's keys of q[j] * v[j][d]   (exact integer)
 *     acc[d] = fma(sc, (float)I[d], acc[d])          for d in group g
 * Every step is exact or one IEEE rounding of operands that do not depend on
 * the ISA, on the order of the keys or on the rows sharing the call, so the
 * result has the same bits in the scalar reference, in SIMD kernels, and for
 * a row of a batched pass and a single-token call (a tile a row does not see
 * has mx = 0 and leaves acc as it is). The largest weight keeps 8 bits
 * (q in [128, 255]); the weight error is at most half a step, 2^-8 of the
 * tile's largest weight (the values themselves are 8-bit numbers). |I| <=
 * 16 * 255 * 127 < 2^24, so (float)I is exact. */
#ifndef ELLM_ATTENTION_Q8_IMPL_H
#define ELLM_ATTENTION_Q8_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Keys per P*V tile (the quantization unit of the weights). */
#define ATTN_Q8_PV_TILE 16
/* Smallest tile maximum that is quantized (below, the tile adds nothing). */
#define ATTN_Q8_PV_MIN 0x1p-100f

/* One row's weights of one tile and group: w[0, n) (n <= 16, >= 0) into
 * q[0, n) and the tile's scale (returned; 0 when the tile adds nothing). */
static inline float attn_q8_pv_quant_ref(const float *w, int n, uint8_t *q) {
    float mx = 0.0f;
    for (int j = 0; j < n; j++) mx = w[j] > mx ? w[j] : mx;
    if (!(mx >= ATTN_Q8_PV_MIN)) {
        memset(q, 0, (size_t)n);
        return 0.0f;
    }
    const int e = ilogbf(mx);
    const float up = ldexpf(1.0f, 7 - e);
    for (int j = 0; j < n; j++) {
        const long v = lrintf(w[j] * up);
        q[j] = (uint8_t)(v > 255 ? 255 : v);
    }
    return ldexpf(1.0f, e - 7);
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#include <immintrin.h>

#define Q8PV_INLINE static inline __attribute__((always_inline))

/* vpermt2b indices. Level 1: two token rows a, b (64 dims each) to pairs
 * a[i] b[i] of dims [0, 32) (lo) or [32, 64) (hi). Level 2: two such pair
 * vectors ab, cd to dwords a[i] b[i] c[i] d[i] of their dims [0, 16) (lo) or
 * [16, 32) (hi) of the pairs. */
static const uint8_t q8pv_perm[4][64] __attribute__((aligned(64))) = {
#define L1(i, o) (uint8_t)((o) + (i) / 2 + ((i) % 2) * 64)
#define L1ROW(o, b)                                                                                                   \
    L1(b + 0, o), L1(b + 1, o), L1(b + 2, o), L1(b + 3, o), L1(b + 4, o), L1(b + 5, o), L1(b + 6, o), L1(b + 7, o)
    {L1ROW(0, 0), L1ROW(0, 8), L1ROW(0, 16), L1ROW(0, 24), L1ROW(0, 32), L1ROW(0, 40), L1ROW(0, 48), L1ROW(0, 56)},
    {L1ROW(32, 0), L1ROW(32, 8), L1ROW(32, 16), L1ROW(32, 24), L1ROW(32, 32), L1ROW(32, 40), L1ROW(32, 48),
     L1ROW(32, 56)},
#undef L1ROW
#undef L1
/* byte 4i + t: pair vector ab (t < 2) or cd (t >= 2), byte 2 (o + i) + t % 2 */
#define L2(i, o) (uint8_t)(2 * ((o) + (i) / 4) + (i) % 2 + ((i) % 4 >= 2 ? 64 : 0))
#define L2ROW(o, b)                                                                                                   \
    L2(b + 0, o), L2(b + 1, o), L2(b + 2, o), L2(b + 3, o), L2(b + 4, o), L2(b + 5, o), L2(b + 6, o), L2(b + 7, o)
    {L2ROW(0, 0), L2ROW(0, 8), L2ROW(0, 16), L2ROW(0, 24), L2ROW(0, 32), L2ROW(0, 40), L2ROW(0, 48), L2ROW(0, 56)},
    {L2ROW(16, 0), L2ROW(16, 8), L2ROW(16, 16), L2ROW(16, 24), L2ROW(16, 32), L2ROW(16, 40), L2ROW(16, 48),
     L2ROW(16, 56)},
#undef L2ROW
#undef L2
};

/* vpermb indices of the Q.K operand: byte 4j + i of the result is byte
 * 16i + j of the source (channel i of key j, the source holding 4 channels
 * of 16 keys), one dword of 4 channels per key. */
static const int8_t q8k_quad_perm[64] __attribute__((aligned(64))) = {
    0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21,
    37, 53, 6, 22, 38, 54, 7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58,
    11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};

/* Lanes 0-7: the max of a's 16 lanes; lanes 8-15: of b's. */
Q8PV_INLINE __m512 q8pv_max2(__m512 a, __m512 b) {
    __m512 t = _mm512_max_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    t = _mm512_max_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
    t = _mm512_max_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_max_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
}

/* Groups g0 (lanes 0-7 of mx) and g0 + 1 (lanes 8-15) of one row: weights
 * w0, w1 (16 keys each) to u8 in q[16 g0 ..] and scales in sc[g0], sc[g0 + 1]. */
Q8PV_INLINE void q8pv_quant2(__m512 w0, __m512 w1, __m512 mx, uint8_t *q, float *sc, int g0) {
    const __mmask16 ok = _mm512_cmp_ps_mask(mx, _mm512_set1_ps(ATTN_Q8_PV_MIN), _CMP_GE_OQ);
    const __m512 e = _mm512_getexp_ps(mx), one = _mm512_set1_ps(1.0f), seven = _mm512_set1_ps(7.0f);
    const __m512 up = _mm512_scalef_ps(one, _mm512_sub_ps(seven, e));
    const __m512 s = _mm512_maskz_scalef_ps(ok, one, _mm512_sub_ps(e, seven));
    const __m512 u0 = _mm512_shuffle_f32x4(up, up, 0x00), u1 = _mm512_shuffle_f32x4(up, up, 0xff);
    const __mmask16 ok0 = (__mmask16)((ok & 1) ? 0xffff : 0), ok1 = (__mmask16)((ok & 0x100) ? 0xffff : 0);
    _mm_storeu_si128((__m128i *)(q + 16 * g0),
                     _mm512_cvtusepi32_epi8(_mm512_maskz_cvtps_epi32(ok0, _mm512_mul_ps(w0, u0))));
    _mm_storeu_si128((__m128i *)(q + 16 * (g0 + 1)),
                     _mm512_cvtusepi32_epi8(_mm512_maskz_cvtps_epi32(ok1, _mm512_mul_ps(w1, u1))));
    sc[g0] = _mm_cvtss_f32(_mm512_castps512_ps128(s));
    sc[g0 + 1] = _mm_cvtss_f32(_mm512_castps512_ps128(_mm512_shuffle_f32x4(s, s, 0xff)));
}

/* Lines of pf (a block ahead's K or V half, `lines` of them), part i of n:
 * a kernel calls it at each of n steps of its block so the block ahead's
 * prefetches spread over the computation. q8_pf_spread asks for them towards
 * L2 (the multi-row kernel); q8_pf_spread_nta non-temporally, for the
 * single-row kernel on AMD (attention_prefetch_nta), whose blocks are read
 * once per call: bench_attention
 * (2 threads, SmolLM2-135M shape, five alternated rounds on a Zen 5 guest),
 * dense Q8_0 decode attention at 16K 5.67 -> 5.46 ms, 32K 11.31 -> 10.70
 * against towards L2; 1B shape at 32K (bench_sparse_attention) dense 17.48
 * -> 16.82, a sparse list 5.46 -> 5.39. The multi-row kernel measured the
 * same either way. */
#define Q8_PF_SPREAD(name, hint)                                                                                      \
    Q8PV_INLINE void name(const char *pf, int i, int n, int lines) {                                                  \
        if (!pf) return;                                                                                              \
        for (int l = i * lines / n; l < (i + 1) * lines / n; l++) _mm_prefetch(pf + (size_t)l * 64, hint);           \
    }
Q8_PF_SPREAD(q8_pf_spread, _MM_HINT_T1)
Q8_PF_SPREAD(q8_pf_spread_nta, _MM_HINT_NTA)
#undef Q8_PF_SPREAD
/* The single-row kernel's: non-temporally (NTA) or towards L2, as
 * attention_prefetch_nta chooses for this CPU. */
Q8PV_INLINE void q8_pf_spread_ahead(const char *pf, int i, int n, int lines, const int NTA) {
    if (NTA) q8_pf_spread_nta(pf, i, n, lines);
    else q8_pf_spread(pf, i, n, lines);
}

/* A block's value scales vd (16 keys x HD / 32 groups of F16, key-major) as
 * F32 by group: vdt[g] lane j = vd[j][g] (HD 64 or 128; the conversion is
 * exact). */
Q8PV_INLINE void q8pv_value_scales(const uint16_t *vd, const int HD, __m512 vdt[4]) {
    if (HD == 64) {
        const __m512i idx = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 30, 28, 26,
                                             24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        const __m512i t = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512((const void *)vd));
        vdt[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(t));
        vdt[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(t, 1));
    } else { /* word 4 j + g */
        const __m512i i01 = _mm512_set_epi16(61, 57, 53, 49, 45, 41, 37, 33, 29, 25, 21, 17, 13, 9, 5, 1, 60, 56, 52,
                                             48, 44, 40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0);
        const __m512i i23 = _mm512_add_epi16(i01, _mm512_set1_epi16(2));
        const __m512i lo = _mm512_loadu_si512((const void *)vd), hi = _mm512_loadu_si512((const void *)(vd + 32));
        const __m512i t01 = _mm512_permutex2var_epi16(lo, i01, hi), t23 = _mm512_permutex2var_epi16(lo, i23, hi);
        vdt[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(t01));
        vdt[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(t01, 1));
        vdt[2] = _mm512_cvtph_ps(_mm512_castsi512_si256(t23));
        vdt[3] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(t23, 1));
    }
}

/* Four weight vectors w[0..3] (16 keys each) quantized together: one max
 * reduction, exponent and pack for all four. Returns the u8 weights with, in
 * 128-bit lane l, dword v = w[v]'s keys 4 l .. 4 l + 3; *sv gets vector v's
 * scale in lanes 4 v .. 4 v + 3. A vector whose maximum is below
 * ATTN_Q8_PV_MIN gets weights and scale 0 (its products then add nothing, as
 * q8pv_quant2's masked conversion gives). Same values as q8pv_quant2. */
Q8PV_INLINE __m512i q8pv_quant4(const __m512 w[4], __m512 *sv) {
    /* 128-bit lane v of u: the maxima of w[v]'s lanes, reduced to its maximum in all 4 lanes */
    const __m512 ab = _mm512_max_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 cd = _mm512_max_ps(_mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 u = _mm512_max_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    u = _mm512_max_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(1, 0, 3, 2)));
    u = _mm512_max_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
    const __mmask16 ok = _mm512_cmp_ps_mask(u, _mm512_set1_ps(ATTN_Q8_PV_MIN), _CMP_GE_OQ);
    const __m512 e = _mm512_getexp_ps(u), one = _mm512_set1_ps(1.0f), seven = _mm512_set1_ps(7.0f);
    const __m512 up = _mm512_maskz_scalef_ps(ok, one, _mm512_sub_ps(seven, e));
    *sv = _mm512_maskz_scalef_ps(ok, one, _mm512_sub_ps(e, seven));
    /* clamped as vpmovusdb clamps (an unsigned 255 at most) */
    const __m512i cap = _mm512_set1_epi32(255);
    const __m512i c0 = _mm512_min_epu32(_mm512_cvtps_epi32(_mm512_mul_ps(w[0], _mm512_shuffle_f32x4(up, up, 0x00))), cap);
    const __m512i c1 = _mm512_min_epu32(_mm512_cvtps_epi32(_mm512_mul_ps(w[1], _mm512_shuffle_f32x4(up, up, 0x55))), cap);
    const __m512i c2 = _mm512_min_epu32(_mm512_cvtps_epi32(_mm512_mul_ps(w[2], _mm512_shuffle_f32x4(up, up, 0xaa))), cap);
    const __m512i c3 = _mm512_min_epu32(_mm512_cvtps_epi32(_mm512_mul_ps(w[3], _mm512_shuffle_f32x4(up, up, 0xff))), cap);
    return _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
}

/* One row's quantized weights of a tile: p (its 16 probabilities; lanes
 * outside m are not read), vdt (ng x 16 value scales of the tile's keys, by
 * group) into q (ng x 16 u8, by group) and sc (ng scales). */
Q8PV_INLINE void q8pv_weights_avx512(const float *p, __mmask16 m, const float *vdt, int ng, uint8_t *q, float *sc) {
    const __m512 pv = _mm512_maskz_loadu_ps(m, p);
    int g = 0;
    for (; g + 2 <= ng; g += 2) {
        const __m512 w0 = _mm512_mul_ps(pv, _mm512_loadu_ps(vdt + (size_t)g * 16));
        const __m512 w1 = _mm512_mul_ps(pv, _mm512_loadu_ps(vdt + (size_t)(g + 1) * 16));
        q8pv_quant2(w0, w1, q8pv_max2(w0, w1), q, sc, g);
    }
    if (g < ng) { /* an odd group: paired with itself, the copy's results overwritten */
        uint8_t qq[32];
        float ss[2];
        const __m512 w0 = _mm512_mul_ps(pv, _mm512_loadu_ps(vdt + (size_t)g * 16));
        q8pv_quant2(w0, w0, q8pv_max2(w0, w0), qq, ss, 0);
        memcpy(q + 16 * g, qq, 16);
        sc[g] = ss[0];
    }
}

/* Values of keys t0 .. t0 + 3 (row t at v + t * hd; rows >= nv are taken as
 * zero), dims [d0, d0 + 16 NV) (NV 4: a 64-dim chunk, 2: the last 32 dims),
 * as x[i]: dims d0 + 16 i .. + 16, one dword per dim holding the 4 keys'
 * bytes (the u8 x s8 operand of vpdpbusd). */
Q8PV_INLINE void q8pv_quad_avx512(const int8_t *v, int hd, int d0, int nv, __m512i x[4], const int NV) {
    __m512i r[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        const int8_t *p = v + (size_t)t * hd + d0;
        if (t >= nv) r[t] = _mm512_setzero_si512();
        else if (NV == 4) r[t] = _mm512_loadu_si512((const void *)p);
        else r[t] = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
    }
    const __m512i p1lo = _mm512_load_si512((const void *)q8pv_perm[0]), p2lo = _mm512_load_si512((const void *)q8pv_perm[2]),
                  p2hi = _mm512_load_si512((const void *)q8pv_perm[3]);
    const __m512i ab = _mm512_permutex2var_epi8(r[0], p1lo, r[1]), cd = _mm512_permutex2var_epi8(r[2], p1lo, r[3]);
    x[0] = _mm512_permutex2var_epi8(ab, p2lo, cd);
    x[1] = _mm512_permutex2var_epi8(ab, p2hi, cd);
    if (NV == 4) {
        const __m512i p1hi = _mm512_load_si512((const void *)q8pv_perm[1]);
        const __m512i ab1 = _mm512_permutex2var_epi8(r[0], p1hi, r[1]), cd1 = _mm512_permutex2var_epi8(r[2], p1hi, r[3]);
        x[2] = _mm512_permutex2var_epi8(ab1, p2lo, cd1);
        x[3] = _mm512_permutex2var_epi8(ab1, p2hi, cd1);
    }
}

/* ia[i] += the row's weights of keys 4 qi .. 4 qi + 3 (group of dims d0 + 16 i)
 * times x[i]; q: the row's ng x 16 weights (q8pv_weights_avx512). */
Q8PV_INLINE void q8pv_dot_avx512(__m512i ia[4], const uint8_t *q, int d0, int qi, const __m512i x[4], const int NV) {
#pragma GCC unroll 4
    for (int i = 0; i < NV; i++) {
        int32_t w;
        memcpy(&w, q + 16 * ((d0 + 16 * i) / 32) + 4 * qi, 4);
        ia[i] = _mm512_dpbusd_epi32(ia[i], _mm512_set1_epi32(w), x[i]);
    }
}

/* acc[d0 .. d0 + 16 NV) = fma(sc of the dim's group, (float)ia, acc). */
Q8PV_INLINE void q8pv_finish_avx512(float *acc, const __m512i ia[4], const float *sc, int d0, const int NV) {
#pragma GCC unroll 4
    for (int i = 0; i < NV; i++) {
        float *a = acc + d0 + 16 * i;
        _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_set1_ps(sc[(d0 + 16 * i) / 32]), _mm512_cvtepi32_ps(ia[i]),
                                            _mm512_loadu_ps(a)));
    }
}
#endif

#endif
