/* src/io private: what the two safetensors writers share, st_safetensors_write()
 * (tensors in memory) and st_ckpt_write_safetensors() (tensors streamed
 * through a callback), so both check the same things and write the same
 * header bytes. Defined in safetensors.c. */
#ifndef STRATA_IO_SF_INTERNAL_H
#define STRATA_IO_SF_INTERNAL_H

#include "strata/ckpt.h"
#include "strata/safetensors.h"

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One tensor of a file being written, in file order. */
struct st_sf_entry {
	const char *name;        /* borrowed */
	enum st_sf_dtype dtype;
	int ndim;
	const uint64_t *shape;   /* ndim sizes, borrowed */
	uint64_t size_bytes;     /* set by st_sf_entries_check() */
};

/* Check what a writer is given: each entry has a name other than
 * __metadata__, a known dtype, 0..ST_SF_MAX_DIMS dimensions and a size that
 * fits (the data region stays under 2^63 - 1 bytes); each metadata entry has
 * a key and a value; no tensor name and no metadata key is given twice. Sets
 * every size_bytes and *total_bytes (the data region). path names the file
 * in errors. Returns 0 or -EINVAL (-ENOMEM). */
int st_sf_entries_check(const char *path, struct st_sf_entry *entries,
			size_t n, const struct st_sf_meta *meta, size_t n_meta,
			uint64_t *total_bytes);

/* The file's first bytes for checked entries: the 8-byte little-endian
 * header length, then the JSON header (json-c, insertion order: __metadata__
 * first when n_meta > 0, then the tensors with consecutive data_offsets;
 * plain, no slash escaping) padded with spaces to a multiple of 8. *out is
 * malloc'd. Returns 0, -EINVAL (header over ST_SF_MAX_HEADER_BYTES) or
 * -ENOMEM. */
int st_sf_header_build(const char *path, const struct st_sf_entry *entries,
		       size_t n, const struct st_sf_meta *meta, size_t n_meta,
		       uint8_t **out, size_t *out_bytes);

/* Write a safetensors file whose header bytes (hdr, from
 * st_sf_header_build()) are given: then every entry's size_bytes of data
 * pulled through fill, as st_ckpt_write_safetensors() does (temporary,
 * hashed, fsynced, renamed). Defined in ckpt_files.c. */
int st_ckpt_write_with_header(const char *path, const uint8_t *hdr, size_t hdr_bytes,
			      const struct st_sf_entry *entries, size_t n,
			      st_ckpt_fill_fn fill, void *ctx,
			      uint64_t *out_bytes, uint64_t *out_xxh64);

/* A name from a file as it may appear in a one-line error: control bytes
 * spelled \xNN, cut at ST_SF_NAME_SHOWN bytes with "...", into buf
 * (ST_SF_SHOW_LEN bytes). Returns buf. */
#define ST_SF_NAME_SHOWN 120
#define ST_SF_SHOW_LEN (ST_SF_NAME_SHOWN * 4 + 4)
const char *st_sf_show(const char *s, char *buf);

/* An open file's descriptor (-1 for one opened from memory) and where its
 * data region starts, for readers by byte range (st_ckpt_reader): one
 * descriptor per file, the handle's, so a set of many shards stays far
 * below the process's descriptor limit. Borrowed until close. */
int st_sf_file_fd(const struct st_safetensors *sf, uint64_t *data_off);

/* shape as "[4,8]" in buf (ST_SF_SHAPE_STR_LEN bytes hold any shape of
 * 0..ST_SF_MAX_DIMS dimensions; a shorter buf gets a cut string). Returns
 * buf. */
#define ST_SF_SHAPE_STR_LEN (ST_SF_MAX_DIMS * 21 + 3)
const char *st_sf_shape_str(const uint64_t *shape, int ndim, char *buf,
			    size_t buf_len);

/* Attach val to obj under key (st_json_add) or append it to arr
 * (st_json_push), for building JSON where any json-c call may fail for lack
 * of memory: once *oom is set, or when obj/arr or val is NULL or the call
 * fails, val is dropped and *oom set. */
void st_json_add(struct json_object *obj, const char *key,
		 struct json_object *val, bool *oom);
void st_json_push(struct json_object *arr, struct json_object *val,
		  bool *oom);

#endif
