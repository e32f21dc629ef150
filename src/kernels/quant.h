/* Tensor element types (ggml/GGUF type ids) and their block formats.
 *
 * A quantized row of n elements is n / block_elems blocks of block_bytes each.
 * The reference (de)quantizers here are plain C and define the formats; the
 * SIMD kernels in kernels.h are tested against them. */
#ifndef ELLM_KERNELS_QUANT_H
#define ELLM_KERNELS_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    QTYPE_F32 = 0,
    QTYPE_F16 = 1,
    QTYPE_Q4_0 = 2,
    QTYPE_Q4_1 = 3,
    QTYPE_Q5_0 = 6,
    QTYPE_Q5_1 = 7,
    QTYPE_Q8_0 = 8,
    QTYPE_Q8_1 = 9,
    QTYPE_Q2_K = 10,
    QTYPE_Q3_K = 11,
    QTYPE_Q4_K = 12,
    QTYPE_Q5_K = 13,
    QTYPE_Q6_K = 14,
    QTYPE_Q8_K = 15,
    QTYPE_BF16 = 30,
    QTYPE_COUNT = 40 /* ids >= this are unknown */
} qtype;

typedef struct {
    const char *name;  /* "q8_0" */
    int block_elems;   /* elements per block (1 for f32/f16/bf16) */
    int block_bytes;   /* bytes per block */
    int supported;     /* 1 if eLLM can compute with it (dequantize + matmul) */
} qtype_info;

/* Info for a ggml type id, or NULL if the id is unknown (incl. ids that ggml
 * has retired). Known-but-unsupported types have supported == 0. */
const qtype_info *qtype_get(int type);

/* Bytes of a row of n elements; 0 if n is not a multiple of the block size or
 * the type is unknown. */
size_t qtype_row_bytes(int type, int64_t n);

/* Reference conversions (scalar). n must be a multiple of the block size.
 * quantize supports F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K (round-to-nearest
 * quantizers compatible with ggml's format, for tests and `ellm synth`). */
void qtype_dequantize_ref(int type, const void *src, float *dst, int64_t n);
void qtype_quantize_ref(int type, const float *src, void *dst, int64_t n);

#endif
