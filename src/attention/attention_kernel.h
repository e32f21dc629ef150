/* The kernel contract of src/attention: what the attention driver (attention.c,
 * kv_cache.c) hands its per-ISA block kernels (attention_avx2.c, attention_avx512.c,
 * attention_q8*.c) and their scalar references. Kept apart from attention.c so that
 * kernels depend on this header, not on the driver that calls them. Not for use
 * outside src/attention. */
#ifndef ELLM_ATTENTION_KERNEL_H
#define ELLM_ATTENTION_KERNEL_H

#include <stddef.h>
#include <math.h>
#include <stdint.h>

#include "attention/kv_q8.h"

/* Query tokens per work item. A decode or verification batch (n_q <= 16) is a
 * single tile, so each KV block is read once per call for all its rows. */
#define ATTN_TILE_Q 16
/* KV blocks per part of a segment (see attention.c): parts are cut at fixed
 * block indices so that results do not depend on the batch or the threads. */
#define ATTN_PART_BLOCKS 64
/* Row strides of F32 scratch are padded to this many floats (one zmm). */
#define ATTN_PAD 16

/* Running state of one part: a KV head's query rows walking a range of its KV
 * blocks. Row r = il * group + g is query token il of the tile and query head
 * g of the KV head's group, so rows of one token are adjacent and the causal
 * limit never decreases with r. */
typedef struct {
    int head_dim;     /* hd */
    int hdp;          /* hd rounded up to ATTN_PAD: row stride of q, acc, kbuf, vbuf */
    int rows;         /* query tokens of the tile * group */
    int group;        /* query heads per KV head */
    int block_tokens; /* keys per block (a power of two) */
    int lds;          /* row stride of s: block_tokens rounded up to 4 */
    const float *q;   /* (rows rounded up to 4) x hdp: query * scale, zero padding */
    float *m;         /* rows: running max of the scores */
    float *l;         /* rows: running sum of exp(score - m) */
    float *lv;        /* rows x 16: that sum as lane sums, for kernels that keep it so */
    int lanes;        /* 1: the kernel keeps lv, st->l is their sum at the part's end */
    int ahead_nta;    /* decode kernels: blocks ahead prefetched non-temporally (1) or towards L2 (attention.h) */
    float *acc;       /* rows x hdp: running sum of exp(score - m) * v */
    float *s;         /* (rows rounded up to 4) x lds: scores, then probabilities */
    float *kbuf;      /* lds x hdp: the block's keys as F32 */
    float *vbuf;      /* lds x hdp: the block's values as F32 */
    float *alpha;     /* rows x 2: the multi-row kernels' rescale factors of one or two blocks */
    /* Q8_0 caches: each row's query * scale quantized per 32 channels (attention_q8.c) */
    int8_t *q8;       /* rows x hdp */
    float *qd;        /* rows x (hdp / 32): their scales */
    int32_t *qsum;    /* rows x (hdp / 32): 128 x the sum of each group's q8 */
} attn_state;

/* One KV block as seen by a part. Keys [0, n_valid) of the block exist; row r
 * sees keys [0, min(n_valid, vis0 + r / group)) (causal mask; vis0 may be <= 0). */
typedef struct {
    const void *k;      /* keys channel-major: head_dim rows of block_tokens, F16 or F32 */
    const void *v;      /* values token-major: block_tokens rows of head_dim, same type */
    const char *next_k; /* the part's next block, to prefetch while this one runs (or NULL) */
    const char *next_v;
    const char *ahead_k; /* a block further ahead (scattered lists), prefetched towards L2 */
    const char *ahead_v; /*   spread over this block's computation (or NULL) */
    int type;
    int n_valid;
    int vis0;
} attn_block;

/* Whether every row of the part sees all keys of block b and the block is
 * one of 16 keys: the blocks the AVX-512 kernels specialise (constant trip
 * counts, full masks, pairs). Any block before the first row's position. */
static inline int attn_block_whole16(const attn_state *st, const attn_block *b) {
    return st->block_tokens == 16 && b->n_valid == 16 && b->vis0 >= 16;
}

/* Folds one block into the running state of every row that sees any of it:
 * scores, online softmax (rescaling acc and l when the max grows) and P*V.
 * Rows that see none of the block are left untouched. */
typedef void (*attn_block_fn)(attn_state *st, const attn_block *b);
void attn_block_scalar(attn_state *st, const attn_block *b);
void attn_block_avx2(attn_state *st, const attn_block *b);
void attn_block_avx512(attn_state *st, const attn_block *b);

/* Two blocks of a part, b0 then b1: the same state, to the bit, as
 * fn(b0) then fn(b1) for the single-block kernel fn it goes with. Pair
 * kernels exist to do more work per pass (both blocks' scores at once). */
typedef void (*attn_block2_fn)(attn_state *st, const attn_block *b0, const attn_block *b1);
/* attn_block_avx512's: two whole 16-key blocks (every row sees all keys)
 * with K and V read in place are computed as a pair, anything else as two
 * single steps. */
void attn_block2_avx512(attn_state *st, const attn_block *b0, const attn_block *b1);

/* Whole blocks attn_blocks_f16_avx512 takes in one call at most. */
#define ATTN_F16_STEP_BLOCKS 8
/* Whether attn_blocks_f16_avx512 keeps the part's state (of an F16 cache)
 * in registers: 16-key blocks, head_dim 64 with 1-4 rows or 128 with 1-2. */
static inline int attn_blocks_f16_fits(const attn_state *st) {
    return st->block_tokens == 16 && st->hdp == st->head_dim &&
           ((st->head_dim == 64 && st->rows >= 1 && st->rows <= 4) ||
            (st->head_dim == 128 && st->rows >= 1 && st->rows <= 2));
}
/* b[0], .., b[n - 1] (1 <= n <= ATTN_F16_STEP_BLOCKS) of an F16 cache, each
 * whole to every row (attn_block_whole16), in that order: the same state, to
 * the bit, as n calls of attn_block_avx512. */
void attn_blocks_f16_avx512(attn_state *st, const attn_block *b, int n);

/* ---- Q8_0 KV cache (attention_q8.c; block format in kv_q8.h) ---- */

/* x (hd floats, hd a multiple of 32) quantized per 32 channels as q8_0 does:
 * d[g] = max|x| / 127, q = x / d rounded to nearest even (d kept in F32); qsum[g] = 128 x the
 * group's sum of q. */
void attn_q8_quantize_query(const float *x, int hd, int8_t *q, float *d, int32_t *qsum);
/* The score of key j of a Q8_0 block (k[hd][bt], kd[hd / 32][bt]) for a
 * quantized query: sum over groups of (float)dot * (d * kd), in group order. */
float attn_q8_score_ref(const int8_t *q8, const float *qd, const int8_t *k, const uint16_t *kd, int hd, int bt,
                        int j);

/* acc[0, hd) += P*V of one row over keys [0, nv) of a Q8_0 block (values v,
 * scales vd) with probabilities p[0, nv), by the integer definition of
 * attention_q8_impl.h (the scalar reference). */
void attn_q8_pv_ref(float *acc, const float *p, int nv, const int8_t *v, const uint16_t *vd, int hd);
/* The same with the AVX-512 kernel's helpers (VNNI + VBMI; hd <= 4096), for
 * tests: the same bits. */
void attn_q8_pv_avx512(float *acc, const float *p, int nv, const int8_t *v, const uint16_t *vd, int hd);

/* The block kernels for a Q8_0 cache (b->k, b->v: the block's K and V halves;
 * st->q8, qd, qsum filled). The AVX-512 one needs VNNI and VBMI. */
void attn_block_q8_scalar(attn_state *st, const attn_block *b);
void attn_block_q8_avx2(attn_state *st, const attn_block *b);
void attn_block_q8_avx512(attn_state *st, const attn_block *b);

/* Whole blocks the Q8_0 kernel takes in one multi-block step at most. Two
 * measured faster than four at 16K-32K, where the blocks come from DRAM
 * (bench_attention -t 1 and 2, alternated in one process: 2 blocks 9-14%
 * faster than single steps, 4 blocks no faster): the shorter phases keep
 * the block-ahead prefetches flowing. */
#define ATTN_Q8_STEP_BLOCKS 2
/* Whether attn_blocks_q8_avx512 takes the part's state: 1-4 rows (a decode
 * step's query heads of a KV head), 16-key blocks, head_dim 64 or 128. */
static inline int attn_blocks_q8_fits(const attn_state *st) {
    return st->rows >= 1 && st->rows <= 4 && st->block_tokens == 16 && st->hdp == st->head_dim &&
           (st->head_dim == 64 || st->head_dim == 128);
}
/* b[0], .., b[n - 1] (1 <= n <= ATTN_Q8_STEP_BLOCKS), each whole to every
 * row (attn_block_whole16), in that order: the same state, to the bit, as
 * n calls of attn_block_q8_avx512, with the blocks' work overlapped (VNNI +
 * VBMI; kbuf and vbuf are scratch). */
void attn_blocks_q8_avx512(attn_state *st, const attn_block *b, int n);

/* Converts n floats to IEEE half, rounding to nearest even (same bits on every ISA). */
void attn_f32_to_f16_avx2(const float *src, uint16_t *dst, int n);
void attn_f32_to_f16_avx512(const float *src, uint16_t *dst, int n);

/* The scalar references' online-softmax step for row r over one block's
 * scores s[0, nv) whose largest is mx: s becomes exp(s - m_new), the row's
 * m and l are updated and its accumulator rescaled; returns the accumulator,
 * to which the caller adds the block's P * V. */
static inline float *attn_softmax_step_ref(attn_state *st, int r, float *s, int nv, float mx) {
    float m_new = mx > st->m[r] ? mx : st->m[r];
    float alpha = expf(st->m[r] - m_new);
    float sum = 0.0f;
    for (int j = 0; j < nv; j++) {
        s[j] = expf(s[j] - m_new);
        sum += s[j];
    }
    st->m[r] = m_new;
    st->l[r] = st->l[r] * alpha + sum;
    float *acc = st->acc + (size_t)r * st->hdp;
    if (alpha != 1.0f)
        for (int d = 0; d < st->head_dim; d++) acc[d] *= alpha;
    return acc;
}

#endif
