/* A training run as one library call: what `strata train` does after its
 * flags are parsed, for the CLI, the tests, the benchmarks and any other
 * program. The run opens the engine on the caller's dataset, prints the
 * plan and one progress line per step to cfg->out, writes the metrics,
 * the trace and the checkpoints, resumes, stops when asked, and at world
 * > 1 agrees with the other ranks (ZeRO; docs/zero.md). It never exits and
 * installs no signal handler: a stop is a flag the caller sets. */
#ifndef STRATA_RUN_H
#define STRATA_RUN_H

#include "strata/engine.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

struct st_dataset;

/* Validation batches by default: what --val-data holds, at most this. */
#define ST_RUN_VAL_BATCHES 20

/* One step, as the run's progress line says it (st_run_config.on_step). */
struct st_run_step {
	int step; /* 1-based, as printed */
	double loss, lr, grad_norm;
	double val_loss; /* after an evaluation; NaN when none was made */
	bool skipped; /* the gradient was not finite: the step was skipped */
};

struct st_run_config {
	/* The engine's configuration, train's flags in it; world, rank and
	 * comm_ops as st_run_world() set them. */
	struct st_engine_config engine;
	/* The data, opened by the caller (borrowed), and its name as the
	 * user gave it: in the lines and in the checkpoint's configuration. */
	struct st_dataset *data;
	const char *data_name;
	/* The model as the user gave it ("tiny", dims, FAMILY:dims), saved in
	 * the checkpoint's configuration and compared at resume. */
	const char *model_text;
	bool shuffle;	       /* random windows, or llm.c's order */
	enum st_samples samples; /* windows, or documents in epochs */
	const char *init;      /* weights to start from, or NULL */
	const char *resume;    /* a checkpoint, "auto" (the newest in save), or NULL */
	const char *save;      /* the checkpoints' DIR, or NULL */
	const char *metrics;   /* one JSON line per step, or NULL */
	const char *trace;     /* a Chrome trace (TRACE.rank-R at world > 1), or NULL */
	const char *rates_refresh; /* the rates steps 2-4 measure go there, or NULL */
	int log_every;	       /* a progress line every N steps (>= 1) */
	int save_every;	       /* a save every N steps too (0: at the end only) */
	int keep;	       /* the newest checkpoints kept (0: all) */
	int max_skipped;       /* fail after N skipped steps in a row (0: never) */
	/* Validation: val_batches batches of val_data (borrowed; NULL: none),
	 * read in order from its start each time (a fixed set), scored after
	 * every eval_every-th step and the last. keep_best: DIR/best names the
	 * checkpoint of the lowest validation loss (a save at every
	 * evaluation), kept whatever keep prunes. */
	struct st_dataset *val_data;
	int eval_every, val_batches; /* val_batches 0: what val_data holds, at
				      * most ST_RUN_VAL_BATCHES */
	bool keep_best;
	/* Set (to nonzero) by the caller, from a signal handler say, to end
	 * the run after the step it comes in (saved with save); NULL: never. */
	volatile sig_atomic_t *stop;
	/* The plan, the progress lines and what the run says on the way
	 * (stdout for the CLI); NULL prints nothing. */
	FILE *out;
	/* Optional. armed: the run holds its --save lock, from here on a stop
	 * is honoured (the CLI arms its signal handlers there). started: the
	 * first step is next (nothing was refused), init the weights the run
	 * started from (NULL: none, or a checkpoint --resume auto found
	 * instead). on_step: after every step. */
	void (*armed)(void *arg);
	void (*started)(void *arg, const char *init);
	void (*on_step)(void *arg, const struct st_run_step *step);
	void *arg;
};

/* How a run ended. */
struct st_run_result {
	int steps_done;	 /* the last step done (from the resumed one) */
	bool stopped;	 /* *stop ended it before its last step */
	/* On failure, what a command-line tool should exit with: 2 for bad
	 * input (nothing was written: a --save DIR the run made is removed,
	 * the trace discarded), 1 for a system failure (the last checkpoint
	 * stays loadable), 130 for a stop before the first step. */
	int exit_code;
	/* On failure at world > 1: another rank (rank 0) says why; this one
	 * has nothing to add. */
	bool quiet;
};

/* The world this process is a rank of (what the launcher says: mpirun,
 * srun) into ec->world and ec->rank, with the comm backend for ec->device
 * into ec->comm_ops. Returns 0 or -errno (no backend for the device). */
int st_run_world(struct st_engine_config *ec);

/* Run cfg from its first step (or the resumed one) to its last, or to a
 * stop. Fills *out either way. Returns 0 (stopped or not), or -errno with
 * the detail in st_error_last() and out->exit_code saying whose fault it
 * was. */
int st_run_train(const struct st_run_config *cfg, struct st_run_result *out);

#endif
