/* A loaded model: hyper-parameters from GGUF metadata and weight tensors bound
 * (zero-copy) to the file mapping. Supports the llama (incl. rope_freqs,
 * untied output, Mistral-style files), qwen2 (QKV bias, NeoX RoPE) and qwen3
 * (QK-norm, key_length != n_embd / n_head) architectures. */
#ifndef ELLM_MODEL_MODEL_H
#define ELLM_MODEL_MODEL_H

#include "ellm.h"
#include "gguf/gguf.h"
#include "topology/plan.h"
#include "tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdint.h>

typedef enum { MODEL_ARCH_LLAMA, MODEL_ARCH_QWEN2, MODEL_ARCH_QWEN3 } model_arch;

/* How a matrix's bytes are laid out. */
typedef enum {
    MODEL_LAYOUT_ROWS = 0,   /* row-major, as in the file */
    MODEL_LAYOUT_R16 = 1     /* Q8_0, Q4_0, Q4_K or Q5_K interleaved by 16 rows (kern_r16_pack), rewritten at load */
} model_layout;

/* A weight matrix of `rows` x `cols` (GGUF ne = {cols, rows}) in the mapping,
 * `row_bytes` per row: row-major, or (layout) groups of 16 rows of the same
 * bytes rearranged. */
typedef struct {
    int type;
    const void *data;
    int64_t rows, cols;
    size_t row_bytes;
    model_layout layout;
} model_matrix;

typedef enum { MODEL_ROPE_NONE = 0, MODEL_ROPE_LINEAR = 1, MODEL_ROPE_YARN = 2 } model_rope_scaling;

typedef struct {
    model_arch arch;
    char arch_name[32];
    int n_vocab;
    int n_ctx_train;
    int sliding_window; /* <arch>.attention.sliding_window: keys a query may see; 0 = all */
    int n_embd;      /* d */
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;    /* key/value length per head */
    int n_ff;
    int n_rot;       /* rotated dims per head */
    int rope_neox;   /* 1: rotate (x[i], x[i + n_rot/2]); 0: adjacent pairs */
    float rope_theta;
    /* RoPE scaling (<arch>.rope.scaling.*, as llama.cpp reads them): positions
     * rotate by rope_scale times their frequencies (linear), or YaRN blends
     * the scaled and unscaled frequencies by pair and multiplies cos and sin
     * by a magnitude; rope_attn_factor multiplies that magnitude in every case. */
    model_rope_scaling rope_scaling;
    float rope_factor;      /* the context extension factor (1 = none) */
    int rope_orig_ctx;      /* YaRN: the context the model was trained with before extension */
    float rope_attn_factor; /* <arch>.rope.scaling.attn_factor, 1 if absent */
    float yarn_beta_fast;   /* YaRN: pairs turning more than this often over rope_orig_ctx keep their frequency (32) */
    float yarn_beta_slow;   /*   those turning less than this often take 1/factor of it (1) */
    float yarn_magnitude;   /*   cos and sin times this; 0: 1 + 0.1 ln(factor) */
    float norm_eps;
} model_config;

/* A model derived from another for drafting (src/spec/draft_model.c): it
 * borrows the base's tokenizer, vectors and unchanged matrices, is made once
 * per kind and shared by every context, and is freed with the base by
 * free_fn. */
typedef struct model_derived {
    struct model_derived *next;
    char key[48];            /* what it is, e.g. "quant:q4_0" */
    struct ellm_model *m;
    void (*free_fn)(struct ellm_model *);
} model_derived;

typedef struct {
    const float *attn_norm;            /* (d) */
    model_matrix wq, wk, wv, wo;       /* (n_head*hd, d) (n_kv*hd, d) (n_kv*hd, d) (d, n_head*hd) */
    const float *bq, *bk, *bv;         /* qwen2 biases or NULL */
    const float *q_norm, *k_norm;      /* qwen3 per-head norms (hd) or NULL */
    const float *ffn_norm;             /* (d) */
    model_matrix w_gate, w_up, w_down; /* (ff, d) (ff, d) (d, ff) */
} model_layer;

struct ellm_model {
    gguf_file *file;
    model_config cfg;
    tokenizer *tok;
    model_matrix tok_embd; /* (n_vocab, d) */
    model_matrix output;   /* (n_vocab, d): output.weight or tok_embd if tied */
    const float *output_norm;
    const float *rope_freqs; /* (n_rot/2) frequency divisors, or NULL */
    double *rope_freq;       /* (n_rot/2) rotation per position: base^(-2i/n_rot) / factor_i, then scaled */
    double rope_mscale;      /* cos and sin of a position's rotation times this (YaRN, attn_factor; else 1) */
    uint64_t rope_override_hash; /* 0, or a hash of the RoPE settings when ellm_model_params.rope changed them */
    model_layer *layers;
    float **owned;   /* vectors converted to F32 at load (non-F32 norms/biases) */
    int n_owned;
    int n_threads;
    int pin_threads;
    /* NUMA placement (model_place_weights): NULL plan when off */
    topo_plan *plan;
    ptrdiff_t *node_delta;   /* (plan->n_nodes) replicate: node k's copy of a weight byte p is
                                at p + node_delta[k]; NULL unless replicated */
    void **replicas;         /* (plan->n_nodes) the copies, replica_bytes each */
    size_t replica_bytes;
    int split_by_matrix;     /* distribute over several nodes: split each matrix on its own */
    char placement[320];     /* description for --stats */
    uint64_t n_params;
    uint64_t weight_bytes;
    int n_repacked;           /* matrices model_repack_weights rewrote in the mapping */
    char repack_note[160];    /* why it rewrote none that it could have (memory), or "" */
    int keep_layout;          /* loaded with ellm_model_params.keep_layout (copies derived from it keep it too) */
    uint64_t repacked_hash;   /* model_file_hash taken just before they were rewritten */
    double load_ms;
    char *path;               /* the file it was loaded from, or NULL (memory) */
    /* Shallow drafts (cfg.n_layer cut short): an optional (d, d) F32 map from
     * the last kept layer's residual stream to the full model's, applied to
     * the rows whose logits are wanted before the output norm; data NULL:
     * none. */
    model_matrix draft_map;
    int draft_map_norm;       /* 1: the map takes the stream scaled to unit RMS */
    model_derived *derived;   /* drafting copies made from this model */
    pthread_mutex_t derived_lock;
};

/* ellm_model_load on a GGUF file already open (e.g. from memory, for the
 * loader's fuzz target). Takes ownership of `f`: it is closed on failure, or
 * by ellm_model_free. Safe on untrusted files, as ellm_model_load. */
ellm_status model_load_gguf(gguf_file *f, const ellm_model_params *params, ellm_model **out,
                            ellm_error *err);

/* cos/sin of every rotated frequency at position `pos` into cs (n_rot/2 pairs),
 * the table kern_rope takes. */
/* Plans threads and places the weights for params->numa (see ellm_numa_mode),
 * requests transparent huge pages for the weights and locks them with
 * params->mlock. Best effort: placement that the kernel refuses is noted in
 * m->placement, never an error; only an unusable topology or out of memory
 * fails. */
ellm_status model_place_weights(ellm_model *m, const ellm_model_params *params, ellm_error *err);
void model_placement_free(ellm_model *m);

/* cs[2i], cs[2i + 1] = cos, sin of position pos's rotation of pair i, times
 * rope_mscale: what the forward pass multiplies queries and keys by. */
void model_rope_cos_sin(const ellm_model *m, int pos, float *cs);
/* The same rotation by delta positions without the magnitude: what moves a
 * stored key from position p to p + delta (context shift). */
void model_rope_rotation(const ellm_model *m, int delta, float *cs);

/* Rewrites the Q8_0 and Q4_0 (and on AVX2 Q4_K and Q5_K) matrices of a mapped model
 * into MODEL_LAYOUT_R16 where the CPU has its kernel, unless params->keep_layout (model/repack.c),
 * and sets m->n_repacked (taking m->repacked_hash first). Never fails: when
 * it cannot rewrite them all, none is rewritten. */
void model_repack_weights(ellm_model *m, const ellm_model_params *params);
/* Writes to list (room for 7 per layer + 1) the matrices that can be
 * rewritten into MODEL_LAYOUT_R16 (a type the layout serves on this CPU,
 * kern_r16_packs; not rewritten yet) and pass `take` (NULL: all), by
 * launch: per layer Q/K/V, O, gate/up, down, then the output. A launch
 * splits its matrices' concatenated rows in 16-row units, so its matrices
 * are candidates only if all of them have whole groups of 16 rows.
 * Returns how many. */
int model_r16_candidates(ellm_model *m, int (*take)(const model_matrix *w, void *arg), void *arg,
                         model_matrix **list);
/* Rewrites the n matrices of list (model_r16_candidates) (reordered by address) into
 * MODEL_LAYOUT_R16 where the CPU has the kernel: the pages from the first
 * matrix's to the last one's are replaced, at the same addresses, by
 * read-only huge-page memory holding the same bytes with the matrices packed
 * (so they must hold nothing else that is written later). Returns n, or 0
 * with nothing changed (no kernel, overlapping matrices, out of memory, or
 * the new memory would not fit in what the process may take: then why, if
 * not NULL, says so in why_cap bytes). */
int model_pack_r16(model_matrix **list, int n, char *why, size_t why_cap);
/* FNV-1a 64 of a GGUF file's metadata (header, keys, tensor directory:
 * everything before the first tensor's data), which says what the model is,
 * and of 64 samples of 256 bytes spread over the tensor data, which tell apart
 * files that share their metadata (two random-weight files of one shape, a
 * fine-tune saved with the same keys); read from f's mapping. */
uint64_t model_file_hash(const gguf_file *f);
/* model_file_hash of the file m was loaded from, whatever the load rewrote in
 * the mapping since (taken then, not at every load: ~1.7 ms for a 1.4 MB
 * header). Saved states name their model by it. */
uint64_t model_content_hash(const ellm_model *m);
/* Row r of w as floats, whatever its layout. */
void model_matrix_row(const model_matrix *w, int64_t r, float *dst);

/* A layer's weight matrices grouped by the input they read, in llama.cpp's
 * names without "blk.N." and ".weight": Q, K and V read the attention's
 * normed input, the output projection the attention's result, gate and up
 * the FFN's normed input, down the gated product. A file that keeps one
 * entry per input (the covariances of an importance matrix) keeps it under
 * the group's first matrix. */
enum { MODEL_INPUT_GROUPS = 4, MODEL_INPUT_GROUP_MAX = 3 };
extern const char *const model_input_groups[MODEL_INPUT_GROUPS][MODEL_INPUT_GROUP_MAX];
/* Writes to out (size bytes) the tensor name of the first matrix that reads
 * the input of tensor `name` ("blk.3.attn_k.weight" -> "blk.3.attn_q.weight");
 * `name` itself when no other matrix comes first. 0 when out is too small. */
int model_input_owner(const char *name, char *out, size_t size);

#endif
