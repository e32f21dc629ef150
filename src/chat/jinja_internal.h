/* Internals of the Jinja-subset interpreter behind chat.h.
 *
 * Pipeline: jinja_lex (jinja_lexer.c) turns the template into tokens, applying
 * whitespace control; jinja_parse (jinja_parser.c) builds an AST; jinja_render
 * (jinja_eval.c) walks it over values (jinja_value.c), calling the filters,
 * tests, methods and globals in jinja_builtins.c.
 *
 * Memory: everything a render allocates (tokens, AST, values, strings) comes
 * from one arena, freed in one go at the end, so error paths unwind nothing.
 * Only output buffers (jbuf) are malloc'ed, and each has a single owner.
 *
 * Errors: the first failure is recorded in the jctx (status + message with
 * line:column); functions then return NULL / -1 and callers pass that up. */
#ifndef ELLM_CHAT_JINJA_INTERNAL_H
#define ELLM_CHAT_JINJA_INTERNAL_H

#include "chat/chat.h"

#include <stddef.h>
#include <stdint.h>

/* "No source position" for errors that belong to no construct. */
#define JPOS_NONE UINT32_MAX
/* Largest template accepted (positions are 32-bit). */
#define JINJA_MAX_SOURCE ((size_t)16 << 20)
/* Hard cap on evaluator recursion (jeval/render frames), whatever the limits:
 * with AST depth bounded by max_nesting this only bites on deep macro
 * recursion, and keeps the stack use of a render well under 1 MiB. */
#define JINJA_MAX_EVAL_DEPTH 600
/* Recursion cap of printing, JSON, comparison of nested values (a namespace
 * can contain itself). */
#define JINJA_MAX_VALUE_DEPTH 128

/* ---- arena ---- */

typedef struct jarena_chunk jarena_chunk;
typedef struct {
    jarena_chunk *head;
    size_t total; /* bytes taken from malloc */
    size_t limit;
} jarena;

/* ---- growable byte buffer: malloc'ed, bounded by max_output ---- */

typedef struct {
    char *p;
    size_t n, cap;
} jbuf;

/* ---- tokens ---- */

typedef enum {
    JT_TEXT,        /* template data between tags (slice of the source) */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,
    JT_STRING, /* s/n: the unescaped bytes (arena) */
    JT_INT,
    JT_FLOAT,
    JT_OP,
    JT_EOF
} jtok_type;

typedef enum {
    JOP_NONE,
    JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_TILDE,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE,
    JOP_ASSIGN, JOP_LPAREN, JOP_RPAREN, JOP_LBRACKET, JOP_RBRACKET, JOP_LBRACE, JOP_RBRACE,
    JOP_COMMA, JOP_DOT, JOP_COLON, JOP_PIPE,
    JOP_IN, JOP_NOT_IN /* only in the AST (binary "in" / "not in") */
} jop;

typedef struct {
    uint8_t type; /* jtok_type */
    uint8_t op;   /* jop, for JT_OP */
    uint32_t pos; /* byte offset in the source */
    const char *s;
    size_t n;
    int64_t i;
    double f;
} jtok;

/* ---- AST ---- */

typedef enum {
    /* statements */
    JN_TEXT,         /* s/n */
    JN_OUTPUT,       /* {{ a }} */
    JN_IF,           /* if a: body else body2 (elif = an JN_IF alone in body2) */
    JN_FOR,          /* for a(target) in b [if c]: body else body2 */
    JN_SET,          /* set a(target) = b */
    JN_SET_BLOCK,    /* set a(name): body */
    JN_MACRO,        /* macro s(args): body; args are JE_NAME or JE_KWARG (default) */
    JN_BREAK,
    JN_CONTINUE,
    JN_FILTER_BLOCK, /* filter s(args): body */
    JN_BLOCK,        /* a plain body (generation markers) */
    /* expressions */
    JE_CONST,  /* value */
    JE_NAME,   /* s/n */
    JE_LIST,   /* args = items */
    JE_TUPLE,  /* args = items */
    JE_DICT,   /* args = keys, body = values */
    JE_ATTR,   /* a.s */
    JE_INDEX,  /* a[b] */
    JE_SLICE,  /* a[b:c:d], any of b/c/d NULL */
    JE_CALL,   /* a(args) */
    JE_FILTER, /* a | s(args) */
    JE_TEST,   /* a is [not] s(args); flag = negated */
    JE_NOT,    /* not a */
    JE_NEG,    /* -a */
    JE_POS,    /* +a */
    JE_BINOP,  /* a op b */
    JE_AND,    /* a and b */
    JE_OR,     /* a or b */
    JE_COND,   /* b if a else c (c NULL: undefined) */
    JE_KWARG   /* s = a, inside call arguments and macro parameters */
} jnode_kind;

typedef struct jnode jnode;
typedef struct jv jv;

typedef struct {
    jnode **v;
    int n;
} jnodes;

struct jnode {
    uint8_t kind; /* jnode_kind */
    uint8_t op;   /* jop for JE_BINOP */
    uint8_t flag; /* JE_TEST: negated */
    uint16_t depth; /* 1 + deepest child: bounds the evaluator's recursion */
    uint32_t pos;
    jnode *a, *b, *c, *d;
    jnodes args;  /* call/filter/test arguments, list items, macro parameters, dict keys */
    jnodes body;  /* statement body, dict values */
    jnodes body2; /* else body */
    const char *s; /* names: slices of the source */
    size_t n;
    jv *value; /* JE_CONST */
};

/* ---- values ---- */

typedef enum {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,   /* also tuples (flag) */
    JV_DICT,
    JV_NS,     /* namespace(): a dict whose attributes can be set */
    JV_LOOP,   /* the `loop` of a for loop */
    JV_FUNC,   /* a global function (jbuiltin_fn) */
    JV_METHOD, /* a method bound to its object */
    JV_MACRO
} jv_type;

typedef struct jscope jscope;

typedef struct {
    jv **items;
    size_t n;
} jlist;

typedef struct {
    jv **keys; /* any value; lookups compare with jv_equal */
    jv **vals;
    size_t n, cap;
} jdict;

typedef struct {
    size_t index0, length;
    jv **items; /* the iterated items, for previtem/nextitem */
} jloop;

typedef struct {
    jv *self;
    int id; /* jbuiltin_method */
} jmethod;

typedef struct {
    const jnode *node; /* JN_MACRO */
    jscope *scope;     /* where it was defined: bodies resolve names there */
} jmacro;

struct jv {
    uint8_t type;  /* jv_type */
    uint8_t tuple; /* JV_LIST: a tuple (prints with parentheses) */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        jlist *l;
        jdict *d;
        jloop *loop;
        int fn;
        jmethod *m;
        jmacro *mac;
    } u;
};

/* ---- scopes: names -> values, chained to the enclosing scope ---- */

struct jscope {
    jscope *parent;
    const char **names;
    size_t *lens;
    jv **vals;
    size_t n, cap;
};

/* ---- interpreter state of one render ---- */

typedef struct jctx {
    const char *src;
    size_t src_len;
    jarena arena;
    ellm_error *err;
    ellm_status status; /* ELLM_OK until the first failure */
    chat_template_limits lim;
    int64_t now;
    /* lexer output / parser cursor */
    jtok *toks;
    size_t n_toks, cap_toks, tok_i;
    int depth;      /* parser nesting, then evaluator recursion */
    int loop_depth; /* parser: for loops around the current statement */
    int call_depth; /* macro calls in progress */
    uint64_t steps, iterations;
    jv *small_ints[1024 + 128]; /* cached ints -128..1023, made on first use */
} jctx;

/* Call arguments, evaluated: positional then keyword. */
#define JARGS_MAX_POS 8
#define JARGS_MAX_KW 16
typedef struct {
    jv *pos[JARGS_MAX_POS];
    int npos;
    const char *kname[JARGS_MAX_KW];
    size_t klen[JARGS_MAX_KW];
    jv *kval[JARGS_MAX_KW];
    int nkw;
} jargs;

/* ---- context, errors, memory (jinja_value.c) ---- */

/* Records the first error: `status` and "chat template L:C: <msg>" (no
 * location if pos is JPOS_NONE). Returns -1 so that error paths read
 * `return jfail(...)`. */
int jfail(jctx *c, ellm_status status, uint32_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Line and column (1-based, column in bytes) of byte offset `pos`. */
void jpos_linecol(const jctx *c, uint32_t pos, int *line, int *col);

/* Arena allocation, zeroed; NULL (error recorded) over max_memory or on OOM. */
void *jalloc(jctx *c, size_t n);
void jarena_free(jarena *a);

/* Appends to a buffer; -1 (error recorded) past max_output or on OOM. */
int jbuf_put(jctx *c, jbuf *b, const char *p, size_t n);
int jbuf_putc(jctx *c, jbuf *b, char ch);
int jbuf_printf(jctx *c, jbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void jbuf_free(jbuf *b);

/* ---- values (jinja_value.c) ---- */

extern jv jv_undef_v, jv_none_v, jv_true_v, jv_false_v;
#define J_UNDEF (&jv_undef_v)
#define J_NONE (&jv_none_v)
#define J_TRUE (&jv_true_v)
#define J_FALSE (&jv_false_v)
#define J_BOOL(x) ((x) ? J_TRUE : J_FALSE)

jv *jv_int(jctx *c, int64_t i);
jv *jv_float(jctx *c, double f);
/* String values: _copy copies the bytes into the arena, _ref keeps the
 * pointer (which must outlive the render: source, arena or caller data). */
jv *jv_str_copy(jctx *c, const char *p, size_t n);
jv *jv_str_ref(jctx *c, const char *p, size_t n);
jv *jv_list(jctx *c, size_t n); /* n items, all J_UNDEF until set */
jv *jv_dict(jctx *c, int is_namespace);
int jdict_set(jctx *c, jv *d, jv *key, jv *val);
int jdict_set_str(jctx *c, jv *d, const char *key, size_t n, jv *val);
/* Value for a string key, or NULL. */
jv *jdict_get_str(const jv *d, const char *key, size_t n);
/* Value for any key (compared with jv_equal), or NULL. */
jv *jdict_get(const jv *d, const jv *key);

int jv_truthy(const jv *v);
const char *jv_type_name(const jv *v);
/* Python equality of two values; -1 if nesting is too deep (error recorded). */
int jv_equal(jctx *c, const jv *a, const jv *b, int depth);
/* Python ordering (numbers, strings, sequences): *res <0, 0, >0; -1 on
 * incomparable types (error recorded at pos). `fold_case`: compare strings
 * ignoring ASCII case (the sort filters' default). */
int jv_compare(jctx *c, const jv *a, const jv *b, int fold_case, int *res, uint32_t pos);
/* Stable merge sort of the permutation idx[0..n) so that keys[idx[i]] ascend
 * by jv_compare (descend with `reverse`, equal keys keeping their order); -1
 * if a comparison fails (error recorded at pos). */
int jv_sort_indices(jctx *c, jv *const *keys, size_t *idx, size_t n, int fold_case, int reverse,
                    uint32_t pos);

/* Python str(v) / repr(v) appended to b. */
int jv_write_str(jctx *c, jbuf *b, const jv *v);
int jv_write_repr(jctx *c, jbuf *b, const jv *v, int depth);
/* str(v) as a string value (v itself when it is one). */
jv *jv_to_str(jctx *c, const jv *v);

typedef struct {
    int indent;       /* < 0: single line */
    int ensure_ascii; /* escape non-ASCII as \uXXXX */
    int sort_keys;
    const char *item_sep, *key_sep; /* NULL: Python's defaults */
} jjson_opts;
/* json.dumps(v) as transformers' tojson filter does it. */
int jv_write_json(jctx *c, jbuf *b, const jv *v, const jjson_opts *o, int depth, uint32_t pos);

/* Python repr of a float ("1.0", "1e+16", "inf"). */
void jfloat_repr(double f, char *out, size_t cap);

/* UTF-8: decode one code point (invalid bytes decode as themselves, 1 byte). */
uint32_t jutf8_decode(const char *p, size_t n, size_t *adv);
size_t jutf8_count(const char *p, size_t n);
/* Python's str.isspace() for one code point. */
int jis_space(uint32_t cp);

/* ---- lexer, parser, evaluator ---- */

/* Tokenizes c->src into c->toks (ending with JT_EOF). */
int jinja_lex(jctx *c);
/* Parses c->toks into the template body. */
int jinja_parse(jctx *c, jnodes *body);
/* Renders `body` with `root` as the global scope, appending to out. */
int jinja_render(jctx *c, jscope *root, const jnodes *body, jbuf *out);

/* Scope helpers (jinja_eval.c). */
jscope *jscope_new(jctx *c, jscope *parent);
int jscope_set(jctx *c, jscope *s, const char *name, size_t n, jv *v);
jv *jscope_get(const jscope *s, const char *name, size_t n);

/* ---- builtins (jinja_builtins.c) ---- */

/* Global function id for a name (range, namespace, ...), or -1. */
int jb_global(const char *name, size_t n);
/* Calls a JV_FUNC or JV_METHOD. */
jv *jb_call(jctx *c, const jv *fn, jargs *a, uint32_t pos);
/* obj.name: an item, a loop field, a bound method, or J_UNDEF. */
jv *jb_getattr(jctx *c, jv *obj, const char *name, size_t n);
/* obj[key] (no slices): J_UNDEF when missing. */
jv *jb_getitem(jctx *c, jv *obj, jv *key, uint32_t pos);
/* Applies filter `name` (node: for its position) to v. */
jv *jb_filter(jctx *c, const char *name, size_t n, jv *v, jargs *a, uint32_t pos);
/* Applies test `name`; J_TRUE/J_FALSE or NULL. */
jv *jb_test(jctx *c, const char *name, size_t n, jv *v, jargs *a, uint32_t pos);
/* The items a for loop iterates over v (dict -> keys, string -> characters). */
jv *jb_iterate(jctx *c, jv *v, uint32_t pos);
/* Binary operators other than and/or. */
jv *jb_binop(jctx *c, int op, jv *a, jv *b, uint32_t pos);
/* Counts `n` loop iterations against max_iterations. */
int jb_count_iterations(jctx *c, uint64_t n, uint32_t pos);

/* Keyword argument `name` of a, or NULL. */
jv *jargs_kw(const jargs *a, const char *name);

#endif
