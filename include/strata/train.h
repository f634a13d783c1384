/* strata: the training loop, in memory (every state of every unit in host
 * RAM). The tiered engine (docs/design.md) drives the same units with the
 * same arithmetic; this trainer is its reference.
 *
 * Per step: grad_accum micro-batches of forward (keeping each unit's input)
 * and backward (recomputing each unit from its input), the global gradient
 * norm summed unit by unit in fp64 (deterministic), the clip coefficient and
 * 1/grad_accum folded into AdamW's gradient scale, then the fused CPU AdamW
 * per tensor (weight decay on matrices and embeddings only), which also
 * writes the bf16 (or fp32) working weights W that the next forward reads.
 * Functions return 0 or -errno; details in st_error_last(). */
#ifndef STRATA_TRAIN_H
#define STRATA_TRAIN_H

#include "strata/common.h"
#include "strata/dataset.h"
#include "strata/model.h"

#include <stdbool.h>

enum st_lr_schedule { ST_LR_COSINE, ST_LR_CONSTANT };

struct st_train_config {
	struct st_model_config model;
	int batch, seq, grad_accum;
	double lr, min_lr_frac;       /* cosine decays to lr * min_lr_frac */
	enum st_lr_schedule schedule;
	int warmup;                   /* steps of linear warm-up */
	int steps;                    /* total steps (for the schedule) */
	int schedule_steps;           /* the steps the LR schedule spans; 0: steps. A
				       * run extended past its total keeps the
				       * total it started with (the added steps
				       * at the final LR) */
	double wd, beta1, beta2, eps;
	double clip;                  /* global-norm clip; 0 disables */
	uint64_t seed;
	bool bf16;                    /* W in bf16 (else fp32) */
	/* --packing isolated: the loader's segment starts go with each batch
	 * (model.h's batch.seg), so packed documents do not attend across
	 * each other; false: causal over the whole row */
	bool isolate;
};

/* Fill the defaults (tiny model, B=8, T=128, lr 1e-3 cosine, warmup 10,
 * wd 0.1, betas 0.9/0.95, eps 1e-8, clip 1.0, seed 1337, bf16). */
void st_train_config_default(struct st_train_config *c);

struct st_trainer;

/* Build the model, allocate every buffer once (no allocation in the step
 * loop) and initialise the parameters from cfg->seed. */
int st_trainer_create(const struct st_train_config *cfg, struct st_trainer **out);
void st_trainer_destroy(struct st_trainer *t);

const struct st_model *st_trainer_model(const struct st_trainer *t);

/* Unit u's weights as the forward reads them (the model's precision:
 * fp32, or bf16 under a bf16 compute dtype; st_model_unit_layout()'s elems
 * values) into dst: what st_model_decode_step() takes. 0 or -EINVAL. */
int st_trainer_unit_weights(struct st_trainer *t, int u, void *dst);

/* Replace the parameters with w's (strata/weights.h: a strata checkpoint,
 * a Hugging Face GPT-2 in F32, BF16 or F16, an llm.c model file). Every
 * tensor of the model must be there with its exact shape. Moments are
 * zeroed. */
struct st_weights;
int st_trainer_load_weights(struct st_trainer *t, struct st_weights *w);

/* Run the model at compute precision p (strata/model.h; fp32 at create):
 * under bf16 the forward reads W as bf16 (fp32 W rounded). 0, -ENOTSUP
 * (the family has no such path), -ENOMEM (a larger workspace). */
int st_trainer_set_precision(struct st_trainer *t, enum st_precision p);

/* Copy unit u's fp32 master weights into p (the unit's flat length). */
int st_trainer_read_master(const struct st_trainer *t, int u, float *p);

/* Set unit u's fp32 master weights (and the working copy from them) to
 * p[0..the unit's flat length): e.g. the tiered engine's P, for an
 * evaluation. Returns 0 or -EINVAL for a bad u. */
int st_trainer_write_master(struct st_trainer *t, int u, const float *p);

struct st_step_result {
	double loss;       /* mean over the micro-batches; a loss mask's: over
			      the step's counted targets (0 when none) */
	double grad_norm;  /* before clipping */
	double lr;
	bool skipped;      /* a NaN/Inf gradient: no update was made */
	bool empty;        /* a loss mask left no target in the step: no update
			      was made */
	bool in_backward;  /* the engine's --update in-backward: the update
			      ran in the backward (the speculation held) */
	bool replayed;     /* ... held only when the step's forwards and
			      backwards ran again: the clip applied to its
			      speculation, and no final G was kept to redo
			      the update from */
};

/* One optimizer step at step number `step` (0-based) over grad_accum
 * batches drawn from ld. */
int st_trainer_step(struct st_trainer *t, struct st_loader *ld, int step,
		    struct st_step_result *res);

/* The sum of the counted targets' losses over n_batches drawn from ld
 * (with a loss mask, the ignored ones give 0) and their count (every target
 * without a mask): a loss over several calls is sum / count. */
int st_trainer_eval_sum(struct st_trainer *t, struct st_loader *ld, int n_batches,
			double *sum, uint64_t *count);

/* Mean loss over n_batches batches from ld, no update. */
int st_trainer_eval(struct st_trainer *t, struct st_loader *ld, int n_batches,
		    double *mean_loss);

/* Logits of the last position of tokens[0..n) (the last ctx of them are
 * used). logits has vocab floats. */
int st_trainer_logits(struct st_trainer *t, const int32_t *tokens, int n,
		      float *logits);

struct st_adam_step;

/* The step's two prepared AdamW steps (with and without weight decay): the
 * learning rate of `step` (0-based), bias correction for step + 1, and the
 * clip coefficient of grad_norm folded into the gradient scale. One place,
 * so the engine and the reference trainer cannot drift apart. */
int st_train_adam_prep(const struct st_train_config *c, int step, double grad_norm,
		       struct st_adam_step *with_wd, struct st_adam_step *without_wd);

/* Learning rate of step (0-based) under cfg's schedule. */
double st_lr_at(const struct st_train_config *cfg, int step);

#endif
