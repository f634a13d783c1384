/* strata: the GPT-2 family's config: presets, --model's dimensions, the
 * check, and Hugging Face's config.json (GPT2Config's fields). */
#include "gpt2.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

static const struct {
	const char *name;
	struct st_model_config cfg;
} st_presets[] = {
	/* byte-level, for tests and smoke runs */
	{"tiny", {.n_layer = 4, .dim = 128, .n_head = 4, .vocab = 256, .ctx = 256}},
	{"gpt2", {.n_layer = 12, .dim = 768, .n_head = 12, .vocab = 50257, .ctx = 1024}},
	{"gpt2-medium", {.n_layer = 24, .dim = 1024, .n_head = 16, .vocab = 50257, .ctx = 1024}},
	{"gpt2-large", {.n_layer = 36, .dim = 1280, .n_head = 20, .vocab = 50257, .ctx = 1024}},
	{"gpt2-xl", {.n_layer = 48, .dim = 1600, .n_head = 25, .vocab = 50257, .ctx = 1024}},
};

int st_gpt2_config_preset(const char *name, struct st_model_config *out)
{
	for (size_t i = 0; i < ST_ARRAY_LEN(st_presets); i++) {
		if (strcmp(name, st_presets[i].name) == 0) {
			*out = st_presets[i].cfg;
			return 0;
		}
	}
	return -ENOENT;
}

/* Limits keep every B*T*4C product and tensor offset far from overflow. */
#define ST_MAX_DIM (1 << 16)
#define ST_MAX_VOCAB (1 << 24)
#define ST_MAX_LAYERS 4096

int st_gpt2_config_check(const struct st_model_config *c)
{
	if (c->n_layer < 1 || c->n_layer > ST_MAX_LAYERS)
		return st_error_set(-EINVAL, "model: layers must be in 1..%d, got %d",
				    ST_MAX_LAYERS, c->n_layer);
	if (c->dim < 1 || c->dim > ST_MAX_DIM)
		return st_error_set(-EINVAL, "model: dim must be in 1..%d, got %d",
				    ST_MAX_DIM, c->dim);
	if (c->n_head < 1 || c->dim % c->n_head != 0)
		return st_error_set(-EINVAL,
				    "model: heads (%d) must be >= 1 and divide dim (%d)",
				    c->n_head, c->dim);
	if (c->vocab < 1 || c->vocab > ST_MAX_VOCAB)
		return st_error_set(-EINVAL, "model: vocab must be in 1..%d, got %d",
				    ST_MAX_VOCAB, c->vocab);
	if (c->ctx < 1 || c->ctx > ST_MAX_DIM)
		return st_error_set(-EINVAL, "model: ctx must be in 1..%d, got %d",
				    ST_MAX_DIM, c->ctx);
	if (c->n_kv_head || c->ffn_dim)
		return st_error_set(-EINVAL, "model: GPT-2 has no kv heads (%d) nor ffn dim (%d) "
				    "of its own", c->n_kv_head, c->ffn_dim);
	return 0;
}

int st_gpt2_config_parse(const char *text, struct st_model_config *out)
{
	static const char *keys[] = {"layers", "dim", "heads", "vocab", "ctx"};
	int vals[5], seen[5] = {0};
	const char *p = text;
	while (*p) {
		const char *comma = strchr(p, ',');
		size_t item_len = comma ? (size_t)(comma - p) : strlen(p);
		const char *eq = memchr(p, '=', item_len);
		if (!eq)
			return st_error_set(-EINVAL, "model: '%.*s' in '%s' is not key=value",
					    (int)item_len, p, text);
		size_t key_len = (size_t)(eq - p);
		int k = -1;
		for (int i = 0; i < 5; i++)
			if (strlen(keys[i]) == key_len && !strncmp(p, keys[i], key_len))
				k = i;
		if (k < 0)
			return st_error_set(-EINVAL,
					    "model: unknown key '%.*s' in '%s' (keys: layers, dim, heads, vocab, ctx)",
					    (int)key_len, p, text);
		if (seen[k])
			return st_error_set(-EINVAL, "model: key '%s' given twice in '%s'",
					    keys[k], text);
		if (st_family_parse_posint(eq + 1, item_len - key_len - 1, &vals[k]))
			return st_error_set(-EINVAL,
					    "model: '%s' needs a positive integer, got '%.*s'",
					    keys[k], (int)(item_len - key_len - 1), eq + 1);
		seen[k] = 1;
		if (!comma)
			break;
		p = comma + 1;
		if (!*p)
			return st_error_set(-EINVAL, "model: trailing ',' in '%s'", text);
	}
	for (int i = 0; i < 5; i++)
		if (!seen[i])
			return st_error_set(-EINVAL, "model: '%s' lacks key '%s' (need layers, dim, heads, vocab, ctx)",
					    text, keys[i]);
	struct st_model_config c = {.n_layer = vals[0], .dim = vals[1],
				    .n_head = vals[2], .vocab = vals[3], .ctx = vals[4]};
	int err = st_gpt2_config_check(&c);
	if (err)
		return err;
	*out = c;
	return 0;
}

void st_gpt2_config_format(const struct st_model_config *c, char *buf, size_t bytes)
{
	snprintf(buf, bytes, "layers=%d,dim=%d,heads=%d,vocab=%d,ctx=%d", c->n_layer, c->dim,
		 c->n_head, c->vocab, c->ctx);
}

void st_gpt2_config_describe(const struct st_model_config *c, char *buf, size_t bytes)
{
	snprintf(buf, bytes, "GPT-2, %d layers, dim %d, %d heads, vocab %d, ctx %d",
		 c->n_layer, c->dim, c->n_head, c->vocab, c->ctx);
}

int st_gpt2_config_fields(const struct st_model_config *c, struct st_config_field *out)
{
	out[0] = (struct st_config_field){ "n_layer", c->n_layer };
	out[1] = (struct st_config_field){ "n_embd", c->dim };
	out[2] = (struct st_config_field){ "n_head", c->n_head };
	out[3] = (struct st_config_field){ "vocab_size", c->vocab };
	out[4] = (struct st_config_field){ "n_positions", c->ctx };
	return 5;
}

/* ---- config.json ----------------------------------------------------------- */

static int hf_get(const char *path, struct json_object *root, const char *key,
		  const char *alt, int64_t *out)
{
	struct json_object *v = NULL;

	if (!json_object_object_get_ex(root, key, &v) &&
	    !(alt && json_object_object_get_ex(root, alt, &v)))
		return st_error_set(-EINVAL, "%s: missing \"%s\"", path, key);
	if (!json_object_is_type(v, json_type_int))
		return st_error_set(-EINVAL, "%s: \"%s\" is not an integer", path, key);
	*out = json_object_get_int64(v);
	return 0;
}

/* v: n_embd, n_layer, n_head, vocab_size, n_positions. */
static int hf_check(const char *path, const int64_t *v)
{
	static const char *const keys[] = { "n_embd", "n_layer", "n_head", "vocab_size",
					     "n_positions" };

	for (size_t i = 0; i < ST_ARRAY_LEN(keys); i++)
		if (v[i] <= 0 || v[i] > INT32_MAX)
			return st_error_set(-EINVAL, "%s: %s is %lld, expected 1..%d", path,
					    keys[i], (long long)v[i], INT32_MAX);
	if (v[0] % v[2])
		return st_error_set(-EINVAL, "%s: n_head %lld does not divide n_embd %lld", path,
				    (long long)v[2], (long long)v[0]);
	return 0;
}

int st_gpt2_hf_config_read(const char *path, struct json_object *root,
			   struct st_model_config *out)
{
	static const struct {
		const char *key, *alt;
	} f[] = {
		{ "n_embd", NULL }, { "n_layer", NULL }, { "n_head", NULL },
		{ "vocab_size", NULL }, { "n_positions", "n_ctx" },
	};
	int64_t v[ST_ARRAY_LEN(f)];
	int err = 0;

	/* every field there and an integer, then every one in range */
	for (size_t i = 0; !err && i < ST_ARRAY_LEN(f); i++)
		err = hf_get(path, root, f[i].key, f[i].alt, &v[i]);
	if (!err)
		err = hf_check(path, v);
	if (err)
		return err;
	*out = (struct st_model_config){ .dim = (int)v[0], .n_layer = (int)v[1],
					 .n_head = (int)v[2], .vocab = (int)v[3],
					 .ctx = (int)v[4] };
	return 0;
}

/* Attach val, or drop it and note the failure (out of memory). */
static void hf_add(struct json_object *obj, const char *key, struct json_object *val,
		   bool *oom)
{
	if (*oom || !obj || !val || json_object_object_add(obj, key, val)) {
		json_object_put(val);
		*oom = true;
	}
}

int st_gpt2_hf_config_write(const char *path, const struct st_model_config *c,
			    struct json_object *root)
{
	const int64_t v[] = { c->dim, c->n_layer, c->n_head, c->vocab, c->ctx };
	struct json_object *arch;
	bool oom = false;
	int err = hf_check(path, v);

	if (err)
		return err;

	/* The fields HF's GPT2Config needs to build the model strata trains
	 * (GELU tanh, pre-LN, eps 1e-5, tied head). */
	arch = json_object_new_array();
	if (!arch || json_object_array_add(arch, json_object_new_string("GPT2LMHeadModel")))
		oom = true;
	hf_add(root, "architectures", arch, &oom);
	hf_add(root, "model_type", json_object_new_string("gpt2"), &oom);
	hf_add(root, "n_embd", json_object_new_int64(c->dim), &oom);
	hf_add(root, "n_layer", json_object_new_int64(c->n_layer), &oom);
	hf_add(root, "n_head", json_object_new_int64(c->n_head), &oom);
	hf_add(root, "vocab_size", json_object_new_int64(c->vocab), &oom);
	hf_add(root, "n_positions", json_object_new_int64(c->ctx), &oom);
	hf_add(root, "n_ctx", json_object_new_int64(c->ctx), &oom);
	hf_add(root, "activation_function", json_object_new_string("gelu_new"), &oom);
	hf_add(root, "layer_norm_epsilon", json_object_new_double(1e-5), &oom);
	hf_add(root, "tie_word_embeddings", json_object_new_boolean(1), &oom);
	return oom ? -ENOMEM : 0;
}

/* transformers' names for GELU's tanh form, the one strata computes. */
static bool tanh_gelu(const char *name)
{
	return strcmp(name, "gelu_new") == 0 || strcmp(name, "gelu_pytorch_tanh") == 0 ||
	       strcmp(name, "gelu_fast") == 0;
}

int st_gpt2_hf_config_check(const char *path, struct json_object *root)
{
	struct json_object *v;

	if (json_object_object_get_ex(root, "tie_word_embeddings", &v) &&
	    json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v))
		return st_error_set(-EINVAL, "%s: an untied head (tie_word_embeddings false) is "
				    "not GPT-2 as strata trains it", path);
	if (json_object_object_get_ex(root, "activation_function", &v) &&
	    (!json_object_is_type(v, json_type_string) || !tanh_gelu(json_object_get_string(v))))
		return st_error_set(-EINVAL, "%s: activation_function %s; strata's GPT-2 uses "
				    "GELU's tanh form (gelu_new)", path, json_object_to_json_string(v));
	if (json_object_object_get_ex(root, "layer_norm_epsilon", &v) &&
	    json_object_get_double(v) != 1e-5)
		return st_error_set(-EINVAL, "%s: layer_norm_epsilon %g; strata's GPT-2 uses 1e-05",
				    path, json_object_get_double(v));
	return 0;
}
