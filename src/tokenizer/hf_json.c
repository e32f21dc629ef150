/* Loading a Hugging Face tokenizer.json (BPE model) and the
 * tokenizer_config.json beside it.
 *
 * What becomes what:
 *  - model.vocab {text: id} and added_tokens [{id, content, special, lstrip,
 *    rstrip}] give the token texts; an id that neither names becomes an
 *    unused "[PAD<id>]" token. An added token with special = true is a
 *    control token, one with special = false a user-defined token, so the
 *    special-token split of tokenizer.c treats them as llama.cpp treats the
 *    tokens a GGUF converter makes of the same file. With byte_fallback,
 *    "<0xNN>" tokens are byte tokens.
 *  - model.merges, as "a b" strings or ["a", "b"] pairs, in rank order;
 *    model.ignore_merges, byte_fallback, unk_token, fuse_unk.
 *  - normalizer: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace with a
 *    String pattern, Sequence.
 *  - pre_tokenizer: Split (Regex or String pattern, every behaviour, invert),
 *    ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Sequence.
 *  - decoder: ByteLevel gives byte-level pieces; otherwise "▁" is a space and
 *    byte tokens are their byte. A Strip of leading spaces or a prepending
 *    Metaspace makes the detokenizer drop a stream's first leading space.
 *  - BOS/EOS: bos_token / eos_token of tokenizer_config.json (a string or
 *    {"content": ...}), else the special tokens a TemplateProcessing
 *    post-processor puts first / last; add_bos_token / add_eos_token from the
 *    config, else whether that post-processor adds them.
 *  - chat_template from tokenizer_config.json (a string, or a list of
 *    {name, template}: "default", else the first).
 * Other models, normalizers and pre-tokenizers fail with
 * ELLM_ERR_UNSUPPORTED naming them; dropout is ignored (encoding is the
 * deterministic one). Both files are untrusted: every field is type-checked
 * and a failure names the file and the field. */
#include "tokenizer/tokenizer_impl.h"

#include "core/status.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HF_MAX_FILE ((size_t)1 << 30)
#define HF_MAX_VOCAB (1 << 24)
#define HF_MAX_DEPTH 8 /* nested Sequence normalizers / pre-tokenizers */

/* Reads a whole file; *buf is malloc'ed. ELLM_ERR_IO names the path. */
static ellm_status read_all(const char *path, char **buf, size_t *len, ellm_error *err) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ellm_fail(err, ELLM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    ellm_status st = ELLM_OK;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = ellm_fail(err, ELLM_ERR_IO, "cannot read '%s': not a regular file", path);
    } else if ((size_t)n > HF_MAX_FILE) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s' is %ld bytes (at most %zu allowed)", path, n,
                       HF_MAX_FILE);
    } else if (!(*buf = malloc((size_t)n + 1))) {
        st = ellm_fail(err, ELLM_ERR_NOMEM, "out of memory reading '%s'", path);
    } else if (fread(*buf, 1, (size_t)n, f) != (size_t)n) {
        st = ellm_fail(err, ELLM_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
    } else {
        (*buf)[n] = 0;
        *len = (size_t)n;
    }
    fclose(f);
    if (st != ELLM_OK) {
        free(*buf);
        *buf = NULL;
    }
    return st;
}

/* Parses JSON; a syntax error names the file's line and column. */
static ellm_status parse_json(const char *name, const char *buf, size_t len, cJSON **out,
                              ellm_error *err) {
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (*out) return ELLM_OK;
    if (!end || end < buf || end > buf + len) end = buf + len;
    int line = 1, col = 1;
    for (const char *p = buf; p < end; p++) {
        if (*p == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return ellm_fail(err, ELLM_ERR_FORMAT, "%s: malformed JSON at line %d, column %d (byte %zu)",
                     name, line, col, (size_t)(end - buf));
}

/* Member `key` of object o, or NULL (also when o is not an object). */
static const cJSON *get(const cJSON *o, const char *key) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

/* A boolean member, or `dflt` when it is absent or null. */
static int get_bool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = get(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* A string member, or NULL. */
static const char *get_str(const cJSON *o, const char *key) {
    const cJSON *v = get(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A non-negative integer below `lim` held by a JSON number. */
static int as_index(const cJSON *v, int64_t lim, int64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d < (double)lim) || d != (double)(int64_t)d) return 0;
    *out = (int64_t)d;
    return 1;
}

/* bos_token-style value: a string, or an object with a string "content". */
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    return get_str(v, "content");
}

/* ---- vocabulary ---- */

typedef struct {
    const char *text; /* NULL: no token has this id */
    int added, special, lstrip, rstrip;
} hf_tok;

/* Fills t->text/text_off/attr/score from the vocab and added tokens. */
static ellm_status build_vocab(tokenizer *t, const cJSON *vocab, const cJSON *added,
                               int byte_fallback, ellm_error *err) {
    int64_t n = 0;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        int64_t id;
        if (!as_index(v, HF_MAX_VOCAB, &id)) {
            return ellm_fail(err, ELLM_ERR_FORMAT,
                             "tokenizer.json: model.vocab['%.64s'] is not a token id in [0, %d)",
                             v->string ? v->string : "", HF_MAX_VOCAB);
        }
        if (id + 1 > n) n = id + 1;
    }
    int i = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++) {
        int64_t id;
        if (!cJSON_IsObject(a) || !as_index(get(a, "id"), HF_MAX_VOCAB, &id) ||
            !get_str(a, "content")) {
            return ellm_fail(err, ELLM_ERR_FORMAT,
                             "tokenizer.json: added_tokens[%d] needs an integer \"id\" in [0, %d) "
                             "and a string \"content\"",
                             i, HF_MAX_VOCAB);
        }
        if (id + 1 > n) n = id + 1;
    }
    if (n == 0) return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: the vocabulary is empty");
    /* Ids are dense in real files; a few entries with huge ids would only
     * make this allocate gigabytes of placeholders. */
    int64_t n_entries = cJSON_GetArraySize(vocab) + (added ? cJSON_GetArraySize(added) : 0);
    if (n > 2 * n_entries + 65536) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer.json: token ids reach %lld for %lld tokens (too sparse)",
                         (long long)n - 1, (long long)n_entries);
    }

    hf_tok *tok = calloc((size_t)n, sizeof(*tok));
    if (!tok) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    ellm_status st = ELLM_OK;
    for (const cJSON *v = vocab->child; v && st == ELLM_OK; v = v->next) {
        int64_t id = (int64_t)v->valuedouble;
        if (tok[id].text) {
            st = ellm_fail(err, ELLM_ERR_FORMAT,
                           "tokenizer.json: model.vocab gives id %lld to both '%.64s' and '%.64s'",
                           (long long)id, tok[id].text, v->string ? v->string : "");
        }
        tok[id].text = v->string ? v->string : "";
    }
    for (const cJSON *a = added ? added->child : NULL; a && st == ELLM_OK; a = a->next) {
        int64_t id = (int64_t)get(a, "id")->valuedouble;
        tok[id] = (hf_tok){get_str(a, "content"), 1, get_bool(a, "special", 0),
                           get_bool(a, "lstrip", 0), get_bool(a, "rstrip", 0)};
    }
    if (st != ELLM_OK) {
        free(tok);
        return st;
    }

    /* Texts back to back, each NUL-terminated; placeholders take 24 bytes. */
    size_t total = 0;
    for (int64_t id = 0; id < n; id++) {
        size_t l = tok[id].text ? strlen(tok[id].text) : 0;
        total += (l ? l : 24) + 1;
    }
    t->n_vocab = (int32_t)n;
    t->text = malloc(total);
    t->text_off = malloc(((size_t)n + 1) * sizeof(size_t));
    t->score = calloc((size_t)n, sizeof(float));
    t->attr = malloc((size_t)n * sizeof(uint16_t));
    if (!t->text || !t->text_off || !t->score || !t->attr) {
        free(tok);
        return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t pos = 0;
    for (int64_t id = 0; id < n; id++) {
        const hf_tok *k = &tok[id];
        size_t l = k->text ? strlen(k->text) : 0;
        t->text_off[id] = pos;
        uint16_t a = TOK_ATTR_NORMAL;
        if (!k->text) {
            l = (size_t)snprintf(t->text + pos, 24, "[PAD%lld]", (long long)id);
            a = TOK_ATTR_UNUSED;
        } else if (l == 0) {
            l = (size_t)snprintf(t->text + pos, 24, "[EMPTY_%lld]", (long long)id);
        } else {
            memcpy(t->text + pos, k->text, l);
        }
        t->text[pos + l] = 0;
        if (k->added) {
            a = k->special ? TOK_ATTR_CONTROL : TOK_ATTR_USER_DEFINED;
            if (k->lstrip) a |= TOK_ATTR_LSTRIP;
            if (k->rstrip) a |= TOK_ATTR_RSTRIP;
        } else if (byte_fallback && l == 6 && memcmp(t->text + pos, "<0x", 3) == 0 &&
                   t->text[pos + 5] == '>') {
            a = TOK_ATTR_BYTE;
        }
        t->attr[id] = a;
        if (l > t->max_token_len) t->max_token_len = l;
        pos += l + 1;
    }
    t->text_off[n] = pos;
    free(tok);
    return ELLM_OK;
}

/* Adds model.merges in order (rank = position). */
static ellm_status load_merges(tokenizer *t, const cJSON *merges, ellm_error *err) {
    int i = 0;
    for (const cJSON *m = merges->child; m; m = m->next, i++) {
        const char *a, *b;
        size_t na, nb;
        if (cJSON_IsString(m)) {
            /* "left right": the first space after the first byte splits it. */
            const char *s = m->valuestring;
            const char *sp = s[0] ? strchr(s + 1, ' ') : NULL;
            if (!sp) {
                return ellm_fail(err, ELLM_ERR_FORMAT,
                                 "tokenizer.json: model.merges[%d] '%.64s' is not \"left right\"",
                                 i, s);
            }
            a = s;
            na = (size_t)(sp - s);
            b = sp + 1;
            nb = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            a = m->child->valuestring;
            b = m->child->next->valuestring;
            na = strlen(a);
            nb = strlen(b);
        } else {
            return ellm_fail(err, ELLM_ERR_FORMAT,
                             "tokenizer.json: model.merges[%d] is neither \"left right\" nor a "
                             "pair of strings",
                             i);
        }
        ellm_status st = tok_bpe_add_merge(t, a, na, b, nb, err);
        if (st != ELLM_OK) return st;
    }
    return ELLM_OK;
}

/* ---- normalizers and pre-tokenizers ---- */

/* Adds normalizer n (null: none; a Sequence: each in turn). */
static ellm_status add_normalizer(tokenizer *t, const cJSON *n, int depth, ellm_error *err) {
    if (!n || cJSON_IsNull(n)) return ELLM_OK;
    const char *type = get_str(n, "type");
    if (!type)
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: a normalizer has no \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = get(n, "normalizers");
        if (!cJSON_IsArray(list)) {
            return ellm_fail(err, ELLM_ERR_FORMAT,
                             "tokenizer.json: Sequence normalizer without a \"normalizers\" array");
        }
        if (depth >= HF_MAX_DEPTH) {
            return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                             "tokenizer.json: normalizers nested more than %d deep", HF_MAX_DEPTH);
        }
        for (const cJSON *c = list->child; c; c = c->next) {
            ellm_status st = add_normalizer(t, c, depth + 1, err);
            if (st != ELLM_OK) return st;
        }
        return ELLM_OK;
    }
    static const struct {
        const char *name;
        tok_norm_kind kind;
    } forms[] = {{"NFC", TOK_NORM_NFC},
                 {"NFD", TOK_NORM_NFD},
                 {"NFKC", TOK_NORM_NFKC},
                 {"NFKD", TOK_NORM_NFKD},
                 {"Lowercase", TOK_NORM_LOWERCASE}};
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        if (!strcmp(type, forms[i].name))
            return tok_bpe_add_normalizer(t, forms[i].kind, NULL, 0, NULL, 0, err);
    }
    if (!strcmp(type, "Prepend")) {
        const char *s = get_str(n, "prepend");
        if (!s)
            return ellm_fail(err, ELLM_ERR_FORMAT,
                             "tokenizer.json: Prepend normalizer without a string \"prepend\"");
        return tok_bpe_add_normalizer(t, TOK_NORM_PREPEND, s, strlen(s), NULL, 0, err);
    }
    if (!strcmp(type, "Replace")) {
        const cJSON *pat = get(n, "pattern");
        const char *from = get_str(pat, "String"), *to = get_str(n, "content");
        if (get(pat, "Regex")) {
            return ellm_fail(
                err, ELLM_ERR_UNSUPPORTED,
                "tokenizer.json: Replace normalizer with a Regex pattern is not supported");
        }
        if (!from || !to || !from[0]) {
            return ellm_fail(err, ELLM_ERR_FORMAT,
                             "tokenizer.json: Replace normalizer needs pattern.String and content");
        }
        return tok_bpe_add_normalizer(t, TOK_NORM_REPLACE, from, strlen(from), to, strlen(to), err);
    }
    return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                     "tokenizer.json: normalizer '%.64s' is not supported", type);
}

/* Adds pre-tokenizer p as BPE steps (null: none; a Sequence: each in turn). */
static ellm_status add_pre_tokenizer(tokenizer *t, const cJSON *p, int depth, ellm_error *err) {
    if (!p || cJSON_IsNull(p)) return ELLM_OK;
    const char *type = get_str(p, "type");
    if (!type)
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: a pre-tokenizer has no \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = get(p, "pretokenizers");
        if (!cJSON_IsArray(list)) {
            return ellm_fail(
                err, ELLM_ERR_FORMAT,
                "tokenizer.json: Sequence pre-tokenizer without a \"pretokenizers\" array");
        }
        if (depth >= HF_MAX_DEPTH) {
            return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                             "tokenizer.json: pre-tokenizers nested more than %d deep",
                             HF_MAX_DEPTH);
        }
        for (const cJSON *c = list->child; c; c = c->next) {
            ellm_status st = add_pre_tokenizer(t, c, depth + 1, err);
            if (st != ELLM_OK) return st;
        }
        return ELLM_OK;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = get(p, "pattern");
        const char *re = get_str(pat, "Regex"), *lit = get_str(pat, "String");
        const char *beh = get_str(p, "behavior");
        static const struct {
            const char *name;
            tok_split_behavior b;
        } behs[] = {{"Isolated", TOK_SPLIT_ISOLATED},
                    {"Removed", TOK_SPLIT_REMOVED},
                    {"MergedWithPrevious", TOK_SPLIT_MERGED_WITH_PREVIOUS},
                    {"MergedWithNext", TOK_SPLIT_MERGED_WITH_NEXT},
                    {"Contiguous", TOK_SPLIT_CONTIGUOUS}};
        int bi = -1;
        for (int i = 0; beh && i < 5; i++) {
            if (!strcmp(beh, behs[i].name)) bi = i;
        }
        if (!re && !lit) {
            return ellm_fail(
                err, ELLM_ERR_FORMAT,
                "tokenizer.json: Split pre-tokenizer needs pattern.Regex or pattern.String");
        }
        if (bi < 0) {
            return ellm_fail(err, ELLM_ERR_FORMAT,
                             "tokenizer.json: Split pre-tokenizer behavior '%.32s' is not one of "
                             "Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous",
                             beh ? beh : "(missing)");
        }
        const char *s = re ? re : lit;
        return tok_bpe_add_split(t, s, strlen(s), re == NULL, behs[bi].b, get_bool(p, "invert", 0),
                                 err);
    }
    if (!strcmp(type, "ByteLevel")) {
        return tok_bpe_add_byte_level(t, get_bool(p, "add_prefix_space", 1),
                                      get_bool(p, "use_regex", 1), err);
    }
    if (!strcmp(type, "Metaspace")) {
        const char *rep = get_str(p, "replacement");
        if (!rep) rep = "\xe2\x96\x81";
        const char *scheme = get_str(p, "prepend_scheme");
        tok_prepend_scheme ps =
            get_bool(p, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        if (scheme && !strcmp(scheme, "first"))
            ps = TOK_PREPEND_FIRST;
        else if (scheme && !strcmp(scheme, "never"))
            ps = TOK_PREPEND_NEVER;
        else if (scheme && !strcmp(scheme, "always"))
            ps = TOK_PREPEND_ALWAYS;
        else if (scheme) {
            return ellm_fail(
                err, ELLM_ERR_FORMAT,
                "tokenizer.json: Metaspace prepend_scheme '%.32s' is not always, first "
                "or never",
                scheme);
        }
        return tok_bpe_add_metaspace(t, rep, strlen(rep), ps, get_bool(p, "split", 1), err);
    }
    if (!strcmp(type, "Digits"))
        return tok_bpe_add_digits(t, get_bool(p, "individual_digits", 0), err);
    if (!strcmp(type, "Whitespace")) {
        const char *re = "\\w+|[^\\w\\s]+";
        return tok_bpe_add_split(t, re, strlen(re), 0, TOK_SPLIT_REMOVED, 1, err);
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        const char *re = "\\s+";
        return tok_bpe_add_split(t, re, strlen(re), 0, TOK_SPLIT_REMOVED, 0, err);
    }
    return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                     "tokenizer.json: pre-tokenizer '%.64s' is not supported", type);
}

/* Whether the pre-tokenizer (or a Sequence in it) has a ByteLevel step. */
static int has_byte_level(const cJSON *p, int depth) {
    const char *type = get_str(p, "type");
    if (!type || depth > HF_MAX_DEPTH) return 0;
    if (!strcmp(type, "ByteLevel")) return 1;
    const cJSON *list = get(p, "pretokenizers");
    for (const cJSON *c = cJSON_IsArray(list) ? list->child : NULL; c; c = c->next) {
        if (has_byte_level(c, depth + 1)) return 1;
    }
    return 0;
}

/* Piece style and first-space stripping from the decoder. */
static void read_decoder(tokenizer *t, const cJSON *d, int depth) {
    const char *type = get_str(d, "type");
    if (!type || depth > HF_MAX_DEPTH) return;
    if (!strcmp(type, "ByteLevel")) t->piece_style = TOK_PIECE_BYTE_LEVEL;
    if (!strcmp(type, "Strip")) {
        const char *c = get_str(d, "content");
        int64_t start;
        if (c && !strcmp(c, " ") && as_index(get(d, "start"), 1 << 20, &start) && start > 0) {
            t->add_space_prefix = 1;
        }
    }
    if (!strcmp(type, "Metaspace")) {
        const char *scheme = get_str(d, "prepend_scheme");
        if (scheme ? strcmp(scheme, "never") != 0 : get_bool(d, "add_prefix_space", 1)) {
            t->add_space_prefix = 1;
        }
    }
    const cJSON *list = get(d, "decoders");
    for (const cJSON *c = cJSON_IsArray(list) ? list->child : NULL; c; c = c->next) {
        read_decoder(t, c, depth + 1);
    }
}

/* From a TemplateProcessing post-processor (possibly inside a Sequence):
 * the special tokens it puts before and after a single sequence. */
static void read_post_processor(const cJSON *pp, const char **first, const char **last, int depth) {
    const char *type = get_str(pp, "type");
    if (!type || depth > HF_MAX_DEPTH) return;
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = get(pp, "single");
        if (!cJSON_IsArray(single) || !single->child) return;
        const cJSON *a = single->child, *z = a;
        while (z->next) z = z->next;
        const char *fa = get_str(get(a, "SpecialToken"), "id");
        const char *fz = get_str(get(z, "SpecialToken"), "id");
        if (fa) *first = fa;
        if (fz && z != a) *last = fz;
        return;
    }
    const cJSON *list = get(pp, "processors");
    for (const cJSON *c = cJSON_IsArray(list) ? list->child : NULL; c; c = c->next) {
        read_post_processor(c, first, last, depth + 1);
    }
}

/* Id of a token text, or -1 (NULL text: -1). */
static int32_t find_text(const tokenizer *t, const char *s) {
    return s ? tok_find(t, s, strlen(s)) : -1;
}

/* The path of tokenizer_config.json in the directory of `path`. */
static char *config_path(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
    const char *name = "tokenizer_config.json";
    char *p = malloc(dir + strlen(name) + 1);
    if (!p) return NULL;
    memcpy(p, path, dir);
    strcpy(p + dir, name);
    return p;
}

/* BOS/EOS and their flags, and the chat template, from the config (which
 * may be NULL) over what the post-processor says. */
static ellm_status read_specials(tokenizer *t, const cJSON *root, const cJSON *cfg,
                                 ellm_error *err) {
    const char *pp_first = NULL, *pp_last = NULL;
    read_post_processor(get(root, "post_processor"), &pp_first, &pp_last, 0);
    const char *bos = cfg && get(cfg, "bos_token") ? token_text(get(cfg, "bos_token")) : pp_first;
    const char *eos = cfg && get(cfg, "eos_token") ? token_text(get(cfg, "eos_token")) : pp_last;
    t->bos = find_text(t, bos);
    t->eos = find_text(t, eos);
    int32_t first = find_text(t, pp_first), last = find_text(t, pp_last);
    t->add_bos = get_bool(cfg, "add_bos_token", first >= 0 && first == t->bos);
    t->add_eos = get_bool(cfg, "add_eos_token", last >= 0 && last == t->eos);
    if (t->add_bos && t->bos < 0) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer_config.json: add_bos_token is set but bos_token '%.64s' is "
                         "not a token",
                         bos ? bos : "(none)");
    }
    if (t->add_eos && t->eos < 0) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer_config.json: add_eos_token is set but eos_token '%.64s' is "
                         "not a token",
                         eos ? eos : "(none)");
    }
    t->eot = t->eom = -1;

    const char *tmpl = tokenizer_hf_chat_template(cfg);
    if (tmpl) {
        t->chat_template = strdup(tmpl);
        if (!t->chat_template) return ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    }
    return ELLM_OK;
}

const char *tokenizer_hf_chat_template(const cJSON *tok_cfg) {
    const cJSON *ct = get(tok_cfg, "chat_template");
    const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
    for (const cJSON *c = cJSON_IsArray(ct) ? ct->child : NULL; c; c = c->next) {
        const char *name = get_str(c, "name"), *body = get_str(c, "template");
        if (body && (!tmpl || (name && !strcmp(name, "default")))) tmpl = body;
    }
    return tmpl;
}

/* Builds `t` from the parsed tokenizer.json and config (may be NULL). */
static ellm_status build(tokenizer *t, const cJSON *root, const cJSON *cfg, ellm_error *err) {
    if (!cJSON_IsObject(root)) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: the top level is not an object");
    }
    const cJSON *model = get(root, "model");
    if (!cJSON_IsObject(model)) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer.json: \"model\" is missing or not an object");
    }
    const char *type = get_str(model, "type");
    if (type && strcmp(type, "BPE") != 0) {
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "tokenizer.json: model type '%.32s' is not supported (only BPE)", type);
    }
    const cJSON *vocab = get(model, "vocab"), *merges = get(model, "merges");
    if (!cJSON_IsObject(vocab)) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer.json: model.vocab is missing or not an object");
    }
    if (!cJSON_IsArray(merges)) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer.json: model.merges is missing or not an array");
    }
    const cJSON *added = get(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added)) {
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: added_tokens is not an array");
    }
    if (!cJSON_IsArray(added)) added = NULL;
    const char *cont = get_str(model, "continuing_subword_prefix");
    const char *suffix = get_str(model, "end_of_word_suffix");
    if ((cont && cont[0]) || (suffix && suffix[0])) {
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "tokenizer.json: BPE with continuing_subword_prefix or "
                         "end_of_word_suffix is not supported");
    }
    int byte_fallback = get_bool(model, "byte_fallback", 0);

    ellm_status st = build_vocab(t, vocab, added, byte_fallback, err);
    if (st == ELLM_OK) st = tok_build_hash(t, err);
    if (st == ELLM_OK) st = tok_bpe_create(t, err);
    if (st == ELLM_OK) st = load_merges(t, merges, err);
    if (st == ELLM_OK) st = add_normalizer(t, get(root, "normalizer"), 0, err);
    if (st == ELLM_OK) st = add_pre_tokenizer(t, get(root, "pre_tokenizer"), 0, err);
    if (st != ELLM_OK) return st;

    const char *unk_text = get_str(model, "unk_token");
    int32_t unk = find_text(t, unk_text);
    if (unk_text && unk < 0) {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer.json: model.unk_token '%.64s' is not in the vocabulary",
                         unk_text);
    }
    t->unk = unk;
    if (unk >= 0 && !(t->attr[unk] & TOK_ATTR_USER_DEFINED)) t->attr[unk] = TOK_ATTR_UNKNOWN;
    tok_bpe_set_options(t, get_bool(model, "ignore_merges", 0), 1, byte_fallback, unk,
                        get_bool(model, "fuse_unk", 0));

    const cJSON *dec = get(root, "decoder");
    if (cJSON_IsObject(dec)) {
        read_decoder(t, dec, 0);
    } else if (has_byte_level(get(root, "pre_tokenizer"), 0)) {
        t->piece_style = TOK_PIECE_BYTE_LEVEL;
    }
    st = read_specials(t, root, cfg, err);
    if (st != ELLM_OK) return st;
    tok_mark_specials(t, -1, -1, -1, 1);
    return tok_finish(t, err);
}

ellm_status tok_hf_init_memory(const char *json, size_t len, const char *config, size_t config_len,
                               tokenizer **out, ellm_error *err) {
    if (!json || !out) return ellm_fail(err, ELLM_ERR_ARG, "tok_hf_init_memory: NULL argument");
    *out = NULL;
    cJSON *root = NULL, *cfg = NULL;
    tokenizer *t = NULL;
    ellm_status st = parse_json("tokenizer.json", json, len, &root, err);
    if (st == ELLM_OK && config) {
        st = parse_json("tokenizer_config.json", config, config_len, &cfg, err);
        if (st == ELLM_OK && !cJSON_IsObject(cfg)) {
            st = ellm_fail(err, ELLM_ERR_FORMAT,
                           "tokenizer_config.json: the top level is not an object");
        }
    }
    if (st == ELLM_OK) {
        t = calloc(1, sizeof(*t));
        if (!t) st = ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (st == ELLM_OK) {
        t->ops = &tok_bpe_ops;
        st = build(t, root, cfg, err);
    }
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (st != ELLM_OK) {
        tokenizer_free(t);
        return st;
    }
    *out = t;
    return ELLM_OK;
}

ellm_status tokenizer_init_hf_json(const char *path, tokenizer **out, ellm_error *err) {
    if (!path || !out) return ellm_fail(err, ELLM_ERR_ARG, "tokenizer_init_hf_json: NULL argument");
    *out = NULL;
    char *buf = NULL, *cbuf = NULL;
    size_t len = 0, clen = 0;
    ellm_status st = read_all(path, &buf, &len, err);
    char *cpath = st == ELLM_OK ? config_path(path) : NULL;
    if (st == ELLM_OK && !cpath) st = ellm_fail(err, ELLM_ERR_NOMEM, "tokenizer: out of memory");
    FILE *probe = cpath ? fopen(cpath, "rb") : NULL;
    if (probe) {
        fclose(probe);
        st = read_all(cpath, &cbuf, &clen, err);
    }
    free(cpath);
    if (st == ELLM_OK) {
        st = tok_hf_init_memory(buf, len, cbuf, clen, out, err);
        if (st != ELLM_OK && err) { /* say which file, e.g. when it is not a tokenizer.json */
            char msg[sizeof(err->msg)];
            snprintf(msg, sizeof(msg), "%s", err->msg);
            ellm_fail(err, st, "%s: %s", path, msg);
        }
    }
    free(buf);
    free(cbuf);
    return st;
}
