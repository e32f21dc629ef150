/* Jinja interpreter support: errors with source positions, the arena, output
 * buffers, and values with Python's semantics for truth, equality, ordering,
 * str(), repr() and json.dumps(). */
#include "chat/jinja_internal.h"

#include "core/status.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---- */

void jpos_linecol(const jctx *c, uint32_t pos, int *line, int *col) {
    int l = 1;
    size_t last_nl = 0; /* offset just past the last newline before pos */
    size_t end = pos < c->src_len ? pos : c->src_len;
    for (size_t i = 0; i < end; i++) {
        if (c->src[i] == '\n') {
            l++;
            last_nl = i + 1;
        }
    }
    *line = l;
    *col = (int)(end - last_nl) + 1;
}

int jfail(jctx *c, ellm_status status, uint32_t pos, const char *fmt, ...) {
    if (c->status != ELLM_OK) return -1; /* keep the first, most precise error */
    c->status = status;
    if (c->err) {
        char msg[sizeof c->err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (pos == JPOS_NONE) {
            ellm_fail(c->err, status, "chat template: %s", msg);
        } else {
            int line, col;
            jpos_linecol(c, pos, &line, &col);
            ellm_fail(c->err, status, "chat template %d:%d: %s", line, col, msg);
        }
    }
    return -1;
}

/* ---- arena ---- */

struct jarena_chunk {
    jarena_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

#define JARENA_CHUNK (64u << 10)

void *jalloc(jctx *c, size_t n) {
    jarena *a = &c->arena;
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    jarena_chunk *h = a->head;
    if (h && h->cap - h->used >= n) {
        void *p = h->data + h->used;
        h->used += n;
        return p; /* chunks are calloc'ed and never reused: already zero */
    }
    size_t cap = n > JARENA_CHUNK ? n : JARENA_CHUNK;
    if (cap > a->limit || a->total > a->limit - cap) {
        jfail(c, ELLM_ERR_UNSUPPORTED, JPOS_NONE,
              "the template needs more than %zu MiB of working memory", a->limit >> 20);
        return NULL;
    }
    jarena_chunk *k = calloc(1, sizeof *k + cap);
    if (!k) {
        jfail(c, ELLM_ERR_NOMEM, JPOS_NONE, "out of memory (%zu bytes)", cap);
        return NULL;
    }
    k->cap = cap;
    k->used = n;
    a->total += cap;
    if (h && cap > JARENA_CHUNK) {
        /* A one-off large block goes behind the current chunk, which still
         * has room for small allocations. */
        k->next = h->next;
        h->next = k;
    } else {
        k->next = h;
        a->head = k;
    }
    return k->data;
}

void jarena_free(jarena *a) {
    jarena_chunk *k = a->head;
    while (k) {
        jarena_chunk *next = k->next;
        free(k);
        k = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- buffers ---- */

int jbuf_put(jctx *c, jbuf *b, const char *p, size_t n) {
    if (n == 0) return 0;
    if (n > c->lim.max_output || b->n > c->lim.max_output - n)
        return jfail(c, ELLM_ERR_UNSUPPORTED, JPOS_NONE, "the output exceeds %zu bytes",
                     c->lim.max_output);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return jfail(c, ELLM_ERR_NOMEM, JPOS_NONE, "out of memory (%zu bytes)", cap);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int jbuf_putc(jctx *c, jbuf *b, char ch) { return jbuf_put(c, b, &ch, 1); }

int jbuf_printf(jctx *c, jbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return jfail(c, ELLM_ERR_FORMAT, JPOS_NONE, "formatting failed");
    if ((size_t)n >= sizeof tmp) n = (int)sizeof tmp - 1; /* callers print short things */
    return jbuf_put(c, b, tmp, (size_t)n);
}

void jbuf_free(jbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- UTF-8 ---- */

uint32_t jutf8_decode(const char *p, size_t n, size_t *adv) {
    const unsigned char *s = (const unsigned char *)p;
    uint32_t c0 = s[0];
    *adv = 1;
    if (c0 < 0x80) return c0;
    int len = c0 >= 0xF0 && c0 < 0xF5 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC2 && c0 < 0xE0 ? 2 : 0;
    if (len == 0 || (size_t)len > n) return c0;
    uint32_t cp = c0 & (0xFF >> (len + 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return c0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return c0;
    *adv = (size_t)len;
    return cp;
}

size_t jutf8_count(const char *p, size_t n) {
    size_t count = 0, i = 0, adv;
    while (i < n) {
        jutf8_decode(p + i, n - i, &adv);
        i += adv;
        count++;
    }
    return count;
}

int jis_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- constructors ---- */

jv jv_undef_v = {.type = JV_UNDEF};
jv jv_none_v = {.type = JV_NONE};
jv jv_true_v = {.type = JV_BOOL, .u.b = 1};
jv jv_false_v = {.type = JV_BOOL, .u.b = 0};

jv *jv_int(jctx *c, int64_t i) {
    jv **slot = NULL;
    if (i >= -128 && i < 1024) {
        slot = &c->small_ints[i + 128];
        if (*slot) return *slot;
    }
    jv *v = jalloc(c, sizeof *v);
    if (!v) return NULL;
    v->type = JV_INT;
    v->u.i = i;
    if (slot) *slot = v;
    return v;
}

jv *jv_float(jctx *c, double f) {
    jv *v = jalloc(c, sizeof *v);
    if (!v) return NULL;
    v->type = JV_FLOAT;
    v->u.f = f;
    return v;
}

jv *jv_str_ref(jctx *c, const char *p, size_t n) {
    jv *v = jalloc(c, sizeof *v);
    if (!v) return NULL;
    v->type = JV_STR;
    v->u.s.p = n ? p : "";
    v->u.s.n = n;
    return v;
}

jv *jv_str_copy(jctx *c, const char *p, size_t n) {
    if (n >= c->lim.max_output) {
        jfail(c, ELLM_ERR_UNSUPPORTED, JPOS_NONE, "a string exceeds %zu bytes", c->lim.max_output);
        return NULL;
    }
    char *q = jalloc(c, n + 1);
    if (!q) return NULL;
    if (n) memcpy(q, p, n);
    return jv_str_ref(c, q, n);
}

jv *jv_list(jctx *c, size_t n) {
    if (n > ((size_t)1 << 40) / sizeof(jv *)) {
        jfail(c, ELLM_ERR_UNSUPPORTED, JPOS_NONE, "a list of %zu items is too large", n);
        return NULL;
    }
    jv *v = jalloc(c, sizeof *v);
    jlist *l = v ? jalloc(c, sizeof *l) : NULL;
    jv **items = l && n ? jalloc(c, n * sizeof *items) : NULL;
    if (!l || (n && !items)) return NULL;
    for (size_t i = 0; i < n; i++) items[i] = J_UNDEF;
    l->items = items;
    l->n = n;
    v->type = JV_LIST;
    v->u.l = l;
    return v;
}

jv *jv_dict(jctx *c, int is_namespace) {
    jv *v = jalloc(c, sizeof *v);
    jdict *d = v ? jalloc(c, sizeof *d) : NULL;
    if (!d) return NULL;
    v->type = is_namespace ? JV_NS : JV_DICT;
    v->u.d = d;
    return v;
}

static int key_is_str(const jv *k, const char *p, size_t n) {
    return k->type == JV_STR && k->u.s.n == n && (n == 0 || memcmp(k->u.s.p, p, n) == 0);
}

jv *jdict_get_str(const jv *d, const char *key, size_t n) {
    const jdict *m = d->u.d;
    for (size_t i = 0; i < m->n; i++)
        if (key_is_str(m->keys[i], key, n)) return m->vals[i];
    return NULL;
}

jv *jdict_get(const jv *d, const jv *key) {
    const jdict *m = d->u.d;
    if (key->type == JV_STR) return jdict_get_str(d, key->u.s.p, key->u.s.n);
    for (size_t i = 0; i < m->n; i++) {
        /* Non-string keys are scalars: no deep recursion, no error. */
        if (jv_equal(NULL, m->keys[i], key, JINJA_MAX_VALUE_DEPTH - 1) == 1) return m->vals[i];
    }
    return NULL;
}

int jdict_set(jctx *c, jv *d, jv *key, jv *val) {
    jdict *m = d->u.d;
    for (size_t i = 0; i < m->n; i++) {
        int eq = key->type == JV_STR ? key_is_str(m->keys[i], key->u.s.p, key->u.s.n)
                                     : jv_equal(c, m->keys[i], key, 0);
        if (eq < 0) return -1;
        if (eq) {
            m->vals[i] = val;
            return 0;
        }
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 4;
        jv **keys = jalloc(c, cap * sizeof *keys);
        jv **vals = keys ? jalloc(c, cap * sizeof *vals) : NULL;
        if (!vals) return -1;
        if (m->n) {
            memcpy(keys, m->keys, m->n * sizeof *keys);
            memcpy(vals, m->vals, m->n * sizeof *vals);
        }
        m->keys = keys;
        m->vals = vals;
        m->cap = cap;
    }
    m->keys[m->n] = key;
    m->vals[m->n] = val;
    m->n++;
    return 0;
}

int jdict_set_str(jctx *c, jv *d, const char *key, size_t n, jv *val) {
    jv *k = jv_str_ref(c, key, n);
    return k ? jdict_set(c, d, k, val) : -1;
}

/* ---- truth, types, equality, order ---- */

int jv_truthy(const jv *v) {
    switch (v->type) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s.n > 0;
    case JV_LIST: return v->u.l->n > 0;
    case JV_DICT: return v->u.d->n > 0;
    default: return 1;
    }
}

const char *jv_type_name(const jv *v) {
    switch (v->type) {
    case JV_UNDEF: return "undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_FUNC: return "builtin_function";
    case JV_METHOD: return "method";
    case JV_MACRO: return "Macro";
    }
    return "?";
}

static int is_num(const jv *v) { return v->type == JV_BOOL || v->type == JV_INT || v->type == JV_FLOAT; }
static double num_f(const jv *v) {
    return v->type == JV_FLOAT ? v->u.f : v->type == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const jv *v) { return v->type == JV_INT ? v->u.i : (int64_t)v->u.b; }

int jv_equal(jctx *c, const jv *a, const jv *b, int depth) {
    if (depth > JINJA_MAX_VALUE_DEPTH) {
        if (c) jfail(c, ELLM_ERR_UNSUPPORTED, JPOS_NONE, "values nested too deeply to compare");
        return -1;
    }
    if (a == b) return 1;
    if (is_num(a) && is_num(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a->type != b->type) return 0;
    switch (a->type) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR:
        return a->u.s.n == b->u.s.n && (a->u.s.n == 0 || memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0);
    case JV_LIST:
        if (a->tuple != b->tuple || a->u.l->n != b->u.l->n) return 0;
        for (size_t i = 0; i < a->u.l->n; i++) {
            int e = jv_equal(c, a->u.l->items[i], b->u.l->items[i], depth + 1);
            if (e != 1) return e;
        }
        return 1;
    case JV_DICT:
    case JV_NS:
        if (a->u.d->n != b->u.d->n) return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            const jv *bv = jdict_get(b, a->u.d->keys[i]);
            if (!bv) return 0;
            int e = jv_equal(c, a->u.d->vals[i], bv, depth + 1);
            if (e != 1) return e;
        }
        return 1;
    case JV_FUNC: return a->u.fn == b->u.fn;
    case JV_METHOD: return a->u.m->self == b->u.m->self && a->u.m->id == b->u.m->id;
    case JV_MACRO: return a->u.mac->node == b->u.mac->node;
    default: return 0;
    }
}

static int fold(int ch) { return ch >= 'A' && ch <= 'Z' ? ch + 32 : ch; }

static int compare_at(jctx *c, const jv *a, const jv *b, int fold_case, int *res, uint32_t pos,
                      int depth) {
    if (depth > JINJA_MAX_VALUE_DEPTH)
        return jfail(c, ELLM_ERR_UNSUPPORTED, pos, "values nested too deeply to compare");
    if (is_num(a) && is_num(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) {
            int64_t x = num_i(a), y = num_i(b);
            *res = (x > y) - (x < y);
        } else {
            double x = num_f(a), y = num_f(b);
            *res = (x > y) - (x < y);
        }
        return 0;
    }
    if (a->type == JV_STR && b->type == JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        const unsigned char *p = (const unsigned char *)a->u.s.p, *q = (const unsigned char *)b->u.s.p;
        for (size_t i = 0; i < n; i++) {
            int x = fold_case ? fold(p[i]) : p[i], y = fold_case ? fold(q[i]) : q[i];
            if (x != y) {
                *res = x < y ? -1 : 1;
                return 0;
            }
        }
        *res = (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
        return 0;
    }
    if (a->type == JV_LIST && b->type == JV_LIST && a->tuple == b->tuple) {
        size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (compare_at(c, a->u.l->items[i], b->u.l->items[i], fold_case, res, pos, depth + 1))
                return -1;
            if (*res) return 0;
        }
        *res = (a->u.l->n > b->u.l->n) - (a->u.l->n < b->u.l->n);
        return 0;
    }
    return jfail(c, ELLM_ERR_FORMAT, pos, "cannot compare %s with %s", jv_type_name(a),
                 jv_type_name(b));
}

int jv_compare(jctx *c, const jv *a, const jv *b, int fold_case, int *res, uint32_t pos) {
    return compare_at(c, a, b, fold_case, res, pos, 0);
}

/* ---- float repr ---- */

void jfloat_repr(double f, char *out, size_t cap) {
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0.0) {
        snprintf(out, cap, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    /* Shortest digits that read back as f (as Python's repr picks them).
     * Assumes the C locale's decimal point: the library never calls setlocale. */
    char tmp[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < 20) digits[nd++] = *p;
    int exp = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;

    char buf[64];
    int k = 0;
    if (neg) buf[k++] = '-';
    if (exp >= 16 || exp < -4) {
        buf[k++] = digits[0];
        if (nd > 1) {
            buf[k++] = '.';
            for (int i = 1; i < nd; i++) buf[k++] = digits[i];
        }
        snprintf(buf + k, sizeof buf - (size_t)k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp >= 0) {
        for (int i = 0; i <= exp; i++) buf[k++] = i < nd ? digits[i] : '0';
        buf[k++] = '.';
        if (nd > exp + 1)
            for (int i = exp + 1; i < nd; i++) buf[k++] = digits[i];
        else
            buf[k++] = '0';
        buf[k] = 0;
    } else {
        buf[k++] = '0';
        buf[k++] = '.';
        for (int i = 0; i < -exp - 1; i++) buf[k++] = '0';
        for (int i = 0; i < nd; i++) buf[k++] = digits[i];
        buf[k] = 0;
    }
    snprintf(out, cap, "%s", buf);
}

/* ---- str() / repr() ---- */

static int write_str_repr(jctx *c, jbuf *b, const char *p, size_t n) {
    int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (jbuf_putc(c, b, q)) return -1;
    size_t run = 0; /* bytes copied through unchanged, flushed in one put */
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        const char *esc = NULL;
        char hex[5];
        if (ch == (unsigned char)q) esc = q == '"' ? "\\\"" : "\\'";
        else if (ch == '\\') esc = "\\\\";
        else if (ch == '\n') esc = "\\n";
        else if (ch == '\r') esc = "\\r";
        else if (ch == '\t') esc = "\\t";
        else if (ch < 0x20 || ch == 0x7F) {
            snprintf(hex, sizeof hex, "\\x%02x", ch);
            esc = hex;
        }
        if (!esc) {
            run++;
            continue;
        }
        if (jbuf_put(c, b, p + i - run, run) || jbuf_put(c, b, esc, strlen(esc))) return -1;
        run = 0;
    }
    if (jbuf_put(c, b, p + n - run, run)) return -1;
    return jbuf_putc(c, b, q);
}

static int write_scalar(jctx *c, jbuf *b, const jv *v) {
    char tmp[48];
    switch (v->type) {
    case JV_UNDEF: return 0;
    case JV_NONE: return jbuf_put(c, b, "None", 4);
    case JV_BOOL: return v->u.b ? jbuf_put(c, b, "True", 4) : jbuf_put(c, b, "False", 5);
    case JV_INT: return jbuf_printf(c, b, "%lld", (long long)v->u.i);
    case JV_FLOAT:
        jfloat_repr(v->u.f, tmp, sizeof tmp);
        return jbuf_put(c, b, tmp, strlen(tmp));
    case JV_LOOP:
        return jbuf_printf(c, b, "<LoopContext %zu/%zu>", v->u.loop->index0 + 1, v->u.loop->length);
    case JV_FUNC: return jbuf_put(c, b, "<built-in function>", 19);
    case JV_METHOD: return jbuf_put(c, b, "<built-in method>", 17);
    case JV_MACRO:
        return jbuf_printf(c, b, "<Macro '%.*s'>", (int)(v->u.mac->node->n > 64 ? 64 : v->u.mac->node->n),
                           v->u.mac->node->s);
    default: return jfail(c, ELLM_ERR_FORMAT, JPOS_NONE, "cannot print %s", jv_type_name(v));
    }
}

int jv_write_repr(jctx *c, jbuf *b, const jv *v, int depth) {
    if (depth > JINJA_MAX_VALUE_DEPTH)
        return jfail(c, ELLM_ERR_UNSUPPORTED, JPOS_NONE, "values nested too deeply to print");
    switch (v->type) {
    case JV_UNDEF: return jbuf_put(c, b, "Undefined", 9);
    case JV_STR: return write_str_repr(c, b, v->u.s.p, v->u.s.n);
    case JV_LIST: {
        if (jbuf_putc(c, b, v->tuple ? '(' : '[')) return -1;
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i && jbuf_put(c, b, ", ", 2)) return -1;
            if (jv_write_repr(c, b, v->u.l->items[i], depth + 1)) return -1;
        }
        if (v->tuple && v->u.l->n == 1 && jbuf_putc(c, b, ',')) return -1;
        return jbuf_putc(c, b, v->tuple ? ')' : ']');
    }
    case JV_DICT:
    case JV_NS: {
        if (v->type == JV_NS && jbuf_put(c, b, "<Namespace ", 11)) return -1;
        if (jbuf_putc(c, b, '{')) return -1;
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i && jbuf_put(c, b, ", ", 2)) return -1;
            if (jv_write_repr(c, b, v->u.d->keys[i], depth + 1) || jbuf_put(c, b, ": ", 2) ||
                jv_write_repr(c, b, v->u.d->vals[i], depth + 1))
                return -1;
        }
        if (jbuf_putc(c, b, '}')) return -1;
        return v->type == JV_NS ? jbuf_putc(c, b, '>') : 0;
    }
    default: return write_scalar(c, b, v);
    }
}

int jv_write_str(jctx *c, jbuf *b, const jv *v) {
    if (v->type == JV_STR) return jbuf_put(c, b, v->u.s.p, v->u.s.n);
    if (v->type == JV_UNDEF) return 0;
    return jv_write_repr(c, b, v, 0);
}

jv *jv_to_str(jctx *c, const jv *v) {
    if (v->type == JV_STR) return (jv *)v;
    if (v->type == JV_UNDEF) return jv_str_ref(c, "", 0);
    jbuf b = {0};
    jv *r = NULL;
    if (jv_write_str(c, &b, v) == 0) r = jv_str_copy(c, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return r;
}

/* ---- JSON ---- */

static int json_string(jctx *c, jbuf *b, const char *p, size_t n, int ensure_ascii) {
    if (jbuf_putc(c, b, '"')) return -1;
    size_t i = 0, run = 0;
    while (i < n) {
        size_t adv;
        unsigned char ch = (unsigned char)p[i];
        uint32_t cp = ch < 0x80 ? ch : jutf8_decode(p + i, n - i, &adv);
        if (ch < 0x80) adv = 1;
        char esc[16];
        const char *e = NULL;
        if (cp == '"') e = "\\\"";
        else if (cp == '\\') e = "\\\\";
        else if (cp == '\n') e = "\\n";
        else if (cp == '\r') e = "\\r";
        else if (cp == '\t') e = "\\t";
        else if (cp == '\b') e = "\\b";
        else if (cp == '\f') e = "\\f";
        else if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            e = esc;
        }
        if (e) {
            if (jbuf_put(c, b, p + i - run, run) || jbuf_put(c, b, e, strlen(e))) return -1;
            run = 0;
        } else {
            run += adv;
        }
        i += adv;
    }
    if (jbuf_put(c, b, p + n - run, run)) return -1;
    return jbuf_putc(c, b, '"');
}

static int json_newline(jctx *c, jbuf *b, const jjson_opts *o, int level) {
    if (jbuf_putc(c, b, '\n')) return -1;
    for (int i = 0; i < level * o->indent; i++)
        if (jbuf_putc(c, b, ' ')) return -1;
    return 0;
}

int jv_sort_indices(jctx *c, jv *const *keys, size_t *idx, size_t n, int fold_case, int reverse,
                    uint32_t pos) {
    size_t *tmp = jalloc(c, (n ? n : 1) * sizeof *tmp);
    if (!tmp) return -1;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int r;
                if (jv_compare(c, keys[idx[j]], keys[idx[i]], fold_case, &r, pos)) return -1;
                if (reverse) r = -r;
                tmp[k++] = r < 0 ? idx[j++] : idx[i++];
            }
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
    return 0;
}

int jv_write_json(jctx *c, jbuf *b, const jv *v, const jjson_opts *o, int depth, uint32_t pos) {
    if (depth > JINJA_MAX_VALUE_DEPTH)
        return jfail(c, ELLM_ERR_UNSUPPORTED, pos, "values nested too deeply for tojson");
    const char *item_sep = o->item_sep ? o->item_sep : o->indent >= 0 ? "," : ", ";
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    char tmp[48];
    switch (v->type) {
    case JV_UNDEF:
    case JV_NONE: return jbuf_put(c, b, "null", 4);
    case JV_BOOL: return v->u.b ? jbuf_put(c, b, "true", 4) : jbuf_put(c, b, "false", 5);
    case JV_INT: return jbuf_printf(c, b, "%lld", (long long)v->u.i);
    case JV_FLOAT:
        if (isnan(v->u.f)) return jbuf_put(c, b, "NaN", 3);
        if (isinf(v->u.f)) return v->u.f < 0 ? jbuf_put(c, b, "-Infinity", 9) : jbuf_put(c, b, "Infinity", 8);
        jfloat_repr(v->u.f, tmp, sizeof tmp);
        return jbuf_put(c, b, tmp, strlen(tmp));
    case JV_STR: return json_string(c, b, v->u.s.p, v->u.s.n, o->ensure_ascii);
    case JV_LIST: {
        if (v->u.l->n == 0) return jbuf_put(c, b, "[]", 2);
        if (jbuf_putc(c, b, '[')) return -1;
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i && jbuf_put(c, b, item_sep, strlen(item_sep))) return -1;
            if (o->indent >= 0 && json_newline(c, b, o, depth + 1)) return -1;
            if (jv_write_json(c, b, v->u.l->items[i], o, depth + 1, pos)) return -1;
        }
        if (o->indent >= 0 && json_newline(c, b, o, depth)) return -1;
        return jbuf_putc(c, b, ']');
    }
    case JV_DICT:
    case JV_NS: {
        const jdict *d = v->u.d;
        if (d->n == 0) return jbuf_put(c, b, "{}", 2);
        size_t *idx = jalloc(c, d->n * sizeof *idx);
        if (!idx) return -1;
        for (size_t i = 0; i < d->n; i++) idx[i] = i;
        if (o->sort_keys && jv_sort_indices(c, d->keys, idx, d->n, 0, 0, pos)) return -1;
        if (jbuf_putc(c, b, '{')) return -1;
        for (size_t i = 0; i < d->n; i++) {
            const jv *k = d->keys[idx[i]];
            if (i && jbuf_put(c, b, item_sep, strlen(item_sep))) return -1;
            if (o->indent >= 0 && json_newline(c, b, o, depth + 1)) return -1;
            if (k->type == JV_STR) {
                if (json_string(c, b, k->u.s.p, k->u.s.n, o->ensure_ascii)) return -1;
            } else if (k->type == JV_INT || k->type == JV_FLOAT || k->type == JV_BOOL ||
                       k->type == JV_NONE) {
                /* json.dumps turns scalar keys into strings */
                if (jbuf_putc(c, b, '"') || jv_write_json(c, b, k, o, depth + 1, pos) ||
                    jbuf_putc(c, b, '"'))
                    return -1;
            } else {
                return jfail(c, ELLM_ERR_FORMAT, pos, "tojson: keys must be str, not %s",
                             jv_type_name(k));
            }
            if (jbuf_put(c, b, key_sep, strlen(key_sep))) return -1;
            if (jv_write_json(c, b, d->vals[idx[i]], o, depth + 1, pos)) return -1;
        }
        if (o->indent >= 0 && json_newline(c, b, o, depth)) return -1;
        return jbuf_putc(c, b, '}');
    }
    default:
        return jfail(c, ELLM_ERR_FORMAT, pos, "tojson: object of type %s is not JSON serializable",
                     jv_type_name(v));
    }
}
