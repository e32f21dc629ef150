/* Small helpers for strict command-line parsing: every value is checked and a
 * bad one names the flag. */
#ifndef ELLM_CLI_ARGS_H
#define ELLM_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "ellm.h"

/* Returns 1 if argv[*i] is `flag` (or `alt`, may be NULL) and stores the value
 * (the next argument) in *val, advancing *i; prints an error and sets *bad if
 * the value is missing. */
int arg_value(int argc, char **argv, int *i, const char *flag, const char *alt, const char **val,
              int *bad);
int arg_int(const char *flag, const char *s, long lo, long hi, long *out);
int arg_double(const char *flag, const char *s, double lo, double hi, double *out);
int arg_u64(const char *flag, const char *s, uint64_t *out);

/* Parses "f16", "f32" or "q8_0" for `flag` into *type (an ellm_kv_type);
 * prints why and returns 0 otherwise. */
int arg_kv_type(const char *flag, const char *s, int *type);

/* The KV type flags of a command line: --kv-type and llama.cpp's
 * --cache-type-k / -ctk and --cache-type-v / -ctv (-1: not given). */
typedef struct {
    int kv, k, v;
} arg_kv_types;
#define ARG_KV_TYPES_NONE {-1, -1, -1}
/* If argv[*i] is one of those flags, parses its value into t (*bad on a bad
 * value) and returns 1; else 0. */
int arg_kv_types_parse(int argc, char **argv, int *i, arg_kv_types *t, int *bad);
/* The one KV type the flags ask for (F16 when none is given) into *type;
 * prints why and returns 0 when they disagree (eLLM keeps K and V in one
 * type, so -ctk and -ctv must match each other and --kv-type). */
int arg_kv_types_resolve(const arg_kv_types *t, int *type);
/* llama.cpp's RoPE flags, into r (ellm_model_params.rope): --rope-scaling
 * none|linear|yarn, --rope-scale N (the factor), --rope-freq-scale N (1 / the
 * factor), --rope-freq-base N, --yarn-orig-ctx N. If argv[*i] is one of them,
 * parses its value (*bad on a bad one) and returns 1; else 0. */
int arg_rope_parse(int argc, char **argv, int *i, ellm_rope_params *r, int *bad);
/* The help lines of those flags. */
#define ARG_ROPE_HELP                                                                                                  \
    "  --rope-scaling T       RoPE scaling instead of the file's: none, linear or yarn\n"                              \
    "  --rope-scale N         its context extension factor (--rope-freq-scale 1/N: the same)\n"                       \
    "  --rope-freq-base N     RoPE base frequency instead of the file's\n"                                             \
    "  --yarn-orig-ctx N      YaRN: the context the model was trained on (default: the file's)\n"

/* Parses a comma-separated list of integers in [lo, hi] into out (at most
 * max); returns the count, or -1 after printing why. */
int arg_int_list(const char *flag, const char *s, long lo, long hi, int *out, int max);

/* Parses a --numa mode (off, distribute, replicate, interleave) into *mode
 * (an ellm_numa_mode); prints why and returns 0 otherwise. */
int arg_numa(const char *flag, const char *s, int *mode);

/* Reads a whole file (NUL-terminated); returns NULL and prints why on error. */
char *cli_read_file(const char *path, size_t *size);

/* Reads the text file at path and tokenizes it with m's tokenizer (a BOS first
 * if add_bos); returns the malloc'ed ids (*n_ids of them), or NULL after
 * printing why. */
int32_t *cli_tokenize_file(ellm_model *m, const char *path, int add_bos, int *n_ids);

/* Path of the embedded default model: $ELLM_MODEL, else models/evalmodel.gguf
 * next to the executable's parent directory, else ./models/evalmodel.gguf. */
const char *cli_default_model(void);

#endif
