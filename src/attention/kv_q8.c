/* The Q8_0 KV block format's quantizer (kv_q8.h). */
#include "attention/kv_q8.h"
#include "core/fp16.h"

#include <math.h>

void kv_q8_quantize_ref(const float *x, int n, int8_t *q, uint16_t *d, int stride_q, int stride_d) {
    for (int g = 0; g < n / 32; g++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float a = fabsf(x[g * 32 + i]);
            amax = a > amax ? a : amax;
        }
        const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        for (int i = 0; i < 32; i++) q[(size_t)(g * 32 + i) * stride_q] = (int8_t)roundf(x[g * 32 + i] * id);
        d[(size_t)g * stride_d] = ellm_f32_to_f16(dd);
    }
}
