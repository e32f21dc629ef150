/* Jinja parser: recursive descent over the lexer's tokens, with Jinja's
 * operator precedence (lowest first):
 *   x if c else y  <  or  <  and  <  not  <  comparisons, in, not in
 *   <  + -  <  ~  <  * / // %  <  **  <  unary - +  <  postfix (. [] ()),
 * filters and tests binding to the operand before them (`a + b | trim`
 * trims b).
 *
 * Depth is bounded twice: the parser's own recursion (max_nesting levels)
 * and the depth of the tree it builds (2 * max_nesting), which bounds the
 * evaluator's recursion too (left-deep chains like a+b+c+... are built by
 * loops, so only the tree depth catches them). */
#include "chat/jinja_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    jnode **v;
    int n, cap;
} nodevec;

static int vec_push(jctx *c, nodevec *vec, jnode *x) {
    if (vec->n == vec->cap) {
        int cap = vec->cap ? vec->cap * 2 : 8;
        jnode **v = jalloc(c, (size_t)cap * sizeof *v);
        if (!v) return -1;
        if (vec->n) memcpy(v, vec->v, (size_t)vec->n * sizeof *v);
        vec->v = v;
        vec->cap = cap;
    }
    vec->v[vec->n++] = x;
    return 0;
}

static jnodes vec_done(nodevec *vec) {
    jnodes r = {vec->v, vec->n};
    return r;
}

/* ---- tokens ---- */

static jtok *peek(jctx *c) { return &c->toks[c->tok_i]; }
static jtok *peek2(jctx *c) {
    return c->tok_i + 1 < c->n_toks ? &c->toks[c->tok_i + 1] : &c->toks[c->n_toks - 1];
}
static jtok *advance(jctx *c) {
    jtok *t = &c->toks[c->tok_i];
    if (t->type != JT_EOF) c->tok_i++;
    return t;
}
static int is_op(const jtok *t, int op) { return t->type == JT_OP && t->op == op; }
static int is_name(const jtok *t, const char *name) {
    size_t n = strlen(name);
    return t->type == JT_NAME && t->n == n && memcmp(t->s, name, n) == 0;
}

/* A short description of a token for "unexpected ..." messages. */
static const char *describe(const jtok *t, char *buf, size_t cap) {
    static const char *const op_text[] = {
        [JOP_ADD] = "+", [JOP_SUB] = "-", [JOP_MUL] = "*", [JOP_DIV] = "/", [JOP_FLOORDIV] = "//",
        [JOP_MOD] = "%", [JOP_POW] = "**", [JOP_TILDE] = "~", [JOP_EQ] = "==", [JOP_NE] = "!=",
        [JOP_LT] = "<", [JOP_LE] = "<=", [JOP_GT] = ">", [JOP_GE] = ">=", [JOP_ASSIGN] = "=",
        [JOP_LPAREN] = "(", [JOP_RPAREN] = ")", [JOP_LBRACKET] = "[", [JOP_RBRACKET] = "]",
        [JOP_LBRACE] = "{", [JOP_RBRACE] = "}", [JOP_COMMA] = ",", [JOP_DOT] = ".",
        [JOP_COLON] = ":", [JOP_PIPE] = "|",
    };
    switch (t->type) {
    case JT_TEXT: return "template text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_NAME: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    case JT_STRING: return "a string";
    case JT_INT:
    case JT_FLOAT: return "a number";
    case JT_OP:
        snprintf(buf, cap, "'%s'", t->op < sizeof op_text / sizeof op_text[0] && op_text[t->op] ? op_text[t->op] : "?");
        return buf;
    default: return "the end of the template";
    }
}

static void *unexpected(jctx *c, const jtok *t, const char *expected) {
    char buf[64];
    if (expected)
        jfail(c, ELLM_ERR_FORMAT, t->pos, "unexpected %s, expected %s", describe(t, buf, sizeof buf), expected);
    else
        jfail(c, ELLM_ERR_FORMAT, t->pos, "unexpected %s", describe(t, buf, sizeof buf));
    return NULL;
}

static int expect_op(jctx *c, int op, const char *text) {
    if (is_op(peek(c), op)) {
        advance(c);
        return 0;
    }
    unexpected(c, peek(c), text);
    return -1;
}

static int expect_block_end(jctx *c) {
    if (peek(c)->type == JT_BLOCK_END) {
        advance(c);
        return 0;
    }
    unexpected(c, peek(c), "'%}'");
    return -1;
}

/* ---- nodes ---- */

static jnode *mk(jctx *c, int kind, uint32_t pos) {
    jnode *n = jalloc(c, sizeof *n);
    if (!n) return NULL;
    n->kind = (uint8_t)kind;
    n->pos = pos;
    return n;
}

static int list_depth(const jnodes *l) {
    int d = 0;
    for (int i = 0; i < l->n; i++) {
        const jnode *x = l->v[i];
        /* An elif is the lone else-body of its if: it costs no extra level,
         * since the evaluator walks elif chains iteratively. */
        int dx = x->kind == JN_IF && x->flag ? x->depth - 1 : x->depth;
        if (dx > d) d = dx;
    }
    return d;
}

/* Sets n->depth from its children; fails past the tree-depth bound. */
static jnode *fin(jctx *c, jnode *n) {
    if (!n) return NULL;
    int d = 0;
    const jnode *kids[4] = {n->a, n->b, n->c, n->d};
    for (int i = 0; i < 4; i++)
        if (kids[i] && kids[i]->depth > d) d = kids[i]->depth;
    int l = list_depth(&n->args);
    if (l > d) d = l;
    l = list_depth(&n->body);
    if (l > d) d = l;
    l = list_depth(&n->body2);
    if (l > d) d = l;
    if (d + 1 > 2 * c->lim.max_nesting) {
        jfail(c, ELLM_ERR_UNSUPPORTED, n->pos, "expression or block nested deeper than %d levels",
              2 * c->lim.max_nesting);
        return NULL;
    }
    n->depth = (uint16_t)(d + 1);
    return n;
}

static jnode *mk_const(jctx *c, jv *v, uint32_t pos) {
    if (!v) return NULL;
    jnode *n = mk(c, JE_CONST, pos);
    if (n) n->value = v;
    return fin(c, n);
}

/* Parser recursion guard around every function that can recurse. */
#define ENTER(c, pos)                                                                       \
    do {                                                                                    \
        if (++(c)->depth > (c)->lim.max_nesting) {                                          \
            jfail((c), ELLM_ERR_UNSUPPORTED, (pos), "nesting deeper than %d levels",        \
                  (c)->lim.max_nesting);                                                    \
            return NULL;                                                                    \
        }                                                                                   \
    } while (0)
#define LEAVE(c) ((c)->depth--)

/* ---- expressions ---- */

static jnode *parse_expr(jctx *c);
static jnode *parse_or(jctx *c);
static jnode *parse_unary(jctx *c, int with_filter);
static jnode *parse_primary(jctx *c);
static jnode *parse_postfix(jctx *c, jnode *a);

static jnode *binop(jctx *c, int kind, int op, jnode *a, jnode *b, uint32_t pos) {
    if (!a || !b) return NULL;
    jnode *n = mk(c, kind, pos);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return fin(c, n);
}

/* Call arguments after '(' up to and including ')': positional expressions,
 * then name=value keywords. */
static int parse_call_args(jctx *c, jnodes *out) {
    nodevec v = {0};
    int npos = 0, nkw = 0;
    while (!is_op(peek(c), JOP_RPAREN)) {
        jtok *t = peek(c);
        if (is_op(t, JOP_MUL) || is_op(t, JOP_POW)) {
            jfail(c, ELLM_ERR_UNSUPPORTED, t->pos, "argument unpacking (*args, **kwargs) is not supported");
            return -1;
        }
        jnode *arg;
        if (t->type == JT_NAME && is_op(peek2(c), JOP_ASSIGN)) {
            advance(c);
            advance(c);
            arg = mk(c, JE_KWARG, t->pos);
            if (!arg) return -1;
            arg->s = t->s;
            arg->n = t->n;
            arg->a = parse_expr(c);
            if (!arg->a || !fin(c, arg)) return -1;
            nkw++;
        } else {
            if (nkw) {
                jfail(c, ELLM_ERR_FORMAT, t->pos, "positional argument after a keyword argument");
                return -1;
            }
            arg = parse_expr(c);
            if (!arg) return -1;
            npos++;
        }
        if (npos > JARGS_MAX_POS || nkw > JARGS_MAX_KW) {
            jfail(c, ELLM_ERR_UNSUPPORTED, t->pos, "more than %d positional or %d keyword arguments",
                  JARGS_MAX_POS, JARGS_MAX_KW);
            return -1;
        }
        if (vec_push(c, &v, arg)) return -1;
        if (is_op(peek(c), JOP_COMMA))
            advance(c);
        else if (!is_op(peek(c), JOP_RPAREN))
            return unexpected(c, peek(c), "',' or ')'"), -1;
    }
    advance(c);
    *out = vec_done(&v);
    return 0;
}

static jnode *parse_subscript(jctx *c, jnode *obj, uint32_t pos) {
    jnode *start = NULL, *stop = NULL, *step = NULL;
    if (!is_op(peek(c), JOP_COLON) && !(start = parse_expr(c))) return NULL;
    if (!is_op(peek(c), JOP_COLON)) {
        if (expect_op(c, JOP_RBRACKET, "']'")) return NULL;
        return binop(c, JE_INDEX, 0, obj, start, pos);
    }
    advance(c);
    if (!is_op(peek(c), JOP_COLON) && !is_op(peek(c), JOP_RBRACKET) && !(stop = parse_expr(c)))
        return NULL;
    if (is_op(peek(c), JOP_COLON)) {
        advance(c);
        if (!is_op(peek(c), JOP_RBRACKET) && !(step = parse_expr(c))) return NULL;
    }
    if (expect_op(c, JOP_RBRACKET, "']'")) return NULL;
    jnode *n = mk(c, JE_SLICE, pos);
    if (!n) return NULL;
    n->a = obj;
    n->b = start;
    n->c = stop;
    n->d = step;
    return fin(c, n);
}

static jnode *parse_postfix(jctx *c, jnode *a) {
    while (a) {
        jtok *t = peek(c);
        if (is_op(t, JOP_DOT)) {
            advance(c);
            jtok *k = advance(c);
            if (k->type == JT_NAME) {
                jnode *n = mk(c, JE_ATTR, t->pos);
                if (!n) return NULL;
                n->a = a;
                n->s = k->s;
                n->n = k->n;
                a = fin(c, n);
            } else if (k->type == JT_INT) {
                a = binop(c, JE_INDEX, 0, a, mk_const(c, jv_int(c, k->i), k->pos), t->pos);
            } else {
                return unexpected(c, k, "an attribute name after '.'");
            }
        } else if (is_op(t, JOP_LBRACKET)) {
            advance(c);
            a = parse_subscript(c, a, t->pos);
        } else if (is_op(t, JOP_LPAREN)) {
            advance(c);
            jnode *n = mk(c, JE_CALL, a->pos); /* errors point at the callee */
            if (!n || parse_call_args(c, &n->args)) return NULL;
            n->a = a;
            a = fin(c, n);
        } else {
            break;
        }
    }
    return a;
}

/* Can this token start the single argument of `x is test arg`? */
static int starts_test_arg(const jtok *t) {
    if (t->type == JT_STRING || t->type == JT_INT || t->type == JT_FLOAT) return 1;
    if (t->type == JT_OP) return t->op == JOP_LBRACKET || t->op == JOP_LBRACE;
    if (t->type != JT_NAME) return 0;
    static const char *const stop[] = {"else", "or", "and", "if", "in", "not", "is"};
    for (size_t i = 0; i < sizeof stop / sizeof stop[0]; i++)
        if (is_name(t, stop[i])) return 0;
    return 1;
}

static jnode *parse_filter_expr(jctx *c, jnode *a) {
    while (a) {
        jtok *t = peek(c);
        if (is_op(t, JOP_PIPE)) {
            advance(c);
            jtok *name = advance(c);
            if (name->type != JT_NAME) return unexpected(c, name, "a filter name after '|'");
            jnode *n = mk(c, JE_FILTER, name->pos);
            if (!n) return NULL;
            n->a = a;
            n->s = name->s;
            n->n = name->n;
            if (is_op(peek(c), JOP_LPAREN)) {
                advance(c);
                if (parse_call_args(c, &n->args)) return NULL;
            }
            a = fin(c, n);
        } else if (is_name(t, "is")) {
            advance(c);
            int negate = 0;
            if (is_name(peek(c), "not")) {
                advance(c);
                negate = 1;
            }
            jtok *name = advance(c);
            if (name->type != JT_NAME) return unexpected(c, name, "a test name after 'is'");
            jnode *n = mk(c, JE_TEST, name->pos);
            if (!n) return NULL;
            n->a = a;
            n->s = name->s;
            n->n = name->n;
            n->flag = (uint8_t)negate;
            if (is_op(peek(c), JOP_LPAREN)) {
                advance(c);
                if (parse_call_args(c, &n->args)) return NULL;
            } else if (starts_test_arg(peek(c))) {
                jnode *arg = parse_postfix(c, parse_primary(c));
                if (!arg) return NULL;
                jnode **v = jalloc(c, sizeof *v);
                if (!v) return NULL;
                v[0] = arg;
                n->args.v = v;
                n->args.n = 1;
            }
            a = fin(c, n);
        } else {
            break;
        }
    }
    return a;
}

static jnode *parse_unary(jctx *c, int with_filter) {
    jtok *t = peek(c);
    ENTER(c, t->pos);
    jnode *a;
    if (is_op(t, JOP_SUB) || is_op(t, JOP_ADD)) {
        advance(c);
        jnode *x = parse_unary(c, 0);
        a = x ? mk(c, is_op(t, JOP_SUB) ? JE_NEG : JE_POS, t->pos) : NULL;
        if (a) {
            a->a = x;
            a = fin(c, a);
        }
    } else {
        a = parse_primary(c);
    }
    a = parse_postfix(c, a);
    if (with_filter) a = parse_filter_expr(c, a);
    LEAVE(c);
    return a;
}

static jnode *parse_pow(jctx *c) {
    jnode *a = parse_unary(c, 1);
    while (a && is_op(peek(c), JOP_POW)) {
        uint32_t pos = advance(c)->pos;
        a = binop(c, JE_BINOP, JOP_POW, a, parse_unary(c, 1), pos);
    }
    return a;
}

static jnode *parse_math2(jctx *c) {
    jnode *a = parse_pow(c);
    for (;;) {
        jtok *t = peek(c);
        if (!a || !(is_op(t, JOP_MUL) || is_op(t, JOP_DIV) || is_op(t, JOP_FLOORDIV) || is_op(t, JOP_MOD)))
            return a;
        advance(c);
        a = binop(c, JE_BINOP, t->op, a, parse_pow(c), t->pos);
    }
}

static jnode *parse_concat(jctx *c) {
    jnode *a = parse_math2(c);
    while (a && is_op(peek(c), JOP_TILDE)) {
        uint32_t pos = advance(c)->pos;
        a = binop(c, JE_BINOP, JOP_TILDE, a, parse_math2(c), pos);
    }
    return a;
}

static jnode *parse_math1(jctx *c) {
    jnode *a = parse_concat(c);
    for (;;) {
        jtok *t = peek(c);
        if (!a || !(is_op(t, JOP_ADD) || is_op(t, JOP_SUB))) return a;
        advance(c);
        a = binop(c, JE_BINOP, t->op, a, parse_concat(c), t->pos);
    }
}

static jnode *parse_compare(jctx *c) {
    jnode *a = parse_math1(c);
    for (;;) {
        jtok *t = peek(c);
        int op;
        if (!a) return NULL;
        if (t->type == JT_OP && t->op >= JOP_EQ && t->op <= JOP_GE) {
            op = t->op;
            advance(c);
        } else if (is_name(t, "in")) {
            op = JOP_IN;
            advance(c);
        } else if (is_name(t, "not") && is_name(peek2(c), "in")) {
            op = JOP_NOT_IN;
            advance(c);
            advance(c);
        } else {
            return a;
        }
        a = binop(c, JE_BINOP, op, a, parse_math1(c), t->pos);
    }
}

static jnode *parse_not(jctx *c) {
    jtok *t = peek(c);
    ENTER(c, t->pos);
    jnode *a;
    if (is_name(t, "not")) {
        advance(c);
        jnode *x = parse_not(c);
        a = x ? mk(c, JE_NOT, t->pos) : NULL;
        if (a) {
            a->a = x;
            a = fin(c, a);
        }
    } else {
        a = parse_compare(c);
    }
    LEAVE(c);
    return a;
}

static jnode *parse_and(jctx *c) {
    jnode *a = parse_not(c);
    while (a && is_name(peek(c), "and")) {
        uint32_t pos = advance(c)->pos;
        a = binop(c, JE_AND, 0, a, parse_not(c), pos);
    }
    return a;
}

static jnode *parse_or(jctx *c) {
    jnode *a = parse_and(c);
    while (a && is_name(peek(c), "or")) {
        uint32_t pos = advance(c)->pos;
        a = binop(c, JE_OR, 0, a, parse_and(c), pos);
    }
    return a;
}

/* Full expression: `a if cond else b`, chained to the right. */
static jnode *parse_expr(jctx *c) {
    jtok *t0 = peek(c);
    ENTER(c, t0->pos);
    jnode *a = parse_or(c);
    if (a && is_name(peek(c), "if")) {
        jtok *t = advance(c);
        jnode *cond = parse_or(c), *alt = NULL;
        if (cond && is_name(peek(c), "else")) {
            advance(c);
            alt = parse_expr(c);
            if (!alt) cond = NULL;
        }
        jnode *n = cond ? mk(c, JE_COND, t->pos) : NULL;
        if (n) {
            n->a = cond;
            n->b = a;
            n->c = alt;
        }
        a = fin(c, n);
    }
    LEAVE(c);
    return a;
}

/* Expression or a bare tuple `a, b` (in {{ }}, set values). */
static jnode *parse_tuple(jctx *c) {
    jtok *t0 = peek(c);
    jnode *a = parse_expr(c);
    if (!a || !is_op(peek(c), JOP_COMMA)) return a;
    nodevec v = {0};
    if (vec_push(c, &v, a)) return NULL;
    while (is_op(peek(c), JOP_COMMA)) {
        advance(c);
        jtok *t = peek(c);
        if (t->type == JT_VAR_END || t->type == JT_BLOCK_END) break;
        jnode *x = parse_expr(c);
        if (!x || vec_push(c, &v, x)) return NULL;
    }
    jnode *n = mk(c, JE_TUPLE, t0->pos);
    if (!n) return NULL;
    n->args = vec_done(&v);
    return fin(c, n);
}

static jnode *parse_primary(jctx *c) {
    jtok *t = advance(c);
    switch (t->type) {
    case JT_NAME:
        if (is_name(t, "true") || is_name(t, "True")) return mk_const(c, J_TRUE, t->pos);
        if (is_name(t, "false") || is_name(t, "False")) return mk_const(c, J_FALSE, t->pos);
        if (is_name(t, "none") || is_name(t, "None")) return mk_const(c, J_NONE, t->pos);
        {
            jnode *n = mk(c, JE_NAME, t->pos);
            if (!n) return NULL;
            n->s = t->s;
            n->n = t->n;
            return fin(c, n);
        }
    case JT_STRING: {
        /* adjacent literals concatenate: 'a' "b" */
        size_t total = t->n, k = c->tok_i;
        while (c->toks[k].type == JT_STRING) total += c->toks[k++].n;
        if (k == c->tok_i) return mk_const(c, jv_str_ref(c, t->s, t->n), t->pos);
        char *p = jalloc(c, total + 1);
        if (!p) return NULL;
        memcpy(p, t->s, t->n);
        size_t off = t->n;
        while (c->tok_i < k) {
            jtok *u = advance(c);
            memcpy(p + off, u->s, u->n);
            off += u->n;
        }
        return mk_const(c, jv_str_ref(c, p, total), t->pos);
    }
    case JT_INT: return mk_const(c, jv_int(c, t->i), t->pos);
    case JT_FLOAT: return mk_const(c, jv_float(c, t->f), t->pos);
    case JT_OP:
        if (t->op == JOP_LPAREN) {
            if (is_op(peek(c), JOP_RPAREN)) {
                advance(c);
                jnode *n = mk(c, JE_TUPLE, t->pos);
                return fin(c, n);
            }
            jnode *a = parse_expr(c);
            if (!a) return NULL;
            if (is_op(peek(c), JOP_COMMA)) {
                nodevec v = {0};
                if (vec_push(c, &v, a)) return NULL;
                while (is_op(peek(c), JOP_COMMA)) {
                    advance(c);
                    if (is_op(peek(c), JOP_RPAREN)) break;
                    jnode *x = parse_expr(c);
                    if (!x || vec_push(c, &v, x)) return NULL;
                }
                a = mk(c, JE_TUPLE, t->pos);
                if (!a) return NULL;
                a->args = vec_done(&v);
                a = fin(c, a);
            }
            if (!a || expect_op(c, JOP_RPAREN, "')'")) return NULL;
            return a;
        }
        if (t->op == JOP_LBRACKET) {
            nodevec v = {0};
            while (!is_op(peek(c), JOP_RBRACKET)) {
                jnode *x = parse_expr(c);
                if (!x || vec_push(c, &v, x)) return NULL;
                if (is_op(peek(c), JOP_COMMA))
                    advance(c);
                else if (!is_op(peek(c), JOP_RBRACKET))
                    return unexpected(c, peek(c), "',' or ']'");
            }
            advance(c);
            jnode *n = mk(c, JE_LIST, t->pos);
            if (!n) return NULL;
            n->args = vec_done(&v);
            return fin(c, n);
        }
        if (t->op == JOP_LBRACE) {
            nodevec keys = {0}, vals = {0};
            while (!is_op(peek(c), JOP_RBRACE)) {
                jnode *k = parse_expr(c);
                if (!k || expect_op(c, JOP_COLON, "':'")) return NULL;
                jnode *x = parse_expr(c);
                if (!x || vec_push(c, &keys, k) || vec_push(c, &vals, x)) return NULL;
                if (is_op(peek(c), JOP_COMMA))
                    advance(c);
                else if (!is_op(peek(c), JOP_RBRACE))
                    return unexpected(c, peek(c), "',' or '}'");
            }
            advance(c);
            jnode *n = mk(c, JE_DICT, t->pos);
            if (!n) return NULL;
            n->args = vec_done(&keys);
            n->body = vec_done(&vals);
            return fin(c, n);
        }
        return unexpected(c, t, "an expression");
    default: return unexpected(c, t, "an expression");
    }
}

/* ---- statements ---- */

static int parse_body(jctx *c, jnodes *out, const char *const *ends, int *which, const char *opener,
                      uint32_t opener_pos);

/* Target of for/set: a name, a tuple of names, or (set only) ns.attr. */
static jnode *parse_target(jctx *c, int allow_attr) {
    jtok *t = peek(c);
    int paren = is_op(t, JOP_LPAREN);
    if (paren) advance(c);
    nodevec v = {0};
    for (;;) {
        jtok *name = advance(c);
        if (name->type != JT_NAME) return unexpected(c, name, "a variable name");
        jnode *x = mk(c, JE_NAME, name->pos);
        if (!x) return NULL;
        x->s = name->s;
        x->n = name->n;
        if (!(x = fin(c, x))) return NULL;
        if (allow_attr && !paren && v.n == 0 && is_op(peek(c), JOP_DOT)) {
            advance(c);
            jtok *attr = advance(c);
            if (attr->type != JT_NAME) return unexpected(c, attr, "an attribute name");
            jnode *n = mk(c, JE_ATTR, attr->pos);
            if (!n) return NULL;
            n->a = x;
            n->s = attr->s;
            n->n = attr->n;
            return fin(c, n);
        }
        if (!x || vec_push(c, &v, x)) return NULL;
        if (!is_op(peek(c), JOP_COMMA)) break;
        advance(c);
        if (paren && is_op(peek(c), JOP_RPAREN)) break;
    }
    if (paren && expect_op(c, JOP_RPAREN, "')'")) return NULL;
    if (v.n == 1 && !paren) return v.v[0];
    jnode *n = mk(c, JE_TUPLE, t->pos);
    if (!n) return NULL;
    n->args = vec_done(&v);
    return fin(c, n);
}

static const char *const ends_if[] = {"elif", "else", "endif", NULL};
static const char *const ends_endif[] = {"endif", NULL};
static const char *const ends_for[] = {"else", "endfor", NULL};
static const char *const ends_endfor[] = {"endfor", NULL};
static const char *const ends_set[] = {"endset", NULL};
static const char *const ends_macro[] = {"endmacro", NULL};
static const char *const ends_filter[] = {"endfilter", NULL};
static const char *const ends_generation[] = {"endgeneration", NULL};

static jnode *parse_if(jctx *c, uint32_t pos) {
    jnode *root = mk(c, JN_IF, pos), *cur = root;
    nodevec chain = {0}; /* the if and its elifs, to set depths innermost first */
    if (!root) return NULL;
    for (;;) {
        int which;
        if (vec_push(c, &chain, cur)) return NULL;
        cur->a = parse_expr(c);
        if (!cur->a || expect_block_end(c)) return NULL;
        if (parse_body(c, &cur->body, ends_if, &which, "if", pos)) return NULL;
        if (which == 0) { /* elif */
            jnode *next = mk(c, JN_IF, c->toks[c->tok_i - 1].pos);
            jnode **v = next ? jalloc(c, sizeof *v) : NULL;
            if (!v) return NULL;
            next->flag = 1;
            v[0] = next;
            cur->body2.v = v;
            cur->body2.n = 1;
            cur = next;
            continue;
        }
        if (which == 1) { /* else */
            if (expect_block_end(c) || parse_body(c, &cur->body2, ends_endif, &which, "if", pos))
                return NULL;
        }
        if (expect_block_end(c)) return NULL;
        break;
    }
    for (int i = chain.n - 1; i >= 0; i--)
        if (!fin(c, chain.v[i])) return NULL;
    return root;
}

static jnode *parse_for(jctx *c, uint32_t pos) {
    jnode *n = mk(c, JN_FOR, pos);
    if (!n || !(n->a = parse_target(c, 0))) return NULL;
    if (!is_name(peek(c), "in")) return unexpected(c, peek(c), "'in'");
    advance(c);
    if (!(n->b = parse_or(c))) return NULL;
    if (is_name(peek(c), "if")) {
        advance(c);
        if (!(n->c = parse_expr(c))) return NULL;
    }
    if (is_name(peek(c), "recursive")) {
        jfail(c, ELLM_ERR_UNSUPPORTED, peek(c)->pos, "recursive for loops are not supported");
        return NULL;
    }
    if (expect_block_end(c)) return NULL;
    int which;
    c->loop_depth++;
    int rc = parse_body(c, &n->body, ends_for, &which, "for", pos);
    c->loop_depth--;
    if (rc) return NULL;
    if (which == 0 &&
        (expect_block_end(c) || parse_body(c, &n->body2, ends_endfor, &which, "for", pos)))
        return NULL;
    if (expect_block_end(c)) return NULL;
    return fin(c, n);
}

static jnode *parse_set(jctx *c, uint32_t pos) {
    jnode *target = parse_target(c, 1);
    if (!target) return NULL;
    if (is_op(peek(c), JOP_ASSIGN)) {
        advance(c);
        jnode *n = mk(c, JN_SET, pos);
        if (!n || !(n->b = parse_tuple(c)) || expect_block_end(c)) return NULL;
        n->a = target;
        return fin(c, n);
    }
    if (target->kind != JE_NAME) return unexpected(c, peek(c), "'='");
    if (is_op(peek(c), JOP_PIPE)) {
        jfail(c, ELLM_ERR_UNSUPPORTED, peek(c)->pos, "filters on block assignments are not supported");
        return NULL;
    }
    if (expect_block_end(c)) return NULL;
    jnode *n = mk(c, JN_SET_BLOCK, pos);
    int which;
    if (!n || parse_body(c, &n->body, ends_set, &which, "set", pos) || expect_block_end(c)) return NULL;
    n->a = target;
    return fin(c, n);
}

static jnode *parse_macro(jctx *c, uint32_t pos) {
    jtok *name = advance(c);
    if (name->type != JT_NAME) return unexpected(c, name, "a macro name");
    jnode *n = mk(c, JN_MACRO, pos);
    if (!n || expect_op(c, JOP_LPAREN, "'('")) return NULL;
    n->s = name->s;
    n->n = name->n;
    nodevec params = {0};
    int has_default = 0;
    while (!is_op(peek(c), JOP_RPAREN)) {
        jtok *p = advance(c);
        if (p->type != JT_NAME) return unexpected(c, p, "a parameter name");
        jnode *x;
        if (is_op(peek(c), JOP_ASSIGN)) {
            advance(c);
            x = mk(c, JE_KWARG, p->pos);
            if (!x || !(x->a = parse_expr(c))) return NULL;
            has_default = 1;
        } else {
            if (has_default) {
                jfail(c, ELLM_ERR_FORMAT, p->pos, "parameter without a default after one with a default");
                return NULL;
            }
            x = mk(c, JE_NAME, p->pos);
            if (!x) return NULL;
        }
        x->s = p->s;
        x->n = p->n;
        if (!fin(c, x) || vec_push(c, &params, x)) return NULL;
        if (params.n > JARGS_MAX_KW) {
            jfail(c, ELLM_ERR_UNSUPPORTED, p->pos, "macros take at most %d parameters", JARGS_MAX_KW);
            return NULL;
        }
        if (is_op(peek(c), JOP_COMMA))
            advance(c);
        else if (!is_op(peek(c), JOP_RPAREN))
            return unexpected(c, peek(c), "',' or ')'");
    }
    advance(c);
    n->args = vec_done(&params);
    if (expect_block_end(c)) return NULL;
    int which, saved = c->loop_depth;
    c->loop_depth = 0; /* break/continue do not cross a macro */
    int rc = parse_body(c, &n->body, ends_macro, &which, "macro", pos);
    c->loop_depth = saved;
    if (rc) return NULL;
    if (peek(c)->type == JT_NAME) advance(c); /* {% endmacro name %} */
    if (expect_block_end(c)) return NULL;
    return fin(c, n);
}

static jnode *parse_filter_block(jctx *c, uint32_t pos) {
    jtok *name = advance(c);
    if (name->type != JT_NAME) return unexpected(c, name, "a filter name");
    jnode *n = mk(c, JN_FILTER_BLOCK, pos);
    if (!n) return NULL;
    n->s = name->s;
    n->n = name->n;
    if (is_op(peek(c), JOP_LPAREN)) {
        advance(c);
        if (parse_call_args(c, &n->args)) return NULL;
    }
    int which;
    if (expect_block_end(c) || parse_body(c, &n->body, ends_filter, &which, "filter", pos) ||
        expect_block_end(c))
        return NULL;
    return fin(c, n);
}

static jnode *parse_statement(jctx *c, uint32_t pos) {
    jtok *t = advance(c);
    if (t->type != JT_NAME) return unexpected(c, t, "a statement name");
    if (is_name(t, "if")) return parse_if(c, pos);
    if (is_name(t, "for")) return parse_for(c, pos);
    if (is_name(t, "set")) return parse_set(c, pos);
    if (is_name(t, "macro")) return parse_macro(c, pos);
    if (is_name(t, "filter")) return parse_filter_block(c, pos);
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (c->loop_depth == 0) {
            jfail(c, ELLM_ERR_FORMAT, t->pos, "'%.*s' outside of a for loop", (int)t->n, t->s);
            return NULL;
        }
        jnode *n = mk(c, is_name(t, "break") ? JN_BREAK : JN_CONTINUE, pos);
        if (!n || expect_block_end(c)) return NULL;
        return fin(c, n);
    }
    if (is_name(t, "generation")) {
        /* transformers' marker of assistant text: renders its body */
        jnode *n = mk(c, JN_BLOCK, pos);
        int which;
        if (!n || expect_block_end(c) ||
            parse_body(c, &n->body, ends_generation, &which, "generation", pos) || expect_block_end(c))
            return NULL;
        return fin(c, n);
    }
    static const char *const unsupported[] = {"include", "import", "from", "extends", "block", "call",
                                              "with", "autoescape", "do", "trans", "pluralize", "raw"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        if (is_name(t, unsupported[i])) {
            jfail(c, ELLM_ERR_UNSUPPORTED, t->pos, "'{%% %s %%}' is not supported", unsupported[i]);
            return NULL;
        }
    }
    static const char *const stray[] = {"elif", "else", "endif", "endfor", "endset", "endmacro",
                                        "endfilter", "endgeneration", "endraw", "endblock", "endcall"};
    for (size_t i = 0; i < sizeof stray / sizeof stray[0]; i++) {
        if (is_name(t, stray[i])) {
            jfail(c, ELLM_ERR_FORMAT, t->pos, "unexpected '{%% %s %%}' with no open block", stray[i]);
            return NULL;
        }
    }
    jfail(c, ELLM_ERR_FORMAT, t->pos, "unknown statement '%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s);
    return NULL;
}

/* Parses template content up to one of `ends` (consuming its '{%' and name;
 * *which = its index) or, if ends is NULL, to the end of the template. */
static int parse_body(jctx *c, jnodes *out, const char *const *ends, int *which, const char *opener,
                      uint32_t opener_pos) {
    jtok *t0 = peek(c);
    if (++c->depth > c->lim.max_nesting)
        return jfail(c, ELLM_ERR_UNSUPPORTED, t0->pos, "blocks nested deeper than %d levels",
                     c->lim.max_nesting);
    nodevec v = {0};
    for (;;) {
        jtok *t = peek(c);
        jnode *n = NULL;
        if (t->type == JT_EOF) {
            if (!ends) break;
            const char *closer = ends[0];
            for (int i = 1; ends[i]; i++) closer = ends[i]; /* the end* name is last */
            return jfail(c, ELLM_ERR_FORMAT, opener_pos, "'%s' block is never closed (expected '{%% %s %%}')",
                         opener, closer);
        }
        if (t->type == JT_TEXT) {
            advance(c);
            n = mk(c, JN_TEXT, t->pos);
            if (!n) return -1;
            n->s = t->s;
            n->n = t->n;
            n = fin(c, n);
        } else if (t->type == JT_VAR_BEGIN) {
            advance(c);
            jnode *e = parse_tuple(c);
            if (!e) return -1;
            if (peek(c)->type != JT_VAR_END) return unexpected(c, peek(c), "'}}'"), -1;
            advance(c);
            n = mk(c, JN_OUTPUT, t->pos);
            if (!n) return -1;
            n->a = e;
            n = fin(c, n);
        } else if (t->type == JT_BLOCK_BEGIN) {
            jtok *name = peek2(c);
            if (ends && name->type == JT_NAME) {
                for (int i = 0; ends[i]; i++) {
                    if (is_name(name, ends[i])) {
                        advance(c);
                        advance(c);
                        *which = i;
                        *out = vec_done(&v);
                        c->depth--;
                        return 0;
                    }
                }
            }
            advance(c);
            n = parse_statement(c, t->pos);
        } else {
            return unexpected(c, t, NULL), -1;
        }
        if (!n || vec_push(c, &v, n)) return -1;
    }
    *out = vec_done(&v);
    c->depth--;
    return 0;
}

int jinja_parse(jctx *c, jnodes *body) {
    c->tok_i = 0;
    c->depth = 0;
    c->loop_depth = 0;
    int which;
    return parse_body(c, body, NULL, &which, NULL, 0);
}
