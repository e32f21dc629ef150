/* Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1, Q4_K, Q5_K and IQ4_XS weights interleaved by 16 rows (kernels.h, "R16"):
 * the layouts, their packer, row reader and scalar reference, and the
 * dispatch.
 *
 * Group g (rows 16g .. 16g + 15) takes the bytes its 16 rows take in the
 * file's layout, block after block (super-block after super-block for
 * Q4_K, Q5_K and IQ4_XS); block k of the group is one record:
 *
 *   Q8_0, 544 bytes:
 *     f16 d[16]          row i's scale of block k
 *     uint8 q[8][16][4]  q[j][i] = elements 4j .. 4j + 3 of row i, each + 128
 *   Q4_0, 288 bytes:
 *     f16 d[16]
 *     uint8 q[4][16][4]  q[j][i] = bytes 4j .. 4j + 3 of row i's block: low
 *                        nibbles elements 4j .. 4j + 3, high nibbles
 *                        16 + 4j .. 16 + 4j + 3, each + 8 (as in the file)
 *   IQ4_NL, 288 bytes: Q4_0's, the nibbles codes of iq4_values
 *   Q4_1, 320 bytes: f16 d[16], f16 m[16] (row i's minimum), then Q4_0's q
 *   Q5_0, 352 bytes:
 *     f16 d[16]
 *     uint32 h[16]       row i's fifth bits (the block's qh) regrouped by
 *                        nibble dword: byte j holds those of elements
 *                        4j .. 4j + 3 in bits 0..3 and of 16 + 4j ..
 *                        16 + 4j + 3 in bits 4..7 (q5_h_of_qh)
 *     uint8 q[4][16][4]  as Q4_0's (the low 4 bits of each value)
 *   Q5_1, 384 bytes: f16 d[16], f16 m[16] (row i's minimum), then Q5_0's
 *     h and q
 *   Q4_K, 2304 bytes (a super-block of 256 elements):
 *     f16 d[16], f16 dmin[16]
 *     uint8 sc[3][16][4]     sc[j][i] = bytes 4j .. 4j + 3 of row i's 12
 *                            packed scale bytes (q4k_scale_min)
 *     uint8 q[4][8][16][4]   q[p][c][i] = bytes 32p + 4c .. 32p + 4c + 3 of
 *                            row i's qs: low nibbles elements 4c .. 4c + 3
 *                            of sub-block 2p, high nibbles those of
 *                            sub-block 2p + 1 (as in the file)
 *   Q5_K, 2816 bytes: Q4_K's d, dmin and sc, then
 *     uint8 qh[8][16][4]     qh[c][i] = bytes 4c .. 4c + 3 of row i's qh
 *                            (bit j: the fifth bit of element 4c .. 4c + 3
 *                            of sub-block j)
 *     uint8 q[4][8][16][4]   as Q4_K's
 *   IQ4_XS, 2176 bytes (a super-block of 256 elements):
 *     f16 d[16], uint16 scales_h[16]
 *     uint8 sl[16][4]        row i's scales_l
 *     uint8 q[32][16][4]     q[c][i] = bytes 4c .. 4c + 3 of row i's qs:
 *                            dwords 4j .. 4j + 3 are sub-block j's codes as a
 *                            Q4_0 block's nibbles (as in the file)
 *
 * so vector j of a record is a dword of the block for 16 rows, one row per
 * 32-bit lane (for Q4_0 after splitting the nibbles): a vpdpbusd against one
 * broadcast activation dword makes 16 outputs' partial dots with no
 * reduction across lanes, and one weight vector serves every activation row
 * of a batch.
 *
 * Every output accumulates its blocks in order, one fused multiply-add each:
 *
 *   isum = sum_i w_i * a_i                    (exact int32)
 *   s    = fma((float)isum, dw * da, s)       (k = 0, 1, ...)
 *
 * (Q4_1 and Q5_1, whose w = d * q + m: then s = fma((float)sa, m * da, s) for the
 * minimum, with sa = sum_i a_i the block's activation sum, ACT_Q8's),
 *
 * (IQ4_XS: each sub-block j of 32 as such a block, with w_i = iq4_values[code]
 * and dw = (float)(ls[j] - 32) * d, exact), and a Q4_K or Q5_K output its
 * super-blocks, each in three sums over its
 * sub-blocks of 32 (j = 0..7, with the row's d, dmin, sc[j] and m[j] and
 * the sub-block's activation scale da_j and sum sa_j = sum_i a_i):
 *
 *   isum_j = sc[j] * sum_i q_i * a_i           (exact int32; q = 0..15, 0..31)
 *   acc    = fma((float)isum_j, da_j, acc)     (j = 0..7, from 0)
 *   s      = fma(acc, d, s)
 *   macc   = fma((float)m[j], (float)sa_j * da_j, macc)   (j = 0..7, from 0)
 *   s      = fma(macc, -dmin, s)
 *
 * with the file layout's activations (ACT_Q8: a scale per 32), so an R16
 * Q4_K or Q5_K output is as close to the exact dot as the file layout's. This is
 * what this reference computes and what the SIMD kernels compute, for any
 * number of activation rows: a row of a batch equals the same row alone,
 * and both equal the reference, bit for bit. */
#include "core/cpu.h"
#include "kernels/kernels.h"
#include "kernels/kernels_impl.h"
#include "kernels/quant.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { R16_ROWS = 16 };

int kern_r16_type(int wtype) {
    return wtype == QTYPE_Q8_0 || wtype == QTYPE_Q4_0 || wtype == QTYPE_Q4_1 || wtype == QTYPE_IQ4_NL ||
           wtype == QTYPE_Q5_0 || wtype == QTYPE_Q5_1 || wtype == QTYPE_Q4_K || wtype == QTYPE_Q5_K ||
           wtype == QTYPE_IQ4_XS;
}

/* Q4_K and Q5_K: super-blocks of 256, scales and minimums per 32. */
static int r16_kq(int wtype) { return wtype == QTYPE_Q4_K || wtype == QTYPE_Q5_K; }
/* Records of a super-block of 256 (Q4_K, Q5_K, IQ4_XS). */
static int r16_super(int wtype) { return r16_kq(wtype) || wtype == QTYPE_IQ4_XS; }
static int r16_q5(int wtype) { return wtype == QTYPE_Q5_0 || wtype == QTYPE_Q5_1; }
/* The types only the AVX2 kernel reads (the others have a VNNI one too). */
static int r16_avx2_only(int wtype) {
    return r16_super(wtype) || wtype == QTYPE_IQ4_NL || wtype == QTYPE_Q4_1 || r16_q5(wtype);
}

/* The SIMD kernel for the active ISA and wtype: AVX-512 VNNI, else AVX2
 * (also on AVX-512 without VNNI, and for the types r16_avx2_only lists);
 * NULL under the scalar ISA. */
typedef void (*r16_kernel)(int, const void *, int64_t, int64_t, int64_t, const void *, int, float *, int64_t);

static r16_kernel r16_simd(int wtype) {
    const ellm_isa isa = ellm_cpu_isa();
    if (isa == ELLM_ISA_AVX512 && ellm_cpu()->avx512vnni && !r16_avx2_only(wtype)) return kern_matmul_r16_avx512;
    if (isa == ELLM_ISA_AVX512 || isa == ELLM_ISA_AVX2) return kern_matmul_r16_avx2;
    return NULL;
}

int kern_r16_fast(void) { return r16_simd(QTYPE_Q8_0) != NULL; }

/* Q4_1, IQ4_NL, Q5_0, Q5_1, Q4_K, Q5_K and IQ4_XS have an AVX2 kernel only; with AVX-512 VNNI
 * the file layout's AVX-512 kernels stay the choice for them. */
int kern_r16_packs(int wtype) {
    if (!kern_r16_type(wtype) || !kern_r16_fast()) return 0;
    return !r16_avx2_only(wtype) || !(ellm_cpu_isa() == ELLM_ISA_AVX512 && ellm_cpu()->avx512vnni);
}

/* Elements of a block (of a record). */
static int64_t blk_elems(int wtype) { return r16_super(wtype) ? QK_K : 32; }

/* Bytes of a record: 16 rows' scales and quants of one block. */
static size_t rec_bytes(int wtype) { return R16_ROWS * (size_t)qtype_get(wtype)->block_bytes; }

/* Row bytes of the file's layout, which a group keeps. */
static size_t file_row_bytes(int wtype, int64_t nblk) { return (size_t)nblk * rec_bytes(wtype) / R16_ROWS; }

/* Q5_0's and Q5_1's record offsets (kernels_impl.h): the regrouped fifth
 * bits, the nibble dwords. */
static size_t q5_h(int wtype) { return wtype == QTYPE_Q5_1 ? R16_Q51_H : R16_Q50_H; }
static size_t q5_qs(int wtype) { return q5_h(wtype) + R16_Q5_QS_AFTER_H; }

/* A Q5_0 / Q5_1 block's qh regrouped by nibble dword (byte j: bits 4j ..
 * 4j + 3 of qh, then bits 16 + 4j .. 16 + 4j + 3), and back. */
static uint32_t q5_h_of_qh(uint32_t qh) {
    uint32_t h = 0;
    for (int j = 0; j < 4; j++) h |= (((qh >> 4 * j) & 0xF) | ((qh >> (16 + 4 * j)) & 0xF) << 4) << 8 * j;
    return h;
}
static uint32_t q5_qh_of_h(uint32_t h) {
    uint32_t qh = 0;
    for (int j = 0; j < 4; j++) qh |= ((h >> 8 * j) & 0xF) << 4 * j | ((h >> (8 * j + 4)) & 0xF) << (16 + 4 * j);
    return qh;
}

/* Moves block k of row i between the file's layout (at b) and its record:
 * into the record when pack, else back out of it (b then receives the
 * block as the file had it). Q8_0's quants are stored + 128 (their sign bits
 * flipped), which the move undoes on the way back. */
static inline __attribute__((always_inline)) void move_block(int wtype, uint8_t *rec, int i, uint8_t *b, int pack) {
#define MOVE(roff, boff, n) (pack ? memcpy(rec + (roff), b + (boff), (n)) : memcpy(b + (boff), rec + (roff), (n)))
    MOVE(2 * i, 0, 2); /* every block starts with its f16 scale */
    if (r16_kq(wtype)) { /* Q4_K and Q5_K share d, dmin and scales */
        const size_t qs = wtype == QTYPE_Q5_K ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
        const size_t rqs = wtype == QTYPE_Q5_K ? R16_Q5K_QS : R16_Q4K_QS;
        MOVE(R16_MINS + 2 * i, offsetof(block_q4_K, dmin), 2);
        for (int j = 0; j < 3; j++) MOVE(R16_KQ_SC + 64 * j + 4 * i, offsetof(block_q4_K, scales) + 4 * j, 4);
        if (wtype == QTYPE_Q5_K)
            for (int c = 0; c < 8; c++) MOVE(R16_Q5K_QH + 64 * c + 4 * i, offsetof(block_q5_K, qh) + 4 * c, 4);
        for (int c = 0; c < 32; c++) MOVE(rqs + 64 * c + 4 * i, qs + 4 * c, 4);
    } else if (wtype == QTYPE_IQ4_XS) {
        MOVE(R16_IQ4XS_SH + 2 * i, offsetof(block_iq4_xs, scales_h), 2);
        MOVE(R16_IQ4XS_SL + 4 * i, offsetof(block_iq4_xs, scales_l), 4);
        for (int c = 0; c < 32; c++) MOVE(R16_IQ4XS_QS + 64 * c + 4 * i, offsetof(block_iq4_xs, qs) + 4 * c, 4);
    } else if (r16_q5(wtype)) {
        const size_t qh = wtype == QTYPE_Q5_1 ? offsetof(block_q5_1, qh) : offsetof(block_q5_0, qh);
        if (wtype == QTYPE_Q5_1) MOVE(R16_MINS + 2 * i, offsetof(block_q5_1, m), 2);
        uint32_t v;
        if (pack) {
            memcpy(&v, b + qh, 4);
            v = q5_h_of_qh(v);
            memcpy(rec + q5_h(wtype) + 4 * i, &v, 4);
        } else {
            memcpy(&v, rec + q5_h(wtype) + 4 * i, 4);
            v = q5_qh_of_h(v);
            memcpy(b + qh, &v, 4);
        }
        for (int j = 0; j < 4; j++) MOVE(q5_qs(wtype) + 64 * j + 4 * i, qh + 4 + 4 * j, 4);
    } else if (wtype == QTYPE_Q4_1) {
        MOVE(R16_MINS + 2 * i, offsetof(block_q4_1, m), 2);
        for (int j = 0; j < 4; j++) MOVE(R16_Q41_QS + 64 * j + 4 * i, offsetof(block_q4_1, qs) + 4 * j, 4);
    } else if (wtype == QTYPE_Q4_0 || wtype == QTYPE_IQ4_NL) { /* d, then the 16 nibble bytes in both */
        _Static_assert(offsetof(block_q4_0, qs) == offsetof(block_iq4_nl, qs), "Q4_0 and IQ4_NL blocks alike");
        for (int j = 0; j < 4; j++) MOVE(R16_Q32_QS + 64 * j + 4 * i, offsetof(block_q4_0, qs) + 4 * j, 4);
    } else {
        for (int j = 0; j < 8; j++) {
            uint8_t *at = pack ? rec + R16_Q32_QS + 64 * j + 4 * i : b + offsetof(block_q8_0, qs) + 4 * j;
            MOVE(R16_Q32_QS + 64 * j + 4 * i, offsetof(block_q8_0, qs) + 4 * j, 4);
            uint32_t v;
            memcpy(&v, at, 4);
            v ^= 0x80808080u;
            memcpy(at, &v, 4);
        }
    }
#undef MOVE
}

int kern_r16_pack(int wtype, void *dst, const void *src, int64_t rows, int64_t cols) {
    if (!kern_r16_type(wtype) || rows <= 0 || rows % R16_ROWS || cols <= 0 || cols % blk_elems(wtype)) return -1;
    const int64_t nblk = cols / blk_elems(wtype);
    const size_t rb = file_row_bytes(wtype, nblk), blk = rb / (size_t)nblk, rec = rec_bytes(wtype);
    uint8_t *tmp = dst == src ? malloc(R16_ROWS * rb) : NULL;
    if (dst == src && !tmp) return -1;
    for (int64_t g = 0; g < rows / R16_ROWS; g++) {
        uint8_t *grp = (uint8_t *)dst + (size_t)g * R16_ROWS * rb;
        const uint8_t *in = (const uint8_t *)src + (size_t)g * R16_ROWS * rb;
        if (tmp) in = memcpy(tmp, grp, R16_ROWS * rb);
        for (int64_t k = 0; k < nblk; k++)
            for (int i = 0; i < R16_ROWS; i++) /* (in is only read when packing) */
                move_block(wtype, grp + (size_t)k * rec, i, (uint8_t *)in + (size_t)i * rb + (size_t)k * blk, 1);
    }
    free(tmp);
    return 0;
}

/* Record of block k of the group of row r. */
static const uint8_t *r16_rec(int wtype, const void *W, int64_t nblk, int64_t r, int64_t k) {
    return (const uint8_t *)W + ((size_t)(r / R16_ROWS) * (size_t)nblk + (size_t)k) * rec_bytes(wtype);
}

/* Block k of row r of a packed matrix back in the file's layout, into b
 * (sizeof(block_q5_K) bytes, the largest block). */
_Static_assert(sizeof(block_q5_K) >= sizeof(block_iq4_xs), "the largest block");
static const uint8_t *r16_block_of(int wtype, const void *W, int64_t nblk, int64_t r, int64_t k, uint8_t *b) {
    move_block(wtype, (uint8_t *)r16_rec(wtype, W, nblk, r, k), (int)(r % R16_ROWS), b, 0);
    return b;
}

void kern_r16_row(int wtype, const void *W, int64_t cols, int64_t r, float *dst) {
    const int64_t n = blk_elems(wtype), nblk = cols / n;
    uint8_t b[sizeof(block_q5_K)];
    for (int64_t k = 0; k < nblk; k++) kern_dequantize(wtype, r16_block_of(wtype, W, nblk, r, k, b), dst + k * n, n);
}

/* One output of a Q4_K or Q5_K matrix against one activation row. */
static float r16_kq_dot(int wtype, const void *W, int64_t nsb, int64_t r, const act_row *a) {
    float s = 0;
    for (int64_t k = 0; k < nsb; k++) {
        uint8_t buf[sizeof(block_q5_K)];
        const block_q4_K *h = (const block_q4_K *)r16_block_of(wtype, W, nsb, r, k, buf); /* Q5_K: the same header */
        const uint8_t *qs = wtype == QTYPE_Q5_K ? ((const block_q5_K *)buf)->qs : h->qs;
        const uint8_t *qh = wtype == QTYPE_Q5_K ? ((const block_q5_K *)buf)->qh : NULL;
        float acc = 0, macc = 0;
        for (int j = 0; j < 8; j++) {
            const int64_t kb = 8 * k + j, slot = act_q8_slot(kb);
            int sc, m;
            q4k_scale_min(h->scales, j, &sc, &m);
            int32_t isum = 0;
            for (int e = 0; e < 32; e++) isum += q45k_value(qs, qh, j, e) * a->qs[act_q8_qs(kb, e)];
            acc = fmaf((float)(sc * isum), a->d[slot], acc);
        }
        s = fmaf(acc, ellm_f16_to_f32(h->d), s);
        for (int j = 0; j < 8; j++) {
            const int64_t slot = act_q8_slot(8 * k + j);
            int sc, m;
            q4k_scale_min(h->scales, j, &sc, &m);
            macc = fmaf((float)m, (float)a->sa[slot] * a->d[slot], macc);
        }
        s = fmaf(macc, -ellm_f16_to_f32(h->dmin), s);
    }
    return s;
}

/* One output of an IQ4_XS matrix against one activation row: its sub-blocks
 * as blocks of 32 of scale dw = (ls[j] - 32) * d (exact in F32). */
static float r16_iq4xs_dot(const void *W, int64_t nsb, int64_t r, const act_row *a) {
    float s = 0;
    for (int64_t k = 0; k < nsb; k++) {
        uint8_t buf[sizeof(block_q5_K)];
        const block_iq4_xs *b = (const block_iq4_xs *)r16_block_of(QTYPE_IQ4_XS, W, nsb, r, k, buf);
        for (int j = 0; j < 8; j++) {
            const int64_t kb = 8 * k + j;
            int32_t isum = 0;
            for (int e = 0; e < 32; e++)
                isum += iq4_code_value(b->qs + 16 * j, e) * a->qs[act_q8_qs(kb, e)];
            s = fmaf((float)isum, iq4xs_block32(b, j) * a->d[act_q8_slot(kb)], s);
        }
    }
    return s;
}

void kern_matmul_r16_ref(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                         float *Y, int64_t ldy) {
    if (wtype == QTYPE_IQ4_XS) {
        for (int64_t r = r0; r < r1; r++)
            for (int b = 0; b < nb; b++) {
                const act_row a = act_get_row(ACT_Q8, act, cols, b);
                Y[(int64_t)b * ldy + r] = r16_iq4xs_dot(W, cols / QK_K, r, &a);
            }
        return;
    }
    if (r16_kq(wtype)) {
        for (int64_t r = r0; r < r1; r++)
            for (int b = 0; b < nb; b++) {
                const act_row a = act_get_row(ACT_Q8, act, cols, b);
                Y[(int64_t)b * ldy + r] = r16_kq_dot(wtype, W, cols / QK_K, r, &a);
            }
        return;
    }
    const int64_t nblk = cols / 32;
    for (int64_t r = r0; r < r1; r++) {
        for (int b = 0; b < nb; b++) {
            const act_row a = act_get_row(ACT_Q8, act, cols, b);
            float s = 0;
            for (int64_t k = 0; k < nblk; k++) {
                uint8_t blk[sizeof(block_q5_K)];
                r16_block_of(wtype, W, nblk, r, k, blk);
                int32_t isum = 0;
                for (int e = 0; e < 32; e++) isum += q32_value(wtype, blk, e) * a.qs[act_q8_qs(k, e)];
                ellm_f16 d;
                memcpy(&d, blk, 2);
                const float da = a.d[act_q8_slot(k)];
                s = fmaf((float)isum, ellm_f16_to_f32(d) * da, s);
                if (wtype == QTYPE_Q4_1 || wtype == QTYPE_Q5_1) { /* m: the same offset in both */
                    _Static_assert(offsetof(block_q4_1, m) == offsetof(block_q5_1, m), "Q4_1 and Q5_1 minimums");
                    ellm_f16 m;
                    memcpy(&m, blk + offsetof(block_q5_1, m), 2);
                    s = fmaf((float)a.sa[act_q8_slot(k)], ellm_f16_to_f32(m) * da, s);
                }
            }
            Y[(int64_t)b * ldy + r] = s;
        }
    }
}

void kern_matmul_r16(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                     float *Y, int64_t ldy) {
    assert(kern_r16_type(wtype) && r0 % R16_ROWS == 0 && r1 % R16_ROWS == 0 && cols % blk_elems(wtype) == 0);
    if (r1 <= r0 || nb <= 0) return;
    const r16_kernel fn = r16_simd(wtype);
    if (fn) fn(wtype, W, cols, r0, r1, act, nb, Y, ldy);
    else kern_matmul_r16_ref(wtype, W, cols, r0, r1, act, nb, Y, ldy);
}
