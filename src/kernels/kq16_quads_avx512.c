/* Q6_K and Q3_K weights (K-quants with sub-blocks of 16) against small
 * batches of ACT_Q8K activations (quads, kernels_impl.h), AVX-512 VNNI:
 * batched decode, speculative verification and prefill of the K-quant files
 * whose attn_v, ffn_down and output matrices are Q6_K, and of the Q3_K ones.
 *
 * The lane layout is q8_quads_avx512.c's: a vpdpbusd works on 16 (weight
 * row, activation row) pairs at once, 128-bit lane i holding dword j of
 * weight row i of a group of 4 (repeated 4 times), dword b of every lane
 * dword j of activation row b of a quad (one 16-byte broadcast). The 6-bit
 * values q are unsigned, as vpdpbusd wants them, so a sub-block of 16
 * elements is 4 vpdpbusd from a start of -32 * bsums (the offset, exact in
 * int32), and its scale multiplies it in integers (vpmulld):
 *
 *   isum = sum_j sc[j] * (dot(q_j, a_j) - 32 * sum(a_j))
 *
 * is each pair's exact super-block sum in its own lane, and the float work
 * is the per-row kernel's (kernels_avx512.c, mm_kq16_rows) and the
 * reference's (kernels.c, matmul_q6_K_ref): acc[k % 16] = fma((float)isum,
 * d * da, acc[k % 16]) into 16 slot accumulators per pair (on the stack, one
 * load and store per pair and super-block), then q8_reduce16's tree. So every
 * output equals the single-row result bit for bit.
 *
 * Per super-block and group of 4 weight rows: 8 x 3 loads of 32 bytes (ql
 * twice per half, qh once) and the unpacking of 4 x 256 values, shared by
 * the pass's quads; per sub-block the group's 16 scales turn into the
 * sub-block's by one byte shuffle and a shift, the values' dwords by 4
 * vpshufd. Per sub-block and quad: 4 activation broadcasts and the offset's,
 * shared by the groups. Per pair and sub-block: 4 vpdpbusd, a vpmulld and an
 * add. A pass is up to 2 groups x 4 quads (8 pairs: the integer sums and the
 * running sub-block dot of every pair stay in registers), or 1 group x up
 * to 8 quads for a last group of 4 rows.
 *
 * Q3_K takes the same path with its own unpacking. Its values are q = value
 * + 4 in 0..7 (the 2-bit field of qs, + 4 where the hmask bit is set), its
 * 16 scales 6-bit less 32 (q3k_scales16, packed to bytes so that one byte
 * shuffle picks a sub-block's as for Q6_K), and its offset -4 * sum(a_j) is
 * the quads' -32 * sum(a_j) shifted right by 3 (exact):
 *
 *   isum = sum_j (sc[j] - 32) * (dot(q_j, a_j) - 4 * sum(a_j))
 *
 * matmul_q3_K_ref's integer, with the same float steps. The hmask bytes of
 * a group are loaded once per super-block; each block of 32 takes its 32 qs
 * bytes, a shift and a mask, and a masked add of 4. */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"
#include "kernels/quads_avx512.h"

#include <immintrin.h>
#include <string.h>

enum {
    KQ16_MAX_G = 2, /* groups of 4 weight rows per pass */
    KQ16_MAX_P = 8, /* (group, quad) pairs per pass */
};

/* Dword c of each lane's 16 bytes, repeated over the lane. */
#define KQ16_W(v, c)                                                                                         \
    ((c) == 0   ? _mm512_shuffle_epi32(v, _MM_PERM_AAAA)                                                    \
     : (c) == 1 ? _mm512_shuffle_epi32(v, _MM_PERM_BBBB)                                                    \
     : (c) == 2 ? _mm512_shuffle_epi32(v, _MM_PERM_CCCC)                                                    \
                : _mm512_shuffle_epi32(v, _MM_PERM_DDDD))

/* Row i's 16 scales of super-block `b` as int8: Q6_K's as stored, Q3_K's
 * unpacked (q3k_scales16, in -32..31). */
INLINE __m128i kq16_scales8(const char *b, const int T) {
    if (T == QTYPE_Q3_K) return _mm256_cvtepi16_epi8(q3k_scales16(((const block_q3_K *)b)->scales));
    return _mm_loadu_si128((const __m128i *)((const block_q6_K *)b)->scales);
}

/* Block b of 32 of a super-block (elements 32b .. 32b + 31, sub-blocks 2b
 * and 2b + 1) of 4 weight rows from `w`, wrow apart, as unsigned bytes: v[0]
 * lane i holds row i's elements 0-15 of the block, v[1] its 16-31. Field kk =
 * b % 4 of half h = b / 4:
 *   Q6_K: the low nibbles from ql bytes 64h + 32 (kk % 2) .. + 31 (shifted
 *     by 4 for kk >= 2), the high bits from bits 2kk, 2kk + 1 of qh bytes
 *     32h .. 32h + 31;
 *   Q3_K: bits 2kk, 2kk + 1 of qs bytes 32h .. 32h + 31, + 4 where hmask
 *     bit 4h + kk = b is set (hml, hmh: the rows' hmask bytes 0-15, 16-31). */
INLINE void kq16_block_values(const char *w, size_t wrow, int b, __m512i hml, __m512i hmh, __m512i v[2],
                              const int T) {
    const int h = b >> 2, kk = b & 3;
    if (T == QTYPE_Q3_K) {
        const __m128i sh = _mm_cvtsi32_si128(2 * kk);
        const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4), bit = _mm512_set1_epi8((char)(1 << b));
        __m512i ql, qh;
        quads_load32x4((const char *)((const block_q3_K *)w)->qs + 32 * h, wrow, &ql, &qh);
        v[0] = _mm512_and_si512(_mm512_srl_epi16(ql, sh), m3);
        v[1] = _mm512_and_si512(_mm512_srl_epi16(qh, sh), m3);
        v[0] = _mm512_mask_add_epi8(v[0], _mm512_test_epi8_mask(hml, bit), v[0], four);
        v[1] = _mm512_mask_add_epi8(v[1], _mm512_test_epi8_mask(hmh, bit), v[1], four);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m128i nsh = _mm_cvtsi32_si128(4 * (kk >> 1));
    /* qh bits 2kk, 2kk + 1 into bits 4, 5: << (4 - 2kk), or >> 2 for kk = 3
     * (what leaks across bytes lands outside bits 4, 5) */
    const __m128i hl = _mm_cvtsi32_si128(kk == 3 ? 0 : 4 - 2 * kk), hr = _mm_cvtsi32_si128(kk == 3 ? 2 : 0);
    const block_q6_K *w6 = (const block_q6_K *)w;
    __m512i ll, lh, qhl, qhh;
    quads_load32x4((const char *)w6->ql + 64 * h + 32 * (kk & 1), wrow, &ll, &lh);
    quads_load32x4((const char *)w6->qh + 32 * h, wrow, &qhl, &qhh);
    qhl = _mm512_and_si512(_mm512_srl_epi16(_mm512_sll_epi16(qhl, hl), hr), m30);
    qhh = _mm512_and_si512(_mm512_srl_epi16(_mm512_sll_epi16(qhh, hl), hr), m30);
    /* 0xF8: A | (B & C): (high bits & 0x30) | (nibble & 0x0F) */
    v[0] = _mm512_ternarylogic_epi32(qhl, _mm512_srl_epi16(ll, nsh), m4, 0xF8);
    v[1] = _mm512_ternarylogic_epi32(qhh, _mm512_srl_epi16(lh, nsh), m4, 0xF8);
}

/* One super-block k of a pass: NG groups of 4 weight rows (type T) from `w`
 * (row 0's super-block k) against NQ quads at A (quad 0 of super-block k,
 * quads ACT_Q8K_QUAD_SB apart); S: the slot accumulators of slot k % 16. */
INLINE void kq16_superblock(const char *w, size_t wrow, const int8_t *A, __m512 *S, const int NG, const int NQ,
                           const int FIRST, const int T) {
    const __m512i rep = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512i scb[KQ16_MAX_G], isum[KQ16_MAX_P], hml[KQ16_MAX_G], hmh[KQ16_MAX_G];
#pragma GCC unroll 8
    for (int i = 0; i < NG * NQ; i++) isum[i] = _mm512_setzero_si512();
    __m512 dw[KQ16_MAX_G];
#pragma GCC unroll 2
    for (int g = 0; g < NG; g++) {
        const char *b0 = w + (size_t)(4 * g) * wrow, *b1 = b0 + wrow, *b2 = b1 + wrow, *b3 = b2 + wrow;
        /* lane i: row 4g + i's 16 int8 scales */
        __m256i s01 = _mm256_inserti128_si256(_mm256_castsi128_si256(kq16_scales8(b0, T)), kq16_scales8(b1, T), 1);
        __m256i s23 = _mm256_inserti128_si256(_mm256_castsi128_si256(kq16_scales8(b2, T)), kq16_scales8(b3, T), 1);
        scb[g] = _mm512_inserti64x4(_mm512_castsi256_si512(s01), s23, 1);
        /* lane i: row 4g + i's d */
        __m128 d4 = _mm_cvtph_ps(_mm_setr_epi16((short)kq16_d(b0, T), (short)kq16_d(b1, T), (short)kq16_d(b2, T),
                                                (short)kq16_d(b3, T), 0, 0, 0, 0));
        dw[g] = _mm512_permutexvar_ps(rep, _mm512_castps128_ps512(d4));
        /* Q3_K: lane i holds row 4g + i's hmask bytes 0-15 (hml) and 16-31 (hmh) */
        if (T == QTYPE_Q3_K) quads_load32x4((const char *)((const block_q3_K *)b0)->hmask, wrow, &hml[g], &hmh[g]);
        else hml[g] = hmh[g] = _mm512_setzero_si512();
    }
    /* One block of 32 per iteration, not unrolled: unrolled, the compiler
     * hoisted the 16 sub-blocks' scale vectors and spilled them. */
#pragma GCC unroll 1
    for (int b = 0; b < 8; b++) {
        __m512i v[KQ16_MAX_G][2];
#pragma GCC unroll 2
        for (int g = 0; g < NG; g++) kq16_block_values(w + (size_t)(4 * g) * wrow, wrow, b, hml[g], hmh[g], v[g], T);
#pragma GCC unroll 2
        for (int t = 0; t < 2; t++) {
            const int j = 2 * b + t; /* sub-block */
            __m512i sc[KQ16_MAX_G], wj[KQ16_MAX_G][4];
            /* byte j of each lane into byte 3 of its dwords, sign-extended */
            const __m512i pick = _mm512_set1_epi32((int)(((unsigned)j << 24) | 0x808080u));
#pragma GCC unroll 2
            for (int g = 0; g < NG; g++) {
                sc[g] = _mm512_srai_epi32(_mm512_shuffle_epi8(scb[g], pick), 24);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) wj[g][c] = KQ16_W(v[g][t], c);
            }
#pragma GCC unroll 8
            for (int q = 0; q < NQ; q++) {
                const int8_t *aq = A + (size_t)q * ACT_Q8K_QUAD_SB;
                __m512i acc[KQ16_MAX_G];
                __m512i off = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(aq + 64 * 16 + 16 * j)));
                if (T == QTYPE_Q3_K) off = _mm512_srai_epi32(off, 3); /* -4 * sum(a_j) */
#pragma GCC unroll 2
                for (int g = 0; g < NG; g++) acc[g] = off;
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m512i x = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(aq + 16 * (4 * j + c))));
#pragma GCC unroll 2
                    for (int g = 0; g < NG; g++) acc[g] = _mm512_dpbusd_epi32(acc[g], wj[g][c], x);
                }
#pragma GCC unroll 2
                for (int g = 0; g < NG; g++) {
                    __m512i prod = _mm512_mullo_epi32(acc[g], sc[g]);
                    isum[g * NQ + q] = _mm512_add_epi32(isum[g * NQ + q], prod);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int q = 0; q < NQ; q++) {
        __m512 da = _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(A + (size_t)q * ACT_Q8K_QUAD_SB + 64 * 16 + 16 * 16)));
#pragma GCC unroll 2
        for (int g = 0; g < NG; g++) {
            __m512 prev = FIRST ? _mm512_setzero_ps() : S[g * NQ + q];
            S[g * NQ + q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g * NQ + q]), _mm512_mul_ps(dw[g], da), prev);
        }
    }
}

/* NG groups from weight row r against quads q0 .. q0 + NQ; writes Y. */
INLINE void kq16_pass(const char *W, size_t wrow, int64_t nblk, int64_t r, const void *act, int64_t cols, int nb,
                     int q0, const char *pf, size_t pf_step, float *Y, int64_t ldy, const int NG, const int NQ,
                     const int T) {
    __m512 S[16][KQ16_MAX_P], out[KQ16_MAX_P];
    const char *w = W + (size_t)r * wrow;
    const size_t bsz = kq16_block_bytes(T);
    for (int64_t s = nblk; s < 16; s++) /* slots without a super-block stay zero */
        for (int i = 0; i < NG * NQ; i++) S[s][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < nblk; k++, pf += pf_step) {
        const int8_t *A = act_q8k_quad(act, cols, nb, q0, k);
        quads_prefetch(pf, pf_step);
        if (k < 16) kq16_superblock(w + (size_t)k * bsz, wrow, A, S[k & 15], NG, NQ, 1, T);
        else kq16_superblock(w + (size_t)k * bsz, wrow, A, S[k & 15], NG, NQ, 0, T);
    }
    /* q8_reduce16's tree over the slots */
#pragma GCC unroll 8
    for (int i = 0; i < NG * NQ; i++) {
        __m512 v[8];
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) v[t] = _mm512_add_ps(S[t][i], S[t + 8][i]);
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) v[t] = _mm512_add_ps(v[t], v[t + 4]);
        v[0] = _mm512_add_ps(v[0], v[2]);
        v[1] = _mm512_add_ps(v[1], v[3]);
        out[i] = _mm512_add_ps(v[0], v[1]);
    }
    QUADS_STORE(out, r, q0, nb, Y, ldy, NG, NQ);
}

#define KQ16_PASS(NG_, NQ_) kq16_pass(W, wrow, nblk, r, act, cols, nb, q0, pf, pf_step, Y, ldy, NG_, NQ_, T)

/* A pass's rows are read super-block by super-block, as 4-8 short streams
 * that the hardware prefetchers follow poorly (a pass of one quad ran at
 * half the per-row kernel's speed); the pass's rows are contiguous, so the
 * first pass over them prefetches the next pass's rows as one stream, a few
 * lines per super-block (q8_quads_avx512.c does the same). The last group
 * prefetches the rows after the call's range, where the engine's next piece
 * of the matrix starts; a prefetch never faults. */
INLINE void kq16_rows(const void *W, int64_t cols, int64_t r0, int64_t n4, const void *act, int nb, float *Y,
                      int64_t ldy, const int T) {
    const int64_t nblk = cols / QK_K;
    const size_t wrow = qtype_row_bytes(T, cols);
    const int nquads = act_q8_quad_count(nb);
    const char *first = (const char *)W + (size_t)r0 * wrow;
    quads_prefetch(first, (size_t)(4 * (n4 >= 2 ? 2 : 1)) * wrow);
    for (int64_t g = 0; g < n4;) {
        const int ng = n4 - g >= 2 ? 2 : 1;
        const int64_t r = r0 + 4 * g;
        const int max_q = ng == 2 ? 4 : 8;
        const int64_t left = n4 - g - ng;
        const size_t next_bytes = (size_t)(4 * (left == 1 ? 1 : 2)) * wrow;
        for (int q0 = 0, nq; q0 < nquads; q0 += nq) {
            const char *pf = (const char *)W + (size_t)(r + 4 * ng) * wrow;
            size_t pf_step = q0 ? 0 : (next_bytes / (size_t)nblk + 64) & ~(size_t)63;
            nq = nquads - q0 < max_q ? nquads - q0 : max_q;
            if (ng == 2) {
                QUADS_SWITCH4(nq, KQ16_PASS, 2)
            } else {
                QUADS_SWITCH8(nq, KQ16_PASS, 1)
            }
        }
        g += ng;
    }
}

/* Each type its own instantiation (the type a constant in every loop). */
void kern_matmul_kq16_quads_avx512(int wtype, const void *W, int64_t cols, int64_t r0, int64_t n4, const void *act,
                                   int nb, float *Y, int64_t ldy) {
    if (wtype == QTYPE_Q3_K) kq16_rows(W, cols, r0, n4, act, nb, Y, ldy, QTYPE_Q3_K);
    else kq16_rows(W, cols, r0, n4, act, nb, Y, ldy, QTYPE_Q6_K);
}

/* kern_act_q8k_quads_ref with one dword transpose per 16 elements: the
 * 16-byte pieces of the quad's 4 rows side by side (lane b = row b), then
 * vpermd puts dword j of row b at 4j + b. */
void kern_act_q8k_quads_avx512(void *act, int64_t cols, int nb, int q0, int q1) {
    const int64_t nblk = cols / QK_K;
    const __m512i tr = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    for (int q = q0; q < q1; q++) {
        act_row a[ACT_Q8_QUAD];
        int n = act_tile_rows(ACT_Q8K, act, cols, nb, ACT_Q8_QUAD * q, ACT_Q8_QUAD, a);
        const __mmask16 rows = (__mmask16)((1u << (4 * n)) - 1);
        for (int64_t k = 0; k < nblk; k++) {
            int8_t *p = (int8_t *)act_q8k_quad(act, cols, nb, q, k);
            for (int m = 0; m < 16; m++) { /* elements 16m .. 16m + 15 */
                __m512i x = _mm512_setzero_si512();
                for (int i = 0; i < n; i++)
                    x = _mm512_mask_broadcast_i32x4(x, (__mmask16)(0xF << (4 * i)),
                                                    _mm_loadu_si128((const __m128i *)(a[i].qs + QK_K * k + 16 * m)));
                _mm512_storeu_si512((void *)(p + 64 * m), _mm512_permutexvar_epi32(tr, x));
            }
            /* off[j][b] = -32 * bsums[16k + j] of row b: the 4 rows' 16 sums (lane b = row b), transposed */
            int32_t *off = (int32_t *)(p + 64 * 16);
            for (int h = 0; h < 4; h++) { /* sub-blocks 4h .. 4h + 3 */
                __m512i b = _mm512_setzero_si512();
                for (int i = 0; i < n; i++)
                    b = _mm512_mask_broadcast_i32x4(
                        b, (__mmask16)(0xF << (4 * i)),
                        _mm_cvtepi16_epi32(_mm_loadl_epi64((const __m128i *)(a[i].bsums + 16 * k + 4 * h))));
                b = _mm512_maskz_mullo_epi32(rows, b, _mm512_set1_epi32(-32));
                _mm512_storeu_si512((void *)(off + 16 * h), _mm512_permutexvar_epi32(tr, b));
            }
            float *d = (float *)(p + 64 * 16 + 16 * 16);
            for (int i = 0; i < ACT_Q8_QUAD; i++) d[i] = i < n ? a[i].d[k] : 0.0f;
        }
    }
}
