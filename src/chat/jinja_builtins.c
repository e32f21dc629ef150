/* Jinja builtins: operators, attribute and item access, the global functions
 * (range, namespace, dict, raise_exception, strftime_now), string and dict
 * methods, filters and tests — with Python/Jinja semantics, except where the
 * header of chat.h says otherwise (ASCII-only case mapping).
 *
 * Filters, tests and methods are tables of {name, function}; an unknown name
 * is ELLM_ERR_UNSUPPORTED naming it, since it is usually a real Jinja
 * feature this interpreter lacks. */
#include "chat/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int name_is(const char *s, size_t n, const char *name) {
    return strlen(name) == n && memcmp(s, name, n) == 0;
}

jv *jargs_kw(const jargs *a, const char *name) {
    for (int i = 0; i < a->nkw; i++)
        if (name_is(a->kname[i], a->klen[i], name)) return a->kval[i];
    return NULL;
}

/* Argument i (positional) or `kw` (keyword), or NULL. */
static jv *arg(const jargs *a, int i, const char *kw) {
    if (i >= 0 && i < a->npos) return a->pos[i];
    return kw ? jargs_kw(a, kw) : NULL;
}

static int is_none(const jv *v) { return !v || v->type == JV_NONE || v->type == JV_UNDEF; }

int jb_count_iterations(jctx *c, uint64_t n, uint32_t pos) {
    if (n > c->lim.max_iterations || c->iterations > c->lim.max_iterations - n)
        return jfail(c, ELLM_ERR_UNSUPPORTED, pos, "the template exceeds %llu loop iterations",
                     (unsigned long long)c->lim.max_iterations);
    c->iterations += n;
    return 0;
}

static jv *fail_null(jctx *c, ellm_status st, uint32_t pos, const char *msg, const jv *v) {
    jfail(c, st, pos, "%s (got %s)", msg, v ? jv_type_name(v) : "nothing");
    return NULL;
}

static int want_int(jctx *c, const jv *v, int64_t *out, const char *what, uint32_t pos) {
    if (v && v->type == JV_INT) *out = v->u.i;
    else if (v && v->type == JV_BOOL) *out = v->u.b;
    else return jfail(c, ELLM_ERR_FORMAT, pos, "%s must be an integer (got %s)", what, v ? jv_type_name(v) : "nothing");
    return 0;
}

/* ---- strings ---- */

static int is_cased(uint32_t cp) {
    return (cp < 0x80 && ((cp | 32) >= 'a' && (cp | 32) <= 'z')) || (cp >= 0xC0 && cp <= 0x24F && cp != 0xD7 && cp != 0xF7) ||
           (cp >= 0x370 && cp <= 0x52F);
}

/* ASCII case mapping; other bytes pass through. mode: 0 lower, 1 upper,
 * 2 title (first cased letter of each word up), 3 capitalize. */
static jv *map_case(jctx *c, const jv *s, int mode) {
    size_t n = s->u.s.n;
    char *q = jalloc(c, n + 1);
    if (!q) return NULL;
    const char *p = s->u.s.p;
    int prev_cased = 0;
    size_t i = 0, adv;
    while (i < n) {
        uint32_t cp = jutf8_decode(p + i, n - i, &adv);
        for (size_t k = 0; k < adv; k++) q[i + k] = p[i + k];
        if (cp < 0x80) {
            char ch = p[i];
            int up = mode == 1 || (mode == 2 && !prev_cased) || (mode == 3 && i == 0);
            if (up && ch >= 'a' && ch <= 'z') q[i] = (char)(ch - 32);
            if (!up && ch >= 'A' && ch <= 'Z') q[i] = (char)(ch + 32);
        }
        prev_cased = is_cased(cp);
        i += adv;
    }
    return jv_str_ref(c, q, n);
}

/* Is cp one of the code points of set (NULL: Python whitespace)? */
static int in_strip_set(const char *set, size_t set_n, uint32_t cp) {
    if (!set) return jis_space(cp);
    size_t adv;
    for (size_t k = 0; k < set_n; k += adv)
        if (jutf8_decode(set + k, set_n - k, &adv) == cp) return 1;
    return 0;
}

/* Strips code points in `chars` (NULL: Python whitespace) from the ends. */
static jv *strip(jctx *c, jv *s, const jv *chars, int left, int right) {
    const char *p = s->u.s.p;
    size_t b = 0, e = s->u.s.n, adv;
    const char *set = chars ? chars->u.s.p : NULL;
    size_t set_n = chars ? chars->u.s.n : 0;
    while (left && b < e && in_strip_set(set, set_n, jutf8_decode(p + b, e - b, &adv))) b += adv;
    while (right && e > b) {
        /* the last character: back up over continuation bytes */
        size_t st = e - 1;
        while (st > b && ((unsigned char)p[st] & 0xC0) == 0x80 && e - st < 4) st--;
        uint32_t cp = jutf8_decode(p + st, e - st, &adv);
        if (st + adv != e) { /* no whole character ends at e: a stray byte */
            st = e - 1;
            cp = (unsigned char)p[st];
        }
        if (!in_strip_set(set, set_n, cp)) break;
        e = st;
    }
    return jv_str_ref(c, p + b, e - b);
}

static const char *find_sub(const char *p, size_t n, const char *sub, size_t m) {
    if (m == 0) return p;
    if (m > n) return NULL;
    return memmem(p, n, sub, m);
}

/* Python str.split: on `sep`, or (sep NULL) on runs of whitespace with
 * empty ends dropped; at most maxsplit splits (< 0: no limit). Parts are
 * slices of s. */
static jv *str_split(jctx *c, jv *s, const jv *sep, int64_t maxsplit, uint32_t pos) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, adv;
    jv *parts[2] = {NULL, NULL}; /* pass 0 counts, pass 1 fills */
    size_t count = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t k = 0, i = 0;
        int64_t splits = 0;
        jv *l = pass ? parts[0] : NULL;
        for (;;) {
            size_t start, end;
            if (sep) {
                const char *q = (maxsplit < 0 || splits < maxsplit)
                                    ? find_sub(p + i, n - i, sep->u.s.p, sep->u.s.n)
                                    : NULL;
                start = i;
                end = q ? (size_t)(q - p) : n;
                i = q ? end + sep->u.s.n : n + 1;
            } else {
                while (i < n && jis_space(jutf8_decode(p + i, n - i, &adv))) i += adv;
                if (i >= n) break;
                start = i;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    /* the rest, its trailing whitespace dropped as Python does */
                    end = n;
                    while (end > start && jis_space((unsigned char)p[end - 1])) end--;
                    i = n + 1;
                } else {
                    while (i < n && !jis_space(jutf8_decode(p + i, n - i, &adv))) i += adv;
                    end = i;
                }
            }
            if (pass && !(l->u.l->items[k] = jv_str_ref(c, p + start, end - start))) return NULL;
            k++;
            splits++;
            if (i > n) break;
        }
        if (pass == 0) {
            count = k;
            if (jb_count_iterations(c, count, pos) || !(parts[0] = jv_list(c, count))) return NULL;
        }
    }
    return parts[0];
}

/* rsplit with a separator: split from the right at most maxsplit times. */
static jv *str_rsplit(jctx *c, jv *s, const jv *sep, int64_t maxsplit, uint32_t pos) {
    if (!sep || maxsplit < 0) return str_split(c, s, sep, -1, pos);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, m = sep->u.s.n;
    size_t cuts_cap = (size_t)(maxsplit < 1024 ? maxsplit : 1024) + 1, ncut = 0;
    size_t *cuts = jalloc(c, cuts_cap * sizeof *cuts);
    if (!cuts) return NULL;
    size_t e = n;
    while ((int64_t)ncut < maxsplit && ncut + 1 < cuts_cap && e >= m) {
        size_t i = e - m;
        for (;;) {
            if (memcmp(p + i, sep->u.s.p, m) == 0) break;
            if (i == 0) {
                i = SIZE_MAX;
                break;
            }
            i--;
        }
        if (i == SIZE_MAX) break;
        cuts[ncut++] = i;
        e = i;
    }
    if (jb_count_iterations(c, ncut + 1, pos)) return NULL;
    jv *l = jv_list(c, ncut + 1);
    if (!l) return NULL;
    size_t start = 0;
    for (size_t k = 0; k <= ncut; k++) {
        size_t cut = k < ncut ? cuts[ncut - 1 - k] : n;
        if (!(l->u.l->items[k] = jv_str_ref(c, p + start, cut - start))) return NULL;
        start = cut + m;
    }
    return l;
}

static jv *str_replace(jctx *c, jv *s, const jv *old, const jv *new_, int64_t count, uint32_t pos) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, m = old->u.s.n, r = new_->u.s.n;
    jbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    int rc = 0;
    if (m == 0) {
        /* Python inserts `new` before every character and at the end */
        size_t adv;
        while (rc == 0 && (count < 0 || done < count)) {
            rc = jbuf_put(c, &b, new_->u.s.p, r);
            done++;
            if (i >= n) break;
            jutf8_decode(p + i, n - i, &adv);
            if (!rc) rc = jbuf_put(c, &b, p + i, adv);
            i += adv;
        }
        if (!rc && i < n) rc = jbuf_put(c, &b, p + i, n - i);
    } else {
        while (rc == 0) {
            const char *q = (count < 0 || done < count) ? find_sub(p + i, n - i, old->u.s.p, m) : NULL;
            size_t end = q ? (size_t)(q - p) : n;
            rc = jbuf_put(c, &b, p + i, end - i);
            if (!q) break;
            if (!rc) rc = jbuf_put(c, &b, new_->u.s.p, r);
            i = end + m;
            done++;
        }
    }
    (void)pos;
    jv *out = rc ? NULL : jv_str_copy(c, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return out;
}

/* Code-point index of byte offset `off`. */
static int64_t cp_index(const char *p, size_t off) { return (int64_t)jutf8_count(p, off); }

/* ---- attribute and item access ---- */

enum {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER, M_TITLE,
    M_CAPITALIZE, M_REPLACE, M_FIND, M_RFIND, M_COUNT, M_JOIN, M_ISDIGIT, M_ISALPHA, M_ISALNUM,
    M_ISSPACE, M_ISLOWER, M_ISUPPER, M_STR_END,
    M_ITEMS = 100, M_KEYS, M_VALUES, M_GET, M_DICT_END,
    M_CYCLE = 200
};

static const char *const str_methods[M_STR_END] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower", "title",
    "capitalize", "replace", "find", "rfind", "count", "join", "isdigit", "isalpha", "isalnum",
    "isspace", "islower", "isupper",
};
static const char *const dict_methods[] = {"items", "keys", "values", "get"};

static jv *bind_method(jctx *c, jv *self, int id) {
    jv *v = jalloc(c, sizeof *v);
    jmethod *m = v ? jalloc(c, sizeof *m) : NULL;
    if (!m) return NULL;
    m->self = self;
    m->id = id;
    v->type = JV_METHOD;
    v->u.m = m;
    return v;
}

static jv *loop_field(jctx *c, jv *obj, const char *name, size_t n) {
    const jloop *l = obj->u.loop;
    if (name_is(name, n, "index")) return jv_int(c, (int64_t)l->index0 + 1);
    if (name_is(name, n, "index0")) return jv_int(c, (int64_t)l->index0);
    if (name_is(name, n, "revindex")) return jv_int(c, (int64_t)(l->length - l->index0));
    if (name_is(name, n, "revindex0")) return jv_int(c, (int64_t)(l->length - l->index0 - 1));
    if (name_is(name, n, "first")) return J_BOOL(l->index0 == 0);
    if (name_is(name, n, "last")) return J_BOOL(l->index0 + 1 == l->length);
    if (name_is(name, n, "length")) return jv_int(c, (int64_t)l->length);
    if (name_is(name, n, "previtem")) return l->index0 > 0 ? l->items[l->index0 - 1] : J_UNDEF;
    if (name_is(name, n, "nextitem")) return l->index0 + 1 < l->length ? l->items[l->index0 + 1] : J_UNDEF;
    if (name_is(name, n, "depth")) return jv_int(c, 1);
    if (name_is(name, n, "depth0")) return jv_int(c, 0);
    if (name_is(name, n, "cycle")) return bind_method(c, obj, M_CYCLE);
    return J_UNDEF;
}

jv *jb_getattr(jctx *c, jv *obj, const char *name, size_t n) {
    switch (obj->type) {
    case JV_DICT: {
        jv *v = jdict_get_str(obj, name, n);
        if (v) return v;
        for (int i = 0; i < 4; i++)
            if (name_is(name, n, dict_methods[i])) return bind_method(c, obj, M_ITEMS + i);
        return J_UNDEF;
    }
    case JV_NS: {
        jv *v = jdict_get_str(obj, name, n);
        return v ? v : J_UNDEF;
    }
    case JV_LOOP: return loop_field(c, obj, name, n);
    case JV_STR:
        for (int i = 0; i < M_STR_END; i++)
            if (name_is(name, n, str_methods[i])) return bind_method(c, obj, i);
        return J_UNDEF;
    default: return J_UNDEF;
    }
}

jv *jb_getitem(jctx *c, jv *obj, jv *key, uint32_t pos) {
    (void)pos;
    switch (obj->type) {
    case JV_LIST:
    case JV_STR: {
        if (key->type != JV_INT && key->type != JV_BOOL) return J_UNDEF;
        int64_t i = key->type == JV_INT ? key->u.i : key->u.b;
        if (obj->type == JV_LIST) {
            int64_t len = (int64_t)obj->u.l->n;
            if (i < 0) i += len;
            return i >= 0 && i < len ? obj->u.l->items[i] : J_UNDEF;
        }
        const char *p = obj->u.s.p;
        size_t n = obj->u.s.n, adv;
        int64_t len = (int64_t)jutf8_count(p, n);
        if (i < 0) i += len;
        if (i < 0 || i >= len) return J_UNDEF;
        size_t off = 0;
        for (int64_t k = 0; k < i; k++) {
            jutf8_decode(p + off, n - off, &adv);
            off += adv;
        }
        jutf8_decode(p + off, n - off, &adv);
        return jv_str_ref(c, p + off, adv);
    }
    case JV_DICT:
    case JV_NS: {
        jv *v = jdict_get(obj, key);
        if (v) return v;
        if (obj->type == JV_DICT && key->type == JV_STR) return jb_getattr(c, obj, key->u.s.p, key->u.s.n);
        return J_UNDEF;
    }
    case JV_LOOP:
        return key->type == JV_STR ? loop_field(c, obj, key->u.s.p, key->u.s.n) : J_UNDEF;
    default: return J_UNDEF;
    }
}

/* Follows a dotted attribute path ("a.b", "items.0") as Jinja's filters do.
 * A path that is neither a string nor an integer (an undefined variable, a
 * list) names no attribute: undefined, as Jinja's item lookup gives. */
static jv *attr_path(jctx *c, jv *item, const jv *path) {
    if (path->type == JV_INT) return jb_getitem(c, item, (jv *)path, JPOS_NONE);
    if (path->type != JV_STR) return J_UNDEF;
    const char *p = path->u.s.p;
    size_t n = path->u.s.n, i = 0;
    while (item && i <= n) {
        const char *dot = memchr(p + i, '.', n - i);
        size_t end = dot ? (size_t)(dot - p) : n;
        const char *part = p + i;
        size_t len = end - i;
        int digits = len > 0 && len < 18;
        for (size_t k = 0; k < len && digits; k++) digits = part[k] >= '0' && part[k] <= '9';
        if (digits && item->type == JV_LIST) {
            jv *idx = jv_int(c, strtoll(part, NULL, 10));
            item = idx ? jb_getitem(c, item, idx, JPOS_NONE) : NULL;
        } else {
            item = jb_getattr(c, item, part, len);
        }
        if (!dot) break;
        i = end + 1;
    }
    return item;
}

jv *jb_iterate(jctx *c, jv *v, uint32_t pos) {
    switch (v->type) {
    case JV_LIST: return v;
    case JV_UNDEF: return jv_list(c, 0);
    case JV_DICT: {
        jv *l = jv_list(c, v->u.d->n);
        if (l)
            for (size_t i = 0; i < v->u.d->n; i++) l->u.l->items[i] = v->u.d->keys[i];
        return l;
    }
    case JV_STR: {
        const char *p = v->u.s.p;
        size_t n = v->u.s.n, cps = jutf8_count(p, n), adv;
        jv *l = jv_list(c, cps);
        if (!l) return NULL;
        for (size_t i = 0, k = 0; i < n; i += adv) {
            jutf8_decode(p + i, n - i, &adv);
            if (!(l->u.l->items[k++] = jv_str_ref(c, p + i, adv))) return NULL;
        }
        return l;
    }
    default:
        jfail(c, ELLM_ERR_FORMAT, pos, "'%s' object is not iterable", jv_type_name(v));
        return NULL;
    }
}

/* ---- operators ---- */

static int is_num(const jv *v) { return v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL; }
static int64_t as_i(const jv *v) { return v->type == JV_INT ? v->u.i : (int64_t)v->u.b; }
static double as_f(const jv *v) { return v->type == JV_FLOAT ? v->u.f : (double)as_i(v); }

static jv *contains(jctx *c, jv *container, jv *item, uint32_t pos) {
    switch (container->type) {
    case JV_STR:
        if (item->type != JV_STR)
            return fail_null(c, ELLM_ERR_FORMAT, pos, "'in <string>' requires a string on the left", item);
        return J_BOOL(find_sub(container->u.s.p, container->u.s.n, item->u.s.p, item->u.s.n) != NULL);
    case JV_LIST:
        for (size_t i = 0; i < container->u.l->n; i++) {
            int e = jv_equal(c, container->u.l->items[i], item, 0);
            if (e < 0) return NULL;
            if (e) return J_TRUE;
        }
        return J_FALSE;
    case JV_DICT:
    case JV_NS: return J_BOOL(jdict_get(container, item) != NULL);
    case JV_UNDEF: return J_FALSE;
    default: return fail_null(c, ELLM_ERR_FORMAT, pos, "'in' needs a string, list or dict on the right", container);
    }
}

static jv *repeat(jctx *c, jv *seq, int64_t times, uint32_t pos) {
    if (times <= 0) return seq->type == JV_STR ? jv_str_ref(c, "", 0) : jv_list(c, 0);
    if (seq->type == JV_STR) {
        size_t n = seq->u.s.n;
        if (n && (uint64_t)times > c->lim.max_output / n) {
            jfail(c, ELLM_ERR_UNSUPPORTED, pos, "string repetition exceeds %zu bytes", c->lim.max_output);
            return NULL;
        }
        char *q = jalloc(c, n * (size_t)times + 1);
        if (!q) return NULL;
        for (int64_t i = 0; i < times; i++) memcpy(q + (size_t)i * n, seq->u.s.p, n);
        return jv_str_ref(c, q, n * (size_t)times);
    }
    size_t n = seq->u.l->n;
    if (n && jb_count_iterations(c, n * (uint64_t)(times > (int64_t)c->lim.max_iterations ? (int64_t)c->lim.max_iterations + 1 : times), pos))
        return NULL;
    jv *l = jv_list(c, n * (size_t)times);
    if (!l) return NULL;
    l->tuple = seq->tuple;
    for (int64_t i = 0; i < times; i++)
        if (n) memcpy(l->u.l->items + (size_t)i * n, seq->u.l->items, n * sizeof(jv *));
    return l;
}

static jv *int_pow(jctx *c, int64_t base, int64_t e, uint32_t pos) {
    int64_t r = 1;
    while (e > 0) {
        if (e & 1) {
            if (__builtin_mul_overflow(r, base, &r)) goto overflow;
        }
        e >>= 1;
        if (e && __builtin_mul_overflow(base, base, &base)) {
            if (r == 0) break;
            goto overflow;
        }
    }
    return jv_int(c, r);
overflow:
    jfail(c, ELLM_ERR_UNSUPPORTED, pos, "integer overflow in '**'");
    return NULL;
}

static jv *arith(jctx *c, int op, jv *a, jv *b, uint32_t pos) {
    int fl = a->type == JV_FLOAT || b->type == JV_FLOAT;
    if (!fl) {
        int64_t x = as_i(a), y = as_i(b), r;
        switch (op) {
        case JOP_ADD: if (__builtin_add_overflow(x, y, &r)) goto overflow; return jv_int(c, r);
        case JOP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto overflow; return jv_int(c, r);
        case JOP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto overflow; return jv_int(c, r);
        case JOP_DIV:
            if (y == 0) goto divzero;
            return jv_float(c, (double)x / (double)y);
        case JOP_FLOORDIV:
        case JOP_MOD: {
            if (y == 0) goto divzero;
            if (x == INT64_MIN && y == -1) {
                if (op == JOP_MOD) return jv_int(c, 0);
                goto overflow;
            }
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return jv_int(c, op == JOP_MOD ? m : q);
        }
        case JOP_POW:
            if (y >= 0) return int_pow(c, x, y, pos);
            if (x == 0) goto zeroneg;
            return jv_float(c, pow((double)x, (double)y));
        }
    } else {
        double x = as_f(a), y = as_f(b);
        switch (op) {
        case JOP_ADD: return jv_float(c, x + y);
        case JOP_SUB: return jv_float(c, x - y);
        case JOP_MUL: return jv_float(c, x * y);
        case JOP_DIV:
            if (y == 0) goto divzero;
            return jv_float(c, x / y);
        case JOP_FLOORDIV:
        case JOP_MOD: {
            if (y == 0) goto divzero;
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return jv_float(c, op == JOP_MOD ? m : floor((x - m) / y + 0.5));
        }
        case JOP_POW:
            if (x == 0 && y < 0) goto zeroneg;
            return jv_float(c, pow(x, y));
        }
    }
    jfail(c, ELLM_ERR_FORMAT, pos, "bad arithmetic operator");
    return NULL;
overflow:
    jfail(c, ELLM_ERR_UNSUPPORTED, pos, "integer overflow");
    return NULL;
divzero:
    jfail(c, ELLM_ERR_FORMAT, pos, "division by zero");
    return NULL;
zeroneg:
    jfail(c, ELLM_ERR_FORMAT, pos, "0 cannot be raised to a negative power");
    return NULL;
}

static const char *op_name(int op) {
    switch (op) {
    case JOP_ADD: return "+";
    case JOP_SUB: return "-";
    case JOP_MUL: return "*";
    case JOP_DIV: return "/";
    case JOP_FLOORDIV: return "//";
    case JOP_MOD: return "%";
    case JOP_POW: return "**";
    default: return "?";
    }
}

static jv *concat(jctx *c, const jv *a, const jv *b) {
    size_t n = a->u.s.n + b->u.s.n;
    if (n >= c->lim.max_output) {
        jfail(c, ELLM_ERR_UNSUPPORTED, JPOS_NONE, "a string exceeds %zu bytes", c->lim.max_output);
        return NULL;
    }
    char *q = jalloc(c, n + 1);
    if (!q) return NULL;
    memcpy(q, a->u.s.p, a->u.s.n);
    memcpy(q + a->u.s.n, b->u.s.p, b->u.s.n);
    return jv_str_ref(c, q, n);
}

jv *jb_binop(jctx *c, int op, jv *a, jv *b, uint32_t pos) {
    int r;
    switch (op) {
    case JOP_EQ:
    case JOP_NE: {
        int e = jv_equal(c, a, b, 0);
        if (e < 0) return NULL;
        return J_BOOL(op == JOP_EQ ? e : !e);
    }
    case JOP_LT:
    case JOP_LE:
    case JOP_GT:
    case JOP_GE:
        if (jv_compare(c, a, b, 0, &r, pos)) return NULL;
        return J_BOOL(op == JOP_LT ? r < 0 : op == JOP_LE ? r <= 0 : op == JOP_GT ? r > 0 : r >= 0);
    case JOP_IN: return contains(c, b, a, pos);
    case JOP_NOT_IN: {
        jv *v = contains(c, b, a, pos);
        return v ? J_BOOL(!jv_truthy(v)) : NULL;
    }
    case JOP_TILDE: {
        jv *x = jv_to_str(c, a), *y = x ? jv_to_str(c, b) : NULL;
        return y ? concat(c, x, y) : NULL;
    }
    default: break;
    }
    if (is_num(a) && is_num(b)) return arith(c, op, a, b, pos);
    if (op == JOP_ADD) {
        if (a->type == JV_STR && b->type == JV_STR) return concat(c, a, b);
        if (a->type == JV_LIST && b->type == JV_LIST) {
            size_t n = a->u.l->n + b->u.l->n;
            if (jb_count_iterations(c, n, pos)) return NULL;
            jv *l = jv_list(c, n);
            if (!l) return NULL;
            l->tuple = a->tuple;
            if (a->u.l->n) memcpy(l->u.l->items, a->u.l->items, a->u.l->n * sizeof(jv *));
            if (b->u.l->n) memcpy(l->u.l->items + a->u.l->n, b->u.l->items, b->u.l->n * sizeof(jv *));
            return l;
        }
        /* A string plus a number, bool or None concatenates their str(), as
         * the reference renderer does (Python would raise). */
        int sa = a->type == JV_STR, sb = b->type == JV_STR;
        int scalar_a = is_num(a) || a->type == JV_NONE, scalar_b = is_num(b) || b->type == JV_NONE;
        if ((sa && scalar_b) || (sb && scalar_a)) {
            jv *x = jv_to_str(c, a), *y = x ? jv_to_str(c, b) : NULL;
            return y ? concat(c, x, y) : NULL;
        }
    }
    if (op == JOP_MUL) {
        if ((a->type == JV_STR || a->type == JV_LIST) && (b->type == JV_INT || b->type == JV_BOOL))
            return repeat(c, a, as_i(b), pos);
        if ((b->type == JV_STR || b->type == JV_LIST) && (a->type == JV_INT || a->type == JV_BOOL))
            return repeat(c, b, as_i(a), pos);
    }
    if (op == JOP_MOD && a->type == JV_STR) {
        jfail(c, ELLM_ERR_UNSUPPORTED, pos, "'%%' string formatting is not supported");
        return NULL;
    }
    if (a->type == JV_UNDEF || b->type == JV_UNDEF) {
        jfail(c, ELLM_ERR_FORMAT, pos, "undefined value in '%s' (a missing variable or key?)", op_name(op));
        return NULL;
    }
    jfail(c, ELLM_ERR_FORMAT, pos, "unsupported operand types for %s: %s and %s", op_name(op), jv_type_name(a),
          jv_type_name(b));
    return NULL;
}

/* ---- sorting (stable merge sort; the comparator may fail) ---- */

typedef struct {
    jctx *c;
    const jv *attr; /* sort by this attribute path, or NULL */
    int fold_case, reverse;
    uint32_t pos;
} sort_spec;

static int sort_key(const sort_spec *sp, jv *item, jv **key) {
    *key = sp->attr ? attr_path(sp->c, item, sp->attr) : item;
    return *key ? 0 : -1;
}

static int sort_values(const sort_spec *sp, jv **v, size_t n) {
    jctx *c = sp->c;
    if (jb_count_iterations(c, n, sp->pos)) return -1;
    if (n == 0) return 0; /* v may be NULL (an undefined value's empty list) */
    jv **keys = jalloc(c, n * 2 * sizeof *keys), **sorted = keys + n;
    size_t *idx = jalloc(c, n * sizeof *idx);
    if (!keys || !idx) return -1;
    for (size_t i = 0; i < n; i++) {
        if (sort_key(sp, v[i], &keys[i])) return -1;
        idx[i] = i;
    }
    if (jv_sort_indices(c, keys, idx, n, sp->fold_case, sp->reverse, sp->pos)) return -1;
    for (size_t i = 0; i < n; i++) sorted[i] = v[idx[i]];
    memcpy(v, sorted, n * sizeof *v);
    return 0;
}

/* ---- filters ---- */

typedef jv *(*filter_fn)(jctx *c, jv *v, jargs *a, uint32_t pos);

static jv *as_list(jctx *c, jv *v, uint32_t pos) { return jb_iterate(c, v, pos); }

static jv *f_abs(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    if (v->type == JV_FLOAT) return jv_float(c, fabs(v->u.f));
    if (v->type == JV_INT || v->type == JV_BOOL) {
        int64_t i = as_i(v);
        if (i == INT64_MIN) return fail_null(c, ELLM_ERR_UNSUPPORTED, pos, "integer overflow in abs", v);
        return jv_int(c, i < 0 ? -i : i);
    }
    return fail_null(c, ELLM_ERR_FORMAT, pos, "abs needs a number", v);
}

static jv *f_case(jctx *c, jv *v, int mode) {
    jv *s = jv_to_str(c, v);
    return s ? map_case(c, s, mode) : NULL;
}
static jv *f_lower(jctx *c, jv *v, jargs *a, uint32_t pos) { (void)a; (void)pos; return f_case(c, v, 0); }
static jv *f_upper(jctx *c, jv *v, jargs *a, uint32_t pos) { (void)a; (void)pos; return f_case(c, v, 1); }
static jv *f_title(jctx *c, jv *v, jargs *a, uint32_t pos) { (void)a; (void)pos; return f_case(c, v, 2); }
static jv *f_capitalize(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    (void)pos;
    jv *s = f_case(c, v, 0); /* Python: first character upper, the rest lower */
    return s ? map_case(c, s, 3) : NULL;
}

static jv *f_length(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    switch (v->type) {
    case JV_STR: return jv_int(c, (int64_t)jutf8_count(v->u.s.p, v->u.s.n));
    case JV_LIST: return jv_int(c, (int64_t)v->u.l->n);
    case JV_DICT:
    case JV_NS: return jv_int(c, (int64_t)v->u.d->n);
    case JV_UNDEF: return jv_int(c, 0);
    default: return fail_null(c, ELLM_ERR_FORMAT, pos, "length of an object without one", v);
    }
}

static jv *f_default(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)pos;
    jv *def = arg(a, 0, "default_value");
    jv *boolean = arg(a, 1, "boolean");
    if (v->type == JV_UNDEF || (boolean && jv_truthy(boolean) && !jv_truthy(v)))
        return def ? def : jv_str_ref(c, "", 0);
    return v;
}

static jv *f_first(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    if (v->type == JV_UNDEF) return J_UNDEF;
    jv *l = as_list(c, v, pos);
    return l ? (l->u.l->n ? l->u.l->items[0] : J_UNDEF) : NULL;
}

static jv *f_last(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    if (v->type == JV_UNDEF) return J_UNDEF;
    jv *l = as_list(c, v, pos);
    return l ? (l->u.l->n ? l->u.l->items[l->u.l->n - 1] : J_UNDEF) : NULL;
}

static jv *f_list(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    jv *l = as_list(c, v, pos);
    if (!l || !l->tuple) return l;
    jv *r = jv_list(c, l->u.l->n);
    if (r && l->u.l->n) memcpy(r->u.l->items, l->u.l->items, l->u.l->n * sizeof(jv *));
    return r;
}

static jv *f_items(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    if (v->type == JV_UNDEF) return jv_list(c, 0);
    if (v->type != JV_DICT) return fail_null(c, ELLM_ERR_FORMAT, pos, "items needs a dict", v);
    jv *l = jv_list(c, v->u.d->n);
    if (!l) return NULL;
    for (size_t i = 0; i < v->u.d->n; i++) {
        jv *t = jv_list(c, 2);
        if (!t) return NULL;
        t->tuple = 1;
        t->u.l->items[0] = v->u.d->keys[i];
        t->u.l->items[1] = v->u.d->vals[i];
        l->u.l->items[i] = t;
    }
    return l;
}

static jv *f_string(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    (void)pos;
    return jv_to_str(c, v);
}

static jv *f_safe(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)c;
    (void)a;
    (void)pos;
    return v;
}

static jv *f_trim(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *chars = arg(a, 0, "chars");
    if (chars && chars->type != JV_STR && !is_none(chars))
        return fail_null(c, ELLM_ERR_FORMAT, pos, "trim chars must be a string", chars);
    jv *s = jv_to_str(c, v);
    return s ? strip(c, s, is_none(chars) ? NULL : chars, 1, 1) : NULL;
}

static jv *f_join(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *sep = arg(a, 0, "d");
    jv *attr = arg(a, 1, "attribute");
    jv *l = as_list(c, v, pos);
    if (!l) return NULL;
    jv *sep_s = sep ? jv_to_str(c, sep) : jv_str_ref(c, "", 0);
    if (!sep_s) return NULL;
    jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < l->u.l->n && rc == 0; i++) {
        jv *item = l->u.l->items[i];
        if (attr && !is_none(attr) && !(item = attr_path(c, item, attr))) rc = -1;
        if (!rc && i) rc = jbuf_put(c, &b, sep_s->u.s.p, sep_s->u.s.n);
        if (!rc) rc = jv_write_str(c, &b, item);
    }
    jv *r = rc ? NULL : jv_str_copy(c, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return r;
}

static jv *f_tojson(jctx *c, jv *v, jargs *a, uint32_t pos) {
    /* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    jjson_opts o = {.indent = -1};
    jv *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"),
       *sk = arg(a, 3, "sort_keys");
    o.ensure_ascii = ea && jv_truthy(ea);
    o.sort_keys = sk && jv_truthy(sk);
    if (!is_none(ind)) {
        int64_t n = 0;
        if (want_int(c, ind, &n, "tojson indent", pos)) return NULL;
        if (n > 1024) return fail_null(c, ELLM_ERR_UNSUPPORTED, pos, "tojson indent larger than 1024", ind);
        o.indent = n < 0 ? 0 : (int)n;
    }
    if (!is_none(sep)) {
        if (sep->type != JV_LIST || sep->u.l->n != 2 || sep->u.l->items[0]->type != JV_STR ||
            sep->u.l->items[1]->type != JV_STR)
            return fail_null(c, ELLM_ERR_FORMAT, pos, "tojson separators must be two strings", sep);
        /* NUL-terminated copies for the writer */
        jv *s0 = jv_str_copy(c, sep->u.l->items[0]->u.s.p, sep->u.l->items[0]->u.s.n);
        jv *s1 = s0 ? jv_str_copy(c, sep->u.l->items[1]->u.s.p, sep->u.l->items[1]->u.s.n) : NULL;
        if (!s1) return NULL;
        o.item_sep = s0->u.s.p;
        o.key_sep = s1->u.s.p;
    }
    jbuf b = {0};
    int rc = jv_write_json(c, &b, v, &o, 0, pos);
    jv *r = rc ? NULL : jv_str_copy(c, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return r;
}

/* The string v as a NUL-terminated C string in buf; 0 if empty or too long
 * to be a number. */
static int number_text(const jv *v, char *buf, size_t size) {
    size_t n = v->u.s.n;
    if (n == 0 || n >= size) return 0;
    memcpy(buf, v->u.s.p, n);
    buf[n] = 0;
    return 1;
}

/* Whether strtoll/strtod consumed buf up to trailing whitespace. */
static int parsed_whole(const char *buf, const char *end) {
    while (*end == ' ' || *end == '\t' || *end == '\n') end++;
    return *end == 0 && end != buf;
}

static jv *f_int(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *def = arg(a, 0, "default");
    jv *base_v = arg(a, 1, "base");
    int64_t base = 10;
    if (base_v && want_int(c, base_v, &base, "int base", pos)) return NULL;
    if (base < 2 || base > 36) base = 10;
    switch (v->type) {
    case JV_INT: return v;
    case JV_BOOL: return jv_int(c, v->u.b);
    case JV_FLOAT:
        if (!(v->u.f > -9.2e18 && v->u.f < 9.2e18)) break;
        return jv_int(c, (int64_t)v->u.f);
    case JV_STR: {
        char buf[64], *end;
        if (!number_text(v, buf, sizeof buf)) break;
        long long x = strtoll(buf, &end, (int)base);
        if (parsed_whole(buf, end)) return jv_int(c, x);
        double f = strtod(buf, &end);
        if (parsed_whole(buf, end) && f > -9.2e18 && f < 9.2e18) return jv_int(c, (int64_t)f);
        break;
    }
    default: break;
    }
    return def ? def : jv_int(c, 0);
}

static jv *f_float(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)pos;
    jv *def = arg(a, 0, "default");
    switch (v->type) {
    case JV_FLOAT: return v;
    case JV_INT:
    case JV_BOOL: return jv_float(c, as_f(v));
    case JV_STR: {
        char buf[64], *end;
        if (!number_text(v, buf, sizeof buf)) break;
        double f = strtod(buf, &end);
        if (parsed_whole(buf, end)) return jv_float(c, f);
        break;
    }
    default: break;
    }
    return def ? def : jv_float(c, 0.0);
}

static jv *f_round(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *prec_v = arg(a, 0, "precision"), *method = arg(a, 1, "method");
    int64_t prec = 0;
    if (prec_v && want_int(c, prec_v, &prec, "round precision", pos)) return NULL;
    if (!is_num(v)) return fail_null(c, ELLM_ERR_FORMAT, pos, "round needs a number", v);
    if (prec < -20) prec = -20;
    if (prec > 20) prec = 20;
    double x = as_f(v), m = pow(10.0, (double)prec);
    if (method && method->type == JV_STR && name_is(method->u.s.p, method->u.s.n, "ceil"))
        return jv_float(c, ceil(x * m) / m);
    if (method && method->type == JV_STR && name_is(method->u.s.p, method->u.s.n, "floor"))
        return jv_float(c, floor(x * m) / m);
    /* 'common' is Python's round(): half to even on the exact binary value,
     * which is how printf rounds */
    if (prec < 0) return jv_float(c, rint(x * m) / m);
    if (!isfinite(x)) return jv_float(c, x);
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
    return jv_float(c, strtod(buf, NULL));
}

static jv *f_replace(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *old = arg(a, 0, "old"), *new_ = arg(a, 1, "new"), *count = arg(a, 2, "count");
    jv *s = jv_to_str(c, v);
    if (!s) return NULL;
    if (!old || !new_ || old->type != JV_STR || new_->type != JV_STR)
        return fail_null(c, ELLM_ERR_FORMAT, pos, "replace needs two strings", old);
    int64_t n = -1;
    if (!is_none(count) && want_int(c, count, &n, "replace count", pos)) return NULL;
    return str_replace(c, s, old, new_, n, pos);
}

static jv *f_reverse(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    if (v->type == JV_STR) {
        size_t n = v->u.s.n, i = 0, adv;
        char *q = jalloc(c, n + 1);
        if (!q) return NULL;
        while (i < n) {
            jutf8_decode(v->u.s.p + i, n - i, &adv);
            memcpy(q + n - i - adv, v->u.s.p + i, adv);
            i += adv;
        }
        return jv_str_ref(c, q, n);
    }
    jv *l = as_list(c, v, pos);
    if (!l) return NULL;
    size_t n = l->u.l->n;
    jv *r = jv_list(c, n);
    if (!r) return NULL;
    for (size_t i = 0; i < n; i++) r->u.l->items[i] = l->u.l->items[n - 1 - i];
    return r;
}

static jv *copy_list(jctx *c, jv *l) {
    jv *r = jv_list(c, l->u.l->n);
    if (r && l->u.l->n) memcpy(r->u.l->items, l->u.l->items, l->u.l->n * sizeof(jv *));
    return r;
}

static jv *f_sort(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *rev = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *attr = arg(a, 2, "attribute");
    jv *l = as_list(c, v, pos);
    jv *r = l ? copy_list(c, l) : NULL;
    if (!r) return NULL;
    sort_spec sp = {c, is_none(attr) ? NULL : attr, !(cs && jv_truthy(cs)), rev && jv_truthy(rev), pos};
    return sort_values(&sp, r->u.l->items, r->u.l->n) ? NULL : r;
}

static jv *f_dictsort(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rev = arg(a, 2, "reverse");
    jv *items = f_items(c, v, a, pos);
    if (!items) return NULL;
    int by_value = by && by->type == JV_STR && name_is(by->u.s.p, by->u.s.n, "value");
    jv *path = jv_int(c, by_value ? 1 : 0);
    if (!path) return NULL;
    sort_spec sp = {c, path, !(cs && jv_truthy(cs)), rev && jv_truthy(rev), pos};
    return sort_values(&sp, items->u.l->items, items->u.l->n) ? NULL : items;
}

static jv *f_unique(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *attr = arg(a, 1, "attribute");
    jv *l = as_list(c, v, pos);
    if (!l) return NULL;
    size_t n = l->u.l->n, k = 0;
    if (jb_count_iterations(c, n, pos)) return NULL;
    jv *r = jv_list(c, n);
    jv **keys = r ? jalloc(c, (n ? n : 1) * sizeof *keys) : NULL;
    if (!keys) return NULL;
    for (size_t i = 0; i < n; i++) {
        jv *key = is_none(attr) ? l->u.l->items[i] : attr_path(c, l->u.l->items[i], attr);
        if (!key) return NULL;
        int seen = 0;
        for (size_t j = 0; j < k && !seen; j++) {
            if (jb_count_iterations(c, 1, pos)) return NULL;
            int e = jv_equal(c, keys[j], key, 0);
            if (e < 0) return NULL;
            seen = e;
        }
        if (!seen) {
            keys[k] = key;
            r->u.l->items[k++] = l->u.l->items[i];
        }
    }
    r->u.l->n = k;
    return r;
}

static jv *f_minmax(jctx *c, jv *v, jargs *a, uint32_t pos, int want_max) {
    jv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    jv *l = as_list(c, v, pos);
    if (!l) return NULL;
    if (l->u.l->n == 0) return J_UNDEF;
    jv *best = l->u.l->items[0], *best_key = is_none(attr) ? best : attr_path(c, best, attr);
    for (size_t i = 1; best_key && i < l->u.l->n; i++) {
        jv *key = is_none(attr) ? l->u.l->items[i] : attr_path(c, l->u.l->items[i], attr);
        int r;
        if (!key || jv_compare(c, key, best_key, !(cs && jv_truthy(cs)), &r, pos)) return NULL;
        if (want_max ? r > 0 : r < 0) {
            best = l->u.l->items[i];
            best_key = key;
        }
    }
    return best_key ? best : NULL;
}
static jv *f_min(jctx *c, jv *v, jargs *a, uint32_t pos) { return f_minmax(c, v, a, pos, 0); }
static jv *f_max(jctx *c, jv *v, jargs *a, uint32_t pos) { return f_minmax(c, v, a, pos, 1); }

static jv *f_sum(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *attr = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
    jv *l = as_list(c, v, pos);
    jv *acc = start ? start : jv_int(c, 0);
    for (size_t i = 0; l && acc && i < l->u.l->n; i++) {
        jv *x = is_none(attr) ? l->u.l->items[i] : attr_path(c, l->u.l->items[i], attr);
        acc = x ? jb_binop(c, JOP_ADD, acc, x, pos) : NULL;
    }
    return l ? acc : NULL;
}

static jv *f_indent(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *width = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    jv *s = jv_to_str(c, v);
    if (!s) return NULL;
    const char *pad = "    ";
    size_t pad_n = 4;
    char spaces[256];
    if (width && width->type == JV_STR) {
        pad = width->u.s.p;
        pad_n = width->u.s.n;
    } else if (width) {
        int64_t w = 0;
        if (want_int(c, width, &w, "indent width", pos)) return NULL;
        if (w < 0) w = 0;
        if (w > (int64_t)sizeof spaces) return fail_null(c, ELLM_ERR_UNSUPPORTED, pos, "indent wider than 256", width);
        memset(spaces, ' ', (size_t)w);
        pad = spaces;
        pad_n = (size_t)w;
    }
    jbuf b = {0};
    int rc = 0;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    for (int line = 0; rc == 0 && i <= n; line++) {
        const char *nl = memchr(p + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - p) : n;
        int empty = end == i;
        if ((line > 0 || (first && jv_truthy(first))) && (!empty || (blank && jv_truthy(blank))))
            rc = jbuf_put(c, &b, pad, pad_n);
        if (!rc) rc = jbuf_put(c, &b, p + i, end - i + (nl ? 1 : 0));
        if (!nl) break;
        i = end + 1;
    }
    jv *r = rc ? NULL : jv_str_copy(c, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return r;
}

static jv *f_escape(jctx *c, jv *v, jargs *a, uint32_t pos) {
    (void)a;
    (void)pos;
    jv *s = jv_to_str(c, v);
    if (!s) return NULL;
    jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < s->u.s.n && rc == 0; i++) {
        char ch = s->u.s.p[i];
        const char *e = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : NULL;
        rc = e ? jbuf_put(c, &b, e, strlen(e)) : jbuf_putc(c, &b, ch);
    }
    jv *r = rc ? NULL : jv_str_copy(c, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return r;
}

static jv *f_attr(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *name = arg(a, 0, "name");
    if (!name || name->type != JV_STR) return fail_null(c, ELLM_ERR_FORMAT, pos, "attr needs a name", name);
    return jb_getattr(c, v, name->u.s.p, name->u.s.n);
}

/* select/reject and selectattr/rejectattr: keep items whose test (or
 * truthiness) is `keep`; by_attr tests an attribute of each item. */
static jv *select_items(jctx *c, jv *v, jargs *a, uint32_t pos, int by_attr, int keep) {
    jv *l = as_list(c, v, pos);
    if (!l) return NULL;
    int first_test = by_attr ? 1 : 0;
    jv *attr = by_attr ? arg(a, 0, NULL) : NULL;
    if (by_attr && !attr)
        return fail_null(c, ELLM_ERR_FORMAT, pos, "selectattr/rejectattr need an attribute name", attr);
    jv *test = a->npos > first_test ? a->pos[first_test] : NULL;
    if (test && test->type != JV_STR) return fail_null(c, ELLM_ERR_FORMAT, pos, "the test name must be a string", test);
    jargs ta = {0};
    for (int i = first_test + 1; i < a->npos; i++) ta.pos[ta.npos++] = a->pos[i];
    if (jb_count_iterations(c, l->u.l->n, pos)) return NULL;
    jv *r = jv_list(c, l->u.l->n);
    if (!r) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < l->u.l->n; i++) {
        jv *item = l->u.l->items[i];
        jv *x = by_attr ? attr_path(c, item, attr) : item;
        if (!x) return NULL;
        int t;
        if (test) {
            jv *res = jb_test(c, test->u.s.p, test->u.s.n, x, &ta, pos);
            if (!res) return NULL;
            t = jv_truthy(res);
        } else {
            t = jv_truthy(x);
        }
        if (t == keep) r->u.l->items[k++] = item;
    }
    r->u.l->n = k;
    return r;
}
static jv *f_select(jctx *c, jv *v, jargs *a, uint32_t pos) { return select_items(c, v, a, pos, 0, 1); }
static jv *f_reject(jctx *c, jv *v, jargs *a, uint32_t pos) { return select_items(c, v, a, pos, 0, 0); }
static jv *f_selectattr(jctx *c, jv *v, jargs *a, uint32_t pos) { return select_items(c, v, a, pos, 1, 1); }
static jv *f_rejectattr(jctx *c, jv *v, jargs *a, uint32_t pos) { return select_items(c, v, a, pos, 1, 0); }

static jv *f_map(jctx *c, jv *v, jargs *a, uint32_t pos) {
    jv *l = as_list(c, v, pos);
    if (!l) return NULL;
    jv *attr = jargs_kw(a, "attribute"), *def = jargs_kw(a, "default");
    jv *fname = a->npos > 0 ? a->pos[0] : NULL;
    if (!attr && (!fname || fname->type != JV_STR))
        return fail_null(c, ELLM_ERR_FORMAT, pos, "map needs attribute= or a filter name", fname);
    jargs fa = {0};
    for (int i = 1; i < a->npos; i++) fa.pos[fa.npos++] = a->pos[i];
    if (jb_count_iterations(c, l->u.l->n, pos)) return NULL;
    jv *r = jv_list(c, l->u.l->n);
    if (!r) return NULL;
    for (size_t i = 0; i < l->u.l->n; i++) {
        jv *x;
        if (attr) {
            x = attr_path(c, l->u.l->items[i], attr);
            if (x && x->type == JV_UNDEF && def) x = def;
        } else {
            x = jb_filter(c, fname->u.s.p, fname->u.s.n, l->u.l->items[i], &fa, pos);
        }
        if (!x) return NULL;
        r->u.l->items[i] = x;
    }
    return r;
}

static const struct {
    const char *name;
    filter_fn fn;
} filters[] = {
    {"abs", f_abs},           {"attr", f_attr},         {"capitalize", f_capitalize},
    {"count", f_length},      {"d", f_default},         {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},          {"escape", f_escape},
    {"first", f_first},       {"float", f_float},       {"indent", f_indent},
    {"int", f_int},           {"items", f_items},       {"join", f_join},
    {"last", f_last},         {"length", f_length},     {"list", f_list},
    {"lower", f_lower},       {"map", f_map},           {"max", f_max},
    {"min", f_min},           {"reject", f_reject},     {"rejectattr", f_rejectattr},
    {"replace", f_replace},   {"reverse", f_reverse},   {"round", f_round},
    {"safe", f_safe},         {"select", f_select},     {"selectattr", f_selectattr},
    {"sort", f_sort},         {"string", f_string},     {"sum", f_sum},
    {"title", f_title},       {"tojson", f_tojson},     {"trim", f_trim},
    {"unique", f_unique},     {"upper", f_upper},
};

jv *jb_filter(jctx *c, const char *name, size_t n, jv *v, jargs *a, uint32_t pos) {
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (name_is(name, n, filters[i].name)) return filters[i].fn(c, v, a, pos);
    jfail(c, ELLM_ERR_UNSUPPORTED, pos, "unknown filter '%.*s'", (int)(n > 64 ? 64 : n), name);
    return NULL;
}

/* ---- tests ---- */

static int str_all(const jv *s, int (*pred)(int)) {
    if (s->u.s.n == 0) return 0;
    for (size_t i = 0; i < s->u.s.n; i++)
        if (!pred((unsigned char)s->u.s.p[i])) return 0;
    return 1;
}
static int p_digit(int ch) { return ch >= '0' && ch <= '9'; }
static int p_alpha(int ch) { return (ch | 32) >= 'a' && (ch | 32) <= 'z'; }
static int p_alnum(int ch) { return p_digit(ch) || p_alpha(ch); }
static int p_space(int ch) { return ch == ' ' || (ch >= 9 && ch <= 13); }

/* Python islower/isupper: some cased character, none of the other case. */
static int str_case_is(const jv *s, int upper) {
    int cased = 0;
    for (size_t i = 0; i < s->u.s.n; i++) {
        char ch = s->u.s.p[i];
        if (ch >= 'a' && ch <= 'z') {
            if (upper) return 0;
            cased = 1;
        } else if (ch >= 'A' && ch <= 'Z') {
            if (!upper) return 0;
            cased = 1;
        }
    }
    return cased;
}

jv *jb_test(jctx *c, const char *name, size_t n, jv *v, jargs *a, uint32_t pos) {
    jv *x = arg(a, 0, NULL);
#define T(str) name_is(name, n, str)
    if (T("defined")) return J_BOOL(v->type != JV_UNDEF);
    if (T("undefined")) return J_BOOL(v->type == JV_UNDEF);
    if (T("none")) return J_BOOL(v->type == JV_NONE);
    if (T("boolean")) return J_BOOL(v->type == JV_BOOL);
    if (T("true")) return J_BOOL(v->type == JV_BOOL && v->u.b);
    if (T("false")) return J_BOOL(v->type == JV_BOOL && !v->u.b);
    if (T("integer")) return J_BOOL(v->type == JV_INT);
    if (T("float")) return J_BOOL(v->type == JV_FLOAT);
    if (T("number")) return J_BOOL(is_num(v));
    if (T("string")) return J_BOOL(v->type == JV_STR);
    if (T("mapping")) return J_BOOL(v->type == JV_DICT);
    if (T("iterable")) return J_BOOL(v->type == JV_LIST || v->type == JV_STR || v->type == JV_DICT || v->type == JV_UNDEF);
    if (T("sequence")) return J_BOOL(v->type == JV_LIST || v->type == JV_STR || v->type == JV_DICT);
    if (T("callable")) return J_BOOL(v->type == JV_FUNC || v->type == JV_METHOD || v->type == JV_MACRO);
    if (T("escaped")) return J_FALSE;
    if (T("lower") || T("upper")) {
        jv *s = jv_to_str(c, v);
        return s ? J_BOOL(str_case_is(s, T("upper"))) : NULL;
    }
    if (T("odd") || T("even") || T("divisibleby")) {
        int64_t i, d = 2;
        if (want_int(c, v, &i, "the value tested", pos)) return NULL;
        if (T("divisibleby") && want_int(c, x, &d, "divisibleby's argument", pos)) return NULL;
        if (d == 0) return fail_null(c, ELLM_ERR_FORMAT, pos, "divisibleby 0", x);
        int64_t m = d == -1 ? 0 : i % d;
        if (T("odd")) return J_BOOL(m != 0);
        return J_BOOL(m == 0);
    }
    if (T("eq") || T("equalto") || T("ne") || T("lt") || T("lessthan") || T("le") || T("gt") ||
        T("greaterthan") || T("ge") || T("in") || T("sameas")) {
        if (!x) return fail_null(c, ELLM_ERR_FORMAT, pos, "this test needs an argument", x);
        if (T("sameas"))
            return J_BOOL(v == x || ((v->type == JV_NONE || v->type == JV_BOOL || v->type == JV_UNDEF) &&
                                     jv_equal(c, v, x, 0) == 1 && v->type == x->type));
        int op = T("eq") || T("equalto") ? JOP_EQ : T("ne") ? JOP_NE : T("lt") || T("lessthan") ? JOP_LT
                 : T("le") ? JOP_LE : T("gt") || T("greaterthan") ? JOP_GT : T("ge") ? JOP_GE : JOP_IN;
        return jb_binop(c, op, v, x, pos);
    }
#undef T
    jfail(c, ELLM_ERR_UNSUPPORTED, pos, "unknown test '%.*s'", (int)(n > 64 ? 64 : n), name);
    return NULL;
}

/* ---- global functions ---- */

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_COUNT };
static const char *const globals[G_COUNT] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};

int jb_global(const char *name, size_t n) {
    for (int i = 0; i < G_COUNT; i++)
        if (name_is(name, n, globals[i])) return i;
    return -1;
}

static jv *g_range(jctx *c, jargs *a, uint32_t pos) {
    int64_t v[3] = {0, 0, 1};
    if (a->npos < 1 || a->npos > 3) return fail_null(c, ELLM_ERR_FORMAT, pos, "range takes 1 to 3 integers", NULL);
    for (int i = 0; i < a->npos; i++)
        if (want_int(c, a->pos[i], &v[i], "range argument", pos)) return NULL;
    int64_t start = a->npos == 1 ? 0 : v[0], stop = a->npos == 1 ? v[0] : v[1], step = a->npos == 3 ? v[2] : 1;
    if (step == 0) return fail_null(c, ELLM_ERR_FORMAT, pos, "range step must not be zero", a->pos[2]);
    uint64_t count = 0;
    if (step > 0 && start < stop) count = ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1;
    if (step < 0 && start > stop) count = ((uint64_t)start - (uint64_t)stop - 1) / ((uint64_t)(-(step + 1)) + 1) + 1;
    if (jb_count_iterations(c, count, pos)) return NULL;
    jv *l = jv_list(c, (size_t)count);
    if (!l) return NULL;
    for (uint64_t i = 0; i < count; i++)
        if (!(l->u.l->items[i] = jv_int(c, (int64_t)((uint64_t)start + i * (uint64_t)step)))) return NULL;
    return l;
}

static jv *g_namespace(jctx *c, jargs *a, uint32_t pos, int is_ns) {
    jv *d = jv_dict(c, is_ns);
    if (!d) return NULL;
    if (a->npos > 1) return fail_null(c, ELLM_ERR_FORMAT, pos, "namespace()/dict() take at most one positional argument", a->pos[1]);
    if (a->npos == 1) {
        jv *src = a->pos[0];
        if (src->type == JV_DICT || src->type == JV_NS) {
            for (size_t i = 0; i < src->u.d->n; i++)
                if (jdict_set(c, d, src->u.d->keys[i], src->u.d->vals[i])) return NULL;
        } else if (src->type == JV_LIST) {
            for (size_t i = 0; i < src->u.l->n; i++) {
                jv *pair = src->u.l->items[i];
                if (pair->type != JV_LIST || pair->u.l->n != 2)
                    return fail_null(c, ELLM_ERR_FORMAT, pos, "expected (key, value) pairs", pair);
                if (jdict_set(c, d, pair->u.l->items[0], pair->u.l->items[1])) return NULL;
            }
        } else {
            return fail_null(c, ELLM_ERR_FORMAT, pos, "expected a dict or (key, value) pairs", src);
        }
    }
    for (int i = 0; i < a->nkw; i++)
        if (jdict_set_str(c, d, a->kname[i], a->klen[i], a->kval[i])) return NULL;
    return d;
}

static jv *g_raise(jctx *c, jargs *a, uint32_t pos) {
    jv *msg = a->npos ? jv_to_str(c, a->pos[0]) : jv_str_ref(c, "(no message)", 12);
    if (!msg) return NULL;
    int len = msg->u.s.n > 400 ? 400 : (int)msg->u.s.n;
    jfail(c, ELLM_ERR_ARG, pos, "template error: %.*s", len, msg->u.s.p);
    return NULL;
}

static jv *g_strftime(jctx *c, jargs *a, uint32_t pos) {
    jv *fmt = arg(a, 0, "format");
    if (!fmt || fmt->type != JV_STR) return fail_null(c, ELLM_ERR_FORMAT, pos, "strftime_now needs a format string", fmt);
    if (fmt->u.s.n > 128) return fail_null(c, ELLM_ERR_UNSUPPORTED, pos, "strftime_now format longer than 128 bytes", fmt);
    char f[130], out[512];
    memcpy(f, fmt->u.s.p, fmt->u.s.n);
    f[fmt->u.s.n] = 0;
    time_t t = (time_t)(c->now ? c->now : (int64_t)time(NULL));
    struct tm tm;
    if (!gmtime_r(&t, &tm)) return fail_null(c, ELLM_ERR_FORMAT, pos, "strftime_now: bad time", fmt);
    size_t n = f[0] ? strftime(out, sizeof out, f, &tm) : 0;
    return jv_str_copy(c, out, n);
}

/* ---- methods ---- */

static jv *str_method(jctx *c, jv *self, int id, jargs *a, uint32_t pos) {
    jv *x = arg(a, 0, NULL), *y = arg(a, 1, NULL);
    switch (id) {
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP:
        if (x && x->type != JV_STR && !is_none(x))
            return fail_null(c, ELLM_ERR_FORMAT, pos, "strip characters must be a string", x);
        return strip(c, self, is_none(x) ? NULL : x, id != M_RSTRIP, id != M_LSTRIP);
    case M_SPLIT:
    case M_RSPLIT: {
        jv *sep = arg(a, 0, "sep"), *maxv = arg(a, 1, "maxsplit");
        int64_t maxsplit = -1;
        if (sep && sep->type != JV_STR && !is_none(sep)) return fail_null(c, ELLM_ERR_FORMAT, pos, "split separator must be a string", sep);
        if (sep && sep->type == JV_STR && sep->u.s.n == 0) return fail_null(c, ELLM_ERR_FORMAT, pos, "empty separator", sep);
        if (maxv && want_int(c, maxv, &maxsplit, "maxsplit", pos)) return NULL;
        return id == M_SPLIT ? str_split(c, self, is_none(sep) ? NULL : sep, maxsplit, pos)
                             : str_rsplit(c, self, is_none(sep) ? NULL : sep, maxsplit, pos);
    }
    case M_STARTSWITH:
    case M_ENDSWITH: {
        if (!x) return fail_null(c, ELLM_ERR_FORMAT, pos, "startswith/endswith need an argument", x);
        if (a->npos > 1) return fail_null(c, ELLM_ERR_UNSUPPORTED, pos, "startswith/endswith start/end arguments are not supported", y);
        jv *single[1] = {x};
        jv **cands = single;
        size_t nc = 1;
        if (x->type == JV_LIST) {
            cands = x->u.l->items;
            nc = x->u.l->n;
        }
        for (size_t i = 0; i < nc; i++) {
            jv *p = cands[i];
            if (p->type != JV_STR) return fail_null(c, ELLM_ERR_FORMAT, pos, "startswith/endswith need strings", p);
            size_t m = p->u.s.n, n = self->u.s.n;
            if (m <= n && memcmp(self->u.s.p + (id == M_STARTSWITH ? 0 : n - m), p->u.s.p, m) == 0) return J_TRUE;
        }
        return J_FALSE;
    }
    case M_UPPER: return map_case(c, self, 1);
    case M_LOWER: return map_case(c, self, 0);
    case M_TITLE: return map_case(c, self, 2);
    case M_CAPITALIZE: {
        jv *l = map_case(c, self, 0);
        return l ? map_case(c, l, 3) : NULL;
    }
    case M_REPLACE: {
        jv *cnt = arg(a, 2, "count");
        int64_t n = -1;
        if (!x || !y || x->type != JV_STR || y->type != JV_STR) return fail_null(c, ELLM_ERR_FORMAT, pos, "replace needs two strings", x);
        if (!is_none(cnt) && want_int(c, cnt, &n, "replace count", pos)) return NULL;
        return str_replace(c, self, x, y, n, pos);
    }
    case M_FIND:
    case M_RFIND:
    case M_COUNT: {
        if (!x || x->type != JV_STR) return fail_null(c, ELLM_ERR_FORMAT, pos, "find/count need a string", x);
        if (a->npos > 1) return fail_null(c, ELLM_ERR_UNSUPPORTED, pos, "find/count start/end arguments are not supported", y);
        const char *p = self->u.s.p;
        size_t n = self->u.s.n, m = x->u.s.n;
        if (id == M_COUNT) {
            if (m == 0) return jv_int(c, (int64_t)jutf8_count(p, n) + 1);
            int64_t k = 0;
            for (const char *q = p; (q = find_sub(q, n - (size_t)(q - p), x->u.s.p, m)); q += m) k++;
            return jv_int(c, k);
        }
        const char *hit = NULL;
        for (const char *q = p; (q = find_sub(q, n - (size_t)(q - p), x->u.s.p, m)); q++) {
            hit = q;
            if (id == M_FIND || q == p + n) break;
        }
        return jv_int(c, hit ? cp_index(p, (size_t)(hit - p)) : -1);
    }
    case M_JOIN: {
        if (!x) return fail_null(c, ELLM_ERR_FORMAT, pos, "join needs an iterable", x);
        jargs ja = {0};
        ja.pos[0] = self;
        ja.npos = 1;
        return f_join(c, x, &ja, pos);
    }
    case M_ISDIGIT: return J_BOOL(str_all(self, p_digit));
    case M_ISALPHA: return J_BOOL(str_all(self, p_alpha));
    case M_ISALNUM: return J_BOOL(str_all(self, p_alnum));
    case M_ISSPACE: return J_BOOL(str_all(self, p_space));
    case M_ISLOWER: return J_BOOL(str_case_is(self, 0));
    case M_ISUPPER: return J_BOOL(str_case_is(self, 1));
    }
    return fail_null(c, ELLM_ERR_FORMAT, pos, "bad string method", self);
}

jv *jb_call(jctx *c, const jv *fn, jargs *a, uint32_t pos) {
    if (fn->type == JV_FUNC) {
        switch (fn->u.fn) {
        case G_RANGE: return g_range(c, a, pos);
        case G_NAMESPACE: return g_namespace(c, a, pos, 1);
        case G_DICT: return g_namespace(c, a, pos, 0);
        case G_RAISE: return g_raise(c, a, pos);
        case G_STRFTIME: return g_strftime(c, a, pos);
        }
        return fail_null(c, ELLM_ERR_FORMAT, pos, "bad global function", fn);
    }
    jv *self = fn->u.m->self;
    int id = fn->u.m->id;
    if (id < M_STR_END) return str_method(c, self, id, a, pos);
    if (id == M_CYCLE) {
        if (a->npos == 0) return fail_null(c, ELLM_ERR_FORMAT, pos, "loop.cycle needs arguments", NULL);
        return a->pos[self->u.loop->index0 % (size_t)a->npos];
    }
    switch (id) {
    case M_ITEMS: return f_items(c, self, a, pos);
    case M_KEYS:
    case M_VALUES: {
        jv *l = jv_list(c, self->u.d->n);
        if (l)
            for (size_t i = 0; i < self->u.d->n; i++)
                l->u.l->items[i] = id == M_KEYS ? self->u.d->keys[i] : self->u.d->vals[i];
        return l;
    }
    case M_GET: {
        jv *key = arg(a, 0, "key"), *def = arg(a, 1, "default");
        if (!key) return fail_null(c, ELLM_ERR_FORMAT, pos, "get needs a key", key);
        jv *v = jdict_get(self, key);
        return v ? v : def ? def : J_NONE;
    }
    }
    return fail_null(c, ELLM_ERR_FORMAT, pos, "bad method", fn);
}
