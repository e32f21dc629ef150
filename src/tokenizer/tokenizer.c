/* Tokenizer construction from GGUF metadata, special-token splitting and the
 * public encode entry point. The algorithm proper lives behind tok_model_ops
 * (spm.c, bpe.c); tokenizer.json loading in hf_json.c; detokenization in
 * detok.c.
 *
 * Behaviour follows llama.cpp's llama_vocab (load, tokenizer_st_partition,
 * tokenize), so that ids match it on every input:
 *  - control, user-defined and unknown tokens are "special"; before the text
 *    is encoded, their occurrences are split out, longest token text first,
 *    each token taking its leftmost non-overlapping occurrences in the text
 *    not yet claimed. Without parse_special only user-defined tokens are split.
 *  - the space prefix goes on the first text fragment and on each fragment
 *    that follows a special token.
 *  - end-of-generation tokens: eos, eot, eom, the FIM pad/repo/separator
 *    tokens and tokens whose text is a known end marker ("<|im_end|>", ...). */
#include "tokenizer/tokenizer_impl.h"

#include "core/status.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokenizer algorithms by tokenizer.ggml.model. */
static const tok_model_ops *const tok_models[] = {
    &tok_spm_ops,
    &tok_bpe_ops,
};

/* Texts longer than this are refused: symbol offsets are 32-bit and the
 * escaped text may be three times the input. */
#define TOK_MAX_TEXT ((size_t)512 << 20)
/* Vocabularies larger than this are refused as implausible. */
#define TOK_MAX_VOCAB (1 << 24)

/* ---- scratch memory ---- */

void tok_work_free(tok_work *w) {
    if (w->model && w->model_free) w->model_free(w->model);
    free(w->buf);
    free(w->sym);
    free(w->heap);
    memset(w, 0, sizeof(*w));
}

ellm_status tok_work_reserve(void **p, size_t *cap, size_t need, ellm_error *err) {
    if (need <= *cap) return ELLM_OK;
    size_t n = *cap ? *cap : 256;
    while (n < need) n = n > SIZE_MAX / 2 ? need : 2 * n;
    void *q = realloc(*p, n);
    if (!q) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", n);
    *p = q;
    *cap = n;
    return ELLM_OK;
}

/* ---- text -> id hash ---- */

int32_t tok_find(const tokenizer *t, const char *s, size_t n) {
    uint32_t h = tok_hash(s, n);
    for (uint32_t i = h & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        const tok_slot *sl = &t->slot[i];
        if (sl->id < 0) return -1;
        if (sl->hash != h) continue;
        size_t len;
        const char *txt = tok_text(t, sl->id, &len);
        if (len == n && memcmp(txt, s, n) == 0) return sl->id;
    }
}

/* Inserts every token; a text that appears twice is a malformed vocabulary
 * (llama.cpp refuses it too). */
ellm_status tok_build_hash(tokenizer *t, ellm_error *err) {
    uint32_t n_slots = 16;
    while (n_slots < 2u * (uint32_t)t->n_vocab) n_slots *= 2;
    t->slot = malloc(n_slots * sizeof(*t->slot));
    if (!t->slot) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (hash)");
    for (uint32_t i = 0; i < n_slots; i++) t->slot[i] = (tok_slot){0, -1};
    t->slot_mask = n_slots - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *s = tok_text(t, id, &len);
        uint32_t h = tok_hash(s, len);
        uint32_t i = h & t->slot_mask;
        while (t->slot[i].id >= 0) {
            size_t l2;
            const char *s2 = tok_text(t, t->slot[i].id, &l2);
            if (l2 == len && memcmp(s, s2, len) == 0) {
                return ellm_fail(err, ELLM_ERR_FORMAT,
                                 "tokenizer: duplicate token '%.*s' (ids %d and %d)",
                                 (int)(len > 64 ? 64 : len), s, t->slot[i].id, id);
            }
            i = (i + 1) & t->slot_mask;
        }
        t->slot[i] = (tok_slot){h, id};
    }
    return ELLM_OK;
}

/* ---- metadata ---- */

/* Reads the token texts; an empty text becomes "[EMPTY_<id>]" as in llama.cpp. */
static ellm_status load_tokens(tokenizer *t, const gguf_file *f, ellm_error *err) {
    const char *key = "tokenizer.ggml.tokens";
    int64_t kidx = gguf_find_key(f, key);
    if (kidx < 0) return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: missing %s", key);
    gguf_value_type et;
    uint64_t n;
    const void *data;
    ellm_status st = gguf_get_arr(f, key, &et, &n, &data, err);
    if (st != ELLM_OK) return st;
    if (et != GGUF_TYPE_STRING) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s is not an array of strings", key);
    }
    if (n == 0 || n > TOK_MAX_VOCAB) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s has %llu entries (1..%d allowed)",
                         key, (unsigned long long)n, TOK_MAX_VOCAB);
    }
    t->n_vocab = (int32_t)n;
    t->text_off = malloc(((size_t)n + 1) * sizeof(size_t));
    if (!t->text_off) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");

    /* Two passes: sizes, then copies. */
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        st = gguf_get_arr_str(f, kidx, i, &s, &len);
        if (st != ELLM_OK) {
            return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s[%llu] unreadable", key,
                             (unsigned long long)i);
        }
        t->text_off[i] = total;
        total += (len ? len : 32) + 1;
    }
    t->text_off[n] = total;
    t->text = malloc(total ? total : 1);
    if (!t->text)
        return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", total);
    size_t pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        gguf_get_arr_str(f, kidx, i, &s, &len);
        t->text_off[i] = pos;
        if (len) {
            memcpy(t->text + pos, s, len);
        } else {
            len = (size_t)snprintf(t->text + pos, 32, "[EMPTY_%llu]", (unsigned long long)i);
        }
        t->text[pos + len] = 0;
        pos += len + 1;
        if (len > t->max_token_len) t->max_token_len = len;
    }
    t->text_off[n] = pos;
    return ELLM_OK;
}

/* Scores (float32 or int32, optional: 0) and token types (int32, optional:
 * all normal). An array shorter than the vocabulary is malformed. */
static ellm_status load_scores_types(tokenizer *t, const gguf_file *f, ellm_error *err) {
    size_t n = (size_t)t->n_vocab;
    t->score = calloc(n, sizeof(float));
    t->attr = malloc(n * sizeof(uint16_t));
    if (!t->score || !t->attr) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");

    gguf_value_type et;
    uint64_t cnt;
    const void *data;
    const char *key = "tokenizer.ggml.scores";
    if (gguf_find_key(f, key) >= 0) {
        ellm_status st = gguf_get_arr(f, key, &et, &cnt, &data, err);
        if (st != ELLM_OK) return st;
        if (et != GGUF_TYPE_FLOAT32 && et != GGUF_TYPE_INT32) {
            return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s must be float32 or int32", key);
        }
        if (cnt < n) {
            return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s has %llu entries for %zu tokens",
                             key, (unsigned long long)cnt, n);
        }
        for (size_t i = 0; i < n; i++) {
            if (et == GGUF_TYPE_FLOAT32) {
                memcpy(&t->score[i], (const char *)data + 4 * i, 4);
            } else {
                int32_t v;
                memcpy(&v, (const char *)data + 4 * i, 4);
                t->score[i] = (float)v;
            }
        }
    }

    for (size_t i = 0; i < n; i++) t->attr[i] = TOK_ATTR_NORMAL;
    key = "tokenizer.ggml.token_type";
    if (gguf_find_key(f, key) >= 0) {
        ellm_status st = gguf_get_arr(f, key, &et, &cnt, &data, err);
        if (st != ELLM_OK) return st;
        if (et != GGUF_TYPE_INT32) {
            return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s must be int32", key);
        }
        if (cnt < n) {
            return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: %s has %llu entries for %zu tokens",
                             key, (unsigned long long)cnt, n);
        }
        for (size_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, (const char *)data + 4 * i, 4);
            switch (v) {
            case TOK_TYPE_NORMAL: t->attr[i] = TOK_ATTR_NORMAL; break;
            case TOK_TYPE_UNKNOWN: t->attr[i] = TOK_ATTR_UNKNOWN; break;
            case TOK_TYPE_CONTROL: t->attr[i] = TOK_ATTR_CONTROL; break;
            case TOK_TYPE_USER_DEFINED: t->attr[i] = TOK_ATTR_USER_DEFINED; break;
            case TOK_TYPE_UNUSED: t->attr[i] = TOK_ATTR_UNUSED; break;
            case TOK_TYPE_BYTE: t->attr[i] = TOK_ATTR_BYTE; break;
            default: t->attr[i] = TOK_ATTR_UNDEFINED; break;
            }
        }
    }
    return ELLM_OK;
}

/* Sets *id from an optional integer key when the value is a valid token id;
 * out-of-range values (e.g. -1 for "none") keep the default, as in llama.cpp. */
static ellm_status read_token_id(const gguf_file *f, const char *key, int32_t n_vocab, int32_t *id,
                                 ellm_error *err) {
    if (gguf_find_key(f, key) < 0) return ELLM_OK;
    int64_t v;
    ellm_status st = gguf_get_i64(f, key, &v, err);
    if (st != ELLM_OK) return st;
    if (v >= 0 && v < n_vocab) *id = (int32_t)v;
    return ELLM_OK;
}

static ellm_status read_flag(const gguf_file *f, const char *key, int *flag, ellm_error *err) {
    if (gguf_find_key(f, key) < 0) return ELLM_OK;
    return gguf_get_bool(f, key, flag, err);
}

/* Index of `s` (length n) in the NULL-terminated list, or -1. */
static int text_in(const char *s, size_t n, const char *const *list) {
    for (int i = 0; list[i]; i++) {
        if (strlen(list[i]) == n && memcmp(list[i], s, n) == 0) return i;
    }
    return -1;
}

/* Tokens a text-based guess may pick: with `added_only`, only tokens the
 * file itself declares special (control or user-defined). */
static int guessable(const tokenizer *t, int32_t id, int added_only) {
    return !added_only || (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED));
}

/* Finds the first token (by id) whose text is in `list` when *id is unset,
 * and marks it as a control token. */
static void detect_by_text(tokenizer *t, const char *const *list, int32_t *id, int added_only) {
    if (*id >= 0) return;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t len;
        const char *s = tok_text(t, i, &len);
        if (guessable(t, i, added_only) && text_in(s, len, list) >= 0) {
            *id = i;
            t->attr[i] |= TOK_ATTR_CONTROL;
            return;
        }
    }
}

static int32_t find_cstr(const tokenizer *t, const char *s) { return tok_find(t, s, strlen(s)); }

/* DeepSeek's "<｜end▁of▁sentence｜>" (full-width bars). */
#define DEEPSEEK_EOS                                                                               \
    "<\xef\xbd\x9c"                                                                                \
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

/* Special ids and flags from the metadata, over the defaults already in `t`;
 * then the end-of-generation tokens. */
static ellm_status load_specials(tokenizer *t, const gguf_file *f, ellm_error *err) {
    int32_t n = t->n_vocab;
    t->eot = t->eom = -1;
    int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
    struct {
        const char *key;
        int32_t *id;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", &t->bos},
        {"tokenizer.ggml.eos_token_id", &t->eos},
        {"tokenizer.ggml.eot_token_id", &t->eot},
        {"tokenizer.ggml.eom_token_id", &t->eom},
        {"tokenizer.ggml.unknown_token_id", &t->unk},
        {"tokenizer.ggml.fim_pad_token_id", &fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &fim_rep},
        {"tokenizer.ggml.fim_sep_token_id", &fim_sep},
    };
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        ellm_status st = read_token_id(f, ids[i].key, n, ids[i].id, err);
        if (st != ELLM_OK) return st;
    }

    ellm_status st = read_flag(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err);
    if (st == ELLM_OK) st = read_flag(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err);
    if (st == ELLM_OK) st = read_flag(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err);
    if (st != ELLM_OK) return st;
    if (t->add_bos && t->bos < 0) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer: add_bos_token is set but there is no BOS token");
    }
    if (t->add_eos && t->eos < 0) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer: add_eos_token is set but there is no EOS token");
    }
    tok_mark_specials(t, fim_pad, fim_rep, fim_sep, 0);
    return ELLM_OK;
}

void tok_mark_specials(tokenizer *t, int32_t fim_pad, int32_t fim_rep, int32_t fim_sep,
                       int added_only) {
    static const char *const eot_texts[] = {
        "<|eot_id|>",         "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>",    "<EOT>",      "_<EOT>",  "[EOT]",         DEEPSEEK_EOS,
        "<end_of_utterance>", NULL};
    static const char *const eom_texts[] = {"<|eom_id|>", NULL};
    static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                                "<PAD>",       "[PAD]",     NULL};
    static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                                "<REPO>",       "<reponame>",    NULL};
    static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
    static const char *const eog_texts[] = {"<|eot_id|>",
                                            "<|im_end|>",
                                            "<|end|>",
                                            "<|return|>",
                                            "<|call|>",
                                            "<|flush|>",
                                            "<|calls|>",
                                            "<end_of_turn>",
                                            "<|endoftext|>",
                                            "</s>",
                                            "<|eom_id|>",
                                            "<EOT>",
                                            "_<EOT>",
                                            "[EOT]",
                                            "[EOS]",
                                            "<|end_of_text|>",
                                            "<end_of_utterance>",
                                            "<eos>",
                                            "<turn|>",
                                            "<|tool_response>",
                                            DEEPSEEK_EOS,
                                            "[e~[",
                                            NULL};
    static const char *const always_user_defined[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                      "<|constrain|>", NULL};

    int32_t n = t->n_vocab;
    /* Tokens found by their text when the metadata does not name them. */
    detect_by_text(t, eot_texts, &t->eot, added_only);
    detect_by_text(t, eom_texts, &t->eom, added_only);
    detect_by_text(t, fim_pad_texts, &fim_pad, added_only);
    detect_by_text(t, fim_rep_texts, &fim_rep, added_only);
    detect_by_text(t, fim_sep_texts, &fim_sep, added_only);

    if (fim_pad >= 0) t->attr[fim_pad] |= TOK_ATTR_EOG;
    if (fim_rep >= 0) t->attr[fim_rep] |= TOK_ATTR_EOG;
    if (fim_sep >= 0) t->attr[fim_sep] |= TOK_ATTR_EOG;
    for (int32_t i = 0; i < n; i++) {
        size_t len;
        const char *s = tok_text(t, i, &len);
        if (!guessable(t, i, added_only)) continue;
        if (text_in(s, len, eog_texts) >= 0) t->attr[i] |= TOK_ATTR_EOG | TOK_ATTR_CONTROL;
        if (text_in(s, len, always_user_defined) >= 0) t->attr[i] = TOK_ATTR_USER_DEFINED;
    }
    if (t->eos >= 0) t->attr[t->eos] |= TOK_ATTR_EOG;
    if (t->eot >= 0) t->attr[t->eot] |= TOK_ATTR_EOG;
    if (t->eom >= 0) t->attr[t->eom] |= TOK_ATTR_EOG;

    /* Harmony-style vocabularies (<|return|> and <|call|>, or <|calls|> and
     * <|flush|>) use <|end|> between messages: not an end of generation. */
    int32_t end = find_cstr(t, "<|end|>");
    int32_t ret = find_cstr(t, "<|return|>"), call = find_cstr(t, "<|call|>");
    int32_t calls = find_cstr(t, "<|calls|>"), flush = find_cstr(t, "<|flush|>");
    int has_call = (call >= 0 && (t->attr[call] & TOK_ATTR_EOG)) ||
                   (calls >= 0 && (t->attr[calls] & TOK_ATTR_EOG));
    int has_ret = ret >= 0 && (t->attr[ret] & TOK_ATTR_EOG);
    int has_flush = flush >= 0 && (t->attr[flush] & TOK_ATTR_EOG);
    if (end >= 0 && (t->attr[end] & TOK_ATTR_EOG) && has_call && (has_ret || has_flush)) {
        t->attr[end] = TOK_ATTR_USER_DEFINED;
    }
    /* With <|tool_response> (Gemma 4), </s> is ordinary text. */
    int32_t tool = find_cstr(t, "<|tool_response>"), eos_s = find_cstr(t, "</s>");
    if (tool >= 0 && (t->attr[tool] & TOK_ATTR_EOG) && eos_s >= 0 &&
        (t->attr[eos_s] & TOK_ATTR_EOG)) {
        t->attr[eos_s] = TOK_ATTR_NORMAL;
    }
}

/* A special token and the length of its text, for sorting. */
typedef struct {
    size_t len;
    int32_t id;
} tok_len_id;

/* Splitting priority: longer text first, then lower id. */
static int cmp_len_id(const void *a, const void *b) {
    const tok_len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Collects the special tokens in priority order and builds their trie. */
static ellm_status build_specials(tokenizer *t, ellm_error *err) {
    const uint16_t special_attr = TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN;
    int n = 0;
    size_t n_bytes = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] & special_attr) {
            n++;
            n_bytes += t->text_off[i + 1] - t->text_off[i] - 1;
        }
    }
    for (int b = 0; b < 256; b++) t->trie_root[b] = -1;
    t->n_special = n;
    if (n == 0) return ELLM_OK;
    tok_len_id *order = malloc((size_t)n * sizeof(tok_len_id));
    t->special = malloc((size_t)n * sizeof(int32_t));
    t->trie = malloc(n_bytes * sizeof(tok_trie_node)); /* at most one node per byte */
    if (!order || !t->special || !t->trie) {
        free(order);
        return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    }
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] & special_attr) {
            order[n].len = t->text_off[i + 1] - t->text_off[i] - 1;
            order[n++].id = i;
        }
    }
    qsort(order, (size_t)n, sizeof(tok_len_id), cmp_len_id);
    for (int r = 0; r < n; r++) t->special[r] = order[r].id;
    free(order);

    t->n_trie = 0;
    for (int r = 0; r < n; r++) {
        size_t len;
        const uint8_t *s = (const uint8_t *)tok_text(t, t->special[r], &len);
        int32_t node = t->trie_root[s[0]];
        if (node < 0) {
            node = t->n_trie++;
            t->trie[node] = (tok_trie_node){.child = -1, .sibling = -1, .rank = -1, .byte = s[0]};
            t->trie_root[s[0]] = node;
        }
        for (size_t k = 1; k < len; k++) {
            int32_t c = t->trie[node].child;
            while (c >= 0 && t->trie[c].byte != s[k]) c = t->trie[c].sibling;
            if (c < 0) {
                c = t->n_trie++;
                t->trie[c] = (tok_trie_node){
                    .child = -1, .sibling = t->trie[node].child, .rank = -1, .byte = s[k]};
                t->trie[node].child = c;
            }
            node = c;
        }
        /* Texts are unique (duplicates were rejected): each end node is claimed once. */
        t->trie[node].rank = r;
    }
    return ELLM_OK;
}

/* Model-specific attribute fix-ups llama.cpp applies by general.name: Phi-3
 * special tokens eat the whitespace after them, except <unk>, <s> and
 * <|endoftext|>. */
static ellm_status apply_name_fixups(tokenizer *t, const gguf_file *f, ellm_error *err) {
    if (gguf_find_key(f, "general.name") < 0) return ELLM_OK;
    const char *name;
    size_t len;
    ellm_status st = gguf_get_str(f, "general.name", &name, &len, err);
    if (st != ELLM_OK) return st;
    char low[256];
    if (len >= sizeof(low)) len = sizeof(low) - 1;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        low[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    low[len] = 0;
    if (!strstr(low, "phi-3") && !strstr(low, "phi3")) return ELLM_OK;
    for (int r = 0; r < t->n_special; r++) t->attr[t->special[r]] |= TOK_ATTR_RSTRIP;
    int32_t id = find_cstr(t, "</s>");
    if (id >= 0) t->attr[id] |= TOK_ATTR_RSTRIP;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (int i = 0; i < 3; i++) {
        id = find_cstr(t, keep[i]);
        if (id >= 0) t->attr[id] &= (uint16_t)~TOK_ATTR_RSTRIP;
    }
    return ELLM_OK;
}

/* Byte-fallback token of each byte: "<0xNN>" (upper-case hex), else a token
 * whose text is that single byte. */
static void build_byte_tokens(tokenizer *t) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        int32_t id = tok_find(t, buf, 6);
        if (id < 0) {
            char c = (char)b;
            id = tok_find(t, &c, 1);
        }
        t->byte_token[b] = id;
    }
}

/* ---- the GPT-2 byte <-> unicode map ---- */

/* The bytes that are not printable, in order: 0x00-0x20 (33), 0x7F-0xA0 (34)
 * and 0xAD; the k-th of them stands for U+0100 + k. */
uint32_t tok_byte_to_cp(uint8_t b) {
    if (b <= 0x20) return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0) return 0x100 + 33 + (b - 0x7Fu);
    if (b == 0xAD) return 0x100 + 67;
    return b;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return tok_byte_to_cp((uint8_t)cp) == cp ? (int)cp : -1;
    uint32_t k = cp - 0x100;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(0x7F + k - 33);
    return k == 67 ? 0xAD : -1;
}

/* Decodes a byte-level token text: each character that stands for a byte
 * becomes that byte; any other character (or invalid byte) is kept as is.
 * Writes at most `len` bytes to dst. */
static size_t byte_level_piece(const char *s, size_t len, char *dst) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t cl = tok_utf8_decode((const uint8_t *)s + i, len - i, &cp);
        int b = cl ? tok_cp_to_byte(cp) : -1;
        if (b >= 0) {
            dst[n++] = (char)b;
            i += cl;
        } else {
            size_t k = cl ? cl : 1;
            memcpy(dst + n, s + i, k);
            n += k;
            i += k;
        }
    }
    return n;
}

/* Bytes token `id` detokenizes to, as llama.cpp's token_to_piece with
 * special = false: control and unknown tokens give nothing, user-defined
 * tokens their text, normal tokens their text with "▁" as a space (or, in
 * byte-level vocabularies, through the byte map), byte tokens their byte,
 * other types nothing. Writes to dst (room for the text). */
static size_t token_piece(const tokenizer *t, int32_t id, char *dst) {
    size_t len;
    const char *s = tok_text(t, id, &len);
    uint16_t a = t->attr[id];
    if (a & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL)) return 0;
    if (a & TOK_ATTR_USER_DEFINED) {
        memcpy(dst, s, len);
        return len;
    }
    if ((a & TOK_ATTR_NORMAL) && t->piece_style == TOK_PIECE_BYTE_LEVEL) {
        return byte_level_piece(s, len, dst);
    }
    if (a & TOK_ATTR_NORMAL) {
        size_t n = 0;
        for (size_t i = 0; i < len;) {
            if (i + 3 <= len && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                dst[n++] = ' ';
                i += 3;
            } else {
                dst[n++] = s[i++];
            }
        }
        return n;
    }
    if (a & TOK_ATTR_BYTE) {
        if (len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            char hx[3] = {s[3], s[4], 0};
            dst[0] = (char)strtol(hx, NULL, 16);
            return 1;
        }
        if (len == 1) { /* a byte token whose text is the byte */
            dst[0] = s[0];
            return 1;
        }
        return 0;
    }
    return 0;
}

/* Copies tokenizer.chat_template when present. */
static ellm_status load_chat_template(tokenizer *t, const gguf_file *f, ellm_error *err) {
    const char *key = "tokenizer.chat_template";
    if (gguf_find_key(f, key) < 0) return ELLM_OK;
    const char *s;
    size_t len;
    ellm_status st = gguf_get_str(f, key, &s, &len, err);
    if (st != ELLM_OK) return st;
    t->chat_template = malloc(len + 1);
    if (!t->chat_template) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(t->chat_template, s, len);
    t->chat_template[len] = 0;
    return ELLM_OK;
}

static ellm_status build_pieces(tokenizer *t, ellm_error *err) {
    /* A piece is never longer than its text. */
    t->piece = malloc(t->text_off[t->n_vocab] + 1);
    t->piece_off = malloc(((size_t)t->n_vocab + 1) * sizeof(size_t));
    if (!t->piece || !t->piece_off)
        return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    size_t pos = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = pos;
        size_t n = token_piece(t, id, t->piece + pos);
        if (n > t->max_piece_len) t->max_piece_len = n;
        pos += n;
    }
    t->piece_off[t->n_vocab] = pos;
    return ELLM_OK;
}

/* The tables every tokenizer ends with: pieces, byte tokens, the model's. */
static ellm_status finish_tables(tokenizer *t, ellm_error *err) {
    ellm_status st = build_pieces(t, err);
    if (st != ELLM_OK) return st;
    build_byte_tokens(t);
    return t->ops->prepare ? t->ops->prepare(t, err) : ELLM_OK;
}

ellm_status tokenizer_init_gguf(const gguf_file *f, tokenizer **out, ellm_error *err) {
    if (!f || !out) return ellm_fail(err, ELLM_ERR_ARG, "tokenizer_init_gguf: NULL argument");
    *out = NULL;

    const char *model;
    size_t model_len;
    if (gguf_find_key(f, "tokenizer.ggml.model") < 0) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer: missing tokenizer.ggml.model");
    }
    ellm_status st = gguf_get_str(f, "tokenizer.ggml.model", &model, &model_len, err);
    if (st != ELLM_OK) return st;
    const tok_model_ops *ops = NULL;
    for (size_t i = 0; i < sizeof(tok_models) / sizeof(tok_models[0]); i++) {
        if (strlen(tok_models[i]->name) == model_len &&
            memcmp(tok_models[i]->name, model, model_len) == 0) {
            ops = tok_models[i];
        }
    }
    if (!ops) {
        int n = model_len > 64 ? 64 : (int)model_len;
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "tokenizer: tokenizer.ggml.model '%.*s' is not supported "
                         "(supported: 'llama', 'gpt2')",
                         n, model);
    }

    tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    t->ops = ops;
    st = load_tokens(t, f, err);
    if (st == ELLM_OK) st = load_scores_types(t, f, err);
    if (st == ELLM_OK) st = tok_build_hash(t, err);
    if (st == ELLM_OK) {
        int32_t n = t->n_vocab;
        t->bos = ops->default_bos < n ? ops->default_bos : -1;
        t->eos = ops->default_eos < n ? ops->default_eos : -1;
        t->unk = ops->default_unk < n ? ops->default_unk : -1;
        t->add_space_prefix = ops->default_add_space_prefix;
        t->add_bos = ops->default_add_bos;
        t->add_eos = 0;
        if (ops->configure_gguf) st = ops->configure_gguf(t, f, err);
    }
    if (st == ELLM_OK) st = load_specials(t, f, err);
    if (st == ELLM_OK) st = load_chat_template(t, f, err);
    if (st == ELLM_OK) st = build_specials(t, err);
    if (st == ELLM_OK) st = apply_name_fixups(t, f, err);
    if (st == ELLM_OK) st = finish_tables(t, err);
    if (st != ELLM_OK) {
        tokenizer_free(t);
        return st;
    }
    *out = t;
    return ELLM_OK;
}

ellm_status tok_finish(tokenizer *t, ellm_error *err) {
    ellm_status st = build_specials(t, err);
    if (st == ELLM_OK) st = finish_tables(t, err);
    return st;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    if (t->ops && t->ops->release) t->ops->release(t);
    free(t->text);
    free(t->text_off);
    free(t->score);
    free(t->attr);
    free(t->piece);
    free(t->piece_off);
    free(t->slot);
    free(t->special);
    free(t->trie);
    free(t->chat_template);
    free(t);
}

int tokenizer_n_vocab(const tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t tokenizer_bos(const tokenizer *t) { return t ? t->bos : -1; }
int32_t tokenizer_eos(const tokenizer *t) { return t ? t->eos : -1; }
int tokenizer_add_bos(const tokenizer *t) { return t ? t->add_bos : 0; }

int tokenizer_is_eog(const tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & TOK_ATTR_EOG) != 0;
}

const char *tokenizer_chat_template(const tokenizer *t) { return t ? t->chat_template : NULL; }

const char *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->piece_off[id + 1] - t->piece_off[id];
    return t->piece + t->piece_off[id];
}

size_t tokenizer_max_token_bytes(const tokenizer *t) { return t ? t->max_piece_len : 0; }

const char *tokenizer_piece(const tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    size_t n;
    const char *s = tok_text(t, id, &n);
    if (len) *len = n;
    return s;
}

/* ---- encoding ---- */

/* Offset of the first byte that is not part of valid UTF-8, or `len`. */
static size_t utf8_invalid_at(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint32_t cp;
        size_t n = s[i] < 0x80 ? 1 : tok_utf8_decode(s + i, len - i, &cp);
        if (n == 0) return i;
        i += n;
    }
    return len;
}

static int is_space_byte(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* An accepted special-token match: special[rank] at byte `pos` of the text. */
typedef struct {
    size_t pos;
    int32_t rank;
} tok_match;

static int cmp_match_pos(const void *a, const void *b) {
    size_t x = ((const tok_match *)a)->pos, y = ((const tok_match *)b)->pos;
    return x < y ? -1 : x > y;
}

/* Encodes the text given the accepted special-token matches `m` (sorted by
 * position, non-overlapping): the raw runs between them go through the
 * model's encoder, the matches become their tokens. `claimed` marks bytes of
 * a match or of whitespace a match stripped. */
static ellm_status encode_fragments(const tokenizer *t, const char *text, size_t len,
                                    const tok_match *m, size_t n_m, const uint8_t *claimed,
                                    tok_work *w, tok_sink *out, ellm_error *err) {
    size_t pos = 0;
    for (size_t k = 0; k <= n_m; k++) {
        size_t end = k < n_m ? m[k].pos : len;
        /* Between two matches lies at most one raw run: stripped whitespace
         * only touches a match. Every raw run starts the text or follows a
         * special token, so each gets the space prefix treatment. */
        size_t s = pos, e = end;
        while (s < e && claimed[s]) s++;
        while (e > s && claimed[e - 1]) e--;
        if (e > s) {
            int frag = TOK_FRAG_AFTER_SPECIAL | (s == 0 ? TOK_FRAG_TEXT_START : 0);
            ellm_status st = t->ops->encode(t, text + s, e - s, frag, w, out, err);
            if (st != ELLM_OK) return st;
        }
        if (k < n_m) {
            int32_t id = t->special[m[k].rank];
            size_t tl;
            tok_text(t, id, &tl);
            tok_sink_push(out, id);
            pos = m[k].pos + tl;
        }
    }
    return ELLM_OK;
}

/* What scan_occurrences looks at: the text and the tokens to skip. */
typedef struct {
    const tokenizer *t;
    const char *text;
    size_t len;
    uint16_t skip;          /* attributes of tokens not to split out */
    const uint8_t *claimed; /* bytes already taken (occurrences over them are useless), or NULL */
} occ_scan;

/* Calls visit(ctx, rank, pos) for every occurrence in the text of an
 * eligible special token with rank in [r0, r1) that covers no claimed byte,
 * walking the trie from each byte; positions come in ascending order. */
static void scan_occurrences(const occ_scan *sc, int32_t r0, int32_t r1,
                             void (*visit)(void *ctx, int32_t rank, size_t pos), void *ctx) {
    const tokenizer *t = sc->t;
    const uint8_t *claimed = sc->claimed;
    for (size_t p = 0; p < sc->len; p++) {
        if (claimed && claimed[p]) continue;
        int32_t node = t->trie_root[(uint8_t)sc->text[p]];
        size_t q = p;
        while (node >= 0) {
            const tok_trie_node *nd = &t->trie[node];
            if (nd->rank >= r0 && nd->rank < r1 && !(t->attr[t->special[nd->rank]] & sc->skip)) {
                visit(ctx, nd->rank, p);
            }
            if (++q >= sc->len || (claimed && claimed[q])) break;
            int32_t c = nd->child;
            while (c >= 0 && t->trie[c].byte != (uint8_t)sc->text[q]) c = t->trie[c].sibling;
            node = c;
        }
    }
}

/* scan_occurrences visitors: counting per rank; filing positions by rank. */
typedef struct {
    size_t *count; /* per rank */
    size_t total;
} occ_counter;

static void count_occurrence(void *ctx, int32_t rank, size_t pos) {
    occ_counter *c = ctx;
    (void)pos;
    c->count[rank]++;
    c->total++;
}

typedef struct {
    size_t *next; /* per rank: where its next position goes in pos */
    uint32_t *pos;
} occ_filer;

static void file_occurrence(void *ctx, int32_t rank, size_t pos) {
    occ_filer *f = ctx;
    f->pos[f->next[rank]++] = (uint32_t)pos;
}

/* Splits special tokens out of the text exactly as llama.cpp's repeated
 * partitioning does, then encodes. There, each special token in priority
 * order (longer text first) splits every text fragment at its leftmost
 * occurrences; here, the occurrences of each token are visited in priority
 * order, and one is accepted when none of its bytes is claimed yet and it
 * starts after the same token's previous match (and the whitespace that
 * match stripped). Occurrences are found with the trie, so the cost does not
 * grow with the number of special tokens; they are collected in batches of
 * ranks of at most ~2 per text byte, which bounds memory on hostile input
 * (e.g. nested tokens like "\n\n", "\n\n\n", ... on a long run of newlines). */
static ellm_status encode_text(const tokenizer *t, const char *text, size_t len, int parse_special,
                               tok_work *w, tok_sink *out, ellm_error *err) {
    occ_scan sc = {t, text, len, parse_special ? 0 : (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN), NULL};
    const int whole = TOK_FRAG_AFTER_SPECIAL | TOK_FRAG_TEXT_START;
    if (t->n_special == 0 || len == 0)
        return len ? t->ops->encode(t, text, len, whole, w, out, err) : ELLM_OK;

    /* Occurrences per rank, and in all. */
    size_t *count = calloc((size_t)t->n_special + 1, sizeof(size_t));
    if (!count) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    occ_counter counter = {count, 0};
    scan_occurrences(&sc, 0, t->n_special, count_occurrence, &counter);
    size_t total = counter.total;
    if (total == 0) {
        free(count);
        return t->ops->encode(t, text, len, whole, w, out, err);
    }

    const size_t budget = 2 * len + 4096; /* occurrences held at once */
    size_t cap = total < budget ? total : budget;
    uint32_t *pos = malloc(cap * sizeof(uint32_t)); /* a batch's positions, grouped by rank */
    size_t *start = malloc(((size_t)t->n_special + 1) * sizeof(size_t)); /* of a rank's group */
    size_t *next = malloc(((size_t)t->n_special + 1) * sizeof(size_t));  /* end of what was filed */
    uint8_t *claimed = calloc(len, 1);
    /* Accepted matches do not overlap and are at least one byte long. */
    size_t acc_cap = total < len ? total : len;
    tok_match *acc = malloc(acc_cap * sizeof(tok_match));
    ellm_status st = ELLM_OK;
    if (!pos || !start || !next || !claimed || !acc) {
        st = ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }

    size_t n_acc = 0;
    for (int32_t r0 = 0; r0 < t->n_special;) {
        /* The batch [r0, r1): as many ranks as fit the budget (at least one;
         * a single rank has at most one occurrence per byte). */
        int32_t r1 = r0;
        size_t n_batch = 0;
        while (r1 < t->n_special && (r1 == r0 || n_batch + count[r1] <= cap))
            n_batch += count[r1++];
        if (n_batch == 0) {
            r0 = r1;
            continue;
        }
        /* Groups sized by the first count; occurrences over bytes claimed by
         * earlier batches are not filed, so groups may end early. */
        size_t off = 0;
        for (int32_t r = r0; r < r1; r++) {
            start[r] = next[r] = off;
            off += count[r];
        }
        sc.claimed = claimed;
        occ_filer filer = {next, pos};
        scan_occurrences(&sc, r0, r1, file_occurrence, &filer);

        for (int32_t r = r0; r < r1; r++) {
            size_t i = start[r], end_i = next[r];
            uint16_t a = t->attr[t->special[r]];
            size_t tl;
            tok_text(t, t->special[r], &tl);
            size_t last_end = 0; /* end of this token's previous match and its strip */
            for (; i < end_i; i++) {
                size_t q = pos[i];
                if (q < last_end) continue;
                size_t k = 0;
                while (k < tl && !claimed[q + k]) k++;
                if (k < tl) continue; /* overlaps a match of an earlier token */
                memset(claimed + q, 1, tl);
                acc[n_acc++] = (tok_match){q, r};
                if (a & TOK_ATTR_LSTRIP) {
                    for (size_t l = q;
                         l > last_end && !claimed[l - 1] && is_space_byte(text[l - 1]); l--) {
                        claimed[l - 1] = 1;
                    }
                }
                size_t e = q + tl;
                if (a & TOK_ATTR_RSTRIP) {
                    while (e < len && !claimed[e] && is_space_byte(text[e])) claimed[e++] = 1;
                }
                last_end = e;
            }
        }
        r0 = r1;
    }
    qsort(acc, n_acc, sizeof(tok_match), cmp_match_pos);
    st = encode_fragments(t, text, len, acc, n_acc, claimed, w, out, err);
done:
    free(count);
    free(pos);
    free(start);
    free(next);
    free(claimed);
    free(acc);
    return st;
}

ellm_status tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_bos,
                             int parse_special, int32_t *ids, int cap, int *n_out,
                             ellm_error *err) {
    if (n_out) *n_out = 0;
    if (!t || !n_out || (!text && len > 0) || cap < 0 || (!ids && cap > 0)) {
        return ellm_fail(err, ELLM_ERR_ARG, "tokenizer_encode: invalid argument");
    }
    if (len > TOK_MAX_TEXT) {
        return ellm_fail(err, ELLM_ERR_ARG,
                         "tokenizer_encode: text of %zu bytes exceeds the %zu-byte limit", len,
                         TOK_MAX_TEXT);
    }
    size_t bad = utf8_invalid_at((const uint8_t *)text, len);
    if (bad < len) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer_encode: invalid UTF-8 at byte offset %zu (0x%02X)", bad,
                         (unsigned)(uint8_t)text[bad]);
    }

    tok_sink out = {ids, cap, 0};
    if (add_bos && t->add_bos && t->bos >= 0) tok_sink_push(&out, t->bos);
    tok_work w = {0};
    ellm_status st = encode_text(t, text, len, parse_special, &w, &out, err);
    tok_work_free(&w);
    if (st != ELLM_OK) return st;
    if (out.n > INT_MAX) {
        return ellm_fail(err, ELLM_ERR_ARG, "tokenizer_encode: %lld tokens exceed the int range",
                         (long long)out.n);
    }
    *n_out = (int)out.n;
    if (out.n > cap) {
        return ellm_fail(err, ELLM_ERR_ARG, "tokenizer_encode: %lld tokens do not fit in %d",
                         (long long)out.n, cap);
    }
    return ELLM_OK;
}
