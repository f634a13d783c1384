/* strata: the placement planner (src/mem/plan*.c) and `strata plan`.
 *
 * Decides, once before training, the home tier of every shard (unit x state)
 * and the size of every pool the engine allocates, from the model, the batch
 * and the tier budgets. The engine (src/train) allocates exactly the pools
 * this plan lists, so a plan that fits is a run that fits: budgets are hard.
 *
 * States: W working weights (bf16 or fp32), G gradient, P master weights,
 * M, V moments (fp32). Homes: W in vram, host or nvme; G, P, M, V in host or
 * nvme (the optimizer runs on the CPU), or in vram with W (the optimizer on
 * the device: no landing, no update staging, ST_POOL_STEP_SCALARS).
 *
 * The engine's pools, listed once each in st_plan.pools (the engine
 * allocates by walking that list; only src/mem/plan_pools.c knows a
 * size). With Wb = 2 (bf16) or 4 bytes, e_u the flat length of unit u (padding
 * included), E = max_u e_u, Er = the largest unit that is not resident,
 * Eres = the largest resident unit (a unit whose widened W and dW stay on
 * the device for the micro-batch, because another unit reads it: GPT-2's
 * embedding, which the tied head reads), U units, X = the largest unit
 * output (B*T*C*4 bytes for GPT-2), k = prefetch depth (>= 1), "streamed" =
 * some unit's W home is not vram:
 *   vram  W homes in vram              sum e_u*Wb over those units
 *         W slots (when streamed)      (k+1) * Er * Wb, and one slot of
 *                                      Eres * Wb for the resident units
 *                                      when Eres > Er (else (k+1) * E * Wb)
 *         activation checkpoints       (U-1) * X in vram; on the host
 *                                      (activations host): min(A, U-1)
 *                                      slots of Xa, A = ST_PLAN_ACT_SLOTS
 *         compute scratch              W fp32 Er*4 + dW 2*Er*4 + for each
 *                                      resident unit its own W fp32 and dW
 *                                      2*e_u*4 + dA, dB 2*X + work (max_u
 *                                      st_model_work_bytes, or for a unit
 *                                      that keeps its forward only its
 *                                      scratch) + tokens, targets 2*B*T*4
 *         saved forwards               one extent of the largest
 *                                      st_model_saved_bytes per unit that
 *                                      keeps its forward (st_recompute)
 *         step scalars                 A*B*T*4 (the losses, to 16 B), and
 *                                      with some G in vram 16*(U+1) +
 *                                      16*ceil(E/16384) (the norm's sums)
 *   host  homes in host                e_u*Wb for W, e_u*4 for G, P, M, V
 *         W staging (some W on nvme)   one per slot, the slot's size
 *         gradient landing             E*4 (when some G is not in vram), and
 *                                      another E*4 when some G is on nvme
 *                                      and grad_accum > 1
 *         update staging               2 * Et * Wb when some W is not in
 *                                      host (and not gathered, below, and
 *                                      its unit's G not in vram), and
 *                                      2 * Et * 4 for each of G, P, M, V
 *                                      that some unit has on nvme; Et =
 *                                      min(E, ST_UPDATE_TILE_ELEMS): the
 *                                      sweep goes tile by tile
 *         checkpoint homes (activations host)
 *                                      U-1-A of Xa (none when U-1 <= A)
 *   nvme  homes on nvme                as host homes
 * At world N > 1 (ZeRO, docs/zero.md) e_u above is the padded unit N*S_u
 * for dW, the grad landing and (stage 3: every W streamed) the W slots; a
 * home holds S_u elements for a sharded state, N*S_u otherwise; and two
 * pools are added: vram comm scratch N*S_max*4 (dW's all-to-all), host W
 * gather N*S_max*Wb (stages 1-2).
 * Layer-first (st_plan_input.schedule, A = grad_accum): the checkpoints
 * A*(U-1)*X in vram, or slots and homes of A*Xa on the host; dA, dB of
 * A*X; tokens and targets A*B*T*4; a third dW (A > 1 or world > 1); A dW
 * of each resident unit; A saved forwards per kept unit; no G staging.
 * Every pool's extent is counted rounded up to 4 KiB (so the engine may
 * allocate each as its own extent: tier alignment <= 4 KiB). act_bytes is one extent
 * (checkpoints at offsets i*X); scratch_bytes is the sum of the scratch
 * pools. Placement is per (unit, state) (st_plan_home()); the policy
 * starts from the uniform placements (every unit's W in one tier, G, P,
 * M, V of every unit in one tier) and splits them by unit and state to cut
 * the predicted step (docs/plan.md); st_plan_input.homes may give any
 * other placement. A plan is accepted exactly when a uniform placement the
 * forced options allow fits (the split only improves one that does), so
 * the minimum of a tier is its size at k = 1 (or at the forced prefetch)
 * minimised over those uniform placements whose other two tiers fit their
 * budgets: a budget equal to it is accepted, one byte less is refused
 * (with the other budgets unchanged). */
#ifndef STRATA_PLAN_H
#define STRATA_PLAN_H

#include "strata/optim.h"
#include "strata/common.h"
#include "strata/model.h"

#include <stdbool.h>
#include <stdio.h>

/* The update sweep's tile (elements): bounds host staging whatever the
 * largest unit. A multiple of 2048, so tiles are whole pages in bf16. */
#define ST_UPDATE_TILE_ELEMS (8u << 20)

enum st_state { ST_STATE_W, ST_STATE_G, ST_STATE_P, ST_STATE_M, ST_STATE_V,
		ST_STATE_COUNT };
enum st_home { ST_HOME_VRAM, ST_HOME_HOST, ST_HOME_NVME, ST_HOME_COUNT };
enum st_offload { ST_OFFLOAD_AUTO, ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, ST_OFFLOAD_NVME,
		  ST_OFFLOAD_VRAM /* G,P,M,V only: the optimizer on the device */ };

/* Which units' backward recomputes their forward (docs/plan.md). A unit
 * that keeps its forward (st_model_saved_bytes() > 0: GPT-2's and LLaMA's
 * blocks) has its own saved-forward extent in vram, written by its forward
 * and read by its backward, which then skips the recompute; the numbers
 * are the same bits either way.
 *   ALL   every unit recomputes (the zero value: the least vram);
 *   AUTO  after everything else is placed, as many units keep as the vram
 *         budget still holds, the last block first;
 *   NONE  every unit that can keeps; a vram budget that cannot hold it is
 *         refused (-ENOSPC), its minimum counting every saved extent. */
enum st_recompute { ST_RECOMPUTE_ALL, ST_RECOMPUTE_AUTO, ST_RECOMPUTE_NONE };

/* "all", "auto", "none". */
const char *st_recompute_name(enum st_recompute r);

/* The order of a step's micro-batches (docs/plan.md, "Schedules"):
 *   BATCH_FIRST  (the zero value) each micro-batch runs its forward and
 *                backward over every unit, then the next one: W is fetched
 *                N times a step for each pass, dW joins G N times;
 *   LAYER_FIRST  each unit runs the forward of all N micro-batches while
 *                its W is in vram, and in the backward all N of them, its
 *                dW folded on the device in micro-batch order: W crosses
 *                once a step for each pass, G once; the N micro-batches'
 *                checkpoints wait in vram or on the host (one block a
 *                boundary), their activation gradients in vram. The
 *                same ops, the same per-unit summation order: the same
 *                bits (a kept forward: N saved extents);
 *   AUTO         LAYER_FIRST when it fits the budgets and its predicted
 *                step is shorter, else BATCH_FIRST. */
enum st_schedule { ST_SCHEDULE_BATCH_FIRST, ST_SCHEDULE_LAYER_FIRST, ST_SCHEDULE_AUTO };

/* "batch-first", "layer-first", "auto". */
const char *st_schedule_name(enum st_schedule s);

/* When a unit's AdamW runs (docs/engine.md, "The update inside the
 * backward"):
 *   AFTER        the sweep after the backward (the clip needs the whole
 *                gradient's norm), fused with the next step's forward;
 *   IN_BACKWARD  as soon as the unit's G is final, speculating a clip
 *                factor of 1: P, M and V are written to alternate nvme
 *                extents (one more copy of each on nvme) and committed
 *                once the norm says the speculation held, else the
 *                sweep runs after the backward. Every P, M, V on nvme,
 *                M and V fp32 or bf16, ZeRO stage 0 or 3 at world > 1.
 *                The same bits;
 *   AUTO         IN_BACKWARD where it can run, fits the nvme budget
 *                and its predicted step is shorter, else AFTER. */
enum st_update_order { ST_UPDATE_AFTER, ST_UPDATE_IN_BACKWARD, ST_UPDATE_AUTO };

/* "after", "in-backward", "auto". */
const char *st_update_order_name(enum st_update_order u);

/* Bandwidths and rates the prediction uses; 0 = a built-in default. */
struct st_plan_rates {
	double compute_flops;  /* device matmul FLOP/s */
	double copy_bps;       /* host<->vram bytes/s */
	double nvme_read_bps, nvme_write_bps;
	double adam_bps;       /* CPU AdamW bytes/s (30 B per parameter) */
	double net_bps;        /* world > 1: bytes/s one rank's collectives move */
	/* The cpu device (st_plan_input.host_compute): its passes over memory
	 * on the cores beside the FLOPs, bytes/s. widen_bps: a bf16 W widened
	 * to fp32 (2 B read and 4 written an element); sum_bps: the XXH3
	 * sums of the nvme bytes read and written. Not given: the copy rate
	 * (a rates file written before they were measured has neither). */
	double widen_bps, sum_bps;
	/* where each rate came from (enum st_rate_source, indexed by enum
	 * st_rate); a rate > 0 left at ST_RATE_SRC_DEFAULT counts as a flag's.
	 * The plan's copy says what it used. */
	unsigned char source[8];
};

/* The rates, in st_plan_rates' order, for source[] and the rates file. */
enum st_rate { ST_RATE_COMPUTE, ST_RATE_COPY, ST_RATE_NVME_READ, ST_RATE_NVME_WRITE,
	       ST_RATE_ADAM, ST_RATE_NET, ST_RATE_WIDEN, ST_RATE_SUM, ST_RATE_COUNT };
enum st_rate_source { ST_RATE_SRC_DEFAULT, ST_RATE_SRC_FLAG, ST_RATE_SRC_FILE,
		      ST_RATE_SRC_DEVICE /* --device cuda's defaults */ };

/* The engine's defaults on the cuda device when no rates are given:
 * fp32 matmuls (no TF32) on an A100/H100-class GPU, pinned copies over
 * PCIe 4/5. They only shape the prediction; docs/plan.md says how to give
 * measured ones. */
#define ST_PLAN_CUDA_COMPUTE_FLOPS 15e12
#define ST_PLAN_CUDA_COPY_BPS 20e9

struct st_plan_input {
	const struct st_model *model; /* borrowed */
	int batch, seq, grad_accum;
	bool bf16;
	enum st_optim_state optim_state; /* M and V: fp32 (the zero value), bf16
					    or q8 (strata/optim.h) */
	uint64_t gpu_mem_bytes;       /* vram budget; required */
	uint64_t host_mem_bytes;      /* host budget; required */
	uint64_t nvme_mem_bytes;      /* nvme budget; 0 = unlimited (the plan's
					 budget_bytes becomes what it needs) */
	bool have_nvme;               /* --nvme given; false = no nvme tier */
	enum st_offload params;       /* W: AUTO, NONE (vram), HOST, NVME */
	enum st_offload optim;        /* G,P,M,V: AUTO, HOST, NVME, VRAM (NONE = HOST) */
	int prefetch;                 /* k; 0 = as many as the budget allows (max U) */
	struct st_plan_rates rates;
	/* Optional: the home of every (unit, state), [units * ST_STATE_COUNT]
	 * (W in any tier; G, P, M, V in host or nvme, or all four in vram
	 * with W), instead of the policy:
	 * the plan then only sizes the pools and checks the budgets. Tests
	 * use it for split placements; params and optim are ignored. */
	const enum st_home *homes;
	/* ZeRO (docs/zero.md): this rank of `world` (0 = 1) data-parallel
	 * ranks and the stage 0..3. At world > 1 each unit is cut into world
	 * slices of slice_elems (st_plan_slice()) and the states the stage
	 * shards (st_plan_sharded()) hold only this rank's slice; the plan
	 * is per rank (every budget is one rank's). At world 1 the stage
	 * changes nothing. */
	int world, rank, zero;
	/* The compute runs on the host's cores (the cpu device): AdamW shares
	 * those cores with it, so the prediction adds the two times instead
	 * of overlapping them (docs/plan.md). */
	bool host_compute;
	/* Activation checkpoints (docs/plan.md): AUTO (vram when the vram
	 * budget holds them with the rest, else host), NONE (vram) or HOST */
	enum st_offload activations;
	/* Which units recompute their forward in the backward (above). */
	enum st_recompute recompute;
	/* The optimizer on the device (docs/gpu.md): whether optim AUTO may
	 * home G, P, M, V in vram (tried first, with W in vram, at world 1).
	 * The engine sets it on a device whose compute runs AdamW (cuda);
	 * --offload-optim vram forces it anywhere. Explicit homes may put a
	 * unit's G, P, M, V in vram when its W is there too (world 1). */
	bool optim_vram_auto;
	/* The order of the micro-batches (enum st_schedule above). */
	enum st_schedule schedule;
	/* When the update runs (enum st_update_order above). */
	enum st_update_order update;
	/* Each micro-batch carries the attention's segment starts (strata
	 * train --packing isolated): a (B,T) int32 pool beside the targets. */
	bool seg;
	/* The forward alone (strata eval; st_engine_config.forward_only): W
	 * and what the forward needs only. G, P, M, V take no bytes, and no
	 * dW, gradient landing, update staging, activation checkpoint or kept
	 * forward is planned (give recompute ALL, activations NONE,
	 * batch-first, update AFTER, world 1). */
	bool forward_only;
};

/* Checkpoints on the host go through this many vram slots: checkpoint j
 * (1..U-1) lives in slot (j-1) mod A, the last A stay there from the
 * forward to the backward and the others go to the host after the forward
 * and come back before the backward. */
#define ST_PLAN_ACT_SLOTS 2
/* A checkpoint copy moves its bytes rounded up to this (the vram tier's
 * alignment), and each slot and home holds Xa = X rounded up to it. */
#define ST_PLAN_ACT_ALIGN 256u

/* The engine's pools, each listed once in the plan: the engine allocates
 * `count` extents of `bytes` in `tier` for each, in list order, and finds
 * them by id. Sizes live only in the planner (src/mem/plan_pools.c). */
enum st_pool_id {
	ST_POOL_W_SLOT,       /* vram: k + 1 W slots (when W is streamed) */
	ST_POOL_W_SLOT_RES,   /* vram: one slot for resident units larger than
				 every other unit */
	ST_POOL_W_STAGE,      /* host: a staging buffer per slot (W on nvme) */
	ST_POOL_W_STAGE_RES,  /* host: the resident slot's */
	ST_POOL_ACT,          /* vram: the activation checkpoints, U-1 of X */
	ST_POOL_WF,           /* vram: W widened to fp32, units not resident */
	ST_POOL_WF_RES,       /* vram: a resident unit's own (unit set) */
	ST_POOL_DW,           /* vram: two dW, units not resident */
	ST_POOL_DW_RES,       /* vram: a resident unit's own (unit set) */
	ST_POOL_DACT,         /* vram: two activation gradients of X */
	ST_POOL_WORK,         /* vram: the model's workspace */
	ST_POOL_TOKENS,       /* vram: (B,T) int32 */
	ST_POOL_TARGETS,      /* vram: (B,T) int32 */
	ST_POOL_SEG,          /* vram: (B,T) int32, the attention's segment
				 starts (--packing isolated; none otherwise) */
	ST_POOL_LANDING,      /* host: dW lands here, E*4 */
	ST_POOL_GSTAGE,       /* host: G staging (G on nvme, grad_accum > 1) */
	ST_POOL_UPD_W,        /* host: update staging for W, one per set (2) */
	ST_POOL_UPD_F32,      /* host: for G, P, M, V, 4 per set (8) */
	ST_POOL_COMM_SCRATCH, /* vram: world > 1: the composed reduce-scatter's
				 all-to-all lands here, N * S * 4 */
	ST_POOL_W_GATHER,     /* host: world > 1, stages 1-2: the updated W
				 slices all-gathered into one unit, N * S * Wb;
				 two, units in turn (one gathers while the
				 next is updated) */
	ST_POOL_ACT_SLOT,     /* vram: checkpoints on the host: the slots they
				 pass through, A of Xa (ST_PLAN_ACT_SLOTS) */
	ST_POOL_ACT_HOME,     /* host: checkpoints on the host: the homes of
				 checkpoints 1..U-1-A, Xa each */
	ST_POOL_SAVED,        /* vram: a saved-forward extent per unit that
				 keeps its forward (st_plan.keep), of the
				 largest st_model_saved_bytes */
	ST_POOL_STEP_SCALARS, /* vram: what the host reads of the device once a
				 step, in one d2h: the micro-batches' per-token
				 losses, A*B*T*4 rounded up to 16 B; with some
				 G, P, M, V in vram, then each unit's sum of
				 squares (16 B) and the AdamW count (16 B),
				 then the sum's scratch, 16 B per 16384 of E */
	ST_POOL_Q8_SCALES,    /* host: --optim-state q8: M's and V's fp32
				 scales, one per 64 elements of each unit
				 (st_plan_q8_scale_elems(); docs/optim.md) */
	ST_POOL_KIND_COUNT
};

/* The q8 scales of one moment of a unit of n elements (its padded
 * length): one fp32 per ST_MODEL_TENSOR_ALIGN_ELEMS (64), and one more. */
static inline uint64_t st_plan_q8_scale_elems(uint64_t n)
{
	return n / 64u + 1u;
}

#define ST_PLAN_MAX_RESIDENT 8
#define ST_PLAN_MAX_POOLS (ST_POOL_KIND_COUNT + 2 * ST_PLAN_MAX_RESIDENT)

struct st_plan_pool {
	enum st_pool_id id;
	const char *name;   /* "W slot", static */
	enum st_home tier;
	uint64_t bytes;     /* each extent's size; the plan counts each rounded
			       up to 4 KiB, so the tier's alignment never
			       takes more than the plan has */
	uint32_t count;     /* extents; pools of count 0 are not listed */
	int unit;           /* the resident unit it serves, or -1 */
};

const char *st_pool_name(enum st_pool_id id);

struct st_plan {
	int units;
	int prefetch;                          /* k chosen */
	enum st_home *home;                    /* [units * ST_STATE_COUNT] */
	uint64_t *state_bytes;                 /* [units * ST_STATE_COUNT] */
	/* A summary of the pool list below, for `strata plan` (the engine
	 * uses only the list) */
	uint64_t w_slot_bytes, w_slots;        /* vram W slots: count and size of each */
	bool embed_slot;                       /* one more vram slot (and staging) for
						  the resident units (GPT-2's embedding),
						  when one is larger than every other
						  unit and W is streamed */
	uint64_t act_bytes, scratch_bytes;     /* vram */
	uint64_t w_staging_bytes, grad_landing_bytes, update_staging_bytes; /* host */
	uint64_t home_bytes[ST_HOME_COUNT];    /* sum of homes per tier */
	uint64_t total_bytes[ST_HOME_COUNT];   /* homes + pools per tier */
	uint64_t budget_bytes[ST_HOME_COUNT];
	uint64_t min_bytes[ST_HOME_COUNT];     /* smallest budget that works */
	/* traffic per optimizer step, bytes */
	uint64_t h2d_bytes, d2h_bytes, nvme_read_bytes, nvme_write_bytes;
	/* predicted seconds per step for each resource, and the bound */
	double t_compute_s, t_copy_s, t_nvme_s, t_adam_s, t_step_s;
	const char *bound;                     /* "compute", "copy", "nvme", "adam" */
	/* added after the first draft */
	enum st_home w_home, optim_home;       /* the uniform row's homes of W and of
						  G,P,M,V: the row the split started
						  from (with explicit homes: unit 0's) */
	uint64_t embed_slot_bytes;             /* Eres*Wb rounded, 0 without embed_slot */
	uint64_t act_each_bytes;               /* X: the largest unit output
						  (st_model_act_bytes), one checkpoint */
	uint64_t work_bytes;                   /* max_u st_model_work_bytes, in scratch */
	struct st_plan_rates rates;            /* the rates used, defaults filled in */
	/* every pool once, in allocation order; total_bytes = home_bytes +
	 * the pools of each tier */
	struct st_plan_pool *pools;
	int n_pools;
	/* ZeRO: the input's world (>= 1), rank and stage; per unit the slice
	 * S_u (the unit's own length at world 1; at world > 1 ceil(e_u / N)
	 * rounded up to ST_PLAN_SLICE_ALIGN elements, so every slice is whole
	 * 64 KiB in fp32 and moves with O_DIRECT) and the padded unit N * S_u
	 * that an unsharded state holds at world > 1 */
	int world, rank, zero;
	uint64_t *slice_elems;                 /* [units] */
	uint64_t tile_elems;                   /* the update tile; at world > 1 it
						  divides every slice */
	/* the collectives' bytes per step, as st_comm_stats counts them (the
	 * full buffer of each call): comm_bytes[kind of strata/comm.h] */
	uint64_t comm_bytes[5], comm_calls[5];
	double t_net_s;                        /* predicted time of the collectives */
	/* the split policy moved some shards off the uniform row w_home,
	 * optim_home (docs/plan.md, "Placement policy"): homes differ by unit */
	bool split;
	/* The model of the step (docs/plan.md, "Predicted time per step"):
	 * the FLOPs the step computes (recompute counted), the bytes AdamW
	 * moves, and the serial parts no lane overlaps (the first unit's W
	 * before the first forward, the last unit's update after the last
	 * backward), which t_step_s adds to the busiest lane. */
	double compute_flops_step;
	uint64_t adam_bytes;
	double t_serial_s;
	/* The batch that hides the I/O: the smallest --grad-accum N in
	 * 1..ST_PLAN_ACCUM_MAX (same B, T and placement) at which compute is
	 * the bound, and the step time there; 0 when none (hide_why says which
	 * resource grows with N as fast as compute does). hide_best_accum is
	 * what --grad-accum auto takes: hide_accum, or else the smallest N
	 * within 10% of the best tokens/s up to ST_PLAN_ACCUM_MAX. */
	int hide_accum, hide_best_accum;
	double hide_step_s, hide_best_step_s;
	const char *hide_why;                  /* static; "" when hide_accum > 0 */
	/* activation checkpoints: their home (vram, or host through act_slots
	 * vram slots), how many of the U-1 go to the host and back each
	 * micro-batch (checkpoints 1..act_offloaded), and the bytes that
	 * moves each way per micro-batch (each rounded to ST_PLAN_ACT_ALIGN) */
	enum st_home act_home;
	int act_slots, act_offloaded;
	uint64_t act_copy_bytes;
	uint64_t act_host_bytes;               /* host: the checkpoint homes */
	/* Recompute (st_recompute above): the mode asked; per unit whether it
	 * keeps its forward (its own ST_POOL_SAVED extent, the i-th kept unit
	 * in unit order the pool's i-th extent; no recompute in its backward);
	 * the kept units; one extent's bytes (0 when none keeps); and the
	 * FLOPs per step the backward spends recomputing forwards (in
	 * t_compute_s, with the model's). The workspace (work_bytes) is the
	 * largest a unit needs: a kept unit's scratch only. */
	enum st_recompute recompute;
	bool *keep;                            /* [units] */
	int n_keep;
	uint64_t saved_each_bytes;
	double recompute_flops;
	/* The step's two phases (docs/plan.md, "The model of the step"):
	 * [0] the forwards and backwards of the micro-batches but the first
	 * forward, [1] the update sweep and the next step's first forward,
	 * which the sweep runs beside it. The update cannot start before the
	 * last backward (the clip needs the whole gradient's norm), so the
	 * phases add. Per phase: each lane's time (compute, copy, nvme, adam,
	 * net; compute holds AdamW on the cpu device, host_compute), the
	 * phase's time (its busiest lane) and that lane's name. The update
	 * phase's traffic: the new W to vram, the G, P, M, V loads and the
	 * P, M, V and W stores on nvme; of its loads, those the engine
	 * queues during the last backward (P, M, V's first two staged tiles
	 * each), which count in the backward phase. t_step_s = t_phase_s[0] +
	 * t_phase_s[1] + t_serial_s. */
	double t_phase_lane_s[2][5];
	double t_phase_s[2];
	const char *phase_bound[2];
	uint64_t upd_h2d_bytes, upd_nvme_read_bytes, upd_nvme_write_bytes;
	uint64_t upd_prefetch_nvme_read_bytes;
	/* The next step's first forward, which the sweep runs beside it
	 * (the update after the backward): the W fetches of its units
	 * 0..U-2, once each, from nvme and to vram (in nvme_read_bytes and
	 * h2d_bytes too), which count in the update phase. */
	uint64_t upd_fwd_nvme_read_bytes, upd_fwd_h2d_bytes;
	/* The update inside the backward: the W that the last backward
	 * fetches from nvme for its first `prefetch` units (U-1 down; all U
	 * when prefetch is 0), which the fetches k ahead read while the
	 * forwards run. Where the first phase's disk has time, the model
	 * reads them there (docs/plan.md, "The update inside the backward"). */
	uint64_t bwd_ahead_nvme_read_bytes;
	/* The widens: every W a unit's pass uses is widened on the compute
	 * (bf16 to fp32, or copied) out of its slot or vram home, f_u per
	 * micro-batch (once a step layer-first); the bytes they read and
	 * write, of the whole step and of the fused forward's. On the cpu
	 * device (host_compute) each is a pass over host memory on the
	 * cores: t_widen_s is their time at widen_bps, in the compute
	 * lane beside the FLOPs' time (t_compute_s holds both); 0 on a GPU,
	 * where a widen is a kernel at the device memory's bandwidth. */
	uint64_t widen_bytes, upd_widen_bytes;
	double t_widen_s;
	/* The cpu device (host_compute): the nvme sums (XXH3 of every byte
	 * read and written) on the cores, at sum_bps; in t_compute_s
	 * (its compute lane) too; 0 on a GPU, where the cores are free. */
	double t_sums_s;
	/* The order of the micro-batches the plan is sized and predicted
	 * for: BATCH_FIRST or LAYER_FIRST (AUTO resolved). */
	enum st_schedule schedule;
	/* The update inside the backward (AUTO resolved), the nvme bytes of
	 * its alternate P, M, V extents (in total_bytes[ST_HOME_NVME]), and
	 * why the update runs where it does (`strata plan` prints it). */
	bool in_backward;
	uint64_t alt_bytes;
	char update_why[160];
	char schedule_why[160]; /* why this schedule (`strata plan`) */
};

#define ST_PLAN_ACCUM_MAX 64

/* Slices are multiples of this many elements (the gradient norm's chunk,
 * so per-slice partial sums fold into the one-rank sum bit for bit). */
#define ST_PLAN_SLICE_ALIGN 16384u

/* Does stage p->zero shard state s across the ranks? (never at world 1):
 * P, M, V from stage 1, G from 2, W at 3. */
static inline bool st_plan_sharded(const struct st_plan *p, int s)
{
	return p->world > 1 && p->zero >= (s == 0 ? 3 : s == 1 ? 2 : 1);
}

/* Make the plan. Returns 0; -ENOSPC when a budget cannot work, with one
 * line in st_error_last() naming the tier, its budget and the minimum
 * ("host budget 1.00 GiB (1073741824 B) is below the minimum of 2.31 GiB
 * (2480381952 B) for this model and batch"); -EINVAL for contradictory or
 * bad input (--offload-params nvme without --nvme, seq > ctx, prefetch
 * outside 0..U, a negative rate); -ENOMEM. The policy (docs/plan.md): each
 * uniform placement that fits at k = 1 (or the forced prefetch) -- W in
 * vram, host or nvme; G, P, M, V in host or nvme -- is improved by moving
 * shards to faster tiers, most predicted time saved per byte first, while
 * the budgets hold; the fastest result is taken. Then k: the forced
 * prefetch, or the largest k in 1..U that fits. With activations auto,
 * every row is tried with the activation checkpoints in vram and on the
 * host (forced: only that home); the prediction counts their copies, and
 * a tie goes to vram. plan is filled only on success; free with
 * st_plan_fini(). */
int st_plan_make(const struct st_plan_input *in, struct st_plan *plan);
void st_plan_fini(struct st_plan *plan);

static inline enum st_home st_plan_home(const struct st_plan *p, int unit,
					enum st_state s)
{
	return p->home[unit * ST_STATE_COUNT + s];
}

/* Does the update sweep stage G, P, M or V (s) through host buffers? When
 * some unit's s is on nvme. ST_POOL_UPD_F32 holds, for each of its two
 * sets, one buffer per staged state in state order. */
static inline bool st_plan_upd_staged(const struct st_plan *p, enum st_state s)
{
	for (int u = 0; u < p->units; u++)
		if (st_plan_home(p, u, s) == ST_HOME_NVME)
			return true;
	return false;
}

const char *st_state_name(enum st_state s); /* "W", "G", ... */
const char *st_home_name(enum st_home h);   /* "vram", "host", "nvme" */

/* The human table of `strata plan`. */
void st_plan_print(const struct st_plan *plan, const struct st_plan_input *in,
		   FILE *f);
/* The per-unit table of `strata plan --verbose` (unit, kind, elems, then
 * tier and bytes of each state). */
void st_plan_print_units(const struct st_plan *plan,
			 const struct st_plan_input *in, FILE *f);
/* The same as JSON text, per-unit rows included (caller frees; NULL when
 * out of memory). */
char *st_plan_json(const struct st_plan *plan, const struct st_plan_input *in);

/* Read read/write GB/s from an nvme-bench --json file into rates.
 * Returns 0 or -errno / -EINVAL with the reason. */
int st_plan_rates_from_nvme_bench(const char *path, struct st_plan_rates *rates);

/* The rates file (src/mem/rates.c; docs/plan.md): {"strata_rates": 1,
 * "compute_flops": X, "copy_bps": X, "nvme_read_bps": X, "nvme_write_bps":
 * X, "adam_bps": X, "net_bps": X, "widen_bps": X, "sum_bps": X,
 * "measured": {...}}; every rate present but widen_bps and sum_bps (a
 * file written before they were measured lacks them: null), a positive
 * number or null (not measured: the default), no other key.
 * read: *rates gets the file's rates (source ST_RATE_SRC_FILE), others 0;
 * -EINVAL (one line naming the file and the field) or -errno.
 * write: atomically (temporary + rename); measured is JSON text kept as
 * the "measured" object (NULL: none); 0 or -errno naming the file. */
int st_plan_rates_read(const char *path, struct st_plan_rates *rates);
int st_plan_rates_write(const char *path, const struct st_plan_rates *rates,
			const char *measured);
/* Every rate of dst that is 0 takes src's (with src's source). */
void st_plan_rates_merge(struct st_plan_rates *dst, const struct st_plan_rates *src);
double st_plan_rate_get(const struct st_plan_rates *r, enum st_rate i);
void st_plan_rate_set(struct st_plan_rates *r, enum st_rate i, double v);
const char *st_rate_key(enum st_rate i);             /* "compute_flops", ... */
const char *st_rate_source_name(enum st_rate_source s); /* "default", ... */
/* Rates from what steps did: busy seconds and bytes per engine lane
 * (compute, h2d, d2h, nvme read, nvme write, adam; strata/engine.h's
 * order), summed over `steps` steps of plan p, whose compute_flops_step,
 * adam_bytes and t_widen_s are per step: compute (less the widens), nvme
 * read and write, adam. Not the copy rate (0): a copy queue's busy time
 * includes waiting for the compute's events. nvme_busy_s is the disk's
 * own busy time (reads and writes together; 0: unknown): where it is less
 * than the two lanes' sum, both are scaled by it over the sum, so the
 * planner's read + write time gives it back. A rate whose lane did
 * nothing stays 0. Returns how many were derived. */
int st_plan_rates_from_lanes(const struct st_plan *p, int steps, const double busy_s[6],
			     const double bytes[6], double nvme_busy_s,
			     struct st_plan_rates *out);

#endif
