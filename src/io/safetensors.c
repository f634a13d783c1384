/* safetensors reader and writer. The header is parsed with json-c; every
 * number, range and size is checked before anything is trusted, because a
 * checkpoint is input like any other (tests/fuzz feeds this file garbage). */
#include "strata/safetensors.h"

#include "sf_internal.h"
#include "strata/file.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const struct {
	const char *name;
	size_t size;
} st_sf_dtypes[ST_SF_DTYPE_COUNT] = {
	[ST_SF_BOOL] = { "BOOL", 1 },
	[ST_SF_U8] = { "U8", 1 },
	[ST_SF_I8] = { "I8", 1 },
	[ST_SF_F8_E5M2] = { "F8_E5M2", 1 },
	[ST_SF_F8_E4M3] = { "F8_E4M3", 1 },
	[ST_SF_I16] = { "I16", 2 },
	[ST_SF_U16] = { "U16", 2 },
	[ST_SF_F16] = { "F16", 2 },
	[ST_SF_BF16] = { "BF16", 2 },
	[ST_SF_I32] = { "I32", 4 },
	[ST_SF_U32] = { "U32", 4 },
	[ST_SF_F32] = { "F32", 4 },
	[ST_SF_F64] = { "F64", 8 },
	[ST_SF_I64] = { "I64", 8 },
	[ST_SF_U64] = { "U64", 8 },
};

/* Names in error messages are cut to this many bytes, so the problem that
 * follows the name still fits in the error line. */

/* JSON nesting in a valid header is 3 ({ name: { shape: [ ] } }). */
#define ST_SF_JSON_DEPTH 8

enum st_sf_map_kind { ST_SF_MAP_NONE, ST_SF_MAP_MMAP, ST_SF_MAP_HEAP };

struct st_safetensors {
	char *label;              /* path, for errors */
	int fd;                   /* -1 when opened from memory */
	const uint8_t *mem;       /* open_mem: the whole file, borrowed */
	uint64_t file_bytes;
	uint64_t data_off;        /* 8 + header length */
	uint64_t data_bytes;
	size_t n;
	struct st_sf_info *tensors; /* sorted by offset; names owned */
	size_t n_meta;
	char **meta;              /* key, value, key, value, ... owned */
	enum st_sf_map_kind map_kind;
	void *map;
	size_t map_bytes;
};

size_t st_sf_dtype_size(enum st_sf_dtype dtype)
{
	if ((unsigned)dtype >= ST_SF_DTYPE_COUNT)
		return 0;
	return st_sf_dtypes[dtype].size;
}

const char *st_sf_dtype_name(enum st_sf_dtype dtype)
{
	if ((unsigned)dtype >= ST_SF_DTYPE_COUNT)
		return "?";
	return st_sf_dtypes[dtype].name;
}

static int sf_dtype_parse(const char *s, enum st_sf_dtype *out)
{
	for (int i = 0; i < ST_SF_DTYPE_COUNT; i++) {
		if (strcmp(s, st_sf_dtypes[i].name) == 0) {
			*out = (enum st_sf_dtype)i;
			return 0;
		}
	}
	return -EINVAL;
}

const char *st_sf_shape_str(const uint64_t *shape, int ndim, char *buf,
			    size_t buf_len)
{
	size_t at = 0;

	at += (size_t)snprintf(buf, buf_len, "[");
	for (int i = 0; i < ndim && at < buf_len; i++)
		at += (size_t)snprintf(buf + at, buf_len - at, "%s%llu",
				       i ? "," : "",
				       (unsigned long long)shape[i]);
	if (at < buf_len)
		snprintf(buf + at, buf_len - at, "]");
	return buf;
}

/* A name from the file as it may appear in the one-line error: control
 * bytes spelled \xNN, cut at ST_SF_NAME_SHOWN bytes with "...". */
const char *st_sf_show(const char *s, char *buf)
{
	size_t at = 0, i;

	for (i = 0; s[i] && i < ST_SF_NAME_SHOWN; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c < 0x20 || c == 0x7f)
			at += (size_t)snprintf(buf + at, ST_SF_SHOW_LEN - at,
					       "\\x%02x", c);
		else
			buf[at++] = (char)c;
	}
	if (s[i])
		at += (size_t)snprintf(buf + at, ST_SF_SHOW_LEN - at, "...");
	buf[at] = '\0';
	return buf;
}

/* Product of shape and the element size, or -EOVERFLOW. */
static int sf_shape_bytes(const uint64_t *shape, int ndim,
			  enum st_sf_dtype dtype, uint64_t *elems,
			  uint64_t *bytes)
{
	uint64_t e = 1;

	for (int i = 0; i < ndim; i++)
		if (__builtin_mul_overflow(e, shape[i], &e))
			return -EOVERFLOW;
	if (__builtin_mul_overflow(e, (uint64_t)st_sf_dtype_size(dtype), bytes))
		return -EOVERFLOW;
	*elems = e;
	return 0;
}

/* ---- reader ------------------------------------------------------------ */

static int sf_tensor_err(const struct st_safetensors *sf, const char *name,
			 const char *fmt, ...) ST_PRINTF(3, 4);

/* "<file>: tensor '<name>': <problem>", -EINVAL. */
static int sf_tensor_err(const struct st_safetensors *sf, const char *name,
			 const char *fmt, ...)
{
	char what[320], shown[ST_SF_SHOW_LEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return st_error_set(-EINVAL, "%s: tensor '%s': %s", sf->label,
			    st_sf_show(name, shown), what);
}

/* A JSON integer in [0, 2^63 - 1). json-c saturates larger integers to
 * INT64_MAX, so that value means "too large" here. */
static int sf_get_count(const struct st_safetensors *sf, const char *name,
			const char *what, struct json_object *v,
			uint64_t *out)
{
	int64_t i;

	if (!json_object_is_type(v, json_type_int))
		return sf_tensor_err(sf, name, "%s is not an integer "
				     "(it is %s)", what,
				     json_type_to_name(json_object_get_type(v)));
	i = json_object_get_int64(v);
	if (i < 0)
		return sf_tensor_err(sf, name, "%s is negative (%lld)", what,
				     (long long)i);
	if (i == INT64_MAX)
		return sf_tensor_err(sf, name, "%s is too large "
				     "(2^63 - 1 or more)", what);
	*out = (uint64_t)i;
	return 0;
}

static int sf_parse_tensor(struct st_safetensors *sf, const char *name,
			   struct json_object *obj, struct st_sf_info *t)
{
	struct json_object *jdtype = NULL, *jshape = NULL, *joffs = NULL;
	uint64_t begin, end, elems, bytes;
	char shape_s[ST_SF_SHAPE_STR_LEN], shown[ST_SF_SHOW_LEN];
	size_t len;
	int err;

	if (!json_object_is_type(obj, json_type_object))
		return sf_tensor_err(sf, name, "entry is not an object "
				     "(it is %s)",
				     json_type_to_name(json_object_get_type(obj)));
	json_object_object_foreach(obj, key, val) {
		if (strcmp(key, "dtype") == 0)
			jdtype = val;
		else if (strcmp(key, "shape") == 0)
			jshape = val;
		else if (strcmp(key, "data_offsets") == 0)
			joffs = val;
		else
			return sf_tensor_err(sf, name, "unknown field "
					     "\"%.40s\"",
					     st_sf_show(key, shown));
	}
	if (!jdtype)
		return sf_tensor_err(sf, name, "missing \"dtype\"");
	if (!jshape)
		return sf_tensor_err(sf, name, "missing \"shape\"");
	if (!joffs)
		return sf_tensor_err(sf, name, "missing \"data_offsets\"");

	if (!json_object_is_type(jdtype, json_type_string))
		return sf_tensor_err(sf, name, "dtype is not a string");
	if (sf_dtype_parse(json_object_get_string(jdtype), &t->dtype))
		return sf_tensor_err(sf, name, "unknown dtype \"%.32s\"",
				     st_sf_show(json_object_get_string(jdtype),
						   shown));

	if (!json_object_is_type(jshape, json_type_array))
		return sf_tensor_err(sf, name, "shape is not an array");
	len = json_object_array_length(jshape);
	if (len > ST_SF_MAX_DIMS)
		return sf_tensor_err(sf, name, "shape has %zu dimensions, "
				     "more than the %d supported", len,
				     ST_SF_MAX_DIMS);
	t->ndim = (int)len;
	for (size_t i = 0; i < len; i++) {
		char what[32];

		snprintf(what, sizeof(what), "shape[%zu]", i);
		err = sf_get_count(sf, name, what,
				   json_object_array_get_idx(jshape, i),
				   &t->shape[i]);
		if (err)
			return err;
	}

	if (!json_object_is_type(joffs, json_type_array) ||
	    json_object_array_length(joffs) != 2)
		return sf_tensor_err(sf, name, "data_offsets is not an array "
				     "of two integers");
	err = sf_get_count(sf, name, "data_offsets[0]",
			   json_object_array_get_idx(joffs, 0), &begin);
	if (!err)
		err = sf_get_count(sf, name, "data_offsets[1]",
				   json_object_array_get_idx(joffs, 1), &end);
	if (err)
		return err;

	st_sf_shape_str(t->shape, t->ndim, shape_s, sizeof(shape_s));
	if (begin > end)
		return sf_tensor_err(sf, name, "data_offsets [%llu, %llu) "
					"end before they begin",
					(unsigned long long)begin,
					(unsigned long long)end);
	if (sf_shape_bytes(t->shape, t->ndim, t->dtype, &elems, &bytes))
		return sf_tensor_err(sf, name, "shape %s x %s overflows "
				     "64 bits", shape_s,
				     st_sf_dtype_name(t->dtype));
	if (end - begin != bytes)
		return sf_tensor_err(sf, name, "data_offsets [%llu, %llu) do "
					"not match shape %s x %s = %llu bytes",
					(unsigned long long)begin,
					(unsigned long long)end, shape_s,
					st_sf_dtype_name(t->dtype),
					(unsigned long long)bytes);
	if (end > sf->data_bytes)
		return sf_tensor_err(sf, name, "data_offsets [%llu, %llu) run "
					"past the end of the data (%llu bytes; "
					"truncated file?)",
					(unsigned long long)begin,
					(unsigned long long)end,
					(unsigned long long)sf->data_bytes);
	t->elems = elems;
	t->offset_bytes = begin;
	t->size_bytes = bytes;
	t->name = strdup(name);
	if (!t->name)
		return st_error_set(-ENOMEM, "%s: out of memory", sf->label);
	return 0;
}

static int sf_parse_metadata(struct st_safetensors *sf,
			     struct json_object *obj)
{
	char shown[ST_SF_SHOW_LEN];
	size_t i = 0;

	if (!json_object_is_type(obj, json_type_object))
		return st_error_set(-EINVAL, "%s: __metadata__ is not an object "
				    "(it is %s)", sf->label,
				    json_type_to_name(json_object_get_type(obj)));
	sf->n_meta = (size_t)json_object_object_length(obj);
	sf->meta = calloc(2 * sf->n_meta + 1, sizeof(*sf->meta));
	if (!sf->meta)
		return st_error_set(-ENOMEM, "%s: out of memory", sf->label);
	json_object_object_foreach(obj, key, val) {
		if (!json_object_is_type(val, json_type_string))
			return st_error_set(-EINVAL, "%s: __metadata__ "
					    "\"%.64s\" is not a string (it is "
					    "%s)", sf->label,
					    st_sf_show(key, shown),
					    json_type_to_name(json_object_get_type(val)));
		sf->meta[2 * i] = strdup(key);
		sf->meta[2 * i + 1] = strdup(json_object_get_string(val));
		if (!sf->meta[2 * i] || !sf->meta[2 * i + 1])
			return st_error_set(-ENOMEM, "%s: out of memory",
					    sf->label);
		i++;
	}
	return 0;
}

static int sf_cmp_offset(const void *a, const void *b)
{
	const struct st_sf_info *x = a, *y = b;

	if (x->offset_bytes != y->offset_bytes)
		return x->offset_bytes < y->offset_bytes ? -1 : 1;
	if (x->size_bytes != y->size_bytes)
		return x->size_bytes < y->size_bytes ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* The spec asks the tensors to cover the data region exactly: no overlap
 * (two tensors aliasing bytes) and no hole (room for a polyglot file, and
 * the trace a duplicated name leaves, since json-c keeps the last one). */
static int sf_check_coverage(struct st_safetensors *sf)
{
	uint64_t at = 0;

	qsort(sf->tensors, sf->n, sizeof(*sf->tensors), sf_cmp_offset);
	for (size_t i = 0; i < sf->n; i++) {
		const struct st_sf_info *t = &sf->tensors[i];
		uint64_t end = t->offset_bytes + t->size_bytes;

		if (t->offset_bytes < at) {
			const struct st_sf_info *p = &sf->tensors[i - 1];
			char a[ST_SF_SHOW_LEN], b[ST_SF_SHOW_LEN];

			return st_error_set(-EINVAL, "%s: tensors '%s' [%llu, "
				"%llu) and '%s' [%llu, %llu) overlap",
				sf->label, st_sf_show(p->name, a),
				(unsigned long long)p->offset_bytes,
				(unsigned long long)(p->offset_bytes + p->size_bytes),
				st_sf_show(t->name, b),
				(unsigned long long)t->offset_bytes,
				(unsigned long long)end);
		}
		if (t->offset_bytes > at)
			return st_error_set(-EINVAL, "%s: data bytes [%llu, %llu) "
					    "belong to no tensor (a hole; "
					    "duplicate tensor name?)", sf->label,
					    (unsigned long long)at,
					    (unsigned long long)t->offset_bytes);
		at = end;
	}
	if (at != sf->data_bytes)
		return st_error_set(-EINVAL, "%s: data bytes [%llu, %llu) at the "
				    "end of the file belong to no tensor",
				    sf->label, (unsigned long long)at,
				    (unsigned long long)sf->data_bytes);
	return 0;
}

static int sf_parse_header(struct st_safetensors *sf, const char *hdr,
			   size_t hdr_bytes)
{
	struct json_tokener *tok;
	struct json_object *root;
	enum json_tokener_error jerr;
	size_t end, i;
	int err = 0;

	tok = json_tokener_new_ex(ST_SF_JSON_DEPTH);
	if (!tok)
		return st_error_set(-ENOMEM, "%s: out of memory", sf->label);
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT |
			       JSON_TOKENER_ALLOW_TRAILING_CHARS |
			       JSON_TOKENER_VALIDATE_UTF8);
	root = json_tokener_parse_ex(tok, hdr, (int)hdr_bytes);
	jerr = json_tokener_get_error(tok);
	end = json_tokener_get_parse_end(tok);
	json_tokener_free(tok);
	if (!root || jerr != json_tokener_success) {
		json_object_put(root);
		if (jerr == json_tokener_continue || jerr == json_tokener_success)
			return st_error_set(-EINVAL, "%s: header is not valid "
					    "JSON: it ends before the JSON "
					    "value does (%zu bytes)", sf->label,
					    hdr_bytes);
		return st_error_set(-EINVAL, "%s: header is not valid JSON: %s "
				    "at file offset %zu", sf->label,
				    json_tokener_error_desc(jerr), 8 + end);
	}
	if (!json_object_is_type(root, json_type_object)) {
		err = st_error_set(-EINVAL, "%s: header is not a JSON object "
				   "(it is %s)", sf->label,
				   json_type_to_name(json_object_get_type(root)));
		goto out;
	}
	if (hdr[0] != '{') {
		err = st_error_set(-EINVAL, "%s: header does not begin with '{'",
				   sf->label);
		goto out;
	}
	/* Writers pad the header to 8 bytes with spaces. */
	for (i = end; i < hdr_bytes; i++) {
		char c = hdr[i];

		if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			err = st_error_set(-EINVAL, "%s: header has bytes after "
					   "the JSON object (file offset %zu is 0x%02x, "
					   "padding must be spaces)", sf->label,
					   8 + i, (unsigned char)c);
			goto out;
		}
	}

	sf->tensors = calloc((size_t)json_object_object_length(root) + 1,
			     sizeof(*sf->tensors));
	if (!sf->tensors) {
		err = st_error_set(-ENOMEM, "%s: out of memory", sf->label);
		goto out;
	}
	json_object_object_foreach(root, key, val) {
		if (strcmp(key, "__metadata__") == 0) {
			err = sf_parse_metadata(sf, val);
		} else {
			err = sf_parse_tensor(sf, key, val,
					      &sf->tensors[sf->n]);
			if (!err)
				sf->n++;
		}
		if (err)
			goto out;
	}
	err = sf_check_coverage(sf);
out:
	json_object_put(root);
	return err;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

int st_sf_file_fd(const struct st_safetensors *sf, uint64_t *data_off)
{
	*data_off = sf->data_off;
	return sf->fd;
}

/* Checks the 8-byte length against the file; sets data_off, data_bytes. */
static int sf_check_length(struct st_safetensors *sf, const uint8_t *len8)
{
	uint64_t hdr_bytes;

	if (sf->file_bytes < 8)
		return st_error_set(-EINVAL, "%s: file is %llu bytes, too short "
				    "for the 8-byte header length (truncated "
				    "file?)", sf->label,
				    (unsigned long long)sf->file_bytes);
	hdr_bytes = le64(len8);
	if (hdr_bytes == 0)
		return st_error_set(-EINVAL, "%s: header length is 0",
				    sf->label);
	if (hdr_bytes > ST_SF_MAX_HEADER_BYTES)
		return st_error_set(-EINVAL, "%s: header length %llu is larger "
				    "than the %llu-byte limit", sf->label,
				    (unsigned long long)hdr_bytes,
				    ST_SF_MAX_HEADER_BYTES);
	if (hdr_bytes > sf->file_bytes - 8)
		return st_error_set(-EINVAL, "%s: header length %llu runs past "
				    "the end of the file (%llu bytes; truncated "
				    "file?)", sf->label,
				    (unsigned long long)hdr_bytes,
				    (unsigned long long)sf->file_bytes);
	sf->data_off = 8 + hdr_bytes;
	sf->data_bytes = sf->file_bytes - sf->data_off;
	return 0;
}

static struct st_safetensors *sf_new(const char *label)
{
	struct st_safetensors *sf = calloc(1, sizeof(*sf));

	if (!sf)
		return NULL;
	sf->fd = -1;
	sf->label = strdup(label ? label : "(memory)");
	if (!sf->label) {
		free(sf);
		return NULL;
	}
	return sf;
}

int st_safetensors_open(struct st_safetensors **out, const char *path)
{
	struct st_safetensors *sf;
	uint8_t len8[8] = { 0 };
	char *hdr = NULL;
	int err;

	*out = NULL;
	sf = sf_new(path);
	if (!sf)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	err = st_file_open_regular(path, &sf->fd, &sf->file_bytes);
	if (err)
		goto fail;
	if (sf->file_bytes >= 8) {
		err = st_file_pread_full(sf->fd, len8, 8, 0, path);
		if (err)
			goto fail;
	}
	err = sf_check_length(sf, len8);
	if (err)
		goto fail;
	hdr = malloc(sf->data_off - 8);
	if (!hdr) {
		err = st_error_set(-ENOMEM, "%s: out of memory for a %llu-byte "
				   "header", path,
				   (unsigned long long)(sf->data_off - 8));
		goto fail;
	}
	err = st_file_pread_full(sf->fd, hdr, sf->data_off - 8, 8, path);
	if (!err)
		err = sf_parse_header(sf, hdr, sf->data_off - 8);
	free(hdr);
	if (err)
		goto fail;
	*out = sf;
	return 0;
fail:
	st_safetensors_close(sf);
	return err;
}

int st_safetensors_open_mem(struct st_safetensors **out, const void *buf,
			    size_t bytes, const char *label)
{
	struct st_safetensors *sf;
	int err;

	*out = NULL;
	sf = sf_new(label);
	if (!sf)
		return st_error_set(-ENOMEM, "out of memory");
	sf->mem = buf;
	sf->file_bytes = bytes;
	err = sf_check_length(sf, sf->mem);
	if (!err)
		err = sf_parse_header(sf, (const char *)sf->mem + 8,
				      sf->data_off - 8);
	if (err) {
		st_safetensors_close(sf);
		return err;
	}
	*out = sf;
	return 0;
}

void st_safetensors_close(struct st_safetensors *sf)
{
	if (!sf)
		return;
	if (sf->map_kind == ST_SF_MAP_MMAP)
		munmap(sf->map, sf->map_bytes);
	else if (sf->map_kind == ST_SF_MAP_HEAP)
		free(sf->map);
	if (sf->fd >= 0)
		close(sf->fd);
	for (size_t i = 0; i < sf->n; i++)
		free((char *)sf->tensors[i].name);
	free(sf->tensors);
	if (sf->meta)
		for (size_t i = 0; i < 2 * sf->n_meta; i++)
			free(sf->meta[i]);
	free(sf->meta);
	free(sf->label);
	free(sf);
}

size_t st_safetensors_count(const struct st_safetensors *sf)
{
	return sf->n;
}

const struct st_sf_info *st_safetensors_at(const struct st_safetensors *sf,
					   size_t i)
{
	return i < sf->n ? &sf->tensors[i] : NULL;
}

const struct st_sf_info *st_safetensors_find(const struct st_safetensors *sf,
					     const char *name)
{
	/* Linear: a few hundred tensors per file, looked up once each. */
	for (size_t i = 0; i < sf->n; i++)
		if (strcmp(sf->tensors[i].name, name) == 0)
			return &sf->tensors[i];
	return NULL;
}

const char *st_safetensors_metadata(const struct st_safetensors *sf,
				    const char *key)
{
	for (size_t i = 0; i < sf->n_meta; i++)
		if (sf->meta[2 * i] && strcmp(sf->meta[2 * i], key) == 0)
			return sf->meta[2 * i + 1];
	return NULL;
}

int st_safetensors_read(const struct st_safetensors *sf, const char *name,
			enum st_sf_dtype dtype, int ndim, const uint64_t *shape,
			void *buf)
{
	const struct st_sf_info *t = st_safetensors_find(sf, name);
	bool same;

	if (!t) {
		char shown[ST_SF_SHOW_LEN];

		return st_error_set(-ENOENT, "%s: no tensor '%s'", sf->label,
				    st_sf_show(name, shown));
	}
	same = t->dtype == dtype && t->ndim == ndim;
	for (int i = 0; same && i < ndim; i++)
		same = t->shape[i] == shape[i];
	if (!same) {
		char have[ST_SF_SHAPE_STR_LEN], want[ST_SF_SHAPE_STR_LEN];

		if (ndim < 0 || ndim > ST_SF_MAX_DIMS)
			ndim = 0;
		return sf_tensor_err(sf, name, "is %s %s, expected %s %s",
				     st_sf_dtype_name(t->dtype),
				     st_sf_shape_str(t->shape, t->ndim, have,
							sizeof(have)),
				     st_sf_dtype_name(dtype),
				     st_sf_shape_str(shape, ndim, want,
							sizeof(want)));
	}
	if (t->size_bytes == 0)
		return 0;
	if (sf->mem) {
		memcpy(buf, sf->mem + sf->data_off + t->offset_bytes,
		       t->size_bytes);
		return 0;
	}
	if (sf->map_kind != ST_SF_MAP_NONE) {
		memcpy(buf, (const uint8_t *)sf->map +
		       (sf->map_kind == ST_SF_MAP_MMAP ? sf->data_off : 0) +
		       t->offset_bytes, t->size_bytes);
		return 0;
	}
	return st_file_pread_full(sf->fd, buf, t->size_bytes,
				  sf->data_off + t->offset_bytes, sf->label);
}

int st_safetensors_data(struct st_safetensors *sf, const void **out_data,
			uint64_t *out_bytes)
{
	static const uint8_t st_sf_empty[8];
	void *p;
	int err;

	*out_bytes = sf->data_bytes;
	if (sf->mem) {
		*out_data = sf->mem + sf->data_off;
		return 0;
	}
	if (sf->map_kind == ST_SF_MAP_MMAP) {
		*out_data = (const uint8_t *)sf->map + sf->data_off;
		return 0;
	}
	if (sf->map_kind == ST_SF_MAP_HEAP || sf->data_bytes == 0) {
		*out_data = sf->map_kind == ST_SF_MAP_HEAP ? sf->map : st_sf_empty;
		return 0;
	}
	if (sf->file_bytes > SIZE_MAX)
		return st_error_set(-EFBIG, "%s: too large to map", sf->label);
	p = mmap(NULL, (size_t)sf->file_bytes, PROT_READ, MAP_PRIVATE, sf->fd,
		 0);
	if (p != MAP_FAILED) {
		sf->map = p;
		sf->map_bytes = (size_t)sf->file_bytes;
		sf->map_kind = ST_SF_MAP_MMAP;
		*out_data = (const uint8_t *)p + sf->data_off;
		return 0;
	}
	/* Some file systems cannot mmap; read the data region instead. */
	p = malloc((size_t)sf->data_bytes);
	if (!p)
		return st_error_set(-ENOMEM, "%s: out of memory for %llu bytes "
				    "of data", sf->label,
				    (unsigned long long)sf->data_bytes);
	err = st_file_pread_full(sf->fd, p, (size_t)sf->data_bytes,
				 sf->data_off, sf->label);
	if (err) {
		free(p);
		return err;
	}
	sf->map = p;
	sf->map_bytes = (size_t)sf->data_bytes;
	sf->map_kind = ST_SF_MAP_HEAP;
	*out_data = p;
	return 0;
}

/* ---- writer ------------------------------------------------------------ */

static int sf_cmp_name_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int st_sf_entries_check(const char *path, struct st_sf_entry *entries,
			size_t n, const struct st_sf_meta *meta, size_t n_meta,
			uint64_t *total_bytes)
{
	const char **names;
	uint64_t total = 0, elems;
	int err = 0;

	for (size_t i = 0; i < n; i++) {
		struct st_sf_entry *t = &entries[i];

		if (!t->name || !t->name[0] ||
		    strcmp(t->name, "__metadata__") == 0)
			return st_error_set(-EINVAL, "%s: tensor %zu has no name "
					    "or the reserved name __metadata__",
					    path, i);
		if ((unsigned)t->dtype >= ST_SF_DTYPE_COUNT)
			return st_error_set(-EINVAL, "%s: tensor '%s': bad dtype "
					    "%d", path, t->name, (int)t->dtype);
		if (t->ndim < 0 || t->ndim > ST_SF_MAX_DIMS)
			return st_error_set(-EINVAL, "%s: tensor '%s': %d "
					    "dimensions (0..%d supported)",
					    path, t->name, t->ndim,
					    ST_SF_MAX_DIMS);
		if (sf_shape_bytes(t->shape, t->ndim, t->dtype, &elems,
				   &t->size_bytes) ||
		    __builtin_add_overflow(total, t->size_bytes, &total) ||
		    total > (uint64_t)INT64_MAX - 1)
			return st_error_set(-EINVAL, "%s: tensor '%s': size "
					    "overflows", path, t->name);
	}
	for (size_t i = 0; i < n_meta; i++)
		if (!meta[i].key || !meta[i].value)
			return st_error_set(-EINVAL, "%s: metadata entry %zu has "
					    "no key or value", path, i);

	names = malloc((n + n_meta + 1) * sizeof(*names));
	if (!names)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	for (size_t i = 0; i < n; i++)
		names[i] = entries[i].name;
	qsort(names, n, sizeof(*names), sf_cmp_name_ptr);
	for (size_t i = 1; i < n && !err; i++)
		if (strcmp(names[i - 1], names[i]) == 0)
			err = st_error_set(-EINVAL, "%s: tensor name '%s' given "
					   "twice", path, names[i]);
	for (size_t i = 0; i < n_meta; i++)
		names[i] = meta[i].key;
	qsort(names, n_meta, sizeof(*names), sf_cmp_name_ptr);
	for (size_t i = 1; i < n_meta && !err; i++)
		if (strcmp(names[i - 1], names[i]) == 0)
			err = st_error_set(-EINVAL, "%s: metadata key '%s' given "
					   "twice", path, names[i]);
	free(names);
	if (!err)
		*total_bytes = total;
	return err;
}

void st_json_add(struct json_object *obj, const char *key,
		 struct json_object *val, bool *oom)
{
	if (*oom || !obj || !val || json_object_object_add(obj, key, val)) {
		json_object_put(val);
		*oom = true;
	}
}

void st_json_push(struct json_object *arr, struct json_object *val,
		  bool *oom)
{
	if (*oom || !arr || !val || json_object_array_add(arr, val)) {
		json_object_put(val);
		*oom = true;
	}
}

int st_sf_header_build(const char *path, const struct st_sf_entry *entries,
		       size_t n, const struct st_sf_meta *meta, size_t n_meta,
		       uint8_t **out, size_t *out_bytes)
{
	struct json_object *root = json_object_new_object();
	const char *text;
	uint64_t off = 0, hdr_bytes;
	size_t text_len;
	uint8_t *buf;
	bool oom = !root;

	if (n_meta) {
		struct json_object *m = json_object_new_object();

		st_json_add(root, "__metadata__", m, &oom);
		for (size_t i = 0; !oom && i < n_meta; i++)
			st_json_add(m, meta[i].key,
				    json_object_new_string(meta[i].value), &oom);
	}
	for (size_t i = 0; !oom && i < n; i++) {
		const struct st_sf_entry *t = &entries[i];
		struct json_object *e = json_object_new_object();
		struct json_object *shape = json_object_new_array();
		struct json_object *offs = json_object_new_array();

		/* Once oom is set every later call drops what it is given,
		 * so shape and offs are freed whether or not e took them. */
		st_json_add(root, t->name, e, &oom);
		st_json_add(oom ? NULL : e, "dtype", json_object_new_string(
				st_sf_dtype_name(t->dtype)), &oom);
		st_json_add(oom ? NULL : e, "shape", shape, &oom);
		st_json_add(oom ? NULL : e, "data_offsets", offs, &oom);
		for (int d = 0; !oom && d < t->ndim; d++)
			st_json_push(shape, json_object_new_int64(
					(int64_t)t->shape[d]), &oom);
		st_json_push(offs, json_object_new_int64((int64_t)off), &oom);
		st_json_push(offs, json_object_new_int64(
				(int64_t)(off + t->size_bytes)), &oom);
		off += t->size_bytes;
	}
	text = oom ? NULL : json_object_to_json_string_length(root,
			JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
			&text_len);
	if (!text) {
		json_object_put(root);
		return st_error_set(-ENOMEM, "%s: out of memory for the header",
				    path);
	}
	hdr_bytes = st_align_up(text_len, 8);
	if (hdr_bytes > ST_SF_MAX_HEADER_BYTES) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: header would be %llu bytes, "
				    "more than the %llu-byte limit", path,
				    (unsigned long long)hdr_bytes,
				    ST_SF_MAX_HEADER_BYTES);
	}
	buf = malloc(8 + hdr_bytes);
	if (!buf) {
		json_object_put(root);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)(hdr_bytes >> (8 * i));
	memcpy(buf + 8, text, text_len);
	memset(buf + 8 + text_len, ' ', hdr_bytes - text_len);
	json_object_put(root);
	*out = buf;
	*out_bytes = 8 + hdr_bytes;
	return 0;
}

int st_safetensors_write(const char *path, const struct st_sf_tensor *tensors,
			 size_t n, const struct st_sf_meta *meta, size_t n_meta)
{
	struct st_file_atomic f;
	struct st_sf_entry *entries;
	uint64_t total;
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
	err = st_sf_entries_check(path, entries, n, meta, n_meta, &total);
	for (size_t i = 0; !err && i < n; i++)
		if (entries[i].size_bytes && !tensors[i].data)
			err = st_error_set(-EINVAL, "%s: tensor '%s': no data",
					   path, tensors[i].name);
	if (!err)
		err = st_sf_header_build(path, entries, n, meta, n_meta, &hdr,
					 &hdr_bytes);
	if (!err)
		err = st_file_atomic_open(&f, path);
	if (err)
		goto out;
	err = st_file_atomic_write(&f, hdr, hdr_bytes);
	for (size_t i = 0; !err && i < n; i++)
		err = st_file_atomic_write(&f, tensors[i].data,
					   entries[i].size_bytes);
	if (err)
		st_file_atomic_abort(&f);
	else
		err = st_file_atomic_commit(&f);
out:
	free(hdr);
	free(entries);
	return err;
}
