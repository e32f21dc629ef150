/* Command-line parsing helpers. */
#include "cli/args.h"
#include "ellm.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int arg_value(int argc, char **argv, int *i, const char *flag, const char *alt, const char **val,
              int *bad) {
    const char *a = argv[*i];
    size_t fl = strlen(flag);
    if (!strncmp(a, flag, fl) && a[fl] == '=') { /* --flag=value */
        *val = a + fl + 1;
        return 1;
    }
    if (strcmp(a, flag) && (!alt || strcmp(a, alt))) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "error: %s needs a value\n", a);
        *bad = 1;
        *val = NULL;
        return 1;
    }
    *val = argv[++*i];
    return 1;
}

int arg_int(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "error: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

int arg_double(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "error: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

int arg_u64(const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-') {
        fprintf(stderr, "error: %s expects a non-negative integer, got '%s'\n", flag, s);
        return 0;
    }
    *out = v;
    return 1;
}

int arg_kv_type(const char *flag, const char *s, int *type) {
    for (int t = 0; t < 3; t++)
        if (!strcmp(s, ellm_kv_type_name((ellm_kv_type)t))) {
            *type = t;
            return 1;
        }
    fprintf(stderr, "error: %s expects f16, f32 or q8_0, got '%s'\n", flag, s);
    return 0;
}

int arg_kv_types_parse(int argc, char **argv, int *i, arg_kv_types *t, int *bad) {
    const char *a = argv[*i], *v = NULL;
    int *slot = NULL;
    if (arg_value(argc, argv, i, "--kv-type", NULL, &v, bad)) slot = &t->kv;
    else if (arg_value(argc, argv, i, "--cache-type-k", "-ctk", &v, bad)) slot = &t->k;
    else if (arg_value(argc, argv, i, "--cache-type-v", "-ctv", &v, bad)) slot = &t->v;
    else return 0;
    *bad = !v || !arg_kv_type(a, v, slot);
    return 1;
}

int arg_rope_parse(int argc, char **argv, int *i, ellm_rope_params *r, int *bad) {
    const char *a = argv[*i], *v = NULL;
    double x = 0;
    long n = 0;
    if (arg_value(argc, argv, i, "--rope-scaling", NULL, &v, bad)) {
        *bad = !v || (strcmp(v, "none") && strcmp(v, "linear") && strcmp(v, "yarn"));
        if (v && *bad) fprintf(stderr, "error: %s '%s': expected none, linear or yarn\n", a, v);
        r->type = v;
    } else if (arg_value(argc, argv, i, "--rope-scale", NULL, &v, bad)) {
        *bad = !v || !arg_double(a, v, 1e-6, 1e6, &x);
        r->factor = (float)x;
    } else if (arg_value(argc, argv, i, "--rope-freq-scale", NULL, &v, bad)) {
        *bad = !v || !arg_double(a, v, 1e-6, 1e6, &x);
        r->factor = (float)(1.0 / x);
    } else if (arg_value(argc, argv, i, "--rope-freq-base", NULL, &v, bad)) {
        *bad = !v || !arg_double(a, v, 1e-6, 1e12, &x);
        r->freq_base = (float)x;
    } else if (arg_value(argc, argv, i, "--yarn-orig-ctx", NULL, &v, bad)) {
        *bad = !v || !arg_int(a, v, 1, 1L << 30, &n);
        r->orig_ctx = (int)n;
    } else {
        return 0;
    }
    return 1;
}

int arg_kv_types_resolve(const arg_kv_types *t, int *type) {
    const int k = t->k >= 0 ? t->k : ELLM_KV_F16, v = t->v >= 0 ? t->v : ELLM_KV_F16;
    if ((t->k >= 0 || t->v >= 0) && k != v) {
        fprintf(stderr, "error: eLLM keeps keys and values in one type: --cache-type-k %s and --cache-type-v %s "
                        "differ (give both the same, or --kv-type)\n",
                ellm_kv_type_name((ellm_kv_type)k), ellm_kv_type_name((ellm_kv_type)v));
        return 0;
    }
    if (t->kv >= 0 && (t->k >= 0 || t->v >= 0) && t->kv != k) {
        fprintf(stderr, "error: --kv-type %s and --cache-type-k/-v %s differ\n",
                ellm_kv_type_name((ellm_kv_type)t->kv), ellm_kv_type_name((ellm_kv_type)k));
        return 0;
    }
    *type = t->kv >= 0 ? t->kv : k;
    return 1;
}

int arg_int_list(const char *flag, const char *s, long lo, long hi, int *out, int max) {
    int n = 0;
    char *dup = strdup(s), *save = NULL;
    if (!dup) return -1;
    for (char *p = strtok_r(dup, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        long v;
        if (n == max || !arg_int(flag, p, lo, hi, &v)) {
            if (n == max) fprintf(stderr, "error: %s: at most %d values\n", flag, max);
            free(dup);
            return -1;
        }
        out[n++] = (int)v;
    }
    free(dup);
    return n;
}

int arg_numa(const char *flag, const char *s, int *mode) {
    static const char *const names[] = {"off", "distribute", "replicate", "interleave"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *mode = i; /* the order of ellm_numa_mode */
            return 1;
        }
    fprintf(stderr, "error: %s expects off, distribute, replicate or interleave, got '%s'\n", flag, s);
    return 0;
}

char *cli_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        free(buf);
        fprintf(stderr, "error: cannot read '%s'\n", path);
        return NULL;
    }
    buf[n] = 0;
    if (size) *size = n;
    return buf;
}

int32_t *cli_tokenize_file(ellm_model *m, const char *path, int add_bos, int *n_ids) {
    size_t len = 0;
    char *text = cli_read_file(path, &len);
    if (!text) return NULL;
    int cap = (int)(len + 16); /* at most one token per byte, plus BOS */
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    ellm_error err = {0};
    if (!ids || ellm_tokenize(m, text, len, add_bos, 0, ids, cap, n_ids, &err) != ELLM_OK) {
        fprintf(stderr, "error: cannot tokenize '%s': %s\n", path, ids ? err.msg : "out of memory");
        free(ids);
        ids = NULL;
    }
    free(text);
    return ids;
}

const char *cli_default_model(void) {
    static char path[PATH_MAX + 32];
    const char *env = getenv("ELLM_MODEL");
    if (env && *env) return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0; /* .../build */
            slash = strrchr(exe, '/');
            if (slash) {
                *slash = 0;
                snprintf(path, sizeof path, "%s/models/evalmodel.gguf", exe);
                if (access(path, R_OK) == 0) return path;
            }
        }
    }
    return "models/evalmodel.gguf";
}
