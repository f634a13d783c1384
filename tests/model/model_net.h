/* The model tests' shared harness (tests/model/test_model.c, GPT-2, and
 * test_llama.c, LLaMA): a seeded generator, and a whole model's state
 * (fp32 params and grads per unit, unit inputs, one workspace) with its
 * forward and backward over every unit, through the family seam only, and
 * every unit's gradients against finite differences.
 * Included once by each test after cmocka.h and strata/model.h. */
#ifndef STRATA_TESTS_MODEL_NET_H
#define STRATA_TESTS_MODEL_NET_H

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng_u64(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float rng_f(void)
{
	return (float)((double)(rng_u64() >> 11) * 0x1.0p-52 - 1.0);
}

/* A whole model's state for the tests: fp32 params and grads per unit,
 * activations (unit inputs), one shared workspace. */
struct net {
	struct st_model *m;
	int U, B, T, C;
	float **p, **g;
	float **x;   /* x[u]: input of unit u (u >= 1), (B,T,C) */
	float *dbuf[2];
	void *work;
	size_t work_bytes;
	int32_t *tok, *tgt;
	struct st_model_batch batch;
};

static void net_init(struct net *n, const struct st_model_config *cfg, int B,
		     int T, uint64_t seed)
{
	memset(n, 0, sizeof(*n));
	assert_int_equal(st_model_create(cfg, &n->m), 0);
	n->U = st_model_unit_count(n->m);
	n->B = B;
	n->T = T;
	n->C = cfg->dim;
	n->p = calloc(n->U, sizeof(float *));
	n->g = calloc(n->U, sizeof(float *));
	n->x = calloc(n->U + 1, sizeof(float *));
	size_t act = (size_t)B * T * n->C;
	for (int u = 0; u < n->U; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(n->m, u);
		n->p[u] = calloc(ul->elems, sizeof(float));
		n->g[u] = calloc(ul->elems, sizeof(float));
		assert_int_equal(st_model_init_unit(n->m, u, seed, n->p[u]), 0);
		size_t wb = st_model_work_bytes(n->m, u, B, T);
		if (wb > n->work_bytes)
			n->work_bytes = wb;
	}
	for (int u = 1; u <= n->U; u++)
		n->x[u] = calloc(act, sizeof(float));
	n->dbuf[0] = calloc(act, sizeof(float));
	n->dbuf[1] = calloc(act, sizeof(float));
	n->work = malloc(n->work_bytes);
	n->tok = calloc((size_t)B * T, sizeof(int32_t));
	n->tgt = calloc((size_t)B * T, sizeof(int32_t));
	n->batch = (struct st_model_batch){.B = B, .T = T, .tokens = n->tok,
					   .targets = n->tgt, .loss_scale = 1.0f};
}

static void net_fini(struct net *n)
{
	for (int u = 0; u < n->U; u++) {
		free(n->p[u]);
		free(n->g[u]);
	}
	for (int u = 1; u <= n->U; u++)
		free(n->x[u]);
	free(n->p);
	free(n->g);
	free(n->x);
	free(n->dbuf[0]);
	free(n->dbuf[1]);
	free(n->work);
	free(n->tok);
	free(n->tgt);
	st_model_destroy(n->m);
}

static float net_fwd(struct net *n)
{
	float loss = 0.0f;
	for (int u = 0; u < n->U; u++) {
		int k = st_model_unit_layout(n->m, u)->reads_unit;
		const float *other = k >= 0 ? n->p[k] : NULL;
		assert_int_equal(st_model_fwd(n->m, u, &n->batch, n->p[u], other,
					      n->x[u], n->x[u + 1], &loss, n->work,
					      n->work_bytes), 0);
	}
	return loss;
}

/* Full backward (grads zeroed first); returns the loss the head computed. */
static float net_bwd(struct net *n)
{
	float loss = 0.0f;
	for (int u = 0; u < n->U; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(n->m, u);
		memset(n->g[u], 0, ul->elems * sizeof(float));
	}
	int cur = 0;
	for (int u = n->U - 1; u >= 0; u--) {
		int k = st_model_unit_layout(n->m, u)->reads_unit;
		const float *other = k >= 0 ? n->p[k] : NULL;
		float *other_g = k >= 0 ? n->g[k] : NULL;
		float *dx = u > 0 ? n->dbuf[cur ^ 1] : NULL;
		assert_int_equal(st_model_bwd(n->m, u, &n->batch, n->p[u], other,
					      n->x[u], n->dbuf[cur], dx, n->g[u],
					      other_g, u == n->U - 1 ? &loss : NULL,
					      n->work, n->work_bytes), 0);
		cur ^= 1;
	}
	return loss;
}

/* The kept forward against the recompute: the whole backward with every
 * block's forward kept (st_model_fwd_save into a saved buffer of its own,
 * st_model_bwd_saved from it) gives the recompute's loss, every unit's
 * gradient and every input gradient bit for bit. The scratch workspace is
 * only st_model_saved_bytes()' scratch and is poisoned (NaN) before each
 * call, so a kept backward that still read a forward buffer from it, or
 * recomputed into it, would differ; the saved buffers start poisoned too. */
static void net_saved_matches(struct net *n)
{
	size_t act = (size_t)n->B * n->T * n->C;
	float l_ref = 0.0f, l_kept = 0.0f;
	float **g_ref = calloc(n->U, sizeof(float *)), **dx_ref = calloc(n->U, sizeof(float *));
	void **saved = calloc(n->U, sizeof(void *));
	size_t *saved_b = calloc(n->U, sizeof(size_t)), scratch_b = 0;
	int kept = 0;

	/* the reference: recompute */
	net_fwd(n);
	for (int u = 0; u < n->U; u++)
		memset(n->g[u], 0, st_model_unit_layout(n->m, u)->elems * sizeof(float));
	int cur = 0;
	for (int u = n->U - 1; u >= 0; u--) {
		int k = st_model_unit_layout(n->m, u)->reads_unit;
		float *dx = u > 0 ? n->dbuf[cur ^ 1] : NULL;
		assert_int_equal(st_model_bwd(n->m, u, &n->batch, n->p[u], k >= 0 ? n->p[k] : NULL,
					      n->x[u], n->dbuf[cur], dx, n->g[u],
					      k >= 0 ? n->g[k] : NULL, u == n->U - 1 ? &l_ref : NULL,
					      n->work, n->work_bytes), 0);
		if (dx) {
			dx_ref[u] = malloc(act * sizeof(float));
			memcpy(dx_ref[u], dx, act * sizeof(float));
		}
		cur ^= 1;
	}
	for (int u = 0; u < n->U; u++) {
		size_t bytes = st_model_unit_layout(n->m, u)->elems * sizeof(float), sc;
		g_ref[u] = malloc(bytes);
		memcpy(g_ref[u], n->g[u], bytes);
		saved_b[u] = st_model_saved_bytes(n->m, u, n->B, n->T, &sc);
		if (st_model_unit_layout(n->m, u)->kind == ST_UNIT_BLOCK) {
			assert_true(saved_b[u] > 0);
			assert_true(sc < st_model_work_bytes(n->m, u, n->B, n->T));
			saved[u] = malloc(saved_b[u]);
			memset(saved[u], 0xff, saved_b[u]);
			kept++;
		} else {
			assert_int_equal(saved_b[u], 0);
			assert_int_equal(sc, st_model_work_bytes(n->m, u, n->B, n->T));
		}
		scratch_b = sc > scratch_b ? sc : scratch_b;
	}
	assert_true(kept == n->U - 2);
	void *scratch = malloc(scratch_b);
	/* a saved buffer one byte short is refused */
	if (n->U > 2)
		assert_int_equal(st_model_fwd_save(n->m, 1, &n->batch, n->p[1], NULL, n->x[1],
						   n->x[2], NULL, saved[1], saved_b[1] - 1,
						   scratch, scratch_b), -EINVAL);

	/* kept: the inputs are recomputed too (the same bits) */
	for (int u = 1; u <= n->U; u++)
		memset(n->x[u], 0xff, act * sizeof(float));
	for (int u = 0; u < n->U - 1; u++) {
		int k = st_model_unit_layout(n->m, u)->reads_unit;
		memset(scratch, 0xff, scratch_b);
		assert_int_equal(st_model_fwd_save(n->m, u, &n->batch, n->p[u],
						   k >= 0 ? n->p[k] : NULL, n->x[u], n->x[u + 1],
						   NULL, saved[u], saved_b[u], scratch, scratch_b),
				 0);
	}
	for (int u = 0; u < n->U; u++)
		memset(n->g[u], 0, st_model_unit_layout(n->m, u)->elems * sizeof(float));
	cur = 0;
	for (int u = n->U - 1; u >= 0; u--) {
		int k = st_model_unit_layout(n->m, u)->reads_unit;
		float *dx = u > 0 ? n->dbuf[cur ^ 1] : NULL;
		memset(scratch, 0xff, scratch_b);
		assert_int_equal(st_model_bwd_saved(n->m, u, &n->batch, n->p[u],
						    k >= 0 ? n->p[k] : NULL, n->x[u], n->dbuf[cur],
						    dx, n->g[u], k >= 0 ? n->g[k] : NULL,
						    u == n->U - 1 ? &l_kept : NULL, saved[u],
						    saved_b[u], scratch, scratch_b), 0);
		if (dx && memcmp(dx_ref[u], dx, act * sizeof(float)))
			fail_msg("unit %d: the input gradient differs when kept", u);
		cur ^= 1;
	}
	assert_memory_equal(&l_ref, &l_kept, sizeof(float));
	for (int u = 0; u < n->U; u++)
		if (memcmp(g_ref[u], n->g[u], st_model_unit_layout(n->m, u)->elems * sizeof(float)))
			fail_msg("unit %d: the gradient differs when kept", u);
	for (int u = 0; u < n->U; u++) {
		free(g_ref[u]);
		free(dx_ref[u]);
		free(saved[u]);
	}
	free(g_ref);
	free(dx_ref);
	free(saved);
	free(saved_b);
	free(scratch);
}

/* ---- finite differences of each unit ---- */

struct fd_ctx {
	struct net *n;
	int u;
	float *r; /* projection of the unit's output (blocks, embedding) */
};

/* The unit's forward as a scalar: the random projection of y, or the head's
 * mean loss. */
static double unit_loss(void *p)
{
	struct fd_ctx *c = p;
	struct net *n = c->n;
	int last = n->U - 1;
	float loss = 0.0f;
	size_t act = (size_t)n->B * n->T * n->C;
	float *y = n->dbuf[1];
	assert_int_equal(st_model_fwd(n->m, c->u, &n->batch, n->p[c->u],
				      st_model_unit_layout(n->m, c->u)->reads_unit >= 0 ? n->p[0] : NULL,
				      n->x[c->u],
				      y, &loss, n->work, n->work_bytes), 0);
	if (c->u == last)
		return loss;
	double s = 0.0;
	for (size_t i = 0; i < act; i++)
		s += (double)y[i] * c->r[i];
	return s;
}

/* Central difference of the unit along v at step h. */
static double central(struct fd_ctx *c, float *x, const float *x0,
		      const float *v, size_t len, float h)
{
	for (size_t i = 0; i < len; i++)
		x[i] = x0[i] + h * v[i];
	double lp = unit_loss(c);
	for (size_t i = 0; i < len; i++)
		x[i] = x0[i] - h * v[i];
	double lm = unit_loss(c);
	memcpy(x, x0, len * sizeof(float));
	return (lp - lm) / (2.0 * h);
}

/* Directional derivative along a random v: Richardson's extrapolation of
 * central differences at h and h/2 cancels the h^2 term, so the remaining
 * error (fp32 rounding in the forward, <= ~5e-4 of |g| here) sits below the
 * 2e-3 tolerance while a missing or wrong term costs >= 1e-2. */
static void dir_check(struct fd_ctx *c, float *x, size_t len, const float *g,
		      const char *what)
{
	/* the head's loss comes back as a float mean: a larger step keeps its
	 * rounding (~2e-7 of ~4) small next to the difference */
	const float h = c->u == c->n->U - 1 ? 5e-2f : 1e-2f;
	float *v = calloc(len, sizeof(float)), *x0 = calloc(len, sizeof(float));
	assert_non_null(v);
	assert_non_null(x0);
	for (size_t i = 0; i < len; i++)
		v[i] = rng_f();
	memcpy(x0, x, len * sizeof(float));
	double f1 = central(c, x, x0, v, len, h);
	double f2 = central(c, x, x0, v, len, h / 2);
	double fd = (4.0 * f2 - f1) / 3.0, an = 0, gn = 0;
	for (size_t i = 0; i < len; i++) {
		an += (double)g[i] * v[i];
		gn += (double)g[i] * g[i];
	}
	/* <g,v> can be small by chance; |g|/sqrt(3) is its typical size */
	double scale = fmax(fmax(fabs(fd), fabs(an)), sqrt(gn / 3.0));
	if (getenv("FD_VERBOSE"))
		print_message("unit %d %s: fd %.9g an %.9g rel %.2e\n", c->u,
			      what, fd, an, fabs(fd - an) / scale);
	if (!(fabs(fd - an) <= 2e-3 * scale + 1e-6))
		fail_msg("unit %d %s: finite difference %.9g, analytic %.9g", c->u, what, fd, an);
	free(v);
	free(x0);
}

/* Every unit's backward against finite differences of its forward: each
 * tensor's gradient, the input's (units after the first), and the share of
 * the unit it reads (a tied head's of the embedding). n holds random
 * weights and tokens, and net_fwd() has run: x[u] are the real inputs. */
static void net_unit_gradients(struct net *n)
{
	size_t act = (size_t)n->B * n->T * n->C;
	int last = n->U - 1;
	float *r = malloc(act * sizeof(float)), *dx = malloc(act * sizeof(float));

	assert_non_null(r);
	assert_non_null(dx);
	for (size_t i = 0; i < act; i++)
		r[i] = rng_f();
	for (int u = 0; u < n->U; u++) {
		struct fd_ctx c = { .n = n, .u = u, .r = r };
		const struct st_unit_layout *ul = st_model_unit_layout(n->m, u);
		bool reads = ul->reads_unit >= 0;
		float loss = -1.0f;

		memset(n->g[u], 0, ul->elems * sizeof(float));
		memset(n->g[0], 0, st_model_unit_layout(n->m, 0)->elems * sizeof(float));
		assert_int_equal(st_model_bwd(n->m, u, &n->batch, n->p[u], reads ? n->p[0] : NULL,
					      n->x[u], r, u > 0 ? dx : NULL, n->g[u],
					      reads ? n->g[0] : NULL, u == last ? &loss : NULL,
					      n->work, n->work_bytes), 0);
		if (u == last) {
			float lf;

			assert_int_equal(st_model_fwd(n->m, u, &n->batch, n->p[u],
						      reads ? n->p[0] : NULL, n->x[u], NULL, &lf,
						      n->work, n->work_bytes), 0);
			assert_true(lf == loss);
		}
		for (int k = 0; k < ul->n_tensors; k++) {
			const struct st_tensor_layout *t = &ul->tensors[k];

			dir_check(&c, n->p[u] + t->offset_elems, t->n_elems,
				  n->g[u] + t->offset_elems, t->name);
		}
		if (u > 0)
			dir_check(&c, n->x[u], act, dx, "input");
		if (reads) /* the tie: this unit's share of the embedding's gradient */
			dir_check(&c, n->p[0], st_model_unit_layout(n->m, 0)->tensors[0].n_elems,
				  n->g[0], "tied embedding");
	}
	free(r);
	free(dx);
}

#endif
