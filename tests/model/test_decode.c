/* Decoding with a KV cache (st_model_decode_*) against the recompute: for
 * GPT-2 and LLaMA (untied and tied, GQA and MQA with kv heads < heads,
 * Qwen2's biases, llama3 and linear rope scaling, head_dim != dim/heads),
 * prompts of 1, 3 and 7 tokens, the greedy tokens of the cache are those
 * of the whole forward over the prefix (st_model_fwd through every unit,
 * then st_model_logits on the last row) at every step, and each step's
 * logits agree with the forward's within 1e-5 of their scale; a prompt
 * fed in two pieces gives the same; the cache's size and refusals. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_net.h"

#define T_MAX 40

static int argmax(const float *x, int n)
{
	int best = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* The logits of the last of toks[0..t) by the whole forward. */
static void ref_logits(struct net *n, const int32_t *toks, int t, float *logits)
{
	const int U = n->U, k = st_model_unit_layout(n->m, U - 1)->reads_unit;

	memcpy(n->tok, toks, sizeof(int32_t) * (size_t)t);
	n->batch.T = t;
	for (int u = 0; u < U - 1; u++) {
		int r = st_model_unit_layout(n->m, u)->reads_unit;

		assert_int_equal(st_model_fwd(n->m, u, &n->batch, n->p[u], r >= 0 ? n->p[r] : NULL,
					      n->x[u], n->x[u + 1], NULL, n->work, n->work_bytes),
				 0);
	}
	assert_int_equal(st_model_logits(n->m, n->p[U - 1], k >= 0 ? n->p[k] : NULL,
					 n->x[U - 1] + (size_t)(t - 1) * n->C, logits, n->work,
					 n->work_bytes),
			 0);
}

static void close_enough(const char *what, int step, const float *got, const float *want,
			 int V)
{
	float scale = 1, worst = 0;

	for (int i = 0; i < V; i++)
		scale = fmaxf(scale, fabsf(want[i]));
	for (int i = 0; i < V; i++)
		worst = fmaxf(worst, fabsf(got[i] - want[i]));
	if (!(worst <= 1e-5f * scale))
		fail_msg("%s: step %d: logits differ by %g (scale %g)", what, step, worst, scale);
}

/* Greedy from a prompt of P tokens to T_MAX: the recompute's tokens and
 * logits, then the cache's (the prompt in one step, or split at split > 0),
 * step by step; lend: the decoder in memory the test lends
 * (st_model_decode_begin_in), just what st_model_decode_bytes() asks. */
static void greedy_matches_in(const char *text, int P, int split, bool lend)
{
	struct st_model_config cfg;
	struct net n;
	struct st_decode *d;
	int32_t toks[T_MAX], got[T_MAX];
	float *ref, *lg;
	void *mem = NULL;
	int V, U;

	assert_int_equal(st_model_config_parse(text, &cfg), 0);
	net_init(&n, &cfg, 1, T_MAX, 7);
	U = n.U;
	V = cfg.vocab;
	/* weights 4x the init: logits far enough apart for the argmax */
	for (int u = 0; u < U; u++)
		for (uint64_t i = 0; i < st_model_unit_layout(n.m, u)->elems; i++)
			n.p[u][i] *= 4.0f;
	ref = malloc(sizeof(float) * (size_t)V * T_MAX);
	lg = malloc(sizeof(float) * (size_t)V);
	for (int i = 0; i < P; i++)
		toks[i] = (int32_t)(rng_u64() % (uint64_t)V);
	for (int t = P; t < T_MAX; t++) {
		ref_logits(&n, toks, t, ref + (size_t)(t - P) * V);
		toks[t] = argmax(ref + (size_t)(t - P) * V, V);
	}
	memcpy(got, toks, sizeof(int32_t) * (size_t)P);
	if (lend) {
		size_t bytes = st_model_decode_bytes(n.m, T_MAX, P);

		mem = malloc(bytes);
		assert_non_null(mem);
		assert_int_equal(st_model_decode_begin_in(n.m, T_MAX, P, mem, bytes - 1, &d),
				 -ENOSPC);
		assert_int_equal(st_model_decode_begin_in(n.m, T_MAX, P, mem, bytes, &d), 0);
	} else
		assert_int_equal(st_model_decode_begin(n.m, T_MAX, &d), 0);
	if (split) {
		assert_int_equal(st_model_decode_step(d, (const void *const *)n.p, got, split, lg),
				 0);
		assert_int_equal(st_model_decode_step(d, (const void *const *)n.p, got + split,
						      P - split, lg),
				 0);
	} else
		assert_int_equal(st_model_decode_step(d, (const void *const *)n.p, got, P, lg), 0);
	for (int t = P; t < T_MAX; t++) {
		if (t > P)
			assert_int_equal(st_model_decode_step(d, (const void *const *)n.p,
							      got + t - 1, 1, lg),
					 0);
		close_enough(text, t - P, lg, ref + (size_t)(t - P) * V, V);
		got[t] = argmax(lg, V);
		if (got[t] != toks[t])
			fail_msg("%s: prompt %d: token %d is %d with the cache, %d recomputed",
				 text, P, t, got[t], toks[t]);
	}
	assert_int_equal(st_model_decode_pos(d), T_MAX - 1);
	/* one past the cache's positions is refused */
	assert_int_equal(st_model_decode_step(d, (const void *const *)n.p, got, 2, lg), -EINVAL);
	st_model_decode_end(d);
	free(mem);
	free(ref);
	free(lg);
	net_fini(&n);
}

static void greedy_matches(const char *text, int P, int split)
{
	greedy_matches_in(text, P, split, false);
}

static const char *const models[] = {
	"gpt2:layers=2,dim=32,heads=4,vocab=61,ctx=48",
	/* GQA 4 over 2, untied, llama3 scaling */
	"llama:layers=2,dim=32,heads=4,kv-heads=2,ffn=48,vocab=53,ctx=48,tied=0,"
	"rope-theta=500000,rope-scaling=llama3:8:1:4:16",
	/* tied with Qwen2's biases, GQA */
	"llama:layers=2,dim=32,heads=4,kv-heads=2,ffn=48,vocab=53,ctx=48,bias=1,tied=1",
	/* MQA, head_dim 16 x 4 heads != dim 48, linear scaling */
	"llama:layers=2,dim=48,heads=4,kv-heads=1,ffn=64,vocab=50,ctx=48,head-dim=16,tied=0,"
	"rope-scaling=linear:2",
};

static void test_greedy(void **state)
{
	static const int prompts[] = { 1, 3, 7 };

	(void)state;
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
		for (size_t j = 0; j < sizeof(prompts) / sizeof(prompts[0]); j++)
			greedy_matches(models[i], prompts[j], 0);
}

/* the prompt in two steps (3 + 4) */
static void test_split_prompt(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
		greedy_matches(models[i], 7, 3);
}

/* in lent memory, the prompt's rows the most a step takes: the same
 * tokens; a step of more rows than lent is refused */
static void test_lent(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
		greedy_matches_in(models[i], 7, 0, true);
}

static void test_cache_and_refusals(void **state)
{
	struct st_model_config cfg;
	struct st_model *m;
	struct st_decode *d;
	int32_t bad = 53;
	float lg[53];
	void *p[4] = { 0 };

	(void)state;
	assert_int_equal(st_model_config_parse(models[1], &cfg), 0);
	/* 2 layers x 40 positions x (2 kv heads x 8) x K and V, in floats */
	assert_int_equal(st_model_decode_cache_bytes(&cfg, 40), 2 * 40 * 16 * 2 * 4);
	assert_int_equal(st_model_create(&cfg, &m), 0);
	assert_int_equal(st_model_decode_begin(m, 49, &d), -EINVAL); /* past ctx */
	assert_null(d);
	assert_int_equal(st_model_decode_begin(m, 0, &d), -EINVAL);
	assert_int_equal(st_model_decode_begin(m, 48, &d), 0);
	assert_int_equal(st_model_decode_step(d, (const void *const *)p, &bad, 1, lg), -EINVAL);
	assert_int_equal(st_model_decode_step(d, (const void *const *)p, &bad, 0, lg), -EINVAL);
	assert_int_equal(st_model_decode_pos(d), 0);
	st_model_decode_end(d);
	/* lent room for steps of 2: 3 tokens are refused, and 0 rows */
	{
		size_t bytes = st_model_decode_bytes(m, 8, 2);
		void *mem = malloc(bytes);
		int32_t three[3] = { 1, 2, 3 };

		assert_non_null(mem);
		assert_int_equal(st_model_decode_begin_in(m, 8, 0, mem, bytes, &d), -EINVAL);
		assert_int_equal(st_model_decode_begin_in(m, 8, 2, mem, bytes, &d), 0);
		assert_int_equal(st_model_decode_step(d, (const void *const *)p, three, 3, lg),
				 -EINVAL);
		st_model_decode_end(d);
		free(mem);
	}
	assert_int_equal(st_model_set_precision(m, ST_PRECISION_BF16), 0);
	assert_int_equal(st_model_decode_begin(m, 8, &d), -ENOTSUP);
	assert_false(st_model_decodes(m));
	assert_int_equal(st_model_decode_bytes(m, 8, 2), 0);
	assert_int_equal(st_model_decode_begin_in(m, 8, 2, lg, sizeof(lg), &d), -ENOTSUP);
	st_model_destroy(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy),
		cmocka_unit_test(test_split_prompt),
		cmocka_unit_test(test_lent),
		cmocka_unit_test(test_cache_and_refusals),
	};

	/* the harness's backward helpers are not used here */
	(void)net_bwd;
	(void)net_saved_matches;
	(void)net_unit_gradients;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
