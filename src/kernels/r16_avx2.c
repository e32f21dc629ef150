/* Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1, Q4_K, Q5_K and IQ4_XS R16 weights
 * (r16.c) against ACT_Q8 activations, AVX2 (also AVX-512 machines without
 * VNNI, and all but Q8_0 and Q4_0 on every AVX-512 machine).
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
 *   Q4_1: Q4_0's step, the accumulator starting at 0, and its minimum
 *         times sa = sum(a) per block, as Q5_1's;
 *   Q5_0, Q5_1: Q4_0's step on the 5-bit values (0..31: 2 * 2 * 31 * 127
 *         fits), the fifth bits set in from the record's regrouped qh
 *         (one vpshufb spreads a dword's 8 bits to its 4 bytes); Q5_0's
 *         accumulator starts at -sa = -16 * sum(a), Q5_1's at 0, and
 *         Q5_1 adds its minimum times sa = sum(a) per block;
 *   Q4_K: the nibbles (0..15) against a, the int16 pairs of a sub-block's
 *         8 dwords added in int16 (8 * 2 * 15 * 127 fits), then vpmaddwd
 *         against the row's sub-block scale in both halves of its lane:
 *         sc * the sub-block's dot in int32, with no extra multiply;
 *   Q5_K: the same with the fifth bit set in (0..31), 4 dwords at a time in
 *         int16 (4 * 2 * 31 * 127 fits), two vpmaddwd per sub-block.
 *   IQ4_NL: a Q4_0 record whose nibbles are looked up in iq4_values by
 *         vpshufb (signed, -127..113), then as Q8_0: |w| times a * sign(w),
 *         each dword's pairs into int32 on their own;
 *   IQ4_XS: each sub-block as an IQ4_NL block.
 * All give the exact int32 block dot of the reference; then per block and
 * output one convert, multiply and FMA into its running sum in block order
 * (Q4_K, Q5_K: a convert and an FMA per sub-block into the super-block's sum, one
 * FMA per sub-block for the minimums, two per super-block into the running
 * sum): the reference's arithmetic (r16.c), so every output has its bits
 * whatever the ISA, the number of activation rows or the split of the rows.
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

/* Record bytes: 16 blocks (r16.c); offsets inside a record: kernels_impl.h. */
enum {
    R16_NR = 4,
    REC_Q8 = 16 * sizeof(block_q8_0),
    REC_Q4 = 16 * sizeof(block_q4_0),
    REC_Q41 = 16 * sizeof(block_q4_1),
    REC_Q5 = 16 * sizeof(block_q5_0),
    REC_Q51 = 16 * sizeof(block_q5_1),
    REC_Q4K = 16 * sizeof(block_q4_K),
    REC_Q5K = 16 * sizeof(block_q5_K),
    REC_IQ4XS = 16 * sizeof(block_iq4_xs),
};

/* The record kinds (kernel template parameter K). */
enum { KIND_Q8 = 0, KIND_Q4 = 1, KIND_Q4K = 2, KIND_Q5K = 3, KIND_IQ4XS = 4, KIND_IQ4NL = 5, KIND_Q5 = 6, KIND_Q51 = 7, KIND_Q41 = 8 };
#define REC_BYTES(K)                                                                                                   \
    ((K) == KIND_IQ4XS                      ? REC_IQ4XS                                                                \
     : (K) == KIND_Q5                       ? REC_Q5                                                                   \
     : (K) == KIND_Q51                      ? REC_Q51                                                                  \
     : (K) == KIND_Q41                      ? REC_Q41                                                                  \
     : (K) == KIND_Q5K                      ? REC_Q5K                                                                  \
     : (K) == KIND_Q4K                      ? REC_Q4K                                                                  \
     : (K) == KIND_Q4 || (K) == KIND_IQ4NL ? REC_Q4                                                                   \
                                            : REC_Q8)
#define KIND_SUPER(K) ((K) == KIND_Q4K || (K) == KIND_Q5K || (K) == KIND_IQ4XS) /* records of 256 elements */
/* Kinds whose accumulator starts at -sa (unsigned values: Q4_0's w + 8, Q5_0's w + 16). */
#define KIND_OFFSET(K) ((K) == KIND_Q4 || (K) == KIND_Q5)
/* Q5_0's and Q5_1's regrouped fifth bits and nibble dwords. */
#define Q5_H(K) ((K) == KIND_Q51 ? R16_Q51_H : R16_Q50_H)
#define Q5_QS(K) (Q5_H(K) + R16_Q5_QS_AFTER_H)
/* Kinds with a minimum per block (w = d * q + m), at R16_MINS. */
#define KIND_MIN(K) ((K) == KIND_Q41 || (K) == KIND_Q51)
/* Q4_0's, IQ4_NL's and Q4_1's nibble dwords. */
#define Q4_QS(K) ((K) == KIND_Q41 ? R16_Q41_QS : R16_Q32_QS)

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

/* 8 lanes' dots of unsigned values lo (elements 4j..) and hi (16 + 4j..),
 * at most 31, against activation dwords xl and xh. */
INLINE __m256i dot_q4(__m256i lo, __m256i hi, __m256i xl, __m256i xh) {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* A vector v of IQ4 codes (8 rows' dword c of a block of 32: elements
 * 4c .. 4c + 3 in the low nibbles, 16 + 4c .. in the high ones) against NR
 * activation rows (that block's dwords from q0): acc[r * stride] += the 8
 * rows' exact int32 dots, the codes looked up by vpshufb and multiplied as
 * Q8_0's (|w| times a * sign(w)). IQ4_NL's blocks and IQ4_XS's sub-blocks. */
INLINE void iq4_codes_dot(__m256i v, const act_row *a, int64_t q0, int c, __m256i *acc, const int stride,
                          const int NR) {
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_values));
    const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
    const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    const __m256i alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
        const __m256i pl = _mm256_maddubs_epi16(alo, _mm256_sign_epi8(bcast32(a[r].qs + act_dword(q0, c)), lo));
        const __m256i ph = _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(bcast32(a[r].qs + act_dword(q0, c + 4)), hi));
        acc_add_epi32(&acc[r * stride], _mm256_madd_epi16(pl, ones));
        acc_add_epi32(&acc[r * stride], _mm256_madd_epi16(ph, ones));
    }
}

/* Record rec (one block of 16 weight rows) against NR activation rows:
 * acc[r][h] += the exact int32 dots of rows 8h .. 8h + 7 (the accumulators
 * come in holding the block's starting value). */
INLINE void r16_block(const uint8_t *rec, const act_row *a, int64_t q0, __m256i acc[][2], const int NR, const int K) {
    if (K == KIND_IQ4NL) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
                iq4_codes_dot(_mm256_loadu_si256((const __m256i *)(rec + R16_Q32_QS + 64 * j + 32 * h)), a, q0, j,
                              &acc[0][h], 2, NR);
        return;
    }
    if (K == KIND_Q5 || K == KIND_Q51) {
        const __m256i m4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
        const __m256i bit = _mm256_set1_epi32((int)0x80402010); /* byte b of a lane: 16 << b */
        const __m256i hv[2] = {_mm256_loadu_si256((const __m256i *)(rec + Q5_H(K))),
                               _mm256_loadu_si256((const __m256i *)(rec + Q5_H(K) + 32))};
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            /* byte j of every lane (its fifth bits: elements 4j + b at bit b,
             * 16 + 4j + b at bit 4 + b) into all 4 bytes of the lane */
            const __m256i ctl = _mm256_add_epi32(_mm256_set1_epi32(j * 0x01010101),
                                                 _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404,
                                                                   0x08080808, 0x0C0C0C0C));
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i x = _mm256_shuffle_epi8(hv[h], ctl);
                const __m256i lo5 = _mm256_min_epu8(_mm256_and_si256(_mm256_slli_epi16(x, 4), bit), sixteen);
                const __m256i hi5 = _mm256_min_epu8(_mm256_and_si256(x, bit), sixteen);
                const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + Q5_QS(K) + 64 * j + 32 * h));
                const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), lo5);
                const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), hi5);
#pragma GCC unroll 8
                for (int r = 0; r < NR; r++)
                    acc[r][h] = _mm256_add_epi32(acc[r][h], dot_q4(lo, hi, bcast32(a[r].qs + act_dword(q0, j)),
                                                                   bcast32(a[r].qs + act_dword(q0, j + 4))));
            }
        }
        return;
    }
    if (K == KIND_Q4 || K == KIND_Q41) {
        const __m256i m4 = _mm256_set1_epi8(15);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + Q4_QS(K) + 64 * j + 32 * h));
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
            const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rec + R16_Q32_QS + 64 * j + 32 * h)), flip);
            const __m256i aw = _mm256_abs_epi8(w);
#pragma GCC unroll 8
            for (int r = 0; r < NR; r++)
                /* in order (acc_add_epi32): tree-summed, the 4 x 16 partial dots of a 4-row
                 * pass went to the stack (59 references); Q4_0's half as many stay as they are
                 * (0.94-0.99x pinned) */
                acc_add_epi32(&acc[r][h], dot_q8(aw, w, bcast32(a[r].qs + act_dword(q0, j))));
        }
    }
}

/* s[h] = fma((float)acc[h], dw[h] * da, s[h]) for the record's scales (Q4_1, Q5_1:
 * then s[h] = fma((float)sa, mw[h] * da, s[h]) with its minimums); da and sa
 * are activation row a's for block slot `slot`. */
INLINE void r16_scale_add(const uint8_t *rec, const act_row *a, int64_t slot, const __m256i acc[2], __m256 s[2],
                          const int K) {
    const __m256 d = _mm256_set1_ps(a->d[slot]);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 16 * h)));
        s[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h]), _mm256_mul_ps(dw, d), s[h]);
        if (KIND_MIN(K)) {
            const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + R16_MINS + 16 * h)));
            s[h] = _mm256_fmadd_ps(_mm256_set1_ps((float)a->sa[slot]), _mm256_mul_ps(mw, d), s[h]);
        }
    }
}

/* A Q4_K or Q5_K record's 6-bit scales and mins of rows 8h .. 8h + 7, one row per
 * 32-bit lane (q4k_scale_min's unpacking, 4 bytes at a time): sub-blocks
 * 0..3 (lo) and 4..7 (hi), byte j % 4 of a lane that of sub-block j. */
typedef struct {
    __m256i sc_lo, sc_hi, m_lo, m_hi;
} q4k_scales8;

INLINE q4k_scales8 q4k_scales(const uint8_t *rec, int h) {
    const __m256i d0 = _mm256_loadu_si256((const __m256i *)(rec + R16_KQ_SC + 32 * h));
    const __m256i d1 = _mm256_loadu_si256((const __m256i *)(rec + R16_KQ_SC + 64 + 32 * h));
    const __m256i d2 = _mm256_loadu_si256((const __m256i *)(rec + R16_KQ_SC + 128 + 32 * h));
    const __m256i m6 = _mm256_set1_epi8(63), m4 = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
    q4k_scales8 s;
    s.sc_lo = _mm256_and_si256(d0, m6);
    s.m_lo = _mm256_and_si256(d1, m6);
    s.sc_hi = _mm256_or_si256(_mm256_and_si256(d2, m4), _mm256_and_si256(_mm256_srli_epi32(d0, 2), top));
    s.m_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(d2, 4), m4), _mm256_and_si256(_mm256_srli_epi32(d1, 2), top));
    return s;
}

/* Byte b (0..3) of every 32-bit lane into both int16 halves of the lane
 * (pair 1) or into the lane as an int32 (pair 0): byte shuffles, by
 * [pair][b]. */
#define Z (char)0x80
#define LANE_PAIR(b) (b), Z, (b), Z, 4 + (b), Z, 4 + (b), Z, 8 + (b), Z, 8 + (b), Z, 12 + (b), Z, 12 + (b), Z
#define LANE_INT(b) (b), Z, Z, Z, 4 + (b), Z, Z, Z, 8 + (b), Z, Z, Z, 12 + (b), Z, Z, Z
static const char q4k_lane_masks[2][4][16] __attribute__((aligned(16))) = {
    {{LANE_INT(0)}, {LANE_INT(1)}, {LANE_INT(2)}, {LANE_INT(3)}},
    {{LANE_PAIR(0)}, {LANE_PAIR(1)}, {LANE_PAIR(2)}, {LANE_PAIR(3)}},
};
#undef LANE_PAIR
#undef LANE_INT
#undef Z

INLINE __m256i q4k_lane_byte(__m256i v, int b, int pair) {
    return _mm256_shuffle_epi8(v, _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)q4k_lane_masks[pair][b])));
}

/* An activation row's scales da and sums times scales sada (the
 * reference's (float)sa * da) of the 8 blocks of 32 of super-block k, read
 * once for both halves of a record, in slot order: block 8k + j at
 * Q4K_ACT(j) (act_q8_slot puts blocks j and j + 4 side by side). */
typedef struct {
    float da[8], sada[8];
} q4k_act_sb;
#define Q4K_ACT(j) (2 * ((j) & 3) + ((j) >> 2))

/* The 32-bit values at x[0], x[1], x[4], x[5], x[8], x[9], x[12], x[13]. */
INLINE __m256i q4k_slot_pairs(const void *x) {
    const char *c = x;
    const __m128i lo = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)c), _mm_loadl_epi64((const __m128i *)(c + 16)));
    const __m128i hi =
        _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(c + 32)), _mm_loadl_epi64((const __m128i *)(c + 48)));
    return _mm256_set_m128i(hi, lo);
}

INLINE void q4k_act(const act_row *a, int64_t k, q4k_act_sb *out, const int NR) {
    /* blocks 8k + j and 8k + j + 4 (j < 4) sit at slots p + 4j and p + 4j + 1 */
    const int64_t p = act_q8_slot(8 * k);
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
        const __m256 d = _mm256_castsi256_ps(q4k_slot_pairs(a[r].d + p));
        const __m256i sa = q4k_slot_pairs(a[r].sa + p);
        _mm256_storeu_ps(out[r].da, d);
        _mm256_storeu_ps(out[r].sada, _mm256_mul_ps(_mm256_cvtepi32_ps(sa), d));
    }
}

/* Rows 8h .. 8h + 7 of Q4_K (Q5 0) or Q5_K (Q5 1) record rec (super-block
 * k) against activation rows a[0 .. NR) (as: their q4k_act): s[r][h]
 * carries row r's 8 running sums. */
INLINE void q4k_half(const uint8_t *rec, int h, int64_t k, const act_row *a, const q4k_act_sb *as, __m256 s[][2],
                     const int NR, const int Q5) {
    const q4k_scales8 sc = q4k_scales(rec, h);
    const __m256i m4 = _mm256_set1_epi8(15);
    const uint8_t *qs = rec + (Q5 ? R16_Q5K_QS : R16_Q4K_QS);
    const int8_t *qa[R16_NR]; /* the super-block's activations (act_q8_qs: its blocks are groups 2k, 2k + 1) */
    __m256 acc[R16_NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
        qa[r] = a[r].qs + 256 * k;
        acc[r] = _mm256_setzero_ps();
    }
#pragma GCC unroll 1
    for (int p = 0; p < 4; p++) {
        /* blocks 8k + 2p and + 1: group 2k + p / 2, places 2 (p % 2) and + 1 */
        const int64_t q0 = 128 * (p >> 1) + 32 * (p & 1);
        const __m256i sc0 = q4k_lane_byte(p < 2 ? sc.sc_lo : sc.sc_hi, (2 * p) & 3, 1);
        const __m256i sc1 = q4k_lane_byte(p < 2 ? sc.sc_lo : sc.sc_hi, (2 * p + 1) & 3, 1);
        __m256i lo16[R16_NR], hi16[R16_NR], lo32[R16_NR], hi32[R16_NR];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) lo16[r] = hi16[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * (8 * p + c) + 32 * h));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (Q5) { /* bits 2p and 2p + 1 of the elements' qh bytes, moved to bit 4 */
                const __m256i hv = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(rec + R16_Q5K_QH + 64 * c + 32 * h)),
                                                    _mm_cvtsi32_si128(2 * p));
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hv, _mm256_set1_epi8(1)), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(hv, _mm256_set1_epi8(2)), 3));
            }
            const int64_t e = q0 + 64 * (c >> 2) + 4 * (c & 3); /* act_q8_qs(8k + 2p, 4c) - 256k */
#pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                /* saturating adds (none saturates: 8 * 2 * 15 * 127 and
                 * 4 * 2 * 31 * 127 < 32768) keep gcc from reassociating the
                 * sums into a tree that spills */
                lo16[r] = _mm256_adds_epi16(lo16[r], _mm256_maddubs_epi16(lo, bcast32(qa[r] + e)));
                hi16[r] = _mm256_adds_epi16(hi16[r], _mm256_maddubs_epi16(hi, bcast32(qa[r] + e + 16)));
            }
            if (Q5 && c == 3) /* the first half of the sub-blocks' dots, scaled, in int32 */
#pragma GCC unroll 8
                for (int r = 0; r < NR; r++) {
                    lo32[r] = _mm256_madd_epi16(lo16[r], sc0);
                    hi32[r] = _mm256_madd_epi16(hi16[r], sc1);
                    lo16[r] = hi16[r] = _mm256_setzero_si256();
                }
        }
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            __m256i i0 = _mm256_madd_epi16(lo16[r], sc0), i1 = _mm256_madd_epi16(hi16[r], sc1);
            if (Q5) {
                i0 = _mm256_add_epi32(i0, lo32[r]);
                i1 = _mm256_add_epi32(i1, hi32[r]);
            }
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_broadcast_ss(&as[r].da[Q4K_ACT(2 * p)]), acc[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_broadcast_ss(&as[r].da[Q4K_ACT(2 * p + 1)]), acc[r]);
        }
    }
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 16 * h)));
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
        s[r][h] = _mm256_fmadd_ps(acc[r], dv, s[r][h]);
        acc[r] = _mm256_setzero_ps();
    }
    /* the minimums: sum_j m[j] * sada[j], then times -dmin */
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m256 mf = _mm256_cvtepi32_ps(q4k_lane_byte(j < 4 ? sc.m_lo : sc.m_hi, j & 3, 0));
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) acc[r] = _mm256_fmadd_ps(mf, _mm256_broadcast_ss(&as[r].sada[Q4K_ACT(j)]), acc[r]);
    }
    const __m256 ndmin =
        _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + R16_MINS + 16 * h))), _mm256_set1_ps(-0.0f));
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) s[r][h] = _mm256_fmadd_ps(acc[r], ndmin, s[r][h]);
}

/* Rows 8h .. 8h + 7 of IQ4_XS record rec (super-block k) against activation
 * rows a[0 .. NR): each sub-block j a block of 32 of scale (float)(ls[j] -
 * 32) * d per row, into s[r][h] as r16_scale_add does. */
INLINE void iq4xs_half(const uint8_t *rec, int h, int64_t k, const act_row *a, __m256 s[][2], const int NR) {
    const __m256i sl = _mm256_loadu_si256((const __m256i *)(rec + R16_IQ4XS_SL + 32 * h));
    const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(rec + R16_IQ4XS_SH + 16 * h)));
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 16 * h)));
#pragma GCC unroll 1
    for (int j = 0; j < 8; j++) {
        const int64_t kb = 8 * k + j, q0 = 128 * (kb >> 2) + 16 * (kb & 3);
        /* the 8 rows' ls[j] - 32: nibble j of scales_l, bits 2j, 2j + 1 of scales_h */
        const __m128i nj = _mm_cvtsi32_si128(4 * j), hj = _mm_cvtsi32_si128(2 * j);
        const __m256i ls = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi32(sl, nj), _mm256_set1_epi32(15)),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(sh, hj), _mm256_set1_epi32(3)), 4));
        const __m256 dw = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))), d);
        __m256i acc[R16_NR];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            iq4_codes_dot(_mm256_loadu_si256((const __m256i *)(rec + R16_IQ4XS_QS + 64 * (4 * j + c) + 32 * h)), a, q0,
                          c, acc, 1, NR);
        const int64_t slot = act_q8_slot(kb);
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++)
            s[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), _mm256_mul_ps(dw, _mm256_set1_ps(a[r].d[slot])), s[r][h]);
    }
}

/* One activation row against groups [0, ng) of kind K from w: one stream of
 * ng * nblk records, every line prefetched KERN_PF_LINE_AHEAD_AVX2 ahead (a Q4_K
 * or Q5_K record's in two halves) and each page touched KERN_PF_AHEAD
 * ahead. */
INLINE void r16_row(const uint8_t *w, int64_t ng, int64_t nblk, const act_row *a, float *y, const int K) {
    const size_t REC = REC_BYTES(K);
    __m256 s[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0, k = 0; g < ng; w += REC) {
        kern_pf_pages(w, REC);
        if (K == KIND_IQ4XS) {
            kern_pf_block(w, REC / 2, KERN_PF_LINE_AHEAD_AVX2);
            iq4xs_half(w, 0, k, a, &s, 1);
            kern_pf_block(w + REC / 2, REC / 2, KERN_PF_LINE_AHEAD_AVX2);
            iq4xs_half(w, 1, k, a, &s, 1);
        } else if (KIND_SUPER(K)) {
            q4k_act_sb as;
            kern_pf_block(w, REC / 2, KERN_PF_LINE_AHEAD_AVX2);
            q4k_act(a, k, &as, 1);
            q4k_half(w, 0, k, a, &as, &s, 1, K == KIND_Q5K);
            kern_pf_block(w + REC / 2, REC / 2, KERN_PF_LINE_AHEAD_AVX2);
            q4k_half(w, 1, k, a, &as, &s, 1, K == KIND_Q5K);
        } else {
            kern_pf_block(w, REC, KERN_PF_LINE_AHEAD_AVX2);
            const int64_t slot = act_q8_slot(k), q0 = 128 * (k >> 2) + 16 * (k & 3);
            const __m256i c = KIND_OFFSET(K) ? _mm256_set1_epi32(-a->sa[slot]) : _mm256_setzero_si256();
            __m256i acc[1][2] = {{c, c}};
            r16_block(w, a, q0, acc, 1, K);
            r16_scale_add(w, a, slot, acc[0], s, K);
        }
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
                     const int NR, const int K) {
    const size_t REC = REC_BYTES(K);
    __m256 s[R16_NR][2];
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) s[r][0] = s[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nblk; k++) {
        const uint8_t *rec = gw + (size_t)k * REC;
        for (int i = 0; i < pf_lines; i++, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
        if (K == KIND_IQ4XS) {
            iq4xs_half(rec, 0, k, a, s, NR);
            iq4xs_half(rec, 1, k, a, s, NR);
            continue;
        }
        if (KIND_SUPER(K)) {
            q4k_act_sb as[R16_NR];
            q4k_act(a, k, as, NR);
            q4k_half(rec, 0, k, a, as, s, NR, K == KIND_Q5K);
            q4k_half(rec, 1, k, a, as, s, NR, K == KIND_Q5K);
            continue;
        }
        const int64_t slot = act_q8_slot(k), q0 = 128 * (k >> 2) + 16 * (k & 3);
        __m256i acc[R16_NR][2];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const __m256i c = KIND_OFFSET(K) ? _mm256_set1_epi32(-a[r].sa[slot]) : _mm256_setzero_si256();
            acc[r][0] = acc[r][1] = c;
        }
        r16_block(rec, a, q0, acc, NR, K);
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) r16_scale_add(rec, &a[r], slot, acc[r], s[r], K);
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
        _mm256_storeu_ps(y[r], s[r][0]);
        _mm256_storeu_ps(y[r] + 8, s[r][1]);
    }
}

/* One group against every activation row, R16_NR rows at a time. */
INLINE void r16_group(const uint8_t *gw, size_t gs, int64_t nblk, const void *act, int64_t cols, int nb, float *Y,
                      int64_t ldy, int64_t r0, const int K) {
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
        case 4: r16_pass(gw, nblk, a, y, pf, pf_lines, 4, K); break;
        case 3: r16_pass(gw, nblk, a, y, pf, pf_lines, 3, K); break;
        case 2: r16_pass(gw, nblk, a, y, pf, pf_lines, 2, K); break;
        default: r16_pass(gw, nblk, a, y, pf, pf_lines, 1, K); break;
        }
    }
}

INLINE void r16_matmul(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb, float *Y,
                       int64_t ldy, const int K) {
    const int64_t nblk = cols / (KIND_SUPER(K) ? 256 : 32);
    const size_t gs = (size_t)nblk * REC_BYTES(K);
    const uint8_t *w = W;
    if (nb == 1) {
        const act_row a = act_get_row(ACT_Q8, act, cols, 0);
        kern_pf_start(w + (size_t)(r0 / 16) * gs);
        r16_row(w + (size_t)(r0 / 16) * gs, (r1 - r0) / 16, nblk, &a, Y + r0, K);
        return;
    }
    for (int64_t g = r0 / 16; g < r1 / 16; g++) r16_group(w + (size_t)g * gs, gs, nblk, act, cols, nb, Y, ldy, g * 16, K);
}

void kern_matmul_r16_avx2(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                          float *Y, int64_t ldy) {
    if (wtype == QTYPE_IQ4_XS) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, KIND_IQ4XS);
    else if (wtype == QTYPE_Q5_0) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, KIND_Q5);
    else if (wtype == QTYPE_Q5_1) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, KIND_Q51);
    else if (wtype == QTYPE_Q4_1) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, KIND_Q41);
    else if (wtype == QTYPE_IQ4_NL) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, KIND_IQ4NL);
    else if (wtype == QTYPE_Q5_K) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, KIND_Q5K);
    else if (wtype == QTYPE_Q4_K) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, KIND_Q4K);
    else if (wtype == QTYPE_Q4_0) r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, KIND_Q4);
    else r16_matmul(W, cols, r0, r1, act, nb, Y, ldy, KIND_Q8);
}
