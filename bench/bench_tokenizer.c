/* Tokenizer throughput: MB/s encoding ~10 MB of mixed text with each tokenizer
 * given, single-threaded, best of several runs; and MB/s streaming the ids back
 * through the detokenizer. Not a test.
 *
 *   make bench && build/bench/bench_tokenizer [-s MB] [-r RUNS] [-o TEXT_OUT] [TOKENIZER ...]
 *
 * TOKENIZER is anything ellm_tokenizer_load reads (GGUF, tokenizer.json or its
 * folder); by default the llama-bpe and qwen2 vocabularies and the llama3 and
 * qwen3 tokenizer.json files under tests/data (run from the top of the tree).
 * The text cycles through Python source (tests/data/heldout-sample.txt), the
 * README (English prose), tokenizer_config.json files (JSON with Jinja
 * templates) and llama.cpp's tokenizer test strings (many scripts, emoji, odd
 * whitespace), cut to -s MB (default 10) at a character boundary. -o writes that text to a file, so
 * that bench/llamacpp_tokenize.mjs can encode exactly the same bytes; both print an FNV-1a hash of
 * the ids to compare. Times are CPU time of the thread, which on a shared machine tracks the
 * tokenizer's own work better than wall time. */
#include "ellm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU time of this thread, in seconds. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = (size_t)n;
    }
    return buf;
}

/* The mixed text: the source files in turn, repeated up to `target` bytes and
 * cut before an incomplete character. llama.cpp's test-string separators
 * become blank lines. */
static char *build_text(size_t target, size_t *len) {
    static const char *const files[] = {
        "tests/data/heldout-sample.txt",
        "README.md",
        "tests/data/vocab/ggml-vocab-llama-bpe.gguf.inp",
        "tests/data/hf/qwen3/tokenizer_config.json",
        "tests/data/vocab/ggml-vocab-qwen35.gguf.inp",
        "tests/data/hf/llama3/tokenizer_config.json",
        "tests/data/vocab/ggml-vocab-deepseek-llm.gguf.inp",
    };
    const size_t n_files = sizeof(files) / sizeof(files[0]);
    char *part[sizeof(files) / sizeof(files[0])];
    size_t part_len[sizeof(files) / sizeof(files[0])], total = 0;
    for (size_t i = 0; i < n_files; i++) {
        part[i] = read_file(files[i], &part_len[i]);
        if (!part[i]) {
            fprintf(stderr, "bench_tokenizer: cannot read %s (run from the top of the tree)\n",
                    files[i]);
            exit(1);
        }
        const char *sep = "\n__ggml_vocab_test__\n";
        size_t w = 0, sl = strlen(sep);
        for (size_t r = 0; r < part_len[i];) {
            if (r + sl <= part_len[i] && !memcmp(part[i] + r, sep, sl)) {
                part[i][w++] = '\n';
                part[i][w++] = '\n';
                r += sl;
            } else {
                part[i][w++] = part[i][r++];
            }
        }
        part_len[i] = w;
        total += part_len[i];
    }
    char *text = malloc(target + total + 1);
    size_t n = 0;
    for (size_t k = 0; n < target; k = (k + 1) % n_files) {
        memcpy(text + n, part[k], part_len[k]);
        n += part_len[k];
    }
    n = target;
    while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80) n--; /* start of a character */
    text[n] = 0;
    for (size_t i = 0; i < n_files; i++) free(part[i]);
    *len = n;
    return text;
}

static void bench_one(const char *path, const char *text, size_t len, int runs) {
    ellm_tokenizer *tok = NULL;
    ellm_error err = {0};
    double t0 = now_s();
    if (ellm_tokenizer_load(path, &tok, &err) != ELLM_OK) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        return;
    }
    double load_s = now_s() - t0;
    int n = 0;
    ellm_tokenizer_encode(tok, text, len, 0, 0, NULL, 0, &n, &err);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof(int32_t));
    double best = 1e30;
    for (int r = 0; r < runs; r++) {
        t0 = now_s();
        ellm_status st = ellm_tokenizer_encode(tok, text, len, 0, 0, ids, n, &n, &err);
        double dt = now_s() - t0;
        if (st != ELLM_OK) {
            fprintf(stderr, "%s: %s\n", path, err.msg);
            break;
        }
        if (dt < best) best = dt;
    }
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < 4; b++) {
            h ^= ((uint32_t)ids[i] >> (8 * b)) & 0xFF;
            h *= 16777619u;
        }
    }
    /* Detokenize the whole stream; it must give the text back. */
    size_t cap = ellm_tokenizer_max_token_bytes(tok) + 64;
    char *out = malloc(len + cap + 64);
    size_t w = 0;
    ellm_detok d = {0};
    t0 = now_s();
    for (int i = 0; i < n; i++)
        w += (size_t)ellm_tokenizer_detok_push(tok, &d, ids[i], out + w, cap);
    w += (size_t)ellm_detok_flush(&d, out + w, cap);
    double dt_detok = now_s() - t0;
    int same = w == len && memcmp(out, text, len) == 0;
    printf("%-44s load %6.0f ms  encode %6.2f MB/s (%.3f s, %d tokens, %.2f bytes/token)  "
           "detok %6.1f MB/s%s  ids fnv1a %08x\n",
           path, load_s * 1e3, len / 1e6 / best, best, n, (double)len / n, len / 1e6 / dt_detok,
           same ? "" : " (TEXT DIFFERS)", h);
    free(out);
    free(ids);
    ellm_tokenizer_free(tok);
}

int main(int argc, char **argv) {
    double mb = 10;
    int runs = 3;
    const char *text_out = NULL;
    const char *paths[64];
    int n_paths = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-s") && i + 1 < argc)
            mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-o") && i + 1 < argc)
            text_out = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr,
                    "usage: bench_tokenizer [-s MB] [-r RUNS] [-o TEXT_OUT] [TOKENIZER ...]\n");
            return 2;
        } else if (n_paths < 64)
            paths[n_paths++] = argv[i];
    }
    if (mb <= 0 || runs < 1) {
        fprintf(stderr, "bench_tokenizer: -s and -r must be positive\n");
        return 2;
    }
    if (n_paths == 0) {
        paths[n_paths++] = "tests/data/vocab/ggml-vocab-llama-bpe.gguf";
        paths[n_paths++] = "tests/data/vocab/ggml-vocab-qwen2.gguf";
        paths[n_paths++] = "tests/data/hf/llama3/tokenizer.json";
        paths[n_paths++] = "tests/data/hf/qwen3/tokenizer.json";
    }
    size_t len;
    char *text = build_text((size_t)(mb * 1e6), &len);
    printf("text: %.2f MB of mixed code, prose and multilingual test strings; best of %d runs\n",
           len / 1e6, runs);
    if (text_out) {
        FILE *f = fopen(text_out, "wb");
        if (!f || fwrite(text, 1, len, f) != len) {
            fprintf(stderr, "bench_tokenizer: cannot write %s\n", text_out);
            return 1;
        }
        fclose(f);
    }
    for (int i = 0; i < n_paths; i++) bench_one(paths[i], text, len, runs);
    free(text);
    return 0;
}
