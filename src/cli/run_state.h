/* What `ellm run` keeps in a state file besides the engine's context: the
 * settings of the run (so --resume needs no flags), the prompt text it echoed,
 * every token so far (prompt and generated: the output and the repetition
 * history) and the sampler's generator state. Encoded little-endian, strings
 * and arrays with their length; decoding checks every length. */
#ifndef ELLM_CLI_RUN_STATE_H
#define ELLM_CLI_RUN_STATE_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

/* The ranges `ellm run` accepts for the settings a state keeps (its flags,
 * cmd_run.c); run_state_decode refuses a state whose settings leave them. */
#define RUN_COUNT_MAX (1L << 30)        /* -n, -c, --top-k, --repeat-last-n, --keep, sparse sizes */
#define RUN_BATCH_MAX (1L << 16)        /* -b */
#define RUN_THREADS_MAX 1024L           /* -t */
#define RUN_SPARSE_SMALL_MAX (1L << 20) /* --sparse-sink, --sparse-dense-layers */
#define RUN_TEMP_MAX 100.0              /* --temp [0, max] */
#define RUN_TOP_P_MIN 1e-6              /* --top-p [min, 1] */
#define RUN_MIN_P_MAX 0.999999          /* --min-p [0, max] */
#define RUN_REPEAT_PENALTY_MIN 1e-3     /* --repeat-penalty [min, max] */
#define RUN_REPEAT_PENALTY_MAX 100.0
#define RUN_PENALTY_ABS_MAX 2.0         /* --presence-penalty, --frequency-penalty [-max, max] */

typedef struct {
    char *model;            /* model path */
    int no_echo;            /* the prompt was not echoed */
    int kv_f32;
    int ctx_auto;           /* the context was sized to prompt + n (no -c / --kv-cache-gb) */
    int64_t n_predict;
    int64_t threads;        /* compute threads used (rounding depends on it) */
    int64_t batch;
    int64_t n_ctx;          /* the context's size */
    ellm_sampler_params sp;
    int64_t sparse_topk, sparse_window, sparse_sink, sparse_dense, sparse_recall;
    int sparse_adapt;
    int overflow;           /* --ctx-overflow: 0 none (refused up front), 1 stop, 2 shift */
    int64_t keep;           /* --keep */
    char *prompt;           /* echoed prompt text (NULL if none) */
    size_t prompt_len;
    int64_t n_prompt;       /* prompt tokens (the first of tokens) */
    int32_t *tokens;        /* n_tokens: prompt then generated */
    int64_t n_tokens;
    ellm_sampler_state rng;
    int64_t save_every;
    ellm_rope_params rope;  /* --rope-* flags (rope.type points into rope_type) */
    char rope_type[8];      /* "" (the file's), "none", "linear" or "yarn" */
} run_state;

/* Encodes `s` into a malloc'ed buffer (*out, *len). Returns 0 when out of memory. */
int run_state_encode(const run_state *s, unsigned char **out, size_t *len);
/* Decodes into `s` (strings and tokens malloc'ed: run_state_free). Returns 0
 * and writes why into msg (cap bytes) if the bytes are not a run state. */
int run_state_decode(const unsigned char *data, size_t len, run_state *s, char *msg, size_t cap);
void run_state_free(run_state *s);

#endif
