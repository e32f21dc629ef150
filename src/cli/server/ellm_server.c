/* ellm_server: the server as its own binary, with the seed's flag names
 * (--model, --threads, --n-batch, --kv-cache-gb, --sparse-topk, --numa-aware);
 * the same options as `ellm serve`. */
#include "cli/commands.h"

int main(int argc, char **argv) { return cmd_serve(argc, argv); }
