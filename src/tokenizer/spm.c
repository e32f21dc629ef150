/* SentencePiece-style BPE (tokenizer.ggml.model = "llama"), as llama.cpp's
 * SPM tokenizer does it:
 *
 *   1. spaces become "▁" (U+2581), and a "▁" is prepended to a fragment that
 *      starts the text or follows a special token when add_space_prefix is set;
 *   2. the text is split into UTF-8 characters (symbols);
 *   3. repeatedly, the adjacent pair whose concatenation is a vocabulary token
 *      with the highest score is merged (ties: the leftmost pair), using a
 *      priority queue of candidate pairs, so the whole is O(n log n);
 *   4. each final symbol is its token; a character that is not in the
 *      vocabulary becomes its UTF-8 bytes as <0xNN> tokens (byte fallback), or
 *      the unknown token when the vocabulary has no byte tokens.
 *
 * Speed: a merged symbol is always a vocabulary token, so two neighbouring
 * characters A and B can only ever end up in one symbol if some token
 * contains the text AB. Where no token does, the text is cut, and the pieces
 * are merged separately: no merge crosses a cut, and within a piece the merges
 * happen in the same order as in the whole, so the result is identical while
 * the queue stays small (roughly one word) and in cache. */
#include "tokenizer/tokenizer_impl.h"

#include "core/status.h"

#include <stdlib.h>
#include <string.h>

/* A symbol: a run of the escaped text, linked to its live neighbours. A symbol
 * merged into its left neighbour keeps n = 0. */
typedef struct {
    uint32_t off; /* into the escaped text */
    uint32_t n;   /* bytes */
    int32_t prev; /* -1 at the start */
    int32_t next; /* -1 at the end */
    int32_t id;   /* token of the text, or -1 (only a single character can lack one) */
} spm_sym;

/* A candidate merge of symbols left and right (adjacent when queued) into a
 * token of `score`; stale once either side has changed, which `size` (the
 * merged length when queued) detects. */
typedef struct {
    float score;
    int32_t left;
    int32_t right;
    uint32_t size;
    int32_t id; /* the merged token */
} spm_bigram;

typedef struct {
    spm_bigram *v;
    size_t n;
} spm_heap;

/* Heap order: higher score first, then the leftmost pair. */
static int bigram_before(const spm_bigram *a, const spm_bigram *b) {
    if (a->score != b->score) return a->score > b->score;
    return a->left < b->left;
}

/* Pushes onto a heap whose array has room (capacity is sized by the caller). */
static void heap_push(spm_heap *h, spm_bigram b) {
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &h->v[parent])) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = b;
}

/* Removes and returns the best bigram of a non-empty heap. */
static spm_bigram heap_pop(spm_heap *h) {
    spm_bigram top = h->v[0];
    spm_bigram last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && bigram_before(&h->v[c + 1], &h->v[c])) c++;
        if (!bigram_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}

/* Queues the merge of symbols left and right if their concatenation is a token. */
static void try_add_bigram(const tokenizer *t, const char *text, const spm_sym *sym, spm_heap *h,
                           int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    size_t n = (size_t)sym[left].n + sym[right].n;
    if (n > t->max_token_len) return;
    int32_t id = tok_find(t, text + sym[left].off, n);
    if (id < 0) return;
    spm_bigram b = {t->score[id], left, right, (uint32_t)n, id};
    heap_push(h, b);
}

/* Appends the tokens of one final symbol: its own token `id`, else byte
 * fallback, else one unknown token for the character. Fails only when the
 * vocabulary has neither byte tokens nor an unknown token. */
static ellm_status emit_symbol(const tokenizer *t, int32_t id, const char *s, size_t n,
                               tok_sink *out, ellm_error *err) {
    if (id >= 0) {
        tok_sink_push(out, id);
        return ELLM_OK;
    }
    int have_bytes = 1;
    for (size_t i = 0; i < n; i++) have_bytes &= t->byte_token[(uint8_t)s[i]] >= 0;
    if (have_bytes) {
        for (size_t i = 0; i < n; i++) tok_sink_push(out, t->byte_token[(uint8_t)s[i]]);
        return ELLM_OK;
    }
    if (t->unk >= 0) {
        tok_sink_push(out, t->unk);
        return ELLM_OK;
    }
    return ellm_fail(err, ELLM_ERR_FORMAT,
                     "tokenizer: character 0x%02X... is not in the vocabulary, which has no "
                     "byte-fallback tokens and no unknown token",
                     (unsigned)(uint8_t)s[0]);
}

/* Set of character pairs (A, B) that occur next to each other in some token,
 * keyed (A << 21) | B; open addressing, 0 marks an empty slot (the pair
 * (U+0000, U+0000) is kept apart in has_nul_pair). */
typedef struct {
    uint64_t *slot;
    uint64_t mask;
    int has_nul_pair;
    uint8_t ascii[128][128 / 8]; /* the same set for two ASCII characters, as bits */
    int32_t ascii_id[128];       /* token of each ASCII character, or -1 */
} spm_pairs;

static uint64_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

static int pairs_has(const spm_pairs *p, uint32_t a, uint32_t b) {
    if ((a | b) < 128) return (p->ascii[a][b >> 3] >> (b & 7)) & 1;
    uint64_t k = ((uint64_t)a << 21) | b;
    if (k == 0) return p->has_nul_pair;
    for (uint64_t i = pair_hash(k) & p->mask;; i = (i + 1) & p->mask) {
        if (p->slot[i] == k) return 1;
        if (p->slot[i] == 0) return 0;
    }
}

static void pairs_add(spm_pairs *p, uint32_t a, uint32_t b) {
    if ((a | b) < 128) {
        p->ascii[a][b >> 3] |= (uint8_t)(1u << (b & 7));
        return;
    }
    uint64_t k = ((uint64_t)a << 21) | b;
    if (k == 0) {
        p->has_nul_pair = 1;
        return;
    }
    uint64_t i = pair_hash(k) & p->mask;
    while (p->slot[i] != 0 && p->slot[i] != k) i = (i + 1) & p->mask;
    p->slot[i] = k;
}

/* Calls fn for each pair of valid characters adjacent in the token text,
 * starting at every byte offset, so that even a token that is not valid
 * UTF-8 contributes every AB it contains. Returns the number of pairs. */
static size_t token_pairs(const char *txt, size_t len, spm_pairs *p) {
    const uint8_t *s = (const uint8_t *)txt;
    size_t count = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t a, b;
        size_t la = tok_utf8_decode(s + i, len - i, &a);
        if (la == 0 || i + la >= len) continue;
        if (tok_utf8_decode(s + i + la, len - i - la, &b) == 0) continue;
        if (p) pairs_add(p, a, b);
        count++;
    }
    return count;
}

static ellm_status spm_prepare(tokenizer *t, ellm_error *err) {
    size_t n_pairs = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *s = tok_text(t, id, &len);
        n_pairs += token_pairs(s, len, NULL);
    }
    uint64_t n_slots = 64;
    while (n_slots < 2 * (uint64_t)n_pairs) n_slots *= 2;
    spm_pairs *p = calloc(1, sizeof(*p));
    if (p) p->slot = calloc(n_slots, sizeof(uint64_t));
    if (!p || !p->slot) {
        free(p);
        return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (pair table)");
    }
    p->mask = n_slots - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *s = tok_text(t, id, &len);
        token_pairs(s, len, p);
    }
    for (int c = 0; c < 128; c++) {
        char ch = (char)c;
        p->ascii_id[c] = tok_find(t, &ch, 1);
    }
    t->model_state = p;
    return ELLM_OK;
}

static void spm_release(tokenizer *t) {
    spm_pairs *p = t->model_state;
    if (p) free(p->slot);
    free(p);
    t->model_state = NULL;
}

/* Merges and emits the characters of buf[from, to), a run that no token
 * crosses out of. */
static ellm_status spm_merge(const tokenizer *t, const char *buf, size_t from, size_t to,
                             tok_work *w, tok_sink *out, ellm_error *err) {
    /* Symbols: one per character (the byte count bounds their number). */
    ellm_status st = tok_work_reserve(&w->sym, &w->sym_cap, (to - from) * sizeof(spm_sym), err);
    if (st != ELLM_OK) return st;
    const spm_pairs *pairs = t->model_state;
    spm_sym *sym = w->sym;
    int32_t n_sym = 0;
    for (size_t off = from; off < to;) {
        size_t cl = tok_utf8_len((uint8_t)buf[off]);
        if (cl > to - off) cl = to - off;
        sym[n_sym].off = (uint32_t)off;
        sym[n_sym].n = (uint32_t)cl;
        sym[n_sym].prev = n_sym - 1;
        uint8_t b0 = (uint8_t)buf[off];
        sym[n_sym].id = b0 < 128 ? pairs->ascii_id[b0] : tok_find(t, buf + off, cl);
        off += cl;
        sym[n_sym].next = off == to ? -1 : n_sym + 1;
        n_sym++;
    }
    if (n_sym == 0) return ELLM_OK;

    /* The queue holds the n_sym - 1 initial pairs plus at most two new pairs
     * per merge, and there are at most n_sym - 1 merges. */
    st = tok_work_reserve(&w->heap, &w->heap_cap, 3 * (size_t)n_sym * sizeof(spm_bigram), err);
    if (st != ELLM_OK) return st;
    spm_heap h = {w->heap, 0};
    for (int32_t i = 1; i < n_sym; i++) try_add_bigram(t, buf, sym, &h, i - 1, i);

    while (h.n > 0) {
        spm_bigram b = heap_pop(&h);
        spm_sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->next != b.right || l->n + r->n != b.size) continue;
        l->n += r->n;
        l->id = b.id;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        try_add_bigram(t, buf, sym, &h, l->prev, b.left);
        try_add_bigram(t, buf, sym, &h, b.left, l->next);
    }

    for (int32_t i = 0; i != -1; i = sym[i].next) {
        st = emit_symbol(t, sym[i].id, buf + sym[i].off, sym[i].n, out, err);
        if (st != ELLM_OK) return st;
    }
    return ELLM_OK;
}

/* Encodes one fragment; see tok_model_ops.encode. */
static ellm_status spm_encode(const tokenizer *t, const char *text, size_t len, int after_special,
                              tok_work *w, tok_sink *out, ellm_error *err) {
    static const char space_mark[3] = {'\xe2', '\x96', '\x81'}; /* U+2581 "▁" */

    /* Escaped text: at most 3 bytes per input byte, plus the prefix. */
    ellm_status st = tok_work_reserve(&w->buf, &w->buf_cap, 3 * len + 3, err);
    if (st != ELLM_OK) return st;
    char *buf = w->buf;
    size_t n = 0;
    if (after_special && t->add_space_prefix) {
        memcpy(buf, space_mark, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, space_mark, 3);
            n += 3;
        } else {
            buf[n++] = text[i];
        }
    }

    /* Cut between characters A and B wherever no token contains AB. Around
     * bytes that are not a valid character (possible only if a special token
     * split one), never cut: merging the whole is always exact. */
    const spm_pairs *pairs = t->model_state;
    size_t from = 0, off = 0;
    uint32_t prev_cp = 0;
    int prev_ok = 0;
    while (off < n) {
        uint32_t cp = 0;
        size_t cl = tok_utf8_decode((const uint8_t *)buf + off, n - off, &cp);
        int ok = cl > 0;
        if (!ok) {
            cl = tok_utf8_len((uint8_t)buf[off]);
            if (cl > n - off) cl = n - off;
        }
        if (ok && prev_ok && off > from && !pairs_has(pairs, prev_cp, cp)) {
            st = spm_merge(t, buf, from, off, w, out, err);
            if (st != ELLM_OK) return st;
            from = off;
        }
        prev_cp = cp;
        prev_ok = ok;
        off += cl;
    }
    return spm_merge(t, buf, from, n, w, out, err);
}

const tok_model_ops tok_spm_ops = {
    .name = "llama",
    .default_bos = 1,
    .default_eos = 2,
    .default_unk = 0,
    .default_add_bos = 1,
    .default_add_space_prefix = 1,
    .prepare = spm_prepare,
    .release = spm_release,
    .encode = spm_encode,
};
