/* Streaming detokenization: token ids in, UTF-8 text out, never half a
 * character. A token's bytes (its precomputed piece, see token_piece in
 * tokenizer.c) are appended to the bytes held back from earlier tokens; every
 * complete character is written, a valid but incomplete sequence at the end
 * is held in the ellm_detok state (at most 3 bytes), and each invalid
 * sequence becomes U+FFFD (one per maximal invalid subpart, as the Unicode
 * standard recommends and as most decoders do).
 *
 * Output size: a piece of valid UTF-8 writes at most its length plus 3 bytes
 * (the held-back bytes, or a U+FFFD in their place); invalid bytes may take 3
 * bytes each. `cap` >= 64 covers the pieces of the usual SentencePiece
 * vocabularies (48 bytes at most); byte-level BPE vocabularies have longer
 * ones (runs of spaces or dashes, up to 512 bytes), for which
 * tokenizer_max_token_bytes() + 8 is enough. Should the output need more
 * than `cap`, it is cut at a character boundary and the rest is dropped. */
#include "tokenizer/tokenizer_impl.h"

#include <string.h>

static const char replacement[3] = {'\xef', '\xbf', '\xbd'}; /* U+FFFD */

/* Bytes of a stream that is the held-back bytes followed by a piece. */
typedef struct {
    const uint8_t *pending;
    size_t n_pending;
    const uint8_t *piece;
    size_t n;
} byte_stream;

static uint8_t stream_at(const byte_stream *s, size_t i) {
    return i < s->n_pending ? s->pending[i] : s->piece[i - s->n_pending];
}

/* Appends `n` bytes to out if they fit. Returns 0 when out is full. */
static int put(char *out, size_t cap, size_t *w, const char *src, size_t n) {
    if (*w + n > cap) return 0;
    memcpy(out + *w, src, n);
    *w += n;
    return 1;
}

/* Decodes `s` into out; a valid incomplete sequence at the very end goes to
 * state->pending. Returns the bytes written. */
static size_t decode_stream(ellm_detok *state, const byte_stream *s, char *out, size_t cap) {
    size_t total = s->n_pending + s->n, i = 0, w = 0;
    uint8_t tail[4];
    size_t n_tail = 0;
    while (i < total) {
        uint8_t b0 = stream_at(s, i);
        if (b0 < 0x80) {
            char c = (char)b0;
            if (!put(out, cap, &w, &c, 1)) break;
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (b0 >= 0xC2 && b0 <= 0xDF) {
            need = 2;
        } else if (b0 >= 0xE0 && b0 <= 0xEF) {
            need = 3;
            if (b0 == 0xE0) lo = 0xA0;
            if (b0 == 0xED) hi = 0x9F;
        } else if (b0 >= 0xF0 && b0 <= 0xF4) {
            need = 4;
            if (b0 == 0xF0) lo = 0x90;
            if (b0 == 0xF4) hi = 0x8F;
        } else {
            if (!put(out, cap, &w, replacement, 3)) break;
            i++;
            continue;
        }
        size_t k = 1;
        while (k < need && i + k < total) {
            uint8_t b = stream_at(s, i + k);
            uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
            if (b < l || b > h) break;
            k++;
        }
        if (k == need) {
            char buf[4];
            for (size_t j = 0; j < need; j++) buf[j] = (char)stream_at(s, i + j);
            if (!put(out, cap, &w, buf, need)) break;
            i += need;
        } else if (i + k == total) {
            /* Valid so far and cut by the end of the data: hold it back. */
            for (size_t j = 0; j < k; j++) tail[j] = stream_at(s, i + j);
            n_tail = k;
            i = total;
        } else {
            if (!put(out, cap, &w, replacement, 3)) break;
            i += k;
        }
    }
    memcpy(state->pending, tail, n_tail);
    state->n_pending = (int)n_tail;
    return w;
}

int tokenizer_detok_push(const tokenizer *t, ellm_detok *state, int32_t id, char *out, size_t cap) {
    if (!t || !state || !out) return 0;
    if (state->n_pending < 0 || state->n_pending > 3) state->n_pending = 0; /* corrupt state */
    const char *piece = "";
    size_t n = 0;
    if (id >= 0 && id < t->n_vocab) {
        piece = t->piece + t->piece_off[id];
        n = t->piece_off[id + 1] - t->piece_off[id];
    }
    /* The space prefix the encoder added shows as the first piece's leading
     * space; llama.cpp's detokenizer drops it only for the very first token. */
    if (state->n_emitted == 0 && t->add_space_prefix && n > 0 && piece[0] == ' ') {
        piece++;
        n--;
    }
    if (state->n_emitted < 0x7fffffff) state->n_emitted++;
    uint8_t held[4];
    memcpy(held, state->pending, (size_t)state->n_pending);
    byte_stream s = {held, (size_t)state->n_pending, (const uint8_t *)piece, n};
    return (int)decode_stream(state, &s, out, cap);
}

int tokenizer_detok_flush(ellm_detok *state, char *out, size_t cap) {
    if (!state || !out) return 0;
    int had = state->n_pending > 0;
    state->n_pending = 0;
    if (!had || cap < 3) return 0;
    /* A held-back sequence is a valid prefix: one maximal subpart, one U+FFFD. */
    memcpy(out, replacement, 3);
    return 3;
}
