/* Checkpoint files: streamed safetensors, trainer.json, verification, and
 * the directory protocol (temp dir, fsync, rename, latest link, pruning). */
#include "strata/ckpt.h"

#include "sf_internal.h"
#include "strata/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* trainer.json is small: the config and a few file entries. */
#define ST_CKPT_TRAINER_MAX_BYTES (16 * ST_MiB)

/* malloc'd printf, NULL when out of memory. */
static char *st_ckpt_fmt(const char *fmt, ...) ST_PRINTF(1, 2);

static char *st_ckpt_fmt(const char *fmt, ...)
{
	va_list ap;
	char *s;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	return n < 0 ? NULL : s;
}

/* ---- streamed safetensors ---------------------------------------------------- */

/* Pull every tensor through fill into f, hashing as it goes. */
static int st_ckpt_stream_data(struct st_file_atomic *f, const char *path,
			       const struct st_sf_entry *entries, size_t n,
			       uint64_t max_bytes, st_ckpt_fill_fn fill,
			       void *ctx, XXH64_state_t *xs)
{
	size_t chunk = (size_t)ST_MIN(st_align_up(max_bytes, ST_PAGE_BYTES),
				      ST_CKPT_CHUNK_BYTES);
	void *buf = NULL;
	int err = 0;

	if (max_bytes == 0)
		return 0;
	if (posix_memalign(&buf, ST_PAGE_BYTES, chunk))
		return st_error_set(-ENOMEM, "%s: out of memory for a %zu-byte "
				    "buffer", path, chunk);
	for (size_t i = 0; !err && i < n; i++) {
		uint64_t size_bytes = entries[i].size_bytes;

		for (uint64_t off = 0; !err && off < size_bytes; off += chunk) {
			size_t len = (size_t)ST_MIN(chunk, size_bytes - off);

			st_error_clear();
			err = fill(ctx, i, off, buf, len);
			if (err) {
				char why[256];

				snprintf(why, sizeof(why), "%s",
					 st_error_last()[0] ? st_error_last()
					 : strerror(err < 0 ? -err : EIO));
				if (err > 0)
					err = -EIO;
				st_error_set(err, "%s: tensor '%s' at byte %llu: "
					     "%s", path, entries[i].name,
					     (unsigned long long)off, why);
				break;
			}
			XXH64_update(xs, buf, len);
			err = st_file_atomic_write(f, buf, len);
		}
	}
	free(buf);
	return err;
}

int st_ckpt_write_with_header(const char *path, const uint8_t *hdr, size_t hdr_bytes,
			      const struct st_sf_entry *entries, size_t n,
			      st_ckpt_fill_fn fill, void *ctx,
			      uint64_t *out_bytes, uint64_t *out_xxh64)
{
	struct st_file_atomic f;
	XXH64_state_t *xs = NULL;
	uint64_t total = 0, max_bytes = 0, digest;
	int err = 0;

	for (size_t i = 0; i < n; i++) {
		max_bytes = ST_MAX(max_bytes, entries[i].size_bytes);
		total += entries[i].size_bytes;
	}
	if (total && !fill)
		return st_error_set(-EINVAL, "%s: no fill callback", path);
	if (!(xs = XXH64_createState()))
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	err = st_file_atomic_open(&f, path);
	if (err)
		goto out;
	XXH64_reset(xs, 0);
	XXH64_update(xs, hdr, hdr_bytes);
	err = st_file_atomic_write(&f, hdr, hdr_bytes);
	if (!err)
		err = st_ckpt_stream_data(&f, path, entries, n, max_bytes, fill,
					  ctx, xs);
	if (err) {
		st_file_atomic_abort(&f);
		goto out;
	}
	err = st_file_atomic_commit(&f);
	if (err)
		goto out;
	digest = XXH64_digest(xs);
	if (out_bytes)
		*out_bytes = hdr_bytes + total;
	if (out_xxh64)
		*out_xxh64 = digest;
out:
	XXH64_freeState(xs);
	return err;
}

int st_ckpt_write_safetensors(const char *path,
			      const struct st_ckpt_tensor *tensors, size_t n,
			      const struct st_sf_meta *meta, size_t n_meta,
			      st_ckpt_fill_fn fill, void *ctx,
			      uint64_t *out_bytes, uint64_t *out_xxh64)
{
	struct st_sf_entry *entries;
	uint64_t total = 0;
	uint8_t *hdr = NULL;
	size_t hdr_bytes = 0;
	int err;

	entries = calloc(n + 1, sizeof(*entries));
	if (!entries)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	for (size_t i = 0; i < n; i++)
		entries[i] = (struct st_sf_entry){
			.name = tensors[i].name, .dtype = tensors[i].dtype,
			.ndim = tensors[i].ndim, .shape = tensors[i].shape };
	/* The checks and the header of st_safetensors_write(): the same
	 * tensors give the same bytes. */
	err = st_sf_entries_check(path, entries, n, meta, n_meta, &total);
	if (!err && total && !fill)
		err = st_error_set(-EINVAL, "%s: no fill callback", path);
	if (!err)
		err = st_sf_header_build(path, entries, n, meta, n_meta, &hdr,
					 &hdr_bytes);
	if (!err)
		err = st_ckpt_write_with_header(path, hdr, hdr_bytes, entries, n,
						fill, ctx, out_bytes, out_xxh64);
	free(hdr);
	free(entries);
	return err;
}

int st_ckpt_file_hash(const char *path, uint64_t *out_bytes,
		      uint64_t *out_xxh64)
{
	XXH64_state_t *xs = XXH64_createState();
	uint64_t total = 0;
	void *buf = NULL;
	int fd = -1, err = 0;

	if (!xs || posix_memalign(&buf, ST_PAGE_BYTES, ST_CKPT_CHUNK_BYTES)) {
		buf = NULL;
		err = st_error_set(-ENOMEM, "%s: out of memory", path);
		goto out;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		st_error_set(err, "%s: %s", path, strerror(-err));
		goto out;
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	XXH64_reset(xs, 0);
	for (;;) {
		ssize_t got = read(fd, buf, ST_CKPT_CHUNK_BYTES);

		if (got < 0) {
			if (errno == EINTR)
				continue;
			err = -errno;
			st_error_set(err, "%s: read at offset %llu: %s", path,
				     (unsigned long long)total, strerror(-err));
			goto out;
		}
		if (got == 0)
			break;
		XXH64_update(xs, buf, (size_t)got);
		total += (uint64_t)got;
	}
	*out_bytes = total;
	*out_xxh64 = XXH64_digest(xs);
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	XXH64_freeState(xs);
	return err;
}

/* ---- reader ------------------------------------------------------------------ */

struct st_ckpt_reader {
	struct st_safetensors *sf;
	int fd;            /* sf's: not ours to close */
	uint64_t data_off; /* 8 + header length */
	char *path;
};

int st_ckpt_reader_open(struct st_ckpt_reader **out, const char *path)
{
	struct st_ckpt_reader *r;
	int err;

	*out = NULL;
	r = calloc(1, sizeof(*r));
	if (!r || !(r->path = strdup(path))) {
		free(r);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	r->fd = -1;
	err = st_safetensors_open(&r->sf, path);
	if (err) {
		st_ckpt_reader_close(r);
		return err;
	}
	/* the handle's descriptor: the header it validated is the one read */
	r->fd = st_sf_file_fd(r->sf, &r->data_off);
	*out = r;
	return 0;
}

void st_ckpt_reader_close(struct st_ckpt_reader *r)
{
	if (!r)
		return;
	st_safetensors_close(r->sf); /* and r->fd, its descriptor */
	free(r->path);
	free(r);
}

const char *st_ckpt_reader_path(const struct st_ckpt_reader *r)
{
	return r->path;
}

const struct st_safetensors *st_ckpt_reader_file(const struct st_ckpt_reader *r)
{
	return r->sf;
}

int st_ckpt_reader_find(const struct st_ckpt_reader *r, const char *name,
			enum st_sf_dtype dtype, int ndim, const uint64_t *shape,
			const struct st_sf_info **out)
{
	const struct st_sf_info *t = st_safetensors_find(r->sf, name);
	char have[ST_SF_SHAPE_STR_LEN], want[ST_SF_SHAPE_STR_LEN];
	bool same;

	*out = NULL;
	if (!t)
		return st_error_set(-ENOENT, "%s: no tensor '%.200s'", r->path,
				    name);
	same = t->dtype == dtype && t->ndim == ndim;
	for (int i = 0; same && i < ndim; i++)
		same = t->shape[i] == shape[i];
	if (!same) {
		st_sf_shape_str(t->shape, t->ndim, have, sizeof(have));
		st_sf_shape_str(shape, ndim >= 0 && ndim <= ST_SF_MAX_DIMS ?
				ndim : 0, want, sizeof(want));
		return st_error_set(-EINVAL, "%s: tensor '%.200s' is %s %s, "
				    "expected %s %s", r->path, name,
				    st_sf_dtype_name(t->dtype), have,
				    st_sf_dtype_name(dtype), want);
	}
	*out = t;
	return 0;
}

int st_ckpt_reader_pread(const struct st_ckpt_reader *r,
			 const struct st_sf_info *t, uint64_t offset_bytes,
			 void *buf, size_t len)
{
	if (offset_bytes > t->size_bytes || len > t->size_bytes - offset_bytes)
		return st_error_set(-EINVAL, "%s: tensor '%.200s': bytes "
				    "[%llu, +%zu) run past its %llu bytes",
				    r->path, t->name,
				    (unsigned long long)offset_bytes, len,
				    (unsigned long long)t->size_bytes);
	if (len == 0)
		return 0;
	return st_file_pread_full(r->fd, buf, len,
			     r->data_off + t->offset_bytes + offset_bytes,
			     r->path);
}

/* ---- trainer.json ------------------------------------------------------------ */

void st_ckpt_trainer_fini(struct st_ckpt_trainer *tr)
{
	free(tr->config_json);
	memset(tr, 0, sizeof(*tr));
}

/* json parsed as one JSON object, followed by nothing but whitespace, or
 * NULL. */
static struct json_object *st_ckpt_parse_object(const char *json, size_t len)
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
	obj = st_ckpt_parse_object(json, len);
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

static int st_ckpt_check_name(const char *name)
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
	int err = st_ckpt_check_name(name);

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
	int err = st_ckpt_check_name(name);

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
	cfg = tr->config_json ? st_ckpt_parse_object(tr->config_json,
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

		err = st_ckpt_check_name(fl->name);
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

static int st_ckpt_field(const char *path, struct json_object *root,
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
static int st_ckpt_get_u64(const char *path, const char *what,
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

static int st_ckpt_hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int st_ckpt_parse_files(const char *path, struct json_object *files,
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
		err = st_ckpt_field(path, e, "name", json_type_string, &jn);
		if (!err)
			err = st_ckpt_field(path, e, "bytes", json_type_int, &jb);
		if (!err)
			err = st_ckpt_field(path, e, "xxh64", json_type_string,
					    &jh);
		if (!err)
			err = st_ckpt_get_u64(path, what, jb, INT64_MAX,
					      &f->bytes);
		if (err)
			return err;
		if (st_ckpt_check_name(json_object_get_string(jn)))
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
			int d = st_ckpt_hex_digit(h[k]);

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

static int st_ckpt_parse_trainer(const char *path, struct json_object *root,
				 struct st_ckpt_trainer *tr)
{
	struct json_object *v;
	const char *s;
	uint64_t ver;
	size_t len;
	int err;

	err = st_ckpt_field(path, root, "format", json_type_string, &v);
	if (err)
		return err;
	if (strcmp(json_object_get_string(v), "strata-checkpoint") != 0)
		return st_error_set(-EINVAL, "%s: format is not "
				    "\"strata-checkpoint\"", path);
	err = st_ckpt_field(path, root, "version", json_type_int, &v);
	if (!err)
		err = st_ckpt_get_u64(path, "version", v, UINT32_MAX,
				      &ver);
	if (err)
		return err;
	if (ver == 0 || ver > ST_CKPT_VERSION)
		return st_error_set(-EINVAL, "%s: version %llu; this strata "
				    "reads version 1..%d", path,
				    (unsigned long long)ver, ST_CKPT_VERSION);
	tr->version = (uint32_t)ver;
	err = st_ckpt_field(path, root, "step", json_type_int, &v);
	if (!err)
		err = st_ckpt_get_u64(path, "step", v, INT64_MAX,
				      &tr->step);
	if (!err)
		err = st_ckpt_field(path, root, "seed", json_type_int, &v);
	if (!err)
		err = st_ckpt_get_u64(path, "seed", v, UINT64_MAX,
				      &tr->seed);
	if (!err)
		err = st_ckpt_field(path, root, "cursor", json_type_string, &v);
	if (err)
		return err;
	s = json_object_get_string(v);
	len = strlen(s);
	if (len % 2 || len / 2 > ST_CKPT_CURSOR_MAX_BYTES)
		return st_error_set(-EINVAL, "%s: cursor is not an even number "
				    "of hex digits (at most %d bytes)", path,
				    ST_CKPT_CURSOR_MAX_BYTES);
	for (size_t i = 0; i < len / 2; i++) {
		int hi = st_ckpt_hex_digit(s[2 * i]);
		int lo = st_ckpt_hex_digit(s[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return st_error_set(-EINVAL, "%s: cursor is not hex",
					    path);
		tr->cursor[i] = (uint8_t)(hi << 4 | lo);
	}
	tr->cursor_bytes = len / 2;
	err = st_ckpt_field(path, root, "config", json_type_object, &v);
	if (err)
		return err;
	tr->config_json = strdup(json_object_to_json_string_ext(v,
			JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
	if (!tr->config_json)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	err = st_ckpt_field(path, root, "files", json_type_array, &v);
	return err ? err : st_ckpt_parse_files(path, v, tr);
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
	root = st_ckpt_parse_object(text, len);
	free(text);
	if (!root)
		return st_error_set(-EINVAL, "%s: not a JSON object (truncated "
				    "or damaged?)", path);
	err = st_ckpt_parse_trainer(path, root, tr);
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

/* ---- directories ------------------------------------------------------------- */

static int st_ckpt_fsync_path(const char *path, int flags)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | flags), err = 0;

	if (fd < 0 || fsync(fd) < 0) {
		err = -errno;
		st_error_set(err, "%s: fsync: %s", path, strerror(-err));
	}
	if (fd >= 0)
		close(fd);
	return err;
}

/* Remove dirfd/name and, for a directory, everything below it. */
static int st_ckpt_rm_tree_at(int dirfd, const char *name)
{
	struct dirent *de;
	DIR *dir;
	int fd, err = 0;

	if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	if (errno != EISDIR && errno != EPERM)
		return -errno;
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
		    O_CLOEXEC);
	if (fd < 0)
		return -errno;
	dir = fdopendir(fd);
	if (!dir) {
		err = -errno;
		close(fd);
		return err;
	}
	while ((de = readdir(dir))) {
		int e;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		e = st_ckpt_rm_tree_at(fd, de->d_name);
		if (e && !err)
			err = e;
	}
	closedir(dir);
	if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && !err)
		err = -errno;
	return err;
}

static int st_ckpt_rm_tree(const char *path)
{
	return st_ckpt_rm_tree_at(AT_FDCWD, path);
}

/* mkdir -p. */
static int st_ckpt_mkdirs(const char *path)
{
	char *p = strdup(path);
	int err = 0;

	if (!p)
		return st_error_set(-ENOMEM, "out of memory");
	for (char *s = p + 1; !err; s++) {
		bool end = *s == '\0';

		if (*s != '/' && !end)
			continue;
		*s = '\0';
		if (mkdir(p, 0755) < 0 && errno != EEXIST) {
			err = -errno;
			st_error_set(err, "cannot create %s: %s", p,
				     strerror(-err));
		}
		if (end)
			break;
		*s = '/';
	}
	free(p);
	return err;
}

/* The pid of a leftover "<anything>.tmp.<pid>", or 0 when name is not one. */
static long st_ckpt_tmp_pid(const char *name)
{
	const char *t = strstr(name, ".tmp."), *next;
	char *end;
	long pid;

	if (!t)
		return 0;
	/* The last ".tmp." counts. */
	while ((next = strstr(t + 1, ".tmp.")))
		t = next;
	t += 5;
	if (*t < '1' || *t > '9')
		return 0;
	pid = strtol(t, &end, 10);
	return *end == '\0' && pid > 0 ? pid : 0;
}

/* Remove root's "step-*.tmp.<pid>" and "latest.tmp.<pid>" entries whose
 * writer is gone (or is us: a leftover of an earlier failure). A live
 * writer's are left alone. */
static void st_ckpt_clean_stale(const char *root)
{
	int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	DIR *dir;

	if (fd < 0)
		return;
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return;
	}
	while ((de = readdir(dir))) {
		long pid = st_ckpt_tmp_pid(de->d_name);

		/* Only names this module makes: root may be a directory the
		 * user keeps other things in. */
		if (!pid || (strncmp(de->d_name, "step-", 5) != 0 &&
			     strncmp(de->d_name, ST_CKPT_LATEST ".tmp.", 11) != 0))
			continue;
		if (pid != (long)getpid() && !(kill((pid_t)pid, 0) < 0 &&
					      errno == ESRCH))
			continue;
		st_ckpt_rm_tree_at(fd, de->d_name);
	}
	closedir(dir);
}

static void st_ckpt_dir_free(struct st_ckpt_dir *d)
{
	free(d->root);
	free(d->final);
	free(d->tmp);
	memset(d, 0, sizeof(*d));
}

int st_ckpt_dir_begin(struct st_ckpt_dir *d, const char *root, uint64_t step)
{
	int err;

	memset(d, 0, sizeof(*d));
	d->step = step;
	d->root = strdup(root);
	d->final = st_ckpt_fmt("%s/step-%06llu", root, (unsigned long long)step);
	d->tmp = st_ckpt_fmt("%s.tmp.%ld", d->final ? d->final : "",
			     (long)getpid());
	if (!d->root || !d->final || !d->tmp) {
		st_ckpt_dir_free(d);
		return st_error_set(-ENOMEM, "out of memory");
	}
	err = st_ckpt_mkdirs(root);
	if (err) {
		st_ckpt_dir_free(d);
		return err;
	}
	st_ckpt_clean_stale(root);
	if (mkdir(d->tmp, 0755) < 0) {
		err = -errno;
		st_error_set(err, "cannot create %s: %s", d->tmp,
			     strerror(-err));
		st_ckpt_dir_free(d);
		return err;
	}
	return 0;
}

/* The topmost of path and its parents that does not exist (malloc'd), or
 * NULL when path exists. */
static char *st_ckpt_missing_top(const char *path)
{
	char *p = strdup(path), *top = NULL, *slash;
	size_t n = p ? strlen(p) : 0;
	struct stat st;

	while (n > 1 && p[n - 1] == '/')
		p[--n] = '\0';
	while (p && stat(p, &st) < 0 && errno == ENOENT) {
		free(top);
		top = strdup(p);
		slash = strrchr(p, '/');
		if (!top || !slash || slash == p)
			break;
		*slash = '\0';
	}
	free(p);
	return top;
}

int st_ckpt_lock(const char *root, int *fd, char **made)
{
	int err;

	*fd = -1;
	*made = st_ckpt_missing_top(root);
	err = st_ckpt_mkdirs(root);
	if (err)
		return err;
	*fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (*fd < 0) {
		err = -errno;
		return st_error_set(err, "cannot open %s: %s", root, strerror(-err));
	}
	if (flock(*fd, LOCK_EX | LOCK_NB) == 0)
		return 0;
	err = -errno;
	close(*fd);
	*fd = -1;
	if (err == -EWOULDBLOCK)
		return st_error_set(-EBUSY, "%s: another process is saving checkpoints here "
				    "(it holds the directory's lock)", root);
	/* ENOLCK, or a file system whose flock needs a file open for writing */
	st_warn("%s: cannot lock it (%s); make sure no other run saves there", root,
		strerror(-err));
	return 0;
}

void st_ckpt_unlock(int fd)
{
	if (fd >= 0)
		close(fd);
}

void st_ckpt_dir_abort(struct st_ckpt_dir *d)
{
	if (d->tmp)
		st_ckpt_rm_tree(d->tmp);
	st_ckpt_dir_free(d);
}

/* fsync every regular file in dir, then dir. */
static int st_ckpt_fsync_tree(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;
	struct dirent *de;
	DIR *dir;

	if (fd < 0 || !(dir = fdopendir(fd))) {
		err = -errno;
		if (fd >= 0)
			close(fd);
		return st_error_set(err, "%s: %s", path, strerror(-err));
	}
	while (!err && (de = readdir(dir))) {
		int ffd;

		if (de->d_name[0] == '.')
			continue;
		ffd = openat(fd, de->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (ffd < 0 || fsync(ffd) < 0) {
			err = -errno;
			st_error_set(err, "%s/%s: fsync: %s", path, de->d_name,
				     strerror(-err));
		}
		if (ffd >= 0)
			close(ffd);
	}
	if (!err && fsync(fd) < 0) {
		err = -errno;
		st_error_set(err, "%s: fsync: %s", path, strerror(-err));
	}
	closedir(dir);
	return err;
}

/* Move tmp to final; when final exists, swap and remove the old one. */
static int st_ckpt_publish(const struct st_ckpt_dir *d)
{
	char *old;
	int err;

	if (rename(d->tmp, d->final) == 0)
		return 0;
	/* rename() refuses to replace a non-empty directory. */
	if (errno != ENOTEMPTY && errno != EEXIST)
		goto fail;
	if (renameat2(AT_FDCWD, d->tmp, AT_FDCWD, d->final,
		      RENAME_EXCHANGE) == 0) {
		st_ckpt_rm_tree(d->tmp); /* the old contents now */
		return 0;
	}
	if (errno != EINVAL && errno != ENOSYS)
		goto fail;
	/* No RENAME_EXCHANGE on this file system: move the old one aside
	 * under a name the next begin cleans up, then move in the new. There
	 * is an instant without d->final; latest still names it. */
	old = st_ckpt_fmt("%s.old.tmp.%ld", d->final, (long)getpid());
	if (!old)
		return st_error_set(-ENOMEM, "out of memory");
	if (rename(d->final, old) < 0 || rename(d->tmp, d->final) < 0) {
		err = -errno;
		free(old);
		return st_error_set(err, "cannot move %s to %s: %s", d->tmp,
				    d->final, strerror(-err));
	}
	st_ckpt_rm_tree(old);
	free(old);
	return 0;
fail:
	err = -errno;
	return st_error_set(err, "cannot move %s to %s: %s", d->tmp, d->final,
			    strerror(-err));
}

static int st_ckpt_set_latest(const struct st_ckpt_dir *d)
{
	const char *name = strrchr(d->final, '/') + 1;
	char *link = st_ckpt_fmt("%s/" ST_CKPT_LATEST, d->root);
	char *tmp = st_ckpt_fmt("%s/" ST_CKPT_LATEST ".tmp.%ld", d->root,
				(long)getpid());
	int err = 0;

	if (!link || !tmp) {
		err = st_error_set(-ENOMEM, "out of memory");
		goto out;
	}
	unlink(tmp);
	/* Relative, so the directory can be moved or copied whole. */
	if (symlink(name, tmp) < 0 || rename(tmp, link) < 0) {
		err = -errno;
		st_error_set(err, "cannot point %s at %s: %s", link, name,
			     strerror(-err));
		unlink(tmp);
		goto out;
	}
	err = st_ckpt_fsync_path(d->root, O_DIRECTORY);
out:
	free(link);
	free(tmp);
	return err;
}

/* The N of "step-N" (digits only), or -1. */
static int64_t st_ckpt_step_of(const char *name)
{
	char *end;
	unsigned long long v;

	if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9')
		return -1;
	errno = 0;
	v = strtoull(name + 5, &end, 10);
	if (*end || errno || v > INT64_MAX)
		return -1;
	return (int64_t)v;
}

static int st_ckpt_cmp_desc(const void *a, const void *b)
{
	int64_t x = ((const struct st_ckpt_step *)a)->step;
	int64_t y = ((const struct st_ckpt_step *)b)->step;

	return x < y ? 1 : x > y ? -1 : 0;
}

void st_ckpt_list_free(struct st_ckpt_step *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(s[i].name);
	free(s);
}

int st_ckpt_list(const char *root, struct st_ckpt_step **out, size_t *out_n)
{
	DIR *dir = opendir(root);
	struct st_ckpt_step *steps = NULL;
	struct dirent *de;
	size_t n = 0, cap = 0;

	if (!dir) {
		int err = -errno;

		return st_error_set(err, "%s: %s", root, strerror(-err));
	}
	while ((de = readdir(dir))) {
		int64_t s = st_ckpt_step_of(de->d_name);

		if (s < 0 || (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN))
			continue;
		if (n == cap) {
			struct st_ckpt_step *p;

			cap = cap ? 2 * cap : 16;
			p = realloc(steps, cap * sizeof(*p));
			if (!p)
				goto oom;
			steps = p;
		}
		steps[n].step = s;
		steps[n].name = strdup(de->d_name);
		if (!steps[n++].name)
			goto oom;
	}
	closedir(dir);
	if (n)
		qsort(steps, n, sizeof(*steps), st_ckpt_cmp_desc);
	*out = steps;
	*out_n = n;
	return 0;
oom:
	closedir(dir);
	st_ckpt_list_free(steps, n);
	return st_error_set(-ENOMEM, "out of memory");
}

int st_ckpt_stamp(const char *dir, struct st_ckpt_stamp *s)
{
	struct stat sb;

	if (stat(dir, &sb) < 0) {
		int err = -errno;

		return st_error_set(err, "%s: %s", dir, strerror(-err));
	}
	if (!S_ISDIR(sb.st_mode))
		return st_error_set(-ENOTDIR, "%s: not a directory", dir);
	*s = (struct st_ckpt_stamp){ (uint64_t)sb.st_dev, (uint64_t)sb.st_ino };
	return 0;
}

enum st_ckpt_fate st_ckpt_fate(const char *dir, const struct st_ckpt_stamp *s)
{
	struct stat sb;

	if (stat(dir, &sb) < 0)
		return errno == ENOENT || errno == ENOTDIR ? ST_CKPT_PRUNED : ST_CKPT_THERE;
	if ((uint64_t)sb.st_dev != s->dev || (uint64_t)sb.st_ino != s->ino)
		return ST_CKPT_REPLACED;
	return ST_CKPT_THERE;
}

static int st_ckpt_prune(const struct st_ckpt_dir *d, unsigned keep)
{
	const char *mine = strrchr(d->final, '/') + 1;
	struct st_ckpt_step *steps;
	size_t n, kept = 0;
	int err = st_ckpt_list(d->root, &steps, &n);

	if (err)
		return err;
	for (size_t i = 0; i < n; i++) {
		char *name, *doomed;

		if (steps[i].step > (int64_t)d->step)
			continue;
		if (strcmp(steps[i].name, mine) == 0 || kept++ < keep - 1)
			continue;
		name = st_ckpt_fmt("%s/%s", d->root, steps[i].name);
		doomed = st_ckpt_fmt("%s.tmp.%ld", name ? name : "",
				     (long)getpid());
		/* Renamed first, so a crash while removing leaves a *.tmp.*
		 * leftover for the next begin, not a half-deleted step-N. */
		if (name && doomed && rename(name, doomed) == 0) {
			int e = st_ckpt_rm_tree(doomed);

			if (e && !err)
				err = st_error_set(e, "cannot remove %s: %s",
						   doomed, strerror(-e));
		}
		free(name);
		free(doomed);
	}
	st_ckpt_list_free(steps, n);
	if (!err)
		err = st_ckpt_fsync_path(d->root, O_DIRECTORY);
	return err;
}

int st_ckpt_dir_commit(struct st_ckpt_dir *d, unsigned keep)
{
	int err = st_ckpt_fsync_tree(d->tmp);

	if (!err)
		err = st_ckpt_publish(d);
	if (err) {
		st_ckpt_dir_abort(d);
		return err;
	}
	err = st_ckpt_fsync_path(d->root, O_DIRECTORY);
	if (!err)
		err = st_ckpt_set_latest(d);
	if (!err && keep)
		err = st_ckpt_prune(d, keep);
	st_ckpt_dir_free(d);
	return err;
}

static bool st_ckpt_exists(const char *dir, const char *name, bool want_dir)
{
	char *p = st_ckpt_fmt("%s/%s", dir, name);
	struct stat sb;
	bool ok = p && stat(p, &sb) == 0 &&
		  (want_dir ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode));

	free(p);
	return ok;
}

int st_ckpt_resolve(const char *path, char **out)
{
	struct st_ckpt_step *steps;
	char target[4096];
	size_t n;
	ssize_t len;
	char *link;
	bool dangling = false;
	int err;

	*out = NULL;
	if (st_ckpt_exists(path, ST_CKPT_TRAINER_FILE, false)) {
		*out = strdup(path);
		return *out ? 0 : st_error_set(-ENOMEM, "out of memory");
	}
	link = st_ckpt_fmt("%s/" ST_CKPT_LATEST, path);
	if (!link)
		return st_error_set(-ENOMEM, "out of memory");
	len = readlink(link, target, sizeof(target) - 1);
	free(link);
	if (len > 0) {
		struct stat sb;

		target[len] = '\0';
		*out = target[0] == '/' ? strdup(target)
					: st_ckpt_fmt("%s/%s", path, target);
		if (!*out)
			return st_error_set(-ENOMEM, "out of memory");
		if (stat(*out, &sb) == 0 || errno != ENOENT)
			return 0;
		/* latest names a directory that is gone (a crash while a step
		 * was saved again without RENAME_EXCHANGE): take the newest
		 * one there is, as without latest. */
		dangling = true;
		free(*out);
		*out = NULL;
	}
	/* No latest: a crash between the first rename and the link, or a
	 * directory copied without its symlink. */
	err = st_ckpt_list(path, &steps, &n);
	if (err) {
		if (dangling) /* the error names the directory; say why it was listed */
			st_warn("%s/" ST_CKPT_LATEST " names %s, which is missing", path, target);
		return err;
	}
	for (size_t i = 0; i < n && !*out; i++)
		if (st_ckpt_exists(path, steps[i].name, true))
			*out = st_ckpt_fmt("%s/%s", path, steps[i].name);
	st_ckpt_list_free(steps, n);
	if (!*out && dangling)
		return st_error_set(-ENOENT, "%s: no checkpoint here ('" ST_CKPT_LATEST "' names "
				    "%s, which is missing, and there is no other step-N "
				    "directory)", path, target);
	if (!*out)
		return st_error_set(-ENOENT, "%s: no checkpoint here (no "
				    "trainer.json, no '" ST_CKPT_LATEST "' link, "
				    "no step-N directory)", path);
	if (dangling)
		st_warn("%s/" ST_CKPT_LATEST " names %s, which is missing: taking the newest "
			"step-N directory, %s", path, target, *out);
	return 0;
}
