/* A loss mask (strata's shard extension, docs/formats.md) in training and
 * eval (docs/finetune.md, "Training on chat data"):
 *  1. the engine in several placements and both schedules, at grad_accum
 *     1 and 2, gives the reference trainer's losses, norms and master
 *     weights bit for bit on a masked shard (GPT-2 and LLaMA, fp32 and the
 *     bf16 compute);
 *  2. a mask of all ones trains as the plain shard: the same master weights
 *     bit for bit, the same loss within rounding (it is not rounded to
 *     float);
 *  3. the step's loss is the mean over its counted targets: the reference
 *     trainer's eval sum over the step's batches, over their count;
 *  4. a step whose targets are all masked out makes no update (empty),
 *     its loss 0;
 *  5. the loader's targets follow the mask (-1 where the mask byte of the
 *     target's token is 0) and its count is theirs;
 *  6. --samples documents: pieces, packing, padding, epochs, shuffled
 *     orders, a cursor resumed mid-epoch;
 *  7. several files as one (st_dataset_concat);
 *  8. the engine's forward alone (st_engine_eval) is the reference
 *     trainer's eval of the same weights bit for bit, plain and masked,
 *     GPT-2 and LLaMA (fp32 and bf16 compute), W in vram, host and on
 *     nvme, kept forwards, layer-first, and so is an engine made for it
 *     (forward_only: no G, P, M, V, a smaller plan); the step after it is
 *     the step without it (the training state and the sampler untouched);
 *  9. --packing isolated: the loader's segment starts (each piece's place
 *     in its row, the padding one more), and the engine with them in its
 *     placements and schedules = the reference trainer bit for bit (GPT-2
 *     and LLaMA), and not the packed run.
 * `test_mask --device cuda` holds the cuda engine to the cpu's within
 * float tolerance on the masked shard, and its forward alone to the
 * reference trainer's eval (77 without a GPU). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/dataset.h"
#include "strata/engine.h"
#include "strata/model.h"
#include "strata/train.h"
#ifdef ST_HAVE_CUDA
#include "strata/cuda.h"
#endif

#define STEPS 3
#define NTOK 12000
static char dir[4096], plain_path[4200], masked_path[4200], ones_path[4200],
	zeros_path[4200], docs_path[4200];
#define NDOCS 60
static uint64_t doc_starts[NDOCS];
static const char *device = "cpu";
static enum st_samples samples = ST_SAMPLES_WINDOWS; /* open_loader's */
static bool isolate; /* engine_cases' configs: --packing isolated */
static uint16_t toks[NTOK];
static uint8_t mask[NTOK];

struct run {
	double loss[STEPS], norm[STEPS];
	bool empty[STEPS];
	float *P;
	size_t n;
};

static const char *const gpt2 = "layers=2,dim=64,heads=2,vocab=256,ctx=64";
static const char *const llama =
	"llama:layers=2,dim=128,heads=2,kv-heads=1,ffn=96,vocab=256,ctx=64,tied=0";

static void base_config(struct st_engine_config *c, const char *model)
{
	memset(c, 0, sizeof(*c));
	st_train_config_default(&c->train);
	assert_int_equal(st_model_config_parse(model, &c->train.model), 0);
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
	c->train.isolate = isolate;
	c->params = ST_OFFLOAD_NONE;
	c->optim = ST_OFFLOAD_HOST;
}

static void open_loader(struct st_dataset **ds, struct st_loader *ld,
			const struct st_engine_config *c, const char *path)
{
	struct st_loader_config lc = { .batch = (uint32_t)c->train.batch,
				       .seq = (uint32_t)c->train.seq, .shuffle = 1,
				       .seed = c->train.seed, .split = ST_SPLIT_ALL,
				       .samples = samples };

	assert_int_equal(st_dataset_open(ds, path, ST_DATASET_LLMC), 0);
	assert_int_equal(st_loader_init(ld, *ds, &lc), 0);
}

static void train(const struct st_engine_config *c, const char *path, int steps,
		  struct run *r)
{
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;
	const struct st_model *m;
	size_t off = 0;

	open_loader(&ds, &ld, c, path);
	if (st_engine_create(c, &e))
		fail_msg("engine: %s", st_error_last());
	for (int s = 0; s < steps; s++) {
		struct st_step_result res;

		if (st_engine_step(e, &ld, s, s + 1 < steps, &res))
			fail_msg("step %d: %s", s, st_error_last());
		r->loss[s] = res.loss;
		r->norm[s] = res.grad_norm;
		r->empty[s] = res.empty;
	}
	m = st_engine_model(e);
	r->n = 0;
	for (int u = 0; u < st_model_unit_count(m); u++)
		r->n += st_model_unit_layout(m, u)->elems;
	r->P = malloc(r->n * sizeof(float));
	for (int u = 0; u < st_model_unit_count(m); u++) {
		assert_int_equal(st_engine_read_state(e, u, ST_STATE_P, r->P + off), 0);
		off += st_model_unit_layout(m, u)->elems;
	}
	st_engine_destroy(e);
	st_dataset_close(ds);
}

/* The reference trainer's run of c on path. */
static void trainer_run(const struct st_engine_config *c, const char *path, struct run *r)
{
	struct st_trainer *t;
	struct st_dataset *ds;
	struct st_loader ld;
	size_t off = 0;

	open_loader(&ds, &ld, c, path);
	assert_int_equal(st_trainer_create(&c->train, &t), 0);
	if (c->compute_dtype == ST_PRECISION_BF16)
		assert_int_equal(st_trainer_set_precision(t, ST_PRECISION_BF16), 0);
	for (int s = 0; s < STEPS; s++) {
		struct st_step_result res;

		if (st_trainer_step(t, &ld, s, &res))
			fail_msg("trainer step %d: %s", s, st_error_last());
		r->loss[s] = res.loss;
		r->norm[s] = res.grad_norm;
		r->empty[s] = res.empty;
	}
	r->n = 0;
	for (int u = 0; u < st_model_unit_count(st_trainer_model(t)); u++)
		r->n += st_model_unit_layout(st_trainer_model(t), u)->elems;
	r->P = malloc(r->n * sizeof(float));
	for (int u = 0; u < st_model_unit_count(st_trainer_model(t)); u++) {
		assert_int_equal(st_trainer_read_master(t, u, r->P + off), 0);
		off += st_model_unit_layout(st_trainer_model(t), u)->elems;
	}
	st_trainer_destroy(t);
	st_dataset_close(ds);
}

static void same(const struct run *a, const struct run *b, const char *what)
{
	for (int s = 0; s < STEPS; s++)
		if (memcmp(&a->loss[s], &b->loss[s], sizeof(double)) ||
		    memcmp(&a->norm[s], &b->norm[s], sizeof(double)))
			fail_msg("%s: step %d loss %a/%a norm %a/%a differ", what, s,
				 a->loss[s], b->loss[s], a->norm[s], b->norm[s]);
	assert_int_equal(a->n, b->n);
	if (memcmp(a->P, b->P, a->n * sizeof(float)))
		fail_msg("%s: final master weights differ", what);
}

/* Close: the same losses, norms within rel, master weights within rel. */
static void close_to(const struct run *a, const struct run *b, double rel, const char *what)
{
	double num = 0, den = 0;

	for (int s = 0; s < STEPS; s++)
		if (a->loss[s] != b->loss[s] || !(fabs(a->norm[s] - b->norm[s]) <= rel * a->norm[s]))
			fail_msg("%s: step %d loss %a/%a norm %.9g/%.9g", what, s, a->loss[s],
				 b->loss[s], a->norm[s], b->norm[s]);
	assert_int_equal(a->n, b->n);
	for (size_t i = 0; i < a->n; i++) {
		num += ((double)a->P[i] - b->P[i]) * ((double)a->P[i] - b->P[i]);
		den += (double)a->P[i] * a->P[i];
	}
	if (!(sqrt(num / den) <= rel))
		fail_msg("%s: master weights %.3g apart", what, sqrt(num / den));
}

/* 1. The engine's placements and schedules = the reference trainer (at
 * grad_accum 1; at 2 the trainer adds each micro-batch's dW into G in the
 * gemm, the engine folds them after: the engine's cases agree bit for bit,
 * the trainer within rounding). */
static void engine_cases_on(const char *model, bool bf16, const char *path)
{
	struct st_engine_config c;
	struct run ref, first, r;
	static const struct {
		const char *name;
		enum st_offload params, optim;
		int prefetch, accum;
		bool layer_first;
	} cases[] = {
		{ "W in vram", ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, 0, 1, false },
		{ "W and optim on nvme, prefetch 1", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 1, 1, false },
		{ "W in host, grad_accum 2", ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, 0, 2, false },
		{ "W on nvme, grad_accum 2", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 1, 2, false },
		{ "layer-first, grad_accum 2", ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, 0, 2, true },
	};
	char what[256];

	for (int accum = 1; accum <= 2; accum++) {
		bool have_first = false;

		base_config(&c, model);
		c.train.batch = 4 / accum;
		c.train.grad_accum = accum;
		c.compute_dtype = bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
		trainer_run(&c, path, &ref);
		for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
			if (cases[i].accum != accum)
				continue;
			c.params = cases[i].params;
			c.optim = cases[i].optim;
			c.prefetch = cases[i].prefetch;
			c.schedule = cases[i].layer_first ? ST_SCHEDULE_LAYER_FIRST
							  : ST_SCHEDULE_BATCH_FIRST;
			train(&c, path, STEPS, &r);
			snprintf(what, sizeof(what), "%s%s %s: %s = %s", model,
				 bf16 ? " bf16" : "", isolate ? "isolated documents" : "masked",
				 cases[i].name,
				 accum == 1 ? "the reference trainer" : "the first case");
			if (accum == 1) {
				same(&ref, &r, what);
				free(r.P);
			} else if (!have_first) {
				close_to(&ref, &r, bf16 ? 1e-3 : 1e-5, what);
				first = r;
				have_first = true;
			} else {
				same(&first, &r, what);
				free(r.P);
			}
			if (!getenv("ST_QUIET"))
				printf("ok   %s\n", what);
		}
		if (have_first)
			free(first.P);
		free(ref.P);
	}
}

static void engine_cases(const char *model, bool bf16)
{
	engine_cases_on(model, bf16, masked_path);
}

static void test_engine_matches_trainer(void **state)
{
	(void)state;
	engine_cases(gpt2, false);
	engine_cases(llama, false);
	engine_cases(llama, true);
}

/* 2. All ones = the plain shard. */
static void test_all_ones_is_plain(void **state)
{
	struct st_engine_config c;
	struct run a, b;

	(void)state;
	base_config(&c, gpt2);
	train(&c, plain_path, STEPS, &a);
	train(&c, ones_path, STEPS, &b);
	for (int s = 0; s < STEPS; s++)
		if (!(fabs(a.loss[s] - b.loss[s]) <= 1e-6 * a.loss[s]) || a.norm[s] != b.norm[s])
			fail_msg("step %d: plain %.9g/%.9g, mask of ones %.9g/%.9g", s, a.loss[s],
				 a.norm[s], b.loss[s], b.norm[s]);
	assert_int_equal(a.n, b.n);
	if (memcmp(a.P, b.P, a.n * sizeof(float)))
		fail_msg("a mask of ones: other master weights than the plain shard");
	free(a.P);
	free(b.P);
}

/* 3. The step's loss is sum / count over its batches (grad_accum 2): the
 * reference trainer's eval of the same batches, from the same weights. */
static void test_loss_is_mean_over_counted(void **state)
{
	struct st_engine_config c;
	struct st_trainer *t;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_step_result res;
	double sum;
	uint64_t count, plain_count;

	(void)state;
	base_config(&c, gpt2);
	c.train.batch = 2;
	c.train.grad_accum = 2;
	assert_int_equal(st_trainer_create(&c.train, &t), 0);
	open_loader(&ds, &ld, &c, masked_path);
	assert_int_equal(st_trainer_eval_sum(t, &ld, 2, &sum, &count), 0);
	plain_count = 2ull * 2 * 32;
	assert_true(count > 0 && count < plain_count);
	st_loader_rewind(&ld);
	assert_int_equal(st_trainer_step(t, &ld, 0, &res), 0);
	if (res.loss != sum / (double)count)
		fail_msg("step loss %.9g, eval sum / count %.9g / %llu = %.9g", res.loss, sum,
			 (unsigned long long)count, sum / (double)count);
	assert_false(res.empty);
	st_trainer_destroy(t);
	st_dataset_close(ds);
}

/* 4. Nothing counted: no update, loss 0. */
static void test_empty_step(void **state)
{
	struct st_engine_config c;
	struct run zero, eng, ref;

	(void)state;
	base_config(&c, gpt2);
	train(&c, zeros_path, 0, &zero);
	train(&c, zeros_path, STEPS, &eng);
	trainer_run(&c, zeros_path, &ref);
	same(&ref, &eng, "empty steps: engine = trainer");
	for (int s = 0; s < STEPS; s++) {
		assert_true(eng.empty[s] && ref.empty[s]);
		assert_true(eng.loss[s] == 0.0);
	}
	if (memcmp(zero.P, eng.P, eng.n * sizeof(float)))
		fail_msg("empty steps changed the master weights");
	free(zero.P);
	free(eng.P);
	free(ref.P);
}

/* The update inside the backward (speculative, main's --update
 * in-backward): the masked steps = the sweep after, bit for bit; empty
 * steps roll the speculated update back (no change to P). */
static void test_in_backward(void **state)
{
	struct st_engine_config c;
	struct run after, in, zero, empty;

	(void)state;
	base_config(&c, gpt2);
	c.params = ST_OFFLOAD_NVME;
	c.optim = ST_OFFLOAD_NVME;
	c.train.clip = 1e9f; /* the speculation holds */
	train(&c, masked_path, STEPS, &after);
	c.update = ST_UPDATE_IN_BACKWARD;
	train(&c, masked_path, STEPS, &in);
	same(&after, &in, "masked: the update in the backward = after");
	train(&c, zeros_path, 0, &zero);
	train(&c, zeros_path, STEPS, &empty);
	for (int s = 0; s < STEPS; s++)
		assert_true(empty.empty[s] && empty.loss[s] == 0.0);
	if (memcmp(zero.P, empty.P, zero.n * sizeof(float)))
		fail_msg("in-backward: empty steps changed the master weights");
	free(after.P);
	free(in.P);
	free(zero.P);
	free(empty.P);
}

/* 5. The loader's targets and count. */
static void test_loader_targets(void **state)
{
	struct st_engine_config c;
	struct st_dataset *ds;
	struct st_loader ld, plain;
	struct st_dataset *pds;
	int32_t in[4 * 32], tg[4 * 32], pin[4 * 32], ptg[4 * 32];
	uint64_t counted = 0, want;

	(void)state;
	base_config(&c, gpt2);
	open_loader(&ds, &ld, &c, masked_path);
	open_loader(&pds, &plain, &c, plain_path);
	assert_true(st_loader_masked(&ld));
	assert_false(st_loader_masked(&plain));
	assert_int_equal(st_loader_count(&plain, 3), 3 * 4 * 32);
	want = st_loader_count(&ld, 3);
	for (int s = 0; s < 3; s++) {
		st_loader_next(&ld, in, tg);
		st_loader_next(&plain, pin, ptg);
		assert_memory_equal(in, pin, sizeof(in));
		for (int i = 0; i < 4 * 32; i++) {
			/* the target's token: find it after its input's window */
			assert_true(tg[i] == ptg[i] || tg[i] == ST_LOADER_IGNORED);
			counted += tg[i] != ST_LOADER_IGNORED;
		}
	}
	assert_int_equal(counted, want);
	/* the rule: target j of a row starting at s is ignored iff mask[s+1+j]
	 * is 0; rows are windows of toks, so find each row's start */
	st_loader_rewind(&ld);
	st_loader_next(&ld, in, tg);
	for (int b = 0; b < 4; b++) {
		int start = -1;

		for (int s = 0; s + 33 <= NTOK && start < 0; s++) {
			bool ok = true;

			for (int j = 0; j < 32 && ok; j++)
				ok = toks[s + j] == in[b * 32 + j] &&
				     (tg[b * 32 + j] == ST_LOADER_IGNORED ||
				      tg[b * 32 + j] == toks[s + 1 + j]);
			for (int j = 0; j < 32 && ok; j++)
				ok = (tg[b * 32 + j] == ST_LOADER_IGNORED) == !mask[s + 1 + j];
			if (ok)
				start = s;
		}
		assert_true(start >= 0);
	}
	st_dataset_close(ds);
	st_dataset_close(pds);
}

/* ---- --samples documents ---------------------------------------------- */

static void open_docs(struct st_dataset **ds, struct st_loader *ld, uint32_t B, uint32_t T,
		      int shuffle, const char *path)
{
	struct st_loader_config lc = { .batch = B, .seq = T, .shuffle = shuffle, .seed = 5,
				       .samples = ST_SAMPLES_DOCUMENTS };

	assert_int_equal(st_dataset_open(ds, path, ST_DATASET_LLMC), 0);
	assert_int_equal(st_loader_init(ld, *ds, &lc), 0);
}

static uint64_t doc_end(int d)
{
	return d + 1 < NDOCS ? doc_starts[d + 1] : NTOK;
}

/* The document holding token i. */
static int doc_of(uint64_t i)
{
	int d = 0;

	while (d + 1 < NDOCS && doc_starts[d + 1] <= i)
		d++;
	return d;
}

/* One epoch in file order: each row starts at a document's piece (offset a
 * multiple of T), its inputs are the document's tokens from there, no
 * target crosses documents, every counted target (mask 1, not a
 * document's first token) is seen exactly once, and the next epoch starts
 * over. The rows are matched to the file by their first token's place,
 * which the test finds through the cursor before the row. */
static void test_documents_epoch(void **state)
{
	const uint32_t B = 3, T = 32;
	struct st_dataset *ds;
	struct st_loader ld;
	int32_t in[3 * 32], tg[3 * 32];
	static uint8_t seen[NTOK];
	uint64_t want = 0, got = 0, counted = 0;

	(void)state;
	memset(seen, 0, sizeof(seen));
	for (int d = 0; d < NDOCS; d++)
		for (uint64_t i = doc_starts[d] + 1; i < doc_end(d); i++)
			want += mask[i];
	open_docs(&ds, &ld, B, T, 0, docs_path);
	while (ld.cur.epoch == 0) {
		got += st_loader_count(&ld, 1);
		st_loader_next(&ld, in, tg);
		for (uint32_t j = 0; j < B * T; j++)
			counted += tg[j] != ST_LOADER_IGNORED;
	}
	/* the count is the targets' (the last batch may reach into epoch 1) */
	assert_int_equal(got, counted);
	assert_true(got >= want && got < want + B * T);
	st_loader_rewind(&ld);
	/* each row against the file: walk the documents in order */
	{
		int d = 0, ep = 0;
		uint64_t at = doc_starts[0];

		for (int step = 0; step < 150; step++) {
			st_loader_next(&ld, in, tg);
			for (uint32_t b = 0; b < B; b++) {
				const int32_t *ri = in + b * T, *rt = tg + b * T;
				uint32_t j = 0;

				while (j < T) {
					/* a piece: from `at` in document d */
					uint64_t end = ST_MIN(doc_end(d), at + T + 1);

					if (j && j + (end - at) > T + 1)
						break;
					for (uint64_t i = at; i < end; i++, j++) {
						if (j < T)
							assert_int_equal(ri[j], toks[i]);
						if (i > at) {
							int32_t w = mask[i] ? toks[i]
									    : ST_LOADER_IGNORED;
							assert_int_equal(rt[j - 1], w);
							if (mask[i] && ep == 0)
								seen[i]++;
						}
					}
					if (end < doc_end(d)) {
						at += T;
					} else {
						d = (d + 1) % NDOCS;
						ep += d == 0;
						at = doc_starts[d];
					}
					if (j == T + 1)
						break;
				}
				for (; j < T; j++) /* padding */
					assert_true(ri[j] == 0 && rt[j] == ST_LOADER_IGNORED);
			}
		}
	}
	assert_true(ld.cur.epoch > 0); /* the 150 steps went past the first epoch */
	for (int i = 0; i < NTOK; i++)
		if (seen[i] != (mask[i] && i != (int)doc_starts[doc_of(i)]))
			fail_msg("token %d: a target %u times in the first epoch", i, seen[i]);
	st_dataset_close(ds);
}

/* The document whose first tokens a row starting at a document begins
 * with (-1: none). */
static int row_doc(const int32_t *in, uint32_t T)
{
	int found = -1;

	for (int d = 0; d < NDOCS; d++) {
		uint64_t len = ST_MIN(doc_end(d) - doc_starts[d], (uint64_t)T);
		bool eq = true;

		for (uint64_t j = 0; j < len && eq; j++)
			eq = in[j] == (int32_t)toks[doc_starts[d] + j];
		if (eq) {
			if (found >= 0)
				fail_msg("documents %d and %d begin alike", found, d);
			found = d;
		}
	}
	return found;
}

/* Shuffled: each epoch visits every document once, in another order per
 * epoch; a cursor saved mid-epoch and packed resumes the same batches;
 * windows and documents cursors are not mixed; a shard without document
 * starts is refused. */
static void test_documents_shuffle_resume(void **state)
{
	const uint32_t B = 1, T = 16;
	struct st_dataset *ds, *plain;
	struct st_loader ld, again;
	struct st_loader_config lc = { .batch = B, .seq = T, .shuffle = 1, .seed = 5,
				       .samples = ST_SAMPLES_DOCUMENTS };
	int32_t in[16], tg[16], in2[16], tg2[16];
	uint8_t packed[ST_CURSOR_BYTES];
	struct st_cursor c;
	int order[2][NDOCS];

	(void)state;
	open_docs(&ds, &ld, B, T, 1, docs_path);
	for (int e = 0; e < 2; e++) {
		uint8_t hit[NDOCS] = { 0 };

		for (uint64_t i = 0; i < NDOCS; i++) {
			struct st_loader p = ld;

			p.cur.epoch = (uint64_t)e;
			p.cur.doc = i;
			p.cur.chunk = 0;
			st_loader_next(&p, in, tg);
			order[e][i] = row_doc(in, T);
			assert_true(order[e][i] >= 0);
			hit[order[e][i]]++;
		}
		for (int d = 0; d < NDOCS; d++)
			if (hit[d] != 1)
				fail_msg("epoch %d: document %d first %u times", e, d, hit[d]);
	}
	assert_true(memcmp(order[0], order[1], sizeof(order[0])) != 0);
	{
		int in_order = 0;

		for (int i = 0; i < NDOCS; i++)
			in_order += order[0][i] == i;
		assert_true(in_order < NDOCS / 2);
	}
	/* resume: pack the cursor mid-epoch, seek a new loader there */
	for (int s = 0; s < 137; s++)
		st_loader_next(&ld, in, tg);
	st_cursor_pack(&ld.cur, packed);
	assert_int_equal(packed[4], 2); /* version 2: documents */
	assert_int_equal(st_cursor_unpack(&c, packed, sizeof(packed)), 0);
	assert_int_equal(st_loader_init(&again, ds, &lc), 0);
	assert_int_equal(st_loader_seek(&again, &c), 0);
	for (int s = 0; s < 1200; s++) {
		st_loader_next(&ld, in, tg);
		st_loader_next(&again, in2, tg2);
		assert_memory_equal(in, in2, sizeof(in));
		assert_memory_equal(tg, tg2, sizeof(tg));
	}
	assert_true(ld.cur.epoch >= 1);
	/* a documents cursor is refused by a windows loader */
	lc.samples = ST_SAMPLES_WINDOWS;
	assert_int_equal(st_loader_init(&again, ds, &lc), 0);
	assert_int_equal(st_loader_seek(&again, &c), -EINVAL);
	st_cursor_pack(&again.cur, packed);
	assert_int_equal(packed[4], 1); /* windows: version 1, as always */
	st_dataset_close(ds);
	/* no document starts */
	lc.samples = ST_SAMPLES_DOCUMENTS;
	assert_int_equal(st_dataset_open(&plain, masked_path, ST_DATASET_LLMC), 0);
	assert_int_equal(st_loader_init(&again, plain, &lc), -EINVAL);
	assert_non_null(strstr(st_error_last(), "no document starts"));
	st_dataset_close(plain);
}

/* The engine on documents (packed rows, padding ignored) = the reference
 * trainer, on the masked documents shard and on its tokens without a
 * mask. */
static void test_documents_engine(void **state)
{
	char nomask[4300];
	struct st_shard_ext e = { .doc_starts = doc_starts, .n_docs = NDOCS };
	const char *paths[2] = { docs_path, nomask };
	struct st_engine_config c;
	struct run ref, r;

	(void)state;
	snprintf(nomask, sizeof(nomask), "%s/docs-nomask.bin", dir);
	assert_int_equal(st_dataset_write_shard(nomask, toks, 2, NTOK, &e), 0);
	samples = ST_SAMPLES_DOCUMENTS;
	for (int i = 0; i < 2; i++) {
		base_config(&c, gpt2);
		trainer_run(&c, paths[i], &ref);
		c.params = ST_OFFLOAD_NVME;
		c.optim = ST_OFFLOAD_NVME;
		train(&c, paths[i], STEPS, &r);
		same(&ref, &r, i ? "documents without a mask: engine = trainer"
				  : "masked documents: engine = trainer");
		free(ref.P);
		free(r.P);
	}
	samples = ST_SAMPLES_WINDOWS;
}

/* Documents of 3 to 40 tokens (the masked shard's tokens and mask), so
 * that rows of 32 pack several: their shard's path. */
static const char *short_docs(void)
{
	static char path[4300];
	static uint64_t starts[NTOK / 3];
	struct st_shard_ext e = { .mask = mask, .doc_starts = starts };
	uint64_t x = 17;

	if (path[0])
		return path;
	snprintf(path, sizeof(path), "%s/docs-short.bin", dir);
	for (uint64_t at = 0; at < NTOK - 40; e.n_docs++) {
		starts[e.n_docs] = at;
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		at += 3 + (x >> 33) % 38;
	}
	assert_int_equal(st_dataset_write_shard(path, toks, 2, NTOK, &e), 0);
	return path;
}

/* 9. The loader's seg: 0 at each row's start, each position's start at
 * or before it and never going back, a new piece where the segment
 * starts, the target before it ignored (no target crosses documents),
 * only padding (input 0, targets ignored) in the last segment of a row
 * that ends short; windows: all 0. */
static void test_documents_seg(void **state)
{
	const uint32_t B = 3, T = 32;
	struct st_dataset *ds;
	struct st_loader ld;
	int32_t in[3 * 32], tg[3 * 32], seg[3 * 32], in2[3 * 32], tg2[3 * 32];
	int boundaries = 0;

	(void)state;
	open_docs(&ds, &ld, B, T, 1, short_docs());
	struct st_loader twin = ld;
	for (int step = 0; step < 40; step++) {
		st_loader_next_seg(&ld, in, tg, seg);
		st_loader_next(&twin, in2, tg2); /* the same batch without seg */
		assert_memory_equal(in, in2, sizeof(in));
		assert_memory_equal(tg, tg2, sizeof(tg));
		for (uint32_t b = 0; b < B; b++) {
			const int32_t *s = seg + b * T, *t = tg + b * T;

			assert_int_equal(s[0], 0);
			for (uint32_t j = 1; j < T; j++) {
				assert_true(s[j] >= s[j - 1] && s[j] <= (int32_t)j);
				if (s[j] == s[j - 1])
					continue;
				assert_int_equal(s[j], (int32_t)j);
				assert_int_equal(t[j - 1], ST_LOADER_IGNORED);
				boundaries++;
			}
		}
	}
	assert_true(boundaries > 40); /* rows do pack several documents */
	st_dataset_close(ds);
	samples = ST_SAMPLES_WINDOWS;
	struct st_engine_config c;
	base_config(&c, gpt2);
	c.train.batch = (int)B;
	c.train.seq = (int)T;
	open_loader(&ds, &ld, &c, plain_path);
	memset(seg, 0xff, sizeof(seg));
	st_loader_next_seg(&ld, in, tg, seg);
	for (size_t i = 0; i < (size_t)c.train.batch * c.train.seq; i++)
		assert_int_equal(seg[i], 0);
	st_dataset_close(ds);
}

/* 9. --packing isolated in the engine's placements and schedules = the
 * reference trainer, on the masked documents (GPT-2, LLaMA, and LLaMA at
 * the bf16 compute); the packed run differs (the mask does something). */
static void test_documents_isolated(void **state)
{
	struct st_engine_config c;
	struct run a, b;

	(void)state;
	samples = ST_SAMPLES_DOCUMENTS;
	base_config(&c, gpt2);
	trainer_run(&c, short_docs(), &a);
	c.train.isolate = true;
	trainer_run(&c, short_docs(), &b);
	if (a.loss[0] == b.loss[0] || !memcmp(a.P, b.P, a.n * sizeof(float)))
		fail_msg("isolated documents train as packed ones: seg not used");
	free(a.P);
	free(b.P);
	isolate = true;
	engine_cases_on(gpt2, false, short_docs());
	engine_cases_on(llama, false, short_docs());
	engine_cases_on(llama, true, short_docs());
	isolate = false;
	samples = ST_SAMPLES_WINDOWS;
}

/* Several files as one (st_dataset_concat): the documents shard cut in
 * two (the second half in uint32 tokens, its document starts shifted back)
 * is the shard again: its tokens, mask and starts; a part without a mask
 * counts every token; two tokenizers are refused, unknown (0) joins. */
static void test_concat(void **state)
{
	char a_path[4300], b_path[4300];
	const uint64_t cut = doc_starts[NDOCS / 2];
	static uint32_t wide[NTOK];
	uint64_t starts_b[NDOCS];
	struct st_shard_ext ea = { .tokenizer_hash = 7, .mask = mask, .doc_starts = doc_starts,
				   .n_docs = NDOCS / 2 };
	struct st_shard_ext eb = { .mask = mask + cut, .doc_starts = starts_b,
				   .n_docs = NDOCS - NDOCS / 2 };
	struct st_dataset *parts[2], *whole, *cat;
	struct st_shard_ext w, c;

	(void)state;
	snprintf(a_path, sizeof(a_path), "%s/a.bin", dir);
	snprintf(b_path, sizeof(b_path), "%s/b.bin", dir);
	for (uint64_t i = cut; i < NTOK; i++)
		wide[i - cut] = toks[i];
	for (int d = NDOCS / 2; d < NDOCS; d++)
		starts_b[d - NDOCS / 2] = doc_starts[d] - cut;
	assert_int_equal(st_dataset_write_shard(a_path, toks, 2, cut, &ea), 0);
	assert_int_equal(st_dataset_write_shard(b_path, wide, 4, NTOK - cut, &eb), 0);
	assert_int_equal(st_dataset_open(&parts[0], a_path, ST_DATASET_LLMC), 0);
	assert_int_equal(st_dataset_open(&parts[1], b_path, ST_DATASET_LLMC), 0);
	assert_int_equal(st_dataset_open(&whole, docs_path, ST_DATASET_LLMC), 0);
	assert_int_equal(st_dataset_concat(&cat, parts, 2, "a+b"), 0);
	assert_int_equal(st_dataset_tokens(cat), NTOK);
	w = st_dataset_ext(whole);
	c = st_dataset_ext(cat);
	assert_int_equal(c.tokenizer_hash, 7);
	assert_int_equal(c.n_docs, NDOCS);
	assert_memory_equal(c.doc_starts, w.doc_starts, NDOCS * sizeof(uint64_t));
	assert_memory_equal(c.mask, w.mask, NTOK);
	{ /* the tokens, through a loader in file order */
		struct st_loader_config lc = { .batch = 1, .seq = NTOK - 1 };
		struct st_loader l1, l2;
		static int32_t i1[NTOK], t1[NTOK], i2[NTOK], t2[NTOK];

		assert_int_equal(st_loader_init(&l1, whole, &lc), 0);
		assert_int_equal(st_loader_init(&l2, cat, &lc), 0);
		st_loader_next(&l1, i1, t1);
		st_loader_next(&l2, i2, t2);
		assert_memory_equal(i1, i2, (NTOK - 1) * sizeof(int32_t));
		assert_memory_equal(t1, t2, (NTOK - 1) * sizeof(int32_t));
	}
	st_dataset_close(cat);
	st_dataset_close(parts[1]);
	/* b without a mask or documents: ones there, no documents at all */
	eb = (struct st_shard_ext){ .tokenizer_hash = 0 };
	assert_int_equal(st_dataset_write_shard(b_path, wide, 4, NTOK - cut, &eb), 0);
	assert_int_equal(st_dataset_open(&parts[1], b_path, ST_DATASET_LLMC), 0);
	assert_int_equal(st_dataset_concat(&cat, parts, 2, "a+b"), 0);
	c = st_dataset_ext(cat);
	assert_null(c.doc_starts);
	assert_int_equal(c.tokenizer_hash, 7);
	assert_memory_equal(c.mask, mask, cut);
	for (uint64_t i = cut; i < NTOK; i++)
		assert_int_equal(c.mask[i], 1);
	st_dataset_close(cat);
	st_dataset_close(parts[1]);
	/* another tokenizer */
	eb.tokenizer_hash = 8;
	assert_int_equal(st_dataset_write_shard(b_path, wide, 4, NTOK - cut, &eb), 0);
	assert_int_equal(st_dataset_open(&parts[1], b_path, ST_DATASET_LLMC), 0);
	assert_int_equal(st_dataset_concat(&cat, parts, 2, "a+b"), -EINVAL);
	assert_non_null(strstr(st_error_last(), "different tokenizers"));
	st_dataset_close(parts[0]);
	st_dataset_close(parts[1]);
	st_dataset_close(whole);
}

/* cuda: the masked engine within float tolerance of the cpu's. */
static void test_cuda_close_to_cpu(void **state)
{
	struct st_engine_config c;
	struct run g, r;
	const char *const models[] = { gpt2, llama };

	(void)state;
	for (size_t mi = 0; mi < ST_ARRAY_LEN(models); mi++)
		for (int bf16 = 0; bf16 < 2; bf16++) {
			base_config(&c, models[mi]);
			c.compute_dtype = bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
			c.device = "cpu";
			train(&c, masked_path, STEPS, &r);
			c.device = "cuda";
			train(&c, masked_path, STEPS, &g);
			for (int s = 0; s < STEPS; s++) {
				double tol = bf16 ? 2e-2 : 1e-4;

				if (!(fabs(g.loss[s] - r.loss[s]) <= tol * r.loss[s]) ||
				    !(fabs(g.norm[s] - r.norm[s]) <= 10 * tol * r.norm[s]))
					fail_msg("%s%s step %d: cuda %.9g/%.9g, cpu %.9g/%.9g",
						 models[mi], bf16 ? " bf16" : "", s, g.loss[s],
						 g.norm[s], r.loss[s], r.norm[s]);
			}
			if (!getenv("ST_QUIET"))
				printf("ok   %s%s masked: cuda loss %.6f, cpu %.6f\n", models[mi],
				       bf16 ? " bf16" : "", g.loss[STEPS - 1], r.loss[STEPS - 1]);
			free(g.P);
			free(r.P);
		}
}

static int write_shards(void)
{
	uint8_t ones[NTOK], zeros[NTOK];
	struct st_shard_ext e = { 0 };
	uint64_t x = 99;

	for (int i = 0; i < NTOK; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		toks[i] = (uint16_t)(32 + (x >> 33) % 64);
		/* "prompts" of 23 tokens, "answers" of 11: a third counted */
		mask[i] = i % 34 >= 23;
		ones[i] = 1;
		zeros[i] = 0;
	}
	if (st_dataset_write_shard(plain_path, toks, 2, NTOK, NULL))
		return -1;
	e.mask = mask;
	if (st_dataset_write_shard(masked_path, toks, 2, NTOK, &e))
		return -1;
	e.mask = ones;
	if (st_dataset_write_shard(ones_path, toks, 2, NTOK, &e))
		return -1;
	e.mask = zeros;
	if (st_dataset_write_shard(zeros_path, toks, 2, NTOK, &e))
		return -1;
	/* documents of 5 to ~300 tokens (some longer than T+1), the mask */
	x = 3;
	doc_starts[0] = 0;
	for (int d = 1; d < NDOCS; d++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		doc_starts[d] = doc_starts[d - 1] + 5 + (x >> 33) % 300;
		if (doc_starts[d] >= NTOK - 10)
			return -1;
	}
	e.mask = mask;
	e.doc_starts = doc_starts;
	e.n_docs = NDOCS;
	return st_dataset_write_shard(docs_path, toks, 2, NTOK, &e);
}

static int setup(void **state)
{
	const char *base = getenv("ST_TEST_DIR");

	(void)state;
	snprintf(dir, sizeof(dir), "%s/mask-test.XXXXXX", base && *base ? base : "/var/tmp");
	if (!mkdtemp(dir))
		return -1;
	snprintf(plain_path, sizeof(plain_path), "%s/plain.bin", dir);
	snprintf(masked_path, sizeof(masked_path), "%s/masked.bin", dir);
	snprintf(ones_path, sizeof(ones_path), "%s/ones.bin", dir);
	snprintf(zeros_path, sizeof(zeros_path), "%s/zeros.bin", dir);
	snprintf(docs_path, sizeof(docs_path), "%s/docs.bin", dir);
	return write_shards();
}

static int teardown(void **state)
{
	char cmd[4200];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* 8. The forward alone. The eval's loader: path read in order. */
static void open_eval(struct st_dataset **ds, struct st_loader *ld,
		      const struct st_engine_config *c, const char *path)
{
	struct st_loader_config lc = { .batch = (uint32_t)c->train.batch,
				       .seq = (uint32_t)c->train.seq, .split = ST_SPLIT_ALL };

	assert_int_equal(st_dataset_open(ds, path, ST_DATASET_LLMC), 0);
	assert_int_equal(st_loader_init(ld, *ds, &lc), 0);
}

#define EVAL_BATCHES 3

/* The reference trainer's eval of master weights P (every unit's, in
 * order) on path. */
static double ref_eval(const struct st_engine_config *c, const float *P, const char *path)
{
	struct st_trainer *t;
	struct st_dataset *ds;
	struct st_loader ld;
	size_t off = 0;
	double loss;

	assert_int_equal(st_trainer_create(&c->train, &t), 0);
	assert_int_equal(st_trainer_set_precision(t, c->compute_dtype), 0);
	for (int u = 0; u < st_model_unit_count(st_trainer_model(t)); u++) {
		assert_int_equal(st_trainer_write_master(t, u, P + off), 0);
		off += st_model_unit_layout(st_trainer_model(t), u)->elems;
	}
	open_eval(&ds, &ld, c, path);
	assert_int_equal(st_trainer_eval(t, &ld, EVAL_BATCHES, &loss), 0);
	st_trainer_destroy(t);
	st_dataset_close(ds);
	return loss;
}

/* The eval of an engine of the forward alone (c's placement of W, no
 * G, P, M, V: their shards take no byte, and its plan less than the
 * training's, train_plan, when given) holding master weights P. */
static double forward_only_eval(const struct st_engine_config *c, const float *P,
				const char *path, const struct st_plan *train_plan,
				const char *what)
{
	struct st_engine_config fc = *c;
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;
	const struct st_plan *p;
	uint64_t count, fo_total = 0, train_total = 0;
	size_t off = 0;
	double sum;

	fc.forward_only = true;
	if (st_engine_create(&fc, &e))
		fail_msg("%s: forward-only engine: %s", what, st_error_last());
	p = st_engine_plan(e);
	for (int u = 0; u < p->units; u++)
		for (int s = ST_STATE_G; s <= ST_STATE_V; s++)
			assert_int_equal(p->state_bytes[u * ST_STATE_COUNT + s], 0);
	for (int h = 0; h < ST_HOME_COUNT; h++) {
		fo_total += p->total_bytes[h];
		train_total += train_plan ? train_plan->total_bytes[h] : 0;
	}
	if (train_plan && fo_total >= train_total)
		fail_msg("%s: the forward alone plans %llu B, training %llu B", what,
			 (unsigned long long)fo_total, (unsigned long long)train_total);
	for (int u = 0; u < p->units; u++) {
		assert_int_equal(st_engine_write_state(e, u, P + off, NULL, NULL), 0);
		off += st_model_unit_layout(st_engine_model(e), u)->elems;
	}
	assert_int_equal(st_engine_read_state(e, 0, ST_STATE_P, (float *)(void *)&sum), -EINVAL);
	open_eval(&ds, &ld, c, path);
	if (st_engine_eval(e, &ld, EVAL_BATCHES, &sum, &count))
		fail_msg("%s: forward-only eval: %s", what, st_error_last());
	st_engine_destroy(e);
	st_dataset_close(ds);
	return sum / (double)count;
}

/* Two steps of c on path, the eval, the third step: the eval against the
 * reference's and an engine of the forward alone's, the third step and
 * the weights after it against three steps without the eval. */
static void eval_case(const struct st_engine_config *c, const char *path, const char *what)
{
	struct st_engine *e;
	struct st_dataset *ds, *vds;
	struct st_loader ld, vld;
	struct st_step_result res;
	struct run plain, r = { 0 };
	double sum, ref;
	uint64_t count;
	const struct st_model *m;
	size_t off = 0;

	train(c, path, STEPS, &plain);
	open_loader(&ds, &ld, c, path);
	open_eval(&vds, &vld, c, path);
	if (st_engine_create(c, &e))
		fail_msg("%s: engine: %s", what, st_error_last());
	m = st_engine_model(e);
	r.n = plain.n;
	r.P = malloc(r.n * sizeof(float));
	for (int s = 0; s < 2; s++)
		if (st_engine_step(e, &ld, s, s == 0, &res))
			fail_msg("%s: step %d: %s", what, s, st_error_last());
	for (int u = 0; u < st_model_unit_count(m); u++) {
		assert_int_equal(st_engine_read_state(e, u, ST_STATE_P, r.P + off), 0);
		off += st_model_unit_layout(m, u)->elems;
	}
	if (st_engine_eval(e, &vld, EVAL_BATCHES, &sum, &count))
		fail_msg("%s: eval: %s", what, st_error_last());
	ref = ref_eval(c, r.P, path);
	if (memcmp(&ref, &(double){ sum / (double)count }, sizeof(double)))
		fail_msg("%s: eval %a (%.9g / %llu), the reference trainer's %a", what,
			 sum / (double)count, sum, (unsigned long long)count, ref);
	sum = forward_only_eval(c, r.P, path, st_engine_plan(e), what);
	if (memcmp(&ref, &sum, sizeof(double)))
		fail_msg("%s: the forward alone's eval %a, the reference trainer's %a", what, sum,
			 ref);
	if (st_engine_step(e, &ld, 2, false, &res))
		fail_msg("%s: step 2: %s", what, st_error_last());
	off = 0;
	for (int u = 0; u < st_model_unit_count(m); u++) {
		assert_int_equal(st_engine_read_state(e, u, ST_STATE_P, r.P + off), 0);
		off += st_model_unit_layout(m, u)->elems;
	}
	if (memcmp(&res.loss, &plain.loss[2], sizeof(double)) ||
	    memcmp(r.P, plain.P, r.n * sizeof(float)))
		fail_msg("%s: the step after the eval is not the step without it", what);
	if (!getenv("ST_QUIET"))
		printf("ok   %s: eval %.9g = the reference trainer's\n", what, ref);
	st_engine_destroy(e);
	st_dataset_close(ds);
	st_dataset_close(vds);
	free(r.P);
	free(plain.P);
}

static void test_eval_matches_trainer(void **state)
{
	static const struct {
		const char *name;
		enum st_offload params, optim;
		int prefetch;
		enum st_recompute recompute;
		enum st_schedule schedule;
	} cases[] = {
		{ "W in vram", ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, 0, ST_RECOMPUTE_ALL,
		  ST_SCHEDULE_BATCH_FIRST },
		{ "W in host", ST_OFFLOAD_HOST, ST_OFFLOAD_HOST, 0, ST_RECOMPUTE_ALL,
		  ST_SCHEDULE_BATCH_FIRST },
		{ "W on nvme, prefetch 1", ST_OFFLOAD_NVME, ST_OFFLOAD_NVME, 1, ST_RECOMPUTE_ALL,
		  ST_SCHEDULE_BATCH_FIRST },
		{ "forwards kept", ST_OFFLOAD_NONE, ST_OFFLOAD_HOST, 0, ST_RECOMPUTE_NONE,
		  ST_SCHEDULE_BATCH_FIRST },
		{ "layer-first, W on nvme", ST_OFFLOAD_NVME, ST_OFFLOAD_HOST, 0, ST_RECOMPUTE_ALL,
		  ST_SCHEDULE_LAYER_FIRST },
	};
	static const struct {
		const char *model;
		bool bf16;
	} models[] = { { gpt2, false }, { llama, false }, { llama, true } };
	const char *paths[] = { plain_path, masked_path };
	struct st_engine_config c;
	char what[256];

	(void)state;
	for (size_t k = 0; k < ST_ARRAY_LEN(models); k++)
		for (int p = 0; p < 2; p++)
			for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
				base_config(&c, models[k].model);
				c.compute_dtype = models[k].bf16 ? ST_PRECISION_BF16
								 : ST_PRECISION_FP32;
				c.params = cases[i].params;
				c.optim = cases[i].optim;
				c.prefetch = cases[i].prefetch;
				c.recompute = cases[i].recompute;
				c.schedule = cases[i].schedule;
				snprintf(what, sizeof(what), "%s%s %s: %s", models[k].model,
					 models[k].bf16 ? " bf16" : "", p ? "masked" : "plain",
					 cases[i].name);
				eval_case(&c, paths[p], what);
			}
}

/* The forward alone on the cuda device: the reference trainer's eval (on
 * the cpu) of the same weights within float tolerance, plain and masked,
 * W in vram and on nvme. */
static void test_cuda_eval(void **state)
{
	const char *const models[] = { gpt2, llama }, *paths[] = { plain_path, masked_path };
	const enum st_offload homes[] = { ST_OFFLOAD_NONE, ST_OFFLOAD_NVME };
	struct st_engine_config c;
	char what[256];
	struct run r;

	(void)state;
	for (size_t mi = 0; mi < ST_ARRAY_LEN(models); mi++)
		for (int p = 0; p < 2; p++)
			for (int h = 0; h < 2; h++) {
				double ref, l;

				base_config(&c, models[mi]);
				c.device = "cpu";
				train(&c, paths[p], STEPS, &r);
				ref = ref_eval(&c, r.P, paths[p]);
				c.device = "cuda";
				c.params = homes[h];
				snprintf(what, sizeof(what), "%s %s, W %s, cuda", models[mi],
					 p ? "masked" : "plain", h ? "on nvme" : "in vram");
				l = forward_only_eval(&c, r.P, paths[p], NULL, what);
				if (!(fabs(l - ref) <= 1e-4 * ref))
					fail_msg("%s: eval %.9g, the reference trainer's (cpu) %.9g",
						 what, l, ref);
				if (!getenv("ST_QUIET"))
					printf("ok   %s: eval %.6f, the cpu reference %.6f\n", what, l,
					       ref);
				free(r.P);
			}
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_loader_targets),
		cmocka_unit_test(test_loss_is_mean_over_counted),
		cmocka_unit_test(test_engine_matches_trainer),
		cmocka_unit_test(test_all_ones_is_plain),
		cmocka_unit_test(test_empty_step),
		cmocka_unit_test(test_in_backward),
		cmocka_unit_test(test_documents_epoch),
		cmocka_unit_test(test_documents_shuffle_resume),
		cmocka_unit_test(test_concat),
		cmocka_unit_test(test_documents_engine),
		cmocka_unit_test(test_documents_seg),
		cmocka_unit_test(test_documents_isolated),
		cmocka_unit_test(test_eval_matches_trainer),
	};
	const struct CMUnitTest cuda_tests[] = {
		cmocka_unit_test(test_cuda_close_to_cpu),
		cmocka_unit_test(test_cuda_eval),
	};

	if (argc == 3 && strcmp(argv[1], "--device") == 0) {
		device = argv[2];
	} else if (argc != 1) {
		fprintf(stderr, "usage: test_mask [--device cpu|cuda]\n");
		return argc == 2 && strcmp(argv[1], "--help") == 0 ? 0 : 2;
	}
	if (strcmp(device, "cuda") == 0) {
#ifdef ST_HAVE_CUDA
		if (!st_cuda_available()) {
			fprintf(stderr, "SKIP: no usable GPU\n");
			return 77;
		}
		return cmocka_run_group_tests(cuda_tests, setup, teardown);
#else
		(void)cuda_tests;
		fprintf(stderr, "SKIP: this build has no cuda device\n");
		return 77;
#endif
	}
	return cmocka_run_group_tests(tests, setup, teardown);
}
