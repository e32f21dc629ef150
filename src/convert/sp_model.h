/* SentencePiece model file (tokenizer.model, a protobuf ModelProto): the
 * pieces with their scores and types, and the normalizer's add_dummy_prefix.
 *
 * Only the fields a GGUF vocabulary needs are read; every other field is
 * skipped by its wire type. Safe on untrusted input: every varint, length
 * and nesting is checked against the buffer; a failure names the file and
 * the byte offset. */
#ifndef ELLM_CONVERT_SP_MODEL_H
#define ELLM_CONVERT_SP_MODEL_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

/* Piece types; the numbers are SentencePiece's, which GGUF's
 * tokenizer.ggml.token_type shares. */
enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER_DEFINED = 4, SP_UNUSED = 5, SP_BYTE = 6 };

typedef struct {
    const char *piece; /* into the caller's buffer, not NUL-terminated */
    size_t len;
    float score;
    int type;
} sp_piece;

typedef struct {
    sp_piece *pieces;
    int64_t n_pieces;
    int add_dummy_prefix; /* 1, 0, or -1 if the file does not set it (SentencePiece's default is 1) */
} sp_model;

/* Parses `size` bytes of a tokenizer.model (the buffer must outlive the model;
 * pieces point into it). `what` names the file in messages. */
ellm_status sp_model_parse(const void *data, size_t size, const char *what, sp_model *out, ellm_error *err);
void sp_model_free(sp_model *m);

#endif
