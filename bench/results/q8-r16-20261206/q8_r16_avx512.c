/* Q8_0 weights repacked by 16 rows (QTYPE_Q8_0_R16, quant.h) against ACT_Q8
 * activations, AVX-512 VNNI: one kernel for decode, batched decode,
 * speculative verification and prefill.
 *
 * A vpdpbusd lane holds one weight row of a group of 16: the group's dword
 * j of a block (elements 4j .. 4j + 3 of its 16 rows, stored side by side
 * and already unsigned, w + 128) meets dword j of one activation row,
 * broadcast from memory by the instruction itself. Eight of them leave the
 * 16 rows' whole block dots in the 16 lanes: nothing to shuffle, gather or
 * reduce across lanes, and the 16 block scales come in one load. Per block
 * and activation row: 8 vpdpbusd, then one convert, multiply and FMA for 16
 * outputs.
 *
 * The float steps are the per-row kernels' (kernels_avx512.c):
 *
 *   acc[slot(k)] += (float)dot_k * (dw_k * da_k),   then one 16-slot sum,
 *
 * slot(k) = act_q8_slot(k) % 16 and q8_reduce16's tree. Here a slot is a
 * register of 16 rows rather than a lane: a group's blocks are stored slot
 * by slot (all blocks k with k % 16 = m, in order of k, then m + 1), so a
 * slot's sum is finished before the next starts, and the tree is made of
 * vertical adds. Every output has the bits of kern_matmul on the plain
 * Q8_0 rows, for any batch size and row range (test_kernels). */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <string.h>

enum { R16_NA = 16, R16_RECORD = 544, R16_PF = 4096 }; /* activation rows per pass (accumulators in registers) */

/* The 16 slots' sums of 16 rows by the tree of q8_reduce16:
 * (j, j + 8), (j, j + 4), (j, j + 2), (0, 1). */
INLINE __m512 r16_tree(const __m512 *s) {
    __m512 t[8];
#pragma GCC unroll 16
    for (int j = 0; j < 8; j++) t[j] = _mm512_add_ps(s[j], s[j + 8]);
    for (int j = 0; j < 4; j++) t[j] = _mm512_add_ps(t[j], t[j + 4]);
    for (int j = 0; j < 2; j++) t[j] = _mm512_add_ps(t[j], t[j + 2]);
    return _mm512_add_ps(t[0], t[1]);
}

/* One group of 16 weight rows (its records at g) against activation rows
 * a[0 .. NA): the 16 outputs of row b to y + b * ldy. */
INLINE void r16_group(const char *g, int64_t nblk, const act_row *a, float *y, int64_t ldy, const int NA) {
    __m512 slots[R16_NA][16];
    for (int m = 0; m < 16; m++) {
        __m512 acc[R16_NA];
#pragma GCC unroll 16
        for (int b = 0; b < NA; b++) acc[b] = _mm512_setzero_ps();
        for (int64_t k = m; k < nblk; k += 16, g += R16_RECORD) {
            for (int l = 0; l < R16_RECORD; l += 64) _mm_prefetch(g + R16_PF + l, _MM_HINT_T0);
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
            __m512i w[8];
#pragma GCC unroll 16
            for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512((const void *)(g + 32 + 64 * j));
            const int64_t s = act_q8_slot(k);
            const int64_t q0 = 128 * (k >> 2) + 16 * (k & 3);
#pragma GCC unroll 16
            for (int b = 0; b < NA; b++) {
                const int8_t *qs = a[b].qs + q0;
                __m512i d0 = _mm512_set1_epi32(-a[b].sa[s]), d1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    int32_t lo, hi;
                    memcpy(&lo, qs + 4 * j, 4);
                    memcpy(&hi, qs + 64 + 4 * j, 4);
                    d0 = _mm512_dpbusd_epi32(d0, w[j], _mm512_set1_epi32(lo));
                    d1 = _mm512_dpbusd_epi32(d1, w[j + 4], _mm512_set1_epi32(hi));
                }
                const __m512i dot = _mm512_add_epi32(d0, d1);
                const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(a[b].d[s]));
                acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[b]);
            }
        }
        const int slot = 4 * (m & 3) + (m >> 2);
#pragma GCC unroll 16
        for (int b = 0; b < NA; b++) slots[b][slot] = acc[b];
    }
    for (int b = 0; b < NA; b++) _mm512_storeu_ps(y + b * ldy, r16_tree(slots[b]));
}

void kern_matmul_q8_r16_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                               float *Y, int64_t ldy) {
    const int64_t nblk = cols / 32;
    const size_t gbytes = (size_t)nblk * R16_RECORD;
    for (int64_t r = r0; r < r1; r += 16) {
        const char *g = (const char *)W + (size_t)(r / 16) * gbytes;
        for (int b0 = 0; b0 < nb; b0 += R16_NA) {
            act_row a[R16_NA];
            const int n = nb - b0 < R16_NA ? nb - b0 : R16_NA;
            for (int b = 0; b < n; b++) a[b] = act_get_row(ACT_Q8, act, cols, b0 + b);
            float *y = Y + (int64_t)b0 * ldy + r;
            switch (n) {
            case 1: r16_group(g, nblk, a, y, ldy, 1); break;
            case 2: r16_group(g, nblk, a, y, ldy, 2); break;
            case 3: r16_group(g, nblk, a, y, ldy, 3); break;
            case 4: r16_group(g, nblk, a, y, ldy, 4); break;
            case 5: r16_group(g, nblk, a, y, ldy, 5); break;
            case 6: r16_group(g, nblk, a, y, ldy, 6); break;
            case 7: r16_group(g, nblk, a, y, ldy, 7); break;
            case 8: r16_group(g, nblk, a, y, ldy, 8); break;
            case 9: r16_group(g, nblk, a, y, ldy, 9); break;
            case 10: r16_group(g, nblk, a, y, ldy, 10); break;
            case 11: r16_group(g, nblk, a, y, ldy, 11); break;
            case 12: r16_group(g, nblk, a, y, ldy, 12); break;
            case 13: r16_group(g, nblk, a, y, ldy, 13); break;
            case 14: r16_group(g, nblk, a, y, ldy, 14); break;
            case 15: r16_group(g, nblk, a, y, ldy, 15); break;
            default: r16_group(g, nblk, a, y, ldy, 16); break;
            }
        }
    }
}
