/* Tokenizers built from GGUF metadata (tokenizer.ggml.*).
 *
 * SentencePiece-style (tokenizer.ggml.model = "llama"): score-driven merges of
 * pieces, a "▁" space marker with a space prefix, byte fallback (<0xNN>),
 * control and user-defined tokens. Encoding is exact: the same ids as the
 * model's reference tokenizer. Safe on untrusted metadata and text. */
#ifndef ELLM_TOKENIZER_TOKENIZER_H
#define ELLM_TOKENIZER_TOKENIZER_H

#include "ellm.h"
#include "model/gguf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

/* Builds the tokenizer from the tokenizer.ggml.* keys of `f`. Copies what it
 * keeps, so `f` may be closed afterwards. */
ellm_status tokenizer_init_gguf(const gguf_file *f, tokenizer **out, ellm_error *err);
void tokenizer_free(tokenizer *t);

int tokenizer_n_vocab(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t); /* -1 if none */
int32_t tokenizer_eos(const tokenizer *t); /* -1 if none */
int tokenizer_add_bos(const tokenizer *t); /* model asks for BOS at the start */
int tokenizer_is_eog(const tokenizer *t, int32_t id);

/* Encodes `len` bytes of text (must be valid UTF-8, else ELLM_ERR_FORMAT).
 * add_bos: prepend BOS if the model asks for it. parse_special: text matching a
 * control/user-defined token's content becomes that token; otherwise such text
 * is ordinary text. Writes up to `cap` ids and the total count to *n_out; if
 * the total exceeds cap returns ELLM_ERR_ARG (and *n_out is the needed count). */
ellm_status tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_bos,
                             int parse_special, int32_t *ids, int cap, int *n_out,
                             ellm_error *err);

/* The raw vocabulary string of `id` (e.g. "▁the", "<0x0A>"), or NULL if out of range. */
const char *tokenizer_piece(const tokenizer *t, int32_t id, size_t *len);

/* Streaming detokenization (state type ellm_detok from ellm.h): appends the
 * bytes of token `id` (▁ -> space, <0xNN> -> the byte, control tokens -> nothing)
 * to out, holding back an incomplete UTF-8 sequence until it completes; returns
 * the number of bytes written (cap >= 64). The leading space of the very first
 * token of a stream (state->n_emitted == 0) is dropped when the tokenizer adds a
 * space prefix. */
int tokenizer_detok_push(const tokenizer *t, ellm_detok *state, int32_t id, char *out, size_t cap);
int tokenizer_detok_flush(ellm_detok *state, char *out, size_t cap);

#endif
