/* Internal layout of a tokenizer, shared by the files of src/tokenizer/:
 * tokenizer.c (loading from GGUF, special-token splitting, the public encode),
 * spm.c (the SentencePiece merge algorithm) and detok.c (pieces and streaming
 * detokenization). Nothing here is part of the public API. */
#ifndef ELLM_TOKENIZER_IMPL_H
#define ELLM_TOKENIZER_IMPL_H

#include "tokenizer/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* Token attributes as a bitmask (llama.cpp's llama_token_attr values), so that
 * metadata fix-ups can add CONTROL to a token whose declared type is another. */
enum {
    TOK_ATTR_UNDEFINED = 0,
    TOK_ATTR_UNKNOWN = 1 << 0,
    TOK_ATTR_UNUSED = 1 << 1,
    TOK_ATTR_NORMAL = 1 << 2,
    TOK_ATTR_CONTROL = 1 << 3,
    TOK_ATTR_USER_DEFINED = 1 << 4,
    TOK_ATTR_BYTE = 1 << 5,
    TOK_ATTR_LSTRIP = 1 << 7, /* special-token split eats whitespace on its left */
    TOK_ATTR_RSTRIP = 1 << 8, /* ... and on its right */
    TOK_ATTR_EOG = 1 << 12,   /* ends generation (not a llama.cpp attribute) */
};

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* Where encoded ids go: the caller's array while it has room; `n` counts them
 * all, so an overflowing encode still reports the size it needs. */
typedef struct {
    int32_t *ids;
    int64_t cap;
    int64_t n;
} tok_sink;

static inline void tok_sink_push(tok_sink *s, int32_t id) {
    if (s->n < s->cap) s->ids[s->n] = id;
    s->n++;
}

/* Scratch memory reused across the fragments of one encode call; grown on
 * demand, freed by tok_work_free. Its layout belongs to the tokenizer model. */
typedef struct {
    void *buf;
    size_t buf_cap;
    void *sym;
    size_t sym_cap; /* bytes */
    void *heap;
    size_t heap_cap; /* bytes */
} tok_work;

void tok_work_free(tok_work *w);
/* Makes *p hold at least `need` bytes (contents kept). ELLM_ERR_NOMEM on failure. */
ellm_status tok_work_reserve(void **p, size_t *cap, size_t need, ellm_error *err);

/* One tokenizer algorithm (selected by tokenizer.ggml.model). Adding a model
 * means adding an entry to the table in tokenizer.c. */
typedef struct {
    const char *name; /* the tokenizer.ggml.model value */
    /* Builds the model's own tables once the vocabulary is loaded (may be
     * NULL); `release` frees them (may be NULL). */
    ellm_status (*prepare)(tokenizer *t, ellm_error *err);
    void (*release)(tokenizer *t);
    /* Defaults when the metadata does not say (ids dropped if out of range). */
    int32_t default_bos, default_eos, default_unk;
    int default_add_bos, default_add_space_prefix;
    /* Encodes `len` (>= 1) bytes of text that contain no special token.
     * `after_special` is set for the first fragment of a text and for a
     * fragment that follows a special token (where SPM adds its space prefix). */
    ellm_status (*encode)(const tokenizer *t, const char *text, size_t len, int after_special,
                          tok_work *work, tok_sink *out, ellm_error *err);
} tok_model_ops;

/* A byte trie over the texts of the special tokens: node children form a
 * linked list (first `child`, then `sibling`); `rank` >= 0 marks the end of the
 * text of special[rank]. */
typedef struct {
    int32_t child;
    int32_t sibling;
    int32_t rank;
    uint8_t byte;
} tok_trie_node;

/* A slot of the text -> id hash: an empty slot has id -1; the full hash is
 * kept to skip most text comparisons. */
typedef struct {
    uint32_t hash;
    int32_t id;
} tok_slot;

struct tokenizer {
    const tok_model_ops *ops;
    int32_t n_vocab;

    /* Token texts back to back, each NUL-terminated: token i is the
     * text_off[i+1] - text_off[i] - 1 bytes at text + text_off[i]. */
    char *text;
    size_t *text_off; /* (n_vocab + 1) */
    float *score;     /* (n_vocab) merge priority, higher merges first */
    uint16_t *attr;   /* (n_vocab) TOK_ATTR_* */

    /* Bytes each token detokenizes to ("▁" -> ' ', "<0x0A>" -> '\n', control
     * and unknown tokens -> nothing), laid out like `text` without NULs. */
    char *piece;
    size_t *piece_off; /* (n_vocab + 1) */

    /* Open-addressing hash from token text to id. */
    tok_slot *slot;
    uint32_t slot_mask; /* number of slots - 1 (a power of two >= 2 n_vocab) */
    size_t max_token_len;

    int32_t byte_token[256]; /* byte-fallback token of each byte value, or -1 */

    int32_t bos, eos, unk, eot, eom; /* -1 if none */
    int add_bos, add_eos, add_space_prefix;

    /* Control, user-defined and unknown tokens in splitting priority (longer
     * text first, then lower id); rank = index in this list. */
    int32_t *special;
    int n_special;
    tok_trie_node *trie;
    int32_t n_trie;
    int32_t trie_root[256]; /* node for the first byte, or -1 */

    void *model_state; /* owned by ops->prepare / ops->release */
};

/* Text of token `id` (in range) and its length. */
static inline const char *tok_text(const tokenizer *t, int32_t id, size_t *len) {
    *len = t->text_off[id + 1] - t->text_off[id] - 1;
    return t->text + t->text_off[id];
}

/* Id of the token whose text is exactly s[0..n), or -1. */
int32_t tok_find(const tokenizer *t, const char *s, size_t n);

/* Length of the UTF-8 sequence that starts with byte `b`, from its lead bits
 * alone (a stray continuation byte counts as 1), as llama.cpp splits text. */
static inline size_t tok_utf8_len(uint8_t b) {
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[b >> 4];
}

/* Decodes one well-formed UTF-8 character (no overlongs, surrogates or code
 * points above U+10FFFF) at s[0..n): returns its length and sets *cp, or
 * returns 0 if the bytes there do not start a valid character. */
static inline size_t tok_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
        c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (n < need || s[1] < lo || s[1] > hi) return 0;
    c = (c << 6) | (s[1] & 0x3F);
    for (size_t k = 2; k < need; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[k] & 0x3F);
    }
    *cp = c;
    return need;
}

extern const tok_model_ops tok_spm_ops;

#endif
