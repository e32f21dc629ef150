/* kern_quantize: the fastest quantizer of a type on this CPU (core/cpu.h),
 * else quant.c's reference, whose output it equals bit for bit
 * (tests/test_quantize.c); NaN, which quantized types cannot hold, is the
 * caller's to refuse. */
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/quantize_impl.h"

#include "core/cpu.h"

#include <math.h>

void kern_quantize(int type, const float *src, void *dst, int64_t n) {
    if (ellm_cpu_isa() >= ELLM_ISA_AVX512) {
        switch (type) {
        case QTYPE_Q8_0: kern_quantize_q8_0_avx512(src, dst, n); return;
        case QTYPE_Q4_0: kern_quantize_q4_0_avx512(src, dst, n); return;
        case QTYPE_BF16: kern_quantize_bf16_avx512(src, dst, n); return;
        case QTYPE_Q6_K: kern_quantize_q6_K_avx512(src, dst, n); return;
        default: break;
        }
    }
    /* F16 through the F16C/AVX-512 row converter (equal to the reference
     * for every value but NaN, whose payload may differ). */
    if (type == QTYPE_F16) {
        kern_f32_to_f16(src, dst, n);
        return;
    }
    qtype_quantize_ref(type, src, dst, n);
}

int64_t kern_first_out_of_range_ref(const float *x, int64_t n, float lim) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(x[i]) <= lim)) return i;
    return -1;
}

int64_t kern_first_out_of_range(const float *x, int64_t n, float lim) {
    if (ellm_cpu_isa() >= ELLM_ISA_AVX512) return kern_first_out_of_range_avx512(x, n, lim);
    return kern_first_out_of_range_ref(x, n, lim);
}
