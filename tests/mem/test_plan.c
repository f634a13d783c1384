/* The placement planner: placement follows the budgets, forced options are
 * honoured, every tier's minimum is exact (accepted at the minimum, refused
 * 4 KiB below with a message naming tier, budget and minimum), the pools
 * match the formulas of strata/plan.h recomputed here from the model's
 * layouts, auto prefetch is the largest k that fits, traffic and times of a
 * hand-computed case, the JSON carries the same numbers, nvme-bench rates. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/plan.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BIG (64ull * ST_GiB)

/* Doubles equal within eps, or within 1e-12 relative (the same formula in
 * a different order of operations). */
#define assert_double_equal(a, b, eps)                                              \
	do {                                                                        \
		double a_ = (a), b_ = (b);                                          \
		if (!(fabs(a_ - b_) <= (eps) || fabs(a_ - b_) <= 1e-12 * fabs(b_))) \
			fail_msg("%s = %.17g, want %.17g", #a, a_, b_);             \
	} while (0)

static struct st_model *tiny;   /* 4 layers, dim 128 */
static struct st_model *deep;   /* 8 layers, dim 128: W resident > streamed */
static struct st_model *small;  /* 1 layer, dim 64, vocab 64, ctx 32 */

static struct st_model *model_make(const char *text)
{
	struct st_model_config cfg;
	struct st_model *m;

	assert_int_equal(st_model_config_parse(text, &cfg), 0);
	assert_int_equal(st_model_create(&cfg, &m), 0);
	return m;
}

static int setup(void **state)
{
	ST_UNUSED(state);
	tiny = model_make("tiny");
	deep = model_make("layers=8,dim=128,heads=4,vocab=256,ctx=256");
	small = model_make("layers=1,dim=64,heads=1,vocab=64,ctx=32");
	return 0;
}

static int teardown(void **state)
{
	ST_UNUSED(state);
	st_model_destroy(tiny);
	st_model_destroy(deep);
	st_model_destroy(small);
	return 0;
}

static struct st_plan_input input(const struct st_model *m)
{
	return (struct st_plan_input){
		.model = m, .batch = 4, .seq = 64, .grad_accum = 1, .bf16 = true,
		.gpu_mem_bytes = BIG, .host_mem_bytes = BIG, .nvme_mem_bytes = 0,
		.have_nvme = true, .params = ST_OFFLOAD_AUTO, .optim = ST_OFFLOAD_AUTO,
	};
}

/* --- the pools of strata/plan.h, recomputed from the layouts --------------- */

struct ref {
	uint64_t tier[ST_HOME_COUNT];
	uint64_t homes[ST_HOME_COUNT];
	uint64_t slots, slot_bytes, embed_bytes, act, scratch, scalars;
	uint64_t staging, landing, update;
	uint64_t act_host; /* in->activations host: the checkpoint homes */
};

static uint64_t page(uint64_t x)
{
	return (x + 4095) / 4096 * 4096;
}

static void ref_pools(const struct st_plan_input *in, enum st_home w, enum st_home o,
		      int k, struct ref *r)
{
	const struct st_model *m = in->model;
	int U = st_model_unit_count(m);
	uint64_t wb = in->bf16 ? 2 : 4, E = 0, E0 = st_model_unit_layout(m, 0)->elems, E1 = 0;
	uint64_t X = (uint64_t)in->batch * in->seq * st_model_config(m)->dim * 4;
	uint64_t work = 0, BT = (uint64_t)in->batch * in->seq;
	bool streamed = w != ST_HOME_VRAM;

	memset(r, 0, sizeof(*r));
	for (int u = 0; u < U; u++) {
		uint64_t e = st_model_unit_layout(m, u)->elems;

		if (e > E)
			E = e;
		if (u > 0 && e > E1)
			E1 = e; /* wf and dW serve the units after the embedding */
		if (st_model_work_bytes(m, u, in->batch, in->seq) > work)
			work = st_model_work_bytes(m, u, in->batch, in->seq);
		r->homes[w] += e * wb;
		for (int s = 1; s < ST_STATE_COUNT; s++)
			r->homes[o] += e * 4;
	}
	/* An embedding larger than the rest has a slot of its own (fetched
	 * once per micro-batch, kept widened); the k + 1 slots fit the rest. */
	bool embed_slot = streamed && E0 > E1;
	r->slots = streamed ? (uint64_t)k + 1 : 0;
	r->slot_bytes = streamed ? (embed_slot ? E1 : E) * wb : 0;
	r->embed_bytes = embed_slot ? E0 * wb : 0;
	r->act = page((uint64_t)(U - 1) * X);
	if (in->activations == ST_OFFLOAD_HOST) {
		/* A = 2 slots of X (256-rounded) in vram; the other U-1-A on the
		 * host */
		uint64_t xa = (X + 255) / 256 * 256;
		int A = U - 1 < ST_PLAN_ACT_SLOTS ? U - 1 : ST_PLAN_ACT_SLOTS;

		r->act = (uint64_t)A * page(xa);
		r->act_host = (uint64_t)(U - 1 - A) * page(xa);
	}
	/* ten buffers, each its own 4 KiB-rounded extent: wf, wf_embed, dW
	 * twice, dW_embed, dA, dB, work, tokens, targets */
	r->scratch = page(E1 * 4) + page(E0 * 4) + page(E1 * 4) + page(E1 * 4) + page(E0 * 4) +
		     page(X) + page(X) + page(work) + page(BT * 4) + page(BT * 4);
	r->staging = w == ST_HOME_NVME ? ((uint64_t)k + 1) * r->slot_bytes + r->embed_bytes : 0;
	r->landing = E * 4 + (o == ST_HOME_NVME && in->grad_accum > 1 ? E * 4 : 0);
	/* update staging per state: W's when W is not in host, and one fp32
	 * buffer for each of G, P, M, V on nvme; two sets */
	uint64_t tile = E < ST_UPDATE_TILE_ELEMS ? E : ST_UPDATE_TILE_ELEMS;
	r->update = (w != ST_HOME_HOST ? 2 * tile * wb : 0) + (o == ST_HOME_NVME ? 2 * tile * 16 : 0);
	/* and the step scalars: the step's per-token losses (G is not in
	 * vram here, so no sums of squares) */
	r->scalars = page(((uint64_t)in->grad_accum * BT * 4 + 15) / 16 * 16);
	r->tier[ST_HOME_VRAM] = r->homes[ST_HOME_VRAM] + r->slots * r->slot_bytes +
				r->embed_bytes + r->act + r->scratch + r->scalars;
	r->tier[ST_HOME_HOST] = r->homes[ST_HOME_HOST] + r->staging + r->landing + r->update +
				r->act_host;
	r->tier[ST_HOME_NVME] = r->homes[ST_HOME_NVME];
}

static void expect_uniform(const struct st_plan *p, enum st_home w, enum st_home o)
{
	for (int u = 0; u < p->units; u++) {
		assert_int_equal(st_plan_home(p, u, ST_STATE_W), w);
		for (int s = 1; s < ST_STATE_COUNT; s++)
			assert_int_equal(st_plan_home(p, u, (enum st_state)s), o);
	}
	assert_int_equal(p->w_home, w);
	assert_int_equal(p->optim_home, o);
}

static void expect_matches_ref(const struct st_plan *p, const struct st_plan_input *in0)
{
	struct st_plan_input x = *in0, *in = &x;
	struct ref r;

	/* the checkpoints where the plan put them */
	x.activations = p->act_home == ST_HOME_HOST ? ST_OFFLOAD_HOST : ST_OFFLOAD_NONE;
	ref_pools(in, p->w_home, p->optim_home, p->prefetch, &r);
	assert_int_equal(p->act_host_bytes, r.act_host);
	assert_int_equal(p->w_slots, r.slots);
	assert_int_equal(p->w_slot_bytes, r.slot_bytes);
	assert_int_equal(p->embed_slot, r.embed_bytes > 0);
	assert_int_equal(p->embed_slot_bytes, r.embed_bytes);
	assert_int_equal(p->act_bytes, r.act);
	assert_int_equal(p->scratch_bytes, r.scratch);
	assert_int_equal(p->w_staging_bytes, r.staging);
	assert_int_equal(p->grad_landing_bytes, r.landing);
	assert_int_equal(p->update_staging_bytes, r.update);
	for (int t = 0; t < ST_HOME_COUNT; t++) {
		assert_int_equal(p->home_bytes[t], r.homes[t]);
		assert_int_equal(p->total_bytes[t], r.tier[t]);
		assert_true(p->total_bytes[t] <= p->budget_bytes[t]);
	}
	for (int u = 0; u < p->units; u++) {
		uint64_t e = st_model_unit_layout(in->model, u)->elems;

		assert_int_equal(p->state_bytes[u * ST_STATE_COUNT + ST_STATE_W],
				 e * (in->bf16 ? 2 : 4));
		for (int s = 1; s < ST_STATE_COUNT; s++)
			assert_int_equal(p->state_bytes[u * ST_STATE_COUNT + s], e * 4);
	}
}

static struct st_plan plan_ok(const struct st_plan_input *in)
{
	struct st_plan p;
	int ret = st_plan_make(in, &p);

	if (ret != 0)
		fail_msg("st_plan_make: %d %s", ret, st_error_last());
	return p;
}

/* --- placement follows the budgets ------------------------------------------- */

static void test_big_budgets(void **state)
{
	struct st_plan_input in = input(tiny);
	struct st_plan p;

	ST_UNUSED(state);
	p = plan_ok(&in);
	expect_uniform(&p, ST_HOME_VRAM, ST_HOME_HOST);
	expect_matches_ref(&p, &in);
	assert_int_equal(p.units, st_model_unit_count(tiny));
	assert_int_equal(p.prefetch, p.units); /* nothing streamed: every k fits */
	assert_int_equal(p.total_bytes[ST_HOME_NVME], 0);
	assert_int_equal(p.budget_bytes[ST_HOME_NVME], 0); /* unlimited: what it needs */
	st_plan_fini(&p);
	st_plan_fini(&p); /* twice is harmless */
}

static void test_small_vram_streams_w(void **state)
{
	struct st_plan_input in = input(deep);
	struct ref resident;
	struct st_plan p;

	ST_UNUSED(state);
	ref_pools(&in, ST_HOME_VRAM, ST_HOME_HOST, 1, &resident);
	in.gpu_mem_bytes = resident.tier[ST_HOME_VRAM];
	p = plan_ok(&in);
	expect_uniform(&p, ST_HOME_VRAM, ST_HOME_HOST);
	st_plan_fini(&p);

	in.gpu_mem_bytes = resident.tier[ST_HOME_VRAM] - 4096;
	in.params = ST_OFFLOAD_HOST; /* forced: the uniform row */
	p = plan_ok(&in);
	expect_uniform(&p, ST_HOME_HOST, ST_HOME_HOST);
	expect_matches_ref(&p, &in);
	assert_true(p.prefetch >= 1);
	assert_false(p.split);
	st_plan_fini(&p);
}

static void test_small_host_optim_nvme(void **state)
{
	struct st_plan_input in = input(tiny);
	struct ref r;
	struct st_plan p;
	int ret;

	ST_UNUSED(state);
	ref_pools(&in, ST_HOME_VRAM, ST_HOME_HOST, 1, &r);
	in.host_mem_bytes = r.tier[ST_HOME_HOST] - 4096;
	in.optim = ST_OFFLOAD_NVME; /* forced: the uniform row (auto splits) */
	p = plan_ok(&in);
	expect_uniform(&p, ST_HOME_VRAM, ST_HOME_NVME);
	expect_matches_ref(&p, &in);
	assert_true(p.total_bytes[ST_HOME_NVME] > 0);
	assert_int_equal(p.budget_bytes[ST_HOME_NVME], p.total_bytes[ST_HOME_NVME]);
	st_plan_fini(&p);

	/* Without an nvme tier: W into host saves W's update staging, which
	 * for this model is larger than all of W (and the split cannot move
	 * a block's W to vram: that needs the staging back). */
	in = input(small);
	in.seq = 32;
	in.have_nvme = false;
	ref_pools(&in, ST_HOME_VRAM, ST_HOME_HOST, 1, &r);
	in.host_mem_bytes = r.tier[ST_HOME_HOST] - 4096;
	ref_pools(&in, ST_HOME_HOST, ST_HOME_HOST, 1, &r);
	assert_true(r.tier[ST_HOME_HOST] <= in.host_mem_bytes);
	p = plan_ok(&in);
	expect_uniform(&p, ST_HOME_HOST, ST_HOME_HOST);
	expect_matches_ref(&p, &in);
	/* and below that nothing fits: refused, naming host */
	in.host_mem_bytes = p.min_bytes[ST_HOME_HOST] - 4096;
	st_plan_fini(&p);
	ret = st_plan_make(&in, &p);
	assert_int_equal(ret, -ENOSPC);
	assert_non_null(strstr(st_error_last(), "host budget"));

	/* Tiny host and vram: everything that can goes to nvme. */
	in = input(deep);
	ref_pools(&in, ST_HOME_NVME, ST_HOME_NVME, 1, &r);
	in.host_mem_bytes = r.tier[ST_HOME_HOST];
	in.gpu_mem_bytes = r.tier[ST_HOME_VRAM];
	p = plan_ok(&in);
	expect_uniform(&p, ST_HOME_NVME, ST_HOME_NVME);
	assert_int_equal(p.prefetch, 1);
	expect_matches_ref(&p, &in);
	st_plan_fini(&p);
}

static void test_forced(void **state)
{
	static const enum st_offload ps[] = { ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, ST_OFFLOAD_NVME };
	static const enum st_home pw[] = { ST_HOME_VRAM, ST_HOME_HOST, ST_HOME_NVME };
	static const enum st_offload os[] = { ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, ST_OFFLOAD_NVME };
	static const enum st_home oh[] = { ST_HOME_HOST, ST_HOME_HOST, ST_HOME_NVME };
	struct st_plan_input in;
	struct st_plan p;

	ST_UNUSED(state);
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 3; j++) {
			in = input(tiny);
			in.params = ps[i];
			in.optim = os[j];
			p = plan_ok(&in);
			expect_uniform(&p, pw[i], oh[j]);
			expect_matches_ref(&p, &in);
			st_plan_fini(&p);
		}
	/* Forced homes stay even when they make the plan fail. */
	in = input(deep);
	in.params = ST_OFFLOAD_NONE;
	in.activations = ST_OFFLOAD_NONE;
	{
		struct ref r;

		ref_pools(&in, ST_HOME_VRAM, ST_HOME_HOST, 1, &r);
		in.gpu_mem_bytes = r.tier[ST_HOME_VRAM] - 4096;
	}
	assert_int_equal(st_plan_make(&in, &p), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "vram budget"));

	in = input(tiny);
	in.have_nvme = false;
	in.params = ST_OFFLOAD_NVME;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	assert_non_null(strstr(st_error_last(), "--offload-params nvme needs --nvme"));
	in.params = ST_OFFLOAD_AUTO;
	in.optim = ST_OFFLOAD_NVME;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	assert_non_null(strstr(st_error_last(), "--offload-optim nvme needs --nvme"));
	/* auto without nvme never picks nvme */
	in.optim = ST_OFFLOAD_AUTO;
	{
		struct ref r;

		ref_pools(&in, ST_HOME_HOST, ST_HOME_HOST, 1, &r);
		in.gpu_mem_bytes = r.tier[ST_HOME_VRAM];
	}
	p = plan_ok(&in);
	assert_int_not_equal(p.w_home, ST_HOME_NVME);
	assert_int_not_equal(p.optim_home, ST_HOME_NVME);
	assert_int_equal(p.total_bytes[ST_HOME_NVME], 0);
	st_plan_fini(&p);
}

/* --- exact minimums and the refusal ------------------------------------------ */

/* The refusal names the tier and carries budget and minimum in bytes. */
static void expect_refusal(const struct st_plan_input *in, int tier, uint64_t budget,
			   uint64_t min)
{
	struct st_plan p;
	char want[128];
	const char *msg;
	int ret = st_plan_make(in, &p);

	assert_int_equal(ret, -ENOSPC);
	msg = st_error_last();
	assert_null(strchr(msg, '\n'));
	snprintf(want, sizeof(want), "%s budget ", st_home_name((enum st_home)tier));
	if (strncmp(msg, want, strlen(want)) != 0)
		fail_msg("want \"%s...\", got \"%s\"", want, msg);
	snprintf(want, sizeof(want), "(%" PRIu64 " B) is below the minimum of ", budget);
	if (!strstr(msg, want))
		fail_msg("want budget \"%s\" in \"%s\"", want, msg);
	snprintf(want, sizeof(want), "(%" PRIu64 " B)", min);
	if (!strstr(strstr(msg, "minimum"), want))
		fail_msg("want minimum \"%s\" in \"%s\"", want, msg);
}

static uint64_t *budget_of(struct st_plan_input *in, int t)
{
	return t == ST_HOME_VRAM ? &in->gpu_mem_bytes :
	       t == ST_HOME_HOST ? &in->host_mem_bytes : &in->nvme_mem_bytes;
}

static void check_minimums(struct st_plan_input in)
{
	struct st_plan p = plan_ok(&in);
	uint64_t min[ST_HOME_COUNT];

	memcpy(min, p.min_bytes, sizeof(min));
	for (int t = 0; t < ST_HOME_COUNT; t++)
		assert_true(min[t] <= p.total_bytes[t]);
	st_plan_fini(&p);
	for (int t = 0; t < ST_HOME_COUNT; t++) {
		struct st_plan_input x = in;

		if (t == ST_HOME_NVME && (!in.have_nvme || min[t] == 0))
			continue;
		*budget_of(&x, t) = min[t];
		p = plan_ok(&x);
		assert_int_equal(p.min_bytes[t], min[t]);
		st_plan_fini(&p);
		if (min[t] < 4096 + (t == ST_HOME_NVME)) /* nvme 0 would mean unlimited */
			continue;
		*budget_of(&x, t) = min[t] - 4096;
		expect_refusal(&x, t, min[t] - 4096, min[t]);
	}
}

static void test_minimum_exact(void **state)
{
	struct st_plan_input in;
	struct ref r;

	ST_UNUSED(state);
	/* roomy, auto, nvme unlimited */
	check_minimums(input(tiny));
	check_minimums(input(deep));
	/* streamed W, optimizer on nvme with a finite nvme budget */
	in = input(deep);
	ref_pools(&in, ST_HOME_HOST, ST_HOME_HOST, 1, &r);
	in.gpu_mem_bytes = r.tier[ST_HOME_VRAM] + 3 * r.slot_bytes;
	ref_pools(&in, ST_HOME_HOST, ST_HOME_NVME, 1, &r);
	in.host_mem_bytes = r.tier[ST_HOME_HOST];
	in.nvme_mem_bytes = 1 * ST_GiB;
	check_minimums(in);
	/* no nvme tier */
	in = input(deep);
	in.have_nvme = false;
	ref_pools(&in, ST_HOME_HOST, ST_HOME_HOST, 1, &r);
	in.gpu_mem_bytes = r.tier[ST_HOME_VRAM] + r.slot_bytes;
	check_minimums(in);
	/* forced, fp32, accumulation, forced prefetch */
	in = input(tiny);
	in.bf16 = false;
	in.grad_accum = 3;
	in.params = ST_OFFLOAD_NVME;
	in.optim = ST_OFFLOAD_NVME;
	in.prefetch = 2;
	in.nvme_mem_bytes = 512 * ST_MiB;
	check_minimums(in);
	in.params = ST_OFFLOAD_HOST;
	in.optim = ST_OFFLOAD_HOST;
	check_minimums(in);
	in.params = ST_OFFLOAD_NONE;
	in.optim = ST_OFFLOAD_AUTO;
	check_minimums(in);
}

static void test_zero_budgets(void **state)
{
	struct st_plan_input in = input(tiny);
	struct st_plan p;

	ST_UNUSED(state);
	in.gpu_mem_bytes = 0;
	assert_int_equal(st_plan_make(&in, &p), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "vram budget 0 B"));
	in = input(tiny);
	in.host_mem_bytes = 0;
	assert_int_equal(st_plan_make(&in, &p), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "host budget 0 B"));
	/* both short: still one line naming one tier */
	in.gpu_mem_bytes = 0;
	assert_int_equal(st_plan_make(&in, &p), -ENOSPC);
	assert_null(strchr(st_error_last(), '\n'));
	assert_non_null(strstr(st_error_last(), " budget 0 B (0 B) is below the minimum"));
}

/* --- pools and prefetch ----------------------------------------------------------- */

static void test_pools_match_formulas(void **state)
{
	static const enum st_offload ps[] = { ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, ST_OFFLOAD_NVME };
	static const enum st_offload os[] = { ST_OFFLOAD_HOST, ST_OFFLOAD_NVME };
	const struct st_model *ms[] = { tiny, deep, small };

	ST_UNUSED(state);
	for (unsigned mi = 0; mi < ST_ARRAY_LEN(ms); mi++)
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 2; j++)
				for (int k = 1; k <= 3; k++)
					for (int v = 0; v < 4; v++) {
						struct st_plan_input in = input(ms[mi]);
						struct st_plan p;

						in.params = ps[i];
						in.optim = os[j];
						in.prefetch = k;
						in.bf16 = v & 1;
						in.grad_accum = v & 2 ? 4 : 1;
						in.batch = 1 + k;
						in.seq = 32 - 7 * (v & 1);
						p = plan_ok(&in);
						assert_int_equal(p.prefetch, k);
						expect_matches_ref(&p, &in);
						st_plan_fini(&p);
					}
	/* GPT-2's embedding (39M elements) is larger than the update tile */
	{
		struct st_model *gpt2 = model_make("gpt2");
		struct st_plan_input in = input(gpt2);
		struct st_plan p;

		assert_true(st_model_unit_layout(gpt2, 0)->elems > ST_UPDATE_TILE_ELEMS);
		in.batch = 1;
		in.optim = ST_OFFLOAD_NVME;
		p = plan_ok(&in);
		expect_matches_ref(&p, &in);
		assert_int_equal(p.update_staging_bytes, 2ull * ST_UPDATE_TILE_ELEMS * (16 + 2));
		st_plan_fini(&p);
		/* streamed: the embedding (5.6x a block) gets its own slot */
		in.params = ST_OFFLOAD_NVME;
		in.prefetch = 3;
		p = plan_ok(&in);
		expect_matches_ref(&p, &in);
		assert_true(p.embed_slot);
		assert_int_equal(p.w_slot_bytes, st_model_unit_layout(gpt2, 1)->elems * 2);
		st_plan_fini(&p);
		st_model_destroy(gpt2);
	}
}

static void test_prefetch_auto(void **state)
{
	struct st_plan_input in = input(deep);
	struct ref r, resident;
	struct st_plan p;

	ST_UNUSED(state);
	/* vram-bound: W streamed from host, room for exactly 3 slots ahead */
	ref_pools(&in, ST_HOME_VRAM, ST_HOME_HOST, 1, &resident);
	ref_pools(&in, ST_HOME_HOST, ST_HOME_HOST, 3, &r);
	assert_true(r.tier[ST_HOME_VRAM] < resident.tier[ST_HOME_VRAM]);
	in.gpu_mem_bytes = r.tier[ST_HOME_VRAM] + r.slot_bytes - 4096;
	in.params = ST_OFFLOAD_HOST; /* auto would rather move blocks to vram */
	p = plan_ok(&in);
	assert_int_equal(p.w_home, ST_HOME_HOST);
	assert_int_equal(p.prefetch, 3);
	expect_matches_ref(&p, &in);
	st_plan_fini(&p);
	in.prefetch = 4;
	in.activations = ST_OFFLOAD_NONE; /* (on the host k = 4 would fit) */
	ref_pools(&in, ST_HOME_HOST, ST_HOME_HOST, 4, &r);
	expect_refusal(&in, ST_HOME_VRAM, in.gpu_mem_bytes, r.tier[ST_HOME_VRAM]);
	in.activations = ST_OFFLOAD_AUTO;
	in.prefetch = 3;
	p = plan_ok(&in);
	assert_int_equal(p.prefetch, 3);
	st_plan_fini(&p);

	/* host-bound: W on nvme, the host staging limits k to 2 (optimizer
	 * held in host: with auto, a forced k = 3 would move it to nvme) */
	in = input(deep);
	in.params = ST_OFFLOAD_NVME;
	in.optim = ST_OFFLOAD_HOST;
	ref_pools(&in, ST_HOME_NVME, ST_HOME_HOST, 2, &r);
	in.host_mem_bytes = r.tier[ST_HOME_HOST] + r.slot_bytes - 4096;
	p = plan_ok(&in);
	assert_int_equal(p.prefetch, 2);
	expect_matches_ref(&p, &in);
	st_plan_fini(&p);
	in.prefetch = 3;
	ref_pools(&in, ST_HOME_NVME, ST_HOME_HOST, 3, &r);
	expect_refusal(&in, ST_HOME_HOST, in.host_mem_bytes, r.tier[ST_HOME_HOST]);

	/* plenty of room: k = U */
	in = input(deep);
	in.params = ST_OFFLOAD_HOST;
	p = plan_ok(&in);
	assert_int_equal(p.prefetch, st_model_unit_count(deep));
	st_plan_fini(&p);
}

/* --- traffic and time ------------------------------------------------------------- */

static void test_traffic_hand_computed(void **state)
{
	/* layers=1, dim 64, vocab 64, ctx 32:
	 *   embedding (64 + 32) * 64              =  6144 elems (already 3 x 2048)
	 *   block     12*64^2 + 13*64 = 49984     -> 51200 elems (25 x 2048)
	 *   head      ln_f 2*64 = 128             ->  2048 elems
	 *   sum e = 59392; W bf16 118784 B; one fp32 state 237568 B. */
	static const uint64_t elems[] = { 6144, 51200, 2048 };
	const uint64_t w = 118784, g = 237568, w0 = 6144 * 2 + 2048 * 2; /* embedding + head */
	struct st_plan_input in = input(small);
	struct st_plan p;
	double tokens;

	ST_UNUSED(state);
	assert_int_equal(st_model_unit_count(small), 3);
	for (int u = 0; u < 3; u++)
		assert_int_equal(st_model_unit_layout(small, u)->elems, elems[u]);
	in.grad_accum = 2;
	in.seq = 32;

	/* everything on nvme, 2 micro-batches */
	in.params = ST_OFFLOAD_NVME;
	in.optim = ST_OFFLOAD_NVME;
	p = plan_ok(&in);
	/* per micro-batch: W twice, but the embedding's and the head's once */
	assert_int_equal(p.h2d_bytes, 2 * (2 * w - w0));            /* 442368 */
	assert_int_equal(p.h2d_bytes, 442368);
	assert_int_equal(p.d2h_bytes, 2 * g);                       /* 475136 */
	assert_int_equal(p.nvme_read_bytes, 2 * (2 * w - w0) + 2 * g + 3 * g); /* W, G, PMV */
	assert_int_equal(p.nvme_read_bytes, 1630208);
	assert_int_equal(p.nvme_write_bytes, w + 2 * g + 3 * g);
	assert_int_equal(p.nvme_write_bytes, 1306624);
	st_plan_fini(&p);

	/* W streamed from host, optimizer in host: no nvme */
	in.params = ST_OFFLOAD_HOST;
	in.optim = ST_OFFLOAD_HOST;
	p = plan_ok(&in);
	assert_int_equal(p.h2d_bytes, 4 * w - 2 * w0);
	assert_int_equal(p.d2h_bytes, 2 * g);
	assert_int_equal(p.nvme_read_bytes, 0);
	assert_int_equal(p.nvme_write_bytes, 0);
	st_plan_fini(&p);

	/* W resident: only the new W goes up once; dW comes down per micro-batch */
	in.params = ST_OFFLOAD_NONE;
	in.optim = ST_OFFLOAD_NVME;
	p = plan_ok(&in);
	assert_int_equal(p.h2d_bytes, w);
	assert_int_equal(p.d2h_bytes, 2 * g);
	assert_int_equal(p.nvme_read_bytes, 5 * g);
	assert_int_equal(p.nvme_write_bytes, 5 * g);

	/* times with the default rates */
	tokens = (double)in.batch * in.seq * in.grad_accum;
	/* per token: the block's 6 * 12 C^2 + 6 T C = 307200 and a third more
	 * for its recompute, the head's 6 V C = 24576 (its forward runs inside
	 * its backward: nothing recomputed) */
	assert_double_equal(p.t_compute_s, (307200.0 * 4 / 3 + 24576.0) * tokens / 50e9, 1e-15);
	assert_double_equal(p.recompute_flops, 307200.0 / 3 * tokens, 1e-6);
	assert_double_equal(p.t_copy_s, (double)(w + 2 * g) / 8e9, 1e-15);
	assert_double_equal(p.t_nvme_s, 5.0 * g / 1.5e9 + 5.0 * g / 1.2e9, 1e-15);
	assert_double_equal(p.t_adam_s, st_model_param_count(small) * 30.0 / 10e9, 1e-15);
	assert_double_equal(p.rates.copy_bps, 8e9, 0);
	{
		double t[] = { p.t_compute_s, p.t_copy_s, p.t_nvme_s, p.t_adam_s };
		const char *names[] = { "compute", "copy", "nvme", "adam" };
		/* the update phase: G, P, M, V loaded, P, M, V stored (5 g and
		 * 3 g: W is in vram), the new W up, AdamW, one forward */
		/* (but the P, M, V loads of the embedding and the block, the
		 * first two tiles, which go during the backward) */
		double u[] = { (307200.0 + 24576.0) / 3 * in.batch * in.seq / 50e9,
			       (double)w / 8e9,
			       (4.0 * g - 3 * 4 * (6144 + 51200)) / 1.5e9 + 3.0 * g / 1.2e9,
			       p.t_adam_s };
		double others = 0, ph[2] = { 0, 0 };
		int arg = 0;

		assert_int_equal(p.upd_nvme_read_bytes, 4 * g);
		assert_int_equal(p.upd_prefetch_nvme_read_bytes, 3 * 4 * (6144 + 51200));
		assert_int_equal(p.upd_nvme_write_bytes, 3 * g);
		assert_int_equal(p.upd_h2d_bytes, w);
		for (int i = 1; i < 4; i++)
			if (t[i] > t[arg])
				arg = i;
		assert_string_equal(p.bound, names[arg]);
		for (int i = 0; i < 4; i++) {
			assert_double_equal(p.t_phase_lane_s[1][i], u[i], 1e-15);
			assert_double_equal(p.t_phase_lane_s[0][i], t[i] - u[i], 1e-15);
			ph[0] = fmax(ph[0], t[i] - u[i]);
			ph[1] = fmax(ph[1], u[i]);
		}
		for (int i = 0; i < 4; i++)
			others += t[i] - u[i] + u[i];
		others -= ph[0] + ph[1];
		/* the phases add; plus the fill and drain: one unit's share of
		 * every lane but each phase's busiest, twice */
		assert_double_equal(p.t_phase_s[0], ph[0], 1e-15);
		assert_double_equal(p.t_phase_s[1], ph[1], 1e-15);
		assert_double_equal(p.t_serial_s, 2 * others / p.units, 1e-15);
		assert_double_equal(p.t_step_s, ph[0] + ph[1] + p.t_serial_s, 1e-15);
		assert_true(p.t_step_s >= t[arg]);
	}
	st_plan_fini(&p);

	/* the cpu device: compute, AdamW and the copies share the cores, so
	 * they add, in each phase (AdamW is all in the update's), and the
	 * cores also widen every W a pass uses and sum every nvme byte */
	in.host_compute = true;
	/* at the copy rate (no widen or sum rate given), then at their own */
	for (int cr = 0; cr < 2; cr++) {
		const double wr = cr ? 24e9 : 8e9, sr = cr ? 16e9 : 8e9;

		in.rates.widen_bps = cr ? wr : 0;
		in.rates.sum_bps = cr ? sr : 0;
		p = plan_ok(&in);
		/* widens per micro-batch: the embedding once (kept widened for
		 * its backward), the block twice, the head once, 6 B each (bf16
		 * read, fp32 written): 110592 elements; the fused forward's
		 * (units 0 and 1, once): 57344 */
		const double wid = 2.0 * 110592 * 6, uwid = 57344.0 * 6;
		/* nvme: 5 g read and written; the update's own: G, P, M, V
		 * loaded but the first two tiles' P, M, V, and P, M, V stored */
		const double sums = 10.0 * g, usums = 4.0 * g - 3 * 4 * (6144 + 51200) + 3.0 * g;
		double fwd = (307200.0 + 24576.0) / 3 * in.batch * in.seq / 50e9;
		double flops = (307200.0 * 4 / 3 + 24576.0) * tokens / 50e9;
		double c1 = fwd + uwid / wr + usums / sr + p.t_adam_s + (double)w / 8e9;
		double c0 = flops - fwd + (wid - uwid) / wr + (sums - usums) / sr +
			    (double)(2 * g) / 8e9;
		double n1 = p.t_phase_lane_s[1][2], n0 = p.t_nvme_s - n1;
		double m0 = fmax(c0, n0), m1 = fmax(c1, n1);

		assert_int_equal(p.widen_bytes, 1327104);
		assert_int_equal(p.upd_widen_bytes, 344064);
		assert_int_equal(p.upd_fwd_h2d_bytes, 0); /* W in vram: no fetch */
		assert_int_equal(p.upd_fwd_nvme_read_bytes, 0);
		assert_double_equal(p.t_widen_s, wid / wr, 1e-15);
		assert_double_equal(p.t_sums_s, sums / sr, 1e-15);
		assert_double_equal(p.t_compute_s, flops + wid / wr + sums / sr, 1e-15);
		assert_double_equal(p.t_phase_lane_s[0][0], c0, 1e-15);
		assert_double_equal(p.t_phase_lane_s[1][0], c1, 1e-15);
		for (int ph = 0; ph < 2; ph++) {
			assert_double_equal(p.t_phase_lane_s[ph][1], 0, 0);
			assert_double_equal(p.t_phase_lane_s[ph][3], 0, 0);
		}
		assert_double_equal(n1, (4.0 * g - 3 * 4 * (6144 + 51200)) / 1.5e9 + 3.0 * g / 1.2e9,
				    1e-15);
		assert_double_equal(p.t_step_s - p.t_serial_s, m0 + m1, 1e-15);
		assert_double_equal(p.t_serial_s, 2 * (c0 + n0 - m0 + c1 + n1 - m1) / p.units,
				    1e-15);
		/* the step's cores: the FLOPs, widens, sums, AdamW and copies */
		assert_string_equal(p.bound, p.t_compute_s + p.t_adam_s + p.t_copy_s > p.t_nvme_s
						     ? (p.t_adam_s > p.t_compute_s ? "adam" : "compute")
						     : "nvme");
		st_plan_fini(&p);
	}
	in.rates.widen_bps = in.rates.sum_bps = 0;
	in.host_compute = false;

	/* each resource can be the bound */
	{
		struct { struct st_plan_rates r; const char *bound; } cases[] = {
			{ { .compute_flops = 1e3 }, "compute" },
			{ { .copy_bps = 1 }, "copy" },
			{ { .nvme_read_bps = 1 }, "nvme" },
			{ { .adam_bps = 1 }, "adam" },
		};
		for (unsigned i = 0; i < ST_ARRAY_LEN(cases); i++) {
			in.rates = cases[i].r;
			p = plan_ok(&in);
			assert_string_equal(p.bound, cases[i].bound);
			st_plan_fini(&p);
		}
	}
}

/* --- recompute ---------------------------------------------------------------------- */

/* all keeps nothing, none keeps every block (one saved extent each, the
 * workspace down to a kept block's scratch), auto keeps as many as the vram
 * budget holds after the rest, the last blocks first; the minimums are
 * exact for each mode; none refused names the saved forwards; the
 * compute prediction counts a third more only for the blocks that
 * recompute. */
static void test_recompute(void **state)
{
	struct st_plan_input in = input(deep);
	struct st_plan all, none, p;
	uint64_t saved, scratch, each, work_all = 0, work_none = 0;
	double tokens = (double)in.batch * in.seq, blk, head;
	const struct st_plan_pool *x = NULL;

	ST_UNUSED(state);
	in.params = ST_OFFLOAD_NONE;
	in.optim = ST_OFFLOAD_HOST;
	in.recompute = ST_RECOMPUTE_ALL;
	all = plan_ok(&in);
	assert_int_equal(all.n_keep, 0);
	assert_int_equal(all.saved_each_bytes, 0);
	for (int i = 0; i < all.n_pools; i++)
		assert_int_not_equal(all.pools[i].id, ST_POOL_SAVED);
	saved = st_model_saved_bytes(deep, 1, in.batch, in.seq, &scratch);
	assert_true(saved > 0);
	each = page(saved);
	for (int u = 0; u < all.units; u++) {
		uint64_t sc, w = st_model_work_bytes(deep, u, in.batch, in.seq);

		work_all = w > work_all ? w : work_all;
		st_model_saved_bytes(deep, u, in.batch, in.seq, &sc);
		work_none = sc > work_none ? sc : work_none;
	}
	assert_int_equal(all.work_bytes, work_all);

	in.recompute = ST_RECOMPUTE_NONE;
	none = plan_ok(&in);
	assert_int_equal(none.n_keep, 8);
	for (int u = 0; u < none.units; u++)
		assert_int_equal(none.keep[u], u >= 1 && u <= 8);
	for (int i = 0; i < none.n_pools; i++)
		if (none.pools[i].id == ST_POOL_SAVED)
			x = &none.pools[i];
	assert_non_null(x);
	assert_int_equal(x->count, 8);
	assert_int_equal(x->bytes, saved);
	assert_int_equal(none.work_bytes, work_none);
	assert_int_equal(none.total_bytes[ST_HOME_VRAM],
			 all.total_bytes[ST_HOME_VRAM] - page(work_all) + page(work_none) + 8 * each);
	assert_int_equal(none.recompute_flops, 0);

	/* FLOPs: GPT-2's block and head of deep (C 128, V 256, T 64) */
	blk = 6.0 * 12 * 128 * 128 + 6.0 * 64 * 128;
	head = 6.0 * 256 * 128;
	assert_double_equal(none.t_compute_s, (8 * blk + head) * tokens / 50e9, 1e-15);
	assert_double_equal(all.t_compute_s, (8 * blk * 4 / 3 + head) * tokens / 50e9, 1e-15);

	/* none's vram minimum is exact: at it, accepted; 4 KiB less, refused
	 * with one line naming the saved forwards */
	in.gpu_mem_bytes = none.min_bytes[ST_HOME_VRAM];
	p = plan_ok(&in);
	assert_int_equal(p.n_keep, 8);
	st_plan_fini(&p);
	in.gpu_mem_bytes -= 4096;
	assert_int_equal(st_plan_make(&in, &p), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "vram budget"));
	assert_non_null(strstr(st_error_last(), "--recompute none keeps the forward of 8 units"));
	assert_null(strchr(st_error_last(), '\n'));

	/* auto: the budget of all and three extents keeps the last three
	 * blocks; the minimum is all's (auto keeps what is left over) */
	in.recompute = ST_RECOMPUTE_AUTO;
	in.gpu_mem_bytes = all.total_bytes[ST_HOME_VRAM] + 3 * each;
	p = plan_ok(&in);
	assert_int_equal(p.n_keep, 3);
	for (int u = 0; u < p.units; u++)
		assert_int_equal(p.keep[u], u >= 6 && u <= 8);
	assert_int_equal(p.total_bytes[ST_HOME_VRAM], in.gpu_mem_bytes);
	assert_int_equal(p.min_bytes[ST_HOME_VRAM], all.min_bytes[ST_HOME_VRAM]);
	assert_double_equal(p.t_compute_s, (3 * blk + 5 * blk * 4 / 3 + head) * tokens / 50e9,
			    1e-15);
	st_plan_fini(&p);
	/* one byte less: two, with the checkpoints in vram */
	in.gpu_mem_bytes -= 1;
	in.activations = ST_OFFLOAD_NONE;
	p = plan_ok(&in);
	assert_int_equal(p.n_keep, 2);
	assert_true(p.keep[7] && p.keep[8] && !p.keep[6]);
	{
		/* auto compares the rows with their own keeps: the checkpoints
		 * on the host free room for the third keep again, and that
		 * row is predicted faster (the old comparison, without keeps,
		 * took the vram row and its two) */
		struct st_plan q;

		in.activations = ST_OFFLOAD_AUTO;
		q = plan_ok(&in);
		assert_int_equal(q.act_home, ST_HOME_HOST);
		assert_int_equal(q.n_keep, 3);
		assert_true(q.t_step_s < p.t_step_s);
		st_plan_fini(&q);
	}
	st_plan_fini(&p);
	/* none's total: every block (the last extent paid by the workspace's
	 * shrinking) */
	in.gpu_mem_bytes = none.total_bytes[ST_HOME_VRAM];
	p = plan_ok(&in);
	assert_int_equal(p.n_keep, 8);
	st_plan_fini(&p);
	/* at all's minimum auto still plans, keeping nothing */
	in.gpu_mem_bytes = all.min_bytes[ST_HOME_VRAM];
	in.params = ST_OFFLOAD_AUTO;
	p = plan_ok(&in);
	st_plan_fini(&p);

	/* the JSON says which units keep */
	in.params = ST_OFFLOAD_NONE;
	in.gpu_mem_bytes = all.total_bytes[ST_HOME_VRAM] + 3 * each;
	p = plan_ok(&in);
	{
		char *text = st_plan_json(&p, &in);
		json_object *root = json_tokener_parse(text), *rc, *v, *units;

		assert_true(json_object_object_get_ex(root, "recompute", &rc));
		assert_true(json_object_object_get_ex(rc, "mode", &v));
		assert_string_equal(json_object_get_string(v), "auto");
		assert_true(json_object_object_get_ex(rc, "keep", &v));
		assert_int_equal(json_object_array_length(v), 3);
		assert_int_equal(json_object_get_int(json_object_array_get_idx(v, 0)), 6);
		assert_true(json_object_object_get_ex(rc, "saved_each_bytes", &v));
		assert_int_equal(json_object_get_int64(v), (int64_t)saved);
		assert_true(json_object_object_get_ex(root, "units", &units));
		assert_true(json_object_object_get_ex(json_object_array_get_idx(units, 8), "keep", &v));
		assert_true(json_object_get_boolean(v));
		assert_true(json_object_object_get_ex(json_object_array_get_idx(units, 5), "keep", &v));
		assert_false(json_object_get_boolean(v));
		json_object_put(root);
		free(text);
	}
	st_plan_fini(&p);
	st_plan_fini(&all);
	st_plan_fini(&none);
}

/* --- JSON -------------------------------------------------------------------------- */

static uint64_t jget_u(json_object *o, const char *a, const char *b, const char *c)
{
	json_object *x = o;
	const char *keys[] = { a, b, c };

	for (int i = 0; i < 3 && keys[i]; i++)
		if (!json_object_object_get_ex(x, keys[i], &x))
			fail_msg("no key %s", keys[i]);
	return (uint64_t)json_object_get_int64(x);
}

static double jget_d(json_object *o, const char *a, const char *b)
{
	json_object *x;

	assert_true(json_object_object_get_ex(o, a, &x));
	assert_true(json_object_object_get_ex(x, b, &x));
	return json_object_get_double(x);
}

static void test_json(void **state)
{
	static const char *tiers[] = { "vram", "host", "nvme" };
	struct st_plan_input in = input(deep);
	struct st_plan p;
	struct ref r;
	json_object *root, *x;
	char *text;

	ST_UNUSED(state);
	ref_pools(&in, ST_HOME_HOST, ST_HOME_NVME, 2, &r);
	in.gpu_mem_bytes = r.tier[ST_HOME_VRAM];
	in.host_mem_bytes = r.tier[ST_HOME_HOST] + 4096;
	in.nvme_mem_bytes = 1 * ST_GiB;
	in.grad_accum = 2;
	p = plan_ok(&in);
	text = st_plan_json(&p, &in);
	assert_non_null(text);
	root = json_tokener_parse(text);
	assert_non_null(root);
	for (int t = 0; t < 3; t++) {
		assert_int_equal(jget_u(root, "tiers", tiers[t], "total_bytes"), p.total_bytes[t]);
		assert_int_equal(jget_u(root, "tiers", tiers[t], "home_bytes"), p.home_bytes[t]);
		assert_int_equal(jget_u(root, "tiers", tiers[t], "budget_bytes"), p.budget_bytes[t]);
		assert_int_equal(jget_u(root, "tiers", tiers[t], "min_bytes"), p.min_bytes[t]);
	}
	assert_int_equal(jget_u(root, "traffic", "h2d_bytes", NULL), p.h2d_bytes);
	assert_int_equal(jget_u(root, "traffic", "d2h_bytes", NULL), p.d2h_bytes);
	assert_int_equal(jget_u(root, "traffic", "nvme_read_bytes", NULL), p.nvme_read_bytes);
	assert_int_equal(jget_u(root, "traffic", "nvme_write_bytes", NULL), p.nvme_write_bytes);
	assert_int_equal(jget_u(root, "pools", "w_slots", NULL), p.w_slots);
	assert_int_equal(jget_u(root, "pools", "w_slot_bytes", NULL), p.w_slot_bytes);
	assert_int_equal(jget_u(root, "pools", "act_bytes", NULL), p.act_bytes);
	assert_int_equal(jget_u(root, "pools", "scratch_bytes", NULL), p.scratch_bytes);
	assert_int_equal(jget_u(root, "pools", "w_staging_bytes", NULL), p.w_staging_bytes);
	assert_int_equal(jget_u(root, "pools", "grad_landing_bytes", NULL), p.grad_landing_bytes);
	assert_int_equal(jget_u(root, "pools", "update_staging_bytes", NULL),
			 p.update_staging_bytes);
	assert_int_equal(jget_u(root, "prefetch", NULL, NULL), p.prefetch);
	assert_int_equal(jget_u(root, "model", "params", NULL), st_model_param_count(deep));
	assert_double_equal(jget_d(root, "time", "step_s"), p.t_step_s, p.t_step_s * 1e-12);
	assert_double_equal(jget_d(root, "time", "nvme_s"), p.t_nvme_s, p.t_nvme_s * 1e-12);
	assert_double_equal(jget_d(root, "rates", "nvme_read_bps"), 1.5e9, 0);
	assert_true(json_object_object_get_ex(root, "time", &x));
	assert_true(json_object_object_get_ex(x, "bound", &x));
	assert_string_equal(json_object_get_string(x), p.bound);
	/* the placement table and the unit rows agree with the homes */
	for (int s = 0; s < ST_STATE_COUNT; s++) {
		json_object *cell;
		uint64_t bytes = 0;
		int units = 0;

		for (int u = 0; u < p.units; u++)
			if (st_plan_home(&p, u, (enum st_state)s) == ST_HOME_NVME) {
				units++;
				bytes += p.state_bytes[u * ST_STATE_COUNT + s];
			}
		assert_true(json_object_object_get_ex(root, "placement", &cell));
		assert_true(json_object_object_get_ex(cell, st_state_name((enum st_state)s), &cell));
		assert_true(json_object_object_get_ex(cell, "nvme", &cell));
		assert_int_equal(jget_u(cell, "units", NULL, NULL), units);
		assert_int_equal(jget_u(cell, "bytes", NULL, NULL), bytes);
	}
	assert_true(json_object_object_get_ex(root, "units", &x));
	assert_int_equal(json_object_array_length(x), p.units);
	for (int u = 0; u < p.units; u++) {
		json_object *row = json_object_array_get_idx(x, u), *st, *v;

		assert_true(json_object_object_get_ex(row, "W", &st));
		assert_true(json_object_object_get_ex(st, "tier", &v));
		assert_string_equal(json_object_get_string(v),
				    st_home_name(st_plan_home(&p, u, ST_STATE_W)));
		assert_int_equal(jget_u(st, "bytes", NULL, NULL),
				 p.state_bytes[u * ST_STATE_COUNT + ST_STATE_W]);
	}
	/* the rates with their sources, the serial parts, the batch that hides
	 * the I/O */
	assert_double_equal(jget_d(root, "time", "serial_s"), p.t_serial_s, p.t_serial_s * 1e-12);
	assert_true(json_object_object_get_ex(root, "rates", &x));
	assert_true(json_object_object_get_ex(x, "source", &x));
	assert_true(json_object_object_get_ex(x, "compute_flops", &x));
	assert_string_equal(json_object_get_string(x), "default");
	assert_true(json_object_object_get_ex(root, "hide", &x));
	{
		json_object *v;

		assert_true(json_object_object_get_ex(x, "auto_accum", &v));
		assert_int_equal(json_object_get_int(v), p.hide_best_accum);
		assert_true(json_object_object_get_ex(x, "compute_bound_accum", &v));
		if (p.hide_accum)
			assert_int_equal(json_object_get_int(v), p.hide_accum);
		else
			assert_null(v);
		assert_true(json_object_object_get_ex(x, "auto_step_s", &v));
		assert_double_equal(json_object_get_double(v), p.hide_best_step_s,
				    1e-12 * p.hide_best_step_s);
	}
	json_object_put(root);
	free(text);

	/* the human table prints without trouble (to a memory stream) */
	{
		char *buf = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&buf, &len);

		st_plan_print(&p, &in, f);
		st_plan_print_units(&p, &in, f);
		fclose(f);
		assert_non_null(strstr(buf, "bound by"));
		assert_non_null(strstr(buf, "block"));
		free(buf);
	}
	st_plan_fini(&p);
}

/* --- nvme-bench rates ------------------------------------------------------------- */

static char *write_tmp(const char *text)
{
	static char path[64];
	int fd;

	snprintf(path, sizeof(path), "/tmp/st-plan-test-XXXXXX");
	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return path;
}

static void test_rates_from_bench(void **state)
{
	struct st_plan_rates r = { 0 };
	struct st_plan_input in = input(small);
	struct st_plan p;
	char *path;

	in.seq = 32;

	ST_UNUSED(state);
	path = write_tmp("{ \"points\": [ { \"rw\": \"read\", \"bs\": 1048576, \"qd\": 32, "
			 "\"gbps\": 2.5 } ],\n  \"best\": { \"read_gbps\": 2.5, "
			 "\"write_gbps\": 1.75, \"bs\": 1048576, \"qd\": 32 } }\n");
	assert_int_equal(st_plan_rates_from_nvme_bench(path, &r), 0);
	unlink(path);
	assert_double_equal(r.nvme_read_bps, 2.5e9, 1);
	assert_double_equal(r.nvme_write_bps, 1.75e9, 1);
	assert_double_equal(r.compute_flops, 0, 0); /* untouched */

	in.rates = r;
	in.params = ST_OFFLOAD_NVME;
	in.optim = ST_OFFLOAD_NVME;
	p = plan_ok(&in);
	assert_double_equal(p.t_nvme_s, p.nvme_read_bytes / 2.5e9 + p.nvme_write_bytes / 1.75e9,
			    1e-15);
	st_plan_fini(&p);

	assert_int_equal(st_plan_rates_from_nvme_bench("/nonexistent/bench.json", &r), -ENOENT);
	assert_non_null(strstr(st_error_last(), "/nonexistent/bench.json"));
	{
		static const char *bad[] = {
			"not json at all",
			"{ \"points\": [] }",
			"{ \"best\": { \"read_gbps\": 2.5 } }",
			"{ \"best\": { \"read_gbps\": 0, \"write_gbps\": 1 } }",
			"{ \"best\": { \"read_gbps\": \"fast\", \"write_gbps\": 1 } }",
			"[ 1, 2 ]",
		};
		for (unsigned i = 0; i < ST_ARRAY_LEN(bad); i++) {
			path = write_tmp(bad[i]);
			assert_int_equal(st_plan_rates_from_nvme_bench(path, &r), -EINVAL);
			unlink(path);
			assert_non_null(strstr(st_error_last(), path));
		}
	}
}

/* The plan lists every pool once, and the totals are the homes plus the
 * list; explicit per-(unit, state) homes are kept and size the pools. */
static void expect_list(const struct st_plan *p)
{
	uint64_t sum[ST_HOME_COUNT] = { 0 };

	for (int i = 0; i < p->n_pools; i++) {
		const struct st_plan_pool *x = &p->pools[i];

		assert_true(x->count > 0 && x->bytes > 0);
		assert_string_equal(x->name, st_pool_name(x->id));
		sum[x->tier] += (x->bytes + 4095) / 4096 * 4096 * x->count;
		for (int j = 0; j < i; j++)
			assert_false(p->pools[j].id == x->id && p->pools[j].unit == x->unit);
	}
	for (int t = 0; t < ST_HOME_COUNT; t++)
		assert_int_equal(p->home_bytes[t] + sum[t], p->total_bytes[t]);
}

static const struct st_plan_pool *find_pool(const struct st_plan *p, enum st_pool_id id)
{
	for (int i = 0; i < p->n_pools; i++)
		if (p->pools[i].id == id)
			return &p->pools[i];
	return NULL;
}

/* --- the rates file ------------------------------------------------------------------ */

static void test_rates_file(void **state)
{
	struct st_plan_rates r = { 0 }, back, flags = { 0 };
	char path[] = "/tmp/st-plan-rates-XXXXXX";
	int fd;

	ST_UNUSED(state);
	fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	r.compute_flops = 1.25e11;
	r.copy_bps = 7.5e9;
	r.nvme_read_bps = 2.5e9;
	r.nvme_write_bps = 1.5e9;
	r.adam_bps = 3.25e10; /* net_bps 0: written as null */
	r.widen_bps = 2.25e10;
	r.sum_bps = 1.5e10;
	assert_int_equal(st_plan_rates_write(path, &r, "{\"device\": \"cpu\"}"), 0);
	assert_int_equal(st_plan_rates_read(path, &back), 0);
	for (int i = 0; i < ST_RATE_COUNT; i++) {
		assert_double_equal(st_plan_rate_get(&back, (enum st_rate)i),
				    st_plan_rate_get(&r, (enum st_rate)i), 0);
		assert_int_equal(back.source[i], i == ST_RATE_NET ? ST_RATE_SRC_DEFAULT
								 : ST_RATE_SRC_FILE);
	}
	/* the file as text: null for the rate not measured, the measured object */
	{
		json_object *root = json_object_from_file(path), *v;

		assert_non_null(root);
		assert_true(json_object_object_get_ex(root, "net_bps", &v));
		assert_null(v);
		assert_true(json_object_object_get_ex(root, "measured", &v));
		assert_true(json_object_is_type(v, json_type_object));
		json_object_put(root);
	}
	/* a flag beats the file; the plan says where each rate came from */
	flags.compute_flops = 9e10;
	st_plan_rates_merge(&flags, &back);
	assert_double_equal(flags.compute_flops, 9e10, 0);
	assert_double_equal(flags.copy_bps, 7.5e9, 0);
	{
		struct st_plan_input in = input(small);
		struct st_plan p;

		in.seq = 32;
		in.rates = flags;
		p = plan_ok(&in);
		assert_int_equal(p.rates.source[ST_RATE_COMPUTE], ST_RATE_SRC_FLAG);
		assert_int_equal(p.rates.source[ST_RATE_COPY], ST_RATE_SRC_FILE);
		assert_int_equal(p.rates.source[ST_RATE_NET], ST_RATE_SRC_DEFAULT);
		assert_double_equal(p.rates.copy_bps, 7.5e9, 0);
		st_plan_fini(&p);
	}
	/* refused in one line naming the file and the field */
	{
		static const struct { const char *text, *says; } bad[] = {
			{ "not json", "not JSON" },
			{ "", "not JSON (line 1: the file is empty)" },
			{ "{\"strata_rates\": 1,\n", "not JSON (line 2: the file ends inside a value)" },
			{ "{} x", "not JSON (line 1: text after the value)" },
			{ "[1]", "not a JSON object" },
			{ "{\"compute_flops\": 1}", "strata_rates" },
			{ "{\"strata_rates\": 2, \"compute_flops\": 1}", "strata_rates" },
			{ "{\"strata_rates\": 1, \"compute_flops\": 1, \"copy_bps\": 1, "
			  "\"nvme_read_bps\": 1, \"nvme_write_bps\": 1, \"adam_bps\": 1}", "\"net_bps\"" },
			{ "{\"strata_rates\": 1, \"compute_flops\": -1, \"copy_bps\": 1, "
			  "\"nvme_read_bps\": 1, \"nvme_write_bps\": 1, \"adam_bps\": 1, "
			  "\"net_bps\": null}", "\"compute_flops\" is -1" },
			{ "{\"strata_rates\": 1, \"compute_flops\": 0, \"copy_bps\": 1, "
			  "\"nvme_read_bps\": 1, \"nvme_write_bps\": 1, \"adam_bps\": 1, "
			  "\"net_bps\": null}", "\"compute_flops\" is 0" },
			{ "{\"strata_rates\": 1, \"compute_flops\": \"fast\", \"copy_bps\": 1, "
			  "\"nvme_read_bps\": 1, \"nvme_write_bps\": 1, \"adam_bps\": 1, "
			  "\"net_bps\": null}", "\"compute_flops\" is not a number" },
			{ "{\"strata_rates\": 1, \"compute_flops\": 1, \"copy_bps\": 1, "
			  "\"nvme_read_bps\": 1, \"nvme_write_bps\": 1, \"adam_bps\": 1, "
			  "\"net_bps\": null, \"gpu_bps\": 3}", "unknown field \"gpu_bps\"" },
		};
		for (unsigned i = 0; i < ST_ARRAY_LEN(bad); i++) {
			char *f = write_tmp(bad[i].text);

			back.compute_flops = 42;
			assert_int_equal(st_plan_rates_read(f, &back), -EINVAL);
			assert_non_null(strstr(st_error_last(), f));
			if (!strstr(st_error_last(), bad[i].says))
				fail_msg("case %u: \"%s\" lacks \"%s\"", i, st_error_last(), bad[i].says);
			assert_null(strchr(st_error_last(), '\n'));
			assert_double_equal(back.compute_flops, 42, 0); /* untouched */
			unlink(f);
		}
	}
	/* a file from before the cores' rates were measured: neither key,
	 * read as not measured (the copy rate in a plan) */
	{
		char *f = write_tmp("{\"strata_rates\": 1, \"compute_flops\": 1e11, \"copy_bps\": 6e9, "
				    "\"nvme_read_bps\": 1e9, \"nvme_write_bps\": 1e9, \"adam_bps\": 1e10, "
				    "\"net_bps\": null}");

		assert_int_equal(st_plan_rates_read(f, &back), 0);
		assert_double_equal(back.widen_bps, 0, 0);
		assert_double_equal(back.sum_bps, 0, 0);
		assert_int_equal(back.source[ST_RATE_WIDEN], ST_RATE_SRC_DEFAULT);
		assert_int_equal(back.source[ST_RATE_SUM], ST_RATE_SRC_DEFAULT);
		unlink(f);
	}
	assert_int_equal(st_plan_rates_read("/nonexistent/rates.json", &back), -ENOENT);
	/* a write that cannot be done leaves nothing behind and names the file */
	assert_int_equal(st_plan_rates_write("/nonexistent/dir/rates.json", &r, NULL), -ENOENT);
	assert_non_null(strstr(st_error_last(), "/nonexistent/dir/rates.json"));
	unlink(path);
}

/* rates from what the lanes did: bytes over busy time, FLOPs and AdamW
 * bytes from the plan */
static void test_rates_from_lanes(void **state)
{
	struct st_plan p = { 0 };
	struct st_plan_rates r;
	const double busy[6] = { 2.0, 0.5, 0.25, 1.0, 4.0, 0.5 };
	const double bytes[6] = { 0, 3e9, 1e9, 2e9, 2e9, 0 };

	ST_UNUSED(state);
	p.compute_flops_step = 1e12;
	p.adam_bytes = 15000000000ull;
	assert_int_equal(st_plan_rates_from_lanes(&p, 1, busy, bytes, 0, &r), 4);
	assert_double_equal(r.compute_flops, 5e11, 1);
	assert_double_equal(r.copy_bps, 0, 0); /* the copy lanes' busy time is no rate */
	assert_double_equal(r.nvme_read_bps, 2e9, 1);
	assert_double_equal(r.nvme_write_bps, 5e8, 1);
	assert_double_equal(r.adam_bps, 3e10, 1);
	assert_double_equal(r.net_bps, 0, 0);
	/* reads and writes overlapped: the disk was busy 3 s of the lanes' 5 s,
	 * and the planner's read + write time at the rates gives 3 s back */
	assert_int_equal(st_plan_rates_from_lanes(&p, 1, busy, bytes, 3.0, &r), 4);
	assert_double_equal(bytes[3] / r.nvme_read_bps + bytes[4] / r.nvme_write_bps, 3.0, 1e-12);
	assert_double_equal(r.nvme_read_bps, 2e9 * 5 / 3, 1);
	/* a disk busier than the lanes' sum (it cannot be): not scaled */
	assert_int_equal(st_plan_rates_from_lanes(&p, 1, busy, bytes, 9.0, &r), 4);
	assert_double_equal(r.nvme_read_bps, 2e9, 1);
	/* lanes summed over 2 steps: the plan's FLOPs, AdamW bytes and
	 * widens (the cpu device's, in the compute's busy time) twice */
	p.t_widen_s = 0.25;
	assert_int_equal(st_plan_rates_from_lanes(&p, 2, busy, bytes, 0, &r), 4);
	assert_double_equal(r.compute_flops, 2e12 / (2.0 - 2 * 0.25), 1);
	assert_double_equal(r.adam_bps, 6e10, 1);
	assert_double_equal(r.nvme_read_bps, 2e9, 1);
	p.t_widen_s = 0;
	/* a lane that did nothing measures nothing */
	{
		const double idle[6] = { 2.0, 0, 0, 0, 0, 0.5 };
		const double none[6] = { 0 };

		assert_int_equal(st_plan_rates_from_lanes(&p, 1, idle, none, 0, &r), 2);
		assert_double_equal(r.copy_bps, 0, 0);
		assert_double_equal(r.nvme_read_bps, 0, 0);
	}
}

/* The batch that hides the I/O, against plans made at every N. */
static void test_hide_accum(void **state)
{
	struct st_plan_input in = input(small);
	struct st_plan p, q;

	ST_UNUSED(state);
	in.seq = 32;
	/* W in vram, optimizer on nvme: P, M, V traffic is fixed, G's grows with
	 * N, so compute catches up with a slow enough disk */
	in.params = ST_OFFLOAD_NONE;
	in.optim = ST_OFFLOAD_NVME;
	in.host_mem_bytes = 64 * ST_MiB;
	p = plan_ok(&in);
	/* compute a third of the nvme time at N = 1 */
	in.rates.compute_flops = p.compute_flops_step / (p.t_nvme_s / 3);
	st_plan_fini(&p);
	p = plan_ok(&in);
	assert_string_equal(p.bound, "nvme");
	assert_true(p.hide_accum > 1 && p.hide_accum <= ST_PLAN_ACCUM_MAX);
	assert_int_equal(p.hide_best_accum, p.hide_accum);
	assert_string_equal(p.hide_why, "");
	for (int n = 1; n <= p.hide_accum; n++) {
		in.grad_accum = n;
		q = plan_ok(&in);
		assert_int_equal(q.w_home, p.w_home);
		if (n < p.hide_accum) {
			assert_string_not_equal(q.bound, "compute");
		} else {
			assert_string_equal(q.bound, "compute");
			assert_double_equal(q.t_step_s, p.hide_step_s, 1e-12 * q.t_step_s);
		}
		st_plan_fini(&q);
	}
	st_plan_fini(&p);

	/* already compute-bound: N = 1 */
	in.grad_accum = 1;
	in.rates.compute_flops = 1e3;
	p = plan_ok(&in);
	assert_string_equal(p.bound, "compute");
	assert_int_equal(p.hide_accum, 1);
	st_plan_fini(&p);

	/* W on nvme on a slow disk: every micro-batch reads W, never hidden;
	 * auto takes the smallest N within 10% of the best tokens/s */
	in.params = ST_OFFLOAD_NVME;
	in.rates.compute_flops = 1e12;
	in.rates.nvme_read_bps = 1e6;
	p = plan_ok(&in);
	assert_string_equal(p.bound, "nvme");
	assert_int_equal(p.hide_accum, 0);
	assert_non_null(strstr(p.hide_why, "nvme"));
	assert_true(p.hide_best_accum >= 1 && p.hide_best_accum <= ST_PLAN_ACCUM_MAX);
	{
		double best = 0, tps[ST_PLAN_ACCUM_MAX + 1];
		int want = 0;

		for (int n = 1; n <= ST_PLAN_ACCUM_MAX; n++) {
			in.grad_accum = n;
			q = plan_ok(&in);
			assert_string_not_equal(q.bound, "compute");
			tps[n] = (double)in.batch * in.seq * n / q.t_step_s;
			best = tps[n] > best ? tps[n] : best;
			st_plan_fini(&q);
		}
		for (int n = ST_PLAN_ACCUM_MAX; n >= 1; n--)
			if (tps[n] >= 0.9 * best)
				want = n;
		assert_int_equal(p.hide_best_accum, want);
	}
	st_plan_fini(&p);
}

static void test_pool_list(void **state)
{
	struct st_plan_input in = input(tiny);
	struct st_plan p;
	enum st_home homes[64 * ST_STATE_COUNT];
	int U = st_model_unit_count(tiny);
	uint64_t want[ST_HOME_COUNT] = { 0 };

	ST_UNUSED(state);
	for (int w = ST_OFFLOAD_NONE; w <= ST_OFFLOAD_NVME; w++) {
		in.params = (enum st_offload)w;
		in.optim = w == ST_OFFLOAD_NVME ? ST_OFFLOAD_NVME : ST_OFFLOAD_HOST;
		in.grad_accum = w == ST_OFFLOAD_NVME ? 2 : 1;
		p = plan_ok(&in);
		expect_list(&p);
		/* GPT-2's embedding is resident: its own W fp32 and dW */
		assert_non_null(find_pool(&p, ST_POOL_WF_RES));
		assert_int_equal(find_pool(&p, ST_POOL_WF_RES)->unit, 0);
		assert_int_equal(find_pool(&p, ST_POOL_DW_RES)->count, 1);
		assert_int_equal(find_pool(&p, ST_POOL_DW)->count, 2);
		assert_int_equal(find_pool(&p, ST_POOL_DACT)->count, 2);
		assert_true((find_pool(&p, ST_POOL_W_SLOT) != NULL) == (w != ST_OFFLOAD_NONE));
		assert_true((find_pool(&p, ST_POOL_W_STAGE) != NULL) == (w == ST_OFFLOAD_NVME));
		assert_true((find_pool(&p, ST_POOL_GSTAGE) != NULL) == (w == ST_OFFLOAD_NVME));
		st_plan_fini(&p);
	}
	/* split: W by unit in vram, host, nvme; G..V by unit and state */
	assert_true(U <= 64);
	for (int u = 0; u < U; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++) {
			enum st_home h = s == ST_STATE_W ? (enum st_home)(u % 3)
				       : (u + s) % 2 ? ST_HOME_NVME : ST_HOME_HOST;
			uint64_t e = st_model_unit_layout(tiny, u)->elems;

			homes[u * ST_STATE_COUNT + s] = h;
			want[h] += e * (s == ST_STATE_W ? 2 : 4);
		}
	in = input(tiny);
	in.homes = homes;
	in.grad_accum = 2;
	p = plan_ok(&in);
	expect_list(&p);
	for (int u = 0; u < U; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			assert_int_equal(st_plan_home(&p, u, (enum st_state)s),
					 homes[u * ST_STATE_COUNT + s]);
	for (int t = 0; t < ST_HOME_COUNT; t++)
		assert_int_equal(p.home_bytes[t], want[t]);
	assert_non_null(find_pool(&p, ST_POOL_W_SLOT));
	assert_non_null(find_pool(&p, ST_POOL_W_STAGE));
	assert_non_null(find_pool(&p, ST_POOL_GSTAGE));
	assert_non_null(find_pool(&p, ST_POOL_UPD_F32));
	st_plan_fini(&p);
	/* no W on nvme, G all in host: neither W staging nor G staging */
	for (int u = 0; u < U; u++) {
		homes[u * ST_STATE_COUNT + ST_STATE_W] = u % 2 ? ST_HOME_HOST : ST_HOME_VRAM;
		homes[u * ST_STATE_COUNT + ST_STATE_G] = ST_HOME_HOST;
	}
	p = plan_ok(&in);
	expect_list(&p);
	assert_null(find_pool(&p, ST_POOL_W_STAGE));
	assert_null(find_pool(&p, ST_POOL_GSTAGE));
	assert_non_null(find_pool(&p, ST_POOL_W_SLOT));
	st_plan_fini(&p);
	/* homes that cannot be: G in vram, no such tier, nvme without --nvme */
	homes[1 * ST_STATE_COUNT + ST_STATE_G] = ST_HOME_VRAM;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	assert_non_null(strstr(st_error_last(), "unit 1's G"));
	homes[1 * ST_STATE_COUNT + ST_STATE_G] = (enum st_home)7;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	homes[1 * ST_STATE_COUNT + ST_STATE_G] = ST_HOME_NVME;
	in.have_nvme = false;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	assert_non_null(strstr(st_error_last(), "needs --nvme"));
}

/* Layer-first's pools (strata/plan.h) against batch-first's of the same
 * input at A = 3: what holds a micro-batch holds A, a third dW, A of the
 * resident dW, no G staging; on the host the checkpoint slots and homes
 * hold A; kept forwards A extents a unit; and its traffic: W and dW once. */
static void test_pools_layer_first(void **state)
{
	struct st_plan_input in = input(tiny);
	struct st_plan b, l;
	static const enum st_pool_id times_a[] = { ST_POOL_DACT, ST_POOL_TOKENS,
						   ST_POOL_TARGETS };

	ST_UNUSED(state);
	in.params = ST_OFFLOAD_NVME;
	in.optim = ST_OFFLOAD_NVME;
	in.grad_accum = 3;
	in.prefetch = 1;
	for (int act = 0; act < 2; act++) {
		in.activations = act ? ST_OFFLOAD_HOST : ST_OFFLOAD_NONE;
		in.recompute = act ? ST_RECOMPUTE_NONE : ST_RECOMPUTE_ALL;
		in.schedule = ST_SCHEDULE_BATCH_FIRST;
		b = plan_ok(&in);
		in.schedule = ST_SCHEDULE_LAYER_FIRST;
		l = plan_ok(&in);
		expect_list(&l);
		assert_int_equal(l.schedule, ST_SCHEDULE_LAYER_FIRST);
		assert_int_equal(b.schedule, ST_SCHEDULE_BATCH_FIRST);
		for (size_t i = 0; i < ST_ARRAY_LEN(times_a); i++) {
			assert_int_equal(find_pool(&l, times_a[i])->bytes,
					 3 * find_pool(&b, times_a[i])->bytes);
			assert_int_equal(find_pool(&l, times_a[i])->count,
					 find_pool(&b, times_a[i])->count);
		}
		assert_int_equal(find_pool(&l, ST_POOL_DW)->count, 3);
		assert_int_equal(find_pool(&b, ST_POOL_DW)->count, 2);
		assert_int_equal(find_pool(&l, ST_POOL_DW_RES)->count, 3);
		assert_int_equal(find_pool(&l, ST_POOL_DW_RES)->bytes,
				 find_pool(&b, ST_POOL_DW_RES)->bytes);
		assert_non_null(find_pool(&b, ST_POOL_GSTAGE));
		assert_null(find_pool(&l, ST_POOL_GSTAGE));
		if (act) {
			assert_int_equal(find_pool(&l, ST_POOL_ACT_SLOT)->bytes,
					 3 * find_pool(&b, ST_POOL_ACT_SLOT)->bytes);
			assert_int_equal(find_pool(&l, ST_POOL_ACT_HOME)->bytes,
					 3 * find_pool(&b, ST_POOL_ACT_HOME)->bytes);
			assert_int_equal(find_pool(&l, ST_POOL_ACT_HOME)->count,
					 find_pool(&b, ST_POOL_ACT_HOME)->count);
			assert_int_equal(find_pool(&l, ST_POOL_SAVED)->count,
					 3 * find_pool(&b, ST_POOL_SAVED)->count);
			/* the same checkpoint bytes cross each way */
			assert_int_equal(l.act_copy_bytes, b.act_copy_bytes);
		} else {
			assert_int_equal(find_pool(&l, ST_POOL_ACT)->bytes,
					 3 * find_pool(&b, ST_POOL_ACT)->bytes);
			/* W streamed from nvme: each fetch once, not 3 times;
			 * dW copied out once */
			assert_int_equal(b.h2d_bytes - l.h2d_bytes, 2 * l.h2d_bytes);
			assert_int_equal(b.d2h_bytes, 3 * l.d2h_bytes);
		}
		assert_true(l.nvme_read_bytes < b.nvme_read_bytes);
		assert_true(l.nvme_write_bytes < b.nvme_write_bytes);
		st_plan_fini(&b);
		st_plan_fini(&l);
	}
}

/* Slots are sized from the units that stream: a resident unit larger than
 * the rest has a slot of its own only when it streams itself. */
static void test_split_slots(void **state)
{
	struct st_model *big = model_make("layers=2,dim=64,heads=2,vocab=4096,ctx=64");
	struct st_plan_input in = input(big);
	enum st_home homes[4 * ST_STATE_COUNT];
	uint64_t e0 = st_model_unit_layout(big, 0)->elems, e1 = st_model_unit_layout(big, 1)->elems;
	struct st_plan p;

	ST_UNUSED(state);
	assert_true(e0 > e1); /* the embedding is the largest unit */
	for (int k = 0; k < 2; k++) {
		for (int u = 0; u < 4; u++)
			for (int s = 0; s < ST_STATE_COUNT; s++)
				homes[u * ST_STATE_COUNT + s] =
					s != ST_STATE_W ? ST_HOME_HOST
					: (u == 0) == (k == 0) ? ST_HOME_NVME : ST_HOME_VRAM;
		in.homes = homes;
		in.prefetch = 2;
		p = plan_ok(&in);
		expect_list(&p);
		if (k == 0) { /* only the embedding streams: its slot alone */
			assert_null(find_pool(&p, ST_POOL_W_SLOT));
			assert_null(find_pool(&p, ST_POOL_W_STAGE));
			assert_int_equal(find_pool(&p, ST_POOL_W_SLOT_RES)->bytes, e0 * 2);
			assert_int_equal(find_pool(&p, ST_POOL_W_STAGE_RES)->bytes, e0 * 2);
		} else { /* the embedding stays: k + 1 slots for the rest */
			assert_null(find_pool(&p, ST_POOL_W_SLOT_RES));
			assert_null(find_pool(&p, ST_POOL_W_STAGE_RES));
			assert_int_equal(find_pool(&p, ST_POOL_W_SLOT)->count, 3);
			assert_true(find_pool(&p, ST_POOL_W_SLOT)->bytes < e0 * 2);
			assert_non_null(find_pool(&p, ST_POOL_W_STAGE));
		}
		st_plan_fini(&p);
	}
	st_model_destroy(big);
}


/* --offload-optim vram (the optimizer on the device, docs/gpu.md): every
 * G, P, M, V in vram with W, no landing nor update staging, the stats pool,
 * nothing over a link and no CPU AdamW time; auto takes it only when the
 * input allows it (the engine does on cuda) and only when it fits; the
 * forced option is refused with W off the device or at world > 1. */
static void test_optim_vram(void **state)
{
	struct st_plan_input in = input(tiny);
	struct st_plan p;
	const struct st_plan_pool *x;
	int U = st_model_unit_count(tiny);
	uint64_t E = 0, want = 0, need;

	ST_UNUSED(state);
	for (int u = 0; u < U; u++) {
		uint64_t e = st_model_unit_layout(tiny, u)->elems;

		E = e > E ? e : E;
		want += e * (2 + 16);
	}
	in.optim = ST_OFFLOAD_VRAM;
	p = plan_ok(&in);
	expect_list(&p);
	assert_int_equal(p.w_home, ST_HOME_VRAM);
	assert_int_equal(p.optim_home, ST_HOME_VRAM);
	for (int u = 0; u < U; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			assert_int_equal(st_plan_home(&p, u, (enum st_state)s), ST_HOME_VRAM);
	assert_int_equal(p.home_bytes[ST_HOME_VRAM], want);
	assert_null(find_pool(&p, ST_POOL_LANDING));
	assert_null(find_pool(&p, ST_POOL_UPD_W));
	assert_null(find_pool(&p, ST_POOL_UPD_F32));
	x = find_pool(&p, ST_POOL_STEP_SCALARS);
	assert_non_null(x);
	assert_int_equal(x->tier, ST_HOME_VRAM);
	assert_int_equal(x->count, 1);
	/* the step's losses, then the norm's sums and their scratch */
	assert_int_equal(x->bytes, st_align_up((uint64_t)in.grad_accum * in.batch * in.seq * 4, 16) +
					   16 * (uint64_t)(U + 1) + 16 * ((E + 16383) / 16384));
	assert_int_equal(p.total_bytes[ST_HOME_HOST], 0);
	assert_int_equal(p.h2d_bytes, 0);
	assert_int_equal(p.d2h_bytes, 0);
	assert_int_equal(p.nvme_read_bytes + p.nvme_write_bytes, 0);
	assert_true(p.t_adam_s == 0.0);
	st_plan_fini(&p);
	/* the host's optimizer: the step scalars are the losses alone */
	in.optim = ST_OFFLOAD_HOST;
	p = plan_ok(&in);
	x = find_pool(&p, ST_POOL_STEP_SCALARS);
	assert_non_null(x);
	assert_int_equal(x->bytes, st_align_up((uint64_t)in.grad_accum * in.batch * in.seq * 4, 16));
	assert_non_null(find_pool(&p, ST_POOL_LANDING));
	st_plan_fini(&p);
	/* auto: host unless allowed; allowed, vram while it fits (with the
	 * checkpoints held in vram: on the host they would free the page
	 * the last case takes away) */
	in.optim = ST_OFFLOAD_AUTO;
	in.activations = ST_OFFLOAD_NONE;
	p = plan_ok(&in);
	assert_int_equal(p.optim_home, ST_HOME_HOST);
	st_plan_fini(&p);
	in.optim_vram_auto = true;
	p = plan_ok(&in);
	assert_int_equal(p.optim_home, ST_HOME_VRAM);
	need = p.total_bytes[ST_HOME_VRAM];
	st_plan_fini(&p);
	in.gpu_mem_bytes = need;
	p = plan_ok(&in);
	assert_int_equal(p.optim_home, ST_HOME_VRAM);
	st_plan_fini(&p);
	in.gpu_mem_bytes = need - 4096;
	p = plan_ok(&in);
	assert_int_equal(p.optim_home, ST_HOME_HOST);
	assert_int_equal(p.w_home, ST_HOME_VRAM);
	st_plan_fini(&p);
	/* forced: refused one page short, with W off the device, at world 2 */
	in.optim = ST_OFFLOAD_VRAM;
	assert_int_equal(st_plan_make(&in, &p), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "vram budget"));
	in = input(tiny);
	in.optim = ST_OFFLOAD_VRAM;
	in.params = ST_OFFLOAD_HOST;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	assert_non_null(strstr(st_error_last(), "needs W in vram"));
	in.params = ST_OFFLOAD_AUTO;
	in.world = 2;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	assert_non_null(strstr(st_error_last(), "one rank only"));
}

/* --- the split policy --------------------------------------------------------------- */

/* Units whose G, P, M, V are all in host, and units with some in host and
 * some on nvme. */
static void count_units(const struct st_plan *p, int *whole, int *mixed)
{
	*whole = *mixed = 0;
	for (int u = 0; u < p->units; u++) {
		int host = 0;

		for (int s = ST_STATE_G; s < ST_STATE_COUNT; s++)
			host += st_plan_home(p, u, (enum st_state)s) == ST_HOME_HOST;
		*whole += host == 4;
		*mixed += host > 0 && host < 4;
	}
}

static double time_sum(const struct st_plan *p)
{
	return p->t_compute_s + p->t_copy_s + p->t_nvme_s + p->t_adam_s + p->t_net_s;
}

/* Every uniform row the budgets allow is at best as fast as the policy's
 * choice, by the planner's own prediction (the policy starts from each). */
static void expect_no_row_faster(const struct st_plan *p, struct st_plan_input in)
{
	static const enum st_offload ps[] = { ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, ST_OFFLOAD_NVME };
	static const enum st_offload os[] = { ST_OFFLOAD_HOST, ST_OFFLOAD_NVME };
	int rows = 0;

	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 2; j++) {
			struct st_plan q;

			in.params = ps[i];
			in.optim = os[j];
			if ((ps[i] == ST_OFFLOAD_NVME || os[j] == ST_OFFLOAD_NVME) && !in.have_nvme)
				continue;
			if (st_plan_make(&in, &q) != 0)
				continue;
			rows++;
			assert_false(q.split); /* both forced: nothing to split */
			assert_true(p->t_step_s <= q.t_step_s * (1 + 1e-9));
			if (p->t_step_s >= q.t_step_s * (1 - 1e-9))
				assert_true(time_sum(p) <= time_sum(&q) * (1 + 1e-9));
			st_plan_fini(&q);
		}
	assert_true(rows > 0);
}

static void test_split_policy(void **state)
{
	struct st_plan_input in = input(deep);
	int U = st_model_unit_count(deep), whole, mixed;
	uint64_t half = 0, all_g = 0;
	struct ref r;
	struct st_plan p;

	ST_UNUSED(state);
	/* Host for W in vram, the optimizer on nvme, plus the state of the
	 * first half of the units. At N = 1 G, P, M and V save as much per
	 * byte, and the update phase decides: G's write goes in the
	 * backward, its load alone in the update, while P's, M's and V's
	 * loads and stores are the update's (test_predict_prefetch). So P,
	 * M and V come first, in unit order: those 16 B per element of half
	 * the units hold P, M and V (12 B) of one unit more, and a part of
	 * the next; the small head's state fits too, and no block's G. */
	ref_pools(&in, ST_HOME_VRAM, ST_HOME_NVME, 1, &r);
	for (int u = 0; u < U / 2; u++)
		half += 16 * st_model_unit_layout(deep, u)->elems;
	in.host_mem_bytes = r.tier[ST_HOME_HOST] + half;
	p = plan_ok(&in);
	expect_list(&p);
	assert_true(p.split);
	assert_int_equal(p.w_home, ST_HOME_VRAM);
	assert_int_equal(p.optim_home, ST_HOME_NVME);
	for (int u = 0; u < U; u++) {
		assert_int_equal(st_plan_home(&p, u, ST_STATE_W), ST_HOME_VRAM);
		if (u > 0 && u < U - 1)
			assert_int_equal(st_plan_home(&p, u, ST_STATE_G), ST_HOME_NVME);
		for (int s = ST_STATE_P; s < ST_STATE_COUNT; s++) {
			if (u <= U / 2 || u == U - 1)
				assert_int_equal(st_plan_home(&p, u, (enum st_state)s), ST_HOME_HOST);
			if (u > U / 2 + 1 && u < U - 1)
				assert_int_equal(st_plan_home(&p, u, (enum st_state)s), ST_HOME_NVME);
		}
	}
	/* first fit: what is left of host is smaller than any shard on nvme */
	for (int u = 0; u < U; u++)
		for (int s = ST_STATE_G; s < ST_STATE_COUNT; s++)
			if (st_plan_home(&p, u, (enum st_state)s) == ST_HOME_NVME)
				assert_true(4 * st_model_unit_layout(deep, u)->elems >
					    in.host_mem_bytes - p.total_bytes[ST_HOME_HOST]);
	/* about half the nvme traffic of the uniform row */
	assert_true(p.nvme_read_bytes < r.homes[ST_HOME_NVME]);
	expect_no_row_faster(&p, in);
	/* the update staging is still needed for every state: the same size */
	assert_int_equal(p.update_staging_bytes, r.update);
	check_minimums(in);
	st_plan_fini(&p);

	/* Forced homes are still homes: no optimizer state moves up. */
	in.optim = ST_OFFLOAD_NVME;
	p = plan_ok(&in);
	expect_uniform(&p, ST_HOME_VRAM, ST_HOME_NVME);
	assert_false(p.split);
	st_plan_fini(&p);
	in.optim = ST_OFFLOAD_HOST; /* it does not fit in host at all */
	assert_int_equal(st_plan_make(&in, &p), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "host budget"));

	/* At N = 4 a byte of G saves 4 times what one of P, M or V does: room
	 * for every unit's G puts every G in host first. Its staging (grad
	 * staging, G's update staging) then goes, and the room it leaves
	 * takes a few shards of P, M, V, never a unit's whole state. */
	in = input(deep);
	in.grad_accum = 4;
	ref_pools(&in, ST_HOME_VRAM, ST_HOME_NVME, 1, &r);
	for (int u = 0; u < U; u++)
		all_g += 4 * st_model_unit_layout(deep, u)->elems;
	in.host_mem_bytes = r.tier[ST_HOME_HOST] + all_g;
	p = plan_ok(&in);
	expect_list(&p);
	assert_true(p.split);
	for (int u = 0; u < U; u++)
		assert_int_equal(st_plan_home(&p, u, ST_STATE_G), ST_HOME_HOST);
	count_units(&p, &whole, &mixed);
	assert_true(whole < 2);
	assert_null(find_pool(&p, ST_POOL_GSTAGE));
	assert_int_equal(find_pool(&p, ST_POOL_UPD_F32)->count, 2 * 3);
	assert_int_equal(p.nvme_read_bytes, p.nvme_write_bytes - 0); /* no W on nvme */
	expect_no_row_faster(&p, in);
	check_minimums(in);
	st_plan_fini(&p);

	/* W: vram halfway between W streamed from host and every W in vram:
	 * the blocks (fetched twice a micro-batch) go to vram as far as they
	 * fit; the embedding and the head (fetched once, as costly in h2d
	 * from host as from vram at N = 1) stay in host. */
	in = input(deep);
	ref_pools(&in, ST_HOME_VRAM, ST_HOME_HOST, 1, &r);
	in.gpu_mem_bytes = r.tier[ST_HOME_VRAM];
	ref_pools(&in, ST_HOME_HOST, ST_HOME_HOST, 1, &r);
	in.gpu_mem_bytes = page((in.gpu_mem_bytes + r.tier[ST_HOME_VRAM]) / 2);
	p = plan_ok(&in);
	expect_list(&p);
	assert_true(p.split);
	{
		int vram = 0;

		assert_int_equal(st_plan_home(&p, 0, ST_STATE_W), ST_HOME_HOST);
		assert_int_equal(st_plan_home(&p, U - 1, ST_STATE_W), ST_HOME_HOST);
		for (int u = 0; u < U; u++) {
			vram += st_plan_home(&p, u, ST_STATE_W) == ST_HOME_VRAM;
			assert_int_not_equal(st_plan_home(&p, u, ST_STATE_W), ST_HOME_NVME);
			for (int s = ST_STATE_G; s < ST_STATE_COUNT; s++)
				assert_int_equal(st_plan_home(&p, u, (enum st_state)s), ST_HOME_HOST);
		}
		assert_true(vram > 0 && vram < U - 2);
		/* in unit order: the first blocks */
		for (int u = 1; u <= vram; u++)
			assert_int_equal(st_plan_home(&p, u, ST_STATE_W), ST_HOME_VRAM);
	}
	expect_no_row_faster(&p, in);
	check_minimums(in);
	st_plan_fini(&p);
	/* forced W in host: no W moves */
	in.params = ST_OFFLOAD_HOST;
	p = plan_ok(&in);
	expect_uniform(&p, ST_HOME_HOST, ST_HOME_HOST);
	st_plan_fini(&p);

	/* The example: GPT-2 XL, 8G vram, 16G host. W (2.9 GiB) in
	 * vram; of the optimizer state (23.2 GiB), at N = 1, the P, M and V
	 * of as many units as fit in host, in unit order (one unit split by
	 * state at the edge), G on nvme but the small head's, and less of the
	 * host budget left unused than one shard. */
	{
		struct st_model *xl = model_make("gpt2-xl");

		in = input(xl);
		in.batch = 8;
		in.seq = 128;
		in.gpu_mem_bytes = 8 * ST_GiB;
		in.host_mem_bytes = 16 * ST_GiB;
		p = plan_ok(&in);
		assert_true(p.split);
		{
			int pmv = 0, edge = 0;

			for (int u = 0; u < p.units; u++) {
				int host = 0;

				assert_int_equal(st_plan_home(&p, u, ST_STATE_W), ST_HOME_VRAM);
				assert_int_equal(st_plan_home(&p, u, ST_STATE_G),
						 u == p.units - 1 ? ST_HOME_HOST : ST_HOME_NVME);
				for (int s = ST_STATE_P; s < ST_STATE_COUNT; s++)
					host += st_plan_home(&p, u, (enum st_state)s) ==
						ST_HOME_HOST;
				/* a prefix of the units (and the head) */
				if (host == 3 && u < p.units - 1)
					assert_int_equal(pmv++, u);
				edge += host > 0 && host < 3;
			}
			assert_true(edge <= 1);
			assert_true(pmv > 30);
		}
		/* what is left of host is less than one block's G */
		assert_true(p.total_bytes[ST_HOME_HOST] >
			    in.host_mem_bytes - 4 * st_model_unit_layout(xl, 1)->elems);
		assert_true(p.home_bytes[ST_HOME_NVME] < 10 * ST_GiB);
		/* the nvme minimum is what the split leaves there */
		assert_int_equal(p.min_bytes[ST_HOME_NVME], p.total_bytes[ST_HOME_NVME]);
		expect_no_row_faster(&p, in);
		st_plan_fini(&p);
		st_model_destroy(xl);
	}
}

/* The engine queues each of P, M and V's first two staged update tiles
 * during the last backward (st_eng_update_prefetch: they need no G), so
 * the model counts those loads in the backward phase, not the update's:
 * the bytes are the first two tiles, in unit order, of the units where
 * the state is on nvme, cut at the update tile. */
static void test_predict_prefetch(void **state)
{
	struct st_model *wide = model_make("layers=2,dim=1024,heads=16,vocab=256,ctx=64");
	struct st_plan_input in = input(deep);
	enum st_home homes[64 * ST_STATE_COUNT];
	int U = st_model_unit_count(deep);
	uint64_t e[64], sum = 0, want, tile;
	struct st_plan p;

	ST_UNUSED(state);
	for (int u = 0; u < U; u++)
		sum += e[u] = st_model_unit_layout(deep, u)->elems;
	/* every unit's P, M, V on nvme, G in host: units 0 and 1 of each */
	for (int u = 0; u < U; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			homes[u * ST_STATE_COUNT + s] = s == ST_STATE_W ? ST_HOME_VRAM
						      : s == ST_STATE_G ? ST_HOME_HOST : ST_HOME_NVME;
	in.homes = homes;
	in.host_compute = true;
	p = plan_ok(&in);
	assert_int_equal(p.upd_prefetch_nvme_read_bytes, 3 * 4 * (e[0] + e[1]));
	assert_int_equal(p.upd_nvme_read_bytes, 3 * 4 * sum);
	assert_int_equal(p.upd_nvme_write_bytes, 3 * 4 * sum);
	/* the update phase's nvme: the rest of the loads and every store;
	 * the backward's: the prefetched loads (no G on nvme: nothing else) */
	assert_double_equal(p.t_phase_lane_s[1][2],
			    (double)(p.upd_nvme_read_bytes - p.upd_prefetch_nvme_read_bytes) /
				    p.rates.nvme_read_bps +
			    (double)p.upd_nvme_write_bytes / p.rates.nvme_write_bps, 1e-15);
	assert_double_equal(p.t_phase_lane_s[0][2],
			    (double)p.upd_prefetch_nvme_read_bytes / p.rates.nvme_read_bps, 1e-15);
	assert_double_equal(p.t_phase_lane_s[0][2] + p.t_phase_lane_s[1][2], p.t_nvme_s, 1e-15);
	st_plan_fini(&p);

	/* P on nvme in units 2, 4 and 5, M in unit 3 only, V nowhere: P's
	 * first two staged tiles are units 2 and 4, M's is unit 3 */
	for (int u = 0; u < U; u++) {
		homes[u * ST_STATE_COUNT + ST_STATE_P] =
			u == 2 || u == 4 || u == 5 ? ST_HOME_NVME : ST_HOME_HOST;
		homes[u * ST_STATE_COUNT + ST_STATE_M] = u == 3 ? ST_HOME_NVME : ST_HOME_HOST;
		homes[u * ST_STATE_COUNT + ST_STATE_V] = ST_HOME_HOST;
	}
	p = plan_ok(&in);
	assert_int_equal(p.upd_prefetch_nvme_read_bytes, 4 * (e[2] + e[4]) + 4 * e[3]);
	assert_int_equal(p.upd_nvme_read_bytes, 4 * (e[2] + e[4] + e[5]) + 4 * e[3]);
	st_plan_fini(&p);

	/* nothing staged: nothing prefetched, the update phase has no nvme */
	in.homes = NULL;
	in.optim = ST_OFFLOAD_HOST;
	p = plan_ok(&in);
	assert_int_equal(p.upd_prefetch_nvme_read_bytes, 0);
	assert_double_equal(p.t_phase_lane_s[1][2], 0, 0);
	st_plan_fini(&p);

	/* a block larger than the update tile: it is two tiles, so the
	 * embedding and the block's first tile are each state's first two */
	in = input(wide);
	in.optim = ST_OFFLOAD_NVME;
	p = plan_ok(&in);
	tile = p.tile_elems;
	want = st_model_unit_layout(wide, 0)->elems + tile;
	assert_true(st_model_unit_layout(wide, 1)->elems > tile);
	assert_int_equal(tile, ST_UPDATE_TILE_ELEMS);
	assert_int_equal(p.upd_prefetch_nvme_read_bytes, 3 * 4 * want);
	st_plan_fini(&p);
	st_model_destroy(wide);
}

/* The next step's first forward runs beside the update sweep (the update
 * after the backward): its W fetches, units 0..U-2 once, go to the update
 * phase; with the update in the backward the next forward is the next
 * step's own, in the first phase. Hand-computed on `small` (embedding
 * 6144, block 51200, head 2048 elements; W bf16). */
static void test_predict_fused_forward(void **state)
{
	struct st_plan_input in = input(small);
	const uint64_t wf = (6144 + 51200) * 2; /* W of units 0 and 1: 114688 B */
	const uint64_t g = 59392 * 4, pre = 3 * 4 * (6144 + 51200);
	struct st_plan p;

	ST_UNUSED(state);
	in.seq = 32;
	in.params = ST_OFFLOAD_NVME;
	in.optim = ST_OFFLOAD_NVME;
	in.update = ST_UPDATE_AFTER;
	p = plan_ok(&in);
	assert_false(p.in_backward);
	assert_int_equal(p.upd_fwd_nvme_read_bytes, wf);
	assert_int_equal(p.upd_fwd_h2d_bytes, wf);
	assert_int_equal(p.upd_nvme_read_bytes, 4 * g);
	assert_int_equal(p.upd_nvme_write_bytes, 3 * g + 59392 * 2);
	assert_int_equal(p.upd_h2d_bytes, 0);
	/* the update phase: the sweep's nvme (but the prefetched loads) and
	 * the fused forward's fetches; its copies: those fetches */
	assert_double_equal(p.t_phase_lane_s[1][2],
			    (double)(4 * g - pre + wf) / 1.5e9 + (3.0 * g + 59392 * 2) / 1.2e9, 1e-15);
	assert_double_equal(p.t_phase_lane_s[1][1], (double)wf / 8e9, 1e-15);
	assert_double_equal(p.t_phase_lane_s[0][2] + p.t_phase_lane_s[1][2], p.t_nvme_s, 1e-15);
	assert_double_equal(p.t_phase_lane_s[0][1] + p.t_phase_lane_s[1][1], p.t_copy_s, 1e-15);
	/* a GPU: the widens and sums are not the cores' */
	assert_int_equal(p.widen_bytes, 110592 * 6);
	assert_double_equal(p.t_widen_s, 0, 0);
	assert_double_equal(p.t_sums_s, 0, 0);
	st_plan_fini(&p);

	/* in the backward: no fused forward */
	in.update = ST_UPDATE_IN_BACKWARD;
	p = plan_ok(&in);
	assert_true(p.in_backward);
	assert_int_equal(p.upd_fwd_nvme_read_bytes, 0);
	assert_int_equal(p.upd_fwd_h2d_bytes, 0);
	assert_int_equal(p.upd_widen_bytes, 0);
	st_plan_fini(&p);

	/* layer-first at N = 2: the fused forward runs both micro-batches
	 * with each W fetched once */
	in.update = ST_UPDATE_AFTER;
	in.grad_accum = 2;
	in.schedule = ST_SCHEDULE_LAYER_FIRST;
	p = plan_ok(&in);
	assert_int_equal(p.upd_fwd_nvme_read_bytes, wf);
	assert_int_equal(p.widen_bytes, 110592 * 6);
	st_plan_fini(&p);
}

/* The update inside the backward's two phases (plan_predict.c,
 * phases_in_backward; docs/plan.md, "The update inside the backward"):
 * [1] the last backward with the whole update, its share of the compute
 * by FLOPs and of the copies and the disk by passes; the disk reads the
 * last backward's first k W fetches ahead in [0] where another lane binds
 * it (up to that lane: then the disk binds); one fill and drain a step,
 * none in a phase the disk binds. On `small` (embedding 6144, block
 * 51200, head 2048 elements; W bf16), every state on nvme: N = 1 and 2
 * batch-first, N = 2 layer-first, N = 1 at prefetch 1; a GPU and the cpu
 * device (compute, AdamW and the copies on the cores, with the update's
 * nvme sums). */
static void test_predict_in_backward(void **state)
{
	/* compute binds [0]; the disk binds; compute binds [0] but for half
	 * the read-ahead, so the disk reads ahead up to it and ties */
	static const double rates[] = { 1e8, 1e15, 0 };
	const double units_w[] = { 6144 * 2, 51200 * 2, 2048 * 2 };

	ST_UNUSED(state);
	for (int host = 0; host < 2; host++)
		for (unsigned ri = 0; ri < ST_ARRAY_LEN(rates); ri++)
			for (int c = 0; c < 4; c++) {
				struct st_plan_input in = input(small);
				struct st_plan p;
				double n = c == 1 ? 2 : 1, ahead_s, busy0, idle, others = 0;
				double t[5], upd[5], L0[5], L1[5], ahead = 0;
				int arg[2] = { 0, 0 };

				in.seq = 32;
				in.params = ST_OFFLOAD_NVME;
				in.optim = ST_OFFLOAD_NVME;
				in.update = ST_UPDATE_IN_BACKWARD;
				in.grad_accum = c == 1 || c == 2 ? 2 : 1;
				in.schedule = c == 2 ? ST_SCHEDULE_LAYER_FIRST : ST_SCHEDULE_BATCH_FIRST;
				in.prefetch = c == 3 ? 1 : 0;
				in.host_compute = host;
				in.rates.compute_flops = rates[ri] > 0 ? rates[ri] : 1e15;
				/* the cores' passes at their own rates, not the copies' */
				in.rates.widen_bps = 24e9;
				in.rates.sum_bps = 16e9;
				p = plan_ok(&in);
				if (rates[ri] == 0) {
					/* [0]'s cores or compute at no FLOP time, its
					 * disk before the read-ahead (which it does not
					 * get here), and that read-ahead's time: the
					 * FLOPs' rate that puts compute half way */
					double f0 = 1 - 2.0 / 3.0 / n, base = p.t_phase_lane_s[0][0];
					double want = (double)p.bwd_ahead_nvme_read_bytes / 1.5e9;
					double target = p.t_phase_lane_s[0][2] + want / 2;

					assert_true(target > base);
					in.rates.compute_flops = p.compute_flops_step * f0 / (target - base);
					st_plan_fini(&p);
					p = plan_ok(&in);
				}
				assert_true(p.in_backward);
				/* the backward fetches units 2, 1 and 0, but a
				 * resident one (the embedding: kept widened since
				 * its forward); the first k of them ahead */
				assert_true(c == 3 ? p.prefetch == 1 : p.prefetch == 3);
				assert_true(st_model_unit_layout(small, 0)->resident);
				for (int u = 2, k = p.prefetch; u >= 0 && k > 0; u--)
					if (u == 2 || !st_model_unit_layout(small, u)->resident) {
						ahead += units_w[u];
						k--;
					}
				assert_int_equal(p.bwd_ahead_nvme_read_bytes, (uint64_t)ahead);
				t[0] = p.t_compute_s;
				t[1] = p.t_copy_s;
				t[2] = p.t_nvme_s;
				t[3] = p.t_adam_s;
				t[4] = p.t_net_s;
				upd[0] = host ? (double)(p.upd_nvme_read_bytes + p.upd_nvme_write_bytes) /
							16e9
					      : 0;
				upd[1] = (double)p.upd_h2d_bytes / 8e9;
				upd[2] = (double)p.upd_nvme_read_bytes / 1.5e9 +
					 (double)p.upd_nvme_write_bytes / 1.2e9;
				upd[3] = t[3];
				upd[4] = 0;
				for (int i = 0; i < 5; i++) {
					double f = i == 1 || i == 2 ? 0.5 / n : 2.0 / 3.0 / n;

					L0[i] = (t[i] - upd[i]) * (1 - f);
					L1[i] = (t[i] - upd[i]) * f + upd[i];
				}
				busy0 = fmax(fmax(L0[0], L0[1]), fmax(L0[3], L0[4]));
				if (host)
					busy0 = fmax(busy0, L0[0] + (L0[3] + L0[1]));
				idle = busy0 - L0[2];
				ahead_s = fmin(ahead / 1.5e9, fmin(idle, L1[2] - upd[2]));
				if (ri != 1)
					assert_true(ahead_s > 0); /* the disk has time in [0] */
				if (ri == 2) /* up to the cores or the compute */
					assert_true(ahead_s == idle && idle < ahead / 1.5e9);
				if (ahead_s > 0) {
					L0[2] = ahead_s == idle ? busy0 : L0[2] + ahead_s;
					L1[2] -= ahead_s;
				}
				for (int ph = 0; host && ph < 2; ph++) {
					double *L = ph ? L1 : L0;

					L[0] += L[3] + L[1];
					L[1] = L[3] = 0;
				}
				for (int i = 0; i < 5; i++) {
					assert_double_equal(p.t_phase_lane_s[0][i], L0[i],
							    1e-12 * t[i] + 1e-18);
					assert_double_equal(p.t_phase_lane_s[1][i], L1[i],
							    1e-12 * t[i] + 1e-18);
				}
				/* the busiest lane of each phase, the disk on a tie */
				for (int ph = 0; ph < 2; ph++) {
					const double *L = ph ? L1 : L0;

					for (int i = 1; i < 5; i++)
						if (L[i] > L[arg[ph]])
							arg[ph] = i;
					if (L[2] >= L[arg[ph]])
						arg[ph] = 2;
					assert_string_equal(p.phase_bound[ph], arg[ph] == 2 ? "nvme"
									   : p.phase_bound[ph]);
				}
				if (ri == 2) /* the tie: the disk binds [0] */
					assert_int_equal(arg[0], 2);
				if (ri == 1) { /* the disk binds both: no fill or drain */
					assert_int_equal(arg[0], 2);
					assert_int_equal(arg[1], 2);
					assert_double_equal(p.t_serial_s, 0, 0);
					assert_double_equal(p.t_step_s, L0[2] + L1[2], 1e-12 * t[2]);
				}
				for (int ph = 0; ph < 2; ph++)
					for (int i = 0; i < 5 && arg[ph] != 2; i++)
						if (i != arg[ph])
							others += ph ? L1[i] : L0[i];
				assert_double_equal(p.t_serial_s, others / 3, 1e-12 * p.t_step_s);
				assert_double_equal(p.t_step_s, L0[arg[0]] + L1[arg[1]] + p.t_serial_s,
						    1e-12 * p.t_step_s);
				st_plan_fini(&p);
			}
}

/* More budget never hurts: from a tier's minimum upwards every budget is
 * accepted (what makes the minimum exact beyond the 4 KiB either side
 * that check_minimums() tries), the traffic time never grows, and the
 * predicted step grows by at most the time of the loads queued during
 * the backward: a staged shard that moves to host can make a larger one
 * of the first two tiles, whose load then goes to the backward phase,
 * which may lengthen it more than it shortens an update phase bound by
 * something else (test_predict_prefetch). */
static void test_budget_monotone(void **state)
{
	const struct st_model *ms[] = { tiny, deep };

	ST_UNUSED(state);
	for (unsigned mi = 0; mi < ST_ARRAY_LEN(ms); mi++)
		for (int accum = 1; accum <= 4; accum *= 4)
			for (int t = ST_HOME_VRAM; t <= ST_HOME_HOST; t++) {
				struct st_plan_input in = input(ms[mi]);
				struct st_plan p;
				double step = INFINITY, traffic = INFINITY, slack;
				uint64_t lo, hi, pre = 0;

				in.grad_accum = accum;
				p = plan_ok(&in);
				lo = p.min_bytes[t];
				hi = p.total_bytes[t] + 2 * ST_MiB;
				st_plan_fini(&p);
				for (uint64_t b = lo; b <= hi; b += 16 * 4096) {
					double tr;

					*budget_of(&in, t) = b;
					p = plan_ok(&in);
					tr = p.t_copy_s + p.t_nvme_s;
					slack = (double)ST_MAX(pre, p.upd_prefetch_nvme_read_bytes) /
						p.rates.nvme_read_bps;
					if (p.t_step_s > step * (1 + 1e-9) + slack ||
					    tr > traffic * (1 + 1e-9))
						fail_msg("model %u accum %d %s budget %" PRIu64 ": step %g "
							 "(was %g), traffic %g (was %g)", mi, accum,
							 st_home_name((enum st_home)t), b, p.t_step_s, step,
							 tr, traffic);
					step = p.t_step_s;
					traffic = tr;
					pre = p.upd_prefetch_nvme_read_bytes;
					st_plan_fini(&p);
				}
			}
}

/* A placement with no G, P, M or V on nvme stages none of them: W's update
 * staging alone when W is in vram, none when W is in host. */
static void test_update_staging_per_state(void **state)
{
	struct st_plan_input in = input(tiny);
	enum st_home homes[64 * ST_STATE_COUNT];
	int U = st_model_unit_count(tiny);
	uint64_t tile = 0;
	struct st_plan p;

	ST_UNUSED(state);
	for (int u = 0; u < U; u++)
		if (st_model_unit_layout(tiny, u)->elems > tile)
			tile = st_model_unit_layout(tiny, u)->elems;
	in.params = ST_OFFLOAD_NONE;
	in.optim = ST_OFFLOAD_HOST;
	p = plan_ok(&in);
	assert_null(find_pool(&p, ST_POOL_UPD_F32));
	assert_int_equal(find_pool(&p, ST_POOL_UPD_W)->count, 2);
	assert_int_equal(p.update_staging_bytes, 2 * page(tile * 2));
	st_plan_fini(&p);
	in.params = ST_OFFLOAD_HOST;
	p = plan_ok(&in);
	assert_null(find_pool(&p, ST_POOL_UPD_F32));
	assert_null(find_pool(&p, ST_POOL_UPD_W));
	assert_int_equal(p.update_staging_bytes, 0);
	st_plan_fini(&p);
	/* explicit: only M on nvme (one unit), W in host: two fp32 buffers */
	for (int u = 0; u < U; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			homes[u * ST_STATE_COUNT + s] =
				s == ST_STATE_M && u == 2 ? ST_HOME_NVME : ST_HOME_HOST;
	in.homes = homes;
	p = plan_ok(&in);
	expect_list(&p);
	assert_null(find_pool(&p, ST_POOL_UPD_W));
	assert_int_equal(find_pool(&p, ST_POOL_UPD_F32)->count, 2);
	assert_true(st_plan_upd_staged(&p, ST_STATE_M));
	assert_false(st_plan_upd_staged(&p, ST_STATE_G));
	assert_int_equal(p.update_staging_bytes, 2 * page(tile * 4));
	st_plan_fini(&p);
}

/* --- activation checkpoints on the host -------------------------------------- */

static void test_activations(void **state)
{
	static const enum st_offload ps[] = { ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, ST_OFFLOAD_NVME };
	const struct st_model *ms[] = { tiny, deep, small };
	struct st_plan_input in;
	struct st_plan p, q;
	struct ref rv, rh;
	char *text;
	json_object *root;

	ST_UNUSED(state);
	/* forced host: the pools, and the traffic of the vram plan plus a d2h
	 * and an h2d of each of checkpoints 1..U-1-A per micro-batch */
	for (unsigned mi = 0; mi < ST_ARRAY_LEN(ms); mi++)
		for (int i = 0; i < 3; i++)
			for (int a = 1; a <= 3; a += 2) {
				int U = st_model_unit_count(ms[mi]), A = U - 1 < 2 ? U - 1 : 2;
				uint64_t xa, moved;

				in = input(ms[mi]);
				in.params = ps[i];
				in.grad_accum = a;
				in.seq = 24 + 3 * i;
				in.batch = 1 + a;
				xa = ((uint64_t)in.batch * in.seq * st_model_config(ms[mi])->dim * 4 +
				      255) / 256 * 256;
				in.activations = ST_OFFLOAD_HOST;
				p = plan_ok(&in);
				expect_matches_ref(&p, &in);
				assert_int_equal(p.act_home, ST_HOME_HOST);
				assert_int_equal(p.act_slots, A);
				assert_int_equal(p.act_offloaded, U - 1 - A);
				moved = (uint64_t)(U - 1 - A) * xa;
				assert_int_equal(p.act_copy_bytes, moved);
				in.activations = ST_OFFLOAD_NONE;
				q = plan_ok(&in);
				expect_matches_ref(&q, &in);
				assert_int_equal(q.act_home, ST_HOME_VRAM);
				assert_int_equal(q.act_offloaded, 0);
				assert_int_equal(p.h2d_bytes, q.h2d_bytes + (uint64_t)a * moved);
				assert_int_equal(p.d2h_bytes, q.d2h_bytes + (uint64_t)a * moved);
				assert_true(moved == 0 || p.t_copy_s > q.t_copy_s);
				st_plan_fini(&p);
				st_plan_fini(&q);
			}

	/* auto: in vram while the vram budget holds them with the rest, on
	 * the host one page below; forced vram is refused there, naming the
	 * vram-held minimum; the vram minimum is the host-held one */
	in = input(deep);
	in.params = ST_OFFLOAD_NONE;
	in.optim = ST_OFFLOAD_HOST;
	in.seq = 256;
	ref_pools(&in, ST_HOME_VRAM, ST_HOME_HOST, 1, &rv);
	in.activations = ST_OFFLOAD_HOST;
	ref_pools(&in, ST_HOME_VRAM, ST_HOME_HOST, 1, &rh);
	assert_true(rh.tier[ST_HOME_VRAM] < rv.tier[ST_HOME_VRAM]);
	in.activations = ST_OFFLOAD_AUTO;
	in.gpu_mem_bytes = rv.tier[ST_HOME_VRAM];
	p = plan_ok(&in);
	assert_int_equal(p.act_home, ST_HOME_VRAM);
	assert_int_equal(p.min_bytes[ST_HOME_VRAM], rh.tier[ST_HOME_VRAM]);
	st_plan_fini(&p);
	in.gpu_mem_bytes -= 4096;
	p = plan_ok(&in);
	assert_int_equal(p.act_home, ST_HOME_HOST);
	assert_int_equal(p.w_home, ST_HOME_VRAM);
	expect_matches_ref(&p, &in);
	/* the plan says so, in JSON too */
	text = st_plan_json(&p, &in);
	root = json_tokener_parse(text);
	assert_non_null(root);
	{
		json_object *o, *v;

		assert_true(json_object_object_get_ex(root, "activations", &o));
		assert_true(json_object_object_get_ex(o, "home", &v));
		assert_string_equal(json_object_get_string(v), "host");
		assert_int_equal(jget_u(root, "activations", "offloaded", NULL),
				 (uint64_t)p.act_offloaded);
		assert_int_equal(jget_u(root, "activations", "copy_bytes_per_micro_batch", NULL),
				 p.act_copy_bytes);
		assert_int_equal(jget_u(root, "activations", "vram_bytes", NULL), p.act_bytes);
		assert_int_equal(jget_u(root, "activations", "host_bytes", NULL), p.act_host_bytes);
	}
	json_object_put(root);
	free(text);
	st_plan_fini(&p);
	in.activations = ST_OFFLOAD_NONE;
	expect_refusal(&in, ST_HOME_VRAM, in.gpu_mem_bytes, rv.tier[ST_HOME_VRAM]);
	/* minimums exact with the checkpoints free to move, and forced */
	in.activations = ST_OFFLOAD_AUTO;
	check_minimums(in);
	in.activations = ST_OFFLOAD_HOST;
	check_minimums(in);
	in = input(deep);
	in.activations = ST_OFFLOAD_AUTO;
	in.gpu_mem_bytes = rh.tier[ST_HOME_VRAM];
	check_minimums(in);

	/* the checkpoints never go to nvme */
	in = input(tiny);
	in.activations = ST_OFFLOAD_NVME;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	assert_non_null(strstr(st_error_last(), "--offload-activations"));
}

static void test_bad_input(void **state)
{
	struct st_plan_input in;
	struct st_plan p;

	ST_UNUSED(state);
	in = input(small);
	in.seq = 33;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	in = input(small);
	in.prefetch = 4;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	in.prefetch = -1;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	in = input(small);
	in.batch = 0;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	in = input(small);
	in.grad_accum = 0;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	in = input(small);
	in.rates.copy_bps = -1;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	in.rates.copy_bps = NAN;
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	in = input(NULL);
	assert_int_equal(st_plan_make(&in, &p), -EINVAL);
	assert_string_equal(st_state_name(ST_STATE_V), "V");
	assert_string_equal(st_home_name(ST_HOME_NVME), "nvme");
}

/* --update in-backward at ZeRO stages 1 and 2 (world 2): planned, with
 * the alternates of the rank's P, M, V; its bytes are the update after's
 * but for the rank's slice of each unit's W, which goes home in the
 * backward and back for the commit's gather: on nvme a write and a read,
 * in vram an h2d and a d2h, in host nothing on a link; and for the
 * write and the update's load of the rank's final G slice (on nvme),
 * which it neither writes nor reads back. */
static void test_in_backward_zero12(void **state)
{
	static const enum st_offload ps[] = { ST_OFFLOAD_NVME, ST_OFFLOAD_NONE, ST_OFFLOAD_HOST };

	ST_UNUSED(state);
	for (int z = 1; z <= 2; z++)
		for (int i = 0; i < 3; i++) {
			struct st_plan_input in = input(tiny);
			struct st_plan p, q;
			uint64_t ws = 0, alt = 0, gs = 0;
			bool nv = ps[i] == ST_OFFLOAD_NVME, vr = ps[i] == ST_OFFLOAD_NONE;

			in.world = 2;
			in.zero = z;
			in.params = ps[i];
			in.optim = ST_OFFLOAD_NVME;
			assert_int_equal(st_plan_make(&in, &q), 0);
			assert_false(q.in_backward);
			in.update = ST_UPDATE_IN_BACKWARD;
			assert_int_equal(st_plan_make(&in, &p), 0);
			assert_true(p.in_backward);
			for (int u = 0; u < p.units; u++) {
				ws += p.slice_elems[u] * 2;
				gs += p.slice_elems[u] * 4;
				for (int s = ST_STATE_P; s <= ST_STATE_V; s++)
					alt += p.state_bytes[u * ST_STATE_COUNT + s];
			}
			assert_int_equal(p.alt_bytes, alt);
			assert_int_equal(p.nvme_write_bytes, q.nvme_write_bytes + (nv ? ws : 0) - gs);
			assert_int_equal(p.nvme_read_bytes, q.nvme_read_bytes + (nv ? ws : 0) - gs);
			assert_int_equal(p.h2d_bytes, q.h2d_bytes + (vr ? ws : 0));
			assert_int_equal(p.d2h_bytes, q.d2h_bytes + (vr ? ws : 0));
			st_plan_fini(&p);
			st_plan_fini(&q);
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_recompute),
		cmocka_unit_test(test_big_budgets),
		cmocka_unit_test(test_small_vram_streams_w),
		cmocka_unit_test(test_small_host_optim_nvme),
		cmocka_unit_test(test_forced),
		cmocka_unit_test(test_minimum_exact),
		cmocka_unit_test(test_zero_budgets),
		cmocka_unit_test(test_pools_match_formulas),
		cmocka_unit_test(test_prefetch_auto),
		cmocka_unit_test(test_traffic_hand_computed),
		cmocka_unit_test(test_predict_prefetch),
		cmocka_unit_test(test_predict_fused_forward),
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_rates_from_bench),
		cmocka_unit_test(test_rates_file),
		cmocka_unit_test(test_rates_from_lanes),
		cmocka_unit_test(test_hide_accum),
		cmocka_unit_test(test_pool_list),
		cmocka_unit_test(test_pools_layer_first),
		cmocka_unit_test(test_split_slots),
		cmocka_unit_test(test_split_policy),
		cmocka_unit_test(test_update_staging_per_state),
		cmocka_unit_test(test_budget_monotone),
		cmocka_unit_test(test_optim_vram),
		cmocka_unit_test(test_bad_input),
		cmocka_unit_test(test_activations),
		cmocka_unit_test(test_in_backward_zero12),
		cmocka_unit_test(test_predict_in_backward),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
