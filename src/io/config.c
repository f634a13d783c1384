/* GPT-2's config.json, as Hugging Face transformers reads and writes it. */
#include "strata/io.h"

#include "strata/file.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <string.h>
#include <stdlib.h>

/* A config.json is a few hundred bytes; refuse anything absurd. */
#define ST_CONFIG_MAX_BYTES (1u << 20)

static int st_config_check(const char *path, const struct st_gpt2_config *c)
{
	const struct {
		const char *name;
		int64_t v;
	} f[] = {
		{ "n_embd", c->n_embd }, { "n_layer", c->n_layer },
		{ "n_head", c->n_head }, { "vocab_size", c->vocab_size },
		{ "n_positions", c->n_positions },
	};

	for (size_t i = 0; i < ST_ARRAY_LEN(f); i++)
		if (f[i].v <= 0 || f[i].v > INT32_MAX)
			return st_error_set(-EINVAL, "%s: %s is %lld, expected "
					    "1..%d", path, f[i].name,
					    (long long)f[i].v, INT32_MAX);
	if (c->n_embd % c->n_head)
		return st_error_set(-EINVAL, "%s: n_head %lld does not divide "
				    "n_embd %lld", path, (long long)c->n_head,
				    (long long)c->n_embd);
	return 0;
}

static int st_config_get(const char *path, struct json_object *root,
			 const char *key, const char *alt, int64_t *out)
{
	struct json_object *v = NULL;

	if (!json_object_object_get_ex(root, key, &v) &&
	    !(alt && json_object_object_get_ex(root, alt, &v)))
		return st_error_set(-EINVAL, "%s: missing \"%s\"", path, key);
	if (!json_object_is_type(v, json_type_int))
		return st_error_set(-EINVAL, "%s: \"%s\" is not an integer",
				    path, key);
	*out = json_object_get_int64(v);
	return 0;
}

int st_gpt2_config_read(const char *path, struct st_gpt2_config *out)
{
	struct st_gpt2_config c;
	struct json_tokener *tok;
	struct json_object *root;
	enum json_tokener_error jerr;
	size_t bytes;
	char *text;
	int err;

	err = st_file_read_small(path, ST_CONFIG_MAX_BYTES, &text, &bytes);
	if (err)
		return err;
	tok = json_tokener_new();
	if (!tok) {
		free(text);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	root = json_tokener_parse_ex(tok, text, (int)bytes);
	jerr = json_tokener_get_error(tok);
	json_tokener_free(tok);
	free(text);
	if (!root || jerr != json_tokener_success) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: not valid JSON: %s", path,
				    jerr == json_tokener_continue ?
				    "unexpected end of data" :
				    json_tokener_error_desc(jerr));
	}
	if (!json_object_is_type(root, json_type_object)) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: not a JSON object", path);
	}
	err = st_config_get(path, root, "n_embd", NULL, &c.n_embd);
	if (!err)
		err = st_config_get(path, root, "n_layer", NULL, &c.n_layer);
	if (!err)
		err = st_config_get(path, root, "n_head", NULL, &c.n_head);
	if (!err)
		err = st_config_get(path, root, "vocab_size", NULL,
				    &c.vocab_size);
	if (!err)
		err = st_config_get(path, root, "n_positions", "n_ctx",
				    &c.n_positions);
	json_object_put(root);
	if (!err)
		err = st_config_check(path, &c);
	if (!err)
		*out = c;
	return err;
}

/* Attach val, or drop it and note the failure (out of memory). */
static void st_config_add(struct json_object *obj, const char *key,
			  struct json_object *val, bool *oom)
{
	if (*oom || !obj || !val || json_object_object_add(obj, key, val)) {
		json_object_put(val);
		*oom = true;
	}
}

int st_gpt2_config_write(const char *path, const struct st_gpt2_config *cfg)
{
	struct st_file_atomic f;
	struct json_object *root, *arch;
	const char *text;
	size_t len;
	bool oom;
	int err;

	err = st_config_check(path, cfg);
	if (err)
		return err;
	root = json_object_new_object();
	oom = !root;
	/* The fields HF's GPT2Config needs to build the model strata trains
	 * (GELU tanh, pre-LN, eps 1e-5, tied head). */
	arch = json_object_new_array();
	if (!arch || json_object_array_add(arch, json_object_new_string(
			"GPT2LMHeadModel")))
		oom = true;
	st_config_add(root, "architectures", arch, &oom);
	st_config_add(root, "model_type", json_object_new_string("gpt2"), &oom);
	st_config_add(root, "n_embd", json_object_new_int64(cfg->n_embd), &oom);
	st_config_add(root, "n_layer", json_object_new_int64(cfg->n_layer),
		      &oom);
	st_config_add(root, "n_head", json_object_new_int64(cfg->n_head), &oom);
	st_config_add(root, "vocab_size",
		      json_object_new_int64(cfg->vocab_size), &oom);
	st_config_add(root, "n_positions",
		      json_object_new_int64(cfg->n_positions), &oom);
	st_config_add(root, "n_ctx", json_object_new_int64(cfg->n_positions),
		      &oom);
	st_config_add(root, "activation_function",
		      json_object_new_string("gelu_new"), &oom);
	st_config_add(root, "layer_norm_epsilon", json_object_new_double(1e-5),
		      &oom);
	st_config_add(root, "tie_word_embeddings", json_object_new_boolean(1),
		      &oom);
	text = oom ? NULL : json_object_to_json_string_length(root,
			JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
			JSON_C_TO_STRING_NOSLASHESCAPE, &len);
	if (!text) {
		json_object_put(root);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	err = st_file_atomic_open(&f, path);
	if (!err) {
		err = st_file_atomic_write(&f, text, len);
		if (!err)
			err = st_file_atomic_write(&f, "\n", 1);
		if (err)
			st_file_atomic_abort(&f);
		else
			err = st_file_atomic_commit(&f);
	}
	json_object_put(root);
	return err;
}
