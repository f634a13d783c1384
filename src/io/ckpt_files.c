/* Checkpoint files: streamed safetensors (written through a callback,
 * hashed as they go) and the reader by byte range. trainer.json and
 * verification are in ckpt_trainer.c, the directory protocol (temp dir,
 * fsync, rename, latest link, pruning) in ckpt_dir.c. */
#include "strata/ckpt.h"

#include "ckpt_internal.h"
#include "sf_internal.h"
#include "strata/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- streamed safetensors ---------------------------------------------------- */

/* Pull every tensor through fill into f, hashing as it goes. */
static int ckpt_stream_data(struct st_file_atomic *f, const char *path,
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
		err = ckpt_stream_data(&f, path, entries, n, max_bytes, fill,
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
