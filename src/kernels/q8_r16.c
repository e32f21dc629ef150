/* Q8_0 weights interleaved by 16 rows (kernels.h, "Q8_0 R16"): the layout,
 * its packer, row reader and scalar reference, and the dispatch.
 *
 * Group g (rows 16g .. 16g + 15) takes the bytes its 16 rows take in a Q8_0
 * matrix, block after block; block k of the group is one 544-byte record:
 *
 *   f16 d[16]          row i's scale of block k
 *   uint8 q[8][16][4]  q[j][i] = elements 4j .. 4j + 3 of row i, each + 128
 *
 * so vector j of a record is dword j of the block for 16 rows, one row per
 * 32-bit lane: a vpdpbusd against one broadcast activation dword makes 16
 * outputs' partial dots with no reduction across lanes, and one weight
 * vector serves every activation row of a batch.
 *
 * Every output accumulates its blocks in order, one fused multiply-add each:
 *
 *   isum = sum_i w_i * a_i                    (exact int32)
 *   s    = fma((float)isum, dw * da, s)       (k = 0, 1, ...)
 *
 * which is what this reference computes and what the AVX-512 kernel
 * computes, for any number of activation rows: a row of a batch equals the
 * same row alone, and both equal the reference, bit for bit. */
#include "core/cpu.h"
#include "kernels/kernels.h"
#include "kernels/kernels_impl.h"
#include "kernels/quant.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { R16_ROWS = 16, R16_REC = 32 + 8 * 16 * 4 };

int kern_q8_r16_fast(void) { return ellm_cpu_isa() == ELLM_ISA_AVX512 && ellm_cpu()->avx512vnni; }

int kern_q8_r16_pack(void *dst, const void *src, int64_t rows, int64_t cols) {
    if (rows <= 0 || rows % R16_ROWS || cols <= 0 || cols % QK8_0) return -1;
    const int64_t nblk = cols / QK8_0;
    const size_t rb = (size_t)nblk * sizeof(block_q8_0);
    block_q8_0 *tmp = dst == src ? malloc(R16_ROWS * rb) : NULL;
    if (dst == src && !tmp) return -1;
    for (int64_t g = 0; g < rows / R16_ROWS; g++) {
        uint8_t *grp = (uint8_t *)dst + (size_t)g * R16_ROWS * rb;
        const block_q8_0 *in = (const block_q8_0 *)((const uint8_t *)src + (size_t)g * R16_ROWS * rb);
        if (tmp) in = memcpy(tmp, grp, R16_ROWS * rb);
        for (int64_t k = 0; k < nblk; k++) {
            uint8_t *rec = grp + (size_t)k * R16_REC;
            for (int i = 0; i < R16_ROWS; i++) {
                const block_q8_0 *b = &in[(size_t)i * (size_t)nblk + (size_t)k];
                memcpy(rec + 2 * i, &b->d, 2);
                for (int j = 0; j < 8; j++) { /* 4 values + 128 each: the sign bits flipped */
                    uint32_t v;
                    memcpy(&v, b->qs + 4 * j, 4);
                    v ^= 0x80808080u;
                    memcpy(rec + 32 + 64 * j + 4 * i, &v, 4);
                }
            }
        }
    }
    free(tmp);
    return 0;
}

/* Record of block k of the group of row r, and r's place in the group. */
static const uint8_t *r16_rec(const void *W, int64_t nblk, int64_t r, int64_t k) {
    return (const uint8_t *)W + ((size_t)(r / R16_ROWS) * (size_t)nblk + (size_t)k) * R16_REC;
}

void kern_q8_r16_row(const void *W, int64_t cols, int64_t r, float *dst) {
    const int64_t nblk = cols / QK8_0;
    const int i = (int)(r % R16_ROWS);
    for (int64_t k = 0; k < nblk; k++) {
        const uint8_t *rec = r16_rec(W, nblk, r, k);
        ellm_f16 h;
        memcpy(&h, rec + 2 * i, 2);
        const float d = ellm_f16_to_f32(h);
        for (int j = 0; j < 8; j++)
            for (int t = 0; t < 4; t++) dst[32 * k + 4 * j + t] = d * (float)((int)rec[32 + 64 * j + 4 * i + t] - 128);
    }
}

void kern_matmul_q8_r16_ref(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                            float *Y, int64_t ldy) {
    const int64_t nblk = cols / QK8_0;
    for (int64_t r = r0; r < r1; r++) {
        const int i = (int)(r % R16_ROWS);
        for (int b = 0; b < nb; b++) {
            const act_row a = act_get_row(ACT_Q8, act, cols, b);
            float s = 0;
            for (int64_t k = 0; k < nblk; k++) {
                const uint8_t *rec = r16_rec(W, nblk, r, k);
                ellm_f16 h;
                memcpy(&h, rec + 2 * i, 2);
                int32_t isum = 0;
                for (int e = 0; e < 32; e++)
                    isum += ((int)rec[32 + 64 * (e / 4) + 4 * i + e % 4] - 128) * a.qs[act_q8_qs(k, e)];
                s = fmaf((float)isum, ellm_f16_to_f32(h) * a.d[act_q8_slot(k)], s);
            }
            Y[(int64_t)b * ldy + r] = s;
        }
    }
}

void kern_matmul_q8_r16(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb, float *Y,
                        int64_t ldy) {
    assert(r0 % R16_ROWS == 0 && r1 % R16_ROWS == 0 && cols % QK8_0 == 0);
    if (r1 <= r0 || nb <= 0) return;
    if (kern_q8_r16_fast()) kern_matmul_q8_r16_avx512(W, cols, r0, r1, act, nb, Y, ldy);
    else kern_matmul_q8_r16_ref(W, cols, r0, r1, act, nb, Y, ldy);
}
