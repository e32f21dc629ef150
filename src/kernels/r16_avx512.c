/* Q8_0 and Q4_0 R16 weights (r16.c) against ACT_Q8 activations, AVX-512
 * VNNI.
 *
 * A pass takes NG groups of 16 weight rows and NR activation rows. Per block
 * and dword j it loads one weight vector per group (16 rows' dword j: Q8_0
 * values + 128, or for Q4_0 a vector whose low and high nibbles are dwords j
 * and j + 4, split with a mask and a shift) and broadcasts one activation
 * dword per row; each vpdpbusd then adds 16 outputs' 4-element products, so
 * the weights are read once for all rows of the pass and nothing is reduced
 * across lanes. Per block and (row, group) pair: the accumulator starts at
 * -sa (the activation block's sum times the weights' offset, 128 or 8, which
 * takes it out exactly), 8 vpdpbusd, then one convert, multiply and FMA into
 * the output's running sum, in block order: the reference's arithmetic
 * (r16.c), so every output has its bits whatever NR, NG or the batch.
 *
 * Groups are taken NG at a time and each pass of them runs over every
 * activation row, NR at a time: the first pass streams the groups' weights
 * from memory, the others find them in the caches, and all of them together
 * prefetch the next NG groups. */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <string.h>

/* Batches: passes of R16_NR rows x R16_NG groups (8 accumulators, 8 running
 * sums); bench_gemm -H (one thread, Q8_0 weights in cache, 16 and 64 rows)
 * put passes of 6 x 2, 4 x 3, 3 x 3 and 5 x 2 within 0.93-1.04x of it, all
 * at ~60% of the vpdpbusd peak. One row: r16_row. */
enum { R16_NR = 4, R16_NG = 2, REC_Q8 = 16 * sizeof(block_q8_0), REC_Q4 = 16 * sizeof(block_q4_0) };

INLINE __m512i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* A Q4_0 record's vector j as two: its low nibbles (16 rows' dword j) and
 * its high nibbles (dword j + 4). */
INLINE __m512i low_nibbles(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi8(15)); }
INLINE __m512i high_nibbles(__m512i v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15)); }

/* Offset in the activation row's qs of dword j of block k, whose group of 4
 * blocks starts at q0 (act_q8_qs). */
INLINE int64_t act_dword(int64_t q0, int j) { return q0 + 64 * (j >> 2) + 4 * (j & 3); }

/* Groups [0, NG) from gw (group stride gs bytes) x rows a[0 .. NR) over
 * blocks [0, nblk); outputs to y[r] + 16 * g. Q4: Q4_0 records, else Q8_0. */
INLINE void r16_pass(const uint8_t *gw, size_t gs, int64_t nblk, const act_row *a, float *const *y,
                     const char *pf, int pf_lines, const int NR, const int NG, const int Q4) {
    const size_t REC = Q4 ? REC_Q4 : REC_Q8;
    __m512 s[R16_NR][R16_NG];
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++) s[r][g] = _mm512_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        const uint8_t *rec = gw + (size_t)k * REC;
        for (int i = 0; i < pf_lines; i++, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
        const int64_t slot = act_q8_slot(k), q0 = 128 * (k >> 2) + 16 * (k & 3);
        __m512i acc[R16_NR][R16_NG];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const __m512i c = _mm512_set1_epi32(-a[r].sa[slot]);
#pragma GCC unroll 8
            for (int g = 0; g < NG; g++) acc[r][g] = c;
        }
        if (Q4) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m512i xl[R16_NR], xh[R16_NR];
#pragma GCC unroll 8
                for (int r = 0; r < NR; r++) {
                    xl[r] = bcast32(a[r].qs + act_dword(q0, j));
                    xh[r] = bcast32(a[r].qs + act_dword(q0, j + 4));
                }
#pragma GCC unroll 8
                for (int g = 0; g < NG; g++) {
                    const __m512i v = _mm512_loadu_si512(rec + (size_t)g * gs + R16_Q32_QS + 64 * j);
                    const __m512i lo = low_nibbles(v), hi = high_nibbles(v);
#pragma GCC unroll 8
                    for (int r = 0; r < NR; r++) {
                        acc[r][g] = _mm512_dpbusd_epi32(acc[r][g], lo, xl[r]);
                        acc[r][g] = _mm512_dpbusd_epi32(acc[r][g], hi, xh[r]);
                    }
                }
            }
        } else {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m512i x[R16_NR];
#pragma GCC unroll 8
                for (int r = 0; r < NR; r++) x[r] = bcast32(a[r].qs + act_dword(q0, j));
#pragma GCC unroll 8
                for (int g = 0; g < NG; g++) {
                    const __m512i w = _mm512_loadu_si512(rec + (size_t)g * gs + R16_Q32_QS + 64 * j);
#pragma GCC unroll 8
                    for (int r = 0; r < NR; r++) acc[r][g] = _mm512_dpbusd_epi32(acc[r][g], w, x[r]);
                }
            }
        }
        __m512 wd[R16_NG];
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++)
            wd[g] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + (size_t)g * gs)));
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const __m512 da = _mm512_set1_ps(a[r].d[slot]);
#pragma GCC unroll 8
            for (int g = 0; g < NG; g++)
                s[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][g]), _mm512_mul_ps(wd[g], da), s[r][g]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++) _mm512_storeu_ps(y[r] + 16 * g, s[r][g]);
}

/* One activation row (decode) against groups [0, ng) from w: the groups'
 * records are one run of ng * nblk records, read as one stream with every
 * line prefetched KERN_PF_LINE_AHEAD ahead and each 4 KB page touched
 * KERN_PF_AHEAD ahead (kern_pf_pages: without it the stream stalls at each
 * page of a mapping without huge pages; bench_gemm, SmolLM2-135M Q8_0 layer,
 * 2 threads: 0.050 ms with it, 0.058-0.070 without, the file layout's
 * kernel 0.065-0.069). Splitting a block's 8 dots over two accumulators did
 * not change it. */
INLINE void r16_row(const uint8_t *w, int64_t ng, int64_t nblk, const act_row *a, float *y, const int Q4) {
    const size_t REC = Q4 ? REC_Q4 : REC_Q8;
    __m512 s = _mm512_setzero_ps();
    for (int64_t g = 0, k = 0; g < ng; w += REC) {
        kern_pf_pages(w, REC);
        kern_pf_block(w, REC, KERN_PF_LINE_AHEAD);
        const int64_t slot = act_q8_slot(k), q0 = 128 * (k >> 2) + 16 * (k & 3);
        __m512i acc = _mm512_set1_epi32(-a->sa[slot]);
        if (Q4) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512(w + 32 + 64 * j);
                acc = _mm512_dpbusd_epi32(acc, low_nibbles(v), bcast32(a->qs + act_dword(q0, j)));
                acc = _mm512_dpbusd_epi32(acc, high_nibbles(v), bcast32(a->qs + act_dword(q0, j + 4)));
            }
        } else {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(w + 32 + 64 * j), bcast32(a->qs + act_dword(q0, j)));
        }
        const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)w));
        s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(wd, _mm512_set1_ps(a->d[slot])), s);
        if (++k == nblk) {
            _mm512_storeu_ps(y + 16 * g, s);
            s = _mm512_setzero_ps();
            k = 0;
            g++;
        }
    }
}

/* NG groups against every activation row, R16_NR rows at a time. */
INLINE void r16_groups(const uint8_t *gw, size_t gs, int64_t nblk, const void *act, int64_t cols, int nb, float *Y,
                       int64_t ldy, int64_t r0, const int NG, const int Q4) {
    /* the next NG groups (the bytes after these) are prefetched over the
     * passes, spread evenly over their blocks */
    const int64_t passes = (nb + R16_NR - 1) / R16_NR, lines = (int64_t)(NG * gs / 64);
    const int pf_lines = (int)((lines + passes * nblk - 1) / (passes * nblk));
    for (int b = 0; b < nb; b += R16_NR) {
        act_row a[R16_NR];
        float *y[R16_NR];
        const int n = act_pass_rows(act, cols, nb, b, R16_NR, Y, ldy, r0, a, y);
        const char *pf = (const char *)gw + (size_t)NG * gs + (size_t)(b / R16_NR) * (size_t)nblk * pf_lines * 64;
        switch (n) {
        case 4: r16_pass(gw, gs, nblk, a, y, pf, pf_lines, 4, NG, Q4); break;
        case 3: r16_pass(gw, gs, nblk, a, y, pf, pf_lines, 3, NG, Q4); break;
        case 2: r16_pass(gw, gs, nblk, a, y, pf, pf_lines, 2, NG, Q4); break;
        default: r16_pass(gw, gs, nblk, a, y, pf, pf_lines, 1, NG, Q4); break;
        }
    }
}

INLINE void r16_matmul(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb, float *Y,
                       int64_t ldy, const int Q4) {
    const int64_t nblk = cols / 32;
    const size_t gs = (size_t)nblk * (Q4 ? REC_Q4 : REC_Q8);
    int64_t g = r0 / 16;
    const int64_t g1 = r1 / 16;
    const uint8_t *w = W;
    if (nb == 1) {
        const act_row a = act_get_row(ACT_Q8, act, cols, 0);
        kern_pf_start(w + (size_t)g * gs);
        r16_row(w + (size_t)g * gs, g1 - g, nblk, &a, Y + g * 16, Q4);
        return;
    }
    for (; g + R16_NG <= g1; g += R16_NG)
        r16_groups(w + (size_t)g * gs, gs, nblk, act, cols, nb, Y, ldy, g * 16, R16_NG, Q4);
    for (; g < g1; g++) r16_groups(w + (size_t)g * gs, gs, nblk, act, cols, nb, Y, ldy, g * 16, 1, Q4);
}

void kern_matmul_r16_avx512(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                            float *Y, int64_t ldy) {
    if (wtype == QTYPE_Q4_0) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, 1);
    else r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, 0);
}
