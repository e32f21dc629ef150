/* Self-speculative decoding: drafters and the draft / verify / rollback loop
 * behind ellm_spec_* (include/ellm.h).
 *
 * A step starts from a context whose KV cache holds the history and whose
 * logits follow its last token. The target's next token x is drawn from those
 * logits as plain decoding would; drafters propose up to K tokens after x; one
 * batched pass of the target over [x, d1 .. dK] (dense, or with the context's
 * sparse budget) gives the logits after each; the longest agreeing prefix is
 * kept (greedy) or accepted by rejection sampling, the KV cache and the
 * sparse index are truncated after it, and the context's logits become those
 * after the last kept token. Batched rows equal single-token steps bit for bit
 * (tests/test_batch_exact.c), so greedy output is exactly plain decoding's.
 *
 * Drafters (a LIST joined by '+' is a chain: each proposes for the next):
 *   ngram      continues the longest recent n-gram of the history that
 *              occurred before (prompt / suffix lookup); reads no weights.
 *   sparse:N   the same model attending to only N tokens per KV head (sink,
 *              window and best blocks of the sparse index). Its KV writes are
 *              provisional: the verify pass rewrites them.
 *   quant:TYPE the same model through a low-bit copy of its weights
 *              (draft_model.h: made at load, cached on disk), so a draft
 *              step reads fewer weight bytes; ":sparse:N" adds a KV budget.
 *   shallow:k  the first k layers, then the model's output norm and head;
 *              ":sparse:N" adds a KV budget.
 * Model drafters draft greedily (the proposal is the drafter's argmax), so
 * with sampling the rejection test uses a one-hot proposal distribution:
 * accept d with probability p(d), else draw from p without d. */
#ifndef ELLM_SPEC_SPEC_H
#define ELLM_SPEC_SPEC_H

#include "ellm.h"

#define SPEC_MAX_DRAFT 31   /* drafted tokens per verify pass at most (K + 1 <= 32) */
#define SPEC_MAX_DRAFTERS 4 /* drafters in a chain */
#define SPEC_NGRAM_MAX 4    /* longest n-gram looked up */

typedef enum { SPEC_DRAFT_NGRAM, SPEC_DRAFT_SPARSE, SPEC_DRAFT_QUANT, SPEC_DRAFT_SHALLOW } spec_drafter_kind;

typedef struct {
    spec_drafter_kind kind;
    int budget;   /* KV tokens per head the draft attends to (0: all); SPEC_DRAFT_SPARSE: >= 1 */
    int qtype;    /* SPEC_DRAFT_QUANT: the low-bit type of the copy (kernels/quant.h) */
    int n_layer;  /* SPEC_DRAFT_SHALLOW: layers kept */
} spec_drafter;

/* Parses a drafter list ("ngram", "sparse:128", "quant:q4_0:sparse:128",
 * "shallow:2", "ngram+sparse:128"). Returns the number of drafters (>= 1)
 * written to out, or 0 with a message in err. */
int spec_parse_drafters(const char *list, spec_drafter *out, int cap, ellm_error *err);

/* Up to `max` tokens continuing hist[0 .. n) by n-gram lookup: the longest
 * suffix of length SPEC_NGRAM_MAX down to 1 that occurred earlier (the most
 * recent occurrence), followed by the tokens that came after it. Returns the
 * count written to out (0: no match). */
int spec_ngram_propose(const int32_t *hist, int n, int max, int32_t *out);

/* Drafts up to `max` tokens after hist[0 .. n) with the whole chain, the
 * context holding hist[0 .. n - 1) (hist[n - 1] chosen, not yet fed); hist
 * needs room for n + max tokens (drafts are appended to it). Model drafters
 * leave provisional KV beyond n - 1 for the caller to truncate. Returns the
 * count (-1 with err on failure). */
int spec_draft(ellm_spec *s, int32_t *hist, int n, int max, int32_t *out, ellm_error *err);

/* Test hook: accept every draft without checking it (breaks exactness on
 * purpose, so that tests can show their checks detect a broken acceptance). */
void spec_set_accept_all(ellm_spec *s, int on);

/* Test hook: the adaptive draft length counts each draft's measured time f
 * times (1: as measured), so that tests can make drafting cost what they need. */
void spec_set_draft_cost_scale(ellm_spec *s, double f);

/* The adaptive draft length's choice: from the per-token acceptance a, a
 * drafted token's cost and est[n], the time of a verify pass of n tokens
 * (n = 1 .. kmax + 1; est[1] is a plain step), the k in [1, kmax] that makes
 * the most tokens per second (ellm_spec_best_draft_length), or 0 -- a plain
 * step, no drafting -- when est[1] > 0 and plain steps make more. *best
 * (may be NULL) gets that k in [1, kmax] either way. */
int spec_choose_length(double a, double draft_tok_ms, const double *est, int kmax, int *best);

#endif
