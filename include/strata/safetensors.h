/* strata: safetensors files, read and written.
 *
 * Layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian
 * header length N, N bytes of JSON header (an object: tensor name ->
 * {"dtype", "shape", "data_offsets": [begin, end)} plus an optional
 * "__metadata__" object of string -> string), then the data region. Offsets
 * are relative to the start of the data region.
 *
 * The reader trusts nothing: header length bounds, JSON syntax, every field's
 * type, dtype, that shape x dtype size equals the byte range, ranges inside
 * the data and covering it exactly (no overlap, no hole, as the spec asks),
 * and 64-bit overflow. A bad file fails with one error line naming the file
 * and the problem (st_error_last()), e.g.
 *   model.safetensors: tensor 'h.0.attn.c_attn.weight': data_offsets
 *   [0, 100) do not match shape [4,8] x F32 = 128 bytes
 *
 * The writer writes a temporary file in the target's directory, fsyncs it and
 * renames it over the target: on failure nothing is left behind.
 * All functions return 0 or -errno (-EINVAL bad file or argument, -ENOENT
 * missing tensor, -EIO/-ENOSPC/... from the system, -ENOMEM). */
#ifndef STRATA_SAFETENSORS_H
#define STRATA_SAFETENSORS_H

#include "strata/common.h"

#include <stddef.h>
#include <stdint.h>

/* safetensors dtypes. strata writes F32 and BF16; reads all of these. */
enum st_sf_dtype {
	ST_SF_BOOL,
	ST_SF_U8,
	ST_SF_I8,
	ST_SF_F8_E5M2,
	ST_SF_F8_E4M3,
	ST_SF_I16,
	ST_SF_U16,
	ST_SF_F16,
	ST_SF_BF16,
	ST_SF_I32,
	ST_SF_U32,
	ST_SF_F32,
	ST_SF_F64,
	ST_SF_I64,
	ST_SF_U64,
	ST_SF_DTYPE_COUNT,
};

/* Most dimensions a tensor may have (a file with more is refused). */
#define ST_SF_MAX_DIMS 8
/* Largest header accepted, as the reference implementation (100 MB). */
#define ST_SF_MAX_HEADER_BYTES 100000000ull

/* Bytes per element of dtype (1, 2, 4 or 8). */
size_t st_sf_dtype_size(enum st_sf_dtype dtype);

/* The file's spelling of dtype ("F32", "BF16", ...); "?" when out of range. */
const char *st_sf_dtype_name(enum st_sf_dtype dtype);

/* One tensor of an open file. Borrowed from the handle: valid until
 * st_safetensors_close(). */
struct st_sf_info {
	const char *name;
	enum st_sf_dtype dtype;
	int ndim;                         /* 0 for a scalar */
	uint64_t shape[ST_SF_MAX_DIMS];
	uint64_t elems;                   /* product of shape (1 for a scalar) */
	uint64_t offset_bytes;            /* from the start of the data region */
	uint64_t size_bytes;              /* elems x dtype size */
};

struct st_safetensors;

/* Open and validate path. On success *out is a handle to close with
 * st_safetensors_close(). Returns 0, -EINVAL for a malformed file (the
 * detail names the file and what is wrong), -ENOENT/-EACCES/-EIO/... when
 * the file cannot be read, -ENOMEM. */
int st_safetensors_open(struct st_safetensors **out, const char *path);

/* As st_safetensors_open() over bytes already in memory (tests, fuzzing).
 * buf is borrowed until close; label names it in errors. */
int st_safetensors_open_mem(struct st_safetensors **out, const void *buf,
			    size_t bytes, const char *label);

/* Release a handle and its mapping. NULL does nothing. */
void st_safetensors_close(struct st_safetensors *sf);

/* Number of tensors (not counting __metadata__). */
size_t st_safetensors_count(const struct st_safetensors *sf);

/* The i-th tensor in data order (by offset), i < count. Borrowed. */
const struct st_sf_info *st_safetensors_at(const struct st_safetensors *sf,
					   size_t i);

/* The tensor called name, or NULL when there is none. Borrowed. */
const struct st_sf_info *st_safetensors_find(const struct st_safetensors *sf,
					     const char *name);

/* The __metadata__ value for key, or NULL. Borrowed. */
const char *st_safetensors_metadata(const struct st_safetensors *sf,
				    const char *key);

/* Read tensor name into buf, which holds exactly the tensor's bytes, after
 * checking that the file's tensor has the dtype and shape (ndim dims) the
 * caller expects. Thread-safe against other reads of the same handle.
 * Returns 0; -ENOENT when there is no such tensor; -EINVAL when its dtype or
 * shape differ (the detail shows both); -EIO etc. from the read. */
int st_safetensors_read(const struct st_safetensors *sf, const char *name,
			enum st_sf_dtype dtype, int ndim, const uint64_t *shape,
			void *buf);

/* The whole data region: mmapped when the system allows, else read into
 * memory once. Tensor i lives at *out_data + at(i)->offset_bytes; the start
 * is only as aligned as the file's header length makes it (8 bytes for files
 * written per spec). Valid until close. Not thread-safe on its first call.
 * Returns 0 or -errno. */
int st_safetensors_data(struct st_safetensors *sf, const void **out_data,
			uint64_t *out_bytes);

/* One tensor for st_safetensors_write(). All pointers borrowed. */
struct st_sf_tensor {
	const char *name;
	enum st_sf_dtype dtype;
	int ndim;
	uint64_t shape[ST_SF_MAX_DIMS];
	const void *data;                 /* elems x dtype size bytes */
};

/* One __metadata__ entry. */
struct st_sf_meta {
	const char *key;
	const char *value;
};

/* Write tensors[0..n) (data in that order) and meta[0..n_meta) to path,
 * atomically: temporary file, fsync, rename, fsync of the directory. Names
 * must be unique, non-empty and not "__metadata__". The header is padded
 * with spaces to a multiple of 8 bytes. Returns 0, -EINVAL for bad
 * arguments (nothing is created), -errno when the system fails (the
 * temporary file is removed; path keeps its old contents, if any). */
int st_safetensors_write(const char *path, const struct st_sf_tensor *tensors,
			 size_t n, const struct st_sf_meta *meta, size_t n_meta);

#endif
