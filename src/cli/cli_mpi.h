/* `--mpi` for the commands that take it (run, logits, bench). */
#ifndef ELLM_CLI_CLI_MPI_H
#define ELLM_CLI_CLI_MPI_H

#include "ellm.h"

/* Default for --mpi-timeout: seconds a rank waits for the others in one
 * collective before the job is stopped. */
#define CLI_MPI_TIMEOUT_S 300.0

/* Starts MPI (the command runs under mpirun); on ranks other than 0 stdout
 * and stderr go to /dev/null. Returns NULL after printing why. */
ellm_mpi *cli_mpi_start(double timeout_s);
/* Ends the job: with rc != 0 on a job of several ranks, stops every rank
 * (the others could be waiting for this one); otherwise finalizes MPI.
 * Returns rc. NULL mpi: returns rc. */
int cli_mpi_end(ellm_mpi *mpi, int rc);

#endif
