/* JSON mode: the recognizer and the token mask (json_mask.h). */
#include "server/json_mask.h"

#include <string.h>

enum {
    S_TOP,        /* before the top-level object: '{' */
    S_VALUE,      /* a value: after ':' or an array's ',' */
    S_OBJ_FIRST,  /* after '{': a key or '}' */
    S_OBJ_KEY,    /* after an object's ',': a key */
    S_COLON,      /* after a key: ':' */
    S_ARR_FIRST,  /* after '[': a value or ']' */
    S_AFTER,      /* after a value in a container: ',' or its closer */
    S_KEY_STR,    /* inside a key */
    S_VAL_STR,    /* inside a string value */
    S_NUMBER,     /* inside a number (sub: N_*) */
    S_LITERAL,    /* inside true / false / null (sub: literal index x 8 + position) */
    S_DONE        /* the object is closed: blanks only */
};
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
/* string sub: 0 plain, 1 after '\', 2..5 hex digits of \u left + 1 */

static const char *const LITERALS[3] = {"true", "false", "null"};

void json_state_init(json_state *st) {
    memset(st, 0, sizeof *st);
    st->state = S_TOP;
}

static int blank(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static int digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int hex(unsigned char c) { return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* A value has ended: the container's next expectation. */
static void value_done(json_state *st) { st->state = S_AFTER; }

/* Starts a value at byte c (S_VALUE or S_ARR_FIRST); 0 if c cannot. */
static int start_value(json_state *st, unsigned char c) {
    if (c == '{' || c == '[') {
        if (st->depth == JSON_MAX_DEPTH) return 0;
        st->stack[st->depth++] = c;
        st->state = c == '{' ? S_OBJ_FIRST : S_ARR_FIRST;
        return 1;
    }
    if (c == '"') {
        st->state = S_VAL_STR;
        st->sub = 0;
        return 1;
    }
    if (c == '-' || digit(c)) {
        st->state = S_NUMBER;
        st->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        return 1;
    }
    for (int i = 0; i < 3; i++)
        if (c == (unsigned char)LITERALS[i][0]) {
            st->state = S_LITERAL;
            st->sub = (uint8_t)(i * 8 + 1);
            return 1;
        }
    return 0;
}

/* Closes the innermost container with c ('}' or ']'); 0 if it is the other kind. */
static int close_container(json_state *st, unsigned char c) {
    if (!st->depth || st->stack[st->depth - 1] != (c == '}' ? '{' : '[')) return 0;
    st->depth--;
    if (st->depth == 0) {
        st->state = S_DONE;
        st->done = 1;
    } else {
        value_done(st);
    }
    return 1;
}

/* One byte of a string (key or value); 0 if not JSON. */
static int string_byte(json_state *st, unsigned char c) {
    if (st->utf8) { /* a character's continuation bytes */
        if ((c & 0xC0) != 0x80) return 0;
        st->utf8--;
        return 1;
    }
    if (st->sub == 1) { /* after a backslash */
        if (c == 'u') st->sub = 5;
        else if (strchr("\"\\/bfnrt", c) && c) st->sub = 0;
        else return 0;
        return 1;
    }
    if (st->sub >= 2) { /* \u hex digits */
        if (!hex(c)) return 0;
        st->sub = st->sub == 2 ? 0 : (uint8_t)(st->sub - 1);
        return 1;
    }
    if (c == '"') {
        if (st->state == S_KEY_STR) st->state = S_COLON;
        else value_done(st);
        return 1;
    }
    if (c == '\\') {
        st->sub = 1;
        return 1;
    }
    if (c < 0x20) return 0; /* control characters must be escaped */
    if (c < 0x80) return 1;
    /* a UTF-8 lead byte: its continuation bytes follow (possibly in the next tokens) */
    if (c >= 0xC2 && c <= 0xDF) st->utf8 = 1;
    else if (c >= 0xE0 && c <= 0xEF) st->utf8 = 2;
    else if (c >= 0xF0 && c <= 0xF4) st->utf8 = 3;
    else return 0;
    return 1;
}

/* One byte of a number; *again set when c ended it and must be read by the container. */
static int number_byte(json_state *st, unsigned char c, int *again) {
    switch (st->sub) {
    case N_MINUS:
        if (!digit(c)) return 0;
        st->sub = c == '0' ? N_ZERO : N_INT;
        return 1;
    case N_DOT:
        if (!digit(c)) return 0;
        st->sub = N_FRAC;
        return 1;
    case N_E:
        if (c == '+' || c == '-') st->sub = N_ESIGN;
        else if (digit(c)) st->sub = N_EXP;
        else return 0;
        return 1;
    case N_ESIGN:
        if (!digit(c)) return 0;
        st->sub = N_EXP;
        return 1;
    default: break;
    }
    /* N_ZERO, N_INT, N_FRAC, N_EXP: the number may end here */
    if (digit(c) && st->sub != N_ZERO) return 1;
    if (c == '.' && (st->sub == N_ZERO || st->sub == N_INT)) {
        st->sub = N_DOT;
        return 1;
    }
    if ((c == 'e' || c == 'E') && st->sub != N_EXP) {
        st->sub = N_E;
        return 1;
    }
    value_done(st);
    *again = 1;
    return 1;
}

static int feed_byte(json_state *st, unsigned char c) {
    for (;;) {
        int again = 0;
        switch (st->state) {
        case S_KEY_STR:
        case S_VAL_STR: return string_byte(st, c);
        case S_NUMBER:
            if (!number_byte(st, c, &again)) return 0;
            if (again) continue;
            return 1;
        case S_LITERAL: {
            const char *lit = LITERALS[st->sub / 8];
            const int pos = st->sub % 8;
            if (c != (unsigned char)lit[pos]) return 0;
            if (lit[pos + 1] == 0) value_done(st);
            else st->sub++;
            return 1;
        }
        default: break;
        }
        if (blank(c)) {
            if (st->blanks == JSON_MAX_BLANKS) return 0;
            st->blanks++;
            return 1;
        }
        st->blanks = 0;
        switch (st->state) {
        case S_TOP:
            if (c != '{') return 0;
            st->stack[st->depth++] = '{';
            st->state = S_OBJ_FIRST;
            return 1;
        case S_OBJ_FIRST:
            if (c == '}') return close_container(st, c);
            /* fall through */
        case S_OBJ_KEY:
            if (c != '"') return 0;
            st->state = S_KEY_STR;
            st->sub = 0;
            return 1;
        case S_COLON:
            if (c != ':') return 0;
            st->state = S_VALUE;
            return 1;
        case S_ARR_FIRST:
            if (c == ']') return close_container(st, c);
            /* fall through */
        case S_VALUE: return start_value(st, c);
        case S_AFTER:
            if (c == ',') {
                st->state = st->stack[st->depth - 1] == '{' ? S_OBJ_KEY : S_VALUE;
                return 1;
            }
            if (c == '}' || c == ']') return close_container(st, c);
            return 0;
        default: return 0; /* S_DONE: nothing but blanks */
        }
    }
}

int json_feed(json_state *st, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(st, (unsigned char)bytes[i])) return 0;
    return 1;
}

int json_allowed(const json_state *st, int n_vocab, const char *(*bytes)(const void *arg, int32_t id, size_t *len),
                 int (*is_eog)(const void *arg, int32_t id), const void *arg, uint8_t *allow) {
    int n = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        size_t len = 0;
        const char *b = bytes(arg, i, &len);
        int ok;
        if (is_eog(arg, i)) {
            ok = st->done;
        } else if (!b || !len || st->done) {
            ok = 0; /* control tokens never; after the object only the end */
        } else {
            json_state t = *st;
            ok = json_feed(&t, b, len);
        }
        allow[i] = (uint8_t)ok;
        n += ok;
    }
    return n;
}
