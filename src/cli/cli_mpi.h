/* `--mpi` for the commands that take it (run, logits, bench, serve). */
#ifndef ELLM_CLI_CLI_MPI_H
#define ELLM_CLI_CLI_MPI_H

#include "ellm.h"

/* Default for --mpi-timeout: seconds a rank waits for the others in one
 * collective before the job is stopped. */
#define CLI_MPI_TIMEOUT_S 300.0

/* Starts MPI (the command runs under mpirun); on ranks other than 0 stdout
 * and (unless keep_stderr: a server's followers say why they stop) stderr go
 * to /dev/null. Returns NULL after printing why. */
ellm_mpi *cli_mpi_start(double timeout_s, int keep_stderr);
/* Every rank says whether its setup (model, context) succeeded; returns 1 if
 * all did. Ranks that agree on a failure end with cli_mpi_end(mpi, rc, 1),
 * which finalizes instead of stopping the job, so rank 0's message is kept. */
int cli_mpi_setup_ok(ellm_mpi *mpi, int ok);
/* Ends the job: with rc != 0 (and not `agreed`) on a job of several ranks, stops every rank
 * (the others could be waiting for this one); otherwise finalizes MPI.
 * Returns rc. NULL mpi: returns rc. */
int cli_mpi_end(ellm_mpi *mpi, int rc, int agreed);

#endif
