/* Choice of the multi-row block kernel (attention_rows.h). Only AVX-512 has
 * them (F16/F32 caches; Q8_0 caches with VNNI and VBMI): the scalar and AVX2
 * kernels keep serving parts of any number of rows (their per-row arithmetic
 * is their own, so a multi-row version of each would have to reproduce it;
 * see attention_rows_avx512.c for how). */
#include "attention/attention_rows.h"
#include "core/cpu.h"
#include "kernels/quant.h"

static int g_rows_on = 1;

void attention_rows_enable(int on) { g_rows_on = on != 0; }

attn_block_fn attn_rows_kernel(int type) {
    if (!g_rows_on || ellm_cpu_isa() != ELLM_ISA_AVX512) return NULL;
    if (type == QTYPE_F16 || type == QTYPE_F32) return attn_block_rows_avx512;
    /* as the single-row Q8_0 kernel, whose int8 instructions it uses (the
     * driver falls back to AVX2 for both without them) */
    if (type == QTYPE_Q8_0 && ellm_cpu()->avx512vnni && ellm_cpu()->avx512vbmi) return attn_block_rows_q8_avx512;
    return NULL;
}

int attn_rows_min(int type) { return type == QTYPE_Q8_0 ? ATTN_ROWS_MIN_Q8 : ATTN_ROWS_MIN; }

attn_block2_fn attn_rows_pair_kernel(int type) {
    return attn_rows_kernel(type) == attn_block_rows_avx512 ? attn_block2_rows_avx512 : NULL;
}
