/* strata: the registry of model families, and the config functions that
 * reach a family through it (strata/family.h, strata/model.h). */
#include "strata/family.h"
#include "strata/compute.h"

#include "strata/file.h"
#include "gpt2.h"
#include "llama.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the registry ---------------------------------------------------------- */

/* The built-in families; the first is what a config without one means. */
static const struct st_family_ops *const st_families[] = {
	&st_family_gpt2,
	&st_family_llama,
};

#define ST_FAMILY_MAX 16
static const struct st_family_ops *st_registered[ST_FAMILY_MAX];
static int st_n_registered;

static int family_count(void)
{
	return (int)ST_ARRAY_LEN(st_families) + st_n_registered;
}

static const struct st_family_ops *family_at(int i)
{
	int nb = (int)ST_ARRAY_LEN(st_families);

	return i < nb ? st_families[i] : st_registered[i - nb];
}

/* "a,b,c" of each family's name, or of its presets. */
static const char *family_join(char *buf, size_t bytes, bool presets)
{
	size_t len = 0;

	buf[0] = '\0';
	for (int i = 0; i < family_count(); i++) {
		const struct st_family_ops *f = family_at(i);
		const char *s = presets ? f->presets : f->name;

		int n;

		if (!s || !*s)
			continue;
		n = snprintf(buf + len, bytes - len, "%s%s", len ? "," : "", s);
		if (n < 0 || (size_t)n >= bytes - len) { /* full: stop at the last whole name */
			buf[len] = '\0';
			break;
		}
		len += (size_t)n;
	}
	return buf;
}

const char *st_family_list(void)
{
	static char buf[512];

	return family_join(buf, sizeof(buf), false);
}

const char *st_model_preset_list(void)
{
	static char buf[1024];

	return family_join(buf, sizeof(buf), true);
}

const struct st_family_ops *st_family_default(void)
{
	return st_families[0];
}

const struct st_family_ops *st_family_find(const char *name)
{
	for (int i = 0; name && i < family_count(); i++)
		if (strcmp(family_at(i)->name, name) == 0)
			return family_at(i);
	st_error_set(-ENOENT, "model: unknown family '%s' (families: %s)", name ? name : "",
		     st_family_list());
	return NULL;
}

static bool in_list(const char *const *list, const char *s)
{
	for (; list && *list; list++)
		if (strcmp(*list, s) == 0)
			return true;
	return false;
}

/* Every family's Hugging Face model_types (or architectures), comma
 * separated, into buf: what a config.json may name. */
static const char *hf_names(char *buf, size_t bytes, bool types)
{
	size_t len = 0;

	buf[0] = '\0';
	for (int i = 0; i < family_count(); i++) {
		const struct st_family_ops *f = family_at(i);

		for (const char *const *t = types ? f->hf_model_types : f->hf_architectures;
		     t && *t; t++) {
			int n = snprintf(buf + len, bytes - len, "%s%s", len ? ", " : "", *t);

			if (n < 0 || (size_t)n >= bytes - len) {
				buf[len] = '\0';
				return buf;
			}
			len += (size_t)n;
		}
	}
	return buf;
}

const struct st_family_ops *st_family_find_hf(const char *model_type,
					      const char *architecture)
{
	for (int i = 0; (model_type || architecture) && i < family_count(); i++) {
		const struct st_family_ops *f = family_at(i);

		if (model_type ? in_list(f->hf_model_types, model_type)
			       : in_list(f->hf_architectures, architecture))
			return f;
	}
	if (model_type || architecture) {
		char known[512];

		st_error_set(-EINVAL, "%s \"%s\" is no family strata knows (%s: %s)",
			     model_type ? "model_type" : "architecture",
			     model_type ? model_type : architecture,
			     model_type ? "model_types" : "architectures",
			     hf_names(known, sizeof(known), model_type != NULL));
		return NULL;
	}
	return st_family_default();
}

int st_family_check(const struct st_family_ops *f)
{
	if (!f || !f->name || !*f->name)
		return st_error_set(-EINVAL, "family: a table without a name");
	/* --model NAME:... must be able to reach it */
	if (strlen(f->name) >= ST_FAMILY_NAME_MAX || strpbrk(f->name, ":=,"))
		return st_error_set(-EINVAL, "family '%s': a name is under %d characters, "
				    "without ':', '=' or ','", f->name, ST_FAMILY_NAME_MAX);
	if (f->abi != ST_FAMILY_ABI)
		return st_error_set(-EINVAL, "family %s: ABI %u, this strata has %u", f->name,
				    f->abi, ST_FAMILY_ABI);
	const struct {
		const char *what;
		bool there;
	} req[] = {
		{ "title", f->title != NULL },
		{ "hf_model_types", f->hf_model_types && f->hf_model_types[0] },
		{ "config_parse", f->config_parse != NULL },
		{ "config_check", f->config_check != NULL },
		{ "config_format", f->config_format != NULL },
		{ "config_describe", f->config_describe != NULL },
		{ "config_fields", f->config_fields != NULL },
		{ "hf_config_read", f->hf_config_read != NULL },
		{ "hf_config_write", f->hf_config_write != NULL },
		{ "layout", f->layout != NULL },
		{ "init_unit", f->init_unit != NULL },
		{ "work_bytes", f->work_bytes != NULL },
		{ "act_bytes", f->act_bytes != NULL },
		{ "fwd", f->fwd != NULL },
		{ "bwd", f->bwd != NULL },
		{ "flops_per_token", f->flops_per_token != NULL },
	};
	for (size_t i = 0; i < ST_ARRAY_LEN(req); i++)
		if (!req[i].there)
			return st_error_set(-EINVAL, "family %s: the required hook %s is missing",
					    f->name, req[i].what);
	return 0;
}

/* Does the comma-separated list have the word w (of n characters)? */
static bool list_has(const char *list, const char *w, size_t n)
{
	for (const char *p = list; p && *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (len == n && strncmp(p, w, n) == 0)
			return true;
		p = end ? end + 1 : NULL;
	}
	return false;
}

/* A name, model_type or preset of ops that family g has already (it would
 * be shadowed by g, silently), copied into buf; NULL when none. */
static const char *family_clash(const struct st_family_ops *g,
				const struct st_family_ops *ops, char *buf, size_t bytes)
{
	if (strcmp(g->name, ops->name) == 0)
		return ops->name;
	for (const char *const *t = ops->hf_model_types; *t; t++)
		for (const char *const *u = g->hf_model_types; *u; u++)
			if (strcmp(*t, *u) == 0)
				return *t;
	for (const char *p = ops->presets; p && *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (list_has(g->presets, p, len)) {
			snprintf(buf, bytes, "%.*s", (int)len, p);
			return buf;
		}
		p = end ? end + 1 : NULL;
	}
	return NULL;
}

int st_family_register(const struct st_family_ops *ops)
{
	int err = st_family_check(ops);

	if (err)
		return err;
	for (int i = 0; i < family_count(); i++) {
		const struct st_family_ops *g = family_at(i);
		char word[64];
		const char *clash = family_clash(g, ops, word, sizeof(word));

		if (clash)
			return st_error_set(-EEXIST, "family %s: '%s' is family %s's already",
					    ops->name, clash, g->name);
	}
	if (st_n_registered == ST_FAMILY_MAX)
		return st_error_set(-ENOSPC, "family %s: the registry is full (%d)", ops->name,
				    ST_FAMILY_MAX);
	st_registered[st_n_registered++] = ops;
	return 0;
}

/* ---- the config -------------------------------------------------------------- */

const struct st_family_ops *st_model_config_family(const struct st_model_config *cfg)
{
	return cfg->family ? cfg->family : st_family_default();
}

int st_model_config_check(const struct st_model_config *cfg)
{
	return st_model_config_family(cfg)->config_check(cfg);
}

bool st_model_config_equal(const struct st_model_config *a, const struct st_model_config *b)
{
	return st_model_config_family(a) == st_model_config_family(b) &&
	       a->n_layer == b->n_layer && a->dim == b->dim && a->n_head == b->n_head &&
	       a->n_kv_head == b->n_kv_head && a->ffn_dim == b->ffn_dim &&
	       a->vocab == b->vocab && a->ctx == b->ctx && a->head_dim == b->head_dim &&
	       a->untied == b->untied && a->qkv_bias == b->qkv_bias &&
	       a->norm_eps == b->norm_eps && a->rope_theta == b->rope_theta &&
	       a->rope_type == b->rope_type && a->rope_factor == b->rope_factor &&
	       a->rope_low_freq_factor == b->rope_low_freq_factor &&
	       a->rope_high_freq_factor == b->rope_high_freq_factor &&
	       a->rope_original_ctx == b->rope_original_ctx;
}

char *st_model_config_format(const struct st_model_config *cfg, char *buf, size_t bytes)
{
	st_model_config_family(cfg)->config_format(cfg, buf, bytes);
	return buf;
}

char *st_model_config_describe(const struct st_model_config *cfg, char *buf, size_t bytes)
{
	st_model_config_family(cfg)->config_describe(cfg, buf, bytes);
	return buf;
}

int st_model_config_fields(const struct st_model_config *cfg, struct st_config_field *out)
{
	return st_model_config_family(cfg)->config_fields(cfg, out);
}

/* text with its family: "gpt2:..." names one; else presets of every
 * family, then dimensions of the first. */
int st_model_config_parse(const char *text, struct st_model_config *out)
{
	const struct st_family_ops *f = NULL;
	const char *colon, *eq, *rest = text;
	struct st_model_config c = { 0 };
	int err;

	if (!text || !*text)
		return st_error_set(-EINVAL, "model: empty model name");
	colon = strchr(text, ':');
	eq = strchr(text, '=');
	if (colon && (!eq || colon < eq)) {
		char name[ST_FAMILY_NAME_MAX + 1];

		snprintf(name, sizeof(name), "%.*s", (int)(colon - text), text);
		f = st_family_find(name);
		if (!f)
			return st_error_set(-EINVAL, "model: unknown family '%s' in '%s' "
					    "(families: %s)", name, text, st_family_list());
		rest = colon + 1;
		if (!*rest)
			return st_error_set(-EINVAL, "model: '%s' names a family, not a model",
					    text);
	}
	for (int i = 0; i < family_count(); i++) {
		const struct st_family_ops *g = family_at(i);

		if ((f && g != f) || !g->config_preset)
			continue;
		if (g->config_preset(rest, &c) == 0) {
			c.family = g;
			*out = c;
			return 0;
		}
	}
	if (!strchr(rest, '='))
		return st_error_set(-EINVAL,
				    "model: unknown model '%s' (presets: %s, or "
				    "layers=L,dim=C,heads=H,vocab=V,ctx=T)",
				    text, st_model_preset_list());
	if (!f)
		f = st_family_default();
	err = f->config_parse(rest, &c);
	if (err)
		return err;
	c.family = f;
	*out = c;
	return 0;
}

/* ---- config.json --------------------------------------------------------------- */

/* A config.json is a few hundred bytes; refuse anything absurd. */
#define ST_CONFIG_MAX_BYTES (1u << 20)

static int json_read(const char *path, struct json_object **out)
{
	return st_file_read_json(path, ST_CONFIG_MAX_BYTES, out);
}

/* root's family: model_type, else the first architecture, else the first. */
static const struct st_family_ops *json_family(const char *path, struct json_object *root)
{
	struct json_object *v = NULL;
	const char *type = NULL, *arch = NULL;
	const struct st_family_ops *f;

	if (json_object_object_get_ex(root, "model_type", &v)) {
		if (!json_object_is_type(v, json_type_string)) {
			st_error_set(-EINVAL, "%s: \"model_type\" is not a string", path);
			return NULL;
		}
		type = json_object_get_string(v);
	} else if (json_object_object_get_ex(root, "architectures", &v) &&
		 json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0 &&
		 json_object_is_type(json_object_array_get_idx(v, 0), json_type_string))
		arch = json_object_get_string(json_object_array_get_idx(v, 0));
	f = st_family_find_hf(type, arch);
	if (!f)
		st_error_set(-EINVAL, "%s: %s", path, st_error_last());
	return f;
}

int st_model_config_read(const char *path, struct st_model_config *out)
{
	struct st_model_config c = { 0 };
	const struct st_family_ops *f;
	struct json_object *root = NULL;
	int err = json_read(path, &root);

	if (err)
		return err;
	f = json_family(path, root);
	err = f ? f->hf_config_read(path, root, &c) : -EINVAL;
	json_object_put(root);
	if (err)
		return err;
	c.family = f;
	*out = c;
	return 0;
}

int st_model_config_hf_check(const char *path)
{
	struct json_object *root = json_object_from_file(path);
	const struct st_family_ops *f;
	int ret = 0;

	if (!root || !json_object_is_type(root, json_type_object)) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: not a JSON object", path);
	}
	f = json_family(path, root);
	if (!f)
		ret = -EINVAL;
	else if (f->hf_config_check)
		ret = f->hf_config_check(path, root);
	json_object_put(root);
	return ret;
}

int st_model_config_write(const char *path, const struct st_model_config *cfg)
{
	const struct st_family_ops *f = st_model_config_family(cfg);
	struct st_file_atomic fa;
	struct json_object *root;
	const char *text = NULL;
	size_t len;
	int err;

	root = json_object_new_object();
	err = root ? f->hf_config_write(path, cfg, root) : -ENOMEM;
	if (err == -EINVAL) {
		json_object_put(root);
		return err;
	}
	if (!err)
		text = json_object_to_json_string_length(root,
			JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
			JSON_C_TO_STRING_NOSLASHESCAPE, &len);
	if (!text) {
		json_object_put(root);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	err = st_file_atomic_open(&fa, path);
	if (!err) {
		err = st_file_atomic_write(&fa, text, len);
		if (!err)
			err = st_file_atomic_write(&fa, "\n", 1);
		if (err)
			st_file_atomic_abort(&fa);
		else
			err = st_file_atomic_commit(&fa);
	}
	json_object_put(root);
	return err;
}

/* ---- helpers for families ------------------------------------------------------- */

void st_unit_tensor_add(struct st_unit_layout *ul, struct st_tensor_layout *t,
			const char *name, int64_t d0, int64_t d1, bool decay)
{
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->ndim = d1 ? 2 : 1;
	t->shape[0] = d0;
	t->shape[1] = d1 ? d1 : 1;
	t->n_elems = (uint64_t)d0 * (uint64_t)(d1 ? d1 : 1);
	t->offset_elems = ul->elems;
	t->decay = decay;
	ul->elems = st_align_up(ul->elems + t->n_elems, ST_MODEL_TENSOR_ALIGN_ELEMS);
	ul->param_elems += t->n_elems;
	ul->n_tensors++;
}

int st_family_parse_posint(const char *s, size_t len, int *out)
{
	long v = 0;

	if (len == 0 || len > 9)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (s[i] - '0');
	}
	*out = (int)v;
	return 0;
}

uint64_t st_family_mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ln(s) for s in (0,1] with frexp (exact) and an atanh series in basic
 * operations only: libm's log may differ in the last bit between
 * machines, this does not (IEEE double, no contraction under -std=c11). */
static double det_log(double s)
{
	int e;
	double mant = frexp(s, &e); /* s = mant * 2^e, mant in [0.5,1) */
	if (mant < 0.70710678118654752) {
		mant *= 2.0;
		e -= 1;
	}
	double t = (mant - 1.0) / (mant + 1.0), t2 = t * t;
	double sum = 0.0;
	for (int k = 21; k >= 1; k -= 2)
		sum = sum * t2 + 1.0 / (double)k;
	return 2.0 * t * sum + (double)e * 0.69314718055994530942;
}

void st_family_fill_normal(float *out, size_t n, uint64_t key, double std)
{
	uint64_t state = key;
	size_t i = 0;
	while (i < n) {
		double v1, v2, s;
		do {
			state += 0x9e3779b97f4a7c15ull;
			v1 = (double)(st_family_mix64(state) >> 11) * 0x1.0p-52 - 1.0;
			state += 0x9e3779b97f4a7c15ull;
			v2 = (double)(st_family_mix64(state) >> 11) * 0x1.0p-52 - 1.0;
			s = v1 * v1 + v2 * v2;
		} while (s >= 1.0 || s == 0.0);
		double f = sqrt(-2.0 * det_log(s) / s);
		out[i++] = (float)(v1 * f * std);
		if (i < n)
			out[i++] = (float)(v2 * f * std);
	}
}

double st_model_sum_losses(const float *losses, size_t n)
{
	double s = 0.0;

	for (size_t i = 0; i < n; i++)
		s += losses[i];
	return s;
}

float st_model_mean_loss(const float *losses, size_t n)
{
	double s = 0.0;

	for (size_t i = 0; i < n; i++)
		s += losses[i];
	return (float)(s / (double)n);
}

float st_family_mean_loss(struct st_compute *c, const float *losses, size_t n)
{
	return st_family_sum_loss(c, losses, n, n);
}

float st_family_sum_loss(struct st_compute *c, const float *losses, size_t n, uint64_t div)
{
	float chunk[4096];
	double s = 0.0;

	for (size_t i0 = 0; i0 < n; i0 += ST_ARRAY_LEN(chunk)) {
		size_t len = ST_MIN(ST_ARRAY_LEN(chunk), n - i0);

		st_compute_to_host(c, chunk, losses + i0, len * sizeof(float));
		if (c->err)
			return NAN;
		for (size_t i = 0; i < len; i++)
			s += chunk[i];
	}
	return (float)(s / (double)div);
}
