/* Compute kernels, dispatched at run time to the best ISA (core/cpu.h).
 *
 * Every function here has a scalar reference (`*_ref`) that defines its result;
 * the AVX2 and AVX-512 paths are tested against it. Kernels take pointers and
 * shapes only. All float buffers are F32 unless said otherwise. */
#ifndef ELLM_KERNELS_KERNELS_H
#define ELLM_KERNELS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* ---- matrix multiply: Y[b][r] = sum_c W[r][c] * X[b][c] --------------------
 * W: `rows` x `cols` of type `wtype`, row r at (char*)W + r * qtype_row_bytes(wtype, cols).
 * Activations are first converted once per call site into the form the dot
 * product consumes (e.g. 8-bit blocks for quantized weights), then any number
 * of threads multiply disjoint row ranges [r0, r1) of W against all nb
 * activation rows, reading each weight once for the whole batch.
 * Y row b starts at Y + b * ldy; only columns [r0, r1) are written.
 * `act` must be what kern_act_prepare wrote for the same wtype, cols and nb:
 * for batches the layout holds more than the rows (Q8_0 / Q4_0 add a copy
 * interleaved by 4 rows for the batch kernels), so a slice of a prepared
 * batch is not a prepared smaller batch. Results do not depend on nb, on a
 * row's place in the batch or on how [r0, r1) is split between calls. */

/* Bytes needed for the prepared activations of nb rows of `cols`. */
size_t kern_act_bytes(int wtype, int64_t cols, int nb);
/* Converts nb rows X (row b at X + b * cols) into `act`. */
void kern_act_prepare(int wtype, const float *X, int64_t cols, int nb, void *act);
/* The part of kern_act_prepare(wtype, X, cols, nb, act) that rows [r0, r1)
 * determine, the same bytes: threads preparing disjoint ranges that cover
 * [0, nb) together write what one call does. r0 must be a multiple of 4,
 * r1 one too or nb (rows are interleaved in groups of 4). */
void kern_act_prepare_rows(int wtype, const float *X, int64_t cols, int nb, int r0, int r1, void *act);
void kern_matmul(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1,
                 const void *act, int nb, float *Y, int64_t ldy);
void kern_matmul_ref(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1,
                     const void *act, int nb, float *Y, int64_t ldy);

/* ---- Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1, Q4_K, Q5_K and IQ4_XS weights interleaved by 16 rows ("R16") ---
 * A Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1, Q4_K, Q5_K or IQ4_XS matrix rewritten, same size, so that a 32-bit lane of a
 * vector load is one row (layouts in r16.c): the batched kernels then read
 * each weight vector once for all activation rows with no shuffles or
 * reductions. Every output sums its blocks in order with one FMA each (two
 * per sub-block of 32 for Q4_K and Q5_K, two per block for Q4_1 and Q5_1), in the reference and the SIMD kernels
 * alike, so results do not depend on the
 * batch, on the split of rows or on the ISA. Activations are those of the
 * weight type (kern_act_prepare_rows_r16). */
/* Whether weights of type wtype have the layout (Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1, Q4_K, Q5_K, IQ4_XS). */
int kern_r16_type(int wtype);
/* Whether the active ISA has a fast kernel for the layout (AVX2 or
 * AVX-512); under the scalar ISA kern_matmul_r16 runs the reference. */
int kern_r16_fast(void);
/* Whether matrices of type wtype are better in the layout on this CPU:
 * Q8_0 and Q4_0 wherever kern_r16_fast, the other types where the AVX2 kernel is the
 * one that runs (AVX2, or AVX-512 without VNNI; with VNNI the file layout's
 * AVX-512 kernels are kept). */
int kern_r16_packs(int wtype);
/* Writes rows x cols of wtype from src to dst in the layout (rows a multiple
 * of 16, cols of 32, of 256 for Q4_K, Q5_K and IQ4_XS; the same number of bytes; dst == src packs in place,
 * other overlaps are not allowed). Returns 0, or -1 for another type, such a
 * shape or out of memory (dst unchanged). */
int kern_r16_pack(int wtype, void *dst, const void *src, int64_t rows, int64_t cols);
/* Row r of a packed matrix as floats: what kern_dequantize gave for the row
 * before packing. */
void kern_r16_row(int wtype, const void *W, int64_t cols, int64_t r, float *dst);
/* kern_matmul for a packed matrix; r0 and r1 multiples of 16. */
void kern_matmul_r16(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                     float *Y, int64_t ldy);
void kern_matmul_r16_ref(int wtype, const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb,
                         float *Y, int64_t ldy);
/* What the layout's kernels read of kern_act_prepare(wtype, ...): the rows,
 * without the copy interleaved for the file layout's batch kernels
 * (kern_act_prepare_rows' rules for r0 and r1). */
size_t kern_act_bytes_r16(int64_t cols, int nb);
void kern_act_prepare_rows_r16(int wtype, const float *X, int64_t cols, int nb, int r0, int r1, void *act);

/* Dequantizes n elements (a multiple of the block size) of type `type`. */
void kern_dequantize(int type, const void *src, float *dst, int64_t n);
/* Quantizes n floats (a multiple of the block size) to `type`: exactly what
 * qtype_quantize_ref writes, through SIMD code where the type has it. */
void kern_quantize(int type, const float *src, void *dst, int64_t n);
/* Index of the first of x[0, n) that is NaN or beyond lim in magnitude, or
 * -1 (a quantizer's input check). */
int64_t kern_first_out_of_range(const float *x, int64_t n, float lim);
int64_t kern_first_out_of_range_ref(const float *x, int64_t n, float lim);

/* ---- element-wise and row kernels ---- */

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]   (out may alias x) */
void kern_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
void kern_rmsnorm_ref(float *out, const float *x, const float *w, int64_t n, float eps);

/* Rotates the first n_rot dims of each of n_heads vectors of head_dim floats in
 * place. cos_sin holds n_rot/2 (cos, sin) pairs, pair i for frequency i.
 * neox = 0: pairs are (x[2i], x[2i+1]) (llama); neox = 1: (x[i], x[i + n_rot/2]). */
void kern_rope(float *x, int n_heads, int head_dim, int n_rot, const float *cos_sin, int neox);
void kern_rope_ref(float *x, int n_heads, int head_dim, int n_rot, const float *cos_sin, int neox);

/* out[i] = silu(gate[i]) * up[i]   (out may alias gate or up) */
void kern_swiglu(float *out, const float *gate, const float *up, int64_t n);
void kern_swiglu_ref(float *out, const float *gate, const float *up, int64_t n);

/* In-place softmax of n floats (max-subtracted). */
void kern_softmax(float *x, int64_t n);
void kern_softmax_ref(float *x, int64_t n);

/* log(sum exp(x[i])) of n >= 1 floats, x unchanged: the max plus the log of
 * the max-subtracted exponentials' sum (accumulated in double); -inf when
 * every x[i] is -inf. */
double kern_logsumexp(const float *x, int64_t n);
double kern_logsumexp_ref(const float *x, int64_t n);

/* y[i] += x[i] */
void kern_add(float *y, const float *x, int64_t n);
void kern_add_ref(float *y, const float *x, int64_t n);
/* Dot product of F32 vectors. */
float kern_dot_f32(const float *a, const float *b, int64_t n);
float kern_dot_f32_ref(const float *a, const float *b, int64_t n);

/* F32 <-> F16 rows (round to nearest even). */
void kern_f32_to_f16(const float *src, uint16_t *dst, int64_t n);
void kern_f16_to_f32(const uint16_t *src, float *dst, int64_t n);
void kern_f32_to_f16_ref(const float *src, uint16_t *dst, int64_t n);
void kern_f16_to_f32_ref(const uint16_t *src, float *dst, int64_t n);

#endif
