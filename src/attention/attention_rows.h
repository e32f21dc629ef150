/* Multi-row dense attention block step (private to src/attention).
 *
 * A speculative verify pass of n tokens (or a prefill chunk) attends with
 * n x group query rows per KV head. attn_block_fn kernels fold one KV block
 * into all rows of a part; the kernels here do the same for parts of many
 * rows, organised for arithmetic throughput: the block is converted once,
 * scores are computed for 6 rows per pass over the keys and P*V for 6 rows
 * per pass over the values, so each load feeds more FMAs. Every row's
 * result is bit-identical to the single-row kernel of the same ISA: each
 * score, exponential, lane sum and accumulator element goes through the same
 * operations in the same order (only which rows share a register pass
 * changes), so a row of a verify pass equals the single-token step. Blocks
 * some row cannot wholly see (the diagonal) go to the single-row kernel. */
#ifndef ELLM_ATTENTION_ROWS_H
#define ELLM_ATTENTION_ROWS_H

#include "attention/attention_kernel.h"

/* Parts with at least this many rows use the multi-row kernel. Below it
 * the AVX-512 single-row kernel reads K and V in place from the cache
 * (converting F16 in registers for each group of 4 rows), which measured
 * faster for 6 rows (a GQA-3 verify of 2 tokens) and slower from 9 on. */
#define ATTN_ROWS_MIN 9
/* The same for Q8_0 caches. Their single-row kernel regroups K and
 * interleaves V again for every 4 rows, and the multi-row kernel measured
 * faster from 4 rows on (one L1-resident block, one thread); 6 rows is a
 * 2-token verify with GQA 3, where a single-token step (3 rows) stays. */
#define ATTN_ROWS_MIN_Q8 6

/* ATTN_ROWS_MIN or ATTN_ROWS_MIN_Q8, for a cache of `type`. */
int attn_rows_min(int type);

/* The multi-row block kernel of AVX-512 for F16/F32 caches; same contract
 * as attn_block_fn, and the same bits per row as attn_block_avx512. */
void attn_block_rows_avx512(attn_state *st, const attn_block *b);

/* The multi-row block kernel of AVX-512 (with VNNI and VBMI) for Q8_0
 * caches (attention_rows_q8_avx512.c): same contract as attn_block_fn, and
 * the same bits per row as attn_block_q8_avx512. */
void attn_block_rows_q8_avx512(attn_state *st, const attn_block *b);

/* Two adjacent blocks of a dense part, b0 then b1: the same state as
 * attn_block_rows_avx512(b0) then (b1), with the scores of both blocks
 * computed in one pass over the channels when every row sees both whole
 * (each broadcast query value then feeds two FMAs). */
void attn_block2_rows_avx512(attn_state *st, const attn_block *b0, const attn_block *b1);
/* The pair kernel going with attn_rows_kernel(type), or NULL. */
attn_block2_fn attn_rows_pair_kernel(int type);

/* The multi-row kernel for the current ISA and a cache of `type`, or NULL
 * when there is none (the single-row kernel then serves every part). */
attn_block_fn attn_rows_kernel(int type);

/* Turns the multi-row kernels on (default) or off, for benchmarks and tests
 * comparing them with the single-row kernels; not thread-safe against
 * running calls. */
void attention_rows_enable(int on);

#endif
