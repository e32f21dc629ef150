/* Q8_0 / Q4_0 / Q5_0 / Q4_1 / Q5_1 / IQ4_NL / Q4_K / Q5_K / IQ4_XS weights against small batches of ACT_Q8 activations (quads,
 * kernels_impl.h), AVX-512 VNNI: batched decode, speculative verification
 * and prefill.
 *
 * A vpdpbusd works on 16 (weight row, activation row) pairs at once: the
 * 128-bit lane i holds weight row i of a group of 4 (its dword j repeated 4
 * times, an in-lane vpshufd of the rows' 16-byte halves) against, in dword b
 * of every lane, dword j of activation row b of a quad (one 16-byte load
 * broadcast to the 4 lanes). The 8 vpdpbusd of a 32-element block leave each pair's whole block
 * dot in its own lane, so nothing is reduced across lanes, and each weight
 * vector feeds every quad of the batch while each activation load feeds
 * every weight group. Per block and pair the arithmetic is the per-row
 * kernels' (kernels_avx512.c):
 *
 *   dot = sum (w + off) * a - sa          (exact int32; off = 128 or 8)
 *   acc[slot(k)] += (float)dot * (dw * da)  (one FMA)
 *
 * and the 16 slot accumulators meet by q8_reduce16's tree, so every output
 * equals the single-row result bit for bit. The slot accumulators live in a
 * stack buffer (16 rows, one per slot, x up to 16 pairs x 64 bytes = 16 KB),
 * one load and store per pair and block.
 *
 * Per block and group of 4 weight rows the weights cost 4 loads and 6
 * shuffles, the f16 scales 4 scalar loads, shared by all quads; per quad and
 * block the activations cost 8 broadcast loads, shared by the pass's groups;
 * each group pays one vpshufd per dword of the block, shared by the pass's
 * quads, and each pair a convert, multiply and FMA per 8 vpdpbusd. A pass is 4 groups x up to 4 quads (16 weight rows x
 * 16 activation rows; 2 groups x 8 quads or 1 x 8 for the last 4-12 rows of
 * a range). On a 2-vCPU Zen 5 guest (bench_gemm -H, weights from cache, one
 * thread) that ran 1.05-1.1x faster than 2 groups x 8 quads at 8-128 rows:
 * each activation broadcast, which costs more than a register shuffle
 * there, feeds 4 vpdpbusd instead of 2. (On an Ice Lake VM 2 x 8 had
 * measured faster, with fewer registers live.) 1-3 rows stay with the
 * per-row kernels, which stream a single row faster.
 *
 * Q4_K, Q5_K and IQ4_XS take the same path as eight blocks of 32 per
 * super-block (kq_block32, iq4xs_block32): block k is sub-block k % 8 of
 * super-block k / 8 (Q4_K's and Q5_K's nibbles the low or high halves of
 * 32 bytes it shares with its neighbour, Q5_K's fifth bits one bit of each
 * qh byte, IQ4_XS's 16 code bytes laid out as an IQ4_NL block's), and its
 * scale (and Q4_K's and Q5_K's minimum) come from a table that each super-block's
 * first block fills for the pass's rows (qd_sb_scales). */
#include "kernels/kernels_impl.h"
#include "kernels/kernels_x86.h"
#include "kernels/quads_avx512.h"

#include <assert.h>
#include <immintrin.h>
#include <string.h>

enum {
    QD_MAX_Q = 8,  /* quads (32 activation rows) per pass */
    QD_MAX_G = 4,  /* groups of 4 weight rows per pass */
    QD_MAX_P = 16, /* (group, quad) pairs per pass: accumulators in registers */
    QD_SEQ_Q = 4,  /* from this many quads a pass keeps its slot accumulators in block order (qd_row_of_block) */
};

/* Weight rows p[0 .. 3] (each at block k, qd_block_at) as unsigned bytes:
 * lo lane i = elements 0-15 of row i, hi lane i = elements 16-31. Q4_K,
 * Q5_K: p is the 32 nibble bytes sub-block k % 8 shares with a neighbour,
 * k's parity picks its nibbles, and Q5_K's fifth bits are bit k % 8 of
 * the super-block's qh; IQ4_XS: p is the sub-block's 16 code bytes. */
INLINE void qd_weights(int wtype, const char *p0, size_t wrow, int64_t k, __m512i *lo, __m512i *hi) {
    const char *p1 = p0 + wrow, *p2 = p1 + wrow, *p3 = p2 + wrow;
    if (wtype == QTYPE_Q4_K || wtype == QTYPE_Q5_K) {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m128i c = _mm_cvtsi32_si128(4 * (int)(k & 1));
        __m512i l, h;
        quads_load32x4(p0, wrow, &l, &h);
        *lo = _mm512_and_si512(_mm512_srl_epi16(l, c), m4);
        *hi = _mm512_and_si512(_mm512_srl_epi16(h, c), m4);
        if (wtype == QTYPE_Q5_K) { /* qh sits 32 bytes before qs */
            const char *qh = p0 - 32 * ((k & 7) >> 1) - 32;
            const __m512i bit = _mm512_set1_epi8((char)(1 << (k & 7))), b16 = _mm512_set1_epi8(0x10);
            quads_load32x4(qh, wrow, &l, &h);
            *lo = _mm512_mask_add_epi8(*lo, _mm512_test_epi8_mask(l, bit), *lo, b16);
            *hi = _mm512_mask_add_epi8(*hi, _mm512_test_epi8_mask(h, bit), *hi, b16);
        }
    } else if (wtype == QTYPE_Q8_0) {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        /* [r0 lo, r0 hi, r1 lo, r1 hi] and the same for rows 2, 3 */
        __m512i z01 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + 2))),
                                         _mm256_loadu_si256((const __m256i *)(p1 + 2)), 1);
        __m512i z23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p2 + 2))),
                                         _mm256_loadu_si256((const __m256i *)(p3 + 2)), 1);
        *lo = _mm512_xor_si512(_mm512_shuffle_i64x2(z01, z23, _MM_SHUFFLE(2, 0, 2, 0)), flip);
        *hi = _mm512_xor_si512(_mm512_shuffle_i64x2(z01, z23, _MM_SHUFFLE(3, 1, 3, 1)), flip);
    } else if (wtype != QTYPE_Q4_0 && wtype != QTYPE_IQ4_NL && wtype != QTYPE_IQ4_XS) {
        /* Q5_0, Q4_1, Q5_1: the nibbles as Q4_0's (the block's last 16
         * bytes); Q5_0, Q5_1: then bit e of row i's high bits (the 4 bytes
         * before them) into byte e of lane i (elements 0-15: lo; 16-31: hi) */
        const int bsz = q32_block_bytes(wtype), qo = bsz - 16, ho = bsz - 20;
        const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
        __m256i y01 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + qo))),
                                              _mm_loadu_si128((const __m128i *)(p1 + qo)), 1);
        __m256i y23 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p2 + qo))),
                                              _mm_loadu_si128((const __m128i *)(p3 + qo)), 1);
        __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(y01), y23, 1);
        *lo = _mm512_and_si512(x, m4);
        *hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        if (wtype != QTYPE_Q4_1) {
            uint32_t h0, h1, h2, h3;
            memcpy(&h0, p0 + ho, 4);
            memcpy(&h1, p1 + ho, 4);
            memcpy(&h2, p2 + ho, 4);
            memcpy(&h3, p3 + ho, 4);
            const uint64_t mlo = (uint64_t)(h0 & 0xFFFF) | (uint64_t)(h1 & 0xFFFF) << 16 |
                                 (uint64_t)(h2 & 0xFFFF) << 32 | (uint64_t)(h3 & 0xFFFF) << 48;
            const uint64_t mhi =
                (uint64_t)(h0 >> 16) | (uint64_t)(h1 >> 16) << 16 | (uint64_t)(h2 >> 16) << 32 | (uint64_t)(h3 >> 16) << 48;
            *lo = _mm512_or_si512(*lo, _mm512_maskz_mov_epi8((__mmask64)mlo, b4));
            *hi = _mm512_or_si512(*hi, _mm512_maskz_mov_epi8((__mmask64)mhi, b4));
        }
    } else {
        /* nibble byte i holds element i (low) and 16 + i (high) */
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const int qo = wtype == QTYPE_IQ4_XS ? 0 : 2;
        __m256i y01 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + qo))),
                                              _mm_loadu_si128((const __m128i *)(p1 + qo)), 1);
        __m256i y23 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p2 + qo))),
                                              _mm_loadu_si128((const __m128i *)(p3 + qo)), 1);
        __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(y01), y23, 1);
        *lo = _mm512_and_si512(x, m4);
        *hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        if (wtype == QTYPE_IQ4_NL || wtype == QTYPE_IQ4_XS) { /* the codes' grid values + 128 */
            const __m512i lut = iq4_lut_u8();
            *lo = _mm512_shuffle_epi8(lut, *lo);
            *hi = _mm512_shuffle_epi8(lut, *hi);
        }
    }
}

/* The f16 block scales of the pass's 4 * NG weight rows at one block, as
 * floats in element 4g + i (row i of group g). Each group's four are packed
 * in a general register (four 2-byte stores read back as one load would
 * stall store forwarding; a vpgatherdd measured slower). */
INLINE uint64_t qd_d4(const char *p, size_t wrow) {
    uint16_t d0, d1, d2, d3;
    memcpy(&d0, p, 2);
    memcpy(&d1, p + wrow, 2);
    memcpy(&d2, p + 2 * wrow, 2);
    memcpy(&d3, p + 3 * wrow, 2);
    return (uint64_t)d0 | (uint64_t)d1 << 16 | (uint64_t)d2 << 32 | (uint64_t)d3 << 48;
}
INLINE __m512 qd_scales(const char *p, size_t wrow, const int NG) {
    __m128i lo = _mm_cvtsi64_si128((long long)qd_d4(p, wrow));
    if (NG == 1) return _mm512_castps128_ps512(_mm_cvtph_ps(lo));
    lo = _mm_insert_epi64(lo, (long long)qd_d4(p + 4 * wrow, wrow), 1);
    if (NG == 2) return _mm512_castps256_ps512(_mm256_cvtph_ps(lo));
    __m128i hi = _mm_cvtsi64_si128((long long)qd_d4(p + 8 * wrow, wrow));
    if (NG == 4) hi = _mm_insert_epi64(hi, (long long)qd_d4(p + 12 * wrow, wrow), 1);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* The super-block types' sub-block scales of super-block sb of the pass's
 * 4 NG rows, computed as the per-row kernel (kernels_avx512.c's q8_decode)
 * computes them: Q4_K's and Q5_K's d sc[j] and minimums -(dmin m[j]) (kq_block32),
 * IQ4_XS's d (ls[j] - 32) (iq4xs_block32). ks[g][0] holds rows 4g and 4g +
 * 1's eight scales, ks[g][1] rows 4g + 2 and 4g + 3's; ks[g][2], ks[g][3]
 * the minimums (qd_sb_pick reads them). Once per super-block, so its 8
 * blocks pay one unpacking of the scale bits per row. */
INLINE void qd_sb_scales(int wtype, const char *sb, size_t wrow, const int NG, __m512 ks[][4]) {
    const __m512i dm_idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i j4 = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 28, 24, 20, 16, 12, 8, 4, 0);
    const __m512i j2 = _mm512_srli_epi32(j4, 1);
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) {
        __m512 f[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const char *b = sb + (size_t)(4 * g + i) * wrow;
            if (wtype == QTYPE_IQ4_XS) { /* ls[j] - 32 (j = 0..7) as floats, times d */
                const block_iq4_xs *x = (const block_iq4_xs *)b;
                uint32_t sl;
                memcpy(&sl, x->scales_l, 4);
                __m512i lo4 = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)sl), j4), _mm512_set1_epi32(15));
                __m512i hi2 = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(x->scales_h), j2), _mm512_set1_epi32(3));
                __m512i ls = _mm512_sub_epi32(_mm512_or_si512(lo4, _mm512_slli_epi32(hi2, 4)), _mm512_set1_epi32(32));
                f[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(ls), _mm512_set1_ps(ellm_f16_to_f32(x->d)));
                continue;
            }
            uint32_t dd;
            memcpy(&dd, b, 4);
            /* sc0-7, m0-7 as floats, times d (sc) and dmin (m); the minimums negated */
            __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4k_scales_vec((const uint8_t *)b + 4)));
            __m512 dm = _mm512_permutexvar_ps(dm_idx, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd))));
            v = _mm512_mul_ps(v, dm);
            f[i] = _mm512_mask_sub_ps(v, (__mmask16)0xFF00, _mm512_setzero_ps(), v);
        }
        ks[g][0] = _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(1, 0, 1, 0));
        ks[g][1] = _mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(1, 0, 1, 0));
        ks[g][2] = _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(3, 2, 3, 2));
        ks[g][3] = _mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(3, 2, 3, 2));
    }
}

/* Q4_K, Q5_K, IQ4_XS: group g's scales (MW = 0) or minimums (MW = 2) of
 * sub-block j, lane i holding row 4g + i's, as qd_scales' permute leaves the
 * other types'. */
INLINE __m512 qd_sb_pick(__m512 ks[][4], int g, int j, const int MW) {
    const __m512i idx = _mm512_add_epi32(_mm512_set_epi32(24, 24, 24, 24, 16, 16, 16, 16, 8, 8, 8, 8, 0, 0, 0, 0),
                                         _mm512_set1_epi32(j));
    return _mm512_permutex2var_ps(ks[g][MW], idx, ks[g][MW + 1]);
}

/* Whether the type's blocks of 32 are sub-blocks of super-blocks of 256
 * whose scales qd_sb_scales unpacks. */
INLINE int qd_super(int wtype) { return wtype == QTYPE_Q4_K || wtype == QTYPE_Q5_K || wtype == QTYPE_IQ4_XS; }

/* Row 0's bytes of block k for qd_weights (Q4_K, Q5_K: sub-block k % 8's nibble
 * bytes in super-block k / 8; IQ4_XS: its code bytes) and, for the other
 * types, its scales for qd_scales. */
INLINE const char *qd_block_at(int wtype, const char *w, int64_t k) {
    if (wtype == QTYPE_Q4_K)
        return w + (k >> 3) * (int64_t)sizeof(block_q4_K) + offsetof(block_q4_K, qs) + 32 * ((k & 7) >> 1);
    if (wtype == QTYPE_Q5_K)
        return w + (k >> 3) * (int64_t)sizeof(block_q5_K) + offsetof(block_q5_K, qs) + 32 * ((k & 7) >> 1);
    if (wtype == QTYPE_IQ4_XS)
        return w + (k >> 3) * (int64_t)sizeof(block_iq4_xs) + offsetof(block_iq4_xs, qs) + 16 * (k & 7);
    return w + k * q32_block_bytes(wtype);
}

/* Dword j of each lane's row, repeated over the lane (immediates spelled
 * out: they must be constants at every optimisation level). */
#define QD_W(lo, hi, j)                                                                                    \
    ((j) == 0   ? _mm512_shuffle_epi32(lo, _MM_PERM_AAAA)                                                  \
     : (j) == 1 ? _mm512_shuffle_epi32(lo, _MM_PERM_BBBB)                                                  \
     : (j) == 2 ? _mm512_shuffle_epi32(lo, _MM_PERM_CCCC)                                                  \
     : (j) == 3 ? _mm512_shuffle_epi32(lo, _MM_PERM_DDDD)                                                  \
     : (j) == 4 ? _mm512_shuffle_epi32(hi, _MM_PERM_AAAA)                                                  \
     : (j) == 5 ? _mm512_shuffle_epi32(hi, _MM_PERM_BBBB)                                                  \
     : (j) == 6 ? _mm512_shuffle_epi32(hi, _MM_PERM_CCCC)                                                  \
                : _mm512_shuffle_epi32(hi, _MM_PERM_DDDD))

/* Where the accumulators of slot t (q8_reduce16's lane t: the blocks k with
 * 4 (k & 3) + ((k & 15) >> 2) = t) are kept in a pass's S. From QD_SEQ_Q
 * quads, block k's at row k & 15, so consecutive blocks load and store
 * consecutive rows of S. In slot order (consecutive blocks 4 rows apart) a
 * pass of 4-7 quads of Q8_0 weights ran up to 1.8x slower on a Zen 5 guest;
 * padding the rows to break 4 KB strides did not help, the order did. With
 * 1-3 quads, row t: there slot order measured ~8% faster. The slots and
 * their sums are the same either way. */
INLINE int qd_row_of_block(int64_t k, const int NQ) {
    return NQ >= QD_SEQ_Q ? (int)(k & 15) : 4 * (int)(k & 3) + (int)((k & 15) >> 2);
}
INLINE int qd_row_of_slot(int t, const int NQ) { return NQ >= QD_SEQ_Q ? 4 * (t & 3) + (t >> 2) : t; }

/* One block k of a pass (see qd_pass) from weight row 0 at w; FIRST: k <
 * 16, the slot starts. ks: the super-block types' scales of k's super-block (qd_sb_scales). */
INLINE void qd_block(int wtype, const char *w, int64_t k, size_t wrow, const int8_t *a, __m512 ks[][4], __m512 *S,
                     const int NG, const int NQ, const int NC, const int FIRST) {
    /* wrow made opaque for each block: otherwise the compiler keeps a
     * pointer per weight row (16 of them), spilled and reloaded every
     * block; this way the rows are addressing modes off one pointer */
    __asm__("" : "+r"(wrow));
    const char *p = qd_block_at(wtype, w, k);
    const int SB = qd_super(wtype);
    __m512i lo[QD_MAX_G], hi[QD_MAX_G], acc[2][QD_MAX_P];
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) qd_weights(wtype, p + (size_t)(4 * g) * wrow, wrow, k, &lo[g], &hi[g]);
    const int MIN = q32_has_min(wtype); /* Q4_1, Q5_1: no offset to take off; the minimum's term after the dot's */
#pragma GCC unroll 8
    for (int q = 0; q < NQ; q++) {
        __m512i nsa = MIN ? _mm512_setzero_si512()
                          : _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + q * ACT_Q8_QUAD_BLOCK + 8 * 16 + 16)));
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            acc[0][g * NQ + q] = nsa;
            if (NC > 1) acc[1][g * NQ + q] = _mm512_setzero_si512();
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const int c = NC > 1 ? (j & 1) : 0;
        __m512i wj[QD_MAX_G];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) wj[g] = QD_W(lo[g], hi[g], j);
#pragma GCC unroll 8
        for (int q = 0; q < NQ; q++) {
            __m512i x = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + q * ACT_Q8_QUAD_BLOCK + 16 * j)));
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) acc[c][g * NQ + q] = _mm512_dpbusd_epi32(acc[c][g * NQ + q], wj[g], x);
        }
    }
    __m512 dws = _mm512_setzero_ps(), mws = _mm512_setzero_ps();
    if (!SB) {
        dws = qd_scales(p, wrow, NG);
        if (MIN) mws = qd_scales(p + 2, wrow, NG);
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) {
        const __m512i rep = _mm512_set_epi32(4 * g + 3, 4 * g + 3, 4 * g + 3, 4 * g + 3, 4 * g + 2, 4 * g + 2,
                                             4 * g + 2, 4 * g + 2, 4 * g + 1, 4 * g + 1, 4 * g + 1, 4 * g + 1,
                                             4 * g, 4 * g, 4 * g, 4 * g);
        __m512 dw = SB ? qd_sb_pick(ks, g, (int)(k & 7), 0) : _mm512_permutexvar_ps(rep, dws);
        __m512 mw = !MIN ? dw : SB ? qd_sb_pick(ks, g, (int)(k & 7), 2) : _mm512_permutexvar_ps(rep, mws);
#pragma GCC unroll 8
        for (int q = 0; q < NQ; q++) {
            __m512 da = _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(a + q * ACT_Q8_QUAD_BLOCK + 8 * 16)));
            __m512i dot = NC > 1 ? _mm512_add_epi32(acc[0][g * NQ + q], acc[1][g * NQ + q]) : acc[0][g * NQ + q];
            __m512 prev = FIRST ? _mm512_setzero_ps() : S[g * NQ + q];
            S[g * NQ + q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, da), prev);
            if (MIN) { /* + sa x mw x da, as - nsa x mw x da */
                __m512i nsa = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + q * ACT_Q8_QUAD_BLOCK + 8 * 16 + 16)));
                S[g * NQ + q] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(nsa), _mm512_mul_ps(mw, da), S[g * NQ + q]);
            }
        }
    }
}

/* NG groups of 4 weight rows from row pointer `w` (block 0) against NQ
 * quads from `A` (quad 0, block 0; blocks kstride bytes apart); writes the
 * sums to out[g * NQ + q] (lane 4i + b: weight row 4g + i, activation row
 * 4q + b). NC (1 or 2) chains per block dot: with few (group, quad) pairs,
 * two chains halve the vpdpbusd latency each block waits for (the integer
 * sum is exact either way). The slot accumulators are kept row-major, a
 * row's pairs side by side (pairs 1 KB apart would alias 4 KB apart); which
 * row holds which slot: qd_row_of_block. */
INLINE void qd_pass(int wtype, const char *w, size_t wrow, int64_t nblk, const int8_t *A, size_t kstride,
                    const char *pf, size_t pf_step, __m512 *out, const int NG, const int NQ, const int NC) {
    __m512 S[16][QD_MAX_P], ks[QD_MAX_G][4] = {{_mm512_setzero_ps()}}; /* the super-block types' (qd_super); zero for the others */
    /* a slot starts at its first block (k < 16); slots without any stay zero */
    if (nblk < 16)
        for (int s = 0; s < 16; s++)
            for (int i = 0; i < NG * NQ; i++) S[s][i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k < nblk && k < 16; k++, pf += pf_step) {
        quads_prefetch(pf, pf_step);
        if (qd_super(wtype) && !(k & 7)) qd_sb_scales(wtype, w + (k >> 3) * (8 * (int64_t)q32_block_bytes(wtype)), wrow, NG, ks);
        qd_block(wtype, w, k, wrow, A + k * kstride, ks, S[qd_row_of_block(k, NQ)], NG, NQ, NC, 1);
    }
    for (; k < nblk; k++, pf += pf_step) {
        quads_prefetch(pf, pf_step);
        if (qd_super(wtype) && !(k & 7)) qd_sb_scales(wtype, w + (k >> 3) * (8 * (int64_t)q32_block_bytes(wtype)), wrow, NG, ks);
        qd_block(wtype, w, k, wrow, A + k * kstride, ks, S[qd_row_of_block(k, NQ)], NG, NQ, NC, 0);
    }
    /* q8_reduce16's tree, lanes now slots; unrolled, so each slot's row is
     * a constant offset (as a loop it took ~20% of a 16-row pass over 576
     * columns) */
#pragma GCC unroll 16
    for (int i = 0; i < NG * NQ; i++) {
        __m512 v[8];
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) v[t] = _mm512_add_ps(S[qd_row_of_slot(t, NQ)][i], S[qd_row_of_slot(t + 8, NQ)][i]);
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) v[t] = _mm512_add_ps(v[t], v[t + 4]);
        v[0] = _mm512_add_ps(v[0], v[2]);
        v[1] = _mm512_add_ps(v[1], v[3]);
        out[i] = _mm512_add_ps(v[0], v[1]);
    }
}

/* One pass: NG groups from weight row r against quads q0 .. q0 + NQ. */
INLINE void qd_run(int wtype, const char *W, size_t wrow, int64_t nblk, int64_t r, const void *act, int64_t cols,
                   int nb, int q0, const char *pf, size_t pf_step, float *Y, int64_t ldy, const int NG, const int NQ) {
    __m512 out[QD_MAX_P];
    const int8_t *A = act_q8_quad(act, cols, nb, q0, 0);
    size_t kstride = (size_t)act_q8_quad_count(nb) * ACT_Q8_QUAD_BLOCK;
    qd_pass(wtype, W + (size_t)r * wrow, wrow, nblk, A, kstride, pf, pf_step, out, NG, NQ, NG * NQ <= 4 ? 2 : 1);
    QUADS_STORE(out, r, q0, nb, Y, ldy, NG, NQ);
}

/* The (groups, quads) shapes: at most QD_MAX_P pairs. */
#define QD_RUN(NG_, NQ_) qd_run(wtype, W, wrow, nblk, r, act, cols, nb, q0, pf, pf_step, Y, ldy, NG_, NQ_)

/* Groups for the next pass with `left` groups of 4 weight rows to go. */
static int qd_ng(int64_t left) { return left >= 4 ? 4 : left >= 2 ? 2 : 1; }

INLINE void qd_rows_of(const int wtype, const char *W, size_t wrow, int64_t nblk, int64_t r, int ng, const void *act,
                    int64_t cols, int nb, const char *pf_next, size_t pf_bytes, float *Y, int64_t ldy) {
    const int nquads = act_q8_quad_count(nb), max_q = QD_MAX_P / ng < QD_MAX_Q ? QD_MAX_P / ng : QD_MAX_Q;
    for (int q0 = 0, nq; q0 < nquads; q0 += nq) {
        /* the first pass spreads the next group's lines over its blocks */
        const char *pf = q0 || !pf_next ? W : pf_next;
        size_t pf_step = q0 || !pf_next ? 0 : (pf_bytes / (size_t)nblk + 64) & ~(size_t)63;
        nq = nquads - q0 < max_q ? nquads - q0 : max_q;
        if (ng == 4) {
            QUADS_SWITCH4(nq, QD_RUN, 4)
        } else if (ng == 2) {
            QUADS_SWITCH8(nq, QD_RUN, 2)
        } else {
            QUADS_SWITCH8(nq, QD_RUN, 1)
        }
    }
}

/* qd_rows_of with the weight type a constant, so that each type's passes
 * carry none of the other types' branches: with the type a variable, Q8_0
 * and Q4_0 batches of 4-64 rows ran 1.12-1.21x slower (bench_gemm -H, one
 * thread, 2-vCPU Zen 5 guest); the price is compile time (~2 minutes for
 * this file). */
static void qd_rows(int wtype, const char *W, size_t wrow, int64_t nblk, int64_t r, int ng, const void *act,
                    int64_t cols, int nb, const char *pf_next, size_t pf_bytes, float *Y, int64_t ldy) {
#define QD_TYPE(T)                                                                                          \
    case T: qd_rows_of(T, W, wrow, nblk, r, ng, act, cols, nb, pf_next, pf_bytes, Y, ldy); return;
#if defined(__SANITIZE_ADDRESS__)
    /* sanitizer builds: one instantiation with the type a variable (the same
     * code and memory accesses; nine of them took over 15 minutes to compile
     * with -fsanitize=address,undefined) */
    qd_rows_of(wtype, W, wrow, nblk, r, ng, act, cols, nb, pf_next, pf_bytes, Y, ldy);
#else
    switch (wtype) {
        QD_TYPE(QTYPE_Q8_0)
        QD_TYPE(QTYPE_Q4_0)
        QD_TYPE(QTYPE_Q5_0)
        QD_TYPE(QTYPE_Q4_1)
        QD_TYPE(QTYPE_Q5_1)
        QD_TYPE(QTYPE_IQ4_NL)
        QD_TYPE(QTYPE_Q4_K)
        QD_TYPE(QTYPE_Q5_K)
        QD_TYPE(QTYPE_IQ4_XS)
    default: assert(!"a weight type with quads (act_q8_has_quads) is missing from qd_rows"); return;
    }
#endif
#undef QD_TYPE
}

/* A group reads its 4-16 rows block by block, as many short streams that
 * the hardware prefetchers follow poorly; the group's rows are contiguous,
 * so while one group computes, the next one's bytes are prefetched as one
 * stream, a few lines per block. The last group prefetches the 16 rows that
 * follow the call's range: a caller that walks a matrix in consecutive
 * pieces (the engine's matmul launches) then finds its next piece's first
 * group on the way instead of waiting for it at the call's start. A
 * prefetch never faults, so rows past the matrix's end cost only the
 * lines. */
void kern_matmul_q8_quads_avx512(int wtype, const void *W, int64_t cols, int64_t r0, int64_t n4, const void *act,
                                 int nb, float *Y, int64_t ldy) {
    const int bsz = q32_block_bytes(wtype);
    const int64_t nblk = cols / 32;
    const size_t wrow = (size_t)nblk * (size_t)bsz;
    const char *w = W;
    int ng = qd_ng(n4);
    quads_prefetch(w + (size_t)r0 * wrow, (size_t)(4 * ng) * wrow);
    for (int64_t g = 0; g < n4;) {
        int64_t r = r0 + 4 * g;
        int64_t left = n4 - g - ng;
        int ng_next = left > 0 ? qd_ng(left) : 0;
        qd_rows(wtype, w, wrow, nblk, r, ng, act, cols, nb, w + (size_t)(r + 4 * ng) * wrow,
                (size_t)(4 * (ng_next ? ng_next : QD_MAX_G)) * wrow, Y, ldy);
        g += ng;
        ng = ng_next;
    }
}

/* kern_act_q8_quads_ref with one dword transpose per half block: the 16-byte
 * halves of a block's 4 rows side by side (lane b = row b, dword j), then
 * vpermd puts dword j of row b at 4j + b. */
void kern_act_q8_quads_avx512(void *act, int64_t cols, int nb, int q0, int q1) {
    const int64_t nblk = cols / 32;
    const __m512i tr = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    for (int q = q0; q < q1; q++) {
        act_row a[ACT_Q8_QUAD];
        int n = act_tile_rows(ACT_Q8, act, cols, nb, ACT_Q8_QUAD * q, ACT_Q8_QUAD, a);
        for (int64_t k = 0; k < nblk; k++) {
            int8_t *p = (int8_t *)act_q8_quad(act, cols, nb, q, k);
            __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
            __m128 d = _mm_setzero_ps();
            __m128i nsa = _mm_setzero_si128();
            int64_t slot = act_q8_slot(k);
            for (int i = 0; i < n; i++) {
                lo = _mm512_mask_broadcast_i32x4(lo, (__mmask16)(0xF << (4 * i)),
                                                 _mm_loadu_si128((const __m128i *)(a[i].qs + act_q8_qs(k, 0))));
                hi = _mm512_mask_broadcast_i32x4(hi, (__mmask16)(0xF << (4 * i)),
                                                 _mm_loadu_si128((const __m128i *)(a[i].qs + act_q8_qs(k, 16))));
            }
            for (int i = 0; i < n; i++) {
                float di = a[i].d[slot];
                int32_t si = -a[i].sa[slot];
                memcpy((char *)&d + 4 * i, &di, 4);
                memcpy((char *)&nsa + 4 * i, &si, 4);
            }
            _mm512_storeu_si512((void *)p, _mm512_permutexvar_epi32(tr, lo));
            _mm512_storeu_si512((void *)(p + 64), _mm512_permutexvar_epi32(tr, hi));
            _mm_storeu_ps((float *)(p + 8 * 16), d);
            _mm_storeu_si128((__m128i *)(p + 8 * 16 + 16), nsa);
        }
    }
}
