/* Choice of the multi-row block kernel (attention_rows.h). Only AVX-512 has
 * one for now: the scalar and AVX2 kernels keep serving parts of any number
 * of rows (their per-row arithmetic is their own, so a multi-row version of
 * each would have to reproduce it; see attention_rows_avx512.c for how). */
#include "attention/attention_rows.h"
#include "core/cpu.h"
#include "kernels/quant.h"

static int g_rows_on = 1;

void attention_rows_enable(int on) { g_rows_on = on != 0; }

attn_block_fn attn_rows_kernel(int type) {
    if (!g_rows_on || (type != QTYPE_F16 && type != QTYPE_F32)) return NULL;
    if (ellm_cpu_isa() == ELLM_ISA_AVX512) return attn_block_rows_avx512;
    return NULL;
}

attn_block2_fn attn_rows_pair_kernel(int type) {
    return attn_rows_kernel(type) == attn_block_rows_avx512 ? attn_block2_rows_avx512 : NULL;
}
