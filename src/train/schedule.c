/* The step's schedule, shared by the tiered engine and the in-memory
 * trainer: the learning rate at a step, and AdamW's per-step constants
 * (clip, decay or not) from it. Both trainers call these, so neither
 * reaches into the other for them. */
#include "strata/optim.h"
#include "strata/train.h"

#include <math.h>

double st_lr_at(const struct st_train_config *c, int step)
{
	double min_lr = c->lr * c->min_lr_frac, progress;
	int total = c->schedule_steps > 0 ? c->schedule_steps : c->steps;

	if (step < c->warmup)
		return c->lr * (step + 1) / c->warmup;
	if (c->schedule == ST_LR_CONSTANT || total <= c->warmup)
		return c->lr;
	progress = (double)(step - c->warmup) / (double)(total - c->warmup);
	if (progress > 1)
		progress = 1;
	return min_lr + 0.5 * (c->lr - min_lr) * (1.0 + cos(M_PI * progress));
}

int st_train_adam_prep(const struct st_train_config *c, int step, double grad_norm,
		       struct st_adam_step *with_wd, struct st_adam_step *without_wd)
{
	double clip_coef = 1.0;
	struct st_adam_hparams hp;
	int ret;

	if (c->clip > 0 && grad_norm > c->clip)
		clip_coef = c->clip / (grad_norm + 1e-6);
	hp = (struct st_adam_hparams){ .lr = (float)st_lr_at(c, step), .beta1 = (float)c->beta1,
				       .beta2 = (float)c->beta2, .eps = (float)c->eps,
				       .weight_decay = (float)c->wd,
				       .grad_scale = (float)clip_coef, .step = (uint64_t)step + 1 };
	ret = st_adam_prep(with_wd, &hp);
	hp.weight_decay = 0;
	if (ret == 0)
		ret = st_adam_prep(without_wd, &hp);
	return ret;
}
