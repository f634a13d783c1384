/* The run's part at world > 1 (src/train/run*.c only): the start-up
 * agreement, the ranks' nodes and shared --save, the stop flag every rank
 * agrees on, and the metrics' ZeRO fields (docs/zero.md). */
#ifndef STRATA_TRAIN_RUN_ZERO_H
#define STRATA_TRAIN_RUN_ZERO_H

#include "strata/comm.h"
#include "strata/engine.h"
#include "strata/run.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct st_dataset;

/* What the ranks of a run found at start: the nodes, and their names for
 * the "world:" line, "nodea (ranks 0-1), nodeb (ranks 2-3)". */
struct st_run_nodes {
	int nodes;
	char hosts[256];
};

/* Every rank runs the same configuration on the same data: one line per
 * key of cfg_json, the data's size, run_line and the BLAS, compared
 * across the ranks before anything is allocated (on a communicator of its
 * own); then the nodes (*wi) and, with save on more than one node, that
 * every node sees the same DIR. Nothing at world 1. Returns 0 or -errno:
 * res->exit_code 2 when the ranks disagree (rank 0's error says where, the
 * others are quiet), 1 on a comm failure. */
int st_run_zero_agree(const struct st_engine_config *ec, const char *cfg_json,
		      const struct st_dataset *ds, const char *run_line, const char *save,
		      struct st_run_nodes *wi, struct st_run_result *res);

/* lines alike on every rank of c, as above (exit_code 2 when not, 1 on a
 * comm failure). */
int st_run_zero_lines(struct st_comm *c, int rank, const char *const *lines, int n,
		      struct st_run_result *res);

/* Whether any rank has flag (a stop asked for), into *any: every rank
 * stops after the same step, or their collectives would no longer pair
 * up. Returns 0 or -errno. */
int st_run_zero_any(struct st_engine *e, bool flag, bool *any);

/* Every rank's peak per tier (world > 1, --metrics: collective), into
 * *all: [world * ST_HOME_COUNT], allocated at the first call, 0 for a tier
 * a rank does not have. Returns 0 or -errno. */
int st_run_zero_peaks(struct st_engine *e, const struct st_engine_stats *es, uint64_t **all);

/* A metrics line's ZeRO part (world > 1): each collective of the step
 * (calls, bytes, the comm queue's busy time) between a and b, and every
 * rank's peak per tier. */
void st_run_zero_metrics(FILE *mf, const struct st_comm_stats *a, const struct st_comm_stats *b,
			 const uint64_t *peaks, int world);

#endif
