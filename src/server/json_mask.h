/* JSON mode (`response_format: {"type": "json_object"}`): a byte-level
 * recognizer of JSON text (RFC 8259) whose top-level value is an object,
 * and the mask of the tokens that keep a reply on it.
 *
 * The recognizer accepts exactly the prefixes of such texts, with blanks
 * between tokens capped (JSON_MAX_BLANKS in a row: a model cannot pad a
 * reply with whitespace forever) and nesting capped at JSON_MAX_DEPTH.
 * Strings take any UTF-8 (bytes of a character may come in different
 * tokens) and the escapes JSON has. Once the object closes, only the end of
 * the reply may follow. Pure functions: no model, no HTTP. */
#ifndef ELLM_SERVER_JSON_MASK_H
#define ELLM_SERVER_JSON_MASK_H

#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 32
#define JSON_MAX_BLANKS 16

typedef struct {
    uint8_t stack[JSON_MAX_DEPTH]; /* '{' or '[' per open container */
    uint8_t depth;
    uint8_t state;   /* where in the grammar (json_mask.c) */
    uint8_t sub;     /* inside a token: literal position, hex digits left, number part */
    uint8_t blanks;  /* blanks in a row */
    uint8_t utf8;    /* continuation bytes a string's character still needs */
    uint8_t done;    /* the top-level object is closed */
} json_state;

/* The state before the first byte. */
void json_state_init(json_state *st);
/* Feeds n bytes: 1 if the text so far is still a prefix of a JSON object
 * text (st advanced), 0 if not (st then undefined). */
int json_feed(json_state *st, const char *bytes, size_t n);

/* The tokens allowed next: allow[i] = 1 if token i's bytes (bytes(arg, i,
 * &len); NULL or empty: a control token) keep the reply a prefix, and the
 * end-of-generation tokens (is_eog) exactly when the object is closed.
 * Returns how many are allowed. */
int json_allowed(const json_state *st, int n_vocab, const char *(*bytes)(const void *arg, int32_t id, size_t *len),
                 int (*is_eog)(const void *arg, int32_t id), const void *arg, uint8_t *allow);

#endif
