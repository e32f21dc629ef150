/*
 * eLLM — LLM inference on CPUs, built for long generation.
 *
 * This header is the whole public API. Handles are opaque; every function that
 * can fail returns an ellm_status and, where it takes an `ellm_error *`, writes a
 * human-readable message naming what went wrong. No function aborts or exits on
 * bad input: files, prompts and parameters are treated as untrusted.
 *
 * Typical use:
 *
 *     ellm_model *model; ellm_error err;
 *     if (ellm_model_load("model.gguf", NULL, &model, &err) != ELLM_OK) {
 *         fprintf(stderr, "%s\n", err.msg); ...
 *     }
 *     ellm_context_params cp = ellm_context_default_params();
 *     ellm_context *ctx; ellm_context_init(model, &cp, &ctx, &err);
 *     int32_t ids[512]; int n;
 *     ellm_tokenize(model, "def main():", 11, 1, 0, ids, 512, &n, &err);
 *     ellm_decode(ctx, ids, n, NULL, &err);           // prefill
 *     ... ellm_sample(...), ellm_decode(ctx, &tok, 1, ...), ellm_token_to_text(...)
 *     ellm_context_free(ctx); ellm_model_free(model);
 */
#ifndef ELLM_H
#define ELLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ELLM_OK = 0,
    ELLM_ERR_IO,          /* a file could not be opened, read or mapped */
    ELLM_ERR_FORMAT,      /* malformed input: a file, a tokenizer, a request */
    ELLM_ERR_UNSUPPORTED, /* well-formed but not handled (architecture, tensor type) */
    ELLM_ERR_NOMEM,       /* an allocation failed */
    ELLM_ERR_ARG,         /* an invalid argument from the caller */
    ELLM_ERR_CONTEXT_FULL /* the request does not fit in the context / KV cache */
} ellm_status;

/* Returns a constant, human-readable name for a status. Never NULL. */
const char *ellm_status_str(ellm_status status);

/* Error details: filled by any function that takes one and fails. */
typedef struct {
    ellm_status status;
    char msg[512];
} ellm_error;

typedef struct ellm_model ellm_model;
typedef struct ellm_context ellm_context;
typedef struct ellm_mpi ellm_mpi;

/* ---- model ---------------------------------------------------------------- */

/* Placement of weights and KV on NUMA nodes (`--numa`). On a machine with
 * one node every mode computes exactly what ELLM_NUMA_OFF does. */
typedef enum {
    ELLM_NUMA_OFF = 0,        /* threads pinned one per core; memory where the kernel puts it */
    ELLM_NUMA_DISTRIBUTE = 1, /* each matrix's rows split over the nodes, each node's threads
                                 computing the rows stored on their node; KV heads on the node
                                 whose threads attend to them (--numa-aware) */
    ELLM_NUMA_REPLICATE = 2,  /* a copy of the weights on every node (when memory allows) */
    ELLM_NUMA_INTERLEAVE = 3  /* pages spread round-robin over the nodes (a baseline) */
} ellm_numa_mode;

/* RoPE scaling of the file (<arch>.rope.scaling.*, rope.freq_base) or, where
 * a field is set, instead of it: llama.cpp's --rope-scaling, --rope-scale,
 * --rope-freq-base and --yarn-orig-ctx, to run a model beyond its training
 * context (e.g. YaRN x4 on a file trained on 32K tokens). Zero fields keep
 * the file's. A factor given with linear or YaRN scaling raises the training
 * context the model reports to the scaled one (YaRN: the original context
 * times the factor). */
typedef struct {
    const char *type; /* "none", "linear" or "yarn"; NULL: the file's */
    float factor;     /* context extension factor (> 0); 0: the file's */
    float freq_base;  /* RoPE base frequency (> 0); 0: the file's */
    int orig_ctx;     /* YaRN's original training context (> 0); 0: the file's, else its context_length */
} ellm_rope_params;

typedef struct {
    int n_threads; /* threads for compute; <= 0: one per physical core */
    int pin_threads; /* pin compute threads to cores (default 1) */
    ellm_numa_mode numa; /* placement (default off) */
    int mlock;     /* lock the weights in memory (best effort) */
    /* 1: compute from the weights as the file lays them out, all read in place
     * from the mapping. 0 (default): where the CPU has AVX2 or AVX-512, Q8_0
     * and Q4_0 matrices are rearranged at load, 16 rows interleaved (private
     * memory instead of shared page cache), for faster batched steps and
     * prefill (AVX-512 VNNI: up to ~1.3-1.5x) and decode (AVX2 alone: ~1.5-2x);
     * either way a row of any batch equals the row alone. */
    int keep_layout;
    ellm_rope_params rope; /* RoPE scaling instead of the file's, field by field (zero: the file's) */
} ellm_model_params;

/* Advice for contexts of n_ctx tokens on this model: when they run past its
 * training context with plain RoPE (no scaling in the file, none asked for
 * in ellm_model_params.rope), a sentence naming the YaRN settings for that
 * length into buf (cap bytes) and 1; else 0 and buf empty. */
int ellm_model_context_advice(const ellm_model *model, int n_ctx, char *buf, size_t cap);

/* Maps a GGUF file (v2/v3) and binds its tensors. Weights are read from the
 * mapping (Q8_0 ones rearranged in it unless keep_layout). Safe on untrusted files: every offset and size is checked.
 * `params` may be NULL for defaults. */
ellm_status ellm_model_load(const char *path, const ellm_model_params *params,
                            ellm_model **out, ellm_error *err);
void ellm_model_free(ellm_model *model);

typedef struct {
    char arch[32];       /* "llama", "qwen2", "qwen3" */
    int n_vocab;
    int n_ctx_train;
    int n_embd;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;
    int n_ff;
    uint64_t n_params;
    uint64_t weight_bytes; /* bytes of tensor data in the file */
    uint64_t decode_weight_bytes; /* weight bytes one decode step reads */
    uint64_t output_weight_bytes; /* of those, the output (logits) matrix's */
    double load_ms;        /* time ellm_model_load took */
    char placement[320];   /* threads and NUMA placement in use, and any note on them */
    char rope_scaling[64]; /* RoPE scaling from the file, e.g. "yarn x4 from 32768 tokens"; "" if none */
} ellm_model_info;

void ellm_model_get_info(const ellm_model *model, ellm_model_info *info);

/* ---- tokenizer ------------------------------------------------------------ */

/* Tokenizes `len` bytes of UTF-8 text. With `add_bos` the model's BOS is
 * prepended when the model asks for it; with `parse_special` control-token text
 * such as "<s>" becomes the control token, otherwise it is plain text.
 * Writes at most `cap` ids; *n_out receives the full count (which may exceed
 * `cap`, in which case ELLM_ERR_ARG is returned). */
ellm_status ellm_tokenize(const ellm_model *model, const char *text, size_t len,
                          int add_bos, int parse_special, int32_t *ids, int cap,
                          int *n_out, ellm_error *err);

/* Streaming detokenizer state: holds back incomplete UTF-8 sequences so that
 * no output ever contains half a character. Zero-initialize before use. */
typedef struct {
    unsigned char pending[8];
    int n_pending;
    int n_emitted; /* tokens seen; leading-space handling depends on it */
} ellm_detok;

/* Appends the text of `token` to `out` (capacity `cap`, at least 64 bytes).
 * Returns the number of bytes written: only complete UTF-8 characters. */
int ellm_detok_push(const ellm_model *model, ellm_detok *state, int32_t token,
                    char *out, size_t cap);
/* Flushes any held-back bytes (as U+FFFD for an incomplete sequence). */
int ellm_detok_flush(ellm_detok *state, char *out, size_t cap);

int32_t ellm_token_bos(const ellm_model *model);
int32_t ellm_token_eos(const ellm_model *model);
/* Non-zero when `token` ends generation (EOS, EOT, ...). */
int ellm_token_is_eog(const ellm_model *model, int32_t token);

/* A tokenizer on its own, without weights: from a GGUF file (a full model or
 * a vocabulary-only file) or a Hugging Face tokenizer.json. Safe on untrusted
 * files and text; one tokenizer may be used from several threads at once. */
typedef struct ellm_tokenizer ellm_tokenizer;

/* Loads the tokenizer of `path`: a GGUF file (recognised by its magic), a
 * tokenizer.json (tokenizer_config.json beside it is read too when present),
 * or a directory holding a tokenizer.json. */
ellm_status ellm_tokenizer_load(const char *path, ellm_tokenizer **out, ellm_error *err);
void ellm_tokenizer_free(ellm_tokenizer *tok);
/* The tokenizer of a loaded model (owned by the model; do not free). */
const ellm_tokenizer *ellm_model_tokenizer(const ellm_model *model);

/* As ellm_tokenize: `len` bytes of UTF-8 (else ELLM_ERR_FORMAT naming the
 * offset); BOS prepended with `add_bos` when the tokenizer asks for one;
 * special-token text parsed with `parse_special`. *n_out gets the full count
 * (ELLM_ERR_ARG if it exceeds `cap`). */
ellm_status ellm_tokenizer_encode(const ellm_tokenizer *tok, const char *text, size_t len,
                                  int add_bos, int parse_special, int32_t *ids, int cap,
                                  int *n_out, ellm_error *err);
/* As ellm_detok_push (flush with ellm_detok_flush). An `out` of at least
 * ellm_tokenizer_max_token_bytes() + 8 bytes (and 64) is never cut short. */
int ellm_tokenizer_detok_push(const ellm_tokenizer *tok, ellm_detok *state, int32_t token,
                              char *out, size_t cap);
int ellm_tokenizer_n_vocab(const ellm_tokenizer *tok);
int32_t ellm_tokenizer_bos(const ellm_tokenizer *tok); /* -1 if none */
int32_t ellm_tokenizer_eos(const ellm_tokenizer *tok); /* -1 if none */
int ellm_tokenizer_is_eog(const ellm_tokenizer *tok, int32_t token);
/* The bytes `token` stands for on its own (may be part of a UTF-8 character,
 * empty for control tokens), not NUL-terminated; NULL if out of range. */
const char *ellm_tokenizer_token_bytes(const ellm_tokenizer *tok, int32_t token, size_t *len);
size_t ellm_tokenizer_max_token_bytes(const ellm_tokenizer *tok);
/* The vocabulary text of `token` (e.g. "Ġthe", "<|im_end|>"), not
 * NUL-terminated; NULL if out of range. */
const char *ellm_tokenizer_token_text(const ellm_tokenizer *tok, int32_t token, size_t *len);
/* The chat template (Jinja source) from the file, or NULL if it has none. */
const char *ellm_tokenizer_chat_template(const ellm_tokenizer *tok);

/* ---- chat templates ------------------------------------------------------- */

typedef struct {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8, NUL-terminated; NULL: None (an assistant turn of tool calls only) */
    /* Tool calling, each NULL unless used: an assistant turn's tool calls
     * (JSON text of OpenAI's "tool_calls" array), a "tool" turn's
     * tool_call_id and function name. */
    const char *tool_calls;
    const char *tool_call_id;
    const char *name;
} ellm_chat_message;

/* Renders a conversation into prompt text with a chat template: the model's
 * own tokenizer.chat_template, or the built-in `template_name` ("llama2",
 * "llama3", "chatml", "mistral", "phi3", "deepseek", ...) if not NULL or if
 * the model has none (NULL then guesses the family from its special tokens).
 * On ELLM_OK *out is a NUL-terminated string to release with ellm_free.
 * Tokenize the result with parse_special = 1 so the template's control-token
 * text becomes control tokens. */
ellm_status ellm_chat_render(const ellm_model *model, const char *template_name,
                             const ellm_chat_message *msgs, int n_msgs, int add_generation_prompt,
                             char **out, size_t *out_len, ellm_error *err);
/* The same with the functions the model may call: `tools` is JSON text of
 * OpenAI's "tools" array (NULL: none), given to the template as `tools`
 * (templates without tool support ignore it). */
ellm_status ellm_chat_render_tools(const ellm_model *model, const char *template_name,
                                   const ellm_chat_message *msgs, int n_msgs, int add_generation_prompt,
                                   const char *tools, char **out, size_t *out_len, ellm_error *err);
/* The chat template ellm_chat_render uses for `template_name` (as there):
 * its Jinja source, or NULL when there is none. */
const char *ellm_chat_template_source(const ellm_model *model, const char *template_name);
/* Frees memory returned by eLLM (rendered chat text). */
void ellm_free(void *p);

/* ---- KV cache sharded over MPI ranks (`ellm run --mpi`) -------------------- */

/* Starts MPI in a program launched by mpirun (Open MPI). Every rank loads the
 * same model and passes the handle in ellm_context_params.mpi. A collective
 * that waits more than `timeout_s` seconds (<= 0: 300) for the other ranks
 * fails with a message naming the rank, so a rank that dies or hangs stops
 * the others instead of leaving them waiting; MPI errors are returned, not
 * fatal. */
ellm_status ellm_mpi_init(int *argc, char ***argv, double timeout_s, ellm_mpi **out, ellm_error *err);
int ellm_mpi_rank(const ellm_mpi *mpi); /* 0 for NULL */
int ellm_mpi_size(const ellm_mpi *mpi); /* 1 for NULL */
/* Ranks of the job on the calling rank's machine (1 for NULL): above 1,
 * threads are better left unpinned (each rank would pin to the same cores). */
int ellm_mpi_local_size(const ellm_mpi *mpi);
/* Copies `bytes` of rank 0's buf into every rank's buf (a seed, a prompt). */
ellm_status ellm_mpi_bcast(ellm_mpi *mpi, void *buf, size_t bytes, ellm_error *err);
/* *all_ok = 1 if every rank passed ok != 0, else 0 (so ranks fail together). */
ellm_status ellm_mpi_agree(ellm_mpi *mpi, int ok, int *all_ok, ellm_error *err);
/* Times the exchange of one layer's attention merge for `rows` query rows
 * of head_dim (decode: rows = n_head) without the attention around it: one
 * all-reduce of a record per row (5 + 2 (head_dim + 1) + ceil(head_dim / 2)
 * int64) with the merge's operation. The median over `reps` runs, in
 * microseconds, into *median_us. Every rank calls it alike. */
ellm_status ellm_mpi_time_exchange(ellm_mpi *mpi, int rows, int head_dim, int reps, double *median_us,
                                   ellm_error *err);
/* NULL, or the message of the first collective of this handle that failed
 * (a rank died, hung or fell out of step). After one, every collective of
 * the handle fails at once instead of waiting again, and
 * ellm_mpi_finalize does not wait for the lost rank. Read it from the
 * thread that runs the collectives. */
const char *ellm_mpi_failed(const ellm_mpi *mpi);
/* Stops every rank of the job with exit status `code` (after a failure that
 * leaves the other ranks waiting). */
void ellm_mpi_abort(ellm_mpi *mpi, int code);
/* Frees the handle and ends MPI. */
void ellm_mpi_finalize(ellm_mpi *mpi);

/* ---- context (one sequence, its KV cache and scratch) --------------------- */

/* KV cache element type. Q8_0: int8 with an F16 scale per token and 32 dims
 * (0.53x the bytes of F16 at head_dim 64), read by fused kernels. */
typedef enum { ELLM_KV_F16 = 0, ELLM_KV_F32 = 1, ELLM_KV_Q8_0 = 2 } ellm_kv_type;
/* "f16", "f32" or "q8_0" (the GGUF type names); "unknown" for any other value. */
const char *ellm_kv_type_name(ellm_kv_type type);

/* KV memory shared by several contexts of one model and KV type (a server's
 * slots): pages of ellm_kv_pool_stats.page_tokens tokens (of every layer and
 * head) taken as a sequence grows and given back when it is truncated or
 * freed. A context without a shared pool has a private one. Memory is
 * committed only for the pages held. */
typedef struct ellm_kv_pool ellm_kv_pool;
typedef struct {
    int64_t pages_used, pages_total;
    int page_tokens;   /* tokens one page holds */
    size_t page_bytes; /* bytes of one page */
} ellm_kv_pool_stats;
/* A pool of at most `gb` GB (1e9 bytes) of KV pages for contexts of `model`
 * with KV type `type`; ELLM_ERR_ARG if that is less than one page. */
ellm_status ellm_kv_pool_init(const ellm_model *model, ellm_kv_type type, double gb, ellm_kv_pool **out,
                              ellm_error *err);
/* Frees the pool; every context using it must be freed first. */
void ellm_kv_pool_free(ellm_kv_pool *pool);
void ellm_kv_pool_get_stats(const ellm_kv_pool *pool, ellm_kv_pool_stats *stats);
/* Bytes of one page of a shared pool for `model` and `type`, and tokens per
 * such page: for sizing a pool. (A context of 8,192 tokens or more with a
 * private pool takes 4x longer pages; its pool's stats say so.) */
size_t ellm_kv_pool_page_bytes(const ellm_model *model, ellm_kv_type type);
int ellm_kv_pool_page_tokens(void);

typedef struct {
    int n_ctx;         /* tokens of context; 0: the model's training length, capped at
                          its sliding attention window if it has one (a longer n_ctx
                          is then refused: sliding windows are not implemented) */
    double kv_cache_gb; /* if > 0: the ceiling of the KV memory (its pages are taken
                           as the sequence grows); with n_ctx == 0 also the context size */
    ellm_kv_type kv_type;
    ellm_kv_pool *kv_pool; /* KV pages from this shared pool (same model and kv_type;
                              kv_cache_gb is then ignored); NULL: a private pool */
    int n_batch;       /* max tokens per forward pass (prefill chunk) */
    int n_threads;     /* <= 0: the model's thread count */
    /* Sparse attention (query-aware KV block selection). sparse_topk > 0 turns
     * it on: each step, per KV head, attention reads the sink block(s), the
     * recent window and the best-scoring blocks, up to sparse_topk tokens. A
     * budget >= the context length gives exactly dense attention. */
    int sparse_topk;         /* token budget per KV head; 0: dense */
    int sparse_sink_blocks;  /* blocks at the start always kept (default 1) */
    int sparse_window;       /* recent tokens always kept (default 64) */
    int sparse_dense_layers; /* first layers kept dense (default 0) */
    int sparse_recall_every; /* every N decode steps, measure recall on a dense pass (0: off;
                                ELLM_SPARSE_RECALL_EVERY is the interval the tools use) */
    int sparse_adapt;        /* move budget between heads by sampled recall */
    /* KV cache sharded over the ranks of an MPI job (`--mpi`, see
     * ellm_mpi_init); NULL: one process. Every rank creates its context with
     * the same parameters and feeds the same tokens; each stores the keys and
     * values of its own positions and gets the same logits, bit for bit, as
     * one process, dense or sparse (sparse without sparse_recall_every or
     * sparse_adapt, which read every key). */
    ellm_mpi *mpi;
} ellm_context_params;

/* The recall-sampling interval `ellm run` (with --stats or --sparse-adapt) and
 * `ellm eval` use by default: one sample costs a dense attention pass over
 * every layer's keys, and --sparse-adapt moves budgets at each sample, so both
 * tools must sample alike for eval's fidelity figures to describe run. */
#define ELLM_SPARSE_RECALL_EVERY 64

ellm_context_params ellm_context_default_params(void);
ellm_status ellm_context_init(ellm_model *model, const ellm_context_params *params,
                              ellm_context **out, ellm_error *err);
void ellm_context_free(ellm_context *ctx);

int ellm_context_n_ctx(const ellm_context *ctx);
/* Most tokens the context can hold: n_ctx, or less if its KV pool is smaller
 * (kv_cache_gb). A generation reaching it stops or shifts. */
int ellm_context_capacity(const ellm_context *ctx);
/* Tokens that can be fed now: within n_ctx, the KV pages held and those the
 * pool has free (a shared pool's other users may take them meanwhile). */
int ellm_context_room(const ellm_context *ctx);
/* Takes KV pages now for positions [0, n_tokens); ELLM_ERR_CONTEXT_FULL if
 * the pool cannot give them (pages taken stay held). Decoding reserves by
 * itself; a scheduler reserves ahead to admit a prompt only when it fits. */
ellm_status ellm_context_reserve(ellm_context *ctx, int n_tokens, ellm_error *err);
/* KV pages the context holds (ellm_kv_pool_stats.page_tokens tokens each). */
int ellm_context_kv_pages(const ellm_context *ctx);
/* The context's pool (its private one if none was shared), for its stats. */
const ellm_kv_pool *ellm_context_kv_pool(const ellm_context *ctx);
/* Tokens currently held in the KV cache. */
int ellm_context_pos(const ellm_context *ctx);
/* Forgets every token at position >= n_keep. O(1). */
ellm_status ellm_context_truncate(ellm_context *ctx, int n_keep);
/* Context shift (what a generation does at the end of its context, as
 * llama.cpp's): forgets positions [n_keep, n_keep + n_discard) and moves the
 * later ones down by n_discard, rotating their keys' RoPE by -n_discard so
 * they are the keys of their new positions (with an F16 cache up to one F16
 * rounding away from a fresh computation). The sparse index is rebuilt from
 * the moved keys. The last logits stay. O(positions moved). */
ellm_status ellm_context_shift(ellm_context *ctx, int n_keep, int n_discard, ellm_error *err);

/* Feeds `n` tokens at the current position in one batched pass (chunked by
 * n_batch). If `logits` is not NULL it receives n rows of n_vocab floats, the
 * logits after each token; the last row is always kept and available from
 * ellm_context_logits(). */
ellm_status ellm_decode(ellm_context *ctx, const int32_t *tokens, int n,
                        float *logits, ellm_error *err);
/* Logits after the last token fed (n_vocab floats), or NULL before any. */
const float *ellm_context_logits(const ellm_context *ctx);

/* dst (an empty or any context of the same model, KV type and pool shape)
 * takes the keys and values of src's positions [0, n) (n <= src's
 * position), copied: the same bits as computing them, so a server's slot can
 * start from another slot's prompt instead of computing it again. dst's
 * position becomes n; its logits are gone (feed a last token for them).
 * ELLM_ERR_UNSUPPORTED for contexts with a sparse index (it summarizes the
 * keys as computed, not as stored) or sharded over MPI; ELLM_ERR_ARG for
 * contexts of different models or caches, or n out of range;
 * ELLM_ERR_CONTEXT_FULL when dst cannot hold n tokens now. */
ellm_status ellm_context_copy_prefix(ellm_context *dst, const ellm_context *src, int n, ellm_error *err);

/* Changes the sparse budget of an existing context (0: dense). The index is
 * kept whatever the mode, so switching is free. Fails if the context was made
 * dense-only (sparse_topk < 0 at init). */
ellm_status ellm_context_set_sparse(ellm_context *ctx, int sparse_topk, ellm_error *err);
/* Loads per-layer/per-head budgets written by `ellm calibrate` (the profile's
 * weights scale sparse_topk; layers it marks dense stay dense). A NULL path
 * restores uniform budgets (and the sparse_dense_layers of the parameters). */
ellm_status ellm_context_load_sparse_profile(ellm_context *ctx, const char *path, ellm_error *err);
/* Turns online budget adaptation (--sparse-adapt) on or off. */
void ellm_context_set_sparse_adapt(ellm_context *ctx, int on);
/* The context length up to which every forward pass of ctx attends densely,
 * whatever rows it holds: a pass whose last token sees at most this many keys
 * reads them all (the smallest budget of the sparse layers and heads, or the
 * least any head can get while budgets adapt). INT_MAX for a dense context.
 * Past it, a pass of several tokens makes one block selection for all of
 * them, so a prompt fed in other chunks gets other keys and values there:
 * feed prompts in the same chunks, at the same positions, for the same
 * output (as `ellm run` and `ellm serve` do, chunks of n_batch from
 * position 0). */
int ellm_context_sparse_dense_len(const ellm_context *ctx);

typedef struct {
    int64_t decode_steps;     /* forward passes */
    int64_t sparse_steps;     /* passes that used sparse attention */
    double select_ms;         /* time spent choosing blocks: summed over the threads (which
                                 choose concurrently) and divided by their number */
    double attended_tokens;   /* mean tokens read per sparse (layer, KV head) */
    double index_bytes_read;  /* summary bytes read choosing blocks */
    double index_flat_bytes;  /* ... a flat per-block scan would have read */
    int64_t recall_samples;   /* sampled (layer, head) recalls */
    double sparse_recall;     /* mean sampled recall: attention mass inside the chosen blocks */
    int64_t sparse_selections; /* (layer, KV head) selections made */
    double attended_share;    /* mean over them of tokens read (sink + window + chosen blocks)
                                 over the keys the step could see */
    /* With ellm_context_params.mpi: */
    int mpi_ranks;             /* ranks the KV cache is sharded over (0: not sharded) */
    int64_t mpi_local_tokens;  /* positions this rank stores */
    int64_t mpi_exchanges;     /* exchanges (one all-reduce per layer per pass) */
    double mpi_bytes_sent;     /* bytes of merge bounds and sums this rank contributed */
    double mpi_bytes_recv;     /* ... and received reduced */
    double mpi_exchange_ms;    /* wall time in the collectives, waiting for slower ranks included */
    double mpi_merge_ms;       /* merging every rank's partials */
    double mpi_parts_ms;       /* computing this rank's partials (its share of attention) */
    uint64_t sparse_digest;    /* FNV-1a over every selection's block indices, in order: runs
                                  with equal digests attended to the same blocks */
    /* Where the forward passes' time went, summed over the passes this context
     * took part in (ellm_decode, speculative steps, batched passes: a batched
     * pass counts whole for each of its contexts). forward_ms is their wall
     * time; matmul_ms the layers' weight matmuls with the element-wise work
     * around them (norms, RoPE, SwiGLU, activation quantization); attention_ms
     * storing the new keys and values, choosing blocks and attending; output_ms
     * the final norm and the output (logits) matrix. The rest of forward_ms is
     * the embedding rows and bookkeeping. Not saved with the state. */
    double forward_ms, matmul_ms, attention_ms, output_ms;
} ellm_context_stats;

void ellm_context_get_stats(const ellm_context *ctx, ellm_context_stats *stats);

/* Calibration of sparse budgets ("learnable" selection). Runs the model densely
 * over `tokens` (one window: the context is reset first), and every
 * `sample_every` tokens measures, for each layer and KV head, the attention
 * mass that top-k block selection captures at each of the `n_budgets` budgets
 * (tokens). Adds the recalls to sum[(layer * n_kv_head + head) * n_budgets + b]
 * and the number of samples to *n_samples (so several windows accumulate). */
ellm_status ellm_sparse_calibrate(ellm_context *ctx, const int32_t *tokens, int n, const int *budgets,
                                  int n_budgets, int sample_every, double *sum, int64_t *n_samples,
                                  ellm_error *err);

/* From mean recall curves (as above, divided by the sample count), chooses
 * per-(layer, head) budgets with mean `target` tokens that maximize the total
 * recall (greedy on marginal gain per token, curves interpolated linearly),
 * keeps the `n_dense_layers` layers of lowest recall dense, and writes the
 * profile that ellm_context_load_sparse_profile reads. Per-head weights are
 * budget / target, so the profile scales with --sparse-topk. */
ellm_status ellm_sparse_profile_write(const char *path, int n_layer, int n_kv_head, const int *budgets,
                                      int n_budgets, const double *mean_recall, int target,
                                      int n_dense_layers, ellm_error *err);

/* Importance matrix (llama.cpp's imatrix): per input column of every layer
 * matrix, the mean squared activation over sample text. ellm_imatrix_collect
 * runs the model over `tokens` from an empty context (in batches of the
 * context's batch size) and adds to the sums; several calls accumulate.
 * ellm_imatrix_write writes llama.cpp's imatrix .dat layout, which
 * `ellm convert --imatrix` (and llama-quantize) read. */
typedef struct ellm_imatrix ellm_imatrix;
ellm_status ellm_imatrix_init(const ellm_model *m, ellm_imatrix **out, ellm_error *err);
ellm_status ellm_imatrix_collect(ellm_context *ctx, ellm_imatrix *im, const int32_t *tokens, int n,
                                 ellm_error *err);
/* Also collects each matrix's input covariance within blocks of `block`
 * columns (call before collecting); the file then holds one more entry per
 * distinct input, "<name>.cov" under the first matrix that reads it
 * (attn_q, attn_output, ffn_gate, ffn_down; imatrix.c has the layout),
 * which `ellm convert` uses for error-feedback rounding and llama-quantize
 * ignores. */
ellm_status ellm_imatrix_set_covariance(ellm_imatrix *im, int block, ellm_error *err);
ellm_status ellm_imatrix_write(const ellm_imatrix *im, const char *path, const char *dataset, ellm_error *err);
void ellm_imatrix_free(ellm_imatrix *im);

/* ---- batched decoding: several sequences in one pass ---------------------- */

/* Scratch and threads for passes over several contexts at once (continuous
 * batching): each weight matrix is read once per pass for the rows of all
 * sequences; attention runs per sequence over its own KV cache. A row is
 * computed exactly as it would be alone (the matmuls are row-independent and
 * attention sees only its own sequence), so a sequence's logits do not depend
 * on what else is in the pass. One thread drives a batch at a time. */
typedef struct ellm_batch ellm_batch;

/* A batch of up to `max_rows` tokens per pass, on n_threads threads (<= 0:
 * the model's thread count). */
ellm_status ellm_batch_init(ellm_model *model, int n_threads, int max_rows, ellm_batch **out, ellm_error *err);
/* Frees the batch; free its contexts first. */
void ellm_batch_free(ellm_batch *batch);
/* A context that runs on the batch's threads (ellm_context_init otherwise);
 * n_batch of the parameters bounds the tokens it feeds per pass. */
ellm_status ellm_batch_context_init(ellm_batch *batch, const ellm_context_params *params, ellm_context **out,
                                    ellm_error *err);
/* One pass: context ctxs[i] (distinct, made from this batch) is fed
 * n_tokens[i] >= 1 tokens (at most its n_batch) at its current position; the
 * total is at most max_rows. Afterwards ellm_context_logits(ctxs[i]) holds the
 * logits after its last token. Checks every count and token id first and feeds
 * nothing on error. */
/* As ellm_decode_batch; where row_logits[i] is not NULL, the logits of every
 * row of sequence i (n_tokens[i] x n_vocab floats) go there instead of the
 * last row's to the context (a speculative verify pass). row_logits may be NULL. */
ellm_status ellm_decode_batch_rows(ellm_batch *batch, ellm_context *const *ctxs, const int32_t *const *tokens,
                                   const int *n_tokens, int n_seq, float *const *row_logits, ellm_error *err);
ellm_status ellm_decode_batch(ellm_batch *batch, ellm_context *const *ctxs, const int32_t *const *tokens,
                              const int *n_tokens, int n_seq, ellm_error *err);

/* ---- sampling ------------------------------------------------------------- */

typedef struct {
    float temperature;    /* <= 0: greedy */
    int top_k;            /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    int repeat_last_n;    /* tokens looked back for the penalties (0: the whole history) */
    uint64_t seed;
    /* OpenAI's penalties, over the same window: a token seen c times there
     * loses presence_penalty (once) + c x frequency_penalty of its logit.
     * 0: off. */
    float presence_penalty;
    float frequency_penalty;
} ellm_sampler_params;

typedef struct ellm_sampler ellm_sampler;

ellm_sampler_params ellm_sampler_default_params(void);
ellm_status ellm_sampler_init(const ellm_sampler_params *params, int n_vocab,
                              ellm_sampler **out, ellm_error *err);
void ellm_sampler_free(ellm_sampler *s);
/* Adds bias[i] to the logit of token ids[i] before anything else (OpenAI's
 * logit_bias; a bias <= -100 bans the token); replaces any earlier biases, n
 * = 0 clears them. An id outside the vocabulary or a NaN bias is refused. */
ellm_status ellm_sampler_set_logit_bias(ellm_sampler *s, const int32_t *ids, const float *bias, int n, ellm_error *err);
/* Picks the next token from `logits` (n_vocab floats, not modified) given the
 * `n_hist` previous tokens (for the repetition penalty). */
int32_t ellm_sampler_sample(ellm_sampler *s, const float *logits,
                            const int32_t *hist, int n_hist);

/* ---- self-speculative decoding ------------------------------------------- */

/* The model drafts for itself (cheap drafters propose up to draft_max tokens)
 * and one batched pass of the full model verifies them, reading the weights
 * once for several tokens. Greedy output is exactly plain decoding's (batched
 * rows equal single-token steps bit for bit); with sampling, speculative
 * rejection sampling keeps the output distribution the target's. */
typedef struct ellm_spec ellm_spec;

typedef struct {
    /* Drafters, '+' chaining a cheaper one to propose for the next:
     *   "ngram"     continue a repeated n-gram of the history (no weights read)
     *   "sparse:N"  the same model attending to N KV tokens per head (needs a
     *               context that keeps the sparse index: sparse_topk >= 0)
     *   "quant:TYPE" the same model through a copy of its weights at a
     *               low-bit TYPE (q4_0, q4_K, q6_K, q8_0, int4_g128), made
     *               on first use and cached on disk: beside the model file
     *               when its folder is writable, else in $XDG_CACHE_HOME/ellm
     *               or ~/.cache/ellm, else in memory; a cache file that does
     *               not match the model file as it is now is rebuilt
     *   "shallow:K" the first K layers, then the output norm and head
     *               (with draft_map: the map for K first)
     * quant and shallow take a KV budget too ("quant:q4_0:sparse:128").
     * e.g. "ngram", "sparse:128", "ngram+quant:q4_0". Read at init only. */
    const char *drafters;
    int draft_max;      /* tokens drafted per verify pass, 1..31 (default 8) */
    int verify_sparse;  /* 0: verify densely (output = dense decoding); 1: with the
                           context's sparse budget (output = sparse decoding) */
    float draft_p_min;  /* a model drafter stops when its top probability is below
                           this (0: never) */
    const char *draft_map; /* shallow:K drafters: a draft map file (ellm_draft_calib_*)
                              holding the map for K, or NULL (no map). Read at init. */
    int adapt;          /* 1: choose the draft length of each pass in [1, draft_max]
                           from the running acceptance and the measured costs of a
                           draft step and of verify passes (ellm_spec_best_draft_length),
                           or 0 (a plain step) while plain steps measure faster;
                           0: always draft_max */
} ellm_spec_params;

typedef struct {
    int64_t verify_passes;    /* batched passes of the target */
    int64_t proposed;         /* drafted tokens verified */
    int64_t accepted;         /* ... accepted */
    int64_t tokens;           /* tokens returned */
    double acceptance_rate;   /* accepted / proposed */
    double tokens_per_verify; /* mean over passes of accepted + 1 */
    double draft_ms, verify_ms, rollback_ms; /* time drafting, verifying, truncating */
    double mean_draft_len;    /* mean draft length asked of the drafters per pass */
    int draft_len;            /* the draft length the next pass will ask for */
    double token_accept;      /* running per-token acceptance (adapt) */
    int64_t plain_passes;     /* passes that drafted nothing because plain steps
                                 measured faster (adapt) */
} ellm_spec_stats;

ellm_spec_params ellm_spec_default_params(void);
/* Speculative state over `ctx` (which it borrows; free it before the context).
 * ELLM_ERR_ARG names a bad drafter list or a context that cannot serve it. */
ellm_status ellm_spec_init(ellm_context *ctx, const ellm_spec_params *params, ellm_spec **out, ellm_error *err);
void ellm_spec_free(ellm_spec *spec);
/* One speculative step. The context's KV cache holds the history hist[0 ..
 * n_hist) (the prompt and every token returned so far) and its logits follow
 * the last fed token. Writes 1 .. min(max_tokens, draft_max + 2) tokens to out
 * (*n_out), drawn with `sampler` (its temperature decides greedy or
 * sampling); the caller appends them to its history. Afterwards the context
 * holds the history and the new tokens, except possibly the last one returned
 * (an end-of-generation token, or with sampling a token drawn on a rejection,
 * which the next step feeds; ellm_spec_sync feeds it now). */
ellm_status ellm_spec_step(ellm_spec *spec, ellm_sampler *sampler, const int32_t *hist, int n_hist,
                           int max_tokens, int32_t *out, int *n_out, ellm_error *err);
/* ellm_spec_step in two halves, so that the verify pass can be a part of a
 * batched pass with other sequences (ellm_decode_batch_rows; a batched row
 * equals a single-token step bit for bit, so the tokens are the same).
 * ellm_spec_draft_step draws the step's first token and drafts after it: the
 * tokens so far go to out (*n_out); if *n_feed is 0 the step is complete,
 * else the context must be fed feed[0 .. *n_feed) in one pass that writes
 * every row's logits (*n_feed x n_vocab floats) to *rows, and then
 * ellm_spec_verify_step accepts drafts and writes the step's tokens to out
 * (*n_out, from the start again) as ellm_spec_step does. verify_ms is what
 * the verify pass cost this sequence (for the adaptive draft length), or < 0
 * for the time since ellm_spec_draft_step returned. If the pass fails or will
 * not run, ellm_spec_cancel_step takes the context back to before the step.
 * feed and rows belong to the spec state and stay valid until its next step. */
ellm_status ellm_spec_draft_step(ellm_spec *spec, ellm_sampler *sampler, const int32_t *hist, int n_hist,
                                 int max_tokens, int32_t *out, int *n_out, const int32_t **feed, int *n_feed,
                                 float **rows, ellm_error *err);
ellm_status ellm_spec_verify_step(ellm_spec *spec, ellm_sampler *sampler, double verify_ms, int32_t *out,
                                  int *n_out, ellm_error *err);
void ellm_spec_cancel_step(ellm_spec *spec);
/* Forgets a token the last step returned but left unfed (see above): the
 * context is about to hold another sequence (a server slot's next request). */
void ellm_spec_reset(ellm_spec *spec);
/* With `on`, each step keeps the logits it draws its tokens from, so that
 * ellm_spec_token_logits can give them (for log-probabilities); costs a copy
 * of one row of logits per step. */
ellm_status ellm_spec_keep_logits(ellm_spec *spec, int on, ellm_error *err);
/* The target's logits (n_vocab floats) token i of the last step's out was
 * drawn from (accepted drafts: the verify row before them; a token drawn on
 * a rejection: that row), i < the step's *n_out; valid until the next step;
 * NULL without ellm_spec_keep_logits. */
const float *ellm_spec_token_logits(const ellm_spec *spec, int i);
/* Feeds a token the last step returned but left out of the context (see above). */
ellm_status ellm_spec_sync(ellm_spec *spec, ellm_error *err);
void ellm_spec_get_stats(const ellm_spec *spec, ellm_spec_stats *stats);
/* How drafter i of the chain got its weights, e.g. "q4_0 copy of 43
 * matrices (77.1 MB a step) loaded from /models/m.gguf.q4_0.ellm-draft";
 * "" for drafters without weights of their own (ngram, sparse:N). */
const char *ellm_spec_drafter_note(const ellm_spec *spec, int i);
/* Tokens per verify pass when drafts of length k are accepted in order, each
 * with probability a, until the first miss: (1 - a^(k+1)) / (1 - a). */
double ellm_spec_tokens_per_verify(double a, int k);
/* The per-token acceptance a that gives t tokens per verify at length k. */
double ellm_spec_token_acceptance(double t, int k);
/* The draft length k in [1, kmax] that makes the most tokens per second,
 * tokens_per_verify(a, k) / (k x draft_ms + verify_ms[k]), where verify_ms[k]
 * is the time of a verify pass of k + 1 tokens (verify_ms[1 .. kmax] read).
 * *tokens_per_s (may be NULL) gets that rate. Used by ellm bench --spec and
 * by the adaptive draft length. */
int ellm_spec_best_draft_length(double a, double draft_ms, const double *verify_ms, int kmax, double *tokens_per_s);

/* Teacher-forced drafter evaluation over tokens[0 .. n) (n <= the context
 * size; the context is reset): at positions score_from, score_from + every,
 * ..., the target is the full model's greedy continuation of draft_max + 1
 * tokens from the true prefix, and the drafters' proposal after its first
 * token is accepted up to the first mismatch, so loops in the model's own
 * generations cannot inflate the figures. Adds the counts to *acc and
 * recomputes its acceptance_rate and tokens_per_verify (verify_ms: time of
 * the target continuations; draft_ms: of the drafts). */
ellm_status ellm_spec_eval(ellm_context *ctx, const ellm_spec_params *params, const int32_t *tokens, int n,
                           int score_from, int every, ellm_spec_stats *acc, ellm_error *err);

/* Draft maps for shallow:K drafters: per K, a linear map from the residual
 * stream after the first K layers to the stream after the last one, fitted
 * by least squares over sample text, so a shallow draft sees an estimate of
 * the full model's last hidden state (ellm calibrate --draft). Collect over
 * any number of token windows, then write the maps (a small GGUF) once. */
typedef struct ellm_draft_calib ellm_draft_calib;
/* A fit for each K in layers[0 .. n_layers) (1 <= K < the model's layers);
 * normalize: fit (and later apply) the streams scaled to unit RMS, so every
 * position weighs the same, as the head sees them after the output norm. */
ellm_status ellm_draft_calib_init(const ellm_model *m, const int *layers, int n_layers, int normalize,
                                  ellm_draft_calib **out, ellm_error *err);
/* Runs tokens[0 .. n) through ctx (reset first; n <= its size) and adds every
 * position's streams to the fit. */
ellm_status ellm_draft_calib_collect(ellm_context *ctx, ellm_draft_calib *calib, const int32_t *tokens, int n,
                                     ellm_error *err);
/* Solves the fits and writes them to `path`; the sums are spent afterwards. */
ellm_status ellm_draft_calib_write(ellm_draft_calib *calib, const char *path, ellm_error *err);
void ellm_draft_calib_free(ellm_draft_calib *calib);

/* The sampler's random-generator state: with the tokens so far (the
 * repetition history, which the caller keeps) it is all a sampler carries
 * from one draw to the next, so restoring it continues a seeded run exactly. */
typedef struct {
    uint64_t rng[4];
} ellm_sampler_state;

void ellm_sampler_get_state(const ellm_sampler *s, ellm_sampler_state *out);
void ellm_sampler_set_state(ellm_sampler *s, const ellm_sampler_state *state);

/* ---- saving and restoring a context (resumable generation) ---------------- */

/* Writes the context to `path` atomically (a temporary file in the same
 * folder, fsync, rename, fsync of the folder: a crash leaves the old file or
 * the new one, never a torn one): the KV cache positions held, the logits after
 * the last token, the sparse budgets and their adaptation state, counters, an
 * identity of the model file, and `app_len` bytes of the caller's own (its
 * settings, tokens, sampler state). Every section carries a CRC-32C. The sparse
 * index is rebuilt from the stored keys on load, exactly as it was. */
ellm_status ellm_context_state_save(const ellm_context *ctx, const char *path, const void *app,
                                    size_t app_len, ellm_error *err);
/* Reads only the caller's bytes of a state file (checking the header, the file
 * size and that section's checksum), to learn the settings before making the
 * model and context. *app is released with ellm_free. Safe on untrusted files. */
ellm_status ellm_state_read_app(const char *path, void **app, size_t *app_len, ellm_error *err);
/* Restores a context saved by ellm_context_state_save. The context must be of
 * the same model file (checked: size, hash of metadata and weight samples,
 * shapes), the same KV type and hold at least the saved positions; a
 * truncated or corrupted file gets ELLM_ERR_FORMAT naming what is wrong. On
 * failure the context is either untouched or emptied (position 0). Decoding
 * after a load with the same thread count continues bit for bit. */
ellm_status ellm_context_state_load(ellm_context *ctx, const char *path, ellm_error *err);

/* ---- benchmarking ---------------------------------------------------------- */

/* Fills the KV cache up to position n with synthetic keys and values, as fast
 * as memory allows, so decode can be timed at depths too deep to prefill.
 * Keys get per-channel offsets and RoPE rotation by position like a trained
 * model's; the tokens are not real. Replaces the current contents. */
ellm_status ellm_context_fill_synthetic(ellm_context *ctx, int n, uint64_t seed, ellm_error *err);
/* Bytes of K and V stored per token (all layers and KV heads). */
size_t ellm_context_kv_bytes_per_token(const ellm_context *ctx);
/* Read-bandwidth self-test: streams a `bytes` buffer with n_threads pinned
 * threads and returns the best of `reps` runs in GB/s (0 on failure). */
double ellm_measure_read_gbps(int n_threads, size_t bytes, int reps);

/* ---- runtime -------------------------------------------------------------- */

/* Name of the kernel ISA in use: "scalar", "avx2" or "avx512". The choice is
 * made once from CPU features; ELLM_ISA=scalar|avx2|avx512 overrides it. */
const char *ellm_isa_name(void);
/* Compute threads used when none are asked for: one per physical core of
 * the process's CPU mask, or fewer under a cgroup CPU quota (a container's
 * --cpus): the quota's whole CPUs, at least one. */
int ellm_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif
