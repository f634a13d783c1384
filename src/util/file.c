/* Complete I/O and atomic replacement of files. */
#include "strata/file.h"

#include "strata/common.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int st_file_atomic_open(struct st_file_atomic *f, const char *path)
{
	size_t len = strlen(path);

	f->fd = -1;
	f->path = strdup(path);
	f->tmp_path = malloc(len + sizeof(".tmp.XXXXXX"));
	if (!f->path || !f->tmp_path) {
		free(f->path);
		free(f->tmp_path);
		f->path = f->tmp_path = NULL;
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	memcpy(f->tmp_path, path, len);
	memcpy(f->tmp_path + len, ".tmp.XXXXXX", sizeof(".tmp.XXXXXX"));
	f->fd = mkostemp(f->tmp_path, O_CLOEXEC);
	if (f->fd < 0) {
		int err = -errno;

		st_error_set(err, "%s: cannot create temporary file %s: %s",
			     path, f->tmp_path, strerror(-err));
		free(f->path);
		free(f->tmp_path);
		f->path = f->tmp_path = NULL;
		return err;
	}
	/* mkstemp makes 0600; what strata writes are ordinary files. */
	if (fchmod(f->fd, 0644) < 0) {
		int err = -errno;

		st_error_set(err, "%s: chmod: %s", f->tmp_path, strerror(-err));
		st_file_atomic_abort(f);
		return err;
	}
	return 0;
}

int st_file_atomic_write(struct st_file_atomic *f, const void *buf,
			 size_t bytes)
{
	const char *p = buf;

	while (bytes > 0) {
		/* Linux moves at most ~2 GiB per call; ask for less. */
		size_t chunk = ST_MIN(bytes, (size_t)1 << 30);
		ssize_t n = write(f->fd, p, chunk);

		if (n < 0) {
			int err = -errno;

			if (err == -EINTR)
				continue;
			return st_error_set(err, "%s: write: %s", f->tmp_path,
					    strerror(-err));
		}
		if (n == 0)
			return st_error_set(-EIO, "%s: write returned 0",
					    f->tmp_path);
		p += n;
		bytes -= (size_t)n;
	}
	return 0;
}

static int file_fsync_dir_of(const char *path)
{
	char *copy = strdup(path);
	int fd, err = 0;

	if (!copy)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0) {
		err = -errno;
		st_error_set(err, "%s: fsync of its directory: %s", path,
			     strerror(-err));
	}
	if (fd >= 0)
		close(fd);
	free(copy);
	return err;
}

int st_file_rename_new(const char *from, const char *path)
{
	int err;

	if (renameat2(AT_FDCWD, from, AT_FDCWD, path, RENAME_NOREPLACE) < 0) {
		err = -errno;
		return st_error_set(err, "%s: rename from %s: %s", path, from, strerror(-err));
	}
	return file_fsync_dir_of(path);
}

static int file_atomic_finish(struct st_file_atomic *f, bool replace)
{
	int err = 0;

	if (fsync(f->fd) < 0) {
		err = -errno;
		st_error_set(err, "%s: fsync: %s", f->tmp_path, strerror(-err));
		goto fail;
	}
	if (close(f->fd) < 0) {
		f->fd = -1;
		err = -errno;
		st_error_set(err, "%s: close: %s", f->tmp_path, strerror(-err));
		goto fail;
	}
	f->fd = -1;
	if (replace)
		return st_file_atomic_publish(f);
	err = st_file_rename_new(f->tmp_path, f->path);
	if (err < 0 && access(f->tmp_path, F_OK) == 0)
		goto fail; /* not renamed (path was there): the temporary goes */
	free(f->path);
	free(f->tmp_path);
	f->path = f->tmp_path = NULL;
	return err;
fail:
	st_file_atomic_abort(f);
	return err;
}

int st_file_atomic_commit(struct st_file_atomic *f)
{
	return file_atomic_finish(f, true);
}

int st_file_atomic_commit_new(struct st_file_atomic *f)
{
	return file_atomic_finish(f, false);
}

int st_file_atomic_publish(struct st_file_atomic *f)
{
	int err;

	if (rename(f->tmp_path, f->path) < 0) {
		err = -errno;
		st_error_set(err, "%s: rename from %s: %s", f->path,
			     f->tmp_path, strerror(-err));
		st_file_atomic_abort(f);
		return err;
	}
	err = file_fsync_dir_of(f->path);
	free(f->path);
	free(f->tmp_path);
	f->path = f->tmp_path = NULL;
	return err;
}

void st_file_atomic_abort(struct st_file_atomic *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
	if (f->tmp_path)
		unlink(f->tmp_path);
	free(f->path);
	free(f->tmp_path);
	f->path = f->tmp_path = NULL;
}

int st_file_open_regular(const char *path, int *out_fd, uint64_t *out_bytes)
{
	struct stat sb;
	int fd, err;

	*out_fd = -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		return st_error_set(err, "%s: %s", path, strerror(-err));
	}
	if (fstat(fd, &sb) < 0) {
		err = -errno;
		close(fd);
		return st_error_set(err, "%s: stat: %s", path, strerror(-err));
	}
	if (!S_ISREG(sb.st_mode)) {
		close(fd);
		return st_error_set(-EINVAL, "%s: not a regular file", path);
	}
	*out_fd = fd;
	*out_bytes = (uint64_t)sb.st_size;
	return 0;
}

int st_file_pread_full(int fd, void *buf, size_t bytes, uint64_t off,
		       const char *label)
{
	char *p = buf;

	while (bytes > 0) {
		size_t chunk = ST_MIN(bytes, (size_t)1 << 30);
		ssize_t n = pread(fd, p, chunk, (off_t)off);

		if (n < 0) {
			int err = -errno;

			if (err == -EINTR)
				continue;
			return st_error_set(err, "%s: read at offset %llu: %s",
					    label, (unsigned long long)off,
					    strerror(-err));
		}
		if (n == 0)
			return st_error_set(-EIO,
				"%s: unexpected end of file at offset %llu",
				label, (unsigned long long)off);
		p += n;
		off += (uint64_t)n;
		bytes -= (size_t)n;
	}
	return 0;
}

int st_file_read_small(const char *path, size_t max_bytes, char **out,
		       size_t *out_bytes)
{
	uint64_t file_bytes;
	char *buf;
	int fd, err;

	err = st_file_open_regular(path, &fd, &file_bytes);
	if (err)
		return err;
	if (file_bytes > max_bytes) {
		close(fd);
		return st_error_set(-EFBIG, "%s: %llu bytes, more than the %zu "
				    "expected", path,
				    (unsigned long long)file_bytes, max_bytes);
	}
	buf = malloc((size_t)file_bytes + 1);
	if (!buf) {
		close(fd);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	err = st_file_pread_full(fd, buf, (size_t)file_bytes, 0, path);
	close(fd);
	if (err) {
		free(buf);
		return err;
	}
	buf[file_bytes] = '\0';
	*out = buf;
	*out_bytes = (size_t)file_bytes;
	return 0;
}
