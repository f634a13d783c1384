/* Sharded safetensors as transformers writes them (strata/ckpt.h): the
 * layout of a tensor list over shard files, its index, and reading a set of
 * files back through its index, checked against every shard's header. */
#include "strata/ckpt.h"

#include "sf_internal.h"
#include "strata/file.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* An index is names and file names: far below this. */
#define ST_CKPT_INDEX_MAX_BYTES (64 * ST_MiB)
#define ST_CKPT_INDEX_DEPTH 8

/* ---- the layout ------------------------------------------------------------- */

void st_ckpt_layout_fini(struct st_ckpt_layout *l)
{
	if (!l)
		return;
	for (size_t f = 0; l->files && f < l->n_files; f++)
		free(l->files[f].tensors);
	for (size_t f = 0; l->headers && f < l->n_files; f++)
		free(l->headers[f]);
	free(l->headers);
	free(l->files);
	free(l->file_of);
	free(l->offset);
	free(l->size_bytes);
	memset(l, 0, sizeof(*l));
}

/* huggingface_hub's split: tensors in list order; a tensor over the shard
 * size is a shard of its own, appended as it comes; else the current shard
 * is closed (appended) when the tensor would take it past the size. Shard
 * numbers are the order of appending. */
static size_t ckpt_split(const uint64_t *size, size_t n, uint64_t max, size_t *shard_of)
{
	size_t *cur = malloc((n ? n : 1) * sizeof(*cur)), n_cur = 0, next = 0;
	uint64_t cur_bytes = 0;

	if (!cur)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (size[i] > max) {
			shard_of[i] = next++;
			continue;
		}
		if (n_cur > 0 && cur_bytes + size[i] > max) {
			for (size_t k = 0; k < n_cur; k++)
				shard_of[cur[k]] = next;
			next++;
			n_cur = 0;
			cur_bytes = 0;
		}
		cur[n_cur++] = i;
		cur_bytes += size[i];
	}
	if (n_cur > 0) {
		for (size_t k = 0; k < n_cur; k++)
			shard_of[cur[k]] = next;
		next++;
	}
	free(cur);
	return next ? next : 1; /* no tensors: one empty file */
}

int st_ckpt_layout_init(struct st_ckpt_layout *l, const char *stem,
			const struct st_ckpt_tensor *tensors, size_t n,
			const struct st_sf_meta *meta, size_t n_meta,
			uint64_t shard_bytes)
{
	struct st_sf_entry *e = NULL;
	uint64_t total = 0;
	int err = 0;

	memset(l, 0, sizeof(*l));
	if (!stem || !stem[0] || strlen(stem) >= sizeof(l->stem) - 8 || strchr(stem, '/'))
		return st_error_set(-EINVAL, "'%.40s' cannot be a checkpoint file stem",
				    stem ? stem : "(null)");
	snprintf(l->stem, sizeof(l->stem), "%s", stem);
	if (shard_bytes == 0)
		shard_bytes = ST_CKPT_SHARD_BYTES_DEFAULT;
	l->n_tensors = n;
	e = calloc(n + 1, sizeof(*e));
	l->file_of = calloc(n + 1, sizeof(*l->file_of));
	l->offset = calloc(n + 1, sizeof(*l->offset));
	l->size_bytes = calloc(n + 1, sizeof(*l->size_bytes));
	if (!e || !l->file_of || !l->offset || !l->size_bytes) {
		err = st_error_set(-ENOMEM, "%s: out of memory", stem);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		e[i] = (struct st_sf_entry){ .name = tensors[i].name, .dtype = tensors[i].dtype,
					     .ndim = tensors[i].ndim, .shape = tensors[i].shape };
	/* the whole list once: names unique across the shards too */
	err = st_sf_entries_check(stem, e, n, meta, n_meta, &total);
	if (err)
		goto out;
	l->total_bytes = total;
	for (size_t i = 0; i < n; i++)
		l->size_bytes[i] = e[i].size_bytes;
	l->n_files = ckpt_split(l->size_bytes, n, shard_bytes, l->file_of);
	if (l->n_files == 0 || l->n_files > 99999) {
		err = l->n_files ? st_error_set(-EINVAL, "%s: %zu shards: more than the 5 digits "
						"of their names", stem, l->n_files)
				 : st_error_set(-ENOMEM, "%s: out of memory", stem);
		goto out;
	}
	l->files = calloc(l->n_files, sizeof(*l->files));
	l->headers = calloc(l->n_files, sizeof(*l->headers));
	if (!l->files || !l->headers) {
		err = st_error_set(-ENOMEM, "%s: out of memory", stem);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		l->files[l->file_of[i]].n_tensors++;
	for (size_t f = 0; f < l->n_files; f++) {
		struct st_ckpt_shard *s = &l->files[f];

		if (l->n_files == 1)
			snprintf(s->name, sizeof(s->name), "%s.safetensors", stem);
		else
			snprintf(s->name, sizeof(s->name), "%s-%05zu-of-%05zu.safetensors", stem,
				 f + 1, l->n_files);
		s->tensors = malloc((s->n_tensors ? s->n_tensors : 1) * sizeof(size_t));
		if (!s->tensors) {
			err = st_error_set(-ENOMEM, "%s: out of memory", stem);
			goto out;
		}
		s->n_tensors = 0;
	}
	if (l->n_files > 1)
		snprintf(l->index_name, sizeof(l->index_name), "%s%s", stem, ST_CKPT_INDEX_SUFFIX);
	for (size_t i = 0; i < n; i++) {
		struct st_ckpt_shard *s = &l->files[l->file_of[i]];

		s->tensors[s->n_tensors++] = i;
	}
	/* each file's header, as st_ckpt_write_safetensors() builds it */
	for (size_t f = 0; f < l->n_files; f++) {
		struct st_ckpt_shard *s = &l->files[f];
		struct st_sf_entry *fe = calloc(s->n_tensors + 1, sizeof(*fe));
		uint64_t data = 0, at;
		size_t hb = 0;

		if (!fe) {
			err = st_error_set(-ENOMEM, "%s: out of memory", stem);
			goto out;
		}
		for (size_t k = 0; k < s->n_tensors; k++)
			fe[k] = e[s->tensors[k]];
		err = st_sf_entries_check(s->name, fe, s->n_tensors, meta, n_meta, &data);
		if (!err)
			err = st_sf_header_build(s->name, fe, s->n_tensors, meta, n_meta,
						 &l->headers[f], &hb);
		free(fe);
		if (err)
			goto out;
		s->header_bytes = hb;
		s->data_bytes = data;
		s->bytes = hb + data;
		at = hb;
		for (size_t k = 0; k < s->n_tensors; k++) {
			l->offset[s->tensors[k]] = at;
			at += l->size_bytes[s->tensors[k]];
		}
	}
out:
	free(e);
	if (err)
		st_ckpt_layout_fini(l);
	return err;
}

struct ckpt_sub_fill {
	st_ckpt_fill_fn fill;
	void *ctx;
	const size_t *map;
};

static int ckpt_sub_fill(void *vctx, size_t ti, uint64_t off, void *buf, size_t len)
{
	const struct ckpt_sub_fill *c = vctx;

	return c->fill(c->ctx, c->map[ti], off, buf, len);
}

int st_ckpt_layout_write_file(const char *dir, const struct st_ckpt_layout *l,
			      const struct st_ckpt_tensor *tensors, size_t f,
			      st_ckpt_fill_fn fill, void *ctx,
			      uint64_t *out_bytes, uint64_t *out_xxh64)
{
	const struct st_ckpt_shard *s;
	struct st_sf_entry *e;
	struct ckpt_sub_fill sub = { .fill = fill, .ctx = ctx };
	char path[4096];
	int err;

	if (f >= l->n_files)
		return st_error_set(-EINVAL, "%s: no file %zu in a layout of %zu", l->stem, f,
				    l->n_files);
	s = &l->files[f];
	sub.map = s->tensors;
	if (!fill && s->data_bytes)
		return st_error_set(-EINVAL, "%s: no fill callback", s->name);
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, s->name) >= sizeof(path))
		return st_error_set(-ENAMETOOLONG, "%s/%s: path too long", dir, s->name);
	e = calloc(s->n_tensors + 1, sizeof(*e));
	if (!e)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	for (size_t k = 0; k < s->n_tensors; k++) {
		const struct st_ckpt_tensor *t = &tensors[s->tensors[k]];

		e[k] = (struct st_sf_entry){ .name = t->name, .dtype = t->dtype, .ndim = t->ndim,
					     .shape = t->shape,
					     .size_bytes = l->size_bytes[s->tensors[k]] };
	}
	err = st_ckpt_write_with_header(path, l->headers[f], (size_t)s->header_bytes, e,
					s->n_tensors, ckpt_sub_fill, &sub, out_bytes,
					out_xxh64);
	free(e);
	return err;
}

int st_ckpt_layout_create(const char *dir, const struct st_ckpt_layout *l, size_t f)
{
	const struct st_ckpt_shard *s;
	char path[4096];
	int fd, err;

	if (f >= l->n_files)
		return st_error_set(-EINVAL, "%s: no file %zu in a layout of %zu", l->stem, f,
				    l->n_files);
	s = &l->files[f];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, s->name) >= sizeof(path))
		return st_error_set(-ENAMETOOLONG, "%s/%s: path too long", dir, s->name);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		err = -errno;
		return st_error_set(err, "%s: %s", path, strerror(-err));
	}
	err = 0;
	for (size_t done = 0; done < s->header_bytes;) {
		ssize_t w = pwrite(fd, l->headers[f] + done, (size_t)s->header_bytes - done,
				   (off_t)done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			err = w < 0 ? -errno : -EIO;
			st_error_set(err, "%s: write: %s", path, strerror(-err));
			break;
		}
		done += (size_t)w;
	}
	if (!err && ftruncate(fd, (off_t)s->bytes) < 0) {
		err = -errno;
		st_error_set(err, "%s: ftruncate to %llu bytes: %s", path,
			     (unsigned long long)s->bytes, strerror(-err));
	}
	close(fd);
	if (err)
		unlink(path);
	return err;
}

/* s as Python's json.dumps() writes a str (ensure_ascii): \" \\ \n \r \t
 * \b \f, every other byte outside ' '..'~' as \uXXXX of its code point
 * (UTF-8 decoded; above U+FFFF as a surrogate pair; a byte that is not
 * UTF-8 as itself). */
static void ckpt_py_str(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	fputc('"', f);
	while (*p) {
		unsigned c = *p, len = 1;

		if (c == '"' || c == '\\') {
			fprintf(f, "\\%c", c);
		} else if (c >= 0x20 && c <= 0x7e) {
			fputc((int)c, f);
		} else if (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f') {
			fprintf(f, "\\%c", c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't'
					   : c == '\b' ? 'b' : 'f');
		} else {
			unsigned cp = c, need = c >= 0xf0 && c < 0xf5 ? 3 : c >= 0xe0 && c < 0xf0 ? 2
					      : c >= 0xc2 && c < 0xe0 ? 1 : 0;

			cp = need == 3 ? c & 7 : need == 2 ? c & 15 : need == 1 ? c & 31 : c;
			for (unsigned k = 1; k <= need; k++) {
				if ((p[k] & 0xc0) != 0x80) {
					need = 0;
					cp = c;
					break;
				}
				cp = cp << 6 | (p[k] & 0x3f);
			}
			len = 1 + need;
			if (cp >= 0x10000)
				fprintf(f, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10),
					0xdc00 + ((cp - 0x10000) & 0x3ff));
			else
				fprintf(f, "\\u%04x", cp);
		}
		p += len;
	}
	fputc('"', f);
}

struct st_ckpt_name_ix {
	const char *name;
	size_t file;
};

static int ckpt_name_cmp(const void *a, const void *b)
{
	/* byte order of UTF-8 is code point order: Python's sort_keys */
	return strcmp(((const struct st_ckpt_name_ix *)a)->name,
		      ((const struct st_ckpt_name_ix *)b)->name);
}

int st_ckpt_layout_index_json(const struct st_ckpt_layout *l,
			      const struct st_ckpt_tensor *tensors, char **out,
			      size_t *out_len)
{
	struct st_ckpt_name_ix *ix = calloc(l->n_tensors + 1, sizeof(*ix));
	FILE *f;

	*out = NULL;
	*out_len = 0;
	if (!ix)
		return st_error_set(-ENOMEM, "%s: out of memory", l->index_name);
	for (size_t i = 0; i < l->n_tensors; i++)
		ix[i] = (struct st_ckpt_name_ix){ tensors[i].name, l->file_of[i] };
	qsort(ix, l->n_tensors, sizeof(*ix), ckpt_name_cmp);
	f = open_memstream(out, out_len);
	if (!f) {
		free(ix);
		return st_error_set(-ENOMEM, "%s: out of memory", l->index_name);
	}
	fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
		(unsigned long long)l->total_bytes);
	for (size_t i = 0; i < l->n_tensors; i++) {
		fputs(i ? ",\n    " : "\n    ", f);
		ckpt_py_str(f, ix[i].name);
		fputs(": ", f);
		ckpt_py_str(f, l->files[ix[i].file].name);
	}
	fputs(l->n_tensors ? "\n  }\n}\n" : "}\n}\n", f);
	free(ix);
	if (fclose(f) != 0 || !*out) {
		free(*out);
		*out = NULL;
		return st_error_set(-ENOMEM, "%s: out of memory", l->index_name);
	}
	return 0;
}

int st_ckpt_layout_write_index(const char *dir, const struct st_ckpt_layout *l,
			       const struct st_ckpt_tensor *tensors,
			       struct st_ckpt_trainer *tr)
{
	struct st_file_atomic fa;
	char path[4096], *text = NULL;
	size_t len = 0;
	int err;

	if (l->n_files == 1)
		return 0;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, l->index_name) >= sizeof(path))
		return st_error_set(-ENAMETOOLONG, "%s/%s: path too long", dir, l->index_name);
	err = st_ckpt_layout_index_json(l, tensors, &text, &len);
	if (!err)
		err = st_file_atomic_open(&fa, path);
	if (!err) {
		err = st_file_atomic_write(&fa, text, len);
		if (err)
			st_file_atomic_abort(&fa);
		else
			err = st_file_atomic_commit(&fa);
	}
	if (!err && tr)
		err = st_ckpt_trainer_add(tr, l->index_name, len, XXH64(text, len, 0));
	free(text);
	return err;
}

int st_ckpt_layout_write(const char *dir, const struct st_ckpt_layout *l,
			 const struct st_ckpt_tensor *tensors, st_ckpt_fill_fn fill,
			 void *ctx, struct st_ckpt_trainer *tr)
{
	uint64_t bytes, hash;
	int err = 0;

	for (size_t f = 0; !err && f < l->n_files; f++) {
		err = st_ckpt_layout_write_file(dir, l, tensors, f, fill, ctx, &bytes, &hash);
		if (!err && tr)
			err = st_ckpt_trainer_add(tr, l->files[f].name, bytes, hash);
	}
	return err ? err : st_ckpt_layout_write_index(dir, l, tensors, tr);
}

/* ---- reading a set ---------------------------------------------------------- */

struct st_ckpt_set {
	char *path;          /* the index or the one file: messages */
	char index_name[96]; /* "" for one file */
	size_t n;
	char **names;        /* [n] file names in the directory */
	uint64_t *bytes;     /* [n] their sizes */
	struct st_ckpt_reader **r;
	uint64_t data_bytes;
	size_t count;
};

static char *ckpt_join(const char *dir, const char *name)
{
	char *p = NULL;

	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

static uint64_t ckpt_path_bytes(const char *path)
{
	struct stat sb;

	return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

static bool ckpt_is_file(const char *dir, const char *name)
{
	char *p = ckpt_join(dir, name);
	struct stat sb;
	bool yes = p && stat(p, &sb) == 0 && !S_ISDIR(sb.st_mode);

	free(p);
	return yes;
}

int st_ckpt_set_kind(const char *dir, const char *stem)
{
	char one[96], index[96];
	bool a, b;

	snprintf(one, sizeof(one), "%.60s.safetensors", stem);
	snprintf(index, sizeof(index), "%.60s%s", stem, ST_CKPT_INDEX_SUFFIX);
	a = ckpt_is_file(dir, one);
	b = ckpt_is_file(dir, index);
	if (a && b)
		return st_error_set(-EINVAL, "%s: holds both %s and %s: which one is the model "
				    "is not clear (remove one)", dir, one, index);
	return a ? 1 : b ? 2 : 0;
}

void st_ckpt_set_close(struct st_ckpt_set *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++) {
		st_ckpt_reader_close(s->r ? s->r[i] : NULL);
		free(s->names ? s->names[i] : NULL);
	}
	free(s->r);
	free(s->names);
	free(s->bytes);
	free(s->path);
	free(s);
}

static int ckpt_set_add(struct st_ckpt_set *s, const char *name)
{
	char **names = realloc(s->names, (s->n + 1) * sizeof(*names));
	struct st_ckpt_reader **r;
	uint64_t *bytes;

	if (!names)
		return -ENOMEM;
	s->names = names;
	bytes = realloc(s->bytes, (s->n + 1) * sizeof(*bytes));
	if (!bytes)
		return -ENOMEM;
	s->bytes = bytes;
	s->bytes[s->n] = 0;
	r = realloc(s->r, (s->n + 1) * sizeof(*r));
	if (!r)
		return -ENOMEM;
	s->r = r;
	s->r[s->n] = NULL;
	s->names[s->n] = strdup(name);
	if (!s->names[s->n])
		return -ENOMEM;
	s->n++;
	return 0;
}

static ssize_t ckpt_set_file_ix(const struct st_ckpt_set *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->names[i], name) == 0)
			return (ssize_t)i;
	return -1;
}

/* A weight_map value: a plain file name in the directory. */
static bool ckpt_plain_name(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len > 255 || strchr(name, '/') || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return false;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20)
			return false;
	return true;
}

/* The index's root object, parsed strictly. */
static int ckpt_index_parse(const char *path, struct json_object **out)
{
	struct json_tokener *tok;
	enum json_tokener_error jerr;
	struct json_object *root;
	char *text = NULL;
	size_t bytes = 0, end;
	int err = st_file_read_small(path, ST_CKPT_INDEX_MAX_BYTES, &text, &bytes);

	*out = NULL;
	if (err == -EFBIG)
		return st_error_set(-EINVAL, "%s: more than the %d MiB an index may hold", path,
				    (int)(ST_CKPT_INDEX_MAX_BYTES / ST_MiB));
	if (err)
		return err;
	tok = json_tokener_new_ex(ST_CKPT_INDEX_DEPTH);
	if (!tok) {
		free(text);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_ALLOW_TRAILING_CHARS |
			       JSON_TOKENER_VALIDATE_UTF8);
	root = json_tokener_parse_ex(tok, text, (int)bytes);
	jerr = json_tokener_get_error(tok);
	end = json_tokener_get_parse_end(tok);
	json_tokener_free(tok);
	if (root && jerr == json_tokener_success)
		for (size_t i = end; i < bytes; i++)
			if (text[i] != ' ' && text[i] != '\n' && text[i] != '\r' && text[i] != '\t') {
				jerr = json_tokener_error_parse_unexpected;
				end = i;
				break;
			}
	free(text);
	if (!root || jerr != json_tokener_success) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: not valid JSON: %s at byte %zu", path,
				    jerr == json_tokener_continue || jerr == json_tokener_success
				    ? "it ends too soon" : json_tokener_error_desc(jerr), end);
	}
	if (!json_object_is_type(root, json_type_object)) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: not a JSON object", path);
	}
	*out = root;
	return 0;
}

/* Open the shards an index names and check it against their headers. */
static int ckpt_set_open_index(struct st_ckpt_set *s, const char *dir)
{
	struct json_object *root = NULL, *wm = NULL, *md = NULL;
	char sk[ST_SF_SHOW_LEN], sn[ST_SF_SHOW_LEN], sm[ST_SF_SHOW_LEN];
	int err = ckpt_index_parse(s->path, &root);

	if (err)
		return err;
	if (json_object_object_get_ex(root, "metadata", &md) &&
	    !json_object_is_type(md, json_type_object)) {
		err = st_error_set(-EINVAL, "%s: \"metadata\" is not an object", s->path);
		goto out;
	}
	if (!json_object_object_get_ex(root, "weight_map", &wm)) {
		err = st_error_set(-EINVAL, "%s: no \"weight_map\"", s->path);
		goto out;
	}
	if (!json_object_is_type(wm, json_type_object) || json_object_object_length(wm) == 0) {
		err = st_error_set(-EINVAL, "%s: \"weight_map\" is not an object of tensor "
				   "names to files, or is empty", s->path);
		goto out;
	}
	/* its files, in order of first mention; each opened */
	json_object_object_foreach(wm, key, val) {
		const char *file;
		char *p;

		if (!json_object_is_type(val, json_type_string) ||
		    !ckpt_plain_name(file = json_object_get_string(val))) {
			err = st_error_set(-EINVAL, "%s: weight_map[\"%s\"] is not the name of "
					   "a file in the directory", s->path, st_sf_show(key, sk));
			goto out;
		}
		if (ckpt_set_file_ix(s, file) >= 0)
			continue;
		if (ckpt_set_add(s, file) < 0) {
			err = st_error_set(-ENOMEM, "%s: out of memory", s->path);
			goto out;
		}
		p = ckpt_join(dir, file);
		err = p ? st_ckpt_reader_open(&s->r[s->n - 1], p)
			: st_error_set(-ENOMEM, "%s: out of memory", s->path);
		if (!err)
			s->bytes[s->n - 1] = ckpt_path_bytes(p);
		free(p);
		if (err == -ENOENT)
			err = st_error_set(-EINVAL, "%s: weight_map[\"%s\"] names %s, "
					   "which is missing", s->path, st_sf_show(key, sk),
					   st_sf_show(file, sn));
		if (err)
			goto out;
	}
	/* in name order (model-00001-of-... first), as a listing shows them */
	for (size_t i = 1; i < s->n; i++)
		for (size_t j = i; j > 0 && strcmp(s->names[j - 1], s->names[j]) > 0; j--) {
			char *tn = s->names[j];
			struct st_ckpt_reader *tr = s->r[j];
			uint64_t tb = s->bytes[j];

			s->names[j] = s->names[j - 1];
			s->r[j] = s->r[j - 1];
			s->bytes[j] = s->bytes[j - 1];
			s->names[j - 1] = tn;
			s->r[j - 1] = tr;
			s->bytes[j - 1] = tb;
		}
	/* every tensor of those files is mapped to the file it is in */
	for (size_t f = 0; f < s->n; f++) {
		const struct st_safetensors *sf = st_ckpt_reader_file(s->r[f]);

		for (size_t i = 0; i < st_safetensors_count(sf); i++) {
			const struct st_sf_info *t = st_safetensors_at(sf, i);
			struct json_object *v;
			const char *mapped;

			if (!json_object_object_get_ex(wm, t->name, &v)) {
				err = st_error_set(-EINVAL, "%s: tensor \"%s\" of %s is not in "
						   "its weight_map", s->path, st_sf_show(t->name, sk),
						   st_sf_show(s->names[f], sn));
				goto out;
			}
			mapped = json_object_get_string(v);
			if (strcmp(mapped, s->names[f]) != 0) {
				ssize_t g = ckpt_set_file_ix(s, mapped);

				if (st_safetensors_find(st_ckpt_reader_file(s->r[g]), t->name))
					err = st_error_set(-EINVAL, "%s: tensor \"%s\" is in two "
							   "shards, %s and %s", s->path,
							   st_sf_show(t->name, sk),
							   st_sf_show(s->names[f], sn),
							   st_sf_show(mapped, sm));
				else
					err = st_error_set(-EINVAL, "%s: weight_map[\"%s\"] names "
							   "%s, but the tensor is in %s", s->path,
							   st_sf_show(t->name, sk), st_sf_show(mapped, sm),
							   st_sf_show(s->names[f], sn));
				goto out;
			}
			s->data_bytes += t->size_bytes;
			s->count++;
		}
	}
	/* and every tensor the index maps is in its file */
	json_object_object_foreach(wm, key2, val2) {
		ssize_t f = ckpt_set_file_ix(s, json_object_get_string(val2));

		if (!st_safetensors_find(st_ckpt_reader_file(s->r[f]), key2)) {
			err = st_error_set(-EINVAL, "%s: weight_map[\"%s\"] names %s, "
					   "which has no tensor \"%s\"", s->path, st_sf_show(key2, sk),
					   st_sf_show(s->names[f], sn), sk);
			goto out;
		}
	}
out:
	json_object_put(root);
	return err;
}

int st_ckpt_set_open(struct st_ckpt_set **out, const char *dir, const char *stem)
{
	struct st_ckpt_set *s;
	char name[96];
	int kind = st_ckpt_set_kind(dir, stem), err;

	*out = NULL;
	if (kind < 0)
		return kind;
	s = calloc(1, sizeof(*s));
	if (!s)
		return st_error_set(-ENOMEM, "%s: out of memory", dir);
	if (kind == 2) {
		snprintf(s->index_name, sizeof(s->index_name), "%.60s%s", stem,
			 ST_CKPT_INDEX_SUFFIX);
		s->path = ckpt_join(dir, s->index_name);
		err = s->path ? ckpt_set_open_index(s, dir)
			      : st_error_set(-ENOMEM, "%s: out of memory", dir);
	} else {
		const struct st_safetensors *sf;

		snprintf(name, sizeof(name), "%.60s.safetensors", stem);
		s->path = ckpt_join(dir, name);
		if (!s->path || ckpt_set_add(s, name) < 0)
			err = st_error_set(-ENOMEM, "%s: out of memory", dir);
		else
			err = st_ckpt_reader_open(&s->r[0], s->path); /* -ENOENT when kind 0 */
		if (!err) {
			s->bytes[0] = ckpt_path_bytes(s->path);
			sf = st_ckpt_reader_file(s->r[0]);
			s->count = st_safetensors_count(sf);
			for (size_t i = 0; i < s->count; i++)
				s->data_bytes += st_safetensors_at(sf, i)->size_bytes;
		}
	}
	if (err) {
		st_ckpt_set_close(s);
		return err;
	}
	*out = s;
	return 0;
}

int st_ckpt_set_open_file(struct st_ckpt_set **out, const char *path)
{
	struct st_ckpt_set *s = calloc(1, sizeof(*s));
	const struct st_safetensors *sf;
	const char *base = strrchr(path, '/');
	int err;

	*out = NULL;
	if (!s || !(s->path = strdup(path)) || ckpt_set_add(s, base ? base + 1 : path) < 0) {
		st_ckpt_set_close(s);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	err = st_ckpt_reader_open(&s->r[0], path);
	if (err) {
		st_ckpt_set_close(s);
		return err;
	}
	s->bytes[0] = ckpt_path_bytes(path);
	sf = st_ckpt_reader_file(s->r[0]);
	s->count = st_safetensors_count(sf);
	for (size_t i = 0; i < s->count; i++)
		s->data_bytes += st_safetensors_at(sf, i)->size_bytes;
	*out = s;
	return 0;
}

uint64_t st_ckpt_set_file_bytes(const struct st_ckpt_set *s, size_t i)
{
	return s->bytes[i];
}

size_t st_ckpt_set_files(const struct st_ckpt_set *s)
{
	return s->n;
}

const struct st_ckpt_reader *st_ckpt_set_reader(const struct st_ckpt_set *s, size_t i)
{
	return s->r[i];
}

const char *st_ckpt_set_file_name(const struct st_ckpt_set *s, size_t i)
{
	return s->names[i];
}

const char *st_ckpt_set_index_name(const struct st_ckpt_set *s)
{
	return s->index_name;
}

uint64_t st_ckpt_set_data_bytes(const struct st_ckpt_set *s)
{
	return s->data_bytes;
}

const char *st_ckpt_set_path(const struct st_ckpt_set *s)
{
	return s->path;
}

size_t st_ckpt_set_count(const struct st_ckpt_set *s)
{
	return s->count;
}

const struct st_sf_info *st_ckpt_set_lookup(const struct st_ckpt_set *s, const char *name,
					    const struct st_ckpt_reader **r)
{
	for (size_t i = 0; i < s->n; i++) {
		const struct st_sf_info *t = st_safetensors_find(st_ckpt_reader_file(s->r[i]),
								 name);

		if (t) {
			if (r)
				*r = s->r[i];
			return t;
		}
	}
	return NULL;
}

int st_ckpt_set_find(const struct st_ckpt_set *s, const char *name,
		     enum st_sf_dtype dtype, int ndim, const uint64_t *shape,
		     const struct st_sf_info **out, const struct st_ckpt_reader **r)
{
	const struct st_ckpt_reader *in = NULL;
	char sk[ST_SF_SHOW_LEN];

	*out = NULL;
	if (!st_ckpt_set_lookup(s, name, &in))
		return st_error_set(-ENOENT, "%s: no tensor '%s'", s->path, st_sf_show(name, sk));
	if (r)
		*r = in;
	return st_ckpt_reader_find(in, name, dtype, ndim, shape, out);
}
