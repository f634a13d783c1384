/* The tiered engine against its invariants (docs/design.md):
 *  1. placement, prefetch depth and thread count do not change a bit;
 *  2. budgets are hard, and an impossible one is refused with the minimum;
 *  3. a checkpoint resumes bit-identically;
 *  4. an nvme failure mid-run is reported with file, offset and errno, and
 *     the last checkpoint still loads;
 *  5. a state that is not finite is never saved (latest stays);
 *  and gradient accumulation matches the large batch.
 *
 * `test_engine --device cpu-strict` runs every test on the cpu device whose
 * memory the host cannot touch (docs/gpu.md, "Strict mode"), and holds it
 * to the plain cpu device bit for bit.
 * `test_engine --device cuda` runs the engine on the cuda device instead:
 * invariant 1 and resume there, and the cuda run against the cpu run
 * within float tolerance. It exits 77 (skipped) without a GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/device.h"
#include "strata/engine.h"
#include "strata/family.h"
#ifdef ST_HAVE_CUDA
#include "strata/cuda.h"
#endif

#define STEPS 3
static char data_path[4200], dir[4096];
static const char *device = "cpu"; /* --device */

struct run {
	double loss[8], norm[8];
	float *P, *W; /* every unit's P and W, concatenated */
	size_t n;
};

static void base_config(struct st_engine_config *c)
{
	memset(c, 0, sizeof(*c));
	st_train_config_default(&c->train);
	assert_int_equal(st_model_config_parse("layers=2,dim=64,heads=2,vocab=256,ctx=64",
					       &c->train.model), 0);
	c->train.batch = 4;
	c->train.seq = 32;
	c->train.steps = 10;
	c->train.warmup = 2;
	c->train.seed = 11;
	c->gpu_mem_bytes = 64ull << 20;
	c->host_mem_bytes = 64ull << 20;
	c->nvme_dirs = dir;
	c->aio_block_bytes = 64 * 1024;
	c->device = device;
}

/* base_config with another model (a st_model_config_parse string). */
static void model_config(struct st_engine_config *c, const char *model)
{
	base_config(c);
	assert_int_equal(st_model_config_parse(model, &c->train.model), 0);
}

static void open_loader(struct st_dataset **ds, struct st_loader *ld,
			const struct st_engine_config *c)
{
	struct st_loader_config lc = { .batch = (uint32_t)c->train.batch,
				       .seq = (uint32_t)c->train.seq, .shuffle = 1,
				       .seed = c->train.seed, .split = ST_SPLIT_ALL };

	assert_int_equal(st_dataset_open(ds, data_path, ST_DATASET_BYTES), 0);
	assert_int_equal(st_loader_init(ld, *ds, &lc), 0);
}

static void collect(struct st_engine *e, struct run *r)
{
	const struct st_model *m = st_engine_model(e);
	size_t off = 0;

	r->n = 0;
	for (int u = 0; u < st_model_unit_count(m); u++)
		r->n += st_model_unit_layout(m, u)->elems;
	r->P = malloc(r->n * sizeof(float));
	r->W = malloc(r->n * sizeof(float));
	for (int u = 0; u < st_model_unit_count(m); u++) {
		assert_int_equal(st_engine_read_state(e, u, ST_STATE_P, r->P + off), 0);
		assert_int_equal(st_engine_read_state(e, u, ST_STATE_W, r->W + off), 0);
		off += st_model_unit_layout(m, u)->elems;
	}
}

static void train(const struct st_engine_config *c, int steps, struct run *r)
{
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;
	int ret;

	open_loader(&ds, &ld, c);
	ret = st_engine_create(c, &e);
	if (ret)
		fail_msg("engine: %s", st_error_last());
	for (int s = 0; s < steps; s++) {
		struct st_step_result res;

		ret = st_engine_step(e, &ld, s, s + 1 < steps, &res);
		if (ret)
			fail_msg("step %d: %s", s, st_error_last());
		r->loss[s] = res.loss;
		r->norm[s] = res.grad_norm;
	}
	collect(e, r);
	st_engine_destroy(e);
	st_dataset_close(ds);
}

static void same(const struct run *a, const struct run *b, int steps, const char *what)
{
	for (int s = 0; s < steps; s++)
		if (memcmp(&a->loss[s], &b->loss[s], sizeof(double)) ||
		    memcmp(&a->norm[s], &b->norm[s], sizeof(double)))
			fail_msg("%s: step %d loss %.9g/%.9g norm %.9g/%.9g differ", what, s,
				 a->loss[s], b->loss[s], a->norm[s], b->norm[s]);
	assert_int_equal(a->n, b->n);
	if (memcmp(a->P, b->P, a->n * sizeof(float)))
		fail_msg("%s: final master weights differ", what);
	if (memcmp(a->W, b->W, a->n * sizeof(float)))
		fail_msg("%s: final working weights differ", what);
}

static void run_free(struct run *r)
{
	free(r->P);
	free(r->W);
}

/* c trained STEPS steps (with `threads` OpenMP threads, 0: as many as
 * now) gives ref's losses, norms and weights bit for bit. */
static void train_same(const struct st_engine_config *c, int threads, const struct run *ref,
		       const char *what)
{
	const int threads0 = omp_get_max_threads();
	struct run r;

	if (threads)
		omp_set_num_threads(threads);
	train(c, STEPS, &r);
	omp_set_num_threads(threads0);
	same(ref, &r, STEPS, what);
	run_free(&r);
}

/* Budgets at which the planner's split policy (docs/plan.md) splits c's
 * placement: which = 0: host 4 KiB short of W in vram and the optimizer in
 * host (G, P, M, V split by unit and state: this model's update staging is
 * as large as its state, so what fits is not whole units); which = 1:
 * vram halfway between W streamed from host and every W in vram (W split
 * by unit between vram and host). The engine then plans it itself (auto). */
static void split_budgets(struct st_engine_config *c, int which)
{
	struct st_model *m;
	struct st_plan p;
	struct st_plan_input in = {
		.batch = c->train.batch, .seq = c->train.seq, .grad_accum = c->train.grad_accum,
		.bf16 = c->train.bf16, .gpu_mem_bytes = c->gpu_mem_bytes,
		.host_mem_bytes = c->host_mem_bytes, .have_nvme = true,
		.prefetch = 1, /* the depth the placement is chosen at */
		/* the checkpoints stay in vram: on the host they would free
		 * the vram the W split is made to use */
		.activations = ST_OFFLOAD_NONE,
	};
	uint64_t a;

	assert_int_equal(st_model_create(&c->train.model, &m), 0);
	in.model = m;
	if (which == 0) {
		in.params = ST_OFFLOAD_NONE;
		in.optim = ST_OFFLOAD_HOST;
		assert_int_equal(st_plan_make(&in, &p), 0);
		c->host_mem_bytes = p.total_bytes[ST_HOME_HOST] - 4096;
		st_plan_fini(&p);
	} else {
		in.params = ST_OFFLOAD_NONE;
		in.optim = ST_OFFLOAD_HOST;
		assert_int_equal(st_plan_make(&in, &p), 0);
		a = p.total_bytes[ST_HOME_VRAM];
		st_plan_fini(&p);
		in.params = ST_OFFLOAD_HOST;
		assert_int_equal(st_plan_make(&in, &p), 0);
		c->gpu_mem_bytes = (a + p.total_bytes[ST_HOME_VRAM]) / 2 / 4096 * 4096;
		st_plan_fini(&p);
	}
	c->params = ST_OFFLOAD_AUTO;
	c->optim = ST_OFFLOAD_AUTO;
	c->activations = ST_OFFLOAD_NONE;
	c->homes = NULL;
	/* the engine's own plan is split, as planned here */
	in.params = ST_OFFLOAD_AUTO;
	in.optim = ST_OFFLOAD_AUTO;
	in.prefetch = 0;
	in.gpu_mem_bytes = c->gpu_mem_bytes;
	in.host_mem_bytes = c->host_mem_bytes;
	assert_int_equal(st_plan_make(&in, &p), 0);
	assert_true(p.split);
	{
		bool vram = false, host = false, nvme = false;

		for (int u = 0; u < p.units; u++) {
			enum st_home w = st_plan_home(&p, u, ST_STATE_W);
			enum st_home g = st_plan_home(&p, u, ST_STATE_G);

			vram |= w == ST_HOME_VRAM;
			host |= (which ? w : g) == ST_HOME_HOST;
			nvme |= g == ST_HOME_NVME;
		}
		assert_true(host && (which ? vram : nvme));
	}
	st_plan_fini(&p);
	st_model_destroy(m);
}

static void test_placement_invariance(void **state)
{
	struct st_engine_config c;
	struct run ref, r;
	struct {
		const char *name;
		enum st_offload params, optim;
		int prefetch, threads;
		uint64_t tile;
	} cases[] = {
		{ "update in 2048-element tiles", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 0, 0, 2048 },
		{ "update in odd tiles, W in vram", ST_OFFLOAD_NONE, ST_OFFLOAD_NVME, 0, 0, 6144 },
		{ "params host, optim host", ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, 0, 0, 0 },
		{ "params nvme, optim nvme", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 0, 0, 0 },
		{ "mix: params host, optim nvme", ST_OFFLOAD_HOST, ST_OFFLOAD_NVME, 0, 0, 0 },
		{ "mix: params vram, optim nvme", ST_OFFLOAD_NONE, ST_OFFLOAD_NVME, 0, 0, 0 },
		{ "params nvme, prefetch 1", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 1, 0, 0 },
		{ "params nvme, prefetch 4", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 4, 0, 0 },
		{ "threads 1", ST_OFFLOAD_NVME, ST_OFFLOAD_HOST, 2, 1, 0 },
		{ "threads 2", ST_OFFLOAD_NVME, ST_OFFLOAD_HOST, 2, 2, 0 },
		/* the optimizer on the device (docs/gpu.md): G gathered, the
		 * norm taken and AdamW run on the compute's queue */
		{ "optim in vram", ST_OFFLOAD_NONE, ST_OFFLOAD_VRAM, 0, 0, 0 },
		{ "optim in vram, threads 1", ST_OFFLOAD_AUTO, ST_OFFLOAD_VRAM, 0, 1, 0 },
	};

	(void)state;
	base_config(&c);
	c.params = ST_OFFLOAD_NONE; /* everything in vram (the optimizer on host) */
	c.optim = ST_OFFLOAD_HOST;
	train(&c, STEPS, &ref);
	for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
		base_config(&c);
		c.params = cases[i].params;
		c.optim = cases[i].optim;
		c.prefetch = cases[i].prefetch;
		c.update_tile_elems = cases[i].tile;
		train_same(&c, cases[i].threads, &ref, cases[i].name);
	}
	/* A vocabulary large enough that the embedding is the largest unit: it
	 * then streams through a slot of its own (docs/plan.md). */
	{
		static const struct {
			const char *name;
			enum st_offload params, optim;
			int prefetch, accum;
		} big[] = {
			{ "big vocab: params nvme, prefetch 1", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 1, 1 },
			{ "big vocab: params host, prefetch 3", ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, 3, 1 },
			{ "big vocab: params nvme, accum 2", ST_OFFLOAD_NVME, ST_OFFLOAD_HOST, 2, 2 },
			{ "big vocab: optim in vram, accum 2", ST_OFFLOAD_NONE, ST_OFFLOAD_VRAM, 0, 2 },
		};
		struct run bref;

		for (size_t i = 0; i < ST_ARRAY_LEN(big); i++) {
			model_config(&c, "layers=2,dim=64,heads=2,vocab=2048,ctx=64");
			c.train.grad_accum = big[i].accum;
			if (i == 0 || big[i].accum != big[i - 1].accum) {
				if (i > 0)
					run_free(&bref);
				c.params = ST_OFFLOAD_NONE;
				c.optim = ST_OFFLOAD_HOST;
				train(&c, STEPS, &bref);
			}
			c.params = big[i].params;
			c.optim = big[i].optim;
			c.prefetch = big[i].prefetch;
			train_same(&c, 0, &bref, big[i].name);
		}
		run_free(&bref);
		/* split: only the embedding streamed (through its own slot alone),
		 * and everything but the embedding streamed (no slot of its own) */
		model_config(&c, "layers=2,dim=64,heads=2,vocab=2048,ctx=64");
		c.params = ST_OFFLOAD_NONE;
		c.optim = ST_OFFLOAD_HOST;
		train(&c, STEPS, &bref);
		for (int k = 0; k < 2; k++) {
			enum st_home homes[4 * ST_STATE_COUNT];

			for (int u = 0; u < 4; u++)
				for (int s = 0; s < ST_STATE_COUNT; s++)
					homes[u * ST_STATE_COUNT + s] =
						s != ST_STATE_W ? ST_HOME_HOST
						: (u == 0) == (k == 0) ? ST_HOME_NVME : ST_HOME_VRAM;
			c.homes = homes;
			c.prefetch = 1;
			train_same(&c, 0, &bref,
				   k ? "big vocab: all but the embedding streamed"
				     : "big vocab: only the embedding streamed");
		}
		run_free(&bref);
	}
	/* with accumulation, too */
	base_config(&c);
	c.train.grad_accum = 2;
	c.params = ST_OFFLOAD_NONE;
	c.optim = ST_OFFLOAD_HOST;
	run_free(&ref);
	train(&c, STEPS, &ref);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	train_same(&c, 0, &ref, "accum 2: vram vs nvme");
	c.params = ST_OFFLOAD_NONE;
	c.optim = ST_OFFLOAD_VRAM;
	train_same(&c, 0, &ref, "accum 2: optim in vram");
	/* Split placements: each (unit, state) has its own home, as the plan
	 * allows (st_plan_input.homes): W in vram, host and nvme by unit, and
	 * G, P, M, V each in host or nvme by unit and state. */
	for (int pattern = 0; pattern < 2; pattern++) {
		enum st_home homes[4 * ST_STATE_COUNT];
		char what[64];

		for (int u = 0; u < 4; u++)
			for (int s = 0; s < ST_STATE_COUNT; s++)
				homes[u * ST_STATE_COUNT + s] =
					s == ST_STATE_W ? (enum st_home)((u + pattern) % 3)
					: (u + s + pattern) % 2 ? ST_HOME_NVME : ST_HOME_HOST;
		base_config(&c);
		c.train.grad_accum = 2;
		c.homes = homes;
		c.prefetch = 1 + pattern;
		train(&c, STEPS, &r);
		snprintf(what, sizeof(what), "accum 2: split placement %d", pattern);
		same(&ref, &r, STEPS, what);
		run_free(&r);
	}
	/* Only some states staged by the update (st_plan_upd_staged()): W
	 * and G, P in host, one unit's M and another's V on nvme, so the fp32
	 * update staging holds M's and V's buffers alone and no W staging. */
	{
		enum st_home homes[4 * ST_STATE_COUNT];

		for (int u = 0; u < 4; u++)
			for (int s = 0; s < ST_STATE_COUNT; s++)
				homes[u * ST_STATE_COUNT + s] =
					(s == ST_STATE_M && u == 1) || (s == ST_STATE_V && u == 2)
						? ST_HOME_NVME : ST_HOME_HOST;
		base_config(&c);
		c.train.grad_accum = 2;
		c.homes = homes;
		train_same(&c, 0, &ref, "accum 2: only M and V staged");
	}
	/* Split placements the planner's policy makes itself (auto), at
	 * budgets that force a split: G, P, M, V by unit in host and on nvme;
	 * W by unit in vram and host. */
	for (int which = 0; which < 2; which++) {
		base_config(&c);
		c.train.grad_accum = 2;
		split_budgets(&c, which);
		train_same(&c, 0, &ref,
			   which ? "accum 2: the policy's split of W"
				 : "accum 2: the policy's split of G, P, M, V");
	}
	/* The optimizer on the device for some units only: units 0 and 2
	 * (the resident embedding among them) keep everything in vram, units
	 * 1 and 3 stream W from nvme or host with G, P, M, V in host or nvme,
	 * so the sweep interleaves device updates with tiles (and the fused
	 * forward waits on both kinds). */
	for (int pattern = 0; pattern < 2; pattern++) {
		enum st_home homes[4 * ST_STATE_COUNT];
		char what[64];

		for (int u = 0; u < 4; u++)
			for (int s = 0; s < ST_STATE_COUNT; s++)
				homes[u * ST_STATE_COUNT + s] =
					(u + pattern) % 2 == 0 ? ST_HOME_VRAM
					: s == ST_STATE_W ? (u % 4 == 1 ? ST_HOME_NVME : ST_HOME_HOST)
					: (u + s) % 2 ? ST_HOME_NVME : ST_HOME_HOST;
		base_config(&c);
		c.train.grad_accum = 2;
		c.homes = homes;
		c.prefetch = 1;
		c.update_tile_elems = 4096;
		train(&c, STEPS, &r);
		snprintf(what, sizeof(what), "accum 2: optim in vram for some units %d", pattern);
		same(&ref, &r, STEPS, what);
		run_free(&r);
	}
	run_free(&ref);
}

/* The update never reads a staged state before its load has landed: the
 * staging is filled with NaN bytes before each load (poison_staging), and
 * every nvme request reaches the disk only 2 ms after it is submitted
 * (ST_FAULT_LATE), so a read of a buffer whose load is still out finds the
 * poison (a NaN G fails the step; a NaN P, M or V changes the weights).
 * The loads that run ahead most: P, M, V queued in the backward, into the
 * first two staged tiles of each state, here behind units whose state is
 * in host (the rings of P, M and V start at different units); small tiles
 * (several per unit); grad_accum 2 (the prefetch in the last micro-batch
 * only); and everything on nvme. */
static void test_update_loads_land_first(void **state)
{
	struct st_engine_config c;
	struct run ref, r;

	(void)state;
	base_config(&c);
	c.train.grad_accum = 2;
	c.params = ST_OFFLOAD_NONE;
	c.optim = ST_OFFLOAD_HOST;
	train(&c, STEPS, &ref);
	for (int k = 0; k < 3; k++) {
		enum st_home homes[4 * ST_STATE_COUNT];
		static const char *const what[] = { "late loads: P, M, V rings behind host units",
						    "late loads: small tiles",
						    "late loads: all on nvme" };

		for (int u = 0; u < 4; u++)
			for (int s = 0; s < ST_STATE_COUNT; s++)
				homes[u * ST_STATE_COUNT + s] =
					s == ST_STATE_W ? ST_HOME_VRAM
					: k == 2 || u > (s == ST_STATE_P ? 0 : s == ST_STATE_M ? 1 : 2)
					? ST_HOME_NVME : ST_HOME_HOST;
		/* every 3rd, 5th or 7th request, when a read, 20 ms late, at
		 * each phase: the loads of one tile then land at different
		 * times, one much later than the others (a delay on all alike
		 * would let a missing wait hide behind the waits for the rest) */
		for (int ph = 0; ph < 3 + 2 * k; ph++) {
			char msg[96];

			base_config(&c);
			c.train.grad_accum = 2;
			c.homes = homes;
			c.update_tile_elems = k == 1 ? 4096 : 0;
			c.poison_staging = true;
			c.nvme_fault = (struct st_fault_config){ .kind = ST_FAULT_LATE,
								 .nth = (uint64_t)(1 + ph),
								 .every = (uint64_t)(3 + 2 * k),
								 .delay_ns = 20000000 };
			train(&c, STEPS, &r);
			snprintf(msg, sizeof(msg), "%s, every %d from %d", what[k], 3 + 2 * k, 1 + ph);
			same(&ref, &r, STEPS, msg);
			run_free(&r);
		}
	}
	run_free(&ref);
}

/* --- an untied head ------------------------------------------------------------
 * A test family: GPT-2 whose head has an lm_head.weight (V,C) of its own
 * instead of reading wte, so no unit reads another and none is resident.
 * Its math is GPT-2's (the head is handed its own matrix as `other`), and
 * lm_head starts as a copy of wte: the first forward is the tied model's. */
static const struct st_family_ops *gpt2; /* st_family_find("gpt2"), in test_untied_head */

static int untied_layout(const struct st_model_config *cfg, struct st_unit_layout *units,
			 struct st_tensor_layout *tensors, int *n_units, int *n_tensors)
{
	int nu, nt, ret;

	if (!units) {
		ret = gpt2->layout(cfg, NULL, NULL, &nu, &nt);
		*n_units = nu;
		*n_tensors = nt + 1;
		return ret;
	}
	nu = *n_units;
	nt = *n_tensors - 1;
	ret = gpt2->layout(cfg, units, tensors, &nu, &nt);
	if (ret < 0)
		return ret;
	units[0].resident = false;
	units[nu - 1].reads_unit = -1;
	st_unit_tensor_add(&units[nu - 1], &tensors[nt], "lm_head.weight", cfg->vocab, cfg->dim,
			   true);
	return 0;
}

static uint64_t lm_head_off(const struct st_model *m)
{
	const struct st_unit_layout *h = st_model_unit_layout(m, st_model_unit_count(m) - 1);

	return h->tensors[h->n_tensors - 1].offset_elems;
}

static int untied_init(const struct st_model *m, int u, uint64_t seed, float *params)
{
	const struct st_unit_layout *e = st_model_unit_layout(m, 0);
	int ret = gpt2->init_unit(m, u, seed, params);
	float *tmp;

	if (ret < 0 || u != st_model_unit_count(m) - 1)
		return ret;
	tmp = calloc(e->elems, sizeof(float));
	if (!tmp)
		return -ENOMEM;
	ret = gpt2->init_unit(m, 0, seed, tmp); /* wte is tensor 0 of unit 0 */
	memcpy(params + lm_head_off(m), tmp + e->tensors[0].offset_elems,
	       e->tensors[0].n_elems * sizeof(float));
	free(tmp);
	return ret;
}

static int untied_fwd(const struct st_model *m, int u, const struct st_model_batch *b,
		      const void *params, const void *other, const float *x, float *y,
		      float *loss, void *work, size_t work_bytes)
{
	if (u == st_model_unit_count(m) - 1)
		other = (const float *)params + lm_head_off(m); /* GPT-2's head reads "wte" at offset 0 */
	return gpt2->fwd(m, u, b, params, other, x, y, loss, work, work_bytes);
}

static int untied_bwd(const struct st_model *m, int u, const struct st_model_batch *b,
		      const void *params, const void *other, const float *x, const float *dy,
		      float *dx, float *grad, float *other_grad, float *loss, void *work,
		      size_t work_bytes)
{
	if (u == st_model_unit_count(m) - 1) {
		other = (const float *)params + lm_head_off(m);
		other_grad = grad + lm_head_off(m);
	}
	return gpt2->bwd(m, u, b, params, other, x, dy, dx, grad, other_grad, loss, work,
			 work_bytes);
}

static const char *const untied_types[] = { "gpt2-untied-test", NULL };

static const struct st_family_ops untied_family = {
	.name = "gpt2-untied-test",
	.abi = ST_FAMILY_ABI,
	.title = "GPT-2 with an untied head (test)",
	.hf_model_types = untied_types,
	/* the config hooks are GPT-2's: set from it in test_untied_head */
	.layout = untied_layout,
	.init_unit = untied_init,
	.work_bytes = NULL, /* set from GPT-2's in test_untied_head */
	.act_bytes = NULL,
	.fwd = untied_fwd,
	.bwd = untied_bwd,
	.flops_per_token = NULL,
};

/* The engine runs a head that reads no other unit through the same code:
 * placement invariance holds (vram, nvme, split), its first loss is the
 * tied model's bit for bit, and no pool is kept for a resident unit. */
static void test_untied_head(void **state)
{
	static struct st_family_ops fam;
	struct st_engine_config c;
	struct st_plan_input pin;
	struct st_plan plan;
	struct st_model *m;
	struct run tied, ref;
	enum st_home homes[4 * ST_STATE_COUNT];

	(void)state;
	gpt2 = st_family_find("gpt2");
	assert_non_null(gpt2);
	fam = untied_family;
	fam.config_parse = gpt2->config_parse;
	fam.config_check = gpt2->config_check;
	fam.config_format = gpt2->config_format;
	fam.config_describe = gpt2->config_describe;
	fam.config_fields = gpt2->config_fields;
	fam.hf_config_read = gpt2->hf_config_read;
	fam.hf_config_write = gpt2->hf_config_write;
	fam.work_bytes = gpt2->work_bytes;
	fam.act_bytes = gpt2->act_bytes;
	fam.flops_per_token = gpt2->flops_per_token;
	fam.body = gpt2->body; /* GPT-2's hooks run the body of the model's family */
	assert_int_equal(st_family_register(&fam), 0);
	base_config(&c);
	c.params = ST_OFFLOAD_NONE;
	c.optim = ST_OFFLOAD_HOST;
	train(&c, STEPS, &tied);
	c.train.model.family = &fam;
	train(&c, STEPS, &ref);
	if (memcmp(&tied.loss[0], &ref.loss[0], sizeof(double)))
		fail_msg("untied first loss %.9g, tied %.9g", ref.loss[0], tied.loss[0]);
	assert_true(ref.norm[0] != tied.norm[0]); /* dwte no longer gathers the head's */
	assert_true(ref.n > tied.n);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	c.prefetch = 1;
	train_same(&c, 0, &ref, "untied: vram vs nvme, prefetch 1");
	for (int u = 0; u < 4; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			homes[u * ST_STATE_COUNT + s] =
				s == ST_STATE_W ? (enum st_home)(u % 3)
				: (u + s) % 2 ? ST_HOME_NVME : ST_HOME_HOST;
	c.homes = homes;
	train_same(&c, 0, &ref, "untied: split placement");
	/* no resident unit: no pool of its own */
	assert_int_equal(st_model_create(&c.train.model, &m), 0);
	assert_false(st_model_unit_layout(m, 0)->resident);
	pin = (struct st_plan_input){ .model = m, .batch = 4, .seq = 32, .grad_accum = 1,
				      .bf16 = true, .gpu_mem_bytes = 1ull << 30,
				      .host_mem_bytes = 1ull << 30, .params = ST_OFFLOAD_HOST };
	assert_int_equal(st_plan_make(&pin, &plan), 0);
	for (int i = 0; i < plan.n_pools; i++)
		assert_int_not_equal(plan.pools[i].id, ST_POOL_WF_RES);
	st_plan_fini(&plan);
	st_model_destroy(m);
	run_free(&ref);
	run_free(&tied);
}

static void test_budgets(void **state)
{
	struct st_engine_config c;
	struct st_engine *e;
	struct st_engine_stats st;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_step_result res;
	const struct st_plan *p;
	uint64_t vmin, hmin;
	char want[64];

	(void)state;
	/* Tight budgets: peaks never pass them. */
	base_config(&c);
	c.gpu_mem_bytes = 12ull << 20;
	c.host_mem_bytes = 6ull << 20;
	open_loader(&ds, &ld, &c);
	if (st_engine_create(&c, &e))
		fail_msg("engine: %s", st_error_last());
	p = st_engine_plan(e);
	vmin = p->min_bytes[ST_HOME_VRAM];
	hmin = p->min_bytes[ST_HOME_HOST];
	for (int s = 0; s < 2; s++)
		assert_int_equal(st_engine_step(e, &ld, s, s == 0, &res), 0);
	st_engine_get_stats(e, &st);
	for (int h = 0; h < ST_HOME_COUNT; h++)
		if (st.has_tier[h] && h != ST_HOME_NVME)
			assert_true(st.peak_bytes[h] <= st.budget_bytes[h]);
	assert_true(st.peak_bytes[ST_HOME_VRAM] > 0 && st.peak_bytes[ST_HOME_HOST] > 0);
	st_engine_destroy(e);
	st_dataset_close(ds);
	/* One page under each minimum is refused, naming tier and minimum. */
	base_config(&c);
	c.gpu_mem_bytes = vmin - 4096;
	assert_int_equal(st_engine_create(&c, &e), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "vram"));
	st_format_bytes(vmin, want, sizeof(want));
	if (!strstr(st_error_last(), want))
		fail_msg("message '%s' lacks the minimum %s", st_error_last(), want);
	base_config(&c);
	c.gpu_mem_bytes = vmin;
	assert_int_equal(st_engine_create(&c, &e), 0);
	st_engine_destroy(e);
	base_config(&c);
	c.optim = ST_OFFLOAD_NVME;
	c.params = ST_OFFLOAD_NVME;
	c.host_mem_bytes = 1ull << 20;
	assert_int_equal(st_engine_create(&c, &e), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "host"));
	(void)hmin;
}

/* The engine and the in-memory reference trainer implement the same step:
 * with one micro-batch they agree bit for bit. */
static void test_matches_reference_trainer(void **state)
{
	struct st_engine_config c;
	struct run eng;
	struct st_trainer *t;
	struct st_dataset *ds;
	struct st_loader ld;
	float *p;
	size_t off = 0;

	(void)state;
	base_config(&c);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	train(&c, STEPS, &eng);
	open_loader(&ds, &ld, &c);
	assert_int_equal(st_trainer_create(&c.train, &t), 0);
	for (int s = 0; s < STEPS; s++) {
		struct st_step_result res;

		assert_int_equal(st_trainer_step(t, &ld, s, &res), 0);
		if (memcmp(&res.loss, &eng.loss[s], sizeof(double)) ||
		    memcmp(&res.grad_norm, &eng.norm[s], sizeof(double)))
			fail_msg("step %d: trainer %.9g/%.9g, engine %.9g/%.9g", s, res.loss,
				 res.grad_norm, eng.loss[s], eng.norm[s]);
	}
	p = malloc(eng.n * sizeof(float));
	for (int u = 0; u < st_model_unit_count(st_trainer_model(t)); u++) {
		size_t n = st_model_unit_layout(st_trainer_model(t), u)->elems;

		assert_int_equal(st_trainer_read_master(t, u, p + off), 0);
		off += n;
	}
	assert_memory_equal(p, eng.P, eng.n * sizeof(float));
	free(p);
	st_trainer_destroy(t);
	st_dataset_close(ds);
	run_free(&eng);
}

/* One step of c on a new engine (*ep, over *dsp: the caller's to close);
 * the bytes each link moved must be what the plan predicts, or the test
 * fails naming what (the case) and both. */
static void step_moves_plan(const struct st_engine_config *c, const char *what,
			    struct st_engine **ep, struct st_dataset **dsp,
			    struct st_engine_stats *st)
{
	struct st_loader ld;
	struct st_step_result res;
	const struct st_plan *p;

	open_loader(dsp, &ld, c);
	assert_int_equal(st_engine_create(c, ep), 0);
	assert_int_equal(st_engine_step(*ep, &ld, 0, false, &res), 0);
	st_engine_get_stats(*ep, st);
	p = st_engine_plan(*ep);
	if (st->bytes[ST_LANE_H2D] != p->h2d_bytes || st->bytes[ST_LANE_D2H] != p->d2h_bytes ||
	    st->bytes[ST_LANE_NVME_READ] != p->nvme_read_bytes ||
	    st->bytes[ST_LANE_NVME_WRITE] != p->nvme_write_bytes)
		fail_msg("%s: moved h2d %llu d2h %llu nvme r %llu w %llu, planned %llu %llu %llu "
			 "%llu", what, (unsigned long long)st->bytes[ST_LANE_H2D],
			 (unsigned long long)st->bytes[ST_LANE_D2H],
			 (unsigned long long)st->bytes[ST_LANE_NVME_READ],
			 (unsigned long long)st->bytes[ST_LANE_NVME_WRITE],
			 (unsigned long long)p->h2d_bytes, (unsigned long long)p->d2h_bytes,
			 (unsigned long long)p->nvme_read_bytes,
			 (unsigned long long)p->nvme_write_bytes);
}

/* The planner's traffic per step is what the engine moves. */
static void test_traffic_matches_plan(void **state)
{
	static const enum st_offload cases[][2] = {
		{ ST_OFFLOAD_NVME, ST_OFFLOAD_NVME }, { ST_OFFLOAD_HOST, ST_OFFLOAD_HOST },
		{ ST_OFFLOAD_NONE, ST_OFFLOAD_NVME }, { ST_OFFLOAD_HOST, ST_OFFLOAD_NVME },
		/* the optimizer on the device: nothing crosses a link */
		{ ST_OFFLOAD_NONE, ST_OFFLOAD_VRAM },
	};

	(void)state;
	/* the uniform rows, then two splits the policy makes (split_budgets) */
	for (size_t i = 0; i < ST_ARRAY_LEN(cases) + 2; i++)
		for (int accum = 1; accum <= 2; accum++) {
			struct st_engine_config c;
			struct st_engine *e;
			struct st_dataset *ds;
			struct st_engine_stats st;
			const struct st_plan *p;
			char what[64];

			base_config(&c);
			c.train.grad_accum = accum;
			if (i < ST_ARRAY_LEN(cases)) {
				c.params = cases[i][0];
				c.optim = cases[i][1];
			} else if (i == ST_ARRAY_LEN(cases) + 1 && accum == 1) {
				continue; /* this model's W splits only at N > 1 (the
					     head, fetched once, then saves h2d) */
			} else {
				split_budgets(&c, (int)(i - ST_ARRAY_LEN(cases)));
			}
			snprintf(what, sizeof(what), "case %zu accum %d", i, accum);
			step_moves_plan(&c, what, &e, &ds, &st);
			p = st_engine_plan(e);
			assert_true(p->split == (i >= ST_ARRAY_LEN(cases)));
			if (i < ST_ARRAY_LEN(cases) && cases[i][1] == ST_OFFLOAD_VRAM &&
			    (p->h2d_bytes || p->d2h_bytes || p->nvme_read_bytes ||
			     p->nvme_write_bytes || p->total_bytes[ST_HOME_HOST]))
				fail_msg("optim in vram: the plan moves h2d %llu d2h %llu bytes and "
					 "puts %llu in host", (unsigned long long)p->h2d_bytes,
					 (unsigned long long)p->d2h_bytes,
					 (unsigned long long)p->total_bytes[ST_HOME_HOST]);
			st_engine_destroy(e);
			st_dataset_close(ds);
		}
	/* checkpoints on the host: 3 of 5 there and back each micro-batch */
	for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++)
		for (int accum = 1; accum <= 2; accum++) {
			struct st_engine_config c;
			struct st_engine *e;
			struct st_dataset *ds;
			struct st_engine_stats st;
			const struct st_plan *p;
			char what[64];

			model_config(&c, "layers=4,dim=64,heads=2,vocab=256,ctx=64");
			c.params = cases[i][0];
			c.optim = cases[i][1];
			c.train.grad_accum = accum;
			c.activations = ST_OFFLOAD_HOST;
			snprintf(what, sizeof(what), "checkpoints on the host, case %zu accum %d", i,
				 accum);
			step_moves_plan(&c, what, &e, &ds, &st);
			p = st_engine_plan(e);
			assert_int_equal(p->act_offloaded, 3);
			assert_true(p->act_copy_bytes > 0);
			st_engine_destroy(e);
			st_dataset_close(ds);
		}
}

/* 6 steps straight = 3 steps, save, resume (another placement), 3 steps.
 * stopped: the third step runs with next_follows, as in a run told to stop
 * during it, and the save takes st_engine_step_end_cursor() (the loader has
 * given the next step's first batch by then). */
static void resume_case(bool stopped, const char *model)
{
	struct st_engine_config c;
	struct run straight, resumed;
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_step_result res;
	char ck[4200];
	uint64_t step;

	base_config(&c);
	if (model)
		assert_int_equal(st_model_config_parse(model, &c.train.model), 0);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	train(&c, 6, &straight);

	/* the optimizer on the device on one side of the checkpoint: saved
	 * from vram here, resumed into vram below when stopped */
	if (!stopped) {
		c.params = ST_OFFLOAD_NONE;
		c.optim = ST_OFFLOAD_VRAM;
	}
	snprintf(ck, sizeof(ck), "%s/ck%s", dir, stopped ? "-stopped" : "");
	open_loader(&ds, &ld, &c);
	assert_int_equal(st_engine_create(&c, &e), 0);
	for (int s = 0; s < 3; s++) {
		assert_int_equal(st_engine_step(e, &ld, s, s < 2 || stopped, &res), 0);
		resumed.loss[s] = res.loss;
		resumed.norm[s] = res.grad_norm;
	}
	assert_int_equal(st_engine_step_end_cursor(e)->step + stopped, ld.cur.step);
	if (st_engine_save(e, ck, 3, st_engine_step_end_cursor(e), "{\"k\":1}", 2))
		fail_msg("save: %s", st_error_last());
	st_engine_destroy(e);
	st_dataset_close(ds);

	/* A fresh engine (different placement, even: the activation
	 * checkpoints on the host too) picks up from the files. */
	c.params = stopped ? ST_OFFLOAD_NONE : ST_OFFLOAD_HOST;
	c.optim = stopped ? ST_OFFLOAD_VRAM : ST_OFFLOAD_HOST;
	c.activations = ST_OFFLOAD_HOST;
	open_loader(&ds, &ld, &c);
	assert_int_equal(st_engine_create(&c, &e), 0);
	{
		char *cfg = NULL;

		if (st_engine_resume(e, ck, &step, &ld.cur, &cfg))
			fail_msg("resume: %s", st_error_last());
		assert_int_equal(step, 3);
		assert_string_equal(cfg, "{\"k\":1}");
		free(cfg);
	}
	assert_int_equal(st_loader_seek(&ld, &ld.cur), 0);
	for (int s = 3; s < 6; s++) {
		assert_int_equal(st_engine_step(e, &ld, s, s < 5, &res), 0);
		resumed.loss[s] = res.loss;
		resumed.norm[s] = res.grad_norm;
	}
	collect(e, &resumed);
	st_engine_destroy(e);
	st_dataset_close(ds);
	same(&straight, &resumed, 6, stopped ? "6 straight vs 3 (the last beginning the 4th) + "
		  "save + resume + 3" : "6 straight vs 3 + resume + 3");
	run_free(&straight);
	run_free(&resumed);
}

static void test_resume(void **state)
{
	(void)state;
	resume_case(false, NULL);
	resume_case(true, NULL);
}

/* --- LLaMA ---------------------------------------------------------------------
 * The same invariants on LLaMA shapes: GQA with Qwen2's biases and a tied
 * head (the head reads the resident embedding), and an untied head with
 * llama3 rope scaling (the head a unit of its own, streamed). */
static const char *const llama_models[] = {
	"llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,bias=1,tied=1",
	"llama:layers=2,dim=64,heads=4,kv-heads=1,ffn=80,vocab=300,ctx=64,tied=0,"
	"rope-theta=500000,rope-scaling=llama3:8:1:4:16",
};

static void test_llama_placement(void **state)
{
	struct st_engine_config c;
	struct run ref;
	static const struct {
		const char *name;
		enum st_offload params, optim;
		int prefetch, threads;
	} cases[] = {
		{ "llama: params nvme, optim nvme", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 0, 0 },
		{ "llama: params host, prefetch 1", ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, 1, 0 },
		{ "llama: threads 2, params nvme", ST_OFFLOAD_NVME, ST_OFFLOAD_HOST, 2, 2 },
		{ "llama: optim in vram", ST_OFFLOAD_NONE, ST_OFFLOAD_VRAM, 0, 0 },
	};

	(void)state;
	for (size_t mi = 0; mi < ST_ARRAY_LEN(llama_models); mi++) {
		model_config(&c, llama_models[mi]);
		c.params = ST_OFFLOAD_NONE;
		c.optim = ST_OFFLOAD_HOST;
		train(&c, STEPS, &ref);
		assert_true(ref.loss[0] > 5.0 && ref.loss[0] < 6.5); /* ln 256..300 */
		for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
			model_config(&c, llama_models[mi]);
			c.params = cases[i].params;
			c.optim = cases[i].optim;
			c.prefetch = cases[i].prefetch;
			train_same(&c, cases[i].threads, &ref, cases[i].name);
		}
		/* split homes: W in vram, host and nvme by unit */
		enum st_home homes[4 * ST_STATE_COUNT];
		for (int u = 0; u < 4; u++)
			for (int s = 0; s < ST_STATE_COUNT; s++)
				homes[u * ST_STATE_COUNT + s] =
					s == ST_STATE_W ? (enum st_home)(u % 3)
					: (u + s) % 2 ? ST_HOME_NVME : ST_HOME_HOST;
		model_config(&c, llama_models[mi]);
		c.homes = homes;
		c.prefetch = 1;
		train_same(&c, 0, &ref, "llama: split placement");
		run_free(&ref);
	}
}

/* LLaMA at bf16: llama_models' shapes at head size 64, which the cuda
 * compute's bf16 attention runs (64 or 128; the precision check refuses
 * 16 there), so that `--device cuda` runs this test too. */
static const char *const llama_bf16_models[] = {
	"llama:layers=2,dim=64,heads=1,kv-heads=1,ffn=96,vocab=256,ctx=64,bias=1,tied=1",
	"llama:layers=2,dim=128,heads=2,kv-heads=1,ffn=80,vocab=300,ctx=64,tied=0,"
	"rope-theta=500000,rope-scaling=llama3:8:1:4:16",
};

/* LLaMA at --compute-dtype bf16 (src/model/llama.c at bf16): the same bits
 * whatever the placement, prefetch depth, thread count and recompute, and
 * a loss near fp32's but not equal to it (bf16 ran); at head size 64, so
 * that the cuda device runs it too. */
static void test_llama_bf16(void **state)
{
	struct st_engine_config c;
	struct run ref, f32;
	static const struct {
		const char *name;
		enum st_offload params, optim;
		int prefetch, threads;
		enum st_recompute recompute;
	} cases[] = {
		{ "llama bf16: params nvme, optim nvme", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 0, 0,
		  ST_RECOMPUTE_ALL },
		{ "llama bf16: params host, prefetch 1", ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, 1, 0,
		  ST_RECOMPUTE_ALL },
		{ "llama bf16: threads 2, params nvme", ST_OFFLOAD_NVME, ST_OFFLOAD_HOST, 2, 2,
		  ST_RECOMPUTE_ALL },
		{ "llama bf16: every block keeps its forward", ST_OFFLOAD_NVME, ST_OFFLOAD_HOST, 0,
		  0, ST_RECOMPUTE_NONE },
	};

	(void)state;
	for (size_t mi = 0; mi < ST_ARRAY_LEN(llama_bf16_models); mi++) {
		model_config(&c, llama_bf16_models[mi]);
		c.params = ST_OFFLOAD_NONE;
		c.optim = ST_OFFLOAD_HOST;
		train(&c, STEPS, &f32);
		c.compute_dtype = ST_PRECISION_BF16;
		train(&c, STEPS, &ref);
		for (int s = 0; s < STEPS; s++) {
			assert_true(fabs(ref.loss[s] - f32.loss[s]) < 0.01 * f32.loss[s]);
			assert_true(ref.loss[s] != f32.loss[s]);
		}
		for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
			model_config(&c, llama_bf16_models[mi]);
			c.compute_dtype = ST_PRECISION_BF16;
			c.params = cases[i].params;
			c.optim = cases[i].optim;
			c.prefetch = cases[i].prefetch;
			c.recompute = cases[i].recompute;
			train_same(&c, cases[i].threads, &ref, cases[i].name);
		}
		run_free(&ref);
		run_free(&f32);
	}
}

/* Activation checkpoints on the host (engine_act.c): the same bits as in
 * vram, whatever else is streamed, at grad_accum 1 and 2, for GPT-2 and
 * LLaMA shapes deep enough that several checkpoints go there and back. */
static void test_act_host(void **state)
{
	static const char *const models[] = {
		"layers=4,dim=64,heads=2,vocab=256,ctx=64",
		"llama:layers=4,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,tied=0",
	};
	static const struct {
		const char *name;
		enum st_offload params, optim;
		int prefetch;
		enum st_recompute recompute;
	} cases[] = {
		{ "W vram, optim host", ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, 0, ST_RECOMPUTE_ALL },
		{ "W nvme, optim nvme", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 0, ST_RECOMPUTE_ALL },
		{ "W host, prefetch 1", ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, 1, ST_RECOMPUTE_ALL },
		{ "W nvme, every block keeps its forward", ST_OFFLOAD_NVME, ST_OFFLOAD_HOST, 0,
		  ST_RECOMPUTE_NONE },
	};
	struct st_engine_config c;
	struct run ref, r;
	char what[160];

	(void)state;
	for (size_t mi = 0; mi < ST_ARRAY_LEN(models); mi++)
		for (int accum = 1; accum <= 2; accum++) {
			model_config(&c, models[mi]);
			c.train.grad_accum = accum;
			c.params = ST_OFFLOAD_NONE;
			c.optim = ST_OFFLOAD_HOST;
			c.activations = ST_OFFLOAD_NONE;
			c.recompute = ST_RECOMPUTE_ALL;
			train(&c, STEPS, &ref);
			for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
				struct st_engine *e;

				c.params = cases[i].params;
				c.optim = cases[i].optim;
				c.prefetch = cases[i].prefetch;
				c.recompute = cases[i].recompute;
				c.activations = ST_OFFLOAD_HOST;
				assert_int_equal(st_engine_create(&c, &e), 0);
				/* 5 checkpoints: 3 go to the host, 2 stay in their slots */
				assert_int_equal(st_engine_plan(e)->act_home, ST_HOME_HOST);
				assert_int_equal(st_engine_plan(e)->act_offloaded, 3);
				st_engine_destroy(e);
				train(&c, STEPS, &r);
				snprintf(what, sizeof(what), "%s, accum %d: checkpoints on the host, %s",
					 models[mi], accum, cases[i].name);
				same(&ref, &r, STEPS, what);
				run_free(&r);
			}
			run_free(&ref);
		}
}

/* Long sequences: a T = 8192 model whose checkpoints do not fit the vram
 * budget with the rest: refused with them forced into vram, trained with
 * auto (which puts them on the host), and the same bits as the run that
 * holds them in vram with more vram. */
static void test_act_long(void **state)
{
	struct st_engine_config c;
	struct st_engine *e;
	struct run ref, r;
	const struct st_plan *p;

	(void)state;
	model_config(&c, "layers=3,dim=32,heads=1,vocab=256,ctx=8192");
	c.train.batch = 1;
	c.train.seq = 8192;
	c.params = ST_OFFLOAD_NONE;
	c.optim = ST_OFFLOAD_HOST;
	c.gpu_mem_bytes = 25ull << 20;
	c.host_mem_bytes = 64ull << 20;
	c.activations = ST_OFFLOAD_NONE;
	assert_int_equal(st_engine_create(&c, &e), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "vram budget"));
	assert_non_null(strstr(st_error_last(), "--offload-activations auto or host"));
	c.activations = ST_OFFLOAD_AUTO;
	assert_int_equal(st_engine_create(&c, &e), 0);
	p = st_engine_plan(e);
	assert_int_equal(p->act_home, ST_HOME_HOST);
	assert_int_equal(p->act_offloaded, 2);
	st_engine_destroy(e);
	train(&c, 2, &r);
	c.gpu_mem_bytes = 64ull << 20;
	assert_int_equal(st_engine_create(&c, &e), 0);
	assert_int_equal(st_engine_plan(e)->act_home, ST_HOME_VRAM); /* auto: they fit */
	st_engine_destroy(e);
	train(&c, 2, &ref);
	same(&ref, &r, 2, "T=8192: checkpoints on the host vs in vram");
	run_free(&ref);
	run_free(&r);
}

/* The vram total of c's plan (the engine's own), and one saved-forward
 * extent's bytes. */
static void plan_of(const struct st_engine_config *c, uint64_t *vram, uint64_t *saved_each,
		    int *n_keep)
{
	struct st_engine *e;

	if (st_engine_create(c, &e))
		fail_msg("engine: %s", st_error_last());
	*vram = st_engine_plan(e)->total_bytes[ST_HOME_VRAM];
	*saved_each = st_engine_plan(e)->saved_each_bytes;
	*n_keep = st_engine_plan(e)->n_keep;
	st_engine_destroy(e);
}

/* Keeping a unit's forward instead of recomputing it changes no bit:
 * recompute all against none (every block keeps) and auto with a vram
 * budget that holds one block's saved forward (the last block keeps, the
 * other recomputes), W in vram and streamed from nvme, at grad_accum 2
 * (a saved extent is rewritten by every micro-batch's forward, the first
 * one's in the fused forward of the update sweep), on GPT-2 and LLaMA. */
static void test_recompute_invariance(void **state)
{
	static const char *const models[] = {
		"layers=2,dim=64,heads=2,vocab=256,ctx=64",
		"llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,bias=1,tied=1",
	};
	static const struct {
		const char *name;
		enum st_offload params;
		enum st_recompute mode;
		bool one; /* budget for one saved extent */
	} cases[] = {
		{ "recompute none, W in vram", ST_OFFLOAD_NONE, ST_RECOMPUTE_NONE, false },
		{ "recompute none, W on nvme", ST_OFFLOAD_NVME, ST_RECOMPUTE_NONE, false },
		{ "recompute auto (one kept), W in vram", ST_OFFLOAD_NONE, ST_RECOMPUTE_AUTO, true },
		{ "recompute auto (one kept), W on nvme", ST_OFFLOAD_NVME, ST_RECOMPUTE_AUTO, true },
	};
	struct st_engine_config c;
	struct run ref, r;

	(void)state;
	for (size_t mi = 0; mi < ST_ARRAY_LEN(models); mi++) {
		model_config(&c, models[mi]);
		c.train.grad_accum = 2;
		c.params = ST_OFFLOAD_NONE;
		c.optim = ST_OFFLOAD_HOST;
		c.recompute = ST_RECOMPUTE_ALL;
		train(&c, STEPS, &ref);
		for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
			uint64_t vram, each;
			int n_keep;
			char what[128];

			model_config(&c, models[mi]);
			c.train.grad_accum = 2;
			c.params = cases[i].params;
			c.optim = cases[i].params == ST_OFFLOAD_NVME ? ST_OFFLOAD_NVME : ST_OFFLOAD_HOST;
			c.prefetch = 1;
			c.recompute = cases[i].mode;
			if (cases[i].one) {
				/* what recompute all takes, and one more extent */
				struct st_engine_config a = c;

				a.recompute = ST_RECOMPUTE_NONE;
				plan_of(&a, &vram, &each, &n_keep);
				assert_int_equal(n_keep, 2);
				a.recompute = ST_RECOMPUTE_ALL;
				uint64_t none_each = each;

				plan_of(&a, &vram, &each, &n_keep);
				assert_int_equal(n_keep, 0);
				c.gpu_mem_bytes = vram + (none_each + 4095) / 4096 * 4096;
			}
			plan_of(&c, &vram, &each, &n_keep);
			assert_int_equal(n_keep, cases[i].one ? 1 : 2);
			train(&c, STEPS, &r);
			snprintf(what, sizeof(what), "%s: %s", models[mi], cases[i].name);
			same(&ref, &r, STEPS, what);
			run_free(&r);
		}
		run_free(&ref);
	}
}

static void test_llama_resume(void **state)
{
	(void)state;
	resume_case(false, llama_models[0]);
	resume_case(true, llama_models[1]);
}

static void test_nvme_fault(void **state)
{
	struct st_engine_config c;
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_step_result res;
	char ck[4200];
	uint64_t step;
	int ret = 0, s;

	(void)state;
	snprintf(ck, sizeof(ck), "%s/fault-ck", dir);
	base_config(&c);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	/* The fault tier's operation 165 is a read at nvme offset 2215936
	 * mid-run: the request in which the nvme tier's own hook, now gone,
	 * failed its 400th completed block. */
	c.nvme_fault = (struct st_fault_config){ .kind = ST_FAULT_EIO, .nth = 165 };
	open_loader(&ds, &ld, &c);
	assert_int_equal(st_engine_create(&c, &e), 0);
	for (s = 0; s < 20 && ret == 0; s++) {
		ret = st_engine_step(e, &ld, s, s > 0, &res);
		if (ret == 0 && s == 0)
			assert_int_equal(st_engine_save(e, ck, 1, &ld.cur, NULL, 2), 0);
	}
	assert_int_equal(ret, -EIO);
	assert_true(s > 1); /* mid-run, after the checkpoint */
	assert_non_null(strstr(st_error_last(), dir));
	assert_non_null(strstr(st_error_last(), "offset "));
	assert_non_null(strstr(st_error_last(), "Input/output error"));
	assert_non_null(strstr(st_error_last(), "read "));
	assert_non_null(strstr(st_error_last(), "offset 2215936: "));
	/* the engine stays failed */
	assert_int_equal(st_engine_step(e, &ld, s, true, &res), -EIO);
	st_engine_destroy(e);
	st_dataset_close(ds);
	/* the last checkpoint loads */
	base_config(&c);
	open_loader(&ds, &ld, &c);
	assert_int_equal(st_engine_create(&c, &e), 0);
	if (st_engine_resume(e, ck, &step, &ld.cur, NULL))
		fail_msg("resume after the fault: %s", st_error_last());
	assert_int_equal(step, 1);
	st_engine_destroy(e);
	st_dataset_close(ds);
}

/* --- what comes back from nvme is what went in ----------------------------------
 * The engine's swap file is corrupted behind its back, through its own
 * descriptor (as a bad drive or another process would), after the state is
 * written and before it is read again: one bit, one byte, a page of 0xFF,
 * a stale older version of the page, a page of another shard. The next read
 * must stop the run with -EIO naming unit, state, file, offset and both
 * checksums, every time; with no_verify_reads the same corruption goes
 * through (so the check is what caught it). */
static int swap_fd(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int fd = -1;

	assert_non_null(d);
	while ((de = readdir(d)) && fd < 0) {
		char link[300], target[4300];
		ssize_t n;

		snprintf(link, sizeof(link), "/proc/self/fd/%s", de->d_name);
		n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		/* a swap file: named strata-*.swap, or nameless (O_TMPFILE) */
		if (strncmp(target, dir, strlen(dir)) == 0 &&
		    (strstr(target, ".swap") || strstr(target, "/#")))
			fd = atoi(de->d_name);
	}
	closedir(d);
	assert_true(fd >= 0);
	return fd;
}

/* The page at byte off of the file (O_DIRECT: aligned buffer and offset). */
static void page_io(int fd, uint64_t off, void *page, bool write)
{
	ssize_t n = write ? pwrite(fd, page, 4096, (off_t)off) : pread(fd, page, 4096, (off_t)off);

	assert_int_equal(n, 4096);
}

enum corruption { C_BIT, C_BYTE, C_PAGE, C_STALE, C_OTHER, C_COUNT };

/* Train a step, corrupt unit 1's P (which the next update reads), train
 * on; the step that reads it returns. */
static int corrupt_and_step(enum corruption kind, bool verify, char *msg, size_t msg_bytes)
{
	struct st_engine_config c;
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_step_result res;
	struct st_extent p_ext, m_ext;
	enum st_home home;
	void *page, *old;
	uint64_t off;
	int fd, ret = 0;

	base_config(&c);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	c.no_verify_reads = !verify;
	open_loader(&ds, &ld, &c);
	assert_int_equal(st_engine_create(&c, &e), 0);
	assert_int_equal(st_engine_shard(e, 1, ST_STATE_P, &home, &p_ext), 0);
	assert_int_equal(home, ST_HOME_NVME);
	assert_int_equal(st_engine_shard(e, 1, ST_STATE_M, &home, &m_ext), 0);
	assert_int_equal(posix_memalign(&page, 4096, 4096), 0);
	assert_int_equal(posix_memalign(&old, 4096, 4096), 0);
	fd = swap_fd(); /* one --nvme dir: the tier's offset is the file's */
	off = p_ext.off_bytes + 4096; /* the second page of unit 1's P */
	page_io(fd, off, old, false);
	assert_int_equal(st_engine_step(e, &ld, 0, false, &res), 0);
	page_io(fd, off, page, false);
	assert_true(memcmp(page, old, 4096) != 0); /* the step rewrote it */
	switch (kind) {
	case C_BIT: ((uint8_t *)page)[100] ^= 0x10; break;
	case C_BYTE: /* a byte that is not zero already */
		for (int i = 0; i < 4096; i++)
			if (((uint8_t *)page)[i]) {
				((uint8_t *)page)[i] = 0;
				break;
			}
		break;
	case C_PAGE: memset(page, 0xFF, 4096); break;
	case C_STALE: memcpy(page, old, 4096); break; /* what it held a step ago */
	case C_OTHER: page_io(fd, m_ext.off_bytes + 4096, page, false); break;
	default: break;
	}
	page_io(fd, off, page, true);
	for (int s = 1; s < 3 && ret == 0; s++)
		ret = st_engine_step(e, &ld, s, false, &res);
	snprintf(msg, msg_bytes, "%s", ret ? st_error_last() : "");
	free(page);
	free(old);
	st_engine_destroy(e);
	st_dataset_close(ds);
	return ret;
}

static void test_nvme_checksums(void **state)
{
	static const char *names[C_COUNT] = { "one bit", "one byte", "one page of 0xFF",
					      "a stale page", "another shard's page" };
	char msg[1024];

	(void)state;
	for (int k = 0; k < C_COUNT; k++) {
		int ret = corrupt_and_step((enum corruption)k, true, msg, sizeof(msg));

		if (ret != -EIO)
			fail_msg("%s: step returned %d, want -EIO (%s)", names[k], ret, msg);
		if (!strstr(msg, "unit 1 (h.0.") || !strstr(msg, "state P") ||
		    !strstr(msg, dir) || !strstr(msg, "offset ") || !strstr(msg, "written "))
			fail_msg("%s: message lacks unit, state, file, offset or sums: %s",
				 names[k], msg);
	}
	/* unchecked, the same corruption goes through */
	assert_int_equal(corrupt_and_step(C_PAGE, false, msg, sizeof(msg)), 0);
}

/* The same through the fault tier (tiers/fault.c), which damages what a
 * write leaves behind while completing it as asked: at the 60th write to
 * nvme (in the second step's update), each kind of damage is caught on the
 * next read of that range, with the line naming unit, state and file. */
static void test_nvme_checksums_fault_tier(void **state)
{
	static const enum st_corrupt_kind kinds[] = { ST_CORRUPT_BIT, ST_CORRUPT_ZERO_BYTE,
						      ST_CORRUPT_PAGE_FF, ST_CORRUPT_STALE,
						      ST_CORRUPT_OTHER_PAGE };
	struct st_engine_config c;
	struct st_extent last_v;
	enum st_home home;

	(void)state;
	base_config(&c);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	{ /* the last unit's V: the other shard a page comes from */
		struct st_engine *e;

		assert_int_equal(st_engine_create(&c, &e), 0);
		assert_int_equal(st_engine_shard(e, 3, ST_STATE_V, &home, &last_v), 0);
		st_engine_destroy(e);
	}
	for (size_t k = 0; k <= ST_ARRAY_LEN(kinds); k++) {
		bool unchecked = k == ST_ARRAY_LEN(kinds); /* a page of 0xFF, not checked */
		struct st_engine *e;
		struct st_dataset *ds;
		struct st_loader ld;
		struct st_step_result res;
		int ret = 0, s;

		base_config(&c);
		c.params = ST_OFFLOAD_NVME;
		c.optim = ST_OFFLOAD_NVME;
		c.no_verify_reads = unchecked;
		c.nvme_fault.corrupt = (struct st_fault_corrupt){
			.kind = unchecked ? ST_CORRUPT_PAGE_FF : kinds[k], .nth_write = 60, .at_bytes = 100, .bit = 3,
			.src_off_bytes = last_v.off_bytes + last_v.len_bytes - 4096,
		};
		open_loader(&ds, &ld, &c);
		assert_int_equal(st_engine_create(&c, &e), 0);
		for (s = 0; s < 4 && ret == 0; s++)
			ret = st_engine_step(e, &ld, s, false, &res);
		if (unchecked) { /* garbage goes in: whatever comes of it, not the check */
			assert_false(ret == -EIO && strstr(st_error_last(), "XXH3"));
			st_engine_destroy(e);
			st_dataset_close(ds);
			continue;
		}
		if (ret != -EIO)
			fail_msg("corruption %d: steps returned %d, want -EIO", (int)kinds[k], ret);
		if (!strstr(st_error_last(), "unit ") || !strstr(st_error_last(), " state ") ||
		    !strstr(st_error_last(), dir) || !strstr(st_error_last(), "written "))
			fail_msg("corruption %d: %s", (int)kinds[k], st_error_last());
		st_engine_destroy(e);
		st_dataset_close(ds);
	}
}

/* P, M or V not finite (or V below 0) at a save: refused naming the file,
 * tensor and index; nothing of it is left and latest names the last
 * finite checkpoint, which still resumes. */
static void test_nonfinite_save(void **state)
{
	struct st_engine_config c;
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_step_result res;
	char ck[4200], link[64], want[4400];
	const struct st_unit_layout *ul;
	float *p, *m, *v;
	uint64_t step;
	ssize_t n;

	(void)state;
	snprintf(ck, sizeof(ck), "%s/nonfinite-ck", dir);
	base_config(&c);
	c.optim = ST_OFFLOAD_NVME;
	open_loader(&ds, &ld, &c);
	assert_int_equal(st_engine_create(&c, &e), 0);
	assert_int_equal(st_engine_step(e, &ld, 0, false, &res), 0);
	assert_int_equal(st_engine_save(e, ck, 1, &ld.cur, NULL, 0), 0);
	ul = st_model_unit_layout(st_engine_model(e), 1);
	p = malloc(ul->elems * sizeof(float));
	m = malloc(ul->elems * sizeof(float));
	v = malloc(ul->elems * sizeof(float));
	assert_true(p && m && v);
	assert_int_equal(st_engine_read_state(e, 1, ST_STATE_P, p), 0);
	assert_int_equal(st_engine_read_state(e, 1, ST_STATE_M, m), 0);
	assert_int_equal(st_engine_read_state(e, 1, ST_STATE_V, v), 0);
	for (int k = 0; k < 3; k++) {
		static const char *const file[] = { "model.safetensors", "optimizer.safetensors",
						    "optimizer.safetensors" };
		static const char *const suffix[] = { "", ".exp_avg", ".exp_avg_sq" };
		static const char *const val[] = { "nan", "inf", "-1" };
		float *x[] = { p, m, v }, keep;
		const struct st_tensor_layout *tl = &ul->tensors[1];
		DIR *d;
		struct dirent *de;
		int entries = 0;

		keep = x[k][tl->offset_elems + 5];
		x[k][tl->offset_elems + 5] = k == 0 ? NAN : k == 1 ? INFINITY : -1.0f;
		assert_int_equal(st_engine_write_state(e, 1, p, m, v), 0);
		assert_int_equal(st_engine_save(e, ck, 2, &ld.cur, NULL, 0), -EINVAL);
		snprintf(want, sizeof(want), "%s: %s%s[5] is %s: a state that is not finite is "
			 "not saved", file[k], tl->name, suffix[k], val[k]);
		if (!strstr(st_error_last(), want))
			fail_msg("save %d: '%s' does not say '%s'", k, st_error_last(), want);
		x[k][tl->offset_elems + 5] = keep;
		/* only step-000001 and latest -> it */
		snprintf(want, sizeof(want), "%s/latest", ck);
		n = readlink(want, link, sizeof(link) - 1);
		assert_true(n > 0);
		link[n] = '\0';
		assert_string_equal(link, "step-000001");
		assert_non_null(d = opendir(ck));
		while ((de = readdir(d)))
			if (de->d_name[0] != '.') {
				entries++;
				if (strcmp(de->d_name, "latest") && strcmp(de->d_name, "step-000001"))
					fail_msg("left in the checkpoint dir: %s", de->d_name);
			}
		closedir(d);
		assert_int_equal(entries, 2);
	}
	/* the state made whole again saves */
	assert_int_equal(st_engine_write_state(e, 1, p, m, v), 0);
	assert_int_equal(st_engine_save(e, ck, 2, &ld.cur, NULL, 0), 0);
	st_engine_destroy(e);
	st_dataset_close(ds);
	free(p);
	free(m);
	free(v);
	base_config(&c);
	open_loader(&ds, &ld, &c);
	assert_int_equal(st_engine_create(&c, &e), 0);
	if (st_engine_resume(e, ck, &step, &ld.cur, NULL))
		fail_msg("resume: %s", st_error_last());
	assert_int_equal(step, 2);
	st_engine_destroy(e);
	st_dataset_close(ds);
}

static void test_grad_accum(void **state)
{
	struct st_engine_config c;
	struct run big, acc;

	(void)state;
	/* Contiguous order: B=4 x 1 and B=2 x 2 see the same sequences. */
	base_config(&c);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	c.train.batch = 4;
	{
		struct st_engine *e;
		struct st_dataset *ds;
		struct st_loader ld;
		struct st_loader_config lc = { .batch = 4, .seq = 32, .shuffle = 0 };
		struct st_step_result res;

		assert_int_equal(st_dataset_open(&ds, data_path, ST_DATASET_BYTES), 0);
		assert_int_equal(st_loader_init(&ld, ds, &lc), 0);
		assert_int_equal(st_engine_create(&c, &e), 0);
		for (int s = 0; s < STEPS; s++) {
			assert_int_equal(st_engine_step(e, &ld, s, s + 1 < STEPS, &res), 0);
			big.loss[s] = res.loss;
			big.norm[s] = res.grad_norm;
		}
		collect(e, &big);
		st_engine_destroy(e);
		c.train.batch = 2;
		c.train.grad_accum = 2;
		lc.batch = 2;
		assert_int_equal(st_loader_init(&ld, ds, &lc), 0);
		assert_int_equal(st_engine_create(&c, &e), 0);
		for (int s = 0; s < STEPS; s++) {
			assert_int_equal(st_engine_step(e, &ld, s, s + 1 < STEPS, &res), 0);
			acc.loss[s] = res.loss;
			acc.norm[s] = res.grad_norm;
		}
		collect(e, &acc);
		st_engine_destroy(e);
		st_dataset_close(ds);
	}
	for (int s = 0; s < STEPS; s++) {
		assert_true(fabs(big.loss[s] - acc.loss[s]) <= 1e-5 * fabs(big.loss[s]));
		assert_true(fabs(big.norm[s] - acc.norm[s]) <= 1e-4 * fabs(big.norm[s]));
	}
	{
		double num = 0, den = 0;

		for (size_t i = 0; i < big.n; i++) {
			num += (double)(big.P[i] - acc.P[i]) * (big.P[i] - acc.P[i]);
			den += (double)big.P[i] * big.P[i];
		}
		assert_true(sqrt(num / den) < 1e-5);
	}
	run_free(&big);
	run_free(&acc);
}

/* --schedule layer-first (docs/engine.md, "Schedules"): each unit runs all
 * N micro-batches while its W is in vram and folds their dW on the device
 * in the host's order, so every number is batch-first's bit for bit: on
 * GPT-2 and both LLaMAs, W and the optimizer in every tier, split homes,
 * the optimizer on the device, prefetch 1, 1 and 2 threads. */
static void test_layer_first_invariance(void **state)
{
	static const char *const models[] = {
		"layers=2,dim=64,heads=2,vocab=256,ctx=64",
		"llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,bias=1,tied=1",
		"llama:layers=2,dim=64,heads=4,kv-heads=1,ffn=80,vocab=300,ctx=64,tied=0,"
		"rope-theta=500000,rope-scaling=llama3:8:1:4:16",
	};
	static const struct {
		const char *name;
		enum st_offload params, optim;
		int prefetch, threads;
		bool split;
	} cases[] = {
		{ "layer-first: all in vram, 1 thread", ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, 0, 1, false },
		{ "layer-first: nvme, 2 threads", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 0, 2, false },
		{ "layer-first: host, prefetch 1", ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, 1, 0, false },
		{ "layer-first: params vram, optim nvme, 1 thread", ST_OFFLOAD_NONE,
		  ST_OFFLOAD_NVME, 0, 1, false },
		{ "layer-first: optim in vram", ST_OFFLOAD_NONE, ST_OFFLOAD_VRAM, 0, 2, false },
		{ "layer-first: split homes", 0, 0, 1, 0, true },
	};
	enum st_home homes[4 * ST_STATE_COUNT];
	struct st_engine_config c;
	struct run ref;

	(void)state;
	for (int u = 0; u < 4; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			homes[u * ST_STATE_COUNT + s] = s == ST_STATE_W ? (enum st_home)(u % 3)
							: (u + s) % 2 ? ST_HOME_NVME
								      : ST_HOME_HOST;
	for (size_t mi = 0; mi < ST_ARRAY_LEN(models); mi++) {
		for (int accum = 2; accum <= 3; accum++) {
			model_config(&c, models[mi]);
			c.params = ST_OFFLOAD_NONE;
			c.optim = ST_OFFLOAD_HOST;
			c.train.grad_accum = accum;
			train(&c, STEPS, &ref);
			for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
				char what[320];
				struct st_engine *e;

				/* N = 2 in the first and last cases only: N = 3 is
				 * where a fold order could differ */
				if (accum == 2 && i != 0 && i + 1 != ST_ARRAY_LEN(cases))
					continue;
				model_config(&c, models[mi]);
				c.train.grad_accum = accum;
				c.schedule = ST_SCHEDULE_LAYER_FIRST;
				c.params = cases[i].params;
				c.optim = cases[i].optim;
				c.prefetch = cases[i].prefetch;
				c.homes = cases[i].split ? homes : NULL;
				assert_int_equal(st_engine_create(&c, &e), 0);
				assert_int_equal(st_engine_plan(e)->schedule, ST_SCHEDULE_LAYER_FIRST);
				st_engine_destroy(e);
				snprintf(what, sizeof(what), "%s (%s, N = %d)", cases[i].name,
					 models[mi], accum);
				train_same(&c, cases[i].threads, &ref, what);
			}
			run_free(&ref);
		}
	}
	/* checkpoints on the host: the N micro-batches' block of each of 3 of
	 * the 5 boundaries goes there and back, W and the optimizer in vram
	 * and on nvme, GPT-2 and LLaMA */
	for (int mi = 0; mi < 2; mi++) {
		const char *m = mi ? "llama:layers=4,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,"
				     "ctx=64,tied=1"
				   : "layers=4,dim=64,heads=2,vocab=256,ctx=64";

		model_config(&c, m);
		c.train.grad_accum = 3;
		c.activations = ST_OFFLOAD_NONE;
		train(&c, STEPS, &ref);
		for (int p = 0; p < 2; p++) {
			struct st_engine *e;

			model_config(&c, m);
			c.train.grad_accum = 3;
			c.schedule = ST_SCHEDULE_LAYER_FIRST;
			c.activations = ST_OFFLOAD_HOST;
			c.params = p ? ST_OFFLOAD_NVME : ST_OFFLOAD_NONE;
			c.optim = p ? ST_OFFLOAD_NVME : ST_OFFLOAD_HOST;
			assert_int_equal(st_engine_create(&c, &e), 0);
			assert_int_equal(st_engine_plan(e)->act_offloaded, 3);
			st_engine_destroy(e);
			train_same(&c, p ? 2 : 1, &ref, p ? "layer-first: checkpoints on the host, nvme"
							: "layer-first: checkpoints on the host");
		}
		run_free(&ref);
	}
	/* kept forwards: each of the N micro-batches' (--recompute none, and
	 * auto with room for two of the three at N = 3), W in vram and on
	 * nvme, GPT-2 and LLaMA */
	for (int mi = 0; mi < 2; mi++) {
		const char *m = mi ? models[1] : models[0];

		model_config(&c, m);
		c.train.grad_accum = 3;
		train(&c, STEPS, &ref);
		for (int k = 0; k < 3; k++) {
			struct st_engine *e;
			uint64_t vram;

			model_config(&c, m);
			c.train.grad_accum = 3;
			c.schedule = ST_SCHEDULE_LAYER_FIRST;
			c.recompute = ST_RECOMPUTE_NONE;
			c.params = k == 1 ? ST_OFFLOAD_NVME : ST_OFFLOAD_NONE;
			c.optim = k == 1 ? ST_OFFLOAD_NVME : ST_OFFLOAD_HOST;
			assert_int_equal(st_engine_create(&c, &e), 0);
			assert_int_equal(st_engine_plan(e)->n_keep, 2);
			vram = st_engine_plan(e)->total_bytes[ST_HOME_VRAM];
			if (k == 2) { /* auto: none's vram keeps both, one unit's
					 N extents less keeps fewer */
				uint64_t each = 3 * st_align_up(st_engine_plan(e)->saved_each_bytes,
								4096);

				c.recompute = ST_RECOMPUTE_AUTO;
				c.gpu_mem_bytes = vram;
				st_engine_destroy(e);
				assert_int_equal(st_engine_create(&c, &e), 0);
				assert_int_equal(st_engine_plan(e)->n_keep, 2);
				st_engine_destroy(e);
				c.gpu_mem_bytes = vram - each;
				assert_int_equal(st_engine_create(&c, &e), 0);
				assert_true(st_engine_plan(e)->n_keep < 2);
			}
			st_engine_destroy(e);
			train_same(&c, 0, &ref, k == 2 ? "layer-first: recompute auto, fewer keep"
					       : k ? "layer-first: recompute none, nvme"
						   : "layer-first: recompute none");
		}
		run_free(&ref);
	}
	/* the bf16 compute path (W copied as bf16, dW fp32) */
	base_config(&c);
	c.train.grad_accum = 3;
	c.compute_dtype = ST_PRECISION_BF16;
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	train(&c, STEPS, &ref);
	c.schedule = ST_SCHEDULE_LAYER_FIRST;
	train_same(&c, 2, &ref, "layer-first: compute bf16, nvme");
	run_free(&ref);
}

/* The bytes each link moves in a layer-first step are the plan's, at N =
 * 1..3 in every uniform row and a split; with W and G on nvme at N = 3
 * the nvme reads are batch-first's less 2 * 2 W fetches and 2 G reads,
 * the writes less 2 G writes, the copies less 2 * 2 W h2d and 2 dW d2h:
 * the schedule's saving, exactly. */
static void test_layer_first_traffic(void **state)
{
	static const enum st_offload cases[][2] = {
		{ ST_OFFLOAD_NVME, ST_OFFLOAD_NVME }, { ST_OFFLOAD_HOST, ST_OFFLOAD_HOST },
		{ ST_OFFLOAD_NONE, ST_OFFLOAD_NVME }, { ST_OFFLOAD_HOST, ST_OFFLOAD_NVME },
		{ ST_OFFLOAD_NONE, ST_OFFLOAD_VRAM },
	};
	uint64_t bf[ST_LANE_COUNT] = { 0 }, lf[ST_LANE_COUNT] = { 0 };

	(void)state;
	/* checkpoints on the host: 3 of 5 boundaries' blocks there and back */
	for (size_t i = 0; i < ST_ARRAY_LEN(cases) - 1; i++)
		for (int accum = 1; accum <= 3; accum += 2) {
			struct st_engine_config c;
			struct st_engine *e;
			struct st_dataset *ds;
			struct st_engine_stats st;
			char what[80];

			model_config(&c, "layers=4,dim=64,heads=2,vocab=256,ctx=64");
			c.params = cases[i][0];
			c.optim = cases[i][1];
			c.train.grad_accum = accum;
			c.activations = ST_OFFLOAD_HOST;
			c.schedule = ST_SCHEDULE_LAYER_FIRST;
			snprintf(what, sizeof(what),
				 "layer-first, checkpoints on the host, case %zu accum %d", i, accum);
			step_moves_plan(&c, what, &e, &ds, &st);
			assert_int_equal(st_engine_plan(e)->act_offloaded, 3);
			st_engine_destroy(e);
			st_dataset_close(ds);
		}
	for (size_t i = 0; i <= ST_ARRAY_LEN(cases); i++)
		for (int accum = 1; accum <= 3; accum++)
			for (int sched = 0; sched < 2; sched++) {
				struct st_engine_config c;
				struct st_engine *e;
				struct st_dataset *ds;
				struct st_engine_stats st;
				const struct st_plan *p;
				char what[64];

				base_config(&c);
				c.train.grad_accum = accum;
				if (i < ST_ARRAY_LEN(cases)) {
					c.params = cases[i][0];
					c.optim = cases[i][1];
				} else {
					split_budgets(&c, 0);
				}
				c.schedule = sched ? ST_SCHEDULE_LAYER_FIRST : ST_SCHEDULE_BATCH_FIRST;
				snprintf(what, sizeof(what), "%s case %zu accum %d",
					 st_schedule_name(c.schedule), i, accum);
				step_moves_plan(&c, what, &e, &ds, &st);
				p = st_engine_plan(e);
				assert_int_equal(p->schedule, c.schedule);
				if (i == 0 && accum == 3)
					memcpy(sched ? lf : bf, st.bytes, sizeof(bf));
				if (i == 0 && accum == 3 && sched) {
					uint64_t w = 0, g = 0, wf = 0;
					const struct st_model *m = st_engine_model(e);
					int U = st_model_unit_count(m);

					/* W fetched per pass: U-1 forward, U-1 backward
					 * (GPT-2's embedding kept, the head once) */
					for (int u = 0; u < U; u++) {
						uint64_t el = st_model_unit_layout(m, u)->elems;
						int fetches = (u < U - 1) +
							      !(st_model_unit_layout(m, u)->resident &&
								u < U - 1);

						w += 2 * el * (uint64_t)fetches;
						g += el * 4;
						wf += el * 2;
					}
					(void)wf;
					assert_int_equal(bf[ST_LANE_NVME_READ] - lf[ST_LANE_NVME_READ],
							 2 * w + 2 * g);
					assert_int_equal(bf[ST_LANE_NVME_WRITE] - lf[ST_LANE_NVME_WRITE],
							 2 * g);
					assert_int_equal(bf[ST_LANE_H2D] - lf[ST_LANE_H2D], 2 * w);
					assert_int_equal(bf[ST_LANE_D2H] - lf[ST_LANE_D2H], 2 * g);
				}
				st_engine_destroy(e);
				st_dataset_close(ds);
			}
}

/* A layer-first run saved after its third step, which had begun the
 * fourth (its N micro-batches drawn, their forwards run in the sweep, as
 * in a run told to stop then), resumes into a batch-first engine of
 * another placement and ends where 6 batch-first steps straight end; and
 * the other way round. */
static void test_layer_first_resume(void **state)
{
	(void)state;
	for (int dir_lf = 0; dir_lf < 2; dir_lf++) {
		struct st_engine_config c;
		struct run straight, resumed;
		struct st_engine *e;
		struct st_dataset *ds;
		struct st_loader ld;
		struct st_step_result res;
		char ck[4200], *cfg = NULL;
		uint64_t step;

		base_config(&c);
		c.train.grad_accum = 3;
		c.params = ST_OFFLOAD_NVME;
		c.optim = ST_OFFLOAD_NVME;
		train(&c, 6, &straight);
		c.schedule = dir_lf ? ST_SCHEDULE_BATCH_FIRST : ST_SCHEDULE_LAYER_FIRST;
		snprintf(ck, sizeof(ck), "%s/ck-lf%d", dir, dir_lf);
		open_loader(&ds, &ld, &c);
		assert_int_equal(st_engine_create(&c, &e), 0);
		for (int s = 0; s < 3; s++) {
			assert_int_equal(st_engine_step(e, &ld, s, true, &res), 0);
			resumed.loss[s] = res.loss;
			resumed.norm[s] = res.grad_norm;
		}
		if (st_engine_save(e, ck, 3, st_engine_step_end_cursor(e), "{}", 2))
			fail_msg("save: %s", st_error_last());
		st_engine_destroy(e);
		st_dataset_close(ds);
		c.schedule = dir_lf ? ST_SCHEDULE_LAYER_FIRST : ST_SCHEDULE_BATCH_FIRST;
		c.params = ST_OFFLOAD_HOST;
		c.optim = ST_OFFLOAD_HOST;
		open_loader(&ds, &ld, &c);
		assert_int_equal(st_engine_create(&c, &e), 0);
		if (st_engine_resume(e, ck, &step, &ld.cur, &cfg))
			fail_msg("resume: %s", st_error_last());
		free(cfg);
		assert_int_equal(step, 3);
		assert_int_equal(st_loader_seek(&ld, &ld.cur), 0);
		for (int s = 3; s < 6; s++) {
			assert_int_equal(st_engine_step(e, &ld, s, s < 5, &res), 0);
			resumed.loss[s] = res.loss;
			resumed.norm[s] = res.grad_norm;
		}
		collect(e, &resumed);
		st_engine_destroy(e);
		st_dataset_close(ds);
		same(&straight, &resumed, 6, dir_lf ? "batch-first saved, layer-first resumed"
						    : "layer-first saved (stopped), batch-first resumed");
		run_free(&straight);
		run_free(&resumed);
	}
}

/* What layer-first does not do is refused with one line naming it; a vram
 * budget that cannot hold N micro-batches' checkpoints is refused with the
 * minimum and what to raise; auto takes layer-first where it cuts the
 * step and batch-first where it cannot run. */
static void test_layer_first_refusals(void **state)
{
	struct st_engine_config c;
	struct st_engine *e;
	struct st_model *m;
	struct st_plan p;
	uint64_t vmin, bf_vram;
	char want[64];

	(void)state;
	{
		struct st_plan_input in = { .batch = 4, .seq = 32, .grad_accum = 4,
					    .gpu_mem_bytes = 64ull << 20,
					    .host_mem_bytes = 64ull << 20, .world = 2, .zero = 1,
					    .schedule = ST_SCHEDULE_LAYER_FIRST };

		base_config(&c);
		assert_int_equal(st_model_create(&c.train.model, &m), 0);
		in.model = m;
		/* at world 2 its vram has a third dW (the micro-batch's, sent
		 * to the ranks) */
		assert_int_equal(st_plan_make(&in, &p), 0);
		assert_int_equal(p.schedule, ST_SCHEDULE_LAYER_FIRST);
		for (int i = 0; i < p.n_pools; i++)
			if (p.pools[i].id == ST_POOL_DW)
				assert_int_equal(p.pools[i].count, 3);
		st_plan_fini(&p);
		in.schedule = ST_SCHEDULE_AUTO;
		/* auto with W and G on nvme at N = 4: layer-first, a quarter of
		 * the W reads; at N = 1 batch-first */
		in.world = 1;
		in.zero = 0;
		in.have_nvme = true;
		in.params = ST_OFFLOAD_NVME;
		in.optim = ST_OFFLOAD_NVME;
		assert_int_equal(st_plan_make(&in, &p), 0);
		assert_int_equal(p.schedule, ST_SCHEDULE_LAYER_FIRST);
		st_plan_fini(&p);
		in.grad_accum = 1;
		assert_int_equal(st_plan_make(&in, &p), 0);
		assert_int_equal(p.schedule, ST_SCHEDULE_BATCH_FIRST);
		st_plan_fini(&p);
		st_model_destroy(m);
	}
	/* the vram minimum of layer-first at N = 4: one page under it is
	 * refused with it and what to raise, it is accepted, and batch-first
	 * needs less */
	base_config(&c);
	c.train.grad_accum = 4;
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	assert_int_equal(st_engine_create(&c, &e), 0);
	bf_vram = st_engine_plan(e)->min_bytes[ST_HOME_VRAM];
	st_engine_destroy(e);
	c.schedule = ST_SCHEDULE_LAYER_FIRST;
	assert_int_equal(st_engine_create(&c, &e), 0);
	vmin = st_engine_plan(e)->min_bytes[ST_HOME_VRAM];
	st_engine_destroy(e);
	assert_true(vmin > bf_vram);
	c.gpu_mem_bytes = vmin - 4096;
	assert_int_equal(st_engine_create(&c, &e), -ENOSPC);
	st_format_bytes(vmin, want, sizeof(want));
	if (!strstr(st_error_last(), want) || !strstr(st_error_last(), "--gpu-mem") ||
	    !strstr(st_error_last(), "layer-first"))
		fail_msg("message '%s' lacks the minimum %s or what to raise", st_error_last(),
			 want);
	c.gpu_mem_bytes = vmin;
	assert_int_equal(st_engine_create(&c, &e), 0);
	st_engine_destroy(e);
	/* auto at that budget: batch-first fits too, layer-first is faster */
	c.schedule = ST_SCHEDULE_AUTO;
	c.gpu_mem_bytes = vmin - 4096;
	assert_int_equal(st_engine_create(&c, &e), 0);
	assert_int_equal(st_engine_plan(e)->schedule, ST_SCHEDULE_BATCH_FIRST);
	st_engine_destroy(e);
}

static int setup(void **state)
{
	const char *base = getenv("ST_TEST_DIR");
	FILE *f;
	uint64_t x = 99;

	(void)state;
	snprintf(dir, sizeof(dir), "%s/engine-test.XXXXXX", base && *base ? base : "/var/tmp");
	if (!mkdtemp(dir))
		return -1;
	snprintf(data_path, sizeof(data_path), "%s/data.txt", dir);
	f = fopen(data_path, "w");
	for (int i = 0; i < 20000; i++) {
		static const char *w[] = { "the ", "tiered ", "engine ", "streams ", "units ",
					   "to ", "a ", "device ", "and ", "back. " };

		x = x * 6364136223846793005ull + 1442695040888963407ull;
		fputs(w[(x >> 33) % 10], f);
	}
	fclose(f);
	return 0;
}

static int teardown(void **state)
{
	char cmd[4200];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* cpu-strict (docs/gpu.md, "Strict mode") changes what the host may
 * touch, never a bit: GPT-2 and LLaMA, fp32 and bf16 compute, every home
 * of W and of the optimizer state, the checkpoints on the host, against
 * the plain cpu device. Runs under --device cpu-strict. */
/* --update in-backward: each unit's AdamW in the backward, P, M, V to the
 * alternate extents, committed when the norm says the clip did not apply
 * (else the step's forwards and backwards run again: replayed); a step
 * after one the clip applied to updates after the backward. With the
 * clip between the steps' norms some steps hold, some are replayed and
 * some update after (each seen over the cases); a gradient not finite in a
 * lower unit (test_nan_grad_unit) skips a step whose upper units were
 * speculated. Every case: today's losses, norms, P and W bit for bit;
 * GPT-2 and LLaMA, batch-first and layer-first, 1 and 2 threads, W in
 * every home, the bf16 state, small tiles; and each case again with
 * every nvme write landing after the requests submitted behind it. */
static void spec_train(const struct st_engine_config *c, int threads, struct run *r,
		       int *held, int *replayed, int *from_sweep)
{
	const int threads0 = omp_get_max_threads();
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;

	if (threads)
		omp_set_num_threads(threads);
	open_loader(&ds, &ld, c);
	if (st_engine_create(c, &e))
		fail_msg("engine: %s", st_error_last());
	*held = *replayed = *from_sweep = 0;
	for (int s = 0, swept = 0; s < 5; s++) {
		struct st_step_result res;

		if (st_engine_step(e, &ld, s, s + 1 < 5, &res))
			fail_msg("step %d: %s", s, st_error_last());
		r->loss[s] = res.loss;
		r->norm[s] = res.grad_norm;
		*held += res.in_backward;
		*replayed += res.replayed;
		/* the last step's sweep drew this one's first batch */
		*from_sweep += res.replayed && swept;
		swept = !res.in_backward && !res.skipped;
		assert_false(res.in_backward && (res.skipped || c->update == ST_UPDATE_AFTER));
		assert_true(!res.replayed || res.in_backward);
	}
	collect(e, r);
	st_engine_destroy(e);
	st_dataset_close(ds);
	omp_set_num_threads(threads0);
}

static void test_update_in_backward(void **state)
{
	static const char *const models[] = {
		"layers=2,dim=64,heads=2,vocab=256,ctx=64",
		"llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,tied=1",
	};
	static const struct {
		const char *name;
		enum st_offload params;
		int accum, threads, nan_unit;
		bool layer_first, bf16_state, small_tiles, bf16_compute;
	} cases[] = {
		{ "W on nvme, N = 1, 2 threads", ST_OFFLOAD_NVME, 1, 2, 0, false, false, false, false },
		{ "W in host, N = 2, 1 thread", ST_OFFLOAD_HOST, 2, 1, 0, false, false, true, false },
		{ "W in vram, layer-first N = 2", ST_OFFLOAD_NONE, 2, 0, 0, true, false, false, false },
		{ "W on nvme, bf16 state, small tiles", ST_OFFLOAD_NVME, 1, 0, 0, false, true, true,
		  false },
		{ "W in host, bf16 compute, layer-first N = 3", ST_OFFLOAD_HOST, 3, 2, 0, true, false,
		  false, true },
		{ "a NaN gradient in unit 1 at step 2", ST_OFFLOAD_NVME, 1, 0, 2, false, false, true,
		  false },
	};
	struct st_engine_config c;
	struct st_engine *e;
	int ways[3] = { 0, 0, 0 }; /* steps held first, replayed, updated after */

	(void)state;
	for (size_t mi = 0; mi < ST_ARRAY_LEN(models); mi++)
		for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
			struct run ref, r;
			double norms[5], clip;
			char what[256];
			int held, held_ref, replayed, from_sweep;

			model_config(&c, models[mi]);
			c.params = cases[i].params;
			c.optim = ST_OFFLOAD_NVME;
			c.train.grad_accum = cases[i].accum;
			c.schedule = cases[i].layer_first ? ST_SCHEDULE_LAYER_FIRST
							  : ST_SCHEDULE_BATCH_FIRST;
			c.optim_state = cases[i].bf16_state ? ST_OPTIM_STATE_BF16
							    : ST_OPTIM_STATE_F32;
			c.update_tile_elems = cases[i].small_tiles ? 4096 : 0;
			c.compute_dtype = cases[i].bf16_compute ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
			c.test_nan_grad_unit = cases[i].nan_unit;
			c.test_nan_grad_step = 2;
			/* the clip between the steps' norms: some hold, some run again */
			c.train.clip = 0;
			spec_train(&c, cases[i].threads, &ref, &held_ref, &replayed, &from_sweep);
			memcpy(norms, ref.norm, sizeof(norms));
			run_free(&ref);
			for (int a = 0; a < 5; a++)
				for (int b = a + 1; b < 5; b++)
					if (norms[b] < norms[a]) {
						double t = norms[a];

						norms[a] = norms[b];
						norms[b] = t;
					}
			clip = (norms[1] + norms[2]) / 2;
			/* step 2's NaN: the others hold, without a clip */
			if (cases[i].nan_unit)
				clip = 0;
			c.train.clip = (float)clip;
			spec_train(&c, cases[i].threads, &ref, &held_ref, &replayed, &from_sweep);
			assert_int_equal(held_ref, 0);
			c.update = ST_UPDATE_IN_BACKWARD;
			snprintf(what, sizeof(what), "in-backward: %s (%s)", cases[i].name,
				 models[mi]);
			spec_train(&c, cases[i].threads, &r, &held, &replayed, &from_sweep);
			same(&ref, &r, 5, what);
			if (held < 1 || held - replayed > (cases[i].nan_unit ? 4 : 3))
				fail_msg("%s: %d of 5 steps held (clip %g), %d of them replayed", what,
					 held, clip, replayed);
			if (!cases[i].nan_unit) {
				ways[0] += held - replayed;
				ways[1] += replayed;
				ways[2] += 5 - held;
			}
			assert_true(!cases[i].nan_unit || isnan(r.norm[2]));
			run_free(&r);
			/* every nvme write lands only once the engine waits on
			 * nothing else (ST_FAULT_WRITE_LAST): a load that does
			 * not wait for the last store of its range reads the
			 * older bytes, as a drive that reorders its queue may
			 * give them (the sweep's stores of a step that redid
			 * it, before a speculation's loads) */
			c.nvme_fault = (struct st_fault_config){ .kind = ST_FAULT_WRITE_LAST, .nth = 1,
								 .every = 1 };
			snprintf(what, sizeof(what), "in-backward, writes last: %s (%s)",
				 cases[i].name, models[mi]);
			spec_train(&c, cases[i].threads, &r, &held, &replayed, &from_sweep);
			same(&ref, &r, 5, what);
			run_free(&ref);
			run_free(&r);
		}
	if (!ways[0] || !ways[1] || !ways[2])
		fail_msg("of the steps with a clip: %d held, %d replayed, %d updated after",
			 ways[0], ways[1], ways[2]);
	/* a clip that applies to every step: step 0 is replayed, the next
	 * ones update after, but step 2, made to speculate
	 * (test_speculate_step), is replayed from the first batch that step
	 * 1's sweep drew; batch-first at N = 1 and 2, and layer-first */
	for (int k = 0; k < 6; k++) {
		struct run ref, r;
		char what[128];
		int held, replayed, from_sweep;

		model_config(&c, models[k / 3]);
		c.params = ST_OFFLOAD_NVME;
		c.optim = ST_OFFLOAD_NVME;
		c.train.clip = 1e-3f;
		c.train.grad_accum = k % 3 ? 2 : 1;
		c.schedule = k % 3 == 2 ? ST_SCHEDULE_LAYER_FIRST : ST_SCHEDULE_BATCH_FIRST;
		spec_train(&c, 0, &ref, &held, &replayed, &from_sweep);
		c.update = ST_UPDATE_IN_BACKWARD;
		c.test_speculate_step = 2;
		snprintf(what, sizeof(what), "in-backward, clip always, %s N = %d (%s)",
			 k % 3 == 2 ? "layer-first" : "batch-first", c.train.grad_accum, models[k / 3]);
		spec_train(&c, 0, &r, &held, &replayed, &from_sweep);
		same(&ref, &r, 5, what);
		if (held != 2 || replayed != 2 || from_sweep != 1)
			fail_msg("%s: %d held, %d replayed, %d from the sweep's batch (2, 2, 1)", what,
				 held, replayed, from_sweep);
		run_free(&ref);
		run_free(&r);
	}
	/* a step whose speculation holds moves the plan's bytes, batch-first
	 * at N = 1 and 2 (asked) and layer-first (auto takes it with every
	 * P, M, V on nvme, predicted faster here, and leaves it with them in
	 * host); the alternates are on nvme's total. It reads G back from
	 * nvme for no update, nor writes it there, with a clip (one that
	 * does not apply) or without: the update after the backward's step
	 * reads and writes every unit's G once more. */
	for (int k = 0; k < 6; k++) {
		static const char *const what[] = { "in-backward, N = 1", "in-backward, N = 2",
						    "in-backward, layer-first" };
		bool lf = k % 3 == 2, clip = k >= 3;
		struct st_dataset *ds;
		struct st_engine_stats st, st_after;
		const struct st_plan *p;
		uint64_t alt = 0, g = 0;

		model_config(&c, models[lf]);
		c.params = ST_OFFLOAD_NVME;
		c.optim = ST_OFFLOAD_NVME;
		c.train.clip = clip ? 1e9f : 0;
		c.train.grad_accum = k % 3 ? 2 : 1;
		c.schedule = lf ? ST_SCHEDULE_LAYER_FIRST : ST_SCHEDULE_BATCH_FIRST;
		c.update = ST_UPDATE_AFTER;
		step_moves_plan(&c, "the update after", &e, &ds, &st_after);
		st_engine_destroy(e);
		st_dataset_close(ds);
		c.update = lf ? ST_UPDATE_AUTO : ST_UPDATE_IN_BACKWARD;
		step_moves_plan(&c, what[k % 3], &e, &ds, &st);
		p = st_engine_plan(e);
		assert_true(p->in_backward);
		for (int i = 0; i < p->units * ST_STATE_COUNT; i++)
			alt += i % ST_STATE_COUNT >= ST_STATE_P ? p->state_bytes[i] : 0;
		assert_int_equal(p->alt_bytes, alt);
		for (int u = 0; u < p->units; u++)
			g += p->slice_elems[u] * sizeof(float);
		if (st_after.bytes[ST_LANE_NVME_READ] - st.bytes[ST_LANE_NVME_READ] != g ||
		    st_after.bytes[ST_LANE_NVME_WRITE] - st.bytes[ST_LANE_NVME_WRITE] != g)
			fail_msg("%s, clip %d: nvme r %llu w %llu, the update after r %llu w %llu "
				 "(G %llu)", what[k % 3], clip, (unsigned long long)st.bytes[ST_LANE_NVME_READ],
				 (unsigned long long)st.bytes[ST_LANE_NVME_WRITE],
				 (unsigned long long)st_after.bytes[ST_LANE_NVME_READ],
				 (unsigned long long)st_after.bytes[ST_LANE_NVME_WRITE],
				 (unsigned long long)g);
		st_engine_destroy(e);
		st_dataset_close(ds);
		c.optim = ST_OFFLOAD_HOST;
		c.update = ST_UPDATE_AUTO;
		assert_int_equal(st_engine_create(&c, &e), 0);
		assert_false(st_engine_plan(e)->in_backward);
		assert_int_equal(st_engine_plan(e)->alt_bytes, 0);
		st_engine_destroy(e);
	}
	/* refused: a P not on nvme, the q8 state */
	model_config(&c, models[0]);
	c.update = ST_UPDATE_IN_BACKWARD;
	c.optim = ST_OFFLOAD_HOST;
	assert_int_equal(st_engine_create(&c, &e), -EINVAL);
	assert_non_null(strstr(st_error_last(), "needs P, M and V on nvme"));
	c.optim = ST_OFFLOAD_NVME;
	c.optim_state = ST_OPTIM_STATE_Q8;
	assert_int_equal(st_engine_create(&c, &e), -EINVAL);
	assert_non_null(strstr(st_error_last(), "not with --optim-state q8"));
}

static void test_strict_same_bits(void **state)
{
	static const struct {
		const char *model; /* NULL: base_config's GPT-2 */
		enum st_offload params, optim, act;
		bool bf16;
	} cases[] = {
		{ NULL, ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, ST_OFFLOAD_AUTO, false },
		{ NULL, ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, ST_OFFLOAD_AUTO, false },
		{ NULL, ST_OFFLOAD_NONE, ST_OFFLOAD_VRAM, ST_OFFLOAD_AUTO, false },
		{ NULL, ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, true },
		{ "llama", ST_OFFLOAD_NVME, ST_OFFLOAD_HOST, ST_OFFLOAD_AUTO, true },
		{ "llama", ST_OFFLOAD_NONE, ST_OFFLOAD_VRAM, ST_OFFLOAD_HOST, false },
	};

	(void)state;
	assert_string_equal(device, "cpu-strict");
	for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
		struct st_engine_config c;
		struct run strict, cpu;

		if (cases[i].model) /* bf16: a head size the cuda compute runs */
			model_config(&c, cases[i].bf16 ? llama_bf16_models[1] : llama_models[0]);
		else
			base_config(&c);
		c.params = cases[i].params;
		c.optim = cases[i].optim;
		c.activations = cases[i].act;
		if (cases[i].bf16)
			c.compute_dtype = ST_PRECISION_BF16;
		train(&c, STEPS, &strict);
		c.device = "cpu";
		train(&c, STEPS, &cpu);
		for (int s = 0; s < STEPS; s++)
			if (memcmp(&strict.loss[s], &cpu.loss[s], sizeof(double)) ||
			    memcmp(&strict.norm[s], &cpu.norm[s], sizeof(double)))
				fail_msg("case %zu step %d: cpu-strict loss %.9g norm %.9g, cpu %.9g %.9g",
					 i, s, strict.loss[s], strict.norm[s], cpu.loss[s], cpu.norm[s]);
		if (memcmp(strict.P, cpu.P, cpu.n * sizeof(float)) ||
		    memcmp(strict.W, cpu.W, cpu.n * sizeof(float)))
			fail_msg("case %zu: the weights differ between cpu-strict and cpu", i);
		run_free(&strict);
		run_free(&cpu);
	}
}

/* The same training on the cuda device and on the cpu: the kernels differ
 * (cuBLASLt's summation order, fused attention blocks), so they agree
 * within float tolerance, not bit for bit: losses and gradient norms to
 * 1e-3 relative, the final master weights to 1e-3 in relative L2 norm of
 * what training moved them. */
static void __attribute__((unused)) test_cuda_close_to_cpu(void **state)
{
	struct st_engine_config c;
	struct run gpu, cpu, init;
	double d2 = 0, m2 = 0;

	(void)state;
	base_config(&c);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	train(&c, STEPS, &gpu);
	c.device = "cpu";
	train(&c, STEPS, &cpu);
	train(&c, 0, &init);
	for (int s = 0; s < STEPS; s++) {
		if (!(fabs(gpu.loss[s] - cpu.loss[s]) <= 1e-3 * fabs(cpu.loss[s])) ||
		    !(fabs(gpu.norm[s] - cpu.norm[s]) <= 1e-3 * fabs(cpu.norm[s])))
			fail_msg("step %d: cuda loss %.9g norm %.9g, cpu %.9g %.9g", s, gpu.loss[s],
				 gpu.norm[s], cpu.loss[s], cpu.norm[s]);
	}
	for (size_t i = 0; i < cpu.n; i++) {
		d2 += ((double)gpu.P[i] - cpu.P[i]) * ((double)gpu.P[i] - cpu.P[i]);
		m2 += ((double)cpu.P[i] - init.P[i]) * ((double)cpu.P[i] - init.P[i]);
	}
	if (!(sqrt(d2) <= 1e-3 * sqrt(m2)))
		fail_msg("master weights: |cuda - cpu| = %.3g, |cpu - init| = %.3g", sqrt(d2),
			 sqrt(m2));
	run_free(&gpu);
	run_free(&cpu);
	run_free(&init);
}

/* The optimizer on the device moves nothing over a link on any device
 * (the cpu run is in test_traffic_matches_plan too; this one also runs
 * with --device cuda): two steps, the fused next forward between them. */
static void test_device_optim_traffic(void **state)
{
	struct st_engine_config c;
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_step_result res;
	struct st_engine_stats st;

	(void)state;
	base_config(&c);
	c.params = ST_OFFLOAD_NONE;
	c.optim = ST_OFFLOAD_VRAM;
	c.train.grad_accum = 2;
	open_loader(&ds, &ld, &c);
	assert_int_equal(st_engine_create(&c, &e), 0);
	assert_int_equal(st_engine_plan(e)->optim_home, ST_HOME_VRAM);
	for (int s = 0; s < 2; s++) {
		assert_int_equal(st_engine_step(e, &ld, s, s == 0, &res), 0);
		assert_false(res.skipped);
		assert_true(isfinite(res.loss) && isfinite(res.grad_norm) && res.grad_norm > 0);
		st_engine_get_stats(e, &st);
		for (int l = 0; l < ST_LANE_COUNT; l++)
			if (st.bytes[l])
				fail_msg("step %d: %llu bytes on the %s lane", s,
					 (unsigned long long)st.bytes[l], st_lane_name((enum st_lane)l));
	}
	st_engine_destroy(e);
	st_dataset_close(ds);
}

/* A gradient that is not finite (a NaN in W) on the device path as on the
 * host's: the norm is NaN, the step skipped, P, M, V untouched, and the
 * same states either way. */
static void test_nonfinite_device(void **state)
{
	enum st_offload optim[2] = { ST_OFFLOAD_HOST, ST_OFFLOAD_VRAM };
	float *p[2] = { NULL, NULL }, *m[2] = { NULL, NULL };
	uint64_t n = 0;

	(void)state;
	for (int k = 0; k < 2; k++) {
		struct st_engine_config c;
		struct st_engine *e;
		struct st_dataset *ds;
		struct st_loader ld;
		struct st_step_result res;
		const struct st_unit_layout *ul;

		base_config(&c);
		c.params = ST_OFFLOAD_NONE;
		c.optim = optim[k];
		open_loader(&ds, &ld, &c);
		assert_int_equal(st_engine_create(&c, &e), 0);
		assert_int_equal(st_engine_step(e, &ld, 0, true, &res), 0);
		assert_false(res.skipped);
		ul = st_model_unit_layout(st_engine_model(e), 1);
		n = ul->elems;
		p[k] = malloc(n * sizeof(float));
		m[k] = malloc(n * sizeof(float));
		assert_true(p[k] && m[k]);
		assert_int_equal(st_engine_read_state(e, 1, ST_STATE_P, p[k]), 0);
		assert_int_equal(st_engine_read_state(e, 1, ST_STATE_M, m[k]), 0);
		p[k][ul->tensors[1].offset_elems + 3] = NAN;
		assert_int_equal(st_engine_write_state(e, 1, p[k], m[k], NULL), 0);
		assert_int_equal(st_engine_step(e, &ld, 1, false, &res), 0);
		assert_true(res.skipped);
		assert_true(isnan(res.grad_norm));
		assert_int_equal(st_engine_read_state(e, 1, ST_STATE_M, p[k]), 0);
		if (memcmp(p[k], m[k], n * sizeof(float)))
			fail_msg("optim %d: M changed by a skipped step", k);
		assert_int_equal(st_engine_read_state(e, 1, ST_STATE_P, p[k]), 0);
		st_engine_destroy(e);
		st_dataset_close(ds);
	}
	if (memcmp(p[0], p[1], n * sizeof(float)) != 0)
		fail_msg("the skipped step's P differs between the host and the device optimizer");
	for (int k = 0; k < 2; k++) {
		free(p[k]);
		free(m[k]);
	}
}

int main(int argc, char **argv)
{
#ifdef ST_HAVE_CUDA
	const struct CMUnitTest cuda_tests[] = {
		cmocka_unit_test(test_placement_invariance),
		cmocka_unit_test(test_cuda_close_to_cpu),
		cmocka_unit_test(test_resume),
		cmocka_unit_test(test_llama_placement),
		cmocka_unit_test(test_llama_bf16),
		cmocka_unit_test(test_act_host),
		cmocka_unit_test(test_recompute_invariance),
		cmocka_unit_test(test_device_optim_traffic),
		cmocka_unit_test(test_layer_first_invariance),
		cmocka_unit_test(test_layer_first_traffic),
	};
#endif
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_placement_invariance),
		cmocka_unit_test(test_untied_head),
		cmocka_unit_test(test_llama_placement),
		cmocka_unit_test(test_llama_bf16),
		cmocka_unit_test(test_llama_resume),
		cmocka_unit_test(test_act_host),
		cmocka_unit_test(test_act_long),
		cmocka_unit_test(test_recompute_invariance),
		cmocka_unit_test(test_budgets),
		cmocka_unit_test(test_matches_reference_trainer),
		cmocka_unit_test(test_traffic_matches_plan),
		cmocka_unit_test(test_resume),
		cmocka_unit_test(test_nvme_fault),
		cmocka_unit_test(test_update_loads_land_first),
		cmocka_unit_test(test_nvme_checksums),
		cmocka_unit_test(test_nvme_checksums_fault_tier),
		cmocka_unit_test(test_nonfinite_save),
		cmocka_unit_test(test_nonfinite_device),
		cmocka_unit_test(test_update_in_backward),
		cmocka_unit_test(test_device_optim_traffic),
		cmocka_unit_test(test_grad_accum),
		cmocka_unit_test(test_layer_first_invariance),
		cmocka_unit_test(test_layer_first_refusals),
		cmocka_unit_test(test_layer_first_traffic),
		cmocka_unit_test(test_layer_first_resume),
	};
	/* cpu-strict: every test above, and the bits against plain cpu */
	const struct CMUnitTest strict_tests[] = {
		cmocka_unit_test(test_strict_same_bits),
	};

	if (argc == 3 && strcmp(argv[1], "--device") == 0) {
		device = argv[2];
	} else if (argc != 1) {
		fprintf(stderr, "usage: test_engine [--device cpu|cpu-strict|cuda]\n");
		return 2;
	}
	/* ST_TEST_FILTER=PATTERN: only the tests whose name matches (a
	 * cmocka glob, e.g. '*layer_first*') */
	if (getenv("ST_TEST_FILTER"))
		cmocka_set_test_filter(getenv("ST_TEST_FILTER"));
	if (strcmp(device, "cuda") == 0) {
#ifdef ST_HAVE_CUDA
		if (!st_cuda_available()) {
			fprintf(stderr, "SKIP: no usable GPU\n");
			return 77;
		}
		return cmocka_run_group_tests(cuda_tests, setup, teardown);
#else
		fprintf(stderr, "SKIP: this build has no cuda device\n");
		return 77;
#endif
	}
	if (strcmp(device, "cpu-strict") == 0) {
		int failed = cmocka_run_group_tests(strict_tests, setup, teardown);

		return failed + cmocka_run_group_tests(tests, setup, teardown);
	}
	if (strcmp(device, "cpu") != 0) {
		fprintf(stderr, "test_engine: unknown device '%s'\n", device);
		return 2;
	}
	return cmocka_run_group_tests(tests, setup, teardown);
}
