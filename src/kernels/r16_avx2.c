/* Q8_0 and Q4_0 R16 weights (r16.c) against ACT_Q8 activations, AVX2 (also
 * AVX-512 machines without VNNI).
 *
 * A record's vector j (16 rows' dword j) is two ymm of 8 rows each. Without
 * vpdpbusd the 4-element products of a lane come from vpmaddubsw (unsigned
 * by signed bytes into int16 pairs) and vpmaddwd against ones (the pairs
 * into int32):
 *   Q8_0: the stored values + 128 become signed again (xor 0x80); |w| times
 *         a * sign(w) keeps each pair within int16 (2 * 128 * 127), and the
 *         sum is the signed dot directly (the accumulator starts at 0, where
 *         the VNNI kernel starts at -128 * sum(a));
 *   Q4_0: the raw nibbles (w + 8, 0..15) against a, low and high nibbles'
 *         pairs added in int16 (2 * 2 * 15 * 127 fits), the accumulator
 *         starting at -sa = -8 * sum(a).
 * Both give the exact int32 block dot of the reference; then per block and
 * output one convert, multiply and FMA into its running sum in block order:
 * the reference's arithmetic (r16.c), so every output has its bits whatever
 * the ISA, the number of activation rows or the split of the rows.
 *
 * One activation row (decode) streams the records of its groups with every
 * line prefetched ahead; batches take one group (16 weight rows) at a time
 * against up to R16_NR activation rows per pass, the group's records staying
 * in L1/L2 between the passes. */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <string.h>

enum { R16_NR = 4, REC_Q8 = 544, REC_Q4 = 288 };

INLINE __m256i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Offset in the activation row's qs of dword j of block k, whose group of 4
 * blocks starts at q0 (act_q8_qs). */
INLINE int64_t act_dword(int64_t q0, int j) { return q0 + 64 * (j >> 2) + 4 * (j & 3); }

/* 8 lanes' 4-element dots of signed weights w against activation dword x. */
INLINE __m256i dot_q8(__m256i aw, __m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

/* 8 lanes' dots of nibbles lo (elements 4j..) and hi (16 + 4j..) against
 * activation dwords xl and xh. */
INLINE __m256i dot_q4(__m256i lo, __m256i hi, __m256i xl, __m256i xh) {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Record rec (one block of 16 weight rows) against NR activation rows:
 * acc[r][h] += the exact int32 dots of rows 8h .. 8h + 7 (the accumulators
 * come in holding the block's starting value). */
INLINE void r16_block(const uint8_t *rec, const act_row *a, int64_t q0, __m256i acc[][2], const int NR, const int Q4) {
    if (Q4) {
        const __m256i m4 = _mm256_set1_epi8(15);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 32 + 64 * j + 32 * h));
                const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#pragma GCC unroll 8
                for (int r = 0; r < NR; r++)
                    acc[r][h] = _mm256_add_epi32(acc[r][h], dot_q4(lo, hi, bcast32(a[r].qs + act_dword(q0, j)),
                                                                   bcast32(a[r].qs + act_dword(q0, j + 4))));
            }
        }
        return;
    }
    const __m256i flip = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rec + 32 + 64 * j + 32 * h)), flip);
            const __m256i aw = _mm256_abs_epi8(w);
#pragma GCC unroll 8
            for (int r = 0; r < NR; r++)
                acc[r][h] = _mm256_add_epi32(acc[r][h], dot_q8(aw, w, bcast32(a[r].qs + act_dword(q0, j))));
        }
    }
}

/* s[h] = fma((float)acc[h], dw[h] * da, s[h]) for the record's scales. */
INLINE void r16_scale_add(const uint8_t *rec, float da, const __m256i acc[2], __m256 s[2]) {
    const __m256 d = _mm256_set1_ps(da);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 16 * h)));
        s[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h]), _mm256_mul_ps(dw, d), s[h]);
    }
}

/* One activation row against groups [0, ng) from w: one stream of ng * nblk
 * records, every line prefetched KERN_PF_LINE_AHEAD ahead and each page
 * touched KERN_PF_AHEAD ahead. */
INLINE void r16_row(const uint8_t *w, int64_t ng, int64_t nblk, const act_row *a, float *y, const int Q4) {
    const size_t REC = Q4 ? REC_Q4 : REC_Q8;
    __m256 s[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0, k = 0; g < ng; w += REC) {
        kern_pf_pages(w, REC);
        kern_pf_block(w, REC);
        const int64_t slot = act_q8_slot(k), q0 = 128 * (k >> 2) + 16 * (k & 3);
        const __m256i c = Q4 ? _mm256_set1_epi32(-a->sa[slot]) : _mm256_setzero_si256();
        __m256i acc[1][2] = {{c, c}};
        r16_block(w, a, q0, acc, 1, Q4);
        r16_scale_add(w, a->d[slot], acc[0], s);
        if (++k == nblk) {
            _mm256_storeu_ps(y + 16 * g, s[0]);
            _mm256_storeu_ps(y + 16 * g + 8, s[1]);
            s[0] = s[1] = _mm256_setzero_ps();
            k = 0;
            g++;
        }
    }
}

/* One group (records gw[0 .. nblk)) against activation rows a[0 .. NR);
 * outputs to y[r][0 .. 16). The next group's lines (pf, pf_lines a block)
 * are prefetched on the way. */
INLINE void r16_pass(const uint8_t *gw, int64_t nblk, const act_row *a, float *const *y, const char *pf, int pf_lines,
                     const int NR, const int Q4) {
    const size_t REC = Q4 ? REC_Q4 : REC_Q8;
    __m256 s[R16_NR][2];
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) s[r][0] = s[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        const uint8_t *rec = gw + (size_t)k * REC;
        for (int i = 0; i < pf_lines; i++, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
        const int64_t slot = act_q8_slot(k), q0 = 128 * (k >> 2) + 16 * (k & 3);
        __m256i acc[R16_NR][2];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const __m256i c = Q4 ? _mm256_set1_epi32(-a[r].sa[slot]) : _mm256_setzero_si256();
            acc[r][0] = acc[r][1] = c;
        }
        r16_block(rec, a, q0, acc, NR, Q4);
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) r16_scale_add(rec, a[r].d[slot], acc[r], s[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
        _mm256_storeu_ps(y[r], s[r][0]);
        _mm256_storeu_ps(y[r] + 8, s[r][1]);
    }
}

/* One group against every activation row, R16_NR rows at a time. */
INLINE void r16_group(const uint8_t *gw, size_t gs, int64_t nblk, const void *act, int64_t cols, int nb, float *Y,
                      int64_t ldy, int64_t r0, const int Q4) {
    /* the next group (the bytes after this one) is prefetched over the
     * passes, spread evenly over their blocks */
    const int64_t passes = (nb + R16_NR - 1) / R16_NR, lines = (int64_t)(gs / 64);
    const int pf_lines = (int)((lines + passes * nblk - 1) / (passes * nblk));
    for (int b = 0; b < nb; b += R16_NR) {
        act_row a[R16_NR];
        float *y[R16_NR];
        const int n = act_pass_rows(act, cols, nb, b, R16_NR, Y, ldy, r0, a, y);
        const char *pf = (const char *)gw + gs + (size_t)(b / R16_NR) * (size_t)nblk * pf_lines * 64;
        switch (n) {
        case 4: r16_pass(gw, nblk, a, y, pf, pf_lines, 4, Q4); break;
        case 3: r16_pass(gw, nblk, a, y, pf, pf_lines, 3, Q4); break;
        case 2: r16_pass(gw, nblk, a, y, pf, pf_lines, 2, Q4); break;
        default: r16_pass(gw, nblk, a, y, pf, pf_lines, 1, Q4); break;
        }
    }
}

INLINE void r16_matmul(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb, float *Y,
                       int64_t ldy, const int Q4) {
    const int64_t nblk = cols / 32;
    const size_t gs = (size_t)nblk * (Q4 ? REC_Q4 : REC_Q8);
    const uint8_t *w = W;
    if (nb == 1) {
        const act_row a = act_get_row(ACT_Q8, act, cols, 0);
        kern_pf_start(w + (size_t)(r0 / 16) * gs);
        r16_row(w + (size_t)(r0 / 16) * gs, (r1 - r0) / 16, nblk, &a, Y + r0, Q4);
        return;
    }
    for (int64_t g = r0 / 16; g < r1 / 16; g++) r16_group(w + (size_t)g * gs, gs, nblk, act, cols, nb, Y, ldy, g * 16, Q4);
}

void kern_matmul_r16_avx2(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                          float *Y, int64_t ldy) {
    if (wtype == QTYPE_Q4_0) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, 1);
    else r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, 0);
}
