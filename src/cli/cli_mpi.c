/* `--mpi`: start and end an MPI job around a command. */
#include "cli/cli_mpi.h"

#include <stdio.h>

ellm_mpi *cli_mpi_start(double timeout_s, int keep_stderr) {
    ellm_error err = {0};
    ellm_mpi *mpi = NULL;
    if (ellm_mpi_init(NULL, NULL, timeout_s, &mpi, &err) != ELLM_OK) {
        fprintf(stderr, "error: --mpi: %s\n", err.msg);
        return NULL;
    }
    /* Every rank runs the same command; only rank 0 speaks. */
    if (ellm_mpi_rank(mpi) != 0) {
        if (!freopen("/dev/null", "w", stdout) || (!keep_stderr && !freopen("/dev/null", "w", stderr))) {
            ellm_mpi_abort(mpi, 1);
            return NULL;
        }
    }
    return mpi;
}

int cli_mpi_setup_ok(ellm_mpi *mpi, int ok) {
    ellm_error err = {0};
    int all = 0;
    if (ellm_mpi_agree(mpi, ok, &all, &err) != ELLM_OK) {
        fprintf(stderr, "error: --mpi: %s\n", err.msg);
        return 0;
    }
    return all;
}

int cli_mpi_end(ellm_mpi *mpi, int rc, int agreed) {
    if (!mpi) return rc;
    /* A rank that failed alone would leave the others waiting in a
     * collective: stop the whole job (mpirun reports the exit status). */
    if (rc != 0 && !agreed && ellm_mpi_size(mpi) > 1) {
        fflush(stdout);
        fflush(stderr);
        ellm_mpi_abort(mpi, rc);
    }
    ellm_mpi_finalize(mpi);
    return rc;
}
