/* strata: the placement planner (src/mem/plan.c) and `strata plan`.
 *
 * Decides, once before training, the home tier of every shard (unit x state)
 * and the size of every pool the engine allocates, from the model, the batch
 * and the tier budgets. The engine (src/train) allocates exactly the pools
 * this plan lists, so a plan that fits is a run that fits: budgets are hard.
 *
 * States: W working weights (bf16 or fp32), G gradient, P master weights,
 * M, V moments (fp32). Homes: W in vram, host or nvme; G, P, M, V in host or
 * nvme (the optimizer runs on the CPU).
 *
 * The engine's pools, listed once each in st_plan.pools (the engine
 * allocates by walking that list; only src/mem/plan.c knows a size). With
 * Wb = 2 (bf16) or 4 bytes, e_u the flat length of unit u (padding
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
 *         activation checkpoints       (U-1) * X
 *         compute scratch              W fp32 Er*4 + dW 2*Er*4 + for each
 *                                      resident unit its own W fp32 and dW
 *                                      2*e_u*4 + dA, dB 2*X + work (max_u
 *                                      st_model_work_bytes) + tokens,
 *                                      targets 2*B*T*4
 *   host  homes in host                e_u*Wb for W, e_u*4 for G, P, M, V
 *         W staging (some W on nvme)   one per slot, the slot's size
 *         gradient landing             E*4, and another E*4 when some G is
 *                                      on nvme and grad_accum > 1
 *         update staging (any of G,P,M,V on nvme, or some W not in host)
 *                                      2 * Et * (16 + Wb), Et = min(E,
 *                                      ST_UPDATE_TILE_ELEMS): the sweep
 *                                      goes tile by tile
 *   nvme  homes on nvme                as host homes
 * At world N > 1 (ZeRO, docs/zero.md) e_u above is the padded unit N*S_u
 * for dW, the grad landing and (stage 3: every W streamed) the W slots; a
 * home holds S_u elements for a sharded state, N*S_u otherwise; and two
 * pools are added: vram comm scratch N*S_max*4 (dW's all-to-all), host W
 * gather N*S_max*Wb (stages 1-2).
 * Every pool's extent is counted rounded up to 4 KiB (so the engine may
 * allocate each as its own extent: tier alignment <= 4 KiB). act_bytes is one extent
 * (checkpoints at offsets i*X); scratch_bytes is the sum of the scratch
 * pools. Placement is per (unit, state) (st_plan_home()); the policy homes
 * every unit's W in one tier and G, P, M, V of every unit in one tier
 * (docs/plan.md), and st_plan_input.homes may give any other placement.
 * The minimum of a tier is its size at k = 1 (or at the forced prefetch)
 * minimised over the placements the forced options allow whose other two
 * tiers fit their budgets: a budget equal to it is accepted, one byte less
 * is refused (with the other budgets unchanged). */
#ifndef STRATA_PLAN_H
#define STRATA_PLAN_H

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
enum st_offload { ST_OFFLOAD_AUTO, ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, ST_OFFLOAD_NVME };

/* Bandwidths and rates the prediction uses; 0 = a built-in default. */
struct st_plan_rates {
	double compute_flops;  /* device matmul FLOP/s */
	double copy_bps;       /* host<->vram bytes/s */
	double nvme_read_bps, nvme_write_bps;
	double adam_bps;       /* CPU AdamW bytes/s (30 B per parameter) */
	double net_bps;        /* world > 1: bytes/s one rank's collectives move */
};

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
	uint64_t gpu_mem_bytes;       /* vram budget; required */
	uint64_t host_mem_bytes;      /* host budget; required */
	uint64_t nvme_mem_bytes;      /* nvme budget; 0 = unlimited (the plan's
					 budget_bytes becomes what it needs) */
	bool have_nvme;               /* --nvme given; false = no nvme tier */
	enum st_offload params;       /* W: AUTO, NONE (vram), HOST, NVME */
	enum st_offload optim;        /* G,P,M,V: AUTO, HOST, NVME (NONE = HOST) */
	int prefetch;                 /* k; 0 = as many as the budget allows (max U) */
	struct st_plan_rates rates;
	/* Optional: the home of every (unit, state), [units * ST_STATE_COUNT]
	 * (W in any tier; G, P, M, V in host or nvme), instead of the policy:
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
};

/* The engine's pools, each listed once in the plan: the engine allocates
 * `count` extents of `bytes` in `tier` for each, in list order, and finds
 * them by id. Sizes live only in the planner (src/mem/plan.c). */
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
	ST_POOL_KIND_COUNT
};

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
	enum st_home w_home, optim_home;       /* the uniform homes of W and of G,P,M,V
						  (with explicit homes: unit 0's) */
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
};

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
 * outside 0..U, a negative rate); -ENOMEM. The policy (docs/plan.md): the
 * first placement that fits, in this order of preference: W in vram, host,
 * nvme; for each, G,P,M,V in host, then nvme. Then k: the forced prefetch,
 * or the largest k in 1..U that fits. plan is filled only on success; free
 * with st_plan_fini(). */
int st_plan_make(const struct st_plan_input *in, struct st_plan *plan);
void st_plan_fini(struct st_plan *plan);

static inline enum st_home st_plan_home(const struct st_plan *p, int unit,
					enum st_state s)
{
	return p->home[unit * ST_STATE_COUNT + s];
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

#endif
