/* strata: `strata info --ckpt PATH`: a checkpoint directory (what --resume
 * would take, every step-N there, --verify their sizes and XXH64) or other
 * weights (a Hugging Face directory or file, an llm.c model file). */
#include "cli.h"
#include "info.h"
#include "strata/ckpt.h"
#include "strata/io.h"
#include "strata/model.h"
#include "strata/tokenizer.h"
#include "strata/weights.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *path_join(const char *a, const char *b)
{
	size_t n = strlen(a) + strlen(b) + 2;
	char *p = malloc(n);

	if (!p)
		st_cli_die(1, "out of memory");
	snprintf(p, n, "%s/%s", a, b);
	return p;
}

/* A run saving into the --save directory may prune (or replace) a
 * checkpoint while it is read here: that is no damage. "pruned" or
 * "replaced" for a stamped directory that is no longer there as it was,
 * else NULL (then the failure is the checkpoint's own). */
static const char *gone_since(const char *dir, const struct st_ckpt_stamp *st)
{
	switch (st_ckpt_fate(dir, st)) {
	case ST_CKPT_PRUNED: return "pruned";
	case ST_CKPT_REPLACED: return "replaced";
	case ST_CKPT_THERE: break;
	}
	return NULL;
}

/* The files a set of weights is in (strata/ckpt.h): the index, each file
 * with its size and tensor count, the dtypes, tensors, parameters. */
static struct json_object *set_json(const struct st_ckpt_set *set)
{
	struct json_object *o = json_object_new_object(), *files = json_object_new_array();
	uint64_t per[ST_SF_DTYPE_COUNT] = { 0 }, params = 0;
	char dtypes[256] = "";

	if (st_ckpt_set_index_name(set)[0])
		put_str(o, "index", st_ckpt_set_index_name(set));
	for (size_t i = 0; i < st_ckpt_set_files(set); i++) {
		const struct st_safetensors *sf = st_ckpt_reader_file(st_ckpt_set_reader(set, i));
		struct json_object *f = json_object_new_object();

		for (size_t k = 0; k < st_safetensors_count(sf); k++) {
			const struct st_sf_info *t = st_safetensors_at(sf, k);

			per[t->dtype]++;
			params += t->elems;
		}
		put_str(f, "name", st_ckpt_set_file_name(set, i));
		put_int(f, "bytes", (int64_t)st_ckpt_set_file_bytes(set, i));
		put_int(f, "tensors", (int64_t)st_safetensors_count(sf));
		json_object_array_add(files, f);
	}
	for (int d = 0; d < ST_SF_DTYPE_COUNT; d++)
		if (per[d]) {
			size_t n = strlen(dtypes);

			snprintf(dtypes + n, sizeof(dtypes) - n, "%s%s %llu", n ? ", " : "",
				 st_sf_dtype_name((enum st_sf_dtype)d), (unsigned long long)per[d]);
		}
	put_str(o, "dtypes", dtypes);
	put_int(o, "tensors", (int64_t)st_ckpt_set_count(set));
	put_int(o, "params", (int64_t)params);
	put_int(o, "data_bytes", (int64_t)st_ckpt_set_data_bytes(set));
	json_object_object_add(o, "files", files);
	return o;
}

/* config.json's first architecture (or model_type), for the line
 * "architecture: LlamaForCausalLM"; NULL when it has neither. */
static void put_architecture(struct json_object *o, const char *config)
{
	struct json_object *root = json_object_from_file(config), *v;

	if (!root)
		return;
	if (json_object_object_get_ex(root, "architectures", &v) &&
	    json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0 &&
	    json_object_is_type(json_object_array_get_idx(v, 0), json_type_string))
		put_str(o, "architecture", json_object_get_string(json_object_array_get_idx(v, 0)));
	else if (json_object_object_get_ex(root, "model_type", &v) &&
		 json_object_is_type(v, json_type_string))
		put_str(o, "architecture", json_object_get_string(v));
	json_object_put(root);
}

/* The tokenizer beside a checkpoint or weights (as generate finds it: in
 * dir, in dir/.., beside a file): "tokenizer": {path, kind, vocab}, or
 * {path, error} when it does not open. */
static void put_tokenizer(struct json_object *o, const char *at)
{
	struct json_object *t;
	struct st_tokenizer *tok;
	char dir[4096], *p;

	if (!st_cli_tokenizer_dir(at, dir, sizeof(dir)) ||
	    asprintf(&p, "%s/tokenizer.json", dir) < 0)
		return;
	t = json_object_new_object();
	put_str(t, "path", p);
	if (st_tokenizer_open(p, &tok) == 0) {
		put_str(t, "kind", st_tokenizer_kind(tok));
		put_int(t, "vocab", st_tokenizer_vocab(tok));
		st_tokenizer_close(tok);
	} else {
		put_str(t, "error", st_cli_unprefix(st_error_last(), p));
	}
	json_object_object_add(o, "tokenizer", t);
	free(p);
}

static void print_tokenizer(struct json_object *o)
{
	struct json_object *t = jobj(o, "tokenizer");

	if (!t)
		return;
	if (jstr(t, "error"))
		printf("  tokenizer: %s: %s\n", jstr(t, "path"), jstr(t, "error"));
	else
		printf("  tokenizer: %s (%s, %lld ids)\n", jstr(t, "path"), jstr(t, "kind"),
		       (long long)jint(t, "vocab"));
}

/* "  weights: N parameters in T tensors (F32 27, BF16 1), in S shards (index)";
 * what: "weights" or "files" */
static void print_set(struct json_object *wt, const char *what, const char *tail)
{
	struct json_object *files = jobj(wt, "files");
	size_t n = files ? json_object_array_length(files) : 0;

	printf("  %s: %lld %s in %lld tensors (%s)", what, (long long)jint(wt, "params"),
	       strcmp(what, "weights") == 0 ? "parameters" : "values",
	       (long long)jint(wt, "tensors"), jstr(wt, "dtypes"));
	if (jstr(wt, "index"))
		printf(", in %zu shards (%s)", n, jstr(wt, "index"));
	printf("%s\n", tail);
}

static void print_set_files(struct json_object *wt)
{
	struct json_object *files = jobj(wt, "files");
	char a[32];

	for (size_t i = 0; files && i < json_object_array_length(files); i++) {
		struct json_object *f = json_object_array_get_idx(files, i);

		printf("  %-34s %10s  %lld tensors\n", jstr(f, "name"),
		       bytes_or_unknown(jint(f, "bytes"), a, sizeof(a)), (long long)jint(f, "tensors"));
	}
}

/* One checkpoint directory: its trainer.json in brief, config.json and the
 * weights file's header read (as a resume would), and --verify. One that
 * was pruned or replaced while it was read gets "pruned" or "replaced"
 * instead of an error, and does not count as bad. */
static struct json_object *ckpt_entry(const char *name, const char *dir, bool verify,
				       bool *bad)
{
	struct json_object *o = json_object_new_object();
	struct st_ckpt_trainer tr;
	struct st_model_config gc;
	struct st_ckpt_set *set;
	struct st_ckpt_stamp st;
	char *p = path_join(dir, ST_CKPT_TRAINER_FILE);
	uint64_t bytes = 0;
	const char *gone;
	int ret;

	put_str(o, "name", name);
	/* Listed, then pruned before its reading began. */
	if (st_ckpt_stamp(dir, &st) == -ENOENT) {
		free(p);
		put_bool(o, "pruned", true);
		return o;
	}
	ret = st_ckpt_trainer_read(p, &tr);
	free(p);
	if (ret == 0) {
		put_int(o, "step", (int64_t)tr.step);
		for (size_t i = 0; i < tr.n_files; i++)
			bytes += tr.files[i].bytes;
		put_int(o, "bytes", (int64_t)bytes);
		ret = st_ckpt_check(dir, &tr);
		if (ret == 0 && verify)
			ret = st_ckpt_verify(dir, &tr);
		st_ckpt_trainer_fini(&tr);
	}
	if (ret == 0) {
		p = path_join(dir, ST_CKPT_CONFIG_FILE);
		ret = st_model_config_read(p, &gc);
		free(p);
	}
	if (ret == 0) {
		ret = st_ckpt_set_open(&set, dir, ST_CKPT_MODEL_STEM);
		if (ret == 0)
			st_ckpt_set_close(set);
	}
	if (ret < 0 && (gone = gone_since(dir, &st))) {
		put_bool(o, gone, true);
	} else if (ret < 0) {
		put_bool(o, "ok", false);
		put_str(o, "error", st_error_last());
		*bad = true;
	} else if (verify) {
		put_bool(o, "ok", true);
	}
	return o;
}

/* The shape's fields of mc's config.json (the family's names) into model. */
static void put_config(struct json_object *model, const struct st_model_config *mc)
{
	struct st_config_field f[ST_MODEL_CONFIG_FIELDS_MAX];
	int n = st_model_config_fields(mc, f);

	for (int i = 0; i < n; i++)
		put_int(model, f[i].key, f[i].value);
}

/* Details of the checkpoint in dir: step, seed, model, config, files; its
 * model into *mc (mc->n_layer 0 when unknown). */
static void ckpt_details(struct json_object *o, const char *dir, bool *bad,
			 struct st_model_config *mc)
{
	struct st_ckpt_trainer tr;
	struct st_model_config gc;
	struct st_ckpt_set *set;
	struct json_object *files, *model;
	char *p = path_join(dir, ST_CKPT_TRAINER_FILE);
	char hex[17];
	int ret = st_ckpt_trainer_read(p, &tr);

	free(p);
	if (ret < 0) {
		put_str(o, "error", st_error_last());
		*bad = true;
		return;
	}
	put_int(o, "step", (int64_t)tr.step);
	json_object_object_add(o, "seed", json_object_new_uint64(tr.seed));
	json_object_object_add(o, "config", json_tokener_parse(tr.config_json ? tr.config_json : "{}"));
	files = json_object_new_array();
	for (size_t i = 0; i < tr.n_files; i++) {
		struct json_object *f = json_object_new_object();

		put_str(f, "name", tr.files[i].name);
		put_int(f, "bytes", (int64_t)tr.files[i].bytes);
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)tr.files[i].xxh64);
		put_str(f, "xxh64", hex);
		json_object_array_add(files, f);
	}
	json_object_object_add(o, "files", files);
	st_ckpt_trainer_fini(&tr);

	model = json_object_new_object();
	p = path_join(dir, ST_CKPT_CONFIG_FILE);
	ret = st_model_config_read(p, &gc);
	free(p);
	if (ret == 0) {
		put_config(model, &gc);
		*mc = gc;
	} else {
		put_str(model, "error", st_error_last());
		*bad = true;
	}
	p = path_join(dir, ST_CKPT_CONFIG_FILE);
	put_architecture(o, p);
	free(p);
	put_tokenizer(o, dir);
	/* the parameters as the weights files' headers count them */
	ret = st_ckpt_set_open(&set, dir, ST_CKPT_MODEL_STEM);
	if (ret == 0) {
		struct json_object *wt = set_json(set);

		put_int(model, "tensors", jint(wt, "tensors"));
		put_int(model, "params", jint(wt, "params"));
		json_object_object_add(o, "weights", wt);
		st_ckpt_set_close(set);
	} else {
		put_str(model, "weights_error", st_error_last());
		*bad = true;
	}
	json_object_object_add(o, "model", model);
}

/* Weights that are not a strata checkpoint (strata/weights.h: a Hugging
 * Face directory or file, an llm.c model file): what they are, the model,
 * every tensor of it there; --verify reads them all, and stops at the
 * first value that is not finite (st_weights_read() checks them). */
static struct json_object *weights_json(const char *path, bool verify, bool *bad,
					struct st_model_config *mc)
{
	struct json_object *o = json_object_new_object(), *model = json_object_new_object();
	struct st_model_config gc;
	struct st_model *m = NULL;
	struct st_weights *w;
	int ret = st_weights_open(path, &w);

	if (ret < 0)
		st_cli_die(st_cli_input_exit(ret), "--ckpt %s: %s", path, st_error_last());
	put_str(o, "path", path);
	put_str(o, "format", st_weights_format(w));
	put_tokenizer(o, path);
	if (st_weights_set(w)) {
		const char *sp = st_ckpt_set_path(st_weights_set(w));
		const char *slash = strrchr(sp, '/');
		char *cfg;

		json_object_object_add(o, "weights", set_json(st_weights_set(w)));
		if (asprintf(&cfg, "%.*s%s", slash ? (int)(slash - sp + 1) : 0, sp,
			     ST_CKPT_CONFIG_FILE) > 0) {
			put_architecture(o, cfg);
			free(cfg);
		}
	}
	ret = st_weights_config(w, &gc);
	if (ret == -ENOENT) { /* a bare model.safetensors: no model to check it against */
		put_str(model, "unknown", st_error_last());
		json_object_object_add(o, "model", model);
		st_weights_close(w);
		return o;
	}
	if (ret == 0) {
		put_config(model, &gc);
		*mc = gc;
		ret = st_model_create(&gc, &m);
	}
	if (ret == 0)
		put_int(model, "params", (int64_t)st_model_param_count(m));
	for (int u = 0; ret == 0 && u < st_model_unit_count(m); u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(m, u);

		for (int i = 0; ret == 0 && i < ul->n_tensors; i++) {
			const struct st_tensor_layout *tl = &ul->tensors[i];
			uint64_t shape[2] = { (uint64_t)tl->shape[0], (uint64_t)tl->shape[1] };
			float *x;

			ret = st_weights_check(w, tl->name, tl->ndim, shape);
			if (ret < 0 || !verify)
				continue;
			x = malloc(tl->n_elems * sizeof(float));
			if (!x)
				st_cli_die(1, "out of memory");
			/* names the first value that is not finite, as --init would */
			ret = st_weights_read(w, tl->name, tl->ndim, shape, x);
			free(x);
		}
	}
	if (ret < 0) {
		put_str(model, "error", st_error_last());
		*bad = true;
	} else if (verify) {
		put_bool(o, "ok", true);
	}
	json_object_object_add(o, "model", model);
	st_model_destroy(m);
	st_weights_close(w);
	return o;
}

/* "  model: GPT-2, 12 layers, dim 768, ..." as the family says it. */
static void print_model(const struct st_model_config *mc)
{
	char line[256];

	printf("  model: %s\n", st_model_config_describe(mc, line, sizeof(line)));
}

void st_cli_info_print_weights(struct json_object *o, bool verify,
			       const struct st_model_config *mc)
{
	struct json_object *model = jobj(o, "model");

	printf("weights %s (%s)\n", jstr(o, "path"), jstr(o, "format"));
	if (jstr(o, "architecture"))
		printf("  architecture: %s\n", jstr(o, "architecture"));
	if (mc->n_layer > 0)
		print_model(mc);
	print_tokenizer(o);
	if (jstr(model, "unknown"))
		printf("  model: unknown (%s)\n", jstr(model, "unknown"));
	else if (jstr(model, "error"))
		printf("  DAMAGED: %s\n", jstr(model, "error"));
	else if (verify)
		printf("  weights: %lld parameters; verified: every tensor read, every value "
		       "finite\n", (long long)jint(model, "params"));
	else
		printf("  weights: %lld parameters, every tensor there with its shape\n",
		       (long long)jint(model, "params"));
	if (jobj(o, "weights")) {
		print_set(jobj(o, "weights"), "files", "");
		print_set_files(jobj(o, "weights"));
	}
}

/* How many times a --save directory is read again when the checkpoint
 * --resume takes was pruned while it was read (a run saving into it with a
 * small --keep moves on meanwhile). */
#define CKPT_READ_TRIES 20

/* --keep-best's DIR/best and the loss DIR/best.json gives it, into o
 * ("best", "best_val_loss"), when there is one. */
static void ckpt_best(struct json_object *o, const char *dir)
{
	char *link = path_join(dir, ST_CKPT_BEST), *bj = path_join(dir, ST_CKPT_BEST_JSON);
	char target[256];
	ssize_t len = link ? readlink(link, target, sizeof(target) - 1) : -1;
	struct json_object *b = bj ? json_object_from_file(bj) : NULL, *v;

	if (len > 0) {
		target[len] = '\0';
		put_str(o, "best", target);
		if (b && json_object_object_get_ex(b, "val_loss", &v))
			json_object_object_add(o, "best_val_loss",
					       json_object_new_double(json_object_get_double(v)));
	}
	json_object_put(b);
	free(link);
	free(bj);
}

/* One reading of a --save directory: latest, every step-N in it, and the
 * details of the one --resume takes (chosen, stamped as st before the
 * reading began). NULL when chosen was pruned or replaced meanwhile: its
 * verification would not be that of what --resume takes now. */
static struct json_object *ckpt_save_dir(const char *dir, const char *chosen,
					 const struct st_ckpt_stamp *st, bool verify, bool *bad,
					 struct st_model_config *mc)
{
	struct json_object *o = json_object_new_object(), *list = json_object_new_array();
	struct st_ckpt_step *steps = NULL;
	char *link = path_join(dir, ST_CKPT_LATEST), target[4096];
	size_t n = 0;
	ssize_t len = readlink(link, target, sizeof(target) - 1);
	int ret;

	free(link);
	target[len > 0 ? len : 0] = '\0';
	put_str(o, "dir", dir);
	put_str(o, "resume", chosen);
	put_str(o, "latest", len > 0 ? target : NULL);
	ckpt_best(o, dir);
	if (len > 0) {
		char *t = target[0] == '/' ? strdup(target) : path_join(dir, target);

		put_bool(o, "latest_missing", !t || access(t, F_OK) < 0);
		free(t);
	}
	ret = st_ckpt_list(dir, &steps, &n);
	if (ret < 0)
		st_cli_die(1, "--ckpt %s", st_error_last());
	for (size_t i = 0; i < n; i++) {
		char *sd = path_join(dir, steps[i].name);

		json_object_array_add(list, ckpt_entry(steps[i].name, sd, verify, bad));
		free(sd);
	}
	st_ckpt_list_free(steps, n);
	json_object_object_add(o, "checkpoints", list);
	ckpt_details(o, chosen, bad, mc);
	if (st_ckpt_fate(chosen, st) != ST_CKPT_THERE) {
		json_object_put(o);
		return NULL;
	}
	return o;
}

struct json_object *st_cli_info_ckpt_json(const char *dir, bool verify, bool *bad,
					   struct st_model_config *mc)
{
	struct json_object *o = NULL;
	char *chosen, *tj = path_join(dir, ST_CKPT_TRAINER_FILE);
	bool single = access(tj, F_OK) == 0;
	int ret;

	free(tj);
	if (access(dir, F_OK) < 0)
		st_cli_die(2, "--ckpt %s: %s", dir, strerror(errno));
	for (int tries = 0; !o && tries < CKPT_READ_TRIES; tries++) {
		struct st_ckpt_stamp st;
		bool pass_bad = false;

		ret = st_ckpt_resolve(dir, &chosen);
		if ((ret == -ENOENT || ret == -ENOTDIR) && tries == 0) {
			/* not a checkpoint: other weights? */
			return weights_json(dir, verify, bad, mc);
		}
		if (ret < 0)
			st_cli_die(1, "--ckpt %s", st_error_last());
		if (single) {
			o = json_object_new_object();
			put_str(o, "dir", dir);
			put_str(o, "resume", chosen);
			json_object_object_add(o, "checkpoints", json_object_new_array());
			json_object_array_add(jobj(o, "checkpoints"),
					      ckpt_entry(dir, dir, verify, bad));
			ckpt_details(o, chosen, bad, mc);
		} else if (st_ckpt_stamp(chosen, &st) == 0) {
			/* latest moved on and its old target was pruned
			 * before the stamp: resolve again */
			o = ckpt_save_dir(dir, chosen, &st, verify, &pass_bad, mc);
			if (o)
				*bad = *bad || pass_bad;
		}
		free(chosen);
	}
	if (!o)
		st_cli_die(1, "--ckpt %s: the checkpoint --resume takes was pruned while it was "
			   "read, %d times (a run is saving into it with a small --keep)", dir,
			   CKPT_READ_TRIES);
	return o;
}

/* The training config as "key value" pairs, wrapped. */
static void print_config(struct json_object *cfg)
{
	int col = 0;

	if (!cfg || !json_object_is_type(cfg, json_type_object))
		return;
	json_object_object_foreach(cfg, key, val) {
		char item[512];
		int n;

		if (json_object_is_type(val, json_type_double))
			n = snprintf(item, sizeof(item), "%s %g", key, json_object_get_double(val));
		else
			n = snprintf(item, sizeof(item), "%s %s", key, json_object_get_string(val));
		if (col == 0 || col + 2 + n > 78) {
			printf("%s  %s %s", col ? "\n" : "", col ? "        " : "trained:", item);
			col = 2 + 9 + n;
		} else {
			printf(", %s", item);
			col += 2 + n;
		}
	}
	if (col)
		printf("\n");
}

void st_cli_info_print_ckpt(struct json_object *o, bool verify,
			    const struct st_model_config *mc)
{
	struct json_object *model = jobj(o, "model"), *list = jobj(o, "checkpoints"),
			   *files = jobj(o, "files");
	char a[32];

	printf("checkpoint %s (what --resume %s takes)\n", jstr(o, "resume"), jstr(o, "dir"));
	if (jstr(o, "error")) {
		printf("  DAMAGED: %s\n", jstr(o, "error"));
	} else {
		printf("  step %lld, seed %s\n", (long long)jint(o, "step"), jstr(o, "seed"));
		if (jstr(o, "architecture"))
			printf("  architecture: %s\n", jstr(o, "architecture"));
		if (jstr(model, "error"))
			printf("  model: %s\n", jstr(model, "error"));
		else
			print_model(mc);
		print_tokenizer(o);
		if (jstr(model, "weights_error"))
			printf("  weights: %s\n", jstr(model, "weights_error"));
		else
			print_set(jobj(o, "weights"), "weights", "");
		print_config(jobj(o, "config"));
		for (size_t i = 0; files && i < json_object_array_length(files); i++) {
			struct json_object *f = json_object_array_get_idx(files, i);

			printf("  %-*s %10s  xxh64 %s\n", (int)ST_MAX(24, strlen(jstr(f, "name"))),
			       jstr(f, "name"),
			       bytes_or_unknown(jint(f, "bytes"), a, sizeof(a)), jstr(f, "xxh64"));
		}
	}
	if (strcmp(jstr(o, "resume"), jstr(o, "dir")) != 0) {
		printf("checkpoints in %s", jstr(o, "dir"));
		if (jstr(o, "latest"))
			printf(" (latest -> %s%s)", jstr(o, "latest"),
			       json_object_get_boolean(jobj(o, "latest_missing")) ? ", which is missing"
										: "");
		if (jstr(o, "best"))
			printf(" (best -> %s, val_loss %.6f)", jstr(o, "best"),
			       json_object_get_double(jobj(o, "best_val_loss")));
		printf(":\n");
	} else {
		struct json_object *e = json_object_array_get_idx(list, 0);

		if (verify && !jstr(e, "error"))
			printf("  verified: every file's size and XXH64 match\n");
		else if (verify && !jstr(o, "error"))
			printf("  verify FAILED: %s\n", jstr(e, "error"));
		return;
	}
	for (size_t i = 0; i < json_object_array_length(list); i++) {
		struct json_object *e = json_object_array_get_idx(list, i);

		printf("  %-14s ", jstr(e, "name"));
		if (json_object_get_boolean(jobj(e, "pruned")) ||
		    json_object_get_boolean(jobj(e, "replaced"))) {
			printf("%s while being read (a run is saving into %s)\n",
			       jobj(e, "pruned") ? "pruned" : "replaced", jstr(o, "dir"));
			continue;
		}
		if (jstr(e, "error")) {
			printf("DAMAGED: %s\n", jstr(e, "error"));
			continue;
		}
		printf("step %-8lld %10s%s\n", (long long)jint(e, "step"),
		       bytes_or_unknown(jint(e, "bytes"), a, sizeof(a)),
		       verify ? "  verified: sizes and XXH64 match" : "");
	}
}
