/* Shared by the tokenizer tests: paths under tests/data and the llama.cpp
 * golden-vector format (.inp strings separated by SEP, .out one line of
 * space-separated ids per string). */
#ifndef ELLM_TESTS_VOCAB_VECTORS_H
#define ELLM_TESTS_VOCAB_VECTORS_H

#include "harness.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static char path_buf[1024];

/* tests/data/<rel> (a static buffer: valid until the next call). */
static const char *data_path(const char *rel) {
    snprintf(path_buf, sizeof(path_buf), "%s/%s", test_data_dir(), rel);
    return path_buf;
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
