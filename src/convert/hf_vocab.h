/* A Hugging Face tokenizer folder -> the tokenizer.ggml.* metadata that
 * llama.cpp's converter writes for it.
 *
 * Sources, in llama.cpp's order of preference:
 *  - tokenizer.model (SentencePiece): model "llama", pre "default", pieces with
 *    their scores and types; added_tokens.json and tokenizer_config.json's
 *    added_tokens_decoder override pieces (score -1000, control or
 *    user-defined).
 *  - tokenizer.json with a BPE model and byte_fallback (SentencePiece-style,
 *    e.g. Mistral): model "llama", pre "default", byte tokens typed BYTE.
 *    Scores are minus the rank of the first merge that makes each token, so
 *    the score-driven SentencePiece merge order equals the BPE rank order
 *    (llama.cpp writes -1000 for every token, which loses that order).
 *  - tokenizer.json with a byte-level BPE model: model "gpt2", the merges, and
 *    the pre-tokenizer named as llama.cpp names it: by the SHA-256 of the ids
 *    the tokenizer gives its check text (llama.cpp's chkhsh table, restricted
 *    to the pre-tokenizers eLLM implements).
 * Other tokenizer.json model types (Unigram, WordPiece, WordLevel) are
 * refused by name.
 * Special tokens: bos/eos/unk/sep/pad/cls/mask from tokenizer_config.json's
 * *_token texts looked up among tokenizer.json's added tokens, else
 * config.json's *_token_id, else generation_config.json's; add_bos/add_eos
 * from tokenizer_config.json or tokenizer.json's post-processor; the chat
 * template from tokenizer_config.json (or chat_template.jinja);
 * add_space_prefix from tokenizer_config.json's add_prefix_space or a
 * SentencePiece model that turns its dummy prefix off.
 * All files are untrusted; failures name the file and the field. */
#ifndef ELLM_CONVERT_HF_VOCAB_H
#define ELLM_CONVERT_HF_VOCAB_H

#include "ellm.h"
#include "gguf/gguf_writer.h"

#include <stddef.h>
#include <stdint.h>

enum { CV_SPECIAL_BOS, CV_SPECIAL_EOS, CV_SPECIAL_UNK, CV_SPECIAL_SEP, CV_SPECIAL_PAD, CV_SPECIAL_CLS,
       CV_SPECIAL_MASK, CV_SPECIAL_COUNT };

typedef struct {
    char model[16]; /* "llama" or "gpt2" */
    char pre[48];
    int64_t n;      /* tokens */
    char **tok;     /* (n) token texts, malloc'ed, NUL-terminated */
    float *scores;  /* (n) or NULL (gpt2) */
    int32_t *types; /* (n) GGUF token types */
    char **merges;  /* (n_merges) "left right" */
    int64_t n_merges;
    int64_t special[CV_SPECIAL_COUNT]; /* ids, -1 when unset */
    int add_bos, add_eos;              /* 1/0, -1 when unset */
    int add_space_prefix;              /* 1/0, -1 when unset */
    char *chat_template;               /* or NULL */
    const char *source;                /* "tokenizer.model" or "tokenizer.json" */
} cv_vocab;

/* Builds the vocabulary of the checkpoint in `dir`. n_vocab > 0 (config.json's
 * vocab_size) pads the token list to that size with "[PADi]" unused tokens and
 * refuses a tokenizer with more tokens; n_vocab <= 0 takes the tokenizer's. */
ellm_status cv_vocab_load(const char *dir, int64_t n_vocab, cv_vocab *v, ellm_error *err);
/* Adds the tokenizer.ggml.* keys to `w`. */
ellm_status cv_vocab_write(const cv_vocab *v, gguf_writer *w, ellm_error *err);
void cv_vocab_free(cv_vocab *v);

/* Parses tokenizer.json (+ tokenizer_config.json, may be NULL) from memory
 * into `v` without the pre-tokenizer fingerprint (pre is left ""), for the
 * fuzz harness. */
ellm_status cv_vocab_from_json(const char *json, size_t len, const char *config, size_t config_len,
                               int64_t n_vocab, cv_vocab *v, ellm_error *err);

/* Parses a tokenizer.model (SentencePiece protobuf) from memory into `v`
 * (the pieces alone: no added tokens or special ids), for the fuzz harness. */
ellm_status cv_vocab_from_sp_memory(const void *data, size_t size, int64_t n_vocab, cv_vocab *v, ellm_error *err);

#endif
