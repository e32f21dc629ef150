/* Attention over a Q8_0 KV cache: the block layout's scalar references and
 * the per-block driver shared by every ISA.
 *
 * A Q8_0 block of block_tokens (bt) tokens and head_dim (hd) dims, hd a
 * multiple of 32, keeps the channel-major key layout of the F16 cache, with
 * one F16 scale per token and group of 32 channels (as GGUF's q8_0 quantizes
 * a row: d = max|x| / 127, q = round(x / d)):
 *     K: int8 k[hd][bt], then F16 kd[hd / 32][bt]
 *     V: int8 v[bt][hd], then F16 vd[bt][hd / 32]
 * 68 bytes per token and head for K (and for V) at hd 64, against 128 in F16.
 *
 * Per block, the driver widens K and V to F32 in a thread's L1-resident
 * scratch (the block's bytes come from memory once, as int8) and runs the F32
 * block kernel of the same ISA on it, prefetching the next block itself. With
 * AVX-512 and few query rows (decode) a fused kernel reads the int8 values in
 * registers instead (attention_q8_avx512.c); the widening path, with the
 * scalar F32 kernel, is the reference both are tested against. */
#include "attention/attention_internal.h"
#include "core/fp16.h"
#include "core/prefetch.h"
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

void attn_q8_widen_k_scalar(float *dst, const int8_t *k, const uint16_t *kd, int hd, int bt) {
    for (int c = 0; c < hd; c++)
        for (int j = 0; j < bt; j++)
            dst[(size_t)c * bt + j] = ellm_f16_to_f32(kd[(size_t)(c / 32) * bt + j]) * (float)k[(size_t)c * bt + j];
}

void attn_q8_widen_v_scalar(float *dst, const int8_t *v, const uint16_t *vd, int n, int hd) {
    const int G = hd / 32;
    for (int j = 0; j < n; j++)
        for (int c = 0; c < hd; c++)
            dst[(size_t)j * hd + c] = ellm_f16_to_f32(vd[(size_t)j * G + c / 32]) * (float)v[(size_t)j * hd + c];
}

/* F32 copies of the current block, per thread: K channel-major (hd x bt),
 * V token-major (bt x hd). */
static _Thread_local float q8_kbuf[KV_Q8_MAX_ELEMS] __attribute__((aligned(64)));
static _Thread_local float q8_vbuf[KV_Q8_MAX_ELEMS] __attribute__((aligned(64)));

static void q8_block(attn_state *st, const attn_block *b, attn_block_fn f32_fn, attn_q8_widen_k_fn wk,
                     attn_q8_widen_v_fn wv) {
    const int hd = st->head_dim, bt = st->block_tokens;
    const size_t half = kv_q8_half_bytes(hd, bt);
    /* the next block (dense walk) into L1, a block further ahead (sparse) towards L2 */
    if (b->next_k) prefetch_range_l1(b->next_k, 2 * half);
    if (b->ahead_k) prefetch_range_l2(b->ahead_k, 2 * half);
    const int8_t *k = b->k, *v = b->v;
    wk(q8_kbuf, k, (const uint16_t *)(k + (size_t)hd * bt), hd, bt);
    wv(q8_vbuf, v, (const uint16_t *)(v + (size_t)hd * bt), b->n_valid, hd);
    attn_block f = *b;
    f.k = q8_kbuf;
    f.v = q8_vbuf;
    f.type = QTYPE_F32;
    f.next_k = f.next_v = f.ahead_k = f.ahead_v = NULL;
    f32_fn(st, &f);
}

void attn_block_q8_scalar(attn_state *st, const attn_block *b) {
    q8_block(st, b, attn_block_scalar, attn_q8_widen_k_scalar, attn_q8_widen_v_scalar);
}
void attn_block_q8_avx2(attn_state *st, const attn_block *b) {
    q8_block(st, b, attn_block_avx2, attn_q8_widen_k_avx2, attn_q8_widen_v_avx2);
}
void attn_block_q8_avx512(attn_state *st, const attn_block *b) {
    const int r0 = (b->vis0 >= 1 ? 0 : 1 - b->vis0) * st->group; /* first row that sees a key */
    if (st->rows - r0 <= ATTN_Q8_FUSE_ROWS) attn_block_q8_fused_avx512(st, b);
    else q8_block(st, b, attn_block_avx512, attn_q8_widen_k_avx512, attn_q8_widen_v_avx512);
}
