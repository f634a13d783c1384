/* The tiered engine's private state, shared by its files:
 *   engine.c         create / destroy, the pools from the plan, accessors
 *   engine_lanes.c   transfer chains (hops on the tiers), the pump that
 *                    reaps them, each queue's busy time and the trace
 *   engine_fetch.c   the W fetch pipeline (tier -> staging -> vram slot)
 *   engine_grad.c    the gradient gather (dW -> host -> G)
 *   engine_update.c  the update sweep (G, P, M, V -> AdamW -> homes)
 *   engine_step.c    the step: micro-batches, forward, backward, clip
 *   engine_state.c   state access between steps, stats
 *   engine_ckpt.c    checkpoints (through the public API only)
 *   engine_act.c     activation checkpoints on the host (d2h, h2d back)
 *   engine_sums.c    the checksums of the shards on nvme
 *   engine_zero.c    ZeRO across ranks
 *   engine_eval.c    the forward alone (st_engine_eval)
 * struct st_engine holds the shared core (config, model, plan, device,
 * tiers, the units' sizes and shards, the pools) and each pipeline's state
 * by name: e->lanes, e->fetch, e->grad, e->update, e->act, e->zero,
 * e->sums, e->batch. Calls go one way: the step calls the pipelines in
 * order; the pipelines call zero, the sums and the lanes; nothing calls
 * back up into the step, and the lanes call no pipeline (a shard's owner
 * hooks into its hops: lanes.hop_out, lanes.hop_in).
 * See engine_step.c for the step's orderings between the queues. */
#ifndef STRATA_ENGINE_INTERNAL_H
#define STRATA_ENGINE_INTERNAL_H

#include "strata/engine.h"
#include "strata/comm.h"
#include "strata/compute.h"
#include "strata/device.h"
#include "strata/optim.h"

#include <assert.h>
#include <stdbool.h>

/* --- transfer chains ------------------------------------------------------------ */

/* One hop of a transfer: a tier's read or write between an extent and a
 * host buffer. On the vram tier a write is an h2d copy and a read a d2h
 * copy, and the hop may wait for a device event (after) and record one
 * when done. The lane (the queue whose busy time it counts) follows from
 * the tier and the direction. */
struct hop {
	const char *name;        /* for the trace: "W nvme->host" */
	enum st_home tier;
	enum st_io_op rw;
	struct st_extent ext;
	uint64_t off_bytes, len_bytes;
	void *buf;
	struct st_event *after, *done; /* vram only */
	/* the shard it moves, for the hooks on its hops (the nvme sums): its
	 * unit, or -1 for none, its state, and off_bytes is into it */
	int unit;
	enum st_state state;
	bool alt;                /* into the shard's alternate extent */
};

#define ST_CHAIN_MAX_HOPS 4

/* A chain of hops that run one after another: the next is submitted when
 * the one before completes, so a W on nvme goes nvme -> staging -> vram
 * without the pipelines seeing the middle. A new kind of transfer is a new
 * list of hops, not a case in a switch. *busy counts the chains in flight
 * on what they use (a slot, a landing buffer, a staging set): incremented
 * when the chain starts, decremented when its last hop completes or any
 * hop fails. *queued (optional) is set once the last hop is submitted:
 * another queue may then wait for its done event. */
struct chain {
	struct hop hop[ST_CHAIN_MAX_HOPS];
	int nhops, at;           /* hops, and the one in flight */
	int *busy;
	bool *queued;
	/* the hop in flight */
	uint64_t t0_ns;          /* submitted, or seen free of its wait */
	struct st_event *waits;  /* the event it waits for, until seen done */
	uint64_t vram_seq;       /* in flight on the vram tier: its submit number */
};

/* --- pools ------------------------------------------------------------------------ */

struct shard {
	enum st_home home;
	struct st_extent ext;
	/* --update in-backward: P, M, V on nvme have a second extent; the
	 * speculative update writes there, and a commit swaps the two */
	struct st_extent alt;
};

struct wslot {
	int seq;        /* position in the fetch sequence, -1 when free */
	uint64_t len_bytes; /* of the unit being fetched */
	int pending;    /* chains in flight into it */
	bool ready;     /* its h2d is queued: the compute may wait for ev_h2d */
	unsigned widens; /* W widened from it so far: picks the ev_widen pair's event */
	bool resident;  /* kept for resident units (a larger slot), or not */
	struct st_extent ext;   /* vram */
	struct st_extent stage; /* host staging (W on nvme) */
	struct chain fetch;
};

/* One of the update's two staging sets: a host buffer per staged state.
 * Each state's tiles take its two buffers in turn (struct utile), so a
 * buffer of P may hold unit 5's tile while the same set's G buffer holds
 * unit 6's: per state, the loads and stores in flight and the tile (an
 * index into update.tiles) the buffer was last loaded for, -1 for none. */
struct updset {
	struct st_extent ext[ST_STATE_COUNT]; /* host staging for each state */
	struct chain load[ST_STATE_COUNT], store[ST_STATE_COUNT];
	int reads[ST_STATE_COUNT], writes[ST_STATE_COUNT];
	int holder[ST_STATE_COUNT];
};

/* A tile of the update sweep: [t0, t0 + n) elements of unit u, and per
 * state the set whose buffer it goes through (-1: none, the state is
 * worked on in its host home, or W is gathered; UPD_FINAL_G: G on nvme,
 * read where the gather left it final, struct grad_state). A state's
 * tiles that are staged take set 0, 1, 0, ... in sweep order, whatever
 * the other states do, so the first two tiles with P on nvme can be
 * loaded during the backward even when the sweep starts with units in
 * host. */
#define UPD_FINAL_G (-2)
struct utile {
	int u;
	uint64_t t0, n;
	signed char set[ST_STATE_COUNT];
};

struct lane_busy {
	unsigned inflight;
	uint64_t since_ns, busy_ns, bytes;
	uint64_t requests; /* in the current busy interval */
};

/* A unit's device-side buffers: its W as the compute reads it (w_compute:
 * fp32, widened from bf16 W, or bf16 at --compute-dtype bf16) and its dW
 * (fp32). Resident units have their own for the whole micro-batch; the
 * others share two (w_compute one, dW two: one is computed while the
 * other is copied out). */
struct ubufs {
	void *w_compute;
	float *dw;
	struct st_extent dw_ext;
	struct st_event *ev_dw; /* recorded after the backward that wrote dw */
	struct st_event *ev_red; /* world > 1: recorded by the comm after dw's
				    reduce-scatter (and all-gather) */
	/* layer-first, a resident unit: each micro-batch's dW ([N], the
	 * first is dw), which the units that read it add into before its
	 * own backward; NULL batch-first */
	float **dw_mb;
};

/* --- each pipeline's state ------------------------------------------------------- */

/* The W fetch (engine_fetch.c): the vram slots W is fetched into, ahead of
 * its use, in the order of the fetch sequence. */
struct fetch_state {
	struct wslot *slots;
	int n_slots;
	/* device events recorded by the compute after the widen from each W
	 * slot (two per slot, in turn: a copy still waiting for one must not
	 * see it recorded again); by the h2d queue after the copy into each
	 * slot */
	struct st_event **ev_widen, **ev_h2d;
	/* the sequence of units whose W a micro-batch reads (forward, then
	 * backward), the fetches issued and the ones consumed so far */
	int *seq, n_seq, issued, consumed;
	int depth;                    /* fetches ahead of the one consumed (plan.prefetch) */
	int w_ready;                  /* units whose W may be fetched */
	/* stage 3 at world > 1: per slot, recorded on the comm queue after
	 * its all-gather; the fetch sequence gathered so far */
	struct st_event **ev_gather;
	int gathered;
};

/* The gradient gather (engine_grad.c): dW d2h into landing, added into G,
 * G's sums of squares for the norm. */
struct grad_state {
	float *landing, *stage;       /* host: dW lands; G of a unit on nvme */
	int landing_busy, stage_busy; /* chains in flight on them */
	struct chain chain_d2h, chain_write, chain_read;
	/* G on nvme: the buffer that holds unit final_u's final G (the
	 * landing at the first micro-batch, else the G staging), from the
	 * unit's element final_lo (the rank's slice; 0 at world 1 and where
	 * stage 0 gathered the whole unit there), until the next dW or G
	 * read goes there (final_u -1). The update inside the backward
	 * reads it there, not back from nvme. */
	float *final_g;
	uint64_t final_lo;
	int final_u;
	double *unit_sumsq;           /* [n_units]: each unit's sum of squares of G */
	bool nonfinite;               /* a gradient was not finite this step */
	/* The step's device scalars (ST_POOL_STEP_SCALARS), read by the host
	 * once a step, in one d2h (st_eng_step_scalars) into host_scalars:
	 * dev_losses, each micro-batch's B*T per-token losses (the head
	 * leaves them there), then, for the units whose G, P, M, V live in
	 * vram (the optimizer on the device, docs/gpu.md), dev_sumsq, each
	 * unit's sum of squares [n_units] (NULL when no unit's optimizer is
	 * on the device), and past what the d2h reads, the AdamW count and
	 * the sum's scratch. */
	float *dev_losses;
	struct st_compute_sumsq *dev_sumsq;
	void *dev_sumsq_scratch;
	void *host_scalars;           /* host: the d2h's landing */
	size_t losses_bytes;          /* the losses, rounded up to 16 B */
	size_t scalars_bytes;         /* what the d2h moves */
};

/* The update sweep (engine_update.c). */
struct update_state {
	uint64_t tile_elems;          /* a tile of the sweep */
	struct updset sets[2];
	/* the sweep's tiles in order, and per state the next one whose load
	 * is not issued yet (n_tiles: none left) */
	struct utile *tiles;
	int n_tiles;
	int next[ST_STATE_COUNT];
	/* recorded on the h2d queue after each of the update's W stores into
	 * a vram home (the queue runs them in order: the last one's record
	 * says all are in); the next forward waits for it on the compute,
	 * not the host (engine_update.c, unit_done) */
	struct st_event *ev_wstore;
	/* device units: the AdamW count of elements left unchanged (vram) */
	uint32_t *dev_adam_bad;
	/* the update inside the backward (engine_update.c, "speculation"):
	 * the tiles in the backward's unit order (U-1 first), the next of
	 * them to update, whether this step speculates and whether it gave
	 * up */
	struct utile *tiles_main, *tiles_spec;
	int spec_next;
	bool spec_on, spec_step, spec_off;
	struct st_adam_step spec_wd, spec_nowd;
	/* the clip applied to the last step not skipped: this one runs the
	 * update after the backward, not speculating (engine_step.c);
	 * spec_now: this step speculates */
	bool clipped, spec_now;
};

/* Activations (engine_act.c, engine_step.c): the checkpoints, the saved
 * forwards, and the activation gradients. */
struct act_state {
	float *ckpt;                  /* vram: checkpoints, ckpt_elems floats each */
	size_t ckpt_elems;            /* floats of the largest unit output */
	float *grad_a, *grad_b;       /* vram: activation gradients, in turn */
	/* [n_units]: the saved-forward extent of a unit that keeps its
	 * forward (plan.keep), NULL for one that recomputes it; each
	 * saved_bytes */
	void **saved;
	void **saved_mb;              /* [n_units * N] layer-first, else [n_units] */
	size_t saved_bytes;
	/* checkpoints on the host: n_slots vram slots, and checkpoints
	 * 1..n_off going there and back; per checkpoint j (index
	 * 1..n_units-1) its copy's bytes, its two chains and their busy
	 * counts, and the events ev[ACT_EV_*][j] */
	bool on_host;
	/* layer-first: the N micro-batches' checkpoints of a boundary are
	 * one block (micro-batch a at a * mb_stride_bytes, Xa), copied as
	 * one; batch-first N is 1 */
	int n_mb;
	uint64_t mb_stride_bytes;
	int n_slots, n_off;
	const struct st_extent *slot_ext; /* [n_slots] vram */
	const struct st_extent *home_ext; /* [n_off] host: x[j] at j-1 */
	uint64_t *len_bytes;
	struct chain *chain_out, *chain_in;
	int *out_busy, *in_busy;
	struct st_event **ev[4];
};

/* ZeRO across ranks (docs/zero.md, engine_zero.c). */
struct zero_state {
	int stage;
	bool w_gather;                /* stages 1-2, world > 1: W slices gathered
					 after the update (wgather) */
	bool w_stream;                /* stage 3, world > 1: W gathered into its
					 slot before each use */
	char *nvme_dirs;              /* world > 1: DIR/rank-R of every dir */
	void *scratch;                /* vram: dW's all-to-all lands here */
	struct st_extent scratch_ext;
	/* stages 1-2: two host buffers of a padded unit of W, units in turn
	 * by parity: the update writes the rank's new slice of unit u into
	 * wgather[u & 1], the comm queue gathers the others' slices (event
	 * ev_wgather) while the next unit's update runs, and W goes home */
	char *wgather[2];
	int wgather_busy[2];          /* W stores in flight out of each */
	struct chain chain_wstore[2]; /* W from wgather[i] to its home */
	struct st_event *ev_wgather[2]; /* recorded on the comm queue after the gather */
	int wgather_unit[2];          /* the unit in flight in each, -1: none */
	bool wgather_store[2];        /* W goes home by a store chain after ev_wgather */
	bool wgather_storing[2];      /* that chain is started */
	/* world > 1: host values (the norm's sums, the losses, gathered
	 * states) go through device buffers (the comm scratch), because the
	 * device's memory is not the host's (cuda), or $ST_ZERO_DEVICE_PATH
	 * asks for it on the cpu device (tests: the cuda path's order) */
	bool via_device;
	double *parts;                /* world > 1, stage >= 2: the norm's chunk
					 sums, [world * n_parts] */
	uint64_t *part_off, n_parts;  /* [n_units]: unit u's chunks at part_off[u] */
	double *losses;               /* world > 1: [world * grad_accum] */
	/* --trace at world > 1: the comm queue's collectives as spans on a
	 * lane of their own, stamped on the queue */
	struct comm_span *spans;
	unsigned span_head, span_tail;
	int trace_lane;
};

/* The transfer layer (engine_lanes.c): every chain, and each lane's busy
 * time and bytes. It knows hops and tiers, nothing of what they carry:
 * a shard's owner hooks in to see its bytes. */
struct lanes_state {
	struct chain **chains;        /* every chain, for the pump's scans */
	int n_chains;
	int n_waiting;                /* chains whose hop's wait is not seen over */
	uint64_t vram_submits;
	struct lane_busy busy[ST_LANE_COUNT];
	uint64_t nvme_busy0_ns;       /* the nvme tier's busy_ns at the step's start */
	/* hooks on the hops of a shard (unit >= 0), set by their owner
	 * (engine_sums.c), NULL for none: hop_out sees a write's bytes before
	 * it is submitted, hop_in a read's once it completed (0, or -errno:
	 * the bytes are not to be used) */
	void (*hop_out)(struct st_engine *e, const struct hop *h);
	int (*hop_in)(struct st_engine *e, const struct hop *h);
};

/* The nvme checksums (engine_sums.c). */
struct sums_state {
	uint64_t **tile_sums;         /* [n_units * ST_STATE_COUNT]: per tile, nvme shards only */
	bool *written;                /* [n_units * ST_STATE_COUNT]: written since create */
	/* the alternate extents' (--update in-backward), swapped with
	 * tile_sums on a commit */
	uint64_t **alt_sums;
};

/* The micro-batch's tokens (engine_step.c): drawn into tokens_host,
 * targets_host (host), then copied to vram on the compute's queue, not
 * waited for: two pairs in turn (tokens_buf[i], targets_buf[i]), each
 * reused once the event recorded after its copies (ev_copied[i]) is
 * done. The four host buffers are one page-aligned allocation
 * (host_bytes), pinned where the device pins (host_pinned), so that the
 * queued copies are asynchronous: from pageable memory a cudaMemcpyAsync
 * may block the host until it is done. */
struct batch_state {
	int32_t *tokens, *targets;    /* vram (layer-first: N micro-batches') */
	int32_t *tokens_host, *targets_host;
	/* n_pairs host pairs: two batch-first (in turn), N layer-first
	 * (micro-batch a in pair a, all drawn at the step's start) */
	int32_t **tokens_buf, **targets_buf;
	/* --packing isolated: the attention's segment starts, beside each
	 * pair (in vram as tokens; host: after the pairs); NULL otherwise */
	int32_t *seg, *seg_host, **seg_buf;
	struct st_event **ev_copied;
	int n_pairs;
	size_t host_bytes;
	bool host_pinned;
	unsigned turn;
	/* a loss mask (the loader's): count is the step's counted targets
	 * over its micro-batches and ranks, counted when its first is drawn */
	bool masked;
	uint64_t count;
};

/* --trace: the lanes of the engine's tracks. */
struct trace_state {
	int lane[ST_LANE_COUNT];
	int host, phase;              /* the host's waits, the step's phases */
	int step;                     /* the step being run, for the phases */
};

struct st_engine {
	/* the shared core: config, model, plan, device, tiers, the units'
	 * sizes and shards, the pools */
	struct st_engine_config cfg;
	struct st_model *model;
	struct st_plan plan;
	int n_units;
	int w_elem_bytes;             /* W's element: 2 (bf16) or 4 (fp32) */
	/* M and V's format (cfg.optim_state) and element bytes (4, 2, 1);
	 * q8: per unit and moment, one fp32 scale per 64 elements of the
	 * unit (ST_MODEL_TENSOR_ALIGN_ELEMS): each AdamW call (a tensor's
	 * part of a tile, starting at a multiple of 64) counts its blocks
	 * from its start and takes its scales from slot start / 64 on
	 * (engine_update.c, st_eng_mv_segments()); the arrays are in the
	 * host pool ST_POOL_Q8_SCALES */
	enum st_optim_state mv_state;
	int mv_elem_bytes;
	float **q8_scale[2];          /* [M, V][n_units] */
	uint64_t *unit_elems;         /* [n_units]: e_u */
	uint64_t max_unit_elems;
	/* ZeRO (docs/zero.md): world and rank; per unit the slice S_u and
	 * the padded unit N * S_u (both e_u at world 1) */
	int world, rank;
	uint64_t *slice_elems, *padded_elems;
	struct st_device *dev;
	struct st_compute *cx;        /* the model's ops on dev */
	struct st_comm *comm;         /* this rank's collectives (world 1: local) */
	struct st_tier *tier[ST_HOME_COUNT];
	struct st_tier *nvme_inner; /* tests: the nvme tier inside the fault
				       tier tier[ST_HOME_NVME], else NULL */
	struct shard *shards;         /* [n_units * ST_STATE_COUNT] */
	struct st_extent *pool_ext;   /* [plan.n_pools][count]: see pool() */
	int *pool_first;              /* [plan.n_pools]: index into pool_ext */
	struct ubufs *unit_bufs;      /* [n_units] */
	struct ubufs shared_bufs[2];  /* the non-resident units' dW in turn */
	void *work;                   /* vram: the compute's scratch */
	size_t work_bytes;
	/* $ST_HOST_WAITS=1: the host waits where it did before the waits
	 * were moved off the step (tools/host-waits-bench's baseline) */
	bool host_waits;
	/* --schedule layer-first (engine_step.c): each unit runs all N
	 * micro-batches; a unit's dW of micro-batch a > 0 is computed into
	 * dw_fold (vram, the largest non-resident unit) and added into the
	 * unit's shared dW on the compute, in micro-batch order */
	bool layer_first;
	float *dw_fold;
	/* layer-first at world > 1: recorded by the compute after a
	 * micro-batch's dW, by the comm after its all-to-all (the fold on
	 * the compute waits for it) */
	struct st_event *lf_ev_dw, *lf_ev_red;

	/* each pipeline's own */
	struct lanes_state lanes;
	struct fetch_state fetch;
	struct grad_state grad;
	struct update_state update;
	struct act_state act;
	struct zero_state zero;
	struct sums_state sums;

	/* the step */
	struct batch_state batch;
	struct st_cursor step_end_cursor; /* st_engine_step_end_cursor() */
	bool fwd_ready;               /* the forward of the next step's first
					 micro-batch ran in the update sweep */
	int err;
	char errmsg[512];
	struct st_engine_stats last_stats;
	struct trace_state trace;
};

enum { ACT_EV_FW, ACT_EV_OUT, ACT_EV_BW, ACT_EV_IN };

static inline struct shard *shard(struct st_engine *e, int u, enum st_state s)
{
	return &e->shards[u * ST_STATE_COUNT + s];
}

static inline void *haddr(struct st_engine *e, const struct st_extent *x)
{
	return st_tier_addr(e->tier[ST_HOME_HOST], x);
}

static inline void *vaddr(struct st_engine *e, const struct st_extent *x)
{
	return st_tier_addr(e->tier[ST_HOME_VRAM], x);
}

/* The first element of unit u that this rank's shard of state s holds,
 * and how many it holds (docs/zero.md): a sharded state holds the rank's
 * slice, another the padded unit. */
static inline uint64_t sh_lo(const struct st_engine *e, int u, enum st_state s)
{
	return st_plan_sharded(&e->plan, s) ? (uint64_t)e->rank * e->slice_elems[u] : 0;
}

static inline uint64_t sh_elems(const struct st_engine *e, int u, enum st_state s)
{
	return st_plan_sharded(&e->plan, s) ? e->slice_elems[u] : e->padded_elems[u];
}

/* Bytes of one element of state s in its home. */
static inline size_t st_eng_eb(const struct st_engine *e, enum st_state s)
{
	return s == ST_STATE_W ? (size_t)e->w_elem_bytes
	       : s == ST_STATE_M || s == ST_STATE_V ? (size_t)e->mv_elem_bytes : 4u;
}

/* The AdamW calls' cut of unit u in elements [lo, lo + n) (a tile, or
 * the unit): each tensor's part of each update tile, in order; fn gets
 * each segment [a, b) and whether the tensor takes weight decay. The
 * same cut in the sweep and wherever M and V are converted, so q8's
 * blocks are the same in both. Returns the first nonzero fn return. */
int st_eng_mv_segments(struct st_engine *e, int u, uint64_t lo, uint64_t n,
		       int (*fn)(void *arg, uint64_t a, uint64_t b, bool decay), void *arg);

/* bufs' compact M and V pointers (state, mc, vc, scales) for the elements
 * from unit offset a of unit u, given M's and V's bytes at unit offset
 * base (a >= base). */
void st_eng_mv_bufs(const struct st_engine *e, int u, uint64_t a, uint64_t base, void *mbase,
		    void *vbase, struct st_adam_bufs *bufs);

static inline bool unit_resident(const struct st_engine *e, int u)
{
	return st_model_unit_layout(e->model, u)->resident;
}

/* The device buffers unit u computes with: its own when resident, else the
 * shared W and one of the two shared dW, in turn by unit. */
static inline struct ubufs *bufs_of(struct st_engine *e, int u)
{
	return unit_resident(e, u) ? &e->unit_bufs[u] : &e->shared_bufs[u & 1];
}

/* The W of the unit u reads (its layout's reads_unit), or NULL. */
static inline const void *other_w(struct st_engine *e, int u)
{
	int r = st_model_unit_layout(e->model, u)->reads_unit;

	return r >= 0 ? e->unit_bufs[r].w_compute : NULL;
}

/* Whether unit u's optimizer runs on the device: its G (and with it P, M,
 * V and W, the planner says) lives in vram. */
static inline bool opt_on_dev(const struct st_engine *e, int u)
{
	return e->shards[u * ST_STATE_COUNT + ST_STATE_G].home == ST_HOME_VRAM;
}

/* engine_lanes.c */
void st_eng_lane_begin(struct st_engine *e, enum st_lane l);
void st_eng_lane_end(struct st_engine *e, enum st_lane l, uint64_t t0, uint64_t bytes,
		     const char *name);
struct hop st_eng_hop(const char *name, enum st_home tier, enum st_io_op rw,
		      const struct st_extent *ext, uint64_t off_bytes, void *buf,
		      uint64_t len_bytes);
/* A hop between shard (u, s) in its home and buf; off_bytes is into the
 * shard. It carries the shard, so the lanes' hooks see it (an nvme hop is
 * summed or checked). */
struct hop st_eng_shard_hop(struct st_engine *e, const char *name, int u, enum st_state s,
			    enum st_io_op rw, uint64_t off_bytes, void *buf, uint64_t len_bytes);
int st_eng_chain_start(struct st_engine *e, struct chain *c, const struct hop *hops,
		       int nhops, int *busy, bool *queued);
int st_eng_pump(struct st_engine *e, bool block);
/* Pump until *counter is 0; the time the host waited goes on the trace's
 * host lane as a span named why (what it waited for). */
int st_eng_wait_until(struct st_engine *e, const int *counter, const char *why);
/* --trace: the host waited for why since t0_ns (a span on the host lane,
 * which trace-gaps sets against the compute lane's idle time). */
void st_eng_host_wait(struct st_engine *e, const char *why, uint64_t t0_ns);
/* --trace: the host ran the step's phase name (forward, backward, norm,
 * update, end) of micro-batch mb since t0_ns (the phase lane). */
void st_eng_phase(struct st_engine *e, const char *name, int mb, uint64_t t0_ns);
void st_eng_drain(struct st_engine *e);
int st_eng_compute_drain(struct st_engine *e);
void st_eng_stats_begin(struct st_engine *e);
void st_eng_stats_end(struct st_engine *e, uint64_t t0_ns);
void st_eng_fail(struct st_engine *e, int ret);

/* engine_sums.c: init sets the lanes' hop hooks */
int st_eng_sums_init(struct st_engine *e);
void st_eng_sums_fini(struct st_engine *e);
void st_eng_sums_put(struct st_engine *e, int u, enum st_state s, uint64_t off_bytes,
		     const void *buf, uint64_t len_bytes);
/* Tests (st_engine_config.test_nan_grad_unit): unit u's final G counts as
 * not finite at this step. */
static inline bool st_eng_test_nan_grad(const struct st_engine *e, int u)
{
	return e->cfg.test_nan_grad_unit == u + 1 && e->cfg.test_nan_grad_step == e->trace.step;
}

/* A commit of the update inside the backward: the alternate extent's
 * sums become shard (u, s)'s. */
void st_eng_sums_swap(struct st_engine *e, int u, enum st_state s);
int st_eng_sums_check(struct st_engine *e, int u, enum st_state s, uint64_t off_bytes,
		      const void *buf, uint64_t len_bytes);

/* engine_fetch.c */
/* The fetch sequence from its start (a new micro-batch), with the W of
 * units 0 .. w_ready-1 free to fetch. */
void st_eng_fetch_restart(struct st_engine *e, int w_ready);
/* Units 0 .. w_ready-1 may now be fetched (their new W is home). */
void st_eng_fetch_allow(struct st_engine *e, int w_ready);
int st_eng_acquire_w(struct st_engine *e, int u, void *dst);

/* engine_grad.c */
int st_eng_grad_out(struct st_engine *e, int u, const struct ubufs *b);
int st_eng_grad_in(struct st_engine *e, int u, int mb);
int st_eng_grad_in_once(struct st_engine *e, int u);
/* Layer-first at world > 1: micro-batch a's dW of unit u (dw, written by
 * the compute just before) goes to the ranks (all-to-all), and this
 * rank's N slots are folded on the compute into acc (the rank's slice)
 * in the host's order. 0 or -errno. */
int st_eng_grad_fold_ranks(struct st_engine *e, int u, float *dw, float *acc, int a);
/* Layer-first: unit u's folded dW in b (ev_dw recorded after its last
 * fold) to the host landing, once a step: at world 1 the unit (its
 * reduce-scatter in place), at world > 1 the rank's slice. */
int st_eng_grad_out_once(struct st_engine *e, int u, const struct ubufs *b);
/* Every G write in flight (out of the landing and the G staging) has
 * landed. 0 or -errno. */
int st_eng_grad_quiet(struct st_engine *e);
/* The step's device scalars, in one d2h that waits for the compute: each
 * micro-batch's mean loss into mean[a] (summed in *loss_sum), and the
 * device-side units' sums of squares into unit_sumsq (and nonfinite).
 * 0 or -errno. */
int st_eng_step_scalars(struct st_engine *e, double *loss_sum, double *mean);

/* engine_update.c */
int st_eng_update_setup(struct st_engine *e);
void st_eng_update_fini(struct st_engine *e);
/* The update's loads of P, M and V that need no G (on nvme, into the
 * staging of the sweep's first tiles of each state): queued at the start
 * of the last micro-batch's backward, so they overlap it, each once its
 * buffer's store from the last sweep has landed (poll: those that can go
 * now, called as the backward goes). 0 or -errno. */
int st_eng_update_prefetch(struct st_engine *e);
int st_eng_update_poll(struct st_engine *e);
/* A skipped update (the norm was not finite): wait for the prefetched
 * loads and forget them. 0 or -errno. */
int st_eng_update_drop(struct st_engine *e);
/* The next step's first forward, fused into the update sweep: the step
 * (engine_step.c) hands it over, so the sweep never calls back into the
 * step. begin draws the next micro-batch, no unit's W ready yet; unit_home
 * is called in unit order once unit u's new W is home (its forward may
 * run). Each returns 0 or -errno. */
struct st_eng_fused_fwd {
	int (*begin)(struct st_engine *e, const struct st_eng_fused_fwd *fwd);
	int (*unit_home)(struct st_engine *e, int u);
	struct st_loader *ld;
};

/* The update inside the backward (--update in-backward, engine_update.c):
 * it begins in st_eng_update_prefetch(), at the start of the last
 * micro-batch's backward, with the AdamW constants of a clip factor of 1
 * that the step put in update.spec_wd and spec_nowd (the P, M, V loads
 * of its first tiles are queued), and st_eng_update_poll() issues its
 * loads that may go as the backward goes; advance
 * once the G of units g_final.. is final (their tiles' AdamW, unless the
 * final G's say the speculation cannot hold), before the next dW or G
 * read takes the buffer g_final's G is in (grad.final_g: the backward
 * asks st_eng_grad_in_landing() whether that is the landing, which the
 * next dW d2h refills); finish once the norm is
 * known, with the step's constants: *done when the speculation held (the
 * rest of the tiles updated, every store landed, the alternates
 * committed); else nothing of P, M, V changed, and the speculated units'
 * W were rewritten from P: the step is skipped, or (not skipped) its
 * forwards and backwards are to run again. Each returns 0 or -errno. */
int st_eng_spec_advance(struct st_engine *e, int g_final);
bool st_eng_grad_in_landing(const struct st_engine *e, int u);
/* Whether a unit's final G goes to nvme (engine_grad.c): not where the
 * update inside the backward reads it in host memory (a step whose
 * speculation fails runs again, engine_step.c). */
bool st_eng_final_g_written(const struct st_engine *e);
int st_eng_spec_finish(struct st_engine *e, const struct st_adam_step *wd,
		       const struct st_adam_step *nowd, bool skipped, bool *done);
/* engine_state.c: unit u's W rewritten from its P (as st_engine_write_state
 * writes it). 0 or -errno. */
int st_eng_w_from_p(struct st_engine *e, int u);

/* The update sweep; with fwd (not NULL), fused with the next step's first
 * forward. 0 or -errno. */
int st_eng_update_sweep(struct st_engine *e, const struct st_adam_step *wd,
			const struct st_adam_step *nowd, const struct st_eng_fused_fwd *fwd);

/* engine_state.c */
int st_eng_read_own(struct st_engine *e, int u, enum st_state s, float *buf, uint64_t *lo,
		    uint64_t *n);

/* engine_zero.c */
int st_eng_zero_dirs(struct st_engine *e);
int st_eng_zero_setup(struct st_engine *e);
void st_eng_zero_fini(struct st_engine *e);
int st_eng_zero_wstore(struct st_engine *e, int u);
void st_eng_zero_wpoll(struct st_engine *e);
int st_eng_zero_wdone(struct st_engine *e, int u);
/* Stages 1-2, the update inside the backward: the rank's slice of unit
 * u's W from wgather[u & 1] to its home (ST_IO_WRITE, not waited for) or
 * back (ST_IO_READ, waited for). 0 or -errno. */
int st_eng_zero_wslice(struct st_engine *e, int u, enum st_io_op rw);
int st_eng_zero_gather_host(struct st_engine *e, void *recv, size_t slice_elems,
			    enum st_comm_dtype dt);
int st_eng_zero_ordinal(const struct st_engine_config *cfg);
void st_eng_zero_parts(struct st_engine *e, int u, const float *g);
int st_eng_zero_norm(struct st_engine *e, double *sumsq);
int st_eng_zero_loss(struct st_engine *e, double *sum);
void st_eng_zero_mark(struct st_engine *e, const char *name, bool end);
void st_eng_zero_trace(struct st_engine *e);

/* engine_act.c */
float *st_eng_act(struct st_engine *e, int j);
/* Layer-first: checkpoint j of micro-batch a (vram, or its slot's). */
float *st_eng_act_mb(struct st_engine *e, int j, int a);
int st_eng_act_setup(struct st_engine *e, const struct st_extent *slots,
		     const struct st_extent *homes);
int st_eng_act_chains(struct st_engine *e, struct chain **list);
void st_eng_act_fini(struct st_engine *e);
int st_eng_act_fwd_begin(struct st_engine *e, int u);
int st_eng_act_fwd_end(struct st_engine *e, int u);
void st_eng_act_bwd_begin(struct st_engine *e, int j);
int st_eng_act_bwd_end(struct st_engine *e, int j);
int st_eng_act_drain(struct st_engine *e);


#endif
