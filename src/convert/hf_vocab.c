/* Hugging Face tokenizer files -> tokenizer.ggml.* metadata (see hf_vocab.h).
 * Mirrors llama.cpp's converter: _create_vocab_sentencepiece, get_vocab_base,
 * LlamaHfVocab and gguf-py's SpecialVocab. */
#include "convert/hf_vocab.h"

#include "convert/fileio.h"
#include "convert/sha256.h"
#include "convert/sp_model.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CV_MAX_JSON ((size_t)1 << 30)
#define CV_MAX_VOCAB ((int64_t)1 << 24)

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static const char *const special_names[CV_SPECIAL_COUNT] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
/* GGUF keys; "seperator" is llama.cpp's spelling. */
static const char *const special_keys[CV_SPECIAL_COUNT] = {
    "tokenizer.ggml.bos_token_id",       "tokenizer.ggml.eos_token_id",     "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.cls_token_id",
    "tokenizer.ggml.mask_token_id"};

/* The pre-tokenizer fingerprints: SHA-256 of Python's str() of the ids that
 * the model's tokenizer gives cv_pre_chktxt (with its special tokens added),
 * from llama.cpp's convert_hf_to_gguf get_vocab_base_pre, for the
 * pre-tokenizers eLLM's tokenizer implements. */
typedef struct {
    const char *hash, *name;
} cv_pre_hash;
#include "convert/hf_vocab_pre.h"

static const cJSON *get(const cJSON *o, const char *k) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}
static const char *get_str(const cJSON *o, const char *k) {
    const cJSON *v = get(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
/* A non-negative integer below lim, or -1. */
static int64_t as_id(const cJSON *v, int64_t lim) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < (double)lim) || d != floor(d)) return -1;
    return (int64_t)d;
}

void cv_vocab_free(cv_vocab *v) {
    if (!v) return;
    for (int64_t i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    for (int64_t i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tok);
    free(v->scores);
    free(v->types);
    free(v->merges);
    free(v->chat_template);
    memset(v, 0, sizeof *v);
}

static void vocab_reset(cv_vocab *v) {
    memset(v, 0, sizeof *v);
    for (int i = 0; i < CV_SPECIAL_COUNT; i++) v->special[i] = -1;
    v->add_bos = v->add_eos = v->add_space_prefix = -1;
}

/* n tokens "[PADi]", unused, with score `pad_score` (scores only if with_scores). */
static ellm_status vocab_alloc(cv_vocab *v, int64_t n, int with_scores, float pad_score, ellm_error *err) {
    v->n = n;
    v->tok = calloc((size_t)n, sizeof *v->tok);
    v->types = malloc((size_t)n * sizeof *v->types);
    v->scores = with_scores ? malloc((size_t)n * sizeof *v->scores) : NULL;
    if (!v->tok || !v->types || (with_scores && !v->scores))
        return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory for a %lld-token vocabulary", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%lld]", (long long)i);
        if (!(v->tok[i] = strdup(buf))) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
        v->types[i] = TT_UNUSED;
        if (with_scores) v->scores[i] = pad_score;
    }
    return ELLM_OK;
}

static ellm_status set_tok(cv_vocab *v, int64_t id, const char *text, size_t len, ellm_error *err) {
    char *p = malloc(len + 1);
    if (!p) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    memcpy(p, text, len);
    p[len] = 0;
    free(v->tok[id]);
    v->tok[id] = p;
    return ELLM_OK;
}

/* llama.cpp's does_token_look_special. */
static int looks_special(const char *s) {
    size_t n = strlen(s);
    if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") || !strcmp(s, "[@BOS@]")) return 1;
    if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>")) return 1;
    const char *fl = "<\xef\xbd\x9c", *fr = "\xef\xbd\x9c>"; /* <｜ ｜> */
    if (n >= 8 && !strncmp(s, fl, 4) && !strcmp(s + n - 4, fr)) return 1;
    if (n >= 8 && !strncmp(s, "<unused", 7) && s[n - 1] == '>') return 1;
    return 0;
}

/* Replaces every "▁" of a user-defined token with a space (llama.cpp
 * pre-normalizes them). */
static void unescape_spaces(char *s) {
    char *w = s;
    for (const char *r = s; *r;) {
        if (!strncmp(r, "\xe2\x96\x81", 3)) {
            *w++ = ' ';
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
}

/* ---- JSON files of the folder ---- */

typedef struct {
    const char *dir;
    cJSON *tok_json; /* tokenizer.json or NULL */
    cJSON *tok_cfg;  /* tokenizer_config.json or NULL */
    cJSON *config;   /* config.json or NULL */
    cJSON *gen_cfg;  /* generation_config.json or NULL */
} vsrc;

/* Parses DIR/name if it exists (*out NULL if not). */
static ellm_status load_json(const char *dir, const char *name, cJSON **out, ellm_error *err) {
    *out = NULL;
    char *path = cv_path_join(dir, name);
    if (!path) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    ellm_status st = ELLM_OK;
    if (cv_is_file(path)) {
        char *text = NULL;
        size_t len = 0;
        st = cv_read_file(path, CV_MAX_JSON, &text, &len, err);
        if (st == ELLM_OK) {
            *out = cJSON_ParseWithLength(text, len);
            if (!cJSON_IsObject(*out)) {
                st = ellm_fail(err, ELLM_ERR_FORMAT, "'%s': %s", path,
                               *out ? "the top level is not an object" : "malformed JSON");
                cJSON_Delete(*out);
                *out = NULL;
            }
        }
        free(text);
    }
    free(path);
    return st;
}

/* ---- tokenizer.model ---- */

static ellm_status from_sp(cv_vocab *v, const sp_model *sp, int64_t n_vocab, const char *what, ellm_error *err) {
    if (n_vocab <= 0) n_vocab = sp->n_pieces;
    if (sp->n_pieces > n_vocab)
        return ellm_fail(err, ELLM_ERR_FORMAT, "'%s' has %lld pieces but config.json's vocab_size is %lld", what,
                         (long long)sp->n_pieces, (long long)n_vocab);
    ellm_status st = vocab_alloc(v, n_vocab, 1, -10000.0f, err);
    for (int64_t i = 0; i < sp->n_pieces && st == ELLM_OK; i++) {
        st = set_tok(v, i, sp->pieces[i].piece, sp->pieces[i].len, err);
        v->scores[i] = sp->pieces[i].score;
        v->types[i] = sp->pieces[i].type;
    }
    snprintf(v->model, sizeof v->model, "llama");
    snprintf(v->pre, sizeof v->pre, "default");
    if (sp->add_dummy_prefix == 0) v->add_space_prefix = 0;
    v->source = "tokenizer.model";
    return st;
}

/* added_tokens.json {text: id} and tokenizer_config.json added_tokens_decoder
 * {"id": {"content", "special"}} over SentencePiece pieces. */
static ellm_status sp_added_tokens(cv_vocab *v, const vsrc *s, ellm_error *err) {
    cJSON *added = NULL;
    ellm_status st = load_json(s->dir, "added_tokens.json", &added, err);
    for (const cJSON *e = added ? added->child : NULL; e && st == ELLM_OK; e = e->next) {
        int64_t id = as_id(e, v->n);
        if (id < 0) continue; /* llama.cpp: out of range, ignored */
        st = set_tok(v, id, e->string, strlen(e->string), err);
        v->scores[id] = -1000.0f;
        v->types[id] = TT_USER_DEFINED;
    }
    cJSON_Delete(added);
    const cJSON *dec = get(s->tok_cfg, "added_tokens_decoder");
    for (const cJSON *e = cJSON_IsObject(dec) ? dec->child : NULL; e && st == ELLM_OK; e = e->next) {
        char *endp;
        long long id = strtoll(e->string, &endp, 10);
        const char *content = get_str(e, "content");
        if (*endp || id < 0 || id >= v->n || !content) continue;
        const cJSON *sp = get(e, "special");
        st = set_tok(v, id, content, strlen(content), err);
        if (st) break;
        if (cJSON_IsTrue(sp) || looks_special(content)) {
            v->types[id] = TT_CONTROL;
        } else {
            unescape_spaces(v->tok[id]);
            v->types[id] = TT_USER_DEFINED;
        }
        v->scores[id] = -1000.0f;
    }
    return st;
}

/* ---- tokenizer.json (BPE) ---- */

/* The "left right" text of merge i (string or [left, right] pair; spaces
 * inside a pair's parts become U+0120 as llama.cpp writes them). */
static ellm_status merge_text(const cJSON *m, int64_t i, char **out, ellm_error *err) {
    if (cJSON_IsString(m)) {
        if (!strchr(m->valuestring, ' '))
            return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: model.merges[%lld] '%.64s' is not \"left right\"",
                             (long long)i, m->valuestring);
        *out = strdup(m->valuestring);
    } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
               cJSON_IsString(m->child->next)) {
        const char *a = m->child->valuestring, *b = m->child->next->valuestring;
        size_t n = 2 * (strlen(a) + strlen(b)) + 2, k = 0;
        char *p = malloc(n);
        if (p) {
            for (int part = 0; part < 2; part++) {
                for (const char *c = part ? b : a; *c; c++) {
                    if (*c == ' ') {
                        p[k++] = '\xc4';
                        p[k++] = '\xa0';
                    } else {
                        p[k++] = *c;
                    }
                }
                if (!part) p[k++] = ' ';
            }
            p[k] = 0;
        }
        *out = p;
    } else {
        return ellm_fail(err, ELLM_ERR_FORMAT,
                         "tokenizer.json: model.merges[%lld] is neither \"left right\" nor a pair of strings",
                         (long long)i);
    }
    return *out ? ELLM_OK : ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
}

/* A text -> id table over the vocabulary, for the merge-rank scores. */
typedef struct {
    int64_t *slot; /* id + 1, 0 = empty */
    size_t cap;
} idmap;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int64_t idmap_find(const idmap *m, const cv_vocab *v, const char *s, size_t n) {
    for (size_t i = fnv(s, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        int64_t id = m->slot[i] - 1;
        if (id < 0) return -1;
        if (strlen(v->tok[id]) == n && !memcmp(v->tok[id], s, n)) return id;
    }
}

/* Scores for a SentencePiece-style vocabulary from BPE merges: the token
 * that merge r makes (left + right) scores -r, unless an earlier merge made
 * it; every other normal token scores -1e9 (never preferred). */
static ellm_status merge_rank_scores(cv_vocab *v, const cJSON *merges, ellm_error *err) {
    idmap m = {0};
    m.cap = 16;
    while (m.cap < 2 * (size_t)v->n) m.cap *= 2;
    m.slot = calloc(m.cap, sizeof *m.slot);
    if (!m.slot) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    for (int64_t id = 0; id < v->n; id++) {
        v->scores[id] = v->types[id] == TT_NORMAL ? -1e9f : 0.0f;
        if (v->types[id] == TT_UNUSED) continue;
        size_t n = strlen(v->tok[id]);
        size_t i = fnv(v->tok[id], n) & (m.cap - 1);
        while (m.slot[i]) i = (i + 1) & (m.cap - 1);
        m.slot[i] = id + 1;
    }
    uint8_t *done = calloc((size_t)v->n, 1);
    ellm_status st = done ? ELLM_OK : ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    int64_t r = 0;
    for (const cJSON *e = merges->child; e && st == ELLM_OK; e = e->next, r++) {
        char *t = NULL;
        if ((st = merge_text(e, r, &t, err))) break;
        /* merge_text keeps the pair apart with the first space after byte 0. */
        char *sp = strchr(t + 1, ' ');
        if (sp) {
            memmove(sp, sp + 1, strlen(sp + 1) + 1);
            int64_t id = idmap_find(&m, v, t, strlen(t));
            if (id >= 0 && !done[id]) {
                done[id] = 1;
                v->scores[id] = -(float)r;
            }
        }
        free(t);
    }
    free(done);
    free(m.slot);
    return st;
}

/* Tokens, types (and merges for byte-level) from a BPE tokenizer.json. */
static ellm_status from_json_bpe(cv_vocab *v, const cJSON *root, const cJSON *tok_cfg, int64_t n_vocab,
                                 ellm_error *err) {
    const cJSON *model = get(root, "model");
    if (!cJSON_IsObject(model))
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: \"model\" is missing or not an object");
    const char *type = get_str(model, "type");
    const cJSON *vocab = get(model, "vocab"), *merges = get(model, "merges");
    if (type && strcmp(type, "BPE"))
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "tokenizer.json: model type '%.32s' is not supported (BPE only: byte-level, or "
                         "SentencePiece-style with byte_fallback)",
                         type);
    if (!type && !cJSON_IsArray(merges))
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED, "tokenizer.json: the model has no \"type\" and no merges (not BPE)");
    if (!cJSON_IsObject(vocab)) return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: model.vocab is not an object");
    if (!cJSON_IsArray(merges)) return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: model.merges is not an array");
    const cJSON *added = get(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: added_tokens is not an array");
    int byte_fallback = cJSON_IsTrue(get(model, "byte_fallback"));

    int64_t max_id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int64_t id = as_id(e, CV_MAX_VOCAB);
        if (id < 0)
            return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: model.vocab['%.64s'] is not a token id in [0, %lld)",
                             e->string ? e->string : "", (long long)CV_MAX_VOCAB);
        if (id > max_id) max_id = id;
    }
    int i = 0;
    for (const cJSON *a = cJSON_IsArray(added) ? added->child : NULL; a; a = a->next, i++) {
        int64_t id = as_id(get(a, "id"), CV_MAX_VOCAB);
        if (id < 0 || !get_str(a, "content"))
            return ellm_fail(err, ELLM_ERR_FORMAT,
                             "tokenizer.json: added_tokens[%d] needs an integer \"id\" and a string \"content\"", i);
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: the vocabulary is empty");
    if (n_vocab <= 0) n_vocab = max_id + 1;
    if (max_id >= n_vocab)
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: token id %lld is not below config.json's vocab_size %lld",
                         (long long)max_id, (long long)n_vocab);
    int64_t n_entries = cJSON_GetArraySize(vocab) + (cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0);
    if (n_vocab > 2 * n_entries + 65536)
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: %lld token ids for %lld tokens (too sparse)",
                         (long long)n_vocab, (long long)n_entries);
    ellm_status st = vocab_alloc(v, n_vocab, byte_fallback, 0.0f, err);
    for (const cJSON *e = vocab->child; e && st == ELLM_OK; e = e->next) {
        int64_t id = (int64_t)e->valuedouble;
        st = set_tok(v, id, e->string, strlen(e->string), err);
        v->types[id] = TT_NORMAL;
        if (byte_fallback && strlen(e->string) == 6 && !strncmp(e->string, "<0x", 3) && e->string[5] == '>')
            v->types[id] = TT_BYTE;
    }
    for (const cJSON *a = cJSON_IsArray(added) ? added->child : NULL; a && st == ELLM_OK; a = a->next) {
        int64_t id = (int64_t)get(a, "id")->valuedouble;
        const char *content = get_str(a, "content");
        if ((st = set_tok(v, id, content, strlen(content), err))) break;
        if (cJSON_IsTrue(get(a, "special")) || looks_special(content)) {
            v->types[id] = TT_CONTROL;
        } else {
            if (!byte_fallback) unescape_spaces(v->tok[id]);
            v->types[id] = TT_USER_DEFINED;
        }
    }
    if (st) return st;
    if (byte_fallback) {
        const char *unk = get_str(model, "unk_token");
        for (int64_t id = 0; unk && id < v->n; id++)
            if (!strcmp(v->tok[id], unk)) v->types[id] = TT_UNKNOWN;
        snprintf(v->model, sizeof v->model, "llama");
        snprintf(v->pre, sizeof v->pre, "default");
        /* A Prepend("▁") normalizer or a prepending Metaspace is the
         * SentencePiece dummy prefix. */
        char *norm = cJSON_PrintUnformatted(get(root, "normalizer"));
        char *pret = cJSON_PrintUnformatted(get(root, "pre_tokenizer"));
        int prefix = (norm && strstr(norm, "\"Prepend\"")) ||
                     (pret && strstr(pret, "\"Metaspace\"") && !strstr(pret, "\"prepend_scheme\":\"never\""));
        v->add_space_prefix = prefix;
        free(norm);
        free(pret);
        return merge_rank_scores(v, merges, err);
    }
    snprintf(v->model, sizeof v->model, "gpt2");
    v->n_merges = cJSON_GetArraySize(merges);
    v->merges = calloc((size_t)(v->n_merges ? v->n_merges : 1), sizeof *v->merges);
    if (!v->merges) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    int64_t r = 0;
    for (const cJSON *e = merges->child; e && st == ELLM_OK; e = e->next, r++) st = merge_text(e, r, &v->merges[r], err);
    (void)tok_cfg;
    return st;
}

/* ---- special tokens, flags, chat template ---- */

static int64_t find_added(const cJSON *tok_json, const char *content) {
    const cJSON *added = get(tok_json, "added_tokens");
    for (const cJSON *a = cJSON_IsArray(added) ? added->child : NULL; a; a = a->next) {
        const char *c = get_str(a, "content");
        if (c && !strcmp(c, content)) return as_id(get(a, "id"), CV_MAX_VOCAB);
    }
    return -1;
}

/* A *_token entry: a string or {"content": string}. */
static const char *token_content(const cJSON *e) {
    if (cJSON_IsString(e)) return e->valuestring;
    return get_str(e, "content");
}

/* The first special token of a TemplateProcessing single template, and the
 * last (NULL if the template has fewer than two items). */
static void post_processor_ends(const cJSON *pp, const char **first, const char **last) {
    *first = *last = NULL;
    const cJSON *procs = get(pp, "processors");
    for (const cJSON *p = cJSON_IsArray(procs) ? procs->child : pp; p; p = cJSON_IsArray(procs) ? p->next : NULL) {
        const char *type = get_str(p, "type");
        if (type && !strcmp(type, "TemplateProcessing")) {
            const cJSON *single = get(p, "single");
            if (cJSON_GetArraySize(single) > 1) {
                const cJSON *z = single->child;
                while (z->next) z = z->next;
                *first = get_str(get(single->child, "SpecialToken"), "id");
                *last = get_str(get(z, "SpecialToken"), "id");
            }
        }
        if (!cJSON_IsArray(procs)) break;
    }
}

static void set_special(cv_vocab *v, int typ, int64_t id) {
    if (id >= 0 && id < v->n && v->special[typ] < 0) v->special[typ] = id;
}

static ellm_status read_specials(cv_vocab *v, const vsrc *s, ellm_error *err) {
    const char *bos = token_content(get(s->tok_cfg, "bos_token"));
    const char *eos = token_content(get(s->tok_cfg, "eos_token"));
    if (s->tok_json) {
        const char *first, *last;
        post_processor_ends(get(s->tok_json, "post_processor"), &first, &last);
        if (first) {
            if (!s->tok_cfg) bos = first;
            v->add_bos = bos && !strcmp(first, bos);
        }
        if (last) {
            if (!s->tok_cfg) eos = last;
            v->add_eos = eos && !strcmp(last, eos);
        }
    }
    for (int t = 0; t < CV_SPECIAL_COUNT; t++) {
        char key[32];
        if (s->tok_cfg) {
            snprintf(key, sizeof key, "add_%s_token", special_names[t]);
            const cJSON *add = get(s->tok_cfg, key);
            if (cJSON_IsBool(add) && t == CV_SPECIAL_BOS) v->add_bos = cJSON_IsTrue(add);
            if (cJSON_IsBool(add) && t == CV_SPECIAL_EOS) v->add_eos = cJSON_IsTrue(add);
            snprintf(key, sizeof key, "%s_token", special_names[t]);
            const char *content = t == CV_SPECIAL_BOS ? bos : t == CV_SPECIAL_EOS ? eos : token_content(get(s->tok_cfg, key));
            if (content && s->tok_json) set_special(v, t, find_added(s->tok_json, content));
        } else if (s->tok_json && (t == CV_SPECIAL_BOS || t == CV_SPECIAL_EOS)) {
            const char *content = t == CV_SPECIAL_BOS ? bos : eos;
            if (content) set_special(v, t, find_added(s->tok_json, content));
        }
        snprintf(key, sizeof key, "%s_token_id", special_names[t]);
        for (int k = 0; k < 2; k++) {
            const cJSON *e = get(k ? s->gen_cfg : s->config, key);
            if (cJSON_IsArray(e)) e = e->child; /* several end ids: the first */
            set_special(v, t, as_id(e, v->n));
        }
    }
    if (v->add_bos == 1 && v->special[CV_SPECIAL_BOS] < 0)
        return ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer_config.json: add_bos_token is set but no BOS token id was found");
    const cJSON *aps = get(s->tok_cfg, "add_prefix_space");
    if (cJSON_IsBool(aps)) v->add_space_prefix = cJSON_IsTrue(aps);
    return ELLM_OK;
}

/* The chat template: tokenizer_config.json's (as the tokenizer picks it from
 * there), else chat_template.jinja. */
static ellm_status read_chat_template(cv_vocab *v, const vsrc *s, ellm_error *err) {
    const char *tmpl = tokenizer_hf_chat_template(s->tok_cfg);
    if (tmpl) {
        v->chat_template = strdup(tmpl);
        return v->chat_template ? ELLM_OK : ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    }
    char *path = cv_path_join(s->dir, "chat_template.jinja");
    ellm_status st = ELLM_OK;
    if (path && cv_is_file(path)) {
        size_t len;
        st = cv_read_file(path, 16u << 20, &v->chat_template, &len, err);
    }
    free(path);
    return st;
}

/* Names the byte-level pre-tokenizer by the fingerprint of its ids for the
 * check text, using eLLM's own tokenizer.json implementation. */
static ellm_status name_pre_tokenizer(cv_vocab *v, const char *tok_json_path, int ignore_merges, ellm_error *err) {
    tokenizer *t = NULL;
    ellm_status st = tokenizer_init_hf_json(tok_json_path, &t, err);
    if (st) return st;
    int32_t ids[1024];
    int n = 0;
    st = tokenizer_encode(t, cv_pre_chktxt, strlen(cv_pre_chktxt), 1, 0, ids, 1024, &n, err);
    tokenizer_free(t);
    if (st) return st;
    /* Python's str(list): "[1, 2, 3]". */
    char *text = malloc((size_t)n * 14 + 3);
    if (!text) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    size_t k = 0;
    text[k++] = '[';
    for (int i = 0; i < n; i++) k += (size_t)sprintf(text + k, i ? ", %d" : "%d", ids[i]);
    text[k++] = ']';
    char hex[65];
    cv_sha256_hex(text, k, hex);
    free(text);
    for (size_t i = 0; i < sizeof cv_pre_hashes / sizeof cv_pre_hashes[0]; i++) {
        if (!strcmp(hex, cv_pre_hashes[i].hash)) {
            snprintf(v->pre, sizeof v->pre, "%s", cv_pre_hashes[i].name);
            /* A Llama 3 tokenizer.json whose post-processor adds no BOS has
             * Smaug's fingerprint; the two differ only in ignore_merges
             * (llama-bpe ignores merges for whole-word tokens), which the
             * file states, so let it decide. */
            if (!strcmp(v->pre, "smaug-bpe") && ignore_merges) snprintf(v->pre, sizeof v->pre, "llama-bpe");
            return ELLM_OK;
        }
    }
    return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                     "'%s': the byte-level BPE pre-tokenizer is not one llama.cpp and eLLM recognize "
                     "(fingerprint %s)",
                     tok_json_path, hex);
}

static ellm_status finish(cv_vocab *v, const vsrc *s, ellm_error *err) {
    ellm_status st = read_specials(v, s, err);
    if (st == ELLM_OK) st = read_chat_template(v, s, err);
    return st;
}

ellm_status cv_vocab_load(const char *dir, int64_t n_vocab, cv_vocab *v, ellm_error *err) {
    vocab_reset(v);
    vsrc s = {.dir = dir};
    char *sp_path = cv_path_join(dir, "tokenizer.model");
    char *json_path = cv_path_join(dir, "tokenizer.json");
    char *sp_buf = NULL;
    ellm_status st = sp_path && json_path ? ELLM_OK : ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    if (st == ELLM_OK) st = load_json(dir, "tokenizer.json", &s.tok_json, err);
    if (st == ELLM_OK) st = load_json(dir, "tokenizer_config.json", &s.tok_cfg, err);
    if (st == ELLM_OK) st = load_json(dir, "config.json", &s.config, err);
    if (st == ELLM_OK) st = load_json(dir, "generation_config.json", &s.gen_cfg, err);
    if (st == ELLM_OK && cv_is_file(sp_path)) {
        size_t len = 0;
        sp_model sp;
        st = cv_read_file(sp_path, CV_MAX_JSON, &sp_buf, &len, err);
        if (st == ELLM_OK) st = sp_model_parse(sp_buf, len, sp_path, &sp, err);
        if (st == ELLM_OK) {
            st = from_sp(v, &sp, n_vocab, sp_path, err);
            sp_model_free(&sp);
        }
        if (st == ELLM_OK) st = sp_added_tokens(v, &s, err);
    } else if (st == ELLM_OK && s.tok_json) {
        st = from_json_bpe(v, s.tok_json, s.tok_cfg, n_vocab, err);
        if (st != ELLM_OK && err && strncmp(err->msg, json_path, strlen(json_path))) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            ellm_fail(err, st, "%s (%s)", msg, json_path);
        }
        if (st == ELLM_OK) v->source = "tokenizer.json";
        if (st == ELLM_OK && !strcmp(v->model, "gpt2")) st = name_pre_tokenizer(v, json_path, cJSON_IsTrue(get(get(s.tok_json, "model"), "ignore_merges")), err);
    } else if (st == ELLM_OK) {
        st = ellm_fail(err, ELLM_ERR_IO, "'%s' has neither tokenizer.model nor tokenizer.json", dir);
    }
    if (st == ELLM_OK) st = finish(v, &s, err);
    cJSON_Delete(s.tok_json);
    cJSON_Delete(s.tok_cfg);
    cJSON_Delete(s.config);
    cJSON_Delete(s.gen_cfg);
    free(sp_buf);
    free(sp_path);
    free(json_path);
    if (st != ELLM_OK) cv_vocab_free(v);
    return st;
}

ellm_status cv_vocab_from_json(const char *json, size_t len, const char *config, size_t config_len, int64_t n_vocab,
                               cv_vocab *v, ellm_error *err) {
    vocab_reset(v);
    vsrc s = {.dir = "."};
    s.tok_json = cJSON_ParseWithLength(json, len);
    if (config) s.tok_cfg = cJSON_ParseWithLength(config, config_len);
    ellm_status st;
    if (!cJSON_IsObject(s.tok_json))
        st = ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer.json: malformed JSON or not an object");
    else if (config && !cJSON_IsObject(s.tok_cfg))
        st = ellm_fail(err, ELLM_ERR_FORMAT, "tokenizer_config.json: malformed JSON or not an object");
    else
        st = from_json_bpe(v, s.tok_json, s.tok_cfg, n_vocab, err);
    if (st == ELLM_OK) st = read_specials(v, &s, err);
    if (st == ELLM_OK) {
        const cJSON *ct = get(s.tok_cfg, "chat_template");
        if (cJSON_IsString(ct) && !(v->chat_template = strdup(ct->valuestring)))
            st = ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    }
    cJSON_Delete(s.tok_json);
    cJSON_Delete(s.tok_cfg);
    if (st != ELLM_OK) cv_vocab_free(v);
    return st;
}

ellm_status cv_vocab_from_sp_memory(const void *data, size_t size, int64_t n_vocab, cv_vocab *v, ellm_error *err) {
    vocab_reset(v);
    sp_model sp;
    ellm_status st = sp_model_parse(data, size, "tokenizer.model", &sp, err);
    if (st != ELLM_OK) return st;
    st = from_sp(v, &sp, n_vocab, "tokenizer.model", err);
    sp_model_free(&sp);
    if (st != ELLM_OK) cv_vocab_free(v);
    return st;
}

ellm_status cv_vocab_write(const cv_vocab *v, gguf_writer *w, ellm_error *err) {
    gguf_writer_add_str(w, "tokenizer.ggml.model", v->model, err);
    gguf_writer_add_str(w, "tokenizer.ggml.pre", v->pre, err);
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, NULL, (uint64_t)v->n, err);
    if (v->scores) gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v->scores, (uint64_t)v->n, err);
    gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types, (uint64_t)v->n, err);
    if (v->merges)
        gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL,
                                (uint64_t)v->n_merges, err);
    for (int t = 0; t < CV_SPECIAL_COUNT; t++)
        if (v->special[t] >= 0) gguf_writer_add_u32(w, special_keys[t], (uint32_t)v->special[t], err);
    if (v->add_bos >= 0) gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos, err);
    if (v->add_eos >= 0) gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos, err);
    if (v->chat_template) gguf_writer_add_str(w, "tokenizer.chat_template", v->chat_template, err);
    if (v->add_space_prefix >= 0)
        return gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", v->add_space_prefix, err);
    /* add_* failures are remembered by the writer and reported by the write;
     * checking one here reports a bad key early. */
    return gguf_writer_n_kv(w) > 0 ? ELLM_OK : ellm_fail(err, ELLM_ERR_ARG, "tokenizer metadata not added");
}
