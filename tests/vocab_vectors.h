/* Shared by the tokenizer tests: paths under tests/data and the llama.cpp
 * golden-vector format (.inp strings separated by SEP, .out one line of
 * space-separated ids per string). */
#ifndef ELLM_TESTS_VOCAB_VECTORS_H
#define ELLM_TESTS_VOCAB_VECTORS_H

#include "harness.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Encodes into a malloc'ed array (*n ids); NULL on error (status in
 * *st_out). A size query with no room must fail whenever there are ids. */
static int32_t *encode(const tokenizer *t, const char *s, size_t len, int bos, int special, int *n,
                       ellm_status *st_out) {
    ellm_error err = {0};
    int need = 0;
    ellm_status st = tokenizer_encode(t, s, len, bos, special, NULL, 0, &need, &err);
    if (st != ELLM_OK && st != ELLM_ERR_ARG) {
        if (st_out) *st_out = st;
        return NULL;
    }
    if (st == ELLM_OK && need != 0) {
        if (st_out) *st_out = ELLM_ERR_ARG; /* cap 0 with tokens must fail */
        return NULL;
    }
    int32_t *ids = malloc(((size_t)need + 1) * sizeof(int32_t));
    st = tokenizer_encode(t, s, len, bos, special, ids, need, n, &err);
    if (st_out) *st_out = st;
    if (st != ELLM_OK) {
        free(ids);
        return NULL;
    }
    return ids;
}

/* Parses whitespace-separated ids of one line into a malloc'ed array. */
static int32_t *parse_ids(const char *line, size_t len, int *n) {
    int32_t *ids = malloc((len / 2 + 2) * sizeof(int32_t));
    int k = 0;
    size_t i = 0;
    while (i < len) {
        while (i < len && (line[i] == ' ' || line[i] == '\r')) i++;
        if (i >= len) break;
        long v = 0;
        while (i < len && line[i] >= '0' && line[i] <= '9') v = v * 10 + (line[i++] - '0');
        ids[k++] = (int32_t)v;
        while (i < len && line[i] != ' ' && (line[i] < '0' || line[i] > '9')) i++;
    }
    *n = k;
    return ids;
}

static const char *const SEP = "\n__ggml_vocab_test__\n";

#endif
