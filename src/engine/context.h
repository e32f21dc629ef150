/* One sequence being generated: its KV cache, scratch buffers and threads. */
#ifndef ELLM_ENGINE_CONTEXT_H
#define ELLM_ENGINE_CONTEXT_H

#include "attention/attention.h"
#include "attention/kv_cache.h"
#include "core/threadpool.h"
#include "model/model.h"

struct ellm_context {
    ellm_model *model;
    ellm_context_params params;
    int n_ctx;
    int n_batch;
    kv_cache *kv;
    attention_workspace *attn_ws;
    threadpool *pool;
    /* scratch, sized for n_batch tokens (shapes per token in comments) */
    float *x;        /* (d) residual stream */
    float *xn;       /* (d) normalized */
    float *q;        /* (n_head * hd) */
    float *k, *v;    /* (n_kv * hd) */
    float *att;      /* (n_head * hd) attention output */
    float *gate, *up;/* (ff) */
    float *rope_cs;  /* (n_rot) cos/sin pairs for each token */
    void *act;       /* prepared activations for the widest matmul */
    size_t act_bytes;
    float *logits;   /* (n_vocab) after the last token */
    int has_logits;
};

/* Runs the model on n tokens (n <= n_batch) at positions [pos, pos + n) and
 * writes the logits of rows [first_logit_row, n) to `logits` (row stride
 * n_vocab). The KV cache must hold exactly `pos` tokens; on return it holds
 * pos + n. */
void engine_forward(struct ellm_context *ctx, const int32_t *tokens, int n, int pos,
                    int first_logit_row, float *logits);

#endif
