/* Byte-pair encoding with merge ranks: GGUF byte-level BPE
 * (tokenizer.ggml.model = "gpt2") and the BPE model of tokenizer.json files.
 *
 * A fragment of text (no special token in it) goes through:
 *   1. normalizers (tokenizer.json only): NFC, NFD, NFKC, NFKD (utf8proc),
 *      Lowercase, Prepend, Replace;
 *   2. pre-tokenizer steps, each splitting every piece the previous one made:
 *      regex splits (PCRE2, UTF + Unicode properties, JIT), Metaspace,
 *      ByteLevel, Digits. Pieces go through the steps depth first, one at a
 *      time, so no word list is ever built and memory stays O(longest word);
 *   3. per word: one symbol per byte (byte-level vocabularies, where byte b
 *      stands for the character tok_byte_to_cp(b)) or per UTF-8 character;
 *      then, repeatedly, the adjacent pair with the lowest merge rank is
 *      merged (ties: the leftmost pair), as llama.cpp's BPE session and the
 *      tokenizers library do;
 *   4. each final symbol is its token; one without a token falls back to the
 *      tokens of its single bytes (llama.cpp) or to byte-fallback / unknown
 *      tokens (tokenizer.json).
 *
 * Symbol ids ("sids"): merges are keyed by two integers, not two strings. A
 * text that is a token has its token id; a text that occurs in a merge but is
 * not a token (possible in a GGUF file) gets an id from n_vocab up. A symbol
 * whose text is neither has sid -1 and never merges, exactly as a string
 * lookup would find no merge for it. */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "tokenizer/tokenizer_impl.h"

#include "core/status.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define BPE_MAX_STEPS 16
#define BPE_MAX_NORMS 16
/* Per-match budget of the regex engine: generous for any sane pattern on any
 * text, small enough that a pathological tokenizer.json pattern fails fast. */
#define BPE_MATCH_LIMIT 50000000u
#define BPE_JIT_STACK_MAX (4u << 20)
#define BPE_EMPTY_KEY UINT64_MAX

typedef enum { STEP_SPLIT, STEP_BYTE_LEVEL, STEP_METASPACE } bpe_step_kind;

typedef struct {
    bpe_step_kind kind;
    pcre2_code *re;              /* SPLIT; BYTE_LEVEL with use_regex */
    tok_split_behavior behavior; /* SPLIT */
    int invert;                  /* SPLIT */
    int add_prefix_space;        /* BYTE_LEVEL */
    char *rep;                   /* METASPACE: what a space becomes */
    size_t rep_len;
    tok_prepend_scheme scheme; /* METASPACE */
    int split;                 /* METASPACE */
} bpe_step;

typedef struct {
    tok_norm_kind kind;
    char *a, *b;
    size_t na, nb;
} bpe_norm;

/* A merge: symbols (left, right) become `result`. */
typedef struct {
    uint64_t key; /* (left << 32) | right, or BPE_EMPTY_KEY */
    int32_t rank;
    int32_t result;
} bpe_merge;

typedef struct {
    bpe_merge *merge;
    uint64_t merge_mask; /* slots - 1 (a power of two) */
    uint64_t n_merge;    /* distinct pairs */
    int32_t n_ranks;     /* merges added, duplicates included: the next rank */

    /* Texts in merges that are not tokens, back to back: extra i is
     * x_text[x_off[i], x_off[i+1]) and has sid n_vocab + i. */
    char *x_text;
    size_t x_len, x_cap;
    size_t *x_off;
    int32_t n_x, x_off_cap;
    tok_slot *x_slot; /* text -> extra index */
    uint32_t x_mask;

    bpe_step step[BPE_MAX_STEPS];
    int n_steps;
    bpe_norm norm[BPE_MAX_NORMS];
    int n_norms;

    int byte_level;
    int ignore_merges;
    int hf;
    int byte_fallback;
    int fuse_unk;
    int32_t unk;

    /* Built by bpe_prepare. */
    int32_t byte_sid[256];     /* byte-level: sid of the character of each byte */
    char byte_chr[256][2];     /* ... that character in UTF-8 */
    uint8_t byte_chr_len[256]; /* ... and its length */
    int32_t ascii_sid[128];    /* otherwise: sid of each ASCII character */
    int32_t fallback_tok[256]; /* the <0xNN> token of each byte, or -1 */
    int32_t single_tok[256];   /* the token whose text is that one byte, or -1 */
} bpe_state;

/* ---- symbol ids ---- */

/* Index of p[0, n) among the extra texts, or -1. */
static int32_t extra_find(const bpe_state *s, const char *p, size_t n) {
    if (s->n_x == 0) return -1;
    uint32_t h = tok_hash(p, n);
    for (uint32_t i = h & s->x_mask;; i = (i + 1) & s->x_mask) {
        const tok_slot *sl = &s->x_slot[i];
        if (sl->id < 0) return -1;
        if (sl->hash == h && s->x_off[sl->id + 1] - s->x_off[sl->id] == n &&
            memcmp(s->x_text + s->x_off[sl->id], p, n) == 0) {
            return sl->id;
        }
    }
}

/* Sid of the text p[0, n), or -1. */
static int32_t sid_find(const tokenizer *t, const bpe_state *s, const char *p, size_t n) {
    int32_t id = tok_find(t, p, n);
    if (id >= 0) return id;
    id = extra_find(s, p, n);
    return id >= 0 ? t->n_vocab + id : -1;
}

/* Rebuilds the extra-text hash with `n_slots` (a power of two) slots. */
static ellm_status extra_rehash(bpe_state *s, uint32_t n_slots, ellm_error *err) {
    tok_slot *slot = malloc((size_t)n_slots * sizeof(*slot));
    if (!slot) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (merge texts)");
    for (uint32_t i = 0; i < n_slots; i++) slot[i] = (tok_slot){0, -1};
    for (int32_t x = 0; x < s->n_x; x++) {
        uint32_t h = tok_hash(s->x_text + s->x_off[x], s->x_off[x + 1] - s->x_off[x]);
        uint32_t i = h & (n_slots - 1);
        while (slot[i].id >= 0) i = (i + 1) & (n_slots - 1);
        slot[i] = (tok_slot){h, x};
    }
    free(s->x_slot);
    s->x_slot = slot;
    s->x_mask = n_slots - 1;
    return ELLM_OK;
}

/* Sid of p[0, n), adding it as an extra text when it is new. */
static ellm_status sid_intern(const tokenizer *t, bpe_state *s, const char *p, size_t n,
                              int32_t *sid, ellm_error *err) {
    *sid = sid_find(t, s, p, n);
    if (*sid >= 0) return ELLM_OK;
    if (t->n_vocab + (int64_t)s->n_x >= INT32_MAX - 1) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: too many merge texts");
    }
    ellm_status st = ELLM_OK;
    if (s->n_x + 2 > s->x_off_cap) {
        int32_t cap = s->x_off_cap ? 2 * s->x_off_cap : 64;
        size_t *off = realloc(s->x_off, (size_t)cap * sizeof(size_t));
        if (!off) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (merge texts)");
        s->x_off = off;
        s->x_off_cap = cap;
    }
    if (s->x_len + n > s->x_cap) {
        size_t cap = s->x_cap ? 2 * s->x_cap : 1024;
        while (cap < s->x_len + n) cap *= 2;
        char *txt = realloc(s->x_text, cap);
        if (!txt) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (merge texts)");
        s->x_text = txt;
        s->x_cap = cap;
    }
    if (2u * ((uint32_t)s->n_x + 1) > (s->x_slot ? s->x_mask + 1 : 0)) {
        st = extra_rehash(s, s->x_slot ? 2 * (s->x_mask + 1) : 64, err);
        if (st != ELLM_OK) return st;
    }
    if (s->n_x == 0) s->x_off[0] = 0;
    memcpy(s->x_text + s->x_len, p, n);
    s->x_len += n;
    int32_t x = s->n_x++;
    s->x_off[x + 1] = s->x_len;
    uint32_t h = tok_hash(p, n);
    uint32_t i = h & s->x_mask;
    while (s->x_slot[i].id >= 0) i = (i + 1) & s->x_mask;
    s->x_slot[i] = (tok_slot){h, x};
    *sid = t->n_vocab + x;
    return ELLM_OK;
}

/* ---- merges ---- */

static uint64_t key_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

/* The merge of symbols (left, right), or NULL if they do not merge. */
static const bpe_merge *merge_find(const bpe_state *s, int32_t left, int32_t right) {
    if (!s->merge) return NULL;
    uint64_t k = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint64_t i = key_hash(k) & s->merge_mask;; i = (i + 1) & s->merge_mask) {
        const bpe_merge *m = &s->merge[i];
        if (m->key == k) return m;
        if (m->key == BPE_EMPTY_KEY) return NULL;
    }
}

/* Doubles the merge table (or creates it), keeping its entries. */
static ellm_status merge_grow(bpe_state *s, ellm_error *err) {
    uint64_t n_slots = s->merge ? 2 * (s->merge_mask + 1) : 1024;
    bpe_merge *m = malloc(n_slots * sizeof(*m));
    if (!m) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (merges)");
    for (uint64_t i = 0; i < n_slots; i++) m[i].key = BPE_EMPTY_KEY;
    for (uint64_t i = 0; s->merge && i <= s->merge_mask; i++) {
        if (s->merge[i].key == BPE_EMPTY_KEY) continue;
        uint64_t j = key_hash(s->merge[i].key) & (n_slots - 1);
        while (m[j].key != BPE_EMPTY_KEY) j = (j + 1) & (n_slots - 1);
        m[j] = s->merge[i];
    }
    free(s->merge);
    s->merge = m;
    s->merge_mask = n_slots - 1;
    return ELLM_OK;
}

ellm_status tok_bpe_add_merge(tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                              ellm_error *err) {
    bpe_state *s = t->model_state;
    if (s->n_ranks == INT32_MAX)
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: too many merges");
    int32_t rank = s->n_ranks++;
    if (na == 0 || nb == 0) return ELLM_OK; /* can never apply: no symbol is empty */
    if (na + nb > ((size_t)1 << 20)) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: merge %d is %zu bytes long", rank,
                         na + nb);
    }
    int32_t left, right, result;
    ellm_status st = sid_intern(t, s, a, na, &left, err);
    if (st == ELLM_OK) st = sid_intern(t, s, b, nb, &right, err);
    if (st != ELLM_OK) return st;
    char small[256];
    char *cat = na + nb <= sizeof(small) ? small : malloc(na + nb);
    if (!cat) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (merges)");
    memcpy(cat, a, na);
    memcpy(cat + na, b, nb);
    st = sid_intern(t, s, cat, na + nb, &result, err);
    if (cat != small) free(cat);
    if (st != ELLM_OK) return st;

    if (merge_find(s, left, right)) return ELLM_OK; /* the first (lowest) rank stays */
    if (!s->merge || 10 * (s->n_merge + 1) > 7 * (s->merge_mask + 1)) {
        st = merge_grow(s, err);
        if (st != ELLM_OK) return st;
    }
    uint64_t k = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    uint64_t i = key_hash(k) & s->merge_mask;
    while (s->merge[i].key != BPE_EMPTY_KEY) i = (i + 1) & s->merge_mask;
    s->merge[i] = (bpe_merge){k, rank, result};
    s->n_merge++;
    return ELLM_OK;
}

/* ---- building ---- */

static void bpe_release(tokenizer *t) {
    bpe_state *s = t->model_state;
    if (!s) return;
    for (int i = 0; i < s->n_steps; i++) {
        pcre2_code_free(s->step[i].re);
        free(s->step[i].rep);
    }
    for (int i = 0; i < s->n_norms; i++) {
        free(s->norm[i].a);
        free(s->norm[i].b);
    }
    free(s->merge);
    free(s->x_text);
    free(s->x_off);
    free(s->x_slot);
    free(s);
    t->model_state = NULL;
}

ellm_status tok_bpe_create(tokenizer *t, ellm_error *err) {
    if (t->model_state) return ELLM_OK;
    bpe_state *s = calloc(1, sizeof(*s));
    if (!s) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    s->unk = -1;
    t->ops = &tok_bpe_ops;
    t->model_state = s;
    return ELLM_OK;
}

void tok_bpe_set_options(tokenizer *t, int ignore_merges, int hf, int byte_fallback, int32_t unk,
                         int fuse_unk) {
    bpe_state *s = t->model_state;
    s->ignore_merges = ignore_merges;
    s->hf = hf;
    s->byte_fallback = byte_fallback;
    s->unk = unk >= 0 && unk < t->n_vocab ? unk : -1;
    s->fuse_unk = fuse_unk;
}

/* Compiles a pre-tokenizer pattern. `$` matches only at the very end, as in
 * the regex engines the patterns were written for. */
static ellm_status compile_regex(const char *pat, size_t n, int literal, pcre2_code **out,
                                 ellm_error *err) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : (PCRE2_UCP | PCRE2_DOLLAR_ENDONLY));
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, n, opt, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        if (pcre2_get_error_message(ec, msg, sizeof(msg)) < 0) strcpy((char *)msg, "error");
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer: pre-tokenizer regex '%.*s': %s (at offset %zu)",
                         (int)(n > 120 ? 120 : n), pat, (const char *)msg, (size_t)eo);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT, the interpreter runs it */
    *out = re;
    return ELLM_OK;
}

/* A cleared slot for the next pre-tokenizer step (counted by the caller once
 * it is set up); fails past BPE_MAX_STEPS or after a ByteLevel step. */
static ellm_status add_step(tokenizer *t, bpe_step **out, ellm_error *err) {
    bpe_state *s = t->model_state;
    if (s->n_steps == BPE_MAX_STEPS) {
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED, "tokenizer: more than %d pre-tokenizer steps",
                         BPE_MAX_STEPS);
    }
    if (s->byte_level) {
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "tokenizer: a pre-tokenizer step after ByteLevel is not supported");
    }
    *out = &s->step[s->n_steps];
    memset(*out, 0, sizeof(**out));
    return ELLM_OK;
}

ellm_status tok_bpe_add_split(tokenizer *t, const char *pattern, size_t n, int literal,
                              tok_split_behavior behavior, int invert, ellm_error *err) {
    bpe_step *st = NULL;
    ellm_status rc = add_step(t, &st, err);
    if (rc != ELLM_OK) return rc;
    if (n == 0) return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: empty pre-tokenizer pattern");
    rc = compile_regex(pattern, n, literal, &st->re, err);
    if (rc != ELLM_OK) return rc;
    st->kind = STEP_SPLIT;
    st->behavior = behavior;
    st->invert = invert;
    ((bpe_state *)t->model_state)->n_steps++;
    return ELLM_OK;
}

/* The GPT-2 pre-tokenizer regex (ByteLevel with use_regex). */
#define RE_GPT2_HF                                                                                 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

ellm_status tok_bpe_add_byte_level(tokenizer *t, int add_prefix_space, int use_regex,
                                   ellm_error *err) {
    bpe_step *st = NULL;
    ellm_status rc = add_step(t, &st, err);
    if (rc != ELLM_OK) return rc;
    if (use_regex) {
        rc = compile_regex(RE_GPT2_HF, strlen(RE_GPT2_HF), 0, &st->re, err);
        if (rc != ELLM_OK) return rc;
    }
    st->kind = STEP_BYTE_LEVEL;
    st->add_prefix_space = add_prefix_space;
    bpe_state *s = t->model_state;
    s->n_steps++;
    s->byte_level = 1;
    return ELLM_OK;
}

ellm_status tok_bpe_add_metaspace(tokenizer *t, const char *rep, size_t n,
                                  tok_prepend_scheme scheme, int split, ellm_error *err) {
    bpe_step *st = NULL;
    ellm_status rc = add_step(t, &st, err);
    if (rc != ELLM_OK) return rc;
    if (n == 0 || n > 16) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: Metaspace replacement of %zu bytes", n);
    }
    st->rep = malloc(n);
    if (!st->rep) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(st->rep, rep, n);
    st->rep_len = n;
    st->kind = STEP_METASPACE;
    st->scheme = scheme;
    st->split = split;
    ((bpe_state *)t->model_state)->n_steps++;
    return ELLM_OK;
}

ellm_status tok_bpe_add_digits(tokenizer *t, int individual, ellm_error *err) {
    const char *re = individual ? "\\p{N}" : "\\p{N}+";
    return tok_bpe_add_split(t, re, strlen(re), 0, TOK_SPLIT_ISOLATED, 0, err);
}

/* A malloc'ed copy of p[0, n) (at least one byte allocated), or NULL. */
static char *dup_bytes(const char *p, size_t n) {
    char *d = malloc(n ? n : 1);
    if (d && n) memcpy(d, p, n);
    return d;
}

ellm_status tok_bpe_add_normalizer(tokenizer *t, tok_norm_kind kind, const char *a, size_t na,
                                   const char *b, size_t nb, ellm_error *err) {
    bpe_state *s = t->model_state;
    if (s->n_norms == BPE_MAX_NORMS) {
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED, "tokenizer: more than %d normalizers",
                         BPE_MAX_NORMS);
    }
    if (kind == TOK_NORM_REPLACE && na == 0) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer: Replace normalizer with an empty pattern");
    }
    bpe_norm *nm = &s->norm[s->n_norms];
    memset(nm, 0, sizeof(*nm));
    nm->kind = kind;
    if (kind == TOK_NORM_PREPEND || kind == TOK_NORM_REPLACE) {
        nm->a = dup_bytes(a, na);
        nm->b = dup_bytes(b, nb);
        if (!nm->a || !nm->b) {
            free(nm->a);
            free(nm->b);
            return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
        }
        nm->na = na;
        nm->nb = nb;
    }
    s->n_norms++;
    return ELLM_OK;
}

/* The per-byte tables, once the vocabulary and merges are in (tok_model_ops.prepare). */
static ellm_status bpe_prepare(tokenizer *t, ellm_error *err) {
    bpe_state *s = t->model_state;
    if (!s) return ellm_fail(err, ELLM_ERR_ARG, "tokenizer: BPE state missing");
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        if (cp < 0x80) {
            s->byte_chr[b][0] = (char)cp;
            s->byte_chr_len[b] = 1;
        } else {
            s->byte_chr[b][0] = (char)(0xC0 | (cp >> 6));
            s->byte_chr[b][1] = (char)(0x80 | (cp & 0x3F));
            s->byte_chr_len[b] = 2;
        }
        s->byte_sid[b] = sid_find(t, s, s->byte_chr[b], s->byte_chr_len[b]);
        char one = (char)b;
        s->single_tok[b] = tok_find(t, &one, 1);
        char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        s->fallback_tok[b] = tok_find(t, buf, 6);
        if (b < 128) s->ascii_sid[b] = sid_find(t, s, &one, 1);
    }
    return ELLM_OK;
}

/* ---- GGUF pre-tokenizers (tokenizer.ggml.pre) ----
 *
 * The regexes each pre-tokenizer type applies in order, as llama.cpp lists
 * them (llama-vocab.cpp). Where llama.cpp rewrote a tokenizer's original
 * regex to suit std::regex, the rewrite is kept when it changes what matches
 * ((?i:'s) -> '[sS], which keeps U+017F out), so that ids stay the same as
 * llama.cpp's. llama.cpp runs patterns without \p{..} classes on code points
 * where every non-ASCII whitespace character reads as \v; the literal
 * classes below therefore leave those characters out, with the same effect. */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                  \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"   \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"        \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN35                                                                                  \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+"    \
                    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Han, then U+0800..U+4E00 and Hangul, less the whitespace in that range. */
#define RE_CJK                                                                                     \
    "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{167f}\\x{1681}-\\x{1fff}\\x{200b}-\\x{2027}"                 \
    "\\x{202a}-\\x{202e}\\x{2030}-\\x{205e}\\x{2060}-\\x{2fff}\\x{3001}-\\x{4e00}"                 \
    "\\x{ac00}-\\x{d7ff}]+"
/* DeepSeek LLM's letters: ASCII, and cased letters of many scripts. */
#define RE_DEEPSEEK_LETTERS                                                                        \
    "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}"            \
    "\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}"         \
    "\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}"                  \
    "\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}"    \
    "\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}"                 \
    "\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}"                 \
    "\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}"         \
    "\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}"        \
    "\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}"                 \
    "\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}"         \
    "\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}"         \
    "\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}"                   \
    "\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}\\x{2cf3}"                  \
    "\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}"                 \
    "\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}"                 \
    "\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}"             \
    "\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}"         \
    "\\x{1e900}-\\x{1e943}]+"
/* ASCII and full-width punctuation, quotes, and U+3001..U+3002 (the
 * original range starts at U+3000, a whitespace character). */
#define RE_DEEPSEEK_PUNCT                                                                          \
    "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3001}-\\x{3002}]+"
#define RE_DEEPSEEK3                                                                               \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"           \
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{964}\\x{6d4}\\x{60c})]+"
/* Upper-case runs then lower-case runs; as llama.cpp writes it, a non-ASCII
 * letter counts as both. */
#define RE_LETTERS_UL "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
#define RE_LETTERS_LU "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
#define RE_TEKKEN                                                                                  \
    RE_LETTERS_UL "|" RE_LETTERS_LU "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|"       \
                  "\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                                   \
    RE_LETTERS_UL RE_CONTRACTIONS "?|" RE_LETTERS_LU RE_CONTRACTIONS                               \
                                  "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|"   \
                                  "\\s+(?!\\S)|\\s+"
#define RE_SEED_CODER                                                                              \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"        \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_BAILING                                                                                 \
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"             \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"

typedef struct {
    const char *names; /* tokenizer.ggml.pre values, space-separated */
    const char *regex[7];
    uint8_t ignore_merges;
    uint8_t add_bos; /* BOS by default */
    uint8_t no_bos;  /* no BOS token by default */
} bpe_pre;

static const bpe_pre bpe_pres[] = {
    {.names = "default",
     .regex = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {.names = "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2",
     .regex = {RE_LLAMA3},
     .ignore_merges = 1,
     .add_bos = 1},
    {.names = "dbrx smaug-bpe", .regex = {RE_LLAMA3}},
    {.names = "glm4 chatglm-bpe", .regex = {RE_LLAMA3}, .no_bos = 1},
    /* "\s+$" tried at every position of a long run of spaces is quadratic;
     * the lookbehind keeps only a run's first position, where any match of
     * it starts, so the matches are the same. */
    {.names = "deepseek-llm",
     .regex = {"[\r\n]", RE_DEEPSEEK_LETTERS, RE_DEEPSEEK_PUNCT, "(?<!\\s)\\s+$", RE_CJK,
               "\\p{N}+"}},
    {.names = "deepseek-coder",
     .regex = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}"}},
    {.names = "deepseek-v3 hunyuan-dense joyai-llm hy_v4",
     .regex = {"\\p{N}{1,3}", "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
               RE_DEEPSEEK3}},
    {.names = "falcon", .regex = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {.names = "starcoder refact command-r smollm codeshell exaone minerva-7b mellum2",
     .regex = {"\\p{N}", RE_GPT2}},
    {.names =
         "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
         "jina-v1-en jina-v2-code roberta-bpe exaone4 mpt olmo jais trillion granite-docling",
     .regex = {RE_GPT2}},
    {.names = "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open grok-2",
     .regex = {RE_QWEN2}},
    {.names = "qwen35", .regex = {RE_QWEN35}},
    {.names = "poro-chat bloom gpt3-finnish", .regex = {RE_PORO}},
    {.names = "viking", .regex = {RE_PORO, "\\p{N}"}},
    {.names = "tekken", .regex = {RE_TEKKEN}, .ignore_merges = 1, .add_bos = 1},
    {.names = "gpt-4o llama4 kanana2 talkie minimax-m2", .regex = {RE_GPT4O}},
    {.names = "seed-coder", .regex = {RE_SEED_CODER}},
    {.names = "bailingmoe bailingmoe2 llada-moe", .regex = {RE_BAILING}},
};

/* Whether `name` (length n) is one of the space-separated `names`. */
static int name_in(const char *name, size_t n, const char *names) {
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ' ');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && memcmp(p, name, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

ellm_status tok_bpe_configure_gguf(tokenizer *t, const gguf_file *f, ellm_error *err) {
    ellm_status st = tok_bpe_create(t, err);
    if (st != ELLM_OK) return st;

    const char *pre = "default";
    size_t pre_len = strlen(pre);
    if (gguf_find_key(f, "tokenizer.ggml.pre") >= 0) {
        st = gguf_get_str(f, "tokenizer.ggml.pre", &pre, &pre_len, err);
        if (st != ELLM_OK) return st;
    }
    const bpe_pre *p = NULL;
    for (size_t i = 0; i < sizeof(bpe_pres) / sizeof(bpe_pres[0]) && !p; i++) {
        if (name_in(pre, pre_len, bpe_pres[i].names)) p = &bpe_pres[i];
    }
    if (!p) {
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "tokenizer: pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported",
                         (int)(pre_len > 64 ? 64 : pre_len), pre);
    }
    for (int i = 0; i < 7 && p->regex[i]; i++) {
        st = tok_bpe_add_split(t, p->regex[i], strlen(p->regex[i]), 0, TOK_SPLIT_ISOLATED, 0, err);
        if (st != ELLM_OK) return st;
    }
    st = tok_bpe_add_byte_level(t, 0, 0, err);
    if (st != ELLM_OK) return st;
    tok_bpe_set_options(t, p->ignore_merges, 0, 0, -1, 0);
    if (p->add_bos) t->add_bos = 1;
    if (p->no_bos) t->bos = -1;
    t->piece_style = TOK_PIECE_BYTE_LEVEL;

    const char *key = "tokenizer.ggml.merges";
    int64_t kidx = gguf_find_key(f, key);
    if (kidx < 0) return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: missing %s", key);
    gguf_value_type et;
    uint64_t n;
    const void *data;
    st = gguf_get_arr(f, key, &et, &n, &data, err);
    if (st != ELLM_OK) return st;
    if (et != GGUF_TYPE_STRING) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s is not an array of strings", key);
    }
    if (n >= INT32_MAX) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s has %llu entries", key,
                         (unsigned long long)n);
    }
    for (uint64_t i = 0; i < n; i++) {
        const char *m;
        size_t len;
        if (gguf_get_arr_str(f, kidx, i, &m, &len) != ELLM_OK) {
            return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s[%llu] unreadable", key,
                             (unsigned long long)i);
        }
        /* "left right": the first space after the first byte separates them
         * (a left side may itself start with a space). */
        const char *sp = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;
        size_t la = sp ? (size_t)(sp - m) : 0;
        st = sp ? tok_bpe_add_merge(t, m, la, sp + 1, len - la - 1, err)
                : tok_bpe_add_merge(t, NULL, 0, NULL, 0, err);
        if (st != ELLM_OK) return st;
    }
    return ELLM_OK;
}

/* ---- encoding ---- */

/* A symbol: bytes [off, off + len) of the word; len 0 once merged into its
 * left neighbour. */
typedef struct {
    uint32_t off;
    uint32_t len;
    int32_t sid;
    int32_t prev; /* -1 at the start */
    int32_t next; /* -1 at the end */
} bpe_sym;

/* A candidate merge of adjacent symbols left and right, stale once either
 * has changed (their sids then differ from sid_l, sid_r) or stopped being
 * neighbours. */
typedef struct {
    int32_t rank;
    int32_t left, right;
    int32_t sid_l, sid_r;
    int32_t result;
} bpe_pair;

/* Scratch of one encode call, kept in tok_work.model. */
typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    char *nbuf[2]; /* normalizer output, alternately */
    size_t nbuf_cap[2];
    char *level[BPE_MAX_STEPS]; /* a step's rewritten piece */
    size_t level_cap[BPE_MAX_STEPS];
    char *enc; /* a byte-level word as characters */
    size_t enc_cap;

    /* Word cache: the ids of short words already encoded in this call, so
     * that a repeated word skips the merges (most words of a long text
     * repeat). Built only once a call has seen BPE_CACHE_AFTER words. */
    uint64_t n_words;
    struct bpe_cached *cache; /* BPE_CACHE_SLOTS slots */
    uint32_t cache_used;
    char *cache_text; /* the words, back to back */
    size_t cache_text_len, cache_text_cap;
    int32_t *cache_ids;                  /* their ids, back to back */
    size_t cache_ids_len, cache_ids_cap; /* in ids / bytes */
} bpe_work;

#define BPE_CACHE_AFTER 512
#define BPE_CACHE_SLOTS (1u << 16)
#define BPE_CACHE_MAX_WORD 32 /* bytes */
#define BPE_CACHE_MAX_IDS 64  /* a word of 32 bytes has at most 64 ids */

/* A cached word: text cache_text[text, text + len), ids cache_ids[ids, ids + n_ids). */
struct bpe_cached {
    uint32_t hash;
    uint32_t text;
    uint32_t ids;
    uint8_t len; /* 0: empty slot */
    uint8_t n_ids;
};

/* Frees a bpe_work (tok_work.model_free). */
static void bpe_work_free(void *p) {
    bpe_work *bw = p;
    if (!bw) return;
    pcre2_match_data_free(bw->md);
    pcre2_match_context_free(bw->mctx);
    pcre2_jit_stack_free(bw->jstack);
    free(bw->nbuf[0]);
    free(bw->nbuf[1]);
    for (int i = 0; i < BPE_MAX_STEPS; i++) free(bw->level[i]);
    free(bw->enc);
    free(bw->cache);
    free(bw->cache_text);
    free(bw->cache_ids);
    free(bw);
}

/* tok_work_reserve for a byte buffer, never of zero bytes. */
static ellm_status reserve(char **p, size_t *cap, size_t need, ellm_error *err) {
    return tok_work_reserve((void **)p, cap, need ? need : 1, err);
}

typedef struct {
    const tokenizer *t;
    const bpe_state *s;
    tok_work *w;
    bpe_work *bw;
    tok_sink *out;
    ellm_error *err;
    int last_unk; /* the previous symbol of this word became the unknown token */
} bpe_ctx;

/* Queue order: lower rank first, then the leftmost pair. */
static int pair_before(const bpe_pair *a, const bpe_pair *b) {
    if (a->rank != b->rank) return a->rank < b->rank;
    return a->left < b->left;
}

/* Pushes onto a heap of *n pairs whose array has room (sized by the caller). */
static void pair_push(bpe_pair *h, size_t *n, bpe_pair p) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = p;
}

/* Removes and returns the first pair of a non-empty heap. */
static bpe_pair pair_pop(bpe_pair *h, size_t *n) {
    bpe_pair top = h[0];
    bpe_pair last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pair_before(&h[c + 1], &h[c])) c++;
        if (!pair_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Queues the merge of symbols l and r when they have one. */
static void try_pair(const bpe_state *s, const bpe_sym *sym, bpe_pair *h, size_t *n, int32_t l,
                     int32_t r) {
    if (l < 0 || r < 0 || sym[l].sid < 0 || sym[r].sid < 0) return;
    const bpe_merge *m = merge_find(s, sym[l].sid, sym[r].sid);
    if (m) pair_push(h, n, (bpe_pair){m->rank, l, r, sym[l].sid, sym[r].sid, m->result});
}

/* Appends the tokens of a final symbol with bytes p[0, n). */
static void emit_symbol(bpe_ctx *c, int32_t sid, const char *p, size_t n) {
    const bpe_state *s = c->s;
    if (sid >= 0 && sid < c->t->n_vocab) {
        tok_sink_push(c->out, sid);
        c->last_unk = 0;
        return;
    }
    if (!s->hf) {
        /* llama.cpp: the tokens of the symbol text's single bytes, if any. */
        for (size_t i = 0; i < n; i++) {
            uint8_t b = (uint8_t)p[i];
            if (s->byte_level) {
                for (int k = 0; k < s->byte_chr_len[b]; k++) {
                    int32_t id = s->single_tok[(uint8_t)s->byte_chr[b][k]];
                    if (id >= 0) tok_sink_push(c->out, id);
                }
            } else if (s->single_tok[b] >= 0) {
                tok_sink_push(c->out, s->single_tok[b]);
            }
        }
        return;
    }
    if (s->byte_fallback) {
        int all = 1;
        for (size_t i = 0; i < n; i++) all &= s->fallback_tok[(uint8_t)p[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < n; i++) tok_sink_push(c->out, s->fallback_tok[(uint8_t)p[i]]);
            c->last_unk = 0;
            return;
        }
    }
    if (s->unk >= 0) {
        if (!(s->fuse_unk && c->last_unk)) tok_sink_push(c->out, s->unk);
        c->last_unk = 1;
    }
}

static ellm_status bpe_merge_word(bpe_ctx *c, const char *p, size_t n);

/* The cache slot of word p[0, n) with hash h: its entry, or the empty slot
 * where it would go (NULL when the table is full). */
static struct bpe_cached *cache_slot(bpe_work *bw, const char *p, size_t n, uint32_t h) {
    for (uint32_t i = h & (BPE_CACHE_SLOTS - 1), k = 0; k < BPE_CACHE_SLOTS;
         i = (i + 1) & (BPE_CACHE_SLOTS - 1), k++) {
        struct bpe_cached *e = &bw->cache[i];
        if (e->len == 0) return e;
        if (e->hash == h && e->len == n && memcmp(bw->cache_text + e->text, p, n) == 0) return e;
    }
    return NULL;
}

/* Encodes one word p[0, n) through the word cache when it is short. */
static ellm_status bpe_word(bpe_ctx *c, const char *p, size_t n) {
    bpe_work *bw = c->bw;
    if (n < 2 || n > BPE_CACHE_MAX_WORD || bw->n_words++ < BPE_CACHE_AFTER) {
        return bpe_merge_word(c, p, n);
    }
    if (!bw->cache) {
        bw->cache = calloc(BPE_CACHE_SLOTS, sizeof(*bw->cache));
        if (!bw->cache) return bpe_merge_word(c, p, n);
    }
    uint32_t h = tok_hash(p, n);
    struct bpe_cached *e = cache_slot(bw, p, n, h);
    if (e && e->len) {
        for (int i = 0; i < e->n_ids; i++) tok_sink_push(c->out, bw->cache_ids[e->ids + i]);
        return ELLM_OK;
    }
    /* Encode into a local sink, then copy out and remember. */
    int32_t ids[BPE_CACHE_MAX_IDS];
    tok_sink local = {ids, BPE_CACHE_MAX_IDS, 0};
    tok_sink *out = c->out;
    c->out = &local;
    ellm_status st = bpe_merge_word(c, p, n);
    c->out = out;
    if (st != ELLM_OK) return st;
    /* At most two ids per byte (llama.cpp's fallback), so they all fit. */
    if (local.n > BPE_CACHE_MAX_IDS) return bpe_merge_word(c, p, n);
    int64_t m = local.n;
    for (int64_t i = 0; i < m; i++) tok_sink_push(out, ids[i]);
    if (!e || 2 * (bw->cache_used + 1) > BPE_CACHE_SLOTS) return ELLM_OK;
    if (tok_work_reserve((void **)&bw->cache_text, &bw->cache_text_cap, bw->cache_text_len + n,
                         c->err) != ELLM_OK ||
        tok_work_reserve((void **)&bw->cache_ids, &bw->cache_ids_cap,
                         (bw->cache_ids_len + (size_t)m) * sizeof(int32_t), c->err) != ELLM_OK) {
        return ELLM_OK; /* the ids are out; the cache just stays as it is */
    }
    memcpy(bw->cache_text + bw->cache_text_len, p, n);
    if (m > 0) memcpy(bw->cache_ids + bw->cache_ids_len, ids, (size_t)m * sizeof(int32_t));
    *e = (struct bpe_cached){h, (uint32_t)bw->cache_text_len, (uint32_t)bw->cache_ids_len,
                             (uint8_t)n, (uint8_t)m};
    bw->cache_text_len += n;
    bw->cache_ids_len += (size_t)m;
    bw->cache_used++;
    return ELLM_OK;
}

/* Encodes one word p[0, n) with the merge loop. */
static ellm_status bpe_merge_word(bpe_ctx *c, const char *p, size_t n) {
    const tokenizer *t = c->t;
    const bpe_state *s = c->s;
    ellm_error *err = c->err;
    c->last_unk = 0;
    if (n == 0) return ELLM_OK;
    if (n > (size_t)INT32_MAX / 4) return ellm_fail(err, ELLM_ERR_ARG, "tokenizer: word too long");

    if (s->byte_level) {
        if (n == 1) {
            emit_symbol(c, s->byte_sid[(uint8_t)p[0]], p, 1);
            return ELLM_OK;
        }
        if (s->ignore_merges) {
            ellm_status st = reserve(&c->bw->enc, &c->bw->enc_cap, 2 * n, err);
            if (st != ELLM_OK) return st;
            size_t m = 0;
            for (size_t i = 0; i < n; i++) {
                uint8_t b = (uint8_t)p[i];
                memcpy(c->bw->enc + m, s->byte_chr[b], s->byte_chr_len[b]);
                m += s->byte_chr_len[b];
            }
            int32_t id = tok_find(t, c->bw->enc, m);
            if (id >= 0) {
                tok_sink_push(c->out, id);
                return ELLM_OK;
            }
        }
    } else if (s->ignore_merges) {
        int32_t id = tok_find(t, p, n);
        if (id >= 0) {
            tok_sink_push(c->out, id);
            return ELLM_OK;
        }
    }

    ellm_status st = tok_work_reserve(&c->w->sym, &c->w->sym_cap, n * sizeof(bpe_sym), err);
    if (st != ELLM_OK) return st;
    bpe_sym *sym = c->w->sym;
    int32_t n_sym = 0;
    for (size_t off = 0; off < n;) {
        size_t cl;
        int32_t sid;
        uint8_t b0 = (uint8_t)p[off];
        if (s->byte_level) {
            cl = 1;
            sid = s->byte_sid[b0];
        } else {
            cl = tok_utf8_len(b0);
            if (cl > n - off) cl = n - off;
            sid = b0 < 128 ? s->ascii_sid[b0] : sid_find(t, s, p + off, cl);
        }
        sym[n_sym] = (bpe_sym){(uint32_t)off, (uint32_t)cl, sid, n_sym - 1, -1};
        off += cl;
        if (off < n) sym[n_sym].next = n_sym + 1;
        n_sym++;
    }
    if (n_sym == 1) {
        emit_symbol(c, sym[0].sid, p, n);
        return ELLM_OK;
    }

    /* n_sym - 1 initial pairs, then at most two per merge and n_sym - 1 merges. */
    st = tok_work_reserve(&c->w->heap, &c->w->heap_cap, 3 * (size_t)n_sym * sizeof(bpe_pair), err);
    if (st != ELLM_OK) return st;
    bpe_pair *h = c->w->heap;
    size_t nh = 0;
    for (int32_t i = 1; i < n_sym; i++) try_pair(s, sym, h, &nh, i - 1, i);
    while (nh > 0) {
        bpe_pair b = pair_pop(h, &nh);
        bpe_sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->len == 0 || r->len == 0 || l->next != b.right || l->sid != b.sid_l ||
            r->sid != b.sid_r) {
            continue;
        }
        l->len += r->len;
        l->sid = b.result;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        try_pair(s, sym, h, &nh, l->prev, b.left);
        try_pair(s, sym, h, &nh, b.left, l->next);
    }
    for (int32_t i = 0; i != -1; i = sym[i].next) {
        emit_symbol(c, sym[i].sid, p + sym[i].off, sym[i].len);
    }
    return ELLM_OK;
}

static ellm_status run_steps(bpe_ctx *c, int k, const char *p, size_t n, int at_start);

/* Finds the first non-empty match of `re` in p[from, n). */
static ellm_status find_match(bpe_ctx *c, const pcre2_code *re, const char *p, size_t n,
                              size_t from, size_t *ms, size_t *me, int *found) {
    uint32_t opt = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY;
    int rc = pcre2_match(re, (PCRE2_SPTR)p, n, from, opt, c->bw->md, c->bw->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        rc = pcre2_match(re, (PCRE2_SPTR)p, n, from, opt | PCRE2_NO_JIT, c->bw->md, c->bw->mctx);
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
        *found = 0;
        return ELLM_OK;
    }
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        if (pcre2_get_error_message(rc, msg, sizeof(msg)) < 0) strcpy((char *)msg, "error");
        return ellm_fail(c->err, ELLM_ERR_UNSUPPORTED,
                         "tokenizer: pre-tokenizer regex failed on a %zu-byte piece: %s", n,
                         (const char *)msg);
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->bw->md);
    if (ov[0] < from || ov[1] <= ov[0] || ov[1] > n) {
        return ellm_fail(c->err, ELLM_ERR_UNSUPPORTED,
                         "tokenizer: pre-tokenizer regex gave an unusable match");
    }
    *ms = ov[0];
    *me = ov[1];
    *found = 1;
    return ELLM_OK;
}

/* Split state: pieces being merged by the split behaviour. */
typedef struct {
    size_t start, end;
    int have, is_match;
} pending_piece;

/* Sends p[s, e), a piece step k made, to the next step. */
static ellm_status emit_piece(bpe_ctx *c, int k, const char *p, size_t s, size_t e, int at_start) {
    return e > s ? run_steps(c, k + 1, p + s, e - s, at_start && s == 0) : ELLM_OK;
}

/* Handles one entry (a match or the text between matches) under the split
 * behaviour, as the tokenizers library folds them. */
static ellm_status split_entry(bpe_ctx *c, int k, tok_split_behavior b, pending_piece *pd,
                               const char *p, size_t s, size_t e, int m, int at_start) {
    ellm_status st = ELLM_OK;
    switch (b) {
    case TOK_SPLIT_ISOLATED: return emit_piece(c, k, p, s, e, at_start);
    case TOK_SPLIT_REMOVED: return m ? ELLM_OK : emit_piece(c, k, p, s, e, at_start);
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        if (m && !pd->is_match && pd->have) {
            pd->end = e;
        } else {
            if (pd->have) st = emit_piece(c, k, p, pd->start, pd->end, at_start);
            *pd = (pending_piece){s, e, 1, 0};
        }
        pd->is_match = m;
        return st;
    case TOK_SPLIT_MERGED_WITH_NEXT:
        /* A match joins the text after it, unless a match follows it. */
        if (m) {
            if (pd->have) st = emit_piece(c, k, p, pd->start, pd->end, at_start);
            *pd = (pending_piece){s, e, 1, 1};
            return st;
        }
        if (pd->have) {
            s = pd->start;
            pd->have = 0;
        }
        return emit_piece(c, k, p, s, e, at_start);
    case TOK_SPLIT_CONTIGUOUS:
        if (pd->have && pd->is_match == m) {
            pd->end = e;
            return ELLM_OK;
        }
        if (pd->have) st = emit_piece(c, k, p, pd->start, pd->end, at_start);
        *pd = (pending_piece){s, e, 1, m};
        return st;
    }
    return ELLM_OK;
}

/* Splits p[0, n) at the matches of `re` under behaviour b (matches and the
 * text between them swap roles with `invert`); each piece goes on to step k + 1. */
static ellm_status split_piece(bpe_ctx *c, int k, const pcre2_code *re, tok_split_behavior b,
                               int invert, const char *p, size_t n, int at_start) {
    pending_piece pd = {0, 0, 0, 0};
    size_t pos = 0;
    ellm_status st = ELLM_OK;
    while (pos < n && st == ELLM_OK) {
        size_t ms = n, me = n;
        int found;
        st = find_match(c, re, p, n, pos, &ms, &me, &found);
        if (st != ELLM_OK) return st;
        if (!found) ms = me = n;
        if (ms > pos) st = split_entry(c, k, b, &pd, p, pos, ms, invert, at_start);
        if (!found || st != ELLM_OK) break;
        st = split_entry(c, k, b, &pd, p, ms, me, !invert, at_start);
        pos = me;
    }
    if (st == ELLM_OK && pd.have) st = emit_piece(c, k, p, pd.start, pd.end, at_start);
    return st;
}

/* Metaspace: spaces become the replacement, which may go in front; then,
 * with split, a cut before each replacement. */
static ellm_status metaspace_piece(bpe_ctx *c, int k, const bpe_step *st, const char *p, size_t n,
                                   int at_start) {
    size_t r = st->rep_len;
    ellm_status rc = reserve(&c->bw->level[k], &c->bw->level_cap[k], r + n * r + n, c->err);
    if (rc != ELLM_OK) return rc;
    char *buf = c->bw->level[k];
    size_t m = r;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') {
            memcpy(buf + m, st->rep, r);
            m += r;
        } else {
            buf[m++] = p[i];
        }
    }
    const char *q = buf + r;
    size_t qn = m - r;
    int starts = qn >= r && memcmp(q, st->rep, r) == 0;
    if (!starts &&
        (st->scheme == TOK_PREPEND_ALWAYS || (st->scheme == TOK_PREPEND_FIRST && at_start))) {
        memcpy(buf, st->rep, r);
        q = buf;
        qn += r;
    }
    if (!st->split) return run_steps(c, k + 1, q, qn, at_start);
    size_t from = 0;
    for (size_t i = 1; i + r <= qn; i++) {
        if (memcmp(q + i, st->rep, r) == 0) {
            rc = emit_piece(c, k, q, from, i, at_start);
            if (rc != ELLM_OK) return rc;
            from = i;
            i += r - 1;
        }
    }
    return emit_piece(c, k, q, from, qn, at_start);
}

/* Sends p[0, n) through the steps from k on; past the last, it is a word. */
static ellm_status run_steps(bpe_ctx *c, int k, const char *p, size_t n, int at_start) {
    if (n == 0) return ELLM_OK;
    if (k == c->s->n_steps) return bpe_word(c, p, n);
    const bpe_step *st = &c->s->step[k];
    switch (st->kind) {
    case STEP_SPLIT: return split_piece(c, k, st->re, st->behavior, st->invert, p, n, at_start);
    case STEP_METASPACE: return metaspace_piece(c, k, st, p, n, at_start);
    case STEP_BYTE_LEVEL:
        if (st->add_prefix_space && p[0] != ' ') {
            ellm_status rc = reserve(&c->bw->level[k], &c->bw->level_cap[k], n + 1, c->err);
            if (rc != ELLM_OK) return rc;
            c->bw->level[k][0] = ' ';
            memcpy(c->bw->level[k] + 1, p, n);
            p = c->bw->level[k];
            n++;
        }
        if (st->re) return split_piece(c, k, st->re, TOK_SPLIT_ISOLATED, 0, p, n, at_start);
        return run_steps(c, k + 1, p, n, at_start);
    }
    return ELLM_OK;
}

/* Applies normalizer `nm` to p[0, n): the result is *out_p[0, *out_n),
 * either p itself (nothing changed) or *buf (grown as needed; p is not in it). */
static ellm_status normalize(bpe_ctx *c, const bpe_norm *nm, const char *p, size_t n, char **buf,
                             size_t *cap, const char **out_p, size_t *out_n) {
    *out_p = p;
    *out_n = n;
    ellm_error *err = c->err;
    ellm_status st;
    switch (nm->kind) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD: {
        utf8proc_option_t opt = UTF8PROC_STABLE;
        opt |= (nm->kind == TOK_NORM_NFC || nm->kind == TOK_NORM_NFKC) ? UTF8PROC_COMPOSE
                                                                       : UTF8PROC_DECOMPOSE;
        if (nm->kind == TOK_NORM_NFKC || nm->kind == TOK_NORM_NFKD) opt |= UTF8PROC_COMPAT;
        /* ASCII is in every normal form, and no ASCII character composes
         * with what precedes it or reorders: only runs of non-ASCII text,
         * with the character before each (which may take a combining mark),
         * go through utf8proc; the rest is copied. */
        size_t i = 0;
        while (i < n && (uint8_t)p[i] < 0x80) i++;
        if (i == n) return ELLM_OK;
        size_t m = 0;
        i = 0;
        while (i < n) {
            size_t j = i;
            while (j < n && (uint8_t)p[j] < 0x80) j++;
            size_t start = j > i ? j - 1 : j; /* the character before the run */
            size_t k = j;
            for (;;) { /* to the next ASCII gap of 16 bytes or more (fewer calls) */
                while (k < n && (uint8_t)p[k] >= 0x80) k++;
                size_t g = k;
                while (g < n && (uint8_t)p[g] < 0x80 && g - k < 16) g++;
                if (g == n || g - k >= 16) break;
                k = g;
            }
            st = reserve(buf, cap, m + (start - i), err);
            if (st != ELLM_OK) return st;
            memcpy(*buf + m, p + i, start - i);
            m += start - i;
            if (k > start) {
                utf8proc_uint8_t *dst = NULL;
                utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)p + start,
                                                  (utf8proc_ssize_t)(k - start), &dst, opt);
                if (r < 0) {
                    return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: normalization failed: %s",
                                     utf8proc_errmsg(r));
                }
                st = reserve(buf, cap, m + (size_t)r, err);
                if (st == ELLM_OK) memcpy(*buf + m, dst, (size_t)r);
                free(dst);
                if (st != ELLM_OK) return st;
                m += (size_t)r;
            }
            i = k;
        }
        *out_p = *buf;
        *out_n = m;
        return ELLM_OK;
    }
    case TOK_NORM_LOWERCASE: {
        st = reserve(buf, cap, 4 * n, err);
        if (st != ELLM_OK) return st;
        size_t m = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t cl = tok_utf8_decode((const uint8_t *)p + i, n - i, &cp);
            if (cl == 0) { /* not reached: the text is valid UTF-8 */
                (*buf)[m++] = p[i++];
                continue;
            }
            m += (size_t)utf8proc_encode_char(utf8proc_tolower((utf8proc_int32_t)cp),
                                              (utf8proc_uint8_t *)*buf + m);
            i += cl;
        }
        *out_p = *buf;
        *out_n = m;
        return ELLM_OK;
    }
    case TOK_NORM_PREPEND:
        st = reserve(buf, cap, nm->na + n, err);
        if (st != ELLM_OK) return st;
        memcpy(*buf, nm->a, nm->na);
        memcpy(*buf + nm->na, p, n);
        *out_p = *buf;
        *out_n = nm->na + n;
        return ELLM_OK;
    case TOK_NORM_REPLACE: {
        size_t count = 0;
        for (size_t i = 0; i + nm->na <= n;) {
            if (memcmp(p + i, nm->a, nm->na) == 0) {
                count++;
                i += nm->na;
            } else {
                i++;
            }
        }
        if (count == 0) return ELLM_OK;
        if (nm->nb > nm->na && count > (SIZE_MAX - n) / (nm->nb - nm->na)) {
            return ellm_fail(err, ELLM_ERR_ARG, "tokenizer: text too long after normalization");
        }
        st = reserve(buf, cap, n + count * (nm->nb > nm->na ? nm->nb - nm->na : 0), err);
        if (st != ELLM_OK) return st;
        size_t m = 0;
        for (size_t i = 0; i < n;) {
            if (i + nm->na <= n && memcmp(p + i, nm->a, nm->na) == 0) {
                memcpy(*buf + m, nm->b, nm->nb);
                m += nm->nb;
                i += nm->na;
            } else {
                (*buf)[m++] = p[i++];
            }
        }
        *out_p = *buf;
        *out_n = m;
        return ELLM_OK;
    }
    }
    return ELLM_OK;
}

/* The call's bpe_work, created on first use with its regex match state. */
static ellm_status bpe_work_get(tok_work *w, bpe_work **out, ellm_error *err) {
    if (w->model) {
        *out = w->model;
        return ELLM_OK;
    }
    bpe_work *bw = calloc(1, sizeof(*bw));
    if (!bw) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    bw->md = pcre2_match_data_create(1, NULL);
    bw->mctx = pcre2_match_context_create(NULL);
    bw->jstack = pcre2_jit_stack_create(32 * 1024, BPE_JIT_STACK_MAX, NULL);
    if (!bw->md || !bw->mctx) {
        bpe_work_free(bw);
        return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (regex)");
    }
    pcre2_set_match_limit(bw->mctx, BPE_MATCH_LIMIT);
    if (bw->jstack) pcre2_jit_stack_assign(bw->mctx, NULL, bw->jstack);
    w->model = bw;
    w->model_free = bpe_work_free;
    *out = bw;
    return ELLM_OK;
}

/* Normalizes a fragment, then runs the pre-tokenizer steps and BPE on it
 * (tok_model_ops.encode). */
static ellm_status bpe_encode(const tokenizer *t, const char *text, size_t len, int frag,
                              tok_work *w, tok_sink *out, ellm_error *err) {
    const bpe_state *s = t->model_state;
    bpe_work *bw = NULL;
    ellm_status st = bpe_work_get(w, &bw, err);
    if (st != ELLM_OK) return st;
    bpe_ctx c = {t, s, w, bw, out, err, 0};
    const char *p = text;
    size_t n = len;
    for (int i = 0; i < s->n_norms; i++) {
        if (s->norm[i].kind == TOK_NORM_PREPEND && n == 0) continue;
        int b = p == bw->nbuf[0]; /* the buffer p is not in */
        st = normalize(&c, &s->norm[i], p, n, &bw->nbuf[b], &bw->nbuf_cap[b], &p, &n);
        if (st != ELLM_OK) return st;
    }
    return run_steps(&c, 0, p, n, (frag & TOK_FRAG_TEXT_START) != 0);
}

const tok_model_ops tok_bpe_ops = {
    .name = "gpt2",
    .configure_gguf = tok_bpe_configure_gguf,
    .prepare = bpe_prepare,
    .release = bpe_release,
    .default_bos = 11,
    .default_eos = 11,
    .default_unk = -1,
    .default_add_bos = 0,
    .default_add_space_prefix = 0,
    .encode = bpe_encode,
};
