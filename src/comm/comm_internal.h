/* strata: what the comm core shares with its backends and nothing else
 * sees. Only for src/comm/. */
#ifndef STRATA_COMM_INTERNAL_H
#define STRATA_COMM_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>

/* Set when st_comm_agree() found a disagreement: every rank knows it, and
 * will exit alike (the CLI's exit 2), so a non-zero exit then finishes MPI
 * instead of aborting the job (mpi.c's exit handler). */
extern atomic_bool st_comm_exit_alike;

/* $ST_COMM_TIMEOUT in seconds (300 when unset or not a number, with a
 * warning for the latter; -1 for 0, no limit): how long a rank waits for
 * its peers. */
double st_comm_env_timeout(void);

#endif
