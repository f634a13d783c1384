/* What inference reads beside a model's shapes, kept from --init to the
 * export: the special tokens' ids (bos_token_id, eos_token_id: an id or a
 * list; pad_token_id) that transformers' generate() takes from
 * generation_config.json or config.json, and the export's torch_dtype.
 * train writes the --init's ids into --save DIR/generation_config.json
 * when the --init has none (as transformers' save_pretrained() derives it
 * from config.json); export puts them into its config.json. */
#include "cli.h"
#include "strata/file.h"

#include <errno.h>
#include <json-c/json.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GEN_CONFIG "generation_config.json"
#define META_MAX_BYTES ((size_t)1 << 24)

static const char *const token_keys[] = { "bos_token_id", "eos_token_id", "pad_token_id" };

/* The directory whose config.json describes the weights at path: path
 * itself, or the one of a .safetensors file; false for an llm.c file
 * (whatever sits beside it is not its). */
static bool weights_dir(const char *path, char *out, size_t n)
{
	struct stat st;
	size_t len = strlen(path);
	static const char ext[] = ".safetensors";
	char *copy;

	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		snprintf(out, n, "%s", path);
		return true;
	}
	if (len <= sizeof(ext) - 1 || strcmp(path + len - (sizeof(ext) - 1), ext) != 0 ||
	    !(copy = strdup(path)))
		return false;
	snprintf(out, n, "%s", dirname(copy));
	free(copy);
	return true;
}

/* Each token key src has and dst has not, into dst; how many. A file that
 * is not there or not JSON gives none. */
static int take_keys(struct json_object *dst, const char *src)
{
	struct json_object *root, *v;
	int n = 0;

	if (access(src, R_OK) < 0 || st_file_read_json(src, META_MAX_BYTES, &root) < 0)
		return 0;
	for (size_t i = 0; i < ST_ARRAY_LEN(token_keys); i++)
		if (!json_object_object_get_ex(dst, token_keys[i], NULL) &&
		    json_object_object_get_ex(root, token_keys[i], &v) && v &&
		    json_object_object_add(dst, token_keys[i], json_object_get(v)) == 0)
			n++;
	json_object_put(root);
	return n;
}

/* root to path, as strata writes JSON (pretty, a newline), whole or not
 * at all; exit 1 naming the file on failure. */
static void write_json(const char *path, struct json_object *root)
{
	struct st_file_atomic fa;
	size_t len;
	const char *text = json_object_to_json_string_length(
		root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE,
		&len);
	int ret = text ? st_file_atomic_open(&fa, path) : -ENOMEM;

	if (ret == 0) {
		ret = st_file_atomic_write(&fa, text, len);
		if (ret == 0)
			ret = st_file_atomic_write(&fa, "\n", 1);
		if (ret == 0)
			ret = st_file_atomic_commit(&fa);
		else
			st_file_atomic_abort(&fa);
	}
	if (ret < 0)
		st_cli_die(1, "%s: %s", path, strerror(-ret));
}

/* from to to, whole or not at all (an existing to is left); exit 1 naming
 * the file on failure. */
static bool copy_file(const char *from, const char *to)
{
	struct st_file_atomic fa;
	char *buf = NULL;
	size_t bytes = 0;
	int ret = st_file_read_small(from, META_MAX_BYTES, &buf, &bytes);

	if (ret < 0)
		st_cli_die(1, "%s: %s", from, strerror(-ret));
	ret = st_file_atomic_open(&fa, to);
	if (ret == 0) {
		ret = st_file_atomic_write(&fa, buf, bytes);
		if (ret == 0)
			ret = st_file_atomic_commit_new(&fa);
		else
			st_file_atomic_abort(&fa);
	}
	free(buf);
	if (ret < 0 && ret != -EEXIST)
		st_cli_die(1, "%s: %s", to, strerror(-ret));
	return ret == 0;
}

bool st_cli_generation_config(const char *init, const char *to)
{
	char dir[4096], cfg[4200], dst[4200];
	struct json_object *root;
	bool wrote = false;

	snprintf(dst, sizeof(dst), "%s/%s", to, GEN_CONFIG);
	if (access(dst, F_OK) == 0 || !weights_dir(init, dir, sizeof(dir)))
		return false;
	snprintf(cfg, sizeof(cfg), "%s/%s", dir, GEN_CONFIG);
	if (access(cfg, R_OK) == 0) /* --init's own (without a tokenizer.json beside it) */
		return copy_file(cfg, dst);
	snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
	root = json_object_new_object();
	if (!root)
		st_cli_die(1, "out of memory");
	json_object_object_add(root, "_from_model_config", json_object_new_boolean(1));
	if (take_keys(root, cfg) > 0) {
		write_json(dst, root);
		wrote = true;
	}
	json_object_put(root);
	return wrote;
}

void st_cli_hf_inference_keys(const char *config, const char *src, const char *tok_dir,
			      bool bf16)
{
	char dir[4096], path[4200];
	struct json_object *root;
	int ret = st_file_read_json(config, META_MAX_BYTES, &root);

	if (ret < 0)
		st_cli_die(1, "%s", st_error_last());
	/* the source's config.json (a Hugging Face directory's), then the
	 * generation_config.json beside the weights or their tokenizer (a
	 * --save DIR's, from its --init) */
	if (weights_dir(src, dir, sizeof(dir))) {
		snprintf(path, sizeof(path), "%s/config.json", dir);
		take_keys(root, path);
		snprintf(path, sizeof(path), "%s/%s", dir, GEN_CONFIG);
		take_keys(root, path);
	}
	if (tok_dir) {
		snprintf(path, sizeof(path), "%s/%s", tok_dir, GEN_CONFIG);
		take_keys(root, path);
	}
	json_object_object_add(root, "torch_dtype",
			       json_object_new_string(bf16 ? "bfloat16" : "float32"));
	write_json(config, root);
	json_object_put(root);
}
