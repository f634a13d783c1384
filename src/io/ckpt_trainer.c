/* Checkpoint files: trainer.json (the step, the seed, the data cursor, the
 * config and every file's size and XXH64), written and read strictly, and
 * a checkpoint's verification against it. */
#include "strata/ckpt.h"

#include "ckpt_internal.h"
#include "sf_internal.h"
#include "strata/dataset.h"
#include "strata/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

/* trainer.json is small: the config and a few file entries. */
#define ST_CKPT_TRAINER_MAX_BYTES (16 * ST_MiB)

/* ---- trainer.json ------------------------------------------------------------ */

void st_ckpt_trainer_fini(struct st_ckpt_trainer *tr)
{
	free(tr->config_json);
	memset(tr, 0, sizeof(*tr));
}

/* json parsed as one JSON object, followed by nothing but whitespace, or
 * NULL. */
static struct json_object *ckpt_parse_object(const char *json, size_t len)
{
	struct json_tokener *tok;
	struct json_object *obj;
	bool ok;

	if (len > INT32_MAX || !(tok = json_tokener_new()))
		return NULL;
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT |
			       JSON_TOKENER_VALIDATE_UTF8);
	obj = json_tokener_parse_ex(tok, json, (int)len);
	ok = obj && json_tokener_get_error(tok) == json_tokener_success &&
	     json_object_is_type(obj, json_type_object);
	for (size_t i = json_tokener_get_parse_end(tok); ok && i < len; i++)
		ok = json[i] == ' ' || json[i] == '\n' || json[i] == '\t' ||
		     json[i] == '\r';
	json_tokener_free(tok);
	if (!ok) {
		json_object_put(obj);
		return NULL;
	}
	return obj;
}

int st_ckpt_trainer_set_config(struct st_ckpt_trainer *tr, const char *json)
{
	size_t len = strlen(json);
	struct json_object *obj;
	char *copy;

	if (len > ST_CKPT_TRAINER_MAX_BYTES / 2 || len > INT32_MAX)
		return st_error_set(-EINVAL, "training config: %zu bytes of "
				    "JSON, too large", len);
	obj = ckpt_parse_object(json, len);
	if (!obj)
		return st_error_set(-EINVAL, "training config is not a JSON "
				    "object");
	json_object_put(obj);
	copy = strdup(json);
	if (!copy)
		return st_error_set(-ENOMEM, "out of memory");
	free(tr->config_json);
	tr->config_json = copy;
	return 0;
}

static int ckpt_check_name(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len >= ST_CKPT_NAME_BYTES || strchr(name, '/') ||
	    strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
	    strcmp(name, ST_CKPT_TRAINER_FILE) == 0)
		return st_error_set(-EINVAL, "'%.80s' cannot be a checkpoint "
				    "file name (empty, over %d bytes, a path, "
				    "or trainer.json)", name,
				    ST_CKPT_NAME_BYTES - 1);
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20)
			return st_error_set(-EINVAL, "checkpoint file name with "
					    "a control byte");
	return 0;
}

const struct st_ckpt_file *st_ckpt_trainer_find(const struct st_ckpt_trainer *tr,
						const char *name)
{
	for (size_t i = 0; i < tr->n_files; i++)
		if (strcmp(tr->files[i].name, name) == 0)
			return &tr->files[i];
	return NULL;
}

int st_ckpt_trainer_add(struct st_ckpt_trainer *tr, const char *name,
			uint64_t bytes, uint64_t xxh64)
{
	struct st_ckpt_file *f;
	int err = ckpt_check_name(name);

	if (err)
		return err;
	f = (struct st_ckpt_file *)st_ckpt_trainer_find(tr, name);
	if (!f) {
		if (tr->n_files >= ST_CKPT_MAX_FILES)
			return st_error_set(-ENOSPC, "a checkpoint lists at most "
					    "%d files", ST_CKPT_MAX_FILES);
		f = &tr->files[tr->n_files++];
		snprintf(f->name, sizeof(f->name), "%s", name);
	}
	f->bytes = bytes;
	f->xxh64 = xxh64;
	return 0;
}

int st_ckpt_trainer_add_hashed(struct st_ckpt_trainer *tr, const char *dir,
			       const char *name)
{
	uint64_t bytes, h;
	char *path;
	int err = ckpt_check_name(name);

	if (err)
		return err;
	path = st_ckpt_fmt("%s/%s", dir, name);
	if (!path)
		return st_error_set(-ENOMEM, "out of memory");
	err = st_ckpt_file_hash(path, &bytes, &h);
	free(path);
	return err ? err : st_ckpt_trainer_add(tr, name, bytes, h);
}

static const char st_ckpt_hexdig[] = "0123456789abcdef";

/* trainer.json's own checksum: XXH64 (seed 0) of the object without its
 * "checksum" field, serialised by json-c without whitespace. So a changed
 * step, cursor, config or file entry is found, however the file is laid
 * out. 0 with *h set, or -ENOMEM. */
static int ckpt_self_hash(struct json_object *root, uint64_t *h)
{
	const char *text;
	size_t len;

	text = json_object_to_json_string_length(root, JSON_C_TO_STRING_PLAIN |
						 JSON_C_TO_STRING_NOSLASHESCAPE,
						 &len);
	if (!text)
		return -ENOMEM;
	*h = XXH64(text, len, 0);
	return 0;
}

int st_ckpt_trainer_write(const char *path, const struct st_ckpt_trainer *tr)
{
	struct json_object *root = json_object_new_object(), *cfg, *files;
	struct st_file_atomic f;
	char hex[2 * ST_CKPT_CURSOR_MAX_BYTES + 1];
	const char *text;
	size_t text_len;
	bool oom = !root;
	int err;

	if (tr->cursor_bytes > ST_CKPT_CURSOR_MAX_BYTES) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: cursor of %zu bytes, more than "
				    "%d", path, tr->cursor_bytes,
				    ST_CKPT_CURSOR_MAX_BYTES);
	}
	cfg = tr->config_json ? ckpt_parse_object(tr->config_json,
						  strlen(tr->config_json))
			      : json_object_new_object();
	if (!cfg) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: the training config is not a "
				    "JSON object", path);
	}
	for (size_t i = 0; i < tr->cursor_bytes; i++) {
		hex[2 * i] = st_ckpt_hexdig[tr->cursor[i] >> 4];
		hex[2 * i + 1] = st_ckpt_hexdig[tr->cursor[i] & 15];
	}
	hex[2 * tr->cursor_bytes] = '\0';
	st_json_add(root, "format", json_object_new_string(
				 "strata-checkpoint"), &oom);
	st_json_add(root, "version", json_object_new_int(ST_CKPT_VERSION),
			 &oom);
	st_json_add(root, "step", json_object_new_uint64(tr->step), &oom);
	st_json_add(root, "seed", json_object_new_uint64(tr->seed), &oom);
	st_json_add(root, "cursor", json_object_new_string(hex), &oom);
	st_json_add(root, "config", cfg, &oom);
	files = json_object_new_array();
	st_json_add(root, "files", files, &oom);
	for (size_t i = 0; !oom && i < tr->n_files; i++) {
		const struct st_ckpt_file *fl = &tr->files[i];
		struct json_object *e = json_object_new_object();
		char h[17];

		err = ckpt_check_name(fl->name);
		if (err) {
			json_object_put(e);
			json_object_put(root);
			return err;
		}
		snprintf(h, sizeof(h), "%016llx", (unsigned long long)fl->xxh64);
		st_json_push(files, e, &oom);
		st_json_add(oom ? NULL : e, "name",
				 json_object_new_string(fl->name), &oom);
		st_json_add(oom ? NULL : e, "bytes",
				 json_object_new_uint64(fl->bytes), &oom);
		st_json_add(oom ? NULL : e, "xxh64",
				 json_object_new_string(h), &oom);
	}
	if (!oom) {
		uint64_t h = 0;
		char hh[17];

		oom = ckpt_self_hash(root, &h) < 0;
		snprintf(hh, sizeof(hh), "%016llx", (unsigned long long)h);
		st_json_add(oom ? NULL : root, "checksum",
			    json_object_new_string(hh), &oom);
	}
	text = oom ? NULL : json_object_to_json_string_length(root,
			JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
			JSON_C_TO_STRING_NOSLASHESCAPE, &text_len);
	if (!text) {
		json_object_put(root);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	err = st_file_atomic_open(&f, path);
	if (!err)
		err = st_file_atomic_write(&f, text, text_len);
	if (!err)
		err = st_file_atomic_write(&f, "\n", 1);
	if (!err)
		err = st_file_atomic_commit(&f);
	else
		st_file_atomic_abort(&f);
	json_object_put(root);
	return err;
}

static int ckpt_field(const char *path, struct json_object *root,
		      const char *key, enum json_type type,
		      struct json_object **out)
{
	if (!json_object_object_get_ex(root, key, out))
		return st_error_set(-EINVAL, "%s: missing \"%s\"", path, key);
	if (!json_object_is_type(*out, type))
		return st_error_set(-EINVAL, "%s: \"%s\" is %s, not %s", path,
				    key, json_type_to_name(
					    json_object_get_type(*out)),
				    json_type_to_name(type));
	/* A JSON string may hold \u0000, which C would cut at: a name
	 * "a\u0000b" would be read as "a" and a cursor "\u0000..." as none. */
	if (type == json_type_string &&
	    strlen(json_object_get_string(*out)) !=
	    (size_t)json_object_get_string_len(*out))
		return st_error_set(-EINVAL, "%s: \"%s\" holds a NUL byte",
				    path, key);
	return 0;
}

/* A non-negative JSON integer up to max. json-c keeps integers above
 * INT64_MAX as uint64 and saturates at UINT64_MAX, so a max of UINT64_MAX
 * cannot tell 2^64 - 1 from larger numbers (only a hand-edited file has
 * those). */
static int ckpt_get_u64(const char *path, const char *what,
			struct json_object *v, uint64_t max, uint64_t *out)
{
	if (!json_object_is_type(v, json_type_int))
		return st_error_set(-EINVAL, "%s: %s is not an integer", path,
				    what);
	if (json_object_get_int64(v) < 0)
		return st_error_set(-EINVAL, "%s: %s is negative", path, what);
	*out = json_object_get_uint64(v);
	if (*out > max)
		return st_error_set(-EINVAL, "%s: %s is too large (over %llu)",
				    path, what, (unsigned long long)max);
	return 0;
}

static int ckpt_hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int ckpt_parse_files(const char *path, struct json_object *files,
			    struct st_ckpt_trainer *tr)
{
	size_t n = json_object_array_length(files);

	if (n > ST_CKPT_MAX_FILES)
		return st_error_set(-EINVAL, "%s: %zu files listed, at most %d",
				    path, n, ST_CKPT_MAX_FILES);
	for (size_t i = 0; i < n; i++) {
		struct json_object *e = json_object_array_get_idx(files, i);
		struct json_object *jn, *jb, *jh;
		struct st_ckpt_file *f = &tr->files[i];
		const char *h;
		char what[32];
		int err;

		if (!json_object_is_type(e, json_type_object))
			return st_error_set(-EINVAL, "%s: files[%zu] is not an "
					    "object", path, i);
		snprintf(what, sizeof(what), "files[%zu]", i);
		err = ckpt_field(path, e, "name", json_type_string, &jn);
		if (!err)
			err = ckpt_field(path, e, "bytes", json_type_int, &jb);
		if (!err)
			err = ckpt_field(path, e, "xxh64", json_type_string,
					 &jh);
		if (!err)
			err = ckpt_get_u64(path, what, jb, INT64_MAX,
					   &f->bytes);
		if (err)
			return err;
		if (ckpt_check_name(json_object_get_string(jn)))
			return st_error_set(-EINVAL, "%s: files[%zu] has a bad "
					    "name", path, i);
		for (size_t j = 0; j < i; j++)
			if (strcmp(tr->files[j].name,
				   json_object_get_string(jn)) == 0)
				return st_error_set(-EINVAL, "%s: file '%s' "
						    "listed twice", path,
						    tr->files[j].name);
		snprintf(f->name, sizeof(f->name), "%s",
			 json_object_get_string(jn));
		h = json_object_get_string(jh);
		f->xxh64 = 0;
		if (strlen(h) != 16)
			goto bad_hash;
		for (int k = 0; k < 16; k++) {
			int d = ckpt_hex_digit(h[k]);

			if (d < 0)
				goto bad_hash;
			f->xxh64 = (f->xxh64 << 4) | (uint64_t)d;
		}
		continue;
bad_hash:
		return st_error_set(-EINVAL, "%s: files[%zu].xxh64 is not 16 "
				    "hex digits", path, i);
	}
	tr->n_files = n;
	return 0;
}

/* Version 2 on: the "checksum" field against the rest (then taken out of
 * root). Version 1 files have none and are read without it. */
static int ckpt_check_self(const char *path, struct json_object *root)
{
	struct json_object *v;
	char want[17];
	uint64_t h;
	int err = ckpt_field(path, root, "checksum", json_type_string, &v);

	if (err)
		return err;
	if (json_object_get_string_len(v) != 16)
		goto bad;
	for (int k = 0; k < 16; k++)
		if (ckpt_hex_digit(json_object_get_string(v)[k]) < 0)
			goto bad;
	snprintf(want, sizeof(want), "%s", json_object_get_string(v));
	json_object_object_del(root, "checksum"); /* frees v */
	if (ckpt_self_hash(root, &h) < 0)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	if (strtoull(want, NULL, 16) != h)
		return st_error_set(-EINVAL, "%s: checksum mismatch (trainer.json "
				    "was edited or damaged: its checksum %s, its "
				    "contents %016llx)", path, want,
				    (unsigned long long)h);
	return 0;
bad:
	return st_error_set(-EINVAL, "%s: \"checksum\" is not 16 hex digits",
			    path);
}

static int ckpt_parse_trainer(const char *path, struct json_object *root,
			      struct st_ckpt_trainer *tr)
{
	struct json_object *v;
	const char *s;
	uint64_t ver;
	size_t len;
	int err;

	err = ckpt_field(path, root, "format", json_type_string, &v);
	if (err)
		return err;
	if (strcmp(json_object_get_string(v), "strata-checkpoint") != 0)
		return st_error_set(-EINVAL, "%s: format is not "
				    "\"strata-checkpoint\"", path);
	err = ckpt_field(path, root, "version", json_type_int, &v);
	if (!err)
		err = ckpt_get_u64(path, "version", v, UINT32_MAX,
				   &ver);
	if (err)
		return err;
	if (ver == 0 || ver > ST_CKPT_VERSION)
		return st_error_set(-EINVAL, "%s: version %llu; this strata "
				    "reads version 1..%d", path,
				    (unsigned long long)ver, ST_CKPT_VERSION);
	tr->version = (uint32_t)ver;
	if (ver >= 2 && (err = ckpt_check_self(path, root)) < 0)
		return err;
	err = ckpt_field(path, root, "step", json_type_int, &v);
	if (!err)
		err = ckpt_get_u64(path, "step", v, INT64_MAX,
				   &tr->step);
	if (!err)
		err = ckpt_field(path, root, "seed", json_type_int, &v);
	if (!err)
		err = ckpt_get_u64(path, "seed", v, UINT64_MAX,
				   &tr->seed);
	if (!err)
		err = ckpt_field(path, root, "cursor", json_type_string, &v);
	if (err)
		return err;
	s = json_object_get_string(v);
	len = strlen(s);
	if (len % 2 || len / 2 > ST_CKPT_CURSOR_MAX_BYTES)
		return st_error_set(-EINVAL, "%s: cursor is not an even number "
				    "of hex digits (at most %d bytes)", path,
				    ST_CKPT_CURSOR_MAX_BYTES);
	for (size_t i = 0; i < len / 2; i++) {
		int hi = ckpt_hex_digit(s[2 * i]);
		int lo = ckpt_hex_digit(s[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return st_error_set(-EINVAL, "%s: cursor is not hex",
					    path);
		tr->cursor[i] = (uint8_t)(hi << 4 | lo);
	}
	tr->cursor_bytes = len / 2;
	err = ckpt_field(path, root, "config", json_type_object, &v);
	if (err)
		return err;
	tr->config_json = strdup(json_object_to_json_string_ext(v,
			JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
	if (!tr->config_json)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	err = ckpt_field(path, root, "files", json_type_array, &v);
	return err ? err : ckpt_parse_files(path, v, tr);
}

int st_ckpt_trainer_read(const char *path, struct st_ckpt_trainer *tr)
{
	struct json_object *root;
	size_t len;
	char *text;
	int err;

	memset(tr, 0, sizeof(*tr));
	err = st_file_read_small(path, ST_CKPT_TRAINER_MAX_BYTES, &text, &len);
	if (err)
		return err;
	root = ckpt_parse_object(text, len);
	free(text);
	if (!root)
		return st_error_set(-EINVAL, "%s: not a JSON object (truncated "
				    "or damaged?)", path);
	err = ckpt_parse_trainer(path, root, tr);
	json_object_put(root);
	if (err)
		st_ckpt_trainer_fini(tr);
	return err;
}

int st_ckpt_verify(const char *dir, const struct st_ckpt_trainer *tr)
{
	char **paths = calloc(tr->n_files + 1, sizeof(*paths));
	int err = 0;

	if (!paths)
		return st_error_set(-ENOMEM, "out of memory");
	for (size_t i = 0; !err && i < tr->n_files; i++)
		if (!(paths[i] = st_ckpt_fmt("%s/%s", dir, tr->files[i].name)))
			err = st_error_set(-ENOMEM, "out of memory");
	/* Sizes first: a truncated file is found without reading anything. */
	for (size_t i = 0; !err && i < tr->n_files; i++) {
		struct stat sb;

		if (stat(paths[i], &sb) < 0) {
			err = -errno;
			st_error_set(err, "%s: %s%s", paths[i], strerror(-err),
				     err == -ENOENT ? " (listed in trainer.json)"
				     : "");
		} else if (!S_ISREG(sb.st_mode)) {
			err = st_error_set(-EINVAL, "%s: not a regular file",
					   paths[i]);
		} else if ((uint64_t)sb.st_size != tr->files[i].bytes) {
			err = st_error_set(-EINVAL, "%s: %llu bytes, trainer.json "
					   "says %llu (file truncated or "
					   "changed)", paths[i],
					   (unsigned long long)sb.st_size,
					   (unsigned long long)tr->files[i].bytes);
		}
	}
	for (size_t i = 0; !err && i < tr->n_files; i++) {
		uint64_t bytes, h;

		err = st_ckpt_file_hash(paths[i], &bytes, &h);
		if (!err && (bytes != tr->files[i].bytes ||
			     h != tr->files[i].xxh64))
			err = st_error_set(-EINVAL, "%s: checksum mismatch (file "
					   "changed or truncated)", paths[i]);
	}
	for (size_t i = 0; i < tr->n_files; i++)
		free(paths[i]);
	free(paths);
	return err;
}

/* STEM.safetensors or STEM.safetensors.index.json is listed. */
static bool ckpt_lists_stem(const struct st_ckpt_trainer *tr, const char *stem)
{
	char a[ST_CKPT_NAME_BYTES], b[ST_CKPT_NAME_BYTES];

	snprintf(a, sizeof(a), "%s.safetensors", stem);
	snprintf(b, sizeof(b), "%s%s", stem, ST_CKPT_INDEX_SUFFIX);
	return st_ckpt_trainer_find(tr, a) || st_ckpt_trainer_find(tr, b);
}

/* Every regular file of dir but trainer.json is listed. */
static int ckpt_check_unlisted(const char *dir, const struct st_ckpt_trainer *tr)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int err = 0;

	if (!d) {
		err = -errno;
		return st_error_set(err, "%s: %s", dir, strerror(-err));
	}
	while (!err && (de = readdir(d))) {
		struct stat sb;

		if (de->d_name[0] == '.' ||
		    strcmp(de->d_name, ST_CKPT_TRAINER_FILE) == 0 ||
		    (de->d_type != DT_REG && de->d_type != DT_UNKNOWN))
			continue;
		/* a file system that does not give the type: ask */
		if (de->d_type == DT_UNKNOWN &&
		    (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		     !S_ISREG(sb.st_mode)))
			continue;
		if (!st_ckpt_trainer_find(tr, de->d_name))
			err = st_error_set(-EINVAL, "%s/%s: not listed in "
					   "trainer.json (its entry was removed: "
					   "the file cannot be checked)", dir,
					   de->d_name);
	}
	closedir(d);
	return err;
}

/* The sampler's cursor has drawn step * grad_accum batches, when the
 * config says grad_accum (strata train's checkpoints). */
static int ckpt_check_cursor(const char *dir, const struct st_ckpt_trainer *tr)
{
	struct json_object *cfg, *v;
	struct st_cursor c;
	int64_t accum = 0;

	cfg = tr->config_json ? ckpt_parse_object(tr->config_json,
						 strlen(tr->config_json)) : NULL;
	if (cfg && json_object_object_get_ex(cfg, "grad_accum", &v) &&
	    json_object_is_type(v, json_type_int))
		accum = json_object_get_int64(v);
	json_object_put(cfg);
	if (accum <= 0)
		return 0;
	if (st_cursor_unpack(&c, tr->cursor, tr->cursor_bytes) < 0)
		return st_error_set(-EINVAL, "%s/trainer.json: bad sampler cursor",
				    dir);
	if (tr->step > UINT64_MAX / (uint64_t)accum ||
	    c.step != tr->step * (uint64_t)accum)
		return st_error_set(-EINVAL, "%s/trainer.json: step %llu, but the "
				    "sampler's cursor has drawn %llu batches (%lld "
				    "a step): they disagree", dir,
				    (unsigned long long)tr->step,
				    (unsigned long long)c.step, (long long)accum);
	return 0;
}

int st_ckpt_check(const char *dir, const struct st_ckpt_trainer *tr)
{
	static const char *const stems[] = { ST_CKPT_MODEL_STEM, ST_CKPT_OPTIM_STEM };
	int err;

	for (size_t i = 0; i < 2; i++)
		if (!ckpt_lists_stem(tr, stems[i]))
			return st_error_set(-EINVAL, "%s/trainer.json: lists no %s."
					    "safetensors (nor its index): a checkpoint "
					    "needs it", dir, stems[i]);
	if (!st_ckpt_trainer_find(tr, ST_CKPT_CONFIG_FILE))
		return st_error_set(-EINVAL, "%s/trainer.json: lists no %s: a "
				    "checkpoint needs it", dir, ST_CKPT_CONFIG_FILE);
	err = ckpt_check_unlisted(dir, tr);
	return err ? err : ckpt_check_cursor(dir, tr);
}
