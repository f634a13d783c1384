/* strata: the tiered engine. Trains with every shard (unit x state) in its
 * planned home tier (vram, pinned host, nvme) and streams what each unit
 * needs just before it runs: W into vram slots (nvme -> host staging -> vram)
 * k units ahead for the forward and the backward, dW out to host where it is
 * accumulated into G, and G, P, M, V into host staging for the CPU AdamW
 * sweep, which writes P, M, V back and the new W to its home.
 *
 * The arithmetic is one code path whatever the placement, prefetch depth or
 * thread count, so the numbers are bit-identical across them (invariant 1 of
 * docs/design.md); only where bytes wait differs. Pools come from the plan
 * (strata/plan.h) and are allocated once at create: nothing is allocated in
 * the step loop, and no tier can pass its budget.
 * Functions return 0 or -errno; details in st_error_last(). */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include "strata/dataset.h"
#include "strata/plan.h"
#include "strata/tier.h"
#include "strata/optim.h"
#include "strata/train.h"

struct st_trace;

struct st_engine_config {
	struct st_train_config train;  /* model, batch, optimizer, seed */
	const char *device;            /* "cpu" (NULL) or "cuda" */
	uint64_t gpu_mem_bytes, host_mem_bytes, nvme_mem_bytes;
	const char *nvme_dirs;         /* NULL: no nvme tier */
	enum st_offload params, optim;
	enum st_optim_state optim_state; /* M and V: fp32 (the zero value),
					    bf16 or q8 (strata/optim.h;
					    docs/optim.md). Compact: world 1,
					    the optimizer on the host */
	int prefetch;                  /* 0: as many as the budget allows */
	uint64_t aio_block_bytes;      /* 0: 1 MiB */
	unsigned aio_depth;            /* 0: 32 */
	struct st_plan_rates rates;
	struct st_trace *trace;        /* optional, borrowed */
	struct st_fault_config nvme_fault; /* tests: when it asks for a fault
					      or a corruption, the nvme tier is
					      wrapped in the fault tier with it
					      (-EINVAL without an nvme tier) */
	uint64_t update_tile_elems;    /* tests: a smaller update tile (a
					  multiple of 2048); 0 = the plan's */
	bool no_verify_reads;          /* skip the nvme checksums (strata train
					  --verify-reads off); false: every
					  nvme read is checked */
	const enum st_home *homes;     /* tests: the home of every (unit,
					  state), as st_plan_input.homes;
					  NULL = the planner's policy */
	/* ZeRO data parallelism (docs/zero.md). comm_ops: the backend of
	 * this rank's communicator (NULL: local, world 1); world and rank:
	 * what the launcher says (0, 0: one rank), checked against what the
	 * backend finds; zero: the stage 0..3. At world > 1 each rank trains
	 * on micro-batch r of every group of `world` drawn from the loader,
	 * so N ranks at grad_accum A read what one rank reads at N * A; every
	 * budget is one rank's; each rank's nvme files go to DIR/rank-R of
	 * every nvme dir. */
	const struct st_comm_ops *comm_ops;
	int world, rank;
	int zero;
	uint64_t ckpt_shard_bytes;     /* st_engine_save(): files over this
					  are sharded (strata/ckpt.h); 0 =
					  ST_CKPT_SHARD_BYTES_DEFAULT */
	enum st_offload activations;   /* the activation checkpoints: AUTO,
					  NONE (vram) or HOST, as
					  st_plan_input.activations */
	enum st_recompute recompute;   /* which units' backward recomputes
					  their forward (strata/plan.h);
					  the zero value ALL: every unit */
	enum st_precision compute_dtype; /* the dtypes between the model's
					    ops (strata train --compute-dtype;
					    strata/model.h): FP32 (the zero
					    value) or BF16, where W is copied
					    to the device as the bf16 it is
					    (rounded from fp32 W on the
					    device), not widened */
	enum st_schedule schedule;     /* the order of the micro-batches
					  (strata/plan.h): BATCH_FIRST (the
					  zero value), LAYER_FIRST or AUTO */
	enum st_update_order update;   /* when a unit's AdamW runs
					  (strata/plan.h): AFTER (the zero
					  value: the sweep after the
					  backward), IN_BACKWARD (once its
					  G is final, speculating that the
					  clip does not apply) or AUTO;
					  docs/engine.md, "The update
					  inside the backward" */
	int test_nan_grad_unit;        /* tests: k + 1 says that unit k's
					  final G counts as not finite
					  (its sum of squares NaN) at step
					  test_nan_grad_step; 0: none
					  ($ST_TEST_NAN_GRAD=K:STEP sets
					  both) */
	int test_nan_grad_step;
	int test_speculate_step;       /* tests: k > 0 says that step k
					  speculates even where the clip
					  applied to step k - 1, whose sweep
					  drew its first batch (so that a
					  clip applying to it replays from
					  there); 0: none
					  ($ST_TEST_SPECULATE_STEP=K) */
	bool poison_staging;           /* tests: the update's staging is
					  filled with NaN bytes before each
					  load, so AdamW reading it before
					  the load lands gives NaN */
	bool forward_only;             /* the forward alone (strata eval):
					  W and the forward's buffers only,
					  no G, P, M, V, dW or update pools
					  (st_plan_input.forward_only); only
					  st_engine_write_state(),
					  load_weights(), read_state() of W
					  and st_engine_eval() run. World 1;
					  recompute, activations, schedule,
					  update and optim are the engine's */
};

struct st_engine;

/* Plan, open the device and tiers, allocate every pool, initialise the
 * parameters from the seed into their homes. -ENOSPC (a budget that cannot
 * work, the message names tier, budget and minimum), -EINVAL, -ENOMEM, or
 * an I/O error. */
int st_engine_create(const struct st_engine_config *cfg, struct st_engine **out);
void st_engine_destroy(struct st_engine *e);

const struct st_plan *st_engine_plan(const struct st_engine *e);
const struct st_model *st_engine_model(const struct st_engine *e);
uint64_t st_engine_seed(const struct st_engine *e);

/* One optimizer step at step number `step` (0-based). With next_follows,
 * the update sweep also runs the next step's first forward, unit by unit
 * as each unit's new W is home (so the next call's forward is already
 * done and ld has given that batch); pass false before reading or saving
 * the state, so the loader's cursor is that of the step's end. At world
 * > 1 collective: every rank steps with the same step and next_follows;
 * res (loss, norm) is the same on every rank. */
int st_engine_step(struct st_engine *e, struct st_loader *ld, int step,
		   bool next_follows, struct st_step_result *res);

/* The forward alone, for validation and `strata eval`: the next n_batches
 * batches of ld (the engine's B x T; a loss mask honoured) through every
 * unit, W streamed from its home as in a step, no activation kept, no
 * gradient, no update. Unmasked: *sum is the sum of the batches' mean
 * losses and *count is n_batches; masked: *sum is the sum of the counted
 * targets' losses and *count their number (0: none). The mean is *sum /
 * *count, bit for bit the reference trainer's st_trainer_eval() of the
 * same W. The training state and the step's cursor stay as they are; only
 * between steps (not after one with next_follows). At world > 1 every rank
 * scores every batch (collective: a W --zero 3 shards is gathered), with
 * the numbers of one rank. */
int st_engine_eval(struct st_engine *e, struct st_loader *ld, int n_batches, double *sum,
		   uint64_t *count);

/* The loader's cursor at the end of the last step's batches, before the
 * next step's first one that next_follows draws: what a checkpoint of the
 * state after that step must hold. It lets a run that is told to stop save
 * after a step that had next_follows (P, M and V are those of the step's
 * end; st_engine_save() waits for the step's writes), and then end: stepping
 * on after such a save is not supported. Zeroed before the first step. */
const struct st_cursor *st_engine_step_end_cursor(const struct st_engine *e);

/* Copy state s (W widened to fp32, or P, M, V) of unit u into dst (fp32,
 * the unit's flat length). For tests and checkpoints. At world > 1 a state
 * the stage shards is gathered from every rank: collective, every rank
 * calls it for the same (u, s) in the same order. */
int st_engine_read_state(struct st_engine *e, int u, enum st_state s, float *dst);
/* Where shard (u, s) lives: its home and its extent in that tier (tests
 * and tools: st_tier_locate() names the file and offset). 0 or -EINVAL. */
int st_engine_shard(const struct st_engine *e, int u, enum st_state s, enum st_home *home,
		    struct st_extent *ext);
/* Overwrite P, M and V of unit u (each NULL = zeros for M and V) and set W
 * to round(P). For loading weights and resuming. At world > 1 every rank
 * passes the whole unit and keeps its shards of it (nothing exchanged). */
int st_engine_write_state(struct st_engine *e, int u, const float *p,
			  const float *m, const float *v);

/* Write a checkpoint of the state after `step` steps into DIR/step-NNNNNNNN
 * (model.safetensors, optimizer.safetensors, config.json, trainer.json with
 * each file's size and XXH64), atomically, then point DIR/latest at it and
 * keep only the newest `keep` (0 = all). Streams from the tiers: a model
 * whose state lives on nvme never has to fit in RAM. Every value of P, M
 * and V is checked as it is streamed: one that is not finite (or a V below
 * 0) gives -EINVAL naming the file, the tensor and the index, and nothing
 * is saved (DIR and `latest` stay as they were). At world > 1:
 * collective; every rank writes its ranges of every tensor into the files
 * rank 0 makes, rank 0 commits (docs/zero.md), and every rank returns the
 * same result. */
int st_engine_save(struct st_engine *e, const char *dir, uint64_t step,
		   const struct st_cursor *cursor, const char *config_json, int keep);

/* Load DIR (a checkpoint directory, or a --save DIR whose `latest` is used)
 * after checking every file against trainer.json: P, M, V into their homes,
 * W = round(P). Sets *step and *cursor; *config_json (malloc'd, may be NULL)
 * is the saved training configuration. -EINVAL names the file that does not
 * match, or the file, tensor and index of a value that is not finite (P, M,
 * V) or of a V below 0. */
int st_engine_resume(struct st_engine *e, const char *dir, uint64_t *step,
		     struct st_cursor *cursor, char **config_json);

/* Load only weights (`strata train --init`; strata/weights.h: a strata
 * checkpoint, a Hugging Face GPT-2, an llm.c model file): P = them,
 * W = round(P), M = V = 0. */
struct st_weights;
int st_engine_load_weights(struct st_engine *e, struct st_weights *w);

enum st_lane { ST_LANE_COMPUTE, ST_LANE_H2D, ST_LANE_D2H, ST_LANE_NVME_READ,
	       ST_LANE_NVME_WRITE, ST_LANE_ADAM, ST_LANE_COUNT };

struct st_engine_stats {
	uint64_t step_ns;                    /* wall time of the last step */
	uint64_t busy_ns[ST_LANE_COUNT];     /* per queue, last step */
	uint64_t bytes[ST_LANE_COUNT];       /* per link, queued by the last step (its
						update's last stores may land in the
						next); 0 for compute, adam */
	uint64_t used_bytes[ST_HOME_COUNT];  /* per tier, now */
	uint64_t peak_bytes[ST_HOME_COUNT];  /* per tier, since create */
	uint64_t budget_bytes[ST_HOME_COUNT];
	bool has_tier[ST_HOME_COUNT];
	uint64_t nvme_busy_ns;               /* the nvme tier's busy time, last step:
						reads and writes together (at most the
						two lanes' sum; less where they overlap) */
};
void st_engine_get_stats(const struct st_engine *e, struct st_engine_stats *s);
const char *st_lane_name(enum st_lane l);

/* This rank's communicator (borrowed; the local one at world 1): for the
 * start-up agreement, barriers and the collectives' stats. */
struct st_comm;
struct st_comm *st_engine_comm(struct st_engine *e);

/* The detail of the last I/O failure ("nvme: read ... offset ...: ..."). */
const char *st_engine_io_error(const struct st_engine *e);

#endif
