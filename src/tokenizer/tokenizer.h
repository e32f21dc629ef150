/* Tokenizers built from GGUF metadata (tokenizer.ggml.*) or from a Hugging
 * Face tokenizer.json.
 *
 * SentencePiece-style (tokenizer.ggml.model = "llama"): score-driven merges of
 * pieces, a "▁" space marker with a space prefix, byte fallback (<0xNN>),
 * control and user-defined tokens.
 * Byte-level BPE (tokenizer.ggml.model = "gpt2"): text split into words by the
 * pre-tokenizer regexes that tokenizer.ggml.pre names, bytes mapped through
 * the GPT-2 byte map, merges applied by rank (tokenizer.ggml.merges).
 * tokenizer.json: the BPE model with its normalizers, pre-tokenizers, added
 * tokens and byte fallback.
 * Encoding is exact: the same ids as the model's reference tokenizer. Safe on
 * untrusted metadata, files and text. One tokenizer may encode and decode on
 * several threads at once. */
#ifndef ELLM_TOKENIZER_TOKENIZER_H
#define ELLM_TOKENIZER_TOKENIZER_H

#include "ellm.h"
#include "gguf/gguf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

/* Builds the tokenizer from the tokenizer.ggml.* keys of `f`. Copies what it
 * keeps, so `f` may be closed afterwards. */
ellm_status tokenizer_init_gguf(const gguf_file *f, tokenizer **out, ellm_error *err);
/* Builds the tokenizer from a Hugging Face tokenizer.json (BPE model), with
 * BOS/EOS, add_bos_token and the chat template from the tokenizer_config.json
 * next to it when there is one. Fails with a message naming the file and
 * the field on malformed JSON or a missing or ill-typed field;
 * ELLM_ERR_UNSUPPORTED names a component (model, normalizer, pre-tokenizer)
 * this code does not implement. */
ellm_status tokenizer_init_hf_json(const char *path_to_tokenizer_json, tokenizer **out,
                                   ellm_error *err);
void tokenizer_free(tokenizer *t);
/* The chat template a parsed tokenizer_config.json names: its
 * "chat_template" string, or from a list of {name, template} the one named
 * "default", else the first; NULL if none. Points into tok_cfg. */
struct cJSON;
const char *tokenizer_hf_chat_template(const struct cJSON *tok_cfg);

int tokenizer_n_vocab(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t); /* -1 if none */
int32_t tokenizer_eos(const tokenizer *t); /* -1 if none */
int tokenizer_add_bos(const tokenizer *t); /* model asks for BOS at the start */
int tokenizer_is_eog(const tokenizer *t, int32_t id);
/* The chat template (Jinja source) of the metadata, or NULL if none. */
const char *tokenizer_chat_template(const tokenizer *t);

/* Encodes `len` bytes of text (must be valid UTF-8, else ELLM_ERR_FORMAT).
 * add_bos: prepend BOS if the model asks for it. parse_special: text matching a
 * control/user-defined token's content becomes that token; otherwise such text
 * is ordinary text. Writes up to `cap` ids and the total count to *n_out; if
 * the total exceeds cap returns ELLM_ERR_ARG (and *n_out is the needed count). */
ellm_status tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_bos,
                             int parse_special, int32_t *ids, int cap, int *n_out, ellm_error *err);

/* The raw vocabulary string of `id` (e.g. "▁the", "Ġthe", "<0x0A>"), or NULL if out of range. */
const char *tokenizer_piece(const tokenizer *t, int32_t id, size_t *len);
/* The bytes `id` detokenizes to on its own (possibly part of a UTF-8
 * character; empty for control tokens), or NULL if out of range. */
const char *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len);
/* The longest tokenizer_token_bytes of the vocabulary: a detok_push output
 * of at least this plus 8 bytes is never cut. */
size_t tokenizer_max_token_bytes(const tokenizer *t);

/* Streaming detokenization (state type ellm_detok from ellm.h): appends the
 * bytes of token `id` (▁ -> space, <0xNN> -> the byte, byte-level characters
 * -> their bytes, control tokens -> nothing) to out, holding back an
 * incomplete UTF-8 sequence until it completes; returns the number of bytes
 * written (cap >= 64; see tokenizer_max_token_bytes for long tokens). The
 * leading space of the very first token of a stream (state->n_emitted == 0)
 * is dropped when the tokenizer adds a space prefix. */
int tokenizer_detok_push(const tokenizer *t, ellm_detok *state, int32_t id, char *out, size_t cap);
int tokenizer_detok_flush(ellm_detok *state, char *out, size_t cap);

#endif
