/* libFuzzer target: the whole converter (convert_hf_to_gguf) on a checkpoint
 * folder made from the input. Input: one byte choosing the output type, the
 * config.json text, a NUL byte, then a whole model.safetensors. The folder
 * (under /dev/shm when it exists) also holds a fixed 16-piece tokenizer.model.
 * Whatever the input, the run either writes a GGUF that reads back with the
 * tensor count it reports, or fails with a message and leaves no output or
 * temporary file behind. Tensor data is arbitrary bytes (NaN, infinities,
 * subnormals) and goes through every quantizer (scalar kernels). Seeds:
 * fuzz/make_convert_seeds writes tiny llama, mistral, qwen2 and qwen3
 * checkpoints. */
#include "fuzz_common.h"
#include "sp_writer.h"

#include "convert/convert.h"
#include "gguf/gguf.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <stdint.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char g_dir[256], g_cfg[300], g_st[300], g_out[300];

static void write_all(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    FUZZ_CHECK(fp && fwrite(p, 1, n, fp) == n && fclose(fp) == 0, "writing %s", path);
}

/* Removes the folder when the fuzzer exits. */
static void cleanup(void) {
    static const char *const names[] = {"config.json", "model.safetensors", "tokenizer.model", "out.gguf"};
    char path[300];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
        unlink(path);
    }
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("ELLM_ISA", "scalar", 1);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/ellm-fuzz-convert-%d", base, (int)getpid());
    FUZZ_CHECK(mkdir(g_dir, 0700) == 0 || errno == EEXIST, "mkdir %s", g_dir);
    snprintf(g_cfg, sizeof g_cfg, "%s/config.json", g_dir);
    snprintf(g_st, sizeof g_st, "%s/model.safetensors", g_dir);
    snprintf(g_out, sizeof g_out, "%s/out.gguf", g_dir);
    uint8_t sp[1024];
    size_t n = spw_small_model(sp, sizeof sp);
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.model", g_dir);
    write_all(path, sp, n);
    atexit(cleanup);
    return 0;
}

/* Number of entries in the folder besides . and .. */
static int n_entries(void) {
    DIR *d = opendir(g_dir);
    FUZZ_CHECK(d != NULL, "opendir");
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int n_types;
    const convert_type *types = convert_types(&n_types);
    const convert_type *ty = &types[data[0] % n_types];
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    if (!nul) return 0;
    write_all(g_cfg, data + 1, (size_t)(nul - data - 1));
    write_all(g_st, nul + 1, size - (size_t)(nul + 1 - data));
    convert_params p = {.type = ty->name, .n_threads = 1};
    convert_summary sum;
    ellm_error err = {0};
    ellm_status st = convert_hf_to_gguf(g_dir, g_out, &p, &sum, &err);
    if (st != ELLM_OK) {
        if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "refused: %s\n", err.msg);
        FUZZ_CHECK(err.msg[0] != 0, "a failed conversion leaves a message");
        FUZZ_CHECK(n_entries() == 3, "a failed conversion left %d files (want the 3 inputs): %s", n_entries(),
                   err.msg);
        return 0;
    }
    gguf_file *f = NULL;
    st = gguf_open(g_out, &f, &err);
    FUZZ_CHECK(st == ELLM_OK, "the converted file does not read back: %s", err.msg);
    FUZZ_CHECK(gguf_n_tensors(f) == sum.n_tensors, "%lld tensors in the file, %lld reported",
               (long long)gguf_n_tensors(f), (long long)sum.n_tensors);
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "converted: %lld tensors\n", (long long)gguf_n_tensors(f));
    gguf_close(f);
    unlink(g_out);
    FUZZ_CHECK(n_entries() == 3, "a finished conversion left %d files besides its output", n_entries() - 3);
    return 0;
}
