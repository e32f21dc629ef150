/* Internal layout of a tokenizer, shared by the files of src/tokenizer/:
 * tokenizer.c (loading from GGUF, special-token splitting, the public encode),
 * spm.c (the SentencePiece merge algorithm), bpe.c (byte-pair encoding with
 * merge ranks and its pre-tokenizers), hf_json.c (loading tokenizer.json) and
 * detok.c (streaming detokenization). Nothing here is part of the public API. */
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
 * demand, freed by tok_work_free. Its layout belongs to the tokenizer model;
 * `model` is the model's own scratch, released by `model_free`. */
typedef struct {
    void *buf;
    size_t buf_cap;
    void *sym;
    size_t sym_cap; /* bytes */
    void *heap;
    size_t heap_cap; /* bytes */
    void *model;
    void (*model_free)(void *model);
} tok_work;

void tok_work_free(tok_work *w);
/* Makes *p hold at least `need` bytes (contents kept). ELLM_ERR_NOMEM on failure. */
ellm_status tok_work_reserve(void **p, size_t *cap, size_t need, ellm_error *err);

/* Bits of the `frag` argument of tok_model_ops.encode. */
enum {
    TOK_FRAG_AFTER_SPECIAL = 1, /* starts the text or follows a special token */
    TOK_FRAG_TEXT_START = 2,    /* starts at byte 0 of the text */
};

/* One tokenizer algorithm (selected by tokenizer.ggml.model). Adding a model
 * means adding an entry to the table in tokenizer.c. */
typedef struct {
    const char *name; /* the tokenizer.ggml.model value */
    /* Reads the model's own GGUF metadata once the vocabulary and its hash
     * are loaded and before the special-token ids are read, so that it may
     * change their defaults (may be NULL). */
    ellm_status (*configure_gguf)(tokenizer *t, const gguf_file *f, ellm_error *err);
    /* Builds the model's own tables once the vocabulary is loaded (may be
     * NULL); `release` frees them (may be NULL). */
    ellm_status (*prepare)(tokenizer *t, ellm_error *err);
    void (*release)(tokenizer *t);
    /* Defaults when the metadata does not say (ids dropped if out of range). */
    int32_t default_bos, default_eos, default_unk;
    int default_add_bos, default_add_space_prefix;
    /* Encodes `len` (>= 1) bytes of valid UTF-8 that contain no special
     * token. `frag` holds TOK_FRAG_* bits: every fragment the special-token
     * split leaves starts the text or follows a special token (where SPM adds
     * its space prefix), so TOK_FRAG_AFTER_SPECIAL is always set. */
    ellm_status (*encode)(const tokenizer *t, const char *text, size_t len, int frag,
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

/* How a normal token's text becomes bytes when detokenized. */
typedef enum {
    TOK_PIECE_SPM = 0,       /* "▁" is a space, everything else as is */
    TOK_PIECE_BYTE_LEVEL = 1 /* each character is one byte of the GPT-2 byte map */
} tok_piece_style;

struct tokenizer {
    const tok_model_ops *ops;
    int32_t n_vocab;
    tok_piece_style piece_style;

    /* Token texts back to back, each NUL-terminated: token i is the
     * text_off[i+1] - text_off[i] - 1 bytes at text + text_off[i]. */
    char *text;
    size_t *text_off; /* (n_vocab + 1) */
    float *score;     /* (n_vocab) merge priority, higher merges first */
    uint16_t *attr;   /* (n_vocab) TOK_ATTR_* */

    /* Bytes each token detokenizes to ("▁" -> ' ', "<0x0A>" -> '\n', control
     * and unknown tokens -> nothing), laid out like `text` without NULs. */
    char *piece;
    size_t *piece_off;    /* (n_vocab + 1) */
    size_t max_piece_len; /* the longest piece */

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

    char *chat_template; /* NUL-terminated Jinja template from the metadata, or NULL */

    void *model_state; /* owned by the model: ops->release frees it */
};

/* Text of token `id` (in range) and its length. */
static inline const char *tok_text(const tokenizer *t, int32_t id, size_t *len) {
    *len = t->text_off[id + 1] - t->text_off[id] - 1;
    return t->text + t->text_off[id];
}

/* Id of the token whose text is exactly s[0..n), or -1. */
int32_t tok_find(const tokenizer *t, const char *s, size_t n);

/* FNV-1a hash of s[0, n), for the tokenizers' text-keyed tables. */
static inline uint32_t tok_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 16777619u;
    }
    return h;
}

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

/* ---- shared construction steps (tokenizer.c) ---- */

/* Builds the text -> id hash from text/text_off; a duplicate text fails. */
ellm_status tok_build_hash(tokenizer *t, ellm_error *err);
/* Given bos/eos/eot/eom and the FIM ids (-1 if unknown), finds the other
 * end-of-generation and end-of-turn tokens by their text and sets the
 * TOK_ATTR_EOG / CONTROL attributes as llama.cpp does. With `added_only`
 * (tokenizer.json, whose added_tokens say which tokens are special), only
 * control and user-defined tokens are considered: an ordinary token whose
 * text is "</s>" stays ordinary text. */
void tok_mark_specials(tokenizer *t, int32_t fim_pad, int32_t fim_rep, int32_t fim_sep,
                       int added_only);
/* Finishes a tokenizer whose texts, attributes, hash and special ids are
 * set: special-token trie, detokenization pieces, byte tokens and the
 * model's prepare step. */
ellm_status tok_finish(tokenizer *t, ellm_error *err);

/* ---- the GPT-2 byte <-> unicode map ---- */

/* Code point that stands for byte b in byte-level vocabularies: printable
 * Latin-1 bytes stand for themselves, the other 68 for U+0100.. in order. */
uint32_t tok_byte_to_cp(uint8_t b);
/* The byte code point `cp` stands for, or -1 if it stands for none. */
int tok_cp_to_byte(uint32_t cp);

/* ---- byte-pair encoding (bpe.c): set up by a loader, then tok_finish ---- */

typedef enum {
    TOK_SPLIT_ISOLATED, /* matches and the text between them are words */
    TOK_SPLIT_REMOVED,  /* the text between matches only */
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;

typedef enum { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS } tok_prepend_scheme;

typedef enum {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_PREPEND, /* a = the text to put in front of a non-empty fragment */
    TOK_NORM_REPLACE  /* every a becomes b */
} tok_norm_kind;

/* Makes `t` a BPE tokenizer with no merges, steps or normalizers yet
 * (t->ops = &tok_bpe_ops; the state is freed with the tokenizer). Needs the
 * vocabulary and its hash. */
ellm_status tok_bpe_create(tokenizer *t, ellm_error *err);
/* Adds the merge of texts a and b with the next rank (the first merge has
 * rank 0 and wins); a pair already present keeps its earlier rank. */
ellm_status tok_bpe_add_merge(tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                              ellm_error *err);
/* Pre-tokenizer steps, applied in the order added to every piece the
 * previous steps made. A regex is PCRE2 syntax (UTF, Unicode properties);
 * `literal` matches the pattern as plain text. */
ellm_status tok_bpe_add_split(tokenizer *t, const char *pattern, size_t n, int literal,
                              tok_split_behavior behavior, int invert, ellm_error *err);
/* Byte-level step: prefixes a space to pieces that lack one, splits with
 * the GPT-2 regex if asked, and maps bytes through the GPT-2 byte map. Must
 * be the last step. */
ellm_status tok_bpe_add_byte_level(tokenizer *t, int add_prefix_space, int use_regex,
                                   ellm_error *err);
/* Metaspace step: spaces become `rep`, prepended per `scheme`; with `split`
 * each piece is cut before every `rep`. */
ellm_status tok_bpe_add_metaspace(tokenizer *t, const char *rep, size_t n,
                                  tok_prepend_scheme scheme, int split, ellm_error *err);
/* Digits step: digits isolated, each alone or in runs. */
ellm_status tok_bpe_add_digits(tokenizer *t, int individual, ellm_error *err);
ellm_status tok_bpe_add_normalizer(tokenizer *t, tok_norm_kind kind, const char *a, size_t na,
                                   const char *b, size_t nb, ellm_error *err);
/* ignore_merges: a word that is a token is that token. byte_fallback /
 * unk / fuse_unk: what a symbol without a token becomes, as in the
 * tokenizers library (hf = 1); with hf = 0, as in llama.cpp (the tokens of
 * its single bytes, where there are any). */
void tok_bpe_set_options(tokenizer *t, int ignore_merges, int hf, int byte_fallback, int32_t unk,
                         int fuse_unk);
/* Sets up a GGUF byte-level vocabulary from tokenizer.ggml.pre and
 * tokenizer.ggml.merges (the configure_gguf step of tok_bpe_ops). */
ellm_status tok_bpe_configure_gguf(tokenizer *t, const gguf_file *f, ellm_error *err);

/* tokenizer_init_hf_json on the contents of tokenizer.json (`json`, `len`
 * bytes) and of tokenizer_config.json (`config`, or NULL for none). */
ellm_status tok_hf_init_memory(const char *json, size_t len, const char *config, size_t config_len,
                               tokenizer **out, ellm_error *err);

extern const tok_model_ops tok_spm_ops;
extern const tok_model_ops tok_bpe_ops;

#endif
