/* libFuzzer target: the whole GGUF model loader. The input is a whole GGUF
 * file, parsed from memory (gguf_open_memory) and loaded by model_load_gguf:
 * header, metadata, tensor table, hyper-parameter ranges, tensor types and
 * shapes, and the tokenizer. A model that loads must then run: a context of 8
 * tokens decodes a prompt of 3 and one more token on 1 thread, and every
 * logit is read (scalar kernels). Any status is fine for a bad file, as long as it leaves a
 * message and no model; crashes, leaks and sanitizer reports are bugs.
 * Seeds: fuzz/make_seeds writes tiny llama, mistral, qwen2 and qwen3 models. */
#include "fuzz_common.h"

#include "gguf/gguf.h"
#include "model/model.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The scalar reference kernels: sanitizers and coverage see every read of
 * the weights (build.sh builds the per-ISA files without them). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("ELLM_ISA", "scalar", 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A mapping starts page-aligned; copy so tensor data sits as it would. */
    void *buf = NULL;
    if (posix_memalign(&buf, 64, size ? size : 1) != 0) return 0;
    memcpy(buf, data, size);
    gguf_file *f = NULL;
    ellm_error err = {0};
    if (gguf_open_memory(buf, size, &f, &err) != ELLM_OK) {
        FUZZ_CHECK(f == NULL && err.msg[0] != 0, "a failed parse leaves a message and no file");
        free(buf);
        return 0;
    }
    ellm_model_params mp = {.n_threads = 1, .pin_threads = 0};
    ellm_model *m = (ellm_model *)1;
    ellm_status st = model_load_gguf(f, &mp, &m, &err);
    if (st != ELLM_OK) {
        FUZZ_CHECK(m == NULL && err.msg[0] != 0, "a failed load leaves a message and no model");
        free(buf);
        return 0;
    }
    ellm_model_info info;
    ellm_model_get_info(m, &info);
    FUZZ_CHECK(info.n_vocab >= 1 && info.n_layer >= 1 && info.n_embd >= 1, "loaded model has empty shape");

    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = 8;
    cp.n_batch = 2;
    cp.n_threads = 1;
    ellm_context *ctx = NULL;
    if (ellm_context_init(m, &cp, &ctx, &err) == ELLM_OK) {
        int32_t ids[3] = {0, (int32_t)(info.n_vocab - 1), (int32_t)(info.n_vocab / 2)};
        int32_t next = ellm_token_bos(m) >= 0 && ellm_token_bos(m) < info.n_vocab ? ellm_token_bos(m) : 0;
        if (ellm_decode(ctx, ids, 3, NULL, &err) == ELLM_OK && ellm_decode(ctx, &next, 1, NULL, &err) == ELLM_OK) {
            const float *logits = ellm_context_logits(ctx);
            FUZZ_CHECK(logits != NULL, "decode succeeded without logits");
            volatile float sum = 0;
            for (int i = 0; i < info.n_vocab; i++) sum += logits[i];
            (void)sum;
        } else {
            FUZZ_CHECK(err.msg[0] != 0, "a failed decode leaves a message");
        }
        ellm_context_free(ctx);
    } else {
        FUZZ_CHECK(ctx == NULL && err.msg[0] != 0, "a failed context leaves a message and no context");
    }
    int32_t toks[16];
    int n = 0;
    ellm_tokenize(m, "ab a", 4, 1, 1, toks, 16, &n, &err);
    ellm_model_free(m);
    free(buf);
    return 0;
}
