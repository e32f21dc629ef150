/* INT4_G128 matmul, AVX-512 VNNI, with the arithmetic of matmul_int4_g128_ref
 * (kernels.c): exact integer dots per sub-block of 32, weighted by their
 * activation scales into one float per group, then two multiply-adds per
 * group into lane g % 16 of a 16-lane float accumulator, one 16-lane sum per
 * output.
 *
 * A weight row is walked in chunks of 16 groups (1088 bytes). Per group one
 * 64-byte load of its nibbles, split into low (elements 0-63, sub-blocks 0
 * and 1) and high (64-127, sub-blocks 2 and 3) halves; one vpdpbusd each
 * against the activations leaves 16 int32 partial sums per half, 128-bit
 * lanes 0-1 holding the first sub-block of the half and lanes 2-3 the
 * second. The low (and separately the high) partial sums of groups 4k ..
 * 4k+3 go through an unpack tree to T_k, lane 4l + j = the 128-bit lane l's
 * sum of group 4k + j; shuffles of the four T_k's 128-bit lanes and two
 * adds leave the chunk's 16 dots of sub-block 0 and of sub-block 1 (2 and 3
 * from the high halves), each in group order, all in integers, so exact. The chunk's 16 (d, m) pairs come by one gather and
 * two vcvtph2ps; the activations hold each sub-block's 16 scales and the
 * 16 group sums contiguously. The float work per chunk and activation row is
 * then one multiply and five multiply-adds, instead of a horizontal
 * reduction per group.
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

/* From the T_k of one half (low or high nibbles) of the chunk's 4 quads:
 * *s0 lane 4k + j = sum of T_k lanes 0 and 1 (the half's first sub-block of
 * group 4k + j), *s1 the same of lanes 2 and 3 (its second sub-block). */
INLINE void i4_transpose2(__m512i t0, __m512i t1, __m512i t2, __m512i t3, __m512i *s0, __m512i *s1) {
    /* u01: 128-bit lanes (quad 0 first, quad 0 second, quad 1 first, quad 1 second) */
    __m512i u01 = _mm512_add_epi32(_mm512_shuffle_i32x4(t0, t1, 0x88), _mm512_shuffle_i32x4(t0, t1, 0xDD));
    __m512i u23 = _mm512_add_epi32(_mm512_shuffle_i32x4(t2, t3, 0x88), _mm512_shuffle_i32x4(t2, t3, 0xDD));
    *s0 = _mm512_shuffle_i32x4(u01, u23, 0x88);
    *s1 = _mm512_shuffle_i32x4(u01, u23, 0xDD);
}

/* Sum of 16 lanes by the fixed tree (j, j+8), (j, j+4), (j, j+2), (0, 1). */
INLINE float i4_sum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* The partial dots of a quad (groups w[0..3], n of them present) with
 * activation bytes q (the quad's first group): *tl from the low nibbles,
 * *th from the high ones, each reduced by i4_tree. */
INLINE void i4_quad(const __m512i lo[4], const __m512i hi[4], const int8_t *q, int n, __m512i *tl, __m512i *th) {
    __m512i dl[4], dh[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        if (j < n) {
            dl[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[j], _mm512_loadu_si512(q + QK_G128 * j));
            dh[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[j], _mm512_loadu_si512(q + QK_G128 * j + 64));
        } else {
            dl[j] = dh[j] = _mm512_setzero_si512();
        }
    }
    *tl = i4_tree(dl[0], dl[1], dl[2], dl[3]);
    *th = i4_tree(dh[0], dh[1], dh[2], dh[3]);
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

/* acc += the chunk (chunk index c, n groups, low and high T_k) for one
 * activation row, as the reference: per group s = p0 a0, then fma(p_k, a_k,
 * s), then fma(s, d, acc) and fma(gs, m, acc). */
INLINE __m512 i4_apply(__m512 acc, const __m512i tl[4], const __m512i th[4], __m512 dw, __m512 mw, const act_row *a,
                       int64_t c, int n) {
    __mmask16 k = (__mmask16)((1u << n) - 1);
    __m512i p0, p1, p2, p3;
    i4_transpose2(tl[0], tl[1], tl[2], tl[3], &p0, &p1);
    i4_transpose2(th[0], th[1], th[2], th[3], &p2, &p3);
    const float *da = a->d + 64 * c; /* zero past the last group */
    __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(p0), _mm512_loadu_ps(da));
    s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_loadu_ps(da + 16), s);
    s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p2), _mm512_loadu_ps(da + 32), s);
    s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p3), _mm512_loadu_ps(da + 48), s);
    acc = _mm512_mask3_fmadd_ps(s, dw, acc, k);
    return _mm512_mask3_fmadd_ps(_mm512_loadu_ps(a->gs + 16 * c), mw, acc, k);
}

/* One chunk of n groups (n <= 16), chunk index c, of weight row w, for nb
 * activation rows (NB1: nb is 1, known at compile time). */
INLINE void i4_chunk(const block_int4_g128 *w, int64_t c, int n, const act_row *a, int nb, __m512 *acc,
                     const int NB1) {
    __m512i tl[I4_ROWS][4], th[I4_ROWS][4];
    __m512 dw, mw;
    const int64_t g0 = I4_CHUNK * c;
    i4_scales(w + g0, n, &dw, &mw);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        int nk = n - 4 * k;
        nk = nk < 0 ? 0 : nk > 4 ? 4 : nk;
        if (!nk) {
            for (int b = 0; b < (NB1 ? 1 : nb); b++) tl[b][k] = th[b][k] = _mm512_setzero_si512();
            continue;
        }
        __m512i lo[4], hi[4];
        i4_decode(w + g0 + 4 * k, nk, lo, hi);
        for (int b = 0; b < (NB1 ? 1 : nb); b++)
            i4_quad(lo, hi, a[b].qs + QK_G128 * (g0 + 4 * k), nk, &tl[b][k], &th[b][k]);
    }
    for (int b = 0; b < (NB1 ? 1 : nb); b++) acc[b] = i4_apply(acc[b], tl[b], th[b], dw, mw, &a[b], c, n);
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
            if (NB1) kern_pf_lines(w + I4_CHUNK * c, I4_CHUNK * sizeof(block_int4_g128));
            i4_chunk(w, c, I4_CHUNK, a, nb, acc, NB1);
        }
        if (tail) {
            kern_pf_pages(w + I4_CHUNK * nfull, (size_t)tail * sizeof(block_int4_g128));
            if (NB1) kern_pf_lines(w + I4_CHUNK * nfull, (size_t)tail * sizeof(block_int4_g128));
            i4_chunk(w, nfull, tail, a, nb, acc, NB1);
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
