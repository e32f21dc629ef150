/* ellm: command-line front end. */
#include "cli/commands.h"
#include "ellm.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: ellm COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  run       generate text from a prompt (default model: the embedded one)\n"
            "  logits    write the logits after every token of an id file (parity checks)\n"
            "  tokenize  print the token ids of a text\n"
            "  synth     write a random-weight GGUF with the shape of a real model\n"
            "  convert   a Hugging Face checkpoint folder (safetensors) to GGUF\n"
            "  bench     memory bandwidth, decode speed against context depth, prefill speed\n"
            "  eval      perplexity, sparse-vs-dense agreement and KL on a text\n"
            "  calibrate per-head sparse attention budgets from sample text (--imatrix, --draft:\n"
            "            importance matrix, draft maps for shallow:K drafters)\n"
            "  probe     this machine: topology, memory bandwidth per NUMA node, channels, advice\n"
            "  serve     OpenAI-compatible HTTP server with continuous batching\n"
            "\n"
            "`ellm COMMAND --help` lists a command's options. Kernel ISA in use: %s\n",
            ellm_isa_name());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "logits")) return cmd_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return cmd_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "calibrate")) return cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(cmd, "probe")) return cmd_probe(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return cmd_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "ellm: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
