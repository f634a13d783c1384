/* GPT-2 units: config parsing, layouts, init, finite-difference checks of
 * every unit's bwd against its fwd, loss at init, overfitting one batch,
 * and bitwise determinism across thread counts. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/compute.h"
#include "strata/device.h"
#include "strata/kernels.h"
#include "strata/model.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_net.h"

static const struct st_model_config small_cfg = {
	.n_layer = 2, .dim = 32, .n_head = 4, .vocab = 37, .ctx = 80};

/* ---- config and layout ----------------------------------------------------------------- */

static void test_config(void **state)
{
	(void)state;
	struct st_model_config c;
	assert_int_equal(st_model_config_parse("gpt2", &c), 0);
	assert_int_equal(c.n_layer, 12);
	assert_int_equal(c.dim, 768);
	assert_int_equal(c.vocab, 50257);
	assert_int_equal(st_model_config_parse("gpt2-xl", &c), 0);
	assert_int_equal(c.dim, 1600);
	assert_int_equal(st_model_config_parse("tiny", &c), 0);
	assert_int_equal(c.vocab, 256);
	assert_int_equal(st_model_config_parse("ctx=64,layers=3,dim=48,heads=6,vocab=100", &c), 0);
	assert_int_equal(c.n_layer, 3);
	assert_int_equal(c.dim, 48);
	assert_int_equal(c.n_head, 6);
	assert_int_equal(c.vocab, 100);
	assert_int_equal(c.ctx, 64);
	static const char *bad[] = {
		"", "gpt3", "layers=2,dim=48,heads=5,vocab=10,ctx=8", /* 48 % 5 */
		"layers=2,dim=48,heads=4,vocab=10",                   /* no ctx */
		"layers=2,dim=48,heads=4,vocab=10,ctx=8,",
		"layers=2,dim=48,heads=4,vocab=10,ctx=8,ctx=9",
		"layers=0,dim=48,heads=4,vocab=10,ctx=8",
		"layers=-1,dim=48,heads=4,vocab=10,ctx=8",
		"layers=2,dim=4x8,heads=4,vocab=10,ctx=8",
		"layers=2,dim=48,heads=4,vocab=10,ctx=8,depth=3",
		"layers=2,dim=48,heads=4,vocab=10,ctx",
		"layers=2,dim=99999999999,heads=4,vocab=10,ctx=8",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		st_error_clear();
		if (st_model_config_parse(bad[i], &c) != -EINVAL)
			fail_msg("'%s' was accepted", bad[i]);
		assert_true(strlen(st_error_last()) > 0);
	}
}

static void test_layout(void **state)
{
	(void)state;
	struct st_model_config c;
	struct st_model *m;
	assert_int_equal(st_model_config_parse("gpt2", &c), 0);
	assert_int_equal(st_model_create(&c, &m), 0);
	assert_int_equal(st_model_unit_count(m), 14);
	/* GPT-2 small: V*C + T*C + L*(12C^2 + 13C) + 2C */
	uint64_t L = 12, C = 768, V = 50257, T = 1024;
	assert_true(st_model_param_count(m) == V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C);
	uint64_t total = 0;
	for (int u = 0; u < 14; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(m, u);
		assert_int_equal(ul->elems % 2048, 0);
		assert_true(ul->elems * 2 % 4096 == 0);
		uint64_t end = 0, sum = 0;
		for (int k = 0; k < ul->n_tensors; k++) {
			const struct st_tensor_layout *t = &ul->tensors[k];
			assert_int_equal(t->offset_elems % 64, 0);
			assert_true(t->offset_elems >= end); /* no overlap */
			end = t->offset_elems + t->n_elems;
			assert_true(t->n_elems == (uint64_t)(t->shape[0] * t->shape[1]));
			sum += t->n_elems;
		}
		assert_true(end <= ul->elems);
		assert_true(sum == ul->param_elems);
		total += sum;
	}
	assert_true(total == st_model_param_count(m));
	int u, k;
	assert_int_equal(st_model_find_tensor(m, "h.3.attn.c_attn.weight", &u, &k), 0);
	const struct st_tensor_layout *t = &st_model_unit_layout(m, u)->tensors[k];
	assert_int_equal(u, 4);
	assert_int_equal(t->shape[0], 768);
	assert_int_equal(t->shape[1], 2304);
	assert_true(t->decay);
	assert_int_equal(st_model_find_tensor(m, "h.11.mlp.c_proj.weight", &u, &k), 0);
	t = &st_model_unit_layout(m, u)->tensors[k];
	assert_int_equal(t->shape[0], 3072);
	assert_int_equal(t->shape[1], 768);
	assert_int_equal(st_model_find_tensor(m, "h.0.ln_1.bias", &u, &k), 0);
	assert_false(st_model_unit_layout(m, u)->tensors[k].decay);
	assert_int_equal(st_model_find_tensor(m, "wte.weight", &u, &k), 0);
	assert_int_equal(u, 0);
	assert_true(st_model_unit_layout(m, u)->tensors[k].decay);
	assert_int_equal(st_model_find_tensor(m, "ln_f.weight", &u, &k), 0);
	assert_int_equal(u, 13);
	assert_int_equal(st_model_find_tensor(m, "lm_head.weight", &u, &k), -ENOENT);
	/* the tie as data: the head reads unit 0, which stays resident */
	assert_int_equal(st_model_unit_layout(m, 13)->reads_unit, 0);
	assert_true(st_model_unit_layout(m, 0)->resident);
	for (u = 1; u < 13; u++) {
		assert_int_equal(st_model_unit_layout(m, u)->reads_unit, -1);
		assert_false(st_model_unit_layout(m, u)->resident);
	}
	assert_int_equal(st_model_act_bytes(m, 0, 2, 16), 2 * 16 * 768 * 4);
	assert_int_equal(st_model_act_bytes(m, 13, 2, 16), 0);
	st_model_destroy(m);
	st_model_destroy(NULL);
}

static void test_init(void **state)
{
	(void)state;
	struct st_model_config c = {.n_layer = 8, .dim = 256, .n_head = 4,
				    .vocab = 300, .ctx = 64};
	struct st_model *m;
	assert_int_equal(st_model_create(&c, &m), 0);
	int U = st_model_unit_count(m);
	const struct st_unit_layout *ul = st_model_unit_layout(m, 3);
	float *a = malloc(ul->elems * 4), *b = malloc(ul->elems * 4);
	/* per unit and thread count independent; padding zero */
	memset(b, 0x7f, ul->elems * 4);
	int saved = omp_get_max_threads();
	omp_set_num_threads(1);
	assert_int_equal(st_model_init_unit(m, 3, 42, a), 0);
	omp_set_num_threads(3);
	assert_int_equal(st_model_init_unit(m, 3, 42, b), 0);
	omp_set_num_threads(saved);
	assert_memory_equal(a, b, ul->elems * 4);
	assert_int_equal(st_model_init_unit(m, 3, 43, b), 0);
	assert_memory_not_equal(a, b, ul->elems * 4);
	for (int k = 0; k < ul->n_tensors; k++) {
		const struct st_tensor_layout *t = &ul->tensors[k];
		const float *p = a + t->offset_elems;
		double s = 0, s2 = 0;
		for (uint64_t i = 0; i < t->n_elems; i++) {
			s += p[i];
			s2 += (double)p[i] * p[i];
		}
		double mean = s / t->n_elems, sd = sqrt(s2 / t->n_elems - mean * mean);
		if (strstr(t->name, ".bias")) {
			assert_true(s2 == 0.0);
		} else if (strstr(t->name, "ln_")) {
			assert_true(s == (double)t->n_elems && sd == 0.0);
		} else {
			double want = 0.02;
			if (strstr(t->name, "c_proj.weight"))
				want /= sqrt(2.0 * c.n_layer);
			/* n >= 65536 samples: sd within 2%, mean within 4 sd/sqrt(n) */
			if (fabs(sd - want) > 0.02 * want || fabs(mean) > 4 * want / sqrt((double)t->n_elems))
				fail_msg("%s: mean %g sd %g want sd %g", t->name, mean, sd, want);
		}
		if (k + 1 < ul->n_tensors)
			for (uint64_t i = t->offset_elems + t->n_elems; i < ul->tensors[k + 1].offset_elems; i++)
				assert_true(a[i] == 0.0f);
	}
	for (uint64_t i = ul->tensors[ul->n_tensors - 1].offset_elems +
			  ul->tensors[ul->n_tensors - 1].n_elems; i < ul->elems; i++)
		assert_true(a[i] == 0.0f);
	/* different units draw different values */
	const struct st_unit_layout *ul4 = st_model_unit_layout(m, 4);
	float *d = malloc(ul4->elems * 4);
	assert_int_equal(st_model_init_unit(m, 4, 42, d), 0);
	assert_memory_not_equal(a + ul->tensors[2].offset_elems, d + ul4->tensors[2].offset_elems, 1024);
	/* the normal's tails are right: fraction beyond 2 sd ~ 4.55% */
	const struct st_unit_layout *e = st_model_unit_layout(m, 0);
	float *ep = malloc(e->elems * 4);
	assert_int_equal(st_model_init_unit(m, 0, 7, ep), 0);
	size_t beyond = 0, n = e->tensors[0].n_elems;
	for (size_t i = 0; i < n; i++)
		beyond += fabsf(ep[i]) > 0.04f;
	assert_true(fabs((double)beyond / n - 0.0455) < 0.004);
	assert_int_equal(st_model_init_unit(m, U, 7, ep), -EINVAL);
	free(a); free(b); free(d); free(ep);
	st_model_destroy(m);
}

static void test_unit_gradients(void **state)
{
	(void)state;
	struct net n;
	/* T = 70 > one attention block; weights larger than init so every
	 * path (LN gains, attention scores) carries signal */
	net_init(&n, &small_cfg, 2, 70, 5);
	for (int u = 0; u < n.U; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(n.m, u);
		for (int k = 0; k < ul->n_tensors; k++) {
			const struct st_tensor_layout *t = &ul->tensors[k];
			float *p = n.p[u] + t->offset_elems;
			for (uint64_t i = 0; i < t->n_elems; i++)
				p[i] = strstr(t->name, "ln_") && strstr(t->name, "weight")
					       ? 1.0f + 0.3f * rng_f() : 0.3f * rng_f();
		}
	}
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % small_cfg.vocab);
		n.tgt[i] = (int32_t)(rng_u64() % small_cfg.vocab);
	}
	net_fwd(&n); /* the real unit inputs x[u] */
	net_unit_gradients(&n);
	net_fini(&n);
}

/* The whole model: dwte gathers the embedding's and the head's uses. */
struct whole_ctx {
	struct net *n;
};

static double whole_loss(void *p)
{
	return net_fwd(((struct whole_ctx *)p)->n);
}

static void test_tied_whole_model(void **state)
{
	(void)state;
	struct net n;
	net_init(&n, &small_cfg, 2, 9, 11);
	float *wte = n.p[0];
	size_t nw = st_model_unit_layout(n.m, 0)->tensors[0].n_elems;
	for (size_t i = 0; i < nw; i++)
		wte[i] = 0.5f * rng_f();
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % small_cfg.vocab);
		n.tgt[i] = (int32_t)(rng_u64() % small_cfg.vocab);
	}
	net_fwd(&n);
	net_bwd(&n);
	struct whole_ctx c = {&n};
	const float eps = 1e-2f;
	float *v = malloc(nw * 4), *x0 = malloc(nw * 4);
	for (size_t i = 0; i < nw; i++)
		v[i] = rng_f();
	memcpy(x0, wte, nw * 4);
	for (size_t i = 0; i < nw; i++)
		wte[i] = x0[i] + eps * v[i];
	double lp = whole_loss(&c);
	for (size_t i = 0; i < nw; i++)
		wte[i] = x0[i] - eps * v[i];
	double lm = whole_loss(&c);
	memcpy(wte, x0, nw * 4);
	double fd = (lp - lm) / (2 * eps), an = 0;
	for (size_t i = 0; i < nw; i++)
		an += (double)n.g[0][i] * v[i];
	if (!(fabs(fd - an) <= 2e-3 * fmax(fabs(fd), fabs(an)) + 1e-6))
		fail_msg("whole-model dwte: finite difference %.9g analytic %.9g", fd, an);
	free(v);
	free(x0);
	net_fini(&n);
}

/* ---- loss, training, determinism ------------------------------------------------------------ */

static void test_loss_at_init(void **state)
{
	(void)state;
	struct st_model_config c;
	assert_int_equal(st_model_config_parse("tiny", &c), 0);
	struct net n;
	net_init(&n, &c, 2, 64, 1);
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % 256);
		n.tgt[i] = (int32_t)(rng_u64() % 256);
	}
	float loss = net_fwd(&n);
	/* logits have sd ~ 0.02 sqrt(C) = 0.23: expected loss ln V + ~0.03 */
	if (!(fabs(loss - log(256.0)) < 0.1))
		fail_msg("loss at init %g, ln(V) = %g", loss, log(256.0));
	net_fini(&n);
}

/* Plain AdamW over every unit's fp32 flat buffer (decay on matrices). */
static void adamw(struct net *n, float **mom, float **vel, int step, float lr)
{
	const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.0f;
	float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
	for (int u = 0; u < n->U; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(n->m, u);
		for (int k = 0; k < ul->n_tensors; k++) {
			const struct st_tensor_layout *t = &ul->tensors[k];
			for (uint64_t i = t->offset_elems; i < t->offset_elems + t->n_elems; i++) {
				float g = n->g[u][i];
				mom[u][i] = b1 * mom[u][i] + (1 - b1) * g;
				vel[u][i] = b2 * vel[u][i] + (1 - b2) * g * g;
				float upd = (mom[u][i] / c1) / (sqrtf(vel[u][i] / c2) + eps);
				if (t->decay)
					upd += wd * n->p[u][i];
				n->p[u][i] -= lr * upd;
			}
		}
	}
}

static void test_overfit(void **state)
{
	(void)state;
	struct st_model_config c = {.n_layer = 2, .dim = 64, .n_head = 4,
				    .vocab = 256, .ctx = 32};
	struct net n;
	net_init(&n, &c, 2, 32, 3);
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % 256);
		n.tgt[i] = (int32_t)(rng_u64() % 256);
	}
	float **mom = calloc(n.U, sizeof(float *)), **vel = calloc(n.U, sizeof(float *));
	for (int u = 0; u < n.U; u++) {
		mom[u] = calloc(st_model_unit_layout(n.m, u)->elems, 4);
		vel[u] = calloc(st_model_unit_layout(n.m, u)->elems, 4);
	}
	float first = 0, loss = 0;
	int step;
	for (step = 1; step <= 300; step++) {
		net_fwd(&n);
		loss = net_bwd(&n);
		if (step == 1)
			first = loss;
		if (loss < 0.1f)
			break;
		adamw(&n, mom, vel, step, 3e-3f);
	}
	if (!(loss < 0.1f))
		fail_msg("did not overfit: loss %g -> %g after %d steps", first, loss, step - 1);
	for (int u = 0; u < n.U; u++) {
		free(mom[u]);
		free(vel[u]);
	}
	free(mom);
	free(vel);
	net_fini(&n);
}

static void test_determinism(void **state)
{
	(void)state;
	/* T = 80: two attention blocks; N = 160 rows: two CE chunks */
	struct net n;
	net_init(&n, &small_cfg, 2, 80, 9);
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % small_cfg.vocab);
		n.tgt[i] = (int32_t)(rng_u64() % small_cfg.vocab);
	}
	int saved = omp_get_max_threads();
	float loss[3];
	float **g0 = calloc(n.U, sizeof(float *));
	for (int t = 0; t < 3; t++) {
		omp_set_num_threads(t + 1);
		net_fwd(&n);
		loss[t] = net_bwd(&n);
		for (int u = 0; u < n.U; u++) {
			size_t bytes = st_model_unit_layout(n.m, u)->elems * 4;
			if (t == 0) {
				g0[u] = malloc(bytes);
				memcpy(g0[u], n.g[u], bytes);
			} else if (memcmp(g0[u], n.g[u], bytes)) {
				fail_msg("unit %d gradient differs at %d threads", u, t + 1);
			}
		}
		if (t > 0)
			assert_memory_equal(&loss[0], &loss[t], sizeof(float));
	}
	omp_set_num_threads(saved);
	for (int u = 0; u < n.U; u++)
		free(g0[u]);
	free(g0);
	net_fini(&n);
}

/* A kept forward gives the recompute's bits (model_net.h). */
static void test_saved_forward(void **state)
{
	(void)state;
	struct net n;
	net_init(&n, &small_cfg, 2, 80, 11);
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % small_cfg.vocab);
		n.tgt[i] = (int32_t)(rng_u64() % small_cfg.vocab);
	}
	net_saved_matches(&n);
	/* the shares of the model FLOPs add up to the total */
	double sum = 0;
	for (int u = 0; u < n.U; u++)
		sum += st_model_unit_flops_per_token(n.m, u, 80);
	assert_true(fabs(sum - st_model_flops_per_token(n.m, 80)) <= 1e-9 * sum);
	net_fini(&n);
}

static void test_bad_calls(void **state)
{
	(void)state;
	struct net n;
	net_init(&n, &small_cfg, 1, 4, 1);
	float loss;
	n.tok[2] = small_cfg.vocab; /* out of range */
	assert_int_equal(st_model_fwd(n.m, 0, &n.batch, n.p[0], NULL, NULL, n.x[1],
				      &loss, n.work, n.work_bytes), -EINVAL);
	n.tok[2] = 0;
	struct st_model_batch b = n.batch;
	b.T = small_cfg.ctx + 1;
	assert_int_equal(st_model_fwd(n.m, 1, &b, n.p[1], NULL, n.x[1], n.x[2],
				      &loss, n.work, n.work_bytes), -EINVAL);
	assert_int_equal(st_model_fwd(n.m, 1, &n.batch, n.p[1], NULL, n.x[1], n.x[2],
				      &loss, n.work, 16), -EINVAL);
	b = n.batch;
	b.loss_scale = 0.0f;
	int last = n.U - 1;
	assert_int_equal(st_model_bwd(n.m, last, &b, n.p[last], n.p[0], n.x[last],
				      NULL, n.dbuf[0], n.g[last], n.g[0], NULL,
				      n.work, n.work_bytes), -EINVAL);
	assert_true(strlen(st_error_last()) > 0);
	net_fini(&n);
}

/* ---- the model through a compute other than the default ----------------------- */

/* A compute that is the cpu one with a few ops wrapped: matmul_fwd,
 * gelu_fwd, zero, copy, to_host (and the fused matmul + gelu, when the
 * table says it has one) count their calls, and the call numbered fail_at
 * (from 1; 0 = never) returns -EIO. */
static const struct st_compute_ops *cpu_ops;
static int calls, fail_at;
static bool fused; /* whether the wrapped compute supports matmul_gelu_fwd */

static int counted(void)
{
	return ++calls == fail_at ? st_error_set(-EIO, "test compute: op %d fails", calls) : 0;
}

/* A fused matmul + gelu, as a device's compute may have: the cpu ops */
static int fused_calls;

static int w_run(struct st_compute *c, const struct st_op *op)
{
	int r = 0;

	switch (op->kind) {
	case ST_OP_MATMUL_GELU_FWD:
		fused_calls++;
		/* fall through */
	case ST_OP_MATMUL_FWD:
	case ST_OP_GELU_FWD:
	case ST_OP_ZERO:
	case ST_OP_COPY:
		r = counted();
		break;
	default:
		break;
	}
	return r ? r : cpu_ops->run(c, op);
}

static bool w_supports(const struct st_compute *c, enum st_op_kind kind,
		       const enum st_dtype *dtypes)
{
	if (kind == ST_OP_MATMUL_GELU_FWD && !fused)
		return false;
	return cpu_ops->supports(c, kind, dtypes);
}

static int w_to_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	int r = counted();
	return r ? r : cpu_ops->to_host(c, dst, src, bytes);
}

/* Every op of fwd and bwd goes through the model's compute: the same bits
 * through a wrapped table; a failing op fails the call with its error, the
 * ops after it are skipped, and the next call starts clean; the range
 * check reads host_tokens when given. */
static void test_compute(void **state)
{
	(void)state;
	struct net n;
	struct st_compute_ops ops;
	struct st_compute cx = {.ops = &ops};
	net_init(&n, &small_cfg, 2, 20, 5);
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % small_cfg.vocab);
		n.tgt[i] = (int32_t)(rng_u64() % small_cfg.vocab);
	}
	cpu_ops = st_compute_cpu()->ops;
	ops = *cpu_ops;
	ops.name = "test";
	ops.run = w_run;
	ops.supports = w_supports;
	ops.to_host = w_to_host;
	fused = false;

	net_fwd(&n);
	float ref_loss = net_bwd(&n);
	size_t act_bytes = (size_t)n.B * n.T * n.C * sizeof(float);
	float *y_ref = malloc(act_bytes);
	memcpy(y_ref, n.x[2], act_bytes);
	float **g_ref = calloc(n.U, sizeof(float *));
	for (int u = 0; u < n.U; u++) {
		size_t bytes = st_model_unit_layout(n.m, u)->elems * 4;
		g_ref[u] = malloc(bytes);
		memcpy(g_ref[u], n.g[u], bytes);
	}

	st_model_set_compute(n.m, &cx);
	calls = fail_at = 0;
	net_fwd(&n);
	float loss = net_bwd(&n);
	assert_memory_equal(&loss, &ref_loss, sizeof(float));
	for (int u = 0; u < n.U; u++)
		if (memcmp(g_ref[u], n.g[u], st_model_unit_layout(n.m, u)->elems * 4))
			fail_msg("unit %d: gradient differs through the wrapped compute", u);
	assert_true(calls > 4 * small_cfg.n_layer);

	/* with a fused matmul + gelu in the table, the blocks use it, once
	 * per block in the forward and once per block in the backward's
	 * recompute, with the same bits */
	fused = true;
	fused_calls = 0;
	net_fwd(&n);
	loss = net_bwd(&n);
	assert_int_equal(fused_calls, 2 * small_cfg.n_layer);
	assert_memory_equal(&loss, &ref_loss, sizeof(float));
	for (int u = 0; u < n.U; u++)
		if (memcmp(g_ref[u], n.g[u], st_model_unit_layout(n.m, u)->elems * 4))
			fail_msg("unit %d: gradient differs through the fused matmul + gelu", u);
	fused = false;

	/* block 1's forward: its second wrapped op fails */
	calls = 0;
	fail_at = 2;
	memset(n.x[2], 0, act_bytes);
	assert_int_equal(st_model_fwd(n.m, 1, &n.batch, n.p[1], NULL, n.x[1], n.x[2], NULL,
				      n.work, n.work_bytes), -EIO);
	assert_int_equal(calls, 2); /* nothing after the failure ran */
	assert_non_null(strstr(st_error_last(), "op 2 fails"));
	fail_at = 0;
	assert_int_equal(st_model_fwd(n.m, 1, &n.batch, n.p[1], NULL, n.x[1], n.x[2], NULL,
				      n.work, n.work_bytes), 0);
	assert_memory_equal(n.x[2], y_ref, act_bytes);

	/* the head's loss comes back through to_host: fail it */
	int H = n.U - 1;
	calls = 0;
	fail_at = 1;
	loss = 0.0f;
	assert_int_equal(st_model_fwd(n.m, H, &n.batch, n.p[H], n.p[0], n.x[H], NULL, &loss,
				      n.work, n.work_bytes), -EIO);
	fail_at = 0;

	/* ids on the device are checked on their host copy */
	int32_t *bad = malloc((size_t)n.B * n.T * sizeof(int32_t));
	memcpy(bad, n.tok, (size_t)n.B * n.T * sizeof(int32_t));
	bad[3] = small_cfg.vocab;
	struct st_model_batch b = n.batch;
	b.host_tokens = bad;
	assert_int_equal(st_model_fwd(n.m, 0, &b, n.p[0], NULL, NULL, n.x[1], NULL, n.work,
				      n.work_bytes), -EINVAL);
	b.host_tokens = n.tok;
	assert_int_equal(st_model_fwd(n.m, 0, &b, n.p[0], NULL, NULL, n.x[1], NULL, n.work,
				      n.work_bytes), 0);

	st_model_set_compute(n.m, NULL);
	for (int u = 0; u < n.U; u++)
		free(g_ref[u]);
	free(g_ref);
	free(y_ref);
	free(bad);
	net_fini(&n);
}


/* The cpu device's compute queues the cpu kernels on a worker thread: the
 * model through it gives the same bits; its events order it against the
 * device's other queues both ways; spans time what ran. */
struct slow_fill {
	float *dst;
	size_t n;
	float v;
	uint64_t done_ns; /* when the fill finished */
};

static void slow_fill_fn(void *arg)
{
	struct slow_fill *f = arg;
	struct timespec ts = { 0, 40 * 1000 * 1000 };

	nanosleep(&ts, NULL);
	for (size_t i = 0; i < f->n; i++)
		f->dst[i] = f->v;
	f->done_ns = st_now_ns();
}

static void test_queued_compute(void **state)
{
	(void)state;
	struct net n;
	struct st_device *dev;
	struct st_device_config dc = { 0 };
	struct st_compute *cx;
	struct st_queue *q;
	struct st_event *ev;
	struct st_compute_span sp[8];
	net_init(&n, &small_cfg, 2, 20, 7);
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % small_cfg.vocab);
		n.tgt[i] = (int32_t)(rng_u64() % small_cfg.vocab);
	}
	net_fwd(&n);
	float ref_loss = net_bwd(&n);
	float **g_ref = calloc(n.U, sizeof(float *));
	for (int u = 0; u < n.U; u++) {
		size_t bytes = st_model_unit_layout(n.m, u)->elems * 4;
		g_ref[u] = malloc(bytes);
		memcpy(g_ref[u], n.g[u], bytes);
	}

	assert_int_equal(st_device_create(&st_device_cpu_ops, &dc, &dev), 0);
	assert_int_equal(st_compute_create(dev, &cx), 0);
	assert_ptr_not_equal(cx, st_compute_cpu());
	st_model_set_compute(n.m, cx);
	st_compute_span_begin(cx, "fwd+bwd");
	net_fwd(&n);
	float loss = net_bwd(&n);
	st_compute_span_end(cx);
	assert_int_equal(st_compute_sync(cx), 0);
	assert_memory_equal(&loss, &ref_loss, sizeof(float));
	for (int u = 0; u < n.U; u++)
		if (memcmp(g_ref[u], n.g[u], st_model_unit_layout(n.m, u)->elems * 4))
			fail_msg("unit %d: gradient differs through the queued compute", u);
	assert_int_equal(st_compute_take_spans(cx, sp, 8), 1);
	assert_string_equal(sp[0].name, "fwd+bwd");
	assert_true(sp[0].t1_ns > sp[0].t0_ns);
	assert_int_equal(st_compute_take_spans(cx, sp, 8), 0);
	/* a span begun while one is open ends that one, which is not counted */
	st_compute_span_begin(cx, "dropped");
	st_compute_zero(cx, n.g[0], 64);
	st_compute_span_begin(cx, "kept");
	st_compute_zero(cx, n.g[0], 64);
	st_compute_span_end(cx);
	assert_int_equal(st_compute_sync(cx), 0);
	assert_int_equal(st_compute_take_spans(cx, sp, 8), 1);
	assert_string_equal(sp[0].name, "kept");

	/* another queue -> compute: the copy waits for the slow fill */
	enum { NF = 4096 };
	uint64_t arena_bytes;
	float *a = st_device_arena(dev, &arena_bytes), *b = a + NF; /* host memory on cpu */
	struct slow_fill f = { a, NF, 3.0f, 0 };
	assert_int_equal(st_queue_create(dev, &q), 0);
	assert_int_equal(st_event_create(dev, &ev), 0);
	assert_int_equal(st_device_host_fn(dev, q, slow_fill_fn, &f), 0);
	assert_int_equal(st_event_record(dev, ev, q), 0);
	st_compute_wait(cx, ev);
	st_compute_copy(cx, b, a, NF * sizeof(float));
	assert_int_equal(st_compute_sync(cx), 0);
	for (int i = 0; i < NF; i++)
		if (b[i] != 3.0f)
			fail_msg("element %d is %g: the compute did not wait for the event", i, b[i]);

	/* compute -> another queue: a slow op, then a fill the queue waits for */
	struct slow_fill f2 = { b, NF, 5.0f, 0 };
	memset(a, 0, NF * sizeof(float));
	st_compute_span_begin(cx, "slow");
	st_compute_wait(cx, ev); /* already done: no effect */
	assert_int_equal(st_device_host_fn(dev, q, slow_fill_fn, &f2), 0);
	assert_int_equal(st_event_record(dev, ev, q), 0);
	st_compute_wait(cx, ev);
	st_compute_copy(cx, a, b, NF * sizeof(float));
	st_compute_span_end(cx);
	st_compute_record(cx, ev);
	assert_int_equal(st_queue_wait(dev, q, ev), 0);
	assert_int_equal(st_device_memcpy_async(dev, q, b, a, NF * sizeof(float), ST_COPY_D2D),
			 0);
	assert_int_equal(st_queue_sync(dev, q), 0);
	for (int i = 0; i < NF; i++)
		if (a[i] != 5.0f || b[i] != 5.0f)
			fail_msg("element %d: %g %g, the queue did not wait for the compute", i,
				 a[i], b[i]);
	assert_int_equal(st_compute_take_spans(cx, sp, 8), 1);
	assert_true(sp[0].t1_ns >= f2.done_ns); /* it waited for the fill */

	/* spans taken while a later one is still queued: that one is still
	 * stamped where it now lies */
	struct st_event *ev2;
	struct slow_fill f3 = { a, NF, 7.0f, 0 };
	assert_int_equal(st_event_create(dev, &ev2), 0);
	st_compute_span_begin(cx, "first");
	st_compute_zero(cx, b, NF * sizeof(float));
	st_compute_span_end(cx);
	st_compute_record(cx, ev2);
	assert_int_equal(st_event_sync(dev, ev2), 0);
	assert_int_equal(st_device_host_fn(dev, q, slow_fill_fn, &f3), 0);
	assert_int_equal(st_event_record(dev, ev, q), 0);
	st_compute_span_begin(cx, "second");
	st_compute_wait(cx, ev);
	st_compute_copy(cx, b, a, NF * sizeof(float));
	st_compute_span_end(cx);
	assert_int_equal(st_compute_take_spans(cx, sp, 8), 1); /* "second" still waits */
	assert_string_equal(sp[0].name, "first");
	assert_int_equal(st_compute_sync(cx), 0);
	assert_int_equal(st_compute_take_spans(cx, sp, 8), 1);
	assert_string_equal(sp[0].name, "second");
	assert_true(sp[0].t1_ns >= f3.done_ns);
	assert_true(b[0] == 7.0f && b[NF - 1] == 7.0f);
	st_event_destroy(dev, ev2);

	/* the unqueued cpu compute has no events */
	st_compute_record(st_compute_cpu(), ev);
	assert_int_equal(st_compute_take_error(st_compute_cpu()), -ENOTSUP);

	st_model_set_compute(n.m, NULL);
	st_event_destroy(dev, ev);
	st_queue_destroy(dev, q);
	st_compute_destroy(cx);
	st_device_destroy(dev);
	for (int u = 0; u < n.U; u++)
		free(g_ref[u]);
	free(g_ref);
	net_fini(&n);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config),
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_init),
		cmocka_unit_test(test_unit_gradients),
		cmocka_unit_test(test_tied_whole_model),
		cmocka_unit_test(test_loss_at_init),
		cmocka_unit_test(test_overfit),
		cmocka_unit_test(test_determinism),
		cmocka_unit_test(test_saved_forward),
		cmocka_unit_test(test_bad_calls),
		cmocka_unit_test(test_compute),
		cmocka_unit_test(test_queued_compute),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
