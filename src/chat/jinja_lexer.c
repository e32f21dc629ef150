/* Jinja lexer: splits the template into text and tag tokens, applying the
 * whitespace control that transformers configures (Jinja's trim_blocks and
 * lstrip_blocks, plus the `-` / `+` tag modifiers and the dropped trailing
 * newline), so the parser sees text exactly as it is to be output.
 *
 * Text tokens are slices of the source; string literals are unescaped into
 * the arena. Every token keeps its byte offset for error positions. */
#include "chat/jinja_internal.h"

#include <stdlib.h>
#include <string.h>

static int is_ws(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}
static int is_name_start(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static jtok *push(jctx *c, int type, uint32_t pos) {
    if (c->n_toks == c->cap_toks) {
        size_t cap = c->cap_toks ? c->cap_toks * 2 : 256;
        jtok *t = jalloc(c, cap * sizeof *t);
        if (!t) return NULL;
        if (c->n_toks) memcpy(t, c->toks, c->n_toks * sizeof *t);
        c->toks = t;
        c->cap_toks = cap;
    }
    jtok *t = &c->toks[c->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->pos = pos;
    return t;
}

/* Appends the code point as UTF-8. */
static size_t put_utf8(char *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Reads a quoted string starting at *pp (the quote) with Python's escapes
 * (\n \t \r \\ \' \" \b \f \v \a \0 \xNN \uNNNN \UNNNNNNNN; an unknown escape
 * stays as written, as in Python). */
static int lex_string(jctx *c, size_t *pp) {
    const char *s = c->src;
    size_t n = c->src_len, start = *pp, i = start + 1;
    char q = s[start];
    size_t end = i;
    while (end < n && s[end] != q) end += s[end] == '\\' && end + 1 < n ? 2 : 1;
    if (end >= n) return jfail(c, ELLM_ERR_FORMAT, (uint32_t)start, "unterminated string literal");
    /* Escapes never lengthen the text: \U (10 bytes) makes at most 4. */
    char *out = jalloc(c, end - i + 1);
    if (!out) return -1;
    size_t k = 0;
    while (i < end) {
        char ch = s[i];
        if (ch != '\\') {
            out[k++] = ch;
            i++;
            continue;
        }
        char e = s[i + 1];
        i += 2;
        switch (e) {
        case 'n': out[k++] = '\n'; break;
        case 't': out[k++] = '\t'; break;
        case 'r': out[k++] = '\r'; break;
        case 'b': out[k++] = '\b'; break;
        case 'f': out[k++] = '\f'; break;
        case 'v': out[k++] = '\v'; break;
        case 'a': out[k++] = '\a'; break;
        case '0': out[k++] = '\0'; break;
        case '\\': out[k++] = '\\'; break;
        case '\'': out[k++] = '\''; break;
        case '"': out[k++] = '"'; break;
        case '\n': break; /* line continuation */
        case 'x':
        case 'u':
        case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 0; d < digits; d++) {
                int h = i + (size_t)d < end ? hexval(s[i + (size_t)d]) : -1;
                if (h < 0)
                    return jfail(c, ELLM_ERR_FORMAT, (uint32_t)(i - 2), "truncated \\%c escape", e);
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
                return jfail(c, ELLM_ERR_FORMAT, (uint32_t)(i - 2), "invalid code point in \\%c escape", e);
            i += (size_t)digits;
            k += put_utf8(out + k, cp);
            break;
        }
        default:
            out[k++] = '\\';
            out[k++] = e;
            break;
        }
    }
    jtok *t = push(c, JT_STRING, (uint32_t)start);
    if (!t) return -1;
    out[k] = 0;
    t->s = out;
    t->n = k;
    *pp = end + 1;
    return 0;
}

static int lex_number(jctx *c, size_t *pp, int after_dot) {
    const char *s = c->src;
    size_t n = c->src_len, i = *pp, start = i;
    char buf[64];
    size_t k = 0;
    int is_float = 0;
    while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1])))) {
        if (s[i] != '_' && k < sizeof buf - 1) buf[k++] = s[i];
        i++;
    }
    /* `x.0.1` is attribute access, not a float */
    if (!after_dot && i + 1 < n && s[i] == '.' && is_digit(s[i + 1])) {
        is_float = 1;
        buf[k < sizeof buf - 1 ? k++ : k] = '.';
        i++;
        while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1])))) {
            if (s[i] != '_' && k < sizeof buf - 1) buf[k++] = s[i];
            i++;
        }
    }
    if (!after_dot && i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        if (j < n && is_digit(s[j])) {
            is_float = 1;
            if (k < sizeof buf - 1) buf[k++] = 'e';
            if (s[i + 1] == '-' && k < sizeof buf - 1) buf[k++] = '-';
            for (i = j; i < n && is_digit(s[i]); i++)
                if (k < sizeof buf - 1) buf[k++] = s[i];
        }
    }
    buf[k] = 0;
    if (k >= sizeof buf - 1)
        return jfail(c, ELLM_ERR_FORMAT, (uint32_t)start, "number literal too long");
    jtok *t = push(c, is_float ? JT_FLOAT : JT_INT, (uint32_t)start);
    if (!t) return -1;
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        uint64_t v = 0;
        for (size_t d = 0; d < k; d++) {
            if (v > (UINT64_C(0x7FFFFFFFFFFFFFFF) - (uint64_t)(buf[d] - '0')) / 10)
                return jfail(c, ELLM_ERR_UNSUPPORTED, (uint32_t)start,
                             "integer literal does not fit in 64 bits");
            v = v * 10 + (uint64_t)(buf[d] - '0');
        }
        t->i = (int64_t)v;
    }
    *pp = i;
    return 0;
}

typedef struct {
    const char *text;
    uint8_t op;
} op_entry;

/* Longest first: "**" before "*", "//" before "/", "==" before "=". */
static const op_entry ops[] = {
    {"**", JOP_POW}, {"//", JOP_FLOORDIV}, {"==", JOP_EQ}, {"!=", JOP_NE}, {"<=", JOP_LE},
    {">=", JOP_GE},  {"+", JOP_ADD},       {"-", JOP_SUB}, {"*", JOP_MUL}, {"/", JOP_DIV},
    {"%", JOP_MOD},  {"~", JOP_TILDE},     {"<", JOP_LT},  {">", JOP_GT},  {"=", JOP_ASSIGN},
    {"(", JOP_LPAREN}, {")", JOP_RPAREN}, {"[", JOP_LBRACKET}, {"]", JOP_RBRACKET},
    {"{", JOP_LBRACE}, {"}", JOP_RBRACE}, {",", JOP_COMMA}, {".", JOP_DOT}, {":", JOP_COLON},
    {"|", JOP_PIPE},
};

/* Whitespace control requested by the tag that ends before the next text. */
enum { AFTER_NONE, AFTER_TRIM_NEWLINE, AFTER_STRIP_ALL };

/* Tokenizes the inside of a {{ }} or {% %} tag opened at `open` (contents from
 * *pp) up to its close, which it consumes; sets *after. */
static int lex_tag(jctx *c, size_t open, size_t *pp, int is_block, int *after) {
    const char *s = c->src;
    size_t n = c->src_len, i = *pp;
    int braces = 0; /* open `{` in a var tag: `}}` there closes a dict */
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i >= n)
            return jfail(c, ELLM_ERR_FORMAT, (uint32_t)open, "unterminated '%s' tag (no matching '%s')",
                         is_block ? "{%" : "{{", is_block ? "%}" : "}}");
        if (is_block) {
            int strip = s[i] == '-' && i + 2 < n && s[i + 1] == '%' && s[i + 2] == '}';
            int keep = s[i] == '+' && i + 2 < n && s[i + 1] == '%' && s[i + 2] == '}';
            if (strip || keep || (s[i] == '%' && i + 1 < n && s[i + 1] == '}')) {
                if (!push(c, JT_BLOCK_END, (uint32_t)i)) return -1;
                *after = strip ? AFTER_STRIP_ALL : keep ? AFTER_NONE : AFTER_TRIM_NEWLINE;
                *pp = i + (strip || keep ? 3 : 2);
                return 0;
            }
        } else if (braces == 0) {
            int strip = s[i] == '-' && i + 2 < n && s[i + 1] == '}' && s[i + 2] == '}';
            if (strip || (s[i] == '}' && i + 1 < n && s[i + 1] == '}')) {
                if (!push(c, JT_VAR_END, (uint32_t)i)) return -1;
                *after = strip ? AFTER_STRIP_ALL : AFTER_NONE;
                *pp = i + (strip ? 3 : 2);
                return 0;
            }
        }
        char ch = s[i];
        if (ch == '\'' || ch == '"') {
            if (lex_string(c, &i)) return -1;
            continue;
        }
        if (is_digit(ch)) {
            int after_dot = c->n_toks && c->toks[c->n_toks - 1].type == JT_OP &&
                            c->toks[c->n_toks - 1].op == JOP_DOT;
            if (lex_number(c, &i, after_dot)) return -1;
            continue;
        }
        if (is_name_start(ch)) {
            size_t start = i;
            while (i < n && (is_name_start(s[i]) || is_digit(s[i]))) i++;
            jtok *t = push(c, JT_NAME, (uint32_t)start);
            if (!t) return -1;
            t->s = s + start;
            t->n = i - start;
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            size_t len = strlen(ops[k].text);
            if (i + len <= n && memcmp(s + i, ops[k].text, len) == 0) break;
        }
        if (k == sizeof ops / sizeof ops[0]) {
            if ((unsigned char)ch < 0x20 || (unsigned char)ch >= 0x7F)
                return jfail(c, ELLM_ERR_FORMAT, (uint32_t)i, "unexpected byte 0x%02x in a tag",
                             (unsigned char)ch);
            return jfail(c, ELLM_ERR_FORMAT, (uint32_t)i, "unexpected character '%c'", ch);
        }
        jtok *t = push(c, JT_OP, (uint32_t)i);
        if (!t) return -1;
        t->op = ops[k].op;
        if (ops[k].op == JOP_LBRACE) braces++;
        if (ops[k].op == JOP_RBRACE && braces > 0) braces--;
        i += strlen(ops[k].text);
    }
}

/* Start of the next tag ({{, {%, {#) at or after i, or n. */
static size_t next_tag(const char *s, size_t n, size_t i) {
    while (i + 1 < n) {
        const char *q = memchr(s + i, '{', n - 1 - i);
        if (!q) return n;
        i = (size_t)(q - s);
        char c2 = s[i + 1];
        if (c2 == '{' || c2 == '%' || c2 == '#') return i;
        i++;
    }
    return n;
}

/* Emits the text [start, end) after trimming; empty text emits nothing. */
static int emit_text(jctx *c, size_t start, size_t end) {
    if (end <= start) return 0;
    jtok *t = push(c, JT_TEXT, (uint32_t)start);
    if (!t) return -1;
    t->s = c->src + start;
    t->n = end - start;
    return 0;
}

/* Where text [start, end) ends once the tag at `end` has applied its left
 * whitespace control: `-` strips all whitespace; lstrip_blocks (block and
 * comment tags without `+`) strips spaces and tabs back to a line start. */
static size_t left_trim(const jctx *c, size_t start, size_t end, char kind, char mod) {
    const char *s = c->src;
    if (mod == '-') {
        while (end > start && is_ws(s[end - 1])) end--;
    } else if ((kind == '%' || kind == '#') && mod != '+') {
        size_t k = end;
        while (k > start && (s[k - 1] == ' ' || s[k - 1] == '\t')) k--;
        if (k == 0 || s[k - 1] == '\n') end = k;
    }
    return end;
}

/* Finds the {% endraw %} ending a raw block whose body starts at i: *tag is
 * where it starts, *after just past its close, and mod_open / mod_close its
 * `-` or `+` modifiers (0 if none). Returns 0 if there is none. */
static int find_endraw(const jctx *c, size_t i, size_t *tag, size_t *after, char *mod_open,
                       char *mod_close) {
    const char *s = c->src;
    size_t n = c->src_len;
    for (;;) {
        i = next_tag(s, n, i);
        if (i >= n) return 0;
        size_t j = i + 2;
        if (s[i + 1] == '%') {
            char mo = j < n && (s[j] == '-' || s[j] == '+') ? s[j] : 0;
            if (mo) j++;
            while (j < n && is_ws(s[j])) j++;
            if (j + 6 <= n && memcmp(s + j, "endraw", 6) == 0) {
                j += 6;
                while (j < n && is_ws(s[j])) j++;
                char mc = j < n && (s[j] == '-' || s[j] == '+') ? s[j] : 0;
                if (mc) j++;
                if (j + 1 < n && s[j] == '%' && s[j + 1] == '}') {
                    *tag = i;
                    *after = j + 2;
                    *mod_open = mo;
                    *mod_close = mc;
                    return 1;
                }
            }
        }
        i++;
    }
}

int jinja_lex(jctx *c) {
    const char *s = c->src;
    size_t n = c->src_len;
    /* keep_trailing_newline=False: one final newline of the template goes */
    if (n > 0 && s[n - 1] == '\n') n--;
    size_t saved_len = c->src_len;
    c->src_len = n;
    size_t i = 0;
    int after = AFTER_NONE;
    int rc = 0;
    while (i < n) {
        size_t start = i;
        if (after == AFTER_STRIP_ALL)
            while (start < n && is_ws(s[start])) start++;
        else if (after == AFTER_TRIM_NEWLINE && start < n && s[start] == '\n')
            start++;
        else if (after == AFTER_TRIM_NEWLINE && start + 1 < n && s[start] == '\r' && s[start + 1] == '\n')
            start += 2;
        after = AFTER_NONE;
        size_t tag = next_tag(s, n, start);
        if (tag >= n) {
            rc = emit_text(c, start, n);
            break;
        }
        char kind = s[tag + 1];
        char mod = tag + 2 < n ? s[tag + 2] : 0;
        /* `+` only modifies block and comment tags; `{{+x}}` is unary plus */
        if (mod != '-' && (mod != '+' || kind == '{')) mod = 0;
        if ((rc = emit_text(c, start, left_trim(c, start, tag, kind, mod)))) break;
        size_t body = tag + 2 + (mod ? 1 : 0);
        if (kind == '#') {
            size_t j = body;
            while (j + 1 < n && !(s[j] == '#' && s[j + 1] == '}')) j++;
            if (j + 1 >= n) {
                rc = jfail(c, ELLM_ERR_FORMAT, (uint32_t)tag, "unterminated comment (no matching '#}')");
                break;
            }
            char close_mod = j > body && (s[j - 1] == '-' || s[j - 1] == '+') ? s[j - 1] : 0;
            after = close_mod == '-' ? AFTER_STRIP_ALL : close_mod == '+' ? AFTER_NONE : AFTER_TRIM_NEWLINE;
            i = j + 2;
            continue;
        }
        int is_block = kind == '%';
        size_t first = c->n_toks;
        if (!push(c, is_block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, (uint32_t)tag)) {
            rc = -1;
            break;
        }
        i = body;
        if ((rc = lex_tag(c, tag, &i, is_block, &after))) break;
        /* {% raw %}: the body up to {% endraw %} is text, uninterpreted. */
        if (is_block && c->n_toks == first + 3 && c->toks[first + 1].type == JT_NAME &&
            c->toks[first + 1].n == 3 && memcmp(c->toks[first + 1].s, "raw", 3) == 0) {
            c->n_toks = first;
            size_t etag, eafter;
            char mo, mc;
            if (!find_endraw(c, i, &etag, &eafter, &mo, &mc)) {
                rc = jfail(c, ELLM_ERR_FORMAT, (uint32_t)tag, "'raw' block without '{%% endraw %%}'");
                break;
            }
            size_t rstart = i;
            if (after == AFTER_STRIP_ALL)
                while (rstart < etag && is_ws(s[rstart])) rstart++;
            else if (after == AFTER_TRIM_NEWLINE && rstart < etag && s[rstart] == '\n')
                rstart++;
            if ((rc = emit_text(c, rstart, left_trim(c, rstart, etag, '%', mo)))) break;
            after = mc == '-' ? AFTER_STRIP_ALL : mc == '+' ? AFTER_NONE : AFTER_TRIM_NEWLINE;
            i = eafter;
        }
    }
    c->src_len = saved_len;
    if (rc) return -1;
    return push(c, JT_EOF, (uint32_t)n) ? 0 : -1;
}
