/* Scalar IEEE half and bfloat16 conversions (reference; kernels vectorize). */
#ifndef ELLM_CORE_FP16_H
#define ELLM_CORE_FP16_H
#include <stdint.h>
#include <string.h>

typedef uint16_t ellm_f16;  /* IEEE 754 binary16 bits */
typedef uint16_t ellm_bf16; /* bfloat16 bits */

static inline float ellm_f16_to_f32(ellm_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            man &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, like F16C's vcvtps2ph with rounding mode 0. */
static inline ellm_f16 ellm_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (ellm_f16)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (ellm_f16)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or 0 */
        if (absx < 0x33000000u) return (ellm_f16)sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (113 - e) ... */
        shift = 113 - e + 13;
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (ellm_f16)(sign | half);
    }
    uint32_t r = absx + 0xfff + ((absx >> 13) & 1); /* round to nearest even */
    r -= (112u << 23);
    return (ellm_f16)(sign | (r >> 13));
}

static inline float ellm_bf16_to_f32(ellm_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline ellm_bf16 ellm_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000u) return (ellm_bf16)((x >> 16) | 64); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (ellm_bf16)(x >> 16);
}
#endif
