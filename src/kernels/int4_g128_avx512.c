/* INT4_G128 matmul, AVX-512 VNNI, with the arithmetic of matmul_int4_g128_ref
 * (kernels.c): exact integer group dots, then per group two multiply-adds
 * into lane g % 16 of a 16-lane float accumulator, one 16-lane sum per
 * output.
 *
 * A weight row is walked in chunks of 16 groups (1088 bytes). Per group one
 * 64-byte load of its nibbles, split into low (elements 0-63) and high
 * (64-127) halves; two vpdpbusd against the activations leave 16 int32
 * partial sums. The partial sums of groups 4k .. 4k+3 go through an unpack
 * tree to T_k, lane 4l + j = the 128-bit lane l's sum of group 4k + j; a
 * transpose of the four T_k's 128-bit lanes and two adds leave the chunk's
 * 16 group dots in group order, all in integers, so exact. The chunk's 16
 * (d, m) pairs come by one gather and two vcvtph2ps; the activation scales
 * and sums are contiguous per row. The float work per chunk and activation
 * row is then two vector multiply-adds, instead of a horizontal reduction
 * per group.
 *
 * nb > 1: a quad of 4 groups is decoded into registers once and applied to
 * up to I4_ROWS activation rows; their T_k wait in a small stack buffer
 * until the chunk ends. */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>

enum { I4_ROWS = 8, I4_CHUNK = 16 };

/* T, lane 4l + j = sum of 128-bit lane l of w[j] (the q8_tree of
 * kernels_avx512.c). */
INLINE __m512i i4_tree(__m512i w0, __m512i w1, __m512i w2, __m512i w3) {
    __m512i x01 = _mm512_add_epi32(_mm512_unpacklo_epi32(w0, w1), _mm512_unpackhi_epi32(w0, w1));
    __m512i x23 = _mm512_add_epi32(_mm512_unpacklo_epi32(w2, w3), _mm512_unpackhi_epi32(w2, w3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
}

/* Lane 4k + j = sum over 128-bit lanes l of T_k lane 4l + j: the group dots
 * of a chunk in group order. */
INLINE __m512i i4_transpose_sum(__m512i t0, __m512i t1, __m512i t2, __m512i t3) {
    __m512i u01 = _mm512_add_epi32(_mm512_shuffle_i32x4(t0, t1, 0x88), _mm512_shuffle_i32x4(t0, t1, 0xDD));
    __m512i u23 = _mm512_add_epi32(_mm512_shuffle_i32x4(t2, t3, 0x88), _mm512_shuffle_i32x4(t2, t3, 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(u01, u23, 0x88), _mm512_shuffle_i32x4(u01, u23, 0xDD));
}

/* Sum of 16 lanes by the fixed tree (j, j+8), (j, j+4), (j, j+2), (0, 1). */
INLINE float i4_sum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* The dots of quad k (groups w[0..3], n of them present) with activation
 * bytes q (the quad's first group). */
INLINE __m512i i4_quad(const __m512i lo[4], const __m512i hi[4], const int8_t *q, int n) {
    __m512i d[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        if (j < n) {
            __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[j], _mm512_loadu_si512(q + QK_G128 * j));
            d[j] = _mm512_dpbusd_epi32(t, hi[j], _mm512_loadu_si512(q + QK_G128 * j + 64));
        } else {
            d[j] = _mm512_setzero_si512();
        }
    }
    return i4_tree(d[0], d[1], d[2], d[3]);
}

/* Decodes groups w[0 .. n) (n <= 4) of a quad into nibble halves. */
INLINE void i4_decode(const block_int4_g128 *w, int n, __m512i lo[4], __m512i hi[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        if (j < n) {
            __m512i raw = _mm512_loadu_si512(w[j].qs);
            lo[j] = _mm512_and_si512(raw, m4);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        } else {
            lo[j] = hi[j] = _mm512_setzero_si512();
        }
    }
}

/* The chunk's scales and offsets as floats by lane (zero past n groups). */
INLINE void i4_scales(const block_int4_g128 *w, int n, __m512 *dw, __m512 *mw) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)sizeof(block_int4_g128)));
    __mmask16 k = (__mmask16)((1u << n) - 1);
    __m512i dm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, idx, (const void *)w, 1);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
    *mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
}

/* acc += the chunk (first group g0, n groups, dots by lane) for one activation row. */
INLINE __m512 i4_apply(__m512 acc, __m512i dots, __m512 dw, __m512 mw, const act_row *a, int64_t g0, int n) {
    __mmask16 k = (__mmask16)((1u << n) - 1);
    __m512 da = _mm512_maskz_loadu_ps(k, a->d + g0);
    __m512i sa = _mm512_maskz_loadu_epi32(k, a->sa + g0);
    acc = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(dw, da), acc, k);
    return _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(sa), _mm512_mul_ps(mw, da), acc, k);
}

/* One chunk of n groups (n <= 16) starting at group g0 of weight row w, for
 * nb activation rows (NB1: nb is 1, known at compile time). */
INLINE void i4_chunk(const block_int4_g128 *w, int64_t g0, int n, const act_row *a, int nb, __m512 *acc,
                     const int NB1) {
    __m512i t[I4_ROWS][4];
    __m512 dw, mw;
    i4_scales(w + g0, n, &dw, &mw);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        int nk = n - 4 * k;
        nk = nk < 0 ? 0 : nk > 4 ? 4 : nk;
        if (!nk) {
            for (int b = 0; b < (NB1 ? 1 : nb); b++) t[b][k] = _mm512_setzero_si512();
            continue;
        }
        __m512i lo[4], hi[4];
        i4_decode(w + g0 + 4 * k, nk, lo, hi);
        for (int b = 0; b < (NB1 ? 1 : nb); b++) t[b][k] = i4_quad(lo, hi, a[b].qs + QK_G128 * (g0 + 4 * k), nk);
    }
    for (int b = 0; b < (NB1 ? 1 : nb); b++)
        acc[b] = i4_apply(acc[b], i4_transpose_sum(t[b][0], t[b][1], t[b][2], t[b][3]), dw, mw, &a[b], g0, n);
}

INLINE void i4_rows(const void *W, int64_t ng, int64_t r0, int64_t r1, const act_row *a, int nb, float *Y,
                    int64_t ldy, const int NB1) {
    const size_t wrow = (size_t)ng * sizeof(block_int4_g128);
    const int64_t nfull = ng / I4_CHUNK;
    const int tail = (int)(ng % I4_CHUNK);
    kern_pf_start((const char *)W + (size_t)r0 * wrow);
    for (int64_t r = r0; r < r1; r++) {
        const block_int4_g128 *w = (const block_int4_g128 *)W + r * ng;
        __m512 acc[I4_ROWS];
        for (int b = 0; b < (NB1 ? 1 : nb); b++) acc[b] = _mm512_setzero_ps();
        for (int64_t c = 0; c < nfull; c++) {
            kern_pf_pages(w + I4_CHUNK * c, I4_CHUNK * sizeof(block_int4_g128));
            i4_chunk(w, I4_CHUNK * c, I4_CHUNK, a, nb, acc, NB1);
        }
        if (tail) {
            kern_pf_pages(w + I4_CHUNK * nfull, (size_t)tail * sizeof(block_int4_g128));
            i4_chunk(w, I4_CHUNK * nfull, tail, a, nb, acc, NB1);
        }
        for (int b = 0; b < (NB1 ? 1 : nb); b++) Y[(int64_t)b * ldy + r] = i4_sum16(acc[b]);
    }
}

void kern_matmul_int4_g128_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                                  float *Y, int64_t ldy) {
    const int64_t ng = cols / QK_G128;
    for (int b0 = 0; b0 < nb; b0 += I4_ROWS) {
        int bn = nb - b0 < I4_ROWS ? nb - b0 : I4_ROWS;
        act_row a[I4_ROWS];
        for (int i = 0; i < bn; i++) a[i] = act_get_row(ACT_Q8G, act, cols, b0 + i);
        if (bn == 1) i4_rows(W, ng, r0, r1, a, 1, Y + (int64_t)b0 * ldy, ldy, 1);
        else i4_rows(W, ng, r0, r1, a, bn, Y + (int64_t)b0 * ldy, ldy, 0);
    }
}
