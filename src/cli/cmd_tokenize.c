/* `ellm tokenize`: print the token ids of a text, with the tokenizer of a GGUF
 * file (a model or a vocabulary-only file) or of a tokenizer.json. */
#include "cli/args.h"
#include "cli/commands.h"
#include "ellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: ellm tokenize -m FILE (-p TEXT | -f TEXT_FILE) [--no-bos] [--parse-special] "
               "[--pieces]\n"
               "  -m, --model FILE   GGUF model or vocabulary, tokenizer.json, or a directory\n"
               "                     holding one (default: the embedded model)\n"
               "  -p, --prompt TEXT  text to tokenize\n"
               "  -f, --file FILE    tokenize the contents of FILE\n"
               "  --no-bos           do not prepend BOS even when the tokenizer asks for it\n"
               "  --parse-special    text like <|im_end|> becomes its special token\n"
               "  --pieces           one line per token: its id and the bytes it stands for\n"
               "                     (control tokens, which stand for none: [their text])\n"
               "Prints the ids on one line, separated by spaces.\n");
}

/* Prints token bytes quoted: printable text as is, the rest escaped
 * (\n, \t, \r, \\, \', and \xNN for other control bytes and for bytes that
 * are not a whole UTF-8 character). */
static void print_bytes(const unsigned char *s, size_t n) {
    putchar('\'');
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        int whole = k > 0 && i + k <= n;
        for (size_t j = 1; whole && j < k; j++) whole = (s[i + j] & 0xC0) == 0x80;
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c == '\\' || c == '\'')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7F || !whole)
            printf("\\x%02X", c);
        else {
            fwrite(s + i, 1, k, stdout);
            i += k;
            continue;
        }
        i++;
    }
    putchar('\'');
}

int cmd_tokenize(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *file = NULL;
    int no_bos = 0, parse_special = 0, pieces = 0, bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-bos"))
            no_bos = 1;
        else if (!strcmp(a, "--parse-special"))
            parse_special = 1;
        else if (!strcmp(a, "--pieces"))
            pieces = 1;
        else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad))
            model_path = v;
        else if (arg_value(argc, argv, &i, "--prompt", "-p", &v, &bad))
            prompt = v;
        else if (arg_value(argc, argv, &i, "--file", "-f", &v, &bad))
            file = v;
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
    ellm_tokenizer *tok = NULL;
    int rc = 1;
    int32_t *ids = NULL;
    int n = 0;
    if (ellm_tokenizer_load(model_path, &tok, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    /* Size first, then encode into an array of that size. */
    ellm_status st = ellm_tokenizer_encode(tok, t, len, !no_bos, parse_special, NULL, 0, &n, &err);
    if (st != ELLM_OK && !(st == ELLM_ERR_ARG && n > 0)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    if (ellm_tokenizer_encode(tok, t, len, !no_bos, parse_special, ids, n, &n, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (pieces) {
            size_t nb = 0;
            const char *b = ellm_tokenizer_token_bytes(tok, ids[i], &nb);
            printf("%d ", ids[i]);
            print_bytes((const unsigned char *)(b ? b : ""), nb);
            if (nb == 0) { /* a control token: show what it is */
                size_t nt = 0;
                const char *txt = ellm_tokenizer_token_text(tok, ids[i], &nt);
                printf(" [%.*s]", (int)nt, txt ? txt : "");
            }
            putchar('\n');
        } else {
            printf(i ? " %d" : "%d", ids[i]);
        }
    }
    if (!pieces) putchar('\n');
    rc = 0;
done:
    free(ids);
    free(text);
    ellm_tokenizer_free(tok);
    return rc;
}
