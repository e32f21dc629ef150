/* Checks shared by the tokenizer fuzz targets: what must hold for any input,
 * beyond not crashing (AddressSanitizer and UBSan catch the rest). A failed
 * check aborts, which libFuzzer reports with the input. */
#ifndef ELLM_FUZZ_COMMON_H
#define ELLM_FUZZ_COMMON_H

#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz check failed: %s: ", #cond);                                     \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Splits an input at its first NUL byte, for targets that read two texts
 * (tokenizer.json, then tokenizer_config.json): returns the first's length
 * and sets *second / *second_len to what follows the NUL (NULL, 0 without
 * one). */
static inline size_t fuzz_split_nul(const uint8_t *data, size_t size, const char **second, size_t *second_len) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - data) : size;
    *second = nul ? (const char *)nul + 1 : NULL;
    *second_len = nul ? size - len - 1 : 0;
    return len;
}

/* Whether s[0, n) is UTF-8 made of whole characters only. */
static inline int fuzz_whole_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF5 ? 0 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (k == 0 || i + k > n) return 0;
        for (size_t j = 1; j < k; j++) {
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
        }
        i += k;
    }
    return 1;
}

/* Encodes text (sizing call first, then the real one), checks the ids and
 * streams them back. Returns the decoded text (malloc'ed, *out_len bytes) or
 * NULL when encoding refused the input. */
static inline char *fuzz_encode_decode(const tokenizer *t, const char *text, size_t len,
                                       int add_bos, int parse_special, size_t *out_len) {
    ellm_error err = {0};
    int need = -1;
    ellm_status st = tokenizer_encode(t, text, len, add_bos, parse_special, NULL, 0, &need, &err);
    if (st != ELLM_OK && st != ELLM_ERR_ARG) {
        FUZZ_CHECK(err.msg[0] != 0, "a refusal leaves a message");
        return NULL;
    }
    FUZZ_CHECK(need >= 0 && (st == ELLM_OK) == (need == 0), "sizing: status %d, %d ids", (int)st,
               need);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof(int32_t));
    int n = -1;
    st = tokenizer_encode(t, text, len, add_bos, parse_special, ids, need, &n, &err);
    FUZZ_CHECK(st == ELLM_OK && n == need, "second encode: status %d, %d ids of %d", (int)st, n,
               need);
    for (int i = 0; i < n; i++) {
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(t), "id %d out of range", ids[i]);
    }
    size_t step = tokenizer_max_token_bytes(t) + 8;
    if (step < 64) step = 64;
    char *out = malloc(step * ((size_t)n + 1));
    size_t w = 0;
    ellm_detok d = {0};
    for (int i = 0; i < n; i++) {
        int k = tokenizer_detok_push(t, &d, ids[i], out + w, step);
        FUZZ_CHECK(k >= 0 && (size_t)k <= step && fuzz_whole_utf8(out + w, (size_t)k),
                   "detok push wrote %d bytes, not whole characters", k);
        w += (size_t)k;
        tokenizer_is_eog(t, ids[i]);
    }
    w += (size_t)tokenizer_detok_flush(&d, out + w, step);
    free(ids);
    *out_len = w;
    return out;
}

#endif
