/* strata: a model family (GPT-2 today; LLaMA next) behind one ops table.
 *
 * A family is a `static const struct st_family_ops` with designated
 * initialisers, name first, each hook marked Required or Optional below,
 * found by name in the registry (src/model/family.c). The core never calls
 * a hook directly: struct st_model (strata/model.h) is the instance, and
 * its st_model_* wrappers check their arguments and call the hooks; the
 * st_model_config_* functions do the same for the config.
 *
 * A new family is one file (copy src/model/gpt2.c and gpt2_config.c) and
 * one line in the registry's list of built-in families (st_families[] in
 * src/model/family.c); docs/model.md says what each hook must hold. The
 * engine sees only units, layouts, reads_unit and resident: nothing of a
 * family's shape leaks past strata/model.h.
 *
 * Hooks return 0 or -errno with st_error_set(), as everywhere in strata. */
#ifndef STRATA_FAMILY_H
#define STRATA_FAMILY_H

#include "strata/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_object;
struct st_family_body;

/* A family's name is shorter than this, without ':', '=' or ','. */
#define ST_FAMILY_NAME_MAX 48

/* The version of this table; a table of another is refused. */
#define ST_FAMILY_ABI 1

struct st_family_ops {
	/* Required. The family's name: --model's prefix ("gpt2:..."). */
	const char *name;
	/* Required. ST_FAMILY_ABI. */
	unsigned abi;
	/* Required. The family in words, for messages ("GPT-2"). */
	const char *title;
	/* Optional. Its presets, comma-separated, for --help ("tiny,gpt2"). */
	const char *presets;
	/* Required. config.json's model_type values that are this family,
	 * NULL-terminated ({"gpt2", NULL}). */
	const char *const *hf_model_types;
	/* Optional. config.json's architectures that are this family, for a
	 * config without model_type, NULL-terminated. */
	const char *const *hf_architectures;

	/* ---- the config (cfg->family is set by the caller) ---- */

	/* Optional. Fill *out from a preset name: 0, or -ENOENT (not one of
	 * its presets; no error set, *out untouched). */
	int (*config_preset)(const char *name, struct st_model_config *out);
	/* Required. Fill *out from dimensions text ("layers=12,dim=768,...")
	 * and check it: 0 or -EINVAL with the reason (*out untouched). */
	int (*config_parse)(const char *text, struct st_model_config *out);
	/* Required. 0, or -EINVAL naming the field out of range. */
	int (*config_check)(const struct st_model_config *cfg);
	/* Required. cfg as the text config_parse reads back, into buf. */
	void (*config_format)(const struct st_model_config *cfg, char *buf, size_t bytes);
	/* Required. cfg in words ("GPT-2, 12 layers, dim 768, ..."), into buf. */
	void (*config_describe)(const struct st_model_config *cfg, char *buf, size_t bytes);
	/* Required. The shape's integer fields of its config.json, in order,
	 * into out (room for ST_MODEL_CONFIG_FIELDS_MAX): how many. */
	int (*config_fields)(const struct st_model_config *cfg, struct st_config_field *out);
	/* Required. Read the shape from config.json's parsed root (path for
	 * messages) into *out: 0, or -EINVAL naming the field. */
	int (*hf_config_read)(const char *path, struct json_object *root,
			      struct st_model_config *out);
	/* Required. Add every field Hugging Face needs to build the model to
	 * root (an empty object): 0, -EINVAL (naming path) for a cfg that
	 * hf_config_read would refuse, or -ENOMEM. */
	int (*hf_config_write)(const char *path, const struct st_model_config *cfg,
			       struct json_object *root);
	/* Optional. Refuse a config.json of this family that describes a model
	 * the family does not compute: 0 or -EINVAL with the reason. */
	int (*hf_config_check)(const char *path, struct json_object *root);

	/* ---- the units ---- */

	/* Required. With units NULL: set *n_units and *n_tensors (all units'
	 * tensors) only. Else lay every unit out into units[*n_units] and
	 * tensors[*n_tensors] (zeroed by the caller), unit order, each unit's
	 * tensors added with st_unit_tensor_add(), kind, block, reads_unit and
	 * resident set; the caller pads elems to ST_MODEL_UNIT_ALIGN_ELEMS.
	 * cfg is checked. Returns 0 or -EINVAL. */
	int (*layout)(const struct st_model_config *cfg, struct st_unit_layout *units,
		      struct st_tensor_layout *tensors, int *n_units, int *n_tensors);
	/* Required. st_model_init_unit(): u is in range. */
	int (*init_unit)(const struct st_model *m, int u, uint64_t seed, float *params);
	/* Required. st_model_work_bytes(): u in range, B, T >= 1. */
	size_t (*work_bytes)(const struct st_model *m, int u, int B, int T);
	/* Required. st_model_act_bytes(): u in range, B, T >= 1. */
	size_t (*act_bytes)(const struct st_model *m, int u, int B, int T);
	/* Optional. Refuse a batch too large for the family's index types
	 * (-EINVAL); called after the unit, B and T <= ctx are checked. */
	int (*batch_check)(const struct st_model *m, int B, int T);
	/* Required. st_model_fwd(), the call checked: u, batch, workspace, the
	 * ids of the batch the unit reads. */
	int (*fwd)(const struct st_model *m, int u, const struct st_model_batch *batch,
		   const void *params, const void *other, const float *x, float *y,
		   float *loss, void *work, size_t work_bytes);
	/* Required. st_model_bwd(), checked likewise (loss_scale too). */
	int (*bwd)(const struct st_model *m, int u, const struct st_model_batch *batch,
		   const void *params, const void *other, const float *x, const float *dy,
		   float *dx, float *grad, float *other_grad, float *loss, void *work,
		   size_t work_bytes);
	/* Required. st_model_flops_per_token(). */
	double (*flops_per_token)(const struct st_model *m, int T);
	/* Optional. st_model_logits(), the workspace checked. */
	int (*logits)(const struct st_model *m, const void *params, const void *other,
		      const float *x, float *logits, void *work, size_t work_bytes);

	/* Optional. The tensors a Hugging Face file of this family may hold
	 * that are not the model's own (buffers the family derives, such as
	 * attention masks or rotary inv_freq; a tied head's copy), as
	 * fnmatch(3) patterns, NULL-terminated ({"h.*.attn.bias", NULL}).
	 * Reading weights skips these; any other tensor that is not the
	 * model's is refused, naming it (strata/weights.h). */
	const char *const *hf_derived;

	/* ---- a kept forward (the backward without its recompute) ---- */

	/* Optional (with fwd_save and bwd_saved). st_model_saved_bytes():
	 * the bytes of unit u's forward buffers that its backward reads (0:
	 * the unit keeps nothing: its backward recomputes no forward), and
	 * in *scratch_bytes the workspace its fwd and bwd need besides them.
	 * u in range, B, T >= 1. Without the hook no unit keeps. */
	size_t (*saved_bytes)(const struct st_model *m, int u, int B, int T,
			      size_t *scratch_bytes);
	/* Optional. st_model_fwd_save(), checked as fwd: saved NULL is fwd
	 * (one workspace); else the unit's forward buffers are in saved. */
	int (*fwd_save)(const struct st_model *m, int u, const struct st_model_batch *batch,
			const void *params, const void *other, const float *x, float *y,
			float *loss, void *saved, size_t saved_bytes, void *work,
			size_t work_bytes);
	/* Optional. st_model_bwd_saved(), checked as bwd: saved NULL is bwd;
	 * else saved holds the unit's forward (fwd_save) and is not
	 * recomputed. */
	int (*bwd_saved)(const struct st_model *m, int u, const struct st_model_batch *batch,
			 const void *params, const void *other, const float *x,
			 const float *dy, float *dx, float *grad, float *other_grad,
			 float *loss, void *saved, size_t saved_bytes, void *work,
			 size_t work_bytes);
	/* Optional. st_model_unit_flops_per_token(): unit u's share of
	 * flops_per_token (the shares add up to it). */
	double (*unit_flops_per_token)(const struct st_model *m, int u, int T);
	/* Optional (false: fp32 only). The family's fwd, bwd, fwd_save,
	 * bwd_saved, logits, work_bytes and saved_bytes follow
	 * st_model_precision() (strata/model.h: bf16 params and activations
	 * between ops under ST_PRECISION_BF16). */
	bool bf16;
	/* Optional. The family's body for src/model's shared unit driver
	 * (src/model/body.h: its embedding, block and head's tensors, once
	 * for every compute dtype), whose st_unit_* functions a built-in
	 * family gives as its work_bytes, saved_bytes, act_bytes, fwd, bwd,
	 * fwd_save, bwd_saved and logits: those read the body of the
	 * model's family, so a family that borrows them sets body too.
	 * Unused by the core. */
	const struct st_family_body *body;
};

/* ---- the registry ---- */

/* The family called name, or NULL (with -ENOENT and the list of families
 * in st_error_last()). */
const struct st_family_ops *st_family_find(const char *name);

/* The family of a Hugging Face config.json: by model_type when it is not
 * NULL, else by architecture when that is not NULL, else the first family
 * (GPT-2). NULL when model_type or architecture names none (with -EINVAL
 * in st_error_last()). */
const struct st_family_ops *st_family_find_hf(const char *model_type,
					      const char *architecture);

/* The first family, GPT-2: what a config without a family means. */
const struct st_family_ops *st_family_default(void);

/* The families' names, comma-separated, for --help ("gpt2"). Static. */
const char *st_family_list(void);

/* The registration check: 0, or -EINVAL naming what ops lacks (a
 * required hook, the name, its ABI). */
int st_family_check(const struct st_family_ops *ops);

/* Add a family (ops static, borrowed) after the built-in ones. Before any
 * other thread uses the registry. Returns 0, -EINVAL (st_family_check()),
 * -EEXIST (its name, one of its model_types or presets is another
 * family's: it would be shadowed), -ENOSPC (the list is full). */
int st_family_register(const struct st_family_ops *ops);

/* ---- helpers for families ---- */

/* Add a tensor (d1 0: 1-D of d0) to unit ul being laid out, at t, at the
 * next offset (ul->elems holds the running offset: it starts at 0) aligned
 * to ST_MODEL_TENSOR_ALIGN_ELEMS. */
void st_unit_tensor_add(struct st_unit_layout *ul, struct st_tensor_layout *t,
			const char *name, int64_t d0, int64_t d1, bool decay);

/* The len digits at s (a value of --model's dims: "layers=12"), at most 9
 * of them, as *out: 0, or -EINVAL for no digit, a non-digit or too many. */
int st_family_parse_posint(const char *s, size_t len, int *out);

/* splitmix64's finaliser: the hash of initialisation keys. */
uint64_t st_family_mix64(uint64_t z);

/* n normal(0, std) values from the key: Marsaglia's polar method on a
 * splitmix64 stream with a logarithm in IEEE basic operations, the same on
 * every machine. */
void st_family_fill_normal(float *out, size_t n, uint64_t key, double std);

struct st_compute;

/* The mean of n per-row losses in c's memory: summed in row order in
 * double, brought to the host a chunk at a time (each chunk a wait for
 * the device: 4096 rows, so B x T = 8192 costs two); NaN when a copy
 * failed (c's error says why). The heads of the families return it. */
float st_family_mean_loss(struct st_compute *c, const float *losses, size_t n);
/* The same sum over div instead of n (a masked step's count). */
float st_family_sum_loss(struct st_compute *c, const float *losses, size_t n, uint64_t div);

/* A family's workspace, carved into aligned float buffers in order: after
 * st_carver_init(cv, work, work_bytes), each st_carve(cv, n) returns the
 * next n floats (64-byte aligned), or NULL once they do not fit; need_bytes
 * counts what every carving asked for, so the same code computes the
 * workspace's size (work NULL) and lays it out. */
#define ST_WORK_ALIGN 64

struct st_carver {
	char *p;
	size_t left_bytes;
	size_t need_bytes; /* what the carving asked for, fits or not */
};

static inline float *st_carve(struct st_carver *cv, size_t n_floats)
{
	size_t bytes = st_align_up(n_floats * sizeof(float), ST_WORK_ALIGN);
	cv->need_bytes += bytes;
	if (!cv->p || bytes > cv->left_bytes) {
		cv->p = NULL;
		return NULL;
	}
	float *r = (float *)cv->p;
	cv->p += bytes;
	cv->left_bytes -= bytes;
	return r;
}

static inline void st_carver_init(struct st_carver *cv, void *work, size_t work_bytes)
{
	cv->need_bytes = ST_WORK_ALIGN; /* room to align the base */
	cv->p = NULL;
	cv->left_bytes = 0;
	if (!work)
		return;
	uintptr_t base = (uintptr_t)work;
	uintptr_t aligned = (base + ST_WORK_ALIGN - 1) & ~(uintptr_t)(ST_WORK_ALIGN - 1);
	if (work_bytes < aligned - base)
		return;
	cv->p = (char *)aligned;
	cv->left_bytes = work_bytes - (aligned - base);
}

#endif
