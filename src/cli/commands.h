/* The ellm subcommands. Each takes the arguments after its name (argv[0] is
 * the subcommand) and returns the process exit status. */
#ifndef ELLM_CLI_COMMANDS_H
#define ELLM_CLI_COMMANDS_H

int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* `ellm bench --mpi` (cmd_bench_mpi.c): decode with the KV cache sharded over MPI ranks. */
int cmd_bench_mpi(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_convert(int argc, char **argv);
/* `ellm calibrate --imatrix` (cmd_imatrix.c). */
int cmd_calibrate_imatrix(int argc, char **argv);
/* `ellm calibrate --draft` (cmd_draft.c). */
int cmd_calibrate_draft(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
