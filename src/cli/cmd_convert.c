/* `ellm convert`: a Hugging Face checkpoint folder to a GGUF file, with a
 * progress bar on a terminal (tensor name, bytes, ETA) and one line per
 * tensor otherwise. Ctrl-C stops at the next chunk; the temporary output is
 * removed and OUT is left as it was. */
#include "cli/args.h"
#include "cli/commands.h"
#include "convert/convert.h"
#include "kernels/quant.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile int convert_cancel;
static volatile sig_atomic_t convert_signal;
static void convert_on_signal(int sig) {
    convert_cancel = 1;
    convert_signal = sig;
}

typedef struct {
    int tty;
    double last_s;
} convert_ui;

static void fmt_bytes(char *out, size_t cap, double b) {
    if (b >= 1e9)
        snprintf(out, cap, "%.2f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(out, cap, "%.1f MB", b / 1e6);
    else
        snprintf(out, cap, "%.0f kB", b / 1e3);
}

static void on_progress(void *user, const convert_progress *p) {
    convert_ui *ui = user;
    char done[32], total[32];
    fmt_bytes(done, sizeof done, (double)p->src_done);
    fmt_bytes(total, sizeof total, (double)p->src_total);
    if (!ui->tty) {
        if (p->tensor_finished)
            fprintf(stderr, "convert: [%d/%d] %-32s %-5s %s of %s read, %.1f s\n", p->index + 1, p->n_tensors,
                    p->tensor, qtype_get(p->type)->name, done, total, p->elapsed_s);
        return;
    }
    if (!p->tensor_finished && p->elapsed_s - ui->last_s < 0.1 && p->src_done) return;
    ui->last_s = p->elapsed_s;
    double frac = p->src_total ? (double)p->src_done / (double)p->src_total : 1.0;
    char bar[31];
    int fill = (int)(frac * 30 + 0.5);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    char eta[32] = "--";
    if (frac > 0.01 && frac < 1) snprintf(eta, sizeof eta, "%.0f s", p->elapsed_s * (1 - frac) / frac);
    fprintf(stderr, "\r\033[K[%s] %3.0f%% %s/%s ETA %s  %d/%d %s (%s)", bar, frac * 100, done, total, eta,
            p->index + 1, p->n_tensors, p->tensor, qtype_get(p->type)->name);
    fflush(stderr);
}

static void convert_usage(FILE *f) {
    int n;
    const convert_type *types = convert_types(&n);
    fprintf(f,
            "usage: ellm convert HF_DIR -o OUT.gguf --type TYPE [--threads N] [--imatrix FILE]\n"
            "\n"
            "Converts a Hugging Face checkpoint folder (config.json, model.safetensors or\n"
            "model-*.safetensors with model.safetensors.index.json, tokenizer.json or\n"
            "tokenizer.model, tokenizer_config.json, generation_config.json) into a GGUF\n"
            "file. Architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,\n"
            "Qwen3ForCausalLM. Weights may be F32, F16 or BF16.\n"
            "\n"
            "  -o, --output F  file to write; written under a temporary name and renamed at\n"
            "                  the end, so a failed run leaves no partial file\n"
            "  --type TYPE     output type (below); norms and biases stay F32\n"
            "  --threads N     quantization threads (default: one per physical core)\n"
            "  --imatrix FILE  importance matrix (ellm calibrate --imatrix): q4_0 and int4-g128\n"
            "                  rows minimize the rounding error weighted by it; a file made with\n"
            "                  --covariance rounds them with error feedback (GPTQ-style), which\n"
            "                  minimizes the error of the matrix's outputs instead\n"
            "\n"
            "types:\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "  %-10s %s%s\n", types[i].name, types[i].help,
                types[i].llama_cpp_ok ? "" : "\n             eLLM's own type: llama.cpp will not load it");
}

int cmd_convert(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *type = NULL, *imatrix = NULL;
    long threads = 0;
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            convert_usage(stdout);
            return 0;
        } else if (arg_value(argc, argv, &i, "--output", "-o", &v, &bad)) {
            out = v;
        } else if (arg_value(argc, argv, &i, "--type", NULL, &v, &bad)) {
            type = v;
        } else if (arg_value(argc, argv, &i, "--imatrix", NULL, &v, &bad)) {
            imatrix = v;
        } else if (arg_value(argc, argv, &i, "--threads", "-t", &v, &bad)) {
            if (v && !arg_int("--threads", v, 1, 1024, &threads)) bad = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "error: unknown option '%s' (see ellm convert --help)\n", a);
            bad = 1;
        } else if (!dir) {
            dir = a;
        } else {
            fprintf(stderr, "error: more than one HF_DIR ('%s' and '%s')\n", dir, a);
            bad = 1;
        }
    }
    if (bad) return 2;
    if (!dir || !out || !*out || !type) {
        fprintf(stderr, "error: HF_DIR, -o and --type are required (see ellm convert --help)\n");
        return 2;
    }
    if (!convert_type_find(type)) {
        int n;
        const convert_type *types = convert_types(&n);
        fprintf(stderr, "error: unknown --type '%s'; one of:", type);
        for (int i = 0; i < n; i++) fprintf(stderr, " %s", types[i].name);
        fputc('\n', stderr);
        return 2;
    }
    convert_ui ui = {isatty(STDERR_FILENO), -1};
    convert_params p = {.type = type, .n_threads = (int)threads, .progress = on_progress, .progress_user = &ui,
                        .cancel = &convert_cancel, .imatrix = imatrix};
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = convert_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    convert_summary sum;
    ellm_error err = {0};
    ellm_status st = convert_hf_to_gguf(dir, out, &p, &sum, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (ui.tty) fputc('\n', stderr);
    if (st != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        if (convert_signal) raise(convert_signal);
        return 1;
    }
    fprintf(stderr,
            "convert: wrote %s: %s %s, %lld tensors, %.1fM parameters, %.3f GB read, %.3f GB written in %.1f s "
            "(%.2f GB/s read)\n",
            out, sum.arch, type, (long long)sum.n_tensors, sum.n_params / 1e6, sum.src_bytes / 1e9,
            sum.out_bytes / 1e9, sum.seconds, sum.seconds > 0 ? sum.src_bytes / 1e9 / sum.seconds : 0.0);
    return 0;
}
