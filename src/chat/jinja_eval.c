/* Jinja evaluator: walks the AST, rendering statements into a buffer and
 * evaluating expressions to values.
 *
 * Scoping follows Jinja: a for loop gets its own scope (assignments in the
 * body do not leak out; namespace() objects are how templates carry state
 * out of loops), a macro body resolves names in the scope it was defined
 * in, and if-blocks share the enclosing scope.
 *
 * Every node evaluated counts against max_steps and every loop iteration
 * against max_iterations; recursion is bounded by the AST depth (parser)
 * and by JINJA_MAX_EVAL_DEPTH / max_call_depth here. */
#include "chat/jinja_internal.h"

#include <string.h>

/* render results besides 0 / -1 */
enum { R_BREAK = 1, R_CONTINUE = 2 };

/* ---- scopes ---- */

jscope *jscope_new(jctx *c, jscope *parent) {
    jscope *s = jalloc(c, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

int jscope_set(jctx *c, jscope *s, const char *name, size_t n, jv *v) {
    for (size_t i = 0; i < s->n; i++) {
        if (s->lens[i] == n && memcmp(s->names[i], name, n) == 0) {
            s->vals[i] = v;
            return 0;
        }
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **names = jalloc(c, cap * sizeof *names);
        size_t *lens = names ? jalloc(c, cap * sizeof *lens) : NULL;
        jv **vals = lens ? jalloc(c, cap * sizeof *vals) : NULL;
        if (!vals) return -1;
        if (s->n) {
            memcpy(names, s->names, s->n * sizeof *names);
            memcpy(lens, s->lens, s->n * sizeof *lens);
            memcpy(vals, s->vals, s->n * sizeof *vals);
        }
        s->names = names;
        s->lens = lens;
        s->vals = vals;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->lens[s->n] = n;
    s->vals[s->n] = v;
    s->n++;
    return 0;
}

jv *jscope_get(const jscope *s, const char *name, size_t n) {
    for (; s; s = s->parent)
        for (size_t i = 0; i < s->n; i++)
            if (s->lens[i] == n && memcmp(s->names[i], name, n) == 0) return s->vals[i];
    return NULL;
}

/* ---- expressions ---- */

static jv *jeval(jctx *c, jscope *s, const jnode *e);
static int render_body(jctx *c, jscope *s, const jnodes *body, jbuf *out);

static int count_step(jctx *c, uint32_t pos) {
    if (++c->steps > c->lim.max_steps)
        return jfail(c, ELLM_ERR_UNSUPPORTED, pos, "the template exceeds %llu evaluation steps",
                     (unsigned long long)c->lim.max_steps);
    return 0;
}

static int eval_args(jctx *c, jscope *s, const jnodes *args, jargs *out) {
    out->npos = out->nkw = 0;
    for (int i = 0; i < args->n; i++) {
        const jnode *x = args->v[i];
        if (x->kind == JE_KWARG) {
            jv *v = jeval(c, s, x->a);
            if (!v) return -1;
            /* counts were bounded by the parser */
            out->kname[out->nkw] = x->s;
            out->klen[out->nkw] = x->n;
            out->kval[out->nkw++] = v;
        } else {
            jv *v = jeval(c, s, x);
            if (!v) return -1;
            out->pos[out->npos++] = v;
        }
    }
    return 0;
}

static jv *call_macro(jctx *c, const jv *fn, jargs *a, uint32_t pos) {
    const jnode *m = fn->u.mac->node;
    const jnodes *params = &m->args;
    if (a->npos > params->n) {
        jfail(c, ELLM_ERR_FORMAT, pos, "macro '%.*s' takes %d arguments, got %d", (int)m->n, m->s,
              params->n, a->npos);
        return NULL;
    }
    for (int k = 0; k < a->nkw; k++) {
        int found = 0;
        for (int i = a->npos; i < params->n && !found; i++)
            found = params->v[i]->n == a->klen[k] && memcmp(params->v[i]->s, a->kname[k], a->klen[k]) == 0;
        if (!found) {
            jfail(c, ELLM_ERR_FORMAT, pos, "macro '%.*s' has no parameter '%.*s' (or it was given twice)",
                  (int)m->n, m->s, (int)a->klen[k], a->kname[k]);
            return NULL;
        }
    }
    if (++c->call_depth > c->lim.max_call_depth) {
        jfail(c, ELLM_ERR_UNSUPPORTED, pos, "macro calls nested deeper than %d (runaway recursion?)",
              c->lim.max_call_depth);
        return NULL;
    }
    jscope *ms = jscope_new(c, fn->u.mac->scope);
    if (!ms) return NULL;
    for (int i = 0; i < params->n; i++) {
        const jnode *p = params->v[i];
        jv *v = NULL;
        if (i < a->npos) v = a->pos[i];
        for (int k = 0; !v && k < a->nkw; k++)
            if (a->klen[k] == p->n && memcmp(a->kname[k], p->s, p->n) == 0) v = a->kval[k];
        if (!v && p->kind == JE_KWARG && !(v = jeval(c, ms, p->a))) return NULL;
        if (!v) v = J_UNDEF;
        if (jscope_set(c, ms, p->s, p->n, v)) return NULL;
    }
    jbuf b = {0};
    int rc = render_body(c, ms, &m->body, &b);
    jv *r = rc < 0 ? NULL : jv_str_copy(c, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    c->call_depth--;
    return r;
}

/* Calls, filters and tests keep their argument arrays (jargs, ~0.5 KiB) in
 * frames of their own, out of line, so that the recursion through jeval for
 * plain operators stays cheap in stack. */
__attribute__((noinline)) static jv *eval_call(jctx *c, jscope *s, const jnode *e) {
    const jnode *callee = e->a;
    jv *obj = NULL, *fn;
    if (callee->kind == JE_ATTR) {
        if (!(obj = jeval(c, s, callee->a))) return NULL;
        fn = jb_getattr(c, obj, callee->s, callee->n);
    } else {
        fn = jeval(c, s, callee);
    }
    if (!fn) return NULL;
    jargs a;
    if (eval_args(c, s, &e->args, &a)) return NULL;
    switch (fn->type) {
    case JV_MACRO: return call_macro(c, fn, &a, e->pos);
    case JV_FUNC:
    case JV_METHOD: return jb_call(c, fn, &a, e->pos);
    case JV_UNDEF:
        if (obj && obj->type != JV_UNDEF && obj->type != JV_NONE) {
            jfail(c, ELLM_ERR_UNSUPPORTED, callee->pos, "unknown method '%.*s' of %s", (int)callee->n,
                  callee->s, jv_type_name(obj));
            return NULL;
        }
        if (callee->kind == JE_NAME) {
            static const char *const known[] = {"lipsum", "cycler", "joiner", "url_for", "gettext", "_"};
            for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
                if (strlen(known[i]) == callee->n && memcmp(known[i], callee->s, callee->n) == 0) {
                    jfail(c, ELLM_ERR_UNSUPPORTED, callee->pos, "the global '%s' is not supported", known[i]);
                    return NULL;
                }
            }
            jfail(c, ELLM_ERR_FORMAT, callee->pos, "'%.*s' is undefined", (int)(callee->n > 64 ? 64 : callee->n),
                  callee->s);
            return NULL;
        }
        jfail(c, ELLM_ERR_FORMAT, e->pos, "calling an undefined value");
        return NULL;
    default:
        jfail(c, ELLM_ERR_FORMAT, e->pos, "'%s' object is not callable", jv_type_name(fn));
        return NULL;
    }
}

__attribute__((noinline)) static jv *eval_filter_or_test(jctx *c, jscope *s, const jnode *e) {
    jv *v = jeval(c, s, e->a);
    jargs a;
    if (!v || eval_args(c, s, &e->args, &a)) return NULL;
    if (e->kind == JE_FILTER) return jb_filter(c, e->s, e->n, v, &a, e->pos);
    jv *r = jb_test(c, e->s, e->n, v, &a, e->pos);
    if (!r) return NULL;
    return e->flag ? J_BOOL(!jv_truthy(r)) : r;
}

/* Python slice indices for a sequence of `len` items (PySlice_AdjustIndices). */
static int slice_bounds(jctx *c, jv *start, jv *stop, jv *step, int64_t len, int64_t *b, int64_t *e,
                        int64_t *st, uint32_t pos) {
    jv *in[3] = {start, stop, step};
    int64_t val[3] = {0, 0, 1};
    for (int i = 0; i < 3; i++) {
        if (in[i]->type == JV_NONE || in[i]->type == JV_UNDEF) {
            in[i] = NULL;
            continue;
        }
        if (in[i]->type != JV_INT && in[i]->type != JV_BOOL)
            return jfail(c, ELLM_ERR_FORMAT, pos, "slice indices must be integers, not %s", jv_type_name(in[i]));
        val[i] = in[i]->type == JV_INT ? in[i]->u.i : in[i]->u.b;
    }
    int64_t s = in[2] ? val[2] : 1;
    if (s == 0) return jfail(c, ELLM_ERR_FORMAT, pos, "slice step cannot be zero");
    if (s < -INT64_MAX) s = -INT64_MAX;
    int64_t lo, hi;
    if (!in[0]) {
        lo = s < 0 ? len - 1 : 0;
    } else {
        lo = val[0];
        if (lo < 0) {
            lo = lo < -len ? (s < 0 ? -1 : 0) : lo + len;
        } else if (lo >= len) {
            lo = s < 0 ? len - 1 : len;
        }
    }
    if (!in[1]) {
        hi = s < 0 ? -1 : len;
    } else {
        hi = val[1];
        if (hi < 0) {
            hi = hi < -len ? (s < 0 ? -1 : 0) : hi + len;
        } else if (hi >= len) {
            hi = s < 0 ? len - 1 : len;
        }
    }
    *b = lo;
    *e = hi;
    *st = s;
    return 0;
}

static int64_t slice_count(int64_t b, int64_t e, int64_t st) {
    if (st > 0) return b < e ? (e - b - 1) / st + 1 : 0;
    return e < b ? (b - e - 1) / (-st) + 1 : 0;
}

static jv *eval_slice(jctx *c, jscope *s, const jnode *e) {
    jv *obj = jeval(c, s, e->a);
    if (!obj) return NULL;
    jv *part[3] = {J_NONE, J_NONE, J_NONE};
    const jnode *pn[3] = {e->b, e->c, e->d};
    for (int i = 0; i < 3; i++)
        if (pn[i] && !(part[i] = jeval(c, s, pn[i]))) return NULL;
    int64_t b, end, st;
    if (obj->type == JV_LIST) {
        if (slice_bounds(c, part[0], part[1], part[2], (int64_t)obj->u.l->n, &b, &end, &st, e->pos))
            return NULL;
        int64_t n = slice_count(b, end, st);
        jv *r = jv_list(c, (size_t)n);
        if (!r) return NULL;
        r->tuple = obj->tuple;
        for (int64_t i = 0; i < n; i++) r->u.l->items[i] = obj->u.l->items[b + i * st];
        return r;
    }
    if (obj->type == JV_STR) {
        /* code-point offsets, so that slicing never splits a character */
        const char *p = obj->u.s.p;
        size_t bytes = obj->u.s.n, cps = jutf8_count(p, bytes), adv;
        size_t *off = jalloc(c, (cps + 1) * sizeof *off);
        if (!off) return NULL;
        for (size_t i = 0, k = 0; i < bytes; i += adv) {
            jutf8_decode(p + i, bytes - i, &adv);
            off[k++] = i;
        }
        off[cps] = bytes;
        if (slice_bounds(c, part[0], part[1], part[2], (int64_t)cps, &b, &end, &st, e->pos)) return NULL;
        int64_t n = slice_count(b, end, st);
        if (st == 1) return jv_str_ref(c, p + off[b], n ? off[b + n] - off[b] : 0);
        char *q = jalloc(c, bytes + 1);
        if (!q) return NULL;
        size_t k = 0;
        for (int64_t i = 0; i < n; i++) {
            size_t at = (size_t)(b + i * st);
            memcpy(q + k, p + off[at], off[at + 1] - off[at]);
            k += off[at + 1] - off[at];
        }
        return jv_str_ref(c, q, k);
    }
    if (obj->type == JV_UNDEF) return J_UNDEF;
    jfail(c, ELLM_ERR_FORMAT, e->pos, "cannot slice %s", jv_type_name(obj));
    return NULL;
}

static jv *eval_inner(jctx *c, jscope *s, const jnode *e) {
    switch (e->kind) {
    case JE_CONST: return e->value;
    case JE_NAME: {
        jv *v = jscope_get(s, e->s, e->n);
        if (v) return v;
        int fn = jb_global(e->s, e->n);
        if (fn < 0) return J_UNDEF;
        v = jalloc(c, sizeof *v);
        if (!v) return NULL;
        v->type = JV_FUNC;
        v->u.fn = fn;
        return v;
    }
    case JE_LIST:
    case JE_TUPLE: {
        jv *l = jv_list(c, (size_t)e->args.n);
        if (!l) return NULL;
        l->tuple = e->kind == JE_TUPLE;
        for (int i = 0; i < e->args.n; i++)
            if (!(l->u.l->items[i] = jeval(c, s, e->args.v[i]))) return NULL;
        return l;
    }
    case JE_DICT: {
        jv *d = jv_dict(c, 0);
        if (!d) return NULL;
        for (int i = 0; i < e->args.n; i++) {
            jv *k = jeval(c, s, e->args.v[i]);
            jv *v = k ? jeval(c, s, e->body.v[i]) : NULL;
            if (!v || jdict_set(c, d, k, v)) return NULL;
        }
        return d;
    }
    case JE_ATTR: {
        jv *obj = jeval(c, s, e->a);
        return obj ? jb_getattr(c, obj, e->s, e->n) : NULL;
    }
    case JE_INDEX: {
        jv *obj = jeval(c, s, e->a);
        jv *key = obj ? jeval(c, s, e->b) : NULL;
        return key ? jb_getitem(c, obj, key, e->pos) : NULL;
    }
    case JE_SLICE: return eval_slice(c, s, e);
    case JE_CALL: return eval_call(c, s, e);
    case JE_FILTER:
    case JE_TEST: return eval_filter_or_test(c, s, e);
    case JE_NOT: {
        jv *v = jeval(c, s, e->a);
        return v ? J_BOOL(!jv_truthy(v)) : NULL;
    }
    case JE_NEG:
    case JE_POS: {
        jv *v = jeval(c, s, e->a);
        if (!v) return NULL;
        if (v->type == JV_FLOAT) return jv_float(c, e->kind == JE_NEG ? -v->u.f : v->u.f);
        if (v->type == JV_INT || v->type == JV_BOOL) {
            int64_t i = v->type == JV_INT ? v->u.i : v->u.b;
            if (e->kind == JE_POS) return jv_int(c, i);
            if (i == INT64_MIN) {
                jfail(c, ELLM_ERR_UNSUPPORTED, e->pos, "integer overflow");
                return NULL;
            }
            return jv_int(c, -i);
        }
        jfail(c, ELLM_ERR_FORMAT, e->pos, "bad operand type for unary %c: %s", e->kind == JE_NEG ? '-' : '+',
              jv_type_name(v));
        return NULL;
    }
    case JE_BINOP: {
        jv *a = jeval(c, s, e->a);
        jv *b = a ? jeval(c, s, e->b) : NULL;
        return b ? jb_binop(c, e->op, a, b, e->pos) : NULL;
    }
    case JE_AND:
    case JE_OR: {
        jv *a = jeval(c, s, e->a);
        if (!a) return NULL;
        if (jv_truthy(a) == (e->kind == JE_OR)) return a;
        return jeval(c, s, e->b);
    }
    case JE_COND: {
        jv *cond = jeval(c, s, e->a);
        if (!cond) return NULL;
        if (jv_truthy(cond)) return jeval(c, s, e->b);
        return e->c ? jeval(c, s, e->c) : J_UNDEF;
    }
    default: jfail(c, ELLM_ERR_FORMAT, e->pos, "not an expression"); return NULL;
    }
}

static jv *jeval(jctx *c, jscope *s, const jnode *e) {
    if (count_step(c, e->pos)) return NULL;
    if (++c->depth > JINJA_MAX_EVAL_DEPTH) {
        c->depth--;
        jfail(c, ELLM_ERR_UNSUPPORTED, e->pos, "evaluation nested deeper than %d levels", JINJA_MAX_EVAL_DEPTH);
        return NULL;
    }
    jv *r = eval_inner(c, s, e);
    c->depth--;
    return r;
}

/* ---- statements ---- */

static int bind_target(jctx *c, jscope *s, const jnode *target, jv *v) {
    if (target->kind == JE_NAME) return jscope_set(c, s, target->s, target->n, v);
    /* JE_TUPLE of names */
    if (v->type != JV_LIST)
        return jfail(c, ELLM_ERR_FORMAT, target->pos, "cannot unpack %s into %d names", jv_type_name(v),
                     target->args.n);
    if (v->u.l->n != (size_t)target->args.n)
        return jfail(c, ELLM_ERR_FORMAT, target->pos, "cannot unpack %zu values into %d names", v->u.l->n,
                     target->args.n);
    for (int i = 0; i < target->args.n; i++)
        if (jscope_set(c, s, target->args.v[i]->s, target->args.v[i]->n, v->u.l->items[i])) return -1;
    return 0;
}

static int render_for(jctx *c, jscope *s, const jnode *n, jbuf *out) {
    jv *seq = jeval(c, s, n->b);
    jv *items = seq ? jb_iterate(c, seq, n->b->pos) : NULL;
    if (!items) return -1;
    jscope *ls = jscope_new(c, s);
    if (!ls) return -1;
    size_t count = items->u.l->n;
    jv **list = items->u.l->items;
    if (n->c) {
        /* `for x in xs if cond`: select first, so loop.length/last see the
         * filtered sequence */
        jv **kept = jalloc(c, (count ? count : 1) * sizeof *kept);
        if (!kept) return -1;
        size_t k = 0;
        for (size_t i = 0; i < count; i++) {
            if (jb_count_iterations(c, 1, n->pos) || bind_target(c, ls, n->a, list[i])) return -1;
            jv *keep = jeval(c, ls, n->c);
            if (!keep) return -1;
            if (jv_truthy(keep)) kept[k++] = list[i];
        }
        list = kept;
        count = k;
    }
    jv *loopv = jalloc(c, sizeof *loopv);
    jloop *lp = loopv ? jalloc(c, sizeof *lp) : NULL;
    if (!lp) return -1;
    loopv->type = JV_LOOP;
    loopv->u.loop = lp;
    lp->length = count;
    lp->items = list;
    if (jscope_set(c, ls, "loop", 4, loopv)) return -1;
    for (size_t i = 0; i < count; i++) {
        if (jb_count_iterations(c, 1, n->pos) || count_step(c, n->pos)) return -1;
        lp->index0 = i;
        if (bind_target(c, ls, n->a, list[i])) return -1;
        int rc = render_body(c, ls, &n->body, out);
        if (rc < 0) return -1;
        if (rc == R_BREAK) break;
    }
    if (count == 0) {
        int rc = render_body(c, ls, &n->body2, out);
        if (rc < 0) return -1;
    }
    return 0;
}

static int render_set(jctx *c, jscope *s, const jnode *n) {
    jv *v = jeval(c, s, n->b);
    if (!v) return -1;
    const jnode *t = n->a;
    if (t->kind == JE_ATTR) {
        jv *obj = jscope_get(s, t->a->s, t->a->n);
        if (!obj || obj->type != JV_NS)
            return jfail(c, ELLM_ERR_FORMAT, t->pos, "cannot set attribute '%.*s' on %s (only on namespace())",
                         (int)t->n, t->s, obj ? jv_type_name(obj) : "an undefined name");
        return jdict_set_str(c, obj, t->s, t->n, v);
    }
    return bind_target(c, s, t, v);
}

/* Renders `body` into a fresh buffer and returns it as a string value. */
static jv *capture(jctx *c, jscope *s, const jnodes *body) {
    jbuf b = {0};
    int rc = render_body(c, s, body, &b);
    jv *r = rc < 0 ? NULL : jv_str_copy(c, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return r;
}

__attribute__((noinline)) static int render_filter_block(jctx *c, jscope *s, const jnode *n, jbuf *out) {
    jv *v = capture(c, s, &n->body);
    jargs a;
    if (!v || eval_args(c, s, &n->args, &a)) return -1;
    jv *r = jb_filter(c, n->s, n->n, v, &a, n->pos);
    return r ? jv_write_str(c, out, r) : -1;
}

static int render_node(jctx *c, jscope *s, const jnode *n, jbuf *out) {
    switch (n->kind) {
    case JN_TEXT: return jbuf_put(c, out, n->s, n->n);
    case JN_OUTPUT: {
        jv *v = jeval(c, s, n->a);
        return v ? jv_write_str(c, out, v) : -1;
    }
    case JN_IF:
        for (;;) {
            jv *cond = jeval(c, s, n->a);
            if (!cond) return -1;
            if (jv_truthy(cond)) return render_body(c, s, &n->body, out);
            if (n->body2.n == 1 && n->body2.v[0]->kind == JN_IF && n->body2.v[0]->flag) {
                n = n->body2.v[0]; /* elif */
                if (count_step(c, n->pos)) return -1;
                continue;
            }
            return render_body(c, s, &n->body2, out);
        }
    case JN_FOR: return render_for(c, s, n, out);
    case JN_SET: return render_set(c, s, n);
    case JN_SET_BLOCK: {
        jv *v = capture(c, s, &n->body);
        return v ? jscope_set(c, s, n->a->s, n->a->n, v) : -1;
    }
    case JN_MACRO: {
        jv *v = jalloc(c, sizeof *v);
        jmacro *m = v ? jalloc(c, sizeof *m) : NULL;
        if (!m) return -1;
        m->node = n;
        m->scope = s;
        v->type = JV_MACRO;
        v->u.mac = m;
        return jscope_set(c, s, n->s, n->n, v);
    }
    case JN_BREAK: return R_BREAK;
    case JN_CONTINUE: return R_CONTINUE;
    case JN_FILTER_BLOCK: return render_filter_block(c, s, n, out);
    case JN_BLOCK: return render_body(c, s, &n->body, out);
    default: return jfail(c, ELLM_ERR_FORMAT, n->pos, "not a statement");
    }
}

static int render_body(jctx *c, jscope *s, const jnodes *body, jbuf *out) {
    if (++c->depth > JINJA_MAX_EVAL_DEPTH) {
        c->depth--;
        return jfail(c, ELLM_ERR_UNSUPPORTED, body->n ? body->v[0]->pos : JPOS_NONE,
                     "evaluation nested deeper than %d levels", JINJA_MAX_EVAL_DEPTH);
    }
    int rc = 0;
    for (int i = 0; i < body->n && rc == 0; i++) {
        if (count_step(c, body->v[i]->pos)) {
            rc = -1;
            break;
        }
        rc = render_node(c, s, body->v[i], out);
    }
    c->depth--;
    return rc;
}

int jinja_render(jctx *c, jscope *root, const jnodes *body, jbuf *out) {
    c->depth = 0;
    c->call_depth = 0;
    return render_body(c, root, body, out) < 0 ? -1 : 0;
}
