/* `ellm tokenize`: print the token ids of a text. */
#include "cli/args.h"
#include "cli/commands.h"
#include "ellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_tokenize(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *file = NULL;
    int no_bos = 0, parse_special = 0, pieces = 0, bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: ellm tokenize -m MODEL.gguf (-p TEXT | -f FILE) [--no-bos] [--parse-special] [--pieces]\n");
            return 0;
        } else if (!strcmp(a, "--no-bos")) no_bos = 1;
        else if (!strcmp(a, "--parse-special")) parse_special = 1;
        else if (!strcmp(a, "--pieces")) pieces = 1;
        else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad)) model_path = v;
        else if (arg_value(argc, argv, &i, "--prompt", "-p", &v, &bad)) prompt = v;
        else if (arg_value(argc, argv, &i, "--file", "-f", &v, &bad)) file = v;
        else {
            fprintf(stderr, "error: unknown option '%s'\n", a);
            bad = 1;
        }
    }
    if (bad) return 2;
    if (!prompt == !file) {
        fprintf(stderr, "error: give exactly one of -p TEXT or -f FILE\n");
        return 2;
    }
    if (!model_path) model_path = cli_default_model();
    char *text = NULL;
    size_t len;
    if (file) {
        if (!(text = cli_read_file(file, &len))) return 1;
    } else {
        len = strlen(prompt);
    }
    const char *t = text ? text : prompt;
    ellm_error err = {0};
    ellm_model *model = NULL;
    int rc = 1;
    int32_t *ids = NULL;
    if (ellm_model_load(model_path, NULL, &model, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    int cap = (int)(len + 16), n = 0;
    ids = malloc((size_t)cap * sizeof *ids);
    if (!ids || ellm_tokenize(model, t, len, !no_bos, parse_special, ids, cap, &n, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", ids ? err.msg : "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (pieces) {
            ellm_detok st = {0};
            st.n_emitted = 1;
            char buf[256];
            int nb = ellm_detok_push(model, &st, ids[i], buf, sizeof buf);
            nb += ellm_detok_flush(&st, buf + nb, sizeof buf - (size_t)nb);
            printf("%d '%.*s'\n", ids[i], nb, buf);
        } else {
            printf(i ? " %d" : "%d", ids[i]);
        }
    }
    if (!pieces) putchar('\n');
    rc = 0;
done:
    free(ids);
    free(text);
    ellm_model_free(model);
    return rc;
}
