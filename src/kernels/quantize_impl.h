/* Private to src/kernels: the per-ISA quantizers kern_quantize dispatches to
 * (quantize.c). Each writes what qtype_quantize_ref writes for its type. */
#ifndef ELLM_KERNELS_QUANTIZE_IMPL_H
#define ELLM_KERNELS_QUANTIZE_IMPL_H

#include <stdint.h>

void kern_quantize_q8_0_avx512(const float *x, void *dst, int64_t n);
void kern_quantize_q4_0_avx512(const float *x, void *dst, int64_t n);
void kern_quantize_bf16_avx512(const float *x, void *dst, int64_t n);
void kern_quantize_q6_K_avx512(const float *x, void *dst, int64_t n);
int64_t kern_first_out_of_range_avx512(const float *x, int64_t n, float lim);

#endif
