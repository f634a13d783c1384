/* The model tests' shared harness (tests/model/test_model.c, GPT-2, and
 * test_llama.c, LLaMA): a seeded generator, and a whole model's state
 * (fp32 params and grads per unit, unit inputs, one workspace) with its
 * forward and backward over every unit, through the family seam only.
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

#endif
