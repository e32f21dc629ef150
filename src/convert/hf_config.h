/* config.json of a Hugging Face checkpoint: the architecture and its
 * hyper-parameters, checked and mapped to what a GGUF file records.
 *
 * Accepted architectures: LlamaForCausalLM and MistralForCausalLM (GGUF
 * "llama", Q/K rows permuted from the HF rotate-half layout to adjacent
 * pairs), Qwen2ForCausalLM ("qwen2", Q/K/V biases) and Qwen3ForCausalLM
 * ("qwen3", per-head Q/K norms, head_dim may differ from hidden/heads).
 * Anything else is refused by name. Safe on untrusted input; a failure names
 * the file and the field. */
#ifndef ELLM_CONVERT_HF_CONFIG_H
#define ELLM_CONVERT_HF_CONFIG_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

typedef enum { HF_ARCH_LLAMA, HF_ARCH_MISTRAL, HF_ARCH_QWEN2, HF_ARCH_QWEN3 } hf_arch;

typedef enum {
    HF_ROPE_NONE,
    HF_ROPE_LINEAR, /* rope.scaling.type "linear" + factor */
    HF_ROPE_YARN,   /* "yarn" + factor + original context length */
    HF_ROPE_LLAMA3  /* Llama 3.1 frequency factors: a rope_freqs tensor */
} hf_rope_scaling;

typedef struct {
    hf_arch arch;
    char hf_name[64];       /* "LlamaForCausalLM" */
    const char *gguf_arch;  /* "llama", "qwen2", "qwen3" */
    int64_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx;
    int head_dim_given;     /* config.json has "head_dim" (written as key_length) */
    double rms_eps;
    double rope_theta;
    hf_rope_scaling rope_scaling;
    double rope_factor, rope_low_freq, rope_high_freq;
    int64_t rope_orig_ctx;
    /* YaRN's beta_fast, beta_slow and attention_factor (from mscale and
     * mscale_all_dim when given so); 0 where the configuration leaves the default */
    double yarn_beta_fast, yarn_beta_slow, yarn_attn_factor;
    int tied;               /* tie_word_embeddings: no lm_head, output = token_embd */
    int permute_qk;         /* llama/mistral: HF q/k rows -> GGUF interleaved pairs */
    int64_t bos_id, eos_id; /* bos_token_id / eos_token_id, -1 if absent */
} hf_config;

/* Parses config.json text (`what` names it in messages). */
ellm_status hf_config_parse(const char *json, size_t len, const char *what, hf_config *out, ellm_error *err);
/* Reads DIR/config.json. */
ellm_status hf_config_load(const char *dir, hf_config *out, ellm_error *err);

/* The Llama 3 rope_freqs factors (n = head_dim / 2 floats), as llama.cpp's
 * converter computes them from rope_scaling (factor, low/high_freq_factor,
 * original_max_position_embeddings) and rope_theta. */
void hf_config_llama3_rope_freqs(const hf_config *c, float *out);

#endif
