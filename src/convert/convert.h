/* Hugging Face checkpoint folder -> GGUF file.
 *
 * Reads config.json (hf_config.h), the safetensors weights (safetensors.h) and
 * the tokenizer files (hf_vocab.h), and writes a GGUF with the metadata keys
 * and tensor names llama.cpp's converter writes, so files of the standard
 * types load in llama.cpp unchanged.
 *
 * Tensors are streamed: each is read from the mapping, converted to F32 a
 * chunk of rows at a time (Q/K rows permuted for llama/Mistral), quantized on
 * all threads and written, so memory stays at a few chunks whatever the
 * model size. The file is written under a temporary name in the output's
 * folder, fsynced and renamed at the end; a failed or cancelled run removes
 * it and never leaves a partial OUT file.
 *
 * Every input file is untrusted: a failure names the file and the problem
 * (missing tensor, shape or dtype that disagrees with config.json, unknown
 * architecture, unsupported tokenizer). Nothing here prints. */
#ifndef ELLM_CONVERT_CONVERT_H
#define ELLM_CONVERT_CONVERT_H

#include "ellm.h"

#include <stdint.h>

/* general.file_type of int4-g128 files: not a llama_ftype (llama.cpp has no
 * such type); the value is the tensor type id (docs/GGUF.md). */
#define CONVERT_FTYPE_INT4_G128 128

/* Output types (--type). */
typedef struct {
    const char *name;   /* "q4_k_m" */
    int base;           /* qtype of most matrices */
    int file_type;      /* general.file_type (llama_ftype) */
    int llama_cpp_ok;   /* 1 if llama.cpp can load the result */
    const char *help;
} convert_type;

/* The known output types, and the one named `name` (NULL if none). */
const convert_type *convert_types(int *n);
const convert_type *convert_type_find(const char *name);

/* The qtype a 2-D weight gets in a file of type `t`, as llama-quantize picks
 * it: the output matrix (token_embd when tied) is Q6_K for the 4-bit types;
 * q4_k_m uses Q6_K for attn_v and ffn_down in more_bits layers (the first
 * and last eighth and every third between). Rows (ne0) that are not a
 * multiple of the type's block fall back: Q4_K -> Q5_0, Q6_K -> Q8_0 (llama-quantize's),
 * INT4_G128 -> Q4_0, and 32-element block types -> F16. */
int convert_matrix_type(const convert_type *t, int is_output, int more_bits, int64_t ne0);
/* llama.cpp's use_more_bits(layer, n_layer). */
int convert_more_bits(int layer, int n_layer);

typedef struct {
    const char *tensor;     /* GGUF name of the tensor being written */
    int index, n_tensors;   /* 0-based index of it */
    int type;               /* its qtype */
    uint64_t src_done, src_total; /* source (safetensors) bytes read so far / in all */
    uint64_t out_done, out_total; /* output bytes written so far / in all */
    double elapsed_s;
    int tensor_finished;    /* 1 when this report closes the tensor */
} convert_progress;

typedef void (*convert_progress_fn)(void *user, const convert_progress *p);

typedef struct {
    const char *type;              /* output type name (convert_types) */
    int n_threads;                 /* <= 0: one per physical core */
    convert_progress_fn progress;  /* may be NULL */
    void *progress_user;
    volatile int *cancel;          /* when *cancel becomes non-zero the run stops (may be NULL) */
    const char *imatrix;           /* importance matrix file (ellm calibrate --imatrix) or NULL:
                                      Q4_0 and INT4_G128 rows minimize the error it weights */
} convert_params;

typedef struct {
    int64_t n_tensors;
    uint64_t src_bytes, out_bytes;
    uint64_t n_params;
    double seconds;
    char arch[16];
} convert_summary;

/* Converts the checkpoint in `hf_dir` into `out_path`. `sum` may be NULL. */
ellm_status convert_hf_to_gguf(const char *hf_dir, const char *out_path, const convert_params *p,
                               convert_summary *sum, ellm_error *err);

#endif
